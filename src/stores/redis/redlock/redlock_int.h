/* SPDX-License-Identifier: MIT */
/*
 * redlock_int.h -- what the Redlock store's files share (redlock.c has the
 * protocol and its argument): redlock.c, the lock protocol (the scripts,
 * the backend's acquire, release, extend and inspect slots, the table);
 * redlock_conn.c, the command connections to the N nodes and the rounds
 * of requests sent to all of them at once; redlock_wait.c, the release
 * channels, the subscriber connections read by the client's thread and
 * the arm and disarm slots; redlock_open.c, the URI options, open and
 * close.
 */
#ifndef DLOCK_REDLOCK_INT_H
#define DLOCK_REDLOCK_INT_H

#include "redis_common.h"

#include <pthread.h>
#include <stdint.h>

#define DEFAULT_PORT 6379
#define MAX_NODES 63
#define NODE_BITS 6 /* token = counter << NODE_BITS | node index */
#define DEFAULT_NODE_TIMEOUT_MS 50
#define DEFAULT_DRIFT_FACTOR 0.01
#define DEFAULT_DRIFT_MS 2
#define OWED_MAX 64      /* replies one command connection may owe */
#define SUB_RETRY_MS 500 /* a failed subscriber connection waits this long */
#define JITTER_MS 50
#define BACKOFF_MAX_SHIFT 5 /* split votes in a row: window up to 1.6 s */
#define NO_TTL_RETRY_MS 1000
#define RELEASING_RETRY_MS 2 /* the holder's release is on its way */
#define PARTIAL_RETRY_MS 250 /* one owner on the nodes up, not a quorum */

/* The scripts (redlock.c), loaded on every new command connection. */
enum {
    S_ACQUIRE,
    S_RELEASE,
    S_EXTEND,
    S_REPAIR,
    S_RAISE,
    S_INSPECT,
    S_LIST,
    S_BREAK,
    S_PROCLAIM, /* leader election (DLOCK__REDIS_LUA_PROCLAIM) */
    NSCRIPTS
};

/* What a command connection owes, reply by reply, in order. */
enum { K_AUTH, K_SELECT, K_SKIP, K_ROUND, K_LOAD /* + script index */ };

typedef struct rnode {
    int idx;
    char *host;
    int port;
    char where[232]; /* "redis 127.0.0.1:6379" */

    /* command connection (store mu) */
    redisContext *ctx;
    int connecting;     /* the non-blocking connect has not completed */
    int64_t owed_since; /* a reply of an ended round is owed since */
    int64_t used;       /* last round on this connection */
    unsigned char owed[OWED_MAX];
    int owed_head, owed_len;
    int setup;              /* login and script loads owed */
    redisReply *got[2];     /* this round's replies */
    int ngot, want;         /* ... received and expected */
    int rc;                 /* this round failed on this node */
    char msg[512];          /* ... why */

    /* subscriber connection (store sub_mu) */
    redisContext *sub;
    int sub_connecting;
    int sub_up;    /* connected and logged in */
    int sub_login; /* login replies owed */
    int sub_wout;  /* output waits for the socket */
    int64_t sub_retry_at;
} rnode;

/* A release channel that waiters of this client rely on. */
typedef struct rchan {
    char *name;
    size_t len;
    int refs;
    int *want;        /* per node: SUBSCRIBE was the last command sent */
    int *outstanding; /* per node: commands sent, not answered */
    char last[96];    /* the last release seen ("OWNER COUNTER"; one copy
                       * arrives per node it freed) */
    int64_t last_at;  /* when its first copy arrived */
    struct rchan *next;
} rchan;

typedef struct rl_store {
    dlock_client *client;
    dlock__redis_config cfg;
    int n, quorum;
    rnode *nodes;
    int64_t node_timeout;
    double drift_factor;
    int64_t drift_ms;
    char where[80]; /* "redlock (5 nodes)" */

    pthread_mutex_t mu; /* command connections and rounds */
    char sha[NSCRIPTS][41];
    int sha_known;

    pthread_mutex_t sub_mu;
    pthread_cond_t sub_cv;
    int epfd;
    rchan *chans;
} rl_store;

typedef struct rl_lease {
    rchan *chan;
    int splits;         /* split votes in a row in this wait */
    int64_t not_before; /* no try before this (a split vote's back-off) */
} rl_lease;

typedef struct tally {
    int yes, no; /* nodes that said yes / no this round */
} tally;

/* The scripts' texts, by S_ index. */
extern const char *const dlock__redlock_script_text[NSCRIPTS];

