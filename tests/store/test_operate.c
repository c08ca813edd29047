/* SPDX-License-Identifier: MIT */
/*
 * test_operate.c -- an operator's view of a store: dlock_list() and
 * dlock_break(), the same contract on every store (docs/design.md
 * "Operating: listing and breaking locks", docs/monitoring.md).
 *
 *   test_operate file|redis|redlock|zk|etcd|sqlite|pg|pg-advisory|mysql
 *                [filter]
 *
 * A store that cannot list or break must answer a clear DLOCK_ENOTSUP
 * naming the store (the first test checks it); the tests that need what
 * it lacks then say so and pass.
 */
#include "test.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static th_store S;
static int can_list, can_break, can_tell;

static dlock_client *client(void)
{
    return th_client(S.uri, th_patient());
}

static dlock *handle(dlock_client *c, const char *name, int64_t ttl,
                     dlock_lost_cb cb, void *arg)
{
    return th_handle_lost(c, name, ttl, 0, cb, arg);
}

/* Every lock under `prefix`, through every page of `limit`: the names
 * found (malloc'd array of malloc'd strings) and their infos' tokens. */
typedef struct found {
    char **names;
    uint64_t *tokens;
    int *held;
    int64_t *waiters;
    char **holders;
    size_t n, pages;
} found;

static void found_free(found *f)
{
    for (size_t i = 0; i < f->n; i++) {
        free(f->names[i]);
        free(f->holders[i]);
    }
    free(f->names);
    free(f->tokens);
    free(f->held);
    free(f->waiters);
    free(f->holders);
    memset(f, 0, sizeof(*f));
}

static found list_all(dlock_client *c, const char *prefix, size_t limit,
                      unsigned flags)
{
    found f;
    char *cursor = NULL;

    memset(&f, 0, sizeof(f));
    for (;;) {
        dlock_list_page p;
        CHECK_OK(dlock_list(c, prefix, cursor, limit, flags, &p));
        free(cursor);
        cursor = NULL;
        f.pages++;
        /* a page may hold a few more than asked (Redis' SCAN COUNT is a
         * hint), never unboundedly more */
        CHECK_OP(p.n, <=, 2 * limit + 10);
        for (size_t i = 0; i < p.n; i++) {
            int dup = 0;
            for (size_t j = 0; j < f.n; j++)
                dup |= !strcmp(f.names[j], p.locks[i].name);
            if (dup)
                continue; /* allowed across pages; counted once */
            f.names = realloc(f.names, (f.n + 1) * sizeof(char *));
            f.tokens = realloc(f.tokens, (f.n + 1) * sizeof(uint64_t));
            f.held = realloc(f.held, (f.n + 1) * sizeof(int));
            f.waiters = realloc(f.waiters, (f.n + 1) * sizeof(int64_t));
            f.holders = realloc(f.holders, (f.n + 1) * sizeof(char *));
            CHECK(f.names && f.tokens && f.held && f.waiters && f.holders);
            f.names[f.n] = strdup(p.locks[i].name);
            f.tokens[f.n] = p.locks[i].info.token;
            f.held[f.n] = p.locks[i].info.held;
            f.waiters[f.n] = p.locks[i].info.waiters;
            f.holders[f.n] = strdup(p.locks[i].info.holder);
            f.n++;
        }
        if (p.next)
            cursor = strdup(p.next);
        dlock_list_clear(&p);
        if (!cursor)
            break;
        /* bounded: a store whose cursor never ends is a defect */
        CHECK_OP(f.pages, <, 2000);
    }
    return f;
}

static long find(const found *f, const char *name)
{
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->names[i], name))
            return (long)i;
    return -1;
}

/* A listed or evicted token against the holder's: exact, except on
 * Redlock, where dlock_inspect() (and so each entry) reports the highest
 * counter among the holder's nodes, those that answered after its quorum
 * too (docs/redlock.md; test_contract.c's check_token says the same). */
static void check_token(uint64_t seen, uint64_t tok)
{
    if (strcmp(S.kind, "redlock") != 0) {
        CHECK_EQ(seen, tok);
    } else {
        CHECK_OP(seen >> 6, >=, tok >> 6);
        CHECK_OP(seen >> 6, <, (tok >> 6) + 1000000);
    }
}

