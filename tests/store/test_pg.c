/* SPDX-License-Identifier: MIT */
/*
 * test_pg.c -- what only the PostgreSQL store does, against real servers:
 *
 * table mode: rows kept on release, tokens from the sequence (still
 * growing after dlock_gc() removed a row); SQL injection through names and
 * the table option; a waiter that sends nothing while it waits (LISTEN/
 * NOTIFY, one channel per name: a release of one name does not wake the
 * waiters of another); a listener connection killed mid-wait (the waiter
 * listens again and is still woken); fair waiters kept in the queue by the
 * client thread beyond the 3 s an entry lives, and a dead one dropping
 * out; a client with its wall clock hours off (leases are the server's);
 * the server down and back, and frozen (deadlines kept); auth, bad URIs,
 * a least-privileged user, a Unix socket, a dead first host, TLS.
 *
 * advisory mode: interoperation with plain SQL advisory locks on the same
 * key; waiters queued in the server, in order, in dlock_inspect; a wait
 * that is the server's own (the waiter's session waits on the lock, no
 * statements) and that ends at its deadline leaving nothing behind; the
 * server restarting (holds lost at once, not after a lease).
 *
 * Most tests share one server (srv); those that stop it start their own.
 *
 * Past 1,000 lines on purpose: a list of independent scenarios (one
 * function each, run by name through the harness, any one alone with a
 * filter); the tests are split by store, not by size.
 */
#include "test.h"

#include <fcntl.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static th_sql srv;
static char adv[400]; /* srv.uri + ?mode=advisory */

static dlock_client *client(void)
{
    return th_client(srv.uri, NULL);
}

/* The advisory key of a name, as the store computes it. */
#define KEY_SQL(name)                                                       \
    "('x' || substr(md5('" name "'::bytea), 1, 16))::bit(64)::bigint"

/* --- table mode: rows and tokens --- */

TEST(rows_stay_and_tokens_come_from_the_sequence)
{
    dlock_client *a = client(), *b = client();
    dlock *la = th_handle(a, "row", 0, 0, 0),
          *lb = th_handle(b, "row", 0, 0, 0);

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t t1 = dlock_token(la);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT token FROM dlock_locks WHERE name = "
                          "'row'::bytea"),
             (long long)t1);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT last_value FROM dlock_locks_tokens"),
             (long long)t1);
    CHECK_OK(dlock_release(la));
    /* released: the row stays, free, with its token */
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM dlock_locks WHERE name = "
                          "'row'::bytea AND owner IS NULL AND token = %llu",
                          (unsigned long long)t1),
             1);
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OP(dlock_token(lb), >, t1);
    uint64_t t2 = dlock_token(lb);
    CHECK_OK(dlock_release(lb));

    /* gc removes the row; the sequence keeps counting, so the name's
     * next token is still larger (no clock involved) */
    uint64_t n = 0;
    th_sleep_ms(30);
    CHECK_OK(dlock_gc(a, 10, &n));
    CHECK_OP(n, >=, 1);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM dlock_locks WHERE name = "
                          "'row'::bytea"),
             0);
    CHECK_OK(dlock_acquire(la, 0));
    CHECK_OP(dlock_token(la), >, t2);
    /* a held row is never collected */
    CHECK_OK(dlock_gc(b, 0, &n));
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM dlock_locks WHERE name = "
                          "'row'::bytea"),
             1);
    CHECK_OK(dlock_extend(la, 30000));
    CHECK_OK(dlock_release(la));
    CHECK_RC(dlock_gc(a, -1, &n), DLOCK_EINVAL);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

/* Six processes fight for one name; under the lock each checks that its
 * token is above the last holder's. A token drawn before the row is held
 * can be older than a hold that came between. */
typedef struct race {
    uint64_t last;
    int regressions, failures;
} race;

static int race_child(void *arg)
{
    race *r = arg;
    dlock_client *c;
    dlock *l;

    if (dlock_client_open(&c, srv.uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "race", NULL) != DLOCK_OK)
        return 2;
    for (int i = 0; i < 150; i++) {
        if (dlock_acquire(l, 20000) != DLOCK_OK) {
            __atomic_add_fetch(&r->failures, 1, __ATOMIC_SEQ_CST);
            continue;
        }
        uint64_t t = dlock_token(l);
        if (t <= r->last)
            __atomic_add_fetch(&r->regressions, 1, __ATOMIC_SEQ_CST);
        r->last = t;
        if (dlock_release(l) != DLOCK_OK)
            __atomic_add_fetch(&r->failures, 1, __ATOMIC_SEQ_CST);
    }
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

TEST(tokens_never_go_backwards_under_contention)
{
    race *r = th_shared(sizeof(*r));
    pid_t pids[6];

    for (int i = 0; i < 6; i++)
        pids[i] = th_fork(race_child, r);
    for (int i = 0; i < 6; i++)
        CHECK_EQ(th_wait(pids[i]), 0);
    CHECK_EQ(r->failures, 0);
    CHECK_EQ(r->regressions, 0);
}

TEST(sql_injection_locks_a_strangely_named_lock)
{
    static const char *const names[] = {
        "x", "x' OR '1'='1", "x'; DROP TABLE dlock_locks; --",
        "\"; DELETE FROM dlock_locks; --", "$1", "\\x41", "\xff\xfe", NULL};
    dlock_client *a = client(), *b = client();
    char u[1200], out[256];
    int n = 0;

    for (int i = 0; names[i]; i++) {
        dlock *l = th_handle(a, names[i], 0, 0, 0);
        CHECK_OK(dlock_acquire(l, 0));
        for (int k = 0; names[k]; k++) {
            dlock *o = th_handle(b, names[k], 0, 0, 0);
            if (k == i) {
                CHECK_RC(dlock_acquire(o, 0), DLOCK_EBUSY);
            } else {
                CHECK_OK(dlock_acquire(o, 0));
                CHECK_OK(dlock_release(o));
            }
            dlock_close(o);
        }
        CHECK_OK(dlock_release(l));
        dlock_close(l);
        n++;
    }
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM dlock_locks WHERE name = "
                          "'x'::bytea"),
             1);
    dlock_client_close(b);

    /* a table option with quotes and semicolons names one table */
    snprintf(u, sizeof(u),
             "%s?table=t%%22%%3B%%20DROP%%20TABLE%%20dlock_locks%%3B%%20--%%27",
             srv.uri);
    b = th_client(u, NULL);
    dlock *l = th_handle(b, "y", 0, 0, 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(b);
    CHECK_EQ(th_sql_query(&srv, out, sizeof(out),
                          "SELECT count(*) FROM pg_tables WHERE tablename = "
                          "'t\"; DROP TABLE dlock_locks; --'''"),
             1);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM dlock_locks WHERE name = "
                          "'x'::bytea"),
             1);
    dlock_client_close(a);
}

/* --- waiting: LISTEN/NOTIFY --- */

typedef struct waiter_arg {
    dlock *l;
    int64_t wait;
    volatile int started;
    volatile int rc;
    volatile int64_t took;
    volatile int done;
    int hold;              /* keep the lock until let_go (20 s at most) */
    volatile int let_go;
} waiter_arg;

static void *waiter(void *arg)
{
    waiter_arg *w = arg;
    int64_t t0 = th_now_ms();

    w->started = 1;
    w->rc = dlock_acquire(w->l, w->wait);
    w->took = th_now_ms() - t0;
    for (int i = 0; w->rc == DLOCK_OK && w->hold && i < 2000 &&
                    !__atomic_load_n(&w->let_go, __ATOMIC_SEQ_CST);
         i++)
        th_sleep_ms(10);
    if (w->rc == DLOCK_OK)
        dlock_release(w->l);
    __atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/* The newest moment any dlock session of the server ran a statement
 * (microseconds since the epoch, the server's clock). */
static long long last_activity(void)
{
    return th_sql_query(&srv, NULL, 0,
                        "SELECT (extract(epoch FROM max(state_change)) * "
                        "1e6)::bigint FROM pg_stat_activity WHERE "
                        "application_name LIKE 'dlock%%' AND pid <> "
                        "pg_backend_pid()");
}

static void wait_queued(waiter_arg *w)
{
    for (int i = 0; i < 200 && !w->started; i++)
        th_sleep_ms(5);
    th_sleep_ms(300); /* it tried, armed, tried again and sleeps */
}

TEST(a_waiter_sends_nothing_while_it_waits_and_a_release_wakes_it)
{
    dlock_client *h = client(), *wa = client(), *wb = client();
    dlock *la = th_handle(h, "quiet-a", 60000, 0, 0);
    dlock *lb = th_handle(h, "quiet-b", 60000, 0, 0);
    waiter_arg a = {
        th_handle(wa, "quiet-a", 60000, 0, 0), 20000, 0, 0, 0, 0, 0, 0};
    waiter_arg b = {
        th_handle(wb, "quiet-b", 60000, 0, 0), 20000, 0, 0, 0, 0, 0, 0};
    pthread_t ta, tb;

    CHECK_OK(dlock_acquire(la, 0));
    CHECK_OK(dlock_acquire(lb, 0));
    pthread_create(&ta, NULL, waiter, &a);
    pthread_create(&tb, NULL, waiter, &b);
    wait_queued(&a);
    wait_queued(&b);
    /* 1.5 s of waiting (leases of 60 s: no renewal due): no statement */
    long long before = last_activity();
    th_sleep_ms(1500);
    CHECK_EQ(last_activity(), before);
    CHECK_EQ(a.done, 0);
    CHECK_EQ(b.done, 0);

    /* releasing quiet-a wakes its waiter at once; quiet-b's waiter listens
     * on another channel: it stays asleep and sends nothing */
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(la));
    (void)th_wait_flag(&a.done, 1000);
    CHECK_EQ(a.done, 1);
    CHECK_OK(a.rc);
    /* woken by the NOTIFY (one wake-up and one statement), not by the
     * 60 s lease: 1 s of slack for a busy machine */
    CHECK_OP(th_now_ms() - t0, <, 1000);
    pthread_join(ta, NULL);
    th_sleep_ms(1300); /* a's client stops listening after a second */
    before = last_activity();
    th_sleep_ms(1000);
    CHECK_EQ(last_activity(), before);
    CHECK_EQ(b.done, 0);
    CHECK_OK(dlock_release(lb));
    pthread_join(tb, NULL);
    CHECK_OK(b.rc);
    /* woken by its release, not the 60 s lease: any time far below it */
    CHECK_OP(b.took, <, 10000);
    TH_CLOSE(la, lb);
    dlock_close(a.l);
    dlock_close(b.l);
    TH_CLIENT_CLOSE(h, wa, wb);
}

TEST(a_listener_killed_mid_wait_listens_again)
{
    dlock_client *h = client(), *c = client();
    dlock *lh = th_handle(h, "relisten", 60000, 0, 0);
    waiter_arg w = {
        th_handle(c, "relisten", 60000, 0, 0), 20000, 0, 0, 0, 0, 0, 0};
    pthread_t t;

    CHECK_OK(dlock_acquire(lh, 0));
    pthread_create(&t, NULL, waiter, &w);
    wait_queued(&w);
    /* end the session that LISTENs for the waiter (its client's command
     * connection, named in its queue entry) */
    long long old = th_sql_query(&srv, NULL, 0,
                                 "SELECT min(pid) FROM dlock_locks_waiters "
                                 "WHERE name = 'relisten'::bytea");
    CHECK_OP(old, >, 0);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(pg_terminate_backend(%lld))", old),
             1);
    /* the client notices; the waiter re-arms on a new session and queues
     * again (10 s at most: a login under valgrind on a busy machine takes
     * most of a second) */
    for (int i = 0;
         i < 2000 && (th_sql_query(&srv, NULL, 0,
                                   "SELECT max(pid) FROM dlock_locks_waiters "
                                   "WHERE name = 'relisten'::bytea") == old ||
                      th_waiters(h, "relisten") != 1);
         i++)
        th_sleep_ms(5);
    CHECK_EQ(w.done, 0);
    CHECK_EQ(th_waiters(h, "relisten"), 1);
    CHECK_OP(th_sql_query(&srv, NULL, 0,
                          "SELECT max(pid) FROM dlock_locks_waiters WHERE "
                          "name = 'relisten'::bytea"),
             !=, old);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(lh));
    pthread_join(t, NULL);
    CHECK_OK(w.rc);
    CHECK_OP(th_now_ms() - t0, <, 2000); /* woken, not by the 60 s lease */
    dlock_close(lh);
    dlock_close(w.l);
    TH_CLIENT_CLOSE(h, c);
}

