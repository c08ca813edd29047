/* SPDX-License-Identifier: MIT */
/*
 * test_pgbouncer.c -- the PostgreSQL store behind PgBouncer (Debian's
 * pgbouncer, a private one on a free loopback port in front of a private
 * PostgreSQL, stock settings but pool_mode), as docs/stores.md, "Poolers
 * (PgBouncer)", says:
 *
 * session pooling, ?pooler=session: every feature works: table mode (try,
 * release, extend, inspect, gc, tokens), a waiter in another client woken
 * by the release (hand-over), fair order, the watchdog keeping a short
 * lease; advisory mode (hold, a waiter woken by the release, the hold
 * reported lost the moment PgBouncer dies, the client working again after
 * PgBouncer's restart).
 *
 * session pooling without ?pooler=, and transaction pooling (declared or
 * not): the pooler is detected; table mode's single tries, release,
 * extend, inspect and gc work; waiting fails at once with DLOCK_ENOTSUP
 * and a message naming the pooler mode; advisory mode does not open
 * (DLOCK_ENOTSUP, naming it). Nothing hangs.
 *
 * The contract suite also runs through session pooling (test_contract
 * pg-pgbouncer and pg-advisory-pgbouncer).
 */
#include "test.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

static th_sql srv;
static th_pgb sess, trans; /* pool_mode session, transaction */

/* Every call that must fail at once (ENOTSUP) or answer a single try
 * finishes within this bound. It does one or two round trips on loopback
 * (no wait, no lease involved): milliseconds; 5 s leaves room for a
 * SCRAM login and a busy 2-core machine, and is far below the 20 s waits
 * the calls are given, so a call that waited or hung is caught. */
#define AT_ONCE_MS 5000

static void uri(char *out, size_t cap, const th_pgb *b, const char *query)
{
    snprintf(out, cap, "%s%s", b->uri, query);
}

static dlock *handle(dlock_client *c, const char *name, int64_t ttl,
                     unsigned flags, dlock_lost_cb lost)
{
    return th_handle_lost(c, name, ttl, flags, lost, NULL);
}

/* Sessions of the server that PgBouncer opened (the superuser's own
 * connection is over the Unix socket). */
static long long server_sessions(void)
{
    return th_sql_query(&srv, NULL, 0,
                        "SELECT count(*) FROM pg_stat_activity WHERE "
                        "client_addr IS NOT NULL AND usename = 'dlock'");
}

/* --- a waiter on its own thread --- */

typedef struct waiter_arg {
    dlock *l;
    int64_t wait;
    volatile int started;
    volatile int rc;
    volatile int64_t took;
    volatile int done;
    uint64_t token;
    char msg[512];
    int hold;              /* keep the lock until let_go (at most 10 s) */
    volatile int got;      /* it has the lock */
    volatile int let_go;
} waiter_arg;

