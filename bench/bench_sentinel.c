/* SPDX-License-Identifier: MIT */
/*
 * bench_sentinel.c -- redis-sentinel:// beside redis:// on its primary:
 * the target is "uncontended cycle through Sentinel <= 1.1x the same
 * floor on the primary; with min_replicas=1, the cost of WAIT shown
 * beside it" (issue 21).
 *
 *   dlock_bench_sentinel SENTINEL_URI PRIMARY_URI [--quick]
 *
 * bench/run.sh has th_serve (tests/harness/serve.c) start the set: a
 * primary, two replicas, three sentinels (private redis-servers on free
 * loopback ports). Kinds, each an
 * uncontended acquire + release on its own client and name, timed in
 * alternating chunks (chunked_ops): dlock on the primary (redis://, the
 * floor), through the sentinels, and through the sentinels with
 * min_replicas=1 and =2 (a WAIT in the acquire's round trip). The
 * ratio is the median of the chunks' ratios, with their range.
 *
 * Prints Markdown: a subsection for the end of the Redis section.
 */
#include <dlock.h>

#include <stdio.h>
#include <string.h>

#include "harness.h"

const char bench_prog[] = "bench_sentinel";

#define CHUNKS 15
#define KINDS 4

int main(int argc, char **argv)
{
    int n = h_primary_args(argc, argv, "SENTINEL_URI");
    char uris[KINDS][1200];
    char names[KINDS][32];
    static const char *const what[KINDS] = {
        NULL, "through the sentinels", "with `min_replicas=1` (WAIT)",
        "with `min_replicas=2` (WAIT)"};

    snprintf(uris[0], sizeof(uris[0]), "%s", argv[2]);
    snprintf(uris[1], sizeof(uris[1]), "%s", argv[1]);
    /* 1.5 s for an acknowledgement (the default, a quarter of the 2 s
     * timeout, once gave out on a loaded machine and ended the section) */
    snprintf(uris[2], sizeof(uris[2]), "%s?min_replicas=1&replica_timeout=1500",
             argv[1]);
    snprintf(uris[3], sizeof(uris[3]), "%s?min_replicas=2&replica_timeout=1500",
             argv[1]);
    for (int k = 0; k < KINDS; k++)
        snprintf(names[k], sizeof(names[k]), "bench-sentinel-%d", k);

    printf("### Redis Sentinel (`redis-sentinel://`)\n\n");
    printf("A primary, two replicas and three sentinels on this machine. "
           "Each kind: an uncontended acquire + release on its own client, "
           "%d cycles in %d alternating chunks; the ratio is the median of "
           "the chunks' ratios to dlock on the primary itself (`redis://`), "
           "with their range.\n\n",
           n, CHUNKS);
    h_beside_primary((const char *const[]){uris[0], uris[1], uris[2], uris[3]},
                     names, what, KINDS, n, CHUNKS);
    return 0;
}
