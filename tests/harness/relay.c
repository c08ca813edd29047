/* SPDX-License-Identifier: MIT */
/*
 * relay.c -- a TCP relay in front of a server (see test.h: th_relay).
 */
#include "test.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

static int px_connect(int port)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Copies what `from` has to `to`; 0 at end of stream or on error. */
static ssize_t px_copy(int from, int to)
{
    char buf[16384];
    ssize_t n = read(from, buf, sizeof(buf));

    for (ssize_t off = 0; n > 0 && off < n;) {
        ssize_t w = send(to, buf + off, (size_t)(n - off), MSG_NOSIGNAL);
        if (w <= 0)
            break; /* the other side is gone: drop it, keep reading */
        off += w;
    }
    return n > 0 ? n : 0;
}

static void px_close_pair(th_relay_pair *p)
{
    close(p->cfd);
    close(p->sfd);
    p->cfd = p->sfd = -1;
    p->held = p->cdone = 0;
}

static void *px_run(void *arg)
{
    th_relay *px = arg;
    struct pollfd fds[1 + 2 * TH_RELAY_MAX];

    while (!__atomic_load_n(&px->stop, __ATOMIC_SEQ_CST)) {
        int n = 1;
        fds[0] = (struct pollfd){px->lfd, POLLIN, 0};
        pthread_mutex_lock(&px->mu);
        for (int i = 0; i < TH_RELAY_MAX; i++) {
            th_relay_pair *p = &px->pair[i];
            int live = p->cfd >= 0;
            int rd = live && !p->held && !p->cdone;
            fds[n++] = (struct pollfd){rd ? p->cfd : -1, POLLIN, 0};
            fds[n++] = (struct pollfd){live ? p->sfd : -1, POLLIN, 0};
        }
        pthread_mutex_unlock(&px->mu);
        if (poll(fds, (nfds_t)n, 20) <= 0)
            continue;
        pthread_mutex_lock(&px->mu);
        if (fds[0].revents & POLLIN) {
            int cfd = accept(px->lfd, NULL, NULL), sfd = -1;
            if (cfd >= 0 && (sfd = px_connect(px->target)) >= 0) {
                int i = 0;
                while (i < TH_RELAY_MAX && px->pair[i].cfd >= 0)
                    i++;
                if (i < TH_RELAY_MAX)
                    px->pair[i] = (th_relay_pair){cfd, sfd, 0, 0, 0};
                else
                    sfd = -1;
            }
            if (sfd < 0 && cfd >= 0)
                close(cfd);
        }
        for (int i = 0; i < TH_RELAY_MAX; i++) {
            th_relay_pair *p = &px->pair[i];
            struct pollfd *fc = &fds[1 + 2 * i], *fs = &fds[2 + 2 * i];
            if (p->cfd < 0)
                continue;
            /* (held may have been set since the poll: then leave it) */
            int go = fc->fd >= 0 && fc->revents && !p->held && !p->cdone;
            if (go && px->delay_ms > 0)
                th_sleep_ms(px->delay_ms);
            if (go && !px_copy(p->cfd, p->sfd)) {
                /* the client is gone: the server still gets all it sent,
                 * answers it, then sees the end */
                shutdown(p->sfd, SHUT_WR);
                p->cdone = 1;
            }
            if (fs->fd >= 0 && fs->revents) {
                ssize_t k = px_copy(p->sfd, p->cfd);
                p->answer += k;
                if (k == 0)
                    px_close_pair(p);
            }
        }
        pthread_mutex_unlock(&px->mu);
    }
    return NULL;
}

void th_relay_start(th_relay *px, int target)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int one = 1;

    memset(px, 0, sizeof(*px));
    for (int i = 0; i < TH_RELAY_MAX; i++)
        px->pair[i].cfd = px->pair[i].sfd = -1;
    px->target = target;
    px->lfd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(px->lfd >= 0);
    setsockopt(px->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK_EQ(bind(px->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    CHECK_EQ(listen(px->lfd, 16), 0);
    CHECK_EQ(getsockname(px->lfd, (struct sockaddr *)&a, &len), 0);
    px->port = ntohs(a.sin_port);
    pthread_mutex_init(&px->mu, NULL);
    CHECK_EQ(pthread_create(&px->th, NULL, px_run, px), 0);
}

void th_relay_stop(th_relay *px)
{
    __atomic_store_n(&px->stop, 1, __ATOMIC_SEQ_CST);
    pthread_join(px->th, NULL);
    for (int i = 0; i < TH_RELAY_MAX; i++)
        if (px->pair[i].cfd >= 0)
            px_close_pair(&px->pair[i]);
    close(px->lfd);
    pthread_mutex_destroy(&px->mu);
}

/* Holds back the client bytes of every connection open now; returns how
 * many connections that is. */
int th_relay_hold(th_relay *px)
{
    int n = 0;

    pthread_mutex_lock(&px->mu);
    for (int i = 0; i < TH_RELAY_MAX; i++)
        if (px->pair[i].cfd >= 0 && !px->pair[i].cdone) {
            px->pair[i].held = 1;
            n++;
        }
    pthread_mutex_unlock(&px->mu);
    return n;
}

/* Lets the held bytes through, then waits (at most 10 s) until the server
 * has answered them and closed those connections; returns the bytes it
 * answered. */
long long th_relay_let_through(th_relay *px)
{
    int was[TH_RELAY_MAX], open = 1;
    long long answered = 0;

    pthread_mutex_lock(&px->mu);
    for (int i = 0; i < TH_RELAY_MAX; i++) {
        was[i] = px->pair[i].held;
        if (was[i]) {
            px->pair[i].held = 0;
            px->pair[i].answer = 0;
        }
    }
    pthread_mutex_unlock(&px->mu);
    for (int64_t until = th_now_ms() + 10000; open && th_now_ms() < until;) {
        th_sleep_ms(20);
        open = 0;
        pthread_mutex_lock(&px->mu);
        for (int i = 0; i < TH_RELAY_MAX; i++) {
            if (!was[i])
                continue;
            answered += px->pair[i].answer;
            px->pair[i].answer = 0;
            if (px->pair[i].cfd >= 0)
                open = 1;
            else
                was[i] = 0;
        }
        pthread_mutex_unlock(&px->mu);
    }
    CHECK_EQ(open, 0);
    return answered;
}
