/* SPDX-License-Identifier: MIT */
/*
 * bench_many.c -- many locks held at once on Redis: memory per lock in the
 * store and acquire/release throughput, beside bare hiredis floors measured
 * in the same run on the same server.
 *
 *   bench_many REDIS_URI [--quick] [--names N]
 *
 * Prints Markdown (a subsection of the Redis section). N = 100000 distinct
 * names (--quick: 10000), "many-000000" ...; the server is FLUSHALLed
 * before every run, so every run starts from an empty keyspace.
 *
 * Each run: the N names acquired as fast as possible by some threads
 * (each its own owner), then released; ttl 600 s and DLOCK_NO_RENEW, so no
 * watchdog renews anything meanwhile. dlock runs: 1, 4 and 16 threads on
 * one client, 4 clients with one thread each. Floors: bare hiredis `SET floor:{NAME}
 * VALUE NX PX 600000` (release: the EVALSHA compare-and-delete) from one
 * connection pipelined (depth PIPE_DEPTH), unpipelined, and from 4
 * connections unpipelined (one thread each).
 *
 * Memory, in the dlock run with 4 threads and in the pipelined floor:
 * INFO memory's used_memory less the clients' buffers, settled, before
 * the acquisitions, with all N held, and after the release (when only
 * dlock's tombstones remain, each expiring an hour after its token). The
 * floor's keys are as long as dlock's lock keys ("floor:" as long as
 * "dlock:"), its values as long as the mean of dlock's lock values in the
 * same run.
 *
 * Keep-alive: one client holds the N names at once with a 3 s lease that
 * its watchdog renews, for 10 s (--quick: 4 s); every lost-lock callback
 * is counted, and every hold is checked at the end (dlock_held()).
 */
#include <dlock.h>
#include <hiredis.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "redis.h"

const char bench_prog[] = "bench_many";

#define PIPE_DEPTH 100
#define MEM_THREADS 4
#define NAME_FMT "many-%06d"
#define TTL_MS 600000
#define KEEP_TTL_MS 3000
#define KEEP_THREADS 16

static const char *redis_uri;
static char redis_host[256];
static int redis_port;
static int nnames;

static const char release_script[] =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "
    "return redis.call('DEL', KEYS[1]) end return 0";

static void sleep_ms(int ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000};

    nanosleep(&ts, NULL);
}

static redisContext *hiredis_connect(void)
{
    return r_connect(redis_host, redis_port, 10, 10);
}

static long long dbsize(redisContext *c)
{
    redisReply *r = r_command(c, "DBSIZE");
    long long n = r->integer;

    freeReplyObject(r);
    return n;
}

/* used_memory less the clients' buffers (mem_clients_normal: query and
 * reply buffers, which grow and shrink with pipelining, not with keys). */
static long long keyspace_memory(redisContext *c)
{
    redisReply *r = r_command(c, "INFO memory");
    const char *u = strstr(r->str, "\nused_memory:");
    const char *m = strstr(r->str, "\nmem_clients_normal:");

    if (!u || !m)
        die("INFO memory", "no used_memory or mem_clients_normal");
    long long v = atoll(u + 13) - atoll(m + 20);
    freeReplyObject(r);
    return v;
}

/* The figure above once it has settled: a dict that grew may still be
 * rehashing incrementally (both tables allocated) for a few server ticks. */
static long long used_memory(redisContext *c)
{
    long long prev = keyspace_memory(c), cur = prev;

    for (int i = 0; i < 30; i++) {
        sleep_ms(100);
        cur = keyspace_memory(c);
        if (llabs(cur - prev) <= 1024)
            break;
        prev = cur;
    }
    return cur;
}

/* Microseconds the server spent in the commands the clients sent since
 * the last CONFIG RESETSTAT: EVALSHA when any was sent (the commands a
 * script runs are counted apart, and inside its time), else SET. */
static double server_us(redisContext *c)
{
    redisReply *r = r_command(c, "INFO commandstats");
    const char *which[] = {"\ncmdstat_evalsha:", "\ncmdstat_set:"};
    double us = 0;

    for (int i = 0; i < 2 && us == 0; i++) {
        const char *p = strstr(r->str, which[i]);
        const char *u = p ? strstr(p, "usec=") : NULL;
        if (u)
            us = atof(u + 5);
    }
    freeReplyObject(r);
    return us;
}

