/* SPDX-License-Identifier: MIT */
/*
 * mysql_int.h -- what the MySQL/MariaDB store's files share: mysql.c,
 * the store (release, extend, inspect, gc, open and close, the backend
 * struct); mysql_operate.c, what inspect, list and break say of a lock
 * row, and the break; mysql_wait.c, acquire and the waiting in the
 * server (the gate, the fair queue's entry), with mysql_try.c, the
 * statements of one try (mysql_try.h); mysql_rw.c, read holds' and
 * permits' release, renewal and waiting; mysql_sql.c, its SQL (quoted
 * names, hex literals, owners' JSON paths, the statements' texts, the
 * schema); mysql_hash.c, the read holds' lock names as literals; and
 * mysql_conn.c, its connections (the pool, the non-blocking Connector/C
 * I/O that keeps the caller's deadline, statements made and run, error
 * codes, a hold's own connection). Each calls only those after it.
 */
#ifndef DLOCK_MYSQL_INT_H
#define DLOCK_MYSQL_INT_H

#include "pool.h"
#include "store.h"

#include <mysql.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define MY_DEFAULT_TABLE "dlock_locks"
#define MY_TABLE_MAX 48  /* + "_queue": within MySQL's 64 */
#define MY_IDLE_MAX 8
#define MY_WAIT_SLICE_MS 60000 /* one GET_LOCK waits at most this long */
#define MY_DEADLOCK_RETRIES 5
#define MY_WAIT_RECONNECTS 3 /* a waiting session killed: wait on anew */
#define MY_PERMITS_MAX 32 /* a full semaphore's head waits with one
                           * connection per holder (docs/locks.md) */
/* The hand-over grace, ms: a row released (or a lease ended) less than
 * this long ago whose gate another session holds is being handed to a
 * woken waiter, and a queue entry counts until this long after its
 * waiter's last wait end (docs/design.md, "Waiting in the server"). Far
 * above a woken statement's time on a busy server, far below a lease. */
#define MY_GRACE_MS 500
#define MY_GRACE_US "500000"
#define NOW "UTC_TIMESTAMP(6)"
/* The owner of a row whose readers or permits are entries of `holders`
 * (an owner id has a ':'); a sole reader's or permit's row has '*' and its
 * owner id. */
#define MY_SHARED "'*'"
/* The row is held by readers or permits (either form): `owner` starts
 * with '*' (no owner id does). */
#define MY_SHARED_ANY(owner) "(" owner " >= '*' AND " owner " < '+')"
/* Its sole holder's form ('*' and its owner id). */
#define MY_SOLE(owner) "(" owner " > '*' AND " owner " < '+')"

/* The statements prepared once per connection: a reader's or a permit's
 * join (the first try of a client that saw others hold the name), and
 * the release of a read hold or permit in either form (docs/design.md:
 * the contended path). */
enum { MY_PS_JOIN_READ, MY_PS_JOIN_PERMIT, MY_PS_RELEASE, MY_PS_N };
#define MY_PS_PARAMS 48 /* markers in one prepared statement, at most */

typedef struct my_conn {
    MYSQL *m;
    int broken;
    int answered; /* the last query's first statement was answered */
    unsigned err; /* the last statement's error number (0: none) */
    MYSQL_STMT *ps[MY_PS_N];         /* prepared, or NULL */
    char ps_order[MY_PS_N][MY_PS_PARAMS + 1]; /* their markers, in order */
    int ps_off;   /* the server refused a prepare: text statements */
    int cfd;      /* while a wait's statement runs: its dlock_cancel()
                   * eventfd, which ends the statement (KILL QUERY); -1 */
    int killed;   /* that KILL QUERY was sent */
    int64_t kill_until; /* ... and its answer is waited for until then */
} my_conn;

typedef struct my_store {
    char *redacted;
    int64_t timeout_ms;
    char *host, *user, *password, *db;
    unsigned port;
    char *ssl_ca, *ssl_cert, *ssl_key;
    int ssl_enforce, ssl_verify;
    char t[2 * MY_TABLE_MAX + 8];  /* `T` */
    char q[2 * MY_TABLE_MAX + 16]; /* `T_queue` */
    char table[MY_TABLE_MAX + 1];
    char *tl; /* the table's name as a literal, for gate names */
    char *dbname; /* DATABASE() as the server said it at open (the
                   * lock names the client computes hash it) */
    pthread_mutex_t mu;
    dlock__pool idle; /* up to MY_IDLE_MAX connections */
    int rw; /* the table has the columns of read holds and permits
             * (permits, holders): else exclusive locks only */
    char *tmpl[MY_PS_N]; /* the prepared statements' texts, with markers
                          * (MY_V_*), made at open */
    char rw_why[200]; /* why not, for the DLOCK_ENOTSUP */
} my_store;


