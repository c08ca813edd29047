/* SPDX-License-Identifier: MIT */
/*
 * netfault.c -- network faults between a worker and its store:
 *  - a network namespace with a veth pair (10.X.Y.0/30, nowhere else):
 *    servers bind to our end, workers enter the other; the link goes
 *    down (a partition) or slow and lossy (netem where the kernel has it,
 *    else a token bucket too small for the traffic);
 *  - a TCP relay that can cut every connection, new ones included (for
 *    the servers the harness binds to loopback only), listening here on
 *    a port of its own, or inside a namespace on the server's own
 *    address (for the servers whose clients go to the addresses they
 *    announce).
 * Every namespace is removed at exit, on SIGINT/SIGTERM/SIGHUP, and by the
 * next run if this one was SIGKILLed.
 */
#include "safety.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Running ip and tc                                                        */
/* ------------------------------------------------------------------------ */

/* Runs argv (NULL-terminated) with output discarded; its exit status.
 * Only fork/exec/wait: usable from the signal handler below. */
static int run_argv(char *const argv[])
{
    pid_t pid = fork();
    int st;

    if (pid < 0)
        return -1;
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, 1);
            dup2(null, 2);
        }
        execvp(argv[0], argv);
        _exit(127);
    }
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* run("ip link set %s up", ...): split on blanks (no quoting needed). */
static int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int run(const char *fmt, ...)
{
    char line[512], *argv[32], *save = NULL;
    int n = 0;
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    for (char *t = strtok_r(line, " ", &save); t && n < 31;
         t = strtok_r(NULL, " ", &save))
        argv[n++] = t;
    argv[n] = NULL;
    return run_argv(argv);
}

/* ------------------------------------------------------------------------ */
/* Namespaces                                                               */
/* ------------------------------------------------------------------------ */

#define MAX_NS 4
static char made[MAX_NS][64]; /* namespaces to remove at exit */
static pid_t made_by;

static void remove_all(void)
{
    if (getpid() != made_by)
        return;
    for (int i = 0; i < MAX_NS; i++)
        if (made[i][0]) {
            char *argv[] = {"ip", "netns", "del", made[i], NULL};
            run_argv(argv);
            made[i][0] = '\0';
        }
}

/* Interrupted: remove the namespaces, then exit through the atexit
 * handlers (the harness kills its servers there). */
static void on_signal(int sig)
{
    remove_all();
    exit(128 + sig);
}

void sf_netns_reap_stale(void)
{
    FILE *p = popen("ip netns list 2>/dev/null", "r");
    char line[256];

    if (!p)
        return;
    for (int i = 0; i < 1000 && fgets(line, sizeof(line), p); i++) {
        long pid;
        char name[64];
        if (sscanf(line, "dlsafe-%ld", &pid) != 1 || pid <= 0)
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* its run is alive */
        snprintf(name, sizeof(name), "%.63s", strtok(line, " \n"));
        char *argv[] = {"ip", "netns", "del", name, NULL};
        run_argv(argv);
    }
    pclose(p);
}

static int subnet_used(int x, int y)
{
    char cmd[128], line[512], pat[32];
    FILE *p;
    int used = 0;

    snprintf(cmd, sizeof(cmd), "ip -o -4 addr show 2>/dev/null");
    snprintf(pat, sizeof(pat), " 10.%d.%d.", x, y);
    p = popen(cmd, "r");
    if (!p)
        return 1;
    while (fgets(line, sizeof(line), p))
        if (strstr(line, pat))
            used = 1;
    pclose(p);
    return used;
}

