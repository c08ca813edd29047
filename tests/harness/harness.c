/* SPDX-License-Identifier: MIT */
/*
 * harness.c -- the test runner and real-store helpers (see test.h).
 *
 * Past 1,000 lines on purpose: the one runner and the start and stop of
 * every real store (redis-server, ZooKeeper, etcd, PostgreSQL, MariaDB,
 * PgBouncer), one section each, so that no test starts a server its own
 * way.
 */
#include "test.h"

#include <hiredis.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_SERVERS 16

static pid_t owner_pid;
static const char *current;
static char tmpdir[512];
static pid_t server_pids[MAX_SERVERS]; /* still running, to kill at exit */

void th_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "FAIL %s (%s:%d%s): ", current ? current : "?", file,
            line, getpid() == owner_pid ? "" : ", in a child process");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    exit(1);
}

void th_skip(const char *why)
{
    fprintf(stderr, "SKIP: %s\n", why);
    exit(77);
}

const dlock_client_options *th_patient(void)
{
    static const dlock_client_options patient = {10000};
    return &patient;
}

dlock_client *th_client(const char *uri, const dlock_client_options *o)
{
    dlock_client *c = NULL;
    int rc = dlock_client_open(&c, uri, o);

    if (rc != DLOCK_OK)
        th_fail(__FILE__, __LINE__, "dlock_client_open returned %s: %s",
                dlock_errname(rc), dlock_errmsg());
    return c;
}

dlock *th_open(dlock_client *c, const char *name, const dlock_options *o)
{
    dlock *l = NULL;
    int rc = dlock_open(&l, c, name, o);

    if (rc != DLOCK_OK)
        th_fail(__FILE__, __LINE__, "dlock_open(%s) returned %s: %s", name,
                dlock_errname(rc), dlock_errmsg());
    return l;
}

dlock *th_handle(dlock_client *c, const char *name, int64_t ttl,
                 unsigned flags, unsigned permits)
{
    dlock_options o;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = ttl;
    o.flags = flags;
    o.permits = permits;
    return th_open(c, name, &o);
}

dlock *th_handle_lost(dlock_client *c, const char *name, int64_t ttl,
                      unsigned flags, dlock_lost_cb cb, void *arg)
{
    dlock_options o;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = ttl;
    o.flags = flags;
    o.on_lost = cb;
    o.on_lost_arg = arg;
    return th_open(c, name, &o);
}

void th_close_n(dlock **l, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dlock_close(l[i]);
}

void th_release_close(dlock **l, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int rc = dlock_release(l[i]);
        if (rc != DLOCK_OK)
            th_fail(__FILE__, __LINE__, "release %zu of %zu: %s: %s", i, n,
                    dlock_errname(rc), dlock_errmsg());
        dlock_close(l[i]);
    }
}

void th_client_close_n(dlock_client **c, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dlock_client_close(c[i]);
}


dlock_info th_info(dlock_client *c, const char *name)
{
    dlock_info i;
    int rc = dlock_inspect(c, name, &i);

    if (rc != DLOCK_OK)
        th_fail(__FILE__, __LINE__, "dlock_inspect(%s) returned %s: %s",
                name, dlock_errname(rc), dlock_errmsg());
    return i;
}

void th_check_held(dlock_client *c, const char *name, int held,
                   int64_t holders)
{
    dlock_info in = th_info(c, name);

    if (held >= 0 && in.held != held)
        th_fail(__FILE__, __LINE__, "%s: held %d, not %d", name, in.held,
                held);
    if (holders >= 0 && in.holders != holders)
        th_fail(__FILE__, __LINE__, "%s: %lld holders, not %lld", name,
                (long long)in.holders, (long long)holders);
    dlock_info_clear(&in);
}

void th_break_counts(dlock_client *op, const char *name, int64_t holders,
                     int64_t permits, int64_t waiters)
{
    dlock_info ev;

    CHECK_OK(dlock_break(op, name, &ev));
    CHECK_EQ(ev.holders, holders);
    CHECK_EQ(ev.permits, permits);
    if (waiters >= 0)
        CHECK_EQ(ev.waiters, waiters);
    dlock_info_clear(&ev);
}

void th_next_token_above(const char *uri, const char *name, uint64_t above)
{
    dlock_client *b = th_client(uri, th_patient());
    dlock *lb = th_handle(b, name, 30000, 0, 0);

    CHECK_OK(dlock_acquire(lb, 5000));
    CHECK_OP(dlock_token(lb), >, above);
    CHECK_OK(dlock_release(lb));
    dlock_close(lb);
    dlock_client_close(b);
}

int64_t th_waiters(dlock_client *c, const char *name)
{
    dlock_info i = th_info(c, name);
    int64_t n = i.waiters;

    dlock_info_clear(&i);
    return n;
}

void th_wait_state(dlock_client *c, const char *name, int64_t n, int64_t h)
{
    int64_t until = th_now_ms() + 10000;
    dlock_info i;

    for (;;) {
        i = th_info(c, name);
        if ((i.waiters == n && (h < 0 || i.holders == h)) ||
            th_now_ms() >= until)
            break;
        dlock_info_clear(&i);
        th_sleep_ms(5);
    }
    if (i.waiters != n || (h >= 0 && i.holders != h))
        th_fail(__FILE__, __LINE__,
                "%s has %lld waiters and %lld holders after 10 s, not %lld "
                "and %lld",
                name, (long long)i.waiters, (long long)i.holders,
                (long long)n, (long long)h);
    dlock_info_clear(&i);
}

void th_wait_waiters(dlock_client *c, const char *name, int64_t n)
{
    int64_t until = th_now_ms() + 10000, w;

    while ((w = th_waiters(c, name)) != n && th_now_ms() < until)
        th_sleep_ms(5);
    if (w != n)
        th_fail(__FILE__, __LINE__, "%lld waiters of %s after 10 s, not %lld",
                (long long)w, name, (long long)n);
}

int th_wait_queued(dlock_client *c, const char *name, int64_t n, int64_t ms)
{
    int64_t until = th_now_ms() + ms, w;

    while ((w = th_waiters(c, name)) < n) {
        if (w < 0)
            return 0;
        if (th_now_ms() >= until)
            th_fail(__FILE__, __LINE__,
                    "%lld waiters of %s after %lld ms, not %lld", (long long)w,
                    name, (long long)ms, (long long)n);
        th_sleep_ms(5);
    }
    return 1;
}

void th_acquire_busy(dlock *l, int64_t ms)
{
    int rc = DLOCK_ECONN;

    for (int i = 0; i < 4 && rc == DLOCK_ECONN; i++, ms *= 4)
        rc = dlock_acquire(l, ms);
    if (rc != DLOCK_EBUSY)
        th_fail(__FILE__, __LINE__, "dlock_acquire() returned %s, not "
                "DLOCK_EBUSY: %s", dlock_errname(rc), dlock_errmsg());
}

FILE *th_fopen_w(const char *path)
{
    FILE *f = fopen(path, "w");

    if (!f)
        th_fail(__FILE__, __LINE__, "cannot write %s: %s", path,
                strerror(errno));
    return f;
}

int64_t th_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void th_sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

int th_wait_flag(volatile int *flag, int64_t ms)
{
    int64_t until = th_now_ms() + ms;
    int v;

    while (!(v = __atomic_load_n(flag, __ATOMIC_SEQ_CST)) &&
           th_now_ms() < until)
        th_sleep_ms(2);
    return v;
}

