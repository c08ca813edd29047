/* SPDX-License-Identifier: MIT */
/*
 * redis_io.c -- the I/O of every Redis connection, plain or TLS (see
 * redis_io.h; the protocol in docs/design.md, "Redis over TLS"): the
 * connect, made here so that the socket is close-on-exec, and the bytes
 * sent and read, through OpenSSL for a TLS connection. The TLS settings,
 * sessions and handshake are in redis_tls.c.
 */
#include "redis_tls.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define READ_CHUNK 16384

static struct timeval tv_ms(int64_t ms)
{
    struct timeval tv;

    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)((ms % 1000) * 1000);
    return tv;
}

/* ------------------------------------------------------------------------ */
/* Connecting                                                               */
/* ------------------------------------------------------------------------ */

static int set_blocking(int fd)
{
    int fl = fcntl(fd, F_GETFL);

    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
}

/* A socket of `family` connected to a (or, nb, its connect under way),
 * by `deadline`: the descriptor, or -1 with errno and why set. */
static int connect_to(int family, const struct sockaddr *a, socklen_t len,
                      int nb, int64_t deadline, char *why, size_t cap)
{
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1, err = 0, e;
    socklen_t elen = sizeof(err);

    if (fd < 0)
        goto fail;
    if (family != AF_UNIX)
        (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, a, len) != 0) {
        if (errno != EINPROGRESS) /* a Unix socket's EAGAIN: backlog full */
            goto fail;
        while (!nb) {
            struct pollfd p = {fd, POLLOUT, 0};
            int64_t left = deadline - dlock__now_ms();
            int r = poll(&p, 1, left > 0 ? (int)left : 0);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0)
                goto fail;
            if (r == 0) {
                errno = ETIMEDOUT;
                goto fail;
            }
            if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0)
                goto fail;
            if (err) {
                errno = err;
                goto fail;
            }
            break;
        }
    }
    if (!nb && set_blocking(fd) != 0)
        goto fail;
    return fd;
fail:
    e = errno;
    snprintf(why, cap, "%s", strerror(e));
    if (fd >= 0)
        close(fd);
    errno = e;
    return -1;
}

/* A socket connected to host:port or to the Unix socket path within ms
 * (nb: its connect only started), made here and not by hiredis, so that
 * it is close-on-exec from its creation: hiredis 0.14 makes its sockets
 * without the flag, and a program another thread starts meanwhile would
 * inherit a store connection (docs/design.md, "Descriptors"). As
 * hiredis' redisConnect*(): IPv4 addresses, IPv6 ones when the name has
 * none; TCP_NODELAY; the next address only past an unreachable one (a
 * refused connect fails at once); blocking once connected (unless nb);
 * the system's and getaddrinfo's words in why. The descriptor, or -1. */
