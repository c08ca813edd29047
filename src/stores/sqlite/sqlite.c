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
#include "sqlite.h"
#include "../file/file.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define SQ_DEFAULT_TABLE "dlock_locks"
#define SQ_MOVES_MAX 16        /* region changes (gc, VACUUM) in one call */
#define SQ_WAITERS_COUNTED 100000

#define NOW_MS SQ_NOW_MS
#define NOW_US SQ_NOW_US

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

static int side_error(sq_store *ss, const char *what, int e)
{
    int code = e == EACCES || e == EPERM || e == EROFS ? DLOCK_EAUTH
               : e == ENOMEM                          ? DLOCK_ENOMEM
               : e == ELOOP || e == EINVAL            ? DLOCK_EPROTO
                                                      : DLOCK_ECONN;
    return dlock__err(code, "sqlite %s: %s the wake-up file %.300s: %s%s",
                      ss->redacted, what, ss->side, strerror(e),
                      e == ELOOP || e == EINVAL
                          ? " (a symbolic link or not a regular file)"
                          : "");
}

/* Another user's sidecar or channels' directory that we do not use
 * (dlock__sqw_open()'s EPERM): whose it is and why. */
static int side_refused(sq_store *ss, const char *path, const struct stat *st)
{
    return dlock__err(DLOCK_EAUTH,
                      "sqlite %s: %.300s belongs to uid %u (group %u, mode "
                      "%04o): %s; its owner should remove it (dlock makes it "
                      "again) or give the same ?group= to every client",
                      ss->redacted, path, (unsigned)st->st_uid,
                      (unsigned)st->st_gid, (unsigned)(st->st_mode & 07777),
                      ss->gid == (gid_t)-1
                          ? "another user's file can hold this store's "
                            "waiters up (a store shared between users needs "
                            "?group=)"
                      : st->st_mode & 0007
                          ? "it is open to every user, and any process that "
                            "can open it can hold waiters up"
                          : "it is not of the group this URI names, or not "
                            "sticky");
}

/* ?group=NAME: its gid, when the calling process is a member (its
 * effective or a supplementary group), else DLOCK_EINVAL. */
static int group_of(const dlock__uri *u, const char *name, gid_t *gid)
{
    struct group gr, *res = NULL;
    char buf[4096];
    gid_t *mine;
    int n, r, member = 0;

    if (!name[0])
        return dlock__err(DLOCK_EINVAL, "sqlite URI %s: group= needs a "
                                        "group's name",
                          u->redacted);
    r = getgrnam_r(name, &gr, buf, sizeof(buf), &res);
    if (r != 0 || !res)
        return dlock__err(DLOCK_EINVAL, "sqlite URI %s: no group '%.100s'%s",
                          u->redacted, name,
                          r == ERANGE ? " (its entry is too long)" : "");
    *gid = gr.gr_gid;
    if (*gid == getegid())
        return DLOCK_OK;
    n = getgroups(0, NULL);
    mine = n > 0 ? calloc((size_t)n, sizeof(*mine)) : NULL;
    if (mine) {
        n = getgroups(n, mine);
        for (int i = 0; i < n && !member; i++)
            member = mine[i] == *gid;
        free(mine);
    }
    if (member)
        return DLOCK_OK;
    return dlock__err(DLOCK_EINVAL, "sqlite URI %s: this process is not a "
                                    "member of group '%.100s' (a shared "
                                    "store's files are made for its members)",
                      u->redacted, name);
}

/* Makes the database file when missing, with the store's mode and group
 * (SQLite would make it 0644, and its -wal and -shm take its mode: a
 * reader of -shm can hold SQLite's locks). An existing one is left as it
 * is (docs/stores.md says what a shared one needs). */
static int db_make(sq_store *ss, const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                  ss->mode);

    if (fd < 0)
        return DLOCK_OK; /* there (or not makeable: SQLite says why) */
    if ((ss->gid != (gid_t)-1 && fchown(fd, (uid_t)-1, ss->gid) != 0) ||
        fchmod(fd, ss->mode) != 0) {
        int e = errno;
        close(fd);
        unlink(path);
        return dlock__err(DLOCK_EAUTH, "sqlite %s: giving the new database "
                                       "its group and mode: %s",
                          ss->redacted, strerror(e));
    }
    close(fd);
    return DLOCK_OK;
}

/* The wake-up channels' directory `<db>-dlock.d`: made 0700 (or 03770
 * and the group: sticky, so that no member can swap another's socket),
 * opened without following a symbolic link, and reached through
 * /proc/self/fd (the 108-byte limit of a socket's path then never
 * bites). Ours is given that mode; another user's is used only by a
 * ?group= store, when it is of that group, sticky and closed to other
 * users (its owner could bind any name there). No usable path (no /proc, a long path): no
 * channels, waits go to the kernel's byte locks and lease ends. */
