/* SPDX-License-Identifier: MIT */
/*
 * bench_cluster.c -- redis-cluster:// beside redis:// on one of its
 * primaries: the target is "uncontended cycle through the cluster <= 1.1x
 * the same floor on the primary that owns the lock's slot; with
 * min_replicas=1, the cost of WAIT shown beside it", as for Sentinel
 * (bench_sentinel.c).
 *
 *   dlock_bench_cluster CLUSTER_URI PRIMARY_URI [--quick]
 *
 * bench/run.sh has th_serve (tests/harness/serve.c) start the cluster:
 * three primaries, each with a replica (private redis-servers on free
 * loopback ports whose bus ports, +10000, are free too). PRIMARY_URI is
 * redis://HOST:PORT of one primary P. Each kind's lock name is one whose
 * key (dlock:{NAME}) hashes to a slot P owns (asked of P: CLUSTER MYID,
 * CLUSTER SLOTS, CLUSTER KEYSLOT), so the cluster's client routes every
 * kind to P. Kinds, each an uncontended
 * acquire + release on its own client and name, timed in alternating
 * chunks (chunked_ops): dlock on P (redis://, the floor), through the
 * cluster, and through the cluster with min_replicas=1 (a WAIT in the
 * acquire's round trip). The ratio is the median of the chunks' ratios,
 * with their range.
 *
 * Prints Markdown: a subsection for the end of the Redis section.
 */
#include <dlock.h>
#include <hiredis.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "redis.h"

const char bench_prog[] = "bench_cluster";

#define CHUNKS 15
#define KINDS 3
#define MAX_TRIES 100000

/* The primary P, asked directly (hiredis). */
static redisContext *primary;

/* P's slot ranges (from CLUSTER SLOTS, the entries whose primary's node
 * id is P's own) into lo[]/hi[]; their count. */
static int own_ranges(long long *lo, long long *hi, int cap)
{
    redisReply *id = r_command(primary, "CLUSTER MYID");
    redisReply *slots = r_command(primary, "CLUSTER SLOTS");
    int n = 0;

    if (id->type != REDIS_REPLY_STRING && id->type != REDIS_REPLY_STATUS)
        die("CLUSTER MYID", "not a string");
    if (slots->type != REDIS_REPLY_ARRAY)
        die("CLUSTER SLOTS", "not an array");
    for (size_t i = 0; i < slots->elements; i++) {
        redisReply *e = slots->element[i];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[2]->type != REDIS_REPLY_ARRAY ||
            e->element[2]->elements < 3)
            die("CLUSTER SLOTS", "an entry without its primary's node id");
        redisReply *node_id = e->element[2]->element[2];
        if (node_id->type != REDIS_REPLY_STRING ||
            strcmp(node_id->str, id->str) != 0)
            continue;
        if (n == cap)
            die("CLUSTER SLOTS", "too many ranges");
        lo[n] = e->element[0]->integer;
        hi[n] = e->element[1]->integer;
        n++;
    }
    freeReplyObject(id);
    freeReplyObject(slots);
    if (n == 0)
        die("CLUSTER SLOTS", "the primary owns no slot (is it a primary?)");
    return n;
}

/* names[0..count): the first names bench/c/0, bench/c/1, ... whose key
 * dlock:{NAME} hashes to a slot P owns. */
static void pick_names(char names[][32], int count)
{
    long long lo[64], hi[64];
    int nr = own_ranges(lo, hi, 64), found = 0;

    for (int i = 0; i < MAX_TRIES && found < count; i++) {
        char name[32];
        snprintf(name, sizeof(name), "bench/c/%d", i);
        redisReply *r = r_command(primary, "CLUSTER KEYSLOT dlock:{%s}", name);
        if (r->type != REDIS_REPLY_INTEGER)
            die("CLUSTER KEYSLOT", "not an integer");
        for (int k = 0; k < nr; k++) {
            if (r->integer >= lo[k] && r->integer <= hi[k]) {
                snprintf(names[found++], sizeof(names[0]), "%s", name);
                break;
            }
        }
        freeReplyObject(r);
    }
    if (found < count)
        die("lock names", "none in the primary's slots");
}

int main(int argc, char **argv)
{
    int n = h_primary_args(argc, argv, "CLUSTER_URI");
    char uris[KINDS][1200];
    char names[KINDS][32];
    static const char *const what[KINDS] = {
        NULL, "through the cluster", "with `min_replicas=1` (WAIT)"};
    char host[256];
    int port;

    r_address(argv[2], host, sizeof(host), &port);
    primary = r_connect(host, port, 10, 10);
    pick_names(names, KINDS);
    redisFree(primary);
    primary = NULL;

    snprintf(uris[0], sizeof(uris[0]), "%s", argv[2]);
    snprintf(uris[1], sizeof(uris[1]), "%s", argv[1]);
    /* 1.5 s for an acknowledgement, as on Sentinel (the default, a
     * quarter of the 2 s timeout, is short on a loaded machine) */
    snprintf(uris[2], sizeof(uris[2]), "%s%cmin_replicas=1&replica_timeout=1500",
             argv[1], strchr(argv[1], '?') ? '&' : '?');

    printf("### Redis Cluster (`redis-cluster://`)\n\n");
    printf("Three primaries, each with a replica, on this machine; every "
           "lock's slot is owned by the same primary, so the cluster's "
           "client routes it there. Each kind: an uncontended acquire + "
           "release on its own client, %d cycles in %d alternating chunks; "
           "the ratio is the median of the chunks' ratios to dlock on that "
           "primary itself (`redis://`), with their range.\n\n",
           n, CHUNKS);
    h_beside_primary((const char *const[]){uris[0], uris[1], uris[2]}, names,
                     what, KINDS, n, CHUNKS);
    return 0;
}
