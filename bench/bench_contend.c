/* SPDX-License-Identifier: MIT */
/*
 * bench_contend.c -- N processes contend for one lock, each holding it
 * 1 ms per turn; the same measure for dlock on every store and for the
 * peers (redis-py, node-redlock, kazoo), whose workers speak the same
 * line protocol:
 *
 *   dlock_bench_contend run --label L --n N --seconds S [--reps R]
 *       [--hold-us US] [--load CMD] -- WORKER ARGS...
 *     starts N copies of WORKER ARGS..., each with a pipe on standard
 *     input and output, and prints one tab-separated result line (see
 *     print_result()) for run.sh to tabulate and plot.
 *
 *   dlock_bench_contend worker URI NAME [fair]
 *     dlock's own worker (the public API only, one client per process).
 *   dlock_bench_contend worker-ofd FILE
 *     the file store's floor: the kernel's blocking OFD lock (fcntl
 *     F_OFD_SETLKW) on FILE, no store around it.
 *
 * The worker protocol (bench/peer_py.py and bench/redlock_peer.js speak it
 * too; every time is CLOCK_MONOTONIC in ns, which Python's
 * time.monotonic_ns() and node's process.hrtime.bigint() read as well):
 *   worker -> "ready\n" once connected, with the lock object made;
 *   driver -> "START STOP HOLD_US\n" (the same line to every worker);
 *   worker: sleeps until START; while now < STOP: T_CALL = now, a
 *     blocking acquire (its wait may last past STOP, by 10 s at most: a
 *     wait that ends empty-handed after STOP ends the worker quietly;
 *     one that fails before STOP is an error), T_ACQ = now; if
 *     T_ACQ >= STOP it releases at once and stops (a late hold); else it
 *     holds HOLD_US, T_REL = now, releases;
 *   worker -> "h T_CALL T_ACQ T_REL\n" per hold, "e T_CALL T_ACQ\n" for
 *     a late hold, "end\n", and exits 0 (or prints "error WHY\n" and
 *     exits 1).
 *
 * From the holds of all workers, sorted by T_ACQ:
 *   hand-off  T_ACQ of a hold - T_REL of the hold before it: from the
 *             release call to the next owner's acquire returning (the
 *             next owner may be the same process, when it barges in);
 *   to another  the share of hand-offs that went to another process, and
 *             the hand-off p50 of those alone;
 *   wait      T_ACQ - T_CALL of each hold, late ones too: how long a
 *             contender waited (its p99 and maximum show starvation: a
 *             contender that got nothing during the run waited from its
 *             call to its late hold);
 *   overlaps  holds that began before the previous one's release call:
 *             must be 0 for any lock;
 *   critical sections per second, and utilisation: the share of the
 *             run's time the lock was held (the floor of a lock's
 *             overhead: 1.0 would be a hand-off that takes no time);
 *   store requests per critical section, when --load CMD is given: CMD
 *             (run by sh -c before the start and after the end) prints
 *             the store's request counter; the difference, divided by
 *             every hold of the run (late holds included).
 */

#include "common.h"

#include <dlock.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

const char bench_prog[] = "dlock_bench_contend";

extern char **environ;

#define MAX_WORKERS 256
#define MAX_HOLDS 400000 /* per run, all workers */

/* ------------------------------------------------------------------------ */
/* the workers                                                              */
/* ------------------------------------------------------------------------ */

typedef struct hold {
    int64_t call, acq, rel;
    int worker;
} hold;

static void sleep_until(int64_t t)
{
    int64_t d = t - now_ns();
    if (d > 0)
        sleep_us((long)(d / 1000));
}

/* A worker's lock: dlock's, or the kernel's OFD lock on a file (the file
 * store's floor). Each returns 0 or an error message. */
typedef struct wlock {
    dlock *l;
    int fd;
} wlock;

static const char *w_acquire(wlock *w, int64_t wait_ms)
{
    if (w->l) {
        int rc = dlock_acquire(w->l, wait_ms);
        return rc == DLOCK_OK ? NULL : dlock_errmsg();
    }
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    while (fcntl(w->fd, F_OFD_SETLKW, &fl))
        if (errno != EINTR)
            return strerror(errno);
    return NULL;
}

