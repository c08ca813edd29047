/* SPDX-License-Identifier: MIT */
/*
 * bench_rw.c -- shared holds and semaphores on one store (issue 19's
 * targets), printed as a Markdown subsection of that store's section:
 *
 *   dlock_bench_rw URI [--quick]
 *
 *  - the uncontended cycle, shared beside exclusive (chunks alternate);
 *  - readers in parallel: R processes each holding the name shared for
 *    1 ms at a time, critical sections per second beside one reader's;
 *  - a writer under a flood of readers: R readers keep the name held
 *    shared (1 ms holds, back to back), a writer asks for it; how long
 *    it waits, beside 2 x (the longest read hold + one hand-off), the
 *    hand-off measured in the same run (exclusive, two processes).
 *
 * Then a subsection of its own, "Several locks at once" (issue 36): the
 * uncontended dlock_acquire_all() + dlock_release_all() over 2 and 8
 * names beside as many plain dlock_acquire() + dlock_release() in a row
 * on the same handles (chunks alternate).
 *
 * And "Leader election" (issue 36): the hand-over between two candidates
 * (dlock_resign() to the other's dlock_campaign() returning) beside the
 * plain lock's hand-off, and how long after a new leader's campaign
 * returned an observer in a third process reports it, beside that
 * hand-off ("observers learn of a change within one hand-off").
 */
#include "harness.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define READERS 8
#define HOLD_US 1000

const char bench_prog[] = "bench_rw";
static const char *uri;

/* A set of handles for the sets' cycles. */
typedef struct set_arg {
    dlock **ls;
    size_t n;
} set_arg;

static void plain_n_once(void *p)
{
    set_arg *a = p;

    for (size_t i = 0; i < a->n; i++)
        if (dlock_acquire(a->ls[i], 0) != DLOCK_OK)
            die("acquire", dlock_errmsg());
    for (size_t i = a->n; i-- > 0;)
        if (dlock_release(a->ls[i]) != DLOCK_OK)
            die("release", dlock_errmsg());
}

static void all_n_once(void *p)
{
    set_arg *a = p;

    if (dlock_acquire_all(a->ls, a->n, 0) != DLOCK_OK)
        die("acquire_all", dlock_errmsg());
    if (dlock_release_all(a->ls, a->n) != DLOCK_OK)
        die("release_all", dlock_errmsg());
}

/* The "Several locks at once" subsection. */
static void sets(int quick)
{
    enum { MAXN = 8 };
    dlock *ls[MAXN];
    char name[32];
    int n = quick ? 400 : 4000, chunks = 10;

    printf("\n### Several locks at once\n\n");
    dlock_client *c = h_section_client(uri, NULL);
    for (int i = 0; i < MAXN; i++) {
        snprintf(name, sizeof(name), "bench-set-%d", i);
        ls[i] = h_open_lock(c, name, 0, 0);
    }
    set_arg two = {ls, 2}, eight = {ls, MAXN};
    kind_op kinds[4] = {{plain_n_once, &two}, {all_n_once, &two},
                        {plain_n_once, &eight}, {all_n_once, &eight}};
    double *p50 = calloc((size_t)(4 * chunks), sizeof(double));
    if (!p50)
        die("calloc", "out of memory");
    chunked_ops(kinds, 4, n, chunks, p50, NULL);
    printf("| names | N plain acquires + releases, p50 (µs) | "
           "dlock_acquire_all() + dlock_release_all(), p50 (µs) | ratio "
           "(target) |\n|---|---|---|---|\n");
    for (int k = 0; k < 4; k += 2) {
        spread pl = medrange(p50 + k * chunks, chunks),
               al = medrange(p50 + (k + 1) * chunks, chunks);
        spread r = ratios(p50 + (k + 1) * chunks, p50 + k * chunks, chunks);
        printf("| %d | %.1f | %.1f | **%.2fx** (%.2f–%.2f; target ≤ 1.1x) "
               "|\n",
               k ? MAXN : 2, pl.med, al.med, r.med, r.min, r.max);
    }
    printf("\nUncontended, one client and thread, the same handles for "
           "both; %d cycles of each kind in %d chunks that alternate the "
           "kinds, the ratio the median of the chunks' ratios. A set takes "
           "its names one after another in name order (docs/design.md, "
           "\"Several locks at once\"), so its floor is the plain "
           "acquires in a row.\n",
           n, chunks);
    free(p50);
    for (int i = 0; i < MAXN; i++)
        dlock_close(ls[i]);
    dlock_client_close(c);
}