static int chans_open(sq_store *ss, const char *db)
{
    mode_t want = ss->gid != (gid_t)-1 ? 03770 : 0700;
    size_t dl = strlen(db) + 16;
    char *dir = malloc(dl);
    struct stat st;
    int fd, rc = DLOCK_OK;

    ss->ch.dirfd = -1;
    ss->ch.group = ss->gid != (gid_t)-1;
    ss->ch.prefix[0] = '\0';
    if (!dir)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    snprintf(dir, dl, "%s-dlock.d", db);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        rc = side_error(ss, "making the channels' directory of", errno);
        goto out;
    }
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0) {
        rc = side_error(ss, "opening the channels' directory of",
                        errno == ENOTDIR ? ELOOP : errno);
        if (fd >= 0)
            close(fd);
        goto out;
    }
    if (st.st_uid == geteuid()) {
        if ((ss->gid != (gid_t)-1 && st.st_gid != ss->gid &&
             fchown(fd, (uid_t)-1, ss->gid) != 0) ||
            ((st.st_mode & 07777) != want && fchmod(fd, want) != 0)) {
            rc = side_error(ss, "giving its mode to the channels' directory "
                                "of",
                            errno);
            close(fd);
            goto out;
        }
    } else if (ss->gid == (gid_t)-1 || st.st_gid != ss->gid ||
               (st.st_mode & 0007) || !(st.st_mode & S_ISVTX)) {
        rc = side_refused(ss, dir, &st);
        close(fd);
        goto out;
    }
    ss->ch.dirfd = fd;
    /* "<prefix>/<ino>.<rowid>.<t>.r": 16 + 8 + 8 + 5 bytes after it */
    snprintf(ss->ch.prefix, sizeof(ss->ch.prefix), "/proc/self/fd/%d", fd);
    if (access(ss->ch.prefix, X_OK) != 0) {
        if (strlen(dir) < sizeof(ss->ch.prefix) &&
            strlen(dir) + 40 < sizeof(((struct sockaddr_un *)0)->sun_path))
            snprintf(ss->ch.prefix, sizeof(ss->ch.prefix), "%s", dir);
        else
            ss->ch.prefix[0] = '\0';
    }
out:
    free(dir);
    return rc;
}

/* SQLite's busy handler (another program holding the database: dlock's
 * clients meet in the writers' turn first): it sleeps 1, 2, 5 ... 100 ms
 * and lets SQLite try again, as SQLite's own, but ends at the client's
 * timeout, the running acquisition's bound, or its cancel (whose eventfd
 * it sleeps on). */
static int sq_busy(void *arg, int count)
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

