/* SPDX-License-Identifier: MIT */
/*
 * redis_io.c -- the I/O of every Redis connection, plain or TLS (see
 * redis_io.h; the protocol in docs/design.md, "Redis over TLS").
 *
 * TLS is OpenSSL's: the handshake, the certificate and name checks, the
 * records. Ours is only the plumbing: the socket BIO writes with
 * send(MSG_NOSIGNAL) (OpenSSL's own write(2) raises SIGPIPE on a peer
 * that went), the handshake runs non-blocking against a deadline, and the
 * sessions the servers give are kept per store and address, so that the
 * store's next connection to the same server (its subscriber, a
 * reconnect) resumes instead of doing a full handshake.
 */
#include "redis_io.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#ifdef DLOCK_HAVE_REDIS_TLS
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#endif

#define READ_CHUNK 16384
#define SESSIONS 8 /* the servers a store resumes sessions with */

const char *const dlock__rtls_params[] = {"tls", "cacert", "cert", "key",
                                          "sni", "insecure", NULL};

static struct timeval tv_ms(int64_t ms)
{
    struct timeval tv;

    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)((ms % 1000) * 1000);
    return tv;
}

/* Is a TLS parameter among u's? Its name in *which. */
static int any_tls_param(const dlock__uri *u, const char **which)
{
    for (int i = 1; dlock__rtls_params[i]; i++)
        if (dlock__uri_param(u, dlock__rtls_params[i])) {
            *which = dlock__rtls_params[i];
            return 1;
        }
    return 0;
}

/* Does the URI ask for TLS? 1, 0, or a DLOCK_E* code (< 0: a message
 * set). */
static int wants_tls(const dlock__uri *u, const char *what)
{
    const char *tls = dlock__uri_param(u, "tls"), *which = NULL;
    int on = strcmp(u->scheme, "rediss") == 0;

    if (tls && strcmp(tls, "1") && strcmp(tls, "0"))
        return dlock__err(DLOCK_EINVAL, "%s: tls must be 0 or 1, not "
                                        "'%.20s'",
                          what, tls);
    if (tls && on && !strcmp(tls, "0"))
        return dlock__err(DLOCK_EINVAL, "%s: rediss:// is TLS: tls=0 "
                                        "contradicts it (use redis://)",
                          what);
    on = on || (tls && !strcmp(tls, "1"));
    if (!strcmp(u->scheme, "unix") && (on || any_tls_param(u, &which)))
        return dlock__err(DLOCK_EINVAL,
                          "%s: unix:// needs no TLS: a local socket's bytes "
                          "never cross a network (its file permissions "
                          "guard it)",
                          what);
    if (!on && any_tls_param(u, &which))
        return dlock__err(DLOCK_EINVAL,
                          "%s: '%s' is a TLS parameter: use rediss:// (or "
                          "tls=1)",
                          what, which);
    return on;
}

#ifndef DLOCK_HAVE_REDIS_TLS

/* ------------------------------------------------------------------------ */
/* A build without OpenSSL                                                  */
/* ------------------------------------------------------------------------ */

struct dlock__rtls {
    int unused;
};

int dlock__rtls_open(const dlock__uri *u, const char *what,
                     dlock__rtls **out)
{
    int on = wants_tls(u, what);

    *out = NULL;
    if (on < 0)
        return on;
    if (on)
        return dlock__err(DLOCK_ENOTSUP,
                          "%s: TLS (rediss://) is not in this build of "
                          "dlock: build it with OpenSSL (Debian: "
                          "libssl-dev)",
                          what);
    return DLOCK_OK;
}

void dlock__rtls_free(dlock__rtls *t)
{
    (void)t;
}

#define TLS_OF(ctx) ((void)(ctx), (rio_tls *)NULL)
typedef struct rio_tls rio_tls;

#else

/* ------------------------------------------------------------------------ */
/* The store's TLS settings                                                 */
/* ------------------------------------------------------------------------ */

