/* SPDX-License-Identifier: MIT */
/*
 * file_int.h -- what the file store's parts share: file.c, the store (names,
 * files, holder records, the backend's slots); file_wait.c, its waits (in
 * the kernel, and the fair queue's wake-up channels); file_rw.c, its
 * semaphores and the background thread; file_operate.c, dlock_list(); and
 * file_perm.c, who may open the store's files. The file's layout and the
 * locks on it are described in file.c.
 */
#ifndef DLOCK_FILE_INT_H
#define DLOCK_FILE_INT_H

#include "chan.h"
#include "kwait.h"
#include "perm.h"
#include "store.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

/* the lock file's layout (file.c) */
#define MAIN_BYTE 0
#define META_BYTE 1
#define GATE_BYTE 2 /* held by a waiting writer: new readers stop here */
#define PERMIT_BASE ((off_t)1 << 16) /* a semaphore's permit i */
#define READER_BASE ((off_t)1 << 62) /* a reader's slot (counted) */
#define READER_SLOTS ((off_t)1 << 32)
#define SEM_OFFSET 48 /* a semaphore's N (uint32_t), under META */
/* A semaphore's head waits in the kernel (a helper thread each) for at
 * most that many holders without a channel at once */
#define SEM_KWAIT_MAX 32
#define SEM_PERMITS_MAX 256 /* file store: a waiter keeps one connection
                             * per permit held */
#define REC_OFFSET 64 /* the holder record; its first field the fence */
#define QUEUE_BASE ((off_t)1 << 32)
#define QUEUE_END ((off_t)1 << 62)
#define SALT_OFFSET 16
#define SALT_LEN 16
#define FNAME_MAX 240 /* a lock file's name, at most */
/* The wake-up channels' directory in the store's (a lock file's name
 * never starts with '.'), made with the store's directory mode: WAKE_DIR
 * "u<uid>" (a store of one user's files) or "g<gid>" (a group store) */
#define WAKE_DIR ".dlock-wake-"
/* A fair ticket's channel is named after its number modulo this: a
 * crashed waiter leaves at most that many socket files per lock file */
#define CHAN_TICKET_NAMES 4096
/* A wait for the META byte (held by others for a few system calls) lasts
 * at least this long, so that a try (--wait 0) does not report busy
 * because another acquirer was deciding; a process outside dlock that
 * keeps META delays it that long at most */
#define META_GRACE_MS 20
/* dlock_inspect()'s holder when a lock on the file is not a dlock
 * holder's (F_OFD_GETLK tells no pid of an OFD lock; what the store keeps
 * of its holders tells) */
#define FOREIGN_READ "a process outside dlock holds a read lock on this file"
/* Successors' connections the background thread accepts ahead of the
 * release, per channel (more wait in the backlog for the release). */
#define READY_MAX 4

static const char magic[8] = {'D', 'L', 'O', 'C', 'K', 'F', '1', '\n'};

typedef struct file_lease file_lease;

typedef struct file_store {
    char *dir;
    int dirfd;
    int private_dir; /* ?private=1: the default store's checks */
    /* Who may open what dlock creates (docs/stores.md, "Who can open a
     * lock file"): by default only us (files 0600, directories 0700);
     * with ?group=NAME that group too (0660 and 02770, gid NAME). */
    int group;
    gid_t gid;
    mode_t fmode, dmode;
    /* WAKE_DIR, where the wake-up channels' sockets live (O_PATH; -1:
     * none, every wait is in the kernel) */
    int wdir;
    int64_t pid; /* for holder records (a client is not used after fork) */
    /* The client's background thread accepts successors' connections to
     * our fair channels ahead of the release (dlock__file_loop_run()): epfd
     * watches the listeners of the leases in `watched`; mu guards that
     * list and every watched lease's `ready`. */
    int epfd;
    pthread_mutex_t mu;
    file_lease *watched;
} file_store;

struct file_lease {
    int fd;
    int lfd; /* the fair ticket's wake-up channel (listener), or -1 */
    int cfd; /* the connection a fair wait ended on, or -1 */
    dev_t dev;
    ino_t ino;
    /* successors' connections accepted ahead (under file_store.mu) */
    int ready[READY_MAX];
    int nready;
    int lsem;     /* lfd is a permit's: unlinked before the byte is freed */
    int watching; /* lfd is in file_store.epfd */
    int listed;   /* in file_store.watched (under file_store.mu) */
    file_lease *wnext, *wprev;
    char fname[FNAME_MAX + 8];
};

