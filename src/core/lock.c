/* SPDX-License-Identifier: MIT */
/*
 * lock.c -- handles, and the acquire/release/extend logic shared by stores
 * (a new hold's acquire and its wait: acquire.c).
 *
 * Reentrancy lives here, not in the store: a thread that already holds a
 * lock just counts up, with no round trip. The store sees one acquisition
 * and one release per outermost hold.
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

/* The shortest store operation a wait's deadline leaves (DLOCK__MIN_OP_MS
 * in internal.h). */
#define MIN_OP_MS DLOCK__MIN_OP_MS
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
int64_t dlock__op_deadline(const dlock_client *c, int64_t deadline,
                           int try_once)
{
    int64_t now = dlock__now_ms();
    int64_t dl = now + c->timeout_ms;

    if (!try_once && deadline != DLOCK__FOREVER && deadline < dl)
        dl = deadline > now + MIN_OP_MS ? deadline : now + MIN_OP_MS;
    return dl;
}

int dlock__by_handle(const dlock *l)
{
    return (l->opts.flags & DLOCK_OWNER_HANDLE) != 0;
}

/* The caller's hold of l's name: a thread's own (made through any handle
 * that is not DLOCK_OWNER_HANDLE), or the handle's (c->mu held). */
/* Waits until the watchdog's renewal of the caller's own hold h is over
 * (c->mu held), keeping it from starting another one meanwhile: a release
 * or an extend is not starved by renewals that keep failing (each may
 * take the store's whole answer time). Only the owner thread frees h, so
 * h outlives the wait. */
static void wait_renewal(dlock_client *c, dlock__hold *h)
{
    h->leaving++;
    while (h->renewing)
        pthread_cond_wait(&c->cv, &c->mu);
    h->leaving--;
}

static dlock__hold *find_hold(const dlock *l, pthread_t self)
{
    for (dlock__hold *h = l->entry->holds; h; h = h->next_in_entry) {
        if (dlock__by_handle(l) ? h->handle == l
                                : !dlock__by_handle(h->handle) &&
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
    DLOCK__UNLINK(c->holds, h);
    h->prev = h->next = NULL;
    c->nholds--;
}

void dlock__hold_drop(dlock_client *c, dlock__hold *h)
{
    if (c->st)
        (void)dlock__hold_let_go(c, h, dlock__now_ms() + c->timeout_ms);
    free(h);
}

int dlock__hold_let_go(dlock_client *c, dlock__hold *h, int64_t op_deadline)
{
    int64_t left = h->least_end - dlock__now_ms();

    if (h->least_end && left > 0)
        return (c->be->keep ? c->be->keep : c->be->extend)(
            c->st, &h->lease, left, op_deadline);
    return c->be->release(c->st, &h->lease, op_deadline);
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
    if (opts && (opts->at_least_ms < 0 || opts->at_least_ms > DLOCK_TTL_MAX ||
                 opts->at_most_ms < 0 || opts->at_most_ms > DLOCK_TTL_MAX))
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.100s': at_least_ms and at_most_ms must be "
                          "0 (off) or positive up to DLOCK_TTL_MAX, not %lld "
                          "and %lld",
                          name, (long long)opts->at_least_ms,
                          (long long)opts->at_most_ms);
    if (opts && opts->at_most_ms > 0 && opts->at_most_ms < MIN_TTL_MS)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.100s': at_most_ms must be at least %d "
                          "(a lease's shortest), not %lld",
                          name, MIN_TTL_MS, (long long)opts->at_most_ms);
    if (opts && opts->at_most_ms > 0 && opts->at_most_ms < opts->at_least_ms)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.100s': at_most_ms (%lld) is below "
                          "at_least_ms (%lld)",
                          name, (long long)opts->at_most_ms,
                          (long long)opts->at_least_ms);
    if (opts && (opts->at_least_ms || opts->at_most_ms) &&
        !(c->be->caps & DLOCK__CAP_LEASE))
        return dlock__err(DLOCK_ENOTSUP,
                          "lock '%.100s': %s needs a lease the store ends by "
                          "itself, and %s:// holds end with their holder's "
                          "%s (docs/locks.md, \"Scheduled jobs\")",
                          name,
                          opts->at_least_ms ? "at_least_ms" : "at_most_ms",
                          c->be->name,
                          !strcmp(c->be->name, "file") ? "open file"
                          : !strcmp(c->be->name, "zk") ? "ZooKeeper session"
                          : !strcmp(c->be->name, "etcd")
                              ? "client's etcd lease, kept alive by this "
                                "process"
                              : "session");

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
    on_bg = __atomic_load_n(&c->thread_started, __ATOMIC_ACQUIRE) &&
            pthread_equal(pthread_self(), c->thread);

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

