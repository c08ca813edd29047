/* SPDX-License-Identifier: MIT */
/*
 * kwait.c -- waiting in the kernel for an OFD lock, with a deadline and a
 * cancel (kwait.h). Shared by the file and SQLite stores.
 *
 * F_OFD_SETLKW cannot be given a deadline, so a timed wait runs it in a
 * short-lived helper thread that the caller cancels when the deadline
 * passes or its cancel's eventfd is readable (glibc makes F_OFD_SETLKW a
 * cancellation point; no signal handler is installed). Nothing polls: the
 * caller sleeps in poll() on the helper's eventfd.
 */
#include "kwait.h"

#include "store.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

typedef struct kwait {
    int fd;
    short type;  /* F_WRLCK (MAIN, a predecessor's ticket) or F_RDLCK */
    off_t byte;
    int rc;      /* errno of a failed call, 0 when the lock was taken */
    int done;    /* set (atomically) once rc is */
    int done_fd; /* eventfd: the helper says it is done */
} kwait;

/* The blocking part: one F_OFD_SETLKW, a cancellation point. */
static int kwait_run(kwait *k)
{
    while (dlock__ofd_lk(k->fd, F_OFD_SETLKW, k->type, k->byte, 1) != 0) {
        if (errno != EINTR)
            return errno;
    }
    return 0;
}

static void *kwait_thread(void *arg)
{
    kwait *k = arg;
    int rc = kwait_run(k);
    int old;
    uint64_t one = 1;
    ssize_t n;

    /* no cancellation point since the lock was taken: it is reported */
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
    k->rc = rc;
    __atomic_store_n(&k->done, 1, __ATOMIC_RELEASE);
    do
        n = write(k->done_fd, &one, sizeof(one));
    while (n < 0 && errno == EINTR);
    return NULL;
}

int dlock__poll_until(int fd, int cfd, int64_t deadline, short *revents)
{
    struct pollfd p[2];

    for (;;) {
        int ms = -1, n;
        if (deadline != DLOCK__FOREVER) {
            int64_t left = deadline - dlock__now_ms();
            if (left <= 0)
                return 0;
            ms = left > INT_MAX ? INT_MAX : (int)left;
        }
        p[0].fd = fd;
        p[0].events = POLLIN;
        p[0].revents = 0;
        p[1].fd = cfd;
        p[1].events = POLLIN;
        p[1].revents = 0;
        n = poll(p, cfd >= 0 ? 2 : 1, ms);
        if (n > 0 && p[0].revents) {
            if (revents)
                *revents = p[0].revents;
            return 1;
        }
        if (n > 0)
            return 0; /* cancelled */
        if (n < 0 && errno != EINTR)
            return -errno;
    }
}

/* Blocks until open file `fd` holds a lock of `type` on `byte`, the
 * deadline passes or cfd (a cancel's eventfd, -1: none) becomes readable.
 * 0: taken; ETIMEDOUT (the deadline or the cancel); or an errno. Without
 * a deadline or a cancel the calling thread blocks itself; else a helper
 * thread blocks, and is cancelled (no signal handler needed). */
int dlock__kwait(int fd, short type, off_t byte, int64_t deadline, int cfd)
{
    kwait k;
    pthread_t t;
    sigset_t old;
    void *res = NULL;
    int rc;

    memset(&k, 0, sizeof(k));
    k.fd = fd;
    k.type = type;
    k.byte = byte;
    if (deadline == DLOCK__FOREVER && cfd < 0)
        return kwait_run(&k);
    if (dlock__now_ms() >= deadline)
        return ETIMEDOUT;

    k.done_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (k.done_fd < 0)
        return errno;
    dlock__block_signals(&old);
    rc = pthread_create(&t, NULL, kwait_thread, &k);
    dlock__restore_signals(&old);
    if (rc == 0) {
        int r = dlock__poll_until(k.done_fd, cfd, deadline, NULL);
        if (!__atomic_load_n(&k.done, __ATOMIC_ACQUIRE))
            pthread_cancel(t);
        pthread_join(t, &res);
        rc = res == PTHREAD_CANCELED ? ETIMEDOUT
             : r < 0 && !k.done      ? -r
                                     : k.rc;
    }
    close(k.done_fd);
    return rc;
}

