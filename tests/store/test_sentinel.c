/* SPDX-License-Identifier: MIT */
/*
 * test_sentinel.c -- redis-sentinel://: a primary with two replicas and
 * three sentinels (redis-server --sentinel), all real, on free loopback
 * ports; each test that fails a primary over starts its own set.
 *
 *   test_sentinel [filter]
 *
 * The client finds the primary through the sentinels; min_replicas waits
 * for the replicas (and gives up a lock they did not acknowledge),
 * confirms a hand-over with the waiter's own WAIT, and makes renewals
 * that the replicas do not acknowledge fail (the hold is lost at its
 * lease end while the primary still has it); a failover (SENTINEL
 * FAILOVER) keeps a hold the new primary has, moves waiters there and
 * reports a shared hold of the old primary lost; a failover that loses a
 * hold (the primary killed before it replicated it) is reported: the
 * lost-lock callback, ELOST, and the next owner's token is higher; a
 * client that heard nothing (its subscriptions killed) asks the sentinels
 * before its next command; a forged hand-over message only wakes the
 * waiter. Not tested: a READONLY answer (a demoted
 * primary the sentinels did not announce) -- no way found to make one
 * without the sentinels announcing it first.
 *
 * Timing bounds: a failover here takes the sentinels' down-after (1 s)
 * plus an election, a few seconds; the tests wait for it up to 30 s
 * (bounded loops). What the client must do once the switch is announced
 * (follow it, check its holds) is one round trip: its bound is 10 s of
 * busy-machine slack, well below the 30 s leases, so that an expiry can
 * never pass for it.
 */
#include "test.h"

#include <hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MASTER "dlockm"

static dlock *handle(dlock_client *c, const char *name, int64_t ttl,
                     th_lost *box)
{
    return th_handle_lost(c, name, ttl, 0, box ? th_lost_cb : NULL, box);
}

/* An operator's failover through sentinel `via`; waits (30 s at most)
 * until it is done and returns the new primary's port. */
static int fail_over(th_sentinels *t, int via)
{
    int old = th_sentinels_primary(t);

    CHECK_EQ(th_redis_cmd(&t->sent[via], NULL, 0, "SENTINEL FAILOVER %s",
                          MASTER),
             0);
    int now = th_sentinels_failed_over(t, old, 30000);
    CHECK(now > 0);
    return now;
}

/* One set shared by the tests that fail nothing over. */
static th_sentinels shared;
static int shared_up;

static th_sentinels *steady(void)
{
    if (!shared_up) {
        th_sentinels_start(&shared, MASTER, 1000, 10000);
        shared_up = 1;
    }
    return &shared;
}