/* What a busy upsert's LAST_INSERT_ID says about the row (MY_CODE_SEM + N:
 * a live semaphore of N permits). */
enum { MY_CODE_NONE = 0, MY_CODE_WRITER = 1, MY_CODE_READERS = 2,
       MY_CODE_SEM = 3 };
/* Added to a writer's busy try's code when the try holds the gate (it
 * took it: a writer meeting readers then drains them at once). */
#define MY_CODE_GATED 64

/* A value of a statement's text, as a marker (the byte 1 and a letter):
 * a literal in a text statement (dlock__mysql_fill()), a parameter in a
 * prepared one. */
#define MY_V_NAME "\001N"     /* the lock name (bytes) */
#define MY_V_SOLE "\001S"     /* '*' and the owner id (bytes) */
#define MY_V_DESC "\001D"     /* the holder's description (bytes) */
#define MY_V_TTL "\001T"      /* the lease, µs */
#define MY_V_PERMITS "\001P"  /* a semaphore's N */
#define MY_V_GATE "\001G"     /* the gate's name */
#define MY_V_HOLD "\001H"     /* the hold lock's name */
#define MY_V_OWNER "\001O"    /* the owner id (text: a JSON key) */
#define MY_V_PATH "\001A"     /* '$."OWNER"': our entry */
#define MY_V_PATH_TOK "\001E" /* its token ([1]) */
#define MY_V_PATH_END "\001F" /* its end ([2]) */
#define MY_V_TOKEN "\001K"    /* the hold's token */

/* The values the markers stand for, from one lease. */
typedef struct my_vals {
    const char *name;
    size_t name_len;
    char sole[96];
    const char *desc;
    long long ttl_us, permits;
    char gate[72], hold[72]; /* unquoted */
    char owner[88], path[96], path_tok[100], path_end[100];
    unsigned long long token;
} my_vals;

typedef struct my_lease {
    my_conn *cn; /* out of the pool while waiting or holding: the gate's,
                  * or a read hold's (permit's) hold lock's */
    int gated;   /* cn holds the name's gate */
    int locks;   /* cn may hold other user locks (a hold lock taken by a
                  * try that took nothing): let go of them on failure */
    int64_t seq; /* queue entry (inspect), 0 when none */
    int sole;    /* a read hold or permit taken by the light take: sole
                  * when taken (its release tries the sole form first) */
    int has_v;   /* v is filled (a read hold's or permit's acquire) */
    my_vals v;   /* its values, for its statements (lock names computed
                  * once) */
} my_lease;

/* Fills *v from the lease (its lock names computed): DLOCK_OK, or
 * DLOCK_EINVAL (an owner id with other bytes) or DLOCK_ENOMEM. */
int dlock__mysql_vals(const my_store *ms, const dlock__lease *l, my_vals *v);

/* The text statement of a template: each marker as a literal. Fresh
 * buffer, or NULL. */
char *dlock__mysql_fill(const char *tmpl, const my_vals *v);

/* mysql_conn.c: errors, connections and statements */

/* DLOCK_ENOMEM, "out of memory". */
int dlock__mysql_enomem(void);

/* Opens a connection within `deadline`. */
int dlock__mysql_conn_open(my_store *ms, int64_t deadline, my_conn **out);
/* The authentication plugins a connection without TLS may run (none that
 * sends the password where the network or a fake server reads it), and
 * the gate that runs first with ssl_mode=required (mysql_conn.c). */
#define MY_PLAIN_AUTH "mysql_native_password,client_ed25519,auth_gssapi_client"
#define MY_GATE_AUTH "dlock_tls_gate"
/* Registers the gate with Connector/C; once per process, before any
 * connection (the store's library_init). */
void dlock__mysql_gate_register(void);

/* Closes and frees a connection (NULL: nothing). */
void dlock__mysql_conn_free(my_conn *cn);

/* A connection from the pool (an idle one still open, or a new one). */
int dlock__mysql_conn_get(my_store *ms, int64_t deadline, my_conn **out);

