/* SPDX-License-Identifier: MIT */
/*
 * mem.c -- the in-process store, mem://[SPACE] (docs/design.md, "The
 * in-process store"): locks in the memory of the process, with every
 * other store's semantics within it, for tests and for threads of one
 * process.
 *
 * A space is a list of locks under one mutex and one condition variable
 * (CLOCK_MONOTONIC). Clients of the same URI in the process share the
 * space; it is freed with its last client. The registry of spaces is
 * keyed by process as well as name, so a forked child never uses its copy
 * of its parent's.
 *
 * A lock has its holds (owner, description, token, lease end) and its
 * queue of waiters in arrival order. A try takes it when the holds that
 * are left (those whose lease has not ended) let it in: none for a
 * writer; no writer's, and no writer waiting ahead (or, for a try that
 * is not queued, no writer waiting at all) for a reader; fewer than N for
 * a permit of N. With DLOCK_FAIR the queue's order decides: only the
 * head (or readers behind readers at the head) may take it. A waiter
 * sleeps on the space's condition variable, which every release, break,
 * proclaim and take broadcasts, until then, the earliest lease end among
 * the holds that keep it out, its deadline, or a cancel.
 */
#include "store.h"

#include "hex.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define SPACE_MAX 255 /* a space name's bytes */
#define DESC_MAX 160

typedef struct mem_hold {
    struct mem_hold *next;
    char *owner;
    char desc[DESC_MAX];
    uint64_t token;
    int64_t lease_end; /* monotonic ms */
    int64_t since;     /* monotonic ms */
    unsigned kind;
} mem_hold;

typedef struct mem_wait {
    struct mem_wait *next;
    unsigned kind;
    char desc[DESC_MAX + 8];
} mem_wait;

typedef struct mem_lock {
    struct mem_lock *next;
    char *name;
    size_t len;
    mem_hold *holds;
    unsigned kind;     /* of the holds, while there are any */
    unsigned permits;  /* a semaphore's N while held; else 0 */
    mem_wait *queue;   /* in arrival order */
    uint64_t last_token;
    int64_t used_at;   /* monotonic ms of its last change */
} mem_lock;

typedef struct mem_obs {
    struct mem_obs *next;
    char *name;
    size_t len;
    int efd;
} mem_obs;

typedef struct mem_space {
    struct mem_space *next;
    char *name;
    pid_t pid;
    int refs; /* (the registry's mutex) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t token;
    mem_lock *locks;
    mem_obs *obs;
} mem_space;

typedef struct mem_store {
    mem_space *sp;
    char where[SPACE_MAX + 16]; /* "mem://SPACE" */
} mem_store;

typedef struct mem_lease {
    mem_wait *w; /* its entry in the queue while it waits */
} mem_lease;

/* The registry: the store's own data (docs/design.md, "The in-process
 * store"), the one mutable state outside a client. */
static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static mem_space *registry;

/* ------------------------------------------------------------------------ */
/* Spaces                                                                   */
/* ------------------------------------------------------------------------ */

static void lock_free(mem_lock *lk)
{
    while (lk->holds) {
        mem_hold *h = lk->holds;
        lk->holds = h->next;
        free(h->owner);
        free(h);
    }
    while (lk->queue) {
        mem_wait *w = lk->queue;
        lk->queue = w->next;
        free(w);
    }
    free(lk->name);
    free(lk);
}

static mem_space *space_get(const char *name)
{
    pid_t pid = getpid();
    mem_space *sp;

    pthread_mutex_lock(&registry_mu);
    for (sp = registry; sp; sp = sp->next)
        if (sp->pid == pid && !strcmp(sp->name, name))
            break;
    if (!sp && (sp = calloc(1, sizeof(*sp))) != NULL) {
        if (!(sp->name = strdup(name)) || dlock__cond_init(&sp->cv) != 0) {
            free(sp->name);
            free(sp);
            sp = NULL;
        } else {
            pthread_mutex_init(&sp->mu, NULL);
            sp->pid = pid;
            sp->next = registry;
            registry = sp;
        }
    }
    if (sp)
        sp->refs++;
    pthread_mutex_unlock(&registry_mu);
    return sp;
}

