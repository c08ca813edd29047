/* SPDX-License-Identifier: MIT */
/*
 * mysql.c -- the MySQL/MariaDB store (MariaDB Connector/C, which also
 * speaks to MySQL): the seeds' lock table.
 *
 *  - One row per lock name in table T (default dlock_locks): owner,
 *    holder, hold count, fencing token, locked_at and lock_until
 *    (DATETIME(6) in UTC of the server's clock, UTC_TIMESTAMP(6): neither
 *    the client's clock nor any session's time zone is used). Rows are not
 *    deleted on release; dlock_gc() removes long-unused ones.
 *  - Acquire is one statement: INSERT ... ON DUPLICATE KEY UPDATE where
 *    every column is taken over only if the lease ended (each assignment
 *    repeats the condition; owner and lock_until, which the condition
 *    reads, come last). Affected rows say what happened: 1 inserted, 2
 *    taken over, 0 busy. The token is max(previous + 1, the server's clock
 *    in µs), read back through LAST_INSERT_ID(expr) in the same statement,
 *    so a name whose row gc removed starts again above its old tokens.
 *  - Release and extend are one UPDATE each, guarded by owner and token.
 *  - Every value in a statement is a number or a hex literal (X'...'), and
 *    the table name one backquoted identifier: nothing a caller passes can
 *    change a statement.
 *  - Waiting, in the server: every name has a gate, a user-level lock
 *    (GET_LOCK) named from a hash of the database, table and name. A
 *    holder's connection holds its gate for the hold; a waiter sleeps in
 *    GET_LOCK on its own connection, and the holder's release (one round
 *    trip: the UPDATE, then RELEASE_ALL_LOCKS) hands the gate to the
 *    oldest waiter, whom the server wakes (its lock queue is FIFO). The
 *    try that wins also takes the gate; one that finds the gate taken
 *    does not take a free row (no barging past a woken waiter). The row
 *    stays the truth for owner, lease and token: the gate only decides
 *    who is woken. A waiter never sleeps past the holder's lease end (a
 *    frozen holder keeps its gate; the lease decides). Protocol and
 *    failure cases: docs/design.md, "Waiting in the server (MySQL)".
 *  - Fair mode: waiters are already served in order; a waiter also
 *    writes a T_queue entry for dlock_inspect(), alive while its
 *    connection holds the entry's own user lock (no heartbeats).
 *  - Connections: a pool per client (up to MY_IDLE_MAX idle); a hold and
 *    a waiting acquire each keep one connection out of it (the gate's),
 *    so a client uses as many as it has holds and waiters at once. The
 *    non-blocking API of Connector/C, so every statement keeps the
 *    caller's deadline; READ COMMITTED (no gap locks between upserts); a
 *    deadlock victim is re-tried.
 */
#include "internal.h"

#include <mysql.h>
#include <errmsg.h>
#include <mysqld_error.h>

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define MY_DEFAULT_TABLE "dlock_locks"
#define MY_TABLE_MAX 48  /* + "_queue": within MySQL's 64 */
#define MY_IDLE_MAX 8
#define MY_WAIT_SLICE_MS 60000 /* one GET_LOCK waits at most this long */
#define MY_DEADLOCK_RETRIES 5
#define MY_WAIT_RECONNECTS 3 /* a waiting session killed: wait on anew */
#define NOW "UTC_TIMESTAMP(6)"

typedef struct my_conn {
    MYSQL *m;
    int broken;
    int answered; /* the last query's first statement was answered */
    struct my_conn *next;
} my_conn;

typedef struct my_store {
    char *redacted;
    int64_t timeout_ms;
    char *host, *user, *password, *db;
    unsigned port;
    char *ssl_ca, *ssl_cert, *ssl_key;
    int ssl_enforce, ssl_verify;
    char t[2 * MY_TABLE_MAX + 8];  /* `T` */
    char q[2 * MY_TABLE_MAX + 16]; /* `T_queue` */
    char table[MY_TABLE_MAX + 1];
    char *tl; /* the table's name as a literal, for gate names */
    pthread_mutex_t mu;
    my_conn *idle;
    int nidle;
} my_store;

typedef struct my_lease {
    my_conn *cn; /* out of the pool while waiting or holding: the gate's */
    int gated;   /* cn holds the name's gate */
    int64_t seq; /* fair queue entry (inspect), 0 when none */
} my_lease;

static int enomem(void)
{
    return dlock__err(DLOCK_ENOMEM, "out of memory");
}

/* The code for a server or client error number. */
static int code_of(unsigned e)
{
    switch (e) {
    case ER_ACCESS_DENIED_ERROR:
    case ER_DBACCESS_DENIED_ERROR:
    case ER_TABLEACCESS_DENIED_ERROR:
    case ER_COLUMNACCESS_DENIED_ERROR:
    case ER_SPECIFIC_ACCESS_DENIED_ERROR:
    case ER_BAD_DB_ERROR:
        return DLOCK_EAUTH;
    case ER_LOCK_DEADLOCK:
    case ER_LOCK_WAIT_TIMEOUT:
    case ER_SERVER_SHUTDOWN:
    case ER_CON_COUNT_ERROR:
    case ER_TOO_MANY_USER_CONNECTIONS:
    case ER_OPTION_PREVENTS_STATEMENT: /* read_only: a replica */
        return DLOCK_ECONN;
    default:
        return e >= 2000 && e < 3000 ? DLOCK_ECONN : DLOCK_EPROTO;
    }
}

/* The connection's last error; a client-side error (CR_*) breaks it. */
static int my_error(my_store *ms, my_conn *cn, const char *what)
{
    unsigned e = mysql_errno(cn->m);

    if (e >= 2000 && e < 3000)
        cn->broken = 1;
    return dlock__err(code_of(e), "mysql %s: %s: %s (error %u)",
                      ms->redacted, what,
                      e ? mysql_error(cn->m) : "connection lost", e);
}

static int timeout_error(my_store *ms, my_conn *cn, const char *what)
{
    cn->broken = 1;
    return dlock__err(DLOCK_ECONN, "mysql %s: %s: no answer in time",
                      ms->redacted, what);
}

/* ------------------------------------------------------------------------ */
/* Non-blocking I/O                                                         */
/* ------------------------------------------------------------------------ */

