/* SPDX-License-Identifier: MIT */
/*
 * pg_table.c -- the PostgreSQL store's table mode (the default): the
 * backend's slots and its struct, dlock__backend_pg (pg.c opens and
 * closes the store for both modes; pg.h).
 *
 * Table mode: the seeds' lock table.
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
 *  - Read holds and permits (docs/design.md, "Shared holds and permits"):
 *    the row's owner is '*' and its holders column keeps one entry per
 *    hold, each with its own lease end; lock_until is the latest. A take
 *    runs S_TAKE_FAST (the uncontended case, as light as the writer's
 *    upsert), then S_TAKE when that took nothing; T_unlock's grant step
 *    lets in every reader at the head, the writer, or one waiter per
 *    permit freed; a reader's release beside other readers is one UPDATE
 *    (S_RELEASE_READ).
 */
#include "pg.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The row's kind refuses this hold (docs/design.md, "Shared holds and
 * permits"): `kind` is what the statement read (-1 a lock held, 0
 * readers, N a semaphore). */
static int wrong_kind(const dlock__lease *l, long long kind)
{
    if (kind > 0)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s' is a semaphore of %lld permits",
                          l->name, kind);
    return dlock__err(DLOCK_EINVAL,
                      "lock '%.200s' is a lock, not a semaphore (it has "
                      "holders)",
                      l->name);
}

