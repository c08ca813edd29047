/* SPDX-License-Identifier: MIT */
/*
 * redlock.c -- Redlock (redlock://): one lock over N independent Redis
 * masters, held while a majority (quorum Q = N/2 + 1) of them hold it.
 *
 * Each node keeps the lock exactly as redis.c lays it out (redis_common.h):
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
 *
 * Files: this one has the protocol (the scripts; acquire, release, extend
 * and inspect; the backend table); redlock_conn.c the command connections
 * and rounds; redlock_wait.c the release channels and subscriber
 * connections; redlock_open.c the options, open and close; redlock_int.h what
 * they share.
 */
#include "redlock_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Scripts (their S_ indexes: redlock_int.h)                                    */
/* ------------------------------------------------------------------------ */

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

/* KEYS: lock, fence of each name (a page of dlock_list()). {server ms,
 * then for each name: value, pttl, counter} (a value or counter of
 * another type: 0). */
static const char list_lua[] =
    "local tm = redis.call('TIME')\n"
    "local r = {tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / "
    "1000)}\n"
    "for i = 1, #KEYS, 2 do\n"
    "  local v = redis.pcall('GET', KEYS[i])\n"
    "  if type(v) == 'table' then v = 0 end\n"
    "  local f = redis.pcall('GET', KEYS[i + 1])\n"
    "  if type(f) == 'table' then f = 0 end\n"
    "  r[#r + 1] = v\n"
    "  r[#r + 1] = redis.call('PTTL', KEYS[i])\n"
    "  r[#r + 1] = f\n"
    "end\n"
    "return r\n";

/* KEYS: lock, fence. ARGV: the release channel. dlock_break() on one
 * node: deletes the holder's key (the counter stays) and publishes its
 * release as the holder's own release would ("OWNER COUNTER"), so that
 * waiters try at once. {server ms, value, pttl, counter, 1 if deleted}. */
static const char break_lua[] =
    "local tm = redis.call('TIME')\n"
    "local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / "
    "1000)\n"
    "local v = redis.call('GET', KEYS[1])\n"
    "local p = redis.call('PTTL', KEYS[1])\n"
    "local f = redis.call('GET', KEYS[2])\n"
    "local done = 0\n"
    "if v and string.match(v, " DLOCK__REDIS_LUA_OURS_PATTERN ") then\n"
    "  redis.call('DEL', KEYS[1])\n"
    "  redis.call('PUBLISH', ARGV[1], string.match(v, '^(%S+ %d+)'))\n"
    "  done = 1\n"
    "end\n"
    "return {now, v, p, f, done}\n";

const char *const dlock__redlock_script_text[NSCRIPTS] = {
    acquire_lua, release_lua, extend_lua, repair_lua,
    raise_lua,   inspect_lua, list_lua,   break_lua,
    DLOCK__REDIS_LUA_PROCLAIM};


/* ------------------------------------------------------------------------ */
/* Owners and leases                                                        */
/* ------------------------------------------------------------------------ */

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
/* Acquire                                                                  */
/* ------------------------------------------------------------------------ */

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
        dlock__redlock_node_send(rs, &rs->nodes[i], &c, K_SKIP, now);
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

    if (n->rc || !r || dlock__redlock_reply_yes(r) ||
        r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
        r->element[2]->type != REDIS_REPLY_STRING)
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
        if (!n->rc && n->ngot > 0 && dlock__redlock_reply_yes(n->got[0]))
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

    dlock__redlock_count(rs, &g->t);
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
    raise_goal g;

    dlock__redlock_round_free(rs);
    dlock__redlock_round_begin(rs);
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
        dlock__redlock_node_send(rs, &rs->nodes[i], &cmd, K_ROUND, now);
        g.sent++;
    }
    /* a node timeout from the last request written, as in ask_all() */
    int64_t deadline = dlock__now_ms() + rs->node_timeout;
    if (deadline > op_deadline)
        deadline = op_deadline;
    dlock__redlock_round_run(rs, deadline, raise_decided, &g);
    dlock__redlock_count(rs, &g.t);
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
    int64_t start = dlock__redlock_ask_all(rs, &c, 1, rs->node_timeout,
                                           op_deadline,
                                           dlock__redlock_quorum_decided, &t);

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
        if (!dlock__redlock_reply_yes(r))
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
    dlock__redlock_count(rs, &t);
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
            dlock__redlock_round_free(rs);
            pthread_mutex_unlock(&rs->mu);
            return DLOCK_OK;
        }
        char msg[120];
        snprintf(msg, sizeof(msg), "%s%" PRIu64, owner, top);
        dlock__redlock_round_free(rs);
        release_all(rs, l, msg, now); /* we had it: wake the waiters */
        rc = raised ? dlock__err(DLOCK_ECONN,
                                 "%s: the quorum took %lld ms, which left "
                                 "no validity of the %lld ms lease",
                                 rs->where, (long long)(now - start),
                                 (long long)l->ttl_ms)
                    : dlock__redlock_quorum_failure(
                          rs, answered, "cannot raise the fencing counters");
        pthread_mutex_unlock(&rs->mu);
        return rc;
    }

    /* no quorum: give back what we got, quietly; too many nodes failed
     * for any quorum: a store failure. When to try again depends on who
     * holds the nodes that have not answered yet: hear them out (within
     * the same node timeout) */
    dlock__redlock_round_run(rs, start + rs->node_timeout < op_deadline
                      ? start + rs->node_timeout
                      : op_deadline,
              NULL, NULL);
    int64_t retry = retry_after(rs, rp);
    int failed = 0;
    for (int i = 0; i < rs->n; i++)
        failed += rs->nodes[i].rc != 0;
    if (failed > rs->n - rs->quorum)
        rc = dlock__redlock_quorum_failure(rs, answered, "cannot acquire");
    dlock__redlock_round_free(rs);
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

