/* SPDX-License-Identifier: MIT */
/*
 * cmd_run_opts.c -- the usage and the command line of `dlock run` and
 * `dlock elect` (run_opts.h).
 */
#include "cli.h"
#include "run_opts.h"

#include <dlock.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char run_usage[] =
    "usage: dlock run [options] NAME [--] CMD [ARG...]\n"
    "\n"
    "Runs CMD while holding lock NAME; the lease is renewed while CMD runs,\n"
    "and the lock released when it exits. CMD sees DLOCK_NAME and\n"
    "DLOCK_TOKEN (the fencing token) in its environment, DLOCK_STORE\n"
    "without its password, and not DLOCK_PASSWORD (nor REDISCLI_AUTH,\n"
    "PGPASSWORD, MYSQL_PWD for a store of that kind). With --also, it\n"
    "sees DLOCK_TOKENS too: the tokens of NAME and of each --also lock,\n"
    "in the command line's order, separated by spaces.\n"
    "\n"
    "  --store URI        the store (default: $DLOCK_STORE, else lock files\n"
    "                     in ~/.local/state/dlock, ~ being your home in the\n"
    "                     passwd entry whatever $HOME says)\n"
    "  --wait DUR         give up after DUR (default: forever; 0: one try)\n"
    "  --ttl DUR          lease length (default 10s; renewed every DUR/3,\n"
    "                     or more often to fit --kill-after)\n"
    "  --fair             first come, first served\n"
    "  --shared           a shared (read) hold: other --shared runs of NAME\n"
    "                     run alongside; a plain run waits for them all\n"
    "  --permits N        NAME is a semaphore of N permits: at most N runs\n"
    "                     at once (every run of NAME must say the same N)\n"
    "  --also NAME2       hold lock NAME2 too (repeatable): all of them or\n"
    "                     none, taken in name order so that runs naming\n"
    "                     the same locks cannot deadlock; losing any one\n"
    "                     stops CMD as losing NAME does\n"
    "  --kill-after DUR   when the lock is at risk or lost, SIGKILL CMD this\n"
    "                     long after SIGTERM; the SIGKILL lands before the\n"
    "                     lease ends (default: 5s, or what fits in --ttl)\n"
    "  --warn-after DUR   say on stderr, once, when the lock has been held\n"
    "                     for DUR (CMD keeps running)\n"
    "  --at-least DUR     keep the lock taken until DUR after it was taken,\n"
    "                     even when CMD ends sooner or this host dies (the\n"
    "                     store's lease holds it; no process stays behind):\n"
    "                     a job that cron fires on many hosts runs once\n"
    "                     (stores with leases only; docs/locks.md)\n"
    "  --at-most DUR      stop CMD DUR after the lock was taken, as for a\n"
    "                     lost lock (SIGTERM, SIGKILL after --kill-after),\n"
    "                     and exit 124\n"
    "  --quiet            no progress line while waiting\n"
    "\n"
    "DUR: 500ms, 30s, 2m, 1h, 7d, 1.5s; a bare number is seconds; at\n"
    "most 365d.\n"
    "\n"
    "Every process CMD starts (children, grandchildren, setsid ones) is\n"
    "stopped with it: when the lock is at risk (renewals fail), when it is\n"
    "lost, when dlock dies (SIGKILL), and when CMD exits leaving some\n"
    "behind (SIGTERM, then SIGKILL after --kill-after); the lock is\n"
    "released once they are all gone.\n"
    "\n"
    "Exit status: CMD's own, or 128+N if it died of signal N;\n"
    "  64 usage, 69 store error, 70 internal error, 75 not acquired within\n"
    "  --wait, 76 lock lost while CMD ran (CMD was terminated), 124 CMD\n"
    "  stopped at --at-most, 126/127 CMD could not be run.\n";

