/* SPDX-License-Identifier: MIT */
/*
 * bench_cli.c -- the command-line tool on the file store, whole commands:
 * `dlock run NAME -- true` beside util-linux flock(1) and `true` alone.
 *
 *   dlock_bench_cli DLOCK FLOCK DIR [--quick]
 *
 * DLOCK and FLOCK are the programs' paths; DIR an empty directory for the
 * lock files. The default store is HOME/.local/state/dlock, HOME from the
 * passwd entry, and no variable moves it (docs/stores.md, "The default
 * store"): as root, this program runs in a mount namespace of its own in
 * which DIR/home is mounted on that home, so the default store's files
 * go to DIR/home/.local/state/dlock, on DIR's file system like the
 * --store file://DIR command's, and nothing outside the namespace sees
 * them; otherwise it uses the real home, under a lock name of its own
 * whose file it removes at the end. DLOCK_STORE is removed for every
 * command. Prints Markdown.
 *
 * One command's time is its wall time from posix_spawn() to waitpid()
 * returning, on CLOCK_MONOTONIC, in this process: no shell, no `date`
 * process, no loop overhead in the figure. The commands' output goes to
 * /dev/null. The kinds of command run in turns, in CHUNKS chunks, so that
 * the machine's drift hits them alike; the ratio to flock is the median of
 * the chunks' ratios of their means.
 *
 * A command's peak RSS is wait4()'s ru_maxrss: the largest resident set
 * of its processes (dlock, its supervisor and CMD; flock and CMD), the
 * median of RSS_RUNS runs. Started by fork(), not posix_spawn(): a child
 * that shares this process's memory until its exec counts this process's
 * resident set as its own, a forked one only its few anonymous pages.
 *
 * The issue 35 targets are printed beside the figures (TARGET_*).
 *
 * Contended: N processes start together, each running one kind of command
 * M times in a row under the same lock name; the wall time until the last
 * has finished, divided by N*M, is the time per command.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <pwd.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

const char bench_prog[] = "bench_cli";

#define CHUNKS 15
#define NAME "benchcli"
#define RSS_RUNS 7

/* issue 35: dlock run and dlock --version beside flock(1), in time, and
 * dlock run's peak RSS beside flock's */
#define TARGET_RUN 1.3
#define TARGET_VERSION 1.5
#define TARGET_RSS 2.0

typedef struct kind {
    const char *label; /* Markdown */
    char *argv[12];
    char **envp;
    int pathsearch; /* posix_spawnp: `true` found on PATH, as flock and
                       dlock find it */
    int64_t *ns;    /* every measured run */
    int n;
    double chunk_mean[CHUNKS];
} kind;


static int64_t run_once(const kind *k)
{
    return run_command(k->label, k->argv, k->envp, k->pathsearch);
}

/* The peak RSS in kB of one run of k: the largest of its processes'
 * (ru_maxrss counts the children each process waited for). */
static long peak_rss_kb(const kind *k)
{
    struct rusage ru;
    pid_t pid;
    int st;

    fflush(stdout); /* not written twice by the child */
    if ((pid = fork()) < 0)
        die("fork", strerror(errno));
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0)
            _exit(126);
        if (k->pathsearch)
            execvpe(k->argv[0], k->argv, k->envp);
        else
            execve(k->argv[0], k->argv, k->envp);
        _exit(127);
    }
    while (wait4(pid, &st, 0, &ru) < 0)
        if (errno != EINTR)
            die("wait4", strerror(errno));
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        die(k->label, "failed (peak RSS run)");
    return ru.ru_maxrss;
}

static int cmplong(const void *a, const void *b)
{
    long x = *(const long *)a, y = *(const long *)b;

    return x < y ? -1 : x > y;
}


/* As root: this process (and the commands it starts) in a mount namespace
 * of its own, with `fresh` mounted on the home directory of our passwd
 * entry, which is copied into home (cap bytes). 1 if so; 0 if not (not
 * root, no namespace, no home): the default store is then the real one. */