static int sq_open(void **out, dlock_client *c, const dlock__uri *u,
                   int64_t timeout_ms)
{
    static const char *const params[] = {"table", "timeout", "group", NULL};
    const char *table = dlock__uri_param(u, "table");
    const char *group = dlock__uri_param(u, "group");
    gid_t gid = (gid_t)-1;
    const char *timeout = dlock__uri_param(u, "timeout");
    const char *t;
    char ddl[2048];
    struct stat sst;
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
    if (!table)
        table = SQ_DEFAULT_TABLE;
    if (!table[0] || strlen(table) > SQ_TABLE_MAX)
        return dlock__err(DLOCK_EINVAL, "sqlite URI %s: the table name must "
                                        "be 1 to %d bytes",
                          u->redacted, SQ_TABLE_MAX);
    if (timeout) {
        long long v;
        if (dlock__parse_int(timeout, 3600000, &v) != 0 || v == 0)
            return dlock__err(DLOCK_EINVAL, "sqlite URI %s: timeout must be "
                                            "milliseconds (1..3600000), not "
                                            "'%s'",
                              u->redacted, timeout);
        timeout_ms = v;
    }
    if (group && (rc = group_of(u, group, &gid)) != DLOCK_OK)
        return rc;
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
    if ((rc = db_make(ss, u->path)) != DLOCK_OK) {
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
    sqlite3_busy_handler(ss->db, sq_busy, ss);
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
    /* the sidecar: 0600, or 0660 and the group (an older dlock gave it
     * the database's mode: ours is tightened); then the channels */
    ss->sidefd = dlock__sqw_open(ss->side, ss->mode, ss->gid, &ss->side_dev,
                                 &ss->side_ino, &sst);
    if (ss->sidefd < 0) {
        rc = errno == EPERM ? side_refused(ss, ss->side, &sst)
                            : side_error(ss, "opening", errno);
        sq_close(ss);
        return rc;
    }
    if ((rc = chans_open(ss, u->path)) != DLOCK_OK) {
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

    if (ss->sidefd < 0 || lk(ss->sidefd, F_OFD_SETLK, F_WRLCK, SQW_WRITER, 1) == 0)
        return DLOCK_OK;
    int64_t until = dlock__now_ms() + ss->timeout_ms;
    if (ss->deadline && ss->deadline < until)
        until = ss->deadline;
    if (errno != EAGAIN && errno != EACCES)
        e = errno;
    else /* in the kernel, ended by `until` or the acquisition's cancel */
        e = dlock__file_kwait(ss->sidefd, F_WRLCK, SQW_WRITER, until,
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

void dlock__sq_turn_end(sq_store *ss)
{
    if (ss->sidefd >= 0)
        lk(ss->sidefd, F_OFD_SETLK, F_UNLCK, SQW_WRITER, 1);
}

void dlock__sq_done(sq_store *ss, int which)
{
    sqlite3_reset(ss->st[which]);
    sqlite3_clear_bindings(ss->st[which]);
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

/* A sidecar descriptor for one acquisition: a spare one, unless its file
 * was removed or replaced since (no more links: open the path again, so
 * that we queue where newcomers do), else a new one. -1 with errno. */
static int side_get(sq_store *ss, dev_t *dev, ino_t *ino)
{
    struct stat st;
    int fd = -1;

    pthread_mutex_lock(&ss->spare_mu);
    if (ss->nspare > 0)
        fd = ss->spare[--ss->nspare];
    pthread_mutex_unlock(&ss->spare_mu);
    if (fd >= 0) {
        if (fstat(fd, &st) == 0 && st.st_nlink > 0) {
            *dev = st.st_dev;
            *ino = st.st_ino;
            return fd;
        }
        close(fd);
    }
    fd = dlock__sqw_open(ss->side, ss->mode, ss->gid, dev, ino, &st);
    if (fd < 0 && errno == EPERM)
        errno = EACCES; /* replaced by another user's since the open */
    return fd;
}

/* Back to the spares (it holds no lock any more), or closed. */
static void side_put(sq_store *ss, int fd)
{
    if (fd < 0)
        return;
    pthread_mutex_lock(&ss->spare_mu);
    if (ss->nspare < SQ_SPARE_MAX) {
        ss->spare[ss->nspare++] = fd;
        fd = -1;
    }
    pthread_mutex_unlock(&ss->spare_mu);
    if (fd >= 0)
        close(fd);
}

static int sq_acquire(void *st, dlock__lease *l, int64_t op_deadline)
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
        w->fd = side_get(ss, &w->dev, &w->ino);
        if (w->fd < 0)
            return side_error(ss, "opening", errno);
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
            return side_error(ss, "locking", e);
        }
        rc = queue_wait(ss, l, w, once, &moved, &as_head);
        if (rc == DLOCK_OK && !moved) {
            /* a reader or a permit keeps no ticket: the head passes its
             * role on with the byte (the next reader gets in at once: a
             * chain), one that got in at a timer without it (its
             * successor looks again and waits for the head) */
            if (shared)
                side_put(ss, dlock__sqw_drop(w, as_head));
            return DLOCK_OK;
        }
        side_put(ss, dlock__sqw_drop(w, 0));
        if (!moved)
            return rc;
        __atomic_store_n(&l->hint[0], 0, __ATOMIC_RELAXED);
    }
    return dlock__err(DLOCK_EPROTO, "sqlite %s: the lock's row keeps being "
                                    "removed or renumbered; giving up",
                      ss->redacted);
}

/* UPDATE guarded by owner and token: DLOCK_OK, ENOTHELD, or an error. */
static int guarded(sq_store *ss, int which, const dlock__lease *l,
                   int64_t ttl_ms, int64_t deadline, const char *what)
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
    rc = guarded(st, S_RELEASE, l, 0, 0, "releasing the lock");
    /* the row is free (or was not ours): the successor's turn */
    if (sl->w.ticket < 0) {
        dlock__sqw_ring_head(ss->sidefd, &ss->ch, ss->side_dev,
                             ss->side_ino, sl->w.region);
    }
    side_put(st, dlock__sqw_drop(&sl->w, 1));
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
    rc = guarded(st, S_EXTEND, l, ttl_ms, op_deadline, "extending the lease");
    if (rc == DLOCK_ENOTHELD && sl->w.fd >= 0) {
        /* lost (broken, or taken over after its lease): the ticket goes
         * now, not at a release that a hung owner may never make (its
         * successors would wait on it); they get end of file and look
         * again. The release finds no ticket left. */
        side_put(ss, dlock__sqw_drop(&sl->w, 0));
    }
    return rc;
}

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
    "sqlite",                                   /* name */
    DLOCK__CAP_LEASE | DLOCK__CAP_NATIVE_WAIT | DLOCK__CAP_SHARED |
        DLOCK__CAP_PERMITS,                     /* caps */
    sizeof(sq_lease),                           /* lease_size */
    sq_open,                                    /* open */
    sq_close,                                   /* close */
    sq_acquire,                                 /* acquire */
    NULL,                                       /* arm */
    NULL,                                       /* disarm */
    sq_release,                                 /* release */
    sq_extend,                                  /* extend */
    sq_inspect,                                 /* inspect */
    NULL,                                       /* loop_fd */
    NULL,                                       /* loop_run */
    sq_gc,                                      /* gc */
    NULL, /* select */
    NULL, /* margin */
    NULL, /* abandon */
    NULL, /* extend_many */
    dlock__sq_list,  /* list */
    dlock__sq_evict, /* evict */
    NULL,            /* evict_unsupported */
    NULL, /* cancel */
    NULL, /* at_risk_max */
};
