/* SPDX-License-Identifier: MIT */
/*
 * redis.h -- what the Redis programs (bench.c, bench_redlock.c,
 * bench_many.c, bench_list.c, bench_cluster.c) share to talk to a server
 * behind the store's back with hiredis: the server's address from a
 * redis:// URI, a connection, a command that must succeed. They link
 * redis.c and common.c.
 */
#ifndef DLOCK_BENCH_REDIS_H
#define DLOCK_BENCH_REDIS_H

#include <hiredis.h>

#include <stddef.h>

/* The host (into host[0..cap)) and port (6379 when it names none) of
 * "redis://HOST[:PORT][/...|?...]"; dies on any other URI. */
void r_address(const char *uri, char *host, size_t cap, int *port);

/* A connection to host:port, made within connect_s seconds; its commands
 * wait cmd_s seconds at most (0: as long as they take). Dies if it cannot
 * connect. */
redisContext *r_connect(const char *host, int port, int connect_s,
                        int cmd_s);

/* Frees r; dies naming `what` when there is none or it is an error. */
void r_ok(redisReply *r, const char *what);

/* A command (hiredis' format) on c: its reply, to be freed; dies naming
 * the format on an error reply or a broken connection. */
redisReply *r_command(redisContext *c, const char *fmt, ...);

/* The calls counted in `info`, an INFO commandstats answer, of the
 * commands in `names` (NULL-terminated, lower case), or of every command
 * but INFO when names is NULL (the commands scripts ran included). */
long long r_calls(const char *info, const char *const *names);

#endif
