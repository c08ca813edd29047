/* SPDX-License-Identifier: MIT */
/*
 * backend.h -- the interface between the core and one store.
 *
 * A store is one source file in src/lib/backends/ that exports a single
 * `const dlock__backend dlock__backend_<x>` and is listed in registry.c.
 * The core knows nothing about any store: it owns reentrancy, the wait
 * loop, the watchdog, loss detection and the public API; the backend owns
 * the bytes on the wire (or in the file).
 *
 * Threading contract:
 *  - Every slot may be called from several threads at once (application
 *    threads and the client's background thread). A backend protects its own
 *    connections with its own mutexes.
 *  - The core never holds its client mutex while it calls a backend slot, so
 *    a backend may call the dlock__notify_* functions below at any time,
 *    from any thread, while holding its own locks.
 *  - Backends report failures with dlock__err(code, fmt, ...), which stores
 *    the message for the calling thread and returns the code. They never
 *    print, exit or abort, and never put a password in a message.
 *
 * Time: every deadline is a CLOCK_MONOTONIC time in milliseconds from
 * dlock__now_ms(). `op_deadline` bounds one store operation: a backend must
 * give up with DLOCK_ECONN once it passes (it may round it up to a few ms).
 */
#ifndef DLOCK_BACKEND_H
#define DLOCK_BACKEND_H

#include "host.h"

#include "dlock.h"
#include "uri.h"

#include <stddef.h>
#include <stdint.h>

#define DLOCK__FOREVER INT64_MAX

/*
 * One acquisition of one lock by one owner, from the first try to the
 * release. The core fills the inputs; the backend fills the outputs and may
 * keep its own per-lease state in `priv` (lease_size bytes, zeroed, freed by
 * the core).
 */
typedef struct dlock__lease {
    /* inputs (constant for the lease's life unless noted) */
    const char *name;  /* lock name, NUL-terminated */
    size_t name_len;
    const char *owner; /* unguessable owner id: "<client hex>:<tid>" */
    const char *desc;  /* human description: "host pid N tid N" */
    int64_t ttl_ms;    /* lease length; dlock_extend() may change it */
    unsigned flags;    /* DLOCK_FAIR, ... */
    unsigned kind;     /* DLOCK__WRITE (exclusive), DLOCK__READ (shared;
                        * CAP_SHARED stores only) or DLOCK__PERMIT (one
                        * of `permits`; CAP_PERMITS stores only) */
    unsigned permits;  /* DLOCK__PERMIT: the semaphore's N; else 0 */
    uint64_t waiter;   /* this lease's waiter number in the client; target
                        * of dlock__notify_waiter() */
    int waiting;       /* 0 on the first try; 1 once the core has armed
                        * notifications and will wait (fair queues join
                        * then) */
    int may_wait;      /* the caller waits if this try finds the lock
                        * busy (the waiter is registered): a store whose
                        * notifications are already armed for this client
                        * may queue it in this try, and say so (armed) */
    int64_t *hint;     /* two int64_t of scratch kept per lock name in the
                        * client, across its holds, for the backend alone
                        * (read and written with __atomic builtins only) */
    int64_t deadline;  /* when the caller's wait ends (CAP_NATIVE_WAIT
                        * only); DLOCK__FOREVER; <= now means try once */
    int cancel_fd;     /* a waiting acquire (deadline > now): an eventfd
                        * that dlock_cancel() makes readable; a store
                        * that waits in poll() watches it too, and a wait
                        * it ends returns as at the deadline (the core
                        * tells the caller DLOCK_ECANCELED). -1: none.
                        * Never read it: it stays readable (ABI 5) */
    const int *cancelled; /* nonzero (read with dlock__lease_cancelled())
                           * once dlock_cancel() asked; NULL: cannot be */
    /* outputs of acquire */
    uint64_t token;   /* fencing token of a successful acquire */
    int64_t retry_ms; /* on DLOCK_EBUSY: re-try after this long even without
                       * a notification (the holder's lease left); -1 none */
    int armed;        /* on DLOCK_EBUSY: this try queued the lease while its
                       * notifications were live (no arm() and second try
                       * needed) */
    int64_t woken_us; /* on DLOCK_OK from a CAP_NATIVE_WAIT acquire that
                       * found the lock held and waited: dlock__now_us()
                       * when its wait ended (the store's wake-up, before
                       * taking the lock); 0: it did not wait, or cannot
                       * tell (for the metrics: waits and hand-off times;
                       * the core zeroes it before every call) */
    int64_t started;  /* on DLOCK_OK: dlock__now_ms() just before the
                       * command after which the lease started, when
                       * that is not this call's start: a CAP_NATIVE_WAIT
                       * acquire that waited (the command that took the
                       * lock: later), or a hold this call confirmed by
                       * a read, which does not restart its lease (the
                       * moment before the read, plus the lease left it
                       * read, less ttl_ms: earlier); 0: the call's
                       * start */
    void *priv;       /* backend state, lease_size bytes */
} dlock__lease;

