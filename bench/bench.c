/* SPDX-License-Identifier: MIT */
/*
 * bench.c -- dlock beside the floor of each store, measured in one run.
 *
 *   bench REDIS_URI FILE_DIR [--quick]
 *
 * Prints Markdown. Every figure stands beside a floor measured in the same
 * run on the same server, so the ratio, not the machine, is the result:
 *   redis cycle floor   hiredis: SET NX PX + EVALSHA compare-and-delete
 *   redis round trip    hiredis: PING
 *   redis hand-off floor  hiredis: a script that GETs, PUBLISHes and SETs,
 *                       from one process, to another process's
 *                       subscriber idle 2 ms in poll() (what a hand-over
 *                       needs at least: the release and the message)
 *   file cycle floor    open + F_OFD_SETLK + unlock + close
 * Hand-off: two processes pass the lock back and forth; the time from the
 * holder's release call to the waiter's acquire returning (same host, one
 * monotonic clock). Commands per hand-off: N+1 processes contend for a few
 * seconds; INFO commandstats before and after.
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "redis.h"

const char bench_prog[] = "bench";

#define CHUNKS 15

static int quick;
static const char *redis_uri, *file_dir;
static char file_uri[1024];
static char redis_host[256];
static int redis_port;

/* ------------------------------------------------------------------------ */
/* Floors                                                                   */
/* ------------------------------------------------------------------------ */

static redisContext *hiredis_connect(void)
{
    return r_connect(redis_host, redis_port, 2, 0);
}

static void ping_once(void *c)
{
    r_ok(redisCommand(c, "PING"), "PING");
}

/* A round trip after the same 2 ms of idleness that precedes every
 * hand-off: the fair floor for hand-off latency (waking an idle server,
 * thread or CPU costs far more than a hot loop shows, on VMs especially). */
static stats floor_redis_cold_ping(int n)
{
    redisContext *c = hiredis_connect();
    stats s = time_op(ping_once, c, 0, n, 2000);

    redisFree(c);
    return s;
}

/* The floor's compare-and-delete script, loaded; its SHA into sha. */
static void floor_load(redisContext *c, char sha[41])
{
    redisReply *r = redisCommand(
        c, "SCRIPT LOAD %s",
        "if redis.call('GET', KEYS[1]) == ARGV[1] then "
        "return redis.call('DEL', KEYS[1]) end return 0");

    if (!r || r->type != REDIS_REPLY_STRING)
        die("script load", "failed");
    snprintf(sha, 41, "%s", r->str);
    freeReplyObject(r);
}

typedef struct floor_redis {
    redisContext *c;
    char sha[41];
} floor_redis;

/* One cycle of the floor: SET NX PX, then the compare-and-delete. */
static void floor_once(void *arg)
{
    floor_redis *f = arg;

    r_ok(redisCommand(f->c, "SET floor:{k} owner-0123456789abcdef NX "
                                "PX 30000"),
             "SET");
    r_ok(redisCommand(f->c, "EVALSHA %s 1 floor:{k} "
                                "owner-0123456789abcdef",
                          f->sha),
             "EVALSHA");
}

static stats floor_redis_cycle(int n)
{
    floor_redis f = {hiredis_connect(), ""};

    floor_load(f.c, f.sha);
    stats s = time_op(floor_once, &f, n / 10, n, 0);
    redisFree(f.c);
    return s;
}

/* The floor of a hand-over: one process runs a script that reads a key,
 * publishes one message and writes the key (what a release that hands
 * the lock over does), 2 ms after the other process began to wait in
 * poll() on its subscriber connection; from the script's send to the
 * subscriber's read of the message. */
typedef struct notify_shared {
    volatile int ready, got;
    volatile int64_t sent;
    int64_t samples[];
} notify_shared;

