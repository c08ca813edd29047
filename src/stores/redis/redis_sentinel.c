/* SPDX-License-Identifier: MIT */
/*
 * redis_sentinel.c -- the primary of a Sentinel-managed Redis and its
 * moves (see redis_sentinel.h; the protocol in docs/design.md, "Redis
 * beyond one server: Sentinel").
 */
#include "redis_sentinel.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/time.h>

#define DEFAULT_PORT 26379
#define MASTER_MAX 128
#define HOST_MAX 256

struct dlock__rtopo {
    dlock_client *client;
    const dlock__redis_config *cfg;
    size_t n; /* sentinels */
    char **host;
    int *port;
    char master[MASTER_MAX + 1];
    char where[MASTER_MAX + 32];
    int epfd;

    pthread_mutex_t mu;
    char phost[HOST_MAX]; /* the primary, when known */
    int pport;
    int known;
    int ever;      /* an address was ever known (the first is gen 1) */
    uint64_t gen;
    redisContext *watch; /* subscribed to +switch-master (non-blocking) */
    size_t next; /* the sentinel to try first */
};

static struct timeval tv_ms(int64_t ms)
{
    struct timeval tv;

    if (ms < 10)
        ms = 10;
    tv.tv_sec = (time_t)(ms / 1000);
    tv.tv_usec = (suseconds_t)((ms % 1000) * 1000);
    return tv;
}

static int64_t budget(const dlock__rtopo *t, int64_t deadline)
{
    int64_t ms = deadline - dlock__now_ms();

    return ms > t->cfg->timeout_ms ? t->cfg->timeout_ms : ms;
}

/* The primary moved to host:port (mu held): a new generation. */
static void moved(dlock__rtopo *t, const char *host, int port)
{
    int same = t->ever && t->pport == port && !strcmp(t->phost, host);

    snprintf(t->phost, sizeof(t->phost), "%s", host);
    t->pport = port;
    t->known = 1;
    if (!t->ever) {
        t->ever = 1;
        return;
    }
    if (!same) {
        __atomic_add_fetch(&t->gen, 1, __ATOMIC_SEQ_CST);
        dlock__loop_wake(t->client);
    }
}

static void watch_drop(dlock__rtopo *t)
{
    if (!t->watch)
        return;
    epoll_ctl(t->epfd, EPOLL_CTL_DEL, t->watch->fd, NULL);
    redisFree(t->watch);
    t->watch = NULL;
}

/* One message of the watch connection (mu held): "+switch-master MASTER
 * OLDIP OLDPORT NEWIP NEWPORT" of our master moves the primary. */
static void watch_reply(dlock__rtopo *t, const redisReply *r)
{
    char master[MASTER_MAX + 1], oh[HOST_MAX], nh[HOST_MAX];
    int op, np;

    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[0]->type != REDIS_REPLY_STRING ||
        strcmp(r->element[0]->str, "message") != 0 ||
        r->element[2]->type != REDIS_REPLY_STRING)
        return;
    if (sscanf(r->element[2]->str, "%128s %255s %d %255s %d", master, oh, &op,
               nh, &np) == 5 &&
        !strcmp(master, t->master) && np > 0 && np < 65536)
        moved(t, nh, np);
}

/* Connects to sentinel i within ms (blocking). */
static redisContext *sentinel_connect(const dlock__rtopo *t, size_t i,
                                      int64_t ms, char *err, size_t cap)
{
    redisContext *ctx = redisConnectWithTimeout(t->host[i], t->port[i],
                                                tv_ms(ms));

    if (!ctx) {
        snprintf(err, cap, "%s:%d: out of memory", t->host[i], t->port[i]);
        return NULL;
    }
    if (ctx->err) {
        snprintf(err, cap, "%s:%d: %s", t->host[i], t->port[i], ctx->errstr);
        redisFree(ctx);
        return NULL;
    }
    redisSetTimeout(ctx, tv_ms(ms));
    return ctx;
}

/* Subscribes a connection to sentinel i to +switch-master and waits for
 * the confirmation, so that a switch after this moment is heard (mu
 * held). 0, or -1 with err set. */
