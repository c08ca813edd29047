/* SPDX-License-Identifier: MIT */
/*
 * redis_rw_scripts.c -- the Redis store's Lua scripts for shared (read)
 * holds and counting semaphores: one script per state change of the
 * lock's one key, as for the exclusive lock (redis_scripts.c). The key's
 * forms and the protocol: the top of redis_rw.c and docs/design.md,
 * "Shared holds and permits".
 *
 * Every script below starts with RW_LIB, which reads the whole value
 * into a table (`parse`), drops the holders whose lease has passed on the
 * server's clock (`drop`), hands the lock to every waiter at the head of
 * the queue that can now proceed (`grant`: a message to each on its
 * client's channel; PUBLISH 0 undoes that grant) and writes the value
 * back (`save`). The exclusive scripts send a key in these forms here.
 */
#include "redis_scripts.h"
#include "redis_common.h"

/* The library. State `st`: f = 'F' (free; tok the tombstone's token or
 * nil), 'W' (a writer: o its owner, rec its record), 'S' (readers) or 'N'
 * (a semaphore of n permits); tok the last token given; h the holder
 * lines {o, t, u (lease end, server ms), d}; q the waiters {id, c, o,
 * seq, k ('w', 'r', 'p'), n, ttl, d, x (the line)}. */
