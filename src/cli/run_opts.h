/* SPDX-License-Identifier: MIT */
/*
 * run_opts.h -- the options of `dlock run` and `dlock elect`
 * (cmd_run_opts.c), which cmd_run.c runs.
 */
#ifndef DLOCK_CLI_RUN_OPTS_H
#define DLOCK_CLI_RUN_OPTS_H

#include <stddef.h>
#include <stdint.h>

#define DEFAULT_TTL_MS 10000
#define DEFAULT_KILL_AFTER_MS 5000

/* Most --also options: with NAME, one set of at most this many plus one. */
#define MAX_ALSO 63

typedef struct run_opts {
    const char *store;
    const char *name;
    const char *names[MAX_ALSO + 1]; /* NAME, then each --also */
    size_t nnames;
    char **cmd;
    int64_t ttl_ms, wait_ms, kill_after_ms, warn_after_ms;
    int64_t at_least_ms, at_most_ms; /* 0: not given */
    int fair, quiet, shared, kill_after_set;
    unsigned permits;
    /* dlock elect (elect 1): --value, --again */
    int elect, again;
    const char *value;
    const char *who; /* "run" or "elect", for messages */
} run_opts;

/* Parses the command line of `dlock run` (elect 0) or `dlock elect`
 * (elect 1) into *o: -1 to go on, else the exit status (0 after --help,
 * CLI_EX_USAGE after a message). */
int cli_run_parse(int argc, char **argv, run_opts *o, int elect);

#endif
