/* SPDX-License-Identifier: MIT */
/*
 * bench_redlock.c -- dlock's redlock:// store over N independent Redis
 * servers, beside a bare hiredis floor, dlock's redis:// store on one of
 * them and node-redlock (npm redlock 5 on ioredis) on the same servers,
 * measured in one run.
 *
 *   dlock_bench_redlock HOST:PORT,HOST:PORT,... [--quick]
 *       [--peer SCRIPT MODULES_DIR | --no-peer REASON]
 *
 * Prints Markdown. Floors, on one connection per server:
 *   round trip         PING to the first server
 *   1-node floor       SET key value NX PX 30000, then an EVALSHA
 *                      compare-and-delete, blocking, on the first server
 *   quorum floor       the same two steps to every server at once over
 *                      non-blocking sockets polled together: each step
 *                      sends to all and ends when a quorum (N/2 + 1)
 *                      answered; the replies of the slower servers are
 *                      read and dropped during the next step, as the
 *                      store does. The least one Redlock cycle costs.
 *   all-replies floor  the same, each step waiting for every server
 * The peer (bench/redlock_peer.js --serve) runs in a node process of its
 * own that waits, idle, for "run K N" on its standard input and answers
 * with each cycle's time; its chunks alternate with ours.
 * Every kind of cycle runs in CHUNKS chunks that alternate, so the
 * machine's drift hits all alike: a p50 is the median of the chunks'
 * medians, a ratio the median of the chunks' ratios, a p99 is over all
 * cycles.
 * Requests per cycle: INFO commandstats of every server before and after
 * a run of cycles. Hand-off: two processes pass a lock back and forth;
 * the time from the holder's release call to the waiter's acquire
 * returning, beside round trips after the same 2 ms of idleness.
 */
#include <dlock.h>
#include <hiredis.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "redis.h"

const char bench_prog[] = "bench_redlock";

#define CHUNKS 15
#define MAX_NODES 16
#define TTL "30000" /* ms: dlock's default lease, and node-redlock's here */
/* The hand-off locks' lease: a waiter that misses a release sleeps until
 * the holder's lease ends; 2 s keeps such a stall from taking 30 s of the
 * bench (each one is counted). */
#define HANDOFF_TTL_MS 2000

static int quick;
static int nn, quorum;
static char host[MAX_NODES][256];
static int port[MAX_NODES];
static char nodes_arg[4096];
static char rl_uri[4200], redis_uri[300];

