/* SPDX-License-Identifier: MIT */
/*
 * test_metrics.c -- a client's metrics and events (dlock_stats_get(),
 * dlock_metrics_text(), dlock_client_set_events(); docs/monitoring.md),
 * on a real store:
 *
 *   test_metrics file|redis|redlock|zk|etcd|sqlite|pg|pg-advisory|mysql
 *                [filter]
 *
 * The exposition-format checks parse what the library renders (every
 * line a comment or a sample, one HELP and TYPE per family, histograms
 * cumulative) and, when Prometheus' promtool is installed, give it to
 * `promtool check metrics` too.
 */
#include "test.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static th_store S;

static dlock_client *client(void)
{
    return th_client(S.uri, th_patient());
}

static dlock_stats stats(dlock_client *c, const char *name)
{
    dlock_stats s;

    CHECK_OK(dlock_stats_get(c, name, &s, sizeof(s)));
    return s;
}

TEST(counts_what_happens)
{
    dlock_client *a = client(), *b = client();
    dlock *la = th_handle(a, "m/count", 0, 0, 0),
          *lb = th_handle(b, "m/count", 0, 0, 0);
    dlock_stats s;

    CHECK_OK(dlock_acquire(la, 0));
    CHECK_OK(dlock_acquire(la, 0)); /* reentrant */
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_release(la));
    CHECK_OK(dlock_release(la));

    s = stats(a, "m/count");
    CHECK_EQ(s.tracked, 1);
    CHECK_EQ(s.acquired, 1);
    CHECK_EQ(s.reentered, 1);
    CHECK_EQ(s.released, 1);
    CHECK_EQ(s.busy, 0);
    CHECK_EQ(s.hold.count, 1);
    CHECK_EQ(s.hold.le[DLOCK_HIST_BUCKETS - 1], 1);
    s = stats(b, "m/count");
    CHECK_EQ(s.busy, 1);
    CHECK_EQ(s.acquired, 0);
    CHECK_EQ(s.waited, 0);

    /* the client's totals: the same, plus the store's operations */
    s = stats(a, NULL);
    CHECK_EQ(s.acquired, 1);
    CHECK_EQ(s.released, 1);
    CHECK_OP(s.store_op.count, >=, 2); /* the try and the release */
    CHECK_EQ(s.holds, 0);
    CHECK_EQ(s.errors[-DLOCK_ECONN], 0);

    /* a name never seen: zeros, not tracked */
    s = stats(a, "m/never");
    CHECK_EQ(s.tracked, 0);
    CHECK_EQ(s.acquired, 0);

    /* bad input */
    CHECK_RC(dlock_stats_get(NULL, NULL, &s, sizeof(s)), DLOCK_EINVAL);
    CHECK_RC(dlock_stats_get(a, NULL, NULL, sizeof(s)), DLOCK_EINVAL);
    CHECK_RC(dlock_stats_get(a, NULL, &s, 8), DLOCK_EINVAL);
    /* an older caller's smaller struct: only its part is written */
    {
        unsigned char raw[sizeof(dlock_stats) + 16];
        memset(raw, 0xAB, sizeof(raw));
        size_t part = offsetof(dlock_stats, errors);
        CHECK_OK(dlock_stats_get(a, NULL, (dlock_stats *)(void *)raw, part));
        for (size_t i = part; i < sizeof(raw); i++)
            CHECK_EQ(raw[i], 0xAB);
    }
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

