/* SPDX-License-Identifier: MIT */
/*
 * client.c -- clients, their background thread, and wake-ups.
 *
 * Each client runs one background thread. It sleeps in poll() on an eventfd
 * (and on one fd of the backend's, e.g. Redis' subscriber connection) until
 * the earliest of: a hold's renewal time, a hold's local lease end, or a
 * wake-up. Then it
 *   1. lets the backend handle its fd (wake-up notifications),
 *   2. declares lost every hold whose local lease has run out,
 *   3. renews every hold that is due (at ttl/3, in small batches),
 *   4. runs lost-lock callbacks, without holding the client mutex.
 *
 * Renewal versus release (the race that bit Redisson): a renewal marks the
 * hold `renewing` under the client mutex before it talks to the store, and
 * release waits for that mark to clear, under the same mutex, before it
 * unlinks the hold. So a renewal never runs on a released hold, and a
 * renewal's answer is never applied to a hold it was not sent for. Renewal
 * itself is a compare-on-owner script: it cannot extend another owner.
 */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT_MS 2000

/* ------------------------------------------------------------------------ */
/* Wake-ups (called by backends, any thread)                                */
/* ------------------------------------------------------------------------ */

void dlock__loop_wake(dlock_client *c)
{
    uint64_t one = 1;
    ssize_t n;

    do
        n = write(c->wake_fd, &one, sizeof(one));
    while (n < 0 && errno == EINTR);
}

/* A new deadline for the background thread: woken only when it is
 * earlier than the one it sleeps towards (an acquire after the first
 * rarely pays for a context switch to tell it about a renewal 10 s away;
 * not a timerfd: libfaketime, which the clock-skew tests run holders
 * under, shifts absolute timerfd times). */
void dlock__schedule(dlock_client *c, int64_t when)
{
    if (when < c->next_wake) {
        c->next_wake = when;
        dlock__loop_wake(c);
    }
}

/* Wakes waiter w (c->mu held): through its condition variable, or, if it
 * is the thread reading the backend's fd, through the reader's eventfd. */
void dlock__wake_waiter(dlock_client *c, dlock__waiter *w)
{
    /* the moment the store's word arrived, for dlock_handoff_seconds */
    if (!w->rearm && dlock__m_on(&c->m))
        w->woken_us = dlock__now_us();
    if (w == c->reader) {
        /* the reader itself, reading: it looks at its flags next */
        if (pthread_equal(pthread_self(), w->thread))
            return;
        uint64_t one = 1;
        ssize_t n;
        do
            n = write(c->reader_fd, &one, sizeof(one));
        while (n < 0 && errno == EINTR);
    } else {
        pthread_cond_signal(&w->cv);
    }
}