static int pg_acquire(void *st, dlock__lease *l, int64_t op_deadline)
{
    pg_store *ps = st;
    pg_lease *pl = l->priv;
    char ttl[24], waiter[24], pid[16], since[48], permits[16];
    const char *client = NULL;
    int shared = l->kind != DLOCK__WRITE;
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
    snprintf(permits, sizeof(permits), "%u",
             l->kind == DLOCK__PERMIT ? l->permits : 0u);
    const char *vals[9] = {l->name, l->owner, ttl, l->desc, client, waiter,
                           client ? pid : NULL, client ? since : NULL,
                           permits};
    int lens[9] = {(int)l->name_len, 0, 0, 0, 0, 0, 0, 0, 0};
    if (shared && !pl->queued) {
        /* the uncontended read hold or permit: one light statement; it
         * takes nothing (no row) where S_TAKE has to decide. A wait that
         * queued skips it: its own entry is a queue */
        rc = dlock__pg_run_pooled(ps, S_TAKE_FAST, vals, lens, op_deadline,
                                  &r, "taking the lock");
        if (rc == DLOCK_OK) {
            long long token = dlock__pg_col_ll(r, 0, 0, -1);
            pl->others = dlock__pg_col_ll(r, 0, 1, 0) > 1;
            PQclear(r);
            if (token > 0) {
                l->token = (uint64_t)token;
                if (!l->waiting && pl->listening)
                    dlock__pg_listen_unref(ps, pl);
                return DLOCK_OK;
            }
        } else if (rc != DLOCK_EBUSY) {
            if (!l->waiting && pl->listening)
                dlock__pg_listen_unref(ps, pl);
            return rc;
        }
    }
    rc = dlock__pg_run_pooled(ps, shared ? S_TAKE : S_ACQUIRE, vals, lens,
                              op_deadline, &r, "taking the lock");
    if (rc == DLOCK_OK) {
        /* the writer's: token, lease left, queued, a live semaphore's N;
         * the reader's or permit's: token, lease left, kind, queued */
        long long token = dlock__pg_col_ll(r, 0, 0, -1);
        long long left = dlock__pg_col_ll(r, 0, 1, -1);
        long long kind = dlock__pg_col_ll(r, 0, 2, LLONG_MIN);
        int queued = dlock__pg_col_ll(r, 0, shared ? 3 : 2, 0) > 0;
        long long sem = shared ? 0 : dlock__pg_col_ll(r, 0, 3, 0);
        pl->others = shared && dlock__pg_col_ll(r, 0, 4, 0) > 1;
        PQclear(r);
        if (token > 0) {
            l->token = (uint64_t)token;
            rc = DLOCK_OK;
        } else if (sem > 0) {
            rc = wrong_kind(l, sem);
        } else if (shared && kind != LLONG_MIN &&
                   (l->kind == DLOCK__READ ? kind > 0
                                           : kind != (long long)l->permits)) {
            rc = wrong_kind(l, kind);
        } else {
            /* the fallback timer: the lease end of a hold in the way (a
             * crashed holder releases nothing); a row made after the
             * statement's snapshot shows no lease: soon */
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
    char waiter[24], ttl[24], kind[16];
    PGresult *r;
    int rc;

    snprintf(waiter, sizeof(waiter), "%llu", (unsigned long long)l->waiter);
    snprintf(ttl, sizeof(ttl), "%lld", (long long)l->ttl_ms);
    /* the hold kept must be of this wait's kind: a leftover hold of the
     * owner's of another kind (an earlier wait's, its answer lost) is
     * not this one */
    snprintf(kind, sizeof(kind), "%d",
             l->kind == DLOCK__WRITE  ? -1
             : l->kind == DLOCK__READ ? 0
                                      : (int)l->permits);
    const char *vals[6] = {l->name, l->owner, dlock__client_id(ps->client),
                           waiter, ttl, kind};
    int lens[6] = {(int)l->name_len, 0, 0, 0, 0, 0};
    rc = dlock__pg_run_pooled(ps, S_LEAVE, vals, lens, op_deadline, &r,
                              "leaving the queue");
    if (rc)
        return rc;
    long long token = dlock__pg_col_ll(r, 0, 0, -1);
    PQclear(r);
    if (token > 0) {
        l->token = (uint64_t)token;
        return DLOCK_OK;
    }
    return DLOCK_EBUSY;
}

/* The grants a release (T_unlock) answers, "CLIENT:WAITER:TOKEN ...":
 * a waiter of this client is woken now, not when its notification comes
 * back. */
static void own_grants(pg_store *ps, const char *grants)
{
    const char *id = dlock__client_id(ps->client);
    size_t n = strlen(id);

    for (const char *p = grants; p && *p;) {
        unsigned long long waiter, token;
        int end = 0;
        while (*p == ' ')
            p++;
        if (!strncmp(p, id, n) && p[n] == ':' &&
            sscanf(p + n + 1, "%llu:%llu%n", &waiter, &token, &end) == 2 &&
            token > 0 && (p[n + 1 + end] == ' ' || p[n + 1 + end] == '\0'))
            dlock__notify_grant(ps->client, waiter, token);
        p = strchr(p, ' ');
    }
}

static int pg_release(void *st, dlock__lease *l, int64_t op_deadline)
{
    pg_store *ps = st;
    pg_lease *pl = l->priv;
    char token[24];
    PGresult *r;
    int rc;

    snprintf(token, sizeof(token), "%llu", (unsigned long long)l->token);
    const char *vals[3] = {l->name, l->owner, token};
    int lens[3] = {(int)l->name_len, 0, 0};
    if (l->kind == DLOCK__READ && pl->others) {
        /* others read beside us (at the take): while one still does, our
         * release lets nobody in, and costs one UPDATE */
        rc = dlock__pg_run_pooled(ps, S_RELEASE_READ, vals, lens,
                                  op_deadline, &r, "releasing the lock");
        if (rc)
            return rc;
        int done = !strcmp(PQcmdTuples(r), "1");
        PQclear(r);
        if (done)
            return DLOCK_OK;
    }
    rc = dlock__pg_run_pooled(ps, S_RELEASE, vals, lens, op_deadline, &r,
                              "releasing the lock");
    if (rc)
        return rc;
    int released = PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "t");
    if (released && PQnfields(r) > 1 && !PQgetisnull(r, 0, 1))
        own_grants(ps, PQgetvalue(r, 0, 1));
    PQclear(r);
    return released ? DLOCK_OK : dlock__pg_not_ours(ps);
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
    rc = dlock__pg_run_pooled(ps,
                              l->kind == DLOCK__WRITE ? S_EXTEND
                                                      : S_EXTEND_SHARED,
                              vals, lens, op_deadline, &r,
                              "extending the lease");
    if (rc)
        return rc;
    int changed = !strcmp(PQcmdTuples(r), "1");
    PQclear(r);
    return changed ? DLOCK_OK : dlock__pg_not_ours(ps);
}

static int pg_inspect(void *st, const char *name, size_t len,
                      dlock_info *out, int64_t op_deadline)
{
    pg_store *ps = st;
    pg_conn *cn;
    PGresult *r;
    int rc, kinds = 0;

    const char *vals[2] = {name, dlock__client_id(ps->client)};
    int lens[2] = {(int)len, 0};
    rc = dlock__pg_conn_get(ps, op_deadline, &cn);
    if (rc)
        return rc;
    rc = dlock__pg_run(ps, cn, S_INSPECT, vals, lens, op_deadline, &r,
                       "reading the lock");
    if (rc == DLOCK_OK) {
        /* held, holder, token, ttl, held for, shared form, permits, live
         * entries, the earliest live entry's description */
        if (PQntuples(r) == 1 && PQnfields(r) == 9) {
            int held = !strcmp(PQgetvalue(r, 0, 0), "t");
            int form = !strcmp(PQgetvalue(r, 0, 5), "t");
            out->token = (uint64_t)dlock__pg_col_ll(r, 0, 2, 0);
            out->permits = dlock__pg_col_ll(r, 0, 6, 0);
            if (form && held) {
                out->held = 1;
                out->holders = dlock__pg_col_ll(r, 0, 7, 0);
                out->shared = out->permits == 0;
                kinds = 1;
                if (out->shared && out->holders > 1)
                    snprintf(out->holder, sizeof(out->holder),
                             "%lld readers", (long long)out->holders);
                else
                    snprintf(out->holder, sizeof(out->holder), "%s",
                             PQgetvalue(r, 0, 8));
            } else if (held) {
                out->held = 1;
                out->holders = 1;
                snprintf(out->holder, sizeof(out->holder), "%s",
                         PQgetvalue(r, 0, 1));
            }
            if (out->held) {
                out->ttl_ms = dlock__pg_col_ll(r, 0, 3, -1);
                out->held_ms = dlock__pg_col_ll(r, 0, 4, -1);
            }
        }
        PQclear(r);
        rc = dlock__pg_run(ps, cn, S_QUEUE, vals, lens, op_deadline, &r,
                           "reading the queue");
    }
    if (rc == DLOCK_OK) {
        /* each waiter's kind in front once readers or permits use the
         * name */
        for (int i = 0; i < PQntuples(r); i++)
            kinds |= dlock__pg_col_ll(r, i, 1, 0) != 0;
        for (int i = 0; i < PQntuples(r) && rc == DLOCK_OK; i++) {
            long long k = dlock__pg_col_ll(r, i, 1, 0);
            char line[sizeof(out->holder) + 16];
            snprintf(line, sizeof(line), "%s%s",
                     !kinds   ? ""
                     : k == 0 ? "write: "
                     : k == 1 ? "read: "
                              : "permit: ",
                     PQgetvalue(r, i, 0));
            rc = dlock__info_add_waiter(out, line);
        }
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

const dlock__backend dlock__backend_pg = {
    "postgres",         /* name */
    DLOCK__CAP_LEASE | DLOCK__CAP_HANDOVER | DLOCK__CAP_WAITER_READS |
        DLOCK__CAP_SHARED | DLOCK__CAP_PERMITS,
    sizeof(pg_lease),   /* lease_size */
    dlock__pg_open,     /* open */
    dlock__pg_close,    /* close */
    pg_acquire,         /* acquire */
    pg_arm,             /* arm */
    pg_disarm,          /* disarm */
    pg_release,         /* release */
    pg_extend,          /* extend */
    pg_inspect,         /* inspect */
    dlock__pg_loop_fd,  /* loop_fd */
    dlock__pg_loop_run, /* loop_run */
    pg_gc,              /* gc */
    dlock__pg_select,   /* select */
    NULL,               /* margin */
    pg_abandon,         /* abandon */
    NULL,               /* extend_many */
    NULL, /* list */
    NULL, /* evict */
    NULL, /* evict_unsupported */
};