TEST(times_a_wait_and_its_hand_off)
{
    dlock_client *a = client(), *b = client();
    dlock *la = th_handle(a, "m/wait", 0, 0, 0),
          *lb = th_handle(b, "m/wait", 0, 0, 0);
    th_waiter w = {.l = lb, .wait_ms = 20000};
    pthread_t t;

    CHECK_OK(dlock_acquire(la, 0));
    th_waiter_start(&w, &t);
    th_sleep_ms(300); /* the waiter is waiting */
    CHECK_OK(dlock_release(la));
    pthread_join(t, NULL);
    CHECK_OK(w.rc);

    dlock_stats s = stats(b, "m/wait");
    CHECK_EQ(s.acquired, 1);
    if (!strcmp(S.kind, "pg-advisory")) {
        /* the server waits inside pg_advisory_lock() and does not say
         * whether it did: only waits that run out are counted there
         * (docs/monitoring.md) */
        CHECK_EQ(s.waited, 0);
        CHECK_EQ(s.handoff.count, 0);
        goto out;
    }
    CHECK_EQ(s.waited, 1);
    CHECK_EQ(s.wait.count, 1);
    /* it waited at least the 300 ms the holder kept it (a little less
     * for the thread's start): the sum is the time, in microseconds */
    CHECK_OP(s.wait.sum_us, >=, 200000);
    CHECK_OP(s.wait.le[0], ==, 0); /* not in the 100 us bucket */
    /* the hand-off: from the store's word to the acquire's return, so
     * well under the wait itself */
    CHECK_EQ(s.handoff.count, 1);
    CHECK_OP(s.handoff.sum_us, <, s.wait.sum_us);
out:
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

TEST(names_are_bounded_and_totals_kept)
{
    dlock_client *a = client();
    char name[32];
    dlock_stats s;

    CHECK_OK(dlock_metrics_config(a, 1, 3));
    /* 10 names, each opened, taken twice (busier first), closed */
    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof(name), "m/card/%d", i);
        dlock *l = th_handle(a, name, 0, 0, 0);
        for (int k = 0; k < (i < 2 ? 5 : 1); k++) {
            CHECK_OK(dlock_acquire(l, 0));
            CHECK_OK(dlock_release(l));
        }
        dlock_close(l);
    }
    /* every acquisition is somewhere: in a name's slot or the rest */
    s = stats(a, NULL);
    CHECK_EQ(s.acquired, 2 * 5 + 8);
    uint64_t in_names = 0;
    int tracked = 0;
    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof(name), "m/card/%d", i);
        dlock_stats n = stats(a, name);
        tracked += n.tracked;
        in_names += n.acquired;
    }
    CHECK_EQ(tracked, 3);
    dlock_stats rest = stats(a, "");
    CHECK_EQ(in_names + rest.acquired, 18);
    /* the busiest names kept their slots */
    CHECK_EQ(stats(a, "m/card/0").tracked, 1);
    CHECK_EQ(stats(a, "m/card/1").tracked, 1);

    /* a name with an open handle keeps its slot against newcomers */
    dlock *keep = th_handle(a, "m/card/kept", 0, 0, 0);
    CHECK_OK(dlock_acquire(keep, 0));
    CHECK_OK(dlock_release(keep));
    for (int i = 10; i < 20; i++) {
        snprintf(name, sizeof(name), "m/card/%d", i);
        dlock *l = th_handle(a, name, 0, 0, 0);
        for (int k = 0; k < 10; k++) {
            CHECK_OK(dlock_acquire(l, 0));
            CHECK_OK(dlock_release(l));
        }
        dlock_close(l);
    }
    CHECK_EQ(stats(a, "m/card/kept").tracked, 1);
    CHECK_EQ(stats(a, "m/card/kept").acquired, 1);
    CHECK_EQ(stats(a, NULL).acquired, 18 + 1 + 100);
    dlock_close(keep);

    CHECK_RC(dlock_metrics_config(a, 1, 100001), DLOCK_EINVAL);
    CHECK_RC(dlock_metrics_config(NULL, 1, 0), DLOCK_EINVAL);
    dlock_client_close(a);
}

TEST(metrics_off_counts_nothing)
{
    dlock_client *a = client();
    dlock *l = th_handle(a, "m/off", 0, 0, 0);

    CHECK_OK(dlock_metrics_config(a, 0, 0));
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    dlock_stats s = stats(a, NULL);
    CHECK_EQ(s.acquired, 0);
    CHECK_EQ(s.store_op.count, 0);
    CHECK_OK(dlock_metrics_config(a, 1, 0));
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    CHECK_EQ(stats(a, NULL).acquired, 1);
    dlock_close(l);
    dlock_client_close(a);
}