static void *waiter(void *arg)
{
    waiter_arg *w = arg;
    int64_t t0 = th_now_ms();

    __atomic_store_n(&w->started, 1, __ATOMIC_SEQ_CST);
    w->rc = dlock_acquire(w->l, w->wait);
    w->took = th_now_ms() - t0;
    snprintf(w->msg, sizeof(w->msg), "%s", dlock_errmsg());
    if (w->rc == DLOCK_OK) {
        w->token = dlock_token(w->l);
        __atomic_store_n(&w->got, 1, __ATOMIC_SEQ_CST);
        for (int i = 0; i < 1000 && w->hold &&
                        !__atomic_load_n(&w->let_go, __ATOMIC_SEQ_CST);
             i++)
            th_sleep_ms(10);
        dlock_release(w->l);
    }
    __atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static int done(waiter_arg *w)
{
    return __atomic_load_n(&w->done, __ATOMIC_SEQ_CST);
}

/* --- session pooling, ?pooler=session: everything works --- */

TEST(session_pool_table_mode_try_release_extend_inspect_gc)
{
    char u[400];
    uri(u, sizeof(u), &sess, "?pooler=session");
    dlock_client *a = th_client(u, NULL), *b = th_client(u, NULL);
    dlock *la = handle(a, "t-basic", 5000, 0, NULL);
    dlock *lb = handle(b, "t-basic", 5000, 0, NULL);
    dlock_info info;
    uint64_t n;

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t t1 = dlock_token(la);
    CHECK_OP(t1, >, 0);
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_extend(la, 30000));
    CHECK_OK(dlock_inspect(b, "t-basic", &info));
    CHECK_EQ(info.held, 1);
    CHECK_EQ(info.token, t1);
    CHECK_OP(info.ttl_ms, >, 20000);
    CHECK_OP(strlen(info.holder), >, 0);
    dlock_info_clear(&info);
    CHECK_OK(dlock_release(la));
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OP(dlock_token(lb), >, t1);
    uint64_t t2 = dlock_token(lb);
    CHECK_OK(dlock_release(lb));
    CHECK_OK(dlock_acquire(la, 0));
    CHECK_OP(dlock_token(la), >, t2);
    CHECK_OK(dlock_release(la));
    th_sleep_ms(30);
    CHECK_OK(dlock_gc(a, 10, &n));
    CHECK_OP(n, >=, 1);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

TEST(session_pool_a_release_wakes_a_waiter_in_another_client)
{
    char u[400];
    uri(u, sizeof(u), &sess, "?pooler=session");
    dlock_client *h = th_client(u, NULL), *c = th_client(u, NULL);
    dlock *lh = handle(h, "t-wake", 60000, 0, NULL);
    waiter_arg w;
    pthread_t t;

    memset(&w, 0, sizeof(w));
    w.l = handle(c, "t-wake", 60000, 0, NULL);
    w.wait = 20000;
    w.hold = 1;
    CHECK_OK(dlock_acquire(lh, 0));
    uint64_t first = dlock_token(lh);
    pthread_create(&t, NULL, waiter, &w);
    th_wait_waiters(h, "t-wake", 1);
    th_sleep_ms(500);
    CHECK_EQ(done(&w), 0); /* it waits (a 60 s lease: nothing ends) */
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(lh));
    /* handed over in the release statement: the releaser cannot barge
     * back in (the waiter keeps the lock until told) */
    CHECK_RC(dlock_acquire(lh, 0), DLOCK_EBUSY);
    /* the notification wakes it (1 s: a hand-over is a few ms; not the
     * holder's 60 s lease, nor the 20 s wait) */
    for (int i = 0; i < 500 && !__atomic_load_n(&w.got, __ATOMIC_SEQ_CST) &&
                    !done(&w);
         i++)
        th_sleep_ms(2);
    if (done(&w) && w.rc != DLOCK_OK)
        th_fail(__FILE__, __LINE__, "the waiter: %s: %s",
                dlock_errname(w.rc), w.msg);
    CHECK_EQ(w.got, 1);
    CHECK_OP(th_now_ms() - t0, <, 1000);
    CHECK_OP(w.token, >, first);
    dlock_info info;
    CHECK_OK(dlock_inspect(h, "t-wake", &info));
    CHECK_EQ(info.held, 1);
    CHECK_EQ(info.token, w.token);
    dlock_info_clear(&info);
    __atomic_store_n(&w.let_go, 1, __ATOMIC_SEQ_CST);
    pthread_join(t, NULL);
    CHECK_OK(w.rc);
    dlock_close(lh);
    dlock_close(w.l);
    TH_CLIENT_CLOSE(h, c);
}

TEST(session_pool_fair_waiters_get_the_lock_in_order)
{
    char u[400];
    uri(u, sizeof(u), &sess, "?pooler=session");
    dlock_client *h = th_client(u, NULL), *c[3];
    dlock *lh = handle(h, "t-fair", 60000, DLOCK_FAIR, NULL);
    waiter_arg w[3];
    pthread_t t[3];

    CHECK_OK(dlock_acquire(lh, 0));
    for (int i = 0; i < 3; i++) {
        c[i] = th_client(u, NULL);
        memset(&w[i], 0, sizeof(w[i]));
        w[i].l = handle(c[i], "t-fair", 60000, DLOCK_FAIR, NULL);
        w[i].wait = 30000;
        pthread_create(&t[i], NULL, waiter, &w[i]);
        th_wait_waiters(h, "t-fair", i + 1);
    }
    CHECK_OK(dlock_release(lh));
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        CHECK_OK(w[i].rc);
    }
    /* each was handed the lock by the one before: tokens in arrival order */
    CHECK_OP(w[0].token, <, w[1].token);
    CHECK_OP(w[1].token, <, w[2].token);
    CHECK_EQ(th_waiters(h, "t-fair"), 0);
    for (int i = 0; i < 3; i++) {
        dlock_close(w[i].l);
        dlock_client_close(c[i]);
    }
    dlock_close(lh);
    dlock_client_close(h);
}