/* Kinds of hold (dlock__lease.kind). */
#define DLOCK__WRITE 0u
#define DLOCK__READ 1u
#define DLOCK__PERMIT 2u

/* Capabilities. */
#define DLOCK__CAP_LEASE 0x1u       /* locks expire unless renewed */
#define DLOCK__CAP_NATIVE_WAIT 0x2u /* acquire() itself waits until deadline */
#define DLOCK__CAP_HANDOVER 0x4u    /* release() hands the lock to a waiter
                                     * itself and the store tells that
                                     * waiter (a message is only a
                                     * wake-up: dlock__notify_waiter());
                                     * the core wakes no one on release */
#define DLOCK__CAP_WAITER_READS 0x8u /* loop_run() may run on a waiting
                                      * application thread: it only reads
                                      * notifications (never blocks) and
                                      * calls dlock__notify_*(). The fd is
                                      * read only while a thread waits: a
                                      * slot that waits for an answer on it
                                      * (arm) calls dlock__loop_wake()
                                      * first */
#define DLOCK__CAP_SHARED 0x10u  /* read holds (l->kind DLOCK__READ): the
                                  * store queues readers behind a waiting
                                  * writer, and a release wakes every
                                  * waiter that can then proceed */
#define DLOCK__CAP_PERMITS 0x20u /* counting semaphores (DLOCK__PERMIT):
                                  * the store keeps N with the name and
                                  * refuses another N with DLOCK_EINVAL */