TEST(events_acquired_released_long_hold)
{
    static th_events s;
    dlock_client *a = client();
    dlock *l = th_handle(a, "m/events", 0, 0, 0);

    th_events_init(&s);
    CHECK_OK(dlock_client_set_events(a, th_events_cb, &s, 200));
    CHECK_RC(dlock_client_set_events(a, th_events_cb, &s, -1), DLOCK_EINVAL);
    CHECK_OK(dlock_acquire(l, 0));
    uint64_t token = dlock_token(l);
    CHECK_OK(dlock_acquire(l, 0)); /* reentrant: no event */
    /* the long hold: reported once, by the background thread, after
     * 200 ms; 10 s is that on the busiest machine */
    int64_t until = th_now_ms() + 10000;
    while (th_events_count(&s, DLOCK_EVENT_LONG_HOLD) == 0 &&
           th_now_ms() < until)
        th_sleep_ms(10);
    th_sleep_ms(300); /* and only once */
    CHECK_OK(dlock_release(l));
    CHECK_OK(dlock_release(l));

    pthread_mutex_lock(&s.mu);
    CHECK_EQ(s.n, 3);
    CHECK_EQ(s.type[0], DLOCK_EVENT_ACQUIRED);
    CHECK_EQ(s.token[0], token);
    CHECK(pthread_equal(s.thread[0], pthread_self()));
    int lh = th_events_first(&s, DLOCK_EVENT_LONG_HOLD);
    CHECK_EQ(lh, 1);
    CHECK_OP(s.held_ms[lh], >=, 200);
    CHECK(!pthread_equal(s.thread[lh], pthread_self()));
    CHECK_EQ(s.type[2], DLOCK_EVENT_RELEASED);
    CHECK_EQ(s.rc[2], DLOCK_OK);
    CHECK_OP(s.held_ms[2], >=, 500);
    pthread_mutex_unlock(&s.mu);
    CHECK_EQ(stats(a, "m/events").long_holds, 1);

    /* off again: nothing more */
    CHECK_OK(dlock_client_set_events(a, NULL, NULL, 0));
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    CHECK_EQ(s.n, 3);
    dlock_close(l);
    dlock_client_close(a);
}

TEST(a_lost_hold_is_counted_and_told)
{
    if (!S.lease_runs_out) {
        printf("     (no lease runs out on this store)\n");
        return;
    }
    static th_events s;
    dlock_client *a = client();
    dlock *l = th_handle(a, "m/lost", S.short_ttl, DLOCK_NO_RENEW, 0);

    th_events_init(&s);
    CHECK_OK(dlock_client_set_events(a, th_events_cb, &s, 0));
    CHECK_OK(dlock_acquire(l, 0));
    /* the lease runs out: the background thread says so within the
     * lease plus a scheduling delay; 10 s covers a busy machine */
    int64_t until = th_now_ms() + S.short_ttl + 10000;
    while (th_events_count(&s, DLOCK_EVENT_LOST) == 0 && th_now_ms() < until)
        th_sleep_ms(10);
    CHECK_EQ(th_events_count(&s, DLOCK_EVENT_LOST), 1);
    pthread_mutex_lock(&s.mu);
    int i = th_events_first(&s, DLOCK_EVENT_LOST);
    CHECK_CONTAINS(s.why[i], "lease ran out");
    pthread_mutex_unlock(&s.mu);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    dlock_stats st = stats(a, "m/lost");
    CHECK_EQ(st.lost_expired, 1);
    CHECK_EQ(st.lost_taken, 0);
    CHECK_EQ(st.released, 1);
    /* RELEASED carries the ELOST */
    pthread_mutex_lock(&s.mu);
    CHECK_EQ(s.type[s.n - 1], DLOCK_EVENT_RELEASED);
    CHECK_EQ(s.rc[s.n - 1], DLOCK_ELOST);
    pthread_mutex_unlock(&s.mu);
    dlock_close(l);
    dlock_client_close(a);
}

/* ------------------------------------------------------------------------ */
/* The exposition format                                                    */
/* ------------------------------------------------------------------------ */

/* Checks the text: every line "# HELP f ...", "# TYPE f t" (once per
 * family, HELP before its samples) or "name{labels} value"; label values
 * quoted with only \\, \" and \n escaped; buckets cumulative. Returns
 * the number of samples. */
