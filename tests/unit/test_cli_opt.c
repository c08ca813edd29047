/* SPDX-License-Identifier: MIT */
/*
 * test_cli_opt.c -- the command line's durations and option values
 * (src/cli/opt.c).
 */
#include "cli.h"
#include "test.h"

#include <stdlib.h>

/* Parses `s`; fails the test unless it gives `want` ms. */
static void dur_ok_at(const char *file, int line, const char *s,
                      int allow_forever, int64_t want)
{
    int64_t ms = 12345678;
    int rc = cli_parse_duration(s, &ms, allow_forever);

    if (rc != 0)
        th_fail(file, line, "cli_parse_duration(\"%s\", %d) refused it", s,
                allow_forever);
    if (ms != want)
        th_fail(file, line, "cli_parse_duration(\"%s\", %d) gave %lld ms, "
                "expected %lld",
                s, allow_forever, (long long)ms, (long long)want);
}

/* `s` must be refused, with and without allow_forever as given. */
static void dur_bad_at(const char *file, int line, const char *s,
                       int allow_forever)
{
    int64_t ms = 12345678;
    int rc = cli_parse_duration(s, &ms, allow_forever);

    if (rc != -1)
        th_fail(file, line, "cli_parse_duration(\"%s\", %d) returned %d "
                "(ms %lld), expected -1",
                s ? s : "(null)", allow_forever, rc, (long long)ms);
}

#define dur_ok(s, f, want) dur_ok_at(__FILE__, __LINE__, s, f, want)
#define dur_bad(s, f) dur_bad_at(__FILE__, __LINE__, s, f)

TEST(duration_units)
{
    for (int f = 0; f <= 1; f++) {
        dur_ok("500ms", f, 500);
        dur_ok("1ms", f, 1);
        dur_ok("0ms", f, 0);
        dur_ok("30s", f, 30000);
        dur_ok("2m", f, 120000);
        dur_ok("1h", f, 3600000);
        dur_ok("24h", f, 86400000);
        dur_ok("1.5s", f, 1500);
        dur_ok("0.3s", f, 300);
        dur_ok("0.25m", f, 15000);
        dur_ok("1.5h", f, 5400000);
        dur_ok("2.5ms", f, 3); /* rounded */
        dur_ok("2", f, 2000);  /* a bare number is seconds */
        dur_ok("0.5", f, 500);
        dur_ok("10", f, 10000);
        dur_ok("0", f, 0);
        dur_ok("007s", f, 7000);
        dur_ok("999999999999ms", f, 999999999999LL);
    }
}

TEST(duration_forever)
{
    dur_ok("forever", 1, -1);
    dur_ok("inf", 1, -1);
    dur_ok("-1", 1, -1);

    dur_bad("forever", 0);
    dur_bad("inf", 0);
    dur_bad("-1", 0);
    dur_bad("-2", 1);
    dur_bad("Forever", 1);
    dur_bad("infinity", 1);
    dur_bad("-1s", 1);
}

TEST(duration_bad)
{
    for (int f = 0; f <= 1; f++) {
        dur_bad("", f);
        dur_bad(NULL, f);
        dur_bad("-5", f);
        dur_bad("-5s", f);
        dur_bad("+5", f);
        dur_bad("5x", f);
        dur_bad("5sec", f);
        dur_bad("5 s", f);
        dur_bad(" 5", f);
        dur_bad("5 ", f);
        dur_bad("ms", f);
        dur_bad("s", f);
        dur_bad(".", f);
        dur_bad(".s", f);
        dur_bad("1.2.3", f);
        dur_bad("1..2", f);
        dur_bad("1e3", f);
        dur_bad("0x10", f);
        dur_bad("5ms5", f);
        dur_bad("5sms", f);
        dur_bad("abc", f);
        /* huge values */
        dur_bad("9999999999999", f);
        dur_bad("99999999999999999999", f);
        dur_bad("999999999999h", f);
        dur_bad("999999999999m", f);
        dur_bad("1000000000000000000000000ms", f);
        dur_bad("123456789012.5s", f);
    }
}

