/* SPDX-License-Identifier: MIT */
/*
 * tree.c -- `dlock run`'s command tree: the supervisor process between
 * dlock and CMD, the whole tree found and signalled, the descriptors CMD
 * may inherit (docs/design.md, "Stopping the work before the lease ends").
 *
 *     dlock (child subreaper: the lock, the library's threads)
 *       └─ supervisor (child subreaper, one thread; forked, no exec)
 *            └─ CMD (PR_SET_PDEATHSIG SIGKILL) └─ its descendants
 *
 * Every orphan of the tree is reparented to the supervisor (to dlock once
 * the supervisor is gone), so the tree is the descendants of either. The
 * supervisor does what dlock says over a pipe (pass a signal to CMD, SIGTERM
 * or SIGKILL the tree), tells dlock what happened over another, and when
 * dlock dies (the control pipe's end of file) SIGKILLs the tree until it is
 * empty. Policy (when to stop the tree) is dlock's (cmd_run.c).
 *
 * Everything the supervisor and CMD's child run after the fork is
 * async-signal-safe (dlock has threads, whose locks a fork copies held):
 * raw system calls, no allocation, no stdio. What they need (the argument
 * and environment vectors, CMD's candidate paths on PATH, the inherited
 * descriptors) is prepared before the fork.
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Descriptors                                                              */
/* ------------------------------------------------------------------------ */

static int by_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

int cli_fds_record(cli_fdset *set)
{
    int cap = 16;
    DIR *d;

    memset(set, 0, sizeof(*set));
    set->fd = malloc((size_t)cap * sizeof(int));
    if (!set->fd)
        return -1;
    d = opendir("/proc/self/fd");
    if (d) {
        struct dirent *e;
        int self = dirfd(d);
        while ((e = readdir(d)) != NULL) {
            char *end;
            long fd = strtol(e->d_name, &end, 10);
            if (e->d_name[0] < '0' || e->d_name[0] > '9' || *end ||
                fd <= 2 || fd == self || fd > INT32_MAX)
                continue;
            if (set->n == cap) {
                int *nf = realloc(set->fd, (size_t)cap * 2 * sizeof(int));
                if (!nf) {
                    closedir(d);
                    return -1;
                }
                set->fd = nf;
                cap *= 2;
            }
            set->fd[set->n++] = (int)fd;
        }
        closedir(d);
    } else {
        /* no /proc: ask each descriptor up to the limit (65536 at most) */
        struct rlimit rl;
        long max = 1024;
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
            max = (long)rl.rlim_cur;
        if (max > 65536)
            max = 65536;
        for (int fd = 3; fd < max; fd++) {
            if (fcntl(fd, F_GETFD) < 0)
                continue;
            if (set->n == cap) {
                int *nf = realloc(set->fd, (size_t)cap * 2 * sizeof(int));
                if (!nf)
                    return -1;
                set->fd = nf;
                cap *= 2;
            }
            set->fd[set->n++] = fd;
        }
    }
    qsort(set->fd, (size_t)set->n, sizeof(int), by_int);
    return 0;
}

void cli_fds_free(cli_fdset *set)
{
    free(set->fd);
    memset(set, 0, sizeof(*set));
}

/* Closes [lo, hi]: close_range, or one by one where the kernel lacks it
 * (async-signal-safe). */
static void close_span(unsigned lo, unsigned hi)
{
    if (lo > hi)
        return;
#ifdef SYS_close_range
    if (syscall(SYS_close_range, lo, hi, 0) == 0)
        return;
#endif
    /* no close_range (Linux < 5.9): the descriptors that exist, up to
     * the limit */
    struct rlimit rl;
    unsigned max = 65536;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < max)
        max = (unsigned)rl.rlim_cur;
    for (unsigned fd = lo; fd <= hi && fd < max; fd++)
        close((int)fd);
}

/* Closes every descriptor above 2 but the inherited ones and keep[0..nk)
 * (async-signal-safe): the gaps between them, in order. */
static void close_others(const cli_fdset *inh, const int *keep, int nk)
{
    unsigned lo = 3;
    int i = 0;

    for (;;) {
        int next = -1;
        while (i < inh->n && inh->fd[i] < (int)lo)
            i++;
        if (i < inh->n)
            next = inh->fd[i];
        for (int j = 0; j < nk; j++)
            if (keep[j] >= (int)lo && (next < 0 || keep[j] < next))
                next = keep[j];
        if (next < 0)
            break;
        if ((unsigned)next > lo)
            close_span(lo, (unsigned)next - 1);
        lo = (unsigned)next + 1;
    }
    close_span(lo, ~0U);
}