static void reset_stats(redisContext *c)
{
    freeReplyObject(r_command(c, "CONFIG RESETSTAT"));
}

static long rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, rss = 0;

    if (!f)
        return 0;
    if (fscanf(f, "%ld %ld", &size, &rss) != 2)
        rss = 0;
    fclose(f);
    return rss * sysconf(_SC_PAGESIZE);
}

/* ------------------------------------------------------------------------ */
/* One run: N names acquired, then released, by some threads               */
/* ------------------------------------------------------------------------ */

typedef struct run_cfg {
    int use_dlock;
    int threads;
    int clients;       /* dlock: clients shared round-robin by the threads */
    int depth;         /* floor: pipeline depth (1: unpipelined) */
    int64_t ttl_ms;    /* lease (dlock) or PX (floor) */
    unsigned flags;    /* dlock_options.flags */
    const char *value; /* floor: the value SET */
    int measure;       /* memory: used_memory held and after release */
} run_cfg;

typedef struct run_result {
    double acq_per_s, rel_per_s;
    double acq_server_us, rel_server_us; /* per name */
    long long mem_base, mem_held, mem_released;
    long long keys_held, keys_released;
    long rss_base, rss_held;
    double value_len; /* dlock: mean length of its lock values */
    int value_min, value_max;
} run_result;

typedef struct shared {
    const run_cfg *cfg;
    pthread_barrier_t bar;
    char sha[41];
    pthread_mutex_t mu;
    int failures;
    char first_error[512];
} shared;

/* One phase of the workers (every name acquired, or released): starts
 * them at the barrier and waits for them all at the next; its seconds.
 * Dies (naming `what`) when a worker failed. */
static double phase(shared *s, const char *what)
{
    pthread_barrier_wait(&s->bar);
    int64_t t0 = now_ns();
    pthread_barrier_wait(&s->bar);
    int64_t t1 = now_ns();
    if (s->failures)
        die(what, s->first_error);
    return (double)(t1 - t0) / 1e9;
}

typedef struct worker {
    shared *s;
    pthread_t thread;
    int lo, hi;            /* its names: [lo, hi) */
    dlock **locks;         /* dlock: its handles, locks[i - lo] */
    redisContext *conn;    /* floor: its connection */
} worker;

static void fail(shared *s, const char *fmt, const char *a, const char *b)
{
    pthread_mutex_lock(&s->mu);
    if (s->failures++ == 0)
        snprintf(s->first_error, sizeof(s->first_error), fmt, a, b);
    pthread_mutex_unlock(&s->mu);
}

static void dlock_share(worker *w, int release)
{
    for (int i = w->lo; i < w->hi; i++) {
        dlock *l = w->locks[i - w->lo];
        int rc = release ? dlock_release(l) : dlock_acquire(l, 0);
        if (rc != DLOCK_OK)
            fail(w->s, "%s: %s", release ? "dlock_release" : "dlock_acquire",
                 dlock_errmsg());
    }
}

static void floor_share(worker *w, int release)
{
    const run_cfg *cfg = w->s->cfg;
    char key[64], px[32];

    snprintf(px, sizeof(px), "%lld", (long long)cfg->ttl_ms);
    for (int i = w->lo; i < w->hi; i += cfg->depth) {
        int n = w->hi - i < cfg->depth ? w->hi - i : cfg->depth;
        for (int k = 0; k < n; k++) {
            snprintf(key, sizeof(key), "floor:{" NAME_FMT "}", i + k);
            if (release)
                redisAppendCommand(w->conn, "EVALSHA %s 1 %s %s", w->s->sha,
                                   key, cfg->value);
            else
                redisAppendCommand(w->conn, "SET %s %s NX PX %s", key,
                                   cfg->value, px);
        }
        for (int k = 0; k < n; k++) {
            redisReply *r = NULL;
            if (redisGetReply(w->conn, (void **)&r) != REDIS_OK || !r)
                die("floor", w->conn->errstr);
            int ok = release ? r->type == REDIS_REPLY_INTEGER && r->integer == 1
                             : r->type == REDIS_REPLY_STATUS;
            if (!ok)
                fail(w->s, "%s: %s", release ? "floor release" : "floor SET",
                     r->type == REDIS_REPLY_ERROR ? r->str : "refused");
            freeReplyObject(r);
        }
    }
}

