/*
 * redis.c -- the Redis store (redis:// and unix://), over hiredis.
 *
 * Keys of lock NAME with prefix P (default "dlock:"), all sharing the
 * Redis Cluster hash tag {NAME}:
 *   P{NAME}       string "OWNER TOKEN ACQUIRED_MS DESCRIPTION"; its PEXPIRE
 *                 is the lease
 *   P{NAME}:f     the fencing counter (INCR), never expires
 *   P{NAME}:q     fair queue: zset of waiters scored by arrival
 *   P{NAME}:qd    fair queue: zset of the same waiters scored by the server
 *                 time after which a silent waiter is presumed dead
 * Channels:
 *   P{NAME}:w:DB  release notifications for default-mode waiters
 *   Pc:CLIENTID   one per client: "your turn" for its fair waiters
 * A name may hold any bytes: keys are sent binary-safe, and since no key
 * suffix contains '}', two names can never produce the same key, and all
 * keys of one name always hash to one cluster slot.
 *
 * Every state change is one Lua script, so it is atomic: acquire (fresh
 * acquisition bumps the fencing counter in the same script), release
 * (compare-and-delete, then publish), extend (compare-and-pexpire).
 * Fencing token: INCR of the counter; a counter that is new (or was lost
 * in a restart without persistence) starts from the server clock in
 * microseconds, so tokens keep growing across such a restart.
 *
 * Connections: one command connection per client (guarded by cmd_mu) and,
 * once something waits, one subscriber connection per client, read by the
 * client's background thread. Waiters write SUBSCRIBE themselves under
 * sub_mu and wait for the acknowledgement before their next try.
 */
#include "redis_conn.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#define DEFAULT_PORT 6379
#define PREFIX_MAX DLOCK__REDIS_PREFIX_MAX
#define KEY_MAX DLOCK__REDIS_KEY_MAX
#define QUEUE_GRACE_MS 2000 /* how late a live fair waiter may re-check */
#define NO_TTL_RETRY_MS 1000
#define MIN_IO_MS 10

/* ------------------------------------------------------------------------ */
/* Scripts                                                                  */
/* ------------------------------------------------------------------------ */

enum { S_ACQUIRE, S_RELEASE, S_EXTEND, S_INSPECT, NSCRIPTS };

/* The lock key's value is "OWNER TOKEN ACQUIRED_MS DESCRIPTION"; scripts
 * get the owner with its trailing space, so one prefix comparison checks
 * ownership. */

/* KEYS: lock, fence, queue, queue deadlines.
 * ARGV: "owner ", ttl, desc, fair(0/1), waiter id, enqueue(0/1), grace.
 * Returns {1, token} or {0, ms to wait before re-trying (-1: no expiry)}.
 * The uncontended path is SET NX PX + INCR + TIME + APPEND. */
