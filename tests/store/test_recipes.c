/* SPDX-License-Identifier: MIT */
/*
 * test_recipes.c -- what users hire a lock for, on every store: several
 * locks at once (dlock_acquire_all(), docs/design.md "Several locks at
 * once"), and scheduled jobs (dlock_options.at_least_ms and at_most_ms,
 * docs/design.md "Scheduled jobs: at least, at most").
 *
 *   test_recipes STORE-KIND [filter]
 */
#include "test.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static th_store S;

/* Patient clients (10 s a store call): these tests are about sets, not
 * the server's speed. */
static dlock_client *client(void)
{
    return th_client(S.uri, th_patient());
}

static dlock *handle(dlock_client *c, const char *name)
{
    return th_handle(c, name, 0, 0, 0);
}

/* Fails the test unless another client's try of `name` finds it free
 * (then lets it go) or held (busy 1). */
static void check_free(dlock_client *other, const char *name, int busy)
{
    dlock *l = handle(other, name);

    if (busy) {
        CHECK_RC(dlock_acquire(l, 0), DLOCK_EBUSY);
    } else {
        CHECK_OK(dlock_acquire(l, 0));
        CHECK_OK(dlock_release(l));
    }
    dlock_close(l);
}

TEST(a_set_is_taken_whole_and_released_whole)
{
    dlock_client *a = client(), *b = client();
    /* given out of order: taken in name order all the same */
    dlock *set[3] = {handle(a, "set-c"), handle(a, "set-a"),
                     handle(a, "set-b")};

    CHECK_OK(dlock_acquire_all(set, 3, 5000));
    for (int i = 0; i < 3; i++) {
        CHECK_EQ(dlock_held(set[i]), 1);
        CHECK_OP(dlock_token(set[i]), >, 0);
    }
    check_free(b, "set-a", 1);
    check_free(b, "set-b", 1);
    check_free(b, "set-c", 1);
    CHECK_OK(dlock_release_all(set, 3));
    for (int i = 0; i < 3; i++)
        CHECK_EQ(dlock_held(set[i]), 0);
    check_free(b, "set-a", 0);
    check_free(b, "set-b", 0);
    check_free(b, "set-c", 0);
    /* a name the thread holds already is re-entered, and stays held */
    CHECK_OK(dlock_acquire(set[1], 0));
    uint64_t tok = dlock_token(set[1]);
    CHECK_OK(dlock_acquire_all(set, 3, 5000));
    CHECK_EQ(dlock_held(set[1]), 2);
    CHECK_EQ(dlock_token(set[1]), tok);
    CHECK_OK(dlock_release_all(set, 3));
    CHECK_EQ(dlock_held(set[1]), 1);
    check_free(b, "set-c", 0);
    CHECK_OK(dlock_release(set[1]));
    th_close_n(set, 3);
    TH_CLIENT_CLOSE(a, b);
}

TEST(a_set_that_cannot_be_had_leaves_nothing)
{
    dlock_client *a = client(), *b = client();
    dlock *set[3] = {handle(a, "part-a"), handle(a, "part-b"),
                     handle(a, "part-c")};
    dlock *hb = handle(b, "part-b");

    CHECK_OK(dlock_acquire(hb, 0));
    /* one try each, then a wait: EBUSY naming the busy one, and part-a,
     * taken before it, given back */
    CHECK_RC(dlock_acquire_all(set, 3, 0), DLOCK_EBUSY);
    CHECK_CONTAINS(dlock_errmsg(), "part-b");
    CHECK_CONTAINS(dlock_errmsg(), "none of the set's 3 locks is held");
    int64_t t0 = th_now_ms();
    CHECK_RC(dlock_acquire_all(set, 3, 300), DLOCK_EBUSY);
    /* the wait is the set's: its deadline, plus a store call's slack
     * (10 s on a patient client: the bound the contract gives) */
    CHECK_OP(th_now_ms() - t0, >=, 290);
    CHECK_OP(th_now_ms() - t0, <, 300 + 10000);
    for (int i = 0; i < 3; i++)
        CHECK_EQ(dlock_held(set[i]), 0);
    check_free(b, "part-a", 0);
    check_free(b, "part-c", 0);
    /* freed: the whole set now */
    CHECK_OK(dlock_release(hb));
    CHECK_OK(dlock_acquire_all(set, 3, 5000));
    CHECK_OK(dlock_release_all(set, 3));
    dlock_close(hb);
    th_close_n(set, 3);
    TH_CLIENT_CLOSE(a, b);
}