static void *worker_main(void *arg)
{
    worker *w = arg;

    for (int release = 0; release < 2; release++) {
        pthread_barrier_wait(&w->s->bar); /* start */
        if (w->s->cfg->use_dlock)
            dlock_share(w, release);
        else
            floor_share(w, release);
        pthread_barrier_wait(&w->s->bar); /* done */
    }
    return NULL;
}

static dlock_client *open_client(void)
{
    dlock_client *c;

    if (dlock_client_open(&c, redis_uri, NULL) != DLOCK_OK)
        die(redis_uri, dlock_errmsg());
    /* connect and load the scripts now, outside the measurement */
    dlock *l;
    if (dlock_open(&l, c, "many-warm-up", NULL) != DLOCK_OK ||
        dlock_acquire(l, 0) != DLOCK_OK || dlock_release(l) != DLOCK_OK)
        die("warm-up", dlock_errmsg());
    dlock_close(l);
    return c;
}

/* Mean, min and max length of dlock's lock values (pipelined STRLEN). */
static void value_lengths(redisContext *c, run_result *res)
{
    char key[64];
    long long sum = 0;

    res->value_min = 1 << 30;
    res->value_max = 0;
    for (int i = 0; i < nnames; i += PIPE_DEPTH) {
        int n = nnames - i < PIPE_DEPTH ? nnames - i : PIPE_DEPTH;
        for (int k = 0; k < n; k++) {
            snprintf(key, sizeof(key), "dlock:{" NAME_FMT "}", i + k);
            redisAppendCommand(c, "STRLEN %s", key);
        }
        for (int k = 0; k < n; k++) {
            redisReply *r = NULL;
            if (redisGetReply(c, (void **)&r) != REDIS_OK || !r ||
                r->type != REDIS_REPLY_INTEGER || r->integer == 0)
                die("STRLEN", "a lock key is missing (not dlock:{NAME}?)");
            int len = (int)r->integer;
            sum += len;
            if (len < res->value_min)
                res->value_min = len;
            if (len > res->value_max)
                res->value_max = len;
            freeReplyObject(r);
        }
    }
    res->value_len = (double)sum / nnames;
}

