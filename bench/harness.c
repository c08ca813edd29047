/* SPDX-License-Identifier: MIT */
/*
 * harness.c -- see harness.h.
 */
#include "harness.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

const char *h_args(int argc, char **argv, const char *what, int *quick)
{
    if (argc < 2) {
        fprintf(stderr, "usage: dlock_%s %s [--quick]\n", bench_prog, what);
        exit(2);
    }
    *quick = argc > 2 && !strcmp(argv[2], "--quick");
    return argv[1];
}

/* ------------------------------------------------------------------------ */
/* Timed loops                                                              */
/* ------------------------------------------------------------------------ */

void time_ops(void (*op)(void *), void *arg, int64_t *ns, int n,
              long idle_us)
{
    for (int i = 0; i < n; i++) {
        if (idle_us)
            sleep_us(idle_us);
        int64_t t0 = ns ? now_ns() : 0;
        op(arg);
        if (ns)
            ns[i] = now_ns() - t0;
    }
}

stats time_op(void (*op)(void *), void *arg, int warm, int n, long idle_us)
{
    int64_t *ns = malloc(sizeof(*ns) * (size_t)n);

    if (!ns)
        die("timing", "out of memory");
    time_ops(op, arg, NULL, warm, idle_us);
    time_ops(op, arg, ns, n, idle_us);
    stats s = summarize(ns, n);
    free(ns);
    return s;
}

typedef struct write_rtt {
    void (*write)(void *), (*rtt)(void *);
    void *conn;
} write_rtt;

static void write_rtt_once(void *arg)
{
    write_rtt *w = arg;

    w->write(w->conn);
    w->rtt(w->conn);
}

stats time_write_rtt(void (*write)(void *), void (*rtt)(void *), void *conn,
                     int kind, int n)
{
    write_rtt w = {write, rtt, conn};

    if (kind == 0)
        return time_op(rtt, conn, n / 10, n, 0);
    if (kind == 1)
        return time_op(write, conn, n / 10, n, 0);
    return time_op(write_rtt_once, &w, n / 10, n, 2000);
}

/* ------------------------------------------------------------------------ */
/* dlock's side                                                             */
/* ------------------------------------------------------------------------ */

dlock_client *h_open_client(const char *uri, const dlock_client_options *o)
{
    dlock_client *c;

    if (dlock_client_open(&c, uri, o) != DLOCK_OK)
        die("client", dlock_errmsg());
    return c;
}

dlock_client *h_store_client(const char *uri, const dlock_client_options *o,
                             char *why, size_t cap)
{
    dlock_client *c = NULL;
    int rc = dlock_client_open(&c, uri, o);

    snprintf(why, cap, "%s", rc == DLOCK_ENOTSUP ? dlock_errmsg() : "");
    if (rc != DLOCK_OK && rc != DLOCK_ENOTSUP)
        die("client", dlock_errmsg());
    return rc == DLOCK_OK ? c : NULL;
}

dlock_client *h_section_client(const char *uri,
                               const dlock_client_options *o)
{
    char why[256];
    dlock_client *c = h_store_client(uri, o, why, sizeof(why));

    if (!c) {
        printf("Not measured: %s.\n", why);
        exit(0);
    }
    return c;
}

dlock *h_open_lock(dlock_client *c, const char *name, unsigned flags,
                   int64_t ttl_ms)
{
    dlock_options o;
    dlock *l;

    memset(&o, 0, sizeof(o));
    o.flags = flags;
    o.ttl_ms = ttl_ms;
    if (dlock_open(&l, c, name, &o) != DLOCK_OK)
        die(name, dlock_errmsg());
    return l;
}

void h_dlock_once(void *l)
{
    if (dlock_acquire(l, 0) != DLOCK_OK)
        die("cycle acquire", dlock_errmsg());
    if (dlock_release(l) != DLOCK_OK)
        die("cycle release", dlock_errmsg());
}

void h_dlock_cycles(dlock *l, int64_t *ns, int n)
{
    time_ops(h_dlock_once, l, ns, n, 0);
}

