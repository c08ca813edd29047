/* SPDX-License-Identifier: MIT */
/*
 * sqlite.c -- the SQLite store: the seeds' database lock table, in one
 * database file shared by the processes of one host.
 *
 *  - One row per lock name in table T (default dlock_locks): owner,
 *    holder description, hold count, fencing token, locked_at and
 *    lock_until (milliseconds of SQLite's own clock). Rows are never
 *    deleted on release, so the token counter survives it.
 *  - Acquire is one statement: an UPDATE that takes the row over only
 *    when its lease has ended (released rows have lock_until 0), raising
 *    the token, RETURNING it. No row back = busy. A token is
 *    max(previous + 1, SQLite's clock in µs): it grows per name, and a
 *    name whose row dlock_gc() removed starts again above its old tokens.
 *    The row is made once per client and name (its rowid names the
 *    name's region of the sidecar, below).
 *  - Release and extend are one UPDATE each, guarded by owner and token.
 *  - Readers and permits (sqlite_rw.c): a sole holder in the row's own
 *    columns, then one entry each in the row's `holders`, with its own
 *    lease end; lock_until is the latest one, so the writer's statement
 *    above sees the name held while any of them may hold it. A reader or
 *    permit keeps no ticket: the head of the queue that gets in drops its
 *    ticket with the wake-up byte, so the readers at the head get in one
 *    after another; the release that leaves no reader (or frees a
 *    permit) rings the head.
 *  - Waiting (sqlite_wait.c; docs/design.md, "SQLite: waking waiters"):
 *    an acquirer that finds nobody queued runs the statement alone; one
 *    that finds a queue or the lock busy takes a ticket in the sidecar
 *    file `<db>-dlock` (OFD byte locks; once it waits, a Unix socket
 *    channel and a doorbell) and runs the acquire statement only as the
 *    head of that queue, woken by its predecessor's release (or the ring
 *    of a holder without a ticket); a waiter sends no statement while it waits,
 *    except at the holder's lease end (a frozen or dead holder). So both
 *    modes are first come, first served: DLOCK_FAIR changes nothing.
 *    The backend waits by itself (CAP_NATIVE_WAIT) and reports when its
 *    successful statement started (lease.started).
 *  - One connection per client, WAL journal, busy timeout = the client's
 *    timeout; a mutex serialises the client's threads on it. Each
 *    acquisition opens the sidecar once more: OFD locks belong to an open
 *    file, so that two threads of one process exclude each other.
 */
#include "sqlite_int.h"
#include "perm.h"
#include "opt.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SQ_DEFAULT_TABLE "dlock_locks"

#define NOW_US SQ_NOW_US

/* "name" with embedded quotes doubled: any table name is one identifier. */
static void quote_ident(const char *in, char *out, size_t cap)
{
    size_t o = 0;

    out[o++] = '"';
    for (; *in && o + 3 < cap; in++) {
        if (*in == '"')
            out[o++] = '"';
        out[o++] = *in;
    }
    out[o++] = '"';
    out[o] = '\0';
}

static void sq_close(void *st)
{
    sq_store *ss = st;

    if (!ss)
        return;
    for (int i = 0; i < S_COUNT; i++)
        sqlite3_finalize(ss->st[i]);
    sqlite3_close(ss->db);
    if (ss->sidefd >= 0)
        close(ss->sidefd);
    if (ss->ch.dirfd >= 0)
        close(ss->ch.dirfd);
    for (int i = 0; i < ss->nspare; i++)
        close(ss->spare[i]);
    pthread_mutex_destroy(&ss->spare_mu);
    pthread_mutex_destroy(&ss->mu);
    free(ss->redacted);
    free(ss->side);
    free(ss);
}

