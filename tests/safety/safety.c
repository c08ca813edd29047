/* SPDX-License-Identifier: MIT */
/*
 * safety.c -- the safety suite's driver.
 *
 *   dlock_safety [--quick] [--mixed] [--stores a,b] [--scenarios x,y]
 *                [--workers N] [--table FILE] [--doc FILE] [--dlock PATH]
 *
 * For every store (file, redis, redlock, zk, etcd, sqlite, pg,
 * pg-advisory, mysql, sentinel, cluster) and scenario (none, kill, stop,
 * restart, partition, slow, clock, the waiter ones, break, failover,
 * reshard...), starts the store's private servers (tests/harness), runs N
 * worker processes fighting for one lock while each hold does a
 * read-modify-write on a fenced resource, injects the scenario's fault
 * while one holder (the victim) is between its read and its write,
 * checks the history (history.c) and prints a table scenario x store of
 * the outcomes: held, lost-and-reported, fenced, VIOLATED. Exit 1 when an
 * outcome is worse than the one expected for its cell (docs/safety.md
 * says why each is expected). --table writes the table in Markdown;
 * --doc replaces the part of a Markdown file between the markers
 * <!-- safety-table:begin --> and <!-- safety-table:end --> with it.
 * --mixed: two holds in three are read holds (dlock_acquire_shared(); a
 * reader only reads the resource), on the stores that have them; the
 * checker then flags a write overlapping any other hold and a read
 * overlapping a write; its table goes between the safety-mixed-table
 * markers. --dlock: the dlock binary the cutoff-run scenario's holder
 * runs (default: this build's).
 *
 * Past 1,000 lines on purpose: the scenarios' table and the driver that
 * runs each against every store and writes the table; the history
 * checker, the workers, the network faults, the forged-grant
 * scenario's forger and the cutoff-run scenario's `dlock run` holder are
 * in history.c, worker.c, netfault.c, forger.c and runner.c.
 */
#include "safety.h"
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef TH_SQLITE
#include <sqlite3.h>
#endif

#define FAKETIME_LIB "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"

/* The scenarios. A new one needs a number here, its name, its row of
 * expected outcomes below, the reason for each "n/a" of that row in
 * na_why(), and what it does in run_one() (a fault per round aimed at a
 * victim, or, like forged-grant, something beside the workers for a
 * while: no_victim()). */
enum { SC_NONE, SC_KILL, SC_STOP, SC_RESTART, SC_PARTITION, SC_SLOW,
       SC_CLOCK, SC_WKILL, SC_WSTOP, SC_SHORT, SC_HRESTART, SC_CONNKILL,
       SC_RESTART_NOW, SC_BREAK, SC_FAILOVER, SC_RESHARD, SC_CANCELS,
       SC_FORGED, SC_CUTOFF, SC_SETS, SC_ELECT, SC_N };
static const char *const sc_name[SC_N] = {
    [SC_NONE] = "none",
    [SC_KILL] = "kill",
    [SC_STOP] = "stop",
    [SC_RESTART] = "restart",
    [SC_PARTITION] = "partition",
    [SC_SLOW] = "slow",
    [SC_CLOCK] = "clock",
    [SC_WKILL] = "waiter-kill",
    [SC_WSTOP] = "waiter-stop",
    [SC_SHORT] = "short-waits",
    [SC_HRESTART] = "handover-restart",
    [SC_CONNKILL] = "conn-kill",
    [SC_RESTART_NOW] = "restart-now",
    [SC_BREAK] = "break",
    [SC_FAILOVER] = "failover",
    [SC_RESHARD] = "reshard",
    [SC_CANCELS] = "cancels",
    [SC_FORGED] = "forged-grant",
    [SC_CUTOFF] = "cutoff-run",
    [SC_SETS] = "sets-stop",
    [SC_ELECT] = "elect-stop",
};

enum { ST_FILE, ST_REDIS, ST_REDLOCK, ST_ZK, ST_ETCD, ST_SQLITE, ST_PG,
       ST_PGADV, ST_MYSQL, ST_SENTINEL, ST_CLUSTER, ST_REDISS, ST_N };
static const char *const st_name[ST_N] = {
    "file", "redis", "redlock", "zk", "etcd", "sqlite", "pg", "pg-advisory",
    "mysql", "sentinel", "cluster", "rediss"};

/* The expected outcome of every cell (the worst acceptable one), a row
 * per scenario, a column per store; NA: the scenario does not apply to
 * the store (why in na_why()). The stores' columns:
 *   sentinel: restart = the primary SIGKILLed, a replica promoted;
 *     failover = SENTINEL FAILOVER (the old primary demoted).
 *   cluster: the same Redis store, its lock's slot on one of three
 *     primaries (one replica each): restart = the slot's primary
 *     SIGKILLed, its replica takes over after cluster-node-timeout;
 *     failover = CLUSTER FAILOVER on that replica; reshard = the slot
 *     moved to another primary (MIGRATE), its record with it (under
 *     --mixed a read hold there is declared lost: expect()). A manual
 *     CLUSTER FAILOVER waits until the replica has caught up: held.
 *   etcd: restart-now = every member SIGKILLed and the cluster started
 *     again at once, waiters keeping their places while their leases
 *     live (or reported lost when the restart outlasts them).
 *   rediss: the redis column over TLS (rediss://, the server's TLS
 *     port): every scenario and outcome the same. */
#define H SF_HELD
#define L SF_LOST
#define F SF_FENCED
#define NA (-1)
static const int expected[SC_N][ST_N] = {
    /*                  file redis redlock zk etcd sqlite pg pg-adv mysql
     *                  sentinel cluster rediss */
    [SC_NONE] =        {H, H, H, H, H, H, H, H, H, H, H, H},
    [SC_KILL] =        {H, H, H, H, H, H, H, H, H, H, H, H},
    [SC_STOP] =        {F, F, F, F, F, F, F, F, F, F, F, F},
    [SC_RESTART] =     {NA, F, F, L, L, NA, F, F, F, F, F, F},
    [SC_PARTITION] =   {NA, F, F, F, F, NA, F, F, F, NA, NA, F},
    [SC_SLOW] =        {NA, F, F, NA, NA, NA, F, F, NA, NA, NA, F},
    [SC_CLOCK] =       {H, H, H, H, H, F, H, H, H, H, H, H},
    [SC_WKILL] =       {H, H, H, H, H, H, H, H, H, H, H, H},
    [SC_WSTOP] =       {H, H, H, H, H, H, H, H, H, H, H, H},
    [SC_SHORT] =       {H, H, H, H, H, H, H, H, H, H, H, H},
    [SC_HRESTART] =    {NA, F, NA, NA, NA, NA, NA, NA, NA, NA, NA, F},
    [SC_CONNKILL] =    {NA, NA, NA, NA, NA, NA, H, F, H, NA, NA, NA},
    [SC_RESTART_NOW] = {NA, NA, NA, NA, L, NA, F, F, F, NA, NA, NA},
    [SC_BREAK] =       {NA, F, F, F, F, F, F, F, F, F, F, F},
    [SC_FAILOVER] =    {NA, NA, NA, NA, NA, NA, NA, NA, NA, F, H, NA},
    [SC_RESHARD] =     {NA, NA, NA, NA, NA, NA, NA, NA, NA, NA, H, NA},
    [SC_CANCELS] =     {H, H, H, H, H, H, H, H, H, H, H, H},
    /* a forger sends hand-overs to the waiters: where a message carries
     * a grant (Redis, Cluster, PostgreSQL table mode), or wakes anyone
     * local (SQLite's wake-up channels) */
    [SC_FORGED] =      {NA, H, NA, NA, NA, H, H, NA, NA, H, H, H},
    /* a `dlock run` holder cut off from its store, its command's tree
     * ignoring SIGTERM: killed before the store's lease ends, and told
     * (every overlap is a violation here: run_one() sets no_overlap);
     * no lease on PostgreSQL advisory locks: the holder keeps it */
    [SC_CUTOFF] =      {NA, L, L, L, L, L, L, H, L, L, L, L},
    /* every hold a set of two (dlock_acquire_all()) of the lock and two
     * side names, named in a cycle and in random order; the victim,
     * holding the lock and a side name, frozen past its lease as in
     * stop: what stop gives, and no deadlock of the cycle */
    [SC_SETS] =        {F, F, F, F, F, F, F, F, F, F, F, F},
    /* every hold a leader's term (dlock_campaign(), dlock_resign()); the
     * leader frozen past its lease as in stop, while the runner observes
     * the election where the store has observers: what stop gives, and
     * the terms the observer reports only grow */
    [SC_ELECT] =       {F, F, F, F, F, F, F, F, F, F, F, F},
};
#undef H
#undef L
#undef F

/* options */
static int quick, mixed, nworkers = 8;
/* stores with shared holds (docs/locks.md), for --mixed */
static const int has_shared[ST_N] = {1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1};
static int want_store[ST_N], want_sc[SC_N];
static const char *table_path, *doc_path;
static char self_exe[1024];
/* the dlock binary the cutoff-run scenario runs */
#ifndef SF_DLOCK_BIN
#define SF_DLOCK_BIN "dlock"
#endif
static const char *dlock_bin = SF_DLOCK_BIN;

/* The expected outcome of a cell in this run: the table's, but for
 * --mixed on a cluster's reshard or failover, where the victim is a read
 * hold two times in three: a shared hold taken before its slot changed owners is
 * declared lost at its next renewal without a check (docs/design.md,
 * "Redis Cluster", failover of a shard: conservative, a reshard too),
 * so it is lost-and-reported there; an exclusive one is kept. */
static int expect(int k, int sc)
{
    if (mixed && k == ST_CLUSTER && (sc == SC_RESHARD || sc == SC_FAILOVER))
        return SF_LOST;
    return expected[sc][k];
}

/* results */
typedef struct cell {
    int ran;
    int outcome;          /* SF_* or SF_SKIPPED */
    char why[256];        /* skip reason, or the checker's first problem */
    sf_report rep;
    int64_t ms;
    int64_t accepted;
} cell;
static cell cells[ST_N][SC_N];

/* ------------------------------------------------------------------------ */
/* Stores                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct store {
    int kind;
    int has_lease;       /* a frozen holder loses the lock */
    int64_t ttl, ttl_restart;
    char uri[SF_URI_MAX];        /* every worker, direct */
    char part_uri[SF_URI_MAX];   /* worker 0 through the cut-able path */
    int part_netns;              /* that path is the namespace */
    th_redis redis, rl[5];
    th_sentinels sen;
    th_cluster cl;
    int cl_slot;                 /* the slot of the lock's key */
    th_zk zk;
    th_etcd etcd;
    th_sql sql;
    sf_relay *relay[5];
    int nrelay;
    char dir[600];
} store;

static sf_netns netns; /* one namespace for the whole run */
static int netns_ok;
static char netns_why[200];
static int netns_tbf; /* the kernel has no netem: a token bucket instead */

static int have_exe(const char *name)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "command -v %s >/dev/null 2>&1", name);
    return system(cmd) == 0;
}

/* 0 and the store started, or -1 and why it cannot run here. */
static int store_available(int kind, char *why, size_t cap)
{
    switch (kind) {
    case ST_FILE:
        return 0;
    case ST_REDISS:
#ifndef TH_REDIS_TLS
        snprintf(why, cap, "this build has no Redis over TLS");
        return -1;
#endif
        /* fall through */
    case ST_REDIS:
    case ST_REDLOCK:
    case ST_SENTINEL:
    case ST_CLUSTER:
        if (!have_exe("redis-server")) {
            snprintf(why, cap, "no redis-server");
            return -1;
        }
        return 0;
    case ST_ZK:
#ifndef TH_ZK_CLIENT
        snprintf(why, cap, "this build has no zk store");
        return -1;
#else
        if (!have_exe("java") ||
            access("/usr/share/java/zookeeper.jar", R_OK) != 0) {
            snprintf(why, cap, "no java or zookeeper.jar");
            return -1;
        }
        return 0;
#endif
    case ST_ETCD:
        if (!th_etcd_available()) {
            snprintf(why, cap, "etcd not installed");
            return -1;
        }
        return 0;
    case ST_SQLITE:
#ifndef TH_SQLITE
        snprintf(why, cap, "this build has no sqlite store");
        return -1;
#else
        return 0;
#endif
    case ST_PG:
    case ST_PGADV:
        if (!th_sql_available("pg")) {
            snprintf(why, cap, "no postgres store or server");
            return -1;
        }
        return 0;
    case ST_MYSQL:
        if (!th_sql_available("mysql")) {
            snprintf(why, cap, "no mysql store or MariaDB server");
            return -1;
        }
        return 0;
    }
    return -1;
}

