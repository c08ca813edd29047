/* SPDX-License-Identifier: MIT */
/*
 * sqlite_wait.c -- the SQLite store's waits, in the kernel: nothing here
 * sends a statement or polls. A waiter sleeps until its predecessor in
 * the name's queue hands over (a byte on a Unix socket), leaves or dies
 * (end of file), or until a timer the caller sets from the holder's lease
 * end. The lock table (sqlite.c) decides everything; this only decides
 * who tries next, and when. The protocol and its failure cases are in
 * docs/design.md, "SQLite: waking waiters".
 *
 * The sidecar `<db>-dlock` holds no data, only OFD byte-range locks: per
 * lock name a region of 2^32 bytes at rowid << 32; its byte 0 guards
 * ticket taking, byte t is held by the owner of ticket t from before its
 * first statement until it releases or gives up (the kernel drops it with
 * the process). Ticket t's wake-up channel is the Unix socket
 * "<ino>.<rowid>.<t>" in the directory `<db>-dlock.d` (0700, or 03770
 * with ?group=: no other user can bind, connect or ring there), and its
 * doorbell the datagram socket "<ino>.<rowid>.<t>.r"; both listen from
 * before byte t is locked until their files are removed, before it is
 * unlocked, as the file store's fair channels (file_wait.c), whose kernel
 * wait this file reuses. Every wait here ends by its deadline or a
 * cancel, whatever another process holds on the sidecar.
 */
#include "sqlite_int.h"
#include "chan.h"
#include "kwait.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define CHAN_BIND_TRIES 8 /* ticket numbers skipped when a name is taken */

#define CHAN_BACKLOG 4096

static off_t region_base(int64_t rowid)
{
    int64_t r = rowid > 0 && rowid < SQW_REGIONS ? rowid
                                                  : 1 + (rowid & (SQW_REGIONS - 2));
    return (off_t)r << SQW_REGION_SHIFT;
}

/* The highest byte in [lo, hi) that another open file holds, or -1. It
 * gallops up from the one F_OFD_GETLK reports (tickets are consecutive:
 * a few calls), then halves. Bytes dropped meanwhile may give one no
 * longer held: callers check. */
static off_t highest_held(int fd, off_t lo, off_t hi)
{
    off_t best = dlock__ofd_first(fd, lo, hi), step = 1, top;

    if (best < 0)
        return -1;
    for (;;) {
        off_t from = best + step;
        off_t above = from < hi ? dlock__ofd_first(fd, from, hi) : -1;
        if (above < 0) {
            top = from < hi ? from : hi;
            break;
        }
        best = above;
        step *= 2;
    }
    /* nothing held in [top, hi); best was: look between */
    while (top - best > 1) {
        off_t mid = best + (top - best) / 2;
        off_t c = dlock__ofd_first(fd, mid, top);
        if (c >= 0)
            best = c;
        else
            top = mid;
    }
    return best;
}

/* The path of ticket `ticket`'s channel (`bell` 0: the stream its
 * successors connect to) or doorbell (`bell` 1: the datagram socket a
 * releaser without a channel rings), in the channels' directory:
 * "<prefix>/<ino>.<rowid>.<t>[.r]" in *sa (its length; 0: no channels), its
 * last part in *leaf (NULL: not needed). */
static socklen_t chan_name(struct sockaddr_un *sa, const sq_chans *ch,
                           ino_t ino, int64_t region, off_t t, int bell,
                           const char **leaf)
{
    size_t pl;
    int n;

    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    if (!ch || !ch->prefix[0])
        return 0;
    pl = strlen(ch->prefix);
    n = snprintf(sa->sun_path, sizeof(sa->sun_path), "%s/%llx.%llx.%llx%s",
                 ch->prefix, (unsigned long long)ino,
                 (unsigned long long)region, (unsigned long long)t,
                 bell ? ".r" : "");
    if (n < 0 || (size_t)n >= sizeof(sa->sun_path))
        return 0; /* sq_open() keeps the prefix short enough */
    if (leaf)
        *leaf = sa->sun_path + pl + 1;
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + (size_t)n +
                       1);
}

