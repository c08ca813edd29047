/* SPDX-License-Identifier: MIT */
/*
 * file.c -- the embedded store: one lock file per name in a directory.
 *
 * For many processes on one host, with no server. The lock is an
 * open-file-description (OFD) write lock on byte 0 of the name's file, so:
 *  - it belongs to the open file, not the process: two threads or two
 *    clients of one process exclude each other like two processes do
 *    (classic fcntl locks would not: they are per process);
 *  - the kernel drops it the moment the holder's file is closed, including
 *    when the holder dies. No lease is needed; ttl_ms is accepted and has no
 *    effect; the watchdog has nothing to renew here.
 *  - waiting never polls (file_wait.c): a default-mode waiter waits in the
 *    kernel (F_OFD_SETLKW; with a deadline, in a helper thread cancelled at
 *    the deadline). A fair waiter sleeps, itself, on its predecessor's
 *    wake-up channel (below), or in the kernel when there is none it can
 *    trust.
 *
 * File layout (native byte order; the file never leaves the host):
 *   0   magic "DLOCKF1\n"
 *   8   next fair-queue ticket (written under the META byte lock)
 *   16  16 random bytes naming the fair queue's wake-up channels (written
 *       once, under the META byte lock; all zero: no channels)
 *   64  holder record: fencing counter, acquisition time, holder's
 *       description (written by the holder, under the main lock)
 * Byte-range locks (advisory, independent of the data):
 *   0          MAIN: the lock itself
 *   1          META: guards the ticket counter and the channel salt
 *   2^32 + t   ticket t of a fair waiter, held from joining the queue until
 *              its release. Waiter t may take MAIN only when no ticket
 *              below its own is held; it waits for the highest live one
 *              below, so one release wakes one waiter, in arrival order. A
 *              waiter that gives up or dies drops its byte, and the one
 *              behind it moves up.
 * These locks alone decide who holds the lock and who is next.
 *
 * Fair wake-up channels (docs/design.md, "File store: fair hand-over";
 * file_wait.c): the owner of ticket t listens, from before it locks its
 * ticket byte until after it unlocks it, on the Unix socket file
 * "<salt>-<ino>-f<t mod 4096>" in the store's WAKE_DIR (only the store's
 * user, or group, may write it); its successor connects and sleeps in
 * poll(). The release sends that connection a byte and yields the CPU
 * to the woken successor; a give-up ends the connection; the kernel resets
 * it when the owner dies. A connection is trusted only if the listener has
 * our uid (any, in a group store) and ticket t is still held after
 * connecting. The channels only make waking faster; they never decide
 * anything.
 *
 * Who may open what (file_perm.c; docs/stores.md, "Who can open a lock
 * file"): lock files 0600 and directories 0700, or 0660 and 02770 with
 * ?group=NAME; anyone who can open a file can lock its bytes, so every
 * wait on a byte (META too) ends by its deadline or a cancel.
 *
 * Forks: a child forked while a lock is held (or waited for) shares the
 * open file and the channel; release (and give-up) unlocks the description
 * explicitly and wakes the successor through the connection itself (a
 * byte, or shutdown()), so the child's copy keeps neither the lock nor the
 * successor waiting. But if the holder dies first, the lock lives until
 * the child exits or execs (descriptors are close-on-exec).
 *
 * Lock files are never deleted: deleting a file while someone holds or
 * waits on it would let a newcomer lock a fresh file of the same name. Every
 * acquisition checks, after locking, that the path still names the file it
 * locked, and release reports DLOCK_ELOST if it does not.
 *
 * Fencing token: max(last + 1, wall clock in microseconds), kept in the file
 * and updated under the lock, so it only grows, even across reboots.
 *
 * Shared holds: a read lock on MAIN, through a gate byte that a waiting
 * writer holds (dlock__file_take(), file_wait.c); semaphores: permit bytes
 * (file_rw.c). docs/design.md, "Shared holds and permits".
 */
