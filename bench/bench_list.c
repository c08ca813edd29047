/* SPDX-License-Identifier: MIT */
/*
 * bench_list.c -- `dlock list` on a Redis store with many locks: the
 * target is "100,000 locks: first page <= 50 ms, never blocking the
 * server (SCAN), memory bounded".
 *
 *   bench_list REDIS_URI [--quick] [--locks N]
 *
 * REDIS_URI (redis://host:port) is a server to use (bench/run.sh's, or
 * one that `th_serve redis` started): the bench writes its locks under
 * the store prefix "benchlist:" and removes them at the end (nothing else
 * is touched).
 * N = 100000 locks (--quick: 10000).
 *
 * The locks: N held locks written straight in the store's own format,
 * one key each, `benchlist:{bl-NNNNNN}` = "OWNER TOKEN ACQUIRED_MS
 * DESCRIPTION" with a 600 s PEXPIRE (the value an exclusive hold
 * writes; redis.c), by pipelined SETs (1,000 per round trip): acquiring
 * them through clients would only take longer and leave the same keys.
 * That they are faithful is checked: dlock_inspect() of a few of them
 * says held, with the token written.
 *
 * Measured, in this order:
 *  - the first page (limit 100, no prefix) on an open client, RUNS times:
 *    median and max, and their ratio to the 50 ms target; also a new
 *    client (connect, login, script loads) and its first page, as a
 *    `dlock list` command pays;
 *  - a full walk of every page (limit 100), in a child process (this
 *    program again, fresh, so that its peak RSS is its own): its time,
 *    pages, locks found (each of the N must be), and the growth of its
 *    peak RSS (getrusage) from just before the first page to after the
 *    first page and after the whole walk (memory for one page: the two
 *    stay alike whatever N);
 *  - meanwhile, on another connection, a PING every millisecond: its
 *    round trip's median and max during the walk beside the same with
 *    nothing else running (the server never blocked for longer than that
 *    max), and from INFO commandstats the commands the walk ran: KEYS
 *    (must be 0), SCAN and EVALSHA, with the server's µs per call.
 *
 * Prints Markdown: a subsection with one table row.
 */
#include <dlock.h>
#include <hiredis.h>

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "harness.h"
#include "redis.h"

const char bench_prog[] = "bench_list";

#define PREFIX "benchlist:"
#define NAME_FMT "bl-%06d"
#define TTL_MS 600000
#define PIPE 1000       /* SETs per round trip when filling */
#define LIMIT 100       /* a page */
#define TARGET_MS 50.0  /* the first page's target */
#define PING_EVERY_US 1000
#define PINGS_MAX 200000

static char host[256];
static int port;
static int nlocks;

static redisContext *connect_redis(void)
{
    return r_connect(host, port, 10, 10);
}

/* ------------------------------------------------------------------------ */
/* The locks                                                                */
/* ------------------------------------------------------------------------ */

#define OWNER "0123456789abcdef0123456789abcdef"
#define TOKEN0 1700000000000000ULL

/* Writes the N held locks (pipelined SETs); returns the seconds taken. */
static double fill(redisContext *c)
{
    int64_t t0 = now_ns();
    long long ms = (long long)(TOKEN0 / 1000);

    for (int i = 0; i < nlocks; i += PIPE) {
        int m = nlocks - i < PIPE ? nlocks - i : PIPE;
        for (int k = i; k < i + m; k++) {
            char key[64], val[160];
            snprintf(key, sizeof(key), PREFIX "{" NAME_FMT "}", k);
            snprintf(val, sizeof(val),
                     OWNER ":%d %llu %lld bench-host pid 4242 tid %d",
                     k % 64 + 1, (unsigned long long)(TOKEN0 + (unsigned)k),
                     ms, k % 64 + 1);
            redisAppendCommand(c, "SET %s %s PX %d", key, val, TTL_MS);
        }
        for (int k = 0; k < m; k++) {
            redisReply *r = NULL;
            if (redisGetReply(c, (void **)&r) != REDIS_OK || !r ||
                r->type == REDIS_REPLY_ERROR)
                die("SET", r ? r->str : c->errstr);
            freeReplyObject(r);
        }
    }
    return (double)(now_ns() - t0) / 1e9;
}

