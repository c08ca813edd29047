/* SPDX-License-Identifier: MIT */
/*
 * redis_int.h -- what the parts of the Redis store (redis:// and unix://)
 * share: its state, the lease's scratch, the key and line formats.
 * redis.c is the exclusive lock and the connections; redis_rw.c the
 * shared (read) holds and semaphores, and the leaving of a lock of
 * either kind (release, abandon, the undoing of a lost try).
 */
#ifndef DLOCK_REDIS_INT_H
#define DLOCK_REDIS_INT_H

#include "redis_cluster.h"
#include "redis_conn.h"
#include "redis_scripts.h"

#include <inttypes.h>
#include <stdio.h>
#include <time.h>

#define PREFIX_MAX DLOCK__REDIS_PREFIX_MAX
#define KEY_MAX DLOCK__REDIS_KEY_MAX
#define LINE_MAX 320 /* a queue line: "\nCLIENT:TID:SEQ [KIND ]TTL DESC" */

typedef struct redis_store {
    dlock_client *client;
    char *host; /* NULL for unix:// */
    int port;
    char *path; /* unix socket */
    dlock__redis_config cfg; /* prefix, db, timeout, credentials */
    char where[320]; /* "redis 127.0.0.1:6379", for messages */
    char chan_prefix[PREFIX_MAX + 4]; /* "Pc:" */
    char chan[PREFIX_MAX + 40];       /* "Pc:CLIENTID": our channel */
    size_t chan_len;

    dlock__rconn_target target; /* how to connect (both connections) */
    dlock__rconn *conn;         /* the pipelined command connection */

    pthread_mutex_t sub_mu;
    pthread_cond_t sub_cv;
    redisContext *sub; /* the subscriber connection (non-blocking) */
    int sub_connecting;
    int subscribed; /* SUBSCRIBE of our channel confirmed on sub */
    uint64_t sub_gen; /* the topology's generation of sub */

    /* redis-sentinel:// (NULL otherwise): the primary and its moves; the
     * subscriber and the sentinel watch in one epoll set (epfd, the
     * loop_fd); acted_gen: the generation the store has moved to */
    dlock__rtopo *topo;
    int epfd;
    uint64_t acted_gen;
    /* ?min_replicas=N&replica_timeout=MS: WAIT after an acquire and with
     * every renewal (0: never) */
    long min_replicas;
    int64_t replica_timeout_ms;

    /* redis-cluster:// (NULL otherwise): the slot map and a command
     * connection per node (conn is NULL); the scripts with SPUBLISH;
     * one subscriber connection per node (in epfd, the loop_fd), each
     * lock's channel P{NAME}c:CLIENTID subscribed while this client's
     * waiters wait for it (redis_wait.c) */
    dlock__rcluster *cluster;
    char *cscripts[NSCRIPTS];
    struct csub *csubs;
    struct cconn *cconns;
    uint64_t csub_clock; /* counts the channels that became idle */
    int cconn_connecting; /* a subscriber connection is being made */
} redis_store;

typedef struct redis_lease {
    int queued;   /* its line may sit in the lock's queue */
    uint64_t gen; /* the topology's (the slot's) generation when acquired */
    int subbed;   /* cluster: counted in its channel's subscription */
} redis_lease;

/* The topology's generation now (0 without one); on a cluster, the key's
 * slot's. */
static inline uint64_t topo_gen(const redis_store *rs, const char *key,
                                size_t kl)
{
    if (rs->cluster)
        return dlock__rcluster_slot_gen(rs->cluster,
                                        dlock__rcluster_slot(key, kl));
    return rs->topo ? dlock__rtopo_gen(rs->topo) : 0;
}

/* The lease's hint[0]: until when (monotonic ms) this client believes
 * the lock held by someone else (0: it does not know). Set when a
 * release hands the lock over or a try finds it held; a waiter's first
 * try appends blindly only while it holds. Never decides anything but
 * which script runs and the fallback timer. */
static inline int64_t hint_get(const dlock__lease *l)
{
    return __atomic_load_n(&l->hint[0], __ATOMIC_RELAXED);
}

static inline void hint_set(const dlock__lease *l, int64_t until)
{
    __atomic_store_n(&l->hint[0], until, __ATOMIC_RELAXED);
}

