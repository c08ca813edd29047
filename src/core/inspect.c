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

/* Whether client c may still be used (dlock__usable(), under its mutex):
 * DLOCK_OK, or why not. */
static int usable(dlock_client *c)
{
    int rc;

    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    pthread_mutex_unlock(&c->mu);
    return rc;
}

/* The checks of an operator's call (function `fn`) on lock `name`: a
 * client, a valid name (its length into *len), still usable. */
static int name_call(dlock_client *c, const char *fn, const char *name,
                     size_t *len)
{
    int rc;

    if (!c)
        return dlock__err(DLOCK_EINVAL, "%s: client is NULL", fn);
    rc = dlock__check_name(name, len);
    return rc ? rc : usable(c);
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
    rc = name_call(c, "dlock_inspect", name, &len);
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
    if (idle_ms > DLOCK_WAIT_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_gc: idle_ms must be at most %lld "
                          "(DLOCK_WAIT_MAX, 365 days), not %lld",
                          DLOCK_WAIT_MAX, (long long)idle_ms);
    rc = usable(c);
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

/* ------------------------------------------------------------------------ */
/* dlock_list() and dlock_break()                                           */
/* ------------------------------------------------------------------------ */

#define LIST_DEFAULT 100
#define LIST_MAX 10000

void dlock_list_clear(dlock_list_page *page)
{
    if (!page)
        return;
    for (size_t i = 0; i < page->n; i++) {
        free(page->locks[i].name);
        dlock_info_clear(&page->locks[i].info);
    }
    free(page->locks);
    free(page->next);
    memset(page, 0, sizeof(*page));
}

int dlock__list_add(dlock_list_page *out, const char *name, size_t len,
                    dlock_info *info)
{
    size_t n = out->n;
    char *copy;

    /* capacity: 16, then doubled whenever n reaches a power of two */
    if (n == 0 || (n >= 16 && (n & (n - 1)) == 0)) {
        dlock_listed *p = realloc(out->locks, (n ? 2 * n : 16) * sizeof(*p));
        if (!p) {
            dlock_info_clear(info);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
        out->locks = p;
    }
    copy = malloc(len + 1);
    if (!copy) {
        dlock_info_clear(info);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    memcpy(copy, name, len);
    copy[len] = '\0';
    out->locks[n].name = copy;
    out->locks[n].info = *info;
    memset(info, 0, sizeof(*info));
    out->n = n + 1;
    return DLOCK_OK;
}

int dlock_list(dlock_client *c, const char *prefix, const char *cursor,
               size_t limit, unsigned flags, dlock_list_page *out)
{
    size_t plen = prefix ? strnlen(prefix, DLOCK_NAME_MAX + 1) : 0;
    int rc;

    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_list: out is NULL");
    memset(out, 0, sizeof(*out));
    if (!c)
        return dlock__err(DLOCK_EINVAL, "dlock_list: client is NULL");
    if (plen > DLOCK_NAME_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_list: the prefix is longer than a lock "
                          "name may be (%d bytes)",
                          DLOCK_NAME_MAX);
    if (flags & ~DLOCK_LIST_FREE)
        return dlock__err(DLOCK_EINVAL, "dlock_list: unknown flags 0x%x",
                          flags & ~DLOCK_LIST_FREE);
    if (limit > LIST_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_list: limit must be at most %d, not %zu",
                          LIST_MAX, limit);
    if (cursor && strnlen(cursor, 4097) > 4096)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_list: the cursor is not one this store "
                          "made (too long)");
    rc = usable(c);
    if (rc)
        return rc;
    if (!c->be->list)
        return dlock__err(DLOCK_ENOTSUP,
                          "%s: this store cannot list its locks "
                          "(docs/monitoring.md)",
                          dlock_client_store(c));
    rc = c->be->list(c->st, prefix ? prefix : "", plen, cursor ? cursor : "",
                     limit ? limit : LIST_DEFAULT, flags, out,
                     dlock__now_ms() + c->timeout_ms);
    if (rc)
        dlock_list_clear(out);
    return rc;
}

int dlock_break(dlock_client *c, const char *name, dlock_info *evicted)
{
    dlock_info scratch;
    dlock_info *out = evicted ? evicted : &scratch;
    size_t len = 0;
    int rc;

    memset(out, 0, sizeof(*out));
    rc = name_call(c, "dlock_break", name, &len);
    if (rc)
        return rc;
    if (!c->be->evict)
        return dlock__err(DLOCK_ENOTSUP,
                          "%s: a lock cannot be broken from outside its "
                          "holder on this store: %s (docs/monitoring.md)",
                          dlock_client_store(c),
                          c->be->evict_unsupported
                              ? c->be->evict_unsupported
                              : "it has no way to take a hold away");
    out->ttl_ms = -1;
    out->held_ms = -1;
    out->waiters = -1;
    rc = c->be->evict(c->st, name, len, out,
                      dlock__now_ms() + c->timeout_ms);
    if (rc != DLOCK_OK && rc != DLOCK_ENOTHELD)
        dlock_info_clear(out);
    if (rc == DLOCK_ENOTHELD)
        rc = dlock__err(DLOCK_ENOTHELD,
                        "lock '%.200s' is not held: nothing to break", name);
    if (!evicted)
        dlock_info_clear(&scratch);
    return rc;
}