/* Lets PostgreSQL listen on the namespace's address too (a restart). */
static void pg_listen_netns(store *st)
{
    char path[700];
    FILE *f;

    snprintf(path, sizeof(path), "%s/data/postgresql.conf", st->sql.dir);
    f = fopen(path, "a");
    if (!f)
        th_fail(__FILE__, __LINE__, "cannot append to %s", path);
    fprintf(f, "listen_addresses = '127.0.0.1,%s'\n", netns.host_ip);
    fclose(f);
    snprintf(path, sizeof(path), "%s/data/pg_hba.conf", st->sql.dir);
    f = fopen(path, "a");
    if (!f)
        th_fail(__FILE__, __LINE__, "cannot append to %s", path);
    fprintf(f, "host all all %s/32 scram-sha-256\n", netns.ns_ip);
    fclose(f);
    th_sql_kill(&st->sql, SIGINT);
    th_sql_restart(&st->sql);
}

/* A copy of uri with 127.0.0.1:PORT replaced by host:newport. */
static void swap_host(char *out, size_t cap, const char *uri,
                      const char *host, int port, int newport)
{
    char from[64];
    const char *p;

    snprintf(from, sizeof(from), "127.0.0.1:%d", port);
    p = strstr(uri, from);
    if (!p) {
        snprintf(out, cap, "%s", uri);
        return;
    }
    snprintf(out, cap, "%.*s%s:%d%s", (int)(p - uri), uri, host, newport,
             p + strlen(from));
}

static void store_start(store *st, int kind)
{
    char bind[128];

    memset(st, 0, sizeof(*st));
    st->kind = kind;
    st->has_lease = kind != ST_FILE && kind != ST_PGADV;
    st->ttl = 500;
    st->ttl_restart = 1000;
    snprintf(bind, sizeof(bind), "bind 127.0.0.1 %s\nprotected-mode no",
             netns.host_ip);
    switch (kind) {
    case ST_FILE:
        snprintf(st->dir, sizeof(st->dir), "%s/file-locks", th_tmpdir());
        snprintf(st->uri, sizeof(st->uri), "file://%s", st->dir);
        break;
    case ST_REDIS:
        th_redis_start(&st->redis, netns_ok ? bind : NULL);
        snprintf(st->uri, sizeof(st->uri), "%s", st->redis.uri);
        if (netns_ok) {
            snprintf(st->part_uri, sizeof(st->part_uri), "redis://%s:%d",
                     netns.host_ip, st->redis.port);
            st->part_netns = 1;
        }
        break;
    case ST_REDISS: {
        /* the same server with a TLS port (server-ip.crt: IP:127.0.0.1
         * and DNS:localhost); every worker on the TLS port. The
         * partitioned worker reaches it at the namespace's address,
         * which the certificate does not name: sni=localhost */
        char ca[900];
        th_redis_start_tls(&st->redis, "server-ip", 0,
                           netns_ok ? bind : NULL);
        th_tls_param(ca, sizeof(ca), "ca.crt");
        if (snprintf(st->uri, sizeof(st->uri), "rediss://127.0.0.1:%d"
                     "?cacert=%s", st->redis.tls_port, ca) >=
            (int)sizeof(st->uri))
            th_fail(__FILE__, __LINE__, "URI too long");
        if (netns_ok) {
            if (snprintf(st->part_uri, sizeof(st->part_uri),
                         "rediss://%s:%d?cacert=%s&sni=localhost",
                         netns.host_ip, st->redis.tls_port, ca) >=
                (int)sizeof(st->part_uri))
                th_fail(__FILE__, __LINE__, "URI too long");
            st->part_netns = 1;
        }
        break;
    }
    case ST_REDLOCK: {
        size_t o = (size_t)snprintf(st->uri, sizeof(st->uri), "redlock://");
        size_t q = (size_t)snprintf(st->part_uri, sizeof(st->part_uri),
                                    "redlock://");
        for (int i = 0; i < 5; i++) {
            th_redis_start(&st->rl[i], netns_ok ? bind : NULL);
            o += (size_t)snprintf(st->uri + o, sizeof(st->uri) - o,
                                  "%s127.0.0.1:%d", i ? "," : "",
                                  st->rl[i].port);
            q += (size_t)snprintf(st->part_uri + q, sizeof(st->part_uri) - q,
                                  "%s%s:%d", i ? "," : "", netns.host_ip,
                                  st->rl[i].port);
        }
        if (netns_ok)
            st->part_netns = 1;
        else
            st->part_uri[0] = '\0';
        st->ttl_restart = 2000;
        break;
    }
    case ST_ZK: {
        /* a 3-server ensemble for every scenario: the restart scenario
         * kills its leader */
        th_zk_start(&st->zk, 3);
        snprintf(st->uri, sizeof(st->uri), "zk://%s/safety", st->zk.hosts);
        /* the cut-able path: one relay per server */
        size_t q = (size_t)snprintf(st->part_uri, sizeof(st->part_uri),
                                    "zk://");
        for (int i = 0; i < 3; i++) {
            st->relay[i] = sf_relay_start(st->zk.port[i]);
            if (!st->relay[i])
                th_fail(__FILE__, __LINE__, "relay: %s", strerror(errno));
            q += (size_t)snprintf(st->part_uri + q, sizeof(st->part_uri) - q,
                                  "%s127.0.0.1:%d", i ? "," : "",
                                  sf_relay_port(st->relay[i]));
        }
        snprintf(st->part_uri + q, sizeof(st->part_uri) - q, "/safety");
        st->nrelay = 3;
        st->ttl = 1000;
        st->ttl_restart = 4000;
        break;
    }
    case ST_ETCD: {
        th_etcd_start(&st->etcd, 3);
        snprintf(st->uri, sizeof(st->uri), "etcd://%s?prefix=safety",
                 st->etcd.hosts);
        size_t q = (size_t)snprintf(st->part_uri, sizeof(st->part_uri),
                                    "etcd://");
        for (int i = 0; i < 3; i++) {
            st->relay[i] = sf_relay_start(st->etcd.port[i]);
            if (!st->relay[i])
                th_fail(__FILE__, __LINE__, "relay: %s", strerror(errno));
            q += (size_t)snprintf(st->part_uri + q, sizeof(st->part_uri) - q,
                                  "%s127.0.0.1:%d", i ? "," : "",
                                  sf_relay_port(st->relay[i]));
        }
        snprintf(st->part_uri + q, sizeof(st->part_uri) - q,
                 "?prefix=safety");
        st->nrelay = 3;
        st->ttl = 1000;
        st->ttl_restart = 3000;
        break;
    }
    case ST_SENTINEL:
        /* down after 1 s; a failover may follow another after 4 s */
        th_sentinels_start(&st->sen, "safety", 1000, 2000);
        snprintf(st->uri, sizeof(st->uri), "%s", st->sen.uri);
        st->ttl_restart = 2000;
        break;
    case ST_CLUSTER:
        /* cluster-node-timeout 2 s: a killed primary's replica takes over
         * after about that. Every worker's lock is SF_LOCK_NAME, its key
         * SF_LOCK_KEY (no prefix in the URI: the default "dlock:"): one
         * slot, on one primary at a time */
        th_cluster_start(&st->cl, 2000);
        snprintf(st->uri, sizeof(st->uri), "%s", st->cl.uri);
        st->cl_slot = th_cluster_slot(&st->cl, SF_LOCK_KEY);
        st->ttl_restart = 2000;
        break;
    case ST_SQLITE:
        snprintf(st->uri, sizeof(st->uri), "sqlite://%s/safety.db",
                 th_tmpdir());
        /* eight processes writing one database file: a statement can wait
         * for SQLite's file lock for hundreds of ms, and a 500 ms lease
         * is then lost (and reported) without any fault */
        st->ttl = 2000;
        break;
    case ST_PG:
    case ST_PGADV:
    case ST_MYSQL:
        th_sql_start(&st->sql, kind == ST_MYSQL ? "mysql" : "pg");
        if (kind == ST_PGADV)
            snprintf(st->uri, sizeof(st->uri), "%s?mode=advisory",
                     st->sql.uri);
        else
            snprintf(st->uri, sizeof(st->uri), "%s", st->sql.uri);
        if (kind != ST_MYSQL && netns_ok) {
            pg_listen_netns(st);
            swap_host(st->part_uri, sizeof(st->part_uri), st->uri,
                      netns.host_ip, st->sql.port, st->sql.port);
            st->part_netns = 1;
        } else if (kind == ST_MYSQL) {
            st->relay[0] = sf_relay_start(st->sql.port);
            if (!st->relay[0])
                th_fail(__FILE__, __LINE__, "relay: %s", strerror(errno));
            st->nrelay = 1;
            swap_host(st->part_uri, sizeof(st->part_uri), st->uri,
                      "127.0.0.1", st->sql.port, sf_relay_port(st->relay[0]));
        }
        break;
    }
}

static void store_stop(store *st)
{
    for (int i = 0; i < st->nrelay; i++)
        sf_relay_stop(st->relay[i]);
    switch (st->kind) {
    case ST_REDIS:
    case ST_REDISS:
        th_redis_kill(&st->redis, SIGKILL);
        break;
    case ST_REDLOCK:
        for (int i = 0; i < 5; i++)
            th_redis_kill(&st->rl[i], SIGKILL);
        break;
    case ST_SENTINEL:
        th_sentinels_stop(&st->sen);
        break;
    case ST_CLUSTER:
        th_cluster_stop(&st->cl);
        break;
    case ST_ZK:
        for (int i = 0; i < 3; i++)
            if (st->zk.pid[i] > 0)
                th_zk_kill(&st->zk, i, SIGKILL);
        break;
    case ST_ETCD:
        for (int i = 0; i < 3; i++)
            if (st->etcd.pid[i] > 0)
                th_etcd_kill(&st->etcd, i, SIGKILL);
        break;
    case ST_PG:
    case ST_PGADV:
    case ST_MYSQL:
        th_sql_kill(&st->sql, SIGKILL);
        break;
    }
}

/* Why a scenario does not apply to a store. */
static const char *na_why(int kind, int sc)
{
    if (sc == SC_RESHARD)
        return "only a Redis Cluster moves a lock's slot to another server";
    if (sc == SC_CUTOFF)
        return "a file lock lives with its holder's open file: no path to "
               "cut, no lease to end (tests/cli/test_stop.sh checks that "
               "dlock run stops the whole tree when it dies or its command "
               "exits)";
    if (sc == SC_FORGED)
        switch (kind) {
        case ST_FILE:
            return "no message wakes a waiter: the kernel's OFD lock decides; "
                   "the wake-up channels serve DLOCK_FAIR writers only (the "
                   "workers are not), and a byte sent to one reaches its "
                   "listener's owner, not a waiter";
        case ST_REDLOCK:
            return "its release's message was only ever a wake-up: a quorum "
                   "of keys decides (design.md, \"Pushed messages\")";
        case ST_PGADV:
        case ST_MYSQL:
            return "nothing is pushed: the waiter's own statement returns "
                   "(design.md, \"Pushed messages\")";
        default:
            return "events come on the client's own session or stream, of "
                   "changes that only writers of the lock's nodes or keys "
                   "make (design.md, \"Pushed messages\")";
        }
    if (sc == SC_FAILOVER)
        return "no replica to fail over to (the case of Redis under "
               "Sentinel and of a Redis Cluster)";
    if (kind == ST_SENTINEL && (sc == SC_PARTITION || sc == SC_SLOW))
        return "the harness binds the set to loopback only; its network "
               "faults are the other Redis columns'";
    if (kind == ST_CLUSTER && (sc == SC_PARTITION || sc == SC_SLOW))
        return "the nodes are bound to loopback and the client goes to the "
               "addresses the cluster announces (CLUSTER SLOTS), not through "
               "a relay; the one-server Redis column has the network faults";
    if ((kind == ST_SENTINEL || kind == ST_CLUSTER) && sc == SC_HRESTART)
        return "a restart across a hand-over is the one-server case; here "
               "the restart column fails the primary over";
    if (sc == SC_BREAK)
        return "a file lock is its holder's own kernel lock: nothing can "
               "take it away (dlock_break: DLOCK_ENOTSUP)";
    if (sc == SC_CONNKILL || sc == SC_RESTART_NOW)
        return kind == ST_FILE || kind == ST_SQLITE
                   ? "no server"
                   : "the SQL stores' case (waiters asleep in the server or "
                     "on its notifications); restart covers this store";
    if (sc == SC_HRESTART)
        return kind == ST_FILE || kind == ST_SQLITE
                   ? "no server to restart"
                   : "a restart across a hand-over is Redis's case (its "
                     "release hands the lock over); the restart column "
                     "covers this store";
    if (sc == SC_RESTART)
        return "no server to restart";
    if (sc == SC_PARTITION)
        return "no network between client and store";
    if (sc == SC_SLOW)
        return kind == ST_MYSQL || kind == ST_ZK || kind == ST_ETCD
                   ? "the harness binds this server to loopback only: the "
                     "relay cuts, it does not slow"
                   : "no network between client and store";
    return "not applicable";
}