static const char elect_usage[] =
    "usage: dlock elect [options] NAME [--] CMD [ARG...]\n"
    "\n"
    "Campaigns for leadership of election NAME and runs CMD while this\n"
    "process leads: the leader is the holder of lock NAME, its value is\n"
    "--value, its term the lock's fencing token (DLOCK_TOKEN in CMD's\n"
    "environment; terms only grow). The lease and the stop rules are those\n"
    "of dlock run: CMD is stopped before another can lead. When CMD exits,\n"
    "dlock resigns and exits with CMD's status.\n"
    "\n"
    "  --value V          the leader's value, which `dlock leader` shows\n"
    "                     (1 to 127 printable bytes; default: this host,\n"
    "                     pid and thread)\n"
    "  --again            after losing the leadership (CMD stopped), campaign\n"
    "                     again and run CMD again when elected\n"
    "  --store URI, --wait DUR, --ttl DUR, --fair, --kill-after DUR,\n"
    "  --warn-after DUR, --at-most DUR, --quiet: as for dlock run\n"
    "\n"
    "Exit status: CMD's own, or 128+N if it died of signal N;\n"
    "  64 usage, 69 store error, 70 internal error, 75 not elected within\n"
    "  --wait, 76 leadership lost while CMD ran (CMD was terminated; not\n"
    "  with --again), 124 CMD stopped at --at-most, 126/127 CMD could not\n"
    "  be run.\n";