#include "file_int.h"
#include "fscheck.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#define MAX_WAITERS_COUNTED 100000

typedef struct file_rec {
    uint64_t fence;
    uint64_t acquired_us;
    uint64_t ticket_plus1; /* holder's fair ticket + 1; 0 if none */
    int64_t pid;
    int64_t tid;
    char desc[160];
    uint32_t name_len;
    char name[DLOCK_NAME_MAX + 1];
} file_rec;

/* ------------------------------------------------------------------------ */
/* Names and files                                                          */
/* ------------------------------------------------------------------------ */

/* Maps a lock name (any bytes) to a safe file name: [A-Za-z0-9_.-] kept
 * (but a leading '.'), everything else %XX; a long result is cut and given
 * a hash of the whole name. Two names sharing a file would only exclude
 * each other: never a safety problem. */
void dlock__file_name(const char *name, size_t len, char *out)
{
    size_t o = 0;

    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)name[i];
        int keep = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                   (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' ||
                   (ch == '.' && i > 0);
        if (o + 3 > FNAME_MAX - 24) {
            /* too long: keep what fits, add the hash of the whole name */
            o += (size_t)sprintf(out + o, "~%016llx",
                                 (unsigned long long)dlock__hash(name, len));
            break;
        }
        if (keep)
            out[o++] = (char)ch;
        else
            o += (size_t)sprintf(out + o, "%%%02X", ch);
    }
    memcpy(out + o, ".lock", 6);
}

static int check_magic(int fd, const char *fname)
{
    char buf[8];
    ssize_t n = pread(fd, buf, sizeof(buf), 0);

    if (n < 0)
        return dlock__file_io_error("read", fname, errno);
    if (n == (ssize_t)sizeof(buf) && memcmp(buf, magic, sizeof(buf)) != 0)
        return dlock__err(DLOCK_EPROTO,
                          "file store: %.200s is not a dlock lock file",
                          fname);
    return DLOCK_OK;
}

static int file_stat(int dirfd, const char *path, int flags, file_id *id,
                     int *regular)
{
    struct statx sx;

    if (statx(dirfd, path, flags,
              STATX_TYPE | STATX_MODE | STATX_UID | STATX_GID | STATX_INO |
                  STATX_SIZE,
              &sx) != 0)
        return -1;
    id->dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
    id->ino = (ino_t)sx.stx_ino;
    id->size = sx.stx_size;
    id->mode = sx.stx_mode;
    id->uid = sx.stx_uid;
    id->gid = sx.stx_gid;
    *regular = S_ISREG(sx.stx_mode);
    return 0;
}

/* Opens (creating with O_CREAT) the lock file; *id is its identity.
 * *missing is set when it does not exist (only possible without
 * O_CREAT). With O_CREAT (an acquirer), a new file is made 0600 (never
 * wider, whatever the umask, until dlock__file_own() gives it the store's mode
 * and group) and dlock__file_own() decides. */
static int open_lock_file(file_store *fs, const char *fname, int flags,
                          int *out, file_id *id, int *missing)
{
    int fd = -1, rc, regular = 0, created = 0;

    *missing = 0;
    for (int i = 0; fd < 0 && i < 8; i++) {
        fd = openat(fs->dirfd, fname,
                    (flags & ~O_CREAT) | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd >= 0 || errno != ENOENT || !(flags & O_CREAT))
            break;
        fd = openat(fs->dirfd, fname,
                    flags | O_EXCL | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK,
                    0600);
        created = fd >= 0;
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        *missing = errno == ENOENT;
        return dlock__file_io_error("open", fname, errno);
    }
    if (file_stat(fd, "", AT_EMPTY_PATH, id, &regular) != 0 || !regular) {
        close(fd);
        return dlock__err(DLOCK_EPROTO,
                          "file store: %.200s is not a regular file", fname);
    }
    if ((flags & O_CREAT) &&
        (rc = dlock__file_own(fs, fd, fname, id, created)) != DLOCK_OK) {
        close(fd);
        return rc;
    }
    rc = check_magic(fd, fname);
    if (rc) {
        close(fd);
        return rc;
    }
    *out = fd;
    return DLOCK_OK;
}