typedef struct dlock__backend {
    const char *name; /* "redis", "file" */
    unsigned caps;
    size_t lease_size;

    /* Connects to the store described by `uri` (whose scheme selected this
     * backend) and returns the store state in *st. Required. */
    int (*open)(void **st, dlock_client *c, const dlock__uri *uri,
                int64_t timeout_ms);

    /* Frees the store state. Required. No other slot runs concurrently. */
    void (*close)(void *st);

    /* Tries once to take the lock for l->owner (CAP_NATIVE_WAIT: waits until
     * l->deadline). DLOCK_OK with l->token set; DLOCK_EBUSY with
     * l->retry_ms set; or an error code. Required. */
    int (*acquire)(void *st, dlock__lease *l, int64_t op_deadline);

    /* Prepares notifications for a waiting lease (subscribe, watch) before
     * the core's next try, so that no release between that try and the
     * wait is missed. Called again after dlock__notify_error(). Optional. */
    int (*arm)(void *st, dlock__lease *l, int64_t op_deadline);

    /* Undoes arm() and leaves any wait queue when `acquired` is 0. Called
     * once after every wait that reached arm(), even if arm() failed.
     * Optional. Cannot fail (best effort). */
    void (*disarm)(void *st, dlock__lease *l, int acquired);

    /* Frees the lock if l->owner holds it (atomic compare-and-delete).
     * DLOCK_OK; DLOCK_ENOTHELD when it was not ours any more; or an error.
     * Required. */
    int (*release)(void *st, dlock__lease *l, int64_t op_deadline);

    /* Sets the lease to ttl_ms from now if l->owner holds the lock.
     * DLOCK_OK; DLOCK_ENOTHELD; or an error. Required. */
    int (*extend)(void *st, dlock__lease *l, int64_t ttl_ms,
                  int64_t op_deadline);

    /* Fills *out (zeroed by the core) for dlock_inspect(). Required. */
    int (*inspect)(void *st, const char *name, size_t name_len,
                   dlock_info *out, int64_t op_deadline);

    /* The background thread polls this fd for reading (-1: none) and calls
     * loop_run() after every wake-up (readable or not). Both optional; both
     * run on the background thread only. */
    int (*loop_fd)(void *st);
    void (*loop_run)(void *st, int readable);

    /* Removes the state of locks free and unused for idle_ms (dlock_gc());
     * *removed = how many. Optional: NULL means DLOCK_ENOTSUP. */
    int (*gc)(void *st, int64_t idle_ms, uint64_t *removed,
              int64_t op_deadline);

    /* Picks another backend for this URI: a mode of the same store with
     * other capabilities (postgres://...?mode=advisory), or NULL to keep
     * this one. Called before open(). Optional. */
    const struct dlock__backend *(*select)(const dlock__uri *uri);

    /* How long before the lease's end (counted from the moment before the
     * command that set it) the core declares a hold lost: the clock drift
     * allowed between client and store. Optional: NULL means ttl/100 + 2
     * ms. Redlock makes it configurable (?drift_factor=, ?drift_ms=). */
    int64_t (*margin)(void *st, int64_t ttl_ms);

    /* The wait of lease l ends without the lock (deadline, error): leave
     * the store's queue. If the store already handed the lock to l's
     * owner, keep it instead: DLOCK_OK with l->token set and the lease
     * restarted by this call. DLOCK_EBUSY: left (or never queued); an
     * error: the store could not be told. Optional (CAP_HANDOVER stores
     * need it). */
    int (*abandon)(void *st, dlock__lease *l, int64_t op_deadline);

    /* Renews n leases at once: rcs[i] = DLOCK_OK, DLOCK_ENOTHELD or an
     * error for ls[i], set to ttls[i] from now. Returns DLOCK_OK when
     * every rcs[i] is set, else an error for all. Optional: the watchdog
     * calls extend() for each otherwise. */
    int (*extend_many)(void *st, dlock__lease *const *ls,
                       const int64_t *ttls, int *rcs, size_t n,
                       int64_t op_deadline);

    /* dlock_list(): appends to `out` (with dlock__list_add()) the locks
     * whose names start with prefix[0..plen), from `cursor` ("" = the
     * start; else one this slot made), at most `limit` of them (a few
     * more or fewer is allowed; 1 <= limit <= 10000), and sets out->next
     * (malloc'd: the cursor of what follows; NULL at the end). `flags`:
     * DLOCK_LIST_FREE lists free locks the store keeps too; without it
     * only those held or waited for. A cursor this slot did not make is
     * DLOCK_EINVAL, never a crash. The core clears `out` on failure.
     * Optional: NULL means DLOCK_ENOTSUP. */
    int (*list)(void *st, const char *prefix, size_t plen,
                const char *cursor, size_t limit, unsigned flags,
                dlock_list_page *out, int64_t op_deadline);

    /* dlock_break(): removes every hold of `name` in one atomic step
     * (the token counter kept, waiters woken as by a release) and fills
     * *out (zeroed by the core) with the store's view just before.
     * DLOCK_OK; DLOCK_ENOTHELD when nobody held it (nothing done); or an
     * error. Optional: NULL means DLOCK_ENOTSUP, with evict_unsupported
     * as the reason. */
    int (*evict)(void *st, const char *name, size_t len, dlock_info *out,
                 int64_t op_deadline);

    /* Why this store has no evict slot, for the DLOCK_ENOTSUP message
     * ("its locks are the holders' kernel locks"). Optional. */
    const char *evict_unsupported;

    /* dlock_cancel() asked a lease to stop waiting (its cancelled flag
     * is set and its cancel_fd readable): wake every wait of this store
     * that sleeps on something else than a poll() of cancel_fd (a
     * condition variable), so that it sees dlock__lease_cancelled() and
     * ends as at its deadline. Called without the client's mutex, maybe
     * after the acquire already returned (then a harmless wake-up); must
     * not block. Optional: stores whose waits all poll cancel_fd, or that
     * do not wait (CAP_NATIVE_WAIT unset: the core's own wait). (ABI 5.) */
    void (*cancel)(void *st);

    /* dlock_client_at_risk_max() for a store whose holds' lease ends the
     * core does not compute (no CAP_LEASE) but the store pushes
     * (dlock__notify_lease_end()): in *out, the largest at-risk margin
     * under which its keepalive has a fair chance (at least a sixth of
     * the lease) before a hold of ttl_ms is at risk. May talk to the
     * store (to learn the lease it grants). Optional: NULL means the
     * core's rule for CAP_LEASE stores, and INT64_MAX (no lease) for the
     * others. (ABI 6.) */
    int (*at_risk_max)(void *st, int64_t ttl_ms, int64_t *out,
                       int64_t op_deadline);
} dlock__backend;