TEST(duration_format)
{
    char b[32];

    cli_format_duration(-1, b, sizeof(b));
    CHECK_STR(b, "?");
    cli_format_duration(0, b, sizeof(b));
    CHECK_STR(b, "0ms");
    cli_format_duration(850, b, sizeof(b));
    CHECK_STR(b, "850ms");
    cli_format_duration(999, b, sizeof(b));
    CHECK_STR(b, "999ms");
    cli_format_duration(1000, b, sizeof(b));
    CHECK_STR(b, "1.0s");
    cli_format_duration(12300, b, sizeof(b));
    CHECK_STR(b, "12.3s");
    cli_format_duration(60000, b, sizeof(b));
    CHECK_STR(b, "1m00s");
    cli_format_duration(245000, b, sizeof(b));
    CHECK_STR(b, "4m05s");
    cli_format_duration(3599000, b, sizeof(b));
    CHECK_STR(b, "59m59s");
    cli_format_duration(3600000, b, sizeof(b));
    CHECK_STR(b, "1h00m");
    cli_format_duration(7800000, b, sizeof(b));
    CHECK_STR(b, "2h10m");
    cli_format_duration(100LL * 3600000, b, sizeof(b));
    CHECK_STR(b, "100h00m");
    cli_format_duration(59949, b, sizeof(b));
    CHECK_STR(b, "59.9s");
    cli_format_duration(59950, b, sizeof(b));
    CHECK_STR(b, "0m59s");
    /* any int64 a store reports formats without overflow (found by
     * fuzz/fuzz_cli_opt.c: INT64_MAX + 50 was signed overflow) */
    cli_format_duration(INT64_MAX, b, sizeof(b));
    CHECK_STR(b, "2562047788015h12m");

    /* a short buffer is truncated, still terminated */
    char small[4];
    memset(small, 'x', sizeof(small));
    cli_format_duration(7800000, small, sizeof(small));
    CHECK_EQ(strlen(small), 3);
    CHECK_STR(small, "2h1");

    /* what it prints parses back (to the shown precision) */
    int64_t ms;
    cli_format_duration(850, b, sizeof(b));
    CHECK_EQ(cli_parse_duration(b, &ms, 0), 0);
    CHECK_EQ(ms, 850);
    cli_format_duration(12300, b, sizeof(b));
    CHECK_EQ(cli_parse_duration(b, &ms, 0), 0);
    CHECK_EQ(ms, 12300);
}

/* ------------------------------------------------------------------------ */
/* cli_opt_value                                                            */
/* ------------------------------------------------------------------------ */

TEST(opt_value_forms)
{
    char *argv1[] = {"run", "--store=file:///x", "NAME", NULL};
    char *argv2[] = {"run", "--store", "redis://h", "NAME", NULL};
    char *argv3[] = {"run", "--store", NULL};
    char *argv4[] = {"run", "--storex", "y", NULL};
    char *argv5[] = {"run", "--stor", "y", NULL};
    char *argv6[] = {"run", "--store=", "y", NULL};
    char *argv7[] = {"run", "NAME", "--store", NULL};
    char *argv8[] = {"run", "--ttl", "--store", NULL};
    const char *v;
    int i;

    /* --store=X: the value from the same argument */
    i = 1;
    v = NULL;
    CHECK_EQ(cli_opt_value(3, argv1, &i, "--store", &v), 1);
    CHECK_EQ(i, 1);
    CHECK(v != NULL);
    CHECK_STR(v, "file:///x");

    /* --store X: the value from the next argument, which is consumed */
    i = 1;
    v = NULL;
    CHECK_EQ(cli_opt_value(4, argv2, &i, "--store", &v), 1);
    CHECK_EQ(i, 2);
    CHECK(v != NULL);
    CHECK_STR(v, "redis://h");

    /* --store at the end: no value */
    i = 1;
    v = NULL;
    CHECK_EQ(cli_opt_value(2, argv3, &i, "--store", &v), -1);
    CHECK(v == NULL);

    /* a longer or shorter option is not this one */
    i = 1;
    v = NULL;
    CHECK_EQ(cli_opt_value(3, argv4, &i, "--store", &v), 0);
    CHECK_EQ(i, 1);
    CHECK(v == NULL);
    CHECK_EQ(cli_opt_value(3, argv5, &i, "--store", &v), 0);
    CHECK_EQ(i, 1);
    CHECK(v == NULL);

    /* --store= gives an empty value (for the caller to judge) */
    i = 1;
    CHECK_EQ(cli_opt_value(3, argv6, &i, "--store", &v), 1);
    CHECK_EQ(i, 1);
    CHECK_STR(v, "");

    /* a plain word is not an option */
    i = 1;
    v = NULL;
    CHECK_EQ(cli_opt_value(3, argv7, &i, "--store", &v), 0);
    CHECK(v == NULL);
    /* ... and the option as the last argument has no value */
    i = 2;
    CHECK_EQ(cli_opt_value(3, argv7, &i, "--store", &v), -1);

    /* the next argument is taken as the value even if it looks like an
     * option */
    i = 1;
    v = NULL;
    CHECK_EQ(cli_opt_value(3, argv8, &i, "--ttl", &v), 1);
    CHECK_EQ(i, 2);
    CHECK_STR(v, "--store");
}

