/* SPDX-License-Identifier: MIT */
/*
 * cmd_gc.c -- `dlock gc [--store URI] [--idle DURATION]`
 */
#include "cli.h"
#include "cmd.h"

#include <dlock.h>

#include <stdio.h>
#include <string.h>

static const char gc_usage[] =
    "usage: dlock gc [--store URI] [--idle DURATION]\n"
    "\n"
    "Removes what the store keeps of locks that are free and were last\n"
    "taken at least DURATION ago (default 24h).\n"
    "Held locks are never touched; fencing tokens of a removed name start\n"
    "again above the old ones. Stores with a lock table only (sqlite://,\n"
    "postgres://, mysql://);\n"
    "the others keep nothing to collect.\n"
    "\n"
    "  --store URI      the store (default: $DLOCK_STORE, else the file store)\n"
    "  --idle DURATION  e.g. 30m, 24h (default 24h); 0 removes every free lock\n"
    "\n"
    "Prints how many locks were removed. Exit status: 0, 64 usage, 69 store\n"
    "error (or a store without anything to collect).\n";

int cmd_gc(int argc, char **argv)
{
    const char *store = NULL, *idle = NULL;
    int64_t idle_ms = 24 * 3600 * 1000LL;
    uint64_t removed = 0;
    dlock_client *c;
    int rc, r;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(gc_usage, stdout);
            return 0;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--store", &store)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--idle", &idle)) != 0) {
            if (r < 0)
                return CLI_EX_USAGE;
            continue;
        }
        cli_err("gc: unknown argument '%s'", argv[i]);
        return CLI_EX_USAGE;
    }
    if (idle && cli_parse_duration(idle, &idle_ms, 0) != 0) {
        cli_err("gc: --idle wants a duration such as 30m or 24h, at most "
                CLI_DURATION_MAX_TEXT ", not '%s'",
                idle);
        return CLI_EX_USAGE;
    }
    rc = dlock_client_open(&c, store, NULL);
    if (rc != DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        return cli_exit_for(rc);
    }
    rc = dlock_gc(c, idle_ms, &removed);
    if (rc != DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        dlock_client_close(c);
        return cli_exit_for(rc);
    }
    printf("removed %llu\n", (unsigned long long)removed);
    dlock_client_close(c);
    return 0;
}