static stats floor_redis_handoff(int n)
{
    size_t size = sizeof(notify_shared) + sizeof(int64_t) * (size_t)n;
    notify_shared *s = h_shared(size);
    pid_t pid;

    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        redisContext *c = hiredis_connect();
        r_ok(redisCommand(c, "SUBSCRIBE floor-handoff"), "SUBSCRIBE");
        for (int i = 0; i < n; i++) {
            __atomic_store_n(&s->ready, i + 1, __ATOMIC_RELEASE);
            struct pollfd p = {c->fd, POLLIN, 0};
            redisReply *r = NULL;
            if (poll(&p, 1, 5000) != 1 ||
                redisGetReply(c, (void **)&r) != REDIS_OK || !r)
                _exit(1);
            s->samples[i] = now_ns() - __atomic_load_n(&s->sent,
                                                       __ATOMIC_ACQUIRE);
            freeReplyObject(r);
            __atomic_store_n(&s->got, i + 1, __ATOMIC_RELEASE);
        }
        redisFree(c);
        _exit(0);
    }
    redisContext *c = hiredis_connect();
    redisReply *r = redisCommand(
        c, "SCRIPT LOAD %s",
        "local v = redis.call('GET', KEYS[1]) "
        "redis.call('PUBLISH', 'floor-handoff', 'g 1 1') "
        "redis.call('SET', KEYS[1], 'owner-0123456789abcdef', 'PX', 30000) "
        "return 1");
    char sha[41];
    if (!r || r->type != REDIS_REPLY_STRING)
        die("script load", "failed");
    snprintf(sha, sizeof(sha), "%s", r->str);
    freeReplyObject(r);
    for (int i = 0; i < n; i++) {
        spin_until((volatile int *)&s->ready, i + 1);
        sleep_us(2000); /* let it start waiting */
        __atomic_store_n(&s->sent, now_ns(), __ATOMIC_RELEASE);
        r_ok(redisCommand(c, "EVALSHA %s 1 floor:{handoff}", sha),
                 "EVALSHA");
        spin_until((volatile int *)&s->got, i + 1);
    }
    redisFree(c);
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        die("hand-off floor", "the subscriber failed");
    stats res = summarize(s->samples + 2, n - 2);
    h_unshare(s, size);
    return res;
}

static stats floor_redis_ping(int n)
{
    redisContext *c = hiredis_connect();
    stats s = time_op(ping_once, c, n / 10, n, 0);

    redisFree(c);
    return s;
}

typedef struct floor_file {
    char path[1100];
    struct flock fl;
} floor_file;

/* One cycle of the file floor: open, an OFD lock, unlock, close. */
static void file_once(void *arg)
{
    floor_file *f = arg;
    int fd = open(f->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);

    f->fl.l_type = F_WRLCK;
    if (fd < 0 || fcntl(fd, F_OFD_SETLK, &f->fl) != 0)
        die("floor lock", strerror(errno));
    f->fl.l_type = F_UNLCK;
    fcntl(fd, F_OFD_SETLK, &f->fl);
    close(fd);
}

static stats floor_file_cycle(int n)
{
    floor_file f;

    memset(&f, 0, sizeof(f));
    snprintf(f.path, sizeof(f.path), "%s/floor.lock", file_dir);
    f.fl.l_whence = SEEK_SET;
    f.fl.l_len = 1;
    return time_op(file_once, &f, n / 10, n, 0);
}

/* ------------------------------------------------------------------------ */
/* dlock                                                                    */
/* ------------------------------------------------------------------------ */

static stats dlock_cycle(const char *uri, int n)
{
    dlock_client *c = h_open_client(uri, NULL);
    dlock *l = h_open_lock(c, "bench-cycle", 0, 0);
    stats s = time_op(h_dlock_once, l, n / 10, n, 0);

    dlock_close(l);
    dlock_client_close(c);
    return s;
}

static void redis_cycles_alternating(int n, stats *fs, stats *ds, double rq[3])
{
    floor_redis fr = {hiredis_connect(), ""};
    dlock_client *dc = h_open_client(redis_uri, NULL);
    dlock *l = h_open_lock(dc, "bench-cycle", 0, 0);
    int64_t *f = malloc(sizeof(*f) * (size_t)n);
    int64_t *d = malloc(sizeof(*d) * (size_t)n);
    int64_t *q = malloc(sizeof(*q) * (size_t)n);

    if (!f || !d || !q)
        die("cycles", "out of memory");
    floor_load(fr.c, fr.sha);
    for (int i = -n / 10; i < n; i++) {
        int64_t t0 = now_ns();
        floor_once(&fr);
        int64_t t1 = now_ns();
        h_dlock_once(l);
        int64_t t2 = now_ns();
        if (i >= 0) {
            f[i] = t1 - t0;
            d[i] = t2 - t1;
            q[i] = (t2 - t1) * 10000 / (t1 - t0 > 0 ? t1 - t0 : 1);
        }
    }
    *fs = summarize(f, n);
    *ds = summarize(d, n);
    qsort(q, (size_t)n, sizeof(*q), cmp64);
    rq[0] = (double)q[n / 4] / 10000;
    rq[1] = (double)q[n / 2] / 10000;
    rq[2] = (double)q[n * 3 / 4] / 10000;
    free(f);
    free(d);
    free(q);
    dlock_close(l);
    dlock_client_close(dc);
    redisFree(fr.c);
}

