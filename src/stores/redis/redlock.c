/* SPDX-License-Identifier: MIT */
/*
 * redlock.c -- Redlock (redlock://): one lock over N independent Redis
 * masters, held while a majority (quorum Q = N/2 + 1) of them hold it.
 *
 * Each node keeps the lock exactly as redis.c lays it out (redis_shared.h):
 * the lock key with the lease as its PEXPIRE, a fencing counter, a release
 * channel. Every operation asks all N nodes at once over non-blocking
 * connections and polls their sockets together; it ends as soon as its
 * outcome is decided (a quorum said yes, or too many said no), so its
 * latency is that of the quorum's slowest node, not the sum. Each round
 * waits at most the node timeout (?node_timeout=, 50 ms). Replies of nodes
 * that answer after a round ended are read and dropped at the next round;
 * a node that still owes a reply after a node timeout is reconnected.
 *
 * Acquire: the acquire script on every node; with Q yes answers within the
 * round, and validity = ttl - elapsed - drift left (drift = ttl *
 * drift_factor + drift_ms; the core keeps the same local lease end), the
 * lock is ours. Otherwise it is released on every node at once (without
 * waking anybody unless we had a quorum) and the try ends DLOCK_EBUSY: the
 * core re-tries after a release notification, after the holder's lease, or
 * after a random 1..50 ms when no single owner held a quorum (a split vote:
 * the jitter keeps two contenders from splitting again in step). Split
 * votes in a row double that window (up to 1..400 ms), and until it ends
 * the waiter does not try, release notifications or not: with many
 * contenders every release would otherwise start a new stampede of tries
 * on every node that nobody wins.
 *
 * Fencing tokens. Redlock has no single counter, but every node has one,
 * and any two quorums share a node. A fresh hold bumps the counter of each
 * node it wins (INCR in the acquire script) and takes c = the highest of
 * them; if the quorum's counters differ, it raises the lower ones to c on
 * a quorum before returning. So when a hold is granted, a quorum of
 * counters is at least c, and any later hold increments one of them: its
 * c is larger. Token = c * 64 + the index of the lowest node that returned
 * c, which makes two holds' tokens differ even when their counters come
 * from different nodes with equal values. Tokens therefore grow strictly
 * from one hold to any hold granted after it, whatever the clocks and
 * pauses do, as long as the nodes keep their counters (a counter lost in a
 * restart without persistence continues from the node's clock in
 * microseconds, as on redis://). docs/redlock.md has the argument and the
 * limits.
 *
 * Extend (and the watchdog): the extend script on every node; a quorum of
 * keys still ours within the round extends the hold; keys found missing
 * are then put back (not counted) so that a node restarted empty rejoins.
 * Release: compare-and-delete on every node; DLOCK_OK when a quorum of the
 * keys was still ours.
 *
 * Waiting: every release publishes on the name's channel of each node it
 * frees. A waiter subscribes on at least N - Q + 1 nodes before its next
 * try, so that it shares a node with any quorum a holder has; duplicates of
 * one release (one per node) wake it once. Subscriber connections, one per
 * node, are read by the client's background thread through an epoll fd.
 *
 * Not supported: DLOCK_FAIR (a FIFO queue needs one place that orders the
 * waiters; use redis://, zk:// or etcd://).
 */
#include "redis_shared.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define DEFAULT_PORT 6379
#define MAX_NODES 63
#define NODE_BITS 6 /* token = counter << NODE_BITS | node index */
#define DEFAULT_NODE_TIMEOUT_MS 50
#define DEFAULT_DRIFT_FACTOR 0.01
#define DEFAULT_DRIFT_MS 2
#define OWED_MAX 64      /* replies one command connection may owe */
#define SUB_RETRY_MS 500 /* a failed subscriber connection waits this long */
#define JITTER_MS 50
#define BACKOFF_MAX_SHIFT 5 /* split votes in a row: window up to 1.6 s */
#define NO_TTL_RETRY_MS 1000
#define RELEASING_RETRY_MS 2 /* the holder's release is on its way */
#define PARTIAL_RETRY_MS 250 /* one owner on the nodes up, not a quorum */

/* ------------------------------------------------------------------------ */
/* Scripts                                                                  */
/* ------------------------------------------------------------------------ */

enum { S_ACQUIRE, S_RELEASE, S_EXTEND, S_REPAIR, S_RAISE, S_INSPECT, NSCRIPTS };

/* KEYS: lock, fence. ARGV: "owner ", ttl, desc.
 * {1, counter} when the lock is (now) ours on this node; {0, pttl,
 * holder's owner} when another owner holds it. */
static const char acquire_lua[] =
    "local lock, fence = KEYS[1], KEYS[2]\n"
    "local owner, ttl, desc = ARGV[1], ARGV[2], ARGV[3]\n"
    DLOCK__REDIS_LUA_TAKE
    "if redis.call('SET', lock, owner, 'NX', 'PX', ttl) then\n"
    "  local t, err = take()\n"
    "  if err then return err end\n"
    "  return {1, t}\n"
    "end\n"
    "local v = redis.call('GET', lock)\n"
    "if string.sub(v, 1, #owner) == owner then\n"
    /* ours already: an earlier round's release did not arrive */
    "  redis.call('PEXPIRE', lock, ttl)\n"
    "  return {1, string.match(v, '^%S+ (%d+)')}\n"
    "end\n"
    "if not string.match(v, " DLOCK__REDIS_LUA_OURS_PATTERN ") then\n"
    "  return redis.error_reply('DLOCKFOREIGN the lock key holds a value "
    "not written by dlock')\n"
    "end\n"
    "return {0, redis.call('PTTL', lock), string.match(v, '^(%S+) ')}\n";

/* KEYS: lock. ARGV: "owner ", channel, message ('' publishes nothing).
 * Compare-and-delete: 1 when it was ours, 0 otherwise. */
static const char release_lua[] =
    "local v = redis.call('GET', KEYS[1])\n"
    "if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end\n"
    "redis.call('DEL', KEYS[1])\n"
    "if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[2], ARGV[3]) end\n"
    "return 1\n";

/* KEYS: lock. ARGV: "owner ", ttl. 1 extended, 0 missing, -1 another's. */
static const char extend_lua[] =
    "local v = redis.call('GET', KEYS[1])\n"
    "if not v then return 0 end\n"
    "if string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return -1 end\n"
    "redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    "return 1\n";

/* KEYS: lock. ARGV: "owner ", counter, desc, ttl. Puts a missing key back
 * (a node restarted empty, or one that missed the acquisition). */
static const char repair_lua[] =
    "if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end\n"
    "local tm = redis.call('TIME')\n"
    "local ms = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)\n"
    "redis.call('SET', KEYS[1], ARGV[1] .. ARGV[2] .. ' ' .. "
    "string.format('%.0f', ms) .. ' ' .. ARGV[3], 'PX', ARGV[4])\n"
    "return 1\n";

/* KEYS: fence. ARGV: counter. Raises the node's counter to it. */
static const char raise_lua[] =
    "local f = redis.call('GET', KEYS[1])\n"
    "if f and not tonumber(f) then\n"
    "  return redis.error_reply('DLOCKFENCE the fencing counter key holds "
    "a non-number')\n"
    "end\n"
    "if not f or tonumber(f) < tonumber(ARGV[1]) then\n"
    "  redis.call('SET', KEYS[1], ARGV[1])\n"
    "end\n"
    "return 1\n";

/* KEYS: lock, fence. {server ms, value, pttl, counter}. */
static const char inspect_lua[] =
    "local tm = redis.call('TIME')\n"
    "local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / "
    "1000)\n"
    "return {now, redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), "
    "redis.call('GET', KEYS[2])}\n";

static const char *const script_text[NSCRIPTS] = {
    acquire_lua, release_lua, extend_lua, repair_lua, raise_lua, inspect_lua};

/* ------------------------------------------------------------------------ */
/* State                                                                    */
/* ------------------------------------------------------------------------ */

/* What a command connection owes, reply by reply, in order. */
enum { K_AUTH, K_SELECT, K_SKIP, K_ROUND, K_LOAD /* + script index */ };