static int rm_entry(const char *path, const struct stat *sb, int flag,
                    struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void cleanup(void)
{
    if (getpid() != owner_pid)
        return;
    for (int i = 0; i < MAX_SERVERS; i++)
        if (server_pids[i] > 0) {
            kill(server_pids[i], SIGCONT);
            kill(server_pids[i], SIGKILL);
            kill(-server_pids[i], SIGKILL); /* its group (setsid) */
            waitpid(server_pids[i], NULL, 0);
            server_pids[i] = 0;
        }
    if (tmpdir[0] && !getenv("DLOCK_TEST_KEEP"))
        nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *th_tmpdir(void)
{
    if (!tmpdir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(tmpdir, sizeof(tmpdir), "%s/dlock-test-XXXXXX",
                 base && *base ? base : "/tmp");
        if (!mkdtemp(tmpdir))
            th_fail(__FILE__, __LINE__, "mkdtemp: %s", strerror(errno));
    }
    return tmpdir;
}

void *th_shared(size_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED)
        th_fail(__FILE__, __LINE__, "mmap: %s", strerror(errno));
    memset(p, 0, size);
    return p;
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TH_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define TH_ASAN 1
#endif

/* fork() for the harness's children: stdio flushed first (no output
 * twice), a failed fork fails the test; in the child, a session of its
 * own when `session`, and death with the test binary (even when that is
 * SIGKILLed: a failed test never leaves a child behind, holding locks or
 * ctest's output pipe), exit 99 if the test died before that took. */
static pid_t fork_tied(int session)
{
    pid_t parent = getpid(), pid;

    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        th_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
    if (pid == 0) {
        if (session)
            setsid();
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(99);
    }
    return pid;
}

int th_in_process;

pid_t th_fork(int (*fn)(void *), void *arg)
{
    pid_t pid;

    if (th_in_process)
        th_fail(__FILE__, __LINE__,
                "this test forks, and the store is in-process (mem://): "
                "mark it TP() in its table");

#ifdef TH_ASAN
    /* AddressSanitizer's allocator (Debian 12's clang 14) is not
     * fork-safe: a fork while another thread of ours allocates leaves the
     * child stuck on the allocator's lock forever. The test's own step
     * just before a fork often wakes a client's background thread (an
     * etcd holder's watch stream opening, or parsing the event of the
     * waiter the test just saw queue): let it finish first. glibc's
     * malloc needs none of this (make test forks at once) */
    th_sleep_ms(150);
#endif
    pid = fork_tied(0);
    if (pid == 0) {
        /* _exit: a child must not run the parent's exit handlers (nor a
         * leak check of objects it inherited and never owned) */
        int rc = fn(arg);
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
    }
    return pid;
}

int th_wait(pid_t pid)
{
    int st;

    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    return 128 + WTERMSIG(st);
}

/* What each of th_open_together()'s children runs: spin until the
 * parent says go, so that the opens meet, then open a client. */
typedef struct th_opener {
    const char *uri;
    volatile int *go;
} th_opener;

static int open_at_go(void *arg)
{
    th_opener *o = arg;
    dlock_client *c = NULL;

    while (!__atomic_load_n(o->go, __ATOMIC_ACQUIRE))
        ;
    if (dlock_client_open(&c, o->uri, NULL) != DLOCK_OK) {
        fprintf(stderr, "open: %s\n", dlock_errmsg());
        return 1;
    }
    dlock_client_close(c);
    return 0;
}

void th_open_together(const char *uri, int n)
{
    /* shared, not the parent's stack: the children spin on it */
    static volatile int *go;
    pid_t pid[TH_OPEN_TOGETHER_MAX];

    CHECK_OP(n, <=, TH_OPEN_TOGETHER_MAX);
    if (!go)
        go = th_shared(sizeof(*go));
    th_opener o = {uri, go};
    *go = 0;
    for (int i = 0; i < n; i++)
        pid[i] = th_fork(open_at_go, &o);
    th_sleep_ms(20); /* all forked and spinning */
    __atomic_store_n(go, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < n; i++)
        CHECK_EQ(th_wait(pid[i]), 0);
}

void th_kill_stopped(pid_t pid)
{
    int st;

    kill(pid, SIGKILL);
    kill(pid, SIGCONT);
    st = th_wait(pid);
    if (st != 128 + SIGKILL)
        th_fail(__FILE__, __LINE__, "child %d ended %d, not by SIGKILL",
                (int)pid, st);
}

void *th_redis_forger(th_redis *r, const char *publish)
{
    struct timeval tv = {5, 0};
    redisContext *c;
    redisReply *rep;

    th_redis_cmd(r, NULL, 0,
                 "ACL SETUSER forger on >forger-pw +@read +%s allchannels ~*",
                 publish);
    c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    if (!c || c->err)
        th_fail(__FILE__, __LINE__, "connect to %d: %s", r->port,
                c ? c->errstr : "no memory");
    rep = redisCommand(c, "AUTH forger forger-pw");
    if (!rep || rep->type != REDIS_REPLY_STATUS)
        th_fail(__FILE__, __LINE__, "AUTH forger: %s",
                rep && rep->str ? rep->str : "no answer");
    freeReplyObject(rep);
    return c;
}

void th_redis_waiter_line(void *f, const char *name, char client[33],
                          unsigned long long *seq)
{
    int64_t until = th_now_ms() + 10000;

    for (;;) {
        redisReply *v = redisCommand(f, "GET dlock:{%s}", name);
        const char *line = v && v->type == REDIS_REPLY_STRING ? v->str : "";
        int got = 0;

        while ((line = strchr(line, '\n')) && *++line == '+')
            ;
        if (line)
            got = sscanf(line, "%32[0-9a-f]:%*u:%llu ", client, seq) == 2;
        freeReplyObject(v);
        if (got)
            return;
        if (th_now_ms() >= until)
            th_fail(__FILE__, __LINE__, "no waiter's line in %s after 10 s",
                    name);
        th_sleep_ms(20);
    }
}

int th_free_port(void)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int s = socket(AF_INET, SOCK_STREAM, 0), port;

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(s, (struct sockaddr *)&a, &len) != 0)
        th_fail(__FILE__, __LINE__, "cannot find a free port: %s",
                strerror(errno));
    port = ntohs(a.sin_port);
    close(s);
    return port;
}

pid_t th__spawn(const char *path, char *const argv[], const char *dir,
                const char *log, mode_t mode)
{
    pid_t pid = fork_tied(1);

    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        int out = open(log, O_WRONLY | O_CREAT | O_APPEND, mode);
        dup2(null, 0);
        dup2(out >= 0 ? out : null, 1);
        dup2(out >= 0 ? out : null, 2);
        if (dir && chdir(dir) != 0)
            _exit(1);
        execv(path, argv);
        _exit(127);
    }
    th__track(pid, 1);
    return pid;
}

int th__reaped(pid_t *pid, int *st)
{
    int s;

    if (*pid <= 0)
        return 1;
    if (waitpid(*pid, &s, WNOHANG) != *pid)
        return 0;
    th__track(*pid, 0);
    *pid = 0;
    if (st)
        *st = s;
    return 1;
}

void th__track(pid_t pid, int running)
{
    for (int i = 0; i < MAX_SERVERS; i++) {
        if (running && server_pids[i] == 0) {
            server_pids[i] = pid;
            return;
        }
        if (!running && server_pids[i] == pid) {
            server_pids[i] = 0;
            return;
        }
    }
    if (running)
        th_fail(__FILE__, __LINE__, "too many servers at once");
}

static int redis_ping(th_redis *r)
{
    struct timeval tv = {0, 200000};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    int ok = 0;

    if (c && !c->err) {
        redisReply *rep = redisCommand(c, "PING");
        ok = rep != NULL; /* even NOAUTH means it is up */
        if (rep)
            freeReplyObject(rep);
    }
    if (c)
        redisFree(c);
    return ok;
}

/* The TLS lines of a th_redis_start_tls() server's config (nothing for
 * the others), on its TLS port and certificate, so that a restart has
 * them too. */
static void redis_tls_conf(FILE *f, const th_redis *r)
{
    const char *d;

    if (!r->tls_port)
        return;
    d = th_tls_certs();
    fprintf(f,
            "tls-port %d\ntls-cert-file \"%s/%s.crt\"\n"
            "tls-key-file \"%s/%s.key\"\ntls-ca-cert-file \"%s/ca.crt\"\n"
            "tls-auth-clients %s\n",
            r->tls_port, d, r->tls_cert, d, r->tls_cert, d,
            r->tls_auth_clients ? "yes" : "no");
}

