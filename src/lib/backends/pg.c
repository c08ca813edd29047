/*
 * pg.c -- the PostgreSQL store (libpq), in two modes.
 *
 * Table mode (the default): the seeds' lock table.
 *  - One row per lock name in table T (default dlock_locks): owner, holder
 *    description, hold count, fencing token, locked_at and lock_until
 *    (timestamptz of the server's clock_timestamp(); the client's clock is
 *    never used). Rows are not deleted on release; dlock_gc() removes the
 *    rows of locks unused for a while.
 *  - Acquire is one statement: an upsert that inserts the row or takes it
 *    over only when its lease has ended, RETURNING the token; the same
 *    statement reads the holder's lease left (for the retry timer) and,
 *    for a caller that will wait, appends its entry to T_waiters while
 *    the upsert holds the row.
 *  - Tokens come from the sequence T_tokens: strictly increasing for every
 *    name, whatever the clocks do and whether or not gc removed a row.
 *  - Release is one statement, the function T_release: with the row
 *    locked it hands the lock to the oldest waiter whose session is alive
 *    (new token, its own lease) and notifies that waiter's client alone
 *    (channel dlock_CLIENTID, "g WAITER TOKEN", delivered at commit), or
 *    frees the row. Extend is one guarded UPDATE.
 *  - Waiting (both modes: the lock is never free while a live waiter is
 *    queued, so nobody barges in): the client LISTENs on its channel on
 *    its command connection while it has waiters; the waiter returns on
 *    its grant with no further round trip. A waiter is alive as long as
 *    that session listens (it holds an advisory lock of its own while it
 *    does; a release probes it): nothing is refreshed while it waits.
 *    A wait that ends without the lock leaves with T_leave, which keeps
 *    a lock handed over meanwhile. docs/design.md,
 *    "PostgreSQL table mode: hand-over", has the failure cases.
 *
 * Advisory mode (?mode=advisory): PostgreSQL's session-level advisory
 * locks. The key of lock NAME is the first 64 bits of md5(NAME). Each hold
 * keeps its own connection (from the client's pool) until the release; the
 * server frees the lock when that session ends, so there is no lease and
 * no watchdog. Waiting is the server's own (pg_advisory_lock with
 * lock_timeout = the caller's wait): first come, first served, no polling.
 * Tokens come from the sequence T_tokens. The client thread watches every
 * hold's connection and reports a hold lost the moment its session ends.
 *
 * Connections: the client's command connection (which also LISTENs, and
 * is read by the client thread or a waiting application thread while no
 * statement runs on it) and, for statements in flight beside it, extra
 * ones closed after a second unused: one connection per client at rest.
 * All I/O is non-blocking with the caller's deadline; a connection that
 * misses its deadline is closed (the server ends what it was doing).
 * Statements are prepared once per connection, unless a pooler that may
 * not keep them sits in front (?pooler=, detected at open).
 */
#include "../core/internal.h"

#include <libpq-fe.h>

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#define PG_DEFAULT_TABLE "dlock_locks"
#define PG_TABLE_MAX 48     /* + "_tokens"/"_waiters": under 63 bytes */
#define PG_IDLE_MAX 8       /* idle extra connections kept (for a second) */
#define PG_IDLE_MS 1000     /* extras unused, or no waiter, for this long:
                             * close them, UNLISTEN */
#define PG_APPNAME_MAX 63

/* The server's clock, and the advisory key of a bytea name. */
#define NOW "clock_timestamp()"
#define MS_LEFT(ts) "ceil(extract(epoch FROM " ts " - " NOW ") * 1000)::bigint"
#define KEY(x) "('x' || substr(md5(" x "), 1, 16))::bit(64)::bigint"
/* The advisory lock a listening session holds while it listens: the
 * two-int key space (advisory mode uses one bigint), both halves of
 * md5(text), here 'CLIENTID:PID'. */
#define SKEY(x)                                                             \
    "('x' || substr(md5(" x "), 1, 8))::bit(32)::int, ('x' || substr(md5("  \
    x "), 9, 8))::bit(32)::int"
/* A waiter's session (columns client, pid of T_waiters) still listens: it
 * holds its key (a shared try is refused). The running session's own pid:
 * alive if the entry is of the running client (`me`), whose session does
 * not conflict with its own lock; any other client's is from a dead
 * session that had this pid. */
#define ALIVE(w, me)                                                        \
    "(CASE WHEN " w ".pid = pg_backend_pid() THEN " w ".client = " me       \
    " ELSE NOT pg_try_advisory_xact_lock_shared(" SKEY(                     \
        w ".client || ':' || " w ".pid") ") END)"

enum {
    S_ACQUIRE,
    S_RELEASE,
    S_EXTEND,
    S_INSPECT,
    S_QUEUE,
    S_LEAVE,
    S_GC,
    S_GC_QUEUE,
    S_ADV_TRY,
    S_ADV_UNLOCK,
    S_ADV_CHECK,
    S_ADV_INSPECT,
    S_COUNT
};

/* Parameter types: bytea, text, int8, int4 (OIDs fixed by PostgreSQL). */
#define T_BYTEA 17
#define T_TEXT 25
#define T_INT8 20
#define T_INT4 23

/* ?pooler= */
enum { POOLER_NONE, POOLER_SESSION, POOLER_TRANSACTION };

typedef struct pg_conn {
    PGconn *pg;
    unsigned prepared; /* bit i: statement i prepared on this connection */
    int broken;        /* unusable: close instead of pooling */
    /* advisory holds */
    pthread_mutex_t mu; /* the hold's owner vs the client thread */
    int dead;           /* the client thread saw its session end */
    int watched;        /* in the epoll set */
    struct pg_conn *next, *prev;
} pg_conn;

typedef struct pg_store {
    dlock_client *client;
    char *redacted;
    int advisory;
    int64_t timeout_ms;
    int pooler;    /* ?pooler= */
    int behind;    /* a pooler sits in front (detected) */
    int sessions;  /* LISTEN and session locks can be trusted */
    int unnamed;   /* no prepared statements (transaction pooling) */

    /* libpq connection keywords and values (owned; password wiped) */
    const char *keys[24];
    char *vals[24];

    char table[PG_TABLE_MAX + 1];
    char *sql[S_COUNT];
    int nparams[S_COUNT];
    char seq_ident[2 * PG_TABLE_MAX + 24]; /* "T_tokens" */
    char seq_lit[4 * PG_TABLE_MAX + 48];   /* '"T_tokens"', a literal */
    char chan[48];                         /* dlock_CLIENTID */

    pthread_mutex_t mu; /* the command connection, the pool, waiting */
    pthread_cond_t cv;  /* the command connection became free */
    pg_conn *main;      /* the command connection (NULL: none now) */
    int main_busy;      /* a thread uses it (a statement, or reading) */
    int main_pending;   /* an UNLISTEN was sent: its answer is unread */
    int listening;      /* main LISTENs on chan */
    unsigned gen;       /* +1 whenever a listening main is lost */
    int lpid;           /* main's backend pid on the server ... */
    char lsince[48];    /* ... and its backend_start */
    int nwait;          /* leases counted as waiting (listening refs) */
    pg_conn *idle;      /* extra connections */
    int nidle;

    int epfd;    /* the client thread's fd: main, idle timer, holds */
    int idle_fd; /* one-shot: close extras; nobody waits: UNLISTEN */

    pthread_mutex_t hmu; /* advisory holds' connections */
    pg_conn *holds;
} pg_store;

typedef struct pg_lease {
    int listening; /* counted in nwait ... */
    unsigned gen;  /* ... for this generation of the listening session */
    int queued;    /* a try of this wait appended its entry */
    pg_conn *hold; /* advisory: the connection holding the lock */
} pg_lease;

#define EV_MAIN 2u
#define EV_IDLE 3u

static void quiet(void *arg, const char *message)
{
    (void)arg;
    (void)message; /* the library never prints: notices are dropped */
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

/* The first line of a libpq message, without its trailing newline. */
static const char *one_line(const char *msg, char *buf, size_t cap)
{
    size_t n = strcspn(msg ? msg : "", "\n");

    snprintf(buf, cap, "%.*s", (int)(n < cap ? n : cap - 1),
             msg ? msg : "");
    return buf;
}

/* A failed result: the code for its SQLSTATE, with the server's words. */
static int result_error(pg_store *ps, const PGresult *r, const char *what)
{
    const char *state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    const char *msg = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY)
                        : NULL;
    char buf[400];
    int code = DLOCK_EPROTO;

    if (state) {
        if (!strncmp(state, "28", 2) || !strcmp(state, "42501"))
            code = DLOCK_EAUTH;
        else if (!strcmp(state, "55P03"))
            code = DLOCK_EBUSY;
        else if (!strncmp(state, "08", 2) || !strncmp(state, "57", 2) ||
                 !strncmp(state, "53", 2) || !strncmp(state, "58", 2) ||
                 !strcmp(state, "25006") || !strcmp(state, "40001") ||
                 !strcmp(state, "40P01"))
            code = DLOCK_ECONN;
    }
    return dlock__err(code, "postgres %s: %s: %s%s%s%s", ps->redacted, what,
                      one_line(msg ? msg
                                   : r ? PQresultErrorMessage(r)
                                       : "no answer",
                               buf, sizeof(buf)),
                      state ? " (SQLSTATE " : "", state ? state : "",
                      state ? ")" : "");
}

/* The connection failed: ECONN (or EAUTH for a refused login). */
static int conn_error(pg_store *ps, pg_conn *cn, const char *what)
{
    char buf[400];
    const char *msg = PQerrorMessage(cn->pg);
    int code = DLOCK_ECONN;

    cn->broken = 1;
    if (strstr(msg, "authentication") || strstr(msg, "password") ||
        strstr(msg, "permission denied") || strstr(msg, "no pg_hba.conf"))
        code = DLOCK_EAUTH;
    return dlock__err(code, "postgres %s: %s: %s", ps->redacted, what,
                      one_line(msg[0] ? msg : "connection lost", buf,
                               sizeof(buf)));
}