static const char del_lua[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('DEL', KEYS[1]) end return 0";
static char sha[MAX_NODES][41];

/* ------------------------------------------------------------------------ */
/* Blocking connections: the 1-node floor, round trips, INFO                */
/* ------------------------------------------------------------------------ */

static redisContext *connect_blocking(int i)
{
    return r_connect(host[i], port[i], 2, 0);
}

static void load_scripts(void)
{
    for (int i = 0; i < nn; i++) {
        redisContext *c = connect_blocking(i);
        redisReply *r = redisCommand(c, "SCRIPT LOAD %s", del_lua);
        if (!r || r->type != REDIS_REPLY_STRING || r->len != 40)
            die("SCRIPT LOAD", r && r->type == REDIS_REPLY_ERROR ? r->str
                                                                  : "failed");
        memcpy(sha[i], r->str, 41);
        freeReplyObject(r);
        redisFree(c);
    }
}

/* 1-node floor: SET NX PX + EVALSHA compare-and-delete on the first
 * server, as the floor of the Redis section. */
static void floor1_cycles(redisContext *c, int64_t *ns, int n)
{
    for (int i = 0; i < n; i++) {
        int64_t t0 = now_ns();
        r_ok(redisCommand(c, "SET bench-floor owner-0123456789abcdef NX "
                                 "PX " TTL),
                 "SET");
        redisReply *r = redisCommand(c, "EVALSHA %s 1 bench-floor "
                                        "owner-0123456789abcdef",
                                     sha[0]);
        if (!r || r->type != REDIS_REPLY_INTEGER || r->integer != 1)
            die("EVALSHA", r && r->type == REDIS_REPLY_ERROR
                               ? r->str
                               : "the floor's key was not deleted");
        freeReplyObject(r);
        if (ns)
            ns[i] = now_ns() - t0;
    }
}

/* kind 0: PING; kind 1: 2 ms idle, then PING */
static void ping_cycles(redisContext *c, int64_t *ns, int n, int idle)
{
    for (int i = 0; i < n; i++) {
        if (idle)
            sleep_us(2000);
        int64_t t0 = now_ns();
        r_ok(redisCommand(c, "PING"), "PING");
        if (ns)
            ns[i] = now_ns() - t0;
    }
}

/* ------------------------------------------------------------------------ */
/* The quorum floor: every server at once, non-blocking, polled together    */
/* ------------------------------------------------------------------------ */

typedef struct qnode {
    redisContext *c;
    int skip;   /* replies of ended steps still to come: dropped */
    int got;    /* this step's reply arrived */
    int wpend;  /* output not yet all written */
} qnode;

static qnode qn[MAX_NODES];

enum { EXPECT_OK, EXPECT_ONE, EXPECT_PONG };

static void q_connect(void)
{
    for (int i = 0; i < nn; i++) {
        redisContext *c = redisConnectNonBlock(host[i], port[i]);
        if (!c || c->err)
            die("connect", c ? c->errstr : "out of memory");
        struct pollfd p = {c->fd, POLLOUT, 0};
        int err = 0;
        socklen_t len = sizeof(err);
        if (poll(&p, 1, 2000) != 1 ||
            getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err)
            die("connect", err ? strerror(err) : "timed out");
        qn[i].c = c;
        qn[i].skip = qn[i].got = qn[i].wpend = 0;
    }
}

static void q_close(void)
{
    for (int i = 0; i < nn; i++)
        redisFree(qn[i].c);
}

static void q_write(qnode *q)
{
    int done = 0;

    if (redisBufferWrite(q->c, &done) != REDIS_OK)
        die("write", q->c->errstr);
    q->wpend = !done;
}

static void q_check(redisReply *r, int expect)
{
    int ok = 0;

    if (!r || r->type == REDIS_REPLY_ERROR)
        die("floor", r ? r->str : "no reply");
    if (expect == EXPECT_OK)
        ok = r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "OK");
    else if (expect == EXPECT_ONE)
        ok = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    else
        ok = r->type == REDIS_REPLY_STATUS && !strcmp(r->str, "PONG");
    if (!ok)
        die("floor", "unexpected reply");
}

/* One step: the commands appended to every node are sent; returns once
 * `want` nodes have answered this step. The others owe their reply: it
 * is read and dropped during a later step. */
static void q_step(int want, int expect)
{
    struct pollfd pfd[MAX_NODES];
    int who[MAX_NODES], got = 0;

    for (int i = 0; i < nn; i++) {
        qn[i].got = 0;
        q_write(&qn[i]);
    }
    while (got < want) {
        int np = 0;
        for (int i = 0; i < nn; i++) {
            if (qn[i].got && !qn[i].wpend)
                continue;
            pfd[np].fd = qn[i].c->fd;
            pfd[np].events = (short)((qn[i].got ? 0 : POLLIN) |
                                     (qn[i].wpend ? POLLOUT : 0));
            pfd[np].revents = 0;
            who[np++] = i;
        }
        int r = poll(pfd, (nfds_t)np, 5000);
        if (r == 0)
            die("floor", "no quorum of replies within 5 s");
        if (r < 0) {
            if (errno == EINTR)
                continue;
            die("poll", strerror(errno));
        }
        for (int k = 0; k < np; k++) {
            qnode *q = &qn[who[k]];
            if (pfd[k].revents & POLLOUT)
                q_write(q);
            if (!(pfd[k].revents & (POLLIN | POLLERR | POLLHUP)))
                continue;
            if (redisBufferRead(q->c) != REDIS_OK)
                die("read", q->c->errstr);
            for (;;) {
                redisReply *rep = NULL;
                if (redisGetReplyFromReader(q->c, (void **)&rep) != REDIS_OK)
                    die("read", q->c->errstr);
                if (!rep)
                    break;
                if (q->skip > 0) {
                    q->skip--;
                    if (rep->type == REDIS_REPLY_ERROR)
                        die("floor", rep->str);
                } else if (!q->got) {
                    q_check(rep, expect);
                    q->got = 1;
                    got++;
                } else {
                    die("floor", "a reply nobody asked for");
                }
                freeReplyObject(rep);
            }
        }
    }
    for (int i = 0; i < nn; i++)
        if (!qn[i].got)
            qn[i].skip++;
}

