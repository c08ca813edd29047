/* SPDX-License-Identifier: MIT */
/*
 * file_wait.c -- the file store's waits (file.c is the store; file_int.h what
 * they share). Nothing here polls: a waiter sleeps until the kernel wakes
 * it (a lock freed, a socket closed or written to) or its deadline.
 *
 * Waiting in the kernel: F_OFD_SETLKW cannot be given a deadline, so a
 * timed wait runs it in a short-lived helper thread that the caller
 * cancels when the deadline passes (glibc makes F_OFD_SETLKW a
 * cancellation point; no signal handler is installed). Default-mode
 * waiters wait so for MAIN; a fair waiter only when its predecessor has no
 * channel it can trust, or when it is the head and MAIN's holder has no
 * ticket.
 *
 * The fair queue's wake-up channels (docs/design.md, "File store: fair
 * hand-over"): the owner of ticket t listens, from before it locks its
 * ticket byte until after it unlocks it, on the Unix socket file
 * "<salt>-<ino>-f<t mod 4096>" in the store's WAKE_DIR, a directory only
 * the store's user (or group) may write. Its successor connects and sleeps
 * in poll(), itself, until the connection reports anything: the release
 * sends it a byte ("you are the head"), a give-up ends the connection, the
 * owner's death resets it. The client's background thread accepts the
 * successor's connection as soon as it comes (watch_add(), loop_run()), so
 * that the release does not allocate a socket on the hand-off's path. A
 * connection is trusted only if the listener has our uid (any, in a group
 * store) and ticket t is still held after connecting; otherwise (refused,
 * no /proc, another uid, an older dlock) the successor waits for
 * byte t in the kernel. The channels only make waking faster: the ticket
 * bytes and MAIN decide everything.
 */
#include "file_int.h"

#include "hex.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* A waiter whose channel name is taken skips that many ticket numbers at
 * most, then queues without a channel. */
#define CHAN_BIND_TRIES 8
/* Pending connections a channel keeps (the kernel caps it at somaxconn;
 * a release accepts and closes DLOCK__CHAN_ACCEPT_MAX at most, chan.h). */
#define CHAN_BACKLOG 4096

/* The highest fair ticket below `mine` still held by someone, or -1 (then
 * none was held at the moment of one F_OFD_GETLK over the whole range).
 * F_OFD_GETLK reports *a* conflicting lock, not the lowest or the highest,
 * so after that one call the search goes down from `mine` in doubling
 * steps and then halves the step: tickets are consecutive numbers, so the
 * predecessor is usually mine - 1 and two calls find it. Tickets dropped
 * during the search may give a ticket that is no longer held; the caller
 * checks. */
static off_t highest_below(int fd, off_t mine)
{
    for (int round = 0; round < 64; round++) {
        off_t lo = dlock__ofd_first(fd, QUEUE_BASE, mine), hi = mine, step = 1;

        if (lo < 0)
            return -1;
        /* some ticket in [lo, mine) is held: find the highest */
        while (hi > lo) {
            off_t from = hi - lo > step ? hi - step : lo;
            if (dlock__ofd_first(fd, from, hi) >= 0) {
                lo = from;
                break;
            }
            hi = from;
            step *= 2;
        }
        if (hi <= lo)
            continue; /* what we saw was dropped meanwhile: look again */
        while (hi - lo > 1) {
            off_t mid = lo + (hi - lo) / 2;
            if (dlock__ofd_first(fd, mid, hi) >= 0)
                lo = mid;
            else
                hi = mid;
        }
        return lo;
    }
    return dlock__ofd_first(fd, QUEUE_BASE, mine);
}

/* ------------------------------------------------------------------------ */
/* The gate, META and the fair queue                                        */
/* ------------------------------------------------------------------------ */