TEST(a_client_that_waited_goes_quiet_and_stops_listening)
{
    dlock_client *h = client(), *c = client();
    dlock *lh = th_handle(h, "idle-after", 60000, DLOCK_FAIR, 0);
    waiter_arg w = {th_handle(c, "idle-after", 60000, DLOCK_FAIR, 0),
                    20000,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0};
    pthread_t t;

    CHECK_OK(dlock_acquire(lh, 0));
    pthread_create(&t, NULL, waiter, &w);
    wait_queued(&w);
    /* the listening session holds its advisory lock (the two-int key
     * space) while it listens: that is how a release knows it is alive */
    long long lpid = th_sql_query(&srv, NULL, 0,
                                  "SELECT min(pid) FROM dlock_locks_waiters "
                                  "WHERE name = 'idle-after'::bytea");
    CHECK_OP(lpid, >, 0);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM pg_locks WHERE locktype = "
                          "'advisory' AND objsubid = 2 AND granted AND pid "
                          "= %lld",
                          lpid),
             1);
    CHECK_OK(dlock_release(lh));
    pthread_join(t, NULL);
    CHECK_OK(w.rc);
    /* nothing waits: after a second without waiters the command
     * connection stops listening (every listening session is woken by
     * every NOTIFY in the database), and then nothing is sent */
    th_sleep_ms(1500);
    long long before = last_activity();
    th_sleep_ms(1500);
    CHECK_EQ(last_activity(), before);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM pg_stat_activity WHERE "
                          "query = 'UNLISTEN *; SELECT "
                          "pg_advisory_unlock_all()'"),
             1);
    /* and its lock went with it: an entry it left would be dead */
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM pg_locks WHERE locktype = "
                          "'advisory' AND objsubid = 2 AND pid = %lld",
                          lpid),
             0);
    /* and the next wait listens again */
    CHECK_OK(dlock_acquire(lh, 0));
    w.done = w.started = 0;
    pthread_create(&t, NULL, waiter, &w);
    wait_queued(&w);
    CHECK_OK(dlock_release(lh));
    pthread_join(t, NULL);
    CHECK_OK(w.rc);
    /* woken by the release's NOTIFY, not at a lease end: far below it,
     * with room for a busy machine */
    CHECK_OP(w.took, <, 5000);
    dlock_close(lh);
    dlock_close(w.l);
    TH_CLIENT_CLOSE(h, c);
}

/* --- fair mode --- */

typedef struct fair_shared {
    int order[8];
    int pos;
    int index;
    int64_t wait;
} fair_shared;

static int fair_child(void *arg)
{
    fair_shared *s = arg;
    int me = s->index;
    dlock_client *c;
    dlock_options o;
    dlock *l;

    memset(&o, 0, sizeof(o));
    o.flags = DLOCK_FAIR;
    if (dlock_client_open(&c, srv.uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "fair", &o) != DLOCK_OK)
        return 2;
    if (dlock_acquire(l, s->wait) != DLOCK_OK) {
        fprintf(stderr, "fair child %d: %s\n", me, dlock_errmsg());
        return 3;
    }
    s->order[__atomic_fetch_add(&s->pos, 1, __ATOMIC_SEQ_CST)] = me;
    th_sleep_ms(10);
    dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

TEST(fair_waiters_stay_queued_without_refreshing)
{
    fair_shared *s = th_shared(sizeof(*s));
    dlock_client *h = client();
    dlock *lh = th_handle(h, "fair", 60000, DLOCK_FAIR, 0);
    pid_t pids[3];

    s->wait = 30000;
    CHECK_OK(dlock_acquire(lh, 0));
    for (int i = 0; i < 3; i++) {
        s->index = i;
        pids[i] = th_fork(fair_child, s);
        th_wait_waiters(h, "fair", i + 1);
    }
    /* nothing refreshes an entry: it lives as long as its waiter's
     * session, so after 5 s all three are still queued, in order */
    th_sleep_ms(5000);
    CHECK_EQ(th_waiters(h, "fair"), 3);
    CHECK_OK(dlock_release(lh));
    for (int i = 0; i < 3; i++)
        CHECK_EQ(th_wait(pids[i]), 0);
    for (int i = 0; i < 3; i++)
        CHECK_EQ(s->order[i], i);
    dlock_close(lh);
    dlock_client_close(h);
}

TEST(a_dead_fair_waiter_drops_out_of_the_queue)
{
    fair_shared *s = th_shared(sizeof(*s));
    dlock_client *h = client();
    dlock *lh = th_handle(h, "fair", 60000, DLOCK_FAIR, 0);
    pid_t dead, next;

    s->wait = 20000;
    CHECK_OK(dlock_acquire(lh, 0));
    s->index = 0;
    dead = th_fork(fair_child, s);
    for (int k = 0; k < 500 && th_waiters(h, "fair") < 1; k++)
        th_sleep_ms(10);
    s->index = 1;
    next = th_fork(fair_child, s);
    th_wait_waiters(h, "fair", 2);
    kill(dead, SIGKILL);
    CHECK_EQ(th_wait(dead), 128 + SIGKILL);
    /* its backend ends when it reads the closed socket: at once on an
     * idle machine, later on a loaded one (until then the session, and
     * so the waiter, is alive, and a release would hand it the lock) */
    th_wait_waiters(h, "fair", 1);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(lh));
    /* the head is dead: its session ended with it, so the release skips
     * its entry and hands the lock to the next at once (2 s: a hand-over
     * is a few ms; the child holds 10 ms and exits, on a busy machine) */
    CHECK_EQ(th_wait(next), 0);
    CHECK_OP(th_now_ms() - t0, <, 2000);
    CHECK_EQ(s->pos, 1);
    CHECK_EQ(s->order[0], 1);
    dlock_close(lh);
    dlock_client_close(h);
}

TEST(an_entry_whose_session_does_not_listen_is_skipped)
{
    dlock_client *h = client(), *c = client();
    dlock *lh = th_handle(h, "not-listening", 60000, DLOCK_FAIR, 0);
    waiter_arg w = {th_handle(c, "not-listening", 60000, DLOCK_FAIR, 0),
                    20000,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0};
    pthread_t t;

    CHECK_OK(dlock_acquire(lh, 0));
    /* the head of the queue names a live session that holds no key: the
     * server's checkpointer (alive, pid and start right, never listening) */
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "INSERT INTO dlock_locks_waiters (name, client, "
                          "waiter, owner, holder, ttl_ms, pid, since) SELECT "
                          "'not-listening'::bytea, repeat('0', 32), 1, "
                          "'gone:1', 'gone', 60000, pid, backend_start FROM "
                          "pg_stat_activity WHERE backend_type = "
                          "'checkpointer'"),
             1);
    pthread_create(&t, NULL, waiter, &w);
    wait_queued(&w);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(lh));
    pthread_join(t, NULL);
    CHECK_OK(w.rc);
    /* handed to the live waiter at once (2 s: a hand-over is a few ms),
     * not to the entry, whose lease (60 s) would have held it */
    CHECK_OP(th_now_ms() - t0, <, 2000);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM dlock_locks_waiters WHERE "
                          "name = 'not-listening'::bytea"),
             0);
    dlock_close(lh);
    dlock_close(w.l);
    TH_CLIENT_CLOSE(h, c);
}

/* --- hand-over (both modes) --- */

TEST(a_release_hands_the_lock_over_in_default_mode)
{
    dlock_client *h = client(), *c = client();
    dlock *lh = th_handle(h, "handover", 60000, 0, 0);
    waiter_arg w = {
        th_handle(c, "handover", 60000, 0, 0), 20000, 0, 0, 0, 0, 0, 0};
    dlock_info info;
    pthread_t t;

    w.hold = 1; /* else it may have released already when we try */
    CHECK_OK(dlock_acquire(lh, 0));
    uint64_t first = dlock_token(lh);
    pthread_create(&t, NULL, waiter, &w);
    wait_queued(&w);
    CHECK_EQ(th_waiters(h, "handover"), 1);
    /* the release gives the lock to the waiter in the same statement: the
     * releaser cannot barge back in, even at once */
    CHECK_OK(dlock_release(lh));
    CHECK_RC(dlock_acquire(lh, 0), DLOCK_EBUSY);
    __atomic_store_n(&w.let_go, 1, __ATOMIC_SEQ_CST);
    pthread_join(t, NULL);
    CHECK_OK(w.rc);
    /* handed the lock, then held until let_go: only "it did not hang" */
    CHECK_OP(w.took, <, 20000);
    /* the waiter released it: free, with a newer token than the first */
    CHECK_OK(dlock_inspect(h, "handover", &info));
    CHECK_EQ(info.held, 0);
    CHECK_OP(info.token, >, first);
    CHECK_EQ(info.waiters, 0);
    dlock_info_clear(&info);
    dlock_close(lh);
    dlock_close(w.l);
    TH_CLIENT_CLOSE(h, c);
}

TEST(a_waiter_that_gave_up_is_not_handed_the_lock)
{
    dlock_client *h = client(), *c = client();
    dlock *lh = th_handle(h, "gave-up", 60000, 0, 0);
    dlock *lc = th_handle(c, "gave-up", 60000, 0, 0);
    dlock_info info;

    CHECK_OK(dlock_acquire(lh, 0));
    CHECK_RC(dlock_acquire(lc, 300), DLOCK_EBUSY);
    CHECK_EQ(th_waiters(h, "gave-up"), 0);
    /* its client is alive and listening no more than a second: a grant
     * to its finished wait would leave the lock held by nobody */
    CHECK_OK(dlock_release(lh));
    CHECK_OK(dlock_inspect(h, "gave-up", &info));
    CHECK_EQ(info.held, 0);
    dlock_info_clear(&info);
    CHECK_OK(dlock_acquire(lc, 0));
    CHECK_OK(dlock_release(lc));
    TH_CLOSE(lh, lc);
    TH_CLIENT_CLOSE(h, c);
}

static long long dlock_sessions(void)
{
    return th_sql_query(&srv, NULL, 0,
                        "SELECT count(*) FROM pg_stat_activity WHERE "
                        "application_name LIKE 'dlock%%' AND pid <> "
                        "pg_backend_pid()");
}

TEST(a_client_keeps_one_connection_while_it_holds_or_waits)
{
    th_sleep_ms(300); /* sessions of earlier tests' clients end */
    long long base = dlock_sessions();
    dlock_client *h = client(), *c = client();
    dlock *lh = th_handle(h, "one-conn", 60000, 0, 0);
    waiter_arg w = {th_handle(c, "one-conn", 60000, DLOCK_FAIR, 0),
                    20000,
                    0,
                    0,
                    0,
                    0,
                    0,
                    0};
    pthread_t t;

    CHECK_OK(dlock_acquire(lh, 0));
    pthread_create(&t, NULL, waiter, &w);
    wait_queued(&w);
    /* the holder's client and the waiter's client: one session each (the
     * waiter's LISTENs on its command connection) */
    CHECK_EQ(dlock_sessions(), base + 2);
    CHECK_OK(dlock_release(lh));
    pthread_join(t, NULL);
    CHECK_OK(w.rc);
    th_sleep_ms(1500); /* at rest */
    CHECK_EQ(dlock_sessions(), base + 2);
    dlock_close(lh);
    dlock_close(w.l);
    TH_CLIENT_CLOSE(h, c);
}

