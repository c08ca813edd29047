/* SPDX-License-Identifier: MIT */
/*
 * sqlite_acquire.c -- an acquisition on the SQLite store: the name's row
 * and region, the acquire statement, and the wait in the sidecar's queue
 * (sqlite_wait.c) between its tries (docs/design.md, "SQLite: waking
 * waiters").
 */
#include "sqlite_int.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#define SQ_MOVES_MAX 16 /* region changes (gc, VACUUM) in one call */

/* The statements of acquisition l, from here to acq_end(): ended by its
 * bound (sl->bound: its deadline, at least SQ_TRY_MS after its start) or
 * its cancel, with DLOCK_EBUSY. ss->mu held. */
static void acq_begin(sq_store *ss, const dlock__lease *l)
{
    const sq_lease *sl = l->priv;

    ss->deadline = sl->bound;
    ss->cfd = l->cancel_fd;
    ss->acq = 1;
}

static void acq_end(sq_store *ss)
{
    ss->deadline = 0;
    ss->cfd = -1;
    ss->acq = 0;
}

/* The name's rowid (its region of the sidecar), making the row if
 * missing; kept per name in the client (hint[0]). */
static int region_of(sq_store *ss, dlock__lease *l, int64_t *rowid)
{
    int64_t h = __atomic_load_n(&l->hint[0], __ATOMIC_RELAXED);
    int rc = DLOCK_OK, row = 0;

    if (h > 0) {
        *rowid = h;
        return DLOCK_OK;
    }
    pthread_mutex_lock(&ss->mu);
    acq_begin(ss, l);
    for (int i = 0; i < 2 && rc == DLOCK_OK && !row; i++) {
        if (i == 1) {
            sqlite3_bind_blob(ss->st[S_MAKE], 1, l->name, (int)l->name_len,
                              SQLITE_STATIC);
            rc = dlock__sq_step(ss, S_MAKE, &row, "making the lock's row");
            dlock__sq_done(ss, S_MAKE);
            row = 0;
            if (rc)
                break;
        }
        sqlite3_bind_blob(ss->st[S_ROWID], 1, l->name, (int)l->name_len,
                          SQLITE_STATIC);
        rc = dlock__sq_step(ss, S_ROWID, &row, "reading the lock's row");
        if (rc == DLOCK_OK && row)
            *rowid = sqlite3_column_int64(ss->st[S_ROWID], 0);
        dlock__sq_done(ss, S_ROWID);
    }
    acq_end(ss);
    pthread_mutex_unlock(&ss->mu);
    if (rc == DLOCK_OK && !row)
        rc = dlock__err(DLOCK_EPROTO, "sqlite %s: the lock's row vanished "
                                      "as it was made",
                        ss->redacted);
    if (rc == DLOCK_OK)
        __atomic_store_n(&l->hint[0], *rowid, __ATOMIC_RELAXED);
    return rc;
}

/* What one acquire statement found. */
enum { T_TAKEN, T_BUSY, T_MOVED };

/* Reads the row after a take that got nothing (S_LEASE_LEFT): *left, ms
 * to its next end (<= 0 free or ended; a shared row's earliest live
 * entry's end); *mark (may be NULL), the number of the ticket whose hold
 * a break took (0: none); T_MOVED when the row is gone or has another
 * rowid; DLOCK_EINVAL when the live row is of another kind than l's.
 * ss->mu held. */
static int read_row(sq_store *ss, dlock__lease *l, int64_t rowid, int *what,
                    int64_t *left, int64_t *mark)
{
    sqlite3_stmt *s = ss->st[S_LEASE_LEFT];
    int rc, row = 0;

    sqlite3_bind_blob(s, 1, l->name, (int)l->name_len, SQLITE_STATIC);
    rc = dlock__sq_step(ss, S_LEASE_LEFT, &row, "reading the lease");
    *what = T_BUSY;
    if (rc == DLOCK_OK && (!row || sqlite3_column_int64(s, 0) != rowid)) {
        *what = T_MOVED;
    } else if (rc == DLOCK_OK && (rc = dlock__sq_kind_check(ss, l, s)) == 0) {
        *left = sqlite3_column_int64(s, 1);
        if (mark) /* only of a free row: a take clears it */
            *mark = *left <= 0 && sqlite3_column_int64(s, 5) < 0
                        ? -sqlite3_column_int64(s, 5)
                        : 0;
    }
    dlock__sq_done(ss, S_LEASE_LEFT);
    return rc;
}

