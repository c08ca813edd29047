/* SPDX-License-Identifier: MIT */
/*
 * redis_wait.c -- how the Redis store hears of hand-overs, and of a
 * primary that moved: the subscriber connections, the client's loop
 * (loop_fd, loop_run), arm and disarm, and the routing of every command
 * (dlock__redis_run).
 *
 * One server (redis://, unix://, redis-sentinel://): one subscriber
 * connection per client, subscribed to the client's channel Pc:CLIENTID
 * only, once something waits. It is read by a waiting thread (or the
 * client's background thread while nobody waits); the socket is
 * non-blocking so that either may read it.
 *
 * A cluster (redis-cluster://): a release SPUBLISHes on a channel in the
 * lock's own slot, P{NAME}c:CLIENTID, so the message stays in the slot's
 * shard instead of being broadcast to every node. While this client's
 * waiters wait for a lock, that lock's channel is SSUBSCRIBEd (counted:
 * one subscription for every waiter of the client on that lock) on the
 * slot's primary, over one subscriber connection per node, all in one
 * epoll set (the loop_fd). After its last waiter a channel stays
 * subscribed, idle, for the next wait (the 64 most recent ones). A subscription the server ends (the slot left
 * the node: `sunsubscribe`), one answered MOVED, or a connection that
 * breaks makes its waiters re-arm on the slot's owner now and try again
 * (dlock__notify_error). docs/design.md, "Redis Cluster".
 */
#include "redis_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

/* Channels kept subscribed after their last waiter (a cluster): a lock
 * waited for again soon needs no SSUBSCRIBE round trip, as the one
 * server's client channel, which stays. The oldest idle one beyond this
 * is unsubscribed. */
#define CSUB_IDLE_MAX 64

/* A lock's channel, subscribed for the waiters of this client (cluster). */
typedef struct csub {
    struct csub *next;
    char chan[KEY_MAX + 40]; /* P{NAME}c:CLIENTID */
    size_t len;
    unsigned slot;
    int refs;      /* waiting leases counted in it */
    int node;      /* where SSUBSCRIBE went; -1: nowhere (yet) */
    int confirmed; /* the server confirmed it */
    int ended;     /* the server ended it (the slot left the node, or the
                    * node became a replica): ask for the map first */
    uint64_t idle; /* refs 0: when it became idle (a count); kept */
    char failed[200]; /* the server refused it: why */
} csub;

/* A subscriber connection to one node (cluster). */
typedef struct cconn {
    struct cconn *next;
    int node;
    redisContext *ctx;
} cconn;

/* "g SEQ TOKEN" on one of our channels: a release says it handed the
 * lock to waiter SEQ. Only a wake-up of that waiter, whose next try asks
 * the store (a read, redis_confirm.c): anyone allowed to PUBLISH (a
 * cluster: SPUBLISH) on the channel can send this, and may read the key
 * to learn whom to send it to; a replica, or a primary demoted without
 * ending its subscriptions, relays its primary's SPUBLISH, which counted
 * no subscriber of ours and handed the lock to nobody (found by the
 * safety suite after CLUSTER FAILOVER). The token is never used. Any
 * number of messages before the waiter looks cost it one read. */
static void grant_msg(redis_store *rs, const char *msg)
{
    unsigned long long seq, token;
    char g, end;

    if (sscanf(msg, "%c %llu %llu%c", &g, &seq, &token, &end) == 3 &&
        g == 'g' && token > 0)
        dlock__notify_waiter(rs->client, seq);
}

/* A connected socket made non-blocking (both a waiting thread and the
 * background thread may read it; hiredis takes EAGAIN as "nothing yet"
 * once the context is not marked blocking) and added to the epoll set. */
static int nonblocking(redis_store *rs, redisContext *ctx)
{
    if (dlock__rio_nonblocking(ctx) != 0)
        return dlock__err(DLOCK_ECONN, "%s: %s", rs->where, strerror(errno));
    ctx->flags &= ~REDIS_BLOCK;
    if (rs->epfd >= 0) {
        struct epoll_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.events = EPOLLIN;
        if (epoll_ctl(rs->epfd, EPOLL_CTL_ADD, ctx->fd, &ev) < 0)
            return dlock__err(DLOCK_ECONN, "%s: epoll: %s", rs->where,
                              strerror(errno));
    }
    return DLOCK_OK;
}

/* ------------------------------------------------------------------------ */
/* Subscriber connection                                                    */
/* ------------------------------------------------------------------------ */

