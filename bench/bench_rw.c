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
 */
#include "harness.h"

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
    return 0;
}