/* Runs the acquire statement for region `rowid` (a reader or a permit:
 * `join`, it may join a live shared row; a writer: with its ticket `w`,
 * NULL for none, which the row keeps for dlock_break()); on busy reads
 * the row (*left: ms, <= 0 free or ended, INT64_MAX unknown), unless
 * `quick` (a caller about to queue and try again). T_MOVED: the row is
 * gone or has another rowid (dlock gc, VACUUM): queue again. */
static int try_take(sq_store *ss, dlock__lease *l, const sq_wait *w,
                    int64_t rowid, int join, int quick, int *what,
                    int64_t *left)
{
    int which = l->kind == DLOCK__WRITE ? S_TAKE : S_SH_TAKE;
    sqlite3_stmt *s = ss->st[which];
    int rc, row = 0;

    pthread_mutex_lock(&ss->mu);
    acq_begin(ss, l);
    l->started = dlock__now_ms();
    if (which == S_SH_TAKE) {
        dlock__sq_bind_take(ss, l, rowid, join);
    } else {
        sqlite3_bind_blob(s, 1, l->name, (int)l->name_len, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, l->owner, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 3, l->ttl_ms);
        sqlite3_bind_text(s, 4, l->desc, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 5, rowid);
        sqlite3_bind_int64(s, 6, w && w->ticket >= 0
                                     ? (int64_t)(w->ticket - w->base)
                                     : 0);
    }
    rc = dlock__sq_step(ss, which, &row, "taking the lock");
    if (rc == DLOCK_OK && row)
        l->token = (uint64_t)ss->returned;
    dlock__sq_done(ss, which);
    *what = row ? T_TAKEN : T_BUSY;
    if (rc == DLOCK_OK && !row && !quick)
        rc = read_row(ss, l, rowid, what, left, NULL);
    acq_end(ss);
    pthread_mutex_unlock(&ss->mu);
    return rc;
}

/* The lease left of the lock (the read a waiter makes once it is
 * connected to its predecessor): as try_take() without taking. */
static int read_left(sq_store *ss, dlock__lease *l, int64_t rowid, int *what,
                     int64_t *left, int64_t *mark)
{
    int rc;

    pthread_mutex_lock(&ss->mu);
    acq_begin(ss, l);
    rc = read_row(ss, l, rowid, what, left, mark);
    acq_end(ss);
    pthread_mutex_unlock(&ss->mu);
    return rc;
}

/* When a waiter next runs the acquire statement without being woken:
 * the holder's lease end (+1 ms), or, when the lock was free, after its
 * own ttl (a frozen waiter ahead of it holds it up that long at most). */
static int64_t timer_from(const dlock__lease *l, int64_t left)
{
    int64_t now = dlock__now_ms();

    if (left == INT64_MAX || left <= 0)
        return now + l->ttl_ms;
    return now + left + 1;
}

/* One queued acquisition: waits as ticket w->ticket until the acquire
 * statement takes the lock (*as_head: as the head of the queue, not at a
 * timer behind a predecessor), the deadline passes (DLOCK_EBUSY), or the
 * region moved (T_MOVED through *moved). Only the head may join a live
 * shared row: a reader behind a waiter never passes it. */