static const char acquire_lua[] =
    "local lock, fence, q, qd = KEYS[1], KEYS[2], KEYS[3], KEYS[4]\n"
    "local owner, ttl, desc = ARGV[1], ARGV[2], ARGV[3]\n"
    "local fair, me, enq = ARGV[4] == '1', ARGV[5], ARGV[6] == '1'\n"
    /* a fresh hold: the lock key is ours; bump the fencing counter (a new
     * or lost counter continues from the server clock in microseconds, so
     * tokens keep growing even after a restart without persistence) */
    DLOCK__REDIS_LUA_TAKE
    "local function won()\n"
    "  local t, err = take()\n"
    "  if err then return err end\n"
    "  return {1, t}\n"
    "end\n"
    "local head = false\n"
    "local now\n"
    "if not fair then\n"
    "  if redis.call('SET', lock, owner, 'NX', 'PX', ttl) then return won() "
    "end\n"
    "else\n"
    "  local tm = redis.call('TIME')\n"
    "  now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)\n"
    "  local dead = redis.call('ZRANGEBYSCORE', qd, '-inf', now, 'LIMIT', 0, "
    "64)\n"
    "  for i = 1, #dead do\n"
    "    redis.call('ZREM', q, dead[i])\n"
    "    redis.call('ZREM', qd, dead[i])\n"
    "  end\n"
    "  head = redis.call('ZRANGE', q, 0, 0)[1] or false\n"
    "  if redis.call('EXISTS', lock) == 0 and (not head or head == me) then\n"
    "    redis.call('SET', lock, owner, 'PX', ttl)\n"
    "    if head then\n"
    "      redis.call('ZREM', q, me)\n"
    "      redis.call('ZREM', qd, me)\n"
    "    end\n"
    "    return won()\n"
    "  end\n"
    "end\n"
    "local v = redis.call('GET', lock)\n"
    "local wait\n"
    "if v then\n"
    "  if string.sub(v, 1, #owner) == owner then\n"
    /* ours already: the reply to an earlier try was lost; adopt it */
    "    redis.call('PEXPIRE', lock, ttl)\n"
    "    return {1, string.match(v, '^%S+ (%d+)')}\n"
    "  end\n"
    "  if not string.match(v, " DLOCK__REDIS_LUA_OURS_PATTERN ") then\n"
    "    return redis.error_reply('DLOCKFOREIGN the lock key holds a value "
    "not written by dlock')\n"
    "  end\n"
    "  wait = redis.call('PTTL', lock)\n"
    "elseif head then\n"
    "  wait = tonumber(redis.call('ZSCORE', qd, head)) - now\n"
    "  if wait < 0 then wait = 0 end\n"
    "else\n"
    "  wait = -2\n" /* it vanished just now: try again at once */
    "end\n"
    "if fair and enq then\n"
    "  if not redis.call('ZSCORE', q, me) then\n"
    "    local last = redis.call('ZRANGE', q, -1, -1, 'WITHSCORES')\n"
    "    local s = 1\n"
    "    if last[2] then s = tonumber(last[2]) + 1 end\n"
    "    redis.call('ZADD', q, s, me)\n"
    "  end\n"
    "  local life = tonumber(ARGV[7])\n"
    "  if wait > 0 then life = life + wait end\n"
    "  redis.call('ZADD', qd, now + life, me)\n"
    "  if redis.call('PTTL', q) < life then\n"
    "    redis.call('PEXPIRE', q, life)\n"
    "    redis.call('PEXPIRE', qd, life)\n"
    "  end\n"
    "end\n"
    "return {0, wait}\n";

/* KEYS: lock, queue, queue deadlines.
 * ARGV: "owner " (release) or waiter id (abandon), wake channel, client
 * channel prefix, mode ('release' or 'abandon').
 * Release: compare-and-delete, publish on the wake channel. Abandon: leave
 * the queue. Both then tell the fair queue's head (if any, and if the lock
 * is free) that it is its turn. Returns 1, or 0 when the lock was not ours. */
static const char release_lua[] =
    "local lock, q, qd = KEYS[1], KEYS[2], KEYS[3]\n"
    "if ARGV[4] == 'abandon' then\n"
    "  redis.call('ZREM', q, ARGV[1])\n"
    "  redis.call('ZREM', qd, ARGV[1])\n"
    "  if redis.call('EXISTS', lock) == 1 then return 1 end\n"
    "else\n"
    "  local v = redis.call('GET', lock)\n"
    "  if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end\n"
    "  redis.call('DEL', lock)\n"
    "  redis.call('PUBLISH', ARGV[2], 'r')\n"
    "end\n"
    "if redis.call('EXISTS', q) == 1 then\n"
    "  local tm = redis.call('TIME')\n"
    "  local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / "
    "1000)\n"
    "  local dead = redis.call('ZRANGEBYSCORE', qd, '-inf', now, 'LIMIT', 0, "
    "64)\n"
    "  for i = 1, #dead do\n"
    "    redis.call('ZREM', q, dead[i])\n"
    "    redis.call('ZREM', qd, dead[i])\n"
    "  end\n"
    "  local head = redis.call('ZRANGE', q, 0, 0)[1]\n"
    "  if head then\n"
    "    local c = string.find(head, ':', 1, true)\n"
    "    local s = string.find(head, ' ', 1, true)\n"
    "    if c and s then\n"
    "      redis.call('PUBLISH', ARGV[3] .. string.sub(head, 1, c - 1),\n"
    "                 string.sub(head, c + 1, s - 1))\n"
    "    end\n"
    "  end\n"
    "end\n"
    "return 1\n";

/* KEYS: lock. ARGV: "owner ", ttl. 1 if extended, 0 if not ours. */
static const char extend_lua[] =
    "local v = redis.call('GET', KEYS[1])\n"
    "if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then\n"
    "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    "  return 1\n"
    "end\n"
    "return 0\n";

