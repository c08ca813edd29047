/* SPDX-License-Identifier: MIT */
/*
 * bench_zk.c -- dlock's ZooKeeper store beside the bare ZooKeeper C client,
 * measured in one run against the same server.
 *
 *   dlock_bench_zk ZK_URI [--quick]        (ZK_URI: zk://host:port[/chroot])
 *
 * Prints Markdown. Floors, all with the synchronous API of libzookeeper_mt
 * (the client the store itself uses):
 *   cycle floor        create(EPHEMERAL_SEQUENTIAL child of an existing
 *                      parent) + getChildren(parent) + delete(child): the
 *                      ZooKeeper lock recipe's least work
 *   round trip         exists() on an existing node (a read)
 *   write              set() of 16 bytes on an existing node
 *   idle write + RTT   after 2 ms of idleness (as before every hand-off):
 *                      set() then exists(), timed together
 *   watch              after 2 ms of idleness, set() in one session until
 *                      another session's exists watch on the node fires
 * Hand-off: two processes pass the lock back and forth (as in bench.c); the
 * time from the holder's release call to the waiter's acquire returning,
 * expressed in "one write + one round trip" (idle; and hot: the sum of the
 * write and round-trip figures). Cycles and hand-offs run in chunks that
 * alternate with their floors; ratios are medians of the chunks' ratios.
 * Requests per hand-off: N+1 processes contend; the server's
 * zk_packets_received (mntr) before and after.
 *
 * The server is started by bench/run.sh (standalone, forceSync=no). The JVM
 * compiles its hot paths only after a few thousand requests: a warm-up of
 * every kind of operation comes first, and is not measured.
 */
#include <dlock.h>
#include <zookeeper/zookeeper.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"

const char bench_prog[] = "bench_zk";

#define CHUNKS 15
#define SESSION_MS 10000

static int quick;
static const char *zk_uri;
static char zk_servers[1024];   /* host:port[,host:port...] */
static char zk_chroot[512];     /* "" or "/chroot" (a path prefix, as the
                                 * store uses it, not the client's chroot) */
static char zk_first_host[256] = "127.0.0.1";
static int zk_first_port = 2181;

/* <chroot>/bench-floor and <chroot>/bench-floor-data: beside the store's
 * lock nodes (<chroot>/<name>), at the same depth */
static char floor_parent[600], floor_data[600];
static const char OWNER[] = "owner-0123456789abcdef";

static void zdie(const char *what, int rc)
{
    die(what, zerror(rc));
}

/* ------------------------------------------------------------------------ */
/* The bare client                                                          */
/* ------------------------------------------------------------------------ */

static void quiet_watcher(zhandle_t *zh, int type, int state,
                          const char *path, void *ctx)
{
    (void)zh, (void)type, (void)state, (void)path, (void)ctx;
}

static zhandle_t *zk_connect(const char *hosts)
{
    zhandle_t *zh = zookeeper_init(hosts, quiet_watcher, SESSION_MS, NULL,
                                   NULL, 0);
    int64_t deadline = now_ns() + (int64_t)10 * 1000000000;

    if (!zh)
        die("zookeeper_init", strerror(errno));
    while (zoo_state(zh) != ZOO_CONNECTED_STATE) {
        if (now_ns() > deadline)
            die(hosts, "no session within 10 s");
        sleep_us(1000);
    }
    return zh;
}

static void zk_create_if_missing(zhandle_t *zh, const char *path)
{
    int rc = zoo_create(zh, path, "", 0, &ZOO_OPEN_ACL_UNSAFE, ZOO_PERSISTENT,
                        NULL, 0);

    if (rc != ZOK && rc != ZNODEEXISTS)
        zdie(path, rc);
}

