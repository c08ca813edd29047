/* SPDX-License-Identifier: MIT */
/*
 * zk_int.h -- what the ZooKeeper store's files share (zk.c has the recipe):
 * zk.c, the backend's slots (acquire, release, extend), the background
 * thread (declared losses, orphans, expired sessions), open and close;
 * zk_conn.c, the asynchronous calls with a deadline and the sessions
 * (one per distinct ttl) with their events; zk_queue.c, the lock nodes,
 * the queue of sequential nodes with the watch on a waiter's predecessor
 * (one acquisition attempt), and the orphans; zk_mine.c, the watch each
 * of our lock nodes keeps on itself, by which a holder learns that its
 * node was deleted; zk_operate.c, an operator's view (inspect, list,
 * break). The calls run one way: zk.c -> zk_operate.c -> zk_queue.c ->
 * zk_mine.c -> zk_conn.c (a session's events reach zk_mine.c through
 * zs->node_event).
 */
#ifndef DLOCK_ZK_INT_H
#define DLOCK_ZK_INT_H

#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <zookeeper/zookeeper.h>

#define ZK_DEFAULT_CHROOT "/dlock"
#define ZK_CHROOT_MAX 256
#define ZK_PARENT_MAX (ZK_CHROOT_MAX + 3 * DLOCK_NAME_MAX + 2)
#define ZK_PATH_MAX (ZK_PARENT_MAX + 128) /* parent + "/" + child */
#define ZK_SEQ_DIGITS 10

/* session states */
enum { S_CONNECTING, S_CONNECTED, S_EXPIRED, S_AUTHFAIL };

typedef struct zk_store zk_store;
typedef struct zk_lease zk_lease;

typedef struct zk_session {
    zk_store *zs;
    zhandle_t *zh;
    uint64_t sid;        /* our number for it, never reused */
    int64_t ttl;         /* requested session timeout (the lookup key) */
    int64_t timeout;     /* negotiated, once connected */
    int state;
    int ever_connected;
    int64_t down_since;  /* when the connection dropped; 0 while up */
    int declared_lost;   /* holds were declared lost in this outage */
    uint64_t conn_gen;   /* bumped at every (re)connection */
    int refs;            /* calls using it now; freed only at 0 */
    struct zk_session *next;
} zk_session;

/* A waiter's watch on its predecessor, or one of an observer's watches
 * (zk_elect.c). */
typedef struct zk_watch {
    const char *path;
    uint64_t sid;
    int fired;
    int deleted; /* the event was the node's deletion */
    struct zk_watch *next;
    int *bell;   /* an observer's: an eventfd written when it fires (and
                  * when its session ends); NULL for a waiter's */
} zk_watch;

/* A node that must go but could not be deleted yet (its delete, or its
 * create, lost its answer). `prefix`: find it by name prefix first. */
typedef struct zk_orphan {
    uint64_t sid;
    int prefix;
    char *path;
    struct zk_orphan *next;
} zk_orphan;

struct zk_store {
    dlock_client *client;
    char *hosts;       /* "h:p,h:p" */
    char *redacted;    /* for messages */
    char chroot[ZK_CHROOT_MAX + 1];
    char *auth;        /* "user:password" or NULL */
    struct ACL_vector *acl;
    struct ACL acl_auth[2];
    struct ACL_vector acl_auth_vec;
    int64_t timeout_ms;

    pthread_mutex_t mu; /* everything below */
    pthread_cond_t cv;  /* any answer, watch or session event */
    zk_session *sessions;
    zk_session *dead;   /* expired; closed by the background thread */
    uint64_t next_sid;
    zk_watch *watches;
    zk_lease *mine;     /* our nodes with a watch on themselves */
    /* a session's event for our nodes (dlock__zk_mine_event, set at open:
     * the sessions call up to the watch on our nodes through it) */
    int (*node_event)(zk_store *zs, zk_session *s, int type,
                      const char *path);
    uint64_t next_mid;
    zk_orphan *orphans;
    int timer_fd;
    int closing;
};

