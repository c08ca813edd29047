/* SPDX-License-Identifier: MIT */
/*
 * internal.h -- the core's structures. Never installed; stores see only
 * store.h (the module ABI).
 *
 * Locking: one mutex per client (c->mu) guards everything in the client,
 * its entries, holds, waiters and handles' counters. The core never holds
 * c->mu while it calls a backend slot or a user callback.
 */
#ifndef DLOCK_INTERNAL_H
#define DLOCK_INTERNAL_H

#include "store.h"

#include "dlock.h"
#include "metrics.h"
#include "uri.h"

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

typedef struct dlock__entry dlock__entry;
typedef struct dlock__hold dlock__hold;
typedef struct dlock__waiter dlock__waiter;

/* One hold: a lease the calling thread owns, with its reentrant count. */
struct dlock__hold {
    dlock__lease lease;   /* what the backend sees; first member */
    dlock *handle;        /* the handle that made it (options, callback) */
    dlock__entry *entry;  /* its name */
    pthread_t thread;     /* the owner thread */
    int count;            /* reentrant depth, >= 1 while held */
    int lost;             /* the hold is known to be gone */
    int announce;         /* lost, callback not called yet (background) */
    int renewing;         /* the watchdog is renewing it right now */
    int leaving;          /* threads waiting for `renewing` to clear to
                           * release, extend or close it: the watchdog
                           * starts no renewal of it meanwhile */
    int retrying;         /* its last renewal failed: renew_at is the
                           * retry's time, not to be moved earlier */
    int64_t lease_end;    /* local, conservative end of the lease */
    int64_t renew_at;     /* when the watchdog renews it next */
    char owner[64];       /* lease.owner points here */
    char desc[160];       /* lease.desc points here */
    char why[256];        /* why it was lost (for the callback's errmsg) */
    int64_t acquired_us;  /* when the store said "taken" (monotonic) */
    int64_t long_at;      /* when it becomes a long hold (ms), FOREVER */
    int lost_cause;       /* DLOCK__M_LOST_*, once lost */
    int at_risk;          /* AT_RISK told, SAFE not yet (background) */
    int64_t store_end;    /* no CAP_LEASE: the store's word on its local
                           * lease end (dlock__notify_lease_end), FOREVER */
    int64_t least_end;    /* dlock_options.at_least_ms: the lock is kept
                           * until then (monotonic ms), 0: none */
    int64_t most_end;     /* dlock_options.at_most_ms: the hold ends by
                           * then (monotonic ms), 0: none */
    int64_t asked_ttl;    /* the lease its renewal in flight asked for */
    char risk_why[256];   /* what keeps it from being renewed, "" */
    dlock__hold *next_in_entry;
    dlock__hold *prev, *next; /* the client's list of all holds */
};

/* An acquire in progress through a handle, for dlock_cancel(): on the
 * acquiring thread's stack, in the handle's list while it runs. */
typedef struct dlock__cancel dlock__cancel;
typedef struct dlock__set dlock__set;
struct dlock__cancel {
    int fd;   /* eventfd made readable by the cancel; -1: none */
    int flag; /* set (atomically) by the cancel */
    dlock__set *set; /* a set's record (multi.c): a cancel of it cancels
                      * the set (fd and flag unused); NULL: an acquire's */
    dlock__cancel *next;
};

/* A dlock_acquire_all() in progress (multi.c; docs/design.md "Several
 * locks at once"): on its caller's stack. Each handle of the set has a
 * record pointing here in its list of acquires in progress while the
 * set runs, so that a cancel of any of them ends the set's wait. */
struct dlock__set {
    int flag;           /* cancelled (atomic; c->mu when written) */
    dlock__cancel *cur; /* the acquire the set makes now; NULL between
                         * two (c->mu) */
};

/* A thread waiting in dlock_acquire(). */
struct dlock__waiter {
    uint64_t seq;
    dlock__entry *entry;
    pthread_cond_t cv;
    int fair;
    int notified; /* a wake-up arrived and was not consumed yet */
    int rearm;    /* notifications may have been lost: arm again */
    int granted;  /* the store handed it the lock (CAP_HANDOVER) */
    int sleeping; /* blocked on cv (may be asked to read for all) */
    const int *cancelled; /* its acquire's dlock__cancel flag */
    pthread_t thread; /* the waiting thread */
    uint64_t token; /* ... with this token */
    int64_t woken_us; /* when the first wake-up or hand-over arrived */
    dlock__waiter *prev, *next;
};

