/* SPDX-License-Identifier: MIT */
/*
 * acquire.c -- a new hold: its tries, and the wait between them (lock.c
 * checks the call and counts re-entries; this file runs what reaches the
 * store).
 *
 * Waiting (stores without CAP_NATIVE_WAIT) follows one order that cannot
 * miss a wake-up:
 *   1. try;                          (uncontended: done, one round trip)
 *   2. register as a waiter;         (wake-ups from now on are latched)
 *   3. arm the store's notifications (subscribe; acknowledged);
 *   4. try again; on EBUSY sleep until a wake-up, the holder's lease end
 *      (retry_ms, so a crashed holder who published nothing is noticed),
 *      or the caller's deadline; repeat.
 * A release between 1 and 3 is caught by the try in 4; one after 3 wakes
 * us. No store command is sent between wake-ups.
 */
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* An owner number of a DLOCK_OWNER_HANDLE handle, where a thread id goes
 * in the owner string ("CLIENT:NUMBER"; stores read it as a number):
 * above every thread id Linux gives (at most 2^22). */
#define HANDLE_OWNER_BASE (1LL << 40)
#define MIN_OP_MS DLOCK__MIN_OP_MS
/* The backoff of a wait whose store is unreachable (docs/design.md,
 * "Waiting through failovers and restarts"): a timed retry, since a
 * server that is down sends nothing and the kernel has no event for a
 * port that listens again. */
#define BACKOFF_MIN_MS 25
#define BACKOFF_MAX_MS 1000

int dlock__is_cancelled(const int *flag)
{
    return flag && __atomic_load_n(flag, __ATOMIC_ACQUIRE);
}

int dlock__cancel_message(const dlock__hold *h, int64_t waited)
{
    /* shut: only for the words (set before the cancel flag it follows) */
    int shut = __atomic_load_n(&h->handle->shut, __ATOMIC_RELAXED);

    return dlock__err(DLOCK_ECANCELED,
                      "lock '%.200s': the wait was cancelled after %lld ms "
                      "(%s())",
                      h->entry->name, (long long)waited,
                      shut ? "dlock_shutdown" : "dlock_cancel");
}

/* An acquire through a handle that dlock_shutdown() shut. */
int dlock__shut_message(const dlock *l)
{
    return dlock__err(DLOCK_ECANCELED,
                      "lock '%.200s': shut down (dlock_shutdown())",
                      l->entry->name);
}

static int busy_message(const dlock__hold *h, int64_t waited)
{
    if (waited <= 0)
        return dlock__err(DLOCK_EBUSY, "lock '%.200s' is held by another "
                                       "owner",
                          h->lease.name);
    return dlock__err(DLOCK_EBUSY,
                      "lock '%.200s' was held by another owner for the "
                      "whole wait (%lld ms)",
                      h->lease.name, (long long)waited);
}

/* A store call made during a wait that failed with DLOCK_ECONN only
 * because the caller's deadline cut it short (it had less than the
 * client's timeout), after the store had answered "held" during this
 * wait: the wait ran out; the store is slow, not unreachable. (One that
 * never answered stays DLOCK_ECONN.) */
static int cut_short(const dlock_client *c, int rc, int seen_busy,
                     int64_t started, int64_t op_dl, int64_t deadline)
{
    return rc == DLOCK_ECONN && seen_busy && deadline != DLOCK__FOREVER &&
           op_dl < started + c->timeout_ms && dlock__now_ms() >= deadline;
}

static int ran_out(const dlock__hold *h)
{
    return dlock__err(DLOCK_EBUSY,
                      "lock '%.200s' was held by another owner, and not "
                      "acquired within the wait (the last try did not "
                      "finish before the deadline)",
                      h->lease.name);
}

/* A failure a waiting acquire rides out: the store unreachable, no
 * answer, a broken connection, a failover in progress. Anything else
 * ends the wait at once. */
static int transient(int rc)
{
    return rc == DLOCK_ECONN;
}

/* A wait whose store failed on every call since `since` ran out: the
 * last cause (the message of the last failed call), and for how long. */