/* --- clocks --- */

/* A holder whose wall clock is `shift` off: its lease is the server's. */
static void skewed(const char *shift, long long expect_offset)
{
    int fd;
    char line[128];
    dlock_client *c = client();
    dlock *l = th_handle(c, "skew", 0, 0, 0);
    dlock_info info;

    pid_t pid = th_skewed_holder(shift, srv.uri, "skew", 2000, -1, &fd);
    CHECK_OP(th_read_line(fd, line, sizeof(line), 15000), >, 0);
    unsigned long long token = 0;
    long long wall = 0;
    CHECK_EQ(sscanf(line, "held %llu %lld", &token, &wall), 2);
    /* the fake took effect: its clock is hours off ours */
    long long off = wall - (long long)time(NULL);
    CHECK_OP(off, >, expect_offset - 120);
    CHECK_OP(off, <, expect_offset + 120);
    CHECK_OK(dlock_inspect(c, "skew", &info));
    CHECK_EQ(info.held, 1);
    CHECK_OP(info.ttl_ms, >, 0);
    CHECK_OP(info.ttl_ms, <=, 2000);
    CHECK_OP(info.held_ms, <, 60000);
    dlock_info_clear(&info);
    /* its watchdog renews the lease correctly for several ttls */
    for (int i = 0; i < 6; i++) {
        th_sleep_ms(500);
        CHECK_RC(dlock_acquire(l, 0), DLOCK_EBUSY);
    }
    kill(pid, SIGKILL);
    th_wait(pid);
    close(fd);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_acquire(l, 10000));
    /* the killed holder's 2 s lease ends on the server's clock (its own
     * is 5 h off): at most 2 s after the kill, plus 1.5 s of slack */
    CHECK_OP(th_now_ms() - t0, <, 2000 + 1500);
    CHECK_OP(dlock_token(l), >, token);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

TEST(a_client_whose_clock_is_hours_off_gets_correct_leases)
{
    if (!th_faketime_available()) {
        printf("     (faketime not installed: apt-get install faketime)\n");
        return;
    }
    skewed("+5h", 5 * 3600);
    skewed("-5h", -5 * 3600);

    /* a client 5 h ahead cannot take over a lease that is still running */
    dlock_client *c = client();
    dlock *l = th_handle(c, "skew2", 30000, 0, 0);
    int fd;
    char line[128];
    CHECK_OK(dlock_acquire(l, 0));
    uint64_t tok = dlock_token(l);
    pid_t pid = th_skewed_holder("+5h", srv.uri, "skew2", 2000, 0, &fd);
    CHECK_EQ(th_read_line(fd, line, sizeof(line), 2500), -1);
    kill(pid, SIGKILL);
    th_wait(pid);
    close(fd);
    CHECK_EQ(dlock_held(l), 1);
    CHECK_OK(dlock_extend(l, 30000)); /* still ours in the table */
    CHECK_EQ(dlock_token(l), tok);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

/* --- the server down, back, frozen --- */

static volatile int lost_calls;

static void on_lost(dlock *l, uint64_t token, void *arg)
{
    (void)l;
    (void)token;
    (void)arg;
    __atomic_add_fetch(&lost_calls, 1, __ATOMIC_SEQ_CST);
}

static void down_and_back(const char *query)
{
    th_sql s2;
    char u[512];
    dlock_options o;
    dlock *l, *other;

    th_sql_start(&s2, "pg");
    snprintf(u, sizeof(u), "%s%s", s2.uri, query);
    dlock_client *c = th_client(u, NULL);
    memset(&o, 0, sizeof(o));
    o.ttl_ms = 1500;
    o.on_lost = on_lost;
    lost_calls = 0;
    CHECK_OK(dlock_open(&l, c, "down", &o));
    other = th_handle(c, "other", 0, 0, 0);
    CHECK_OK(dlock_acquire(l, 0));
    uint64_t tok = dlock_token(l);
    /* a waiter of another client, asleep when the server dies: it rides
     * the restart out within its wait (60 s) and gets the lock with a
     * higher token (docs/design.md, "Waiting through failovers and
     * restarts"; before, it ended DLOCK_ECONN at once) */
    dlock_client *wc = th_client(u, NULL);
    th_waiter w;
    pthread_t th;
    memset(&w, 0, sizeof(w));
    w.l = th_handle(wc, "down", 0, 0, 0);
    th_waiter_start(&w, &th);
    th_sleep_ms(300);

    th_sql_kill(&s2, SIGKILL);
    int64_t t0 = th_now_ms();
    CHECK_RC(dlock_acquire(other, 0), DLOCK_ECONN);
    CHECK_OP(th_now_ms() - t0, <, 4000); /* a try: at once */
    /* a wait the server does not come back for: its deadline, with the
     * last cause; overshoot bounded by the 1 s backoff cap and one
     * refused connect (2 s more for a busy machine) */
    t0 = th_now_ms();
    CHECK_RC(dlock_acquire(other, 700), DLOCK_ECONN);
    CHECK_OP(th_now_ms() - t0, >=, 700);
    CHECK_OP(th_now_ms() - t0, <, 3700);
    CHECK_CONTAINS(dlock_errmsg(), "until the wait's deadline");
    for (int i = 0; i < 400 && !lost_calls; i++)
        th_sleep_ms(10);
    CHECK_EQ(lost_calls, 1);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    CHECK_EQ(__atomic_load_n(&w.done, __ATOMIC_SEQ_CST), 0); /* waits on */

    th_sql_restart(&s2);
    pthread_join(th, NULL);
    CHECK_RC(w.rc, DLOCK_OK);
    CHECK_OP(w.token, >, tok);
    dlock_close(w.l);
    dlock_client_close(wc);
    CHECK_OK(dlock_acquire(l, 5000)); /* the same client, new connections */
    CHECK_OP(dlock_token(l), >, tok);
    CHECK_OK(dlock_release(l));
    TH_CLOSE(l, other);
    dlock_client_close(c);
    th_sql_kill(&s2, SIGKILL);
}

TEST(the_server_down_and_back)
{
    down_and_back("");
}

TEST(advisory_holds_end_with_the_server)
{
    /* no lease: the hold is lost the moment its session ends */
    down_and_back("?mode=advisory");
}

TEST(a_frozen_server_keeps_the_callers_deadline)
{
    th_sql s2;
    char u[512];
    th_sql_start(&s2, "pg");
    dlock_client *c = th_client(s2.uri, NULL);
    dlock *l = th_handle(c, "frozen", 0, 0, 0);
    snprintf(u, sizeof(u), "%s?timeout=500", s2.uri);
    dlock_client *q = th_client(u, NULL);
    dlock *lq = th_handle(q, "frozen-q", 0, 0, 0);

    CHECK_OK(dlock_acquire(l, 0)); /* a pooled connection exists */
    CHECK_OK(dlock_release(l));
    CHECK_OK(dlock_acquire(lq, 0));
    CHECK_OK(dlock_release(lq));
    th_sql_kill(&s2, SIGSTOP);
    int64_t t0 = th_now_ms();
    int rc = dlock_acquire(l, 300);
    int64_t took = th_now_ms() - t0;
    /* one try: ?timeout=500 bounds it, not the client's default 2 s */
    t0 = th_now_ms();
    CHECK_RC(dlock_acquire(lq, 0), DLOCK_ECONN);
    /* upper bound: the URI's 500 ms timeout, plus 1 s of slack (the
     * client's default 2 s would fail it) */
    CHECK_OP(th_now_ms() - t0, <, 1500);
    th_sql_kill(&s2, SIGCONT);
    if (rc != DLOCK_ECONN && rc != DLOCK_EBUSY)
        th_fail(__FILE__, __LINE__, "frozen: %s after %lld ms: %s",
                dlock_errname(rc), (long long)took, dlock_errmsg());
    /* the 300 ms wait, its calls cut at the deadline (not the 2 s
     * timeout), plus 1.2 s of slack */
    CHECK_OP(took, <, 1500);
    CHECK_OK(dlock_acquire(l, 5000));
    CHECK_OK(dlock_release(l));
    TH_CLOSE(l, lq);
    TH_CLIENT_CLOSE(c, q);
    th_sql_kill(&s2, SIGKILL);
}

/* --- a slow or stalled link (th_relay in front of the server) --- */

/* An acquire that timed out on the client may still reach the server and
 * run later. When it runs after a newer acquire of the same owner (the same
 * thread of the same client) succeeded, it must leave that hold alone: its
 * token, extend and release. */
TEST(a_late_timed_out_acquire_leaves_the_owners_newer_hold_alone)
{
    char u[400];
    th_relay px;

    th_relay_start(&px, srv.port);
    snprintf(u, sizeof(u),
             "postgres://dlock:dlock-secret@127.0.0.1:%d/postgres?timeout="
             "2000",
             px.port);
    dlock_client *c = th_client(u, NULL), *o = client();
    dlock *slow = th_handle(c, "late", 0, 0, 0),
          *fast = th_handle(c, "late", 20000, 0, 0);
    dlock *other = th_handle(o, "late", 0, 0, 0);

    /* c's pooled connection delivers nothing now: the try times out (the
     * URI's 2 s: time enough for the next try's new login, a SCRAM
     * exchange, even under valgrind), its statement stays on the way */
    CHECK_EQ(th_relay_hold(&px), 1);
    int64_t t0 = th_now_ms();
    CHECK_RC(dlock_acquire(slow, 0), DLOCK_ECONN);
    CHECK_OP(th_now_ms() - t0, <, 4000);
    /* the same thread again, on a new connection */
    CHECK_OK(dlock_acquire(fast, 0));
    uint64_t tok = dlock_token(fast);
    /* the late statement arrives and runs */
    CHECK_OP(th_relay_let_through(&px), >, 0);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT token FROM dlock_locks WHERE name = "
                          "'late'::bytea"),
             (long long)tok);
    CHECK_OK(dlock_extend(fast, 20000));
    CHECK_OK(dlock_release(fast));
    /* nothing is left held behind the release */
    CHECK_OK(dlock_acquire(other, 0));
    CHECK_OP(dlock_token(other), >, tok);
    CHECK_OK(dlock_release(other));
    TH_CLOSE(slow, fast, other);
    TH_CLIENT_CLOSE(c, o);
    th_relay_stop(&px);
}

/* Every statement 15 ms late (a healthy server far away): a timed wait on
 * a held lock ends DLOCK_EBUSY (the wait ran out), not DLOCK_ECONN, in
 * every mode. */
TEST(a_timed_wait_on_a_slow_link_ends_busy_not_unreachable)
{
    static const unsigned modes[] = {0, DLOCK_FAIR};
    char u[400];
    th_relay px;

    th_relay_start(&px, srv.port);
    __atomic_store_n(&px.delay_ms, 15, __ATOMIC_SEQ_CST);
    for (int adv_mode = 0; adv_mode < 2; adv_mode++) {
        snprintf(u, sizeof(u),
                 "postgres://dlock:dlock-secret@127.0.0.1:%d/postgres%s",
                 px.port, adv_mode ? "?mode=advisory" : "");
        dlock_client *c = th_client(u, NULL);
        dlock_client *h = th_client(adv_mode ? adv : srv.uri, NULL);
        dlock *lh = th_handle(h, "slow-link", 0, 0, 0);
        CHECK_OK(dlock_acquire(lh, 0));
        for (int m = 0; m < 2; m++) {
            dlock *l = th_handle(c, "slow-link", 0, modes[m], 0);
            CHECK_RC(dlock_acquire(l, 0), DLOCK_EBUSY); /* the link works */
            int64_t t0 = th_now_ms();
            int rc = dlock_acquire(l, 300);
            int64_t took = th_now_ms() - t0;
            if (rc != DLOCK_EBUSY)
                th_fail(__FILE__, __LINE__, "%s%s wait: %s after %lld ms (%s)",
                        adv_mode ? "advisory " : "",
                        modes[m] ? "fair" : "default", dlock_errname(rc),
                        (long long)took, dlock_errmsg());
            /* lower bound: never before the deadline (10 ms for the
             * rounding); upper bound: the wait, a statement cut at the
             * deadline, 2 s of slack for a busy machine */
            CHECK_OP(took, >=, 290);
            CHECK_OP(took, <, 2500);
            dlock_close(l);
        }
        CHECK_OK(dlock_release(lh));
        dlock_close(lh);
        TH_CLIENT_CLOSE(c, h);
    }
    th_relay_stop(&px);
}

