/* SPDX-License-Identifier: MIT */
/*
 * opt.c -- durations and option values for the command line.
 */
#include "cli.h"

#include <dlock.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_err(const char *fmt, ...)
{
    char raw[2048], safe[4096];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(raw, sizeof(raw), fmt, ap);
    va_end(ap);
    /* names, holders and a server's error text reach the terminal only
     * escaped (out.c) */
    cli_escape(safe, sizeof(safe), raw, 0);
    fprintf(stderr, "dlock: %s\n", safe);
}

int cli_exit_for(int rc)
{
    switch (rc) {
    case DLOCK_EBUSY:
        return CLI_EX_NOTACQUIRED;
    case DLOCK_ELOST:
        return CLI_EX_LOST;
    case DLOCK_EINVAL:
        return CLI_EX_USAGE;
    case DLOCK_ENOMEM:
        return CLI_EX_SOFTWARE;
    default:
        return CLI_EX_UNAVAILABLE;
    }
}

int cli_parse_duration(const char *s, int64_t *ms, int allow_forever)
{
    static const struct {
        const char *unit;
        double ms;
    } units[] = {{"ms", 1},      {"s", 1000},     {"m", 60000},
                 {"h", 3600000}, {"d", 86400000}, {"", 1000}};
    double v = 0, scale = 0;
    int digits = 0;
    const char *p = s;

    if (!s || !*s)
        return -1;
    if (allow_forever && (!strcmp(s, "forever") || !strcmp(s, "inf") ||
                          !strcmp(s, "-1"))) {
        *ms = -1;
        return 0;
    }
    for (; *p >= '0' && *p <= '9'; p++, digits++)
        v = v * 10 + (*p - '0');
    if (*p == '.') {
        double f = 0.1;
        for (p++; *p >= '0' && *p <= '9'; p++, digits++, f /= 10)
            v += (*p - '0') * f;
    }
    if (digits == 0)
        return -1;
    for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
        if (!strcmp(p, units[i].unit))
            scale = units[i].ms;
    if (scale == 0)
        return -1;
    /* the library's limits (DLOCK_TTL_MAX and DLOCK_WAIT_MAX: the same
     * 365 days); a double holds any count of digits (as infinity at
     * worst) and compares right */
    v = v * scale + 0.5;
    if (v >= (double)DLOCK_WAIT_MAX + 1)
        return -2;
    *ms = (int64_t)v;
    return 0;
}

void cli_format_duration(int64_t ms, char *buf, size_t cap)
{
    if (ms < 0)
        snprintf(buf, cap, "?");
    else if (ms < 1000)
        snprintf(buf, cap, "%lldms", (long long)ms);
    else if (ms < 59950) /* tenths of a second, rounded: below 60.0s */
        snprintf(buf, cap, "%lld.%llds", (long long)((ms + 50) / 1000),
                 (long long)((ms + 50) / 100 % 10));
    else if (ms < 3600000)
        snprintf(buf, cap, "%lldm%02llds", (long long)(ms / 60000),
                 (long long)(ms / 1000 % 60));
    else
        snprintf(buf, cap, "%lldh%02lldm", (long long)(ms / 3600000),
                 (long long)(ms / 60000 % 60));
}

/* Options whose value may hold a password: a store URI. */
static int secret_option(const char *name)
{
    return strcmp(name, "--store") == 0;
}

/* argv[k] holds a store URI from byte `off` on: argv[k] becomes a
 * malloc'd copy (it lives as long as the process, reachable from argv),
 * and the password in the original bytes -- the ones /proc/PID/cmdline
 * and ps(1) show every user -- is overwritten with '*', as mysql(1) does.
 * The bytes keep their length and the rest of the URI stays readable. */
static const char *hide_secret(char **argv, int k, size_t off)
{
    char *orig = argv[k];
    size_t n = strlen(orig);
    char *copy = strdup(orig);

    if (!copy) /* the URI is used all the same; the password stays */
        return orig + off;
    dlock_uri_redact(orig + off, DLOCK_REDACT_STARS, copy + off, n - off + 1);
    if (strcmp(copy, orig) == 0) { /* nothing secret: argv as it was */
        free(copy);
        return orig + off;
    }
    for (size_t i = off; i < n; i++) { /* the stars to argv, the URI kept */
        char t = orig[i];
        orig[i] = copy[i];
        copy[i] = t;
    }
    argv[k] = copy;
    return copy + off;
}

int cli_opt_value(int argc, char **argv, int *i, const char *name,
                  const char **value)
{
    const char *a = argv[*i];
    size_t n = strlen(name);

    if (strncmp(a, name, n) != 0)
        return 0;
    if (a[n] == '=') {
        *value = secret_option(name) ? hide_secret(argv, *i, n + 1)
                                     : a + n + 1;
        return 1;
    }
    if (a[n] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        cli_err("%s needs a value", name);
        return -1;
    }
    ++*i;
    *value = secret_option(name) ? hide_secret(argv, *i, 0) : argv[*i];
    return 1;
}

int cli_name_args(int argc, char **argv, const char *cmd, const char *usage,
                  const char *hint, const char **name, const char **store,
                  int *json)
{
    int options = 1, r;

    for (int i = 1; i < argc; i++) {
        if (!options || argv[i][0] != '-' || argv[i][1] == '\0') {
            if (*name) {
                cli_err("%s: give one lock name", cmd);
                return CLI_EX_USAGE;
            }
            *name = argv[i];
            continue;
        }
        if (!strcmp(argv[i], "--")) {
            options = 0;
            continue;
        }
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json")) {
            *json = 1;
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--store", store)) != 0) {
            if (r < 0)
                return CLI_EX_USAGE;
            continue;
        }
        cli_err("%s: unknown option '%s'%s", cmd, argv[i], hint);
        return CLI_EX_USAGE;
    }
    if (!*name) {
        fputs(usage, stderr);
        return CLI_EX_USAGE;
    }
    return -1;
}