static const char *w_release(wlock *w)
{
    if (w->l) {
        int rc = dlock_release(w->l);
        return rc == DLOCK_OK ? NULL : dlock_errmsg();
    }
    struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET};
    return fcntl(w->fd, F_OFD_SETLK, &fl) ? strerror(errno) : NULL;
}

/* The protocol's loop, once the lock is ready; the exit status. */
static int worker_loop(wlock *w)
{
    printf("ready\n");
    fflush(stdout);
    long long start, stop, hold_us;
    if (scanf("%lld %lld %lld", &start, &stop, &hold_us) != 3)
        return 1;
    size_t cap = 4096, n = 0;
    hold *h = malloc(cap * sizeof(*h));
    if (!h)
        return 1;
    int64_t late_call = 0, late_acq = 0;
    const char *err = NULL;
    sleep_until(start);
    while (now_ns() < stop) {
        int64_t call = now_ns();
        int64_t wait_ms = (stop - call) / 1000000 + 10000;
        if ((err = w_acquire(w, wait_ms))) {
            if (now_ns() >= stop)
                err = NULL; /* gave up after the end: a quiet end */
            break;
        }
        int64_t acq = now_ns();
        if (acq >= stop) {
            late_call = call;
            late_acq = acq;
            err = w_release(w);
            break;
        }
        sleep_us((long)hold_us);
        int64_t rel = now_ns();
        if ((err = w_release(w)))
            break;
        if (n == cap) {
            hold *g = realloc(h, 2 * cap * sizeof(*h));
            if (!g) {
                err = "out of memory";
                break;
            }
            h = g;
            cap *= 2;
        }
        h[n++] = (hold){call, acq, rel, 0};
    }
    if (err) {
        printf("error %s\n", err);
    } else {
        for (size_t i = 0; i < n; i++)
            printf("h %" PRId64 " %" PRId64 " %" PRId64 "\n", h[i].call,
                   h[i].acq, h[i].rel);
        if (late_acq)
            printf("e %" PRId64 " %" PRId64 "\n", late_call, late_acq);
        printf("end\n");
    }
    free(h);
    return err != NULL;
}

static int worker(const char *uri, const char *name, int fair)
{
    dlock_client *c;
    dlock_options o;
    wlock w = {NULL, -1};

    if (dlock_client_open(&c, uri, NULL) != DLOCK_OK) {
        printf("error %s\n", dlock_errmsg());
        return 1;
    }
    memset(&o, 0, sizeof(o));
    o.flags = fair ? DLOCK_FAIR : 0;
    if (dlock_open(&w.l, c, name, &o) != DLOCK_OK) {
        printf("error %s\n", dlock_errmsg());
        dlock_client_close(c);
        return 1;
    }
    int rc = worker_loop(&w);
    dlock_close(w.l);
    dlock_client_close(c);
    return rc;
}

static int worker_ofd(const char *path)
{
    wlock w = {NULL, open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644)};
    if (w.fd < 0) {
        printf("error %s: %s\n", path, strerror(errno));
        return 1;
    }
    int rc = worker_loop(&w);
    close(w.fd);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* the driver                                                               */
/* ------------------------------------------------------------------------ */

typedef struct proc {
    pid_t pid;
    int in, out; /* our ends: its standard input, its standard output */
    char buf[4096];
    size_t len;
    int ready, ended;
} proc;

typedef struct result {
    long holds, late;
    double seconds, cs_per_s, util;
    double hand_p50, hand_p99, other_share, other_p50;
    double wait_p99, wait_max;
    long overlaps;
    double load; /* requests per hold; < 0: not measured */
} result;

static int spawn(proc *p, char **argv)
{
    int in[2], out[2];
    posix_spawn_file_actions_t fa;

    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC))
        die("pipe", strerror(errno));
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    int rc = posix_spawnp(&p->pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    if (rc) {
        close(in[1]);
        close(out[0]);
        die(argv[0], strerror(rc));
    }
    p->in = in[1];
    p->out = out[0];
    p->len = 0;
    p->ready = p->ended = 0;
    return 0;
}