TEST(locks_through_the_sentinels)
{
    th_sentinels *t = steady();
    dlock_client *c = th_client(t->uri, th_patient());
    dlock *l = handle(c, "s/one", 0, NULL);
    char v[256];
    dlock_info in;

    CHECK_OK(dlock_acquire(l, 0));
    CHECK(dlock_token(l) > 0);
    /* on the primary, and replicated */
    th_redis_cmd(&t->data[0], v, sizeof(v), "GET dlock:{s/one}");
    CHECK(strlen(v) > 0);
    CHECK_OK(dlock_inspect(c, "s/one", &in));
    CHECK_EQ(in.held, 1);
    CHECK_EQ(in.token, dlock_token(l));
    dlock_info_clear(&in);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

TEST(bad_uris_say_what_is_wrong)
{
    th_sentinels *t = steady();
    dlock_client *c = NULL;
    char u[600];

    snprintf(u, sizeof(u), "redis-sentinel://127.0.0.1:%d",
             t->sent[0].port);
    CHECK_RC(dlock_client_open(&c, u, th_patient()), DLOCK_EINVAL);
    CHECK(strstr(dlock_errmsg(), "master") != NULL);
    /* a master the sentinels do not know: each is named */
    snprintf(u, sizeof(u), "redis-sentinel://127.0.0.1:%d/nosuch",
             t->sent[0].port);
    CHECK_RC(dlock_client_open(&c, u, th_patient()), DLOCK_ECONN);
    CHECK(strstr(dlock_errmsg(), "nosuch") != NULL);
    /* no sentinel listening */
    snprintf(u, sizeof(u), "redis-sentinel://127.0.0.1:%d/" MASTER,
             th_free_port());
    CHECK_RC(dlock_client_open(&c, u, th_patient()), DLOCK_ECONN);
    /* WAIT must answer within the connection's timeout */
    snprintf(u, sizeof(u), "%s?min_replicas=1&replica_timeout=5000&"
             "timeout=2000", t->uri);
    CHECK_RC(dlock_client_open(&c, u, th_patient()), DLOCK_EINVAL);
    CHECK(strstr(dlock_errmsg(), "replica_timeout") != NULL);
    snprintf(u, sizeof(u), "%s?min_replicas=x", t->uri);
    CHECK_RC(dlock_client_open(&c, u, th_patient()), DLOCK_EINVAL);
    /* a password never shows in a message */
    snprintf(u, sizeof(u), "redis-sentinel://:s3cret-pw@127.0.0.1:%d/nosuch",
             t->sent[0].port);
    CHECK_RC(dlock_client_open(&c, u, th_patient()), DLOCK_ECONN);
    CHECK(strstr(dlock_errmsg(), "s3cret-pw") == NULL);
}

TEST(min_replicas_waits_for_the_replicas)
{
    th_sentinels *t = steady();
    char u[600];

    /* 5 s for a healthy replica's acknowledgement on a busy machine (a
     * 500 ms stall was seen under the whole suite's load) */
    snprintf(u, sizeof(u), "%s?min_replicas=2&replica_timeout=5000", t->uri);
    dlock_client *c = th_client(u, th_patient());
    dlock *l = handle(c, "s/wait", 0, NULL);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);

    /* three asked of two replicas: refused, and the lock let go */
    snprintf(u, sizeof(u), "%s?min_replicas=3&replica_timeout=300", t->uri);
    c = th_client(u, th_patient());
    l = handle(c, "s/wait", 0, NULL);
    CHECK_RC(dlock_acquire(l, 0), DLOCK_ECONN);
    CHECK(strstr(dlock_errmsg(), "only 2 of 3 replicas") != NULL);
    dlock_info in;
    CHECK_OK(dlock_inspect(c, "s/wait", &in));
    CHECK_EQ(in.held, 0);
    dlock_info_clear(&in);
    dlock_close(l);
    dlock_client_close(c);
}

TEST(renewals_not_on_the_replicas_lose_the_hold)
{
    /* split brain's protection: a primary whose replicas do not
     * acknowledge cannot keep a hold alive; the holder is told at its
     * local lease end (900 ms), while the primary still has the key */
    th_sentinels *t = steady();
    th_lost box = TH_LOST_INIT;
    char u[600];

    snprintf(u, sizeof(u), "%s?min_replicas=2&replica_timeout=100", t->uri);
    dlock_client *a = th_client(u, th_patient());
    dlock *la = handle(a, "s/split", 900, &box);
    th_redis *p = th_sentinels_node(t, th_sentinels_primary(t));
    th_redis *rep[2];
    int nr = 0;
    for (int i = 0; i < 3; i++)
        if (&t->data[i] != p)
            rep[nr++] = &t->data[i];

    CHECK_OK(dlock_acquire(la, 0));
    int64_t t0 = th_now_ms();
    th_redis_kill(rep[0], SIGSTOP);
    th_redis_kill(rep[1], SIGSTOP);
    (void)th_lost_within(&box, 5000);
    int64_t lost_after = th_now_ms() - t0;
    char v[256];
    th_redis_cmd(p, v, sizeof(v), "GET dlock:{s/split}");
    th_redis_kill(rep[0], SIGCONT);
    th_redis_kill(rep[1], SIGCONT);
    CHECK_EQ(th_lost_calls(&box), 1);
    CHECK_OP(lost_after, <, 5000); /* the lease end, with slack */
    CHECK(strlen(v) > 0);          /* the primary never lost the key */
    CHECK_RC(dlock_release(la), DLOCK_ELOST);
    /* the replicas back in sync before the next test */
    int64_t until = th_now_ms() + 30000;
    while (th_redis_cmd(p, NULL, 0, "WAIT 2 100") != 2 &&
           th_now_ms() < until)
        th_sleep_ms(50);
    dlock_close(la);
    dlock_client_close(a);
}

