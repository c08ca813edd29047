/* SPDX-License-Identifier: MIT */
/*
 * metrics.h -- a client's metrics (metrics.c): counters and histograms,
 * per lock name in a bounded table of slots, and client-wide. Never
 * installed. docs/design.md, "Observing: metrics and events".
 *
 * Writers update with relaxed atomics on the path of the call that
 * causes the event, through the slot their name's entry points at
 * (entry->ms), which cannot change while the entry lives: a slot is only
 * given to another name once no entry points at it (its `live` count is
 * 0), under the client's mutex.
 */
#ifndef DLOCK_METRICS_H
#define DLOCK_METRICS_H

#include "dlock.h"

#include <stddef.h>
#include <stdint.h>

/* Counters, per name. */
enum {
    DLOCK__M_ACQUIRED,
    DLOCK__M_REENTERED,
    DLOCK__M_BUSY,
    DLOCK__M_WAITED,
    DLOCK__M_RELEASED,
    DLOCK__M_LOST_EXPIRED,
    DLOCK__M_LOST_TAKEN,
    DLOCK__M_LOST_STORE,
    DLOCK__M_RENEWED,
    DLOCK__M_RENEW_FAILED,
    DLOCK__M_LONG_HOLDS,
    DLOCK__M_COUNT
};

/* Histograms, per name. */
enum { DLOCK__H_WAIT, DLOCK__H_HOLD, DLOCK__H_HANDOFF, DLOCK__H_COUNT };

/* Buckets are per bucket here (not cumulative; the count is their sum);
 * sum in microseconds. */
typedef struct dlock__hist {
    uint64_t sum_us;
    uint64_t b[DLOCK_HIST_BUCKETS];
} dlock__hist;

typedef struct dlock__mslot {
    char *name; /* NULL: the aggregate */
    size_t len;
    uint64_t hash;
    size_t live; /* entries pointing here (client mutex) */
    uint64_t c[DLOCK__M_COUNT];
    dlock__hist h[DLOCK__H_COUNT];
} dlock__mslot;

typedef struct dlock__metrics {
    int on;           /* read relaxed on every path */
    size_t max_names; /* slots at most */
    dlock__mslot **slots;
    size_t nslots;
    dlock__mslot other; /* every name without a slot of its own */
    uint64_t errors[16];
    dlock__hist store_op;
} dlock__metrics;

struct dlock__entry;

void dlock__metrics_init(dlock__metrics *m);
void dlock__metrics_free(dlock__metrics *m);
/* Gives entry e its slot (client mutex held; e->name set). */
void dlock__metrics_attach(dlock__metrics *m, struct dlock__entry *e);
/* e is being freed (client mutex held). */
void dlock__metrics_detach(dlock__metrics *m, struct dlock__entry *e);

static inline int dlock__m_on(const dlock__metrics *m)
{
    return __atomic_load_n(&m->on, __ATOMIC_RELAXED);
}

static inline void dlock__m_inc(dlock__mslot *s, int which)
{
    __atomic_fetch_add(&s->c[which], 1, __ATOMIC_RELAXED);
}

void dlock__hist_observe(dlock__hist *h, int64_t us);

/* A store call's outcome: its time, and an error counted by code. */
void dlock__m_store_op(dlock__metrics *m, int64_t us, int rc);

#endif /* DLOCK_METRICS_H */
