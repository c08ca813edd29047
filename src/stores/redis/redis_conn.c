/* SPDX-License-Identifier: MIT */
/*
 * redis_conn.c -- the Redis store's pipelined command connection (see
 * redis_conn.h), and the connect + login + script load both of its
 * connections use.
 *
 * Locking: one mutex (mu) guards the socket's writes, the queue of calls
 * in flight and the reading role. The reading thread drops mu while it
 * waits in recv(); only it touches the reply reader then. A connection
 * found broken while someone reads is shut down (which ends that recv())
 * and freed by the reader, never under its feet.
 */
#include "redis_conn.h"

#include "buf.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>

#define MIN_IO_MS 10      /* the shortest wait for an answer */
#define STALE_CHECK_MS 2  /* probe a connection quiet this long (>= 1 ms) */
#define MAX_SCRIPTS 16
#define READ_CHUNK 16384

/* One call in flight: its replies arrive in order. */
typedef struct pend {
    struct pend *next;
    redisReply **replies; /* the caller's array (unused once abandoned) */
    int n, got;
    int done;      /* every reply is in, or the call failed */
    int abandoned; /* its caller gave up: drop its replies, then free it */
    int rc;        /* the call's failure (the connection broke) */
    char msg[256];
    int64_t sent; /* when its commands were written */
    pthread_cond_t cv;
} pend;

struct dlock__rconn {
    dlock__rconn_target t;
    pthread_mutex_t mu;
    pthread_cond_t idle_cv; /* a broken connection was freed */
    redisContext *ctx;      /* the socket and its reply reader */
    pend *head, *tail;      /* calls in flight, in the order written */
    int reading;            /* a thread waits in recv() */
    int dead;               /* broken while read: the reader frees it */
    int64_t used;           /* when a command was last written */
    int64_t rcvtimeo;       /* the socket's SO_RCVTIMEO now, ms */
    uint64_t gen;           /* the topology's generation of ctx */
    char sha[MAX_SCRIPTS][41];
};

/* ------------------------------------------------------------------------ */
/* Connecting                                                               */
/* ------------------------------------------------------------------------ */

static struct timeval tv_ms(int64_t ms)
{
    struct timeval tv;

    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)((ms % 1000) * 1000);
    return tv;
}

static int64_t budget(const dlock__rconn_target *t, int64_t deadline)
{
    int64_t ms = deadline - dlock__now_ms();

    if (ms > t->cfg->timeout_ms)
        ms = t->cfg->timeout_ms;
    return ms < MIN_IO_MS ? MIN_IO_MS : ms;
}

/* What a connection that failed at its first round trip may mean: a
 * TLS port spoken to in plain text answers with an alert or hangs up; a
 * server that demands a client certificate (TLS 1.3) hangs up after the
 * handshake, its alert often lost to the reset. "" when nothing fits. */
static const char *connect_hint(const dlock__rconn_target *t,
                                const redisContext *ctx, int err)
{
    int hung_up = err == ECONNRESET || err == EPIPE ||
                  ctx->err == REDIS_ERR_EOF ||
                  strstr(ctx->errstr, "reset by peer") ||
                  strstr(ctx->errstr, "Broken pipe");

    if (!t->cfg->tls && (hung_up || ctx->err == REDIS_ERR_PROTOCOL))
        return " (a TLS port? use rediss://)";
    if (t->cfg->tls && hung_up && !dlock__rtls_has_cert(t->cfg->tls))
        return " (does the server demand a client certificate? give "
               "cert= and key=)";
    return "";
}

/* One try of dlock__rconn_connect(); *asked_again set when the server it
 * reached (or could not reach) was not the primary the topology named. */