/* ------------------------------------------------------------------------ */
/* Leader election                                                          */
/* ------------------------------------------------------------------------ */

#define ELECT_MAX 1024

/* What the candidates record (shared memory): each term they won and
 * when their campaign returned. */
typedef struct elect_won {
    volatile long n;
    uint64_t term[ELECT_MAX];
    int64_t ns[ELECT_MAX];
} elect_won;

typedef struct elect_side {
    dlock_client *c;
    dlock *l;
    elect_won *won;
    char value[16];
} elect_side;

static elect_won *won;

static void *elect_open(void *arg, int me)
{
    elect_side *d = calloc(1, sizeof(*d));

    (void)arg;
    if (!d)
        die("elect", "out of memory");
    d->c = h_open_client(uri, NULL); /* after fork: its own */
    d->l = h_open_lock(d->c, "bench-elect", 0, 0);
    d->won = won;
    snprintf(d->value, sizeof(d->value), "candidate-%d", me);
    return d;
}

static void elect_campaign(void *side)
{
    elect_side *d = side;

    if (dlock_campaign(d->l, d->value, 30000) != DLOCK_OK)
        die("campaign", dlock_errmsg());
    int64_t t = now_ns();
    long i = __atomic_fetch_add(&d->won->n, 1, __ATOMIC_RELAXED);
    if (i < ELECT_MAX) {
        d->won->term[i] = dlock_token(d->l);
        d->won->ns[i] = t;
    }
}

static void elect_resign(void *side)
{
    elect_side *d = side;

    if (dlock_resign(d->l) != DLOCK_OK)
        die("resign", dlock_errmsg());
}

static void elect_close(void *side, int holding)
{
    elect_side *d = side;

    if (holding)
        elect_resign(d);
    dlock_close(d->l);
    dlock_client_close(d->c);
    free(d);
}

/* What the observer saw: each leader's term and when it was told. */
typedef struct seen {
    pthread_mutex_t mu;
    long n;
    uint64_t term[ELECT_MAX];
    int64_t ns[ELECT_MAX];
} seen;

static void on_leader(const char *name, const dlock_leader *ld, void *arg)
{
    seen *s = arg;
    int64_t t = now_ns();

    (void)name;
    if (!ld->present || ld->error)
        return;
    pthread_mutex_lock(&s->mu);
    if (s->n < ELECT_MAX) {
        s->term[s->n] = ld->term;
        s->ns[s->n++] = t;
    }
    pthread_mutex_unlock(&s->mu);
}

