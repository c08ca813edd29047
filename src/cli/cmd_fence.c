/* SPDX-License-Identifier: MIT */
/*
 * cmd_fence.c -- `dlock fence [--token T] FILE`: fencing at a file
 * (docs/fencing.md). Replaces FILE with standard input only if the
 * writer's fencing token is not lower than the highest that has written
 * it, recorded beside it in FILE.fence; atomically: a reader sees the
 * old content or the new, never a mix, and writers of one file take
 * turns on the record's kernel lock.
 *
 * Order (each step durable before the next): the record's lock (flock),
 * its token read and compared; the new content written to a temporary
 * file in FILE's directory and fsynced; the record set to the token and
 * fsynced; the temporary file renamed over FILE and the directory
 * fsynced. A crash before the rename leaves FILE as it was, the record
 * perhaps newer: a later writer with that token (the same holder, again)
 * passes, an older one is refused as it should be. The record never
 * falls behind what FILE holds.
 */
#include "cli.h"
#include "cmd.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static const char fence_usage[] =
    "usage: dlock fence [--token T] FILE < CONTENT\n"
    "\n"
    "Replaces FILE with standard input, atomically, if the fencing token T\n"
    "is not lower than the highest token that has written FILE (recorded\n"
    "beside it, in FILE.fence). A holder paused past its lease, whose lock\n"
    "another holder took and wrote with a higher token, is refused: FILE\n"
    "keeps the newer holder's content.\n"
    "\n"
    "  --token T   the writer's token (default: $DLOCK_TOKEN, which dlock\n"
    "              run gives its command)\n"
    "\n"
    "    dlock run report -- sh -c 'make-report | dlock fence report.csv'\n"
    "\n"
    "Exit status: 0 written, 1 refused (a newer token has written FILE),\n"
    "64 usage, 74 I/O error (FILE unchanged).\n";

/* A token: decimal digits, 1..2^64-1. */
static int parse_token(const char *s, uint64_t *out)
{
    char *end = NULL;

    if (!s || s[0] < '0' || s[0] > '9')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v == 0)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static int write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Standard input into fd; 0, or -1 with errno. */
static int copy_stdin(int fd)
{
    char buf[65536];

    for (;;) {
        ssize_t r = read(STDIN_FILENO, buf, sizeof(buf));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            return 0;
        if (write_all(fd, buf, (size_t)r) != 0)
            return -1;
    }
}

/* The record's token (0: none yet); -1 when it holds something else. */
static int read_record(int fd, uint64_t *tok)
{
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);

    if (n < 0)
        return -1;
    buf[n] = '\0';
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = '\0';
    *tok = 0;
    return n == 0 ? 0 : parse_token(buf, tok);
}

static int fsync_dir_of(const char *path)
{
    char *copy = strdup(path);
    int rc = -1;

    if (copy) {
        int d = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (d >= 0) {
            rc = fsync(d);
            close(d);
        }
        free(copy);
    }
    return rc;
}

int cmd_fence(int argc, char **argv)
{
    const char *tok_s = NULL, *file = NULL;
    uint64_t token = 0, seen = 0;
    int r;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(fence_usage, stdout);
            return 0;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--token", &tok_s)) != 0) {
            if (r < 0)
                return CLI_EX_USAGE;
            continue;
        }
        if (!strcmp(argv[i], "--") && i + 1 < argc && !file) {
            file = argv[++i];
            continue;
        }
        if ((argv[i][0] == '-' && argv[i][1]) || file) {
            cli_err("fence: unknown argument '%s' (see dlock help fence)",
                    argv[i]);
            return CLI_EX_USAGE;
        }
        file = argv[i];
    }
    if (!file) {
        fputs(fence_usage, stderr);
        return CLI_EX_USAGE;
    }
    if (!tok_s)
        tok_s = getenv("DLOCK_TOKEN");
    if (parse_token(tok_s, &token) != 0) {
        cli_err("fence: %s must be a fencing token (a whole number "
                "above 0), not '%s'",
                tok_s == getenv("DLOCK_TOKEN") ? "$DLOCK_TOKEN" : "--token",
                tok_s ? tok_s : "(unset: give --token, or run under dlock "
                                "run)");
        return CLI_EX_USAGE;
    }

    size_t fl = strlen(file);
    char *rec = malloc(fl + 8), *tmp = malloc(fl + 16);
    int rfd = -1, tfd = -1, code = CLI_EX_IOERR;
    const char *step = "";
    if (!rec || !tmp) {
        free(rec);
        free(tmp);
        cli_err("out of memory");
        return CLI_EX_SOFTWARE;
    }
    snprintf(rec, fl + 8, "%s.fence", file);
    snprintf(tmp, fl + 16, "%s.XXXXXX", file);

    /* 1. the record, locked: writers of FILE take turns */
    step = "opening the record";
    rfd = open(rec, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (rfd < 0)
        goto io;
    step = "locking the record";
    while ((r = flock(rfd, LOCK_EX)) != 0 && errno == EINTR)
        ;
    if (r != 0)
        goto io;
    step = "reading the record";
    if (read_record(rfd, &seen) != 0) {
        cli_err("fence: %s does not hold a fencing token: not touched", rec);
        goto out;
    }
    if (token < seen) {
        cli_err("fence: refused: token %" PRIu64 " is older than %" PRIu64
                ", which has written %s (a newer holder took the lock "
                "meanwhile); the file is unchanged",
                token, seen, file);
        code = CLI_EX_NOTHELD;
        goto out;
    }

    /* 2. the new content beside FILE, durable */
    step = "writing the new content";
    tfd = mkostemp(tmp, O_CLOEXEC);
    if (tfd < 0)
        goto io;
    struct stat st;
    if (stat(file, &st) == 0 && fchmod(tfd, st.st_mode & 07777) != 0)
        goto io_tmp;
    if (copy_stdin(tfd) != 0 || fsync(tfd) != 0)
        goto io_tmp;

    /* 3. the record first: it never falls behind FILE */
    step = "recording the token";
    if (token != seen) {
        char t[32];
        int n = snprintf(t, sizeof(t), "%" PRIu64 "\n", token);
        if (ftruncate(rfd, 0) != 0 || pwrite(rfd, t, (size_t)n, 0) != n ||
            fsync(rfd) != 0)
            goto io_tmp;
    }

    /* 4. the content in place, in one step */
    step = "replacing the file";
    if (rename(tmp, file) != 0)
        goto io_tmp;
    close(tfd);
    tfd = -1;
    fsync_dir_of(file); /* best effort: the rename is done */
    code = 0;
    goto out;

io_tmp:
    r = errno;
    unlink(tmp);
    errno = r;
io:
    cli_err("fence: %s for %s: %s (the file is unchanged)", step, file,
            strerror(errno));
out:
    if (tfd >= 0)
        close(tfd);
    if (rfd >= 0)
        close(rfd); /* lets go of the lock */
    free(rec);
    free(tmp);
    return code;
}
