/* SPDX-License-Identifier: MIT */
/*
 * gate.c -- a TCP relay a test can cut and restore (test.h: th_gate).
 */
#include "test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A relay in front of a server that a test can cut: every
 * connection through it closed and new ones refused (its port closed),
 * then open again on the same port. A client that connects through it
 * loses its connections at the cut and gets them back at the restore
 * (test_etcd: its requests' and its watch stream's; test_zk: its session,
 * within the session timeout). */

static int gate__listen(int port)
{
    struct sockaddr_in a;
    int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);

    CHECK(fd >= 0);
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    CHECK_EQ(listen(fd, 16), 0);
    return fd;
}

static void *gate__run(void *arg)
{
    th_gate *g = arg;
    struct pollfd p[1 + 2 * TH_GATE_MAX];
    char buf[16384];

    /* bounded by the test: it stops the th_gate before it ends */
    while (!__atomic_load_n(&g->stop, __ATOMIC_SEQ_CST)) {
        pthread_mutex_lock(&g->mu);
        p[0] = (struct pollfd){g->lfd, POLLIN, 0};
        for (int i = 0; i < 2 * TH_GATE_MAX; i++)
            p[1 + i] = (struct pollfd){g->fd[i], POLLIN, 0};
        if (poll(p, 1 + 2 * TH_GATE_MAX, 20) > 0) {
            if (g->lfd >= 0 && (p[0].revents & POLLIN)) {
                int c = accept(g->lfd, NULL, NULL), k = 0;
                while (k < TH_GATE_MAX && g->fd[2 * k] >= 0)
                    k++;
                struct sockaddr_in a;
                memset(&a, 0, sizeof(a));
                a.sin_family = AF_INET;
                a.sin_port = htons((uint16_t)g->target);
                a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
                int sfd = c >= 0 && k < TH_GATE_MAX
                              ? socket(AF_INET, SOCK_STREAM, 0)
                              : -1;
                if (sfd >= 0 &&
                    connect(sfd, (struct sockaddr *)&a, sizeof(a)) == 0) {
                    g->fd[2 * k] = c;
                    g->fd[2 * k + 1] = sfd;
                } else {
                    if (sfd >= 0)
                        close(sfd);
                    if (c >= 0)
                        close(c);
                }
            }
            for (int i = 0; i < 2 * TH_GATE_MAX; i++) {
                if (g->fd[i] < 0 || !p[1 + i].revents)
                    continue;
                ssize_t n = read(g->fd[i], buf, sizeof(buf));
                int peer = i ^ 1;
                if (n <= 0 || send(g->fd[peer], buf, (size_t)n,
                                   MSG_NOSIGNAL) != n) {
                    close(g->fd[i]);
                    close(g->fd[peer]);
                    g->fd[i] = g->fd[peer] = -1;
                }
            }
        }
        pthread_mutex_unlock(&g->mu);
        th_sleep_ms(1);
    }
    return NULL;
}

void th_gate_start(th_gate *g, int target)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);

    memset(g, 0, sizeof(*g));
    for (int i = 0; i < 2 * TH_GATE_MAX; i++)
        g->fd[i] = -1;
    g->target = target;
    g->lfd = gate__listen(0);
    CHECK_EQ(getsockname(g->lfd, (struct sockaddr *)&a, &len), 0);
    g->port = ntohs(a.sin_port);
    pthread_mutex_init(&g->mu, NULL);
    CHECK_EQ(pthread_create(&g->th, NULL, gate__run, g), 0);
}

/* Closes every connection and the port (connecting is refused). */
void th_gate_cut(th_gate *g)
{
    pthread_mutex_lock(&g->mu);
    for (int i = 0; i < 2 * TH_GATE_MAX; i++)
        if (g->fd[i] >= 0) {
            close(g->fd[i]);
            g->fd[i] = -1;
        }
    close(g->lfd);
    g->lfd = -1;
    pthread_mutex_unlock(&g->mu);
}

void th_gate_restore(th_gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->lfd = gate__listen(g->port);
    pthread_mutex_unlock(&g->mu);
}

void th_gate_stop(th_gate *g)
{
    __atomic_store_n(&g->stop, 1, __ATOMIC_SEQ_CST);
    pthread_join(g->th, NULL);
    th_gate_cut(g);
    pthread_mutex_destroy(&g->mu);
}

void th_told_after_the_cut(th_gate *g, th_lost *n, dlock *la, dlock *lb,
                           uint64_t t1, int64_t quiet_ms, int64_t told_ms,
                           const char *why)
{
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OP(dlock_token(lb), >, t1);
    th_sleep_ms(quiet_ms);
    CHECK_EQ(th_lost_calls(n), 0); /* it could not know yet */
    int64_t t0 = th_now_ms();
    th_gate_restore(g);
    CHECK_EQ(th_lost_wait(n, 1, told_ms), 1);
    CHECK_OP(n->at - t0, <, told_ms);
    CHECK_EQ(n->token, t1);
    CHECK_RC(dlock_release(la), DLOCK_ELOST);
    CHECK_CONTAINS(dlock_errmsg(), why);
    /* and the client works again through the gate */
    CHECK_OK(dlock_release(lb));
    CHECK_OK(dlock_acquire(la, 5000));
    CHECK_OK(dlock_release(la));
}