#define RW_LIB                                                                \
    "local function fmt(x) return string.format('%.0f', x) end\n"           \
    "local NOW\n"                                                           \
    "local function now()\n"                                                \
    "  if not NOW then\n"                                                   \
    "    local tm = redis.call('TIME')\n"                                   \
    "    NOW = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)\n"\
    "  end\n"                                                               \
    "  return NOW\n"                                                        \
    "end\n"                                                                 \
    "local function line(x)\n"                                              \
    "  local c, tid, seq, k, n, ttl, d = string.match(x,\n"                 \
    "    '^(%x+):(%d+):(%d+) ([rp])(%d*) (%d+) (.*)$')\n"                   \
    "  if not c then\n"                                                     \
    "    c, tid, seq, ttl, d = string.match(x, "                            \
    "'^(%x+):(%d+):(%d+) (%d+) (.*)$')\n"                                   \
    "    k = 'w'\n"                                                         \
    "  end\n"                                                               \
    "  if not c then return nil end\n"                                      \
    "  return {id = c .. ':' .. tid .. ':' .. seq, c = c, o = c .. ':' .. "  \
    "tid,\n"                                                                \
    "    seq = seq, k = k, n = tonumber(n), ttl = tonumber(ttl), d = d, "    \
    "x = x}\n"                                                              \
    "end\n"                                                                 \
    "local function parse(v)\n"                                             \
    "  local st = {f = 'F', h = {}, q = {}}\n"                              \
    "  if not v then return st end\n"                                       \
    "  local ls, s = {}, 1\n"                                               \
    "  while true do\n"                                                     \
    "    local e = string.find(v, '\\n', s, true)\n"                        \
    "    ls[#ls + 1] = string.sub(v, s, (e or 0) - 1)\n"                    \
    "    if not e then break end\n"                                         \
    "    s = e + 1\n"                                                       \
    "  end\n"                                                               \
    "  local hd = ls[1]\n"                                                  \
    "  local a, t = string.match(hd, '^([-S]) (%d+)$')\n"                   \
    "  local tn\n"                                                          \
    "  if not a then a, t, tn = string.match(hd, '^(%-) (%d+) (%d+)$') end\n"\
    "  if a then\n"                                                         \
    "    st.f, st.tok, st.n = a == 'S' and 'S' or 'F', tonumber(t), "        \
    "tonumber(tn)\n"                                                        \
    "  elseif hd ~= '' then\n"                                              \
    "    local n, t2 = string.match(hd, '^N (%d+) (%d+)$')\n"               \
    "    if n then\n"                                                       \
    "      st.f, st.n, st.tok = 'N', tonumber(n), tonumber(t2)\n"           \
    "    else\n"                                                            \
    "      local o, t3 = string.match(hd, '^(%x+:%d+) (%d+) %d+ ')\n"       \
    "      if not o then return nil end\n"                                  \
    "      st.f, st.o, st.tok, st.rec = 'W', o, tonumber(t3), hd\n"         \
    "    end\n"                                                             \
    "  end\n"                                                               \
    "  for i = 2, #ls do\n"                                                 \
    "    local o, t4, u, d = string.match(ls[i], "                          \
    "'^%+ (%S+) (%d+) ([%d?]+) (.*)$')\n"                                   \
    "    if o then\n"                                                       \
    "      st.h[#st.h + 1] = {o = o, t = tonumber(t4), u = tonumber(u), "    \
    "d = d}\n"                                                              \
    "    else\n"                                                            \
    "      local w = line(ls[i])\n"                                         \
    "      if w then st.q[#st.q + 1] = w end\n"                             \
    "    end\n"                                                             \
    "  end\n"                                                               \
    "  return st\n"                                                         \
    "end\n"                                                                 \
    /* holders whose lease has passed are gone; no holder left: free. A   \
     * sole holder's end "?" is the key's own expiry (the uncontended      \
     * take writes no end: it reads no clock) */                           \
    "local function drop(st, key)\n"                                        \
    "  local k = {}\n"                                                      \
    "  for _, h in ipairs(st.h) do\n"                                       \
    "    if not h.u then\n"                                                 \
    "      local p = redis.call('PTTL', key)\n"                             \
    "      h.u = now() + (p > 0 and p or 0)\n"                              \
    "    end\n"                                                             \
    "    if h.u > now() then k[#k + 1] = h end\n"                           \
    "  end\n"                                                               \
    "  st.h = k\n"                                                          \
    "  if st.f ~= 'W' and #k == 0 then st.f = 'F' end\n"                    \
    "end\n"                                                                 \
    DLOCK__REDIS_LUA_FLOOR                                                  \
    "local function nexttok(st) return floor(st.tok) end\n"                 \
    "local function hold(st, o)\n"                                          \
    "  if st.f == 'W' then return st.o == o and st.tok or nil end\n"        \
    "  for _, h in ipairs(st.h) do\n"                                       \
    "    if h.o == o then return h.t, h end\n"                              \
    "  end\n"                                                               \
    "end\n"                                                                 \
    /* can waiter w proceed now? true, false (wait), nil (wrong kind) */    \
    "local function room(st, w)\n"                                          \
    "  if st.f == 'N' then\n"                                               \
    "    if w.k ~= 'p' or w.n ~= st.n then return nil end\n"                \
    "    return #st.h < st.n\n"                                             \
    "  end\n"                                                               \
    "  if w.k == 'p' then\n"                                                \
    "    if st.f ~= 'F' then return nil end\n"                              \
    "    return true\n"                                                     \
    "  end\n"                                                               \
    "  if w.k == 'r' then return st.f ~= 'W' end\n"                         \
    "  return st.f == 'F'\n"                                                \
    "end\n"                                                                 \
    "local function apply(st, w, t)\n"                                      \
    "  st.tok = t\n"                                                        \
    "  if w.k == 'w' then\n"                                                \
    "    st.f, st.o, st.px = 'W', w.o, w.ttl\n"                             \
    "    st.rec = w.o .. ' ' .. fmt(t) .. ' ' .. fmt(now()) .. ' ' .. w.d\n"\
    "    return\n"                                                          \
    "  end\n"                                                               \
    "  if st.f == 'F' then\n"                                               \
    "    st.f = w.k == 'p' and 'N' or 'S'\n"                                \
    "    st.n = w.n\n"                                                      \
    "  end\n"                                                               \
    "  st.h[#st.h + 1] = {o = w.o, t = t, rel = w.ttl, d = w.d}\n"         \
    "end\n"                                                                 \
    /* grants the head of the queue while it can proceed; `me` (a waiter   \
     * id) is granted without a message. Returns the grants {CLIENT, SEQ, \
     * TOKEN, TTL, ...}, my token, and 1 if my line was of the wrong kind */\
    "local function grant(st, chan, me)\n"                                  \
    "  local out, mine, bad = {}, nil, nil\n"                               \
    "  while #st.q > 0 do\n"                                                \
    "    local w = st.q[1]\n"                                               \
    "    local ok = room(st, w)\n"                                          \
    "    if ok == false then break end\n"                                   \
    "    table.remove(st.q, 1)\n"                                           \
    "    if ok == nil then\n"                                               \
    "      if w.id == me then bad = 1 end\n"                                \
    "    else\n"                                                            \
    "      local t = nexttok(st)\n"                                         \
    "      local ts = fmt(t)\n"                                             \
    "      if w.id == me then\n"                                            \
    "        apply(st, w, t)\n"                                             \
    "        mine = ts\n"                                                   \
    "      elseif redis.call('PUBLISH', chan .. w.c, 'g ' .. w.seq .. ' ' "  \
    ".. ts) > 0 then\n"                                                     \
    "        apply(st, w, t)\n"                                             \
    "        out[#out + 1] = w.c\n"                                         \
    "        out[#out + 1] = w.seq\n"                                       \
    "        out[#out + 1] = ts\n"                                          \
    "        out[#out + 1] = w.ttl\n"                                       \
    "      end\n"                                                           \
    "    end\n"                                                             \
    "  end\n"                                                               \
    "  return out, mine, bad\n"                                             \
    "end\n"                                                                 \
    /* the lease: a writer's own (PX, or kept), else the latest holder's   \
     * end; nothing held: the tombstone, an hour past its token's time */  \
    "local function save(key, st)\n"                                        \
    "  if st.f == 'F' and #st.q == 0 then\n"                                \
    "    if st.tok then\n"                                                  \
    "      redis.call('SET', key, '- ' .. fmt(st.tok) ..\n"                 \
    "        (st.n and ' ' .. st.n or ''), 'PXAT',\n"                       \
    "        math.floor(st.tok / 1000) + 3600000)\n"                        \
    "    else\n"                                                            \
    "      redis.call('DEL', key)\n"                                        \
    "    end\n"                                                             \
    "    return\n"                                                          \
    "  end\n"                                                               \
    "  local p, u = {}, 0\n"                                                \
    "  if #st.h == 1 and not st.h[1].u and #st.q == 0 then\n"               \
    "    local h = st.h[1]\n"                                               \
    "    redis.call('SET', key, (st.f == 'N' and 'N ' .. st.n .. ' ' or "    \
    "'S ') .. fmt(st.tok) .. '\\n+ ' .. h.o .. ' ' .. fmt(h.t) .. ' ? ' .. "\
    "h.d, 'PX', h.rel)\n"                                                  \
    "    return\n"                                                          \
    "  end\n"                                                               \
    "  if st.f == 'W' then p[1] = st.rec\n"                                 \
    "  elseif st.f == 'N' then p[1] = 'N ' .. st.n .. ' ' .. fmt(st.tok)\n" \
    "  elseif st.f == 'S' then p[1] = 'S ' .. fmt(st.tok)\n"                \
    "  else p[1] = st.tok and '- ' .. fmt(st.tok) or '' end\n"              \
    "  for _, h in ipairs(st.h) do\n"                                       \
    "    if not h.u then h.u = now() + h.rel end\n"                         \
    "    p[#p + 1] = '+ ' .. h.o .. ' ' .. fmt(h.t) .. ' ' .. fmt(h.u) .. "  \
    "' ' .. h.d\n"                                                          \
    "    if h.u > u then u = h.u end\n"                                     \
    "  end\n"                                                               \
    "  for _, w in ipairs(st.q) do p[#p + 1] = w.x end\n"                   \
    "  local v = table.concat(p, '\\n')\n"                                  \
    "  if st.f == 'W' and st.px then\n"                                     \
    "    redis.call('SET', key, v, 'PX', st.px)\n"                          \
    "  elseif st.f == 'W' then\n"                                           \
    "    redis.call('SET', key, v, 'KEEPTTL')\n"                            \
    "  elseif u > 0 then\n"                                                 \
    "    redis.call('SET', key, v, 'PXAT', fmt(u))\n"                       \
    "  else\n"                                                              \
    "    redis.call('SET', key, v, 'PX', 1000)\n"                           \
    "  end\n"                                                               \
    "end\n"                                                                 \
    /* a renewal of owner o's holder line (1), or 0 when it is gone */      \
    "local function extend(key, o, ttl, chan)\n"                            \
    "  local st = parse(redis.call('GET', key))\n"                          \
    "  if not st or st.f == 'W' then return 0 end\n"                        \
    "  local n0 = #st.h\n"                                                  \
    "  drop(st, key)\n"                                                     \
    "  local _, h = hold(st, o)\n"                                          \
    "  if h then h.u = now() + ttl end\n"                                   \
    "  if h or #st.h ~= n0 then\n"                                          \
    "    grant(st, chan, '')\n"                                             \
    "    save(key, st)\n"                                                   \
    "  end\n"                                                               \
    "  return h and 1 or 0\n"                                               \
    "end\n"

