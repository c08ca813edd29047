/*
 * sqlite.c -- the SQLite store: the seeds' database lock table, in one
 * database file shared by the processes of one host.
 *
 *  - One row per lock name in table T (default dlock_locks): owner,
 *    holder description, hold count, fencing token, locked_at and
 *    lock_until (milliseconds of SQLite's own clock). Rows are never
 *    deleted on release, so the token counter survives it.
 *  - Acquire is one statement: an upsert that inserts the row, or takes it
 *    over only when its lease has ended (released rows have lock_until 0),
 *    raising the token, RETURNING it. No row back = busy. A token is
 *    max(previous + 1, SQLite's clock in µs): it grows per name, and a
 *    name whose row dlock_gc() removed starts again above its old tokens.
 *  - Release and extend are one UPDATE each, guarded by owner and token.
 *  - Fair mode: waiters join T_queue (an AUTOINCREMENT sequence, so a
 *    later waiter always has a higher number) and refresh their entry on
 *    every try; the upsert then also requires that no live entry with a
 *    lower number exists. A waiter that dies stops refreshing and drops
 *    out after SQ_QUEUE_ALIVE_MS (3 s).
 *  - Waiting: a release wakes waiters of the same client at once (the
 *    core does that). Waiters in other processes poll with a backoff from
 *    2 ms doubling up to 100 ms, never past the holder's lease end: SQLite
 *    has no way to notify another process.
 *  - One connection per client, WAL journal, busy timeout = the client's
 *    timeout; a mutex serialises the client's threads on it.
 */
#include "../core/internal.h"

#include <sqlite3.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SQ_DEFAULT_TABLE "dlock_locks"
#define SQ_TABLE_MAX 128
#define SQ_POLL_MIN_MS 2
#define SQ_POLL_MAX_MS 100
#define SQ_QUEUE_ALIVE_MS 3000 /* a fair waiter silent this long is gone */

/* SQLite's clock, in milliseconds and microseconds since the epoch */
#define NOW_MS "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
#define NOW_US                                                              \
    "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"

enum {
    S_ACQUIRE,
    S_ACQUIRE_FAIR,
    S_LEASE_LEFT,
    S_RELEASE,
    S_EXTEND,
    S_INSPECT,
    S_QUEUE,
    S_JOIN,
    S_REFRESH,
    S_LEAVE,
    S_GC,
    S_GC_QUEUE,
    S_COUNT
};

typedef struct sq_store {
    sqlite3 *db;
    char *redacted;
    int64_t timeout_ms;
    pthread_mutex_t mu;
    sqlite3_stmt *st[S_COUNT];
} sq_store;

typedef struct sq_lease {
    int64_t seq;     /* fair queue entry, 0 when none */
    int64_t backoff; /* next poll interval */
} sq_lease;

static int sq_error(sq_store *ss, const char *what)
{
    int ec = sqlite3_extended_errcode(ss->db);
    int code = (ec & 0xff) == SQLITE_BUSY || (ec & 0xff) == SQLITE_LOCKED
                   ? DLOCK_ECONN
               : (ec & 0xff) == SQLITE_NOMEM ? DLOCK_ENOMEM
               : (ec & 0xff) == SQLITE_PERM || (ec & 0xff) == SQLITE_AUTH ||
                       (ec & 0xff) == SQLITE_READONLY ||
                       (ec & 0xff) == SQLITE_CANTOPEN
                   ? DLOCK_EAUTH
                   : DLOCK_EPROTO;
    return dlock__err(code, "sqlite %s: %s: %s", ss->redacted, what,
                      sqlite3_errmsg(ss->db));
}

/* "name" with embedded quotes doubled: any table name is one identifier. */
static void quote_ident(const char *in, char *out, size_t cap)
{
    size_t o = 0;

    out[o++] = '"';
    for (; *in && o + 3 < cap; in++) {
        if (*in == '"')
            out[o++] = '"';
        out[o++] = *in;
    }
    out[o++] = '"';
    out[o] = '\0';
}

static void sq_close(void *st)
{
    sq_store *ss = st;

    if (!ss)
        return;
    for (int i = 0; i < S_COUNT; i++)
        sqlite3_finalize(ss->st[i]);
    sqlite3_close(ss->db);
    pthread_mutex_destroy(&ss->mu);
    free(ss->redacted);
    free(ss);
}

