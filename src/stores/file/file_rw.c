/* SPDX-License-Identifier: MIT */
/*
 * file_rw.c -- the file store's counting semaphores (docs/design.md,
 * "Shared holds and permits", the file store's semaphore paragraph).
 *
 * Permit i is a write lock on byte PERMIT_BASE + i of the name's lock
 * file; N is written at SEM_OFFSET. Every decision (N, which byte, the
 * token) is taken under the META byte's lock, held for a few system calls
 * and never while waiting. The holder of permit i listens on its permit's
 * channel while it holds it; the head of the fair queue connects to every
 * holder's channel and sleeps in poll(): any release or death resets a
 * connection and wakes it. Nothing polls.
 */
#include "file_int.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void meta_unlock(int fd)
{
    dlock__ofd_lk(fd, F_OFD_SETLK, F_UNLCK, META_BYTE, 1);
}

/* The file's first bytes, as a semaphore's try reads them at once. */
typedef struct sem_head {
    unsigned char hdr[SALT_OFFSET + SALT_LEN]; /* magic, ticket, salt */
    unsigned char pad[SEM_OFFSET - SALT_OFFSET - SALT_LEN];
    uint32_t n;                                 /* at SEM_OFFSET */
    unsigned char pad2[REC_OFFSET - SEM_OFFSET - 4];
    uint64_t fence;                             /* at REC_OFFSET */
} sem_head;

/* One try, under META: DLOCK_OK with the permit's byte locked and
 * l->token set (*byte: which), DLOCK_EBUSY, or an error. With
 * `queue_first`, a queue of waiters makes it busy (DLOCK_FAIR). Sets
 * f->salt, making it when the file has none: holders' channels need it.
 * META held by others past the deadline (META_GRACE_MS at least) or a
 * cancel: DLOCK_EBUSY. */
static int sem_try(lock_file *f, dlock__lease *l, const char *fname,
                   int queue_first, off_t *byte)
{
    static const unsigned char zero[SALT_LEN];
    sem_head h;
    int fd = f->fd, rc = DLOCK_EBUSY;
    ssize_t got;
    int e = dlock__file_meta_lock(fd, l->deadline, l->cancel_fd);

    if (e == ETIMEDOUT)
        return DLOCK_EBUSY;
    if (e)
        return dlock__file_io_error("lock", fname, e);
    memset(&h, 0, sizeof(h));
    got = pread(fd, &h, sizeof(h), 0);
    if (got < 0) {
        rc = dlock__file_io_error("read", fname, errno);
        goto out;
    }
    if (h.n != l->permits &&
        dlock__ofd_first(fd, PERMIT_BASE, PERMIT_BASE + SEM_PERMITS_MAX) >=
            0) {
        rc = dlock__err(DLOCK_EINVAL,
                        "lock '%.200s' is a semaphore of %u permits, not "
                        "%u (every handle of a name must say the same)",
                        l->name, h.n, l->permits);
        goto out;
    }
    if (dlock__ofd_first(fd, MAIN_BYTE, MAIN_BYTE + 1) >= 0) {
        rc = dlock__err(DLOCK_EINVAL,
                        "lock '%.200s' is held as a lock, not as a "
                        "semaphore",
                        l->name);
        goto out;
    }
    memcpy(f->salt, h.hdr + SALT_OFFSET, SALT_LEN);
    if (memcmp(f->salt, zero, SALT_LEN) == 0 &&
        dlock__random(f->salt, SALT_LEN) == DLOCK_OK) {
        memcpy(h.hdr, magic, sizeof(magic));
        memcpy(h.hdr + SALT_OFFSET, f->salt, SALT_LEN);
        if (pwrite(fd, h.hdr, sizeof(h.hdr), 0) != (ssize_t)sizeof(h.hdr)) {
            rc = dlock__file_io_error("write", fname, errno);
            goto out;
        }
    }
    if (h.n != l->permits) {
        h.n = l->permits;
        if (pwrite(fd, &h.n, sizeof(h.n), SEM_OFFSET) != (ssize_t)sizeof(h.n)) {
            rc = dlock__file_io_error("write", fname, errno);
            goto out;
        }
    }
    if (queue_first && dlock__ofd_first(fd, QUEUE_BASE, QUEUE_END) >= 0)
        goto out;
    /* from a start that differs between owners, so tries spread */
    uint64_t start = dlock__hash(l->owner, strlen(l->owner)) +
                     (uint64_t)dlock__now_ms();
    for (uint32_t i = 0; i < h.n; i++) {
        off_t b = PERMIT_BASE + (off_t)((start + i) % h.n);
        if (dlock__ofd_lk(fd, F_OFD_SETLK, F_WRLCK, b, 1) != 0)
            continue;
        uint64_t now = (uint64_t)dlock__file_wall_us();
        uint64_t fence = (size_t)got >= sizeof(h) ? h.fence : 0;
        fence = fence + 1 > now ? fence + 1 : now;
        if (pwrite(fd, &fence, sizeof(fence), REC_OFFSET) !=
            (ssize_t)sizeof(fence)) {
            rc = dlock__file_io_error("write", fname, errno);
            dlock__ofd_lk(fd, F_OFD_SETLK, F_UNLCK, b, 1);
            break;
        }
        l->token = fence;
        *byte = b;
        rc = DLOCK_OK;
        break;
    }
out:
    meta_unlock(fd);
    return rc;
}