static int queue_wait(sq_store *ss, dlock__lease *l, sq_wait *w, int once,
                      int *moved, int *as_head)
{
    int64_t timer = -1, left = INT64_MAX, mark = 0;
    off_t conn_p = -1;
    int c = -1, handed = 0, rc = DLOCK_OK, what;

    *moved = 0;
    for (;;) {
        off_t p = handed ? -1 : dlock__sqw_pred(w);
        if (once || p < 0) {
            /* the head (or handed the lock, or trying once) */
            if (c >= 0)
                close(c);
            c = -1;
            conn_p = -1;
            handed = 0;
            *as_head = p < 0;
            rc = try_take(ss, l, w, w->region, p < 0, 0, &what, &left);
            if (rc || what == T_TAKEN)
                break;
            if (what == T_MOVED) {
                *moved = 1;
                break;
            }
            l->retry_ms = left > 0 && left != INT64_MAX ? left : -1;
            if (once || dlock__now_ms() >= l->deadline ||
                dlock__lease_cancelled(l)) {
                rc = DLOCK_EBUSY;
                break;
            }
            if (left <= 0)
                continue; /* freed meanwhile */
            if (dlock__sqw_pred(w) < 0) {
                /* held without a ticket (taken when nobody queued: its
                 * release rings our doorbell), or by one we cannot see
                 * (dead: its lease still runs; another sidecar): until
                 * the ring or its lease end */
                int64_t until = timer_from(l, left);
                int ev = dlock__sqw_bell(w, until < l->deadline
                                                ? until
                                                : l->deadline);
                if (ev < 0) {
                    rc = dlock__err(DLOCK_ECONN, "sqlite %s: waiting on the "
                                                 "wake-up file %.300s: %s",
                                    ss->redacted, ss->side, strerror(-ev));
                    break;
                }
                l->woken_us = dlock__now_us(); /* for the metrics */
                continue;
            }
            timer = timer_from(l, left);
            continue;
        }
        if (p != conn_p) {
            if (c >= 0)
                close(c);
            c = dlock__sqw_connect(w, p);
            conn_p = p;
            if (c < 0 && !dlock__sqw_held(w, p)) {
                conn_p = -1;
                continue; /* left meanwhile: look again */
            }
        }
        if (timer < 0) {
            /* connected first, so that no release is missed; a break
             * that took p's hold marked the row: p holds nothing up */
            rc = read_left(ss, l, w->region, &what, &left, &mark);
            if (rc)
                break;
            if (what == T_MOVED) {
                *moved = 1;
                break;
            }
            if (mark > 0 && mark == (int64_t)(p - w->base)) {
                handed = 1;
                continue;
            }
            timer = timer_from(l, left);
        }
        int64_t until = timer < l->deadline ? timer : l->deadline;
        int ev = dlock__sqw_wait(w, c, p, until);
        if (ev >= 0 && ev != SQW_TIMEOUT)
            l->woken_us = dlock__now_us(); /* for the metrics */
        if (ev < 0) {
            rc = dlock__err(DLOCK_ECONN, "sqlite %s: waiting on the wake-up "
                                         "file %.300s: %s",
                            ss->redacted, ss->side, strerror(-ev));
            break;
        }
        if (ev == SQW_HANDED) {
            handed = 1;
            continue;
        }
        if (ev == SQW_LEFT) {
            close(c);
            c = -1;
            conn_p = -1;
            continue;
        }
        if (ev == SQW_RUNG) {
            /* a break rings the successor of the ticket it evicted: is
             * that p? (a stale ring costs this read) */
            rc = read_left(ss, l, w->region, &what, &left, &mark);
            if (rc)
                break;
            if (what == T_MOVED) {
                *moved = 1;
                break;
            }
            if (mark > 0 && mark == (int64_t)(p - w->base))
                handed = 1;
            else
                timer = timer_from(l, left);
            continue;
        }
        if (dlock__now_ms() >= l->deadline || dlock__lease_cancelled(l)) {
            /* the deadline and a hand-over may come together: a head
             * that finds the lock free takes it */
            if (dlock__sqw_pred(w) < 0) {
                once = 1;
                continue;
            }
            rc = DLOCK_EBUSY;
            break;
        }
        /* the timer: the holder's lease may be over (frozen, dead); not
         * the head, so only a free or ended row */
        *as_head = 0;
        rc = try_take(ss, l, w, w->region, 0, 0, &what, &left);
        if (rc || what == T_TAKEN)
            break;
        if (what == T_MOVED) {
            *moved = 1;
            break;
        }
        timer = timer_from(l, left);
    }
    if (c >= 0)
        close(c);
    return rc;
}