static int prepare(sq_store *ss, int which, const char *fmt, const char *t,
                   const char *q)
{
    char sql[4096];

    /* every %1$s is the table, %2$s the queue table, %3$s the clock */
    snprintf(sql, sizeof(sql), fmt, t, q, NOW_MS);
    if (sqlite3_prepare_v3(ss->db, sql, -1, SQLITE_PREPARE_PERSISTENT,
                           &ss->st[which], NULL) != SQLITE_OK)
        return sq_error(ss, "preparing a statement");
    return DLOCK_OK;
}

static int sq_open(void **out, dlock_client *c, const dlock__uri *u,
                   int64_t timeout_ms)
{
    static const char *const params[] = {"table", "timeout", NULL};
    const char *table = dlock__uri_param(u, "table");
    const char *timeout = dlock__uri_param(u, "timeout");
    char t[2 * SQ_TABLE_MAX + 8], q[2 * SQ_TABLE_MAX + 16], qn[SQ_TABLE_MAX + 8];
    char ddl[2048];
    sq_store *ss;
    int rc;

    (void)c;
    rc = dlock__uri_check_params(u, params);
    if (rc)
        return rc;
    if (u->nhosts != 0 || u->user || u->path[0] != '/' || u->path[1] == '\0')
        return dlock__err(DLOCK_EINVAL, "sqlite URI %s: expected "
                                        "sqlite:///path/to/file.db "
                                        "(three slashes, no host)",
                          u->redacted);
    if (!table)
        table = SQ_DEFAULT_TABLE;
    if (!table[0] || strlen(table) > SQ_TABLE_MAX)
        return dlock__err(DLOCK_EINVAL, "sqlite URI %s: the table name must "
                                        "be 1 to %d bytes",
                          u->redacted, SQ_TABLE_MAX);
    if (timeout) {
        long long v;
        if (dlock__parse_int(timeout, 3600000, &v) != 0 || v == 0)
            return dlock__err(DLOCK_EINVAL, "sqlite URI %s: timeout must be "
                                            "milliseconds (1..3600000), not "
                                            "'%s'",
                              u->redacted, timeout);
        timeout_ms = v;
    }
    ss = calloc(1, sizeof(*ss));
    if (!ss || !(ss->redacted = strdup(u->redacted))) {
        free(ss);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&ss->mu, NULL);
    ss->timeout_ms = timeout_ms;
    if (sqlite3_open_v2(u->path, &ss->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                            SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE,
                        NULL) != SQLITE_OK) {
        rc = ss->db ? sq_error(ss, "opening the database")
                    : dlock__err(DLOCK_ENOMEM, "out of memory");
        sq_close(ss);
        return rc;
    }
    sqlite3_busy_timeout(ss->db, (int)timeout_ms);
    quote_ident(table, t, sizeof(t));
    snprintf(qn, sizeof(qn), "%s_queue", table);
    quote_ident(qn, q, sizeof(q));
    snprintf(ddl, sizeof(ddl),
             "PRAGMA journal_mode=WAL;"
             "CREATE TABLE IF NOT EXISTS %s ("
             " name BLOB PRIMARY KEY,"
             " owner TEXT,"
             " holder TEXT,"
             " holds INTEGER NOT NULL DEFAULT 0,"
             " token INTEGER NOT NULL DEFAULT 0,"
             " locked_at INTEGER NOT NULL DEFAULT 0,"
             " lock_until INTEGER NOT NULL DEFAULT 0);"
             "CREATE TABLE IF NOT EXISTS %s ("
             " seq INTEGER PRIMARY KEY AUTOINCREMENT,"
             " name BLOB NOT NULL,"
             " holder TEXT,"
             " alive_until INTEGER NOT NULL);",
             t, q);
    /* Clients opening a new database at the same moment: SQLite answers
     * SQLITE_BUSY at once, without its busy handler, to the connection
     * whose lock upgrade would deadlock with another's (the WAL switch,
     * the first CREATE TABLE), and the remedy is to run the statement
     * again. Bounded by the client's timeout (both statements are no-ops
     * once done). */
    int64_t ddl_end = dlock__now_ms() + timeout_ms;
    int erc;
    for (int i = 0; i < 10000; i++) {
        erc = sqlite3_exec(ss->db, ddl, NULL, NULL, NULL);
        if ((erc & 0xff) != SQLITE_BUSY || dlock__now_ms() >= ddl_end)
            break;
        sqlite3_sleep(1 + i % 8);
    }
    if (erc != SQLITE_OK) {
        rc = sq_error(ss, "creating the lock table");
        sq_close(ss);
        return rc;
    }
    /* ?1 name, ?2 owner, ?3 ttl, ?4 holder, ?5 our queue number */
    static const char upsert[] =
        "INSERT INTO %1$s (name, owner, holder, holds, token, locked_at, "
        "lock_until) VALUES (?1, ?2, ?4, 1, " NOW_US ", %3$s, %3$s + ?3) "
        "ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, "
        "holder = excluded.holder, holds = 1, token = max(token + 1, "
        NOW_US "), "
        "locked_at = excluded.locked_at, lock_until = excluded.lock_until "
        "WHERE lock_until <= %3$s";
    char fair[4096], plain[4096];
    snprintf(plain, sizeof(plain), "%s RETURNING token", upsert);
    snprintf(fair, sizeof(fair),
             "%s AND NOT EXISTS (SELECT 1 FROM %%2$s WHERE name = ?1 AND "
             "alive_until > %%3$s AND seq < ?5) RETURNING token",
             upsert);
    if ((rc = prepare(ss, S_ACQUIRE, plain, t, q)) ||
        (rc = prepare(ss, S_ACQUIRE_FAIR, fair, t, q)) ||
        (rc = prepare(ss, S_LEASE_LEFT,
                      "SELECT lock_until - %3$s FROM %1$s WHERE name = ?1",
                      t, q)) ||
        (rc = prepare(ss, S_RELEASE,
                      "UPDATE %1$s SET owner = NULL, holder = NULL, holds = "
                      "0, lock_until = 0 WHERE name = ?1 AND owner = ?2 AND "
                      "token = ?3 AND lock_until > %3$s",
                      t, q)) ||
        (rc = prepare(ss, S_EXTEND,
                      "UPDATE %1$s SET lock_until = %3$s + ?4 WHERE name = "
                      "?1 AND owner = ?2 AND token = ?3 AND lock_until > "
                      "%3$s",
                      t, q)) ||
        (rc = prepare(ss, S_INSPECT,
                      "SELECT lock_until > %3$s, holder, token, "
                      "lock_until - %3$s, %3$s - locked_at FROM %1$s WHERE "
                      "name = ?1",
                      t, q)) ||
        (rc = prepare(ss, S_QUEUE,
                      "SELECT holder FROM %2$s WHERE name = ?1 AND "
                      "alive_until > %3$s ORDER BY seq",
                      t, q)) ||
        (rc = prepare(ss, S_JOIN,
                      "INSERT INTO %2$s (name, holder, alive_until) VALUES "
                      "(?1, ?2, %3$s + ?3) RETURNING seq",
                      t, q)) ||
        (rc = prepare(ss, S_REFRESH,
                      "UPDATE %2$s SET alive_until = %3$s + ?2 WHERE seq = "
                      "?1",
                      t, q)) ||
        (rc = prepare(ss, S_LEAVE,
                      "DELETE FROM %2$s WHERE seq = ?1 OR alive_until < %3$s "
                      "- 60000",
                      t, q)) ||
        (rc = prepare(ss, S_GC,
                      "DELETE FROM %1$s WHERE lock_until <= %3$s AND "
                      "locked_at <= %3$s - ?1",
                      t, q)) ||
        (rc = prepare(ss, S_GC_QUEUE,
                      "DELETE FROM %2$s WHERE alive_until <= %3$s", t, q))) {
        sq_close(ss);
        return rc;
    }
    *out = ss;
    return DLOCK_OK;
}