#define NEED(what)                                                          \
    do {                                                                    \
        if (!can_##what) {                                                  \
            printf("     (no " #what " on this store: DLOCK_ENOTSUP, "      \
                   "checked by the first test)\n");                         \
            return;                                                         \
        }                                                                   \
    } while (0)

TEST(the_store_says_what_it_can)
{
    dlock_client *c = client();
    dlock_list_page p;
    dlock_info in;
    int rc;

    rc = dlock_list(c, "x", NULL, 10, 0, &p);
    if (can_list) {
        CHECK_OK(rc);
        dlock_list_clear(&p);
    } else {
        CHECK_EQ(rc, DLOCK_ENOTSUP);
        CHECK_EQ(p.n, 0);
        CHECK_CONTAINS(dlock_errmsg(), "list");
    }
    rc = dlock_break(c, "nobody-holds-this", &in);
    if (can_break) {
        CHECK_EQ(rc, DLOCK_ENOTHELD);
        CHECK_EQ(in.held, 0);
        CHECK_CONTAINS(dlock_errmsg(), "not held");
        dlock_info_clear(&in);
    } else {
        CHECK_EQ(rc, DLOCK_ENOTSUP);
        CHECK_EQ(in.held, 0);
        CHECK_CONTAINS(dlock_errmsg(), "cannot be broken");
    }
    /* bad input: clear codes, never a crash */
    CHECK_RC(dlock_list(c, NULL, NULL, 10001, 0, &p), DLOCK_EINVAL);
    CHECK_RC(dlock_list(c, NULL, NULL, 10, 0x80, &p), DLOCK_EINVAL);
    CHECK_RC(dlock_list(c, NULL, NULL, 10, 0, NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_break(c, "", NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_break(c, NULL, NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_break(NULL, "x", NULL), DLOCK_EINVAL);
    if (can_list) {
        /* a cursor the store did not make */
        static const char *junk[] = {"zz",
                                     "-1",
                                     "\x01\x02",
                                     "99999999999999999999999999999999",
                                     "%",
                                     "g0",
                                     "/../x"};
        for (size_t i = 0; i < sizeof(junk) / sizeof(junk[0]); i++) {
            rc = dlock_list(c, NULL, junk[i], 10, 0, &p);
            /* either refused, or read as some position of the store */
            CHECK(rc == DLOCK_EINVAL || rc == DLOCK_OK);
            dlock_list_clear(&p);
        }
    }
    dlock_client_close(c);
}

TEST(list_shows_held_locks_under_a_prefix)
{
    NEED(list);
    dlock_client *a = client(), *b = client();
    dlock *l1 = handle(a, "op/list/one", 0, NULL, NULL);
    dlock *l2 = handle(a, "op/list/two", 0, NULL, NULL);
    dlock *l3 = handle(a, "op/lisp", 0, NULL, NULL);

    CHECK_OK(dlock_acquire(l1, 0));
    CHECK_OK(dlock_acquire(l2, 0));
    CHECK_OK(dlock_acquire(l3, 0));

    found f = list_all(b, "op/list/", 100, 0);
    CHECK_EQ(f.n, 2);
    long i1 = find(&f, "op/list/one"), i2 = find(&f, "op/list/two");
    CHECK(i1 >= 0 && i2 >= 0);
    CHECK_EQ(f.held[i1], 1);
    check_token(f.tokens[i1], dlock_token(l1));
    check_token(f.tokens[i2], dlock_token(l2));
    if (S.held_visible)
        CHECK_CONTAINS(f.holders[i1], "pid");
    found_free(&f);

    /* the whole store, and the prefix of both */
    f = list_all(b, "op/lis", 100, 0);
    CHECK_EQ(f.n, 3);
    found_free(&f);
    f = list_all(b, NULL, 100, 0);
    CHECK_OP(f.n, >=, 3);
    found_free(&f);

    /* released: gone from the default listing */
    CHECK_OK(dlock_release(l2));
    f = list_all(b, "op/list/", 100, 0);
    CHECK_EQ(f.n, 1);
    CHECK(find(&f, "op/list/one") >= 0);
    found_free(&f);

    CHECK_OK(dlock_release(l1));
    CHECK_OK(dlock_release(l3));
    TH_CLOSE(l1, l2, l3);
    TH_CLIENT_CLOSE(a, b);
}

TEST(list_pages_through_every_lock)
{
    NEED(list);
    enum { N = 40 };
    dlock_client *a = client(), *b = client();
    dlock *ls[N];
    char name[64];

    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "op/page/%03d", i);
        ls[i] = handle(a, name, 0, NULL, NULL);
        CHECK_OK(dlock_acquire(ls[i], 0));
    }
    found f = list_all(b, "op/page/", 7, 0);
    CHECK_EQ(f.n, N);
    CHECK_OP(f.pages, >=, 2); /* it did page */
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "op/page/%03d", i);
        long k = find(&f, name);
        CHECK(k >= 0);
        check_token(f.tokens[k], dlock_token(ls[i]));
    }
    found_free(&f);
    th_release_close(ls, N);
    TH_CLIENT_CLOSE(a, b);
}

