/* SPDX-License-Identifier: MIT */
/*
 * redis_scripts.c -- the Redis store's Lua scripts: every state change of a
 * lock key is one script, so it is atomic. The key's format and the
 * protocol are at the top of redis.c and in docs/design.md, "Hand-over
 * (Redis)".
 */
#include "redis_scripts.h"
#include "redis_common.h"


#define LUA_FOREIGN                                                           \
    "redis.error_reply('DLOCKFOREIGN the lock key holds a value not "         \
    "written by dlock')"

/* KEYS: lock. ARGV: "owner ", ttl, " ACQUIRED_MS DESCRIPTION", line (""
 * when not waiting), line id ("\nCLIENT:TID:SEQ "). Returns the token
 * (taken or adopted) as a string, or {lease left in ms (-1: none), 1 if
 * queued}, or 2: the key holds readers or a semaphore (the client runs
 * the shared try, redis_rw_scripts.c). The lock is free when the key is missing, a tombstone "- TOKEN"
 * or only queue lines (left by blind appends that found it free, the
 * caller's own among them): the new record is written whole in front of
 * the other waiters' lines, with the tombstone's token + 1 or the server
 * clock in µs. The uncontended path: GET, SET (TIME for a name not used
 * in the last hour). */
static const char try_lua[] =
    DLOCK__REDIS_LUA_FLOOR
    "local v = redis.call('GET', KEYS[1])\n"
    "local b = v and string.byte(v, 1)\n"
    "if not v or b == 45 or b == 10 then\n"
    "  local t, rest = nil, ''\n"
    "  if v then\n"
    "    local nl = string.find(v, '\\n', 1, true)\n"
    "    if b == 45 then\n"
    "      t = string.match(string.sub(v, 1, (nl or 0) - 1), "
    "'^%- (%d+) ?%d*$')\n"
    "      if not t then return " LUA_FOREIGN " end\n"
    "      t = string.format('%.0f', floor(t))\n"
    "    end\n"
    "    if nl then\n"
    "      rest = string.sub(v, nl)\n"
    "      local s = ARGV[5] ~= '' and string.find(rest, ARGV[5], 1, true)\n"
    "      if s then\n"
    "        local e = string.find(rest, '\\n', s + 1, true)\n"
    "        rest = string.sub(rest, 1, s - 1) .. (e and string.sub(rest, e) "
    "or '')\n"
    "      end\n"
    "    end\n"
    "  end\n"
    "  if not t then\n"
    "    local tm = redis.call('TIME')\n"
    "    t = tm[1] .. string.sub(tm[2] + 1000000, 2)\n"
    "  end\n"
    "  redis.call('SET', KEYS[1], ARGV[1] .. t .. ARGV[3] .. rest, 'PX', "
    "ARGV[2])\n"
    "  return t\n"
    "end\n"
    "local o = ARGV[1]\n"
    "if string.sub(v, 1, #o) == o then\n"
    /* ours already: the reply to an earlier try was lost; adopt it */
    "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    "  return string.match(v, '^%S+ (%d+)')\n"
    "end\n"
    /* readers or a semaphore ("S ..." or "N ..."): the shared script */
    "if b == 83 or b == 78 then return 2 end\n"
    "if not string.match(v, " DLOCK__REDIS_LUA_OURS_PATTERN ") then\n"
    /* not dlock's: put it back as it was before our blind append */
    "  local s = ARGV[5] ~= '' and string.find(v, ARGV[5], 1, true)\n"
    "  if s then\n"
    "    local e = string.find(v, '\\n', s + 1, true)\n"
    "    redis.call('SET', KEYS[1], string.sub(v, 1, s - 1) ..\n"
    "      (e and string.sub(v, e) or ''), 'KEEPTTL')\n"
    "  end\n"
    "  return " LUA_FOREIGN "\n"
    "end\n"
    "local q = 0\n"
    "if ARGV[4] ~= '' then\n"
    "  if not string.find(v, ARGV[5], 1, true) then\n"
    "    redis.call('APPEND', KEYS[1], ARGV[4])\n"
    "  end\n"
    "  q = 1\n"
    "end\n"
    "return {redis.call('PTTL', KEYS[1]), q}\n";

/* KEYS: lock. ARGV: "owner ", client channel prefix ("Pc:"), " ACQ "
 * (the releasing client's clock in ms, for the next holder's record).
 * Returns 0 (not ours), 1 (freed: the tombstone left), {CLIENT, SEQ,
 * TOKEN, TTL} (handed to that waiter) or 2 (a reader or a permit waits
 * ahead of any writer: the client runs the shared release). Uncontended: GET, SET. */
