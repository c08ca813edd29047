/* SPDX-License-Identifier: MIT */
/*
 * watchdog.c -- a client's background thread: the watchdog that renews
 * every hold at ttl/3 (sooner with an at-risk margin), declares a hold
 * lost at its local lease end, tells the caller when a hold is at risk
 * and when it is safe again, and delivers those events and the lost-lock
 * callbacks without the client mutex; between its passes it reads the
 * store's notifications (the backend's loop_fd) while no waiting thread
 * does. docs/design.md, "Leases, the watchdog, and loss" and "Stopping the
 * work before the lease ends".
 *
 * Each client runs one background thread, from the first call that needs
 * it on (dlock__thread_start(), client.c; docs/design.md "Threads"): a
 * client only opened has none. It sleeps in poll() on an eventfd
 * (and on one fd of the backend's, e.g. Redis' subscriber connection) until
 * the earliest moment a hold needs it (its renewal, its at-risk moment,
 * its local lease end, a long hold) or a wake-up. Then it
 *   1. declares lost every hold whose local lease has run out, and notes
 *      the holds now at risk (or safe again) and the long holds;
 *   2. delivers those events and lost-lock callbacks first, without the
 *      client mutex, so that a renewal the store does not answer cannot
 *      delay them;
 *   3. renews every hold that is due (in one batch where the store can),
 *      each store call cut at the next moment some hold needs attention
 *      (dlock__loop_deadline): a renewal cut short counts as failed and is
 *      tried again soon;
 *   4. lets the backend handle its fd (wake-up notifications).
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
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* Whether hold h's at-most end comes within one lease from `now`: what
 * ends it then is that end, not a failed renewal. */
static int at_most_near(const dlock__hold *h, int64_t now)
{
    return h->most_end && h->most_end - now <= h->lease.ttl_ms;
}

int64_t dlock__ask_ttl(const dlock__hold *h, int64_t ttl, int64_t now)
{
    if (h->least_end && h->least_end - now > ttl)
        ttl = h->least_end - now;
    if (h->most_end && h->most_end - now < ttl)
        ttl = h->most_end - now;
    return ttl;
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
            dlock__wake(c);
        return;
    }
    h->lease_end = t0 + ttl - dlock__client_margin(c, ttl);
    h->renew_at = t0 + renew_in(c, ttl);
    h->retrying = 0;
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
        dlock__wake(c);
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
    ln->shared = dlock__event_shared(h->lease.kind);
    ln->held_ms = (dlock__now_us() - h->acquired_us) / 1000;
    ln->left_ms = left_ms;
    if (type == DLOCK_EVENT_LOST) {
        snprintf(ln->why, sizeof(ln->why), "%s", h->why);
    } else if (type == DLOCK_EVENT_AT_RISK) {
        const char *why = h->risk_why;
        if (!why[0] && at_most_near(h, dlock__now_ms()))
            why = "its at-most time (at_most_ms) ends: no renewal goes "
                  "past it";
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
    int64_t ttl = h->asked_ttl; /* what the store was asked for */

    h->renewing = 0;
    if (dlock__m_on(&c->m) && rc != DLOCK_ENOTHELD)
        dlock__m_inc(h->entry->ms, rc == DLOCK_OK ? DLOCK__M_RENEWED
                                                  : DLOCK__M_RENEW_FAILED);
    h->retrying = rc != DLOCK_OK && rc != DLOCK_ENOTHELD;
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
        int64_t again = dlock__now_ms() +
                        (ttl / 10 > 1000 ? 1000 : ttl / 10 > 0 ? ttl / 10 : 1);
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
        ttls[i] = due[i]->asked_ttl;
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
            mark_lost(c, h,
                      at_most_near(h, now)
                          ? "its at-most time (at_most_ms) is over: the "
                            "lease was not renewed past it"
                          : "the lease ran out before it could be renewed",
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
        if (h->lost || h->renewing || h->leaving || h->count == 0 ||
            (h->handle->opts.flags & DLOCK_NO_RENEW))
            continue;
        if (now >= h->lease_end) { /* ran out during the callbacks */
            next = now;
            continue;
        }
        /* Renew a little early when a wake-up is happening anyway, so
         * that many holds share wake-ups; a retry after a failed renewal
         * waits for its time (else failures that take the store's whole
         * answer time follow each other back to back) */
        if (h->renew_at > now + (h->retrying ? 0 : h->lease.ttl_ms / 10))
            continue;
        /* the lease to ask for; none past the at-most end */
        h->asked_ttl = dlock__ask_ttl(h, h->lease.ttl_ms, now);
        if (h->asked_ttl <= 0) {
            h->renew_at = DLOCK__FOREVER; /* its local lease end comes */
            continue;
        }
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
            int64_t ttl = h->asked_ttl;
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

void *dlock__background(void *arg)
{
    dlock_client *c = arg;

    pthread_mutex_lock(&c->mu);
    __atomic_store_n(&c->thread_running, 1, __ATOMIC_RELEASE);
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
        dlock__rings_run(c); /* elections' observers told (elect.c) */
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    dlock__rings_run(c); /* those queued as the client closed */
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Holds the store says are gone, or must be checked again                  */
/* ------------------------------------------------------------------------ */

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
    if (any) /* holds: made by acquires, which started the thread */
        dlock__wake(c);
}

void dlock__renew_now(dlock_client *c)
{
    pthread_mutex_lock(&c->mu);
    for (dlock__hold *h = c->holds; h; h = h->next)
        if (!h->lost && h->count > 0)
            h->renew_at = 0;
    pthread_mutex_unlock(&c->mu);
    dlock__wake(c); /* no hold, no thread: nothing to renew */
}
