/* SPDX-License-Identifier: MIT */
/*
 * harness.h -- the measurement machinery every store's bench shares, so
 * that a bench_<store>.c keeps only its store's floor and setup:
 *   timed loops        an operation timed n times, after a warm-up
 *   dlock's side       a client, a lock, timed uncontended cycles
 *   spreads            median and range of per-chunk figures
 *   processes          forked workers that never outlive the bench
 *                      (PROC_LIMIT_S), waits on shared flags
 *   chunked cycles     dlock's cycles alternating with a floor's, chunk by
 *                      chunk, each on a new connection and client
 *   hand-off           two processes pass one lock back and forth; the
 *                      time from the holder's release to the waiter's
 *                      acquire returning
 *   contention         N processes contend for one lock; hand-offs
 *                      counted, for a store's per-hand-off counts
 * Programs that use it link harness.c and common.c (dlock's library too).
 */
#ifndef DLOCK_BENCH_HARNESS_H
#define DLOCK_BENCH_HARNESS_H

#include <dlock.h>

#include <stdint.h>
#include <sys/types.h>

#include "common.h"

#define PROC_LIMIT_S 60 /* a forked process never runs longer */

/* The command line "dlock_<bench_prog> WHAT [--quick]": WHAT (argv[1]),
 * and whether --quick was given into *quick; exits 2 saying so when WHAT
 * is missing. */
const char *h_args(int argc, char **argv, const char *what, int *quick);

/* ------------------------------------------------------------------------ */
/* Timed loops                                                              */
/* ------------------------------------------------------------------------ */

/* n calls of op(arg), each after idle_us of sleep (0: none) and timed
 * into ns[i] when ns is not NULL. */
void time_ops(void (*op)(void *), void *arg, int64_t *ns, int n,
              long idle_us);

/* `warm` untimed calls of op(arg), then n timed: their p50/p99. */
stats time_op(void (*op)(void *), void *arg, int warm, int n, long idle_us);

/* A store's round trip and write floors, on connection conn: kind 0 the
 * round trip rtt(conn), 1 the write write(conn), 2 after 2 ms of idleness
 * (as before every hand-off) a write then a round trip, timed together;
 * n timed after a tenth as many to warm up. */
stats time_write_rtt(void (*write)(void *), void (*rtt)(void *), void *conn,
                     int kind, int n);

/* ------------------------------------------------------------------------ */
/* dlock's side                                                             */
/* ------------------------------------------------------------------------ */

/* A client on uri (o: NULL for the defaults); dies "client: why" (the URI
 * is not named: it may hold a password). */
dlock_client *h_open_client(const char *uri, const dlock_client_options *o);

/* A client on uri, or NULL when its store is not in this build (or its
 * module is missing): why into why[0..cap) (else ""). Dies on any other
 * failure. */
dlock_client *h_store_client(const char *uri, const dlock_client_options *o,
                             char *why, size_t cap);

/* The same for a program whose section (or subsection) heading is printed:
 * when the store is not in this build, prints "Not measured: WHY." and
 * exits 0, the section saying why. */
dlock_client *h_section_client(const char *uri,
                               const dlock_client_options *o);

/* Lock `name` on c with flags and ttl_ms (0: the default lease). */
dlock *h_open_lock(dlock_client *c, const char *name, unsigned flags,
                   int64_t ttl_ms);

/* One uncontended cycle of lock l (a dlock *): dlock_acquire(l, 0),
 * dlock_release(l); dies on failure. */
void h_dlock_once(void *l);

/* n uncontended cycles (dlock_acquire(l, 0), dlock_release(l)), each
 * timed into ns[i] when ns is not NULL. */
void h_dlock_cycles(dlock *l, int64_t *ns, int n);

/* What metrics cost: uncontended cycles of two clients of uri, one with
 * metrics on (the default) and one with them off (dlock_metrics_config),
 * strictly alternating cycle by cycle, in `chunks` chunks of n / chunks
 * cycles (fresh clients each). Per chunk the p50 of each side; returns
 * the median and range over the chunks of on ÷ off, and the sides' p50
 * (µs, median over chunks) in *on_us and *off_us. */
typedef struct spread spread;
spread metrics_cost(const char *uri, const dlock_client_options *o, int n,
                    int chunks, double *on_us, double *off_us);

/* ------------------------------------------------------------------------ */
/* Spreads                                                                  */
/* ------------------------------------------------------------------------ */

