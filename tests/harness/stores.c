/* SPDX-License-Identifier: MIT */
/*
 * stores.c -- starts the store a store test runs on, by kind (the first
 * argument of test_contract and test_shared), and says what it does.
 */
#include "test.h"

#ifdef TH_SQLITE
#include <sqlite3.h>
#endif

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void th_need_redis_tls(void)
{
#ifndef TH_REDIS_TLS
    th_skip("this build has no Redis over TLS (DLOCK_HAVE_REDIS_TLS)");
#endif
}

#ifdef TH_SQLITE
void th_sqlite_db(char *path, size_t pcap, char *uri, size_t ucap)
{
    snprintf(path, pcap, "%s/locks.db", th_tmpdir());
    snprintf(uri, ucap, "sqlite://%s", path);
}

void th_sqlite_exec(const char *path, const char *sql)
{
    sqlite3 *db;
    char *err = NULL;

    CHECK_EQ(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    if (sqlite3_exec(db, sql, NULL, NULL, &err) != SQLITE_OK)
        th_fail(__FILE__, __LINE__, "%s: %s", sql, err ? err : "?");
    sqlite3_close(db);
}
#endif

void th_store_start(th_store *s, const char *k)
{
    memset(s, 0, sizeof(*s));
    s->kind = k;
    s->has_fair = 1;
    s->keeps_last_token = s->held_visible = 1;
    if (!strcmp(k, "mem")) {
        /* the in-process store (docs/design.md, "The in-process store"):
         * a space of this test process's own; its leases run out as any
         * store's, but no other process sees its locks (tests that need
         * one are marked TP) */
        snprintf(s->uri, sizeof(s->uri), "mem://test-%ld", (long)getpid());
        th_in_process = 1;
        s->has_leases = s->lease_runs_out = s->ttl_visible = 1;
        s->short_ttl = 300;
    } else if (!strcmp(k, "redis")) {
        th_redis_start(&s->srv, NULL);
        snprintf(s->uri, sizeof(s->uri), "%s", s->srv.uri);
        s->has_leases = s->lease_runs_out = s->ttl_visible = 1;
        s->short_ttl = 300;
    } else if (!strcmp(k, "rediss")) {
        /* the Redis store over TLS: a server with a plain and a TLS port,
         * the client on the TLS port (certificate for localhost, checked
         * against the test CA; no client certificate). Every Redis
         * contract is to hold; looked at behind its back on the plain
         * port (s->srv.port), as redis:// */
        th_need_redis_tls();
        th_redis_start_tls(&s->srv, "server", 0, NULL);
        snprintf(s->uri, sizeof(s->uri), "%s", s->srv.tls_uri);
        s->kind = "redis";
        s->has_leases = s->lease_runs_out = s->ttl_visible = 1;
        s->short_ttl = 300;
    } else if (!strcmp(k, "redis-sentinel")) {
        /* the same store through the sentinels: every contract holds;
         * looked at behind its back on the primary, as redis:// */
        th_sentinels_start(&s->sen, "dlocktest", 1000, 10000);
        s->srv = s->sen.data[0];
        snprintf(s->uri, sizeof(s->uri), "%s", s->sen.uri);
        s->kind = "redis";
        s->has_leases = s->lease_runs_out = s->ttl_visible = 1;
        s->short_ttl = 300;
    } else if (!strcmp(k, "redis-cluster")) {
        /* the Redis store on three primaries with a replica each
         * (docs/design.md, Redis Cluster): every Redis contract is to
         * hold. A lock's keys live on the primary of their slot, so there
         * is no one server to look at behind its back: s->srv stays unset
         * (a test that uses it fails, "cannot reach redis on port 0");
         * th_store_redis_for() names the node */
        th_cluster_start(&s->cl, 15000); /* stock: no failover the suites do not ask for */
        snprintf(s->uri, sizeof(s->uri), "%s", s->cl.uri);
        s->kind = "redis";
        s->has_leases = s->lease_runs_out = s->ttl_visible = 1;
        s->short_ttl = 300;
    } else if (!strcmp(k, "redlock")) {
        /* five independent masters. The node timeout is the longest a
         * node's answer may take before the round counts it as failed
         * (too many: DLOCK_ECONN). On a busy 2-core machine a node is now
         * and then not scheduled within Redlock's default 50 ms (seen
         * under stress-ng --cpu 2: "cannot raise the fencing counters:
         * ... no answer within 50 ms"), and under valgrind it answers
         * slower still; the contract is not about that, so the nodes get
         * 250 ms here (test_redlock.c says the same) */
        size_t o = (size_t)snprintf(s->uri, sizeof(s->uri), "redlock://");
        for (int i = 0; i < 5; i++) {
            th_redis_start(&s->rl[i], NULL);
            o += (size_t)snprintf(s->uri + o, sizeof(s->uri) - o, "%s127.0.0.1:%d",
                                  i ? "," : "", s->rl[i].port);
        }
        snprintf(s->uri + o, sizeof(s->uri) - o, "?node_timeout=250");
        s->has_leases = s->lease_runs_out = s->ttl_visible = 1;
        s->has_fair = 0;
        s->short_ttl = 1000;
    } else if (!strcmp(k, "zk")) {
#ifndef TH_ZK_CLIENT
        th_skip("this build has no zk store");
#endif
        th_zk_start(&s->zsrv, 1);
        snprintf(s->uri, sizeof(s->uri), "zk://%s/dlocktest", s->zsrv.hosts);
        s->has_leases = s->fixed_ttl = 1;
        s->keeps_last_token = 0;
        s->short_ttl = 400;
    } else if (!strcmp(k, "etcd")) {
        if (!th_etcd_available())
            th_skip("etcd/etcdctl not installed");
        th_etcd_start(&s->esrv, 1);
        snprintf(s->uri, sizeof(s->uri), "etcd://%s?prefix=dlocktest", s->esrv.hosts);
        s->has_leases = s->ttl_visible = 1;
        s->keeps_last_token = s->held_visible = 0;
        s->short_ttl = 1000;
    } else if (!strcmp(k, "sqlite")) {
#ifndef TH_SQLITE
        th_skip("this build has no sqlite store");
#endif
        snprintf(s->uri, sizeof(s->uri), "sqlite://%s/locks.db", th_tmpdir());
        s->has_leases = s->lease_runs_out = s->ttl_visible = 1;
        s->short_ttl = 300;
    } else if (!strcmp(k, "pg") || !strcmp(k, "mysql")) {
        if (!th_sql_available(k))
            th_skip("this build has no such store, or no server");
        th_sql_start(&s->ssrv, k);
        snprintf(s->uri, sizeof(s->uri), "%s", s->ssrv.uri);
        s->has_leases = s->lease_runs_out = s->ttl_visible = 1;
        s->short_ttl = 300;
    } else if (!strcmp(k, "pg-advisory")) {
        if (!th_sql_available("pg"))
            th_skip("this build has no postgres store, or no server");
        th_sql_start(&s->ssrv, "pg");
        snprintf(s->ssrv.kind, sizeof(s->ssrv.kind), "pg");
        snprintf(s->uri, sizeof(s->uri), "%s?mode=advisory", s->ssrv.uri);
        s->keeps_last_token = 0; /* no lease, no row: see docs/stores.md */
    } else if (!strcmp(k, "pg-pgbouncer") ||
               !strcmp(k, "pg-advisory-pgbouncer")) {
        /* PgBouncer in session mode in front: the same behaviour as the
         * server's own, looked at behind its back the same way */
        int advisory = !strcmp(k, "pg-advisory-pgbouncer");
        if (!th_sql_available("pg"))
            th_skip("this build has no postgres store, or no server");
        if (!th_pgb_available())
            th_skip("pgbouncer is not installed");
        th_sql_start(&s->ssrv, "pg");
        th_pgb_start(&s->pgb, &s->ssrv, "session");
        snprintf(s->uri, sizeof(s->uri), "%s?pooler=session%s", s->pgb.uri,
                 advisory ? "&mode=advisory" : "");
        s->kind = advisory ? "pg-advisory" : "pg";
        if (advisory) {
            s->keeps_last_token = 0;
        } else {
            s->has_leases = s->lease_runs_out = s->ttl_visible = 1;
            s->short_ttl = 300;
        }
    } else if (!strcmp(k, "file")) {
        snprintf(s->uri, sizeof(s->uri), "file://%s/locks", th_tmpdir());
    } else {
        fprintf(stderr, "unknown store kind %s\n", k);
        exit(2);
    }
}

th_redis *th_store_redis_for(th_store *s, const char *key)
{
    int i;

    if (!s->cl.uri[0])
        return &s->srv;
    i = th_cluster_owner(&s->cl, th_cluster_slot(&s->cl, key));
    if (i < 0)
        th_fail(__FILE__, __LINE__, "no cluster node owns the slot of %s",
                key);
    return &s->cl.node[i];
}

void th_store_stop(th_store *s)
{
    /* s->srv is a copy of the sentinels' first primary: stopped with them */
    if (!s->sen.uri[0])
        th_redis_kill(&s->srv, SIGKILL);
    th_sentinels_stop(&s->sen);
    th_cluster_stop(&s->cl);
    for (int i = 0; i < 5; i++)
        th_redis_kill(&s->rl[i], SIGKILL);
    for (int i = 0; i < s->zsrv.n; i++)
        th_zk_kill(&s->zsrv, i, SIGKILL);
    for (int i = 0; i < s->esrv.n; i++)
        th_etcd_kill(&s->esrv, i, SIGKILL);
    th_pgb_kill(&s->pgb, SIGKILL); /* before the server behind it */
    th_sql_kill(&s->ssrv, SIGKILL);
}

int th_store_main(int argc, char **argv, th_store *s, const th_test *tests,
                  void (*started)(void))
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s STORE-KIND [filter]\n", argv[0]);
        return 2;
    }
    th_store_start(s, argv[1]);
    if (started)
        started();
    return th_main(argc - 1, argv + 1, tests);
}