/* One lock name known to a client: shared by its handles and holds. */
struct dlock__entry {
    char *name;
    size_t len;
    uint64_t hash;
    size_t refs;         /* handles open on this name */
    dlock__hold *holds;  /* this client's holds of it, one per thread */
    int64_t hint[2];     /* the backend's per-name scratch (lease.hint) */
    dlock__mslot *ms;    /* its metrics (metrics.h): fixed while it lives */
    dlock__entry *chain; /* hash bucket chain */
};

struct dlock {
    dlock_client *client;
    dlock__entry *entry;
    dlock_options opts;
    int callbacks; /* lost-lock callbacks running for this handle */
    uint64_t seq;  /* the client's number for it (DLOCK_OWNER_HANDLE) */
    dlock__cancel *cancels; /* acquires in progress through it */
    int acquiring; /* DLOCK_OWNER_HANDLE: an acquire is in progress */
    int shut;      /* dlock_shutdown(): every later acquire is refused
                    * (c->mu) */
};

struct dlock_client {
    const dlock__backend *be;
    void *module; /* be's module (registry.c), NULL if built in */
    void *st;
    char *store; /* redacted URI */
    char id[33];
    char host[64];
    long pid;
    int64_t timeout_ms;

    pthread_mutex_t mu;
    pthread_cond_t cv; /* renewals, callbacks and references finishing */

    dlock__entry **buckets;
    size_t nbuckets, nentries;

    dlock__hold *holds; /* every hold, for the watchdog */
    size_t nholds;

    dlock__waiter *waiters;
    uint64_t next_waiter;
    uint64_t next_handle; /* dlock_open()'s numbers (dlock.seq) */
    /* CAP_WAITER_READS: the waiter that reads the backend's fd now (NULL:
     * the background thread does), and the eventfd that wakes it from
     * its poll() for wake-ups that do not come through that fd */
    dlock__waiter *reader;
    int reader_fd;
    /* eventfds of finished waits, for the next ones (dlock_cancel()):
     * a waiting acquire on a store that waits by itself takes one */
    int cfd_free[16];
    int n_cfd_free;

    /* The background thread, started by the first call that needs it
     * (dlock__thread_start(); docs/design.md "Threads"). Both flags are
     * written under c->mu with __atomic stores and only ever go from 0
     * to 1 (thread_started back to 0 once close joined it); read without
     * c->mu, they are read with __atomic loads. */
    pthread_t thread;   /* valid once thread_started is 1 */
    int thread_started;
    int thread_running; /* the background thread has reached its loop */
    int opened;        /* the store is open: a store's dlock__loop_wake()
                        * may start the thread from now on (c->mu) */
    int wake_fd;       /* eventfd that wakes the background thread */
    int stopping;
    int64_t next_wake; /* when the background thread will wake anyway */
    int closed;
    size_t refs; /* 1 for the client itself + open handles */

    dlock__metrics m;      /* metrics.c */
    dlock_event_cb ev_cb;  /* events (c->mu) */
    void *ev_arg;
    int64_t long_hold_ms;  /* 0: no long-hold events */
    int64_t at_risk_ms;    /* at-risk margin, 0: off (c->mu; read
                            * without it with __atomic) */
    dlock_observer *observers; /* running observers (elect.c; c->mu) */
    struct dlock__ring *rings; /* names to ring, for the background
                                * thread (elect.c; c->mu) */
};

/* error.c */
void dlock__err_clear(void);

/* util.c */
long dlock__tid(void);
/* Wakes waiter w: its condition variable, or the reader's eventfd when it
 * reads for the client (c->mu held). */
void dlock__wake_waiter(dlock_client *c, dlock__waiter *w);
long dlock__pid(void); /* getpid(), cached per thread (fork-safe) */

/* fds.c: the host functions of store.h ("Close-on-exec") */