/* ------------------------------------------------------------------------ */
/* One run                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct run {
    store *st;
    int sc;
    sf_shared *s;
    char shm[700];
    char clockfile[700];
    pid_t pid[SF_MAX_WORKERS];
    /* cutoff-run on Sentinel and the Cluster: relays inside the
     * namespace on every server's own address (worker 0 is in there) */
    sf_relay *mirror[6];
    int nmirror;
} run;

static void log_line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void log_line(const char *fmt, ...)
{
    va_list ap;
    static int64_t t0;

    if (!t0)
        t0 = th_now_ms();
    fprintf(stderr, "[%7.1f] ", (double)(th_now_ms() - t0) / 1000.0);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

typedef struct worker_exec {
    run *r;
    int id, in_netns, faketime;
} worker_exec;

/* In the forked child (th_fork: dies with the suite): into the namespace,
 * under libfaketime if asked, then this program again as a worker. */
static int worker_exec_child(void *arg)
{
    worker_exec *w = arg;
    char idbuf[16];

    snprintf(idbuf, sizeof(idbuf), "%d", w->id);
    if (w->in_netns && sf_netns_enter(&netns) != 0) {
        fprintf(stderr, "worker %d: setns: %s\n", w->id, strerror(errno));
        return 98;
    }
    if (w->faketime) {
        setenv("LD_PRELOAD", FAKETIME_LIB, 1);
        setenv("FAKETIME_TIMESTAMP_FILE", w->r->clockfile, 1);
        setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1", 1);
        setenv("FAKETIME_NO_CACHE", "1", 1);
    }
    execl(self_exe, self_exe, "--worker", w->r->shm, idbuf, (char *)NULL);
    return 127;
}

static pid_t spawn_worker(run *r, int id, int in_netns, int faketime)
{
    worker_exec w = {r, id, in_netns, faketime};

    return th_fork(worker_exec_child, &w);
}

static int64_t accepted(const run *r)
{
    return __atomic_load_n(&r->s->res.accepted, __ATOMIC_SEQ_CST);
}

/* Waits (bounded) until `n` more writes were accepted than `base`. */
static int wait_accepted(const run *r, int64_t base, int64_t n,
                         int64_t timeout_ms)
{
    int64_t until = th_now_ms() + timeout_ms;

    while (th_now_ms() < until) {
        if (accepted(r) >= base + n)
            return 1;
        th_sleep_ms(5);
    }
    return 0;
}

/* Writes the libfaketime spec for every worker (atomically). */
static void set_clock(const run *r, const char *spec)
{
    char tmp[760];
    FILE *f;

    snprintf(tmp, sizeof(tmp), "%s.tmp", r->clockfile);
    f = th_fopen_w(tmp);
    fprintf(f, "%s\n", spec);
    fclose(f);
    if (rename(tmp, r->clockfile) != 0)
        th_fail(__FILE__, __LINE__, "rename: %s", strerror(errno));
}

/* Redis Cluster: the node (0..5) that is the primary of the lock's slot
 * now, or -1. */
static int cl_owner(store *st)
{
    return th_cluster_owner(&st->cl, st->cl_slot);
}

/* 1 if node[i] of the cluster is up and its INFO replication has
 * `needle`. */
static int cl_info_has(store *st, int i, const char *needle)
{
    char info[4096];

    if (st->cl.node[i].pid <= 0)
        return 0;
    th_redis_cmd(&st->cl.node[i], info, sizeof(info), "INFO replication");
    return strstr(info, needle) != NULL;
}

/* The replica of primary node[p]: its shard's other node (node[p+3] for
 * node[p], node[p-3] for node[p+3]: the harness keeps replicas from
 * migrating, and a failed-over primary comes back as its replica's
 * replica), once it says so; -1 if it is down or does not. */
static int cl_replica_of(store *st, int p)
{
    char want[48];
    int q = p < 3 ? p + 3 : p - 3;

    snprintf(want, sizeof(want), "master_port:%d\r", st->cl.node[p].port);
    return cl_info_has(st, q, "role:slave") && cl_info_has(st, q, want)
               ? q
               : -1;
}

/* A primary of another shard than node[p]'s, a different one each call:
 * where a reshard moves the lock's slot; -1 if none. */
static int cl_other_primary(store *st, int p)
{
    static int turn;

    for (int k = 0; k < 6; k++) {
        int j = (turn + k) % 6;
        if (j % 3 != p % 3 && cl_info_has(st, j, "role:master")) {
            turn = j + 1;
            return j;
        }
    }
    return -1;
}

/* Starts the store fault of SC_RESTART. Returns how long to let the
 * other workers try before the victim goes on (ms). */
static int64_t restart_fault(run *r, char *note, size_t cap)
{
    store *st = r->st;

    switch (st->kind) {
    case ST_REDIS:
    case ST_REDISS: /* restarted with its TLS port */
        th_redis_kill(&st->redis, SIGKILL);
        th_redis_restart(&st->redis);
        snprintf(note, cap, "redis-server SIGKILLed, restarted empty");
        return 4000;
    case ST_REDLOCK:
        th_redis_kill(&st->rl[0], SIGKILL);
        th_redis_restart(&st->rl[0]);
        snprintf(note, cap, "node 0 of 5 SIGKILLed, restarted empty at once");
        return st->ttl_restart * 2;
    case ST_SENTINEL: {
        /* the primary dies; the sentinels promote a replica (down after
         * 1 s, then an election): the holds it had not replicated are
         * lost, the others kept */
        int p = th_sentinels_primary(&st->sen);
        if (!p)
            th_fail(__FILE__, __LINE__, "no primary named by the sentinels");
        th_redis_kill(th_sentinels_node(&st->sen, p), SIGKILL);
        int np = th_sentinels_failed_over(&st->sen, p, 30000);
        snprintf(note, cap, "the primary SIGKILLed, a replica promoted "
                 "(%s)", np ? "in time" : "NOT within 30 s");
        return 4000;
    }
    case ST_CLUSTER: {
        /* the primary of the lock's slot dies; its replica takes over
         * once the other primaries have called it failed (the
         * cluster-node-timeout, 2 s) and voted: the holds it had not
         * replicated are lost, the others kept */
        int p = cl_owner(st), q = p >= 0 ? cl_replica_of(st, p) : -1;
        if (q < 0)
            th_fail(__FILE__, __LINE__, "the slot's primary (node[%d]) has "
                    "no replica in the cluster", p);
        th_redis_kill(&st->cl.node[p], SIGKILL);
        int ok = th_cluster_owner_is(&st->cl, st->cl_slot, q, 30000);
        snprintf(note, cap, "the slot's primary node[%d] SIGKILLed, its "
                 "replica node[%d] took over (%s)", p, q,
                 ok ? "in time" : "NOT within 30 s");
        return 4000;
    }
    case ST_ZK: {
        int lead = th_zk_wait_leader(&st->zk, 10000);
        if (lead < 0)
            th_fail(__FILE__, __LINE__, "no zk leader");
        th_zk_kill(&st->zk, lead, SIGKILL);
        snprintf(note, cap, "zk leader (server %d of 3) SIGKILLed", lead);
        return st->ttl_restart;
    }
    case ST_ETCD: {
        int lead = th_etcd_wait_leader(&st->etcd, 10000);
        if (lead < 0)
            th_fail(__FILE__, __LINE__, "no etcd leader");
        th_etcd_kill(&st->etcd, lead, SIGKILL);
        snprintf(note, cap, "etcd leader (member %d of 3) SIGKILLed", lead);
        return st->ttl_restart;
    }
    case ST_PG:
    case ST_PGADV:
    case ST_MYSQL:
        /* down for longer than the lease: the holder's renewals fail
         * until its local lease end, the row's lease ends on the server */
        th_sql_kill(&st->sql, SIGKILL);
        th_sleep_ms(r->s->ttl_ms + 500);
        th_sql_restart(&st->sql);
        snprintf(note, cap, "server SIGKILLed, restarted after %lld ms",
                 (long long)(r->s->ttl_ms + 500));
        return 4000;
    }
    return 0;
}

/* Brings back what restart_fault() left down (cluster members). */
static void restart_heal(run *r)
{
    store *st = r->st;

    if (st->kind == ST_SENTINEL) {
        /* the old primary back, empty: the sentinels make it a replica;
         * waits (bounded) until it is one, in sync, so that the next
         * round or scenario starts on a settled set (the --mixed quick
         * run's clock scenario, right after this one, once saw holds
         * lost while the set was still settling: reported, but not the
         * clock's doing) */
        for (int i = 0; i < 3; i++) {
            if (st->sen.data[i].pid > 0)
                continue;
            th_redis_restart(&st->sen.data[i]);
            char info[4096] = "";
            int64_t until = th_now_ms() + 30000;
            do {
                th_sleep_ms(50);
                info[0] = '\0';
                th_redis_cmd(&st->sen.data[i], info, sizeof(info),
                             "INFO replication");
            } while (!strstr(info, "master_link_status:up") &&
                     th_now_ms() < until);
            if (!strstr(info, "master_link_status:up"))
                log_line("sentinel: data[%d] back but not a replica in "
                         "sync after 30 s", i);
        }
    } else if (st->kind == ST_CLUSTER) {
        /* the old primary back, empty but with its nodes.conf: it learns
         * that its replica has its slots now (a higher config epoch) and
         * becomes that node's replica; waits (bounded) until it is in sync,
         * so that the next round or scenario has a replica to fail over
         * to */
        for (int i = 0; i < 6; i++) {
            if (st->cl.node[i].pid > 0)
                continue;
            th_redis_restart(&st->cl.node[i]);
            int64_t until = th_now_ms() + 30000;
            while (!cl_info_has(st, i, "master_link_status:up") &&
                   th_now_ms() < until)
                th_sleep_ms(50);
            if (!cl_info_has(st, i, "master_link_status:up"))
                log_line("cluster: node[%d] back but not in sync with a "
                         "primary after 30 s", i);
        }
    } else if (st->kind == ST_ZK) {
        for (int i = 0; i < 3; i++)
            if (st->zk.pid[i] <= 0)
                th_zk_restart(&st->zk, i);
    } else if (st->kind == ST_ETCD) {
        for (int i = 0; i < 3; i++)
            if (st->etcd.pid[i] <= 0)
                th_etcd_restart(&st->etcd, i);
    }
}

static void cut(run *r, int on)
{
    store *st = r->st;

    if (r->nmirror) { /* the path is those relays alone */
        for (int i = 0; i < r->nmirror; i++)
            sf_relay_cut(r->mirror[i], on);
        return;
    }
    if (st->part_netns)
        sf_netns_link(&netns, on ? "down" : "up");
    for (int i = 0; i < st->nrelay; i++)
        sf_relay_cut(st->relay[i], on);
}

/* ------------------------------------------------------------------------ */
/* The cutoff-run scenario                                                  */
/* ------------------------------------------------------------------------ */

/* Sentinel and the Cluster: a relay inside the namespace on the address
 * of every server the victim's client may go to (the sentinels and the
 * data nodes; the cluster's six nodes, as CLUSTER SLOTS announces them);
 * 0, or -1 and why. */
static int mirror_start(run *r, char *why, size_t cap)
{
    store *st = r->st;
    int ports[6], n = 0;

    if (st->kind == ST_SENTINEL)
        for (int i = 0; i < 3; i++) {
            ports[n++] = st->sen.sent[i].port;
            ports[n++] = st->sen.data[i].port;
        }
    else
        for (int i = 0; i < 6; i++)
            ports[n++] = st->cl.node[i].port;
    for (int i = 0; i < n; i++) {
        r->mirror[i] = sf_relay_start_in(&netns, ports[i]);
        if (!r->mirror[i]) {
            snprintf(why, cap, "a relay inside the namespace on port %d: "
                     "%s", ports[i], strerror(errno));
            return -1;
        }
        r->nmirror = i + 1;
    }
    return 0;
}

static void mirror_stop(run *r)
{
    for (int i = 0; i < r->nmirror; i++)
        sf_relay_stop(r->mirror[i]);
    r->nmirror = 0;
}

/* Waits (bounded) until a write with a token above `token` was accepted:
 * another holder's (the victim's tree writes too, with its own). */
static int wait_write_above(const run *r, uint64_t token, int64_t timeout_ms)
{
    int64_t until = th_now_ms() + timeout_ms;

    while (th_now_ms() < until) {
        if (__atomic_load_n(&r->s->res.last_write_token, __ATOMIC_SEQ_CST) >
            token)
            return 1;
        th_sleep_ms(5);
    }
    return 0;
}

#ifdef TH_SQLITE
typedef struct locker_arg {
    sf_shared *s;
    const char *path;
    int64_t ms;
} locker_arg;

/* SQLite has no network to cut: another connection takes the database's
 * write lock (every acquire and renewal waits for it) for `ms`, past the
 * victim's lease, then lets go (tests/cli/test_stop.sh does the same). */
static int sqlite_locker(void *arg)
{
    locker_arg *a = arg;
    sqlite3 *db = NULL;
    int rc = 1;

    if (sqlite3_open_v2(a->path, &db, SQLITE_OPEN_READWRITE, NULL) ==
        SQLITE_OK) {
        /* the workers hold it for a statement at a time */
        sqlite3_busy_timeout(db, 10000);
        if (sqlite3_exec(db, "BEGIN EXCLUSIVE", NULL, NULL, NULL) ==
            SQLITE_OK) {
            __atomic_store_n(&a->s->locker_at, sf_now_ns(),
                             __ATOMIC_SEQ_CST);
            sf_sleep_us(a->ms * 1000);
            sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
            rc = 0;
        }
    }
    sqlite3_close(db);
    return rc;
}
#endif

/* Cuts the victim's path to the store (SQLite: the write lock taken by
 * another connection for the lease + 1 s); the moment it took effect
 * (CLOCK_MONOTONIC ns), or 0 and why in note. *locker: the SQLite
 * locker's pid, waited for by cutoff_heal(). */
static int64_t cutoff_cut(run *r, pid_t *locker, char *note, size_t cap)
{
    store *st = r->st;

    *locker = 0;
    if (st->kind != ST_SQLITE) {
        cut(r, 1);
        snprintf(note, cap, "%s", r->nmirror ? "relays inside the namespace "
                                               "cut"
                                  : st->part_netns ? "veth link down"
                                                   : "relay cut");
        return sf_now_ns();
    }
#ifdef TH_SQLITE
    /* (the child runs sqlite_locker() on its copy of `a`) */
    locker_arg a = {r->s, st->uri + strlen("sqlite://"),
                    r->s->run_ttl_ms + 1000};
    r->s->locker_at = 0;
    *locker = th_fork(sqlite_locker, &a);
    /* it waits its turn behind the workers' statements: ms */
    int64_t until = th_now_ms() + 10000;
    while (!__atomic_load_n(&r->s->locker_at, __ATOMIC_SEQ_CST) &&
           th_now_ms() < until && waitpid(*locker, NULL, WNOHANG) == 0)
        th_sleep_ms(1);
    if (!r->s->locker_at) {
        snprintf(note, cap, "INCONCLUSIVE: the database's write lock not "
                 "taken within 10 s");
        return 0;
    }
    snprintf(note, cap, "the db's write lock held %.1f s",
             (double)a.ms / 1000.0);
    return r->s->locker_at;
#else
    snprintf(note, cap, "INCONCLUSIVE: no sqlite in this build");
    return 0;
#endif
}

static void cutoff_heal(run *r, pid_t locker)
{
    if (r->st->kind != ST_SQLITE) {
        cut(r, 0);
        return;
    }
    if (locker <= 0)
        return;
    /* it lets go by itself (lease + 1 s after it took the lock) */
    int64_t until = th_now_ms() + 15000;
    while (waitpid(locker, NULL, WNOHANG) == 0 && th_now_ms() < until)
        th_sleep_ms(5);
    if (th_now_ms() >= until) {
        kill(locker, SIGKILL);
        waitpid(locker, NULL, 0);
    }
}

/* What the round showed, appended to its note: how long before the next
 * holder's acquire returned the victim's tree did its last read or write
 * (returned, in ns; negative: after it; INT64_MIN: nobody came next),
 * and how dlock run ended. */
static int64_t cutoff_note(const run *r, int vh, int64_t t_cut, char *note,
                           size_t cap)
{
    const sf_shared *s = r->s;
    const sf_hold *v = &s->holds[vh];
    int64_t last = 0, next = 0;
    uint32_t n = s->nholds > SF_MAX_HOLDS ? SF_MAX_HOLDS : s->nholds;

    for (int p = 0; p < 3; p++)
        if (v->t_proc[p] > last)
            last = v->t_proc[p];
    for (uint32_t i = 0; i < n; i++) {
        const sf_hold *h = &s->holds[i];
        if ((int)i != vh && h->t_acq_ret > t_cut &&
            (!next || h->t_acq_ret < next) && !(h->shared && v->shared))
            next = h->t_acq_ret;
    }
    size_t o = strlen(note);
    if (next)
        snprintf(note + o, cap - o, "; tree's last op %.0f ms %s the next "
                 "acquire (%.0f ms after the cut)",
                 (double)llabs(next - last) / 1e6,
                 last < next ? "before" : "AFTER",
                 (double)(next - t_cut) / 1e6);
    else
        snprintf(note + o, cap - o, "; no other holder (tree's last op "
                 "%.0f ms after the cut)",
                 (double)(last - t_cut) / 1e6);
    o = strlen(note);
    snprintf(note + o, cap - o, "; exit %d", v->run_rc);
    return next ? next - last : INT64_MIN;
}

/* The rounds of a cutoff-run, for the table: the cut, the shortest and
 * longest time from the tree's last operation to the next acquire, the
 * exit statuses of the victims' dlock runs. */
typedef struct cutoff_sum {
    int n, nexit, exits[8], alone;
    int64_t min, max;
} cutoff_sum;

static void cutoff_add(cutoff_sum *c, int64_t gap, int exit_status)
{
    if (gap == INT64_MIN) {
        c->alone++;
    } else {
        if (!c->n || gap < c->min)
            c->min = gap;
        if (!c->n || gap > c->max)
            c->max = gap;
        c->n++;
    }
    if (c->nexit < 8)
        c->exits[c->nexit++] = exit_status;
}

static void cutoff_summary(const cutoff_sum *c, const char *cut_note,
                           char *note, size_t cap)
{
    char *semi;
    size_t o;

    snprintf(note, cap, "%s", cut_note);
    if ((semi = strchr(note, ';')) != NULL)
        *semi = '\0'; /* the cut only: the rest was the first round's */
#define APPEND(...)                                                        \
    (o = strlen(note), snprintf(note + o, cap - o, __VA_ARGS__))
    if (c->nexit > 1)
        APPEND(" (each round)");
    if (c->n && c->min > 0)
        APPEND("; tree's last op %.0f-%.0f ms before the next acquire",
               (double)c->min / 1e6, (double)c->max / 1e6);
    else if (c->n)
        APPEND("; tree's last op up to %.0f ms AFTER the next acquire",
               (double)-c->min / 1e6);
    if (c->alone)
        APPEND("; %d round%s with no other holder", c->alone,
               c->alone > 1 ? "s" : "");
    for (int i = 0; i < c->nexit; i++)
        APPEND("%s%d", i ? ", " : "; exit ", c->exits[i]);
#undef APPEND
}

/* The worker a release would hand the lock to next: the head of the
 * store's queue when dlock_inspect() lists it ("... pid N tid N"), else
 * any worker waiting in dlock_acquire() for a while; never `not`. -1
 * when none shows up within 5 s. */
static int pick_waiter(run *r, dlock_client *ctl, int not)
{
    sf_shared *s = r->s;
    int64_t until = th_now_ms() + 5000, since[SF_MAX_WORKERS] = {0};

    while (th_now_ms() < until) {
        dlock_info info;
        if (ctl && dlock_inspect(ctl, SF_LOCK_NAME, &info) == DLOCK_OK) {
            const char *p = info.queue_len > 0
                                ? strstr(info.queue[0], " pid ")
                                : NULL;
            long pid = p ? atol(p + 5) : 0;
            dlock_info_clear(&info);
            for (int i = 0; pid > 0 && i < s->nworkers; i++)
                if (s->w[i].pid == pid && i != not && r->pid[i] > 0)
                    return i;
        }
        for (int i = 0; i < s->nworkers; i++) {
            if (i == not || r->pid[i] <= 0 ||
                !__atomic_load_n(&s->w[i].in_acquire, __ATOMIC_SEQ_CST)) {
                since[i] = 0;
                continue;
            }
            if (!since[i])
                since[i] = th_now_ms();
            else if (th_now_ms() - since[i] >= 50) /* its try answered */
                return i;
        }
        th_sleep_ms(5);
    }
    return -1;
}

/* How many workers are in dlock_acquire() now: waiters asleep in the
 * store (a try answers "held" within ms). */
static int waiting_now(const run *r)
{
    int n = 0;

    for (int i = 0; i < r->s->nworkers; i++)
        if (r->pid[i] > 0 &&
            __atomic_load_n(&r->s->w[i].in_acquire, __ATOMIC_SEQ_CST))
            n++;
    return n;
}

/* Waits (at most 5 s) until at least two workers have been waiting for
 * 50 ms, so that the fault finds waiters asleep in the server; returns how
 * many wait then. */
static int waiters_asleep(const run *r)
{
    int64_t until = th_now_ms() + 5000, since = 0;

    while (th_now_ms() < until) {
        if (waiting_now(r) >= 2) {
            if (!since)
                since = th_now_ms();
            else if (th_now_ms() - since >= 50)
                break;
        } else {
            since = 0;
        }
        th_sleep_ms(2);
    }
    return waiting_now(r);
}

/* Ends every connection of the store's user at the server (the
 * superuser's own is not one of them); returns how many. */
static long long kill_connections(store *st)
{
    char out[256];

    if (st->kind == ST_MYSQL) {
        long long n = th_sql_query(&st->sql, out, sizeof(out),
                                   "SELECT COUNT(*) FROM "
                                   "information_schema.PROCESSLIST WHERE "
                                   "USER = 'dlock'");
        th_sql_query(&st->sql, out, sizeof(out), "KILL CONNECTION USER dlock");
        return n;
    }
    return th_sql_query(&st->sql, out, sizeof(out),
                        "SELECT COUNT(pg_terminate_backend(pid)) FROM "
                        "pg_stat_activity WHERE usename = 'dlock' AND pid <> "
                        "pg_backend_pid()");
}

/* A scenario without victims: the workers fight and it watches, or acts
 * beside them for a while; the others inject a fault per round while a
 * victim sits between its read and its write. */
static int no_victim(int sc)
{
    return sc == SC_NONE || sc == SC_SHORT || sc == SC_CANCELS ||
           sc == SC_FORGED;
}

/* ------------------------------------------------------------------------ */
/* The forged-grant scenario                                                */
/* ------------------------------------------------------------------------ */

#define FORGER_USER "dlsafe_forger"
#define FORGER_PW "forger-pw"

/* Makes an ACL user on r that may only read and publish (`pub`:
 * "+publish" or "+spublish") on every channel. */
static void acl_forger(th_redis *r, const char *pub)
{
    if (r->pid > 0)
        th_redis_cmd(r, NULL, 0, "ACL SETUSER %s on >%s resetchannels "
                     "allchannels ~* -@all +@read %s", FORGER_USER,
                     FORGER_PW, pub);
}

/* Sets up what the forger may do on the store (an ACL user, a role) and
 * where it finds the waiters; 0, or -1 and why. */
static int forge_setup(store *st, sf_forger *f, char *why, size_t cap)
{
    memset(f, 0, sizeof(*f));
    f->rate = SF_FORGE_RATE;
    snprintf(f->user, sizeof(f->user), "%s", FORGER_USER);
    snprintf(f->password, sizeof(f->password), "%s", FORGER_PW);
    snprintf(f->key, sizeof(f->key), "%s", SF_LOCK_KEY);
    /* the store's default prefix "dlock:" (the workers' URIs set none) */
    snprintf(f->chan_prefix, sizeof(f->chan_prefix), "dlock:c:");
    switch (st->kind) {
    case ST_REDIS:
    case ST_REDISS:
        /* rediss: the same server's plain port; the message reaches the
         * waiters' TLS subscriptions all the same (a publisher's
         * transport is nothing to a subscriber) */
        f->kind = SF_FORGE_REDIS;
        acl_forger(&st->redis, "+publish");
        f->port = st->redis.port;
        return 0;
    case ST_SENTINEL: {
        int p = th_sentinels_primary(&st->sen);
        if (!p) {
            snprintf(why, cap, "no primary named by the sentinels");
            return -1;
        }
        for (int i = 0; i < 3; i++) /* ACLs are a node's own */
            acl_forger(&st->sen.data[i], "+publish");
        f->kind = SF_FORGE_REDIS;
        f->port = th_sentinels_node(&st->sen, p)->port;
        return 0;
    }
    case ST_CLUSTER: {
        int p = cl_owner(st);
        if (p < 0) {
            snprintf(why, cap, "no node owns slot %d", st->cl_slot);
            return -1;
        }
        for (int i = 0; i < 6; i++)
            acl_forger(&st->cl.node[i], "+spublish");
        f->kind = SF_FORGE_CLUSTER;
        f->port = st->cl.node[p].port;
        snprintf(f->chan_prefix, sizeof(f->chan_prefix), "dlock:{%s}c:",
                 SF_LOCK_NAME);
        return 0;
    }
    case ST_PG:
        /* NOTIFY needs no privilege: LOGIN is all the role has */
        th_sql_query(&st->sql, NULL, 0,
                     "DO $$ BEGIN CREATE ROLE " FORGER_USER " LOGIN "
                     "PASSWORD '" FORGER_PW "'; EXCEPTION WHEN "
                     "duplicate_object THEN NULL; END $$");
        f->kind = SF_FORGE_PG;
        snprintf(f->conninfo, sizeof(f->conninfo),
                 "host=127.0.0.1 port=%d dbname=postgres user=" FORGER_USER
                 " password=" FORGER_PW " connect_timeout=10",
                 st->sql.port);
        /* the harness's superuser session, as th_sql_query() opens it */
        snprintf(f->reader, sizeof(f->reader),
                 "host=%s port=%d user=dlock dbname=postgres "
                 "connect_timeout=10", st->sql.dir, st->sql.port);
        return 0;
    case ST_SQLITE: {
        /* the channels' names carry the sidecar's device and inode */
        char side[700];
        struct stat sb;
        snprintf(side, sizeof(side), "%s/safety.db-dlock", th_tmpdir());
        if (stat(side, &sb) != 0) {
            snprintf(why, cap, "%.120s: %s", side, strerror(errno));
            return -1;
        }
        f->kind = SF_FORGE_LOCAL;
        snprintf(f->chandir, sizeof(f->chandir), "%s/safety.db-dlock.d",
                 th_tmpdir());
        f->dev = (unsigned long long)sb.st_dev;
        f->ino = (unsigned long long)sb.st_ino;
        return 0;
    }
    }
    snprintf(why, cap, "no forger for this store");
    return -1;
}

typedef struct forger_arg {
    sf_shared *s;
    sf_forger f;
} forger_arg;

static int forger_child(void *arg)
{
    forger_arg *a = arg;

    return sf_forger_main(a->s, &a->f);
}

/* A forger beside the workers for 3 s (quick) or 10 s: no victim, no
 * rounds. The run is inconclusive when the forger could not start, had
 * more rights than a publisher, or reached no waiter. */
static void forged_grant(run *r, char *note, size_t cap, int *inconclusive)
{
    sf_shared *s = r->s;
    forger_arg a;
    char why[200] = "";
    int64_t ms = quick ? 3000 : 10000;

    if (forge_setup(r->st, &a.f, why, sizeof(why)) != 0) {
        snprintf(note, cap, "INCONCLUSIVE: no forger: %s", why);
        *inconclusive = 1;
        return;
    }
    a.s = s;
    /* its own bound, should the controller not stop it */
    a.f.until_ns = sf_now_ns() + (ms + 5000) * 1000000;
    s->forged_floor = SF_FORGED_TOKEN;
    int64_t w0 = accepted(r), t0 = th_now_ms();
    pid_t pid = th_fork(forger_child, &a);
    th_sleep_ms(ms);
    __atomic_store_n(&s->forge_stop, 1, __ATOMIC_SEQ_CST);
    /* a round is a read and a burst of messages: ms; 10 s is slack for a
     * busy machine, then it is killed */
    int st_ = 0, rc = -1;
    int64_t until = th_now_ms() + 10000;
    while (waitpid(pid, &st_, WNOHANG) == 0 && th_now_ms() < until)
        th_sleep_ms(10);
    if (th_now_ms() >= until) {
        kill(pid, SIGKILL);
        waitpid(pid, &st_, 0);
        log_line("the forger did not stop: killed");
    } else if (WIFEXITED(st_)) {
        rc = WEXITSTATUS(st_);
    }
    int64_t took = th_now_ms() - t0, writes = accepted(r) - w0;
    int kind = r->st->kind, fighting = 0;
    for (int i = 0; i < s->nworkers; i++)
        fighting += !__atomic_load_n(&s->w[i].exited, __ATOMIC_SEQ_CST);
    double per = s->forge_rounds ? (double)s->forge_targets /
                                       (double)s->forge_rounds : 0;
    if (kind == ST_PG)
        snprintf(note, cap, "forged %lld NOTIFYs, %.1f waiters a read, "
                 "%lld reads in %.1f s; %lld writes meanwhile",
                 (long long)s->forge_sent, per, (long long)s->forge_rounds,
                 (double)took / 1000.0, (long long)writes);
    else
        snprintf(note, cap, "forged %lld %s (%lld heard, %lld refused), "
                 "%.1f %s a read, %lld reads in %.1f s; %lld writes "
                 "meanwhile",
                 (long long)s->forge_sent,
                 kind == ST_SQLITE ? "bytes" : "grants",
                 (long long)s->forge_heard, (long long)s->forge_refused, per,
                 kind == ST_SQLITE ? "sockets" : "waiters",
                 (long long)s->forge_rounds, (double)took / 1000.0,
                 (long long)writes);
    log_line("forger (exit %d, %lld errors; %d of %d workers still "
             "fighting at its end): %s", rc, (long long)s->forge_errors,
             fighting, s->nworkers, s->forge_note);
    if (fighting < 2) {
        /* the flood's end found no waiters to forge to */
        snprintf(note, cap, "INCONCLUSIVE: %d workers left at the flood's "
                 "end", fighting);
        *inconclusive = 1;
    } else if (rc != 0 || s->forge_sent == 0 ||
               (kind != ST_PG && s->forge_heard == 0 &&
                !(kind == ST_SQLITE &&
                  s->forge_refused == s->forge_sent))) {
        char was[300];
        snprintf(was, sizeof(was), "%s", note);
        snprintf(note, cap, "INCONCLUSIVE: %s: %.200s",
                 rc == 2 ? "the forger had more rights than a publisher"
                 : rc != 0 ? "the forger failed"
                           : "no forged message reached a waiter",
                 rc != 0 ? s->forge_note : was);
        *inconclusive = 1;
    }
}

/* The elect scenario's observer (the runner's): the terms it reports
 * must only grow. */
typedef struct watched {
    pthread_mutex_t mu;
    long reports;    /* leaders reported */
    uint64_t last;   /* the last term reported */
    long backwards;  /* a term not above the last one reported */
    uint64_t bad_after, bad; /* the first such pair */
} watched;

static void on_leader(const char *name, const dlock_leader *ld, void *arg)
{
    watched *w = arg;

    (void)name;
    if (!ld->present || ld->error)
        return;
    pthread_mutex_lock(&w->mu);
    if (w->reports && ld->term < w->last && !w->backwards++) {
        w->bad_after = w->last;
        w->bad = ld->term;
    }
    if (ld->term > w->last)
        w->last = ld->term;
    w->reports++;
    pthread_mutex_unlock(&w->mu);
}

static void run_one(store *st, int sc, cell *out)
{
    run r;
    int fd;
    int64_t t0 = th_now_ms();
    int workers = nworkers;
    char note[300] = ""; /* a round's note (256) and " (each round)" */
    int use_faketime = sc == SC_CLOCK;
    int victim_only0 = sc == SC_PARTITION || sc == SC_SLOW ||
                       sc == SC_CUTOFF;
    static int seq;
    int inconclusive = 0, nvictims = 0, victims[8];
    cutoff_sum cosum = {0};
    int rounds = quick ? 1 : 3;

    memset(&r, 0, sizeof(r));
    r.st = st;
    r.sc = sc;
    snprintf(r.shm, sizeof(r.shm), "%s/run%d.shm", th_tmpdir(), seq);
    snprintf(r.clockfile, sizeof(r.clockfile), "%s/run%d.clock", th_tmpdir(),
             seq++);
    fd = open(r.shm, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)sizeof(sf_shared)) != 0)
        th_fail(__FILE__, __LINE__, "%s: %s", r.shm, strerror(errno));
    r.s = mmap(NULL, sizeof(sf_shared), PROT_READ | PROT_WRITE, MAP_SHARED,
               fd, 0);
    close(fd);
    if (r.s == MAP_FAILED)
        th_fail(__FILE__, __LINE__, "mmap: %s", strerror(errno));
    sf_resource_init(&r.s->res);
    sf_shared *s = r.s;
    s->nworkers = workers;
    /* the short lease only where the fault must outlast it; elsewhere a
     * lease that a loaded machine (2 cores, other jobs) cannot lose */
    s->ttl_ms = sc == SC_RESTART ? st->ttl_restart
                : sc == SC_RESTART_NOW && st->kind == ST_ETCD
                    ? 4000 /* a cluster's restart: 1-3 s */
                : sc == SC_STOP || sc == SC_SETS || sc == SC_ELECT ||
                        sc == SC_PARTITION || sc == SC_SLOW
                    ? st->ttl
                    : (st->ttl > 2000 ? st->ttl : 2000);
    s->flags = 0;
    s->wait_ms = 3000;
    s->short_waits = sc == SC_SHORT;
    s->cancels = sc == SC_CANCELS;
    s->mixed = mixed;
    s->sets = sc == SC_SETS;
    s->elect = sc == SC_ELECT;
    s->delay_us = 200;
    s->max_holds_per_worker = quick ? 400 : 1000;
    if (sc == SC_FORGED) {
        /* a critical section of 1 ms: waits of several ms, into which
         * the forged messages fall; and holds enough for the workers to
         * fight through the whole flood (about 500 a second here) */
        s->delay_us = 1000;
        s->max_holds_per_worker = SF_MAX_HOLDS / workers;
    }
    s->deadline_ns = sf_now_ns() + (int64_t)(quick ? 40 : 60) * 1000000000;
    s->victim_worker = -1;
    s->victim_hold = -1;
    const char *vuri = victim_only0 ? st->part_uri : st->uri;
    int vnetns = victim_only0 && st->part_netns;
    if (sc == SC_CUTOFF) {
        /* worker 0 runs `dlock run` (runner.c), 1 s leases (SQLite: its
         * 2 s), through the path that is cut: the partition's, relays
         * inside the namespace on Sentinel and the Cluster, the
         * store's own on SQLite (its write lock is what is taken) */
        s->runner = 1;
        s->no_overlap = 1;
        s->run_ttl_ms = st->ttl > 1000 ? st->ttl : 1000;
        snprintf(s->dlock_bin, sizeof(s->dlock_bin), "%s", dlock_bin);
        snprintf(s->self_exe, sizeof(s->self_exe), "%s", self_exe);
        sf_mutex_init(&s->tree_mu);
        if (st->kind == ST_SENTINEL || st->kind == ST_CLUSTER) {
            if (mirror_start(&r, note, sizeof(note)) != 0) {
                mirror_stop(&r);
                out->ran = 1;
                out->outcome = SF_INCONCLUSIVE;
                snprintf(out->why, sizeof(out->why), "INCONCLUSIVE: %.200s",
                         note);
                log_line("%-11s %-9s INCONCLUSIVE: %s", st_name[st->kind],
                         sc_name[sc], note);
                munmap(s, sizeof(*s));
                unlink(r.shm);
                return;
            }
            vuri = st->uri; /* the very addresses, through the relays */
            vnetns = 1;
        } else if (st->kind == ST_SQLITE) {
            vuri = st->uri;
        }
    }
    if (use_faketime)
        set_clock(&r, "+0");
    for (int i = 0; i < workers; i++)
        snprintf(s->w[i].uri, sizeof(s->w[i].uri), "%s",
                 i == 0 ? vuri : st->uri);
    for (int i = 0; i < workers; i++)
        r.pid[i] = spawn_worker(&r, i, i == 0 && vnetns, use_faketime);

    /* warm up: every worker has a client, some writes went through */
    int64_t until = th_now_ms() + 30000;
    for (int i = 0; i < workers; i++)
        while (!__atomic_load_n(&s->w[i].opened, __ATOMIC_SEQ_CST) &&
               th_now_ms() < until)
            th_sleep_ms(10);
    wait_accepted(&r, 0, quick ? 10 : 30, 10000);

    if (sc == SC_NONE || sc == SC_SHORT || sc == SC_CANCELS)
        wait_accepted(&r, accepted(&r), quick ? 100 : 400,
                      quick ? 3000 : 8000);
    if (sc == SC_FORGED)
        forged_grant(&r, note, sizeof(note), &inconclusive);
    if (sc == SC_SHORT)
        snprintf(note, sizeof(note), "waits of 1-10 ms, ending as the lock "
                                     "is handed over");
    if (sc == SC_CANCELS)
        snprintf(note, sizeof(note), "waits cancelled every 1-10 ms "
                                     "(dlock_cancel), as releases hand over");
    /* elect-stop: the runner observes the election, where the store has
     * observers (a term of the same leader reported twice is one) */
    static watched wt;
    dlock_client *oc = NULL;
    dlock_observer *obs = NULL;
    memset(&wt, 0, sizeof(wt));
    pthread_mutex_init(&wt.mu, NULL);
    if (sc == SC_ELECT && dlock_client_open(&oc, st->uri, NULL) == DLOCK_OK &&
        dlock_observe(oc, SF_LOCK_NAME, on_leader, &wt, &obs) != DLOCK_OK)
        obs = NULL;
    /* a client of the controller's own, to find the queue's head */
    dlock_client *ctl = NULL;
    if (sc == SC_WKILL || sc == SC_WSTOP || sc == SC_HRESTART ||
        sc == SC_BREAK)
        if (dlock_client_open(&ctl, st->uri, NULL) != DLOCK_OK)
            ctl = NULL;
    for (int round = 0; !no_victim(sc) && round < rounds && !inconclusive;
         round++) {
        char rnote[256] = "";
        /* the victim: the next holder (worker 0 for network faults) */
        s->victim_worker = -1;
        s->victim_hold = -1;
        s->victim_in_window = s->victim_go = s->victim_done = 0;
        __atomic_store_n(&s->victim_want, victim_only0 ? 1 : -1,
                         __ATOMIC_SEQ_CST);
        until = th_now_ms() + 20000;
        while (!__atomic_load_n(&s->victim_in_window, __ATOMIC_SEQ_CST) &&
               th_now_ms() < until)
            th_sleep_ms(1);
        if (!s->victim_in_window) {
            snprintf(note, sizeof(note), "INCONCLUSIVE: no victim within "
                     "20 s in round %d (the fault was not injected)",
                     round + 1);
            inconclusive = 1;
            __atomic_store_n(&s->victim_want, 0, __ATOMIC_SEQ_CST);
            break;
        }
        int vw = s->victim_worker, vh = s->victim_hold;
        pid_t vpid = r.pid[vw];
        int64_t t_cut = 0;
        char cut_note[256] = "";
        int64_t base = accepted(&r);
        int64_t lease_wait = st->has_lease ? s->ttl_ms * 3 + 4000 : 1500;
        switch (sc) {
        case SC_KILL:
            s->holds[vh].t_rel_call = sf_now_ns();
            s->holds[vh].killed = 1;
            kill(vpid, SIGKILL);
            waitpid(vpid, NULL, 0);
            r.pid[vw] = 0;
            snprintf(rnote, sizeof(rnote), "holder SIGKILLed");
            wait_accepted(&r, base, 1, lease_wait);
            /* a new worker in its place (a new id: the checker compares
             * holds of different workers) */
            if (workers < SF_MAX_WORKERS) {
                snprintf(s->w[workers].uri, sizeof(s->w[workers].uri), "%s",
                         st->uri);
                s->nworkers = workers + 1;
                r.pid[workers] = spawn_worker(&r, workers, 0, 0);
                workers++;
            }
            break;
        case SC_STOP:
        case SC_SETS:
        case SC_ELECT:
            kill(vpid, SIGSTOP);
            snprintf(rnote, sizeof(rnote), "holder SIGSTOPped");
            wait_accepted(&r, base, 1, lease_wait);
            th_sleep_ms(100);
            kill(vpid, SIGCONT);
            break;
        case SC_RESTART: {
            int64_t w = restart_fault(&r, rnote, sizeof(rnote));
            wait_accepted(&r, base, 1, w);
            restart_heal(&r);
            break;
        }
        case SC_PARTITION:
            cut(&r, 1);
            snprintf(rnote, sizeof(rnote), "%s",
                     st->part_netns ? "veth link down"
                                    : "relay cut (every connection)");
            wait_accepted(&r, base, 1, lease_wait);
            th_sleep_ms(100);
            cut(&r, 0);
            break;
        case SC_SLOW:
            netns_tbf = sf_netns_link(&netns, "slow") == 1;
            snprintf(rnote, sizeof(rnote), "%s",
                     netns_tbf ? "tbf 16 kbit/s, 300 ms queue"
                               : "netem 150 ms, 20% loss");
            th_sleep_ms(s->ttl_ms * 4);
            sf_netns_link(&netns, "clear");
            break;
        case SC_WKILL:
        case SC_WSTOP: {
            /* the waiter the release will hand the lock to, killed or
             * frozen just before the release */
            int ww = pick_waiter(&r, ctl, vw);
            if (ww < 0) {
                snprintf(rnote, sizeof(rnote), "no waiter showed up");
                inconclusive = 1;
                break;
            }
            pid_t wpid = r.pid[ww];
            if (sc == SC_WKILL) {
                kill(wpid, SIGKILL);
                waitpid(wpid, NULL, 0);
                r.pid[ww] = 0;
                snprintf(rnote, sizeof(rnote), "the next waiter SIGKILLed, "
                                               "then the holder released");
                __atomic_store_n(&s->victim_go, 1, __ATOMIC_SEQ_CST);
                wait_accepted(&r, base, 2, lease_wait);
                if (workers < SF_MAX_WORKERS) {
                    snprintf(s->w[workers].uri, sizeof(s->w[workers].uri),
                             "%s", st->uri);
                    s->nworkers = workers + 1;
                    r.pid[workers] = spawn_worker(&r, workers, 0, 0);
                    workers++;
                }
            } else {
                kill(wpid, SIGSTOP);
                snprintf(rnote, sizeof(rnote), "the next waiter SIGSTOPped, "
                                               "then the holder released");
                __atomic_store_n(&s->victim_go, 1, __ATOMIC_SEQ_CST);
                wait_accepted(&r, base, 2, lease_wait);
                th_sleep_ms(100);
                kill(wpid, SIGCONT);
            }
            break;
        }
        case SC_HRESTART: {
            /* a release hands the lock over, and the server restarts
             * empty at once, or a little later: the message may be on its
             * way, the new holder's renewal finds nothing */
            static const int delay_us[3] = {0, 200, 2000};
            if (pick_waiter(&r, ctl, vw) < 0) {
                snprintf(rnote, sizeof(rnote), "no waiter showed up");
                inconclusive = 1;
                break;
            }
            __atomic_store_n(&s->victim_go, 1, __ATOMIC_SEQ_CST);
            if (delay_us[round % 3])
                sf_sleep_us(delay_us[round % 3]);
            th_redis_kill(&st->redis, SIGKILL);
            th_redis_restart(&st->redis);
            snprintf(rnote, sizeof(rnote), "redis-server SIGKILLed as the "
                     "holder released to a waiter (0, 0.2, 2 ms later), "
                     "restarted empty");
            wait_accepted(&r, base, 2, 4000);
            break;
        }
        case SC_CONNKILL: {
            /* the holder's connections and the waiters' (asleep in
             * GET_LOCK, or LISTENing) end at once; the holder writes and
             * releases 300 ms later */
            int nw = waiters_asleep(&r);
            long long nk = kill_connections(st);
            snprintf(rnote, sizeof(rnote), "every client connection killed "
                     "at the server (%lld; %d workers waiting), then the "
                     "holder released", nk, nw);
            th_sleep_ms(300);
            __atomic_store_n(&s->victim_go, 1, __ATOMIC_SEQ_CST);
            wait_accepted(&r, base, 2, lease_wait);
            break;
        }
        case SC_RESTART_NOW: {
            /* SIGKILL and restart at once, within the lease, while
             * waiters sleep in the server; the holder goes on afterwards */
            int nw = waiters_asleep(&r);
            int64_t k0 = th_now_ms();
            if (st->kind == ST_ETCD) {
                /* no member answers until a quorum is back and has
                 * elected a leader: the waiters keep their keys while
                 * their leases live (docs/design.md, "etcd: one watch
                 * stream per client") */
                for (int i = 0; i < st->etcd.n; i++)
                    th_etcd_kill(&st->etcd, i, SIGKILL);
                th_etcd_restart_set(&st->etcd, (1u << st->etcd.n) - 1);
                snprintf(rnote, sizeof(rnote), "every member SIGKILLed with "
                         "%d workers waiting, the cluster restarted at once "
                         "(down %lld ms)", nw,
                         (long long)(th_now_ms() - k0));
            } else {
                th_sql_kill(&st->sql, SIGKILL);
                th_sql_restart(&st->sql);
                snprintf(rnote, sizeof(rnote), "server SIGKILLed with %d "
                         "workers waiting, restarted at once (down %lld ms)",
                         nw, (long long)(th_now_ms() - k0));
            }
            __atomic_store_n(&s->victim_go, 1, __ATOMIC_SEQ_CST);
            wait_accepted(&r, base, 2, lease_wait);
            break;
        }
        case SC_BREAK: {
            /* an operator breaks the lock while the victim sits between
             * its read and its write (alive, renewing): the next holder
             * must get it at once, with a higher token, so that the
             * victim's write is refused; the victim learns of it */
            dlock_info ev;
            int brc = ctl ? dlock_break(ctl, SF_LOCK_NAME, &ev) : DLOCK_ECONN;
            if (brc != DLOCK_OK) {
                snprintf(rnote, sizeof(rnote), "INCONCLUSIVE: dlock_break: "
                         "%s: %.150s", dlock_errname(brc), dlock_errmsg());
                inconclusive = 1;
                if (brc == DLOCK_ENOTHELD)
                    dlock_info_clear(&ev);
                break;
            }
            snprintf(rnote, sizeof(rnote), "dlock_break while the holder "
                     "(token %llu) sat between read and write",
                     (unsigned long long)ev.token);
            dlock_info_clear(&ev);
            /* well within the lease (>= 2 s here): the break, not the
             * lease's end, is what lets the next holder in */
            wait_accepted(&r, base, 1, lease_wait);
            break;
        }
        case SC_FAILOVER: {
            /* an operator's failover while the victim sits between its
             * read and its write: the old primary is demoted (READONLY),
             * a replica promoted */
            if (st->kind == ST_CLUSTER) {
                /* CLUSTER FAILOVER on the replica of the slot's primary:
                 * the primary pauses its clients until the replica has
                 * caught up, then the replica takes the shard's slots
                 * (the old primary answers MOVED from then on) */
                int p = cl_owner(st), q = p >= 0 ? cl_replica_of(st, p) : -1;
                int ok = q >= 0 &&
                         th_cluster_failover(&st->cl, q, NULL, 30000);
                snprintf(rnote, sizeof(rnote), "CLUSTER FAILOVER (node[%d] "
                         "over node[%d], the slot's primary) while the "
                         "holder sat between read and write (%s)", q, p,
                         ok ? "done" : "NOT done within 30 s");
                if (!ok)
                    inconclusive = 1;
                wait_accepted(&r, base, 1, lease_wait);
                break;
            }
            int p = th_sentinels_primary(&st->sen);
            int ok = p && th_redis_cmd(&st->sen.sent[round % 3], NULL, 0,
                                       "SENTINEL FAILOVER %s",
                                       st->sen.name) == 0;
            int np = ok ? th_sentinels_failed_over(&st->sen, p, 30000) : 0;
            snprintf(rnote, sizeof(rnote), "SENTINEL FAILOVER while the "
                     "holder sat between read and write (%s)",
                     np ? "done" : "NOT done within 30 s");
            if (!np)
                inconclusive = 1;
            wait_accepted(&r, base, 1, lease_wait);
            break;
        }
        case SC_RESHARD: {
            /* the lock's slot moved to another primary while the victim
             * sits between its read and its write, as redis-cli --cluster
             * reshard moves it, a stage at a time with a renewal (ttl/3)
             * in between: MIGRATING/IMPORTING (the keys still at home),
             * the keys MIGRATEd (a command on them meets ASK), the slot
             * given to the target (MOVED). The hold's record moves with
             * it: the victim keeps the lock */
            int p = cl_owner(st), to = p >= 0 ? cl_other_primary(st, p) : -1;
            if (to < 0) {
                snprintf(rnote, sizeof(rnote), "INCONCLUSIVE: no primary to "
                         "move the slot to");
                inconclusive = 1;
                break;
            }
            int64_t m0 = th_now_ms();
            /* the commands sent on with ASK during the move (the
             * holder's renewals among them) */
            long long asking = th_redis_calls(&st->cl.node[to], "asking");
            for (int stage = 1; stage <= 3; stage++) {
                th_cluster_move_slot(&st->cl, st->cl_slot, to, stage);
                if (stage < 3)
                    th_sleep_ms(s->ttl_ms / 3 + 200);
            }
            asking = th_redis_calls(&st->cl.node[to], "asking") - asking;
            snprintf(rnote, sizeof(rnote), "slot %d moved node[%d] -> "
                     "node[%d] in 3 stages under the holder (%lld ms, "
                     "%lld ASKING on the target)", st->cl_slot, p, to,
                     (long long)(th_now_ms() - m0), asking);
            wait_accepted(&r, base, 1, lease_wait);
            break;
        }
        case SC_CUTOFF: {
            /* the victim's dlock run cut off from its store while its
             * command's three processes work: dlock run must have them
             * all dead before the store's lease ends (every overlap
             * fails the cell); the controller waits for another holder's
             * write (3 of the run's leases + 4 s at most), then heals */
            pid_t locker = 0;
            uint64_t vtok = s->holds[vh].token;
            t_cut = cutoff_cut(&r, &locker, rnote, sizeof(rnote));
            snprintf(cut_note, sizeof(cut_note), "%s", rnote);
            if (!t_cut) {
                inconclusive = 1;
                break;
            }
            int took = wait_write_above(&r, vtok, st->has_lease
                                                      ? s->run_ttl_ms * 3 +
                                                            4000
                                                      : 1500);
            th_sleep_ms(100);
            cutoff_heal(&r, locker);
            if (!took && st->has_lease) {
                size_t o = strlen(rnote);
                snprintf(rnote + o, sizeof(rnote) - o, "; INCONCLUSIVE: "
                         "no other holder wrote within 3 leases + 4 s");
                inconclusive = 1;
            }
            break;
        }
        case SC_CLOCK:
            /* forward, then back: every worker's wall clock */
            set_clock(&r, round % 2 ? "+0" : "+2h");
            snprintf(rnote, sizeof(rnote), "every worker's wall clock %s",
                     round % 2 ? "back 2 h (to the true time)" : "+2 h");
            /* past the lease: a lease the jump broke shows */
            wait_accepted(&r, base, 1, s->ttl_ms + 1500);
            break;
        }
        __atomic_store_n(&s->victim_go, 1, __ATOMIC_SEQ_CST);
        until = th_now_ms() + 20000;
        if (r.pid[vw])
            while (!__atomic_load_n(&s->victim_done, __ATOMIC_SEQ_CST) &&
                   th_now_ms() < until)
                th_sleep_ms(5);
        __atomic_store_n(&s->victim_want, 0, __ATOMIC_SEQ_CST);
        if (sc == SC_CUTOFF && t_cut) {
            cutoff_add(&cosum, cutoff_note(&r, vh, t_cut, rnote,
                                           sizeof(rnote)),
                       s->holds[vh].run_rc);
            log_line("%s %s round %d: %s", st_name[st->kind], sc_name[sc],
                     round + 1, rnote);
            if (!inconclusive)
                cutoff_summary(&cosum, cut_note, rnote, sizeof(rnote));
        }
        if (sc == SC_CUTOFF && (t_cut || inconclusive))
            snprintf(note, sizeof(note), "%s", rnote); /* the rounds' sum */
        else if (round == 0)
            snprintf(note, sizeof(note), "%s%s", rnote,
                     rounds > 1 ? " (each round)" : "");
        if (vh >= 0 && nvictims < 8)
            victims[nvictims++] = vh;
        /* afterwards the lock works again */
        wait_accepted(&r, accepted(&r), quick ? 10 : 30, 10000);
    }
    if (ctl)
        dlock_client_close(ctl);
    __atomic_store_n(&s->stop, 1, __ATOMIC_SEQ_CST);
    until = th_now_ms() + 20000;
    for (int i = 0; i < workers; i++) {
        if (!r.pid[i])
            continue;
        int st_;
        while (waitpid(r.pid[i], &st_, WNOHANG) == 0 && th_now_ms() < until)
            th_sleep_ms(10);
        if (th_now_ms() >= until) {
            kill(r.pid[i], SIGCONT);
            kill(r.pid[i], SIGKILL);
            waitpid(r.pid[i], NULL, 0);
            log_line("worker %d did not stop: killed", i);
        }
    }
    mirror_stop(&r);
    sf_check(s, &out->rep);
    if (sc == SC_ELECT) {
        dlock_observer_close(obs);
        dlock_client_close(oc);
        char on[200];
        if (!obs)
            snprintf(on, sizeof(on), "no observer on this store");
        else if (wt.backwards)
            snprintf(on, sizeof(on), "OBSERVER: term %llu reported after "
                     "%llu (%ld times)",
                     (unsigned long long)wt.bad,
                     (unsigned long long)wt.bad_after, wt.backwards);
        else
            snprintf(on, sizeof(on), "observer: %ld leaders, terms only "
                     "grew", wt.reports);
        size_t nl = strlen(note);
        snprintf(note + nl, sizeof(note) - nl, "%s%s", nl ? "; " : "", on);
        if (obs && wt.backwards)
            out->rep.outcome = SF_VIOLATED;
        if (obs && wt.reports == 0 && !inconclusive) {
            snprintf(note, sizeof(note), "INCONCLUSIVE: the observer "
                                         "reported no leader");
            inconclusive = 1;
        }
    }
    if (out->rep.holds == 0 && !inconclusive) {
        /* nothing was tried: no history says held (seen when a store's
         * module was not built: every worker failed to open) */
        snprintf(note, sizeof(note), "INCONCLUSIVE: no hold was made");
        inconclusive = 1;
    }
    out->ran = 1;
    out->outcome = inconclusive && out->rep.outcome < SF_VIOLATED
                       ? SF_INCONCLUSIVE : out->rep.outcome;
    out->accepted = s->res.accepted;
    out->ms = th_now_ms() - t0;
    /* the note first; the checker's detail fills what is left (cut) */
    snprintf(out->why, sizeof(out->why), "%.120s%s%.120s", note,
             out->rep.detail[0] ? "; " : "", out->rep.detail);
    {
        int64_t errs = 0, busy = 0;
        const char *last = "";
        for (int i = 0; i < workers; i++) {
            errs += s->w[i].errors;
            busy += s->w[i].busy;
            if (s->w[i].last_err[0])
                last = s->w[i].last_err;
        }
        log_line("%-11s %-9s %-17s %5lld ms  holds %d  writes %lld  "
                 "overlaps %d (reported %d, silent %d)  refused %d  lost "
                 "%d  tokens back %d  forged %d  errors %lld  busy %lld  "
                 "%s%s%s",
                 st_name[st->kind], sc_name[sc], sf_outcome_name(out->outcome),
                 (long long)out->ms, out->rep.holds,
                 (long long)out->accepted, out->rep.overlaps,
                 out->rep.overlaps_reported, out->rep.overlaps_silent,
                 out->rep.stale_rejected, out->rep.lost_reported,
                 out->rep.token_backwards, out->rep.forged_tokens,
                 (long long)errs, (long long)busy, out->why,
                 last[0] ? "; last error: " : "", last);
    }
    if (strlen(out->rep.detail) > 120) /* cut in the line above */
        log_line("    the checker: %s", out->rep.detail);
    for (uint32_t i = 0, shown = 0; i < s->nholds && i < SF_MAX_HOLDS &&
                                    shown < 3; i++) {
        const sf_hold *h = &s->holds[i];
        if (h->victim || !h->done ||
            (h->rel_rc != DLOCK_ELOST && !h->lost_cb))
            continue;
        shown++;
        log_line("    also lost: worker %d token %llu, acquire took %.0f ms, "
                 "held %.0f ms, release %s%s%s", h->worker,
                 (unsigned long long)h->token,
                 (double)(h->t_acq_ret - h->t_acq_call) / 1e6,
                 (double)(h->t_rel_call - h->t_acq_ret) / 1e6,
                 dlock_errname(h->rel_rc), h->lost_cb ? ", callback: " : "",
                 h->lost_msg);
    }
    for (int k = 0; k < nvictims; k++) {
        const sf_hold *v = &s->holds[victims[k]];
        if (v->run) {
            static const char *const who[3] = {"command", "child",
                                               "setsid grandchild"};
            log_line("    victim: dlock run%s exit %d, token %llu%s%s",
                     v->shared ? " --shared" : "", v->run_rc,
                     (unsigned long long)v->token,
                     v->lost_cb ? "; it said: " : "", v->lost_msg);
            for (int p = 0; p < 3; p++)
                log_line("      %s pid %d: %d reads and writes (%d "
                         "refused), the last %.0f ms after the start",
                         who[p], v->proc_pid[p], v->proc_ops[p],
                         v->proc_refused[p],
                         v->t_proc[p] ? (double)(v->t_proc[p] -
                                                 v->t_acq_ret) / 1e6
                                      : 0.0);
            continue;
        }
        log_line("    victim: worker %d token %llu, held %.0f ms, write %s, "
                 "release %s%s%s%s", v->worker, (unsigned long long)v->token,
                 (double)((v->t_rel_call ? v->t_rel_call : sf_now_ns()) -
                          v->t_acq_ret) / 1e6,
                 v->write_res == SF_W_ACCEPTED ? "accepted"
                 : v->write_res == SF_W_NONE   ? "none"
                                               : "refused",
                 v->killed ? "none (killed)" : dlock_errname(v->rel_rc),
                 v->lost_cb ? ", lost callback: " : "", v->lost_msg,
                 v->lost_cb ? "" : "");
    }
    munmap(s, sizeof(*s));
    unlink(r.shm);
}

