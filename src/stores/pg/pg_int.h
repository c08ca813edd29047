/* SPDX-License-Identifier: MIT */
/*
 * pg_int.h -- what the PostgreSQL store's files share: pg.c, the store (URI
 * options and libpq's keywords, open and close, the client thread's
 * loop, the two backend structs' shared slots); pg_table.c, table mode
 * (the lock table's slots and dlock__backend_pg: exclusive and shared
 * holds and permits); pg_advisory.c, advisory mode (its slots and
 * backend, chosen by dlock__pg_select); pg_advisory_rw.c, advisory mode's
 * semaphores (slot keys, the gate, the head's wait on every slot);
 * pg_hold.c, advisory mode's holds (a session each, watched) and its
 * server-side waits;
 * pg_conn.c, its connections (the command connection and the pool of
 * extra ones, non-blocking libpq I/O with the caller's deadline, running
 * statements, error codes, LISTEN and the notifications read on the
 * command connection); pg_sql.c, its SQL (quoted names, the statements'
 * texts); and pg_schema.c, the table mode's schema with its release,
 * leave and queue functions, and the look at open that creates or
 * upgrades what is missing and tells whether a pooler sits in front.
 */
#ifndef DLOCK_PG_INT_H
#define DLOCK_PG_INT_H

#include "pool.h"
#include "store.h"

#include <libpq-fe.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define PG_DEFAULT_TABLE "dlock_locks"
#define PG_TABLE_MAX 48     /* + "_tokens"/"_waiters": under 63 bytes */
#define PG_IDLE_MAX 8       /* idle extra connections kept (for a second) */
#define PG_IDLE_MS 1000     /* extras unused, or no waiter, for this long:
                             * close them, UNLISTEN */
#define PG_APPNAME_MAX 63

/* The server's clock, and the advisory key of a bytea name. */
#define NOW "clock_timestamp()"
#define NOW_MS "floor(extract(epoch FROM " NOW ") * 1000)::bigint"
#define MS_LEFT(ts) "ceil(extract(epoch FROM " ts " - " NOW ") * 1000)::bigint"
#define KEY(x) "('x' || substr(md5(" x "), 1, 16))::bit(64)::bigint"
/* The advisory lock a listening session holds while it listens: the
 * two-int key space (advisory mode uses one bigint), both halves of
 * md5(text), here 'CLIENTID:PID'. */
#define SKEY(x)                                                             \
    "('x' || substr(md5(" x "), 1, 8))::bit(32)::int, ('x' || substr(md5("  \
    x "), 9, 8))::bit(32)::int"
/* A waiter's session (columns client, pid of T_waiters) still listens: it
 * holds its key (a shared try is refused). The running session's own pid:
 * alive if the entry is of the running client (`me`), whose session does
 * not conflict with its own lock; any other client's is from a dead
 * session that had this pid. */
#define ALIVE(w, me)                                                        \
    "(CASE WHEN " w ".pid = pg_backend_pid() THEN " w ".client = " me       \
    " ELSE NOT pg_try_advisory_xact_lock_shared(" SKEY(                     \
        w ".client || ':' || " w ".pid") ") END)"

/* Advisory mode's semaphore keys (docs/design.md, "PostgreSQL advisory
 * mode semaphores") of the name expression n (bytea): n, a NUL byte (no
 * lock name has one), a tag. N and i are SQL expressions. */
#define ADV_TAGKEY(n, tag)                                                  \
    KEY("(" n " || '\\x00'::bytea || (" tag ")::bytea)")
#define ADV_F(n) ADV_TAGKEY(n, "'f'")
#define ADV_G(n) ADV_TAGKEY(n, "'g'")
#define ADV_C(n) ADV_TAGKEY(n, "'c'")
/* dlock_break() in advisory mode: the breaker holds it exclusively (a
 * transaction lock) while it reads who holds the name and ends their
 * sessions; every release takes it shared first, so that a release and a
 * break of the same name take turns (pg_advisory.c, adv_evict;
 * docs/monitoring.md, "postgres") */
#define ADV_B(n) ADV_TAGKEY(n, "'b'")
/* The witness key of name n on the session of backend pid: every dlock
 * hold (a lock, a read hold, a permit) holds it on its session with the
 * name's key, and lets go of it with the key. dlock_break() ends only the
 * sessions that hold it (with more: docs/design.md, "PostgreSQL advisory
 * mode: what a break ends") */