static inline size_t lock_key(const redis_store *rs, const char *name, size_t len,
                       char *out)
{
    return dlock__redis_key(&rs->cfg, name, len, "", out);
}

/* This host's wall clock in ms (a holder's record says when it took the
 * lock by it; a release's tombstone too). */
static inline int64_t wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The owner as the scripts compare it: followed by a space. */
static inline size_t owner_sp(const dlock__lease *l, char *out, size_t cap)
{
    int n = snprintf(out, cap, "%s ", l->owner);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* The lease's queue line, "\nCLIENT:TID:SEQ [KIND ]TTL DESC" (KIND "r"
 * for a reader, "pN" for a permit of N, nothing for a writer), and in
 * *id_len the length of its id, "\nCLIENT:TID:SEQ " (the owner is
 * CLIENT:TID). */
static inline size_t queue_line(const dlock__lease *l, char *out, size_t cap,
                                size_t *id_len)
{
    char kind[16] = "";
    int id = snprintf(out, cap, "\n%s:%" PRIu64 " ", l->owner, l->waiter);
    int n;

    if (l->kind == DLOCK__READ)
        snprintf(kind, sizeof(kind), "r ");
    else if (l->kind == DLOCK__PERMIT)
        snprintf(kind, sizeof(kind), "p%u ", l->permits);
    n = id < 0 || (size_t)id >= cap
            ? id
            : snprintf(out + id, cap - (size_t)id, "%s%lld %s", kind,
                       (long long)l->ttl_ms, l->desc);
    if (id < 0 || n < 0 || (size_t)id + (size_t)n >= cap) {
        *id_len = 0;
        return 0;
    }
    *id_len = (size_t)id;
    return (size_t)id + (size_t)n;
}

/* Runs cmds[0..n) on the server that holds `key`: the one server, or on
 * a cluster the primary of the key's slot (redirections followed). As
 * dlock__rconn_run(). A map that moved meanwhile is acted on (every hold
 * checked at once, redis_wait.c). */
int dlock__redis_run(redis_store *rs, const char *key, size_t kl,
                     rcmd *cmds, int n, redisReply **replies,
                     int64_t deadline);

/* One script c for the lock `name` whose key is key[0..kl), run as by
 * dlock__redis_run(): DLOCK_OK with its answer in *r (the caller frees
 * it), or an error, a server's error reply mapped (and freed). */
int dlock__redis_ask(redis_store *rs, const char *key, size_t kl, rcmd *c,
                     const char *name, redisReply **r, int64_t deadline);

/* redis_wait.c: the client's loop, arm and disarm (backend slots), whether
 * a waiter of this client can be handed lease l's lock now (the channel
 * it would hear it on is subscribed), and the subscribers' end. */
int dlock__redis_loop_fd(void *st);
void dlock__redis_loop_run(void *st, int readable);
int dlock__redis_arm(void *st, dlock__lease *l, int64_t deadline);
void dlock__redis_disarm(void *st, dlock__lease *l, int acquired);
int dlock__redis_listening(redis_store *rs, dlock__lease *l);
void dlock__redis_sub_close(redis_store *rs);

/* The channel prefix the scripts publish a hand-over on, for the lock
 * whose key is key[0..kl): "Pc:" (CLIENTID follows), or on a cluster
 * "P{NAME}c:", in the lock's own slot (SPUBLISH). Into out (KEY_MAX + 4
 * bytes); returns its length. */
static inline size_t chan_for(const redis_store *rs, const char *key,
                              size_t kl, char *out)
{
    if (!rs->cluster) {
        size_t n = strlen(rs->chan_prefix);
        memcpy(out, rs->chan_prefix, n + 1);
        return n;
    }
    memcpy(out, key, kl);
    memcpy(out + kl, "c:", 3);
    return kl + 2;
}

static inline int server_error(const redis_store *rs, const char *msg,
                        const char *lock)
{
    return dlock__redis_server_error(rs->where, rs->cfg.password, msg, lock);
}

/* redis_elect.c: leader election's ring and watch (backend slots). */
int dlock__redis_ring(void *st, const char *name, size_t len,
                      int64_t deadline);
int dlock__redis_watch_open(void *st, const char *name, size_t len,
                            void **out, int64_t deadline);
