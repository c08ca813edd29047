/* SPDX-License-Identifier: MIT */
/*
 * redis_common.h -- what the two Redis stores share: redis.c (one server)
 * and redlock.c (a quorum of independent masters).
 *
 * Both lay out a lock's keys the same way (see redis.c), so that a lock
 * taken through redlock:// can be looked at on any one node with
 * `dlock inspect` over redis://:
 *   P{NAME}      "OWNER TOKEN ACQUIRED_MS DESCRIPTION" with the lease as
 *                its PEXPIRE
 *   P{NAME}:f    the node's fencing counter (never expires)
 *   P{NAME}:w:DB the release channel
 */
#ifndef DLOCK_REDIS_COMMON_H
#define DLOCK_REDIS_COMMON_H

#include "store.h"
#include "redis_io.h"

#include <hiredis.h>
#include <stdio.h>
#include <string.h>

#define DLOCK__REDIS_PREFIX_MAX 128
#define DLOCK__REDIS_KEY_MAX (DLOCK__REDIS_PREFIX_MAX + DLOCK_NAME_MAX + 24)

/*
 * Lua: `take()`, for a script that has just set the lock key to the owner
 * (followed by a space). It bumps the fencing counter and appends
 * "TOKEN ACQUIRED_MS DESCRIPTION" to the key; returns the token as a
 * string, or nil and an error reply. A counter that is new (or was lost in
 * a restart without persistence) continues from the server clock in
 * microseconds, so tokens keep growing across such a restart. Expects the
 * locals `lock`, `fence` and `desc`.
 */
#define DLOCK__REDIS_LUA_TAKE                                                 \
    "local function take()\n"                                                 \
    "  local n = redis.pcall('INCR', fence)\n"                                \
    "  if type(n) == 'table' then\n"                                          \
    "    redis.call('DEL', lock)\n"                                           \
    "    return nil, redis.error_reply('DLOCKFENCE the fencing counter key "  \
    "holds a non-number or another type')\n"                                  \
    "  end\n"                                                                 \
    "  local tm = redis.call('TIME')\n"                                       \
    "  if n == 1 then\n"                                                      \
    "    n = tonumber(tm[1]) * 1000000 + tonumber(tm[2])\n"                   \
    "    redis.call('SET', fence, string.format('%.0f', n))\n"                \
    "  end\n"                                                                 \
    "  local ns = string.format('%.0f', n)\n"                                 \
    "  redis.call('APPEND', lock, ns .. ' ' .. string.format('%.0f', "        \
    "tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)) .. ' ' .. " \
    "desc)\n"                                                                 \
    "  return ns\n"                                                           \
    "end\n"

/* Lua: `floor(last)`, the token after `last` (a number, or nil for none):
 * last + 1, or the server's clock in µs if that is higher. Every token a
 * redis:// script gives comes from it, so that tokens keep growing across
 * a failover to a replica that missed the last ones (docs/design.md,
 * "Redis beyond one server: Sentinel"). */
#define DLOCK__REDIS_LUA_FLOOR                                                \
    "local function floor(last)\n"                                           \
    "  local tm = redis.call('TIME')\n"                                      \
    "  local c = tonumber(tm[1] .. string.sub(tm[2] + 1000000, 2))\n"        \
    "  if last and tonumber(last) + 1 > c then return tonumber(last) + 1 end\n" \
    "  return c\n"                                                           \
    "end\n"

/* Lua: the test that a lock key's value was written by dlock (the owner
 * is CLIENT:THREAD, and on Redlock CLIENT:THREAD:ACQUISITION). */
#define DLOCK__REDIS_LUA_OURS_PATTERN "'^%x+:%d+[:%d]* %d+ %d+ '"

/* One command of either store, its arguments borrowed (binary-safe). */
typedef struct rcmd {
    int script; /* S_* of the store for EVALSHA (the store adds the SHA),
                 * -1 for a plain command */
    int argc;
    const char *argv[16]; /* room for the longest command built (14) */
    size_t lens[16];
    /* A longer command (redis.c's batch renewal) keeps its arguments
     * here instead (NULL: argv/lens); its ext_argv[1] gets the SHA. */
    const char **ext_argv;
    size_t *ext_lens;
} rcmd;