/* The "Leader election" subsection. */
static void elections(int quick)
{
    int n = quick ? 40 : 200;
    int64_t *plain = calloc((size_t)n, sizeof(int64_t)),
            *over = calloc((size_t)n, sizeof(int64_t)),
            *lag = calloc((size_t)ELECT_MAX, sizeof(int64_t));
    static seen sn;
    dlock_observer *o = NULL;

    printf("\n### Leader election\n\n");
    if (!plain || !over || !lag)
        die("calloc", "out of memory");
    won = h_shared(sizeof(*won));
    memset(&sn, 0, sizeof(sn));
    pthread_mutex_init(&sn.mu, NULL);
    dlock_client *c = h_section_client(uri, NULL);
    int orc = dlock_observe(c, "bench-elect", on_leader, &sn, &o);
    if (orc != DLOCK_OK && orc != DLOCK_ENOTSUP)
        die("observe", dlock_errmsg());
    char why[256];
    snprintf(why, sizeof(why), "%s", orc ? dlock_errmsg() : "");

    dlock_party party = {uri, NULL, 0, 0, 30000};
    stats ho = handoff_dlock(&party, n, plain);
    party_ops ops = {elect_open, elect_campaign, elect_resign, elect_close,
                     NULL};
    handoff_cfg cfg = {&ops, 2000, 2000, 0};
    stats eo = handoff_run(&cfg, n, over);
    /* ratios of the medians: two runs of n hand-offs each */
    printf("| measure | plain lock | election | ratio |\n|---|---|---|---|\n");
    printf("| hand-over between two processes, p50 / p99 (µs) | %.1f / %.1f "
           "| %.1f / %.1f | **%.2fx** (the same store also serves the "
           "rings and the observer's reads) |\n",
           ho.p50_us, ho.p99_us, eo.p50_us, eo.p99_us,
           eo.p50_us / ho.p50_us);
    if (o) {
        /* the observer's reports, matched with the campaigns by term;
         * a report before the campaign returned counts 0 */
        dlock_observer_close(o);
        long m = 0, nw = won->n < ELECT_MAX ? won->n : ELECT_MAX;
        for (long i = 0; i < sn.n; i++)
            for (long k = 0; k < nw; k++)
                if (won->term[k] == sn.term[i]) {
                    int64_t d = sn.ns[i] - won->ns[k];
                    lag[m++] = d > 0 ? d : 0;
                    break;
                }
        stats lg = summarize(lag, (int)m);
        printf("| an observer told of the new leader, after its campaign "
               "returned, p50 / p99 (µs) | hand-off p50 %.1f | %.1f / %.1f "
               "| **%.2fx** of the hand-off (target ≤ 1x) |\n",
               ho.p50_us, lg.p50_us, lg.p99_us, lg.p50_us / ho.p50_us);
        printf("\nTwo candidate processes hand the leadership back and "
               "forth %d times (2 ms terms; the timing as the plain hand-off "
               "row: from the leader's dlock_resign() call to the other's "
               "dlock_campaign() returning), while a third process observes "
               "(dlock_observe(), a callback); %ld of %ld new terms were "
               "reported to it (a term that ends before the observer reads "
               "is replaced by the next). The ring that wakes observers is "
               "sent by the campaigner's background thread once the "
               "campaign returned, so an observer is often told before the "
               "campaign's caller runs again (counted 0).\n",
               n, m, nw);
    } else {
        printf("\nNo observer on this store: %s.\n", why);
    }
    dlock_client_close(c);
    h_unshare(won, sizeof(*won));
    free(plain);
    free(over);
    free(lag);
}

static void shared_once(void *l)
{
    if (dlock_acquire_shared(l, 0) != DLOCK_OK)
        die("acquire_shared", dlock_errmsg());
    if (dlock_release(l) != DLOCK_OK)
        die("release", dlock_errmsg());
}

/* ------------------------------------------------------------------------ */
/* Readers in parallel                                                      */
/* ------------------------------------------------------------------------ */

typedef struct par {
    volatile int ready, go, stop;
    int distinct; /* each process its own name, exclusive: the capacity */
    int64_t run_ns;
    volatile long sections[READERS];
    volatile int64_t longest_hold_ns; /* the longest read hold seen */
    volatile int writer_waits;        /* the flood: writer's turns */
    int64_t writer_ns[64];
} par;

static void reader(void *arg, int me)
{
    par *p = arg;
    dlock_client *c = h_open_client(uri, NULL);
    char name[32];
    snprintf(name, sizeof(name), p->distinct ? "bench-rw-%d" : "bench-rw", me);
    dlock *l = h_open_lock(c, name, 0, 0);

    __atomic_add_fetch(&p->ready, 1, __ATOMIC_SEQ_CST);
    spin_until(&p->go, 1);
    while (!__atomic_load_n(&p->stop, __ATOMIC_SEQ_CST)) {
        if ((p->distinct ? dlock_acquire(l, 30000)
                         : dlock_acquire_shared(l, 30000)) != DLOCK_OK)
            die("reader: acquire", dlock_errmsg());
        int64_t t0 = now_ns();
        sleep_us(HOLD_US);
        int64_t held = now_ns() - t0;
        if (dlock_release(l) != DLOCK_OK)
            die("reader: release", dlock_errmsg());
        p->sections[me]++;
        int64_t was = __atomic_load_n(&p->longest_hold_ns, __ATOMIC_SEQ_CST);
        while (held > was &&
               !__atomic_compare_exchange_n(&p->longest_hold_ns, &was, held,
                                            0, __ATOMIC_SEQ_CST,
                                            __ATOMIC_SEQ_CST)) {
        }
    }
    dlock_close(l);
    dlock_client_close(c);
}

