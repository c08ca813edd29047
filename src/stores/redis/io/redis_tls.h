/* SPDX-License-Identifier: MIT */
/*
 * redis_tls.h -- what the two files of the Redis I/O path share (the rest
 * of the store sees redis_io.h only): redis_tls.c, the store's TLS
 * settings, the sessions and a connection's handshake; redis_io.c, the
 * connections and their bytes, plain or TLS.
 */
#ifndef DLOCK_REDIS_TLS_H
#define DLOCK_REDIS_TLS_H

#include "redis_io.h"

#ifdef DLOCK_HAVE_REDIS_TLS

#include <openssl/err.h>
#include <openssl/ssl.h>

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

/* The SSL object of a new connection to host:port, in ctx's reader's
 * privdata (rio_tls, STAGE_HANDSHAKE). DLOCK_OK or DLOCK_ENOMEM. */
int dlock__rtls_attach(const dlock__rtls *ct, redisContext *ctx,
                       const char *host, int port);

/* Why the handshake (or a read) failed, as OpenSSL says it, into why. */
void dlock__rtls_why(rio_tls *rt, int ret, int err, char *why, size_t cap);

/* One step of the handshake: 1 done, 0 wants rt->wants, -1 failed. */
int dlock__rtls_handshake_step(rio_tls *rt, char *why, size_t cap);

/* The whole handshake of a connected blocking socket, by `deadline`: 1
 * done, -1 failed (why). */
int dlock__rtls_handshake(rio_tls *rt, int fd, int64_t deadline, char *why,
                          size_t cap);

/* A TLS write failed: ctx->errstr and errno say why (the peer's alert,
 * when it sent one). */
void dlock__rtls_write_failed(redisContext *ctx, rio_tls *rt);

#else

#define TLS_OF(ctx) ((void)(ctx), (rio_tls *)NULL)
typedef struct rio_tls rio_tls;

#endif /* DLOCK_HAVE_REDIS_TLS */

#endif /* DLOCK_REDIS_TLS_H */
