/* SPDX-License-Identifier: MIT */
/*
 * names.c -- the client's table of lock names.
 *
 * Every handle and hold of one name in one client points at one entry, so
 * that a thread re-entering a lock through a second handle finds its hold,
 * and a wake-up for a name finds its waiters. Chained hash table, doubled
 * when it gets full. All functions run with c->mu held.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

static int grow(dlock_client *c)
{
    size_t n = c->nbuckets ? c->nbuckets * 2 : 64;
    dlock__entry **b = calloc(n, sizeof(*b));

    if (!b)
        return -1;
    for (size_t i = 0; i < c->nbuckets; i++) {
        dlock__entry *e = c->buckets[i];
        while (e) {
            dlock__entry *next = e->chain;
            size_t k = (size_t)(e->hash & (n - 1));
            e->chain = b[k];
            b[k] = e;
            e = next;
        }
    }
    free(c->buckets);
    c->buckets = b;
    c->nbuckets = n;
    return 0;
}

dlock__entry *dlock__entry_find(dlock_client *c, const char *name,
                                size_t len)
{
    uint64_t h;

    if (c->nbuckets == 0)
        return NULL;
    h = dlock__hash(name, len);
    for (dlock__entry *e = c->buckets[h & (c->nbuckets - 1)]; e;
         e = e->chain)
        if (e->hash == h && e->len == len && memcmp(e->name, name, len) == 0)
            return e;
    return NULL;
}

dlock__entry *dlock__entry_ref(dlock_client *c, const char *name, size_t len)
{
    dlock__entry *e = dlock__entry_find(c, name, len);

    if (e) {
        e->refs++;
        return e;
    }
    if ((c->nentries + 1) * 4 > c->nbuckets * 3 && grow(c) != 0)
        return NULL;
    e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->name = malloc(len + 1);
    if (!e->name) {
        free(e);
        return NULL;
    }
    memcpy(e->name, name, len);
    e->name[len] = '\0';
    e->len = len;
    e->hash = dlock__hash(name, len);
    e->refs = 1;
    dlock__metrics_attach(&c->m, e);
    size_t k = (size_t)(e->hash & (c->nbuckets - 1));
    e->chain = c->buckets[k];
    c->buckets[k] = e;
    c->nentries++;
    return e;
}

void dlock__entry_maybe_free(dlock_client *c, dlock__entry *e)
{
    if (e->refs > 0 || e->holds)
        return;
    for (dlock__waiter *w = c->waiters; w; w = w->next)
        if (w->entry == e)
            return;
    dlock__entry **pp = &c->buckets[e->hash & (c->nbuckets - 1)];
    while (*pp != e)
        pp = &(*pp)->chain;
    *pp = e->chain;
    c->nentries--;
    dlock__metrics_detach(&c->m, e);
    free(e->name);
    free(e);
}

void dlock__entry_unref(dlock_client *c, dlock__entry *e)
{
    e->refs--;
    dlock__entry_maybe_free(c, e);
}