struct dlock__rtls {
    SSL_CTX *ctx;
    BIO_METHOD *bio; /* a socket BIO that sends with MSG_NOSIGNAL */
    char *sni;       /* the name to check and send, or NULL: the host's */
    int insecure;
    pthread_mutex_t mu; /* the sessions */
    struct {
        char addr[300];
        SSL_SESSION *s;
    } sessions[SESSIONS];
    int next;
};

/* A TLS connection's state, in its reader's privdata. */
typedef struct rio_tls {
    SSL *ssl;
    dlock__rtls *t;
    int stage;   /* STAGE_* */
    short wants; /* the events the handshake, or a write, waits for */
    char addr[300];
} rio_tls;

enum { STAGE_TCP, STAGE_HANDSHAKE, STAGE_UP };

#define TLS_OF(ctx)                                                           \
    ((rio_tls *)((ctx) && (ctx)->reader ? (ctx)->reader->privdata : NULL))

static int bio_write(BIO *b, const char *buf, int len)
{
    int fd = -1;
    ssize_t w;

    BIO_get_fd(b, &fd);
    BIO_clear_retry_flags(b);
    do
        w = send(fd, buf, (size_t)len, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        BIO_set_retry_write(b);
    return (int)w;
}

/* OpenSSL's reason for the last failure, or "" (the queue is emptied). */
static const char *ssl_reason(char *buf, size_t cap)
{
    unsigned long e, last = 0;

    while ((e = ERR_get_error()) != 0)
        last = e;
    buf[0] = '\0';
    if (last) {
        const char *r = ERR_reason_error_string(last);
        if (r)
            snprintf(buf, cap, "%s", r);
        else
            ERR_error_string_n(last, buf, cap);
    }
    return buf;
}

/* A server gave a session: keep it for the next connection there. */
static int new_session(SSL *ssl, SSL_SESSION *s)
{
    rio_tls *rt = SSL_get_app_data(ssl);
    dlock__rtls *t;
    int slot = -1;

    if (!rt)
        return 0;
    t = rt->t;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < SESSIONS && slot < 0; i++)
        if (t->sessions[i].s && !strcmp(t->sessions[i].addr, rt->addr))
            slot = i;
    if (slot < 0) {
        slot = t->next;
        t->next = (t->next + 1) % SESSIONS;
    }
    if (t->sessions[slot].s)
        SSL_SESSION_free(t->sessions[slot].s);
    t->sessions[slot].s = s;
    snprintf(t->sessions[slot].addr, sizeof(t->sessions[slot].addr), "%s",
             rt->addr);
    pthread_mutex_unlock(&t->mu);
    return 1; /* the reference is ours */
}

/* A session of addr to resume (a reference), or NULL. */
static SSL_SESSION *session_of(dlock__rtls *t, const char *addr)
{
    SSL_SESSION *s = NULL;

    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < SESSIONS && !s; i++)
        if (t->sessions[i].s && !strcmp(t->sessions[i].addr, addr) &&
            SSL_SESSION_is_resumable(t->sessions[i].s)) {
            s = t->sessions[i].s;
            SSL_SESSION_up_ref(s);
        }
    pthread_mutex_unlock(&t->mu);
    return s;
}

/* Loads a PEM file into the context; DLOCK_ECONN naming it and OpenSSL's
 * reason. kind: "cacert", "cert", "key". */
static int load(dlock__rtls *t, const char *kind, const char *file,
                const char *what)
{
    char why[200];
    int ok;

    ERR_clear_error();
    if (access(file, R_OK) != 0)
        return dlock__err(DLOCK_ECONN, "%s: %s file '%.200s': %s", what,
                          kind, file, strerror(errno));
    if (!strcmp(kind, "cacert"))
        ok = SSL_CTX_load_verify_locations(t->ctx, file, NULL) == 1;
    else if (!strcmp(kind, "cert"))
        ok = SSL_CTX_use_certificate_chain_file(t->ctx, file) == 1;
    else
        ok = SSL_CTX_use_PrivateKey_file(t->ctx, file, SSL_FILETYPE_PEM) ==
             1;
    if (!ok)
        return dlock__err(DLOCK_ECONN, "%s: %s file '%.200s': %s", what,
                          kind, file, ssl_reason(why, sizeof(why)));
    return DLOCK_OK;
}

