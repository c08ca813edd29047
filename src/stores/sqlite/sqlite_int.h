/* SPDX-License-Identifier: MIT */
/*
 * sqlite_int.h -- what the SQLite store's parts share: sqlite.c, the store
 * (the lock table, its statements, the backend's slots); sqlite_acquire.c,
 * an acquisition's statements and queue; sqlite_perm.c, the sidecar and
 * the channels' directory (creation, modes, ?group=); sqlite_rw.c, its
 * shared holds and semaphores (their statements, the table's columns for
 * them); sqlite_operate.c, dlock_list() and dlock_break(); sqlite_wait.c,
 * its waits in the kernel through the sidecar file `<db>-dlock`
 * (docs/design.md, "SQLite: waking waiters" and "Shared holds and
 * permits"); and sqlite_conn.c, below them all, the connection: its
 * statements (run in the writers' turn), busy handler and errors.
 */
#ifndef DLOCK_SQLITE_INT_H
#define DLOCK_SQLITE_INT_H

#include "store.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

/* A lock name's region of the sidecar: byte 0 guards ticket taking,
 * byte t (1 .. SQW_TICKETS - 1) is held by the owner of ticket t. */
#define SQW_REGION_SHIFT 32
#define SQW_TICKETS ((off_t)1 << SQW_REGION_SHIFT)
#define SQW_REGIONS ((int64_t)1 << 30) /* rowids above wrap around */
/* Region 0 is no lock's (rowids start at 1). Its byte 1 is the writers'
 * turn: every statement that writes takes it (a write lock, woken by the
 * kernel) before SQLite's own write lock, so that dlock's clients never
 * meet in SQLite's busy handler, which sleeps and retries. */
#define SQW_WRITER 1
/* The region's last byte is no ticket: a head that waits for a holder
 * without a ticket holds it shared ("the holder is not in the queue"). */
#define SQW_MARK (SQW_TICKETS - 1)

/* One acquisition's kernel side: its own open file description of the
 * sidecar (OFD locks belong to it), its ticket and wake-up channel. */
typedef struct sq_wait {
    int fd;         /* the sidecar, or -1 */
    const struct sq_chans *ch; /* where its channels are made */
    int lfd;        /* the ticket's channel (listener), or -1 */
    int bfd;        /* the ticket's doorbell (datagrams), or -1 */
    dev_t dev;      /* the sidecar's identity, for channel names */
    ino_t ino;
    int64_t region; /* the name's rowid */
    off_t base;     /* region's first byte */
    off_t ticket;   /* ticket byte, or -1 */
    int cfd;        /* the wait's dlock_cancel() eventfd, or -1 */
} sq_wait;

/* Where the wake-up channels live: path-named sockets in the directory
 * `<db>-dlock.d` (0700, or 03770 with ?group=), reached through
 * /proc/self/fd/<dirfd>/ (no path-length limit, no symbolic link
 * followed after the open), or through the directory's path when /proc
 * is missing and it is short enough. prefix "" (dirfd -1): no channels
 * (every wait goes to the kernel on bytes, a head to lease ends). */
typedef struct sq_chans {
    int dirfd;
    int group;        /* ?group=: sockets are made 0660 (the directory is
                       * sticky: nobody else can swap them) */
    char prefix[64];  /* "/proc/self/fd/N" or the directory's path */
} sq_chans;

/* What a wait on a predecessor ended with (SQW_RUNG: our doorbell rang:
 * a break may have evicted the predecessor, look at the row). */
enum { SQW_TIMEOUT, SQW_HANDED, SQW_LEFT, SQW_RUNG };

/* Opens the sidecar at `path` (sqlite_perm.c; no symbolic link; a
 * regular file), creating it with `mode` (0600, or 0660 and group `gid`;
 * gid -1: none).
 * One of ours is given exactly that mode and group (tightened when an
 * older dlock made it wider). Another user's is used only with a gid,
 * when it has that group and gives nothing to other users: else -1 with
 * errno EPERM and its owner and mode in *st. Its descriptor, or -1 with
 * errno set. */
int dlock__sqw_open(const char *path, mode_t mode, gid_t gid, dev_t *dev,
                    ino_t *ino, struct stat *st);

/* Takes a ticket in w->region on w->fd and locks its byte, making its
 * channel (for its successors) and doorbell (for a predecessor without a
 * channel to ring) first. 0 or an errno: ETIMEDOUT when byte 0 (held by
 * a taker for a few system calls) stays held until `until` or a cancel
 * through w->cfd (a process outside dlock holding it); EAGAIN when
 * another process holds the ticket's byte (outside dlock: dlock's
 * takers take tickets under byte 0). Only acquisitions that find a queue
 * or the lock busy take one. */
int dlock__sqw_take(sq_wait *w, int64_t until);

