/* SPDX-License-Identifier: MIT */
/*
 * main.c -- `dlock`: run a command under a distributed lock, or look at one.
 */
#include "cli.h"

#include <dlock.h>

#include <stdio.h>
#include <string.h>

#ifndef DLOCK_CLI_VERSION
#define DLOCK_CLI_VERSION DLOCK_VERSION_STRING
#endif

static const char usage[] =
    "usage: dlock [--version] [--help] COMMAND [ARGS]\n"
    "\n"
    "Distributed locks over the stores you already run.\n"
    "\n"
    "commands:\n"
    "  run       run a command while holding a lock\n"
    "  status    show who holds a lock, its lease, token and waiters\n"
    "  gc        remove the state of long-unused locks (lock tables)\n"
    "  list      list the locks of a store: holders, leases, tokens, waiters\n"
    "  break     take a stuck lock away from its holders (operators)\n"
    "  exporter  serve the locks of stores as Prometheus metrics\n"
    "  help      show the help of a command\n"
    "\n"
    "Store: --store URI, else $DLOCK_STORE, else lock files in\n"
    "~/.local/state/dlock (~: your home in the passwd entry, the same for\n"
    "cron, sudo, services and logins; 'dlock status NAME' shows it). URIs:\n"
    "  file:///dir   redis://[user:pass@]host[:port][/db][?prefix=P]\n"
    "  unix:///path/redis.sock\n"
    "  redlock://[user:pass@]host:port,host:port,...[?node_timeout=MS]\n"
    "  zk://host:port[,host:port...][/chroot]\n"
    "  etcd://[user:pass@]host:port[,host:port...][?prefix=P]   (etcds:// TLS)\n"
    "  sqlite:///path/to/file.db[?table=T]\n"
    "  postgres://[user:pass@]host[:port]/db[?table=T|?mode=advisory]\n"
    "  mysql://[user:pass@]host[:port]/db[?table=T]\n"
    "\n"
    "See 'dlock help COMMAND' and man dlock.\n";

/* the version, and the stores this build reaches: in the library, as an
 * installed module, or missing (left out, or its module not installed) */
static void print_version(void)
{
    static const struct {
        int how;
        const char *label;
    } kinds[] = {{DLOCK_STORE_BUILTIN, "built in"},
                 {DLOCK_STORE_MODULE, "as modules"},
                 {DLOCK_STORE_MISSING, "missing"}};
    printf("dlock %s (library %s)\n", DLOCK_CLI_VERSION, dlock_version());
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        int any = 0, how;
        const char *scheme;
        for (size_t i = 0; (scheme = dlock_store_scheme(i, &how)) != NULL;
             i++) {
            if (how != kinds[k].how)
                continue;
            printf("%s%s", any ? " " : "stores ", any ? "" : kinds[k].label);
            printf("%s%s", any ? "" : ": ", scheme);
            any = 1;
        }
        if (any)
            putchar('\n');
    }
}

int main(int argc, char **argv)
{
    const char *cmd;

    if (argc < 2) {
        fputs(usage, stderr);
        return CLI_EX_USAGE;
    }
    cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        print_version();
        return 0;
    }
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        fputs(usage, stdout);
        return 0;
    }
    if (!strcmp(cmd, "help")) {
        char *help[] = {argc > 2 ? argv[2] : "", "--help", NULL};
        if (argc > 2 && !strcmp(argv[2], "run"))
            return cmd_run(2, help);
        if (argc > 2 && !strcmp(argv[2], "status"))
            return cmd_status(2, help);
        if (argc > 2 && !strcmp(argv[2], "gc"))
            return cmd_gc(2, help);
        if (argc > 2 && !strcmp(argv[2], "list"))
            return cmd_list(2, help);
        if (argc > 2 && !strcmp(argv[2], "break"))
            return cmd_break(2, help);
        if (argc > 2 && !strcmp(argv[2], "exporter"))
            return cmd_exporter(2, help);
        fputs(usage, stdout);
        return argc > 2 ? CLI_EX_USAGE : 0;
    }
    if (!strcmp(cmd, "run"))
        return cmd_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "status"))
        return cmd_status(argc - 1, argv + 1);
    if (!strcmp(cmd, "gc"))
        return cmd_gc(argc - 1, argv + 1);
    if (!strcmp(cmd, "list"))
        return cmd_list(argc - 1, argv + 1);
    if (!strcmp(cmd, "break"))
        return cmd_break(argc - 1, argv + 1);
    if (!strcmp(cmd, "exporter"))
        return cmd_exporter(argc - 1, argv + 1);
    cli_err("unknown command '%s' (try dlock --help)", cmd);
    return CLI_EX_USAGE;
}
