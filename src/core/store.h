/* SPDX-License-Identifier: MIT */
/*
 * store.h -- the module ABI: everything between the core and one store.
 *
 * A store is a folder src/stores/<store>/ that includes this header (and
 * the shared machinery's, src/common/) and nothing of the core's or of
 * another store's. It fills one `const dlock__backend` per kind of store
 * it serves (designated initialisers, DLOCK__STORE_HEAD first) and names
 * them in its module.c with DLOCK__MODULE(). The core knows nothing about
 * any store: it owns reentrancy, the wait loop, the watchdog, loss
 * detection and the public API; the store owns the bytes on the wire (or
 * in the file). docs/design.md, "The house", walks through adding one.
 *
 * Versions. DLOCK__STORE_ABI numbers this header: it changes whenever a
 * module would notice (a slot, a field, a host function's contract). The
 * core loads modules of DLOCK__STORE_ABI_OLDEST to DLOCK__STORE_ABI and
 * refuses any other with a message naming both versions; a module's
 * dlock release does not matter. Every table says which version it was
 * built for and its size (DLOCK__STORE_HEAD). A later version that only
 * appends slots at the end of the table may keep DLOCK__STORE_ABI_OLDEST,
 * registry.c then copying an older table into a zeroed one of its own
 * (the slots it lacks NULL: "not provided"); any other change raises
 * DLOCK__STORE_ABI_OLDEST to the new version. The host functions below
 * are exported under the one symbol version DLOCK_STORE
 * (cmake/dlock.map.in): removing one, or changing its contract, raises
 * it too.
 *
 * Capabilities are checked against slots when a store is loaded
 * (dlock__backend_check(), registry.c): a table that claims one without
 * the slot it needs, or names an unknown one, is refused.
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
#ifndef DLOCK_STORE_H
#define DLOCK_STORE_H

#include "dlock.h"

#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

/* A function libdlock lends to store modules (exported under DLOCK_STORE;
 * everything else in the core stays hidden). Adding one adds to the
 * module ABI: say why where it is declared. */
#define DLOCK__HOST __attribute__((visibility("default")))

/* This header's version, and the oldest whose modules still load. */
#define DLOCK__STORE_ABI 9
#define DLOCK__STORE_ABI_OLDEST 9

/* --- store URIs (parsed by the core: uri.c) ----------------------------- */

typedef struct dlock__host {
    char *host; /* name or address; IPv6 without brackets */
    int port;   /* 0 when absent */
} dlock__host;

typedef struct dlock__param {
    char *key;
    char *value;
} dlock__param;

typedef struct dlock__uri {
    char *scheme;     /* lowercase */
    char *user;       /* NULL when absent */
    char *password;   /* NULL when absent ("" when given empty) */
    dlock__host *hosts;
    size_t nhosts;    /* 0 for file:// and unix:// */
    char *path;       /* "" when absent; "/..." otherwise */
    dlock__param *params;
    size_t nparams;
    char *redacted;   /* the URI as given, password replaced by "***" */
} dlock__uri;

/* The value of query parameter `key`, or NULL. */
DLOCK__HOST const char *dlock__uri_param(const dlock__uri *u, const char *key);

/* DLOCK_EINVAL naming the first parameter not in the NULL-terminated
 * `allowed` list. */
DLOCK__HOST int dlock__uri_check_params(const dlock__uri *u,
                                        const char *const *allowed);

/* Parses a non-negative decimal integer no larger than `max` into *out.
 * Returns 0 on success, -1 otherwise. */
DLOCK__HOST int dlock__parse_int(const char *s, long long max, long long *out);

/* --- the store's table -------------------------------------------------- */

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

/* The types of the operator's slots (inspect, list, evict), which a store
 * often writes in a file of their own: its header declares them
 * `dlock__list_slot dlock__foo_list;`. Their contracts: at the slots. */
typedef int dlock__inspect_slot(void *st, const char *name, size_t name_len,
                                dlock_info *out, int64_t op_deadline);
typedef int dlock__list_slot(void *st, const char *prefix, size_t plen,
                             const char *cursor, size_t limit,
                             unsigned flags, dlock_list_page *out,
                             int64_t op_deadline);
typedef int dlock__evict_slot(void *st, const char *name, size_t len,
                              dlock_info *out, int64_t op_deadline);