/* Does anyone hold (or take) a ticket in the region of `rowid`, as seen
 * through fd (which holds none)? One system call: the uncontended
 * acquisition's only one before its statement. */
int dlock__sqw_queued(int fd, int64_t rowid);

/* Rings the doorbell of the lowest ticket in the region of `rowid` (the
 * release of a hold taken without a ticket), through fd (holding none),
 * the sidecar `dev`/`ino`. */
void dlock__sqw_ring_head(int fd, const sq_chans *ch, dev_t dev, ino_t ino,
                          int64_t rowid);


/* The highest ticket below w's still held, or -1 (w is the head). */
off_t dlock__sqw_pred(const sq_wait *w);

/* Is ticket byte p held by another open file? */
int dlock__sqw_held(const sq_wait *w, off_t p);

/* Number of tickets held in the region of `rowid`, as seen through fd
 * (which holds none), at most `max`. */
int64_t dlock__sqw_count(int fd, int64_t rowid, int64_t max);

/* A lock that a process outside dlock holds on the writers' turn or on
 * the region of `rowid` (a read lock, or one over several bytes: dlock
 * takes write locks on single bytes there), as seen through fd: its
 * description into out (cap bytes), naming the sidecar `side`; out is
 * left alone when there is none. */
void dlock__sqw_foreign(int fd, int64_t rowid, const char *side, char *out,
                        size_t cap);

/* A trusted connection to the channel of ticket byte p (its listener has
 * our uid and p is still held after connecting), or -1. */
int dlock__sqw_connect(const sq_wait *w, off_t p);

/* Sleeps until the predecessor p (on connection c, or in the kernel on
 * p's byte when c < 0) hands over or leaves, our doorbell rings (with c
 * only), or until `until`. SQW_* or a negative errno. */
int dlock__sqw_wait(const sq_wait *w, int c, off_t p, int64_t until);

/* A head whose holder has no ticket it can see: sleeps on w's doorbell
 * (the holder's release rings it) until `until`. SQW_LEFT (rung: try
 * again), SQW_TIMEOUT, or a negative errno. */
int dlock__sqw_bell(const sq_wait *w, int64_t until);

/* Rings the doorbell of the lowest ticket above ticket number `after`
 * (0: the lowest of all) in the region of `rowid`, through fd (holding
 * none): what a release of the hold with that ticket does when its
 * successor is not connected, done by dlock_break(). */
void dlock__sqw_ring_after(int fd, const sq_chans *ch, dev_t dev,
                           ino_t ino, int64_t rowid, int64_t after);

/* Is the mark of the region of `rowid` held (a head waits for a holder
 * without a ticket), as seen through fd? */
int dlock__sqw_marked(int fd, int64_t rowid);

/* Sleeps until `until` (nothing to wait on). */
void dlock__sqw_sleep(int64_t until, int cfd);

/* Drops w's ticket and channel and closes their descriptors; returns the
 * sidecar's, unlocked, for the caller to keep or close. `wake`: the
 * lock was held and is now free in the table: the successor connected to
 * the channel gets one byte and the CPU. Without one connected, the next
 * ticket's doorbell is rung (a give-up too: it looks again). */
int dlock__sqw_drop(sq_wait *w, int wake);

/* --- the store (sqlite.c) ------------------------------------------------ */

/* Its prepared statements. */
enum {
    S_ROWID,
    S_MAKE,
    S_TAKE,       /* a writer's take */
    S_LEASE_LEFT, /* what a take that got nothing reads */
    S_RELEASE,
    S_EXTEND,
    S_INSPECT,
    S_GC,
    S_SH_TAKE,    /* a reader's or a permit's take (sqlite_rw.c) */
    S_SH_RELEASE, /* its release */
    S_SH_EXTEND,  /* its renewal */
    S_LIST,       /* dlock_list()'s page (sqlite_operate.c) */
    S_LIST_UP,    /* the same below an upper bound */
    S_EVICT,      /* dlock_break()'s clearing */
    S_PROCLAIM,   /* leader election (sqlite_elect.c) */
    S_COUNT
};

/* sqlite_elect.c: leader election (backend slots), and the check. */
int dlock__sq_check(void *st, int64_t ttl_ms, dlock_check *out,
                    int64_t op_deadline);
int dlock__sq_proclaim(void *st, dlock__lease *l, const char *desc,
                       int64_t op_deadline);
int dlock__sq_ring(void *st, const char *name, size_t len,
                   int64_t op_deadline);
int dlock__sq_watch_open(void *st, const char *name, size_t len, void **w,
                         int64_t op_deadline);
int dlock__sq_watch_wait(void *st, void *w, int64_t deadline, int cancel_fd);
void dlock__sq_watch_close(void *st, void *w);