/* ------------------------------------------------------------------------ */
/* The tree                                                                 */
/* ------------------------------------------------------------------------ */

#define SCAN_MAX 65536

/* Decimal digits of s into a non-negative int; -1 if not all digits. */
static long parse_pid(const char *s)
{
    long v = 0;

    if (!*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > 100000000)
            return -1;
        v = v * 10 + (*s - '0');
    }
    return v;
}

/* The parent of process pid from /proc/PID/stat; -1 if gone. */
static long parent_of(long pid)
{
    char path[40], buf[512];
    int o = 0, fd;
    char digits[24];
    long p = pid;

    /* "/proc/" PID "/stat", without snprintf */
    memcpy(path, "/proc/", 6);
    o = 6;
    int nd = 0;
    do {
        digits[nd++] = (char)('0' + p % 10);
        p /= 10;
    } while (p && nd < 20);
    while (nd)
        path[o++] = digits[--nd];
    memcpy(path + o, "/stat", 6);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    /* "PID (COMM) S PPID ...": COMM may hold anything, so after the last
     * ')' */
    char *rp = NULL;
    for (char *q = buf; *q; q++)
        if (*q == ')')
            rp = q;
    if (!rp || rp[1] != ' ' || !rp[2] || rp[3] != ' ')
        return -1;
    long ppid = 0;
    for (char *q = rp + 4; *q >= '0' && *q <= '9'; q++)
        ppid = ppid * 10 + (*q - '0');
    return ppid;
}

struct linux_dirent64_ {
    unsigned long long d_ino;
    long long d_off;
    unsigned short d_reclen;
    unsigned char d_type;
    char d_name[];
};

int cli_tree_signal(pid_t root, int sig)
{
    /* every process's parent, then the descendants of root: a process
     * is one when its parent is root or one already found (repeated until
     * nothing is added: as many passes as the tree is deep) */
    int pid[SCAN_MAX], ppid[SCAN_MAX], tree[SCAN_MAX + 1];
    unsigned char in[SCAN_MAX];
    int n = 0, nt, fd, count = 0;
    long long aligned[1024]; /* the records' own alignment */
    char *buf = (char *)aligned;

    fd = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    for (;;) {
        long got = syscall(SYS_getdents64, fd, buf, sizeof(aligned));
        if (got <= 0)
            break;
        for (long off = 0; off < got;) {
            struct linux_dirent64_ *e = (struct linux_dirent64_ *)(buf + off);
            off += e->d_reclen;
            long p = parse_pid(e->d_name);
            if (p <= 0 || p == root || n >= SCAN_MAX)
                continue;
            long pp = parent_of(p);
            if (pp < 0)
                continue;
            pid[n] = (int)p;
            ppid[n] = (int)pp;
            in[n] = 0;
            n++;
        }
    }
    close(fd);
    /* tree[0..nt): root and the descendants found so far */
    tree[0] = (int)root;
    nt = 1;
    for (int added = 1; added;) {
        added = 0;
        for (int i = 0; i < n; i++) {
            int found = 0;
            if (in[i])
                continue;
            for (int j = 0; !found && j < nt; j++)
                found = tree[j] == ppid[i];
            if (found) {
                in[i] = 1;
                tree[nt++] = pid[i];
                added = 1;
            }
        }
    }
    for (int j = 1; j < nt; j++) {
        if (kill(tree[j], sig) == 0)
            count++;
        if (sig == SIGTERM)
            kill(tree[j], SIGCONT); /* a stopped one can act on it */
    }
    return count;
}

/* ------------------------------------------------------------------------ */
/* The supervisor                                                           */
/* ------------------------------------------------------------------------ */

static void on_sigchld(int sig)
{
    (void)sig; /* only ends the supervisor's ppoll */
}

static void say(int fd, int type, int a, int b)
{
    cli_sup_msg m;
    ssize_t w;

    memset(&m, 0, sizeof(m));
    m.type = type;
    m.a = a;
    m.b = b;
    do
        w = write(fd, &m, sizeof(m));
    while (w < 0 && errno == EINTR);
    /* dlock gone (EPIPE, SIGPIPE blocked): its control pipe says so */
}