int dlock__file_take(int fd, short type, int64_t deadline, int cfd,
                     int64_t *woken_us)
{
    int e;

    /* the try: a reader first looks at the gate (a writer waits there),
     * with a read lock's eyes (other readers waiting there do not count) */
    if (type == F_WRLCK ||
        dlock__ofd_conflict(fd, F_RDLCK, GATE_BYTE, GATE_BYTE + 1, NULL) < 0) {
        if (dlock__ofd_lk(fd, F_OFD_SETLK, type, MAIN_BYTE, 1) == 0)
            return 0;
        if (errno != EAGAIN && errno != EACCES)
            return errno;
    }
    if (dlock__now_ms() >= deadline)
        return EAGAIN;
    /* the wait: the gate (a writer keeps it while it waits for MAIN; a
     * reader only passes it), then MAIN, then the gate opens again */
    if (dlock__ofd_lk(fd, F_OFD_SETLK, type, GATE_BYTE, 1) != 0) {
        if (errno != EAGAIN && errno != EACCES)
            return errno;
        e = dlock__kwait(fd, type, GATE_BYTE, deadline, cfd);
        if (e)
            return e;
    }
    e = dlock__kwait(fd, type, MAIN_BYTE, deadline, cfd);
    if (e == 0 && woken_us)
        *woken_us = dlock__now_us();
    dlock__ofd_lk(fd, F_OFD_SETLK, F_UNLCK, GATE_BYTE, 1);
    return e;
}

/* META is held by dlock for a few system calls only, never while anyone
 * waits; a process outside dlock may keep it (a read lock is enough), so
 * its wait, like every other, ends at the deadline or a cancel: a try,
 * then the kernel wait of dlock__kwait() (a helper thread cancelled
 * at the deadline), which only runs when META is busy. */
int dlock__file_meta_lock(int fd, int64_t deadline, int cfd)
{
    int64_t floor;

    if (dlock__ofd_lk(fd, F_OFD_SETLK, F_WRLCK, META_BYTE, 1) == 0)
        return 0;
    if (errno != EAGAIN && errno != EACCES)
        return errno;
    floor = dlock__now_ms() + META_GRACE_MS;
    if (deadline != DLOCK__FOREVER && deadline < floor)
        deadline = floor;
    return dlock__kwait(fd, F_WRLCK, META_BYTE, deadline, cfd);
}

/* ------------------------------------------------------------------------ */
/* Fair queue: tickets and wake-up channels                                 */
/* ------------------------------------------------------------------------ */

static int salt_set(const unsigned char *salt)
{
    for (int i = 0; i < SALT_LEN; i++)
        if (salt[i])
            return 1;
    return 0;
}

/* The name, in WAKE_DIR, of the channel of ticket byte `byte` (kind 'f';
 * named after its number modulo CHAN_TICKET_NAMES) or of a semaphore's
 * permit byte (kind 's'): "<salt>-<inode>-<kind><number>", all hex. The
 * salt is the file's (random, written once); the inode tells a copy of
 * the file apart. Into name[64]. */
static void chan_base(char *name, const lock_file *f, off_t byte)
{
    int sem = byte >= PERMIT_BASE && byte < QUEUE_BASE;
    char salt[2 * SALT_LEN + 1];
    unsigned long long num =
        sem ? (unsigned long long)(byte - PERMIT_BASE)
            : (unsigned long long)(byte - QUEUE_BASE) % CHAN_TICKET_NAMES;

    dlock__hex(f->salt, SALT_LEN, salt);
    snprintf(name, 64, "%s-%llx-%c%llx", salt, (unsigned long long)f->ino,
             sem ? 's' : 'f', num);
}

/* The socket address of a channel: its file in WAKE_DIR reached through
 * /proc/self/fd/<wdir>, so that it fits sun_path (108 bytes) however
 * long the store's path is, and names the directory we opened and
 * checked, whatever its path names now. */
static socklen_t chan_name(struct sockaddr_un *sa, const lock_file *f,
                           off_t byte, char *base)
{
    int n;

    chan_base(base, f, byte);
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    n = snprintf(sa->sun_path, sizeof(sa->sun_path), "/proc/self/fd/%d/%s",
                 f->wdir, base);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + (size_t)n +
                       1);
}

/* A listening channel for ticket byte `byte`: its descriptor; -1 when the
 * name is taken by a live listener (skip this ticket number); -2 when no
 * channel can be made (no descriptors, no salt, no WAKE_DIR, no /proc).
 * A socket file that nobody listens on is a crashed owner's: it is
 * replaced. Only the store's users can write WAKE_DIR, and a ticket's
 * channel is made under META, a permit's while its byte is held: nobody
 * binds the same name meanwhile but whoever has the number modulo
 * CHAN_TICKET_NAMES, alive (then the probe connects) or dead. */
