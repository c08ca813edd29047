/* SPDX-License-Identifier: MIT */
/*
 * test_cluster.c -- redis-cluster://: three primaries with one replica
 * each (redis-server --cluster-enabled yes, joined by redis-cli --cluster
 * create), all real, on free loopback ports; each test that fails a
 * primary over or moves a slot starts its own cluster.
 *
 *   test_cluster [filter]
 *
 * The client routes each lock to its slot's primary (every primary takes
 * some), lists every primary's locks, refuses what a cluster cannot do,
 * and hands a lock over through sharded pub/sub on the slot's primary
 * (SSUBSCRIBE while waiting, kept idle afterwards, at most 64 idle); CLUSTER FAILOVER keeps
 * a replicated hold and the waiter; a primary killed before its replica
 * had a hold: the loss is reported and the next owner's token is higher;
 * a slot resharded under a held lock (MIGRATING/IMPORTING, the keys
 * moved, the slot given away): the hold is kept through ASK and MOVED and
 * the waiter follows the slot to its new node; the same with
 * `redis-cli --cluster reshard` itself moving 100 slots.
 *
 * Timing bounds: a manual failover or a slot's move is a few round trips;
 * a killed primary is replaced by its replica's CLUSTER FAILOVER
 * TAKEOVER (the cluster-node-timeout is the stock 15 s). What the client must
 * do once the map changed (follow, check its holds) happens at its next
 * command or renewal (ttl/3, 1 s here): its bound is 10 s of busy-machine
 * slack, well below the 30 s leases whose expiry could pass for it.
 */
#include "test.h"

#include <hiredis.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cluster-node-timeout: the stock 15 s. Shorter, a busy machine (CI's
 * stress-ng beside six servers) delays the cluster bus enough for a
 * failover nobody asked for; no test here waits for the timeout (a
 * killed primary is replaced with CLUSTER FAILOVER TAKEOVER) */
#define NODE_TIMEOUT 15000

static dlock *handle(dlock_client *c, const char *name, int64_t ttl,
                     th_lost *box)
{
    return th_handle_lost(c, name, ttl, 0, box ? th_lost_cb : NULL, box);
}

/* A lock name "PREFIX/N" whose slot primary node[i] owns now; its slot
 * into *slot. */
static void name_on(th_cluster *t, int i, const char *prefix, char *out,
                    size_t cap, int *slot)
{
    char key[300];

    for (int n = 0; n < 1000; n++) {
        snprintf(out, cap, "%s/%d", prefix, n);
        snprintf(key, sizeof(key), "dlock:{%s}", out);
        *slot = th_cluster_slot(t, key);
        if (th_cluster_owner(t, *slot) == i)
            return;
    }
    th_fail(__FILE__, __LINE__, "no name of node %d in 1000", i);
}

/* The holder's release hands the lock to the waiting thread th: it
 * gets it with a higher token than `ta`, woken by the hand-over and not
 * by the 30 s lease's end (10 s of busy-machine slack). */
static void release_wakes(dlock *la, pthread_t th, th_waiter *w, uint64_t ta)
{
    int64_t t0 = th_now_ms();

    CHECK_OK(dlock_release(la));
    pthread_join(th, NULL);
    CHECK_OK(w->rc);
    CHECK_OP(w->token, >, ta);
    CHECK_OP(w->done_at - t0, <, 10000);
}

/* How many shard channels matching `pattern` node[i] has subscribers
 * on. */
static long long shard_channels(th_cluster *t, int i, const char *pattern)
{
    return th_redis_cmd(&t->node[i], NULL, 0, "PUBSUB SHARDCHANNELS %s",
                        pattern);
}

/* A holder's record (not a tombstone, not nothing) in value v. */
static int a_record(const char *v)
{
    return strlen(v) > 33 && v[0] != '-' && v[32] == ':';
}

/* One cluster shared by the tests that fail nothing over. */
static th_cluster shared;
static int shared_up;

static th_cluster *steady(void)
{
    if (!shared_up) {
        th_cluster_start(&shared, NODE_TIMEOUT);
        shared_up = 1;
    }
    return &shared;
}