static int redis_launch(th_redis *r)
{
    char conf[700];
    FILE *f;

    snprintf(conf, sizeof(conf), "%s/redis.conf", r->dir);
    f = th_fopen_w(conf);
    if (r->sentinel) /* a sentinel rewrites its file: no unix socket */
        fprintf(f, "port %d\nbind 127.0.0.1\ndir %s\nlogfile %s/redis.log\n"
                   "daemonize no\n%s\n",
                r->port, r->dir, r->dir, r->extra);
    else
        fprintf(f,
                "port %d\nbind 127.0.0.1%s\nunixsocket %s\nunixsocketperm "
                "700\nsave \"\"\nappendonly no\ndir %s\nlogfile "
                "%s/redis.log\ndaemonize no\n%s\n",
                r->port, r->tls_port ? " -::1" : "", r->sock, r->dir, r->dir,
                r->extra);
    redis_tls_conf(f, r);
    fclose(f);
    r->pid = fork();
    if (r->pid < 0)
        th_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
    if (r->pid == 0) {
        int null = open("/dev/null", O_RDWR);
        setsid();
        dup2(null, 0);
        dup2(null, 1);
        execlp("redis-server", "redis-server", conf,
               r->sentinel ? "--sentinel" : (char *)NULL, (char *)NULL);
        _exit(127);
    }
    th__track(r->pid, 1);
    for (int i = 0; i < 250; i++) {
        int st;
        if (waitpid(r->pid, &st, WNOHANG) == r->pid) {
            th__track(r->pid, 0);
            r->pid = 0;
            if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
                th_fail(__FILE__, __LINE__,
                        "redis-server not found: install it (make test "
                        "does) or put it in PATH");
            return -1; /* port taken? */
        }
        if (redis_ping(r))
            return 0;
        th_sleep_ms(20);
    }
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    th__track(r->pid, 0);
    r->pid = 0;
    return -1;
}

/* Fills r for a new server: a directory of its own (its config, log and
 * any file the server writes there, a cluster's nodes.conf too), its
 * socket and its extra config lines. */
static void redis_init(th_redis *r, const char *extra, int sentinel)
{
    static int n;

    memset(r, 0, sizeof(*r));
    r->sentinel = sentinel;
    if (snprintf(r->dir, sizeof(r->dir), "%s/redis%d", th_tmpdir(), n++) >=
        (int)sizeof(r->dir))
        th_fail(__FILE__, __LINE__, "temporary directory name too long");
    mkdir(r->dir, 0700);
    snprintf(r->sock, sizeof(r->sock), "%s/redis.sock", r->dir);
    snprintf(r->extra, sizeof(r->extra), "%s", extra ? extra : "");
}

void th__redis_start(th_redis *r, const char *extra, int sentinel)
{
    redis_init(r, extra, sentinel);
    for (int attempt = 0; attempt < 5; attempt++) {
        r->port = th_free_port();
        if (redis_launch(r) == 0) {
            snprintf(r->uri, sizeof(r->uri), "redis://127.0.0.1:%d",
                     r->port);
            return;
        }
    }
    th_fail(__FILE__, __LINE__, "redis-server did not start (see %s)",
            r->dir);
}

int th__redis_start_port(th_redis *r, const char *extra, int port)
{
    redis_init(r, extra, 0);
    r->port = port;
    if (redis_launch(r) != 0)
        return -1;
    snprintf(r->uri, sizeof(r->uri), "redis://127.0.0.1:%d", r->port);
    return 0;
}

int th__redis_start_port_tls(th_redis *r, const char *extra, int sentinel,
                             int port, const char *cert)
{
    th_tls_certs(); /* made before the server needs them */
    if (extra && strlen(extra) >= sizeof(r->extra))
        th_fail(__FILE__, __LINE__, "redis config lines too long");
    redis_init(r, extra, sentinel);
    snprintf(r->tls_cert, sizeof(r->tls_cert), "%s", cert);
    r->port = port ? port : th_free_port();
    /* another free port (bounded: the kernel hands out ports in turn, the
     * same one twice in a row is rare) */
    r->tls_port = th_free_port();
    for (int i = 0; i < 100 && r->tls_port == r->port; i++)
        r->tls_port = th_free_port();
    if (r->tls_port == r->port || redis_launch(r) != 0)
        return -1;
    snprintf(r->uri, sizeof(r->uri), "redis://127.0.0.1:%d", r->port);
    return 0;
}

void th_redis_start(th_redis *r, const char *extra)
{
    th__redis_start(r, extra, 0);
}

void th_redis_start_tls(th_redis *r, const char *cert, int auth_clients,
                        const char *extra)
{
    char ca[900], ccert[900], ckey[900];

    th_tls_certs(); /* made before the server needs them */
    redis_init(r, extra, 0);
    snprintf(r->tls_cert, sizeof(r->tls_cert), "%s", cert);
    r->tls_auth_clients = auth_clients;
    for (int attempt = 0; attempt < 5; attempt++) {
        r->port = th_free_port();
        /* another free port (bounded: the kernel hands out ports in
         * turn, the same one twice in a row is rare) */
        r->tls_port = th_free_port();
        for (int i = 0; i < 100 && r->tls_port == r->port; i++)
            r->tls_port = th_free_port();
        if (r->tls_port == r->port)
            continue;
        if (redis_launch(r) == 0) {
            snprintf(r->uri, sizeof(r->uri), "redis://127.0.0.1:%d",
                     r->port);
            th_tls_param(ca, sizeof(ca), "ca.crt");
            if (auth_clients)
                snprintf(r->tls_uri, sizeof(r->tls_uri),
                         "rediss://localhost:%d?cacert=%s&cert=%s&key=%s",
                         r->tls_port, ca,
                         th_tls_param(ccert, sizeof(ccert), "client.crt"),
                         th_tls_param(ckey, sizeof(ckey), "client.key"));
            else
                snprintf(r->tls_uri, sizeof(r->tls_uri),
                         "rediss://localhost:%d?cacert=%s", r->tls_port, ca);
            return;
        }
    }
    th_fail(__FILE__, __LINE__,
            "redis-server with a TLS port did not start (see %s)", r->dir);
}


void th_redis_restart(th_redis *r)
{
    for (int attempt = 0; attempt < 100; attempt++) {
        if (redis_launch(r) == 0)
            return;
        th_sleep_ms(50); /* the old socket may linger a moment */
    }
    th_fail(__FILE__, __LINE__, "redis-server did not restart on port %d",
            r->port);
}

void th_redis_kill(th_redis *r, int sig)
{
    if (r->pid <= 0)
        return;
    kill(r->pid, sig);
    if (sig == SIGSTOP || sig == SIGCONT)
        return;
    waitpid(r->pid, NULL, 0);
    th__track(r->pid, 0);
    r->pid = 0;
}

void th_redis_stop(th_redis *r)
{
    th_redis_kill(r, SIGTERM);
}