/* Gives cn back to the pool, or closes it (broken, or the pool full). */
void dlock__mysql_conn_put(my_store *ms, my_conn *cn);

/* Runs sql (one statement or several) on cn within `deadline`: what
 * statement number `at` changed and the LAST_INSERT_ID it set, the rows
 * of the last statement that has rows (mysql_conn.c says more). */
int dlock__mysql_query_at(my_store *ms, my_conn *cn, const char *sql,
                          int64_t deadline, MYSQL_RES **res, int at,
                          uint64_t *affected, uint64_t *id,
                          const char *what);

/* dlock__mysql_query_at() for the first statement. */
int dlock__mysql_query(my_store *ms, my_conn *cn, const char *sql,
                       int64_t deadline, MYSQL_RES **res,
                       uint64_t *affected, uint64_t *id, const char *what);

/* Runs prepared statement `which` (its template ms->tmpl[which], prepared
 * on cn's first use) with the values of v, within `deadline`: what it
 * changed and its LAST_INSERT_ID. MY_PS_TEXT when the server refused to
 * prepare it (the caller runs the text statement; cn stays text). */
#define MY_PS_TEXT 1000
int dlock__mysql_ps_run(my_store *ms, my_conn *cn, int which,
                        const my_vals *v, int64_t deadline,
                        uint64_t *affected, uint64_t *id, const char *what);

/* The error number of cn's last statement (text or prepared). */
unsigned dlock__mysql_errno(const my_conn *cn);

/* mysql_check.c: the check slot. */
int dlock__mysql_check(void *st, int64_t ttl_ms, dlock_check *out,
                       int64_t deadline);

/* One statement on a pooled connection (a deadlock victim runs again). */
int dlock__mysql_query_pooled(my_store *ms, const char *sql,
                              int64_t deadline, MYSQL_RES **res,
                              uint64_t *affected, uint64_t *id,
                              const char *what);

/* Column `col` of r's first row as a number (dflt: no such value). */
long long dlock__mysql_col_ll(MYSQL_RES *r, int col, long long dflt);