typedef struct rnode {
    int idx;
    char *host;
    int port;
    char where[232]; /* "redis 127.0.0.1:6379" */

    /* command connection (store mu) */
    redisContext *ctx;
    int connecting;     /* the non-blocking connect has not completed */
    int64_t owed_since; /* a reply of an ended round is owed since */
    int64_t used;       /* last round on this connection */
    unsigned char owed[OWED_MAX];
    int owed_head, owed_len;
    int setup;              /* login and script loads owed */
    redisReply *got[2];     /* this round's replies */
    int ngot, want;         /* ... received and expected */
    int rc;                 /* this round failed on this node */
    char msg[512];          /* ... why */

    /* subscriber connection (store sub_mu) */
    redisContext *sub;
    int sub_connecting;
    int sub_up;    /* connected and logged in */
    int sub_login; /* login replies owed */
    int sub_wout;  /* output waits for the socket */
    int64_t sub_retry_at;
} rnode;

/* A release channel that waiters of this client rely on. */
typedef struct rchan {
    char *name;
    size_t len;
    int refs;
    int *want;        /* per node: SUBSCRIBE was the last command sent */
    int *outstanding; /* per node: commands sent, not answered */
    char last[96];    /* the last release seen ("OWNER COUNTER"; one copy
                       * arrives per node it freed) */
    int64_t last_at;  /* when its first copy arrived */
    struct rchan *next;
} rchan;

typedef struct rl_store {
    dlock_client *client;
    dlock__redis_config cfg;
    int n, quorum;
    rnode *nodes;
    int64_t node_timeout;
    double drift_factor;
    int64_t drift_ms;
    char where[80]; /* "redlock (5 nodes)" */

    pthread_mutex_t mu; /* command connections and rounds */
    char sha[NSCRIPTS][41];
    int sha_known;

    pthread_mutex_t sub_mu;
    pthread_cond_t sub_cv;
    int epfd;
    rchan *chans;
} rl_store;

typedef struct rl_lease {
    rchan *chan;
    int splits;         /* split votes in a row in this wait */
    int64_t not_before; /* no try before this (a split vote's back-off) */
} rl_lease;

/* The owner as the scripts compare it: the core's owner (client and
 * thread) with this acquisition's number, then a space. The number makes
 * every hold of a thread a different owner on the nodes: a release of an
 * earlier hold that reaches a node late (a frozen node, an old connection)
 * cannot delete a later hold's key there. */
static size_t owner_sp(const dlock__lease *l, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s:%" PRIu64 " ", l->owner, l->waiter);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

static int64_t margin(const rl_store *rs, int64_t ttl_ms)
{
    return (int64_t)((double)ttl_ms * rs->drift_factor) + rs->drift_ms;
}

/* ------------------------------------------------------------------------ */
/* Sockets                                                                  */
/* ------------------------------------------------------------------------ */

/* A non-blocking connect finished: 0, or its errno. */
static int connect_result(int fd)
{
    int err = 0;
    socklen_t len = sizeof(err);

    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        return errno;
    return err;
}

static redisContext *start_connect(const rnode *n, char *why, size_t cap)
{
    redisContext *ctx = redisConnectNonBlock(n->host, n->port);

    if (!ctx) {
        snprintf(why, cap, "%s: out of memory", n->where);
        return NULL;
    }
    if (ctx->err) {
        snprintf(why, cap, "%s: cannot connect: %s", n->where, ctx->errstr);
        redisFree(ctx);
        return NULL;
    }
    return ctx;
}

/* ------------------------------------------------------------------------ */
/* Command connections and rounds (mu held)                                 */
/* ------------------------------------------------------------------------ */

static void node_drop(rnode *n)
{
    if (n->ctx)
        redisFree(n->ctx);
    n->ctx = NULL;
    n->connecting = 0;
    n->owed_len = n->owed_head = 0;
    n->owed_since = 0;
    n->setup = 0;
}

/* This round failed on node n, for the reason in the calling thread's
 * message (or `why`); its connection is closed. */
static void node_fail(rnode *n, int rc, const char *why)
{
    snprintf(n->msg, sizeof(n->msg), "%s", why ? why : dlock_errmsg());
    n->rc = rc;
    node_drop(n);
}

static int owe(rnode *n, int kind)
{
    if (n->owed_len == OWED_MAX)
        return -1;
    n->owed[(n->owed_head + n->owed_len++) % OWED_MAX] = (unsigned char)kind;
    if (kind == K_AUTH || kind == K_SELECT || kind >= K_LOAD)
        n->setup++;
    return 0;
}

static int stale(const redisContext *ctx)
{
    struct pollfd p = {ctx->fd, POLLIN, 0};

    return poll(&p, 1, 0) != 0;
}

static void node_io(rl_store *rs, rnode *n, short revents);

/* Makes sure node n has a command connection: a new one is connecting,
 * with its login and script loads queued ahead of any command. */
static void node_connect(rl_store *rs, rnode *n, int64_t now)
{
    if (n->ctx && n->owed_len > 0) {
        /* read what arrived since the last round (the replies of nodes
         * that answered after its quorum) */
        struct pollfd p = {n->ctx->fd, POLLIN, 0};
        if (n->connecting || sdslen(n->ctx->obuf) > 0)
            p.events |= POLLOUT;
        if (poll(&p, 1, 0) > 0)
            node_io(rs, n, p.revents);
        if (!n->ctx) { /* that failed: a new connection, this round */
            n->rc = 0;
            n->msg[0] = '\0';
        }
    }
    if (n->ctx && n->owed_since && now - n->owed_since > rs->node_timeout)
        node_drop(n); /* still silent: frozen, or gone */
    if (n->ctx && !n->connecting && n->owed_len == 0 && stale(n->ctx))
        node_drop(n); /* closed by the server (a restart) since last used */
    if (n->ctx)
        return;

    char why[512];
    n->ctx = start_connect(n, why, sizeof(why));
    if (!n->ctx) {
        node_fail(n, DLOCK_ECONN, why);
        return;
    }
    n->connecting = 1;
    int logins = dlock__redis_append_login(n->ctx, &rs->cfg);
    if (rs->cfg.password)
        owe(n, K_AUTH);
    if (logins > (rs->cfg.password ? 1 : 0))
        owe(n, K_SELECT);
    for (int s = 0; s < NSCRIPTS; s++) {
        redisAppendCommand(n->ctx, "SCRIPT LOAD %s", script_text[s]);
        owe(n, K_LOAD + s);
    }
}

static void round_begin(rl_store *rs)
{
    for (int i = 0; i < rs->n; i++) {
        rnode *n = &rs->nodes[i];
        n->ngot = n->want = n->rc = 0;
        n->msg[0] = '\0';
    }
}

/* Ends a round: frees its replies; the replies still owed to it are
 * thrown away when they arrive. */
static void round_free(rl_store *rs)
{
    int64_t now = dlock__now_ms();

    for (int i = 0; i < rs->n; i++) {
        rnode *n = &rs->nodes[i];
        int late = 0;
        for (int k = 0; k < n->ngot; k++)
            freeReplyObject(n->got[k]);
        n->ngot = 0;
        for (int k = 0; k < n->owed_len; k++) {
            unsigned char *kind = &n->owed[(n->owed_head + k) % OWED_MAX];
            if (*kind == K_ROUND) {
                *kind = K_SKIP;
                late = 1;
            }
        }
        if (late && !n->owed_since)
            n->owed_since = now;
    }
}

/* Queues command c on node n (connecting first if needed); its reply is
 * this round's (kind K_ROUND) or thrown away (K_SKIP). */
static void node_send(rl_store *rs, rnode *n, rcmd *c, int kind,
                      int64_t now)
{
    node_connect(rs, n, now);
    if (!n->ctx)
        return;
    if (c->script >= 0)
        c->argv[1] = rs->sha[c->script];
    if (redisAppendCommandArgv(n->ctx, c->argc, c->argv, c->lens) !=
            REDIS_OK ||
        owe(n, kind) != 0) {
        node_fail(n, DLOCK_ECONN, NULL);
        snprintf(n->msg, sizeof(n->msg), "%s: too many replies owed",
                 n->where);
        return;
    }
    if (kind == K_ROUND)
        n->want++;
    else if (!n->owed_since)
        n->owed_since = now;
    n->used = now;
    if (!n->connecting && dlock__redis_send(n->ctx) < 0) {
        char why[512];
        snprintf(why, sizeof(why), "%s: %s", n->where, strerror(errno));
        node_fail(n, DLOCK_ECONN, why);
    }
}

/* One reply arrived on node n. */
static void node_reply(rl_store *rs, rnode *n, redisReply *r)
{
    if (n->owed_len == 0) {
        freeReplyObject(r);
        dlock__err(DLOCK_EPROTO, "%s: a reply nobody asked for", n->where);
        node_fail(n, DLOCK_EPROTO, NULL);
        return;
    }
    int kind = n->owed[n->owed_head];
    n->owed_head = (n->owed_head + 1) % OWED_MAX;
    if (--n->owed_len == 0)
        n->owed_since = 0;
    if (kind == K_AUTH || kind == K_SELECT || kind >= K_LOAD)
        n->setup--;

    if (kind == K_ROUND && n->ngot < 2) {
        if (r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "NOSCRIPT", 8)) {
            /* scripts flushed: a new connection loads them again */
            freeReplyObject(r);
            dlock__err(DLOCK_ECONN, "%s: the server forgot dlock's scripts",
                       n->where);
            node_fail(n, DLOCK_ECONN, NULL);
            return;
        }
        n->got[n->ngot++] = r;
        return;
    }
    if (r->type == REDIS_REPLY_ERROR && kind == K_AUTH) {
        dlock__err(DLOCK_EAUTH,
                   "%s: authentication refused (wrong user name or "
                   "password)",
                   n->where);
        node_fail(n, DLOCK_EAUTH, NULL);
    } else if (r->type == REDIS_REPLY_ERROR && kind == K_SELECT) {
        dlock__err(DLOCK_EINVAL, "%s: cannot select database %ld", n->where,
                   rs->cfg.db);
        node_fail(n, DLOCK_EINVAL, NULL);
    } else if (kind >= K_LOAD) {
        int s = kind - K_LOAD;
        if (r->type != REDIS_REPLY_STRING || r->len != 40) {
            int code = r->type == REDIS_REPLY_ERROR
                           ? dlock__redis_server_error(
                                 n->where, rs->cfg.password, r->str, NULL)
                           : dlock__err(DLOCK_EPROTO,
                                        "%s: unexpected answer to SCRIPT "
                                        "LOAD",
                                        n->where);
            node_fail(n, code, NULL);
        } else if (!(rs->sha_known & (1 << s))) {
            memcpy(rs->sha[s], r->str, 41);
            rs->sha_known |= 1 << s;
        }
    }
    freeReplyObject(r);
}

