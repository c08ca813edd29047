/* SPDX-License-Identifier: MIT */
/*
 * pg_advisory.c -- the PostgreSQL store's advisory mode: the backend's
 * slots and its struct, and dlock__pg_select(), which picks it for a URI
 * (pg.c opens and closes the store for both modes; pg_int.h).
 *
 * Advisory mode (?mode=advisory): PostgreSQL's session-level advisory
 * locks. The key of lock NAME is the first 64 bits of md5(NAME). Each hold
 * keeps its own connection (from the client's pool) until the release; the
 * server frees the lock when that session ends, so there is no lease and
 * no watchdog. Waiting is the server's own (pg_advisory_lock with
 * lock_timeout = the caller's wait): first come, first served, no polling.
 * Tokens come from the sequence T_tokens. The client thread watches every
 * hold's connection and reports a hold lost the moment its session ends.
 * Shared holds are the server's shared advisory locks
 * (pg_advisory_lock_shared): its lock manager queues a shared request
 * behind a waiting exclusive one and wakes every compatible waiter at the
 * head of the queue on a release, so readers do not starve writers.
 * Semaphores are in pg_advisory_rw.c; a lock's take first looks whether a
 * semaphore holds the name (its family key held shared).
 */
#include "pg_int.h"

#include "hex.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int adv_acquire(void *st, dlock__lease *l, int64_t op_deadline)
{
    pg_store *ps = st;
    char app[PG_APPNAME_MAX + 1];
    pg_conn *cn;
    PGresult *r = NULL;
    int64_t now = dlock__now_ms();
    int shared = l->kind == DLOCK__READ;
    int rc;

    if (l->kind == DLOCK__PERMIT)
        return dlock__pg_adv_sem_acquire(ps, l, op_deadline);
    rc = dlock__pg_conn_get(ps, op_deadline, &cn);
    if (rc)
        return rc;
    dlock__pg_appname(l, app, sizeof(app));
    if (l->deadline <= now) {
        const char *vals[2] = {l->name, app};
        int lens[2] = {(int)l->name_len, 0};
        rc = dlock__pg_run(ps, cn, shared ? S_ADV_TRY_SHARED : S_ADV_TRY,
                           vals, lens, op_deadline, &r,
                           "taking the advisory lock");
    } else {
        /* the server waits: lock_timeout ends the wait at our deadline */
        int64_t wait = l->deadline == DLOCK__FOREVER ? 0 : l->deadline - now;
        char *hex = malloc(2 * l->name_len + 1);
        char *lit = PQescapeLiteral(cn->pg, app, strlen(app));
        char *sql = NULL;
        if (hex && lit) {
            dlock__hex(l->name, l->name_len, hex);
            size_t cap = 2 * strlen(hex) + 2 * strlen(lit) + 1024;
            sql = malloc(cap);
            if (sql)
                /* the session says who waits ("dlock 0 DESC": no token
                 * yet); a wait that times out rolls the name back. The
                 * witness key (pg_int.h, ADV_W) once the lock is granted: a
                 * wait that times out leaves none behind */
                snprintf(sql, cap,
                         "SET LOCAL lock_timeout = %lld; "
                         "SELECT set_config('application_name', 'dlock 0 ' "
                         "|| %s, false); "
                         "WITH l AS (SELECT pg_advisory_lock%s(" KEY(
                             "decode('%s', 'hex')") ")), "
                         "w AS (SELECT pg_try_advisory_lock(" ADV_W_OWN(
                             "decode('%s', 'hex')") ") FROM l), "
                         "n AS (SELECT nextval(%s) AS t FROM w) "
                         "SELECT t, set_config('application_name', 'dlock ' "
                         "|| t || ' ' || %s, false) FROM n",
                         (long long)wait, lit, shared ? "_shared" : "", hex,
                         hex, ps->seq_lit, lit);
        }
        if (sql)
            rc = dlock__pg_adv_wait(ps, cn, l, sql, &r,
                                    "waiting for the advisory lock");
        else
            rc = dlock__pg_enomem();
        free(sql);
        free(hex);
        PQfreemem(lit);
    }
    if (rc == DLOCK_OK) {
        long long token = dlock__pg_col_ll(r, 0, 0, -1);
        PQclear(r);
        if (token > 0) {
            dlock__pg_hold_keep(ps, l, cn, token);
            return DLOCK_OK;
        }
        rc = DLOCK_EBUSY;
    }
    l->retry_ms = -1;
    dlock__pg_conn_put(ps, cn);
    return rc;
}