static run_result run(const run_cfg *cfg)
{
    redisContext *admin = hiredis_connect();
    shared s;
    run_result res;
    int nclients = cfg->use_dlock ? cfg->clients : 0;
    dlock_client **clients = calloc((size_t)(nclients ? nclients : 1),
                                    sizeof(*clients));
    worker *w = calloc((size_t)cfg->threads, sizeof(*w));
    dlock **locks = calloc((size_t)nnames, sizeof(*locks));

    if (!clients || !w || !locks)
        die("run", "out of memory");
    memset(&s, 0, sizeof(s));
    memset(&res, 0, sizeof(res));
    s.cfg = cfg;
    pthread_mutex_init(&s.mu, NULL);
    pthread_barrier_init(&s.bar, NULL, (unsigned)cfg->threads + 1);
    freeReplyObject(r_command(admin, "FLUSHALL"));
    {
        redisReply *r = redisCommand(admin, "SCRIPT LOAD %s", release_script);
        if (!r || r->type != REDIS_REPLY_STRING)
            die("SCRIPT LOAD", r && r->str ? r->str : admin->errstr);
        snprintf(s.sha, sizeof(s.sha), "%s", r->str);
        freeReplyObject(r);
    }
    for (int i = 0; i < nclients; i++)
        clients[i] = open_client();
    for (int t = 0; t < cfg->threads; t++) {
        w[t].s = &s;
        w[t].lo = (int)((long long)nnames * t / cfg->threads);
        w[t].hi = (int)((long long)nnames * (t + 1) / cfg->threads);
        w[t].locks = locks + w[t].lo;
        if (!cfg->use_dlock) {
            w[t].conn = hiredis_connect();
            redisReply *r = redisCommand(w[t].conn, "PING");
            if (!r)
                die("PING", w[t].conn->errstr);
            freeReplyObject(r);
        }
        if (pthread_create(&w[t].thread, NULL, worker_main, &w[t]) != 0)
            die("pthread_create", strerror(errno));
    }
    res.rss_base = rss_bytes();
    if (cfg->use_dlock) {
        dlock_options o;
        char name[32];
        memset(&o, 0, sizeof(o));
        o.ttl_ms = cfg->ttl_ms;
        o.flags = cfg->flags;
        for (int t = 0; t < cfg->threads; t++)
            for (int i = w[t].lo; i < w[t].hi; i++) {
                snprintf(name, sizeof(name), NAME_FMT, i);
                if (dlock_open(&locks[i], clients[t % nclients], name, &o) !=
                    DLOCK_OK)
                    die(name, dlock_errmsg());
            }
    }
    /* before the baseline: CONFIG RESETSTAT also frees memory (the
     * latency histograms of Redis 7, made before tracking was turned off) */
    reset_stats(admin);
    if (cfg->measure)
        res.mem_base = used_memory(admin);

    double acq_s = phase(&s, "acquire");
    res.acq_server_us = server_us(admin) / nnames;
    res.keys_held = dbsize(admin);
    if (cfg->measure) {
        res.mem_held = used_memory(admin);
        res.rss_held = rss_bytes();
        if (cfg->use_dlock)
            value_lengths(admin, &res);
    }
    reset_stats(admin);
    double rel_s = phase(&s, "release");
    res.rel_server_us = server_us(admin) / nnames;
    res.keys_released = dbsize(admin);
    if (cfg->measure)
        res.mem_released = used_memory(admin);
    res.acq_per_s = nnames / acq_s;
    res.rel_per_s = nnames / rel_s;

    for (int t = 0; t < cfg->threads; t++) {
        pthread_join(w[t].thread, NULL);
        if (w[t].conn)
            redisFree(w[t].conn);
    }
    if (cfg->use_dlock)
        for (int i = 0; i < nnames; i++)
            dlock_close(locks[i]);
    for (int i = 0; i < nclients; i++)
        dlock_client_close(clients[i]);
    freeReplyObject(r_command(admin, "FLUSHALL"));
    redisFree(admin);
    pthread_barrier_destroy(&s.bar);
    pthread_mutex_destroy(&s.mu);
    free(locks);
    free(w);
    free(clients);
    return res;
}

/* ------------------------------------------------------------------------ */
/* Keep-alive: N holds renewed by one client's watchdog                     */
/* ------------------------------------------------------------------------ */

typedef struct keeper {
    pthread_t thread;
    pthread_barrier_t *bar;
    dlock **locks;
    int lo, hi;
    int failures, not_held, release_lost;
    char err[256];
} keeper;

static void keep_lost(dlock *l, uint64_t token, void *arg)
{
    (void)l;
    (void)token;
    __atomic_add_fetch((int *)arg, 1, __ATOMIC_RELAXED);
}

/* A thread's share: acquire its names, wait while they are held, check
 * and release them (a hold belongs to the thread that made it). */
static void *keeper_main(void *arg)
{
    keeper *k = arg;

    for (int i = k->lo; i < k->hi; i++)
        if (dlock_acquire(k->locks[i], 0) != DLOCK_OK && k->failures++ == 0)
            snprintf(k->err, sizeof(k->err), "%s", dlock_errmsg());
    pthread_barrier_wait(k->bar); /* all held */
    pthread_barrier_wait(k->bar); /* the holding time is over */
    for (int i = k->lo; i < k->hi; i++) {
        if (dlock_held(k->locks[i]) != 1)
            k->not_held++;
        if (dlock_release(k->locks[i]) == DLOCK_ELOST)
            k->release_lost++;
    }
    return NULL;
}

typedef struct keep_result {
    double acquire_s;
    int lost_cb, not_held, release_lost;
    double renewals_per_s, scripts_per_s, server_us_per_s;
} keep_result;

