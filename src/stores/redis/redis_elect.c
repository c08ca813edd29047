/* SPDX-License-Identifier: MIT */
/*
 * redis_elect.c -- leader election's watch and ring on Redis (redis://,
 * unix://, redis-sentinel://, redis-cluster://; docs/design.md, "Leader
 * election"). The proclaim, a script like the others, is in redis.c.
 *
 * The election channel of lock NAME is its key with an "e" after it,
 * P{NAME}e: in the lock's own slot, so that a cluster's SPUBLISH stays
 * in the slot's shard. A campaign that won, a proclaim and a resign
 * PUBLISH (a cluster: SPUBLISH) "c" on it. An observer has a subscriber
 * connection of its own (it lives as long as the observer, which waits
 * on nothing else): SUBSCRIBE (SSUBSCRIBE on the slot's primary) and its
 * confirmation before the watch is open, then a wait in poll() on the
 * socket and the observer's cancel descriptor. Every message is only a
 * wake-up (whoever may publish there can send one): the observer reads
 * the key. An end of the subscription (the slot moved, the node was
 * demoted) or of the connection breaks the watch; the observer opens
 * another and reads.
 */
#include "redis_int.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

typedef struct rwatch {
    redisContext *ctx;
    char chan[KEY_MAX + 4];
    size_t len;
} rwatch;

/* P{NAME}e into out (KEY_MAX + 4 bytes); its length. The lock's key
 * (P{NAME}) is out[0..*kl). */
static size_t elect_chan(const redis_store *rs, const char *name, size_t len,
                         char *out, size_t *kl)
{
    *kl = lock_key(rs, name, len, out);
    out[*kl] = 'e';
    out[*kl + 1] = '\0';
    return *kl + 1;
}

int dlock__redis_ring(void *st, const char *name, size_t len,
                      int64_t deadline)
{
    redis_store *rs = st;
    char chan[KEY_MAX + 4];
    size_t kl, cl = elect_chan(rs, name, len, chan, &kl);
    redisReply *r = NULL;
    rcmd c;
    int rc;

    rcmd_plain(&c);
    rcmd_str(&c, rs->cluster ? "SPUBLISH" : "PUBLISH");
    rcmd_arg(&c, chan, cl);
    rcmd_str(&c, "c");
    rc = dlock__redis_run(rs, chan, kl, &c, 1, &r, deadline);
    if (rc == DLOCK_OK && r->type == REDIS_REPLY_ERROR)
        rc = server_error(rs, r->str, name);
    if (r)
        freeReplyObject(r);
    return rc;
}

int dlock__redis_watch_open(void *st, const char *name, size_t len,
                            void **out, int64_t deadline)
{
    redis_store *rs = st;
    const dlock__rconn_target *t = &rs->target;
    rwatch *w;
    redisReply *r = NULL;
    size_t kl;
    int rc;

    *out = NULL;
    if (!(w = calloc(1, sizeof(*w))))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    w->len = elect_chan(rs, name, len, w->chan, &kl);
    if (rs->cluster) {
        int id;
        rc = dlock__rcluster_owner(rs->cluster,
                                   dlock__rcluster_slot(w->chan, kl), &id,
                                   &t, deadline);
        if (rc) {
            free(w);
            return rc;
        }
    }
    rc = dlock__rconn_connect(t, 0, NULL, deadline, &w->ctx, NULL);
    if (rc) {
        free(w);
        return rc;
    }
    const char *argv[2] = {rs->cluster ? "SSUBSCRIBE" : "SUBSCRIBE",
                           w->chan};
    size_t lens[2] = {strlen(argv[0]), w->len};
    redisAppendCommandArgv(w->ctx, 2, argv, lens);
    /* the socket's timeouts (the connect's deadline) bound the answer */
    if (dlock__rio_get_reply(w->ctx, (void **)&r) != REDIS_OK || !r) {
        rc = dlock__redis_io_failure(rs->where, w->ctx, rs->cfg.timeout_ms);
    } else if (r->type == REDIS_REPLY_ERROR) {
        /* a cluster's MOVED: the map is asked again by the next open */
        if (rs->cluster)
            dlock__rcluster_moved(rs->cluster, r->str);
        rc = server_error(rs, r->str, name);
    } else {
        const char *kind = rpush_kind(r);
        rc = kind && strstr(kind, "subscribe") &&
                     r->element[1]->len == w->len &&
                     !memcmp(r->element[1]->str, w->chan, w->len)
                 ? DLOCK_OK
                 : dlock__err(DLOCK_EPROTO,
                              "%s: unexpected answer to SUBSCRIBE",
                              rs->where);
    }
    if (r)
        freeReplyObject(r);
    if (rc == DLOCK_OK && dlock__rio_nonblocking(w->ctx) != 0)
        rc = dlock__err(DLOCK_ECONN, "%s: %s", rs->where, strerror(errno));
    if (rc) {
        dlock__rio_free(w->ctx);
        free(w);
        return rc;
    }
    w->ctx->flags &= ~REDIS_BLOCK;
    *out = w;
    return DLOCK_OK;
}

/* The replies read so far: 1 when a message came on the channel, 0 when
 * none, -1 when the subscription or the connection ended. */
static int drain(const redis_store *rs, rwatch *w)
{
    redisReply *r = NULL;
    int got = 0;

    (void)rs;
    while (redisGetReplyFromReader(w->ctx, (void **)&r) == REDIS_OK && r) {
        const char *kind = rpush_kind(r);
        if (kind && strstr(kind, "unsubscribe"))
            got = -1;
        else if (kind && strstr(kind, "message") && got == 0)
            got = 1;
        freeReplyObject(r);
        r = NULL;
    }
    return w->ctx->err ? -1 : got;
}

int dlock__redis_watch_wait(void *st, void *wp, int64_t deadline,
                            int cancel_fd)
{
    redis_store *rs = st;
    rwatch *w = wp;

    for (;;) {
        int got = drain(rs, w);
        if (got < 0)
            return dlock__err(DLOCK_ECONN,
                              "%s: the election's subscription ended",
                              rs->where);
        if (got)
            return DLOCK_OK;
        if (dlock__rio_pending(w->ctx) > 0) {
            if (dlock__rio_fill(w->ctx) != REDIS_OK)
                return dlock__redis_io_failure(rs->where, w->ctx, rs->cfg.timeout_ms);
            continue;
        }
        int64_t now = dlock__now_ms();
        if (now >= deadline)
            return DLOCK_EBUSY;
        int64_t left = deadline - now;
        struct pollfd p[2] = {{w->ctx->fd, POLLIN, 0},
                              {cancel_fd, POLLIN, 0}};
        int n = poll(p, cancel_fd >= 0 ? 2 : 1,
                     left > INT_MAX ? INT_MAX : (int)left);
        if (n < 0 && errno != EINTR)
            return dlock__err(DLOCK_ECONN, "%s: poll: %s", rs->where,
                              strerror(errno));
        if (n > 0 && cancel_fd >= 0 && (p[1].revents & POLLIN))
            return DLOCK_EBUSY;
        if (n > 0 && p[0].revents) {
            if (dlock__rio_fill(w->ctx) != REDIS_OK)
                return dlock__redis_io_failure(rs->where, w->ctx, rs->cfg.timeout_ms);
        }
    }
}

void dlock__redis_watch_close(void *st, void *wp)
{
    rwatch *w = wp;

    (void)st;
    if (!w)
        return;
    dlock__rio_free(w->ctx);
    free(w);
}
