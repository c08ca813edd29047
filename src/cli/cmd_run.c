/* SPDX-License-Identifier: MIT */
/*
 * cmd_run.c -- `dlock run [options] NAME [--] CMD [ARG...]`
 *
 * Acquire NAME, run CMD with DLOCK_NAME and DLOCK_TOKEN in its environment
 * while the client's watchdog keeps the lease renewed, release when CMD
 * exits, and exit with CMD's status.
 *
 * Signals: after the lock is taken, dlock blocks INT/TERM/HUP/QUIT/CHLD and
 * reads them from a signalfd. Signals sent by a process (kill) are passed
 * on to CMD; those the terminal sends to the foreground process group
 * already reached CMD, so they are not sent twice. CMD gets SIGTERM if dlock
 * itself dies (PR_SET_PDEATHSIG).
 *
 * Loss: the lost-lock callback (on the client's thread) writes to a pipe;
 * the main loop then sends CMD SIGTERM, and SIGKILL after --kill-after, and
 * dlock exits 76.
 */
#include "cli.h"

#include <dlock.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static const char run_usage[] =
    "usage: dlock run [options] NAME [--] CMD [ARG...]\n"
    "\n"
    "Runs CMD while holding lock NAME; the lease is renewed while CMD runs,\n"
    "and the lock released when it exits. CMD sees DLOCK_NAME and\n"
    "DLOCK_TOKEN (the fencing token) in its environment.\n"
    "\n"
    "  --store URI        the store (default: $DLOCK_STORE, else lock files\n"
    "                     in ~/.local/state/dlock, ~ being your home in the\n"
    "                     passwd entry whatever $HOME says)\n"
    "  --wait DUR         give up after DUR (default: forever; 0: one try)\n"
    "  --ttl DUR          lease length (default 10s; renewed every DUR/3)\n"
    "  --fair             first come, first served\n"
    "  --shared           a shared (read) hold: other --shared runs of NAME\n"
    "                     run alongside; a plain run waits for them all\n"
    "  --permits N        NAME is a semaphore of N permits: at most N runs\n"
    "                     at once (every run of NAME must say the same N)\n"
    "  --kill-after DUR   after losing the lock, SIGKILL CMD this long after\n"
    "                     SIGTERM (default 5s)\n"
    "  --warn-after DUR   say on stderr, once, when the lock has been held\n"
    "                     for DUR (CMD keeps running)\n"
    "  --quiet            no progress line while waiting\n"
    "\n"
    "DUR: 500ms, 30s, 2m, 1h, 1.5s; a bare number is seconds.\n"
    "\n"
    "Exit status: CMD's own, or 128+N if it died of signal N;\n"
    "  64 usage, 69 store error, 75 not acquired within --wait,\n"
    "  76 lock lost while CMD ran (CMD was terminated), 126/127 CMD could\n"
    "  not be run.\n";

#define DEFAULT_TTL_MS 10000
#define DEFAULT_KILL_AFTER_MS 5000

/* ------------------------------------------------------------------------ */
/* While waiting: one updating line on a terminal; Ctrl-C exits at once.    */
/* ------------------------------------------------------------------------ */

static volatile sig_atomic_t line_shown;

static void on_signal_while_waiting(int sig)
{
    static const char clear[] = "\r\033[K";

    if (line_shown && write(STDERR_FILENO, clear, sizeof(clear) - 1) < 0)
        _exit(128 + sig);
    _exit(128 + sig);
}

typedef struct progress {
    dlock_client *c;
    const char *name;
    struct timespec start;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
} progress;

static int64_t since_ms(const struct timespec *t0)
{
    struct timespec now;

    clock_gettime(CLOCK_MONOTONIC, &now);
    return (int64_t)(now.tv_sec - t0->tv_sec) * 1000 +
           (now.tv_nsec - t0->tv_nsec) / 1000000;
}

