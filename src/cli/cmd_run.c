/* SPDX-License-Identifier: MIT */
/*
 * cmd_run.c -- `dlock run [options] NAME [--] CMD [ARG...]`
 *
 * Acquire NAME, run CMD with DLOCK_NAME and DLOCK_TOKEN in its environment
 * while the client's watchdog keeps the lease renewed, release when every
 * process of CMD is gone, and exit with CMD's status.
 *
 * CMD runs under a supervisor process (tree.c): dlock and the supervisor
 * are child subreapers, so every process CMD starts stays in the tree that
 * dlock stops; if dlock dies, the supervisor SIGKILLs the tree. CMD gets
 * no descriptor dlock did not inherit, DLOCK_STORE without its
 * password, and none of the variables the store's password may come from
 * (docs/stores.md, "Passwords").
 *
 * Signals: after the lock is taken, dlock blocks INT/TERM/HUP/QUIT/CHLD and
 * reads them from a signalfd. Signals sent by a process (kill) are passed
 * on to CMD; those the terminal sends to the foreground process group
 * already reached CMD, so they are not sent twice.
 *
 * Losing the lock (docs/design.md, "Stopping the work before the lease
 * ends"): the client's at-risk margin is --kill-after + STOP_ALLOWANCE_MS.
 * The events (on the client's thread) go through a pipe to the main loop:
 * at AT_RISK every process of CMD gets SIGTERM, and SIGKILL comes by the
 * local lease end less STOP_ALLOWANCE_MS; SAFE calls the SIGKILL off; at
 * LOST (without AT_RISK first: the lock is gone already) SIGTERM, SIGKILL
 * after --kill-after, and dlock exits 76.
 */
#include "cli.h"
#include "cmd.h"
#include "run_opts.h"

#include <dlock.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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

#define DEFAULT_TTL_MS 10000
#define DEFAULT_KILL_AFTER_MS 5000
/* R: how long before the local lease end the SIGKILL is sent, for it to
 * take effect on a busy machine: this process's timer wake-up, the
 * message to the supervisor, its scan of /proc and the kernel delivering
 * SIGKILL (tens of milliseconds under load). docs/design.md. */
