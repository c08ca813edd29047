/* SPDX-License-Identifier: MIT */
/*
 * history.c -- the fenced resource and the history checker.
 */
#include "safety.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const char *sf_outcome_name(int o)
{
    switch (o) {
    case SF_HELD:
        return "held";
    case SF_LOST:
        return "lost-and-reported";
    case SF_FENCED:
        return "fenced";
    case SF_VIOLATED:
        return "VIOLATED";
    case SF_INCONCLUSIVE:
        return "INCONCLUSIVE";
    default:
        return "skipped";
    }
}

int64_t sf_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void sf_sleep_us(int64_t us)
{
    struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ------------------------------------------------------------------------ */
/* The resource                                                             */
/* ------------------------------------------------------------------------ */

void sf_mutex_init(pthread_mutex_t *mu)
{
    pthread_mutexattr_t a;

    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    /* a worker SIGKILLed inside would leave it locked for good */
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(mu, &a);
    pthread_mutexattr_destroy(&a);
}

void sf_mutex_lock(pthread_mutex_t *mu)
{
    if (pthread_mutex_lock(mu) == EOWNERDEAD)
        pthread_mutex_consistent(mu);
}

void sf_resource_init(sf_resource *r)
{
    memset(r, 0, sizeof(*r));
    sf_mutex_init(&r->mu);
}

static void res_lock(sf_resource *r, int64_t *t)
{
    sf_mutex_lock(&r->mu);
    if (t)
        *t = sf_now_ns();
}

int sf_resource_read(sf_resource *r, uint64_t token, int64_t *value,
                     uint64_t *seen, uint64_t *op, int64_t *t)
{
    int res = SF_W_NONE;

    res_lock(r, t);
    *op = ++r->ops;
    *seen = r->max_token;
    if (token < r->max_token) {
        r->read_rejected++;
        res = SF_W_READ_REJECTED;
    } else {
        r->max_token = token;
        *value = r->value;
    }
    pthread_mutex_unlock(&r->mu);
    return res;
}

int sf_resource_read_shared(sf_resource *r, uint64_t token, int64_t *value,
                            uint64_t *seen, uint64_t *op, int64_t *t)
{
    int res = SF_W_NONE;

    res_lock(r, t);
    *op = ++r->ops;
    *seen = r->max_token;
    if (token <= r->last_write_token && r->accepted > 0) {
        r->read_rejected++;
        res = SF_W_READ_REJECTED;
    } else {
        if (token > r->max_token)
            r->max_token = token;
        *value = r->value;
    }
    pthread_mutex_unlock(&r->mu);
    return res;
}

int sf_resource_write(sf_resource *r, uint64_t token, int64_t value,
                      uint64_t read_op, uint64_t *op, int64_t *t)
{
    int res;

    res_lock(r, t);
    *op = ++r->ops;
    if (token < r->max_token) {
        r->rejected++;
        res = SF_W_REJECTED;
    } else {
        /* what the checker wants to know, not what a storage service
         * would check: another write landed between our read and now */
        if (r->last_write_op > read_op)
            r->stale_accepted++;
        r->max_token = token;
        r->value = value;
        r->accepted++;
        r->last_write_op = *op;
        r->last_write_token = token;
        res = SF_W_ACCEPTED;
    }
    pthread_mutex_unlock(&r->mu);
    return res;
}

/* ------------------------------------------------------------------------ */
/* The checker                                                              */
/* ------------------------------------------------------------------------ */

static int by_acq_ret(const void *a, const void *b, void *base)
{
    const sf_hold *x = (const sf_hold *)base + *(const int *)a;
    const sf_hold *y = (const sf_hold *)base + *(const int *)b;
    return (x->t_acq_ret > y->t_acq_ret) - (x->t_acq_ret < y->t_acq_ret);
}

static int by_acq_call(const void *a, const void *b, void *base)
{
    const sf_hold *x = (const sf_hold *)base + *(const int *)a;
    const sf_hold *y = (const sf_hold *)base + *(const int *)b;
    return (x->t_acq_call > y->t_acq_call) - (x->t_acq_call < y->t_acq_call);
}

static void note(sf_report *rep, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void note(sf_report *rep, const char *fmt, ...)
{
    va_list ap;

    if (rep->detail[0])
        return;
    va_start(ap, fmt);
    vsnprintf(rep->detail, sizeof(rep->detail), fmt, ap);
    va_end(ap);
}

/* The holder was not assured its hold was intact: only DLOCK_OK from
 * dlock_release() vouches for a hold (DLOCK_ELOST says it was lost;
 * DLOCK_ECONN that the store could not be asked: not proven either). */
static int told(const sf_hold *h)
{
    return (h->done && !h->killed && h->rel_rc != DLOCK_OK) || h->lost_cb;
}

/* The end of a hold's interval: its release call, or the moment it was
 * SIGKILLed; a `dlock run` hold's, the last read or write of any process
 * of its tree (one may have outlived dlock run) */
static int64_t hold_end(const sf_hold *h)
{
    int64_t e = h->t_rel_call;

    for (int p = 0; h->run && p < 3; p++)
        if (h->t_proc[p] > e)
            e = h->t_proc[p];
    return e;
}

/* The process of a `dlock run` hold's tree whose read or write came last. */
static int last_proc(const sf_hold *h)
{
    int last = 0;

    for (int p = 1; p < 3; p++)
        if (h->t_proc[p] > h->t_proc[last])
            last = p;
    return last;
}

void sf_check(const sf_shared *s, sf_report *rep)
{
    uint32_t n = s->nholds > SF_MAX_HOLDS ? SF_MAX_HOLDS : s->nholds;
    int *ord = calloc(n + 1, sizeof(int)), *ord2 = calloc(n + 1, sizeof(int));
    int m = 0;

    memset(rep, 0, sizeof(*rep));
    if (!ord || !ord2) {
        free(ord);
        free(ord2);
        rep->outcome = SF_VIOLATED;
        note(rep, "out of memory in the checker");
        return;
    }
    for (uint32_t i = 0; i < n; i++) {
        const sf_hold *h = &s->holds[i];
        /* cannot happen: workers finish their hold; a dlock run hold's
         * runner may not have (killed at the end): its tree's record
         * counts all the same */
        if (!h->done && !h->killed && !h->run)
            continue;
        ord[m] = (int)i;
        ord2[m] = (int)i;
        m++;
        if (h->rel_rc == DLOCK_ELOST || h->lost_cb)
            rep->lost_reported++;
        if (h->done && !h->killed && h->rel_rc != DLOCK_OK &&
            h->rel_rc != DLOCK_ELOST)
            rep->release_errors++;
    }
    rep->holds = m;
    qsort_r(ord, (size_t)m, sizeof(int), by_acq_ret, (void *)s->holds);
    qsort_r(ord2, (size_t)m, sizeof(int), by_acq_call, (void *)s->holds);

    /* forged tokens, first (the plainest account of what happened): a
     * hold whose token the forger sent (no store issues one that high),
     * that is, a message's token reached dlock_token(). The other checks
     * show it too, less plainly: a forged grant overlaps the real
     * holder, the next real hold's token goes back, and the resource
     * refuses every real token after it */
    for (int j = 0; s->forged_floor && j < m; j++) {
        const sf_hold *b = &s->holds[ord2[j]];
        if (b->token < s->forged_floor)
            continue;
        rep->forged_tokens++;
        note(rep, "hold %llx (worker %d) got token %llu: a forged one, "
                  "which no store issues",
             (unsigned long long)b->acq_id, b->worker,
             (unsigned long long)b->token);
    }

    /* overlapping holds: [acquire returned, release called] of two workers
     * (a SIGKILLed holder's ends at the kill, a dlock run hold's at its
     * tree's last operation: hold_end()); one worker's holds follow each
     * other, but a runner's trees need not */
    for (int i = 0; i < m; i++) {
        const sf_hold *a = &s->holds[ord[i]];
        int64_t a_end = hold_end(a);
        for (int j = i + 1; j < m; j++) {
            const sf_hold *b = &s->holds[ord[j]];
            if (b->t_acq_ret >= a_end)
                break;
            if ((b->worker == a->worker && !a->run && !b->run) ||
                (a->shared && b->shared))
                continue;
            rep->overlaps++;
            if (s->no_overlap) {
                /* none may be, reported or not (cutoff-run: the old
                 * tree must be dead before the next holder starts) */
                const sf_hold *t = a->run ? a : b->run ? b : NULL;
                rep->overlaps_forbidden++;
                if (t) {
                    const sf_hold *o = t == a ? b : a;
                    int lp = last_proc(t);
                    note(rep, "dlock run hold %llx (token %llu, exit %d) "
                              "overlapped hold %llx (worker %d, token %llu) "
                              "by %.1f ms: its %s (pid %d) read or wrote "
                              "last (%d of its requests refused); no "
                              "overlap may be here",
                         (unsigned long long)t->acq_id,
                         (unsigned long long)t->token, t->run_rc,
                         (unsigned long long)o->acq_id, o->worker,
                         (unsigned long long)o->token,
                         (double)(a_end - b->t_acq_ret) / 1e6,
                         lp == 0   ? "command"
                         : lp == 1 ? "child"
                                   : "setsid grandchild",
                         t->proc_pid[lp], t->proc_refused[lp]);
                } else {
                    note(rep, "holds %llx (worker %d) and %llx (worker %d) "
                              "overlapped by %.1f ms: no overlap may be "
                              "here",
                         (unsigned long long)a->acq_id, a->worker,
                         (unsigned long long)b->acq_id, b->worker,
                         (double)(a_end - b->t_acq_ret) / 1e6);
                }
            }
            /* the earlier owner in the store lost the lock to the other:
             * the one with the lower token (the store issues them in its
             * own order), not always the one whose acquire returned
             * first (a slow answer can reach its caller after a later
             * owner's: seen in make safety-quick, SQLite × clock --mixed,
             * a reader's answer 25 ms late) */
            const sf_hold *x = a->token <= b->token ? a : b;
            const sf_hold *y = x == a ? b : a;
            if (told(x)) {
                rep->overlaps_reported++;
            } else {
                rep->overlaps_silent++;
                note(rep,
                     "holds %llx (worker %d, token %llu, release %s%s) and "
                     "%llx (worker %d, token %llu) overlapped by %.1f ms; "
                     "the first holder was never told",
                     (unsigned long long)x->acq_id, x->worker,
                     (unsigned long long)x->token,
                     x->killed ? "none: killed" : dlock_errname(x->rel_rc),
                     x->lost_cb ? ", lost callback" : "",
                     (unsigned long long)y->acq_id, y->worker,
                     (unsigned long long)y->token,
                     (double)(a_end - b->t_acq_ret) / 1e6);
            }
        }
    }

    /* tokens: a write's above that of every hold whose acquire returned
     * before this acquire was called; a read's above every such write's
     * (readers may share a token) */
    {
        uint64_t maxall = 0, maxw = 0;
        const sf_hold *maxallh = NULL, *maxwh = NULL;
        int k = 0;
        for (int j = 0; j < m; j++) {
            const sf_hold *b = &s->holds[ord2[j]];
            while (k < m && s->holds[ord[k]].t_acq_ret < b->t_acq_call) {
                const sf_hold *a = &s->holds[ord[k]];
                if (a->token >= maxall) {
                    maxall = a->token;
                    maxallh = a;
                }
                if (!a->shared && a->token >= maxw) {
                    maxw = a->token;
                    maxwh = a;
                }
                k++;
            }
            uint64_t maxtok = b->shared ? maxw : maxall;
            const sf_hold *maxh = b->shared ? maxwh : maxallh;
            /* a hold lost before dlock_token() was asked has token 0
             * (the API's answer for a lost hold): reported, not a
             * regression */
            if (b->token == 0 && told(b))
                continue;
            if (maxh && b->token <= maxtok) {
                rep->token_backwards++;
                note(rep,
                     "hold %llx (worker %d) got token %llu, not above token "
                     "%llu of hold %llx (worker %d) acquired before",
                     (unsigned long long)b->acq_id, b->worker,
                     (unsigned long long)b->token, (unsigned long long)maxtok,
                     (unsigned long long)maxh->acq_id, maxh->worker);
            }
        }
    }

    rep->stale_rejected = (int)(s->res.rejected + s->res.read_rejected);
    rep->stale_accepted = (int)s->res.stale_accepted;
    rep->lost_updates = (int)(s->res.accepted - s->res.value);
    if (rep->lost_updates < 0)
        rep->lost_updates = -rep->lost_updates;
    if (rep->stale_accepted)
        note(rep, "%d writes accepted on a stale read", rep->stale_accepted);
    if (rep->lost_updates)
        note(rep, "final value %lld after %lld accepted increments",
             (long long)s->res.value, (long long)s->res.accepted);

    if (rep->stale_accepted || rep->lost_updates || rep->overlaps_silent ||
        rep->token_backwards || rep->forged_tokens ||
        rep->overlaps_forbidden)
        rep->outcome = SF_VIOLATED;
    else if (rep->stale_rejected)
        rep->outcome = SF_FENCED;
    else if (rep->lost_reported || rep->overlaps_reported)
        rep->outcome = SF_LOST;
    else
        rep->outcome = SF_HELD;
    free(ord);
    free(ord2);
}
