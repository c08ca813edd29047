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
 * Semaphores are in pg_adv_sem.c; a lock's take first looks whether a
 * semaphore holds the name (its family key held shared).
 */
#include "pg.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

void dlock__pg_appname(const dlock__lease *l, char *out, size_t cap)
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

void dlock__pg_hold_keep(pg_store *ps, dlock__lease *l, pg_conn *cn,
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
    hold_params p;
    hold_params_of(l, &p);
    rc = dlock__pg_run(ps, cn,
                       l->kind == DLOCK__PERMIT ? S_ADV_SEM_UNLOCK
                       : l->kind == DLOCK__READ ? S_ADV_UNLOCK_SHARED
                                                : S_ADV_UNLOCK,
                       p.vals, p.lens, op_deadline, &r,
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
    PQclear(r);
    return rc;
}

/* ?mode=advisory: no lease, the server waits, the session is the hold */
static const dlock__backend backend_pg_advisory = {
    "postgres advisory",    /* name */
    DLOCK__CAP_NATIVE_WAIT | DLOCK__CAP_SHARED | DLOCK__CAP_PERMITS,
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
    NULL, /* list */
    NULL, /* evict */
    NULL, /* evict_unsupported */
};

const dlock__backend *dlock__pg_select(const dlock__uri *u)
{
    const char *mode = dlock__uri_param(u, "mode");

    return mode && !strcmp(mode, "advisory") ? &backend_pg_advisory : NULL;
}