/* ------------------------------------------------------------------------ */
/* The table                                                                */
/* ------------------------------------------------------------------------ */

static int worse(const cell *c, int exp)
{
    return c->ran && exp >= 0 &&
           (c->outcome == SF_INCONCLUSIVE ||
            (c->outcome != SF_SKIPPED && c->outcome > exp));
}

/* "| scenario | store | ..." and its rule, for the stores asked for. */
static void table_head(FILE *f)
{
    fprintf(f, "| scenario |");
    for (int k = 0; k < ST_N; k++)
        if (want_store[k])
            fprintf(f, " %s |", st_name[k]);
    fprintf(f, "\n|---|");
    for (int k = 0; k < ST_N; k++)
        if (want_store[k])
            fprintf(f, "---|");
    fprintf(f, "\n");
}

static void write_table(FILE *f, int64_t total_ms)
{
    fprintf(f, "Run: `%s` — %d workers, %.0f s.\n\n",
            quick ? "make safety SAFETY_QUICK=1" : "make safety", nworkers,
            (double)total_ms / 1000.0);
    table_head(f);
    for (int sc = 0; sc < SC_N; sc++) {
        if (!want_sc[sc])
            continue;
        fprintf(f, "| %s |", sc_name[sc]);
        for (int k = 0; k < ST_N; k++) {
            if (!want_store[k])
                continue;
            const cell *c = &cells[k][sc];
            int exp = expect(k, sc);
            if (exp < 0)
                fprintf(f, " n/a |");
            else if (!c->ran || c->outcome == SF_SKIPPED)
                fprintf(f, " skipped |");
            else if (!worse(c, exp))
                fprintf(f, " %s |", sf_outcome_name(c->outcome));
            else
                fprintf(f, " **%s** (expected at worst %s: FAIL) |",
                        sf_outcome_name(c->outcome), sf_outcome_name(exp));
        }
        fprintf(f, "\n");
    }
    fprintf(f, "\nExpected, at worst (a cell fails when its outcome is "
               "worse):\n\n");
    table_head(f);
    for (int sc = 0; sc < SC_N; sc++) {
        if (!want_sc[sc])
            continue;
        fprintf(f, "| %s |", sc_name[sc]);
        for (int k = 0; k < ST_N; k++)
            if (want_store[k])
                fprintf(f, " %s |", expect(k, sc) < 0
                                         ? "n/a"
                                         : sf_outcome_name(expect(k, sc)));
        fprintf(f, "\n");
    }
    fprintf(f, "\nSkipped or not applicable:\n\n");
    for (int k = 0; k < ST_N; k++)
        for (int sc = 0; sc < SC_N; sc++) {
            const cell *c = &cells[k][sc];
            if (!want_store[k] || !want_sc[sc])
                continue;
            if (expect(k, sc) < 0)
                fprintf(f, "- %s × %s: n/a, %s\n", sc_name[sc], st_name[k],
                        na_why(k, sc));
            else if (!c->ran || c->outcome == SF_SKIPPED)
                fprintf(f, "- %s × %s: %s\n", sc_name[sc], st_name[k],
                        c->why[0] ? c->why : "not run");
        }
    fprintf(f, "\nWhat happened in each run (the victim's fault, then the "
               "checker's counts):\n\n");
    fprintf(f, "| store | scenario | outcome | holds | writes | overlaps "
               "(reported/silent) | refused by the fence | holders told "
               "of a loss | fault |\n|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < ST_N; k++)
        for (int sc = 0; sc < SC_N; sc++) {
            const cell *c = &cells[k][sc];
            if (!c->ran || c->outcome == SF_SKIPPED)
                continue;
            fprintf(f, "| %s | %s | %s | %d | %lld | %d (%d/%d) | %d | %d | "
                       "%s |\n",
                    st_name[k], sc_name[sc], sf_outcome_name(c->outcome),
                    c->rep.holds, (long long)c->accepted, c->rep.overlaps,
                    c->rep.overlaps_reported, c->rep.overlaps_silent,
                    c->rep.stale_rejected, c->rep.lost_reported, c->why);
        }
}

static void splice_doc(const char *path, const char *table)
{
    const char *b = mixed ? "<!-- safety-mixed-table:begin -->"
                          : "<!-- safety-table:begin -->";
    const char *e = mixed ? "<!-- safety-mixed-table:end -->"
                          : "<!-- safety-table:end -->";
    FILE *f = fopen(path, "r");
    char *doc = NULL, *p, *q;
    long len;

    if (!f) {
        fprintf(stderr, "safety: cannot read %s\n", path);
        return;
    }
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    doc = calloc(1, (size_t)len + 1);
    if (!doc || fread(doc, 1, (size_t)len, f) != (size_t)len) {
        fclose(f);
        free(doc);
        return;
    }
    fclose(f);
    p = strstr(doc, b);
    q = p ? strstr(p, e) : NULL;
    if (!p || !q) {
        fprintf(stderr, "safety: %s has no %s ... %s markers\n", path, b, e);
        free(doc);
        return;
    }
    f = fopen(path, "w");
    if (f) {
        fprintf(f, "%.*s%s\n\n%s\n%s", (int)(p - doc + (long)strlen(b)), doc,
                "", table, q);
        fclose(f);
    }
    free(doc);
}

/* ------------------------------------------------------------------------ */

static void parse_list(const char *arg, const char *const *names, int n,
                       int *want)
{
    char buf[512], *save = NULL;

    memset(want, 0, sizeof(int) * (size_t)n);
    snprintf(buf, sizeof(buf), "%s", arg);
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int i = 0; i < n; i++)
            if (!strcmp(t, names[i]))
                want[i] = found = 1;
        if (!found) {
            fprintf(stderr, "safety: unknown name '%s'\n", t);
            exit(2);
        }
    }
}