static keep_result keepalive(int64_t hold_ms)
{
    redisContext *admin = hiredis_connect();
    dlock **locks = calloc((size_t)nnames, sizeof(*locks));
    keeper k[KEEP_THREADS];
    pthread_barrier_t bar;
    keep_result res;
    int lost = 0;
    dlock_options o;
    char name[32];

    if (!locks)
        die("keep-alive", "out of memory");
    memset(&res, 0, sizeof(res));
    memset(k, 0, sizeof(k));
    freeReplyObject(r_command(admin, "FLUSHALL"));
    dlock_client *c = open_client();
    memset(&o, 0, sizeof(o));
    o.ttl_ms = KEEP_TTL_MS;
    o.on_lost = keep_lost;
    o.on_lost_arg = &lost;
    for (int i = 0; i < nnames; i++) {
        snprintf(name, sizeof(name), NAME_FMT, i);
        if (dlock_open(&locks[i], c, name, &o) != DLOCK_OK)
            die(name, dlock_errmsg());
    }
    pthread_barrier_init(&bar, NULL, KEEP_THREADS + 1);
    int64_t t0 = now_ns();
    for (int t = 0; t < KEEP_THREADS; t++) {
        k[t].bar = &bar;
        k[t].locks = locks;
        k[t].lo = (int)((long long)nnames * t / KEEP_THREADS);
        k[t].hi = (int)((long long)nnames * (t + 1) / KEEP_THREADS);
        if (pthread_create(&k[t].thread, NULL, keeper_main, &k[t]) != 0)
            die("pthread_create", strerror(errno));
    }
    pthread_barrier_wait(&bar);
    res.acquire_s = (double)(now_ns() - t0) / 1e9;
    for (int t = 0; t < KEEP_THREADS; t++)
        if (k[t].failures)
            die("keep-alive acquire", k[t].err);
    reset_stats(admin);
    int64_t h0 = now_ns();
    sleep_ms((int)hold_ms);
    double held_s = (double)(now_ns() - h0) / 1e9;
    {
        redisReply *r = r_command(admin, "INFO commandstats");
        const char *e = strstr(r->str, "\ncmdstat_evalsha:");
        const char *g = strstr(r->str, "\ncmdstat_pexpire:");
        if (e) {
            const char *calls = strstr(e, "calls="), *us = strstr(e, "usec=");
            res.scripts_per_s = calls ? atof(calls + 6) / held_s : 0;
            res.server_us_per_s = us ? atof(us + 5) / held_s : 0;
        }
        if (g) {
            const char *calls = strstr(g, "calls=");
            res.renewals_per_s = calls ? atof(calls + 6) / held_s : 0;
        }
        freeReplyObject(r);
    }
    pthread_barrier_wait(&bar);
    for (int t = 0; t < KEEP_THREADS; t++) {
        pthread_join(k[t].thread, NULL);
        res.not_held += k[t].not_held;
        res.release_lost += k[t].release_lost;
    }
    res.lost_cb = __atomic_load_n(&lost, __ATOMIC_RELAXED);
    for (int i = 0; i < nnames; i++)
        dlock_close(locks[i]);
    dlock_client_close(c);
    freeReplyObject(r_command(admin, "FLUSHALL"));
    redisFree(admin);
    pthread_barrier_destroy(&bar);
    free(locks);
    return res;
}

/* ------------------------------------------------------------------------ */

static double per_lock(long long bytes)
{
    return (double)bytes / nnames;
}

