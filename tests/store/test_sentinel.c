/* SPDX-License-Identifier: MIT */
/*
 * test_sentinel.c -- redis-sentinel://: a primary with two replicas and
 * three sentinels (redis-server --sentinel), all real, on free loopback
 * ports; each test that fails a primary over starts its own set.
 *
 *   test_sentinel [filter]
 *
 * The client finds the primary through the sentinels; min_replicas waits
 * for the replicas (and gives up a lock they did not acknowledge);
 * a failover (SENTINEL FAILOVER) keeps a hold the new primary has and
 * moves waiters there; a failover that loses a hold (the primary killed
 * before it replicated it) is reported: the lost-lock callback, ELOST,
 * and the next owner's token is higher.
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

typedef struct topo {
    th_redis data[3]; /* data[0] starts as the primary */
    th_redis sent[3];
    char uri[512];
} topo;

/* The port the sentinels name as the primary (0: none answered). */
static int primary_port(topo *t)
{
    for (int i = 0; i < 3; i++) {
        if (t->sent[i].pid <= 0)
            continue;
        struct timeval tv = {2, 0};
        redisContext *c = redisConnectWithTimeout("127.0.0.1",
                                                  t->sent[i].port, tv);
        int port = 0;
        if (c && !c->err) {
            redisReply *r = redisCommand(c, "SENTINEL "
                                            "get-master-addr-by-name %s",
                                         MASTER);
            if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2)
                port = atoi(r->element[1]->str);
            if (r)
                freeReplyObject(r);
        }
        if (c)
            redisFree(c);
        if (port)
            return port;
    }
    return 0;
}

static th_redis *data_at(topo *t, int port)
{
    for (int i = 0; i < 3; i++)
        if (t->data[i].port == port)
            return &t->data[i];
    th_fail(__FILE__, __LINE__, "no data node on port %d", port);
    return NULL;
}

/* How many of something a sentinel's SENTINEL subcommand lists. */
static long long sentinel_count(th_redis *s, const char *what)
{
    return th_redis_cmd(s, NULL, 0, "SENTINEL %s %s", what, MASTER);
}

static void topo_start(topo *t)
{
    char extra[128];

    memset(t, 0, sizeof(*t));
    th_redis_start(&t->data[0], NULL);
    snprintf(extra, sizeof(extra), "replicaof 127.0.0.1 %d",
             t->data[0].port);
    th_redis_start(&t->data[1], extra);
    th_redis_start(&t->data[2], extra);
    for (int i = 0; i < 3; i++)
        th_sentinel_start(&t->sent[i], &t->data[0], MASTER, 1000);
    snprintf(t->uri, sizeof(t->uri),
             "redis-sentinel://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d/"
             MASTER,
             t->sent[0].port, t->sent[1].port, t->sent[2].port);
    /* until every sentinel knows both replicas and the other two, and
     * both replicas are in sync (30 s at most) */
    int64_t until = th_now_ms() + 30000;
    for (;;) {
        int ready = th_redis_cmd(&t->data[0], NULL, 0, "WAIT 2 100") == 2;
        for (int i = 0; i < 3 && ready; i++)
            ready = sentinel_count(&t->sent[i], "replicas") == 2 &&
                    sentinel_count(&t->sent[i], "sentinels") == 2;
        if (ready)
            return;
        if (th_now_ms() > until)
            th_fail(__FILE__, __LINE__, "the sentinels did not see the "
                                        "replicas and each other in 30 s");
        th_sleep_ms(100);
    }
}

static void topo_stop(topo *t)
{
    for (int i = 0; i < 3; i++)
        th_redis_stop(&t->sent[i]);
    for (int i = 0; i < 3; i++)
        th_redis_stop(&t->data[i]);
}

/* Waits (30 s at most) until the sentinels name another primary than
 * `old` and it says it is one; returns its port. */
static int until_failed_over(topo *t, int old)
{
    int64_t until = th_now_ms() + 30000;

    while (th_now_ms() < until) {
        int p = primary_port(t);
        if (p && p != old) {
            char role[64];
            th_redis_cmd(data_at(t, p), role, sizeof(role), "ROLE");
            /* an array: th_redis_cmd copies nothing; INFO says it */
            char info[4096];
            th_redis_cmd(data_at(t, p), info, sizeof(info),
                         "INFO replication");
            if (strstr(info, "role:master"))
                return p;
        }
        th_sleep_ms(50);
    }
    th_fail(__FILE__, __LINE__, "no failover within 30 s");
    return 0;
}

typedef struct lost_box {
    pthread_mutex_t mu;
    int calls;
    int64_t at;
} lost_box;

static void on_lost(dlock *l, uint64_t token, void *arg)
{
    lost_box *b = arg;

    (void)l;
    (void)token;
    pthread_mutex_lock(&b->mu);
    b->calls++;
    b->at = th_now_ms();
    pthread_mutex_unlock(&b->mu);
}

static int lost_calls(lost_box *b)
{
    pthread_mutex_lock(&b->mu);
    int n = b->calls;
    pthread_mutex_unlock(&b->mu);
    return n;
}

static dlock_client *client_at(const char *u)
{
    dlock_client *c = NULL;

    CHECK_OK(dlock_client_open(&c, u, th_patient()));
    return c;
}

