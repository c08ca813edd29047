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
 *  - waiting happens in the kernel (F_OFD_SETLKW), never by polling. A wait
 *    with a deadline runs the blocking call in a short-lived helper thread
 *    that the caller cancels when the deadline passes (glibc makes
 *    F_OFD_SETLKW a cancellation point; no signal handler is installed).
 *
 * File layout (native byte order; the file never leaves the host):
 *   0   magic "DLOCKF1\n"
 *   8   next fair-queue ticket (written under the META byte lock)
 *   64  holder record: fencing counter, acquisition time, holder's
 *       description (written by the holder, under the main lock)
 * Byte-range locks (advisory, independent of the data):
 *   0          MAIN: the lock itself
 *   1          META: guards the ticket counter
 *   2^32 + t   ticket t of a fair waiter, held from joining the queue until
 *              its release. Waiter t waits (blocked in the kernel) only for
 *              the highest live ticket below its own, so one release wakes
 *              one waiter, in arrival order. A waiter that gives up or dies
 *              drops its byte, and the one behind it moves up.
 *
 * Forks: a child forked while a lock is held shares the open file; release
 * unlocks the description explicitly, so the child's copy does not keep the
 * lock. But if the holder dies first, the lock lives until the child exits
 * or execs (descriptors are close-on-exec).
 *
 * Lock files are never deleted: deleting a file while someone holds or
 * waits on it would let a newcomer lock a fresh file of the same name. Every
 * acquisition checks, after locking, that the path still names the file it
 * locked, and release reports DLOCK_ELOST if it does not.
 *
 * Fencing token: max(last + 1, wall clock in microseconds), kept in the file
 * and updated under the lock, so it only grows, even across reboots.
 */
#include "../core/internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAIN_BYTE 0
#define META_BYTE 1
#define QUEUE_BASE ((off_t)1 << 32)
#define QUEUE_END ((off_t)1 << 62)
#define REC_OFFSET 64
#define FNAME_MAX 240
#define MAX_WAITERS_COUNTED 100000

static const char magic[8] = {'D', 'L', 'O', 'C', 'K', 'F', '1', '\n'};

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

typedef struct file_store {
    char *dir;
    int dirfd;
} file_store;

typedef struct file_lease {
    int fd;
    dev_t dev;
    ino_t ino;
    char fname[FNAME_MAX + 8];
} file_lease;

/* ------------------------------------------------------------------------ */
/* Names and files                                                          */
/* ------------------------------------------------------------------------ */

/* Maps a lock name (any bytes) to a safe file name: [A-Za-z0-9_.-] kept
 * (but a leading '.'), everything else %XX; a long result is cut and given
 * a hash of the whole name. Two names sharing a file would only exclude
 * each other: never a safety problem. */
static void file_name(const char *name, size_t len, char *out)
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

static int io_error(const char *what, const char *fname, int err)
{
    if (err == EACCES || err == EPERM || err == EROFS)
        return dlock__err(DLOCK_EAUTH, "file store: %s %.200s: %s", what,
                          fname, strerror(err));
    if (err == ENOMEM)
        return dlock__err(DLOCK_ENOMEM, "file store: %s: out of memory",
                          what);
    if (err == ELOOP)
        return dlock__err(DLOCK_EPROTO,
                          "file store: %.200s is a symbolic link; refusing "
                          "to follow it",
                          fname);
    return dlock__err(DLOCK_ECONN, "file store: %s %.200s: %s", what, fname,
                      strerror(err));
}

static int lk(int fd, int cmd, short type, off_t start, off_t len)
{
    struct flock fl;

    memset(&fl, 0, sizeof(fl));
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = len;
    return fcntl(fd, cmd, &fl);
}

/* Start of a lock held by another open file in [start, end), or -1. */
static off_t first_conflict(int fd, off_t start, off_t end)
{
    struct flock fl;

    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = end - start;
    if (end <= start || fcntl(fd, F_OFD_GETLK, &fl) != 0 ||
        fl.l_type == F_UNLCK)
        return -1;
    return fl.l_start < start ? start : fl.l_start;
}

/* The highest fair ticket below `mine` still held by someone, or -1. */
static off_t highest_below(int fd, off_t mine)
{
    off_t found = -1, at = QUEUE_BASE;

    for (int i = 0; i < MAX_WAITERS_COUNTED; i++) {
        off_t b = first_conflict(fd, at, mine);
        if (b < 0)
            break;
        found = b;
        at = b + 1;
    }
    return found;
}