/* A statement from fmt; fresh buffer, or NULL. */
char *dlock__mysql_stmt(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* Is the hold's own connection alive (and so its gate held)? */
int dlock__mysql_pinned_alive(my_lease *sl);

/* Did cn's session end under its last statement (killed: a break kills
 * the sessions of the holds it takes; or the connection lost)? Then cn
 * is broken (closed when given back), and the caller asks again on a
 * pooled connection. Not for a statement past our deadline. */
int dlock__mysql_killed(my_conn *cn);

/* A hold its renewal found gone lets go of its user-level locks
 * (RELEASE_ALL_LOCKS() on its connection, or the connection closed)
 * and gives its connection back. */
void dlock__mysql_let_go_lost(my_store *ms, my_lease *sl, int64_t deadline);

/* mysql_sql.c: names and statements */

/* in + suffix as one backquoted identifier (backquotes doubled). */
void dlock__mysql_quote_ident(const char *in, const char *suffix,
                              char *out, size_t cap);

/* X'<hex>' of n bytes into a fresh buffer (NULL: out of memory). */
char *dlock__mysql_hexlit(const char *s, size_t n);

/* The owner as a JSON path into `holders`: '$."OWNER"' plus `tail` (the
 * owner is checked: [0-9A-Za-z:._-] only). DLOCK_OK or DLOCK_EINVAL. */
int dlock__mysql_owner_path(const char *owner, const char *tail, char *out,
                            size_t cap);

/* The name's gate, an SQL expression (name_lit a hex literal). */
char *dlock__mysql_gate_of(const my_store *ms, const char *name_lit);

/* A fair queue entry's own user lock (`seq` an SQL expression). */
char *dlock__mysql_entry_lock_of(const my_store *ms, const char *seq);

/* A read hold's (permit's) hold lock (`owner` an SQL expression). */
char *dlock__mysql_hold_lock_of(const my_store *ms, const char *name_lit,
                                const char *owner);

/* The server's clock in µs, from a DATETIME(6) expression. */
#define MY_US(dt) "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', " dt ")"

/* The holds of a row read by alias `a` ("t." or ""), as one JSON object
 * whatever the form: `holders` for entries, a one-entry object made of the
 * sole holder's columns, else NULL. */
#define MY_HOLDS_OF(a)                                                      \
    "IF(" a "owner <=> " MY_SHARED ", " a "holders, IF(" MY_SOLE(a "owner") \
    ", JSON_OBJECT(CONVERT(SUBSTR(" a "owner, 2) USING utf8mb4), "          \
    "JSON_ARRAY(CONVERT(SUBSTR(" a "owner, 2) USING utf8mb4), " a "token, " \
    MY_US(a "lock_until") ", " MY_US(a "locked_at") ", CONVERT(" a          \
    "holder USING utf8mb4))), NULL))"

/* The columns of JSON_TABLE over `holders` (o owner, t token, e end µs,
 * s start µs, d description). */
#define MY_HOLDERS_COLS                                                     \
    "'$.*' COLUMNS (o VARCHAR(80) PATH '$[0]', t BIGINT UNSIGNED PATH "     \
    "'$[1]', e BIGINT PATH '$[2]', s BIGINT PATH '$[3]', d VARCHAR(255) "    \
    "PATH '$[4]')"

/* What the holds left make of the row (the count is every entry left,
 * a few ended ones included until a renewal or a fresh start drops them;
 * a sole holder's `holder` is its description). */
#define HOLDER_TEXT                                                         \
    "holder = IF(holds = 0, NULL, IF(owner <=> " MY_SHARED ", IF(permits > " \
    "0, CONCAT(holds, ' of ', permits, ' permits'), CONCAT(holds, IF(holds " \
    "= 1, ' reader', ' readers'))), holder))"

/* The acquire's upsert, guarded by `where`; `woke`: a waiter's, whose
 * times are its wake's; `rich`: a busy answer says who holds; `gate`
 * (a quoted literal, or NULL for a statement that holds the gate): a
 * try's, which takes an ended row only as the row decides (mysql_sql.c
 * says how). */
char *dlock__mysql_upsert(const my_store *ms, const dlock__lease *l,
                          const char *name, const char *owner,
                          const char *holder, const char *where, int woke,
                          int rich, const char *gate);

/* "EXISTS (...)": a queue entry of the name (name_lit) counts: its
 * waiter's session holds the entry's lock and its last wait ended less
 * than the grace ago. `older`: only entries older than ours (@dlock_q). */
char *dlock__mysql_counting(const my_store *ms, const char *name_lit,
                            int older);

/* A read hold's or permit's light take (mysql_sql.c says more): the
 * exclusive upsert's shape with the sole holder's values, guarded by
 * `where`. */
char *dlock__mysql_upsert_light(const my_store *ms, const dlock__lease *l,
                                const char *name, const char *holder,
                                const char *where);

/* A read hold's or permit's full take (mysql_sql.c says more), as a
 * template (MY_V_* markers: dlock__mysql_fill() makes it text): `permit`,
 * a permit's (N a marker) or a reader's; `join`, may it join the live
 * holds (0: only start on a free row); `prune`, drop the ended holds and
 * count only the live ones (a subquery: not on the uncontended path);
 * `gate` (NULL: none), the gate it lets go of once taken; `bare`, a try
 * that does not hold the gate (a row being handed over is not free). */
char *dlock__mysql_upsert_shared(const my_store *ms, int permit,
                                 const char *where, int woke, int join,
                                 int prune, const char *gate, int bare);

/* A reader's or permit's join, as a template (mysql_sql.c says more):
 * `permit`, a permit's (N a marker) or a reader's. */
char *dlock__mysql_join(const my_store *ms, int permit);

/* The release of a read hold or permit in either form, as a template
 * (mysql_sql.c says more). */
char *dlock__mysql_release_any(const my_store *ms);

/* Makes ms->tmpl[] (the prepared statements' templates): DLOCK_OK or
 * DLOCK_ENOMEM. */
int dlock__mysql_templates(my_store *ms);

/* What a full take's first assignment decided (its LAST_INSERT_ID until
 * the token's assignment; a busy one's is a MY_CODE_*). */
enum { MY_TOOK_FREE = 1001, MY_TOOK_SOLE = 1002, MY_TOOK_ENTRIES = 1003,
       MY_TOOK_MINE = 1004, MY_TOOK_MINE_ENTRY = 1005 };

/* The sole holder's owner column: '*' and the owner id, as a hex literal
 * (fresh; NULL: out of memory). */
char *dlock__mysql_sole_owner(const char *owner);

/* Creates the tables when missing, adds the columns a table of the
 * previous version lacks (ms->rw: whether it has them), and reads
 * DATABASE() into ms->dbname. */
int dlock__mysql_ensure_schema(my_store *ms, my_conn *cn, int64_t deadline);

/* mysql_hash.c: a read hold's or permit's own lock names as quoted
 * literals (fresh; NULL: out of memory), the same names as the SQL
 * expressions of dlock__mysql_gate_of() and dlock__mysql_hold_lock_of() */
char *dlock__mysql_gate_lit(const my_store *ms, const char *name, size_t len);
char *dlock__mysql_hold_lit(const my_store *ms, const char *name, size_t len,
                            const char *owner);

/* mysql_operate.c: the backend's inspect, list and evict slots (one
 * reading of a lock row for the three) */
dlock__inspect_slot dlock__mysql_inspect;
dlock__list_slot dlock__mysql_list;
dlock__evict_slot dlock__mysql_evict;

/* mysql_wait.c: acquire and waiting */

/* The backend's acquire slot: tries and, while l->deadline allows, waits
 * in the server. */
int dlock__mysql_acquire(void *st, dlock__lease *l, int64_t op_deadline);

/* mysql_rw.c: read holds and permits */

/* Release and renewal of a read hold or permit. */
int dlock__mysql_release_shared(my_store *ms, dlock__lease *l,
                                int64_t op_deadline);
int dlock__mysql_extend_shared(my_store *ms, dlock__lease *l, int64_t ttl_ms,
                               int64_t op_deadline);


/* The row's state as a waiter holding (or maybe holding) the gate sees it. */
typedef struct my_state {
    int gated;          /* our connection holds the gate */
    long long left_ms;  /* the row's lease left (+1), -1 none */
    long long code;     /* MY_CODE_*: free (NONE), held by whom */
    int live, locked;   /* live read holds / permits, those whose hold
                         * lock is held (their sessions alive) */
    long long unlocked_first_ms, unlocked_last_ms; /* their lease left */
    int nlk;            /* the locked ones: */
    char (*lk_owner)[81];
    long long *lk_ms;
} my_state;

/* Reads it on the lease's connection; free with dlock__mysql_state_free. */
int dlock__mysql_state(my_store *ms, dlock__lease *l, const char *name,
                       const char *gate, int64_t deadline, my_state *st);
void dlock__mysql_state_free(my_state *st);

/* A writer's look at a readers' row (holding the gate): its end set to
 * the latest live hold's, free when none is (a release keeps an upper
 * bound). A statement and "; ". */
char *dlock__mysql_settle(const my_store *ms, const char *name);

/* The drain round trip of a writer that holds the gate while readers
 * hold: a SELECT waiting on each live reader's hold lock in turn (until
 * the deadline `wait_ms` from now at most, @dlock_dl in µs), then
 * `upsert` (its answer is statement 2, 3 with `mid`: statements and "; "
 * after the SET of @dlock_dl, or ""). */
char *dlock__mysql_drain(const my_store *ms, const char *name,
                         int64_t wait_ms, const char *mid,
                         const char *upsert);

/* A semaphore's head, holding the gate with every permit held: waits on
 * the hold locks of st's locked holders at once (one pooled connection
 * each), until one is let go, `timer_ms` (the earliest lease end of a
 * holder without a session), or l->deadline. DLOCK_OK: woken (try
 * again); an error: the gate's connection failed. */
int dlock__mysql_head_wait(my_store *ms, dlock__lease *l, const char *name,
                           const my_state *st, int64_t timer_ms);

/* mysql_conn.c, for the head's helpers: a statement sent without waiting
 * for its answer. */
typedef struct my_async {
    my_conn *cn;
    int phase;   /* 0 query, 1 result, 2 done */
    int status;  /* what the library waits for (MYSQL_WAIT_*), 0 done */
    int failed;  /* the statement failed (or its connection) */
    MYSQL_RES *res;
} my_async;

/* Starts sql on a->cn. */
void dlock__mysql_async_start(my_async *a, const char *sql);

/* Goes on after poll() said `revents` for its socket. */
void dlock__mysql_async_step(my_async *a, short revents);

/* The poll() events the library waits for; -1 when done. */
short dlock__mysql_async_events(const my_async *a);


/* The store's table (store.h), named by module.c and, in a build with
 * the store built in, by the core's registry. */
extern const dlock__backend dlock__backend_mysql;

#endif /* DLOCK_MYSQL_INT_H */
