/* SPDX-License-Identifier: MIT */
/*
 * bench_exporter.c -- the target "an exporter scrape of 10,000
 * locks takes at most 1 s": this program holds N locks (10,000 by default)
 * in one process, starts `dlock exporter` on the same store, and times
 * whole scrapes of GET /metrics (connect, request, the last byte of the
 * answer), as Prometheus would do them.
 *
 *   dlock_bench_exporter /path/to/dlock [URI] [N] [SCRAPES] [PAGE]
 *
 * URI: the store (default: a file:// store in a new temporary directory,
 * removed at the end). PAGE: the exporter's --page (default: its own,
 * 1000). The file store's locks are the holder's kernel
 * locks: one process holding N of them needs N descriptors, so the soft
 * RLIMIT_NOFILE is raised to the hard one (N must fit below it).
 * Prints a markdown row: the median and the slowest scrape, and the
 * median's ratio to the 1 s target. Each scrape is checked: HTTP 200,
 * dlock_exporter_up 1 and dlock_exporter_locks N for the store.
 */
#include "common.h"

#include <dlock.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

const char bench_prog[] = "bench_exporter";

#define DEFAULT_LOCKS 10000
#define DEFAULT_SCRAPES 10
/* A scrape slower than this fails the run (the target is 1 s; 30 s is
 * Prometheus' longest usual scrape timeout). */
#define SCRAPE_LIMIT_S 30

static pid_t exporter_pid;

/* Starts `dlock exporter --listen 127.0.0.1:0 --store uri`; returns the
 * port it printed (read from a pipe, the first line, within 30 s). */
static int start_exporter(const char *cli, const char *uri, const char *page)
{
    int fds[2];
    char line[256];
    FILE *f;
    unsigned port = 0;

    if (pipe(fds) != 0)
        die("pipe", strerror(errno));
    exporter_pid = fork();
    if (exporter_pid < 0)
        die("fork", strerror(errno));
    if (exporter_pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        /* --cache-ttl 0: each scrape measures a listing, not the cache */
        if (page)
            execl(cli, cli, "exporter", "--listen", "127.0.0.1:0", "--store",
                  uri, "--cache-ttl", "0", "--page", page, (char *)NULL);
        else
            execl(cli, cli, "exporter", "--listen", "127.0.0.1:0", "--store",
                  uri, "--cache-ttl", "0", (char *)NULL);
        perror("exec dlock");
        _exit(127);
    }
    close(fds[1]);
    f = fdopen(fds[0], "r");
    if (!f)
        die("fdopen", strerror(errno));
    /* the first line comes once it listens (milliseconds); the exporter
     * exits at once on an error, which ends the read */
    if (!fgets(line, sizeof(line), f) ||
        sscanf(line, "dlock exporter: listening on http://127.0.0.1:%u", &port) != 1 ||
        port == 0 || port > 65535)
        die("dlock exporter", "did not start (no 'listening on' line)");
    fclose(f); /* the exporter's later lines go to a closed pipe: none
                * come (it prints only at start) */
    return (int)port;
}

static void stop_exporter(void)
{
    int st;

    if (exporter_pid > 0) {
        kill(exporter_pid, SIGTERM);
        waitpid(exporter_pid, &st, 0);
        exporter_pid = 0;
    }
}

/* One scrape; the answer's body in *body (malloc'ed). Returns its time in
 * ns. */
static int64_t scrape(int port, char **body, size_t *len)
{
    struct sockaddr_in a = {0};
    struct timeval tv = {SCRAPE_LIMIT_S, 0};
    static const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n"
                              "X-Prometheus-Scrape-Timeout-Seconds: 30\r\n\r\n";
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    int64_t t0;
    int s;

    if (!buf)
        die("malloc", "out of memory");
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    t0 = now_ns();
    s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0)
        die("socket", strerror(errno));
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    if (connect(s, (struct sockaddr *)&a, sizeof(a)) != 0)
        die("connect", strerror(errno));
    if (write(s, req, sizeof(req) - 1) != (ssize_t)(sizeof(req) - 1))
        die("write", strerror(errno));
    for (;;) { /* HTTP/1.0: the answer ends when the server closes */
        ssize_t r;
        if (n == cap) {
            char *p = realloc(buf, cap *= 2);
            if (!p)
                die("realloc", "out of memory");
            buf = p;
        }
        r = read(s, buf + n, cap - n);
        if (r < 0)
            die("read", errno == EAGAIN ? "no answer within 30 s"
                                        : strerror(errno));
        if (r == 0)
            break;
        n += (size_t)r;
    }
    t0 = now_ns() - t0;
    close(s);
    if (n == cap) {
        char *p = realloc(buf, cap + 1);
        if (!p)
            die("realloc", "out of memory");
        buf = p;
    }
    buf[n] = '\0';
    *body = buf;
    *len = n;
    return t0;
}

