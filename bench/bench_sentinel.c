/* SPDX-License-Identifier: MIT */
/*
 * bench_sentinel.c -- redis-sentinel:// beside redis:// on its primary:
 * the target is "uncontended cycle through Sentinel <= 1.1x the same
 * floor on the primary; with min_replicas=1, the cost of WAIT shown
 * beside it" (issue 21).
 *
 *   dlock_bench_sentinel SENTINEL_URI PRIMARY_URI [--quick]
 *
 * bench/run.sh starts the set: a primary, two replicas, three sentinels
 * (private redis-servers on free loopback ports). Kinds, each an
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
#include <stdlib.h>
#include <string.h>

#include "harness.h"

const char bench_prog[] = "bench_sentinel";

#define CHUNKS 15
#define KINDS 4

int main(int argc, char **argv)
{
    int quick = argc > 3 && !strcmp(argv[3], "--quick");
    int n = quick ? 1500 : 15000;
    char uris[KINDS][1200];
    dlock_client *c[KINDS];
    dlock *l[KINDS];
    kind_op kinds[KINDS];
    double *p50;

    if (argc < 3) {
        fprintf(stderr, "usage: dlock_bench_sentinel SENTINEL_URI "
                        "PRIMARY_URI [--quick]\n");
        return 2;
    }
    snprintf(uris[0], sizeof(uris[0]), "%s", argv[2]);
    snprintf(uris[1], sizeof(uris[1]), "%s", argv[1]);
    /* 1.5 s for an acknowledgement (the default, a quarter of the 2 s
     * timeout, once gave out on a loaded machine and ended the section) */
    snprintf(uris[2], sizeof(uris[2]), "%s?min_replicas=1&replica_timeout=1500",
             argv[1]);
    snprintf(uris[3], sizeof(uris[3]), "%s?min_replicas=2&replica_timeout=1500",
             argv[1]);
    for (int k = 0; k < KINDS; k++) {
        char name[32];
        snprintf(name, sizeof(name), "bench-sentinel-%d", k);
        c[k] = h_open_client(uris[k], NULL);
        l[k] = h_open_lock(c[k], name, 0, 0);
        kinds[k].op = h_dlock_once;
        kinds[k].arg = l[k];
    }
    p50 = calloc(KINDS * CHUNKS, sizeof(*p50));
    if (!p50)
        return 1;
    chunked_ops(kinds, KINDS, n, CHUNKS, p50, NULL);

    spread fl = medrange(p50, CHUNKS);
    printf("### Redis Sentinel (`redis-sentinel://`)\n\n");
    printf("A primary, two replicas and three sentinels on this machine. "
           "Each kind: an uncontended acquire + release on its own client, "
           "%d cycles in %d alternating chunks; the ratio is the median of "
           "the chunks' ratios to dlock on the primary itself (`redis://`), "
           "with their range.\n\n",
           n, CHUNKS);
    printf("| uncontended acquire+release | p50 (µs) | ÷ on the primary "
           "(target) |\n|---|---|---|\n");
    printf("| dlock on the primary (`redis://`, the floor) | %.1f | 1 |\n",
           fl.med);
    static const char *const what[KINDS] = {
        NULL, "through the sentinels", "with `min_replicas=1` (WAIT)",
        "with `min_replicas=2` (WAIT)"};
    for (int k = 1; k < KINDS; k++) {
        spread s = medrange(p50 + k * CHUNKS, CHUNKS);
        spread r = ratios(p50 + k * CHUNKS, p50, CHUNKS);
        printf("| %s | %.1f | %s%.2fx%s (%.2f–%.2f%s) |\n", what[k], s.med,
               k == 1 ? "**" : "", r.med, k == 1 ? "**" : "", r.min, r.max,
               k == 1 ? "; target ≤ 1.1x" : "; the cost of WAIT");
    }
    printf("\n");
    free(p50);
    for (int k = 0; k < KINDS; k++) {
        dlock_close(l[k]);
        dlock_client_close(c[k]);
    }
    return 0;
}
