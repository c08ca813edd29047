/* SPDX-License-Identifier: MIT */
/*
 * bench_etcd.c -- dlock's etcd store beside a bare libcurl client of the
 * same v3 JSON gateway, measured in one run against the same member.
 *
 *   dlock_bench_etcd ETCD_URI [--quick]     (ETCD_URI: etcd://host:port)
 *
 * Prints Markdown. Floors, with one libcurl easy handle kept alive (as the
 * store does), TCP_NODELAY, no "Expect: 100-continue":
 *   cycle floor      txn(put key with a lease if absent) + deleterange:
 *                    the least an etcd lock can cost (the floor)
 *   round trip       range of one key (a linearizable read)
 *   idle write+RTT   after 2 ms of idleness (as before every hand-off): a
 *                    put, then a range, timed together
 * Hand-off: two processes pass the lock back and forth; the time from the
 * holder's release call to the waiter's acquire returning, in "idle
 * write + RTT" units. Cycles and hand-offs run in chunks that alternate
 * with their floors; ratios are medians of the chunks' ratios.
 * Store work per hand-off: N+1 processes contend; the member's own
 * counters (etcd_debugging_mvcc_put_total + delete_total: writes;
 * range_total: reads, including those inside transactions) before and
 * after.
 */
#include <dlock.h>

#include <curl/curl.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

const char bench_prog[] = "bench_etcd";

#define CHUNKS 15

static int quick;
static const char *uri;
static char base[256]; /* http://host:port */

static void medrange(double *v, double *med, double *min, double *max)
{
    qsort(v, CHUNKS, sizeof(double), cmpd);
    *min = v[0];
    *med = v[CHUNKS / 2];
    *max = v[CHUNKS - 1];
}

/* ------------------------------------------------------------------------ */
/* The bare client                                                          */
/* ------------------------------------------------------------------------ */

typedef struct http {
    CURL *h;
    struct curl_slist *hdrs;
    char resp[1 << 20];
    size_t n;
} http;

static size_t on_write(char *p, size_t size, size_t n, void *arg)
{
    http *c = arg;
    size_t k = size * n;

    if (c->n + k >= sizeof(c->resp))
        k = sizeof(c->resp) - 1 - c->n;
    memcpy(c->resp + c->n, p, k);
    c->n += k;
    c->resp[c->n] = '\0';
    return size * n;
}

static http *http_new(void)
{
    http *c = calloc(1, sizeof(*c));

    if (!c || !(c->h = curl_easy_init()))
        die("curl", "cannot start");
    c->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    c->hdrs = curl_slist_append(c->hdrs, "Expect:");
    curl_easy_setopt(c->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c->h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, c->hdrs);
    curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(c->h, CURLOPT_WRITEDATA, c);
    curl_easy_setopt(c->h, CURLOPT_TIMEOUT_MS, 5000L);
    return c;
}

static void http_free(http *c)
{
    curl_slist_free_all(c->hdrs);
    curl_easy_cleanup(c->h);
    free(c);
}

static const char *post(http *c, const char *path, const char *body)
{
    char url[512];
    long status = 0;

    snprintf(url, sizeof(url), "%s%s", base, path);
    c->n = 0;
    c->resp[0] = '\0';
    curl_easy_setopt(c->h, CURLOPT_URL, url);
    curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, body);
    CURLcode cc = curl_easy_perform(c->h);
    if (cc != CURLE_OK)
        die(path, curl_easy_strerror(cc));
    curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200)
        die(path, c->resp);
    return c->resp;
}

static const char *get(http *c, const char *path)
{
    char url[512];

    snprintf(url, sizeof(url), "%s%s", base, path);
    c->n = 0;
    curl_easy_setopt(c->h, CURLOPT_URL, url);
    curl_easy_setopt(c->h, CURLOPT_HTTPGET, 1L);
    CURLcode cc = curl_easy_perform(c->h);
    curl_easy_setopt(c->h, CURLOPT_POST, 1L);
    if (cc != CURLE_OK)
        die(path, curl_easy_strerror(cc));
    return c->resp;
}

/* keys (base64): "bench-floor/k", "bench-floor/data" */
#define FLOOR_KEY "YmVuY2gtZmxvb3Iv"       /* "bench-floor/" ... */
#define FLOOR_CHILD "YmVuY2gtZmxvb3Ivaw==" /* "bench-floor/k" */
#define FLOOR_DATA "YmVuY2gtZmxvb3IvZGF0YQ==" /* "bench-floor/data" */

