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
 *    statement reads the holder's lease left (for the retry timer).
 *  - Tokens come from the sequence T_tokens: strictly increasing for every
 *    name, whatever the clocks do and whether or not gc removed a row.
 *  - Release and extend are one statement each, guarded by owner and
 *    token. The release also sends NOTIFY on the lock's channel (at
 *    commit, so never before the row is free), naming the fair queue's
 *    head if there is one.
 *  - Waiting: each client has one listener connection that LISTENs on the
 *    channels of the names its threads wait for (a channel per name, so a
 *    release wakes only clients that wait for that name); the client
 *    thread reads it. Fair mode: waiters join T_queue; a release names the
 *    head, and only that waiter re-tries; the client thread keeps its fair
 *    waiters' entries alive once a second, and an entry not refreshed for
 *    3 s (a dead waiter) is skipped.
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
 * Connections: a pool per client (one connection per statement in flight;
 * idle ones kept), all I/O non-blocking with the caller's deadline; a
 * connection that misses its deadline is closed (the server ends what it
 * was doing). Statements are prepared once per connection.
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
#define PG_TABLE_MAX 48     /* + "_tokens"/"_queue": under 63 bytes */
#define PG_IDLE_MAX 8       /* idle connections kept per client */
#define PG_QUEUE_ALIVE_MS 3000
#define PG_HEARTBEAT_MS 1000
#define PG_STALE_CHANS 32   /* unused channels kept before UNLISTEN */
#define PG_APPNAME_MAX 63

/* The server's clock, and the advisory key of a bytea name. */
#define NOW "clock_timestamp()"
#define MS_LEFT(ts) "ceil(extract(epoch FROM " ts " - " NOW ") * 1000)::bigint"
#define KEY(x) "('x' || substr(md5(" x "), 1, 16))::bit(64)::bigint"

enum {
    S_ACQUIRE,
    S_ACQUIRE_FAIR,
    S_RELEASE,
    S_EXTEND,
    S_INSPECT,
    S_QUEUE,
    S_JOIN,
    S_REFRESH,
    S_LEAVE,
    S_GC,
    S_GC_QUEUE,
    S_ADV_TRY,
    S_ADV_UNLOCK,
    S_ADV_CHECK,
    S_ADV_INSPECT,
    S_COUNT
};

/* Parameter types: bytea, text, int8, int8[] (OIDs fixed by PostgreSQL). */
#define T_BYTEA 17
#define T_TEXT 25
#define T_INT8 20
#define T_INT8ARR 1016

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

typedef struct pg_chan {
    char name[24]; /* "dlock_" + 16 hex */
    int refs;      /* waiting leases that need it */
    struct pg_chan *next;
} pg_chan;

typedef struct pg_store {
    dlock_client *client;
    char *redacted;
    int advisory;
    int64_t timeout_ms;

    /* libpq connection keywords and values (owned; password wiped) */
    const char *keys[24];
    char *vals[24];

    char table[PG_TABLE_MAX + 1]; /* as given: the channel hash uses it */
    char *sql[S_COUNT];
    int nparams[S_COUNT];
    char seq_ident[2 * PG_TABLE_MAX + 24]; /* "T_tokens" */
    char seq_lit[4 * PG_TABLE_MAX + 48];   /* '"T_tokens"', a literal */

    pthread_mutex_t mu; /* the pool */
    pg_conn *idle;
    int nidle;

    int epfd;     /* the client thread's fd: listener, timer, holds */
    int timer_fd; /* fair waiters' heartbeat */
    int idle_fd;  /* one-shot: nobody has waited for a while: UNLISTEN */

    pthread_mutex_t lmu; /* listener, channels, fair waiters */
    PGconn *listener;
    int unlistening; /* an UNLISTEN * is in flight on it */
    unsigned gen; /* listener generation: a new connection, new LISTENs */
    pg_chan *chans;
    int64_t *fair; /* queue entries of this client's fair waiters */
    size_t nfair, capfair;

    pthread_mutex_t hmu; /* advisory holds' connections */
    pg_conn *holds;
} pg_store;

typedef struct pg_lease {
    int64_t seq;       /* fair queue entry, 0 when none */
    int listening;     /* holds a reference on its channel */
    unsigned gen;      /* ... of that listener generation */
    char chan[24];
    pg_conn *hold;     /* advisory: the connection holding the lock */
} pg_lease;

#define EV_TIMER 1u
#define EV_LISTENER 2u
#define EV_IDLE 3u
#define PG_UNLISTEN_AFTER_MS 1000 /* no waiter for this long: UNLISTEN */

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