static int timeout_error(pg_store *ps, pg_conn *cn, const char *what)
{
    cn->broken = 1;
    return dlock__err(DLOCK_ECONN, "postgres %s: %s: no answer in time",
                      ps->redacted, what);
}

static int enomem(void)
{
    return dlock__err(DLOCK_ENOMEM, "out of memory");
}

/* ------------------------------------------------------------------------ */
/* Connections                                                              */
/* ------------------------------------------------------------------------ */

/* Waits until fd is ready for `events` or `deadline`; 1 ready, 0 timeout,
 * -1 error. */
static int wait_fd(int fd, short events, int64_t deadline)
{
    struct pollfd p = {fd, events, 0};

    for (;;) {
        int64_t left = deadline == DLOCK__FOREVER ? -1
                                                  : deadline - dlock__now_ms();
        if (deadline != DLOCK__FOREVER && left <= 0)
            return 0;
        int r = poll(&p, 1, left > 60000 || left < 0 ? 60000 : (int)left);
        if (r > 0)
            return 1;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

static void conn_free(pg_conn *cn)
{
    if (!cn)
        return;
    if (cn->pg)
        PQfinish(cn->pg);
    pthread_mutex_destroy(&cn->mu);
    free(cn);
}

/* Opens a connection within `deadline`. */
static int conn_open(pg_store *ps, int64_t deadline, pg_conn **out)
{
    pg_conn *cn = calloc(1, sizeof(*cn));
    PostgresPollingStatusType st = PGRES_POLLING_WRITING;
    int rc;

    *out = NULL;
    if (!cn)
        return enomem();
    pthread_mutex_init(&cn->mu, NULL);
    cn->pg = PQconnectStartParams(ps->keys, (const char *const *)ps->vals,
                                  0);
    if (!cn->pg) {
        conn_free(cn);
        return enomem();
    }
    PQsetNoticeProcessor(cn->pg, quiet, NULL);
    if (PQstatus(cn->pg) == CONNECTION_BAD) {
        rc = conn_error(ps, cn, "connecting");
        conn_free(cn);
        return rc;
    }
    while (st != PGRES_POLLING_OK) {
        if (st == PGRES_POLLING_FAILED) {
            rc = conn_error(ps, cn, "connecting");
            conn_free(cn);
            return rc;
        }
        int r = wait_fd(PQsocket(cn->pg),
                        st == PGRES_POLLING_READING ? POLLIN : POLLOUT,
                        deadline);
        if (r <= 0) {
            rc = dlock__err(DLOCK_ECONN, "postgres %s: connecting: no "
                                         "answer in time",
                            ps->redacted);
            conn_free(cn);
            return rc;
        }
        st = PQconnectPoll(cn->pg);
    }
    if (PQsetnonblocking(cn->pg, 1) != 0) {
        rc = conn_error(ps, cn, "connecting");
        conn_free(cn);
        return rc;
    }
    *out = cn;
    return DLOCK_OK;
}

static int collect(pg_store *ps, pg_conn *cn, int64_t deadline,
                   PGresult **out, const char *what);
static void drain_notifies(pg_store *ps, pg_conn *cn);

/* (Re)arms the one-shot epoll entry of the command connection: the
 * client thread (or a waiting thread) reads it while nobody else uses it.
 * Table mode only. */
static void main_watch(pg_store *ps, pg_conn *cn, int op)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLONESHOT};

    if (ps->advisory)
        return;
    ev.data.u64 = EV_MAIN;
    epoll_ctl(ps->epfd, op, PQsocket(cn->pg), &ev);
}

static void idle_timer(pg_store *ps)
{
    struct itimerspec its;

    memset(&its, 0, sizeof(its));
    its.it_value.tv_sec = PG_IDLE_MS / 1000;
    its.it_value.tv_nsec = (PG_IDLE_MS % 1000) * 1000000L;
    timerfd_settime(ps->idle_fd, 0, &its, NULL);
}

/* The command connection broke or was closed (its user holds main_busy;
 * mu held): forget it. Its session LISTENed for our waiters, so they arm
 * again (on a new connection) and try again. */
static void main_lost(pg_store *ps)
{
    pg_conn *cn = ps->main;

    ps->main = NULL;
    ps->main_busy = 0;
    ps->main_pending = 0;
    pthread_cond_broadcast(&ps->cv);
    if (cn && !ps->advisory && PQsocket(cn->pg) >= 0)
        epoll_ctl(ps->epfd, EPOLL_CTL_DEL, PQsocket(cn->pg), NULL);
    if (ps->listening) {
        ps->listening = 0;
        ps->gen++;
        dlock__notify_error(ps->client);
    }
    conn_free(cn);
}

/* Is an idle connection still usable? It has nothing to read unless the
 * server closed it (a restart) or sent notifications. */
static int conn_alive(pg_store *ps, pg_conn *cn)
{
    struct pollfd p = {PQsocket(cn->pg), POLLIN, 0};

    if (PQstatus(cn->pg) != CONNECTION_OK)
        return 0;
    if (poll(&p, 1, 0) == 0)
        return 1;
    if (!PQconsumeInput(cn->pg) || PQstatus(cn->pg) != CONNECTION_OK)
        return 0;
    drain_notifies(ps, cn);
    return 1;
}

/*
 * A connection for one statement: the command connection when it is free
 * (`need_main`: wait until it is, until `deadline`), else an idle extra
 * one, or a new one. A new connection becomes the command connection when
 * there is none.
 */
static int conn_get_ex(pg_store *ps, int64_t deadline, pg_conn **out,
                       int need_main)
{
    pg_conn *cn = NULL;
    int rc;

    *out = NULL;
    if (deadline > dlock__now_ms() + ps->timeout_ms)
        deadline = dlock__now_ms() + ps->timeout_ms; /* ?timeout= */
    pthread_mutex_lock(&ps->mu);
    while (need_main && ps->main && ps->main_busy &&
           dlock__now_ms() < deadline)
        dlock__cond_wait_until(&ps->cv, &ps->mu, deadline);
    if (ps->main && !ps->main_busy) {
        ps->main_busy = 1;
        cn = ps->main;
        pthread_mutex_unlock(&ps->mu);
        if (ps->main_pending) {
            /* the UNLISTEN sent when the last waiter left: its answer */
            PGresult *r;
            rc = collect(ps, cn, deadline, &r, "UNLISTEN");
            PQclear(r);
            ps->main_pending = 0;
            if (rc == DLOCK_OK)
                ps->listening = 0;
        }
        if (!cn->broken && conn_alive(ps, cn)) {
            *out = cn;
            return DLOCK_OK;
        }
        pthread_mutex_lock(&ps->mu);
        main_lost(ps);
        cn = NULL;
    } else if (need_main && ps->main) {
        pthread_mutex_unlock(&ps->mu);
        return dlock__err(DLOCK_ECONN, "postgres %s: the command "
                                       "connection stayed busy",
                          ps->redacted);
    }
    int as_main = ps->main == NULL;
    if (as_main)
        ps->main_busy = 1; /* ours, as soon as it exists */
    else if (ps->idle) {
        cn = ps->idle;
        ps->idle = cn->next;
        ps->nidle--;
        cn->next = NULL;
    }
    pthread_mutex_unlock(&ps->mu);
    while (cn) {
        if (conn_alive(ps, cn)) {
            *out = cn;
            return DLOCK_OK;
        }
        conn_free(cn);
        cn = NULL;
    }
    rc = conn_open(ps, deadline, &cn);
    pthread_mutex_lock(&ps->mu);
    if (as_main) {
        if (rc == DLOCK_OK) {
            ps->main = cn;
            main_watch(ps, cn, EPOLL_CTL_ADD);
        } else {
            ps->main_busy = 0;
            pthread_cond_broadcast(&ps->cv);
        }
    }
    pthread_mutex_unlock(&ps->mu);
    *out = cn;
    return rc;
}

static int conn_get(pg_store *ps, int64_t deadline, pg_conn **out)
{
    return conn_get_ex(ps, deadline, out, 0);
}

static void conn_put(pg_store *ps, pg_conn *cn)
{
    if (!cn)
        return;
    int usable = !cn->broken && !cn->dead &&
                 PQstatus(cn->pg) == CONNECTION_OK &&
                 PQtransactionStatus(cn->pg) == PQTRANS_IDLE;
    if (usable)
        drain_notifies(ps, cn);
    pthread_mutex_lock(&ps->mu);
    if (cn == ps->main) {
        if (!usable) {
            main_lost(ps);
        } else {
            ps->main_busy = 0;
            pthread_cond_signal(&ps->cv);
            main_watch(ps, cn, EPOLL_CTL_MOD);
        }
        pthread_mutex_unlock(&ps->mu);
        return;
    }
    if (usable && ps->nidle < PG_IDLE_MAX) {
        cn->next = ps->idle;
        ps->idle = cn;
        ps->nidle++;
        cn = NULL;
        idle_timer(ps);
    }
    pthread_mutex_unlock(&ps->mu);
    conn_free(cn);
}

static int failed_result(const PGresult *r)
{
    ExecStatusType s = PQresultStatus(r);
    return s != PGRES_TUPLES_OK && s != PGRES_COMMAND_OK &&
           s != PGRES_EMPTY_QUERY;
}

/*
 * Sends what is queued and collects every result of the command in flight
 * until `deadline`. *out gets the first failed result, else the last one
 * (the caller PQclear()s it). On a timeout or a broken connection the
 * connection is marked broken and ECONN returned.
 */
