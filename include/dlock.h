/* SPDX-License-Identifier: MIT */
/*
 * dlock.h -- distributed locks over the stores you already run.
 *
 * This is the whole public API of libdlock. A program opens one client per
 * store (a Redis server, a directory of lock files, ...), then one handle per
 * lock name, and acquires and releases through the handle:
 *
 *     dlock_client *c;
 *     dlock *l;
 *     if (dlock_client_open(&c, "redis://127.0.0.1:6379", NULL) != DLOCK_OK)
 *         fail(dlock_errmsg());
 *     dlock_open(&l, c, "payments:42", NULL);
 *     if (dlock_acquire(l, 5000) == DLOCK_OK) {
 *         write_with_fence(dlock_token(l));   // the critical section
 *         if (dlock_release(l) == DLOCK_ELOST)
 *             roll_back();                     // it was not protected
 *     }
 *     dlock_close(l);
 *     dlock_client_close(c);
 *
 * Conventions used by every function below:
 *  - Functions returning int return DLOCK_OK (0) or a negative DLOCK_E* code.
 *    On failure the calling thread's dlock_errmsg() says what went wrong in
 *    words (never containing a password). Codes are never renumbered.
 *  - Durations are int64_t milliseconds (suffix _ms).
 *  - The library never prints, exits, aborts or installs signal handlers.
 *  - Owner: a hold belongs to (client, calling thread). Two clients in one
 *    process are two owners; two threads sharing a client are two owners; one
 *    thread may re-enter a lock it holds (a hold count) unless the handle was
 *    opened with DLOCK_NOT_REENTRANT.
 */
#ifndef DLOCK_H
#define DLOCK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && __GNUC__ >= 4
#define DLOCK_EXTERN __attribute__((visibility("default")))
#else
#define DLOCK_EXTERN
#endif

#define DLOCK_VERSION_MAJOR 0
#define DLOCK_VERSION_MINOR 1
#define DLOCK_VERSION_PATCH 0
#define DLOCK_VERSION_STRING "0.1.0"

/* ------------------------------------------------------------------------ */
/* Return codes                                                             */
/* ------------------------------------------------------------------------ */

/*
 * Every code has a fixed number; new codes are only ever appended.
 * DLOCK_EBUSY ("never got it") and DLOCK_ELOST ("had it, then lost it") are
 * kept apart everywhere: callers must be able to tell them apart.
 * docs/errors.md says, for each code, when it comes and what to do.
 *
 * DLOCK_ERRNO_MAP(X) is the one list of the codes: X(NAME, value, text)
 * for each, where DLOCK_<NAME> is the code, value its number and text what
 * dlock_strerror() says of it (dlock_errname() gives "DLOCK_<NAME>"). The
 * codes below are made from it, and so are dlock_strerror() and
 * dlock_errname(); a program may expand it too, to handle every code,
 * using NAME only pasted (DLOCK_##NAME) or made a string (#NAME), as
 * libuv's UV_ERRNO_MAP: alone it would become <errno.h>'s EBUSY, EINVAL...
 *
 * The codes are enum constants (int), each also #defined to itself, so
 * that `#ifdef DLOCK_ECANCELED` tells whether this dlock has the code, as
 * when the codes were plain #defines; their values are C's, not the
 * preprocessor's: compare them in code, not in `#if`.
 *
 * Adding a code: append its row to the map, with the next number down,
 * then its #define below. tests/docs/check_errors.py (ctest -R
 * errors.lists, in `make test`) then names what else must list it, and
 * fails until they do: its row in docs/errors.md's table, its exception
 * class in python/dlock/_errors.py and its constant in
 * python/dlock/_native.py. tests/unit/test_errors.c pins every number.
 */
#define DLOCK_ERRNO_MAP(X)                                                  \
    X(OK, 0, "success")                                                     \
    X(EBUSY, -1, "held by another owner for the whole wait")                \
    X(ELOST, -2, "the hold expired or was taken over")                      \
    /* the calling thread does not hold this lock */                        \
    X(ENOTHELD, -3, "not held by this owner")                               \
    /* invalid argument (name, URI, duration, ...) */                       \
    X(EINVAL, -4, "invalid argument")                                       \
    /* the store is unreachable or the link broke */                        \
    X(ECONN, -5, "store unreachable or connection lost")                    \
    X(EAUTH, -6, "the store refused the credentials")                       \
    X(EPROTO, -7, "unexpected answer from the store")                       \
    X(ENOMEM, -8, "out of memory")                                          \
    /* store or operation not supported/built */                            \
    X(ENOTSUP, -9, "not supported by this store or build")                  \
    /* a read hold asking to become a write hold */                         \
    X(EDEADLK, -10, "would wait for the caller's own hold")                 \
    /* dlock_cancel() ended the wait, or the handle was shut */             \
    X(ECANCELED, -11, "the wait was cancelled")

enum {
#define DLOCK__CODE(name, value, text) DLOCK_##name = (value),
    DLOCK_ERRNO_MAP(DLOCK__CODE)
#undef DLOCK__CODE
};

#define DLOCK_OK DLOCK_OK
#define DLOCK_EBUSY DLOCK_EBUSY
#define DLOCK_ELOST DLOCK_ELOST
#define DLOCK_ENOTHELD DLOCK_ENOTHELD
#define DLOCK_EINVAL DLOCK_EINVAL
#define DLOCK_ECONN DLOCK_ECONN
#define DLOCK_EAUTH DLOCK_EAUTH
#define DLOCK_EPROTO DLOCK_EPROTO
#define DLOCK_ENOMEM DLOCK_ENOMEM
#define DLOCK_ENOTSUP DLOCK_ENOTSUP
#define DLOCK_EDEADLK DLOCK_EDEADLK
#define DLOCK_ECANCELED DLOCK_ECANCELED

/* Longest lock name, in bytes (not counting the terminating NUL). */
#define DLOCK_NAME_MAX 512

/* Shortest lease, in milliseconds. */
#define DLOCK_TTL_MIN 20

/*
 * Longest lease (dlock_options.ttl_ms, dlock_extend()) and longest wait
 * (wait_ms of dlock_acquire() and dlock_acquire_shared(); -1, "forever",
 * is not limited), in milliseconds: 365 days each. A larger value fails
 * with DLOCK_EINVAL and a message naming the limit, never wraps: every
 * store computes lease ends and deadlines (in microseconds on MySQL) far
 * inside 64 bits from these. The other durations the library takes are
 * bounded too: long_hold_ms and dlock_gc()'s idle_ms by DLOCK_WAIT_MAX,
 * the at-risk margin by DLOCK_TTL_MAX, dlock_client_options.timeout_ms by
 * one hour (as a URI's ?timeout=). docs/locks.md, "Limits".
 */
#define DLOCK_TTL_MAX 31536000000LL
#define DLOCK_WAIT_MAX 31536000000LL

/* ------------------------------------------------------------------------ */
/* Handles and options                                                      */
/* ------------------------------------------------------------------------ */

/* Connections to one store plus one background thread (renewal, wake-ups). */
typedef struct dlock_client dlock_client;

/* A handle on one named lock of one client. */
typedef struct dlock dlock;

/*
 * Options for dlock_client_open(). Zero-initialise, then set what you need;
 * a NULL pointer means all defaults.
 */
typedef struct dlock_client_options {
    /* Longest time one store round trip (connect, command) may take before
     * it fails with DLOCK_ECONN. 0 = 2000; at most 3600000 (one hour,
     * as a URI's ?timeout=): more is DLOCK_EINVAL. */
    int64_t timeout_ms;
} dlock_client_options;

