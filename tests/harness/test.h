/* SPDX-License-Identifier: MIT */
/*
 * test.h -- a small test harness: checks that never compile out and print
 * both sides, a test list runner, and helpers to run real stores.
 *
 * A test binary's main() calls th_main(argc, argv, tests) with a
 * NULL-terminated table; `binary [filter]` runs the tests whose name
 * contains filter. Exit 0 = all passed, 1 = a failure, 77 = skipped.
 */
#ifndef DLOCK_TEST_H
#define DLOCK_TEST_H

#include <dlock.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

typedef struct th_test {
    const char *name;
    void (*fn)(void);
    int kernel_wait; /* see TK() */
    int procs;       /* see TP() */
} th_test;

#define TEST(name) static void name(void)
#define T(name) {#name, name, 0, 0}
/* A test in which a thread blocks in F_OFD_SETLKW while another thread of
 * the same process must run. valgrind 3.19 runs that fcntl holding its
 * global lock (it does not know the call blocks), so the whole process
 * stalls; with DLOCK_TEST_VALGRIND set, such tests are skipped. They run
 * in every other build, ASan included. */
#define TK(name) {#name, name, 1, 0}
/* A test that needs another process (a holder killed, frozen, or just
 * elsewhere): skipped on the in-process store (mem://), whose locks no
 * other process sees. A test not marked so that forks there fails,
 * naming the mark it needs (th_fork()). TKP: both marks. */
#define TP(name) {#name, name, 0, 1}
#define TKP(name) {#name, name, 1, 1}

/* Set by th_store_start() for the in-process store: tests marked TP()
 * are skipped, and th_fork() fails the test. */
extern int th_in_process;

void th_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));