static void expect_keys(const char *what, long long got, long long want)
{
    char msg[128];

    if (got == want)
        return;
    snprintf(msg, sizeof(msg), "%lld keys in the store, expected %lld", got,
             want);
    die(what, msg);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr,
                "usage: bench_many REDIS_URI [--quick] [--names N]\n");
        return 2;
    }
    redis_uri = argv[1];
    nnames = 100000;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--quick"))
            nnames = 10000;
        else if (!strcmp(argv[i], "--names") && i + 1 < argc)
            nnames = atoi(argv[++i]); /* for a short trial */
        else
            die(argv[i], "unknown argument");
    }
    if (nnames < 16)
        die("--names", "at least 16");
    int64_t keep_ms = nnames >= 100000 ? 10000 : 4000;
    r_address(redis_uri, redis_host, sizeof(redis_host), &redis_port);
    signal(SIGPIPE, SIG_IGN);
    int64_t start = now_ns();

    /* Redis 7 keeps a latency histogram per command, made at its first
     * call and freed by CONFIG RESETSTAT: tens of KB that would come and
     * go between the memory readings. Off for the run (older servers have
     * no such setting). */
    redisContext *cfgc = hiredis_connect();
    char tracking[16] = "";
    redisReply *r = redisCommand(cfgc, "CONFIG GET latency-tracking");
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_STRING)
        snprintf(tracking, sizeof(tracking), "%s", r->element[1]->str);
    freeReplyObject(r);
    if (tracking[0])
        freeReplyObject(r_command(cfgc, "CONFIG SET latency-tracking no"));

    /* Every run: ttl 600 s, no renewal. Run 0 (dlock, 4 threads) and run
     * 1 (the pipelined floor) also measure memory; run 0 first, for the
     * length of dlock's lock values, which the floor's values copy. */
    static const struct {
        const char *label;
        run_cfg cfg;
    } tp[] = {
        {"dlock: 1 client, 4 threads",
         {1, MEM_THREADS, 1, 1, TTL_MS, DLOCK_NO_RENEW, NULL, 1}},
        {"floor: 1 connection, pipelined (depth 100)",
         {0, 1, 0, PIPE_DEPTH, TTL_MS, 0, NULL, 1}},
        {"floor: 1 connection, unpipelined",
         {0, 1, 0, 1, TTL_MS, 0, NULL, 0}},
        {"floor: 4 connections, one thread each, unpipelined",
         {0, 4, 0, 1, TTL_MS, 0, NULL, 0}},
        {"dlock: 1 client, 1 thread",
         {1, 1, 1, 1, TTL_MS, DLOCK_NO_RENEW, NULL, 0}},
        {"dlock: 1 client, 16 threads",
         {1, 16, 1, 1, TTL_MS, DLOCK_NO_RENEW, NULL, 0}},
        {"dlock: 4 clients, one thread each",
         {1, 4, 4, 1, TTL_MS, DLOCK_NO_RENEW, NULL, 0}},
    };
    enum { NTP = sizeof(tp) / sizeof(tp[0]) };
    static const int order[NTP] = {1, 2, 3, 4, 0, 5, 6}; /* table rows */
    run_result tr[NTP];
    char *value = NULL;
    for (int i = 0; i < NTP; i++) {
        run_cfg c = tp[i].cfg;
        c.value = value;
        tr[i] = run(&c);
        /* dlock: the lock keys and the warm-up's tombstone; after the
         * release, the tombstones */
        expect_keys(tp[i].label, tr[i].keys_held,
                    c.use_dlock ? nnames + 1LL : nnames);
        expect_keys(tp[i].label, tr[i].keys_released,
                    c.use_dlock ? nnames + 1LL : 0);
        if (i == 0) {
            int vlen = (int)(tr[0].value_len + 0.5);
            value = malloc((size_t)vlen + 1);
            if (!value)
                die("value", "out of memory");
            for (int k = 0; k < vlen; k++)
                value[k] = (char)('a' + k % 26);
            value[vlen] = '\0';
        }
    }
    double secs = (double)(now_ns() - start) / 1e9;
    const run_result *md = &tr[0], *mfl = &tr[1];
    double floor_b = per_lock(mfl->mem_held - mfl->mem_base);
    double held_b = per_lock(md->mem_held - md->mem_base);
    double tomb_b = per_lock(md->mem_released - md->mem_base);
    double rss_b = per_lock(md->rss_held - md->rss_base);

    printf("### Many locks: %d names held at once\n\n", nnames);
    printf("One run (%.0f s in all); FLUSHALL before each part. Memory: the "
           "growth of INFO memory's `used_memory` less `mem_clients_normal` "
           "(the clients' buffers), once settled, divided by %d. dlock "
           "holds the names through one client, %d threads (each its own "
           "owner), `dlock_acquire(l, 0)`, ttl %d s and `DLOCK_NO_RENEW` "
           "(no watchdog renewal meanwhile). The floor's keys are as long as "
           "dlock's lock keys, its values as long as dlock's lock values "
           "(mean %.1f bytes, %d–%d).\n\n",
           secs, nnames, MEM_THREADS, TTL_MS / 1000, md->value_len,
           md->value_min, md->value_max);
    printf("| memory in the store | keys | bytes per lock | ratio to floor "
           "|\n|---|---|---|---|\n");
    printf("| floor: `SET floor:{NAME} VALUE NX PX %d` | %lld | %.1f | "
           "1.00x |\n",
           TTL_MS, mfl->keys_held, floor_b);
    printf("| dlock, %d locks held (one key each: record and queue) | %lld "
           "| %.1f | **%.2fx** |\n",
           nnames, md->keys_held - 1, held_b, held_b / floor_b);
    printf("| dlock, after the release: tombstones (each gone an hour after "
           "its token) | %lld | %.1f | %.2fx |\n",
           md->keys_released - 1, tomb_b, tomb_b / floor_b);
    printf("\nIn the dlock process: %.0f bytes per held lock (RSS growth "
           "from before the %d handles were opened to all held: handle, "
           "name entry and hold).\n\n",
           rss_b, nnames);

    printf("Throughput: the %d names acquired as fast as possible, then "
           "released, one run each. Floors: bare hiredis `SET floor:{NAME} "
           "VALUE NX PX %d`; release: the `EVALSHA` compare-and-delete. "
           "dlock: `dlock_acquire(l, 0)` and `dlock_release(l)`, ttl %d s, "
           "`DLOCK_NO_RENEW`; the threads of one client share its one "
           "pipelined command connection. A name's first acquisition reads "
           "the server's clock for its token (`TIME`). *Server µs each*: the time the server spent in the commands sent (INFO "
           "commandstats: SET, or EVALSHA with the commands its script ran), "
           "per name.\n\n",
           nnames, TTL_MS, TTL_MS / 1000);
    double fu_a = tr[2].acq_per_s, fu_r = tr[2].rel_per_s;
    double fp_a = tr[1].acq_per_s, fp_r = tr[1].rel_per_s;
    printf("| client | acquisitions/s | ÷ unpipelined floor | ÷ pipelined "
           "floor | server µs each | releases/s | ÷ unpipelined floor | ÷ "
           "pipelined floor | server µs each |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < NTP; k++) {
        int i = order[k];
        const char *b = i == 4 ? "**" : "";
        printf("| %s | %.0f | %s%.2fx%s | %.2fx | %.1f | %.0f | %s%.2fx%s | "
               "%.2fx | %.1f |\n",
               tp[i].label, tr[i].acq_per_s, b, tr[i].acq_per_s / fu_a, b,
               tr[i].acq_per_s / fp_a, tr[i].acq_server_us, tr[i].rel_per_s,
               b, tr[i].rel_per_s / fu_r, b, tr[i].rel_per_s / fp_r,
               tr[i].rel_server_us);
    }

    keep_result kr = keepalive(keep_ms);
    printf("\n### Keeping many holds alive\n\n");
    printf("One client holds the %d names at once (acquired by %d threads "
           "in %.1f s), each with a %d s lease that the client's watchdog "
           "renews at a third of it (due renewals go in batches: one script "
           "per 256 holds, all pipelined), for %.0f s. *Lost*: lost-lock "
           "callbacks, holds not intact at the end (`dlock_held()`), "
           "releases that said `DLOCK_ELOST`.\n\n",
           nnames, KEEP_THREADS, kr.acquire_s, KEEP_TTL_MS / 1000,
           (double)keep_ms / 1000);
    printf("| holds | lease | lost (callbacks / not intact / released "
           "lost) | renewals/s | scripts/s | server µs per second |\n"
           "|---|---|---|---|---|---|\n");
    printf("| %d | %d s | **%d** (%d / %d / %d) | %.0f | %.0f | %.0f |\n",
           nnames, KEEP_TTL_MS / 1000,
           kr.lost_cb > kr.not_held ? kr.lost_cb : kr.not_held, kr.lost_cb,
           kr.not_held, kr.release_lost, kr.renewals_per_s, kr.scripts_per_s,
           kr.server_us_per_s);
    if (tracking[0]) {
        r = redisCommand(cfgc, "CONFIG SET latency-tracking %s", tracking);
        freeReplyObject(r);
    }
    redisFree(cfgc);
    free(value);
    return 0;
}