/* Threads listing through one client at once (an exporter serving
 * several scrapers) each see every lock: a listing's state is its own.
 * The file store once shared its directory's offset between listings,
 * and each skipped what another had read. */
typedef struct lister {
    dlock_client *c;
    size_t seen_min;
} lister;

static void *list_thread(void *arg)
{
    lister *t = arg;

    /* local files list in microseconds: it takes many rounds to overlap
     * (200 did, every run, before the fix); a server's round trips
     * overlap at once */
    int rounds = !strcmp(S.kind, "file") ? 200 : 20;

    t->seen_min = (size_t)-1;
    for (int round = 0; round < rounds; round++) {
        found f = list_all(t->c, "op/conc/", 100, 0);
        if (f.n < t->seen_min)
            t->seen_min = f.n;
        found_free(&f);
    }
    return NULL;
}

TEST(threads_listing_through_one_client_each_see_every_lock)
{
    NEED(list);
    enum { N = 30, NT = 6 };
    dlock_client *a = client(), *b = client();
    dlock *ls[N];
    char name[64];
    pthread_t th[NT];
    lister ts[NT];

    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "op/conc/%03d", i);
        ls[i] = handle(a, name, 0, NULL, NULL);
        CHECK_OK(dlock_acquire(ls[i], 0));
    }
    for (int i = 0; i < NT; i++) {
        ts[i].c = b;
        CHECK_EQ(pthread_create(&th[i], NULL, list_thread, &ts[i]), 0);
    }
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(ts[i].seen_min, N);
    }
    th_release_close(ls, N);
    TH_CLIENT_CLOSE(a, b);
}

TEST(list_matches_names_as_bytes)
{
    NEED(list);
    /* the characters of Redis' glob, SQL's LIKE, paths and escapes */
    static const char *names[] = {
        "op/odd/a*b", "op/odd/a?c", "op/odd/a[x]", "op/odd/a%d",
        "op/odd/a_e", "op/odd/a\\f", "op/odd/sp ace", "op/odd/nl\nx",
        "op/odd/\xc3\xa9t\xc3\xa9", "op/odd/\xff\xfe", "op/odd/a{t}",
        "op/odd/a/b/c", "op/odd/.."};
    enum { N = sizeof(names) / sizeof(names[0]) };
    dlock_client *a = client(), *b = client();
    dlock *ls[N];

    for (size_t i = 0; i < N; i++) {
        ls[i] = handle(a, names[i], 0, NULL, NULL);
        CHECK_OK(dlock_acquire(ls[i], 0));
    }
    found f = list_all(b, "op/odd/", 100, 0);
    CHECK_EQ(f.n, N);
    for (size_t i = 0; i < N; i++)
        CHECK(find(&f, names[i]) >= 0);
    found_free(&f);
    /* a prefix with pattern characters matches only itself */
    f = list_all(b, "op/odd/a*", 100, 0);
    CHECK_EQ(f.n, 1);
    CHECK(find(&f, "op/odd/a*b") >= 0);
    found_free(&f);
    f = list_all(b, "op/odd/a%", 100, 0);
    CHECK_EQ(f.n, 1);
    found_free(&f);
    f = list_all(b, "op/odd/a_", 100, 0);
    CHECK_EQ(f.n, 1);
    found_free(&f);
    f = list_all(b, "op/odd/a[", 100, 0);
    CHECK_EQ(f.n, 1);
    found_free(&f);
    th_release_close(ls, N);
    TH_CLIENT_CLOSE(a, b);
}