int dlock__acquire(dlock *l, int64_t wait_ms, unsigned kind,
                   dlock__set *set, const char *value)
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
again:
    rc = dlock__usable(c);
    if (!rc && l->shut)
        rc = dlock__shut_message(l); /* every acquire, a re-entrant one too */
    if (rc) {
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    h = find_hold(l, self);
    if (h && value) {
        pthread_mutex_unlock(&c->mu);
        return dlock__err(DLOCK_EINVAL,
                          "election '%.200s': this owner leads already "
                          "(term %llu); dlock_proclaim() changes its value",
                          l->entry->name,
                          (unsigned long long)h->lease.token);
    }
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
    if (!c->thread_running) {
        /* the client's first acquire that may hold or wait starts its
         * background thread, before the store sees anything: every hold,
         * renewal, loss and wake-up comes after this (docs/design.md
         * "Threads"). The start lets go of the mutex while the thread
         * starts: the checks above are made again. */
        int e = dlock__thread_start(c);
        if (e) {
            pthread_mutex_unlock(&c->mu);
            return dlock__err(DLOCK_ENOMEM,
                              "lock '%.200s': cannot start the client's "
                              "background thread: %s",
                              l->entry->name, strerror(e));
        }
        goto again;
    }
    if (dlock__by_handle(l)) {
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
    rc = dlock__acquire_new(c, l, kind, wait_ms, start, start_us, deadline,
                            seq, set, value);
    if (dlock__by_handle(l)) {
        pthread_mutex_lock(&c->mu);
        l->acquiring = 0;
        pthread_mutex_unlock(&c->mu);
    }
    return rc;
}

int dlock_acquire(dlock *l, int64_t wait_ms)
{
    if (!l)
        return dlock__err(DLOCK_EINVAL, "dlock_acquire: lock is NULL");
    return dlock__acquire(l, wait_ms,
                          l->opts.permits ? DLOCK__PERMIT : DLOCK__WRITE,
                          NULL, NULL);
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
    return dlock__acquire(l, wait_ms, DLOCK__READ, NULL, NULL);
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

void dlock__cancel_fire(dlock__cancel *cx)
{
    if (cx->set) {
        /* a set's: the set, and the acquire it makes now (if any; the
         * next one sees the set's flag when it registers) */
        __atomic_store_n(&cx->set->flag, 1, __ATOMIC_RELEASE);
        cx = cx->set->cur;
        if (!cx)
            return;
    }
    __atomic_store_n(&cx->flag, 1, __ATOMIC_RELEASE);
    if (cx->fd >= 0) {
        uint64_t one = 1;
        ssize_t n;
        do
            n = write(cx->fd, &one, sizeof(one));
        while (n < 0 && errno == EINTR);
    }
}

/* dlock_cancel(), and dlock_shutdown() when shut: the flag is set under
 * the same mutex as the walk of the acquires in progress, which
 * dlock__acquire_new() joins under it too. */
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
    if (shut) /* atomic for dlock__cancel_message(), which reads it without */
        __atomic_store_n(&l->shut, 1, __ATOMIC_RELAXED);
    for (dlock__cancel *cx = l->cancels; cx; cx = cx->next) {
        dlock__cancel_fire(cx);
        any = 1;
    }
    if (any)
        for (dlock__waiter *w = c->waiters; w; w = w->next)
            if (dlock__is_cancelled(w->cancelled))
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

/* Takes l's client's mutex and finds the calling thread's hold of l. On
 * an error (the client closed, no hold) it returns it, the mutex
 * released; else DLOCK_OK with the mutex held. */
static int lock_own_hold(dlock *l, dlock__hold **out)
{
    dlock_client *c = l->client;
    int rc;

    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    if (!rc && !(*out = find_hold(l, pthread_self())))
        rc = dlock__err(DLOCK_ENOTHELD,
                        "lock '%.200s' is not held by this thread",
                        l->entry->name);
    if (rc)
        pthread_mutex_unlock(&c->mu);
    return rc;
}

/* The calling thread's live hold of l, claimed for one write of the
 * caller's to the store (extend, proclaim): no renewal runs meanwhile
 * (h->renewing set; the caller clears it under c->mu and broadcasts
 * c->cv). DLOCK_OK with *out, the mutex released; else the error (a
 * lost hold: DLOCK_ELOST), the mutex released too. */
static int claim_own_hold(dlock *l, dlock__hold **out)
{
    dlock_client *c = l->client;
    dlock__hold *h;
    int rc = lock_own_hold(l, &h);

    if (rc)
        return rc;
    wait_renewal(c, h);
    if (h->lost || dlock__now_ms() >= h->lease_end) {
        rc = lost_message(h);
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    h->renewing = 1;
    pthread_mutex_unlock(&c->mu);
    *out = h;
    return DLOCK_OK;
}

void dlock__event_start(dlock_event *e, int type, dlock *l,
                        const dlock__hold *h)
{
    memset(e, 0, sizeof(*e));
    e->type = type;
    e->lock = l;
    e->name = l->entry->name;
    e->shared = dlock__event_shared(h->lease.kind);
    e->token = h->lease.token;
    e->why = "";
}

int dlock_release(dlock *l)
{
    dlock_client *c;
    dlock__hold *h;
    int rc, lost, announced;

    if (!l)
        return dlock__err(DLOCK_EINVAL, "dlock_release: lock is NULL");
    c = l->client;
    rc = lock_own_hold(l, &h);
    if (rc)
        return rc;
    if (h->count > 1) {
        h->count--;
        lost = h->lost || dlock__now_ms() >= h->lease_end;
        rc = lost ? lost_message(h) : DLOCK_OK;
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    wait_renewal(c, h);
    announced = h->lost;
    lost = dlock__now_ms() >= h->lease_end;
    dlock__hold_unlink(c, h);
    dlock_event_cb ev = c->ev_cb;
    void *ev_arg = c->ev_arg;
    pthread_mutex_unlock(&c->mu);

    int64_t u0 = dlock__now_us();
    /* before its at-least end: left to the store's lease (a compare-on-
     * owner extend to that end), nothing to wake */
    int kept = h->least_end && h->least_end > u0 / 1000;
    rc = dlock__hold_let_go(c, h, u0 / 1000 + c->timeout_ms);
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
    if (rc == DLOCK_OK && !kept && !(h->lease.flags & DLOCK_FAIR) &&
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
        dlock__event_start(&e, DLOCK_EVENT_RELEASED, l, h);
        e.held_ms = (u1 - h->acquired_us) / 1000;
        e.rc = rc;
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
    rc = claim_own_hold(l, &h);
    if (rc)
        return rc;

    int64_t u0 = dlock__now_us();
    t0 = u0 / 1000;
    /* raised to cover the at-least end, cut at the at-most end */
    int64_t base = ttl_ms;
    ttl_ms = dlock__ask_ttl(h, ttl_ms, t0);
    if (ttl_ms <= 0)
        ttl_ms = 1; /* the at-most end is here: the lease ends with it */
    rc = c->be->extend(c->st, &h->lease, ttl_ms, t0 + c->timeout_ms);
    if (dlock__m_on(&c->m))
        dlock__m_store_op(&c->m, dlock__now_us() - u0, rc);

    pthread_mutex_lock(&c->mu);
    h->renewing = 0;
    if (rc == DLOCK_OK) {
        /* the lease it set, then the length renewals start from */
        h->lease.ttl_ms = ttl_ms;
        if (c->be->caps & DLOCK__CAP_LEASE)
            dlock__hold_leased(c, h, t0);
        h->lease.ttl_ms = base;
    } else if (rc == DLOCK_ENOTHELD) {
        h->lost = 1;
        h->lost_cause = DLOCK__M_LOST_TAKEN;
        if (dlock__m_on(&c->m))
            dlock__m_inc(h->entry->ms, DLOCK__M_LOST_TAKEN);
        snprintf(h->why, sizeof(h->why),
                 "lock '%.100s': extend found it deleted or taken over in "
                 "the store",
                 h->lease.name);
        dlock__event_start(&lost_ev, DLOCK_EVENT_LOST, l, h);
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

int dlock_proclaim(dlock *l, const char *value)
{
    dlock_client *c;
    dlock__hold *h;
    int rc;

    if (!l)
        return dlock__err(DLOCK_EINVAL, "dlock_proclaim: lock is NULL");
    rc = dlock__check_value("dlock_proclaim", l->entry->name, value);
    if (rc)
        return rc;
    c = l->client;
    if (!c->be->proclaim)
        return dlock__err(DLOCK_ENOTSUP,
                          "election '%.200s': %s:// cannot proclaim a new "
                          "value yet%s%s",
                          l->entry->name, c->be->name,
                          c->be->watch_unsupported ? ": " : "",
                          c->be->watch_unsupported ? c->be->watch_unsupported
                                                   : "");
    /* no renewal meanwhile: the store sees one write of the hold at a
     * time, and h->desc changes only with the store's */
    rc = claim_own_hold(l, &h);
    if (rc)
        return rc;
    if (h->lease.kind != DLOCK__WRITE) {
        pthread_mutex_lock(&c->mu);
        h->renewing = 0;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        return dlock__err(DLOCK_EINVAL,
                          "election '%.200s': the hold is %s, not a "
                          "leader's (dlock_campaign())",
                          l->entry->name,
                          h->lease.kind == DLOCK__READ ? "shared"
                                                       : "a permit");
    }

    int64_t t0 = dlock__now_ms();
    rc = c->be->proclaim(c->st, &h->lease, value, t0 + c->timeout_ms);

    pthread_mutex_lock(&c->mu);
    h->renewing = 0;
    if (rc == DLOCK_OK) {
        snprintf(h->desc, sizeof(h->desc), "%s", value);
    } else if (rc == DLOCK_ENOTHELD) {
        /* the watchdog's next renewal finds it gone too and tells the
         * callback; this call says so now */
        rc = dlock__err(DLOCK_ELOST,
                        "election '%.200s': the leadership was no longer "
                        "ours in the store (expired or taken over); "
                        "nothing proclaimed",
                        h->lease.name);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (rc == DLOCK_OK)
        dlock__ring(c, l->entry->name, l->entry->len);
    return rc;
}

/* The calling thread's hold of l: its count and token (token 0), or
 * DLOCK_ELOST once it is lost or its lease ended, or 0 when it has none. */
static int own_hold(const dlock *l, uint64_t *token)
{
    int n = 0;
    dlock__hold *h;

    *token = 0;
    if (!l)
        return 0;
    pthread_mutex_lock(&l->client->mu);
    h = find_hold(l, pthread_self());
    if (h && (h->lost || dlock__now_ms() >= h->lease_end)) {
        n = DLOCK_ELOST;
    } else if (h) {
        n = h->count;
        *token = h->lease.token;
    }
    pthread_mutex_unlock(&l->client->mu);
    return n;
}

uint64_t dlock_token(const dlock *l)
{
    uint64_t token;

    own_hold(l, &token);
    return token;
}

int dlock_held(const dlock *l)
{
    uint64_t token;

    return own_hold(l, &token);
}