TEST(locks_go_to_their_slots_primary)
{
    th_cluster *t = steady();
    dlock_client *c = th_client(t->uri, th_patient());
    int on[3] = {0, 0, 0};

    for (int i = 0; i < 3; i++) {
        char name[64], key[128], v[256];
        int slot;
        name_on(t, i, "c/route", name, sizeof(name), &slot);
        dlock *l = handle(c, name, 30000, NULL);
        CHECK_OK(dlock_acquire(l, 0));
        CHECK_OP(dlock_token(l), >, 0);
        /* the record is on that primary, and on no other */
        snprintf(key, sizeof(key), "dlock:{%s}", name);
        th_redis_cmd(&t->node[i], v, sizeof(v), "GET %s", key);
        CHECK(a_record(v));
        on[i]++;
        dlock_info info;
        CHECK_OK(dlock_inspect(c, name, &info));
        CHECK(info.held);
        CHECK_EQ(info.token, dlock_token(l));
        dlock_info_clear(&info);
        CHECK_OK(dlock_release(l));
        th_redis_cmd(&t->node[i], v, sizeof(v), "GET %s", key);
        CHECK(v[0] == '-'); /* its tombstone */
        dlock_close(l);
    }
    CHECK(on[0] && on[1] && on[2]);
    dlock_client_close(c);
}

TEST(bad_uris_say_what_is_wrong)
{
    th_cluster *t = steady();
    dlock_client *c = NULL;
    char u[700];
    th_redis plain;

    CHECK_RC(dlock_client_open(&c, "redis-cluster://", th_patient()),
             DLOCK_EINVAL);
    snprintf(u, sizeof(u), "%s/3", t->uri);
    CHECK_RC(dlock_client_open(&c, u, th_patient()), DLOCK_EINVAL);
    CHECK(strstr(dlock_errmsg(), "database") != NULL);
    snprintf(u, sizeof(u), "%s?db=2", t->uri);
    CHECK_RC(dlock_client_open(&c, u, th_patient()), DLOCK_EINVAL);
    /* a server that is not a cluster node: said so */
    th_redis_start(&plain, NULL);
    snprintf(u, sizeof(u), "redis-cluster://127.0.0.1:%d", plain.port);
    CHECK_RC(dlock_client_open(&c, u, th_patient()), DLOCK_EINVAL);
    CHECK(strstr(dlock_errmsg(), "not a cluster node") != NULL);
    th_redis_stop(&plain);
    /* nobody listening */
    snprintf(u, sizeof(u), "redis-cluster://127.0.0.1:%d", th_free_port());
    CHECK_RC(dlock_client_open(&c, u, th_patient()), DLOCK_ECONN);
    /* a password never shows in a message */
    snprintf(u, sizeof(u), "redis-cluster://:s3cret-pw@127.0.0.1:%d",
             t->node[0].port);
    CHECK_OP(dlock_client_open(&c, u, th_patient()), !=, DLOCK_OK);
    CHECK(strstr(dlock_errmsg(), "s3cret-pw") == NULL);
    /* the seeds may include dead ones: the first that answers gives the
     * map */
    snprintf(u, sizeof(u), "redis-cluster://127.0.0.1:%d,127.0.0.1:%d",
             th_free_port(), t->node[1].port);
    CHECK_OK(dlock_client_open(&c, u, th_patient()));
    dlock_client_close(c);
}