/* --- connections, auth, URIs --- */

TEST(auth_privileges_and_bad_uris)
{
    static const char *const bad[] = {
        "?mode=session", "?table=", "?timeout=0", "?timeout=x",
        "?color=blue",
        "?table=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", NULL};
    char u[1200];
    dlock_client *c = NULL;

    snprintf(u, sizeof(u), "postgres://dlock:wrong-pass-77@127.0.0.1:%d/"
                           "postgres",
             srv.port);
    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_EAUTH);
    CHECK(strstr(dlock_errmsg(), "wrong-pass-77") == NULL);
    CHECK_CONTAINS(dlock_errmsg(), "***");
    for (int i = 0; bad[i]; i++) {
        snprintf(u, sizeof(u), "%s%s", srv.uri, bad[i]);
        CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_EINVAL);
    }
    CHECK_RC(dlock_client_open(&c, "postgres://", NULL), DLOCK_EINVAL);
    snprintf(u, sizeof(u), "postgres://dlock:x@127.0.0.1:%d/postgres",
             th_free_port());
    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_ECONN);

    /* a user with DML rights only: the existing table is enough; a missing
     * one cannot be made, and the message says what to do */
    th_sql_query(&srv, NULL, 0,
                 "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE "
                 "rolname = 'app') THEN CREATE ROLE app LOGIN PASSWORD "
                 "'app-pass'; END IF; END $$");
    th_sql_query(&srv, NULL, 0,
                 "REVOKE CREATE ON SCHEMA public FROM PUBLIC; GRANT SELECT, "
                 "INSERT, UPDATE, DELETE ON dlock_locks, dlock_locks_waiters "
                 "TO app; GRANT USAGE ON dlock_locks_tokens, "
                 "dlock_locks_waiters_seq_seq TO app");
    snprintf(u, sizeof(u), "postgres://app:app-pass@127.0.0.1:%d/postgres",
             srv.port);
    c = th_client(u, NULL);
    dlock *l = th_handle(c, "app", 0, 0, 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
    c = NULL;
    snprintf(u, sizeof(u),
             "postgres://app:app-pass@127.0.0.1:%d/postgres?table=nope",
             srv.port);
    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_EAUTH);
    CHECK_CONTAINS(dlock_errmsg(), "docs/stores.md");
}

TEST(a_unix_socket_and_a_dead_first_host)
{
    char u[1200];

    /* ?host=DIR: libpq's Unix socket directory */
    dlock_client *c = NULL;
    snprintf(u, sizeof(u), "postgres://dlock@127.0.0.1:%d/postgres?host=%s",
             srv.port, srv.dir);
    c = th_client(u, NULL);
    dlock *l = th_handle(c, "socket", 0, 0, 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM pg_stat_activity WHERE "
                          "application_name LIKE 'dlock%%' AND client_port "
                          "= -1"),
             1);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);

    /* two hosts: the first refuses, libpq goes on to the second */
    snprintf(u, sizeof(u),
             "postgres://dlock:dlock-secret@127.0.0.1:%d,127.0.0.1:%d/"
             "postgres",
             th_free_port(), srv.port);
    c = th_client(u, NULL);
    l = th_handle(c, "twohosts", 0, 0, 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

TEST(tls_verifies_the_server)
{
    char dir[600], cert[700], key[700], ca[700], u[2048];
    th_sql s2;
    dlock_client *c = NULL;

    snprintf(dir, sizeof(dir), "%s/pgtls", th_tmpdir());
    mkdir(dir, 0755);
    th_make_cert(dir, "srv");
    snprintf(cert, sizeof(cert), "%s/srv.pem", dir);
    snprintf(key, sizeof(key), "%s/srv.key", dir);
    snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
    th_sql_start_tls(&s2, "pg", cert, key);
    /* the TLS handshake (certificate checks, key exchange) runs through
     * OpenSSL in this process: under valgrind it alone came near the
     * client's 2 s timeout (make valgrind failed once here on "no answer
     * in time"). What is checked is the verification, not the time: 20 s
     * there */
    const char *tmo = getenv("DLOCK_UNDER_VALGRIND") ? "&timeout=20000" : "";
    snprintf(u, sizeof(u), "%s?sslmode=verify-full&sslrootcert=%s%s", s2.uri,
             ca, tmo);
    c = th_client(u, NULL);
    dlock *l = th_handle(c, "tls", 0, 0, 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OP(th_sql_query(&s2, NULL, 0,
                          "SELECT count(*) FROM pg_stat_ssl s JOIN "
                          "pg_stat_activity a USING (pid) WHERE s.ssl AND "
                          "a.application_name LIKE 'dlock%%'"),
             >=, 1);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
    c = NULL;
    /* a CA that did not sign the server's certificate: refused */
    snprintf(dir, sizeof(dir), "%s/pgtls-other", th_tmpdir());
    mkdir(dir, 0755);
    th_make_cert(dir, "x");
    snprintf(u, sizeof(u), "%s?sslmode=verify-full&sslrootcert=%s/ca.pem%s",
             s2.uri, dir, tmo);
    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_ECONN);
    CHECK_CONTAINS(dlock_errmsg(), "certificate");
    /* TLS required from a server without it */
    snprintf(u, sizeof(u), "%s?sslmode=require%s", srv.uri, tmo);
    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_ECONN);
    CHECK_CONTAINS(dlock_errmsg(), "SSL");
    th_sql_kill(&s2, SIGKILL);
}

/* --- advisory mode --- */

TEST(advisory_locks_exclude_plain_sql_advisory_locks)
{
    dlock_client *c = th_client(adv, NULL);
    dlock *l = th_handle(c, "shared-key", 0, 0, 0);
    dlock_info info;

    /* dlock holds: SQL on the same key cannot take it */
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT pg_try_advisory_lock(" KEY_SQL(
                              "shared-key") ")"),
             0);
    CHECK_OK(dlock_release(l));

    /* another program holds the key (a session kept open by a forked
     * psql): dlock waits for it, and status names it as not dlock's */
    char cmd[1200];
    snprintf(cmd, sizeof(cmd),
             "psql -X -q -h '%s' -p %d -U dlock postgres -c \"SELECT "
             "pg_advisory_lock(('x' || substr(md5('shared-key'::bytea), 1, "
             "16))::bit(64)::bigint), pg_sleep(3)\" >/dev/null 2>&1 &",
             srv.dir, srv.port);
    CHECK_EQ(system(cmd), 0);
    int i;
    for (i = 0; i < 200; i++) {
        CHECK_OK(dlock_inspect(c, "shared-key", &info));
        int held = info.held;
        dlock_info_clear(&info);
        if (held)
            break;
        th_sleep_ms(20);
    }
    CHECK_OP(i, <, 200);
    CHECK_OK(dlock_inspect(c, "shared-key", &info));
    CHECK_CONTAINS(info.holder, "psql");
    CHECK_EQ(info.token, 0);
    dlock_info_clear(&info);
    CHECK_RC(dlock_acquire(l, 0), DLOCK_EBUSY);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_acquire(l, 10000)); /* when psql's session ends */
    CHECK_OP(th_now_ms() - t0, >, 500);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

typedef struct adv_shared {
    int order[8];
    int pos;
    int index;
} adv_shared;

static int adv_child(void *arg)
{
    adv_shared *s = arg;
    int me = s->index;
    dlock_client *c;
    dlock *l;

    if (dlock_client_open(&c, adv, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "adv-queue", NULL) != DLOCK_OK ||
        dlock_acquire(l, 20000) != DLOCK_OK)
        return 2;
    s->order[__atomic_fetch_add(&s->pos, 1, __ATOMIC_SEQ_CST)] = me;
    th_sleep_ms(10);
    dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

TEST(advisory_waiters_queue_in_the_server_in_order)
{
    adv_shared *s = th_shared(sizeof(*s));
    dlock_client *h = th_client(adv, NULL);
    dlock *lh = th_handle(h, "adv-queue", 0, 0, 0);
    dlock_info info;
    pid_t pids[4];
    char want[64];

    CHECK_OK(dlock_acquire(lh, 0));
    for (int i = 0; i < 4; i++) {
        s->index = i;
        pids[i] = th_fork(adv_child, s);
        th_wait_waiters(h, "adv-queue", i + 1);
    }
    /* each waiter's session waits on the lock in the server: no polling */
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM pg_stat_activity WHERE "
                          "wait_event_type = 'Lock' AND wait_event = "
                          "'advisory'"),
             4);
    CHECK_OK(dlock_inspect(h, "adv-queue", &info));
    CHECK_EQ(info.held, 1);
    snprintf(want, sizeof(want), "pid %d ", (int)getpid());
    CHECK_CONTAINS(info.holder, want);
    CHECK_EQ(info.token, dlock_token(lh));
    CHECK_EQ(info.queue_len, 4);
    for (int i = 0; i < 4 && i < (int)info.queue_len; i++) {
        snprintf(want, sizeof(want), "pid %d ", (int)pids[i]);
        CHECK_CONTAINS(info.queue[i], want);
    }
    dlock_info_clear(&info);
    CHECK_OK(dlock_release(lh));
    for (int i = 0; i < 4; i++)
        CHECK_EQ(th_wait(pids[i]), 0);
    for (int i = 0; i < 4; i++)
        CHECK_EQ(s->order[i], i);
    dlock_close(lh);
    dlock_client_close(h);
}

TEST(an_advisory_wait_ends_at_its_deadline_leaving_nothing)
{
    dlock_client *h = th_client(adv, NULL), *c = th_client(adv, NULL);
    dlock *lh = th_handle(h, "adv-timeout", 0, 0, 0);
    dlock *l = th_handle(c, "adv-timeout", 0, 0, 0);

    CHECK_OK(dlock_acquire(lh, 0));
    int64_t t0 = th_now_ms();
    CHECK_RC(dlock_acquire(l, 400), DLOCK_EBUSY);
    int64_t took = th_now_ms() - t0;
    /* lower bound: never before the deadline (20 ms for the rounding);
     * upper bound: the wait (the server ends it: lock_timeout), 1.6 s of
     * slack for a busy machine */
    CHECK_OP(took, >=, 380);
    CHECK_OP(took, <, 2000);
    CHECK_EQ(th_waiters(h, "adv-timeout"), 0);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM pg_locks WHERE locktype = "
                          "'advisory' AND NOT granted"),
             0);
    CHECK_OK(dlock_release(lh));
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    /* gc: an advisory store keeps nothing per name */
    uint64_t n = 7;
    CHECK_RC(dlock_gc(c, 0, &n), DLOCK_ENOTSUP);
    TH_CLOSE(lh, l);
    TH_CLIENT_CLOSE(h, c);
}