#define STOP_ALLOWANCE_MS 100

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
    const char *const *names; /* the set's (NAME first) */
    size_t nnames;
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
        char waited[32], held[32], left[32], line[700];
        /* what a store or a server said, and the name, escaped: this line
         * goes to a terminal (out.c) */
        char name[64], holder[84], why[304];
        const char *n0 = p->names[0];
        int irc = DLOCK_OK;
        /* the first lock of the set that is held (NAME's alone without
         * --also) */
        memset(&info, 0, sizeof(info));
        for (size_t i = 0; i < p->nnames; i++) {
            if (i)
                dlock_info_clear(&info);
            n0 = p->names[i];
            irc = dlock_inspect(p->c, n0, &info);
            if (irc != DLOCK_OK || info.held)
                break;
        }
        cli_escape(name, sizeof(name), n0, CLI_ESC_BACKSLASH);
        cli_format_duration(since_ms(&p->start), waited, sizeof(waited));
        if (irc == DLOCK_ECONN) {
            /* the wait rides it out (docs/design.md, "Waiting through
             * failovers and restarts"): say what it waits for; a
             * message that names a failover says so itself */
            cli_escape(why, sizeof(why), dlock_errmsg(), 0);
            snprintf(line, sizeof(line), "waiting %s for '%s': %s%s", waited,
                     name,
                     strstr(why, "failover in progress") ? ""
                                                         : "store "
                                                           "unreachable: ",
                     why);
        } else if (irc == DLOCK_OK) {
            if (info.held) {
                cli_format_duration(info.held_ms, held, sizeof(held));
                cli_format_duration(info.ttl_ms, left, sizeof(left));
                cli_escape(holder, sizeof(holder), info.holder,
                           CLI_ESC_BACKSLASH);
                snprintf(line, sizeof(line),
                         "waiting %s for '%s': held by %s for %s%s%s, "
                         "token %llu",
                         waited, name, holder, held,
                         info.ttl_ms >= 0 ? ", lease left " : "",
                         info.ttl_ms >= 0 ? left : "",
                         (unsigned long long)info.token);
            } else {
                snprintf(line, sizeof(line), "waiting %s for '%s': just freed",
                         waited, name);
            }
            dlock_info_clear(&info);
        } else {
            snprintf(line, sizeof(line), "waiting %s for '%s'", waited, name);
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

/* What the event callback (the client's thread) tells the main loop: one
 * write each, smaller than PIPE_BUF, so never torn. */
typedef struct run_note {
    int type;        /* DLOCK_EVENT_AT_RISK, SAFE or LOST */
    int64_t at_ms;   /* CLOCK_MONOTONIC when it came */
    int64_t left_ms; /* AT_RISK: the lease left */
    char why[400];
} run_note;

typedef struct ev_ctx {
    int fd; /* the pipe to the main loop (non-blocking) */
} ev_ctx;

static int64_t now_ms(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* The client's events (on its background thread): --warn-after's
 * long-hold line said here; the at-risk, safe and lost events passed to
 * the main loop. */
static void on_event(const dlock_event *e, void *arg)
{
    const ev_ctx *x = arg;

    if (e->type == DLOCK_EVENT_LONG_HOLD) {
        char held[32], line[1100], name[804];
        cli_format_duration(e->held_ms, held, sizeof(held));
        cli_escape(name, sizeof(name), e->name, CLI_ESC_BACKSLASH);
        int n = snprintf(line, sizeof(line),
                         "dlock: lock '%.800s' held for %s (--warn-after), "
                         "token %llu; the command still runs\n",
                         name, held, (unsigned long long)e->token);
        /* one write: whole, even beside the command's own output */
        if (n > 0 && write(STDERR_FILENO, line,
                           (size_t)n < sizeof(line) ? (size_t)n
                                                    : sizeof(line) - 1) < 0) {
            /* stderr is gone: nothing to tell */
        }
        return;
    }
    if (e->type != DLOCK_EVENT_AT_RISK && e->type != DLOCK_EVENT_SAFE &&
        e->type != DLOCK_EVENT_LOST)
        return;
    run_note n;
    memset(&n, 0, sizeof(n));
    n.type = e->type;
    n.at_ms = now_ms();
    n.left_ms = e->left_ms;
    snprintf(n.why, sizeof(n.why), "%s", e->why ? e->why : "");
    if (write(x->fd, &n, sizeof(n)) < 0) {
        /* the pipe is full (the main loop has 100 notes to read): the
         * release still says what happened */
    }
}

/* v without its secrets (dlock_uri_redact(): "redis://u:secret@h" ->
 * "redis://u@h", ":secret@h" -> "h", a secret query parameter left out).
 * Malloc'd; NULL out of memory. */
static char *without_password(const char *v)
{
    size_t n = dlock_uri_redact(v, DLOCK_REDACT_DROP, NULL, 0);
    char *r = malloc(n + 1);

    if (r)
        dlock_uri_redact(v, DLOCK_REDACT_DROP, r, n + 1);
    return r;
}

/* Is environ entry e NAME=...? */
static int env_is(const char *e, const char *name)
{
    size_t n = strlen(name);
    return strncmp(e, name, n) == 0 && e[n] == '=';
}

/* Variables the store's password may have come from (docs/stores.md,
 * "Passwords"), kept from CMD: dlock's own always, the ones of a store's
 * client library when `store` (dlock_client_store()) is of that kind. */
static int credential_var(const char *e, const char *store)
{
    static const struct {
        const char *var, *schemes; /* ' '-separated "scheme:" prefixes */
    } vars[] = {
        {"DLOCK_PASSWORD", ""},
        {"REDISCLI_AUTH", "redis: rediss: unix: redis-sentinel: "
                          "redis-cluster: redlock:"},
        {"PGPASSWORD", "postgres: postgresql:"},
        {"MYSQL_PWD", "mysql: mariadb:"},
    };
    size_t sl = strcspn(store, ":");

    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        if (!env_is(e, vars[i].var))
            continue;
        if (!vars[i].schemes[0])
            return 1;
        for (const char *p = vars[i].schemes; *p;) {
            size_t l = strcspn(p, " ");
            if (l == sl + 1 && !strncmp(p, store, sl + 1))
                return 1;
            p += l;
            p += strspn(p, " ");
        }
    }
    return 0;
}

/* environ plus DLOCK_NAME and DLOCK_TOKEN (replacing any earlier ones),
 * DLOCK_TOKENS when `tokens` is not NULL ("DLOCK_TOKENS=..." of --also),
 * DLOCK_STORE without its password, and none of the variables a password
 * of `store` may have come from. *ours: how many entries at its end are
 * its own (free_env()). */
static char **child_env(const char *name, uint64_t token, const char *tokens,
                        const char *store, size_t *ours)
{
    size_t n = 0, o = 0, k;
    char **env;

    while (environ[n])
        n++;
    env = calloc(n + 5, sizeof(*env));
    if (!env)
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (!env_is(environ[i], "DLOCK_NAME") &&
            !env_is(environ[i], "DLOCK_TOKEN") &&
            !env_is(environ[i], "DLOCK_TOKENS") &&
            !env_is(environ[i], "DLOCK_STORE") &&
            !credential_var(environ[i], store))
            env[o++] = environ[i];
    size_t nl = strlen(name) + 12;
    const char *dstore = getenv("DLOCK_STORE");
    int bad = 0;
    k = o;
    if ((env[k++] = malloc(nl)) != NULL)
        snprintf(env[k - 1], nl, "DLOCK_NAME=%s", name);
    else
        bad = 1;
    if ((env[k++] = malloc(40)) != NULL)
        snprintf(env[k - 1], 40, "DLOCK_TOKEN=%llu",
                 (unsigned long long)token);
    else
        bad = 1;
    if (tokens && !(env[k++] = strdup(tokens)))
        bad = 1;
    if (dstore) {
        char *clean = without_password(dstore);
        env[k++] = clean ? malloc(strlen(clean) + 13) : NULL;
        if (env[k - 1])
            sprintf(env[k - 1], "DLOCK_STORE=%s", clean);
        else
            bad = 1;
        free(clean);
    }
    env[k] = NULL;
    if (bad) {
        for (size_t i = o; i < k; i++)
            free(env[i]);
        free(env);
        return NULL;
    }
    *ours = k - o;
    return env;
}

/* "DLOCK_TOKENS=T1 T2 ..." of the set's handles (malloc'd), NULL when
 * out of memory. */
static char *tokens_var(dlock *const *set, size_t n)
{
    size_t cap = 16 + n * 21, len;
    char *v = malloc(cap);

    if (!v)
        return NULL;
    len = (size_t)snprintf(v, cap, "DLOCK_TOKENS=");
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(v + len, cap - len, "%s%llu", i ? " " : "",
                                (unsigned long long)dlock_token(set[i]));
    return v;
}

static void free_env(char **env, size_t ours)
{
    size_t n = 0;

    if (!env)
        return;
    while (env[n])
        n++;
    /* the last entries are ours */
    for (size_t i = 0; i < ours && i < n; i++)
        free(env[n - 1 - i]);
    free(env);
}

/* set: NAME's handle, then each --also's (o->nnames) */
static int take(dlock *const *set, const run_opts *o, int64_t wait_ms)
{
    if (o->elect)
        return dlock_campaign(set[0], o->value, wait_ms);
    if (o->nnames > 1)
        return dlock_acquire_all(set, o->nnames, wait_ms);
    return o->shared ? dlock_acquire_shared(set[0], wait_ms)
                     : dlock_acquire(set[0], wait_ms);
}

/* The run: the supervisor and its tree, the events, the kill timer. */
typedef struct run_state {
    const run_opts *o;
    cli_sup sup;
    int sfd, evfd;
    pid_t cmd;          /* CMD's pid, once started */
    int exec_errno;     /* the supervisor could not start CMD */
    int cmd_status;     /* its wait status, once cmd_done */
    int cmd_done, empty, sup_gone, sup_died, rep_eof;
    int lost, at_risk, term_sent, kill_sent;
    int risky;          /* holds at risk now (AT_RISK less SAFE events):
                         * with --also, one safe again is not the set */
    int64_t lease_end;  /* while at risk: the local lease end (ms) */
    int64_t kill_at;    /* when SIGKILL goes to the tree; 0: not armed */
    int64_t most_at;    /* --at-most: when CMD is stopped; 0: never */
    int at_most_hit;    /* ... and it was */
} run_state;

static void arm_kill(run_state *r, int64_t at)
{
    if (!r->kill_sent && (r->kill_at == 0 || at < r->kill_at))
        r->kill_at = at;
}

/* SIGTERM to every process of CMD now, SIGKILL at the latest at
 * `kill_by` (the kill timer). */
static void stop_tree(run_state *r, int64_t kill_by)
{
    if (r->empty)
        return; /* nothing runs any more */
    if (!r->term_sent && !r->kill_sent) {
        cli_sup_send(&r->sup, CLI_SUP_TERM, 0);
        r->term_sent = 1;
    }
    arm_kill(r, kill_by);
}

static void on_note(run_state *r, const run_note *n)
{
    char left[32], k[32];
    int64_t now = now_ms();
    int64_t ka = r->o->kill_after_ms;

    if (n->type == DLOCK_EVENT_AT_RISK && !r->lost) {
        int64_t end = n->at_ms + n->left_ms;
        if (!r->at_risk || end < r->lease_end)
            r->lease_end = end; /* the earliest of the set's */
        r->at_risk = 1;
        r->risky++;
        if (r->empty)
            return; /* nothing runs any more */
        /* SIGKILL by the lease end less R, and --kill-after after the
         * SIGTERM at the latest */
        int64_t by = r->lease_end - STOP_ALLOWANCE_MS;
        if (now + ka < by)
            by = now + ka;
        if (by < now)
            by = now;
        cli_format_duration(n->left_ms > 0 ? n->left_ms : 0, left,
                            sizeof(left));
        cli_format_duration(by - now, k, sizeof(k));
        if (r->kill_sent)
            cli_err("lock at risk: %s; lease left %s (the command's "
                    "processes were sent SIGKILL already)",
                    n->why, left);
        else
            cli_err("lock at risk: %s; lease left %s; stopping the "
                    "command (SIGTERM, SIGKILL in %s)",
                    n->why, left, k);
        stop_tree(r, by);
    } else if (n->type == DLOCK_EVENT_SAFE && r->at_risk && !r->lost &&
               --r->risky > 0) {
        /* another lock of the set is still at risk: its SIGKILL stands */
    } else if (n->type == DLOCK_EVENT_SAFE && r->at_risk && !r->lost) {
        r->at_risk = 0;
        if (!r->kill_sent && r->kill_at) {
            /* leftovers of a CMD that exited keep their own timer */
            r->kill_at = 0;
            if (r->cmd_done)
                r->kill_at = now + ka;
            cli_err("lock '%s' is safe again (a renewal got through): no "
                    "SIGKILL; the command, sent SIGTERM, ends as it will",
                    r->o->name);
        }
    } else if (n->type == DLOCK_EVENT_LOST && !r->lost) {
        r->lost = 1;
        if (r->empty)
            return; /* nothing runs any more */
        /* at risk before: the SIGKILL is due by the lease end already */
        int64_t by = r->at_risk && r->lease_end - STOP_ALLOWANCE_MS < now + ka
                         ? r->lease_end - STOP_ALLOWANCE_MS
                         : now + ka;
        if (by < now)
            by = now;
        cli_format_duration(by - now, k, sizeof(k));
        if (r->kill_sent)
            cli_err("lost the lock: %s (the command's processes were sent "
                    "SIGKILL already)",
                    n->why[0] ? n->why : "lease gone");
        else
            cli_err("lost the lock: %s; stopping the command (SIGTERM, "
                    "SIGKILL in %s)",
                    n->why[0] ? n->why : "lease gone", k);
        stop_tree(r, by);
    }
}

static void on_sup(run_state *r, const cli_sup_msg *m)
{
    char k[32];

    switch (m->type) {
    case CLI_SUP_STARTED:
        r->cmd = (pid_t)m->a;
        break;
    case CLI_SUP_EXECFAIL:
        r->exec_errno = m->a ? m->a : ENOENT;
        break;
    case CLI_SUP_EXITED:
        r->cmd_done = 1;
        r->cmd_status = m->a;
        if (m->b && !r->kill_sent) {
            /* its processes would run on without the lock */
            cli_format_duration(r->o->kill_after_ms, k, sizeof(k));
            if (!r->term_sent)
                cli_err("the command exited and left processes running; "
                        "stopping them (SIGTERM, SIGKILL in %s) before "
                        "the release",
                        k);
            stop_tree(r, now_ms() + r->o->kill_after_ms);
        }
        break;
    case CLI_SUP_EMPTY:
        r->empty = 1;
        break;
    }
}

/* dlock's own descendants, the supervisor gone (a subreaper gets its
 * orphans): SIGKILLed, again until none is left. */
static void kill_own_tree(void)
{
    for (;;) {
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        if (waitpid(-1, NULL, WNOHANG) < 0 && errno == ECHILD)
            return;
        cli_tree_signal(getpid(), SIGKILL);
        /* a death here, or the next round in 20 ms (design.md) */
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* Runs until every process of the tree is gone: signals passed on, the
 * supervisor's reports, the lock's events, the kill timer. Returns dlock's
 * exit code (the lock not yet released). */
static int run_tree(run_state *r)
{
    while (!r->sup_gone) {
        struct pollfd fds[3] = {{r->sfd, POLLIN, 0},
                                {r->rep_eof ? -1 : r->sup.rep, POLLIN, 0},
                                {r->evfd, POLLIN, 0}};
        int timeout = -1;

        int64_t wake = r->kill_at;
        if (r->most_at && !r->at_most_hit && (!wake || r->most_at < wake))
            wake = r->most_at;
        if (wake) {
            int64_t left = wake - now_ms();
            timeout = left > 0 ? (left > INT_MAX ? INT_MAX : (int)left) : 0;
        }
        if (poll(fds, 3, timeout) < 0 && errno != EINTR)
            return CLI_EX_SOFTWARE;

        if (fds[2].revents & POLLIN) {
            run_note n;
            while (read(r->evfd, &n, sizeof(n)) == (ssize_t)sizeof(n))
                on_note(r, &n);
        }
        if (fds[1].revents & (POLLIN | POLLHUP)) {
            cli_sup_msg m;
            ssize_t got;
            while ((got = read(r->sup.rep, &m, sizeof(m))) ==
                   (ssize_t)sizeof(m))
                on_sup(r, &m);
            if (got == 0) /* it exited: SIGCHLD comes */
                r->rep_eof = 1;
        }
        if (r->most_at && !r->at_most_hit && now_ms() >= r->most_at) {
            /* --at-most: stopped as for a lost lock */
            r->at_most_hit = 1;
            if (!r->empty) {
                char k[32], d[32];
                cli_format_duration(r->o->at_most_ms, d, sizeof(d));
                cli_format_duration(r->o->kill_after_ms, k, sizeof(k));
                cli_err("the command ran for --at-most %s; stopping it "
                        "(SIGTERM, SIGKILL in %s)",
                        d, k);
                stop_tree(r, now_ms() + r->o->kill_after_ms);
            }
        }
        if (r->kill_at && !r->kill_sent && now_ms() >= r->kill_at) {
            if (!r->empty)
                cli_err("the command's processes did not stop; sending "
                        "SIGKILL");
            cli_sup_send(&r->sup, CLI_SUP_KILL, 0);
            r->kill_sent = 1;
            r->kill_at = 0;
        }
        if (fds[0].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(r->sfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
                if (si.ssi_signo == SIGCHLD)
                    continue;
                /* the terminal's signals reached CMD's process group
                 * already; pass on those sent by a process */
                if (si.ssi_code != SI_KERNEL && !r->cmd_done)
                    cli_sup_send(&r->sup, CLI_SUP_SIGNAL, (int)si.ssi_signo);
            }
        }
        int status;
        pid_t w = waitpid(r->sup.pid, &status, WNOHANG);
        if (w == r->sup.pid) {
            r->sup_gone = 1;
            /* its last words are in the pipe still */
            cli_sup_msg m;
            while (read(r->sup.rep, &m, sizeof(m)) == (ssize_t)sizeof(m))
                on_sup(r, &m);
            if (!r->empty && !r->exec_errno) {
                /* killed (by someone): its tree is ours now (a subreaper
                 * gets the orphans) */
                r->sup_died = 1;
                if (WIFSIGNALED(status))
                    cli_err("the supervisor of the command died of signal "
                            "%d; killing every process of the command "
                            "(SIGKILL)",
                            WTERMSIG(status));
                else
                    cli_err("the supervisor of the command ended early; "
                            "killing every process of the command "
                            "(SIGKILL)");
                kill_own_tree();
            }
        }
    }
    if (r->exec_errno) {
        cli_err("cannot run '%s': %s", r->o->cmd[0],
                strerror(r->exec_errno));
        return r->exec_errno == ENOENT ? CLI_EX_NOTFOUND : CLI_EX_NOEXEC;
    }
    if (r->sup_died && !r->cmd_done)
        return CLI_EX_SOFTWARE;
    if (WIFEXITED(r->cmd_status))
        return WEXITSTATUS(r->cmd_status);
    if (WIFSIGNALED(r->cmd_status))
        return 128 + WTERMSIG(r->cmd_status);
    return CLI_EX_SOFTWARE;
}

static int run_main(int argc, char **argv, int elect)
{
    run_opts o;
    dlock_client *c = NULL;
    dlock *set[MAX_ALSO + 1] = {NULL}; /* NAME's handle, then --also's */
    dlock *l = NULL;
    dlock_options lo;
    int ev_pipe[2] = {-1, -1};
    ev_ctx evx;
    cli_fdset inherited;
    int rc, code, lost = 0;

    /* before anything of ours is open: what CMD may inherit */
    if (cli_fds_record(&inherited) != 0) {
        cli_err("out of memory");
        return CLI_EX_SOFTWARE;
    }
    code = cli_run_parse(argc, argv, &o, elect);
    if (code >= 0) {
        cli_fds_free(&inherited);
        return code;
    }

    if (pipe2(ev_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
        cli_err("pipe: %s", strerror(errno));
        cli_fds_free(&inherited);
        return CLI_EX_SOFTWARE;
    }
    rc = dlock_client_open(&c, o.store, NULL);
    if (rc != DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        code = cli_exit_for(rc);
        goto out;
    }

    /* --kill-after must fit in the lease: SIGKILL by the local lease end
     * less R, after a renewal had its chance (the store's at-risk limit) */
    int64_t max = 0;
    rc = dlock_client_at_risk_max(c, o.ttl_ms, &max);
    if (rc != DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        code = cli_exit_for(rc);
        goto out;
    }
    if (max != INT64_MAX) {
        /* (exact milliseconds: a rounded limit would refuse itself) */
        int64_t limit = max - STOP_ALLOWANCE_MS;
        if (limit < 0) {
            cli_err("%s: --ttl %lld ms is too short to stop the command "
                    "before its lease ends on this store: a renewal that "
                    "fails is known %lld ms before, and the command needs "
                    "%d ms to be gone (use a longer --ttl)",
                    o.who, (long long)o.ttl_ms, (long long)max, STOP_ALLOWANCE_MS);
            code = CLI_EX_USAGE;
            goto out;
        }
        if (o.kill_after_set && o.kill_after_ms > limit) {
            cli_err("%s: --kill-after %lld ms does not fit in --ttl %lld "
                    "ms on this store: at most %lld ms (the SIGKILL must "
                    "land %d ms before the lease ends, and a renewal needs "
                    "its chance first; see dlock help run)",
                    o.who, (long long)o.kill_after_ms, (long long)o.ttl_ms,
                    (long long)limit, STOP_ALLOWANCE_MS);
            code = CLI_EX_USAGE;
            goto out;
        }
        if (o.kill_after_ms > limit)
            o.kill_after_ms = limit;
    }
    evx.fd = ev_pipe[1];
    /* within the library's limit: a --kill-after of 365d on a store
     * without leases (no at-risk event there) would pass it by R */
    int64_t margin = o.kill_after_ms + STOP_ALLOWANCE_MS;
    if (margin > DLOCK_TTL_MAX)
        margin = DLOCK_TTL_MAX;
    if ((rc = dlock_client_set_events(c, on_event, &evx,
                                      o.warn_after_ms)) != DLOCK_OK ||
        (rc = dlock_client_set_at_risk(c, margin)) != DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        code = cli_exit_for(rc);
        goto out;
    }
    memset(&lo, 0, sizeof(lo));
    lo.ttl_ms = o.ttl_ms;
    lo.flags = o.fair ? DLOCK_FAIR : 0;
    lo.permits = o.permits;
    lo.at_least_ms = o.at_least_ms;
    for (size_t i = 0; i < o.nnames; i++) {
        rc = dlock_open(&set[i], c, o.names[i], &lo);
        if (rc != DLOCK_OK) {
            cli_err("%s", dlock_errmsg());
            code = cli_exit_for(rc);
            goto out;
        }
    }
    l = set[0];

again:;
    /* --- wait --- */
    struct sigaction sa, old_int, old_term, old_hup;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal_while_waiting;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    sigaction(SIGHUP, &sa, &old_hup);

    struct timespec tried;
    clock_gettime(CLOCK_MONOTONIC, &tried);
    rc = take(set, &o, 0);
    /* the wait follows a try that found the lock held, and one that found
     * the store unreachable too (a failover, a restart: the wait rides it
     * out, docs/design.md "Waiting through failovers and restarts"); the
     * try's time counts against --wait */
    int64_t left = o.wait_ms < 0 ? -1 : o.wait_ms - since_ms(&tried);
    if ((rc == DLOCK_EBUSY || (rc == DLOCK_ECONN && left > 0)) &&
        o.wait_ms != 0) {
        progress p;
        pthread_t t;
        int shown = 0;

        memset(&p, 0, sizeof(p));
        p.c = c;
        p.names = o.names;
        p.nnames = o.nnames;
        clock_gettime(CLOCK_MONOTONIC, &p.start);
        pthread_mutex_init(&p.mu, NULL);
        pthread_cond_init(&p.cv, NULL);
        if (!o.quiet && isatty(STDERR_FILENO) &&
            pthread_create(&t, NULL, progress_main, &p) == 0)
            shown = 1;
        rc = take(set, &o, left < 0 ? -1 : left > 0 ? left : 1);
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
        if (rc == DLOCK_EBUSY && o.nnames > 1) {
            char d[32];
            cli_format_duration(o.wait_ms, d, sizeof(d));
            cli_err("%s; gave up after %s", dlock_errmsg(),
                    o.wait_ms ? d : "one try");
        } else if (rc == DLOCK_EBUSY) {
            char d[32];
            cli_format_duration(o.wait_ms, d, sizeof(d));
            cli_err("%s '%s' is held by another %s; gave up after %s",
                    o.elect ? "election" : "lock", o.name,
                    o.elect ? "leader" : "owner", o.wait_ms ? d : "one try");
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
    /* a message to a supervisor that has just exited must not kill us:
     * SIGPIPE ignored while CMD runs (CMD gets the caller's disposition
     * back before its exec) */
    struct sigaction ign, old_pipe;
    memset(&ign, 0, sizeof(ign));
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, &old_pipe);
    int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
    char *tokens = o.nnames > 1 ? tokens_var(set, o.nnames) : NULL;
    size_t env_ours = 0;
    char **env = o.nnames > 1 && !tokens
                     ? NULL
                     : child_env(o.name, dlock_token(l), tokens,
                                 dlock_client_store(c), &env_ours);
    free(tokens);
    cli_spawn sp;
    run_state r;
    int started = 0;

    memset(&sp, 0, sizeof(sp));
    memset(&r, 0, sizeof(r));
    r.o = &o;
    r.most_at = o.at_most_ms ? now_ms() + o.at_most_ms : 0;
    r.sfd = sfd;
    r.evfd = ev_pipe[0];
    r.sup.ctl = r.sup.rep = -1;
    /* orphans of the tree come to us, never to init, should the
     * supervisor die */
    if (sfd < 0 || !env ||
        cli_spawn_prepare(&sp, o.cmd, env, &inherited, &old_pipe) != 0 ||
        prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
        cli_err("cannot prepare the command: %s", strerror(errno));
        code = CLI_EX_SOFTWARE;
    } else if (cli_sup_start(&sp, &r.sup) != 0) {
        cli_err("cannot start the command's supervisor: %s",
                strerror(errno));
        code = CLI_EX_SOFTWARE;
    } else {
        started = 1;
        code = run_tree(&r);
        lost = r.lost;
    }
    if (r.sup.ctl >= 0)
        close(r.sup.ctl);
    if (r.sup.rep >= 0)
        close(r.sup.rep);
    cli_spawn_free(&sp);
    free_env(env, env_ours);
    if (sfd >= 0)
        close(sfd);

    rc = o.nnames > 1 ? dlock_release_all(set, o.nnames)
         : o.elect    ? dlock_resign(l)
                      : dlock_release(l);
    if (rc == DLOCK_ELOST && !lost) {
        cli_err("lock '%s' was lost before the command finished: %s",
                o.name, dlock_errmsg());
        lost = 1;
    } else if (rc != DLOCK_OK && rc != DLOCK_ELOST) {
        cli_err("release: %s (the lease will expire by itself)",
                dlock_errmsg());
    }
    /* stopped because of the lock: lost, or at risk and never safe again
     * and the release could not tell (the store did not answer) */
    if (!lost && r.at_risk && rc != DLOCK_OK && started) {
        cli_err("lock '%s' was at risk and its release got no answer: "
                "taken as lost",
                o.name);
        lost = 1;
    }
    if (lost && started && !r.exec_errno)
        code = CLI_EX_LOST;
    else if (r.at_most_hit && started && !r.exec_errno)
        code = CLI_EX_AT_MOST;
    sigaction(SIGPIPE, &old_pipe, NULL);
    sigprocmask(SIG_SETMASK, &oldmask, NULL);
    /* dlock elect --again: the leadership was lost, CMD stopped: campaign
     * again (a command that ended by itself ends the election) */
    if (o.again && code == CLI_EX_LOST) {
        cli_err("election '%s': leadership lost; campaigning again",
                o.name);
        lost = 0;
        goto again;
    }

out:
    for (size_t i = 0; i < o.nnames; i++)
        dlock_close(set[i]);
    dlock_client_close(c);
    close(ev_pipe[0]);
    close(ev_pipe[1]);
    cli_fds_free(&inherited);
    return code;
}

int cmd_run(int argc, char **argv)
{
    return run_main(argc, argv, 0);
}

int cmd_elect(int argc, char **argv)
{
    return run_main(argc, argv, 1);
}