spread metrics_cost(const char *uri, const dlock_client_options *o, int n,
                    int chunks, double *on_us, double *off_us)
{
    int per = n / chunks;
    int64_t *a = malloc(sizeof(int64_t) * (size_t)per);
    int64_t *b = malloc(sizeof(int64_t) * (size_t)per);
    double *v = malloc(sizeof(double) * (size_t)chunks * 2);
    spread r;

    if (!a || !b || !v)
        die("metrics cost", "out of memory");
    for (int k = 0; k < chunks; k++) {
        dlock_client *on = h_open_client(uri, o), *off = h_open_client(uri, o);
        if (dlock_metrics_config(off, 0, 0) != DLOCK_OK)
            die("metrics cost", dlock_errmsg());
        dlock *lon = h_open_lock(on, "bench-metrics-on", 0, 0);
        dlock *loff = h_open_lock(off, "bench-metrics-off", 0, 0);
        for (int i = 0; i < (k == 0 ? 300 : 30); i++) {
            h_dlock_once(lon);
            h_dlock_once(loff);
        }
        for (int i = 0; i < per; i++) {
            /* the order alternates too */
            dlock *first = (i ^ k) & 1 ? loff : lon;
            dlock *second = first == lon ? loff : lon;
            int64_t t0 = now_ns();
            h_dlock_once(first);
            int64_t t1 = now_ns();
            h_dlock_once(second);
            int64_t t2 = now_ns();
            a[i] = first == lon ? t1 - t0 : t2 - t1;
            b[i] = first == lon ? t2 - t1 : t1 - t0;
        }
        v[k] = summarize(a, per).p50_us;
        v[chunks + k] = summarize(b, per).p50_us;
        dlock_close(lon);
        dlock_close(loff);
        dlock_client_close(on);
        dlock_client_close(off);
    }
    r = ratios(v, v + chunks, chunks);
    *on_us = medrange(v, chunks).med;
    *off_us = medrange(v + chunks, chunks).med;
    free(a);
    free(b);
    free(v);
    return r;
}

/* ------------------------------------------------------------------------ */
/* Spreads                                                                  */
/* ------------------------------------------------------------------------ */

spread medrange(const double *v, int n)
{
    double *s = malloc(sizeof(double) * (size_t)n);
    spread r;

    if (!s)
        die("medrange", "out of memory");
    memcpy(s, v, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof(double), cmpd);
    r.min = s[0];
    r.med = s[n / 2];
    r.max = s[n - 1];
    free(s);
    return r;
}

spread ratios(const double *num, const double *den, int n)
{
    double *r = malloc(sizeof(double) * (size_t)n);

    if (!r)
        die("ratios", "out of memory");
    for (int i = 0; i < n; i++)
        r[i] = num[i] / den[i];
    spread s = medrange(r, n);
    free(r);
    return s;
}

/* ------------------------------------------------------------------------ */
/* Processes                                                                */
/* ------------------------------------------------------------------------ */

void *h_shared(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED)
        die("mmap", strerror(errno));
    memset(p, 0, size);
    return p;
}

void h_unshare(void *p, size_t size)
{
    munmap(p, size);
}

void spin_until(volatile int *v, int want)
{
    int64_t end = now_ns() + (int64_t)PROC_LIMIT_S * 1000000000;
    long us = 20;

    for (int i = 0; __atomic_load_n(v, __ATOMIC_ACQUIRE) < want; i++) {
        if (now_ns() > end)
            die("waiting for another process", "timed out");
        sleep_us(us);
        if (i > 100 && us < 1000)
            us *= 2;
    }
}

static void kill_all(pid_t *pids, int n)
{
    for (int i = 0; i < n; i++)
        if (pids[i] > 0)
            kill(pids[i], SIGKILL);
    for (int i = 0; i < n; i++)
        if (pids[i] > 0)
            waitpid(pids[i], NULL, 0);
}

/* Reaps the processes that have exited; dies (killing the others) if one
 * failed, or if `must_live` and any has exited. */
static int reap_some(pid_t *pids, int n, int must_live, const char *what)
{
    int st, gone = 0;
    pid_t p;

    while ((p = waitpid(-1, &st, WNOHANG)) > 0) {
        for (int i = 0; i < n; i++) {
            if (pids[i] != p)
                continue;
            pids[i] = 0;
            gone++;
            if (must_live || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                kill_all(pids, n);
                die(what, "a process failed");
            }
        }
    }
    return gone;
}

void reap(pid_t *pids, int n, const char *what)
{
    int64_t end = now_ns() + (int64_t)PROC_LIMIT_S * 1000000000;
    int left = n;

    for (int i = 0; i < n; i++)
        left -= pids[i] <= 0;
    while (left > 0) {
        left -= reap_some(pids, n, 0, what);
        if (left > 0 && now_ns() > end) {
            kill_all(pids, n);
            die(what, "processes still running after the time limit");
        }
        if (left > 0)
            sleep_us(2000);
    }
}