static char floor_put[512];
static char same_put[1024];

static void floor_prepare(http *c)
{
    const char *r = post(c, "/v3/lease/grant", "{\"TTL\":\"600\"}");
    const char *id = strstr(r, "\"ID\":\"");

    if (!id)
        die("lease grant", r);
    long long lease = strtoll(id + 6, NULL, 10);
    snprintf(floor_put, sizeof(floor_put),
             "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"" FLOOR_CHILD
             "\",\"create_revision\":\"0\"}],\"success\":[{\"request_put\":"
             "{\"key\":\"" FLOOR_CHILD "\",\"value\":\"b3duZXI=\",\"lease\":"
             "\"%lld\"}}]}",
             lease);
    post(c, "/v3/kv/put", "{\"key\":\"" FLOOR_DATA "\",\"value\":\"eA==\"}");
    /* range bench-floor/ .. bench-floor0 */
    snprintf(same_put, sizeof(same_put),
             "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"" FLOOR_CHILD
             "\",\"create_revision\":\"0\"}],\"success\":[{\"request_put\":"
             "{\"key\":\"" FLOOR_CHILD "\",\"value\":\"b3duZXI=\",\"lease\":"
             "\"%lld\"}},{\"request_range\":{\"key\":\"" FLOOR_KEY "\","
             "\"range_end\":\"YmVuY2gtZmxvb3Iw\",\"sort_order\":\"DESCEND\","
             "\"sort_target\":\"CREATE\",\"limit\":\"2\",\"keys_only\":"
             "true}}]}",
             lease);
}

/* dlock's own two requests from the bare client: the put that also reads
 * the queue's two newest keys, and a delete conditional on the revision */
static void same_cycle_once(http *c)
{
    char del[512];
    const char *r = post(c, "/v3/kv/txn", same_put);
    const char *rev = strstr(r, "\"revision\":\"");

    if (!rev)
        die("same txn", r);
    snprintf(del, sizeof(del),
             "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"" FLOOR_CHILD
             "\",\"create_revision\":\"%lld\"}],\"success\":[{"
             "\"request_delete_range\":{\"key\":\"" FLOOR_CHILD "\"}}]}",
             strtoll(rev + 12, NULL, 10));
    r = post(c, "/v3/kv/txn", del);
    if (!strstr(r, "\"succeeded\":true"))
        die("same delete", r);
}

static void floor_cycle_once(http *c)
{
    post(c, "/v3/kv/txn", floor_put);
    post(c, "/v3/kv/deleterange", "{\"key\":\"" FLOOR_CHILD "\"}");
}

static void floor_write_once(http *c)
{
    post(c, "/v3/kv/put",
         "{\"key\":\"" FLOOR_DATA "\",\"value\":\"MDEyMzQ1Njc4OWFiY2RlZg==\"}");
}

static void floor_rtt_once(http *c)
{
    post(c, "/v3/kv/range", "{\"key\":\"" FLOOR_DATA "\"}");
}

static void floor_cycles(http *c, int64_t *ns, int n, int same)
{
    for (int i = 0; i < n; i++) {
        int64_t t0 = now_ns();
        if (same)
            same_cycle_once(c);
        else
            floor_cycle_once(c);
        if (ns)
            ns[i] = now_ns() - t0;
    }
}

/* kind 0: round trip; 1: write; 2: 2 ms idle, then write + round trip */
static stats floor_op(int kind, int n)
{
    http *c = http_new();
    int64_t *ns = malloc(sizeof(*ns) * (size_t)n);

    for (int i = -n / 10; i < n; i++) {
        if (kind == 2)
            sleep_us(2000);
        int64_t t0 = now_ns();
        if (kind >= 1)
            floor_write_once(c);
        if (kind != 1)
            floor_rtt_once(c);
        if (i >= 0)
            ns[i] = now_ns() - t0;
    }
    http_free(c);
    stats s = summarize(ns, n);
    free(ns);
    return s;
}

