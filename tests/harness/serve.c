/* SPDX-License-Identifier: MIT */
/*
 * serve.c -- th_serve KIND: starts a private store with the test harness
 * (th_store_start(): real servers on free loopback ports, in a temporary
 * directory), prints its URI and what the store can do on stdout, then
 * keeps it until stdin closes (or the process is killed: the servers die
 * with it). For the tests that are not C (the Python package's pytest
 * suite), so that every language tests against the same servers, started
 * the same way.
 *
 * Output, one line each: the URI; then "KEY=VALUE" words (has_fair,
 * has_leases, held_visible, short_ttl).
 */
#include "test.h"

#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    th_store s;
    char buf[256];

    if (argc != 2) {
        fprintf(stderr, "usage: %s STORE-KIND\n", argv[0]);
        return 2;
    }
    th_store_start(&s, argv[1]);
    printf("%s\nkind=%s has_fair=%d has_leases=%d held_visible=%d "
           "short_ttl=%lld\n",
           s.uri, s.kind, s.has_fair, s.has_leases, s.held_visible,
           (long long)s.short_ttl);
    fflush(stdout);
    /* the servers live until our parent closes its end (bounded by the
     * parent: a test that ends closes it, a killed one too) */
    while (read(0, buf, sizeof(buf)) > 0)
        ;
    th_store_stop(&s);
    return 0;
}