static inline void rcmd_arg(rcmd *c, const char *s, size_t len)
{
    c->argv[c->argc] = s;
    c->lens[c->argc] = len;
    c->argc++;
}

static inline void rcmd_str(rcmd *c, const char *s)
{
    rcmd_arg(c, s, strlen(s));
}

/* Starts EVALSHA of script `s` with nkeys (0..4) keys; argv[1] is left
 * for the SHA. */
static inline void rcmd_evalsha(rcmd *c, int s, int nkeys)
{
    static const char *const nk[] = {"0", "1", "2", "3", "4"};

    c->script = s;
    c->argc = 0;
    c->ext_argv = NULL;
    c->ext_lens = NULL;
    rcmd_str(c, "EVALSHA");
    rcmd_arg(c, "", 40);
    rcmd_str(c, nk[nkeys]);
}

/* Starts a longer command whose arguments are kept in argv/lens (its
 * ext_argv/ext_lens): EVALSHA of script `s` with nkeys keys, argv[1]
 * left for the SHA, the count's digits written to nk (nk_size bytes,
 * kept until the command is sent). The caller appends the keys and
 * arguments at argv + 3 and sets c->argc. Returns 3, the entries used. */
static inline size_t rcmd_evalsha_ext(rcmd *c, int s, const char **argv,
                                      size_t *lens, char *nk,
                                      size_t nk_size, size_t nkeys)
{
    c->script = s;
    c->ext_argv = argv;
    c->ext_lens = lens;
    snprintf(nk, nk_size, "%zu", nkeys);
    argv[0] = "EVALSHA";
    lens[0] = 7;
    argv[1] = ""; /* the SHA */
    lens[1] = 40;
    argv[2] = nk;
    lens[2] = strlen(nk);
    c->argc = 3;
    return 3;
}

static inline void rcmd_plain(rcmd *c)
{
    c->script = -1;
    c->argc = 0;
    c->ext_argv = NULL;
    c->ext_lens = NULL;
}

/* The kind of a reply r on a subscriber connection ("message",
 * "subscribe", "smessage", ...) when it is an array of at least three
 * whose first two (the kind, the channel) are strings; else NULL. */
static inline const char *rpush_kind(const redisReply *r)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
        r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_STRING)
        return NULL;
    return r->element[0]->str;
}

/* Maps an error reply of a server to a code and message ("where: ...");
 * any occurrence of `password` (may be NULL) is masked. */
int dlock__redis_server_error(const char *where, const char *password,
                              const char *msg, const char *lock);

/* Leader election's proclaim, one lock key, on one server and on each
 * Redlock node. KEYS: lock. ARGV: the owner as the store's extend
 * compares it, the leader's new value. 1 if set, 0 if not ours. The
 * record's first line, "OWNER TOKEN ACQUIRED_MS DESCRIPTION" (Redlock:
 * the node's counter for TOKEN), gets the new description; the waiters'
 * lines, the token and the lease stay. */
#define DLOCK__REDIS_LUA_PROCLAIM                                            \
    "local v = redis.call('GET', KEYS[1])\n"                                 \
    "if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 0 end\n"  \
    "local nl = string.find(v, '\\n', 1, true)\n"                            \
    "local first = nl and string.sub(v, 1, nl - 1) or v\n"                   \
    "local head = string.match(first, '^%S+ %d+ %d+ ')\n"                    \
    "if not head then return 0 end\n"                                       \
    "redis.call('SET', KEYS[1], head .. ARGV[2] ..\n"                        \
    "  (nl and string.sub(v, nl) or ''), 'KEEPTTL')\n"                       \
    "return 1\n"

/* Describes the I/O failure of a context. */
int dlock__redis_io_failure(const char *where, const redisContext *ctx,
                            int64_t io_ms);

/* An integer or decimal-string reply as an unsigned number: 0, or -1 when
 * it is neither. */
int dlock__redis_reply_uint(const redisReply *r, uint64_t *out);

/* Sends what ctx has buffered (dlock__rio_send: with send(MSG_NOSIGNAL),
 * or through TLS): a connection the server reset never raises SIGPIPE
 * (hiredis' own write() would, and the library installs no signal
 * handlers). 1: all sent; 0: the socket would
 * block (a non-blocking one is full; a blocking one hit its send timeout);
 * -1: the connection failed (errno says why). */