/* A cancel the server drops: PostgreSQL ignores a cancel request that
 * reaches a session while it still reads its next statement. The waiting
 * session's backend is frozen (SIGSTOP) while the wait's statement and
 * the cancel arrive, so that the cancel finds it reading; thawed, it runs
 * the wait. The wait still ends, within ?timeout= (1 s) of the cancel:
 * its session is given up, and the server lets go of it once the lock
 * would have come to it. (Before, it waited until the holder released.) */
TEST(an_advisory_wait_whose_cancel_the_server_drops_still_ends)
{
    const char *others = "SELECT %s FROM pg_stat_activity WHERE "
                         "backend_type = 'client backend' AND pid <> "
                         "pg_backend_pid()%s%s%s";
    char before[1024], uri[500];
    dlock_client *h = th_client(adv, NULL);
    dlock *lh = th_handle(h, "adv-lost-cancel", 0, 0, 0);

    CHECK_OK(dlock_acquire(lh, 0));
    th_sql_query(&srv, before, sizeof(before), others,
                 "coalesce(string_agg(pid::text, ','), '0')", "", "", "");
    snprintf(uri, sizeof(uri), "%s&timeout=1000", adv);
    dlock_client *c = th_client(uri, NULL);
    dlock *l = th_handle(c, "adv-lost-cancel", 0, 0, 0);
    /* c's one session (its command connection, made at open), which the
     * wait takes */
    CHECK_EQ(th_sql_query(&srv, NULL, 0, others, "count(*)",
                          " AND pid NOT IN (", before, ")"),
             1);
    pid_t pid = (pid_t)th_sql_query(&srv, NULL, 0, others, "pid",
                                    " AND pid NOT IN (", before, ")");
    CHECK_OP(pid, >, 0);
    CHECK_OK(kill(pid, SIGSTOP));
    th_waiter w = {.l = l, .wait_ms = -1};
    pthread_t th;
    th_waiter_start(&w, &th);
    for (int i = 0; i < 200 && !__atomic_load_n(&w.started, __ATOMIC_SEQ_CST);
         i++)
        th_sleep_ms(5);
    th_sleep_ms(500); /* its statement sent, unread by the frozen backend */
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_cancel(l));
    th_sleep_ms(300); /* the cancel request at the server, held there */
    CHECK_OK(kill(pid, SIGCONT));
    /* ?timeout= (1 s) after the cancel, 5 s of slack for a busy machine;
     * a wait the dropped cancel did not end lasts until the release */
    int returned = th_waiter_returned(&w, 6000);
    CHECK(returned);
    CHECK_EQ(w.rc, DLOCK_ECANCELED);
    CHECK_OP(w.done_at - t0, <, 6000);
    CHECK_OK(dlock_release(lh));
    pthread_join(th, NULL);
    /* the given-up session lets go when the lock reaches it: the lock is
     * free for a new wait at once (its bound: a busy machine) */
    CHECK_OK(dlock_acquire(lh, 10000));
    CHECK_OK(dlock_release(lh));
    TH_CLOSE(lh, l);
    TH_CLIENT_CLOSE(h, c);
}

/* --- operating: dlock_list() and dlock_break() (docs/monitoring.md) --- */

/* The locks a listing of prefix pfx finds through every page of `limit`
 * (held ones, or every row with DLOCK_LIST_FREE): checked to come in
 * byte order, each once, at most `limit` a page; *pages and *empty (pages
 * with no lock but a cursor) counted. Returns how many. */
static size_t list_count(dlock_client *c, const char *pfx, size_t limit,
                         unsigned flags, size_t *pages, size_t *empty)
{
    char *cursor = NULL, last[600] = "";
    size_t n = 0;

    *pages = *empty = 0;
    for (;;) {
        dlock_list_page p;
        CHECK_OK(dlock_list(c, pfx, cursor, limit, flags, &p));
        free(cursor);
        cursor = NULL;
        (*pages)++;
        CHECK_OP(p.n, <=, limit);
        *empty += p.n == 0 && p.next;
        for (size_t i = 0; i < p.n; i++) {
            CHECK_OP(strcmp(p.locks[i].name, last), >, 0);
            snprintf(last, sizeof(last), "%s", p.locks[i].name);
            CHECK(!strncmp(p.locks[i].name, pfx, strlen(pfx)));
            n++;
        }
        if (p.next)
            cursor = strdup(p.next);
        dlock_list_clear(&p);
        if (!cursor)
            break;
        CHECK_OP(*pages, <, 1000); /* a cursor that never ends */
    }
    return n;
}

/* A page looks at a bounded number of rows (8 per lock asked, at least
 * 1000): a table of many free rows among a few held ones is listed in
 * more pages, some with no lock but a cursor, never in one statement
 * that reads the whole table; every held lock is listed once, in byte
 * order, with its token; DLOCK_LIST_FREE lists every row. */
TEST(list_pages_a_big_table_in_bounded_pages)
{
    static const int held[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 2000, 3500,
                               4999};
    enum { N = sizeof(held) / sizeof(held[0]), ROWS = 5000 };
    dlock_client *a = client(), *b = client();
    dlock *ls[N];
    char name[32];
    size_t pages, empty;

    /* free rows, as earlier holds leave them */
    th_sql_query(&srv, NULL, 0,
                 "INSERT INTO dlock_locks (name, lock_until) SELECT ('big/' "
                 "|| lpad(i::text, 4, '0'))::bytea, clock_timestamp() FROM "
                 "generate_series(0, %d) i ON CONFLICT DO NOTHING",
                 ROWS - 1);
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "big/%04d", held[i]);
        ls[i] = th_handle(a, name, 0, 0, 0);
        CHECK_OK(dlock_acquire(ls[i], 0));
    }
    /* 13 locks in pages of 5 would be 3 pages; 5000 rows looked at 1000
     * a page take 5 more, some of them empty */
    CHECK_EQ(list_count(b, "big/", 5, 0, &pages, &empty), N);
    CHECK_OP(pages, >=, 5);
    CHECK_OP(pages, <=, 12);
    CHECK_OP(empty, >=, 1);
    /* and each entry is its lock */
    dlock_list_page p;
    CHECK_OK(dlock_list(b, "big/", NULL, N, 0, &p));
    CHECK_EQ(p.n, 10); /* the first 1000 rows hold the first ten */
    for (size_t i = 0; i < p.n; i++) {
        snprintf(name, sizeof(name), "big/%04d", held[i]);
        CHECK_STR(p.locks[i].name, name);
        CHECK_EQ(p.locks[i].info.held, 1);
        CHECK_EQ(p.locks[i].info.token, dlock_token(ls[i]));
        CHECK_EQ(p.locks[i].info.holders, 1);
    }
    dlock_list_clear(&p);
    /* every row: pages of 1000 (a page of free rows looks at no more) */
    CHECK_EQ(list_count(b, "big/", 1000, DLOCK_LIST_FREE, &pages, &empty),
             ROWS);
    CHECK_OP(pages, <=, 6);
    th_release_close(ls, N);
    CHECK_EQ(list_count(b, "big/", 100, 0, &pages, &empty), 0);
    th_sql_query(&srv, NULL, 0,
                 "DELETE FROM dlock_locks WHERE name LIKE 'big/%%'");
    TH_CLIENT_CLOSE(a, b);
}

/* A cursor is "pg:" and the hex of the last name listed: anything else is
 * DLOCK_EINVAL with a message, never a crash or a wrong page; a cursor
 * resumes right after its name. */
TEST(list_cursors_are_checked_and_resume_past_their_name)
{
    static const char *const bad[] = {
        "pg:",  "pg:6",  "pg:zz",   "pg:6G",     "pg:ABCD", "PG:6162",
        "6162", "pg: 6162", "pg:61 62", "pg:-1", "x", NULL};
    dlock_client *a = client(), *b = client();
    dlock *la = th_handle(a, "cur/a", 0, 0, 0),
          *lb = th_handle(a, "cur/b", 0, 0, 0),
          *lc = th_handle(a, "cur/c", 0, 0, 0);
    dlock_list_page p;
    char big[3 + 2 * 2046 + 1];

    for (int i = 0; bad[i]; i++) {
        CHECK_RC(dlock_list(b, NULL, bad[i], 10, 0, &p), DLOCK_EINVAL);
        CHECK_CONTAINS(dlock_errmsg(), "cursor");
        CHECK_EQ(p.n, 0);
    }
    /* the longest cursor this store makes: a position past every name */
    memcpy(big, "pg:", 3);
    memset(big + 3, 'f', 2 * 2046);
    big[sizeof(big) - 1] = '\0';
    CHECK_OK(dlock_list(b, NULL, big, 10, DLOCK_LIST_FREE, &p));
    CHECK_EQ(p.n, 0);
    CHECK(p.next == NULL);
    dlock_list_clear(&p);
    CHECK_OK(dlock_acquire(la, 0));
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OK(dlock_acquire(lc, 0));
    /* "cur/b" is 63 75 72 2f 62 */
    CHECK_OK(dlock_list(b, "cur/", "pg:6375722f62", 10, 0, &p));
    CHECK_EQ(p.n, 1);
    if (p.n == 1)
        CHECK_STR(p.locks[0].name, "cur/c");
    CHECK(p.next == NULL);
    dlock_list_clear(&p);
    /* pages of one: each cursor is the page's last name */
    CHECK_OK(dlock_list(b, "cur/", NULL, 1, 0, &p));
    CHECK_EQ(p.n, 1);
    CHECK(p.next != NULL);
    if (p.next)
        CHECK_STR(p.next, "pg:6375722f61");
    dlock_list_clear(&p);
    CHECK_OK(dlock_release(la));
    CHECK_OK(dlock_release(lb));
    CHECK_OK(dlock_release(lc));
    TH_CLOSE(la, lb, lc);
    TH_CLIENT_CLOSE(a, b);
}

/* A listed lock is what dlock_inspect() says of it: holder, token,
 * holders, the queue in order with each waiter's description (one
 * statement for the page: the queue comes with its lock). */
TEST(a_listed_lock_is_described_as_inspect_describes_it)
{
    dlock_client *h = client(), *w1 = client(), *w2 = client(),
                 *op = client();
    dlock *lh = th_handle(h, "desc/x", 30000, 0, 0);
    waiter_arg a = {
        th_handle(w1, "desc/x", 30000, 0, 0), 20000, 0, 0, 0, 0, 0, 0};
    waiter_arg b = {
        th_handle(w2, "desc/x", 30000, 0, 0), 20000, 0, 0, 0, 0, 0, 0};
    pthread_t ta, tb;
    dlock_list_page p;
    dlock_info in;

    CHECK_OK(dlock_acquire(lh, 0));
    pthread_create(&ta, NULL, waiter, &a);
    th_wait_waiters(op, "desc/x", 1);
    pthread_create(&tb, NULL, waiter, &b);
    th_wait_waiters(op, "desc/x", 2);
    CHECK_OK(dlock_list(op, "desc/", NULL, 10, 0, &p));
    CHECK_OK(dlock_inspect(op, "desc/x", &in));
    CHECK_EQ(p.n, 1);
    if (p.n == 1) {
        dlock_info *l = &p.locks[0].info;
        CHECK_STR(p.locks[0].name, "desc/x");
        CHECK_EQ(l->held, in.held);
        CHECK_STR(l->holder, in.holder);
        CHECK_EQ(l->token, in.token);
        CHECK_EQ(l->token, dlock_token(lh));
        CHECK_EQ(l->holders, 1);
        CHECK_EQ(l->shared, 0);
        CHECK_EQ(l->permits, 0);
        CHECK_EQ(l->waiters, 2);
        CHECK_EQ(l->queue_len, in.queue_len);
        for (size_t i = 0; i < l->queue_len && i < in.queue_len; i++)
            CHECK_STR(l->queue[i], in.queue[i]);
        /* read a moment apart: the lease's and the hold's clocks agree
         * within the time between the two statements (2 s: busy) */
        CHECK_OP(l->ttl_ms, >, 0);
        CHECK_OP(llabs(l->ttl_ms - in.ttl_ms), <, 2000);
        CHECK_OP(llabs(l->held_ms - in.held_ms), <, 2000);
    }
    dlock_list_clear(&p);
    dlock_info_clear(&in);
    CHECK_OK(dlock_release(lh));
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CHECK_OK(a.rc);
    CHECK_OK(b.rc);
    dlock_close(lh);
    dlock_close(a.l);
    dlock_close(b.l);
    TH_CLIENT_CLOSE(h, w1, w2, op);
}

