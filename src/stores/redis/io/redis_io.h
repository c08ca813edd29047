/* SPDX-License-Identifier: MIT */
/*
 * redis_io.h -- the one I/O path of every Redis connection (redis://,
 * unix://, rediss://, the sentinels, a cluster's nodes, Redlock's nodes):
 * hiredis connects the socket, formats the commands and parses the
 * replies (its redisContext keeps the socket, the output buffer and the
 * reply reader); the bytes go through the functions below, which speak
 * TLS through OpenSSL when the store's configuration asks for it.
 *
 * A TLS connection's SSL object rides in its reader's privdata (hiredis'
 * default reply functions leave that field unused): every function here
 * takes the redisContext alone, as hiredis' own would.
 *
 * Rules a caller keeps (docs/design.md, "Redis over TLS"):
 *  - one thread at a time per connection (an SSL object is not shared);
 *  - a socket found readable is drained (dlock__rio_fill) before it is
 *    polled again: OpenSSL may hold whole records already read, which no
 *    poll() sees (dlock__rio_pending says so);
 *  - nothing here raises SIGPIPE: writes go through send(MSG_NOSIGNAL).
 */
#ifndef DLOCK_REDIS_IO_H
#define DLOCK_REDIS_IO_H

#include "store.h"

#include <hiredis.h>

typedef struct dlock__rtls dlock__rtls;

/* The TLS settings of a store from its URI: rediss://, or ?tls=1 on
 * another Redis scheme; cacert, cert, key, sni, insecure. *out is NULL
 * for a plain store. DLOCK_OK; DLOCK_EINVAL for parameters that do not
 * fit (a cert without its key, TLS on unix://, a parameter of TLS
 * without it); DLOCK_ECONN for files OpenSSL cannot use (unreadable, a
 * key that is not the certificate's); DLOCK_ENOTSUP in a build without
 * OpenSSL. `what` names the store in messages. */
int dlock__rtls_open(const dlock__uri *u, const char *what,
                     dlock__rtls **out);
void dlock__rtls_free(dlock__rtls *t);

/* Does the store give a client certificate? */
int dlock__rtls_has_cert(const dlock__rtls *t);

/* The URI parameters dlock__rtls_open reads, NULL-terminated, for the
 * stores' lists of what they accept. */
extern const char *const dlock__rtls_params[];

/* Connects to host:port (or the Unix socket path), then, with tls, does
 * the handshake and checks the server's certificate: all within ms. The
 * socket is left blocking, with ms as its send and receive timeouts.
 * DLOCK_OK with *out set; DLOCK_ECONN with the reason (the system's, or
 * OpenSSL's) in why; DLOCK_ENOMEM. */
int dlock__rio_connect(const dlock__rtls *tls, const char *host, int port,
                       const char *path, int64_t ms, redisContext **out,
                       char *why, size_t cap);

/* The same without waiting: the TCP connect is started and *out set; the
 * caller polls dlock__rio_wants() and calls dlock__rio_step() until it
 * answers 1 (connected, and the handshake done) or -1 (failed: why). */
int dlock__rio_connect_nb(const dlock__rtls *tls, const char *host,
                          int port, redisContext **out, char *why,
                          size_t cap);
int dlock__rio_step(redisContext *ctx, char *why, size_t cap);
/* The poll() events a connection waits for: while connecting, what the
 * connect or the handshake needs; after dlock__rio_send() answered 0,
 * what the write needs (OpenSSL may have to read first). */
short dlock__rio_wants(const redisContext *ctx);

/* Is this connection TLS? */
int dlock__rio_is_tls(const redisContext *ctx);

/* Sends what ctx has buffered (see dlock__redis_send). On -1 (failed)
 * ctx->errstr says why: for TLS the server's alert when it sent one. */
int dlock__rio_send(redisContext *ctx);

/* Reads what the socket has into the reply reader: once for a plain
 * socket (as redisBufferRead), until OpenSSL wants more from the socket
 * for TLS. REDIS_OK (a non-blocking socket with nothing to read is OK),
 * or REDIS_ERR with ctx->err and ctx->errstr set (REDIS_ERR_EOF: the
 * server closed it). */
int dlock__rio_fill(redisContext *ctx);

/* redisGetReply() over this I/O path: sends what is buffered, then reads
 * until a reply is whole. A blocking socket's timeouts bound it. */
int dlock__rio_get_reply(redisContext *ctx, void **reply);

/* One read of at most cap bytes, as recv(): > 0 bytes; 0 the server
 * closed the connection; -1 with errno (EAGAIN: nothing yet). */
ssize_t dlock__rio_read(redisContext *ctx, char *buf, size_t cap);

/* Bytes OpenSSL holds already read from the socket (0 for plain). */
int dlock__rio_pending(const redisContext *ctx);

/* Has the server closed this idle connection? No wait. */
int dlock__rio_stale(redisContext *ctx);

/* Sets the socket's O_NONBLOCK (and clears hiredis' REDIS_BLOCK: a read
 * with nothing there is "nothing yet"). 0, or -1 (errno). */
int dlock__rio_nonblocking(redisContext *ctx);

/* Frees the connection, and its TLS state without a close_notify (the
 * peer may be gone; nothing waits on it). NULL is fine. */
void dlock__rio_free(redisContext *ctx);

#endif /* DLOCK_REDIS_IO_H */