static int check_magic(int fd, const char *fname)
{
    char buf[8];
    ssize_t n = pread(fd, buf, sizeof(buf), 0);

    if (n < 0)
        return io_error("read", fname, errno);
    if (n == (ssize_t)sizeof(buf) && memcmp(buf, magic, sizeof(buf)) != 0)
        return dlock__err(DLOCK_EPROTO,
                          "file store: %.200s is not a dlock lock file",
                          fname);
    return DLOCK_OK;
}

/* Opens (creating with O_CREAT) the lock file. *missing is set when it
 * does not exist (only possible without O_CREAT). */
static int open_lock_file(file_store *fs, const char *fname, int flags,
                          int *out, int *missing)
{
    struct stat st;
    int fd = openat(fs->dirfd, fname,
                    flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0666);
    int rc;

    *missing = 0;
    if (fd < 0) {
        *missing = errno == ENOENT;
        return io_error("open", fname, errno);
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return dlock__err(DLOCK_EPROTO,
                          "file store: %.200s is not a regular file", fname);
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
    struct stat st;

    if (fstatat(fs->dirfd, fl->fname, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return 0;
    return st.st_dev == fl->dev && st.st_ino == fl->ino;
}

/* ------------------------------------------------------------------------ */
/* Waiting in the kernel                                                    */
/* ------------------------------------------------------------------------ */

typedef struct kwait {
    int fd;
    off_t ticket; /* absolute byte of our fair ticket, or -1 */
    int rc;       /* errno of a failed call, 0 when the lock was taken */
    int done;
    pthread_mutex_t mu;
    pthread_cond_t cv;
} kwait;

/* The blocking part: wait for the fair predecessors, then for the lock.
 * Only the two F_OFD_SETLKW calls block (and are cancellation points). */
static int kwait_run(kwait *k)
{
    int old;

    if (k->ticket >= 0) {
        for (;;) {
            off_t b = highest_below(k->fd, k->ticket);
            if (b < 0)
                break;
            if (lk(k->fd, F_OFD_SETLKW, F_RDLCK, b, 1) != 0 &&
                errno != EINTR)
                return errno;
            lk(k->fd, F_OFD_SETLK, F_UNLCK, b, 1);
        }
    }
    while (lk(k->fd, F_OFD_SETLKW, F_WRLCK, MAIN_BYTE, 1) != 0) {
        if (errno != EINTR)
            return errno;
    }
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
    return 0;
}

static void *kwait_thread(void *arg)
{
    kwait *k = arg;
    int rc = kwait_run(k);
    int old;

    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
    pthread_mutex_lock(&k->mu);
    k->rc = rc;
    k->done = 1;
    pthread_cond_signal(&k->cv);
    pthread_mutex_unlock(&k->mu);
    return NULL;
}

/* Blocks until the lock is ours or `deadline` passes. 0: taken; ETIMEDOUT;
 * or an errno. */
static int kwait_until(int fd, off_t ticket, int64_t deadline)
{
    kwait k;
    pthread_t t;
    sigset_t old;
    void *res = NULL;
    int rc;

    memset(&k, 0, sizeof(k));
    k.fd = fd;
    k.ticket = ticket;
    if (deadline == DLOCK__FOREVER)
        return kwait_run(&k);

    pthread_mutex_init(&k.mu, NULL);
    if (dlock__cond_init(&k.cv) != DLOCK_OK) {
        pthread_mutex_destroy(&k.mu);
        return ENOMEM;
    }
    dlock__block_signals(&old);
    rc = pthread_create(&t, NULL, kwait_thread, &k);
    dlock__restore_signals(&old);
    if (rc == 0) {
        pthread_mutex_lock(&k.mu);
        while (!k.done && dlock__now_ms() < deadline)
            dlock__cond_wait_until(&k.cv, &k.mu, deadline);
        int done = k.done;
        pthread_mutex_unlock(&k.mu);
        if (!done)
            pthread_cancel(t);
        pthread_join(t, &res);
        rc = res == PTHREAD_CANCELED ? ETIMEDOUT : k.rc;
    }
    pthread_cond_destroy(&k.cv);
    pthread_mutex_destroy(&k.mu);
    return rc;
}

/* Takes a fair-queue ticket and locks its byte; returns the byte or -1. */
static off_t take_ticket(int fd, const char *fname, int *rc)
{
    uint64_t next = 0;
    off_t byte;

    while (lk(fd, F_OFD_SETLKW, F_WRLCK, META_BYTE, 1) != 0) {
        if (errno != EINTR) {
            *rc = io_error("lock", fname, errno);
            return -1;
        }
    }
    if (pread(fd, &next, sizeof(next), 8) != (ssize_t)sizeof(next))
        next = 0;
    byte = QUEUE_BASE + (off_t)(next % (uint64_t)(QUEUE_END - QUEUE_BASE));
    next++;
    if (pwrite(fd, magic, sizeof(magic), 0) != (ssize_t)sizeof(magic) ||
        pwrite(fd, &next, sizeof(next), 8) != (ssize_t)sizeof(next) ||
        lk(fd, F_OFD_SETLK, F_WRLCK, byte, 1) != 0) {
        *rc = io_error("write", fname, errno);
        byte = -1;
    }
    lk(fd, F_OFD_SETLK, F_UNLCK, META_BYTE, 1);
    return byte;
}

/* ------------------------------------------------------------------------ */
/* Backend slots                                                            */
/* ------------------------------------------------------------------------ */

static int64_t wall_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* Writes the holder record under the main lock; sets l->token. */
static int write_record(int fd, const char *fname, dlock__lease *l,
                        off_t ticket)
{
    file_rec r;
    int64_t now = wall_us();

    memset(&r, 0, sizeof(r));
    if (pread(fd, &r, sizeof(r.fence), REC_OFFSET) != (ssize_t)sizeof(r.fence))
        r.fence = 0;
    r.fence = r.fence + 1 > (uint64_t)now ? r.fence + 1 : (uint64_t)now;
    r.acquired_us = (uint64_t)now;
    r.ticket_plus1 = ticket >= 0 ? (uint64_t)(ticket - QUEUE_BASE) + 1 : 0;
    r.pid = (int64_t)getpid();
    r.tid = dlock__tid();
    snprintf(r.desc, sizeof(r.desc), "%s", l->desc);
    r.name_len = (uint32_t)l->name_len;
    memcpy(r.name, l->name, l->name_len);
    if (pwrite(fd, magic, sizeof(magic), 0) != (ssize_t)sizeof(magic) ||
        pwrite(fd, &r, sizeof(r), REC_OFFSET) != (ssize_t)sizeof(r))
        return io_error("write", fname, errno);
    l->token = r.fence;
    return DLOCK_OK;
}

static int file_acquire(void *vst, dlock__lease *l, int64_t op_deadline)
{
    file_store *fs = vst;
    file_lease *fl = l->priv;
    int fair = (l->flags & DLOCK_FAIR) != 0;
    int once = l->deadline <= dlock__now_ms();
    int rc;

    (void)op_deadline;
    file_name(l->name, l->name_len, fl->fname);
    for (int attempt = 0; attempt < 16; attempt++) {
        struct stat st;
        off_t ticket = -1;
        int fd, e;

        rc = open_lock_file(fs, fl->fname, O_RDWR | O_CREAT, &fd, &e);
        if (rc)
            return rc;
        /* A fair acquirer never jumps the queue: with waiters queued it
         * queues too, even if the lock is free for a moment. */
        int queued = fair && first_conflict(fd, QUEUE_BASE, QUEUE_END) >= 0;
        if (!queued && lk(fd, F_OFD_SETLK, F_WRLCK, MAIN_BYTE, 1) == 0) {
            e = 0;
        } else if (!queued && errno != EAGAIN && errno != EACCES) {
            e = errno;
        } else if (once) {
            close(fd);
            l->retry_ms = -1;
            return DLOCK_EBUSY;
        } else {
            if (fair) {
                ticket = take_ticket(fd, fl->fname, &rc);
                if (ticket < 0) {
                    close(fd);
                    return rc;
                }
            }
            e = kwait_until(fd, ticket, l->deadline);
        }
        if (e == ETIMEDOUT) {
            close(fd);
            l->retry_ms = -1;
            return DLOCK_EBUSY;
        }
        if (e != 0) {
            close(fd);
            return io_error("lock", fl->fname, e);
        }
        if (fstat(fd, &st) != 0) {
            e = errno;
            close(fd);
            return io_error("stat", fl->fname, e);
        }
        fl->fd = fd;
        fl->dev = st.st_dev;
        fl->ino = st.st_ino;
        if (!same_file(fs, fl)) {
            /* deleted or replaced while we waited: lock the new one */
            close(fd);
            continue;
        }
        rc = write_record(fd, fl->fname, l, ticket);
        if (rc) {
            close(fd);
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
    int ours = same_file(fs, fl);

    (void)op_deadline;
    /* Unlock the open file description itself (every byte: the lock and
     * any ticket) before closing: a child forked while we held it shares
     * the description, and close() alone would leave the lock held for as
     * long as that child keeps its copy. */
    lk(fl->fd, F_OFD_SETLK, F_UNLCK, 0, 0);
    close(fl->fd);
    fl->fd = -1;
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

static int file_inspect(void *vst, const char *name, size_t len,
                        dlock_info *out, int64_t op_deadline)
{
    file_store *fs = vst;
    char fname[FNAME_MAX + 8];
    file_rec r;
    off_t skip = -1;
    int fd, rc, missing;

    (void)op_deadline;
    file_name(name, len, fname);
    out->waiters = 0;
    rc = open_lock_file(fs, fname, O_RDONLY, &fd, &missing);
    if (rc && missing)
        return DLOCK_OK; /* never used: free, no token yet */
    if (rc)
        return rc;
    memset(&r, 0, sizeof(r));
    if (pread(fd, &r, sizeof(r), REC_OFFSET) < 0) {
        rc = io_error("read", fname, errno);
        close(fd);
        return rc;
    }
    r.desc[sizeof(r.desc) - 1] = '\0';
    out->token = r.fence;
    out->held = first_conflict(fd, MAIN_BYTE, MAIN_BYTE + 1) >= 0;
    if (out->held) {
        /* the record is whatever the file holds: no arithmetic on its
         * numbers may overflow (a foreign or damaged file) */
        uint64_t now = (uint64_t)wall_us();
        snprintf(out->holder, sizeof(out->holder), "%s", r.desc);
        out->held_ms = r.acquired_us < now
                           ? (int64_t)((now - r.acquired_us) / 1000)
                           : 0;
        if (r.ticket_plus1 &&
            r.ticket_plus1 <= (uint64_t)(QUEUE_END - QUEUE_BASE))
            skip = QUEUE_BASE + (off_t)(r.ticket_plus1 - 1);
    }
    for (off_t at = QUEUE_BASE; out->waiters < MAX_WAITERS_COUNTED;) {
        off_t b = first_conflict(fd, at, QUEUE_END);
        if (b < 0)
            break;
        if (b != skip)
            out->waiters++;
        at = b + 1;
    }
    close(fd);
    return DLOCK_OK;
}

/* mkdir -p; the last component gets `mode`. */
static int make_dirs(const char *path, mode_t mode)
{
    char buf[PATH_MAX];
    size_t n = strlen(path);

    if (n >= sizeof(buf))
        return dlock__err(DLOCK_EINVAL, "file store: directory path too long");
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char keep = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, keep ? 0777 : mode) != 0 && errno != EEXIST)
            return io_error("mkdir", buf, errno);
        buf[i] = keep;
    }
    return DLOCK_OK;
}

/* The private default directory must be ours and closed to others: in a
 * shared /tmp, anyone could otherwise prepare it and steer our locks. */
static int check_private(const char *dir)
{
    struct stat st;

    if (lstat(dir, &st) != 0)
        return io_error("stat", dir, errno);
    if (!S_ISDIR(st.st_mode))
        return dlock__err(DLOCK_EPROTO,
                          "file store: %.200s is not a directory (or is a "
                          "symbolic link)",
                          dir);
    if (st.st_uid != geteuid())
        return dlock__err(DLOCK_EAUTH,
                          "file store: %.200s belongs to uid %lu, not to "
                          "you; refusing to use it",
                          dir, (unsigned long)st.st_uid);
    if ((st.st_mode & 077) && chmod(dir, 0700) != 0)
        return io_error("chmod", dir, errno);
    return DLOCK_OK;
}

static int file_open(void **out, dlock_client *c, const dlock__uri *u,
                     int64_t timeout_ms)
{
    static const char *const params[] = {"private", NULL};
    const char *priv;
    file_store *fs;
    int private_dir = 0, rc;

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
    rc = make_dirs(u->path, private_dir ? 0700 : 0777);
    if (rc == DLOCK_OK && private_dir)
        rc = check_private(u->path);
    if (rc)
        return rc;

    fs = calloc(1, sizeof(*fs));
    if (!fs || !(fs->dir = strdup(u->path))) {
        free(fs);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    fs->dirfd = open(fs->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fs->dirfd < 0) {
        rc = io_error("open", fs->dir, errno);
        free(fs->dir);
        free(fs);
        return rc;
    }
    *out = fs;
    return DLOCK_OK;
}

static void file_close(void *vst)
{
    file_store *fs = vst;

    if (!fs)
        return;
    close(fs->dirfd);
    free(fs->dir);
    free(fs);
}

const dlock__backend dlock__backend_file = {
    "file",                  /* name */
    DLOCK__CAP_NATIVE_WAIT,  /* caps */
    sizeof(file_lease),      /* lease_size */
    file_open,               /* open */
    file_close,              /* close */
    file_acquire,            /* acquire */
    NULL,                    /* arm */
    NULL,                    /* disarm */
    file_release,            /* release */
    file_extend,             /* extend */
    file_inspect,            /* inspect */
    NULL,                    /* loop_fd */
    NULL,                    /* loop_run */
    NULL,                    /* gc */
    NULL, /* select */
    NULL, /* margin */
    NULL, /* abandon */
    NULL, /* extend_many */
};