long long th_redis_cmd(th_redis *r, char *out, size_t cap, const char *fmt,
                       ...)
{
    struct timeval tv = {2, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", r->port, tv);
    redisReply *rep;
    long long v = -1;
    va_list ap;

    if (!c || c->err)
        th_fail(__FILE__, __LINE__, "cannot reach redis on port %d", r->port);
    va_start(ap, fmt);
    rep = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (out && cap)
        out[0] = '\0';
    if (rep) {
        if (rep->type == REDIS_REPLY_INTEGER)
            v = rep->integer;
        else if (rep->type == REDIS_REPLY_STRING ||
                 rep->type == REDIS_REPLY_STATUS) {
            v = 0;
            if (out && cap)
                snprintf(out, cap, "%.*s", (int)rep->len, rep->str);
        } else if (rep->type == REDIS_REPLY_ARRAY) {
            v = (long long)rep->elements;
        } else if (rep->type == REDIS_REPLY_ERROR && out && cap) {
            snprintf(out, cap, "%.*s", (int)rep->len, rep->str);
        }
        freeReplyObject(rep);
    }
    redisFree(c);
    return v;
}

long long th_redis_calls(th_redis *r, const char *cmd)
{
    static char buf[65536];
    char key[64];
    const char *p;
    long long n = 0;

    th_redis_cmd(r, buf, sizeof(buf), "INFO commandstats");
    if (cmd) {
        snprintf(key, sizeof(key), "cmdstat_%s:calls=", cmd);
        p = strstr(buf, key);
        return p ? atoll(p + strlen(key)) : 0;
    }
    /* every command run, those run inside scripts included, but INFO */
    for (p = buf; (p = strstr(p, "cmdstat_")); p++) {
        const char *calls = strstr(p, "calls=");
        if (calls && strncmp(p, "cmdstat_info:", 13) != 0)
            n += atoll(calls + 6);
    }
    return n;
}

/* ------------------------------------------------------------------------ */
/* ZooKeeper servers                                                         */
/* ------------------------------------------------------------------------ */

#define ZK_JAR "/usr/share/java/zookeeper.jar"
/* log4j.properties for the CONSOLE appender (Debian's example config) */
#define ZK_CONF_DIR "/etc/zookeeper/conf_example"
/* without these two the server logs nothing (slf4j falls back to NOP) */
#define ZK_LOG_JARS "/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar"

static void zk_write_config(th_zk *z, int i)
{
    char path[700];
    FILE *f;

    snprintf(path, sizeof(path), "%s/data", z->dir[i]);
    mkdir(z->dir[i], 0700);
    mkdir(path, 0700);
    snprintf(path, sizeof(path), "%s/zoo.cfg", z->dir[i]);
    f = th_fopen_w(path);
    /* tickTime 200: sessions of 400 ms to 60 s, expiry checked every tick */
    fprintf(f,
            "tickTime=200\ndataDir=%s/data\nclientPort=%d\n"
            "clientPortAddress=127.0.0.1\nminSessionTimeout=400\n"
            "maxSessionTimeout=60000\n4lw.commands.whitelist=*\n"
            "admin.enableServer=false\nforceSync=no\n",
            z->dir[i], z->port[i]);
    if (z->n > 1) {
        fprintf(f, "initLimit=10\nsyncLimit=5\n");
        for (int k = 0; k < z->n; k++)
            fprintf(f, "server.%d=127.0.0.1:%d:%d\n", k + 1, z->peer[k],
                    z->elect[k]);
    }
    fclose(f);
    if (z->n > 1) {
        snprintf(path, sizeof(path), "%s/data/myid", z->dir[i]);
        f = th_fopen_w(path);
        fprintf(f, "%d\n", i + 1);
        fclose(f);
    }
}

/* The java binary from PATH (resolved before fork: the child only execs). */
static const char *zk_java(void)
{
    static char found[1024];
    const char *path = getenv("PATH");

    if (found[0])
        return found;
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t len = strcspn(path, ":");
        snprintf(found, sizeof(found), "%.*s/java", (int)len,
                 len ? path : ".");
        if (access(found, X_OK) == 0)
            return found;
        path += len + (path[len] == ':');
    }
    found[0] = '\0';
    th_fail(__FILE__, __LINE__,
            "java not found: install the zookeeper package (Debian) or put "
            "java in PATH");
}

static void zk_spawn(th_zk *z, int i)
{
    char cfg[700], log[700], logdir[700], cp[1024];
    const char *java = zk_java();

    snprintf(cfg, sizeof(cfg), "%s/zoo.cfg", z->dir[i]);
    snprintf(log, sizeof(log), "%s/zk.log", z->dir[i]);
    snprintf(logdir, sizeof(logdir), "-Dzookeeper.log.dir=%s", z->dir[i]);
    if (access("/usr/share/java/slf4j-log4j12.jar", R_OK) == 0 &&
        access("/usr/share/java/log4j-1.2.jar", R_OK) == 0)
        snprintf(cp, sizeof(cp), "%s:%s:%s", ZK_CONF_DIR, ZK_JAR,
                 ZK_LOG_JARS);
    else
        snprintf(cp, sizeof(cp), "%s:%s", ZK_CONF_DIR, ZK_JAR);
    char *const argv[] = {
        "java",
        "-Xmx128m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        "-Djava.net.preferIPv4Stack=true",
        /* empty container nodes go after about a second, not a minute */
        "-Dznode.container.checkIntervalMs=1000",
        "-cp",
        cp,
        logdir,
        "-Dzookeeper.root.logger=INFO,CONSOLE",
        "org.apache.zookeeper.server.quorum.QuorumPeerMain",
        cfg,
        NULL};

    z->pid[i] = th__spawn(java, argv, z->dir[i], log, 0600);
}

/* Reaps server i if it has exited: 1 (and its pid is cleared) or 0. */
static int zk_exited(th_zk *z, int i)
{
    int st = 0;

    if (!th__reaped(&z->pid[i], &st))
        return 0;
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
        th_fail(__FILE__, __LINE__, "cannot run java (see %s/zk.log)",
                z->dir[i]);
    return 1;
}

/* Waits until every server in mask serves. 0; -1 when one exited (a port
 * taken?); fails the test after timeout_ms. */
static int zk_wait_serving(th_zk *z, unsigned mask, int64_t timeout_ms)
{
    int64_t until = th_now_ms() + timeout_ms;
    unsigned ready = 0;

    while (th_now_ms() < until) {
        for (int i = 0; i < z->n; i++) {
            if (!(mask & (1u << i)) || (ready & (1u << i)))
                continue;
            if (zk_exited(z, i))
                return -1;
            if (th_zk_serving(z, i))
                ready |= 1u << i;
        }
        if (ready == mask)
            return 0;
        th_sleep_ms(50);
    }
    for (int i = 0; i < z->n; i++)
        if ((mask & (1u << i)) && !(ready & (1u << i)))
            th_fail(__FILE__, __LINE__,
                    "zookeeper server %d (port %d) did not serve within "
                    "%lld ms (see %s/zk.log)",
                    i, z->port[i], (long long)timeout_ms, z->dir[i]);
    return 0;
}

static int port_used(const th_zk *z, int count, int port)
{
    for (int k = 0; k < count; k++)
        if (z->port[k] == port || z->peer[k] == port || z->elect[k] == port)
            return 1;
    return 0;
}

void th_zk_start(th_zk *z, int nservers)
{
    static int seq;

    if (nservers != 1 && nservers != 3)
        th_fail(__FILE__, __LINE__, "th_zk_start: 1 or 3 servers, not %d",
                nservers);
    if (access(ZK_JAR, R_OK) != 0)
        th_fail(__FILE__, __LINE__,
                "%s not found: install the zookeeper package (Debian)",
                ZK_JAR);
    for (int attempt = 0; attempt < 5; attempt++) {
        unsigned all = (1u << nservers) - 1;

        memset(z, 0, sizeof(*z));
        z->n = nservers;
        /* distinct free ports: java binds them later, so a race with
         * another process is possible; then a server exits and we retry */
        for (int i = 0; i < nservers; i++) {
            int *slot[3] = {&z->port[i], &z->peer[i], &z->elect[i]};
            for (int k = 0; k < (nservers > 1 ? 3 : 1); k++) {
                int p;
                do
                    p = th_free_port();
                while (port_used(z, i + 1, p));
                *slot[k] = p;
            }
        }
        for (int i = 0; i < nservers; i++) {
            if (snprintf(z->dir[i], sizeof(z->dir[i]), "%s/zk%d-%d",
                         th_tmpdir(), seq, i) >= (int)sizeof(z->dir[i]))
                th_fail(__FILE__, __LINE__,
                        "temporary directory name too long");
            zk_write_config(z, i);
        }
        seq++;
        for (int i = 0; i < nservers; i++)
            zk_spawn(z, i);
        if (zk_wait_serving(z, all, 60000) == 0) {
            size_t o = 0;
            for (int i = 0; i < nservers; i++)
                o += (size_t)snprintf(z->hosts + o, sizeof(z->hosts) - o,
                                      "%s127.0.0.1:%d", i ? "," : "",
                                      z->port[i]);
            return;
        }
        for (int i = 0; i < nservers; i++)
            th_zk_kill(z, i, SIGKILL);
    }
    th_fail(__FILE__, __LINE__, "zookeeper did not start (see %s)",
            z->dir[0]);
}

void th_zk_kill(th_zk *z, int i, int sig)
{
    if (i < 0 || i >= z->n || z->pid[i] <= 0)
        return;
    kill(z->pid[i], sig);
    if (sig == SIGSTOP || sig == SIGCONT)
        return;
    if (sig != SIGKILL) {
        kill(z->pid[i], SIGCONT);
        for (int k = 0; k < 200 && !zk_exited(z, i); k++)
            th_sleep_ms(50);
        if (z->pid[i] <= 0)
            return;
        kill(z->pid[i], SIGKILL);
    }
    waitpid(z->pid[i], NULL, 0);
    th__track(z->pid[i], 0);
    z->pid[i] = 0;
}