/* Critical sections per second of n readers together over run_ms (or,
 * `distinct`, of n exclusive holders of n names). */
static double readers_rate(int n, int64_t run_ms, int distinct)
{
    par *p = h_shared(sizeof(*p));

    p->distinct = distinct;
    pid_t pids[READERS];
    long total = 0;

    for (int i = 0; i < n; i++)
        pids[i] = spawn(reader, p, i);
    wait_ready(&p->ready, n, pids, n, "readers");
    __atomic_store_n(&p->go, 1, __ATOMIC_SEQ_CST);
    int64_t t0 = now_ns();
    sleep_us((long)run_ms * 1000);
    for (int i = 0; i < n; i++)
        total += __atomic_load_n(&p->sections[i], __ATOMIC_SEQ_CST);
    double secs = (double)(now_ns() - t0) / 1e9;
    __atomic_store_n(&p->stop, 1, __ATOMIC_SEQ_CST);
    reap(pids, n, "readers");
    h_unshare(p, sizeof(*p));
    return (double)total / secs;
}

/* ------------------------------------------------------------------------ */
/* A writer under a flood of readers                                        */
/* ------------------------------------------------------------------------ */

/* The writer's waits, into out[0..turns), after one turn not counted
 * (*first: its wait); the longest read hold seen. */
static int64_t writer_under_flood(int turns, int64_t *out, int64_t *first)
{
    par *p = h_shared(sizeof(*p));
    pid_t pids[READERS];
    dlock_client *c = h_open_client(uri, NULL);
    dlock *l = h_open_lock(c, "bench-rw", 0, 0);

    /* a writer that has run before (its connections open, its
     * statements prepared): the wait measured is the protocol's, not a
     * new client's first round trips */
    h_dlock_once(l);
    for (int i = 0; i < READERS; i++)
        pids[i] = spawn(reader, p, i);
    wait_ready(&p->ready, READERS, pids, READERS, "readers");
    __atomic_store_n(&p->go, 1, __ATOMIC_SEQ_CST);
    sleep_us(50000); /* the flood is on */
    /* turn -1, not counted: the readers' first wait behind a writer (a
     * store may prepare their statements or open their wake-up channels
     * then), reported apart */
    for (int t = -1; t < turns; t++) {
        sleep_us(5000 + rand() % 5000);
        int64_t t0 = now_ns();
        if (dlock_acquire(l, 30000) != DLOCK_OK)
            die("writer: acquire", dlock_errmsg());
        *(t < 0 ? first : &out[t]) = now_ns() - t0;
        if (dlock_release(l) != DLOCK_OK)
            die("writer: release", dlock_errmsg());
    }
    __atomic_store_n(&p->stop, 1, __ATOMIC_SEQ_CST);
    reap(pids, READERS, "readers");
    int64_t longest = p->longest_hold_ns;
    dlock_close(l);
    dlock_client_close(c);
    h_unshare(p, sizeof(*p));
    return longest;
}