static socklen_t wchan_name(struct sockaddr_un *sa, const sq_wait *w,
                            off_t ticket, int bell, const char **leaf)
{
    return chan_name(sa, w->ch, w->ino, w->region, ticket - w->base, bell,
                     leaf);
}

/* Binds ticket t's channel (`bell` 0: a listening stream) or doorbell
 * (`bell` 1: a datagram socket): its descriptor, or -1. Called under the
 * region's byte 0 for a ticket nobody holds: a socket file already there
 * is stale (a crashed owner's; a live owner removes its own before it
 * unlocks its byte), and is removed. */
static int chan_bind(const sq_wait *w, off_t t, int bell)
{
    struct sockaddr_un sa;
    const char *leaf = NULL;
    socklen_t len = wchan_name(&sa, w, t, bell, &leaf);
    int s;

    if (!len)
        return -1;
    s = socket(AF_UNIX, (bell ? SOCK_DGRAM : SOCK_STREAM) | SOCK_CLOEXEC |
                            SOCK_NONBLOCK,
               0);
    if (s < 0)
        return -1;
    int r = bind(s, (struct sockaddr *)&sa, len);
    if (r != 0 && errno == EADDRINUSE &&
        dlock__ofd_first(w->fd, t, t + 1) < 0 &&
        unlinkat(w->ch->dirfd, leaf, 0) == 0)
        r = bind(s, (struct sockaddr *)&sa, len);
    if (r != 0) {
        close(s);
        return -1;
    }
    /* group-shared: the group's members connect and ring (write on the
     * socket file); the directory is sticky, so the name is still ours */
    if ((w->ch->group && fchmodat(w->ch->dirfd, leaf, 0660, 0) != 0) ||
        (!bell && listen(s, CHAN_BACKLOG) != 0)) {
        unlinkat(w->ch->dirfd, leaf, 0);
        close(s);
        return -1;
    }
    return s;
}

/* Removes ticket t's socket files (before its byte is unlocked: the next
 * owner of the number makes its own). */
static void chan_unlink(const sq_wait *w, off_t t, int bell)
{
    struct sockaddr_un sa;
    const char *leaf = NULL;

    if (wchan_name(&sa, w, t, bell, &leaf))
        unlinkat(w->ch->dirfd, leaf, 0);
}

int dlock__sqw_take(sq_wait *w, int64_t until)
{
    off_t meta, top, t;
    int e = 0;

    w->base = region_base(w->region);
    w->lfd = w->bfd = -1;
    w->ticket = -1;
    meta = w->base;
    top = w->base + SQW_MARK; /* tickets end below the mark */
    /* byte 0: dlock's takers hold it for a few system calls; anyone else
     * holding it (a process outside dlock) holds us up to `until` or a
     * cancel, never longer (a helper thread waits in the kernel) */
    if (dlock__ofd_lk(w->fd, F_OFD_SETLK, F_WRLCK, meta, 1) != 0) {
        if (errno != EAGAIN && errno != EACCES)
            return errno;
        e = dlock__kwait(w->fd, F_WRLCK, meta, until, w->cfd);
        if (e)
            return e == EAGAIN ? ENOMEM : e; /* EAGAIN: no helper thread */
    }
    t = highest_held(w->fd, meta + 1, top);
    t = t < 0 || t + 1 >= top ? meta + 1 : t + 1; /* 2^32: start again */
    /* channel and doorbell before the byte: a successor that sees the
     * ticket finds them (a stale socket file of a crashed owner is
     * removed; a number whose files cannot be made is skipped) */
    for (int i = 0; i < CHAN_BIND_TRIES; i++, t++) {
        if (t >= top)
            t = meta + 1;
        w->lfd = chan_bind(w, t, 0);
        w->bfd = w->lfd >= 0 ? chan_bind(w, t, 1) : -1;
        if (w->bfd >= 0)
            break;
        if (w->lfd >= 0) {
            chan_unlink(w, t, 0);
            close(w->lfd);
        }
        w->lfd = -1; /* none at all after the last try: kernel waits */
        if (!w->ch || !w->ch->prefix[0])
            break; /* no channels at all: no other number does better */
    }
    if (t >= top)
        t = meta + 1;
    if (dlock__ofd_lk(w->fd, F_OFD_SETLK, F_WRLCK, t, 1) == 0) {
        w->ticket = t;
    } else {
        e = errno == EACCES ? EAGAIN : errno;
        if (w->lfd >= 0) {
            chan_unlink(w, t, 0);
            close(w->lfd);
        }
        if (w->bfd >= 0) {
            chan_unlink(w, t, 1);
            close(w->bfd);
        }
        w->lfd = w->bfd = -1;
    }
    dlock__ofd_lk(w->fd, F_OFD_SETLK, F_UNLCK, meta, 1);
    return e;
}