void wait_ready(volatile int *v, int want, pid_t *pids, int n,
                const char *what)
{
    int64_t end = now_ns() + (int64_t)PROC_LIMIT_S * 1000000000;

    while (__atomic_load_n(v, __ATOMIC_ACQUIRE) < want) {
        reap_some(pids, n, 1, what);
        if (now_ns() > end) {
            kill_all(pids, n);
            die(what, "processes not ready in time");
        }
        sleep_us(200);
    }
}

pid_t spawn(void (*fn)(void *, int), void *arg, int me)
{
    fflush(stdout);
    pid_t p = fork();
    if (p < 0)
        die("fork", strerror(errno));
    if (p == 0) {
        alarm(PROC_LIMIT_S + 5); /* a stuck child never outlives us */
        fn(arg, me);
        _exit(0);
    }
    return p;
}

/* ------------------------------------------------------------------------ */
/* Chunked cycles                                                           */
/* ------------------------------------------------------------------------ */

cycles run_cycles(const floor_ops *fl, const char *uri,
                  const dlock_client_options *o, int n, int chunks,
                  int with_rtt)
{
    int per = n / chunks;
    int64_t *fns = malloc(sizeof(int64_t) * (size_t)per * (size_t)chunks);
    int64_t *dns = malloc(sizeof(int64_t) * (size_t)per * (size_t)chunks);
    int64_t *rns = malloc(sizeof(int64_t) * (size_t)per);
    double *v = calloc((size_t)chunks * 4, sizeof(double));
    double *fv = v, *dv = v + chunks, *rv = v + 2 * chunks,
           *tv = v + 3 * chunks;
    cycles c;

    if (!fns || !dns || !rns || !v)
        die("cycles", "out of memory");
    with_rtt = with_rtt && fl->rtt;
    for (int k = 0; k < chunks; k++) {
        int64_t *fk = fns + (size_t)k * per, *dk = dns + (size_t)k * per;
        void *f = fl->connect(fl->arg);
        dlock_client *dc = h_open_client(uri, o);
        dlock *l = h_open_lock(dc, "bench-cycle", 0, 0);
        /* past a new session's first plans and cold caches */
        for (int i = 0; i < (k == 0 ? 300 : 30); i++) {
            fl->cycle(f);
            h_dlock_once(l);
        }
        for (int i = 0; with_rtt && i < per; i++) {
            int64_t t0 = now_ns();
            fl->rtt(f);
            rns[i] = now_ns() - t0;
        }
        for (int side = 0; side < 2; side++) {
            /* the order alternates too */
            if ((side ^ (k & 1)) == 0) {
                for (int i = 0; i < per; i++) {
                    int64_t t0 = now_ns();
                    fl->cycle(f);
                    fk[i] = now_ns() - t0;
                }
            } else {
                h_dlock_cycles(l, dk, per);
            }
        }
        dlock_close(l);
        dlock_client_close(dc);
        fl->close(f);
        tv[k] = with_rtt ? summarize(rns, per).p50_us : 0;
        fv[k] = summarize(fk, per).p50_us;
        dv[k] = summarize(dk, per).p50_us;
        rv[k] = dv[k] / fv[k];
    }
    c.floor = medrange(fv, chunks);
    c.dlock = medrange(dv, chunks);
    c.ratio = medrange(rv, chunks);
    c.rtt = medrange(tv, chunks);
    c.floor_all = summarize(fns, per * chunks);
    c.dlock_all = summarize(dns, per * chunks);
    free(fns);
    free(dns);
    free(rns);
    free(v);
    return c;
}

void h_cycle_rows(const char *mode, const char *floor, const cycles *c,
                  const char *goal, double rtt_us)
{
    printf("| %suncontended acquire+release, p50 (floor: %s) | %.1f | %.1f | "
           "**%.2fx** (chunks: %.2f–%.2f%s%s) |\n",
           mode, floor, c->floor.med, c->dlock.med, c->ratio.med,
           c->ratio.min, c->ratio.max, goal ? "; goal ≤ " : "",
           goal ? goal : "");
    printf("| %sthe same, p99 | %.1f | %.1f | %.2fx |\n", mode,
           c->floor_all.p99_us, c->dlock_all.p99_us,
           c->dlock_all.p99_us / c->floor_all.p99_us);
    if (rtt_us > 0)
        printf("| %sthe same p50 in round trips | %.2f | %.2f | |\n", mode,
               c->floor.med / rtt_us, c->dlock.med / rtt_us);
}