int dlock__sq_acquire(void *st, dlock__lease *l, int64_t op_deadline)
{
    sq_store *ss = st;
    sq_lease *sl = l->priv;
    sq_wait *w = &sl->w;
    int once = l->deadline <= dlock__now_ms();
    int shared = l->kind != DLOCK__WRITE;
    int rc = DLOCK_OK;

    (void)op_deadline;
    l->retry_ms = -1;
    /* every statement and kernel wait of this acquisition ends by its
     * deadline or cancel, whatever another process holds; a try gives
     * another client's statement or ticket taking SQ_TRY_MS */
    if (l->deadline == DLOCK__FOREVER) {
        sl->bound = 0;
    } else {
        int64_t t = dlock__now_ms() + SQ_TRY_MS;
        sl->bound = l->deadline > t ? l->deadline : t;
    }
    for (int i = 0; i < SQ_MOVES_MAX; i++) {
        int64_t rowid = 0;
        int moved = 0, as_head = 0, queued, e;

        rc = region_of(ss, l, &rowid);
        if (rc)
            return rc;
        memset(w, 0, sizeof(*w));
        w->fd = w->lfd = w->bfd = -1;
        w->ch = &ss->ch;
        w->cfd = l->cancel_fd;
        w->ticket = -1;
        w->region = rowid;
        queued = dlock__sqw_queued(ss->sidefd, rowid);
        if (!queued || (shared && once)) {
            /* nobody queued: the statement alone, without a ticket (a
             * hold without one rings the queue's head at its release).
             * A reader's or a permit's try the same, queue or not; with
             * a queue a reader takes only a free name: the queue has no
             * kinds, and a writer may wait in it */
            int what;
            int64_t left = INT64_MAX;
            rc = try_take(ss, l, NULL, rowid,
                          !queued || l->kind == DLOCK__PERMIT, !once, &what,
                          &left);
            if (rc || what == T_TAKEN)
                return rc;
            if (what == T_MOVED) {
                __atomic_store_n(&l->hint[0], 0, __ATOMIC_RELAXED);
                continue;
            }
            if (once) {
                l->retry_ms = left > 0 && left != INT64_MAX ? left : -1;
                return DLOCK_EBUSY;
            }
            /* busy: queue at once (the row is read, and read only, by
             * the try with the ticket: new readers queue behind us the
             * sooner), and try again with a ticket (its doorbell made
             * first: the holder's release rings it) */
        }
        w->fd = dlock__sq_side_get(ss, &w->dev, &w->ino);
        if (w->fd < 0)
            return dlock__sq_side_error(ss, "opening", errno);
        e = dlock__sqw_take(w, sl->bound ? sl->bound : DLOCK__FOREVER);
        if (e) {
            close(w->fd);
            w->fd = -1;
            if (e == ETIMEDOUT) /* the deadline or a cancel */
                return dlock__err(DLOCK_EBUSY, "sqlite %s: a process "
                                               "outside dlock holds the "
                                               "wake-up file %.300s",
                                  ss->redacted, ss->side);
            if (e == EAGAIN)
                return dlock__err(DLOCK_ECONN,
                                  "sqlite %s: a process outside dlock holds "
                                  "a lock on the bytes of lock '%.*s' in the "
                                  "wake-up file %.300s (dlock status shows "
                                  "it)",
                                  ss->redacted,
                                  (int)(l->name_len > 200 ? 200
                                                          : l->name_len),
                                  l->name, ss->side);
            return dlock__sq_side_error(ss, "locking", e);
        }
        rc = queue_wait(ss, l, w, once, &moved, &as_head);
        if (rc == DLOCK_OK && !moved) {
            /* a reader or a permit keeps no ticket: the head passes its
             * role on with the byte (the next reader gets in at once: a
             * chain), one that got in at a timer without it (its
             * successor looks again and waits for the head) */
            if (shared)
                dlock__sq_side_put(ss, dlock__sqw_drop(w, as_head));
            return DLOCK_OK;
        }
        dlock__sq_side_put(ss, dlock__sqw_drop(w, 0));
        if (!moved)
            return rc;
        __atomic_store_n(&l->hint[0], 0, __ATOMIC_RELAXED);
    }
    return dlock__err(DLOCK_EPROTO, "sqlite %s: the lock's row keeps being "
                                    "removed or renumbered; giving up",
                      ss->redacted);
}