/* A table made by the version before dlock_break() has no T_break: the
 * first break of a client adds it (any user that may create functions);
 * one that may not gets DLOCK_EAUTH saying what to do, and nothing held
 * is touched. Opening such a table needs nothing new. */
TEST(a_break_on_a_table_of_an_earlier_version_adds_its_function)
{
    char u[600];

    snprintf(u, sizeof(u), "%s?table=brk_old", srv.uri);
    dlock_client *a = th_client(u, NULL);
    dlock *la = th_handle(a, "x", 30000, 0, 0),
          *ly = th_handle(a, "y", 30000, 0, 0);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT to_regproc('brk_old_break') IS NOT NULL"),
             1);
    th_sql_query(&srv, NULL, 0, "DROP FUNCTION brk_old_break");
    CHECK_OK(dlock_acquire(la, 0));
    uint64_t t = dlock_token(la);
    dlock_client *b = th_client(u, NULL); /* opens as before */
    dlock_info ev;
    CHECK_OK(dlock_break(b, "x", &ev));
    CHECK_EQ(ev.token, t);
    dlock_info_clear(&ev);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT to_regproc('brk_old_break') IS NOT NULL"),
             1);
    CHECK_RC(dlock_release(la), DLOCK_ELOST);
    dlock_client_close(b);

    /* a user with DML rights only */
    th_sql_query(&srv, NULL, 0,
                 "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE "
                 "rolname = 'brkapp') THEN CREATE ROLE brkapp LOGIN "
                 "PASSWORD 'brkapp-pass'; END IF; END $$");
    th_sql_query(&srv, NULL, 0,
                 "REVOKE CREATE ON SCHEMA public FROM PUBLIC; GRANT SELECT, "
                 "INSERT, UPDATE, DELETE ON brk_old, brk_old_waiters TO "
                 "brkapp; GRANT USAGE ON brk_old_tokens, "
                 "brk_old_waiters_seq_seq TO brkapp");
    th_sql_query(&srv, NULL, 0, "DROP FUNCTION brk_old_break");
    CHECK_OK(dlock_acquire(ly, 0));
    snprintf(u, sizeof(u),
             "postgres://brkapp:brkapp-pass@127.0.0.1:%d/postgres?table="
             "brk_old",
             srv.port);
    dlock_client *c = th_client(u, NULL);
    CHECK_RC(dlock_break(c, "y", &ev), DLOCK_EAUTH);
    CHECK_CONTAINS(dlock_errmsg(), "brk_old_break");
    CHECK_CONTAINS(dlock_errmsg(), "table's owner");
    CHECK_EQ(ev.held, 0); /* nothing said of it: the core clears it */
    CHECK_EQ(dlock_held(ly), 1);
    CHECK_OK(dlock_extend(ly, 30000));
    /* the owner's break adds it, and then the user's works */
    snprintf(u, sizeof(u), "%s?table=brk_old", srv.uri);
    b = th_client(u, NULL);
    CHECK_RC(dlock_break(b, "nobody-holds-it", NULL), DLOCK_ENOTHELD);
    dlock_client_close(b);
    CHECK_OK(dlock_break(c, "y", NULL));
    CHECK_RC(dlock_release(ly), DLOCK_ELOST);
    dlock_client_close(c);
    TH_CLOSE(la, ly);
    dlock_client_close(a);
}

typedef struct handed {
    dlock *l;
    int64_t wait;
    volatile int rc, rel, got;
    uint64_t token;
    volatile int go;
} handed;

/* Acquires (its wait queued), holds until go, releases: rc, rel. */
static void *handed_thread(void *arg)
{
    handed *h = arg;

    h->rc = dlock_acquire(h->l, h->wait);
    h->token = dlock_token(h->l);
    __atomic_store_n(&h->got, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; h->rc == DLOCK_OK && i < 4000 &&
                    !__atomic_load_n(&h->go, __ATOMIC_SEQ_CST);
         i++)
        th_sleep_ms(5);
    h->rel = h->rc == DLOCK_OK ? dlock_release(h->l) : h->rc;
    return NULL;
}

typedef struct breaking {
    dlock_client *op;
    const char *name;
    int delay_ms;
    int rc;
    dlock_info ev;
} breaking;

static void *break_thread(void *arg)
{
    breaking *b = arg;

    if (b->delay_ms)
        th_sleep_ms(b->delay_ms);
    b->rc = dlock_break(b->op, b->name, &b->ev);
    return NULL;
}

/* The holder's release hands the lock to the queued waiter while an
 * operator breaks it: the release and the break lock the row in turn, so
 * the break evicts exactly one of them: the holder (its release is
 * ELOST, the break grants the waiter), or the waiter it was handed to
 * (the release is OK, the waiter's own release ELOST). Never both, never
 * neither. A hand-over is the waiter's only once its read of the row
 * confirmed it (the notification alone decides nothing): one evicted
 * before that finds the waiter still waiting, and the waiter then takes
 * the freed row anew, a hold of its own with a higher token that
 * stands. */
TEST(a_break_racing_a_hand_over_evicts_exactly_one_holder)
{
    dlock_client *a = client(), *b = client(), *op = client();
    dlock *la = th_handle(a, "handbrk", 30000, 0, 0);
    int first = 0, second = 0, retaken = 0;

    for (int i = 0; i < 12; i++) {
        handed w = {
            th_handle(b, "handbrk", 30000, 0, 0), 20000, 0, 0, 0, 0, 0};
        breaking k = {op, "handbrk", i % 3, 0, {0}};
        pthread_t tw, tk;
        CHECK_OK(dlock_acquire(la, 5000));
        uint64_t ta = dlock_token(la);
        pthread_create(&tw, NULL, handed_thread, &w);
        th_wait_waiters(op, "handbrk", 1);
        pthread_create(&tk, NULL, break_thread, &k);
        if (i % 2)
            th_sleep_ms(i % 4);
        int rel = dlock_release(la);
        pthread_join(tk, NULL);
        (void)th_wait_flag(&w.got, 10000);
        __atomic_store_n(&w.go, 1, __ATOMIC_SEQ_CST);
        pthread_join(tw, NULL);
        CHECK_OK(k.rc); /* someone held it all along */
        CHECK_OK(w.rc);
        CHECK_OP(w.token, >, ta);
        if (k.ev.token == ta) {
            first++;
            CHECK_RC(rel, DLOCK_ELOST);
            CHECK_OK(w.rel);
        } else if (w.token > k.ev.token) {
            retaken++; /* evicted before the waiter confirmed it */
            CHECK_OK(rel);
            CHECK_OK(w.rel);
        } else {
            second++;
            CHECK_EQ(k.ev.token, w.token);
            CHECK_OK(rel);
            CHECK_RC(w.rel, DLOCK_ELOST);
        }
        dlock_info_clear(&k.ev);
        dlock_close(w.l);
    }
    printf("     the holder evicted %d times, the waiter handed it %d, the "
           "hand-over evicted before the waiter confirmed it (and the row "
           "retaken) %d\n",
           first, second, retaken);
    dlock_close(la);
    TH_CLIENT_CLOSE(a, b, op);
}

typedef struct frozen {
    volatile int ready, lost;
    uint64_t token;
    int rc;
} frozen;

static void frozen_lost(dlock *l, uint64_t token, void *arg)
{
    frozen *f = arg;

    (void)l;
    (void)token;
    __atomic_store_n(&f->lost, 1, __ATOMIC_SEQ_CST);
}

/* The holder: ttl 3 s (renewed every second); waits (20 s at most) for
 * its loss, then releases: 0 when it was told (callback, ELOST). */
static int frozen_child(void *arg)
{
    frozen *f = arg;
    dlock_client *c = NULL;
    dlock_options o;
    dlock *l = NULL;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = 3000;
    o.on_lost = frozen_lost;
    o.on_lost_arg = f;
    if (dlock_client_open(&c, srv.uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "frozen-holder", &o) != DLOCK_OK ||
        dlock_acquire(l, 0) != DLOCK_OK)
        return 2;
    f->token = dlock_token(l);
    __atomic_store_n(&f->ready, 1, __ATOMIC_SEQ_CST);
    (void)th_wait_flag(&f->lost, 20000);
    f->rc = dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
    return f->lost && f->rc == DLOCK_ELOST ? 0 : 1;
}

/* The holder is frozen (SIGSTOP) when the lock is broken, and thawed
 * well within its lease: the next holder takes the lock at once; the
 * thawed holder's next renewal finds the row gone (DLOCK_ENOTHELD) and
 * it learns of the loss (callback, ELOST); the new holder is untouched. */
TEST(an_evicted_holder_frozen_learns_it_when_thawed)
{
    frozen *f = th_shared(sizeof(*f));
    dlock_client *op = client(), *b = client();
    dlock *lb = th_handle(b, "frozen-holder", 30000, 0, 0);
    dlock_info ev;

    pid_t child = th_fork(frozen_child, f);
    (void)th_wait_flag(&f->ready, 10000);
    CHECK(f->ready);
    kill(child, SIGSTOP);
    CHECK_OK(dlock_break(op, "frozen-holder", &ev));
    CHECK_EQ(ev.token, f->token);
    char want[32];
    snprintf(want, sizeof(want), "pid %d ", (int)child);
    CHECK_CONTAINS(ev.holder, want);
    dlock_info_clear(&ev);
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OP(dlock_token(lb), >, f->token);
    th_sleep_ms(300);
    kill(child, SIGCONT);
    /* the child's renewal is due within a second of its thaw (ttl/3);
     * it waits 20 s at most for the loss */
    CHECK_EQ(th_wait(child), 0);
    CHECK_EQ(dlock_held(lb), 1);
    CHECK_OK(dlock_inspect(op, "frozen-holder", &ev));
    CHECK_EQ(ev.token, dlock_token(lb));
    dlock_info_clear(&ev);
    CHECK_OK(dlock_release(lb));
    dlock_close(lb);
    TH_CLIENT_CLOSE(op, b);
}

typedef struct lost_at {
    volatile int64_t at;
    uint64_t token;
} lost_at;

static void note_lost(dlock *l, uint64_t token, void *arg)
{
    lost_at *x = arg;

    (void)l;
    x->token = token;
    __atomic_store_n(&x->at, th_now_ms(), __ATOMIC_SEQ_CST);
}

/* Advisory mode: the break ends the holder's session, and only that
 * session: another hold of the same client (another session) stays; the
 * server grants the lock to its waiter as the session ends; the holder's
 * client sees its connection close and reports the hold lost at once,
 * naming why. */
