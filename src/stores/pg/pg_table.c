/* SPDX-License-Identifier: MIT */
/*
 * pg_table.c -- the PostgreSQL store's table mode (the default): the
 * backend's slots and its struct, dlock__backend_pg (pg.c opens and
 * closes the store for both modes; pg_int.h).
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
#include "pg_int.h"

#include "cursor.h"
#include "hex.h"

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

/* A woken waiter's look at the row, read only (S_CONFIRM; docs/design.md,
 * "PostgreSQL table mode: hand-over", Confirmation): the lock is ours when
 * the row names our owner a live holder of this kind (what the upsert
 * would adopt, and what only a writer of the table can make it say); its
 * lease is then what the row says is left, counted from before the send
 * (the core takes it from l->started), and a hold with less than two
 * thirds of its ttl left goes to the upsert, which lengthens it. Another's
 * while our entry of this session still waits behind a holder: asleep
 * again, the timer the holder's lease left. UNDECIDED otherwise: the
 * upsert decides. `client` and `pid`: the listening session's. */
#define UNDECIDED 1
static int pg_confirm(pg_store *ps, dlock__lease *l, const char *client,
                      const char *pid, int64_t op_deadline)
{
    char waiter[24], kind[16];
    PGresult *r;
    int rc;

    snprintf(waiter, sizeof(waiter), "%llu", (unsigned long long)l->waiter);
    snprintf(kind, sizeof(kind), "%d",
             l->kind == DLOCK__WRITE  ? -1
             : l->kind == DLOCK__READ ? 0
                                      : (int)l->permits);
    const char *vals[6] = {l->name, l->owner, client, waiter, pid, kind};
    int lens[6] = {(int)l->name_len, 0, 0, 0, 0, 0};
    int64_t sent = dlock__now_ms();
    rc = dlock__pg_run_pooled(ps, S_CONFIRM, vals, lens, op_deadline, &r,
                              "looking at the lock");
    if (rc)
        return rc;
    long long token = dlock__pg_col_ll(r, 0, 0, -1);
    long long mine = dlock__pg_col_ll(r, 0, 1, -1);
    long long left = dlock__pg_col_ll(r, 0, 2, -1);
    int queued = dlock__pg_col_ll(r, 0, 3, 0) > 0;
    PQclear(r);
    if (token > 0) {
        if (queued || mine < l->ttl_ms - l->ttl_ms / 3)
            return UNDECIDED;
        l->token = (uint64_t)token;
        l->started = sent + mine - l->ttl_ms;
        return DLOCK_OK;
    }
    if (!queued || left <= 0)
        return UNDECIDED;
    l->retry_ms = left;
    return DLOCK_EBUSY;
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
    /* woken while it waits, queued on this session: a read may settle it
     * (a notification decides nothing) */
    if (l->waiting && pl->queued && client) {
        rc = pg_confirm(ps, l, client, pid, op_deadline);
        if (rc != UNDECIDED)
            return rc;
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

/* The S_INSPECT columns i0..i8 (pg_sql.c, PG_INSPECT_COLS) of row `row`,
 * from column c, into *out; *kinds: readers or permits hold the name
 * (each waiter then gets its kind in front). S_INSPECT, S_LIST and
 * S_BREAK answer them. */
static void fill_row(dlock_info *out, const PGresult *r, int row, int c,
                     int *kinds)
{
    int held = !strcmp(PQgetvalue(r, row, c), "t");
    int form = !strcmp(PQgetvalue(r, row, c + 5), "t");

    out->token = (uint64_t)dlock__pg_col_ll(r, row, c + 2, 0);
    out->permits = dlock__pg_col_ll(r, row, c + 6, 0);
    if (form && held) {
        out->held = 1;
        out->holders = dlock__pg_col_ll(r, row, c + 7, 0);
        out->shared = out->permits == 0;
        *kinds = 1;
        if (out->shared && out->holders > 1)
            snprintf(out->holder, sizeof(out->holder), "%lld readers",
                     (long long)out->holders);
        else
            snprintf(out->holder, sizeof(out->holder), "%s",
                     PQgetvalue(r, row, c + 8));
    } else if (held) {
        out->held = 1;
        out->holders = 1;
        snprintf(out->holder, sizeof(out->holder), "%s",
                 PQgetvalue(r, row, c + 1));
    }
    if (out->held) {
        out->ttl_ms = dlock__pg_col_ll(r, row, c + 3, -1);
        out->held_ms = dlock__pg_col_ll(r, row, c + 4, -1);
    }
}

/* The queue of rows [from, to): from column c its seq (NULL: no waiter
 * in this row), description and kind (S_QUEUE's columns), into
 * out->queue, each waiter's kind in front once readers or permits use
 * the name (kinds, or a waiter's kind). */
static int fill_queue(dlock_info *out, const PGresult *r, int from, int to,
                      int c, int kinds)
{
    int rc = DLOCK_OK;

    for (int i = from; i < to; i++)
        kinds |= !PQgetisnull(r, i, c) && dlock__pg_col_ll(r, i, c + 2, 0);
    for (int i = from; i < to && rc == DLOCK_OK; i++) {
        if (PQgetisnull(r, i, c))
            continue;
        long long k = dlock__pg_col_ll(r, i, c + 2, 0);
        char line[sizeof(out->holder) + 16];
        snprintf(line, sizeof(line), "%s%s",
                 !kinds   ? ""
                 : k == 0 ? "write: "
                 : k == 1 ? "read: "
                          : "permit: ",
                 PQgetvalue(r, i, c + 1));
        rc = dlock__info_add_waiter(out, line);
    }
    out->waiters = (int64_t)out->queue_len;
    return rc;
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
        if (PQntuples(r) == 1 && PQnfields(r) == 9)
            fill_row(out, r, 0, 0, &kinds);
        PQclear(r);
        rc = dlock__pg_run(ps, cn, S_QUEUE, vals, lens, op_deadline, &r,
                           "reading the queue");
    }
    if (rc == DLOCK_OK) {
        if (PQnfields(r) == 3)
            rc = fill_queue(out, r, 0, PQntuples(r), 0, kinds);
        PQclear(r);
    }
    dlock__pg_conn_put(ps, cn);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Operating: dlock_list() and dlock_break()                                */
/* ------------------------------------------------------------------------ */

/* A cursor is "pg:" and the hex of the last name listed (the page after
 * starts past it): names are bytes, and the index orders them as bytes. */
#define CURSOR_TAG "pg:"
#define CURSOR_MAX 2046 /* bytes of a name in a cursor: the core's 4096
                         * characters, less the tag */

/* The name a cursor stands for, into out (CURSOR_MAX bytes): 0, or -1
 * when the cursor is not one this store made. */
static int cursor_read(const char *cursor, char *out, size_t *len)
{
    size_t tl = strlen(CURSOR_TAG);

    if (strncmp(cursor, CURSOR_TAG, tl) != 0 || cursor[tl] == '\0')
        return -1;
    return dlock__cursor_decode(cursor + tl, CURSOR_MAX, out, len);
}

/* The cursor past the name whose hex the statement answered: malloc'd,
 * or NULL (out of memory; hex not a name's). */
static char *cursor_make(const char *hex)
{
    size_t tl = strlen(CURSOR_TAG), n = strlen(hex);
    char *c;

    if (n == 0 || n % 2 || n / 2 > CURSOR_MAX)
        return NULL;
    if (!(c = malloc(tl + n + 1)))
        return NULL;
    memcpy(c, CURSOR_TAG, tl);
    memcpy(c + tl, hex, n + 1);
    return c;
}

/* [lo, hi): the names that start with prefix[0..plen). hi is the prefix
 * with its last byte below 0xff raised by one and what follows dropped;
 * with none (an empty prefix, or only 0xff), 0xff repeated past the
 * longest name, above every name. */
static size_t prefix_end(const char *prefix, size_t plen, char *hi,
                         size_t cap)
{
    size_t n = dlock__prefix_upper(prefix, plen, hi);

    if (n == 0) {
        memset(hi, 0xff, cap);
        return cap;
    }
    return n;
}

/* Rows looked at for a page of `limit` locks: enough that a store with
 * many free rows among the held ones lists in few pages, bounded so that
 * a page is a bounded amount of the server's work. */
static size_t list_window(size_t limit, unsigned flags)
{
    size_t w = 8 * limit;

    if (flags & DLOCK_LIST_FREE)
        return limit; /* every row looked at is listed */
    if (w < 1000)
        w = 1000;
    return w > 80000 ? 80000 : w;
}

/* One lock of S_LIST's answer: rows [from, to) (one a waiter), into the
 * page. */
static int list_one(dlock_list_page *out, const PGresult *r, int from,
                    int to)
{
    const char *hex = PQgetvalue(r, from, 2);
    size_t n = strlen(hex);
    char name[CURSOR_MAX];
    dlock_info info;
    int kinds = 0, rc;

    memset(&info, 0, sizeof(info));
    info.ttl_ms = info.held_ms = info.waiters = -1;
    if (n == 0 || n % 2 || n / 2 > sizeof(name))
        return DLOCK_OK; /* not a name dlock could have made */
    if (dlock__unhex(hex, n / 2, name) != 0)
        return dlock__err(DLOCK_EPROTO, "postgres: a listed name in hex is "
                                        "not hex");
    fill_row(&info, r, from, 3, &kinds);
    rc = fill_queue(&info, r, from, to, 12, kinds);
    if (rc) {
        dlock_info_clear(&info);
        return rc;
    }
    return dlock__list_add(out, name, n / 2, &info);
}

static int pg_list(void *st, const char *prefix, size_t plen,
                   const char *cursor, size_t limit, unsigned flags,
                   dlock_list_page *out, int64_t op_deadline)
{
    pg_store *ps = st;
    char after[CURSOR_MAX], hi[DLOCK_NAME_MAX + 1], win[24], lim[24];
    size_t alen = 0, hlen;
    PGresult *r;
    int rc;

    if (cursor[0] && cursor_read(cursor, after, &alen) != 0)
        return dlock__err(DLOCK_EINVAL,
                          "postgres %s: dlock_list: the cursor is not one "
                          "this store made",
                          ps->redacted);
    hlen = prefix_end(prefix, plen, hi, sizeof(hi));
    size_t window = list_window(limit, flags);
    snprintf(win, sizeof(win), "%zu", window);
    snprintf(lim, sizeof(lim), "%zu", limit);
    const char *vals[7] = {alen ? after : "", prefix, hi, win, lim,
                           flags & DLOCK_LIST_FREE ? "t" : "f",
                           dlock__client_id(ps->client)};
    int lens[7] = {(int)alen, (int)plen, (int)hlen, 0, 0, 0, 0};
    rc = dlock__pg_run_pooled(ps, S_LIST, vals, lens, op_deadline, &r,
                              "listing the locks");
    if (rc)
        return rc;
    /* k, the last name looked at, then per row: the name, its nine
     * S_INSPECT columns, a waiter's seq, description and kind */
    int rows = PQntuples(r);
    if (PQnfields(r) != 15 || rows < 1) {
        PQclear(r);
        return dlock__err(DLOCK_EPROTO, "postgres %s: listing the locks: "
                                        "an answer of another shape",
                          ps->redacted);
    }
    size_t locks = 0;
    for (int i = 0; i < rows && rc == DLOCK_OK; locks++) {
        int j = i + 1;
        if (PQgetisnull(r, i, 2))
            break; /* the look found no lock to list */
        while (j < rows && !strcmp(PQgetvalue(r, j, 2), PQgetvalue(r, i, 2)))
            j++;
        rc = list_one(out, r, i, j);
        i = j;
    }
    if (rc == DLOCK_OK) {
        /* more may follow: the page is full (past its last lock), or the
         * look stopped at its bound (past the last row it saw) */
        const char *next = NULL;
        if (locks >= limit)
            next = PQgetvalue(r, rows - 1, 2);
        else if ((size_t)dlock__pg_col_ll(r, 0, 0, 0) >= window)
            next = PQgetvalue(r, 0, 1);
        if (next && !(out->next = cursor_make(next)))
            rc = strlen(next) / 2 > CURSOR_MAX
                     ? dlock__err(DLOCK_EPROTO,
                                  "postgres %s: a lock name longer than "
                                  "%d bytes in the table: no cursor can "
                                  "pass it",
                                  ps->redacted, CURSOR_MAX)
                     : dlock__pg_enomem();
    }
    PQclear(r);
    return rc;
}

/* dlock_break(): T_break, which takes every hold away and grants the
 * head of the queue, in one statement; *out its view just before. */
static int pg_evict(void *st, const char *name, size_t len, dlock_info *out,
                    int64_t op_deadline)
{
    pg_store *ps = st;
    PGresult *r;
    int rc, kinds = 0;

    rc = dlock__pg_ensure_break(ps, op_deadline);
    if (rc)
        return rc;
    const char *vals[2] = {name, dlock__client_id(ps->client)};
    int lens[2] = {(int)len, 0};
    rc = dlock__pg_run_pooled(ps, S_BREAK, vals, lens, op_deadline, &r,
                              "breaking the lock");
    if (rc)
        return rc;
    /* the nine S_INSPECT columns, the grants, then a waiter's seq,
     * description and kind per row */
    if (PQnfields(r) != 13 || PQntuples(r) < 1) {
        PQclear(r);
        return dlock__err(DLOCK_EPROTO, "postgres %s: breaking the lock: "
                                        "an answer of another shape",
                          ps->redacted);
    }
    fill_row(out, r, 0, 0, &kinds);
    rc = fill_queue(out, r, 0, PQntuples(r), 10, kinds);
    if (out->held && !PQgetisnull(r, 0, 9))
        own_grants(ps, PQgetvalue(r, 0, 9));
    PQclear(r);
    if (rc)
        return rc;
    return out->held ? DLOCK_OK : DLOCK_ENOTHELD;
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
    DLOCK__STORE_HEAD,
    .name = "postgres",
    .caps = DLOCK__CAP_LEASE | DLOCK__CAP_HANDOVER | DLOCK__CAP_WAITER_READS |
            DLOCK__CAP_SHARED | DLOCK__CAP_PERMITS,
    .lease_size = sizeof(pg_lease),
    .open = dlock__pg_open,
    .close = dlock__pg_close,
    .acquire = pg_acquire,
    .arm = pg_arm,
    .disarm = pg_disarm,
    .release = pg_release,
    .extend = pg_extend,
    .inspect = pg_inspect,
    .loop_fd = dlock__pg_loop_fd,
    .loop_run = dlock__pg_loop_run,
    .gc = pg_gc,
    .select = dlock__pg_select,
    .abandon = pg_abandon,
    .list = pg_list,
    .evict = pg_evict,
    .check = dlock__pg_check, /* pg_check.c */
    .proclaim = dlock__pg_proclaim, /* pg_elect.c */
    .ring = dlock__pg_ring,
    .watch_open = dlock__pg_watch_open,
    .watch_wait = dlock__pg_watch_wait,
    .watch_close = dlock__pg_watch_close,
};