/* Socket events on node n's command connection. */
static void node_io(rl_store *rs, rnode *n, short revents)
{
    char why[512];

    if (n->connecting) {
        if (!(revents & (POLLOUT | POLLERR | POLLHUP)))
            return;
        int err = connect_result(n->ctx->fd);
        if (err) {
            snprintf(why, sizeof(why), "%s: cannot connect: %s", n->where,
                     strerror(err));
            node_fail(n, DLOCK_ECONN, why);
            return;
        }
        n->connecting = 0;
    }
    if (dlock__redis_send(n->ctx) < 0) {
        snprintf(why, sizeof(why), "%s: %s", n->where, strerror(errno));
        node_fail(n, DLOCK_ECONN, why);
        return;
    }
    if (!(revents & (POLLIN | POLLERR | POLLHUP)))
        return;
    if (redisBufferRead(n->ctx) != REDIS_OK) {
        node_fail(n, dlock__redis_io_failure(n->where, n->ctx,
                                             rs->node_timeout),
                  NULL);
        return;
    }
    for (;;) {
        redisReply *r = NULL;
        if (redisGetReplyFromReader(n->ctx, (void **)&r) != REDIS_OK) {
            node_fail(n, dlock__redis_io_failure(n->where, n->ctx,
                                                 rs->node_timeout),
                      NULL);
            return;
        }
        if (!r)
            return;
        node_reply(rs, n, r);
        if (!n->ctx)
            return;
    }
}

static int node_busy(const rnode *n)
{
    return n->ctx && !n->rc && (n->ngot < n->want || n->setup > 0);
}

/* Runs the round until every node answered or failed, `decided` says the
 * outcome is known, or `deadline` passes (nodes still silent then fail).
 * The replies of nodes still owing when it ends early are dropped when
 * they arrive. */
static void round_run(rl_store *rs, int64_t deadline,
                      int (*decided)(const rl_store *, void *), void *arg)
{
    struct pollfd pfd[MAX_NODES];
    int who[MAX_NODES];

    for (;;) {
        if (decided && decided(rs, arg))
            break;
        int np = 0;
        for (int i = 0; i < rs->n; i++) {
            rnode *n = &rs->nodes[i];
            if (!node_busy(n))
                continue;
            pfd[np].fd = n->ctx->fd;
            pfd[np].events = POLLIN;
            if (n->connecting || sdslen(n->ctx->obuf) > 0)
                pfd[np].events |= POLLOUT;
            pfd[np].revents = 0;
            who[np++] = i;
        }
        if (np == 0)
            break;
        int64_t now = dlock__now_ms();
        if (now >= deadline) {
            for (int k = 0; k < np; k++) {
                rnode *n = &rs->nodes[who[k]];
                char why[512];
                snprintf(why, sizeof(why), "%s: no answer within %lld ms",
                         n->where, (long long)rs->node_timeout);
                node_fail(n, DLOCK_ECONN, why);
            }
            break;
        }
        int r = poll(pfd, (nfds_t)np, (int)(deadline - now));
        if (r < 0 && errno != EINTR)
            break;
        for (int k = 0; k < np && r > 0; k++)
            if (pfd[k].revents)
                node_io(rs, &rs->nodes[who[k]], pfd[k].revents);
    }
}

/* The store's message for a round in which too few nodes answered. */
static int quorum_failure(const rl_store *rs, int answered, const char *what)
{
    char detail[600];
    size_t o = 0;
    int rc = DLOCK_ECONN;

    detail[0] = '\0';
    for (int i = 0; i < rs->n && o + 4 < sizeof(detail); i++) {
        const rnode *n = &rs->nodes[i];
        if (!n->rc)
            continue;
        /* a refusal says more than an absence */
        if (n->rc == DLOCK_EAUTH || (n->rc != DLOCK_ECONN && rc == DLOCK_ECONN))
            rc = n->rc;
        int w = snprintf(detail + o, sizeof(detail) - o, "%s%s",
                         o ? "; " : "", n->msg);
        if (w < 0)
            break;
        o += (size_t)w;
    }
    if (o >= sizeof(detail))
        o = sizeof(detail) - 1;
    return dlock__err(rc,
                      "%s: %s: %d of %d nodes answered, quorum %d%s%s",
                      rs->where, what, answered, rs->n, rs->quorum,
                      detail[0] ? ": " : "", detail);
}

/* ------------------------------------------------------------------------ */
/* Acquire                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct tally {
    int yes, no; /* nodes that said yes / no this round */
} tally;

/* Counts replies whose first element (or integer value) is 1 as yes. */
static int reply_yes(const redisReply *r)
{
    if (r->type == REDIS_REPLY_INTEGER)
        return r->integer == 1;
    return r->type == REDIS_REPLY_ARRAY && r->elements >= 2 &&
           r->element[0]->type == REDIS_REPLY_INTEGER &&
           r->element[0]->integer == 1;
}

static void count(const rl_store *rs, tally *t)
{
    t->yes = t->no = 0;
    for (int i = 0; i < rs->n; i++) {
        const rnode *n = &rs->nodes[i];
        if (n->rc || !n->ctx)
            t->no++;
        else if (n->ngot > 0 && n->ngot >= n->want)
            reply_yes(n->got[0]) ? t->yes++ : t->no++;
    }
}

/* Decided once a quorum said yes, or too many said no for one to. */
static int quorum_decided(const rl_store *rs, void *arg)
{
    tally *t = arg;

    count(rs, t);
    return t->yes >= rs->quorum || t->no > rs->n - rs->quorum;
}

/* Sends the nc commands `c` to every node and runs the round, for at most
 * the node timeout (and op_deadline), until `decided` (NULL: until every
 * node answered). mu held. Returns when the round started. */
static int64_t ask_all(rl_store *rs, rcmd *c, int nc, int64_t op_deadline,
                       int (*decided)(const rl_store *, void *), void *arg)
{
    int64_t start = dlock__now_ms(), deadline = start + rs->node_timeout;

    if (deadline > op_deadline)
        deadline = op_deadline;
    round_begin(rs);
    for (int i = 0; i < rs->n; i++)
        for (int k = 0; k < nc; k++)
            node_send(rs, &rs->nodes[i], &c[k], K_ROUND, start);
    round_run(rs, deadline, decided, arg);
    return start;
}