struct zk_lease {
    uint64_t sid;
    char path[ZK_PATH_MAX]; /* our node while we wait or hold */
    /* the watch on our own node (zk_operate.c), all under zs->mu */
    struct zk_lease *mnext, *mprev; /* in zs->mine while linked */
    uint64_t mid;       /* unique in the store: what notify_lost matches */
    int linked;
    int held;           /* acquire returned it: a deletion is a loss */
    int releasing;      /* our own delete is on its way: its event is ours */
    int gone;           /* the node's deletion was seen */
    int recheck;        /* look at the node again (and re-arm its watch) */
    int tell;           /* gone while held: the core must hear it */
    int64_t tell_at;    /* the next try at telling it (the core may not
                         * have registered the hold yet) */
    int64_t tell_until; /* ... until then */
};

typedef struct zk_op {
    zk_store *zs;
    int refs; /* caller + completion */
    int done;
    int rc;
    struct Stat stat;
    char *str;              /* create: the created path */
    struct String_vector kids; /* get_children */
    char *data;             /* get */
    int datalen;
    zoo_op_result_t *results; /* multi: one per op, written by the
                               * completion (so owned by the op) */
    int nresults;
} zk_op;

enum { C_CREATE, C_CHILDREN, C_DELETE, C_EXISTS, C_WEXISTS, C_GET, C_SET,
       C_WCHILDREN };

/* ------------------------------------------------------------------------ */
/* zk_conn.c: asynchronous calls, sessions                               */
/* ------------------------------------------------------------------------ */

/* Drops the caller's reference to op. */
void dlock__zk_op_put(zk_op *op);

/* Waits for op until `deadline`; returns its ZooKeeper code, or
 * ZOPERATIONTIMEOUT when the deadline passed first. The caller still owns
 * its reference (dlock__zk_op_put). */
int dlock__zk_op_wait(zk_op *op, int64_t deadline);

/* For dlock__notify_lost(): the lease lives in session *(uint64_t *)arg. */
int dlock__zk_match_session(const dlock__lease *l, void *arg);

/* Maps a ZooKeeper code to ours, with a message. */
int dlock__zk_error(zk_store *zs, const char *what, int zrc);

/* A connected session for `ttl` (zs->mu held; may drop it while
 * connecting), a new one when the one found has expired; NULL with *rc. */
zk_session *dlock__zk_session_get(zk_store *zs, int64_t ttl,
                                  int64_t deadline, int *rc);

/* Moves expired sessions out of the lookup list (zs->mu held), so the
 * next lookup opens a new one. */
void dlock__zk_sessions_retire(zk_store *zs);

zk_session *dlock__zk_session_by_sid(zk_store *zs, uint64_t sid);

/* Drops a reference taken by dlock__zk_session_get() or lease_session(). */
void dlock__zk_session_put(zk_store *zs, zk_session *s);

/* Starts one call (C_ kind) on session s; returns the op (caller waits
 * and puts it) or NULL with *zrc set. */
zk_op *dlock__zk_call_start(zk_store *zs, zk_session *s, int kind,
                            const char *path, const char *value, int vlen,
                            int mode, int *zrc);

/* Starts one multi of n deletes (all or none), or NULL with *zrc set.
 * The op's results say which delete failed. */
zk_op *dlock__zk_multi_delete_start(zk_store *zs, zk_session *s,
                                    char *const *paths, int n, int *zrc);

/* One call, waited for. *out receives the op on ZOK (caller puts it). */
int dlock__zk_call(zk_store *zs, zk_session *s, int kind,
                   const char *path, const char *value, int vlen, int mode,
                   int64_t deadline, zk_op **out);

/* After a call failed with a lost connection: waits until the session
 * has connected again (since generation `gen`) or is known to have
 * expired. 0: connected again, retry; 1: expired; -1: neither before
 * `deadline`. */
int dlock__zk_settle(zk_store *zs, zk_session *s, uint64_t gen,
                     int64_t deadline);

/* The session's connection generation (bumped at every reconnection). */
uint64_t dlock__zk_conn_gen(zk_store *zs, zk_session *s);

/* ------------------------------------------------------------------------ */
/* zk_queue.c: lock nodes, the queue of sequential nodes, orphans           */
/* ------------------------------------------------------------------------ */

/* <chroot>/<escaped name> into out (ZK_PARENT_MAX bytes). */
void dlock__zk_lock_path(const zk_store *zs, const char *name, size_t len,
                         char *out);