static int connect_once(const dlock__rconn_target *t, int load_scripts,
                        char (*sha)[41], int64_t deadline,
                        redisContext **out, uint64_t *gen, int *asked_again)
{
    int64_t ms = budget(t, deadline);
    redisContext *ctx;
    char phost[256], why[256];
    int pport = 0, role = -1;
    uint64_t pgen = 0;
    int n, rc = DLOCK_OK;

    *out = NULL;
    if (t->topo) {
        rc = dlock__rtopo_primary(t->topo, phost, &pport, &pgen, deadline);
        if (rc)
            return rc;
        ms = budget(t, deadline);
    }
    if (gen)
        *gen = pgen;
    rc = dlock__rio_connect(t->cfg->tls, t->topo ? phost : t->host,
                            t->topo ? pport : t->port,
                            t->topo ? NULL : t->path, ms, &ctx, why,
                            sizeof(why));
    if (rc == DLOCK_ENOMEM)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", t->where);
    if (rc) {
        if (t->topo) { /* the primary it named is gone: ask again */
            dlock__rtopo_not_primary(t->topo, pgen);
            *asked_again = 1;
            rc = dlock__err(DLOCK_ECONN, "%s: primary unreachable, "
                                         "failover in progress? (cannot "
                                         "connect to %s:%d: %s)",
                            t->where, phost, pport, why);
        } else {
            rc = dlock__err(DLOCK_ECONN, "%s: cannot connect: %s", t->where,
                            why);
        }
        return rc;
    }
    if (!t->path)
        redisEnableKeepAlive(ctx);

    n = dlock__redis_append_login(ctx, t->cfg);
    if (t->topo) {
        redisAppendCommand(ctx, "ROLE");
        role = n++;
    }
    if (load_scripts)
        for (int i = 0; i < t->nscripts; i++)
            redisAppendCommand(ctx, "SCRIPT LOAD %s", t->scripts[i]);
    else
        redisAppendCommand(ctx, "PING");

    int total = n + (load_scripts ? t->nscripts : 1);
    int sent = dlock__redis_send(ctx);
    if (sent != 1) {
        rc = sent == 0 ? dlock__err(DLOCK_ECONN, "%s: no answer within %lld "
                                                 "ms",
                                    t->where, (long long)ms)
                       : dlock__err(DLOCK_ECONN, "%s: %s%s", t->where,
                                    t->cfg->tls ? ctx->errstr
                                                : strerror(errno),
                                    connect_hint(t, ctx, errno));
        dlock__rio_free(ctx);
        return rc;
    }
    for (int i = 0; i < total; i++) {
        redisReply *r = NULL;
        if (dlock__rio_get_reply(ctx, (void **)&r) != REDIS_OK || !r) {
            if (rc == DLOCK_OK)
                rc = dlock__redis_io_failure(t->where, ctx, ms);
            if (*connect_hint(t, ctx, 0)) {
                char m[256]; /* (the message is rewritten in place) */
                snprintf(m, sizeof(m), "%s", dlock_errmsg());
                rc = dlock__err(rc, "%s%s", m, connect_hint(t, ctx, 0));
            }
            break;
        }
        if (rc == DLOCK_OK && i == role) {
            if (r->type != REDIS_REPLY_ARRAY || r->elements < 1 ||
                r->element[0]->type != REDIS_REPLY_STRING ||
                strcmp(r->element[0]->str, "master") != 0) {
                dlock__rtopo_not_primary(t->topo, pgen);
                *asked_again = 1;
                rc = dlock__err(DLOCK_ECONN,
                                "%s: %s:%d is not the primary (ROLE: "
                                "%.40s): failover in progress?",
                                t->where, phost, pport,
                                r->type == REDIS_REPLY_ARRAY &&
                                        r->elements > 0 &&
                                        r->element[0]->type ==
                                            REDIS_REPLY_STRING
                                    ? r->element[0]->str
                                : r->type == REDIS_REPLY_ERROR ? r->str
                                                               : "?");
            }
        } else if (rc == DLOCK_OK) {
            if (r->type == REDIS_REPLY_ERROR) {
                if (t->cfg->password && i == 0)
                    rc = dlock__err(DLOCK_EAUTH,
                                    "%s: authentication refused (wrong user "
                                    "name or password)",
                                    t->where);
                else if (t->cfg->db != 0 && i == n - 1 - (role >= 0))
                    rc = dlock__err(DLOCK_EINVAL,
                                    "%s: cannot select database %ld",
                                    t->where, t->cfg->db);
                else
                    rc = dlock__redis_server_error(t->where, t->cfg->password,
                                                   r->str, NULL);
            } else if (load_scripts && i >= n) {
                if (r->type != REDIS_REPLY_STRING || r->len != 40)
                    rc = dlock__err(DLOCK_EPROTO,
                                    "%s: unexpected answer to SCRIPT LOAD",
                                    t->where);
                else
                    memcpy(sha[i - n], r->str, 41);
            }
        }
        freeReplyObject(r);
    }
    if (rc) {
        dlock__rio_free(ctx);
        return rc;
    }
    *out = ctx;
    return DLOCK_OK;
}