static int watch_open(dlock__rtopo *t, size_t i, int64_t ms, char *err,
                      size_t cap)
{
    redisContext *ctx = sentinel_connect(t, i, ms, err, cap);
    redisReply *r = NULL;
    struct epoll_event ev;

    if (!ctx)
        return -1;
    r = redisCommand(ctx, "SUBSCRIBE +switch-master");
    if (!r || r->type != REDIS_REPLY_ARRAY) {
        snprintf(err, cap, "%s:%d: %s", t->host[i], t->port[i],
                 r && r->type == REDIS_REPLY_ERROR ? r->str
                 : ctx->err                        ? ctx->errstr
                                                   : "SUBSCRIBE refused");
        if (r)
            freeReplyObject(r);
        redisFree(ctx);
        return -1;
    }
    freeReplyObject(r);
    int fl = fcntl(ctx->fd, F_GETFL);
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.ptr = t;
    if (fl < 0 || fcntl(ctx->fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
        epoll_ctl(t->epfd, EPOLL_CTL_ADD, ctx->fd, &ev) < 0) {
        snprintf(err, cap, "%s:%d: %s", t->host[i], t->port[i],
                 strerror(errno));
        redisFree(ctx);
        return -1;
    }
    ctx->flags &= ~REDIS_BLOCK;
    t->watch = ctx;
    return 0;
}

/* Asks sentinel i where the master is. 0 with host/port, -1 with err. */
static int ask_one(const dlock__rtopo *t, size_t i, int64_t ms, char *host,
                   int *port, char *err, size_t cap)
{
    redisContext *ctx = sentinel_connect(t, i, ms, err, cap);
    redisReply *r;
    int rc = -1;

    if (!ctx)
        return -1;
    r = redisCommand(ctx, "SENTINEL get-master-addr-by-name %s", t->master);
    if (!r) {
        snprintf(err, cap, "%s:%d: %s", t->host[i], t->port[i],
                 ctx->err ? ctx->errstr : "no answer");
    } else if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
               r->element[0]->type == REDIS_REPLY_STRING &&
               r->element[1]->type == REDIS_REPLY_STRING &&
               r->element[0]->len < HOST_MAX && atoi(r->element[1]->str) > 0 &&
               atoi(r->element[1]->str) < 65536) {
        memcpy(host, r->element[0]->str, r->element[0]->len + 1);
        *port = atoi(r->element[1]->str);
        rc = 0;
    } else if (r->type == REDIS_REPLY_ERROR) {
        snprintf(err, cap, "%s:%d: %s", t->host[i], t->port[i], r->str);
    } else {
        snprintf(err, cap, "%s:%d: does not know master '%s'", t->host[i],
                 t->port[i], t->master);
    }
    if (r)
        freeReplyObject(r);
    redisFree(ctx);
    return rc;
}

/* Subscribes (if not yet), then asks the sentinels in turn, starting
 * with the one that last answered (mu held). */
static int ask(dlock__rtopo *t, int64_t deadline)
{
    char errs[1024] = "", err[256], host[HOST_MAX];
    size_t o = 0;
    int port;

    for (size_t k = 0; k < t->n; k++) {
        size_t i = (t->next + k) % t->n;
        int64_t ms = budget(t, deadline);
        if (ms <= 0)
            break;
        err[0] = '\0';
        if ((t->watch || watch_open(t, i, ms, err, sizeof(err)) == 0) &&
            ask_one(t, i, budget(t, deadline), host, &port, err,
                    sizeof(err)) == 0) {
            t->next = i;
            moved(t, host, port);
            return DLOCK_OK;
        }
        int w = snprintf(errs + o, sizeof(errs) - o, "%s%s", o ? "; " : "",
                         err);
        if (w > 0 && o + (size_t)w < sizeof(errs))
            o += (size_t)w;
    }
    return dlock__err(DLOCK_ECONN, "%s: no sentinel named the primary%s%s",
                      t->where, o ? ": " : " in time", errs);
}

