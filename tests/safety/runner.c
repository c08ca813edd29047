/* SPDX-License-Identifier: MIT */
/*
 * runner.c -- the cutoff-run scenario's holder: the real `dlock run`, not
 * the library, holds the lock, and its command is a tree of three
 * processes that ignore SIGTERM and do a holder's work with the token from
 * DLOCK_TOKEN for as long as they live:
 *
 *   runner (worker 0)
 *     └─ dlock run --ttl T ... safety -- dlock_safety --tree FILE 0
 *          └─ (dlock's supervisor)
 *               └─ the command [0]
 *                    └─ its child [1]
 *                         └─ its grandchild [2], after setsid()
 *
 * Each of the three records in the hold its pid, its reads and writes, the
 * resource's refusals and the time of its last read or write (taken inside
 * the resource's lock): the checker ends the hold's interval at the last
 * of them, whenever it came, so a process that outlives its dlock run, or
 * the store's lease, shows as an overlap with the next holder. The runner
 * records dlock run's exit status and what it said on stderr.
 */
#include "safety.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* A victim's tree works at most this long without a word from the
 * controller (it says go within 3 leases + 4 s, plus the heal). */
#define TREE_MAX_NS (60LL * 1000000000)

static int stopping(const sf_shared *s)
{
    return __atomic_load_n(&s->stop, __ATOMIC_SEQ_CST) ||
           sf_now_ns() >= s->deadline_ns;
}

/* ------------------------------------------------------------------------ */
/* The command's tree                                                       */
/* ------------------------------------------------------------------------ */

/* The victim's tree works until the controller says go (or its round is
 * over, or the run); any other tree does one read-modify-write per
 * process. */
static int tree_goes_on(const sf_shared *s, int idx, int victim, int k,
                        int64_t t0)
{
    if (stopping(s) || k >= 100000 || sf_now_ns() - t0 > TREE_MAX_NS)
        return 0;
    if (!victim)
        return k < 1;
    return !__atomic_load_n(&s->victim_go, __ATOMIC_SEQ_CST) &&
           __atomic_load_n(&s->victim_hold, __ATOMIC_SEQ_CST) == idx;
}

static void record(sf_hold *h, int p, int64_t t, int refused)
{
    __atomic_store_n(&h->t_proc[p], t, __ATOMIC_SEQ_CST);
    __atomic_add_fetch(&h->proc_ops[p], 1, __ATOMIC_SEQ_CST);
    if (refused)
        __atomic_add_fetch(&h->proc_refused[p], 1, __ATOMIC_SEQ_CST);
}

/* Process p of the tree: read, 200 µs, write value + 1 with the hold's
 * token (a read hold only reads), the three taking turns (they are one
 * holder: otherwise they would lose each other's updates); the victim's
 * every millisecond. The victim's command [0] says when all three work:
 * the controller cuts then. */
static void tree_work(sf_shared *s, sf_hold *h, int idx, int p, int victim)
{
    int64_t t0 = sf_now_ns();
    int shown = 0;

    __atomic_store_n(&h->proc_pid[p], (int32_t)getpid(), __ATOMIC_SEQ_CST);
    for (int k = 0; tree_goes_on(s, idx, victim, k, t0); k++) {
        int64_t v = 0, t = 0;
        uint64_t seen = 0, rop = 0, wop = 0;

        sf_mutex_lock(&s->tree_mu);
        int r = h->shared ? sf_resource_read_shared(&s->res, h->token, &v,
                                                    &seen, &rop, &t)
                          : sf_resource_read(&s->res, h->token, &v, &seen,
                                             &rop, &t);
        record(h, p, t, r != SF_W_NONE);
        if (r == SF_W_NONE && !h->shared) {
            sf_sleep_us(200);
            r = sf_resource_write(&s->res, h->token, v + 1, rop, &wop, &t);
            record(h, p, t, r != SF_W_ACCEPTED);
        }
        pthread_mutex_unlock(&s->tree_mu);
        if (!victim)
            continue;
        /* all three at work (or 5 s gone: a fork failed) */
        if (p == 0 && !shown &&
            ((__atomic_load_n(&h->proc_ops[1], __ATOMIC_SEQ_CST) > 0 &&
              __atomic_load_n(&h->proc_ops[2], __ATOMIC_SEQ_CST) > 0) ||
             sf_now_ns() - t0 > 5000000000LL)) {
            shown = 1;
            __atomic_store_n(&s->victim_in_window, 1, __ATOMIC_SEQ_CST);
        }
        sf_sleep_us(1000);
    }
}