static dlock *handle(dlock_client *c, const char *name, int64_t ttl,
                     lost_box *box)
{
    dlock_options o;
    dlock *l = NULL;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = ttl;
    o.on_lost = box ? on_lost : NULL;
    o.on_lost_arg = box;
    CHECK_OK(dlock_open(&l, c, name, &o));
    return l;
}

/* One set shared by the tests that fail nothing over. */
static topo shared;
static int shared_up;

static topo *steady(void)
{
    if (!shared_up) {
        topo_start(&shared);
        shared_up = 1;
    }
    return &shared;
}

TEST(locks_through_the_sentinels)
{
    topo *t = steady();
    dlock_client *c = client_at(t->uri);
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
    topo *t = steady();
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
    topo *t = steady();
    char u[600];

    snprintf(u, sizeof(u), "%s?min_replicas=2&replica_timeout=300", t->uri);
    dlock_client *c = client_at(u);
    dlock *l = handle(c, "s/wait", 0, NULL);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);

    /* three asked of two replicas: refused, and the lock let go */
    snprintf(u, sizeof(u), "%s?min_replicas=3&replica_timeout=300", t->uri);
    c = client_at(u);
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

/* A waiting thread. */
typedef struct waiter {
    dlock *l;
    int rc;
    uint64_t token;
    int64_t done_at;
    int done; /* (atomic) */
} waiter;

static void *wait_thread(void *arg)
{
    waiter *w = arg;

    w->rc = dlock_acquire(w->l, 60000);
    w->token = dlock_token(w->l);
    w->done_at = th_now_ms();
    __atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
    if (w->rc == DLOCK_OK)
        dlock_release(w->l);
    return NULL;
}

TEST(failover_keeps_a_replicated_hold_and_moves_the_waiters)
{
    topo t;
    lost_box box = {PTHREAD_MUTEX_INITIALIZER, 0, 0};

    topo_start(&t);
    char u[600];
    snprintf(u, sizeof(u), "%s?min_replicas=2&replica_timeout=500", t.uri);
    dlock_client *a = client_at(u), *b = client_at(t.uri);
    dlock *la = handle(a, "s/keep", 30000, &box);
    dlock *lb = handle(b, "s/keep", 30000, NULL);
    waiter w = {lb, -99, 0, 0, 0};
    pthread_t th;

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t ta = dlock_token(la);
    pthread_create(&th, NULL, wait_thread, &w);
    th_sleep_ms(300); /* b queues behind a */

    int old = t.data[0].port;
    CHECK_EQ(th_redis_cmd(&t.sent[0], NULL, 0, "SENTINEL FAILOVER %s",
                          MASTER),
             0);
    int now = until_failed_over(&t, old);
    /* the client follows and checks its hold on the new primary: it is
     * there (acknowledged by both replicas), so it is kept */
    th_sleep_ms(3000);
    CHECK_EQ(lost_calls(&box), 0);
    CHECK_EQ(dlock_held(la), 1);
    char v[256];
    th_redis_cmd(data_at(&t, now), v, sizeof(v), "GET dlock:{s/keep}");
    CHECK(strncmp(v, "", 1) != 0);
    CHECK_EQ(__atomic_load_n(&w.done, __ATOMIC_SEQ_CST), 0);

    /* the release on the new primary wakes the waiter there */
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(la));
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    CHECK_OP(w.done_at - t0, <, 10000);
    CHECK_OP(w.token, >, ta);
    dlock_close(la);
    dlock_close(lb);
    dlock_client_close(a);
    dlock_client_close(b);
    topo_stop(&t);
}

TEST(failover_that_loses_a_hold_reports_it)
{
    topo t;
    lost_box box = {PTHREAD_MUTEX_INITIALIZER, 0, 0};

    topo_start(&t);
    dlock_client *a = client_at(t.uri);
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

    int now = until_failed_over(&t, old);
    int64_t seen = th_now_ms();
    /* reported once the switch is heard: long before its 30 s lease */
    while (lost_calls(&box) == 0 && th_now_ms() < seen + 10000)
        th_sleep_ms(10);
    CHECK_EQ(lost_calls(&box), 1);
    CHECK_RC(dlock_held(la), DLOCK_ELOST);

    /* someone else takes it on the new primary, with a higher token */
    dlock_client *b = client_at(t.uri);
    dlock *lb = handle(b, "s/lose", 30000, NULL);
    CHECK_OK(dlock_acquire(lb, 5000));
    CHECK_OP(dlock_token(lb), >, ta);
    char v[256];
    th_redis_cmd(data_at(&t, now), v, sizeof(v), "GET dlock:{s/lose}");
    CHECK(strlen(v) > 0);
    CHECK_RC(dlock_release(la), DLOCK_ELOST);
    CHECK_OK(dlock_release(lb));
    dlock_close(la);
    dlock_close(lb);
    dlock_client_close(a);
    dlock_client_close(b);
    topo_stop(&t);
}

static const th_test tests[] = {
    T(locks_through_the_sentinels),
    T(bad_uris_say_what_is_wrong),
    T(min_replicas_waits_for_the_replicas),
    T(failover_keeps_a_replicated_hold_and_moves_the_waiters),
    T(failover_that_loses_a_hold_reports_it),
    {NULL, NULL, 0},
};

int main(int argc, char **argv)
{
    int rc = th_main(argc, argv, tests);

    if (shared_up)
        topo_stop(&shared);
    return rc;
}