/* A counter of the member's /metrics. */
static double metric(const char *name)
{
    static char buf[1 << 20];
    size_t n = strlen(name);
    http *m = http_new();

    get(m, "/metrics");
    snprintf(buf, sizeof(buf), "%s", m->resp);
    http_free(m);
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n"))
        if (!strncmp(line, name, n) && line[n] == ' ')
            return strtod(line + n + 1, NULL);
    die("metrics", name);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* dlock                                                                    */
/* ------------------------------------------------------------------------ */

static dlock_client *open_client(void)
{
    dlock_client *c;

    if (dlock_client_open(&c, uri, NULL) != DLOCK_OK)
        die(uri, dlock_errmsg());
    return c;
}

static dlock *open_lock(dlock_client *c, const char *name)
{
    dlock *l;

    if (dlock_open(&l, c, name, NULL) != DLOCK_OK)
        die(name, dlock_errmsg());
    return l;
}

static void dlock_cycles(dlock *l, int64_t *ns, int n)
{
    for (int i = 0; i < n; i++) {
        int64_t t0 = now_ns();
        if (dlock_acquire(l, 0) != DLOCK_OK)
            die("cycle acquire", dlock_errmsg());
        if (dlock_release(l) != DLOCK_OK)
            die("cycle release", dlock_errmsg());
        if (ns)
            ns[i] = now_ns() - t0;
    }
}

typedef struct pingpong {
    volatile int started;
    volatile int ready[2];
    volatile int acquired;
    volatile int64_t released_at;
    int n;
    int64_t samples[];
} pingpong;

static void spin_until(volatile int *v, int want)
{
    while (__atomic_load_n(v, __ATOMIC_ACQUIRE) < want)
        sleep_us(20);
}

static void pingpong_proc(pingpong *s, int me)
{
    dlock_client *c = open_client();
    dlock *l = open_lock(c, "bench-handoff");

    if (me == 0) {
        if (dlock_acquire(l, -1) != DLOCK_OK)
            die("handoff", dlock_errmsg());
        __atomic_store_n(&s->started, 1, __ATOMIC_RELEASE);
    } else {
        spin_until(&s->started, 1);
    }
    for (int i = 0; i < s->n; i++) {
        if (i % 2 == me) {
            spin_until(&s->ready[1 - me], i + 1);
            sleep_us(2000); /* let it start waiting */
            __atomic_store_n(&s->released_at, now_ns(), __ATOMIC_RELEASE);
            if (dlock_release(l) != DLOCK_OK)
                die("handoff release", dlock_errmsg());
        } else {
            spin_until(&s->acquired, i);
            __atomic_store_n(&s->ready[me], i + 1, __ATOMIC_RELEASE);
            if (dlock_acquire(l, -1) != DLOCK_OK)
                die("handoff acquire", dlock_errmsg());
            s->samples[i] = now_ns() -
                            __atomic_load_n(&s->released_at, __ATOMIC_ACQUIRE);
            __atomic_store_n(&s->acquired, i + 1, __ATOMIC_RELEASE);
        }
    }
    if (dlock_held(l) > 0)
        dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
}

static stats handoff(int n)
{
    size_t size = sizeof(pingpong) + sizeof(int64_t) * (size_t)n;
    pingpong *s = mmap(NULL, size, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t pids[2];

    if (s == MAP_FAILED)
        die("mmap", strerror(errno));
    memset(s, 0, size);
    s->n = n;
    for (int me = 0; me < 2; me++) {
        fflush(stdout);
        pids[me] = fork();
        if (pids[me] == 0) {
            pingpong_proc(s, me);
            _exit(0);
        }
    }
    for (int me = 0; me < 2; me++) {
        int st;
        waitpid(pids[me], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            die("handoff", "a process failed");
    }
    stats r = summarize(s->samples + 2, n - 2);
    munmap(s, size);
    return r;
}

typedef struct contend {
    volatile int stop;
    volatile int ready;
    volatile int last;
    volatile long handoffs;
} contend;

static void contend_proc(contend *s, int me)
{
    dlock_client *c = open_client();
    dlock *l = open_lock(c, "bench-contend");

    __atomic_add_fetch(&s->ready, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE)) {
        int rc = dlock_acquire(l, 300);
        if (rc == DLOCK_EBUSY)
            continue;
        if (rc != DLOCK_OK)
            die("contend", dlock_errmsg());
        if (s->last != me) {
            __atomic_add_fetch(&s->handoffs, 1, __ATOMIC_RELAXED);
            s->last = me;
        }
        if (dlock_release(l) != DLOCK_OK)
            die("contend release", dlock_errmsg());
    }
    dlock_close(l);
    dlock_client_close(c);
}

static void work_per_handoff(int waiters, double *writes, double *reads,
                             double *per_s)
{
    contend *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE,
                      MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int nproc = waiters + 1;
    pid_t *pids = calloc((size_t)nproc, sizeof(*pids));
    int64_t ms = quick ? 1000 : 3000;

    if (s == MAP_FAILED || !pids)
        die("contend", "out of memory");
    memset(s, 0, sizeof(*s));
    s->last = -1;
    for (int i = 0; i < nproc; i++) {
        fflush(stdout);
        pids[i] = fork();
        if (pids[i] == 0) {
            contend_proc(s, i);
            _exit(0);
        }
    }
    spin_until(&s->ready, nproc);
    sleep_us(200000);
    double w0 = metric("etcd_debugging_mvcc_put_total") +
                metric("etcd_debugging_mvcc_delete_total");
    double r0 = metric("etcd_debugging_mvcc_range_total");
    long h0 = __atomic_load_n(&s->handoffs, __ATOMIC_ACQUIRE);
    int64_t t0 = now_ns();
    sleep_us(ms * 1000);
    long h1 = __atomic_load_n(&s->handoffs, __ATOMIC_ACQUIRE);
    double w1 = metric("etcd_debugging_mvcc_put_total") +
                metric("etcd_debugging_mvcc_delete_total");
    double r1 = metric("etcd_debugging_mvcc_range_total");
    double secs = (double)(now_ns() - t0) / 1e9;
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < nproc; i++) {
        int st;
        waitpid(pids[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            die("contend", "a process failed");
    }
    *writes = h1 > h0 ? (w1 - w0) / (double)(h1 - h0) : 0;
    *reads = h1 > h0 ? (r1 - r0) / (double)(h1 - h0) : 0;
    *per_s = (double)(h1 - h0) / secs;
    free(pids);
    munmap(s, sizeof(*s));
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: dlock_bench_etcd ETCD_URI [--quick]\n");
        return 2;
    }
    uri = argv[1];
    quick = argc > 2 && !strcmp(argv[2], "--quick");
    if (strncmp(uri, "etcd://", 7) != 0)
        die("uri", "expected etcd://host:port");
    snprintf(base, sizeof(base), "http://%.*s", (int)strcspn(uri + 7, ",/?"),
             uri + 7);
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);

    int n = quick ? 600 : 3000;
    int nh = quick ? 150 : 600;
    int no = quick ? 500 : 2000;

    dlock_client *dc = NULL;
    int rc = dlock_client_open(&dc, uri, NULL);
    int have_store = rc == DLOCK_OK;
    char why[256] = "";
    if (rc == DLOCK_ENOTSUP)
        snprintf(why, sizeof(why), "%s", dlock_errmsg());
    else if (rc != DLOCK_OK)
        die(uri, dlock_errmsg());

    http *c = http_new();
    floor_prepare(c);
    dlock *dl = have_store ? open_lock(dc, "bench-cycle") : NULL;
    floor_cycles(c, NULL, 200, 0);
    floor_cycles(c, NULL, 200, 1);
    if (have_store)
        dlock_cycles(dl, NULL, 200);

    printf("## etcd (%s)\n\n", uri);
    if (!have_store)
        printf("Floors only: %s.\n\n", why);
    printf("Latency in microseconds; the floors are a bare libcurl client "
           "of the same JSON gateway (one connection kept alive). Round "
           "trips and writes: %d each. Cycles: %d of each, in %d chunks "
           "alternating with the floor; hand-offs: %d, in %d chunks "
           "alternating with the idle floor. A figure is the median of its "
           "chunks' medians; a ratio is the median of the chunks' "
           "ratios.\n\n",
           no, n, CHUNKS, (nh / CHUNKS) * CHUNKS, CHUNKS);
    printf("| measure | floor | dlock | ratio |\n|---|---|---|---|\n");
    stats rt = floor_op(0, no), wr = floor_op(1, no);
    printf("| round trip (range of one key) | %.1f | | |\n", rt.p50_us);
    printf("| write (put, 16 bytes) | %.1f | | |\n", wr.p50_us);

    int per = n / CHUNKS;
    int64_t *fns = malloc(sizeof(int64_t) * (size_t)per * CHUNKS);
    int64_t *dns = malloc(sizeof(int64_t) * (size_t)per * CHUNKS);
    int64_t *sns = malloc(sizeof(int64_t) * (size_t)per);
    double fv[CHUNKS], dv[CHUNKS], rv[CHUNKS], sv[CHUNKS], srv[CHUNKS];
    for (int k = 0; k < CHUNKS; k++) {
        int64_t *f = fns + (size_t)k * per, *d = dns + (size_t)k * per;
        floor_cycles(c, f, per, 0);
        floor_cycles(c, sns, per, 1);
        if (have_store)
            dlock_cycles(dl, d, per);
        fv[k] = summarize(f, per).p50_us;
        sv[k] = summarize(sns, per).p50_us;
        dv[k] = have_store ? summarize(d, per).p50_us : 0;
        rv[k] = dv[k] / fv[k];
        srv[k] = dv[k] / sv[k];
    }
    free(sns);
    http_free(c);
    if (have_store) {
        dlock_close(dl);
        dlock_client_close(dc);
    }
    double f_med, d_med, r_med, r_min, r_max, x, s_med, sr_med, sr_min,
        sr_max;
    medrange(sv, &s_med, &x, &x);
    medrange(srv, &sr_med, &sr_min, &sr_max);
    medrange(fv, &f_med, &x, &x);
    medrange(dv, &d_med, &x, &x);
    medrange(rv, &r_med, &r_min, &r_max);
    stats fs = summarize(fns, per * CHUNKS);
    stats ds = have_store ? summarize(dns, per * CHUNKS) : fs;
    free(fns);
    free(dns);
    if (have_store) {
        printf("| uncontended acquire+release, p50 (floor: txn put + "
               "delete) | %.1f | %.1f | **%.2fx** (chunks: %.2f–%.2f) |\n",
               f_med, d_med, r_med, r_min, r_max);
        printf("| the same, beside dlock's own two requests sent by the "
               "bare client (txn put + range of the two newest keys; txn "
               "compare-revision + delete) | %.1f | %.1f | %.2fx (chunks: "
               "%.2f–%.2f) |\n",
               s_med, d_med, sr_med, sr_min, sr_max);
        printf("| uncontended acquire+release, p99 | %.1f | %.1f | %.2fx "
               "|\n",
               fs.p99_us, ds.p99_us, ds.p99_us / fs.p99_us);
        printf("| cycles per second (one client) | %.0f | %.0f | %.2fx |\n",
               fs.per_s, ds.per_s, ds.per_s / fs.per_s);
    } else {
        printf("| uncontended acquire+release, p50 | %.1f | | |\n", f_med);
        return 0;
    }

    double iv[CHUNKS], hv[CHUNKS], hr[CHUNKS];
    int per_h = nh / CHUNKS;
    handoff(quick ? 10 : 40); /* warm-up */
    for (int k = 0; k < CHUNKS; k++) {
        iv[k] = floor_op(2, per_h).p50_us;
        hv[k] = handoff(per_h + 2).p50_us;
        hr[k] = hv[k] / iv[k];
    }
    double i_med, i_min, i_max, h_med;
    medrange(iv, &i_med, &i_min, &i_max);
    medrange(hv, &h_med, &x, &x);
    medrange(hr, &r_med, &r_min, &r_max);
    printf("| write + round trip after 2 ms idle (put, range) | %.1f "
           "(chunks: %.1f–%.1f) | | |\n",
           i_med, i_min, i_max);
    printf("| hand-off, release → waiter's acquire returns, p50 | %.1f (1 "
           "idle write+RTT) | %.1f | **%.2f idle write+RTT** (chunks: "
           "%.2f–%.2f; %.2f hot write+RTT) |\n",
           i_med, h_med, r_med, r_min, r_max,
           h_med / (wr.p50_us + rt.p50_us));

    printf("\n### etcd work per hand-off\n\n");
    printf("N waiters plus the holder contend for %d s (acquire, release, "
           "repeat; a wait gives up after 300 ms and starts again). Per "
           "hand-off between two different processes: the member's writes "
           "(`etcd_debugging_mvcc_put_total` + `delete_total`) and reads "
           "(`range_total`, which also counts the reads inside "
           "transactions and compares).\n\n",
           quick ? 1 : 3);
    printf("| waiters | writes | reads | hand-offs/s |\n|---|---|---|---|\n");
    int ws[] = {1, 8, quick ? 16 : 64};
    for (int i = 0; i < 3; i++) {
        double w, r, h;
        work_per_handoff(ws[i], &w, &r, &h);
        printf("| %d | %.1f | %.1f | %.0f |\n", ws[i], w, r, h);
    }
    curl_global_cleanup();
    return 0;
}