static int collect(pg_store *ps, pg_conn *cn, int64_t deadline,
                   PGresult **out, const char *what)
{
    PGresult *keep = NULL;

    *out = NULL;
    for (;;) {
        int f = PQflush(cn->pg);
        if (f < 0)
            goto broken;
        if (f == 0 && !PQisBusy(cn->pg)) {
            PGresult *r = PQgetResult(cn->pg);
            if (!r)
                break;
            if (!keep || (!failed_result(keep) &&
                          (failed_result(r) ||
                           PQresultStatus(r) == PGRES_TUPLES_OK ||
                           PQresultStatus(keep) != PGRES_TUPLES_OK))) {
                PQclear(keep); /* the first failure, else the last rows */
                keep = r;
            } else {
                PQclear(r);
            }
            continue;
        }
        int r = wait_fd(PQsocket(cn->pg), f == 1 ? POLLIN | POLLOUT : POLLIN,
                        deadline);
        if (r == 0) {
            PQclear(keep);
            return timeout_error(ps, cn, what);
        }
        if (r < 0 || !PQconsumeInput(cn->pg))
            goto broken;
    }
    if (PQstatus(cn->pg) != CONNECTION_OK)
        goto broken;
    *out = keep;
    if (!keep)
        return dlock__err(DLOCK_EPROTO, "postgres %s: %s: no result",
                          ps->redacted, what);
    return DLOCK_OK;
broken:
    PQclear(keep);
    return conn_error(ps, cn, what);
}

/* `keep`'s status: DLOCK_OK for a success, else its error (cleared). */
static int result_ok(pg_store *ps, PGresult **r, const char *what)
{
    ExecStatusType s = PQresultStatus(*r);

    if (s == PGRES_TUPLES_OK || s == PGRES_COMMAND_OK)
        return DLOCK_OK;
    int rc = result_error(ps, *r, what);
    PQclear(*r);
    *r = NULL;
    return rc;
}

/*
 * Runs prepared statement `which` with parameter values (vals[0], the lock
 * name, in binary: any bytes) on cn; *out the result on DLOCK_OK.
 */
static int run(pg_store *ps, pg_conn *cn, int which, const char *const *vals,
               const int *lens, int64_t deadline, PGresult **out,
               const char *what)
{
    static const char *const names[S_COUNT] = {
        "dlock0", "dlock1", "dlock2", "dlock3",  "dlock4", "dlock5",
        "dlock6", "dlock7", "dlock8", "dlock9", "dlock10", "dlock11"};
    static const Oid types[S_COUNT][8] = {
        [S_ACQUIRE] = {T_BYTEA, T_TEXT, T_INT8, T_TEXT, T_TEXT, T_INT8,
                       T_INT4, T_TEXT},
        [S_RELEASE] = {T_BYTEA, T_TEXT, T_INT8},
        [S_EXTEND] = {T_BYTEA, T_TEXT, T_INT8, T_INT8},
        [S_INSPECT] = {T_BYTEA},
        [S_QUEUE] = {T_BYTEA, T_TEXT},
        [S_LEAVE] = {T_BYTEA, T_TEXT, T_TEXT, T_INT8, T_INT8},
        [S_GC] = {T_INT8},
        [S_GC_QUEUE] = {T_TEXT},
        [S_ADV_TRY] = {T_BYTEA, T_TEXT},
        [S_ADV_UNLOCK] = {T_BYTEA},
        [S_ADV_CHECK] = {T_BYTEA},
        [S_ADV_INSPECT] = {T_BYTEA},
    };
    int fmts[8] = {0};
    int n = ps->nparams[which];
    PGresult *r;
    int rc;

    *out = NULL;
    if (deadline > dlock__now_ms() + ps->timeout_ms)
        deadline = dlock__now_ms() + ps->timeout_ms; /* ?timeout= */
    if (n > 0 && types[which][0] == T_BYTEA)
        fmts[0] = 1;
    if (ps->unnamed) {
        /* a pooler may run each transaction on another session: no
         * prepared statements (the text goes with every call) */
        if (!PQsendQueryParams(cn->pg, ps->sql[which], n, types[which],
                               vals, lens, fmts, 0))
            return conn_error(ps, cn, what);
        goto answer;
    }
    if (!(cn->prepared & (1u << which))) {
        if (!PQsendPrepare(cn->pg, names[which], ps->sql[which], n,
                           types[which]))
            return conn_error(ps, cn, what);
        rc = collect(ps, cn, deadline, &r, what);
        if (rc)
            return rc;
        rc = result_ok(ps, &r, what);
        if (rc)
            return rc;
        PQclear(r);
        cn->prepared |= 1u << which;
    }
    if (!PQsendQueryPrepared(cn->pg, names[which], n, vals, lens, fmts, 0))
        return conn_error(ps, cn, what);
answer:
    rc = collect(ps, cn, deadline, &r, what);
    if (rc)
        return rc;
    rc = result_ok(ps, &r, what);
    if (rc)
        return rc;
    *out = r;
    return DLOCK_OK;
}

/* One statement on a pooled connection. */
static int run_pooled(pg_store *ps, int which, const char *const *vals,
                      const int *lens, int64_t deadline, PGresult **out,
                      const char *what)
{
    pg_conn *cn;
    int rc = conn_get(ps, deadline, &cn);

    if (rc)
        return rc;
    rc = run(ps, cn, which, vals, lens, deadline, out, what);
    conn_put(ps, cn);
    return rc;
}

/* A query text (no parameters; may hold several statements). */
static int run_text(pg_store *ps, pg_conn *cn, const char *sql,
                    int64_t deadline, PGresult **out, const char *what)
{
    int rc;

    *out = NULL;
    if (!PQsendQuery(cn->pg, sql))
        return conn_error(ps, cn, what);
    rc = collect(ps, cn, deadline, out, what);
    if (rc)
        return rc;
    return result_ok(ps, out, what);
}

