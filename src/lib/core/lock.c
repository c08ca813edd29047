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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_TTL_MS 30000
#define KNOWN_FLAGS (DLOCK_NO_RENEW | DLOCK_FAIR | DLOCK_NOT_REENTRANT)
#define MIN_OP_MS 10
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

static dlock__hold *find_hold(dlock__entry *e, pthread_t self)
{
    for (dlock__hold *h = e->holds; h; h = h->next_in_entry)
        if (pthread_equal(h->thread, self))
            return h;
    return NULL;
}

/* Common checks; c->mu held. */
static int usable(const dlock_client *c)
{
    if (c->closed)
        return dlock__err(DLOCK_EINVAL, "the client is closed");
    if (c->pid != (long)getpid())
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

static int check_name(const char *name, size_t *len)
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
    rc = check_name(name, &len);
    if (rc)
        return rc;
    if (opts && (opts->ttl_ms < 0 ||
                 (opts->ttl_ms > 0 && opts->ttl_ms < MIN_TTL_MS)))
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.100s': ttl_ms must be at least %d (0 means "
                          "the default, %d ms), not %lld",
                          name, MIN_TTL_MS, DEFAULT_TTL_MS,
                          (long long)opts->ttl_ms);
    if (opts && (opts->flags & ~KNOWN_FLAGS))
        return dlock__err(DLOCK_EINVAL, "lock '%.100s': unknown flags 0x%x",
                          name, opts->flags & ~KNOWN_FLAGS);

    l = calloc(1, sizeof(*l));
    if (!l)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    if (opts)
        l->opts = *opts;
    if (l->opts.ttl_ms == 0)
        l->opts.ttl_ms = DEFAULT_TTL_MS;
    l->client = c;

    pthread_mutex_lock(&c->mu);
    rc = usable(c);
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

/* One try; records when it started, for the lease's local end, and
 * whether the store answered "held". */
static int try_once(dlock_client *c, dlock__hold *h, int64_t *t0,
                    int64_t deadline, int once, int *seen_busy)
{
    int64_t dl;
    int rc;

    *t0 = dlock__now_ms();
    dl = op_deadline(c, deadline, once);
    rc = c->be->acquire(c->st, &h->lease, dl);
    if (rc == DLOCK_EBUSY)
        *seen_busy = 1;
    else if (!once && cut_short(c, rc, *seen_busy, *t0, dl, deadline))
        rc = ran_out(h);
    return rc;
}

static void waiter_remove(dlock_client *c, dlock__waiter *w, int acquired)
{
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
}

static int wait_loop(dlock_client *c, dlock__hold *h, int64_t start,
                     int64_t deadline, int64_t *t0, int *seen_busy)
{
    dlock__waiter w;
    int rc;

    memset(&w, 0, sizeof(w));
    rc = dlock__cond_init(&w.cv);
    if (rc)
        return rc;
    w.seq = h->lease.waiter;
    w.entry = h->entry;
    w.fair = (h->lease.flags & DLOCK_FAIR) != 0;

    pthread_mutex_lock(&c->mu);
    /* append: the oldest waiter of a name is woken first */
    dlock__waiter **pp = &c->waiters;
    while (*pp) {
        w.prev = *pp;
        pp = &(*pp)->next;
    }
    *pp = &w;
    pthread_mutex_unlock(&c->mu);

    int64_t arm_t0 = dlock__now_ms(), arm_dl = op_deadline(c, deadline, 0);
    rc = c->be->arm ? c->be->arm(c->st, &h->lease, arm_dl) : DLOCK_OK;
    if (cut_short(c, rc, *seen_busy, arm_t0, arm_dl, deadline))
        rc = ran_out(h);
    h->lease.waiting = 1;
    while (rc == DLOCK_OK) {
        rc = try_once(c, h, t0, deadline, 0, seen_busy);
        if (rc != DLOCK_EBUSY)
            break;
        int64_t now = dlock__now_ms();
        if (now >= deadline) {
            rc = busy_message(h, now - start);
            break;
        }
        int64_t wake_at = deadline;
        if (h->lease.retry_ms >= 0 && now + h->lease.retry_ms + 1 < wake_at)
            wake_at = now + h->lease.retry_ms + 1;

        pthread_mutex_lock(&c->mu);
        while (!w.notified && !w.rearm && !c->closed &&
               dlock__now_ms() < wake_at)
            dlock__cond_wait_until(&w.cv, &c->mu, wake_at);
        int rearm = w.rearm;
        int closed = c->closed;
        w.notified = 0;
        w.rearm = 0;
        pthread_mutex_unlock(&c->mu);

        rc = DLOCK_OK;
        if (closed)
            rc = dlock__err(DLOCK_EINVAL, "the client was closed during "
                                          "the wait");
        else if (rearm && c->be->arm) {
            arm_t0 = dlock__now_ms();
            arm_dl = op_deadline(c, deadline, 0);
            rc = c->be->arm(c->st, &h->lease, arm_dl);
            if (cut_short(c, rc, *seen_busy, arm_t0, arm_dl, deadline))
                rc = ran_out(h);
        }
    }
    if (c->be->disarm)
        c->be->disarm(c->st, &h->lease, rc == DLOCK_OK);

    pthread_mutex_lock(&c->mu);
    waiter_remove(c, &w, rc == DLOCK_OK);
    pthread_mutex_unlock(&c->mu);
    pthread_cond_destroy(&w.cv);
    return rc;
}