/* Flags for dlock_options.flags. */
/* DLOCK_NO_RENEW: nobody renews the hold; its lease simply runs out ttl_ms
 * after the acquisition (the lost-lock callback runs just before), unless
 * it is released or dlock_extend()ed first. Honoured by redis://,
 * redlock://, the lock tables (sqlite://, postgres:// in table mode,
 * mysql://) and etcd:// (the hold gets an etcd lease of its own, ttl
 * rounded up to seconds). Stores that cannot honour it ignore it:
 * zk:// keeps its session semantics (the lock lives as long as its
 * ZooKeeper session, which the ZooKeeper client keeps alive while the
 * process runs); file:// and postgres://...?mode=advisory have no lease
 * (the lock lives until it is released or its holder's file or session
 * closes, e.g. the process dies). */
#define DLOCK_NO_RENEW 0x1u      /* no watchdog: the lease simply runs out */
#define DLOCK_FAIR 0x2u          /* first come, first served wait queue
                                  * (on redis:// both modes are: a release
                                  * hands the lock to the oldest waiter) */
#define DLOCK_NOT_REENTRANT 0x4u /* a second acquire by the holder fails */
/* DLOCK_OWNER_HANDLE: holds made through this handle belong to the handle,
 * not to the calling thread: any thread may release, extend, or read
 * dlock_token()/dlock_held() of the handle's hold, and a thread pool or an
 * event loop may acquire on one thread and release on another. Reentrancy
 * is per handle. Two handles are two owners, even on one thread; a
 * thread's own holds (through handles without the flag) are another
 * owner. One acquire at a time per handle: an acquire while another
 * thread's acquire through the same handle is in progress fails with
 * DLOCK_EINVAL (open a handle per owner). The holder's description reads
 * "host pid N handle N". */
#define DLOCK_OWNER_HANDLE 0x8u

/*
 * Called on the client's background thread when the client learns that a
 * hold made through `lock` is gone (its lease ran out locally, or renewal
 * found the lock deleted or owned by someone else). `token` is the fencing
 * token of the lost hold. The owner's next dlock_release() returns
 * DLOCK_ELOST. The callback must return quickly and must not call
 * dlock_close() or dlock_client_close(); it may call any other function.
 */
typedef void (*dlock_lost_cb)(dlock *lock, uint64_t token, void *arg);

/*
 * Options for dlock_open(). Zero-initialised means defaults; a NULL pointer
 * means all defaults. The struct is copied: it need not outlive the call.
 */
typedef struct dlock_options {
    /* Lease length. 0 = 30000; otherwise at least DLOCK_TTL_MIN and at
     * most DLOCK_TTL_MAX (365 days). The watchdog renews
     * the lease every ttl_ms/3 while the lock is held (unless
     * DLOCK_NO_RENEW). Stores without leases ignore it: file:// (a dead
     * holder's lock is freed by the kernel at once) and PostgreSQL's
     * ?mode=advisory (by the server when the holder's session ends). */
    int64_t ttl_ms;
    /* DLOCK_NO_RENEW | DLOCK_FAIR | DLOCK_NOT_REENTRANT |
     * DLOCK_OWNER_HANDLE */
    unsigned flags;
    /* Optional lost-lock callback and its argument. */
    dlock_lost_cb on_lost;
    void *on_lost_arg;
    /* 0 (the default): the name is a lock, taken exclusively with
     * dlock_acquire() or shared with dlock_acquire_shared(). N >= 1: the
     * name is a counting semaphore of N permits, and each dlock_acquire()
     * takes one (dlock_acquire_shared() is then DLOCK_EINVAL). Every
     * handle of a name must say the same: the store keeps N while any
     * permit is held, and an acquire with another N (or an exclusive or
     * shared acquire of a semaphore's name, and the reverse) fails with
     * DLOCK_EINVAL where the store can tell (docs/locks.md). At most
     * DLOCK_PERMITS_MAX; some stores allow fewer and answer DLOCK_EINVAL
     * above their own limit at the acquire (file:// 256, etcd:// 64,
     * mysql:// and postgres://...?mode=advisory 32: docs/locks.md). */
    unsigned permits;
    /* Scheduled jobs (docs/locks.md, "Scheduled jobs: at least, at
     * most"). at_least_ms > 0: the lock stays taken until at_least_ms
     * after it was taken, whatever its holder does, dies included: a
     * release before then leaves the lock to the store's lease, which
     * ends then (the acquire and every renewal ask for a lease that
     * covers it). at_most_ms > 0: the hold never outlives at_most_ms
     * after it was taken: no renewal extends the lease past it, and the
     * hold is then reported lost (the lost-lock callback, DLOCK_ELOST
     * from the release). Each at most DLOCK_TTL_MAX; at_most_ms, when
     * set, at least at_least_ms. Only on stores whose leases end by
     * themselves (redis://, redlock://, sqlite://, postgres:// in table
     * mode, mysql://): elsewhere dlock_open() fails with DLOCK_ENOTSUP
     * and the reason (their holds end with the holder's file, session
     * or connection). 0: off. */
    int64_t at_least_ms;
    int64_t at_most_ms;
} dlock_options;

/* Most permits a semaphore may have. */
#define DLOCK_PERMITS_MAX 65536

/* ------------------------------------------------------------------------ */
/* Clients                                                                  */
/* ------------------------------------------------------------------------ */

/*
 * Opens a client on the store named by `uri`:
 *   file:///dir                            lock files in dir (one host)
 *   mem://[SPACE]                          locks in this process's memory
 *                                  (tests, threads; every client of the
 *                                  same SPACE in the process shares them)
 *   redis://[user[:password]@]host[:port][/db][?prefix=P&timeout=MS]
 *   unix://[[user]:password@]/path/redis.sock[?db=N&prefix=P&timeout=MS]
 *   redlock://[user:password@]host:port,host:port,...[?node_timeout=MS
 *       &drift_factor=F&drift_ms=MS&prefix=P]   (Redlock: a majority of
 *       N independent Redis masters; no DLOCK_FAIR; docs/redlock.md)
 *   zk://[user:password@]host:port[,host:port...][/chroot]
 *   etcd://[user:password@]host:port[,...][?prefix=P&timeout=MS] (etcds://)
 *   sqlite:///path/to/file.db[?table=T&timeout=MS]
 *   postgres://[user[:password]@]host[:port][,...]/db[?table=T&mode=advisory
 *       &pooler=session|transaction&sslmode=...&timeout=MS]
 *                                  (postgresql:// too)
 *   mysql://[user[:password]@]host[:port]/db[?table=T&ssl_mode=...
 *       &timeout=MS]               (mariadb:// too)
 * (docs/stores.md has every option.)
 * `uri` NULL or "" means the environment variable DLOCK_STORE if set, else
 * the default store: file://HOME/.local/state/dlock?private=1, HOME being
 * the home directory of the passwd entry of the effective uid (never $HOME
 * or $XDG_*: every session of a user, cron and sudo included, finds the
 * same directory; docs/stores.md, "The default store"). dlock_client_store()
 * shows it.
 * Percent-escapes (%40 for '@', ...) are decoded in user and password; a
 * URI with an '@' after the host part and a ':' before it (a password with
 * an unescaped '/' or '?') is refused, and so is a query parameter named
 * like a secret (password=, token=, ...). The password, where the URI has
 * none: ?password_file=FILE (its one line; a regular file others cannot
 * read nor its group write, else DLOCK_EAUTH), else $DLOCK_PASSWORD, else
 * for the Redis schemes $REDISCLI_AUTH, else what the client library reads
 * (libpq: PGPASSWORD, PGPASSFILE; libmariadb: MYSQL_PWD). docs/stores.md,
 * "Passwords".
 *
 * Connects (network stores). The client's background thread (renewals,
 * wake-ups, callbacks) is not started here but by its first acquire
 * (docs/design.md "Threads"): a client that is only opened adds no
 * thread to the process (ZooKeeper's client library starts threads of
 * its own when it connects). The first client of a store other than
 * file:// loads that store's module (and its client library) into the
 * process; it stays loaded.
 * On success *out is a new client, to be freed with dlock_client_close().
 * On failure *out is NULL.
 *
 * Errors: DLOCK_EINVAL (bad URI or option), DLOCK_ENOTSUP (a store this
 * build does not include, or whose module is not installed or is refused:
 * the message says which), DLOCK_ECONN (store unreachable), DLOCK_EAUTH
 * (credentials refused), DLOCK_EPROTO, DLOCK_ENOMEM.
 * The default store (and any ?private=1 directory) fails, the message
 * naming the directory and the way out (a URI, or DLOCK_STORE), with:
 * DLOCK_ENOTSUP when this user can have none: no passwd entry, a home
 * directory that is not an absolute path or does not exist, or one on a
 * network file system; DLOCK_EAUTH when a directory on the way belongs to
 * another user (not root) or others may write it, or the caller cannot
 * create or enter it; DLOCK_EPROTO for a symbolic link or a file where a
 * directory belongs. Not DLOCK_EINVAL: nothing the caller passed is wrong,
 * and the CLI exits 69 (store error) for these, 64 (usage) for EINVAL.
 * Thread-safety: may be called from any thread.
 */