void th_zk_restart(th_zk *z, int i)
{
    if (z->pid[i] > 0)
        th_fail(__FILE__, __LINE__, "zookeeper server %d is running", i);
    for (int attempt = 0; attempt < 20; attempt++) {
        zk_spawn(z, i);
        if (zk_wait_serving(z, 1u << i, 60000) == 0)
            return;
        th_sleep_ms(250); /* its port may still be in use a moment */
    }
    th_fail(__FILE__, __LINE__, "zookeeper server %d did not restart (see "
            "%s/zk.log)", i, z->dir[i]);
}

int th_zk_4lw(th_zk *z, int i, const char *cmd, char *out, size_t cap)
{
    struct sockaddr_in a;
    struct pollfd p;
    int s, err = 0, total = 0;
    socklen_t len = sizeof(err);
    int64_t until;
    char buf[4096];

    if (out && cap)
        out[0] = '\0';
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)z->port[i]);
    s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    if (connect(s, (struct sockaddr *)&a, sizeof(a)) != 0) {
        if (errno != EINPROGRESS) {
            close(s);
            return -1;
        }
        p.fd = s;
        p.events = POLLOUT;
        if (poll(&p, 1, 1000) != 1 ||
            getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err) {
            close(s);
            return -1;
        }
    }
    if (send(s, cmd, strlen(cmd), MSG_NOSIGNAL) != (ssize_t)strlen(cmd)) {
        close(s);
        return -1;
    }
    until = th_now_ms() + 2000;
    for (;;) {
        int64_t left = until - th_now_ms();
        ssize_t n;
        if (left <= 0)
            break;
        p.fd = s;
        p.events = POLLIN;
        if (poll(&p, 1, (int)left) != 1)
            break;
        n = read(s, buf, sizeof(buf));
        if (n <= 0)
            break; /* the server closes after answering */
        if (out && cap) {
            size_t have = (size_t)total < cap - 1 ? (size_t)total : cap - 1;
            size_t take = cap - 1 - have < (size_t)n ? cap - 1 - have
                                                     : (size_t)n;
            memcpy(out + have, buf, take);
            out[have + take] = '\0';
        }
        total += (int)n;
    }
    close(s);
    return total;
}

int th_zk_serving(th_zk *z, int i)
{
    char buf[2048];

    if (z->pid[i] <= 0)
        return 0;
    return th_zk_4lw(z, i, "srvr", buf, sizeof(buf)) > 0 &&
           strstr(buf, "\nMode: ") != NULL;
}

int th_zk_leader(th_zk *z)
{
    char buf[2048];

    for (int i = 0; i < z->n; i++) {
        if (z->pid[i] <= 0)
            continue;
        if (th_zk_4lw(z, i, "srvr", buf, sizeof(buf)) > 0 &&
            (strstr(buf, "\nMode: leader") ||
             strstr(buf, "\nMode: standalone")))
            return i;
    }
    return -1;
}

int th_zk_wait_leader(th_zk *z, int64_t timeout_ms)
{
    int64_t until = th_now_ms() + timeout_ms;
    int leader;

    while ((leader = th_zk_leader(z)) < 0 && th_now_ms() < until)
        th_sleep_ms(50);
    return leader;
}

long long th_zk_stat(const char *answer, const char *key)
{
    size_t kl = strlen(key);

    for (const char *p = answer; (p = strstr(p, key)); p += kl) {
        const char *v = p + kl;
        if (p != answer && p[-1] != '\n')
            continue; /* only at the start of a line */
        while (*v == ':' || *v == ' ' || *v == '\t' || *v == '=')
            v++;
        if ((*v >= '0' && *v <= '9') || *v == '-')
            return atoll(v);
    }
    return -1;
}


/* ------------------------------------------------------------------------ */
/* etcd members                                                              */
/* ------------------------------------------------------------------------ */

static const char *find_in_path(const char *name, char *found, size_t cap)
{
    const char *path = getenv("PATH");

    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t len = strcspn(path, ":");
        snprintf(found, cap, "%.*s/%s", (int)len, len ? path : ".", name);
        if (access(found, X_OK) == 0)
            return found;
        path += len + (path[len] == ':');
    }
    return NULL;
}

int th_etcd_available(void)
{
    char a[1024], b[1024];
    return find_in_path("etcd", a, sizeof(a)) &&
           find_in_path("etcdctl", b, sizeof(b));
}

int th_etcd_http(th_etcd *e, int i, const char *path, const char *body,
                 char *out, size_t cap)
{
    struct sockaddr_in a;
    struct pollfd p;
    char req[8192], *resp;
    size_t total = 0, rcap = 1 << 16;
    int s, status = -1;
    int64_t until = th_now_ms() + 3000;

    if (out && cap)
        out[0] = '\0';
    s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return -1;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)e->port[i]);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(s, (struct sockaddr *)&a, sizeof(a)) != 0 &&
        errno != EINPROGRESS) {
        close(s);
        return -1;
    }
    p.fd = s;
    p.events = POLLOUT;
    if (poll(&p, 1, 1000) != 1 || !(p.revents & POLLOUT)) {
        close(s);
        return -1;
    }
    int n = snprintf(req, sizeof(req),
                     "%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\n"
                     "Content-Type: application/json\r\n"
                     "Content-Length: %zu\r\n\r\n%s",
                     body ? "POST" : "GET", path, body ? strlen(body) : 0,
                     body ? body : "");
    if (send(s, req, (size_t)n, MSG_NOSIGNAL) != n) {
        close(s);
        return -1;
    }
    /* the whole answer (/metrics is over 64 KiB), up to 16 MiB */
    resp = malloc(rcap);
    if (!resp)
        th_fail(__FILE__, __LINE__, "out of memory");
    for (;;) {
        int64_t left = until - th_now_ms();
        if (left <= 0)
            break;
        p.events = POLLIN;
        if (poll(&p, 1, (int)left) != 1)
            break;
        if (total + 1 >= rcap) {
            if (rcap >= (size_t)16 << 20)
                break;
            char *bigger = realloc(resp, rcap * 2);
            if (!bigger)
                break;
            resp = bigger;
            rcap *= 2;
        }
        ssize_t r = recv(s, resp + total, rcap - 1 - total, 0);
        if (r <= 0)
            break;
        total += (size_t)r;
    }
    close(s);
    resp[total] = '\0';
    if (total > 12 && !strncmp(resp, "HTTP/1.", 7)) {
        status = atoi(resp + 9);
        const char *b = strstr(resp, "\r\n\r\n");
        if (out && cap)
            snprintf(out, cap, "%s", b ? b + 4 : "");
    }
    free(resp);
    return status;
}

static int etcd_healthy(th_etcd *e, int i)
{
    char out[256];
    return th_etcd_http(e, i, "/health", NULL, out, sizeof(out)) == 200 &&
           strstr(out, "\"true\"") != NULL;
}

static void etcd_spawn(th_etcd *e, int i, int fresh)
{
    static char bin[1024];
    char name[16], data[600], log[700], client[160], peer[64], cluster[512];
    char certf[600], keyf[600];
    char *argv[40];
    int k = 0;
    size_t o = 0;

    if (!bin[0] && !find_in_path("etcd", bin, sizeof(bin)))
        th_fail(__FILE__, __LINE__, "etcd not found: apt-get install "
                                    "etcd-server etcd-client");
    snprintf(name, sizeof(name), "m%d", i);
    snprintf(data, sizeof(data), "%s/data", e->dir[i]);
    snprintf(log, sizeof(log), "%s/etcd.log", e->dir[i]);
    if (e->tls_port && i == 0)
        snprintf(client, sizeof(client),
                 "http://127.0.0.1:%d,https://127.0.0.1:%d", e->port[i],
                 e->tls_port);
    else
        snprintf(client, sizeof(client), "http://127.0.0.1:%d", e->port[i]);
    snprintf(peer, sizeof(peer), "http://127.0.0.1:%d", e->peer[i]);
    for (int m = 0; m < e->n; m++)
        o += (size_t)snprintf(cluster + o, sizeof(cluster) - o,
                              "%sm%d=http://127.0.0.1:%d", m ? "," : "", m,
                              e->peer[m]);
    argv[k++] = "etcd";
    argv[k++] = "--name";
    argv[k++] = name;
    argv[k++] = "--data-dir";
    argv[k++] = data;
    argv[k++] = "--listen-client-urls";
    argv[k++] = client;
    argv[k++] = "--advertise-client-urls";
    argv[k++] = client;
    argv[k++] = "--listen-peer-urls";
    argv[k++] = peer;
    argv[k++] = "--initial-advertise-peer-urls";
    argv[k++] = peer;
    argv[k++] = "--initial-cluster";
    argv[k++] = cluster;
    argv[k++] = "--initial-cluster-state";
    argv[k++] = fresh ? "new" : "existing";
    argv[k++] = "--heartbeat-interval=50";
    argv[k++] = "--election-timeout=500";
    argv[k++] = "--log-level=warn";
    if (e->tls_port && i == 0) {
        snprintf(certf, sizeof(certf), "--cert-file=%s", e->cert);
        snprintf(keyf, sizeof(keyf), "--key-file=%s", e->key);
        argv[k++] = certf;
        argv[k++] = keyf;
    }
    argv[k] = NULL;

    mkdir(e->dir[i], 0700);
    e->pid[i] = th__spawn(bin, argv, e->dir[i], log, 0600);
}

