/* SPDX-License-Identifier: MIT */
/*
 * bench_pg.c -- dlock's PostgreSQL store beside the store's own statements
 * run by a bare libpq loop, measured in one run against the same server.
 *
 *   dlock_bench_pg URI [--quick]   (URI: postgres://user:pw@host:port/db)
 *
 * Prints Markdown. Floors, on one blocking libpq connection, statements
 * prepared once:
 *   round trip        a prepared SELECT 1 (hot, and after 2 ms idle)
 *   table floor       the store's acquire upsert and its release function
 *                     (dlock__pg_build_statements() in pg_sql.c and
 *                     schema_sql in pg_schema.c), on a table, queue
 *                     table and sequence of the floor's own; the
 *                     function is the store's
 *                     T_unlock, copied from the database under the
 *                     floor's names
 *   advisory floor    the store's pg_try_advisory_lock + nextval and its
 *                     pg_advisory_unlock, same key expression
 * Cycles run in chunks that alternate with their floor; a ratio is the
 * median of the chunks' ratios. The floor's statements are checked against
 * the text dlock's backend last ran (pg_stat_activity), and the release
 * function is copied from the store's (pg_proc), so that the floor cannot
 * drift from the store unnoticed.
 * Hand-off: two processes pass the lock back and forth; the time from the
 * holder's release call to the waiter's acquire returning, in idle round
 * trips (a SELECT 1 after 2 ms idle, as before every hand-off) and beside
 * two bare libpq processes doing what a hand-off needs at least (table:
 * the waiter's try queues it; the release function hands the lock over
 * and its NOTIFY, carrying the token, wakes the waiter blocked in poll()
 * on its LISTENing connection; no statement follows. advisory: the unlock
 * wakes a waiter blocked in pg_advisory_lock), in runs that alternate.
 * Transactions per hand-off: N processes contend; the database's
 * xact_commit + xact_rollback (pg_stat_database, read from another
 * database so that the reads do not count) before and after, with every
 * backend of the database gone at both ends (a backend flushes its counts
 * when it exits; before that they lag by up to 10 s), less the same for
 * the processes only connecting and closing.
 */
#include <dlock.h>
#include <libpq-fe.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

const char bench_prog[] = "bench_pg";

#define CHUNKS 15
#define H_CHUNKS 5            /* hand-off runs per mode (fresh processes) */
#define WAIT_MS 10000         /* a hand-off's acquire gives up after this */

/* The store's statements (pg_sql.c, dlock__pg_build_statements()), with the
 * floor's own table "bench_floor", queue "bench_floor_queue" and sequence
 * "bench_floor_tokens": same length as dlock_locks, so that the texts
 * compare byte for byte once the names are swapped. */
#define NOW "clock_timestamp()"
#define MS_LEFT(ts) "ceil(extract(epoch FROM " ts " - " NOW ") * 1000)::bigint"
#define KEY(x) "('x' || substr(md5(" x "), 1, 16))::bit(64)::bigint"
#define FLOOR_NAME "bench_floor"
#define STORE_NAME "dlock_locks"
#define T "\"" FLOOR_NAME "\""
#define W "\"" FLOOR_NAME "_waiters\""
#define UNLOCK "\"" FLOOR_NAME "_unlock\""
#define EARLIEST "\"" FLOOR_NAME "_earliest\""
#define NOW_MS "floor(extract(epoch FROM " NOW ") * 1000)::bigint"
#define S "'\"" FLOOR_NAME "_tokens\"'"
/* a listening session's advisory lock, and the release's probe of it */
#define SKEY(x)                                                             \
    "('x' || substr(md5(" x "), 1, 8))::bit(32)::int, ('x' || substr(md5("  \
    x "), 9, 8))::bit(32)::int"
#define ALIVE(w, me)                                                        \
    "(CASE WHEN " w ".pid = pg_backend_pid() THEN " w ".client = " me       \
    " ELSE NOT pg_try_advisory_xact_lock_shared(" SKEY(                     \
        w ".client || ':' || " w ".pid") ") END)"

#define ENDED "t.lock_until <= " NOW
#define KEEP_OR(col, new_)                                                  \
    col " = CASE WHEN " ENDED " THEN " new_ " ELSE t." col " END"
#define UPSERT_SET                                                          \
    " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, "            \
    KEEP_OR("holder", "excluded.holder") ", holds = 1, "                    \
    KEEP_OR("token", "nextval(" S ")") ", "                                 \
    KEEP_OR("locked_at", "excluded.locked_at") ", lock_until = CASE WHEN "  \
    ENDED " THEN excluded.lock_until ELSE greatest(t.lock_until, "          \
    "excluded.lock_until) END WHERE (" ENDED ") OR t.owner = "              \
    "excluded.owner"
/* $1 name, $2 owner, $3 ttl ms, $4 holder; a waiter: $5 client id, $6
 * waiter number, $7 and $8 its listening session (pid, backend_start) */