int dlock__rconn_connect(const dlock__rconn_target *t, int load_scripts,
                         char (*sha)[41], int64_t deadline,
                         redisContext **out, uint64_t *gen)
{
    int again = 0;
    int rc = connect_once(t, load_scripts, sha, deadline, out, gen, &again);

    /* the primary moved (a failover the client had not heard of): the
     * sentinels are asked again, once, within the same deadline */
    if (rc == DLOCK_ECONN && again && dlock__now_ms() < deadline) {
        char first[256];
        snprintf(first, sizeof(first), "%s", dlock_errmsg());
        again = 0;
        rc = connect_once(t, load_scripts, sha, deadline, out, gen, &again);
        if (rc == DLOCK_ECONN) {
            char second[256]; /* (the message is rewritten in place) */
            snprintf(second, sizeof(second), "%s", dlock_errmsg());
            rc = dlock__err(rc, "%s (before: %s)", second, first);
        }
    }
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Calls in flight                                                          */
/* ------------------------------------------------------------------------ */

static void pend_free(pend *p)
{
    pthread_cond_destroy(&p->cv);
    free(p);
}

/* Wakes the oldest caller still waiting, so that it reads (mu held). */
static void pass_reading(dlock__rconn *rc)
{
    if (rc->reading)
        return;
    for (pend *p = rc->head; p; p = p->next) {
        if (!p->abandoned && !p->done) {
            pthread_cond_signal(&p->cv);
            return;
        }
    }
}

/* The connection broke: every call in flight fails with `code` and the
 * message; the socket is closed now, or by its reader (mu held). */
static void conn_fail(dlock__rconn *rc, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void conn_fail(dlock__rconn *rc, int code, const char *fmt, ...)
{
    char msg[256];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    for (pend *p = rc->head, *next; p; p = next) {
        next = p->next;
        if (p->abandoned) {
            pend_free(p);
            continue;
        }
        for (int i = 0; i < p->got; i++)
            freeReplyObject(p->replies[i]);
        p->got = 0;
        p->rc = code;
        memcpy(p->msg, msg, sizeof(msg));
        p->done = 1;
        pthread_cond_signal(&p->cv);
    }
    rc->head = rc->tail = NULL;
    if (!rc->ctx)
        return;
    if (rc->reading) {
        shutdown(rc->ctx->fd, SHUT_RDWR); /* ends the reader's wait */
        rc->dead = 1;
    } else {
        dlock__rio_free(rc->ctx);
        rc->ctx = NULL;
    }
}

/* One reply, for the oldest call in flight (mu held). */
static void dispatch(dlock__rconn *rc, redisReply *r)
{
    pend *p = rc->head;

    if (!p) {
        freeReplyObject(r);
        conn_fail(rc, DLOCK_EPROTO, "%s: an answer to nothing we asked",
                  rc->t.where);
        return;
    }
    if (p->abandoned)
        freeReplyObject(r);
    else
        p->replies[p->got] = r;
    if (++p->got < p->n)
        return;
    rc->head = p->next;
    if (!rc->head)
        rc->tail = NULL;
    if (p->abandoned) {
        pend_free(p);
    } else {
        p->done = 1;
        pthread_cond_signal(&p->cv);
    }
}

/* Hands the reader's whole replies to the calls in flight (mu held). */
static void dispatch_all(dlock__rconn *rc, redisContext *ctx)
{
    for (;;) {
        void *reply = NULL;
        if (redisReaderGetReply(ctx->reader, &reply) != REDIS_OK) {
            conn_fail(rc, DLOCK_EPROTO, "%s: protocol error: %s",
                      rc->t.where, ctx->reader->errstr);
            return;
        }
        if (!reply)
            return;
        dispatch(rc, reply);
        if (!rc->ctx)
            return;
    }
}

/* Waits (mu dropped) until the socket is readable or ms pass: 1, 0 (no
 * data in time), -1 (errno). A TLS connection's socket is non-blocking,
 * read under mu once poll() says so; records OpenSSL holds already count
 * as readable. */
static int wait_readable(dlock__rconn *rc, redisContext *ctx, int64_t ms)
{
    struct pollfd p = {ctx->fd, POLLIN, 0};
    int r;

    if (dlock__rio_pending(ctx))
        return 1;
    pthread_mutex_unlock(&rc->mu);
    do
        r = poll(&p, 1, (int)ms);
    while (r < 0 && errno == EINTR);
    pthread_mutex_lock(&rc->mu);
    return r;
}

/* Reads what the server sent, once, waiting at most until `until` or
 * until the oldest call in flight has waited the whole client timeout
 * (then the connection is declared dead). mu held; dropped in recv() (a
 * plain socket) or in poll() (TLS: OpenSSL's calls all run under mu, so
 * that no two threads use the SSL object at once). */
static void read_once(dlock__rconn *rc, int64_t until)
{
    int64_t oldest = rc->head->sent + rc->t.cfg->timeout_ms;
    int64_t now = dlock__now_ms();
    int64_t ms = (oldest < until ? oldest : until) - now;
    redisContext *ctx = rc->ctx;
    int tls = dlock__rio_is_tls(ctx);
    char buf[READ_CHUNK];
    ssize_t r = -1;
    int err = EAGAIN;

    if (ms < 1)
        ms = 1;
    if (!tls &&
        (rc->rcvtimeo < ms * 9 / 10 || rc->rcvtimeo > ms * 11 / 10)) {
        struct timeval tv = tv_ms(ms);
        setsockopt(ctx->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        rc->rcvtimeo = ms;
    }
    rc->reading = 1;
    if (tls) {
        int w = wait_readable(rc, ctx, ms);
        if (w < 0)
            err = errno;
        if (w > 0 && !rc->dead) {
            rc->reading = 0;
            if (dlock__rio_fill(ctx) == REDIS_OK) {
                dispatch_all(rc, ctx);
                return;
            }
            if (ctx->err == REDIS_ERR_EOF)
                conn_fail(rc, DLOCK_ECONN,
                          "%s: the server closed the connection",
                          rc->t.where);
            else
                conn_fail(rc, DLOCK_ECONN, "%s: %s", rc->t.where,
                          ctx->errstr);
            return;
        }
    } else {
        pthread_mutex_unlock(&rc->mu);
        r = dlock__rio_read(ctx, buf, sizeof(buf));
        err = errno;
        pthread_mutex_lock(&rc->mu);
    }
    rc->reading = 0;

    if (rc->dead) { /* failed by a writer meanwhile */
        dlock__rio_free(rc->ctx);
        rc->ctx = NULL;
        rc->dead = 0;
        pthread_cond_broadcast(&rc->idle_cv);
        return;
    }
    if (r > 0) {
        if (redisReaderFeed(ctx->reader, buf, (size_t)r) != REDIS_OK) {
            conn_fail(rc, DLOCK_ENOMEM, "%s: out of memory", rc->t.where);
            return;
        }
        dispatch_all(rc, ctx);
    } else if (r == 0) {
        conn_fail(rc, DLOCK_ECONN, "%s: the server closed the connection",
                  rc->t.where);
    } else if (err == EAGAIN || err == EWOULDBLOCK) {
        if (rc->head && dlock__now_ms() >= oldest)
            conn_fail(rc, DLOCK_ECONN, "%s: no answer within %lld ms",
                      rc->t.where, (long long)rc->t.cfg->timeout_ms);
    } else {
        conn_fail(rc, DLOCK_ECONN, "%s: %s", rc->t.where, strerror(err));
    }
}

/* Writes buf[0..len) on the socket, without SIGPIPE (mu held). A TLS
 * socket is non-blocking: a full one is waited for (POLLOUT, or POLLIN
 * when OpenSSL must read first), the client's timeout at most. */
static int write_all(dlock__rconn *rc, const char *buf, size_t len)
{
    int64_t until = dlock__now_ms() + rc->t.cfg->timeout_ms;
    redisContext *ctx = rc->ctx;

    if (dlock__rio_is_tls(ctx)) {
        /* through hiredis' output buffer, which dlock__rio_send drains */
        sds grown = sdscatlen(ctx->obuf, buf, len);
        int s;
        if (!grown) {
            conn_fail(rc, DLOCK_ENOMEM, "%s: out of memory", rc->t.where);
            return -1;
        }
        ctx->obuf = grown;
        while ((s = dlock__rio_send(ctx)) == 0) {
            int64_t left = until - dlock__now_ms();
            struct pollfd p = {ctx->fd, dlock__rio_wants(ctx), 0};
            if (left <= 0 || poll(&p, 1, (int)left) == 0) {
                conn_fail(rc, DLOCK_ECONN, "%s: no answer within %lld ms",
                          rc->t.where, (long long)rc->t.cfg->timeout_ms);
                return -1;
            }
        }
        if (s < 0) {
            conn_fail(rc, DLOCK_ECONN, "%s: %s", rc->t.where,
                      strerror(errno));
            return -1;
        }
        return 0;
    }
    while (len > 0) {
        ssize_t w = send(ctx->fd, buf, len, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK)
                conn_fail(rc, DLOCK_ECONN, "%s: no answer within %lld ms",
                          rc->t.where, (long long)rc->t.cfg->timeout_ms);
            else
                conn_fail(rc, DLOCK_ECONN, "%s: %s", rc->t.where,
                          strerror(e));
            return -1;
        }
        buf += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Has the primary moved since ctx was connected? Asks the sentinels
 * first when the topology forgot it (its watch broke, a server said it
 * is not the primary): a command is never sent to a primary the client
 * has stopped being sure of (mu held). */
static int moved_on(dlock__rconn *rc, int64_t deadline)
{
    if (!dlock__rtopo_known(rc->t.topo)) {
        char host[256];
        int port;
        uint64_t gen;
        (void)dlock__rtopo_primary(rc->t.topo, host, &port, &gen, deadline);
    }
    return rc->gen < dlock__rtopo_gen(rc->t.topo);
}

/* Writes one call and waits for its replies (see redis_conn.h). */
static int call(dlock__rconn *rc, const char *buf, size_t len, int n,
                redisReply **replies, int64_t deadline)
{
    pend *p = calloc(1, sizeof(*p));
    int code;

    if (!p)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    code = dlock__cond_init(&p->cv);
    if (code) {
        free(p);
        return code;
    }
    p->replies = replies;
    p->n = n;

    pthread_mutex_lock(&rc->mu);
    for (;;) {
        while (rc->dead) /* a broken socket its reader has not freed yet */
            pthread_cond_wait(&rc->idle_cv, &rc->mu);
        if (!rc->t.topo || !rc->ctx || !moved_on(rc, deadline))
            break;
        conn_fail(rc, DLOCK_ECONN, "%s: failover: the primary changed",
                  rc->t.where);
    }
    int64_t now = dlock__now_ms();
    if (rc->ctx && !rc->head && now - rc->used >= STALE_CHECK_MS &&
        dlock__rio_stale(rc->ctx)) {
        dlock__rio_free(rc->ctx);
        rc->ctx = NULL;
    }
    if (!rc->ctx) {
        code = dlock__rconn_connect(&rc->t, 1, rc->sha, deadline, &rc->ctx,
                                    &rc->gen);
        if (code) {
            pthread_mutex_unlock(&rc->mu);
            pend_free(p);
            return code;
        }
        if (dlock__rio_is_tls(rc->ctx))
            (void)dlock__rio_nonblocking(rc->ctx); /* see read_once() */
        rc->rcvtimeo = budget(&rc->t, deadline);
        now = dlock__now_ms();
    }
    p->sent = now;
    rc->used = now;
    if (rc->tail)
        rc->tail->next = p;
    else
        rc->head = p;
    rc->tail = p;
    /* at least MIN_IO_MS after sending, at most the client timeout */
    int64_t until = deadline;
    if (until > p->sent + rc->t.cfg->timeout_ms)
        until = p->sent + rc->t.cfg->timeout_ms;
    if (until < p->sent + MIN_IO_MS)
        until = p->sent + MIN_IO_MS;
    (void)write_all(rc, buf, len); /* a failure fails the call */
    while (!p->done) {
        if (dlock__now_ms() >= until) {
            /* give up; the replies are dropped when they come */
            for (int i = 0; i < p->got; i++)
                freeReplyObject(p->replies[i]);
            p->abandoned = 1;
            pass_reading(rc);
            pthread_mutex_unlock(&rc->mu);
            return dlock__err(DLOCK_ECONN, "%s: no answer within %lld ms",
                              rc->t.where, (long long)(until - p->sent));
        }
        if (!rc->reading)
            read_once(rc, until);
        else
            dlock__cond_wait_until(&p->cv, &rc->mu, until);
    }
    pass_reading(rc);
    code = p->rc;
    pthread_mutex_unlock(&rc->mu);
    if (code)
        dlock__err(code, "%s", p->msg);
    pend_free(p);
    return code;
}

/* The RESP bytes of cmds[0..n), SHAs filled in; malloc'd. */
static char *format(dlock__rconn *rc, rcmd *cmds, int n, size_t *len)
{
    dlock__buf all = DLOCK__BUF_INIT;

    for (int i = 0; i < n; i++) {
        const char **argv = cmds[i].ext_argv ? cmds[i].ext_argv
                                             : cmds[i].argv;
        size_t *lens = cmds[i].ext_lens ? cmds[i].ext_lens : cmds[i].lens;
        char *one = NULL;
        if (cmds[i].script >= 0) {
            argv[1] = rc->sha[cmds[i].script];
            lens[1] = 40;
        }
        int l = redisFormatCommandArgv(&one, cmds[i].argc, argv, lens);
        if (l < 0 || !one) {
            dlock__buf_free(&all);
            return NULL;
        }
        if (n == 1) {
            *len = (size_t)l;
            return one;
        }
        int bad = dlock__buf_add(&all, one, (size_t)l) != 0;
        free(one);
        if (bad) {
            dlock__buf_free(&all);
            return NULL;
        }
    }
    *len = all.len;
    return all.p;
}

void dlock__rconn_drop_older(dlock__rconn *rc, uint64_t gen)
{
    pthread_mutex_lock(&rc->mu);
    if (rc->ctx && !rc->dead && rc->gen < gen)
        conn_fail(rc, DLOCK_ECONN, "%s: failover: the primary changed",
                  rc->t.where);
    pthread_mutex_unlock(&rc->mu);
}

/* A server of generation gen answered READONLY: it is a replica now.
 * Leave its connection (if still that one) and ask for the primary. */
static void demoted(dlock__rconn *rc, uint64_t gen)
{
    dlock__rtopo_not_primary(rc->t.topo, gen);
    pthread_mutex_lock(&rc->mu);
    if (rc->ctx && !rc->dead && rc->gen == gen)
        conn_fail(rc, DLOCK_ECONN, "%s: the server became a replica",
                  rc->t.where);
    pthread_mutex_unlock(&rc->mu);
}

int dlock__rconn_run(dlock__rconn *rc, rcmd *cmds, int n,
                     redisReply **replies, int64_t deadline)
{
    int readonly_left = rc->t.topo ? 1 : 0;

    for (int attempt = 0; attempt < 2; attempt++) {
        size_t len = 0;
        char *buf = format(rc, cmds, n, &len);
        int code, noscript = 0, readonly = 0;
        uint64_t gen;

        if (!buf)
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        code = call(rc, buf, len, n, replies, deadline);
        free(buf);
        if (code)
            return code;
        /* the connection that answered, unless replaced meanwhile */
        pthread_mutex_lock(&rc->mu);
        gen = rc->gen;
        pthread_mutex_unlock(&rc->mu);
        for (int i = 0; i < n; i++) {
            if (replies[i]->type != REDIS_REPLY_ERROR)
                continue;
            if (!strncmp(replies[i]->str, "NOSCRIPT", 8))
                noscript = 1;
            else if (!strncmp(replies[i]->str, "READONLY", 8))
                readonly = 1;
        }
        if (readonly && readonly_left) {
            /* nothing ran on a replica: send it all to the primary */
            for (int i = 0; i < n; i++)
                freeReplyObject(replies[i]);
            demoted(rc, gen);
            readonly_left = 0;
            attempt--;
            continue;
        }
        if (!noscript)
            return DLOCK_OK;
        for (int i = 0; i < n; i++)
            freeReplyObject(replies[i]);

        /* the scripts were flushed: load them again (the SHAs are those
         * of the same texts), then run the call once more */
        rcmd load[MAX_SCRIPTS];
        redisReply *lr[MAX_SCRIPTS];
        for (int i = 0; i < rc->t.nscripts; i++) {
            rcmd_plain(&load[i]);
            rcmd_str(&load[i], "SCRIPT");
            rcmd_str(&load[i], "LOAD");
            rcmd_str(&load[i], rc->t.scripts[i]);
        }
        buf = format(rc, load, rc->t.nscripts, &len);
        if (!buf)
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        code = call(rc, buf, len, rc->t.nscripts, lr, deadline);
        free(buf);
        if (code)
            return code;
        for (int i = 0; i < rc->t.nscripts; i++) {
            if (lr[i]->type == REDIS_REPLY_ERROR && code == DLOCK_OK)
                code = dlock__redis_server_error(rc->t.where,
                                                 rc->t.cfg->password,
                                                 lr[i]->str, NULL);
            freeReplyObject(lr[i]);
        }
        if (code)
            return code;
    }
    return dlock__err(DLOCK_EPROTO,
                      "%s: the server keeps forgetting dlock's scripts",
                      rc->t.where);
}

/* ------------------------------------------------------------------------ */
/* Open and free                                                            */
/* ------------------------------------------------------------------------ */

int dlock__rconn_new(dlock__rconn **out, const dlock__rconn_target *t)
{
    dlock__rconn *rc;
    int code;

    *out = NULL;
    if (t->nscripts > MAX_SCRIPTS)
        return dlock__err(DLOCK_EINVAL, "too many scripts");
    rc = calloc(1, sizeof(*rc));
    if (!rc)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    rc->t = *t;
    pthread_mutex_init(&rc->mu, NULL);
    code = dlock__cond_init(&rc->idle_cv);
    if (code) {
        pthread_mutex_destroy(&rc->mu);
        free(rc);
        return code;
    }
    *out = rc;
    return DLOCK_OK;
}

int dlock__rconn_open(dlock__rconn **out, const dlock__rconn_target *t,
                      int64_t deadline)
{
    dlock__rconn *rc;
    int code = dlock__rconn_new(&rc, t);

    if (code)
        return code;
    code = dlock__rconn_connect(&rc->t, 1, rc->sha, deadline, &rc->ctx,
                                &rc->gen);
    if (code) {
        dlock__rconn_free(rc);
        return code;
    }
    if (dlock__rio_is_tls(rc->ctx))
        (void)dlock__rio_nonblocking(rc->ctx); /* see read_once() */
    rc->rcvtimeo = budget(t, deadline);
    rc->used = dlock__now_ms();
    *out = rc;
    return DLOCK_OK;
}

void dlock__rconn_free(dlock__rconn *rc)
{
    if (!rc)
        return;
    while (rc->head) { /* abandoned calls whose replies never came */
        pend *p = rc->head;
        rc->head = p->next;
        pend_free(p);
    }
    if (rc->ctx)
        dlock__rio_free(rc->ctx);
    pthread_cond_destroy(&rc->idle_cv);
    pthread_mutex_destroy(&rc->mu);
    free(rc);
}
