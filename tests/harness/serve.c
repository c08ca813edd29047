/* SPDX-License-Identifier: MIT */
/*
 * serve.c -- th_serve KIND: starts a private store with the test harness
 * (th_store_start(): real servers on free loopback ports, in a temporary
 * directory), prints its URI and what the store can do on stdout, then
 * keeps it until stdin closes (or the process is killed: the servers die
 * with it). For what is not C (the Python package's pytest suite, the
 * shell tests, bench/run.sh), so that every language and the bench run
 * against the same servers, started the same way.
 *
 * Output, one line each: the URI; then "KEY=VALUE" words: what the store
 * does (has_fair, has_leases, lease_runs_out, held_visible, short_ttl),
 * then where its servers are, for a caller that looks at them behind
 * the store's back:
 *   ports     the data servers' plain ports, comma-separated: Redis (the
 *             primary first under Sentinel; a cluster's three primaries;
 *             Redlock's five nodes), ZooKeeper, etcd's client port,
 *             PostgreSQL or MariaDB (behind PgBouncer: the server's);
 *             0 for the file and SQLite stores
 *   tls_port  rediss: the server's TLS port beside its plain one (else 0)
 *   cacert    rediss: the CA that signed its certificate (else "-")
 *   dir       the temporary directory of the servers' files and logs
 */
#include "test.h"

#include <stdio.h>
#include <unistd.h>

/* The data servers' plain ports, as "ports=" says above. */
static void print_ports(const th_store *s)
{
    const th_redis *r = NULL;
    int n = 0;

    if (s->cl.uri[0]) {
        r = s->cl.node;
        n = 3;
    } else if (s->rl[0].port) {
        r = s->rl;
        n = 5;
    } else if (s->srv.port) {
        r = &s->srv;
        n = 1;
    }
    for (int i = 0; i < n; i++)
        printf("%s%d", i ? "," : "", r[i].port);
    if (n)
        return;
    if (s->zsrv.n)
        printf("%d", s->zsrv.port[0]);
    else if (s->esrv.n)
        printf("%d", s->esrv.port[0]);
    else
        printf("%d", s->ssrv.port);
}

int main(int argc, char **argv)
{
    th_store s;
    char buf[256];

    if (argc != 2) {
        fprintf(stderr, "usage: %s STORE-KIND\n", argv[0]);
        return 2;
    }
    th_store_start(&s, argv[1]);
    printf("%s\nkind=%s has_fair=%d has_leases=%d lease_runs_out=%d "
           "held_visible=%d short_ttl=%lld ports=",
           s.uri, s.kind, s.has_fair, s.has_leases, s.lease_runs_out,
           s.held_visible, (long long)s.short_ttl);
    print_ports(&s);
    printf(" tls_port=%d cacert=%s%s dir=%s\n", s.srv.tls_port,
           s.srv.tls_port ? th_tls_certs() : "-",
           s.srv.tls_port ? "/ca.crt" : "", th_tmpdir());
    fflush(stdout);
    /* the servers live until our parent closes its end (bounded by the
     * parent: a test that ends closes it, a killed one too) */
    while (read(0, buf, sizeof(buf)) > 0)
        ;
    th_store_stop(&s);
    return 0;
}