typedef struct dlock__backend {
    /* The module ABI this table was built for (DLOCK__STORE_ABI) and its
     * size: the first two fields of every version. DLOCK__STORE_HEAD
     * fills both. */
    unsigned abi;
    size_t size;
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
    dlock__inspect_slot *inspect;

    /* The background thread polls this fd for reading (-1: none) and calls
     * loop_run() after every wake-up (readable or not). Both optional; both
     * run on the background thread only. The thread starts with the
     * client's first acquire, or when the store asks for it
     * (dlock__loop_wake()), not at open (docs/design.md "Threads"): until
     * then nobody reads the fd, so nothing a store puts there while no
     * acquire was made may grow without bound. */
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
    dlock__list_slot *list;

    /* dlock_break(): removes every hold of `name` in one atomic step
     * (the token counter kept, waiters woken as by a release) and fills
     * *out (zeroed by the core) with the store's view just before.
     * DLOCK_OK; DLOCK_ENOTHELD when nobody held it (nothing done); or an
     * error. Optional: NULL means DLOCK_ENOTSUP, with evict_unsupported
     * as the reason. */
    dlock__evict_slot *evict;

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

    /* The owner leaves hold l to the store until ttl_ms from now
     * (dlock_options.at_least_ms, docs/design.md "Scheduled jobs"): its
     * lease set as by extend() (compare-on-owner: DLOCK_OK,
     * DLOCK_ENOTHELD or an error), then whatever the lease keeps in this
     * process let go of as by release() (a connection, a gate), whatever
     * the answer; the lock is freed when its lease ends, its waiters
     * woken as at any lease end. Optional: NULL means extend(), for a
     * store whose holds keep nothing in the process. (ABI 8.) */
    int (*keep)(void *st, dlock__lease *l, int64_t ttl_ms,
                int64_t op_deadline);

    /* dlock_client_check(): what this store can tell of itself that makes
     * locks unsafe or slow (for holds of ttl_ms), each told with
     * dlock__check_finding(); the store's clock, if it has one, with
     * dlock__check_clock(); what it could not check with
     * dlock__check_note(). DLOCK_OK, or an error (the check fails with
     * it). Optional: NULL checks nothing of the store's own. (ABI 8.) */
    int (*check)(void *st, int64_t ttl_ms, struct dlock_check *out,
                 int64_t op_deadline);

    /* --- leader election (ABI 9; docs/design.md "Leader election") --- */

    /* Sets the description of l->owner's exclusive hold l to `desc` (its
     * leader's value) in one compare-on-owner write, its token and lease
     * unchanged. DLOCK_OK; DLOCK_ENOTHELD (not ours: nothing written); or
     * an error. Optional: NULL means DLOCK_ENOTSUP. */
    int (*proclaim)(void *st, dlock__lease *l, const char *desc,
                    int64_t op_deadline);

    /* Tells the watchers of `name` (watch_open) that its state changed:
     * called after a campaign's acquire, a proclaim and a resign's
     * release, for a store whose watch does not see those writes by
     * itself (a publish). Anyone who may send it can, so a watcher takes
     * it as a wake-up only. Optional: NULL when the watch sees every
     * write. */
    int (*ring)(void *st, const char *name, size_t len, int64_t op_deadline);

    /* A watch of lock `name`, for an observer's thread: from watch_open()'s
     * return on, every write of the lock's state (or ring of the name)
     * ends a watch_wait() in progress or the next one. watch_wait() waits
     * until then (DLOCK_OK: something came, maybe several things; the
     * caller reads the store), until `deadline` (monotonic ms) or until
     * cancel_fd is readable (never read it): DLOCK_EBUSY; or an error
     * when the watch broke (the caller closes it and opens another).
     * watch_close() frees it. The three run on the observer's thread
     * only, never after close(). All three, or none (then observers get
     * DLOCK_ENOTSUP with watch_unsupported as the reason). */
    int (*watch_open)(void *st, const char *name, size_t len, void **w,
                      int64_t op_deadline);
    int (*watch_wait)(void *st, void *w, int64_t deadline, int cancel_fd);
    void (*watch_close)(void *st, void *w);

    /* 1: the watch also reports a lease's end (the store deletes an
     * expired hold and tells its watchers, as etcd and ZooKeeper do), so
     * an observer needs no wake-up of its own at the leader's lease end.
     * 0: the observer's wait ends at the lease end it read. */
    int watch_sees_expiry;

    /* Why this store has no watch (or no proclaim), for DLOCK_ENOTSUP
     * messages. Optional. */
    const char *watch_unsupported;
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

/* Makes the background thread call loop_fd()/loop_run() soon, starting
 * it first if it has not started (after open() returned; best effort: a
 * start that fails is tried again by the next acquire). Any thread; the
 * calling thread's error message is left alone. */
DLOCK__HOST void dlock__loop_wake(dlock_client *c);

/* For the check slot: adds a finding to *out (its texts cut to fit);
 * DLOCK_OK or DLOCK_ENOMEM. */
DLOCK__HOST int dlock__check_finding(struct dlock_check *out,
                                     const char *check, const char *what,
                                     const char *fix);
/* This host's wall clock in Unix ms (CLOCK_REALTIME): t0 and t1 below. */
DLOCK__HOST int64_t dlock__wall_ms(void);
/* The store's wall clock (Unix ms) read between this host's `t0` and
 * `t1` (dlock__wall_ms(), read just before and after the command): the
 * offset, the store's less the midpoint, into *out. */
DLOCK__HOST void dlock__check_clock(struct dlock_check *out, int64_t store_ms,
                                    int64_t t0, int64_t t1);
/* Appends a note: something that could not be checked, and why. */
DLOCK__HOST void dlock__check_note(struct dlock_check *out, const char *fmt,
                                   ...) __attribute__((format(printf, 2, 3)));


/* --- host services: memory, randomness, threads, descriptors ------------ */

/* Zeroes n bytes at p in a way the compiler keeps (secrets). */
DLOCK__HOST void dlock__wipe(void *p, size_t n);
/* n bytes from the kernel's random source: 0, or -1 (errno set). */
DLOCK__HOST int dlock__random(void *buf, size_t n);
/* A 64-bit hash of s[0..n) (not cryptographic). */
DLOCK__HOST uint64_t dlock__hash(const char *s, size_t n);
/* A condition variable on CLOCK_MONOTONIC (0, or an errno). */
DLOCK__HOST int dlock__cond_init(pthread_cond_t *cv);
/* Waits on cv until signalled or `deadline` (monotonic ms) passes. */
DLOCK__HOST void dlock__cond_wait_until(pthread_cond_t *cv,
                                        pthread_mutex_t *mu,
                                        int64_t deadline);
/* Blocks every signal in the calling thread and returns the old mask in
 * *old, so that threads it creates inherit a blocked mask. */
DLOCK__HOST void dlock__block_signals(sigset_t *old);
DLOCK__HOST void dlock__restore_signals(const sigset_t *old);
/* Lease margin: how early before the store's expiry a lease is declared
 * lost locally (clock-rate drift between client and store), the default
 * of the margin slot. */
DLOCK__HOST int64_t dlock__lease_margin(int64_t ttl_ms);

/* Close-on-exec for descriptors a client library makes without it
 * (docs/design.md, "Descriptors"; fds.c): for the stores whose client
 * libraries do (ZooKeeper, etcd's libcurl, MySQL's Connector/C). */
typedef struct dlock__fd_id {
    int fd;
    dev_t dev;
    ino_t ino;
} dlock__fd_id;
/* The most pipes and sockets a note remembers: a process with more that a
 * started program would inherit gets an incomplete note (ok 0), and the
 * call's own descriptors are then left unmarked rather than another's
 * marked. */
#define DLOCK__FD_NOTE_MAX 256
typedef struct dlock__fd_note {
    /* the pipes and sockets a started program inherits; fixed, not
     * allocated: a child forked while a thread notes must find no heap
     * block in flight (valgrind counts one as lost there) */
    dlock__fd_id ids[DLOCK__FD_NOTE_MAX];
    size_t n;
    int ok; /* complete (/proc/self/fd read, every descriptor noted) */
} dlock__fd_note;
/* Sets FD_CLOEXEC on fd (if fd >= 0 and it is not set). */
DLOCK__HOST void dlock__cloexec(int fd);
/* Notes the pipes and sockets a started program would inherit now, before
 * a call that may make some without the flag. */
DLOCK__HOST void dlock__fds_note(dlock__fd_note *n);
/* After that call: marks close-on-exec every pipe and socket a started
 * program would inherit that was not in the note (by number, device and
 * inode: the call's, or another thread's made meanwhile); frees it. */
DLOCK__HOST void dlock__fds_mark_new(dlock__fd_note *n);
/* Marks close-on-exec every socket a started program would inherit that
 * is connected to `peer` (as getpeername() gives it). */
DLOCK__HOST void dlock__fds_mark_peer(const struct sockaddr *peer,
                                      socklen_t len);

/* --- a module ------------------------------------------------------------ */

/*
 * A store module: a shared object <store>.so in the module directory
 * (docs/development.md "Modules") exporting one `dlock__module_entry`.
 * `abi` is the first field of every version of the struct; the core
 * loads a module whose abi is from DLOCK__STORE_ABI_OLDEST to its own
 * DLOCK__STORE_ABI, and refuses any other, naming both versions.
 * `version` (the dlock release it was built with) is for messages only.
 */
typedef struct dlock__module {
    unsigned abi;                          /* DLOCK__STORE_ABI */
    const char *version;                   /* DLOCK_VERSION_STRING */
    const dlock__backend *const *backends; /* NULL-terminated */
} dlock__module;

/* A table's first fields: `static const dlock__backend x = {
 * DLOCK__STORE_HEAD, .name = "redis", .caps = ..., .open = ... };` */
#define DLOCK__STORE_HEAD .abi = DLOCK__STORE_ABI, .size = sizeof(dlock__backend)

/* The module's entry, in src/stores/<store>/module.c:
 * DLOCK__MODULE(&dlock__backend_redis, &dlock__backend_redlock); */
#define DLOCK__MODULE(...)                                                  \
    static const dlock__backend *const dlock__module_backends[] = {         \
        __VA_ARGS__, NULL};                                                 \
    DLOCK__HOST extern const dlock__module dlock__module_entry;             \
    const dlock__module dlock__module_entry = {                             \
        DLOCK__STORE_ABI, DLOCK_VERSION_STRING, dlock__module_backends}

#endif /* DLOCK_STORE_H */