/* The chroot (each component) and the floors' nodes inside it. */
static void zk_prepare(void)
{
    zhandle_t *zh = zk_connect(zk_servers);
    char path[sizeof(zk_chroot)];

    for (size_t i = 1; zk_chroot[0] && i <= strlen(zk_chroot); i++) {
        if (zk_chroot[i] != '/' && zk_chroot[i] != '\0')
            continue;
        snprintf(path, sizeof(path), "%.*s", (int)i, zk_chroot);
        zk_create_if_missing(zh, path);
    }
    zk_create_if_missing(zh, floor_parent);
    zk_create_if_missing(zh, floor_data);
    zookeeper_close(zh);
}

/* One floor cycle: create + getChildren + delete. */
static void floor_cycle_once(void *arg)
{
    zhandle_t *zh = arg;
    char child[700], pattern[700];
    struct String_vector sv;
    int rc;

    snprintf(pattern, sizeof(pattern), "%s/c-", floor_parent);
    rc = zoo_create(zh, pattern, OWNER, (int)sizeof(OWNER) - 1,
                    &ZOO_OPEN_ACL_UNSAFE, ZOO_EPHEMERAL_SEQUENTIAL, child,
                    (int)sizeof(child));
    if (rc != ZOK)
        zdie("floor create", rc);
    rc = zoo_get_children(zh, floor_parent, 0, &sv);
    if (rc != ZOK)
        zdie("floor getChildren", rc);
    deallocate_String_vector(&sv);
    rc = zoo_delete(zh, child, -1);
    if (rc != ZOK)
        zdie("floor delete", rc);
}

static void floor_write_once(void *arg)
{
    zhandle_t *zh = arg;
    int rc = zoo_set(zh, floor_data, "0123456789abcdef", 16, -1);

    if (rc != ZOK)
        zdie("floor set", rc);
}

static void floor_rtt_once(void *arg)
{
    zhandle_t *zh = arg;
    struct Stat st;
    int rc = zoo_exists(zh, floor_data, 0, &st);

    if (rc != ZOK)
        zdie("floor exists", rc);
}

/* kind 0: round trip; 1: write; 2: 2 ms idle, then write + round trip */
static stats floor_op(int kind, int n)
{
    zhandle_t *h = zk_connect(zk_servers);
    stats s = time_write_rtt(floor_write_once, floor_rtt_once, h, kind, n);

    zookeeper_close(h);
    return s;
}

/* A write seen by another session: session B watches the node (exists
 * watch), 2 ms of idleness, then session A sets it; the time from A's call
 * to B's watcher running (on B's completion thread). A release reaches a
 * waiter this way. */
typedef struct watch_seen {
    volatile int64_t at; /* 0 until the watch fired */
} watch_seen;

static void seen_watcher(zhandle_t *zh, int type, int state,
                         const char *path, void *ctx)
{
    (void)zh, (void)state, (void)path;
    if (type == ZOO_CHANGED_EVENT && ctx)
        __atomic_store_n(&((watch_seen *)ctx)->at, now_ns(),
                         __ATOMIC_RELEASE);
}

static stats floor_watch(int n)
{
    static watch_seen seen;
    zhandle_t *a = zk_connect(zk_servers), *b = zk_connect(zk_servers);
    int64_t *ns = malloc(sizeof(*ns) * (size_t)n);

    for (int i = -n / 10; i < n; i++) {
        struct Stat st;
        int rc;

        __atomic_store_n(&seen.at, 0, __ATOMIC_RELEASE);
        rc = zoo_wexists(b, floor_data, seen_watcher, &seen, &st);
        if (rc != ZOK)
            zdie("floor wexists", rc);
        sleep_us(2000);
        int64_t t0 = now_ns();
        floor_write_once(a);
        while (!__atomic_load_n(&seen.at, __ATOMIC_ACQUIRE))
            sleep_us(10);
        if (i >= 0)
            ns[i] = seen.at - t0;
    }
    zookeeper_close(a);
    zookeeper_close(b);
    stats s = summarize(ns, n);
    free(ns);
    return s;
}