/* Does the path still name the file we hold open? */
static int same_file(file_store *fs, const file_lease *fl)
{
    file_id id;
    int regular;

    if (file_stat(fs->dirfd, fl->fname, AT_SYMLINK_NOFOLLOW, &id,
                  &regular) != 0)
        return 0;
    return id.dev == fl->dev && id.ino == fl->ino;
}

/* Gives up a lease's open lock file: unlocks every byte of its open file
 * description first (a forked child may share it), then wakes the fair
 * successors (end of file on each connection), then closes everything. */
static void drop_file(file_store *fs, file_lease *fl)
{
    int ready[READY_MAX], n;

    if (fl->lfd >= 0 && fl->lsem)
        dlock__chan_unlink(fs->wdir, fl->lfd);
    dlock__ofd_lk(fl->fd, F_OFD_SETLK, F_UNLCK, 0, 0);
    n = dlock__file_watch_end(fs, fl, ready);
    for (int i = 0; i < n; i++) {
        /* end of file even if a forked child has a copy of it */
        shutdown(ready[i], SHUT_RDWR);
        close(ready[i]);
    }
    dlock__file_watch_forget(fs, fl);
    if (fl->lfd >= 0)
        dlock__chan_end(fs->wdir, fl->lfd, -1, fl->lsem);
    if (fl->cfd >= 0)
        close(fl->cfd);
    close(fl->fd);
    fl->fd = fl->lfd = fl->cfd = -1;
}

/* ------------------------------------------------------------------------ */
/* Backend slots                                                            */
/* ------------------------------------------------------------------------ */

/* Writes the holder record under the main lock; sets l->token. The magic
 * too when the file had none when it was opened (a new file: one that had
 * it was checked by open_lock_file()). */
static int write_record(file_store *fs, int fd, const char *fname,
                        dlock__lease *l, off_t ticket, int need_magic)
{
    const char *tid = strrchr(l->owner, ':'); /* "<client hex>:<tid>" */
    file_rec r;
    int64_t now = dlock__file_wall_us();

    memset(&r, 0, sizeof(r));
    if (pread(fd, &r, sizeof(r.fence), REC_OFFSET) != (ssize_t)sizeof(r.fence))
        r.fence = 0;
    /* + 2: the readers since the last write hold r.fence + 1 */
    r.fence = r.fence + 2 > (uint64_t)now ? r.fence + 2 : (uint64_t)now;
    r.acquired_us = (uint64_t)now;
    r.ticket_plus1 = ticket >= 0 ? (uint64_t)(ticket - QUEUE_BASE) + 1 : 0;
    r.pid = fs->pid;
    r.tid = tid ? strtoll(tid + 1, NULL, 10) : 0;
    snprintf(r.desc, sizeof(r.desc), "%s", l->desc);
    r.name_len = (uint32_t)l->name_len;
    memcpy(r.name, l->name, l->name_len);
    if ((need_magic &&
         pwrite(fd, magic, sizeof(magic), 0) != (ssize_t)sizeof(magic)) ||
        pwrite(fd, &r, sizeof(r), REC_OFFSET) != (ssize_t)sizeof(r))
        return dlock__file_io_error("write", fname, errno);
    l->token = r.fence;
    return DLOCK_OK;
}

/* A reader's part, under its read lock of MAIN: a slot of its own, so
 * that inspection can count the readers (a slot taken by someone else is
 * passed over; none found after a few leaves the reader uncounted, never
 * unprotected), and its token: the last write's + 1, which orders it
 * after that write and before the next (write_record() adds 2). The magic
 * when the file is new. */