void dlock__notify_name(dlock_client *c, const char *name, size_t len)
{
    pthread_mutex_lock(&c->mu);
    dlock__entry *e = dlock__entry_find(c, name, len);
    if (e) {
        /* Wake the oldest waiter of this name that has not been woken yet:
         * only one can win, and a waiter that gives up passes its wake-up
         * on (see lock.c), so none is lost. */
        for (dlock__waiter *w = c->waiters; w; w = w->next) {
            if (w->entry == e && !w->fair && !w->notified) {
                w->notified = 1;
                dlock__wake_waiter(c, w);
                break;
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
}

void dlock__notify_fair(dlock_client *c, const char *name, size_t len)
{
    pthread_mutex_lock(&c->mu);
    dlock__entry *e = dlock__entry_find(c, name, len);
    for (dlock__waiter *w = c->waiters; e && w; w = w->next) {
        if (w->entry == e && w->fair) {
            w->notified = 1;
            dlock__wake_waiter(c, w);
        }
    }
    pthread_mutex_unlock(&c->mu);
}

void dlock__notify_waiter(dlock_client *c, uint64_t seq)
{
    pthread_mutex_lock(&c->mu);
    for (dlock__waiter *w = c->waiters; w; w = w->next) {
        if (w->seq == seq) {
            w->notified = 1;
            dlock__wake_waiter(c, w);
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

void dlock__notify_grant(dlock_client *c, uint64_t seq, uint64_t token)
{
    pthread_mutex_lock(&c->mu);
    for (dlock__waiter *w = c->waiters; w; w = w->next) {
        if (w->seq == seq) {
            if (!w->granted) {
                w->granted = 1;
                w->token = token;
                dlock__wake_waiter(c, w);
            }
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

void dlock__notify_error(dlock_client *c)
{
    pthread_mutex_lock(&c->mu);
    for (dlock__waiter *w = c->waiters; w; w = w->next) {
        w->rearm = 1;
        dlock__wake_waiter(c, w);
    }
    pthread_mutex_unlock(&c->mu);
}

static void mark_lost(dlock_client *c, dlock__hold *h, const char *why,
                      int cause);

void dlock__notify_lost(dlock_client *c,
                        int (*match)(const dlock__lease *l, void *arg),
                        void *arg, const char *why)
{
    int any = 0;

    pthread_mutex_lock(&c->mu);
    for (dlock__hold *h = c->holds; h; h = h->next) {
        if (h->lost || h->count == 0 || !match(&h->lease, arg))
            continue;
        mark_lost(c, h, why, DLOCK__M_LOST_STORE);
        h->announce = 1;
        any = 1;
    }
    pthread_mutex_unlock(&c->mu);
    if (any)
        dlock__loop_wake(c);
}

void dlock__renew_now(dlock_client *c)
{
    pthread_mutex_lock(&c->mu);
    for (dlock__hold *h = c->holds; h; h = h->next)
        if (!h->lost && h->count > 0)
            h->renew_at = 0;
    pthread_mutex_unlock(&c->mu);
    dlock__loop_wake(c);
}

const char *dlock__client_id(const dlock_client *c)
{
    return c->id;
}

/* ------------------------------------------------------------------------ */
/* The watchdog                                                             */
/* ------------------------------------------------------------------------ */

/* What the background thread tells the callbacks, collected under c->mu
 * and delivered without it. */
typedef struct ev_note {
    dlock *handle;
    uint64_t token;
    int type;        /* DLOCK_EVENT_LOST, LONG_HOLD, AT_RISK or SAFE */
    int shared;      /* as dlock_event.shared */
    int64_t held_ms; /* the hold's age */
    int64_t left_ms; /* AT_RISK, SAFE: the local lease left */
    char why[400];
} ev_note;

typedef struct ev_notes {
    ev_note *v;
    size_t n, cap;
} ev_notes;

static void mark_lost(dlock_client *c, dlock__hold *h, const char *why,
                      int cause)
{
    h->lost = 1;
    h->lost_cause = cause;
    if (dlock__m_on(&c->m))
        dlock__m_inc(h->entry->ms, cause);
    snprintf(h->why, sizeof(h->why), "lock '%.100s': %s", h->entry->name,
             why);
}

/* The local lease end of hold h: the core's for a store whose leases the
 * watchdog renews, else the store's word (FOREVER: none). */
static int64_t hold_end(const dlock_client *c, const dlock__hold *h)
{
    return (c->be->caps & DLOCK__CAP_LEASE) ? h->lease_end : h->store_end;
}

/* How long after a renewal the next one is due: ttl/3, or earlier so that
 * a renewal and a retry fit before the at-risk moment (design.md, "Leases,
 * the watchdog, and loss"). c->mu held. */
static int64_t renew_in(const dlock_client *c, int64_t ttl)
{
    int64_t k = ttl / 3, m = c->at_risk_ms;

    if (m > 0) {
        int64_t fit = (ttl - dlock__client_margin(c, ttl) - m) / 2;
        if (fit < k)
            k = fit;
        if (k < ttl / 10)
            k = ttl / 10;
    }
    return k > 0 ? k : 1;
}

/* When the background thread must look at hold h next (c->mu held). */
static int64_t hold_next(const dlock_client *c, const dlock__hold *h)
{
    int64_t next = DLOCK__FOREVER, end = hold_end(c, h);

    if (!(h->handle->opts.flags & DLOCK_NO_RENEW))
        next = h->renew_at;
    if (end < next)
        next = end;
    if (c->at_risk_ms > 0 && end != DLOCK__FOREVER && !h->at_risk &&
        end - c->at_risk_ms < next)
        next = end - c->at_risk_ms;
    return next;
}

void dlock__hold_leased(dlock_client *c, dlock__hold *h, int64_t t0)
{
    int64_t ttl = h->lease.ttl_ms;

    if (!(c->be->caps & DLOCK__CAP_LEASE)) {
        /* the store tells the lease end (ZooKeeper, etcd): on the next
         * pass of its loop, which this wakes while someone listens */
        h->lease_end = h->renew_at = h->store_end = DLOCK__FOREVER;
        if (c->at_risk_ms > 0)
            dlock__loop_wake(c);
        return;
    }
    h->lease_end = t0 + ttl - dlock__client_margin(c, ttl);
    h->renew_at = t0 + renew_in(c, ttl);
    h->risk_why[0] = '\0';
    /* a hold at risk that dlock_extend() renewed: SAFE at once */
    dlock__schedule(c, h->at_risk ? dlock__now_ms() : hold_next(c, h));
}

/* The earliest moment some hold needs the background thread: a hold's
 * at-risk moment, or the local lease end of one at risk (or of any, with
 * no margin). c->mu held. */
static int64_t attention(const dlock_client *c)
{
    int64_t at = DLOCK__FOREVER, m = c->at_risk_ms;

    for (const dlock__hold *h = c->holds; h; h = h->next) {
        int64_t end = hold_end(c, h);
        if (h->lost || h->count == 0 || end == DLOCK__FOREVER)
            continue;
        if (m > 0 && !h->at_risk)
            end -= m;
        if (end < at)
            at = end;
    }
    return at;
}

int64_t dlock__loop_deadline(dlock_client *c, int64_t deadline)
{
    int64_t at;

    pthread_mutex_lock(&c->mu);
    at = attention(c);
    pthread_mutex_unlock(&c->mu);
    return at < deadline ? at : deadline;
}

void dlock__notify_lease_end(dlock_client *c,
                             int (*match)(const dlock__lease *l, void *arg),
                             void *arg, int64_t end_ms, const char *why)
{
    int wake = 0;

    if (__atomic_load_n(&c->at_risk_ms, __ATOMIC_RELAXED) == 0)
        return;
    if (!why)
        why = "";
    pthread_mutex_lock(&c->mu);
    for (dlock__hold *h = c->holds; h; h = h->next) {
        if (h->lost || h->count == 0 || !match(&h->lease, arg))
            continue;
        if (h->store_end == end_ms && !strncmp(h->risk_why, why,
                                               sizeof(h->risk_why) - 1))
            continue;
        h->store_end = end_ms;
        snprintf(h->risk_why, sizeof(h->risk_why), "%s", why);
        /* the thread must look before it would anyway: an earlier
         * at-risk moment, or a hold at risk that may be safe now */
        if (h->at_risk || (end_ms != DLOCK__FOREVER &&
                           end_ms - c->at_risk_ms < c->next_wake))
            wake = 1;
    }
    pthread_mutex_unlock(&c->mu);
    if (wake)
        dlock__loop_wake(c);
}

/* Collects a note for the background thread's callbacks (grown as
 * needed): a loss (the lost-lock callback and the LOST event), a long
 * hold, or a hold at risk or safe again; c->mu held. */
static void note(dlock_client *c, dlock__hold *h, int type, int64_t left_ms,
                 ev_notes *ns)
{
    if (!(type == DLOCK_EVENT_LOST && h->handle->opts.on_lost) && !c->ev_cb)
        return;
    if (ns->n == ns->cap) {
        size_t nc = ns->cap ? ns->cap * 2 : 8;
        ev_note *nn = realloc(ns->v, nc * sizeof(*nn));
        if (!nn)
            return; /* the owner still learns it from dlock_release() */
        ns->v = nn;
        ns->cap = nc;
    }
    ev_note *ln = &ns->v[ns->n++];
    ln->handle = h->handle;
    ln->token = h->lease.token;
    ln->type = type;
    ln->shared = h->lease.kind == DLOCK__READ     ? 1
                 : h->lease.kind == DLOCK__PERMIT ? 2
                                                  : 0;
    ln->held_ms = (dlock__now_us() - h->acquired_us) / 1000;
    ln->left_ms = left_ms;
    if (type == DLOCK_EVENT_LOST) {
        snprintf(ln->why, sizeof(ln->why), "%s", h->why);
    } else if (type == DLOCK_EVENT_AT_RISK) {
        const char *why = h->risk_why;
        if (!why[0])
            why = !(c->be->caps & DLOCK__CAP_LEASE)
                      ? "the store has not confirmed it in time"
                  : (h->handle->opts.flags & DLOCK_NO_RENEW)
                      ? "it is not renewed (DLOCK_NO_RENEW): its lease "
                        "ends soon"
                      : "no renewal has extended its lease in time";
        snprintf(ln->why, sizeof(ln->why), "lock '%.100s': %.280s",
                 h->entry->name, why);
    } else {
        ln->why[0] = '\0';
    }
    h->handle->callbacks++;
}

/* Runs the callbacks of ns (c->mu held on entry and exit, dropped while
 * they run) and empties it. */
static void deliver(dlock_client *c, ev_notes *ns)
{
    for (size_t i = 0; i < ns->n; i++) {
        ev_note *n = &ns->v[i];
        dlock *l = n->handle;
        dlock_lost_cb cb = n->type == DLOCK_EVENT_LOST ? l->opts.on_lost
                                                       : NULL;
        void *arg = l->opts.on_lost_arg;
        dlock_event_cb ev = c->ev_cb;
        void *ev_arg = c->ev_arg;

        pthread_mutex_unlock(&c->mu);
        if (n->type == DLOCK_EVENT_LOST)
            dlock__err(DLOCK_ELOST, "%s", n->why);
        if (cb)
            cb(l, n->token, arg);
        if (ev) {
            dlock_event e;
            memset(&e, 0, sizeof(e));
            e.type = n->type;
            e.lock = l;
            e.name = l->entry->name;
            e.shared = n->shared;
            e.token = n->token;
            e.held_ms = n->held_ms;
            e.why = n->why;
            e.left_ms = n->left_ms;
            ev(&e, ev_arg);
        }
        pthread_mutex_lock(&c->mu);
        l->callbacks--;
        pthread_cond_broadcast(&c->cv);
    }
    ns->n = 0;
}

/* Applies the answer `rc` (with the message `err`) to renewing hold h,
 * renewed from t0 (c->mu held): a new lease end, a loss, or another try
 * soon. */
static void renewed(dlock_client *c, dlock__hold *h, int rc, const char *err,
                    int64_t t0, ev_notes *ns, int64_t *next)
{
    int64_t ttl = h->lease.ttl_ms;

    h->renewing = 0;
    if (dlock__m_on(&c->m) && rc != DLOCK_ENOTHELD)
        dlock__m_inc(h->entry->ms, rc == DLOCK_OK ? DLOCK__M_RENEWED
                                                  : DLOCK__M_RENEW_FAILED);
    if (rc == DLOCK_OK) {
        h->lease_end = t0 + ttl - dlock__client_margin(c, ttl);
        h->renew_at = t0 + renew_in(c, ttl);
        h->risk_why[0] = '\0';
        int64_t now = dlock__now_ms();
        if (h->at_risk &&
            (c->at_risk_ms == 0 || now < h->lease_end - c->at_risk_ms)) {
            h->at_risk = 0;
            note(c, h, DLOCK_EVENT_SAFE, h->lease_end - now, ns);
        }
    } else if (rc == DLOCK_ENOTHELD) {
        mark_lost(c, h, "renewal found it deleted or taken over in the store",
                  DLOCK__M_LOST_TAKEN);
        note(c, h, DLOCK_EVENT_LOST, 0, ns);
    } else {
        /* The store did not answer (or not before the renewal was cut
         * short): try again soon, until the local lease end declares the
         * hold lost. */
        int64_t again = dlock__now_ms() + (ttl / 10 > 1000 ? 1000 : ttl / 10);
        h->renew_at = again < h->lease_end ? again : h->lease_end;
        snprintf(h->risk_why, sizeof(h->risk_why), "renewal failed: %s",
                 err && err[0] ? err : dlock_strerror(rc));
    }
    if (!h->lost) {
        int64_t at = hold_next(c, h);
        if (at < *next)
            *next = at;
    }
    pthread_cond_broadcast(&c->cv);
}

/* Renews due[0..n) (all marked renewing) in one call of the backend's
 * extend_many, cut at `deadline` (c->mu held; dropped meanwhile); rcs[i]
 * gets each answer, err the message of a failure. Returns 0, or -1 when
 * it could not even start (out of memory). */
static int renew_batch(dlock_client *c, dlock__hold **due, size_t n,
                       int *rcs, int64_t deadline, char *err, size_t errcap)
{
    dlock__lease **ls = malloc(n * sizeof(*ls));
    int64_t *ttls = malloc(n * sizeof(*ttls));
    int rc;

    if (!ls || !ttls) {
        free(ls);
        free(ttls);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        ls[i] = &due[i]->lease;
        ttls[i] = due[i]->lease.ttl_ms;
    }
    pthread_mutex_unlock(&c->mu);
    int64_t u0 = dlock__now_us();
    rc = c->be->extend_many(c->st, ls, ttls, rcs, n, deadline);
    if (dlock__m_on(&c->m))
        dlock__m_store_op(&c->m, dlock__now_us() - u0, rc);
    snprintf(err, errcap, "%s", dlock_errmsg());
    pthread_mutex_lock(&c->mu);
    if (rc != DLOCK_OK)
        for (size_t i = 0; i < n; i++)
            rcs[i] = rc;
    free(ls);
    free(ttls);
    return 0;
}

/* One pass of the watchdog; c->mu held on entry and exit (dropped while
 * talking to the store and in callbacks). Returns when it wants to run
 * next. */
static int64_t watchdog(dlock_client *c)
{
    int64_t now = dlock__now_ms();
    int64_t next = DLOCK__FOREVER;
    int64_t m = c->at_risk_ms;
    dlock__hold **due = NULL;
    size_t ndue = 0, capdue = 0;
    ev_notes ns = {NULL, 0, 0};
    int leases = (c->be->caps & DLOCK__CAP_LEASE) != 0;

    /* 1. what happened: losses, long holds, holds at risk or safe */
    for (dlock__hold *h = c->holds; h; h = h->next) {
        if (h->announce) { /* declared lost by the backend */
            h->announce = 0;
            note(c, h, DLOCK_EVENT_LOST, 0, &ns);
        }
    }
    for (dlock__hold *h = c->holds; h; h = h->next) {
        if (h->long_at == DLOCK__FOREVER || h->lost || h->count == 0)
            continue;
        if (now >= h->long_at) {
            h->long_at = DLOCK__FOREVER;
            if (dlock__m_on(&c->m))
                dlock__m_inc(h->entry->ms, DLOCK__M_LONG_HOLDS);
            note(c, h, DLOCK_EVENT_LONG_HOLD, 0, &ns);
        } else if (h->long_at < next) {
            next = h->long_at;
        }
    }
    for (dlock__hold *h = c->holds; h; h = h->next) {
        if (h->lost || h->renewing || h->count == 0)
            continue;
        int64_t end = hold_end(c, h);
        if (leases && now >= end) {
            mark_lost(c, h, "the lease ran out before it could be renewed",
                      DLOCK__M_LOST_EXPIRED);
            note(c, h, DLOCK_EVENT_LOST, 0, &ns);
            continue;
        }
        if (m > 0 && end != DLOCK__FOREVER) {
            if (!h->at_risk && now >= end - m) {
                h->at_risk = 1;
                note(c, h, DLOCK_EVENT_AT_RISK, end - now, &ns);
            } else if (h->at_risk && now < end - m) {
                /* a store's word or dlock_extend() moved the end */
                h->at_risk = 0;
                note(c, h, DLOCK_EVENT_SAFE, end - now, &ns);
            }
        } else if (h->at_risk) {
            /* the store's word: no end (ZooKeeper connected again); or
             * the margin was turned off (no event then) */
            h->at_risk = 0;
            if (m > 0)
                note(c, h, DLOCK_EVENT_SAFE, INT64_MAX, &ns);
        }
        int64_t at = hold_next(c, h);
        if (at < next)
            next = at;
    }
    /* delivered before any renewal starts: a renewal may take until the
     * next at-risk moment, and a callback may release or extend a hold,
     * which waits for that hold's renewal */
    deliver(c, &ns);
    if (!leases)
        goto out;

    /* 2. renewals */
    now = dlock__now_ms();
    for (dlock__hold *h = c->holds; h; h = h->next) {
        if (h->lost || h->renewing || h->count == 0 ||
            (h->handle->opts.flags & DLOCK_NO_RENEW))
            continue;
        if (now >= h->lease_end) { /* ran out during the callbacks */
            next = now;
            continue;
        }
        /* Renew a little early when a wake-up is happening anyway, so
         * that many holds share wake-ups. */
        if (h->renew_at > now + h->lease.ttl_ms / 10)
            continue;
        if (ndue == capdue) {
            size_t nc = capdue ? capdue * 2 : 8;
            dlock__hold **nd = realloc(due, nc * sizeof(*nd));
            if (!nd) {
                next = now + 10; /* try again shortly */
                break;
            }
            due = nd;
            capdue = nc;
        }
        due[ndue++] = h;
        h->renewing = 1;
    }
    if (ndue > 0) {
        /* every store call ends by the moment a hold needs this thread
         * (design.md, "Leases, the watchdog, and loss") */
        int64_t cap = attention(c);
        int64_t t0 = dlock__now_ms();
        int64_t dl = t0 + c->timeout_ms < cap ? t0 + c->timeout_ms : cap;
        char err[256];

        if (c->be->extend_many) {
            /* one batch for all: the backend pipelines them */
            int *rcs = malloc(ndue * sizeof(*rcs));
            if (rcs && renew_batch(c, due, ndue, rcs, dl, err,
                                   sizeof(err)) == 0) {
                for (size_t i = 0; i < ndue; i++)
                    renewed(c, due[i], rcs[i], err, t0, &ns, &next);
                ndue = 0;
            }
            free(rcs);
        }
        for (size_t i = 0; i < ndue; i++) {
            dlock__hold *h = due[i];
            int64_t ttl = h->lease.ttl_ms;
            int rc;

            t0 = dlock__now_ms();
            dl = t0 + c->timeout_ms < cap ? t0 + c->timeout_ms : cap;
            pthread_mutex_unlock(&c->mu);
            int64_t u0 = dlock__now_us();
            rc = c->be->extend(c->st, &h->lease, ttl, dl);
            if (dlock__m_on(&c->m))
                dlock__m_store_op(&c->m, dlock__now_us() - u0, rc);
            snprintf(err, sizeof(err), "%s", dlock_errmsg());
            pthread_mutex_lock(&c->mu);
            renewed(c, h, rc, err, t0, &ns, &next);
        }
        /* a renewal cut short at `cap`: some hold's moment is now */
        if (cap < next)
            next = cap;
        deliver(c, &ns);
    }
out:
    free(due);
    free(ns.v);
    return next;
}

static void *background(void *arg)
{
    dlock_client *c = arg;

    pthread_mutex_lock(&c->mu);
    c->thread_running = 1;
    pthread_cond_broadcast(&c->cv);
    while (!c->stopping) {
        int64_t next = watchdog(c);
        int64_t now = dlock__now_ms();
        struct pollfd fds[2];
        int nfds = 1, timeout;
        /* while a waiting thread reads the backend's fd, leave it alone
         * (a thread that waits for something the fd brings wakes this one
         * first, see CAP_WAITER_READS) */
        int others_read = c->reader != NULL;

        c->next_wake = next;
        pthread_mutex_unlock(&c->mu);

        fds[0].fd = c->wake_fd;
        fds[0].events = POLLIN;
        fds[1].fd = c->be->loop_fd && !others_read ? c->be->loop_fd(c->st)
                                                     : -1;
        fds[1].events = POLLIN;
        fds[1].revents = 0;
        if (fds[1].fd >= 0)
            nfds = 2;
        if (next == DLOCK__FOREVER)
            timeout = -1;
        else if (next <= now)
            timeout = 0;
        else
            timeout = next - now > 60000 ? 60000 : (int)(next - now);
        if (poll(fds, (nfds_t)nfds, timeout) > 0 &&
            (fds[0].revents & POLLIN)) {
            uint64_t v;
            if (read(c->wake_fd, &v, sizeof(v)) < 0) {
                /* nothing to do: the eventfd was drained already */
            }
        }
        if (c->be->loop_run)
            c->be->loop_run(c->st,
                            nfds == 2 &&
                                !__atomic_load_n(&c->reader, __ATOMIC_RELAXED) &&
                                (fds[1].revents & (POLLIN | POLLERR | POLLHUP)));
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Opening and closing                                                      */
/* ------------------------------------------------------------------------ */

/* Appends `s` to buf with every byte outside [A-Za-z0-9/._-] %-escaped. */
static void append_escaped(char *buf, size_t cap, const char *s)
{
    size_t o = strlen(buf);

    for (; *s && o + 4 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
            (ch >= '0' && ch <= '9') || ch == '/' || ch == '.' ||
            ch == '_' || ch == '-')
            buf[o++] = (char)ch;
        else
            o += (size_t)snprintf(buf + o, cap - o, "%%%02X", ch);
    }
    buf[o] = '\0';
}

/* The way out that every error about the default store names. */
#define DEFAULT_FIX \
    "; give dlock a directory with --store file:///DIR or DLOCK_STORE"

/* The directory of the default store, below the home directory. */
#define DEFAULT_SUBDIR "/.local/state/dlock"

/* The URI used when none is given: $DLOCK_STORE, else the private file
 * store HOME/.local/state/dlock, HOME being the home directory of the
 * effective uid's passwd entry, its symbolic links resolved. Never $HOME
 * or an $XDG_ variable: they differ between cron, sudo, services and
 * logins, and every session of a user must find one directory
 * (docs/stores.md, "The default store"). The file store's ?private=1
 * checks the directories; the symbolic links of the home's own path are
 * resolved here because they are the administrator's, like the passwd
 * entry itself. */
static int default_uri(char *buf, size_t cap)
{
    const char *env = getenv("DLOCK_STORE");
    uid_t uid = geteuid();
    struct passwd pw, *found = NULL;
    char *pwbuf = NULL, *home;
    size_t pwcap = 1024, need;
    int e;

    if (env && *env) {
        if (strlen(env) >= cap)
            return dlock__err(DLOCK_EINVAL, "DLOCK_STORE is too long");
        memcpy(buf, env, strlen(env) + 1);
        return DLOCK_OK;
    }
    for (;;) { /* a buffer big enough for the entry (1 MiB at most) */
        char *nb = realloc(pwbuf, pwcap);
        if (!nb) {
            free(pwbuf);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
        pwbuf = nb;
        e = getpwuid_r(uid, &pw, pwbuf, pwcap, &found);
        if (e != ERANGE || pwcap >= (size_t)1 << 20)
            break;
        pwcap *= 2;
    }
    if (!found) {
        free(pwbuf);
        if (e == 0 || e == ENOENT || e == ESRCH)
            return dlock__err(DLOCK_ENOTSUP,
                              "the default store lives in your home "
                              "directory, but uid %lu has no passwd "
                              "entry" DEFAULT_FIX,
                              (unsigned long)uid);
        return dlock__err(DLOCK_ENOTSUP,
                          "the default store lives in your home directory, "
                          "but the passwd entry of uid %lu cannot be read: "
                          "%s" DEFAULT_FIX,
                          (unsigned long)uid, strerror(e));
    }
    if (!pw.pw_dir || pw.pw_dir[0] != '/') {
        int rc = dlock__err(DLOCK_ENOTSUP,
                            "the default store lives in your home "
                            "directory, but the passwd entry of uid %lu "
                            "(%.64s) gives none (\"%.200s\")" DEFAULT_FIX,
                            (unsigned long)uid,
                            pw.pw_name ? pw.pw_name : "",
                            pw.pw_dir ? pw.pw_dir : "");
        free(pwbuf);
        return rc;
    }
    home = realpath(pw.pw_dir, NULL);
    if (!home) {
        e = errno;
        int rc = dlock__err(e == ENOMEM ? DLOCK_ENOMEM : DLOCK_ENOTSUP,
                            "the default store lives in your home "
                            "directory, %.200s (the passwd entry of uid %lu, "
                            "%.64s), which cannot be used: %s" DEFAULT_FIX,
                            pw.pw_dir, (unsigned long)uid,
                            pw.pw_name ? pw.pw_name : "", strerror(e));
        free(pwbuf);
        return rc;
    }
    free(pwbuf);
    /* "file://" + the escaped home ("/" adds nothing) + the rest */
    need = strlen("file://") + strlen(DEFAULT_SUBDIR "?private=1") + 1;
    for (const char *p = home; *p; p++)
        need += strchr("/._-", *p) || (*p >= 'a' && *p <= 'z') ||
                        (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')
                    ? 1
                    : 3;
    if (need > cap) {
        int rc = dlock__err(DLOCK_ENOTSUP,
                            "the default store lives in your home "
                            "directory, whose path is too long (%zu bytes "
                            "escaped)" DEFAULT_FIX,
                            need);
        free(home);
        return rc;
    }
    snprintf(buf, cap, "file://");
    if (strcmp(home, "/") != 0)
        append_escaped(buf, cap, home);
    strcat(buf, DEFAULT_SUBDIR "?private=1");
    free(home);
    return DLOCK_OK;
}

static void client_free(dlock_client *c)
{
    for (size_t i = 0; i < c->nbuckets; i++) {
        dlock__entry *e = c->buckets[i];
        while (e) {
            dlock__entry *next = e->chain;
            free(e->name);
            free(e);
            e = next;
        }
    }
    free(c->buckets);
    dlock__metrics_free(&c->m);
    if (c->wake_fd >= 0)
        close(c->wake_fd);
    if (c->reader_fd >= 0)
        close(c->reader_fd);
    for (int i = 0; i < c->n_cfd_free; i++)
        close(c->cfd_free[i]);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c->store);
    dlock__store_close(c->module);
    free(c);
}

int dlock_client_open(dlock_client **out, const char *uri,
                      const dlock_client_options *opts)
{
    char defuri[4200];
    dlock__uri u;
    const dlock__backend *be;
    dlock_client *c;
    unsigned char id[16];
    void *module = NULL;
    int rc;

    dlock__err_clear();
    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_client_open: out is NULL");
    *out = NULL;
    if (opts && opts->timeout_ms < 0)
        return dlock__err(DLOCK_EINVAL,
                          "client option timeout_ms must not be negative");
    if (!uri || !*uri) {
        rc = default_uri(defuri, sizeof(defuri));
        if (rc)
            return rc;
        uri = defuri;
    }
    rc = dlock__uri_parse(uri, &u);
    if (rc)
        return rc;
    rc = dlock__store_open(u.scheme, &be, &module);
    if (rc) {
        dlock__uri_free(&u);
        return rc;
    }
    if (be->select && be->select(&u))
        be = be->select(&u);

    c = calloc(1, sizeof(*c));
    if (!c) {
        dlock__uri_free(&u);
        dlock__store_close(module);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    c->module = module;
    c->wake_fd = -1;
    c->reader_fd = -1;
    c->be = be;
    c->refs = 1;
    c->next_wake = DLOCK__FOREVER;
    dlock__metrics_init(&c->m);
    c->timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms
                                                  : DEFAULT_TIMEOUT_MS;
    c->pid = dlock__pid();
    if (gethostname(c->host, sizeof(c->host) - 1) != 0)
        strcpy(c->host, "unknown-host");
    pthread_mutex_init(&c->mu, NULL);
    rc = dlock__cond_init(&c->cv);
    if (rc) {
        pthread_mutex_destroy(&c->mu);
        free(c);
        dlock__uri_free(&u);
        dlock__store_close(module);
        return rc;
    }
    c->store = strdup(u.redacted);
    rc = dlock__random(id, sizeof(id));
    if (!c->store && !rc)
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    if (rc)
        goto fail;
    for (size_t i = 0; i < sizeof(id); i++)
        snprintf(c->id + 2 * i, 3, "%02x", id[i]);
    c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->wake_fd >= 0 && (be->caps & DLOCK__CAP_WAITER_READS))
        c->reader_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->wake_fd < 0 ||
        ((be->caps & DLOCK__CAP_WAITER_READS) && c->reader_fd < 0)) {
        rc = dlock__err(DLOCK_ENOMEM, "eventfd failed: %s", strerror(errno));
        goto fail;
    }

    rc = be->open(&c->st, c, &u, c->timeout_ms);
    if (rc)
        goto fail;

    sigset_t old;
    dlock__block_signals(&old);
    rc = pthread_create(&c->thread, NULL, background, c);
    dlock__restore_signals(&old);
    if (rc != 0) {
        be->close(c->st);
        rc = dlock__err(DLOCK_ENOMEM, "cannot start the client thread: %s",
                        strerror(rc));
        goto fail;
    }
    c->thread_started = 1;
    /* return only once the thread runs its loop: a thread still starting
     * (its runtime setting itself up, allocating) when the caller forks
     * leaves the child with locks no thread will release (seen with
     * AddressSanitizer's allocator) */
    pthread_mutex_lock(&c->mu);
    while (!c->thread_running)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    dlock__uri_free(&u);
    *out = c;
    return DLOCK_OK;

fail:
    dlock__uri_free(&u);
    client_free(c);
    return rc;
}

void dlock__client_unref(dlock_client *c)
{
    if (--c->refs > 0) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    pthread_mutex_unlock(&c->mu);
    client_free(c);
}

void dlock_client_close(dlock_client *c)
{
    if (!c)
        return;
    if (c->thread_started && pthread_equal(pthread_self(), c->thread))
        return; /* from a callback: documented as not allowed */
    if (c->pid != dlock__pid())
        return; /* a forked child: no thread to stop, and the holds and
                 * connections are the parent's (a release or a goodbye
                 * sent from here would end them under the parent) */

    pthread_mutex_lock(&c->mu);
    if (c->closed) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    c->closed = 1;
    c->stopping = 1;
    pthread_mutex_unlock(&c->mu);
    if (c->thread_started) {
        dlock__loop_wake(c);
        pthread_join(c->thread, NULL);
        c->thread_started = 0;
    }

    pthread_mutex_lock(&c->mu);
    while (c->holds) {
        dlock__hold *h = c->holds;
        dlock__hold_unlink(c, h);
        pthread_mutex_unlock(&c->mu);
        dlock__hold_drop(c, h);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);

    c->be->close(c->st);
    c->st = NULL;
    pthread_mutex_lock(&c->mu);
    dlock__client_unref(c);
}

const char *dlock_client_store(const dlock_client *c)
{
    return c ? c->store : "";
}

int dlock_client_set_events(dlock_client *c, dlock_event_cb cb, void *arg,
                            int64_t long_hold_ms)
{
    int rc;

    if (!c)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_client_set_events: client is NULL");
    if (long_hold_ms < 0)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_client_set_events: long_hold_ms must not be "
                          "negative, not %lld",
                          (long long)long_hold_ms);
    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    if (rc == DLOCK_OK) {
        c->ev_cb = cb;
        c->ev_arg = arg;
        c->long_hold_ms = long_hold_ms;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int dlock_client_set_at_risk(dlock_client *c, int64_t margin_ms)
{
    int rc;

    if (!c)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_client_set_at_risk: client is NULL");
    if (margin_ms < 0)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_client_set_at_risk: margin_ms must not be "
                          "negative, not %lld",
                          (long long)margin_ms);
    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    if (rc == DLOCK_OK)
        __atomic_store_n(&c->at_risk_ms, margin_ms, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->mu);
    if (rc == DLOCK_OK)
        dlock__loop_wake(c); /* every hold's at-risk moment moved */
    return rc;
}

int dlock_client_at_risk_max(dlock_client *c, int64_t ttl_ms,
                             int64_t *max_ms)
{
    int rc;

    if (!c)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_client_at_risk_max: client is NULL");
    if (!max_ms)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_client_at_risk_max: max_ms is NULL");
    *max_ms = 0;
    if (ttl_ms < DLOCK_TTL_MIN)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_client_at_risk_max: ttl_ms must be at "
                          "least %d, not %lld",
                          DLOCK_TTL_MIN, (long long)ttl_ms);
    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    pthread_mutex_unlock(&c->mu);
    if (rc)
        return rc;
    if (c->be->at_risk_max)
        return c->be->at_risk_max(c->st, ttl_ms, max_ms,
                                  dlock__now_ms() + c->timeout_ms);
    if (!(c->be->caps & DLOCK__CAP_LEASE)) {
        *max_ms = INT64_MAX; /* no lease: no at-risk event */
        return DLOCK_OK;
    }
    /* renewals every min(ttl/3, (ttl - drift - M)/2): at least ttl/6
     * while M <= 2/3 ttl - drift */
    int64_t m = ttl_ms * 2 / 3 - dlock__client_margin(c, ttl_ms);
    *max_ms = m > 0 ? m : 0;
    return DLOCK_OK;
}
