/* SPDX-License-Identifier: MIT */
/*
 * cmd_doctor.c -- `dlock doctor [--store URI] [--ttl DUR] [--json]`:
 * what makes locks unsafe or slow on a deployment (dlock_client_check()).
 */
#include "cli.h"
#include "cmd.h"

#include <dlock.h>

#include <stdio.h>
#include <string.h>

static const char doctor_usage[] =
    "usage: dlock doctor [--store URI] [--ttl DUR] [--json]\n"
    "\n"
    "Checks the deployment under a store for what makes locks unsafe or\n"
    "slow, and says why and what to change: the store's round trip against\n"
    "the lease, the clock offset between this host and the store, and what\n"
    "the store tells of itself (Redis: persistence, Sentinel without\n"
    "min_replicas, a password without TLS; the file store: NFS, overlayfs).\n"
    "Takes no lock. docs/locks.md, \"Checking a deployment\".\n"
    "\n"
    "  --store URI   the store (default: $DLOCK_STORE, else the file store)\n"
    "  --ttl DUR     the lease your locks use (default 10s, dlock run's)\n"
    "  --json        one JSON object\n"
    "\n"
    "Exit status: 0 nothing found, 1 something found, 64 usage, 69 store\n"
    "error.\n";

static void print_json(const char *store, const dlock_check *r)
{
    printf("{");
    cli_json_name(stdout, "store", store);
    printf(",\"round_trip_us\":%lld,\"clock_offset_ms\":",
           (long long)r->round_trip_us);
    if (r->clock_offset_ms == INT64_MIN)
        printf("null");
    else
        printf("%lld", (long long)r->clock_offset_ms);
    printf(",\"findings\":[");
    for (size_t i = 0; i < r->n; i++) {
        printf("%s{", i ? "," : "");
        cli_json_name(stdout, "check", r->findings[i].check);
        printf(",");
        cli_json_name(stdout, "what", r->findings[i].what);
        printf(",");
        cli_json_name(stdout, "fix", r->findings[i].fix);
        printf("}");
    }
    printf("],");
    cli_json_name(stdout, "not_checked", r->notes);
    printf("}\n");
}

static void print_text(const char *store, const dlock_check *r)
{
    printf("store:        ");
    cli_human_str(stdout, store);
    printf("\nround trip:   %lld us\n", (long long)r->round_trip_us);
    if (r->clock_offset_ms == INT64_MIN)
        printf("clock offset: unknown\n");
    else
        printf("clock offset: %+lld ms (the store's clock less this "
               "host's)\n",
               (long long)r->clock_offset_ms);
    if (r->n == 0)
        printf("found:        nothing\n");
    for (size_t i = 0; i < r->n; i++) {
        printf("\n%s:\n  ", r->findings[i].check);
        cli_human_str(stdout, r->findings[i].what);
        printf("\n  fix: ");
        cli_human_str(stdout, r->findings[i].fix);
        printf("\n");
    }
    if (r->notes[0]) {
        printf("\nnot checked:  ");
        cli_human_str(stdout, r->notes);
        printf("\n");
    }
}

int cmd_doctor(int argc, char **argv)
{
    const char *store = NULL, *ttl = NULL;
    int64_t ttl_ms = 0;
    int json = 0, rc, r;
    dlock_client *c = NULL;
    dlock_check out;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(doctor_usage, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json")) {
            json = 1;
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--store", &store)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--ttl", &ttl)) != 0) {
            if (r < 0)
                return CLI_EX_USAGE;
            continue;
        }
        cli_err("doctor: unknown argument '%s' (see dlock help doctor)",
                argv[i]);
        return CLI_EX_USAGE;
    }
    if (ttl && (cli_parse_duration(ttl, &ttl_ms, 0) != 0 || ttl_ms <= 0)) {
        cli_err("doctor: --ttl must be a positive duration like 10s, at "
                "most " CLI_DURATION_MAX_TEXT ", not '%s'",
                ttl);
        return CLI_EX_USAGE;
    }
    rc = dlock_client_open(&c, store, NULL);
    if (rc == DLOCK_OK)
        rc = dlock_client_check(c, ttl_ms, &out);
    if (rc != DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        dlock_client_close(c);
        return cli_exit_for(rc);
    }
    if (json)
        print_json(dlock_client_store(c), &out);
    else
        print_text(dlock_client_store(c), &out);
    r = out.n > 0 ? 1 : 0;
    dlock_check_clear(&out);
    dlock_client_close(c);
    return r;
}