static void kill_all(proc *ps, int n)
{
    for (int i = 0; i < n; i++)
        if (ps[i].pid > 0)
            kill(ps[i].pid, SIGKILL);
}

/* One line a worker printed: parsed into the run's holds. */
static void take_line(proc *p, int w, const char *line, hold *hs, long *nh,
                      long *late, const char *label)
{
    long long a, b, c;

    if (!strcmp(line, "ready"))
        p->ready = 1;
    else if (!strcmp(line, "end"))
        p->ended = 1;
    else if (sscanf(line, "h %lld %lld %lld", &a, &b, &c) == 3) {
        if (*nh >= MAX_HOLDS)
            die(label, "too many holds in one run");
        hs[(*nh)++] = (hold){a, b, c, w};
    } else if (sscanf(line, "e %lld %lld", &a, &b) == 2) {
        if (*nh >= MAX_HOLDS)
            die(label, "too many holds in one run");
        hs[(*nh)++] = (hold){a, b, -1, w}; /* rel -1: a late hold */
        ++*late;
    } else {
        fprintf(stderr, "%s: %s: worker %d: %s\n", bench_prog, label, w, line);
        die(label, "a worker failed");
    }
}

/* Reads what the workers print until every one of them has printed
 * `until_ready` ? "ready" : "end", or the deadline passes. */
static int pump(proc *ps, int n, int until_ready, int64_t deadline,
                hold *hs, long *nh, long *late, const char *label)
{
    struct pollfd pf[MAX_WORKERS];

    for (;;) {
        int open = 0, waiting = 0;
        for (int i = 0; i < n; i++) {
            int done = until_ready ? ps[i].ready : ps[i].ended;
            waiting += !done;
            pf[i].fd = ps[i].out;
            pf[i].events = POLLIN;
            open += ps[i].out >= 0;
        }
        if (!waiting)
            return 0;
        int64_t left = (deadline - now_ns()) / 1000000;
        if (left <= 0 || !open)
            return -1;
        if (poll(pf, (nfds_t)n, (int)(left > 1000 ? 1000 : left)) < 0) {
            if (errno == EINTR)
                continue;
            die("poll", strerror(errno));
        }
        for (int i = 0; i < n; i++) {
            if (pf[i].fd < 0 || !(pf[i].revents & (POLLIN | POLLHUP)))
                continue;
            proc *p = &ps[i];
            ssize_t r = read(p->out, p->buf + p->len, sizeof(p->buf) - 1 - p->len);
            if (r <= 0) {
                close(p->out);
                p->out = -1;
                if (!(until_ready ? p->ready : p->ended))
                    die(label, "a worker closed its output early");
                continue;
            }
            p->len += (size_t)r;
            p->buf[p->len] = 0;
            char *s = p->buf, *nl;
            while ((nl = strchr(s, '\n'))) {
                *nl = 0;
                take_line(p, i, s, hs, nh, late, label);
                s = nl + 1;
            }
            p->len = strlen(s);
            memmove(p->buf, s, p->len + 1);
            if (p->len >= sizeof(p->buf) - 1)
                die(label, "a worker printed a line too long");
        }
    }
}

/* The store's request counter, from `sh -c CMD`; -1 without CMD. */
static double load_probe(const char *cmd)
{
    if (!cmd)
        return -1;
    FILE *f = popen(cmd, "r");
    double v = -1;
    if (!f || fscanf(f, "%lf", &v) != 1)
        v = -1;
    if (f)
        pclose(f);
    if (v < 0)
        die(cmd, "the load probe printed no number");
    return v;
}

static int cmp_acq(const void *a, const void *b)
{
    const hold *x = a, *y = b;
    return (x->acq > y->acq) - (x->acq < y->acq);
}

static double pct(int64_t *v, long n, double p)
{
    if (n <= 0)
        return 0;
    long i = (long)((double)n * p);
    return (double)v[i >= n ? n - 1 : i] / 1e3;
}