TEST(exit_codes)
{
    CHECK_EQ(cli_exit_for(DLOCK_EBUSY), CLI_EX_NOTACQUIRED);
    CHECK_EQ(cli_exit_for(DLOCK_ELOST), CLI_EX_LOST);
    CHECK_EQ(cli_exit_for(DLOCK_EINVAL), CLI_EX_USAGE);
    CHECK_EQ(cli_exit_for(DLOCK_ENOMEM), CLI_EX_SOFTWARE);
    CHECK_EQ(cli_exit_for(DLOCK_ECONN), CLI_EX_UNAVAILABLE);
    CHECK_EQ(cli_exit_for(DLOCK_EAUTH), CLI_EX_UNAVAILABLE);
    CHECK_EQ(cli_exit_for(DLOCK_EPROTO), CLI_EX_UNAVAILABLE);
    CHECK_EQ(cli_exit_for(DLOCK_ENOTSUP), CLI_EX_UNAVAILABLE);
    CHECK_EQ(CLI_EX_USAGE, 64);
    CHECK_EQ(CLI_EX_UNAVAILABLE, 69);
    CHECK_EQ(CLI_EX_SOFTWARE, 70);
    CHECK_EQ(CLI_EX_NOTACQUIRED, 75);
    CHECK_EQ(CLI_EX_LOST, 76);
    CHECK_EQ(CLI_EX_NOEXEC, 126);
    CHECK_EQ(CLI_EX_NOTFOUND, 127);
}

/* A --store URI with a password: the caller gets it whole, while argv's
 * own bytes -- what /proc/PID/cmdline shows every user -- show stars in
 * its place, at the same length (issue 34). */
TEST(opt_value_store_password_hidden)
{
    char a1[] = "--store=redis://u:S3cr/t?x@h:6379/0";
    char a2[] = "postgres://127.0.0.1:1/S3cret@db/app";
    char a3[] = "--store";
    char a4[] = "redis://h";
    char run[] = "run";
    char *argv1[] = {run, a1, NULL};
    char *argv2[] = {run, a3, a2, NULL};
    char *argv3[] = {run, a3, a4, NULL};
    const char *v;
    int i;

    i = 1;
    CHECK_EQ(cli_opt_value(2, argv1, &i, "--store", &v), 1);
    CHECK_STR(v, "redis://u:S3cr/t?x@h:6379/0");
    CHECK_STR(a1, "--store=redis://u:********@h:6379/0");
    CHECK(argv1[1] != a1);
    free(argv1[1]);

    i = 1;
    CHECK_EQ(cli_opt_value(3, argv2, &i, "--store", &v), 1);
    CHECK_EQ(i, 2);
    CHECK_STR(v, "postgres://127.0.0.1:1/S3cret@db/app");
    CHECK_STR(a2, "postgres://127.0.0.1:********@db/app");
    free(argv2[2]);

    /* nothing secret: argv untouched, no copy */
    i = 1;
    CHECK_EQ(cli_opt_value(3, argv3, &i, "--store", &v), 1);
    CHECK(v == a4);
    CHECK_STR(a4, "redis://h");
}

static const th_test tests[] = {
    T(duration_units),
    T(duration_forever),
    T(duration_bad),
    T(duration_format),
    T(opt_value_forms),
    T(opt_value_store_password_hidden),
    T(exit_codes),
    {NULL, NULL, 0},
};

int main(int argc, char **argv)
{
    return th_main(argc, argv, tests);
}