void h_summaries(int64_t *fns, int64_t *dns, int n, int have_dlock,
                 stats *fs, stats *ds)
{
    *fs = summarize(fns, n);
    *ds = have_dlock ? summarize(dns, n) : *fs;
    free(fns);
    free(dns);
}

void h_tail_rows(const stats *fs, const stats *ds)
{
    printf("| uncontended acquire+release, p99 | %.1f | %.1f | %.2fx |\n",
           fs->p99_us, ds->p99_us, ds->p99_us / fs->p99_us);
    printf("| cycles per second (one client) | %.0f | %.0f | %.2fx |\n",
           fs->per_s, ds->per_s, ds->per_s / fs->per_s);
}

void h_close(int have, dlock *l, dlock_client *c)
{
    if (have) {
        dlock_close(l);
        dlock_client_close(c);
    }
}

void chunked_ops(const kind_op *kinds, int nk, int n, int chunks,
                 double *p50, int64_t **all)
{
    int per = n / chunks;
    int64_t *ns = malloc(sizeof(int64_t) * (size_t)per);

    if (!ns)
        die("chunks", "out of memory");
    for (int c = 0; c < chunks; c++) {
        for (int k = 0; k < nk; k++) {
            int64_t *to = all ? all[k] + (size_t)c * per : ns;
            time_ops(kinds[k].op, kinds[k].arg, to, per, 0);
            if (to != ns) /* summarize() sorts: all[k] keeps the order */
                memcpy(ns, to, sizeof(int64_t) * (size_t)per);
            p50[k * chunks + c] = summarize(ns, per).p50_us;
        }
    }
    free(ns);
}

int h_primary_args(int argc, char **argv, const char *what)
{
    if (argc < 3) {
        fprintf(stderr, "usage: dlock_%s %s PRIMARY_URI [--quick]\n",
                bench_prog, what);
        exit(2);
    }
    return argc > 3 && !strcmp(argv[3], "--quick") ? 1500 : 15000;
}

void h_beside_primary(const char *const *uris, char names[][32],
                      const char *const *what, int nk, int n, int chunks)
{
    dlock_client **c = calloc((size_t)nk, sizeof(*c));
    dlock **l = calloc((size_t)nk, sizeof(*l));
    kind_op *kinds = calloc((size_t)nk, sizeof(*kinds));
    double *p50 = calloc((size_t)(nk * chunks), sizeof(*p50));

    if (!c || !l || !kinds || !p50)
        die("kinds", "out of memory");
    for (int k = 0; k < nk; k++) {
        c[k] = h_open_client(uris[k], NULL);
        l[k] = h_open_lock(c[k], names[k], 0, 0);
        kinds[k].op = h_dlock_once;
        kinds[k].arg = l[k];
    }
    chunked_ops(kinds, nk, n, chunks, p50, NULL);

    printf("| uncontended acquire+release | p50 (µs) | ÷ on the primary "
           "(target) |\n|---|---|---|\n");
    printf("| dlock on the primary (`redis://`, the floor) | %.1f | 1 |\n",
           medrange(p50, chunks).med);
    for (int k = 1; k < nk; k++) {
        spread s = medrange(p50 + k * chunks, chunks);
        spread r = ratios(p50 + k * chunks, p50, chunks);
        printf("| %s | %.1f | %s%.2fx%s (%.2f–%.2f%s) |\n", what[k], s.med,
               k == 1 ? "**" : "", r.med, k == 1 ? "**" : "", r.min, r.max,
               k == 1 ? "; target ≤ 1.1x" : "; the cost of WAIT");
    }
    printf("\n");
    for (int k = 0; k < nk; k++) {
        dlock_close(l[k]);
        dlock_client_close(c[k]);
    }
    free(p50);
    free(kinds);
    free(l);
    free(c);
}

/* ------------------------------------------------------------------------ */
/* Hand-off between two processes                                           */
/* ------------------------------------------------------------------------ */

typedef struct pingpong {
    volatile int started, ready[2], acquired;
    volatile int64_t released_at, waits_from;
    const handoff_cfg *cfg;
    int n;
    int64_t samples[];
} pingpong;

