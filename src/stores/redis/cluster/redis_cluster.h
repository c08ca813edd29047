/* SPDX-License-Identifier: MIT */
/*
 * redis_cluster.h -- where each key of a Redis Cluster lives
 * (redis-cluster://), and the commands sent there. The protocol and its
 * failure cases: "Redis Cluster" in docs/design.md.
 *
 * The slot map comes from the cluster (CLUSTER SLOTS, asked of the node a
 * redirection names, then of the known primaries, then of the seeds). A
 * command goes to the primary of its key's slot over that node's
 * pipelined connection (redis_conn.c, made at the first command); MOVED
 * updates the map and resends, ASK resends once behind ASKING, TRYAGAIN
 * (a slot half migrated) resends after a short pause, at most
 * DLOCK__RCLUSTER_REDIRECTS times in all. Each change of a slot's owner
 * gives that slot a new generation: a hold taken under an older one was
 * taken from a primary that no longer has the slot.
 *
 * Thread-safety: every function may be called from any thread; one mutex
 * inside, never held while talking to a server. None calls back into the
 * store.
 */
#ifndef DLOCK_REDIS_CLUSTER_H
#define DLOCK_REDIS_CLUSTER_H

#include "redis_conn.h"

#define DLOCK__RCLUSTER_SLOTS 16384
#define DLOCK__RCLUSTER_REDIRECTS 5

typedef struct dlock__rcluster dlock__rcluster;

/* Reads the seeds (the URI's hosts, default port 6379) and fetches the
 * slot map from the first that answers, within `deadline`. `cfg`,
 * `scripts` and the strings are borrowed and must outlive the cluster.
 * DLOCK_OK, or DLOCK_EINVAL, DLOCK_ECONN (no seed answered with a map:
 * the message names the last failure), DLOCK_EAUTH, DLOCK_ENOMEM. */
int dlock__rcluster_open(dlock__rcluster **out, const dlock__uri *u,
                         const dlock__redis_config *cfg,
                         const char *const *scripts, int nscripts,
                         int64_t deadline);
void dlock__rcluster_free(dlock__rcluster *cl);

/* The slot of a key: CRC16 of its hash tag (the bytes between the first
 * '{' and the next '}', when there are any), else of the whole key. */
unsigned dlock__rcluster_slot(const char *key, size_t len);

/* Runs cmds[0..n) as one pipeline on the primary of `slot`, following
 * redirections (see above). As dlock__rconn_run(): on DLOCK_OK every
 * replies[i] is set and the caller frees them. DLOCK_ECONN when the
 * slot's primary cannot be reached (after one look at the map) or the
 * redirections do not end. */
int dlock__rcluster_run(dlock__rcluster *cl, unsigned slot, rcmd *cmds,
                        int n, redisReply **replies, int64_t deadline);

/* The primaries now, ordered by the lowest slot each owns (an order a
 * failover keeps): how many (at most cap) into ids[] (node indexes for
 * dlock__rcluster_run_node). Asks for the map first if it has holes. */
int dlock__rcluster_primaries(dlock__rcluster *cl, int *ids, int cap,
                              int64_t deadline);

/* Runs cmds on node `id` itself (SCAN), no redirection. */
int dlock__rcluster_run_node(dlock__rcluster *cl, int id, rcmd *cmds, int n,
                             redisReply **replies, int64_t deadline);

/* The node that owns `slot` (asking for the map if nobody does), and how
 * to connect to it (borrowed; lives as long as the cluster). DLOCK_OK or
 * DLOCK_ECONN. */
int dlock__rcluster_owner(dlock__rcluster *cl, unsigned slot, int *id,
                          const dlock__rconn_target **t, int64_t deadline);

/* The node that owns `slot` as the map says now, without asking: its
 * index, or -1. */
int dlock__rcluster_owner_now(dlock__rcluster *cl, unsigned slot);

/* Asks for the map now (the primaries, then the seeds). DLOCK_OK or the
 * last failure. */
int dlock__rcluster_refresh(dlock__rcluster *cl, int64_t deadline);

/* A MOVED answer seen elsewhere (the subscriber's SSUBSCRIBE): the slot it
 * names now belongs to the node it names. Returns the slot, or -1 when
 * `err` is not a MOVED answer. */
int dlock__rcluster_moved(dlock__rcluster *cl, const char *err);

/* The generation of the whole map (starts at 1; grows with every change of
 * a slot's owner), and of one slot (the map's when its owner last
 * changed). */
uint64_t dlock__rcluster_gen(dlock__rcluster *cl);
uint64_t dlock__rcluster_slot_gen(dlock__rcluster *cl, unsigned slot);

#endif /* DLOCK_REDIS_CLUSTER_H */
