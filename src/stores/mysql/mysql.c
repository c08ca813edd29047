/* SPDX-License-Identifier: MIT */
/*
 * mysql.c -- the MySQL/MariaDB store (MariaDB Connector/C, which also
 * speaks to MySQL): the seeds' lock table. This file holds the backend's
 * release, extend and gc, open and close, and the backend; the
 * acquire and its waiting are in mysql_wait.c (the statements of one try
 * in mysql_try.c), inspect, list and break
 * in mysql_operate.c, the connections and the
 * statement runner in mysql_conn.c, the SQL texts and the schema in
 * mysql_sql.c (mysql_int.h).
 *
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
 *    taken over, 0 busy (in a wait, its LAST_INSERT_ID says who holds). The token is max(previous + 1, the server's clock
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
 *    row stays the truth for owner, lease and token: the gate only
 *    orders and wakes, and no take depends on holding it (any session of
 *    any account may take a user-level lock). A try takes the gate when
 *    it is free and the row when its lease ended, except a row released
 *    less than MY_GRACE_MS ago whose gate another session holds: the
 *    waiter the release woke is taking it. A waiter never sleeps past the
 *    holder's lease end (a frozen holder, or a foreign session, keeps the
 *    gate; the lease decides) nor its deadline, and ends with a try.
 *    Protocol and failure cases: docs/design.md, "Waiting in the server
 *    (MySQL)".
 *  - Fair mode: waiters are already served in order; a waiter also
 *    writes a T_queue entry for dlock_inspect(), alive while its
 *    connection holds the entry's own user lock (no heartbeats), which
 *    counts (keeps a fair try out) until its last wait's end + the grace.
 *  - Read holds and permits (mysql_rw.c): entries of a JSON column of
 *    the row, each with a user-level lock of its own that whoever waits
 *    for it sleeps on; docs/design.md, "Shared holds and permits".
 *  - Connections: a pool per client (up to MY_IDLE_MAX idle); a hold and
 *    a waiting acquire each keep one connection out of it (the gate's),
 *    so a client uses as many as it has holds and waiters at once. The
 *    non-blocking API of Connector/C, so every statement keeps the
 *    caller's deadline; READ COMMITTED (no gap locks between upserts); a
 *    deadlock victim is re-tried.
 */
#include "mysql_int.h"

#include "opt.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* UPDATE guarded by owner and token, then `after` in the same round
 * trip: DLOCK_OK, ENOTHELD, or an error. On the hold's own connection
 * when it is alive, else on a pooled one. A hold's connection killed
 * under the statement (a break kills the sessions of the holds it takes:
 * docs/design.md, "Breaking on MySQL / MariaDB") is no answer: the
 * UPDATE's own answer decides if it came, else the statement runs again
 * on a pooled connection (guarded, it matches only a hold still ours). */
static int guarded(my_store *ms, dlock__lease *l, const char *set,
                   const char *after, int64_t op_deadline, const char *what)
{
    my_lease *sl = l->priv;
    char *name = dlock__mysql_hexlit(l->name, l->name_len);
    char *owner = dlock__mysql_hexlit(l->owner, strlen(l->owner));
    int pinned = dlock__mysql_pinned_alive(sl);
    char *sql =
        name && owner
            ? dlock__mysql_stmt(
                  "UPDATE %s SET %s WHERE name = %s AND owner = %s "
                  "AND token = %llu AND lock_until > " NOW "%s%s",
                  ms->t, set, name, owner, (unsigned long long)l->token,
                  pinned && after ? "; " : "", pinned && after ? after : "")
            : NULL;
    uint64_t affected = 0;
    int rc;

    if (!sql)
        rc = dlock__mysql_enomem();
    else if (pinned)
        rc = dlock__mysql_query(ms, sl->cn, sql, op_deadline, NULL, &affected,
                                NULL, what);
    else
        rc = dlock__mysql_query_pooled(ms, sql, op_deadline, NULL, &affected,
                                       NULL, what);
    if (rc && pinned && dlock__mysql_killed(sl->cn)) {
        if (sl->cn->answered)
            rc = DLOCK_OK; /* the UPDATE answered: `affected` says */
        else
            rc = dlock__mysql_query_pooled(ms, sql, op_deadline, NULL,
                                           &affected, NULL, what);
    }
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

    if (l->kind != DLOCK__WRITE)
        return dlock__mysql_release_shared(ms, l, op_deadline);
    /* the row first, then the gate: the waiter it wakes finds it free */
    int rc = guarded(ms, l,
                     "owner = NULL, holder = NULL, holds = 0, lock_until = " NOW,
                     "DO RELEASE_ALL_LOCKS()", op_deadline,
                     "releasing the lock");

    if (sl->cn) {
        if (rc != DLOCK_OK && rc != DLOCK_ENOTHELD)
            sl->cn->broken = 1; /* closing it lets go of the gate */
        dlock__mysql_conn_put(ms, sl->cn);
        sl->cn = NULL;
        sl->gated = 0;
    }
    return rc;
}