/* The subscriber connection failed: forget it, and tell the waiters to
 * re-arm (their hand-overs may have been lost). sub_mu held. */
static void sub_lost(redis_store *rs)
{
    if (rs->sub) {
        if (rs->epfd >= 0)
            epoll_ctl(rs->epfd, EPOLL_CTL_DEL, rs->sub->fd, NULL);
        dlock__rio_free(rs->sub);
        rs->sub = NULL;
    }
    rs->subscribed = 0;
    pthread_cond_broadcast(&rs->sub_cv);
    dlock__notify_error(rs->client);
}

/* Makes sure our channel is subscribed, connecting the subscriber if
 * needed. sub_mu held (dropped while connecting). */
static int sub_ensure(redis_store *rs, int64_t deadline)
{
    for (;;) {
        if (rs->sub && rs->subscribed)
            return DLOCK_OK;
        if (dlock__now_ms() >= deadline)
            return dlock__err(DLOCK_ECONN,
                              "%s: no confirmation of SUBSCRIBE in time",
                              rs->where);
        if (!rs->sub && rs->sub_connecting) {
            dlock__cond_wait_until(&rs->sub_cv, &rs->sub_mu, deadline);
            continue;
        }
        if (!rs->sub) {
            redisContext *ctx;
            uint64_t gen = 0;
            int rc;

            rs->sub_connecting = 1;
            pthread_mutex_unlock(&rs->sub_mu);
            rc = dlock__rconn_connect(&rs->target, 0, NULL, deadline, &ctx,
                                      &gen);
            pthread_mutex_lock(&rs->sub_mu);
            rs->sub_connecting = 0;
            pthread_cond_broadcast(&rs->sub_cv);
            if (rc)
                return rc;
            rc = nonblocking(rs, ctx);
            if (rc) {
                dlock__rio_free(ctx);
                return rc;
            }
            rs->sub = ctx;
            rs->sub_gen = gen;
            const char *argv[2] = {"SUBSCRIBE", rs->chan};
            size_t lens[2] = {9, rs->chan_len};
            redisAppendCommandArgv(rs->sub, 2, argv, lens);
            if (dlock__redis_send(rs->sub) != 1) {
                rc = dlock__err(DLOCK_ECONN, "%s: cannot subscribe: %s",
                                rs->where, strerror(errno));
                sub_lost(rs);
                return rc;
            }
        }
        /* the confirmation comes on the fd: make sure it is read (the
         * background thread polls it while no waiting thread does) */
        dlock__loop_wake(rs->client);
        dlock__cond_wait_until(&rs->sub_cv, &rs->sub_mu, deadline);
    }
}

/* One reply on the subscriber connection; sub_mu held. A hand-over's
 * wake-up is a message "g SEQ TOKEN" on our channel; the confirmation of
 * SUBSCRIBE makes waiting possible. Anything else is ignored. */
static void sub_reply(redis_store *rs, const redisReply *r)
{
    const char *kind = rpush_kind(r);

    if (!kind || r->element[1]->len != rs->chan_len ||
        memcmp(r->element[1]->str, rs->chan, rs->chan_len) != 0)
        return;
    if (!strcmp(kind, "message") && r->element[2]->type == REDIS_REPLY_STRING) {
        grant_msg(rs, r->element[2]->str);
    } else if (!strcmp(kind, "subscribe")) {
        rs->subscribed = 1;
        pthread_cond_broadcast(&rs->sub_cv);
    }
}

/* ------------------------------------------------------------------------ */
/* Cluster: a subscription per lock waited for                             */
/* ------------------------------------------------------------------------ */

/* The channel of lease l's lock for this client, P{NAME}c:CLIENTID, into
 * out (KEY_MAX + 40 bytes); its slot into *slot. */
static size_t lease_chan(const redis_store *rs, const dlock__lease *l,
                         char *out, unsigned *slot)
{
    char key[KEY_MAX];
    size_t kl = lock_key(rs, l->name, l->name_len, key);
    size_t n = chan_for(rs, key, kl, out);

    memcpy(out + n, dlock__client_id(rs->client), 33);
    if (slot)
        *slot = dlock__rcluster_slot(key, kl);
    return n + 32;
}

static csub *csub_find(redis_store *rs, const char *chan, size_t len)
{
    for (csub *s = rs->csubs; s; s = s->next)
        if (s->len == len && !memcmp(s->chan, chan, len))
            return s;
    return NULL;
}