/* A message about the command line, "run: ..." or "elect: ...". */
static void opt_err(const run_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void opt_err(const run_opts *o, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    cli_err("%s: %s", o->who, buf);
}


/* --at-least's or --at-most's value (r: cli_opt_value()'s answer) into
 * *ms: 0, or -1 after a message. */
static int sched_duration(const run_opts *o, int r, const char *v,
                          const char *opt, int64_t *ms)
{
    if (r > 0 && cli_parse_duration(v, ms, 0) == 0 && *ms > 0)
        return 0;
    if (r > 0)
        opt_err(o, "%s must be a positive duration like 1m or 30s, at "
                "most " CLI_DURATION_MAX_TEXT ", not '%s'",
                opt, v);
    return -1;
}

int cli_run_parse(int argc, char **argv, run_opts *o, int elect)
{
    int i, r;

    const char *usage = elect ? elect_usage : run_usage;

    memset(o, 0, sizeof(*o));
    o->elect = elect;
    o->who = elect ? "elect" : "run";
    o->ttl_ms = DEFAULT_TTL_MS;
    o->wait_ms = -1;
    o->kill_after_ms = DEFAULT_KILL_AFTER_MS;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--fair")) {
            o->fair = 1;
            continue;
        }
        if (elect && !strcmp(a, "--again")) {
            o->again = 1;
            continue;
        }
        if (elect &&
            (r = cli_opt_value(argc, argv, &i, "--value", &v)) != 0) {
            if (r < 0)
                return CLI_EX_USAGE;
            size_t n = strlen(v);
            int bad = n == 0 || n > DLOCK_VALUE_MAX;
            for (size_t k = 0; k < n && !bad; k++)
                bad = (unsigned char)v[k] < 0x20 || v[k] == 0x7f;
            if (bad) {
                opt_err(o, "--value must be 1 to %d printable bytes, "
                        "without control characters",
                        DLOCK_VALUE_MAX);
                return CLI_EX_USAGE;
            }
            o->value = v;
            continue;
        }
        if (elect && (!strcmp(a, "--shared") || !strcmp(a, "--also") ||
                      !strcmp(a, "--permits") ||
                      !strcmp(a, "--at-least"))) {
            opt_err(o, "%s is not for an election (one leader, whose "
                    "hold ends with it)", a);
            return CLI_EX_USAGE;
        }
        if (!strcmp(a, "--shared")) {
            o->shared = 1;
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--permits", &v)) != 0) {
            char *end = NULL;
            unsigned long n = r > 0 ? strtoul(v, &end, 10) : 0;
            if (r < 0 || !end || *end || v[0] < '1' || v[0] > '9' ||
                n > DLOCK_PERMITS_MAX) {
                if (r > 0)
                    opt_err(o, "--permits must be a whole number from 1 "
                            "to %d, not '%s'",
                            DLOCK_PERMITS_MAX, v);
                return CLI_EX_USAGE;
            }
            o->permits = (unsigned)n;
            continue;
        }
        if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
            o->quiet = 1;
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--store", &v)) != 0) {
            if (r < 0)
                return CLI_EX_USAGE;
            o->store = v;
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--also", &v)) != 0) {
            if (r < 0)
                return CLI_EX_USAGE;
            if (o->nnames >= MAX_ALSO) {
                opt_err(o, "at most %d --also locks", MAX_ALSO);
                return CLI_EX_USAGE;
            }
            o->names[1 + o->nnames++] = v; /* nnames: the --also count */
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--ttl", &v)) != 0) {
            int pr = r < 0 ? 0 : cli_parse_duration(v, &o->ttl_ms, 0);
            if (pr == -2) {
                opt_err(o, "--ttl must be at most " CLI_DURATION_MAX_TEXT
                        " (the longest lease), not '%s'",
                        v);
                return CLI_EX_USAGE;
            }
            if (r < 0 || pr != 0 || o->ttl_ms <= 0) {
                if (r > 0)
                    opt_err(o, "--ttl must be a positive duration like "
                            "10s or 500ms, not '%s'",
                            v);
                return CLI_EX_USAGE;
            }
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--wait", &v)) != 0) {
            int pr = r < 0 ? 0 : cli_parse_duration(v, &o->wait_ms, 1);
            if (pr == -2) {
                opt_err(o, "--wait must be at most " CLI_DURATION_MAX_TEXT
                        " (the longest wait), or 'forever', not '%s'",
                        v);
                return CLI_EX_USAGE;
            }
            if (r < 0 || pr != 0) {
                if (r > 0)
                    opt_err(o, "--wait must be a duration like 30s, 0 "
                            "(one try) or 'forever', not '%s'",
                            v);
                return CLI_EX_USAGE;
            }
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--warn-after", &v)) != 0) {
            if (r < 0 || cli_parse_duration(v, &o->warn_after_ms, 0) != 0 ||
                o->warn_after_ms <= 0) {
                if (r > 0)
                    opt_err(o, "--warn-after must be a positive duration "
                            "like 10m or 30s, at most "
                            CLI_DURATION_MAX_TEXT ", not '%s'",
                            v);
                return CLI_EX_USAGE;
            }
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--at-least", &v)) != 0) {
            if (sched_duration(o, r, v, "--at-least", &o->at_least_ms))
                return CLI_EX_USAGE;
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--at-most", &v)) != 0) {
            if (sched_duration(o, r, v, "--at-most", &o->at_most_ms))
                return CLI_EX_USAGE;
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--kill-after", &v)) != 0) {
            if (r < 0 || cli_parse_duration(v, &o->kill_after_ms, 0) != 0) {
                if (r > 0)
                    opt_err(o, "--kill-after must be a duration, at "
                            "most " CLI_DURATION_MAX_TEXT ", not '%s'",
                            v);
                return CLI_EX_USAGE;
            }
            o->kill_after_set = 1;
            continue;
        }
        if (!strcmp(a, "--")) { /* end of options: NAME may start with - */
            i++;
            break;
        }
        if (a[0] == '-' && strcmp(a, "-") != 0) {
            opt_err(o, "unknown option '%s' (see dlock help %s)", a, o->who);
            return CLI_EX_USAGE;
        }
        break;
    }
    if (i >= argc) {
        fputs(usage, stderr);
        return CLI_EX_USAGE;
    }
    o->name = argv[i++];
    o->names[0] = o->name;
    o->nnames++; /* NAME and the --also ones */
    if (i < argc && !strcmp(argv[i], "--"))
        i++;
    if (i >= argc) {
        opt_err(o, "no command given (dlock %s NAME -- CMD [ARG...])",
                o->who);
        return CLI_EX_USAGE;
    }
    o->cmd = argv + i;
    if (o->shared && o->permits) {
        opt_err(o, "--shared and --permits do not go together (a "
                "semaphore's permits are all alike)");
        return CLI_EX_USAGE;
    }
    if (o->at_most_ms && o->at_most_ms < o->at_least_ms) {
        opt_err(o, "--at-most is shorter than --at-least");
        return CLI_EX_USAGE;
    }
    if (o->nnames > 1 && (o->shared || o->permits)) {
        opt_err(o, "--also takes plain locks: not with %s",
                o->shared ? "--shared" : "--permits");
        return CLI_EX_USAGE;
    }
    return -1; /* go on */
}
