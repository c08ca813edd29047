/* SPDX-License-Identifier: MIT */
/*
 * bench_mysql.c -- dlock's MySQL/MariaDB store beside the store's own
 * statements run by a bare libmariadb loop, measured in one run against
 * the same server.
 *
 * Past 1,000 lines because its floors are the store's own statements,
 * written out in bare libmariadb (the fair queue's gate, the waiters'
 * upserts, the hand-off of both modes): the measurement machinery itself
 * is in harness.c.
 *
 *   dlock_bench_mysql URI [--quick]   (URI: mysql://user:pw@host:port/db)
 *
 * Prints Markdown. Floors, on one blocking libmariadb connection (READ
 * COMMITTED and utf8mb4, as the store's sessions):
 *   round trip   SELECT 1
 *   cycle floor  the store's uncontended statements, as my_acquire()
 *                and my_release() in mysql.c build them for a lock that
 *                is not fair: the try, its upsert taking the name's gate
 *                when free (INSERT ... SELECT ... FROM DUAL WHERE
 *                GET_LOCK(gate, 0) IS NOT NULL ON DUPLICATE KEY UPDATE
 *                ..., each condition the try's: the lease ended and the
 *                gate ours, the lease run out or the release older than
 *                the grace; the gate a literal; the token from
 *                mysql_insert_id()), and the release, its
 *                UPDATE guarded by owner and token then DO
 *                RELEASE_ALL_LOCKS() in one round trip (guarded()), as
 *                text with hex literals, on a table and queue table of
 *                the floor's own made with the store's DDL (so a gate of
 *                its own)
 * Cycles run in chunks that alternate with the floor, each on a new floor
 * connection and a new dlock client; a ratio is the median of the chunks'
 * ratios. The floor's statements are checked against the text dlock's
 * connection sent (the server's general query log, on for one cycle), and
 * its tables against the store's (SHOW CREATE TABLE), so that the floor
 * cannot drift from the store unnoticed.
 * Hand-off: two processes pass the lock back and forth, from the
 * holder's release call to the waiter's acquire returning. The waiter
 * sleeps in the server (GET_LOCK inside its upsert) and the release wakes
 * it. Floor: two bare blocking libmariadb clients doing what a hand-off
 * minimally needs: the waiter's session asleep in the store's waiting
 * upsert (guarded by GET_LOCK(g, 10), its times the wake's), the holder's
 * release (the store's guarded UPDATE, then DO RELEASE_ALL_LOCKS(), one
 * round trip) waking it, and the same statement taking the row; what
 * dlock adds is the SET before the upsert (in the same round trip) and
 * its own work. Chunks alternate floor and dlock, each
 * with the round trip measured beside it; figures are medians of the
 * chunks' medians, also in round trips.
 * Statements per hand-off: N processes contend; the server's Questions
 * (and Com_insert_select: the upserts) less this connection's own
 * (GLOBAL_STATUS - SESSION_STATUS, in one statement), less the same count
 * for the processes only opening and closing their clients.
 */
#include <dlock.h>
#include <mysql.h>

#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

const char bench_prog[] = "bench_mysql";

#define CHUNKS 15             /* --quick: QUICK_CHUNKS */
#define QUICK_CHUNKS 9
#define WAIT_MS 10000         /* a hand-off's acquire gives up after this */
#define TTL_MS 30000          /* dlock's default lease; the floor's too */
#define STORE_TABLE "dlock_locks"
#define FLOOR_TABLE "bench_floor"
/* the cycles' lock, in each table: the same name gives the same literal */
#define CYCLE_LOCK "bench-cycle"
#define SQL_MAX 8192

/* mysql.c's expressions (a woken waiter's upsert: WOKE, ENDED_WOKE) */
#define NOW "UTC_TIMESTAMP(6)"
#define ENDED "lock_until <= " NOW
#define ENDED_WOKE "lock_until <= VALUES(locked_at)"
#define WOKE "SYSDATE(6)"
#define MINE "owner <=> VALUES(owner)"
#define LET_GO "DO RELEASE_ALL_LOCKS()"

static int quick, chunks;
static const char *uri;
static char shown[1200];    /* the URI without its password */
static char store_table[65] = STORE_TABLE;
static char host[256], user[256], password[256], db[256];
static unsigned port = 3306;

static const dlock_client_options copts = {10000}; /* a busy machine is
                                                   * no failure */

/* ------------------------------------------------------------------------ */
/* The store's statements                                                   */
/* ------------------------------------------------------------------------ */

/* X'<hex>' of s, as the store writes every value. */
static void hexlit(const char *s, char *out, size_t cap)
{
    static const char digits[] = "0123456789abcdef";
    size_t n = strlen(s), o = 0;

    if (2 * n + 4 > cap)
        die("hex literal", "too long");
    out[o++] = 'X';
    out[o++] = '\'';
    for (size_t i = 0; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        out[o++] = digits[b >> 4];
        out[o++] = digits[b & 15];
    }
    out[o++] = '\'';
    out[o] = '\0';
}

static void fits(int n, size_t cap)
{
    if (n < 0 || (size_t)n >= cap)
        die("statement", "too long");
}

static void query_str(MYSQL *m, const char *sql, int col, char *out,
                      size_t cap);

/* The name's gate, a user-level lock named from the database, the table
 * and the lock name (hex literal), as a quoted literal (the store's
 * mysql_hash.c computes it; here the server does). */
static void gate_lit(MYSQL *m, const char *table, const char *name,
                     char *out, size_t cap)
{
    char tl[2 * 64 + 4], sql[512], g[128];

    hexlit(table, tl, sizeof(tl));
    fits(snprintf(sql, sizeof(sql),
                  "SELECT CONCAT('dlock:', SHA2(CONCAT(CAST(DATABASE() AS "
                  "BINARY), X'00', %s, X'00', %s), 224))",
                  tl, name),
         sizeof(sql));
    query_str(m, sql, 0, g, sizeof(g));
    fits(snprintf(out, cap, "'%s'", g), cap);
}