TEST(list_shows_long_names_whole)
{
    NEED(list);
    /* the longest names: a store that keeps a shortened form (the file
     * store's file names) must still list the name itself */
    char name[DLOCK_NAME_MAX + 1];
    dlock_client *a = client(), *b = client();
    dlock *l;

    memcpy(name, "op/long/", 8);
    for (size_t i = 8; i < DLOCK_NAME_MAX; i++)
        name[i] = (char)('a' + (i * 7) % 26);
    name[DLOCK_NAME_MAX] = '\0';
    l = handle(a, name, 0, NULL, NULL);
    CHECK_OK(dlock_acquire(l, 0));
    found f = list_all(b, "op/long/", 100, 0);
    CHECK_EQ(f.n, 1);
    CHECK_STR(f.names[0], name);
    check_token(f.tokens[0], dlock_token(l));
    found_free(&f);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    TH_CLIENT_CLOSE(a, b);
}

/* A holds `name` (a's handle la) and B's waiter (lb, a 20 s wait) is
 * started behind it; op is a third client, to look or to break. */
typedef struct queue {
    dlock_client *a, *b, *op;
    dlock *la, *lb;
    th_waiter w;
    pthread_t t;
} queue;

static void queue_start(queue *q, const char *name, int64_t ttl)
{
    q->a = client();
    q->b = client();
    q->op = client();
    q->la = handle(q->a, name, ttl, NULL, NULL);
    q->lb = handle(q->b, name, ttl, NULL, NULL);
    q->w = (th_waiter){.l = q->lb, .wait_ms = 20000};
    CHECK_OK(dlock_acquire(q->la, 0));
    th_waiter_start(&q->w, &q->t);
}

/* Once the waiter's thread is joined. */
static void queue_close(queue *q)
{
    TH_CLOSE(q->la, q->lb);
    TH_CLIENT_CLOSE(q->a, q->b, q->op);
}

TEST(list_shows_waiters)
{
    NEED(list);
    queue q;

    queue_start(&q, "op/wait", 0);
    if (th_wait_queued(q.op, "op/wait", 1, 10000)) {
        found f = list_all(q.op, "op/wait", 100, 0);
        CHECK_EQ(f.n, 1);
        CHECK_OP(f.waiters[0], >=, 1);
        found_free(&f);
    }
    CHECK_OK(dlock_release(q.la));
    pthread_join(q.t, NULL);
    CHECK_OK(q.w.rc);
    queue_close(&q);
}

TEST(break_evicts_a_renewing_holder)
{
    NEED(break);
    /* The holder renews (its watchdog is alive): only a break frees it.
     * ttl 3 s: renewals every second; the evicted holder must learn it
     * at its next renewal, so within ttl/3 plus a round trip; 10 s is
     * that with room for a busy machine, and well short of what the
     * lease alone would have taken had it not been renewed: forever. */
    th_lost box = TH_LOST_INIT;
    dlock_client *a = client(), *b = client(), *op = client();
    dlock *la = handle(a, "op/break", 3000, th_lost_cb, &box);
    dlock *lb = handle(b, "op/break", 3000, NULL, NULL);
    dlock_info ev;
    uint64_t t1;

    CHECK_OK(dlock_acquire(la, 0));
    t1 = dlock_token(la);
    th_sleep_ms(1500); /* a renewal has happened */
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);

    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_break(op, "op/break", &ev));
    CHECK_EQ(ev.held, 1);
    check_token(ev.token, t1);
    if (S.held_visible)
        CHECK_CONTAINS(ev.holder, "pid");
    dlock_info_clear(&ev);

    /* free now: another owner takes it at once, with a greater token */
    CHECK_OK(dlock_acquire(lb, 5000));
    CHECK_OP(dlock_token(lb), >, t1);

    /* the evicted holder learns it: callback, then ELOST */
    int64_t until = t0 + 10000;
    while (th_lost_calls(&box) == 0 && th_now_ms() < until)
        th_sleep_ms(10);
    CHECK_EQ(th_lost_calls(&box), 1);
    CHECK_EQ(box.token, t1);
    CHECK_EQ(dlock_held(la), DLOCK_ELOST);
    CHECK_RC(dlock_release(la), DLOCK_ELOST);

    /* and the new holder was never disturbed */
    CHECK_EQ(dlock_held(lb), 1);
    CHECK_OK(dlock_release(lb));
    /* breaking it again: nothing held */
    CHECK_RC(dlock_break(op, "op/break", NULL), DLOCK_ENOTHELD);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b, op);
}

