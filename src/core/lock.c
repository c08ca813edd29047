/* SPDX-License-Identifier: MIT */
/*
 * lock.c -- handles, and the acquire/release/extend logic shared by stores.
 *
 * Reentrancy lives here, not in the store: a thread that already holds a
 * lock just counts up, with no round trip. The store sees one acquisition
 * and one release per outermost hold.
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
 *
 * Loss: each hold carries a conservative local lease end on the monotonic
 * clock (the time *before* the command that set the lease, plus ttl, minus
 * a drift margin). Once it passes without a renewal, the hold is lost, even
 * if this process was frozen and its watchdog never got to run.
 */
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define DEFAULT_TTL_MS 30000
#define KNOWN_FLAGS                                                         \
    (DLOCK_NO_RENEW | DLOCK_FAIR | DLOCK_NOT_REENTRANT | DLOCK_OWNER_HANDLE)

/* An owner number of a DLOCK_OWNER_HANDLE handle, where a thread id goes
 * in the owner string ("CLIENT:NUMBER"; stores read it as a number):
 * above every thread id Linux gives (at most 2^22). */
#define HANDLE_OWNER_BASE (1LL << 40)
#define MIN_OP_MS 10
/* The backoff of a wait whose store is unreachable (docs/design.md,
 * "Waiting through failovers and restarts"): a timed retry, since a
 * server that is down sends nothing and the kernel has no event for a
 * port that listens again. */
#define BACKOFF_MIN_MS 25
#define BACKOFF_MAX_MS 1000
#define MIN_TTL_MS DLOCK_TTL_MIN

int64_t dlock__lease_margin(int64_t ttl_ms)
{
    return ttl_ms / 100 + 2;
}

int64_t dlock__client_margin(const dlock_client *c, int64_t ttl_ms)
{
    return c->be->margin ? c->be->margin(c->st, ttl_ms)
                         : dlock__lease_margin(ttl_ms);
}

/* The end of one store operation made while the caller waits until
 * `deadline` (or tries once). */
static int64_t op_deadline(const dlock_client *c, int64_t deadline,
                           int try_once)
{
    int64_t now = dlock__now_ms();
    int64_t dl = now + c->timeout_ms;

    if (!try_once && deadline != DLOCK__FOREVER && deadline < dl)
        dl = deadline > now + MIN_OP_MS ? deadline : now + MIN_OP_MS;
    return dl;
}

static int by_handle(const dlock *l)
{
    return (l->opts.flags & DLOCK_OWNER_HANDLE) != 0;
}

/* The caller's hold of l's name: a thread's own (made through any handle
 * that is not DLOCK_OWNER_HANDLE), or the handle's (c->mu held). */
static dlock__hold *find_hold(const dlock *l, pthread_t self)
{
    for (dlock__hold *h = l->entry->holds; h; h = h->next_in_entry) {
        if (by_handle(l) ? h->handle == l
                         : !by_handle(h->handle) &&
                               pthread_equal(h->thread, self))
            return h;
    }
    return NULL;
}

/* Common checks; c->mu held. */
int dlock__usable(const dlock_client *c)
{
    if (c->closed)
        return dlock__err(DLOCK_EINVAL, "the client is closed");
    if (c->pid != dlock__pid())
        return dlock__err(DLOCK_EINVAL,
                          "the client was opened in another process (before "
                          "fork): open a new one");
    return DLOCK_OK;
}

void dlock__hold_unlink(dlock_client *c, dlock__hold *h)
{
    dlock__hold **pp = &h->entry->holds;

    while (*pp && *pp != h)
        pp = &(*pp)->next_in_entry;
    if (*pp)
        *pp = h->next_in_entry;
    if (h->prev)
        h->prev->next = h->next;
    else
        c->holds = h->next;
    if (h->next)
        h->next->prev = h->prev;
    h->prev = h->next = NULL;
    c->nholds--;
}