struct spread {
    double med, min, max;
};

/* Median and range of v[0..n) (v is left as it was). */
spread medrange(const double *v, int n);

/* Median and range of the ratios num[i] / den[i], i < n. */
spread ratios(const double *num, const double *den, int n);

/* ------------------------------------------------------------------------ */
/* Processes                                                                */
/* ------------------------------------------------------------------------ */

/* Zeroed memory shared with the processes forked after; h_unshare frees. */
void *h_shared(size_t size);
void h_unshare(void *p, size_t size);

/* Waits until *v >= want; dies past PROC_LIMIT_S. Polls every 20 µs at
 * first, then backs off to 1 ms, so that waiting processes leave the CPUs
 * to the ones that work. */
void spin_until(volatile int *v, int want);

/* Forks a process running fn(arg, me), then _exit(0); it never outlives
 * PROC_LIMIT_S + 5 s. */
pid_t spawn(void (*fn)(void *, int), void *arg, int me);

/* Waits for the n processes (pids[i] <= 0: none); dies, killing the
 * others, if one failed or past PROC_LIMIT_S. */
void reap(pid_t *pids, int n, const char *what);

/* Waits until *v >= want while all n processes live (dies otherwise, or
 * past PROC_LIMIT_S). */
void wait_ready(volatile int *v, int want, pid_t *pids, int n,
                const char *what);

/* ------------------------------------------------------------------------ */
/* Chunked cycles: dlock beside a floor                                     */
/* ------------------------------------------------------------------------ */

/* A store's floor: what its bare client does for one uncontended cycle.
 * connect() makes a new floor connection (from arg); rtt may be NULL. */
typedef struct floor_ops {
    void *(*connect)(void *arg);
    void (*cycle)(void *f);
    void (*rtt)(void *f);
    void (*close)(void *f);
    void *arg;
} floor_ops;

typedef struct cycles {
    spread floor, dlock, ratio, rtt;
    stats floor_all, dlock_all;
} cycles;

/*
 * Cycles of dlock (a client on uri, options o, lock "bench-cycle") and of
 * the floor in `chunks` chunks that alternate (the order within a chunk
 * too), each chunk preceded by `n / chunks` round trips when the floor has
 * rtt and with_rtt (the round trip then drifts with the cycles it is
 * compared to). Every chunk has a new floor connection and a new dlock
 * client: on a small machine, which core the server runs a connection's
 * session on moves one fixed connection's figures by up to 20%. A chunk's
 * figure is its p50; floor, dlock, ratio and rtt are the median and range
 * of the chunks', the _all stats over every cycle.
 */
cycles run_cycles(const floor_ops *fl, const char *uri,
                  const dlock_client_options *o, int n, int chunks,
                  int with_rtt);

/* A cycles table's rows ("| measure | floor | dlock | ratio |"), each
 * label after `mode` ("" or e.g. "table mode: "): the uncontended
 * cycle's p50 (the floor's cycle named `floor`; the ratio in bold with
 * the chunks' range, and "goal ≤ GOAL" when goal is not NULL), its p99,
 * and when rtt_us > 0 the p50s in round trips of rtt_us. */
void h_cycle_rows(const char *mode, const char *floor, const cycles *c,
                  const char *goal, double rtt_us);

/* The summaries of every timed call of a floor (fns) and of dlock (dns),
 * n each, into *fs and *ds (dlock's: the floor's when !have_dlock, its
 * store not in this build); frees both arrays. */
void h_summaries(int64_t *fns, int64_t *dns, int n, int have_dlock,
                 stats *fs, stats *ds);

/* The p99 and cycles-per-second rows of an uncontended cycle's table, the
 * floor's fs beside dlock's ds. */
void h_tail_rows(const stats *fs, const stats *ds);

/* Closes lock l and its client c, when have (they were opened). */
void h_close(int have, dlock *l, dlock_client *c);

/* One kind of timed call: op(arg). */
typedef struct kind_op {
    void (*op)(void *);
    void *arg;
} kind_op;

/*
 * n / chunks timed calls of each of the nk kinds per chunk, the kinds one
 * after the other within a chunk, on the same connections and clients
 * throughout: the machine's drift hits every kind alike, and a ratio of
 * two kinds is best taken as the median of the chunks' ratios. A chunk's
 * figure is its p50, into p50[k * chunks + chunk]; all[k] (when all is
 * not NULL) gets every time of kind k, (n / chunks) * chunks of them.
 */