static void *progress_main(void *arg)
{
    progress *p = arg;

    pthread_mutex_lock(&p->mu);
    for (;;) {
        /* the condition variable is on the default clock (realtime):
         * a monotonic time here lay decades in the past, and the line
         * was redrawn, with a dlock_inspect() round trip (or, with the
         * store down, a connect), as fast as they came back */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 1;
        while (!p->stop &&
               pthread_cond_timedwait(&p->cv, &p->mu, &until) != ETIMEDOUT)
            ;
        if (p->stop)
            break;
        pthread_mutex_unlock(&p->mu);

        dlock_info info;
        char waited[32], held[32], left[32], line[512];
        cli_format_duration(since_ms(&p->start), waited, sizeof(waited));
        int irc = dlock_inspect(p->c, p->name, &info);
        if (irc == DLOCK_ECONN) {
            /* the wait rides it out (docs/design.md, "Waiting through
             * failovers and restarts"): say what it waits for; a
             * message that names a failover says so itself */
            const char *why = dlock_errmsg();
            snprintf(line, sizeof(line), "waiting %s for '%.60s': %s%.300s",
                     waited, p->name,
                     strstr(why, "failover in progress") ? ""
                                                         : "store "
                                                           "unreachable: ",
                     why);
        } else if (irc == DLOCK_OK) {
            if (info.held) {
                cli_format_duration(info.held_ms, held, sizeof(held));
                cli_format_duration(info.ttl_ms, left, sizeof(left));
                snprintf(line, sizeof(line),
                         "waiting %s for '%.60s': held by %.80s for %s%s%s, "
                         "token %llu",
                         waited, p->name, info.holder, held,
                         info.ttl_ms >= 0 ? ", lease left " : "",
                         info.ttl_ms >= 0 ? left : "",
                         (unsigned long long)info.token);
            } else {
                snprintf(line, sizeof(line),
                         "waiting %s for '%.60s': just freed", waited,
                         p->name);
            }
            dlock_info_clear(&info);
        } else {
            snprintf(line, sizeof(line), "waiting %s for '%.60s'", waited,
                     p->name);
        }
        pthread_mutex_lock(&p->mu);
        if (p->stop)
            break;
        fprintf(stderr, "\r\033[Kdlock: %s", line);
        fflush(stderr);
        line_shown = 1;
    }
    if (line_shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        line_shown = 0;
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* While CMD runs                                                           */
/* ------------------------------------------------------------------------ */

/* What the lost-lock callback (client thread) tells the main loop. The
 * message is written before the pipe byte, so reading the byte orders it. */
typedef struct lost_note {
    int fd;
    char why[256];
} lost_note;

static void on_lost(dlock *l, uint64_t token, void *arg)
{
    lost_note *n = arg;
    char b = 1;

    (void)l;
    (void)token;
    snprintf(n->why, sizeof(n->why), "%s", dlock_errmsg());
    if (write(n->fd, &b, 1) < 0) {
        /* the pipe is non-blocking and one byte is enough */
    }
}

/* environ plus DLOCK_NAME and DLOCK_TOKEN (replacing any earlier ones). */
static char **child_env(const char *name, uint64_t token)
{
    size_t n = 0, o = 0;
    char **env;

    while (environ[n])
        n++;
    env = calloc(n + 3, sizeof(*env));
    if (!env)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "DLOCK_NAME=", 11) &&
            strncmp(environ[i], "DLOCK_TOKEN=", 12))
            env[o++] = environ[i];
    size_t nl = strlen(name) + 12;
    env[o] = malloc(nl);
    env[o + 1] = malloc(40);
    if (!env[o] || !env[o + 1]) {
        free(env[o]);
        free(env[o + 1]);
        free(env);
        return NULL;
    }
    snprintf(env[o], nl, "DLOCK_NAME=%s", name);
    snprintf(env[o + 1], 40, "DLOCK_TOKEN=%llu", (unsigned long long)token);
    env[o + 2] = NULL;
    return env;
}

static void free_env(char **env)
{
    size_t n = 0;

    if (!env)
        return;
    while (env[n])
        n++;
    /* the last two entries are ours */
    if (n >= 2) {
        free(env[n - 1]);
        free(env[n - 2]);
    }
    free(env);
}