/* Server time per cycle (INFO commandstats, µs): `n` cycles of the floor
 * (the top-level SET plus its EVALSHA, whose time includes what its script
 * ran) or of dlock (its two EVALSHA), after a CONFIG RESETSTAT. */
static double usec_of(const char *info, const char *cmd)
{
    char key[64];
    const char *p, *u;

    snprintf(key, sizeof(key), "\ncmdstat_%s:", cmd);
    p = strstr(info, key);
    u = p ? strstr(p, "usec=") : NULL;
    return u ? atof(u + 5) : 0;
}

static double server_us_per_cycle(int use_dlock, int n)
{
    redisContext *c = hiredis_connect();
    redisReply *r;
    double us;

    r_ok(redisCommand(c, "CONFIG RESETSTAT"), "CONFIG RESETSTAT");
    if (use_dlock)
        (void)dlock_cycle(redis_uri, n);
    else
        (void)floor_redis_cycle(n);
    r = redisCommand(c, "INFO commandstats");
    if (!r || r->type != REDIS_REPLY_STRING)
        die("INFO", "failed");
    us = usec_of(r->str, "evalsha") + (use_dlock ? 0 : usec_of(r->str, "set"));
    freeReplyObject(r);
    redisFree(c);
    /* both loops run a tenth more cycles to warm up */
    return us / (n + n / 10);
}

/* --- hand-off between two processes --- */

static stats handoff(const char *uri, unsigned flags, int n)
{
    dlock_party p = {uri, NULL, flags, 0, -1};

    /* the first sample of each direction includes subscribing: dropped */
    return handoff_dlock(&p, n - 2, NULL);
}

/* --- store commands per hand-off under contention --- */

/* Commands the server ran: all of them (including those inside scripts)
 * into *all; only those clients sent (requests) into *req. */
static void redis_commands(long long *all, long long *req)
{
    redisContext *c = hiredis_connect();
    redisReply *r = redisCommand(c, "INFO commandstats");
    static const char *const sent[] = {"evalsha", "append", "subscribe",
                                       "unsubscribe", "eval", "script",
                                       "auth", "select", "ping", NULL};

    if (!r || r->type != REDIS_REPLY_STRING)
        die("INFO", "failed");
    *all = r_calls(r->str, NULL);
    *req = r_calls(r->str, sent);
    freeReplyObject(r);
    redisFree(c);
}

static void commands_per_handoff(int waiters, unsigned flags, double *req,
                                 double *per, double *handoffs_per_s)
{
    int64_t ms = quick ? 1000 : 3000;
    contend_cfg cfg = {redis_uri, NULL, flags, waiters + 1, 0, 0, 0,
                       300, 0, 0, ms + 10000};
    long long before, before_req, after, after_req;

    redis_commands(&before, &before_req);
    contend *s = contend_start(&cfg);
    contend_go(s);
    sleep_us(ms * 1000);
    contend_stop(s);
    contend_result r = contend_finish(s);
    redis_commands(&after, &after_req);
    *per = r.handoffs ? (double)(after - before) / (double)r.handoffs : 0;
    *req = r.handoffs ? (double)(after_req - before_req) / (double)r.handoffs
                      : 0;
    *handoffs_per_s = r.per_s;
}

/* ------------------------------------------------------------------------ */

/* Median of three repetitions of f, with the spread (min..max). */
#define REPEAT3(expr, out_med, out_min, out_max)                            \
    do {                                                                    \
        stats r_[3];                                                        \
        for (int k_ = 0; k_ < 3; k_++)                                      \
            r_[k_] = (expr);                                                \
        double v_[3] = {r_[0].p50_us, r_[1].p50_us, r_[2].p50_us};          \
        qsort(v_, 3, sizeof(double), cmpd);                                 \
        out_med = v_[1];                                                    \
        out_min = v_[0];                                                    \
        out_max = v_[2];                                                    \
    } while (0)

/* The cost of metrics (on by default) against the same client with them
 * off, cycle by cycle (issue 20: on within 1.02x of off). */