#define SEMAPHORE_LIVE "owner = '*' AND permits > 0 AND lock_until > " NOW
#define SQL_ACQUIRE                                                         \
    "WITH ins AS (INSERT INTO " T " AS t (name, owner, holder, holds, "     \
    "token, locked_at, lock_until) VALUES ($1, $2, $4, 1, nextval(" S       \
    "), " NOW ", " NOW " + $3 * interval '1 millisecond')" UPSERT_SET       \
    " RETURNING token), "                                                   \
    "del AS (DELETE FROM " W " WHERE name = $1 AND client = $5 AND waiter " \
    "= $6 AND EXISTS (SELECT 1 FROM ins)), "                                \
    "enq AS (INSERT INTO " W " (name, client, waiter, owner, holder, "      \
    "ttl_ms, pid, since) SELECT $1, $5, $6, $2, $4, $3, $7, "               \
    "$8::timestamptz WHERE $5 IS NOT NULL AND NOT EXISTS (SELECT 1 FROM "   \
    "ins) AND NOT EXISTS (SELECT 1 FROM " W " WHERE name = $1 AND client "  \
    "= $5 AND waiter = $6 AND pid = $7) AND NOT EXISTS (SELECT 1 FROM " T   \
    " WHERE name = $1 AND " SEMAPHORE_LIVE ") RETURNING seq) "              \
    "SELECT (SELECT token FROM ins), r.l, (SELECT seq FROM enq), r.n FROM " \
    "(SELECT 1) o LEFT JOIN LATERAL (SELECT CASE WHEN owner = '*' THEN "    \
    EARLIEST "(holders, " NOW_MS ") - " NOW_MS " ELSE " MS_LEFT("lock_until") \
    " END AS l, CASE WHEN " SEMAPHORE_LIVE " THEN permits END AS n FROM " T \
    " WHERE name = $1) r ON true"
/* $1 name, $2 owner, $3 token: hands the lock to the queue's oldest live
 * waiters (every reader at the head, or the writer, or one waiter per
 * permit freed) and notifies each one's client, or frees the row. The
 * floor's function is the store's T_unlock, copied from the database
 * (floor_open()) under the floor's names */
#define SQL_RELEASE "SELECT ok, grants FROM " UNLOCK "($1, $2, $3)"
#define SQL_ADV_TRY                                                         \
    "WITH l AS (SELECT pg_try_advisory_lock(" KEY("$1") ") AS ok), n AS "   \
    "(SELECT CASE WHEN ok THEN nextval(" S ") END AS t FROM l) SELECT t, "  \
    "CASE WHEN t IS NOT NULL THEN set_config('application_name', 'dlock ' " \
    "|| t || ' ' || $2, false) END FROM n"
#define SQL_ADV_UNLOCK                                                      \
    "SELECT pg_advisory_unlock(" KEY("$1") "), set_config("                 \
    "'application_name', 'dlock', false)"
/* ensure_schema()'s DDL (the tables and their index), for the floor's
 * names; the release function is the store's (floor_open()) */
#define SQL_SCHEMA                                                          \
    "DROP FUNCTION IF EXISTS \"" FLOOR_NAME "_release\"(bytea, text, "       \
    "bigint); "                                                             \
    "DROP FUNCTION IF EXISTS " UNLOCK "(bytea, text, bigint); "             \
    "DROP FUNCTION IF EXISTS " EARLIEST "(jsonb, bigint); "                 \
    "DROP TABLE IF EXISTS " T ", " W "; "                                   \
    "DROP SEQUENCE IF EXISTS \"" FLOOR_NAME "_tokens\"; "                   \
    "CREATE SEQUENCE \"" FLOOR_NAME "_tokens\"; "                           \
    "CREATE TABLE " T " (name bytea PRIMARY KEY, owner text, holder text, " \
    "holds integer NOT NULL DEFAULT 0, token bigint NOT NULL DEFAULT 0, "   \
    "locked_at timestamptz NOT NULL DEFAULT " NOW ", lock_until "           \
    "timestamptz NOT NULL DEFAULT " NOW ", holders jsonb, permits integer " \
    "NOT NULL DEFAULT 0); "                                                 \
    "CREATE TABLE " W " (seq bigserial PRIMARY KEY, name bytea NOT NULL, "  \
    "client text NOT NULL, waiter bigint NOT NULL, owner text NOT NULL, "   \
    "holder text, ttl_ms bigint NOT NULL, pid integer NOT NULL, since "     \
    "timestamptz, kind smallint NOT NULL DEFAULT 0, permits integer NOT "   \
    "NULL DEFAULT 0); "                                                     \
    "CREATE INDEX \"" FLOOR_NAME "_waiters_name\" ON " W " (name, seq)"

/* Parameter types as the store declares them: bytea, text, int8. */
#define T_BYTEA 17
#define T_TEXT 25
#define T_INT8 20
#define T_INT4 23

static int quick;
static const char *uri;
static char adv_uri[1200];
static char conninfo[1200]; /* the URI without parameters: libpq would
                             * refuse dlock's */
static char shown[1200];    /* the URI without its password */
static char dbname[256];

static const dlock_client_options copts = {10000}; /* a busy machine is
                                                   * no failure */

/* ------------------------------------------------------------------------ */
/* The bare client                                                          */
/* ------------------------------------------------------------------------ */

/* A blocking connection; `db` (if set) replaces the URI's database. */
static PGconn *connect_pg(const char *db)
{
    const char *keys[] = {"dbname", "dbname", "application_name", NULL};
    const char *vals[] = {conninfo, db, "dlock-bench", NULL};
    PGconn *pg = PQconnectdbParams(keys, vals, 1);

    if (!pg || PQstatus(pg) != CONNECTION_OK)
        die("connecting", pg ? PQerrorMessage(pg) : "out of memory");
    return pg;
}