/* The answer is whole: 200, the store up, N locks listed. */
static void check(const char *body, const char *store, long want)
{
    char pat[1200];

    if (strncmp(body, "HTTP/1.0 200", 12) && strncmp(body, "HTTP/1.1 200", 12))
        die("scrape", "not HTTP 200");
    snprintf(pat, sizeof(pat), "\ndlock_exporter_up{store=\"%s\"} 1\n", store);
    if (!strstr(body, pat))
        die("scrape", "the store is not up in the answer");
    snprintf(pat, sizeof(pat), "\ndlock_exporter_locks{store=\"%s\"} %ld\n",
             store, want);
    if (!strstr(body, pat))
        die("scrape", "dlock_exporter_locks is not the number of locks held");
}

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char path[4096];

    if (!d)
        return;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    const char *cli, *uri, *page = NULL;
    long n = DEFAULT_LOCKS, scrapes = DEFAULT_SCRAPES;
    char tmpdir[] = "/tmp/dlock-bench-exporter-XXXXXX", fileuri[256];
    dlock_client *c;
    dlock **locks;
    int64_t *ns;
    struct rlimit rl;
    int port, rc, own_dir = 0;
    size_t bytes = 0;
    int64_t t0;

    if (argc < 2 || argc > 6) {
        fprintf(stderr,
                "usage: %s /path/to/dlock [URI] [N] [SCRAPES] [PAGE]\n",
                argv[0]);
        return 2;
    }
    cli = argv[1];
    uri = argc > 2 && argv[2][0] ? argv[2] : NULL;
    if (argc > 3)
        n = strtol(argv[3], NULL, 10);
    if (argc > 4)
        scrapes = strtol(argv[4], NULL, 10);
    if (argc > 5)
        page = argv[5];
    if (n < 1 || n > 1000000 || scrapes < 1 || scrapes > 1000)
        die("arguments", "N must be 1..1000000 and SCRAPES 1..1000");
    if (!uri) {
        if (!mkdtemp(tmpdir))
            die("mkdtemp", strerror(errno));
        snprintf(fileuri, sizeof(fileuri), "file://%s", tmpdir);
        uri = fileuri;
        own_dir = 1;
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);

    rc = dlock_client_open(&c, uri, NULL);
    if (rc != DLOCK_OK)
        die("dlock_client_open", dlock_errmsg());
    locks = calloc((size_t)n, sizeof(*locks));
    ns = calloc((size_t)scrapes, sizeof(*ns));
    if (!locks || !ns)
        die("calloc", "out of memory");
    t0 = now_ns();
    for (long i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof(name), "bench/exporter/%06ld", i);
        if ((rc = dlock_open(&locks[i], c, name, NULL)) != DLOCK_OK ||
            (rc = dlock_acquire(locks[i], 0)) != DLOCK_OK) {
            fprintf(stderr, "%s: lock %ld of %ld: %s\n", bench_prog, i, n,
                    dlock_errmsg());
            die("holding the locks", "see above (RLIMIT_NOFILE?)");
        }
    }
    fprintf(stderr, "%s: %ld locks held on %s in %.1f s\n", bench_prog, n,
            dlock_client_store(c), (double)(now_ns() - t0) / 1e9);

    port = start_exporter(cli, uri, page);
    {
        char *body;
        size_t len;
        /* one scrape first, not counted: the exporter's first page reads
         * warm the store's caches as every later scrape finds them */
        scrape(port, &body, &len);
        check(body, dlock_client_store(c), n);
        free(body);
        for (long i = 0; i < scrapes; i++) {
            ns[i] = scrape(port, &body, &len);
            check(body, dlock_client_store(c), n);
            bytes = len;
            free(body);
        }
    }
    stop_exporter();
    qsort(ns, (size_t)scrapes, sizeof(*ns), cmp64);
    {
        double med = (double)ns[scrapes / 2] / 1e6,
               max = (double)ns[scrapes - 1] / 1e6;
        char scheme[16];
        snprintf(scheme, sizeof(scheme), "%.*s",
                 (int)strcspn(dlock_client_store(c), ":"),
                 dlock_client_store(c));
        printf("| exporter scrape of %ld locks (%s, --page %s, %ld scrapes, "
               "%.1f MB each) | median %.0f ms | max %.0f ms | %.2f of the "
               "1 s target |\n",
               n, scheme, page ? page : "1000", scrapes, (double)bytes / 1e6,
               med, max, med / 1000.0);
    }
    for (long i = 0; i < n; i++) {
        dlock_release(locks[i]);
        dlock_close(locks[i]);
    }
    dlock_client_close(c);
    if (own_dir)
        rm_dir(tmpdir);
    free(locks);
    free(ns);
    return 0;
}