DLOCK_EXTERN int dlock_client_open(dlock_client **out, const char *uri,
                                   const dlock_client_options *opts);

/*
 * Stops the background thread (if it started), releases every hold still
 * made through the client (best effort), and closes the store
 * connections. Handles opened on the client stay valid until
 * dlock_close(), but every call on them then fails with DLOCK_EINVAL.
 * NULL is a no-op.
 * In a child forked after the client was opened it does nothing: the holds
 * and connections are the parent's, and the child leaves them alone (the
 * client's memory stays allocated in the child). Likewise dlock_close().
 * Thread-safety: no other call on this client or its handles may be in
 * progress; never call it from a lost-lock callback.
 */
DLOCK_EXTERN void dlock_client_close(dlock_client *c);

/*
 * The client's store URI with any password replaced by "***" (borrowed,
 * valid until the client is freed). For messages and logs.
 * Thread-safety: any thread.
 */
DLOCK_EXTERN const char *dlock_client_store(const dlock_client *c);

/* Ways of dlock_uri_redact() (0: each secret becomes "***"). */
#define DLOCK_REDACT_STARS 0x1u /* each secret byte becomes '*': same
                                 * length (to overwrite argv in place) */
#define DLOCK_REDACT_DROP 0x2u  /* the password and its ':' (and an empty
                                 * user's '@') are left out, and so is a
                                 * secret query parameter: a URI to hand on
                                 * without its secrets */

/*
 * Writes the store URI `uri` with its secrets hidden into `out` (`cap`
 * bytes, NUL-terminated when cap > 0, truncated to fit); returns the length
 * of the whole result, like snprintf() (call with cap 0 to size a buffer).
 * Works on any string, well-formed or not: the secret is everything the URI
 * parser could take for a password -- from the first ':' after "://" up to
 * the LAST '@' (dlock_client_open() refuses a URI with an '@' past the host
 * part and a ':' before it, so for a URI it accepts this is the password
 * exactly) -- and the value, up to the end, of any query parameter named
 * like a secret (password, token, ...; the URI parser refuses those).
 * `how`: 0, DLOCK_REDACT_STARS or DLOCK_REDACT_DROP. With
 * DLOCK_REDACT_STARS `out` may be `uri` itself; otherwise they must not
 * overlap. `uri` NULL counts as "". Allocates nothing.
 * Thread-safety: any thread.
 */
DLOCK_EXTERN size_t dlock_uri_redact(const char *uri, unsigned how,
                                     char *out, size_t cap);

/* ------------------------------------------------------------------------ */
/* Locks                                                                    */
/* ------------------------------------------------------------------------ */

/*
 * Opens a handle on the lock called `name` (1..DLOCK_NAME_MAX bytes, any
 * bytes but NUL). Talks to no store. Handles are cheap; one handle may be
 * shared by threads (each thread is its own owner). `opts` is copied.
 * On success *out is a new handle, to be freed with dlock_close().
 *
 * Errors: DLOCK_EINVAL (NULL or empty name, name too long, ttl_ms < 0 or
 * below DLOCK_TTL_MIN or above DLOCK_TTL_MAX, unknown flags, at_least_ms
 * or at_most_ms out of range, closed client), DLOCK_ENOTSUP (at_least_ms
 * or at_most_ms on a store whose leases do not end by themselves: the
 * message says why), DLOCK_ENOMEM.
 * Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_open(dlock **out, dlock_client *c, const char *name,
                            const dlock_options *opts);

/*
 * Acquires the lock for the calling thread.
 *   wait_ms == 0   one try;
 *   wait_ms  > 0   wait at most that long (at most DLOCK_WAIT_MAX,
 *                  365 days);
 *   wait_ms == -1  wait for as long as it takes;
 * Waiting is woken by the store's notifications (never busy polling).
 * On stores that hand the lock over (redis://), a release gives it to the
 * oldest waiter in the same step and the waiter returns on that message;
 * a wait that ends just as the lock is handed to it keeps the lock and
 * returns DLOCK_OK (a round trip after its deadline), so DLOCK_EBUSY is
 * never returned while the store names the caller as the owner.
 * If the thread already holds the lock, the hold count goes up and the
 * fencing token stays the same, unless DLOCK_NOT_REENTRANT, in which case
 * the call fails at once with DLOCK_EBUSY.
 *
 * Errors: DLOCK_EBUSY (another owner held it for the whole wait; also a
 * re-acquire under DLOCK_NOT_REENTRANT), DLOCK_ECANCELED (dlock_cancel()
 * ended the wait; the handle was shut by dlock_shutdown()), DLOCK_ELOST (the thread's hold was
 * lost and not yet released), DLOCK_EINVAL (wait_ms < -1 or above
 * DLOCK_WAIT_MAX, closed client;
 * on redlock://, a ttl_ms too short for its node timeout and drift),
 * DLOCK_ENOTSUP (DLOCK_FAIR on redlock://), DLOCK_ECONN (also: fewer than
 * a quorum of Redlock nodes reachable), DLOCK_EAUTH, DLOCK_EPROTO,
 * DLOCK_ENOMEM (also: the client's first acquire could not start its
 * background thread; nothing was sent to the store, and the next acquire
 * tries again). An unreachable store (DLOCK_ECONN: down, restarting, a
 * broken connection, a Sentinel or Cluster failover in progress) does not
 * end a wait: the call keeps trying within its wait, woken by the store
 * where it can tell (a Sentinel switch) and otherwise on a backoff capped
 * at 1 s, and fails at its deadline with DLOCK_ECONN and the last
 * failure's message ("... unreachable for N ms, until the wait's
 * deadline"); dlock_cancel() ends it at once. A one-try acquire
 * (wait_ms 0) fails at once. Any other store error ends the wait at once
 * with its code. A wait that saw the lock held and whose last try was cut
 * short by its deadline ends DLOCK_EBUSY. Never later than the deadline
 * plus one store timeout (on redis://, DLOCK_ECONN also when the
 * wait ran out and the store could not be told that it left the queue:
 * the lock may be in the caller's name until its lease ends).
 * Thread-safety: any thread; each thread acts for itself.
 */
