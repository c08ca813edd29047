/* SPDX-License-Identifier: MIT */
/*
 * test_contract.c -- the behaviour every store must give.
 *
 *   test_contract file|redis|zk|etcd|sqlite|pg|pg-advisory|pg-pgbouncer|
 *                 pg-advisory-pgbouncer|mysql [filter]
 *
 * "redis" starts a private redis-server; "zk" a private standalone
 * ZooKeeper server (uri zk://127.0.0.1:PORT/dlocktest); "etcd" a private
 * etcd member (uri etcd://127.0.0.1:PORT?prefix=dlocktest); "sqlite" a
 * database file in a temporary directory; "pg" and "pg-advisory" a
 * private PostgreSQL server (the lock table; ?mode=advisory);
 * "pg-pgbouncer" and "pg-advisory-pgbouncer" the same through a private
 * PgBouncer in session mode (?pooler=session), "mysql" a
 * private MariaDB server; "file" uses a temporary
 * directory. Tests that need a lock to end without its holder's
 * help (expiry, a frozen holder) run only on stores that have that; the
 * flags below say what each store does, test by test.
 *
 * `test_contract --list-fds LIMIT` is the test's own child: the program
 * no_descriptor_reaches_a_started_program starts, which lists the
 * descriptors it inherited.
 *
 * Past 1,000 lines on purpose: a list of independent scenarios (one
 * function each, run by name through the harness, any one alone with a
 * filter); the tests are split by store, not by size.
 */
#include "test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef TH_SQLITE
#include <sqlite3.h>
#endif

static th_store S;
static const char *uri;
static const char *kind; /* "file", "redis", "zk", "etcd", "sqlite", ... */

/* What the store does: th_store (test.h) says what each flag means. */
static int has_leases, lease_runs_out, ttl_visible, fixed_ttl,
    keeps_last_token, held_visible, has_fair = 1;
static int64_t short_ttl;

/* dlock_inspect()'s token `seen` against a holder's token. Exact, except
 * on Redlock: there it is the highest fencing counter among the holder's
 * nodes (times 64, plus that node's index), and nodes that answered after
 * the quorum count too (docs/redlock.md). */
static void check_token(uint64_t seen, uint64_t tok)
{
    if (strcmp(kind, "redlock") != 0) {
        CHECK_EQ(seen, tok);
    } else {
        CHECK_OP(seen >> 6, >=, tok >> 6);
        CHECK_OP(seen >> 6, <, (tok >> 6) + 1000000);
    }
}

/* A client for the contract's tests, which are about exclusion, order and
 * hand-over, not about how long one round trip may take: th_patient()'s
 * 10 s per round trip, not the default 2 s, so that a store slowed by a
 * busy machine (etcd syncing to disk under stress-ng) does not turn a
 * release into DLOCK_ECONN. Timed waits are bounded by their own
 * timeouts, which the tests pass. */
static dlock_client *client(void)
{
    return th_client(uri, th_patient());
}

/* ------------------------------------------------------------------------ */

TEST(basic_acquire_release)
{
    dlock_client *c = client();
    dlock *l = th_handle(c, "basic", 0, 0, 0);

    CHECK_EQ(dlock_token(l), 0);
    CHECK_EQ(dlock_held(l), 0);
    CHECK_STR(dlock_name(l), "basic");
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OP(dlock_token(l), >, 0);
    CHECK_EQ(dlock_held(l), 1);
    CHECK_OK(dlock_release(l));
    CHECK_EQ(dlock_token(l), 0);
    CHECK_EQ(dlock_held(l), 0);
    CHECK_RC(dlock_release(l), DLOCK_ENOTHELD);
    dlock_close(l);
    dlock_client_close(c);
}

TEST(try_busy_and_timed_wait)
{
    dlock_client *a = client(), *b = client();
    dlock *la = th_handle(a, "busy", 0, 0, 0),
          *lb = th_handle(b, "busy", 0, 0, 0);

    CHECK_OK(dlock_acquire(la, 0));
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    CHECK_CONTAINS(dlock_errmsg(), "held by another owner");
    int64_t t0 = th_now_ms();
    CHECK_RC(dlock_acquire(lb, 300), DLOCK_EBUSY);
    int64_t took = th_now_ms() - t0;
    /* lower bound: a wait never ends before its deadline (the library
     * measures it on the same monotonic clock from a later start; 10 ms
     * for the whole-ms rounding); upper bound: the wait plus one store
     * call cut at the deadline (MIN_OP_MS) plus slack for a busy machine
     * (a loose bound: it shows the call does not hang, not its speed) */
    CHECK_OP(took, >=, 290);  /* it did wait */
    CHECK_OP(took, <, 5000);  /* and never hangs past its wait */
    CHECK_EQ(dlock_held(lb), 0);
    CHECK_EQ(dlock_token(lb), 0);
    CHECK_OK(dlock_release(la));
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OK(dlock_release(lb));
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

TEST(reentrant_hold_count)
{
    dlock_client *a = client(), *b = client();
    dlock *la = th_handle(a, "reent", 0, 0, 0),
          *lb = th_handle(b, "reent", 0, 0, 0);

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t tok = dlock_token(la);
    CHECK_OK(dlock_acquire(la, 0));
    CHECK_OK(dlock_acquire(la, 1000));
    CHECK_EQ(dlock_held(la), 3);
    CHECK_EQ(dlock_token(la), tok);
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_release(la));
    CHECK_OK(dlock_release(la));
    CHECK_EQ(dlock_held(la), 1);
    CHECK_EQ(dlock_token(la), tok);
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_release(la));
    CHECK_RC(dlock_release(la), DLOCK_ENOTHELD);
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OP(dlock_token(lb), >, tok);
    CHECK_OK(dlock_release(lb));
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

TEST(not_reentrant_fails_at_once)
{
    dlock_client *c = client();
    dlock *l = th_handle(c, "nonreent", 0, DLOCK_NOT_REENTRANT, 0);

    CHECK_OK(dlock_acquire(l, 0));
    int64_t t0 = th_now_ms();
    CHECK_RC(dlock_acquire(l, 5000), DLOCK_EBUSY);
    /* refused by the library before any store call, not at the 5 s
     * deadline: 2 s is scheduling slack only */
    CHECK_OP(th_now_ms() - t0, <, 2000);
    CHECK_CONTAINS(dlock_errmsg(), "NOT_REENTRANT");
    CHECK_EQ(dlock_held(l), 1);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

TEST(reentrant_across_handles)
{
    dlock_client *a = client(), *b = client();
    dlock *l1 = th_handle(a, "twohandles", 0, 0, 0);
    dlock *l2 = th_handle(a, "twohandles", 0, 0, 0);
    dlock *lb = th_handle(b, "twohandles", 0, 0, 0);

    CHECK_OK(dlock_acquire(l1, 0));
    CHECK_OK(dlock_acquire(l2, 0));
    CHECK_EQ(dlock_held(l2), 2);
    CHECK_EQ(dlock_token(l2), dlock_token(l1));
    CHECK_OK(dlock_release(l2));
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_release(l1));
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OK(dlock_release(lb));
    TH_CLOSE(l1, l2, lb);
    TH_CLIENT_CLOSE(a, b);
}

typedef struct thread_arg {
    dlock *l;
    int step;
    int rc;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} thread_arg;