int dlock__rtls_open(const dlock__uri *u, const char *what,
                     dlock__rtls **out)
{
    const char *cacert = dlock__uri_param(u, "cacert");
    const char *cert = dlock__uri_param(u, "cert");
    const char *key = dlock__uri_param(u, "key");
    const char *sni = dlock__uri_param(u, "sni");
    const char *insecure = dlock__uri_param(u, "insecure");
    int on = wants_tls(u, what), rc = DLOCK_OK;
    dlock__rtls *t;

    *out = NULL;
    if (on <= 0)
        return on < 0 ? on : DLOCK_OK;
    if (!cert != !key)
        return dlock__err(DLOCK_EINVAL,
                          "%s: a client certificate needs its key: give "
                          "both cert= and key=",
                          what);
    if (insecure && strcmp(insecure, "0") && strcmp(insecure, "1"))
        return dlock__err(DLOCK_EINVAL,
                          "%s: insecure must be 0 or 1, not '%.20s'", what,
                          insecure);
    if (sni && (!*sni || strlen(sni) > 253))
        return dlock__err(DLOCK_EINVAL, "%s: sni must be a host name", what);
    if (!(t = calloc(1, sizeof(*t))))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&t->mu, NULL);
    t->insecure = insecure && !strcmp(insecure, "1");
    if (sni && !(t->sni = strdup(sni)))
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    if (rc == DLOCK_OK && !(t->ctx = SSL_CTX_new(TLS_client_method())))
        rc = dlock__err(DLOCK_ENOMEM, "%s: cannot make a TLS context",
                        what);
    if (rc == DLOCK_OK) {
        SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION);
        SSL_CTX_set_mode(t->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE |
                                     SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
        /* one read(2) takes what the socket has (a record's header and
         * body, several records), not five bytes and then the rest */
        SSL_CTX_set_read_ahead(t->ctx, 1);
        SSL_CTX_set_verify(t->ctx,
                           t->insecure ? SSL_VERIFY_NONE : SSL_VERIFY_PEER,
                           NULL);
        SSL_CTX_set_session_cache_mode(t->ctx,
                                       SSL_SESS_CACHE_CLIENT |
                                           SSL_SESS_CACHE_NO_INTERNAL_STORE);
        SSL_CTX_sess_set_new_cb(t->ctx, new_session);
        if (cacert)
            rc = load(t, "cacert", cacert, what);
        else if (SSL_CTX_set_default_verify_paths(t->ctx) != 1)
            rc = dlock__err(DLOCK_ECONN,
                            "%s: cannot load the system's certificate "
                            "authorities (give cacert=)",
                            what);
    }
    if (rc == DLOCK_OK && cert)
        rc = load(t, "cert", cert, what);
    if (rc == DLOCK_OK && key)
        rc = load(t, "key", key, what);
    if (rc == DLOCK_OK && cert && SSL_CTX_check_private_key(t->ctx) != 1) {
        char why[200];
        rc = dlock__err(DLOCK_ECONN,
                        "%s: key file '%.200s' is not the key of "
                        "certificate '%.200s': %s",
                        what, key, cert, ssl_reason(why, sizeof(why)));
    }
    if (rc == DLOCK_OK) {
        const BIO_METHOD *s = BIO_s_socket();
        t->bio = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK |
                                  BIO_TYPE_DESCRIPTOR,
                              "dlock socket");
        if (!t->bio ||
            !BIO_meth_set_write(t->bio, bio_write) ||
            !BIO_meth_set_read(t->bio, BIO_meth_get_read(s)) ||
            !BIO_meth_set_puts(t->bio, BIO_meth_get_puts(s)) ||
            !BIO_meth_set_ctrl(t->bio, BIO_meth_get_ctrl(s)) ||
            !BIO_meth_set_create(t->bio, BIO_meth_get_create(s)) ||
            !BIO_meth_set_destroy(t->bio, BIO_meth_get_destroy(s)))
            rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    if (rc) {
        dlock__rtls_free(t);
        return rc;
    }
    *out = t;
    return DLOCK_OK;
}