/* KEYS: lock, fence, queue. Returns {server ms, lock value, pttl, fence,
 * queue length, first 100 queue entries}. */
static const char inspect_lua[] =
    "local tm = redis.call('TIME')\n"
    "local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / "
    "1000)\n"
    "local v = redis.call('GET', KEYS[1])\n"
    "local pttl = redis.call('PTTL', KEYS[1])\n"
    "local f = redis.call('GET', KEYS[2])\n"
    "local qn = redis.call('ZCARD', KEYS[3])\n"
    "local q = redis.call('ZRANGE', KEYS[3], 0, 99)\n"
    "return {now, v, pttl, f, qn, q}\n";

static const char *const script_text[NSCRIPTS] = {acquire_lua, release_lua,
                                                  extend_lua, inspect_lua};

/* ------------------------------------------------------------------------ */
/* State                                                                    */
/* ------------------------------------------------------------------------ */

/* One channel of the subscriber connection. Replies to (UN)SUBSCRIBE come
 * back in order, so a channel is truly subscribed once every command sent
 * for it has been answered and the last one was SUBSCRIBE. */
typedef struct chan {
    char *name;
    size_t len;
    int refs;        /* waiters relying on it */
    int want;        /* the last command sent was SUBSCRIBE */
    int outstanding; /* commands sent, not yet answered */
    struct chan *next;
} chan;

typedef struct redis_store {
    dlock_client *client;
    char *host; /* NULL for unix:// */
    int port;
    char *path; /* unix socket */
    dlock__redis_config cfg; /* prefix, db, timeout, credentials */
    char where[320]; /* "redis 127.0.0.1:6379", for messages */

    dlock__rconn_target target; /* how to connect (both connections) */
    dlock__rconn *conn;         /* the pipelined command connection */

    pthread_mutex_t sub_mu;
    pthread_cond_t sub_cv;
    redisContext *sub;
    int sub_connecting;
    chan *chans;
    chan *mine; /* the client channel, once created */
} redis_store;

typedef struct redis_lease {
    chan *chan;  /* the channel this waiting lease armed */
    int queued;  /* it may sit in a fair queue */
} redis_lease;

typedef struct keyset {
    char lock[KEY_MAX], fence[KEY_MAX], q[KEY_MAX], qd[KEY_MAX], wake[KEY_MAX];
    size_t lock_len, fence_len, q_len, qd_len, wake_len;
} keyset;