DLOCK_EXTERN int dlock_acquire(dlock *l, int64_t wait_ms);

/*
 * Acquires a shared (read) hold for the calling thread: any number of
 * owners may hold the name shared at once, and none while an owner holds
 * it exclusively (dlock_acquire()). wait_ms as for dlock_acquire(). Every
 * read hold has its own lease, renewed by the watchdog and reported lost
 * like an exclusive hold; dlock_release() ends it (and touches no other
 * reader's hold).
 *
 * No writer starvation: once an exclusive acquire waits, a new shared
 * acquire queues behind it even while other readers hold; a release wakes
 * exactly the waiters that can proceed (every reader at the head of the
 * queue, or one writer). Reentrancy: a thread holding the name shared or
 * exclusively re-enters (its hold count goes up, no store trip, the token
 * stays the outermost hold's), unless DLOCK_NOT_REENTRANT (DLOCK_EBUSY).
 * A thread holding the name shared that calls dlock_acquire() gets
 * DLOCK_EDEADLK at once: release the read hold first (two readers
 * upgrading would wait for each other forever).
 *
 * Fencing: a read hold's token is greater than every earlier write hold's
 * of the name (docs/locks.md says what a resource should check).
 *
 * Errors: as dlock_acquire(); DLOCK_EINVAL also on a semaphore's handle
 * (dlock_options.permits > 0); DLOCK_ENOTSUP on redlock://, which has
 * no shared holds or semaphores (the message names the store;
 * docs/locks.md lists what each store has).
 * Thread-safety: any thread; each thread acts for itself.
 */
DLOCK_EXTERN int dlock_acquire_shared(dlock *l, int64_t wait_ms);

/* Most handles in one dlock_acquire_all() or dlock_release_all(). */
#define DLOCK_ALL_MAX 1024

/*
 * Acquires every lock of ls[0..n) for the calling thread (exclusively;
 * one permit of a semaphore's handle), all or none, within one wait:
 * wait_ms as for dlock_acquire(), for the whole set. The locks are taken
 * one after another in ascending byte order of their names, whatever
 * the order of ls, so that two callers of dlock_acquire_all() needing
 * names in common cannot deadlock (docs/design.md, "Several locks at
 * once"); while it waits for one lock the set holds the ones before it.
 * Each hold is an ordinary hold of its handle: its own fencing token
 * (dlock_token()), renewed, re-entrant (a name the thread holds already
 * is re-entered), and reported lost through its handle's callback.
 * On any failure nothing this call took is left held: the locks it took
 * are released before it returns, and dlock_errmsg() names the lock
 * that failed. dlock_cancel() or dlock_shutdown() of any handle of the
 * set ends the set's wait (DLOCK_ECANCELED).
 * Errors: as dlock_acquire() (DLOCK_EBUSY names the lock held for the
 * whole wait); DLOCK_ELOST also when a lock of the set was lost while
 * the set waited for another (nothing held); DLOCK_EINVAL (ls NULL, n 0
 * or above DLOCK_ALL_MAX, a NULL handle, handles of two clients, two
 * handles of one name, a bad wait_ms).
 * Ownership: ls and the handles stay the caller's.
 * Thread-safety: any thread; each thread acts for itself (a
 * DLOCK_OWNER_HANDLE handle's hold is the handle's, as ever).
 */
DLOCK_EXTERN int dlock_acquire_all(dlock *const *ls, size_t n,
                                   int64_t wait_ms);

/*
 * Releases one level of each hold of ls[0..n) (a set dlock_acquire_all()
 * took), in the reverse of the set's order, whatever each release
 * returns. Returns DLOCK_OK when every hold was intact; DLOCK_ELOST when
 * any was lost (the set's critical section was NOT protected;
 * dlock_errmsg() names the first such lock); else the first error of a
 * release (DLOCK_ENOTHELD, DLOCK_ECONN: as dlock_release()).
 * Errors also: DLOCK_EINVAL as dlock_acquire_all(), before any release.
 * Thread-safety: as dlock_release().
 */
DLOCK_EXTERN int dlock_release_all(dlock *const *ls, size_t n);

/*
 * Cancels the acquires in progress through handle `l` (dlock_acquire(),
 * dlock_acquire_shared()), from any thread: each returns DLOCK_ECANCELED
 * as soon as its wait can end (at once for a wait woken by the store or
 * the kernel; after one store round trip at most otherwise), having left
 * the store's wait queue, so that nothing of it stays behind: no hold, no
 * place in a fair queue. An acquire that got the lock before it could see
 * the cancel returns DLOCK_OK as usual: the caller holds the lock and
 * releases it. Acquires that start after the call are not affected (the
 * cancel is not remembered; dlock_shutdown()'s is), nor are other
 * handles' (except that a dlock_acquire_all() in progress over `l` ends
 * as a whole). For an event loop or a thread pool that gives up a wait:
 * with DLOCK_OWNER_HANDLE, one handle per waiting task.
 * Errors: DLOCK_EINVAL (NULL handle, closed client). Never blocks.
 * Thread-safety: any thread, while the handle is open.
 */
DLOCK_EXTERN int dlock_cancel(dlock *l);

/*
 * Shuts handle `l` for acquiring, for good: cancels the acquires in
 * progress through it as dlock_cancel() does (each returns
 * DLOCK_ECANCELED, having left the store's queue, or DLOCK_OK when it got
 * the lock first), and every dlock_acquire() or dlock_acquire_shared()
 * through `l` that starts after the call returns DLOCK_ECANCELED at once
 * ("lock 'NAME': shut down (dlock_shutdown())"), without a store trip:
 * a re-entrant one by a thread that holds the name through `l` too (no
 * exception: the handle is going away). Unlike dlock_cancel() it cannot
 * be missed: an acquire that had begun but not yet started to wait when
 * the call came is either cancelled or refused. (A try, wait_ms 0, that
 * had begun ends after its one store call, as at a dlock_cancel().)
 * Holds taken before stay held: dlock_release(), dlock_extend(),
 * dlock_token(), dlock_held() and dlock_close() work as before, and so
 * do the client's calls (dlock_inspect()). Irreversible: open a new
 * handle to acquire again. For a wrapper that frees a handle other
 * threads may be about to acquire through (Python's Lock.close()): shut
 * it, wait for the calls in progress to return, then dlock_close().
 * Calling it again does nothing more; the handle still belongs to the
 * caller (dlock_close() frees it).
 * Errors: DLOCK_EINVAL (NULL handle, closed client). Never blocks.
 * Thread-safety: any thread, while the handle is open.
 */
DLOCK_EXTERN int dlock_shutdown(dlock *l);

