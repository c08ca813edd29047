/* SPDX-License-Identifier: MIT */
/*
 * pool.h -- the idle connections a store keeps between its statements
 * (pool.c): PostgreSQL's extra connections, MariaDB's connections and
 * etcd's HTTP handles. A connection is used by one thread at a time: a
 * thread takes one out of the pool for a statement (or a hold, or a wait)
 * and gives it back after; a connection never sits in the pool while a
 * thread uses it.
 *
 * A stack, the most recently given back on top (its server session is the
 * likeliest still open), of at most `max` connections: one given back to
 * a full pool is closed by its store. Not locked: each call runs under
 * the store's own lock, which also guards what the store keeps beside its
 * pool (PostgreSQL's command connection, its idle timer).
 */
#ifndef DLOCK_COMMON_POOL_H
#define DLOCK_COMMON_POOL_H

#define DLOCK__POOL_MAX 16 /* the largest `max` */

typedef struct dlock__pool {
    void *idle[DLOCK__POOL_MAX];
    unsigned n;   /* connections in idle[0..n) */
    unsigned max; /* kept at most: 1 to DLOCK__POOL_MAX (0: the largest) */
} dlock__pool;

/* The most recently given back connection, out of the pool; NULL when it
 * is empty. The caller checks it is still usable (dlock__pool_stale()). */
void *dlock__pool_take(dlock__pool *p);

/* Gives conn back: 1 when the pool keeps it; 0 when it is full (the
 * caller closes conn). */
int dlock__pool_keep(dlock__pool *p, void *conn);

/* Empties the pool into out (room for DLOCK__POOL_MAX): how many. The
 * caller closes them (the store's close, an idle timer). */
unsigned dlock__pool_drain(dlock__pool *p, void **out);

/* The health check of an idle connection's socket: 1 when it has bytes to
 * read or was hung up (an idle session is sent nothing unasked unless the
 * server closed it: a restart, an idle timeout; or, for PostgreSQL,
 * notifications, which the caller reads), else 0. Never blocks. */
int dlock__pool_stale(int fd);

#endif /* DLOCK_COMMON_POOL_H */