/* upsert(): my_acquire()'s upsert for a lock that is not fair (the
 * take-over condition six times), `where` after FROM DUAL (the gate);
 * `woke`: a waiter's, whose times are its wake's; `gate` (a try's: NULL
 * for a waiter's): the try's, which evaluates its condition (mysql_sql.c's
 * TAKE_TRY) once and carries it in LAST_INSERT_ID(). Values are
 * literals. */
static void acquire_sql(char *out, size_t cap, const char *table,
                        const char *name, const char *owner,
                        const char *holder, const char *where, int woke,
                        const char *gate)
{
    const char *now = woke ? WOKE : NOW;
    const char *cond = woke ? ENDED_WOKE : ENDED;

    if (gate) {
        fits(snprintf(out, cap,
                      "INSERT INTO `%s` (name, owner, holder, holds, token, "
                      "locked_at, lock_until) SELECT %s, %s, %s, 1, "
                      "LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, "
                      "'1970-01-01', " NOW ")), " NOW ", " NOW " + INTERVAL "
                      "%lld MICROSECOND FROM DUAL%s ON DUPLICATE KEY UPDATE "
                      "holder = IF(LAST_INSERT_ID((lock_until <= " NOW
                      " AND (holds > 0 OR lock_until <= " NOW " - INTERVAL "
                      "500000 MICROSECOND OR IS_USED_LOCK(%s) <=> "
                      "CONNECTION_ID()))), VALUES(holder), holder), "
                      "holds = IF(LAST_INSERT_ID(), 1, holds), "
                      "locked_at = IF(LAST_INSERT_ID(), VALUES(locked_at), "
                      "locked_at), "
                      "owner = IF(LAST_INSERT_ID(), VALUES(owner), owner), "
                      "lock_until = IF(LAST_INSERT_ID(), VALUES(lock_until), "
                      "IF(" MINE ", GREATEST(lock_until, VALUES(lock_until)), "
                      "lock_until)), "
                      "token = IF(LAST_INSERT_ID(), LAST_INSERT_ID(GREATEST("
                      "token + 1, VALUES(token))), IF(" MINE
                      ", LAST_INSERT_ID(token), token))",
                      table, name, owner, holder, (long long)TTL_MS * 1000,
                      where, gate),
             cap);
        return;
    }
    fits(snprintf(out, cap,
                  "INSERT INTO `%s` (name, owner, holder, holds, token, "
                  "locked_at, lock_until) SELECT %s, %s, %s, 1, "
                  "LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', "
                  "%s)), %s, %s + INTERVAL %lld MICROSECOND FROM DUAL%s "
                  "ON DUPLICATE KEY UPDATE "
                  "holder = IF(%s, VALUES(holder), holder), "
                  "holds = IF(%s, 1, holds), "
                  "token = IF(%s, LAST_INSERT_ID(GREATEST(token + 1, "
                  "VALUES(token))), IF(" MINE ", LAST_INSERT_ID(token), "
                  "token)), "
                  "locked_at = IF(%s, VALUES(locked_at), locked_at), "
                  "owner = IF(%s, VALUES(owner), owner), "
                  "lock_until = IF(%s, VALUES(lock_until), IF(" MINE ", "
                  "GREATEST(lock_until, VALUES(lock_until)), lock_until))",
                  table, name, owner, holder, now, now, now,
                  (long long)TTL_MS * 1000, where, cond, cond, cond, cond,
                  cond, cond),
         cap);
}

/* The cycle's try (TRY_GATE): the upsert taking the gate of `table`
 * (`m` computes its name) when free, and deciding by the row. */
static void try_sql(MYSQL *m, char *out, size_t cap, const char *table,
                    const char *name, const char *owner, const char *holder)
{
    char gate[128], where[600];

    gate_lit(m, table, name, gate, sizeof(gate));
    fits(snprintf(where, sizeof(where), " WHERE GET_LOCK(%s, 0) IS NOT NULL",
                  gate),
         sizeof(where));
    acquire_sql(out, cap, table, name, owner, holder, where, 0, gate);
}

/* guarded() with my_release()'s SET, then the gate's release in the same
 * round trip (my_release() on the hold's connection). */
static void release_sql(char *out, size_t cap, const char *table,
                        const char *name, const char *owner,
                        unsigned long long token)
{
    fits(snprintf(out, cap,
                  "UPDATE `%s` SET owner = NULL, holder = NULL, holds = 0, "
                  "lock_until = " NOW " WHERE name = %s AND owner = %s AND "
                  "token = %llu AND lock_until > " NOW "; " LET_GO,
                  table, name, owner, token),
         cap);
}

/* ensure_schema()'s DDL, for the floor's names (DLOCK_NAME_MAX: 512) */
#define SQL_FLOOR_DROP "DROP TABLE IF EXISTS `" FLOOR_TABLE "`, `" \
    FLOOR_TABLE "_queue`"
#define SQL_FLOOR_TABLE                                                     \
    "CREATE TABLE `" FLOOR_TABLE "` ( name VARBINARY(512) NOT NULL "        \
    "PRIMARY KEY, owner VARBINARY(80) NULL, holder VARBINARY(255) NULL, "   \
    "holds INT NOT NULL DEFAULT 0, token BIGINT UNSIGNED NOT NULL DEFAULT " \
    "0, locked_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00', "     \
    "lock_until DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00', "       \
    "permits INT NOT NULL DEFAULT 0, holders LONGTEXT CHARACTER SET "       \
    "utf8mb4 COLLATE utf8mb4_bin NULL) ENGINE=InnoDB"