/* The columns of dlock_inspect()'s row (S_INSPECT, S_LIST*). */
enum {
    SQ_COL_HELD,    /* the lease runs */
    SQ_COL_HOLDER,  /* the holder's description */
    SQ_COL_TOKEN,
    SQ_COL_TTL,     /* ms left */
    SQ_COL_FOR,     /* ms held */
    SQ_COL_ROWID,   /* the name's region of the sidecar */
    SQ_COL_SHARED,  /* held by readers or permits, live */
    SQ_COL_PERMITS, /* a semaphore's N */
    SQ_COL_LIVE,    /* live read holds or permits */
    SQ_COL_DESC,    /* a live one's description */
    SQ_COL_TICKET,  /* the exclusive holder's ticket (0: none; < 0: the
                     * mark of a broken holder's) */
    SQ_COL_NAME
};

#define SQ_SPARE_MAX 8
/* How long a try (wait 0) waits at most for what another client holds for
 * a moment (the writers' turn, a region's byte 0, the database): dlock's
 * clients hold them for one statement or a few system calls. */
#define SQ_TRY_MS 100
#define SQ_TABLE_MAX 128

typedef struct sq_store {
    sqlite3 *db;
    char t[2 * SQ_TABLE_MAX + 8]; /* the table, quoted */
    int operate;       /* the statements of list and break are prepared */
    char *redacted;
    char *side;   /* the sidecar's path */
    mode_t mode;  /* what dlock makes: 0600, or 0660 with ?group= */
    gid_t gid;    /* ?group='s, or -1 */
    sq_chans ch;  /* the wake-up channels' directory */
    int sidefd;   /* the sidecar, for dlock_inspect() and the looks of
                   * acquisitions without a ticket (holds no lock) */
    dev_t side_dev; /* its identity, for channel names */
    ino_t side_ino;
    /* sidecar descriptors of finished acquisitions, unlocked, for the next
     * ones (an open file description each: OFD locks are its own) */
    int spare[SQ_SPARE_MAX];
    int nspare;
    pthread_mutex_t spare_mu; /* spare, nspare (not mu: a statement may
                               * hold that one for a while) */
    int64_t timeout_ms;
    int64_t deadline; /* the running statement's end, if before the
                       * client's timeout; 0: none (mu) */
    int cfd;          /* the running acquisition's dlock_cancel() eventfd,
                       * or -1 (mu) */
    int acq;          /* the running statement is an acquisition's: its
                       * deadline or cancel ends it with DLOCK_EBUSY (mu) */
    int64_t busy_since; /* SQLite's busy handler's first call (mu) */
    pthread_mutex_t mu;
    sqlite3_stmt *st[S_COUNT];
    int64_t returned; /* the one value a writing statement returned (mu) */
} sq_store;

/* sqlite.c: an UPDATE guarded by owner and token (statement `which`; ?4
 * ttl_ms for S_EXTEND, else `text` when not NULL): DLOCK_OK, ENOTHELD,
 * or an error. */
int dlock__sq_guarded(sq_store *ss, int which, const dlock__lease *l,
                      int64_t ttl_ms, const char *text, int64_t deadline,
                      const char *what);

typedef struct sq_lease {
    sq_wait w;
    int64_t bound; /* the acquisition's statements and kernel waits end by
                    * then (its deadline, at least SQ_TRY_MS after its
                    * start); 0: the client's timeout only */
    /* a reader's or a permit's: '*' and its owner (a sole holder's
     * owner column), the JSON paths of its entry, its token and its end
     * (sqlite_rw.c) */
    char star[72], path[80], path0[84], path1[84], bare[80];
} sq_lease;

/* SQLite's clock, in milliseconds and microseconds since the epoch */
#define SQ_NOW_MS "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
#define SQ_NOW_US                                                           \
    "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"

/* --- the connection (sqlite_conn.c) -------------------------------------- */

/* Prepares statement `which` from fmt, where every %1$s is the (quoted)
 * table t and every %2$s SQLite's clock in ms. */
int dlock__sq_prepare(sq_store *ss, int which, const char *fmt,
                      const char *t);
/* Runs a prepared statement to its first row (*row 1) or to its end (0),
 * one that writes in the writers' turn and to its end (its one row's
 * first column in ss->returned); dlock__sq_done() resets it. */
int dlock__sq_step(sq_store *ss, int which, int *row, const char *what);
void dlock__sq_done(sq_store *ss, int which);

/* The writers' turn (sqlite_conn.c says why), taken and let go around a
 * transaction of several statements (dlock_break()'s). */
int dlock__sq_turn(sq_store *ss, const char *what);
void dlock__sq_turn_end(sq_store *ss);

/* An error of the connection, with its message: the DLOCK_* code. */
int dlock__sq_error(sq_store *ss, const char *what);