/* client.c */
void dlock__client_unref(dlock_client *c); /* with c->mu held; unlocks */
/* Starts the client's background thread if it has not started, and
 * waits until it runs its loop (c->mu held; let go while waiting, so a
 * caller checks again what it checked before). 0, or the errno of
 * pthread_create() (nothing changed then). Once per client: calls that
 * race it wait for the same thread. */
int dlock__thread_start(dlock_client *c);
/* Wakes the background thread: a write of its eventfd, read once the
 * thread runs (any thread, c->mu held or not). dlock__loop_wake()
 * (store.h), a store's, also starts the thread. */
void dlock__wake(dlock_client *c);
/* Tells the background thread a hold needs attention at `when` (wakes
 * it only if that is earlier than its next wake-up). c->mu held. */
void dlock__schedule(dlock_client *c, int64_t when);

/* watchdog.c */
/* The client's background thread (arg: the client). */
void *dlock__background(void *arg);
/* A hold's lease was set from t0 (the send time of the command that set
 * it) for h->lease.ttl_ms: its local lease end and next renewal, and the
 * background thread told when to look at it next (c->mu held; for an
 * acquire, after the hold is linked). */
void dlock__hold_leased(dlock_client *c, dlock__hold *h, int64_t t0);

/* Takes node n out of the doubly linked list that starts at head (its
 * prev and next members; head is updated when n was first). */
#define DLOCK__UNLINK(head, n)                                               \
    do {                                                                     \
        if ((n)->prev)                                                       \
            (n)->prev->next = (n)->next;                                     \
        else                                                                 \
            (head) = (n)->next;                                              \
        if ((n)->next)                                                       \
            (n)->next->prev = (n)->prev;                                     \
    } while (0)

/* dlock_event's shared for a hold of this kind: 1 read, 2 permit, 0
 * exclusive. */
static inline int dlock__event_shared(int kind)
{
    return kind == DLOCK__READ ? 1 : kind == DLOCK__PERMIT ? 2 : 0;
}

/* names.c (c->mu held for all) */
dlock__entry *dlock__entry_ref(dlock_client *c, const char *name, size_t len);
void dlock__entry_unref(dlock_client *c, dlock__entry *e);
dlock__entry *dlock__entry_find(dlock_client *c, const char *name,
                                size_t len);
void dlock__entry_maybe_free(dlock_client *c, dlock__entry *e);

/* lock.c */
/* An event of this type about l's hold h: its lock, name, kind and token
 * (the rest zero, why ""). */
void dlock__event_start(dlock_event *e, int type, dlock *l,
                        const dlock__hold *h);
/* The shortest store operation a wait's deadline leaves (ms). */
#define DLOCK__MIN_OP_MS 10
/* The end of one store operation made while the caller waits until
 * `deadline` (a try when try_once: the client's timeout at least). */
int64_t dlock__op_deadline(const dlock_client *c, int64_t deadline,
                           int try_once);
/* Whether l is a DLOCK_OWNER_HANDLE handle (one owner per handle). */
int dlock__by_handle(const dlock *l);
/* Removes a hold from every list (c->mu held). */
void dlock__hold_unlink(dlock_client *c, dlock__hold *h);
/* Releases a hold in the store, best effort, and frees it (c->mu NOT
 * held; the hold must already be unlinked). */
void dlock__hold_drop(dlock_client *c, dlock__hold *h);
/* The store's side of a release of unlinked hold h: the release slot, or
 * before its at-least end the extend slot to that end (the lock left to
 * the store's lease). c->mu NOT held. */
int dlock__hold_let_go(dlock_client *c, dlock__hold *h, int64_t op_deadline);
/* The lease to ask for hold h at `now`, its length being `ttl`: raised to
 * cover its at-least end, cut at its at-most end; <= 0 once that end is
 * reached (watchdog.c; docs/design.md "Scheduled jobs"). */
int64_t dlock__ask_ttl(const dlock__hold *h, int64_t ttl, int64_t now);
/* The margin of this client's store (its margin slot, or the default). */
int64_t dlock__client_margin(const dlock_client *c, int64_t ttl_ms);
/* A lock name's checks (DLOCK_EINVAL with a message); *len its length. */
int dlock__check_name(const char *name, size_t *len);
/* The client is open and of this process (c->mu held). */
int dlock__usable(const dlock_client *c);

