/* SPDX-License-Identifier: MIT */
/*
 * cli.h -- shared bits of the dlock command-line tool. The tool is just
 * another program on the public API (dlock.h): no internal headers.
 */
#ifndef DLOCK_CLI_H
#define DLOCK_CLI_H

#include <stddef.h>
#include <stdint.h>

/* Exit codes of dlock itself (a command run by `dlock run` passes its own
 * through, or 128+N when killed by signal N). Listed in docs/dlock.1. */
#define CLI_EX_USAGE 64       /* bad command line */
#define CLI_EX_UNAVAILABLE 69 /* the store failed (connect, auth, ...) */
#define CLI_EX_SOFTWARE 70    /* internal error (out of memory, ...) */
#define CLI_EX_NOTACQUIRED 75 /* not acquired within --wait */
#define CLI_EX_LOST 76        /* the lock was lost while CMD ran */
#define CLI_EX_NOEXEC 126     /* CMD found but not executable */
#define CLI_EX_NOTFOUND 127   /* CMD not found */

int cmd_run(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_gc(int argc, char **argv);

/* "dlock: <message>\n" on stderr. */
void cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The exit code for a failed dlock call. */
int cli_exit_for(int rc);

/* Parses a duration: "500ms", "30s", "2m", "1h", "1.5s"; a bare number is
 * seconds. With allow_forever, "forever", "inf" and "-1" give -1.
 * Returns 0, or -1 for anything else (negative, junk, overflow). */
int cli_parse_duration(const char *s, int64_t *ms, int allow_forever);

/* "850ms", "12.3s", "4m05s", "2h10m". */
void cli_format_duration(int64_t ms, char *buf, size_t cap);

/* Option parsing: if argv[*i] is --name or --name=value, takes the value
 * (from the same or the next argument) and returns 1; 0 if not this
 * option; -1 (after a message) if the value is missing. */
int cli_opt_value(int argc, char **argv, int *i, const char *name,
                  const char **value);

#endif
