/* SPDX-License-Identifier: MIT */
/*
 * pool.c -- the idle connections a store keeps (pool.h).
 */
#include "pool.h"

#include <poll.h>
#include <stddef.h>

static unsigned pool_max(const dlock__pool *p)
{
    return p->max && p->max < DLOCK__POOL_MAX ? p->max : DLOCK__POOL_MAX;
}

void *dlock__pool_take(dlock__pool *p)
{
    return p->n ? p->idle[--p->n] : NULL;
}

int dlock__pool_keep(dlock__pool *p, void *conn)
{
    if (!conn || p->n >= pool_max(p))
        return 0;
    p->idle[p->n++] = conn;
    return 1;
}

unsigned dlock__pool_drain(dlock__pool *p, void **out)
{
    unsigned n = p->n;

    for (unsigned i = 0; i < n; i++)
        out[i] = p->idle[i];
    p->n = 0;
    return n;
}

int dlock__pool_stale(int fd)
{
    struct pollfd pf = {fd, POLLIN, 0};

    return fd < 0 || poll(&pf, 1, 0) != 0;
}