/* Of the nodes that answered an integer: how many, and how many said
 * other than 1 (not ours); mine[i] (may be NULL): node i said 1. */
static void count_ints(const rl_store *rs, int *answered, int *notours,
                       int *mine)
{
    *answered = *notours = 0;
    for (int i = 0; i < rs->n; i++) {
        const rnode *n = &rs->nodes[i];
        int ok = !n->rc && n->ngot > 0 &&
                 n->got[0]->type == REDIS_REPLY_INTEGER;
        if (mine)
            mine[i] = ok && n->got[0]->integer == 1;
        if (ok) {
            (*answered)++;
            *notours += n->got[0]->integer != 1;
        }
    }
}

/* Sends the release script to every node; `message` '' publishes nothing.
 * Replies are thrown away. */
static void release_all(rl_store *rs, const dlock__lease *l,
                        const char *message, int64_t now)
{
    char lock[DLOCK__REDIS_KEY_MAX], wake[DLOCK__REDIS_KEY_MAX], owner[80];
    size_t ll = dlock__redis_key(&rs->cfg, l->name, l->name_len, "", lock);
    size_t wl = dlock__redis_wake_key(&rs->cfg, l->name, l->name_len, wake);
    size_t ol = owner_sp(l, owner, sizeof(owner));

    for (int i = 0; i < rs->n; i++) {
        rcmd c;
        rcmd_evalsha(&c, S_RELEASE, 1);
        rcmd_arg(&c, lock, ll);
        rcmd_arg(&c, owner, ol);
        rcmd_arg(&c, wake, wl);
        rcmd_str(&c, message);
        node_send(rs, &rs->nodes[i], &c, K_SKIP, now);
    }
}

/* A random 1..window ms. */
static int64_t jitter_ms(int64_t window)
{
    unsigned char b[2] = {0, 0};

    dlock__random(b, sizeof(b));
    return 1 + (int64_t)(b[0] | b[1] << 8) % window;
}

/* Whether this client saw `owner` announce the release of the lock on
 * `ch` within the last node timeout. */
static int announced(rl_store *rs, rchan *ch, const char *owner, size_t len)
{
    int yes;

    pthread_mutex_lock(&rs->sub_mu);
    yes = ch && strlen(ch->last) > len && ch->last[len] == ' ' &&
          memcmp(ch->last, owner, len) == 0 &&
          dlock__now_ms() - ch->last_at <= rs->node_timeout;
    pthread_mutex_unlock(&rs->sub_mu);
    return yes;
}

/* The holder a node reported on this try (a "no" answer), or NULL. */
static const redisReply *holder_of(const rnode *n)
{
    const redisReply *r = n->ngot > 0 ? n->got[0] : NULL;

    if (n->rc || !r || reply_yes(r) || r->type != REDIS_REPLY_ARRAY ||
        r->elements != 3 || r->element[2]->type != REDIS_REPLY_STRING)
        return NULL;
    return r->element[2];
}

/* After a try without a quorum: when to try again.
 *  - A holder whose release this client has just heard of: soon. A
 *    release reaches the nodes one by one, and its first notification can
 *    wake a waiter whose try still finds the holder on some of them; the
 *    copies of that notification from the other nodes are dropped (one
 *    release wakes a waiter once), so nothing else would wake it.
 *  - One owner on a quorum: its lease (or its release's notification).
 *  - Otherwise a split vote or a lock half free: a short random wait, and
 *    no try before it ends; it doubles with every split vote in a row. */
static int64_t retry_after(rl_store *rs, rl_lease *rp)
{
    rchan *ch = rp->chan;
    const redisReply *only = NULL; /* the one owner of every "no" */
    int yes = 0, several = 0;
    long long least = -1;

    for (int i = 0; i < rs->n; i++) {
        const redisReply *o = holder_of(&rs->nodes[i]);
        if (o && announced(rs, ch, o->str, o->len))
            return RELEASING_RETRY_MS;
    }
    for (int i = 0; i < rs->n; i++) {
        const rnode *n = &rs->nodes[i];
        const redisReply *o = holder_of(n);
        if (!n->rc && n->ngot > 0 && reply_yes(n->got[0]))
            yes++;
        if (!o)
            continue;
        if (only && (o->len != only->len ||
                     memcmp(o->str, only->str, o->len) != 0))
            several = 1;
        only = only ? only : o;
        const redisReply *p = n->got[0]->element[1];
        if (p->type == REDIS_REPLY_INTEGER && p->integer >= 0 &&
            (least < 0 || p->integer < least))
            least = p->integer;
    }
    int same = 0;
    for (int i = 0; i < rs->n && only && !several; i++)
        same += holder_of(&rs->nodes[i]) != NULL;
    if (only && !several && same >= rs->quorum)
        return least >= 0 ? least : NO_TTL_RETRY_MS;
    /* one owner on every node that answered, none free, but not a quorum
     * of them (the others are down): a holder whose quorum included nodes
     * now down, or a contender about to give back what it got quietly */
    if (only && !several && yes == 0)
        return least >= 0 && least < PARTIAL_RETRY_MS ? least
                                                      : PARTIAL_RETRY_MS;
    int shift = rp->splits < BACKOFF_MAX_SHIFT ? rp->splits
                                               : BACKOFF_MAX_SHIFT;
    int64_t wait = jitter_ms((int64_t)JITTER_MS << shift);
    rp->splits++;
    rp->not_before = dlock__now_ms() + wait;
    return wait;
}

typedef struct raise_goal {
    int need, sent;
    tally t;
} raise_goal;

static int raise_decided(const rl_store *rs, void *arg)
{
    raise_goal *g = arg;

    count(rs, &g->t);
    return g->t.yes >= g->need || g->sent - g->t.no < g->need;
}

/* Raises the counters lower than c (cs[i] per node, 0: unknown) to c, so
 * that a quorum of counters is at least c. 0 when it is. */
static int raise_counters(rl_store *rs, const dlock__lease *l,
                          const uint64_t *cs, uint64_t c, int at_max,
                          int64_t op_deadline)
{
    char fence[DLOCK__REDIS_KEY_MAX], num[24];
    size_t fl = dlock__redis_key(&rs->cfg, l->name, l->name_len, ":f", fence);
    int64_t now = dlock__now_ms();
    int64_t deadline = now + rs->node_timeout;
    raise_goal g;

    if (deadline > op_deadline)
        deadline = op_deadline;
    round_free(rs);
    round_begin(rs);
    snprintf(num, sizeof(num), "%" PRIu64, c);
    g.need = rs->quorum - at_max;
    g.sent = 0;
    for (int i = 0; i < rs->n; i++) {
        if (cs[i] == c)
            continue;
        rcmd cmd;
        rcmd_evalsha(&cmd, S_RAISE, 1);
        rcmd_arg(&cmd, fence, fl);
        rcmd_str(&cmd, num);
        node_send(rs, &rs->nodes[i], &cmd, K_ROUND, now);
        g.sent++;
    }
    round_run(rs, deadline, raise_decided, &g);
    count(rs, &g.t);
    return g.t.yes >= g.need ? 0 : -1;
}

/* A lease that no round could leave any validity of. */
static int ttl_too_short(const rl_store *rs, int64_t ttl_ms)
{
    if (margin(rs, ttl_ms) + rs->node_timeout < ttl_ms)
        return 0;
    dlock__err(DLOCK_EINVAL,
               "%s: a lease of %lld ms is too short for the node timeout "
               "(%lld ms) and the clock drift allowance (%lld ms)",
               rs->where, (long long)ttl_ms, (long long)rs->node_timeout,
               (long long)margin(rs, ttl_ms));
    return 1;
}