int dlock__kwait_any(int fd, const off_t *bytes, int nb, const int *fds,
                     int nfds, int64_t deadline, int cfd)
{
    kwait *k = calloc((size_t)(nb > 0 ? nb : 1), sizeof(*k));
    pthread_t *t = calloc((size_t)(nb > 0 ? nb : 1), sizeof(*t));
    char *started = calloc((size_t)(nb > 0 ? nb : 1), 1);
    struct pollfd *p = calloc((size_t)nfds + 2, sizeof(*p));
    int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), rc = ETIMEDOUT;
    sigset_t old;

    if (!k || !t || !started || !p || efd < 0) {
        rc = efd < 0 ? errno : ENOMEM;
        goto out;
    }
    dlock__block_signals(&old);
    for (int i = 0; i < nb; i++) {
        k[i].fd = fd;
        k[i].type = F_WRLCK;
        k[i].byte = bytes[i];
        k[i].done_fd = efd;
        started[i] = pthread_create(&t[i], NULL, kwait_thread, &k[i]) == 0;
    }
    dlock__restore_signals(&old);
    for (;;) {
        int ms = -1, n;
        if (deadline != DLOCK__FOREVER) {
            int64_t left = deadline - dlock__now_ms();
            if (left <= 0)
                break;
            ms = left > INT_MAX ? INT_MAX : (int)left;
        }
        p[0].fd = efd;
        p[0].events = POLLIN;
        p[0].revents = 0;
        for (int i = 0; i < nfds; i++) {
            p[1 + i].fd = fds[i];
            p[1 + i].events = POLLIN;
            p[1 + i].revents = 0;
        }
        p[1 + nfds].fd = cfd; /* a negative fd is ignored */
        p[1 + nfds].events = POLLIN;
        p[1 + nfds].revents = 0;
        n = poll(p, (nfds_t)nfds + 2, ms);
        if (n > 0) {
            rc = p[1 + nfds].revents ? ETIMEDOUT : 0;
            break;
        }
        if (n < 0 && errno != EINTR) {
            rc = errno;
            break;
        }
    }
    for (int i = 0; i < nb; i++) {
        if (!started[i])
            continue;
        if (!__atomic_load_n(&k[i].done, __ATOMIC_ACQUIRE))
            pthread_cancel(t[i]);
        pthread_join(t[i], NULL);
        if (k[i].done && k[i].rc != 0 && rc == 0)
            rc = k[i].rc; /* a failed wait: not a byte freed */
        /* what a helper took is only a sign: give it back (no byte in
         * `bytes` is one of ours) */
        dlock__ofd_lk(fd, F_OFD_SETLK, F_UNLCK, bytes[i], 1);
    }
out:
    if (efd >= 0)
        close(efd);
    free(k);
    free(t);
    free(started);
    free(p);
    return rc;
}

void dlock__timer_within(int fd, int64_t in_ms)
{
    struct itimerspec its, cur;

    if (in_ms < 1)
        in_ms = 1;
    memset(&its, 0, sizeof(its));
    its.it_value.tv_sec = in_ms / 1000;
    its.it_value.tv_nsec = (in_ms % 1000) * 1000000L;
    if (timerfd_gettime(fd, &cur) == 0 &&
        (cur.it_value.tv_sec || cur.it_value.tv_nsec) &&
        (cur.it_value.tv_sec < its.it_value.tv_sec ||
         (cur.it_value.tv_sec == its.it_value.tv_sec &&
          cur.it_value.tv_nsec <= its.it_value.tv_nsec)))
        return; /* it fires sooner anyway */
    timerfd_settime(fd, 0, &its, NULL);
}