static void space_put(mem_space *sp)
{
    pthread_mutex_lock(&registry_mu);
    if (--sp->refs > 0) {
        pthread_mutex_unlock(&registry_mu);
        return;
    }
    for (mem_space **pp = &registry; *pp; pp = &(*pp)->next)
        if (*pp == sp) {
            *pp = sp->next;
            break;
        }
    pthread_mutex_unlock(&registry_mu);
    while (sp->locks) {
        mem_lock *lk = sp->locks;
        sp->locks = lk->next;
        lock_free(lk);
    }
    pthread_mutex_destroy(&sp->mu);
    pthread_cond_destroy(&sp->cv);
    free(sp->name);
    free(sp);
}

/* The lock `name` of the space (created when `make`), or NULL. sp->mu. */
static mem_lock *lock_find(mem_space *sp, const char *name, size_t len,
                           int make)
{
    mem_lock *lk;

    for (lk = sp->locks; lk; lk = lk->next)
        if (lk->len == len && !memcmp(lk->name, name, len))
            return lk;
    if (!make || !(lk = calloc(1, sizeof(*lk))))
        return NULL;
    if (!(lk->name = malloc(len + 1))) {
        free(lk);
        return NULL;
    }
    memcpy(lk->name, name, len);
    lk->name[len] = '\0';
    lk->len = len;
    lk->next = sp->locks;
    sp->locks = lk;
    return lk;
}

/* A change of lock lk: waiters look again, observers are told. sp->mu. */
static void changed(mem_space *sp, mem_lock *lk, int64_t now)
{
    uint64_t one = 1;

    lk->used_at = now;
    pthread_cond_broadcast(&sp->cv);
    for (mem_obs *o = sp->obs; o; o = o->next)
        if (o->len == lk->len && !memcmp(o->name, lk->name, lk->len))
            (void)!write(o->efd, &one, sizeof(one));
}

/* Drops the holds whose lease has ended. sp->mu. */
static void prune(mem_lock *lk, int64_t now)
{
    for (mem_hold **pp = &lk->holds; *pp;) {
        mem_hold *h = *pp;
        if (h->lease_end <= now) {
            *pp = h->next;
            free(h->owner);
            free(h);
        } else {
            pp = &h->next;
        }
    }
    if (!lk->holds)
        lk->permits = 0;
}

static mem_hold *hold_of(mem_lock *lk, const char *owner)
{
    for (mem_hold *h = lk->holds; h; h = h->next)
        if (!strcmp(h->owner, owner))
            return h;
    return NULL;
}

static int nholds(const mem_lock *lk)
{
    int n = 0;

    for (const mem_hold *h = lk->holds; h; h = h->next)
        n++;
    return n;
}

/* The earliest lease end among lk's holds (FOREVER: none). */
static int64_t first_end(const mem_lock *lk)
{
    int64_t end = DLOCK__FOREVER;

    for (const mem_hold *h = lk->holds; h; h = h->next)
        if (h->lease_end < end)
            end = h->lease_end;
    return end;
}

/* Whether lease l may take lk now: DLOCK_OK, DLOCK_EBUSY, or DLOCK_EINVAL
 * (another kind or N than the holds'). me: l's queue entry, or NULL for
 * a try that is not queued. sp->mu. */
static int may_take(const mem_store *ms, const mem_lock *lk,
                    const dlock__lease *l, const mem_wait *me)
{
    unsigned want_n = l->kind == DLOCK__PERMIT ? l->permits : 0;

    if (lk->holds && lk->permits != want_n)
        return dlock__err(DLOCK_EINVAL,
                          "%s: lock '%.200s' is %s%u%s, not %s%u%s",
                          ms->where, lk->name,
                          lk->permits ? "a semaphore of " : "a lock",
                          lk->permits, lk->permits ? " permits" : "",
                          want_n ? "a semaphore of " : "a lock", want_n,
                          want_n ? " permits" : "");
    if (lk->holds && (lk->permits ? 0 : 1) &&
        (l->kind == DLOCK__WRITE || lk->kind == DLOCK__WRITE))
        return DLOCK_EBUSY;
    if (l->kind == DLOCK__PERMIT && nholds(lk) >= (int)l->permits)
        return DLOCK_EBUSY;
    if (lk->holds && l->kind == DLOCK__READ && lk->kind != DLOCK__READ)
        return DLOCK_EBUSY;
    /* the queue: ahead of me (everyone, for a try not queued) */
    for (const mem_wait *w = lk->queue; w && w != me; w = w->next) {
        if (l->flags & DLOCK_FAIR) {
            /* first come, first served: readers behind readers only */
            if (!(l->kind == DLOCK__READ && w->kind == DLOCK__READ))
                return DLOCK_EBUSY;
        } else if (l->kind == DLOCK__READ && w->kind == DLOCK__WRITE) {
            return DLOCK_EBUSY; /* a waiting writer goes first */
        }
    }
    return DLOCK_OK;
}