static long long col_ll(const PGresult *r, int row, int col, long long dflt)
{
    if (PQntuples(r) <= row || PQnfields(r) <= col ||
        PQgetisnull(r, row, col))
        return dflt;
    return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

/* ------------------------------------------------------------------------ */
/* Names, channels, identifiers                                             */
/* ------------------------------------------------------------------------ */

/* "name" with embedded quotes doubled: any table name is one identifier. */
static void quote_ident(const char *in, const char *suffix, char *out,
                        size_t cap)
{
    size_t o = 0;
    char both[PG_TABLE_MAX + 16];

    snprintf(both, sizeof(both), "%s%s", in, suffix);
    out[o++] = '"';
    for (const char *p = both; *p && o + 3 < cap; p++) {
        if (*p == '"')
            out[o++] = '"';
        out[o++] = *p;
    }
    out[o++] = '"';
    out[o] = '\0';
}

/* 'text' with embedded single quotes doubled. */
static void quote_literal(const char *in, char *out, size_t cap)
{
    size_t o = 0;

    out[o++] = '\'';
    for (; *in && o + 3 < cap; in++) {
        if (*in == '\'')
            out[o++] = '\'';
        out[o++] = *in;
    }
    out[o++] = '\'';
    out[o] = '\0';
}

/* The application_name of a hold: "dlock " + desc, within 63 bytes. */
static void appname(const dlock__lease *l, char *out, size_t cap)
{
    snprintf(out, cap < PG_APPNAME_MAX + 1 ? cap : PG_APPNAME_MAX + 1,
             "%s", l->desc);
}

/* ------------------------------------------------------------------------ */
/* Notifications (table mode): LISTEN dlock_CLIENTID on the command         */
/* connection                                                               */
/* ------------------------------------------------------------------------ */

/* A notification on our channel: "g WAITER TOKEN", the lock handed to one
 * of our waiters. */
static void dispatch(pg_store *ps, const PGnotify *nt)
{
    unsigned long long waiter, token;
    int end = 0;

    if (strcmp(nt->relname, ps->chan) != 0)
        return;
    if (sscanf(nt->extra, "g %llu %llu%n", &waiter, &token, &end) == 2 &&
        nt->extra[end] == '\0' && token > 0)
        dlock__notify_grant(ps->client, waiter, token);
}

/* Hands every notification libpq has read on cn to its waiter (whoever
 * uses cn: a statement's thread, or the one reading it while idle). */
static void drain_notifies(pg_store *ps, pg_conn *cn)
{
    PGnotify *nt;

    while ((nt = PQnotifies(cn->pg)) != NULL) {
        dispatch(ps, nt);
        PQfreemem(nt);
    }
}

/* Counts lease l as waiting: while any lease waits, the command
 * connection LISTENs (once per session; the session's pid and start go
 * into the lease's queue entry, so that a release can tell whether it is
 * alive). `may_send`: LISTEN now if needed (else just say whether the
 * client listens already). DLOCK_OK, DLOCK_EBUSY (not listening and
 * !may_send), or an error. */
static int listen_ref(pg_store *ps, pg_lease *pl, int64_t deadline,
                      int may_send)
{
    pg_conn *cn;
    PGresult *r;
    char sql[512];
    int rc;

    pthread_mutex_lock(&ps->mu);
    if (pl->listening && pl->gen == ps->gen && ps->listening) {
        pthread_mutex_unlock(&ps->mu);
        return DLOCK_OK;
    }
    if (pl->listening) /* a lost generation's reference */
        ps->nwait--;
    pl->listening = 0;
    if (ps->listening && !ps->main_pending) {
        pl->listening = 1;
        pl->gen = ps->gen;
        ps->nwait++;
        pthread_mutex_unlock(&ps->mu);
        return DLOCK_OK;
    }
    pthread_mutex_unlock(&ps->mu);
    if (!may_send)
        return DLOCK_EBUSY;
    if (!ps->sessions)
        return dlock__err(DLOCK_ENOTSUP,
                          "postgres %s: waiting needs LISTEN on a session "
                          "of its own, which %s: try once (wait 0), or "
                          "connect to the server or to a session-mode pool "
                          "(?pooler=session)",
                          ps->redacted,
                          ps->pooler == POOLER_TRANSACTION
                              ? "transaction pooling (?pooler=transaction) "
                                "does not keep"
                              : "a pooler in front of the server may not "
                                "keep (say ?pooler=session if it does)");
    rc = conn_get_ex(ps, deadline, &cn, 1);
    if (rc)
        return rc;
    if (ps->listening) {
        rc = DLOCK_OK; /* another thread did it meanwhile */
    } else {
        /* the session's advisory lock says that it listens (released
         * with UNLISTEN, or by the server when the session ends) */
        snprintf(sql, sizeof(sql),
                 "LISTEN %s; SELECT pid, backend_start, "
                 "pg_try_advisory_lock(" SKEY("'%s:' || pid") ") FROM "
                 "pg_stat_get_activity(pg_backend_pid())",
                 ps->chan, dlock__client_id(ps->client),
                 dlock__client_id(ps->client));
        rc = run_text(ps, cn, sql, deadline, &r, "LISTEN");
        if (rc == DLOCK_OK) {
            if (PQntuples(r) == 1 && PQnfields(r) == 3) {
                ps->lpid = atoi(PQgetvalue(r, 0, 0));
                snprintf(ps->lsince, sizeof(ps->lsince), "%s",
                         PQgetvalue(r, 0, 1));
                ps->listening = 1;
            } else {
                rc = dlock__err(DLOCK_EPROTO, "postgres %s: LISTEN: no "
                                              "session row",
                                ps->redacted);
            }
            PQclear(r);
        }
    }
    pthread_mutex_lock(&ps->mu);
    if (rc == DLOCK_OK) {
        pl->listening = 1;
        pl->gen = ps->gen;
        ps->nwait++;
    }
    pthread_mutex_unlock(&ps->mu);
    conn_put(ps, cn);
    return rc;
}

/* Lease l waits no more. With no waiter left, the client stops listening
 * in a second, unless it waits again by then: PostgreSQL wakes every
 * listening session of the database at every NOTIFY. */
static void listen_unref(pg_store *ps, pg_lease *pl)
{
    pthread_mutex_lock(&ps->mu);
    if (pl->listening && --ps->nwait == 0)
        idle_timer(ps);
    pl->listening = 0;
    pl->queued = 0;
    pthread_mutex_unlock(&ps->mu);
}

/* The idle timer (client thread or a waiting thread: never blocks):
 * extra connections unused for a second are closed; with no waiter, the
 * command connection stops listening (sent now, its answer read later). */
static void idle_run(pg_store *ps)
{
    pg_conn *extra, *cn = NULL;

    pthread_mutex_lock(&ps->mu);
    extra = ps->idle;
    ps->idle = NULL;
    ps->nidle = 0;
    if (ps->nwait == 0 && ps->listening && ps->main && !ps->main_busy) {
        cn = ps->main;
        ps->main_busy = 1;
    } else if (ps->nwait == 0 && ps->listening) {
        idle_timer(ps); /* in use: later */
    }
    pthread_mutex_unlock(&ps->mu);
    while (extra) {
        pg_conn *next = extra->next;
        conn_free(extra);
        extra = next;
    }
    if (!cn)
        return;
    int ok = !ps->main_pending &&
             PQsendQuery(cn->pg, "UNLISTEN *; SELECT "
                                 "pg_advisory_unlock_all()") &&
             PQflush(cn->pg) == 0;
    pthread_mutex_lock(&ps->mu);
    if (!ok) {
        cn->broken = 1;
        main_lost(ps);
    } else {
        ps->main_pending = 1;
        ps->listening = 0; /* a new wait LISTENs again */
        ps->main_busy = 0;
        pthread_cond_signal(&ps->cv);
        main_watch(ps, cn, EPOLL_CTL_MOD);
    }
    pthread_mutex_unlock(&ps->mu);
}

/* The command connection is readable while nobody uses it: a
 * notification, the answer of an UNLISTEN, or the server closing it. */
static void main_read(pg_store *ps)
{
    pg_conn *cn;

    pthread_mutex_lock(&ps->mu);
    if (!ps->main || ps->main_busy) {
        /* its user re-arms the watch when it gives it back */
        pthread_mutex_unlock(&ps->mu);
        return;
    }
    cn = ps->main;
    ps->main_busy = 1;
    pthread_mutex_unlock(&ps->mu);
    int ok = PQconsumeInput(cn->pg) && PQstatus(cn->pg) == CONNECTION_OK;
    if (ok) {
        drain_notifies(ps, cn);
        PGresult *r;
        while (!PQisBusy(cn->pg) && (r = PQgetResult(cn->pg)) != NULL)
            PQclear(r);
        if (!PQisBusy(cn->pg))
            ps->main_pending = 0;
    }
    pthread_mutex_lock(&ps->mu);
    if (!ok) {
        main_lost(ps);
    } else {
        ps->main_busy = 0;
        pthread_cond_signal(&ps->cv);
        main_watch(ps, cn, EPOLL_CTL_MOD);
    }
    pthread_mutex_unlock(&ps->mu);
}

/* ------------------------------------------------------------------------ */
/* Table mode                                                               */
/* ------------------------------------------------------------------------ */

static int pg_acquire(void *st, dlock__lease *l, int64_t op_deadline)
{
    pg_store *ps = st;
    pg_lease *pl = l->priv;
    char ttl[24], waiter[24], pid[16], since[48];
    const char *client = NULL;
    PGresult *r;
    int rc;

    /* a caller that will wait joins the queue in this try when its client
     * listens already (the first try: then no arm() is needed), or once
     * arm() made it listen */
    if (l->may_wait && ps->sessions &&
        listen_ref(ps, pl, op_deadline, 0) == DLOCK_OK) {
        pthread_mutex_lock(&ps->mu);
        if (ps->listening && pl->gen == ps->gen) {
            client = dlock__client_id(ps->client);
            snprintf(pid, sizeof(pid), "%d", ps->lpid);
            snprintf(since, sizeof(since), "%s", ps->lsince);
        }
        pthread_mutex_unlock(&ps->mu);
    }
    snprintf(ttl, sizeof(ttl), "%lld", (long long)l->ttl_ms);
    snprintf(waiter, sizeof(waiter), "%llu", (unsigned long long)l->waiter);
    const char *vals[8] = {l->name, l->owner, ttl, l->desc, client, waiter,
                           client ? pid : NULL, client ? since : NULL};
    int lens[8] = {(int)l->name_len, 0, 0, 0, 0, 0, 0, 0};
    rc = run_pooled(ps, S_ACQUIRE, vals, lens, op_deadline, &r,
                    "taking the lock");
    if (rc == DLOCK_OK) {
        long long token = col_ll(r, 0, 0, -1);
        long long left = col_ll(r, 0, 1, -1);
        int queued = col_ll(r, 0, 2, 0) > 0;
        PQclear(r);
        if (token > 0) {
            l->token = (uint64_t)token;
            rc = DLOCK_OK;
        } else {
            /* the fallback timer: the holder's lease end (a crashed
             * holder releases nothing); a row made after the statement's
             * snapshot shows no lease: soon */
            l->retry_ms = left > 0 ? left : 50;
            if (queued || pl->queued)
                pl->queued = 1;
            if (client && !l->waiting)
                l->armed = 1; /* queued, and its grant will be heard */
            rc = DLOCK_EBUSY;
        }
    }
    if (!l->waiting && (rc != DLOCK_EBUSY || !client)) {
        /* the core calls disarm() only for a lease that waited */
        if (pl->listening)
            listen_unref(ps, pl);
    }
    return rc;
}

static int pg_arm(void *st, dlock__lease *l, int64_t op_deadline)
{
    pg_store *ps = st;
    pg_lease *pl = l->priv;

    return listen_ref(ps, pl, op_deadline, 1);
}

static void pg_disarm(void *st, dlock__lease *l, int acquired)
{
    pg_store *ps = st;

    (void)acquired; /* leaving the queue is abandon()'s */
    listen_unref(ps, l->priv);
}

/* The wait ends without the lock: leave the queue, unless the lock was
 * handed to us meanwhile (then keep it, lease restarted). */
static int pg_abandon(void *st, dlock__lease *l, int64_t op_deadline)
{
    pg_store *ps = st;
    char waiter[24], ttl[24];
    PGresult *r;
    int rc;

    snprintf(waiter, sizeof(waiter), "%llu", (unsigned long long)l->waiter);
    snprintf(ttl, sizeof(ttl), "%lld", (long long)l->ttl_ms);
    const char *vals[5] = {l->name, l->owner, dlock__client_id(ps->client),
                           waiter, ttl};
    int lens[5] = {(int)l->name_len, 0, 0, 0, 0};
    rc = run_pooled(ps, S_LEAVE, vals, lens, op_deadline, &r,
                    "leaving the queue");
    if (rc)
        return rc;
    long long token = col_ll(r, 0, 0, -1);
    PQclear(r);
    if (token > 0) {
        l->token = (uint64_t)token;
        return DLOCK_OK;
    }
    return DLOCK_EBUSY;
}

static int not_ours(pg_store *ps)
{
    return dlock__err(DLOCK_ENOTHELD,
                      "postgres %s: the lock row is no longer ours (expired "
                      "or taken over)",
                      ps->redacted);
}

static int pg_release(void *st, dlock__lease *l, int64_t op_deadline)
{
    pg_store *ps = st;
    char token[24];
    PGresult *r;
    int rc;

    snprintf(token, sizeof(token), "%llu", (unsigned long long)l->token);
    const char *vals[3] = {l->name, l->owner, token};
    int lens[3] = {(int)l->name_len, 0, 0};
    rc = run_pooled(ps, S_RELEASE, vals, lens, op_deadline, &r,
                    "releasing the lock");
    if (rc)
        return rc;
    int released = PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "t");
    if (released && !PQgetisnull(r, 0, 1)) {
        /* handed over: to a waiter of ours? then wake it now, not when
         * the notification comes back */
        const char *to = PQgetvalue(r, 0, 1);
        const char *id = dlock__client_id(ps->client);
        size_t n = strlen(id);
        if (!strncmp(to, id, n) && to[n] == ':')
            dlock__notify_grant(ps->client, strtoull(to + n + 1, NULL, 10),
                                (uint64_t)col_ll(r, 0, 2, 0));
    }
    PQclear(r);
    return released ? DLOCK_OK : not_ours(ps);
}