/* CMD's process, after the supervisor's fork: never returns. */
static void run_cmd(const cli_spawn *sp, pid_t sup, int errfd)
{
    sigset_t none;
    int err = ENOENT, eacces = 0;

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != sup)
        _exit(CLI_EX_LOST); /* the supervisor is gone already */
    close_others(sp->inherited, &errfd, 1);
    if (sp->pipe_act)
        sigaction(SIGPIPE, sp->pipe_act, NULL); /* the caller's */
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int i = 0; sp->paths[i]; i++) {
        execve(sp->paths[i], sp->argv, sp->envp);
        err = errno;
        if (err == ENOEXEC && sp->sh_argv) {
            /* a script without #!: as execvp, through the shell */
            sp->sh_argv[1] = sp->paths[i];
            execve(sp->sh_argv[0], sp->sh_argv, sp->envp);
            err = errno;
            break;
        }
        if (err == EACCES)
            eacces = 1;
        else if (err != ENOENT && err != ENOTDIR && err != ESTALE &&
                 err != ENODEV && err != ETIMEDOUT)
            break;
    }
    if (eacces && (err == ENOENT || err == ENOTDIR))
        err = EACCES;
    if (write(errfd, &err, sizeof(err)) < 0)
        _exit(CLI_EX_NOTFOUND);
    _exit(CLI_EX_NOTFOUND);
}

/* Starts CMD with vfork(): the supervisor waits, its memory shared,
 * until CMD's exec (or _exit), and no page table is copied. The child
 * only makes system calls and never returns from here. */
static __attribute__((noinline)) pid_t start_cmd(const cli_spawn *sp,
                                                 pid_t self, const int *errp,
                                                 int ctl, int rep)
{
    pid_t pid = vfork();

    if (pid == 0) {
        close(errp[0]);
        close(ctl);
        close(rep);
        run_cmd(sp, self, errp[1]);
    }
    return pid;
}

/* The supervisor: never returns (async-signal-safe only). */
static void supervise_tree(const cli_spawn *sp, pid_t dlock_pid, int ctl,
                           int rep)
{
    sigset_t all, wait_mask;
    struct sigaction sa;
    int errp[2], err = 0;
    pid_t self = getpid(), cmd;
    int cmd_done = 0, cmd_status = 0, killing = 0, gone = 0;

    /* no signal stops it but SIGKILL: the terminal's go to CMD (and are
     * blocked here); SIGCHLD only ends the ppoll below */
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigchld;
    sigaction(SIGCHLD, &sa, NULL);
    sigfillset(&wait_mask);
    sigdelset(&wait_mask, SIGCHLD);
    {
        int keep[2] = {ctl, rep};
        close_others(sp->inherited, keep, 2);
    }
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    if (getppid() != dlock_pid)
        _exit(0); /* dlock died before we could start */
    if (pipe2(errp, O_CLOEXEC) != 0) {
        say(rep, CLI_SUP_EXECFAIL, errno, 0);
        _exit(0);
    }
    cmd = start_cmd(sp, self, errp, ctl, rep);
    if (cmd < 0) {
        say(rep, CLI_SUP_EXECFAIL, errno, 0);
        _exit(0);
    }
    close(errp[1]);
    ssize_t got;
    do
        got = read(errp[0], &err, sizeof(err));
    while (got < 0 && errno == EINTR);
    close(errp[0]);
    if (got == (ssize_t)sizeof(err)) {
        waitpid(cmd, NULL, 0);
        say(rep, CLI_SUP_EXECFAIL, err, 0);
        _exit(0);
    }
    say(rep, CLI_SUP_STARTED, (int)cmd, 0);

    for (;;) {
        int status;
        pid_t w;

        /* reap: CMD's status for dlock; any other child is part of the
         * tree, reparented here */
        int just = 0;
        while ((w = waitpid(-1, &status, WNOHANG)) > 0) {
            if (w == cmd && !cmd_done) {
                cmd_done = just = 1;
                cmd_status = status;
            }
        }
        int empty = w < 0 && errno == ECHILD;
        if (just) /* and whether processes of its are left */
            say(rep, CLI_SUP_EXITED, cmd_status, !empty);
        if (empty) {
            say(rep, CLI_SUP_EMPTY, 0, 0);
            _exit(0);
        }
        if (killing || gone)
            cli_tree_signal(self, SIGKILL);

        struct pollfd pf = {gone ? -1 : ctl, POLLIN, 0};
        /* while killing: again every 20 ms, for a process that forked
         * between a scan and its kill under a parent that lives on (its
         * death wakes no one here), or one the kernel has not let go yet */
        struct timespec ts = {0, 20 * 1000 * 1000};
        int r = ppoll(&pf, 1, killing || gone ? &ts : NULL, &wait_mask);
        if (r <= 0 || gone)
            continue;
        cli_sup_cmd m;
        ssize_t n = read(ctl, &m, sizeof(m));
        if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) {
            gone = 1; /* dlock died: the tree dies */
            continue;
        }
        if (n != (ssize_t)sizeof(m))
            continue;
        if (m.op == CLI_SUP_SIGNAL && !cmd_done)
            kill(cmd, m.sig);
        else if (m.op == CLI_SUP_TERM)
            cli_tree_signal(self, SIGTERM);
        else if (m.op == CLI_SUP_KILL)
            killing = 1;
    }
}