int dlock__rtopo_primary(dlock__rtopo *t, char *host, int *port,
                         uint64_t *gen, int64_t deadline)
{
    int rc = DLOCK_OK;

    pthread_mutex_lock(&t->mu);
    if (!t->known)
        rc = ask(t, deadline);
    if (rc == DLOCK_OK) {
        memcpy(host, t->phost, HOST_MAX);
        *port = t->pport;
        *gen = __atomic_load_n(&t->gen, __ATOMIC_SEQ_CST);
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

void dlock__rtopo_not_primary(dlock__rtopo *t, uint64_t gen)
{
    pthread_mutex_lock(&t->mu);
    if (__atomic_load_n(&t->gen, __ATOMIC_SEQ_CST) == gen)
        t->known = 0;
    pthread_mutex_unlock(&t->mu);
}

uint64_t dlock__rtopo_gen(dlock__rtopo *t)
{
    return __atomic_load_n(&t->gen, __ATOMIC_SEQ_CST);
}

uint64_t dlock__rtopo_read(dlock__rtopo *t)
{
    pthread_mutex_lock(&t->mu);
    if (t->watch) {
        if (redisBufferRead(t->watch) != REDIS_OK) {
            watch_drop(t);
        } else {
            redisReply *r = NULL;
            while (redisGetReplyFromReader(t->watch, (void **)&r) == REDIS_OK &&
                   r) {
                watch_reply(t, r);
                freeReplyObject(r);
                r = NULL;
            }
            if (t->watch->err)
                watch_drop(t);
        }
        if (!t->watch) /* the next ask subscribes again, and asks */
            t->known = 0;
    }
    pthread_mutex_unlock(&t->mu);
    return dlock__rtopo_gen(t);
}

const char *dlock__rtopo_where(const dlock__rtopo *t)
{
    return t->where;
}

void dlock__rtopo_free(dlock__rtopo *t)
{
    if (!t)
        return;
    watch_drop(t);
    for (size_t i = 0; i < t->n; i++)
        free(t->host[i]);
    free(t->host);
    free(t->port);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

int dlock__rtopo_open(dlock__rtopo **out, dlock_client *c,
                      const dlock__uri *u, const dlock__redis_config *cfg,
                      int epfd, int64_t deadline)
{
    dlock__rtopo *t;
    const char *m = u->path[0] == '/' ? u->path + 1 : u->path;
    int rc;

    *out = NULL;
    if (u->nhosts < 1 || !m[0])
        return dlock__err(DLOCK_EINVAL,
                          "redis-sentinel:// needs the sentinels and the "
                          "master's name: redis-sentinel://host:port[,host:"
                          "port...]/MASTER");
    if (strlen(m) > MASTER_MAX || strpbrk(m, " /\t\r\n"))
        return dlock__err(DLOCK_EINVAL,
                          "redis-sentinel://: the master's name must be 1 "
                          "to %d characters without spaces or slashes",
                          MASTER_MAX);
    t = calloc(1, sizeof(*t));
    if (!t)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&t->mu, NULL);
    t->client = c;
    t->cfg = cfg;
    t->epfd = epfd;
    t->gen = 1;
    snprintf(t->master, sizeof(t->master), "%s", m);
    snprintf(t->where, sizeof(t->where), "redis-sentinel %s", t->master);
    t->host = calloc(u->nhosts, sizeof(*t->host));
    t->port = calloc(u->nhosts, sizeof(*t->port));
    if (!t->host || !t->port) {
        dlock__rtopo_free(t);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < u->nhosts; i++, t->n++) {
        if (!(t->host[i] = strdup(u->hosts[i].host))) {
            dlock__rtopo_free(t);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
        t->port[i] = u->hosts[i].port ? u->hosts[i].port : DEFAULT_PORT;
    }
    pthread_mutex_lock(&t->mu);
    rc = ask(t, deadline);
    pthread_mutex_unlock(&t->mu);
    if (rc) {
        dlock__rtopo_free(t);
        return rc;
    }
    *out = t;
    return DLOCK_OK;
}