int sf_netns_create(sf_netns *n, char *why, size_t cap)
{
    static int seq;
    int slot = -1, x, y = 0, k = seq++;
    pid_t me = getpid();

    memset(n, 0, sizeof(*n));
    for (int i = 0; i < MAX_NS; i++)
        if (!made[i][0]) {
            slot = i;
            break;
        }
    if (slot < 0) {
        snprintf(why, cap, "too many namespaces");
        return -1;
    }
    if (run("ip netns list") != 0) {
        snprintf(why, cap, "`ip netns` does not work here (iproute2, root)");
        return -1;
    }
    x = 200 + (int)(me % 50);
    for (int t = 0; t < 50; t++) {
        y = (int)((me / 50 + k * 7 + t) % 250);
        if (!subnet_used(x, y))
            break;
    }
    snprintf(n->name, sizeof(n->name), "dlsafe-%ld-%d", (long)me, k);
    snprintf(n->host_if, sizeof(n->host_if), "dls%ld%dh", (long)me % 1000000,
             k);
    snprintf(n->ns_if, sizeof(n->ns_if), "dls%ld%dn", (long)me % 1000000, k);
    snprintf(n->host_ip, sizeof(n->host_ip), "10.%d.%d.1", x, y);
    snprintf(n->ns_ip, sizeof(n->ns_ip), "10.%d.%d.2", x, y);
    if (run("ip netns add %s", n->name) != 0) {
        snprintf(why, cap, "ip netns add %s failed", n->name);
        return -1;
    }
    snprintf(made[slot], sizeof(made[slot]), "%s", n->name);
    if (made_by != me) {
        made_by = me;
        atexit(remove_all);
        signal(SIGINT, on_signal);
        signal(SIGTERM, on_signal);
        signal(SIGHUP, on_signal);
    }
    if (run("ip link add %s type veth peer name %s", n->host_if, n->ns_if) ||
        run("ip link set %s netns %s", n->ns_if, n->name) ||
        run("ip addr add %s/30 dev %s", n->host_ip, n->host_if) ||
        run("ip link set %s up", n->host_if) ||
        run("ip -n %s addr add %s/30 dev %s", n->name, n->ns_ip, n->ns_if) ||
        run("ip -n %s link set %s up", n->name, n->ns_if) ||
        run("ip -n %s link set lo up", n->name)) {
        snprintf(why, cap, "could not set up the veth pair of %s", n->name);
        sf_netns_destroy(n);
        return -1;
    }
    /* wait for the link to carry (bounded) */
    for (int i = 0; i < 50; i++) {
        if (run("ip netns exec %s true", n->name) == 0 &&
            run("ip -n %s route get %s", n->name, n->host_ip) == 0)
            break;
        sf_sleep_us(20000);
    }
    n->up = 1;
    return 0;
}

void sf_netns_destroy(sf_netns *n)
{
    if (!n->name[0])
        return;
    run("ip netns del %s", n->name);
    for (int i = 0; i < MAX_NS; i++)
        if (!strcmp(made[i], n->name))
            made[i][0] = '\0';
    n->up = 0;
    n->name[0] = '\0';
}

int sf_netns_link(sf_netns *n, const char *how)
{
    if (!strcmp(how, "down"))
        return run("ip link set %s down", n->host_if);
    if (!strcmp(how, "up"))
        return run("ip link set %s up", n->host_if);
    if (!strcmp(how, "clear")) {
        run("tc qdisc del dev %s root", n->host_if);
        run("ip netns exec %s tc qdisc del dev %s root", n->name, n->ns_if);
        return 0;
    }
    if (!strcmp(how, "slow")) {
        /* netem: 150 ms each way and 20% loss; kernels without sch_netem
         * get a token bucket of 2 KB/s whose queue drops what waits more
         * than 300 ms: delay and loss under load */
        if (run("tc qdisc replace dev %s root netem delay 150ms loss 20%%",
                n->host_if) == 0 &&
            run("ip netns exec %s tc qdisc replace dev %s root netem delay "
                "150ms loss 20%%", n->name, n->ns_if) == 0)
            return 0;
        if (run("tc qdisc replace dev %s root tbf rate 16kbit burst 1600 "
                "latency 300ms", n->host_if) == 0 &&
            run("ip netns exec %s tc qdisc replace dev %s root tbf rate "
                "16kbit burst 1600 latency 300ms", n->name, n->ns_if) == 0)
            return 1; /* tbf, not netem */
        return -1;
    }
    return -1;
}