void dlock__hold_drop(dlock_client *c, dlock__hold *h)
{
    if (c->st)
        (void)c->be->release(c->st, &h->lease,
                             dlock__now_ms() + c->timeout_ms);
    free(h);
}

/* ------------------------------------------------------------------------ */
/* Handles                                                                  */
/* ------------------------------------------------------------------------ */

int dlock__check_name(const char *name, size_t *len)
{
    if (!name)
        return dlock__err(DLOCK_EINVAL, "lock name is NULL");
    *len = strnlen(name, DLOCK_NAME_MAX + 1);
    if (*len == 0)
        return dlock__err(DLOCK_EINVAL, "lock name is empty");
    if (*len > DLOCK_NAME_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "lock name is longer than %d bytes",
                          DLOCK_NAME_MAX);
    return DLOCK_OK;
}

int dlock_open(dlock **out, dlock_client *c, const char *name,
               const dlock_options *opts)
{
    size_t len = 0;
    dlock *l;
    int rc;

    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_open: out is NULL");
    *out = NULL;
    if (!c)
        return dlock__err(DLOCK_EINVAL, "dlock_open: client is NULL");
    rc = dlock__check_name(name, &len);
    if (rc)
        return rc;
    if (opts && (opts->ttl_ms < 0 ||
                 (opts->ttl_ms > 0 && opts->ttl_ms < MIN_TTL_MS)))
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.100s': ttl_ms must be at least %d (0 means "
                          "the default, %d ms), not %lld",
                          name, MIN_TTL_MS, DEFAULT_TTL_MS,
                          (long long)opts->ttl_ms);
    if (opts && opts->ttl_ms > DLOCK_TTL_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.100s': ttl_ms must be at most %lld "
                          "(DLOCK_TTL_MAX, 365 days), not %lld",
                          name, DLOCK_TTL_MAX, (long long)opts->ttl_ms);
    if (opts && (opts->flags & ~KNOWN_FLAGS))
        return dlock__err(DLOCK_EINVAL, "lock '%.100s': unknown flags 0x%x",
                          name, opts->flags & ~KNOWN_FLAGS);
    if (opts && opts->permits > DLOCK_PERMITS_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.100s': permits must be at most %d, not %u",
                          name, DLOCK_PERMITS_MAX, opts->permits);

    l = calloc(1, sizeof(*l));
    if (!l)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    if (opts)
        l->opts = *opts;
    if (l->opts.ttl_ms == 0)
        l->opts.ttl_ms = DEFAULT_TTL_MS;
    l->client = c;

    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    if (rc == DLOCK_OK) {
        l->entry = dlock__entry_ref(c, name, len);
        if (!l->entry)
            rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    if (rc) {
        pthread_mutex_unlock(&c->mu);
        free(l);
        return rc;
    }
    c->refs++;
    l->seq = ++c->next_handle;
    pthread_mutex_unlock(&c->mu);
    *out = l;
    return DLOCK_OK;
}

void dlock_close(dlock *l)
{
    dlock_client *c;
    int on_bg;

    if (!l)
        return;
    c = l->client;
    if (c->pid != dlock__pid())
        return; /* a forked child: the holds and connections are the
                 * parent's (docs/design.md "fork()") */
    on_bg = c->thread_started && pthread_equal(pthread_self(), c->thread);

    pthread_mutex_lock(&c->mu);
    while (l->callbacks > 0 && !on_bg)
        pthread_cond_wait(&c->cv, &c->mu);
again:
    for (dlock__hold *h = l->entry->holds; h; h = h->next_in_entry) {
        if (h->handle != l)
            continue;
        if (h->renewing) {
            pthread_cond_wait(&c->cv, &c->mu);
            goto again;
        }
        dlock__hold_unlink(c, h);
        pthread_mutex_unlock(&c->mu);
        dlock__hold_drop(c, h);
        pthread_mutex_lock(&c->mu);
        goto again;
    }
    dlock__entry_unref(c, l->entry);
    free(l);
    dlock__client_unref(c); /* unlocks */
}