int dlock__redis_watch_wait(void *st, void *w, int64_t deadline,
                            int cancel_fd);
void dlock__redis_watch_close(void *st, void *w);

/* After a try whose answer was lost (rc DLOCK_ECONN): its undoing sent
 * behind it (redis_rw.c). Returns rc, its message kept. */
int dlock__redis_undo_lost_try(redis_store *rs, dlock__lease *l, int rc);
/* The answer to a try (either kind's script, redis_rw.c): the token taken,
 * or busy with the lease left and whether it queued. */
int dlock__redis_try_answer(const redis_store *rs, dlock__lease *l,
                            const redisReply *r, int64_t now);

/* A waiter's look after a wake-up (redis_confirm.c): when a read can
 * decide, GET and PTTL (and TIME for a read hold or permit) of its
 * lock's key: DLOCK_OK with l->token and l->started from the key when it
 * names the waiter's owner a live holder; DLOCK_EBUSY (l->retry_ms set)
 * while its line still waits behind a holder; DLOCK_ECONN (its leaving
 * sent behind it) when the read's answer was lost;
 * DLOCK__REDIS_UNDECIDED otherwise: the try's script decides. */
#define DLOCK__REDIS_UNDECIDED 1
int dlock__redis_confirm(redis_store *rs, dlock__lease *l, int64_t deadline);

/* A release handed the lock to waiter SEQ of client C with TOKEN: if C
 * is this client, that waiter is handed the lock at once (the release's
 * own reply says so: a grant, unlike a message; redis_rw.c). */
void dlock__redis_own_grant(const redis_store *rs, const redisReply *c,
                            const redisReply *seq, const redisReply *token);

/* The answer of an abandon script (either form): DLOCK_EBUSY left,
 * DLOCK_OK handed over as we left (l->token set), or DLOCK_EPROTO. */
int dlock__redis_abandon_answer(const redis_store *rs, const redisReply *r,
                                dlock__lease *l);

/* The backend's release and abandon slots (redis_rw.c), for a lease of
 * any kind: the exclusive scripts first, which hand a key in a shared
 * form to the shared ones (dlock__redis_rw_release(), _abandon()). */
int dlock__redis_release(void *st, dlock__lease *l, int64_t deadline);
int dlock__redis_abandon(void *st, dlock__lease *l, int64_t deadline);

/* Shared holds and permits (redis_rw.c): the backend slots for a lease
 * of kind DLOCK__READ or DLOCK__PERMIT, and for a writer whose exclusive
 * script found the key in a shared form. `queue`: the try may stay in the
 * queue (the client listens on its channel). */
int dlock__redis_rw_acquire(redis_store *rs, dlock__lease *l, int queue,
                            int64_t deadline);
int dlock__redis_rw_release(redis_store *rs, dlock__lease *l,
                            int64_t deadline);
int dlock__redis_rw_abandon(redis_store *rs, dlock__lease *l,
                            int64_t deadline);
int dlock__redis_rw_extend(redis_store *rs, dlock__lease *l, int64_t ttl_ms,
                           int64_t deadline);

/* Fills *out from the answer to the inspect script ({server ms, value,
 * pttl}), whatever form the key is in (exclusive, shared, semaphore,
 * tombstone). Whatever the server sent gives an answer or DLOCK_EPROTO. */
int dlock__redis_rw_inspect(const redis_store *rs, const char *name,
                            const redisReply *s, dlock_info *out);

/* The same from its parts: the server's clock in ms, the key's value (a
 * string; nil: free, nothing kept) and its PTTL. What inspect, list and
 * break share (each entry of a dlock_list() page is filled by this, as
 * dlock_inspect() would fill it). */
int dlock__redis_inspect_value(const redis_store *rs, const char *name,
                               long long now, const redisReply *v,
                               long long pttl, dlock_info *out);

/* dlock_inspect(), dlock_list() and dlock_break() (redis_operate.c). */
dlock__inspect_slot dlock__redis_inspect;
dlock__list_slot dlock__redis_list;
dlock__evict_slot dlock__redis_evict;


/* The store's table (store.h), named by module.c and, in a build with
 * the store built in, by the core's registry. */
extern const dlock__backend dlock__backend_redis;

#endif /* DLOCK_REDIS_INT_H */