#define RW_FOREIGN                                                            \
    "redis.error_reply('DLOCKFOREIGN the lock key holds a value not "         \
    "written by dlock')"

/* The library, then the lock's value v (read by the script's fast path)
 * as a state `st`: a value not dlock's is an error. */
#define RW_PARSED                                                             \
    RW_LIB                                                                    \
    "local st = parse(v)\n"                                                   \
    "if not st then return " RW_FOREIGN " end\n"

/* KEYS: lock. ARGV: my line ("CLIENT:TID:SEQ [r|pN ]TTL DESC"), 1 to
 * stay queued if not granted (else 0: one try), the channel prefix.
 * Returns my token (taken, or adopted: a reply never seen, a grant that
 * crossed this try), or {lease left in ms (-1: none), 1 if queued}. A try
 * is granted only when every waiter ahead of it is (FIFO across kinds: a
 * reader never passes a waiting writer). */
const char dlock__redis_rw_try_lua[] =
    DLOCK__REDIS_LUA_FLOOR
    /* the uncontended path first (the library is not even defined): a
     * read hold or a permit on a free key, nobody waiting; GET, SET
     * (TIME for a name not used in the last hour), as for a writer */
    "local v = redis.call('GET', KEYS[1])\n"
    "local c, k, n, ttl, d = string.match(ARGV[1],\n"
    "  '^(%x+:%d+):%d+ ([rp])(%d*) (%d+) (.*)$')\n"
    "if not v or (string.byte(v, 1) == 45 and\n"
    "             not string.find(v, '\\n', 1, true)) then\n"
    "  local t = v and string.match(v, '^%- (%d+) ?%d*$')\n"
    "  if c and (t or not v) then\n"
    "    if t then\n"
    "      t = string.format('%.0f', floor(t))\n"
    "    else\n"
    "      local tm = redis.call('TIME')\n"
    "      t = tm[1] .. string.sub(tm[2] + 1000000, 2)\n"
    "    end\n"
    "    redis.call('SET', KEYS[1], (k == 'p' and 'N ' .. n .. ' ' or 'S ')"
    " ..\n"
    "      t .. '\\n+ ' .. c .. ' ' .. t .. ' ? ' .. d, 'PX', ttl)\n"
    "    return t\n"
    "  end\n"
    /* readers (permits) hold, nobody waits, no line has expired, room:
     * one more holder line, read on the string (GET, TIME, PTTL, SET) */
    "elseif c and not string.find(v, '\\n[^+]') and\n"
    "       not string.find(v, '\\n+ ' .. c .. ' ', 1, true) then\n"
    "  local nl = string.find(v, '\\n', 1, true)\n"
    "  local hd = string.sub(v, 1, (nl or 0) - 1)\n"
    "  local pre, t = string.match(hd, '^(S )(%d+)$')\n"
    "  if k == 'p' then pre, t = string.match(hd, '^(N ' .. n .. ' )(%d+)$') "
    "end\n"
    "  if nl and t and ((k == 'r') == (pre == 'S ')) then\n"
    "    local tm = redis.call('TIME')\n"
    "    local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / "
    "1000)\n"
    "    local pt = redis.call('PTTL', KEYS[1])\n"
    "    local ok, cnt = pt > 0, 0\n"
    "    for u in string.gmatch(v, '\\n%+ %S+ %d+ (%S+) ') do\n"
    "      cnt = cnt + 1\n"
    "      if u ~= '?' and tonumber(u) <= now then ok = false end\n"
    "    end\n"
    "    if ok and cnt > 0 and (k == 'r' or cnt < tonumber(n)) then\n"
    "      t = string.format('%.0f', floor(t))\n"
    "      local u = now + tonumber(ttl)\n"
    /* a sole holder's "?" is the key's expiry: written out now */
    "      local body = string.gsub(string.sub(v, nl), '^(\\n%+ %S+ %d+ )%? ',"
    "\n"
    "        '%1' .. string.format('%.0f', now + pt) .. ' ')\n"
    "      redis.call('SET', KEYS[1], pre .. t .. body .. '\\n+ ' .. c .. "
    "' ' ..\n"
    "        t .. ' ' .. string.format('%.0f', u) .. ' ' .. d, 'PXAT',\n"
    "        string.format('%.0f', math.max(u, now + pt)))\n"
    "      return t\n"
    "    end\n"
    "  end\n"
    "end\n"
    RW_PARSED
    "local me = line(ARGV[1])\n"
    "drop(st, KEYS[1])\n"
    "local t, h = hold(st, me.o)\n"
    "if t and (st.f == 'W') == (me.k == 'w') then\n"
    "  for i, w in ipairs(st.q) do\n"
    "    if w.id == me.id then table.remove(st.q, i) break end\n"
    "  end\n"
    "  if h then h.u = now() + me.ttl else st.px = me.ttl end\n"
    "  save(KEYS[1], st)\n"
    "  return fmt(t)\n"
    "end\n"
    "local pos\n"
    "for i, w in ipairs(st.q) do\n"
    "  if w.id == me.id then pos = i end\n"
    "end\n"
    "local others = #st.h > 0 or #st.q > (pos and 1 or 0)\n"
    "local err\n"
    "if st.f == 'N' and others and (me.k ~= 'p' or me.n ~= st.n) then\n"
    "  err = 'is a semaphore of ' .. st.n .. ' permits'\n"
    "elseif me.k == 'p' and (st.f == 'W' or st.f == 'S') then\n"
    "  err = 'is a lock, not a semaphore (it has holders)'\n"
    "end\n"
    "if not err then\n"
    "  if not pos then st.q[#st.q + 1] = me end\n"
    "  local _, mine, bad = grant(st, ARGV[3], me.id)\n"
    "  if bad then err = st.f == 'N' and 'is a semaphore of ' .. st.n .. "
    "' permits' or 'is a lock, not a semaphore' end\n"
    "  if mine then\n"
    "    save(KEYS[1], st)\n"
    "    return mine\n"
    "  end\n"
    "end\n"
    "if err or ARGV[2] ~= '1' then\n"
    "  for i, w in ipairs(st.q) do\n"
    "    if w.id == me.id then table.remove(st.q, i) break end\n"
    "  end\n"
    "end\n"
    "save(KEYS[1], st)\n"
    "if err then return redis.error_reply('DLOCKKIND ' .. err) end\n"
    "return {redis.call('PTTL', KEYS[1]), ARGV[2] == '1' and 1 or 0}\n";

