/* SPDX-License-Identifier: MIT */
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
 * The connections, their statements and the notifications are in
 * pg_conn.c, the SQL texts and the schema in pg_sql.c (pg.h).
 */
#include "pg.h"

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

static long long col_ll(const PGresult *r, int row, int col, long long dflt)
{
    if (PQntuples(r) <= row || PQnfields(r) <= col ||
        PQgetisnull(r, row, col))
        return dflt;
    return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

/* The application_name of a hold: "dlock " + desc, within 63 bytes. */
static void appname(const dlock__lease *l, char *out, size_t cap)
{
    snprintf(out, cap < PG_APPNAME_MAX + 1 ? cap : PG_APPNAME_MAX + 1,
             "%s", l->desc);
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
        dlock__pg_listen_ref(ps, pl, op_deadline, 0) == DLOCK_OK) {
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
    rc = dlock__pg_run_pooled(ps, S_ACQUIRE, vals, lens, op_deadline, &r,
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
            dlock__pg_listen_unref(ps, pl);
    }
    return rc;
}

static int pg_arm(void *st, dlock__lease *l, int64_t op_deadline)
{
    pg_store *ps = st;
    pg_lease *pl = l->priv;

    return dlock__pg_listen_ref(ps, pl, op_deadline, 1);
}

static void pg_disarm(void *st, dlock__lease *l, int acquired)
{
    pg_store *ps = st;

    (void)acquired; /* leaving the queue is abandon()'s */
    dlock__pg_listen_unref(ps, l->priv);
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
    rc = dlock__pg_run_pooled(ps, S_LEAVE, vals, lens, op_deadline, &r,
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
    rc = dlock__pg_run_pooled(ps, S_RELEASE, vals, lens, op_deadline, &r,
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
    rc = dlock__pg_run_pooled(ps, S_EXTEND, vals, lens, op_deadline, &r,
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
    rc = dlock__pg_conn_get(ps, op_deadline, &cn);
    if (rc)
        return rc;
    rc = dlock__pg_run(ps, cn, S_INSPECT, vals, lens, op_deadline, &r,
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
        rc = dlock__pg_run(ps, cn, S_QUEUE, vals, lens, op_deadline, &r,
                           "reading the queue");
    }
    if (rc == DLOCK_OK) {
        for (int i = 0; i < PQntuples(r) && rc == DLOCK_OK; i++)
            rc = dlock__info_add_waiter(out, PQgetvalue(r, i, 0));
        out->waiters = (int64_t)out->queue_len;
        PQclear(r);
    }
    dlock__pg_conn_put(ps, cn);
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
    rc = dlock__pg_run_pooled(ps, S_GC, vals, NULL, op_deadline, &r,
                              "removing unused locks");
    if (rc)
        return rc;
    *removed = strtoull(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    const char *me[1] = {dlock__client_id(ps->client)};
    rc = dlock__pg_run_pooled(ps, S_GC_QUEUE, me, NULL, op_deadline, &r,
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

    rc = dlock__pg_conn_get(ps, op_deadline, &cn);
    if (rc)
        return rc;
    appname(l, app, sizeof(app));
    if (l->deadline <= now) {
        const char *vals[2] = {l->name, app};
        int lens[2] = {(int)l->name_len, 0};
        rc = dlock__pg_run(ps, cn, S_ADV_TRY, vals, lens, op_deadline, &r,
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
            rc = dlock__pg_run_text(ps, cn, sql, limit, &r,
                                    "waiting for the advisory lock");
        } else {
            rc = dlock__pg_enomem();
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
    dlock__pg_conn_put(ps, cn);
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
        dlock__pg_conn_put(ps, cn);
        return dlock__err(DLOCK_ENOTHELD,
                          "postgres %s: the session holding the advisory "
                          "lock ended: the server had released it",
                          ps->redacted);
    }
    const char *vals[1] = {l->name};
    int lens[1] = {(int)l->name_len};
    rc = dlock__pg_run(ps, cn, S_ADV_UNLOCK, vals, lens, op_deadline, &r,
                       "releasing the advisory lock");
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
        return not_ours(ps);
    pthread_mutex_lock(&cn->mu);
    if (!cn->dead && PQstatus(cn->pg) == CONNECTION_OK) {
        const char *vals[1] = {l->name};
        int lens[1] = {(int)l->name_len};
        rc = dlock__pg_run(ps, cn, S_ADV_CHECK, vals, lens, op_deadline, &r,
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
    rc = dlock__pg_run_pooled(ps, S_ADV_INSPECT, vals, lens, op_deadline, &r,
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
                dlock__pg_idle_run(ps);
        } else if (ev[i].data.u64 == EV_MAIN) {
            dlock__pg_main_read(ps);
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
        dlock__pg_conn_free(cn);
    }
    while (ps->holds) {
        pg_conn *cn = ps->holds;
        ps->holds = cn->next;
        if (cn != ps->main)
            dlock__pg_conn_free(cn);
    }
    dlock__pg_conn_free(ps->main);
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
        return dlock__pg_enomem();
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
        return dlock__pg_enomem();
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
    dlock__pg_quote_ident(table, "", nm.t, sizeof(nm.t));
    dlock__pg_quote_ident(table, "_waiters", nm.w, sizeof(nm.w));
    dlock__pg_quote_ident(table, "_waiters_name", nm.wi, sizeof(nm.wi));
    dlock__pg_quote_ident(table, "_release", nm.rel, sizeof(nm.rel));
    dlock__pg_quote_ident(table, "_leave", nm.leave, sizeof(nm.leave));
    dlock__pg_quote_ident(table, "_tokens", ps->seq_ident,
                          sizeof(ps->seq_ident));
    dlock__pg_quote_literal(ps->seq_ident, ps->seq_lit, sizeof(ps->seq_lit));
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
        rc = dlock__pg_build_statements(ps, &nm, ps->seq_lit);
    if (rc) {
        pg_close(ps);
        return rc;
    }
    /* reach the server now, so that a wrong address or password fails
     * here, and make the table if it is missing */
    int64_t deadline = dlock__now_ms() + timeout_ms;
    rc = dlock__pg_conn_get(ps, deadline, &cn);
    if (rc) {
        pg_close(ps);
        return rc;
    }
    rc = dlock__pg_ensure_schema(ps, cn, &nm, deadline);
    if (rc)
        cn->broken = 1;
    dlock__pg_conn_put(ps, cn);
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