#define SQL_FLOOR_QUEUE                                                     \
    "CREATE TABLE `" FLOOR_TABLE "_queue` ( seq BIGINT UNSIGNED NOT NULL "  \
    "AUTO_INCREMENT PRIMARY KEY, name VARBINARY(512) NOT NULL, holder "     \
    "VARBINARY(255) NULL, alive_until DATETIME(6) NOT NULL, KEY name_seq "  \
    "(name, seq)) ENGINE=InnoDB"

/* ------------------------------------------------------------------------ */
/* The bare client                                                          */
/* ------------------------------------------------------------------------ */

static void exec_ok(MYSQL *m, const char *sql)
{
    if (mysql_real_query(m, sql, strlen(sql)) != 0)
        die(sql, mysql_error(m));
    if (mysql_field_count(m) > 0) {
        MYSQL_RES *r = mysql_store_result(m);
        if (!r)
            die(sql, mysql_error(m));
        mysql_free_result(r);
    }
}

/* The rows of a query (the caller frees them). */
static MYSQL_RES *rows(MYSQL *m, const char *sql)
{
    MYSQL_RES *r;

    if (mysql_real_query(m, sql, strlen(sql)) != 0 ||
        !(r = mysql_store_result(m)))
        die(sql, mysql_error(m));
    return r;
}

static long long query_ll(MYSQL *m, const char *sql)
{
    MYSQL_RES *r = rows(m, sql);
    MYSQL_ROW row = mysql_fetch_row(r);

    if (!row || !row[0])
        die(sql, "no value");
    long long v = strtoll(row[0], NULL, 10);
    mysql_free_result(r);
    return v;
}

/* One value of a one-row query as text, into out. */
static void query_str(MYSQL *m, const char *sql, int col, char *out,
                      size_t cap)
{
    MYSQL_RES *r = rows(m, sql);
    MYSQL_ROW row = mysql_fetch_row(r);

    if (!row || (int)mysql_num_fields(r) <= col || !row[col])
        die(sql, "no value");
    snprintf(out, cap, "%s", row[col]);
    mysql_free_result(r);
}

/* A blocking connection set up as the store sets up its own; flags:
 * CLIENT_MULTI_STATEMENTS to send several statements at once. */