static int by_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static size_t check_exposition(const char *text)
{
    char **keys = NULL;
    char fams[64][64];
    size_t nfams = 0, samples = 0;
    const char *p = text;
    double last_bucket = -1;
    char last_series[2048] = "";

    while (*p) {
        const char *eol = strchr(p, '\n');
        CHECK(eol != NULL); /* every line ends with \n */
        size_t n = (size_t)(eol - p);
        char line[4096];
        CHECK_OP(n, <, sizeof(line));
        memcpy(line, p, n);
        line[n] = '\0';
        p = eol + 1;
        if (!strncmp(line, "# HELP ", 7)) {
            char f[64];
            CHECK_EQ(sscanf(line + 7, "%63s", f), 1);
            for (size_t i = 0; i < nfams; i++)
                CHECK(strcmp(fams[i], f) != 0); /* once per family */
            CHECK_OP(nfams, <, 64);
            snprintf(fams[nfams++], sizeof(fams[0]), "%s", f);
            continue;
        }
        if (!strncmp(line, "# TYPE ", 7)) {
            char f[64], t[32];
            CHECK_EQ(sscanf(line + 7, "%63s %31s", f, t), 2);
            CHECK(nfams > 0 && !strcmp(fams[nfams - 1], f));
            CHECK(!strcmp(t, "counter") || !strcmp(t, "gauge") ||
                  !strcmp(t, "histogram"));
            continue;
        }
        CHECK(line[0] != '#');
        /* name{labels} value */
        char *brace = strchr(line, '{');
        CHECK(brace != NULL);
        *brace = '\0';
        CHECK(nfams > 0 && !strncmp(line, fams[nfams - 1],
                                    strlen(fams[nfams - 1])));
        char *q = brace + 1;
        char series[2048], key[4096];
        size_t so = (size_t)snprintf(series, sizeof(series), "%s|", line);
        char *lab0 = q;
        int in_le = 0;
        for (;;) {
            /* label name */
            char *eq = strchr(q, '=');
            CHECK(eq != NULL && eq[1] == '"');
            in_le = (size_t)(eq - q) == 2 && !strncmp(q, "le", 2);
            if (!in_le) {
                size_t k = (size_t)(eq - q);
                CHECK_OP(so + k + 2, <, sizeof(series));
                memcpy(series + so, q, k);
                so += k;
                series[so++] = '=';
            }
            q = eq + 2;
            while (*q != '"') {
                CHECK(*q != '\0' && *q != '\n');
                if (*q == '\\') {
                    CHECK(q[1] == '\\' || q[1] == '"' || q[1] == 'n');
                    if (!in_le && so + 2 < sizeof(series))
                        series[so++] = q[1];
                    q += 2;
                } else {
                    if (!in_le && so + 2 < sizeof(series))
                        series[so++] = *q;
                    q++;
                }
            }
            q++;
            if (*q == ',') {
                q++;
                continue;
            }
            CHECK(*q == '}');
            q++;
            break;
        }
        series[so] = '\0';
        /* the whole sample's identity, for duplicates */
        {
            size_t ln = strlen(line), lb = (size_t)(q - lab0);
            CHECK_OP(ln + lb + 2, <, sizeof(key));
            memcpy(key, line, ln);
            key[ln] = '{';
            memcpy(key + ln + 1, lab0, lb);
            key[ln + 1 + lb] = '\0';
        }
        keys = realloc(keys, (samples + 1) * sizeof(*keys));
        CHECK(keys != NULL);
        keys[samples] = strdup(key);
        CHECK(*q == ' ');
        char *end;
        double v = strtod(q + 1, &end);
        CHECK(*end == '\0' && end != q + 1 && v >= 0);
        if (strstr(line, "_bucket") && strlen(line) > 7 &&
            !strcmp(line + strlen(line) - 7, "_bucket")) {
            /* cumulative within one series */
            if (!strcmp(series, last_series))
                CHECK(v >= last_bucket);
            snprintf(last_series, sizeof(last_series), "%s", series);
            last_bucket = v;
        }
        samples++;
    }
    /* no sample twice (two clients of one store are one set of series) */
    qsort(keys, samples, sizeof(*keys), by_str);
    for (size_t i = 0; i + 1 < samples; i++)
        if (!strcmp(keys[i], keys[i + 1]))
            th_fail(__FILE__, __LINE__, "sample twice: %s", keys[i]);
    for (size_t i = 0; i < samples; i++)
        free(keys[i]);
    free(keys);
    return samples;
}