/* A fair waiter in a process of its own (killed by the test). */
typedef struct child_shared {
    char uri[400];
    int order[4];
    int pos;
    int index;
} child_shared;

#define DEAD_TTL 2000 /* the leases of the test below */

static int fair_child(void *arg)
{
    child_shared *s = arg;
    int me = s->index;
    dlock_client *c;
    dlock_options o;
    dlock *l;

    memset(&o, 0, sizeof(o));
    o.flags = DLOCK_FAIR;
    o.ttl_ms = DEAD_TTL;
    if (dlock_client_open(&c, s->uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "t-dead", &o) != DLOCK_OK)
        return 2;
    if (dlock_acquire(l, 30000) != DLOCK_OK) {
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

/* A known limit (docs/stores.md, "Poolers (PgBouncer)"): a waiter is
 * alive as long as its server session, and PgBouncer in session mode
 * keeps a dead client's server session (it resets it with DISCARD ALL and
 * pools it). A waiter that dies is then taken for alive: the release
 * hands the lock to it, and the next waiter gets the lock when that
 * lease ends, learning it at its fallback timer (the end of the lease it
 * last saw). Nothing is lost for good: the delay is bounded by the
 * leases. This test checks that bound; with the server directly, the
 * next waiter gets the lock at once (test_pg,
 * a_dead_fair_waiter_drops_out_of_the_queue). */
/* A waiter killed behind session pooling leaves its server session to
 * PgBouncer, which resets it (DISCARD ALL) and pools it: the session lives
 * on, but its liveness lock (a session advisory lock) goes with the reset,
 * so the release skips the dead waiter and the next one is served at once
 * (before waiters were alive as long as their session, and the next one
 * waited for the dead one's lease). */
TEST(session_pool_a_dead_waiter_is_skipped)
{
    child_shared *s = th_shared(sizeof(*s));
    dlock_client *h;
    dlock *lh;
    pid_t dead, next;

    uri(s->uri, sizeof(s->uri), &sess, "?pooler=session");
    h = th_client(s->uri, NULL);
    lh = handle(h, "t-dead", DEAD_TTL, DLOCK_FAIR, NULL);
    CHECK_OK(dlock_acquire(lh, 0));
    s->index = 0;
    dead = th_fork(fair_child, s);
    th_wait_waiters(h, "t-dead", 1);
    s->index = 1;
    next = th_fork(fair_child, s);
    th_wait_waiters(h, "t-dead", 2);
    kill(dead, SIGKILL);
    CHECK_EQ(th_wait(dead), 128 + SIGKILL);
    /* PgBouncer sees its client go and resets the server session */
    th_wait_waiters(h, "t-dead", 1);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(lh));
    /* handed to the live waiter, not to the dead one (whose lease would
     * hold it up DEAD_TTL): 1 s is the contract's "at once" with room for
     * a busy machine and the child's own 10 ms hold */
    CHECK_EQ(th_wait(next), 0);
    CHECK_OP(th_now_ms() - t0, <, 1000);
    CHECK_EQ(s->pos, 1);
    CHECK_EQ(s->order[0], 1);
    dlock_close(lh);
    dlock_client_close(h);
}

TEST(session_pool_the_watchdog_keeps_a_short_lease)
{
    char u[400];
    uri(u, sizeof(u), &sess, "?pooler=session");
    dlock_client *a = th_client(u, NULL), *b = th_client(u, NULL);
    th_lost lost = TH_LOST_INIT;
    dlock *la = th_handle_lost(a, "t-watchdog", 600, 0, th_lost_cb, &lost);
    dlock *lb = handle(b, "t-watchdog", 600, 0, NULL);

    th_lost_reset(&lost);
    CHECK_OK(dlock_acquire(la, 0));
    uint64_t tok = dlock_token(la);
    /* five leases long: renewed through the pooler every 200 ms */
    th_sleep_ms(3000);
    CHECK_EQ(th_lost_calls(&lost), 0);
    CHECK_EQ(dlock_held(la), 1);
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_release(la));
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OP(dlock_token(lb), >, tok);
    CHECK_OK(dlock_release(lb));
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

TEST(session_pool_advisory_hold_wake_and_loss_when_pgbouncer_dies)
{
    /* a PgBouncer of its own: this test kills it */
    th_pgb own;
    char u[400];
    th_pgb_start(&own, &srv, "session");
    uri(u, sizeof(u), &own, "?pooler=session&mode=advisory");
    dlock_client *h = th_client(u, NULL), *c = th_client(u, NULL);
    th_lost lost = TH_LOST_INIT;
    dlock *lh = th_handle_lost(h, "t-adv", 0, 0, th_lost_cb, &lost);
    waiter_arg w;
    pthread_t t;

    /* a hold, and a waiter that waits in the server */
    memset(&w, 0, sizeof(w));
    w.l = handle(c, "t-adv", 0, 0, NULL);
    w.wait = 20000;
    th_lost_reset(&lost);
    CHECK_OK(dlock_acquire(lh, 0));
    uint64_t first = dlock_token(lh);
    /* the name's key and its witness (docs/design.md, "PostgreSQL
     * advisory mode: what a break ends") */
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM pg_locks WHERE locktype = "
                          "'advisory' AND granted"),
             2);
    pthread_create(&t, NULL, waiter, &w);
    for (int i = 0; i < 1000 && th_waiters(h, "t-adv") < 1; i++)
        th_sleep_ms(10);
    CHECK_EQ(th_waiters(h, "t-adv"), 1);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(lh));
    for (int i = 0; i < 500 && !done(&w); i++)
        th_sleep_ms(2);
    CHECK_EQ(done(&w), 1);
    CHECK_OP(th_now_ms() - t0, <, 1000); /* the server grants it at once */
    pthread_join(t, NULL);
    CHECK_OK(w.rc);
    CHECK_OP(w.token, >, first);

    /* PgBouncer dies: the hold's session goes with it (PgBouncer's server
     * connection closes, the server ends the session and its lock) and
     * the client sees its own connection end: lost at once, no lease */
    CHECK_OK(dlock_acquire(lh, 0));
    uint64_t tok = dlock_token(lh);
    th_pgb_kill(&own, SIGKILL);
    t0 = th_now_ms();
    for (int i = 0; i < 300 && !th_lost_calls(&lost); i++)
        th_sleep_ms(10);
    CHECK_EQ(th_lost_calls(&lost), 1);
    CHECK_EQ(lost.token, tok);
    /* lost when the client sees its connection end (at once, no lease):
     * the client thread's next wake-up, 3 s of slack for a busy machine */
    CHECK_OP(th_now_ms() - t0, <, 3000);
    CHECK_EQ(dlock_held(lh), DLOCK_ELOST);
    CHECK_RC(dlock_release(lh), DLOCK_ELOST);
    /* the server freed the lock: no advisory lock is left */
    for (int i = 0; i < 300 && th_sql_query(&srv, NULL, 0,
                                            "SELECT count(*) FROM pg_locks "
                                            "WHERE locktype = 'advisory'") >
                                   0;
         i++)
        th_sleep_ms(10);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM pg_locks WHERE locktype = "
                          "'advisory'"),
             0);
    /* while it is down: unreachable, at once for a try (a wait would
     * ride it out: docs/design.md, "Waiting through failovers and
     * restarts") */
    t0 = th_now_ms();
    CHECK_RC(dlock_acquire(lh, 0), DLOCK_ECONN);
    CHECK_OP(th_now_ms() - t0, <, AT_ONCE_MS);
    /* back: the same client works again, tokens keep growing */
    th_pgb_restart(&own);
    CHECK_OK(dlock_acquire(lh, 5000));
    CHECK_OP(dlock_token(lh), >, tok);
    CHECK_OK(dlock_release(lh));
    dlock_close(lh);
    dlock_close(w.l);
    TH_CLIENT_CLOSE(h, c);
    th_pgb_kill(&own, SIGKILL);
}

