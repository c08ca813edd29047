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

#define SENTINEL_PORT 26379
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
    /* one per sentinel, subscribed to +switch-master and +promoted-slave
     * (non-blocking; NULL: not connected) */
    redisContext **watch;
    size_t nwatch; /* how many are */
    size_t next; /* the sentinel to try first */
};

static int64_t topo_budget(const dlock__rtopo *t, int64_t deadline)
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

static void watch_drop(dlock__rtopo *t, size_t i)
{
    if (!t->watch[i])
        return;
    epoll_ctl(t->epfd, EPOLL_CTL_DEL, t->watch[i]->fd, NULL);
    dlock__rio_free(t->watch[i]);
    t->watch[i] = NULL;
    t->nwatch--;
}

/* One message of a watch connection (mu held). Either moves the primary
 * of our master:
 *   +switch-master MASTER OLDIP OLDPORT NEWIP NEWPORT  (every sentinel,
 *       once the failover is over)
 *   +promoted-slave slave IP:PORT IP PORT @ MASTER MIP MPORT  (the
 *       sentinel that leads the failover, as soon as the replica it
 *       promoted says it is a primary: earlier, often by seconds, since
 *       the switch waits for the other replicas to follow) */
static void watch_reply(dlock__rtopo *t, const redisReply *r)
{
    char master[MASTER_MAX + 1], a[HOST_MAX], b[HOST_MAX], kind[16];
    int p1, p2;

    if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[0]->type != REDIS_REPLY_STRING ||
        strcmp(r->element[0]->str, "message") != 0 ||
        r->element[1]->type != REDIS_REPLY_STRING ||
        r->element[2]->type != REDIS_REPLY_STRING)
        return;
    const char *ch = r->element[1]->str, *m = r->element[2]->str;
    if (!strcmp(ch, "+switch-master")) {
        if (sscanf(m, "%128s %255s %d %255s %d", master, a, &p1, b, &p2) ==
                5 &&
            !strcmp(master, t->master) && p2 > 0 && p2 < 65536)
            moved(t, b, p2);
    } else if (!strcmp(ch, "+promoted-slave")) {
        char at[4];
        if (sscanf(m, "%15s %*s %255s %d %3s %128s", kind, a, &p1, at,
                   master) == 5 &&
            !strcmp(kind, "slave") && !strcmp(at, "@") &&
            !strcmp(master, t->master) && p1 > 0 && p1 < 65536)
            moved(t, a, p1);
    }
}

/* Connects to sentinel i within ms (blocking; TLS as the store's). */
static redisContext *sentinel_connect(const dlock__rtopo *t, size_t i,
                                      int64_t ms, char *err, size_t cap)
{
    redisContext *ctx;
    char why[256];
    int rc = dlock__rio_connect(t->cfg->tls, t->host[i], t->port[i], NULL,
                                ms < 10 ? 10 : ms, &ctx, why, sizeof(why));

    if (rc == DLOCK_ENOMEM) {
        snprintf(err, cap, "%s:%d: out of memory", t->host[i], t->port[i]);
        return NULL;
    }
    if (rc) {
        snprintf(err, cap, "%s:%d: %.200s", t->host[i], t->port[i], why);
        return NULL;
    }
    return ctx;
}

/* Subscribes a connection to sentinel i to the moves of a primary and
 * waits for the confirmation, so that a move after this moment is heard
 * (mu held). 0, or -1 with err set. */