static int rl_acquire(void *st, dlock__lease *l, int64_t op_deadline)
{
    rl_store *rs = st;
    char lock[DLOCK__REDIS_KEY_MAX], fence[DLOCK__REDIS_KEY_MAX];
    char owner[80], ttl[24];
    size_t ll, fl, ol;
    uint64_t cs[MAX_NODES];
    int rc = DLOCK_OK;
    rcmd c;
    tally t;

    if (l->flags & DLOCK_FAIR)
        return dlock__err(DLOCK_ENOTSUP,
                          "%s: DLOCK_FAIR is not supported: a first-come, "
                          "first-served queue needs one place that orders the "
                          "waiters (use redis://, zk:// or etcd://)",
                          rs->where);
    if (ttl_too_short(rs, l->ttl_ms))
        return DLOCK_EINVAL;
    rl_lease *rp = l->priv;
    int64_t now0 = dlock__now_ms();
    if (!l->waiting) { /* a new acquisition: no back-off carried over */
        rp->splits = 0;
        rp->not_before = 0;
    } else if (rp->not_before > now0) {
        l->retry_ms = rp->not_before - now0; /* backing off: not yet */
        return DLOCK_EBUSY;
    }
    ll = dlock__redis_key(&rs->cfg, l->name, l->name_len, "", lock);
    fl = dlock__redis_key(&rs->cfg, l->name, l->name_len, ":f", fence);
    ol = owner_sp(l, owner, sizeof(owner));
    snprintf(ttl, sizeof(ttl), "%lld", (long long)l->ttl_ms);

    rcmd_evalsha(&c, S_ACQUIRE, 2);
    rcmd_arg(&c, lock, ll);
    rcmd_arg(&c, fence, fl);
    rcmd_arg(&c, owner, ol);
    rcmd_str(&c, ttl);
    rcmd_str(&c, l->desc);
    pthread_mutex_lock(&rs->mu);
    int64_t start = ask_all(rs, &c, 1, op_deadline, quorum_decided, &t);

    /* the counters of the nodes that said yes */
    uint64_t top = 0;
    int top_idx = -1, answered = 0, at_max = 0;
    for (int i = 0; i < rs->n; i++) {
        rnode *n = &rs->nodes[i];
        cs[i] = 0;
        if (n->rc || n->ngot == 0)
            continue;
        redisReply *r = n->got[0];
        if (r->type == REDIS_REPLY_ERROR) {
            int code = dlock__redis_server_error(n->where, rs->cfg.password,
                                                 r->str, l->name);
            snprintf(n->msg, sizeof(n->msg), "%s", dlock_errmsg());
            n->rc = code;
            continue;
        }
        answered++;
        if (!reply_yes(r))
            continue;
        if (dlock__redis_reply_uint(r->element[1], &cs[i]) != 0 ||
            cs[i] == 0 || cs[i] >= (UINT64_MAX >> NODE_BITS)) {
            cs[i] = 0;
            snprintf(n->msg, sizeof(n->msg),
                     "%s: bad fencing counter for lock '%.100s'", n->where,
                     l->name);
            n->rc = DLOCK_EPROTO;
            answered--;
            continue;
        }
        if (cs[i] > top) {
            top = cs[i];
            top_idx = i;
        }
    }
    count(rs, &t);
    for (int i = 0; i < rs->n; i++)
        if (cs[i] == top && top)
            at_max++;

    if (t.yes >= rs->quorum) {
        int raised = at_max >= rs->quorum ||
                     raise_counters(rs, l, cs, top, at_max, op_deadline) == 0;
        int64_t now = dlock__now_ms();
        int64_t validity = l->ttl_ms - (now - start) - margin(rs, l->ttl_ms);
        if (raised && validity > 0) {
            l->token = (top << NODE_BITS) | (uint64_t)top_idx;
            round_free(rs);
            pthread_mutex_unlock(&rs->mu);
            return DLOCK_OK;
        }
        char msg[120];
        snprintf(msg, sizeof(msg), "%s%" PRIu64, owner, top);
        round_free(rs);
        release_all(rs, l, msg, now); /* we had it: wake the waiters */
        rc = raised ? dlock__err(DLOCK_ECONN,
                                 "%s: the quorum took %lld ms, which left "
                                 "no validity of the %lld ms lease",
                                 rs->where, (long long)(now - start),
                                 (long long)l->ttl_ms)
                    : quorum_failure(rs, answered,
                                     "cannot raise the fencing counters");
        pthread_mutex_unlock(&rs->mu);
        return rc;
    }

    /* no quorum: give back what we got, quietly; too many nodes failed
     * for any quorum: a store failure. When to try again depends on who
     * holds the nodes that have not answered yet: hear them out (within
     * the same node timeout) */
    round_run(rs, start + rs->node_timeout < op_deadline
                      ? start + rs->node_timeout
                      : op_deadline,
              NULL, NULL);
    int64_t retry = retry_after(rs, rp);
    int failed = 0;
    for (int i = 0; i < rs->n; i++)
        failed += rs->nodes[i].rc != 0;
    if (failed > rs->n - rs->quorum)
        rc = quorum_failure(rs, answered, "cannot acquire");
    round_free(rs);
    release_all(rs, l, "", dlock__now_ms());
    pthread_mutex_unlock(&rs->mu);
    if (rc)
        return rc;
    l->retry_ms = retry;
    return DLOCK_EBUSY;
}

/* ------------------------------------------------------------------------ */
/* Release, extend                                                          */
/* ------------------------------------------------------------------------ */

static int rl_release(void *st, dlock__lease *l, int64_t op_deadline)
{
    rl_store *rs = st;
    char lock[DLOCK__REDIS_KEY_MAX], wake[DLOCK__REDIS_KEY_MAX], owner[80];
    char msg[120];
    size_t ll = dlock__redis_key(&rs->cfg, l->name, l->name_len, "", lock);
    size_t wl = dlock__redis_wake_key(&rs->cfg, l->name, l->name_len, wake);
    size_t ol = owner_sp(l, owner, sizeof(owner));
    int rc = DLOCK_OK;
    rcmd c;
    tally t;

    snprintf(msg, sizeof(msg), "%s%" PRIu64, owner, l->token >> NODE_BITS);
    rcmd_evalsha(&c, S_RELEASE, 1);
    rcmd_arg(&c, lock, ll);
    rcmd_arg(&c, owner, ol);
    rcmd_arg(&c, wake, wl);
    rcmd_str(&c, msg);
    pthread_mutex_lock(&rs->mu);
    ask_all(rs, &c, 1, op_deadline, quorum_decided, &t);
    count(rs, &t);
    if (t.yes < rs->quorum) {
        int answered, notours;
        count_ints(rs, &answered, &notours, NULL);
        if (notours > rs->n - rs->quorum)
            rc = dlock__err(DLOCK_ENOTHELD,
                            "lock '%.100s' is not ours on a quorum of the "
                            "nodes (%d of %d said so)",
                            l->name, notours, rs->n);
        else
            rc = quorum_failure(rs, answered, "release");
    }
    round_free(rs);
    pthread_mutex_unlock(&rs->mu);
    return rc;
}