/* A waiting thread. */
TEST(min_replicas_confirms_a_hand_over_with_the_waiters_own_wait)
{
    /* the release hands the lock to b; b's acquire returns only after
     * its own WAIT (a hand-over on the releaser's connection is not
     * covered by a WAIT on b's) */
    th_sentinels *t = steady();
    char u[600];

    snprintf(u, sizeof(u), "%s?min_replicas=2&replica_timeout=5000", t->uri);
    dlock_client *a = th_client(u, th_patient()),
                 *b = th_client(u, th_patient());
    dlock *la = handle(a, "s/hand", 30000, NULL);
    dlock *lb = handle(b, "s/hand", 30000, NULL);
    th_redis *p = th_sentinels_node(t, th_sentinels_primary(t));
    th_waiter w = {.l = lb};
    pthread_t th;

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t ta = dlock_token(la);
    th_waiter_start(&w, &th);
    th_sleep_ms(300); /* b queues behind a */
    long long waits0 = th_redis_calls(p, "wait");
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(la));
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    CHECK_OP(w.done_at - t0, <, 5000); /* a wake-up, not a lease */
    CHECK_OP(w.token, >, ta);
    CHECK_OP(th_redis_calls(p, "wait") - waits0, >=, 1);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

TEST(failover_keeps_a_replicated_hold_and_moves_the_waiters)
{
    th_sentinels t;
    th_lost box = TH_LOST_INIT;

    th_sentinels_start(&t, MASTER, 1000, 10000);
    char u[600];
    /* 2 s: a healthy replica's acknowledgement on a busy machine; after
     * the failover (one replica in sync for a while) each renewal waits
     * that long and fails, its answers (the shared hold not ours) still
     * count */
    snprintf(u, sizeof(u), "%s?min_replicas=2&replica_timeout=2000", t.uri);
    dlock_client *a = th_client(u, th_patient()),
                 *b = th_client(t.uri, th_patient());
    dlock *la = handle(a, "s/keep", 30000, &box);
    dlock *lb = handle(b, "s/keep", 30000, NULL);
    th_waiter w = {.l = lb};
    pthread_t th;

    th_lost sbox = TH_LOST_INIT;
    dlock *ls = handle(a, "s/keep-shared", 30000, &sbox);

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t ta = dlock_token(la);
    CHECK_OK(dlock_acquire_shared(ls, 0));
    th_waiter_start(&w, &th);
    th_sleep_ms(300); /* b queues behind a */

    int now = fail_over(&t, 0);
    /* the client follows and checks its hold on the new primary: it is
     * there (acknowledged by both replicas), so it is kept */
    int64_t seen = th_now_ms();
    /* a shared hold of the old primary is not checked: reported lost
     * (a renewal round: 10 s of slack) */
    CHECK_EQ(th_lost_within(&sbox, 10000), 1);
    if (th_now_ms() < seen + 3000)
        th_sleep_ms(seen + 3000 - th_now_ms());
    CHECK_EQ(th_lost_calls(&box), 0);
    CHECK_EQ(dlock_held(la), 1);
    CHECK_RC(dlock_release(ls), DLOCK_ELOST);
    dlock_close(ls);
    char v[256];
    th_redis_cmd(th_sentinels_node(&t, now), v, sizeof(v), "GET dlock:{s/keep}");
    CHECK(strncmp(v, "", 1) != 0);
    CHECK_EQ(__atomic_load_n(&w.done, __ATOMIC_SEQ_CST), 0);

    /* the release on the new primary wakes the waiter there */
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(la));
    /* the renewals fail meanwhile (2 s each): the release waits for the
     * one in flight, not for the retries after it (they came back to
     * back and kept it waiting 2-10 s on a busy machine) */
    CHECK_OP(th_now_ms() - t0, <, 2000 + 3000);
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    CHECK_OP(w.done_at - t0, <, 10000);
    CHECK_OP(w.token, >, ta);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
    th_sentinels_stop(&t);
}

