/* SPDX-License-Identifier: MIT */
/*
 * test_elect.c -- leader election on every store (docs/design.md,
 * "Leader election"): campaign, resign, the leader's value and term,
 * proclaim, and observers woken by the store.
 *
 *   test_elect STORE-KIND [filter]
 */
#include "test.h"

#include <hiredis.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static th_store S;

/* The leader's term as read equals its token, but on Redlock, whose
 * inspection reports the highest counter among the holder's keys: a node
 * that answered the acquire after its quorum may have a higher one
 * (docs/redlock.md). */
static void check_term(uint64_t read, uint64_t token)
{
    if (!strcmp(S.kind, "redlock"))
        CHECK_OP(read, >=, token);
    else
        CHECK_EQ(read, token);
}

/* The stores whose observers and proclaim are built (docs/design.md,
 * "Leader election"): the others must say DLOCK_ENOTSUP, and do. */
static int observable(void)
{
    return !strcmp(S.kind, "redis") || !strcmp(S.kind, "zk") ||
           !strcmp(S.kind, "etcd") || !strcmp(S.kind, "pg") ||
           !strcmp(S.kind, "file") || !strcmp(S.kind, "sqlite") ||
           !strcmp(S.kind, "mem");
}

/* ... and those with a proclaim: Redlock too (its observers would see a
 * term that can go back: docs/locks.md). */
static int proclaims(void)
{
    return observable() || !strcmp(S.kind, "redlock");
}

static dlock_client *client(void)
{
    return th_client(S.uri, th_patient());
}

static dlock *handle(dlock_client *c, const char *name)
{
    return th_handle(c, name, 0, 0, 0);
}

/* What an observer's callback saw. */
#define REC_MAX 256
typedef struct rec {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dlock_leader seen[REC_MAX];
    int n;
} rec;

static void rec_init(rec *r)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
}