TEST(exposition_escapes_any_name)
{
    static const char *names[] = {"m/odd/back\\slash", "m/odd/quo\"te",
                                  "m/odd/new\nline", "m/odd/\xff\xfe bytes",
                                  "m/odd/\xc3\xa9t\xc3\xa9"};
    dlock_client *a = client(), *b = client();
    dlock *ls[5];
    char *text = NULL;
    size_t len = 0;

    for (int i = 0; i < 5; i++) {
        ls[i] = th_handle(a, names[i], 0, 0, 0);
        CHECK_OK(dlock_acquire(ls[i], 0));
        CHECK_OK(dlock_release(ls[i]));
    }
    dlock_client *both[2] = {a, b};
    CHECK_OK(dlock_metrics_text(both, 2, &text, &len));
    CHECK_EQ(len, strlen(text));
    CHECK_CONTAINS(text, "lock=\"m/odd/back\\\\slash\"");
    CHECK_CONTAINS(text, "lock=\"m/odd/quo\\\"te\"");
    CHECK_CONTAINS(text, "lock=\"m/odd/new\\nline\"");
    /* not UTF-8: each stray byte \xNN, and the exact bytes in lock_hex */
    CHECK_CONTAINS(text, "lock=\"m/odd/\\\\xff\\\\xfe bytes\",lock_hex=\""
                         "6d2f6f64642ffffe206279746573\"");
    CHECK(strstr(text, "\xff") == NULL);
    /* UTF-8 as it is, and no lock_hex for it */
    CHECK_CONTAINS(text, "lock=\"m/odd/\xc3\xa9t\xc3\xa9\"}");
    CHECK_CONTAINS(text, "# TYPE dlock_wait_seconds histogram");
    CHECK_CONTAINS(text, "dlock_hold_seconds_bucket{");
    CHECK_CONTAINS(text, "le=\"+Inf\"} 1\n");
    CHECK_CONTAINS(text, "dlock_acquired_total{store=\"");
    CHECK_CONTAINS(text, "dlock_store_errors_total{");
    CHECK_CONTAINS(text, "code=\"DLOCK_ECONN\"} 0");
    size_t samples = check_exposition(text);
    CHECK_OP(samples, >, 100);

    /* promtool, when there, agrees (it wants UTF-8 label values, which
     * the text has: every name is written as UTF-8) */
    if (system("command -v promtool >/dev/null 2>&1") == 0) {
        char path[512], cmd[1200];
        dlock_free(text);
        text = NULL;
        CHECK_OK(dlock_metrics_config(a, 1, 4)); /* no new names */
        dlock_client_close(b);
        b = NULL;
        dlock_client *one[1] = {a};
        CHECK_OK(dlock_metrics_text(one, 1, &text, &len));
        snprintf(path, sizeof(path), "%s/metrics.txt", th_tmpdir());
        FILE *f = fopen(path, "w");
        CHECK(f != NULL);
        CHECK_EQ(fwrite(text, 1, len, f), len);
        fclose(f);
        snprintf(cmd, sizeof(cmd), "promtool check metrics < %s", path);
        CHECK_EQ(system(cmd), 0);
    } else {
        printf("     (promtool not installed: the format checked here "
               "only)\n");
    }
    dlock_free(text);

    char *out = (char *)"x";
    CHECK_RC(dlock_metrics_text(NULL, 1, &out, NULL), DLOCK_EINVAL);
    CHECK(out == NULL);
    dlock_client *none[1] = {NULL};
    CHECK_RC(dlock_metrics_text(none, 1, &out, NULL), DLOCK_EINVAL);
    CHECK_OK(dlock_metrics_text(NULL, 0, &out, NULL));
    dlock_free(out);

    for (int i = 0; i < 5; i++)
        dlock_close(ls[i]);
    TH_CLIENT_CLOSE(a, b);
}

static const th_test tests[] = {
    T(counts_what_happens),
    TK(times_a_wait_and_its_hand_off),
    T(names_are_bounded_and_totals_kept),
    T(metrics_off_counts_nothing),
    T(events_acquired_released_long_hold),
    T(a_lost_hold_is_counted_and_told),
    T(exposition_escapes_any_name),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    return th_store_main(argc, argv, &S, tests, NULL);
}