/* An idle connection from the pool, or a new one. */
static int conn_get(pg_store *ps, int64_t deadline, pg_conn **out)
{
    if (deadline > dlock__now_ms() + ps->timeout_ms)
        deadline = dlock__now_ms() + ps->timeout_ms; /* ?timeout= */
    pthread_mutex_lock(&ps->mu);
    pg_conn *cn = ps->idle;
    if (cn) {
        ps->idle = cn->next;
        ps->nidle--;
        cn->next = NULL;
    }
    pthread_mutex_unlock(&ps->mu);
    if (cn) {
        /* an idle connection has nothing to read unless the server closed
         * it (a restart): then a new one, before any statement is lost */
        struct pollfd p = {PQsocket(cn->pg), POLLIN, 0};
        if (PQstatus(cn->pg) == CONNECTION_OK &&
            (poll(&p, 1, 0) == 0 ||
             (PQconsumeInput(cn->pg) && PQstatus(cn->pg) == CONNECTION_OK &&
              !PQisBusy(cn->pg)))) {
            *out = cn;
            return DLOCK_OK;
        }
        conn_free(cn);
    }
    return conn_open(ps, deadline, out);
}

static void conn_put(pg_store *ps, pg_conn *cn)
{
    if (!cn)
        return;
    if (cn->broken || cn->dead || PQstatus(cn->pg) != CONNECTION_OK ||
        PQtransactionStatus(cn->pg) != PQTRANS_IDLE) {
        conn_free(cn);
        return;
    }
    pthread_mutex_lock(&ps->mu);
    if (ps->nidle < PG_IDLE_MAX) {
        cn->next = ps->idle;
        ps->idle = cn;
        ps->nidle++;
        cn = NULL;
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
        "dlock0", "dlock1", "dlock2",  "dlock3",  "dlock4",
        "dlock5", "dlock6", "dlock7",  "dlock8",  "dlock9",
        "dlock10", "dlock11", "dlock12", "dlock13", "dlock14"};
    static const Oid types[S_COUNT][6] = {
        [S_ACQUIRE] = {T_BYTEA, T_TEXT, T_INT8, T_TEXT},
        [S_ACQUIRE_FAIR] = {T_BYTEA, T_TEXT, T_INT8, T_TEXT, T_INT8},
        [S_RELEASE] = {T_BYTEA, T_TEXT, T_INT8, T_TEXT},
        [S_EXTEND] = {T_BYTEA, T_TEXT, T_INT8, T_INT8},
        [S_INSPECT] = {T_BYTEA},
        [S_QUEUE] = {T_BYTEA},
        [S_JOIN] = {T_BYTEA, T_TEXT, T_INT8, T_TEXT},
        [S_REFRESH] = {T_INT8ARR},
        [S_LEAVE] = {T_BYTEA, T_INT8, T_TEXT},
        [S_GC] = {T_INT8},
        [S_GC_QUEUE] = {0},
        [S_ADV_TRY] = {T_BYTEA, T_TEXT},
        [S_ADV_UNLOCK] = {T_BYTEA},
        [S_ADV_CHECK] = {T_BYTEA},
        [S_ADV_INSPECT] = {T_BYTEA},
    };
    int fmts[6] = {0};
    int n = ps->nparams[which];
    PGresult *r;
    int rc;

    *out = NULL;
    if (deadline > dlock__now_ms() + ps->timeout_ms)
        deadline = dlock__now_ms() + ps->timeout_ms; /* ?timeout= */
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
    if (n > 0 && types[which][0] == T_BYTEA)
        fmts[0] = 1;
    if (!PQsendQueryPrepared(cn->pg, names[which], n, vals, lens, fmts, 0))
        return conn_error(ps, cn, what);
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

/* The NOTIFY channel of a lock: "dlock_" + FNV-1a 64 of "TABLE\0NAME". */
static void channel_of(const pg_store *ps, const char *name, size_t len,
                       char out[24])
{
    uint64_t h = dlock__hash(ps->table, strlen(ps->table) + 1);

    /* continue the same hash over the name */
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)name[i];
        h *= 0x100000001b3ull;
    }
    snprintf(out, 24, "dlock_%016" PRIx64, h);
}