int cli_sup_start(const cli_spawn *sp, cli_sup *s)
{
    int ctl[2], rep[2];
    pid_t me = getpid();

    memset(s, 0, sizeof(*s));
    s->ctl = s->rep = -1;
    if (pipe2(ctl, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(rep, O_CLOEXEC) != 0) {
        int e = errno;
        close(ctl[0]);
        close(ctl[1]);
        errno = e;
        return -1;
    }
    s->pid = fork();
    if (s->pid < 0) {
        int e = errno;
        close(ctl[0]);
        close(ctl[1]);
        close(rep[0]);
        close(rep[1]);
        errno = e;
        return -1;
    }
    if (s->pid == 0) {
        close(ctl[1]);
        close(rep[0]);
        supervise_tree(sp, me, ctl[0], rep[1]);
    }
    close(ctl[0]);
    close(rep[1]);
    s->ctl = ctl[1];
    s->rep = rep[0];
    /* read until empty in dlock's loop */
    fcntl(s->rep, F_SETFL, fcntl(s->rep, F_GETFL) | O_NONBLOCK);
    return 0;
}

int cli_sup_send(const cli_sup *s, int op, int sig)
{
    cli_sup_cmd m;
    ssize_t w;

    memset(&m, 0, sizeof(m));
    m.op = op;
    m.sig = sig;
    do
        w = write(s->ctl, &m, sizeof(m));
    while (w < 0 && errno == EINTR);
    return w == (ssize_t)sizeof(m) ? 0 : -1;
}

/* ------------------------------------------------------------------------ */
/* Before the fork                                                          */
/* ------------------------------------------------------------------------ */

int cli_spawn_prepare(cli_spawn *sp, char **argv, char **envp,
                      const cli_fdset *inherited,
                      const struct sigaction *pipe_act)
{
    const char *name = argv[0];
    size_t argc = 0;

    memset(sp, 0, sizeof(*sp));
    sp->argv = argv;
    sp->envp = envp;
    sp->inherited = inherited;
    sp->pipe_act = pipe_act;
    while (argv[argc])
        argc++;
    /* the candidates execvp would try, in its order */
    if (!*name) {
        sp->paths = calloc(1, sizeof(char *));
        return sp->paths ? 0 : -1;
    }
    if (strchr(name, '/')) {
        sp->paths = calloc(2, sizeof(char *));
        if (!sp->paths || !(sp->paths[0] = strdup(name)))
            return -1;
    } else {
        const char *path = getenv("PATH");
        size_t n = 1, k = 0;
        if (!path)
            path = "/bin:/usr/bin"; /* glibc's default */
        for (const char *p = path; *p; p++)
            n += *p == ':';
        sp->paths = calloc(n + 1, sizeof(char *));
        if (!sp->paths)
            return -1;
        for (const char *p = path;; p++) {
            const char *end = strchr(p, ':');
            size_t dl = end ? (size_t)(end - p) : strlen(p);
            char *c = malloc(dl + strlen(name) + 3);
            if (!c)
                return -1;
            if (dl == 0) /* an empty entry: the current directory */
                strcpy(c, name);
            else
                sprintf(c, "%.*s/%s", (int)dl, p, name);
            sp->paths[k++] = c;
            if (!end)
                break;
            p = end;
        }
    }
    /* "/bin/sh FILE ARG..." for a file without #! */
    sp->sh_argv = calloc(argc + 2, sizeof(char *));
    if (!sp->sh_argv)
        return -1;
    sp->sh_argv[0] = (char *)"/bin/sh";
    for (size_t i = 1; i < argc; i++)
        sp->sh_argv[i + 1] = argv[i];
    return 0;
}

void cli_spawn_free(cli_spawn *sp)
{
    for (size_t i = 0; sp->paths && sp->paths[i]; i++)
        free(sp->paths[i]);
    free(sp->paths);
    free(sp->sh_argv);
    memset(sp, 0, sizeof(*sp));
}