int dlock__file_chan_listen(const lock_file *f, off_t byte)
{
    struct sockaddr_un sa;
    char base[64];
    socklen_t len;
    int s, e = 0;

    if (!salt_set(f->salt) || f->wdir < 0)
        return -2;
    len = chan_name(&sa, f, byte, base);
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return -2;
    for (int i = 0; i < 2; i++) {
        int p;
        if (bind(s, (struct sockaddr *)&sa, len) == 0) {
            e = 0;
            break;
        }
        e = errno;
        if (e != EADDRINUSE || i > 0)
            break;
        /* a live listener, or a crashed one's file? */
        p = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (p < 0)
            break;
        if (connect(p, (struct sockaddr *)&sa, len) == 0 ||
            (errno != ECONNREFUSED && errno != ENOENT)) {
            close(p); /* live (or its backlog full): taken */
            break;
        }
        close(p);
        if (unlinkat(f->wdir, base, 0) != 0 && errno != ENOENT)
            break;
    }
    if (e) {
        close(s);
        return e == EADDRINUSE ? -1 : -2;
    }
    /* group stores: the socket's mode is the umask's; members must be
     * able to connect (the directory keeps everyone else out) */
    if ((f->anyuid && fchmodat(f->wdir, base, 0660, 0) != 0) ||
        listen(s, CHAN_BACKLOG) != 0) {
        unlinkat(f->wdir, base, 0);
        close(s);
        return -2;
    }
    return s;
}

/* Connects to the channel of ticket byte `byte`: a connected descriptor
 * whose listener has our effective uid (in a group store, any: only the
 * group can bind in WAKE_DIR), or -1. The caller must still check that
 * `byte` is held after this returns (a ticket's name is shared by numbers
 * CHAN_TICKET_NAMES apart). */
int dlock__file_chan_connect(const lock_file *f, off_t byte)
{
    struct sockaddr_un sa;
    struct ucred cr;
    socklen_t crlen = sizeof(cr);
    socklen_t len;
    char base[64];
    int s;

    if (!salt_set(f->salt) || f->wdir < 0)
        return -1;
    len = chan_name(&sa, f, byte, base);
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return -1;
    if (connect(s, (struct sockaddr *)&sa, len) != 0 ||
        getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) != 0 ||
        (cr.uid != geteuid() && !f->anyuid)) {
        close(s);
        return -1;
    }
    return s;
}

/* Sleeps until the connection reports anything or the deadline passes.
 * 0, ETIMEDOUT or an errno. *handed is set when the predecessor released
 * the lock it held (it sent a byte: readable, no hang-up yet) rather than
 * gave up or died (end of file, reset). */
static int chan_wait(int c, int64_t deadline, int cfd, int *handed)
{
    short rev = 0;
    int r = dlock__poll_until(c, cfd, deadline, &rev);

    *handed = r == 1 && rev == POLLIN;
    return r == 1 ? 0 : r == 0 ? ETIMEDOUT : -r;
}

/* Accepting ahead. At N = 2 the successor (the previous holder, queueing
 * again) connects while we hold the lock and run the caller's code, so
 * the release would have to accept its connection before it can wake it:
 * a socket allocated on the hand-off's path (~5 us of ~20 here). So the
 * client's background thread watches our listener (epoll, one-shot) and
 * accepts the connection when it comes; the release then only sends.
 * A lease's memory is the core's and is freed after release, so the
 * background thread touches a lease only under fs->mu and only while it is
 * in fs->watched. */
void dlock__file_watch_open(file_store *fs)
{
    /* without it, the release accepts the successor itself */
    fs->epfd = epoll_create1(EPOLL_CLOEXEC);
    fs->watched = NULL;
    pthread_mutex_init(&fs->mu, NULL);
}

void dlock__file_watch_close(file_store *fs)
{
    if (fs->epfd >= 0)
        close(fs->epfd);
    pthread_mutex_destroy(&fs->mu);
}

void dlock__file_watch_add(file_store *fs, file_lease *fl)
{
    struct epoll_event ev;

    fl->nready = 0;
    fl->watching = fl->listed = 0;
    if (fs->epfd < 0 || fl->lfd < 0)
        return;
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN | EPOLLONESHOT;
    ev.data.ptr = fl;
    pthread_mutex_lock(&fs->mu);
    if (epoll_ctl(fs->epfd, EPOLL_CTL_ADD, fl->lfd, &ev) == 0) {
        fl->watching = fl->listed = 1;
        fl->wprev = NULL;
        fl->wnext = fs->watched;
        if (fs->watched)
            fs->watched->wprev = fl;
        fs->watched = fl;
    }
    pthread_mutex_unlock(&fs->mu);
}