TEST(break_wakes_a_waiter_at_once)
{
    NEED(break);
    /* ttl 30 s: without the break's wake-up the waiter would wait until
     * the evicted holder's next renewal failed (10 s) or longer; 5 s is
     * the bound of a wake-up on a busy machine, still short of that */
    queue q;

    queue_start(&q, "op/break-wake", 30000);
    uint64_t t1 = dlock_token(q.la);
    (void)th_wait_queued(q.op, "op/break-wake", 1, 10000);
    th_sleep_ms(100); /* the waiter is asleep */
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_break(q.op, "op/break-wake", NULL));
    pthread_join(q.t, NULL);
    CHECK_OK(q.w.rc);
    CHECK_OP(q.w.token, >, t1);
    CHECK_OP(th_now_ms() - t0, <, 5000);
    CHECK_RC(dlock_release(q.la), DLOCK_ELOST);
    queue_close(&q);
}

typedef struct race_arg {
    dlock_client *op;
    const char *name;
    int rc;
} race_arg;

static void *breaker(void *p)
{
    race_arg *r = p;
    r->rc = dlock_break(r->op, r->name, NULL);
    return NULL;
}

TEST(break_racing_a_release_removes_the_hold_once)
{
    NEED(break);
    dlock_client *a = client(), *op = client(), *c = client();
    dlock *la = handle(a, "op/race", 0, NULL, NULL);
    dlock *lc = handle(c, "op/race", 0, NULL, NULL);
    int rel_ok = 0, brk_ok = 0;

    for (int i = 0; i < 30; i++) {
        race_arg r = {op, "op/race", 0};
        pthread_t t;
        CHECK_OK(dlock_acquire(la, 5000));
        CHECK_EQ(pthread_create(&t, NULL, breaker, &r), 0);
        if (i % 3)
            th_sleep_ms(i % 5);
        int rc = dlock_release(la);
        pthread_join(t, NULL);
        /* exactly one of the two removed the hold */
        CHECK((rc == DLOCK_OK && r.rc == DLOCK_ENOTHELD) ||
              (rc == DLOCK_ELOST && r.rc == DLOCK_OK));
        rel_ok += rc == DLOCK_OK;
        brk_ok += r.rc == DLOCK_OK;
        /* and the lock is free afterwards: at once, or as soon as the
         * store has finished the break (MySQL: KILL CONNECTION ends the
         * holder's session, and so its user-level locks, a moment after
         * it returns; seen under make test-busy) */
        CHECK_OK(dlock_acquire(lc, 5000));
        CHECK_OK(dlock_release(lc));
    }
    printf("     release first %d, break first %d\n", rel_ok, brk_ok);
    TH_CLOSE(la, lc);
    TH_CLIENT_CLOSE(a, op, c);
}