#define ADV_W(n, pid) ADV_TAGKEY(n, "'w' || " pid)
#define ADV_W_OWN(n) ADV_W(n, "pg_backend_pid()")
#define ADV_FN(n, N) ADV_TAGKEY(n, "'n' || " N)
#define ADV_SLOT(n, N, i) ADV_TAGKEY(n, "'s' || " N " || ':' || " i)
#define ADV_KEY_IS(k)                                                       \
    "l.locktype = 'advisory' AND l.objsubid = 1 AND ((l.classid::bigint "   \
    "<< 32) | l.objid::bigint) = " k
/* Key k is held by someone: our exclusive try fails, or is let go at
 * once. */
#define ADV_HELD(k)                                                         \
    "NOT CASE WHEN pg_try_advisory_lock(" k ") THEN pg_advisory_unlock("    \
    k ") ELSE false END"
/* Key k (a family key) is held shared, by a permit holder: our exclusive
 * try fails and pg_locks shows a shared holder (a try that fails may also
 * meet another's look, which holds it exclusively for an instant). */
#define ADV_SHARED_HELD(k)                                                  \
    "CASE WHEN pg_try_advisory_lock(" k ") THEN NOT pg_advisory_unlock("    \
    k ") ELSE EXISTS (SELECT 1 FROM pg_locks l WHERE l.granted AND l.mode " \
    "= 'ShareLock' AND " ADV_KEY_IS(k) ") END"
/* The N that a permit holder of name n names in its application_name
 * ("dlock TOKEN sN DESC") and that is not `not` (an SQL expression; NULL:
 * any N); NULL when none is found. */
#define ADV_OTHER_N(n, not)                                                 \
    "(SELECT x.m FROM (SELECT substring(a.application_name FROM '^dlock "   \
    "[0-9]+ s([0-9]{1,5}) ')::int AS m FROM pg_locks l JOIN "               \
    "pg_stat_activity a ON a.pid = l.pid WHERE l.granted AND "              \
    ADV_KEY_IS(ADV_F(n)) " AND a.application_name ~ '^dlock [0-9]+ "        \
    "s[0-9]{1,5} ') x WHERE x.m IS DISTINCT FROM " not " LIMIT 1)"
/* What dlock_inspect() says of lock row t (a table alias or a record), as
 * the columns i0..i8: held, holder, token, lease left, held for, shared
 * form (owner '*'), permits, live entries, the earliest live entry's
 * description. S_INSPECT, S_LIST and T_break share it, so that a listed
 * lock and a broken one are described exactly as dlock_inspect() would. */
#define PG_LIVE_OF(t)                                                       \
    "FROM jsonb_each(CASE WHEN " t ".owner = '*' THEN " t ".holders END) "  \
    "x WHERE (x.value ->> 'u')::bigint > " NOW_MS
#define PG_INSPECT_COLS(t)                                                  \
    t ".owner IS NOT NULL AND " t ".lock_until > " NOW " AS i0, " t         \
    ".holder AS i1, " t ".token AS i2, " MS_LEFT(t ".lock_until") " AS i3, " \
    "floor(extract(epoch FROM " NOW " - " t ".locked_at) * 1000)::bigint "  \
    "AS i4, " t ".owner = '*' AS i5, CASE WHEN " t ".owner IS NULL OR " t   \
    ".owner = '*' THEN " t ".permits ELSE 0 END AS i6, (SELECT count(*) "   \
    PG_LIVE_OF(t) ") AS i7, (SELECT x.value ->> 'd' " PG_LIVE_OF(t)         \
    " ORDER BY (x.value ->> 's')::bigint, (x.value ->> 't')::bigint LIMIT " \
    "1) AS i8"
/* The most permits of a semaphore in advisory mode: its head waits with
 * one session per permit (docs/locks.md). */
#define PG_ADV_PERMITS_MAX 32

enum {
    S_ACQUIRE,
    S_RELEASE,
    S_EXTEND,
    S_INSPECT,
    S_QUEUE,
    S_LEAVE,
    S_GC,
    S_GC_QUEUE,
    S_ADV_TRY,
    S_ADV_UNLOCK,
    S_ADV_CHECK,
    S_ADV_INSPECT,
    S_ADV_TRY_SHARED,
    S_ADV_UNLOCK_SHARED,
    S_TAKE,
    S_TAKE_FAST,
    S_RELEASE_READ,
    S_EXTEND_SHARED,
    S_ADV_SEM_TRY,
    S_ADV_SEM_UNLOCK,
    S_ADV_SEM_CHECK,
    S_LIST,
    S_BREAK,
    S_CONFIRM,
    S_PROCLAIM, /* leader election (pg_elect.c) */
    S_COUNT
};