static int etcd_exited(th_etcd *e, int i)
{
    return th__reaped(&e->pid[i], NULL);
}

/* 0 when every member in mask is healthy; -1 when one exited. */
static int etcd_wait_healthy(th_etcd *e, unsigned mask, int64_t timeout_ms)
{
    int64_t until = th_now_ms() + timeout_ms;
    unsigned ready = 0;

    while (th_now_ms() < until) {
        for (int i = 0; i < e->n; i++) {
            if (!(mask & (1u << i)) || (ready & (1u << i)))
                continue;
            if (etcd_exited(e, i))
                return -1;
            if (etcd_healthy(e, i))
                ready |= 1u << i;
        }
        if (ready == mask)
            return 0;
        th_sleep_ms(50);
    }
    th_fail(__FILE__, __LINE__, "etcd did not become healthy within %lld ms "
            "(see %s/etcd.log)", (long long)timeout_ms, e->dir[0]);
}

static void etcd_start(th_etcd *e, int n, const char *cert, const char *key);

void th_etcd_start(th_etcd *e, int n)
{
    etcd_start(e, n, NULL, NULL);
}

void th_etcd_start_tls(th_etcd *e, const char *cert, const char *key)
{
    etcd_start(e, 1, cert, key);
}

static void etcd_start(th_etcd *e, int n, const char *cert, const char *key)
{
    static int seq;

    if (n != 1 && n != 3)
        th_fail(__FILE__, __LINE__, "th_etcd_start: 1 or 3 members, not %d",
                n);
    if (!th_etcd_available())
        th_fail(__FILE__, __LINE__, "etcd/etcdctl not found: apt-get "
                                    "install etcd-server etcd-client");
    for (int attempt = 0; attempt < 5; attempt++) {
        memset(e, 0, sizeof(*e));
        e->n = n;
        for (int i = 0; i < n; i++) {
            int p;
            for (int k = 0; k < 2; k++) {
                int clash;
                do {
                    p = th_free_port();
                    clash = 0;
                    for (int m = 0; m <= i; m++)
                        clash |= e->port[m] == p || e->peer[m] == p;
                } while (clash);
                if (k == 0)
                    e->port[i] = p;
                else
                    e->peer[i] = p;
            }
        }
        if (cert) {
            int p;
            do
                p = th_free_port();
            while (p == e->port[0] || p == e->peer[0]);
            e->tls_port = p;
            snprintf(e->cert, sizeof(e->cert), "%s", cert);
            snprintf(e->key, sizeof(e->key), "%s", key);
        }
        for (int i = 0; i < n; i++)
            if (snprintf(e->dir[i], sizeof(e->dir[i]), "%s/etcd%d-%d",
                         th_tmpdir(), seq, i) >= (int)sizeof(e->dir[i]))
                th_fail(__FILE__, __LINE__,
                        "temporary directory name too long");
        seq++;
        for (int i = 0; i < n; i++)
            etcd_spawn(e, i, 1);
        if (etcd_wait_healthy(e, (1u << n) - 1, 60000) == 0) {
            size_t o = 0;
            for (int i = 0; i < n; i++)
                o += (size_t)snprintf(e->hosts + o, sizeof(e->hosts) - o,
                                      "%s127.0.0.1:%d", i ? "," : "",
                                      e->port[i]);
            return;
        }
        for (int i = 0; i < n; i++)
            th_etcd_kill(e, i, SIGKILL);
    }
    th_fail(__FILE__, __LINE__, "etcd did not start (see %s/etcd.log)",
            e->dir[0]);
}

void th_etcd_kill(th_etcd *e, int i, int sig)
{
    if (i < 0 || i >= e->n || e->pid[i] <= 0)
        return;
    kill(e->pid[i], sig);
    if (sig == SIGSTOP || sig == SIGCONT)
        return;
    if (sig != SIGKILL) {
        kill(e->pid[i], SIGCONT);
        for (int k = 0; k < 200 && !etcd_exited(e, i); k++)
            th_sleep_ms(50);
        if (e->pid[i] <= 0)
            return;
        kill(e->pid[i], SIGKILL);
    }
    waitpid(e->pid[i], NULL, 0);
    th__track(e->pid[i], 0);
    e->pid[i] = 0;
}

void th_etcd_restart(th_etcd *e, int i)
{
    th_etcd_restart_set(e, 1u << i);
}

void th_etcd_restart_set(th_etcd *e, unsigned mask)
{
    for (int i = 0; i < e->n; i++)
        if ((mask & (1u << i)) && e->pid[i] > 0)
            th_fail(__FILE__, __LINE__, "etcd member %d is running", i);
    for (int attempt = 0; attempt < 20; attempt++) {
        /* all of them before waiting: a cluster member serves only once
         * a quorum is back */
        for (int i = 0; i < e->n; i++)
            if ((mask & (1u << i)) && e->pid[i] <= 0)
                etcd_spawn(e, i, 0);
        if (etcd_wait_healthy(e, mask, 60000) == 0)
            return;
        th_sleep_ms(250);
    }
    th_fail(__FILE__, __LINE__, "etcd members 0x%x did not restart (see "
            "%s/etcd.log)", mask, e->dir[0]);
}

/* A decimal string field "name":"123" of a JSON text, or 0. Unsigned:
 * member ids are random 64-bit numbers, half of them above LLONG_MAX
 * (strtoll would clamp them all to one value). */
static unsigned long long json_num(const char *json, const char *name)
{
    char key[64];
    const char *p;

    snprintf(key, sizeof(key), "\"%s\":", name);
    p = strstr(json, key);
    if (!p)
        return 0;
    p += strlen(key);
    if (*p == '"')
        p++;
    return strtoull(p, NULL, 10);
}

int th_etcd_leader(th_etcd *e)
{
    for (int i = 0; i < e->n; i++) {
        char out[2048];
        if (e->pid[i] <= 0 ||
            th_etcd_http(e, i, "/v3/maintenance/status", "{}", out,
                         sizeof(out)) != 200)
            continue;
        unsigned long long leader = json_num(out, "leader");
        unsigned long long me = json_num(out, "member_id");
        if (leader != 0 && leader == me)
            return i;
    }
    return -1;
}

int th_etcd_wait_leader(th_etcd *e, int64_t timeout_ms)
{
    int64_t until = th_now_ms() + timeout_ms;
    int l;

    while ((l = th_etcd_leader(e)) < 0 && th_now_ms() < until)
        th_sleep_ms(50);
    return l;
}