TEST(break_takes_every_read_hold)
{
    NEED(break);
    dlock_client *a = client(), *b = client(), *w = client(), *op = client();
    dlock *ra = handle(a, "op/break-rw", 3000, NULL, NULL);
    dlock *rb = handle(b, "op/break-rw", 3000, NULL, NULL);
    dlock *lw = handle(w, "op/break-rw", 3000, NULL, NULL);
    dlock_info ev;

    if (dlock_acquire_shared(ra, 0) == DLOCK_ENOTSUP) {
        printf("     (no shared holds on this store)\n");
        goto out;
    }
    CHECK_OK(dlock_acquire_shared(rb, 0));
    CHECK_RC(dlock_acquire(lw, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_break(op, "op/break-rw", &ev));
    CHECK_EQ(ev.holders, 2);
    CHECK_EQ(ev.shared, 1);
    dlock_info_clear(&ev);
    CHECK_OK(dlock_acquire(lw, 5000));
    CHECK_OK(dlock_release(lw));
    CHECK_RC(dlock_release(ra), DLOCK_ELOST);
    CHECK_RC(dlock_release(rb), DLOCK_ELOST);
out:
    TH_CLOSE(ra, rb, lw);
    TH_CLIENT_CLOSE(a, b, w, op);
}

/* --- a broken holder is told at once (zk: its node's watch; etcd: its
 * key's stream), on the stores that push it (can_tell) --- */

/* The bound within which an evicted holder hears of the deletion of its
 * node or key: the server sends the event as it applies the delete, and
 * the holder's client hands it to its background thread (on etcd after
 * asking whether the key's lease still lives, or opening a stream first
 * when none was up), which tells the core. A few round trips and thread
 * hops: 5 s on a busy 2-core machine, far below the 30 s leases and
 * sessions of these tests (a hold that is renewed, or a ZooKeeper hold
 * that has nothing to renew, would otherwise learn it late or never). */
#define TOLD_MS 5000

#define NEED_TELL()                                                         \
    do {                                                                    \
        if (!can_tell) {                                                    \
            printf("     (checked where a broken holder is told at once: " \
                   "zk, etcd)\n");                                         \
            return;                                                         \
        }                                                                   \
    } while (0)

static dlock *handle_n(dlock_client *c, const char *name, unsigned permits,
                       th_lost *n)
{
    return th_open(c, name,
                   &(dlock_options){.ttl_ms = 30000,
                                    .permits = permits,
                                    .on_lost = n ? th_lost_cb : NULL,
                                    .on_lost_arg = n});
}

typedef struct brk_waiter {
    dlock *l;
    int shared;
    dlock_client *obs; /* the hand-off race: looks at the store */
    th_lost *n;
    volatile int rc;
    volatile int done;
    volatile uint64_t token;
    volatile int release;    /* set by the test: release now */
    volatile int release_rc;
    volatile int agreed;     /* its view and the store's agreed */
} brk_waiter;

/* Waits for the lock (20 s), then until told to release (60 s at most);
 * holds live on the thread that took them. */
static void *brk_wait(void *arg)
{
    brk_waiter *w = arg;

    w->rc = w->shared ? dlock_acquire_shared(w->l, 20000)
                      : dlock_acquire(w->l, 20000);
    w->token = dlock_token(w->l);
    if (w->rc == DLOCK_OK && w->obs) {
        /* the waiter's view and the store's agree within TOLD_MS: it
         * holds what the store says it holds, or it was told it lost */
        int64_t until = th_now_ms() + TOLD_MS;
        while (!w->agreed && th_now_ms() < until) {
            dlock_info in;
            memset(&in, 0, sizeof(in));
            int rc = dlock_inspect(w->obs, "op/brk-handoff", &in);
            int held = dlock_held(w->l);
            w->agreed = rc == DLOCK_OK &&
                        ((held == 1 && in.held && in.token == w->token) ||
                         (held == DLOCK_ELOST && th_lost_calls(w->n) == 1));
            dlock_info_clear(&in);
            if (!w->agreed)
                th_sleep_ms(5);
        }
        w->release = 1;
    }
    __atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
    if (w->rc != DLOCK_OK)
        return NULL;
    (void)th_wait_flag(&w->release, 60000);
    w->release_rc = dlock_release(w->l);
    return NULL;
}

TEST(a_break_takes_every_reader_and_every_permit_and_tells_them)
{
    NEED(break);
    NEED_TELL();
    enum { NR = 3 };
    th_lost n = TH_LOST_INIT;
    dlock_client *c[NR], *wc = client(), *op = client();
    dlock *r[NR];
    dlock_info ev;
    brk_waiter w;
    pthread_t th;
    uint64_t top = 0;

    /* three readers in three clients, a writer waiting behind them */
    for (int i = 0; i < NR; i++) {
        c[i] = client();
        r[i] = handle_n(c[i], "op/brk-rw", 0, &n);
        CHECK_OK(dlock_acquire_shared(r[i], 0));
        if (dlock_token(r[i]) > top)
            top = dlock_token(r[i]);
    }
    dlock *lw = handle_n(wc, "op/brk-rw", 0, NULL);
    memset(&w, 0, sizeof(w));
    w.l = lw;
    CHECK_EQ(pthread_create(&th, NULL, brk_wait, &w), 0);
    th_wait_waiters(op, "op/brk-rw", 1);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_break(op, "op/brk-rw", &ev));
    CHECK_EQ(ev.held, 1);
    CHECK_EQ(ev.shared, 1);
    CHECK_EQ(ev.holders, NR);
    CHECK_EQ(ev.token, top);
    CHECK_EQ(ev.waiters, 1);
    dlock_info_clear(&ev);
    /* the writer was told the holds ahead of it went: at once, as a
     * release (bounded as the holders' loss, TOLD_MS) */
    CHECK(th_wait_flag(&w.done, TOLD_MS));
    CHECK_OK(w.rc);
    CHECK_OP(th_now_ms() - t0, <, TOLD_MS);
    CHECK_OP(w.token, >, top);
    CHECK_EQ(th_lost_wait(&n, NR, TOLD_MS), NR);
    for (int i = 0; i < NR; i++) {
        CHECK_EQ(dlock_held(r[i]), DLOCK_ELOST);
        CHECK_RC(dlock_release(r[i]), DLOCK_ELOST);
    }
    w.release = 1;
    pthread_join(th, NULL);
    CHECK_OK(w.release_rc);

    /* a semaphore of 2: both permits taken, the waiter gets one */
    th_lost_reset(&n);
    dlock *p[2], *pw = handle_n(wc, "op/brk-sem", 2, &n);
    top = 0;
    for (int i = 0; i < 2; i++) {
        p[i] = handle_n(c[i], "op/brk-sem", 2, &n);
        CHECK_OK(dlock_acquire(p[i], 0));
        if (dlock_token(p[i]) > top)
            top = dlock_token(p[i]);
    }
    memset(&w, 0, sizeof(w));
    w.l = pw;
    CHECK_EQ(pthread_create(&th, NULL, brk_wait, &w), 0);
    th_wait_waiters(op, "op/brk-sem", 1);
    t0 = th_now_ms();
    CHECK_OK(dlock_break(op, "op/brk-sem", &ev));
    CHECK_EQ(ev.permits, 2);
    CHECK_EQ(ev.holders, 2);
    CHECK_EQ(ev.token, top);
    dlock_info_clear(&ev);
    CHECK(th_wait_flag(&w.done, TOLD_MS));
    CHECK_OK(w.rc);
    CHECK_OP(w.token, >, top);
    CHECK_EQ(th_lost_wait(&n, 2, TOLD_MS), 2);
    CHECK_OP(th_now_ms() - t0, <, TOLD_MS);
    /* a permit is free again for anyone; the evicted ones say so */
    dlock *p3 = handle_n(op, "op/brk-sem", 2, NULL);
    CHECK_OK(dlock_acquire(p3, 0));
    for (int i = 0; i < 2; i++)
        CHECK_RC(dlock_release(p[i]), DLOCK_ELOST);
    CHECK_OK(dlock_release(p3));
    w.release = 1;
    pthread_join(th, NULL);
    CHECK_OK(w.release_rc);
    TH_CLOSE(p[0], p[1], p3, pw);
    for (int i = 0; i < NR; i++) {
        dlock_close(r[i]);
        dlock_client_close(c[i]);
    }
    dlock_close(lw);
    TH_CLIENT_CLOSE(wc, op);
}