static int my_extend(void *st, dlock__lease *l, int64_t ttl_ms,
                     int64_t op_deadline)
{
    char set[96];
    int rc;

    if (l->kind != DLOCK__WRITE)
        return dlock__mysql_extend_shared(st, l, ttl_ms, op_deadline);
    snprintf(set, sizeof(set),
             "lock_until = " NOW " + INTERVAL %lld MICROSECOND",
             (long long)ttl_ms * 1000);
    /* a hold taken while another session kept the gate (a frozen holder,
     * a foreign session: docs/design.md, "Waiting in the server") takes it
     * when it is free, so that its release wakes waiters again */
    char *gate = dlock__mysql_gate_lit(st, l->name, l->name_len);
    char *after = gate ? dlock__mysql_stmt("DO IF(ROW_COUNT() > 0 AND "
                                           "IS_FREE_LOCK(%s) = 1, "
                                           "GET_LOCK(%s, 0), 0)",
                                           gate, gate)
                       : NULL;
    free(gate);
    if (!after)
        return dlock__mysql_enomem();
    rc = guarded(st, l, set, after, op_deadline, "extending the lease");
    free(after);
    if (rc == DLOCK_ENOTHELD)
        dlock__mysql_let_go_lost(st, l->priv, op_deadline);
    return rc;
}

/* The lease to ttl_ms from now, then the hold's connection let go of
 * (its gate or hold lock released): a waiter it wakes finds the row held
 * and sleeps no longer than its lease (docs/design.md, "Waiting in the
 * server"). */
static int my_keep(void *st, dlock__lease *l, int64_t ttl_ms,
                   int64_t op_deadline)
{
    int rc = my_extend(st, l, ttl_ms, op_deadline);

    dlock__mysql_let_go_lost(st, l->priv, op_deadline);
    return rc;
}

