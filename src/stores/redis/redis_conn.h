/* SPDX-License-Identifier: MIT */
/*
 * redis_conn.h -- the Redis store's command connection: one socket per
 * client, shared by every thread of the client, pipelined.
 *
 * Threads call dlock__rconn_run() at the same time: each writes its
 * commands at once (under the connection's mutex, so that the order of
 * the requests on the socket is the order of the callers in the queue of
 * calls in flight) and waits for its replies. One of the waiting threads
 * reads the socket for all; Redis answers in order, so each reply goes to
 * the oldest call still missing one. When the reading thread has its own
 * replies it passes the reading to the next caller in flight. So N
 * threads keep N requests in flight on one connection instead of taking
 * turns for whole round trips.
 *
 * A call whose deadline passes gives up (DLOCK_ECONN, "no answer within
 * N ms") without closing the connection: its replies are read and dropped
 * when they come. Only a request that stays unanswered for the client's
 * whole timeout closes the connection, failing every call in flight. A
 * closed connection is re-made by the next call (login, SELECT and
 * SCRIPT LOAD pipelined in one round trip). A connection the server
 * closed while it was idle (a restart, CLIENT KILL, its idle timeout) is
 * seen before anything is sent on it (one non-blocking poll() after 2 ms
 * of quiet), so the call goes to a new connection instead of failing.
 */
#ifndef DLOCK_REDIS_CONN_H
#define DLOCK_REDIS_CONN_H

#include "redis_sentinel.h"
#include "redis_common.h"

typedef struct dlock__rconn dlock__rconn;

/* Where and how to connect. The strings and the config are borrowed and
 * must outlive the connection. */
typedef struct dlock__rconn_target {
    const char *host; /* NULL for a unix socket */
    int port;
    const char *path; /* unix socket */
    const dlock__redis_config *cfg;
    const char *where; /* "redis 127.0.0.1:6379", for messages */
    const char *const *scripts; /* loaded on every new connection */
    int nscripts;
    /* Sentinel (NULL: host/port/path): the primary is asked of it, and
     * each new connection must answer ROLE "master" (redis_sentinel.h) */
    dlock__rtopo *topo;
} dlock__rconn_target;

/* Connects one socket to the target: AUTH and SELECT, then SCRIPT LOAD of
 * every script (their SHAs into sha[]) when load_scripts, else PING; one
 * pipelined round trip. The connection of the pipe below, and the
 * store's subscriber connection. With a topology, to the primary it
 * knows, with ROLE in the same round trip: a server that is not the
 * primary is left (DLOCK_ECONN) and the topology asks again next time;
 * *gen (may be NULL) gets the generation the connection belongs to. */
int dlock__rconn_connect(const dlock__rconn_target *t, int load_scripts,
                         char (*sha)[41], int64_t deadline,
                         redisContext **out, uint64_t *gen);

/* Closes the command connection if it was made under a generation older
 * than gen (its calls in flight fail with DLOCK_ECONN "failover"): the
 * next call connects to the new primary. */
void dlock__rconn_drop_older(dlock__rconn *rc, uint64_t gen);

/* Connects (with the scripts loaded) and returns the connection in *out.
 * DLOCK_OK, or DLOCK_ECONN/EAUTH/EINVAL/EPROTO/ENOMEM with a message. */
int dlock__rconn_open(dlock__rconn **out, const dlock__rconn_target *t,
                      int64_t deadline);

/* The same without connecting: the first call connects (a cluster's
 * node, redis_cluster.c). DLOCK_OK, or DLOCK_EINVAL/ENOMEM. */
int dlock__rconn_new(dlock__rconn **out, const dlock__rconn_target *t);

/* Closes and frees the connection. No call may be in progress. */
void dlock__rconn_free(dlock__rconn *rc);

/* Runs `n` commands as one pipeline, connecting first if needed; any
 * thread, concurrently with others. A command with script >= 0 is an
 * EVALSHA: its argv[1] is set to that script's SHA. On DLOCK_OK every
 * replies[i] is set (the caller frees them); an error reply is left for
 * the caller to judge. A NOSCRIPT answer (scripts flushed) loads the
 * scripts again and runs the pipeline once more. Commands whose argument
 * count exceeds rcmd's own arrays set ext_argv/ext_lens. With a topology,
 * a READONLY answer (the server was demoted: nothing ran) leaves that
 * connection and sends the pipeline once more, to the primary asked anew. */
int dlock__rconn_run(dlock__rconn *rc, rcmd *cmds, int n,
                     redisReply **replies, int64_t deadline);

#endif /* DLOCK_REDIS_CONN_H */