int sf_netns_enter(const sf_netns *n)
{
    char path[128];
    int fd, rc;

    snprintf(path, sizeof(path), "/var/run/netns/%s", n->name);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    rc = setns(fd, CLONE_NEWNET);
    close(fd);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* A relay that can cut                                                     */
/* ------------------------------------------------------------------------ */

#define RELAY_PAIRS 64

struct sf_relay {
    int lfd, port, target;
    int cut, stop; /* atomics */
    pthread_t th;
    int cfd[RELAY_PAIRS], sfd[RELAY_PAIRS];
};

static int connect_target(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    if (fd < 0)
        return -1;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void close_pair(sf_relay *r, int i)
{
    if (r->cfd[i] >= 0)
        close(r->cfd[i]);
    if (r->sfd[i] >= 0)
        close(r->sfd[i]);
    r->cfd[i] = r->sfd[i] = -1;
}

/* Copies what is readable from `from` to `to` (blocking write: the
 * peers are local and small). 0, or -1 when the pair ends. */
static int pump(int from, int to)
{
    char buf[16384];
    ssize_t n = recv(from, buf, sizeof(buf), MSG_DONTWAIT);

    if (n == 0)
        return -1;
    if (n < 0)
        return errno == EAGAIN || errno == EINTR ? 0 : -1;
    for (ssize_t off = 0; off < n;) {
        ssize_t w = send(to, buf + off, (size_t)(n - off), MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN) {
                sf_sleep_us(1000);
                continue;
            }
            return -1;
        }
        off += w;
    }
    return 0;
}

static void *relay_main(void *arg)
{
    sf_relay *r = arg;

    while (!__atomic_load_n(&r->stop, __ATOMIC_SEQ_CST)) {
        struct pollfd p[1 + 2 * RELAY_PAIRS];
        int idx[1 + 2 * RELAY_PAIRS], np = 0;
        int cut = __atomic_load_n(&r->cut, __ATOMIC_SEQ_CST);

        if (cut) { /* nothing moves: bytes and connections wait */
            sf_sleep_us(5000);
            continue;
        }
        p[np].fd = r->lfd;
        p[np].events = POLLIN;
        idx[np++] = -1;
        for (int i = 0; i < RELAY_PAIRS; i++)
            if (r->cfd[i] >= 0) {
                p[np].fd = r->cfd[i];
                p[np].events = POLLIN;
                idx[np++] = i;
                p[np].fd = r->sfd[i];
                p[np].events = POLLIN;
                idx[np++] = i + RELAY_PAIRS;
            }
        if (poll(p, (nfds_t)np, 20) <= 0)
            continue;
        if (__atomic_load_n(&r->cut, __ATOMIC_SEQ_CST))
            continue;
        for (int k = 1; k < np; k++) {
            if (!p[k].revents)
                continue;
            int i = idx[k] % RELAY_PAIRS, from_client = idx[k] < RELAY_PAIRS;
            if (r->cfd[i] < 0)
                continue;
            if (pump(from_client ? r->cfd[i] : r->sfd[i],
                     from_client ? r->sfd[i] : r->cfd[i]) != 0)
                close_pair(r, i);
        }
        if (p[0].revents & POLLIN) {
            int c = accept4(r->lfd, NULL, NULL, SOCK_CLOEXEC);
            if (c >= 0) {
                int slot = -1;
                for (int i = 0; i < RELAY_PAIRS; i++)
                    if (r->cfd[i] < 0) {
                        slot = i;
                        break;
                    }
                int s = slot >= 0 ? connect_target(r->target) : -1;
                if (s < 0) {
                    close(c);
                } else {
                    r->cfd[slot] = c;
                    r->sfd[slot] = s;
                }
            }
        }
    }
    return NULL;
}

/* A relay to target_port listening on lfd (bound to 127.0.0.1:port, 0:
 * any); its thread connects in this thread's namespace. NULL (lfd closed)
 * on failure. */
static sf_relay *relay_start(int lfd, int port, int target_port)
{
    sf_relay *r = calloc(1, sizeof(*r));
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int one = 1;

    if (!r) {
        if (lfd >= 0)
            close(lfd);
        return NULL;
    }
    for (int i = 0; i < RELAY_PAIRS; i++)
        r->cfd[i] = r->sfd[i] = -1;
    r->target = target_port;
    r->lfd = lfd;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (port && r->lfd >= 0)
        setsockopt(r->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (r->lfd < 0 || bind(r->lfd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(r->lfd, 64) != 0 ||
        getsockname(r->lfd, (struct sockaddr *)&a, &len) != 0 ||
        pthread_create(&r->th, NULL, relay_main, r) != 0) {
        if (r->lfd >= 0)
            close(r->lfd);
        free(r);
        return NULL;
    }
    r->port = ntohs(a.sin_port);
    return r;
}

sf_relay *sf_relay_start(int target_port)
{
    return relay_start(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), 0,
                       target_port);
}

sf_relay *sf_relay_start_in(const sf_netns *n, int port)
{
    char path[128];
    int here = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    int there, lfd = -1, err = 0;

    snprintf(path, sizeof(path), "/var/run/netns/%s", n->name);
    there = open(path, O_RDONLY | O_CLOEXEC);
    /* a socket stays in the namespace it was made in: this thread goes
     * there for the listening socket only, and comes back before the
     * relay's thread (which connects) is started */
    if (here >= 0 && there >= 0 && setns(there, CLONE_NEWNET) == 0) {
        lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        err = errno;
        if (setns(here, CLONE_NEWNET) != 0) {
            /* stuck in the other namespace: nothing here would work */
            fprintf(stderr, "netfault: cannot return from %s: %s\n",
                    n->name, strerror(errno));
            abort();
        }
    } else {
        err = errno;
    }
    if (here >= 0)
        close(here);
    if (there >= 0)
        close(there);
    if (lfd < 0) {
        errno = err;
        return NULL;
    }
    return relay_start(lfd, port, port);
}

int sf_relay_port(const sf_relay *r)
{
    return r->port;
}

void sf_relay_cut(sf_relay *r, int cut)
{
    __atomic_store_n(&r->cut, cut, __ATOMIC_SEQ_CST);
}

void sf_relay_stop(sf_relay *r)
{
    if (!r)
        return;
    __atomic_store_n(&r->stop, 1, __ATOMIC_SEQ_CST);
    pthread_join(r->th, NULL);
    for (int i = 0; i < RELAY_PAIRS; i++)
        close_pair(r, i);
    close(r->lfd);
    free(r);
}