int dlock__redis_send(redisContext *ctx);

/* The options both stores take: prefix, db, timeout, user and password,
 * and TLS (redis_io.h: dlock__rtls_params, which the stores accept too).
 * `what` names the store in messages. Fills what it finds; leaves the
 * rest. */
typedef struct dlock__redis_config {
    char prefix[DLOCK__REDIS_PREFIX_MAX + 1];
    size_t prefix_len;
    long db;
    int64_t timeout_ms;
    char *user;     /* malloc'd or NULL */
    char *password; /* malloc'd or NULL; wiped by ..._config_free() */
    dlock__rtls *tls; /* rediss:// or ?tls=1: every connection; else NULL */
} dlock__redis_config;

/* Writes PREFIX{NAME}SUFFIX to out (DLOCK__REDIS_KEY_MAX bytes); returns
 * its length. */
size_t dlock__redis_key(const dlock__redis_config *cfg, const char *name,
                        size_t len, const char *suffix, char *out);

/* dlock_list() on either store: the SCAN pattern of the keys
 * PREFIX{NAME}SUFFIX of the names that start with the bytes
 * prefix[0..plen): PREFIX{P*}SUFFIX with every character of Redis' glob
 * (* ? [ ] \) in the store's prefix and in P escaped by a backslash, so
 * that a name prefix is matched as bytes. `out` has room for
 * DLOCK__REDIS_PATTERN_MAX bytes; returns the pattern's length. */
#define DLOCK__REDIS_PATTERN_MAX                                              \
    (2 * (DLOCK__REDIS_PREFIX_MAX + DLOCK_NAME_MAX) + 16)
size_t dlock__redis_list_pattern(const dlock__redis_config *cfg,
                                 const char *prefix, size_t plen,
                                 const char *suffix, char *out);

/* The lock name of a key PREFIX{NAME}SUFFIX: 0 with *name pointing into
 * `key` and *len set, or -1 when the key has another layout, or a name
 * that no lock can have (empty, longer than DLOCK_NAME_MAX, a NUL byte). */
int dlock__redis_key_name(const dlock__redis_config *cfg, const char *key,
                          size_t klen, const char *suffix, const char **name,
                          size_t *len);

/* A SCAN cursor of the caller's, s[0..len): the decimal digits of an
 * unsigned 64-bit number ("" is the start, 0), at most 20 of them. 0 with
 * its canonical form in out (no leading zeros), or -1. */
int dlock__redis_scan_cursor(const char *s, size_t len, char out[21]);

/* Redlock's dlock_list() cursor: one field per node, separated by
 * commas: its SCAN cursor while its walk goes on (DLOCK__WALKING), "-"
 * once walked to its end (DLOCK__WALKED), "x" once left out after it
 * failed (DLOCK__LEFT_OUT). "" is every node from the start. Reads s into
 * cur[0..n) and walk[0..n): 0, or -1 when s is not such a cursor of n
 * fields. */
enum { DLOCK__WALKING, DLOCK__WALKED, DLOCK__LEFT_OUT };
int dlock__redis_walk_cursor(const char *s, int n, char (*cur)[21],
                             int *walk);

/* The cursor of the next page into *next (malloc'd), or NULL when no
 * node's walk goes on. DLOCK_OK or DLOCK_ENOMEM. */
int dlock__redis_walk_next(int n, char (*cur)[21], const int *walk,
                           char **next);

/* The release channel of a lock, PREFIX{NAME}:w:DB. */
size_t dlock__redis_wake_key(const dlock__redis_config *cfg, const char *name,
                             size_t len, char *out);

int dlock__redis_config_parse(dlock__redis_config *cfg, const dlock__uri *u,
                              const char *what, const char *db);
void dlock__redis_config_free(dlock__redis_config *cfg);

/* Appends AUTH (when there is a password) and SELECT (db != 0) to ctx;
 * returns how many commands it appended. */
int dlock__redis_append_login(redisContext *ctx,
                              const dlock__redis_config *cfg);

#endif /* DLOCK_REDIS_COMMON_H */