TEST(an_advisory_break_ends_only_the_holders_session)
{
    lost_at x = {0, 0};
    dlock_client *a = th_client(adv, NULL), *w = th_client(adv, NULL),
                 *op = th_client(adv, NULL);
    dlock_options o;
    dlock *l1, *l2 = th_handle(a, "advb-2", 0, 0, 0);
    waiter_arg wa = {th_handle(w, "advb-1", 0, 0, 0), 20000, 0, 0, 0, 0, 0, 0};
    pthread_t t;
    dlock_info ev;

    memset(&o, 0, sizeof(o));
    o.on_lost = note_lost;
    o.on_lost_arg = &x;
    CHECK_OK(dlock_open(&l1, a, "advb-1", &o));
    CHECK_OK(dlock_acquire(l1, 0));
    CHECK_OK(dlock_acquire(l2, 0));
    uint64_t t1 = dlock_token(l1);
    pthread_create(&t, NULL, waiter, &wa);
    th_wait_waiters(op, "advb-1", 1);
    long long before = th_sql_query(&srv, NULL, 0,
                                    "SELECT count(*) FROM pg_stat_activity "
                                    "WHERE application_name LIKE 'dlock%%'");
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_break(op, "advb-1", &ev));
    CHECK_EQ(ev.held, 1);
    CHECK_EQ(ev.token, t1);
    CHECK_EQ(ev.holders, 1);
    CHECK_EQ(ev.waiters, 1);
    CHECK_CONTAINS(ev.holder, "pid");
    dlock_info_clear(&ev);
    /* one session fewer: the evicted holder's (PostgreSQL 14+: the break
     * returns once it is gone) */
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM pg_stat_activity WHERE "
                          "application_name LIKE 'dlock%%'"),
             before - 1);
    /* the waiter is woken by the server, the holder's client by its
     * socket: no lease, no timer; 3 s for a busy machine */
    (void)th_wait_flag(&wa.done, 3000);
    CHECK(wa.done);
    CHECK_OP(th_now_ms() - t0, <, 3000);
    pthread_join(t, NULL);
    CHECK_OK(wa.rc);
    for (int i = 0; i < 600 && !__atomic_load_n(&x.at, __ATOMIC_SEQ_CST); i++)
        th_sleep_ms(5);
    CHECK(x.at != 0);
    CHECK_OP(x.at - t0, <, 3000);
    CHECK_EQ(x.token, t1);
    CHECK_EQ(dlock_held(l1), DLOCK_ELOST);
    CHECK_RC(dlock_release(l1), DLOCK_ELOST);
    CHECK_CONTAINS(dlock_errmsg(), "pg_terminate_backend");
    /* the other hold of the same client lives on */
    CHECK_EQ(dlock_held(l2), 1);
    CHECK_OK(dlock_extend(l2, 1000)); /* its session still holds it */
    CHECK_OK(dlock_release(l2));
    CHECK_RC(dlock_break(op, "advb-1", NULL), DLOCK_ENOTHELD);
    TH_CLOSE(l1, l2);
    dlock_close(wa.l);
    TH_CLIENT_CLOSE(a, w, op);
}

/* Advisory mode: ending another's session needs its role (or a member
 * of it) or pg_signal_backend (a superuser's session: a superuser). A
 * break that may not end every holder's session ends none: DLOCK_EAUTH
 * saying so. */
TEST(an_advisory_break_needs_the_right_to_end_sessions)
{
    char u1[600], u2[600];

    th_sql_query(&srv, NULL, 0,
                 "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE "
                 "rolname = 'advbrk1') THEN CREATE ROLE advbrk1 LOGIN "
                 "PASSWORD 'p1'; CREATE ROLE advbrk2 LOGIN PASSWORD 'p2'; "
                 "END IF; END $$");
    dlock_client *su = th_client(adv, NULL); /* the tokens' sequence exists */
    th_sql_query(&srv, NULL, 0,
                 "GRANT USAGE ON dlock_locks_tokens TO advbrk1, advbrk2");
    snprintf(u1, sizeof(u1),
             "postgres://advbrk1:p1@127.0.0.1:%d/postgres?mode=advisory",
             srv.port);
    snprintf(u2, sizeof(u2),
             "postgres://advbrk2:p2@127.0.0.1:%d/postgres?mode=advisory",
             srv.port);
    dlock_client *c1 = th_client(u1, NULL), *c2 = th_client(u2, NULL),
                 *c1b = th_client(u1, NULL);
    dlock *ls = th_handle(su, "advperm-su", 0, 0, 0);
    dlock *l2 = th_handle(c2, "advperm-2", 0, 0, 0);
    dlock *l1 = th_handle(c1, "advperm-1", 0, 0, 0);
    dlock_info ev;

    CHECK_OK(dlock_acquire(ls, 0));
    CHECK_OK(dlock_acquire(l2, 0));
    CHECK_OK(dlock_acquire(l1, 0));
    /* a superuser's session; another role's */
    CHECK_RC(dlock_break(c1b, "advperm-su", &ev), DLOCK_EAUTH);
    CHECK_CONTAINS(dlock_errmsg(), "pg_signal_backend");
    CHECK_RC(dlock_break(c1b, "advperm-2", &ev), DLOCK_EAUTH);
    CHECK_OK(dlock_extend(ls, 1000)); /* both still held */
    CHECK_OK(dlock_extend(l2, 1000));
    /* the same role's */
    uint64_t t1 = dlock_token(l1);
    CHECK_OK(dlock_break(c1b, "advperm-1", &ev));
    CHECK_EQ(ev.token, t1);
    dlock_info_clear(&ev);
    CHECK_RC(dlock_release(l1), DLOCK_ELOST);
    /* pg_signal_backend's member: any non-superuser's */
    th_sql_query(&srv, NULL, 0, "GRANT pg_signal_backend TO advbrk1");
    CHECK_OK(dlock_break(c1b, "advperm-2", NULL));
    CHECK_RC(dlock_release(l2), DLOCK_ELOST);
    CHECK_RC(dlock_break(c1b, "advperm-su", NULL), DLOCK_EAUTH);
    th_sql_query(&srv, NULL, 0, "REVOKE pg_signal_backend FROM advbrk1");
    CHECK_OK(dlock_release(ls));
    TH_CLOSE(ls, l1, l2);
    TH_CLIENT_CLOSE(su, c1, c2, c1b);
}

/* --- advisory mode: a break ends only proven dlock holders --- */

/* A libpq session of `user` (password pw) on the test server. */
static PGconn *pg_session(const char *user, const char *pw)
{
    char conninfo[300];

    snprintf(conninfo, sizeof(conninfo),
             "host=127.0.0.1 port=%d dbname=postgres user=%s password=%s "
             "connect_timeout=5",
             srv.port, user, pw);
    PGconn *p = PQconnectdb(conninfo);
    CHECK(PQstatus(p) == CONNECTION_OK);
    return p;
}

/* Runs sql on p; the first column of the first row ("" when none). */
static void pg_do(PGconn *p, const char *sql, char *out, size_t cap)
{
    PGresult *r = PQexec(p, sql);

    CHECK(PQresultStatus(r) == PGRES_TUPLES_OK ||
          PQresultStatus(r) == PGRES_COMMAND_OK);
    if (out)
        snprintf(out, cap, "%s",
                 PQntuples(r) > 0 && PQnfields(r) > 0 ? PQgetvalue(r, 0, 0)
                                                      : "");
    PQclear(r);
}

/* The session p still answers and holds the advisory key of `name`
 * (granted: a session of its own, not ended). */
static int still_holds(PGconn *p, const char *name)
{
    char sql[400], v[16];

    snprintf(sql, sizeof(sql),
             "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = "
             "pg_backend_pid() AND locktype = 'advisory' AND granted AND "
             "objsubid = 1 AND ((classid::bigint << 32) | objid::bigint) = "
             "('x' || substr(md5('%s'::bytea), 1, 16))::bit(64)::bigint)",
             name);
    PGresult *r = PQexec(p, sql);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
        PQclear(r);
        return 0;
    }
    snprintf(v, sizeof(v), "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return !strcmp(v, "t");
}

/* The witness key of name on p's own session, as dlock takes it. */
#define WITNESS_SQL(name)                                                   \
    "('x' || substr(md5('" name "'::bytea || '\\x00'::bytea || ('w' || "    \
    "pg_backend_pid())::bytea), 1, 16))::bit(64)::bigint"

static void make_intruder(void)
{
    th_sql_query(&srv, NULL, 0,
                 "DO $$ BEGIN CREATE ROLE advintruder LOGIN PASSWORD "
                 "'intruder-pw'; EXCEPTION WHEN duplicate_object THEN NULL; "
                 "END $$");
}

/* Advisory keys have no permissions: any role may take dlock's key of a
 * name. A break ends only the sessions it can prove are dlock holders of
 * the name (the name's witness key held on the session, an
 * application_name of dlock's, a role that may draw tokens); any other
 * holder makes it end nothing: DLOCK_EAUTH naming the session (pid, role,
 * application). On main the break ended the foreign session
 * (pg_terminate_backend of any holder of the key). A real dlock holder is
 * still broken, alone. */
TEST(an_advisory_break_ends_no_foreign_session)
{
    char pid[32], want[80];
    dlock_info ev;

    make_intruder();
    dlock_client *op = th_client(adv, NULL); /* the tokens' sequence exists */
    dlock_client *a = th_client(adv, NULL);

    /* another role's session holds the key of the name */
    PGconn *in = pg_session("advintruder", "intruder-pw");
    pg_do(in, "SELECT pg_backend_pid()", pid, sizeof(pid));
    pg_do(in, "SELECT pg_advisory_lock(" KEY_SQL("advx-1") ")", NULL, 0);
    CHECK_RC(dlock_break(op, "advx-1", &ev), DLOCK_EAUTH);
    CHECK_CONTAINS(dlock_errmsg(), "cannot prove");
    snprintf(want, sizeof(want), "pid %s, role advintruder", pid);
    CHECK_CONTAINS(dlock_errmsg(), want);
    CHECK(still_holds(in, "advx-1"));
    /* ... faking all a holder shows (a token in its name, the witness key
     * of its pid): its role has no right on dlock's state */
    pg_do(in, "SET application_name = 'dlock 12345 host x pid 1 tid 1'",
          NULL, 0);
    pg_do(in, "SELECT pg_advisory_lock(" WITNESS_SQL("advx-1") ")", NULL, 0);
    CHECK_RC(dlock_break(op, "advx-1", &ev), DLOCK_EAUTH);
    CHECK_CONTAINS(dlock_errmsg(), "cannot prove");
    CHECK(still_holds(in, "advx-1"));
    pg_do(in, "SELECT pg_advisory_unlock_all()", NULL, 0);

    /* a dlock reader beside a foreign one: neither is ended */
    dlock *r = th_handle(a, "advx-3", 0, 0, 0);
    CHECK_OK(dlock_acquire_shared(r, 0));
    pg_do(in, "SELECT pg_advisory_lock_shared(" KEY_SQL("advx-3") ")", NULL,
          0);
    CHECK_RC(dlock_break(op, "advx-3", &ev), DLOCK_EAUTH);
    CHECK(still_holds(in, "advx-3"));
    CHECK_OK(dlock_extend(r, 1000)); /* its session still holds it */
    pg_do(in, "SELECT pg_advisory_unlock_all()", NULL, 0);
    /* alone, the dlock reader is broken; then a dlock writer */
    CHECK_OK(dlock_break(op, "advx-3", &ev));
    CHECK_EQ(ev.holders, 1);
    dlock_info_clear(&ev);
    CHECK_RC(dlock_release(r), DLOCK_ELOST);
    dlock *w = th_handle(a, "advx-1", 0, 0, 0);
    CHECK_OK(dlock_acquire(w, 0));
    uint64_t t = dlock_token(w);
    CHECK_OK(dlock_break(op, "advx-1", &ev));
    CHECK_EQ(ev.token, t);
    dlock_info_clear(&ev);
    CHECK_RC(dlock_release(w), DLOCK_ELOST);
    CHECK(PQstatus(in) == CONNECTION_OK); /* never ended */
    PQfinish(in);
    TH_CLOSE(r, w);
    TH_CLIENT_CLOSE(a, op);
}

/* A session that calls itself 'dlock' (what a dlock session holding
 * nothing shows) while it holds the name's key is not hidden from a
 * break: reported (DLOCK_EAUTH naming its pid and application), and not
 * ended; another role's, or dlock's own role's by hand. On main the break
 * did not see it (DLOCK_ENOTHELD: "not held"). */