void dlock__rtls_free(dlock__rtls *t)
{
    if (!t)
        return;
    for (int i = 0; i < SESSIONS; i++)
        if (t->sessions[i].s)
            SSL_SESSION_free(t->sessions[i].s);
    if (t->ctx)
        SSL_CTX_free(t->ctx);
    if (t->bio)
        BIO_meth_free(t->bio);
    free(t->sni);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* ------------------------------------------------------------------------ */
/* A connection's TLS                                                       */
/* ------------------------------------------------------------------------ */

/* The SSL object of a new connection to host:port: the name to check (an
 * address against the certificate's IP entries; no SNI for an address),
 * the session to resume. DLOCK_OK or DLOCK_ENOMEM. */
static int tls_attach(const dlock__rtls *ct, redisContext *ctx,
                      const char *host, int port)
{
    dlock__rtls *t = (dlock__rtls *)ct; /* its cache is guarded by mu */
    const char *name = t->sni ? t->sni : host;
    unsigned char addr[16];
    int is_ip = inet_pton(AF_INET, name, addr) == 1 ||
                inet_pton(AF_INET6, name, addr) == 1;
    rio_tls *rt = calloc(1, sizeof(*rt));
    BIO *bio = NULL;
    SSL_SESSION *s;

    if (!rt)
        return DLOCK_ENOMEM;
    rt->t = t;
    snprintf(rt->addr, sizeof(rt->addr), "%s:%d", host, port);
    if (!(rt->ssl = SSL_new(t->ctx)) || !(bio = BIO_new(t->bio)))
        goto nomem;
    BIO_set_fd(bio, ctx->fd, BIO_NOCLOSE);
    SSL_set_bio(rt->ssl, bio, bio);
    bio = NULL;
    SSL_set_app_data(rt->ssl, rt);
    if (!t->insecure) {
        if (is_ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(rt->ssl),
                                                  name) != 1
                  : SSL_set1_host(rt->ssl, name) != 1)
            goto nomem;
    }
    if (!is_ip && SSL_set_tlsext_host_name(rt->ssl, name) != 1)
        goto nomem;
    if ((s = session_of(t, rt->addr)) != NULL) {
        SSL_set_session(rt->ssl, s);
        SSL_SESSION_free(s);
    }
    rt->stage = STAGE_HANDSHAKE;
    ctx->reader->privdata = rt;
    return DLOCK_OK;
nomem:
    if (bio)
        BIO_free(bio);
    if (rt->ssl)
        SSL_free(rt->ssl);
    free(rt);
    return DLOCK_ENOMEM;
}

/* Why the handshake (or a read) failed, as OpenSSL says it. */
static void tls_why(rio_tls *rt, int ret, int err, char *why, size_t cap)
{
    long vr = SSL_get_verify_result(rt->ssl);
    int sys = errno;
    char r[200];

    ssl_reason(r, sizeof(r));
    if (vr != X509_V_OK)
        snprintf(why, cap,
                 "TLS: the server's certificate is not accepted: %s",
                 X509_verify_cert_error_string(vr));
    else if (r[0])
        snprintf(why, cap, "TLS: %s", r);
    else if (err == SSL_ERROR_ZERO_RETURN ||
             (err == SSL_ERROR_SYSCALL && (ret == 0 || sys == 0)))
        snprintf(why, cap,
                 rt->stage == STAGE_HANDSHAKE
                     ? "TLS: the server closed the connection during the "
                       "handshake (is it a TLS port?)"
                     : "the server closed the connection");
    else
        snprintf(why, cap, "TLS: %s", strerror(sys));
}

