/* SPDX-License-Identifier: MIT */
/*
 * util.c -- small helpers: time, randomness, thread ids, hashing, waits.
 */
#include "internal.h"

#include <pthread.h>

#include <errno.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

int64_t dlock__now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void dlock__wipe(void *p, size_t n)
{
    explicit_bzero(p, n);
}

int dlock__random(void *buf, size_t n)
{
    unsigned char *b = buf;

    while (n > 0) {
        ssize_t got = getrandom(b, n, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return dlock__err(DLOCK_ENOMEM, "getrandom failed: %s",
                              strerror(errno));
        }
        b += got;
        n -= (size_t)got;
    }
    return DLOCK_OK;
}

/* The calling thread's id and process id, asked of the kernel once per
 * thread (each is a system call, a microsecond or two on a VM, and the
 * acquire and release paths need them). A fork() child's only thread
 * inherits the caches: the handler below, registered once per process,
 * clears them there. */
static _Thread_local long tls_tid, tls_pid;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

static void forked_child(void)
{
    tls_tid = 0;
    tls_pid = 0;
}

static void register_atfork(void)
{
    (void)pthread_atfork(NULL, NULL, forked_child);
}

long dlock__tid(void)
{
    if (!tls_tid) {
        pthread_once(&atfork_once, register_atfork);
        tls_tid = (long)gettid();
    }
    return tls_tid;
}

long dlock__pid(void)
{
    if (!tls_pid) {
        pthread_once(&atfork_once, register_atfork);
        tls_pid = (long)getpid();
    }
    return tls_pid;
}

/* FNV-1a, 64 bits: spreads names over hash buckets and file names. */
uint64_t dlock__hash(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;

    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

int dlock__cond_init(pthread_cond_t *cv)
{
    pthread_condattr_t a;
    int rc;

    if (pthread_condattr_init(&a) != 0)
        return dlock__err(DLOCK_ENOMEM, "pthread_condattr_init failed");
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    rc = pthread_cond_init(cv, &a);
    pthread_condattr_destroy(&a);
    if (rc != 0)
        return dlock__err(DLOCK_ENOMEM, "pthread_cond_init failed");
    return DLOCK_OK;
}

void dlock__cond_wait_until(pthread_cond_t *cv, pthread_mutex_t *mu,
                            int64_t deadline)
{
    struct timespec ts;

    if (deadline == DLOCK__FOREVER) {
        pthread_cond_wait(cv, mu);
        return;
    }
    ts.tv_sec = (time_t)(deadline / 1000);
    ts.tv_nsec = (long)(deadline % 1000) * 1000000L;
    pthread_cond_timedwait(cv, mu, &ts);
}

void dlock__block_signals(sigset_t *old)
{
    sigset_t all;

    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, old);
}

void dlock__restore_signals(const sigset_t *old)
{
    pthread_sigmask(SIG_SETMASK, old, NULL);
}