/* Stops watching a lease's listener; its connections accepted ahead go to
 * out[] (READY_MAX), their number is returned. From here on the background
 * thread never touches the lease, and the listener gives at most one more
 * event (one-shot, not re-armed once out of the list), which it ignores.
 * The caller then calls watch_forget() before it closes the listener. */
int dlock__file_watch_end(file_store *fs, file_lease *fl, int *out)
{
    int n = 0;

    if (!fl->listed)
        return 0;
    pthread_mutex_lock(&fs->mu);
    if (fl->wprev)
        fl->wprev->wnext = fl->wnext;
    else
        fs->watched = fl->wnext;
    if (fl->wnext)
        fl->wnext->wprev = fl->wprev;
    fl->listed = 0;
    n = fl->nready;
    memcpy(out, fl->ready, (size_t)n * sizeof(int));
    fl->nready = 0;
    pthread_mutex_unlock(&fs->mu);
    return n;
}

/* Drops the listener from the epoll set, after watch_end() (the release
 * does it after the hand-off, off its path): it must go before the
 * listener is closed, since a forked child's copy would keep it there. */
void dlock__file_watch_forget(file_store *fs, file_lease *fl)
{
    if (!fl->watching)
        return;
    epoll_ctl(fs->epfd, EPOLL_CTL_DEL, fl->lfd, NULL);
    fl->watching = 0;
}

int dlock__file_loop_fd(void *vst)
{
    return ((file_store *)vst)->epfd;
}

/* The background thread: accepts the successors that connected to our
 * watched listeners. */