/* Bounds the statements run next by `deadline` too (SQLite's busy
 * handler and the writers' turn), besides the client's timeout; 0 lifts
 * it. ss->mu held. (A renewal ends by its at-risk moment: design.md.) */
void dlock__sq_bound(sq_store *ss, int64_t deadline);

/* SQLite's busy handler, set on the connection at open (arg: the
 * sq_store): 1 to let SQLite try again, 0 to end the statement. */
int dlock__sq_busy(void *arg, int count);

/* --- an acquisition (sqlite_acquire.c) ----------------------------------- */

/* The backend's acquire slot. */
int dlock__sq_acquire(void *st, dlock__lease *l, int64_t op_deadline);

/* --- the files beside the database (sqlite_perm.c) ----------------------- */

/* A failed system call on the sidecar (or its channels' directory): the
 * DLOCK_* code, with its message. */
int dlock__sq_side_error(sq_store *ss, const char *what, int e);

/* Makes the database file `path` when missing, with ss->mode and ss->gid
 * (before SQLite opens it). */
int dlock__sq_db_make(sq_store *ss, const char *path);

/* Opens the sidecar (ss->side) and the channels' directory of database
 * `db`: ss->sidefd, ss->side_dev/side_ino and ss->ch. */
int dlock__sq_side_open(sq_store *ss, const char *db);

/* A sidecar descriptor for one acquisition (a spare one, or a new one;
 * -1 with errno), and back to the spares once it holds no lock. */
int dlock__sq_side_get(sq_store *ss, dev_t *dev, ino_t *ino);
void dlock__sq_side_put(sq_store *ss, int fd);

/* --- dlock_list(), dlock_break(), inspect's rows (sqlite_operate.c) ------ */

dlock__list_slot dlock__sq_list;
dlock__evict_slot dlock__sq_evict;

/* Fills *out (zeroed; ttl_ms and held_ms -1) from a row of inspect's
 * columns in s, as dlock_inspect() does; *rowid its region (0: no row
 * data), *shared held by readers or permits. */
void dlock__sq_info_row(sqlite3_stmt *s, dlock_info *out, int64_t *rowid,
                        int *shared);

/* Counts the waiters of region `rowid` into out->waiters, as
 * dlock_inspect() does (the tickets held, less the holder's). */
void dlock__sq_info_waiters(sq_store *ss, int64_t rowid, int shared,
                            dlock_info *out);

/* --- shared holds and semaphores (sqlite_rw.c) --------------------------- */

/* Adds the columns of shared holds (holders, permits) to table t when it
 * lacks them (a table made by an older dlock). An SQLite result code:
 * SQLITE_BUSY means "run it again". */
int dlock__sq_migrate(sqlite3 *db, const char *table, const char *t);

/* Prepares, for the quoted table t, the statements that see the entries
 * of readers and permits: theirs (S_SH_*), the read after a take that got
 * nothing (S_LEASE_LEFT: rowid, ms to the row's next end, live, shared,
 * permits, ticket) and dlock_inspect()'s (S_INSPECT). */
int dlock__sq_prepare_rw(sq_store *ss, const char *t);

/* Prepares dlock_list()'s and dlock_break()'s statements (S_LIST,
 * S_LIST_UP, S_EVICT), on their first use. */
int dlock__sq_prepare_operate(sq_store *ss, const char *t);

/* Binds a reader's or a permit's take (S_SH_TAKE): `join`: it may join
 * a live shared row (the head of the queue, or nobody queued). */
void dlock__sq_bind_take(sq_store *ss, const dlock__lease *l, int64_t rowid,
                         int join);

/* After a take that got nothing (S_LEASE_LEFT's row in s): DLOCK_EINVAL
 * with its message when the live row is of another kind than l's (a
 * semaphore for a writer or a reader; a lock, or another N, for a
 * permit), else DLOCK_OK. */
int dlock__sq_kind_check(const sq_store *ss, const dlock__lease *l,
                         sqlite3_stmt *s);

/* Releases a reader's or a permit's hold. DLOCK_ENOTHELD when it is gone
 * (its lease ended). */
int dlock__sq_release_entry(sq_store *ss, const dlock__lease *l);

/* Renews a reader's or a permit's entry to ttl_ms from now, by
 * `deadline`. */
int dlock__sq_extend_entry(sq_store *ss, const dlock__lease *l,
                           int64_t ttl_ms, int64_t deadline);

/* Fills the shared part of *out from dlock_inspect()'s row in s (the
 * row is live and shared). */
void dlock__sq_inspect_shared(sqlite3_stmt *s, dlock_info *out);


/* The store's table (store.h), named by module.c and, in a build with
 * the store built in, by the core's registry. */
extern const dlock__backend dlock__backend_sqlite;

#endif /* DLOCK_SQLITE_INT_H */