/* ------------------------------------------------------------------------ */
/* redlock_conn.c: command connections and rounds (store mu held)           */
/* ------------------------------------------------------------------------ */

/* Starts a non-blocking connect to node n (TLS as tls says); NULL with
 * the reason in `why`. */
redisContext *dlock__redlock_start_connect(const dlock__rtls *tls,
                                           const rnode *n, char *why,
                                           size_t cap);

/* Socket events on a connection still connecting: 1 up (connected, and
 * TLS's handshake done), 0 not yet, -1 failed (why). */
int dlock__redlock_connect_step(const rnode *n, redisContext *ctx,
                                char *why, size_t cap);

/* The poll() events of a connection (connecting: what it waits for). */
short dlock__redlock_events(const redisContext *ctx, int connecting);

/* Closes node n's command connection (the replies it owes are lost). */
void dlock__redlock_node_drop(rnode *n);

/* Makes sure node n has a command connection (see redlock_conn.c). */
void dlock__redlock_node_connect(rl_store *rs, rnode *n, int64_t now);

/* A new round: no replies, no failures. */
void dlock__redlock_round_begin(rl_store *rs);

/* Ends a round: frees its replies; the replies still owed to it are
 * thrown away when they arrive. */
void dlock__redlock_round_free(rl_store *rs);

/* Queues command c on node n (connecting first if needed); its reply is
 * this round's (kind K_ROUND) or thrown away (K_SKIP). */
void dlock__redlock_node_send(rl_store *rs, rnode *n, rcmd *c, int kind,
                              int64_t now);

/* Node n still owes this round (or its setup) a reply. */
int dlock__redlock_node_busy(const rnode *n);

/* Runs the round until every node answered or failed, `decided` says the
 * outcome is known, or `deadline` passes (nodes still silent then fail). */
void dlock__redlock_round_run(rl_store *rs, int64_t deadline,
                              int (*decided)(const rl_store *, void *),
                              void *arg);

/* The store's message for a round in which too few nodes answered. */
int dlock__redlock_quorum_failure(const rl_store *rs, int answered,
                                  const char *what);

/* Replies whose first element (or integer value) is 1 say yes. */
int dlock__redlock_reply_yes(const redisReply *r);

/* This round's yes and no answers so far. */
void dlock__redlock_count(const rl_store *rs, tally *t);

/* `decided` of a round (arg: a tally): a quorum said yes, or too many
 * said no for one to. */
int dlock__redlock_quorum_decided(const rl_store *rs, void *arg);

/* Sends the nc commands `c` to every node and runs the round, for at most
 * round_ms after the last request was written (and until op_deadline),
 * until `decided` (NULL: until every node answered). Returns when the
 * round started. */
int64_t dlock__redlock_ask_all(rl_store *rs, rcmd *c, int nc,
                               int64_t round_ms, int64_t op_deadline,
                               int (*decided)(const rl_store *, void *),
                               void *arg);

/* Of the nodes that answered an integer: how many, and how many said
 * other than 1 (not ours); mine[i] (may be NULL): node i said 1. */
void dlock__redlock_count_ints(const rl_store *rs, int *answered,
                               int *notours, int *mine);

/* ------------------------------------------------------------------------ */
/* redlock_wait.c: release notifications (the backend's slots)               */
/* ------------------------------------------------------------------------ */

int dlock__redlock_loop_fd(void *st);
void dlock__redlock_loop_run(void *st, int readable);
int dlock__redlock_arm(void *st, dlock__lease *l, int64_t op_deadline);
void dlock__redlock_disarm(void *st, dlock__lease *l, int acquired);

/* ------------------------------------------------------------------------ */
/* redlock_operate.c: what the nodes say of a lock (inspect), of every lock */
/* (list), and breaking one                                                 */
/* ------------------------------------------------------------------------ */

dlock__inspect_slot dlock__redlock_inspect;
dlock__list_slot dlock__redlock_list;
dlock__evict_slot dlock__redlock_evict;

/* ------------------------------------------------------------------------ */
/* redlock_open.c: the backend's open and close slots                       */
/* ------------------------------------------------------------------------ */

int dlock__redlock_open(void **out, dlock_client *c, const dlock__uri *u,
                        int64_t timeout_ms);
void dlock__redlock_close(void *st);


/* The store's table (store.h), named by module.c and, in a build with
 * the store built in, by the core's registry. */
extern const dlock__backend dlock__backend_redlock;

#endif /* DLOCK_REDLOCK_INT_H */