static void step_to(thread_arg *t, int step)
{
    pthread_mutex_lock(&t->mu);
    t->step = step;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static void wait_step(thread_arg *t, int step)
{
    pthread_mutex_lock(&t->mu);
    while (t->step < step)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
}

static void *holder_thread(void *arg)
{
    thread_arg *t = arg;

    t->rc = dlock_acquire(t->l, 0);
    step_to(t, 1);
    wait_step(t, 2);
    t->rc = dlock_release(t->l);
    step_to(t, 3);
    return NULL;
}

TEST(threads_are_different_owners)
{
    dlock_client *c = client();
    thread_arg t;
    pthread_t th;

    memset(&t, 0, sizeof(t));
    pthread_mutex_init(&t.mu, NULL);
    pthread_cond_init(&t.cv, NULL);
    t.l = th_handle(c, "threads", 0, 0, 0);
    pthread_create(&th, NULL, holder_thread, &t);
    wait_step(&t, 1);
    CHECK_OK(t.rc);
    /* same client, same handle, another thread: another owner */
    CHECK_RC(dlock_acquire(t.l, 0), DLOCK_EBUSY);
    CHECK_RC(dlock_release(t.l), DLOCK_ENOTHELD);
    CHECK_EQ(dlock_token(t.l), 0);
    step_to(&t, 2);
    wait_step(&t, 3);
    CHECK_OK(t.rc);
    pthread_join(th, NULL);
    CHECK_OK(dlock_acquire(t.l, 0));
    CHECK_OK(dlock_release(t.l));
    dlock_close(t.l);
    dlock_client_close(c);
}

TEST(tokens_strictly_increase)
{
    dlock_client *a = client(), *b = client();
    dlock *la = th_handle(a, "tokens", 0, 0, 0),
          *lb = th_handle(b, "tokens", 0, 0, 0);
    uint64_t last = 0;

    for (int i = 0; i < 20; i++) {
        dlock *l = i % 2 ? la : lb;
        CHECK_OK(dlock_acquire(l, 1000));
        CHECK_OP(dlock_token(l), >, last);
        last = dlock_token(l);
        CHECK_OK(dlock_release(l));
    }
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

/* --- mutual exclusion across processes, checked by the processes --- */

#define NPROC 4
#define ITER 40

typedef struct shared_mx {
    int inside;
    int overlaps;
    int token_regressions;
    int failures;
    uint64_t last_token;
    char file[600];
} shared_mx;

static int mx_child(void *arg)
{
    shared_mx *s = arg;
    dlock_client *c;
    dlock *l;

    if (dlock_client_open(&c, uri, th_patient()) != DLOCK_OK)
        return 2;
    if (dlock_open(&l, c, "mutex", NULL) != DLOCK_OK)
        return 3;
    for (int i = 0; i < ITER; i++) {
        if (dlock_acquire(l, 30000) != DLOCK_OK) {
            __atomic_add_fetch(&s->failures, 1, __ATOMIC_SEQ_CST);
            continue;
        }
        if (__atomic_fetch_add(&s->inside, 1, __ATOMIC_SEQ_CST) != 0)
            __atomic_add_fetch(&s->overlaps, 1, __ATOMIC_SEQ_CST);
        uint64_t tok = dlock_token(l);
        if (tok <= s->last_token)
            __atomic_add_fetch(&s->token_regressions, 1, __ATOMIC_SEQ_CST);
        s->last_token = tok;
        /* an unprotected read-modify-write of a file: lost updates if two
         * processes are ever inside at once */
        char buf[32] = {0};
        int fd = open(s->file, O_RDWR | O_CREAT, 0600);
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        long v = n > 0 ? atol(buf) : 0;
        usleep(300);
        int len = snprintf(buf, sizeof(buf), "%ld\n", v + 1);
        if (pwrite(fd, buf, (size_t)len, 0) != len)
            __atomic_add_fetch(&s->failures, 1, __ATOMIC_SEQ_CST);
        close(fd);
        __atomic_sub_fetch(&s->inside, 1, __ATOMIC_SEQ_CST);
        if (dlock_release(l) != DLOCK_OK)
            __atomic_add_fetch(&s->failures, 1, __ATOMIC_SEQ_CST);
    }
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

TEST(mutual_exclusion_across_processes)
{
    shared_mx *s = th_shared(sizeof(*s));
    pid_t pids[NPROC];
    char buf[32] = {0};

    snprintf(s->file, sizeof(s->file), "%s/counter-%s", th_tmpdir(), kind);
    for (int i = 0; i < NPROC; i++)
        pids[i] = th_fork(mx_child, s);
    for (int i = 0; i < NPROC; i++)
        CHECK_EQ(th_wait(pids[i]), 0);
    CHECK_EQ(s->failures, 0);
    CHECK_EQ(s->overlaps, 0);
    CHECK_EQ(s->token_regressions, 0);
    int fd = open(s->file, O_RDONLY);
    CHECK(fd >= 0);
    CHECK(read(fd, buf, sizeof(buf) - 1) > 0);
    close(fd);
    CHECK_EQ(atol(buf), NPROC * ITER);
}

static void *counter_thread(void *arg)
{
    void **a = arg;
    dlock *l = a[0];
    long *counter = a[1];

    for (int i = 0; i < 50; i++) {
        int rc = dlock_acquire(l, 30000);
        if (rc != DLOCK_OK) {
            fprintf(stderr, "acquire %d: %s (%s)\n", i, dlock_errname(rc),
                    dlock_errmsg());
            return (void *)1;
        }
        long v = *counter;
        usleep(50);
        *counter = v + 1;
        rc = dlock_release(l);
        if (rc != DLOCK_OK) {
            fprintf(stderr, "release %d: %s (%s)\n", i, dlock_errname(rc),
                    dlock_errmsg());
            return (void *)1;
        }
    }
    return NULL;
}

TEST(threads_sharing_one_client)
{
    dlock_client *c = client();
    dlock *l = th_handle(c, "threadmx", 0, 0, 0);
    long counter = 0;
    void *a[2] = {l, &counter};
    pthread_t th[6];

    for (int i = 0; i < 6; i++)
        pthread_create(&th[i], NULL, counter_thread, a);
    for (int i = 0; i < 6; i++) {
        void *r;
        pthread_join(th[i], &r);
        CHECK(r == NULL);
    }
    CHECK_EQ(counter, 6 * 50);
    dlock_close(l);
    dlock_client_close(c);
}

/* --- waiting is woken by the release, not by the lease --- */

TEST(release_wakes_the_waiter)
{
    /* The lease is 60 s: a waiter that only re-tried at lease end would
     * time out (10 s wait). Succeeding proves the release woke it. */
    dlock_client *a = client(), *b = client();
    dlock *la = th_handle(a, "wake", 60000, 0, 0);
    th_waiter t = {.l = th_handle(b, "wake", 60000, 0, 0), .wait_ms = 10000};
    pthread_t th;

    CHECK_OK(dlock_acquire(la, 0));
    th_waiter_start(&t, &th);
    CHECK(th_wait_flag(&t.started, 10000));
    th_sleep_ms(300);
    CHECK_OK(dlock_release(la));
    pthread_join(th, NULL);
    CHECK_OK(t.rc);
    /* lower bound: the waiter started before our 300 ms sleep and could
     * not have the lock before the release (50 ms for rounding); upper
     * bound: the contract is "woken by the release", which t.rc == OK
     * already shows (a 60 s lease, a 10 s wait); 9 s only catches a
     * waiter that slept to its deadline */
    CHECK_OP(t.took, >=, 250);
    CHECK_OP(t.took, <, 9000);
    dlock_close(la);
    dlock_close(t.l);
    TH_CLIENT_CLOSE(a, b);
}

TEST(wait_forever)
{
    dlock_client *a = client(), *b = client();
    dlock *la = th_handle(a, "forever", 0, 0, 0);
    th_waiter t = {.l = th_handle(b, "forever", 0, 0, 0), .wait_ms = 10000};
    pthread_t th;

    CHECK_OK(dlock_acquire(la, 0));
    th_waiter_start(&t, &th);
    CHECK(th_wait_flag(&t.started, 10000));
    th_sleep_ms(200);
    CHECK_OK(dlock_release(la));
    pthread_join(th, NULL);
    CHECK_OK(t.rc);
    dlock_close(la);
    dlock_close(t.l);
    TH_CLIENT_CLOSE(a, b);
}

/* --- fair mode: first come, first served --- */

#define NFAIR 5

typedef struct shared_fair {
    int order[NFAIR];
    int pos;
    int index;
} shared_fair;

static int fair_child(void *arg)
{
    shared_fair *s = arg;
    int me = s->index;
    dlock_client *c;
    dlock *l;
    dlock_options o;

    memset(&o, 0, sizeof(o));
    o.flags = DLOCK_FAIR;
    if (dlock_client_open(&c, uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "fifo", &o) != DLOCK_OK)
        return 2;
    if (dlock_acquire(l, 30000) != DLOCK_OK) {
        fprintf(stderr, "fair child %d: %s\n", me, dlock_errmsg());
        return 3;
    }
    s->order[__atomic_fetch_add(&s->pos, 1, __ATOMIC_SEQ_CST)] = me;
    th_sleep_ms(20);
    if (dlock_release(l) != DLOCK_OK)
        return 4;
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

TEST(fair_mode_is_fifo)
{
    shared_fair *s = th_shared(sizeof(*s));
    dlock_client *h = client();
    dlock *lh = th_handle(h, "fifo", 0, DLOCK_FAIR, 0);
    pid_t pids[NFAIR];

    if (!has_fair) {
        CHECK_RC(dlock_acquire(lh, 0), DLOCK_ENOTSUP);
        CHECK_RC(dlock_acquire(lh, 100), DLOCK_ENOTSUP);
        CHECK_EQ(dlock_held(lh), 0);
        dlock_close(lh);
        dlock_client_close(h);
        return;
    }

    CHECK_OK(dlock_acquire(lh, 0));
    for (int i = 0; i < NFAIR; i++) {
        s->index = i;
        pids[i] = th_fork(fair_child, s);
        /* wait until it is queued, so the arrival order is known */
        int64_t until = th_now_ms() + 10000;
        while (th_waiters(h, "fifo") < i + 1 && th_now_ms() < until)
            th_sleep_ms(10);
        CHECK_EQ(th_waiters(h, "fifo"), i + 1);
    }
    CHECK_OK(dlock_release(lh));
    for (int i = 0; i < NFAIR; i++)
        CHECK_EQ(th_wait(pids[i]), 0);
    CHECK_EQ(s->pos, NFAIR);
    for (int i = 0; i < NFAIR; i++)
        CHECK_EQ(s->order[i], i);
    dlock_close(lh);
    dlock_client_close(h);
}

/* --- crashed and frozen holders --- */

TEST(killed_holder_is_replaced)
{
    th_holder *s = th_shared(sizeof(*s));
    dlock_client *c = client();
    dlock *l = th_handle(c, "frozen", 0, 0, 0);

    s->patient = 1;
    pid_t pid = th_holder_start(s, uri, "frozen", 800);
    CHECK_RC(dlock_acquire(l, 0), DLOCK_EBUSY);
    kill(pid, SIGKILL);
    CHECK_EQ(th_wait(pid), 128 + SIGKILL);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_acquire(l, 10000));
    /* the contract: the waiter is let in when the lock is freed, not at
     * its 10 s deadline. Without leases the kernel frees it at the death
     * (upper bound: one wake-up, 1 s of scheduling slack); with leases
     * (or sessions) at the lease end: the 800 ms ttl, plus the store's
     * expiry granularity (ZooKeeper's tick, etcd's lease checks) and
     * slack for a busy machine, 3 s */
    if (!has_leases) /* the kernel frees it when the holder dies */
        CHECK_OP(th_now_ms() - t0, <, 1000);
    else /* its lease (session) ends within its ttl, plus slack */
        CHECK_OP(th_now_ms() - t0, <, s->ttl + 3000);
    CHECK_OP(dlock_token(l), >, s->token);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

TEST(frozen_holder_learns_it_lost)
{
    if (!has_leases)
        return; /* no lease: a frozen holder keeps the lock, by design */
    th_holder *s = th_shared(sizeof(*s));
    dlock_client *c = client();
    dlock *l = th_handle(c, "frozen", 0, 0, 0);

    s->patient = 1;
    pid_t pid = th_holder_start(s, uri, "frozen", 400);
    kill(pid, SIGSTOP);
    CHECK_OK(dlock_acquire(l, 5000)); /* after the frozen one's lease */
    uint64_t mine = dlock_token(l);
    CHECK_OP(mine, >, s->token);
    kill(pid, SIGCONT);
    __atomic_store_n(&s->go, 1, __ATOMIC_SEQ_CST);
    CHECK_EQ(th_wait(pid), 0);
    CHECK_RC(s->release_rc, DLOCK_ELOST);
    /* the frozen holder did not delete our lock */
    CHECK_EQ(dlock_held(l), 1);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

/* --- leases --- */

static volatile int lost_seen;
static volatile uint64_t lost_token;

static void on_lost(dlock *l, uint64_t token, void *arg)
{
    (void)l;
    (void)arg;
    lost_token = token;
    __atomic_store_n(&lost_seen, 1, __ATOMIC_SEQ_CST);
}

TEST(watchdog_keeps_a_short_lease)
{
    if (!has_leases)
        return; /* no lease on this store */
    if (!strcmp(kind, "sqlite") && getenv("DLOCK_TEST_VALGRIND")) {
        /* the watchdog's renewals and this thread's tries meet in the
         * SQLite store's writers' turn, a wait in F_OFD_SETLKW behind
         * another thread of this process: it stalls valgrind 3.19, as
         * the TK() tests do (harness/test.h) */
        printf("     (skipped under valgrind on sqlite)\n");
        return;
    }
    dlock_client *a = client(), *b = client();
    dlock_options o;
    dlock *la, *lb = th_handle(b, "watchdog", 0, 0, 0);

    memset(&o, 0, sizeof(o));
    o.ttl_ms = short_ttl;
    o.on_lost = on_lost;
    lost_seen = 0;
    CHECK_OK(dlock_open(&la, a, "watchdog", &o));
    CHECK_OK(dlock_acquire(la, 0));
    uint64_t tok = dlock_token(la);
    for (int i = 0; i < 10; i++) { /* 2 s: five or more ttls */
        th_sleep_ms(200);
        CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    }
    CHECK_EQ(lost_seen, 0);
    CHECK_EQ(dlock_token(la), tok);
    CHECK_OK(dlock_release(la));
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OK(dlock_release(lb));
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

TEST(no_renew_lease_runs_out)
{
    if (!lease_runs_out)
        return; /* no lease, or one that lives as long as its holder */
    dlock_client *a = client(), *b = client();
    dlock_options o;
    dlock *la, *lb = th_handle(b, "norenew", 0, 0, 0);

    memset(&o, 0, sizeof(o));
    o.ttl_ms = 300;
    o.flags = DLOCK_NO_RENEW;
    o.on_lost = on_lost;
    lost_seen = 0;
    CHECK_OK(dlock_open(&la, a, "norenew", &o));
    CHECK_OK(dlock_acquire(la, 0));
    uint64_t tok = dlock_token(la);
    CHECK_OK(dlock_acquire(lb, 3000));
    CHECK_OP(dlock_token(lb), >, tok);
    for (int i = 0; i < 200 && !lost_seen; i++)
        th_sleep_ms(10);
    CHECK_EQ(lost_seen, 1);
    CHECK_EQ(lost_token, tok);
    CHECK_EQ(dlock_held(la), DLOCK_ELOST);
    CHECK_EQ(dlock_token(la), 0);
    CHECK_RC(dlock_release(la), DLOCK_ELOST);
    CHECK_EQ(dlock_held(la), 0);
    CHECK_EQ(dlock_held(lb), 1); /* la's release did not free lb's hold */
    CHECK_OK(dlock_release(lb));
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

TEST(extend)
{
    dlock_client *c = client();
    dlock *l = th_handle(c, "extend", 1000, DLOCK_NO_RENEW, 0);
    dlock_info info;

    CHECK_RC(dlock_extend(l, 5000), DLOCK_ENOTHELD);
    CHECK_OK(dlock_acquire(l, 0));
    uint64_t tok = dlock_token(l);
    if (fixed_ttl) {
        CHECK_RC(dlock_extend(l, 5000), DLOCK_ENOTSUP);
        CHECK_CONTAINS(dlock_errmsg(), "1000");
        CHECK_EQ(dlock_held(l), 1); /* refused, and still held */
        CHECK_EQ(dlock_token(l), tok);
        CHECK_OK(dlock_extend(l, 1000));
    } else {
        CHECK_OK(dlock_extend(l, 5000));
    }
    CHECK_EQ(dlock_token(l), tok);
    CHECK_OK(dlock_inspect(c, "extend", &info));
    CHECK_EQ(info.held, 1);
    check_token(info.token, tok);
    /* extended to 5 s just now: more than 2 s left unless 3 s passed
     * between the extend and the inspect (or the store rounds the ttl
     * down to whole seconds: etcd) */
    if (ttl_visible)
        CHECK_OP(info.ttl_ms, >, 2000);
    dlock_info_clear(&info);
    CHECK_OK(dlock_release(l));
    CHECK_RC(dlock_extend(l, 5000), DLOCK_ENOTHELD);
    dlock_close(l);
    dlock_client_close(c);
}

/* Deletes the lock behind the holder's back. */
static void delete_lock(const char *name)
{
    char path[1200];

    if (!strcmp(kind, "zk")) {
#ifdef TH_ZK_CLIENT
        /* the holder's node: the one child of /dlocktest/<name> (a plain
         * name is its own escape) */
        void *zh = th_zk_connect(S.zsrv.hosts, NULL);
        snprintf(path, sizeof(path), "/dlocktest/%s", name);
        CHECK_EQ(th_zk_delete_children(zh, path), 1);
        th_zk_close(zh);
#endif
    } else if (!strcmp(kind, "mem")) {
        /* an operator's break: no other way into the process's memory */
        dlock_client *op = th_client(uri, NULL);
        dlock_info in;
        CHECK_OK(dlock_break(op, name, &in));
        dlock_info_clear(&in);
        dlock_client_close(op);
    } else if (!strcmp(kind, "etcd")) {
        /* the holder's key: the one key under dlocktest/<name>/ */
        char out[4096];
        CHECK_EQ(th_etcdctl(&S.esrv, out, sizeof(out),
                            "del --prefix dlocktest/%s/", name), 0);
        CHECK_EQ(atoi(out), 1);
    } else if (!strcmp(kind, "sqlite")) {
#ifdef TH_SQLITE
        /* another owner took the row over behind the holder's back and
         * let it go (the row stays: it carries the token counter) */
        sqlite3 *db;
        char sql[600];
        snprintf(path, sizeof(path), "%s/locks.db", th_tmpdir());
        CHECK_EQ(sqlite3_open(path, &db), SQLITE_OK);
        sqlite3_busy_timeout(db, 5000);
        snprintf(sql, sizeof(sql),
                 "UPDATE dlock_locks SET owner = 'intruder', lock_until = 0, token = token + "
                 "1 WHERE name = CAST('%s' AS BLOB)",
                 name);
        CHECK_EQ(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
        CHECK_EQ(sqlite3_changes(db), 1);
        sqlite3_close(db);
#endif
    } else if (!strcmp(kind, "pg")) {
        /* an intruder takes the row over and lets it go */
        CHECK_EQ(th_sql_query(&S.ssrv, NULL, 0,
                              "UPDATE dlock_locks SET owner = 'intruder', "
                              "lock_until = clock_timestamp(), token = "
                              "token + 1 WHERE name = '%s'::bytea",
                              name),
                 1);
    } else if (!strcmp(kind, "pg-advisory")) {
        /* the holder's session is ended by an administrator */
        CHECK_EQ(th_sql_query(&S.ssrv, NULL, 0,
                              "SELECT count(pg_terminate_backend(pid)) FROM "
                              "pg_locks WHERE locktype = 'advisory' AND "
                              "granted AND objsubid = 1 AND ((classid::"
                              "bigint << 32) | objid::bigint) = ('x' || "
                              "substr(md5('%s'::bytea), 1, 16))::bit(64)::"
                              "bigint",
                              name),
                 1);
    } else if (!strcmp(kind, "mysql")) {
        CHECK_EQ(th_sql_query(&S.ssrv, NULL, 0,
                              "UPDATE dlock_locks SET owner = 'intruder', "
                              "lock_until = NOW(6), token = token + 1 WHERE "
                              "name = '%s'",
                              name),
                 1);
    } else if (!strcmp(kind, "redis")) {
        /* on the node that holds the key (a cluster's primary of its slot) */
        snprintf(path, sizeof(path), "dlock:{%s}", name);
        CHECK_EQ(th_redis_cmd(th_store_redis_for(&S, path), NULL, 0,
                              "DEL %s", path),
                 1);
    } else if (!strcmp(kind, "redlock")) {
        /* gone from every node (it was on at least a quorum) */
        int n = 0;
        for (int i = 0; i < 5; i++)
            n += (int)th_redis_cmd(&S.rl[i], NULL, 0, "DEL dlock:{%s}", name);
        CHECK_OP(n, >=, 3);
    } else {
        snprintf(path, sizeof(path), "%s/locks/%s.lock", th_tmpdir(), name);
        CHECK_EQ(unlink(path), 0);
    }
}

TEST(loss_is_reported)
{
    dlock_client *c = client();
    dlock_options o;
    dlock *l;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = 600;
    o.on_lost = on_lost;
    lost_seen = 0;
    CHECK_OK(dlock_open(&l, c, "deleted", &o));
    CHECK_OK(dlock_acquire(l, 0));
    uint64_t tok = dlock_token(l);
    delete_lock("deleted");
    if (!strcmp(kind, "redis") || !strcmp(kind, "sqlite") ||
        !strcmp(kind, "pg") || !strcmp(kind, "mysql") ||
        !strcmp(kind, "redlock") ||
        !strcmp(kind, "pg-advisory")) {
        /* the watchdog's next renewal finds it gone (advisory: the client
         * thread sees the session end) */
        for (int i = 0; i < 300 && !lost_seen; i++)
            th_sleep_ms(10);
        CHECK_EQ(lost_seen, 1);
        CHECK_EQ(lost_token, tok);
    } else {
        /* no renewal to find it gone: extend (same ttl) checks */
        CHECK_RC(dlock_extend(l, fixed_ttl ? 600 : 1000), DLOCK_ELOST);
    }
    CHECK_EQ(dlock_held(l), DLOCK_ELOST);
    CHECK_RC(dlock_acquire(l, 0), DLOCK_ELOST); /* release first */
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    CHECK_EQ(dlock_held(l), 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OP(dlock_token(l), >, tok);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

/* --- inspection --- */

TEST(inspect_reports_the_holder)
{
    dlock_client *a = client(), *b = client();
    dlock *l = th_handle(a, "inspect", 5000, 0, 0);
    dlock_info info;
    char pid[32];

    CHECK_OK(dlock_inspect(b, "inspect-never-used", &info));
    CHECK_EQ(info.held, 0);
    CHECK_EQ(info.token, 0);
    dlock_info_clear(&info);

    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_inspect(b, "inspect", &info));
    CHECK_EQ(info.held, 1);
    snprintf(pid, sizeof(pid), "pid %d", (int)getpid());
    CHECK_CONTAINS(info.holder, pid);
    check_token(info.token, dlock_token(l));
    /* acquired just before the inspect: held for less than 5 s (the
     * lease) and the ttl left at most the 5 s given, whatever the
     * machine's load */
    if (held_visible) {
        CHECK_OP(info.held_ms, >=, 0);
        CHECK_OP(info.held_ms, <, 5000);
    } else {
        CHECK_EQ(info.held_ms, -1);
    }
    if (ttl_visible) {
        CHECK_OP(info.ttl_ms, >, 0);
        CHECK_OP(info.ttl_ms, <=, 5000);
    } else {
        CHECK_EQ(info.ttl_ms, -1);
    }
    CHECK_EQ(info.waiters, 0);
    uint64_t tok = info.token;
    dlock_info_clear(&info);
    CHECK_OK(dlock_release(l));
    CHECK_OK(dlock_inspect(b, "inspect", &info));
    CHECK_EQ(info.held, 0);
    if (keeps_last_token)
        check_token(info.token, tok);
    else
        CHECK_EQ(info.token, 0);
    CHECK_EQ(info.ttl_ms, -1);
    CHECK_EQ(info.waiters, 0);
    dlock_info_clear(&info);
    dlock_close(l);
    TH_CLIENT_CLOSE(a, b);
}

/* --- names and bad input --- */

TEST(names_with_any_bytes)
{
    static const char *const names[] = {
        "with space", "{braces}", "}", "{", "a}:f", "new\nline",
        "quote\"'`", "semi;colon", "../../etc/passwd", ".", "..", "%2F",
        "a/b", "\xc3\xbc" "nic\xc3\xb6" "de", "tab\there", "*", "?", "[x]", NULL};
    dlock_client *a = client(), *b = client();
    char longname[DLOCK_NAME_MAX + 1];

    for (int i = 0; names[i]; i++) {
        dlock *l = th_handle(a, names[i], 0, 0, 0),
              *o = th_handle(b, names[i], 0, 0, 0);
        CHECK_OK(dlock_acquire(l, 0));
        CHECK_RC(dlock_acquire(o, 0), DLOCK_EBUSY);
        dlock_info info;
        CHECK_OK(dlock_inspect(b, names[i], &info));
        CHECK_EQ(info.held, 1);
        dlock_info_clear(&info);
        /* every other name is still free: no two names share a lock */
        for (int k = 0; names[k]; k++) {
            if (k == i)
                continue;
            dlock *x = th_handle(b, names[k], 0, 0, 0);
            CHECK_OK(dlock_acquire(x, 0));
            CHECK_OK(dlock_release(x));
            dlock_close(x);
        }
        CHECK_OK(dlock_release(l));
        TH_CLOSE(l, o);
    }
    memset(longname, 'n', DLOCK_NAME_MAX);
    longname[DLOCK_NAME_MAX] = '\0';
    dlock *l = th_handle(a, longname, 0, 0, 0);
    longname[DLOCK_NAME_MAX - 1] = 'm';
    dlock *m = th_handle(b, longname, 0, 0, 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_acquire(m, 0)); /* differs in the last byte only */
    CHECK_OK(dlock_release(l));
    CHECK_OK(dlock_release(m));
    TH_CLOSE(l, m);
    TH_CLIENT_CLOSE(a, b);
}

TEST(bad_input_is_rejected)
{
    dlock_client *c = client();
    dlock_options o;
    dlock *l = NULL;
    char toolong[DLOCK_NAME_MAX + 2];

    memset(&o, 0, sizeof(o));
    CHECK_RC(dlock_open(&l, c, NULL, NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "NULL");
    CHECK(l == NULL);
    CHECK_RC(dlock_open(&l, c, "", NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "empty");
    memset(toolong, 'x', sizeof(toolong) - 1);
    toolong[sizeof(toolong) - 1] = '\0';
    CHECK_RC(dlock_open(&l, c, toolong, NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "longer than");
    o.ttl_ms = -1;
    CHECK_RC(dlock_open(&l, c, "bad", &o), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "ttl");
    o.ttl_ms = 0;
    o.flags = 0x100;
    CHECK_RC(dlock_open(&l, c, "bad", &o), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "flags");
    CHECK_RC(dlock_inspect(c, "", &(dlock_info){0}), DLOCK_EINVAL);

    l = th_handle(c, "bad", 0, 0, 0);
    CHECK_RC(dlock_acquire(l, -2), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "wait_ms");
    CHECK_RC(dlock_acquire(l, INT64_MIN), DLOCK_EINVAL);
    CHECK_RC(dlock_release(l), DLOCK_ENOTHELD);
    CHECK_RC(dlock_extend(l, 1000), DLOCK_ENOTHELD);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_RC(dlock_extend(l, 0), DLOCK_EINVAL);
    CHECK_RC(dlock_extend(l, -5), DLOCK_EINVAL);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

/* --- lifetimes --- */

TEST(close_releases_holds)
{
    dlock_client *a = client(), *b = client();
    dlock *la = th_handle(a, "closing", 0, 0, 0),
          *lb = th_handle(b, "closing", 0, 0, 0);

    CHECK_OK(dlock_acquire(la, 0));
    dlock_close(la);
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OK(dlock_release(lb));

    la = th_handle(a, "closing", 0, 0, 0);
    CHECK_OK(dlock_acquire(la, 0));
    dlock_client_close(a); /* releases the hold; la stays valid */
    CHECK_RC(dlock_acquire(la, 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "closed");
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OK(dlock_release(lb));
    dlock_close(la); /* frees the client too */
    dlock_close(lb);
    dlock_client_close(b);
}

static int forked_use(void *arg)
{
    dlock *l = arg;

    return dlock_acquire(l, 0) == DLOCK_EINVAL ? 0 : 1;
}

TEST(a_forked_child_cannot_use_the_parents_client)
{
    dlock_client *c = client();
    dlock *l = th_handle(c, "forked", 0, 0, 0);

    CHECK_EQ(th_wait(th_fork(forked_use, l)), 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

/* A child closing what it inherited (a garbage collector, an atexit
 * handler) must leave the parent's holds and connections alone. */
typedef struct inherited {
    dlock_client *c;
    dlock *l;
} inherited;

static int forked_close(void *arg)
{
    inherited *in = arg;

    dlock_close(in->l);
    dlock_client_close(in->c);
    return 0;
}

TEST(a_forked_child_closing_the_parents_client_leaves_it_alone)
{
    dlock_client *c = client(), *other = client();
    dlock *l = th_handle(c, "forked-close", 0, 0, 0);
    dlock *lo = th_handle(other, "forked-close", 0, 0, 0);

    CHECK_OK(dlock_acquire(l, 0));
    uint64_t tok = dlock_token(l);
    inherited in = {c, l};
    CHECK_EQ(th_wait(th_fork(forked_close, &in)), 0);
    /* still held in the store, through a connection that still works */
    CHECK_RC(dlock_acquire(lo, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_extend(l, 30000));
    CHECK_EQ(dlock_token(l), tok);
    CHECK_OK(dlock_release(l));
    CHECK_OK(dlock_acquire(lo, 0));
    CHECK_OK(dlock_release(lo));
    TH_CLOSE(lo, l);
    TH_CLIENT_CLOSE(other, c);
}

/* --- DLOCK_OWNER_HANDLE: the handle is the owner --- */

typedef struct on_thread {
    dlock *l;
    int64_t wait;
    int rc;
    uint64_t token;
} on_thread;

static void *acquire_thread(void *arg)
{
    on_thread *t = arg;

    t->rc = dlock_acquire(t->l, t->wait);
    t->token = dlock_token(t->l);
    return NULL;
}

static void *release_thread(void *arg)
{
    on_thread *t = arg;

    t->rc = dlock_extend(t->l, 30000);
    if (t->rc == DLOCK_OK)
        t->rc = dlock_release(t->l);
    return NULL;
}

TEST(owner_handle_is_released_by_any_thread)
{
    dlock_client *c = client(), *o = client();
    dlock *l = th_handle(c, "by-handle", 0, DLOCK_OWNER_HANDLE, 0);
    dlock *lo = th_handle(o, "by-handle", 0, 0, 0);
    on_thread t = {l, 0, -99, 0};
    pthread_t th;
    dlock_info in;

    CHECK_EQ(pthread_create(&th, NULL, acquire_thread, &t), 0);
    pthread_join(th, NULL);
    CHECK_OK(t.rc);
    CHECK(t.token > 0);
    /* the acquiring thread is gone; the hold is the handle's */
    CHECK_EQ(dlock_held(l), 1);
    CHECK_EQ(dlock_token(l), t.token);
    CHECK_RC(dlock_acquire(lo, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_inspect(o, "by-handle", &in));
    CHECK_CONTAINS(in.holder, " handle ");
    dlock_info_clear(&in);
    CHECK_OK(dlock_acquire(l, 0)); /* reentrant, from another thread */
    CHECK_EQ(dlock_held(l), 2);
    CHECK_EQ(dlock_token(l), t.token);
    CHECK_OK(dlock_release(l));
    /* the last level released (and extended first) by a third thread */
    on_thread r = {l, 0, -99, 0};
    CHECK_EQ(pthread_create(&th, NULL, release_thread, &r), 0);
    pthread_join(th, NULL);
    CHECK_OK(r.rc);
    CHECK_EQ(dlock_held(l), 0);
    CHECK_RC(dlock_release(l), DLOCK_ENOTHELD);
    CHECK_OK(dlock_acquire(lo, 0));
    CHECK_OK(dlock_release(lo));
    TH_CLOSE(lo, l);
    TH_CLIENT_CLOSE(o, c);
}

TEST(owner_handles_are_owners_apart_from_threads)
{
    dlock_client *c = client();
    dlock *l1 = th_handle(c, "by-handle-2", 0, DLOCK_OWNER_HANDLE, 0);
    dlock *l2 = th_handle(c, "by-handle-2", 0, DLOCK_OWNER_HANDLE, 0);
    dlock *lt = th_handle(c, "by-handle-2", 0, 0, 0);

    CHECK_OK(dlock_acquire(l1, 0));
    CHECK_RC(dlock_acquire(l2, 0), DLOCK_EBUSY); /* another handle */
    CHECK_RC(dlock_acquire(lt, 0), DLOCK_EBUSY); /* this thread's own */
    CHECK_EQ(dlock_held(lt), 0);
    CHECK_RC(dlock_release(lt), DLOCK_ENOTHELD);
    CHECK_OK(dlock_release(l1));
    CHECK_OK(dlock_acquire(lt, 0));
    CHECK_RC(dlock_acquire(l1, 0), DLOCK_EBUSY);
    CHECK_EQ(dlock_held(l1), 0);
    CHECK_OK(dlock_release(lt));
    TH_CLOSE(l1, l2, lt);
    dlock_client_close(c);
}

TEST(owner_handle_takes_one_acquire_at_a_time)
{
    dlock_client *c = client(), *o = client();
    dlock *l = th_handle(c, "by-handle-3", 0, DLOCK_OWNER_HANDLE, 0);
    dlock *lo = th_handle(o, "by-handle-3", 0, 0, 0);
    on_thread t = {l, 60000, -99, 0};
    pthread_t th;

    CHECK_OK(dlock_acquire(lo, 0));
    CHECK_EQ(pthread_create(&th, NULL, acquire_thread, &t), 0);
    /* until the thread is queued in the store (bounded) */
    int64_t until = th_now_ms() + 20000;
    while (th_waiters(o, "by-handle-3") < 1 && th_now_ms() < until)
        th_sleep_ms(10);
    CHECK_RC(dlock_acquire(l, 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "another thread is acquiring");
    CHECK_OK(dlock_release(lo));
    pthread_join(th, NULL);
    CHECK_OK(t.rc);
    CHECK_EQ(dlock_held(l), 1);
    CHECK_OK(dlock_release(l));
    TH_CLOSE(lo, l);
    TH_CLIENT_CLOSE(o, c);
}

/* --- dlock_cancel(): a wait given up from another thread --- */

/* Until `name` has at least n waiters in the store (bounded); 0 when the
 * store cannot tell (after a pause long enough to be queued). */
static int wait_queued(dlock_client *c, const char *name, int64_t n)
{
    if (th_wait_queued(c, name, n, 20000))
        return 1;
    th_sleep_ms(300);
    return 0;
}

TEST(cancel_ends_a_wait_and_leaves_nothing)
{
    dlock_client *c = client(), *o = client(), *x = client();
    dlock *l = th_handle(c, "cancel", 0, 0, 0);
    dlock *lo = th_handle(o, "cancel", 0, 0, 0);
    dlock *lx = th_handle(x, "cancel", 0, 0, 0);
    th_waiter t = {.l = l, .wait_ms = -1};
    pthread_t th;

    CHECK_OK(dlock_acquire(lo, 0));
    th_waiter_start(&t, &th);
    int counted = wait_queued(o, "cancel", 1);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_cancel(l));
    pthread_join(th, NULL);
    CHECK_RC(t.rc, DLOCK_ECANCELED);
    CHECK_CONTAINS(t.msg, "cancelled");
    /* a wait forever, ended by the cancel: woken by it, not by a timeout
     * (the bound is for a busy machine; without the cancel it never
     * returns) */
    CHECK_OP(t.done_at - t0, <, 5000);
    if (counted) {
        /* its place in the store's queue is gone (bounded: some stores
         * remove it asynchronously) */
        int64_t until = th_now_ms() + 10000;
        while (th_waiters(o, "cancel") > 0 && th_now_ms() < until)
            th_sleep_ms(10);
        CHECK_EQ(th_waiters(o, "cancel"), 0);
    }
    /* the release hands the lock to nobody left over: a third owner's one
     * try gets it */
    CHECK_OK(dlock_release(lo));
    CHECK_OK(dlock_acquire(lx, 5000));
    CHECK_OK(dlock_release(lx));
    /* the next wait through the handle (reusing the cancelled wait's
     * eventfd, on a store that waits by itself) waits its whole time.
     * 2 s: PostgreSQL's advisory mode closed the cancelled wait's
     * session, and this wait first connects within its own deadline
     * (under valgrind a connection takes most of a second) */
    CHECK_OK(dlock_acquire(lo, 0));
    int64_t w0 = th_now_ms();
    CHECK_RC(dlock_acquire(l, 2000), DLOCK_EBUSY);
    CHECK_OP(th_now_ms() - w0, >=, 1999);
    CHECK_OK(dlock_release(lo));
    /* a cancel with no acquire in progress does nothing, and is not
     * remembered */
    CHECK_OK(dlock_cancel(l));
    CHECK_OK(dlock_acquire(l, 1000));
    CHECK_OK(dlock_release(l));
    CHECK_RC(dlock_cancel(NULL), DLOCK_EINVAL);
    TH_CLOSE(lx, lo, l);
    TH_CLIENT_CLOSE(x, o, c);
}

TEST(cancel_in_a_fair_queue_lets_the_next_one_go)
{
    if (!has_fair)
        return; /* no fair queue (fair_mode_is_fifo checks ENOTSUP) */
    dlock_client *a = client(), *b = client(), *o = client();
    dlock *la = th_handle(a, "cancel-fair", 0, DLOCK_FAIR, 0);
    dlock *lb = th_handle(b, "cancel-fair", 0, DLOCK_FAIR, 0);
    dlock *lo = th_handle(o, "cancel-fair", 0, DLOCK_FAIR, 0);
    th_waiter ta = {.l = la, .wait_ms = -1}, tb = {.l = lb, .wait_ms = 30000};
    pthread_t tha, thb;

    CHECK_OK(dlock_acquire(lo, 0));
    th_waiter_start(&ta, &tha);
    wait_queued(o, "cancel-fair", 1);
    th_waiter_start(&tb, &thb);
    wait_queued(o, "cancel-fair", 2);
    CHECK_OK(dlock_cancel(la)); /* the head of the queue gives up */
    pthread_join(tha, NULL);
    CHECK_RC(ta.rc, DLOCK_ECANCELED);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(lo));
    pthread_join(thb, NULL);
    /* the next in line gets it (the cancelled head waited forever: had
     * it stayed in the queue, b would have waited its whole 30 s) */
    CHECK_OK(tb.rc);
    CHECK_OK(tb.release_rc);
    CHECK_OP(tb.done_at - t0, <, 10000);
    TH_CLOSE(lo, lb, la);
    TH_CLIENT_CLOSE(o, b, a);
}

TEST(cancel_racing_a_release_leaves_no_hold)
{
    dlock_client *c = client(), *o = client(), *x = client();
    dlock *l = th_handle(c, "cancel-race", 0, 0, 0);
    dlock *lo = th_handle(o, "cancel-race", 0, 0, 0);
    dlock *lx = th_handle(x, "cancel-race", 0, 0, 0);
    int got = 0, cancelled = 0;

    for (int i = 0; i < 12; i++) {
        th_waiter t = {.l = l, .wait_ms = 30000};
        pthread_t th;
        CHECK_OK(dlock_acquire(lo, 0));
        th_waiter_start(&t, &th);
        wait_queued(o, "cancel-race", 1);
        /* the release and the cancel race, in both orders */
        if (i % 2) {
            CHECK_OK(dlock_release(lo));
            CHECK_OK(dlock_cancel(l));
        } else {
            CHECK_OK(dlock_cancel(l));
            CHECK_OK(dlock_release(lo));
        }
        pthread_join(th, NULL);
        if (t.rc == DLOCK_OK) {
            CHECK_OK(t.release_rc); /* it had the lock, and let it go */
            got++;
        } else {
            CHECK_RC(t.rc, DLOCK_ECANCELED);
            cancelled++;
        }
        /* either way nothing is left: a third owner's wait gets it */
        CHECK_OK(dlock_acquire(lx, 5000));
        CHECK_OK(dlock_release(lx));
    }
    /* either outcome is right (a store that hands the lock over may give
     * it to the waiter before its leaving reaches the store): the count
     * is for the reader */
    printf("     (%d got the lock first, %d cancelled)\n", got, cancelled);
    TH_CLOSE(lx, lo, l);
    TH_CLIENT_CLOSE(x, o, c);
}

/* --- dlock_shutdown(): the cancel that is remembered --- */

#define SHUT_WAITERS 4

/* Until `name` has one waiter in the store (wait_queued()), then n or
 * 1 s more (not fatal: the file store counts one client's waiting threads
 * as one); the count seen, -1 when the store cannot tell. */
static int64_t queued_up_to(dlock_client *c, const char *name, int64_t n)
{
    int64_t until, w;

    if (!wait_queued(c, name, 1))
        return -1;
    until = th_now_ms() + 1000;
    while ((w = th_waiters(c, name)) >= 0 && w < n && th_now_ms() < until)
        th_sleep_ms(5);
    return w;
}

/* Until `name` has no waiter left in the store (bounded: some stores
 * remove a given-up wait asynchronously). */
static void no_waiter_left(dlock_client *c, const char *name)
{
    int64_t until = th_now_ms() + 10000;

    while (th_waiters(c, name) > 0 && th_now_ms() < until)
        th_sleep_ms(10);
    CHECK_OP(th_waiters(c, name), <=, 0);
}

/* An acquire forever through the shut handle l, on a thread of its own,
 * while `holder` holds the name: it must be refused at once, with no
 * store trip (2 s: a mutex and a message on a busy machine under
 * valgrind), where it would otherwise wait forever (then the holder's
 * release ends the thread, and the test fails). Its rc; its message in
 * msg. */
static int late_acquire(dlock *l, int shared, dlock *holder, char *msg,
                        size_t cap)
{
    th_waiter t = {.l = l, .shared = shared, .wait_ms = -1};
    pthread_t th;

    th_waiter_start(&t, &th);
    if (!th_waiter_returned(&t, 2000)) {
        CHECK_OK(dlock_release(holder));
        pthread_join(th, NULL);
        th_fail(__FILE__, __LINE__,
                "an acquire forever through a shut handle waited (until "
                "the holder's release: %d)",
                t.rc);
    }
    pthread_join(th, NULL);
    snprintf(msg, cap, "%s", t.msg);
    return t.rc;
}

TEST(shutdown_ends_every_wait_and_refuses_later_acquires)
{
    dlock_client *c = client(), *o = client(), *x = client();
    dlock *l = th_handle(c, "shutdown", 0, 0, 0);
    dlock *lo = th_handle(o, "shutdown", 0, 0, 0);
    dlock *lx = th_handle(x, "shutdown", 0, 0, 0);
    th_waiter t[SHUT_WAITERS];
    pthread_t th[SHUT_WAITERS];
    dlock_info info;

    CHECK_OK(dlock_acquire(lo, 0));
    for (int i = 0; i < SHUT_WAITERS; i++) {
        th_waiter z = {.l = l, .wait_ms = -1};
        t[i] = z;
        th_waiter_start(&t[i], &th[i]);
    }
    int64_t seen = queued_up_to(o, "shutdown", SHUT_WAITERS);
    for (int i = 0; i < SHUT_WAITERS; i++)
        CHECK_EQ(t[i].rc, -99); /* all waiting, none refused */
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_shutdown(l));
    for (int i = 0; i < SHUT_WAITERS; i++) {
        pthread_join(th[i], NULL);
        CHECK_RC(t[i].rc, DLOCK_ECANCELED);
        CHECK_CONTAINS(t[i].msg, "dlock_shutdown()");
        /* waits forever, each ended by the shutdown: the bound is
         * cancel_ends_a_wait's (the leaving is one store round trip) */
        CHECK_OP(t[i].done_at - t0, <, 5000);
    }
    printf("     (%lld of %d waits seen queued)\n", (long long)seen,
           SHUT_WAITERS);
    no_waiter_left(o, "shutdown");

    /* every later acquire through l is refused at once, whatever its
     * wait and kind (shared too, even where the store has no read
     * holds: the handle is shut first), with no store trip */
    char msg[512];
    CHECK_RC(late_acquire(l, 0, lo, msg, sizeof(msg)), DLOCK_ECANCELED);
    CHECK_CONTAINS(msg, "lock 'shutdown': shut down (dlock_shutdown())");
    CHECK_RC(late_acquire(l, 1, lo, msg, sizeof(msg)), DLOCK_ECANCELED);
    CHECK_CONTAINS(msg, "shut down");
    CHECK_RC(dlock_acquire(l, 0), DLOCK_ECANCELED); /* not EBUSY */
    CHECK_EQ(dlock_held(l), 0);
    CHECK_OK(dlock_shutdown(l)); /* again: nothing more */
    no_waiter_left(o, "shutdown");
    CHECK_OK(dlock_release(lo));
    /* free now, and still refused through l (it never asks the store);
     * nothing of l's is in the store: a third owner's one try gets it */
    CHECK_RC(dlock_acquire(l, 0), DLOCK_ECANCELED);
    CHECK_RC(dlock_acquire(l, 30000), DLOCK_ECANCELED);
    CHECK_OK(dlock_inspect(x, "shutdown", &info));
    CHECK_EQ(info.held, 0);
    CHECK_OP(info.waiters, <=, 0);
    dlock_info_clear(&info);
    CHECK_OK(dlock_acquire(lx, 0));
    CHECK_OK(dlock_release(lx));
    CHECK_RC(dlock_shutdown(NULL), DLOCK_EINVAL);

    /* a semaphore's handle: its permit acquires are refused alike */
    dlock_options so;
    dlock *s = NULL, *sa = NULL, *sb = NULL;
    memset(&so, 0, sizeof(so));
    so.permits = 1;
    CHECK_OK(dlock_open(&s, c, "shutdown-sem1", &so));
    CHECK_OK(dlock_open(&sa, o, "shutdown-sem1", &so));
    CHECK_OK(dlock_open(&sb, x, "shutdown-sem1", &so));
    int rc = dlock_acquire(sa, 0);
    if (rc != DLOCK_ENOTSUP) { /* redlock: no semaphores */
        CHECK_OK(rc);
        CHECK_OK(dlock_shutdown(s));
        CHECK_RC(late_acquire(s, 0, sa, msg, sizeof(msg)), DLOCK_ECANCELED);
        CHECK_CONTAINS(msg, "shut down");
        CHECK_RC(dlock_acquire(s, 0), DLOCK_ECANCELED);
        CHECK_OK(dlock_release(sa));
        CHECK_OK(dlock_inspect(x, "shutdown-sem1", &info));
        CHECK_OP(info.waiters, <=, 0);
        dlock_info_clear(&info);
        CHECK_OK(dlock_acquire(sb, 0)); /* the one permit was free */
        CHECK_OK(dlock_release(sb));
    }
    TH_CLOSE(sb, sa, s, lx, lo, l);
    TH_CLIENT_CLOSE(x, o, c);
}

TEST(shutdown_keeps_the_holds_taken_before)
{
    dlock_client *c = client(), *x = client();
    dlock *l = th_handle(c, "shutdown-held", 0, 0, 0);
    dlock *lx = th_handle(x, "shutdown-held", 0, 0, 0);
    dlock_info info;

    CHECK_OK(dlock_acquire(l, 0));
    uint64_t tok = dlock_token(l);
    CHECK_OK(dlock_shutdown(l));
    CHECK_EQ(dlock_held(l), 1);
    CHECK_EQ(dlock_token(l), tok);
    if (!fixed_ttl)
        CHECK_OK(dlock_extend(l, 60000));
    /* a re-entrant acquire is refused too (the handle is going away):
     * the hold stays one level deep, so one release frees it */
    CHECK_RC(dlock_acquire(l, -1), DLOCK_ECANCELED);
    CHECK_RC(dlock_acquire(l, 0), DLOCK_ECANCELED);
    CHECK_EQ(dlock_held(l), 1);
    CHECK_RC(dlock_acquire(lx, 0), DLOCK_EBUSY); /* still held */
    if (held_visible) {
        CHECK_OK(dlock_inspect(x, "shutdown-held", &info));
        CHECK_EQ(info.held, 1);
        dlock_info_clear(&info);
    }
    CHECK_OK(dlock_release(l));
    CHECK_EQ(dlock_held(l), 0);
    CHECK_OK(dlock_acquire(lx, 0)); /* freed by that one release */
    CHECK_OK(dlock_release(lx));

    /* a semaphore's handle: a permit taken before is released after */
    dlock_options o;
    dlock *s = NULL, *sx = NULL;
    memset(&o, 0, sizeof(o));
    o.permits = 2;
    CHECK_OK(dlock_open(&s, c, "shutdown-sem", &o));
    CHECK_OK(dlock_open(&sx, x, "shutdown-sem", &o));
    int rc = dlock_acquire(s, 0);
    if (rc == DLOCK_ENOTSUP) { /* redlock: no semaphores */
        CHECK_OK(dlock_shutdown(s));
        CHECK_RC(dlock_acquire(s, -1), DLOCK_ECANCELED);
    } else {
        CHECK_OK(rc);
        CHECK_OK(dlock_shutdown(s));
        int64_t w0 = th_now_ms();
        CHECK_RC(dlock_acquire(s, -1), DLOCK_ECANCELED);
        CHECK_RC(dlock_acquire(s, 0), DLOCK_ECANCELED);
        CHECK_OP(th_now_ms() - w0, <, 2000);
        CHECK_OK(dlock_release(s));
        /* no permit of s's left: another owner takes both at once,
         * through handles of its own (one permit per owner thread) */
        CHECK_OK(dlock_acquire(sx, 0));
        dlock *sy = NULL;
        dlock_options oy = o;
        oy.flags = DLOCK_OWNER_HANDLE;
        CHECK_OK(dlock_open(&sy, x, "shutdown-sem", &oy));
        CHECK_OK(dlock_acquire(sy, 0));
        CHECK_OK(dlock_release(sy));
        dlock_close(sy);
        CHECK_OK(dlock_release(sx));
    }
    TH_CLOSE(sx, s, lx, l);
    TH_CLIENT_CLOSE(x, c);
}

/* Threads that start an endless acquire at the moment the handle is shut
 * (a barrier): with a cancel that is not remembered (dlock_cancel()), an
 * acquire that had not yet joined the handle's list when the cancel went
 * through would wait forever; dlock_shutdown() refuses it instead. */
typedef struct shutrace {
    dlock *l;
    pthread_barrier_t *go;
    int rc;
    int refused; /* "shut down": refused, not a cancelled wait */
    int *done; /* counts the threads that returned */
    int *all;  /* set by the last one */
} shutrace;

static void *shut_racer(void *arg)
{
    shutrace *t = arg;

    pthread_barrier_wait(t->go);
    t->rc = dlock_acquire(t->l, -1);
    t->refused = strstr(dlock_errmsg(), "shut down") != NULL;
    if (t->rc == DLOCK_OK)
        dlock_release(t->l);
    if (__atomic_add_fetch(t->done, 1, __ATOMIC_SEQ_CST) == SHUT_WAITERS)
        __atomic_store_n(t->all, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

TEST(shutdown_racing_new_acquires_misses_none)
{
    dlock_client *c = client(), *o = client(), *x = client();
    dlock *lo = th_handle(o, "shutdown-race", 0, 0, 0);
    dlock *lx = th_handle(x, "shutdown-race", 0, 0, 0);
    int refused = 0, cancelled = 0;

    if (!strcmp(kind, "mysql") || !strncmp(kind, "pg-advisory", 11)) {
        /* Known defects of these two stores, not of the shutdown (open,
         * reported with issue 34): a cancel that reaches the server
         * before it has read the wait's statement is lost. MySQL clears
         * a KILL QUERY as a statement starts; PostgreSQL ignores a cancel
         * request while it reads a command. The wait, cancelled in the
         * core, then runs on (MySQL: ~30 s, 1 round in 60; PostgreSQL
         * advisory: until the lock frees, 1 round in 100 from Python).
         * dlock_cancel() has the same window. */
        printf("     (skipped on %s: a cancel that overtakes the wait's "
               "statement is lost: a known store defect)\n", kind);
        TH_CLOSE(lx, lo);
        TH_CLIENT_CLOSE(x, o, c);
        return;
    }
    CHECK_OK(dlock_acquire(lo, 0)); /* every acquire below would wait */
    for (int round = 0; round < 20; round++) {
        dlock *l = th_handle(c, "shutdown-race", 0, 0, 0);
        pthread_barrier_t go;
        shutrace t[SHUT_WAITERS];
        pthread_t th[SHUT_WAITERS];
        int done = 0, all = 0;

        CHECK_EQ(pthread_barrier_init(&go, NULL, SHUT_WAITERS + 1), 0);
        for (int i = 0; i < SHUT_WAITERS; i++) {
            shutrace z = {l, &go, -99, 0, &done, &all};
            t[i] = z;
            CHECK_EQ(pthread_create(&th[i], NULL, shut_racer, &t[i]), 0);
        }
        pthread_barrier_wait(&go);
        int64_t t0 = th_now_ms();
        CHECK_OK(dlock_shutdown(l));
        /* each acquire is refused or its wait cancelled: within
         * cancel_ends_a_wait's bound (one store round trip to leave) */
        int ended = th_wait_flag(&all, 5000);
        int64_t took = th_now_ms() - t0;
        if (!ended) {
            /* some acquire missed the shutdown and waits forever: let
             * them have the lock, to end the threads */
            int missed = SHUT_WAITERS - __atomic_load_n(&done,
                                                        __ATOMIC_SEQ_CST);
            CHECK_OK(dlock_release(lo));
            for (int i = 0; i < SHUT_WAITERS; i++)
                pthread_join(th[i], NULL);
            th_fail(__FILE__, __LINE__,
                    "round %d: %d of %d acquires still waited %lld ms "
                    "after the shutdown",
                    round, missed, SHUT_WAITERS,
                    (long long)took);
        }
        for (int i = 0; i < SHUT_WAITERS; i++) {
            pthread_join(th[i], NULL);
            CHECK_RC(t[i].rc, DLOCK_ECANCELED);
            if (t[i].refused)
                refused++;
            else
                cancelled++;
        }
        pthread_barrier_destroy(&go);
        dlock_close(l);
    }
    /* which way each went is the scheduler's: the counts are for the
     * reader */
    printf("     (%d refused at once, %d waits cancelled)\n", refused,
           cancelled);
    /* nothing of the 80 acquires is left in the store */
    no_waiter_left(o, "shutdown-race");
    CHECK_OK(dlock_release(lo));
    CHECK_OK(dlock_acquire(lx, 0));
    CHECK_OK(dlock_release(lx));
    TH_CLOSE(lx, lo);
    TH_CLIENT_CLOSE(x, o, c);
}


/* --- limits: the longest lease and wait (DLOCK_TTL_MAX, DLOCK_WAIT_MAX) ---
 *
 * At the maxima every store keeps the lock: nothing wraps on the way to
 * the store (MySQL counts in microseconds, PostgreSQL's lock_timeout is a
 * 32-bit number of milliseconds, ZooKeeper's session timeout too). Beyond
 * them every entry point says DLOCK_EINVAL with the limit in its message,
 * before any store sees the value (today's main took a ttl of 2^63 ms, and
 * MySQL wrote that row already expired: a second holder got in). */

TEST(ttl_and_wait_at_and_beyond_the_maxima)
{
    dlock_client *a = client(), *b = client(), *x = client();
    dlock *la = th_handle(a, "limits", DLOCK_TTL_MAX, DLOCK_NO_RENEW, 0);
    dlock *lb = th_handle(b, "limits", 0, 0, 0);
    dlock *lx = th_handle(x, "limits", 0, 0, 0);
    dlock *bad = NULL;
    dlock_options o;
    dlock_info info;
    int64_t m = -1;

    /* a hold at the longest lease, unrenewed, keeps everyone out */
    CHECK_OK(dlock_acquire(la, 0));
    uint64_t tok = dlock_token(la);
    CHECK_OP(tok, >, 0);
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_inspect(b, "limits", &info));
    CHECK_EQ(info.held, 1);
    /* the store wrote the lease's end a year ahead, not in the past (a
     * day's slack for the stores' rounding) */
    if (ttl_visible)
        CHECK_OP(info.ttl_ms, >, DLOCK_TTL_MAX - 86400000LL);
    dlock_info_clear(&info);
    CHECK_EQ(dlock_held(la), 1);

    /* the longest wait: ended by the release, then by a cancel */
    th_waiter t = {.l = lb, .wait_ms = DLOCK_WAIT_MAX};
    pthread_t th;
    th_waiter_start(&t, &th);
    wait_queued(a, "limits", 1);
    CHECK_EQ(t.rc, -99); /* still waiting */
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(la));
    pthread_join(th, NULL);
    CHECK_OK(t.rc);
    CHECK_OK(t.release_rc);
    /* woken by the release (release_wakes_the_waiter's bound): a year's
     * wait that ended any other way would not have returned at all */
    CHECK_OP(t.done_at - t0, <, 9000);

    CHECK_OK(dlock_acquire(la, 0));
    th_waiter tc = {.l = lx, .wait_ms = DLOCK_WAIT_MAX};
    th_waiter_start(&tc, &th);
    wait_queued(a, "limits", 1);
    t0 = th_now_ms();
    CHECK_OK(dlock_cancel(lx));
    pthread_join(th, NULL);
    CHECK_RC(tc.rc, DLOCK_ECANCELED);
    CHECK_OP(tc.done_at - t0, <, 5000); /* cancel_ends_a_wait's bound */

    /* extend to the longest lease: held, still nobody else's */
    if (!fixed_ttl) {
        CHECK_OK(dlock_extend(la, DLOCK_TTL_MAX));
        CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    }
    /* beyond the maxima: refused with the limit named, the hold kept */
    CHECK_RC(dlock_extend(la, DLOCK_TTL_MAX + 1), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "at most 31536000000");
    CHECK_RC(dlock_extend(la, INT64_MAX), DLOCK_EINVAL);
    CHECK_EQ(dlock_held(la), 1);
    CHECK_RC(dlock_acquire(lb, DLOCK_WAIT_MAX + 1), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "at most 31536000000");
    CHECK_RC(dlock_acquire_shared(lb, INT64_MAX), DLOCK_EINVAL);
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_release(la));

    memset(&o, 0, sizeof(o));
    o.ttl_ms = DLOCK_TTL_MAX + 1;
    CHECK_RC(dlock_open(&bad, a, "limits", &o), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "at most 31536000000");
    CHECK(bad == NULL);
    o.ttl_ms = INT64_MAX; /* Python's ttl=1e13 s and more */
    CHECK_RC(dlock_open(&bad, a, "limits", &o), DLOCK_EINVAL);
    CHECK(bad == NULL);

    /* the other durations */
    CHECK_OK(dlock_client_at_risk_max(a, DLOCK_TTL_MAX, &m));
    CHECK_OP(m, >, 0);
    CHECK_RC(dlock_client_at_risk_max(a, DLOCK_TTL_MAX + 1, &m),
             DLOCK_EINVAL);
    CHECK_RC(dlock_client_set_at_risk(a, DLOCK_TTL_MAX + 1), DLOCK_EINVAL);
    CHECK_RC(dlock_client_set_at_risk(a, INT64_MAX), DLOCK_EINVAL);
    CHECK_RC(dlock_client_set_events(a, NULL, NULL, INT64_MAX),
             DLOCK_EINVAL);
    CHECK_RC(dlock_gc(a, INT64_MAX, NULL), DLOCK_EINVAL);
    dlock_client_options co = {3600001};
    dlock_client *big = NULL;
    CHECK_RC(dlock_client_open(&big, uri, &co), DLOCK_EINVAL);
    CHECK(big == NULL);

    TH_CLOSE(lx, lb, la);
    TH_CLIENT_CLOSE(x, b, a);
}

/* The longest wait for a read hold and for a semaphore's permit (the
 * stores wait for these their own ways: PostgreSQL's advisory mode one
 * server wait per permit), behind the longest lease. */
TEST(shared_and_permit_waits_at_the_maxima)
{
    dlock_client *a = client(), *b = client();

    for (int k = 0; k < 2; k++) {
        const char *name = k ? "limits-sem" : "limits-rw";
        dlock_options o;
        dlock *la = NULL, *lb = NULL;

        memset(&o, 0, sizeof(o));
        o.ttl_ms = DLOCK_TTL_MAX;
        o.flags = DLOCK_NO_RENEW;
        o.permits = k ? 1 : 0;
        CHECK_OK(dlock_open(&la, a, name, &o));
        CHECK_OK(dlock_open(&lb, b, name, &o));
        int rc = dlock_acquire(la, 0);
        if (rc == DLOCK_ENOTSUP) { /* redlock: neither (test_shared.c) */
            TH_CLOSE(la, lb);
            continue;
        }
        CHECK_OK(rc);
        rc = k ? dlock_acquire(lb, 0) : dlock_acquire_shared(lb, 0);
        if (rc == DLOCK_ENOTSUP) { /* redlock: no read holds */
            CHECK_OK(dlock_release(la));
            TH_CLOSE(la, lb);
            continue;
        }
        CHECK_RC(rc, DLOCK_EBUSY);
        th_waiter t = {.l = lb, .shared = !k, .wait_ms = DLOCK_WAIT_MAX};
        pthread_t th;
        th_waiter_start(&t, &th);
        if (k)
            wait_queued(a, name, 1);
        else
            th_sleep_ms(300); /* the file store counts no read waiters */
        CHECK_EQ(t.rc, -99); /* waiting, not refused */
        int64_t t0 = th_now_ms();
        CHECK_OK(dlock_release(la));
        pthread_join(th, NULL);
        CHECK_OK(t.rc);
        CHECK_OP(t.done_at - t0, <, 9000); /* woken by the release */
        CHECK_RC(k ? dlock_acquire(lb, DLOCK_WAIT_MAX + 1)
                   : dlock_acquire_shared(lb, DLOCK_WAIT_MAX + 1),
                 DLOCK_EINVAL);
        TH_CLOSE(la, lb);
    }
    TH_CLIENT_CLOSE(b, a);
}


/* --- no descriptor of the library reaches a program the process starts ---
 *
 * A program started by a process that uses dlock (dlock run's command,
 * say) must not inherit the library's store connections: it could speak
 * on an authenticated connection with its rights, or keep alive a socket
 * whose end tells the store a session is dead. Every descriptor the
 * library or a client library opens for it is close-on-exec. */

#define MAX_FD_SEEN 4096

/* The child: the test binary run again as `--list-fds LIMIT`. One line
 * "FD TARGET" per descriptor it has, on stdout (the test's pipe), but the
 * directory it reads them from and descriptors at LIMIT or above: LIMIT is
 * the soft RLIMIT_NOFILE the parent saw, above which it cannot have
 * opened one. valgrind keeps its own there, above the limit it shows the
 * program (close-on-exec in 3.19, checked; a tool that leaks them is not
 * the library). */
static int list_fds(int limit)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;

    if (!d)
        return 2;
    while ((e = readdir(d))) {
        char path[64], target[256];
        int fd = atoi(e->d_name);
        if (e->d_name[0] == '.' || fd == dirfd(d) || fd >= limit)
            continue;
        snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        target[n > 0 ? n : 0] = '\0';
        printf("%d %s\n", fd, target);
    }
    closedir(d);
    return fflush(stdout) == 0 ? 0 : 3;
}

/* The descriptors this process has now that a started program would
 * inherit (no FD_CLOEXEC): inheritable[fd] = 1. */
static void inheritable_now(unsigned char *inheritable)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;

    CHECK(d != NULL);
    memset(inheritable, 0, MAX_FD_SEEN);
    while ((e = readdir(d))) {
        int fd = atoi(e->d_name), fl;
        if (e->d_name[0] == '.' || fd == dirfd(d) || fd >= MAX_FD_SEEN)
            continue;
        fl = fcntl(fd, F_GETFD);
        inheritable[fd] = fl >= 0 && !(fl & FD_CLOEXEC);
    }
    closedir(d);
}

/* Was descriptor fd, `target` when the started program listed it, in the
 * window of a client library that makes its descriptors without
 * close-on-exec and lets dlock mark them only when its call is over
 * (docs/design.md, "Descriptors": libcurl's wake-up pair in a handle's
 * first request, the ZooKeeper client's socket until its session is
 * connected)? Then this process sees it marked, or closed, by now. */
static int window_closed(int fd, const char *target)
{
    char path[64], now[256];
    ssize_t n;
    int fl;

    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    n = readlink(path, now, sizeof(now) - 1);
    now[n > 0 ? n : 0] = '\0';
    fl = fcntl(fd, F_GETFD);
    return n <= 0 || strcmp(now, target) != 0 || fl < 0 || (fl & FD_CLOEXEC);
}

/* Starts this binary (fork + exec, as dlock run starts its command) and
 * fails the test with every descriptor it inherited beyond stdin, stdout
 * (the pipe it answers on), stderr and those in `before` (the test's own,
 * inheritable before it opened any client). */
static void started_program_inherits_nothing(const char *when,
                                             const unsigned char *before)
{
    char self[1024], lim[32], out[16384], leaks[4096] = "";
    struct rlimit rl;
    size_t got = 0;
    int p[2], status;
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    pid_t pid, parent = getpid();

    CHECK(n > 0);
    self[n] = '\0';
    CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    snprintf(lim, sizeof(lim), "%llu",
             (unsigned long long)(rl.rlim_cur < MAX_FD_SEEN ? rl.rlim_cur
                                                            : MAX_FD_SEEN));
    char *argv[] = {self, "--list-fds", lim, NULL};
    CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* only async-signal-safe calls: other threads of the parent held
         * locks at the fork. dup2 leaves the copy inheritable. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent || dup2(p[1], 1) != 1)
            _exit(126);
        execv(self, argv);
        _exit(127);
    }
    close(p[1]);
    /* the child lists a handful of descriptors and exits: 20 s only
     * catches a child that hangs (a busy machine, valgrind's parent) */
    int64_t until = th_now_ms() + 20000;
    for (;;) {
        struct pollfd pf = {p[0], POLLIN, 0};
        int64_t left = until - th_now_ms();
        CHECK_OP(left, >, 0);
        if (poll(&pf, 1, (int)left) < 0) {
            CHECK_EQ(errno, EINTR);
            continue;
        }
        ssize_t r = read(p[0], out + got, sizeof(out) - 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        CHECK_OP(r, >=, 0);
        if (r == 0)
            break;
        got += (size_t)r;
        CHECK_OP(got, <, sizeof(out) - 1);
    }
    out[got] = '\0';
    close(p[0]);
    CHECK_EQ(waitpid(pid, &status, 0), pid);
    CHECK(WIFEXITED(status));
    CHECK_EQ(WEXITSTATUS(status), 0);
    int seen_stdout = 0, nfound = 0, left;
    char *save = NULL, *found[64];
    for (char *line = strtok_r(out, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        int fd = atoi(line);
        seen_stdout |= fd == 1;
        if (fd <= 2 || (fd < MAX_FD_SEEN && before[fd]))
            continue;
        if (nfound < 64) {
            found[nfound++] = line;
        } else { /* too many to wait for: a leak whatever the window */
            size_t len = strlen(leaks);
            snprintf(leaks + len, sizeof(leaks) - len, " [%s]", line);
        }
    }
    CHECK(seen_stdout); /* the listing works: it saw its own pipe */
    /* what the program inherited beyond the test's own must have been in
     * a client library's window, and be marked or closed once the call
     * ends. 15 s: a call's bound is the client's timeout (th_patient():
     * 10 s); what the library leaves inheritable stays so for ever */
    int64_t t0 = th_now_ms();
    do {
        left = 0;
        for (int i = 0; i < nfound; i++) {
            if (!found[i])
                continue;
            const char *target = strchr(found[i], ' ');
            if (!window_closed(atoi(found[i]), target ? target + 1 : "")) {
                left++;
                continue;
            }
            printf("     (%s: %s was in a client library's window; marked "
                   "or closed after %lld ms)\n",
                   when, found[i], (long long)(th_now_ms() - t0));
            found[i] = NULL;
        }
        if (left)
            th_sleep_ms(10);
    } while (left && th_now_ms() - t0 < 15000);
    for (int i = 0; i < nfound; i++) {
        size_t len = strlen(leaks);
        if (found[i])
            snprintf(leaks + len, sizeof(leaks) - len, " [%s]", found[i]);
    }
    if (leaks[0])
        th_fail(__FILE__, __LINE__, "%s: a started program inherited%s",
                when, leaks);
}

TEST(no_descriptor_reaches_a_started_program)
{
    static unsigned char before[MAX_FD_SEEN];
    inheritable_now(before);

    /* a holds both locks; b waits for both (its subscriber connection,
     * listener, watch stream, epoll set, sidecar file, fair wake-up
     * channel exist), c waits behind b in the fair queue */
    dlock_client *a = client(), *b = client(), *c = client();
    dlock *la = th_handle(a, "inherit", 0, 0, 0);
    dlock *lfa = th_handle(a, "inherit-fair", 0, has_fair ? DLOCK_FAIR : 0, 0);
    /* each waits 60 s (the test's releases end the waits within seconds;
     * the bound only ends a lost wake-up), then holds until told */
    th_waiter w[3] = {
        {.l = th_handle(b, "inherit", 0, 0, 0), .wait_go = 1},
        {.l = th_handle(b, "inherit-fair", 0, has_fair ? DLOCK_FAIR : 0, 0),
         .wait_go = 1},
        {.l = th_handle(c, "inherit-fair", 0, has_fair ? DLOCK_FAIR : 0, 0),
         .wait_go = 1},
    };
    pthread_t th[3];

    CHECK_OK(dlock_acquire(la, 0));
    CHECK_OK(dlock_acquire(lfa, 0));
    th_waiter_start(&w[0], &th[0]);
    wait_queued(a, "inherit", 1);
    th_waiter_start(&w[1], &th[1]);
    wait_queued(a, "inherit-fair", 1);
    th_waiter_start(&w[2], &th[2]);
    wait_queued(a, "inherit-fair", 2);
    started_program_inherits_nothing("held, three waiting", before);

    /* the hand-over: b holds "inherit", b or c "inherit-fair" (b in fair
     * mode, and c waits on it: on the file store, connected to b's wake-up
     * channel) and the other one waits */
    CHECK_OK(dlock_release(la));
    CHECK_OK(dlock_release(lfa));
    /* 30 s: a release wakes its waiter at once (release_wakes_the_waiter
     * checks how fast); the bound only catches one that never comes */
    CHECK(th_waiter_returned(&w[0], 30000));
    CHECK_OK(w[0].rc);
    int64_t until = th_now_ms() + 30000;
    while (!w[1].done && !w[2].done && th_now_ms() < until)
        th_sleep_ms(2);
    int first = w[1].done ? 1 : 2;
    CHECK(w[first].done);
    CHECK_OK(w[first].rc);
    if (has_fair)
        CHECK_EQ(first, 1);
    CHECK_EQ(w[3 - first].done, 0);
    started_program_inherits_nothing("handed over, one waiting", before);

    int order[3] = {0, first, 3 - first};
    for (int k = 0; k < 3; k++) {
        th_waiter *x = &w[order[k]];
        CHECK(th_waiter_returned(x, 30000));
        CHECK_OK(x->rc);
        th_waiter_go(x);
        pthread_join(th[order[k]], NULL);
    }
    for (int i = 0; i < 3; i++)
        dlock_close(w[i].l);
    TH_CLOSE(lfa, la);
    TH_CLIENT_CLOSE(c, b, a);
}

/* --- the background thread starts when first needed (issue 37) --- */

/* How many threads the process has now: the entries of /proc/self/task,
 * what Python 3.12 counts before it warns at os.fork(). */
static int thread_count(void)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int n = 0;

    CHECK(d != NULL);
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

TEST(an_idle_client_starts_no_thread)
{
    /* ZooKeeper's C client starts threads of its own when a session
     * connects, and the open connects one (and a session's event may ask
     * for ours): no count there (docs/design.md "Threads") */
    int counted = strcmp(kind, "zk") != 0;
    /* earlier tests of this binary may have left threads of their own:
     * counts are taken before and after, never as absolute numbers */
    int before = thread_count();
    int64_t ttl = short_ttl > 0 ? short_ttl : 300;

    if (!counted)
        printf("     (threads not counted on zk: its C client's own)\n");
    /* opened, a handle, an inspect: no thread of the client */
    dlock_client *a = client();
    dlock_options o;
    memset(&o, 0, sizeof(o));
    o.ttl_ms = ttl;
    o.on_lost = on_lost;
    lost_seen = 0;
    dlock *la = th_open(a, "idle", &o);
    th_check_held(a, "idle", 0, -1);
    if (counted)
        CHECK_EQ(thread_count(), before);
    /* a client whose thread never started closes */
    dlock_client *z = client();
    dlock *lz = th_handle(z, "idle", 0, 0, 0);
    if (counted)
        CHECK_EQ(thread_count(), before);
    dlock_close(lz);
    dlock_client_close(z);
    if (counted)
        CHECK_EQ(thread_count(), before);

    /* the first acquire starts it, and it renews: a short lease held past
     * two ttls is still held (another client's try is refused all along,
     * no loss told) */
    CHECK_OK(dlock_acquire(la, 0));
    uint64_t tok = dlock_token(la);
    if (counted)
        CHECK_OP(thread_count(), >, before);
    if (!strcmp(kind, "sqlite") && getenv("DLOCK_TEST_VALGRIND")) {
        /* as in watchdog_keeps_a_short_lease: renewals and tries meet in
         * a kernel wait that stalls valgrind */
        printf("     (renewal not watched under valgrind on sqlite)\n");
    } else {
        dlock_client *p = client();
        dlock *lp = th_handle(p, "idle", 0, 0, 0);
        int64_t until = th_now_ms() + 2 * ttl + ttl / 2;
        while (th_now_ms() < until) {
            th_sleep_ms(ttl / 4);
            CHECK_RC(dlock_acquire(lp, 0), DLOCK_EBUSY);
        }
        dlock_close(lp);
        dlock_client_close(p);
    }
    CHECK_EQ(lost_seen, 0);
    CHECK_EQ(dlock_held(la), 1);
    CHECK_EQ(dlock_token(la), tok);
    CHECK_OK(dlock_release(la));

    /* a waiter on a client with no thread yet is woken by the release
     * (a 60 s lease and a 10 s wait: the release's wake-up, not the
     * lease's end) */
    if (getenv("DLOCK_TEST_VALGRIND")) {
        /* the file store's and SQLite's waits are kernel waits behind
         * another thread of this process (the TK() tests' reason) */
        printf("     (waiter not run under valgrind on %s)\n", kind);
    } else {
        dlock *lw = th_handle(a, "idle-wake", 60000, 0, 0);
        CHECK_OK(dlock_acquire(lw, 0));
        int mid = thread_count();
        dlock_client *b = client();
        if (counted)
            CHECK_EQ(thread_count(), mid);
        th_waiter t = {.l = th_handle(b, "idle-wake", 60000, 0, 0),
                       .wait_ms = 10000};
        pthread_t th;
        th_waiter_start(&t, &th);
        CHECK(th_wait_flag(&t.started, 10000));
        th_sleep_ms(300);
        CHECK_OK(dlock_release(lw));
        pthread_join(th, NULL);
        CHECK_OK(t.rc);
        /* as in release_wakes_the_waiter: it waited for the release, and
         * 9 s only catches a waiter that slept to its deadline */
        CHECK_OP(t.took, >=, 250);
        CHECK_OP(t.took, <, 9000);
        dlock_close(t.l);
        dlock_client_close(b);
        dlock_close(lw);
    }
    dlock_close(la);
    dlock_client_close(a);
    /* every thread a client started was joined by its close */
    if (counted)
        CHECK_EQ(thread_count(), before);
}

static const th_test tests[] = {
    T(basic_acquire_release),
    TK(try_busy_and_timed_wait),
    T(reentrant_hold_count),
    T(not_reentrant_fails_at_once),
    T(reentrant_across_handles),
    T(threads_are_different_owners),
    T(tokens_strictly_increase),
    TP(mutual_exclusion_across_processes),
    TK(threads_sharing_one_client),
    TK(release_wakes_the_waiter),
    TK(wait_forever),
    TP(fair_mode_is_fifo),
    TP(killed_holder_is_replaced),
    TP(frozen_holder_learns_it_lost),
    T(watchdog_keeps_a_short_lease),
    T(no_renew_lease_runs_out),
    T(extend),
    T(loss_is_reported),
    T(inspect_reports_the_holder),
    T(names_with_any_bytes),
    T(bad_input_is_rejected),
    T(close_releases_holds),
    TP(a_forked_child_cannot_use_the_parents_client),
    TP(a_forked_child_closing_the_parents_client_leaves_it_alone),
    T(owner_handle_is_released_by_any_thread),
    T(owner_handles_are_owners_apart_from_threads),
    TK(owner_handle_takes_one_acquire_at_a_time),
    TK(cancel_ends_a_wait_and_leaves_nothing),
    TK(cancel_in_a_fair_queue_lets_the_next_one_go),
    TK(cancel_racing_a_release_leaves_no_hold),
    TK(shutdown_ends_every_wait_and_refuses_later_acquires),
    TK(shutdown_keeps_the_holds_taken_before),
    TK(shutdown_racing_new_acquires_misses_none),
    TK(ttl_and_wait_at_and_beyond_the_maxima),
    TK(shared_and_permit_waits_at_the_maxima),
    TKP(no_descriptor_reaches_a_started_program),
    T(an_idle_client_starts_no_thread),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--list-fds") == 0)
        return list_fds(atoi(argv[2]));
    if (argc < 2) {
        fprintf(stderr,
                "usage: %s file|redis|rediss|redis-sentinel|redis-cluster|"
                "redlock|zk|etcd|sqlite|pg|pg-advisory|"
                "pg-pgbouncer|pg-advisory-pgbouncer|mysql "
                "[filter]\n",
                argv[0]);
        return 2;
    }
    th_store_start(&S, argv[1]);
    kind = S.kind;
    uri = S.uri;
    has_leases = S.has_leases;
    lease_runs_out = S.lease_runs_out;
    ttl_visible = S.ttl_visible;
    fixed_ttl = S.fixed_ttl;
    keeps_last_token = S.keeps_last_token;
    held_visible = S.held_visible;
    has_fair = S.has_fair;
    short_ttl = S.short_ttl;
    return th_main(argc - 1, argv + 1, tests);
}