/* dlock_break() in advisory mode behind session pooling: pg_locks and
 * pg_stat_activity show the server's sessions, and pg_terminate_backend
 * ends the holder's one; PgBouncer then closes the client connection
 * linked to it (session pooling), so the holder's client sees its
 * connection end and reports the hold lost at once; the waiter, whose
 * server session waits on the lock, is granted it by the server. */
TEST(session_pool_advisory_break_ends_the_holders_server_session)
{
    char u[400];
    uri(u, sizeof(u), &sess, "?pooler=session&mode=advisory");
    dlock_client *h = th_client(u, NULL), *c = th_client(u, NULL),
                 *op = th_client(u, NULL);
    th_lost lost = TH_LOST_INIT;
    dlock *lh = th_handle_lost(h, "t-advbrk", 0, 0, th_lost_cb, &lost);
    waiter_arg w;
    pthread_t t;
    dlock_info ev;

    memset(&w, 0, sizeof(w));
    w.l = handle(c, "t-advbrk", 0, 0, NULL);
    w.wait = 20000;
    th_lost_reset(&lost);
    CHECK_OK(dlock_acquire(lh, 0));
    uint64_t tok = dlock_token(lh);
    pthread_create(&t, NULL, waiter, &w);
    th_wait_waiters(op, "t-advbrk", 1);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_break(op, "t-advbrk", &ev));
    CHECK_EQ(ev.token, tok);
    CHECK_EQ(ev.waiters, 1);
    dlock_info_clear(&ev);
    /* woken by the server, lost by the socket: no lease, no timer; 3 s
     * for a busy machine */
    for (int i = 0; i < 300 && (!th_lost_calls(&lost) || !done(&w)); i++)
        th_sleep_ms(10);
    CHECK_OP(th_now_ms() - t0, <, 3000);
    CHECK_EQ(th_lost_calls(&lost), 1);
    CHECK_EQ(lost.token, tok);
    pthread_join(t, NULL);
    CHECK_OK(w.rc);
    CHECK_OP(w.token, >, tok);
    CHECK_RC(dlock_release(lh), DLOCK_ELOST);
    printf("     the holder was told: %s\n", dlock_errmsg());
    /* the client works on, on a new server session */
    CHECK_OK(dlock_acquire(lh, 0));
    CHECK_OP(dlock_token(lh), >, w.token);
    CHECK_OK(dlock_release(lh));
    dlock_close(lh);
    dlock_close(w.l);
    TH_CLIENT_CLOSE(h, c, op);
}