int th_etcdctl(th_etcd *e, char *out, size_t cap, const char *fmt, ...)
{
    char args[4096], cmd[5000], eps[512];
    size_t o = 0, got = 0;
    va_list ap;
    FILE *f;
    int st;

    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    for (int i = 0; i < e->n; i++)
        o += (size_t)snprintf(eps + o, sizeof(eps) - o, "%shttp://127.0.0.1:%d",
                              i ? "," : "", e->port[i]);
    snprintf(cmd, sizeof(cmd),
             "ETCDCTL_API=3 timeout 20 etcdctl --endpoints=%s "
             "--dial-timeout=2s --command-timeout=5s %s 2>&1",
             eps, args);
    fflush(stdout);
    fflush(stderr);
    f = popen(cmd, "r");
    if (!f)
        th_fail(__FILE__, __LINE__, "popen: %s", strerror(errno));
    if (out && cap) {
        out[0] = '\0';
        size_t r;
        while (got + 1 < cap && (r = fread(out + got, 1, cap - 1 - got, f)) > 0)
            got += r;
        out[got] = '\0';
    }
    {
        char sink[512];
        while (fread(sink, 1, sizeof(sink), f) > 0)
            ;
    }
    st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

#ifdef TH_ZK_CLIENT
#include <zookeeper/zookeeper.h>

typedef struct zk_conn {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;
    int auth_rc;
    int auth_done;
} zk_conn;

static void zk_quiet(const char *message)
{
    (void)message;
}

static void zk_watch(zhandle_t *zh, int type, int state, const char *path,
                     void *ctx)
{
    zk_conn *w = ctx;

    (void)zh;
    (void)path;
    if (type != ZOO_SESSION_EVENT)
        return;
    pthread_mutex_lock(&w->mu);
    w->state = state;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void zk_auth_done(int rc, const void *data)
{
    zk_conn *w = (zk_conn *)data;

    pthread_mutex_lock(&w->mu);
    w->auth_rc = rc;
    w->auth_done = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static int zk_cond_wait(zk_conn *w, int64_t until)
{
    struct timespec ts;
    int64_t ms;

    clock_gettime(CLOCK_REALTIME, &ts);
    ms = until - th_now_ms();
    if (ms <= 0)
        return -1;
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return pthread_cond_timedwait(&w->cv, &w->mu, &ts) == 0 ? 0 : -1;
}

void *th_zk_connect(const char *hosts, const char *digest)
{
    zk_conn *w = calloc(1, sizeof(*w));
    int64_t until = th_now_ms() + 10000;
    zhandle_t *zh;

    if (!w)
        th_fail(__FILE__, __LINE__, "out of memory");
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    zh = zookeeper_init2(hosts, zk_watch, 10000, NULL, w, 0, zk_quiet);
    if (!zh)
        th_fail(__FILE__, __LINE__, "zookeeper_init2(%s): %s", hosts,
                strerror(errno));
    pthread_mutex_lock(&w->mu);
    while (w->state != ZOO_CONNECTED_STATE && th_now_ms() < until)
        zk_cond_wait(w, until);
    int connected = w->state == ZOO_CONNECTED_STATE;
    pthread_mutex_unlock(&w->mu);
    if (!connected)
        th_fail(__FILE__, __LINE__, "cannot connect to zookeeper at %s",
                hosts);
    if (digest) {
        int rc = zoo_add_auth(zh, "digest", digest, (int)strlen(digest),
                              zk_auth_done, w);
        if (rc != ZOK)
            th_fail(__FILE__, __LINE__, "zoo_add_auth: %s", zerror(rc));
        pthread_mutex_lock(&w->mu);
        while (!w->auth_done && th_now_ms() < until)
            zk_cond_wait(w, until);
        rc = w->auth_done ? w->auth_rc : ZOPERATIONTIMEOUT;
        pthread_mutex_unlock(&w->mu);
        if (rc != ZOK)
            th_fail(__FILE__, __LINE__, "zookeeper digest auth: %s",
                    zerror(rc));
    }
    return zh;
}

void th_zk_close(void *handle)
{
    zhandle_t *zh = handle;
    zk_conn *w;

    if (!zh)
        return;
    w = (zk_conn *)zoo_get_context(zh);
    zookeeper_close(zh);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

int th_zk_delete_children(void *handle, const char *path)
{
    struct String_vector kids;
    char child[2048];
    int rc, n = 0;

    rc = zoo_get_children(handle, path, 0, &kids);
    if (rc == ZNONODE)
        return -1;
    if (rc != ZOK)
        th_fail(__FILE__, __LINE__, "zoo_get_children(%s): %s", path,
                zerror(rc));
    for (int i = 0; i < kids.count; i++) {
        snprintf(child, sizeof(child), "%s/%s", path, kids.data[i]);
        rc = zoo_delete(handle, child, -1);
        if (rc == ZOK)
            n++;
        else if (rc != ZNONODE)
            th_fail(__FILE__, __LINE__, "zoo_delete(%s): %s", child,
                    zerror(rc));
    }
    deallocate_String_vector(&kids);
    return n;
}
#endif /* TH_ZK_CLIENT */

void th_make_cert(const char *dir, const char *what)
{
    char cmd[4096];

    snprintf(cmd, sizeof(cmd),
             "(cd '%s' && { [ -e ca.pem ] || openssl req -x509 -newkey "
             "rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj "
             "/CN=dlock-test-ca; } && openssl req -newkey rsa:2048 -nodes "
             "-keyout %s.key -out %s.csr -subj /CN=127.0.0.1 && printf "
             "'subjectAltName=IP:127.0.0.1\\n' > %s.ext && openssl x509 "
             "-req -in %s.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out "
             "%s.pem -days 2 -extfile %s.ext) >/dev/null 2>&1",
             dir, what, what, what, what, what, what);
    if (system(cmd) != 0)
        th_fail(__FILE__, __LINE__,
                "openssl could not make test certificates (apt-get install "
                "openssl)");
}

/* ------------------------------------------------------------------------ */
/* A holder with a wrong wall clock                                          */
/* ------------------------------------------------------------------------ */

#define FAKETIME_LIB "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"

int th_faketime_available(void)
{
    return access(FAKETIME_LIB, R_OK) == 0;
}

int th_read_line(int fd, char *out, size_t cap, int64_t timeout_ms)
{
    int64_t until = th_now_ms() + timeout_ms;
    size_t n = 0;

    while (n + 1 < cap) {
        struct pollfd p = {fd, POLLIN, 0};
        int64_t left = until - th_now_ms();
        if (left <= 0 || poll(&p, 1, (int)left) != 1)
            break;
        ssize_t r = read(fd, out + n, 1);
        if (r <= 0)
            break;
        if (out[n] == '\n') {
            out[n] = '\0';
            return (int)n;
        }
        n++;
    }
    out[n] = '\0';
    return -1;
}

pid_t th_skewed_holder(const char *shift, const char *uri, const char *name,
                       int64_t ttl_ms, int64_t hold_ms, int *rfd)
{
    if (th_in_process)
        th_fail(__FILE__, __LINE__,
                "this test starts a holder process, and the store is "
                "in-process (mem://): mark it TP() in its table");
    int p[2];
    pid_t pid;
    char self[1024], ttl[32], hold[32], fd[16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);

    if (n <= 0 || pipe(p) != 0)
        th_fail(__FILE__, __LINE__, "readlink/pipe: %s", strerror(errno));
    self[n] = '\0';
    snprintf(ttl, sizeof(ttl), "%lld", (long long)ttl_ms);
    snprintf(hold, sizeof(hold), "%lld", (long long)hold_ms);
    snprintf(fd, sizeof(fd), "%d", p[1]);
    pid = fork_tied(0);
    if (pid == 0) {
        close(p[0]);
        setenv("LD_PRELOAD", FAKETIME_LIB, 1);
        setenv("FAKETIME", shift, 1);
        setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1", 1);
        setenv("FAKETIME_NO_CACHE", "1", 1);
        execl(self, self, "--th-skewed-holder", uri, name, ttl, hold, fd,
              (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    *rfd = p[0];
    return pid;
}

/* The child of th_skewed_holder(), run from th_main. */
static int skewed_holder_main(char **argv)
{
    const char *uri = argv[2], *name = argv[3];
    int64_t hold = atoll(argv[5]);
    int fd = atoi(argv[6]);
    dlock_client *c;
    dlock_options o;
    dlock *l;
    char line[128];

    memset(&o, 0, sizeof(o));
    o.ttl_ms = atoll(argv[4]);
    if (dlock_client_open(&c, uri, NULL) != DLOCK_OK ||
        dlock_open(&l, c, name, &o) != DLOCK_OK ||
        dlock_acquire(l, 10000) != DLOCK_OK) {
        fprintf(stderr, "skewed holder: %s\n", dlock_errmsg());
        return 2;
    }
    int len = snprintf(line, sizeof(line), "held %llu %lld\n",
                       (unsigned long long)dlock_token(l),
                       (long long)time(NULL));
    if (write(fd, line, (size_t)len) != len)
        return 3;
    if (hold < 0)
        for (;;)
            pause();
    th_sleep_ms(hold);
    int rc = dlock_release(l);
    len = snprintf(line, sizeof(line), "released %d\n", rc);
    if (write(fd, line, (size_t)len) != len)
        return 3;
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

void th_child(int argc, char **argv)
{
    if (argc == 7 && !strcmp(argv[1], "--th-skewed-holder"))
        exit(skewed_holder_main(argv));
}

int th_main(int argc, char **argv, const th_test *tests)
{
    const char *filter = argc > 1 ? argv[1] : NULL;
    const char *vg = getenv("DLOCK_TEST_VALGRIND");
    int ran = 0;

    owner_pid = getpid();
    atexit(cleanup);
    signal(SIGPIPE, SIG_IGN);
    for (const th_test *t = tests; t->name; t++) {
        if (filter && !strstr(t->name, filter))
            continue;
        if (t->kernel_wait && vg && *vg && strcmp(vg, "0") != 0) {
            printf("skip %-40s (blocks in F_OFD_SETLKW: stalls valgrind)\n",
                   t->name);
            ran++;
            continue;
        }
        if (t->procs && th_in_process) {
            printf("skip %-40s (needs another process: an in-process "
                   "store)\n",
                   t->name);
            ran++;
            continue;
        }
        int64_t t0 = th_now_ms();
        current = t->name;
        t->fn();
        printf("ok   %-40s %6lld ms\n", t->name,
               (long long)(th_now_ms() - t0));
        fflush(stdout);
        ran++;
    }
    current = NULL;
    if (ran == 0) {
        fprintf(stderr, "no test matches '%s'\n", filter ? filter : "");
        return 1;
    }
    return 0;
}

void th_lost_cb(dlock *l, uint64_t token, void *arg)
{
    th_lost *b = arg;

    (void)l;
    pthread_mutex_lock(&b->mu);
    b->calls++;
    b->token = token;
    b->at = th_now_ms();
    pthread_mutex_unlock(&b->mu);
}

int th_lost_calls(th_lost *b)
{
    pthread_mutex_lock(&b->mu);
    int n = b->calls;
    pthread_mutex_unlock(&b->mu);
    return n;
}

int th_lost_wait(th_lost *b, int want, int64_t ms)
{
    int64_t until = th_now_ms() + ms;

    while (th_lost_calls(b) < want && th_now_ms() < until)
        th_sleep_ms(5);
    return th_lost_calls(b);
}

int th_lost_within(th_lost *b, int64_t ms)
{
    int64_t until = th_now_ms() + ms;

    while (th_lost_calls(b) == 0 && th_now_ms() < until)
        th_sleep_ms(10);
    return th_lost_calls(b);
}

void th_lost_reset(th_lost *b)
{
    pthread_mutex_lock(&b->mu);
    b->calls = 0;
    pthread_mutex_unlock(&b->mu);
}

uint64_t th_break_told(dlock_client *op, dlock *la, const char *name,
                       th_lost *n, int64_t told_ms, dlock_info *ev)
{
    CHECK_OK(dlock_acquire(la, 0));
    uint64_t t1 = dlock_token(la);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_break(op, name, ev));
    CHECK_EQ(ev->held, 1);
    CHECK_EQ(ev->token, t1);
    CHECK_CONTAINS(ev->holder, "pid");
    CHECK_EQ(th_lost_wait(n, 1, told_ms), 1);
    CHECK_OP(n->at - t0, <, told_ms);
    CHECK_EQ(n->token, t1);
    CHECK_EQ(dlock_held(la), DLOCK_ELOST);
    return t1;
}

static void holder_lost(dlock *l, uint64_t token, void *arg)
{
    th_holder *h = arg;

    (void)l;
    h->lost_token = token;
    __atomic_add_fetch(&h->lost_calls, 1, __ATOMIC_SEQ_CST);
}

int th_holder_child(void *arg)
{
    th_holder *h = arg;
    dlock_client *c = th_client(h->uri, h->patient ? th_patient() : NULL);
    dlock *l = th_handle_lost(c, h->name, h->ttl, 0, holder_lost, h);

    if (dlock_acquire(l, 5000) != DLOCK_OK) {
        fprintf(stderr, "holder child: %s\n", dlock_errmsg());
        return 2;
    }
    h->token = dlock_token(l);
    if (h->settle_ms)
        th_sleep_ms(h->settle_ms);
    __atomic_store_n(&h->ready, 1, __ATOMIC_SEQ_CST);
    (void)th_wait_flag(&h->go, 30000);
    /* told to go after a freeze: give the client a moment to learn it
     * lost, then release */
    int64_t t0 = th_now_ms();
    while (!__atomic_load_n(&h->lost_calls, __ATOMIC_SEQ_CST) &&
           th_now_ms() - t0 < h->lost_ms)
        th_sleep_ms(10);
    h->lost_after_cont = th_now_ms() - t0;
    h->held_before_release = dlock_held(l);
    h->release_rc = dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

pid_t th_holder_start(th_holder *h, const char *uri, const char *name,
                      int64_t ttl)
{
    snprintf(h->uri, sizeof(h->uri), "%s", uri);
    snprintf(h->name, sizeof(h->name), "%s", name);
    h->ttl = ttl;
    pid_t pid = th_fork(th_holder_child, h);
    CHECK(th_wait_flag(&h->ready, 10000));
    return pid;
}

void th_events_init(th_events *s)
{
    memset(s, 0, sizeof(*s));
    pthread_mutex_init(&s->mu, NULL);
}

void th_events_cb(const dlock_event *e, void *arg)
{
    th_events *s = arg;

    pthread_mutex_lock(&s->mu);
    if (s->n < TH_EVENTS_MAX) {
        s->type[s->n] = e->type;
        s->at[s->n] = th_now_ms();
        s->left[s->n] = e->left_ms;
        s->token[s->n] = e->token;
        s->held_ms[s->n] = e->held_ms;
        s->rc[s->n] = e->rc;
        s->thread[s->n] = pthread_self();
        snprintf(s->why[s->n], sizeof(s->why[0]), "%s", e->why);
        s->n++;
    }
    pthread_mutex_unlock(&s->mu);
}

int th_events_count(th_events *s, int type)
{
    int n = 0;

    pthread_mutex_lock(&s->mu);
    for (int i = 0; i < s->n; i++)
        n += s->type[i] == type;
    pthread_mutex_unlock(&s->mu);
    return n;
}

int th_events_first(const th_events *s, int type)
{
    for (int i = 0; i < s->n; i++)
        if (s->type[i] == type)
            return i;
    return -1;
}

int th_events_wait(th_events *s, int type, int64_t ms)
{
    for (int64_t until = th_now_ms() + ms;;) {
        pthread_mutex_lock(&s->mu);
        int i = th_events_first(s, type);
        pthread_mutex_unlock(&s->mu);
        if (i >= 0 || th_now_ms() >= until)
            return i;
        th_sleep_ms(5);
    }
}

static void *waiter_thread(void *arg)
{
    th_waiter *w = arg;
    int64_t t0 = th_now_ms();

    __atomic_store_n(&w->started, 1, __ATOMIC_SEQ_CST);
    w->rc = w->shared
                ? dlock_acquire_shared(w->l, w->wait_ms ? w->wait_ms : 60000)
                : dlock_acquire(w->l, w->wait_ms ? w->wait_ms : 60000);
    int64_t now = th_now_ms();
    w->took = now - t0;
    snprintf(w->msg, sizeof(w->msg), "%s", dlock_errmsg());
    w->token = dlock_token(w->l);
    __atomic_store_n(&w->done_at, now, __ATOMIC_SEQ_CST);
    __atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
    if (w->rc == DLOCK_OK) {
        if (w->hold_ms)
            th_sleep_ms(w->hold_ms);
        if (w->wait_go)
            (void)th_wait_flag(&w->go, 60000);
        w->release_rc = dlock_release(w->l);
    }
    return NULL;
}

void th_waiter_start(th_waiter *w, pthread_t *th)
{
    w->rc = -99;
    w->release_rc = 0;
    w->token = 0;
    w->done_at = w->took = 0;
    w->msg[0] = '\0';
    w->started = w->done = w->go = 0;
    CHECK_EQ(pthread_create(th, NULL, waiter_thread, w), 0);
}

int th_waiter_returned(th_waiter *w, int64_t ms)
{
    return th_wait_flag(&w->done, ms);
}

void th_waiter_go(th_waiter *w)
{
    __atomic_store_n(&w->go, 1, __ATOMIC_SEQ_CST);
}