static void rec_cb(const char *name, const dlock_leader *ld, void *arg)
{
    rec *r = arg;

    (void)name;
    pthread_mutex_lock(&r->mu);
    if (r->n < REC_MAX)
        r->seen[r->n++] = *ld;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

static int rec_count(rec *r)
{
    pthread_mutex_lock(&r->mu);
    int n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}

/* Waits (ms at most) until the last state seen is `present` with `value`
 * (NULL: any); 1 when it is, with it in *out. */
static int rec_wait(rec *r, int present, const char *value, int64_t ms,
                    dlock_leader *out)
{
    int64_t end = th_now_ms() + ms;
    int ok = 0;

    pthread_mutex_lock(&r->mu);
    for (;;) {
        if (r->n > 0) {
            const dlock_leader *l = &r->seen[r->n - 1];
            if (!l->error && l->present == present &&
                (!value || !strcmp(l->value, value))) {
                if (out)
                    *out = *l;
                ok = 1;
                break;
            }
        }
        int64_t left = end - th_now_ms();
        if (left <= 0)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += left / 1000;
        ts.tv_nsec += (left % 1000) * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    pthread_mutex_unlock(&r->mu);
    return ok;
}

TEST(a_campaign_makes_a_leader_with_its_value_and_term)
{
    dlock_client *a = client(), *b = client();
    dlock *la = handle(a, "el-basic"), *lb = handle(b, "el-basic");
    dlock_leader ld;

    CHECK_OK(dlock_leader_get(b, "el-basic", &ld));
    CHECK_EQ(ld.present, 0);
    CHECK_OK(dlock_campaign(la, "http://10.0.0.1:8080", 5000));
    uint64_t t1 = dlock_token(la);
    CHECK_OP(t1, >, 0);
    CHECK_OK(dlock_leader_get(b, "el-basic", &ld));
    CHECK_EQ(ld.present, 1);
    CHECK_STR(ld.value, "http://10.0.0.1:8080");
    check_term(ld.term, t1);
    /* one leader: another candidate waits, or gives up */
    CHECK_RC(dlock_campaign(lb, "b", 0), DLOCK_EBUSY);
    /* a leader campaigns again: refused, not re-entered */
    CHECK_RC(dlock_campaign(la, "again", 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "leads already");
    CHECK_OK(dlock_resign(la));
    CHECK_OK(dlock_leader_get(b, "el-basic", &ld));
    CHECK_EQ(ld.present, 0);
    CHECK_STR(ld.value, "");
    /* the next term is a greater token */
    CHECK_OK(dlock_campaign(lb, NULL, 5000));
    CHECK_OP(dlock_token(lb), >, t1);
    CHECK_OK(dlock_leader_get(a, "el-basic", &ld));
    CHECK_EQ(ld.present, 1);
    check_term(ld.term, dlock_token(lb));
    CHECK_CONTAINS(ld.value, " pid "); /* the default description */
    CHECK_OK(dlock_resign(lb));
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

TEST(bad_values_and_handles_are_refused_before_the_store)
{
    dlock_client *a = client();
    dlock *l = handle(a, "el-bad");
    dlock *sem = th_handle(a, "el-sem", 0, 0, 2);
    char long_value[DLOCK_VALUE_MAX + 2];

    memset(long_value, 'v', sizeof(long_value) - 1);
    long_value[sizeof(long_value) - 1] = '\0';
    CHECK_RC(dlock_campaign(l, "", 0), DLOCK_EINVAL);
    CHECK_RC(dlock_campaign(l, "two\nlines", 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "control character");
    CHECK_RC(dlock_campaign(l, long_value, 0), DLOCK_EINVAL);
    long_value[DLOCK_VALUE_MAX] = '\0'; /* the longest allowed */
    CHECK_OK(dlock_campaign(l, long_value, 5000));
    dlock_leader ld;
    CHECK_OK(dlock_leader_get(a, "el-bad", &ld));
    if (!strcmp(S.kind, "pg-advisory")) {
        /* the session's application_name: "dlock TOKEN VALUE" in 63
         * bytes (include/dlock.h) */
        CHECK_OP(strlen(ld.value), >=, 37);
        CHECK(!strncmp(ld.value, long_value, strlen(ld.value)));
    } else {
        CHECK_STR(ld.value, long_value);
    }
    CHECK_OK(dlock_resign(l));
    CHECK_RC(dlock_campaign(sem, "x", 0), DLOCK_EINVAL);
    CHECK_RC(dlock_campaign(NULL, "x", 0), DLOCK_EINVAL);
    CHECK_RC(dlock_proclaim(l, "not leading"),
             proclaims() ? DLOCK_ENOTHELD : DLOCK_ENOTSUP);
    CHECK_RC(dlock_leader_get(a, "el-bad", NULL), DLOCK_EINVAL);
    dlock_observer *o = (dlock_observer *)1;
    CHECK_RC(dlock_observe(a, "", NULL, NULL, &o), DLOCK_EINVAL);
    CHECK(o == NULL);
    TH_CLOSE(l, sem);
    TH_CLIENT_CLOSE(a);
}

TEST(a_proclaim_changes_the_value_not_the_term)
{
    dlock_client *a = client(), *b = client();
    dlock *la = handle(a, "el-proclaim");
    dlock_leader ld;

    CHECK_OK(dlock_campaign(la, "first", 5000));
    uint64_t t = dlock_token(la);
    if (!proclaims()) {
        CHECK_RC(dlock_proclaim(la, "second"), DLOCK_ENOTSUP);
        CHECK_CONTAINS(dlock_errmsg(), "cannot proclaim");
        CHECK_OK(dlock_resign(la));
        TH_CLOSE(la);
        TH_CLIENT_CLOSE(a, b);
        return;
    }
    CHECK_OK(dlock_proclaim(la, "second"));
    CHECK_OK(dlock_leader_get(b, "el-proclaim", &ld));
    CHECK_EQ(ld.present, 1);
    CHECK_STR(ld.value, "second");
    check_term(ld.term, t);
    CHECK_EQ(dlock_token(la), t);
    /* still held as before: renewals and the release work */
    CHECK_OK(dlock_extend(la, S.fixed_ttl ? 30000 : 20000));
    CHECK_OK(dlock_resign(la));
    CHECK_OK(dlock_leader_get(b, "el-proclaim", &ld));
    CHECK_EQ(ld.present, 0);
    TH_CLOSE(la);
    TH_CLIENT_CLOSE(a, b);
}

TEST(observers_learn_of_every_change_from_the_store)
{
    dlock_client *a = client(), *b = client(), *w = client();
    /* a lease far longer than the bounds below: a change seen in time
     * came from the store's wake-up, not from the lease-end timer */
    dlock *la = th_handle(a, "el-watch", 60000, 0, 0);
    dlock *lb = th_handle(b, "el-watch", 60000, 0, 0);
    dlock_observer *o = NULL;
    dlock_leader ld;
    static rec r; /* large: not on the stack */

    rec_init(&r);
    if (!observable()) {
        CHECK_RC(dlock_observe(w, "el-watch", rec_cb, &r, &o),
                 DLOCK_ENOTSUP);
        CHECK_CONTAINS(dlock_errmsg(), "cannot be observed");
        CHECK(o == NULL);
        TH_CLOSE(la, lb);
        TH_CLIENT_CLOSE(a, b, w);
        return;
    }
    CHECK_OK(dlock_observe(w, "el-watch", rec_cb, &r, &o));
    /* the first state is there at once, and the descriptor says so */
    struct pollfd p = {dlock_observer_fd(o), POLLIN, 0};
    CHECK_EQ(poll(&p, 1, 0), 1);
    CHECK_OK(dlock_observer_read(o, &ld));
    CHECK_EQ(ld.present, 0);
    CHECK_RC(dlock_observer_read(o, &ld), DLOCK_EBUSY);
    CHECK_EQ(poll(&p, 1, 0), 0);
    CHECK(rec_wait(&r, 0, NULL, 5000, NULL));

    /* bounds: 5 s, a busy machine's scheduling; the lease is 60 s */
    CHECK_OK(dlock_campaign(la, "a-1", 5000));
    CHECK(rec_wait(&r, 1, "a-1", 5000, &ld));
    CHECK_EQ(ld.term, dlock_token(la));
    CHECK_EQ(poll(&p, 1, 5000), 1);
    CHECK_OK(dlock_observer_read(o, &ld));
    CHECK_STR(ld.value, "a-1");

    CHECK_OK(dlock_proclaim(la, "a-2"));
    CHECK(rec_wait(&r, 1, "a-2", 5000, &ld));
    CHECK_EQ(ld.term, dlock_token(la));
    /* once more: the campaign's own events are long read by now, so
     * only the proclaim's can wake the observer */
    CHECK_OK(dlock_proclaim(la, "a-3"));
    CHECK(rec_wait(&r, 1, "a-3", 5000, &ld));
    CHECK_EQ(ld.term, dlock_token(la));

    /* a resigns, b leads: the observer sees b's term */
    uint64_t ta = dlock_token(la);
    CHECK_OK(dlock_resign(la));
    CHECK_OK(dlock_campaign(lb, "b-1", 5000));
    CHECK(rec_wait(&r, 1, "b-1", 5000, &ld));
    CHECK_OP(ld.term, >, ta);
    CHECK_EQ(ld.term, dlock_token(lb));
    CHECK_OK(dlock_resign(lb));
    CHECK(rec_wait(&r, 0, NULL, 5000, NULL));

    /* terms only grow in what the observer saw */
    pthread_mutex_lock(&r.mu);
    uint64_t last = 0;
    for (int i = 0; i < r.n; i++) {
        if (r.seen[i].present) {
            CHECK_OP(r.seen[i].term, >=, last);
            last = r.seen[i].term;
        }
    }
    pthread_mutex_unlock(&r.mu);
    dlock_observer_close(o);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b, w);
}

/* A leader in a forked child, killed: its lease frees the election. */
static int lead_child(void *arg)
{
    th_holder *h = arg;
    dlock_client *c = NULL;
    dlock *l = NULL;
    dlock_options o = {.ttl_ms = h->ttl};

    if (dlock_client_open(&c, h->uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, h->name, &o) != DLOCK_OK ||
        dlock_campaign(l, "doomed", 5000) != DLOCK_OK)
        return 2;
    h->token = dlock_token(l);
    h->ready = 1;
    for (int i = 0; i < 600; i++) /* 60 s at most: the parent kills it */
        usleep(100000);
    return 0;
}

TEST(a_dead_leader_is_followed_within_its_lease)
{
    if (!observable()) {
        printf("     (no observers on this store yet)\n");
        return;
    }
    th_holder *h = th_shared(sizeof(*h));
    int64_t ttl = 2000;
    dlock_client *b = client(), *w = client();
    dlock *lb = th_handle(b, "el-dead", 30000, 0, 0);
    dlock_observer *o = NULL;
    static rec r; /* large: not on the stack */

    snprintf(h->uri, sizeof(h->uri), "%s", S.uri);
    snprintf(h->name, sizeof(h->name), "el-dead");
    h->ttl = ttl;
    rec_init(&r);
    CHECK_OK(dlock_observe(w, "el-dead", rec_cb, &r, &o));
    pid_t pid = th_fork(lead_child, h);
    CHECK(th_wait_flag(&h->ready, 10000));
    CHECK(rec_wait(&r, 1, "doomed", 5000, NULL));
    kill(pid, SIGKILL);
    CHECK_EQ(th_wait(pid), 128 + SIGKILL);
    int64_t t0 = th_now_ms();
    /* nobody campaigns: the observer's timer at the lease end reads the
     * election free (bound: the lease, plus 5 s of a busy machine) */
    CHECK(rec_wait(&r, 0, NULL, ttl + 5000, NULL));
    CHECK_OP(th_now_ms() - t0, <, ttl + 5000);
    /* a candidate leads at once, with a greater term */
    CHECK_OK(dlock_campaign(lb, "next", 5000));
    CHECK_OP(dlock_token(lb), >, h->token);
    dlock_leader ld;
    CHECK(rec_wait(&r, 1, "next", 5000, &ld));
    CHECK_EQ(ld.term, dlock_token(lb));
    CHECK_OK(dlock_resign(lb));
    dlock_observer_close(o);
    TH_CLOSE(lb);
    TH_CLIENT_CLOSE(b, w);
}

TEST(a_forged_ring_makes_no_leader)
{
    if (strcmp(S.kind, "redis") != 0) {
        /* ZooKeeper's and etcd's watches are the server's own events of
         * real writes; the file store's and SQLite's are the kernel's,
         * of files only the store's writers may open for writing;
         * PostgreSQL's NOTIFY works as Redis' PUBLISH (a wake-up, then a
         * read) */
        printf("     (nobody but the store's writers can ring here)\n");
        return;
    }
    dlock_client *a = client(), *w = client();
    dlock *la = th_handle(a, "el-forge", 60000, 0, 0);
    dlock_observer *o = NULL;
    dlock_leader ld;
    static rec r; /* large: not on the stack */

    rec_init(&r);
    CHECK_OK(dlock_campaign(la, "real", 5000));
    CHECK_OK(dlock_observe(w, "el-forge", rec_cb, &r, &o));
    CHECK(rec_wait(&r, 1, "real", 5000, NULL));
    int before = rec_count(&r);
    /* a user who may only read and publish rings the election's channel
     * a hundred times: the observer reads again, and sees the same */
    th_redis *srv = th_store_redis_for(&S, "dlock:{el-forge}");
    int cluster = S.srv.port == 0; /* a cluster: SPUBLISH */
    void *f = th_redis_forger(srv, cluster ? "spublish" : "publish");
    for (int i = 0; i < 100; i++) {
        redisReply *rep = redisCommand(f, "%s dlock:{el-forge}e c",
                                       cluster ? "SPUBLISH" : "PUBLISH");
        CHECK(rep != NULL);
        freeReplyObject(rep);
    }
    /* the proclaim after them is seen: the observer kept up */
    CHECK_OK(dlock_proclaim(la, "real-2"));
    CHECK(rec_wait(&r, 1, "real-2", 5000, &ld));
    CHECK_EQ(ld.term, dlock_token(la));
    /* and nothing but that one change was reported */
    CHECK_EQ(rec_count(&r), before + 1);
    redisFree(f);
    CHECK_OK(dlock_resign(la));
    dlock_observer_close(o);
    TH_CLOSE(la);
    TH_CLIENT_CLOSE(a, w);
}

TEST(closing_the_client_first_stops_its_observers)
{
    if (!observable()) {
        printf("     (no observers on this store yet)\n");
        return;
    }
    dlock_client *w = client();
    dlock_observer *o = NULL;
    static rec r; /* large: not on the stack */

    rec_init(&r);
    CHECK_OK(dlock_observe(w, "el-close", rec_cb, &r, &o));
    CHECK(rec_wait(&r, 0, NULL, 5000, NULL));
    dlock_client_close(w); /* the observer's thread stops with it */
    dlock_observer_close(o); /* then frees it, and the client */
}

static const th_test tests[] = {
    T(a_campaign_makes_a_leader_with_its_value_and_term),
    T(bad_values_and_handles_are_refused_before_the_store),
    T(a_proclaim_changes_the_value_not_the_term),
    TK(observers_learn_of_every_change_from_the_store),
    TKP(a_dead_leader_is_followed_within_its_lease),
    TK(a_forged_ring_makes_no_leader),
    T(closing_the_client_first_stops_its_observers),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    return th_store_main(argc, argv, &S, tests, NULL);
}