/* Parameter types: bytea, text, int8, int4 (OIDs fixed by PostgreSQL);
 * at most PG_PARAMS_MAX parameters a statement. */
#define PG_PARAMS_MAX 10
#define T_BYTEA 17
#define T_TEXT 25
#define T_INT8 20
#define T_INT4 23
#define T_BOOL 16

/* ?pooler= */
enum { POOLER_NONE, POOLER_SESSION, POOLER_TRANSACTION };

typedef struct pg_conn {
    PGconn *pg;
    unsigned prepared; /* bit i: statement i prepared on this connection */
    int broken;        /* unusable: close instead of pooling */
    int ended;         /* the server ended the session (SQLSTATE 57P01:
                        * pg_terminate_backend, dlock_break() in advisory
                        * mode, or a shutdown) */
    /* advisory holds */
    pthread_mutex_t mu; /* the hold's owner vs the client thread */
    int dead;           /* the client thread saw its session end */
    int watched;        /* in the epoll set */
    /* while a wait's statement runs: its dlock_cancel() eventfd (-1:
     * none), which sends the server a cancel request (once) */
    int cfd, cancel_sent;
    /* while it is being opened: where PQconnectPoll() stands, and when
     * the opening began (a half-open connection, see pg_store.half) */
    PostgresPollingStatusType polling;
    int64_t opening_since;
    /* a statement sent at orphan_since runs on, its answer unread (a
     * caller's deadline cut it short: pg_conn.c, orphaned()) */
    int orphan;
    int64_t orphan_since;
    struct pg_conn *next, *prev;
} pg_conn;

typedef struct pg_store {
    dlock_client *client;
    char *redacted;
    int advisory;
    int64_t timeout_ms;
    int pooler;    /* ?pooler= */
    int behind;    /* a pooler sits in front (detected) */
    int sessions;  /* LISTEN and session locks can be trusted */
    int unnamed;   /* no prepared statements (transaction pooling) */
    int has_break; /* T_break is there (atomic; 0: look at first break) */

    /* libpq connection keywords and values (owned; password wiped) */
    const char *keys[24];
    char *vals[24];

    char table[PG_TABLE_MAX + 1];
    char *sql[S_COUNT];
    int nparams[S_COUNT];
    char seq_ident[2 * PG_TABLE_MAX + 24]; /* "T_tokens" */
    char seq_lit[4 * PG_TABLE_MAX + 48];   /* '"T_tokens"', a literal */
    char chan[48];                         /* dlock_CLIENTID */

    pthread_mutex_t mu; /* the command connection, the pool, waiting */
    pthread_cond_t cv;  /* the command connection became free */
    pg_conn *main;      /* the command connection (NULL: none now) */
    int main_busy;      /* a thread uses it (a statement, or reading) */
    int main_opening;   /* a thread opens it (main is NULL until then):
                         * nobody else opens one as the command
                         * connection meanwhile */
    int main_pending;   /* an UNLISTEN was sent: its answer is unread */
    int listening;      /* main LISTENs on chan */
    unsigned gen;       /* +1 whenever a listening main is lost */
    int lpid;           /* main's backend pid on the server ... */
    char lsince[48];    /* ... and its backend_start */
    int nwait;          /* leases counted as waiting (listening refs) */
    dlock__pool idle;   /* extra connections (up to PG_IDLE_MAX) */
    /* a connection whose opening a caller's deadline cut short (a wait of
     * a few ms cannot hold a whole log-in): the next opener goes on with
     * it rather than start over, so that short waits still get connected
     * (dropped once older than ?timeout=) */
    pg_conn *half;

    int epfd;    /* the client thread's fd: main, idle timer, holds */
    int idle_fd; /* one-shot: close extras; nobody waits: UNLISTEN */

    pthread_mutex_t hmu; /* advisory holds' connections */
    pg_conn *holds;
} pg_store;