/* The head of the queue found every permit held: sleeps until one of
 * their holders lets go (or dies), or the deadline. 0 (look again),
 * ETIMEDOUT, or an errno. */
static int sem_wait_holders(const lock_file *f, uint32_t n, int64_t deadline,
                            int cfd)
{
    struct pollfd pf[SEM_PERMITS_MAX + 1]; /* the holders', and cfd */
    off_t end = PERMIT_BASE + (off_t)n;
    off_t untrusted[SEM_KWAIT_MAX]; /* holders without a channel */
    int np = 0, nu = 0, e = 0, freed = 0;

    for (off_t at = PERMIT_BASE; at < end && np < (int)n;) {
        off_t b = lowest_held(f->fd, at, end);
        if (b < 0)
            break;
        int c = dlock__file_chan_connect(f, b);
        if (dlock__ofd_first(f->fd, b, b + 1) < 0) {
            if (c >= 0)
                close(c);
            freed = 1; /* freed meanwhile: look again at once */
            break;
        }
        if (c >= 0) {
            pf[np].fd = c;
            pf[np].events = POLLIN;
            pf[np].revents = 0;
            np++;
        } else if (nu < SEM_KWAIT_MAX) {
            untrusted[nu++] = b;
        }
        at = b + 1;
    }
    if (!freed && nu > 0) {
        /* holders without a channel (an older dlock, out of
         * descriptors, no /proc): the kernel tells when one of their
         * bytes is free, while the others' channels are watched too */
        int fds[SEM_PERMITS_MAX];
        for (int i = 0; i < np; i++)
            fds[i] = pf[i].fd;
        e = dlock__kwait_any(f->fd, untrusted, nu, fds, np, deadline,
                                  cfd);
        for (int i = 0; i < np; i++)
            close(pf[i].fd);
        return e;
    }
    while (!freed && np > 0) {
        int ms = -1, r;
        if (deadline != DLOCK__FOREVER) {
            int64_t left = deadline - dlock__now_ms();
            if (left <= 0) {
                e = ETIMEDOUT;
                break;
            }
            ms = left > INT_MAX ? INT_MAX : (int)left;
        }
        pf[np].fd = cfd; /* a negative fd is ignored by poll() */
        pf[np].events = POLLIN;
        pf[np].revents = 0;
        r = poll(pf, (nfds_t)np + 1, ms);
        if (r > 0 && pf[np].revents) {
            e = ETIMEDOUT; /* cancelled: as at the deadline */
            break;
        }
        if (r > 0)
            break;
        if (r < 0 && errno != EINTR) {
            e = errno;
            break;
        }
    }
    for (int i = 0; i < np; i++)
        close(pf[i].fd);
    return e;
}