void chunked_ops(const kind_op *kinds, int nk, int n, int chunks,
                 double *p50, int64_t **all);

/*
 * The Sentinel and Cluster benches: nk kinds, kind k an uncontended
 * acquire + release of lock names[k] on its own client of uris[k], n
 * cycles in `chunks` alternating chunks (chunked_ops); kind 0 is dlock on
 * the primary itself (redis://, the floor). Prints the Markdown table:
 * each kind's p50 (median over the chunks) and the median and range of
 * its chunks' ratios to the floor; what[k] names kind k (kind 1 the
 * headline, against its target of 1.1x; the others the cost of WAIT).
 * argv[1] is URI, argv[2] PRIMARY_URI (h_primary_args).
 */
void h_beside_primary(const char *const *uris, char names[][32],
                      const char *const *what, int nk, int n, int chunks);
/* Their command line, "dlock_<bench_prog> URI PRIMARY_URI [--quick]" (URI
 * named `what` in the usage message): the cycles per kind, 15000 (--quick:
 * 1500); exits 2 saying so when an URI is missing. */
int h_primary_args(int argc, char **argv, const char *what);

/* ------------------------------------------------------------------------ */
/* Hand-off between two processes                                           */
/* ------------------------------------------------------------------------ */

/* One process's side of a hand-off: open() runs after the fork and
 * returns its state; acquire() waits for the lock (dies on failure). */
typedef struct party_ops {
    void *(*open)(void *arg, int me);
    void (*acquire)(void *side);
    void (*release)(void *side);
    void (*close)(void *side, int holding);
    void *arg;
} party_ops;

typedef struct handoff_cfg {
    const party_ops *ops;
    /* the holder releases this long after the waiter began to wait (at
     * random between min and max, µs) */
    long hold_min_us, hold_max_us;
    long warm_hold_us; /* the two warm-ups' (0: as the others) */
} handoff_cfg;

/*
 * n hand-offs measured, after one warm-up in each direction and before a
 * last one (the other process exits during it): the time from the
 * holder's release call to the waiter's acquire returning; the waiter
 * asks only once the other one holds (never barges). Their times into
 * out[0..n) if out is not NULL; their p50/p99.
 */
stats handoff_run(const handoff_cfg *cfg, int n, int64_t *out);

/* The usual party: dlock on uri (lock "bench-handoff", its flags and
 * ttl_ms), acquire waiting at most wait_ms; arg of dlock_party_ops. */
typedef struct dlock_party {
    const char *uri;
    const dlock_client_options *o;
    unsigned flags;
    int64_t ttl_ms, wait_ms;
} dlock_party;

extern const party_ops dlock_party_ops; /* .arg: set a copy's */

/* n hand-offs of dlock (as handoff_run) with a 2 ms hold. */
stats handoff_dlock(const dlock_party *p, int n, int64_t *out);

/* ------------------------------------------------------------------------ */
/* Contention                                                               */
/* ------------------------------------------------------------------------ */

typedef struct contend_cfg {
    const char *uri;
    const dlock_client_options *o;
    unsigned flags;  /* the lock's ("bench-contend") */
    int nproc;
    long target;     /* stop once this many hand-offs (0: no target) */
    int cycles;      /* a process's acquisitions (0: no limit) */
    int only_open;   /* the processes only open and close */
    int wait_ms;     /* each acquire's wait */
    long hold_us;    /* the lock held this long */
    long pause_us;   /* then 0 to pause_us outside it, at random */
    int64_t limit_ms; /* every process stops after this long anyway */
} contend_cfg;

typedef struct contend contend;

/* Starts the processes one at a time (each opens its client and lock:
 * many logins at once could outlast a client's timeout) and waits until
 * all are ready; they contend from contend_go(). */
contend *contend_start(const contend_cfg *cfg);
void contend_go(contend *s);

/* Hand-offs (a change of the holding process) so far. */
long contend_handoffs(contend *s);

/* Tells the processes to stop. */
void contend_stop(contend *s);

typedef struct contend_result {
    long handoffs, acquisitions;
    double per_s;  /* hand-offs per second, from go to the end */
    int timed_out; /* a process stopped at limit_ms */
} contend_result;

/* Waits for the processes to end (target, cycles, stop or limit); the
 * end is when the target was reached, else when the last one finished. */
contend_result contend_finish(contend *s);

#endif