int dlock_acquire(dlock *l, int64_t wait_ms)
{
    dlock_client *c;
    dlock__hold *h;
    pthread_t self = pthread_self();
    int64_t start, deadline, t0 = 0;
    uint64_t seq;
    int rc, seen_busy = 0;

    if (!l)
        return dlock__err(DLOCK_EINVAL, "dlock_acquire: lock is NULL");
    if (wait_ms < -1)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s': wait_ms must be -1 (forever), 0 "
                          "(one try) or positive, not %lld",
                          l->entry->name, (long long)wait_ms);
    c = l->client;
    start = dlock__now_ms();
    deadline = wait_ms == -1 ? DLOCK__FOREVER : start + wait_ms;

    pthread_mutex_lock(&c->mu);
    rc = usable(c);
    if (rc) {
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    h = find_hold(l->entry, self);
    if (h) {
        if (h->lost || ((c->be->caps & DLOCK__CAP_LEASE) &&
                        dlock__now_ms() >= h->lease_end))
            rc = dlock__err(DLOCK_ELOST,
                            "lock '%.200s': this thread's hold was lost; "
                            "release it first",
                            l->entry->name);
        else if ((l->opts.flags | h->handle->opts.flags) &
                 DLOCK_NOT_REENTRANT)
            rc = dlock__err(DLOCK_EBUSY,
                            "lock '%.200s' is already held by this thread "
                            "(DLOCK_NOT_REENTRANT)",
                            l->entry->name);
        else
            h->count++;
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    seq = ++c->next_waiter;
    pthread_mutex_unlock(&c->mu);

    h = calloc(1, sizeof(*h) + c->be->lease_size);
    if (!h)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    h->handle = l;
    h->entry = l->entry;
    h->thread = self;
    snprintf(h->owner, sizeof(h->owner), "%s:%ld", c->id, dlock__tid());
    snprintf(h->desc, sizeof(h->desc), "%.64s pid %ld tid %ld", c->host,
             c->pid, dlock__tid());
    h->lease.name = l->entry->name;
    h->lease.name_len = l->entry->len;
    h->lease.owner = h->owner;
    h->lease.desc = h->desc;
    h->lease.ttl_ms = l->opts.ttl_ms;
    h->lease.flags = l->opts.flags;
    h->lease.waiter = seq;
    h->lease.deadline = wait_ms == 0 ? start : deadline;
    h->lease.retry_ms = -1;
    h->lease.priv = c->be->lease_size ? (void *)(h + 1) : NULL;

    rc = try_once(c, h, &t0, deadline, wait_ms == 0, &seen_busy);
    if (rc == DLOCK_EBUSY && wait_ms != 0 &&
        !(c->be->caps & DLOCK__CAP_NATIVE_WAIT))
        rc = wait_loop(c, h, start, deadline, &t0, &seen_busy);
    else if (rc == DLOCK_EBUSY)
        rc = busy_message(h, dlock__now_ms() - start);
    if (rc != DLOCK_OK) {
        free(h);
        return rc;
    }

    pthread_mutex_lock(&c->mu);
    h->count = 1;
    if (c->be->caps & DLOCK__CAP_LEASE) {
        h->lease_end = t0 + h->lease.ttl_ms -
                       dlock__client_margin(c, h->lease.ttl_ms);
        h->renew_at = t0 + h->lease.ttl_ms / 3;
    } else {
        h->lease_end = h->renew_at = DLOCK__FOREVER;
    }
    h->next_in_entry = l->entry->holds;
    l->entry->holds = h;
    h->next = c->holds;
    if (c->holds)
        c->holds->prev = h;
    c->holds = h;
    c->nholds++;
    if (c->be->caps & DLOCK__CAP_LEASE)
        dlock__schedule(c, (l->opts.flags & DLOCK_NO_RENEW) ? h->lease_end
                                                             : h->renew_at);
    pthread_mutex_unlock(&c->mu);
    return DLOCK_OK;
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

int dlock_release(dlock *l)
{
    dlock_client *c;
    dlock__hold *h;
    int rc, lost, announced;

    if (!l)
        return dlock__err(DLOCK_EINVAL, "dlock_release: lock is NULL");
    c = l->client;
    pthread_mutex_lock(&c->mu);
    rc = usable(c);
    if (rc) {
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    h = find_hold(l->entry, pthread_self());
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
    pthread_mutex_unlock(&c->mu);

    rc = c->be->release(c->st, &h->lease, dlock__now_ms() + c->timeout_ms);
    if (rc == DLOCK_OK && !(h->lease.flags & DLOCK_FAIR))
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
    free(h);
    return rc;
}

int dlock_extend(dlock *l, int64_t ttl_ms)
{
    dlock_client *c;
    dlock__hold *h;
    int64_t t0;
    int rc;

    if (!l)
        return dlock__err(DLOCK_EINVAL, "dlock_extend: lock is NULL");
    if (ttl_ms < MIN_TTL_MS)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s': ttl_ms must be at least %d, not "
                          "%lld",
                          l->entry->name, MIN_TTL_MS, (long long)ttl_ms);
    c = l->client;
    pthread_mutex_lock(&c->mu);
    rc = usable(c);
    if (rc) {
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    h = find_hold(l->entry, pthread_self());
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

    t0 = dlock__now_ms();
    rc = c->be->extend(c->st, &h->lease, ttl_ms, t0 + c->timeout_ms);

    pthread_mutex_lock(&c->mu);
    h->renewing = 0;
    if (rc == DLOCK_OK) {
        h->lease.ttl_ms = ttl_ms;
        if (c->be->caps & DLOCK__CAP_LEASE) {
            h->lease_end = t0 + ttl_ms - dlock__client_margin(c, ttl_ms);
            h->renew_at = t0 + ttl_ms / 3;
            dlock__schedule(c, (h->handle->opts.flags & DLOCK_NO_RENEW)
                                   ? h->lease_end
                                   : h->renew_at);
        }
    } else if (rc == DLOCK_ENOTHELD) {
        h->lost = 1;
        snprintf(h->why, sizeof(h->why),
                 "lock '%.100s': extend found it deleted or taken over in "
                 "the store",
                 h->lease.name);
        rc = lost_message(h);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

uint64_t dlock_token(const dlock *l)
{
    uint64_t token = 0;
    dlock__hold *h;

    if (!l)
        return 0;
    pthread_mutex_lock(&l->client->mu);
    h = find_hold(l->entry, pthread_self());
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
    h = find_hold(l->entry, pthread_self());
    if (h)
        n = h->lost || dlock__now_ms() >= h->lease_end ? DLOCK_ELOST
                                                        : h->count;
    pthread_mutex_unlock(&l->client->mu);
    return n;
}

/* ------------------------------------------------------------------------ */
/* Inspection                                                               */
/* ------------------------------------------------------------------------ */

void dlock_info_clear(dlock_info *info)
{
    if (!info)
        return;
    for (size_t i = 0; i < info->queue_len; i++)
        free(info->queue[i]);
    free(info->queue);
    memset(info, 0, sizeof(*info));
}

int dlock__info_add_waiter(dlock_info *out, const char *s)
{
    size_t n = out->queue_len;

    /* capacity: 8, then doubled whenever n reaches a power of two */
    if (n == 0 || (n >= 8 && (n & (n - 1)) == 0)) {
        char **p = realloc(out->queue, (n ? 2 * n : 8) * sizeof(*p));
        if (!p)
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        out->queue = p;
    }
    if (!(out->queue[n] = strdup(s)))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    out->queue_len = n + 1;
    return DLOCK_OK;
}

int dlock_inspect(dlock_client *c, const char *name, dlock_info *out)
{
    size_t len = 0;
    int rc;

    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_inspect: out is NULL");
    memset(out, 0, sizeof(*out));
    if (!c)
        return dlock__err(DLOCK_EINVAL, "dlock_inspect: client is NULL");
    rc = check_name(name, &len);
    if (rc)
        return rc;
    pthread_mutex_lock(&c->mu);
    rc = usable(c);
    pthread_mutex_unlock(&c->mu);
    if (rc)
        return rc;
    out->ttl_ms = -1;
    out->held_ms = -1;
    out->waiters = -1;
    rc = c->be->inspect(c->st, name, len, out,
                        dlock__now_ms() + c->timeout_ms);
    if (rc) {
        dlock_info_clear(out);
        return rc;
    }
    return DLOCK_OK;
}

int dlock_gc(dlock_client *c, int64_t idle_ms, uint64_t *removed)
{
    uint64_t n = 0;
    int rc;

    if (removed)
        *removed = 0;
    if (!c)
        return dlock__err(DLOCK_EINVAL, "dlock_gc: client is NULL");
    if (idle_ms < 0)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_gc: idle_ms must not be negative, not %lld",
                          (long long)idle_ms);
    pthread_mutex_lock(&c->mu);
    rc = usable(c);
    pthread_mutex_unlock(&c->mu);
    if (rc)
        return rc;
    if (!c->be->gc)
        return dlock__err(DLOCK_ENOTSUP,
                          "%s: this store keeps nothing to collect (its "
                          "locks leave no state, or the store removes it)",
                          dlock_client_store(c));
    rc = c->be->gc(c->st, idle_ms, &n, dlock__now_ms() + c->timeout_ms);
    if (rc == DLOCK_OK && removed)
        *removed = n;
    return rc;
}