/* Starts CMD; returns its pid, or -1 with *exec_errno set. */
static pid_t spawn(char **cmd, char **env, int *exec_errno)
{
    int errpipe[2];
    pid_t parent = getpid(), pid;
    int err = 0;

    if (pipe2(errpipe, O_CLOEXEC) != 0) {
        *exec_errno = errno;
        return -1;
    }
    pid = fork();
    if (pid < 0) {
        *exec_errno = errno;
        close(errpipe[0]);
        close(errpipe[1]);
        return -1;
    }
    if (pid == 0) {
        sigset_t none;
        close(errpipe[0]);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(CLI_EX_LOST);
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execvpe(cmd[0], cmd, env);
        err = errno;
        if (write(errpipe[1], &err, sizeof(err)) < 0)
            _exit(CLI_EX_NOTFOUND);
        _exit(CLI_EX_NOTFOUND);
    }
    close(errpipe[1]);
    ssize_t got;
    do
        got = read(errpipe[0], &err, sizeof(err));
    while (got < 0 && errno == EINTR);
    close(errpipe[0]);
    if (got == (ssize_t)sizeof(err)) {
        waitpid(pid, NULL, 0);
        *exec_errno = err;
        return -1;
    }
    return pid;
}

/* --warn-after: the client's long-hold event (on its background thread),
 * said once on stderr. */
static void on_event(const dlock_event *e, void *arg)
{
    char held[32], line[700];
    const char *name = e->name;
    int n;

    (void)arg;
    if (e->type != DLOCK_EVENT_LONG_HOLD)
        return;
    cli_format_duration(e->held_ms, held, sizeof(held));
    n = snprintf(line, sizeof(line),
                 "dlock: lock '%.200s' held for %s (--warn-after), token "
                 "%llu; the command still runs\n",
                 name, held, (unsigned long long)e->token);
    /* one write: whole, even beside the command's own output */
    if (n > 0 && write(STDERR_FILENO, line,
                       (size_t)n < sizeof(line) ? (size_t)n
                                                : sizeof(line) - 1) < 0) {
        /* stderr is gone: nothing to tell */
    }
}

typedef struct run_opts {
    const char *store;
    const char *name;
    char **cmd;
    int64_t ttl_ms, wait_ms, kill_after_ms, warn_after_ms;
    int fair, quiet, shared;
    unsigned permits;
} run_opts;