static int hexval(int c)
{
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* The application_name of a hold: "dlock " + desc, within 63 bytes. */
static void appname(const dlock__lease *l, char *out, size_t cap)
{
    snprintf(out, cap < PG_APPNAME_MAX + 1 ? cap : PG_APPNAME_MAX + 1,
             "%s", l->desc);
}

/* ------------------------------------------------------------------------ */
/* The listener (table mode): LISTEN per waited-for name                    */
/* ------------------------------------------------------------------------ */

/* A notification: "HEXNAME" or "HEXNAME CLIENTID:WAITER" (fair head). */
static void dispatch(pg_store *ps, const char *payload)
{
    char name[DLOCK_NAME_MAX];
    size_t n = 0;
    const char *p = payload;

    while (p[0] && p[1] && p[0] != ' ' && n < sizeof(name)) {
        int hi = hexval(p[0]), lo = hexval(p[1]);
        if (hi < 0 || lo < 0)
            return;
        name[n++] = (char)(hi << 4 | lo);
        p += 2;
    }
    if (n == 0 || (*p && *p != ' '))
        return;
    dlock__notify_name(ps->client, name, n);
    if (*p != ' ') {
        /* no head named: the releaser's snapshot may have missed a fair
         * waiter that was joining the queue just then; ours try again */
        dlock__notify_fair(ps->client, name, n);
    } else {
        const char *id = dlock__client_id(ps->client);
        size_t idlen = strlen(id);
        if (!strncmp(p + 1, id, idlen) && p[1 + idlen] == ':')
            dlock__notify_waiter(ps->client,
                                 strtoull(p + 2 + idlen, NULL, 10));
    }
}

static void drain_notifies(pg_store *ps)
{
    PGnotify *nt;

    while ((nt = PQnotifies(ps->listener)) != NULL) {
        dispatch(ps, nt->extra);
        PQfreemem(nt);
    }
}

/* The listener broke: forget it and its channels; waiters re-arm. lmu
 * held. */
static void listener_lost(pg_store *ps)
{
    if (ps->listener) {
        epoll_ctl(ps->epfd, EPOLL_CTL_DEL, PQsocket(ps->listener), NULL);
        PQfinish(ps->listener);
        ps->listener = NULL;
    }
    ps->unlistening = 0;
    while (ps->chans) {
        pg_chan *ch = ps->chans;
        ps->chans = ch->next;
        free(ch);
    }
    ps->gen++;
    dlock__notify_error(ps->client);
}

/* LISTENs on `chan` for lease l (a reference per waiting lease), after
 * UNLISTEN of channels nobody needs any more. lmu held. */
static int listen_ref(pg_store *ps, pg_lease *pl, int64_t deadline)
{
    pg_chan *ch, **pp;
    char sql[PG_STALE_CHANS * 40 + 64];
    size_t o = 0;
    int stale = 0, rc;
    PGresult *r;

    if (pl->listening && pl->gen == ps->gen)
        return DLOCK_OK;
    pl->listening = 0;
    for (ch = ps->chans; ch; ch = ch->next)
        if (!strcmp(ch->name, pl->chan))
            break;
    if (ch && ps->listener) {
        ch->refs++;
        pl->listening = 1;
        pl->gen = ps->gen;
        return DLOCK_OK;
    }
    if (ps->listener && ps->unlistening) {
        /* the UNLISTEN * sent when the last waiter left: its answer first */
        pg_conn tmp = {.pg = ps->listener};
        rc = collect(ps, &tmp, deadline, &r, "UNLISTEN");
        PQclear(r);
        ps->unlistening = 0;
        if (rc) {
            listener_lost(ps);
            return rc;
        }
        drain_notifies(ps);
    }
    if (!ps->listener) {
        pg_conn *cn;
        rc = conn_open(ps, deadline, &cn);
        if (rc)
            return rc;
        ps->listener = cn->pg;
        cn->pg = NULL;
        conn_free(cn);
        struct epoll_event ev = {.events = EPOLLIN};
        ev.data.u64 = EV_LISTENER;
        if (epoll_ctl(ps->epfd, EPOLL_CTL_ADD, PQsocket(ps->listener),
                      &ev) != 0) {
            PQfinish(ps->listener);
            ps->listener = NULL;
            return dlock__err(DLOCK_ENOMEM, "epoll_ctl: %s",
                              strerror(errno));
        }
        dlock__loop_wake(ps->client);
    }
    for (pg_chan *c2 = ps->chans; c2; c2 = c2->next)
        stale += c2->refs == 0;
    if (stale >= PG_STALE_CHANS) {
        for (pg_chan *c2 = ps->chans; c2; c2 = c2->next)
            if (c2->refs == 0)
                o += (size_t)snprintf(sql + o, sizeof(sql) - o,
                                      "UNLISTEN %s;", c2->name);
    }
    snprintf(sql + o, sizeof(sql) - o, "LISTEN %s", pl->chan);
    if (!PQsendQuery(ps->listener, sql)) {
        listener_lost(ps);
        return dlock__err(DLOCK_ECONN, "postgres %s: LISTEN: connection "
                                       "lost",
                          ps->redacted);
    }
    pg_conn tmp = {.pg = ps->listener};
    rc = collect(ps, &tmp, deadline, &r, "LISTEN");
    if (rc == DLOCK_OK)
        rc = result_ok(ps, &r, "LISTEN");
    PQclear(r);
    if (tmp.broken || rc) {
        listener_lost(ps);
        return rc ? rc : DLOCK_ECONN;
    }
    drain_notifies(ps);
    if (stale >= PG_STALE_CHANS) {
        for (pp = &ps->chans; *pp;) {
            if ((*pp)->refs == 0) {
                pg_chan *dead = *pp;
                *pp = dead->next;
                free(dead);
            } else {
                pp = &(*pp)->next;
            }
        }
    }
    if (!ch) {
        ch = calloc(1, sizeof(*ch));
        if (!ch)
            return enomem();
        snprintf(ch->name, sizeof(ch->name), "%s", pl->chan);
        ch->next = ps->chans;
        ps->chans = ch;
    }
    ch->refs++;
    pl->listening = 1;
    pl->gen = ps->gen;
    return DLOCK_OK;
}

/* Drops lease l's reference; the channel stays LISTENed until enough
 * unused ones pile up (a later LISTEN sends the UNLISTENs with it). lmu
 * held. */
static void listen_unref(pg_store *ps, pg_lease *pl)
{
    if (pl->listening && pl->gen == ps->gen) {
        for (pg_chan *ch = ps->chans; ch; ch = ch->next)
            if (!strcmp(ch->name, pl->chan) && ch->refs > 0) {
                ch->refs--;
                break;
            }
    }
    pl->listening = 0;

    /* nobody waits any more: stop listening in a second if nobody waits
     * again by then (a client that waits often keeps its channels) */
    int refs = 0;
    for (pg_chan *ch = ps->chans; ch; ch = ch->next)
        refs += ch->refs;
    if (refs == 0 && ps->listener && ps->chans) {
        struct itimerspec its;
        memset(&its, 0, sizeof(its));
        its.it_value.tv_sec = PG_UNLISTEN_AFTER_MS / 1000;
        its.it_value.tv_nsec = (PG_UNLISTEN_AFTER_MS % 1000) * 1000000L;
        timerfd_settime(ps->idle_fd, 0, &its, NULL);
    }
}

/* The client thread: nobody has waited for a second. Stops listening, for
 * PostgreSQL wakes every listening session of the database at every
 * NOTIFY, whatever its channel (sent without waiting; the client thread
 * reads the answer). lmu held. */
static void unlisten_idle(pg_store *ps)
{
    int refs = 0;

    for (pg_chan *ch = ps->chans; ch; ch = ch->next)
        refs += ch->refs;
    if (refs > 0 || !ps->listener || ps->unlistening || !ps->chans)
        return;
    if (!PQsendQuery(ps->listener, "UNLISTEN *") ||
        PQflush(ps->listener) != 0) {
        listener_lost(ps);
        return;
    }
    ps->unlistening = 1;
    while (ps->chans) {
        pg_chan *ch = ps->chans;
        ps->chans = ch->next;
        free(ch);
    }
}

static void timer_set(pg_store *ps, int on)
{
    struct itimerspec its;

    memset(&its, 0, sizeof(its));
    if (on) {
        its.it_value.tv_sec = PG_HEARTBEAT_MS / 1000;
        its.it_value.tv_nsec = (PG_HEARTBEAT_MS % 1000) * 1000000L;
        its.it_interval = its.it_value;
    }
    timerfd_settime(ps->timer_fd, 0, &its, NULL);
}

/* Keeps this client's fair queue entries alive, and wakes a waiter whose
 * turn it is with the lock free (client thread). */
static void heartbeat(pg_store *ps)
{
    PGresult *r = NULL;
    size_t o = 0, cap;
    char *arr;

    pthread_mutex_lock(&ps->lmu);
    cap = ps->nfair * 22 + 3;
    arr = ps->nfair ? malloc(cap) : NULL;
    if (arr) {
        arr[o++] = '{';
        for (size_t i = 0; i < ps->nfair; i++)
            o += (size_t)snprintf(arr + o, cap - o, "%s%lld", i ? "," : "",
                                  (long long)ps->fair[i]);
        arr[o++] = '}';
        arr[o] = '\0';
    }
    pthread_mutex_unlock(&ps->lmu);
    if (!arr)
        return;
    const char *vals[1] = {arr};
    int rc = run_pooled(ps, S_REFRESH, vals, NULL,
                        dlock__now_ms() + ps->timeout_ms, &r,
                        "refreshing the queue entries");
    free(arr);
    if (rc != DLOCK_OK)
        return;
    for (int i = 0; i < PQntuples(r); i++)
        if (!strcmp(PQgetvalue(r, i, 1), "t"))
            dlock__notify_waiter(ps->client,
                                 strtoull(PQgetvalue(r, i, 0), NULL, 10));
    PQclear(r);
}

/* ------------------------------------------------------------------------ */
/* Table mode                                                               */
/* ------------------------------------------------------------------------ */

static int fair_add(pg_store *ps, int64_t seq)
{
    if (ps->nfair == ps->capfair) {
        size_t n = ps->capfair ? ps->capfair * 2 : 8;
        int64_t *p = realloc(ps->fair, n * sizeof(*p));
        if (!p)
            return enomem();
        ps->fair = p;
        ps->capfair = n;
    }
    ps->fair[ps->nfair++] = seq;
    if (ps->nfair == 1)
        timer_set(ps, 1);
    return DLOCK_OK;
}

static void fair_remove(pg_store *ps, int64_t seq)
{
    for (size_t i = 0; i < ps->nfair; i++) {
        if (ps->fair[i] == seq) {
            ps->fair[i] = ps->fair[--ps->nfair];
            break;
        }
    }
    if (ps->nfair == 0)
        timer_set(ps, 0);
}

static int pg_acquire(void *st, dlock__lease *l, int64_t op_deadline)
{
    pg_store *ps = st;
    pg_lease *pl = l->priv;
    int fair = (l->flags & DLOCK_FAIR) != 0;
    char ttl[24], seq[24];
    PGresult *r;
    int rc;

    snprintf(ttl, sizeof(ttl), "%lld", (long long)l->ttl_ms);
    snprintf(seq, sizeof(seq), "%lld",
             (long long)(pl->seq ? pl->seq : INT64_MAX));
    const char *vals[5] = {l->name, l->owner, ttl, l->desc, seq};
    int lens[5] = {(int)l->name_len, 0, 0, 0, 0};
    rc = run_pooled(ps, fair ? S_ACQUIRE_FAIR : S_ACQUIRE, vals, lens,
                    op_deadline, &r, "taking the lock");
    if (rc)
        return rc;
    long long token = col_ll(r, 0, 0, -1);
    long long left = col_ll(r, 0, 1, -1);
    long long qleft = fair ? col_ll(r, 0, 2, -1) : -1;
    PQclear(r);
    if (token > 0) {
        l->token = (uint64_t)token;
        if (pl->seq) {
            /* the statement removed our queue entry */
            pthread_mutex_lock(&ps->lmu);
            fair_remove(ps, pl->seq);
            pthread_mutex_unlock(&ps->lmu);
            pl->seq = 0;
        }
        return DLOCK_OK;
    }
    if (left > 0)
        l->retry_ms = left;
    else if (qleft > 0)
        l->retry_ms = qleft; /* free, but an older waiter's turn */
    else
        l->retry_ms = 50; /* a row made after the statement's snapshot */
    return DLOCK_EBUSY;
}

static int pg_arm(void *st, dlock__lease *l, int64_t op_deadline)
{
    pg_store *ps = st;
    pg_lease *pl = l->priv;
    int rc;

    if (!pl->chan[0])
        channel_of(ps, l->name, l->name_len, pl->chan);
    pthread_mutex_lock(&ps->lmu);
    rc = listen_ref(ps, pl, op_deadline);
    pthread_mutex_unlock(&ps->lmu);
    if (rc || !(l->flags & DLOCK_FAIR) || pl->seq)
        return rc;

    /* fair: join the queue; the client thread keeps the entry alive */
    char waiter[24];
    PGresult *r;
    snprintf(waiter, sizeof(waiter), "%llu", (unsigned long long)l->waiter);
    const char *vals[4] = {l->name, dlock__client_id(ps->client), waiter,
                           l->desc};
    int lens[4] = {(int)l->name_len, 0, 0, 0};
    rc = run_pooled(ps, S_JOIN, vals, lens, op_deadline, &r,
                    "joining the queue");
    if (rc)
        return rc;
    pl->seq = col_ll(r, 0, 0, 0);
    PQclear(r);
    pthread_mutex_lock(&ps->lmu);
    rc = fair_add(ps, pl->seq);
    pthread_mutex_unlock(&ps->lmu);
    return rc;
}

static void pg_disarm(void *st, dlock__lease *l, int acquired)
{
    pg_store *ps = st;
    pg_lease *pl = l->priv;
    char seq[24];
    PGresult *r;

    pthread_mutex_lock(&ps->lmu);
    listen_unref(ps, pl);
    if (pl->seq)
        fair_remove(ps, pl->seq);
    pthread_mutex_unlock(&ps->lmu);
    if (!pl->seq)
        return;
    /* gave up (or failed): leave the queue, and if the lock is free tell
     * the next in line, who would otherwise wait for our entry to expire */
    (void)acquired;
    snprintf(seq, sizeof(seq), "%lld", (long long)pl->seq);
    const char *vals[3] = {l->name, seq, pl->chan};
    int lens[3] = {(int)l->name_len, 0, 0};
    if (run_pooled(ps, S_LEAVE, vals, lens,
                   dlock__now_ms() + ps->timeout_ms, &r,
                   "leaving the queue") == DLOCK_OK)
        PQclear(r);
    pl->seq = 0;
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
    pg_lease *pl = l->priv;
    char token[24];
    PGresult *r;
    int rc;

    if (!pl->chan[0])
        channel_of(ps, l->name, l->name_len, pl->chan);
    snprintf(token, sizeof(token), "%llu", (unsigned long long)l->token);
    const char *vals[4] = {l->name, l->owner, token, pl->chan};
    int lens[4] = {(int)l->name_len, 0, 0, 0};
    rc = run_pooled(ps, S_RELEASE, vals, lens, op_deadline, &r,
                    "releasing the lock");
    if (rc)
        return rc;
    int released = PQntuples(r) == 1;
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

    const char *vals[1] = {name};
    int lens[1] = {(int)len};
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
    rc = run_pooled(ps, S_GC_QUEUE, NULL, NULL, op_deadline, &r,
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
        conn_free(cn);
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
        conn_free(cn);
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
            if (read(ps->idle_fd, &ticks, sizeof(ticks)) > 0) {
                pthread_mutex_lock(&ps->lmu);
                unlisten_idle(ps);
                pthread_mutex_unlock(&ps->lmu);
            }
        } else if (ev[i].data.u64 == EV_TIMER) {
            uint64_t ticks;
            if (read(ps->timer_fd, &ticks, sizeof(ticks)) > 0)
                heartbeat(ps);
        } else if (ev[i].data.u64 == EV_LISTENER) {
            pthread_mutex_lock(&ps->lmu);
            if (ps->listener) {
                if (!PQconsumeInput(ps->listener) ||
                    PQstatus(ps->listener) != CONNECTION_OK) {
                    listener_lost(ps);
                } else {
                    drain_notifies(ps);
                    PGresult *r;
                    while (!PQisBusy(ps->listener) &&
                           (r = PQgetResult(ps->listener)) != NULL)
                        PQclear(r);
                    if (!PQisBusy(ps->listener))
                        ps->unlistening = 0;
                }
            }
            pthread_mutex_unlock(&ps->lmu);
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
        conn_free(cn);
    }
    if (ps->listener)
        PQfinish(ps->listener);
    while (ps->chans) {
        pg_chan *ch = ps->chans;
        ps->chans = ch->next;
        free(ch);
    }
    if (ps->epfd >= 0)
        close(ps->epfd);
    if (ps->timer_fd >= 0)
        close(ps->timer_fd);
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
    free(ps->fair);
    pthread_mutex_destroy(&ps->mu);
    pthread_mutex_destroy(&ps->lmu);
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

static int set_sql(pg_store *ps, int which, int nparams, const char *fmt,
                   const char *t, const char *q, const char *s)
{
    size_t cap = strlen(fmt) + 8 * (strlen(t) + strlen(q) + strlen(s)) + 64;

    if (!(ps->sql[which] = malloc(cap)))
        return enomem();
    /* %1$s the table, %2$s the queue table, %3$s the sequence literal */
    snprintf(ps->sql[which], cap, fmt, t, q, s);
    ps->nparams[which] = nparams;
    return DLOCK_OK;
}

static int build_statements(pg_store *ps, const char *t, const char *q,
                            const char *s)
{
    int rc = 0;

    /* $1 name, $2 owner, $3 ttl ms, $4 holder [, $5 our queue number].
     * A take-over (the lease ended) draws its token in the UPDATE, while
     * it holds the row: one drawn before (in VALUES) could be older than a
     * hold that came between, and tokens would go backwards. A row that is
     * already ours and live is adopted as it is (token kept, lease only
     * lengthened): an earlier try whose answer was lost took it, or this
     * statement is that late try and the owner holds the lock again. */
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
            : set_sql(ps, S_ACQUIRE, 4,
                      "WITH ins AS (INSERT INTO %1$s AS t (name, owner, "
                      "holder, holds, token, locked_at, lock_until) VALUES "
                      "($1, $2, $4, 1, nextval(%3$s), " NOW ", " NOW
                      " + $3 * interval '1 millisecond')" UPSERT_SET(ENDED)
                      " RETURNING token) SELECT (SELECT token FROM ins), "
                      LEFT_OF_ROW,
                      t, q, s);
#define AHEAD                                                               \
    "FROM %2$s WHERE name = $1 AND alive_until > " NOW " AND seq < $5"
    rc = rc ? rc
            : set_sql(ps, S_ACQUIRE_FAIR, 5,
                      "WITH ins AS (INSERT INTO %1$s AS t (name, owner, "
                      "holder, holds, token, locked_at, lock_until) SELECT "
                      "$1, $2, $4, 1, nextval(%3$s), " NOW ", " NOW
                      " + $3 * interval '1 millisecond' WHERE NOT EXISTS "
                      "(SELECT 1 " AHEAD ")" UPSERT_SET(
                          ENDED " AND NOT EXISTS (SELECT 1 " AHEAD ")")
                      " RETURNING token), del AS (DELETE FROM %2$s WHERE seq "
                      "= $5 AND EXISTS (SELECT 1 FROM ins)) SELECT (SELECT "
                      "token FROM ins), " LEFT_OF_ROW ", (SELECT " MS_LEFT(
                          "min(alive_until)") " " AHEAD ")",
                      t, q, s);
    /* $1 name, $2 owner, $3 token, $4 channel */
#define HEAD                                                                \
    "coalesce((SELECT ' ' || client || ':' || waiter FROM %2$s WHERE name " \
    "= $1 AND alive_until > " NOW
    rc = rc ? rc
            : set_sql(ps, S_RELEASE, 4,
                      "WITH r AS (UPDATE %1$s SET owner = NULL, holder = "
                      "NULL, holds = 0, lock_until = " NOW " WHERE name = $1 "
                      "AND owner = $2 AND token = $3 AND lock_until > " NOW
                      " RETURNING name) SELECT pg_notify($4, encode($1, "
                      "'hex') || " HEAD " ORDER BY seq LIMIT 1), '')) FROM r",
                      t, q, s);
    /* $1 name, $2 owner, $3 token, $4 ttl ms */
    rc = rc ? rc
            : set_sql(ps, S_EXTEND, 4,
                      "UPDATE %1$s SET lock_until = " NOW " + $4 * interval "
                      "'1 millisecond' WHERE name = $1 AND owner = $2 AND "
                      "token = $3 AND lock_until > " NOW,
                      t, q, s);
    rc = rc ? rc
            : set_sql(ps, S_INSPECT, 1,
                      "SELECT owner IS NOT NULL AND lock_until > " NOW
                      ", holder, token, " MS_LEFT("lock_until") ", floor("
                      "extract(epoch FROM " NOW " - locked_at) * 1000)::"
                      "bigint FROM %1$s WHERE name = $1",
                      t, q, s);
    rc = rc ? rc
            : set_sql(ps, S_QUEUE, 1,
                      "SELECT holder FROM %2$s WHERE name = $1 AND "
                      "alive_until > " NOW " ORDER BY seq",
                      t, q, s);
    /* $1 name, $2 client id, $3 waiter number, $4 holder */
    rc = rc ? rc
            : set_sql(ps, S_JOIN, 4,
                      "INSERT INTO %2$s (name, client, waiter, holder, "
                      "alive_until) VALUES ($1, $2, $3, $4, " NOW
                      " + interval '3 seconds') RETURNING seq",
                      t, q, s);
    /* the heartbeat also says whose turn it is: a head that died (or a
     * notification that was lost) must not leave the next waiter asleep */
    rc = rc ? rc
            : set_sql(ps, S_REFRESH, 1,
                      "UPDATE %2$s AS q SET alive_until = " NOW " + interval "
                      "'3 seconds' WHERE seq = ANY ($1) RETURNING waiter, "
                      "NOT EXISTS (SELECT 1 FROM %2$s o WHERE o.name = "
                      "q.name AND o.alive_until > " NOW " AND o.seq < q.seq) "
                      "AND NOT EXISTS (SELECT 1 FROM %1$s t WHERE t.name = "
                      "q.name AND t.owner IS NOT NULL AND t.lock_until > "
                      NOW ")",
                      t, q, s);
    /* $1 name, $2 our queue number, $3 channel: leave; if the lock is
     * free, the new head's turn */
    rc = rc ? rc
            : set_sql(ps, S_LEAVE, 3,
                      "WITH d AS (DELETE FROM %2$s WHERE seq = $2 OR "
                      "alive_until < " NOW " - interval '60 seconds') "
                      "SELECT pg_notify($3, encode($1, 'hex') || " HEAD
                      " AND seq <> $2 ORDER BY seq LIMIT 1), '')) WHERE NOT "
                      "EXISTS (SELECT 1 FROM %1$s WHERE name = $1 AND owner "
                      "IS NOT NULL AND lock_until > " NOW ")",
                      t, q, s);
    rc = rc ? rc
            : set_sql(ps, S_GC, 1,
                      "DELETE FROM %1$s WHERE lock_until <= " NOW " - $1 * "
                      "interval '1 millisecond'",
                      t, q, s);
    rc = rc ? rc
            : set_sql(ps, S_GC_QUEUE, 0,
                      "DELETE FROM %2$s WHERE alive_until <= " NOW, t, q, s);
    /* advisory: $1 name [, $2 holder] */
    rc = rc ? rc
            : set_sql(ps, S_ADV_TRY, 2,
                      "WITH l AS (SELECT pg_try_advisory_lock(" KEY("$1")
                      ") AS ok), n AS (SELECT CASE WHEN ok THEN nextval(%3$s) "
                      "END AS t FROM l) SELECT t, CASE WHEN t IS NOT NULL "
                      "THEN set_config('application_name', 'dlock ' || t || "
                      "' ' || $2, false) END FROM n",
                      t, q, s);
    rc = rc ? rc
            : set_sql(ps, S_ADV_UNLOCK, 1,
                      "SELECT pg_advisory_unlock(" KEY("$1") "), "
                      "set_config('application_name', 'dlock', false)",
                      t, q, s);
#define ADV_KEY_OF_LOCK                                                     \
    "l.locktype = 'advisory' AND l.objsubid = 1 AND ((l.classid::bigint "   \
    "<< 32) | l.objid::bigint) = " KEY("$1")
    rc = rc ? rc
            : set_sql(ps, S_ADV_CHECK, 1,
                      "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE "
                      "l.pid = pg_backend_pid() AND l.granted AND "
                      ADV_KEY_OF_LOCK ")",
                      t, q, s);
    rc = rc ? rc
            : set_sql(ps, S_ADV_INSPECT, 1,
                      "SELECT l.granted, coalesce(a.application_name, ''), "
                      "floor(extract(epoch FROM " NOW " - a.state_change) * "
                      "1000)::bigint, l.pid FROM pg_locks l LEFT JOIN "
                      "pg_stat_activity a ON a.pid = l.pid WHERE "
                      ADV_KEY_OF_LOCK " ORDER BY l.granted DESC, "
                      "a.query_start",
                      t, q, s);
    return rc;
}

/* Creates what is missing (an existing table needs no CREATE right). */
static int ensure_schema(pg_store *ps, pg_conn *cn, const char *t,
                         const char *q, const char *qi, int64_t deadline)
{
    char sql[4096], lt[200], lq[200];
    PGresult *r;
    int rc;

    quote_literal(t, lt, sizeof(lt));
    quote_literal(q, lq, sizeof(lq));
    snprintf(sql, sizeof(sql),
             "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT "
             "NULL AND to_regclass(%s) IS NOT NULL",
             ps->advisory ? ps->seq_lit : lt, ps->advisory ? ps->seq_lit : lq,
             ps->seq_lit);
    rc = run_text(ps, cn, sql, deadline, &r, "looking for the lock table");
    if (rc)
        return rc;
    int present = PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "t");
    PQclear(r);
    if (present)
        return DLOCK_OK;
    /* one implicit transaction; concurrent creators take turns */
    if (ps->advisory)
        snprintf(sql, sizeof(sql),
                 "SELECT pg_advisory_xact_lock(" KEY("'dlock schema'::bytea")
                 "); CREATE SEQUENCE IF NOT EXISTS %s",
                 ps->seq_ident);
    else
        snprintf(sql, sizeof(sql),
                 "SELECT pg_advisory_xact_lock(" KEY("'dlock schema'::bytea")
                 "); "
                 "CREATE SEQUENCE IF NOT EXISTS %3$s; "
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
                 " holder text,"
                 " alive_until timestamptz NOT NULL); "
                 "CREATE INDEX IF NOT EXISTS %4$s ON %2$s (name, seq)",
                 t, q, ps->seq_ident, qi);
    rc = run_text(ps, cn, sql, deadline, &r, "creating the lock table");
    if (rc == DLOCK_EAUTH)
        return dlock__err(DLOCK_EAUTH,
                          "postgres %s: cannot create the lock table %s "
                          "(no CREATE right): create it once with the DDL "
                          "in docs/stores.md, then grant SELECT, INSERT, "
                          "UPDATE, DELETE on it and USAGE on its sequences",
                          ps->redacted, t);
    if (rc == DLOCK_OK)
        PQclear(r);
    return rc;
}

static const dlock__backend *pg_select(const dlock__uri *u);

static int pg_open(void **out, dlock_client *c, const dlock__uri *u,
                   int64_t timeout_ms)
{
    static const char *const params[] = {
        "table", "mode",   "timeout", "sslmode",          "sslrootcert",
        "sslcert", "sslkey", "sslcrl", "target_session_attrs", "host", NULL};
    const char *table = dlock__uri_param(u, "table");
    const char *mode = dlock__uri_param(u, "mode");
    const char *timeout = dlock__uri_param(u, "timeout");
    char t[2 * PG_TABLE_MAX + 16], q[2 * PG_TABLE_MAX + 24];
    char qi[2 * PG_TABLE_MAX + 32];
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
    ps->epfd = ps->timer_fd = ps->idle_fd = -1;
    ps->advisory = pg_select(u) != NULL;
    ps->timeout_ms = timeout_ms;
    pthread_mutex_init(&ps->mu, NULL);
    pthread_mutex_init(&ps->lmu, NULL);
    pthread_mutex_init(&ps->hmu, NULL);
    snprintf(ps->table, sizeof(ps->table), "%s", table);
    quote_ident(table, "", t, sizeof(t));
    quote_ident(table, "_queue", q, sizeof(q));
    quote_ident(table, "_queue_name", qi, sizeof(qi));
    quote_ident(table, "_tokens", ps->seq_ident, sizeof(ps->seq_ident));
    quote_literal(ps->seq_ident, ps->seq_lit, sizeof(ps->seq_lit));
    ps->epfd = epoll_create1(EPOLL_CLOEXEC);
    ps->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    ps->idle_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (ps->epfd < 0 || ps->timer_fd < 0 || ps->idle_fd < 0) {
        rc = dlock__err(DLOCK_ENOMEM, "epoll/timerfd: %s", strerror(errno));
        pg_close(ps);
        return rc;
    }
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.u64 = EV_TIMER;
    epoll_ctl(ps->epfd, EPOLL_CTL_ADD, ps->timer_fd, &ev);
    ev.data.u64 = EV_IDLE;
    epoll_ctl(ps->epfd, EPOLL_CTL_ADD, ps->idle_fd, &ev);

    rc = build_keywords(ps, u);
    if (!rc)
        rc = build_statements(ps, t, q, ps->seq_lit);
    if (rc) {
        pg_close(ps);
        return rc;
    }
    /* reach the server now, so that a wrong address or password fails
     * here, and make the table if it is missing */
    int64_t deadline = dlock__now_ms() + timeout_ms;
    rc = conn_open(ps, deadline, &cn);
    if (rc) {
        pg_close(ps);
        return rc;
    }
    rc = ensure_schema(ps, cn, t, q, qi, deadline);
    if (rc) {
        conn_free(cn);
        pg_close(ps);
        return rc;
    }
    conn_put(ps, cn);
    *out = ps;
    return DLOCK_OK;
}

const dlock__backend dlock__backend_pg = {
    "postgres",       /* name */
    DLOCK__CAP_LEASE, /* caps */
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
    NULL, /* abandon */
    NULL, /* extend_many */
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