/* One step of the handshake: 1 done, 0 wants rt->wants, -1 failed. */
static int handshake_step(rio_tls *rt, char *why, size_t cap)
{
    int ret, err;

    ERR_clear_error();
    errno = 0;
    ret = SSL_connect(rt->ssl);
    if (ret == 1) {
        rt->stage = STAGE_UP;
        rt->wants = 0;
        return 1;
    }
    err = SSL_get_error(rt->ssl, ret);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
        rt->wants = err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        return 0;
    }
    tls_why(rt, ret, err, why, cap);
    return -1;
}

static int set_nonblock(int fd, int on)
{
    int fl = fcntl(fd, F_GETFL);

    if (fl < 0)
        return -1;
    return fcntl(fd, F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK);
}

/* The whole handshake of a connected blocking socket, by `deadline`. */
static int handshake(rio_tls *rt, int fd, int64_t deadline, char *why,
                     size_t cap)
{
    int r = 0;

    if (set_nonblock(fd, 1) != 0) {
        snprintf(why, cap, "%s", strerror(errno));
        return -1;
    }
    for (int rounds = 0; rounds < 64 && r == 0; rounds++) {
        r = handshake_step(rt, why, cap);
        if (r != 0)
            break;
        int64_t left = deadline - dlock__now_ms();
        struct pollfd p = {fd, rt->wants, 0};
        if (left <= 0 || poll(&p, 1, (int)left) == 0) {
            snprintf(why, cap, "TLS: no answer to the handshake in time "
                               "(is it a TLS port?)");
            r = -1;
        }
    }
    if (r == 0) {
        snprintf(why, cap, "TLS: the handshake does not end");
        r = -1;
    }
    if (set_nonblock(fd, 0) != 0 && r == 1) {
        snprintf(why, cap, "%s", strerror(errno));
        r = -1;
    }
    return r;
}

#endif /* DLOCK_HAVE_REDIS_TLS */

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
        if (tls_attach(tls, ctx, host, port) != DLOCK_OK) {
            redisFree(ctx);
            return DLOCK_ENOMEM;
        }
        if (handshake(TLS_OF(ctx), ctx->fd, deadline, why, cap) != 1) {
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
        if (tls_attach(tls, ctx, host, port) != DLOCK_OK) {
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
    return handshake_step(rt, why, cap);
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

int dlock__rtls_has_cert(const dlock__rtls *t)
{
#ifdef DLOCK_HAVE_REDIS_TLS
    return t && SSL_CTX_get0_certificate(t->ctx) != NULL;
#else
    (void)t;
    return 0;
#endif
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

#ifdef DLOCK_HAVE_REDIS_TLS
/* A TLS write failed: the peer went. It may have said why first (an
 * alert, such as TLS 1.3's "certificate required", which comes after
 * the handshake): one read takes it, if it is still there. ctx->errstr
 * gets the reason; errno the system's (EPROTO for an alert). */
static void write_failed(redisContext *ctx, rio_tls *rt)
{
    int sys = errno ? errno : EPIPE;
    char b[64], r[200];

    ssl_reason(r, sizeof(r));
    ERR_clear_error();
    errno = 0;
    (void)SSL_read(rt->ssl, b, sizeof(b));
    ssl_reason(r, sizeof(r));
    ctx->err = REDIS_ERR_IO;
    if (r[0]) {
        snprintf(ctx->errstr, sizeof(ctx->errstr), "TLS: %.120s", r);
        errno = EPROTO;
    } else {
        snprintf(ctx->errstr, sizeof(ctx->errstr), "%s", strerror(sys));
        errno = sys;
    }
}
#endif

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
                write_failed(ctx, rt);
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
    tls_why(rt, n, e, ctx->errstr, sizeof(ctx->errstr));
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