typedef struct pg_lease {
    int listening; /* counted in nwait ... */
    unsigned gen;  /* ... for this generation of the listening session */
    int queued;    /* a try of this wait appended its entry */
    int others;    /* a read hold taken beside others: its release tries
                    * S_RELEASE_READ first */
    pg_conn *hold; /* advisory: the connection holding the lock */
    int slot;      /* advisory: the permit's slot (1..N) */
} pg_lease;

/* The client thread's epoll entries (a hold's: its pg_conn). */
#define EV_MAIN 2u
#define EV_IDLE 3u

/* The schema objects' names, each one quoted identifier. */
typedef struct pg_names {
    char t[2 * PG_TABLE_MAX + 16];  /* T */
    char w[2 * PG_TABLE_MAX + 24];  /* T_waiters */
    char wi[2 * PG_TABLE_MAX + 32]; /* T_waiters_name */
    char rel[2 * PG_TABLE_MAX + 24]; /* T_release */
    char leave[2 * PG_TABLE_MAX + 24]; /* T_leave */
    char unlock[2 * PG_TABLE_MAX + 24]; /* T_unlock */
    char ahead[2 * PG_TABLE_MAX + 24];  /* T_ahead */
    char abandon[2 * PG_TABLE_MAX + 24]; /* T_abandon */
    char earliest[2 * PG_TABLE_MAX + 24]; /* T_earliest */
    char brk[2 * PG_TABLE_MAX + 24];      /* T_break */
} pg_names;

/* pg.c: the store, for both modes */

/* The backend's open, close, loop_fd and loop_run slots. */
int dlock__pg_open(void **out, dlock_client *c, const dlock__uri *u,
                   int64_t timeout_ms);
void dlock__pg_close(void *st);
int dlock__pg_loop_fd(void *st);
void dlock__pg_loop_run(void *st, int readable);

/* Row `row`, column `col` of r as a number (dflt: no such value). */
long long dlock__pg_col_ll(const PGresult *r, int row, int col,
                           long long dflt);

/* DLOCK_ENOTHELD: the row (table mode) or the session (advisory mode) no
 * longer holds the lock. */
int dlock__pg_not_ours(pg_store *ps);

/* pg_advisory.c */

/* The advisory backend for ?mode=advisory, else NULL (the select slot). */
const dlock__backend *dlock__pg_select(const dlock__uri *u);

/* pg_hold.c: advisory mode's holds */

/* The client thread: a watched hold connection became readable (hmu
 * held): a session that ended is reported lost. */
void dlock__pg_hold_check(pg_store *ps, pg_conn *cn);

/* The lock is ours on cn, token taken: cn is kept for the hold, and
 * watched. */
void dlock__pg_hold_keep(pg_store *ps, dlock__lease *l, pg_conn *cn,
                         long long token);

/* The hold on cn ends (released): cn is no longer watched. */
void dlock__pg_hold_unwatch(pg_store *ps, pg_conn *cn);

/* The application_name part of a hold: its description, within 63
 * bytes. */
void dlock__pg_appname(const dlock__lease *l, char *out, size_t cap);

/* Runs sql, which waits in the server for an advisory lock, on cn until
 * the caller's deadline (and the store's timeout past it), dlock_cancel()
 * ending it: DLOCK_OK with *r, or the code (DLOCK_EBUSY when cancelled:
 * the core says DLOCK_ECANCELED). */
int dlock__pg_adv_wait(pg_store *ps, pg_conn *cn, const dlock__lease *l,
                       const char *sql, PGresult **r, const char *what);

/* pg_advisory_rw.c: advisory mode's semaphores */

/* A permit (l->kind DLOCK__PERMIT): a try, or a wait until l->deadline
 * at the gate and, as the head, on every slot at once. */
int dlock__pg_adv_sem_acquire(pg_store *ps, dlock__lease *l,
                              int64_t op_deadline);

/* pg_conn.c: errors */

/* DLOCK_ENOMEM, "out of memory". */
int dlock__pg_enomem(void);

/* A failed result (NULL: none came): the code for its SQLSTATE, with the
 * server's words. */
int dlock__pg_result_error(pg_store *ps, const PGresult *r,
                           const char *what);

/* pg_conn.c: connections and statements */

/* Closes and frees a connection (NULL: nothing). */
void dlock__pg_conn_free(pg_conn *cn);

/* A connection for one statement (the command connection when free, an
 * idle extra one, or a new one), within `deadline` and ?timeout=. */
int dlock__pg_conn_get(pg_store *ps, int64_t deadline, pg_conn **out);