static int open_socket(const char *host, int port, const char *path,
                       int nb, int64_t ms, char *why, size_t cap)
{
    int64_t deadline = dlock__now_ms() + ms;
    struct addrinfo hints, *ai = NULL;
    char svc[16];
    int fd = -1, rv;

    if (path) {
        struct sockaddr_un sa;
        memset(&sa, 0, sizeof(sa));
        sa.sun_family = AF_UNIX;
        if (strlen(path) >= sizeof(sa.sun_path)) {
            snprintf(why, cap, "%s", strerror(ENAMETOOLONG));
            return -1;
        }
        memcpy(sa.sun_path, path, strlen(path));
        return connect_to(AF_UNIX, (struct sockaddr *)&sa, sizeof(sa), nb,
                          deadline, why, cap);
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(svc, sizeof(svc), "%d", port);
    if ((rv = getaddrinfo(host, svc, &hints, &ai)) != 0) {
        hints.ai_family = AF_INET6;
        rv = getaddrinfo(host, svc, &hints, &ai);
    }
    if (rv != 0) {
        snprintf(why, cap, "%s", gai_strerror(rv));
        return -1;
    }
    for (struct addrinfo *p = ai; p; p = p->ai_next) {
        fd = connect_to(p->ai_family, p->ai_addr, p->ai_addrlen, nb,
                        deadline, why, cap);
        if (fd >= 0 || (errno != EHOSTUNREACH && errno != ENETUNREACH))
            break;
    }
    freeaddrinfo(ai);
    return fd;
}

/* A hiredis context on our socket fd (closed if none can be made). */
static redisContext *context_of(int fd, int nb)
{
    redisContext *ctx = redisConnectFd(fd);

    if (!ctx) {
        close(fd);
        return NULL;
    }
    if (nb)
        ctx->flags &= ~REDIS_BLOCK; /* EAGAIN: "nothing yet" */
    return ctx;
}

int dlock__rio_connect(const dlock__rtls *tls, const char *host, int port,
                       const char *path, int64_t ms, redisContext **out,
                       char *why, size_t cap)
{
    int64_t deadline = dlock__now_ms() + ms;
    int fd = open_socket(host, port, path, 0, ms, why, cap);
    redisContext *ctx;

    *out = NULL;
    if (fd < 0)
        return DLOCK_ECONN;
    if (!(ctx = context_of(fd, 0)))
        return DLOCK_ENOMEM;
    if (ctx->err) {
        snprintf(why, cap, "%s", ctx->errstr);
        redisFree(ctx);
        return DLOCK_ECONN;
    }
    redisSetTimeout(ctx, tv_ms(ms));
#ifdef DLOCK_HAVE_REDIS_TLS
    if (tls && !path) {
        if (dlock__rtls_attach(tls, ctx, host, port) != DLOCK_OK) {
            redisFree(ctx);
            return DLOCK_ENOMEM;
        }
        if (dlock__rtls_handshake(TLS_OF(ctx), ctx->fd, deadline, why,
                                  cap) != 1) {
            dlock__rio_free(ctx);
            return DLOCK_ECONN;
        }
    }
#else
    (void)tls;
    (void)deadline;
#endif
    *out = ctx;
    return DLOCK_OK;
}

int dlock__rio_connect_nb(const dlock__rtls *tls, const char *host,
                          int port, redisContext **out, char *why,
                          size_t cap)
{
    int fd = open_socket(host, port, NULL, 1, 0, why, cap);
    redisContext *ctx;

    *out = NULL;
    if (fd < 0)
        return DLOCK_ECONN;
    if (!(ctx = context_of(fd, 1)))
        return DLOCK_ENOMEM;
    if (ctx->err) {
        snprintf(why, cap, "%s", ctx->errstr);
        redisFree(ctx);
        return DLOCK_ECONN;
    }
#ifdef DLOCK_HAVE_REDIS_TLS
    if (tls) {
        if (dlock__rtls_attach(tls, ctx, host, port) != DLOCK_OK) {
            redisFree(ctx);
            return DLOCK_ENOMEM;
        }
        TLS_OF(ctx)->stage = STAGE_TCP;
    }
#else
    (void)tls;
#endif
    *out = ctx;
    return DLOCK_OK;
}

int dlock__rio_step(redisContext *ctx, char *why, size_t cap)
{
    rio_tls *rt = TLS_OF(ctx);
    int err = 0, tcp = 1;
    socklen_t len = sizeof(err);

#ifdef DLOCK_HAVE_REDIS_TLS
    tcp = !rt || rt->stage == STAGE_TCP;
#endif
    if (tcp) {
        if (getsockopt(ctx->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
            err = errno;
        if (err) {
            snprintf(why, cap, "%s", strerror(err));
            return -1;
        }
        if (!rt)
            return 1;
    }
#ifdef DLOCK_HAVE_REDIS_TLS
    rt->stage = STAGE_HANDSHAKE;
    return dlock__rtls_handshake_step(rt, why, cap);
#else
    return 1;
#endif
}

short dlock__rio_wants(const redisContext *ctx)
{
#ifdef DLOCK_HAVE_REDIS_TLS
    const rio_tls *rt = TLS_OF(ctx);
    if (rt && rt->stage != STAGE_TCP && rt->wants)
        return rt->wants;
#else
    (void)ctx;
#endif
    return POLLOUT;
}

int dlock__rio_is_tls(const redisContext *ctx)
{
    return TLS_OF(ctx) != NULL;
}

int dlock__rio_nonblocking(redisContext *ctx)
{
    int fl = fcntl(ctx->fd, F_GETFL);

    if (fl < 0 || fcntl(ctx->fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -1;
    ctx->flags &= ~REDIS_BLOCK; /* EAGAIN is "nothing yet", not a timeout */
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Bytes                                                                    */
/* ------------------------------------------------------------------------ */

int dlock__rio_send(redisContext *ctx)
{
    size_t len = sdslen(ctx->obuf);
    rio_tls *rt = TLS_OF(ctx);

    while (len > 0) {
        ssize_t w;
        if (rt) {
#ifdef DLOCK_HAVE_REDIS_TLS
            ERR_clear_error();
            int n = SSL_write(rt->ssl, ctx->obuf,
                              len > INT32_MAX ? INT32_MAX : (int)len);
            if (n <= 0) {
                int e = SSL_get_error(rt->ssl, n);
                if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) {
                    rt->wants = e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
                    return 0;
                }
                dlock__rtls_write_failed(ctx, rt);
                return -1;
            }
            w = n;
#else
            return -1;
#endif
        } else {
            w = send(ctx->fd, ctx->obuf, len, MSG_NOSIGNAL);
            if (w < 0) {
                if (errno == EINTR)
                    continue;
                return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
            }
        }
        sdsrange(ctx->obuf, (int)w, -1);
        len = sdslen(ctx->obuf);
    }
    return 1;
}

ssize_t dlock__rio_read(redisContext *ctx, char *buf, size_t cap)
{
    rio_tls *rt = TLS_OF(ctx);
    ssize_t r;

    if (!rt) {
        do
            r = recv(ctx->fd, buf, cap, 0);
        while (r < 0 && errno == EINTR);
        return r;
    }
#ifdef DLOCK_HAVE_REDIS_TLS
    ERR_clear_error();
    errno = 0;
    int n = SSL_read(rt->ssl, buf, cap > INT32_MAX ? INT32_MAX : (int)cap);
    if (n > 0)
        return n;
    int e = SSL_get_error(rt->ssl, n);
    if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
        errno = EAGAIN;
        return -1;
    }
    if (e == SSL_ERROR_ZERO_RETURN ||
        (e == SSL_ERROR_SYSCALL && (n == 0 || errno == 0) &&
         ERR_peek_error() == 0))
        return 0;
    dlock__rtls_why(rt, n, e, ctx->errstr, sizeof(ctx->errstr));
    errno = EPROTO;
    return -1;
#else
    return -1;
#endif
}

int dlock__rio_fill(redisContext *ctx)
{
    rio_tls *rt = TLS_OF(ctx);
    char buf[READ_CHUNK];

    if (!rt)
        return redisBufferRead(ctx);
    /* TLS: read until OpenSSL holds nothing more (with read-ahead, one
     * read(2) usually): no record is left where no poll() would see it */
    for (int i = 0; i < 1024; i++) {
        ssize_t n = dlock__rio_read(ctx, buf, sizeof(buf));
        if (n > 0) {
            if (redisReaderFeed(ctx->reader, buf, (size_t)n) != REDIS_OK) {
                ctx->err = ctx->reader->err;
                snprintf(ctx->errstr, sizeof(ctx->errstr), "%s",
                         ctx->reader->errstr);
                return REDIS_ERR;
            }
            /* nothing kept by OpenSSL: the rest, if any, is still in
             * the socket, where poll() sees it (no read just to hear
             * EAGAIN) */
            if (!dlock__rio_pending(ctx))
                return REDIS_OK;
            continue;
        }
        if (n < 0 && errno == EAGAIN && !(ctx->flags & REDIS_BLOCK))
            return REDIS_OK;
        if (n < 0 && errno == EAGAIN) /* a blocking socket's timeout */
            snprintf(ctx->errstr, sizeof(ctx->errstr),
                     "Resource temporarily unavailable");
        ctx->err = n == 0 ? REDIS_ERR_EOF : REDIS_ERR_IO;
        if (n == 0)
            snprintf(ctx->errstr, sizeof(ctx->errstr),
                     "Server closed the connection");
        else if (errno != EPROTO && errno != EAGAIN)
            snprintf(ctx->errstr, sizeof(ctx->errstr), "%s",
                     strerror(errno));
        return REDIS_ERR;
    }
    return REDIS_OK;
}

int dlock__rio_get_reply(redisContext *ctx, void **reply)
{
    *reply = NULL;
    if (redisGetReplyFromReader(ctx, reply) != REDIS_OK)
        return REDIS_ERR;
    if (*reply)
        return REDIS_OK;
    int s = dlock__rio_send(ctx);
    if (s != 1) {
        ctx->err = REDIS_ERR_IO;
        snprintf(ctx->errstr, sizeof(ctx->errstr), "%s",
                 s == 0 ? "Resource temporarily unavailable"
                        : strerror(errno));
        return REDIS_ERR;
    }
    /* bounded by the socket's timeouts; a reply is at most a few KB */
    for (int i = 0; i < 100000 && !*reply; i++) {
        if (dlock__rio_fill(ctx) != REDIS_OK)
            return REDIS_ERR;
        if (redisGetReplyFromReader(ctx, reply) != REDIS_OK)
            return REDIS_ERR;
        if (!*reply && !dlock__rio_is_tls(ctx) && ctx->err)
            return REDIS_ERR;
    }
    if (!*reply) {
        ctx->err = REDIS_ERR_IO;
        snprintf(ctx->errstr, sizeof(ctx->errstr),
                 "Resource temporarily unavailable");
        return REDIS_ERR;
    }
    return REDIS_OK;
}

int dlock__rio_pending(const redisContext *ctx)
{
#ifdef DLOCK_HAVE_REDIS_TLS
    const rio_tls *rt = TLS_OF(ctx);
    return rt && SSL_has_pending(rt->ssl);
#else
    (void)ctx;
    return 0;
#endif
}

int dlock__rio_stale(redisContext *ctx)
{
    struct pollfd p = {ctx->fd, POLLIN, 0};

    if (dlock__rio_pending(ctx))
        return 1; /* an answer to nothing asked: leave it */
    if (poll(&p, 1, 0) == 0)
        return 0;
#ifdef DLOCK_HAVE_REDIS_TLS
    rio_tls *rt = TLS_OF(ctx);
    if (rt && !(ctx->flags & REDIS_BLOCK)) {
        /* a record that is not data (a session ticket, a key update) is
         * not the end */
        char b[64];
        ssize_t n = dlock__rio_read(ctx, b, sizeof(b));
        return !(n < 0 && errno == EAGAIN);
    }
#endif
    return 1;
}

void dlock__rio_free(redisContext *ctx)
{
    if (!ctx)
        return;
#ifdef DLOCK_HAVE_REDIS_TLS
    rio_tls *rt = TLS_OF(ctx);
    if (rt) {
        SSL_set_app_data(rt->ssl, NULL);
        /* a connection that did not fail ends "cleanly" without a word
         * on the wire (quiet): OpenSSL would otherwise spoil its session
         * for resumption */
        if (!ctx->err && rt->stage == STAGE_UP) {
            SSL_set_quiet_shutdown(rt->ssl, 1);
            (void)SSL_shutdown(rt->ssl);
        }
        SSL_free(rt->ssl);
        free(rt);
        ctx->reader->privdata = NULL;
    }
#endif
    redisFree(ctx);
}