typedef struct race_brk {
    dlock_client *op;
    volatile int rc;
} race_brk;

static void *race_breaker(void *arg)
{
    race_brk *r = arg;
    r->rc = dlock_break(r->op, "op/brk-handoff", NULL);
    return NULL;
}

TEST(a_break_racing_a_hand_off_leaves_no_false_holder)
{
    NEED(break);
    NEED_TELL();
    /* The holder releases while a break runs, a waiter queued behind it:
     * the break removes the holder's node or key, or the waiter's just
     * after it became the holder, or finds nobody. Whatever the order,
     * the waiter ends up holding the lock in the store or told that it
     * lost it: never a hold its client believes in that the store does
     * not have. */
    dlock_client *a = client(), *b = client(), *op = client(),
                 *obs = client();
    dlock *la = handle_n(a, "op/brk-handoff", 0, NULL);
    th_lost n = TH_LOST_INIT;
    int outcome[3] = {0, 0, 0};

    for (int i = 0; i < 20; i++) {
        brk_waiter w;
        race_brk r = {op, 0};
        pthread_t tw, tb;
        memset(&w, 0, sizeof(w));
        th_lost_reset(&n);
        w.l = handle_n(b, "op/brk-handoff", 0, &n);
        w.obs = obs;
        w.n = &n;
        CHECK_OK(dlock_acquire(la, 0));
        CHECK_EQ(pthread_create(&tw, NULL, brk_wait, &w), 0);
        th_wait_waiters(obs, "op/brk-handoff", 1);
        CHECK_EQ(pthread_create(&tb, NULL, race_breaker, &r), 0);
        if (i % 2)
            th_sleep_ms(i % 3);
        int rel = dlock_release(la);
        pthread_join(tb, NULL);
        pthread_join(tw, NULL);
        CHECK(rel == DLOCK_OK || rel == DLOCK_ELOST);
        CHECK(r.rc == DLOCK_OK || r.rc == DLOCK_ENOTHELD);
        CHECK_OK(w.rc); /* the lock was free for it in the end */
        CHECK(w.agreed);
        CHECK(w.release_rc == DLOCK_OK || w.release_rc == DLOCK_ELOST);
        /* (the break may also come after the waiter looked: then its
         * release says so) a release that worked was never told lost */
        if (w.release_rc == DLOCK_OK)
            CHECK_EQ(th_lost_calls(&n), 0);
        outcome[rel == DLOCK_ELOST ? 0 : w.release_rc == DLOCK_OK ? 1 : 2]++;
        dlock_close(w.l);
    }
    printf("     holder broken %d, waiter holds %d, waiter broken %d\n",
           outcome[0], outcome[1], outcome[2]);
    dlock_close(la);
    TH_CLIENT_CLOSE(a, b, op, obs);
}

