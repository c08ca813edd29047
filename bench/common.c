/* SPDX-License-Identifier: MIT */
/*
 * common.c -- see common.h.
 */
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

int64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};

    nanosleep(&ts, NULL);
}

int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return x < y ? -1 : x > y;
}

int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

void die(const char *what, const char *why)
{
    fprintf(stderr, "%s: %s: %s\n", bench_prog, what, why);
    exit(1);
}

stats summarize(int64_t *ns, int n)
{
    stats s;
    double sum = 0;

    qsort(ns, (size_t)n, sizeof(*ns), cmp64);
    for (int i = 0; i < n; i++)
        sum += (double)ns[i];
    s.p50_us = (double)ns[n / 2] / 1000;
    s.p99_us = (double)ns[(int)(n * 0.99)] / 1000;
    s.per_s = 1e9 / (sum / n);
    return s;
}

int64_t run_command(const char *label, char *const argv[],
                    char *const envp[], int pathsearch)
{
    posix_spawn_file_actions_t to_null;
    pid_t pid;
    int st, rc;

    if (posix_spawn_file_actions_init(&to_null) != 0 ||
        posix_spawn_file_actions_addopen(&to_null, 1, "/dev/null", O_WRONLY,
                                         0) != 0 ||
        posix_spawn_file_actions_addopen(&to_null, 2, "/dev/null", O_WRONLY,
                                         0) != 0)
        die("posix_spawn_file_actions", "failed");
    int64_t t0 = now_ns();
    rc = pathsearch ? posix_spawnp(&pid, argv[0], &to_null, NULL, argv, envp)
                    : posix_spawn(&pid, argv[0], &to_null, NULL, argv, envp);
    if (rc != 0)
        die(argv[0], strerror(rc));
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            die("waitpid", strerror(errno));
    int64_t t = now_ns() - t0;
    posix_spawn_file_actions_destroy(&to_null);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        char msg[64];
        snprintf(msg, sizeof(msg), "failed (wait status %d)", st);
        die(label, msg);
    }
    return t;
}

char **env_without_store(void)
{
    size_t n = 0, o = 0;

    while (environ[n])
        n++;
    char **e = calloc(n + 1, sizeof(*e));
    if (!e)
        die("env", "out of memory");
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "DLOCK_STORE=", 12) != 0)
            e[o++] = environ[i];
    e[o] = NULL;
    return e;
}