static int pg_extend(void *st, dlock__lease *l, int64_t ttl_ms,
                     int64_t op_deadline)
{
    pg_store *ps = st;
    char token[24], ttl[24];
    PGresult *r;
    int rc;

    snprintf(token, sizeof(token), "%llu", (unsigned long long)l->token);
    snprintf(ttl, sizeof(ttl), "%lld", (long long)ttl_ms);
    const char *vals[4] = {l->name, l->owner, token, ttl};
    int lens[4] = {(int)l->name_len, 0, 0, 0};
    rc = run_pooled(ps, S_EXTEND, vals, lens, op_deadline, &r,
                    "extending the lease");
    if (rc)
        return rc;
    int changed = !strcmp(PQcmdTuples(r), "1");
    PQclear(r);
    return changed ? DLOCK_OK : not_ours(ps);
}

static int pg_inspect(void *st, const char *name, size_t len,
                      dlock_info *out, int64_t op_deadline)
{
    pg_store *ps = st;
    pg_conn *cn;
    PGresult *r;
    int rc;

    const char *vals[2] = {name, dlock__client_id(ps->client)};
    int lens[2] = {(int)len, 0};
    rc = conn_get(ps, op_deadline, &cn);
    if (rc)
        return rc;
    rc = run(ps, cn, S_INSPECT, vals, lens, op_deadline, &r,
             "reading the lock");
    if (rc == DLOCK_OK) {
        if (PQntuples(r) == 1) {
            out->token = (uint64_t)col_ll(r, 0, 2, 0);
            if (!strcmp(PQgetvalue(r, 0, 0), "t")) {
                out->held = 1;
                snprintf(out->holder, sizeof(out->holder), "%s",
                         PQgetvalue(r, 0, 1));
                out->ttl_ms = col_ll(r, 0, 3, -1);
                out->held_ms = col_ll(r, 0, 4, -1);
            }
        }
        PQclear(r);
        rc = run(ps, cn, S_QUEUE, vals, lens, op_deadline, &r,
                 "reading the queue");
    }
    if (rc == DLOCK_OK) {
        for (int i = 0; i < PQntuples(r) && rc == DLOCK_OK; i++)
            rc = dlock__info_add_waiter(out, PQgetvalue(r, i, 0));
        out->waiters = (int64_t)out->queue_len;
        PQclear(r);
    }
    conn_put(ps, cn);
    return rc;
}

static int pg_gc(void *st, int64_t idle_ms, uint64_t *removed,
                 int64_t op_deadline)
{
    pg_store *ps = st;
    char idle[24];
    PGresult *r;
    int rc;

    snprintf(idle, sizeof(idle), "%lld", (long long)idle_ms);
    const char *vals[1] = {idle};
    rc = run_pooled(ps, S_GC, vals, NULL, op_deadline, &r,
                    "removing unused locks");
    if (rc)
        return rc;
    *removed = strtoull(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    const char *me[1] = {dlock__client_id(ps->client)};
    rc = run_pooled(ps, S_GC_QUEUE, me, NULL, op_deadline, &r,
                    "removing dead queue entries");
    if (rc == DLOCK_OK)
        PQclear(r);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Advisory mode                                                            */
/* ------------------------------------------------------------------------ */

/* Watches a hold's connection: its session ending is the lock's loss. */
static void hold_watch(pg_store *ps, pg_conn *cn)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP};

    ev.data.ptr = cn;
    pthread_mutex_lock(&ps->hmu);
    cn->next = ps->holds;
    cn->prev = NULL;
    if (ps->holds)
        ps->holds->prev = cn;
    ps->holds = cn;
    cn->watched = epoll_ctl(ps->epfd, EPOLL_CTL_ADD, PQsocket(cn->pg),
                            &ev) == 0;
    pthread_mutex_unlock(&ps->hmu);
}

static void hold_unwatch(pg_store *ps, pg_conn *cn)
{
    pthread_mutex_lock(&ps->hmu);
    if (cn->watched && PQsocket(cn->pg) >= 0)
        epoll_ctl(ps->epfd, EPOLL_CTL_DEL, PQsocket(cn->pg), NULL);
    cn->watched = 0;
    if (cn->prev)
        cn->prev->next = cn->next;
    else if (ps->holds == cn)
        ps->holds = cn->next;
    if (cn->next)
        cn->next->prev = cn->prev;
    cn->next = cn->prev = NULL;
    pthread_mutex_unlock(&ps->hmu);
}

static int match_conn(const dlock__lease *l, void *arg)
{
    const pg_lease *pl = l->priv;
    return pl && pl->hold == arg;
}

/* The client thread: a watched hold connection became readable. hmu
 * held. */
static void hold_check(pg_store *ps, pg_conn *cn)
{
    int found = 0;

    for (pg_conn *h = ps->holds; h; h = h->next)
        found |= h == cn;
    if (!found || pthread_mutex_trylock(&cn->mu) != 0)
        return; /* released, or its owner is using it right now */
    if (!PQconsumeInput(cn->pg) || PQstatus(cn->pg) != CONNECTION_OK) {
        cn->dead = 1;
        if (cn->watched)
            epoll_ctl(ps->epfd, EPOLL_CTL_DEL, PQsocket(cn->pg), NULL);
        cn->watched = 0;
        dlock__notify_lost(ps->client, match_conn, cn,
                           "the session holding the advisory lock ended "
                           "(connection to the server lost): the server "
                           "has released it");
    }
    while (!cn->dead) {
        /* anything the server sent unasked (a notice) */
        PGresult *r = PQisBusy(cn->pg) ? NULL : PQgetResult(cn->pg);
        if (!r)
            break;
        PQclear(r);
    }
    pthread_mutex_unlock(&cn->mu);
}

/* The lock is ours on cn, token taken: keep cn for the hold. */
static void hold_keep(pg_store *ps, dlock__lease *l, pg_conn *cn,
                      long long token)
{
    pg_lease *pl = l->priv;

    l->token = (uint64_t)token;
    pl->hold = cn;
    hold_watch(ps, cn);
}

static int adv_acquire(void *st, dlock__lease *l, int64_t op_deadline)
{
    pg_store *ps = st;
    char app[PG_APPNAME_MAX + 1];
    pg_conn *cn;
    PGresult *r = NULL;
    int64_t now = dlock__now_ms();
    int rc;

    rc = conn_get(ps, op_deadline, &cn);
    if (rc)
        return rc;
    appname(l, app, sizeof(app));
    if (l->deadline <= now) {
        const char *vals[2] = {l->name, app};
        int lens[2] = {(int)l->name_len, 0};
        rc = run(ps, cn, S_ADV_TRY, vals, lens, op_deadline, &r,
                 "taking the advisory lock");
    } else {
        /* the server waits: lock_timeout ends the wait at our deadline */
        int64_t wait = l->deadline == DLOCK__FOREVER ? 0 : l->deadline - now;
        char *hex = malloc(2 * l->name_len + 1);
        char *lit = PQescapeLiteral(cn->pg, app, strlen(app));
        char *sql = NULL;
        if (hex && lit) {
            dlock__hex(l->name, l->name_len, hex);
            size_t cap = strlen(hex) + 2 * strlen(lit) + 640;
            sql = malloc(cap);
            if (sql)
                /* the session says who waits ("dlock 0 DESC": no token
                 * yet); a wait that times out rolls the name back */
                snprintf(sql, cap,
                         "SET LOCAL lock_timeout = %lld; "
                         "SELECT set_config('application_name', 'dlock 0 ' "
                         "|| %s, false); "
                         "WITH l AS (SELECT pg_advisory_lock(" KEY(
                             "decode('%s', 'hex')") ")), "
                         "n AS (SELECT nextval(%s) AS t FROM l) "
                         "SELECT t, set_config('application_name', 'dlock ' "
                         "|| t || ' ' || %s, false) FROM n",
                         (long long)wait, lit, hex, ps->seq_lit, lit);
        }
        if (sql) {
            int64_t limit = l->deadline == DLOCK__FOREVER
                                ? DLOCK__FOREVER
                                : l->deadline + ps->timeout_ms;
            rc = run_text(ps, cn, sql, limit, &r,
                          "waiting for the advisory lock");
        } else {
            rc = enomem();
        }
        free(sql);
        free(hex);
        PQfreemem(lit);
    }
    if (rc == DLOCK_OK) {
        long long token = col_ll(r, 0, 0, -1);
        PQclear(r);
        if (token > 0) {
            hold_keep(ps, l, cn, token);
            return DLOCK_OK;
        }
        rc = DLOCK_EBUSY;
    }
    l->retry_ms = -1;
    conn_put(ps, cn);
    return rc;
}

static int adv_release(void *st, dlock__lease *l, int64_t op_deadline)
{
    pg_store *ps = st;
    pg_lease *pl = l->priv;
    pg_conn *cn = pl->hold;
    PGresult *r;
    int rc;

    if (!cn)
        return DLOCK_OK;
    hold_unwatch(ps, cn);
    pl->hold = NULL;
    pthread_mutex_lock(&cn->mu);
    pthread_mutex_unlock(&cn->mu); /* the client thread is done with it */
    if (cn->dead || PQstatus(cn->pg) != CONNECTION_OK) {
        cn->broken = 1;
        conn_put(ps, cn);
        return dlock__err(DLOCK_ENOTHELD,
                          "postgres %s: the session holding the advisory "
                          "lock ended: the server had released it",
                          ps->redacted);
    }
    const char *vals[1] = {l->name};
    int lens[1] = {(int)l->name_len};
    rc = run(ps, cn, S_ADV_UNLOCK, vals, lens, op_deadline, &r,
             "releasing the advisory lock");
    if (rc == DLOCK_ECONN && cn->broken) {
        /* closing the session frees the lock on the server too */
        conn_put(ps, cn);
        return rc;
    }
    if (rc == DLOCK_OK) {
        int was = PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "t");
        PQclear(r);
        if (!was) {
            cn->broken = 1;
            rc = dlock__err(DLOCK_ENOTHELD,
                            "postgres %s: the session no longer held the "
                            "advisory lock",
                            ps->redacted);
        }
    }
    conn_put(ps, cn);
    return rc;
}