/*
 * Releases one level of the calling thread's hold; the last level frees the
 * lock in the store (an atomic compare-and-delete: never another owner's).
 *
 * Returns DLOCK_OK when the hold was intact up to this moment.
 * Returns DLOCK_ELOST when the hold had expired or been taken over: the
 * critical section was NOT protected; roll back and alert. (The hold level
 * is still released.)
 * Errors: DLOCK_ENOTHELD (the calling thread holds no such lock),
 * DLOCK_ECONN/DLOCK_EPROTO (the store could not be told; the lock is freed
 * by its lease), DLOCK_EINVAL.
 * Thread-safety: any thread; only the owner thread can release its hold.
 */
DLOCK_EXTERN int dlock_release(dlock *l);

/*
 * Sets the calling thread's lease to ttl_ms from now, and makes ttl_ms the
 * lease length the watchdog renews to from then on.
 *
 * Errors: DLOCK_EINVAL (ttl_ms < DLOCK_TTL_MIN or > DLOCK_TTL_MAX),
 * DLOCK_ENOTHELD (not held),
 * DLOCK_ELOST (the hold is gone; release it), DLOCK_ECONN, DLOCK_EPROTO.
 * Thread-safety: any thread; acts on the calling thread's hold.
 */
DLOCK_EXTERN int dlock_extend(dlock *l, int64_t ttl_ms);

/*
 * The fencing token of the calling thread's hold: strictly greater than
 * every earlier hold's token of the same name in the same store; 0 when the
 * thread does not hold the lock or its hold was lost. A reentrant acquire
 * keeps the token. Pass it to the resource you protect, which should refuse
 * writes carrying a token lower than one it has seen.
 * Thread-safety: any thread.
 */
DLOCK_EXTERN uint64_t dlock_token(const dlock *l);

/*
 * The calling thread's hold count on this lock (0: not held), or
 * DLOCK_ELOST when its hold was lost and still awaits dlock_release().
 * Local: talks to no store. Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_held(const dlock *l);

/* The handle's lock name (borrowed, valid until dlock_close()). */
DLOCK_EXTERN const char *dlock_name(const dlock *l);

/*
 * Frees the handle. Any hold still made through it (by any thread) is
 * released first, best effort. NULL is a no-op. In a child forked after
 * the client was opened it does nothing (see dlock_client_close()).
 * Thread-safety: no other call on this handle may be in progress; never
 * call it from the handle's own lost-lock callback.
 */
DLOCK_EXTERN void dlock_close(dlock *l);

/* ------------------------------------------------------------------------ */
/* Inspection                                                               */
/* ------------------------------------------------------------------------ */

/* What the store knows about one lock (see dlock_inspect()). */
typedef struct dlock_info {
    int held;          /* 1: someone holds it; 0: free */
    char holder[256];  /* "host pid N tid N" of the holder, "" if free */
    uint64_t token;    /* holder's fencing token; when free, the last one
                        * issued (0: never held). Redis keeps it for an
                        * hour after the last release, then 0. Redlock:
                        * the highest node counter, so within the same
                        * counter as the token, not always equal
                        * (docs/redlock.md) */
    int64_t ttl_ms;    /* lease left; -1 when free or the store has none */
    int64_t held_ms;   /* how long the current hold has lasted; -1 unknown */
    int64_t waiters;   /* waiters known to the store; -1 when it can't tell */
    char **queue;      /* the fair wait queue in order (NULL if none); */
    size_t queue_len;  /* each entry a waiter's description ("read: ",
                        * "write: " or "permit: " in front where the store
                        * queues kinds together) */
    int64_t holders;   /* holds now: 0 free, 1 an exclusive holder, or
                        * the number of read holds or permits taken */
    int shared;        /* 1: those holds are read holds */
    int64_t permits;   /* a semaphore's permits; 0: a lock */
    char foreign[256]; /* what a process outside dlock holds on the
                        * store's files for this lock ("a process outside
                        * dlock holds a read lock on ..."): it may hold
                        * waiters up to their deadlines, or keep the lock
                        * from being taken; "" when none is seen (the
                        * sqlite:// store tells; others leave it "") */
} dlock_info;

/*
 * Asks the store about lock `name` (1 round trip on Redis). Fills *out,
 * which the caller frees with dlock_info_clear(). On failure *out is zeroed
 * and needs no clearing.
 * Errors: DLOCK_EINVAL, DLOCK_ECONN, DLOCK_EAUTH, DLOCK_EPROTO,
 * DLOCK_ENOMEM. Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_inspect(dlock_client *c, const char *name,
                               dlock_info *out);

/* Frees what dlock_inspect() allocated in *info. NULL is a no-op. */
DLOCK_EXTERN void dlock_info_clear(dlock_info *info);

/*
 * Removes what the store keeps of locks that nobody has held for at least
 * idle_ms (stores with a lock table, sqlite://, postgres://, mysql://: the
 * rows of free locks unused that long, and dead fair-queue entries). Held
 * locks are never touched. Tokens stay strictly increasing per name across
 * a removal: PostgreSQL draws them from a sequence; SQLite and MySQL issue
 * tokens no lower than their clock in microseconds, so a removed name
 * starts again above every token it ever had (unless the store's clock
 * went back by more than idle_ms).
 * *removed (may be NULL) gets the number of locks removed.
 * Errors: DLOCK_EINVAL (idle_ms < 0 or > DLOCK_WAIT_MAX, closed client),
 * DLOCK_ENOTSUP (a store
 * that keeps nothing to remove, or removes it by itself: file, Redis,
 * ZooKeeper, etcd, PostgreSQL advisory locks), DLOCK_ECONN, DLOCK_EAUTH,
 * DLOCK_EPROTO.
 * Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_gc(dlock_client *c, int64_t idle_ms,
                          uint64_t *removed);

/* ------------------------------------------------------------------------ */
/* Leader election                                                          */
/* ------------------------------------------------------------------------ */

/* An election NAME is lock NAME: the leader is its exclusive holder, the
 * leader's value is the hold's description, the term is the hold's
 * fencing token (strictly increasing across leaders). docs/locks.md,
 * "Leader election"; the protocol in docs/design.md. */

/* Longest value, in bytes (not counting the terminating NUL). Every store
 * keeps it whole but PostgreSQL's advisory mode, which keeps a holder's
 * description in its session's application_name (63 bytes, "dlock TOKEN "
 * first): at least the first 37 bytes there (docs/locks.md). */
#define DLOCK_VALUE_MAX 127

/* The leader of an election as read from the store. */
typedef struct dlock_leader {
    int present;       /* 1: a leader leads; 0: none */
    uint64_t term;     /* its term (fencing token); with none, the last
                        * term the store remembers (0: unknown) */
    char value[256];   /* its value ("" with none) */
    int64_t ttl_ms;    /* its lease left; -1: none, or the store has none */
    int error;         /* observers only: DLOCK_OK, or the error that keeps
                        * the observer from the store now (the rest is then
                        * the last leader it saw) */
    char why[256];     /* with error, its message; with no leader because
                        * the name is held shared or as a semaphore, why;
                        * else "" */
} dlock_leader;

/*
 * Campaigns for leadership of election dlock_name(l): takes the lock
 * exclusively, waiting as dlock_acquire() does (wait_ms, dlock_cancel(),
 * the lease and its renewal, the lost-lock callback), with `value` as
 * the hold's description, which observers read as the leader's value.
 * value: 1 to DLOCK_VALUE_MAX bytes of printable text without control
 * characters; NULL: the default description ("host pid N tid N"). On
 * DLOCK_OK the caller leads; its term is dlock_token(l); stores with
 * observers are told (docs/design.md, "Leader election").
 * Errors: as dlock_acquire() (DLOCK_EBUSY: another leads for the whole
 * wait); DLOCK_EINVAL (a bad value; the owner leads already through this
 * handle: dlock_proclaim() changes the value; a semaphore handle).
 * Ownership: value is copied. Thread-safety: as dlock_acquire().
 */