int dlock__sqw_queued(int fd, int64_t rowid)
{
    off_t base = region_base(rowid);

    /* byte 0 too: someone taking a ticket right now */
    return dlock__ofd_first(fd, base, base + SQW_TICKETS) >= 0;
}

off_t dlock__sqw_pred(const sq_wait *w)
{
    return highest_held(w->fd, w->base + 1, w->ticket);
}

int dlock__sqw_held(const sq_wait *w, off_t p)
{
    return dlock__ofd_first(w->fd, p, p + 1) >= 0;
}

/* Walks the locks other open files hold in [lo, hi), as F_OFD_GETLK
 * reports them (one at a time, from `lo` up, each skipped to its end):
 * counts in *tickets those dlock holds (a write lock on one byte, at most
 * `max`), and returns the start of the first other one (a read lock, or a
 * lock over several bytes: a process outside dlock's) in *odd, with its
 * type, or -1. max 0: stops at the first other one. At most max + 1024
 * calls. */
static void walk_locks(int fd, off_t lo, off_t hi, int64_t max,
                       int64_t *tickets, off_t *odd, short *odd_type)
{
    off_t at = lo;

    *odd = -1;
    for (int64_t i = 0; i < max + 1024 && at < hi; i++) {
        if (max > 0 ? *tickets >= max : *odd >= 0)
            break; /* counted enough; or (max 0) found the odd one */
        struct flock fl;
        if (dlock__ofd_getlk(fd, F_WRLCK, at, hi, &fl) != 0)
            break;
        off_t s = fl.l_start < at ? at : fl.l_start;
        off_t e = fl.l_len == 0 || fl.l_start + fl.l_len > hi
                      ? hi
                      : fl.l_start + fl.l_len;
        if (fl.l_type == F_WRLCK && fl.l_len == 1) {
            (*tickets)++;
        } else if (*odd < 0) {
            *odd = s;
            *odd_type = fl.l_type;
        }
        at = e > s ? e : s + 1;
    }
}

int64_t dlock__sqw_count(int fd, int64_t rowid, int64_t max)
{
    off_t base = region_base(rowid), odd;
    int64_t n = 0;
    short type;

    walk_locks(fd, base + 1, base + SQW_MARK, max, &n, &odd, &type);
    return n;
}

void dlock__sqw_foreign(int fd, int64_t rowid, const char *side, char *out,
                        size_t cap)
{
    off_t base = region_base(rowid), odd = -1;
    int64_t n = 0;
    short type = F_RDLCK;
    const char *what = "this lock's bytes";

    /* region 0: dlock's only lock there is the writers' turn (byte 1, a
     * write lock); a lock's region: tickets (write locks on one byte)
     * and byte 0 (the same, for a moment); the mark (a read lock) is
     * not looked at */
    walk_locks(fd, 0, (off_t)1 << SQW_REGION_SHIFT, 0, &n, &odd, &type);
    if (odd >= 0) {
        what = "the writers' turn (every statement's)";
    } else {
        walk_locks(fd, base, base + SQW_MARK, 0, &n, &odd, &type);
    }
    if (odd < 0)
        return;
    snprintf(out, cap, "a process outside dlock holds a %s lock on %s in "
                       "the wake-up file %.150s: waits end at their "
                       "deadline, and the lock may not be taken until it "
                       "lets go",
             type == F_RDLCK ? "read" : "write", what, side);
}