static int sq_open(void **out, dlock_client *c, const dlock__uri *u,
                   int64_t timeout_ms)
{
    static const char *const params[] = {"table", "timeout", "group", NULL};
    const char *table;
    const char *group = dlock__uri_param(u, "group");
    gid_t gid = (gid_t)-1;
    const char *t;
    char ddl[2048];
    sq_store *ss;
    int rc;

    (void)c;
    rc = dlock__uri_check_params(u, params);
    if (rc)
        return rc;
    if (u->nhosts != 0 || u->user || u->path[0] != '/' || u->path[1] == '\0')
        return dlock__err(DLOCK_EINVAL, "sqlite URI %s: expected "
                                        "sqlite:///path/to/file.db "
                                        "(three slashes, no host)",
                          u->redacted);
    if ((rc = dlock__opt_table("sqlite", u, SQ_DEFAULT_TABLE, SQ_TABLE_MAX,
                               &table)) ||
        (rc = dlock__opt_timeout("sqlite", u, &timeout_ms)))
        return rc;
    if (group) { /* the file store's ?group= (file_perm.c) */
        char what[400];
        snprintf(what, sizeof(what), "sqlite URI %.300s: parameter group",
                 u->redacted);
        if ((rc = dlock__perm_group(what, group, 0, &gid)) != DLOCK_OK)
            return rc;
    }
    ss = calloc(1, sizeof(*ss));
    if (!ss || !(ss->redacted = strdup(u->redacted)) ||
        !(ss->side = malloc(strlen(u->path) + 8))) {
        if (ss)
            free(ss->redacted);
        free(ss);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    sprintf(ss->side, "%s-dlock", u->path);
    ss->sidefd = -1;
    ss->ch.dirfd = -1;
    ss->cfd = -1;
    ss->gid = gid;
    /* what dlock makes gives other users nothing; ?group= shares it with
     * the group's members */
    ss->mode = gid != (gid_t)-1 ? 0660 : 0600;
    pthread_mutex_init(&ss->mu, NULL);
    pthread_mutex_init(&ss->spare_mu, NULL);
    ss->timeout_ms = timeout_ms;
    if ((rc = dlock__sq_db_make(ss, u->path)) != DLOCK_OK) {
        sq_close(ss);
        return rc;
    }
    if (sqlite3_open_v2(u->path, &ss->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                            SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE,
                        NULL) != SQLITE_OK) {
        rc = ss->db ? dlock__sq_error(ss, "opening the database")
                    : dlock__err(DLOCK_ENOMEM, "out of memory");
        sq_close(ss);
        return rc;
    }
    sqlite3_busy_handler(ss->db, dlock__sq_busy, ss);
    quote_ident(table, ss->t, sizeof(ss->t));
    t = ss->t;
    /* synchronous=NORMAL: in WAL mode a commit is not fsync'ed (a
     * checkpoint is); a process crash loses nothing, a system crash may
     * lose the last commits. Every holder and waiter is on this host and
     * dies with it, leases are on the wall clock and tokens are at least
     * the clock in µs, so what is lost is only locks nobody holds any
     * more; FULL would put an fsync (~100 µs here) in every hand-off. */
    snprintf(ddl, sizeof(ddl),
             "PRAGMA journal_mode=WAL;"
             "PRAGMA synchronous=NORMAL;"
             "CREATE TABLE IF NOT EXISTS %s ("
             " name BLOB PRIMARY KEY,"
             " owner TEXT,"
             " holder TEXT,"
             " holds INTEGER NOT NULL DEFAULT 0,"
             " token INTEGER NOT NULL DEFAULT 0,"
             " locked_at INTEGER NOT NULL DEFAULT 0,"
             " lock_until INTEGER NOT NULL DEFAULT 0,"
             " holders TEXT,"
             " permits INTEGER NOT NULL DEFAULT 0,"
             " ticket INTEGER NOT NULL DEFAULT 0);",
             t);
    /* Clients opening a new database at the same moment: SQLite answers
     * SQLITE_BUSY at once, without its busy handler, to the connection
     * whose lock upgrade would deadlock with another's (the WAL switch,
     * the first CREATE TABLE), and the remedy is to run the statement
     * again. Bounded by the client's timeout (both statements are no-ops
     * once done). A table made by an older dlock gets the columns of
     * shared holds here (sqlite_rw.c), with the same retries. */
    int64_t ddl_end = dlock__now_ms() + timeout_ms;
    int erc;
    for (int i = 0; i < 10000; i++) {
        erc = sqlite3_exec(ss->db, ddl, NULL, NULL, NULL);
        if (erc == SQLITE_OK)
            erc = dlock__sq_migrate(ss->db, table, t);
        if ((erc & 0xff) != SQLITE_BUSY || dlock__now_ms() >= ddl_end)
            break;
        sqlite3_sleep(1 + i % 8);
    }
    if (erc != SQLITE_OK) {
        rc = dlock__sq_error(ss, "creating (or adding columns to) the "
                                 "lock table");
        sq_close(ss);
        return rc;
    }
    /* the sidecar and the channels' directory (sqlite_perm.c) */
    if ((rc = dlock__sq_side_open(ss, u->path)) != DLOCK_OK) {
        sq_close(ss);
        return rc;
    }
    /* ?1 name, ?2 owner, ?3 ttl, ?4 holder, ?5 the rowid we queued under,
     * ?6 our ticket's number in the region (0: none; a break's mark is
     * its negative: docs/design.md, "Breaking on SQLite") */
    if ((rc = dlock__sq_prepare(ss, S_ROWID,
                      "SELECT rowid FROM %1$s WHERE name = ?1", t)) ||
        (rc = dlock__sq_prepare(ss, S_MAKE,
                      "INSERT INTO %1$s (name) VALUES (?1) ON CONFLICT "
                      "(name) DO NOTHING",
                      t)) ||
        (rc = dlock__sq_prepare(ss, S_TAKE,
                      "UPDATE %1$s SET owner = ?2, holder = ?4, holds = 1, "
                      "token = max(token + 1, " NOW_US "), locked_at = "
                      "%2$s, lock_until = %2$s + ?3, holders = NULL, "
                      "permits = 0, ticket = ?6 WHERE name = ?1 AND rowid = "
                      "?5 AND lock_until <= %2$s RETURNING token",
                      t)) ||
        (rc = dlock__sq_prepare(ss, S_RELEASE,
                      "UPDATE %1$s SET owner = NULL, holder = NULL, holds = "
                      "0, lock_until = 0, ticket = 0 WHERE name = ?1 AND "
                      "owner = ?2 AND token = ?3 AND lock_until > %2$s",
                      t)) ||
        (rc = dlock__sq_prepare(ss, S_EXTEND,
                      "UPDATE %1$s SET lock_until = %2$s + ?4 WHERE name = "
                      "?1 AND owner = ?2 AND token = ?3 AND lock_until > "
                      "%2$s",
                      t)) ||
        (rc = dlock__sq_prepare(ss, S_PROCLAIM,
                      "UPDATE %1$s SET holder = ?4 WHERE name = ?1 AND "
                      "owner = ?2 AND token = ?3 AND lock_until > %2$s",
                      t)) ||
        (rc = dlock__sq_prepare(ss, S_GC,
                      "DELETE FROM %1$s WHERE lock_until <= %2$s AND "
                      "locked_at <= %2$s - ?1",
                      t)) ||
        (rc = dlock__sq_prepare_rw(ss, t))) {
        sq_close(ss);
        return rc;
    }
    *out = ss;
    return DLOCK_OK;
}

int dlock__sq_guarded(sq_store *ss, int which, const dlock__lease *l,
                      int64_t ttl_ms, const char *text, int64_t deadline,
                      const char *what)
{
    sqlite3_stmt *s = ss->st[which];
    int rc, row;

    pthread_mutex_lock(&ss->mu);
    if (deadline)
        dlock__sq_bound(ss, deadline);
    sqlite3_bind_blob(s, 1, l->name, (int)l->name_len, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, l->owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, (int64_t)l->token);
    if (which == S_EXTEND)
        sqlite3_bind_int64(s, 4, ttl_ms);
    else if (text)
        sqlite3_bind_text(s, 4, text, -1, SQLITE_STATIC);
    rc = dlock__sq_step(ss, which, &row, what);
    int changed = sqlite3_changes(ss->db);
    dlock__sq_done(ss, which);
    if (deadline)
        dlock__sq_bound(ss, 0);
    pthread_mutex_unlock(&ss->mu);
    if (rc)
        return rc;
    return changed == 1 ? DLOCK_OK
                        : dlock__err(DLOCK_ENOTHELD,
                                     "sqlite %s: the lock row is no longer "
                                     "ours (expired or taken over)",
                                     ss->redacted);
}

/* Is lock l held, by anyone (a read; an error counts as free: a ring
 * too many costs the head one statement, one too few a lease)? */
static int still_held(sq_store *ss, dlock__lease *l)
{
    sqlite3_stmt *s = ss->st[S_LEASE_LEFT];
    int rc, row = 0, held = 0;

    pthread_mutex_lock(&ss->mu);
    sqlite3_bind_blob(s, 1, l->name, (int)l->name_len, SQLITE_STATIC);
    rc = dlock__sq_step(ss, S_LEASE_LEFT, &row, "reading the lease");
    if (rc == DLOCK_OK)
        held = row && sqlite3_column_int(s, 2);
    dlock__sq_done(ss, S_LEASE_LEFT);
    pthread_mutex_unlock(&ss->mu);
    return held;
}

static int sq_release(void *st, dlock__lease *l, int64_t op_deadline)
{
    sq_store *ss = st;
    sq_lease *sl = l->priv;
    int rc;

    (void)op_deadline;
    if (l->kind != DLOCK__WRITE) {
        /* our hold only; the head of the queue (a writer, or a permit
         * waiting for one) can go on once a permit is free, or once no
         * reader is left: ring it (it holds no ticket of ours). Whether
         * a reader is left is read only when someone queued, after our
         * release committed: the last reader to leave reads none */
        rc = dlock__sq_release_entry(ss, l);
        if (rc == DLOCK_OK &&
            (l->kind == DLOCK__PERMIT ||
             (dlock__sqw_queued(ss->sidefd, sl->w.region) &&
              !still_held(ss, l))))
            dlock__sqw_ring_head(ss->sidefd, &ss->ch, ss->side_dev,
                                 ss->side_ino, sl->w.region);
        return rc;
    }
    rc = dlock__sq_guarded(st, S_RELEASE, l, 0, NULL, 0,
                           "releasing the lock");
    /* the row is free (or was not ours): the successor's turn */
    if (sl->w.ticket < 0) {
        dlock__sqw_ring_head(ss->sidefd, &ss->ch, ss->side_dev,
                             ss->side_ino, sl->w.region);
    }
    dlock__sq_side_put(ss, dlock__sqw_drop(&sl->w, 1));
    return rc;
}

static int sq_extend(void *st, dlock__lease *l, int64_t ttl_ms,
                     int64_t op_deadline)
{
    sq_store *ss = st;
    sq_lease *sl = l->priv;
    int rc;

    if (l->kind != DLOCK__WRITE)
        return dlock__sq_extend_entry(st, l, ttl_ms, op_deadline);
    rc = dlock__sq_guarded(st, S_EXTEND, l, ttl_ms, NULL, op_deadline,
                           "extending the lease");
    if (rc == DLOCK_ENOTHELD && sl->w.fd >= 0) {
        /* lost (broken, or taken over after its lease): the ticket goes
         * now, not at a release that a hung owner may never make (its
         * successors would wait on it); they get end of file and look
         * again. The release finds no ticket left. */
        dlock__sq_side_put(ss, dlock__sqw_drop(&sl->w, 0));
    }
    return rc;
}

static int sq_inspect(void *st, const char *name, size_t len,
                      dlock_info *out, int64_t op_deadline)
{
    sq_store *ss = st;
    sqlite3_stmt *s = ss->st[S_INSPECT];
    int64_t rowid = 0;
    int rc, row = 0, shared = 0;

    (void)op_deadline;
    out->ttl_ms = -1;
    out->held_ms = -1;
    pthread_mutex_lock(&ss->mu);
    sqlite3_bind_blob(s, 1, name, (int)len, SQLITE_STATIC);
    rc = dlock__sq_step(ss, S_INSPECT, &row, "reading the lock");
    if (rc == DLOCK_OK && row)
        dlock__sq_info_row(s, out, &rowid, &shared);
    dlock__sq_done(ss, S_INSPECT);
    pthread_mutex_unlock(&ss->mu);
    if (rc == DLOCK_OK && rowid > 0)
        dlock__sq_info_waiters(ss, rowid, shared, out);
    return rc;
}

static int sq_gc(void *st, int64_t idle_ms, uint64_t *removed,
                 int64_t op_deadline)
{
    sq_store *ss = st;
    int rc, row;

    (void)op_deadline;
    pthread_mutex_lock(&ss->mu);
    sqlite3_bind_int64(ss->st[S_GC], 1, idle_ms);
    rc = dlock__sq_step(ss, S_GC, &row, "removing unused locks");
    *removed = rc == DLOCK_OK ? (uint64_t)sqlite3_changes(ss->db) : 0;
    dlock__sq_done(ss, S_GC);
    pthread_mutex_unlock(&ss->mu);
    return rc;
}

const dlock__backend dlock__backend_sqlite = {
    DLOCK__STORE_HEAD,
    .name = "sqlite",
    .caps = DLOCK__CAP_LEASE | DLOCK__CAP_NATIVE_WAIT | DLOCK__CAP_SHARED |
            DLOCK__CAP_PERMITS,
    .lease_size = sizeof(sq_lease),
    .open = sq_open,
    .close = sq_close,
    .acquire = dlock__sq_acquire,
    .release = sq_release,
    .extend = sq_extend,
    .inspect = sq_inspect,
    .gc = sq_gc,
    .list = dlock__sq_list,
    .evict = dlock__sq_evict,
    .check = dlock__sq_check,       /* sqlite_elect.c */
    .proclaim = dlock__sq_proclaim, /* sqlite_elect.c */
    .ring = dlock__sq_ring,
    .watch_open = dlock__sq_watch_open,
    .watch_wait = dlock__sq_watch_wait,
    .watch_close = dlock__sq_watch_close,
};
