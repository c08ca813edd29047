/* SPDX-License-Identifier: MIT */
/*
 * pg_elect.c -- leader election in table mode (docs/design.md, "Leader
 * election"): the proclaim, the ring and an observer's watch.
 *
 * Proclaim: one UPDATE of the holder's row (S_PROCLAIM), guarded as a
 * renewal is (owner, token, lease not over): the holder column becomes
 * the new value. Ring: NOTIFY on the election's channel, dlock_e_ and 16
 * hex digits of a hash of the table and the name (a hash: a channel is an
 * identifier of at most 63 bytes; two names that share one only wake
 * each other's observers, who read and find nothing new). An observer's
 * watch: a connection of its own that LISTENs on the channel, waited on
 * in poll() beside the observer's cancel descriptor. Any role that can
 * connect may NOTIFY there: a notification is only a wake-up, the
 * observer reads the row. A leader that dies sends nothing: its lease's
 * end, which the observer reads, ends the observer's wait (the slot's
 * watch_sees_expiry is 0). Advisory mode has no watch: its holds end
 * with their sessions, which nothing tells an observer.
 */
#include "pg_int.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dlock__pg_proclaim(void *st, dlock__lease *l, const char *desc,
                       int64_t op_deadline)
{
    pg_store *ps = st;
    char token[24];
    PGresult *r;
    int rc;

    snprintf(token, sizeof(token), "%llu", (unsigned long long)l->token);
    const char *vals[4] = {l->name, l->owner, token, desc};
    int lens[4] = {(int)l->name_len, 0, 0, 0};
    rc = dlock__pg_run_pooled(ps, S_PROCLAIM, vals, lens, op_deadline, &r,
                              "writing the leader's value");
    if (rc)
        return rc;
    int changed = !strcmp(PQcmdTuples(r), "1");
    PQclear(r);
    return changed ? DLOCK_OK : dlock__pg_not_ours(ps);
}

/* The election channel of `name`: "dlock_e_" and 16 hex digits. */
static void chan_of(const pg_store *ps, const char *name, size_t len,
                    char out[32])
{
    size_t tl = strlen(ps->table);
    char *both = malloc(tl + 1 + len);
    uint64_t h;

    if (both) {
        memcpy(both, ps->table, tl);
        both[tl] = '\0';
        memcpy(both + tl + 1, name, len);
        h = dlock__hash(both, tl + 1 + len);
        free(both);
    } else {
        h = dlock__hash(name, len) ^ dlock__hash(ps->table, tl);
    }
    snprintf(out, 32, "dlock_e_%016llx", (unsigned long long)h);
}

int dlock__pg_ring(void *st, const char *name, size_t len,
                   int64_t op_deadline)
{
    pg_store *ps = st;
    char chan[32], sql[64];
    pg_conn *cn;
    PGresult *r = NULL;
    int rc;

    chan_of(ps, name, len, chan);
    snprintf(sql, sizeof(sql), "NOTIFY %s", chan);
    rc = dlock__pg_conn_get(ps, op_deadline, &cn);
    if (rc)
        return rc;
    rc = dlock__pg_run_text(ps, cn, sql, op_deadline, &r,
                            "telling the election's observers");
    PQclear(r);
    dlock__pg_conn_put(ps, cn);
    return rc;
}

typedef struct pg_watch {
    pg_conn *cn; /* ours: LISTENs on the channel */
} pg_watch;

int dlock__pg_watch_open(void *st, const char *name, size_t len, void **out,
                         int64_t op_deadline)
{
    pg_store *ps = st;
    char chan[32], sql[64];
    pg_watch *w;
    PGresult *r = NULL;
    int rc;

    *out = NULL;
    if (!ps->sessions)
        return dlock__err(DLOCK_ENOTSUP,
                          "postgres %s: an observer LISTENs, which a "
                          "pooler in transaction mode does not keep",
                          ps->redacted);
    if (!(w = calloc(1, sizeof(*w))))
        return dlock__pg_enomem();
    chan_of(ps, name, len, chan);
    snprintf(sql, sizeof(sql), "LISTEN %s", chan);
    rc = dlock__pg_conn_own(ps, op_deadline, &w->cn);
    if (rc == DLOCK_OK)
        rc = dlock__pg_run_text(ps, w->cn, sql, op_deadline, &r,
                                "watching the election");
    PQclear(r);
    if (rc) {
        dlock__pg_conn_free(w->cn);
        free(w);
        return rc;
    }
    *out = w;
    return DLOCK_OK;
}

int dlock__pg_watch_wait(void *st, void *wp, int64_t deadline, int cancel_fd)
{
    pg_store *ps = st;
    pg_watch *w = wp;
    PGconn *pg = w->cn->pg;

    for (;;) {
        PGnotify *nt;
        int got = 0;

        while ((nt = PQnotifies(pg))) {
            got = 1;
            PQfreemem(nt);
        }
        if (got)
            return DLOCK_OK;
        int64_t now = dlock__now_ms();
        if (now >= deadline)
            return DLOCK_EBUSY;
        int64_t left = deadline - now;
        struct pollfd p[2] = {{PQsocket(pg), POLLIN, 0},
                              {cancel_fd, POLLIN, 0}};
        int n = poll(p, cancel_fd >= 0 ? 2 : 1,
                     left > INT_MAX ? INT_MAX : (int)left);
        if (n < 0 && errno != EINTR)
            return dlock__err(DLOCK_ECONN, "postgres %s: poll: %s",
                              ps->redacted, strerror(errno));
        if (n > 0 && cancel_fd >= 0 && (p[1].revents & POLLIN))
            return DLOCK_EBUSY;
        if (n > 0 && p[0].revents &&
            (!PQconsumeInput(pg) || PQstatus(pg) != CONNECTION_OK))
            return dlock__err(DLOCK_ECONN,
                              "postgres %s: the observer's connection "
                              "ended",
                              ps->redacted);
    }
}

void dlock__pg_watch_close(void *st, void *wp)
{
    pg_watch *w = wp;

    (void)st;
    if (!w)
        return;
    dlock__pg_conn_free(w->cn); /* its LISTEN goes with it */
    free(w);
}