static result one_run(char **argv, int n, double seconds, long hold_us,
                      const char *load, const char *label)
{
    proc ps[MAX_WORKERS];
    hold *hs = malloc(MAX_HOLDS * sizeof(*hs));
    long nh = 0, late = 0;
    result r;

    memset(&r, 0, sizeof(r));
    if (!hs)
        die(label, "out of memory");
    for (int i = 0; i < n; i++)
        spawn(&ps[i], argv);
    if (pump(ps, n, 1, now_ns() + 120 * (int64_t)1000000000, hs, &nh, &late,
             label)) {
        kill_all(ps, n);
        die(label, "the workers were not ready within 120 s");
    }
    double l0 = load_probe(load);
    int64_t start = now_ns() + 50 * 1000000; /* every worker reads it first */
    int64_t stop = start + (int64_t)(seconds * 1e9);
    char line[96];
    int len = snprintf(line, sizeof(line), "%" PRId64 " %" PRId64 " %ld\n",
                       start, stop, hold_us);
    for (int i = 0; i < n; i++) {
        if (write(ps[i].in, line, (size_t)len) != len)
            die(label, "cannot start a worker");
        close(ps[i].in);
    }
    if (pump(ps, n, 0, stop + 40 * (int64_t)1000000000, hs, &nh, &late,
             label)) {
        kill_all(ps, n);
        die(label, "the workers did not end within 40 s of the stop");
    }
    for (int i = 0; i < n; i++) {
        int st;
        while (waitpid(ps[i].pid, &st, 0) < 0 && errno == EINTR)
            ;
        if (ps[i].out >= 0)
            close(ps[i].out);
        if (!WIFEXITED(st) || WEXITSTATUS(st))
            die(label, "a worker exited with an error");
    }
    double l1 = load_probe(load);

    /* late holds (rel -1) began at or after the stop: they sort last */
    qsort(hs, (size_t)nh, sizeof(*hs), cmp_acq);
    long nrec = nh - late;
    if (nrec < 2) { /* no hand-off in the run: a figure of its own */
        r.holds = nrec;
        r.late = late;
        r.seconds = seconds;
        r.hand_p50 = r.hand_p99 = r.other_p50 = -1;
        r.wait_p99 = r.wait_max = -1;
        r.load = load ? (l1 - l0) / (double)(nh ? nh : 1) : -1;
        free(hs);
        return r;
    }
    int64_t *hand = malloc((size_t)nh * sizeof(int64_t));
    int64_t *other = malloc((size_t)nh * sizeof(int64_t));
    int64_t *wait = malloc((size_t)nh * sizeof(int64_t));
    long nhand = 0, nother = 0;
    int64_t held = 0;
    for (long i = 0; i < nh; i++) {
        wait[i] = hs[i].acq - hs[i].call;
        if (i >= nrec)
            continue;
        held += hs[i].rel - hs[i].acq;
        if (!i)
            continue;
        int64_t d = hs[i].acq - hs[i - 1].rel;
        if (d < 0) { /* began before the previous release call */
            r.overlaps++;
            continue;
        }
        hand[nhand++] = d;
        if (hs[i].worker != hs[i - 1].worker)
            other[nother++] = d;
    }
    qsort(hand, (size_t)nhand, sizeof(int64_t), cmp64);
    qsort(other, (size_t)nother, sizeof(int64_t), cmp64);
    qsort(wait, (size_t)nh, sizeof(int64_t), cmp64);
    r.holds = nrec;
    r.late = late;
    int64_t end = hs[nrec - 1].rel > stop ? hs[nrec - 1].rel : stop;
    r.seconds = (double)(end - start) / 1e9;
    r.cs_per_s = (double)nrec / r.seconds;
    r.util = (double)held / 1e9 / r.seconds;
    r.hand_p50 = pct(hand, nhand, 0.5);
    r.hand_p99 = pct(hand, nhand, 0.99);
    r.other_share = nhand ? (double)nother / (double)nhand : 0;
    r.other_p50 = nother ? pct(other, nother, 0.5) : -1;
    r.wait_p99 = pct(wait, nh, 0.99);
    r.wait_max = (double)wait[nh - 1] / 1e3;
    r.load = load ? (l1 - l0) / (double)nh : -1;
    free(hand);
    free(other);
    free(wait);
    free(hs);
    return r;
}