DLOCK_EXTERN int dlock_campaign(dlock *l, const char *value,
                                int64_t wait_ms);

/*
 * Changes the value of the leadership the caller holds through l, its
 * term and lease unchanged (one compare-on-owner write), and tells the
 * observers. Errors: DLOCK_ENOTHELD (the caller does not lead through
 * l), DLOCK_ELOST (its leadership was lost: the write found another
 * owner or none, nothing written), DLOCK_EINVAL (a bad value),
 * DLOCK_ENOTSUP (the store has no proclaim yet; the message says so),
 * DLOCK_ECONN and the store's other errors.
 * Ownership: value is copied. Thread-safety: the leading owner's thread
 * (the handle's, with DLOCK_OWNER_HANDLE).
 */
DLOCK_EXTERN int dlock_proclaim(dlock *l, const char *value);

/*
 * Gives up leadership: dlock_release() of the leader's hold, then tells
 * the observers. Returns what dlock_release() returns (DLOCK_ELOST: the
 * term had ended before).
 * Thread-safety: as dlock_release().
 */
DLOCK_EXTERN int dlock_resign(dlock *l);

/*
 * Reads the leader of election `name` from the store (one inspection)
 * into *out (zeroed first). Errors: as dlock_inspect().
 * Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_leader_get(dlock_client *c, const char *name,
                                  dlock_leader *out);

/* A running observation of one election (dlock_observe()). */
typedef struct dlock_observer dlock_observer;

/* Called on the observer's thread with the state it has just read: the
 * first one, then each change (present, term or value), each error and
 * the recovery from it. Must return quickly; may call dlock_leader_get()
 * or another client's functions, not dlock_observer_close() of its own
 * observer. `leader` is valid during the call only. */
typedef void (*dlock_leader_cb)(const char *name, const dlock_leader *leader,
                                void *arg);

/*
 * Starts observing election `name`: a thread of the observer's own waits
 * on the store's watch of the name (never reading on a timer: it is
 * woken by the store, or at the leader's lease end where the store does
 * not tell), reads the leader on each wake-up and, when it changed, calls
 * cb (if not NULL) and makes dlock_observer_fd() readable. The first
 * state is reported too. A broken watch is opened again (after 100 ms,
 * doubling to 5 s), reported through `error` meanwhile.
 * Errors: DLOCK_EINVAL (bad name, NULL out), DLOCK_ENOTSUP (the store
 * cannot be observed yet; the message says why), DLOCK_ECONN and the
 * store's other errors (the watch could not be opened), DLOCK_ENOMEM.
 * Ownership: the caller closes *out with dlock_observer_close() before
 * it closes the client. Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_observe(dlock_client *c, const char *name,
                               dlock_leader_cb cb, void *arg,
                               dlock_observer **out);

/*
 * A descriptor that is readable while the observer has a state the
 * caller has not read with dlock_observer_read(): for poll(), epoll or an
 * event loop. Owned by the observer; never read or close it.
 */
DLOCK_EXTERN int dlock_observer_fd(const dlock_observer *o);

/*
 * The observer's latest state into *out, and clears the descriptor's
 * readiness. Returns DLOCK_OK with a state the caller had not read yet,
 * DLOCK_EBUSY when nothing changed since its last read (*out is then
 * the same state again), DLOCK_EINVAL for NULL arguments. Waits for
 * nothing. Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_observer_read(dlock_observer *o, dlock_leader *out);

/*
 * Stops the observer's thread (at once: its wait ends on the close) and
 * frees it. NULL is a no-op. Not from the observer's own callback.
 */
DLOCK_EXTERN void dlock_observer_close(dlock_observer *o);

/* ------------------------------------------------------------------------ */
/* Operating: listing and breaking locks                                    */
/* ------------------------------------------------------------------------ */

/* One lock of a dlock_list() page. */
typedef struct dlock_listed {
    char *name;      /* the lock name (NUL-terminated; any other bytes) */
    dlock_info info; /* what dlock_inspect() would say of it */
} dlock_listed;

/* A page of dlock_list(): freed with dlock_list_clear(). */
typedef struct dlock_list_page {
    dlock_listed *locks; /* n locks, in the store's order */
    size_t n;
    char *next; /* the cursor of the next page; NULL: this was the last */
} dlock_list_page;

/* dlock_list() flags. */
#define DLOCK_LIST_FREE 0x1u /* also locks nobody holds or waits for that
                              * the store still keeps (a lock table's
                              * rows, a token counter) */

/*
 * Lists the locks of the store whose names start with `prefix` (NULL or ""
 * for all): by default those held or waited for, with DLOCK_LIST_FREE
 * every one the store keeps. One page per call: `cursor` NULL (or "")
 * starts, then pass the page's `next` until it is NULL. `limit` is the
 * most locks wanted in the page (0 = 100, at most 10000); a page may hold
 * fewer even when more follow (Redis' SCAN), and a lock that changes
 * between pages may be listed twice or not at all, never wrongly
 * described: each entry is the store's view of that lock at one moment.
 * Never blocks the store (Redis: SCAN, never KEYS), and uses memory for
 * one page only. A cursor is opaque, made by the store: pass it back
 * unchanged to a client of the same store.
 * On success *out is a page to free with dlock_list_clear(); on failure
 * it is empty (and needs no clearing).
 * Errors: DLOCK_EINVAL (bad cursor, flags or limit, closed client),
 * DLOCK_ENOTSUP (a store that cannot enumerate its locks: the message
 * says why; docs/monitoring.md lists them), DLOCK_ECONN, DLOCK_EAUTH,
 * DLOCK_EPROTO, DLOCK_ENOMEM.
 * Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_list(dlock_client *c, const char *prefix,
                            const char *cursor, size_t limit,
                            unsigned flags, dlock_list_page *out);

/* Frees what dlock_list() put in *page. NULL is a no-op. */
DLOCK_EXTERN void dlock_list_clear(dlock_list_page *page);

/*
 * Breaks lock `name` in the store, for an operator whose lock is stuck
 * (a holder that hangs while its watchdog renews): removes every hold of
 * it (the exclusive holder, every read hold, every permit), then wakes its
 * waiters as a release would. Waiters keep their places in the queue. The
 * name's fencing counter is kept, so the next hold's token is greater
 * than the evicted holders': a resource that checks tokens refuses their
 * late writes. An evicted holder learns of it at its next renewal (or its
 * release): DLOCK_ELOST and its lost-lock callback. docs/monitoring.md
 * says how each store does it.
 * `evicted` (may be NULL) gets what the store said of the lock just
 * before (dlock_info: holder, token, holders); the caller frees it with
 * dlock_info_clear() on DLOCK_OK and DLOCK_ENOTHELD.
 * Errors: DLOCK_ENOTHELD (nobody held it: nothing was done), DLOCK_EINVAL,
 * DLOCK_ENOTSUP (a store whose holds cannot be taken from outside the
 * holder: file://, whose locks are the holder's kernel locks, and the
 * others docs/monitoring.md lists, with the reason), DLOCK_ECONN,
 * DLOCK_EAUTH (this role may not take the holds away; PostgreSQL advisory
 * mode: also a holder it cannot prove is dlock's, named in the message,
 * and then nothing is done), DLOCK_EPROTO, DLOCK_ENOMEM.
 * Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_break(dlock_client *c, const char *name,
                             dlock_info *evicted);

/* ------------------------------------------------------------------------ */
/* Observing: metrics and events                                            */
/* ------------------------------------------------------------------------ */