static void unfill(redisContext *c)
{
    for (int i = 0; i < nlocks; i += PIPE) {
        int m = nlocks - i < PIPE ? nlocks - i : PIPE;
        for (int k = i; k < i + m; k++) {
            char key[64];
            snprintf(key, sizeof(key), PREFIX "{" NAME_FMT "}", k);
            redisAppendCommand(c, "UNLINK %s", key);
        }
        for (int k = 0; k < m; k++) {
            redisReply *r = NULL;
            if (redisGetReply(c, (void **)&r) != REDIS_OK || !r)
                die("UNLINK", c->errstr);
            freeReplyObject(r);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* The walk (in a child: this program again)                               */
/* ------------------------------------------------------------------------ */

static long maxrss_kb(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* Child: walks every page; prints "pages found seconds rss_first rss_all
 * listed_twice" (RSS growth in KiB from before the first page). */
static int walk_main(const char *uri, int n)
{
    dlock_client *c = h_open_client(uri, NULL);
    unsigned char *seen = calloc((size_t)n / 8 + 1, 1);
    char *cursor = NULL;
    long pages = 0, found = 0, twice = 0, rss_first = 0;

    if (!seen)
        die("walk", "out of memory");
    long rss0 = maxrss_kb();
    int64_t t0 = now_ns();
    for (;;) {
        dlock_list_page p;
        int rc = dlock_list(c, NULL, cursor, LIMIT, 0, &p);
        if (rc)
            die("dlock_list", dlock_errmsg());
        free(cursor);
        cursor = p.next ? strdup(p.next) : NULL;
        for (size_t i = 0; i < p.n; i++) {
            int k;
            char end;
            if (sscanf(p.locks[i].name, "bl-%d%c", &k, &end) != 1 || k < 0 ||
                k >= n || !p.locks[i].info.held ||
                p.locks[i].info.token != TOKEN0 + (unsigned)k)
                die("walk", "a lock listed wrong");
            if (seen[k / 8] & (1 << (k % 8))) {
                twice++;
                continue;
            }
            seen[k / 8] |= (unsigned char)(1 << (k % 8));
            found++;
        }
        dlock_list_clear(&p);
        if (++pages == 1)
            rss_first = maxrss_kb() - rss0;
        if (!cursor)
            break;
        if (pages > 10L * n)
            die("walk", "the cursor never ends");
    }
    double secs = (double)(now_ns() - t0) / 1e9;
    printf("%ld %ld %.6f %ld %ld %ld\n", pages, found, secs, rss_first,
           maxrss_kb() - rss0, twice);
    free(seen);
    dlock_client_close(c);
    return 0;
}

typedef struct walk_result {
    long pages, found, rss_first_kb, rss_all_kb, twice;
    double secs;
} walk_result;

static walk_result run_walk(const char *self, const char *uri)
{
    int fd[2];
    char nb[16], out[256];
    walk_result w;

    if (pipe(fd) != 0)
        die("pipe", strerror(errno));
    snprintf(nb, sizeof(nb), "%d", nlocks);
    pid_t pid = fork();
    if (pid < 0)
        die("fork", strerror(errno));
    if (pid == 0) {
        dup2(fd[1], 1);
        close(fd[0]);
        close(fd[1]);
        execl(self, self, "--walk", uri, nb, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < sizeof(out) &&
           (r = read(fd[0], out + got, sizeof(out) - 1 - got)) > 0)
        got += (size_t)r;
    out[got] = '\0';
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    memset(&w, 0, sizeof(w));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 ||
        sscanf(out, "%ld %ld %lf %ld %ld %ld", &w.pages, &w.found, &w.secs,
               &w.rss_first_kb, &w.rss_all_kb, &w.twice) != 6)
        die("walk", "the child failed");
    return w;
}

/* ------------------------------------------------------------------------ */
/* The server's latency meanwhile                                           */
/* ------------------------------------------------------------------------ */

typedef struct pinger {
    pthread_t th;
    volatile int stop;
    int64_t *ns;
    int n;
} pinger;

static void *ping_loop(void *arg)
{
    pinger *p = arg;
    redisContext *c = connect_redis();

    while (!p->stop && p->n < PINGS_MAX) {
        int64_t t0 = now_ns();
        redisReply *r = redisCommand(c, "PING");
        if (!r)
            die("PING", c->errstr);
        freeReplyObject(r);
        p->ns[p->n++] = now_ns() - t0;
        sleep_us(PING_EVERY_US);
    }
    redisFree(c);
    return NULL;
}

static void ping_start(pinger *p)
{
    memset(p, 0, sizeof(*p));
    if (!(p->ns = malloc(PINGS_MAX * sizeof(*p->ns))))
        die("ping", "out of memory");
    if (pthread_create(&p->th, NULL, ping_loop, p) != 0)
        die("ping", "cannot start a thread");
}

/* Stops it; *med and *max of the round trips, in ms. */
static void ping_stop(pinger *p, double *med, double *max)
{
    p->stop = 1;
    pthread_join(p->th, NULL);
    if (p->n == 0)
        die("ping", "no round trip");
    qsort(p->ns, (size_t)p->n, sizeof(*p->ns), cmp64);
    *med = (double)p->ns[p->n / 2] / 1e6;
    *max = (double)p->ns[p->n - 1] / 1e6;
    free(p->ns);
}

/* INFO commandstats: calls and usec of one command. */
static void cmdstat(redisContext *c, const char *cmd, long long *calls,
                    long long *usec)
{
    redisReply *r = r_command(c, "INFO commandstats");
    char key[64];

    snprintf(key, sizeof(key), "cmdstat_%s:calls=", cmd);
    const char *p = strstr(r->str, key);
    *calls = p ? atoll(p + strlen(key)) : 0;
    const char *u = p ? strstr(p, "usec=") : NULL;
    *usec = u ? atoll(u + 5) : 0;
    freeReplyObject(r);
}

/* ------------------------------------------------------------------------ */
/* Main                                                                     */
/* ------------------------------------------------------------------------ */

static int cmpdbl(const void *a, const void *b)
{
    return cmpd(a, b);
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "--walk"))
        return walk_main(argv[2], atoi(argv[3]));
    if (argc < 2) {
        fprintf(stderr, "usage: bench_list REDIS_URI [--quick] [--locks N]\n");
        return 2;
    }
    nlocks = 100000;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            nlocks = 10000;
        else if (!strcmp(argv[i], "--locks") && i + 1 < argc)
            nlocks = atoi(argv[++i]);
        else
            die(argv[i], "unknown argument");
    }
    if (nlocks < 1000)
        die("--locks", "at least 1000");
    signal(SIGPIPE, SIG_IGN);
    r_address(argv[1], host, sizeof(host), &port);
    int runs = nlocks >= 100000 ? 21 : 11;
    char uri[512];
    snprintf(uri, sizeof(uri), "redis://%s:%d?prefix=" PREFIX, host, port);

    redisContext *rc = connect_redis();
    unfill(rc); /* a run that died left its keys */
    double fill_s = fill(rc);

    /* faithful: dlock reads the keys as the holds they copy */
    dlock_client *c = h_open_client(uri, NULL);
    for (int k = 0; k < nlocks; k += nlocks / 7) {
        char name[32];
        dlock_info in;
        snprintf(name, sizeof(name), NAME_FMT, k);
        if (dlock_inspect(c, name, &in) != DLOCK_OK || !in.held ||
            in.token != TOKEN0 + (unsigned)k || in.ttl_ms <= 0)
            die("inspect", "a written lock is not read as held");
        dlock_info_clear(&in);
    }

    /* the first page, on an open client */
    double *first = malloc((size_t)runs * sizeof(double));
    double *cold = malloc((size_t)runs * sizeof(double));
    if (!first || !cold)
        die("runs", "out of memory");
    for (int i = 0; i < runs; i++) {
        dlock_list_page p;
        int64_t t0 = now_ns();
        if (dlock_list(c, NULL, NULL, LIMIT, 0, &p) != DLOCK_OK)
            die("dlock_list", dlock_errmsg());
        first[i] = (double)(now_ns() - t0) / 1e6;
        if (p.n < LIMIT / 2 || !p.next)
            die("dlock_list", "a short first page");
        dlock_list_clear(&p);
    }
    /* ... and with a new client each time (a `dlock list` command) */
    for (int i = 0; i < runs; i++) {
        dlock_list_page p;
        int64_t t0 = now_ns();
        dlock_client *nc = h_open_client(uri, NULL);
        if (dlock_list(nc, NULL, NULL, LIMIT, 0, &p) != DLOCK_OK)
            die("dlock_list", dlock_errmsg());
        dlock_list_clear(&p);
        dlock_client_close(nc);
        cold[i] = (double)(now_ns() - t0) / 1e6;
    }
    qsort(first, (size_t)runs, sizeof(double), cmpdbl);
    qsort(cold, (size_t)runs, sizeof(double), cmpdbl);
    double first_med = first[runs / 2], first_max = first[runs - 1];
    double cold_med = cold[runs / 2];
    dlock_client_close(c);

    /* the server's round trip with nothing else running */
    pinger pg;
    double idle_med, idle_max, walk_med, walk_max;
    ping_start(&pg);
    sleep_us(1000000);
    ping_stop(&pg, &idle_med, &idle_max);

    /* the full walk, with the pings and the command counts */
    long long keys0, keys1, scan0, scan1, eval0, eval1, us;
    long long scan_us0, scan_us1, eval_us0, eval_us1;
    cmdstat(rc, "keys", &keys0, &us);
    cmdstat(rc, "scan", &scan0, &scan_us0);
    cmdstat(rc, "evalsha", &eval0, &eval_us0);
    ping_start(&pg);
    walk_result w = run_walk("/proc/self/exe", uri);
    ping_stop(&pg, &walk_med, &walk_max);
    cmdstat(rc, "keys", &keys1, &us);
    cmdstat(rc, "scan", &scan1, &scan_us1);
    cmdstat(rc, "evalsha", &eval1, &eval_us1);
    if (w.found != nlocks)
        die("walk", "not every lock was listed");
    unfill(rc);
    redisFree(rc);

    long long scans = scan1 - scan0, evals = eval1 - eval0;
    printf("### Listing %d locks (`dlock_list()`)\n\n", nlocks);
    printf("%d held locks written in the store's format (one key each, "
           "pipelined SETs: %.1f s), checked by `dlock_inspect()`. First "
           "page: `dlock_list(c, NULL, NULL, %d, 0, &page)`, %d runs on an "
           "open client (median / max; ÷ target: the median's and the "
           "max's ratio to %.0f ms), and with a new client each run "
           "(connect, login, script loads: what a `dlock list` command "
           "pays; median). Full walk: every page of %d, in a fresh "
           "process; *RSS growth*: its peak RSS (getrusage) after the "
           "first page and after the whole walk, over its RSS just "
           "before. *PING*: another connection's round trip every "
           "millisecond, with nothing else running and during the walk "
           "(its max is the longest the server kept a client waiting). "
           "*Server µs*: INFO commandstats' time per call of SCAN and of "
           "the list script (EVALSHA: its %d-key reads).\n\n",
           nlocks, fill_s, LIMIT, runs, TARGET_MS, LIMIT, LIMIT);
    printf("| locks | first page, median / max | ÷ %.0f ms target | new "
           "client + first page | full walk: pages, time | RSS growth: "
           "first page / whole walk | PING idle, median / max | PING "
           "during the walk, median / max | SCAN calls, server µs each | "
           "scripts, server µs each | KEYS calls |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|\n",
           TARGET_MS);
    printf("| %d | %.2f / %.2f ms | **%.3fx** / %.3fx | %.2f ms | %ld "
           "pages (%ld listed twice), %.2f s | %ld / %ld KiB | %.3f / %.2f "
           "ms | %.3f / %.2f ms | %lld, %.0f | %lld, %.0f | %lld |\n",
           nlocks, first_med, first_max, first_med / TARGET_MS,
           first_max / TARGET_MS, cold_med, w.pages, w.twice, w.secs,
           w.rss_first_kb, w.rss_all_kb, idle_med, idle_max, walk_med,
           walk_max, scans,
           scans ? (double)(scan_us1 - scan_us0) / (double)scans : 0.0,
           evals,
           evals ? (double)(eval_us1 - eval_us0) / (double)evals : 0.0,
           keys1 - keys0);
    free(first);
    free(cold);
    return 0;
}
