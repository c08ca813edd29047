/* SPDX-License-Identifier: MIT */
/*
 * main.c -- `dlock`: run a command under a distributed lock, or look at one.
 */
#include "cli.h"
#include "cmd.h"

#include <dlock.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef DLOCK_CLI_VERSION
#define DLOCK_CLI_VERSION DLOCK_VERSION_STRING
#endif

/* The commands, in the order `dlock --help` lists them. */
static const cli_cmd cli_cmds[] = {
    {"run", "run a command while holding a lock", cmd_run},
    {"elect", "run a command while this process leads an election",
     cmd_elect},
    {"leader", "show an election's leader, or watch it change", cmd_leader},
    {"status", "show who holds a lock, its lease, token and waiters",
     cmd_status},
    {"gc", "remove the state of long-unused locks (lock tables)", cmd_gc},
    {"fence", "replace a file unless a newer fencing token has written it",
     cmd_fence},
    {"doctor", "check a store's deployment for what makes locks unsafe",
     cmd_doctor},
    {"list", "list the locks of a store: holders, leases, tokens, waiters",
     cmd_list},
    {"break", "take a stuck lock away from its holders (operators)",
     cmd_break},
    {"exporter", "serve the locks of stores as Prometheus metrics",
     cmd_exporter},
    {"help", "show the help of a command", cmd_help},
};

static const char usage_head[] =
    "usage: dlock [--version] [--help] COMMAND [ARGS]\n"
    "\n"
    "Distributed locks over the stores you already run.\n"
    "\n"
    "commands:\n";

static const char usage_tail[] =
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

#define NCMDS (sizeof(cli_cmds) / sizeof(cli_cmds[0]))

const cli_cmd *cli_cmd_find(const char *name)
{
    for (size_t i = 0; i < NCMDS; i++)
        if (!strcmp(cli_cmds[i].name, name))
            return &cli_cmds[i];
    return NULL;
}

/* dlock's usage, the commands listed from the table */
static void print_usage(FILE *f)
{
    fputs(usage_head, f);
    for (size_t i = 0; i < NCMDS; i++)
        fprintf(f, "  %-10s%s\n", cli_cmds[i].name, cli_cmds[i].summary);
    fputs(usage_tail, f);
}

/* `dlock help [COMMAND]`: COMMAND's usage (its own --help), or dlock's;
 * 64 for a command that does not exist, and for `dlock help help` (help
 * has no usage of its own) */
int cmd_help(int argc, char **argv)
{
    const cli_cmd *c = argc > 1 ? cli_cmd_find(argv[1]) : NULL;

    if (c && c->fn != cmd_help) {
        char *help[] = {argv[1], "--help", NULL};
        return c->fn(2, help);
    }
    print_usage(stdout);
    return argc > 1 ? CLI_EX_USAGE : 0;
}

/* the version, and the stores this build reaches: in the library, as an
 * installed module, or missing (left out, or its module not installed).
 * Each store is asked once: for a module, that looks for its file. */
static int print_version(void)
{
    static const struct {
        int how;
        const char *label;
    } kinds[] = {{DLOCK_STORE_BUILTIN, "built in"},
                 {DLOCK_STORE_MODULE, "as modules"},
                 {DLOCK_STORE_MISSING, "missing"}};
    size_t n = 0;
    int *how;

    printf("dlock %s (library %s)\n", DLOCK_CLI_VERSION, dlock_version());
    while (dlock_store_scheme(n, NULL)) /* the library's table: finite */
        n++;
    if (!(how = calloc(n + 1, sizeof(*how)))) {
        cli_err("out of memory");
        return CLI_EX_SOFTWARE;
    }
    for (size_t i = 0; i < n; i++)
        dlock_store_scheme(i, &how[i]);
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
        int any = 0;
        for (size_t i = 0; i < n; i++) {
            if (how[i] != kinds[k].how)
                continue;
            printf("%s%s", any ? " " : "stores ", any ? "" : kinds[k].label);
            printf("%s%s", any ? "" : ": ", dlock_store_scheme(i, NULL));
            any = 1;
        }
        if (any)
            putchar('\n');
    }
    free(how);
    return 0;
}

int main(int argc, char **argv)
{
    const cli_cmd *c;

    if (argc < 2) {
        print_usage(stderr);
        return CLI_EX_USAGE;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version"))
        return print_version();
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        print_usage(stdout);
        return 0;
    }
    if (!(c = cli_cmd_find(argv[1]))) {
        cli_err("unknown command '%s' (try dlock --help)", argv[1]);
        return CLI_EX_USAGE;
    }
    return c->fn(argc - 1, argv + 1);
}