/* What the store asks of a file: statx() without the timestamps. Asking
 * for them (stat(), fstat()) makes the next write to the file stamp it
 * with a fine-grained time (Linux 6.13's multigrain timestamps), which
 * doubles the cost of the holder's record write on the hand-off path. */
typedef struct file_id {
    dev_t dev;
    ino_t ino;
    uint64_t size;
    mode_t mode;
    uid_t uid;
    gid_t gid;
} file_id;

/* One open lock file, as a fair waiter sees it. */
typedef struct lock_file {
    int fd;
    dev_t dev;
    ino_t ino;
    unsigned char salt[SALT_LEN]; /* all zero: no channels */
    int wdir;   /* file_store.wdir */
    int anyuid; /* a group store: a listener of any uid is trusted (only
                 * the group can write WAKE_DIR) */
} lock_file;

/* The lowest byte in [lo, hi) locked by another open file, or -1.
 * F_OFD_GETLK reports *a* conflicting lock, not the lowest, so the range
 * below the one reported is halved until none is below: O(log(hi - lo))
 * calls. Walking [lo, hi) from it (next from b + 1) visits every lock. */
static inline off_t lowest_held(int fd, off_t lo, off_t hi)
{
    off_t b = dlock__ofd_first(fd, lo, hi);

    while (b > lo) {
        off_t mid = lo + (b - lo) / 2, c;
        if (mid > lo && (c = dlock__ofd_first(fd, lo, mid)) >= 0) {
            b = c;
            continue;
        }
        lo = mid;
        c = dlock__ofd_first(fd, lo, b);
        if (c < 0)
            break;
        b = c;
    }
    return b;
}

/* --- file.c ------------------------------------------------------------- */

/* A failed system call on a lock file as a dlock code with a message
 * (file_perm.c). */
int dlock__file_io_error(const char *what, const char *fname, int err);
/* CLOCK_REALTIME in microseconds (fencing tokens, holder records). */
static inline int64_t dlock__file_wall_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* --- file_wait.c --------------------------------------------------------- */

/* Takes MAIN for `type` (F_WRLCK: a writer; F_RDLCK: a reader) through
 * the gate that keeps writers from starving: a writer that must wait
 * holds GATE while it waits for MAIN, and a reader that finds GATE held
 * waits there. 0: taken; EAGAIN: busy and `deadline` has passed (a try);
 * ETIMEDOUT; or an errno. */
int dlock__file_take(int fd, short type, int64_t deadline,
                                 int cfd, int64_t *woken_us);

/* Takes the META byte's write lock: at once, or waiting (in the kernel,
 * never polling) until `deadline` (but META_GRACE_MS at least) or a cancel
 * through cfd. 0, ETIMEDOUT (the deadline or the cancel) or an errno. */
int dlock__file_meta_lock(int fd, int64_t deadline, int cfd);

/* Takes a fair-queue ticket and locks its byte, making its wake-up
 * channel first (*lfd; -1: none); sets f->salt. The ticket's byte, or -1
 * with *what ("lock", "write") and *err (an errno; ETIMEDOUT: META stayed
 * held past the deadline, or a cancel). */
off_t dlock__file_take_ticket(lock_file *f, int64_t deadline, int cfd,
                              int *lfd, const char **what, int *err);

/* Waits, as the owner of ticket byte `ticket`, until f->fd holds MAIN
 * (or the deadline, or a cancel through cfd). 0, ETIMEDOUT or an errno. *conn: a connection left open (or -1), for
 * the caller to close. */
int dlock__file_fair_wait(const lock_file *f, off_t ticket, int64_t deadline,
                          int cfd, int *conn, int head_only);

/* A wake-up channel's listener for a fair ticket's byte or a permit's
 * byte (its descriptor; -1: the name is taken by a live listener; -2:
 * none can be made), and a connection to one (our uid only, but any in a
 * group store; -1: none; the caller checks that the byte is still held
 * after connecting). A stale socket file (a crashed owner's) is replaced. */
