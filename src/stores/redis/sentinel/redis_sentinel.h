/* SPDX-License-Identifier: MIT */
/*
 * redis_sentinel.h -- where the primary of a Sentinel-managed Redis is
 * (redis-sentinel://), and when it moves. The protocol and its failure
 * cases: "Redis beyond one server: Sentinel" in docs/design.md.
 *
 * The topology asks the sentinels (`SENTINEL get-master-addr-by-name`)
 * and keeps one connection to one sentinel subscribed to
 * `+switch-master`, in the store's epoll set, read by whoever reads that
 * set (the client's background thread or a waiting thread). Each address
 * the primary takes after the first is a new generation: a connection or
 * a hold made under an older one belongs to a primary that is no more.
 *
 * Thread-safety: every function may be called from any thread; one mutex
 * inside. None calls back into the store.
 */
#ifndef DLOCK_REDIS_SENTINEL_H
#define DLOCK_REDIS_SENTINEL_H

#include "redis_common.h"
#include "store.h"

typedef struct dlock__rtopo dlock__rtopo;

/* Reads the sentinels (the URI's hosts, default port 26379) and the
 * master's name (its path), subscribes to switches and finds the primary,
 * within `deadline`. `epfd`: the epoll set the watch connection joins.
 * `cfg` is borrowed (its timeout bounds each exchange). A new generation
 * wakes the client's background thread (dlock__loop_wake), which lets the
 * store act on it. DLOCK_OK, or
 * DLOCK_EINVAL (the URI), DLOCK_ECONN (no sentinel answered, or none knows
 * the master: the message names each), DLOCK_ENOMEM. */
int dlock__rtopo_open(dlock__rtopo **out, dlock_client *c,
                      const dlock__uri *u, const dlock__redis_config *cfg,
                      int epfd, int64_t deadline);
void dlock__rtopo_free(dlock__rtopo *t);

/* The primary as now known, into host (256 bytes) and *port, with its
 * generation; asks the sentinels first when it is not known (after
 * dlock__rtopo_not_primary()). DLOCK_OK or DLOCK_ECONN. */
int dlock__rtopo_primary(dlock__rtopo *t, char *host, int *port,
                         uint64_t *gen, int64_t deadline);

/* The server reached under generation `gen` said it is not the primary
 * (ROLE, READONLY): the next dlock__rtopo_primary() asks the sentinels
 * again. Does nothing when the generation has moved on since. */
void dlock__rtopo_not_primary(dlock__rtopo *t, uint64_t gen);

/* Whether the primary is known (no ask pending). */
int dlock__rtopo_known(dlock__rtopo *t);

/* The generation now (starts at 1). */
uint64_t dlock__rtopo_gen(dlock__rtopo *t);

/* Reads what the watch connection has (non-blocking) and, if it broke,
 * forgets it (the next ask subscribes again). Returns the generation. */
uint64_t dlock__rtopo_read(dlock__rtopo *t);

/* "redis-sentinel MASTER", for messages. */
const char *dlock__rtopo_where(const dlock__rtopo *t);

#endif /* DLOCK_REDIS_SENTINEL_H */