static int failed;

static void suite(void)
{
    int64_t t0 = th_now_ms();

    sf_netns_reap_stale();
    if (sf_netns_create(&netns, netns_why, sizeof(netns_why)) == 0)
        netns_ok = 1;
    else
        log_line("no network namespace: %s (partition through relays)",
                 netns_why);
    for (int k = 0; k < ST_N; k++) {
        char why[256] = "";
        int any = 0;
        if (!want_store[k])
            continue;
        for (int sc = 0; sc < SC_N; sc++)
            any |= want_sc[sc] && expect(k, sc) >= 0;
        if (!any)
            continue;
        if (mixed && !has_shared[k])
            snprintf(why, sizeof(why), "no shared holds on this store yet "
                                       "(docs/locks.md)");
        if (why[0] || store_available(k, why, sizeof(why)) != 0) {
            log_line("%s: skipped: %s", st_name[k], why);
            for (int sc = 0; sc < SC_N; sc++) {
                cells[k][sc].outcome = SF_SKIPPED;
                snprintf(cells[k][sc].why, sizeof(cells[k][sc].why), "%s",
                         why);
            }
            continue;
        }
        store st;
        int64_t ts = th_now_ms();
        store_start(&st, k);
        log_line("%s: started in %lld ms (%s)", st_name[k],
                 (long long)(th_now_ms() - ts), st.uri);
        for (int sc = 0; sc < SC_N; sc++) {
            cell *c = &cells[k][sc];
            if (!want_sc[sc] || expect(k, sc) < 0)
                continue;
            if ((sc == SC_PARTITION || sc == SC_SLOW) && !st.part_uri[0]) {
                c->outcome = SF_SKIPPED;
                snprintf(c->why, sizeof(c->why), "no namespace: %s",
                         netns_why);
                continue;
            }
            if (sc == SC_SLOW && !st.part_netns) {
                c->outcome = SF_SKIPPED;
                snprintf(c->why, sizeof(c->why), "needs the namespace");
                continue;
            }
            if (sc == SC_CUTOFF && access(dlock_bin, X_OK) != 0) {
                c->outcome = SF_SKIPPED;
                snprintf(c->why, sizeof(c->why), "no dlock binary at %.200s",
                         dlock_bin);
                continue;
            }
            if (sc == SC_CUTOFF &&
                (k == ST_SENTINEL || k == ST_CLUSTER ? !netns_ok
                 : k != ST_SQLITE && !st.part_uri[0])) {
                c->outcome = SF_SKIPPED;
                snprintf(c->why, sizeof(c->why), "no namespace: %s",
                         netns_why);
                continue;
            }
            if (sc == SC_CLOCK && !th_faketime_available()) {
                c->outcome = SF_SKIPPED;
                snprintf(c->why, sizeof(c->why), "libfaketime not installed");
                continue;
            }
            run_one(&st, sc, c);
            if (worse(c, expect(k, sc))) {
                failed = 1;
                log_line("FAIL: %s × %s: %s, expected at worst %s", sc_name[sc],
                         st_name[k], sf_outcome_name(c->outcome),
                         sf_outcome_name(expect(k, sc)));
            }
        }
        store_stop(&st);
    }
    if (netns_ok)
        sf_netns_destroy(&netns);

    char *buf = NULL;
    size_t blen = 0;
    FILE *m = open_memstream(&buf, &blen);
    if (!m)
        th_fail(__FILE__, __LINE__, "open_memstream");
    write_table(m, th_now_ms() - t0);
    fclose(m);
    printf("\n%s\n", buf);
    if (table_path) {
        FILE *f = fopen(table_path, "w");
        if (f) {
            fputs(buf, f);
            fclose(f);
        }
    }
    if (doc_path)
        splice_doc(doc_path, buf);
    free(buf);
    printf("safety: %s (%.0f s)\n", failed ? "FAILED: an outcome is worse "
                                            "than expected" : "ok",
           (double)(th_now_ms() - t0) / 1000.0);
}