static void metrics_row(const char *uri, int n)
{
    double on_us, off_us;
    spread r = metrics_cost(uri, NULL, n, CHUNKS, &on_us, &off_us);

    printf("| uncontended cycle, metrics on ÷ off (the floor: off), p50 | "
           "%.1f | %.1f | %.3fx (chunks: %.3f–%.3f) |\n",
           off_us, on_us, r.med, r.min, r.max);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench REDIS_URI FILE_DIR [--quick]\n");
        return 2;
    }
    redis_uri = argv[1];
    file_dir = argv[2];
    quick = argc > 3 && !strcmp(argv[3], "--quick");
    snprintf(file_uri, sizeof(file_uri), "file://%s", file_dir);
    r_address(redis_uri, redis_host, sizeof(redis_host), &redis_port);
    signal(SIGPIPE, SIG_IGN);

    int n = quick ? 2000 : 20000;
    int nh = quick ? 100 : 1000;
    double f_med, f_min, f_max, d_med, d_min, d_max, p_med, p_min, p_max;
    (void)f_min;
    (void)f_max;
    stats fs, ds;

    printf("## Redis (%s)\n\n", redis_uri);
    printf("Latency in microseconds. Cycles: %d of each, floor and dlock "
           "in strict alternation (one cycle each, in turn), the ratio the "
           "median of the per-cycle ratios. Hot round trip: median of three runs, with the spread "
           "of the three. Idle round trip, hand-off floor and hand-offs: "
           "five rounds of all four, each ratio within its round; medians, "
           "with the rounds' spread.\n\n",
           n);
    printf("| measure | floor | dlock | ratio |\n|---|---|---|---|\n");
    REPEAT3(floor_redis_ping(n), p_med, p_min, p_max);
    printf("| round trip (PING) | %.1f (%.1f–%.1f) | | |\n", p_med, p_min,
           p_max);
    /* floor and dlock cycle by cycle, strictly alternating, so that
     * the machine's drift (large on a VM) hits both alike; the ratio is
     * the median of the per-cycle ratios, with their quartiles */
    double rq[3];
    redis_cycles_alternating(n, &fs, &ds, rq);
    printf("| uncontended acquire+release, p50 | %.1f | %.1f | **%.2fx** "
           "(per cycle: quartiles %.2f–%.2f) |\n",
           fs.p50_us, ds.p50_us, rq[1], rq[0], rq[2]);
    h_tail_rows(&fs, &ds);
    metrics_row(redis_uri, n);
    double su_f = server_us_per_cycle(0, n / 4);
    double su_d = server_us_per_cycle(1, n / 4);
    printf("| server µs per cycle (INFO commandstats: the floor's SET and "
           "EVALSHA, dlock's two EVALSHA with what their scripts ran) | "
           "%.1f | %.1f | +%.1f µs |\n",
           su_f, su_d, su_d - su_f);
    /* the idle round trip, the hand-off floor and both modes' hand-offs
     * in five rounds, each ratio taken within its round (the machine
     * drifts between minutes); medians, with the spread of the rounds */
    enum { R = 5 };
    double cp[R], hflo[R], hdef[R], hfa[R], r_d[R], r_f[R], r_dh[R], r_fh[R],
        r_hf[R];
    for (int k = 0; k < R; k++) {
        cp[k] = floor_redis_cold_ping(nh).p50_us;
        hflo[k] = floor_redis_handoff(nh).p50_us;
        hdef[k] = handoff(redis_uri, 0, nh).p50_us;
        hfa[k] = handoff(redis_uri, DLOCK_FAIR, nh).p50_us;
        r_d[k] = hdef[k] / cp[k];
        r_f[k] = hfa[k] / cp[k];
        r_dh[k] = hdef[k] / hflo[k];
        r_fh[k] = hfa[k] / hflo[k];
        r_hf[k] = hflo[k] / cp[k];
    }
    double *all[] = {cp, hflo, hdef, hfa, r_d, r_f, r_dh, r_fh, r_hf};
    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++)
        qsort(all[k], R, sizeof(double), cmpd);
    printf("| round trip after 2 ms idle (PING) | %.1f (%.1f–%.1f) | | |\n",
           cp[R / 2], cp[0], cp[R - 1]);
    printf("| hand-off floor: a script's GET, PUBLISH, SET reaching a "
           "subscriber idle in poll(), p50 | %.1f (%.1f–%.1f) | | %.2f idle "
           "RTT |\n",
           hflo[R / 2], hflo[0], hflo[R - 1], r_hf[R / 2]);
    printf("| hand-off, release → waiter's acquire returns, p50 | "
           "%.1f (1 idle RTT) | %.1f (%.1f–%.1f) | **%.2f idle RTT** "
           "(%.2f–%.2f; %.2fx the hand-off floor, %.2f hot RTT) |\n",
           cp[R / 2], hdef[R / 2], hdef[0], hdef[R - 1], r_d[R / 2], r_d[0], r_d[R - 1], r_dh[R / 2],
           hdef[R / 2] / p_med);
    printf("| hand-off, fair mode, p50 | %.1f (1 idle RTT) | %.1f "
           "(%.1f–%.1f) | **%.2f idle RTT** (%.2f–%.2f; %.2fx the hand-off "
           "floor, %.2f hot RTT) |\n",
           cp[R / 2], hfa[R / 2], hfa[0], hfa[R - 1], r_f[R / 2], r_f[0], r_f[R - 1], r_fh[R / 2],
           hfa[R / 2] / p_med);
    printf("\nThe hand-off includes the woken waiter's read of the key "
           "(`GET`, `PTTL`, one round trip on its command connection), "
           "which the floor leaves out: anyone allowed to `PUBLISH` on "
           "the waiter's channel can send the message, so it only wakes "
           "the waiter, which returns when the key names it the holder "
           "(docs/design.md, \"A message is a wake-up\"). What would get "
           "past that round trip: a grant delivered as the answer to a "
           "command of the waiter's own, a blocking pop (`BLPOP`) on a "
           "list the release script pushes to (only a writer of dlock's "
           "keys can), at the price of a connection blocked in it per "
           "waiting client, a list write per hand-over, and another way "
           "for a release to skip a dead waiter than `PUBLISH`'s count of "
           "subscribers.\n");
    printf("\n### Redis commands per hand-off\n\n");
    printf("N waiters plus the holder contend for %d s (each process: "
           "acquire, release, repeat; a wait gives up after 300 ms and "
           "starts again). Per hand-off between two different processes: "
           "*requests* = commands the clients sent (EVALSHA, APPEND, "
           "SUBSCRIBE; not a woken waiter's GET and PTTL, which the "
           "server counts with its scripts' own); *server* = every "
           "command the server ran, "
           "including those inside the scripts (INFO commandstats). Both "
           "modes hand the lock to the oldest waiter on Redis.\n\n",
           quick ? 1 : 3);
    printf("| waiters | default: requests | default: server | default: "
           "hand-offs/s | fair: requests | fair: server | fair: "
           "hand-offs/s |\n|---|---|---|---|---|---|---|\n");
    int ws[] = {1, 8, 64};
    for (int i = 0; i < 3; i++) {
        double rd, pd, hd, rf, pf, hf;
        if (quick && ws[i] == 64)
            ws[i] = 16;
        commands_per_handoff(ws[i], 0, &rd, &pd, &hd);
        commands_per_handoff(ws[i], DLOCK_FAIR, &rf, &pf, &hf);
        printf("| %d | %.1f | %.1f | %.0f | %.1f | %.1f | %.0f |\n", ws[i],
               rd, pd, hd, rf, pf, hf);
    }

    printf("\n## File store (%s)\n\n", file_uri);
    printf("| measure | floor | dlock | ratio |\n|---|---|---|---|\n");
    double fv[CHUNKS], dv[CHUNKS], rv[CHUNKS];
    for (int k = 0; k < CHUNKS; k++) {
        fs = floor_file_cycle(n / CHUNKS);
        ds = dlock_cycle(file_uri, n / CHUNKS);
        fv[k] = fs.p50_us;
        dv[k] = ds.p50_us;
        rv[k] = ds.p50_us / fs.p50_us;
    }
    qsort(fv, CHUNKS, sizeof(double), cmpd);
    qsort(dv, CHUNKS, sizeof(double), cmpd);
    qsort(rv, CHUNKS, sizeof(double), cmpd);
    printf("| uncontended acquire+release, p50 | %.1f | %.1f | %.2fx "
           "(chunks: %.2f–%.2f) |\n",
           fv[CHUNKS / 2], dv[CHUNKS / 2], rv[CHUNKS / 2], rv[0],
           rv[CHUNKS - 1]);
    printf("| cycles per second (one client) | %.0f | %.0f | %.2fx |\n",
           fs.per_s, ds.per_s, ds.per_s / fs.per_s);
    metrics_row(file_uri, n);
    REPEAT3(handoff(file_uri, 0, nh), d_med, d_min, d_max);
    printf("| hand-off, release → waiter's acquire returns, p50 | | %.1f "
           "(%.1f–%.1f) | |\n",
           d_med, d_min, d_max);
    REPEAT3(handoff(file_uri, DLOCK_FAIR, nh), f_med, f_min, f_max);
    printf("| hand-off, fair mode, p50 | | %.1f (%.1f–%.1f) | |\n", f_med,
           f_min, f_max);
    return 0;
}