/* elect.c */
/* An election value's checks (DLOCK_EINVAL naming `fn` and election
 * `name`): 1..DLOCK_VALUE_MAX bytes without control characters. */
int dlock__check_value(const char *fn, const char *name, const char *value);
/* Tells the observers of name (the store's ring slot, if any): best
 * effort, after a campaign's acquire, a proclaim, a resign. Queued for
 * the client's background thread, which rings off the caller's path
 * (dlock__rings_run()); at once when it does not run. */
void dlock__ring(dlock_client *c, const char *name, size_t len);
/* The background thread rings what is queued (c->mu NOT held). */
void dlock__rings_run(dlock_client *c);
/* Stops every observer of the client (dlock_client_close(), before the
 * store closes); they are freed by dlock_observer_close(). */
void dlock__observers_stop(dlock_client *c);

/* The file store and the in-process store: always in libdlock. */
extern const dlock__backend dlock__backend_file;
extern const dlock__backend dlock__backend_mem;

/* Every other store, built in (the static library, or a build with
 * DLOCK_MODULES=OFF) or in its module (src/stores/<store>/). */
extern const dlock__backend dlock__backend_redis;
extern const dlock__backend dlock__backend_redlock;
extern const dlock__backend dlock__backend_zk;
extern const dlock__backend dlock__backend_etcd;
extern const dlock__backend dlock__backend_sqlite;
extern const dlock__backend dlock__backend_pg;
extern const dlock__backend dlock__backend_mysql;

/* registry.c */
/*
 * The backend of a URI scheme, built in or from its module (loaded here on
 * first use; *handle then keeps it, to give back with dlock__store_close;
 * NULL for a store built in). Errors (message set): DLOCK_EINVAL (unknown
 * scheme), DLOCK_ENOTSUP (a store left out of this build, a module not
 * installed or of another dlock).
 */
int dlock__store_open(const char *scheme, const dlock__backend **be,
                      void **handle);
void dlock__store_close(void *handle);

/* lock.c: dlock_acquire() (kind DLOCK__WRITE, or DLOCK__PERMIT for a
 * semaphore's handle) and dlock_acquire_shared() (DLOCK__READ) as a
 * step of set `set` (NULL: none), whose cancel it honours; `value` (not
 * NULL: a campaign, elect.c) the hold's description, and a hold the
 * owner has already is then DLOCK_EINVAL instead of re-entered. */
int dlock__acquire(dlock *l, int64_t wait_ms, unsigned kind,
                   dlock__set *set, const char *value);
/* A cancel record's cancel (c->mu held): its flag set, its eventfd made
 * readable; a set's record cancels the set and its acquire in progress. */
void dlock__cancel_fire(dlock__cancel *cx);

/* acquire.c */
/* A new hold of l's name for the calling thread (lock.c's acquire()
 * checked that it may: no hold of its own, the kind supported), waiting
 * until `deadline` (monotonic ms; DLOCK__FOREVER) when wait_ms is not 0;
 * `seq` its waiter number; `set` the set it is a step of (NULL: none). */
int dlock__acquire_new(dlock_client *c, dlock *l, unsigned kind,
                       int64_t wait_ms, int64_t start, int64_t start_us,
                       int64_t deadline, uint64_t seq, dlock__set *set,
                       const char *value);
/* Whether a cancel flag (NULL: none) is set. */
int dlock__is_cancelled(const int *flag);
/* DLOCK_ECANCELED for an acquire of hold h that dlock_cancel() ended
 * after `waited` ms, and DLOCK_ECANCELED for one through a handle that
 * dlock_shutdown() shut (messages set). */
int dlock__cancel_message(const dlock__hold *h, int64_t waited);
int dlock__shut_message(const dlock *l);

/* Whether table be keeps the module ABI's rules (store.h): DLOCK_OK, or
 * DLOCK_ENOTSUP with a message naming the capability and the slot it
 * lacks (`where`: the module's path, or "built in"). */
int dlock__backend_check(const dlock__backend *be, const char *where);

#endif /* DLOCK_INTERNAL_H */