static int my_gc(void *st, int64_t idle_ms, uint64_t *removed,
                 int64_t op_deadline)
{
    my_store *ms = st;
    char *sql = dlock__mysql_stmt("DELETE FROM %s WHERE lock_until <= " NOW
                                  " - INTERVAL %lld MICROSECOND",
                                  ms->t, (long long)idle_ms * 1000);
    uint64_t n = 0;
    int rc = sql ? dlock__mysql_query_pooled(ms, sql, op_deadline, NULL, &n,
                                             NULL, "removing unused locks")
                 : dlock__mysql_enomem();

    free(sql);
    *removed = rc == DLOCK_OK ? n : 0;
    if (rc == DLOCK_OK) {
        /* an entry is alive while its waiter's connection holds its
         * lock; one written in the last second may not hold it yet (the
         * same round trip takes it, in the statement that writes the end
         * of its wait, later than now, into alive_until) */
        char *lock = dlock__mysql_entry_lock_of(ms, "seq");
        sql = lock ? dlock__mysql_stmt(
                         "DELETE FROM %s WHERE (alive_until <= " NOW
                         " - INTERVAL 1 SECOND OR alive_until > " NOW ") "
                         "AND IS_USED_LOCK(%s) IS NULL",
                         ms->q, lock)
                   : NULL;
        free(lock);
        rc = sql ? dlock__mysql_query_pooled(ms, sql, op_deadline, NULL,
                                             NULL, NULL,
                                             "removing dead queue entries")
                 : dlock__mysql_enomem();
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
    void *idle[DLOCK__POOL_MAX];
    for (unsigned i = dlock__pool_drain(&ms->idle, idle); i > 0; i--)
        dlock__mysql_conn_free(idle[i - 1]);
    free(ms->host);
    free(ms->user);
    wipe_free(ms->password);
    free(ms->db);
    free(ms->ssl_ca);
    free(ms->ssl_cert);
    free(ms->ssl_key);
    pthread_mutex_destroy(&ms->mu);
    free(ms->tl);
    free(ms->dbname);
    for (int i = 0; i < MY_PS_N; i++)
        free(ms->tmpl[i]);
    free(ms->redacted);
    free(ms);
}

static pthread_once_t library_once = PTHREAD_ONCE_INIT;

static void library_init(void)
{
    /* not thread-safe in Connector/C: once per process, before any
     * connection (mysql_init would otherwise do it on first use) */
    mysql_library_init(0, NULL, NULL);
    dlock__mysql_gate_register();
}

static char *dup_or_null(const char *s, int *oom)
{
    char *d = s ? strdup(s) : NULL;
    if (s && !d)
        *oom = 1;
    return d;
}


static int my_open(void **out, dlock_client *c, const dlock__uri *u,
                   int64_t timeout_ms)
{
    static const char *const params[] = {"table",    "timeout", "ssl_mode",
                                         "ssl_ca",   "ssl_cert", "ssl_key",
                                         NULL};
    const char *table;
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
    rc = dlock__opt_table("mysql", u, MY_DEFAULT_TABLE, MY_TABLE_MAX, &table);
    if (rc)
        return rc;
    if (mode && strcmp(mode, "disabled") && strcmp(mode, "required") &&
        strcmp(mode, "verify_identity"))
        return dlock__err(DLOCK_EINVAL, "mysql URI %s: ssl_mode must be "
                                        "disabled, required or "
                                        "verify_identity, not '%s'",
                          u->redacted, mode);
    rc = dlock__opt_timeout("mysql", u, &timeout_ms);
    if (rc)
        return rc;
    pthread_once(&library_once, library_init);
    ms = calloc(1, sizeof(*ms));
    if (!ms || !(ms->redacted = strdup(u->redacted))) {
        free(ms);
        return dlock__mysql_enomem();
    }
    pthread_mutex_init(&ms->mu, NULL);
    ms->idle.max = MY_IDLE_MAX;
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
        return dlock__mysql_enomem();
    }
    snprintf(ms->table, sizeof(ms->table), "%s", table);
    if (!(ms->tl = dlock__mysql_hexlit(table, strlen(table)))) {
        my_close(ms);
        return dlock__mysql_enomem();
    }
    dlock__mysql_quote_ident(table, "", ms->t, sizeof(ms->t));
    dlock__mysql_quote_ident(table, "_queue", ms->q, sizeof(ms->q));

    int64_t deadline = dlock__now_ms() + timeout_ms;
    rc = dlock__mysql_conn_open(ms, deadline, &cn);
    if (rc) {
        my_close(ms);
        return rc;
    }
    rc = dlock__mysql_ensure_schema(ms, cn, deadline);
    dlock__mysql_conn_put(ms, cn);
    if (rc == DLOCK_OK)
        rc = dlock__mysql_templates(ms);
    if (rc) {
        my_close(ms);
        return rc;
    }
    *out = ms;
    return DLOCK_OK;
}

const dlock__backend dlock__backend_mysql = {
    DLOCK__STORE_HEAD,
    .name = "mysql",
    .caps = DLOCK__CAP_LEASE | DLOCK__CAP_NATIVE_WAIT | DLOCK__CAP_SHARED |
            DLOCK__CAP_PERMITS,
    .lease_size = sizeof(my_lease),
    .open = my_open,
    .close = my_close,
    .acquire = dlock__mysql_acquire,
    .release = my_release,
    .keep = my_keep,
    .check = dlock__mysql_check, /* mysql_check.c */
    .extend = my_extend,
    .inspect = dlock__mysql_inspect,
    .gc = my_gc,
    .list = dlock__mysql_list,
    .evict = dlock__mysql_evict,
    .watch_unsupported =
        "MySQL has no notification an observer could wait on without "
        "holding what a waiter needs (a name's gate: a waiter would then "
        "sleep to the holder's lease end)",
};
