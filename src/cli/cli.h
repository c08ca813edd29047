/* SPDX-License-Identifier: MIT */
/*
 * cli.h -- shared bits of the dlock command-line tool. The tool is just
 * another program on the public API (dlock.h): no internal headers.
 */
#ifndef DLOCK_CLI_H
#define DLOCK_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <signal.h>
#include <sys/types.h>

struct dlock_info;

/* Exit codes of dlock itself (a command run by `dlock run` passes its own
 * through, or 128+N when killed by signal N). Listed in docs/dlock.1. */
#define CLI_EX_NOTHELD 1      /* dlock break: nobody held the lock, nothing
                               * was done (like grep's "no match"); dlock
                               * fence: a newer token has written the file */
#define CLI_EX_USAGE 64       /* bad command line */
#define CLI_EX_UNAVAILABLE 69 /* the store failed (connect, auth, ...) */
#define CLI_EX_SOFTWARE 70    /* internal error (out of memory, ...) */
#define CLI_EX_IOERR 74       /* dlock fence: the file could not be
                               * written (it is unchanged) */
#define CLI_EX_NOTACQUIRED 75 /* not acquired within --wait */
#define CLI_EX_LOST 76        /* the lock was lost while CMD ran */
#define CLI_EX_AT_MOST 124    /* dlock run --at-most: CMD was stopped at
                               * its time (as timeout(1) exits) */
#define CLI_EX_NOEXEC 126     /* CMD found but not executable */
#define CLI_EX_NOTFOUND 127   /* CMD not found */

/* --- dlock run's command tree (tree.c) ---------------------------------- */

/* The descriptors above 2 a process had at its start, sorted. */
typedef struct cli_fdset {
    int *fd;
    int n;
} cli_fdset;

/* Records this process's descriptors above 2 (/proc/self/fd; without
 * /proc, fcntl on each up to the limit). 0, or -1 out of memory. */
int cli_fds_record(cli_fdset *set);
void cli_fds_free(cli_fdset *set);

/* What the supervisor needs to start CMD, prepared before the fork. */
typedef struct cli_spawn {
    char **argv, **envp;
    char **paths;   /* CMD's candidates as execvp tries them, NULL-ended */
    char **sh_argv; /* "/bin/sh", (a candidate), argv[1..]: ENOEXEC */
    const cli_fdset *inherited; /* all CMD keeps beside 0, 1, 2 */
    const struct sigaction *pipe_act; /* CMD's SIGPIPE disposition */
} cli_spawn;

/* Fills *sp (PATH searched now). 0, or -1 out of memory (cli_spawn_free
 * either way). */
int cli_spawn_prepare(cli_spawn *sp, char **argv, char **envp,
                      const cli_fdset *inherited,
                      const struct sigaction *pipe_act);
void cli_spawn_free(cli_spawn *sp);

/* The supervisor process and its two pipes (dlock's ends). */
typedef struct cli_sup {
    pid_t pid;
    int ctl; /* dlock -> supervisor: cli_sup_cmd */
    int rep; /* supervisor -> dlock: cli_sup_msg */
} cli_sup;

/* dlock -> supervisor */
#define CLI_SUP_SIGNAL 1 /* pass signal `sig` to CMD (not yet reaped) */
#define CLI_SUP_TERM 2   /* SIGTERM (and SIGCONT) every process of the tree */
#define CLI_SUP_KILL 3   /* SIGKILL the tree, again until it is empty */
typedef struct cli_sup_cmd {
    int op, sig;
} cli_sup_cmd;

/* supervisor -> dlock */
#define CLI_SUP_STARTED 1  /* a: CMD's pid */
#define CLI_SUP_EXECFAIL 2 /* a: the exec's errno (the supervisor exits) */
#define CLI_SUP_EXITED 3   /* a: CMD's wait status; b: 1 if processes of
                            * its tree are left */
#define CLI_SUP_EMPTY 4    /* the tree is empty; the supervisor exits */
typedef struct cli_sup_msg {
    int type, a, b;
} cli_sup_msg;

/* Forks the supervisor, which starts CMD (sp). Call with dlock a child
 * subreaper. 0, or -1 with errno. */
int cli_sup_start(const cli_spawn *sp, cli_sup *s);
/* Sends the supervisor op (CLI_SUP_*) and, for CLI_SUP_SIGNAL, sig. */
int cli_sup_send(const cli_sup *s, int op, int sig);

/* Sends sig to every descendant of root (found through /proc/PID/stat:
 * at most 65536 processes are looked at), SIGTERM followed by SIGCONT;
 * returns how many got it, -1 without /proc. Async-signal-safe. */
int cli_tree_signal(pid_t root, int sig);

/* The usage of `dlock exporter` (exporter_usage.c). */
extern const char cli_exporter_usage[];

/* "dlock: <message>\n" on stderr, the message escaped for the terminal
 * (cli_escape: it may quote a store's or a server's words). */
void cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The exit code for a failed dlock call. */
int cli_exit_for(int rc);

/* Parses a duration: "500ms", "30s", "2m", "1h", "1.5s", "7d"; a bare
 * number is seconds. With allow_forever, "forever", "inf" and "-1" give
 * -1. Returns 0; -2 for a duration longer than 365 days (the library's
 * DLOCK_TTL_MAX and DLOCK_WAIT_MAX: CLI_DURATION_MAX_TEXT in messages);
 * -1 for anything else (negative, junk). */
#define CLI_DURATION_MAX_TEXT "365d"
int cli_parse_duration(const char *s, int64_t *ms, int allow_forever);

/* "850ms", "12.3s", "4m05s", "2h10m". */
void cli_format_duration(int64_t ms, char *buf, size_t cap);

/* Option parsing: if argv[*i] is --name or --name=value, takes the value
 * (from the same or the next argument) and returns 1; 0 if not this
 * option; -1 (after a message) if the value is missing. For --store, whose
 * URI may hold a password, the argument becomes a malloc'd copy in argv[]
 * (never freed) and the password in the original bytes, the ones
 * /proc/PID/cmdline shows, is overwritten with '*'. */
int cli_opt_value(int argc, char **argv, int *i, const char *name,
                  const char **value);

/* The command line of a command that takes one lock name and --store,
 * --json and --help (dlock status, dlock break; `cmd` its name): -1 with
 * *name, *store and *json set; 0 after --help (`usage` printed); or
 * CLI_EX_USAGE, after a message (an unknown option's ends with `hint`),
 * or with no name the usage on stderr. */
int cli_name_args(int argc, char **argv, const char *cmd, const char *usage,
                  const char *hint, const char **name, const char **store,
                  int *json);

/* Printing names and holders (out.c). A lock name is any bytes but NUL. */

/* The length (1..4) of the well-formed UTF-8 sequence at p, 0 if none. */
size_t cli_utf8_len(const unsigned char *p);

/* 1 if s is well-formed UTF-8 throughout, else 0. */
int cli_utf8_valid(const char *s);

/* s as a JSON string, always valid JSON: quotes, backslashes and control
 * characters escaped; a byte that is not part of well-formed UTF-8 as
 * \u00XX (readable, but not exact: see cli_json_name). */
void cli_json_str(FILE *f, const char *s);

/* "key":"<s>" and, when s is not well-formed UTF-8, ,"key_hex":"<bytes in
 * hex>": the exact bytes (docs/dlock.1, JSON OUTPUT). */
void cli_json_name(FILE *f, const char *key, const char *s);

/* s for people: backslash as \\, control characters, DEL, bytes that
 * are not UTF-8, C1 controls and bidirectional overrides as \xNN (each
 * byte); other well-formed UTF-8 as is. Unambiguous. */
void cli_human_str(FILE *f, const char *s);

/* s for a terminal into dst (cap bytes, always NUL-terminated, cut
 * before a unit that does not fit): control bytes, DEL, bytes that are
 * not UTF-8 and the characters a terminal acts on (C1 controls,
 * bidirectional overrides) as \xNN; with CLI_ESC_BACKSLASH a backslash as
 * \\ too (cli_human_str's form). For every string that came from a store
 * or a server. Returns the length. */
#define CLI_ESC_BACKSLASH 0x1u
size_t cli_escape(char *dst, size_t cap, const char *s, unsigned flags);

/* s escaped as cli_escape() without flags, onto f (prose: a store's URI,
 * a message). */
void cli_term_str(FILE *f, const char *s);

/* The columns cli_human_str() takes (a character counts one). */
size_t cli_human_width(const char *s);

/* "free", "exclusive", "shared" or "semaphore". */
const char *cli_mode_of(const struct dlock_info *info);

/* "held":...,"holder":...,"mode":...,"holders":...,"permits":...,
 * "token":...,"held_ms":...,"ttl_ms":...,"waiters":...,"queue":[...]
 * (no braces): the fields `dlock status --json` prints. */
void cli_json_info(FILE *f, const struct dlock_info *info);

#endif