/* ------------------------------------------------------------------------ */
/* dlock                                                                    */
/* ------------------------------------------------------------------------ */

/* --- hand-off between two processes --- */

static stats handoff(unsigned flags, int n)
{
    dlock_party p = {zk_uri, NULL, flags, 0, -1};

    /* the first sample of each direction includes setting up the wait */
    return handoff_dlock(&p, n - 2, NULL);
}

/* --- requests per hand-off under contention --- */

/* The server's counter `key` from the four-letter word `mntr`. */
static long long zk_mntr(const char *key)
{
    struct addrinfo hints, *ai;
    char port[16], buf[16384];
    size_t len = 0;
    ssize_t r;
    int fd;

    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    snprintf(port, sizeof(port), "%d", zk_first_port);
    if (getaddrinfo(zk_first_host, port, &hints, &ai) != 0)
        die("mntr", "cannot resolve the server");
    fd = socket(ai->ai_family, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, ai->ai_addr, ai->ai_addrlen) != 0)
        die("mntr", strerror(errno));
    freeaddrinfo(ai);
    if (write(fd, "mntr", 4) != 4)
        die("mntr", strerror(errno));
    while (len < sizeof(buf) - 1 &&
           (r = read(fd, buf + len, sizeof(buf) - 1 - len)) > 0)
        len += (size_t)r;
    close(fd);
    buf[len] = '\0';
    size_t kl = strlen(key);
    for (char *p = buf; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : p)
        if (!strncmp(p, key, kl) && p[kl] == '\t')
            return atoll(p + kl + 1);
    die("mntr", "counter not found (is mntr in 4lw.commands.whitelist?)");
    return 0;
}

static void requests_per_handoff(int waiters, unsigned flags, double *req,
                                 double *handoffs_per_s)
{
    int64_t ms = quick ? 1000 : 3000;
    contend_cfg cfg = {zk_uri, NULL, flags, waiters + 1, 0, 0, 0,
                       300, 0, 0, ms + 10000};
    contend *s = contend_start(&cfg);

    contend_go(s);
    sleep_us(100000);
    long long before = zk_mntr("zk_packets_received");
    long h0 = contend_handoffs(s);
    int64_t t0 = now_ns();
    sleep_us(ms * 1000);
    long long after = zk_mntr("zk_packets_received");
    long h1 = contend_handoffs(s);
    double secs = (double)(now_ns() - t0) / 1e9;
    contend_stop(s);
    contend_finish(s);
    /* 1 for the mntr connection itself */
    *req = h1 > h0 ? (double)(after - before - 1) / (double)(h1 - h0) : 0;
    *handoffs_per_s = (double)(h1 - h0) / secs;
}

/* ------------------------------------------------------------------------ */

static void parse_uri(void)
{
    const char *p = strstr(zk_uri, "://");

    if (!p || strncmp(zk_uri, "zk://", 5) != 0)
        die("uri", "expected zk://host:port[,host:port...][/chroot]");
    p += 3;
    size_t end = strcspn(p, "?#"), slash = strcspn(p, "/?#");
    snprintf(zk_servers, sizeof(zk_servers), "%.*s", (int)slash, p);
    /* no chroot: the store's default */
    snprintf(zk_chroot, sizeof(zk_chroot), "%.*s", (int)(end - slash),
             slash < end ? p + slash : "/dlock");
    if (!strcmp(zk_chroot, "/"))
        zk_chroot[0] = '\0';
    snprintf(floor_parent, sizeof(floor_parent), "%s/bench-floor", zk_chroot);
    snprintf(floor_data, sizeof(floor_data), "%s/bench-floor-data",
             zk_chroot);
    size_t hl = strcspn(zk_servers, ":,");
    snprintf(zk_first_host, sizeof(zk_first_host), "%.*s", (int)hl,
             zk_servers);
    if (zk_servers[hl] == ':')
        zk_first_port = atoi(zk_servers + hl + 1);
}

