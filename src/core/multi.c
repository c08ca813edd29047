/* SPDX-License-Identifier: MIT */
/*
 * multi.c -- several locks at once: dlock_acquire_all() and
 * dlock_release_all() (docs/design.md, "Several locks at once").
 *
 * A set is taken one lock after another in ascending byte order of the
 * names, each step an ordinary acquire (lock.c) within what is left of
 * the set's one wait; a failure releases what the call took. The set's
 * records in its handles' lists of acquires in progress let a cancel of
 * any handle end the set.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Names in byte order: memcmp over the shorter, then the shorter first. */
static int by_name(const void *a, const void *b)
{
    const dlock__entry *x = (*(dlock *const *)a)->entry;
    const dlock__entry *y = (*(dlock *const *)b)->entry;
    size_t n = x->len < y->len ? x->len : y->len;
    int r = memcmp(x->name, y->name, n);

    if (r)
        return r;
    return x->len < y->len ? -1 : x->len > y->len ? 1 : 0;
}

/* Checks a set given to fn and returns its handles in name order, in a
 * malloc'd array (*out); DLOCK_EINVAL or DLOCK_ENOMEM with a message. */
static int sorted_set(const char *fn, dlock *const *ls, size_t n,
                      dlock ***out)
{
    dlock **s;

    *out = NULL;
    if (!ls || n == 0)
        return dlock__err(DLOCK_EINVAL, "%s: no locks given", fn);
    if (n > DLOCK_ALL_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "%s: %zu locks, more than DLOCK_ALL_MAX (%d)", fn,
                          n, DLOCK_ALL_MAX);
    for (size_t i = 0; i < n; i++) {
        if (!ls[i])
            return dlock__err(DLOCK_EINVAL, "%s: lock %zu is NULL", fn, i);
        if (ls[i]->client != ls[0]->client)
            return dlock__err(DLOCK_EINVAL,
                              "%s: lock '%.200s' is of another client than "
                              "lock '%.200s' (a set is of one client)",
                              fn, ls[i]->entry->name, ls[0]->entry->name);
    }
    s = malloc(n * sizeof(*s));
    if (!s)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", fn);
    memcpy(s, ls, n * sizeof(*s));
    qsort(s, n, sizeof(*s), by_name);
    for (size_t i = 1; i < n; i++) {
        if (s[i]->entry == s[i - 1]->entry) {
            int rc = dlock__err(DLOCK_EINVAL,
                                "%s: lock '%.200s' is in the set twice",
                                fn, s[i]->entry->name);
            free(s);
            return rc;
        }
    }
    *out = s;
    return DLOCK_OK;
}

/* Releases s[0..k) in the reverse order, for a set that failed: the
 * error `rc` of the failure keeps its message, which says so. */
static int unwind(dlock **s, size_t k, size_t n, int rc)
{
    char msg[700];

    snprintf(msg, sizeof(msg), "%s", dlock_errmsg());
    while (k > 0)
        (void)dlock_release(s[--k]); /* a store error: its lease frees it */
    return dlock__err(rc, "%s (none of the set's %zu locks is held)", msg, n);
}

int dlock_acquire_all(dlock *const *ls, size_t n, int64_t wait_ms)
{
    dlock **s;
    dlock__cancel *recs;
    dlock__set set = {0, NULL};
    dlock_client *c;
    int64_t deadline;
    size_t k = 0;
    int rc;

    if (wait_ms < -1 || wait_ms > DLOCK_WAIT_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_acquire_all: wait_ms must be -1 (forever), "
                          "0 (one try each) or positive up to "
                          "DLOCK_WAIT_MAX, not %lld",
                          (long long)wait_ms);
    rc = sorted_set("dlock_acquire_all", ls, n, &s);
    if (rc)
        return rc;
    recs = calloc(n, sizeof(*recs));
    if (!recs) {
        free(s);
        return dlock__err(DLOCK_ENOMEM, "dlock_acquire_all: out of memory");
    }
    c = s[0]->client;
    deadline = wait_ms < 0 ? DLOCK__FOREVER : dlock__now_ms() + wait_ms;

    /* the set in each handle's list: a cancel of any ends it */
    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    for (size_t i = 0; !rc && i < n; i++)
        if (s[i]->shut)
            rc = dlock__shut_message(s[i]);
    if (!rc) {
        for (size_t i = 0; i < n; i++) {
            recs[i].fd = -1;
            recs[i].set = &set;
            recs[i].next = s[i]->cancels;
            s[i]->cancels = &recs[i];
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (rc) {
        free(recs);
        free(s);
        return rc;
    }

    for (k = 0; k < n; k++) {
        dlock *l = s[k];
        int64_t w = -1;

        if (__atomic_load_n(&set.flag, __ATOMIC_ACQUIRE)) {
            rc = dlock__err(DLOCK_ECANCELED,
                            "lock '%.200s': the set's wait was cancelled "
                            "(dlock_cancel() or dlock_shutdown() of one of "
                            "its handles) before this lock",
                            l->entry->name);
            break;
        }
        if (deadline != DLOCK__FOREVER) {
            w = deadline - dlock__now_ms();
            if (w < 0 || wait_ms == 0)
                w = 0; /* the deadline reached: one try */
        }
        rc = dlock__acquire(l, w,
                            l->opts.permits ? DLOCK__PERMIT : DLOCK__WRITE,
                            &set, NULL);
        if (rc)
            break;
    }
    if (!rc) {
        /* a hold lost while the set waited for a later one */
        for (size_t i = 0; i < n; i++) {
            if (dlock_held(s[i]) == DLOCK_ELOST) {
                rc = dlock__err(DLOCK_ELOST,
                                "lock '%.200s' was lost while the set "
                                "waited for its other locks",
                                s[i]->entry->name);
                break;
            }
        }
    }
    if (rc)
        rc = unwind(s, k, n, rc);

    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        for (dlock__cancel **pp = &s[i]->cancels; *pp; pp = &(*pp)->next) {
            if (*pp == &recs[i]) {
                *pp = recs[i].next;
                break;
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    free(recs);
    free(s);
    return rc;
}

int dlock_release_all(dlock *const *ls, size_t n)
{
    dlock **s;
    char first[700] = "";
    int rc, out = DLOCK_OK;

    rc = sorted_set("dlock_release_all", ls, n, &s);
    if (rc)
        return rc;
    for (size_t i = n; i-- > 0;) {
        rc = dlock_release(s[i]);
        /* a lost one outranks any other error; the first of each kind */
        if (rc != DLOCK_OK &&
            (out == DLOCK_OK || (rc == DLOCK_ELOST && out != DLOCK_ELOST))) {
            out = rc;
            snprintf(first, sizeof(first), "%s", dlock_errmsg());
        }
    }
    free(s);
    if (out == DLOCK_OK)
        return DLOCK_OK;
    return dlock__err(out, "%s (every lock of the set released)", first);
}