static int cmp_result(const void *a, const void *b)
{
    const result *x = a, *y = b;
    return (x->hand_p50 > y->hand_p50) - (x->hand_p50 < y->hand_p50);
}

/*
 * One line, tab-separated: "contend", label, contenders, repetitions, then
 * the repetition with the median hand-off p50 (-1: fewer than two holds
 * in that run, so no hand-off): holds, critical sections
 * per second, utilisation, hand-off p50 and p99 (us), share to another
 * process, hand-off p50 to another process (us; -1: none), wait p99 and
 * maximum (us), overlaps (all repetitions), store requests per critical
 * section (-1: not measured); then the spread over the repetitions:
 * hand-off p50 min and max, critical sections per second min and max.
 */
static void print_result(const char *label, int n, result *rs, int reps)
{
    double cmin = rs[0].cs_per_s, cmax = rs[0].cs_per_s;
    long overlaps = 0;
    for (int i = 0; i < reps; i++) {
        overlaps += rs[i].overlaps;
        if (rs[i].cs_per_s < cmin)
            cmin = rs[i].cs_per_s;
        if (rs[i].cs_per_s > cmax)
            cmax = rs[i].cs_per_s;
    }
    qsort(rs, (size_t)reps, sizeof(*rs), cmp_result);
    const result *m = &rs[reps / 2];
    printf("contend\t%s\t%d\t%d\t%ld\t%.1f\t%.3f\t%.1f\t%.1f\t%.3f\t%.1f\t"
           "%.1f\t%.1f\t%ld\t%.2f\t%.1f\t%.1f\t%.1f\t%.1f\n",
           label, n, reps, m->holds, m->cs_per_s, m->util, m->hand_p50,
           m->hand_p99, m->other_share, m->other_p50, m->wait_p99, m->wait_max,
           overlaps, m->load, rs[0].hand_p50, rs[reps - 1].hand_p50, cmin,
           cmax);
    fflush(stdout);
}

static int usage(void)
{
    fprintf(stderr,
            "usage: dlock_bench_contend run --label L --n N --seconds S "
            "[--reps R] [--hold-us US] [--load CMD] -- WORKER ARGS...\n"
            "       dlock_bench_contend worker URI NAME [fair]\n"
            "       dlock_bench_contend worker-ofd FILE\n");
    return 2;
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "worker-ofd"))
        return worker_ofd(argv[2]);
    if (argc >= 4 && !strcmp(argv[1], "worker"))
        return worker(argv[2], argv[3], argc > 4 && !strcmp(argv[4], "fair"));
    if (argc < 2 || strcmp(argv[1], "run"))
        return usage();

    const char *label = NULL, *load = NULL;
    int n = 0, reps = 1, i;
    long hold_us = 1000;
    double seconds = 0;
    for (i = 2; i < argc && strcmp(argv[i], "--"); i++) {
        if (i + 1 >= argc)
            return usage();
        if (!strcmp(argv[i], "--label"))
            label = argv[++i];
        else if (!strcmp(argv[i], "--n"))
            n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds"))
            seconds = atof(argv[++i]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--hold-us"))
            hold_us = atol(argv[++i]);
        else if (!strcmp(argv[i], "--load"))
            load = argv[++i];
        else
            return usage();
    }
    if (!label || n < 1 || n > MAX_WORKERS || seconds <= 0 || reps < 1 ||
        reps > 9 || hold_us < 0 || i + 1 >= argc)
        return usage();
    signal(SIGPIPE, SIG_IGN);
    result rs[9];
    for (int k = 0; k < reps; k++)
        rs[k] = one_run(argv + i + 1, n, seconds, hold_us, load, label);
    print_result(label, n, rs, reps);
    return 0;
}