/* A release or an extend (`what`) that no quorum of nodes agreed to:
 * DLOCK_ENOTHELD when more than N - Q of them said the lock is not ours,
 * else the failure of too few answers. */
static int no_quorum(rl_store *rs, const dlock__lease *l, int answered,
                     int notours, const char *what)
{
    if (notours > rs->n - rs->quorum)
        return dlock__err(DLOCK_ENOTHELD,
                          "lock '%.100s' is not ours on a quorum of the "
                          "nodes (%d of %d said so)",
                          l->name, notours, rs->n);
    return dlock__redlock_quorum_failure(rs, answered, what);
}

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
    /* Unlike the other rounds, a release waits for its quorum's answers
     * until op_deadline (the client's timeout), not for one node timeout:
     * it has no lease validity to protect, and one that gave up early
     * would leave the keys to block every waiter until the lease ends. A
     * node late by more than the node timeout (not scheduled for that
     * long on a busy machine) then costs its lateness, not the lease. It
     * still ends as soon as the outcome is decided, so frozen nodes cost
     * nothing while a quorum answers. */
    int64_t now = dlock__now_ms();
    dlock__redlock_ask_all(rs, &c, 1,
                           op_deadline > now ? op_deadline - now : 0,
                           op_deadline, dlock__redlock_quorum_decided, &t);
    dlock__redlock_count(rs, &t);
    if (t.yes < rs->quorum) {
        int answered, notours;
        dlock__redlock_count_ints(rs, &answered, &notours, NULL);
        rc = no_quorum(rs, l, answered, notours, "release");
    }
    dlock__redlock_round_free(rs);
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
    int64_t start = dlock__redlock_ask_all(rs, &c, 1, rs->node_timeout,
                                           op_deadline,
                                           dlock__redlock_quorum_decided, &t);
    dlock__redlock_count(rs, &t);
    int64_t now = dlock__now_ms();
    int answered, notours, mine[MAX_NODES];
    dlock__redlock_count_ints(rs, &answered, &notours, mine);
    if (t.yes >= rs->quorum &&
        ttl_ms - (now - start) - margin(rs, ttl_ms) > 0) {
        /* put back the keys that nodes lost (counted from the next
         * renewal on) */
        dlock__redlock_round_free(rs);
        for (int i = 0; i < rs->n; i++) {
            if (mine[i])
                continue;
            rcmd_evalsha(&c, S_REPAIR, 1);
            rcmd_arg(&c, lock, ll);
            rcmd_arg(&c, owner, ol);
            rcmd_str(&c, num);
            rcmd_str(&c, l->desc);
            rcmd_str(&c, ttl);
            dlock__redlock_node_send(rs, &rs->nodes[i], &c, K_SKIP, now);
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
    else
        rc = no_quorum(rs, l, answered, notours, "extend");
    dlock__redlock_round_free(rs);
    pthread_mutex_unlock(&rs->mu);
    return rc;
}

/* Leader election: the description of our key on a quorum of the nodes
 * (DLOCK__REDIS_LUA_PROCLAIM; a node that missed it keeps the old value,
 * which inspection may show when that node's key is the one it reads;
 * repairs write the new one). */
static int rl_proclaim(void *st, dlock__lease *l, const char *desc,
                       int64_t op_deadline)
{
    rl_store *rs = st;
    char lock[DLOCK__REDIS_KEY_MAX], owner[80];
    size_t ll = dlock__redis_key(&rs->cfg, l->name, l->name_len, "", lock);
    size_t ol = owner_sp(l, owner, sizeof(owner));
    int rc = DLOCK_OK;
    rcmd c;
    tally t;

    rcmd_evalsha(&c, S_PROCLAIM, 1);
    rcmd_arg(&c, lock, ll);
    rcmd_arg(&c, owner, ol);
    rcmd_str(&c, desc);
    pthread_mutex_lock(&rs->mu);
    (void)dlock__redlock_ask_all(rs, &c, 1, rs->node_timeout, op_deadline,
                                 NULL, NULL);
    dlock__redlock_count(rs, &t);
    int answered, notours;
    dlock__redlock_count_ints(rs, &answered, &notours, NULL);
    if (t.yes < rs->quorum)
        rc = no_quorum(rs, l, answered, notours, "proclaim");
    dlock__redlock_round_free(rs);
    pthread_mutex_unlock(&rs->mu);
    return rc;
}

static int64_t rl_margin(void *st, int64_t ttl_ms)
{
    return margin(st, ttl_ms);
}

const dlock__backend dlock__backend_redlock = {
    DLOCK__STORE_HEAD,
    .name = "redlock",
    .caps = DLOCK__CAP_LEASE,
    .lease_size = sizeof(rl_lease),
    .open = dlock__redlock_open,
    .close = dlock__redlock_close,
    .acquire = rl_acquire,
    .arm = dlock__redlock_arm,
    .disarm = dlock__redlock_disarm,
    .release = rl_release,
    .extend = rl_extend,
    .inspect = dlock__redlock_inspect, /* redlock_operate.c */
    .loop_fd = dlock__redlock_loop_fd,
    .loop_run = dlock__redlock_loop_run,
    .margin = rl_margin,
    .list = dlock__redlock_list,
    .evict = dlock__redlock_evict,
    .proclaim = rl_proclaim,
    .watch_unsupported =
        "the term Redlock's nodes report is the highest counter among the "
        "leader's keys, which a node that answered after the quorum can "
        "raise above the leader's token, and the next leader's term can be "
        "below it: observers would see terms go back (docs/redlock.md); "
        "the leader's own dlock_token() is its term",
};