static void make_keys(const redis_store *rs, keyset *k, const char *name,
                      size_t len)
{
    k->lock_len = dlock__redis_key(&rs->cfg, name, len, "", k->lock);
    k->fence_len = dlock__redis_key(&rs->cfg, name, len, ":f", k->fence);
    k->q_len = dlock__redis_key(&rs->cfg, name, len, ":q", k->q);
    k->qd_len = dlock__redis_key(&rs->cfg, name, len, ":qd", k->qd);
    k->wake_len = dlock__redis_wake_key(&rs->cfg, name, len, k->wake);
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

static int server_error(const redis_store *rs, const char *msg,
                        const char *lock)
{
    return dlock__redis_server_error(rs->where, rs->cfg.password, msg, lock);
}

/* ------------------------------------------------------------------------ */
/* Subscriber connection                                                    */
/* ------------------------------------------------------------------------ */

/* Sends what the subscriber context has buffered, without SIGPIPE. */
static int send_all(const redis_store *rs, redisContext *ctx)
{
    int r = dlock__redis_send(ctx);

    if (r == 1)
        return DLOCK_OK;
    if (r == 0)
        return dlock__err(DLOCK_ECONN, "%s: no answer within %lld ms",
                          rs->where, (long long)rs->cfg.timeout_ms);
    return dlock__err(DLOCK_ECONN, "%s: %s", rs->where, strerror(errno));
}

static chan *chan_get(redis_store *rs, const char *name, size_t len)
{
    for (chan *ch = rs->chans; ch; ch = ch->next)
        if (ch->len == len && memcmp(ch->name, name, len) == 0)
            return ch;
    chan *ch = calloc(1, sizeof(*ch));
    if (!ch || !(ch->name = malloc(len + 1))) {
        free(ch);
        return NULL;
    }
    memcpy(ch->name, name, len);
    ch->name[len] = '\0';
    ch->len = len;
    ch->next = rs->chans;
    rs->chans = ch;
    return ch;
}

static void chan_free_if_idle(redis_store *rs, chan *ch)
{
    if (ch->refs > 0 || ch->outstanding > 0 || ch->want)
        return;
    for (chan **pp = &rs->chans; *pp; pp = &(*pp)->next) {
        if (*pp == ch) {
            *pp = ch->next;
            break;
        }
    }
    if (rs->mine == ch)
        rs->mine = NULL;
    free(ch->name);
    free(ch);
}

/* Sends (UN)SUBSCRIBE for ch on the subscriber connection; sub_mu held. */
static int sub_send(redis_store *rs, chan *ch, int subscribe)
{
    const char *argv[2] = {subscribe ? "SUBSCRIBE" : "UNSUBSCRIBE", ch->name};
    size_t lens[2] = {strlen(argv[0]), ch->len};
    int rc;

    redisAppendCommandArgv(rs->sub, 2, argv, lens);
    rc = send_all(rs, rs->sub);
    if (rc)
        return rc;
    ch->want = subscribe;
    ch->outstanding++;
    return DLOCK_OK;
}

/* The subscriber connection failed: forget it and every subscription, and
 * tell the waiters to re-arm. sub_mu held. */
static void sub_lost(redis_store *rs)
{
    if (rs->sub) {
        redisFree(rs->sub);
        rs->sub = NULL;
    }
    for (chan *ch = rs->chans, *next; ch; ch = next) {
        next = ch->next;
        ch->want = 0;
        ch->outstanding = 0;
        chan_free_if_idle(rs, ch);
    }
    pthread_cond_broadcast(&rs->sub_cv);
    dlock__notify_error(rs->client);
}

/* Makes sure `ch` is subscribed, connecting the subscriber if needed.
 * sub_mu held (dropped while connecting). */
static int sub_ensure(redis_store *rs, chan *ch, int64_t deadline)
{
    for (;;) {
        if (rs->sub && ch->want && ch->outstanding == 0)
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
            int rc;

            rs->sub_connecting = 1;
            pthread_mutex_unlock(&rs->sub_mu);
            rc = dlock__rconn_connect(&rs->target, 0, NULL, deadline, &ctx);
            pthread_mutex_lock(&rs->sub_mu);
            rs->sub_connecting = 0;
            pthread_cond_broadcast(&rs->sub_cv);
            if (rc)
                return rc;
            rs->sub = ctx;
            dlock__loop_wake(rs->client); /* poll the new fd */
        }
        if (!ch->want) {
            int rc = sub_send(rs, ch, 1);
            if (rc) {
                sub_lost(rs);
                return rc;
            }
        }
        dlock__cond_wait_until(&rs->sub_cv, &rs->sub_mu, deadline);
    }
}

/* One reply on the subscriber connection; sub_mu held. */
static void sub_reply(redis_store *rs, redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_STRING)
        return;
    const char *kind = r->element[0]->str;
    const char *name = r->element[1]->str;
    size_t len = r->element[1]->len;

    if (!strcmp(kind, "message") && r->element[2]->type == REDIS_REPLY_STRING) {
        if (rs->mine && len == rs->mine->len &&
            !memcmp(name, rs->mine->name, len)) {
            dlock__notify_waiter(rs->client,
                                 strtoull(r->element[2]->str, NULL, 10));
        } else if (len > rs->cfg.prefix_len + 2 && name[rs->cfg.prefix_len] == '{') {
            /* P{NAME}:w:DB -> NAME */
            const char *end = name + len;
            while (end > name && *--end != '}')
                ;
            if (end > name + rs->cfg.prefix_len)
                dlock__notify_name(rs->client, name + rs->cfg.prefix_len + 1,
                                   (size_t)(end - name) - rs->cfg.prefix_len - 1);
        }
        return;
    }
    if (!strcmp(kind, "subscribe") || !strcmp(kind, "unsubscribe")) {
        for (chan *ch = rs->chans; ch; ch = ch->next) {
            if (ch->len == len && !memcmp(ch->name, name, len)) {
                if (ch->outstanding > 0)
                    ch->outstanding--;
                chan_free_if_idle(rs, ch);
                pthread_cond_broadcast(&rs->sub_cv);
                break;
            }
        }
    }
}

static int redis_loop_fd(void *st)
{
    redis_store *rs = st;
    int fd;

    pthread_mutex_lock(&rs->sub_mu);
    fd = rs->sub ? rs->sub->fd : -1;
    pthread_mutex_unlock(&rs->sub_mu);
    return fd;
}

