/* SPDX-License-Identifier: MIT */
/*
 * cmd_break.c -- `dlock break [--store URI] [--json] NAME`: an operator
 * takes a stuck lock away from its holders (dlock_break()).
 *
 * It prints whom it evicted, because breaking a lock whose holder is alive
 * and writes to a resource that does not check fencing tokens can give two
 * writers (docs/design.md, "Operating"): the operator must be able to tell
 * which process to look at. The evicted holders learn it at their next
 * renewal or release; the next holder's token is above theirs.
 */
#include "cli.h"
#include "cmd.h"

#include <dlock.h>

#include <stdio.h>

static const char break_usage[] =
    "usage: dlock break [--store URI] [--json] NAME\n"
    "\n"
    "Breaks lock NAME: removes every hold of it (the exclusive holder, all\n"
    "read holds, all permits) and wakes its waiters as a release would. The\n"
    "evicted holders learn it at their next renewal or release (DLOCK_ELOST;\n"
    "'dlock run' then stops its command and exits 76). The fencing counter\n"
    "is kept: the next holder's token is greater than the evicted ones, so\n"
    "a resource that checks tokens refuses the evicted holders' late\n"
    "writes. One that does not may see two writers: break only a holder you\n"
    "know is stuck. Not every store can (file:// cannot: its locks are the\n"
    "holders' own kernel locks).\n"
    "\n"
    "  --store URI  the store (default: $DLOCK_STORE, else the file store)\n"
    "  --json       one JSON object on stdout: name, store, broken (true or\n"
    "               false) and before (the lock as 'dlock status --json'\n"
    "               describes it, just before the break)\n"
    "\n"
    "Exit status: 0 broken, 1 nobody held it (nothing was done), 64 usage,\n"
    "69 store error or a store that cannot break locks.\n";

static void print_human(dlock_client *c, const char *name,
                        const dlock_info *in)
{
    char d[32];

    fputs("broke:    ", stdout);
    cli_human_str(stdout, name);
    fputs("\nstore:    ", stdout);
    cli_term_str(stdout, dlock_client_store(c));
    fputc('\n', stdout);
    if (in->permits > 0)
        printf("evicted:  %lld of %lld permits", (long long)in->holders,
               (long long)in->permits);
    else if (in->shared)
        printf("evicted:  %lld read hold%s", (long long)in->holders,
               in->holders == 1 ? "" : "s");
    else
        printf("evicted:  the exclusive hold");
    printf(", token %llu\n", (unsigned long long)in->token);
    if (in->holder[0]) {
        fputs("holder:   ", stdout);
        cli_human_str(stdout, in->holder);
        if (in->holders > 1)
            printf(" (one of %lld)", (long long)in->holders);
        fputc('\n', stdout);
    }
    if (in->held_ms >= 0) {
        cli_format_duration(in->held_ms, d, sizeof(d));
        printf("held for: %s\n", d);
    }
    if (in->ttl_ms >= 0) {
        cli_format_duration(in->ttl_ms, d, sizeof(d));
        printf("lease:    %s was left\n", d);
    }
    if (in->waiters > 0)
        printf("waiters:  %lld, woken as by a release\n",
               (long long)in->waiters);
    printf("The next holder's token will be greater than %llu: a resource "
           "that checks\nfencing tokens refuses the evicted holder's late "
           "writes.\n",
           (unsigned long long)in->token);
}

static void print_json(dlock_client *c, const char *name, int broken,
                       const dlock_info *in)
{
    fputc('{', stdout);
    cli_json_name(stdout, "name", name);
    fputs(",\"store\":", stdout);
    cli_json_str(stdout, dlock_client_store(c));
    printf(",\"broken\":%s,\"before\":{", broken ? "true" : "false");
    cli_json_info(stdout, in);
    fputs("}}\n", stdout);
}

int cmd_break(int argc, char **argv)
{
    const char *store = NULL, *name = NULL;
    int json = 0, rc, ex;
    dlock_client *c;
    dlock_info info;

    ex = cli_name_args(argc, argv, "break", break_usage,
                       " (try dlock help break)", &name, &store, &json);
    if (ex >= 0)
        return ex;

    rc = dlock_client_open(&c, store, NULL);
    if (rc != DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        return cli_exit_for(rc);
    }
    rc = dlock_break(c, name, &info);
    if (rc == DLOCK_OK) {
        if (json)
            print_json(c, name, 1, &info);
        else
            print_human(c, name, &info);
        ex = 0;
    } else if (rc == DLOCK_ENOTHELD) {
        /* nothing was done; the store still described the free lock */
        if (json)
            print_json(c, name, 0, &info);
        cli_err("%s", dlock_errmsg());
        ex = CLI_EX_NOTHELD;
    } else {
        cli_err("%s", dlock_errmsg());
        ex = cli_exit_for(rc);
    }
    if (rc == DLOCK_OK || rc == DLOCK_ENOTHELD)
        dlock_info_clear(&info);
    dlock_client_close(c);
    return ex;
}