/* KEYS: lock. ARGV: owner ("CLIENT:TID"), the channel prefix. Removes
 * the owner's hold (the writer's record or its own holder line, never
 * another's) and its leftover waiter lines, then grants what can now
 * proceed. Returns 0 (not ours) or {1, CLIENT, SEQ, TOKEN, TTL, ...}
 * (the grants). */
const char dlock__redis_rw_release_lua[] =
    /* nobody waits (every line a holder's): the owner's line is cut out
     * on the string, GET, SET (the tombstone when it was the only one, as
     * for a writer); other lines are left as they are (with nobody
     * waiting, an expired one holds nothing up: the next try drops it) */
    "local v = redis.call('GET', KEYS[1])\n"
    "local b = v and string.byte(v, 1)\n"
    "if (b == 83 or b == 78) and not string.find(v, '\\n[^+]') then\n"
    "  local s = string.find(v, '\\n+ ' .. ARGV[1] .. ' ', 1, true)\n"
    "  if s then\n"
    "    local e = string.find(v, '\\n', s + 1, true)\n"
    "    local rest = string.sub(v, 1, s - 1) .. (e and string.sub(v, e) or "
    "'')\n"
    "    local n, t = string.match(rest, '^N (%d+) (%d+)$')\n"
    "    if not t then t = string.match(rest, '^S (%d+)$') end\n"
    "    if t then\n"
    "      redis.call('SET', KEYS[1], '- ' .. t .. (n and ' ' .. n or ''),"
    " 'PXAT',\n"
    "        math.floor(tonumber(t) / 1000) + 3600000)\n"
    "      return {1}\n"
    "    elseif string.find(rest, '\\n', 1, true) then\n"
    "      redis.call('SET', KEYS[1], rest, 'KEEPTTL')\n"
    "      return {1}\n"
    "    end\n"
    "  end\n"
    "end\n"
    RW_PARSED
    "if not v then return 0 end\n"
    /* the owner's hold goes first: a sole holder's release reads no clock */
    "local o, found = ARGV[1], false\n"
    "if st.f == 'W' and st.o == o then\n"
    "  st.f, st.o, st.rec, found = 'F', nil, nil, true\n"
    "else\n"
    "  for i, h in ipairs(st.h) do\n"
    "    if h.o == o then table.remove(st.h, i) found = true break end\n"
    "  end\n"
    "  drop(st, KEYS[1])\n"
    "end\n"
    "local q = {}\n"
    "for _, w in ipairs(st.q) do\n"
    "  if w.o ~= o then q[#q + 1] = w end\n"
    "end\n"
    "st.q = q\n"
    "local out = grant(st, ARGV[2], '')\n"
    "save(KEYS[1], st)\n"
    "if not found then return 0 end\n"
    "table.insert(out, 1, 1)\n"
    "return out\n";

