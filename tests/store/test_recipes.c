/* SPDX-License-Identifier: MIT */
/*
 * test_recipes.c -- what users hire a lock for, on every store: several
 * locks at once (dlock_acquire_all(), docs/design.md "Several locks at
 * once").
 *
 *   test_recipes STORE-KIND [filter]
 */
#include "test.h"

#include <pthread.h>
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

static const th_test tests[] = {
    T(a_set_is_taken_whole_and_released_whole),
    T(a_set_that_cannot_be_had_leaves_nothing),
    T(bad_sets_are_refused_before_the_store),
    TK(sets_named_in_opposite_orders_do_not_deadlock),
    TK(a_cancel_of_any_handle_ends_the_set),
    TK(a_waiting_set_gets_its_locks_when_freed),
    TK(a_lost_lock_makes_the_set_lost),
    {NULL, NULL, 0},
};

int main(int argc, char **argv)
{
    return th_store_main(argc, argv, &S, tests, NULL);
}
