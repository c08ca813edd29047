/* SPDX-License-Identifier: MIT */
/*
 * inspect.c -- dlock_inspect(), dlock_info_clear() and dlock_gc(): what
 * the core does around the store's inspect and gc slots.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

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
    rc = dlock__check_name(name, &len);
    if (rc)
        return rc;
    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
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
    rc = dlock__usable(c);
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
