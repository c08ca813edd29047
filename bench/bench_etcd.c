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
#include <unistd.h>

#include "harness.h"

const char bench_prog[] = "bench_etcd";

#define CHUNKS 15

static int quick;
static const char *uri;
static char base[256]; /* http://host:port */

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
static void same_cycle_once(void *arg)
{
    http *c = arg;
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

static void floor_cycle_once(void *arg)
{
    http *c = arg;
    post(c, "/v3/kv/txn", floor_put);
    post(c, "/v3/kv/deleterange", "{\"key\":\"" FLOOR_CHILD "\"}");
}

static void floor_write_once(void *arg)
{
    http *c = arg;
    post(c, "/v3/kv/put",
         "{\"key\":\"" FLOOR_DATA "\",\"value\":\"MDEyMzQ1Njc4OWFiY2RlZg==\"}");
}

static void floor_rtt_once(void *arg)
{
    http *c = arg;
    post(c, "/v3/kv/range", "{\"key\":\"" FLOOR_DATA "\"}");
}

/* kind 0: round trip; 1: write; 2: 2 ms idle, then write + round trip */
static stats floor_op(int kind, int n)
{
    http *h = http_new();
    stats s = time_write_rtt(floor_write_once, floor_rtt_once, h, kind, n);

    http_free(h);
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

/* the first sample of each direction (setting up the wait) is dropped */
static stats handoff(int n)
{
    dlock_party p = {uri, NULL, 0, 0, -1};

    return handoff_dlock(&p, n - 2, NULL);
}

static void work_per_handoff(int waiters, double *writes, double *reads,
                             double *per_s)
{
    int64_t ms = quick ? 1000 : 3000;
    contend_cfg cfg = {uri, NULL, 0, waiters + 1, 0, 0, 0,
                       300, 0, 0, ms + 10000};
    contend *s = contend_start(&cfg);

    contend_go(s);
    sleep_us(200000);
    double w0 = metric("etcd_debugging_mvcc_put_total") +
                metric("etcd_debugging_mvcc_delete_total");
    double r0 = metric("etcd_debugging_mvcc_range_total");
    long h0 = contend_handoffs(s);
    int64_t t0 = now_ns();
    sleep_us(ms * 1000);
    long h1 = contend_handoffs(s);
    double w1 = metric("etcd_debugging_mvcc_put_total") +
                metric("etcd_debugging_mvcc_delete_total");
    double r1 = metric("etcd_debugging_mvcc_range_total");
    double secs = (double)(now_ns() - t0) / 1e9;
    contend_stop(s);
    contend_finish(s);
    *writes = h1 > h0 ? (w1 - w0) / (double)(h1 - h0) : 0;
    *reads = h1 > h0 ? (r1 - r0) / (double)(h1 - h0) : 0;
    *per_s = (double)(h1 - h0) / secs;
}

int main(int argc, char **argv)
{
    uri = h_args(argc, argv, "ETCD_URI", &quick);
    if (strncmp(uri, "etcd://", 7) != 0)
        die("uri", "expected etcd://host:port");
    snprintf(base, sizeof(base), "http://%.*s", (int)strcspn(uri + 7, ",/?"),
             uri + 7);
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);

    int n = quick ? 600 : 3000;
    int nh = quick ? 150 : 600;
    int no = quick ? 500 : 2000;

    char why[256];
    dlock_client *dc = h_store_client(uri, NULL, why, sizeof(why));
    int have_store = dc != NULL;

    http *c = http_new();
    floor_prepare(c);
    dlock *dl = have_store ? h_open_lock(dc, "bench-cycle", 0, 0) : NULL;
    time_ops(floor_cycle_once, c, NULL, 200, 0);
    time_ops(same_cycle_once, c, NULL, 200, 0);
    if (have_store)
        h_dlock_cycles(dl, NULL, 200);

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
    int64_t *all[3] = {fns, NULL, dns};
    /* the floor, dlock's own requests from the bare client, dlock */
    int64_t *sns = malloc(sizeof(int64_t) * (size_t)per * CHUNKS);
    kind_op kinds[3] = {{floor_cycle_once, c}, {same_cycle_once, c},
                        {h_dlock_once, dl}};
    double p50[3 * CHUNKS] = {0}, *fv = p50, *sv = p50 + CHUNKS,
           *dv = p50 + 2 * CHUNKS;
    all[1] = sns;
    chunked_ops(kinds, have_store ? 3 : 2, n, CHUNKS, p50, all);
    free(sns);
    http_free(c);
    h_close(have_store, dl, dc);
    double s_med = medrange(sv, CHUNKS).med, f_med = medrange(fv, CHUNKS).med,
           d_med = medrange(dv, CHUNKS).med;
    spread sr = ratios(dv, sv, CHUNKS), rs = ratios(dv, fv, CHUNKS);
    stats fs, ds;
    h_summaries(fns, dns, per * CHUNKS, have_store, &fs, &ds);
    if (have_store) {
        printf("| uncontended acquire+release, p50 (floor: txn put + "
               "delete) | %.1f | %.1f | **%.2fx** (chunks: %.2f–%.2f) |\n",
               f_med, d_med, rs.med, rs.min, rs.max);
        printf("| the same, beside dlock's own two requests sent by the "
               "bare client (txn put + range of the two newest keys; txn "
               "compare-revision + delete) | %.1f | %.1f | %.2fx (chunks: "
               "%.2f–%.2f) |\n",
               s_med, d_med, sr.med, sr.min, sr.max);
        h_tail_rows(&fs, &ds);
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
    spread is = medrange(iv, CHUNKS);
    double h_med = medrange(hv, CHUNKS).med;
    rs = medrange(hr, CHUNKS);
    printf("| write + round trip after 2 ms idle (put, range) | %.1f "
           "(chunks: %.1f–%.1f) | | |\n",
           is.med, is.min, is.max);
    printf("| hand-off, release → waiter's acquire returns, p50 | %.1f (1 "
           "idle write+RTT) | %.1f | **%.2f idle write+RTT** (chunks: "
           "%.2f–%.2f; %.2f hot write+RTT) |\n",
           is.med, h_med, rs.med, rs.min, rs.max,
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