TEST(failover_that_loses_a_hold_reports_it)
{
    th_sentinels t;
    th_lost box = TH_LOST_INIT;

    th_sentinels_start(&t, MASTER, 1000, 10000);
    dlock_client *a = th_client(t.uri, th_patient());
    dlock *la = handle(a, "s/lose", 30000, &box);

    /* the replicas frozen and cut off: the acquire reaches the primary
     * only, which then dies */
    th_redis_kill(&t.data[1], SIGSTOP);
    th_redis_kill(&t.data[2], SIGSTOP);
    th_redis_cmd(&t.data[0], NULL, 0, "CLIENT KILL TYPE replica");
    CHECK_OK(dlock_acquire(la, 0));
    uint64_t ta = dlock_token(la);
    int old = t.data[0].port;
    th_redis_kill(&t.data[0], SIGKILL);
    th_redis_kill(&t.data[1], SIGCONT);
    th_redis_kill(&t.data[2], SIGCONT);

    int now = th_sentinels_failed_over(&t, old, 30000);
    CHECK(now > 0);
    /* reported once the switch is heard: long before its 30 s lease */
    CHECK_EQ(th_lost_within(&box, 10000), 1);
    CHECK_RC(dlock_held(la), DLOCK_ELOST);

    /* someone else takes it on the new primary (while a's lost hold is
     * not yet released), with a higher token */
    th_next_token_above(t.uri, "s/lose", ta);
    char v[256];
    th_redis_cmd(th_sentinels_node(&t, now), v, sizeof(v), "GET dlock:{s/lose}");
    CHECK(strlen(v) > 0); /* its tombstone there */
    CHECK_RC(dlock_release(la), DLOCK_ELOST);
    dlock_close(la);
    dlock_client_close(a);
    th_sentinels_stop(&t);
}

TEST(a_client_whose_subscriptions_broke_asks_before_its_next_command)
{
    /* the client's subscriptions are gone (killed at every sentinel)
     * when the failover happens, so it hears nothing: its next command
     * asks the sentinels first and goes to the new primary, not to the old
     * one (which stays a writable primary for seconds after the sentinels
     * named the new one: they demote it only once the replicas follow) */
    th_sentinels t;

    th_sentinels_start(&t, MASTER, 1000, 10000);
    char u[600];
    snprintf(u, sizeof(u), "%s?min_replicas=2&replica_timeout=2000", t.uri);
    dlock_client *a = th_client(u, th_patient());
    dlock *la = handle(a, "s/missed", 30000, NULL);
    CHECK_OK(dlock_acquire(la, 0));
    uint64_t ta = dlock_token(la);
    for (int i = 0; i < 3; i++)
        th_redis_cmd(&t.sent[i], NULL, 0, "CLIENT KILL TYPE pubsub");
    int now = fail_over(&t, 1);
    /* the record was on both replicas: the release finds it */
    CHECK_OK(dlock_release(la));
    char v[256];
    th_redis_cmd(th_sentinels_node(&t, now), v, sizeof(v),
                 "GET dlock:{s/missed}");
    CHECK(v[0] == '-'); /* the tombstone, on the new primary */
    /* the next hold, through the new primary, has a higher token (a
     * client without min_replicas: the demoted primary resyncs as a
     * replica for a while, "only 1 of 2 replicas" meanwhile) */
    th_next_token_above(t.uri, "s/missed", ta);
    dlock_close(la);
    dlock_client_close(a);
    th_sentinels_stop(&t);
}

/* The primary SIGKILLed while a client waits, and a new client opened
 * and waiting right after the kill, before the sentinels noticed: both
 * waits ride the failover out and get the lock, with a higher token,
 * within their wait (docs/design.md, "Waiting through failovers and
 * restarts"). Before, the open failed ("cannot connect to the
 * primary") and the sleeping waiter ended DLOCK_ECONN at once. A try
 * during the failover fails at once and says what is going on. */