/* The Redlock cycle's floor; want: replies awaited per step. */
static void floorq_cycles(int64_t *ns, int n, int want)
{
    for (int i = 0; i < n; i++) {
        int64_t t0 = now_ns();
        for (int k = 0; k < nn; k++)
            redisAppendCommand(qn[k].c, "SET bench-floor "
                                        "owner-0123456789abcdef NX PX " TTL);
        q_step(want, EXPECT_OK);
        for (int k = 0; k < nn; k++)
            redisAppendCommand(qn[k].c, "EVALSHA %s 1 bench-floor "
                                        "owner-0123456789abcdef",
                               sha[k]);
        q_step(want, EXPECT_ONE);
        if (ns)
            ns[i] = now_ns() - t0;
    }
}

/* After 2 ms of idleness, PING to every server, until a quorum answers. */
static void idle_qping_cycles(int64_t *ns, int n)
{
    for (int i = 0; i < n; i++) {
        sleep_us(2000);
        int64_t t0 = now_ns();
        for (int k = 0; k < nn; k++)
            redisAppendCommand(qn[k].c, "PING");
        q_step(quorum, EXPECT_PONG);
        ns[i] = now_ns() - t0;
    }
}

/* ------------------------------------------------------------------------ */
/* The node-redlock peer                                                    */
/* ------------------------------------------------------------------------ */

static struct {
    pid_t pid;
    FILE *in, *out;
    int up;
    char why[300];
    char versions[200];
    char *line;
    size_t cap;
} peer;

static void peer_down(const char *why)
{
    snprintf(peer.why, sizeof(peer.why), "%s", why);
    fprintf(stderr, "bench_redlock: node-redlock: %s\n", why);
    if (peer.in)
        fclose(peer.in);
    if (peer.out)
        fclose(peer.out);
    peer.in = peer.out = NULL;
    if (peer.pid > 0) {
        kill(peer.pid, SIGTERM);
        waitpid(peer.pid, NULL, 0);
    }
    peer.pid = 0;
    peer.up = 0;
}

static void peer_start(const char *script, const char *modules, int warmup)
{
    int to[2], from[2];
    char w[24];

    snprintf(w, sizeof(w), "%d", warmup);
    if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0)
        die("pipe", strerror(errno));
    fflush(stdout);
    peer.pid = fork();
    if (peer.pid < 0)
        die("fork", strerror(errno));
    if (peer.pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        execlp("node", "node", script, "--modules", modules, "--nodes",
               nodes_arg, "--serve", "--warmup", w, (char *)NULL);
        fprintf(stderr, "bench_redlock: node: %s\n", strerror(errno));
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    peer.in = fdopen(to[1], "w");
    peer.out = fdopen(from[0], "r");
    if (!peer.in || !peer.out)
        die("fdopen", strerror(errno));
    if (getline(&peer.line, &peer.cap, peer.out) < 0 ||
        strncmp(peer.line, "ready ", 6) != 0) {
        peer_down("the node process did not start (its message is on the "
                  "bench's standard error)");
        return;
    }
    peer.line[strcspn(peer.line, "\n")] = '\0';
    snprintf(peer.versions, sizeof(peer.versions), "%s", peer.line + 6);
    peer.up = 1;
}