static int read_token(int fd, const char *fname, dlock__lease *l,
                      int need_magic)
{
    uint64_t fence = 0;
    uint64_t slot = dlock__hash(l->owner, strlen(l->owner));

    for (int i = 0; i < 8; i++, slot++) {
        if (dlock__ofd_lk(fd, F_OFD_SETLK, F_WRLCK,
               READER_BASE + (off_t)(slot % (uint64_t)READER_SLOTS), 1) == 0)
            break;
    }
    if (need_magic &&
        pwrite(fd, magic, sizeof(magic), 0) != (ssize_t)sizeof(magic))
        return dlock__file_io_error("write", fname, errno);
    if (pread(fd, &fence, sizeof(fence), REC_OFFSET) != (ssize_t)sizeof(fence))
        fence = 0;
    l->token = fence + 1;
    return DLOCK_OK;
}

/* The lock file that lease fl opened (st: its identity), as the waits
 * and the semaphores take it. */
static void lock_file_of(lock_file *f, const file_store *fs,
                         const file_lease *fl, const file_id *st)
{
    memset(f, 0, sizeof(*f));
    f->fd = fl->fd;
    f->dev = st->dev;
    f->ino = st->ino;
    f->wdir = fs->wdir;
    f->anyuid = fs->group;
}

static int file_acquire(void *vst, dlock__lease *l, int64_t op_deadline)
{
    file_store *fs = vst;
    file_lease *fl = l->priv;
    int fair = (l->flags & DLOCK_FAIR) != 0;
    int reader = l->kind == DLOCK__READ;
    int once = l->deadline <= dlock__now_ms();
    int rc;

    (void)op_deadline;
    dlock__file_name(l->name, l->name_len, fl->fname);
    for (int attempt = 0; attempt < 16; attempt++) {
        file_id st;
        lock_file f;
        off_t ticket = -1;
        int e;

        fl->fd = fl->lfd = fl->cfd = -1;
        fl->watching = fl->listed = fl->lsem = 0;
        rc = open_lock_file(fs, fl->fname, O_RDWR | O_CREAT, &fl->fd, &st,
                            &e);
        if (rc)
            return rc;
        fl->dev = st.dev;
        fl->ino = st.ino;
        if (l->kind == DLOCK__PERMIT) {
            lock_file_of(&f, fs, fl, &st);
            rc = dlock__file_sem_acquire(fs, fl, &f, l, once);
            if (rc == DLOCK_OK && !same_file(fs, fl)) {
                drop_file(fs, fl); /* replaced meanwhile: the new one */
                continue;
            }
            if (rc != DLOCK_OK)
                drop_file(fs, fl);
            if (rc == DLOCK_EBUSY)
                l->retry_ms = -1;
            return rc;
        }
        /* A fair acquirer never jumps the queue: with waiters queued it
         * queues too, even if the lock is free for a moment. Readers and
         * default-mode writers go through the gate (dlock__file_take). */
        int queued = fair && !reader &&
                     dlock__ofd_first(fl->fd, QUEUE_BASE, QUEUE_END) >= 0;
        if (reader || !fair) {
            e = dlock__file_take(fl->fd, reader ? F_RDLCK : F_WRLCK,
                                 once ? 0 : l->deadline, l->cancel_fd,
                                 &l->woken_us);
            if (e == EAGAIN) {
                close(fl->fd);
                l->retry_ms = -1;
                return DLOCK_EBUSY;
            }
        } else if (!queued && dlock__ofd_lk(fl->fd, F_OFD_SETLK, F_WRLCK,
                                            MAIN_BYTE, 1) == 0) {
            e = 0;
        } else if (!queued && errno != EAGAIN && errno != EACCES) {
            e = errno;
        } else if (once) {
            close(fl->fd);
            l->retry_ms = -1;
            return DLOCK_EBUSY;
        } else {
            lock_file_of(&f, fs, fl, &st);
            const char *what = "lock";
            ticket = dlock__file_take_ticket(&f, l->deadline, l->cancel_fd,
                                             &fl->lfd, &what, &e);
            if (ticket < 0) {
                close(fl->fd);
                fl->fd = -1;
                if (e == ETIMEDOUT) {
                    l->retry_ms = -1;
                    return DLOCK_EBUSY;
                }
                return dlock__file_io_error(what, fl->fname, e);
            }
            dlock__file_watch_add(fs, fl);
            e = dlock__file_fair_wait(&f, ticket, l->deadline, l->cancel_fd,
                                      &fl->cfd, 0);
            if (e == 0)
                l->woken_us = dlock__now_us();
        }
        if (e == ETIMEDOUT) {
            drop_file(fs, fl);
            l->retry_ms = -1;
            return DLOCK_EBUSY;
        }
        if (e != 0) {
            drop_file(fs, fl);
            return dlock__file_io_error("lock", fl->fname, e);
        }
        if (!same_file(fs, fl)) {
            /* deleted or replaced while we waited: lock the new one */
            drop_file(fs, fl);
            continue;
        }
        rc = reader ? read_token(fl->fd, fl->fname, l, st.size < 8)
                    : write_record(fs, fl->fd, fl->fname, l, ticket,
                                   st.size < 8);
        if (rc) {
            drop_file(fs, fl);
            return rc;
        }
        return DLOCK_OK;
    }
    return dlock__err(DLOCK_EPROTO,
                      "file store: %.200s keeps being replaced; giving up",
                      fl->fname);
}