static void redis_loop_run(void *st, int readable)
{
    redis_store *rs = st;

    if (!readable)
        return;
    pthread_mutex_lock(&rs->sub_mu);
    if (rs->sub) {
        if (redisBufferRead(rs->sub) != REDIS_OK) {
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
}

/* ------------------------------------------------------------------------ */
/* Backend slots                                                            */
/* ------------------------------------------------------------------------ */

/* The owner as the scripts compare it: followed by a space. */
static size_t owner_sp(const dlock__lease *l, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s ", l->owner);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* The fair-queue member of a waiting lease: "<client id>:<waiter> <desc>". */
static size_t waiter_id(redis_store *rs, const dlock__lease *l, char *out,
                        size_t cap)
{
    int n = snprintf(out, cap, "%s:%" PRIu64 " %s",
                     dlock__client_id(rs->client), l->waiter, l->desc);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

static int redis_acquire(void *st, dlock__lease *l, int64_t deadline)
{
    redis_store *rs = st;
    redis_lease *rl = l->priv;
    keyset k;
    char ttl[24], grace[24], me[256], owner[80];
    size_t me_len = 0, owner_len = owner_sp(l, owner, sizeof(owner));
    int fair = (l->flags & DLOCK_FAIR) != 0;
    int enqueue = fair && l->waiting;
    redisReply *r;
    rcmd c;
    int rc;

    make_keys(rs, &k, l->name, l->name_len);
    snprintf(ttl, sizeof(ttl), "%lld", (long long)l->ttl_ms);
    snprintf(grace, sizeof(grace), "%d", QUEUE_GRACE_MS);
    if (fair)
        me_len = waiter_id(rs, l, me, sizeof(me));
    rcmd_evalsha(&c, S_ACQUIRE, 4);
    rcmd_arg(&c, k.lock, k.lock_len);
    rcmd_arg(&c, k.fence, k.fence_len);
    rcmd_arg(&c, k.q, k.q_len);
    rcmd_arg(&c, k.qd, k.qd_len);
    rcmd_arg(&c, owner, owner_len);
    rcmd_str(&c, ttl);
    rcmd_str(&c, l->desc);
    rcmd_str(&c, fair ? "1" : "0");
    rcmd_arg(&c, fair ? me : "", me_len);
    rcmd_str(&c, enqueue ? "1" : "0");
    rcmd_str(&c, grace);
    if (enqueue)
        rl->queued = 1;

    rc = dlock__rconn_run(rs->conn, &c, 1, &r, deadline);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ERROR) {
        rc = server_error(rs, r->str, l->name);
    } else if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
               r->element[0]->type != REDIS_REPLY_INTEGER) {
        rc = dlock__err(DLOCK_EPROTO, "%s: unexpected answer to acquire",
                        rs->where);
    } else if (r->element[0]->integer == 1) {
        if (dlock__redis_reply_uint(r->element[1], &l->token) != 0 || l->token == 0)
            rc = dlock__err(DLOCK_EPROTO,
                            "%s: lock '%.100s': bad fencing token in the "
                            "store",
                            rs->where, l->name);
    } else {
        long long wait = r->element[1]->type == REDIS_REPLY_INTEGER
                             ? r->element[1]->integer
                             : -2;
        /* -1: the key has no expiry (not set by dlock): look again now and
         * then; -2: it vanished meanwhile: try again at once. */
        l->retry_ms = wait >= 0 ? wait : wait == -2 ? 0 : NO_TTL_RETRY_MS;
        rc = DLOCK_EBUSY;
    }
    freeReplyObject(r);
    return rc;
}

static int release_script(redis_store *rs, const dlock__lease *l,
                          const char *who, size_t who_len, const char *mode,
                          int64_t deadline, long long *result)
{
    keyset k;
    char cprefix[PREFIX_MAX + 4];
    redisReply *r;
    rcmd c;
    int rc;

    make_keys(rs, &k, l->name, l->name_len);
    snprintf(cprefix, sizeof(cprefix), "%sc:", rs->cfg.prefix);
    rcmd_evalsha(&c, S_RELEASE, 3);
    rcmd_arg(&c, k.lock, k.lock_len);
    rcmd_arg(&c, k.q, k.q_len);
    rcmd_arg(&c, k.qd, k.qd_len);
    rcmd_arg(&c, who, who_len);
    rcmd_arg(&c, k.wake, k.wake_len);
    rcmd_str(&c, cprefix);
    rcmd_str(&c, mode);
    rc = dlock__rconn_run(rs->conn, &c, 1, &r, deadline);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ERROR)
        rc = server_error(rs, r->str, l->name);
    else if (r->type != REDIS_REPLY_INTEGER)
        rc = dlock__err(DLOCK_EPROTO, "%s: unexpected answer to release",
                        rs->where);
    else
        *result = r->integer;
    freeReplyObject(r);
    return rc;
}

static int redis_release(void *st, dlock__lease *l, int64_t deadline)
{
    char owner[80];
    size_t n = owner_sp(l, owner, sizeof(owner));
    long long ok = 0;
    int rc = release_script(st, l, owner, n, "release", deadline, &ok);

    if (rc == DLOCK_OK && !ok)
        rc = dlock__err(DLOCK_ENOTHELD, "lock '%.100s' is not ours in the "
                                        "store",
                        l->name);
    return rc;
}

static int redis_extend(void *st, dlock__lease *l, int64_t ttl_ms,
                        int64_t deadline)
{
    redis_store *rs = st;
    keyset k;
    char ttl[24], owner[80];
    size_t owner_len = owner_sp(l, owner, sizeof(owner));
    redisReply *r;
    rcmd c;
    int rc;

    make_keys(rs, &k, l->name, l->name_len);
    snprintf(ttl, sizeof(ttl), "%lld", (long long)ttl_ms);
    rcmd_evalsha(&c, S_EXTEND, 1);
    rcmd_arg(&c, k.lock, k.lock_len);
    rcmd_arg(&c, owner, owner_len);
    rcmd_str(&c, ttl);
    rc = dlock__rconn_run(rs->conn, &c, 1, &r, deadline);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_ERROR)
        rc = server_error(rs, r->str, l->name);
    else if (r->type != REDIS_REPLY_INTEGER)
        rc = dlock__err(DLOCK_EPROTO, "%s: unexpected answer to extend",
                        rs->where);
    else if (r->integer != 1)
        rc = dlock__err(DLOCK_ENOTHELD, "lock '%.100s' is not ours in the "
                                        "store",
                        l->name);
    freeReplyObject(r);
    return rc;
}

