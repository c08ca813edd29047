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

/* `s` must be refused as longer than the library's limits (-2). */
static void dur_long_at(const char *file, int line, const char *s,
                        int allow_forever)
{
    int64_t ms = 12345678;
    int rc = cli_parse_duration(s, &ms, allow_forever);

    if (rc != -2)
        th_fail(file, line, "cli_parse_duration(\"%s\", %d) returned %d "
                "(ms %lld), expected -2 (beyond 365 days)",
                s, allow_forever, rc, (long long)ms);
    if (ms != 12345678)
        th_fail(file, line, "cli_parse_duration(\"%s\") wrote %lld", s,
                (long long)ms);
}

#define dur_ok(s, f, want) dur_ok_at(__FILE__, __LINE__, s, f, want)
#define dur_bad(s, f) dur_bad_at(__FILE__, __LINE__, s, f)
#define dur_long(s, f) dur_long_at(__FILE__, __LINE__, s, f)

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
        dur_ok("7d", f, 7 * 86400000LL);
        dur_ok("0.5d", f, 43200000);
    }
}

/* The library's maxima (DLOCK_TTL_MAX, DLOCK_WAIT_MAX: 365 days) are the
 * command line's: a longer --ttl or --wait is refused as too long (the
 * caller says "at most 365d"), never wrapped nor handed to the library. */
TEST(duration_limits)
{
    CHECK_EQ(DLOCK_TTL_MAX, 31536000000LL);
    CHECK_EQ(DLOCK_WAIT_MAX, 31536000000LL);
    for (int f = 0; f <= 1; f++) {
        dur_ok("365d", f, DLOCK_WAIT_MAX);
        dur_ok("8760h", f, DLOCK_WAIT_MAX);
        dur_ok("31536000s", f, DLOCK_WAIT_MAX);
        dur_ok("31536000000ms", f, DLOCK_WAIT_MAX);
        dur_ok("31536000", f, DLOCK_WAIT_MAX);
        dur_long("31536000001ms", f);
        dur_long("31536000000.6ms", f); /* rounds past it */
        dur_long("365.0001d", f);
        dur_long("366d", f);
        dur_long("8761h", f);
        dur_long("999999999999ms", f);
        dur_long("9999999999999", f);
        dur_long("99999999999999999999", f);
        dur_long("999999999999h", f);
        dur_long("999999999999m", f);
        dur_long("1000000000000000000000000ms", f);
        dur_long("123456789012.5s", f);
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
        dur_bad("5dd", f);
        dur_bad("d", f);
        /* huge values: duration_limits */
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
/* Escaping for the terminal (out.c)                                        */
/* ------------------------------------------------------------------------ */

/* What a store's writer may put in a holder string or a name: a title
 * change, a screen clear, a bell, CSI as a C1 control, a bidi override. */
#define EVIL "\033]0;pwned\007\033[2J"

TEST(escape_for_the_terminal)
{
    char b[256];

    CHECK_EQ(cli_escape(b, sizeof(b), "host " EVIL " pid 1", 0),
             strlen("host \\x1b]0;pwned\\x07\\x1b[2J pid 1"));
    CHECK_STR(b, "host \\x1b]0;pwned\\x07\\x1b[2J pid 1");
    cli_escape(b, sizeof(b), "del\177 nl\n cr\r tab\t ff\377", 0);
    CHECK_STR(b, "del\\x7f nl\\x0a cr\\x0d tab\\x09 ff\\xff");
    /* C1 controls and bidi overrides are valid UTF-8, and acted on */
    cli_escape(b, sizeof(b), "csi\302\233 rlo\342\200\256 iso\342\201\246", 0);
    CHECK_STR(b, "csi\\xc2\\x9b rlo\\xe2\\x80\\xae iso\\xe2\\x81\\xa6");
    /* other UTF-8 as is; a backslash only with the flag */
    cli_escape(b, sizeof(b), "caf\303\251 \342\202\254 a\\b", 0);
    CHECK_STR(b, "caf\303\251 \342\202\254 a\\b");
    cli_escape(b, sizeof(b), "a\\b\033", CLI_ESC_BACKSLASH);
    CHECK_STR(b, "a\\\\b\\x1b");
    /* cut before a unit that does not fit, terminated */
    char small[6];
    CHECK_EQ(cli_escape(small, sizeof(small), "ab\033cd", 0), 2);
    CHECK_STR(small, "ab");
    CHECK_EQ(cli_escape(small, sizeof(small), "abcdefgh", 0), 5);
    CHECK_STR(small, "abcde");
    CHECK_EQ(cli_escape(small, 1, "abc", 0), 0);
    CHECK_STR(small, "");

    /* the stream forms agree; nothing below 0x20 or DEL gets through */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK(f != NULL);
    cli_human_str(f, "n\\" EVIL "\302\233");
    fputc('|', f);
    cli_term_str(f, "u\\" EVIL);
    fputc('|', f);
    cli_json_str(f, EVIL "\302\233\342\200\256\177");
    fclose(f);
    CHECK_STR(buf, "n\\\\\\x1b]0;pwned\\x07\\x1b[2J\\xc2\\x9b|"
                   "u\\\\x1b]0;pwned\\x07\\x1b[2J|"
                   "\"\\u001b]0;pwned\\u0007\\u001b[2J\\u009b\\u202e\\u007f\"");
    for (size_t i = 0; i < len; i++)
        CHECK(buf[i] >= 0x20 && buf[i] != 0x7f);
    free(buf);
    CHECK_EQ(cli_human_width("a\033\302\233\303\251"), 1 + 4 + 8 + 1);
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
    T(duration_limits),
    T(escape_for_the_terminal),
    T(duration_forever),
    T(duration_bad),
    T(duration_format),
    T(opt_value_forms),
    T(opt_value_store_password_hidden),
    T(exit_codes),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    return th_main(argc, argv, tests);
}