int sf_tree_main(const char *path, int id)
{
    struct sigaction ign;
    const char *tok = getenv("DLOCK_TOKEN");
    int fd = open(path, O_RDWR | O_CLOEXEC);
    sf_shared *s;

    /* what a command with a slow or no shutdown handler does; its child
     * and grandchild inherit it */
    memset(&ign, 0, sizeof(ign));
    ign.sa_handler = SIG_IGN;
    sigaction(SIGTERM, &ign, NULL);
    if (fd < 0 || !tok || !(s = sf_attach(fd, id)))
        return 2;
    sf_worker *me = &s->w[id];
    uint32_t idx = __atomic_fetch_add(&s->nholds, 1, __ATOMIC_SEQ_CST);
    if (idx >= SF_MAX_HOLDS) { /* history full: stop cleanly */
        __atomic_store_n(&s->stop, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    sf_hold *h = &s->holds[idx];
    h->worker = id;
    h->run = 1;
    h->run_rc = -1;
    h->shared = me->run_shared;
    h->acq_id = ((uint64_t)id << 32) | me->run_seq;
    h->token = strtoull(tok, NULL, 10);
    h->t_acq_call = me->run_t_call;
    h->t_acq_ret = h->t_rel_call = sf_now_ns();
    me->acquires++;
    __atomic_store_n(&me->run_hold, (int)idx, __ATOMIC_SEQ_CST);
    int victim = sf_claim_victim(s, id);
    if (victim) {
        h->victim = 1;
        __atomic_store_n(&s->victim_hold, (int)idx, __ATOMIC_SEQ_CST);
    }

    pid_t child = fork();
    if (child == 0) {
        pid_t gc = fork();
        if (gc == 0) {
            /* out of the command's session and process group: only a
             * search of the whole tree finds it */
            setsid();
            tree_work(s, h, (int)idx, 2, victim);
            _exit(0);
        }
        tree_work(s, h, (int)idx, 1, victim);
        if (gc > 0)
            while (waitpid(gc, NULL, 0) < 0 && errno == EINTR)
                ;
        _exit(0);
    }
    tree_work(s, h, (int)idx, 0, victim);
    if (child > 0)
        while (waitpid(child, NULL, 0) < 0 && errno == EINTR)
            ;
    munmap(s, sizeof(*s));
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The runner                                                               */
/* ------------------------------------------------------------------------ */

/* The line of `text` that contains `what`, into out (cut at cap). */
static int line_with(const char *text, const char *what, char *out,
                     size_t cap)
{
    const char *p = strstr(text, what), *b, *e;

    if (!p)
        return 0;
    for (b = p; b > text && b[-1] != '\n'; b--)
        ;
    e = strchr(p, '\n');
    snprintf(out, cap, "%.*s", (int)(e ? e - b : (long)strlen(b)), b);
    return 1;
}

int sf_runner_main(sf_shared *s, const char *path, int id)
{
    sf_worker *me = &s->w[id];
    char errpath[1200], ttl[32], idbuf[16];

    snprintf(errpath, sizeof(errpath), "%s.w%d.err", path, id);
    snprintf(ttl, sizeof(ttl), "%lldms", (long long)s->run_ttl_ms);
    snprintf(idbuf, sizeof(idbuf), "%d", id);
    __atomic_store_n(&me->opened, 1, __ATOMIC_SEQ_CST);
    for (uint32_t seq = 0;
         (int)seq < s->max_holds_per_worker && !stopping(s); seq++) {
        char wait[32];
        int shared = s->mixed && rand() % 3 != 0;

        snprintf(wait, sizeof(wait), "%lldms", (long long)s->wait_ms);
        me->run_seq = seq;
        me->run_shared = shared;
        __atomic_store_n(&me->run_hold, -1, __ATOMIC_SEQ_CST);
        me->run_t_call = sf_now_ns();
        pid_t pid = fork();
        if (pid == 0) {
            /* the runner killed: dlock dies too (and stops its tree) */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            int efd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            int nul = open("/dev/null", O_RDWR);
            if (efd < 0 || nul < 0)
                _exit(125);
            dup2(nul, 0);
            dup2(nul, 1);
            dup2(efd, 2);
            close(efd);
            close(nul);
            /* the store in dlock's environment, not in its argv (a
             * password); dlock passes it on without the password */
            setenv("DLOCK_STORE", me->uri, 1);
            char *argv[16];
            int n = 0;
            argv[n++] = s->dlock_bin;
            argv[n++] = "run";
            argv[n++] = "--quiet";
            argv[n++] = "--ttl";
            argv[n++] = ttl;
            argv[n++] = "--wait";
            argv[n++] = wait;
            if (shared)
                argv[n++] = "--shared";
            argv[n++] = SF_LOCK_NAME;
            argv[n++] = "--";
            argv[n++] = s->self_exe;
            argv[n++] = "--tree";
            argv[n++] = (char *)path;
            argv[n++] = idbuf;
            argv[n] = NULL;
            execv(s->dlock_bin, argv);
            _exit(127);
        }
        if (pid < 0) {
            me->errors++;
            snprintf(me->last_err, sizeof(me->last_err), "fork: %s",
                     strerror(errno));
            sf_sleep_us(20000);
            continue;
        }
        int st = 0;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        int64_t t_end = sf_now_ns();
        char err[600] = "";
        int efd = open(errpath, O_RDONLY | O_CLOEXEC);
        if (efd >= 0) {
            ssize_t got = read(efd, err, sizeof(err) - 1);
            err[got > 0 ? got : 0] = '\0';
            close(efd);
        }
        int idx = __atomic_load_n(&me->run_hold, __ATOMIC_SEQ_CST);
        char flat[sizeof(err)]; /* for the log's one line */
        snprintf(flat, sizeof(flat), "%s", err);
        for (char *c = flat; *c; c++)
            if (*c == '\n')
                *c = c[1] ? '/' : '\0';
        if (idx >= 0) {
            sf_hold *h = &s->holds[idx];
            h->run_rc = rc;
            /* only 0 vouches for the hold, 76 says it was lost */
            h->rel_rc = rc == 0 ? DLOCK_OK : rc == 76 ? DLOCK_ELOST
                                                      : DLOCK_ECONN;
            h->t_rel_ret = t_end;
            if (line_with(err, "lock at risk", h->lost_msg,
                          sizeof(h->lost_msg)) ||
                line_with(err, "lost the lock", h->lost_msg,
                          sizeof(h->lost_msg)) ||
                line_with(err, "was lost", h->lost_msg,
                          sizeof(h->lost_msg))) {
                h->t_lost = t_end;
                __atomic_store_n(&h->lost_cb, 1, __ATOMIC_SEQ_CST);
            }
            if (rc != 0)
                snprintf(me->last_err, sizeof(me->last_err),
                         "dlock run: exit %d: %.200s", rc, flat);
            __atomic_store_n(&h->done, 1, __ATOMIC_SEQ_CST);
            if (h->victim)
                __atomic_store_n(&s->victim_done, 1, __ATOMIC_SEQ_CST);
        } else if (rc == 75) { /* not acquired within --wait */
            me->busy++;
        } else {
            me->errors++;
            snprintf(me->last_err, sizeof(me->last_err),
                     "dlock run: exit %d: %.200s", rc, flat);
            sf_sleep_us(20000); /* a store down: do not spin */
        }
        sf_sleep_us(rand() % 1000);
    }
    unlink(errpath);
    return 0;
}