TEST(waits_ride_out_a_killed_primary)
{
    th_sentinels t;
    th_waiter w1, w2;
    pthread_t th1, th2;

    th_sentinels_start(&t, MASTER, 1000, 10000);
    dlock_client *a = th_client(t.uri, th_patient()),
                 *b = th_client(t.uri, th_patient());
    dlock *la = handle(a, "s/ride", 30000, NULL);
    CHECK_OK(dlock_acquire(la, 0));
    uint64_t ta = dlock_token(la);
    memset(&w1, 0, sizeof(w1));
    w1.l = handle(b, "s/ride", 30000, NULL);
    th_waiter_start(&w1, &th1);
    th_sleep_ms(300);

    int old = th_sentinels_primary(&t);
    CHECK(old > 0);
    th_redis_kill(th_sentinels_node(&t, old), SIGKILL);
    /* a newcomer: the sentinels answer, the primary they name does not */
    dlock_client *c = th_client(t.uri, th_patient());
    dlock *lt = handle(c, "s/ride-try", 30000, NULL);
    int64_t t0 = th_now_ms();
    CHECK_RC(dlock_acquire(lt, 0), DLOCK_ECONN);
    CHECK_CONTAINS(dlock_errmsg(), "failover in progress?");
    CHECK_OP(th_now_ms() - t0, <, 3000); /* a refused connect: at once */
    dlock_close(lt);
    memset(&w2, 0, sizeof(w2));
    w2.l = handle(c, "s/ride", 30000, NULL);
    th_waiter_start(&w2, &th2);

    CHECK(th_sentinels_failed_over(&t, old, 30000) > 0);
    /* the holder lets go (its hold kept if it was replicated, else lost
     * and reported: either way the lock is free for the waiters next) */
    int rc = dlock_release(la);
    CHECK(rc == DLOCK_OK || rc == DLOCK_ELOST);
    pthread_join(th1, NULL);
    pthread_join(th2, NULL);
    CHECK_RC(w1.rc, DLOCK_OK);
    CHECK_RC(w2.rc, DLOCK_OK);
    CHECK_OP(w1.token, >, ta);
    CHECK_OP(w2.token, >, ta);
    CHECK(w1.token != w2.token);
    dlock_close(w1.l);
    dlock_close(w2.l);
    dlock_close(la);
    TH_CLIENT_CLOSE(a, b, c);
    th_sentinels_stop(&t);
}

/* A user allowed only to read and PUBLISH on the primary reads the
 * waiter's line from the key and publishes "g SEQ TOKEN" on its client's
 * channel: the waiter keeps waiting (the message reaches it through the
 * subscriber connection in the client's epoll set with the sentinels'
 * watch, as every wake-up here), and the release then gives it the key's
 * token. (Before, the waiter returned DLOCK_OK on the message.) */
TEST(a_forged_handover_only_wakes_the_waiter)
{
    const unsigned long long forged = 9223372036854775000ULL;
    th_sentinels *t = steady();
    dlock_client *a = th_client(t->uri, th_patient()),
                 *b = th_client(t->uri, th_patient());
    dlock *la = handle(a, "s/forged", 30000, NULL);
    dlock *lb = handle(b, "s/forged", 30000, NULL);
    th_redis *p = th_sentinels_node(t, th_sentinels_primary(t));
    th_waiter w = {.l = lb};
    pthread_t th;
    char msg[64];

    redisContext *f = th_redis_forger(p, "publish");
    redisReply *r;

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t ta = dlock_token(la);
    th_waiter_start(&w, &th);
    /* queued: its line in the key */
    char client[33];
    unsigned long long seq = 0;
    th_redis_waiter_line(f, "s/forged", client, &seq);
    snprintf(msg, sizeof(msg), "g %llu %llu", seq, forged);
    r = redisCommand(f, "PUBLISH dlock:c:%s %s", client, msg);
    CHECK(r && r->type == REDIS_REPLY_INTEGER);
    CHECK_EQ(r->integer, 1); /* the waiter's client heard it */
    freeReplyObject(r);
    /* a waiter that takes a message for its grant returns within a round
     * trip of reading it; 500 ms is hundreds of those on a busy machine
     * (slower, a wrong client could pass, a right one never fails) */
    th_sleep_ms(500);
    CHECK_EQ(__atomic_load_n(&w.done, __ATOMIC_SEQ_CST), 0);
    CHECK_OK(dlock_release(la));
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    CHECK_OP(w.token, >, ta);
    CHECK_OP(w.token, <, forged);
    redisFree(f);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

static const th_test tests[] = {
    T(locks_through_the_sentinels),
    T(bad_uris_say_what_is_wrong),
    T(min_replicas_waits_for_the_replicas),
    T(min_replicas_confirms_a_hand_over_with_the_waiters_own_wait),
    T(renewals_not_on_the_replicas_lose_the_hold),
    T(a_forged_handover_only_wakes_the_waiter),
    T(a_client_whose_subscriptions_broke_asks_before_its_next_command),
    T(failover_keeps_a_replicated_hold_and_moves_the_waiters),
    T(failover_that_loses_a_hold_reports_it),
    T(waits_ride_out_a_killed_primary),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    int rc = th_main(argc, argv, tests);

    if (shared_up)
        th_sentinels_stop(&shared);
    return rc;
}