TEST(an_advisory_break_reports_a_session_calling_itself_dlock)
{
    static const char *const who[][2] = {{"advintruder", "intruder-pw"},
                                         {"dlock", "dlock-secret"}};
    dlock_info ev;

    make_intruder();
    dlock_client *op = th_client(adv, NULL);
    for (int i = 0; i < 2; i++) {
        char pid[32], want[80];
        PGconn *p = pg_session(who[i][0], who[i][1]);
        pg_do(p, "SELECT pg_backend_pid()", pid, sizeof(pid));
        pg_do(p, "SET application_name = 'dlock'", NULL, 0);
        pg_do(p, "SELECT pg_advisory_lock(" KEY_SQL("advx-2") ")", NULL, 0);
        CHECK_RC(dlock_break(op, "advx-2", &ev), DLOCK_EAUTH);
        CHECK_CONTAINS(dlock_errmsg(), "cannot prove");
        snprintf(want, sizeof(want), "pid %s, role %s, application 'dlock'",
                 pid, who[i][0]);
        CHECK_CONTAINS(dlock_errmsg(), want);
        CHECK(still_holds(p, "advx-2"));
        PQfinish(p);
    }
    dlock_client_close(op);
}

/* --- forged grants: a notification is a wake-up, never a grant --- */

/* The server log's size now, and the statements (each "execute" of a
 * prepared one and each simple query) that `role` ran since `from`
 * (log_statement = 'all' for that role, log_line_prefix '[%u] '). */
static long long log_size(void)
{
    char path[600];
    struct stat st;

    snprintf(path, sizeof(path), "%s/server.log", srv.dir);
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static int statements_since(long long from, const char *role)
{
    char path[600], line[8192], tag[80];
    FILE *f;
    int n = 0;

    th_sleep_ms(200); /* the server writes its log as it runs them */
    snprintf(path, sizeof(path), "%s/server.log", srv.dir);
    snprintf(tag, sizeof(tag), "[%s] LOG:  ", role);
    f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f)
        return -1;
    fseek(f, from, SEEK_SET);
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, tag);
        if (p && (!strncmp(p + strlen(tag), "execute ", 8) ||
                  !strncmp(p + strlen(tag), "statement: ", 11)))
            n++;
    }
    fclose(f);
    return n;
}

/* A role with nothing but LOGIN sends "g WAITER TOKEN" on a table-mode
 * waiter's channel (NOTIFY checks no privilege; the channel and waiter
 * number, which it may not read from dlock_locks_waiters here, are given
 * to it), then a flood of them: the waiter keeps waiting, reading the row
 * at most once per notification; the holder's release then gives it the
 * lock with the row's token, not the forged one. For a lock, a read hold
 * behind a writer, and a permit. (Before, the waiter returned DLOCK_OK on
 * the first notification, with the forged token, while the holder
 * held.) */
TEST(a_forged_grant_from_a_login_only_role_only_wakes_the_waiter)
{
    static const char *const kinds[] = {"lock", "read", "permit"};
    const unsigned long long forged = 9223372036854775000ULL;
    enum { FLOOD = 200 };
    char conninfo[300], uri[300], row[200];
    static char flood[FLOOD * 120 + 64];

    th_sql_query(&srv, NULL, 0,
                 "DO $$ BEGIN CREATE ROLE forger LOGIN PASSWORD "
                 "'forger-pw'; EXCEPTION WHEN duplicate_object THEN NULL; "
                 "END $$");
    /* the waiters' role: its statements counted in the server's log */
    th_sql_query(&srv, NULL, 0,
                 "DO $$ BEGIN CREATE ROLE fwaiter LOGIN SUPERUSER PASSWORD "
                 "'fwaiter-pw'; EXCEPTION WHEN duplicate_object THEN NULL; "
                 "END $$");
    th_sql_query(&srv, NULL, 0,
                 "ALTER ROLE fwaiter SET log_statement = 'all'");
    th_sql_query(&srv, NULL, 0,
                 "ALTER SYSTEM SET log_line_prefix = '[%%u] '");
    th_sql_query(&srv, NULL, 0, "SELECT pg_reload_conf()");
    th_sleep_ms(300); /* the postmaster reads its configuration again */
    snprintf(conninfo, sizeof(conninfo),
             "host=127.0.0.1 port=%d dbname=postgres user=forger "
             "password=forger-pw connect_timeout=5",
             srv.port);
    PGconn *f = PQconnectdb(conninfo);
    CHECK(PQstatus(f) == CONNECTION_OK);
    PGresult *r = PQexec(f, "SELECT count(*) FROM dlock_locks_waiters");
    CHECK(PQresultStatus(r) == PGRES_FATAL_ERROR); /* no right to read it */
    PQclear(r);
    snprintf(uri, sizeof(uri),
             "postgres://fwaiter:fwaiter-pw@127.0.0.1:%d/postgres", srv.port);

    for (int k = 0; k < 3; k++) {
        char name[32], chan_id[40];
        unsigned long long seq = 0;
        dlock_options o;
        dlock *lh = NULL;
        dlock_client *h = client(), *c = th_client(uri, NULL);
        th_waiter w;
        pthread_t th;

        snprintf(name, sizeof(name), "forged-%s", kinds[k]);
        memset(&o, 0, sizeof(o));
        o.ttl_ms = 60000;
        o.permits = k == 2 ? 1 : 0;
        CHECK_OK(dlock_open(&lh, h, name, &o));
        memset(&w, 0, sizeof(w));
        CHECK_OK(dlock_open(&w.l, c, name, &o));
        w.shared = k == 1;
        w.wait_ms = 20000;
        w.wait_go = 1;
        CHECK_OK(dlock_acquire(lh, 0)); /* a reader waits behind a writer */
        uint64_t held = dlock_token(lh);
        th_waiter_start(&w, &th);
        /* its entry: the channel's client id and the waiter number
         * (bounded: 10 s of busy-machine slack) */
        int64_t until = th_now_ms() + 10000;
        do {
            row[0] = '\0';
            th_sql_query(&srv, row, sizeof(row),
                         "SELECT client || ' ' || waiter FROM "
                         "dlock_locks_waiters WHERE name = convert_to('%s', "
                         "'UTF8')",
                         name);
        } while (!row[0] && th_now_ms() < until && (th_sleep_ms(20), 1));
        CHECK_EQ(sscanf(row, "%39s %llu", chan_id, &seq), 2);

        long long from = log_size();
        char one[200];
        snprintf(one, sizeof(one), "NOTIFY dlock_%s, 'g %llu %llu'", chan_id,
                 seq, forged);
        r = PQexec(f, one);
        CHECK(PQresultStatus(r) == PGRES_COMMAND_OK);
        PQclear(r);
        /* the flood: distinct payloads (identical ones in a transaction
         * are sent once), delivered at one commit */
        size_t n = (size_t)snprintf(flood, sizeof(flood), "BEGIN;");
        for (int i = 0; i < FLOOD; i++)
            n += (size_t)snprintf(flood + n, sizeof(flood) - n,
                                  " NOTIFY dlock_%s, 'g %llu %llu';", chan_id,
                                  seq, forged + (unsigned)i);
        snprintf(flood + n, sizeof(flood) - n, " COMMIT");
        r = PQexec(f, flood);
        CHECK(PQresultStatus(r) == PGRES_COMMAND_OK);
        PQclear(r);
        /* A waiter that takes a notification for its grant returns
         * within a round trip of reading it (about a millisecond); 500 ms
         * is hundreds of those even on a busy machine. A machine slower
         * than that could only let a wrong client pass, never fail a
         * right one. */
        th_sleep_ms(500);
        int reads = statements_since(from, "fwaiter");
        CHECK_EQ(__atomic_load_n(&w.done, __ATOMIC_SEQ_CST), 0);
        /* woken, it read the row; at most once per notification */
        CHECK_OP(reads, >=, 1);
        CHECK_OP(reads, <=, FLOOD + 1);
        CHECK_EQ(th_waiters(h, name), 1);
        CHECK_EQ(dlock_held(lh), 1);

        /* the real hand-over: the row's token, above the holder's */
        CHECK_OK(dlock_release(lh));
        CHECK(th_waiter_returned(&w, 10000));
        CHECK_OK(w.rc);
        dlock_info info;
        CHECK_OK(dlock_inspect(h, name, &info));
        CHECK_EQ(info.held, 1);
        CHECK_EQ(w.token, info.token);
        dlock_info_clear(&info);
        CHECK_OP(w.token, >, held);
        CHECK_OP(w.token, <, forged);
        th_waiter_go(&w);
        pthread_join(th, NULL);
        fprintf(stderr, "forged %s: %d statements for %d notifications\n",
                kinds[k], reads, FLOOD + 1);
        dlock_close(w.l);
        dlock_close(lh);
        TH_CLIENT_CLOSE(c, h);
    }
    PQfinish(f);
    th_sql_query(&srv, NULL, 0, "ALTER SYSTEM RESET log_line_prefix");
    th_sql_query(&srv, NULL, 0, "SELECT pg_reload_conf()");
}

static const th_test tests[] = {
    T(rows_stay_and_tokens_come_from_the_sequence),
    T(tokens_never_go_backwards_under_contention),
    T(sql_injection_locks_a_strangely_named_lock),
    T(a_waiter_sends_nothing_while_it_waits_and_a_release_wakes_it),
    T(a_listener_killed_mid_wait_listens_again),
    T(a_client_that_waited_goes_quiet_and_stops_listening),
    T(fair_waiters_stay_queued_without_refreshing),
    T(a_dead_fair_waiter_drops_out_of_the_queue),
    T(an_entry_whose_session_does_not_listen_is_skipped),
    T(a_release_hands_the_lock_over_in_default_mode),
    T(a_waiter_that_gave_up_is_not_handed_the_lock),
    T(a_client_keeps_one_connection_while_it_holds_or_waits),
    T(a_client_whose_clock_is_hours_off_gets_correct_leases),
    T(the_server_down_and_back),
    T(advisory_holds_end_with_the_server),
    T(a_frozen_server_keeps_the_callers_deadline),
    T(a_late_timed_out_acquire_leaves_the_owners_newer_hold_alone),
    T(a_timed_wait_on_a_slow_link_ends_busy_not_unreachable),
    T(auth_privileges_and_bad_uris),
    T(a_unix_socket_and_a_dead_first_host),
    T(tls_verifies_the_server),
    T(advisory_locks_exclude_plain_sql_advisory_locks),
    T(advisory_waiters_queue_in_the_server_in_order),
    T(an_advisory_wait_ends_at_its_deadline_leaving_nothing),
    T(an_advisory_wait_whose_cancel_the_server_drops_still_ends),
    T(list_pages_a_big_table_in_bounded_pages),
    T(list_cursors_are_checked_and_resume_past_their_name),
    T(a_listed_lock_is_described_as_inspect_describes_it),
    T(a_break_on_a_table_of_an_earlier_version_adds_its_function),
    T(a_break_racing_a_hand_over_evicts_exactly_one_holder),
    T(an_evicted_holder_frozen_learns_it_when_thawed),
    T(an_advisory_break_ends_only_the_holders_session),
    T(an_advisory_break_needs_the_right_to_end_sessions),
    T(an_advisory_break_ends_no_foreign_session),
    T(an_advisory_break_reports_a_session_calling_itself_dlock),
    T(a_forged_grant_from_a_login_only_role_only_wakes_the_waiter),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    th_child(argc, argv);
    if (!th_sql_available("pg"))
        th_skip("this build has no postgres store, or no PostgreSQL server");
    th_sql_start(&srv, "pg");
    snprintf(adv, sizeof(adv), "%s?mode=advisory", srv.uri);
    return th_main(argc, argv, tests);
}