/*
 * Every client keeps metrics of what its locks do, on by default (atomic
 * counters, no lock taken for them; docs/monitoring.md has each series
 * and what it costs). Per lock name for up to `max_names` names (0 = 100):
 * a name keeps its own series while a handle is open on it, and among the
 * names without one the busiest keep theirs; every other name is counted
 * in the aggregate, lock name "" (no lock is called ""). Client-wide:
 * store errors by code and the store's round-trip times by operation.
 *
 * dlock_metrics_config() turns them on (enabled 1) or off (0) and sets
 * max_names (a new max_names takes effect for names met from then on).
 * Errors: DLOCK_EINVAL (NULL or closed client, max_names > 100000).
 * Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_metrics_config(dlock_client *c, int enabled,
                                      size_t max_names);

/* Histogram buckets: upper bounds in microseconds, the last one infinite
 * (every observation). The same for every histogram:
 * 100us 250us 500us 1ms 2.5ms 5ms 10ms 25ms 50ms 100ms 250ms 500ms 1s
 * 2.5s 5s 10s 30s 60s 300s +Inf. */
#define DLOCK_HIST_BUCKETS 20

typedef struct dlock_histogram {
    uint64_t count;  /* observations */
    uint64_t sum_us; /* their sum, in microseconds */
    uint64_t le[DLOCK_HIST_BUCKETS]; /* cumulative: le[i] observations
                                      * were <= dlock_hist_bound_us(i) */
} dlock_histogram;

/* The upper bound of bucket i in microseconds; INT64_MAX for the last
 * (and past it). Thread-safety: any thread. */
DLOCK_EXTERN int64_t dlock_hist_bound_us(size_t i);

/* A snapshot of a client's metrics, filled by dlock_stats_get(). Fields are
 * only ever appended: pass sizeof(dlock_stats) as `size`. */
typedef struct dlock_stats {
    int tracked;           /* name given: 1 if it has its own series */
    uint64_t acquired;     /* holds taken in the store (outermost) */
    uint64_t reentered;    /* acquires counted into a hold already held */
    uint64_t busy;         /* acquires that ended DLOCK_EBUSY */
    uint64_t waited;       /* acquires that found it held and waited */
    uint64_t released;     /* outermost releases (any result) */
    uint64_t lost_expired; /* holds lost: the lease ran out locally */
    uint64_t lost_taken;   /* ... renewal/release found it gone or taken */
    uint64_t lost_store;   /* ... the store said so (session ended, ...) */
    uint64_t renewed;      /* watchdog renewals that succeeded */
    uint64_t renew_failed; /* ... that failed with a store error */
    uint64_t long_holds;   /* holds that passed the long-hold threshold */
    dlock_histogram wait;    /* time in acquires that waited */
    dlock_histogram hold;    /* acquire to release (outermost) */
    dlock_histogram handoff; /* a waiter's wake-up from the store to its
                              * acquire returning the lock */
    /* client-wide only (name NULL), else zero: */
    uint64_t errors[16];      /* store errors by -code (errors[5]:
                               * DLOCK_ECONN) */
    dlock_histogram store_op; /* one store operation's time (a try,
                               * release, renewal, inspect) */
    int64_t holds;            /* holds now */
    int64_t waiters;          /* threads waiting now */
} dlock_stats;

/*
 * Fills *out with the metrics of lock `name` (NULL: the whole client,
 * every name summed; "": the aggregate of names without their own
 * series). A name without series of its own gets zeros and tracked 0.
 * `size` is sizeof(*out) as the caller knows it (fields past it are
 * not written). Errors: DLOCK_EINVAL (NULL client or out, size too
 * small, name too long). Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_stats_get(dlock_client *c, const char *name,
                                 dlock_stats *out, size_t size);

/*
 * Renders the metrics of clients[0..n) in the Prometheus text exposition
 * format (version 0.0.4): one family per metric (dlock_acquired_total,
 * dlock_wait_seconds_bucket{le=...}, ...), each series labelled with
 * store="<the client's redacted URI>" and, per name, lock="<name>"
 * (label values escaped as the format says: \\, \" and \n. Prometheus
 * takes UTF-8 only, so in a name that is not UTF-8 each stray byte is
 * written \xNN and the series gets lock_hex="<the name's bytes in
 * hex>", exact).
 * docs/monitoring.md lists the families. *out gets a NUL-terminated
 * buffer to free with dlock_free(), *len (may be NULL) its length.
 * Errors: DLOCK_EINVAL, DLOCK_ENOMEM. Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_metrics_text(dlock_client *const *clients, size_t n,
                                    char **out, size_t *len);

/* Frees a buffer the library returned (dlock_metrics_text()). */
DLOCK_EXTERN void dlock_free(void *p);

/* Event types (dlock_event.type). */
#define DLOCK_EVENT_ACQUIRED 1  /* a hold was taken in the store */
#define DLOCK_EVENT_RELEASED 2  /* ... was released (rc: the result) */
#define DLOCK_EVENT_LOST 3      /* ... was found lost (why: the cause) */
#define DLOCK_EVENT_LONG_HOLD 4 /* ... passed the long-hold threshold */
#define DLOCK_EVENT_AT_RISK 5   /* ... its lease ends within the client's
                                 * at-risk margin and no renewal has
                                 * extended it (renewals failed or went
                                 * unanswered; DLOCK_NO_RENEW: its natural
                                 * end is near). why: the last renewal
                                 * failure; left_ms: the lease left */
#define DLOCK_EVENT_SAFE 6      /* ... a renewal succeeded after AT_RISK */

/* What happened, for a dlock_event_cb. Valid during the call only. */
typedef struct dlock_event {
    int type;          /* DLOCK_EVENT_* */
    dlock *lock;       /* the handle the hold was made through */
    const char *name;  /* its lock name */
    int shared;        /* 1: a read hold; 2: a semaphore's permit */
    uint64_t token;    /* the hold's fencing token */
    int64_t waited_ms; /* ACQUIRED: time spent in the acquire call */
    int64_t held_ms;   /* RELEASED, LOST, LONG_HOLD: the hold's age */
    int rc;            /* RELEASED: what dlock_release() returns */
    const char *why;   /* LOST: why (as in dlock_errmsg()); AT_RISK: the
                        * last renewal failure, or why nothing renews
                        * it; else "" */
    int64_t left_ms;   /* AT_RISK, SAFE: the local lease left at the event
                        * (AT_RISK: the time left to stop the work; <= 0
                        * when the event comes late, e.g. after the
                        * process was frozen; SAFE: INT64_MAX where the
                        * lease has no end while the store is reachable,
                        * a ZooKeeper session's); else 0 */
} dlock_event;

typedef void (*dlock_event_cb)(const dlock_event *ev, void *arg);