/* The permit's channel, for the head of the queue to connect to while
 * this lease holds byte `b` (none if it cannot be made: the head then
 * waits for the byte in the kernel). */
static void sem_listen(file_lease *fl, const lock_file *f, off_t b)
{
    int s = dlock__file_chan_listen(f, b);

    fl->lfd = s >= 0 ? s : -1;
    fl->lsem = 1;
}

int dlock__file_sem_acquire(file_store *fs, file_lease *fl, lock_file *f,
                            dlock__lease *l, int once)
{
    int fair = (l->flags & DLOCK_FAIR) != 0;
    off_t byte = -1, ticket;
    int tlfd = -1, conn = -1, rc, e = 0;
    const char *what = "lock";

    (void)fs;
    if (l->permits > SEM_PERMITS_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s': a semaphore on the file store has "
                          "at most %d permits, not %u",
                          l->name, SEM_PERMITS_MAX, l->permits);
    rc = sem_try(f, l, fl->fname, fair, &byte);
    if (rc != DLOCK_EBUSY || once) {
        if (rc == DLOCK_OK)
            sem_listen(fl, f, byte);
        return rc;
    }
    /* wait: in the fair queue, then as its head on the holders */
    ticket = dlock__file_take_ticket(f, l->deadline, l->cancel_fd, &tlfd,
                                     &what, &e);
    if (ticket < 0 && e == ETIMEDOUT)
        return DLOCK_EBUSY;
    if (ticket < 0)
        return dlock__file_io_error(what, fl->fname, e);
    for (int round = 0;; round++) {
        e = dlock__file_fair_wait(f, ticket, l->deadline, l->cancel_fd,
                                  &conn, 1);
        if (e == 0)
            l->woken_us = dlock__now_us();
        if (e)
            break;
        rc = sem_try(f, l, fl->fname, 0, &byte);
        if (rc != DLOCK_EBUSY)
            break;
        e = sem_wait_holders(f, l->permits, l->deadline, l->cancel_fd);
        if (e == ETIMEDOUT) {
            /* the deadline and a release may have come together */
            rc = sem_try(f, l, fl->fname, 0, &byte);
            e = 0;
            break;
        }
        if (e)
            break;
    }
    /* leave the queue: the successor wakes and becomes the head */
    dlock__ofd_lk(f->fd, F_OFD_SETLK, F_UNLCK, ticket, 1);
    if (tlfd >= 0)
        dlock__chan_end(f->wdir, tlfd, -1, 0);
    if (conn >= 0)
        close(conn);
    if (e == ETIMEDOUT)
        return DLOCK_EBUSY;
    if (e)
        return dlock__file_io_error("wait for", fl->fname, e);
    if (rc == DLOCK_OK)
        sem_listen(fl, f, byte);
    return rc;
}

void dlock__file_sem_inspect(int fd, dlock_info *out)
{
    uint32_t n = 0;

    if (pread(fd, &n, sizeof(n), SEM_OFFSET) != (ssize_t)sizeof(n) || n == 0 ||
        n > SEM_PERMITS_MAX)
        return;
    out->permits = n;
    out->holders = 0;
    int foreign = 0;
    for (off_t at = PERMIT_BASE; at < PERMIT_BASE + (off_t)n;) {
        off_t b = lowest_held(fd, at, PERMIT_BASE + (off_t)n);
        short type = F_UNLCK;
        if (b < 0)
            break;
        /* a permit's holder write-locks its byte: a read lock is not
         * one of ours */
        if (dlock__ofd_conflict(fd, F_WRLCK, b, b + 1, &type) >= 0 &&
            type == F_RDLCK)
            foreign = 1;
        else
            out->holders++;
        at = b + 1;
    }
    out->held = out->holders > 0 || foreign;
    if (foreign)
        snprintf(out->holder, sizeof(out->holder), "%s", FOREIGN_READ);
    else if (out->held)
        snprintf(out->holder, sizeof(out->holder), "%lld of %u permits",
                 (long long)out->holders, n);
}