/* KEYS: lock. ARGV: owner, waiter id ("CLIENT:TID:SEQ"), ttl, channel
 * prefix. A wait ends: {TOKEN} if the lock (or a read hold, or a permit)
 * was handed to this owner meanwhile (kept, its lease restarted), else 0
 * (the line removed; what it held up is granted). */
const char dlock__redis_rw_abandon_lua[] =
    RW_LIB
    "local v = redis.call('GET', KEYS[1])\n"
    "local st = parse(v)\n"
    "if not st or not v then return 0 end\n"
    "drop(st, KEYS[1])\n"
    "for i, w in ipairs(st.q) do\n"
    "  if w.id == ARGV[2] then table.remove(st.q, i) break end\n"
    "end\n"
    "local t, h = hold(st, ARGV[1])\n"
    "if t then\n"
    "  if h then h.u = now() + tonumber(ARGV[3]) else st.px = ARGV[3] end\n"
    "end\n"
    "grant(st, ARGV[4], '')\n"
    "save(KEYS[1], st)\n"
    "if t then return {fmt(t)} end\n"
    "return 0\n";

/* KEYS: lock. ARGV: owner, ttl, channel prefix. 1 if the owner's holder
 * line was renewed (only its own end moves), 0 if it is gone. */
const char dlock__redis_rw_extend_lua[] =
    RW_LIB
    "return extend(KEYS[1], ARGV[1], tonumber(ARGV[2]), ARGV[3])\n";