/* Whether dlock_cancel() asked lease l to stop waiting. */
static inline int dlock__lease_cancelled(const dlock__lease *l)
{
    return l->cancelled && __atomic_load_n(l->cancelled, __ATOMIC_ACQUIRE);
}

/* --- services the core offers to backends ------------------------------ */

/* Stores a formatted message for the calling thread; returns `code`. */
DLOCK__HOST int dlock__err(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* CLOCK_MONOTONIC in milliseconds, and in microseconds. */
DLOCK__HOST int64_t dlock__now_ms(void);
DLOCK__HOST int64_t dlock__now_us(void);

/* The client's random id as 32 lowercase hex digits. */
DLOCK__HOST const char *dlock__client_id(const dlock_client *c);

/* Wakes one waiter of this client that waits (not in fair mode) for
 * `name`: the lock was released. */
DLOCK__HOST void dlock__notify_name(dlock_client *c, const char *name, size_t len);

/* Wakes every fair-mode waiter of this client for `name`: each tries once
 * more. For a release that could not name the head of the queue (it did
 * not see a waiter that was just joining). */
void dlock__notify_fair(dlock_client *c, const char *name, size_t len);

/* Wakes the waiter whose lease has l->waiter == waiter: it tries once
 * more (acquire() with l->waiting set), and the store's answer to that
 * try decides. What a store does with a hand-over's message (Redis'
 * PUBLISH, PostgreSQL's NOTIFY): anyone who may send on the channel can
 * send one, so it is a wake-up and nothing more; the try confirms it
 * (docs/design.md, "A message is a wake-up"). Wake-ups coalesce: any
 * number of them before the waiter looks cost one try. A waiter that is
 * gone is not an error: nothing happens. (In the module ABI since 4.) */
DLOCK__HOST void dlock__notify_waiter(dlock_client *c, uint64_t waiter);

/* The store handed the lock to the waiter whose lease has l->waiter ==
 * waiter, with this fencing token (CAP_HANDOVER): the waiter returns
 * DLOCK_OK with it, without asking the store again. Only for a grant
 * that the store itself answered on this client's own connection (the
 * reply of a release this client sent, naming a waiter of this client):
 * never for a pushed message (a pub/sub message, a notification) or
 * anything else that a reader, a publisher or another role could send
 * (docs/design.md, "Pushed messages"). A waiter that is gone is not an
 * error: the grant is dropped. */
DLOCK__HOST void dlock__notify_grant(dlock_client *c, uint64_t waiter, uint64_t token);

/* Wakes every waiter of the client: its notifications may have been lost
 * (a subscriber connection broke). Each re-arms, then re-tries. */
DLOCK__HOST void dlock__notify_error(dlock_client *c);

/* Declares lost every hold of this client for which match(lease, arg)
 * returns nonzero (a session ended, a connection stayed down too long):
 * dlock_release() will return DLOCK_ELOST, and the background thread calls
 * the holds' lost-lock callbacks with `why`. `match` runs with the
 * client's mutex held: it must only look at the lease (no locks, no store
 * calls). Any thread. */
DLOCK__HOST void dlock__notify_lost(dlock_client *c,
                        int (*match)(const dlock__lease *l, void *arg),
                        void *arg, const char *why);

/* For a store whose holds' leases the core does not renew (no
 * CAP_LEASE: ZooKeeper, etcd): the holds for which match(lease, arg)
 * returns nonzero are certain only until `end_ms` (monotonic ms;
 * DLOCK__FOREVER: as long as the store says nothing else), and `why`
 * says what keeps them from being extended ("" when nothing does). The
 * core sends their at-risk and safe events from it (design.md, "Stopping
 * the work before the lease ends"); the store still declares the loss
 * itself (dlock__notify_lost()). A store calls it whenever the end
 * changes and on every pass of its loop_run() (holds taken since are
 * covered then: the core wakes the loop after such an acquire while an
 * at-risk margin is set); a call that changes nothing costs a walk of
 * the client's holds. Returns at once while the client has no at-risk
 * margin. `match` runs with the client's mutex held, as for
 * dlock__notify_lost(). Any thread. (Module ABI 6.) */
DLOCK__HOST void dlock__notify_lease_end(dlock_client *c,
                              int (*match)(const dlock__lease *l, void *arg),
                              void *arg, int64_t end_ms, const char *why);

/* The deadline for a store call the store makes on the client's
 * background thread (in loop_run()): `deadline`, or earlier the moment
 * some hold of the client needs that thread (its at-risk moment, or the
 * local lease end of a hold at risk). Any thread. (Module ABI 6.) */
DLOCK__HOST int64_t dlock__loop_deadline(dlock_client *c, int64_t deadline);

/* Makes every hold of this client that the watchdog renews due for
 * renewal now, and wakes the background thread: the store changed under
 * the holds (a Redis failover) and each renewal checks its hold there;
 * one the store no longer has is declared lost. Any thread; takes the
 * client's mutex. (Module ABI 4.) */
DLOCK__HOST void dlock__renew_now(dlock_client *c);

/* Appends a copy of s (a waiter's description) to out->queue, growing
 * it. DLOCK_OK or DLOCK_ENOMEM (with a message). */
DLOCK__HOST int dlock__info_add_waiter(dlock_info *out, const char *s);

/* Appends one lock to a dlock_list() page: a copy of name[0..len) and
 * *info (whose queue, if any, the page takes over; *info is zeroed).
 * DLOCK_OK or DLOCK_ENOMEM (with a message; *info then cleared). */
DLOCK__HOST int dlock__list_add(dlock_list_page *out, const char *name,
                                size_t len, dlock_info *info);

/* Writes the 2n lowercase hex digits of in[0..n) and a NUL to out. */
DLOCK__HOST void dlock__hex(const void *in, size_t n, char *out);

/* Makes the background thread call loop_fd()/loop_run() soon. */
DLOCK__HOST void dlock__loop_wake(dlock_client *c);

/* The file store: always in libdlock. */
extern const dlock__backend dlock__backend_file;

/* Every other store, built in (the static library, or a build with
 * DLOCK_MODULES=OFF) or in its module (src/stores/<store>/). */
extern const dlock__backend dlock__backend_redis;
extern const dlock__backend dlock__backend_redlock;
extern const dlock__backend dlock__backend_zk;
extern const dlock__backend dlock__backend_etcd;
extern const dlock__backend dlock__backend_sqlite;
extern const dlock__backend dlock__backend_pg;
extern const dlock__backend dlock__backend_mysql;

/*
 * A store module: a shared object <store>.so in the module directory
 * (docs/development.md "Modules") exporting one `dlock__module_entry`.
 * The core refuses a module whose abi or version differs from its own.
 * DLOCK__MODULE_ABI changes whenever this header or host.h changes in a
 * way a module would notice (a slot, a field, a host function's contract);
 * `abi` stays the first field of every version of the struct.
 */
#define DLOCK__MODULE_ABI 6
typedef struct dlock__module {
    unsigned abi;                          /* DLOCK__MODULE_ABI */
    const char *version;                   /* DLOCK_VERSION_STRING */
    const dlock__backend *const *backends; /* NULL-terminated */
} dlock__module;

/* The module's entry, in src/stores/<store>/module.c:
 * DLOCK__MODULE(&dlock__backend_redis, &dlock__backend_redlock); */
#define DLOCK__MODULE(...)                                                  \
    static const dlock__backend *const dlock__module_backends[] = {         \
        __VA_ARGS__, NULL};                                                 \
    DLOCK__HOST extern const dlock__module dlock__module_entry;             \
    const dlock__module dlock__module_entry = {                             \
        DLOCK__MODULE_ABI, DLOCK_VERSION_STRING, dlock__module_backends}

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

#endif /* DLOCK_BACKEND_H */