static MYSQL *connect_my(unsigned long flags)
{
    MYSQL *m = mysql_init(NULL);
    unsigned connect_s = 10, io_s = 30; /* a stuck server: an error */

    if (!m)
        die("mysql_init", "out of memory");
    mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &connect_s);
    mysql_options(m, MYSQL_OPT_READ_TIMEOUT, &io_s);
    mysql_options(m, MYSQL_OPT_WRITE_TIMEOUT, &io_s);
    mysql_options(m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    if (!mysql_real_connect(m, host, user, password, db, port, NULL, flags))
        die("connecting", mysql_error(m));
    exec_ok(m, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED");
    return m;
}

typedef struct floor_my {
    MYSQL *m;
    char name[64], owner[160];
    char acq[SQL_MAX], rel[SQL_MAX];
    size_t acq_len;
} floor_my;

/* The holder text dlock writes for the main thread of this process (the
 * core's "%.64s pid %ld tid %ld"). */
static void holder_text(char *out, size_t cap)
{
    char h[64] = "unknown-host";

    if (gethostname(h, sizeof(h) - 1) != 0)
        snprintf(h, sizeof(h), "unknown-host");
    h[sizeof(h) - 1] = '\0';
    snprintf(out, cap, "%.64s pid %ld tid %ld", h, (long)getpid(),
             (long)getpid());
}

/* A new floor connection (for run_cycles(): one per chunk); values shaped
 * like dlock's (a 32-hex client id and a thread id; the main thread's
 * holder text). The upsert's text does not change from cycle to cycle:
 * made once. */
static void *floor_connect(void *arg)
{
    char owner[64], holder[160], hh[2 * sizeof(holder) + 4];
    floor_my *f = malloc(sizeof(*f));

    (void)arg;
    if (!f)
        die("floor", "out of memory");
    f->m = connect_my(CLIENT_MULTI_STATEMENTS);
    snprintf(owner, sizeof(owner), "0123456789abcdef0123456789abcdef:%ld",
             (long)getpid());
    holder_text(holder, sizeof(holder));
    hexlit(CYCLE_LOCK, f->name, sizeof(f->name));
    hexlit(owner, f->owner, sizeof(f->owner));
    hexlit(holder, hh, sizeof(hh));
    try_sql(f->m, f->acq, sizeof(f->acq), FLOOR_TABLE, f->name, f->owner,
            hh);
    f->acq_len = strlen(f->acq);
    return f;
}

static void floor_close(void *arg)
{
    floor_my *f = arg;

    mysql_close(f->m);
    free(f);
}

static void floor_rtt(void *arg)
{
    floor_my *f = arg;

    exec_ok(f->m, "SELECT 1");
}

/* One acquire and one release, as the store sends them: the upsert
 * guarded by the gate (1 row inserted or 2 taken over; the token from
 * LAST_INSERT_ID), then the guarded update with that token (1 row) and
 * the gate's release, one round trip. */
/* The store's release: the guarded UPDATE, then the gate, one round
 * trip (rel: room for its text). */
static void floor_release(MYSQL *m, char *rel, size_t cap, const char *name,
                          const char *owner, unsigned long long token)
{
    release_sql(rel, cap, FLOOR_TABLE, name, owner, token);
    if (mysql_real_query(m, rel, strlen(rel)) != 0)
        die("floor release", mysql_error(m));
    if (mysql_affected_rows(m) != 1)
        die("floor release", "the floor's row was not ours");
    if (mysql_next_result(m) != 0)
        die("floor release", mysql_error(m));
}

static void floor_cycle(void *arg)
{
    floor_my *f = arg;

    if (mysql_real_query(f->m, f->acq, f->acq_len) != 0)
        die("floor acquire", mysql_error(f->m));
    my_ulonglong got = mysql_affected_rows(f->m);
    unsigned long long token = (unsigned long long)mysql_insert_id(f->m);
    if ((got != 1 && got != 2) || token == 0)
        die("floor acquire", "the floor's lock was not free");
    floor_release(f->m, f->rel, sizeof(f->rel), f->name, f->owner, token);
}

/* ------------------------------------------------------------------------ */
/* Is the floor the store?                                                  */
/* ------------------------------------------------------------------------ */

/* The n-th (from 1) X'...' literal of s, into out; 0 if there is none. */
static int nth_literal(const char *s, size_t len, int n, char *out,
                       size_t cap)
{
    const char *end = s + len;

    for (const char *p = s; p + 1 < end; p++) {
        if (p[0] != 'X' || p[1] != '\'')
            continue;
        const char *q = memchr(p + 2, '\'', (size_t)(end - p - 2));
        if (!q)
            return 0;
        if (--n == 0) {
            if ((size_t)(q - p + 1) >= cap)
                return 0;
            memcpy(out, p, (size_t)(q - p + 1));
            out[q - p + 1] = '\0';
            return 1;
        }
        p = q;
    }
    return 0;
}

/* Every identifier in s that begins with `from (the floor's names)
 * begins with `to instead (the store's). */
static void rename_idents(char *s, size_t cap, const char *from,
                          const char *to)
{
    size_t fl = strlen(from), tl = strlen(to);

    for (char *p = strchr(s, '`'); p; p = strchr(p + 1, '`')) {
        if (strncmp(p + 1, from, fl) != 0)
            continue;
        size_t rest = strlen(p + 1 + fl);
        if ((size_t)(p + 1 - s) + tl + rest + 1 > cap)
            die("renaming", "too long");
        memmove(p + 1 + tl, p + 1 + fl, rest + 1);
        memcpy(p + 1, to, tl);
        p += tl;
    }
}

/* SHOW CREATE TABLE of `t` with the floor's names made the store's, the
 * AUTO_INCREMENT counter left out (it is no part of the DDL). */
static void create_text(MYSQL *m, const char *t, char *out, size_t cap)
{
    char sql[200], *p;

    snprintf(sql, sizeof(sql), "SHOW CREATE TABLE `%s`", t);
    query_str(m, sql, 1, out, cap);
    rename_idents(out, cap, FLOOR_TABLE, store_table);
    if ((p = strstr(out, " AUTO_INCREMENT=")) != NULL) {
        char *q = p + strlen(" AUTO_INCREMENT=");
        while (*q >= '0' && *q <= '9')
            q++;
        memmove(p, q, strlen(q) + 1);
    }
}

/* Whether the floor's tables are the store's: 1 or 0. */
static int same_schema(MYSQL *m)
{
    static char a[SQL_MAX], b[SQL_MAX];
    static const char *const floor_t[2] = {FLOOR_TABLE,
                                           FLOOR_TABLE "_queue"};
    int same = 1;

    for (int i = 0; i < 2; i++) {
        char st[100];
        snprintf(st, sizeof(st), "%s%s", store_table, i ? "_queue" : "");
        create_text(m, st, a, sizeof(a));
        create_text(m, floor_t[i], b, sizeof(b));
        if (strcmp(a, b) != 0) {
            fprintf(stderr, "bench_mysql: the store's table\n  %s\nthe "
                            "floor's\n  %s\n", a, b);
            same = 0;
        }
    }
    return same;
}

/* Compares what the store sent (got, len bytes) with the floor's
 * statement written for the store's table (want). */
static int same_text(const char *what, const char *got, size_t len,
                     const char *want)
{
    if (len == strlen(want) && !memcmp(got, want, len))
        return 1;
    fprintf(stderr, "bench_mysql: %s: the store sent\n  %.*s\nthe floor "
                    "sends (for the store's table)\n  %s\n",
            what, (int)len, got, want);
    return 0;
}

/* The general log as it was, to put back. */
static void general_log_restore(MYSQL *m, const char *on, const char *out)
{
    char sql[300];

    snprintf(sql, sizeof(sql), "SET GLOBAL general_log = %s", on);
    exec_ok(m, sql);
    snprintf(sql, sizeof(sql), "SET GLOBAL log_output = '%s'", out);
    exec_ok(m, sql);
}

/*
 * Whether one uncontended dlock cycle sent exactly the floor's two
 * statements (for the store's table): 1 same, 0 not, -1 not known (why
 * in *why). The server's general query log (to its table, only for the
 * cycle) shows the text: performance_schema is off by default in
 * MariaDB, and the process list shows a statement only while it runs.
 */
static int same_statements(MYSQL *m, const char **why)
{
    char was_on[8], was_out[64];
    dlock_client *c = h_open_client(uri, &copts);
    dlock *l = h_open_lock(c, CYCLE_LOCK, 0, TTL_MS);
    unsigned long long token = 0;
    int same = -1;

    *why = NULL;
    query_str(m, "SELECT @@global.general_log, @@global.log_output", 0,
              was_on, sizeof(was_on));
    query_str(m, "SELECT @@global.general_log, @@global.log_output", 1,
              was_out, sizeof(was_out));
    /* another client's statements would be mixed with dlock's */
    if (query_ll(m, "SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                    "WHERE ID <> CONNECTION_ID() AND COMMAND NOT IN "
                    "('Daemon', 'Sleep')") > 0 ||
        (strcmp(was_on, "0") != 0 && strcmp(was_on, "OFF") != 0)) {
        *why = "not checked: other clients were busy, or the general log "
               "was on already";
        goto out;
    }
    static const char to_table[] = "SET GLOBAL log_output = 'TABLE'";
    static const char log_on[] = "SET GLOBAL general_log = 1";
    if (mysql_real_query(m, to_table, strlen(to_table)) != 0 ||
        mysql_real_query(m, log_on, strlen(log_on)) != 0) {
        fprintf(stderr, "bench_mysql: general log: %s\n", mysql_error(m));
        general_log_restore(m, was_on, was_out);
        *why = "not checked: no right to turn the general log on";
        goto out;
    }
    int rc = dlock_acquire(l, 0);
    token = dlock_token(l);
    if (rc == DLOCK_OK)
        rc = dlock_release(l);
    general_log_restore(m, was_on, was_out);
    if (rc != DLOCK_OK)
        die("check cycle", dlock_errmsg());

    MYSQL_RES *r = rows(m, "SELECT thread_id, argument FROM "
                           "mysql.general_log WHERE command_type = 'Query' "
                           "AND thread_id <> CONNECTION_ID() ORDER BY "
                           "event_time");
    MYSQL_ROW row[2];
    unsigned long *lens;
    size_t len[2];
    my_ulonglong n = mysql_num_rows(r);
    for (int i = 0; i < 2 && (my_ulonglong)i < n; i++) {
        row[i] = mysql_fetch_row(r);
        lens = mysql_fetch_lengths(r);
        len[i] = lens ? lens[1] : 0;
    }
    if (n != 2 || !row[0][1] || !row[1][1] || strcmp(row[0][0], row[1][0])) {
        fprintf(stderr, "bench_mysql: the general log has %llu statements "
                        "of other connections for one dlock cycle\n",
                (unsigned long long)n);
        same = 0;
    } else {
        /* the owner is dlock's (a random client id): taken from the log */
        char name[64], owner[200], holder[160], hh[2 * sizeof(holder) + 4];
        static char want[SQL_MAX];
        holder_text(holder, sizeof(holder));
        hexlit(CYCLE_LOCK, name, sizeof(name));
        hexlit(holder, hh, sizeof(hh));
        if (!nth_literal(row[0][1], len[0], 2, owner, sizeof(owner))) {
            fprintf(stderr, "bench_mysql: no owner in the store's upsert\n");
            snprintf(owner, sizeof(owner), "?");
        }
        try_sql(m, want, sizeof(want), store_table, name, owner, hh);
        same = same_text("acquire", row[0][1], len[0], want);
        release_sql(want, sizeof(want), store_table, name, owner, token);
        same &= same_text("release", row[1][1], len[1], want);
    }
    mysql_free_result(r);
    /* it was off: the rows are ours alone */
    exec_ok(m, "TRUNCATE TABLE mysql.general_log");
out:
    dlock_close(l);
    dlock_client_close(c);
    return same;
}

static const floor_ops my_floor = {floor_connect, floor_cycle, floor_rtt,
                                   floor_close, NULL};

/* ------------------------------------------------------------------------ */
/* Hand-off between two processes                                           */
/* ------------------------------------------------------------------------ */

/* The floor's side of a hand-off: a connection, its waiting upsert (an
 * owner of its own) and the token of its hold. */
typedef struct floor_side {
    MYSQL *m;
    char name[64], owner[160];
    char acq[SQL_MAX], rel[SQL_MAX];
    unsigned long long token;
} floor_side;

#define FLOOR_GATE " WHERE GET_LOCK('bench-floor-handoff', 10) = 1"

/* A hand-off party of its own (handoff_run(), after the fork). */
static void *floor_side_open(void *arg, int me)
{
    char owner[64], holder[160], hh[2 * sizeof(holder) + 4];
    floor_side *f = malloc(sizeof(*f));

    (void)arg;
    if (!f)
        die("floor hand-off", "out of memory");
    f->m = connect_my(CLIENT_MULTI_STATEMENTS);
    /* the woken upsert's SYSDATE(6) in UTC, as the store's */
    exec_ok(f->m, "SET time_zone = '+00:00'");
    snprintf(owner, sizeof(owner), "0123456789abcdef0123456789abcdef:%d",
             me);
    holder_text(holder, sizeof(holder));
    hexlit("bench-handoff", f->name, sizeof(f->name));
    hexlit(owner, f->owner, sizeof(f->owner));
    hexlit(holder, hh, sizeof(hh));
    acquire_sql(f->acq, sizeof(f->acq), FLOOR_TABLE, f->name, f->owner, hh,
                FLOOR_GATE, 1, NULL);
    return f;
}

/* The upsert, asleep in its GET_LOCK until the holder lets go, then
 * taking the row. */
static void floor_side_take(void *arg)
{
    floor_side *f = arg;

    if (mysql_real_query(f->m, f->acq, strlen(f->acq)) != 0)
        die("floor hand-off", mysql_error(f->m));
    f->token = (unsigned long long)mysql_insert_id(f->m);
    if (mysql_affected_rows(f->m) < 1 || f->token == 0)
        die("floor hand-off", "the gate was not granted or the floor's row "
                              "was not free");
}

static void floor_side_release(void *arg)
{
    floor_side *f = arg;

    floor_release(f->m, f->rel, sizeof(f->rel), f->name, f->owner,
                  f->token);
}

static void floor_side_close(void *arg, int holding)
{
    floor_side *f = arg;

    /* the last one to take it lets go */
    if (holding)
        floor_side_release(f);
    mysql_close(f->m);
    free(f);
}

/* n hand-offs of the floor or of dlock, the holder letting go hold_min_us
 * to hold_max_us after the other one began to wait (by then it sleeps in
 * the server); p50/p99 in µs. */
static stats handoff(int floor, int n, long hold_min_us, long hold_max_us)
{
    static const party_ops floor_party = {floor_side_open, floor_side_take,
                                          floor_side_release,
                                          floor_side_close, NULL};
    dlock_party d = {uri, &copts, 0, 0, WAIT_MS};
    party_ops dl = dlock_party_ops;
    handoff_cfg cfg = {floor ? &floor_party : &dl, hold_min_us, hold_max_us,
                       0};

    dl.arg = &d;
    return handoff_run(&cfg, n, NULL);
}

/* --- statements per hand-off --- */

/* Statements and upserts that other connections sent: the global counts
 * less this connection's, read in one statement. */
typedef struct counts {
    long long statements, upserts;
} counts;

static counts server_counts(MYSQL *mon)
{
    MYSQL_RES *r = rows(mon,
                        "SELECT SUM(IF(g.VARIABLE_NAME = 'QUESTIONS', "
                        "g.VARIABLE_VALUE - s.VARIABLE_VALUE, 0)), "
                        "SUM(IF(g.VARIABLE_NAME = 'COM_INSERT_SELECT', "
                        "g.VARIABLE_VALUE - s.VARIABLE_VALUE, 0)) FROM "
                        "information_schema.GLOBAL_STATUS g JOIN "
                        "information_schema.SESSION_STATUS s ON "
                        "s.VARIABLE_NAME = g.VARIABLE_NAME WHERE "
                        "g.VARIABLE_NAME IN ('QUESTIONS', "
                        "'COM_INSERT_SELECT')");
    MYSQL_ROW row = mysql_fetch_row(r);
    counts c;

    if (!row || !row[0] || !row[1])
        die("server status", "no counts");
    c.statements = strtoll(row[0], NULL, 10);
    c.upserts = strtoll(row[1], NULL, 10);
    mysql_free_result(r);
    return c;
}

/* Waits until no other connection of our user is open (a closed
 * session's counts join the global ones when its thread ends); 0 if some
 * still are after 10 s. */
static int others_gone(MYSQL *mon)
{
    for (int i = 0; i < 200; i++) {
        if (query_ll(mon, "SELECT COUNT(*) FROM information_schema."
                          "PROCESSLIST WHERE ID <> CONNECTION_ID() AND "
                          "USER = SUBSTRING_INDEX(USER(), '@', 1)") == 0)
            return 1;
        sleep_us(50000);
    }
    return 0;
}

typedef struct per_handoff {
    double statements, upserts, acqs, per_s;
    long handoffs;
    int exact, timed_out;
} per_handoff;

/* One race of nproc processes (cycles 0: they only open and close); the
 * server's counts from before the first opens to after the last closed.
 * Each process: acquire (waiting at most 5 s), hold 1 ms, release, then
 * 0-2 ms outside the lock, `cyc` times. The pause, drawn at random, makes
 * a process's next acquire find the lock sometimes held (it waits in the
 * server) and sometimes free. */
static counts contention(MYSQL *mon, unsigned flags, int nproc, int cyc,
                         per_handoff *r)
{
    contend_cfg cfg = {uri, &copts, flags, nproc, 0, cyc, cyc == 0,
                       5000, 1000, 2000, quick ? 4000 : 8000};

    r->exact = others_gone(mon);
    counts c0 = server_counts(mon);
    contend *s = contend_start(&cfg);
    contend_go(s);
    contend_result cr = contend_finish(s);
    r->exact &= others_gone(mon);
    counts c1 = server_counts(mon);
    r->handoffs = cr.handoffs;
    r->timed_out = cr.timed_out;
    r->acqs = r->handoffs ? (double)cr.acquisitions / (double)r->handoffs
                          : 0;
    r->per_s = cr.per_s;
    c1.statements -= c0.statements;
    c1.upserts -= c0.upserts;
    return c1;
}

/* Per hand-off, the processes' open and close (a race without cycles)
 * subtracted. */
static per_handoff statements_per_handoff(MYSQL *mon, unsigned flags,
                                          int nproc, int cyc)
{
    per_handoff setup, r;
    counts base = contention(mon, flags, nproc, 0, &setup);
    counts all = contention(mon, flags, nproc, cyc, &r);
    double h = r.handoffs ? (double)r.handoffs : 1;

    r.exact &= setup.exact;
    r.statements = (double)(all.statements - base.statements) / h;
    r.upserts = (double)(all.upserts - base.upserts) / h;
    return r;
}

/* ------------------------------------------------------------------------ */

/* %XX escapes of a URI part, into out. */
static void unescape(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;

    for (size_t i = 0; i < n && o + 1 < cap; i++) {
        if (s[i] == '%' && i + 2 < n && isxdigit((unsigned char)s[i + 1]) &&
            isxdigit((unsigned char)s[i + 2])) {
            char hex[3] = {s[i + 1], s[i + 2], '\0'};
            out[o++] = (char)strtol(hex, NULL, 16);
            i += 2;
        } else {
            out[o++] = s[i];
        }
    }
    out[o] = '\0';
}

/* mysql://[user[:password]@]host[:port]/db[?table=T...]: the parts for
 * the bare client, and the URI without its password. */
static void parse_uri(void)
{
    const char *p = strstr(uri, "://"), *q, *at, *slash, *colon, *t;

    if (!p || (strncmp(uri, "mysql://", 8) && strncmp(uri, "mariadb://", 10)))
        die(uri, "expected mysql://[user:password@]host[:port]/db");
    p += 3;
    q = strchr(p, '?');
    if (!q)
        q = p + strlen(p);
    slash = memchr(p, '/', (size_t)(q - p));
    if (!slash)
        die(uri, "no database");
    at = NULL;
    for (const char *a = p; a < slash; a++)
        if (*a == '@')
            at = a;
    const char *hp = p;
    if (at) {
        colon = memchr(p, ':', (size_t)(at - p));
        unescape(p, (size_t)((colon ? colon : at) - p), user, sizeof(user));
        if (colon)
            unescape(colon + 1, (size_t)(at - colon - 1), password,
                     sizeof(password));
        hp = at + 1;
        snprintf(shown, sizeof(shown), "%.*s%s",
                 (int)((colon ? colon : at) - uri), uri, at);
    } else {
        snprintf(shown, sizeof(shown), "%s", uri);
    }
    colon = memchr(hp, ':', (size_t)(slash - hp));
    snprintf(host, sizeof(host), "%.*s",
             (int)((colon ? colon : slash) - hp), hp);
    if (colon)
        port = (unsigned)strtoul(colon + 1, NULL, 10);
    unescape(slash + 1, (size_t)(q - slash - 1), db, sizeof(db));
    if (*q && (t = strstr(q, "table=")) != NULL &&
        (t[-1] == '?' || t[-1] == '&')) {
        size_t n = strcspn(t + 6, "&");
        if (n == 0 || n > 48 || memchr(t + 6, '`', n))
            die(uri, "the bench takes a table name of 1 to 48 bytes "
                     "without backquotes");
        snprintf(store_table, sizeof(store_table), "%.*s", (int)n, t + 6);
    }
}

int main(int argc, char **argv)
{
    uri = h_args(argc, argv, "URI", &quick);
    chunks = quick ? QUICK_CHUNKS : CHUNKS;
    parse_uri();
    signal(SIGPIPE, SIG_IGN);
    if (mysql_library_init(0, NULL, NULL) != 0)
        die("mysql_library_init", "failed");

    int n = quick ? 3000 : 15000; /* cycles of each kind */
    int nh = quick ? 60 : 300;    /* hand-offs of each kind */

    printf("## MySQL / MariaDB (%s)\n\n", shown);
    MYSQL *m = connect_my(0);
    char version[128];
    query_str(m, "SELECT VERSION()", 0, version, sizeof(version));
    exec_ok(m, SQL_FLOOR_DROP);
    exec_ok(m, SQL_FLOOR_TABLE);
    exec_ok(m, SQL_FLOOR_QUEUE);

    char nwhy[256];
    dlock_client *c = h_store_client(uri, &copts, nwhy, sizeof(nwhy));
    if (!c) {
        printf("Not measured: %s.\n", nwhy);
        mysql_close(m);
        return 0;
    }
    dlock_client_close(c); /* it made the store's tables */
    int schema = same_schema(m);
    const char *why;
    int stmts = same_statements(m, &why);

    cycles tc = run_cycles(&my_floor, uri, &copts, n, chunks, 1);
    double rtt = tc.rtt.med;
    printf("Server %s. Latency in microseconds. Floor: one blocking "
           "libmariadb connection (READ COMMITTED and utf8mb4, as the "
           "store's sessions) sending the store's own two round trips of an "
           "uncontended cycle as text: the try, the `INSERT ... SELECT ... "
           "FROM DUAL WHERE GET_LOCK(gate, 0) IS NOT NULL ON DUPLICATE KEY "
           "UPDATE` upsert (the gate: the name's user-level lock, which a "
           "hold keeps, taken when free; the row taken as it decides; the "
           "token from `mysql_insert_id()`), and the release, "
           "the `UPDATE` guarded by owner and token then `DO "
           "RELEASE_ALL_LOCKS()`, on a table and queue table of the "
           "floor's own made with the store's DDL "
           "(checked against the text dlock's connection sent, from the "
           "server's general query log, and against `SHOW CREATE TABLE`: "
           "%s). Cycles: %d of each, in %d chunks alternating with the "
           "floor (the round trip in the same chunks), each on a new floor "
           "connection and a new dlock client; a p50 is the median of the "
           "chunks' medians, a p99 is over all cycles, a ratio is the "
           "median of the chunks' ratios (with their spread).\n\n",
           version,
           !schema || stmts == 0 ? "**they differ**"
           : stmts < 0           ? why
                                 : "the same",
           (n / chunks) * chunks, chunks);
    printf("| measure | floor | dlock | ratio |\n|---|---|---|---|\n");
    printf("| round trip (`SELECT 1`), p50 | %.1f (chunks: %.1f–%.1f) | "
           "| |\n",
           rtt, tc.rtt.min, tc.rtt.max);
    h_cycle_rows("",
                 "the gated upsert + the guarded update and the gate's "
                 "release",
                 &tc, "1.2x", rtt);
    fflush(stdout);

    /* no dlock client may be open across fork (its threads). Chunks of
     * floor and dlock hand-offs alternate, the round trip beside each */
    int hc = quick ? 3 : 5;
    double hfl[8], hd[8], hrat[8], hrtt[8], hfp99 = 0, hdp99 = 0;
    for (int k = 0; k < hc; k++) {
        stats fs = handoff(1, nh / hc, 2000, 2000);
        stats ds = handoff(0, nh / hc, 2000, 2000);
        double t[200];
        for (int i = 0; i < 200; i++) {
            int64_t t0 = now_ns();
            exec_ok(m, "SELECT 1");
            t[i] = (double)(now_ns() - t0) / 1000;
        }
        hrtt[k] = medrange(t, 200).med;
        hfl[k] = fs.p50_us;
        hd[k] = ds.p50_us;
        hrat[k] = ds.p50_us / fs.p50_us;
        hfp99 = fs.p99_us > hfp99 ? fs.p99_us : hfp99;
        hdp99 = ds.p99_us > hdp99 ? ds.p99_us : hdp99;
    }
    double hunit[8], hfu[8];
    for (int k = 0; k < hc; k++) {
        hunit[k] = hd[k] / hrtt[k];
        hfu[k] = hfl[k] / hrtt[k];
    }
    spread hs_f = medrange(hfl, hc), hs_d = medrange(hd, hc);
    spread hs_r = medrange(hrat, hc), hs_t = medrange(hrtt, hc);
    spread hs_u = medrange(hunit, hc), hs_fu = medrange(hfu, hc);
    printf("\n### MySQL / MariaDB hand-off\n\n");
    printf("Two processes pass one lock back and forth: the time from the "
           "holder's `dlock_release()` call to the waiting process's "
           "`dlock_acquire()` returning, in microseconds. The waiter "
           "sleeps in the server inside its try (the upsert guarded by a "
           "blocking `GET_LOCK` on the name's gate); the release (the "
           "guarded `UPDATE`, then `DO RELEASE_ALL_LOCKS()`, one round "
           "trip) lets go of the gate, the server wakes the waiter, and the "
           "same statement takes the row. The holder releases 2 ms after the "
           "other process began to wait. Floor: two bare blocking "
           "libmariadb clients doing what a hand-off minimally needs: the "
           "waiter's session asleep in the store's waiting upsert, guarded "
           "by `GET_LOCK(g, 10)` (without the `SET` of the wait's length "
           "that dlock sends before it), the holder's release (the same two "
           "statements, one round trip) waking it, and the same upsert "
           "taking the row. %d chunks of %d hand-offs of each alternate, the round "
           "trip (`SELECT 1`) measured after each; a p50 is the median of "
           "the chunks' medians, a p99 the largest chunk's, a ratio the "
           "median of the chunks' ratios, round trips the median of the "
           "chunks' p50 / round trip.\n\n",
           hc, nh / hc);
    printf("| measure | floor | dlock | ratio |\n|---|---|---|---|\n");
    printf("| round trip (`SELECT 1`), p50 | %.1f (chunks: %.1f–%.1f) | "
           "| |\n",
           hs_t.med, hs_t.min, hs_t.max);
    printf("| hand-off, release → the waiter's acquire returns, p50 | %.1f "
           "| %.1f | **%.2fx** (chunks: %.2f–%.2f) |\n",
           hs_f.med, hs_d.med, hs_r.med, hs_r.min, hs_r.max);
    printf("| the same, p99 | %.1f | %.1f | |\n", hfp99, hdp99);
    printf("| the same p50 in round trips | %.2f | **%.2f** (chunks: "
           "%.2f–%.2f; goal ≤ 4) | |\n",
           hs_fu.med, hs_u.med, hs_u.min, hs_u.max);
    fflush(stdout);

    /* statements per hand-off: nothing of ours but m connected */
    static const char *const mode_name[2] = {"default", "fair"};
    unsigned hf[2] = {0, DLOCK_FAIR};
    int np[] = {2, 8};
    int cyc[] = {quick ? 50 : 200, 20};
    int nnp = quick ? 1 : 2;
    per_handoff res[2][2];
    int exact = 1, timed_out = 0;
    for (int i = 0; i < nnp; i++)
        for (int k = 0; k < 2; k++) {
            res[k][i] = statements_per_handoff(m, hf[k], np[i], cyc[i]);
            exact &= res[k][i].exact;
            timed_out |= res[k][i].timed_out;
        }
    mysql_close(m);
    printf("\n### MySQL / MariaDB statements per hand-off\n\n");
    printf("N processes contend for one lock, each for a fixed number of "
           "acquisitions (%d each for 2 processes, %d each for 8): acquire "
           "(waiting at most 5 s), hold 1 ms, release, then 0–2 ms (at "
           "random) outside the lock, so that a process's next acquire "
           "finds the lock sometimes held and sometimes free. "
           "*Statements*: the server's `Questions` (every statement a "
           "client sent, each of a round trip's statements counted; "
           "*upserts*: `Com_insert_select`) from before the processes "
           "connect to after they have gone, less the reading connection's "
           "own and less the count for the same processes only opening and "
           "closing their clients; per hand-off (a change of the holding "
           "process), and per second. A waiter sends nothing while it "
           "waits: after its try (the upsert that takes the gate when "
           "free, busy) it sends one round trip, a `SET` of the wait's "
           "length and the upsert guarded by a blocking `GET_LOCK`, and "
           "sleeps in the server inside it; the release (the guarded "
           "`UPDATE`, then `DO RELEASE_ALL_LOCKS()`) hands the gate to the "
           "oldest waiter, and the same upsert takes the row. So an "
           "acquisition that waited costs 5 statements with its release (2 "
           "of them upserts), one that found the lock free 3 (1 upsert); a "
           "fair waiter also writes the queue entry that `dlock_inspect()` "
           "lists (an `INSERT`, a `SET` of its number and an `UPDATE` of "
           "its wait's end that takes the entry's lock in its first wait's "
           "round trip, a `DELETE` with its winning upsert): 9 (2 "
           "upserts). A release "
           "wakes only the oldest waiter, so the count per hand-off does "
           "not grow with the number of waiting processes; a releaser's "
           "next try cannot take the lock past a woken waiter (the gate "
           "went to it, and a try leaves a row released less than 500 ms "
           "ago to the gate's holder), so *acquisitions* per hand-off "
           "exceed 1 only when "
           "nobody waited at the release and the releaser tried again "
           "first.%s%s\n\n",
           cyc[0], cyc[1],
           exact ? "" : " (Some connections had not gone: the counts are "
                        "approximate.)",
           timed_out ? " (Some processes stopped at the time limit before "
                       "their last acquisition.)"
                     : "");
    printf("| mode | processes | statements | of them upserts | "
           "statements/s | acquisitions | hand-offs/s |\n"
           "|---|---|---|---|---|---|---|\n");
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < nnp; i++)
            printf("| %s | %d | %.1f | %.1f | %.0f | %.1f | %.0f |\n",
                   mode_name[k], np[i], res[k][i].statements,
                   res[k][i].upserts,
                   res[k][i].statements * res[k][i].per_s, res[k][i].acqs,
                   res[k][i].per_s);
    mysql_library_end();
    return 0;
}