/* Waits for what the library asked (status) until `deadline`; returns the
 * status to pass to the _cont call, or -1 when the deadline passed. */
static int wait_io(MYSQL *m, int status, int64_t deadline)
{
    struct pollfd p;
    int64_t left = deadline - dlock__now_ms();
    int lib = -1;

    p.fd = mysql_get_socket(m);
    p.events = (short)((status & MYSQL_WAIT_READ ? POLLIN : 0) |
                       (status & MYSQL_WAIT_WRITE ? POLLOUT : 0) |
                       (status & MYSQL_WAIT_EXCEPT ? POLLPRI : 0));
    p.revents = 0;
    if (status & MYSQL_WAIT_TIMEOUT)
        lib = (int)mysql_get_timeout_value_ms(m);
    for (;;) {
        left = deadline - dlock__now_ms();
        if (left <= 0)
            return -1;
        int ms = left > 60000 ? 60000 : (int)left;
        int own = lib < 0 || lib > ms; /* which timer ends the poll */
        if (!own)
            ms = lib;
        int r = poll(&p, 1, ms);
        if (r > 0)
            return (p.revents & (POLLIN | POLLHUP | POLLERR) ? MYSQL_WAIT_READ
                                                              : 0) |
                   (p.revents & POLLOUT ? MYSQL_WAIT_WRITE : 0) |
                   (p.revents & POLLPRI ? MYSQL_WAIT_EXCEPT : 0);
        if (r == 0 && !own)
            return MYSQL_WAIT_TIMEOUT;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

static void conn_free(my_conn *cn)
{
    if (!cn)
        return;
    if (cn->m) {
        /* a shut socket makes the close's COM_QUIT fail at once instead of
         * blocking on a dead or frozen server */
        if (cn->broken && mysql_get_socket(cn->m) >= 0)
            shutdown(mysql_get_socket(cn->m), SHUT_RDWR);
        mysql_close(cn->m);
    }
    free(cn);
}

static int conn_open(my_store *ms, int64_t deadline, my_conn **out)
{
    my_conn *cn = calloc(1, sizeof(*cn));
    MYSQL *ret = NULL;
    unsigned secs;
    int status, rc;
    my_bool yes = 1;

    *out = NULL;
    if (!cn || !(cn->m = mysql_init(NULL))) {
        free(cn);
        return enomem();
    }
    /* the library's own timeouts only back ours up */
    secs = (unsigned)((ms->timeout_ms + 999) / 1000) + 1;
    mysql_options(cn->m, MYSQL_OPT_NONBLOCK, 0);
    mysql_options(cn->m, MYSQL_OPT_CONNECT_TIMEOUT, &secs);
    mysql_options(cn->m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    mysql_options(cn->m, MYSQL_INIT_COMMAND,
                  "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED");
    mysql_optionsv(cn->m, MYSQL_OPT_CONNECT_ATTR_ADD, "program_name",
                   "dlock");
    if (ms->ssl_ca)
        mysql_options(cn->m, MYSQL_OPT_SSL_CA, ms->ssl_ca);
    if (ms->ssl_cert)
        mysql_options(cn->m, MYSQL_OPT_SSL_CERT, ms->ssl_cert);
    if (ms->ssl_key)
        mysql_options(cn->m, MYSQL_OPT_SSL_KEY, ms->ssl_key);
    if (ms->ssl_enforce)
        mysql_options(cn->m, MYSQL_OPT_SSL_ENFORCE, &yes);
    if (ms->ssl_verify)
        mysql_options(cn->m, MYSQL_OPT_SSL_VERIFY_SERVER_CERT, &yes);
    /* several statements in one round trip: a try and its wait, a
     * release and the gate's */
    status = mysql_real_connect_start(&ret, cn->m, ms->host, ms->user,
                                      ms->password, ms->db, ms->port, NULL,
                                      CLIENT_MULTI_STATEMENTS);
    while (status) {
        int ready = wait_io(cn->m, status, deadline);
        if (ready < 0) {
            rc = timeout_error(ms, cn, "connecting");
            conn_free(cn);
            return rc;
        }
        status = mysql_real_connect_cont(&ret, cn->m, ready);
    }
    if (!ret) {
        rc = my_error(ms, cn, "connecting");
        cn->broken = 1;
        conn_free(cn);
        return rc;
    }
    if (ms->ssl_enforce && !mysql_get_ssl_cipher(cn->m)) {
        /* Connector/C 3.3 goes on in plain text when the server offers no
         * TLS, even when told to require it: refuse such a session */
        cn->broken = 1;
        conn_free(cn);
        return dlock__err(DLOCK_ECONN,
                          "mysql %s: connecting: TLS is required (ssl_mode) "
                          "but the server does not offer it",
                          ms->redacted);
    }
    *out = cn;
    return DLOCK_OK;
}

static int conn_get(my_store *ms, int64_t deadline, my_conn **out)
{
    pthread_mutex_lock(&ms->mu);
    my_conn *cn = ms->idle;
    if (cn) {
        ms->idle = cn->next;
        ms->nidle--;
        cn->next = NULL;
    }
    pthread_mutex_unlock(&ms->mu);
    if (cn) {
        /* an idle connection has nothing to read unless the server closed
         * it (a restart, wait_timeout): then a new one */
        struct pollfd p = {mysql_get_socket(cn->m), POLLIN, 0};
        if (poll(&p, 1, 0) == 0) {
            *out = cn;
            return DLOCK_OK;
        }
        cn->broken = 1;
        conn_free(cn);
    }
    return conn_open(ms, deadline, out);
}

static void conn_put(my_store *ms, my_conn *cn)
{
    if (!cn)
        return;
    if (cn->broken) {
        conn_free(cn);
        return;
    }
    pthread_mutex_lock(&ms->mu);
    if (ms->nidle < MY_IDLE_MAX) {
        cn->next = ms->idle;
        ms->idle = cn;
        ms->nidle++;
        cn = NULL;
    }
    pthread_mutex_unlock(&ms->mu);
    conn_free(cn);
}

/* Reads the result of the statement whose answer is pending on cn into
 * *res when it has rows (replacing an earlier one), else frees it. */
static int take_result(my_store *ms, my_conn *cn, int64_t deadline,
                       MYSQL_RES **res, const char *what)
{
    MYSQL_RES *r = NULL;
    int status, ready;

    if (mysql_field_count(cn->m) == 0)
        return DLOCK_OK;
    status = mysql_store_result_start(&r, cn->m);
    while (status) {
        if ((ready = wait_io(cn->m, status, deadline)) < 0)
            return timeout_error(ms, cn, what);
        status = mysql_store_result_cont(&r, cn->m, ready);
    }
    if (!r)
        return my_error(ms, cn, what);
    if (res) {
        if (*res)
            mysql_free_result(*res);
        *res = r;
    } else {
        mysql_free_result(r);
    }
    return DLOCK_OK;
}

/*
 * Runs sql (one statement, or several separated by ';') on cn within
 * `deadline`. *affected and *id get what statement number `at` (from 0)
 * changed and the LAST_INSERT_ID it set; *res the rows of the last
 * statement that has rows (NULL when none; the caller frees them). Any
 * may be NULL. The server stops at the first statement that fails.
 */
static int query_at(my_store *ms, my_conn *cn, const char *sql,
                    int64_t deadline, MYSQL_RES **res, int at,
                    uint64_t *affected, uint64_t *id, const char *what)
{
    int err = 0, status, ready, rc, n = 0;

    if (res)
        *res = NULL;
    cn->answered = 0;
    status = mysql_real_query_start(&err, cn->m, sql, strlen(sql));
    while (status) {
        if ((ready = wait_io(cn->m, status, deadline)) < 0)
            return timeout_error(ms, cn, what);
        status = mysql_real_query_cont(&err, cn->m, ready);
    }
    if (err)
        return my_error(ms, cn, what);
    cn->answered = 1;
    for (;;) {
        if (n == at && affected)
            *affected = (uint64_t)mysql_affected_rows(cn->m);
        if (n == at && id)
            *id = (uint64_t)mysql_insert_id(cn->m);
        rc = take_result(ms, cn, deadline, res, what);
        if (rc != DLOCK_OK || !mysql_more_results(cn->m))
            break;
        n++;
        status = mysql_next_result_start(&err, cn->m);
        while (status) {
            if ((ready = wait_io(cn->m, status, deadline)) < 0) {
                rc = timeout_error(ms, cn, what);
                break;
            }
            status = mysql_next_result_cont(&err, cn->m, ready);
        }
        if (rc == DLOCK_OK && err)
            rc = my_error(ms, cn, what);
        if (rc)
            break;
    }
    if (rc && res && *res) {
        mysql_free_result(*res);
        *res = NULL;
    }
    return rc;
}

static int query(my_store *ms, my_conn *cn, const char *sql,
                 int64_t deadline, MYSQL_RES **res, uint64_t *affected,
                 uint64_t *id, const char *what)
{
    return query_at(ms, cn, sql, deadline, res, 0, affected, id, what);
}

/* One statement on a pooled connection; a deadlock victim (rolled back,
 * nothing done) runs again. */
static int query_pooled(my_store *ms, const char *sql, int64_t deadline,
                        MYSQL_RES **res, uint64_t *affected, uint64_t *id,
                        const char *what)
{
    my_conn *cn;
    int rc;

    if (deadline > dlock__now_ms() + ms->timeout_ms)
        deadline = dlock__now_ms() + ms->timeout_ms; /* ?timeout= */
    for (int attempt = 0;; attempt++) {
        rc = conn_get(ms, deadline, &cn);
        if (rc)
            return rc;
        rc = query(ms, cn, sql, deadline, res, affected, id, what);
        unsigned e = rc ? mysql_errno(cn->m) : 0;
        conn_put(ms, cn);
        if (!(rc && e == ER_LOCK_DEADLOCK && attempt < MY_DEADLOCK_RETRIES &&
              dlock__now_ms() < deadline))
            return rc;
    }
}

static long long col_ll(MYSQL_RES *r, int col, long long dflt)
{
    MYSQL_ROW row;

    if (!r || (int)mysql_num_fields(r) <= col)
        return dflt;
    mysql_data_seek(r, 0);
    row = mysql_fetch_row(r);
    if (!row || !row[col])
        return dflt;
    return strtoll(row[col], NULL, 10);
}

/* ------------------------------------------------------------------------ */
/* Statements                                                               */
/* ------------------------------------------------------------------------ */

/* `name` with embedded backquotes doubled: one identifier. */
static void quote_ident(const char *in, const char *suffix, char *out,
                        size_t cap)
{
    char both[MY_TABLE_MAX + 16];
    size_t o = 0;

    snprintf(both, sizeof(both), "%s%s", in, suffix);
    out[o++] = '`';
    for (const char *p = both; *p && o + 3 < cap; p++) {
        if (*p == '`')
            out[o++] = '`';
        out[o++] = *p;
    }
    out[o++] = '`';
    out[o] = '\0';
}

/* X'<hex>' of n bytes into a fresh buffer (NULL: out of memory). */
static char *hexlit(const char *s, size_t n)
{
    char *out = malloc(2 * n + 4);

    if (!out)
        return NULL;
    out[0] = 'X';
    out[1] = '\'';
    dlock__hex(s, n, out + 2);
    out[2 * n + 2] = '\'';
    out[2 * n + 3] = '\0';
    return out;
}

/* A statement from fmt with %s replaced in order by the given strings
 * (numbers are formatted by the caller). Fresh buffer, or NULL. */
static char *stmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *stmt(const char *fmt, ...)
{
    va_list ap;
    char *out;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !(out = malloc((size_t)n + 1)))
        return NULL;
    va_start(ap, fmt);
    vsnprintf(out, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return out;
}

/* The upsert takes the row over when its lease ended, with a new token. A
 * row that is already ours and live is adopted as it is (token kept,
 * lease only lengthened): an earlier try whose answer was lost took it,
 * or this statement is that late try and the owner holds the lock again.
 * `where` guards the whole statement (the gate, below). A waiter's upsert
 * sleeps in its `where` (GET_LOCK): its times are the wake's, SYSDATE(6)
 * (UTC: the session's time zone is set to it), and its condition reads
 * the one value the row would get, VALUES(locked_at). */
#define ENDED "lock_until <= " NOW
#define ENDED_WOKE "lock_until <= VALUES(locked_at)"
#define WOKE "SYSDATE(6)"
#define MINE "owner <=> VALUES(owner)"

/* The name's gate: a user-level lock named from the database, the table
 * and the lock name (64 bytes at most, the server's limit). */
static char *gate_of(const my_store *ms, const char *name_lit)
{
    return stmt("CONCAT('dlock:', SHA2(CONCAT(CAST(DATABASE() AS BINARY), "
                "X'00', %s, X'00', "
                "%s), 224))",
                ms->tl, name_lit);
}

/* A fair queue entry's own user lock: held by its waiter's connection,
 * so the entry dies with it. `seq` is an SQL expression. */
static char *entry_lock_of(const my_store *ms, const char *seq)
{
    return stmt("CONCAT('dlock-q:', SHA2(CONCAT(CAST(DATABASE() AS "
                "BINARY), X'00', %s, X'00', "
                "%s), 224))",
                ms->tl, seq);
}

static char *upsert(const my_store *ms, const dlock__lease *l,
                    const char *name, const char *owner, const char *holder,
                    const char *where, int woke)
{
    const char *now = woke ? WOKE : NOW;
    const char *e = woke ? ENDED_WOKE : ENDED;

    return stmt("INSERT INTO %s (name, owner, holder, holds, token, "
                "locked_at, lock_until) SELECT %s, %s, %s, 1, "
                "LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', "
                "%s)), %s, %s + INTERVAL %lld MICROSECOND FROM DUAL%s "
                "ON DUPLICATE KEY UPDATE "
                "holder = IF(%s, VALUES(holder), holder), "
                "holds = IF(%s, 1, holds), "
                "token = IF(%s, LAST_INSERT_ID(GREATEST(token + 1, "
                "VALUES(token))), IF(" MINE ", LAST_INSERT_ID(token), "
                "token)), "
                "locked_at = IF(%s, VALUES(locked_at), locked_at), "
                "owner = IF(%s, VALUES(owner), owner), "
                "lock_until = IF(%s, VALUES(lock_until), IF(" MINE
                ", GREATEST(lock_until, VALUES(lock_until)), lock_until))",
                ms->t, name, owner, holder, now, now, now,
                (long long)l->ttl_ms * 1000, where, e, e, e, e, e, e);
}

/* How a try treats the gate. */
enum { TRY_GATE, TRY_HELD, TRY_TAKEOVER, TRY_WAIT };

/* Drops what a lease without the lock keeps in the server (its gate, its
 * queue entry) and gives its connection back. */
static void let_go(my_store *ms, my_lease *sl)
{
    if (!sl->cn)
        return;
    if (sl->gated || sl->seq) {
        char *sql = sl->seq ? stmt("DELETE FROM %s WHERE seq = %lld; "
                                   "DO RELEASE_ALL_LOCKS()",
                                   ms->q, (long long)sl->seq)
                            : stmt("DO RELEASE_ALL_LOCKS()");
        /* on failure the connection closes, and the server lets go */
        if (!sql || query(ms, sl->cn, sql, dlock__now_ms() + ms->timeout_ms,
                          NULL, NULL, NULL, "leaving the wait") != DLOCK_OK)
            sl->cn->broken = 1;
        free(sql);
    }
    conn_put(ms, sl->cn);
    sl->cn = NULL;
    sl->gated = 0;
    sl->seq = 0;
}

/* An idle pinned connection that the server closed (restart, KILL,
 * wait_timeout) has something to read: it is dead, and its gate gone. */
static int pinned_alive(my_lease *sl)
{
    struct pollfd p;

    if (!sl->cn || sl->cn->broken)
        return 0;
    p.fd = mysql_get_socket(sl->cn->m);
    p.events = POLLIN;
    p.revents = 0;
    if (poll(&p, 1, 0) == 0)
        return 1;
    sl->cn->broken = 1;
    return 0;
}

/*
 * Acquire (CAP_NATIVE_WAIT): tries and, while l->deadline allows, waits
 * in the server. The first try is the upsert guarded by GET_LOCK(gate,
 * 0). After a busy try, every wait is one round trip in which the waiter
 * sleeps inside its try (TRY_WAIT): a SET of the wait's length (the
 * holder's lease left + 1 ms, or the caller's deadline if sooner; at most
 * MY_WAIT_SLICE_MS), then the upsert guarded by GET_LOCK(gate, that
 * length). The holder's release wakes it, and the same statement takes
 * the free row; only a wait that took nothing (or a long one) reads more
 * in a round trip of its own.
 */
/* Did the statement fail because the session went (killed, server
 * gone), rather than with an error of the statement itself? */
static int conn_lost(const my_conn *cn)
{
    unsigned e = mysql_errno(cn->m);

    return cn->broken || e == ER_CONNECTION_KILLED || e == ER_SERVER_SHUTDOWN;
}

static int my_acquire(void *st, dlock__lease *l, int64_t op_deadline)
{
    my_store *ms = st;
    my_lease *sl = l->priv;
    int fair = (l->flags & DLOCK_FAIR) != 0;
    char *name = hexlit(l->name, l->name_len);
    char *owner = hexlit(l->owner, strlen(l->owner));
    char *holder = hexlit(l->desc, strlen(l->desc));
    char *gate = name ? gate_of(ms, name) : NULL;
    int kind = TRY_GATE, seen_busy = 0, rc = DLOCK_OK, lost = 0;

    (void)op_deadline;
    if (!name || !owner || !holder || !gate) {
        rc = enomem();
        goto out;
    }
    for (int round = 0;; round++) {
        int64_t now = dlock__now_ms();
        int once = l->deadline <= now;
        int waits = kind == TRY_WAIT;
        int64_t wait_ms = once ? 0 : l->deadline - now;
        int64_t dl = now + ms->timeout_ms;
        char *sql, *where, *up, *del;
        uint64_t affected = 0, token = 0;
        MYSQL_RES *r = NULL;

        /* during a wait no statement runs past the caller's deadline */
        if (!once && l->deadline != DLOCK__FOREVER && dl > l->deadline + 10)
            dl = l->deadline + 10;
        if (wait_ms > MY_WAIT_SLICE_MS)
            wait_ms = MY_WAIT_SLICE_MS;
        if (!sl->cn) {
            rc = conn_get(ms, dl, &sl->cn);
            if (rc)
                break;
        }

        /* the try: one upsert; a fair waiter that wins also leaves its
         * queue entry, in the same round trip. A waiting try first sets
         * its gate and the wait's length (the holder's lease left + 1 ms;
         * a whole lease when the row is free but its gate taken: a woken
         * waiter is about to take it, and one that does not within a
         * lease, frozen in between, is passed by), and sleeps in the
         * upsert's GET_LOCK */
        if (waits)
            where = stmt(" WHERE GET_LOCK(@dlock_g, @dlock_w) = 1");
        else if (kind == TRY_HELD)
            where = stmt("%s", "");
        else
            where = stmt(" WHERE GET_LOCK(%s, 0) %s", gate,
                         kind == TRY_GATE ? "= 1" : "IS NOT NULL");
        up = where ? upsert(ms, l, name, owner, holder, where, waits) : NULL;
        del = sl->seq ? stmt("; DELETE FROM %s WHERE seq = %lld AND "
                             "ROW_COUNT() > 0",
                             ms->q, (long long)sl->seq)
                      : stmt("%s", "");
        if (!up || !del)
            sql = NULL;
        else if (!waits)
            sql = stmt("%s%s", up, del);
        else
            sql = stmt("SET time_zone = '+00:00', @dlock_t0 = " NOW ", "
                       "@dlock_g = %s, @dlock_w = LEAST(%lld.%03lld, "
                       "IFNULL((SELECT IF(owner IS NOT NULL, GREATEST("
                       "0.001, TIMESTAMPDIFF(MICROSECOND, " NOW ", "
                       "lock_until) / 1000000 + 0.001), %lld.%03lld) FROM "
                       "%s WHERE name = %s), %lld.%03lld)); %s%s",
                       gate, (long long)(wait_ms / 1000),
                       (long long)(wait_ms % 1000),
                       (long long)(l->ttl_ms / 1000),
                       (long long)(l->ttl_ms % 1000), ms->t, name,
                       (long long)(l->ttl_ms / 1000),
                       (long long)(l->ttl_ms % 1000), up, del);
        free(where);
        free(up);
        free(del);
        if (!sql) {
            rc = enomem();
            break;
        }
        int64_t sent = dlock__now_ms(), wdl = dl;
        if (waits) {
            /* the server answers by the wait's end; a frozen one is given
             * up at the caller's deadline */
            wdl = now + wait_ms + ms->timeout_ms;
            if (l->deadline != DLOCK__FOREVER && wdl > l->deadline + 10)
                wdl = l->deadline + 10;
        }
        rc = query_at(ms, sl->cn, sql, wdl, NULL, waits ? 1 : 0, &affected,
                      &token,
                      waits ? "waiting for the lock" : "taking the lock");
        int64_t answered = dlock__now_ms();
        free(sql);
        /* a try through GET_LOCK may hold the gate now (the row held by
         * one that lost its gate, or a deadlock after the wake): until
         * known, let_go() lets go of it */
        if (kind != TRY_HELD)
            sl->gated = 1;
        if (rc && mysql_errno(sl->cn->m) == ER_LOCK_DEADLOCK &&
            round < MY_DEADLOCK_RETRIES) {
            rc = DLOCK_OK; /* rolled back, nothing done: again */
            if (waits)
                kind = TRY_GATE; /* a held gate is only counted up */
            continue;
        }
        if (rc && waits && lost < MY_WAIT_RECONNECTS &&
            dlock__now_ms() < l->deadline && conn_lost(sl->cn)) {
            /* the sleeping session was killed (a DBA, a proxy, a server
             * restart): its gate place and queue entry went with it. Wait
             * on, on a new connection, behind those who waited meanwhile
             * (the upsert may have taken the row before the kill: the
             * next try adopts a row already ours) */
            lost++;
            sl->cn->broken = 1;
            conn_put(ms, sl->cn);
            sl->cn = NULL;
            sl->gated = 0;
            sl->seq = 0;
            rc = DLOCK_OK;
            kind = TRY_GATE;
            continue;
        }
        if (rc == DLOCK_OK && (affected == 1 || affected == 2)) {
            if (token == 0) {
                rc = dlock__err(DLOCK_EPROTO,
                                "mysql %s: the lock was taken but the "
                                "server sent no token (a trigger on %s?)",
                                ms->redacted, ms->t);
                break;
            }
            l->token = token;
            /* a waiting try's lease began when the server woke it, after
             * the send: a short wait counts from the send (a lease at
             * most a third short: the renewal comes that much sooner);
             * after a longer one the server says how long it slept (from
             * its SET, after the send, to the row's locked_at), in a
             * round trip of its own: nothing more on a short hand-off's
             * way */
            l->started = sent;
            if (waits && answered - sent > l->ttl_ms / 3) {
                /* our row only: taken over meanwhile (this process
                 * stopped past the lease), its locked_at is another
                 * holder's, and the send is the only start we know */
                char *rd = stmt("SELECT TIMESTAMPDIFF(MICROSECOND, "
                                "@dlock_t0, locked_at) FROM %s WHERE name "
                                "= %s AND owner = %s AND token = %llu",
                                ms->t, name, owner,
                                (unsigned long long)token);
                r = NULL;
                if (rd && query(ms, sl->cn, rd, dl, &r, NULL, NULL,
                                "taking the lock") == DLOCK_OK &&
                    col_ll(r, 0, 0) > 0)
                    l->started = sent + col_ll(r, 0, 0) / 1000;
                if (r)
                    mysql_free_result(r);
                free(rd);
            }
            sl->seq = 0;
            /* the gate is ours unless a stale holder kept it (takeover) */
            sl->gated = kind != TRY_TAKEOVER;
            if (kind == TRY_TAKEOVER) {
                r = NULL;
                char *chk = stmt("SELECT IS_USED_LOCK(%s) <=> "
                                 "CONNECTION_ID()",
                                 gate);
                if (chk && query(ms, sl->cn, chk, dl, &r, NULL, NULL,
                                 "taking the lock") == DLOCK_OK)
                    sl->gated = col_ll(r, 0, 0) == 1;
                if (r)
                    mysql_free_result(r);
                free(chk);
            }
            goto out; /* keeps sl->cn: the gate's connection */
        }
        if (rc)
            break;
        seen_busy = 1;

        if (!waits) {
            /* held: wait in the server. A fair waiter first joins the
             * queue inspect() lists: an entry alive while this
             * connection holds its own lock */
            if (once)
                break;
            if (fair && !sl->seq) {
                char *lock = entry_lock_of(ms, "LAST_INSERT_ID()");
                char *join = lock ? stmt("INSERT INTO %s (name, holder, "
                                         "alive_until) VALUES (%s, %s, " NOW
                                         "); DO GET_LOCK(%s, 0)",
                                         ms->q, name, holder, lock)
                                  : NULL;
                uint64_t id = 0;
                free(lock);
                rc = join ? query(ms, sl->cn, join, dl, NULL, NULL, &id,
                                  "joining the queue")
                          : enomem();
                free(join);
                if (rc)
                    break;
                sl->seq = (int64_t)id;
            }
            kind = TRY_WAIT;
            continue;
        }
        /* nothing taken: whether the wake gave us the gate, and the
         * lease left (unknown gate: let_go() lets go of it) */
        if (dlock__now_ms() >= l->deadline) {
            rc = DLOCK_EBUSY;
            break;
        }
        char *rd = stmt("SELECT IS_USED_LOCK(@dlock_g) <=> CONNECTION_ID(), "
                        "(SELECT TIMESTAMPDIFF(MICROSECOND, SYSDATE(6), "
                        "lock_until) DIV 1000 + 1 FROM %s WHERE name = %s)",
                        ms->t, name);
        rc = rd ? query(ms, sl->cn, rd, dl, &r, NULL, NULL,
                        "waiting for the lock")
                : enomem();
        free(rd);
        if (rc) {
            if (r)
                mysql_free_result(r);
            break;
        }
        int gated = col_ll(r, 0, 0) == 1;
        long long left = col_ll(r, 1, -1);
        if (r)
            mysql_free_result(r);
        sl->gated = gated;
        l->retry_ms = left > 0 ? left : 1;
        if (dlock__now_ms() >= l->deadline) {
            rc = DLOCK_EBUSY;
            break;
        }
        if (gated) {
            /* we hold the gate, yet the row is held: its holder lost its
             * gate (its connection died) and keeps the lease. Nobody can
             * wake us: sleep to its lease end (or our deadline), watching
             * the connection */
            int64_t until = dlock__now_ms() + (left > 0 ? left : 1);
            if (until > l->deadline)
                until = l->deadline;
            struct pollfd p = {mysql_get_socket(sl->cn->m), POLLIN, 0};
            int64_t ms_left = until - dlock__now_ms();
            if (ms_left > 0 &&
                poll(&p, 1, ms_left > 60000 ? 60000 : (int)ms_left) > 0) {
                sl->cn->broken = 1; /* the server closed it */
                conn_put(ms, sl->cn);
                sl->cn = NULL;
                sl->gated = 0;
                sl->seq = 0;
            }
            kind = sl->cn ? TRY_HELD : TRY_GATE;
            continue;
        }
        /* woken by nothing: the wait ran to the holder's lease end (or
         * its slice, or GET_LOCK failed); a lease that ended is taken
         * without the gate if a frozen holder keeps it */
        kind = TRY_TAKEOVER;
    }
    if (rc && sl->cn && sl->cn->broken) {
        /* the server let go of our gate and entry with the connection */
        conn_put(ms, sl->cn);
        sl->cn = NULL;
        sl->gated = 0;
        sl->seq = 0;
    }
    if (rc && rc != DLOCK_EBUSY && seen_busy && l->deadline != DLOCK__FOREVER &&
        dlock__now_ms() >= l->deadline)
        rc = dlock__err(DLOCK_EBUSY,
                        "lock '%.200s' was held by another owner, and not "
                        "acquired within the wait (the last statement did "
                        "not finish before the deadline)",
                        l->name);
    if (rc == DLOCK_OK)
        rc = DLOCK_EBUSY;
    let_go(ms, sl);
out:
    free(gate);
    free(name);
    free(owner);
    free(holder);
    return rc;
}

/* UPDATE guarded by owner and token, then `after` in the same round
 * trip: DLOCK_OK, ENOTHELD, or an error. On the hold's own connection
 * when it is alive, else on a pooled one. */
static int guarded(my_store *ms, dlock__lease *l, const char *set,
                   const char *after, int64_t op_deadline, const char *what)
{
    my_lease *sl = l->priv;
    char *name = hexlit(l->name, l->name_len);
    char *owner = hexlit(l->owner, strlen(l->owner));
    int pinned = pinned_alive(sl);
    char *sql = name && owner
                    ? stmt("UPDATE %s SET %s WHERE name = %s AND owner = %s "
                           "AND token = %llu AND lock_until > " NOW "%s%s",
                           ms->t, set, name, owner,
                           (unsigned long long)l->token,
                           pinned && after ? "; " : "",
                           pinned && after ? after : "")
                    : NULL;
    uint64_t affected = 0;
    int rc;

    if (!sql)
        rc = enomem();
    else if (pinned)
        rc = query(ms, sl->cn, sql, op_deadline, NULL, &affected, NULL, what);
    else
        rc = query_pooled(ms, sql, op_deadline, NULL, &affected, NULL, what);
    free(sql);
    free(name);
    free(owner);
    if (rc)
        return rc;
    return affected == 1 ? DLOCK_OK
                         : dlock__err(DLOCK_ENOTHELD,
                                      "mysql %s: the lock row is no longer "
                                      "ours (expired or taken over)",
                                      ms->redacted);
}

static int my_release(void *st, dlock__lease *l, int64_t op_deadline)
{
    my_store *ms = st;
    my_lease *sl = l->priv;
    /* the row first, then the gate: the waiter it wakes finds it free */
    int rc = guarded(ms, l,
                     "owner = NULL, holder = NULL, holds = 0, lock_until = " NOW,
                     "DO RELEASE_ALL_LOCKS()", op_deadline,
                     "releasing the lock");

    if (sl->cn) {
        if (rc != DLOCK_OK && rc != DLOCK_ENOTHELD)
            sl->cn->broken = 1; /* closing it lets go of the gate */
        conn_put(ms, sl->cn);
        sl->cn = NULL;
        sl->gated = 0;
    }
    return rc;
}

static int my_extend(void *st, dlock__lease *l, int64_t ttl_ms,
                     int64_t op_deadline)
{
    char set[96];

    snprintf(set, sizeof(set),
             "lock_until = " NOW " + INTERVAL %lld MICROSECOND",
             (long long)ttl_ms * 1000);
    return guarded(st, l, set, NULL, op_deadline, "extending the lease");
}

static int my_inspect(void *st, const char *name, size_t len,
                      dlock_info *out, int64_t op_deadline)
{
    my_store *ms = st;
    char *hn = hexlit(name, len), *sql;
    MYSQL_RES *r = NULL;
    MYSQL_ROW row;
    int rc;

    if (!hn)
        return enomem();
    sql = stmt("SELECT owner IS NOT NULL AND lock_until > " NOW ", holder, "
               "token, TIMESTAMPDIFF(MICROSECOND, " NOW ", lock_until) DIV "
               "1000, TIMESTAMPDIFF(MICROSECOND, locked_at, " NOW ") DIV "
               "1000 FROM %s WHERE name = %s",
               ms->t, hn);
    rc = sql ? query_pooled(ms, sql, op_deadline, &r, NULL, NULL,
                            "reading the lock")
             : enomem();
    free(sql);
    if (rc == DLOCK_OK && r && (row = mysql_fetch_row(r)) != NULL) {
        out->token = row[2] ? strtoull(row[2], NULL, 10) : 0;
        if (row[0] && !strcmp(row[0], "1")) {
            out->held = 1;
            snprintf(out->holder, sizeof(out->holder), "%s",
                     row[1] ? row[1] : "");
            out->ttl_ms = row[3] ? strtoll(row[3], NULL, 10) : -1;
            out->held_ms = row[4] ? strtoll(row[4], NULL, 10) : -1;
        }
    }
    if (r)
        mysql_free_result(r);
    r = NULL;
    if (rc == DLOCK_OK) {
        char *lock = entry_lock_of(ms, "seq");
        sql = lock ? stmt("SELECT holder FROM %s WHERE name = %s AND "
                          "IS_USED_LOCK(%s) IS NOT NULL ORDER BY seq",
                          ms->q, hn, lock)
                   : NULL;
        free(lock);
        rc = sql ? query_pooled(ms, sql, op_deadline, &r, NULL, NULL,
                                "reading the queue")
                 : enomem();
        free(sql);
        while (rc == DLOCK_OK && r && (row = mysql_fetch_row(r)) != NULL)
            rc = dlock__info_add_waiter(out, row[0] ? row[0] : "");
        out->waiters = (int64_t)out->queue_len;
        if (r)
            mysql_free_result(r);
    }
    free(hn);
    return rc;
}

static int my_gc(void *st, int64_t idle_ms, uint64_t *removed,
                 int64_t op_deadline)
{
    my_store *ms = st;
    char *sql = stmt("DELETE FROM %s WHERE lock_until <= " NOW
                     " - INTERVAL %lld MICROSECOND",
                     ms->t, (long long)idle_ms * 1000);
    uint64_t n = 0;
    int rc = sql ? query_pooled(ms, sql, op_deadline, NULL, &n, NULL,
                                "removing unused locks")
                 : enomem();

    free(sql);
    *removed = rc == DLOCK_OK ? n : 0;
    if (rc == DLOCK_OK) {
        /* an entry is alive while its waiter's connection holds its
         * lock; one written in the last second may not hold it yet (the
         * same round trip takes it) */
        char *lock = entry_lock_of(ms, "seq");
        sql = lock ? stmt("DELETE FROM %s WHERE alive_until <= " NOW
                          " - INTERVAL 1 SECOND AND IS_USED_LOCK(%s) IS "
                          "NULL",
                          ms->q, lock)
                   : NULL;
        free(lock);
        rc = sql ? query_pooled(ms, sql, op_deadline, NULL, NULL, NULL,
                                "removing dead queue entries")
                 : enomem();
        free(sql);
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Open and close                                                           */
/* ------------------------------------------------------------------------ */

static void wipe_free(char *s)
{
    if (s) {
        dlock__wipe(s, strlen(s));
        free(s);
    }
}

static void my_close(void *st)
{
    my_store *ms = st;

    if (!ms)
        return;
    while (ms->idle) {
        my_conn *cn = ms->idle;
        ms->idle = cn->next;
        conn_free(cn);
    }
    free(ms->host);
    free(ms->user);
    wipe_free(ms->password);
    free(ms->db);
    free(ms->ssl_ca);
    free(ms->ssl_cert);
    free(ms->ssl_key);
    pthread_mutex_destroy(&ms->mu);
    free(ms->tl);
    free(ms->redacted);
    free(ms);
}

static pthread_once_t library_once = PTHREAD_ONCE_INIT;

static void library_init(void)
{
    /* not thread-safe in Connector/C: once per process, before any
     * connection (mysql_init would otherwise do it on first use) */
    mysql_library_init(0, NULL, NULL);
}

static char *dup_or_null(const char *s, int *oom)
{
    char *d = s ? strdup(s) : NULL;
    if (s && !d)
        *oom = 1;
    return d;
}

/* Creates the tables when missing (existing ones need no CREATE right). */
static int ensure_schema(my_store *ms, my_conn *cn, int64_t deadline)
{
    char qn[MY_TABLE_MAX + 8];
    MYSQL_RES *r = NULL;
    int rc;

    snprintf(qn, sizeof(qn), "%s_queue", ms->table);
    char *tl = hexlit(ms->table, strlen(ms->table));
    char *ql = hexlit(qn, strlen(qn));
    char *sql = tl && ql ? stmt("SELECT COUNT(*) FROM information_schema."
                                "tables WHERE table_schema = DATABASE() AND "
                                "table_name IN (CONVERT(%s USING utf8mb4), "
                                "CONVERT(%s USING utf8mb4))",
                                tl, ql)
                         : NULL;
    free(tl);
    free(ql);
    rc = sql ? query(ms, cn, sql, deadline, &r, NULL, NULL,
                     "looking for the lock table")
             : enomem();
    free(sql);
    long long present = rc == DLOCK_OK ? col_ll(r, 0, 0) : 0;
    if (r)
        mysql_free_result(r);
    if (rc || present == 2)
        return rc;
    sql = stmt("CREATE TABLE IF NOT EXISTS %s ("
               " name VARBINARY(%d) NOT NULL PRIMARY KEY,"
               " owner VARBINARY(80) NULL,"
               " holder VARBINARY(255) NULL,"
               " holds INT NOT NULL DEFAULT 0,"
               " token BIGINT UNSIGNED NOT NULL DEFAULT 0,"
               " locked_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00',"
               " lock_until DATETIME(6) NOT NULL DEFAULT '1970-01-01 "
               "00:00:00') ENGINE=InnoDB",
               ms->t, DLOCK_NAME_MAX);
    rc = sql ? query(ms, cn, sql, deadline, NULL, NULL, NULL,
                     "creating the lock table")
             : enomem();
    free(sql);
    if (rc == DLOCK_OK) {
        sql = stmt("CREATE TABLE IF NOT EXISTS %s ("
                   " seq BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,"
                   " name VARBINARY(%d) NOT NULL,"
                   " holder VARBINARY(255) NULL,"
                   " alive_until DATETIME(6) NOT NULL,"
                   " KEY name_seq (name, seq)) ENGINE=InnoDB",
                   ms->q, DLOCK_NAME_MAX);
        rc = sql ? query(ms, cn, sql, deadline, NULL, NULL, NULL,
                         "creating the queue table")
                 : enomem();
        free(sql);
    }
    if (rc == DLOCK_EAUTH)
        return dlock__err(DLOCK_EAUTH,
                          "mysql %s: cannot create the lock table %s (no "
                          "CREATE right): create it once with the DDL in "
                          "docs/stores.md, then grant SELECT, INSERT, "
                          "UPDATE, DELETE on it",
                          ms->redacted, ms->t);
    return rc;
}

static int my_open(void **out, dlock_client *c, const dlock__uri *u,
                   int64_t timeout_ms)
{
    static const char *const params[] = {"table",    "timeout", "ssl_mode",
                                         "ssl_ca",   "ssl_cert", "ssl_key",
                                         NULL};
    const char *table = dlock__uri_param(u, "table");
    const char *timeout = dlock__uri_param(u, "timeout");
    const char *mode = dlock__uri_param(u, "ssl_mode");
    my_store *ms;
    my_conn *cn;
    int rc, oom = 0;

    (void)c;
    rc = dlock__uri_check_params(u, params);
    if (rc)
        return rc;
    if (u->nhosts != 1 || u->path[0] != '/' || u->path[1] == '\0' ||
        strchr(u->path + 1, '/'))
        return dlock__err(DLOCK_EINVAL, "mysql URI %s: expected "
                                        "mysql://[user:password@]host[:port]"
                                        "/database (one host)",
                          u->redacted);
    if (!table)
        table = MY_DEFAULT_TABLE;
    if (!table[0] || strlen(table) > MY_TABLE_MAX)
        return dlock__err(DLOCK_EINVAL, "mysql URI %s: the table name must "
                                        "be 1 to %d bytes",
                          u->redacted, MY_TABLE_MAX);
    if (mode && strcmp(mode, "disabled") && strcmp(mode, "required") &&
        strcmp(mode, "verify_identity"))
        return dlock__err(DLOCK_EINVAL, "mysql URI %s: ssl_mode must be "
                                        "disabled, required or "
                                        "verify_identity, not '%s'",
                          u->redacted, mode);
    if (timeout) {
        long long v;
        if (dlock__parse_int(timeout, 3600000, &v) != 0 || v == 0)
            return dlock__err(DLOCK_EINVAL, "mysql URI %s: timeout must be "
                                            "milliseconds (1..3600000), not "
                                            "'%s'",
                              u->redacted, timeout);
        timeout_ms = v;
    }
    pthread_once(&library_once, library_init);
    ms = calloc(1, sizeof(*ms));
    if (!ms || !(ms->redacted = strdup(u->redacted))) {
        free(ms);
        return enomem();
    }
    pthread_mutex_init(&ms->mu, NULL);
    ms->timeout_ms = timeout_ms;
    ms->port = u->hosts[0].port ? (unsigned)u->hosts[0].port : 3306;
    ms->host = dup_or_null(u->hosts[0].host, &oom);
    ms->user = dup_or_null(u->user, &oom);
    ms->password = dup_or_null(u->password, &oom);
    ms->db = dup_or_null(u->path + 1, &oom);
    ms->ssl_ca = dup_or_null(dlock__uri_param(u, "ssl_ca"), &oom);
    ms->ssl_cert = dup_or_null(dlock__uri_param(u, "ssl_cert"), &oom);
    ms->ssl_key = dup_or_null(dlock__uri_param(u, "ssl_key"), &oom);
    ms->ssl_enforce = mode && strcmp(mode, "disabled") != 0;
    ms->ssl_verify = mode && !strcmp(mode, "verify_identity");
    if (oom) {
        my_close(ms);
        return enomem();
    }
    snprintf(ms->table, sizeof(ms->table), "%s", table);
    if (!(ms->tl = hexlit(table, strlen(table)))) {
        my_close(ms);
        return enomem();
    }
    quote_ident(table, "", ms->t, sizeof(ms->t));
    quote_ident(table, "_queue", ms->q, sizeof(ms->q));

    int64_t deadline = dlock__now_ms() + timeout_ms;
    rc = conn_open(ms, deadline, &cn);
    if (rc) {
        my_close(ms);
        return rc;
    }
    rc = ensure_schema(ms, cn, deadline);
    conn_put(ms, cn);
    if (rc) {
        my_close(ms);
        return rc;
    }
    *out = ms;
    return DLOCK_OK;
}

const dlock__backend dlock__backend_mysql = {
    "mysql",                                        /* name */
    DLOCK__CAP_LEASE | DLOCK__CAP_NATIVE_WAIT,      /* caps */
    sizeof(my_lease),                               /* lease_size */
    my_open,                                        /* open */
    my_close,                                       /* close */
    my_acquire,                                     /* acquire */
    NULL,                                           /* arm */
    NULL,                                           /* disarm */
    my_release,       /* release */
    my_extend,        /* extend */
    my_inspect,       /* inspect */
    NULL,             /* loop_fd */
    NULL,             /* loop_run */
    my_gc,            /* gc */
    NULL,             /* select */
    NULL,             /* margin */
    NULL, /* abandon */
    NULL, /* extend_many */
};