static int redis_arm(void *st, dlock__lease *l, int64_t deadline)
{
    redis_store *rs = st;
    redis_lease *rl = l->priv;
    int rc;

    pthread_mutex_lock(&rs->sub_mu);
    if (!rl->chan) {
        if (l->flags & DLOCK_FAIR) {
            if (!rs->mine) {
                char name[PREFIX_MAX + 40];
                int n = snprintf(name, sizeof(name), "%sc:%s", rs->cfg.prefix,
                                 dlock__client_id(rs->client));
                rs->mine = chan_get(rs, name, (size_t)n);
                if (rs->mine)
                    rs->mine->refs++; /* kept for the client's life */
            }
            rl->chan = rs->mine;
        } else {
            keyset k;
            make_keys(rs, &k, l->name, l->name_len);
            rl->chan = chan_get(rs, k.wake, k.wake_len);
        }
        if (!rl->chan) {
            pthread_mutex_unlock(&rs->sub_mu);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
        rl->chan->refs++;
    }
    rc = sub_ensure(rs, rl->chan, deadline);
    pthread_mutex_unlock(&rs->sub_mu);
    return rc;
}

static void redis_disarm(void *st, dlock__lease *l, int acquired)
{
    redis_store *rs = st;
    redis_lease *rl = l->priv;

    if (rl->queued && !acquired) {
        /* leave the fair queue at once, so the next waiter need not wait
         * for our entry to expire */
        char me[256];
        size_t n = waiter_id(rs, l, me, sizeof(me));
        long long ignored;
        (void)release_script(rs, l, me, n, "abandon",
                             dlock__now_ms() + rs->cfg.timeout_ms, &ignored);
    }
    rl->queued = 0;
    pthread_mutex_lock(&rs->sub_mu);
    if (rl->chan) {
        chan *ch = rl->chan;
        rl->chan = NULL;
        if (--ch->refs == 0) {
            if (rs->sub && ch->want && sub_send(rs, ch, 0) != DLOCK_OK)
                sub_lost(rs);
            else
                chan_free_if_idle(rs, ch);
        }
    }
    pthread_mutex_unlock(&rs->sub_mu);
}

static char *dup_str(const char *s, size_t n)
{
    char *d = malloc(n + 1);

    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* Reads the answers to the inspect script (s) and to PUBSUB NUMSUB (ns)
 * into *out. Whatever the server sent (a value written by someone else,
 * numbers of any size) gives an answer or DLOCK_EPROTO. */
static int inspect_answer(const redis_store *rs, const char *name,
                          const redisReply *s, const redisReply *ns,
                          dlock_info *out)
{
    if (s->type == REDIS_REPLY_ERROR)
        return server_error(rs, s->str, name);
    if (s->type != REDIS_REPLY_ARRAY || s->elements != 6 ||
        s->element[0]->type != REDIS_REPLY_INTEGER ||
        s->element[5]->type != REDIS_REPLY_ARRAY)
        return dlock__err(DLOCK_EPROTO, "%s: unexpected answer to inspect",
                          rs->where);
    const redisReply *v = s->element[1];
    long long now = s->element[0]->integer;
    uint64_t tok;

    if (dlock__redis_reply_uint(s->element[3], &tok) == 0)
        out->token = tok;
    out->held = v->type == REDIS_REPLY_STRING;
    if (out->held) {
        /* "OWNER TOKEN ACQUIRED_MS DESCRIPTION" */
        unsigned long long t = 0, at = 0;
        int desc = 0;
        if (sscanf(v->str, "%*s %llu %llu %n", &t, &at, &desc) < 2 ||
            desc <= 0)
            return dlock__err(DLOCK_EPROTO,
                              "%s: a key of lock '%.100s' holds a value of "
                              "another type (not written by dlock)",
                              rs->where, name);
        out->token = t;
        snprintf(out->holder, sizeof(out->holder), "%.*s",
                 (int)(v->len - (size_t)desc), v->str + desc);
        if (now >= 0 && (unsigned long long)now >= at)
            out->held_ms = (int64_t)((unsigned long long)now - at);
        if (s->element[2]->type == REDIS_REPLY_INTEGER &&
            s->element[2]->integer >= 0)
            out->ttl_ms = s->element[2]->integer;
    }
    /* queued (fair) plus subscribed (default mode) waiters */
    if (s->element[4]->type == REDIS_REPLY_INTEGER &&
        s->element[4]->integer >= 0) {
        out->waiters = s->element[4]->integer;
        if (ns->type == REDIS_REPLY_ARRAY && ns->elements == 2 &&
            ns->element[1]->type == REDIS_REPLY_INTEGER &&
            ns->element[1]->integer > 0 &&
            ns->element[1]->integer <= INT64_MAX - out->waiters)
            out->waiters += ns->element[1]->integer;
    }

    const redisReply *q = s->element[5];
    if (q->elements > 0) {
        out->queue = calloc(q->elements, sizeof(char *));
        if (!out->queue)
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        for (size_t i = 0; i < q->elements; i++) {
            const redisReply *e = q->element[i];
            if (e->type != REDIS_REPLY_STRING)
                continue;
            const char *sp = memchr(e->str, ' ', e->len);
            const char *d = sp ? sp + 1 : e->str;
            size_t dl = e->len - (size_t)(d - e->str);
            out->queue[out->queue_len] = dup_str(d, dl);
            if (!out->queue[out->queue_len])
                return dlock__err(DLOCK_ENOMEM, "out of memory");
            out->queue_len++;
        }
    }
    return DLOCK_OK;
}

static int redis_inspect(void *st, const char *name, size_t len,
                         dlock_info *out, int64_t deadline)
{
    redis_store *rs = st;
    keyset k;
    redisReply *r[2];
    rcmd c[2];
    int rc;

    make_keys(rs, &k, name, len);
    rcmd_evalsha(&c[0], S_INSPECT, 3);
    rcmd_arg(&c[0], k.lock, k.lock_len);
    rcmd_arg(&c[0], k.fence, k.fence_len);
    rcmd_arg(&c[0], k.q, k.q_len);
    rcmd_plain(&c[1]);
    rcmd_str(&c[1], "PUBSUB");
    rcmd_str(&c[1], "NUMSUB");
    rcmd_arg(&c[1], k.wake, k.wake_len);
    rc = dlock__rconn_run(rs->conn, c, 2, r, deadline);
    if (rc)
        return rc;
    rc = inspect_answer(rs, name, r[0], r[1], out);
    freeReplyObject(r[0]);
    freeReplyObject(r[1]);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Open and close                                                           */
/* ------------------------------------------------------------------------ */

static void redis_close(void *st)
{
    redis_store *rs = st;

    if (!rs)
        return;
    dlock__rconn_free(rs->conn);
    if (rs->sub)
        redisFree(rs->sub);
    while (rs->chans) {
        chan *ch = rs->chans;
        rs->chans = ch->next;
        free(ch->name);
        free(ch);
    }
    pthread_mutex_destroy(&rs->sub_mu);
    pthread_cond_destroy(&rs->sub_cv);
    free(rs->host);
    free(rs->path);
    dlock__redis_config_free(&rs->cfg);
    free(rs);
}

static int parse_config(redis_store *rs, const dlock__uri *u)
{
    static const char *const params[] = {"prefix", "timeout", "db", NULL};
    const char *db = dlock__uri_param(u, "db");
    int rc = dlock__uri_check_params(u, params);

    if (rc)
        return rc;
    if (strcmp(u->scheme, "unix") == 0) {
        if (u->nhosts != 0 || u->path[0] != '/' || u->path[1] == '\0')
            return dlock__err(DLOCK_EINVAL,
                              "unix:// needs the socket's absolute path: "
                              "unix:///path/to/redis.sock");
        if (!(rs->path = strdup(u->path)))
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        snprintf(rs->where, sizeof(rs->where), "redis unix:%.250s",
                 rs->path);
    } else {
        if (u->nhosts != 1)
            return dlock__err(DLOCK_EINVAL,
                              u->nhosts ? "redis:// takes one host (for "
                                          "several, use redlock://)"
                                        : "redis:// needs a host: "
                                          "redis://host[:port]");
        if (!(rs->host = strdup(u->hosts[0].host)))
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        rs->port = u->hosts[0].port ? u->hosts[0].port : DEFAULT_PORT;
        snprintf(rs->where, sizeof(rs->where),
                 strchr(rs->host, ':') ? "redis [%.200s]:%d" : "redis %.200s:%d",
                 rs->host, rs->port);
        if (u->path[0] && strcmp(u->path, "/") != 0) {
            if (db)
                return dlock__err(DLOCK_EINVAL,
                                  "redis://: give the database in the path "
                                  "or as ?db=, not both");
            db = u->path + 1;
        }
    }
    return dlock__redis_config_parse(&rs->cfg, u, "redis", db);
}

static int redis_open(void **out, dlock_client *c, const dlock__uri *u,
                      int64_t timeout_ms)
{
    redis_store *rs = calloc(1, sizeof(*rs));
    int rc;

    if (!rs)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    rs->client = c;
    pthread_mutex_init(&rs->sub_mu, NULL);
    rc = dlock__cond_init(&rs->sub_cv);
    if (rc) {
        pthread_mutex_destroy(&rs->sub_mu);
        free(rs);
        return rc;
    }
    rs->cfg.timeout_ms = timeout_ms;
    rc = parse_config(rs, u);
    if (rc == DLOCK_OK) {
        rs->target.host = rs->host;
        rs->target.port = rs->port;
        rs->target.path = rs->path;
        rs->target.cfg = &rs->cfg;
        rs->target.where = rs->where;
        rs->target.scripts = script_text;
        rs->target.nscripts = NSCRIPTS;
        rc = dlock__rconn_open(&rs->conn, &rs->target,
                               dlock__now_ms() + rs->cfg.timeout_ms);
    }
    if (rc) {
        redis_close(rs);
        return rc;
    }
    *out = rs;
    return DLOCK_OK;
}

const dlock__backend dlock__backend_redis = {
    "redis",             /* name */
    DLOCK__CAP_LEASE,    /* caps */
    sizeof(redis_lease), /* lease_size */
    redis_open,          /* open */
    redis_close,         /* close */
    redis_acquire,       /* acquire */
    redis_arm,           /* arm */
    redis_disarm,        /* disarm */
    redis_release,       /* release */
    redis_extend,        /* extend */
    redis_inspect,       /* inspect */
    redis_loop_fd,       /* loop_fd */
    redis_loop_run,      /* loop_run */
    NULL,                /* gc */
    NULL,                /* select */
    NULL,                /* margin */
    NULL, /* abandon */
    NULL, /* extend_many */
};