/* n cycles of node-redlock over k nodes; 0, or -1 (the peer is down) */
static int peer_run(int k, int64_t *ns, int n)
{
    if (!peer.up)
        return -1;
    if (fprintf(peer.in, "run %d %d\n", k, n) < 0 || fflush(peer.in) != 0) {
        peer_down("the node process went away");
        return -1;
    }
    if (getline(&peer.line, &peer.cap, peer.out) < 0) {
        peer_down("the node process failed (its message is on the bench's "
                  "standard error)");
        return -1;
    }
    char *p = peer.line, *end;
    int gk, gn;
    if (sscanf(p, "samples %d %d", &gk, &gn) != 2 || gk != k || gn != n) {
        peer_down("the node process answered out of turn");
        return -1;
    }
    p += strlen("samples");
    strtol(p, &p, 10);
    strtol(p, &p, 10);
    for (int i = 0; i < n; i++) {
        long long v = strtoll(p, &end, 10);
        if (end == p) {
            peer_down("the node process sent too few samples");
            return -1;
        }
        p = end;
        if (ns)
            ns[i] = v;
    }
    return 0;
}

static void peer_stop(void)
{
    if (!peer.up)
        return;
    fprintf(peer.in, "quit\n");
    fclose(peer.in);
    fclose(peer.out);
    waitpid(peer.pid, NULL, 0);
    peer.up = 0;
}

/* ------------------------------------------------------------------------ */
/* Requests per cycle                                                       */
/* ------------------------------------------------------------------------ */

typedef struct counts {
    long long req, all, conns, set;
} counts;

/* Over every server: commands clients sent (req), every command run,
 * scripts' included (all), connections accepted (conns). */
static counts server_counts(redisContext **ic)
{
    static const char *const sent[] = {"evalsha", "eval", "script",
                                       "subscribe", "unsubscribe", "ping",
                                       "auth", "select", "hello", "client",
                                       "quit", NULL};
    counts t = {0, 0, 0, 0};

    for (int i = 0; i < nn; i++) {
        redisReply *r = redisCommand(ic[i], "INFO commandstats");
        if (!r || r->type != REDIS_REPLY_STRING)
            die("INFO", "failed");
        t.all += r_calls(r->str, NULL);
        t.set += r_calls(r->str, (const char *const[]){"set", NULL});
        t.req += r_calls(r->str, sent);
        freeReplyObject(r);
        r = redisCommand(ic[i], "INFO stats");
        if (!r || r->type != REDIS_REPLY_STRING)
            die("INFO", "failed");
        const char *c = strstr(r->str, "total_connections_received:");
        if (c)
            t.conns += atoll(c + strlen("total_connections_received:"));
        freeReplyObject(r);
    }
    return t;
}

static counts counts_diff(counts a, counts b)
{
    counts d = {b.req - a.req, b.all - a.all, b.conns - a.conns,
                b.set - a.set};

    return d;
}

/* ------------------------------------------------------------------------ */
/* Hand-off between two processes                                           */
/* ------------------------------------------------------------------------ */

/* n hand-offs of dlock on uri (a short lease: HANDOFF_TTL_MS), their
 * times into out (if not NULL) */
static stats handoff(const char *uri, int n, int64_t *out)
{
    dlock_party p = {uri, NULL, 0, HANDOFF_TTL_MS, -1};

    return handoff_dlock(&p, n, out);
}

/* ------------------------------------------------------------------------ */

static void parse_nodes(const char *arg)
{
    const char *p = arg;

    snprintf(nodes_arg, sizeof(nodes_arg), "%s", arg);
    while (*p) {
        size_t len = strcspn(p, ",");
        const char *colon = memchr(p, ':', len);
        if (nn == MAX_NODES)
            die("nodes", "too many");
        if (!colon || colon == p)
            die("nodes", "expected HOST:PORT,HOST:PORT,...");
        snprintf(host[nn], sizeof(host[nn]), "%.*s", (int)(colon - p), p);
        port[nn] = atoi(colon + 1);
        if (port[nn] <= 0)
            die("nodes", "bad port");
        nn++;
        p += len;
        if (*p == ',')
            p++;
    }
    if (nn < 1)
        die("nodes", "none given");
    quorum = nn / 2 + 1;
    snprintf(rl_uri, sizeof(rl_uri), "redlock://%s", arg);
    snprintf(redis_uri, sizeof(redis_uri), "redis://%s:%d", host[0],
             port[0]);
}