const char *dlock_name(const dlock *l)
{
    return l ? l->entry->name : "";
}

/* ------------------------------------------------------------------------ */
/* Acquire                                                                  */
/* ------------------------------------------------------------------------ */

static int is_cancelled(const int *flag)
{
    return flag && __atomic_load_n(flag, __ATOMIC_ACQUIRE);
}

static int cancel_message(const dlock__hold *h, int64_t waited)
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
static int shut_message(const dlock *l)
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
    dl = op_deadline(c, deadline, once);
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
    if (w->prev)
        w->prev->next = w->next;
    else
        c->waiters = w->next;
    if (w->next)
        w->next->prev = w->prev;
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
           !is_cancelled(w->cancelled) && dlock__now_ms() < wake_at) {
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
                !o->rearm && !is_cancelled(o->cancelled))
                next = o;
        __atomic_store_n(&c->reader, next, __ATOMIC_RELAXED);
        if (next)
            pthread_cond_signal(&next->cv);
        else
            dlock__loop_wake(c);
    }
}

/* After arm() or a try cut short by the deadline: see cut_short(). */
static int armed(dlock_client *c, dlock__hold *h, int64_t deadline,
                 int seen_busy)
{
    int64_t t0 = dlock__now_ms(), dl = op_deadline(c, deadline, 0);
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
        if (is_cancelled(h->lease.cancelled))
            return cancel_message(h, dlock__now_ms() - start);
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
            if (is_cancelled(h->lease.cancelled))
                return cancel_message(h, now - start);
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

/* The calling thread already holds l's name (hold h): may it take a hold
 * of `kind` inside it? DLOCK_OK (count it), or the refusal. c->mu held. */
static int reenter(const dlock_client *c, const dlock *l,
                   const dlock__hold *h, unsigned kind)
{
    const char *name = l->entry->name;

    if (h->lost ||
        ((c->be->caps & DLOCK__CAP_LEASE) && dlock__now_ms() >= h->lease_end))
        return dlock__err(DLOCK_ELOST,
                          "lock '%.200s': this thread's hold was lost; "
                          "release it first",
                          name);
    if ((kind == DLOCK__PERMIT) != (h->lease.kind == DLOCK__PERMIT) ||
        (kind == DLOCK__PERMIT && l->opts.permits != h->lease.permits))
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s': this thread holds it as %s, and "
                          "this handle says %u permits (every handle of a "
                          "name must say the same)",
                          name,
                          h->lease.kind == DLOCK__PERMIT
                              ? "a semaphore's permit"
                              : "a lock",
                          l->opts.permits);
    if (h->lease.kind == DLOCK__READ && kind == DLOCK__WRITE)
        return dlock__err(DLOCK_EDEADLK,
                          "lock '%.200s': this thread holds it shared; a "
                          "read hold cannot become a write hold (it would "
                          "wait for itself, and two readers upgrading for "
                          "each other): release it first",
                          name);
    if ((l->opts.flags | h->handle->opts.flags) & DLOCK_NOT_REENTRANT)
        return dlock__err(DLOCK_EBUSY,
                          "lock '%.200s' is already held by this thread "
                          "(DLOCK_NOT_REENTRANT)",
                          name);
    return DLOCK_OK;
}