/* Table mode behind transaction pooling: dlock_list() and dlock_break()
 * are single statements (sent unnamed), so they work, at once; so does
 * adding T_break to a table made without it (one implicit transaction). */
TEST(transaction_pool_table_mode_lists_and_breaks)
{
    char u[400];
    uri(u, sizeof(u), &trans, "?pooler=transaction&table=pgb_brk");
    dlock_client *a = th_client(u, NULL), *op = th_client(u, NULL);
    dlock *l1 = handle(a, "tb/1", 30000, 0, NULL);
    dlock *l2 = handle(a, "tb/2", 30000, 0, NULL);
    dlock_list_page p;
    dlock_info ev;

    th_sql_query(&srv, NULL, 0, "DROP FUNCTION pgb_brk_break");
    CHECK_OK(dlock_acquire(l1, 0));
    CHECK_OK(dlock_acquire(l2, 0));
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_list(op, "tb/", NULL, 1, 0, &p));
    CHECK_EQ(p.n, 1);
    CHECK(p.next != NULL);
    if (p.n == 1) {
        CHECK_STR(p.locks[0].name, "tb/1");
        CHECK_EQ(p.locks[0].info.token, dlock_token(l1));
    }
    char *next = p.next ? strdup(p.next) : NULL;
    dlock_list_clear(&p);
    CHECK_OK(dlock_list(op, "tb/", next, 1, 0, &p));
    free(next);
    CHECK_EQ(p.n, 1);
    if (p.n == 1)
        CHECK_STR(p.locks[0].name, "tb/2");
    dlock_list_clear(&p);
    uint64_t tok = dlock_token(l1);
    CHECK_OK(dlock_break(op, "tb/1", &ev));
    CHECK_EQ(ev.token, tok);
    dlock_info_clear(&ev);
    CHECK_OP(th_now_ms() - t0, <, AT_ONCE_MS);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT to_regproc('pgb_brk_break') IS NOT NULL"),
             1);
    CHECK_RC(dlock_release(l1), DLOCK_ELOST);
    CHECK_OK(dlock_release(l2));
    CHECK_RC(dlock_break(op, "tb/2", NULL), DLOCK_ENOTHELD);
    TH_CLOSE(l1, l2);
    TH_CLIENT_CLOSE(a, op);
}