static int unreachable(int rc, int64_t since)
{
    char keep[512];

    snprintf(keep, sizeof(keep), "%s", dlock_errmsg());
    return dlock__err(rc, "%s (unreachable for %lld ms, until the wait's "
                          "deadline)",
                      keep, (long long)(dlock__now_ms() - since));
}

/* The next backoff step after `*step` (0: the first), and when the
 * sleep ends: never past the deadline. */
static int64_t backoff(int64_t *step, int64_t deadline)
{
    int64_t now = dlock__now_ms();

    *step = *step == 0                    ? BACKOFF_MIN_MS
            : *step * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS
                                          : *step * 2;
    return deadline - now > *step ? now + *step : deadline;
}

/* One try; records when it started, for the lease's local end, and
 * whether the store answered "held". */
static int try_once(dlock_client *c, dlock__hold *h, int64_t *t0,
                    int64_t deadline, int once, int *seen_busy,
                    int64_t *t_end_us)
{
    int64_t dl;
    int rc;

    int64_t u0 = dlock__now_us();

    *t0 = u0 / 1000;
    dl = dlock__op_deadline(c, deadline, once);
    h->lease.started = 0;
    h->lease.woken_us = 0;
    rc = c->be->acquire(c->st, &h->lease, dl);
    /* one store operation, unless the store waited in it */
    if (dlock__m_on(&c->m) &&
        (once || !(c->be->caps & DLOCK__CAP_NATIVE_WAIT))) {
        *t_end_us = dlock__now_us();
        dlock__m_store_op(&c->m, *t_end_us - u0, rc);
    } else {
        *t_end_us = 0;
    }
    if (rc == DLOCK_OK && h->lease.started)
        *t0 = h->lease.started; /* a native wait: the lease began later;
                                 * a hand-over confirmed by a read: it
                                 * began after that earlier command */
    if (rc == DLOCK_EBUSY)
        *seen_busy = 1;
    else if (!once && cut_short(c, rc, *seen_busy, *t0, dl, deadline))
        rc = ran_out(h);
    return rc;
}

/* Registers w as a waiter of h's lock (before the first try, so that a
 * wake-up or hand-over that follows that try is latched). */
static int waiter_add(dlock_client *c, dlock__waiter *w, dlock__hold *h)
{
    int rc;

    memset(w, 0, sizeof(*w));
    rc = dlock__cond_init(&w->cv);
    if (rc)
        return rc;
    w->seq = h->lease.waiter;
    w->cancelled = h->lease.cancelled;
    w->thread = pthread_self();
    w->entry = h->entry;
    w->fair = (h->lease.flags & DLOCK_FAIR) != 0;

    pthread_mutex_lock(&c->mu);
    /* append: the oldest waiter of a name is woken first */
    dlock__waiter **pp = &c->waiters;
    while (*pp) {
        w->prev = *pp;
        pp = &(*pp)->next;
    }
    *pp = w;
    pthread_mutex_unlock(&c->mu);
    return DLOCK_OK;
}