/* A lock child of a reader ("r-..."), not a writer ("l-...")? */
int dlock__zk_is_reader(const char *child);
/* A semaphore's permit child ("s<N>-..."): its N; 0 if not one. */
long dlock__zk_permits_of(const char *child);

/* Sorts the lock children in queue order, dropping foreign names; returns
 * how many remain at the front. */
int32_t dlock__zk_sort_children(struct String_vector *v);

/* Remembers a node to delete once its session answers again. */
void dlock__zk_orphan_add(zk_store *zs, uint64_t sid, const char *path,
                          int prefix);

/* Deletes node `path`, or (prefix) the child of its parent whose name
 * starts with its last component. ZOK when gone. */
int dlock__zk_delete_node(zk_store *zs, zk_session *s, const char *path,
                          int prefix, int64_t deadline);

/* One acquisition attempt in session s; DLOCK_OK, DLOCK_EBUSY, an error,
 * or 1 = the session expired underneath (start again). */
int dlock__zk_acquire_in(zk_store *zs, zk_session *s, dlock__lease *l,
                         int64_t op_ms);

/* ------------------------------------------------------------------------ */
/* zk_mine.c: the watch on our own nodes                                    */
/* ------------------------------------------------------------------------ */

/* Starts the watch on our new node zl->path (created in session s) and
 * links zl into zs->mine: a deletion from now on is seen. Returns the
 * exists call (its answer comes before that of any later call of the
 * session), or NULL with *zrc. */
zk_op *dlock__zk_mine_start(zk_store *zs, zk_session *s, zk_lease *zl,
                            int *zrc);

/* A watch or session event for session s (zs->mu held): a lock node of
 * ours deleted or changed, or the session connected again. Returns 1
 * when zk_operate's work (dlock__zk_mine_run) must run soon. */
/* zk_operate.c: a connected session to read with (any: reads need no
 * particular one), with a reference; NULL with *rc. */
zk_session *dlock__zk_any_session(zk_store *zs, int64_t deadline, int *rc);

/* zk_elect.c: leader election's watches (backend slots). */
int dlock__zk_watch_open(void *st, const char *name, size_t len, void **w,
                         int64_t op_deadline);
int dlock__zk_watch_wait(void *st, void *w, int64_t deadline, int cancel_fd);
void dlock__zk_watch_close(void *st, void *w);

int dlock__zk_mine_event(zk_store *zs, zk_session *s, int type,
                         const char *path);

/* The hold is ours now, unless our node was deleted meanwhile: 0 held
 * (a deletion from now on is a loss the core hears of), -1 gone. */
int dlock__zk_mine_hold(zk_store *zs, zk_lease *zl);

/* Our own delete is on its way (release): its event is not a loss. */
void dlock__zk_mine_releasing(zk_store *zs, zk_lease *zl);

/* Unlinks zl (the hold ended, or the acquisition failed). */
void dlock__zk_mine_unlink(zk_store *zs, zk_lease *zl);

/* The background thread's part: re-checks our nodes after a reconnection
 * (and re-arms their watches), tells the core of deleted holds. Returns
 * when it wants to run again (DLOCK__FOREVER: no need). */
int64_t dlock__zk_mine_run(zk_store *zs);

/* ------------------------------------------------------------------------ */
/* zk_operate.c: inspect, list, break                                       */
/* ------------------------------------------------------------------------ */

/* The inspect, list and evict slots. */
dlock__inspect_slot dlock__zk_inspect;
dlock__list_slot dlock__zk_list;
dlock__evict_slot dlock__zk_evict;

/* The name a lock node's escaped component stands for (into out,
 * DLOCK_NAME_MAX + 1 bytes): its length, or -1 when `comp` is not the
 * component of a lock name (bad escape, a byte that needs one, too
 * long, the server's own "zookeeper" at the root). */
long dlock__zk_unescape(const zk_store *zs, const char *comp, char *out);

/* zk_conn.c: the background thread's timer (zk.c's loop runs it) */

/* Makes the background thread run at `at` (or at an earlier time it was
 * already armed for). */
void dlock__zk_arm_timer(zk_store *zs, int64_t at);


/* The store's table (store.h), named by module.c and, in a build with
 * the store built in, by the core's registry. */
extern const dlock__backend dlock__backend_zk;

#endif /* DLOCK_ZK_INT_H */