static int watch_open(dlock__rtopo *t, size_t i, int64_t ms, char *err,
                      size_t cap)
{
    redisContext *ctx = sentinel_connect(t, i, ms, err, cap);
    redisReply *r = NULL;
    struct epoll_event ev;
    int ok = 1;

    if (!ctx)
        return -1;
    redisAppendCommand(ctx, "SUBSCRIBE +switch-master +promoted-slave");
    for (int k = 0; k < 2 && ok; k++) {
        if (dlock__rio_get_reply(ctx, (void **)&r) != REDIS_OK || !r ||
            r->type != REDIS_REPLY_ARRAY) {
            snprintf(err, cap, "%s:%d: %s", t->host[i], t->port[i],
                     r && r->type == REDIS_REPLY_ERROR ? r->str
                     : ctx->err                        ? ctx->errstr
                                                       : "SUBSCRIBE refused");
            ok = 0;
        }
        if (r)
            freeReplyObject(r);
        r = NULL;
    }
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN;
    ev.data.ptr = t;
    if (ok && (dlock__rio_nonblocking(ctx) != 0 ||
               epoll_ctl(t->epfd, EPOLL_CTL_ADD, ctx->fd, &ev) < 0)) {
        snprintf(err, cap, "%s:%d: %s", t->host[i], t->port[i],
                 strerror(errno));
        ok = 0;
    }
    if (!ok) {
        dlock__rio_free(ctx);
        return -1;
    }
    ctx->flags &= ~REDIS_BLOCK;
    t->watch[i] = ctx;
    t->nwatch++;
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
    redisAppendCommand(ctx, "SENTINEL get-master-addr-by-name %s",
                       t->master);
    if (dlock__rio_get_reply(ctx, (void **)&r) != REDIS_OK)
        r = NULL;
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
    dlock__rio_free(ctx);
    return rc;
}

/* Appends "; " and msg to errs[0..cap) at *o. */
static void add_err(char *errs, size_t cap, size_t *o, const char *msg)
{
    int w = snprintf(errs + *o, cap - *o, "%s%s", *o ? "; " : "", msg);

    if (w > 0 && *o + (size_t)w < cap)
        *o += (size_t)w;
}

/* Subscribes to every sentinel when no subscription is left (a move is
 * announced first by the one sentinel that leads the failover), then
 * asks the sentinels in turn, starting with the one that last answered
 * (mu held). */
static int ask(dlock__rtopo *t, int64_t deadline)
{
    char errs[1024] = "", err[256], host[HOST_MAX];
    size_t o = 0;
    int port;

    if (t->nwatch == 0) {
        for (size_t i = 0; i < t->n && topo_budget(t, deadline) > 0; i++) {
            err[0] = '\0';
            if (!t->watch[i] &&
                watch_open(t, i, topo_budget(t, deadline), err, sizeof(err)) != 0)
                add_err(errs, sizeof(errs), &o, err);
        }
        if (t->nwatch == 0)
            return dlock__err(DLOCK_ECONN,
                              "%s: no sentinel takes a subscription%s%s",
                              t->where, o ? ": " : " in time", errs);
        o = 0;
        errs[0] = '\0';
    }
    for (size_t k = 0; k < t->n; k++) {
        size_t i = (t->next + k) % t->n;
        int64_t ms = topo_budget(t, deadline);
        if (ms <= 0)
            break;
        err[0] = '\0';
        if (ask_one(t, i, ms, host, &port, err, sizeof(err)) == 0) {
            t->next = i;
            moved(t, host, port);
            return DLOCK_OK;
        }
        add_err(errs, sizeof(errs), &o, err);
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

int dlock__rtopo_known(dlock__rtopo *t)
{
    pthread_mutex_lock(&t->mu);
    int k = t->known;
    pthread_mutex_unlock(&t->mu);
    return k;
}

uint64_t dlock__rtopo_gen(dlock__rtopo *t)
{
    return __atomic_load_n(&t->gen, __ATOMIC_SEQ_CST);
}

uint64_t dlock__rtopo_read(dlock__rtopo *t)
{
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->n; i++) {
        redisContext *w = t->watch[i];
        if (!w)
            continue;
        if (dlock__rio_fill(w) != REDIS_OK) {
            watch_drop(t, i);
            continue;
        }
        redisReply *r = NULL;
        while (redisGetReplyFromReader(w, (void **)&r) == REDIS_OK && r) {
            watch_reply(t, r);
            freeReplyObject(r);
            r = NULL;
        }
        if (w->err)
            watch_drop(t, i);
    }
    if (t->nwatch == 0) /* the next ask subscribes again, and asks */
        t->known = 0;
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
    for (size_t i = 0; i < t->n; i++) {
        if (t->watch)
            watch_drop(t, i);
        free(t->host[i]);
    }
    free(t->watch);
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
    t->watch = calloc(u->nhosts, sizeof(*t->watch));
    if (!t->host || !t->port || !t->watch) {
        dlock__rtopo_free(t);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < u->nhosts; i++, t->n++) {
        if (!(t->host[i] = strdup(u->hosts[i].host))) {
            dlock__rtopo_free(t);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
        t->port[i] = u->hosts[i].port ? u->hosts[i].port : SENTINEL_PORT;
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