int main(int argc, char **argv)
{
    static const th_test tests[] = {{"safety", suite, 0, 0},
                                    {NULL, NULL, 0, 0}};
    ssize_t n;
    int sc_given = 0;

    if (argc == 4 && !strcmp(argv[1], "--worker"))
        return sf_worker_main(argv[2], atoi(argv[3]));
    if (argc == 4 && !strcmp(argv[1], "--tree"))
        return sf_tree_main(argv[2], atoi(argv[3]));
    n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
    if (n <= 0)
        return 2;
    self_exe[n] = '\0';
    for (int i = 0; i < ST_N; i++)
        want_store[i] = 1;
    for (int i = 0; i < SC_N; i++)
        want_sc[i] = 1;
    if (getenv("SAFETY_QUICK") && *getenv("SAFETY_QUICK") &&
        strcmp(getenv("SAFETY_QUICK"), "0") != 0)
        quick = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            quick = 1;
        else if (!strcmp(argv[i], "--mixed"))
            mixed = 1;
        else if (!strcmp(argv[i], "--stores") && i + 1 < argc)
            parse_list(argv[++i], st_name, ST_N, want_store);
        else if (!strcmp(argv[i], "--scenarios") && i + 1 < argc) {
            parse_list(argv[++i], sc_name, SC_N, want_sc);
            sc_given = 1;
        }
        else if (!strcmp(argv[i], "--workers") && i + 1 < argc)
            nworkers = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--table") && i + 1 < argc)
            table_path = argv[++i];
        else if (!strcmp(argv[i], "--doc") && i + 1 < argc)
            doc_path = argv[++i];
        else if (!strcmp(argv[i], "--dlock") && i + 1 < argc)
            dlock_bin = argv[++i];
        else {
            fprintf(stderr,
                    "usage: %s [--quick] [--mixed] [--stores a,b] "
                    "[--scenarios x,y] [--workers N] [--table FILE] "
                    "[--doc FILE] [--dlock PATH]\n",
                    argv[0]);
            return 2;
        }
    }
    /* the quick form leaves out the slow link (the longest fault that
     * has never found anything the partition does not) */
    if (quick && !sc_given)
        want_sc[SC_SLOW] = 0;
    if (nworkers < 2 || nworkers > SF_MAX_WORKERS - 3) {
        fprintf(stderr, "safety: 2 to %d workers\n", SF_MAX_WORKERS - 3);
        return 2;
    }
    if (getuid() != 0)
        log_line("not root: no network namespace (relays instead)");
    th_main(1, argv, tests);
    return failed ? 1 : 0;
}