static void waiter_remove(dlock_client *c, dlock__waiter *w, int acquired)
{
    pthread_mutex_lock(&c->mu);
    DLOCK__UNLINK(c->waiters, w);
    /* A wake-up we did not use belongs to another waiter of the name. */
    if (w->notified && !acquired && !w->fair) {
        for (dlock__waiter *o = c->waiters; o; o = o->next) {
            if (o->entry == w->entry && !o->fair && !o->notified) {
                o->notified = 1;
                pthread_cond_signal(&o->cv);
                break;
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    pthread_cond_destroy(&w->cv);
}

/* One round of reading the backend's fd on this waiting thread, until
 * something arrives or `wake_at` (c->mu NOT held). Wake-ups that do not
 * come through the fd arrive on the client's reader eventfd. */
static void read_for_all(dlock_client *c, int64_t wake_at)
{
    int fd = c->be->loop_fd(c->st);
    struct pollfd p[2];
    int64_t now = dlock__now_ms();
    int n = 0, timeout, readable = 0;

    p[n].fd = c->reader_fd;
    p[n++].events = POLLIN;
    if (fd >= 0) {
        p[n].fd = fd;
        p[n++].events = POLLIN;
    }
    if (wake_at == DLOCK__FOREVER)
        timeout = -1;
    else
        timeout = wake_at <= now ? 0
                  : wake_at - now > 60000 ? 60000
                                          : (int)(wake_at - now);
    if (poll(p, (nfds_t)n, timeout) > 0) {
        if (p[0].revents & POLLIN) {
            uint64_t v;
            if (read(c->reader_fd, &v, sizeof(v)) < 0) {
                /* drained already */
            }
        }
        readable = n == 2 && (p[1].revents & (POLLIN | POLLERR | POLLHUP));
    }
    if (readable)
        c->be->loop_run(c->st, 1);
}

/* Sleeps until w is woken, handed the lock or told to re-arm, the client
 * closes, or wake_at (c->mu held on entry and exit). On a store whose
 * notifications may be read by a waiting thread, the first waiter to
 * sleep reads them for the whole client, so that its own wake-up comes
 * straight from the kernel; it passes the reading on when it stops. */
static void sleep_until(dlock_client *c, dlock__waiter *w, int64_t wake_at)
{
    int reads = (c->be->caps & DLOCK__CAP_WAITER_READS) && c->be->loop_fd;

    while (!w->notified && !w->granted && !w->rearm && !c->closed &&
           !dlock__is_cancelled(w->cancelled) && dlock__now_ms() < wake_at) {
        if (reads && (!c->reader || c->reader == w)) {
            __atomic_store_n(&c->reader, w, __ATOMIC_RELAXED);
            pthread_mutex_unlock(&c->mu);
            read_for_all(c, wake_at);
            pthread_mutex_lock(&c->mu);
            continue;
        }
        w->sleeping = 1;
        dlock__cond_wait_until(&w->cv, &c->mu, wake_at);
        w->sleeping = 0;
    }
    if (c->reader == w) {
        /* Another sleeping waiter reads from now on. With none, the
         * background thread takes the fd back at its next wake-up: until
         * then nobody waits for what it brings (a thread that arms waits
         * for an answer on it, and wakes the background thread first) --
         * unless it woke it while this one still read: then the
         * background thread left the fd alone, and a thread in arm()
         * waited for its answer until its deadline (found on a cluster,
         * where arms are frequent: readers 1.7 s late). So with no
         * sleeping waiter to take over, the background thread is woken
         * to take the fd back now. */
        /* The next reader is named here, and it must be one that will
         * read: a sleeping waiter this very read woke (granted, told to
         * re-arm) would leave without reading, and the others would
         * sleep with their wake-ups unread until the background thread's
         * next wake-up (seen: waiters 10 s late after a burst of
         * hand-overs to one client). Named, it reads when it wakes, or
         * passes the reading on in turn if its own wait ends first. */
        dlock__waiter *next = NULL;
        for (dlock__waiter *o = c->waiters; o && !next; o = o->next)
            if (o != w && o->sleeping && !o->notified && !o->granted &&
                !o->rearm && !dlock__is_cancelled(o->cancelled))
                next = o;
        __atomic_store_n(&c->reader, next, __ATOMIC_RELAXED);
        if (next)
            pthread_cond_signal(&next->cv);
        else
            dlock__wake(c);
    }
}

/* After arm() or a try cut short by the deadline: see cut_short(). */
static int armed(dlock_client *c, dlock__hold *h, int64_t deadline,
                 int seen_busy)
{
    int64_t t0 = dlock__now_ms(), dl = dlock__op_deadline(c, deadline, 0);
    int rc = c->be->arm(c->st, &h->lease, dl);

    if (cut_short(c, rc, seen_busy, t0, dl, deadline))
        rc = ran_out(h);
    return rc;
}

/* The wait, once the first try found the lock busy or the store
 * unreachable (`rc`: DLOCK_EBUSY or a transient error; stores without
 * CAP_NATIVE_WAIT). *t0 gets the start of the try or call whose answer
 * started the lease; *t_busy is the start of the last try answered
 * "held": a lock the store hands over was handed after that. While the
 * store fails, the waiter sleeps on a capped backoff (or until the store
 * wakes it) and then re-arms and tries again; *failing says whether it
 * still did when the wait ended. */
static int wait_loop(dlock_client *c, dlock__hold *h, dlock__waiter *w,
                     int64_t start, int64_t deadline, int64_t *t0,
                     int64_t *t_busy, int *seen_busy, int rc, int *failing)
{
    int need_try = 0, need_arm = 0;
    /* began: the start of the last store call (the first try's, first) */
    int64_t step = 0, since = 0, began = *t0;

    *failing = 0;
    if (rc == DLOCK_EBUSY) {
        rc = DLOCK_OK;
        if (!h->lease.armed) {
            if (c->be->arm)
                rc = armed(c, h, deadline, *seen_busy);
            need_try = 1;
        }
    }
    h->lease.waiting = 1;
    for (;;) {
        int64_t now, wake_at = deadline;

        if (rc == DLOCK_OK && need_try) {
            int64_t t_end;
            began = dlock__now_ms();
            if (need_arm && c->be->arm)
                rc = armed(c, h, deadline, *seen_busy);
            need_arm = 0;
            if (rc == DLOCK_OK) {
                rc = try_once(c, h, t0, deadline, 0, seen_busy, &t_end);
                if (rc == DLOCK_OK)
                    return rc;
            }
            if (rc == DLOCK_EBUSY) {
                *t_busy = *t0;
                need_try = 0;
                rc = DLOCK_OK;
                /* answered: the store is back */
                *failing = 0;
                step = 0;
            }
        }
        if (rc != DLOCK_OK) {
            if (!transient(rc))
                return rc;
            /* the store failed: sleep, then re-arm and try again */
            if (!*failing)
                since = began;
            *failing = 1;
            if (dlock__now_ms() >= deadline)
                return unreachable(rc, since);
            wake_at = backoff(&step, deadline);
            need_arm = need_try = 1;
            rc = DLOCK_OK;
        } else {
            now = dlock__now_ms();
            if (h->lease.retry_ms >= 0 &&
                now + h->lease.retry_ms + 1 < wake_at)
                wake_at = now + h->lease.retry_ms + 1;
        }

        pthread_mutex_lock(&c->mu);
        sleep_until(c, w, wake_at);
        int granted = w->granted, rearm = w->rearm, closed = c->closed;
        uint64_t token = w->token;
        w->notified = 0;
        w->rearm = 0;
        w->granted = 0;
        pthread_mutex_unlock(&c->mu);

        if (granted) {
            /* the store's own answer handed it over (the reply of a
             * release of this client: dlock__notify_grant(), never a
             * pushed message), after the last "held": the lease started
             * then at the latest, from where this thread stands */
            now = dlock__now_ms();
            if (*t_busy + h->lease.ttl_ms -
                    dlock__client_margin(c, h->lease.ttl_ms) > now) {
                h->lease.token = token;
                *t0 = *t_busy;
                *failing = 0;
                return DLOCK_OK;
            }
            need_try = 1; /* too late to trust: a try adopts it if ours */
            continue;
        }
        if (closed)
            return dlock__err(DLOCK_EINVAL, "the client was closed during "
                                            "the wait");
        if (dlock__is_cancelled(h->lease.cancelled))
            return dlock__cancel_message(h, dlock__now_ms() - start);
        if (dlock__now_ms() >= deadline) {
            if (*failing) /* the last call's message is still ours */
                return unreachable(DLOCK_ECONN, since);
            return busy_message(h, dlock__now_ms() - start);
        }
        if (rearm)
            need_arm = 1;
        need_try = 1;
    }
}

/* A store that waits by itself (CAP_NATIVE_WAIT) failed transiently
 * during a wait: call it again after a backoff (a sleep in poll() on the
 * wait's cancel eventfd), until it answers otherwise, the deadline or a
 * cancel. */
static int ride_out(dlock_client *c, dlock__hold *h, int64_t *t0,
                    int64_t start, int64_t deadline, int *seen_busy,
                    int64_t *t_end_us, int rc)
{
    int64_t step = 0, since = *t0; /* the failed try's start */

    while (transient(rc)) {
        if (dlock__now_ms() >= deadline)
            return unreachable(rc, since);
        int64_t wake_at = backoff(&step, deadline);
        for (;;) {
            int64_t now = dlock__now_ms();
            if (dlock__is_cancelled(h->lease.cancelled))
                return dlock__cancel_message(h, now - start);
            if (now >= wake_at)
                break;
            struct pollfd p = {h->lease.cancel_fd, POLLIN, 0};
            /* no cancel fd: a plain sleep, still checked above */
            (void)poll(&p, p.fd >= 0 ? 1 : 0, (int)(wake_at - now));
        }
        if (dlock__now_ms() >= deadline)
            return unreachable(rc, since);
        rc = try_once(c, h, t0, deadline, 0, seen_busy, t_end_us);
    }
    return rc;
}

/* A wait ends without the lock: leave the store's queue. A store that
 * hands locks over may have handed this one to us meanwhile; then it is
 * ours (DLOCK_OK, its lease restarted at *t0). */
static int leave_queue(dlock_client *c, dlock__hold *h, int rc, int64_t *t0,
                       int failing)
{
    int64_t a0 = dlock__now_ms();
    int r;

    if (!c->be->abandon)
        return rc;
    if ((rc == DLOCK_EBUSY || rc == DLOCK_ECANCELED) && !failing) {
        r = c->be->abandon(c->st, &h->lease, a0 + c->timeout_ms);
        if (r == DLOCK_OK)
            *t0 = a0;
        return r == DLOCK_EBUSY ? rc : r;
    }
    /* the store failed (or failed until the wait was cancelled): send
     * the leaving on its way, keep the error -- unless the store answers
     * that the lock is ours (a try whose answer the deadline cut short
     * took it): then it is held, as above, not left to its lease's end */
    char keep[512];
    snprintf(keep, sizeof(keep), "%s", dlock_errmsg());
    r = c->be->abandon(c->st, &h->lease, a0 + MIN_OP_MS);
    if (r == DLOCK_OK) {
        *t0 = a0;
        return DLOCK_OK;
    }
    return dlock__err(rc, "%s", keep);
}

/* Counts an acquire that ended without the lock. */
static void acquire_failed(dlock_client *c, const dlock *l, int rc,
                           int waited, int64_t start_us)
{
    dlock__mslot *ms = l->entry->ms;

    if (!dlock__m_on(&c->m))
        return;
    if (rc == DLOCK_EBUSY)
        dlock__m_inc(ms, DLOCK__M_BUSY);
    if (waited) {
        dlock__m_inc(ms, DLOCK__M_WAITED);
        dlock__hist_observe(&ms->h[DLOCK__H_WAIT],
                            dlock__now_us() - start_us);
    }
}

static int acquire_run(dlock_client *c, dlock *l, unsigned kind,
                       int64_t wait_ms, int64_t start, int64_t start_us,
                       int64_t deadline, uint64_t seq, dlock__cancel *cx,
                       const char *value);

/* Takes cx out of l's acquires in progress (c->mu held). */
static void unlink_cancel(dlock *l, dlock__cancel *cx)
{
    for (dlock__cancel **pp = &l->cancels; *pp; pp = &(*pp)->next) {
        if (*pp == cx) {
            *pp = cx->next;
            return;
        }
    }
}

/* An acquire that makes a new hold (acquire() checked it may): while it
 * may wait, in the handle's list for dlock_cancel(). A dlock_shutdown()
 * between acquire()'s check and the registration here refuses it here,
 * under the same mutex, before it reaches the store: every wait either
 * is in the list when the handle is shut, or sees the handle shut. (A
 * try, wait_ms 0, is not registered: one that passed acquire()'s check
 * was in progress when the shutdown came, and ends after its one store
 * call as a try in progress at a dlock_cancel() does.) */
int dlock__acquire_new(dlock_client *c, dlock *l, unsigned kind,
                       int64_t wait_ms, int64_t start, int64_t start_us,
                       int64_t deadline, uint64_t seq, dlock__set *set,
                       const char *value)
{
    dlock__cancel cx = {-1, 0, NULL, NULL};
    int rc;

    if (wait_ms == 0)
        return acquire_run(c, l, kind, wait_ms, start, start_us, deadline,
                           seq, NULL, value);
    /* a store that waits by itself may sleep in poll(): it watches an
     * eventfd of the wait's own (the core's own wait needs none), reused
     * from the client's finished waits: no system call on the way of an
     * acquire that may wait and does not */
    int native = (c->be->caps & DLOCK__CAP_NATIVE_WAIT) != 0;
    pthread_mutex_lock(&c->mu);
    if (l->shut) {
        pthread_mutex_unlock(&c->mu);
        return dlock__shut_message(l);
    }
    if (native && c->n_cfd_free > 0)
        cx.fd = c->cfd_free[--c->n_cfd_free];
    cx.next = l->cancels;
    l->cancels = &cx;
    if (set) {
        /* the set's acquire now; a cancel of the set since its last one
         * cancels this one (fired under this mutex as cancels are) */
        set->cur = &cx;
        if (__atomic_load_n(&set->flag, __ATOMIC_ACQUIRE))
            dlock__cancel_fire(&cx);
    }
    pthread_mutex_unlock(&c->mu);
    if (native && cx.fd < 0) {
        int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (fd < 0) {
            int err = errno;
            pthread_mutex_lock(&c->mu);
            unlink_cancel(l, &cx);
            if (set)
                set->cur = NULL;
            pthread_mutex_unlock(&c->mu);
            return dlock__err(DLOCK_ENOMEM, "lock '%.200s': eventfd: %s",
                              l->entry->name, strerror(err));
        }
        pthread_mutex_lock(&c->mu);
        cx.fd = fd;
        if (cx.flag) { /* cancelled already */
            uint64_t one = 1;
            if (write(fd, &one, sizeof(one)) < 0) {
                /* an eventfd this new cannot be full */
            }
        }
        pthread_mutex_unlock(&c->mu);
    }
    rc = acquire_run(c, l, kind, wait_ms, start, start_us, deadline, seq,
                     &cx, value);
    pthread_mutex_lock(&c->mu);
    unlink_cancel(l, &cx);
    if (set)
        set->cur = NULL;
    pthread_mutex_unlock(&c->mu);
    if (cx.fd >= 0) {
        /* drained (a cancel made it readable), then kept for the next
         * wait; no cancel can reach it once unlinked */
        uint64_t v;
        if (cx.flag && read(cx.fd, &v, sizeof(v)) < 0) {
            /* not readable: nothing to drain */
        }
        pthread_mutex_lock(&c->mu);
        if (c->n_cfd_free < (int)(sizeof(c->cfd_free) /
                                  sizeof(c->cfd_free[0]))) {
            c->cfd_free[c->n_cfd_free++] = cx.fd;
            cx.fd = -1;
        }
        pthread_mutex_unlock(&c->mu);
        if (cx.fd >= 0)
            close(cx.fd);
    }
    return rc;
}

/* The acquire itself; cx: its cancel (NULL when it does not wait). */
static int acquire_run(dlock_client *c, dlock *l, unsigned kind,
                       int64_t wait_ms, int64_t start, int64_t start_us,
                       int64_t deadline, uint64_t seq, dlock__cancel *cx,
                       const char *value)
{
    dlock__hold *h;
    dlock__waiter w;
    pthread_t self = pthread_self();
    int64_t t0 = 0, t_busy = 0, woken_us = 0;
    int64_t try_end_us = 0;
    int rc, seen_busy = 0, waits, waited = 0, failing = 0;

    h = calloc(1, sizeof(*h) + c->be->lease_size);
    if (!h)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    h->handle = l;
    h->entry = l->entry;
    h->thread = self;
    if (dlock__by_handle(l)) {
        snprintf(h->owner, sizeof(h->owner), "%s:%lld", c->id,
                 HANDLE_OWNER_BASE + (long long)l->seq);
        snprintf(h->desc, sizeof(h->desc), "%.64s pid %ld handle %llu",
                 c->host, c->pid, (unsigned long long)l->seq);
    } else {
        long tid = dlock__tid();
        snprintf(h->owner, sizeof(h->owner), "%s:%ld", c->id, tid);
        snprintf(h->desc, sizeof(h->desc), "%.64s pid %ld tid %ld", c->host,
                 c->pid, tid);
    }
    if (value && *value) /* a campaign: the leader's value (elect.c) */
        snprintf(h->desc, sizeof(h->desc), "%s", value);
    h->lease.name = l->entry->name;
    h->lease.name_len = l->entry->len;
    h->lease.owner = h->owner;
    h->lease.desc = h->desc;
    h->lease.ttl_ms = l->opts.ttl_ms;
    /* the first lease covers the at-least time and ends by the at-most
     * time (docs/design.md, "Scheduled jobs") */
    if (l->opts.at_least_ms > h->lease.ttl_ms)
        h->lease.ttl_ms = l->opts.at_least_ms;
    if (l->opts.at_most_ms && l->opts.at_most_ms < h->lease.ttl_ms)
        h->lease.ttl_ms = l->opts.at_most_ms;
    h->lease.flags = l->opts.flags;
    h->lease.kind = kind;
    h->lease.permits = kind == DLOCK__PERMIT ? l->opts.permits : 0;
    h->lease.waiter = seq;
    h->lease.deadline = wait_ms == 0 ? start : deadline;
    h->lease.retry_ms = -1;
    h->lease.cancel_fd = cx ? cx->fd : -1;
    h->lease.cancelled = cx ? &cx->flag : NULL;
    h->lease.hint = l->entry->hint;
    h->lease.priv = c->be->lease_size ? (void *)(h + 1) : NULL;

    waits = wait_ms != 0 && !(c->be->caps & DLOCK__CAP_NATIVE_WAIT);
    for (int stale = 0;; stale++) {
        if (waits) {
            rc = waiter_add(c, &w, h);
            if (rc) {
                free(h);
                return rc;
            }
        }
        h->lease.may_wait = waits;
        rc = try_once(c, h, &t0, deadline, wait_ms == 0, &seen_busy,
                      &try_end_us);
        if (!waits && wait_ms != 0 && transient(rc))
            rc = ride_out(c, h, &t0, start, deadline, &seen_busy,
                          &try_end_us, rc);
        if (waits && (rc == DLOCK_EBUSY || transient(rc))) {
            if (rc == DLOCK_EBUSY)
                t_busy = t0;
            waited = 1;
            rc = wait_loop(c, h, &w, start, deadline, &t0, &t_busy,
                           &seen_busy, rc, &failing);
            if (rc != DLOCK_OK)
                rc = leave_queue(c, h, rc, &t0, failing);
        } else if (rc == DLOCK_EBUSY) {
            rc = dlock__is_cancelled(h->lease.cancelled)
                     ? dlock__cancel_message(h, dlock__now_ms() - start)
                     : busy_message(h, dlock__now_ms() - start);
        }
        if (waits) {
            if (c->be->disarm && h->lease.waiting)
                c->be->disarm(c->st, &h->lease, rc == DLOCK_OK);
            waiter_remove(c, &w, rc == DLOCK_OK);
            if (w.woken_us)
                woken_us = w.woken_us;
        }
        if (!waits && wait_ms != 0 &&
            (rc == DLOCK_EBUSY || h->lease.woken_us != 0)) {
            /* the store waited in its acquire (CAP_NATIVE_WAIT), and says
             * when the wait ended (a store that cannot tell, one waiting
             * inside the server: only the waits that ran out count) */
            waited = 1;
            woken_us = h->lease.woken_us;
        }
        if (rc != DLOCK_OK) {
            acquire_failed(c, l, rc, waited, start_us);
            free(h);
            return rc;
        }
        /* The lease ran out before this call could return: the process
         * did not run for a whole lease (stopped, starved) between the
         * store's answer and here, and the lock may be someone else's by
         * now. Not a hold to hand out: let go of it in the store (guarded:
         * only if still ours) and try again while the wait lasts (found by
         * the safety suite's waiter-stop on MariaDB: a waiter frozen in the
         * server's GET_LOCK is handed the row, and thawed after its
         * lease). */
        if (!(c->be->caps & DLOCK__CAP_LEASE) ||
            dlock__now_ms() < t0 + h->lease.ttl_ms -
                                  dlock__client_margin(c, h->lease.ttl_ms))
            break;
        (void)c->be->release(c->st, &h->lease,
                             dlock__op_deadline(c, deadline, 1));
        if (stale >= 3 || dlock__is_cancelled(h->lease.cancelled) ||
            (wait_ms != -1 && dlock__now_ms() >= deadline)) {
            long long ttl = (long long)h->lease.ttl_ms;
            acquire_failed(c, l, DLOCK_EBUSY, waited, start_us);
            free(h);
            return dlock__err(DLOCK_EBUSY,
                              "lock '%.200s': acquired, but its lease ran out "
                              "before the call could return (the process did "
                              "not run for %lld ms); let go again",
                              l->entry->name, ttl);
        }
        pthread_mutex_lock(&c->mu);
        seq = ++c->next_waiter;
        pthread_mutex_unlock(&c->mu);
        h->lease.waiter = seq;
        h->lease.waiting = 0;
        h->lease.retry_ms = -1;
        seen_busy = 0;
    }

    /* the cancel lives on dlock__acquire_new()'s stack: not the hold's */
    h->lease.cancel_fd = -1;
    h->lease.cancelled = NULL;

    /* the first try's end, when it took the lock and was timed (one clock
     * read fewer on the uncontended path) */
    int64_t now_us = !waited && try_end_us ? try_end_us : dlock__now_us();
    pthread_mutex_lock(&c->mu);
    h->count = 1;
    h->acquired_us = now_us;
    /* rounded up: the event never comes before the hold is that old */
    h->long_at = c->long_hold_ms > 0
                     ? (now_us + 999) / 1000 + c->long_hold_ms
                     : DLOCK__FOREVER;
    if (h->long_at != DLOCK__FOREVER)
        dlock__schedule(c, h->long_at);
    h->next_in_entry = l->entry->holds;
    l->entry->holds = h;
    h->next = c->holds;
    if (c->holds)
        c->holds->prev = h;
    c->holds = h;
    c->nholds++;
    /* kept until at least then: from this return, after the store took
     * it; ended by then: from the send of the command that took it,
     * before */
    if (l->opts.at_least_ms)
        h->least_end = (now_us + 999) / 1000 + l->opts.at_least_ms;
    if (l->opts.at_most_ms)
        h->most_end = t0 + l->opts.at_most_ms;
    dlock__hold_leased(c, h, t0);
    h->lease.ttl_ms = l->opts.ttl_ms; /* what renewals start from */
    dlock_event_cb ev = c->ev_cb;
    void *ev_arg = c->ev_arg;
    pthread_mutex_unlock(&c->mu);
    if (dlock__m_on(&c->m)) {
        dlock__mslot *ms = l->entry->ms;
        dlock__m_inc(ms, DLOCK__M_ACQUIRED);
        if (waited) {
            dlock__m_inc(ms, DLOCK__M_WAITED);
            dlock__hist_observe(&ms->h[DLOCK__H_WAIT], now_us - start_us);
            if (woken_us > 0)
                dlock__hist_observe(&ms->h[DLOCK__H_HANDOFF],
                                    now_us - woken_us);
        }
    }
    if (ev) {
        dlock_event e;
        dlock__event_start(&e, DLOCK_EVENT_ACQUIRED, l, h);
        e.waited_ms = (now_us - start_us) / 1000;
        ev(&e, ev_arg);
    }
    return DLOCK_OK;
}
