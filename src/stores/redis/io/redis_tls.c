/* SPDX-License-Identifier: MIT */
/*
 * redis_tls.c -- the TLS of every Redis connection (redis_tls.h; the I/O
 * path that uses it is redis_io.c, the protocol in docs/design.md,
 * "Redis over TLS"): the store's TLS settings from its URI, the sessions
 * the servers give, and a connection's handshake.
 *
 * TLS is OpenSSL's: the handshake, the certificate and name checks, the
 * records. Ours is only the plumbing: the socket BIO writes with
 * send(MSG_NOSIGNAL) (OpenSSL's own write(2) raises SIGPIPE on a peer
 * that went), the handshake runs non-blocking against a deadline, and the
 * sessions the servers give are kept per store and address, so that the
 * store's next connection to the same server (its subscriber, a
 * reconnect) resumes instead of doing a full handshake.
 */
#include "redis_tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifdef DLOCK_HAVE_REDIS_TLS
#include <openssl/x509v3.h>
#endif

#define SESSIONS 8 /* the servers a store resumes sessions with */

const char *const dlock__rtls_params[] = {"tls", "cacert", "cert", "key",
                                          "sni", "insecure", NULL};

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
int dlock__rtls_attach(const dlock__rtls *ct, redisContext *ctx,
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
void dlock__rtls_why(rio_tls *rt, int ret, int err, char *why, size_t cap)
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
int dlock__rtls_handshake_step(rio_tls *rt, char *why, size_t cap)
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
    dlock__rtls_why(rt, ret, err, why, cap);
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
int dlock__rtls_handshake(rio_tls *rt, int fd, int64_t deadline, char *why,
                          size_t cap)
{
    int r = 0;

    if (set_nonblock(fd, 1) != 0) {
        snprintf(why, cap, "%s", strerror(errno));
        return -1;
    }
    for (int rounds = 0; rounds < 64 && r == 0; rounds++) {
        r = dlock__rtls_handshake_step(rt, why, cap);
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

/* A TLS write failed: the peer went. It may have said why first (an
 * alert, such as TLS 1.3's "certificate required", which comes after
 * the handshake): one read takes it, if it is still there. ctx->errstr
 * gets the reason; errno the system's (EPROTO for an alert). */
void dlock__rtls_write_failed(redisContext *ctx, rio_tls *rt)
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

#endif /* DLOCK_HAVE_REDIS_TLS */

int dlock__rtls_has_cert(const dlock__rtls *t)
{
#ifdef DLOCK_HAVE_REDIS_TLS
    return t && SSL_CTX_get0_certificate(t->ctx) != NULL;
#else
    (void)t;
    return 0;
#endif
}
