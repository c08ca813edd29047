/* SPDX-License-Identifier: MIT */
/*
 * pg_advisory.c -- the PostgreSQL store's advisory mode: the backend's
 * slots and its struct, and dlock__pg_select(), which picks it for a URI
 * (pg.c opens and closes the store for both modes; pg.h).
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
 */
#include "pg.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

/* The application_name of a hold: "dlock " + desc, within 63 bytes. */
static void appname(const dlock__lease *l, char *out, size_t cap)
{
    snprintf(out, cap < PG_APPNAME_MAX + 1 ? cap : PG_APPNAME_MAX + 1,
             "%s", l->desc);
}

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
void dlock__pg_hold_check(pg_store *ps, pg_conn *cn)
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
    int shared = l->kind == DLOCK__READ;
    int rc;

    rc = dlock__pg_conn_get(ps, op_deadline, &cn);
    if (rc)
        return rc;
    appname(l, app, sizeof(app));
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
            size_t cap = strlen(hex) + 2 * strlen(lit) + 640;
            sql = malloc(cap);
            if (sql)
                /* the session says who waits ("dlock 0 DESC": no token
                 * yet); a wait that times out rolls the name back */
                snprintf(sql, cap,
                         "SET LOCAL lock_timeout = %lld; "
                         "SELECT set_config('application_name', 'dlock 0 ' "
                         "|| %s, false); "
                         "WITH l AS (SELECT pg_advisory_lock%s(" KEY(
                             "decode('%s', 'hex')") ")), "
                         "n AS (SELECT nextval(%s) AS t FROM l) "
                         "SELECT t, set_config('application_name', 'dlock ' "
                         "|| t || ' ' || %s, false) FROM n",
                         (long long)wait, lit, shared ? "_shared" : "", hex,
                         ps->seq_lit, lit);
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
        long long token = dlock__pg_col_ll(r, 0, 0, -1);
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
    rc = dlock__pg_run(ps, cn,
                       l->kind == DLOCK__READ ? S_ADV_UNLOCK_SHARED
                                              : S_ADV_UNLOCK,
                       vals, lens, op_deadline, &r,
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
        return dlock__pg_not_ours(ps);
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
        int reader = !strcmp(PQgetvalue(r, i, 4), "t");
        if (!strcmp(PQgetvalue(r, i, 0), "t")) {
            /* the holders: one writer, or readers (the newest token) */
            if (!out->held || token > out->token) {
                out->token = token;
                out->held_ms = dlock__pg_col_ll(r, i, 2, -1);
            }
            if (!out->held)
                snprintf(out->holder, sizeof(out->holder), "%s", who);
            out->held = 1;
            out->shared = reader;
            out->holders++;
        } else {
            char line[sizeof(out->holder) + 8];
            snprintf(line, sizeof(line), "%s: %s", reader ? "read" : "write",
                     who);
            rc = dlock__info_add_waiter(out, line);
        }
    }
    if (out->shared && out->holders > 1)
        snprintf(out->holder, sizeof(out->holder), "%lld readers",
                 (long long)out->holders);
    out->waiters = (int64_t)out->queue_len;
    PQclear(r);
    return rc;
}

/* ?mode=advisory: no lease, the server waits, the session is the hold */
static const dlock__backend backend_pg_advisory = {
    "postgres advisory",    /* name */
    DLOCK__CAP_NATIVE_WAIT | DLOCK__CAP_SHARED, /* caps */
    sizeof(pg_lease),       /* lease_size */
    dlock__pg_open,         /* open */
    dlock__pg_close,        /* close */
    adv_acquire,            /* acquire */
    NULL,                   /* arm */
    NULL,                   /* disarm */
    adv_release,            /* release */
    adv_extend,             /* extend */
    adv_inspect,            /* inspect */
    dlock__pg_loop_fd,      /* loop_fd */
    dlock__pg_loop_run,     /* loop_run */
    NULL,                   /* gc: nothing is kept per name */
    NULL,                   /* select */
    NULL,                   /* margin */
    NULL,                   /* abandon */
    NULL,                   /* extend_many */
};

const dlock__backend *dlock__pg_select(const dlock__uri *u)
{
    const char *mode = dlock__uri_param(u, "mode");

    return mode && !strcmp(mode, "advisory") ? &backend_pg_advisory : NULL;
}