int main(int argc, char **argv)
{
    zk_uri = h_args(argc, argv, "ZK_URI", &quick);
    parse_uri();
    signal(SIGPIPE, SIG_IGN);
    zoo_set_debug_level(ZOO_LOG_LEVEL_ERROR);

    int n = quick ? 1500 : 9000;  /* cycles, each side */
    int nh = quick ? 300 : 1200;  /* hand-offs of each kind */
    int no = quick ? 1000 : 5000; /* round trips and writes per run */
    int warm = quick ? 1000 : 4000;

    zk_prepare();

    /* is the store in this build? */
    char why[256];
    dlock_client *dc = h_store_client(zk_uri, NULL, why, sizeof(why));
    int have_store = dc != NULL;

    /* warm-up, not measured: the server's JIT, both clients' paths */
    zhandle_t *zh = zk_connect(zk_servers);
    dlock *dl = have_store ? h_open_lock(dc, "bench-cycle", 0, 0) : NULL;
    for (int i = 0; i < warm; i++) {
        floor_cycle_once(zh);
        floor_write_once(zh);
        floor_rtt_once(zh);
    }
    if (have_store)
        h_dlock_cycles(dl, NULL, warm);

    printf("## ZooKeeper (%s)\n\n", zk_uri);
    if (!have_store)
        printf("Floors only: %s.\n\n", why);
    printf("Latency in microseconds. First, not measured, a warm-up of "
           "the server's JIT: %d floor cycles, writes and round trips, and "
           "as many dlock cycles. Round trips and writes: median "
           "of three runs of %d, with the spread of the three. Cycles: %d "
           "of each, in %d chunks alternating with the floor; hand-offs: "
           "%d of each kind, in %d chunks alternating with the idle floors. "
           "A figure is the median of its chunks' medians; a ratio is the "
           "median of the chunks' ratios; the cycles' p99 is over all "
           "cycles.\n\n",
           warm, no, n, CHUNKS, (nh / CHUNKS) * CHUNKS, CHUNKS);
    printf("| measure | floor | dlock | ratio |\n|---|---|---|---|\n");

    /* median of three repetitions, with their spread */
    double v[3];
    for (int k = 0; k < 3; k++)
        v[k] = floor_op(0, no).p50_us;
    spread rt = medrange(v, 3);
    printf("| round trip (exists) | %.1f (%.1f–%.1f) | | |\n", rt.med,
           rt.min, rt.max);
    for (int k = 0; k < 3; k++)
        v[k] = floor_op(1, no).p50_us;
    spread wr = medrange(v, 3);
    printf("| write (set, 16 bytes) | %.1f (%.1f–%.1f) | | |\n", wr.med,
           wr.min, wr.max);

    /* interleave floor and dlock in short chunks, so that the machine's
     * drift hits both alike; the ratio is the median of the chunks' ratios */
    int per = n / CHUNKS;
    int64_t *fns = malloc(sizeof(int64_t) * (size_t)per * CHUNKS);
    int64_t *dns = malloc(sizeof(int64_t) * (size_t)per * CHUNKS);
    int64_t *all[2] = {fns, dns};
    kind_op kinds[2] = {{floor_cycle_once, zh}, {h_dlock_once, dl}};
    double p50[2 * CHUNKS] = {0}, *fv = p50, *dv = p50 + CHUNKS;
    chunked_ops(kinds, have_store ? 2 : 1, n, CHUNKS, p50, all);
    zookeeper_close(zh);
    h_close(have_store, dl, dc);
    spread fm = medrange(fv, CHUNKS), dm = medrange(dv, CHUNKS);
    spread rm = have_store ? ratios(dv, fv, CHUNKS) : dm;
    stats fs, ds;
    h_summaries(fns, dns, per * CHUNKS, have_store, &fs, &ds);
    if (have_store) {
        printf("| uncontended acquire+release, p50 | %.1f | %.1f | "
               "**%.2fx** (chunks: %.2f–%.2f) |\n",
               fm.med, dm.med, rm.med, rm.min, rm.max);
        h_tail_rows(&fs, &ds);
    } else {
        printf("| uncontended acquire+release, p50 | %.1f | | |\n",
               fm.med);
        printf("| uncontended acquire+release, p99 | %.1f | | |\n",
               fs.p99_us);
        printf("| cycles per second (one client) | %.0f | | |\n", fs.per_s);
    }

    /* the idle floors and the hand-offs, interleaved likewise: an idle
     * machine wakes up slower or faster from one second to the next, and
     * the chunks pair each hand-off figure with a floor taken moments
     * before (the floors' sessions are closed before every fork) */
    double iv[CHUNKS], wv[CHUNKS], hv[CHUNKS], av[CHUNKS], hr[CHUNKS],
        ar[CHUNKS];
    int per_h = nh / CHUNKS;
    if (have_store) { /* warm-up: the hand-off's own requests */
        handoff(0, quick ? 20 : 100);
        handoff(DLOCK_FAIR, quick ? 20 : 100);
    }
    for (int k = 0; k < CHUNKS; k++) {
        iv[k] = floor_op(2, per_h).p50_us;
        wv[k] = floor_watch(per_h).p50_us;
        if (have_store) {
            hv[k] = handoff(0, per_h + 2).p50_us;
            av[k] = handoff(DLOCK_FAIR, per_h + 2).p50_us;
            hr[k] = hv[k] / iv[k];
            ar[k] = av[k] / iv[k];
        }
    }
    spread is = medrange(iv, CHUNKS), ws_ = medrange(wv, CHUNKS);
    printf("| write + round trip after 2 ms idle (set, exists) | %.1f "
           "(chunks: %.1f–%.1f) | | |\n",
           is.med, is.min, is.max);
    printf("| write seen by another session's watch, after 2 ms idle (set → "
           "exists watch fires) | %.1f (chunks: %.1f–%.1f) | | |\n",
           ws_.med, ws_.min, ws_.max);
    if (have_store) {
        double hot = wr.med + rt.med, h_med = medrange(hv, CHUNKS).med,
               a_med = medrange(av, CHUNKS).med;
        spread r = medrange(hr, CHUNKS);
        printf("| hand-off, release → waiter's acquire returns, p50 | "
               "%.1f (1 idle write+RTT) | %.1f | **%.2f idle write+RTT** "
               "(chunks: %.2f–%.2f; %.2f hot write+RTT) |\n",
               is.med, h_med, r.med, r.min, r.max, h_med / hot);
        r = medrange(ar, CHUNKS);
        printf("| hand-off, fair mode, p50 | %.1f (1 idle write+RTT) | %.1f "
               "| **%.2f idle write+RTT** (chunks: %.2f–%.2f; %.2f hot "
               "write+RTT) |\n",
               is.med, a_med, r.med, r.min, r.max, a_med / hot);

        printf("\n### ZooKeeper requests per hand-off\n\n");
        printf("N waiters plus the holder contend for %d s (each process: "
               "acquire, release, repeat; a wait gives up after 300 ms and "
               "starts again). Per hand-off between two different "
               "processes: the requests the server received "
               "(`zk_packets_received` of `mntr`, session pings "
               "included).\n\n",
               quick ? 1 : 3);
        printf("| waiters | default: requests | default: hand-offs/s | fair: "
               "requests | fair: hand-offs/s |\n|---|---|---|---|---|\n");
        int ws[] = {1, 8, quick ? 16 : 64};
        for (int i = 0; i < 3; i++) {
            double rd, hd, rf, hf;
            requests_per_handoff(ws[i], 0, &rd, &hd);
            requests_per_handoff(ws[i], DLOCK_FAIR, &rf, &hf);
            printf("| %d | %.1f | %.0f | %.1f | %.0f |\n", ws[i], rd, hd, rf,
                   hf);
        }
    }
    return 0;
}