TEST(a_hand_over_goes_through_the_slots_shard_channel)
{
    th_cluster *t = steady();
    dlock_client *a = th_client(t->uri, th_patient()),
                 *b = th_client(t->uri, th_patient());
    char name[64], chan[256];
    int slot;

    name_on(t, 2, "c/hand", name, sizeof(name), &slot);
    dlock *la = handle(a, name, 30000, NULL), *lb = handle(b, name, 30000,
                                                           NULL);
    th_waiter w = {.l = lb};
    pthread_t th;

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t ta = dlock_token(la);
    th_waiter_start(&w, &th);
    /* b's client subscribes to the lock's channel on the slot's primary
     * (bounded: 10 s of busy-machine slack) */
    snprintf(chan, sizeof(chan), "dlock:{%s}c:*", name);
    int64_t until = th_now_ms() + 10000;
    while (shard_channels(t, 2, chan) != 1 && th_now_ms() < until)
        th_sleep_ms(20);
    CHECK_EQ(shard_channels(t, 2, chan), 1);
    th_sleep_ms(100);
    CHECK_EQ(__atomic_load_n(&w.done, __ATOMIC_SEQ_CST), 0);
    release_wakes(la, th, &w, ta);
    /* nobody waits: the channel stays, idle, for the next wait */
    CHECK_EQ(shard_channels(t, 2, chan), 1);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

TEST(idle_subscriptions_are_bounded)
{
    /* a client that waited once for each of 80 locks keeps at most 64 of
     * their channels subscribed (the oldest idle ones go) */
    th_cluster *t = steady();
    dlock_client *a = th_client(t->uri, th_patient()),
                 *b = th_client(t->uri, th_patient());
    char name[64], pat[64];

    for (int i = 0; i < 80; i++) {
        snprintf(name, sizeof(name), "c/idle/%d", i);
        dlock *la = handle(a, name, 30000, NULL);
        dlock *lb = handle(b, name, 30000, NULL);
        CHECK_OK(dlock_acquire(la, 0));
        th_acquire_busy(lb, 30); /* armed, gave up */
        CHECK_OK(dlock_release(la));
        TH_CLOSE(la, lb);
    }
    long long n = 0;
    snprintf(pat, sizeof(pat), "dlock:{c/idle/*}c:*");
    for (int i = 0; i < 3; i++)
        n += shard_channels(t, i, pat);
    CHECK_OP(n, >=, 1);
    CHECK_OP(n, <=, 64);
    dlock_client_close(b);
    /* a closed client's are gone with its connections (as soon as the
     * servers see them closed: 10 s of busy-machine slack) */
    int64_t until = th_now_ms() + 10000;
    do {
        n = 0;
        for (int i = 0; i < 3; i++)
            n += shard_channels(t, i, pat);
    } while (n != 0 && th_now_ms() < until && (th_sleep_ms(20), 1));
    CHECK_EQ(n, 0);
    dlock_client_close(a);
}

TEST(list_walks_every_primary)
{
    th_cluster *t = steady();
    dlock_client *c = th_client(t->uri, th_patient());
    dlock *l[30];
    char name[64];
    int seen[30];

    for (int i = 0; i < 30; i++) {
        snprintf(name, sizeof(name), "c/list/%02d", i);
        l[i] = handle(c, name, 30000, NULL);
        CHECK_OK(dlock_acquire(l[i], 0));
        seen[i] = 0;
    }
    char *cursor = NULL;
    int pages = 0;
    do {
        dlock_list_page page;
        CHECK_OK(dlock_list(c, "c/list/", cursor ? cursor : "", 7, 0,
                            &page));
        for (size_t i = 0; i < page.n; i++) {
            int k = atoi(page.locks[i].name + 7);
            CHECK(k >= 0 && k < 30);
            seen[k]++;
            CHECK(page.locks[i].info.held);
        }
        free(cursor);
        cursor = page.next ? strdup(page.next) : NULL;
        dlock_list_clear(&page);
        pages++;
    } while (cursor && pages < 100);
    CHECK(cursor == NULL);
    for (int i = 0; i < 30; i++)
        CHECK_EQ(seen[i], 1);
    dlock_list_page bad;
    CHECK_RC(dlock_list(c, "", "x", 10, 0, &bad), DLOCK_EINVAL);
    CHECK_RC(dlock_list(c, "", "99:0", 10, 0, &bad), DLOCK_OK);
    CHECK_EQ(bad.n, 0); /* past the last primary: the walk is over */
    dlock_list_clear(&bad);
    th_release_close(l, 30);
    dlock_client_close(c);
}

TEST(cluster_failover_keeps_a_replicated_hold_and_the_waiter)
{
    th_cluster t;
    th_lost box = TH_LOST_INIT;
    char name[64], u[700], key[128], v[256];
    int slot;

    th_cluster_start(&t, NODE_TIMEOUT);
    name_on(&t, 0, "c/keep", name, sizeof(name), &slot);
    /* min_replicas=1: the hold is on node[3] before acquire returns */
    snprintf(u, sizeof(u), "%s?min_replicas=1&replica_timeout=2000", t.uri);
    dlock_client *a = th_client(u, th_patient()),
                 *b = th_client(t.uri, th_patient());
    dlock *la = handle(a, name, 3000, &box), *lb = handle(b, name, 30000,
                                                           NULL);
    th_waiter w = {.l = lb};
    pthread_t th;

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t ta = dlock_token(la);
    th_waiter_start(&w, &th);
    th_sleep_ms(300); /* b queues behind a */

    CHECK(th_cluster_failover(&t, 3, NULL, 30000));
    /* several renewals (ttl/3 = 1 s) on the new primary: still held */
    th_sleep_ms(3500);
    CHECK_EQ(th_lost_calls(&box), 0);
    CHECK_EQ(dlock_held(la), 1);
    snprintf(key, sizeof(key), "dlock:{%s}", name);
    th_redis_cmd(&t.node[3], v, sizeof(v), "GET %s", key);
    CHECK(a_record(v));
    CHECK_EQ(__atomic_load_n(&w.done, __ATOMIC_SEQ_CST), 0);

    /* the release on the new primary wakes the waiter */
    release_wakes(la, th, &w, ta);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
    th_cluster_stop(&t);
}

TEST(a_primary_killed_before_its_replica_had_the_hold_reports_it)
/* (and its waiter rides the failover out: before, it was told
 * DLOCK_ECONN at once) */
{
    th_cluster t;
    th_lost box = TH_LOST_INIT;
    char name[64];
    int slot;

    th_cluster_start(&t, NODE_TIMEOUT);
    name_on(&t, 1, "c/lose", name, sizeof(name), &slot);
    dlock_client *a = th_client(t.uri, th_patient());
    dlock *la = handle(a, name, 30000, &box);

    /* the replica frozen: the acquire reaches the primary only, which
     * then dies; the replica takes over without it (TAKEOVER: without
     * the other primaries' votes, which a cluster-node-timeout later
     * would also give) */
    th_redis_kill(&t.node[4], SIGSTOP);
    /* (and cut off: the stream already in its socket would reach it) */
    th_redis_cmd(&t.node[1], NULL, 0, "CLIENT KILL TYPE replica");
    CHECK_OK(dlock_acquire(la, 0));
    uint64_t ta = dlock_token(la);
    dlock_client *b = th_client(t.uri, th_patient());
    dlock *lb = handle(b, name, 30000, NULL);
    th_waiter w = {.l = lb};
    pthread_t th;
    th_waiter_start(&w, &th);
    th_sleep_ms(300); /* b waits, subscribed on node[1] */
    th_redis_kill(&t.node[1], SIGKILL);
    /* the waiter's subscription broke and the slot has no primary to
     * re-arm on: it waits on, on its backoff (docs/design.md, "Waiting
     * through failovers and restarts") */
    th_sleep_ms(500);
    CHECK_EQ(__atomic_load_n(&w.done, __ATOMIC_SEQ_CST), 0);
    th_redis_kill(&t.node[4], SIGCONT);
    CHECK(th_cluster_failover(&t, 4, "TAKEOVER", 30000));
    /* the replica, promoted, never had a's hold: the waiter takes the
     * lock there within its wait (60 s), with a higher token */
    pthread_join(th, NULL);
    CHECK_RC(w.rc, DLOCK_OK);
    CHECK_OP(w.token, >, ta);
    dlock_close(lb);
    dlock_client_close(b);
    /* reported at the next renewal (10 s, ttl/3) */
    CHECK_EQ(th_lost_within(&box, 20000), 1);
    CHECK_RC(dlock_held(la), DLOCK_ELOST);
    th_next_token_above(t.uri, name, ta);
    CHECK_RC(dlock_release(la), DLOCK_ELOST);
    dlock_close(la);
    dlock_client_close(a);
    th_cluster_stop(&t);
}

TEST(a_reshard_keeps_the_hold_and_the_waiter_follows_the_slot)
{
    th_cluster t;
    th_lost box = TH_LOST_INIT;
    char name[64], key[128], v[256];
    int slot;

    th_cluster_start(&t, NODE_TIMEOUT);
    name_on(&t, 0, "c/move", name, sizeof(name), &slot);
    dlock_client *a = th_client(t.uri, th_patient()),
                 *b = th_client(t.uri, th_patient());
    dlock *la = handle(a, name, 1500, &box), *lb = handle(b, name, 30000,
                                                           NULL);
    th_waiter w = {.l = lb};
    pthread_t th;

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t ta = dlock_token(la);
    th_waiter_start(&w, &th);
    th_sleep_ms(300);

    /* migrating: renewals (every 500 ms) still find the key at home */
    CHECK_EQ(th_cluster_move_slot(&t, slot, 2, 1), 0);
    th_sleep_ms(1200);
    CHECK_EQ(dlock_held(la), 1);
    /* the keys moved, the slot not yet given away: renewals meet ASK */
    th_cluster_move_slot(&t, slot, 2, 2);
    th_sleep_ms(1200);
    CHECK_EQ(dlock_held(la), 1);
    /* the slot given away: MOVED, and the waiter's subscription ends on
     * the old node */
    th_cluster_move_slot(&t, slot, 2, 3);
    th_sleep_ms(1200);
    CHECK_EQ(th_lost_calls(&box), 0);
    CHECK_EQ(dlock_held(la), 1);
    snprintf(key, sizeof(key), "dlock:{%s}", name);
    th_redis_cmd(&t.node[2], v, sizeof(v), "GET %s", key);
    CHECK(a_record(v));
    CHECK_EQ(__atomic_load_n(&w.done, __ATOMIC_SEQ_CST), 0);

    release_wakes(la, th, &w, ta);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
    th_cluster_stop(&t);
}

TEST(redis_cli_reshard_under_a_held_lock_keeps_it)
{
    /* `redis-cli --cluster reshard` itself, moving 100 slots (the lock's
     * among them) from node[0] to node[2] while the hold renews every
     * 500 ms and a waiter waits */
    th_cluster t;
    th_lost box = TH_LOST_INIT;
    char name[64], key[128], v[256], from[64], to[64], cmd[512];
    int slot = -1;

    th_cluster_start(&t, NODE_TIMEOUT);
    /* redis-cli takes a source's lowest slots first: a lock in 0..99 */
    for (int n = 0; n < 20000 && (slot < 0 || slot >= 100); n++) {
        snprintf(name, sizeof(name), "c/reshard/%d", n);
        snprintf(key, sizeof(key), "dlock:{%s}", name);
        slot = th_cluster_slot(&t, key);
    }
    CHECK(slot >= 0 && slot < 100);
    CHECK_EQ(th_cluster_owner(&t, slot), 0);
    dlock_client *a = th_client(t.uri, th_patient()),
                 *b = th_client(t.uri, th_patient());
    dlock *la = handle(a, name, 1500, &box), *lb = handle(b, name, 30000,
                                                           NULL);
    th_waiter w = {.l = lb};
    pthread_t th;

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t ta = dlock_token(la);
    th_waiter_start(&w, &th);
    th_sleep_ms(300);
    th_redis_cmd(&t.node[0], from, sizeof(from), "CLUSTER MYID");
    th_redis_cmd(&t.node[2], to, sizeof(to), "CLUSTER MYID");
    snprintf(cmd, sizeof(cmd),
             "redis-cli --cluster reshard 127.0.0.1:%d --cluster-from %s "
             "--cluster-to %s --cluster-slots 100 --cluster-yes "
             ">/dev/null 2>&1 </dev/null",
             t.node[0].port, from, to);
    CHECK_EQ(system(cmd), 0);
    /* the map agreed everywhere (10 s of slack), then a few renewals */
    CHECK(th_cluster_owner_is(&t, slot, 2, 10000));
    th_sleep_ms(1200);
    CHECK_EQ(th_lost_calls(&box), 0);
    CHECK_EQ(dlock_held(la), 1);
    th_redis_cmd(&t.node[2], v, sizeof(v), "GET %s", key);
    CHECK(a_record(v));
    CHECK_EQ(__atomic_load_n(&w.done, __ATOMIC_SEQ_CST), 0);

    release_wakes(la, th, &w, ta);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
    th_cluster_stop(&t);
}

/* A client allowed to read and SPUBLISH, nothing else, on the slot's
 * primary, reads the lock's key (the waiter's client id and number) and
 * sends "g SEQ TOKEN" on the waiter's shard channel, then a flood of
 * them: the waiter keeps waiting, reading the key at most once per
 * message; the release then gives it the lock with a token from the key,
 * not the forged one. (Before, the message came through the slot's
 * primary on a confirmed subscription and was taken as the grant.) */
TEST(a_forged_handover_on_the_shard_channel_only_wakes_the_waiter)
{
    const unsigned long long forged = 9223372036854775000ULL;
    enum { FLOOD = 200 };
    th_cluster *t = steady();
    dlock_client *a = th_client(t->uri, th_patient()),
                 *b = th_client(t->uri, th_patient());
    char name[64], chan[256], msg[64];
    int slot;

    name_on(t, 1, "c/forged", name, sizeof(name), &slot);
    dlock *la = handle(a, name, 30000, NULL), *lb = handle(b, name, 30000,
                                                           NULL);
    th_waiter w = {.l = lb};
    pthread_t th;

    redisContext *f = th_redis_forger(&t->node[1], "spublish");
    redisReply *r;

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t ta = dlock_token(la);
    th_waiter_start(&w, &th);
    /* queued: its line in the key */
    char client[33];
    unsigned long long seq = 0;
    th_redis_waiter_line(f, name, client, &seq);
    snprintf(chan, sizeof(chan), "dlock:{%s}c:%s", name, client);
    long long gets = th_redis_calls(&t->node[1], "get");
    snprintf(msg, sizeof(msg), "g %llu %llu", seq, forged);
    r = redisCommand(f, "SPUBLISH %s %s", chan, msg);
    CHECK(r && r->type == REDIS_REPLY_INTEGER);
    CHECK_EQ(r->integer, 1); /* the waiter's client heard it */
    freeReplyObject(r);
    for (int i = 0; i < FLOOD; i++)
        redisAppendCommand(f, "SPUBLISH %s %s", chan, msg);
    for (int i = 0; i < FLOOD; i++) {
        CHECK_EQ(redisGetReply(f, (void **)&r), REDIS_OK);
        freeReplyObject(r);
    }
    /* a waiter that takes a message for its grant returns within a round
     * trip of reading it; 500 ms is hundreds of those on a busy machine
     * (slower, a wrong client could pass, a right one never fails) */
    th_sleep_ms(500);
    gets = th_redis_calls(&t->node[1], "get") - gets;
    CHECK_EQ(__atomic_load_n(&w.done, __ATOMIC_SEQ_CST), 0);
    CHECK_OP(gets, >=, 1);
    CHECK_OP(gets, <=, FLOOD + 1);
    release_wakes(la, th, &w, ta);
    CHECK_OP(w.token, <, forged);
    fprintf(stderr, "forged on the shard channel: %lld reads for %d "
                    "messages\n",
            gets, FLOOD + 1);
    redisFree(f);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

static const th_test tests[] = {
    T(locks_go_to_their_slots_primary),
    T(bad_uris_say_what_is_wrong),
    T(a_hand_over_goes_through_the_slots_shard_channel),
    T(idle_subscriptions_are_bounded),
    T(a_forged_handover_on_the_shard_channel_only_wakes_the_waiter),
    T(list_walks_every_primary),
    T(cluster_failover_keeps_a_replicated_hold_and_the_waiter),
    T(a_primary_killed_before_its_replica_had_the_hold_reports_it),
    T(a_reshard_keeps_the_hold_and_the_waiter_follows_the_slot),
    T(redis_cli_reshard_under_a_held_lock_keeps_it),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    int rc = th_main(argc, argv, tests);

    if (shared_up)
        th_cluster_stop(&shared);
    return rc;
}