static int rl_extend(void *st, dlock__lease *l, int64_t ttl_ms,
                     int64_t op_deadline)
{
    rl_store *rs = st;
    char lock[DLOCK__REDIS_KEY_MAX], owner[80], ttl[24], num[24];
    size_t ll = dlock__redis_key(&rs->cfg, l->name, l->name_len, "", lock);
    size_t ol = owner_sp(l, owner, sizeof(owner));
    int rc = DLOCK_OK;
    rcmd c;
    tally t;

    if (ttl_too_short(rs, ttl_ms))
        return DLOCK_EINVAL;
    snprintf(ttl, sizeof(ttl), "%lld", (long long)ttl_ms);
    snprintf(num, sizeof(num), "%" PRIu64, l->token >> NODE_BITS);
    rcmd_evalsha(&c, S_EXTEND, 1);
    rcmd_arg(&c, lock, ll);
    rcmd_arg(&c, owner, ol);
    rcmd_str(&c, ttl);
    pthread_mutex_lock(&rs->mu);
    int64_t start = ask_all(rs, &c, 1, op_deadline, quorum_decided, &t);
    count(rs, &t);
    int64_t now = dlock__now_ms();
    int answered, notours, mine[MAX_NODES];
    count_ints(rs, &answered, &notours, mine);
    if (t.yes >= rs->quorum &&
        ttl_ms - (now - start) - margin(rs, ttl_ms) > 0) {
        /* put back the keys that nodes lost (counted from the next
         * renewal on) */
        round_free(rs);
        for (int i = 0; i < rs->n; i++) {
            if (mine[i])
                continue;
            rcmd_evalsha(&c, S_REPAIR, 1);
            rcmd_arg(&c, lock, ll);
            rcmd_arg(&c, owner, ol);
            rcmd_str(&c, num);
            rcmd_str(&c, l->desc);
            rcmd_str(&c, ttl);
            node_send(rs, &rs->nodes[i], &c, K_SKIP, now);
        }
        pthread_mutex_unlock(&rs->mu);
        return DLOCK_OK;
    }
    if (t.yes >= rs->quorum)
        rc = dlock__err(DLOCK_ECONN,
                        "%s: the quorum took %lld ms, which left no validity "
                        "of the %lld ms lease",
                        rs->where, (long long)(now - start),
                        (long long)ttl_ms);
    else if (notours > rs->n - rs->quorum)
        rc = dlock__err(DLOCK_ENOTHELD,
                        "lock '%.100s' is not ours on a quorum of the nodes "
                        "(%d of %d said so)",
                        l->name, notours, rs->n);
    else
        rc = quorum_failure(rs, answered, "extend");
    round_free(rs);
    pthread_mutex_unlock(&rs->mu);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Inspect                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct seen {
    const char *owner; /* points into a reply */
    size_t owner_len;
    uint64_t counter;
    long long acquired, now, pttl;
    const char *desc;
    size_t desc_len;
} seen;

static int cmp_ll_desc(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int rl_inspect(void *st, const char *name, size_t len,
                      dlock_info *out, int64_t op_deadline)
{
    rl_store *rs = st;
    char lock[DLOCK__REDIS_KEY_MAX], fence[DLOCK__REDIS_KEY_MAX];
    char wake[DLOCK__REDIS_KEY_MAX];
    size_t ll = dlock__redis_key(&rs->cfg, name, len, "", lock);
    size_t fl = dlock__redis_key(&rs->cfg, name, len, ":f", fence);
    size_t wl = dlock__redis_wake_key(&rs->cfg, name, len, wake);
    seen sn[MAX_NODES];
    int has[MAX_NODES];
    int rc = DLOCK_OK, answered = 0;

    rcmd c[2];
    rcmd_evalsha(&c[0], S_INSPECT, 2);
    rcmd_arg(&c[0], lock, ll);
    rcmd_arg(&c[0], fence, fl);
    rcmd_plain(&c[1]);
    rcmd_str(&c[1], "PUBSUB");
    rcmd_str(&c[1], "NUMSUB");
    rcmd_arg(&c[1], wake, wl);
    pthread_mutex_lock(&rs->mu);
    ask_all(rs, c, 2, op_deadline, NULL, NULL);

    uint64_t last = 0;
    out->waiters = 0;
    for (int i = 0; i < rs->n; i++) {
        rnode *n = &rs->nodes[i];
        has[i] = 0;
        if (n->rc || n->ngot < 2)
            continue;
        const redisReply *s = n->got[0], *ns = n->got[1];
        if (s->type == REDIS_REPLY_ERROR) {
            rc = dlock__redis_server_error(n->where, rs->cfg.password, s->str,
                                           name);
            goto done;
        }
        if (s->type != REDIS_REPLY_ARRAY || s->elements != 4 ||
            s->element[0]->type != REDIS_REPLY_INTEGER) {
            rc = dlock__err(DLOCK_EPROTO, "%s: unexpected answer to inspect",
                            n->where);
            goto done;
        }
        answered++;
        uint64_t f;
        /* the highest counter, from the lowest node that has it: the
         * token rule of the acquire */
        if (dlock__redis_reply_uint(s->element[3], &f) == 0 &&
            (f << NODE_BITS) > (last & ~(uint64_t)((1 << NODE_BITS) - 1)))
            last = f << NODE_BITS | (uint64_t)i;
        if (ns->type == REDIS_REPLY_ARRAY && ns->elements == 2 &&
            ns->element[1]->type == REDIS_REPLY_INTEGER &&
            ns->element[1]->integer > out->waiters)
            out->waiters = ns->element[1]->integer;
        const redisReply *v = s->element[1];
        if (v->type != REDIS_REPLY_STRING)
            continue;
        /* "OWNER COUNTER ACQUIRED_MS DESCRIPTION" */
        unsigned long long cnt = 0, at = 0;
        int o_end = 0, d = 0;
        if (sscanf(v->str, "%*s%n %llu %llu %n", &o_end, &cnt, &at, &d) < 2 ||
            d <= 0) {
            rc = dlock__err(DLOCK_EPROTO,
                            "%s: a key of lock '%.100s' holds a value of "
                            "another type (not written by dlock)",
                            n->where, name);
            goto done;
        }
        has[i] = 1;
        sn[i].owner = v->str;
        sn[i].owner_len = (size_t)o_end;
        sn[i].counter = cnt;
        sn[i].acquired = (long long)at;
        sn[i].now = s->element[0]->integer;
        sn[i].pttl = s->element[2]->type == REDIS_REPLY_INTEGER
                         ? s->element[2]->integer
                         : -1;
        sn[i].desc = v->str + d;
        sn[i].desc_len = v->len - (size_t)d;
    }
    if (answered < rs->quorum) {
        rc = quorum_failure(rs, answered, "inspect");
        goto done;
    }
    out->token = last;
    /* held when one owner's key is on a quorum */
    for (int i = 0; i < rs->n && !out->held; i++) {
        if (!has[i])
            continue;
        long long pttls[MAX_NODES];
        int same = 0, top_idx = 0;
        uint64_t top = 0;
        for (int k = 0; k < rs->n; k++) {
            if (!has[k] || sn[k].owner_len != sn[i].owner_len ||
                memcmp(sn[k].owner, sn[i].owner, sn[i].owner_len) != 0)
                continue;
            pttls[same++] = sn[k].pttl;
            if (sn[k].counter > top) { /* the lowest node with the most */
                top = sn[k].counter;
                top_idx = k;
            }
        }
        uint64_t tok = top << NODE_BITS | (uint64_t)top_idx;
        if (same < rs->quorum)
            continue;
        qsort(pttls, (size_t)same, sizeof(pttls[0]), cmp_ll_desc);
        out->held = 1;
        out->token = tok;
        out->ttl_ms = pttls[rs->quorum - 1];
        if (sn[i].now >= sn[i].acquired)
            out->held_ms = sn[i].now - sn[i].acquired;
        snprintf(out->holder, sizeof(out->holder), "%.*s",
                 (int)sn[i].desc_len, sn[i].desc);
    }
done:
    round_free(rs);
    pthread_mutex_unlock(&rs->mu);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Subscriber connections (sub_mu held)                                     */
/* ------------------------------------------------------------------------ */

static rchan *chan_get(rl_store *rs, const char *name, size_t len)
{
    for (rchan *ch = rs->chans; ch; ch = ch->next)
        if (ch->len == len && memcmp(ch->name, name, len) == 0)
            return ch;
    rchan *ch = calloc(1, sizeof(*ch));
    if (!ch)
        return NULL;
    ch->name = malloc(len + 1);
    ch->want = calloc((size_t)rs->n * 2, sizeof(int));
    if (!ch->name || !ch->want) {
        free(ch->name);
        free(ch->want);
        free(ch);
        return NULL;
    }
    ch->outstanding = ch->want + rs->n;
    memcpy(ch->name, name, len);
    ch->name[len] = '\0';
    ch->len = len;
    ch->next = rs->chans;
    rs->chans = ch;
    return ch;
}

static void chan_free_if_idle(rl_store *rs, rchan *ch)
{
    if (ch->refs > 0)
        return;
    for (int i = 0; i < rs->n; i++)
        if (ch->want[i] || ch->outstanding[i])
            return;
    for (rchan **pp = &rs->chans; *pp; pp = &(*pp)->next) {
        if (*pp == ch) {
            *pp = ch->next;
            break;
        }
    }
    free(ch->name);
    free(ch->want);
    free(ch);
}

static void sub_events(rl_store *rs, rnode *n)
{
    struct epoll_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN | (n->sub_connecting || n->sub_wout ? EPOLLOUT : 0);
    ev.data.u32 = (uint32_t)n->idx;
    epoll_ctl(rs->epfd, EPOLL_CTL_MOD, n->sub->fd, &ev);
}

/* Closes node n's subscriber connection. Waiters that relied on it are
 * told to arm again when it had been serving them. */
static void sub_drop(rl_store *rs, rnode *n)
{
    int served = n->sub_up;

    if (!n->sub)
        return;
    epoll_ctl(rs->epfd, EPOLL_CTL_DEL, n->sub->fd, NULL);
    redisFree(n->sub);
    n->sub = NULL;
    n->sub_connecting = n->sub_up = n->sub_login = n->sub_wout = 0;
    n->sub_retry_at = dlock__now_ms() + SUB_RETRY_MS;
    for (rchan *ch = rs->chans, *next; ch; ch = next) {
        next = ch->next;
        served |= ch->want[n->idx] && !ch->outstanding[n->idx];
        ch->want[n->idx] = ch->outstanding[n->idx] = 0;
        chan_free_if_idle(rs, ch);
    }
    pthread_cond_broadcast(&rs->sub_cv);
    if (served)
        dlock__notify_error(rs->client);
}

static void sub_flush(rl_store *rs, rnode *n)
{
    if (n->sub_connecting)
        return;
    int r = dlock__redis_send(n->sub);
    if (r < 0) {
        sub_drop(rs, n);
        return;
    }
    if (n->sub_wout != (r == 0)) {
        n->sub_wout = r == 0;
        sub_events(rs, n);
    }
}

static void sub_start(rl_store *rs, rnode *n)
{
    char why[512];
    struct epoll_event ev;

    n->sub = start_connect(n, why, sizeof(why));
    if (!n->sub) {
        n->sub_retry_at = dlock__now_ms() + SUB_RETRY_MS;
        return;
    }
    n->sub_connecting = 1;
    n->sub_login = dlock__redis_append_login(n->sub, &rs->cfg);
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.u32 = (uint32_t)n->idx;
    if (epoll_ctl(rs->epfd, EPOLL_CTL_ADD, n->sub->fd, &ev) != 0) {
        redisFree(n->sub);
        n->sub = NULL;
        n->sub_connecting = 0;
        n->sub_retry_at = dlock__now_ms() + SUB_RETRY_MS;
    }
}

static void sub_send(rl_store *rs, rnode *n, rchan *ch, int subscribe)
{
    const char *argv[2] = {subscribe ? "SUBSCRIBE" : "UNSUBSCRIBE", ch->name};
    size_t lens[2] = {strlen(argv[0]), ch->len};

    if (redisAppendCommandArgv(n->sub, 2, argv, lens) != REDIS_OK) {
        sub_drop(rs, n);
        return;
    }
    ch->want[n->idx] = subscribe;
    ch->outstanding[n->idx]++;
    sub_flush(rs, n);
}

/* One reply on node n's subscriber connection. */
static void sub_reply(rl_store *rs, rnode *n, redisReply *r)
{
    if (n->sub_login > 0) {
        n->sub_login--;
        if (r->type == REDIS_REPLY_ERROR) {
            sub_drop(rs, n);
            return;
        }
        if (n->sub_login == 0) {
            n->sub_up = 1;
            pthread_cond_broadcast(&rs->sub_cv);
        }
        return;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_STRING)
        return;
    const char *kind = r->element[0]->str;
    const char *name = r->element[1]->str;
    size_t len = r->element[1]->len;
    rchan *ch = NULL;

    for (rchan *c = rs->chans; c; c = c->next)
        if (c->len == len && !memcmp(c->name, name, len))
            ch = c;
    if (!ch)
        return;
    if (!strcmp(kind, "message") && r->element[2]->type == REDIS_REPLY_STRING) {
        const redisReply *m = r->element[2];
        /* one release arrives once per node it freed */
        if (m->len < sizeof(ch->last) && strlen(ch->last) == m->len &&
            !memcmp(ch->last, m->str, m->len))
            return;
        snprintf(ch->last, sizeof(ch->last), "%.*s", (int)m->len, m->str);
        ch->last_at = dlock__now_ms();
        /* P{NAME}:w:DB -> NAME */
        const char *end = name + len;
        while (end > name && *--end != '}')
            ;
        if (end > name + rs->cfg.prefix_len + 1)
            dlock__notify_name(rs->client, name + rs->cfg.prefix_len + 1,
                               (size_t)(end - name) - rs->cfg.prefix_len - 1);
    } else if (!strcmp(kind, "subscribe") || !strcmp(kind, "unsubscribe")) {
        if (ch->outstanding[n->idx] > 0)
            ch->outstanding[n->idx]--;
        chan_free_if_idle(rs, ch);
        pthread_cond_broadcast(&rs->sub_cv);
    }
}

static void sub_io(rl_store *rs, rnode *n, uint32_t events)
{
    if (!n->sub)
        return;
    if (n->sub_connecting) {
        if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            return;
        if (connect_result(n->sub->fd) != 0) {
            sub_drop(rs, n);
            return;
        }
        n->sub_connecting = 0;
        if (n->sub_login == 0) {
            n->sub_up = 1;
            pthread_cond_broadcast(&rs->sub_cv);
        }
        n->sub_wout = 1; /* so that sub_flush() updates the interest */
    }
    sub_flush(rs, n);
    if (!n->sub || !(events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
        return;
    if (redisBufferRead(n->sub) != REDIS_OK) {
        sub_drop(rs, n);
        return;
    }
    for (;;) {
        redisReply *r = NULL;
        if (redisGetReplyFromReader(n->sub, (void **)&r) != REDIS_OK) {
            sub_drop(rs, n);
            return;
        }
        if (!r)
            return;
        sub_reply(rs, n, r);
        freeReplyObject(r);
        if (!n->sub)
            return;
    }
}

static int rl_loop_fd(void *st)
{
    return ((rl_store *)st)->epfd;
}

static void rl_loop_run(void *st, int readable)
{
    rl_store *rs = st;
    struct epoll_event evs[MAX_NODES];

    if (!readable)
        return;
    pthread_mutex_lock(&rs->sub_mu);
    int k = epoll_wait(rs->epfd, evs, MAX_NODES, 0);
    for (int i = 0; i < k; i++)
        if (evs[i].data.u32 < (uint32_t)rs->n)
            sub_io(rs, &rs->nodes[evs[i].data.u32], evs[i].events);
    pthread_mutex_unlock(&rs->sub_mu);
}

/* Subscribes on enough nodes (N - Q + 1) that every quorum shares one of
 * them with us, and waits for their confirmations. */
static int rl_arm(void *st, dlock__lease *l, int64_t op_deadline)
{
    rl_store *rs = st;
    rl_lease *rl = l->priv;
    int need = rs->n - rs->quorum + 1;
    int rc = DLOCK_OK;

    pthread_mutex_lock(&rs->sub_mu);
    if (!rl->chan) {
        char wake[DLOCK__REDIS_KEY_MAX];
        size_t wl = dlock__redis_wake_key(&rs->cfg, l->name, l->name_len, wake);
        rl->chan = chan_get(rs, wake, wl);
        if (!rl->chan) {
            pthread_mutex_unlock(&rs->sub_mu);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
        rl->chan->refs++;
    }
    rchan *ch = rl->chan;
    for (;;) {
        int64_t now = dlock__now_ms();
        int confirmed = 0, possible = 0;
        for (int i = 0; i < rs->n; i++) {
            rnode *n = &rs->nodes[i];
            if (!n->sub && now >= n->sub_retry_at)
                sub_start(rs, n);
            if (n->sub && !ch->want[i])
                sub_send(rs, n, ch, 1);
            if (!n->sub)
                continue;
            possible++;
            confirmed += n->sub_up && ch->want[i] && !ch->outstanding[i];
        }
        if (confirmed >= need)
            break;
        if (possible < need || now >= op_deadline) {
            rc = dlock__err(DLOCK_ECONN,
                            "%s: lock '%.100s': release notifications "
                            "confirmed by %d of %d nodes (%d needed so that "
                            "every quorum includes one)",
                            rs->where, l->name, confirmed, rs->n, need);
            break;
        }
        dlock__cond_wait_until(&rs->sub_cv, &rs->sub_mu, op_deadline);
    }
    pthread_mutex_unlock(&rs->sub_mu);
    return rc;
}

static void rl_disarm(void *st, dlock__lease *l, int acquired)
{
    rl_store *rs = st;
    rl_lease *rl = l->priv;

    (void)acquired;
    pthread_mutex_lock(&rs->sub_mu);
    rchan *ch = rl->chan;
    rl->chan = NULL;
    if (ch && ch->refs == 1) {
        /* still referenced while UNSUBSCRIBE goes out, so that a
         * connection dropped meanwhile cannot free it */
        for (int i = 0; i < rs->n; i++) {
            rnode *n = &rs->nodes[i];
            if (n->sub && ch->want[i])
                sub_send(rs, n, ch, 0);
        }
    }
    if (ch && --ch->refs == 0)
        chan_free_if_idle(rs, ch);
    pthread_mutex_unlock(&rs->sub_mu);
}

/* ------------------------------------------------------------------------ */
/* Open and close                                                           */
/* ------------------------------------------------------------------------ */

static void rl_close(void *st)
{
    rl_store *rs = st;

    if (!rs)
        return;
    for (int i = 0; i < rs->n; i++) {
        rnode *n = &rs->nodes[i];
        node_drop(n);
        if (n->sub)
            redisFree(n->sub);
        free(n->host);
    }
    while (rs->chans) {
        rchan *ch = rs->chans;
        rs->chans = ch->next;
        free(ch->name);
        free(ch->want);
        free(ch);
    }
    if (rs->epfd >= 0)
        close(rs->epfd);
    free(rs->nodes);
    pthread_mutex_destroy(&rs->mu);
    pthread_mutex_destroy(&rs->sub_mu);
    pthread_cond_destroy(&rs->sub_cv);
    dlock__redis_config_free(&rs->cfg);
    free(rs);
}

static int parse_config(rl_store *rs, const dlock__uri *u)
{
    static const char *const params[] = {"prefix",       "timeout",
                                         "db",           "node_timeout",
                                         "drift_factor", "drift_ms",
                                         NULL};
    const char *db = dlock__uri_param(u, "db");
    const char *nt = dlock__uri_param(u, "node_timeout");
    const char *df = dlock__uri_param(u, "drift_factor");
    const char *dm = dlock__uri_param(u, "drift_ms");
    long long v;
    int rc = dlock__uri_check_params(u, params);

    if (rc)
        return rc;
    if (u->nhosts < 1 || u->nhosts > MAX_NODES)
        return dlock__err(DLOCK_EINVAL,
                          "redlock:// needs 1 to %d nodes: "
                          "redlock://host:port,host:port,...",
                          MAX_NODES);
    if (u->path[0] && strcmp(u->path, "/") != 0) {
        if (db)
            return dlock__err(DLOCK_EINVAL,
                              "redlock://: give the database in the path "
                              "or as ?db=, not both");
        db = u->path + 1;
    }
    rc = dlock__redis_config_parse(&rs->cfg, u, "redlock", db);
    if (rc)
        return rc;
    if (nt) {
        if (dlock__parse_int(nt, 60000, &v) != 0 || v == 0)
            return dlock__err(DLOCK_EINVAL,
                              "redlock: node_timeout must be milliseconds "
                              "(1..60000), not '%.40s'",
                              nt);
        rs->node_timeout = v;
    }
    if (df) {
        char *end;
        errno = 0;
        double d = strtod(df, &end);
        if (errno || end == df || *end || !(d >= 0 && d <= 0.5))
            return dlock__err(DLOCK_EINVAL,
                              "redlock: drift_factor must be a fraction "
                              "between 0 and 0.5, not '%.40s'",
                              df);
        rs->drift_factor = d;
    }
    if (dm) {
        if (dlock__parse_int(dm, 60000, &v) != 0)
            return dlock__err(DLOCK_EINVAL,
                              "redlock: drift_ms must be milliseconds "
                              "(0..60000), not '%.40s'",
                              dm);
        rs->drift_ms = v;
    }
    rs->n = (int)u->nhosts;
    rs->quorum = rs->n / 2 + 1;
    rs->nodes = calloc((size_t)rs->n, sizeof(rnode));
    if (!rs->nodes)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    for (int i = 0; i < rs->n; i++) {
        rnode *n = &rs->nodes[i];
        n->idx = i;
        if (!(n->host = strdup(u->hosts[i].host)))
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        n->port = u->hosts[i].port ? u->hosts[i].port : DEFAULT_PORT;
        for (int k = 0; k < i; k++)
            if (rs->nodes[k].port == n->port &&
                strcasecmp(rs->nodes[k].host, n->host) == 0)
                return dlock__err(DLOCK_EINVAL,
                                  "redlock: node %.200s:%d is listed twice "
                                  "(each node must count once towards the "
                                  "quorum)",
                                  n->host, n->port);
        snprintf(n->where, sizeof(n->where),
                 strchr(n->host, ':') ? "redis [%.200s]:%d"
                                      : "redis %.200s:%d",
                 n->host, n->port);
    }
    snprintf(rs->where, sizeof(rs->where), "redlock (%d nodes)", rs->n);
    return DLOCK_OK;
}

/* Every node answered its login and script loads, or failed. */
static int all_set_up(const rl_store *rs, void *arg)
{
    (void)arg;
    for (int i = 0; i < rs->n; i++)
        if (node_busy(&rs->nodes[i]))
            return 0;
    return 1;
}

static int quorum_set_up(const rl_store *rs, void *arg)
{
    int ready = 0;

    (void)arg;
    for (int i = 0; i < rs->n; i++) {
        const rnode *n = &rs->nodes[i];
        ready += n->ctx && !n->rc && !n->connecting && n->setup == 0;
    }
    return ready >= rs->quorum || all_set_up(rs, NULL);
}

static int rl_open(void **out, dlock_client *c, const dlock__uri *u,
                   int64_t timeout_ms)
{
    rl_store *rs = calloc(1, sizeof(*rs));
    int rc;

    if (!rs)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    rs->client = c;
    rs->epfd = -1;
    rs->node_timeout = DEFAULT_NODE_TIMEOUT_MS;
    rs->drift_factor = DEFAULT_DRIFT_FACTOR;
    rs->drift_ms = DEFAULT_DRIFT_MS;
    rs->cfg.timeout_ms = timeout_ms;
    pthread_mutex_init(&rs->mu, NULL);
    pthread_mutex_init(&rs->sub_mu, NULL);
    rc = dlock__cond_init(&rs->sub_cv);
    if (rc) {
        pthread_mutex_destroy(&rs->mu);
        pthread_mutex_destroy(&rs->sub_mu);
        free(rs);
        return rc;
    }
    rc = parse_config(rs, u);
    if (rc == DLOCK_OK) {
        rs->epfd = epoll_create1(EPOLL_CLOEXEC);
        if (rs->epfd < 0)
            rc = dlock__err(DLOCK_ENOMEM, "epoll_create1: %s",
                            strerror(errno));
    }
    if (rc == DLOCK_OK) {
        /* connect to every node at once; a quorum must answer */
        pthread_mutex_lock(&rs->mu);
        int64_t now = dlock__now_ms();
        round_begin(rs);
        for (int i = 0; i < rs->n; i++)
            node_connect(rs, &rs->nodes[i], now);
        round_run(rs, now + rs->cfg.timeout_ms, quorum_set_up, NULL);
        round_run(rs, dlock__now_ms() + rs->node_timeout, all_set_up, NULL);
        int ready = 0;
        for (int i = 0; i < rs->n; i++) {
            rnode *n = &rs->nodes[i];
            ready += n->ctx && !n->rc && !n->connecting && n->setup == 0;
        }
        if (ready < rs->quorum || rs->sha_known != (1 << NSCRIPTS) - 1)
            rc = quorum_failure(rs, ready, "cannot connect");
        pthread_mutex_unlock(&rs->mu);
    }
    if (rc) {
        rl_close(rs);
        return rc;
    }
    *out = rs;
    return DLOCK_OK;
}

static int64_t rl_margin(void *st, int64_t ttl_ms)
{
    return margin(st, ttl_ms);
}

const dlock__backend dlock__backend_redlock = {
    "redlock",          /* name */
    DLOCK__CAP_LEASE,   /* caps */
    sizeof(rl_lease),   /* lease_size */
    rl_open,            /* open */
    rl_close,           /* close */
    rl_acquire,         /* acquire */
    rl_arm,             /* arm */
    rl_disarm,          /* disarm */
    rl_release,         /* release */
    rl_extend,          /* extend */
    rl_inspect,         /* inspect */
    rl_loop_fd,         /* loop_fd */
    rl_loop_run,        /* loop_run */
    NULL,               /* gc */
    NULL,               /* select */
    rl_margin,          /* margin */
    NULL, /* abandon */
    NULL, /* extend_many */
};