/* KEYS: locks. ARGV: "owner " (a writer's) or "+owner" (a holder line's)
 * and ttl for each, then the channel prefix. {1 or 0 for each}. */
const char dlock__redis_rw_extend_many_lua[] =
    RW_LIB
    "local r = {}\n"
    "for i = 1, #KEYS do\n"
    "  local o = ARGV[2 * i - 1]\n"
    "  if string.byte(o, 1) == 43 then\n"
    "    r[i] = extend(KEYS[i], string.sub(o, 2), tonumber(ARGV[2 * i]),\n"
    "                  ARGV[#ARGV])\n"
    "  else\n"
    "    local v = redis.call('GET', KEYS[i])\n"
    REDIS_LUA_RENEW_I
    "  end\n"
    "end\n"
    "return r\n";

/* KEYS: lock. ARGV: the channel prefix. dlock_break(): takes every hold
 * away in one step, whatever the key's form: the writer's record, every
 * holder line (read holds, permits); keeps the last token (in the new
 * holder's record or line, or in the tombstone "- TOKEN" of a release),
 * so that the next hold's token is greater than every evicted one; then
 * grants the head of the queue what can now proceed, exactly as a release
 * does (a message to each waiter granted; the waiters keep their places).
 * Returns {server ms, the value before, its PTTL, 0} when nobody held
 * the lock (nothing changed), else the same with 1 and the grants
 * {CLIENT, SEQ, TOKEN, TTL, ...}. */
const char dlock__redis_break_lua[] =
    RW_LIB
    "local v = redis.call('GET', KEYS[1])\n"
    "local p = redis.call('PTTL', KEYS[1])\n"
    "local t0 = now()\n"
    "if not v then return {t0, false, p, 0} end\n"
    "local st = parse(v)\n"
    /* not dlock's: left alone (the client says so) */
    "if not st then return {t0, v, p, 0} end\n"
    "local held = st.f == 'W'\n"
    "if not held then\n"
    "  drop(st, KEYS[1])\n"
    "  held = #st.h > 0\n"
    "end\n"
    "if not held then return {t0, v, p, 0} end\n"
    "st.f, st.o, st.rec, st.px, st.h = 'F', nil, nil, nil, {}\n"
    "local out = grant(st, ARGV[1], '')\n"
    "save(KEYS[1], st)\n"
    "local r = {t0, v, p, 1}\n"
    "for _, x in ipairs(out) do r[#r + 1] = x end\n"
    "return r\n";