static int parse(int argc, char **argv, run_opts *o)
{
    int i, r;

    memset(o, 0, sizeof(*o));
    o->ttl_ms = DEFAULT_TTL_MS;
    o->wait_ms = -1;
    o->kill_after_ms = DEFAULT_KILL_AFTER_MS;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(run_usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--fair")) {
            o->fair = 1;
            continue;
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
                    cli_err("run: --permits must be a whole number from 1 "
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
        if ((r = cli_opt_value(argc, argv, &i, "--ttl", &v)) != 0) {
            if (r < 0 || cli_parse_duration(v, &o->ttl_ms, 0) != 0 ||
                o->ttl_ms <= 0) {
                if (r > 0)
                    cli_err("run: --ttl must be a positive duration like "
                            "10s or 500ms, not '%s'",
                            v);
                return CLI_EX_USAGE;
            }
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--wait", &v)) != 0) {
            if (r < 0 || cli_parse_duration(v, &o->wait_ms, 1) != 0) {
                if (r > 0)
                    cli_err("run: --wait must be a duration like 30s, 0 "
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
                    cli_err("run: --warn-after must be a positive duration "
                            "like 10m or 30s, not '%s'",
                            v);
                return CLI_EX_USAGE;
            }
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--kill-after", &v)) != 0) {
            if (r < 0 || cli_parse_duration(v, &o->kill_after_ms, 0) != 0) {
                if (r > 0)
                    cli_err("run: --kill-after must be a duration, not "
                            "'%s'",
                            v);
                return CLI_EX_USAGE;
            }
            continue;
        }
        if (!strcmp(a, "--")) { /* end of options: NAME may start with - */
            i++;
            break;
        }
        if (a[0] == '-' && strcmp(a, "-") != 0) {
            cli_err("run: unknown option '%s' (see dlock help run)", a);
            return CLI_EX_USAGE;
        }
        break;
    }
    if (i >= argc) {
        fputs(run_usage, stderr);
        return CLI_EX_USAGE;
    }
    o->name = argv[i++];
    if (i < argc && !strcmp(argv[i], "--"))
        i++;
    if (i >= argc) {
        cli_err("run: no command given (dlock run NAME -- CMD [ARG...])");
        return CLI_EX_USAGE;
    }
    o->cmd = argv + i;
    if (o->shared && o->permits) {
        cli_err("run: --shared and --permits do not go together (a "
                "semaphore's permits are all alike)");
        return CLI_EX_USAGE;
    }
    return -1; /* go on */
}

static int take(dlock *l, const run_opts *o, int64_t wait_ms)
{
    return o->shared ? dlock_acquire_shared(l, wait_ms)
                     : dlock_acquire(l, wait_ms);
}

/* Waits for CMD, forwarding signals and reacting to loss. Returns the exit
 * code dlock should use, and whether the lock was lost in *lost. */
static int supervise(pid_t child, int sfd, int lost_fd, const lost_note *n,
                     run_opts *o, int *lost)
{
    struct timespec kill_at = {0, 0};
    int killed = 0;

    for (;;) {
        struct pollfd fds[2] = {{sfd, POLLIN, 0}, {lost_fd, POLLIN, 0}};
        int timeout = -1;

        if (*lost && !killed) {
            int64_t left = -since_ms(&kill_at);
            timeout = left > 0 ? (int)left : 0;
        }
        if (poll(fds, 2, timeout) < 0 && errno != EINTR)
            return CLI_EX_SOFTWARE;

        if (fds[1].revents & POLLIN) {
            char b[16];
            if (read(lost_fd, b, sizeof(b)) > 0 && !*lost) {
                *lost = 1;
                cli_err("lost the lock: %s; stopping the command "
                        "(SIGTERM)",
                        n->why[0] ? n->why : "lease gone");
                kill(child, SIGTERM);
                clock_gettime(CLOCK_MONOTONIC, &kill_at);
                kill_at.tv_sec += o->kill_after_ms / 1000;
                kill_at.tv_nsec += (o->kill_after_ms % 1000) * 1000000;
                if (kill_at.tv_nsec >= 1000000000) {
                    kill_at.tv_sec++;
                    kill_at.tv_nsec -= 1000000000;
                }
            }
        }
        if (*lost && !killed && since_ms(&kill_at) >= 0) {
            cli_err("the command did not stop; sending SIGKILL");
            kill(child, SIGKILL);
            killed = 1;
        }
        if (fds[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
                if (si.ssi_signo == SIGCHLD)
                    continue;
                /* the terminal's signals reached CMD's process group
                 * already; pass on those sent by a process */
                if (si.ssi_code != SI_KERNEL)
                    kill(child, (int)si.ssi_signo);
            }
        }
        int status;
        pid_t w = waitpid(child, &status, WNOHANG);
        if (w == child) {
            if (WIFEXITED(status))
                return WEXITSTATUS(status);
            if (WIFSIGNALED(status))
                return 128 + WTERMSIG(status);
            return CLI_EX_SOFTWARE;
        }
    }
}

int cmd_run(int argc, char **argv)
{
    run_opts o;
    dlock_client *c = NULL;
    dlock *l = NULL;
    dlock_options lo;
    int lost_pipe[2] = {-1, -1};
    lost_note note;
    int rc, code, lost = 0;

    code = parse(argc, argv, &o);
    if (code >= 0)
        return code;

    if (pipe2(lost_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        cli_err("pipe: %s", strerror(errno));
        return CLI_EX_SOFTWARE;
    }
    rc = dlock_client_open(&c, o.store, NULL);
    if (rc != DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        code = cli_exit_for(rc);
        goto out;
    }
    memset(&lo, 0, sizeof(lo));
    lo.ttl_ms = o.ttl_ms;
    lo.flags = o.fair ? DLOCK_FAIR : 0;
    lo.permits = o.permits;
    lo.on_lost = on_lost;
    if (o.warn_after_ms > 0 &&
        (rc = dlock_client_set_events(c, on_event, NULL, o.warn_after_ms)) !=
            DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        code = cli_exit_for(rc);
        goto out;
    }
    memset(&note, 0, sizeof(note));
    note.fd = lost_pipe[1];
    lo.on_lost_arg = &note;
    rc = dlock_open(&l, c, o.name, &lo);
    if (rc != DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        code = cli_exit_for(rc);
        goto out;
    }

    /* --- wait --- */
    struct sigaction sa, old_int, old_term, old_hup;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal_while_waiting;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);

    rc = take(l, &o, 0);
    if (rc == DLOCK_EBUSY && o.wait_ms != 0) {
        progress p;
        pthread_t t;
        int shown = 0;

        memset(&p, 0, sizeof(p));
        p.c = c;
        p.name = o.name;
        clock_gettime(CLOCK_MONOTONIC, &p.start);
        pthread_mutex_init(&p.mu, NULL);
        pthread_cond_init(&p.cv, NULL);
        if (!o.quiet && isatty(STDERR_FILENO) &&
            pthread_create(&t, NULL, progress_main, &p) == 0)
            shown = 1;
        rc = take(l, &o, o.wait_ms);
        if (shown) {
            pthread_mutex_lock(&p.mu);
            p.stop = 1;
            pthread_cond_signal(&p.cv);
            pthread_mutex_unlock(&p.mu);
            pthread_join(t, NULL);
        }
        pthread_cond_destroy(&p.cv);
        pthread_mutex_destroy(&p.mu);
    }
    if (rc != DLOCK_OK) {
        if (rc == DLOCK_EBUSY) {
            char d[32];
            cli_format_duration(o.wait_ms, d, sizeof(d));
            cli_err("lock '%s' is held by another owner; gave up after %s",
                    o.name, o.wait_ms ? d : "one try");
        } else {
            cli_err("%s", dlock_errmsg());
        }
        code = cli_exit_for(rc);
        goto out;
    }

    /* --- run --- */
    sigset_t mask, oldmask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGHUP);
    sigaddset(&mask, SIGQUIT);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, &oldmask);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    sigaction(SIGHUP, &old_hup, NULL);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    char **env = child_env(o.name, dlock_token(l));
    int exec_errno = 0;
    pid_t child = -1;

    if (sfd < 0 || !env) {
        cli_err("cannot prepare the command: %s", strerror(errno));
        code = CLI_EX_SOFTWARE;
    } else {
        child = spawn(o.cmd, env, &exec_errno);
        if (child < 0) {
            cli_err("cannot run '%s': %s", o.cmd[0], strerror(exec_errno));
            code = exec_errno == ENOENT ? CLI_EX_NOTFOUND : CLI_EX_NOEXEC;
        } else {
            code = supervise(child, sfd, lost_pipe[0], &note, &o, &lost);
        }
    }
    free_env(env);
    if (sfd >= 0)
        close(sfd);

    rc = dlock_release(l);
    if (rc == DLOCK_ELOST && !lost) {
        cli_err("lock '%s' was lost before the command finished: %s",
                o.name, dlock_errmsg());
        lost = 1;
    } else if (rc != DLOCK_OK && rc != DLOCK_ELOST) {
        cli_err("release: %s (the lease will expire by itself)",
                dlock_errmsg());
    }
    if (lost && child > 0)
        code = CLI_EX_LOST;
    sigprocmask(SIG_SETMASK, &oldmask, NULL);

out:
    dlock_close(l);
    dlock_client_close(c);
    close(lost_pipe[0]);
    close(lost_pipe[1]);
    return code;
}