/* --- where sessions cannot be trusted: at once, naming the mode --- */

/* Table mode: single tries, release, extend, inspect and gc work;
 * waiting fails at once; advisory mode does not open. `query` is the
 * URI's query (?pooler=... or none), `names` what the messages must say. */
static void sessions_not_trusted(const th_pgb *b, const char *query,
                                 const char *names)
{
    char u[400], ua[440];
    uri(u, sizeof(u), b, query);
    snprintf(ua, sizeof(ua), "%s%s%s", u, query[0] ? "&" : "?",
             "mode=advisory");
    dlock_client *a = th_client(u, NULL), *c = th_client(u, NULL);
    dlock *la = handle(a, "t-once", 30000, 0, NULL);
    dlock *lc = handle(c, "t-once", 30000, 0, NULL);
    dlock *lf = handle(c, "t-once", 30000, DLOCK_FAIR, NULL);
    dlock_client *adv = NULL;
    dlock_info info;
    uint64_t n;
    int64_t t0;

    /* uncontended: a wait is never needed, so it works, wait or not */
    t0 = th_now_ms();
    CHECK_OK(dlock_acquire(la, 20000));
    uint64_t t1 = dlock_token(la);
    CHECK_OK(dlock_extend(la, 40000));
    CHECK_OK(dlock_inspect(c, "t-once", &info));
    CHECK_EQ(info.held, 1);
    CHECK_EQ(info.token, t1);
    CHECK_OP(info.ttl_ms, >, 30000);
    dlock_info_clear(&info);
    /* a try of a held lock: busy */
    CHECK_RC(dlock_acquire(lc, 0), DLOCK_EBUSY);
    CHECK_OP(th_now_ms() - t0, <, AT_ONCE_MS);

    /* waiting: not supported, at once (not at the 20 s deadline), in
     * default and fair mode, and the message names the pooler mode */
    t0 = th_now_ms();
    CHECK_RC(dlock_acquire(lc, 20000), DLOCK_ENOTSUP);
    CHECK_OP(th_now_ms() - t0, <, AT_ONCE_MS);
    CHECK_CONTAINS(dlock_errmsg(), names);
    CHECK_CONTAINS(dlock_errmsg(), "?pooler=session");
    CHECK(!strstr(dlock_errmsg(), "dlock-secret"));
    t0 = th_now_ms();
    CHECK_RC(dlock_acquire(lf, -1), DLOCK_ENOTSUP);
    CHECK_OP(th_now_ms() - t0, <, AT_ONCE_MS);
    CHECK_CONTAINS(dlock_errmsg(), names);
    /* and it left no waiter behind to be handed the lock */
    CHECK_EQ(th_waiters(a, "t-once"), 0);

    /* the holder's release frees it; the other client takes it */
    CHECK_OK(dlock_release(la));
    CHECK_OK(dlock_acquire(lc, 20000));
    CHECK_OP(dlock_token(lc), >, t1);
    CHECK_OK(dlock_release(lc));
    th_sleep_ms(30);
    CHECK_OK(dlock_gc(a, 10, &n));

    /* advisory mode: the client does not open, at once */
    t0 = th_now_ms();
    CHECK_RC(dlock_client_open(&adv, ua, NULL), DLOCK_ENOTSUP);
    CHECK_OP(th_now_ms() - t0, <, AT_ONCE_MS);
    CHECK(adv == NULL);
    CHECK_CONTAINS(dlock_errmsg(), names);
    CHECK_CONTAINS(dlock_errmsg(), "?pooler=session");
    CHECK(!strstr(dlock_errmsg(), "dlock-secret"));

    TH_CLOSE(la, lc, lf);
    TH_CLIENT_CLOSE(a, c);
}

TEST(session_pool_undeclared_is_detected_and_not_trusted)
{
    /* docs/stores.md: a pooler detected and no ?pooler= is taken as
     * transaction pooling (the store cannot tell the pool mode) */
    sessions_not_trusted(&sess, "", "a pooler in front of the server");
}

TEST(transaction_pool_declared)
{
    sessions_not_trusted(&trans, "?pooler=transaction",
                         "transaction pooling (?pooler=transaction)");
}

TEST(transaction_pool_undeclared_is_detected)
{
    sessions_not_trusted(&trans, "", "a pooler in front of the server");
}

