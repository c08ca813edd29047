/* SPDX-License-Identifier: MIT */
/*
 * module.c -- the entry of redis.so, the Redis and Redlock store module:
 * what libdlock looks up after loading it (src/core/registry.c). Only in
 * the module: a build with the store built in does not compile this file.
 */
#include "store.h"

/* redis.c's and redlock.c's tables (their headers, redis_int.h and
 * redlock_int.h, cannot both be included: the scripts' names clash) */
extern const dlock__backend dlock__backend_redis;
extern const dlock__backend dlock__backend_redlock;

DLOCK__MODULE(&dlock__backend_redis, &dlock__backend_redlock);
