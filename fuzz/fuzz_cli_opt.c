/* SPDX-License-Identifier: MIT */
/*
 * fuzz_cli_opt.c -- the command line's duration and option parsers
 * (src/cli/opt.c).
 *
 * Input: field 1 a duration (cli_parse_duration, with and without
 * "forever"); the next 8 bytes a duration in ms to format (any int64: the
 * CLI formats what a store reports); the rest NUL-separated arguments for
 * cli_opt_value. Checks: a parsed duration is -1 (forever) or 0..1e15 ms,
 * and formatting it then parsing the text back gives it within rounding;
 * formatting never overflows its buffer (exact-size buffers), and any
 * int64 formats.
 */
#include "fuzz.h"

#include "cli.h"
#include <dlock.h>

#include <dlock.h>

#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = fz_init(data, size);
    size_t len;
    char *d = fz_field(&f, &len);
    int64_t ms;

    for (int forever = 0; forever < 2; forever++) {
        if (cli_parse_duration(d, &ms, forever) != 0)
            continue;
        if (ms == -1 && !forever)
            fz_fail("-1 without allow_forever");
        if (ms < -1 || ms > DLOCK_WAIT_MAX)
            fz_fail("duration %lld out of range", (long long)ms);
        if (ms >= 0) {
            char buf[32];
            cli_format_duration(ms, buf, sizeof(buf));
            /* "4m05s" and "2h10m" are not parseable; "850ms" and "12.3s"
             * are, within the tenth of a second shown */
            int64_t back;
            size_t bl = strlen(buf);
            if (bl > 2 && (!strcmp(buf + bl - 2, "ms") ||
                           (buf[bl - 1] == 's' && !strchr(buf, 'm')))) {
                if (cli_parse_duration(buf, &back, 0) != 0)
                    fz_fail("formatted \"%s\" does not parse", buf);
                if (back < ms - 50 || back > ms + 50)
                    fz_fail("\"%s\" parses as %lld, not %lld", buf,
                            (long long)back, (long long)ms);
            }
        }
    }
    free(d);

    uint64_t raw = 0;
    for (int i = 0; i < 8; i++)
        raw = raw << 8 | fz_byte(&f);
    unsigned cap = fz_byte(&f) % 40 + 1;
    char *out = malloc(cap);
    cli_format_duration((int64_t)raw, out, cap);
    if (strlen(out) >= cap)
        fz_fail("formatted past its capacity");
    free(out);

    /* argv from the remaining fields: each argument in its own buffer */
    char *argv[16], *orig[16], *shown[16];
    int argc = 0;
    while (argc < 16 && f.p) {
        orig[argc] = argv[argc] = fz_field(&f, NULL);
        shown[argc] = fz_dup(orig[argc], strlen(orig[argc]));
        argc++;
    }
    static const char *const names[] = {"--store", "--wait", "--ttl", "-w"};
    for (int i = 0; i < argc; i++) {
        const char *value = NULL;
        int k = i;
        int r = cli_opt_value(argc, argv, &k, names[i % 4], &value);
        if (r == 1 && (!value || k < i || k > i + 1))
            fz_fail("cli_opt_value: bad result");
        if (r == 0 && k != i)
            fz_fail("cli_opt_value moved without a match");
    }
    for (int i = 0; i < argc; i++) {
        /* a --store value: argv[i] became a copy of the argument as it
         * was, and the original shows no password, at the same length */
        if (argv[i] != orig[i]) {
            if (strcmp(argv[i], shown[i]) != 0 ||
                strlen(orig[i]) != strlen(shown[i]))
                fz_fail("cli_opt_value: a --store copy differs");
            char *want = fz_dup(shown[i], strlen(shown[i]));
            char *want2 = fz_dup(shown[i], strlen(shown[i]));
            dlock_uri_redact(want, DLOCK_REDACT_STARS, want,
                             strlen(want) + 1);
            if (!strncmp(want2, "--store=", 8))
                dlock_uri_redact(want2 + 8, DLOCK_REDACT_STARS, want2 + 8,
                                 strlen(want2 + 8) + 1);
            if (strcmp(orig[i], want) != 0 && strcmp(orig[i], want2) != 0)
                fz_fail("cli_opt_value: argv shows %s", orig[i]);
            free(want);
            free(want2);
            free(argv[i]);
        }
        free(orig[i]);
        free(shown[i]);
    }
    return 0;
}