static void pingpong_proc(void *arg, int me)
{
    pingpong *s = arg;
    const handoff_cfg *cfg = s->cfg;
    const party_ops *ops = cfg->ops;
    void *side = ops->open(ops->arg, me);
    unsigned seed = (unsigned)getpid();

    if (me == 0) {
        ops->acquire(side);
        __atomic_store_n(&s->started, 1, __ATOMIC_RELEASE);
    } else {
        spin_until(&s->started, 1);
    }
    for (int i = 0; i < s->n; i++) {
        if (i % 2 == me) { /* we hold it: hand it over */
            spin_until(&s->ready[1 - me], i + 1);
            /* counted from when the other one began to wait, not from
             * when we saw it; in the two warm-ups, long enough for a
             * cold first try */
            long lo = cfg->hold_min_us, span = cfg->hold_max_us - lo;
            if (i < 2 && cfg->warm_hold_us)
                lo = cfg->warm_hold_us, span = 0;
            int64_t at = __atomic_load_n(&s->waits_from, __ATOMIC_ACQUIRE) +
                         (int64_t)1000 *
                             (lo + (span > 0 ? (long)(rand_r(&seed) %
                                                      (unsigned)(span + 1))
                                             : 0));
            int64_t left = at - now_ns();
            if (left > 0)
                sleep_us((long)(left / 1000));
            __atomic_store_n(&s->released_at, now_ns(), __ATOMIC_RELEASE);
            ops->release(side);
        } else {
            /* never barge: ask only once the other one got it (in default
             * mode a releaser that re-tries at once may win again) */
            spin_until(&s->acquired, i);
            __atomic_store_n(&s->waits_from, now_ns(), __ATOMIC_RELEASE);
            __atomic_store_n(&s->ready[me], i + 1, __ATOMIC_RELEASE);
            ops->acquire(side);
            s->samples[i] = now_ns() -
                            __atomic_load_n(&s->released_at, __ATOMIC_ACQUIRE);
            __atomic_store_n(&s->acquired, i + 1, __ATOMIC_RELEASE);
        }
    }
    /* the last one to take it holds it */
    ops->close(side, s->n % 2 == me);
}

stats handoff_run(const handoff_cfg *cfg, int n, int64_t *out)
{
    size_t size = sizeof(pingpong) + sizeof(int64_t) * (size_t)(n + 3);
    pingpong *s = h_shared(size);
    pid_t pids[2];

    s->cfg = cfg;
    s->n = n + 3;
    for (int me = 0; me < 2; me++)
        pids[me] = spawn(pingpong_proc, s, me);
    reap(pids, 2, "handoff");
    if (out)
        memcpy(out, s->samples + 2, sizeof(int64_t) * (size_t)n);
    stats r = summarize(s->samples + 2, n);
    h_unshare(s, size);
    return r;
}

typedef struct dlock_side {
    dlock_client *c;
    dlock *l;
    int64_t wait_ms;
} dlock_side;

static void *dlock_side_open(void *arg, int me)
{
    const dlock_party *p = arg;
    dlock_side *d = calloc(1, sizeof(*d));

    (void)me;
    if (!d)
        die("handoff", "out of memory");
    d->c = h_open_client(p->uri, p->o); /* after fork: its own */
    d->l = h_open_lock(d->c, "bench-handoff", p->flags, p->ttl_ms);
    d->wait_ms = p->wait_ms;
    return d;
}

static void dlock_side_acquire(void *side)
{
    dlock_side *d = side;

    if (dlock_acquire(d->l, d->wait_ms) != DLOCK_OK)
        die("handoff acquire", dlock_errmsg());
}

static void dlock_side_release(void *side)
{
    dlock_side *d = side;

    if (dlock_release(d->l) != DLOCK_OK)
        die("handoff release", dlock_errmsg());
}

static void dlock_side_close(void *side, int holding)
{
    dlock_side *d = side;

    if (holding)
        dlock_side_release(d);
    dlock_close(d->l);
    dlock_client_close(d->c);
    free(d);
}

const party_ops dlock_party_ops = {dlock_side_open, dlock_side_acquire,
                                   dlock_side_release, dlock_side_close,
                                   NULL};