#define CHECK(cond)                                                         \
    do {                                                                    \
        if (!(cond))                                                        \
            th_fail(__FILE__, __LINE__, "CHECK(%s) failed", #cond);         \
    } while (0)

#define CHECK_EQ(a, b)                                                      \
    do {                                                                    \
        long long a_ = (long long)(a), b_ = (long long)(b);                 \
        if (a_ != b_)                                                       \
            th_fail(__FILE__, __LINE__, "%s == %s failed: %lld != %lld",    \
                    #a, #b, a_, b_);                                        \
    } while (0)

#define CHECK_OP(a, op, b)                                                  \
    do {                                                                    \
        long long a_ = (long long)(a), b_ = (long long)(b);                 \
        if (!(a_ op b_))                                                    \
            th_fail(__FILE__, __LINE__, "%s %s %s failed: %lld vs %lld",    \
                    #a, #op, #b, a_, b_);                                   \
    } while (0)

#define CHECK_STR(a, b)                                                     \
    do {                                                                    \
        const char *a_ = (a), *b_ = (b);                                    \
        if (strcmp(a_, b_) != 0)                                            \
            th_fail(__FILE__, __LINE__, "%s == %s failed: \"%s\" != \"%s\"", \
                    #a, #b, a_, b_);                                        \
    } while (0)

#define CHECK_CONTAINS(hay, needle)                                         \
    do {                                                                    \
        const char *h_ = (hay), *n_ = (needle);                             \
        if (!strstr(h_, n_))                                                \
            th_fail(__FILE__, __LINE__, "\"%s\" does not contain \"%s\"",   \
                    h_, n_);                                                \
    } while (0)

/* Checks that a dlock call returns `code`, printing the message if not. */
#define CHECK_RC(expr, code)                                                \
    do {                                                                    \
        int rc_ = (expr);                                                   \
        if (rc_ != (code))                                                  \
            th_fail(__FILE__, __LINE__, "%s returned %s, expected %s: %s",  \
                    #expr, dlock_errname(rc_), dlock_errname(code),         \
                    dlock_errmsg());                                        \
    } while (0)

#define CHECK_OK(expr) CHECK_RC(expr, DLOCK_OK)

/* Exits 77: the test binary is skipped. */
void th_skip(const char *why) __attribute__((noreturn));

int th_main(int argc, char **argv, const th_test *tests);
/* Call first in main() of a binary that uses th_skewed_holder(): runs the
 * harness's own child process and exits; returns at once otherwise. */
void th_child(int argc, char **argv);

/* Client options with a 10 s timeout, for the clients of processes forked
 * to contend for a lock: their tests are about exclusion and order, not
 * time, and under valgrind, several of them logging in at once (a
 * PostgreSQL SCRAM login is thousands of hashes) can pass the default 2 s. */
const dlock_client_options *th_patient(void);

/* A client of `uri` (`o`: NULL for the defaults, or th_patient()), and a
 * handle on `name` with ttl_ms `ttl`, `flags` and `permits` (0: the
 * defaults); each fails the test, naming the call, when it cannot be
 * opened. The suites' own client()/handle() are these with their store's
 * URI. */
dlock_client *th_client(const char *uri, const dlock_client_options *o);
dlock *th_handle(dlock_client *c, const char *name, int64_t ttl,
                 unsigned flags, unsigned permits);
/* A handle on `name` with options o (e.g. a compound literal), failing
 * the test, naming the call, when it cannot be opened. */
dlock *th_open(dlock_client *c, const char *name, const dlock_options *o);
/* th_handle() with `cb` as its on_lost callback and `arg` as its
 * on_lost_arg (permits 0). */
dlock *th_handle_lost(dlock_client *c, const char *name, int64_t ttl,
                      unsigned flags, dlock_lost_cb cb, void *arg);
/* How many wait for `name`: dlock_inspect()'s waiters (fails the test
 * when inspect does). */
int64_t th_waiters(dlock_client *c, const char *name);
/* dlock_inspect() of `name` (fails the test when it fails); the caller
 * clears it. */
dlock_info th_info(dlock_client *c, const char *name);
/* Fails the test unless dlock_inspect() of `name` says it is held (held
 * 1) or not (0) and has `holders` holders; -1: either not checked. */
void th_check_held(dlock_client *c, const char *name, int held,
                   int64_t holders);
/* Waits (at most 10 s) until `name` has n waiters and h holders (h < 0:
 * any number), and fails the test when it has not. */
void th_wait_state(dlock_client *c, const char *name, int64_t n, int64_t h);
/* Waits (at most 10 s, a busy machine) until `name` has n waiters, and
 * fails the test when it has not. The test's own look at the store, to
 * order its steps. */
void th_wait_waiters(dlock_client *c, const char *name, int64_t n);
/* Waits (at most ms) until `name` has at least n waiters: 1; 0 at once
 * when the store cannot tell (waiters -1); fails the test when ms pass. */
int th_wait_queued(dlock_client *c, const char *name, int64_t n, int64_t ms);
/* dlock_acquire(l, ms) on a lock the test holds elsewhere, failing the
 * test unless it ends DLOCK_EBUSY. A short wait whose store gave no
 * answer in time (DLOCK_ECONN: a busy machine, an ASan build) never saw
 * the lock held, so it is tried again with four times the wait, at most
 * four tries: what the caller checks is that the wait saw the lock held
 * and gave up, not how fast the store answers. */
void th_acquire_busy(dlock *l, int64_t ms);
/* dlock_break() of `name` through op, failing the test unless it
 * succeeds and its report counts `holders` holders, `permits` permits
 * (0: a lock, not a semaphore) and `waiters` waiters (-1: not checked). */
void th_break_counts(dlock_client *op, const char *name, int64_t holders,
                     int64_t permits, int64_t waiters);
/* A new client of `uri` (th_patient()) takes `name` (ttl 30 s, a 5 s
 * wait), fails the test unless its token is above `above`, and lets it
 * go: the store's fencing after a failover or a lost hold. */
void th_next_token_above(const char *uri, const char *name, uint64_t above);

/* Closes handles (TH_CLOSE(la, lb)) or clients (TH_CLIENT_CLOSE(a, b)),
 * in the order given: dlock_close() or dlock_client_close() each. */
void th_close_n(dlock **l, size_t n);
/* Releases (failing the test unless each release succeeds) and closes
 * the n held handles of l, in order. */
void th_release_close(dlock **l, size_t n);
void th_client_close_n(dlock_client **c, size_t n);
#define TH_CLOSE(...)                                                        \
    th_close_n((dlock *[]){__VA_ARGS__},                                     \
               sizeof((dlock *[]){__VA_ARGS__}) / sizeof(dlock *))
#define TH_CLIENT_CLOSE(...)                                                 \
    th_client_close_n((dlock_client *[]){__VA_ARGS__},                       \
                      sizeof((dlock_client *[]){__VA_ARGS__}) /              \
                          sizeof(dlock_client *))

/* Monotonic milliseconds. */
int64_t th_now_ms(void);
void th_sleep_ms(int64_t ms);

/* Waits (ms at most) until *flag, set by another thread or by a forked
 * child in th_shared() memory, is nonzero; returns its value (0: timed
 * out). For a child's "my call has returned": a store shows a hold a
 * moment before the holder's call returns. Use as CHECK(th_wait_flag()). */
int th_wait_flag(volatile int *flag, int64_t ms);

/* fopen(path, "w"), failing the test when it cannot. */
FILE *th_fopen_w(const char *path);

/* A fresh directory under $TMPDIR (or /tmp), removed at exit. */
const char *th_tmpdir(void);

/* Shared anonymous memory, visible to forked children. */
void *th_shared(size_t size);

/* Forks; the child runs fn(arg) and exits with its return value. */
pid_t th_fork(int (*fn)(void *), void *arg);
/* Waits for pid; returns its exit status, or 128+signal. */
int th_wait(pid_t pid);
/* SIGKILLs child pid, stopped (SIGSTOP) or not, and reaps it; fails the
 * test unless it died of that SIGKILL. */
void th_kill_stopped(pid_t pid);
/* Forks n processes (at most TH_OPEN_TOGETHER_MAX) that open a client of
 * `uri` at the same moment, and fails the test unless every open
 * succeeds: stores that make their tables on a client's first open. */
#define TH_OPEN_TOGETHER_MAX 16
void th_open_together(const char *uri, int n);

/* --- a private redis-server on a free loopback port --- */
typedef struct th_redis {
    int port;
    pid_t pid;
    char dir[512];
    char sock[600];
    char uri[128];
    char extra[1024];
    int sentinel; /* started as redis-server --sentinel */
    /* th_redis_start_tls() only (tls_port 0: no TLS port) */
    int tls_port;
    int tls_auth_clients; /* tls-auth-clients yes: a client certificate */
    char tls_cert[32];    /* "server", "server-ip", "expired" */
    char tls_uri[1200];   /* rediss://localhost:TLS_PORT?cacert=... */
} th_redis;

/* Starts redis-server (fails the test if it cannot). `extra` is appended
 * to its config (may be NULL). */
void th_redis_start(th_redis *r, const char *extra);
/* Starts it again on the same port (after a kill or stop); a server
 * started with th_redis_start_tls() gets its TLS port and certificate
 * back too. */
void th_redis_restart(th_redis *r);

/* --- Redis over TLS (tls.c) ---
 * The test certificates, made once per process by
 * tests/servers/tlscerts.sh in a directory under th_tmpdir(): ca.crt (the
 * test CA), server.crt/.key (SAN DNS:localhost only), server-ip.crt/.key
 * (SAN IP:127.0.0.1 and DNS:localhost), expired.crt/.key (DNS:localhost,
 * valid 2020-2021 only), client.crt/.key (a client certificate),
 * other-ca.crt/.key (a CA that signed nothing used here), mismatch.key (a
 * key of no certificate). Returns the directory; fails the test when
 * openssl cannot make them. */
const char *th_tls_certs(void);
/* The path of `file` in th_tls_certs(), percent-escaped for a URI
 * parameter (every byte but [A-Za-z0-9._~/-] as %XX), in out; returns
 * out. */
char *th_tls_param(char *out, size_t cap, const char *file);
/* Starts redis-server with a plain port (r->port, r->uri, r->sock as
 * th_redis_start) and a TLS port (r->tls_port) on 127.0.0.1 (and ::1 when
 * the machine has it: "localhost" may resolve to either), serving
 * th_tls_certs()' CERT.crt and CERT.key (cert: "server", "server-ip" or
 * "expired"), trusting ca.crt for client certificates, which it demands
 * when auth_clients is 1 (tls-auth-clients yes; else no). `extra` is
 * appended to its config. r->tls_uri is
 * rediss://localhost:TLS_PORT?cacert=CERTS/ca.crt, with
 * &cert=CERTS/client.crt&key=CERTS/client.key when auth_clients is 1.
 * Fails the test if it cannot start. */
/* Skips the test binary when this build has no Redis over TLS. */
void th_need_redis_tls(void);
void th_redis_start_tls(th_redis *r, const char *cert, int auth_clients,
                        const char *extra);
/* Runs redis-cli --tls against r's TLS port as host localhost (the test
 * CA; the client certificate when the server demands one) with ARGS
 * (printf-style, given to the shell), 10 s at most; copies its output
 * (stdout and stderr, the last newline dropped) into out; returns its
 * exit status. A check of the server behind the library's back, that
 * needs no TLS of the library's. */
int th_redis_tls_cli(th_redis *r, char *out, size_t cap, const char *fmt,
                     ...) __attribute__((format(printf, 4, 5)));

/* --- Redis under Sentinel: a primary, two replicas, three sentinels --- */
typedef struct th_sentinels {
    th_redis data[3]; /* data[0] starts as the primary */
    th_redis sent[3];
    char name[64];    /* the master's name */
    char uri[512];    /* redis-sentinel://S1,S2,S3/NAME */
    int tls;          /* th_sentinels_start_tls() */
} th_sentinels;
/* Starts the set, sentinels calling the primary down after down_ms and
 * retrying a failover after 2 x failover_ms; returns once every sentinel
 * knows both replicas and the other two and both replicas are in sync
 * (fails the test after 30 s). */
void th_sentinels_start(th_sentinels *t, const char *name, int down_ms,
                        int failover_ms);
/* The same over TLS, as Redis' own TLS setups run it: every node (data
 * nodes and sentinels) has a TLS port (tls_port) beside its plain one,
 * serving server-ip.crt (IP:127.0.0.1, DNS:localhost), no client
 * certificates; tls-replication yes everywhere, so the replicas replicate
 * over TLS from the primary's TLS port, the sentinels monitor the data
 * nodes and greet each other over TLS, and every address the sentinels
 * name is a TLS port. uri is redis-sentinel://127.0.0.1:S1TLS,.../NAME
 * ?tls=1&cacert=CA. The plain ports are the harness's (th_redis_cmd),
 * which the library never learns of: a TLS client sent to one fails its
 * handshake. th_sentinels_primary() returns a TLS port then;
 * th_sentinels_node() takes either. */
void th_sentinels_start_tls(th_sentinels *t, const char *name, int down_ms,
                            int failover_ms);
void th_sentinels_stop(th_sentinels *t);
/* The port the sentinels name as the primary; 0 when none answers. */
int th_sentinels_primary(th_sentinels *t);
/* The data node on `port` (fails the test if none). */
th_redis *th_sentinels_node(th_sentinels *t, int port);
/* Waits (at most ms) until the sentinels name a primary other than the
 * one on port `old` and it says it is one; its port, or 0. */
int th_sentinels_failed_over(th_sentinels *t, int old, int64_t ms);
void th_redis_kill(th_redis *r, int sig); /* and waits, unless SIGSTOP */
void th_redis_stop(th_redis *r);
/* Runs one command (printf-style, hiredis syntax); returns the reply as an
 * integer (or -1 for nil/error) and copies a string reply into out. */
long long th_redis_cmd(th_redis *r, char *out, size_t cap, const char *fmt,
                       ...);
/* The number of calls of `cmd` (e.g. "evalsha") so far, from INFO
 * commandstats; cmd NULL: of every command but INFO, those that scripts
 * ran included. */
long long th_redis_calls(th_redis *r, const char *cmd);

/* The first free TCP port on 127.0.0.1. */
int th_free_port(void);
/* A hiredis connection (a redisContext *) to r as the user "forger", who
 * may only read and run `publish` ("publish" or "spublish") on every key
 * and channel: what a user with those rights can do to the store. */
void *th_redis_forger(th_redis *r, const char *publish);
/* Through f (th_redis_forger()), waits (10 s at most) until the key of
 * lock `name` has a waiter's line (the first after the head that is not a
 * holder's, "+ ..."), and reads its client id (32 hex digits) and number,
 * as anyone who may read the key can. */
void th_redis_waiter_line(void *f, const char *name, char client[33],
                          unsigned long long *seq);

/* --- Redis Cluster: three primaries with one replica each --- */
typedef struct th_cluster {
    th_redis node[6]; /* node[0..2] start as the primaries, node[3+i] replicates node[i] */
    char uri[512];    /* redis-cluster://127.0.0.1:P0,127.0.0.1:P1,127.0.0.1:P2 */
    int tls;          /* th_cluster_start_tls() */
} th_cluster;
/* Starts six redis-servers with cluster-enabled yes (each in its own dir,
 * its own nodes.conf, no persistence), on loopback ports p in
 * 20000..22767 whose bus port p+10000 is free too (both below the
 * kernel's ephemeral range, so no client socket holds them), and joins
 * them by hand as redis-cli --cluster create would: a config epoch each,
 * slots 0-5460, 5461-10922, 10923-16383 to node[0], [1], [2], CLUSTER
 * MEET, then CLUSTER REPLICATE so that node[3+i] is the replica of
 * node[i]. node_timeout_ms: the cluster-node-timeout (a failed primary is
 * replaced after about that). Returns once every node reports
 * cluster_state:ok, all agree on the slot map (CLUSTER SLOTS the same on
 * the 6, replicas included) and each replica is in sync
 * (master_link_status:up); fails the test after 30 s. */
void th_cluster_start(th_cluster *t, int node_timeout_ms);
/* The same over TLS: each node has a TLS port (tls_port, a free port)
 * beside its plain one, serving server-ip.crt (IP:127.0.0.1,
 * DNS:localhost), no client certificates; tls-cluster yes (the bus is
 * TLS, on cluster-port = plain port + 10000) and tls-replication yes.
 * Redis names a node's TLS port to a TLS client (CLUSTER SLOTS, MOVED,
 * ASK) and its plain port to a plain one, so the harness's own looks
 * (plain, by port) are unchanged and the library, a TLS client, is only
 * ever sent to TLS ports. uri is redis-cluster://127.0.0.1:T0,...?tls=1
 * &cacert=CA over node[0..2]'s TLS ports. */
void th_cluster_start_tls(th_cluster *t, int node_timeout_ms);
void th_cluster_stop(th_cluster *t); /* SIGCONT then SIGKILL every node */
/* The slot of a key (CLUSTER KEYSLOT asked of any live node). */
int th_cluster_slot(th_cluster *t, const char *key);
/* The index (0..5) of the node that is the primary of `slot` now, as the
 * live nodes' CLUSTER SLOTS say (the first live node that answers); -1 if
 * none. */
int th_cluster_owner(th_cluster *t, int slot);
/* CLUSTER FAILOVER on node[replica] (a replica); waits (at most ms) until
 * it reports role:master and owns the slots its old primary had, as every
 * live node's CLUSTER SLOTS says; returns 1, or 0 on timeout. `how`:
 * NULL, "FORCE" or "TAKEOVER". Fails the test if the node refuses. A
 * primary votes once per 2 x node timeout for the replicas of a given
 * primary: a second failover of the same shard (but TAKEOVER, which needs
 * no votes) within that time may not happen. */
int th_cluster_failover(th_cluster *t, int replica, const char *how,
                        int64_t ms);
/* Waits (at most ms) until node[i] is a primary owning `slot` in the map
 * of every live node; 1 or 0. Used after SIGKILL of a primary. */
int th_cluster_owner_is(th_cluster *t, int slot, int i, int64_t ms);
/* Moves one slot from its owner to primary node[to], as redis-cli
 * --cluster reshard does for each slot, step by step: `stage` 1 stops
 * after CLUSTER SETSLOT IMPORTING/MIGRATING on both (keys not moved: a
 * command on a key of the slot that is missing from the source gets ASK);
 * stage 2 also MIGRATEs every key of the slot (CLUSTER GETKEYSINSLOT +
 * MIGRATE ... KEYS ..., keeping values and TTLs, REPLACE) but does not end
 * it; stage 3 also runs CLUSTER SETSLOT slot NODE <to-id> on the target,
 * the source, and the other primaries, and waits until every live node's
 * map agrees. Returns the source node's index. A later call with a higher
 * stage for the same slot and target continues from where the last one
 * stopped (so the test can do stage 1, act, then stage 3): every step is
 * one that may run twice, and the source stays the slot's owner until
 * stage 3. Fails the test on an error (to already the owner, not a
 * primary, a MIGRATE refused, no agreement in 30 s). */
int th_cluster_move_slot(th_cluster *t, int slot, int to, int stage);

/* --- private ZooKeeper servers (java, Debian's zookeeper package) ---
 * One standalone server or a 3-server ensemble, every port a free
 * loopback port, each server in its own directory under th_tmpdir() (its
 * output in DIR/zk.log). Killed at exit like the Redis servers. Needs
 * java and /usr/share/java/zookeeper.jar (Debian: zookeeper), not the C
 * client. tickTime is 200 ms, sessions may last 400 ms to 60 s, and empty
 * container nodes are deleted after about a second (not a minute). Call these from the main thread only: a server also dies with
 * the thread that started it (PR_SET_PDEATHSIG), so that a test binary
 * killed by a timeout leaves no JVM behind. */
#define TH_ZK_MAX 3
typedef struct th_zk {
    int n;                 /* 1 (standalone) or 3 (ensemble) */
    int port[TH_ZK_MAX];   /* client ports */
    int peer[TH_ZK_MAX];   /* quorum ports (ensemble) */
    int elect[TH_ZK_MAX];  /* leader election ports (ensemble) */
    pid_t pid[TH_ZK_MAX];  /* 0: not running */
    char dir[TH_ZK_MAX][512];
    char hosts[256];       /* "127.0.0.1:p1,127.0.0.1:p2,..." */
} th_zk;

/* Starts `nservers` (1 or 3) servers in parallel and waits (at most 60 s)
 * until each serves: standalone, or leader/follower. Fails the test if they
 * cannot start. */
void th_zk_start(th_zk *z, int nservers);
/* Sends `sig` to server i. SIGSTOP and SIGCONT return at once; any other
 * signal waits for the exit (SIGKILL after 10 s). */
void th_zk_kill(th_zk *z, int i, int sig);
/* Starts server i again (same ports, same data) and waits until it serves
 * (so in an ensemble a quorum must be up with it). */
void th_zk_restart(th_zk *z, int i);
/* 1 if server i answers srvr with a mode (it serves clients), else 0. */
int th_zk_serving(th_zk *z, int i);
/* Index of the server whose mode is leader (standalone: 0 when it serves),
 * or -1 when none is. */
int th_zk_leader(th_zk *z);
/* Polls th_zk_leader() for at most timeout_ms; the leader or -1. */
int th_zk_wait_leader(th_zk *z, int64_t timeout_ms);
/* Sends the four-letter word `cmd` ("ruok", "srvr", "wchs", "mntr", ...)
 * to server i and copies the answer into out (NUL-terminated, truncated to
 * cap). Returns the bytes received, or -1 when it cannot connect. At most
 * about 3 s. */
int th_zk_4lw(th_zk *z, int i, const char *cmd, char *out, size_t cap);
/* The number after `key` in a 4lw answer ("Total watches:" in wchs,
 * "zk_watch_count" in mntr: blanks after the key are skipped), or -1. */
long long th_zk_stat(const char *answer, const char *key);


/* --- private etcd members (Debian's etcd-server and etcd-client) ---
 * One member or a 3-member cluster, every port a free loopback port, each
 * member's data in its own directory under th_tmpdir() (its output in
 * DIR/etcd.log). --heartbeat-interval=50 --election-timeout=500: leases
 * may be as short as 1 s, elections take about a second. Killed at exit;
 * they also die with the thread that started them (PR_SET_PDEATHSIG):
 * call these from the main thread only. */
#define TH_ETCD_MAX 3
typedef struct th_etcd {
    int n;                   /* 1 or 3 */
    int port[TH_ETCD_MAX];   /* client ports */
    int peer[TH_ETCD_MAX];   /* peer ports */
    pid_t pid[TH_ETCD_MAX];  /* 0: not running */
    char dir[TH_ETCD_MAX][512];
    char hosts[256];         /* "127.0.0.1:p1,127.0.0.1:p2,..." */
    int tls_port;            /* th_etcd_start_tls(): member 0's https port */
    char cert[512], key[512];
} th_etcd;

/* 1 when the etcd and etcdctl binaries are installed. */
int th_etcd_available(void);
/* Starts `n` (1 or 3) members and waits (at most 60 s) until each is
 * healthy. Fails the test if they cannot start. */
void th_etcd_start(th_etcd *e, int n);
/* Starts one member that serves clients over plain HTTP (e->port[0], for
 * health checks and etcdctl) and over TLS (e->tls_port) with the server
 * certificate and key given (PEM files). */
void th_etcd_start_tls(th_etcd *e, const char *cert, const char *key);
/* Sends `sig` to member i; SIGSTOP/SIGCONT return at once, any other
 * signal waits for the exit (SIGKILL after 10 s). */
void th_etcd_kill(th_etcd *e, int i, int sig);
/* Starts member i again (same ports and data); waits until it serves,
 * which in a cluster needs a quorum. */
void th_etcd_restart(th_etcd *e, int i);
/* The same for every member in `mask` (bit i: member i), all started
 * before the wait: a whole cluster restarted at once. */
void th_etcd_restart_set(th_etcd *e, unsigned mask);
/* Index of the member that is leader, or -1 (none answers or no leader). */
int th_etcd_leader(th_etcd *e);
int th_etcd_wait_leader(th_etcd *e, int64_t timeout_ms);
/* POSTs `body` to member i's gateway path ("/v3/kv/range"), or GETs the
 * path when body is NULL ("/health", "/metrics"); copies the answer body
 * (whole, up to 16 MiB, truncated to cap) into out. Returns the HTTP
 * status, or -1 (no answer within about 3 s). */
int th_etcd_http(th_etcd *e, int i, const char *path, const char *body,
                 char *out, size_t cap);
/* Runs `etcdctl --endpoints=<every member> ARGS` (printf-style, given to
 * the shell) with a 20 s limit; copies its output (stdout and stderr) into
 * out and returns its exit status. */
int th_etcdctl(th_etcd *e, char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* --- private PostgreSQL and MariaDB servers ---
 * Started by tests/servers/sqlserver.sh (Debian's postgresql and
 * mariadb-server, never a system service) on a free loopback port, data
 * in a directory under th_tmpdir(). Killed at exit; they also die with
 * the thread that started them: call these from the main thread only.
 * kind is "pg" or "mysql". The store URI in `uri` has the password of the
 * user dlock (every privilege): postgres://...:PORT/postgres or
 * mysql://...:PORT/dlocktest. */
typedef struct th_sql {
    char kind[8];
    int port;
    pid_t pid;
    char dir[512];
    char uri[256];
    char cert[512], key[512];
    void *kept;      /* th_sql_read's session (MariaDB), or NULL */
    pid_t kept_pid;  /* the process that opened it */
} th_sql;

/* 1 when this build has the store's client library and the machine has
 * the server. */
int th_sql_available(const char *kind);
/* Starts a server and waits (at most 90 s) until it answers. Fails the
 * test if it cannot start. */
void th_sql_start(th_sql *s, const char *kind);
/* The same with TLS: the server certificate and key (PEM files). */
void th_sql_start_tls(th_sql *s, const char *kind, const char *cert,
                      const char *key);
/* SIGSTOP, SIGCONT and SIGKILL go to every process of the server (each
 * PostgreSQL backend too); SIGSTOP returns once every thread is stopped,
 * SIGCONT at once; any other signal goes to the server
 * process (PostgreSQL: SIGINT is a fast shutdown), then waits for its
 * exit (SIGKILL after 15 s). */
void th_sql_kill(th_sql *s, int sig);
/* Starts it again on the same port with the same data; waits until it
 * answers. */
void th_sql_restart(th_sql *s);
/* Runs SQL (printf-style) as the superuser over the server's Unix socket;
 * returns the first column of the first row as an integer ('t' is 1), -1
 * when there is none, or the rows changed by a statement without rows;
 * copies that column's text into out. th_sql_query fails the test on an
 * error; th_sql_try returns -2 and copies the message into out. */
long long th_sql_query(th_sql *s, char *out, size_t cap, const char *fmt,
                       ...) __attribute__((format(printf, 4, 5)));
long long th_sql_try(th_sql *s, char *out, size_t cap, const char *fmt,
                     ...) __attribute__((format(printf, 4, 5)));
/* The same as th_sql_query (out: the first column's text, may be NULL),
 * through one session the harness keeps open
 * (per server and process; opened at the first call, again after the
 * server went): the server counts exactly the one statement per call,
 * before it answers. For readings of MariaDB's own counters (Questions):
 * th_sql_query's connection of its own ends with a COM_QUIT, which the
 * server counts whenever it gets to it, under load inside the next
 * window measured. MariaDB only; main thread only. */
long long th_sql_read(th_sql *s, char *out, size_t cap, const char *fmt,
                      ...) __attribute__((format(printf, 4, 5)));
/* A MySQL session (a MYSQL *) over TCP of the account 'squatter', made
 * with `password` and USAGE only: no right on dlock's database (checked:
 * it may not read dlock_locks). GET_LOCK needs none, so it may take any
 * lock name. MySQL/MariaDB builds only (TH_MYSQL). */
void *th_sql_squatter(th_sql *s, const char *password);
/* The squatter's session m takes the user-level lock `lock` (GET_LOCK,
 * no wait); fails the test unless it got it. */
void th_sql_squatter_take(void *m, const char *lock);

/* --- a private PgBouncer in front of a private PostgreSQL ---
 * Started by tests/servers/pgbouncer.sh (Debian's pgbouncer, never a
 * system service) on a free loopback port, its files in a directory under
 * th_tmpdir(), every setting PgBouncer's default but pool_mode. Killed at
 * exit; it also dies with the thread that started it: call these from the
 * main thread only. `uri` is the store URI of the user dlock through it
 * (postgres://...:PORT/postgres, no ?pooler=). */
typedef struct th_pgb {
    th_sql *srv;   /* the server behind it */
    char mode[16]; /* "session" or "transaction" */
    int port;
    pid_t pid;
    char dir[512];
    char uri[256];
} th_pgb;

/* 1 when this build has the postgres store and the machine has
 * PostgreSQL and pgbouncer. */
int th_pgb_available(void);
/* Starts PgBouncer in pool mode `mode` in front of srv (running) and
 * waits (at most 30 s) until a query through it answers. Fails the test
 * if it cannot start. */
void th_pgb_start(th_pgb *b, th_sql *srv, const char *mode);
/* Sends sig; SIGSTOP and SIGCONT return at once, any other signal waits
 * for the exit (SIGKILL after 10 s). */
void th_pgb_kill(th_pgb *b, int sig);
/* Starts it again on the same port; waits until it answers. */
void th_pgb_restart(th_pgb *b);
/* Runs SQL through PgBouncer as the user dlock (its own connection);
 * returns the first column of the first row as an integer ('t' is 1), -1
 * when there is none, -2 on an error (message in out). */
long long th_pgb_try(th_pgb *b, char *out, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Makes (in dir) a CA (ca.pem, ca.key) unless there is one, and a
 * certificate for 127.0.0.1 signed by it: WHAT.pem and WHAT.key (e.g.
 * "srv", "cli"). Fails the test when openssl cannot. */
void th_make_cert(const char *dir, const char *what);

/* --- a lock holder whose wall clock is wrong ---
 * 1 when libfaketime (Debian: faketime) is installed. */
int th_faketime_available(void);
/* Starts a child process (this test binary again, run by th_main) whose
 * wall clock is shifted by `shift` (libfaketime's syntax: "+5h", "-3h";
 * the monotonic clock is left alone, as on a real machine with a wrong
 * clock). It opens a client on `uri`, acquires `name` with ttl_ms (waiting
 * up to 10 s), writes "held TOKEN WALLCLOCK_S\n" to the pipe whose read
 * end is *rfd, holds the lock for hold_ms (the watchdog renews it; -1:
 * until killed), releases it and writes "released RC\n" (RC a DLOCK_*
 * code). It dies with the test. */
pid_t th_skewed_holder(const char *shift, const char *uri, const char *name,
                       int64_t ttl_ms, int64_t hold_ms, int *rfd);
/* Reads one line from fd (at most timeout_ms); returns its length, or -1
 * when none came. */
int th_read_line(int fd, char *out, size_t cap, int64_t timeout_ms);

/* --- a TCP relay in front of a server ---
 * One thread copies bytes both ways for at most TH_RELAY_MAX connections.
 * It can hold back what the clients of the connections open now send (a
 * slow network or a frozen server, for those connections only), then let
 * it through late, or delay every chunk a client sends. */
#define TH_RELAY_MAX 16

typedef struct th_relay_pair {
    int cfd, sfd;     /* client side, server side; -1 when closed */
    int held;         /* client bytes wait in the kernel, unread */
    int cdone;        /* the client side ended */
    long long answer; /* bytes the server sent after the hold ended */
} th_relay_pair;

typedef struct th_relay {
    int lfd, port, target; /* clients connect to 127.0.0.1:port */
    int delay_ms; /* each chunk from a client waits this long (atomic) */
    pthread_t th;
    pthread_mutex_t mu;
    th_relay_pair pair[TH_RELAY_MAX];
    int stop;
} th_relay;

/* Listens on a free loopback port and relays to 127.0.0.1:target. */
void th_relay_start(th_relay *px, int target);
void th_relay_stop(th_relay *px);
/* Holds back the client bytes of every connection open now; returns how
 * many connections that is. */
int th_relay_hold(th_relay *px);
/* Lets the held bytes through, then waits (at most 10 s) until the server
 * has answered them and closed those connections; returns the bytes it
 * answered. */
long long th_relay_let_through(th_relay *px);

/* The harness's own: records a server process to kill at exit (running
 * 1), or forgets it (0). */
void th__track(pid_t pid, int running);
/* Starts `path` with argv as a tracked server process: a session (process
 * group) of its own, dead with the test binary, stdin /dev/null, stdout
 * and stderr appended to `log` (made with `mode`), in directory `dir`
 * (NULL: this one). Its pid; an exit status of 127 means it could not be
 * run. */
pid_t th__spawn(const char *path, char *const argv[], const char *dir,
                const char *log, mode_t mode);
/* Reaps *pid if it has exited: 1 (*pid cleared, its wait status in *st
 * when st is not NULL; also 1 when *pid was not running) or 0. */
int th__reaped(pid_t *pid, int *st);
/* Starts a redis-server (sentinel: with --sentinel) with `extra` in its
 * configuration (th_redis_start, th_sentinels_start). */
void th__redis_start(th_redis *r, const char *extra, int sentinel);
/* The same (no sentinel) on `port`, tried once: 0 once it answers, -1 when
 * it did not start (the port, or a cluster node's bus port, was taken;
 * see r->dir/redis.log). The caller picks the next port (cluster.c). */
int th__redis_start_port(th_redis *r, const char *extra, int port);
/* The same with a TLS port beside the plain one (r->tls_port, a free
 * port; certificate th_tls_certs()' CERT.crt, no client certificates):
 * port 0 is a free port; a sentinel too. 0 once it answers on its plain
 * port, -1 when it did not start. The TLS sentinels and cluster. */
int th__redis_start_port_tls(th_redis *r, const char *extra, int sentinel,
                             int port, const char *cert);

#ifdef TH_ZK_CLIENT
/* A direct ZooKeeper client (libzookeeper_mt) for looking behind the
 * store's back; only in builds that have the zk store. th_zk_connect()
 * returns a connected zhandle_t * (as void *), optionally authenticated
 * with digest "user:password"; it fails the test after 10 s. */
void *th_zk_connect(const char *hosts, const char *digest);
void th_zk_close(void *zh);
/* Deletes the children of `path` (not path itself); returns how many, or
 * -1 when path does not exist. */
int th_zk_delete_children(void *zh, const char *path);
#endif

/* What a lost-lock callback saw: th_lost_cb as dlock_options.on_lost, a
 * th_lost (TH_LOST_INIT) as its on_lost_arg. */
typedef struct th_lost {
    pthread_mutex_t mu;
    int calls;
    uint64_t token; /* the last call's */
    int64_t at;     /* th_now_ms() of the last call */
} th_lost;
#define TH_LOST_INIT {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0}
void th_lost_cb(dlock *l, uint64_t token, void *arg);
int th_lost_calls(th_lost *b);
/* Waits (at most ms) for the first call; the calls then. */
int th_lost_within(th_lost *b, int64_t ms);
/* Waits (at most ms) until `want` calls; the calls then. */
int th_lost_wait(th_lost *b, int want, int64_t ms);
/* Counts from 0 again. */
void th_lost_reset(th_lost *b);
/* Acquires la (its on_lost counting into n, 0 calls so far) and breaks
 * its lock `name` through op, whose report must name the hold (held 1,
 * la's token, a holder with a pid) and is left in *ev (the caller
 * clears it); then la must be told within told_ms, with its token, and
 * be lost (the stores whose holders are told at once: zk, etcd). Returns
 * the token la had. */
uint64_t th_break_told(dlock_client *op, dlock *la, const char *name,
                       th_lost *n, int64_t told_ms, dlock_info *ev);

/* A holder in a forked child: th_fork(th_holder_child, h), h in
 * th_shared() memory with uri, name and ttl set. The child opens a client
 * of h->uri (th_patient() if h->patient) and a handle on h->name (ttl_ms
 * h->ttl; its on_lost counts into h), acquires it (5 s), sleeps settle_ms,
 * sets ready and waits (30 s at most) for go; then waits (lost_ms at most)
 * to be told it lost the lock, and releases it. Exits 2 when it could not
 * acquire. */
typedef struct th_holder {
    char uri[1200];
    char name[64];
    int64_t ttl, settle_ms, lost_ms;
    int patient;
    volatile int ready, go;
    volatile uint64_t token;
    volatile int lost_calls;
    volatile uint64_t lost_token;
    volatile int held_before_release, release_rc;
    volatile int64_t lost_after_cont; /* ms from go to the callback */
} th_holder;
int th_holder_child(void *arg);
/* Sets h's uri, name and ttl (the caller sets any other field first),
 * forks th_holder_child and waits (10 s at most) until it holds the lock,
 * failing the test when it does not; the child's pid. */
pid_t th_holder_start(th_holder *h, const char *uri, const char *name,
                      int64_t ttl);

/* The events a client sends (dlock_client_set_events() with th_events_cb
 * and a th_events, th_events_init()ed, as its argument): the first
 * TH_EVENTS_MAX, each with the monotonic time it came and the thread that
 * sent it. Lock mu to read them while events may still come. */
#define TH_EVENTS_MAX 64
typedef struct th_events {
    pthread_mutex_t mu;
    int n;
    int type[TH_EVENTS_MAX], rc[TH_EVENTS_MAX];
    uint64_t token[TH_EVENTS_MAX];
    int64_t at[TH_EVENTS_MAX], left[TH_EVENTS_MAX], held_ms[TH_EVENTS_MAX];
    pthread_t thread[TH_EVENTS_MAX];
    char why[TH_EVENTS_MAX][300];
} th_events;
void th_events_init(th_events *s);
void th_events_cb(const dlock_event *e, void *arg);
/* How many events of `type` came. */
int th_events_count(th_events *s, int type);
/* The index of the first event of `type`, or -1 (mu held by the caller,
 * or no more events to come). */
int th_events_first(const th_events *s, int type);
/* th_events_first(), waiting (at most ms) for one to come. */
int th_events_wait(th_events *s, int type, int64_t ms);

/* A thread that waits for a lock, started by th_waiter_start(): the
 * test sets the first five fields (designated initialisers), the thread
 * the rest. It sets `started` (atomic) and acquires l
 * (dlock_acquire_shared() when `shared`) with a wait of wait_ms (0: 60 s;
 * -1: forever); records the acquire's rc, dlock_token(), dlock_errmsg()
 * (msg), when it returned (done_at, monotonic ms; 0 before) and how long
 * it took; then sets `done` (atomic). When it got the lock it holds it
 * hold_ms, then, with wait_go, until th_waiter_go() (60 s at most: the
 * bound only ends a test that failed), and releases it (release_rc):
 * holds are a thread's, so the waiter's own thread releases. */
typedef struct th_waiter {
    dlock *l;
    int shared;
    int64_t wait_ms, hold_ms;
    int wait_go;
    int rc; /* -99 until the acquire returned */
    int release_rc;
    uint64_t token;
    int64_t done_at, took;
    char msg[512];
    volatile int started, done, go;
} th_waiter;
/* Clears w's results and starts its thread in *th (join it). */
void th_waiter_start(th_waiter *w, pthread_t *th);
/* Waits (ms at most) until w's acquire returned: 1 if it did. */
int th_waiter_returned(th_waiter *w, int64_t ms);
/* Lets w (wait_go) release the lock it holds. */
void th_waiter_go(th_waiter *w);

/* A store for the store tests, started by kind: file, redis, rediss
 * (Redis over TLS: th_redis_start_tls() with the server certificate for
 * localhost, no client certificate; the store URI is its tls_uri),
 * redis-sentinel and redis-cluster (these three run as "redis"), redlock, zk,
 * etcd, sqlite, pg, pg-advisory, pg-pgbouncer, pg-advisory-pgbouncer, mysql (th_skip() when this build or machine lacks it). What the store
 * does:
 *  - has_leases: a lock outlives a dead or frozen holder only by its ttl
 *    (a Redis lease; a ZooKeeper session): a SIGKILLed holder is replaced
 *    after the ttl, not at once; a frozen holder loses its lock; a short
 *    ttl is kept alive for many ttls while the holder lives (the watchdog
 *    renews a lease; the ZooKeeper client pings its session).
 *    PostgreSQL's advisory locks have no lease: they live as long as the
 *    holder's session, which the server ends when the holder dies.
 *  - lease_runs_out: a lease ends while its holder lives if nobody renews
 *    it (DLOCK_NO_RENEW). Redis and the lock tables: a ZooKeeper session
 *    lives as long as its process (NO_RENEW has no effect there).
 *  - ttl_visible: dlock_inspect() reports the lease left and
 *    dlock_extend() sets a new one. Redis and etcd (whose extend moves the
 *    key to a lease of the new length).
 *  - held_visible: dlock_inspect() says how long the hold has lasted. Not
 *    on etcd (it keeps no creation time: held_ms -1).
 *  - fixed_ttl: dlock_extend() with another ttl is DLOCK_ENOTSUP (a
 *    ZooKeeper session's timeout cannot change); with the same ttl it
 *    checks that the hold is still there.
 *  - keeps_last_token: a free lock's dlock_inspect() token is the last one
 *    issued. Not on ZooKeeper (documented in docs/stores.md: token 0).
 *  - has_fair: DLOCK_FAIR is supported; otherwise (Redlock) it fails
 *    with DLOCK_ENOTSUP.
 *  - short_ttl: the shortest ttl the store keeps for seconds: 300 ms on
 *    Redis; 400 ms on ZooKeeper, the private server's minSessionTimeout;
 *    1000 ms on etcd (leases are whole seconds; the private member's
 *    minimum is 1 s) and on Redlock (four of its 250 ms node timeouts: a
 *    renewal may take one). */
/* A TCP relay on loopback a test can cut (every connection through it
 * closed, its port closed) and restore (the same port open again):
 * gate.c. th_gate_start() listens on a free port (g->port) and relays to
 * `target`; th_gate_stop() ends it. */
#define TH_GATE_MAX 16
typedef struct th_gate {
    int port, target, lfd, stop;
    int fd[2 * TH_GATE_MAX]; /* client, server pairs; -1 when free */
    pthread_t th;
    pthread_mutex_t mu;
} th_gate;
void th_gate_start(th_gate *g, int target);
void th_gate_cut(th_gate *g);
void th_gate_restore(th_gate *g);
void th_gate_stop(th_gate *g);
/* The rest of a test in which la (a hold of token t1 through gate g, its
 * losses counted in n) was deleted behind its back while g was cut
 * (test_etcd.c, test_zk.c): lb, another client's handle on the same
 * name, takes the lock at once; la is told nothing for quiet_ms (it
 * cannot know), and once g is restored is told within told_ms (with t1),
 * its release lost with `why` in the message; then its client works
 * again through g. The caller closes the handles, clients and gate. */
void th_told_after_the_cut(th_gate *g, th_lost *n, dlock *la, dlock *lb,
                           uint64_t t1, int64_t quiet_ms, int64_t told_ms,
                           const char *why);

typedef struct th_store {
    char uri[1200];
    const char *kind; /* pg-pgbouncer runs as "pg", and so on */
    int has_leases, lease_runs_out, ttl_visible, fixed_ttl, keeps_last_token,
        held_visible, has_fair;
    int64_t short_ttl;
    th_redis srv;   /* redis (redis-sentinel: a copy of its primary's) */
    th_redis rl[5]; /* redlock's nodes */
    th_sentinels sen; /* redis-sentinel */
    th_cluster cl;    /* redis-cluster (srv unset: see th_store_redis_for) */
    th_zk zsrv;
    th_etcd esrv;
    th_sql ssrv;
    th_pgb pgb;
} th_store;
void th_store_start(th_store *s, const char *kind);
/* main() of a suite run for every store kind: `binary STORE-KIND
 * [filter]`; starts the store in s, calls started() (when not NULL: the
 * suite reads what the store can do), then runs the tests. */
int th_store_main(int argc, char **argv, th_store *s, const th_test *tests,
                  void (*started)(void));
/* Kills (SIGKILL) every server th_store_start() started. */
void th_store_stop(th_store *s);
/* The Redis server that holds `key` ("dlock:{NAME}"), to look at a Redis
 * store behind its back: s->srv, or on a cluster the primary of the key's
 * slot now. */
th_redis *th_store_redis_for(th_store *s, const char *key);

#ifdef TH_SQLITE
/* The SQLite suites' database: locks.db in th_tmpdir(), its path into
 * path and its store URI (sqlite://PATH) into uri. */
void th_sqlite_db(char *path, size_t pcap, char *uri, size_t ucap);
/* Runs sql on the database file `path` through a connection of its own,
 * behind the store's back; fails the test, with SQLite's message, when it
 * fails. */
void th_sqlite_exec(const char *path, const char *sql);
#endif

#endif