TEST(transaction_pool_clients_share_server_sessions)
{
    /* many single tries from several clients, each statement on whichever
     * server session PgBouncer lends: unnamed statements, so nothing
     * depends on a session's prepared statements */
    th_pgb own; /* its server sessions are the new ones */
    char u[400];
    long long before = server_sessions();
    th_pgb_start(&own, &srv, "transaction");
    uri(u, sizeof(u), &own, "?pooler=transaction");
    dlock_client *c[4];
    dlock *l[4];
    uint64_t last = 0;

    for (int i = 0; i < 4; i++) {
        c[i] = th_client(u, NULL);
        l[i] = handle(c[i], "t-shared", 30000, 0, NULL);
    }
    for (int round = 0; round < 25; round++) {
        for (int i = 0; i < 4; i++) {
            int j = (i + 1) % 4;
            CHECK_OK(dlock_acquire(l[i], 0));
            CHECK_OP(dlock_token(l[i]), >, last);
            last = dlock_token(l[i]);
            CHECK_RC(dlock_acquire(l[j], 0), DLOCK_EBUSY);
            CHECK_OK(dlock_extend(l[i], 30000));
            CHECK_OK(dlock_release(l[i]));
        }
    }
    /* four clients, each with its command connection open: fewer server
     * sessions, PgBouncer shared them */
    CHECK_OP(server_sessions() - before, <, 4);
    for (int i = 0; i < 4; i++) {
        dlock_close(l[i]);
        dlock_client_close(c[i]);
    }
    th_pgb_kill(&own, SIGKILL);
}

TEST(the_pool_mode_option_is_checked)
{
    char u[400];
    dlock_client *c = NULL;

    uri(u, sizeof(u), &sess, "?pooler=statement");
    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "pooler must be");
    CHECK(!strstr(dlock_errmsg(), "dlock-secret"));
    CHECK(c == NULL);
}

/* Whether dlock_client_check() of the store at `u` finds `check`. */
static int check_finds(const char *u, const char *check)
{
    dlock_client *c = th_client(u, th_patient());
    dlock_check r;
    int found = 0;

    CHECK_OK(dlock_client_check(c, 0, &r));
    for (size_t i = 0; i < r.n; i++)
        if (!strcmp(r.findings[i].check, check))
            found = 1;
    dlock_check_clear(&r);
    dlock_client_close(c);
    return found;
}

TEST(doctor_finds_transaction_pooling_and_not_session_pooling)
{
    char u[1200];

    /* both ways: a session pool keeps what dlock needs; a transaction
     * pool, declared or found, does not */
    uri(u, sizeof(u), &sess, "?pooler=session");
    CHECK(!check_finds(u, "pg-transaction-pooling"));
    CHECK(!check_finds(srv.uri, "pg-transaction-pooling"));
    uri(u, sizeof(u), &trans, "?pooler=transaction");
    CHECK(check_finds(u, "pg-transaction-pooling"));
    uri(u, sizeof(u), &trans, "");
    CHECK(check_finds(u, "pg-transaction-pooling"));
}

static const th_test tests[] = {
    T(session_pool_table_mode_try_release_extend_inspect_gc),
    T(session_pool_a_release_wakes_a_waiter_in_another_client),
    T(session_pool_fair_waiters_get_the_lock_in_order),
    T(session_pool_a_dead_waiter_is_skipped),
    T(session_pool_the_watchdog_keeps_a_short_lease),
    T(session_pool_advisory_hold_wake_and_loss_when_pgbouncer_dies),
    T(session_pool_undeclared_is_detected_and_not_trusted),
    T(transaction_pool_declared),
    T(transaction_pool_undeclared_is_detected),
    T(transaction_pool_clients_share_server_sessions),
    T(the_pool_mode_option_is_checked),
    T(session_pool_advisory_break_ends_the_holders_server_session),
    T(transaction_pool_table_mode_lists_and_breaks),
    T(doctor_finds_transaction_pooling_and_not_session_pooling),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    if (!th_sql_available("pg"))
        th_skip("this build has no postgres store, or no PostgreSQL server");
    if (!th_pgb_available())
        th_skip("pgbouncer is not installed (apt-get install pgbouncer)");
    th_sql_start(&srv, "pg");
    th_pgb_start(&sess, &srv, "session");
    th_pgb_start(&trans, &srv, "transaction");
    return th_main(argc, argv, tests);
}