static int private_home(const char *fresh, char *home, size_t cap)
{
    struct passwd *pw = getpwuid(geteuid());
    char real[PATH_MAX];

    if (geteuid() != 0 || !pw || !realpath(pw->pw_dir, real) ||
        !strcmp(real, "/") || strlen(real) >= cap)
        return 0;
    if (unshare(CLONE_NEWNS) != 0 ||
        mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) != 0)
        return 0;
    if (mkdir(fresh, 0700) != 0 ||
        mount(fresh, real, "none", MS_BIND, NULL) != 0)
        die(fresh, strerror(errno));
    memcpy(home, real, strlen(real) + 1);
    return 1;
}

static double mean_ms(const int64_t *ns, int n)
{
    double s = 0;

    for (int i = 0; i < n; i++)
        s += (double)ns[i];
    return s / n / 1e6;
}

/* N processes, each running k M times; the wall time per command in ms */
static double contended(const kind *k, int nproc, int m)
{
    int gate[2];
    pid_t *pids = calloc((size_t)nproc, sizeof(*pids));

    if (!pids || pipe(gate) != 0)
        die("contended", strerror(errno));
    fflush(stdout); /* not written twice by a child's exit() */
    for (int p = 0; p < nproc; p++) {
        pids[p] = fork();
        if (pids[p] < 0)
            die("fork", strerror(errno));
        if (pids[p] == 0) {
            char c;
            close(gate[1]);
            /* the gate opens (EOF) when the parent closes its end */
            while (read(gate[0], &c, 1) < 0 && errno == EINTR)
                ;
            for (int i = 0; i < m; i++)
                run_once(k); /* exits 1 on a failure */
            _exit(0);
        }
    }
    close(gate[0]);
    int64_t t0 = now_ns();
    close(gate[1]);
    int failed = 0;
    for (int p = 0; p < nproc; p++) {
        int st;
        while (waitpid(pids[p], &st, 0) < 0)
            if (errno != EINTR)
                die("waitpid", strerror(errno));
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            failed = 1;
    }
    int64_t t = now_ns() - t0;
    free(pids);
    if (failed)
        die(k->label, "failed under contention");
    return (double)t / (double)(nproc * m) / 1e6;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: dlock_bench_cli DLOCK FLOCK DIR [--quick]\n");
        return 2;
    }
    char *dlock = argv[1], *flock = argv[2], *dir = argv[3];
    int quick = argc > 4 && !strcmp(argv[4], "--quick");
    int per_chunk = quick ? 4 : 10;
    char uri[4200], lockfile[4200], fresh[4200], home[PATH_MAX];
    char defname[64], deflabel[200];

    snprintf(uri, sizeof(uri), "file://%s", dir);
    snprintf(lockfile, sizeof(lockfile), "%s/%s.flock", dir, NAME);
    snprintf(fresh, sizeof(fresh), "%s/home", dir);
    signal(SIGPIPE, SIG_IGN);

    /* the default store in a fresh home on DIR's file system, or in the
     * real one under a name of its own */
    int own_home = private_home(fresh, home, sizeof(home));
    if (own_home) {
        snprintf(defname, sizeof(defname), "%s", NAME);
        snprintf(deflabel, sizeof(deflabel),
                 "`dlock run NAME true` (default store, "
                 "`~/.local/state/dlock`)");
    } else {
        snprintf(defname, sizeof(defname), "%s-default-%ld", NAME,
                 (long)getpid());
        snprintf(deflabel, sizeof(deflabel),
                 "`dlock run NAME true` (default store, "
                 "`~/.local/state/dlock` in the real home: not root)");
    }

    char **env = env_without_store();
    /* the order of the table; FLOCK first: the ratios' base (FLOCK_VERSION
     * for `dlock --version`: start-up against start-up) */
    enum { K_FLOCK, K_DLOCK, K_DEFAULT, K_FLOCK_VERSION, K_VERSION, K_TRUE,
           NK };
    kind ks[NK] = {
        [K_FLOCK] = {"`flock DIR/NAME.flock true`",
                     {flock, lockfile, "true", NULL}, env, 0, NULL, 0, {0}},
        [K_DLOCK] = {"`dlock run --store file://DIR NAME true`",
                     {dlock, "run", "--store", uri, NAME, "--", "true", NULL},
                     env, 0, NULL, 0, {0}},
        [K_DEFAULT] = {deflabel, {dlock, "run", defname, "--", "true", NULL},
                       env, 0, NULL, 0, {0}},
        [K_FLOCK_VERSION] = {"`flock --version` (start-up and exit)",
                             {flock, "--version", NULL}, env, 0, NULL, 0,
                             {0}},
        [K_VERSION] = {"`dlock --version` (start-up, the stores it reaches, "
                       "exit; ratio to `flock --version`)",
                       {dlock, "--version", NULL}, env, 0, NULL, 0, {0}},
        [K_TRUE] = {"`true` alone (process start floor)",
                    {"true", NULL}, env, 1, NULL, 0, {0}},
    };
    int total = CHUNKS * per_chunk;

    for (int i = 0; i < NK; i++) {
        ks[i].ns = malloc(sizeof(int64_t) * (size_t)total);
        if (!ks[i].ns)
            die("malloc", "out of memory");
        for (int w = 0; w < 3; w++) /* warm-up: page cache, lock files */
            run_once(&ks[i]);
    }
    for (int c = 0; c < CHUNKS; c++)
        for (int i = 0; i < NK; i++) {
            kind *k = &ks[(i + c) % NK]; /* a different first one each time */
            int64_t *start = k->ns + k->n;
            for (int r = 0; r < per_chunk; r++)
                k->ns[k->n++] = run_once(k);
            k->chunk_mean[c] = mean_ms(start, per_chunk);
        }

    /* peak RSS: the kinds in turns again, RSS_RUNS times; the median */
    long rss[NK][RSS_RUNS], rss_kb[NK];
    for (int r = 0; r < RSS_RUNS; r++)
        for (int i = 0; i < NK; i++)
            rss[i][r] = peak_rss_kb(&ks[i]);
    for (int i = 0; i < NK; i++) {
        qsort(rss[i], RSS_RUNS, sizeof(long), cmplong);
        rss_kb[i] = rss[i][RSS_RUNS / 2];
    }

    printf("\n### The CLI: one whole command under a file lock\n\n");
    printf("Wall time of one whole command, in ms, from `posix_spawn()` to "
           "`waitpid()` returning, timed by a C loop on CLOCK_MONOTONIC: "
           "process start, lock, run `true`, unlock, exit. %d runs of each, "
           "in %d chunks in which every command takes its turn; the ratio is "
           "the median of the chunks' ratios of the means (with their "
           "range). Peak RSS: the largest resident set of the command's "
           "processes (`wait4()`'s `ru_maxrss`), the median of %d runs.\n\n",
           total, CHUNKS, RSS_RUNS);
    printf("| command | mean | p50 | p99 | above `true` | ratio to flock "
           "| peak RSS (kB) |\n|---|---|---|---|---|---|---|\n");
    double true_mean = mean_ms(ks[K_TRUE].ns, total), ratio[NK][3];
    for (int i = 0; i < NK; i++) {
        kind *k = &ks[i];
        double mean = mean_ms(k->ns, total), rv[CHUNKS];
        qsort(k->ns, (size_t)total, sizeof(int64_t), cmp64);
        printf("| %s | %.2f | %.2f | %.2f | ", k->label, mean,
               (double)k->ns[total / 2] / 1e6,
               (double)k->ns[(int)(total * 0.99)] / 1e6);
        if (i == K_TRUE)
            printf("| | %ld |\n", rss_kb[i]);
        else
            printf("%.2f | ", mean - true_mean);
        if (i == K_FLOCK || i == K_FLOCK_VERSION) {
            printf("1.00x | %ld |\n", rss_kb[i]);
        } else if (i != K_TRUE) {
            int base = i == K_VERSION ? K_FLOCK_VERSION : K_FLOCK;
            int bold = i == K_DLOCK || i == K_VERSION;
            for (int c = 0; c < CHUNKS; c++)
                rv[c] = k->chunk_mean[c] / ks[base].chunk_mean[c];
            qsort(rv, CHUNKS, sizeof(double), cmpd);
            ratio[i][0] = rv[CHUNKS / 2];
            ratio[i][1] = rv[0];
            ratio[i][2] = rv[CHUNKS - 1];
            printf("%s%.2fx%s (%.2f–%.2f) | %ld |\n", bold ? "**" : "",
                   rv[CHUNKS / 2], bold ? "**" : "", rv[0], rv[CHUNKS - 1],
                   rss_kb[i]);
        }
    }

    /* the targets, beside this run's figures */
    double rss_ratio = (double)rss_kb[K_DLOCK] / (double)rss_kb[K_FLOCK];
    printf("\n### The CLI's targets: start-up and memory beside flock\n\n");
    printf("Issue 35's targets, against flock(1) in this run (the ratios of "
           "the table above).\n\n");
    printf("| figure | this run | target | |\n|---|---|---|---|\n");
    printf("| start-up: `dlock run --store file://DIR NAME true` ÷ `flock "
           "DIR/NAME.flock true` | **%.2fx** (%.2f–%.2f) | ≤ %.1fx | %s |\n",
           ratio[K_DLOCK][0], ratio[K_DLOCK][1], ratio[K_DLOCK][2],
           TARGET_RUN, ratio[K_DLOCK][0] <= TARGET_RUN ? "met" : "over");
    printf("| `dlock --version` ÷ `flock --version` | **%.2fx** (%.2f–%.2f) "
           "| ≤ %.1fx | %s |\n",
           ratio[K_VERSION][0], ratio[K_VERSION][1], ratio[K_VERSION][2],
           TARGET_VERSION,
           ratio[K_VERSION][0] <= TARGET_VERSION ? "met" : "over");
    printf("| peak RSS: `dlock run --store file://DIR NAME true` ÷ `flock "
           "DIR/NAME.flock true` | **%.2fx** (%ld ÷ %ld kB) | ≤ %.1fx | %s "
           "|\n",
           rss_ratio, rss_kb[K_DLOCK], rss_kb[K_FLOCK], TARGET_RSS,
           rss_ratio <= TARGET_RSS ? "met" : "over");

    /* contended: the same lock name for every process */
    int np[] = {2, 8};
    int cmds = quick ? 40 : 120; /* commands per run, all processes */
    printf("\n### The CLI under contention: one file lock, N processes\n\n");
    printf("N processes start together; each runs the command %d/N times "
           "in a row, all under the same lock name. Wall time until the "
           "last has finished, divided by the %d commands, in ms: median "
           "of three runs (the three in brackets); the ratio is the median "
           "of the three runs' ratios. `true` alone takes no lock: what the "
           "cores give when nothing waits.\n\n",
           cmds, cmds);
    printf("| processes | `true` alone | flock | dlock run --store file:// "
           "| ratio to flock |\n|---|---|---|---|---|\n");
    for (int j = 0; j < 2; j++) {
        double t[3], f[3], d[3], r[3];
        int m = cmds / np[j];
        for (int rep = 0; rep < 3; rep++) {
            t[rep] = contended(&ks[K_TRUE], np[j], m);
            f[rep] = contended(&ks[K_FLOCK], np[j], m);
            d[rep] = contended(&ks[K_DLOCK], np[j], m);
            r[rep] = d[rep] / f[rep];
        }
        qsort(t, 3, sizeof(double), cmpd);
        qsort(f, 3, sizeof(double), cmpd);
        qsort(d, 3, sizeof(double), cmpd);
        qsort(r, 3, sizeof(double), cmpd);
        printf("| %d | %.2f (%.2f–%.2f) | %.2f (%.2f–%.2f) | %.2f "
               "(%.2f–%.2f) | **%.2fx** (%.2f–%.2f) |\n",
               np[j], t[1], t[0], t[2], f[1], f[0], f[2], d[1], d[0], d[2],
               r[1], r[0], r[2]);
    }
    if (!own_home) {
        /* the real default store: our name's file (nobody else uses the
         * name; lock files are never deleted by dlock itself) */
        struct passwd *pw = getpwuid(geteuid());
        char real[PATH_MAX], f[PATH_MAX + 128];
        if (pw && realpath(pw->pw_dir, real)) {
            snprintf(f, sizeof(f), "%s/.local/state/dlock/%s.lock",
                     strcmp(real, "/") ? real : "", defname);
            unlink(f);
        }
    }
    return 0;
}