void dlock__file_loop_run(void *vst, int readable)
{
    file_store *fs = vst;
    struct epoll_event evs[8];
    int n;

    if (!readable || fs->epfd < 0)
        return;
    n = epoll_wait(fs->epfd, evs, 8, 0);
    for (int i = 0; i < n; i++) {
        file_lease *fl;

        pthread_mutex_lock(&fs->mu);
        for (fl = fs->watched; fl && fl != evs[i].data.ptr; fl = fl->wnext)
            ;
        /* first drop the connections of successors that left (end of
         * file): only the live one needs the release's byte */
        for (int k = 0; fl && k < fl->nready;) {
            char b;
            if (recv(fl->ready[k], &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0) {
                close(fl->ready[k]);
                fl->ready[k] = fl->ready[--fl->nready];
            } else {
                k++;
            }
        }
        while (fl && fl->nready < READY_MAX) {
            int c =
                accept4(fl->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
            if (c >= 0)
                fl->ready[fl->nready++] = c;
            else if (errno != EINTR && errno != ECONNABORTED)
                break;
        }
        if (fl && fl->nready < READY_MAX) {
            struct epoll_event ev;
            memset(&ev, 0, sizeof(ev));
            ev.events = EPOLLIN | EPOLLONESHOT;
            ev.data.ptr = fl;
            epoll_ctl(fs->epfd, EPOLL_CTL_MOD, fl->lfd, &ev);
        }
        pthread_mutex_unlock(&fs->mu);
    }
}

/* Takes a fair-queue ticket and locks its byte; returns the byte or -1
 * (*what, *err set). Its channel, made before the byte is locked, goes to
 * *lfd (-1: none); f->salt is set from the file (made if the file has
 * none). */
off_t dlock__file_take_ticket(lock_file *f, int64_t deadline, int cfd,
                              int *lfd, const char **what, int *err)
{
    unsigned char hdr[SALT_OFFSET + SALT_LEN];
    uint64_t next;
    off_t byte;
    ssize_t n;

    *lfd = -1;
    *err = dlock__file_meta_lock(f->fd, deadline, cfd);
    if (*err) {
        *what = "lock";
        return -1;
    }
    n = pread(f->fd, hdr, sizeof(hdr), 0);
    if (n < (ssize_t)sizeof(hdr))
        memset(hdr + (n > 0 ? n : 0), 0,
               sizeof(hdr) - (size_t)(n > 0 ? n : 0));
    memcpy(&next, hdr + 8, sizeof(next));
    memcpy(f->salt, hdr + SALT_OFFSET, SALT_LEN);
    if (!salt_set(f->salt) && dlock__random(f->salt, SALT_LEN) != DLOCK_OK)
        memset(f->salt, 0, SALT_LEN); /* no channels for this file, yet */
    for (int i = 0; i < CHAN_BIND_TRIES; i++) {
        byte = QUEUE_BASE + (off_t)(next % (uint64_t)(QUEUE_END -
                                                      QUEUE_BASE));
        *lfd = dlock__file_chan_listen(f, byte);
        if (*lfd != -1)
            break;
        next++; /* squatted: nobody will hold this ticket */
    }
    if (*lfd < 0)
        *lfd = -1;
    byte = QUEUE_BASE + (off_t)(next % (uint64_t)(QUEUE_END - QUEUE_BASE));
    next++;
    memcpy(hdr, magic, sizeof(magic));
    memcpy(hdr + 8, &next, sizeof(next));
    memcpy(hdr + SALT_OFFSET, f->salt, SALT_LEN);
    if (pwrite(f->fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr) ||
        dlock__ofd_lk(f->fd, F_OFD_SETLK, F_WRLCK, byte, 1) != 0) {
        *what = "write";
        *err = errno;
        if (*lfd >= 0)
            dlock__chan_end(f->wdir, *lfd, -1, 0);
        *lfd = -1;
        byte = -1;
    }
    dlock__ofd_lk(f->fd, F_OFD_SETLK, F_UNLCK, META_BYTE, 1);
    return byte;
}

/* A fair waiter holding ticket byte `ticket` waits until its open file
 * holds MAIN. 0, ETIMEDOUT or an errno. On ETIMEDOUT the caller leaves the
 * queue (file.c's drop_file()). *conn is the channel connection the wait
 * last woke on, still open (closing it costs time the hand-off should not
 * wait for), or -1; the caller closes it in every case. */
int dlock__file_fair_wait(const lock_file *f, off_t ticket, int64_t deadline,
                          int cfd, int *conn, int head_only)
{
    int handed = 0;

    *conn = -1;
    for (;;) {
        /* Handed the lock by the predecessor that held it: we are the
         * head (it took the lock when no ticket below its own was held,
         * and none can come later; none was held between it and us) */
        off_t b = handed ? -1 : highest_below(f->fd, ticket);
        int c, e;

        if (b < 0 && head_only)
            return 0;
        if (b < 0) {
            /* the head: MAIN is free unless someone without a ticket
             * (default mode, or a fair acquirer that found no queue)
             * holds it; then only the kernel can tell us */
            e = dlock__file_take(f->fd, F_WRLCK, deadline, cfd, NULL);
            return e == EAGAIN ? ETIMEDOUT : e;
        }
        if (*conn >= 0) {
            close(*conn);
            *conn = -1;
        }
        c = dlock__file_chan_connect(f, b);
        if (c >= 0 && dlock__ofd_first(f->fd, b, b + 1) >= 0) {
            /* b was held after we connected: its owner's channel */
            e = chan_wait(c, deadline, cfd, &handed);
            *conn = c;
        } else {
            if (c >= 0)
                close(c);
            if (dlock__ofd_first(f->fd, b, b + 1) < 0)
                continue; /* gone meanwhile: look again */
            /* no channel we can trust: wait for its byte in the kernel,
             * as a writer: a read lock that a process outside dlock put
             * on the byte would let a read lock through at once, and
             * this loop would spin until the deadline */
            e = dlock__kwait(f->fd, F_WRLCK, b, deadline, cfd);
            if (e == 0)
                dlock__ofd_lk(f->fd, F_OFD_SETLK, F_UNLCK, b, 1);
        }
        if (e == ETIMEDOUT) {
            /* the deadline and the hand-off may have come together: a
             * head that finds MAIN free takes it */
            if (highest_below(f->fd, ticket) < 0 &&
                (head_only ||
                 dlock__ofd_lk(f->fd, F_OFD_SETLK, F_WRLCK, MAIN_BYTE, 1) ==
                     0))
                return 0;
            return ETIMEDOUT;
        }
        if (e)
            return e;
    }
}

