/* SPDX-License-Identifier: MIT */
/*
 * sqlite_operate.c -- an operator's view of the SQLite store (sqlite_int.h):
 * dlock_list() and dlock_break() (docs/design.md, "Operating: listing and
 * breaking locks" and its "Breaking on SQLite"; docs/monitoring.md), and
 * the reading of a lock's row and waiters they share with dlock_inspect()
 * (sqlite.c).
 *
 *  - List: one SELECT per page over the lock table's primary key, the
 *    rows after the cursor's name within the prefix's range of names
 *    (names are BLOBs, compared as bytes: a range, never LIKE), at most
 *    `limit` of them, each read with dlock_inspect()'s columns and its
 *    waiters counted in the sidecar as dlock_inspect() counts them. The
 *    cursor is the last row read, hex-encoded: a page reads at most
 *    `limit` rows whatever it keeps (without DLOCK_LIST_FREE, the rows
 *    held or waited for), so a page of a table of mostly free rows may
 *    hold few locks, or none, and still have a next one.
 *  - Break: one transaction in the writers' turn reads the row as
 *    dlock_inspect() does and, when held, clears every hold, keeping the
 *    token (and a semaphore's N); an exclusive holder's ticket becomes the
 *    mark that lets its successor pass it. Then it rings the doorbell a
 *    release would have: the lowest ticket's (a holder without a ticket,
 *    readers, permits), or the successor's of the evicted ticket.
 */
#include "sqlite_int.h"

#include "cursor.h"
#include "hex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Cursors (cursor.h; fuzz/fuzz_sqlite.c)                                   */
/* ------------------------------------------------------------------------ */

/* The longest row name a cursor can stand for: the core passes cursors
 * of at most 4096 characters. Rows of dlock's have names of at most
 * DLOCK_NAME_MAX bytes; a longer one is another program's. */
#define CURSOR_MAX 2048

/* ------------------------------------------------------------------------ */
/* A lock's row, as dlock_inspect() (sqlite.c), list and break read it      */
/* ------------------------------------------------------------------------ */

#define SQ_WAITERS_COUNTED 100000

void dlock__sq_info_row(sqlite3_stmt *s, dlock_info *out, int64_t *rowid,
                        int *shared)
{
    out->token = (uint64_t)sqlite3_column_int64(s, SQ_COL_TOKEN);
    *rowid = sqlite3_column_int64(s, SQ_COL_ROWID);
    *shared = sqlite3_column_int(s, SQ_COL_SHARED);
    if (sqlite3_column_int(s, SQ_COL_HELD) &&
        (!*shared || sqlite3_column_int64(s, SQ_COL_LIVE) > 0)) {
        const unsigned char *h = sqlite3_column_text(s, SQ_COL_HOLDER);
        out->held = 1;
        out->holders = 1;
        snprintf(out->holder, sizeof(out->holder), "%s",
                 h ? (const char *)h : "");
        out->ttl_ms = sqlite3_column_int64(s, SQ_COL_TTL);
        out->held_ms = sqlite3_column_int64(s, SQ_COL_FOR);
        if (*shared) /* readers or permits: their live entries */
            dlock__sq_inspect_shared(s, out);
    } else {
        *shared = 0;
        /* kept when free */
        out->permits = sqlite3_column_int64(s, SQ_COL_PERMITS);
    }
}

void dlock__sq_info_waiters(sq_store *ss, int64_t rowid, int shared,
                            dlock_info *out)
{
    /* the queue is in the kernel: every held ticket but the holder's,
     * when the holder has one (not when it took the lock with nobody
     * queued: then the head marks the region; readers and permits keep
     * none). The kernel knows no kinds: the waiters have no
     * descriptions. */
    int64_t n = dlock__sqw_count(ss->sidefd, rowid, SQ_WAITERS_COUNTED);
    int64_t mine = out->held && !shared &&
                   !dlock__sqw_marked(ss->sidefd, rowid);

    out->waiters = n > mine ? n - mine : 0;
    dlock__sqw_foreign(ss->sidefd, rowid, ss->side, out->foreign,
                       sizeof(out->foreign));
}

/* ------------------------------------------------------------------------ */
/* dlock_list()                                                             */
/* ------------------------------------------------------------------------ */

/* The statements of list and break, prepared on their first use (most
 * clients never list). ss->mu held. */
static int operate_ready(sq_store *ss)
{
    int rc;

    if (ss->operate)
        return DLOCK_OK;
    rc = dlock__sq_prepare_operate(ss, ss->t);
    if (rc)
        return rc;
    ss->operate = 1;
    return DLOCK_OK;
}