static void exec_ok(PGconn *pg, const char *sql)
{
    PGresult *r = PQexec(pg, sql);
    ExecStatusType st = PQresultStatus(r);

    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        die(sql, PQerrorMessage(pg));
    PQclear(r);
}

static long long query_ll(PGconn *pg, const char *sql, const char *param)
{
    PGresult *r = PQexecParams(pg, sql, param ? 1 : 0, NULL, &param, NULL,
                               NULL, 0);

    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        die(sql, PQerrorMessage(pg));
    long long v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    PQclear(r);
    return v;
}

static void prepare(PGconn *pg, const char *name, const char *sql, int n,
                    const Oid *types)
{
    PGresult *r = PQprepare(pg, name, sql, n, types);

    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        die(name, PQerrorMessage(pg));
    PQclear(r);
}

typedef struct floor_pg {
    PGconn *pg;
    char owner[64], holder[128], ttl[8], token[24];
    /* as a waiter: its client id (channel dlock_CLIENT), its wait's
     * number, its session (pid, backend_start) */
    char client[40], waiter[24], pid[16], since[48];
    unsigned long long waits;
} floor_pg;

/* The advisory wait without what the store adds around it (as text:
 * SET LOCAL lock_timeout, a set_config naming the waiter), prepared: the
 * least a waiter inside the server costs. */
#define SQL_ADV_WAIT                                                        \
    "WITH l AS (SELECT pg_advisory_lock(" KEY("$1") ")), n AS (SELECT "     \
    "nextval(" S ") AS t FROM l) SELECT t, set_config('application_name', " \
    "'dlock ' || t || ' ' || $2, false) FROM n"

/* A floor connection with every statement prepared; values shaped like
 * dlock's (a 32-hex client id and a thread id), the owner this process's. */
static void floor_connect(floor_pg *f)
{
    static const Oid acq[] = {T_BYTEA, T_TEXT, T_INT8, T_TEXT,
                              T_TEXT,  T_INT8, T_INT4, T_TEXT};
    static const Oid rel[] = {T_BYTEA, T_TEXT, T_INT8};
    static const Oid atry[] = {T_BYTEA, T_TEXT};
    static const Oid aunl[] = {T_BYTEA};
    char host[64] = "localhost";

    f->pg = connect_pg(NULL);
    exec_ok(f->pg, "SET client_min_messages = warning");
    /* a floor waiter never blocks forever (the store: the caller's wait) */
    exec_ok(f->pg, "SET lock_timeout = 10000");
    /* generic plans only, as the store's sessions (pg_conn.c) */
    exec_ok(f->pg, "SET plan_cache_mode = force_generic_plan");
    prepare(f->pg, "rtt", "SELECT 1", 0, NULL);
    prepare(f->pg, "acq", SQL_ACQUIRE, 8, acq);
    prepare(f->pg, "rel", SQL_RELEASE, 3, rel);
    prepare(f->pg, "atry", SQL_ADV_TRY, 2, atry);
    prepare(f->pg, "await", SQL_ADV_WAIT, 2, atry);
    prepare(f->pg, "aunl", SQL_ADV_UNLOCK, 1, aunl);
    gethostname(host, sizeof(host) - 1);
    snprintf(f->owner, sizeof(f->owner),
             "0123456789abcdef0123456789abcdef:%ld", (long)getpid());
    snprintf(f->holder, sizeof(f->holder), "%.64s pid %ld tid %ld", host,
             (long)getpid(), (long)getpid());
    snprintf(f->ttl, sizeof(f->ttl), "30000");
    snprintf(f->client, sizeof(f->client), "%032lx", (long)getpid());
}

/* Makes the floor's copy of one of the store's functions (made by the
 * store's client, opened first): its body under the floor's names
 * (FLOOR_NAME and STORE_NAME have the same length). */
static void copy_function(PGconn *pg, const char *suffix, const char *head)
{
    char look[256];
    size_t fl = strlen(FLOOR_NAME);

    snprintf(look, sizeof(look),
             "SELECT prosrc FROM pg_proc WHERE proname = '" STORE_NAME "%s'",
             suffix);
    PGresult *r = PQexec(pg, look);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        die("the store's functions", PQerrorMessage(pg));
    const char *body = PQgetvalue(r, 0, 0);
    size_t n = strlen(body) + strlen(head) + 64;
    char *sql = malloc(n);
    if (!sql || strstr(body, "$floor$"))
        die("the store's functions", "cannot copy them");
    snprintf(sql, n, "%s $floor$%s$floor$", head, body);
    for (char *p = sql; (p = strstr(p, STORE_NAME)) != NULL; p += fl)
        memcpy(p, FLOOR_NAME, fl);
    PQclear(r);
    exec_ok(pg, sql);
    free(sql);
}

/* The floor's tables, and its functions: the store's T_unlock (the
 * release) and T_earliest (a busy writer's timer beside readers). */
static void floor_open(floor_pg *f)
{
    PGconn *pg = connect_pg(NULL);

    exec_ok(pg, "SET client_min_messages = warning");
    exec_ok(pg, SQL_SCHEMA);
    copy_function(pg, "_unlock",
                  "CREATE FUNCTION " UNLOCK "(n bytea, o text, tok bigint, "
                  "OUT ok boolean, OUT grants text) LANGUAGE plpgsql AS");
    copy_function(pg, "_earliest",
                  "CREATE FUNCTION " EARLIEST "(h jsonb, ms bigint) RETURNS "
                  "bigint LANGUAGE sql IMMUTABLE AS");
    PQfinish(pg);
    floor_connect(f);
}