static void dequeue(mem_lock *lk, mem_lease *ml)
{
    if (!ml->w)
        return;
    for (mem_wait **pp = &lk->queue; *pp; pp = &(*pp)->next)
        if (*pp == ml->w) {
            *pp = ml->w->next;
            break;
        }
    free(ml->w);
    ml->w = NULL;
}

static int enqueue(mem_lock *lk, const dlock__lease *l, mem_lease *ml)
{
    mem_wait **pp = &lk->queue;

    if (ml->w)
        return DLOCK_OK;
    if (!(ml->w = calloc(1, sizeof(*ml->w))))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    ml->w->kind = l->kind;
    snprintf(ml->w->desc, sizeof(ml->w->desc), "%s%s",
             l->kind == DLOCK__READ     ? "read: "
             : l->kind == DLOCK__PERMIT ? "permit: "
                                        : "",
             l->desc);
    while (*pp)
        pp = &(*pp)->next;
    *pp = ml->w;
    return DLOCK_OK;
}

static int take(mem_space *sp, mem_lock *lk, dlock__lease *l, int64_t now)
{
    mem_hold *h = calloc(1, sizeof(*h));

    if (!h || !(h->owner = strdup(l->owner))) {
        free(h);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    snprintf(h->desc, sizeof(h->desc), "%s", l->desc);
    h->token = ++sp->token;
    h->lease_end = now + l->ttl_ms;
    h->since = now;
    h->kind = l->kind;
    h->next = lk->holds;
    lk->holds = h;
    lk->kind = l->kind;
    lk->permits = l->kind == DLOCK__PERMIT ? l->permits : 0;
    lk->last_token = h->token;
    l->token = h->token;
    changed(sp, lk, now);
    return DLOCK_OK;
}

/* ------------------------------------------------------------------------ */
/* The slots                                                                */
/* ------------------------------------------------------------------------ */

static int mem_open(void **out, dlock_client *c, const dlock__uri *u,
                    int64_t timeout_ms)
{
    static const char *const params[] = {"timeout", NULL};
    const char *space = u->nhosts ? u->hosts[0].host : "";
    mem_store *ms;
    int rc;

    (void)c;
    (void)timeout_ms;
    *out = NULL;
    if ((rc = dlock__uri_check_params(u, params)) != DLOCK_OK)
        return rc;
    if (u->user || u->password || u->nhosts > 1 ||
        (u->nhosts && u->hosts[0].port) || (u->path[0] && strcmp(u->path, "/")))
        return dlock__err(DLOCK_EINVAL,
                          "mem:// takes a space's name and nothing else: "
                          "mem:// or mem://NAME");
    if (strlen(space) > SPACE_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "mem://: a space's name is at most %d bytes",
                          SPACE_MAX);
    if (!(ms = calloc(1, sizeof(*ms))) || !(ms->sp = space_get(space))) {
        free(ms);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    snprintf(ms->where, sizeof(ms->where), "mem://%s", space);
    *out = ms;
    return DLOCK_OK;
}

static void mem_close(void *st)
{
    mem_store *ms = st;

    space_put(ms->sp);
    free(ms);
}

static int mem_acquire(void *st, dlock__lease *l, int64_t op_deadline)
{
    mem_store *ms = st;
    mem_space *sp = ms->sp;
    mem_lease *ml = l->priv;
    mem_lock *lk;
    int rc, waited = 0;

    (void)op_deadline;
    pthread_mutex_lock(&sp->mu);
    if (!(lk = lock_find(sp, l->name, l->name_len, 1))) {
        pthread_mutex_unlock(&sp->mu);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    for (;;) {
        int64_t now = dlock__now_ms();
        prune(lk, now);
        mem_hold *mine = hold_of(lk, l->owner);
        if (mine) { /* ours already (a second try of one acquire) */
            mine->lease_end = now + l->ttl_ms;
            l->token = mine->token;
            rc = DLOCK_OK;
            break;
        }
        rc = may_take(ms, lk, l, ml->w);
        if (rc == DLOCK_OK) {
            rc = take(sp, lk, l, now);
            if (rc == DLOCK_OK && waited) {
                /* its lease starts now, not at the call (the metrics'
                 * wait ends now too) */
                l->woken_us = dlock__now_us();
                l->started = now;
            }
            break;
        }
        if (rc != DLOCK_EBUSY)
            break;
        int64_t end = first_end(lk);
        if (l->deadline <= now || dlock__lease_cancelled(l)) {
            l->retry_ms = end == DLOCK__FOREVER ? -1 : end - now;
            break;
        }
        if ((rc = enqueue(lk, l, ml)) != DLOCK_OK)
            break;
        /* woken by a change of the space, or at the first lease end
         * among the holds that keep it out, or at its deadline */
        dlock__cond_wait_until(&sp->cv, &sp->mu,
                               end < l->deadline ? end : l->deadline);
        waited = 1;
    }
    dequeue(lk, ml);
    pthread_mutex_unlock(&sp->mu);
    return rc;
}

/* Removes l's hold: DLOCK_OK, or DLOCK_ENOTHELD when it was gone (its
 * lease ended, or a break). */
static int mem_release(void *st, dlock__lease *l, int64_t op_deadline)
{
    mem_store *ms = st;
    mem_space *sp = ms->sp;
    int rc = DLOCK_ENOTHELD;

    (void)op_deadline;
    pthread_mutex_lock(&sp->mu);
    mem_lock *lk = lock_find(sp, l->name, l->name_len, 0);
    int64_t now = dlock__now_ms();
    if (lk) {
        prune(lk, now);
        for (mem_hold **pp = &lk->holds; *pp; pp = &(*pp)->next)
            if (!strcmp((*pp)->owner, l->owner) && (*pp)->token == l->token) {
                mem_hold *h = *pp;
                *pp = h->next;
                free(h->owner);
                free(h);
                if (!lk->holds)
                    lk->permits = 0;
                rc = DLOCK_OK;
                break;
            }
        changed(sp, lk, now);
    }
    pthread_mutex_unlock(&sp->mu);
    return rc == DLOCK_OK ? rc
                          : dlock__err(DLOCK_ENOTHELD,
                                       "%s: lock '%.200s' is not ours any "
                                       "more (its lease ended, or a break)",
                                       ms->where, l->name);
}

/* l's own hold while its lease runs, or NULL. sp->mu. */
static mem_hold *live_hold(mem_space *sp, const dlock__lease *l,
                           mem_lock **lkp, int64_t now)
{
    mem_lock *lk = lock_find(sp, l->name, l->name_len, 0);
    mem_hold *h = lk ? hold_of(lk, l->owner) : NULL;

    if (lkp)
        *lkp = lk;
    return h && h->token == l->token && h->lease_end > now ? h : NULL;
}

static int mem_extend(void *st, dlock__lease *l, int64_t ttl_ms,
                      int64_t op_deadline)
{
    mem_store *ms = st;
    int64_t now = dlock__now_ms();

    (void)op_deadline;
    pthread_mutex_lock(&ms->sp->mu);
    mem_hold *h = live_hold(ms->sp, l, NULL, now);
    if (h)
        h->lease_end = now + ttl_ms;
    pthread_mutex_unlock(&ms->sp->mu);
    return h ? DLOCK_OK
             : dlock__err(DLOCK_ENOTHELD,
                          "%s: lock '%.200s' is not ours any more",
                          ms->where, l->name);
}

/* lk as dlock_inspect() describes it (lk may be NULL). sp->mu. */
static int describe(const mem_lock *lk, dlock_info *out, int64_t now)
{
    out->ttl_ms = -1;
    out->held_ms = -1;
    if (!lk)
        return DLOCK_OK;
    out->token = lk->last_token;
    out->holders = nholds(lk);
    out->held = out->holders > 0;
    out->permits = lk->permits;
    out->shared = out->held && lk->kind == DLOCK__READ;
    int64_t waiters = 0;
    for (const mem_wait *w = lk->queue; w; w = w->next)
        waiters++;
    out->waiters = waiters;
    if (out->held) {
        const mem_hold *first = lk->holds;
        for (const mem_hold *h = lk->holds; h; h = h->next)
            if (h->since < first->since)
                first = h;
        out->ttl_ms = first_end(lk) - now;
        out->held_ms = now - first->since;
        if (lk->permits)
            snprintf(out->holder, sizeof(out->holder),
                     "%lld of %u permits", (long long)out->holders,
                     lk->permits);
        else if (out->shared)
            snprintf(out->holder, sizeof(out->holder), "%lld reader%s",
                     (long long)out->holders, out->holders == 1 ? "" : "s");
        else
            snprintf(out->holder, sizeof(out->holder), "%s", first->desc);
    }
    for (const mem_wait *w = lk->queue; w; w = w->next) {
        int rc = dlock__info_add_waiter(out, w->desc);
        if (rc)
            return rc;
    }
    return DLOCK_OK;
}

static int mem_inspect(void *st, const char *name, size_t len,
                       dlock_info *out, int64_t op_deadline)
{
    mem_store *ms = st;
    int64_t now = dlock__now_ms();

    (void)op_deadline;
    pthread_mutex_lock(&ms->sp->mu);
    mem_lock *lk = lock_find(ms->sp, name, len, 0);
    if (lk)
        prune(lk, now);
    int rc = describe(lk, out, now);
    pthread_mutex_unlock(&ms->sp->mu);
    return rc;
}

static int cmp_names(const mem_lock *a, const mem_lock *b)
{
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->name, b->name, n);

    return c ? c : (a->len > b->len) - (a->len < b->len);
}

static int mem_list(void *st, const char *prefix, size_t plen,
                    const char *cursor, size_t limit, unsigned flags,
                    dlock_list_page *out, int64_t op_deadline)
{
    mem_store *ms = st;
    size_t cl = cursor ? strlen(cursor) : 0;
    char *after = NULL;
    size_t alen = 0;
    int rc = DLOCK_OK;

    (void)op_deadline;
    if (cl) { /* the hex of the last name of the page before */
        if (cl % 2 || cl / 2 > DLOCK_NAME_MAX || !(after = malloc(cl / 2)) ||
            dlock__unhex(cursor, cl / 2, after) != 0) {
            free(after);
            return dlock__err(DLOCK_EINVAL, "%s: not a cursor of this "
                                            "store's",
                              ms->where);
        }
        alen = cl / 2;
    }
    pthread_mutex_lock(&ms->sp->mu);
    int64_t now = dlock__now_ms();
    mem_lock key = {.name = after, .len = alen};
    for (size_t got = 0; got < limit;) {
        /* the least name after the cursor that is listed */
        mem_lock *best = NULL;
        for (mem_lock *lk = ms->sp->locks; lk; lk = lk->next) {
            prune(lk, now);
            if (lk->len < plen || memcmp(lk->name, prefix, plen) ||
                (cl && cmp_names(lk, &key) <= 0) ||
                (!(flags & DLOCK_LIST_FREE) && !lk->holds && !lk->queue))
                continue;
            if (!best || cmp_names(lk, best) < 0)
                best = lk;
        }
        if (!best)
            break;
        dlock_info in;
        memset(&in, 0, sizeof(in));
        rc = describe(best, &in, now);
        if (!rc)
            rc = dlock__list_add(out, best->name, best->len, &in);
        dlock_info_clear(&in);
        if (rc)
            break;
        key.name = best->name;
        key.len = best->len;
        cl = 1;
        if (++got == limit) {
            /* more after it? the cursor of the next page */
            out->next = malloc(2 * best->len + 1);
            if (!out->next) {
                rc = dlock__err(DLOCK_ENOMEM, "out of memory");
                break;
            }
            dlock__hex(best->name, best->len, out->next);
        }
    }
    pthread_mutex_unlock(&ms->sp->mu);
    free(after);
    return rc;
}

static int mem_evict(void *st, const char *name, size_t len, dlock_info *out,
                     int64_t op_deadline)
{
    mem_store *ms = st;
    int64_t now = dlock__now_ms();
    int rc;

    (void)op_deadline;
    pthread_mutex_lock(&ms->sp->mu);
    mem_lock *lk = lock_find(ms->sp, name, len, 0);
    if (lk)
        prune(lk, now);
    rc = describe(lk, out, now);
    if (!rc && (!lk || !lk->holds))
        rc = dlock__err(DLOCK_ENOTHELD, "%s: lock '%.200s' is not held",
                        ms->where, name);
    if (!rc) {
        while (lk->holds) {
            mem_hold *h = lk->holds;
            lk->holds = h->next;
            free(h->owner);
            free(h);
        }
        lk->permits = 0;
        changed(ms->sp, lk, now);
    }
    pthread_mutex_unlock(&ms->sp->mu);
    return rc;
}

static int mem_gc(void *st, int64_t idle_ms, uint64_t *removed,
                  int64_t op_deadline)
{
    mem_store *ms = st;
    int64_t now = dlock__now_ms();

    (void)op_deadline;
    *removed = 0;
    pthread_mutex_lock(&ms->sp->mu);
    for (mem_lock **pp = &ms->sp->locks; *pp;) {
        mem_lock *lk = *pp;
        prune(lk, now);
        if (!lk->holds && !lk->queue && now - lk->used_at >= idle_ms) {
            *pp = lk->next;
            lock_free(lk);
            (*removed)++;
        } else {
            pp = &lk->next;
        }
    }
    pthread_mutex_unlock(&ms->sp->mu);
    return DLOCK_OK;
}

/* dlock_cancel(): the waits sleep on the space's condition variable. */
static void mem_cancel(void *st)
{
    mem_store *ms = st;

    pthread_mutex_lock(&ms->sp->mu);
    pthread_cond_broadcast(&ms->sp->cv);
    pthread_mutex_unlock(&ms->sp->mu);
}

static int mem_proclaim(void *st, dlock__lease *l, const char *desc,
                        int64_t op_deadline)
{
    mem_store *ms = st;
    mem_lock *lk = NULL;
    int64_t now = dlock__now_ms();

    (void)op_deadline;
    pthread_mutex_lock(&ms->sp->mu);
    mem_hold *h = live_hold(ms->sp, l, &lk, now);
    if (h && h->kind == DLOCK__WRITE) {
        snprintf(h->desc, sizeof(h->desc), "%s", desc);
        changed(ms->sp, lk, now);
    }
    pthread_mutex_unlock(&ms->sp->mu);
    return h && h->kind == DLOCK__WRITE
               ? DLOCK_OK
               : dlock__err(DLOCK_ENOTHELD,
                            "%s: lock '%.200s' is not ours any more",
                            ms->where, l->name);
}

static int mem_watch_open(void *st, const char *name, size_t len, void **w,
                          int64_t op_deadline)
{
    mem_store *ms = st;
    mem_obs *o = calloc(1, sizeof(*o));

    (void)op_deadline;
    *w = NULL;
    if (!o || !(o->name = malloc(len + 1))) {
        free(o);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    memcpy(o->name, name, len);
    o->name[len] = '\0';
    o->len = len;
    o->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (o->efd < 0) {
        free(o->name);
        free(o);
        return dlock__err(DLOCK_ENOMEM, "eventfd: %s", strerror(errno));
    }
    pthread_mutex_lock(&ms->sp->mu);
    o->next = ms->sp->obs;
    ms->sp->obs = o;
    pthread_mutex_unlock(&ms->sp->mu);
    *w = o;
    return DLOCK_OK;
}

static int mem_watch_wait(void *st, void *w, int64_t deadline, int cancel_fd)
{
    mem_obs *o = w;

    (void)st;
    for (;;) {
        uint64_t v;
        if (read(o->efd, &v, sizeof(v)) == (ssize_t)sizeof(v))
            return DLOCK_OK;
        int64_t left = deadline - dlock__now_ms();
        if (left <= 0)
            return DLOCK_EBUSY;
        struct pollfd p[2] = {{o->efd, POLLIN, 0}, {cancel_fd, POLLIN, 0}};
        int n = poll(p, cancel_fd >= 0 ? 2 : 1,
                     left > INT_MAX ? INT_MAX : (int)left);
        if (n > 0 && cancel_fd >= 0 && (p[1].revents & POLLIN))
            return DLOCK_EBUSY;
    }
}

static void mem_watch_close(void *st, void *w)
{
    mem_store *ms = st;
    mem_obs *o = w;

    if (!o)
        return;
    pthread_mutex_lock(&ms->sp->mu);
    for (mem_obs **pp = &ms->sp->obs; *pp; pp = &(*pp)->next)
        if (*pp == o) {
            *pp = o->next;
            break;
        }
    pthread_mutex_unlock(&ms->sp->mu);
    close(o->efd);
    free(o->name);
    free(o);
}

const dlock__backend dlock__backend_mem = {
    DLOCK__STORE_HEAD,
    .name = "mem",
    .caps = DLOCK__CAP_LEASE | DLOCK__CAP_NATIVE_WAIT | DLOCK__CAP_SHARED |
            DLOCK__CAP_PERMITS,
    .lease_size = sizeof(mem_lease),
    .open = mem_open,
    .close = mem_close,
    .acquire = mem_acquire,
    .release = mem_release,
    .extend = mem_extend,
    .inspect = mem_inspect,
    .gc = mem_gc,
    .list = mem_list,
    .evict = mem_evict,
    .cancel = mem_cancel,
    .proclaim = mem_proclaim,
    .watch_open = mem_watch_open,
    .watch_wait = mem_watch_wait,
    .watch_close = mem_watch_close,
};