static int file_release(void *vst, dlock__lease *l, int64_t op_deadline)
{
    file_store *fs = vst;
    file_lease *fl = l->priv;
    int ready[READY_MAX], n, woke = 0, woken = -1, ours = -1;

    (void)op_deadline;
    /* Does the path still name the file we locked? Asked while we hold
     * it, except when a fair successor waits on our channel: its
     * hand-over must not wait for the answer (a file replaced while held
     * stays replaced). */
    if (fl->lfd < 0)
        ours = same_file(fs, fl);
    /* A permit's channel goes before its byte: the next holder of the
     * byte makes one of the same name (file_wait.c) */
    if (fl->lfd >= 0 && fl->lsem)
        dlock__chan_unlink(fs->wdir, fl->lfd);
    /* Unlock the open file description itself (every byte: the lock and
     * any ticket) before closing: a child forked while we held it shares
     * the description, and close() alone would leave the lock held for as
     * long as that child keeps its copy. */
    dlock__ofd_lk(fl->fd, F_OFD_SETLK, F_UNLCK, 0, 0);
    /* Hand over: a byte to each fair successor whose connection was
     * accepted ahead, else to the one waiting in the listener's backlog;
     * then let it run before anything else: the lock is idle until it
     * does, and a scheduler that put it on this CPU would otherwise make
     * it wait for whatever this thread does next, such as queueing again
     * (docs/design.md). */
    n = dlock__file_watch_end(fs, fl, ready);
    for (int i = 0; i < n; i++)
        woke |= send(ready[i], "", 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1;
    if (!woke && fl->lfd >= 0 &&
        (woken = dlock__chan_wake(fl->lfd)) >= 0)
        woke = 1;
    if (woke)
        sched_yield();
    dlock__file_watch_forget(fs, fl);
    for (int i = 0; i < n; i++)
        close(ready[i]);
    if (fl->lfd >= 0)
        dlock__chan_end(fs->wdir, fl->lfd, woken, fl->lsem);
    if (ours < 0)
        ours = same_file(fs, fl);
    if (fl->cfd >= 0)
        close(fl->cfd);
    close(fl->fd);
    fl->fd = fl->lfd = fl->cfd = -1;
    if (!ours)
        return dlock__err(DLOCK_ENOTHELD,
                          "file store: %.200s was deleted or replaced while "
                          "held",
                          fl->fname);
    return DLOCK_OK;
}

static int file_extend(void *vst, dlock__lease *l, int64_t ttl_ms,
                       int64_t op_deadline)
{
    file_store *fs = vst;

    (void)ttl_ms;
    (void)op_deadline;
    if (!same_file(fs, l->priv))
        return dlock__err(DLOCK_ENOTHELD,
                          "file store: the lock file was deleted or "
                          "replaced while held");
    return DLOCK_OK;
}

int64_t dlock__file_holder_pid(file_store *fs, const char *fname)
{
    file_id st;
    file_rec r;
    int fd, missing;
    int64_t pid = 0;
    short type = F_UNLCK;

    if (open_lock_file(fs, fname, O_RDONLY, &fd, &st, &missing) != DLOCK_OK)
        return 0;
    if (dlock__ofd_conflict(fd, F_WRLCK, MAIN_BYTE, MAIN_BYTE + 1, &type) >=
            0 &&
        type == F_WRLCK &&
        pread(fd, &r, sizeof(r), REC_OFFSET) == (ssize_t)sizeof(r))
        pid = r.pid;
    close(fd);
    return pid;
}

/* Leader election: the holder record's description, rewritten in place
 * by the holder (the lock is ours: nobody else writes the record). */
static int file_proclaim(void *st, dlock__lease *l, const char *desc,
                         int64_t op_deadline)
{
    file_lease *fl = l->priv;
    char d[sizeof(((file_rec *)0)->desc)];

    (void)st;
    (void)op_deadline;
    if (fl->fd < 0 || l->kind != DLOCK__WRITE)
        return dlock__err(DLOCK_ENOTHELD, "file store: not held");
    memset(d, 0, sizeof(d));
    snprintf(d, sizeof(d), "%s", desc);
    if (pwrite(fl->fd, d, sizeof(d), REC_OFFSET + offsetof(file_rec, desc)) !=
        (ssize_t)sizeof(d))
        return dlock__file_io_error("write", fl->fname, errno);
    return DLOCK_OK;
}

int dlock__file_inspect(void *vst, const char *name, size_t len,
                        dlock_info *out, int64_t op_deadline)
{
    char fname[FNAME_MAX + 8];

    (void)op_deadline;
    dlock__file_name(name, len, fname);
    return dlock__file_inspect_fname(vst, fname, out);
}

int dlock__file_inspect_fname(file_store *fs, const char *fname,
                              dlock_info *out)
{
    file_id st;
    file_rec r;
    off_t skip = -1;
    int fd, rc, missing;

    out->waiters = 0;
    rc = open_lock_file(fs, fname, O_RDONLY, &fd, &st, &missing);
    if (rc && missing)
        return DLOCK_OK; /* never used: free, no token yet */
    if (rc)
        return rc;
    memset(&r, 0, sizeof(r));
    if (pread(fd, &r, sizeof(r), REC_OFFSET) < 0) {
        rc = dlock__file_io_error("read", fname, errno);
        close(fd);
        return rc;
    }
    r.desc[sizeof(r.desc) - 1] = '\0';
    out->token = r.fence;
    short type = F_UNLCK;
    out->held = dlock__ofd_conflict(fd, F_WRLCK, MAIN_BYTE, MAIN_BYTE + 1,
                                    &type) >= 0;
    if (out->held && type == F_RDLCK) {
        out->shared = 1;
        for (off_t at = READER_BASE; out->holders < MAX_WAITERS_COUNTED;) {
            off_t b = lowest_held(fd, at, READER_BASE + READER_SLOTS);
            if (b < 0)
                break;
            out->holders++;
            at = b + 1;
        }
        /* every dlock reader keeps a slot (but for the moment between
         * its lock and its slot, or when eight slots in a row were
         * taken): a read lock with none is someone else's */
        if (out->holders == 0)
            snprintf(out->holder, sizeof(out->holder), "%s", FOREIGN_READ);
        else
            snprintf(out->holder, sizeof(out->holder), "%lld reader%s",
                     (long long)out->holders, out->holders == 1 ? "" : "s");
    } else if (out->held) {
        out->holders = 1;
        /* the record is whatever the file holds: no arithmetic on its
         * numbers may overflow (a foreign or damaged file) */
        uint64_t now = (uint64_t)dlock__file_wall_us();
        snprintf(out->holder, sizeof(out->holder), "%s", r.desc);
        out->held_ms = r.acquired_us < now
                           ? (int64_t)((now - r.acquired_us) / 1000)
                           : 0;
        if (r.ticket_plus1 &&
            r.ticket_plus1 <= (uint64_t)(QUEUE_END - QUEUE_BASE))
            skip = QUEUE_BASE + (off_t)(r.ticket_plus1 - 1);
    }
    if (!out->held)
        dlock__file_sem_inspect(fd, out);
    /* dlock only ever write-locks META, for a few system calls: a read
     * lock there is someone else's, and every fair waiter and semaphore
     * acquirer waits for it (until its deadline) */
    type = F_UNLCK;
    if (dlock__ofd_conflict(fd, F_WRLCK, META_BYTE, META_BYTE + 1, &type) >=
            0 &&
        type == F_RDLCK && !out->held) {
        out->held = 1;
        snprintf(out->holder, sizeof(out->holder), "%s", FOREIGN_READ);
    }
    for (off_t at = QUEUE_BASE; out->waiters < MAX_WAITERS_COUNTED;) {
        off_t b = lowest_held(fd, at, QUEUE_END);
        if (b < 0)
            break;
        if (b != skip)
            out->waiters++;
        at = b + 1;
    }
    /* no fair queue: a writer waiting at the gate (default mode; the
     * others wait in the kernel behind it, uncounted) */
    if (out->waiters == 0 &&
        dlock__ofd_conflict(fd, F_RDLCK, GATE_BYTE, GATE_BYTE + 1, NULL) >= 0)
        out->waiters = 1;
    close(fd);
    return DLOCK_OK;
}

int dlock__file_rec_name(file_store *fs, const char *fname, char *name,
                         size_t *len)
{
    file_rec r;
    file_id st;
    int fd = -1, rc, missing;
    ssize_t n;

    rc = open_lock_file(fs, fname, O_RDONLY, &fd, &st, &missing);
    if (rc)
        return rc;
    memset(&r, 0, sizeof(r));
    n = pread(fd, &r, sizeof(r), REC_OFFSET);
    close(fd);
    if (n != (ssize_t)sizeof(r) || r.name_len == 0 ||
        r.name_len > DLOCK_NAME_MAX)
        return DLOCK_ENOTHELD; /* no record of the name (yet) */
    memcpy(name, r.name, r.name_len);
    *len = r.name_len;
    return DLOCK_OK;
}

static int file_open(void **out, dlock_client *c, const dlock__uri *u,
                     int64_t timeout_ms)
{
    static const char *const params[] = {"private", "group", NULL};
    const char *priv, *grp;
    file_store *fs;
    int private_dir = 0, dirfd = -1, rc;
    gid_t gid = 0;

    (void)c;
    (void)timeout_ms;
    rc = dlock__uri_check_params(u, params);
    if (rc)
        return rc;
    if (u->user || u->password)
        return dlock__err(DLOCK_EINVAL,
                          "file:// takes no user name or password");
    if (u->nhosts > 1 ||
        (u->nhosts == 1 && strcmp(u->hosts[0].host, "localhost") != 0))
        return dlock__err(DLOCK_EINVAL,
                          "file:// names a directory on this host: "
                          "file:///path (three slashes)");
    if (u->path[0] != '/' || u->path[1] == '\0')
        return dlock__err(DLOCK_EINVAL,
                          "file:// needs an absolute directory, e.g. "
                          "file:///var/lock/dlock");
    priv = dlock__uri_param(u, "private");
    if (priv) {
        if (strcmp(priv, "1") != 0 && strcmp(priv, "0") != 0)
            return dlock__err(DLOCK_EINVAL,
                              "file:// parameter private must be 0 or 1");
        private_dir = priv[0] == '1';
    }
    grp = dlock__uri_param(u, "group");
    if (grp && private_dir)
        return dlock__err(DLOCK_EINVAL,
                          "file:// parameters private=1 and group exclude "
                          "each other: a private store is its user's alone");
    if (grp && (rc = dlock__perm_group("file:// parameter group", grp, 1,
                                       &gid)) != DLOCK_OK)
        return rc;

    fs = calloc(1, sizeof(*fs));
    if (!fs || !(fs->dir = strdup(u->path))) {
        free(fs);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    fs->group = grp != NULL;
    fs->gid = gid;
    fs->fmode = fs->group ? 0660 : 0600;
    fs->dmode = fs->group ? 02770 : 0700;
    fs->wdir = -1;
    if (private_dir) {
        rc = dlock__file_open_private(u->path, &dirfd);
    } else {
        rc = dlock__file_make_dirs(fs, u->path);
        if (rc == DLOCK_OK) {
            dirfd = open(u->path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (dirfd < 0)
                rc = dlock__file_io_error("open", u->path, errno);
        }
    }
    fs->dirfd = dirfd;
    if (rc == DLOCK_OK)
        rc = dlock__file_open_wake_dir(fs);
    if (rc) {
        if (dirfd >= 0)
            close(dirfd);
        free(fs->dir);
        free(fs);
        return rc;
    }
    fs->pid = (int64_t)getpid();
    fs->private_dir = private_dir;
    dlock__file_watch_open(fs);
    *out = fs;
    return DLOCK_OK;
}

static void file_close(void *vst)
{
    file_store *fs = vst;

    if (!fs)
        return;
    dlock__file_watch_close(fs);
    if (fs->wdir >= 0)
        close(fs->wdir);
    close(fs->dirfd);
    free(fs->dir);
    free(fs);
}

/* dlock_client_check(): the file system under the lock directory. Open
 * file description locks are local to one kernel: on NFS they are not
 * shared by the hosts (and NFSv3 emulates them through lockd), and on
 * overlayfs each container's upper layer has files of its own. */
static int file_check(void *st, int64_t ttl_ms, dlock_check *out,
                      int64_t op_deadline)
{
    file_store *fs = st;
    char what[300];

    (void)ttl_ms;
    (void)op_deadline;
    snprintf(what, sizeof(what), "the lock directory %.250s", fs->dir);
    return dlock__fs_check(
        fs->dirfd, "file", what,
        "file locks there are not the kernel's own (lockd, or NFSv4's "
        "leases), a client that loses its server keeps believing it "
        "holds, and the lock is only shared by hosts that mount it the "
        "same way",
        out);
}

const dlock__backend dlock__backend_file = {
    DLOCK__STORE_HEAD,
    .name = "file",
    .caps = DLOCK__CAP_NATIVE_WAIT | DLOCK__CAP_SHARED | DLOCK__CAP_PERMITS,
    .lease_size = sizeof(file_lease),
    .open = file_open,
    .close = file_close,
    .acquire = file_acquire,
    .release = file_release,
    .extend = file_extend,
    .inspect = dlock__file_inspect,
    .loop_fd = dlock__file_loop_fd,
    .loop_run = dlock__file_loop_run,
    .list = dlock__file_list,
    .check = file_check,
    .evict_unsupported = "its locks are the holders' own kernel locks (open "
                         "file descriptions): only the holder, or its end, "
                         "frees them",
    .proclaim = file_proclaim,
    .ring = dlock__file_ring, /* file_elect.c */
    .watch_open = dlock__file_obs_open,
    .watch_wait = dlock__file_obs_wait,
    .watch_close = dlock__file_obs_close,
    .watch_sees_expiry = 1, /* a holder's death closes its descriptors */
};