int dlock__sq_list(void *st, const char *prefix, size_t plen,
                   const char *cursor, size_t limit, unsigned flags,
                   dlock_list_page *out, int64_t op_deadline)
{
    sq_store *ss = st;
    unsigned char after[CURSOR_MAX], up[DLOCK_NAME_MAX];
    size_t alen, ulen = dlock__prefix_upper(prefix, plen, up), seen = 0;
    char *last = malloc(2 * CURSOR_MAX + 1);
    sqlite3_stmt *s;
    int rc, which = ulen ? S_LIST_UP : S_LIST;

    (void)op_deadline;
    if (!last)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    last[0] = '\0';
    if (dlock__cursor_decode(cursor, CURSOR_MAX, after, &alen) != 0) {
        free(last);
        return dlock__err(DLOCK_EINVAL,
                          "sqlite %s: the cursor is not one this store made "
                          "(the hex digits of a lock name)",
                          ss->redacted);
    }
    pthread_mutex_lock(&ss->mu);
    rc = operate_ready(ss);
    s = rc ? NULL : ss->st[which];
    if (s) {
        /* BLOBs: an empty one compares below every name */
        sqlite3_bind_blob(s, 1, after, (int)alen, SQLITE_STATIC);
        sqlite3_bind_blob(s, 2, prefix, (int)plen, SQLITE_STATIC);
        sqlite3_bind_int64(s, 3, (int64_t)limit);
        if (ulen)
            sqlite3_bind_blob(s, 4, up, (int)ulen, SQLITE_STATIC);
    }
    /* one read of the table (a statement's snapshot: each row is one
     * moment of its lock); the sidecar's count of each row's waiters is
     * its own moment, as in dlock_inspect() */
    while (rc == DLOCK_OK) {
        int r = sqlite3_step(s);
        if (r == SQLITE_DONE)
            break;
        if (r != SQLITE_ROW) {
            rc = dlock__sq_error(ss, "listing the locks");
            break;
        }
        const void *name = sqlite3_column_blob(s, SQ_COL_NAME);
        int nlen = sqlite3_column_bytes(s, SQ_COL_NAME);
        dlock_info info;
        int64_t rowid = 0;
        int shared = 0;

        seen++;
        if (nlen > CURSOR_MAX) {
            rc = dlock__err(DLOCK_EPROTO,
                            "sqlite %s: the lock table has a row whose "
                            "name is longer than %d bytes (not dlock's): "
                            "cannot list past it",
                            ss->redacted, CURSOR_MAX);
            break;
        }
        if (nlen > 0 && name)
            dlock__hex(name, (size_t)nlen, last);
        if (nlen <= 0 || nlen > DLOCK_NAME_MAX || !name ||
            memchr(name, 0, (size_t)nlen))
            continue; /* no lock has that name: another program's row */
        memset(&info, 0, sizeof(info));
        info.ttl_ms = -1;
        info.held_ms = -1;
        dlock__sq_info_row(s, &info, &rowid, &shared);
        if (rowid > 0)
            dlock__sq_info_waiters(ss, rowid, shared, &info);
        if (!(flags & DLOCK_LIST_FREE) && !info.held && info.waiters <= 0)
            continue;
        rc = dlock__list_add(out, name, (size_t)nlen, &info);
    }
    if (s)
        dlock__sq_done(ss, which);
    pthread_mutex_unlock(&ss->mu);
    /* a full page: more may follow, from the last row read */
    if (rc == DLOCK_OK && seen >= limit && last[0])
        out->next = last;
    else
        free(last);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* dlock_break()                                                            */
/* ------------------------------------------------------------------------ */

/* Ends the break's transaction: COMMIT (`commit`) or ROLLBACK. */
static int txn_end(sq_store *ss, int commit)
{
    if (sqlite3_exec(ss->db, commit ? "COMMIT" : "ROLLBACK", NULL, NULL,
                     NULL) == SQLITE_OK)
        return DLOCK_OK;
    int rc = dlock__sq_error(ss, commit ? "committing the break"
                                        : "rolling the break back");
    /* a failed COMMIT leaves the transaction open: close it */
    if (commit && !sqlite3_get_autocommit(ss->db))
        sqlite3_exec(ss->db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
}

int dlock__sq_evict(void *st, const char *name, size_t len, dlock_info *out,
                    int64_t op_deadline)
{
    sq_store *ss = st;
    sqlite3_stmt *s;
    int64_t rowid = 0, ticket = 0;
    int rc, row = 0, shared = 0, cleared = 0;

    (void)op_deadline;
    pthread_mutex_lock(&ss->mu);
    rc = operate_ready(ss);
    if (rc == DLOCK_OK)
        rc = dlock__sq_turn(ss, "breaking the lock");
    if (rc) {
        pthread_mutex_unlock(&ss->mu);
        return rc;
    }
    /* the read and the clearing in one write transaction: nothing comes
     * between what *out says and what is cleared */
    if (sqlite3_exec(ss->db, "BEGIN IMMEDIATE", NULL, NULL, NULL) !=
        SQLITE_OK) {
        rc = dlock__sq_error(ss, "breaking the lock");
        dlock__sq_turn_end(ss);
        pthread_mutex_unlock(&ss->mu);
        return rc;
    }
    s = ss->st[S_INSPECT];
    sqlite3_bind_blob(s, 1, name, (int)len, SQLITE_STATIC);
    rc = dlock__sq_step(ss, S_INSPECT, &row, "reading the lock");
    if (rc == DLOCK_OK && row) {
        dlock__sq_info_row(s, out, &rowid, &shared);
        ticket = sqlite3_column_int64(s, SQ_COL_TICKET);
    }
    dlock__sq_done(ss, S_INSPECT);
    if (rc == DLOCK_OK && out->held) {
        s = ss->st[S_EVICT];
        sqlite3_bind_blob(s, 1, name, (int)len, SQLITE_STATIC);
        if (sqlite3_step(s) != SQLITE_DONE)
            rc = dlock__sq_error(ss, "breaking the lock");
        else
            cleared = sqlite3_changes(ss->db) == 1;
        dlock__sq_done(ss, S_EVICT);
    }
    if (rc == DLOCK_OK)
        rc = txn_end(ss, cleared);
    else
        (void)txn_end(ss, 0);
    dlock__sq_turn_end(ss);
    pthread_mutex_unlock(&ss->mu);
    if (rc)
        return rc;
    if (rowid > 0)
        dlock__sq_info_waiters(ss, rowid, shared, out);
    if (!cleared)
        return DLOCK_ENOTHELD;
    /* wake as the release would have: the successor of the evicted
     * ticket (which its mark now lets pass it), or the head (a holder
     * without a ticket, readers, permits keep none) */
    dlock__sqw_ring_after(ss->sidefd, &ss->ch, ss->side_dev, ss->side_ino,
                          rowid,
                          !shared && ticket > 0 ? ticket : 0);
    return DLOCK_OK;
}