stats handoff_dlock(const dlock_party *p, int n, int64_t *out)
{
    party_ops ops = dlock_party_ops;
    handoff_cfg cfg = {&ops, 2000, 2000, 0};

    ops.arg = (void *)p;
    return handoff_run(&cfg, n, out);
}

/* ------------------------------------------------------------------------ */
/* Contention                                                               */
/* ------------------------------------------------------------------------ */

struct contend {
    volatile int ready, go, stop, last, timed_out;
    volatile long handoffs, acquisitions;
    volatile int64_t stop_at, done_at;
    int64_t t0, end_ns;
    contend_cfg cfg;
    pid_t pids[];
};

static void contend_proc(void *arg, int me)
{
    contend *s = arg;
    const contend_cfg *cfg = &s->cfg;
    dlock_client *c = h_open_client(cfg->uri, cfg->o);
    dlock *l = h_open_lock(c, "bench-contend", cfg->flags, 0);
    unsigned seed = (unsigned)getpid();
    long limit = 20 * (cfg->target ? cfg->target : (long)cfg->cycles);
    int done = 0;

    __atomic_add_fetch(&s->ready, 1, __ATOMIC_RELEASE);
    spin_until(&s->go, 1);
    for (long i = 0; !cfg->only_open && (!limit || i < limit) &&
                     (!cfg->cycles || done < cfg->cycles) &&
                     !__atomic_load_n(&s->stop, __ATOMIC_ACQUIRE);
         i++) {
        if (now_ns() > s->end_ns) {
            __atomic_store_n(&s->timed_out, 1, __ATOMIC_RELEASE);
            break;
        }
        int rc = dlock_acquire(l, cfg->wait_ms);
        if (rc == DLOCK_EBUSY)
            continue;
        if (rc != DLOCK_OK)
            die("contend", dlock_errmsg());
        done++;
        __atomic_add_fetch(&s->acquisitions, 1, __ATOMIC_RELAXED);
        if (s->last != me) {
            long h = __atomic_add_fetch(&s->handoffs, 1, __ATOMIC_RELAXED);
            s->last = me;
            if (h == cfg->target) {
                __atomic_store_n(&s->stop_at, now_ns(), __ATOMIC_RELEASE);
                __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
            }
        }
        if (cfg->hold_us)
            sleep_us(cfg->hold_us);
        if (dlock_release(l) != DLOCK_OK)
            die("contend release", dlock_errmsg());
        if (cfg->pause_us)
            sleep_us((long)(rand_r(&seed) % (unsigned)(cfg->pause_us + 1)));
    }
    dlock_close(l);
    dlock_client_close(c);
    int64_t t = now_ns();
    /* the last one to finish ends the race */
    if (__atomic_load_n(&s->done_at, __ATOMIC_ACQUIRE) < t)
        __atomic_store_n(&s->done_at, t, __ATOMIC_RELEASE);
}

static size_t contend_size(int nproc)
{
    return sizeof(contend) + sizeof(pid_t) * (size_t)nproc;
}

contend *contend_start(const contend_cfg *cfg)
{
    contend *s = h_shared(contend_size(cfg->nproc));

    s->cfg = *cfg;
    s->last = -1;
    for (int i = 0; i < cfg->nproc; i++) {
        s->pids[i] = spawn(contend_proc, s, i);
        wait_ready(&s->ready, i + 1, s->pids, cfg->nproc, "contend");
    }
    return s;
}

void contend_go(contend *s)
{
    s->t0 = now_ns();
    s->end_ns = s->t0 + s->cfg.limit_ms * 1000000;
    __atomic_store_n(&s->go, 1, __ATOMIC_RELEASE);
}

long contend_handoffs(contend *s)
{
    return __atomic_load_n(&s->handoffs, __ATOMIC_ACQUIRE);
}

void contend_stop(contend *s)
{
    __atomic_store_n(&s->stop, 1, __ATOMIC_RELEASE);
}

contend_result contend_finish(contend *s)
{
    contend_result r;

    reap(s->pids, s->cfg.nproc, "contend");
    int64_t t1 = s->stop_at ? s->stop_at
                 : s->done_at > s->t0 ? s->done_at
                                      : now_ns();
    r.handoffs = s->handoffs;
    r.acquisitions = s->acquisitions;
    r.timed_out = s->timed_out;
    r.per_s = (double)r.handoffs / ((double)(t1 - s->t0) / 1e9);
    h_unshare(s, contend_size(s->cfg.nproc));
    return r;
}
