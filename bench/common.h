/* SPDX-License-Identifier: MIT */
/*
 * common.h -- what every benchmark program needs: the clock, sorting and
 * percentiles, a fatal error, a whole command timed as a process. Each program defines `bench_prog` (its name,
 * for messages) and links common.c.
 */
#ifndef DLOCK_BENCH_COMMON_H
#define DLOCK_BENCH_COMMON_H

#include <stdint.h>

extern const char bench_prog[];

/* CLOCK_MONOTONIC in nanoseconds. */
int64_t now_ns(void);

/* Sleeps `us` microseconds. */
void sleep_us(long us);

/* qsort() comparators: int64_t and double, ascending. */
int cmp64(const void *a, const void *b);
int cmpd(const void *a, const void *b);

/* Prints "PROG: what: why" and exits 1. */
void die(const char *what, const char *why) __attribute__((noreturn));

typedef struct stats {
    double p50_us, p99_us, per_s; /* per_s: 1 / mean */
} stats;

/* Sorts ns[0..n) (latencies in ns) and summarises them. */
stats summarize(int64_t *ns, int n);

/* Runs argv[0] (looked up on PATH when `pathsearch`, as a shell would)
 * with the environment envp and its standard output and error sent to
 * /dev/null, to its end. Returns its wall time in ns, from posix_spawn()
 * to waitpid() returning. A command that cannot start, or does not exit
 * 0, dies naming `label`. */
int64_t run_command(const char *label, char *const argv[],
                    char *const envp[], int pathsearch);

/* A copy of environ without DLOCK_STORE (the strings shared), so that a
 * command run with it takes its store from its arguments alone. */
char **env_without_store(void);

#endif