int main(int argc, char **argv)
{
    int quick = 0;

    uri = h_args(argc, argv, "URI", &quick);
    printf("\n### Shared holds and semaphores\n\n");
    dlock_client *c = h_section_client(uri, NULL);
    dlock *x = h_open_lock(c, "bench-rw-cycle", 0, 0);
    if (dlock_acquire_shared(x, 0) != DLOCK_OK) {
        printf("Not measured: %s.\n", dlock_errmsg());
        return 0;
    }
    dlock_release(x);
    dlock_options so;
    memset(&so, 0, sizeof(so));
    so.permits = 4;
    dlock *sem = NULL;
    if (dlock_open(&sem, c, "bench-rw-sem", &so) != DLOCK_OK)
        die("open", dlock_errmsg());
    int has_sem = dlock_acquire(sem, 0) == DLOCK_OK;
    if (has_sem)
        dlock_release(sem);

    /* the uncontended cycles, chunk by chunk */
    int n = quick ? 2000 : 20000, chunks = 10;
    kind_op kinds[3] = {{h_dlock_once, x}, {shared_once, x}, {h_dlock_once, sem}};
    int nk = has_sem ? 3 : 2;
    double *p50 = calloc((size_t)(nk * chunks), sizeof(double));
    if (!p50)
        die("calloc", "out of memory");
    chunked_ops(kinds, nk, n, chunks, p50, NULL);
    spread ex = medrange(p50, chunks), sh = medrange(p50 + chunks, chunks);
    spread r = ratios(p50 + chunks, p50, chunks);
    printf("| measure | exclusive | shared | ratio (target) |\n|---|---|---|---|\n");
    printf("| shared beside exclusive: uncontended acquire+release, p50 (µs) "
           "| %.1f | %.1f | **%.2fx** "
           "(%.2f–%.2f; target ≤ 1.1x) |\n",
           ex.med, sh.med, r.med, r.min, r.max);
    if (has_sem) {
        spread pm = medrange(p50 + 2 * chunks, chunks);
        spread pr = ratios(p50 + 2 * chunks, p50, chunks);
        printf("| a semaphore's permit (4 permits), p50 (µs) | %.1f | %.1f | "
               "%.2fx (%.2f–%.2f) |\n",
               ex.med, pm.med, pr.med, pr.min, pr.max);
    }
    free(p50);
    dlock_close(x);
    dlock_close(sem);
    dlock_client_close(c);

    /* readers in parallel */
    int64_t run_ms = quick ? 500 : 2000;
    double one = readers_rate(1, run_ms, 0),
           many = readers_rate(READERS, run_ms, 0),
           cap = readers_rate(READERS, run_ms, 1);
    printf("| %d readers holding %d ms each, critical sections/s | 1 reader: "
           "%.0f | %d readers: %.0f | **%.2fx** of %d x one reader's (target "
           "≥ 0.8x) |\n",
           READERS, HOLD_US / 1000, one, READERS, many,
           many / (READERS * one), READERS);
    printf("| the store's capacity: %d processes, each its own name, "
           "exclusive, %d ms holds, critical sections/s | | %.0f | the %d "
           "readers: %.2fx of it |\n",
           READERS, HOLD_US / 1000, cap, READERS, many / cap);

    /* a writer under a flood of readers */
    dlock_party party = {uri, NULL, 0, 0, 30000};
    int nh = quick ? 20 : 100, turns = quick ? 10 : 40;
    int64_t *hs = calloc((size_t)nh, sizeof(int64_t)),
            *ws = calloc((size_t)turns, sizeof(int64_t));
    if (!hs || !ws)
        die("calloc", "out of memory");
    stats ho = handoff_dlock(&party, nh, hs);
    int64_t first = 0;
    int64_t longest = writer_under_flood(turns, ws, &first);
    stats wst = summarize(ws, turns);
    int64_t wmax = ws[turns - 1]; /* sorted by summarize */
    double bound_us = 2.0 * ((double)longest / 1000.0 + ho.p50_us);
    printf("| a writer under a flood of %d readers (1 ms holds): its wait, "
           "p50 / max (µs) | hand-off p50 %.1f, longest read hold %.0f | "
           "%.0f / %.0f | max **%.2fx** of 2 x (longest read hold + "
           "hand-off) = %.0f µs (target ≤ 1x) |\n",
           READERS, ho.p50_us, (double)longest / 1000.0, wst.p50_us,
           (double)wmax / 1000.0, (double)wmax / 1000.0 / bound_us, bound_us);
    free(hs);
    free(ws);
    printf("\nThe readers sleep 1 ms per hold (nanosleep: the kernel's timer "
           "slack makes it a little longer); the longest read hold is the "
           "longest any reader measured in the flood. The writer, a client "
           "that has taken the lock once before the readers start, asks %d "
           "times, 5–10 ms apart, while the %d readers keep the name "
           "held, after a first time that is not counted: the readers' "
           "first wait behind a writer, in which a store may prepare their "
           "statements or open their wake-up channels (it took %.0f µs, "
           "%.2fx of the bound). The capacity row is the same %d processes "
           "with nothing shared between them: what the store and this "
           "machine's cores give at that concurrency, the most %d readers "
           "of one name could reach.\n",
           turns, READERS, (double)first / 1000.0,
           (double)first / 1000.0 / bound_us, READERS, READERS);
    sets(quick);
    elections(quick);
    return 0;
}
