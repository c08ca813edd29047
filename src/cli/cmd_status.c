/* SPDX-License-Identifier: MIT */
/*
 * cmd_status.c -- `dlock status [--store URI] [--json] NAME`
 */
#include "cli.h"
#include "cmd.h"

#include <dlock.h>

#include <stdio.h>

static const char status_usage[] =
    "usage: dlock status [--store URI] [--json] NAME\n"
    "\n"
    "Shows whether lock NAME is held, by whom and for how long, the lease\n"
    "left, the fencing token, and the waiters where the store knows them.\n"
    "\n"
    "  --store URI  the store (default: $DLOCK_STORE, else the file store)\n"
    "  --json       one JSON object on stdout\n"
    "\n"
    "Exit status: 0 when the store answered (held or free), 64 usage,\n"
    "69 store error.\n";

int cmd_status(int argc, char **argv)
{
    const char *store = NULL, *name = NULL;
    int json = 0, rc;
    dlock_client *c;
    dlock_info info;
    char d1[32];

    rc = cli_name_args(argc, argv, "status", status_usage, "", &name, &store,
                       &json);
    if (rc >= 0)
        return rc;

    rc = dlock_client_open(&c, store, NULL);
    if (rc != DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        return cli_exit_for(rc);
    }
    rc = dlock_inspect(c, name, &info);
    if (rc != DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        dlock_client_close(c);
        return cli_exit_for(rc);
    }

    if (json) {
        fputc('{', stdout);
        cli_json_name(stdout, "name", name);
        fputs(",\"store\":", stdout);
        cli_json_str(stdout, dlock_client_store(c));
        fputc(',', stdout);
        cli_json_info(stdout, &info);
        fputs("}\n", stdout);
    } else {
        fputs("lock:     ", stdout);
        cli_human_str(stdout, name);
        fputs("\nstore:    ", stdout);
        cli_term_str(stdout, dlock_client_store(c));
        fputc('\n', stdout);
        if (info.permits > 0)
            printf("state:    %lld of %lld permits taken\n",
                   (long long)info.holders, (long long)info.permits);
        else if (info.held && info.shared)
            printf("state:    held shared by %lld reader%s\n",
                   (long long)info.holders, info.holders == 1 ? "" : "s");
        else
            printf("state:    %s\n", info.held ? "held" : "free");
        if (info.held) {
            fputs("holder:   ", stdout);
            cli_human_str(stdout, info.holder);
            fputc('\n', stdout);
            if (info.held_ms >= 0) {
                cli_format_duration(info.held_ms, d1, sizeof(d1));
                printf("held for: %s\n", d1);
            }
            if (info.ttl_ms >= 0) {
                cli_format_duration(info.ttl_ms, d1, sizeof(d1));
                printf("lease:    %s left\n", d1);
            } else {
                printf("lease:    none (freed when the holder exits)\n");
            }
            printf("token:    %llu\n", (unsigned long long)info.token);
        } else {
            printf("last token: %llu\n", (unsigned long long)info.token);
        }
        if (info.waiters >= 0)
            printf("waiters:  %lld\n", (long long)info.waiters);
        if (info.foreign[0]) {
            fputs("warning:  ", stdout);
            cli_human_str(stdout, info.foreign);
            fputc('\n', stdout);
        }
        for (size_t i = 0; i < info.queue_len; i++) {
            printf("  %zu. ", i + 1);
            cli_human_str(stdout, info.queue[i]);
            fputc('\n', stdout);
        }
    }
    dlock_info_clear(&info);
    dlock_client_close(c);
    return 0;
}
