/* SPDX-License-Identifier: MIT */
/*
 * redis_scripts.h -- the Redis store's Lua scripts (redis_scripts.c), by
 * number: each state change of a lock is one of them (redis.c,
 * redis_rw.c).
 */
#ifndef DLOCK_REDIS_SCRIPTS_H
#define DLOCK_REDIS_SCRIPTS_H

enum {
    S_TRY,
    S_RELEASE,
    S_ABANDON,
    S_EXTEND,
    S_EXTEND_MANY,
    S_INSPECT,
    S_RW_TRY, /* shared holds and permits: redis_rw_scripts.c */
    S_RW_RELEASE,
    S_RW_ABANDON,
    S_RW_EXTEND,
    S_RW_EXTEND_MANY,
    S_LIST,  /* the operator's: redis_operate.c */
    S_BREAK, /* (its text: redis_rw_scripts.c) */
    S_PROCLAIM, /* leader election (redis.c) */
    NSCRIPTS
};

/* Lua, in a loop over the keys of a batch renewal: renews KEYS[i] (whose
 * value is v) for ARGV[2 * i] ms if it is still the writer o's ("owner
 * "): r[i] = 1, else 0. */
#define REDIS_LUA_RENEW_I                                                     \
    "if v and string.sub(v, 1, #o) == o then\n"                               \
    "  redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])\n"                         \
    "  r[i] = 1\n"                                                            \
    "else\n"                                                                  \
    "  r[i] = 0\n"                                                            \
    "end\n"

/* Their texts, loaded by the command connection (redis_conn.c). */
extern const char *const dlock__redis_script_text[NSCRIPTS];

/* The shared scripts' texts (redis_rw_scripts.c). */
extern const char dlock__redis_rw_try_lua[];
extern const char dlock__redis_rw_release_lua[];
extern const char dlock__redis_rw_abandon_lua[];
extern const char dlock__redis_rw_extend_lua[];
extern const char dlock__redis_rw_extend_many_lua[];
extern const char dlock__redis_break_lua[];

#endif /* DLOCK_REDIS_SCRIPTS_H */