static const char release_lua[] =
    DLOCK__REDIS_LUA_FLOOR
    "local v = redis.call('GET', KEYS[1])\n"
    "local o = ARGV[1]\n"
    "if not v or string.sub(v, 1, #o) ~= o then return 0 end\n"
    "local ts = string.match(v, '^%S+ (%d+)')\n"
    "local nl = string.find(v, '\\n', #o, true)\n"
    "if nl then\n"
    "  local tok = tonumber(ts)\n"
    "  repeat\n"
    "    local e = string.find(v, '\\n', nl + 1, true)\n"
    "    local ln = string.sub(v, nl + 1, (e or 0) - 1)\n"
    "    local c, tid, seq, ttl, desc = string.match(ln,\n"
    "      '^(%x+):(%d+):(%d+) (%d+) (.*)$')\n"
    /* a reader or a permit waits: the shared script hands over */
    "    if not c and string.find(ln, '^%x+:%d+:%d+ [rp]') then return 2 "
    "end\n"
    /* a line of the releasing owner itself is left over from an earlier
     * wait of this thread: skip it */
    "    if c and c .. ':' .. tid .. ' ' ~= o then\n"
    "      tok = floor(tok)\n"
    "      ts = string.format('%.0f', tok)\n"
    "      if redis.call('PUBLISH', ARGV[2] .. c, 'g ' .. seq .. ' ' .. ts)"
    " > 0 then\n"
    "        redis.call('SET', KEYS[1], c .. ':' .. tid .. ' ' .. ts ..\n"
    "          ARGV[3] .. desc .. (e and string.sub(v, e) or ''), 'PX', "
    "ttl)\n"
    "        return {c, seq, ts, tonumber(ttl)}\n"
    "      end\n"
    "    end\n"
    "    nl = e\n"
    "  until not nl\n"
    "end\n"
    "redis.call('SET', KEYS[1], '- ' .. ts, 'PXAT',\n"
    "  tonumber(string.sub(ts, 1, -4)) + 3600000)\n"
    "return 1\n";

/* KEYS: lock. ARGV: "owner ", line id, ttl. Returns {TOKEN} when the
 * lock was handed to this owner (kept, its lease restarted), else 0 (the
 * line removed, if it was there), or 2 (readers or a semaphore: the
 * shared abandon). */
static const char abandon_lua[] =
    "local v = redis.call('GET', KEYS[1])\n"
    "if not v then return 0 end\n"
    /* readers or a semaphore: the shared script (leaving may let them in) */
    "local b = string.byte(v, 1)\n"
    "if b == 83 or b == 78 then return 2 end\n"
    "if string.sub(v, 1, #ARGV[1]) == ARGV[1] then\n"
    "  redis.call('PEXPIRE', KEYS[1], ARGV[3])\n"
    "  return {tonumber(string.match(v, '^%S+ (%d+)'))}\n"
    "end\n"
    "local s = string.find(v, ARGV[2], 1, true)\n"
    "if s then\n"
    "  local e = string.find(v, '\\n', s + 1, true)\n"
    "  redis.call('SET', KEYS[1], string.sub(v, 1, s - 1) ..\n"
    "    (e and string.sub(v, e) or ''), 'KEEPTTL')\n"
    "end\n"
    "return 0\n";

/* KEYS: lock. ARGV: "owner ", ttl. 1 if extended, 0 if not ours. */
static const char extend_lua[] =
    "local v = redis.call('GET', KEYS[1])\n"
    "if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then\n"
    "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    "  return 1\n"
    "end\n"
    "return 0\n";

/* KEYS: locks. ARGV: "owner ", ttl for each. {1 or 0 for each}. */
static const char extend_many_lua[] =
    "local r = {}\n"
    "for i = 1, #KEYS do\n"
    "  local v = redis.call('GET', KEYS[i])\n"
    "  local o = ARGV[2 * i - 1]\n"
    REDIS_LUA_RENEW_I
    "end\n"
    "return r\n";

/* KEYS: lock. Returns {server ms, value or false, pttl}. */
static const char inspect_lua[] =
    "local tm = redis.call('TIME')\n"
    "return {tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000),\n"
    "        redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1])}\n";

/* KEYS: locks (a page of dlock_list()). Returns {server ms, then for
 * each key its value (nil: none; 0: a key of another type) and PTTL}: one
 * script reads a whole batch at one moment, so each entry is one state of
 * its lock. */
static const char list_lua[] =
    "local tm = redis.call('TIME')\n"
    "local r = {tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)}\n"
    "for i = 1, #KEYS do\n"
    "  local v = redis.pcall('GET', KEYS[i])\n"
    "  if type(v) == 'table' then v = 0 end\n"
    "  r[2 * i] = v\n"
    "  r[2 * i + 1] = redis.call('PTTL', KEYS[i])\n"
    "end\n"
    "return r\n";

const char *const dlock__redis_script_text[NSCRIPTS] = {
    try_lua,
    release_lua,
    abandon_lua,
    extend_lua,
    extend_many_lua,
    inspect_lua,
    dlock__redis_rw_try_lua,
    dlock__redis_rw_release_lua,
    dlock__redis_rw_abandon_lua,
    dlock__redis_rw_extend_lua,
    dlock__redis_rw_extend_many_lua,
    list_lua,
    dlock__redis_break_lua,
    DLOCK__REDIS_LUA_PROCLAIM};

