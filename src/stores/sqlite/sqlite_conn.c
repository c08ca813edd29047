/* SPDX-License-Identifier: MIT */
/*
 * sqlite_conn.c -- the SQLite store's connection (sqlite.c opens it,
 * sqlite_int.h is what the files share): its statements, prepared, run
 * in the writers' turn and reset; the bound a deadline puts on them;
 * SQLite's busy handler, which that bound and a cancel end; and its
 * errors, as DLOCK_* codes. Below every other file of the store, which
 * all run their statements here.
 */
#include "sqlite_int.h"
#include "kwait.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#define NOW_MS SQ_NOW_MS

int dlock__sq_error(sq_store *ss, const char *what)
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

/* SQLite's busy handler (another program holding the database: dlock's
 * clients meet in the writers' turn first): it sleeps 1, 2, 5 ... 100 ms
 * and lets SQLite try again, as SQLite's own, but ends at the client's
 * timeout, the running acquisition's bound, or its cancel (whose eventfd
 * it sleeps on). */
int dlock__sq_busy(void *arg, int count)
{
    static const int delays[] = {1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50};
    sq_store *ss = arg;
    int64_t now = dlock__now_ms(), until, d;
    struct pollfd pf;

    if (count == 0)
        ss->busy_since = now;
    until = ss->busy_since + ss->timeout_ms;
    if (ss->deadline && ss->deadline < until)
        until = ss->deadline;
    if (now >= until)
        return 0;
    d = count < (int)(sizeof(delays) / sizeof(delays[0])) ? delays[count]
                                                          : 100;
    if (d > until - now)
        d = until - now;
    pf.fd = ss->cfd;
    pf.events = POLLIN;
    pf.revents = 0;
    if (poll(&pf, 1, (int)d) > 0)
        return 0; /* cancelled */
    return 1;
}

int dlock__sq_prepare(sq_store *ss, int which, const char *fmt,
                      const char *t)
{
    char sql[8192];

    /* every %1$s is the table, %2$s the clock */
    if (snprintf(sql, sizeof(sql), fmt, t, NOW_MS) >= (int)sizeof(sql))
        return dlock__err(DLOCK_EINVAL, "sqlite %s: a statement is too "
                                        "long for the table's name",
                          ss->redacted);
    if (sqlite3_prepare_v3(ss->db, sql, -1, SQLITE_PREPARE_PERSISTENT,
                           &ss->st[which], NULL) != SQLITE_OK)
        return dlock__sq_error(ss, "preparing a statement");
    return DLOCK_OK;
}

/* Takes the writers' turn in the sidecar (SQW_WRITER) before a statement
 * that writes: another client's write waits in the kernel, woken when the
 * turn is free, instead of in SQLite's busy handler (which sleeps and
 * tries again: a renewal that met another client's statement there could
 * sleep past a short lease on a busy machine). Bounded by the client's
 * timeout. Only dlock's clients take turns: another program's writer
 * still meets them in the busy handler. */
int dlock__sq_turn(sq_store *ss, const char *what)
{
    int e;

    if (ss->sidefd < 0 ||
        dlock__ofd_lk(ss->sidefd, F_OFD_SETLK, F_WRLCK, SQW_WRITER, 1) == 0)
        return DLOCK_OK;
    int64_t until = dlock__now_ms() + ss->timeout_ms;
    if (ss->deadline && ss->deadline < until)
        until = ss->deadline;
    if (errno != EAGAIN && errno != EACCES)
        e = errno;
    else /* in the kernel, ended by `until` or the acquisition's cancel */
        e = dlock__kwait(ss->sidefd, F_WRLCK, SQW_WRITER, until,
                              ss->cfd);
    if (e == 0)
        return DLOCK_OK;
    if (e == ETIMEDOUT && ss->acq)
        return dlock__err(DLOCK_EBUSY,
                          "sqlite %s: %s: the writers' turn of the wake-up "
                          "file %.300s stayed held until the deadline "
                          "(dlock status names a holder outside dlock)",
                          ss->redacted, what, ss->side);
    return dlock__err(DLOCK_ECONN,
                      "sqlite %s: %s: %s", ss->redacted, what,
                      e == ETIMEDOUT ? "another client's statement held the "
                                       "database for the whole timeout"
                                     : strerror(e));
}

/* Runs a prepared statement to its first row (SQLITE_ROW), or to the end
 * (SQLITE_DONE), a statement that writes in the writers' turn. Leaves it
 * reset-able by the caller. */
int dlock__sq_step(sq_store *ss, int which, int *row, const char *what)
{
    int writes = which != S_ROWID && which != S_LEASE_LEFT &&
                 which != S_INSPECT && which != S_LIST && which != S_LIST_UP;
    int r, rc;

    if (writes && (rc = dlock__sq_turn(ss, what)) != DLOCK_OK)
        return rc;
    r = sqlite3_step(ss->st[which]);
    *row = r == SQLITE_ROW;
    if (writes && r == SQLITE_ROW) {
        /* a statement that writes and returns its one row: finished here,
         * in the turn. Its transaction commits only when it ends (until
         * then it keeps SQLite's write lock, and the next client in the
         * turn would meet it in the busy handler), and SQLite runs its
         * WAL hook, the auto-checkpoint, only when a step answers
         * SQLITE_DONE: a statement always reset after its row never let
         * the WAL be checkpointed (it grew by a page per statement, and
         * every read slowed down with it: 71 MB in 2 s of readers) */
        ss->returned = sqlite3_column_int64(ss->st[which], 0);
        r = sqlite3_step(ss->st[which]);
    }
    if (writes)
        dlock__sq_turn_end(ss);
    if (r == SQLITE_ROW || r == SQLITE_DONE)
        return DLOCK_OK;
    if ((r & 0xff) == SQLITE_BUSY && ss->acq) {
        /* the busy handler ended at the acquisition's bound or cancel:
         * the wait is over, not the connection */
        return dlock__err(DLOCK_EBUSY, "sqlite %s: %s: the database stayed "
                                       "locked by another program until "
                                       "the deadline",
                          ss->redacted, what);
    }
    return dlock__sq_error(ss, what);
}

void dlock__sq_bound(sq_store *ss, int64_t deadline)
{
    /* the busy handler (sq_busy) and the writers' turn read it */
    ss->deadline = deadline;
}

void dlock__sq_turn_end(sq_store *ss)
{
    if (ss->sidefd >= 0)
        dlock__ofd_lk(ss->sidefd, F_OFD_SETLK, F_UNLCK, SQW_WRITER, 1);
}

void dlock__sq_done(sq_store *ss, int which)
{
    sqlite3_reset(ss->st[which]);
    sqlite3_clear_bindings(ss->st[which]);
}
