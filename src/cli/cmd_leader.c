/* SPDX-License-Identifier: MIT */
/*
 * cmd_leader.c -- `dlock leader [--store URI] [--watch] [--json] NAME`:
 * the leader of election NAME (dlock_leader_get()), or with --watch a
 * line for it and for every change (dlock_observe(): woken by the store,
 * never reading on a timer) until SIGINT, SIGTERM or SIGHUP.
 */
#include "cli.h"
#include "cmd.h"

#include <dlock.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

static const char leader_usage[] =
    "usage: dlock leader [--store URI] [--watch] [--json] NAME\n"
    "\n"
    "Shows the leader of election NAME (see dlock elect): its value, its\n"
    "term (a fencing token: terms only grow) and its lease left.\n"
    "\n"
    "  --store URI  the store (default: $DLOCK_STORE, else the file store)\n"
    "  --watch      one line now and one for every change (a new leader,\n"
    "               a new value, no leader, an error reaching the store),\n"
    "               as the store tells of it, until interrupted\n"
    "  --json       one JSON object per line\n"
    "\n"
    "Exit status: 0 a leader leads (--watch: interrupted), 1 none leads,\n"
    "64 usage, 69 store error (--watch: the store cannot be observed).\n";

static void print_leader(const char *name, const dlock_leader *ld, int json)
{
    char d[32];

    if (json) {
        fputc('{', stdout);
        cli_json_name(stdout, "name", name);
        printf(",\"leader\":%s", ld->present ? "true" : "false");
        if (ld->present) {
            fputs(",\"value\":", stdout);
            cli_json_str(stdout, ld->value);
            printf(",\"term\":%llu", (unsigned long long)ld->term);
            if (ld->ttl_ms >= 0)
                printf(",\"lease_ms\":%lld", (long long)ld->ttl_ms);
        }
        if (ld->error || ld->why[0]) {
            fputs(",\"error\":", stdout);
            cli_json_str(stdout, ld->why);
        }
        fputs("}\n", stdout);
    } else if (ld->error) {
        fputs("error: ", stdout);
        cli_human_str(stdout, ld->why);
        fputc('\n', stdout);
    } else if (ld->present) {
        printf("leader term %llu: ", (unsigned long long)ld->term);
        cli_human_str(stdout, ld->value);
        if (ld->ttl_ms >= 0) {
            cli_format_duration(ld->ttl_ms, d, sizeof(d));
            printf(" (lease %s left)", d);
        }
        fputc('\n', stdout);
    } else {
        fputs("no leader", stdout);
        if (ld->why[0]) {
            fputs(": ", stdout);
            cli_human_str(stdout, ld->why);
        }
        fputc('\n', stdout);
    }
    fflush(stdout);
}

/* --watch: every state the observer reports, until a signal. */
static int watch(dlock_client *c, const char *name, int json)
{
    dlock_observer *o = NULL;
    dlock_leader ld;
    sigset_t mask, old;
    int rc, sfd;

    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    sigprocmask(SIG_BLOCK, &mask, &old);
    sfd = signalfd(-1, &mask, SFD_CLOEXEC);
    if (sfd < 0) {
        cli_err("signalfd: %s", strerror(errno));
        sigprocmask(SIG_SETMASK, &old, NULL);
        return CLI_EX_SOFTWARE;
    }
    rc = dlock_observe(c, name, NULL, NULL, &o);
    if (rc != DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        close(sfd);
        sigprocmask(SIG_SETMASK, &old, NULL);
        return cli_exit_for(rc);
    }
    for (;;) {
        struct pollfd p[2] = {{dlock_observer_fd(o), POLLIN, 0},
                              {sfd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            break;
        if (p[1].revents) {
            /* taken, so that restoring the mask does not deliver it */
            struct signalfd_siginfo si;
            (void)!read(sfd, &si, sizeof(si));
            break;
        }
        if (p[0].revents && dlock_observer_read(o, &ld) == DLOCK_OK)
            print_leader(name, &ld, json);
    }
    dlock_observer_close(o);
    close(sfd);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return 0;
}

int cmd_leader(int argc, char **argv)
{
    const char *store = NULL, *name = NULL;
    int json = 0, watching = 0, rc, n = 0;
    dlock_client *c;
    dlock_leader ld;
    char **args = calloc((size_t)argc + 1, sizeof(*args));

    if (!args) {
        cli_err("out of memory");
        return CLI_EX_SOFTWARE;
    }
    /* --watch is ours; the rest as every one-name command's */
    for (int i = 0; i < argc; i++) {
        if (i > 0 && !strcmp(argv[i], "--watch"))
            watching = 1;
        else
            args[n++] = argv[i];
        if (!strcmp(argv[i], "--"))
            for (i++; i < argc; i++)
                args[n++] = argv[i];
    }
    rc = cli_name_args(n, args, "leader", leader_usage, "", &name, &store,
                       &json);
    free(args);
    if (rc >= 0)
        return rc;

    rc = dlock_client_open(&c, store, NULL);
    if (rc != DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        return cli_exit_for(rc);
    }
    if (watching) {
        rc = watch(c, name, json);
        dlock_client_close(c);
        return rc;
    }
    rc = dlock_leader_get(c, name, &ld);
    if (rc != DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        dlock_client_close(c);
        return cli_exit_for(rc);
    }
    print_leader(name, &ld, json);
    dlock_client_close(c);
    return ld.present ? 0 : 1;
}