static int adv_extend(void *st, dlock__lease *l, int64_t ttl_ms,
                      int64_t op_deadline)
{
    pg_store *ps = st;
    pg_lease *pl = l->priv;
    pg_conn *cn = pl->hold;
    PGresult *r;
    int rc, held = 0;

    (void)ttl_ms; /* no lease: held as long as the session lives */
    if (!cn)
        return not_ours(ps);
    pthread_mutex_lock(&cn->mu);
    if (!cn->dead && PQstatus(cn->pg) == CONNECTION_OK) {
        const char *vals[1] = {l->name};
        int lens[1] = {(int)l->name_len};
        rc = run(ps, cn, S_ADV_CHECK, vals, lens, op_deadline, &r,
                 "checking the advisory lock");
        if (rc == DLOCK_OK) {
            held = PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "t");
            PQclear(r);
        } else if (!cn->broken) {
            pthread_mutex_unlock(&cn->mu);
            return rc;
        }
    }
    if (!held)
        cn->dead = 1;
    pthread_mutex_unlock(&cn->mu);
    return held ? DLOCK_OK
                : dlock__err(DLOCK_ENOTHELD,
                             "postgres %s: the session holding the advisory "
                             "lock ended: the server has released it",
                             ps->redacted);
}

static int adv_inspect(void *st, const char *name, size_t len,
                       dlock_info *out, int64_t op_deadline)
{
    pg_store *ps = st;
    PGresult *r;
    int rc;

    const char *vals[1] = {name};
    int lens[1] = {(int)len};
    rc = run_pooled(ps, S_ADV_INSPECT, vals, lens, op_deadline, &r,
                    "reading the advisory lock");
    if (rc)
        return rc;
    out->waiters = 0;
    for (int i = 0; i < PQntuples(r) && rc == DLOCK_OK; i++) {
        const char *app = PQgetvalue(r, i, 1);
        char who[sizeof(out->holder)];
        unsigned long long token = 0;
        int skip = 0;
        if (!strncmp(app, "dlock ", 6) &&
            sscanf(app + 6, "%llu %n", &token, &skip) == 1 && skip > 0)
            snprintf(who, sizeof(who), "%s", app + 6 + skip);
        else
            snprintf(who, sizeof(who), "backend pid %s (%s)",
                     PQgetvalue(r, i, 3), app[0] ? app : "not dlock");
        if (!strcmp(PQgetvalue(r, i, 0), "t") && !out->held) {
            out->held = 1;
            out->token = token;
            snprintf(out->holder, sizeof(out->holder), "%s", who);
            out->held_ms = col_ll(r, i, 2, -1);
        } else {
            rc = dlock__info_add_waiter(out, who);
        }
    }
    out->waiters = (int64_t)out->queue_len;
    PQclear(r);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* The client thread                                                        */
/* ------------------------------------------------------------------------ */

static int pg_loop_fd(void *st)
{
    return ((pg_store *)st)->epfd;
}

static void pg_loop_run(void *st, int readable)
{
    pg_store *ps = st;
    struct epoll_event ev[16];
    int n;

    if (!readable)
        return;
    n = epoll_wait(ps->epfd, ev, 16, 0);
    for (int i = 0; i < n; i++) {
        if (ev[i].data.u64 == EV_IDLE) {
            uint64_t ticks;
            if (read(ps->idle_fd, &ticks, sizeof(ticks)) > 0)
                idle_run(ps);
        } else if (ev[i].data.u64 == EV_MAIN) {
            main_read(ps);
        } else {
            pthread_mutex_lock(&ps->hmu);
            hold_check(ps, ev[i].data.ptr);
            pthread_mutex_unlock(&ps->hmu);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Open and close                                                           */
/* ------------------------------------------------------------------------ */

static void pg_close(void *st)
{
    pg_store *ps = st;

    if (!ps)
        return;
    while (ps->idle) {
        pg_conn *cn = ps->idle;
        ps->idle = cn->next;
        conn_free(cn);
    }
    while (ps->holds) {
        pg_conn *cn = ps->holds;
        ps->holds = cn->next;
        if (cn != ps->main)
            conn_free(cn);
    }
    conn_free(ps->main);
    if (ps->epfd >= 0)
        close(ps->epfd);
    if (ps->idle_fd >= 0)
        close(ps->idle_fd);
    for (int i = 0; i < S_COUNT; i++)
        free(ps->sql[i]);
    for (size_t i = 0; i < sizeof(ps->vals) / sizeof(ps->vals[0]); i++) {
        if (ps->vals[i]) {
            dlock__wipe(ps->vals[i], strlen(ps->vals[i]));
            free(ps->vals[i]);
        }
    }
    pthread_mutex_destroy(&ps->mu);
    pthread_cond_destroy(&ps->cv);
    pthread_mutex_destroy(&ps->hmu);
    free(ps->redacted);
    free(ps);
}

static int add_kw(pg_store *ps, size_t *k, const char *key, const char *val)
{
    if (!val)
        return DLOCK_OK;
    if (*k + 1 >= sizeof(ps->keys) / sizeof(ps->keys[0]))
        return dlock__err(DLOCK_EINVAL, "postgres %s: too many options",
                          ps->redacted);
    ps->keys[*k] = key;
    if (!(ps->vals[*k] = strdup(val)))
        return enomem();
    (*k)++;
    ps->keys[*k] = NULL;
    return DLOCK_OK;
}

/* libpq's keywords from the URI: hosts and ports as comma lists (libpq
 * tries each; target_session_attrs=read-write finds the primary). */
static int build_keywords(pg_store *ps, const dlock__uri *u)
{
    static const char *const pass[] = {"sslmode", "sslrootcert", "sslcert",
                                       "sslkey", "sslcrl",
                                       "target_session_attrs", NULL};
    char hosts[1024] = "", ports[256] = "";
    size_t k = 0, ho = 0, po = 0;
    int rc = DLOCK_OK;

    /* stops at the first host that does not fit: past it, the room left
     * (sizeof - ho) would wrap around */
    for (size_t i = 0; i < u->nhosts && ho < sizeof(hosts) &&
                       po < sizeof(ports);
         i++) {
        ho += (size_t)snprintf(hosts + ho, sizeof(hosts) - ho, "%s%s",
                               i ? "," : "", u->hosts[i].host);
        po += (size_t)snprintf(ports + po, sizeof(ports) - po, "%s%d",
                               i ? "," : "",
                               u->hosts[i].port ? u->hosts[i].port : 5432);
    }
    if (ho >= sizeof(hosts) || po >= sizeof(ports))
        return dlock__err(DLOCK_EINVAL, "postgres %s: too many hosts",
                          ps->redacted);
    const char *host = dlock__uri_param(u, "host");
    if (host)
        rc = add_kw(ps, &k, "host", host);
    else if (u->nhosts)
        rc = add_kw(ps, &k, "host", hosts);
    if (!rc && u->nhosts)
        rc = add_kw(ps, &k, "port", ports);
    if (!rc && u->path[0] && u->path[1])
        rc = add_kw(ps, &k, "dbname", u->path + 1);
    if (!rc)
        rc = add_kw(ps, &k, "user", u->user);
    if (!rc)
        rc = add_kw(ps, &k, "password", u->password);
    for (int i = 0; pass[i] && !rc; i++)
        rc = add_kw(ps, &k, pass[i], dlock__uri_param(u, pass[i]));
    if (!rc)
        rc = add_kw(ps, &k, "application_name", "dlock");
    if (!rc)
        rc = add_kw(ps, &k, "client_encoding", "UTF8");
    /* a dead server or path is noticed in about 10 s even while idle */
    if (!rc)
        rc = add_kw(ps, &k, "keepalives", "1");
    if (!rc)
        rc = add_kw(ps, &k, "keepalives_idle", "5");
    if (!rc)
        rc = add_kw(ps, &k, "keepalives_interval", "2");
    if (!rc)
        rc = add_kw(ps, &k, "keepalives_count", "3");
    return rc;
}

/* The schema objects' names, each one quoted identifier. */
typedef struct pg_names {
    char t[2 * PG_TABLE_MAX + 16];  /* T */
    char w[2 * PG_TABLE_MAX + 24];  /* T_waiters */
    char wi[2 * PG_TABLE_MAX + 32]; /* T_waiters_name */
    char rel[2 * PG_TABLE_MAX + 24]; /* T_release */
    char leave[2 * PG_TABLE_MAX + 24]; /* T_leave */
} pg_names;

/* fmt with %1$s the table, %2$s the waiters table, %3$s the sequence
 * literal, %4$s the release function, %5$s the leaving function. */
static char *sql_of(const char *fmt, const pg_names *nm, const char *s)
{
    size_t cap = strlen(fmt) + 8 * (strlen(nm->t) + strlen(nm->w) +
                                    strlen(s) + strlen(nm->rel) +
                                    strlen(nm->leave)) + 64;
    char *out = malloc(cap);

    if (out)
        snprintf(out, cap, fmt, nm->t, nm->w, s, nm->rel, nm->leave);
    return out;
}

static int set_sql(pg_store *ps, int which, int nparams, const char *fmt,
                   const pg_names *nm, const char *s)
{
    if (!(ps->sql[which] = sql_of(fmt, nm, s)))
        return enomem();
    ps->nparams[which] = nparams;
    return DLOCK_OK;
}

static int build_statements(pg_store *ps, const pg_names *nm, const char *s)
{
    int rc = 0;

    /* $1 name, $2 owner, $3 ttl ms, $4 holder; a caller that will wait:
     * $5 its client id, $6 its waiter number, $7 and $8 its client's
     * listening session (pid, backend_start); else NULL.
     * A take-over (the lease ended) draws its token in the UPDATE, while
     * it holds the row: one drawn before (in VALUES) could be older than a
     * hold that came between, and tokens would go backwards. A row that is
     * already ours and live is adopted as it is (token kept, lease only
     * lengthened): an earlier try whose answer was lost took it, the lock
     * was handed to us, or this statement is that late try and the owner
     * holds the lock again. ON CONFLICT DO UPDATE locks the row even when
     * its WHERE is false, so the queue entry is committed before any
     * release can lock the row and look for waiters. */
#define ENDED "t.lock_until <= " NOW
#define KEEP_OR(col, new_)                                                  \
    col " = CASE WHEN " ENDED " THEN " new_ " ELSE t." col " END"
#define UPSERT_SET(take)                                                    \
    " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, "            \
    KEEP_OR("holder", "excluded.holder") ", holds = 1, "                    \
    KEEP_OR("token", "nextval(%3$s)") ", "                                  \
    KEEP_OR("locked_at", "excluded.locked_at") ", lock_until = CASE WHEN "  \
    ENDED " THEN excluded.lock_until ELSE greatest(t.lock_until, "          \
    "excluded.lock_until) END WHERE (" take ") OR t.owner = excluded.owner"
#define LEFT_OF_ROW                                                         \
    "(SELECT " MS_LEFT("lock_until") " FROM %1$s WHERE name = $1)"
    rc = rc ? rc
            : set_sql(ps, S_ACQUIRE, 8,
                      "WITH ins AS (INSERT INTO %1$s AS t (name, owner, "
                      "holder, holds, token, locked_at, lock_until) VALUES "
                      "($1, $2, $4, 1, nextval(%3$s), " NOW ", " NOW
                      " + $3 * interval '1 millisecond')" UPSERT_SET(ENDED)
                      " RETURNING token), "
                      "del AS (DELETE FROM %2$s WHERE name = $1 AND client "
                      "= $5 AND waiter = $6 AND EXISTS (SELECT 1 FROM ins)), "
                      "enq AS (INSERT INTO %2$s (name, client, waiter, "
                      "owner, holder, ttl_ms, pid, since) SELECT $1, $5, "
                      "$6, $2, $4, $3, $7, $8::timestamptz WHERE $5 IS NOT "
                      "NULL AND NOT EXISTS (SELECT 1 FROM ins) AND NOT "
                      "EXISTS (SELECT 1 FROM %2$s WHERE name = $1 AND "
                      "client = $5 AND waiter = $6 AND pid = $7) RETURNING "
                      "seq) "
                      "SELECT (SELECT token FROM ins), " LEFT_OF_ROW
                      ", (SELECT seq FROM enq)",
                      nm, s);
    /* $1 name, $2 owner, $3 token: ok, handed to "client:waiter", token */
    rc = rc ? rc
            : set_sql(ps, S_RELEASE, 3, "SELECT * FROM %4$s($1, $2, $3)",
                      nm, s);
    /* $1 name, $2 owner, $3 token, $4 ttl ms */
    rc = rc ? rc
            : set_sql(ps, S_EXTEND, 4,
                      "UPDATE %1$s SET lock_until = " NOW " + $4 * interval "
                      "'1 millisecond' WHERE name = $1 AND owner = $2 AND "
                      "token = $3 AND lock_until > " NOW,
                      nm, s);
    rc = rc ? rc
            : set_sql(ps, S_INSPECT, 1,
                      "SELECT owner IS NOT NULL AND lock_until > " NOW
                      ", holder, token, " MS_LEFT("lock_until") ", floor("
                      "extract(epoch FROM " NOW " - locked_at) * 1000)::"
                      "bigint FROM %1$s WHERE name = $1",
                      nm, s);
    rc = rc ? rc
            : set_sql(ps, S_QUEUE, 2,
                      "SELECT w.holder FROM %2$s w WHERE w.name = $1 AND "
                      ALIVE("w", "$2") " ORDER BY w.seq",
                      nm, s);
    /* $1 name, $2 owner, $3 client id, $4 waiter number, $5 ttl ms */
    rc = rc ? rc
            : set_sql(ps, S_LEAVE, 5,
                      "SELECT %5$s($1, $2, $3, $4, $5)", nm, s);
    rc = rc ? rc
            : set_sql(ps, S_GC, 1,
                      "DELETE FROM %1$s WHERE lock_until <= " NOW " - $1 * "
                      "interval '1 millisecond'",
                      nm, s);
    rc = rc ? rc
            : set_sql(ps, S_GC_QUEUE, 1,
                      "DELETE FROM %2$s w WHERE NOT " ALIVE("w", "$1"), nm,
                      s);
    /* advisory: $1 name [, $2 holder] */
    rc = rc ? rc
            : set_sql(ps, S_ADV_TRY, 2,
                      "WITH l AS (SELECT pg_try_advisory_lock(" KEY("$1")
                      ") AS ok), n AS (SELECT CASE WHEN ok THEN nextval(%3$s) "
                      "END AS t FROM l) SELECT t, CASE WHEN t IS NOT NULL "
                      "THEN set_config('application_name', 'dlock ' || t || "
                      "' ' || $2, false) END FROM n",
                      nm, s);
    rc = rc ? rc
            : set_sql(ps, S_ADV_UNLOCK, 1,
                      "SELECT pg_advisory_unlock(" KEY("$1") "), "
                      "set_config('application_name', 'dlock', false)",
                      nm, s);
#define ADV_KEY_OF_LOCK                                                     \
    "l.locktype = 'advisory' AND l.objsubid = 1 AND ((l.classid::bigint "   \
    "<< 32) | l.objid::bigint) = " KEY("$1")
    rc = rc ? rc
            : set_sql(ps, S_ADV_CHECK, 1,
                      "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE "
                      "l.pid = pg_backend_pid() AND l.granted AND "
                      ADV_KEY_OF_LOCK ")",
                      nm, s);
    rc = rc ? rc
            : set_sql(ps, S_ADV_INSPECT, 1,
                      "SELECT l.granted, coalesce(a.application_name, ''), "
                      "floor(extract(epoch FROM " NOW " - a.state_change) * "
                      "1000)::bigint, l.pid FROM pg_locks l LEFT JOIN "
                      "pg_stat_activity a ON a.pid = l.pid WHERE "
                      ADV_KEY_OF_LOCK " ORDER BY l.granted DESC, "
                      "a.query_start",
                      nm, s);
    return rc;
}

/* The table mode's schema: the lock table, the waiters' queue and the two
 * functions that hand a lock over and leave the queue (docs/design.md,
 * "PostgreSQL table mode: hand-over"). Each statement of a function sees
 * what committed before it: once the row is locked, every queue entry
 * appended under that row's lock is visible. */
static const char schema_sql[] =
    "SELECT pg_advisory_xact_lock(" KEY("'dlock schema'::bytea") "); "
    "CREATE SEQUENCE IF NOT EXISTS %6$s; "
    "CREATE TABLE IF NOT EXISTS %1$s ("
    " name bytea PRIMARY KEY,"
    " owner text,"
    " holder text,"
    " holds integer NOT NULL DEFAULT 0,"
    " token bigint NOT NULL DEFAULT 0,"
    " locked_at timestamptz NOT NULL DEFAULT " NOW ","
    " lock_until timestamptz NOT NULL DEFAULT " NOW "); "
    "CREATE TABLE IF NOT EXISTS %2$s ("
    " seq bigserial PRIMARY KEY,"
    " name bytea NOT NULL,"
    " client text NOT NULL,"
    " waiter bigint NOT NULL,"
    " owner text NOT NULL,"
    " holder text,"
    " ttl_ms bigint NOT NULL,"
    " pid integer NOT NULL,"
    " since timestamptz); "
    "CREATE INDEX IF NOT EXISTS %7$s ON %2$s (name, seq); "
    "CREATE OR REPLACE FUNCTION %4$s(n bytea, o text, tok bigint, "
    "OUT ok boolean, OUT granted text, OUT gtoken bigint) LANGUAGE plpgsql "
    "AS $f$ DECLARE w record; BEGIN "
    " ok := false;"
    " PERFORM 1 FROM %1$s WHERE name = n AND owner = o AND token = tok AND "
    "lock_until > " NOW " FOR UPDATE;"
    " IF NOT FOUND THEN RETURN; END IF;"
    " ok := true;"
    " LOOP"
    "  SELECT * INTO w FROM %2$s WHERE name = n ORDER BY seq LIMIT 1;"
    "  EXIT WHEN NOT FOUND;"
    "  IF w.owner <> o AND " ALIVE("w", "split_part(o, ':', 1)") " THEN"
    "   gtoken := nextval(%3$s);"
    "   UPDATE %1$s SET owner = w.owner, holder = w.holder, holds = 1, "
    "token = gtoken, locked_at = " NOW ", lock_until = " NOW " + w.ttl_ms * "
    "interval '1 millisecond' WHERE name = n;"
    "   DELETE FROM %2$s WHERE name = n AND client = w.client AND waiter = "
    "w.waiter;"
    "   PERFORM pg_notify('dlock_' || w.client, 'g ' || w.waiter || ' ' || "
    "gtoken);"
    "   granted := w.client || ':' || w.waiter;"
    "   RETURN;"
    "  END IF;"
    "  DELETE FROM %2$s WHERE seq = w.seq;"
    " END LOOP;"
    " UPDATE %1$s SET owner = NULL, holder = NULL, holds = 0, lock_until = "
    NOW " WHERE name = n;"
    " END $f$; "
    "CREATE OR REPLACE FUNCTION %5$s(n bytea, o text, c text, wt bigint, "
    "ttl bigint) RETURNS bigint LANGUAGE plpgsql AS $f$ DECLARE t bigint; "
    "BEGIN"
    " PERFORM 1 FROM %1$s WHERE name = n FOR UPDATE;"
    " DELETE FROM %2$s WHERE name = n AND client = c AND waiter = wt;"
    " UPDATE %1$s SET lock_until = greatest(lock_until, " NOW " + ttl * "
    "interval '1 millisecond') WHERE name = n AND owner = o AND lock_until > "
    NOW " RETURNING token INTO t;"
    " RETURN t;"
    " END $f$";

/* Creates what is missing (an existing schema needs no CREATE right), and
 * tells whether a pooler sits in front of the server: libpq was told a
 * backend pid that is not the server's (PgBouncer makes up its own). */
static int ensure_schema(pg_store *ps, pg_conn *cn, const pg_names *nm,
                         int64_t deadline)
{
    char sql[8192], lt[200], lw[200], lrel[200], lleave[200];
    PGresult *r;
    int rc;

    quote_literal(nm->t, lt, sizeof(lt));
    quote_literal(nm->w, lw, sizeof(lw));
    quote_literal(nm->rel, lrel, sizeof(lrel));
    quote_literal(nm->leave, lleave, sizeof(lleave));
    if (ps->advisory)
        snprintf(sql, sizeof(sql),
                 "SELECT to_regclass(%s) IS NOT NULL, pg_backend_pid()",
                 ps->seq_lit);
    else
        snprintf(sql, sizeof(sql),
                 "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS "
                 "NOT NULL AND to_regclass(%s) IS NOT NULL AND to_regproc(%s) "
                 "IS NOT NULL AND to_regproc(%s) IS NOT NULL, "
                 "pg_backend_pid()",
                 lt, lw, ps->seq_lit, lrel, lleave);
    rc = run_text(ps, cn, sql, deadline, &r, "looking for the lock table");
    if (rc)
        return rc;
    int present = PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "t");
    ps->behind = PQntuples(r) == 1 &&
                 atoi(PQgetvalue(r, 0, 1)) != PQbackendPID(cn->pg);
    PQclear(r);
    ps->sessions = !ps->behind ? ps->pooler != POOLER_TRANSACTION
                               : ps->pooler == POOLER_SESSION;
    ps->unnamed = (ps->behind && ps->pooler != POOLER_SESSION) ||
                  ps->pooler == POOLER_TRANSACTION;
    if (present)
        return DLOCK_OK;
    /* one implicit transaction; concurrent creators take turns */
    if (ps->advisory) {
        snprintf(sql, sizeof(sql),
                 "SELECT pg_advisory_xact_lock(" KEY("'dlock schema'::bytea")
                 "); CREATE SEQUENCE IF NOT EXISTS %s",
                 ps->seq_ident);
    } else {
        snprintf(sql, sizeof(sql), schema_sql, nm->t, nm->w, ps->seq_lit,
                 nm->rel, nm->leave, ps->seq_ident, nm->wi);
    }
    rc = run_text(ps, cn, sql, deadline, &r, "creating the lock table");
    if (rc == DLOCK_EAUTH)
        return dlock__err(DLOCK_EAUTH,
                          "postgres %s: cannot create the lock table %s "
                          "(no CREATE right): create it once with the DDL "
                          "in docs/stores.md, then grant SELECT, INSERT, "
                          "UPDATE, DELETE on it and USAGE on its sequences",
                          ps->redacted, nm->t);
    if (rc == DLOCK_OK)
        PQclear(r);
    return rc;
}

static const dlock__backend *pg_select(const dlock__uri *u);

static int pg_open(void **out, dlock_client *c, const dlock__uri *u,
                   int64_t timeout_ms)
{
    static const char *const params[] = {
        "table", "mode",   "timeout", "pooler", "sslmode", "sslrootcert",
        "sslcert", "sslkey", "sslcrl", "target_session_attrs", "host", NULL};
    const char *table = dlock__uri_param(u, "table");
    const char *mode = dlock__uri_param(u, "mode");
    const char *timeout = dlock__uri_param(u, "timeout");
    const char *pooler = dlock__uri_param(u, "pooler");
    pg_names nm;
    pg_store *ps;
    pg_conn *cn;
    int rc;

    rc = dlock__uri_check_params(u, params);
    if (rc)
        return rc;
    if (mode && strcmp(mode, "table") && strcmp(mode, "advisory"))
        return dlock__err(DLOCK_EINVAL, "postgres URI %s: mode must be "
                                        "'table' or 'advisory', not '%s'",
                          u->redacted, mode);
    if (pooler && strcmp(pooler, "session") &&
        strcmp(pooler, "transaction"))
        return dlock__err(DLOCK_EINVAL, "postgres URI %s: pooler must be "
                                        "'session' or 'transaction' (the "
                                        "pool mode of the PgBouncer in "
                                        "front), not '%s'",
                          u->redacted, pooler);
    if (!table)
        table = PG_DEFAULT_TABLE;
    if (!table[0] || strlen(table) > PG_TABLE_MAX)
        return dlock__err(DLOCK_EINVAL, "postgres URI %s: the table name "
                                        "must be 1 to %d bytes",
                          u->redacted, PG_TABLE_MAX);
    if (timeout) {
        long long v;
        if (dlock__parse_int(timeout, 3600000, &v) != 0 || v == 0)
            return dlock__err(DLOCK_EINVAL, "postgres URI %s: timeout must "
                                            "be milliseconds (1..3600000), "
                                            "not '%s'",
                              u->redacted, timeout);
        timeout_ms = v;
    }
    if (!u->nhosts && !dlock__uri_param(u, "host") && u->path[0] == '\0')
        return dlock__err(DLOCK_EINVAL, "postgres URI %s: expected "
                                        "postgres://[user:password@]host"
                                        "[:port][,host:port...]/database",
                          u->redacted);

    ps = calloc(1, sizeof(*ps));
    if (!ps || !(ps->redacted = strdup(u->redacted))) {
        free(ps);
        return enomem();
    }
    ps->client = c;
    ps->epfd = ps->idle_fd = -1;
    ps->advisory = pg_select(u) != NULL;
    ps->timeout_ms = timeout_ms;
    pthread_mutex_init(&ps->mu, NULL);
    dlock__cond_init(&ps->cv);
    pthread_mutex_init(&ps->hmu, NULL);
    snprintf(ps->table, sizeof(ps->table), "%s", table);
    ps->pooler = !pooler ? POOLER_NONE
                 : !strcmp(pooler, "session") ? POOLER_SESSION
                                              : POOLER_TRANSACTION;
    snprintf(ps->chan, sizeof(ps->chan), "dlock_%s", dlock__client_id(c));
    quote_ident(table, "", nm.t, sizeof(nm.t));
    quote_ident(table, "_waiters", nm.w, sizeof(nm.w));
    quote_ident(table, "_waiters_name", nm.wi, sizeof(nm.wi));
    quote_ident(table, "_release", nm.rel, sizeof(nm.rel));
    quote_ident(table, "_leave", nm.leave, sizeof(nm.leave));
    quote_ident(table, "_tokens", ps->seq_ident, sizeof(ps->seq_ident));
    quote_literal(ps->seq_ident, ps->seq_lit, sizeof(ps->seq_lit));
    ps->epfd = epoll_create1(EPOLL_CLOEXEC);
    ps->idle_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (ps->epfd < 0 || ps->idle_fd < 0) {
        rc = dlock__err(DLOCK_ENOMEM, "epoll/timerfd: %s", strerror(errno));
        pg_close(ps);
        return rc;
    }
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.u64 = EV_IDLE;
    epoll_ctl(ps->epfd, EPOLL_CTL_ADD, ps->idle_fd, &ev);

    rc = build_keywords(ps, u);
    if (!rc)
        rc = build_statements(ps, &nm, ps->seq_lit);
    if (rc) {
        pg_close(ps);
        return rc;
    }
    /* reach the server now, so that a wrong address or password fails
     * here, and make the table if it is missing */
    int64_t deadline = dlock__now_ms() + timeout_ms;
    rc = conn_get(ps, deadline, &cn);
    if (rc) {
        pg_close(ps);
        return rc;
    }
    rc = ensure_schema(ps, cn, &nm, deadline);
    if (rc)
        cn->broken = 1;
    conn_put(ps, cn);
    if (rc == DLOCK_OK && ps->advisory && !ps->sessions)
        rc = dlock__err(DLOCK_ENOTSUP,
                        "postgres %s: advisory mode holds each lock in a "
                        "session, which %s: use table mode, or connect to "
                        "the server or to a session-mode pool "
                        "(?pooler=session)",
                        ps->redacted,
                        ps->pooler == POOLER_TRANSACTION
                            ? "transaction pooling (?pooler=transaction) "
                              "does not keep"
                            : "a pooler in front of the server may not keep "
                              "(say ?pooler=session if it does)");
    if (rc) {
        pg_close(ps);
        return rc;
    }
    *out = ps;
    return DLOCK_OK;
}

const dlock__backend dlock__backend_pg = {
    "postgres", /* name */
    DLOCK__CAP_LEASE | DLOCK__CAP_HANDOVER | DLOCK__CAP_WAITER_READS,
    sizeof(pg_lease), /* lease_size */
    pg_open,          /* open */
    pg_close,         /* close */
    pg_acquire,       /* acquire */
    pg_arm,           /* arm */
    pg_disarm,        /* disarm */
    pg_release,       /* release */
    pg_extend,        /* extend */
    pg_inspect,       /* inspect */
    pg_loop_fd,       /* loop_fd */
    pg_loop_run,      /* loop_run */
    pg_gc,            /* gc */
    pg_select,        /* select */
    NULL,             /* margin */
    pg_abandon,       /* abandon */
    NULL,             /* extend_many */
};

/* ?mode=advisory: no lease, the server waits, the session is the hold */
static const dlock__backend backend_pg_advisory = {
    "postgres advisory",    /* name */
    DLOCK__CAP_NATIVE_WAIT, /* caps */
    sizeof(pg_lease),       /* lease_size */
    pg_open,                /* open */
    pg_close,               /* close */
    adv_acquire,            /* acquire */
    NULL,                   /* arm */
    NULL,                   /* disarm */
    adv_release,            /* release */
    adv_extend,             /* extend */
    adv_inspect,            /* inspect */
    pg_loop_fd,             /* loop_fd */
    pg_loop_run,            /* loop_run */
    NULL,                   /* gc: nothing is kept per name */
    NULL,                   /* select */
    NULL,                   /* margin */
    NULL,                   /* abandon */
    NULL,                   /* extend_many */
};

static const dlock__backend *pg_select(const dlock__uri *u)
{
    const char *mode = dlock__uri_param(u, "mode");

    return mode && !strcmp(mode, "advisory") ? &backend_pg_advisory : NULL;
}