/* A connection the caller keeps for itself (never the command
 * connection): an idle extra one, or a new one. Freed with
 * dlock__pg_conn_free(). */
int dlock__pg_conn_own(pg_store *ps, int64_t deadline, pg_conn **out);

/* Gives cn back: to the command connection's waiters, to the idle extras,
 * or closed when it is unusable. */
void dlock__pg_conn_put(pg_store *ps, pg_conn *cn);

/* Runs statement `which` (ps->sql) on cn, vals[0] the name in binary;
 * *out its result on DLOCK_OK (the caller PQclear()s it). */
int dlock__pg_run(pg_store *ps, pg_conn *cn, int which,
                  const char *const *vals, const int *lens, int64_t deadline,
                  PGresult **out, const char *what);

/* dlock__pg_run() on a pooled connection. */
int dlock__pg_run_pooled(pg_store *ps, int which, const char *const *vals,
                         const int *lens, int64_t deadline, PGresult **out,
                         const char *what);

/* pg_check.c: the check slot of both modes. */
int dlock__pg_check(void *st, int64_t ttl_ms, dlock_check *out,
                    int64_t deadline);

/* A query text without parameters (may hold several statements). */
int dlock__pg_run_text(pg_store *ps, pg_conn *cn, const char *sql,
                       int64_t deadline, PGresult **out, const char *what);

/* pg_elect.c: leader election, table mode (backend slots). */
int dlock__pg_proclaim(void *st, dlock__lease *l, const char *desc,
                       int64_t op_deadline);
int dlock__pg_ring(void *st, const char *name, size_t len,
                   int64_t op_deadline);
int dlock__pg_watch_open(void *st, const char *name, size_t len, void **w,
                         int64_t op_deadline);
int dlock__pg_watch_wait(void *st, void *w, int64_t deadline, int cancel_fd);
void dlock__pg_watch_close(void *st, void *w);

/* pg_conn.c: notifications (table mode) */

/* Counts lease pl as waiting: the command connection LISTENs (`may_send`:
 * LISTEN now if needed). DLOCK_OK, DLOCK_EBUSY (not listening and
 * !may_send), or an error. */
int dlock__pg_listen_ref(pg_store *ps, pg_lease *pl, int64_t deadline,
                         int may_send);

/* Lease pl waits no more (UNLISTEN a second after the last). */
void dlock__pg_listen_unref(pg_store *ps, pg_lease *pl);

/* The idle timer fired: close unused extras; UNLISTEN with no waiter. */
void dlock__pg_idle_run(pg_store *ps);

/* The command connection is readable while nobody uses it. */
void dlock__pg_main_read(pg_store *ps);

/* pg_sql.c */

/* in + suffix as one quoted identifier ("..." with quotes doubled). */
void dlock__pg_quote_ident(const char *in, const char *suffix, char *out,
                           size_t cap);

/* in as a quoted literal ('...' with quotes doubled). */
void dlock__pg_quote_literal(const char *in, char *out, size_t cap);
/* fmt with each "%N$s" (N from 1 to n) replaced by arg[N-1] and "%%" by
 * "%": the statements' templates, which name only the arguments they
 * use (printf() wants every argument up to the highest one named, and a
 * fortified glibc aborts when one is skipped). malloc'd; NULL when out
 * of memory. */
char *dlock__pg_fill(const char *fmt, const char *const *arg, int n);

/* ps->sql and ps->nparams for the names nm and the sequence literal s. */
int dlock__pg_build_statements(pg_store *ps, const pg_names *nm,
                               const char *s);

/* The names of the schema objects of table `table` (?table=). */
void dlock__pg_names_of(const char *table, pg_names *nm);

/* pg_schema.c */

/* Creates the schema objects that are missing; sets ps->behind, sessions
 * and unnamed (pooler detection). */
int dlock__pg_ensure_schema(pg_store *ps, pg_conn *cn, const pg_names *nm,
                            int64_t deadline);

/* Table mode: creates T_break when a table made by an earlier dlock lacks
 * it (dlock_break()'s first call on this client); sets ps->has_break. */
int dlock__pg_ensure_break(pg_store *ps, int64_t deadline);


/* The store's table (store.h), named by module.c and, in a build with
 * the store built in, by the core's registry. */
extern const dlock__backend dlock__backend_pg;

#endif /* DLOCK_PG_INT_H */
