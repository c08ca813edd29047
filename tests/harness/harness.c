/*
 * harness.c -- the test runner and real-store helpers (see test.h).
 */
#include "test.h"

#include <hiredis.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_SERVERS 8

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

pid_t th_fork(int (*fn)(void *), void *arg)
{
    pid_t pid;

    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0)
        th_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
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

static void track(pid_t pid, int running)
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
        th_fail(__FILE__, __LINE__, "too many redis servers");
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

static int redis_launch(th_redis *r)
{
    char conf[700];
    FILE *f;

    snprintf(conf, sizeof(conf), "%s/redis.conf", r->dir);
    f = fopen(conf, "w");
    if (!f)
        th_fail(__FILE__, __LINE__, "cannot write %s", conf);
    fprintf(f,
            "port %d\nbind 127.0.0.1\nunixsocket %s\nunixsocketperm 700\n"
            "save \"\"\nappendonly no\ndir %s\nlogfile %s/redis.log\n"
            "daemonize no\n%s\n",
            r->port, r->sock, r->dir, r->dir, r->extra);
    fclose(f);
    r->pid = fork();
    if (r->pid < 0)
        th_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
    if (r->pid == 0) {
        int null = open("/dev/null", O_RDWR);
        setsid();
        dup2(null, 0);
        dup2(null, 1);
        execlp("redis-server", "redis-server", conf, (char *)NULL);
        _exit(127);
    }
    track(r->pid, 1);
    for (int i = 0; i < 250; i++) {
        int st;
        if (waitpid(r->pid, &st, WNOHANG) == r->pid) {
            track(r->pid, 0);
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
    track(r->pid, 0);
    r->pid = 0;
    return -1;
}

void th_redis_start(th_redis *r, const char *extra)
{
    static int n;

    memset(r, 0, sizeof(*r));
    snprintf(r->dir, sizeof(r->dir), "%s/redis%d", th_tmpdir(), n++);
    mkdir(r->dir, 0700);
    snprintf(r->sock, sizeof(r->sock), "%s/redis.sock", r->dir);
    snprintf(r->extra, sizeof(r->extra), "%s", extra ? extra : "");
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
    track(r->pid, 0);
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

    th_redis_cmd(r, buf, sizeof(buf), "INFO commandstats");
    snprintf(key, sizeof(key), "cmdstat_%s:calls=", cmd);
    p = strstr(buf, key);
    return p ? atoll(p + strlen(key)) : 0;
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