TEST(bad_sets_are_refused_before_the_store)
{
    dlock_client *a = client(), *b = client();
    dlock *x = handle(a, "bad-x"), *y = handle(a, "bad-y");
    dlock *x2 = handle(a, "bad-x"), *other = handle(b, "bad-z");

    CHECK_RC(dlock_acquire_all(NULL, 2, 0), DLOCK_EINVAL);
    CHECK_RC(dlock_acquire_all((dlock *[]){x}, 0, 0), DLOCK_EINVAL);
    CHECK_RC(dlock_acquire_all((dlock *[]){x, NULL}, 2, 0), DLOCK_EINVAL);
    CHECK_RC(dlock_acquire_all((dlock *[]){x, x2}, 2, 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "twice");
    CHECK_RC(dlock_acquire_all((dlock *[]){x, other}, 2, 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "another client");
    CHECK_RC(dlock_acquire_all((dlock *[]){x, y}, 2, -2), DLOCK_EINVAL);
    CHECK_RC(dlock_acquire_all((dlock *[]){x, y}, DLOCK_ALL_MAX + 1, 0),
             DLOCK_EINVAL);
    CHECK_RC(dlock_release_all((dlock *[]){x, x2}, 2), DLOCK_EINVAL);
    CHECK_EQ(dlock_held(x), 0);
    CHECK_EQ(dlock_held(y), 0);
    /* a release of a set not held: every lock tried, ENOTHELD */
    CHECK_RC(dlock_release_all((dlock *[]){x, y}, 2), DLOCK_ENOTHELD);
    TH_CLOSE(x, y, x2, other);
    TH_CLIENT_CLOSE(a, b);
}

/* Two owners take {P, Q} over and over, one naming them P, Q and the
 * other Q, P: ordered by name they never hold one each and wait for the
 * other's (a deadlock would end the test's waits with DLOCK_EBUSY). */
typedef struct pair_arg {
    dlock *set[2];
    int rounds;
    volatile int *inside;
    int rc, overlap;
} pair_arg;

static void *pair_main(void *p)
{
    pair_arg *a = p;

    for (int i = 0; i < a->rounds; i++) {
        /* 30 s: far beyond the other's few holds of a few ms, short of
         * the suite's timeout; a deadlock would end here */
        a->rc = dlock_acquire_all(a->set, 2, 30000);
        if (a->rc != DLOCK_OK) {
            fprintf(stderr, "round %d: %s\n", i, dlock_errmsg());
            return NULL;
        }
        if (__atomic_add_fetch(a->inside, 1, __ATOMIC_SEQ_CST) != 1)
            a->overlap = 1;
        th_sleep_ms(2);
        __atomic_sub_fetch(a->inside, 1, __ATOMIC_SEQ_CST);
        a->rc = dlock_release_all(a->set, 2);
        if (a->rc != DLOCK_OK) {
            fprintf(stderr, "round %d release: %s\n", i, dlock_errmsg());
            return NULL;
        }
    }
    return NULL;
}

TEST(sets_named_in_opposite_orders_do_not_deadlock)
{
    dlock_client *a = client(), *b = client();
    volatile int inside = 0;
    int rounds = getenv("DLOCK_UNDER_VALGRIND") ? 5 : 25;
    pair_arg x = {{handle(a, "pair-p"), handle(a, "pair-q")}, rounds,
                  &inside, 0, 0};
    pair_arg y = {{handle(b, "pair-q"), handle(b, "pair-p")}, rounds,
                  &inside, 0, 0};
    pthread_t tx, ty;

    CHECK_EQ(pthread_create(&tx, NULL, pair_main, &x), 0);
    CHECK_EQ(pthread_create(&ty, NULL, pair_main, &y), 0);
    pthread_join(tx, NULL);
    pthread_join(ty, NULL);
    CHECK_OK(x.rc);
    CHECK_OK(y.rc);
    CHECK_EQ(x.overlap + y.overlap, 0);
    th_close_n(x.set, 2);
    th_close_n(y.set, 2);
    TH_CLIENT_CLOSE(a, b);
}

typedef struct waiting_set {
    dlock **set;
    size_t n;
    int64_t wait_ms;
    volatile int done;
    int rc, released; /* the acquire's, and its release's (its thread) */
    char msg[600];
} waiting_set;

static void *set_main(void *p)
{
    waiting_set *w = p;

    w->rc = dlock_acquire_all(w->set, w->n, w->wait_ms);
    snprintf(w->msg, sizeof(w->msg), "%s", w->rc ? dlock_errmsg() : "");
    w->released = w->rc ? DLOCK_OK : dlock_release_all(w->set, w->n);
    __atomic_store_n(&w->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

TEST(a_cancel_of_any_handle_ends_the_set)
{
    dlock_client *a = client(), *b = client();
    dlock *set[2] = {handle(a, "cx-a"), handle(a, "cx-b")};
    dlock *hb = handle(b, "cx-b");
    waiting_set w = {set, 2, 60000, 0, 0, 0, ""};
    pthread_t t;

    CHECK_OK(dlock_acquire(hb, 0));
    int64_t t0 = th_now_ms();
    CHECK_EQ(pthread_create(&t, NULL, set_main, &w), 0);
    /* the set holds cx-a and waits for cx-b: the cancel goes through
     * cx-a's handle, the one it is NOT waiting on. Seen queued where the
     * store can tell; a cancel before the call is not remembered, so the
     * test cancels again every 100 ms until the set returns, 20 s at
     * most */
    th_wait_queued(b, "cx-b", 1, 20000);
    for (int i = 0; i < 200 && !__atomic_load_n(&w.done, __ATOMIC_ACQUIRE);
         i++) {
        CHECK_OK(dlock_cancel(set[0]));
        th_sleep_ms(100);
    }
    pthread_join(t, NULL);
    CHECK_RC(w.rc, DLOCK_ECANCELED);
    /* well before the set's 60 s wait: within the 20 s of cancels */
    CHECK_OP(th_now_ms() - t0, <, 30000);
    CHECK_EQ(dlock_held(set[0]), 0);
    CHECK_EQ(dlock_held(set[1]), 0);
    check_free(b, "cx-a", 0);
    CHECK_OK(dlock_release(hb));
    /* nothing queued behind: the set is whole again */
    CHECK_OK(dlock_acquire_all(set, 2, 5000));
    CHECK_OK(dlock_release_all(set, 2));
    dlock_close(hb);
    th_close_n(set, 2);
    TH_CLIENT_CLOSE(a, b);
}

TEST(a_waiting_set_gets_its_locks_when_freed)
{
    dlock_client *a = client(), *b = client();
    dlock *set[2] = {handle(a, "wake-a"), handle(a, "wake-b")};
    dlock *ha = handle(b, "wake-a"), *hb = handle(b, "wake-b");
    waiting_set w = {set, 2, 30000, 0, 0, 0, ""};
    pthread_t t;

    CHECK_OK(dlock_acquire(ha, 0));
    CHECK_OK(dlock_acquire(hb, 0));
    CHECK_EQ(pthread_create(&t, NULL, set_main, &w), 0);
    th_sleep_ms(200);
    CHECK_OK(dlock_release(hb));
    th_sleep_ms(200);
    CHECK_EQ(__atomic_load_n(&w.done, __ATOMIC_ACQUIRE), 0);
    CHECK_OK(dlock_release(ha));
    pthread_join(t, NULL);
    if (w.rc)
        fprintf(stderr, "%s\n", w.msg);
    CHECK_OK(w.rc);
    CHECK_OK(w.released);
    check_free(b, "wake-a", 0);
    check_free(b, "wake-b", 0);
    TH_CLOSE(ha, hb);
    th_close_n(set, 2);
    TH_CLIENT_CLOSE(a, b);
}

TEST(a_lost_lock_makes_the_set_lost)
{
    dlock_client *a = client(), *op = client();
    dlock *set[2] = {handle(a, "lost-a"), handle(a, "lost-b")};
    dlock_info in;
    int rc;

    CHECK_OK(dlock_acquire_all(set, 2, 5000));
    memset(&in, 0, sizeof(in));
    rc = dlock_break(op, "lost-b", &in);
    dlock_info_clear(&in);
    if (rc == DLOCK_ENOTSUP) {
        /* file:// and the others whose holds only the holder ends */
        printf("     (no dlock_break() on this store: %s)\n",
               dlock_errmsg());
        CHECK_OK(dlock_release_all(set, 2));
    } else {
        CHECK_OK(rc);
        CHECK_RC(dlock_release_all(set, 2), DLOCK_ELOST);
        CHECK_CONTAINS(dlock_errmsg(), "lost-b");
        /* the other one released all the same */
        CHECK_EQ(dlock_held(set[0]), 0);
        check_free(op, "lost-a", 0);
    }
    th_close_n(set, 2);
    TH_CLIENT_CLOSE(a, op);
}


/* ------------------------------------------------------------------------ */
/* Scheduled jobs: at least, at most                                        */
/* ------------------------------------------------------------------------ */

/* A handle with ttl, at_least_ms and at_most_ms (DLOCK_OK or the
 * dlock_open() error, *out NULL then). */
static int open_sched(dlock_client *c, const char *name, int64_t ttl,
                      int64_t least, int64_t most, dlock_lost_cb cb,
                      void *arg, dlock **out)
{
    dlock_options o;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = ttl;
    o.at_least_ms = least;
    o.at_most_ms = most;
    o.on_lost = cb;
    o.on_lost_arg = arg;
    return dlock_open(out, c, name, &o);
}

/* The lease the tests use: the store's shortest that it keeps (Redlock's
 * covers its node timeouts). */
static int64_t sched_ttl(void)
{
    return S.short_ttl > 300 ? S.short_ttl : 300;
}

TEST(at_least_and_at_most_are_refused_where_no_lease_ends_them)
{
    dlock_client *c = client();
    dlock *l = NULL;

    CHECK_RC(open_sched(c, "sched-bad", 1000, -1, 0, NULL, NULL, &l),
             DLOCK_EINVAL);
    CHECK_RC(open_sched(c, "sched-bad", 1000, 5000, 2000, NULL, NULL, &l),
             DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "below at_least_ms");
    CHECK_RC(open_sched(c, "sched-bad", 1000, 0, 5, NULL, NULL, &l),
             DLOCK_EINVAL);
    if (!S.lease_runs_out) {
        /* the file store, ZooKeeper, etcd, PostgreSQL advisory locks */
        CHECK_RC(open_sched(c, "sched-bad", 1000, 2000, 0, NULL, NULL, &l),
                 DLOCK_ENOTSUP);
        CHECK_CONTAINS(dlock_errmsg(), "needs a lease the store ends");
        CHECK_RC(open_sched(c, "sched-bad", 1000, 0, 2000, NULL, NULL, &l),
                 DLOCK_ENOTSUP);
        CHECK(l == NULL);
    } else {
        CHECK_OK(open_sched(c, "sched-bad", 1000, 2000, 4000, NULL, NULL, &l));
        dlock_close(l);
    }
    dlock_client_close(c);
}

TEST(an_early_release_keeps_the_lock_until_its_at_least_end)
{
    if (!S.lease_runs_out) {
        printf("     (no at_least_ms on this store: the test above)\n");
        return;
    }
    dlock_client *a = client(), *b = client();
    int64_t ttl = sched_ttl(), least = 4 * ttl;
    dlock *l = NULL, *o = handle(b, "sched-least");

    CHECK_OK(open_sched(a, "sched-least", ttl, least, 0, NULL, NULL, &l));
    /* before the call: the at-least time counts from after the store
     * took the lock, so never from before this */
    int64_t t_ret = th_now_ms();
    CHECK_OK(dlock_acquire(l, 5000));
    CHECK_OK(dlock_release(l)); /* the job ended at once */
    CHECK_EQ(dlock_held(l), 0);
    /* still taken in the store: the at-least time is not over */
    CHECK_RC(dlock_acquire(o, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_acquire(o, least + 10000));
    int64_t t_got = th_now_ms();
    /* not before the at-least end (counted from the acquire's return,
     * after the store took it and after t_ret; 5 ms for the store's
     * millisecond clock), and once the lease ends, found within a
     * wait's slack */
    CHECK_OP(t_got, >=, t_ret + least - 5);
    CHECK_OP(t_got, <, t_ret + least + 10000);
    CHECK_OK(dlock_release(o));
    /* after the at-least end, a release frees the lock at once */
    CHECK_OK(dlock_acquire(l, 5000));
    th_sleep_ms(least + 100);
    CHECK_OK(dlock_release(l));
    CHECK_OK(dlock_acquire(o, 0));
    CHECK_OK(dlock_release(o));
    TH_CLOSE(l, o);
    TH_CLIENT_CLOSE(a, b);
}

typedef struct dead_holder {
    int64_t t_ret; /* just before its acquire (th_now_ms) */
    int rc;
} dead_holder;

static int hold_and_die(void *arg)
{
    dead_holder *d = arg;
    dlock_client *c = NULL;
    dlock *l = NULL;
    int64_t ttl = sched_ttl();

    if (dlock_client_open(&c, S.uri, th_patient()) != DLOCK_OK ||
        open_sched(c, "sched-dead", ttl, 6 * ttl, 0, NULL, NULL, &l) !=
            DLOCK_OK) {
        d->rc = -100;
        _exit(1);
    }
    d->t_ret = th_now_ms(); /* before: never later than the take */
    d->rc = dlock_acquire(l, 5000);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    _exit(0); /* the host dies: no release, no renewal */
}

TEST(a_dead_holder_leaves_the_lock_until_its_at_least_end)
{
    if (!S.lease_runs_out) {
        printf("     (no at_least_ms on this store)\n");
        return;
    }
    dead_holder *d = th_shared(sizeof(*d));
    dlock_client *b = client();
    dlock *o = handle(b, "sched-dead");
    int64_t ttl = sched_ttl(), least = 6 * ttl;

    CHECK_EQ(th_wait(th_fork(hold_and_die, d)), 0);
    CHECK_OK(d->rc);
    /* two of its leases later: a lease of ttl alone would have ended */
    th_sleep_ms(2 * ttl);
    CHECK_RC(dlock_acquire(o, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_acquire(o, least + 10000));
    CHECK_OP(th_now_ms(), >=, d->t_ret + least - 5);
    CHECK_OK(dlock_release(o));
    dlock_close(o);
    dlock_client_close(b);
}

static void count_lost(dlock *l, uint64_t token, void *arg)
{
    (void)l;
    (void)token;
    __atomic_store_n((int *)arg, 1, __ATOMIC_SEQ_CST);
}

TEST(a_hold_ends_at_its_at_most_time)
{
    if (!S.lease_runs_out) {
        printf("     (no at_most_ms on this store)\n");
        return;
    }
    dlock_client *a = client(), *b = client();
    int64_t ttl = sched_ttl(), most = 3 * ttl;
    volatile int lost = 0;
    dlock *l = NULL, *o = handle(b, "sched-most");

    CHECK_OK(open_sched(a, "sched-most", ttl, 0, most, count_lost,
                        (void *)&lost, &l));
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_acquire(l, 5000));
    /* renewed meanwhile (its ttl is a third of the at-most time), then
     * not past the at-most time: reported lost by then (the watchdog's
     * wake-up on a busy machine: 5 s) */
    CHECK(th_wait_flag(&lost, most + 5000));
    int64_t t_lost = th_now_ms();
    CHECK_OP(t_lost, >=, t0 + most - ttl);
    CHECK_OP(t_lost, <, t0 + most + 5000);
    /* and the store let it go: another owner gets it */
    CHECK_OK(dlock_acquire(o, 10000));
    CHECK_OP(th_now_ms(), <, t0 + most + 10000);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    CHECK_CONTAINS(dlock_errmsg(), "at-most");
    CHECK_OK(dlock_release(o));
    TH_CLOSE(l, o);
    TH_CLIENT_CLOSE(a, b);
}

static const th_test tests[] = {
    T(a_set_is_taken_whole_and_released_whole),
    TK(a_set_that_cannot_be_had_leaves_nothing),
    T(bad_sets_are_refused_before_the_store),
    TK(sets_named_in_opposite_orders_do_not_deadlock),
    TK(a_cancel_of_any_handle_ends_the_set),
    TK(a_waiting_set_gets_its_locks_when_freed),
    TK(a_lost_lock_makes_the_set_lost),
    T(at_least_and_at_most_are_refused_where_no_lease_ends_them),
    TK(an_early_release_keeps_the_lock_until_its_at_least_end),
    TKP(a_dead_holder_leaves_the_lock_until_its_at_least_end),
    TK(a_hold_ends_at_its_at_most_time),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    return th_store_main(argc, argv, &S, tests, NULL);
}