/* The parameters of a hold's release and check: the name, and a
 * permit's N and slot (a lock's statements read only the name). */
typedef struct hold_params {
    char n[16], slot[16];
    const char *vals[3];
    int lens[3];
} hold_params;

static void hold_params_of(const dlock__lease *l, hold_params *p)
{
    const pg_lease *pl = l->priv;

    snprintf(p->n, sizeof(p->n), "%u", l->permits);
    snprintf(p->slot, sizeof(p->slot), "%d", pl->slot);
    p->vals[0] = l->name;
    p->vals[1] = p->n;
    p->vals[2] = p->slot;
    p->lens[0] = (int)l->name_len;
    p->lens[1] = p->lens[2] = 0;
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
    dlock__pg_hold_unwatch(ps, cn);
    pl->hold = NULL;
    pthread_mutex_lock(&cn->mu);
    pthread_mutex_unlock(&cn->mu); /* the client thread is done with it */
    if (cn->dead || PQstatus(cn->pg) != CONNECTION_OK) {
        cn->broken = 1;
        dlock__pg_conn_put(ps, cn);
        return dlock__err(DLOCK_ENOTHELD,
                          "postgres %s: the session holding the advisory "
                          "lock ended: the server had released it",
                          ps->redacted);
    }
    hold_params p;
    hold_params_of(l, &p);
    rc = dlock__pg_run(ps, cn,
                       l->kind == DLOCK__PERMIT ? S_ADV_SEM_UNLOCK
                       : l->kind == DLOCK__READ ? S_ADV_UNLOCK_SHARED
                                                : S_ADV_UNLOCK,
                       p.vals, p.lens, op_deadline, &r,
                       "releasing the advisory lock");
    if (rc == DLOCK_ECONN && cn->broken && cn->ended) {
        /* the server ended the session before the release (a break: the
         * release waited for it, see adv_evict), which let go of the lock:
         * it was not ours by then */
        dlock__pg_conn_put(ps, cn);
        return dlock__err(DLOCK_ENOTHELD,
                          "postgres %s: the server ended the session holding "
                          "the advisory lock (pg_terminate_backend: dlock "
                          "break or an administrator, or a shutdown) before "
                          "the release: it had released the lock",
                          ps->redacted);
    }
    if (rc == DLOCK_ECONN && cn->broken) {
        /* closing the session frees the lock on the server too */
        dlock__pg_conn_put(ps, cn);
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
    dlock__pg_conn_put(ps, cn);
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
        return dlock__pg_not_ours(ps);
    pthread_mutex_lock(&cn->mu);
    if (!cn->dead && PQstatus(cn->pg) == CONNECTION_OK) {
        hold_params p;
        hold_params_of(l, &p);
        rc = dlock__pg_run(ps, cn,
                           l->kind == DLOCK__PERMIT ? S_ADV_SEM_CHECK
                                                    : S_ADV_CHECK,
                           p.vals, p.lens, op_deadline, &r,
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

/* A session's application_name "dlock TOKEN [sN ]DESC": *token, *n (0:
 * no "sN "), and the description in who; another program's session is
 * shown by its pid and name. */
static void who_of(const char *app, const char *pid, unsigned long long *token,
                   unsigned *n, char *who, size_t cap)
{
    int skip = 0, more = 0;

    *token = 0;
    *n = 0;
    if (!strncmp(app, "dlock ", 6) &&
        sscanf(app + 6, "%llu %n", token, &skip) == 1 && skip > 0) {
        const char *d = app + 6 + skip;
        if (sscanf(d, "s%u %n", n, &more) == 1 && more > 0 && *n > 0 &&
            *n <= PG_ADV_PERMITS_MAX)
            d += more;
        else
            *n = 0;
        snprintf(who, cap, "%s", d);
    } else {
        snprintf(who, cap, "backend pid %s (%s)", pid,
                 app[0] ? app : "not dlock");
    }
}

/* S_ADV_INSPECT's rows (granted, application_name, held for, pid,
 * shared, key kind, from column 0), into *out; adv_evict's answer has
 * the same columns first. */
static int adv_fill(dlock_info *out, const PGresult *r)
{
    int rc = DLOCK_OK;

    out->waiters = 0;
    /* k 0: the lock's holders and waiters; k 1: a semaphore's permit
     * holders; k 2: its gate (the head, granted, then the queue) */
    for (int i = 0; i < PQntuples(r) && rc == DLOCK_OK; i++) {
        const char *app = PQgetvalue(r, i, 1);
        char who[sizeof(out->holder)];
        unsigned long long token;
        unsigned n;
        int k = (int)dlock__pg_col_ll(r, i, 5, 0);
        int granted = !strcmp(PQgetvalue(r, i, 0), "t");
        int reader = !strcmp(PQgetvalue(r, i, 4), "t");
        who_of(app, PQgetvalue(r, i, 3), &token, &n, who, sizeof(who));
        if (k != 2 && granted) {
            /* the holders: one writer, readers or permits (the newest
             * token) */
            if (!out->held || token > out->token) {
                out->token = token;
                out->held_ms = dlock__pg_col_ll(r, i, 2, -1);
            }
            if (!out->held)
                snprintf(out->holder, sizeof(out->holder), "%s", who);
            out->held = 1;
            out->shared = k == 0 && reader;
            if (k == 1 && n > 0)
                out->permits = n;
            out->holders++;
        } else if (k == 0 || k == 2) {
            char line[sizeof(out->holder) + 8];
            snprintf(line, sizeof(line), "%s: %s",
                     k == 2 ? "permit" : reader ? "read" : "write", who);
            rc = dlock__info_add_waiter(out, line);
        }
    }
    if (out->shared && out->holders > 1)
        snprintf(out->holder, sizeof(out->holder), "%lld readers",
                 (long long)out->holders);
    out->waiters = (int64_t)out->queue_len;
    return rc;
}

static int adv_inspect(void *st, const char *name, size_t len,
                       dlock_info *out, int64_t op_deadline)
{
    pg_store *ps = st;
    PGresult *r;
    int rc;

    const char *vals[1] = {name};
    int lens[1] = {(int)len};
    rc = dlock__pg_run_pooled(ps, S_ADV_INSPECT, vals, lens, op_deadline, &r,
                              "reading the advisory lock");
    if (rc)
        return rc;
    rc = adv_fill(out, r);
    PQclear(r);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Operating: dlock_list() and dlock_break()                                */
/* ------------------------------------------------------------------------ */

static int adv_list(void *st, const char *prefix, size_t plen,
                    const char *cursor, size_t limit, unsigned flags,
                    dlock_list_page *out, int64_t op_deadline)
{
    pg_store *ps = st;

    (void)prefix, (void)plen, (void)cursor, (void)limit, (void)flags;
    (void)out, (void)op_deadline;
    return dlock__err(DLOCK_ENOTSUP,
                      "postgres %s: advisory mode cannot list its locks: "
                      "the server knows each one only by a 64-bit hash of "
                      "its name (pg_locks shows keys, not names), and a "
                      "holder's session keeps no more than its token and "
                      "description; inspect a lock by name, or use table "
                      "mode (docs/monitoring.md)",
                      ps->redacted);
}

/*
 * dlock_break() in advisory mode. A hold is its session's lock, and only
 * that session, or its end, lets go of it: the break ends the holders'
 * sessions (pg_terminate_backend; one session per hold, so no other hold
 * ends with it), and only those it can prove are dlock's holders of this
 * name (docs/design.md, "PostgreSQL advisory mode: what a break ends"). In
 * one transaction on a pooled session:
 *  1. the name's break key B exclusively (a transaction lock): every
 *     release takes it shared first, so a holder cannot release (and its
 *     session go back to its pool, and on to another hold) between the
 *     look and the end of its session: either the release came first and
 *     the break finds nothing, or the release waits, and ends with its
 *     session (DLOCK_ELOST);
 *  2. the look of dlock_inspect() (the lock's key, a semaphore's family
 *     key and gate); the holders of the lock's key or of the family key
 *     are the victims if each is proven a dlock holder of the name: its
 *     session holds the name's witness key for its own pid (pg_int.h,
 *     ADV_W), its application_name is dlock's, and its role may draw
 *     tokens from the sequence (so may write dlock's state, and could
 *     break the lock anyway). A holder that is not proven ends nothing:
 *     DLOCK_EAUTH naming it (pid, role, application_name);
 *  3. if this role may end every victim's session (its role's member or
 *     pg_signal_backend's; a superuser's only as a superuser), each is
 *     signalled (pg_terminate_backend(pid)), then waited for
 *     (pg_terminate_backend(pid, wait), PostgreSQL 14+: returns once the
 *     session is gone, so its locks are free and its waiters granted; the
 *     sessions end side by side, within one wait). Else nothing is ended:
 *     DLOCK_EAUTH.
 * The server grants the lock to its waiters as the sessions end (its own
 * queue: no notification needed); the evicted holders' connections close
 * and their clients report the holds lost (dlock__pg_hold_check). Tokens
 * come from the sequence: the next hold's is greater.
 */
#define HEX "decode('%1$s', 'hex')"
static const char adv_break_sql[] =
    "SELECT pg_advisory_xact_lock(" ADV_B(HEX) "); "
    "WITH s0 AS (SELECT l.granted, coalesce(a.application_name, '') AS app, "
    "floor(extract(epoch FROM " NOW " - a.state_change) * 1000)::bigint AS "
    "ms, l.pid, l.mode = 'ShareLock' AS sh, w.k, a.query_start AS qs, "
    "a.usesysid AS role, coalesce(r.rolname, '') AS rolname, l.granted AND "
    "w.k < 2 AS holder FROM (VALUES (" KEY(HEX) ", 0), (" ADV_F(HEX) ", 1), "
    "(" ADV_G(HEX) ", 2)) w(key, k) JOIN pg_locks l ON " ADV_KEY_IS("w.key")
    " LEFT JOIN pg_stat_activity a ON a.pid = l.pid LEFT JOIN pg_roles r ON "
    "r.oid = a.usesysid), "
    "s AS (SELECT s0.*, holder AND coalesce(app ~ '^dlock( |$)' AND "
    "has_sequence_privilege(role, %3$s, 'USAGE, UPDATE') AND EXISTS (SELECT "
    "1 FROM pg_locks l WHERE l.pid = s0.pid AND l.granted AND "
    ADV_KEY_IS(ADV_W(HEX, "s0.pid")) "), false) AS victim FROM s0), "
    "v AS (SELECT DISTINCT pid, role FROM s WHERE victim), "
    "un AS (SELECT count(*) AS n FROM s WHERE holder AND NOT victim), "
    "ok AS (SELECT coalesce(bool_and(v.role IS NULL OR coalesce((NOT "
    "r.rolsuper OR (SELECT rolsuper FROM pg_roles WHERE rolname = "
    "current_user)) AND (pg_has_role(v.role, 'USAGE') OR pg_has_role("
    "'pg_signal_backend', 'USAGE')), false)), true) AS ok FROM v LEFT JOIN "
    "pg_roles r ON r.oid = v.role), "
    "e AS (SELECT count(*) FILTER (WHERE pg_terminate_backend(v.pid)) AS n "
    "FROM v WHERE (SELECT ok FROM ok) AND (SELECT n FROM un) = 0), "
    "f AS (SELECT count(*) FILTER (WHERE %2$s) AS n FROM v WHERE (SELECT n "
    "FROM e) > 0) "
    "SELECT s.granted, s.app, s.ms, s.pid, s.sh, s.k, s.victim, (SELECT ok "
    "FROM ok), (SELECT n FROM e), (SELECT n FROM f), s.holder AND NOT "
    "s.victim, s.rolname FROM s ORDER BY s.k, s.granted DESC, s.qs";
#undef HEX

/* s (a server's string) with each byte outside printable ASCII as '?',
 * cut to cap - 1 bytes: for a message. */
static void printable(const char *s, char *out, size_t cap)
{
    size_t i = 0;

    for (; s[i] && i + 1 < cap; i++)
        out[i] = s[i] >= 0x20 && s[i] < 0x7f ? s[i] : '?';
    out[i] = '\0';
}

/* How long the break waits for the evicted sessions to end, at most
 * (their exits take milliseconds; a session stuck in the kernel may take
 * longer, and ends later). */
#define ADV_BREAK_WAIT_MS 5000

static int adv_evict(void *st, const char *name, size_t len, dlock_info *out,
                     int64_t op_deadline)
{
    pg_store *ps = st;
    char wait[160] = "false";
    char *hex = NULL, *sql = NULL;
    pg_conn *cn;
    PGresult *r;
    int rc;

    rc = dlock__pg_conn_get(ps, op_deadline, &cn);
    if (rc)
        return rc;
    if (PQserverVersion(cn->pg) >= 140000) {
        /* wait for the sessions to end (side by side: each is signalled
         * already), all within the break's deadline */
        int64_t left = op_deadline - dlock__now_ms() - 100;
        if (left > ADV_BREAK_WAIT_MS)
            left = ADV_BREAK_WAIT_MS;
        snprintf(wait, sizeof(wait),
                 "pg_terminate_backend(v.pid, greatest(1, %lld / (SELECT "
                 "count(*) FROM v))::bigint)",
                 (long long)(left > 1 ? left : 1));
    }
    hex = malloc(2 * len + 1);
    if (hex) {
        dlock__hex(name, len, hex);
        size_t cap = (size_t)snprintf(NULL, 0, adv_break_sql, hex, wait,
                                      ps->seq_lit) +
                     1;
        if ((sql = malloc(cap)) != NULL)
            snprintf(sql, cap, adv_break_sql, hex, wait, ps->seq_lit);
    }
    rc = sql ? dlock__pg_run_text(ps, cn, sql, op_deadline, &r,
                                  "breaking the advisory lock")
             : dlock__pg_enomem();
    free(sql);
    free(hex);
    dlock__pg_conn_put(ps, cn);
    if (rc)
        return rc;
    if (PQnfields(r) != 12) {
        PQclear(r);
        return dlock__err(DLOCK_EPROTO, "postgres %s: breaking the advisory "
                                        "lock: an answer of another shape",
                          ps->redacted);
    }
    /* the look as dlock_inspect() reads it, then: a victim, whether this
     * role may end every victim's session, how many were signalled, how
     * many were gone within the wait, a holder not proven dlock's, its
     * role */
    int victims = 0, allowed = 1, unproven = -1;
    for (int i = 0; i < PQntuples(r); i++) {
        victims += !strcmp(PQgetvalue(r, i, 6), "t");
        allowed &= strcmp(PQgetvalue(r, i, 7), "f") != 0;
        if (unproven < 0 && !strcmp(PQgetvalue(r, i, 10), "t"))
            unproven = i;
    }
    if (unproven >= 0) {
        char app[PG_APPNAME_MAX + 1], role[PG_APPNAME_MAX + 1];
        printable(PQgetvalue(r, unproven, 1), app, sizeof(app));
        printable(PQgetvalue(r, unproven, 11), role, sizeof(role));
        rc = dlock__err(DLOCK_EAUTH,
                        "postgres %s: lock '%.200s' is held by a session "
                        "dlock cannot prove is a dlock holder (pid %s, role "
                        "%s, application '%s'): not terminated, and no "
                        "other session either (a dlock holder holds the "
                        "name's witness key, and its role may use the "
                        "tokens' sequence: docs/monitoring.md)",
                        ps->redacted, name, PQgetvalue(r, unproven, 3),
                        role[0] ? role : "unknown", app);
        PQclear(r);
        return rc;
    }
    rc = adv_fill(out, r);
    PQclear(r);
    if (rc)
        return rc;
    if (!victims)
        return DLOCK_ENOTHELD;
    if (!allowed)
        return dlock__err(DLOCK_EAUTH,
                          "postgres %s: breaking lock '%.200s' ends its "
                          "holders' sessions (pg_terminate_backend), which "
                          "this role may not do: connect as the holders' "
                          "role, a member of it, or a member of "
                          "pg_signal_backend (a superuser's session only as "
                          "a superuser); nothing was ended",
                          ps->redacted, name);
    return DLOCK_OK;
}

/* PostgreSQL's lock_timeout, which ends a wait in the server, is an int
 * of milliseconds (24.8 days at most; more is an error): a longer wait
 * (up to DLOCK_WAIT_MAX) runs as waits of a day in turn, until one gets
 * the lock, fails otherwise, or is cancelled, or the deadline comes. */
#define ADV_TURN_MS 86400000

static int adv_acquire_turns(void *st, dlock__lease *l, int64_t op_deadline)
{
    const pg_store *ps = st;
    int64_t deadline = l->deadline;

    for (int turn = 0;; turn++) {
        int64_t now = dlock__now_ms();
        int cut = deadline != DLOCK__FOREVER && deadline - now > ADV_TURN_MS;
        if (turn > 0)
            op_deadline = now + ps->timeout_ms;
        if (cut)
            l->deadline = now + ADV_TURN_MS;
        int rc = adv_acquire(st, l, op_deadline);
        l->deadline = deadline;
        if (!cut || rc != DLOCK_EBUSY || dlock__lease_cancelled(l))
            return rc;
    }
}

/* ?mode=advisory: no lease, the server waits, the session is the hold */
static const dlock__backend backend_pg_advisory = {
    DLOCK__STORE_HEAD,
    .name = "postgres advisory",
    .caps = DLOCK__CAP_NATIVE_WAIT | DLOCK__CAP_SHARED | DLOCK__CAP_PERMITS,
    .lease_size = sizeof(pg_lease),
    .open = dlock__pg_open,
    .close = dlock__pg_close,
    .acquire = adv_acquire_turns,
    .release = adv_release,
    .extend = adv_extend,
    .inspect = adv_inspect,
    .loop_fd = dlock__pg_loop_fd,
    .loop_run = dlock__pg_loop_run,
    .gc = NULL, /* nothing is kept per name */
    .list = adv_list,
    .evict = adv_evict,
    .check = dlock__pg_check, /* pg_check.c */
    .watch_unsupported =
        "in advisory mode a leader's hold ends with its session, which "
        "PostgreSQL tells no observer; the table mode (the default) has "
        "observers",
};

const dlock__backend *dlock__pg_select(const dlock__uri *u)
{
    const char *mode = dlock__uri_param(u, "mode");

    return mode && !strcmp(mode, "advisory") ? &backend_pg_advisory : NULL;
}