/* Can this client's store take a hold of `kind`? */
static int kind_supported(const dlock_client *c, const dlock *l,
                          unsigned kind)
{
    unsigned cap = kind == DLOCK__READ     ? DLOCK__CAP_SHARED
                   : kind == DLOCK__PERMIT ? DLOCK__CAP_PERMITS
                                           : 0;

    if ((c->be->caps & cap) == cap)
        return DLOCK_OK;
    return dlock__err(DLOCK_ENOTSUP,
                      "lock '%.200s': %s holds are not supported on %s:// "
                      "yet (docs/locks.md lists the stores that have them)",
                      l->entry->name,
                      kind == DLOCK__READ ? "shared (read)" : "semaphore",
                      c->be->name);
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

static int acquire_new(dlock_client *c, dlock *l, unsigned kind,
                       int64_t wait_ms, int64_t start, int64_t start_us,
                       int64_t deadline, uint64_t seq);

static int acquire(dlock *l, int64_t wait_ms, unsigned kind)
{
    dlock_client *c;
    dlock__hold *h;
    pthread_t self = pthread_self();
    int64_t start, start_us, deadline;
    uint64_t seq;
    int rc;

    if (wait_ms < -1)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s': wait_ms must be -1 (forever), 0 "
                          "(one try) or positive, not %lld",
                          l->entry->name, (long long)wait_ms);
    if (wait_ms > DLOCK_WAIT_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s': wait_ms must be at most %lld "
                          "(DLOCK_WAIT_MAX, 365 days; -1 waits forever), "
                          "not %lld",
                          l->entry->name, DLOCK_WAIT_MAX, (long long)wait_ms);
    c = l->client;
    start_us = dlock__now_us();
    start = start_us / 1000;
    deadline = wait_ms == -1 ? DLOCK__FOREVER : start + wait_ms;

    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    if (!rc && l->shut)
        rc = shut_message(l); /* every acquire, a re-entrant one too */
    if (rc) {
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    h = find_hold(l, self);
    if (h) {
        rc = reenter(c, l, h, kind);
        if (rc == DLOCK_OK) {
            h->count++;
            if (dlock__m_on(&c->m))
                dlock__m_inc(l->entry->ms, DLOCK__M_REENTERED);
        }
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    rc = kind_supported(c, l, kind);
    if (rc) {
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    if (by_handle(l)) {
        /* one owner: two acquires at once would both be it in the store */
        if (l->acquiring) {
            pthread_mutex_unlock(&c->mu);
            return dlock__err(DLOCK_EINVAL,
                              "lock '%.200s': another thread is acquiring "
                              "through this DLOCK_OWNER_HANDLE handle (its "
                              "one owner); open a handle per owner",
                              l->entry->name);
        }
        l->acquiring = 1;
    }
    seq = ++c->next_waiter;
    pthread_mutex_unlock(&c->mu);
    rc = acquire_new(c, l, kind, wait_ms, start, start_us, deadline, seq);
    if (by_handle(l)) {
        pthread_mutex_lock(&c->mu);
        l->acquiring = 0;
        pthread_mutex_unlock(&c->mu);
    }
    return rc;
}

static int acquire_run(dlock_client *c, dlock *l, unsigned kind,
                       int64_t wait_ms, int64_t start, int64_t start_us,
                       int64_t deadline, uint64_t seq, dlock__cancel *cx);

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
static int acquire_new(dlock_client *c, dlock *l, unsigned kind,
                       int64_t wait_ms, int64_t start, int64_t start_us,
                       int64_t deadline, uint64_t seq)
{
    dlock__cancel cx = {-1, 0, NULL};
    int rc;

    if (wait_ms == 0)
        return acquire_run(c, l, kind, wait_ms, start, start_us, deadline,
                           seq, NULL);
    /* a store that waits by itself may sleep in poll(): it watches an
     * eventfd of the wait's own (the core's own wait needs none), reused
     * from the client's finished waits: no system call on the way of an
     * acquire that may wait and does not */
    int native = (c->be->caps & DLOCK__CAP_NATIVE_WAIT) != 0;
    pthread_mutex_lock(&c->mu);
    if (l->shut) {
        pthread_mutex_unlock(&c->mu);
        return shut_message(l);
    }
    if (native && c->n_cfd_free > 0)
        cx.fd = c->cfd_free[--c->n_cfd_free];
    cx.next = l->cancels;
    l->cancels = &cx;
    pthread_mutex_unlock(&c->mu);
    if (native && cx.fd < 0) {
        int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (fd < 0) {
            int err = errno;
            pthread_mutex_lock(&c->mu);
            unlink_cancel(l, &cx);
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
                     &cx);
    pthread_mutex_lock(&c->mu);
    unlink_cancel(l, &cx);
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
                       int64_t deadline, uint64_t seq, dlock__cancel *cx)
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
    if (by_handle(l)) {
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
    h->lease.name = l->entry->name;
    h->lease.name_len = l->entry->len;
    h->lease.owner = h->owner;
    h->lease.desc = h->desc;
    h->lease.ttl_ms = l->opts.ttl_ms;
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
            rc = is_cancelled(h->lease.cancelled)
                     ? cancel_message(h, dlock__now_ms() - start)
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
        (void)c->be->release(c->st, &h->lease, op_deadline(c, deadline, 1));
        if (stale >= 3 || is_cancelled(h->lease.cancelled) ||
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

    /* the cancel lives on acquire_new()'s stack: not the hold's */
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
    dlock__hold_leased(c, h, t0);
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
        memset(&e, 0, sizeof(e));
        e.type = DLOCK_EVENT_ACQUIRED;
        e.lock = l;
        e.name = l->entry->name;
        e.shared = kind == DLOCK__READ ? 1 : kind == DLOCK__PERMIT ? 2 : 0;
        e.token = h->lease.token;
        e.waited_ms = (now_us - start_us) / 1000;
        e.why = "";
        ev(&e, ev_arg);
    }
    return DLOCK_OK;
}

int dlock_acquire(dlock *l, int64_t wait_ms)
{
    if (!l)
        return dlock__err(DLOCK_EINVAL, "dlock_acquire: lock is NULL");
    return acquire(l, wait_ms, l->opts.permits ? DLOCK__PERMIT : DLOCK__WRITE);
}

int dlock_acquire_shared(dlock *l, int64_t wait_ms)
{
    if (!l)
        return dlock__err(DLOCK_EINVAL, "dlock_acquire_shared: lock is NULL");
    if (l->opts.permits)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s' is a semaphore (%u permits): take "
                          "a permit with dlock_acquire()",
                          l->entry->name, l->opts.permits);
    return acquire(l, wait_ms, DLOCK__READ);
}

/* ------------------------------------------------------------------------ */
/* Release, extend, token                                                   */
/* ------------------------------------------------------------------------ */

static int lost_message(const dlock__hold *h)
{
    if (h->why[0])
        return dlock__err(DLOCK_ELOST, "%s", h->why);
    return dlock__err(DLOCK_ELOST,
                      "lock '%.200s': the lease ran out before the release; "
                      "the critical section was not protected",
                      h->lease.name);
}

/* dlock_cancel(), and dlock_shutdown() when shut: the flag is set under
 * the same mutex as the walk of the acquires in progress, which
 * acquire_new() joins under it too. */
static int cancel(dlock *l, int shut, const char *fn)
{
    dlock_client *c;
    int rc, any = 0;

    if (!l)
        return dlock__err(DLOCK_EINVAL, "%s: lock is NULL", fn);
    c = l->client;
    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    if (rc) {
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    if (shut) /* atomic for cancel_message(), which reads it without */
        __atomic_store_n(&l->shut, 1, __ATOMIC_RELAXED);
    for (dlock__cancel *cx = l->cancels; cx; cx = cx->next) {
        __atomic_store_n(&cx->flag, 1, __ATOMIC_RELEASE);
        if (cx->fd >= 0) {
            uint64_t one = 1;
            ssize_t n;
            do
                n = write(cx->fd, &one, sizeof(one));
            while (n < 0 && errno == EINTR);
        }
        any = 1;
    }
    if (any)
        for (dlock__waiter *w = c->waiters; w; w = w->next)
            if (is_cancelled(w->cancelled))
                dlock__wake_waiter(c, w);
    pthread_mutex_unlock(&c->mu);
    /* the store's own sleepers (condition variables): no client mutex
     * held, as the store may take its own */
    if (any && c->be->cancel)
        c->be->cancel(c->st);
    return DLOCK_OK;
}

int dlock_cancel(dlock *l)
{
    return cancel(l, 0, "dlock_cancel");
}

int dlock_shutdown(dlock *l)
{
    return cancel(l, 1, "dlock_shutdown");
}

int dlock_release(dlock *l)
{
    dlock_client *c;
    dlock__hold *h;
    int rc, lost, announced;

    if (!l)
        return dlock__err(DLOCK_EINVAL, "dlock_release: lock is NULL");
    c = l->client;
    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    if (rc) {
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    h = find_hold(l, pthread_self());
    if (!h) {
        pthread_mutex_unlock(&c->mu);
        return dlock__err(DLOCK_ENOTHELD,
                          "lock '%.200s' is not held by this thread",
                          l->entry->name);
    }
    if (h->count > 1) {
        h->count--;
        lost = h->lost || dlock__now_ms() >= h->lease_end;
        rc = lost ? lost_message(h) : DLOCK_OK;
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    while (h->renewing)
        pthread_cond_wait(&c->cv, &c->mu);
    announced = h->lost;
    lost = dlock__now_ms() >= h->lease_end;
    dlock__hold_unlink(c, h);
    dlock_event_cb ev = c->ev_cb;
    void *ev_arg = c->ev_arg;
    pthread_mutex_unlock(&c->mu);

    int64_t u0 = dlock__now_us();
    rc = c->be->release(c->st, &h->lease, u0 / 1000 + c->timeout_ms);
    int64_t u1 = dlock__now_us();
    if (dlock__m_on(&c->m)) {
        dlock__mslot *ms = l->entry->ms;
        dlock__m_store_op(&c->m, u1 - u0, rc);
        dlock__m_inc(ms, DLOCK__M_RELEASED);
        dlock__hist_observe(&ms->h[DLOCK__H_HOLD], u1 - h->acquired_us);
        /* a loss this release found (an announced one was counted) */
        if (!announced && rc == DLOCK_ENOTHELD)
            dlock__m_inc(ms, DLOCK__M_LOST_TAKEN);
        else if (!announced && rc != DLOCK_OK && lost)
            dlock__m_inc(ms, DLOCK__M_LOST_EXPIRED);
    }
    if (rc == DLOCK_OK && !(h->lease.flags & DLOCK_FAIR) &&
        !(c->be->caps & DLOCK__CAP_HANDOVER))
        dlock__notify_name(c, h->lease.name, h->lease.name_len);

    /* A loss already announced stays a loss. Otherwise the store's answer
     * decides: a compare-and-delete that succeeded proves the lock was ours
     * the whole time, even if our conservative local clock ran out. */
    if (announced)
        rc = lost_message(h);
    else if (rc == DLOCK_ENOTHELD)
        rc = dlock__err(DLOCK_ELOST,
                        "lock '%.200s' was no longer ours in the store "
                        "(expired or taken over): the critical section was "
                        "not protected",
                        h->lease.name);
    else if (rc != DLOCK_OK && lost)
        rc = lost_message(h);
    if (ev) {
        dlock_event e;
        memset(&e, 0, sizeof(e));
        e.type = DLOCK_EVENT_RELEASED;
        e.lock = l;
        e.name = l->entry->name;
        e.shared = h->lease.kind == DLOCK__READ     ? 1
                   : h->lease.kind == DLOCK__PERMIT ? 2
                                                    : 0;
        e.token = h->lease.token;
        e.held_ms = (u1 - h->acquired_us) / 1000;
        e.rc = rc;
        e.why = "";
        /* the callback may call the library: keep this call's message */
        char keep[512];
        snprintf(keep, sizeof(keep), "%s", dlock_errmsg());
        ev(&e, ev_arg);
        if (rc != DLOCK_OK)
            dlock__err(rc, "%s", keep);
    }
    free(h);
    return rc;
}

int dlock_extend(dlock *l, int64_t ttl_ms)
{
    dlock_client *c;
    dlock__hold *h;
    int64_t t0;
    int rc;
    dlock_event lost_ev;
    dlock_event_cb ev = NULL;
    void *ev_arg = NULL;
    char why[256];

    if (!l)
        return dlock__err(DLOCK_EINVAL, "dlock_extend: lock is NULL");
    memset(&lost_ev, 0, sizeof(lost_ev));
    if (ttl_ms < MIN_TTL_MS)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s': ttl_ms must be at least %d, not "
                          "%lld",
                          l->entry->name, MIN_TTL_MS, (long long)ttl_ms);
    if (ttl_ms > DLOCK_TTL_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s': ttl_ms must be at most %lld "
                          "(DLOCK_TTL_MAX, 365 days), not %lld",
                          l->entry->name, DLOCK_TTL_MAX, (long long)ttl_ms);
    c = l->client;
    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    if (rc) {
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    h = find_hold(l, pthread_self());
    while (h && h->renewing)
        pthread_cond_wait(&c->cv, &c->mu);
    if (!h) {
        pthread_mutex_unlock(&c->mu);
        return dlock__err(DLOCK_ENOTHELD,
                          "lock '%.200s' is not held by this thread",
                          l->entry->name);
    }
    if (h->lost || dlock__now_ms() >= h->lease_end) {
        rc = lost_message(h);
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    h->renewing = 1;
    pthread_mutex_unlock(&c->mu);

    int64_t u0 = dlock__now_us();
    t0 = u0 / 1000;
    rc = c->be->extend(c->st, &h->lease, ttl_ms, t0 + c->timeout_ms);
    if (dlock__m_on(&c->m))
        dlock__m_store_op(&c->m, dlock__now_us() - u0, rc);

    pthread_mutex_lock(&c->mu);
    h->renewing = 0;
    if (rc == DLOCK_OK) {
        h->lease.ttl_ms = ttl_ms;
        if (c->be->caps & DLOCK__CAP_LEASE)
            dlock__hold_leased(c, h, t0);
    } else if (rc == DLOCK_ENOTHELD) {
        h->lost = 1;
        h->lost_cause = DLOCK__M_LOST_TAKEN;
        if (dlock__m_on(&c->m))
            dlock__m_inc(h->entry->ms, DLOCK__M_LOST_TAKEN);
        snprintf(h->why, sizeof(h->why),
                 "lock '%.100s': extend found it deleted or taken over in "
                 "the store",
                 h->lease.name);
        lost_ev.type = DLOCK_EVENT_LOST;
        lost_ev.lock = l;
        lost_ev.name = l->entry->name;
        lost_ev.shared = h->lease.kind == DLOCK__READ     ? 1
                         : h->lease.kind == DLOCK__PERMIT ? 2
                                                          : 0;
        lost_ev.token = h->lease.token;
        lost_ev.held_ms = (dlock__now_us() - h->acquired_us) / 1000;
        snprintf(why, sizeof(why), "%s", h->why);
        lost_ev.why = why;
        ev = c->ev_cb;
        ev_arg = c->ev_arg;
        rc = lost_message(h);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (ev) {
        ev(&lost_ev, ev_arg);
        dlock__err(DLOCK_ELOST, "%s", why);
    }
    return rc;
}

uint64_t dlock_token(const dlock *l)
{
    uint64_t token = 0;
    dlock__hold *h;

    if (!l)
        return 0;
    pthread_mutex_lock(&l->client->mu);
    h = find_hold(l, pthread_self());
    if (h && !h->lost && dlock__now_ms() < h->lease_end)
        token = h->lease.token;
    pthread_mutex_unlock(&l->client->mu);
    return token;
}

int dlock_held(const dlock *l)
{
    int n = 0;
    dlock__hold *h;

    if (!l)
        return 0;
    pthread_mutex_lock(&l->client->mu);
    h = find_hold(l, pthread_self());
    if (h)
        n = h->lost || dlock__now_ms() >= h->lease_end ? DLOCK_ELOST
                                                        : h->count;
    pthread_mutex_unlock(&l->client->mu);
    return n;
}
