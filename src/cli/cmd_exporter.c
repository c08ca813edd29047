/* SPDX-License-Identifier: MIT */
/*
 * cmd_exporter.c -- `dlock exporter ARGS`: runs the exporter program,
 * dlock-exporter (exporter_main.c), in this process (execv) with ARGS as
 * given, so that its options, output, pid and exit status are those of
 * `dlock exporter`. The exporter is a program of its own because it needs
 * libmicrohttpd, libyaml, libcrypt and GnuTLS, which no other command
 * should map (docs/cli.md, "The exporter program").
 *
 * Where the program is: only where this dlock's build or install put it,
 * found from the directory of this dlock's file as the kernel names it
 * (/proc/self/exe: no symbolic link, not argv[0]), the way dlock finds
 * the libdlock.so it runs on ($ORIGIN in its run path):
 *   - in the build tree (this dlock's directory is the one it was built
 *     in, DLOCK_CLI_BUILD_DIR: same device and inode), beside dlock;
 *   - installed, at DLOCK_CLI_EXEC_REL from dlock's directory (libexecdir/
 *     dlock from bindir: any prefix, also one given to cmake --install);
 *   - without /proc, in DLOCK_CLI_EXEC_DIR, the install prefix's.
 * Never by PATH, never from an environment variable: whoever can put a
 * program at one of these paths can already replace dlock itself or the
 * libdlock.so it loads from there.
 *
 * Passwords: dlock reads none of ARGS, so a password in a --store URI is
 * still in argv's bytes, and only there, when the exporter overwrites it
 * (cli_opt_value); execv passes the strings as they are, adding none.
 *
 * Without the program (a dlock built without libmicrohttpd, or its
 * exporter not installed), --help prints the usage and anything else says
 * what is missing, exit 69.
 */
#include "cli.h"
#include "cmd.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef DLOCK_CLI_EXPORTER

/* The exporter program's path into buf; 0, or -1 if it does not fit. */
static int exporter_path(char *buf, size_t cap)
{
    char dir[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", dir, sizeof(dir));
    char *slash = NULL;
    struct stat here, built;
    int w;

    if (n > 0 && (size_t)n < sizeof(dir)) { /* else: cut, or no /proc */
        dir[n] = '\0';
        slash = strrchr(dir, '/');
    }
    if (!slash) /* no /proc: where the install prefix puts it */
        w = snprintf(buf, cap, "%s/%s", DLOCK_CLI_EXEC_DIR,
                     DLOCK_CLI_EXPORTER);
    else {
        *slash = '\0'; /* the directory ("" for "/") */
        if (stat(dir[0] ? dir : "/", &here) == 0 &&
            stat(DLOCK_CLI_BUILD_DIR, &built) == 0 &&
            here.st_dev == built.st_dev && here.st_ino == built.st_ino)
            w = snprintf(buf, cap, "%s/%s", dir, DLOCK_CLI_EXPORTER);
        else
            w = snprintf(buf, cap, "%s/%s/%s", dir, DLOCK_CLI_EXEC_REL,
                         DLOCK_CLI_EXPORTER);
    }
    return w > 0 && (size_t)w < cap ? 0 : -1;
}

#endif

int cmd_exporter(int argc, char **argv)
{
#ifdef DLOCK_CLI_EXPORTER
    char path[PATH_MAX + 64];
    int err = ENAMETOOLONG;

    if (exporter_path(path, sizeof(path)) == 0) {
        argv[0] = path; /* argv[1..]: as given */
        execv(path, argv);
        err = errno;
    }
#endif
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(cli_exporter_usage, stdout);
            return 0;
        }
    }
#ifdef DLOCK_CLI_EXPORTER
    cli_err("exporter: cannot run the exporter program %s: %s (it comes "
            "with dlock: install it, or build dlock again)",
            err == ENAMETOOLONG ? "(path too long)" : path, strerror(err));
#else
    cli_err("exporter: this dlock was built without libmicrohttpd; install "
            "it (Debian: libmicrohttpd-dev) and build dlock again");
#endif
    return CLI_EX_UNAVAILABLE;
}