/* Runs a prepared statement to its first row (SQLITE_ROW), or to the end
 * (SQLITE_DONE). Leaves it reset-able by the caller. */
static int step(sq_store *ss, int which, int *row, const char *what)
{
    int r = sqlite3_step(ss->st[which]);

    if (r == SQLITE_ROW || r == SQLITE_DONE) {
        *row = r == SQLITE_ROW;
        return DLOCK_OK;
    }
    return sq_error(ss, what);
}

static void done(sq_store *ss, int which)
{
    sqlite3_reset(ss->st[which]);
    sqlite3_clear_bindings(ss->st[which]);
}

static int sq_acquire(void *st, dlock__lease *l, int64_t op_deadline)
{
    sq_store *ss = st;
    sq_lease *sl = l->priv;
    int fair = (l->flags & DLOCK_FAIR) != 0;
    int which = fair ? S_ACQUIRE_FAIR : S_ACQUIRE;
    sqlite3_stmt *s = ss->st[which];
    int rc, row = 0;

    (void)op_deadline;
    pthread_mutex_lock(&ss->mu);
    if (fair && sl->seq) {
        sqlite3_bind_int64(ss->st[S_REFRESH], 1, sl->seq);
        sqlite3_bind_int64(ss->st[S_REFRESH], 2, SQ_QUEUE_ALIVE_MS);
        rc = step(ss, S_REFRESH, &row, "refreshing the queue entry");
        done(ss, S_REFRESH);
        if (rc) {
            pthread_mutex_unlock(&ss->mu);
            return rc;
        }
    }
    sqlite3_bind_blob(s, 1, l->name, (int)l->name_len, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, l->owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, l->ttl_ms);
    sqlite3_bind_text(s, 4, l->desc, -1, SQLITE_STATIC);
    if (fair)
        sqlite3_bind_int64(s, 5, sl->seq ? sl->seq : INT64_MAX);
    rc = step(ss, which, &row, "taking the lock");
    if (rc == DLOCK_OK && row)
        l->token = (uint64_t)sqlite3_column_int64(s, 0);
    done(ss, which);
    if (rc == DLOCK_OK && !row) {
        int64_t left = 0;
        sqlite3_bind_blob(ss->st[S_LEASE_LEFT], 1, l->name,
                          (int)l->name_len, SQLITE_STATIC);
        if (step(ss, S_LEASE_LEFT, &row, "reading the lease") == DLOCK_OK &&
            row)
            left = sqlite3_column_int64(ss->st[S_LEASE_LEFT], 0);
        done(ss, S_LEASE_LEFT);
        if (sl->backoff < SQ_POLL_MIN_MS)
            sl->backoff = SQ_POLL_MIN_MS;
        l->retry_ms = sl->backoff;
        if (left > 0 && left + 1 < l->retry_ms)
            l->retry_ms = left + 1;
        sl->backoff = sl->backoff * 2 > SQ_POLL_MAX_MS ? SQ_POLL_MAX_MS
                                                       : sl->backoff * 2;
        rc = DLOCK_EBUSY;
    }
    pthread_mutex_unlock(&ss->mu);
    return rc;
}