TEST(a_frozen_holder_that_was_broken_learns_it_when_thawed)
{
    NEED(break);
    NEED_TELL();
    /* frozen 1 s, within its 30 s session or lease (kept alive every
     * 10 s): the server keeps it, and the deletion's event waits in the
     * holder's socket */
    th_holder *f = th_shared(sizeof(*f));
    dlock_client *op = client();
    dlock *l = handle_n(op, "op/brk-frozen", 0, NULL);

    f->settle_ms = 300; /* its watch or stream is up */
    f->lost_ms = 10000;
    pid_t pid = th_holder_start(f, S.uri, "op/brk-frozen", 30000);
    kill(pid, SIGSTOP);
    CHECK_OK(dlock_break(op, "op/brk-frozen", NULL));
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OP(dlock_token(l), >, f->token);
    th_sleep_ms(1000);
    kill(pid, SIGCONT);
    __atomic_store_n(&f->go, 1, __ATOMIC_SEQ_CST);
    CHECK_EQ(th_wait(pid), 0);
    /* told after it thawed, within TOLD_MS */
    CHECK_EQ(f->lost_calls, 1);
    CHECK_EQ(f->lost_token, f->token);
    CHECK_OP(f->lost_after_cont, <, TOLD_MS);
    CHECK_EQ(f->held_before_release, DLOCK_ELOST);
    CHECK_RC(f->release_rc, DLOCK_ELOST);
    CHECK_EQ(dlock_held(l), 1); /* its release left ours alone */
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(op);
}

static const th_test tests[] = {
    T(the_store_says_what_it_can),
    T(list_shows_held_locks_under_a_prefix),
    T(list_pages_through_every_lock),
    T(threads_listing_through_one_client_each_see_every_lock),
    T(list_matches_names_as_bytes),
    T(list_shows_long_names_whole),
    TK(list_shows_waiters),
    TK(break_evicts_a_renewing_holder),
    TK(break_wakes_a_waiter_at_once),
    TK(break_racing_a_release_removes_the_hold_once),
    TK(break_takes_every_read_hold),
    TK(a_break_takes_every_reader_and_every_permit_and_tells_them),
    TK(a_break_racing_a_hand_off_leaves_no_false_holder),
    TKP(a_frozen_holder_that_was_broken_learns_it_when_thawed),
    {NULL, NULL, 0, 0},
};

/* What the store started can do. */
static void started(void)
{
    /* what each store can do (docs/monitoring.md): the first test checks
     * that the others answer DLOCK_ENOTSUP, clearly. Each store's flag is
     * turned on by the change that gives the store the slot.
     * tell: a broken holder is told at once, by its node's watch (zk) or
     * its key's stream (etcd), not at its next renewal. */
    static const struct {
        const char *kind;
        int list, brk, tell;
    } what[] = {
        {"file", 1, 0, 0},

        {"redis", 1, 1, 0},

        {"redlock", 1, 1, 0},

        {"zk", 1, 1, 1},

        {"etcd", 1, 1, 1},

        {"sqlite", 1, 1, 0},

        {"pg", 1, 1, 0},

        /* advisory mode cannot list: the server has keys, not names */
        {"pg-advisory", 0, 1, 0},

        {"mysql", 1, 1, 0},

        {"mem", 1, 1, 0},
    };
    for (size_t i = 0; i < sizeof(what) / sizeof(what[0]); i++) {
        if (!strcmp(S.kind, what[i].kind)) {
            can_list = what[i].list;
            can_break = what[i].brk;
            can_tell = what[i].tell;
        }
    }
}

int main(int argc, char **argv)
{
    return th_store_main(argc, argv, &S, tests, started);
}