/*
 * Sets the client's event callback (NULL: none) and its long-hold
 * threshold (0: no LONG_HOLD events). ACQUIRED and RELEASED are called on
 * the owner's thread, inside dlock_acquire() and dlock_release() just
 * before they return (only for holds taken or freed in the store, not
 * for reentrant levels); LOST and LONG_HOLD on the client's background
 * thread, once per hold (LOST on the owner's thread when its own
 * dlock_extend() finds the hold gone; a loss that dlock_release() finds
 * is its RELEASED event with rc DLOCK_ELOST); AT_RISK and SAFE on the
 * background thread too (dlock_client_set_at_risk()). The callback must return
 * quickly (it delays the caller, or the client's renewals) and must not
 * call dlock_close() or dlock_client_close(); it may call any other
 * function. Replacing the callback while holds exist is allowed: a call
 * already started may still reach the old one. A new long_hold_ms
 * applies to holds taken from then on.
 * Errors: DLOCK_EINVAL (NULL or closed client, long_hold_ms < 0 or
 * > DLOCK_WAIT_MAX).
 * Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_client_set_events(dlock_client *c, dlock_event_cb cb,
                                         void *arg, int64_t long_hold_ms);

/*
 * Sets the client's at-risk margin (0: off, the default). A hold whose
 * local lease end (the moment until which the library is sure it holds
 * the lock, and at which it declares it lost) comes within margin_ms
 * without a renewal having moved it gets one DLOCK_EVENT_AT_RISK on the
 * event callback (background thread), on time even while the store
 * leaves a renewal unanswered; a renewal that succeeds afterwards gives
 * DLOCK_EVENT_SAFE. Time enough to stop the work under the lock before
 * anyone else can take it. With a margin set, the watchdog renews every
 * min(ttl/3, (ttl - drift - margin)/2) (at least ttl/10), so that a
 * renewal and its retry come first. Holds without a lease (file://,
 * postgres advisory locks) never get these events. The margin applies at
 * once to every hold. See dlock_client_at_risk_max() for what fits.
 * Errors: DLOCK_EINVAL (NULL or closed client, margin_ms < 0 or
 * > DLOCK_TTL_MAX).
 * Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_client_set_at_risk(dlock_client *c, int64_t margin_ms);

/*
 * The largest at-risk margin under which a renewal of a hold of ttl_ms on
 * this client's store still has a fair chance (at least a sixth of the
 * lease) before the hold is at risk, in *max_ms: 2/3 of the ttl less the
 * drift margin where the watchdog renews leases (Redis, Redlock, the lock
 * tables); a sixth of the granted lease on etcd and a third of the
 * session timeout less the drift margin on ZooKeeper (these two ask the
 * store: a lease is granted, a session opened, as the next acquire of
 * that ttl would); INT64_MAX where holds have no lease (file://,
 * postgres advisory locks: no at-risk event comes). May be 0 for a very
 * short ttl. Errors: DLOCK_EINVAL (NULL client or max_ms, ttl_ms below
 * DLOCK_TTL_MIN or above DLOCK_TTL_MAX), and the store's errors for etcd and ZooKeeper
 * (DLOCK_ECONN, DLOCK_EAUTH, ...). Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_client_at_risk_max(dlock_client *c, int64_t ttl_ms,
                                          int64_t *max_ms);

/* One thing dlock_client_check() found that makes locks unsafe or slow on
 * this deployment. */
typedef struct dlock_finding {
    char check[32]; /* a stable name: "redis-persistence",
                     * "password-without-tls", "file-on-nfs",
                     * "file-on-overlayfs", "lease-vs-round-trip",
                     * "clock-offset", "sentinel-min-replicas",
                     * "pg-transaction-pooling", "zk-session-timeout"
                     * (docs/locks.md, "Checking a deployment") */
    char what[512]; /* what was found, and why it matters */
    char fix[512];  /* what to change */
} dlock_finding;

/* What dlock_client_check() measured and found: freed with
 * dlock_check_clear(). */
typedef struct dlock_check {
    dlock_finding *findings; /* n of them, malloc'd */
    size_t n;
    int64_t round_trip_us;   /* the median of a few store round trips */
    int64_t clock_offset_ms; /* the store's clock less this host's (wall
                              * clocks; INT64_MIN: the store has none to
                              * read, or it could not be read) */
    char notes[1024];        /* what could not be checked, and why ("" if
                              * everything was) */
} dlock_check;

/*
 * Checks the deployment under client c for what makes locks unsafe or
 * slow, for holds of ttl_ms (0: 10000, dlock run's default), as `dlock
 * doctor` prints it (docs/locks.md, "Checking a deployment"): the store's
 * round trip against the lease, the clock offset between this host and
 * the store (from the store's own clock), and what the store's module
 * checks of itself (Redis: persistence, Sentinel without min_replicas;
 * PostgreSQL: transaction pooling; ZooKeeper: a session timeout the
 * server will not grant; Redis, PostgreSQL, MySQL/MariaDB, ZooKeeper: a
 * password used without TLS; the file store: NFS or overlayfs; the list
 * is in docs/locks.md). Talks to
 * the store (a few inspect round trips and reads of its settings); takes
 * no lock. On DLOCK_OK *out holds the findings (none: nothing found) and
 * the figures; the caller frees it with dlock_check_clear().
 * Errors: DLOCK_EINVAL (NULL client or out, ttl_ms out of range), the
 * store's (DLOCK_ECONN, DLOCK_EAUTH, ...), DLOCK_ENOMEM.
 * Thread-safety: any thread.
 */
DLOCK_EXTERN int dlock_client_check(dlock_client *c, int64_t ttl_ms,
                                    dlock_check *out);

/* Frees what dlock_client_check() allocated in *check. NULL is a no-op. */
DLOCK_EXTERN void dlock_check_clear(dlock_check *check);

/* ------------------------------------------------------------------------ */
/* Errors and version                                                       */
/* ------------------------------------------------------------------------ */

/* A static English description of a return code ("unknown error code" for
 * a number that is not one). Thread-safety: any thread. */
DLOCK_EXTERN const char *dlock_strerror(int rc);

/* The name of a return code ("DLOCK_EBUSY"). Thread-safety: any thread. */
DLOCK_EXTERN const char *dlock_errname(int rc);

/*
 * The detailed message of the last failure on the calling thread ("redis
 * 127.0.0.1:6379: connection refused"). Thread-local storage, overwritten by
 * the next failing call on this thread; "" if none yet. Inside a lost-lock
 * callback it describes the loss.
 */
DLOCK_EXTERN const char *dlock_errmsg(void);

/* "0.1.0". */
DLOCK_EXTERN const char *dlock_version(void);

/* How this library reaches a store (dlock_store_scheme()). */
#define DLOCK_STORE_MISSING 0 /* left out of this build, or its module is
                               * not installed */
#define DLOCK_STORE_BUILTIN 1 /* inside the library */
#define DLOCK_STORE_MODULE 2  /* its module is installed: loaded on the
                               * first client of its scheme */

/*
 * The URI schemes this library knows, by index from 0: returns the scheme
 * ("redis"), or NULL past the last one. With `how` non-NULL, *how gets
 * DLOCK_STORE_BUILTIN, DLOCK_STORE_MODULE or DLOCK_STORE_MISSING. A module
 * is only looked for here, not loaded: dlock_client_open() may still
 * refuse a module found (one of another dlock version, for example) with
 * DLOCK_ENOTSUP and a message that says why. The module directory is
 * dlock-<version>/ beside the shared library, or $DLOCK_MODULE_DIR
 * (docs/development.md "Modules"). The returned string is static.
 * Thread-safety: any thread.
 */
DLOCK_EXTERN const char *dlock_store_scheme(size_t index, int *how);

#ifdef __cplusplus
}
#endif

#endif /* DLOCK_H */
