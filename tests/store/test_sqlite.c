/* SPDX-License-Identifier: MIT */
/*
 * test_sqlite.c -- what only the SQLite store does, on real database files:
 * the lock table and its rows (the token survives release), dlock_gc()
 * removing unused rows (tokens still growing), SQL injection
 * through lock names and the table option, the kernel queue in the
 * sidecar file (a waiter woken by the release, a dead waiter or holder,
 * a waiter that sleeps without CPU), bad URIs; dlock_list() over rows
 * free, held and foreign, and dlock_break() of a frozen holder and racing
 * renewals (the wake-ups of a break: test_sqlite_rw.c). A direct sqlite3
 * connection looks behind the store's back.
 */
#include "test.h"

#include <sqlite3.h>

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char db_path[600];
static char uri[700];

static dlock_client *client(void)
{
    return th_client(uri, NULL);
}

static dlock *handle(dlock_client *c, const char *name, unsigned flags)
{
    return th_handle(c, name, 0, flags, 0);
}

/* One integer from a query on the database (-1 when no row). */
static long long query_int(const char *path, const char *sql)
{
    sqlite3 *db;
    sqlite3_stmt *st;
    long long v = -1;

    CHECK_EQ(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        th_fail(__FILE__, __LINE__, "%s: %s", sql, sqlite3_errmsg(db));
    if (sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_type(st, 0) == SQLITE_NULL
                ? -2
                : sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return v;
}

TEST(rows_stay_and_carry_the_token)
{
    dlock_client *c = client();
    dlock *l = handle(c, "row", 0);

    CHECK_OK(dlock_acquire(l, 0));
    uint64_t t1 = dlock_token(l);
    CHECK_EQ(query_int(db_path, "SELECT token FROM dlock_locks WHERE name = "
                                "CAST('row' AS BLOB)"),
             (long long)t1);
    CHECK_EQ(query_int(db_path, "SELECT lock_until > 0 FROM dlock_locks "
                                "WHERE name = CAST('row' AS BLOB)"),
             1);
    CHECK_OK(dlock_release(l));
    /* released: the row stays, without an owner, with its token */
    CHECK_EQ(query_int(db_path, "SELECT owner FROM dlock_locks WHERE name = "
                                "CAST('row' AS BLOB)"),
             -2);
    CHECK_EQ(query_int(db_path, "SELECT token FROM dlock_locks WHERE name = "
                                "CAST('row' AS BLOB)"),
             (long long)t1);
    dlock_close(l);
    dlock_client_close(c);
    /* another client later: the counter goes on */
    c = client();
    l = handle(c, "row", 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OP(dlock_token(l), >, t1);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

TEST(gc_removes_unused_locks_and_tokens_still_grow)
{
    dlock_client *c = client();
    dlock *held = handle(c, "gc-held", 0), *old = handle(c, "gc-old", 0);
    uint64_t n = 99;

    CHECK_OK(dlock_acquire(old, 0));
    uint64_t t_old = dlock_token(old);
    CHECK_OK(dlock_release(old));
    CHECK_OK(dlock_acquire(held, 0));
    th_sleep_ms(50);
    /* nothing idle for an hour */
    CHECK_OK(dlock_gc(c, 3600 * 1000, &n));
    CHECK_EQ(n, 0);
    CHECK_RC(dlock_gc(c, -1, &n), DLOCK_EINVAL);
    /* idle for 20 ms: the free row goes, the held one stays */
    CHECK_OK(dlock_gc(c, 20, &n));
    CHECK_OP(n, >=, 1);
    CHECK_EQ(query_int(db_path, "SELECT count(*) FROM dlock_locks WHERE "
                                "name = CAST('gc-old' AS BLOB)"),
             0);
    CHECK_EQ(query_int(db_path, "SELECT count(*) FROM dlock_locks WHERE "
                                "name = CAST('gc-held' AS BLOB)"),
             1);
    CHECK_EQ(dlock_held(held), 1);
    CHECK_OK(dlock_extend(held, 30000)); /* still ours */
    /* the removed name starts again above its old tokens */
    CHECK_OK(dlock_acquire(old, 0));
    CHECK_OP(dlock_token(old), >, t_old);
    CHECK_OK(dlock_release(old));
    CHECK_OK(dlock_release(held));
    TH_CLOSE(held, old);
    dlock_client_close(c);

    /* a store with nothing to collect says so */
    char u[700];
    snprintf(u, sizeof(u), "file://%s/files", th_tmpdir());
    c = th_client(u, NULL);
    CHECK_RC(dlock_gc(c, 0, &n), DLOCK_ENOTSUP);
    CHECK_EQ(n, 0);
    dlock_client_close(c);
    CHECK_RC(dlock_gc(NULL, 0, NULL), DLOCK_EINVAL);
}

TEST(sql_injection_locks_a_strangely_named_lock)
{
    static const char *const names[] = {
        "x", "x' OR '1'='1", "x'; DROP TABLE dlock_locks; --",
        "\"; DELETE FROM dlock_locks; --", NULL};
    char u[1200], path[700];
    dlock_client *c = client();
    dlock *l[4];

    for (int i = 0; names[i]; i++) {
        l[i] = handle(c, names[i], 0);
        CHECK_OK(dlock_acquire(l[i], 0)); /* each its own lock */
    }
    /* four rows held, the table still there */
    CHECK_EQ(query_int(db_path, "SELECT count(*) FROM dlock_locks WHERE "
                                "lock_until > 0"),
             4);
    CHECK_EQ(query_int(db_path, "SELECT count(*) FROM dlock_locks WHERE "
                                "name = CAST('x'' OR ''1''=''1' AS BLOB)"),
             1);
    for (int i = 0; names[i]; i++) {
        CHECK_OK(dlock_release(l[i]));
        dlock_close(l[i]);
    }
    dlock_client_close(c);

    /* the table option is one quoted identifier, whatever it holds */
    snprintf(path, sizeof(path), "%s/inject.db", th_tmpdir());
    snprintf(u, sizeof(u),
             "sqlite://%s?table=t%%22%%3B%%20DROP%%20TABLE%%20x%%3B--", path);
    c = th_client(u, NULL);
    l[0] = handle(c, "a", 0);
    CHECK_OK(dlock_acquire(l[0], 0));
    CHECK_OK(dlock_release(l[0]));
    dlock_close(l[0]);
    dlock_client_close(c);
    CHECK_EQ(query_int(path, "SELECT count(*) FROM sqlite_master WHERE type "
                             "= 'table' AND name = 't\"; DROP TABLE x;--'"),
             1);
    CHECK_EQ(query_int(path, "SELECT count(*) FROM \"t\"\"; DROP TABLE x;--\""),
             1);
}

static int fair_waiter(void *arg)
{
    (void)arg;
    dlock_client *c = client();
    dlock *l = handle(c, "fairdead", DLOCK_FAIR);
    int rc = dlock_acquire(l, 30000);
    return rc == DLOCK_OK ? 0 : 1;
}

TEST(a_dead_fair_waiter_drops_out_of_the_queue)
{
    dlock_client *a = client(), *b = client();
    dlock *la = handle(a, "fairdead", DLOCK_FAIR);
    dlock *lb = handle(b, "fairdead", DLOCK_FAIR);
    dlock_info info;

    CHECK_OK(dlock_acquire(la, 0));
    pid_t pid = th_fork(fair_waiter, NULL);
    int i;
    for (i = 0; i < 200; i++) {
        CHECK_OK(dlock_inspect(a, "fairdead", &info));
        int64_t w = info.waiters;
        dlock_info_clear(&info);
        if (w == 1)
            break;
        th_sleep_ms(10);
    }
    CHECK_OP(i, <, 200);
    kill(pid, SIGKILL);
    CHECK_EQ(th_wait(pid), 128 + SIGKILL);
    CHECK_OK(dlock_release(la));
    /* the dead waiter was first in line: its ticket went with its
     * process, so lb is the head at once (no lease to wait for: the lock
     * was released; 1 s is a busy machine's scheduling, far below the 3 s
     * the old heartbeats took) */
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_acquire(lb, 10000));
    CHECK_OP(th_now_ms() - t0, <, 1000);
    CHECK_OK(dlock_release(lb));
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

typedef struct {
    volatile int holding;
    volatile int64_t released_at;
    volatile int queued;
} poll_shared;

static int holder_child(void *arg)
{
    poll_shared *s = arg;
    dlock_client *c = client();
    dlock *l = handle(c, "poll", 0);

    if (dlock_acquire(l, 0) != DLOCK_OK)
        return 1;
    __atomic_store_n(&s->holding, 1, __ATOMIC_SEQ_CST);
    th_sleep_ms(1500);
    s->released_at = th_now_ms();
    int rc = dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
    return rc == DLOCK_OK ? 0 : 2;
}

/* The release wakes a waiter in another process at once (it used to poll,
 * up to 100 ms apart), and the waiter slept without using the CPU. */
TEST(a_waiter_in_another_process_is_woken_by_the_release)
{
    poll_shared *s = th_shared(sizeof(*s));
    dlock_client *c = client();
    dlock *l = handle(c, "poll", 0);
    struct rusage r0, r1;

    pid_t pid = th_fork(holder_child, s);
    for (int i = 0; i < 500 && !s->holding; i++)
        th_sleep_ms(5);
    CHECK_EQ(s->holding, 1);
    getrusage(RUSAGE_SELF, &r0);
    CHECK_OK(dlock_acquire(l, 10000));
    getrusage(RUSAGE_SELF, &r1);
    int64_t late = th_now_ms() - s->released_at;
    /* woken by the release, not by a timer: the lease is 30 s; 50 ms is
     * a busy machine's scheduling delay, half the old poll interval */
    CHECK_OP(late, <, 50);
    /* a 1.5 s wait in poll() costs no CPU; polling every few ms would */
    int64_t cpu_us = (r1.ru_utime.tv_sec - r0.ru_utime.tv_sec) * 1000000 +
                     (r1.ru_utime.tv_usec - r0.ru_utime.tv_usec) +
                     (r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) * 1000000 +
                     (r1.ru_stime.tv_usec - r0.ru_stime.tv_usec);
    CHECK_OP(cpu_us, <, 50000);
    CHECK_EQ(th_wait(pid), 0);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

static int killed_holder(void *arg)
{
    poll_shared *s = arg;
    dlock_client *c = client();
    dlock_options o;
    dlock *l = NULL;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = 1000;
    if (dlock_open(&l, c, "killed", &o) != DLOCK_OK ||
        dlock_acquire(l, 0) != DLOCK_OK)
        return 1;
    __atomic_store_n(&s->holding, 1, __ATOMIC_SEQ_CST);
    for (;;)
        th_sleep_ms(1000);
}

/* A holder killed while others wait: its channel closes, but the row's
 * lease still runs; the waiter takes the lock when the lease ends, not
 * before (the table decides) and not much later (a timer, no polling). */
TEST(a_killed_holder_lets_waiters_in_at_its_lease_end)
{
    poll_shared *s = th_shared(sizeof(*s));
    dlock_client *c = client();
    dlock *l = handle(c, "killed", 0);

    pid_t pid = th_fork(killed_holder, s);
    for (int i = 0; i < 500 && !s->holding; i++)
        th_sleep_ms(5);
    CHECK_EQ(s->holding, 1);
    int64_t t0 = th_now_ms();
    kill(pid, SIGKILL);
    CHECK_EQ(th_wait(pid), 128 + SIGKILL);
    CHECK_OK(dlock_acquire(l, 10000));
    int64_t took = th_now_ms() - t0;
    /* the 1 s lease was set before t0: it ends within 1 s of it; a
     * waiter that woke only at its deadline would take 10 s */
    CHECK_OP(took, <, 3000);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

static int queued_waiter(void *arg)
{
    poll_shared *s = arg;
    dlock_client *c = client();
    dlock *l = handle(c, "queue", 0);

    __atomic_add_fetch(&s->queued, 1, __ATOMIC_SEQ_CST);
    int rc = dlock_acquire(l, 20000);
    if (rc != DLOCK_OK)
        return 1;
    s->released_at = th_now_ms(); /* here: when it got the lock */
    dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

/* A waiter killed in the middle of the queue: the one behind it moves up
 * to the dead one's predecessor and is woken by its release. */
TEST(a_waiter_killed_in_the_queue_is_skipped)
{
    poll_shared *s = th_shared(sizeof(*s));
    dlock_client *c = client();
    dlock *l = handle(c, "queue", 0);
    pid_t pid[2];

    CHECK_OK(dlock_acquire(l, 0));
    for (int i = 0; i < 2; i++) {
        pid[i] = th_fork(queued_waiter, s);
        th_wait_waiters(c, "queue", i + 1);
    }
    kill(pid[0], SIGKILL);
    CHECK_EQ(th_wait(pid[0]), 128 + SIGKILL);
    /* the one behind moves up: for a moment (until it marks the region
     * as the head of a holder without a ticket) the count is short */
    for (int k = 0; k < 2000 && th_waiters(c, "queue") != 1; k++)
        th_sleep_ms(5); /* ms on an idle machine; 10 s for a loaded one */
    CHECK_EQ(th_waiters(c, "queue"), 1);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(l));
    CHECK_EQ(th_wait(pid[1]), 0);
    /* woken by the release (the lease is 30 s) */
    CHECK_OP(s->released_at - t0, <, 1000);
    dlock_close(l);
    dlock_client_close(c);
}

/* Default mode is first come, first served too: a holder that took the
 * lock with nobody queued (no ticket) rings the head of the queue at its
 * release, each following release wakes the next one, in arrival order,
 * and nobody waits for a lease (30 s) or a timer. */
typedef struct {
    int order[8];
    volatile int n;
    volatile int64_t at[8];
} order_shared;

typedef struct {
    order_shared *s;
    int me;
} order_arg;

static int ordered_waiter(void *arg)
{
    order_arg *a = arg;
    dlock_client *c = client();
    dlock *l = handle(c, "order", 0);

    if (dlock_acquire(l, 20000) != DLOCK_OK)
        return 1;
    int k = __atomic_fetch_add(&a->s->n, 1, __ATOMIC_SEQ_CST);
    a->s->order[k] = a->me;
    a->s->at[k] = th_now_ms();
    th_sleep_ms(20);
    int rc = dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
    return rc == DLOCK_OK ? 0 : 2;
}

TEST(default_mode_wakes_waiters_one_at_a_time_in_arrival_order)
{
    order_shared *s = th_shared(sizeof(*s));
    order_arg args[4];
    pid_t pid[4];
    dlock_client *c = client();
    dlock *l = handle(c, "order", 0);

    CHECK_OK(dlock_acquire(l, 0)); /* nobody queued: no ticket */
    for (int i = 0; i < 4; i++) {
        args[i].s = s;
        args[i].me = i;
        pid[i] = th_fork(ordered_waiter, &args[i]);
        th_wait_waiters(c, "order", i + 1);
    }
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(l));
    for (int i = 0; i < 4; i++)
        CHECK_EQ(th_wait(pid[i]), 0);
    CHECK_EQ(s->n, 4);
    for (int i = 0; i < 4; i++)
        CHECK_EQ(s->order[i], i);
    /* each woken by the one before: four 20 ms holds, and a busy
     * machine's scheduling, far below one lease */
    CHECK_OP(s->at[3] - t0, <, 4 * 20 + 2000);
    dlock_close(l);
    dlock_client_close(c);
}

/* Processes opening a client on a new database file at the same moment
 * all succeed: the loser of SQLite's lock upgrade on the first DDL gets
 * SQLITE_BUSY without its busy handler, and runs the statement again (it
 * failed "creating the lock table: database is locked", one time in four
 * with two processes, found by the contention bench). */
TEST(clients_opening_a_new_database_together)
{
    char path[700], u[760];

    for (int round = 0; round < 10; round++) {
        snprintf(path, sizeof(path), "%s/together-%d.db", th_tmpdir(), round);
        snprintf(u, sizeof(u), "sqlite://%s", path);
        th_open_together(u, 8);
    }
}

/* ------------------------------------------------------------------------ */
/* dlock_list() and dlock_break()                                           */
/* ------------------------------------------------------------------------ */

/* Pages of 4 rows over 30 names (3 held, 27 free) and rows no dlock
 * client made (a TEXT name, a name with a NUL byte, an empty one): the
 * default listing finds the 10 held, DLOCK_LIST_FREE the 30, never a
 * foreign row; every page reads at most 4 rows, so some pages hold no
 * lock and still go on. Cursors the store did not make: DLOCK_EINVAL. */
TEST(list_pages_over_free_held_and_foreign_rows)
{
    dlock_client *c = client(), *o = client();
    dlock *l[30];
    char name[64];
    size_t held = 0, all = 0, pages = 0, empty = 0;

    for (int i = 0; i < 30; i++) {
        snprintf(name, sizeof(name), "ls/%02d", i);
        l[i] = handle(c, name, 0);
        CHECK_OK(dlock_acquire(l[i], 0));
        if (i % 10)
            CHECK_OK(dlock_release(l[i])); /* its row stays, free */
    }
    th_sqlite_exec(db_path,
                   "INSERT INTO dlock_locks (name, lock_until) VALUES "
                   "('ls/text', 1e15), (X'6c732f00', 1e15), "
                   "(X'', 1e15)");
    for (int pass = 0; pass < 2; pass++) {
        unsigned flags = pass ? DLOCK_LIST_FREE : 0;
        char *cur = NULL;
        size_t n = 0;
        for (int k = 0; k < 100; k++) { /* bounded: 30 names, pages of 4 */
            dlock_list_page p;
            CHECK_OK(dlock_list(o, "ls/", cur, 4, flags, &p));
            free(cur);
            cur = p.next ? strdup(p.next) : NULL;
            pages++;
            empty += p.n == 0;
            CHECK_OP(p.n, <=, 4);
            for (size_t i = 0; i < p.n; i++) {
                CHECK_EQ(strncmp(p.locks[i].name, "ls/", 3), 0);
                CHECK_EQ(strlen(p.locks[i].name), 5); /* ls/NN only */
                int idx = atoi(p.locks[i].name + 3);
                CHECK_EQ(p.locks[i].info.held, idx % 10 == 0);
                if (p.locks[i].info.held)
                    CHECK_EQ(p.locks[i].info.token, dlock_token(l[idx]));
                else
                    CHECK_OP(p.locks[i].info.token, >, 0); /* kept */
            }
            n += p.n;
            dlock_list_clear(&p);
            if (!cur)
                break;
        }
        CHECK(cur == NULL);
        if (pass)
            all = n;
        else
            held = n;
    }
    CHECK_EQ(held, 3);
    CHECK_EQ(all, 30);
    CHECK_OP(empty, >=, 1); /* default: pages of free rows only */
    /* cursors it never makes */
    static const char *bad[] = {"abc", "zz", "6C73", "6c7g", "-1", " 6c"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        dlock_list_page p;
        CHECK_RC(dlock_list(o, NULL, bad[i], 10, 0, &p), DLOCK_EINVAL);
        CHECK_EQ(p.n, 0);
        CHECK_CONTAINS(dlock_errmsg(), "cursor");
    }
    /* a cursor past every name: the end */
    dlock_list_page p;
    CHECK_OK(dlock_list(o, NULL, "ffffffff", 10, DLOCK_LIST_FREE, &p));
    CHECK_EQ(p.n, 0);
    CHECK(p.next == NULL);
    dlock_list_clear(&p);
    /* a prefix of 0xff bytes: no upper bound, nothing above it here */
    CHECK_OK(dlock_list(o, "\xff\xff", NULL, 10, DLOCK_LIST_FREE, &p));
    CHECK_EQ(p.n, 0);
    dlock_list_clear(&p);
    for (int i = 0; i < 30; i++) {
        if (i % 10 == 0)
            CHECK_OK(dlock_release(l[i]));
        dlock_close(l[i]);
    }
    th_sqlite_exec(db_path,
                   "DELETE FROM dlock_locks WHERE name = 'ls/text' OR "
                   "name IN (X'6c732f00', X'')");
    TH_CLIENT_CLOSE(c, o);
}

typedef struct {
    volatile int holding;
    volatile uint64_t token;
} frozen_shared;

/* Takes "frozen" through the queue (the parent holds it first), so it
 * holds a ticket; holds (renewing) until its hold is lost, then expects
 * its release to say so. */
static int frozen_holder(void *arg)
{
    frozen_shared *s = arg;
    dlock_client *c = client();
    dlock_options o;
    dlock *l = NULL;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = 9000;
    if (dlock_open(&l, c, "frozen", &o) != DLOCK_OK ||
        dlock_acquire(l, 20000) != DLOCK_OK)
        return 1;
    s->token = dlock_token(l);
    __atomic_store_n(&s->holding, 1, __ATOMIC_SEQ_CST);
    /* bounded: after the break and the thaw, the renewal (every 3 s)
     * finds the hold gone */
    for (int i = 0; i < 3000 && dlock_held(l) != DLOCK_ELOST; i++)
        th_sleep_ms(10);
    int rc = dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
    return rc == DLOCK_ELOST ? 0 : 2;
}

typedef struct {
    dlock *l;
    int rc;
    int64_t got;
    uint64_t token;
} frozen_waiter;

static void *wait_frozen(void *arg)
{
    frozen_waiter *w = arg;

    w->rc = dlock_acquire(w->l, 20000);
    w->got = th_now_ms();
    w->token = dlock_token(w->l);
    if (w->rc == DLOCK_OK)
        dlock_release(w->l);
    return NULL;
}

/* A holder with a ticket frozen (SIGSTOP) with a waiter behind it: the
 * break rings the waiter, which passes the frozen ticket (the row's
 * mark) and takes the lock at once; the frozen holder's lease (9 s) or
 * its renewal never come into it. Thawed, the holder learns it lost the
 * lock, and its release says so. */
TEST(a_frozen_holder_is_broken_and_learns_it_when_thawed)
{
    frozen_shared *s = th_shared(sizeof(*s));
    dlock_client *c = client(), *op = client();
    dlock *first = handle(c, "frozen", 0), *mine = handle(c, "frozen", 0);
    frozen_waiter w = {mine, -1, 0, 0};
    pthread_t t;

    CHECK_OK(dlock_acquire(first, 0));
    pid_t pid = th_fork(frozen_holder, s);
    for (int i = 0; i < 2000 && th_waiters(op, "frozen") < 1; i++)
        th_sleep_ms(5);
    CHECK_OK(dlock_release(first)); /* to the child, with its ticket */
    for (int i = 0; i < 2000 && !s->holding; i++)
        th_sleep_ms(5);
    CHECK_EQ(s->holding, 1);
    CHECK_EQ(pthread_create(&t, NULL, wait_frozen, &w), 0);
    for (int i = 0; i < 2000 && th_waiters(op, "frozen") < 1; i++)
        th_sleep_ms(5);
    CHECK_EQ(th_waiters(op, "frozen"), 1);
    kill(pid, SIGSTOP);
    th_sleep_ms(100); /* the waiter is asleep on the child's channel */
    int64_t t0 = th_now_ms();
    dlock_info ev;
    CHECK_OK(dlock_break(op, "frozen", &ev));
    CHECK_EQ(ev.token, s->token);
    CHECK_CONTAINS(ev.holder, "pid");
    dlock_info_clear(&ev);
    pthread_join(t, NULL);
    CHECK_OK(w.rc);
    /* the frozen lease had 9 s to run: 3 s is a wake-up on a busy
     * machine, well short of it */
    CHECK_OP(w.got - t0, <, 3000);
    CHECK_OP(w.token, >, s->token);
    kill(pid, SIGCONT);
    CHECK_EQ(th_wait(pid), 0);
    TH_CLOSE(first, mine);
    TH_CLIENT_CLOSE(c, op);
}

/* Breaks racing a holder's renewals (ttl 300 ms: one every 100 ms): each
 * break either finds the hold and removes it (the holder then learns it:
 * its release is DLOCK_ELOST) or finds the lock free (its lease ran out:
 * the release is lost anyway); never two holders, every next token
 * greater. */
TEST(breaks_racing_renewals_remove_the_hold_once)
{
    dlock_client *a = client(), *b = client(), *op = client();
    dlock_options o;
    dlock *la = NULL, *lb = handle(b, "race-renew", 0);
    uint64_t last = 0;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = 300;
    CHECK_OK(dlock_open(&la, a, "race-renew", &o));
    for (int i = 0; i < 20; i++) {
        CHECK_OK(dlock_acquire(la, 2000));
        uint64_t t = dlock_token(la);
        CHECK_OP(t, >, last);
        th_sleep_ms(90 + i * 7 % 40); /* around a renewal */
        int rc = dlock_break(op, "race-renew", NULL);
        CHECK(rc == DLOCK_OK || rc == DLOCK_ENOTHELD);
        CHECK_OK(dlock_acquire(lb, 0)); /* free at once either way */
        CHECK_OP(dlock_token(lb), >, t);
        last = dlock_token(lb);
        CHECK_RC(dlock_release(la), DLOCK_ELOST);
        CHECK_OK(dlock_release(lb));
    }
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b, op);
}

TEST(bad_uris_are_rejected)
{
    static const char *const bad[] = {
        "sqlite://host/x.db", "sqlite:///", "sqlite://", "sqlite:///x.db?bogus=1",
        "sqlite:///x.db?table=", "sqlite:///x.db?timeout=0",
        "sqlite://u:p@/x.db", NULL};
    dlock_client *c = NULL;
    char u[700];

    for (int i = 0; bad[i]; i++) {
        int rc = dlock_client_open(&c, bad[i], NULL);
        if (rc != DLOCK_EINVAL)
            th_fail(__FILE__, __LINE__, "%s: %s (%s), expected DLOCK_EINVAL",
                    bad[i], dlock_errname(rc), dlock_errmsg());
        CHECK(c == NULL);
    }
    /* a directory that does not exist: the file cannot be made */
    snprintf(u, sizeof(u), "sqlite://%s/no/such/dir/x.db", th_tmpdir());
    int rc = dlock_client_open(&c, u, NULL);
    CHECK(rc == DLOCK_EAUTH || rc == DLOCK_EPROTO);
    CHECK(c == NULL);
    CHECK_CONTAINS(dlock_errmsg(), "sqlite");
}

static const th_test tests[] = {
    T(rows_stay_and_carry_the_token),
    T(gc_removes_unused_locks_and_tokens_still_grow),
    T(sql_injection_locks_a_strangely_named_lock),
    T(a_dead_fair_waiter_drops_out_of_the_queue),
    T(a_waiter_in_another_process_is_woken_by_the_release),
    T(a_killed_holder_lets_waiters_in_at_its_lease_end),
    T(a_waiter_killed_in_the_queue_is_skipped),
    T(default_mode_wakes_waiters_one_at_a_time_in_arrival_order),
    T(clients_opening_a_new_database_together),
    T(bad_uris_are_rejected),
    T(list_pages_over_free_held_and_foreign_rows),
    TK(a_frozen_holder_is_broken_and_learns_it_when_thawed),
    TK(breaks_racing_renewals_remove_the_hold_once),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    th_sqlite_db(db_path, sizeof(db_path), uri, sizeof(uri));
    return th_main(argc, argv, tests);
}