int dlock__sqw_connect(const sq_wait *w, off_t p)
{
    struct sockaddr_un sa;
    struct ucred cr;
    socklen_t crlen = sizeof(cr);
    socklen_t len = wchan_name(&sa, w, p, 0, NULL);
    int s;

    if (!len)
        return -1;
    s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return -1;
    if (connect(s, (struct sockaddr *)&sa, len) != 0 ||
        getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) != 0 ||
        cr.uid != geteuid() || dlock__ofd_first(w->fd, p, p + 1) < 0) {
        /* refused, another uid's, or p left: its name may be anyone's */
        close(s);
        return -1;
    }
    return s;
}

/* Sleeps on w's doorbell until a ring (SQW_LEFT; drained: a ring says
 * "look again") or `until` (SQW_TIMEOUT), or a negative errno. */
static int bell_wait(const sq_wait *w, int64_t until)
{
    char b[16];
    short rev = 0;
    int n = dlock__poll_until(w->bfd, w->cfd, until, &rev);

    if (n <= 0)
        return n == 0 ? SQW_TIMEOUT : n;
    while (recv(w->bfd, b, sizeof(b), MSG_DONTWAIT) >= 0)
        ;
    return SQW_LEFT;
}

/* Sleeps in poll() on connection c and on w's doorbell (when it has
 * one) until either is readable or `until`: SQW_HANDED (a byte on c),
 * SQW_LEFT (c's end of file), SQW_RUNG (the doorbell only, drained),
 * SQW_TIMEOUT, or a negative errno. */
static int chan_or_bell(const sq_wait *w, int c, int64_t until)
{
    for (;;) {
        /* a negative fd (no doorbell, no cancel) is ignored by poll() */
        struct pollfd pf[3] = {
            {c, POLLIN, 0}, {w->bfd, POLLIN, 0}, {w->cfd, POLLIN, 0}};
        int ms = -1, n;
        if (until != DLOCK__FOREVER) {
            int64_t left = until - dlock__now_ms();
            if (left <= 0)
                return SQW_TIMEOUT;
            ms = left > INT_MAX ? INT_MAX : (int)left;
        }
        n = poll(pf, 3, ms);
        if (n < 0 && errno != EINTR)
            return -errno;
        if (n <= 0)
            continue;
        if (!pf[0].revents && !pf[1].revents)
            return SQW_TIMEOUT; /* cancelled: as at the deadline */
        if (pf[0].revents) {
            char b;
            /* a byte with no end of file behind it: p released (a ring
             * that came with it stays for the next wait: one read) */
            if (pf[0].revents == POLLIN && recv(c, &b, 1, MSG_DONTWAIT) == 1)
                return SQW_HANDED;
            return SQW_LEFT;
        }
        char b[16];
        while (recv(w->bfd, b, sizeof(b), MSG_DONTWAIT) >= 0)
            ;
        return SQW_RUNG;
    }
}

int dlock__sqw_wait(const sq_wait *w, int c, off_t p, int64_t until)
{
    if (c < 0) {
        /* no channel we trust (squatted, or p dying: its socket closed
         * before its byte was unlocked): p's byte, in the kernel, which
         * tells a release and a death alike (a doorbell would hear only
         * the release) */
        /* a write lock: it waits for every lock on p, a read lock that
         * a process outside dlock holds there too (with a read lock it
         * would get in at once, and look again: a spin) */
        int e = dlock__kwait(w->fd, F_WRLCK, p, until, w->cfd);
        if (e == ETIMEDOUT)
            return SQW_TIMEOUT;
        if (e)
            return -e;
        dlock__ofd_lk(w->fd, F_OFD_SETLK, F_UNLCK, p, 1);
        return SQW_LEFT;
    }
    /* the doorbell too: a break that took p's hold rings it (p itself
     * hands nothing over then) */
    return chan_or_bell(w, c, until);
}

