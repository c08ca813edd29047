/* SPDX-License-Identifier: MIT */
/*
 * pg_conn.c -- the PostgreSQL store's connections (pg.c is the store,
 * pg_int.h what they share): the pool, non-blocking libpq I/O, statements
 * run with the caller's deadline, error codes, and the notifications
 * (table mode) that the command connection LISTENs for.
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
#include "pg_int.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>

/* The server ended cn's session if r (an error, or a notice) says so:
 * SQLSTATE 57P01, pg_terminate_backend (dlock_break() in advisory mode)
 * or a shutdown. An idle session gets it as a notice just before the
 * connection closes, a busy one as its statement's error. */
static void ended_by_server(pg_conn *cn, const PGresult *r)
{
    const char *state = PQresultErrorField(r, PG_DIAG_SQLSTATE);

    if (state && !strcmp(state, "57P01"))
        cn->ended = 1;
}

/* The library never prints: notices are dropped, once looked at. */
static void noticed(void *arg, const PGresult *r)
{
    ended_by_server(arg, r);
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
int dlock__pg_result_error(pg_store *ps, const PGresult *r, const char *what)
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

int dlock__pg_enomem(void)
{
    return dlock__err(DLOCK_ENOMEM, "out of memory");
}

/* ------------------------------------------------------------------------ */
/* Connections                                                              */
/* ------------------------------------------------------------------------ */

/* Waits until fd is ready for `events` or `deadline`, or cfd (-1: none)
 * is readable; 1 ready, 2 cfd, 0 timeout, -1 error. */
static int wait_fd(int fd, short events, int64_t deadline, int cfd)
{
    struct pollfd p[2] = {{fd, events, 0}, {cfd, POLLIN, 0}};

    for (;;) {
        int64_t left = deadline == DLOCK__FOREVER ? -1
                                                  : deadline - dlock__now_ms();
        if (deadline != DLOCK__FOREVER && left <= 0)
            return 0;
        int r = poll(p, 2, left > 60000 || left < 0 ? 60000 : (int)left);
        if (r > 0 && p[0].revents)
            return 1;
        if (r > 0)
            return 2;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

/* Asks the server to end the statement running on cn (a wait: it fails
 * with SQLSTATE 57014). 0, or -1 when the request could not be sent. */
static int cancel_statement(pg_conn *cn)
{
    PGcancel *cc = PQgetCancel(cn->pg);
    char buf[256];
    int ok = cc && PQcancel(cc, buf, sizeof(buf));

    if (cc)
        PQfreeCancel(cc);
    return ok ? 0 : -1;
}

void dlock__pg_conn_free(pg_conn *cn)
{
    if (!cn)
        return;
    if (cn->pg)
        PQfinish(cn->pg);
    pthread_mutex_destroy(&cn->mu);
    free(cn);
}

/* A half-open connection to go on with (ps->half), or NULL: none, or
 * one older than ?timeout= (the server did not finish in that time:
 * closed, and a new one started). */
static pg_conn *half_take(pg_store *ps)
{
    pthread_mutex_lock(&ps->mu);
    pg_conn *cn = ps->half;
    ps->half = NULL;
    pthread_mutex_unlock(&ps->mu);
    if (cn && dlock__now_ms() - cn->opening_since > ps->timeout_ms) {
        dlock__pg_conn_free(cn);
        cn = NULL;
    }
    return cn;
}

/* The caller's deadline came before the log-in ended: keep cn for the
 * next opener (one at most; a second one is closed). */
static void half_keep(pg_store *ps, pg_conn *cn)
{
    pthread_mutex_lock(&ps->mu);
    if (!ps->half) {
        ps->half = cn;
        cn = NULL;
    }
    pthread_mutex_unlock(&ps->mu);
    dlock__pg_conn_free(cn);
}

/* Opens a connection within `deadline`, or goes on with the one a
 * caller before left half-open (ps->half). */
static int conn_open(pg_store *ps, int64_t deadline, pg_conn **out)
{
    pg_conn *cn = half_take(ps);
    int rc;

    *out = NULL;
    if (!cn) {
        cn = calloc(1, sizeof(*cn));
        if (!cn)
            return dlock__pg_enomem();
        pthread_mutex_init(&cn->mu, NULL);
        cn->cfd = -1;
        cn->polling = PGRES_POLLING_WRITING;
        cn->opening_since = dlock__now_ms();
        cn->pg = PQconnectStartParams(ps->keys,
                                      (const char *const *)ps->vals, 0);
        if (!cn->pg) {
            dlock__pg_conn_free(cn);
            return dlock__pg_enomem();
        }
        PQsetNoticeReceiver(cn->pg, noticed, cn);
        if (PQstatus(cn->pg) == CONNECTION_BAD) {
            rc = conn_error(ps, cn, "connecting");
            dlock__pg_conn_free(cn);
            return rc;
        }
    }
    while (cn->polling != PGRES_POLLING_OK) {
        if (cn->polling == PGRES_POLLING_FAILED) {
            rc = conn_error(ps, cn, "connecting");
            dlock__pg_conn_free(cn);
            return rc;
        }
        int r = wait_fd(PQsocket(cn->pg),
                        cn->polling == PGRES_POLLING_READING ? POLLIN
                                                             : POLLOUT,
                        deadline, -1);
        if (r < 0) {
            dlock__pg_conn_free(cn);
            return dlock__err(DLOCK_ECONN, "postgres %s: connecting: "
                                           "no answer in time",
                              ps->redacted);
        }
        if (r == 0) {
            /* cut short by this caller's deadline: the next goes on */
            half_keep(ps, cn);
            return dlock__err(DLOCK_ECONN, "postgres %s: connecting: "
                                           "no answer in time",
                              ps->redacted);
        }
        cn->polling = PQconnectPoll(cn->pg);
    }
    if (PQsetnonblocking(cn->pg, 1) != 0) {
        rc = conn_error(ps, cn, "connecting");
        dlock__pg_conn_free(cn);
        return rc;
    }
    *out = cn;
    return DLOCK_OK;
}

static int collect(pg_store *ps, pg_conn *cn, int64_t deadline,
                   PGresult **out, const char *what);
static int collect_ex(pg_store *ps, pg_conn *cn, int64_t deadline,
                      PGresult **out, const char *what, int64_t since);
static int settle(pg_store *ps, pg_conn *cn, int64_t deadline);
static int failed_result(const PGresult *r);
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

static void main_lost(pg_store *ps);

/* Its user gives the command connection cn back (mu held): forgotten
 * when it is not `usable` (main_lost()), else free for the next user,
 * its watch re-armed. */
static void main_back(pg_store *ps, pg_conn *cn, int usable)
{
    if (!usable) {
        main_lost(ps);
        return;
    }
    ps->main_busy = 0;
    pthread_cond_signal(&ps->cv);
    main_watch(ps, cn, EPOLL_CTL_MOD);
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
    dlock__pg_conn_free(cn);
}

/* Is an idle connection still usable? It has nothing to read unless the
 * server closed it (a restart) or sent notifications. */
static int conn_alive(pg_store *ps, pg_conn *cn)
{
    if (PQstatus(cn->pg) != CONNECTION_OK)
        return 0;
    if (!dlock__pool_stale(PQsocket(cn->pg)))
        return 1;
    if (!PQconsumeInput(cn->pg) || PQstatus(cn->pg) != CONNECTION_OK)
        return 0;
    drain_notifies(ps, cn);
    return 1;
}

/* cn carries a statement a caller before left running (orphaned()):
 * reads and drops its answer, until `deadline`. DLOCK_OK: cn is free
 * again; else DLOCK_ECONN, cn still busy (or broken, once the statement
 * ran past ?timeout= from when it was sent). */
static int settle(pg_store *ps, pg_conn *cn, int64_t deadline)
{
    PGresult *r;
    int64_t since = cn->orphan_since;
    int rc;

    if (!cn->orphan)
        return DLOCK_OK;
    cn->orphan = 0;
    if (deadline > since + ps->timeout_ms)
        deadline = since + ps->timeout_ms;
    rc = collect_ex(ps, cn, deadline, &r, "a statement cut short before",
                    since);
    if (rc == DLOCK_OK && failed_result(r)) {
        /* it failed (a statement prepared, say): what the connection
         * holds is not known any more */
        cn->broken = 1;
        rc = dlock__err(DLOCK_ECONN, "postgres %s: a statement cut short "
                                     "before failed: the connection is "
                                     "closed",
                        ps->redacted);
    }
    PQclear(r);
    if (rc == DLOCK_EPROTO && !cn->broken) /* no result: read already */
        rc = DLOCK_OK;
    return rc;
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
    while (need_main && (ps->main ? ps->main_busy : ps->main_opening) &&
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
        if (!cn->broken && cn->orphan) {
            rc = settle(ps, cn, deadline);
            if (rc && !cn->broken) {
                dlock__pg_conn_put(ps, cn); /* still running */
                return rc;
            }
        }
        if (!cn->broken && conn_alive(ps, cn)) {
            *out = cn;
            return DLOCK_OK;
        }
        pthread_mutex_lock(&ps->mu);
        main_lost(ps);
        cn = NULL;
    } else if (need_main && (ps->main || ps->main_opening)) {
        pthread_mutex_unlock(&ps->mu);
        return dlock__err(DLOCK_ECONN, "postgres %s: the command "
                                       "connection stayed busy",
                          ps->redacted);
    }
    /* one thread at a time opens the command connection: a second one
     * made meanwhile would replace the first in ps->main, which its user
     * may already have given back (then it was in no list: lost) */
    int as_main = ps->main == NULL && !ps->main_opening;
    if (as_main) {
        ps->main_busy = 1; /* ours, as soon as it exists */
        ps->main_opening = 1;
    } else {
        cn = dlock__pool_take(&ps->idle);
    }
    pthread_mutex_unlock(&ps->mu);
    while (cn) {
        if (cn->orphan && (rc = settle(ps, cn, deadline)) != DLOCK_OK &&
            !cn->broken) {
            dlock__pg_conn_put(ps, cn); /* still running */
            return rc;
        }
        if (!cn->broken && conn_alive(ps, cn)) {
            *out = cn;
            return DLOCK_OK;
        }
        dlock__pg_conn_free(cn);
        cn = NULL;
    }
    rc = conn_open(ps, deadline, &cn);
    pthread_mutex_lock(&ps->mu);
    if (as_main) {
        ps->main_opening = 0;
        if (rc == DLOCK_OK) {
            ps->main = cn;
            main_watch(ps, cn, EPOLL_CTL_ADD);
        } else {
            ps->main_busy = 0;
        }
        pthread_cond_broadcast(&ps->cv);
    }
    pthread_mutex_unlock(&ps->mu);
    *out = cn;
    return rc;
}

int dlock__pg_conn_own(pg_store *ps, int64_t deadline, pg_conn **out)
{
    pg_conn *cn;

    if (deadline > dlock__now_ms() + ps->timeout_ms)
        deadline = dlock__now_ms() + ps->timeout_ms; /* ?timeout= */
    pthread_mutex_lock(&ps->mu);
    cn = dlock__pool_take(&ps->idle);
    pthread_mutex_unlock(&ps->mu);
    if (cn && !cn->orphan && !cn->broken && conn_alive(ps, cn)) {
        *out = cn;
        return DLOCK_OK;
    }
    dlock__pg_conn_free(cn);
    return conn_open(ps, deadline, out);
}

int dlock__pg_conn_get(pg_store *ps, int64_t deadline, pg_conn **out)
{
    return conn_get_ex(ps, deadline, out, 0);
}

void dlock__pg_conn_put(pg_store *ps, pg_conn *cn)
{
    if (!cn)
        return;
    /* an orphaned statement (orphaned()) keeps it busy: kept, settled
     * by its next user */
    int usable = !cn->broken && !cn->dead &&
                 PQstatus(cn->pg) == CONNECTION_OK &&
                 (cn->orphan ||
                  PQtransactionStatus(cn->pg) == PQTRANS_IDLE);
    if (usable && !cn->orphan)
        drain_notifies(ps, cn);
    pthread_mutex_lock(&ps->mu);
    if (cn == ps->main) {
        main_back(ps, cn, usable);
        pthread_mutex_unlock(&ps->mu);
        return;
    }
    if (usable && dlock__pool_keep(&ps->idle, cn)) {
        cn = NULL;
        idle_timer(ps);
    }
    pthread_mutex_unlock(&ps->mu);
    dlock__pg_conn_free(cn);
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
    return collect_ex(ps, cn, deadline, out, what, -1);
}

/* A statement sent at `since` found no answer before the caller's
 * deadline, which came before ?timeout= did (a short wait): in table
 * mode the connection is kept, the statement left to run (one function
 * call, autocommitted), and its answer read and dropped by the
 * connection's next user (settle()). Closing it would cost a new log-in
 * (tens of ms, more than a short wait has: a client making such waits
 * on a busy server then never got a statement through). What such a
 * statement did is the store's to tell: a hold it took is found by the
 * owner's next call, as one whose answer was lost. */
static int orphaned(pg_store *ps, pg_conn *cn, int64_t since,
                    const char *what)
{
    cn->orphan = 1;
    cn->orphan_since = since;
    return dlock__err(DLOCK_ECONN, "postgres %s: %s: no answer in time",
                      ps->redacted, what);
}

/* collect(); since >= 0: the statement may be left running (orphaned())
 * when the caller's deadline cuts it short before ?timeout= from since */
static int collect_ex(pg_store *ps, pg_conn *cn, int64_t deadline,
                      PGresult **out, const char *what, int64_t since)
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
            ended_by_server(cn, r);
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
                        deadline, cn->cancel_sent ? -1 : cn->cfd);
        if (r == 0) {
            PQclear(keep);
            if (since >= 0 && !ps->advisory && !cn->cancel_sent &&
                dlock__now_ms() < since + ps->timeout_ms)
                return orphaned(ps, cn, since, what);
            return timeout_error(ps, cn, what);
        }
        if (r == 2) {
            /* dlock_cancel(): the wait's statement is ended by the
             * server (57014), whose answer follows; a request that could
             * not be sent: the connection is given up, which ends it */
            cn->cancel_sent = 1;
            if (cancel_statement(cn) != 0) {
                PQclear(keep);
                return timeout_error(ps, cn, what);
            }
            /* the server drops a cancel that comes before it starts the
             * statement (while it still reads it): the answer is waited
             * for ?timeout= more at most, then the connection is given
             * up, which ends the statement in the server */
            if (deadline > dlock__now_ms() + ps->timeout_ms)
                deadline = dlock__now_ms() + ps->timeout_ms;
            continue;
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
    /* what came before the end: the server's reason (SQLSTATE 57P01) */
    for (int i = 0; i < 8; i++) {
        PGresult *r = PQgetResult(cn->pg);
        if (!r)
            break;
        ended_by_server(cn, r);
        PQclear(r);
    }
    return conn_error(ps, cn, what);
}

/* `keep`'s status: DLOCK_OK for a success, else its error (cleared). */
static int result_ok(pg_store *ps, PGresult **r, const char *what)
{
    ExecStatusType s = PQresultStatus(*r);

    if (s == PGRES_TUPLES_OK || s == PGRES_COMMAND_OK)
        return DLOCK_OK;
    int rc = dlock__pg_result_error(ps, *r, what);
    PQclear(*r);
    *r = NULL;
    return rc;
}

/* A command whose result is not needed: `sent` is what libpq's send call
 * returned; its answer is collected and checked. */
static int answered(pg_store *ps, pg_conn *cn, int sent, int64_t deadline,
                    const char *what)
{
    PGresult *r;
    int rc;

    if (!sent)
        return conn_error(ps, cn, what);
    /* left running when the deadline comes first (orphaned()): the
     * statements of dlock__pg_run(), which alone call this */
    rc = collect_ex(ps, cn, deadline, &r, what, dlock__now_ms());
    if (!rc)
        rc = result_ok(ps, &r, what);
    PQclear(r);
    return rc;
}

/*
 * Runs prepared statement `which` with parameter values (vals[0], the lock
 * name, in binary: any bytes) on cn; *out the result on DLOCK_OK.
 */
int dlock__pg_run(pg_store *ps, pg_conn *cn, int which,
                  const char *const *vals, const int *lens, int64_t deadline,
                  PGresult **out, const char *what)
{
    /* one per statement: a new statement needs its name here */
    static const char *const names[] = {
        "dlock0",  "dlock1",  "dlock2",  "dlock3",  "dlock4",  "dlock5",
        "dlock6",  "dlock7",  "dlock8",  "dlock9",  "dlock10", "dlock11",
        "dlock12", "dlock13", "dlock14", "dlock15", "dlock16", "dlock17",
        "dlock18", "dlock19", "dlock20", "dlock21", "dlock22", "dlock23",
        "dlock24"};
    _Static_assert(sizeof(names) / sizeof(names[0]) == S_COUNT,
                   "a prepared statement's name for every statement");
    static const Oid types[S_COUNT][PG_PARAMS_MAX] = {
        [S_ACQUIRE] = {T_BYTEA, T_TEXT, T_INT8, T_TEXT, T_TEXT, T_INT8,
                       T_INT4, T_TEXT},
        [S_TAKE] = {T_BYTEA, T_TEXT, T_INT8, T_TEXT, T_TEXT, T_INT8, T_INT4,
                    T_TEXT, T_INT4},
        [S_TAKE_FAST] = {T_BYTEA, T_TEXT, T_INT8, T_TEXT, T_TEXT, T_INT8,
                         T_INT4, T_TEXT, T_INT4},
        [S_RELEASE] = {T_BYTEA, T_TEXT, T_INT8},
        [S_RELEASE_READ] = {T_BYTEA, T_TEXT, T_INT8},
        [S_EXTEND] = {T_BYTEA, T_TEXT, T_INT8, T_INT8},
        [S_PROCLAIM] = {T_BYTEA, T_TEXT, T_INT8, T_TEXT},
        [S_EXTEND_SHARED] = {T_BYTEA, T_TEXT, T_INT8, T_INT8},
        [S_INSPECT] = {T_BYTEA},
        [S_QUEUE] = {T_BYTEA, T_TEXT},
        [S_LEAVE] = {T_BYTEA, T_TEXT, T_TEXT, T_INT8, T_INT8, T_INT4},
        [S_GC] = {T_INT8},
        [S_GC_QUEUE] = {T_TEXT},
        [S_ADV_TRY] = {T_BYTEA, T_TEXT},
        [S_ADV_UNLOCK] = {T_BYTEA},
        [S_ADV_CHECK] = {T_BYTEA},
        [S_ADV_INSPECT] = {T_BYTEA},
        [S_ADV_TRY_SHARED] = {T_BYTEA, T_TEXT},
        [S_ADV_UNLOCK_SHARED] = {T_BYTEA},
        [S_ADV_SEM_TRY] = {T_BYTEA, T_TEXT, T_INT4, T_INT4, T_BOOL},
        [S_ADV_SEM_UNLOCK] = {T_BYTEA, T_INT4, T_INT4},
        [S_ADV_SEM_CHECK] = {T_BYTEA, T_INT4, T_INT4},
        [S_LIST] = {T_BYTEA, T_BYTEA, T_BYTEA, T_INT8, T_INT8, T_BOOL,
                    T_TEXT},
        [S_BREAK] = {T_BYTEA, T_TEXT},
        [S_CONFIRM] = {T_BYTEA, T_TEXT, T_TEXT, T_INT8, T_INT4, T_INT4},
    };
    int fmts[PG_PARAMS_MAX] = {0};
    int n = ps->nparams[which];
    PGresult *r;
    int rc;

    *out = NULL;
    if (deadline > dlock__now_ms() + ps->timeout_ms)
        deadline = dlock__now_ms() + ps->timeout_ms; /* ?timeout= */
    for (int i = 0; i < n; i++)
        fmts[i] = types[which][i] == T_BYTEA; /* names: any bytes */
    if (ps->unnamed) {
        /* a pooler may run each transaction on another session: no
         * prepared statements (the text goes with every call) */
        if (!PQsendQueryParams(cn->pg, ps->sql[which], n, types[which],
                               vals, lens, fmts, 0))
            return conn_error(ps, cn, what);
        goto answer;
    }
    if (!cn->prepared && PQserverVersion(cn->pg) >= 120000) {
        /* before the connection's first prepared statement: generic
         * plans only. Every statement of the store (and of its functions)
         * finds rows by key, which a generic plan does as well as any;
         * left to choose, PostgreSQL planned the exclusive try anew at
         * every call while the queue table had no statistics (a fresh or
         * never-analyzed queue: the exclusive cycle 450-700 µs instead of
         * 150-250 µs, bench_rw after bench_pg) */
        rc = answered(ps, cn,
                      PQsendQuery(cn->pg,
                                  "SET plan_cache_mode = force_generic_plan"),
                      deadline, what);
        if (rc)
            return rc;
    }
    if (!(cn->prepared & (1u << which))) {
        /* counted as prepared as soon as it is sent: one left running
         * (orphaned()) is not sent again, and one that fails there
         * closes the connection (settle()) */
        int sent = PQsendPrepare(cn->pg, names[which], ps->sql[which], n,
                                 types[which]);
        cn->prepared |= 1u << which;
        rc = answered(ps, cn, sent, deadline, what);
        if (rc && !cn->orphan)
            cn->prepared &= ~(1u << which);
        if (rc)
            return rc;
    }
    if (!PQsendQueryPrepared(cn->pg, names[which], n, vals, lens, fmts, 0))
        return conn_error(ps, cn, what);
answer:
    rc = collect_ex(ps, cn, deadline, &r, what, dlock__now_ms());
    if (rc)
        return rc;
    rc = result_ok(ps, &r, what);
    if (rc)
        return rc;
    *out = r;
    return DLOCK_OK;
}

/* One statement on a pooled connection. */
int dlock__pg_run_pooled(pg_store *ps, int which, const char *const *vals,
                         const int *lens, int64_t deadline, PGresult **out,
                         const char *what)
{
    pg_conn *cn;
    int rc = dlock__pg_conn_get(ps, deadline, &cn);

    if (rc)
        return rc;
    rc = dlock__pg_run(ps, cn, which, vals, lens, deadline, out, what);
    dlock__pg_conn_put(ps, cn);
    return rc;
}

/* A query text (no parameters; may hold several statements). */
int dlock__pg_run_text(pg_store *ps, pg_conn *cn, const char *sql,
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

/* ------------------------------------------------------------------------ */
/* Notifications (table mode): LISTEN dlock_CLIENTID on the command         */
/* connection                                                               */
/* ------------------------------------------------------------------------ */

/* A notification on our channel: "g WAITER TOKEN", a release says it
 * handed the lock to one of our waiters. Only a wake-up of that waiter,
 * whose next try reads the row (S_CONFIRM, pg_table.c): NOTIFY checks no
 * privilege, so any role that can connect to the database can send this
 * (the channel and waiter number are in T_waiters, or guessed). The
 * token is never used. Any number of notifications before the waiter
 * looks cost it one read. */
static void dispatch(pg_store *ps, const PGnotify *nt)
{
    unsigned long long waiter, token;
    int end = 0;

    if (strcmp(nt->relname, ps->chan) != 0)
        return;
    if (sscanf(nt->extra, "g %llu %llu%n", &waiter, &token, &end) == 2 &&
        nt->extra[end] == '\0' && token > 0)
        dlock__notify_waiter(ps->client, waiter);
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
int dlock__pg_listen_ref(pg_store *ps, pg_lease *pl, int64_t deadline,
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
        rc = dlock__pg_run_text(ps, cn, sql, deadline, &r, "LISTEN");
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
    dlock__pg_conn_put(ps, cn);
    return rc;
}

/* Lease l waits no more. With no waiter left, the client stops listening
 * in a second, unless it waits again by then: PostgreSQL wakes every
 * listening session of the database at every NOTIFY. */
void dlock__pg_listen_unref(pg_store *ps, pg_lease *pl)
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
void dlock__pg_idle_run(pg_store *ps)
{
    void *extra[DLOCK__POOL_MAX];
    pg_conn *cn = NULL;
    unsigned nextra;

    pthread_mutex_lock(&ps->mu);
    nextra = dlock__pool_drain(&ps->idle, extra);
    if (ps->nwait == 0 && ps->listening && ps->main && !ps->main_busy &&
        !ps->main->orphan) {
        cn = ps->main;
        ps->main_busy = 1;
    } else if (ps->nwait == 0 && ps->listening) {
        idle_timer(ps); /* in use: later */
    }
    pthread_mutex_unlock(&ps->mu);
    while (nextra > 0)
        dlock__pg_conn_free(extra[--nextra]);
    if (!cn)
        return;
    int ok = !ps->main_pending &&
             PQsendQuery(cn->pg, "UNLISTEN *; SELECT "
                                 "pg_advisory_unlock_all()") &&
             PQflush(cn->pg) == 0;
    pthread_mutex_lock(&ps->mu);
    if (!ok) {
        cn->broken = 1;
    } else {
        ps->main_pending = 1;
        ps->listening = 0; /* a new wait LISTENs again */
    }
    main_back(ps, cn, ok);
    pthread_mutex_unlock(&ps->mu);
}

/* The command connection is readable while nobody uses it: a
 * notification, the answer of an UNLISTEN, or the server closing it. */
void dlock__pg_main_read(pg_store *ps)
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
        if (!PQisBusy(cn->pg)) {
            ps->main_pending = 0;
            cn->orphan = 0; /* its answer read (and dropped) */
        }
    }
    pthread_mutex_lock(&ps->mu);
    main_back(ps, cn, ok);
    pthread_mutex_unlock(&ps->mu);
}