/* the kinds of cycle, in the order each chunk runs them */
enum { K_PING, K_F1, K_D1, K_N1, K_FQ, K_FALL, K_DQ, K_NQ, NKINDS };

static double p50[NKINDS][CHUNKS]; /* each chunk's p50 of each kind */

static spread ratio(int a, int b)
{
    return ratios(p50[a], p50[b], CHUNKS);
}

int main(int argc, char **argv)
{
    const char *peer_script = NULL, *peer_modules = NULL;

    if (argc < 2) {
        fprintf(stderr, "usage: dlock_bench_redlock HOST:PORT,... [--quick] "
                        "[--peer SCRIPT MODULES_DIR | --no-peer REASON]\n");
        return 2;
    }
    parse_nodes(argv[1]);
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) {
            quick = 1;
        } else if (!strcmp(argv[i], "--peer") && i + 2 < argc) {
            peer_script = argv[++i];
            peer_modules = argv[++i];
        } else if (!strcmp(argv[i], "--no-peer") && i + 1 < argc) {
            snprintf(peer.why, sizeof(peer.why), "%s", argv[++i]);
        } else {
            die(argv[i], "unknown argument");
        }
    }
    if (!peer_script && !peer.why[0])
        snprintf(peer.why, sizeof(peer.why), "no --peer given");
    signal(SIGPIPE, SIG_IGN);

    int n = quick ? 300 : 15000; /* cycles of each kind */
    int per = n / CHUNKS;
    int warm = quick ? 100 : 1000;
    int nh = quick ? 45 : 450; /* hand-offs of each kind */
    int per_h = nh / CHUNKS;
    int ncount = quick ? 100 : 1000;

    /* the peer first: no dlock client thread runs while we fork */
    if (peer_script)
        peer_start(peer_script, peer_modules, quick ? 300 : 2000);

    load_scripts();
    q_connect();
    redisContext *c1 = connect_blocking(0);
    redisContext *ic[MAX_NODES];
    for (int i = 0; i < nn; i++)
        ic[i] = connect_blocking(i);
    dlock_client *dc1 = h_open_client(redis_uri, NULL);
    dlock_client *dcq = h_open_client(rl_uri, NULL);
    dlock *dl1 = h_open_lock(dc1, "bench-cycle-redis", 0, 0);
    dlock *dlq = h_open_lock(dcq, "bench-cycle-redlock", 0, 0);

    /* warm-up, not measured */
    floor1_cycles(c1, NULL, warm);
    floorq_cycles(NULL, warm, quorum);
    floorq_cycles(NULL, warm, nn);
    h_dlock_cycles(dl1, NULL, warm);
    h_dlock_cycles(dlq, NULL, warm);

    int64_t *ns[NKINDS];
    for (int k = 0; k < NKINDS; k++)
        if (!(ns[k] = malloc(sizeof(int64_t) * (size_t)per * CHUNKS)))
            die("malloc", "out of memory");
    int64_t *chunk = malloc(sizeof(int64_t) * (size_t)per);
    if (!chunk)
        die("malloc", "out of memory");
    int have_peer = peer.up;
    for (int ch = 0; ch < CHUNKS; ch++) {
        size_t o = (size_t)ch * (size_t)per;
        ping_cycles(c1, ns[K_PING] + o, per, 0);
        floor1_cycles(c1, ns[K_F1] + o, per);
        h_dlock_cycles(dl1, ns[K_D1] + o, per);
        if (have_peer && peer_run(1, ns[K_N1] + o, per) != 0)
            have_peer = 0;
        floorq_cycles(ns[K_FQ] + o, per, quorum);
        floorq_cycles(ns[K_FALL] + o, per, nn);
        h_dlock_cycles(dlq, ns[K_DQ] + o, per);
        if (have_peer && peer_run(nn, ns[K_NQ] + o, per) != 0)
            have_peer = 0;
        for (int k = 0; k < NKINDS; k++) {
            if ((k == K_N1 || k == K_NQ) && !have_peer)
                continue;
            memcpy(chunk, ns[k] + o, sizeof(int64_t) * (size_t)per);
            p50[k][ch] = summarize(chunk, per).p50_us;
        }
    }

    /* requests per cycle, every server */
    free(chunk);
    counts c0 = server_counts(ic);
    floorq_cycles(NULL, ncount, quorum);
    counts cf = counts_diff(c0, server_counts(ic));
    c0 = server_counts(ic);
    h_dlock_cycles(dlq, NULL, ncount);
    counts cd = counts_diff(c0, server_counts(ic));
    counts cn = {0, 0, 0, 0};
    if (have_peer) {
        c0 = server_counts(ic);
        if (peer_run(nn, NULL, ncount) == 0)
            cn = counts_diff(c0, server_counts(ic));
        else
            have_peer = 0;
    }
    peer_stop();

    stats all[NKINDS];
    spread med[NKINDS];
    for (int k = 0; k < NKINDS; k++) {
        if ((k == K_N1 || k == K_NQ) && !have_peer)
            continue;
        all[k] = summarize(ns[k], per * CHUNKS);
        med[k] = medrange(p50[k], CHUNKS);
    }
    printf("## Redlock (%s)\n\n", rl_uri);
    printf("%d independent redis-servers on this machine (no persistence), "
           "quorum %d. Latency in microseconds. Cycles: %d of each kind, in "
           "%d chunks in which every kind runs in turn (so the machine's "
           "drift hits all alike); a p50 is the median of the chunks' "
           "medians, a p99 is over all cycles, a ratio is the median of the "
           "chunks' ratios (with their spread). Everything runs on one "
           "connection per server, kept open, after a warm-up. ",
           nn, quorum, per * CHUNKS, CHUNKS);
    if (have_peer)
        printf("node-redlock: %s, in a node process of its own that waits "
               "idle while the others run; `redlock.acquire([key], 30000)` "
               "then `lock.release()`, retryCount 0, one ioredis client per "
               "server.\n\n",
               peer.versions);
    else
        printf("node-redlock: not measured: %s.\n\n", peer.why);

    printf("| floor | p50 | p99 |\n|---|---|---|\n");
    printf("| round trip (PING, first server) | %.1f (chunks: %.1f–%.1f) | "
           "%.1f |\n",
           med[K_PING].med, med[K_PING].min, med[K_PING].max,
           all[K_PING].p99_us);
    printf("| 1 server: `SET key value NX PX 30000`, then the `EVALSHA` "
           "compare-and-delete | %.1f | %.1f |\n",
           med[K_F1].med, all[K_F1].p99_us);
    spread fq1 = ratio(K_FQ, K_F1);
    printf("| %d servers: each of the two steps sent to all at once, done "
           "when %d answered (the Redlock floor) | %.1f (%.2fx the 1-server "
           "floor) | %.1f |\n",
           nn, quorum, med[K_FQ].med, fq1.med, all[K_FQ].p99_us);
    spread fa = ratio(K_FALL, K_FQ);
    printf("| %d servers, each step done when all %d answered | %.1f "
           "(%.2fx the quorum floor) | %.1f |\n\n",
           nn, nn, med[K_FALL].med, fa.med, all[K_FALL].p99_us);

    printf("| uncontended acquire + release | floor | dlock | node-redlock "
           "| dlock ÷ floor | node-redlock ÷ floor | dlock ÷ node-redlock "
           "|\n|---|---|---|---|---|---|---|\n");
    for (int q = 0; q < 2; q++) {
        int f = q ? K_FQ : K_F1, d = q ? K_DQ : K_D1, p = q ? K_NQ : K_N1;
        spread df = ratio(d, f);
        if (q)
            printf("| %d servers (`redlock://`; floor: the Redlock floor), "
                   "p50 ",
                   nn);
        else
            printf("| 1 server (dlock: `redis://` on the first server; "
                   "node-redlock with one client), p50 ");
        if (have_peer) {
            spread pf = ratio(p, f), dp = ratio(d, p);
            printf("| %.1f | %.1f | %.1f | **%.2fx** (chunks: %.2f–%.2f) | "
                   "%.2fx (chunks: %.2f–%.2f) | **%.2fx** (chunks: "
                   "%.2f–%.2f) |\n",
                   med[f].med, med[d].med, med[p].med, df.med, df.min,
                   df.max, pf.med, pf.min, pf.max, dp.med, dp.min, dp.max);
            printf("| the same, p99 | %.1f | %.1f | %.1f | %.2fx | %.2fx | "
                   "%.2fx |\n",
                   all[f].p99_us, all[d].p99_us, all[p].p99_us,
                   all[d].p99_us / all[f].p99_us,
                   all[p].p99_us / all[f].p99_us,
                   all[d].p99_us / all[p].p99_us);
            printf("| the same, cycles per second (one client) | %.0f | %.0f "
                   "| %.0f | | | |\n",
                   all[f].per_s, all[d].per_s, all[p].per_s);
        } else {
            printf("| %.1f | %.1f | | **%.2fx** (chunks: %.2f–%.2f) | | |\n",
                   med[f].med, med[d].med, df.med, df.min, df.max);
            printf("| the same, p99 | %.1f | %.1f | | %.2fx | | |\n",
                   all[f].p99_us, all[d].p99_us,
                   all[d].p99_us / all[f].p99_us);
            printf("| the same, cycles per second (one client) | %.0f | %.0f "
                   "| | | | |\n",
                   all[f].per_s, all[d].per_s);
        }
    }
    spread d51 = ratio(K_DQ, K_D1);
    if (have_peer) {
        spread n51 = ratio(K_NQ, K_N1);
        printf("| %d servers ÷ 1 server, p50 | %.2fx | %.2fx | %.2fx | | | "
               "|\n",
               nn, fq1.med, d51.med, n51.med);
    } else {
        printf("| %d servers ÷ 1 server, p50 | %.2fx | %.2fx | | | | |\n",
               nn, fq1.med, d51.med);
    }

    printf("\n### Redlock requests per cycle\n\n");
    printf("%d uncontended cycles, counted on every server (INFO "
           "commandstats and INFO stats, before and after): *requests* = "
           "commands the client sent (EVALSHA, EVAL, SCRIPT, ...), "
           "*server* = every command the servers ran, those inside the "
           "scripts included; *connections* = connections the servers "
           "accepted meanwhile.\n\n",
           ncount);
    printf("| client | requests | server | connections |\n|---|---|---|---|"
           "\n");
    /* the floor's SETs are its own requests (dlock's and node-redlock's
     * run inside their scripts) */
    printf("| floor (`SET NX PX`, `EVALSHA`) | %.2f | %.2f | %lld |\n",
           (double)(cf.req + cf.set) / ncount, (double)cf.all / ncount,
           cf.conns);
    printf("| dlock `redlock://` | %.2f | %.2f | %lld |\n",
           (double)cd.req / ncount, (double)cd.all / ncount, cd.conns);
    if (have_peer)
        printf("| node-redlock | %.2f | %.2f | %lld |\n",
               (double)cn.req / ncount, (double)cn.all / ncount, cn.conns);

    /* hand-off: the cycle clients go first (no client thread runs while
     * we fork) */
    dlock_close(dl1);
    dlock_close(dlq);
    dlock_client_close(dc1);
    dlock_client_close(dcq);
    double iv[CHUNKS], qv[CHUNKS], h1[CHUNKS], hq[CHUNKS];
    double r1[CHUNKS], rq[CHUNKS], rqq[CHUNKS];
    int64_t *tmp = malloc(sizeof(int64_t) * (size_t)per_h);
    int64_t *a1 = malloc(sizeof(int64_t) * (size_t)per_h * CHUNKS);
    int64_t *aq = malloc(sizeof(int64_t) * (size_t)per_h * CHUNKS);
    if (!tmp || !a1 || !aq)
        die("malloc", "out of memory");
    for (int ch = 0; ch < CHUNKS; ch++) {
        ping_cycles(c1, tmp, per_h, 1);
        iv[ch] = summarize(tmp, per_h).p50_us;
        idle_qping_cycles(tmp, per_h);
        qv[ch] = summarize(tmp, per_h).p50_us;
        size_t o = (size_t)ch * (size_t)per_h;
        h1[ch] = handoff(redis_uri, per_h, a1 + o).p50_us;
        hq[ch] = handoff(rl_uri, per_h, aq + o).p50_us;
        r1[ch] = h1[ch] / iv[ch];
        rq[ch] = hq[ch] / iv[ch];
        rqq[ch] = hq[ch] / qv[ch];
    }
    free(tmp);
    stats t1 = summarize(a1, per_h * CHUNKS);
    stats tq = summarize(aq, per_h * CHUNKS);
    double max1 = (double)a1[per_h * CHUNKS - 1] / 1000;
    double maxq = (double)aq[per_h * CHUNKS - 1] / 1000;
    int slow1 = 0, slowq = 0; /* over 100 ms */
    for (int i = 0; i < per_h * CHUNKS; i++) {
        slow1 += a1[i] > 100000000;
        slowq += aq[i] > 100000000;
    }
    free(a1);
    free(aq);
    spread si = medrange(iv, CHUNKS), sq = medrange(qv, CHUNKS);
    spread s1 = medrange(h1, CHUNKS), sh = medrange(hq, CHUNKS);
    spread sr1 = medrange(r1, CHUNKS), srq = medrange(rq, CHUNKS);
    spread srqq = medrange(rqq, CHUNKS);
    printf("\n### Redlock hand-off\n\n");
    printf("Two processes pass one lock back and forth (%d hand-offs of "
           "each kind, in %d chunks alternating with the floors); the time "
           "from the holder's `dlock_release()` call to the waiting "
           "process's `dlock_acquire()` returning (p50: the median of the "
           "chunks' medians; p99 and max over all). A release on "
           "`redlock://` publishes on every server it frees; a waiter "
           "listens on %d of them (so on one server of any quorum), then "
           "tries again on all %d. Floors: after the same 2 ms of idleness "
           "that precedes every hand-off, a PING to the first server (idle "
           "RTT), and a PING to all %d at once until %d answered (idle "
           "quorum RTT). The lock's lease is %d ms: a waiter that misses "
           "the release wakes only when the holder's lease has run out "
           "(*over 100 ms*).\n\n",
           per_h * CHUNKS, CHUNKS, nn - quorum + 1, nn, nn, quorum,
           HANDOFF_TTL_MS);
    printf("| measure | p50 | p99 / max | over 100 ms | p50 in idle RTT | "
           "p50 in idle quorum RTT |\n|---|---|---|---|---|---|\n");
    printf("| idle RTT (PING, first server) | %.1f (chunks: %.1f–%.1f) | | | "
           "1 | |\n",
           si.med, si.min, si.max);
    printf("| idle quorum RTT (PING to all %d, %d answers) | %.1f (chunks: "
           "%.1f–%.1f) | | | %.2f | 1 |\n",
           nn, quorum, sq.med, sq.min, sq.max, sq.med / si.med);
    printf("| hand-off, `redis://` on the first server | %.1f (chunks: "
           "%.1f–%.1f) | %.1f / %.1f | %d of %d | **%.2f** (chunks: "
           "%.2f–%.2f) | |\n",
           s1.med, s1.min, s1.max, t1.p99_us, max1, slow1, per_h * CHUNKS,
           sr1.med, sr1.min, sr1.max);
    printf("| hand-off, `redlock://` on all %d | %.1f (chunks: %.1f–%.1f) | "
           "%.1f / %.1f | %d of %d | **%.2f** (chunks: %.2f–%.2f) | **%.2f** "
           "(chunks: %.2f–%.2f) |\n",
           nn, sh.med, sh.min, sh.max, tq.p99_us, maxq, slowq,
           per_h * CHUNKS, srq.med, srq.min, srq.max, srqq.med, srqq.min,
           srqq.max);

    for (int k = 0; k < NKINDS; k++)
        free(ns[k]);
    for (int i = 0; i < nn; i++)
        redisFree(ic[i]);
    redisFree(c1);
    q_close();
    return 0;
}