int dlock__sqw_bell(const sq_wait *w, int64_t until)
{
    off_t mark = w->base + SQW_MARK;
    int ev = SQW_TIMEOUT;

    /* the mark says "the holder has no ticket here" to dlock_inspect() */
    dlock__ofd_lk(w->fd, F_OFD_SETLK, F_RDLCK, mark, 1);
    if (w->bfd < 0)
        dlock__sqw_sleep(until, w->cfd);
    else
        ev = bell_wait(w, until);
    dlock__ofd_lk(w->fd, F_OFD_SETLK, F_UNLCK, mark, 1);
    return ev;
}

int dlock__sqw_marked(int fd, int64_t rowid)
{
    off_t mark = region_base(rowid) + SQW_MARK;

    return dlock__ofd_first(fd, mark, mark + 1) >= 0;
}

void dlock__sqw_sleep(int64_t until, int cfd)
{
    struct pollfd pf = {cfd, POLLIN, 0}; /* cfd < 0: ignored */

    for (;;) {
        int64_t left = until == DLOCK__FOREVER ? INT_MAX
                                               : until - dlock__now_ms();
        if (left <= 0)
            return;
        if (poll(&pf, 1, left > INT_MAX ? INT_MAX : (int)left) > 0)
            return; /* cancelled */
    }
}

/* Rings the doorbell of the lowest ticket held above w's (its successor,
 * when that one found no channel of ours): 1 if a ring went out. */
static int ring_successor(const sq_wait *w)
{
    struct sockaddr_un sa;
    off_t s = dlock__ofd_first(w->fd, w->ticket + 1, w->base + SQW_MARK);
    int fd, sent;

    if (s < 0)
        return 0; /* nobody queued: the uncontended case costs this */
    socklen_t len = wchan_name(&sa, w, s, 1, NULL);
    if (!len)
        return 0;
    fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return 0;
    sent = sendto(fd, "", 1, MSG_NOSIGNAL, (struct sockaddr *)&sa, len) == 1;
    close(fd);
    return sent;
}

void dlock__sqw_ring_after(int fd, const sq_chans *ch, dev_t dev,
                           ino_t ino, int64_t rowid, int64_t after)
{
    sq_wait w;

    if (after < 0 || after >= SQW_MARK)
        return;
    memset(&w, 0, sizeof(w));
    w.cfd = -1;
    w.fd = fd;
    w.ch = ch;
    w.dev = dev;
    w.ino = ino;
    w.region = rowid;
    w.base = region_base(rowid);
    w.ticket = w.base + (off_t)after; /* byte 0: the lowest ticket of all */
    if (ring_successor(&w))
        sched_yield(); /* the lock is idle until the woken one runs */
}

void dlock__sqw_ring_head(int fd, const sq_chans *ch, dev_t dev, ino_t ino,
                          int64_t rowid)
{
    dlock__sqw_ring_after(fd, ch, dev, ino, rowid, 0);
}

int dlock__sqw_drop(sq_wait *w, int wake)
{
    int woken = -1, fd = w->fd;

    if (w->fd < 0)
        return -1;
    /* the doorbell before the ticket: the next owner of this ticket
     * number must be able to bind it (a head without one could only
     * sleep to the lease end) */
    if (w->bfd >= 0) {
        chan_unlink(w, w->ticket, 1);
        close(w->bfd);
    }
    w->bfd = -1;
    /* the channel's file too (its listener stays: successors connected
     * or pending keep their connections) */
    if (w->lfd >= 0)
        chan_unlink(w, w->ticket, 0);
    /* the ticket next: a successor that connects or arms from now on
     * finds it free and does not wait on us */
    dlock__ofd_lk(w->fd, F_OFD_SETLK, F_UNLCK, 0, 0);
    if (w->lfd >= 0 && wake)
        woken = dlock__chan_wake(w->lfd);
    /* no successor on our channel (we had none, or it could not connect
     * before we made it): the next ticket may wait on its doorbell */
    if (woken < 0 && w->ticket >= 0 && ring_successor(w))
        woken = -2;
    if (woken != -1)
        sched_yield(); /* the lock is idle until the successor runs */
    if (w->lfd >= 0) /* other pending connections get end of file */
        dlock__chan_close(w->lfd, woken >= 0 ? woken : -1);
    w->fd = w->lfd = -1;
    w->ticket = -1;
    return fd;
}
