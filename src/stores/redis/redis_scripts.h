/* SPDX-License-Identifier: MIT */
/*
 * redis_scripts.h -- the Redis store's Lua scripts (redis_scripts.c), by
 * number: each state change of a lock is one of them (redis.c).
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
    NSCRIPTS
};

/* Their texts, loaded by the command connection (redis_conn.c). */
extern const char *const dlock__redis_script_text[NSCRIPTS];

#endif /* DLOCK_REDIS_SCRIPTS_H */