int dlock__file_chan_listen(const lock_file *f, off_t byte);
int dlock__file_chan_connect(const lock_file *f, off_t byte);

/* --- file_rw.c ---------------------------------------------------------- */

/* A semaphore's permit (l->kind DLOCK__PERMIT) on the open lock file
 * fl->fd (f: its identity and salt): one try when `once`, else waits in
 * the fair queue until l->deadline. DLOCK_OK (l->token set; fl->lfd the
 * permit's channel), DLOCK_EBUSY, or an error (message set). */
int dlock__file_sem_acquire(file_store *fs, file_lease *fl, lock_file *f,
                            dlock__lease *l, int once);
/* dlock_inspect() of a semaphore: fills permits and holders when the file
 * says it is one (N at SEM_OFFSET). */
void dlock__file_sem_inspect(int fd, dlock_info *out);

/* Has the client's background thread accept successors' connections to
 * fl->lfd ahead of the release (watch_add), and stops that, handing over
 * what it accepted (watch_end: their number, into out[READY_MAX]), then
 * drops the listener from its set (watch_forget, before it is closed).
 * watch_open/watch_close make and free the store's part. */
void dlock__file_watch_open(file_store *fs);
void dlock__file_watch_close(file_store *fs);
void dlock__file_watch_add(file_store *fs, file_lease *fl);
int dlock__file_watch_end(file_store *fs, file_lease *fl, int *out);
void dlock__file_watch_forget(file_store *fs, file_lease *fl);

/* The backend's loop_fd and loop_run slots (the background thread). */
int dlock__file_loop_fd(void *st);
void dlock__file_loop_run(void *st, int readable);

/* file.c: the lock file's name of a lock name (FNAME_MAX + 8 bytes);
 * the store's view of one lock (the inspect slot); the lock name kept in
 * a file's holder record (DLOCK_NAME_MAX bytes; DLOCK_ENOTHELD: none) */
void dlock__file_name(const char *name, size_t len, char *out);

/* file_elect.c: leader election's ring and watch (backend slots); file.c
 * the proclaim, and the pid in the holder record of lock file `fname`
 * while its lock is held exclusively (0: not, or unreadable). */
int64_t dlock__file_holder_pid(file_store *fs, const char *fname);
int dlock__file_ring(void *st, const char *name, size_t len,
                     int64_t op_deadline);
int dlock__file_obs_open(void *st, const char *name, size_t len,
                           void **w, int64_t op_deadline);
int dlock__file_obs_wait(void *st, void *w, int64_t deadline,
                           int cancel_fd);
void dlock__file_obs_close(void *st, void *w);
dlock__inspect_slot dlock__file_inspect;
int dlock__file_inspect_fname(file_store *fs, const char *fname,
                              dlock_info *out);
int dlock__file_rec_name(file_store *fs, const char *fname, char *name,
                         size_t *len);

/* --- file_perm.c --------------------------------------------------------- */

/* A lock file an acquirer opened (fd; id: its statx; `created`: by this
 * call): ours is given the store's mode and group; another user's is
 * refused unless the store is a group's and the file is that group's and
 * closed to others. DLOCK_OK or an error (message set). */
int dlock__file_own(file_store *fs, int fd, const char *fname,
                    const file_id *id, int created);
/* mkdir -p of the store's directory: what it makes gets fs->dmode (and
 * the group). */
int dlock__file_make_dirs(file_store *fs, const char *path);
/* Opens (making it if missing) WAKE_DIR into fs->wdir (-1: none can be
 * made, waits are the kernel's); DLOCK_EAUTH when one there may be
 * written by others. */
int dlock__file_open_wake_dir(file_store *fs);
/* ?private=1: opens the directory `path` (absolute), walked from / and
 * checked on the way, made if missing (docs/stores.md, "The default
 * store"); *out its descriptor. */
int dlock__file_open_private(const char *path, int *out);

/* file_operate.c: the list slot */
dlock__list_slot dlock__file_list;


/* The store's table (store.h), named by module.c and, in a build with
 * the store built in, by the core's registry. */
extern const dlock__backend dlock__backend_file;

#endif /* DLOCK_FILE_INT_H */