static cconn *cconn_find(redis_store *rs, int node)
{
    for (cconn *c = rs->cconns; c; c = c->next)
        if (c->node == node)
            return c;
    return NULL;
}

/* A subscriber connection failed: forget it; its subscriptions are
 * nowhere now, and their waiters re-arm. sub_mu held. */
static void cconn_lost(redis_store *rs, cconn *cc)
{
    for (cconn **p = &rs->cconns; *p; p = &(*p)->next) {
        if (*p == cc) {
            *p = cc->next;
            break;
        }
    }
    if (rs->epfd >= 0)
        epoll_ctl(rs->epfd, EPOLL_CTL_DEL, cc->ctx->fd, NULL);
    dlock__rio_free(cc->ctx);
    for (csub *s = rs->csubs; s; s = s->next)
        if (s->node == cc->node) {
            s->node = -1;
            s->confirmed = 0;
        }
    free(cc);
    pthread_cond_broadcast(&rs->sub_cv);
    dlock__notify_error(rs->client);
}

/* A subscriber connection to node `id` (made if there is none). sub_mu
 * held; dropped while connecting. */
static int cconn_get(redis_store *rs, int id, const dlock__rconn_target *t,
                     int64_t deadline, cconn **out)
{
    redisContext *ctx;
    cconn *cc;
    int rc;

    /* one connect at a time per client: the client's other waiters wait
     * for it (fourteen threads of a client arming at once made fourteen
     * connections, and under load some logins took the whole timeout) */
    while (!(*out = cconn_find(rs, id)) && rs->cconn_connecting) {
        if (dlock__now_ms() >= deadline)
            return dlock__err(DLOCK_ECONN, "%s: no subscriber connection in "
                                           "time",
                              rs->where);
        dlock__cond_wait_until(&rs->sub_cv, &rs->sub_mu, deadline);
    }
    if (*out)
        return DLOCK_OK;
    rs->cconn_connecting = 1;
    pthread_mutex_unlock(&rs->sub_mu);
    rc = dlock__rconn_connect(t, 0, NULL, deadline, &ctx, NULL);
    pthread_mutex_lock(&rs->sub_mu);
    rs->cconn_connecting = 0;
    pthread_cond_broadcast(&rs->sub_cv);
    if (rc)
        return rc;
    if ((*out = cconn_find(rs, id))) { /* another thread's, meanwhile */
        dlock__rio_free(ctx);
        return DLOCK_OK;
    }
    if (!(cc = calloc(1, sizeof(*cc)))) {
        dlock__rio_free(ctx);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    rc = nonblocking(rs, ctx);
    if (rc) {
        dlock__rio_free(ctx);
        free(cc);
        return rc;
    }
    cc->node = id;
    cc->ctx = ctx;
    cc->next = rs->cconns;
    rs->cconns = cc;
    *out = cc;
    return DLOCK_OK;
}

/* Sends `cmd` (SSUBSCRIBE, SUNSUBSCRIBE) of the channel on cc; 0, or -1
 * when the connection failed (forgotten then). sub_mu held. */
static int csub_send(redis_store *rs, cconn *cc, const char *cmd,
                     const csub *s)
{
    const char *argv[2] = {cmd, s->chan};
    size_t lens[2] = {strlen(cmd), s->len};

    redisAppendCommandArgv(cc->ctx, 2, argv, lens);
    if (dlock__redis_send(cc->ctx) != 1) {
        cconn_lost(rs, cc);
        return -1;
    }
    return 0;
}

/* arm() on a cluster: the lease's lock's channel subscribed on the
 * slot's primary, and confirmed. sub_mu held (dropped while connecting
 * or asking for the map). */
static int csub_arm(redis_store *rs, dlock__lease *l, int64_t deadline)
{
    redis_lease *rl = l->priv;
    char chan[KEY_MAX + 40];
    unsigned slot;
    size_t len = lease_chan(rs, l, chan, &slot);
    csub *s = csub_find(rs, chan, len);

    if (!s) {
        if (!(s = calloc(1, sizeof(*s))))
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        memcpy(s->chan, chan, len);
        s->len = len;
        s->slot = slot;
        s->node = -1;
        s->next = rs->csubs;
        rs->csubs = s;
    }
    if (!rl->subbed) { /* the lease's count stands until its disarm() */
        s->refs++;
        rl->subbed = 1;
    }
    for (;;) {
        if (s->confirmed)
            return DLOCK_OK;
        if (s->failed[0]) {
            int rc = dlock__redis_server_error(rs->where, rs->cfg.password,
                                               s->failed, l->name);
            s->failed[0] = '\0';
            return rc;
        }
        if (dlock__now_ms() >= deadline)
            return dlock__err(DLOCK_ECONN,
                              "%s: no confirmation of SSUBSCRIBE in time",
                              rs->where);
        if (s->node < 0) {
            const dlock__rconn_target *t;
            cconn *cc;
            int id = -1, rc, ended = s->ended;
            s->ended = 0;
            pthread_mutex_unlock(&rs->sub_mu);
            if (ended) /* the map is behind: where is the slot now? */
                (void)dlock__rcluster_refresh(rs->cluster, deadline);
            rc = dlock__rcluster_owner(rs->cluster, s->slot, &id, &t,
                                       deadline);
            pthread_mutex_lock(&rs->sub_mu);
            if (rc == DLOCK_OK)
                rc = cconn_get(rs, id, t, deadline, &cc);
            /* the slot's primary unreachable: it may have been failed
             * over, and a waiter that retries (docs/design.md, "Waiting
             * through failovers and restarts") asks for the map first */
            if (rc == DLOCK_ECONN)
                s->ended = 1;
            if (rc)
                return rc;
            if (s->node < 0 && !s->confirmed) {
                if (csub_send(rs, cc, "SSUBSCRIBE", s) != 0)
                    continue; /* forgotten: connect again */
                s->node = id;
            }
            /* sub_mu was dropped: the confirmation may be in already (a
             * wait now would miss its broadcast until the deadline) */
            continue;
        }
        /* the confirmation comes on the fd: make sure it is read */
        dlock__loop_wake(rs->client);
        dlock__cond_wait_until(&rs->sub_cv, &rs->sub_mu, deadline);
    }
}

/* disarm() on a cluster: the lease no longer counts in its channel's
 * subscription. The last one out leaves it subscribed, idle; beyond
 * CSUB_IDLE_MAX idle ones, the oldest is unsubscribed. sub_mu held. */
static void csub_disarm(redis_store *rs, dlock__lease *l)
{
    redis_lease *rl = l->priv;
    char chan[KEY_MAX + 40];
    size_t len = lease_chan(rs, l, chan, NULL);
    csub *s = csub_find(rs, chan, len), *oldest = NULL;
    int idle = 0;

    if (!rl->subbed || !s)
        return;
    rl->subbed = 0;
    if (--s->refs > 0)
        return;
    s->idle = ++rs->csub_clock;
    for (csub *o = rs->csubs; o; o = o->next) {
        if (o->refs > 0)
            continue;
        idle++;
        if (!oldest || o->idle < oldest->idle)
            oldest = o;
    }
    if (idle <= CSUB_IDLE_MAX)
        return;
    for (csub **p = &rs->csubs; *p; p = &(*p)->next) {
        if (*p == oldest) {
            *p = oldest->next;
            break;
        }
    }
    cconn *cc = oldest->node >= 0 ? cconn_find(rs, oldest->node) : NULL;
    if (cc)
        (void)csub_send(rs, cc, "SUNSUBSCRIBE", oldest);
    free(oldest);
}

/* One reply on node cc's subscriber connection. sub_mu held. */
static void csub_reply(redis_store *rs, cconn *cc, const redisReply *r)
{
    if (r->type == REDIS_REPLY_ERROR) {
        /* an SSUBSCRIBE refused: MOVED (the map was behind; the waiters
         * re-arm on the owner it names) or anything else (their arm()
         * fails with it) */
        int slot = dlock__rcluster_moved(rs->cluster, r->str);
        for (csub *s = rs->csubs; s; s = s->next) {
            if (s->node != cc->node || s->confirmed ||
                (slot >= 0 && s->slot != (unsigned)slot))
                continue;
            s->node = -1;
            if (slot < 0)
                snprintf(s->failed, sizeof(s->failed), "%s", r->str);
        }
        pthread_cond_broadcast(&rs->sub_cv);
        dlock__notify_error(rs->client);
        return;
    }
    const char *kind = rpush_kind(r);
    if (!kind)
        return;
    csub *s = csub_find(rs, r->element[1]->str, r->element[1]->len);

    if (!strcmp(kind, "smessage") &&
        r->element[2]->type == REDIS_REPLY_STRING) {
        /* ours even if no longer counted (a waiter that gave up: the
         * core ignores a sequence number nobody waits with); whichever
         * node relays it, a wake-up only: the read goes to the slot's
         * primary */
        size_t cl = r->element[1]->len;
        if (cl > 32 && !memcmp(r->element[1]->str + cl - 32,
                               dlock__client_id(rs->client), 32))
            grant_msg(rs, r->element[2]->str);
    } else if (!strcmp(kind, "ssubscribe") && s && s->node == cc->node) {
        s->confirmed = 1;
        pthread_cond_broadcast(&rs->sub_cv);
    } else if (!strcmp(kind, "sunsubscribe") && s && s->node == cc->node &&
               s->confirmed) {
        /* ended by the server: the slot left the node (a reshard), or
         * the node became a replica (a failover) */
        s->node = -1;
        s->confirmed = 0;
        s->ended = 1;
        pthread_cond_broadcast(&rs->sub_cv);
        dlock__notify_error(rs->client);
    }
}

/* The map changed: a subscription on a node that no longer owns its
 * slot is left (SUNSUBSCRIBE there) and its waiters re-arm on the owner;
 * an idle one is dropped. */
static void csub_follow(redis_store *rs)
{
    int moved = 0;

    pthread_mutex_lock(&rs->sub_mu);
    for (csub **p = &rs->csubs; *p;) {
        csub *s = *p;
        int owner = dlock__rcluster_owner_now(rs->cluster, s->slot);
        if (s->node < 0 || owner == s->node) {
            p = &s->next;
            continue;
        }
        cconn *cc = cconn_find(rs, s->node);
        if (s->refs == 0) {
            *p = s->next;
            if (cc)
                (void)csub_send(rs, cc, "SUNSUBSCRIBE", s);
            free(s);
            continue;
        }
        if (cc && csub_send(rs, cc, "SUNSUBSCRIBE", s) != 0) {
            p = &rs->csubs; /* forgotten with its connection: again */
            moved = 1;
            continue;
        }
        s->node = -1;
        s->confirmed = 0;
        moved = 1;
        p = &s->next;
    }
    if (moved) {
        pthread_cond_broadcast(&rs->sub_cv);
        dlock__notify_error(rs->client);
    }
    pthread_mutex_unlock(&rs->sub_mu);
}

/* Reads every subscriber connection (non-blocking). sub_mu held. */
static void csub_read(redis_store *rs)
{
    for (cconn *cc = rs->cconns, *next; cc; cc = next) {
        next = cc->next;
        if (dlock__rio_fill(cc->ctx) != REDIS_OK) {
            cconn_lost(rs, cc);
            continue;
        }
        redisReply *r = NULL;
        int broke = 0;
        while (redisGetReplyFromReader(cc->ctx, (void **)&r) == REDIS_OK &&
               r) {
            csub_reply(rs, cc, r);
            freeReplyObject(r);
            r = NULL;
        }
        broke = cc->ctx->err != 0;
        if (broke)
            cconn_lost(rs, cc);
    }
}

/* ------------------------------------------------------------------------ */
/* The client's loop, arm and disarm                                        */
/* ------------------------------------------------------------------------ */

int dlock__redis_loop_fd(void *st)
{
    redis_store *rs = st;
    int fd;

    if (rs->topo || rs->cluster)
        return rs->epfd;
    pthread_mutex_lock(&rs->sub_mu);
    fd = rs->sub ? rs->sub->fd : -1;
    pthread_mutex_unlock(&rs->sub_mu);
    return fd;
}

/* The primary moved (a new generation of the topology): leave the old
 * one's connections (the waiters re-arm on the new one) and check every
 * hold there now (docs/design.md, "Redis beyond one server: Sentinel").
 * On a cluster, a slot changed owners: every hold is checked (those of
 * other slots pass at once; a cluster's subscriptions follow their
 * slots by themselves, above). */
static void follow(redis_store *rs)
{
    uint64_t gen = rs->cluster ? dlock__rcluster_gen(rs->cluster)
                               : dlock__rtopo_gen(rs->topo);

    if (gen <= __atomic_load_n(&rs->acted_gen, __ATOMIC_SEQ_CST))
        return;
    __atomic_store_n(&rs->acted_gen, gen, __ATOMIC_SEQ_CST);
    if (rs->topo) {
        dlock__rconn_drop_older(rs->conn, gen);
        pthread_mutex_lock(&rs->sub_mu);
        int woke = rs->sub && rs->sub_gen < gen;
        if (woke)
            sub_lost(rs);
        pthread_mutex_unlock(&rs->sub_mu);
        /* a waiter with no subscriber (the primary was down when it
         * armed) sleeps on its backoff: the switch is its wake-up */
        if (!woke)
            dlock__notify_error(rs->client);
    }
    if (rs->cluster)
        csub_follow(rs);
    dlock__renew_now(rs->client);
}

void dlock__redis_loop_run(void *st, int readable)
{
    redis_store *rs = st;

    if (rs->topo) {
        /* the epoll set: the watch and the subscriber, both
         * non-blocking; a moved primary is followed even unread */
        if (readable)
            (void)dlock__rtopo_read(rs->topo);
        follow(rs);
    }
    if (!readable)
        return;
    pthread_mutex_lock(&rs->sub_mu);
    if (rs->cluster) {
        csub_read(rs);
    } else if (rs->sub) {
        if (dlock__rio_fill(rs->sub) != REDIS_OK) {
            sub_lost(rs);
        } else {
            redisReply *r = NULL;
            while (rs->sub &&
                   redisGetReplyFromReader(rs->sub, (void **)&r) == REDIS_OK &&
                   r) {
                sub_reply(rs, r);
                freeReplyObject(r);
                r = NULL;
            }
            if (rs->sub && rs->sub->err)
                sub_lost(rs);
        }
    }
    pthread_mutex_unlock(&rs->sub_mu);
    if (rs->cluster)
        follow(rs);
}

int dlock__redis_listening(redis_store *rs, dlock__lease *l)
{
    char chan[KEY_MAX + 40];
    int yes;

    pthread_mutex_lock(&rs->sub_mu);
    if (rs->cluster) {
        /* another waiter's subscription: this lease counts in it from
         * now (it may queue and then wait without arm()); disarm(), or
         * the acquire that did not wait, lets go of it */
        csub *s = csub_find(rs, chan, lease_chan(rs, l, chan, NULL));
        redis_lease *rl = l->priv;
        yes = s && s->confirmed;
        if (yes && !rl->subbed) {
            s->refs++;
            rl->subbed = 1;
        }
    } else {
        yes = rs->sub && rs->subscribed;
    }
    pthread_mutex_unlock(&rs->sub_mu);
    return yes;
}

int dlock__redis_arm(void *st, dlock__lease *l, int64_t deadline)
{
    redis_store *rs = st;
    int rc;

    pthread_mutex_lock(&rs->sub_mu);
    rc = rs->cluster ? csub_arm(rs, l, deadline) : sub_ensure(rs, deadline);
    pthread_mutex_unlock(&rs->sub_mu);
    return rc;
}

void dlock__redis_disarm(void *st, dlock__lease *l, int acquired)
{
    redis_store *rs = st;

    (void)acquired; /* one server: the client's channel stays */
    if (!rs->cluster)
        return;
    pthread_mutex_lock(&rs->sub_mu);
    csub_disarm(rs, l);
    pthread_mutex_unlock(&rs->sub_mu);
}

int dlock__redis_run(redis_store *rs, const char *key, size_t kl,
                     rcmd *cmds, int n, redisReply **replies,
                     int64_t deadline)
{
    int rc;

    if (!rs->cluster)
        return dlock__rconn_run(rs->conn, cmds, n, replies, deadline);
    rc = dlock__rcluster_run(rs->cluster, dlock__rcluster_slot(key, kl), cmds,
                             n, replies, deadline);
    follow(rs);
    return rc;
}

int dlock__redis_ask(redis_store *rs, const char *key, size_t kl, rcmd *c,
                     const char *name, redisReply **r, int64_t deadline)
{
    int rc = dlock__redis_run(rs, key, kl, c, 1, r, deadline);

    if (rc == DLOCK_OK && (*r)->type == REDIS_REPLY_ERROR) {
        rc = server_error(rs, (*r)->str, name);
        freeReplyObject(*r);
        *r = NULL;
    }
    return rc;
}

void dlock__redis_sub_close(redis_store *rs)
{
    if (rs->sub)
        dlock__rio_free(rs->sub);
    rs->sub = NULL;
    while (rs->cconns) {
        cconn *cc = rs->cconns;
        rs->cconns = cc->next;
        dlock__rio_free(cc->ctx);
        free(cc);
    }
    while (rs->csubs) {
        csub *s = rs->csubs;
        rs->csubs = s->next;
        free(s);
    }
}