static int sq_arm(void *st, dlock__lease *l, int64_t op_deadline)
{
    sq_store *ss = st;
    sq_lease *sl = l->priv;
    int rc = DLOCK_OK, row = 0;

    (void)op_deadline;
    sl->backoff = SQ_POLL_MIN_MS;
    if (!(l->flags & DLOCK_FAIR) || sl->seq)
        return DLOCK_OK;
    pthread_mutex_lock(&ss->mu);
    sqlite3_stmt *s = ss->st[S_JOIN];
    sqlite3_bind_blob(s, 1, l->name, (int)l->name_len, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, l->desc, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, SQ_QUEUE_ALIVE_MS);
    rc = step(ss, S_JOIN, &row, "joining the queue");
    if (rc == DLOCK_OK && row)
        sl->seq = sqlite3_column_int64(s, 0);
    done(ss, S_JOIN);
    pthread_mutex_unlock(&ss->mu);
    return rc;
}

static void sq_disarm(void *st, dlock__lease *l, int acquired)
{
    sq_store *ss = st;
    sq_lease *sl = l->priv;
    int row;

    (void)acquired;
    if (!sl->seq)
        return;
    pthread_mutex_lock(&ss->mu);
    sqlite3_bind_int64(ss->st[S_LEAVE], 1, sl->seq);
    (void)step(ss, S_LEAVE, &row, "leaving the queue");
    done(ss, S_LEAVE);
    pthread_mutex_unlock(&ss->mu);
    sl->seq = 0;
}