/* Runs prepared statement `name`; the first parameter (the lock name) in
 * binary, as the store sends it. */
static PGresult *floor_run(floor_pg *f, const char *name, int n,
                           const char *const *vals)
{
    static const char lock[] = "bench-floor"; /* dlock's: "bench-cycle" */
    const char *v[8] = {lock};
    int lens[8] = {(int)sizeof(lock) - 1};
    int fmts[8] = {1};

    for (int i = 1; i < n; i++)
        v[i] = vals[i - 1];
    PGresult *r = PQexecPrepared(f->pg, name, n, v, lens, fmts, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
        die(name, PQerrorMessage(f->pg));
    return r;
}

/* floor_run(), then dies (what: why) unless its one value is true. */
static void floor_run_true(floor_pg *f, const char *name, int n,
                           const char *const *vals, const char *what,
                           const char *why)
{
    PGresult *r = floor_run(f, name, n, vals);

    if (strcmp(PQgetvalue(r, 0, 0), "t") != 0)
        die(what, why);
    PQclear(r);
}

static void floor_rtt(void *arg)
{
    floor_pg *f = arg;
    PGresult *r = PQexecPrepared(f->pg, "rtt", 0, NULL, NULL, NULL, 0);

    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        die("SELECT 1", PQerrorMessage(f->pg));
    PQclear(r);
}

/* The upsert: 1 taken (token kept), 0 busy (and, for a waiter, queued
 * as wait number f->waiter of client f->client). */
static int floor_table_try(floor_pg *f, int wait)
{
    const char *acq[7] = {f->owner, f->ttl, f->holder,
                          wait ? f->client : NULL, f->waiter,
                          wait ? f->pid : NULL, wait ? f->since : NULL};
    PGresult *r = floor_run(f, "acq", 8, acq);
    int taken = !PQgetisnull(r, 0, 0);

    if (taken)
        snprintf(f->token, sizeof(f->token), "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return taken;
}

/* The release function: hands the lock to the oldest live waiters (and
 * notifies them) or frees the row. */
static void floor_table_release(floor_pg *f)
{
    const char *rel[2] = {f->owner, f->token};

    floor_run_true(f, "rel", 3, rel, "floor release",
                   "the lock was not the floor's");
}

static void floor_table_cycle(void *arg)
{
    floor_pg *f = arg;

    snprintf(f->waiter, sizeof(f->waiter), "%llu", ++f->waits);
    if (!floor_table_try(f, 0))
        die("floor acquire", "the floor's lock was not free");
    floor_table_release(f);
}

static void floor_adv_release(floor_pg *f)
{
    floor_run_true(f, "aunl", 1, NULL, "floor advisory",
                   "unlock found no lock");
}

static void floor_adv_cycle(void *arg)
{
    floor_pg *f = arg;
    const char *try[1] = {f->holder};
    PGresult *r = floor_run(f, "atry", 2, try);

    if (PQgetisnull(r, 0, 0))
        die("floor advisory", "the floor's lock was not free");
    PQclear(r);
    floor_adv_release(f);
}

/* The grant of wait f->waiter among the notifications read so far: 1
 * (its token kept), else 0; the others are dropped. */
static int floor_granted(floor_pg *f)
{
    PGnotify *nt;
    int got = 0;

    while ((nt = PQnotifies(f->pg)) != NULL) {
        unsigned long long w, t;
        if (sscanf(nt->extra, "g %llu %llu", &w, &t) == 2 &&
            w == f->waits) {
            snprintf(f->token, sizeof(f->token), "%llu", t);
            got = 1;
        }
        PQfreemem(nt);
    }
    return got;
}

/* The hand-off floor's waiter, on the one connection that LISTENs on its
 * client's channel: one try, which queues it when the lock is busy; then
 * blocked in poll() until the release's notification names its wait and
 * brings the token: the lock is its own, no statement follows. */
static void floor_table_wait(floor_pg *f)
{
    int64_t end = now_ns() + (int64_t)WAIT_MS * 1000000;

    snprintf(f->waiter, sizeof(f->waiter), "%llu", ++f->waits);
    if (floor_table_try(f, 1))
        return;
    while (!floor_granted(f)) {
        struct pollfd p = {PQsocket(f->pg), POLLIN, 0};
        if (now_ns() > end)
            die("floor hand-off", "no grant in time");
        if (poll(&p, 1, 100) < 0 && errno != EINTR)
            die("poll", strerror(errno));
        if (!PQconsumeInput(f->pg))
            die("floor hand-off", PQerrorMessage(f->pg));
    }
}

static void floor_adv_wait(floor_pg *f)
{
    const char *v[1] = {f->holder};

    PQclear(floor_run(f, "await", 2, v)); /* the server wakes us */
}

/* ------------------------------------------------------------------------ */
/* dlock                                                                    */
/* ------------------------------------------------------------------------ */

/*
 * The text the store's backend ran last (its only client backend besides
 * ours) against the floor's `sql` with the store's names: 1 same, 0 not,
 * -1 other clients are connected. pg_stat_activity keeps
 * track_activity_query_size - 1 bytes of it.
 */
static int same_as_store(floor_pg *f, const char *sql)
{
    size_t n = strlen(sql), fl = strlen(FLOOR_NAME);
    char *want = malloc(n + 1);
    PGresult *r = NULL;
    int same = -1;

    /* a client closed just before may take a moment to go */
    for (int i = 0; i < 100; i++) {
        PQclear(r);
        r = PQexec(f->pg, "SELECT query FROM pg_stat_activity WHERE datname "
                          "= current_database() AND pid <> pg_backend_pid() "
                          "AND backend_type = 'client backend'");
        if (PQresultStatus(r) != PGRES_TUPLES_OK || !want)
            die("pg_stat_activity", PQerrorMessage(f->pg));
        if (PQntuples(r) == 1)
            break;
        sleep_us(10000);
    }
    memcpy(want, sql, n + 1);
    for (char *p = want; (p = strstr(p, FLOOR_NAME)) != NULL; p += fl)
        memcpy(p, STORE_NAME, fl);
    if (PQntuples(r) == 1) {
        const char *got = PQgetvalue(r, 0, 0);
        size_t g = strlen(got);
        same = g > 0 && (g == n || (g >= 1000 && g < n)) &&
               !strncmp(got, want, g);
        if (!same)
            fprintf(stderr, "bench_pg: the store ran\n  %s\nthe floor "
                            "runs\n  %s\n",
                    got, want);
    }
    free(want);
    PQclear(r);
    return same;
}

/* Whether dlock's acquire and release (on lock l) sent the floor's two
 * statements: 1, 0, or -1 (not known). */
static int check_statements(floor_pg *f, dlock *l, const char *acq,
                            const char *rel)
{
    if (dlock_acquire(l, 0) != DLOCK_OK)
        die("check", dlock_errmsg());
    int a = same_as_store(f, acq);
    if (dlock_release(l) != DLOCK_OK)
        die("check", dlock_errmsg());
    int r = same_as_store(f, rel);
    return a < 0 || r < 0 ? -1 : a && r;
}

/* The cycles' floors for run_cycles(): a new floor connection per chunk. */
static void *floor_new(void *arg)
{
    floor_pg *f = malloc(sizeof(*f));

    (void)arg;
    if (!f)
        die("floor", "out of memory");
    floor_connect(f);
    return f;
}

static void floor_free(void *f)
{
    PQfinish(((floor_pg *)f)->pg);
    free(f);
}

static const floor_ops table_floor = {floor_new, floor_table_cycle,
                                      floor_rtt, floor_free, NULL};
static const floor_ops adv_floor = {floor_new, floor_adv_cycle, floor_rtt,
                                    floor_free, NULL};

/* ------------------------------------------------------------------------ */
/* Hand-off between two processes                                           */
/* ------------------------------------------------------------------------ */

/* What passes the lock: dlock in one of its modes, or a floor. */
enum { H_TABLE, H_FAIR, H_ADV, H_FLOOR_TABLE, H_FLOOR_ADV, H_KINDS };

typedef struct party {
    int kind;
    void *d; /* dlock's side (dlock_party_ops) */
    floor_pg f;
} party;

static const dlock_party dlock_kind[3] = {
    {NULL, &copts, 0, 0, WAIT_MS},
    {NULL, &copts, DLOCK_FAIR, 0, WAIT_MS},
    {NULL, &copts, 0, 0, WAIT_MS},
};

static void *party_open(void *arg, int me)
{
    party *p = calloc(1, sizeof(*p));

    if (!p)
        die("handoff", "out of memory");
    p->kind = (int)(intptr_t)arg;
    if (p->kind == H_FLOOR_TABLE || p->kind == H_FLOOR_ADV) {
        floor_connect(&p->f);
        /* both processes, as dlock's listeners stay after a wait; the
         * session holds its advisory lock while it listens (the release's
         * test that it is alive); its pid and start go into its entries */
        if (p->kind == H_FLOOR_TABLE) {
            char sql[400];
            snprintf(sql, sizeof(sql),
                     "LISTEN dlock_%s; SELECT pg_try_advisory_lock(" SKEY(
                         "'%s:' || pg_backend_pid()") ")",
                     p->f.client, p->f.client, p->f.client);
            exec_ok(p->f.pg, sql);
            PGresult *r = PQexec(p->f.pg, "SELECT pid, backend_start FROM "
                                          "pg_stat_get_activity("
                                          "pg_backend_pid())");
            if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1)
                die("floor session", PQerrorMessage(p->f.pg));
            snprintf(p->f.pid, sizeof(p->f.pid), "%s", PQgetvalue(r, 0, 0));
            snprintf(p->f.since, sizeof(p->f.since), "%s",
                     PQgetvalue(r, 0, 1));
            PQclear(r);
        }
        return p;
    }
    dlock_party d = dlock_kind[p->kind];
    d.uri = p->kind == H_ADV ? adv_uri : uri;
    p->d = dlock_party_ops.open(&d, me); /* after fork */
    return p;
}

static void party_acquire(void *side)
{
    party *p = side;

    if (p->kind == H_FLOOR_TABLE)
        floor_table_wait(&p->f);
    else if (p->kind == H_FLOOR_ADV)
        floor_adv_wait(&p->f);
    else
        dlock_party_ops.acquire(p->d);
}

static void party_release(void *side)
{
    party *p = side;

    if (p->kind == H_FLOOR_TABLE)
        floor_table_release(&p->f);
    else if (p->kind == H_FLOOR_ADV)
        floor_adv_release(&p->f);
    else
        dlock_party_ops.release(p->d);
}

static void party_close(void *side, int holding)
{
    party *p = side;

    if (p->d) {
        dlock_party_ops.close(p->d, holding);
    } else {
        if (holding)
            party_release(p);
        PQfinish(p->f.pg);
    }
    free(p);
}

/* n hand-offs of `kind` measured (the holder lets go 2 ms after the
 * other began to wait; in the two warm-ups 50 ms, long enough for a cold
 * first try and the store's first LISTEN connection); appended to
 * out[*k...]; the p50 of this run. */
static double handoff(int kind, int n, int64_t *out, int *k)
{
    party_ops ops = {party_open, party_acquire, party_release, party_close,
                     (void *)(intptr_t)kind};
    handoff_cfg cfg = {&ops, 2000, 2000, 50000};
    double p50 = handoff_run(&cfg, n, out + *k).p50_us;

    *k += n;
    return p50;
}

/* --- transactions per hand-off --- */

/* Waits until no client backend is connected to the database (their
 * counts are flushed when they exit); 0 if some still are after 10 s. */
static int backends_gone(PGconn *mon)
{
    for (int i = 0; i < 200; i++) {
        if (query_ll(mon, "SELECT count(*) FROM pg_stat_activity WHERE "
                          "datname = $1 AND backend_type = 'client "
                          "backend'",
                     dbname) == 0)
            return 1;
        sleep_us(50000);
    }
    return 0;
}

static long long xacts(PGconn *mon)
{
    return query_ll(mon, "SELECT xact_commit + xact_rollback FROM "
                         "pg_stat_database WHERE datname = $1",
                    dbname);
}

typedef struct per_handoff {
    double xacts, acqs, per_s;
    long handoffs;
    int exact; /* every backend was gone before and after */
} per_handoff;

/* One contention run of nproc processes until `target` hand-offs (0: the
 * processes only connect and close); the database's transactions during
 * it, from before the first connects to after the last backend has gone. */
static long long contention(PGconn *mon, const char *u, unsigned flags,
                            int nproc, long target, per_handoff *r)
{
    /* 3 s: room for the first wait's LISTEN login, N at once */
    contend_cfg cfg = {u, &copts, flags, nproc, target, 0, target == 0,
                       3000, 0, 0, quick ? 4000 : 6000};

    r->exact = backends_gone(mon);
    long long x0 = xacts(mon);
    contend *s = contend_start(&cfg);
    contend_go(s);
    contend_result cr = contend_finish(s);
    r->exact &= backends_gone(mon);
    long long x1 = xacts(mon);
    r->handoffs = cr.handoffs;
    r->acqs = r->handoffs ? (double)cr.acquisitions / (double)r->handoffs
                          : 0;
    r->per_s = cr.per_s;
    return x1 - x0;
}

/* Transactions per hand-off, the processes' connect and close (a run
 * without the race) subtracted. */
static per_handoff xacts_per_handoff(PGconn *mon, const char *u,
                                     unsigned flags, int nproc, long target)
{
    per_handoff setup, r;
    long long base = contention(mon, u, flags, nproc, 0, &setup);
    long long all = contention(mon, u, flags, nproc, target, &r);

    r.exact &= setup.exact;
    r.xacts = r.handoffs ? (double)(all - base) / (double)r.handoffs : 0;
    return r;
}

/* ------------------------------------------------------------------------ */

/* URI forms: dlock's, libpq's (no dlock parameters), shown (no password). */
static void parse_uri(void)
{
    const char *q = strchr(uri, '?');
    const char *at = strrchr(uri, '@');
    const char *scheme = strstr(uri, "://");

    snprintf(adv_uri, sizeof(adv_uri), "%s%smode=advisory", uri,
             q ? "&" : "?");
    snprintf(conninfo, sizeof(conninfo), "%.*s",
             (int)(q ? q - uri : (long)strlen(uri)), uri);
    if (!scheme || (strncmp(uri, "postgres://", 11) &&
                    strncmp(uri, "postgresql://", 13)))
        die(uri, "expected postgres://[user:password@]host:port/db");
    const char *colon = at ? memchr(scheme + 3, ':', (size_t)(at - scheme - 3))
                           : NULL;
    if (colon)
        snprintf(shown, sizeof(shown), "%.*s%s", (int)(colon - uri), uri, at);
    else
        snprintf(shown, sizeof(shown), "%s", conninfo);
}

/* One hand-off row: dlock's runs (hs) beside the floor's (fl), with
 * the per-run ratios (rv). */
static void handoff_row(const char *mode, int64_t *hs, int n, int64_t *fl,
                        double *rv, double *di, double *fi, double idle,
                        double hot, const char *goal)
{
    stats h = summarize(hs, n), f = summarize(fl, n);
    spread r = medrange(rv, H_CHUNKS), d = medrange(di, H_CHUNKS),
           fr = medrange(fi, H_CHUNKS);

    printf("| %s | %.1f (%.2f idle RTT) | %.1f / %.1f | **%.2fx** (runs: "
           "%.2f–%.2f) | **%.2f idle RTT** (runs: %.2f–%.2f) / %.1f; %.1f "
           "hot RTT | %s |\n",
           mode, f.p50_us, fr.med, h.p50_us, h.p99_us, r.med, r.min, r.max,
           d.med, d.min, d.max, h.p99_us / idle, h.p50_us / hot, goal);
}

int main(int argc, char **argv)
{
    uri = h_args(argc, argv, "URI", &quick);
    parse_uri();
    signal(SIGPIPE, SIG_IGN);

    int n = quick ? 1500 : 6000;     /* cycles of each kind */
    int nh = quick ? 20 : 60;        /* hand-offs per run, H_CHUNKS runs */
    long target = quick ? 150 : 400; /* hand-offs per contention run */

    printf("## PostgreSQL (%s)\n\n", shown);
    /* the store's client first: it makes the store's schema, whose
     * release function the floor copies */
    dlock_client *c = h_section_client(uri, &copts);
    floor_pg f;
    floor_open(&f);
    snprintf(dbname, sizeof(dbname), "%s", PQdb(f.pg));
    char version[64];
    snprintf(version, sizeof(version), "%s",
             PQparameterStatus(f.pg, "server_version"));

    /* the floors must be the statements the store sends: each client's
     * statements are compared while it is the only other backend */
    dlock *l = h_open_lock(c, "bench-cycle", 0, 0);
    int same_table = check_statements(&f, l, SQL_ACQUIRE, SQL_RELEASE);
    dlock_close(l);
    dlock_client_close(c);
    dlock_client *ac = h_open_client(adv_uri, &copts);
    dlock *al = h_open_lock(ac, "bench-cycle", 0, 0);
    int same_adv = check_statements(&f, al, SQL_ADV_TRY, SQL_ADV_UNLOCK);
    dlock_close(al);
    dlock_client_close(ac);

    cycles tc = run_cycles(&table_floor, uri, &copts, n, CHUNKS, 1);
    cycles acyc = run_cycles(&adv_floor, adv_uri, &copts, n, CHUNKS, 0);
    double rtt = tc.rtt.med;

    printf("PostgreSQL %s. Latency in microseconds. Floors: one blocking "
           "libpq connection, statements prepared once; the cycle floors "
           "are the store's own two statements (checked against the text "
           "dlock's backend ran: %s) on a table, queue table and sequence "
           "of the floor's own, the release function the store's, copied "
           "under the floor's names. Cycles: %d of each, in %d chunks "
           "alternating with the floor (the round trip in the same "
           "chunks), each on a new floor connection and a new dlock client "
           "(on which core the server runs a session's backend changes "
           "its figures by up to 20%% here); a p50 is the median of the "
           "chunks' medians, a p99 is over all cycles, a ratio is the "
           "median of the chunks' ratios (with their spread).\n\n",
           version,
           same_table < 0 || same_adv < 0
               ? "not checked, other clients were connected"
           : same_table && same_adv ? "the same"
                                    : "**they differ**",
           (n / CHUNKS) * CHUNKS, CHUNKS);
    printf("| measure | floor | dlock | ratio |\n|---|---|---|---|\n");
    printf("| round trip (prepared `SELECT 1`), p50 | %.1f (chunks: "
           "%.1f–%.1f) | | |\n",
           rtt, tc.rtt.min, tc.rtt.max);
    h_cycle_rows("table mode: ", "the upsert + the release function", &tc,
                 "1.2x", rtt);
    h_cycle_rows("advisory mode: ",
                 "`pg_try_advisory_lock` + `nextval`, `pg_advisory_unlock`",
                 &acyc, NULL, 0);
    fflush(stdout);

    /* hand-offs: runs of each kind, the floors' too, alternate */
    int64_t *hs[H_KINDS], *idle = malloc(sizeof(int64_t) * (size_t)nh);
    double hp[H_KINDS][H_CHUNKS], rv[3][H_CHUNKS], ri[H_KINDS][H_CHUNKS];
    int hk[H_KINDS] = {0};
    for (int m = 0; m < H_KINDS; m++) {
        hs[m] = malloc(sizeof(int64_t) * (size_t)nh * H_CHUNKS);
        if (!hs[m] || !idle)
            die("handoff", "out of memory");
    }
    double iv[H_CHUNKS];
    PQfinish(f.pg); /* no backend of ours in the database from here on */
    for (int k = 0; k < H_CHUNKS; k++) {
        floor_pg fr;
        floor_connect(&fr); /* a new one per run, as for the cycles */
        for (int i = 0; i < nh; i++) {
            sleep_us(2000);
            int64_t t0 = now_ns();
            floor_rtt(&fr);
            idle[i] = now_ns() - t0;
        }
        PQfinish(fr.pg);
        iv[k] = summarize(idle, nh).p50_us;
        for (int m = 0; m < H_KINDS; m++)
            hp[m][k] = handoff(m, nh, hs[m], &hk[m]);
        rv[0][k] = hp[H_TABLE][k] / hp[H_FLOOR_TABLE][k];
        rv[1][k] = hp[H_FAIR][k] / hp[H_FLOOR_TABLE][k];
        rv[2][k] = hp[H_ADV][k] / hp[H_FLOOR_ADV][k];
        for (int m = 0; m < H_KINDS; m++)
            ri[m][k] = hp[m][k] / iv[k];
    }
    spread idle_rtt = medrange(iv, H_CHUNKS);
    printf("\n### PostgreSQL hand-off\n\n");
    printf("Two processes pass one lock back and forth (%d hand-offs of "
           "each kind, in %d runs of fresh processes that alternate with "
           "the floors'); the time from the holder's `dlock_release()` "
           "call to the waiting process's `dlock_acquire()` returning, "
           "p50 / p99. Floors, from bare libpq processes on one connection "
           "each, what a hand-off needs at least: *table*: the waiter's "
           "one try (the upsert above) queues it, then it sleeps in "
           "`poll()` on its connection, which `LISTEN`s on its client's "
           "channel; the holder's one release statement (the store's "
           "release function, copied above: it hands the lock to the "
           "queue's oldest live waiter and `pg_notify`s that waiter's "
           "client) wakes it, and the notification carries the token: no "
           "statement follows; *advisory*: `pg_advisory_unlock` wakes the "
           "waiter's prepared `pg_advisory_lock` + `nextval`. Round trips: "
           "a prepared `SELECT 1` after 2 ms idle, as before every "
           "hand-off (*idle RTT*, measured before each run: %.1f µs, runs "
           "%.1f–%.1f; a figure in idle RTT is the median of the runs' "
           "ratios), and the hot round trip above (%.1f µs).\n\n",
           nh * H_CHUNKS, H_CHUNKS, idle_rtt.med, idle_rtt.min,
           idle_rtt.max, rtt);
    printf("| mode | floor, p50 | dlock, p50 / p99 | ratio to the floor | "
           "dlock in round trips: p50 / p99 idle RTT; p50 hot RTT | goal "
           "|\n|---|---|---|---|---|---|\n");
    handoff_row("table (the release hands over, NOTIFY wakes the waiter)",
                hs[H_TABLE], hk[H_TABLE], hs[H_FLOOR_TABLE], rv[0],
                ri[H_TABLE], ri[H_FLOOR_TABLE], idle_rtt.med, rtt,
                "≤ 5 idle RTT");
    handoff_row("table, fair", hs[H_FAIR], hk[H_FAIR], hs[H_FLOOR_TABLE],
                rv[1], ri[H_FAIR], ri[H_FLOOR_TABLE], idle_rtt.med, rtt,
                "≤ 5 idle RTT");
    handoff_row("advisory (the server wakes `pg_advisory_lock`)", hs[H_ADV],
                hk[H_ADV], hs[H_FLOOR_ADV], rv[2], ri[H_ADV],
                ri[H_FLOOR_ADV], idle_rtt.med, rtt, "");
    printf("\nIn table mode dlock's hand-off includes the woken waiter's "
           "read of the row (one read-only statement: no transaction id, "
           "no WAL), which the floor leaves out: `NOTIFY` checks no "
           "privilege, so any role that can connect can send the "
           "notification, which only wakes the waiter; it returns when "
           "the row names it the holder (docs/design.md, \"PostgreSQL "
           "table mode: hand-over\"). What would get past that round "
           "trip: trusting a notification by its sender, the backend pid "
           "PostgreSQL gives it, once a look found that backend's role "
           "may write the lock table (it could break the lock anyway); "
           "but a pid is reused by later sessions of any role, so such a "
           "trust would need a way to see that the backend it was given "
           "to has not ended.\n");
    for (int m = 0; m < H_KINDS; m++)
        free(hs[m]);
    free(idle);
    fflush(stdout);

    /* transactions per hand-off, read from another database */
    PGconn *mon = connect_pg(strcmp(dbname, "template1") ? "template1"
                                                         : "postgres");
    static const char *const mode_name[3] = {"default", "fair", "advisory"};
    const char *hu[3] = {uri, uri, adv_uri};
    unsigned hf[3] = {0, DLOCK_FAIR, 0};
    int np[] = {2, 8, 32};
    int nnp = quick ? 2 : 3;
    per_handoff res[3][3];
    int exact = 1;
    for (int i = 0; i < nnp; i++)
        for (int m = 0; m < 3; m++) {
            res[m][i] = xacts_per_handoff(mon, hu[m], hf[m], np[i], target);
            exact &= res[m][i].exact;
        }
    PQfinish(mon);
    printf("\n### PostgreSQL transactions per hand-off\n\n");
    printf("N processes contend for one lock (each: acquire with a wait of "
           "at most 3 s, release at once, repeat) until %ld hand-offs "
           "between different processes. *Transactions*: the database's "
           "`xact_commit + xact_rollback` (pg_stat_database, read from "
           "another database) from before the processes connect to after "
           "every backend has gone, less the same count for the processes "
           "only started (one by one) and stopped; per hand-off. It "
           "includes each process's first `LISTEN` and the transaction in "
           "which every `LISTEN`ing backend reads each NOTIFY (PostgreSQL "
           "signals every listener of the database, whatever the channel): "
           "about one per waiting process per release in table mode, where "
           "the release hands the lock over (both modes) and no waiter "
           "re-tries; *acquisitions* per hand-off above 1 are a releaser "
           "taking the lock again while nobody was queued. Advisory: the "
           "waiters wait inside the server.%s\n\n",
           target, exact ? "" : " (Some backends had not gone: the "
                                "counts are approximate.)");
    printf("| mode | processes | transactions | acquisitions | "
           "hand-offs/s |\n|---|---|---|---|---|\n");
    for (int m = 0; m < 3; m++)
        for (int i = 0; i < nnp; i++)
            printf("| %s | %d | %.1f | %.1f | %.0f |\n", mode_name[m],
                   np[i], res[m][i].xacts, res[m][i].acqs, res[m][i].per_s);
    return 0;
}