/* UPDATE guarded by owner and token: DLOCK_OK, ENOTHELD, or an error. */
static int guarded(sq_store *ss, int which, const dlock__lease *l,
                   int64_t ttl_ms, const char *what)
{
    sqlite3_stmt *s = ss->st[which];
    int rc, row;

    pthread_mutex_lock(&ss->mu);
    sqlite3_bind_blob(s, 1, l->name, (int)l->name_len, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, l->owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, (int64_t)l->token);
    if (which == S_EXTEND)
        sqlite3_bind_int64(s, 4, ttl_ms);
    rc = step(ss, which, &row, what);
    int changed = sqlite3_changes(ss->db);
    done(ss, which);
    pthread_mutex_unlock(&ss->mu);
    if (rc)
        return rc;
    return changed == 1 ? DLOCK_OK
                        : dlock__err(DLOCK_ENOTHELD,
                                     "sqlite %s: the lock row is no longer "
                                     "ours (expired or taken over)",
                                     ss->redacted);
}

static int sq_release(void *st, dlock__lease *l, int64_t op_deadline)
{
    (void)op_deadline;
    return guarded(st, S_RELEASE, l, 0, "releasing the lock");
}

static int sq_extend(void *st, dlock__lease *l, int64_t ttl_ms,
                     int64_t op_deadline)
{
    (void)op_deadline;
    return guarded(st, S_EXTEND, l, ttl_ms, "extending the lease");
}

static int sq_inspect(void *st, const char *name, size_t len,
                      dlock_info *out, int64_t op_deadline)
{
    sq_store *ss = st;
    sqlite3_stmt *s = ss->st[S_INSPECT];
    int rc, row = 0;

    (void)op_deadline;
    out->ttl_ms = -1;
    out->held_ms = -1;
    pthread_mutex_lock(&ss->mu);
    sqlite3_bind_blob(s, 1, name, (int)len, SQLITE_STATIC);
    rc = step(ss, S_INSPECT, &row, "reading the lock");
    if (rc == DLOCK_OK && row) {
        out->token = (uint64_t)sqlite3_column_int64(s, 2);
        if (sqlite3_column_int(s, 0)) {
            const unsigned char *h = sqlite3_column_text(s, 1);
            out->held = 1;
            snprintf(out->holder, sizeof(out->holder), "%s",
                     h ? (const char *)h : "");
            out->ttl_ms = sqlite3_column_int64(s, 3);
            out->held_ms = sqlite3_column_int64(s, 4);
        }
    }
    done(ss, S_INSPECT);
    if (rc == DLOCK_OK) {
        sqlite3_stmt *q = ss->st[S_QUEUE];
        sqlite3_bind_blob(q, 1, name, (int)len, SQLITE_STATIC);
        while ((row = sqlite3_step(q)) == SQLITE_ROW) {
            const unsigned char *h = sqlite3_column_text(q, 0);
            rc = dlock__info_add_waiter(out, h ? (const char *)h : "");
            if (rc)
                break;
        }
        if (rc == DLOCK_OK && row != SQLITE_DONE)
            rc = sq_error(ss, "reading the queue");
        done(ss, S_QUEUE);
        out->waiters = (int64_t)out->queue_len;
    }
    pthread_mutex_unlock(&ss->mu);
    return rc;
}

static int sq_gc(void *st, int64_t idle_ms, uint64_t *removed,
                 int64_t op_deadline)
{
    sq_store *ss = st;
    int rc, row;

    (void)op_deadline;
    pthread_mutex_lock(&ss->mu);
    sqlite3_bind_int64(ss->st[S_GC], 1, idle_ms);
    rc = step(ss, S_GC, &row, "removing unused locks");
    *removed = rc == DLOCK_OK ? (uint64_t)sqlite3_changes(ss->db) : 0;
    done(ss, S_GC);
    if (rc == DLOCK_OK) {
        rc = step(ss, S_GC_QUEUE, &row, "removing dead queue entries");
        done(ss, S_GC_QUEUE);
    }
    pthread_mutex_unlock(&ss->mu);
    return rc;
}

const dlock__backend dlock__backend_sqlite = {
    "sqlite",         /* name */
    DLOCK__CAP_LEASE, /* caps */
    sizeof(sq_lease), /* lease_size */
    sq_open,          /* open */
    sq_close,         /* close */
    sq_acquire,       /* acquire */
    sq_arm,           /* arm */
    sq_disarm,        /* disarm */
    sq_release,       /* release */
    sq_extend,        /* extend */
    sq_inspect,       /* inspect */
    NULL,             /* loop_fd */
    NULL,             /* loop_run */
    sq_gc,            /* gc */
    NULL, /* select */
    NULL, /* margin */
    NULL, /* abandon */
    NULL, /* extend_many */
};
