/* SPDX-License-Identifier: MIT */
/*
 * mysql_operate.c -- what the MySQL/MariaDB store (mysql_int.h) says of
 * its locks: dlock_inspect(), dlock_list() and dlock_break()
 * (docs/design.md, "Operating: listing and breaking locks" and its
 * "Breaking on MySQL / MariaDB"; docs/monitoring.md).
 *
 *  - One set of columns describes a lock row, read by alias `t` (the
 *    holds of either form through MY_HOLDS_OF), and one function reads
 *    them into a dlock_info: inspect reads one row with them, a list page
 *    the rows of a range, a break the row it locks.
 *  - The waiters a lock shows are its live T_queue entries (those whose
 *    waiter's connection holds the entry's lock), as before.
 *  - List: one SELECT per page, the rows after the cursor's name within
 *    the prefix's range (`name` is VARBINARY: compared as bytes, by a
 *    range, never LIKE), in the primary key's order, at most `limit`,
 *    then one SELECT of the live queue entries of that range. The cursor
 *    is the last row read, hex-encoded.
 *  - Break: one transaction locks the row (SELECT ... FOR UPDATE), reads
 *    it as inspect does and who holds the user-level locks its waiters
 *    sleep on (the gate of an exclusive hold, the hold locks of read
 *    holds and permits), clears every hold (token and N kept) and
 *    commits; then those sessions are killed, which lets go of their
 *    locks: the oldest waiter is granted the gate (or a drain its hold
 *    lock) and takes the free row, as after a release.
 */
#include "mysql_int.h"

#include "cursor.h"
#include "hex.h"

#include <mysqld_error.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sessions a break kills at most (a name's live read holds: one each). */
#define KILLS_MAX 1024

/* The server's clock in µs at the statement's start. */
#define NOW_US MY_US(NOW)

/* ------------------------------------------------------------------------ */
/* Kill lists (fuzz/fuzz_mysql.c)                                           */
/* ------------------------------------------------------------------------ */

/* The session ids of a break's kill list (a number, or numbers separated
 * by commas: GROUP_CONCAT's), into ids[]: how many (at most max), each
 * once; anything else in the text ends it. */
static size_t kill_ids(const char *s, unsigned long long *ids, size_t max)
{
    size_t n = 0;

    while (s && *s && n < max) {
        unsigned long long v = 0;
        const char *p = s;
        int dup = 0;
        int over = 0;
        while (*p >= '0' && *p <= '9' && !over) {
            unsigned d = (unsigned)(*p++ - '0');
            over = v > (ULLONG_MAX - d) / 10;
            v = v * 10 + d;
        }
        if (over || p == s || (*p && *p != ','))
            break;
        for (size_t i = 0; i < n; i++)
            dup |= ids[i] == v;
        if (!dup && v > 0)
            ids[n++] = v;
        s = *p ? p + 1 : p;
    }
    return n;
}

/* ------------------------------------------------------------------------ */
/* A lock row as dlock_info                                                 */
/* ------------------------------------------------------------------------ */

/* The columns (INFO_*) that describe the lock row of alias `t`. On a table
 * without the columns of read holds and permits, those are constants. */
enum {
    INFO_HELD,    /* a live lease */
    INFO_HOLDER,  /* its description */
    INFO_TOKEN,
    INFO_TTL,     /* ms left */
    INFO_FOR,     /* ms held */
    INFO_SHARED,  /* held by readers or permits (either form) */
    INFO_PERMITS, /* a semaphore's N */
    INFO_LIVE,    /* live read holds or permits */
    INFO_DESC,    /* a live one's description */
    INFO_SFOR,    /* ms since the earliest live one started */
    INFO_N
};

static char *info_cols(const my_store *ms)
{
    const char *base =
        "t.owner IS NOT NULL AND t.lock_until > " NOW ", t.holder, t.token, "
        "TIMESTAMPDIFF(MICROSECOND, " NOW ", t.lock_until) DIV 1000, "
        "TIMESTAMPDIFF(MICROSECOND, t.locked_at, " NOW ") DIV 1000, ";

    if (!ms->rw)
        return dlock__mysql_stmt("%s0, 0, 0, NULL, NULL", base);
    /* the holds of either form as one object (MY_HOLDS_OF) */
    return dlock__mysql_stmt(
        "%s" MY_SHARED_ANY("t.owner") ", t.permits, (SELECT COUNT(*) FROM "
        "JSON_TABLE(" MY_HOLDS_OF("t.") ", " MY_HOLDERS_COLS ") j WHERE j.e "
        "> " NOW_US "), (SELECT MIN(j.d) FROM JSON_TABLE(" MY_HOLDS_OF("t.")
        ", " MY_HOLDERS_COLS ") j WHERE j.e > " NOW_US "), (SELECT (" NOW_US
        " - MIN(j.s)) DIV 1000 FROM JSON_TABLE(" MY_HOLDS_OF("t.") ", "
        MY_HOLDERS_COLS ") j WHERE j.e > " NOW_US ")",
        base);
}

/* Fills *out (zeroed, ttl_ms and held_ms -1) from a row of info_cols()
 * at row[0..INFO_N); *kinds: held by readers or permits (the waiters'
 * kinds are then shown). */
static void info_row(MYSQL_ROW row, dlock_info *out, int *kinds)
{
    int held = row[INFO_HELD] && !strcmp(row[INFO_HELD], "1");
    int shared = row[INFO_SHARED] && !strcmp(row[INFO_SHARED], "1");
    long long permits = row[INFO_PERMITS] ? atoll(row[INFO_PERMITS]) : 0;
    long long live = row[INFO_LIVE] ? atoll(row[INFO_LIVE]) : 0;

    out->token = row[INFO_TOKEN] ? strtoull(row[INFO_TOKEN], NULL, 10) : 0;
    out->permits = permits; /* a free semaphore's row keeps its N */
    *kinds = 0;
    if (shared) {
        *kinds = 1;
        held = held && live > 0;
        out->holders = held ? live : 0;
        out->shared = held && permits == 0;
    } else {
        out->holders = held;
        if (held)
            out->permits = 0;
    }
    if (!held)
        return;
    out->held = 1;
    out->ttl_ms = row[INFO_TTL] ? strtoll(row[INFO_TTL], NULL, 10) : -1;
    out->held_ms = row[INFO_FOR] ? strtoll(row[INFO_FOR], NULL, 10) : -1;
    if (!shared || live == 1)
        snprintf(out->holder, sizeof(out->holder), "%s",
                 shared ? (row[INFO_DESC] ? row[INFO_DESC] : "")
                        : (row[INFO_HOLDER] ? row[INFO_HOLDER] : ""));
    else if (permits)
        snprintf(out->holder, sizeof(out->holder), "%lld of %lld permits",
                 live, permits);
    else
        snprintf(out->holder, sizeof(out->holder), "%lld readers", live);
    if (shared && live == 1 && row[INFO_SFOR])
        out->held_ms = strtoll(row[INFO_SFOR], NULL, 10);
}

/* Does a queue entry's description say its kind? */
static int has_kind(const char *d)
{
    return !strncmp(d, "read: ", 6) || !strncmp(d, "write: ", 7) ||
           !strncmp(d, "permit: ", 8);
}

/* The waiters' kinds: once readers or permits use the name (or a waiter
 * says its kind), an entry without one is a writer's. */
static int add_waiter(dlock_info *out, const char *desc, int kinds)
{
    char line[300];

    if (kinds && !has_kind(desc)) {
        snprintf(line, sizeof(line), "write: %s", desc);
        desc = line;
    }
    return dlock__info_add_waiter(out, desc);
}

/* The waiters of the names in a range, in one SELECT:
 *  - kind 0: the live queue entries (listed waiters: fair ones, readers,
 *    permits, writers that met them; alive while their waiter's session
 *    holds the entry's lock), by name then arrival: name, description,
 *    the waiter's session;
 *  - kind 1: the sessions asleep in a user-level lock inside a statement
 *    on our table (every waiter at the gate, listed or not: a writer in
 *    default mode is not listed): its text (which names the lock as a hex
 *    literal), its session. information_schema.PROCESSLIST shows only the
 *    sessions of our own MySQL user without the PROCESS privilege.
 * Columns: kind, name, text, session, seq. */
typedef struct my_waits {
    MYSQL_RES *r;
    uint64_t nq, n; /* rows [0, nq) kind 0, [nq, n) kind 1 */
    char *unlisted; /* per row of kind 1: its session holds no entry */
    uint64_t qi;    /* the entries of names before the next one: passed */
} my_waits;

static char *waits_sql(const my_store *ms, const char *lo, const char *hi)
{
    char *lock = dlock__mysql_entry_lock_of(ms, "seq");
    char *tbl = dlock__mysql_hexlit(ms->t, strlen(ms->t));
    char *sql = lock && tbl
                    ? dlock__mysql_stmt(
                          "SELECT 0, name, holder, IS_USED_LOCK(%s), seq FROM "
                          "%s WHERE name >= %s AND name <= %s AND "
                          "IS_USED_LOCK(%s) IS NOT NULL UNION ALL SELECT 1, "
                          "NULL, INFO, ID, 0 FROM information_schema."
                          "PROCESSLIST WHERE STATE LIKE '%%user lock%%' AND "
                          "DB = DATABASE() AND LOCATE(%s, INFO) > 0 ORDER BY "
                          "1, 2, 5",
                          lock, ms->q, lo, hi, lock, tbl)
                    : NULL;

    free(lock);
    free(tbl);
    return sql;
}

static void waits_free(my_waits *w)
{
    if (w->r)
        mysql_free_result(w->r);
    free(w->unlisted);
    memset(w, 0, sizeof(*w));
}

/* Takes over r (waits_sql()'s answer). DLOCK_OK or DLOCK_ENOMEM. */
static int waits_load(my_waits *w, MYSQL_RES *r)
{
    MYSQL_ROW row;

    memset(w, 0, sizeof(*w));
    w->r = r;
    w->n = r && mysql_num_fields(r) >= 5 ? mysql_num_rows(r) : 0;
    for (w->nq = 0; w->nq < w->n; w->nq++) {
        mysql_data_seek(r, w->nq);
        row = mysql_fetch_row(r);
        if (!row || !row[0] || strcmp(row[0], "0"))
            break;
    }
    if (w->n > w->nq && !(w->unlisted = calloc(w->n - w->nq, 1)))
        return dlock__mysql_enomem();
    for (uint64_t i = w->nq; i < w->n; i++) {
        int listed = 0;
        mysql_data_seek(r, i);
        row = mysql_fetch_row(r);
        char id[32];
        snprintf(id, sizeof(id), "%s", row && row[3] ? row[3] : "");
        for (uint64_t j = 0; j < w->nq && !listed && id[0]; j++) {
            mysql_data_seek(r, j);
            MYSQL_ROW e = mysql_fetch_row(r);
            listed = e && e[3] && !strcmp(e[3], id);
        }
        w->unlisted[i - w->nq] = !listed && id[0];
    }
    return DLOCK_OK;
}

/* How entry row i sorts against name[0..len), in the server's order of
 * VARBINARY (bytes, then the shorter first). */
static int entry_cmp(const my_waits *w, uint64_t i, const char *name,
                     size_t len)
{
    MYSQL_ROW row;
    unsigned long *lens;

    mysql_data_seek(w->r, i);
    row = mysql_fetch_row(w->r);
    lens = row ? mysql_fetch_lengths(w->r) : NULL;
    if (!row || !lens || !row[1])
        return -1;
    size_t m = lens[1];
    int c = memcmp(row[1], name, m < len ? m : len);
    return c ? c : (m > len) - (m < len);
}

/* Fills out's queue (the listed waiters, in order) and waiters (those,
 * and the unlisted sessions asleep on name[0..len)). Names are asked in
 * the order of the range. `kinds`: held by readers or permits. */
static int waits_fill(my_waits *w, const char *name, size_t len, int kinds,
                      dlock_info *out)
{
    MYSQL_ROW row;
    uint64_t from;
    int rc = DLOCK_OK;
    char *needle = malloc(2 * len + 4);

    if (!needle)
        return dlock__mysql_enomem();
    while (w->qi < w->nq && entry_cmp(w, w->qi, name, len) < 0)
        w->qi++;
    from = w->qi;
    while (w->qi < w->nq && entry_cmp(w, w->qi, name, len) == 0)
        w->qi++;
    for (uint64_t i = from; i < w->qi && !kinds; i++) {
        mysql_data_seek(w->r, i);
        row = mysql_fetch_row(w->r);
        kinds = row && row[2] && has_kind(row[2]);
    }
    for (uint64_t i = from; i < w->qi && rc == DLOCK_OK; i++) {
        mysql_data_seek(w->r, i);
        row = mysql_fetch_row(w->r);
        rc = add_waiter(out, row && row[2] ? row[2] : "", kinds);
    }
    out->waiters = (int64_t)out->queue_len;
    /* the statement of a waiter at the gate names the lock as X'<hex>' */
    needle[0] = 'X';
    needle[1] = '\'';
    dlock__hex(name, len, needle + 2);
    needle[2 * len + 2] = '\'';
    needle[2 * len + 3] = '\0';
    for (uint64_t i = w->nq; i < w->n && rc == DLOCK_OK; i++) {
        unsigned long *lens;
        if (!w->unlisted[i - w->nq])
            continue;
        mysql_data_seek(w->r, i);
        row = mysql_fetch_row(w->r);
        lens = row ? mysql_fetch_lengths(w->r) : NULL;
        if (row && lens && row[2] &&
            memmem(row[2], lens[2], needle, 2 * len + 3))
            out->waiters++;
    }
    free(needle);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* dlock_inspect()                                                          */
/* ------------------------------------------------------------------------ */

int dlock__mysql_inspect(void *st, const char *name, size_t len,
                         dlock_info *out, int64_t op_deadline)
{
    my_store *ms = st;
    char *hn = dlock__mysql_hexlit(name, len);
    char *cols = info_cols(ms), *sql = NULL;
    MYSQL_RES *r = NULL;
    MYSQL_ROW row;
    int rc, kinds = 0;

    out->ttl_ms = -1;
    out->held_ms = -1;
    if (hn && cols)
        sql = dlock__mysql_stmt("SELECT %s FROM %s t WHERE t.name = %s", cols,
                                ms->t, hn);
    rc = sql ? dlock__mysql_query_pooled(ms, sql, op_deadline, &r, NULL, NULL,
                                         "reading the lock")
             : dlock__mysql_enomem();
    free(sql);
    free(cols);
    if (rc == DLOCK_OK && r && mysql_num_fields(r) >= INFO_N &&
        (row = mysql_fetch_row(r)) != NULL)
        info_row(row, out, &kinds);
    if (r)
        mysql_free_result(r);
    r = NULL;
    if (rc == DLOCK_OK) {
        my_waits w;
        sql = waits_sql(ms, hn, hn);
        rc = sql ? dlock__mysql_query_pooled(ms, sql, op_deadline, &r, NULL,
                                             NULL, "reading the queue")
                 : dlock__mysql_enomem();
        free(sql);
        memset(&w, 0, sizeof(w));
        if (rc == DLOCK_OK)
            rc = waits_load(&w, r);
        else if (r)
            mysql_free_result(r);
        if (rc == DLOCK_OK)
            rc = waits_fill(&w, name, len, kinds, out);
        waits_free(&w);
    }
    free(hn);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* dlock_list()                                                             */
/* ------------------------------------------------------------------------ */

int dlock__mysql_list(void *st, const char *prefix, size_t plen,
                      const char *cursor, size_t limit, unsigned flags,
                      dlock_list_page *out, int64_t op_deadline)
{
    my_store *ms = st;
    unsigned char after[DLOCK_NAME_MAX], up[DLOCK_NAME_MAX];
    size_t alen, ulen = dlock__prefix_upper(prefix, plen, up);
    char *hafter = NULL, *hpre = dlock__mysql_hexlit(prefix, plen);
    char *hup = NULL, *cols = info_cols(ms), *sql = NULL;
    char *first = NULL, *last = NULL;
    MYSQL_RES *r = NULL, *q = NULL;
    MYSQL_ROW row;
    unsigned long *lens;
    uint64_t nrows = 0;
    my_waits w;
    int rc = DLOCK_OK;

    memset(&w, 0, sizeof(w));

    /* the cursor: the hex of the last row's name (my_list() makes it),
     * 1..DLOCK_NAME_MAX bytes (the name column's width) */
    if (dlock__cursor_decode(cursor, DLOCK_NAME_MAX, after, &alen) != 0) {
        rc = dlock__err(DLOCK_EINVAL,
                        "mysql %s: the cursor is not one this store made "
                        "(the hex digits of a lock name)",
                        ms->redacted);
        goto out;
    }
    hafter = dlock__mysql_hexlit((const char *)after, alen);
    hup = ulen ? dlock__mysql_hexlit((const char *)up, ulen)
               : dlock__mysql_stmt("%s", "");
    /* a range of the primary key (names compare as bytes), `limit` rows
     * read whatever they hold: bounded work, however many are free */
    if (hafter && hpre && hup && cols)
        sql = dlock__mysql_stmt("SELECT %s, t.name FROM %s t WHERE t.name > "
                                "%s AND t.name >= %s%s%s ORDER BY t.name "
                                "LIMIT %zu",
                                cols, ms->t, hafter, hpre,
                                ulen ? " AND t.name < " : "", hup, limit);
    rc = sql ? dlock__mysql_query_pooled(ms, sql, op_deadline, &r, NULL, NULL,
                                         "listing the locks")
             : dlock__mysql_enomem();
    free(sql);
    if (rc == DLOCK_OK && r && mysql_num_fields(r) < INFO_N + 1)
        rc = dlock__err(DLOCK_EPROTO, "mysql %s: a listing with too few "
                                      "columns",
                        ms->redacted);
    nrows = rc == DLOCK_OK && r ? mysql_num_rows(r) : 0;
    if (nrows > 0) {
        /* the live queue entries of the names read, in one SELECT */
        mysql_data_seek(r, 0);
        row = mysql_fetch_row(r);
        lens = mysql_fetch_lengths(r);
        first = dlock__mysql_hexlit(row[INFO_N], lens[INFO_N]);
        mysql_data_seek(r, nrows - 1);
        row = mysql_fetch_row(r);
        lens = mysql_fetch_lengths(r);
        last = dlock__mysql_hexlit(row[INFO_N], lens[INFO_N]);
        sql = first && last ? waits_sql(ms, first, last) : NULL;
        rc = sql ? dlock__mysql_query_pooled(ms, sql, op_deadline, &q, NULL,
                                             NULL, "reading the queues")
                 : dlock__mysql_enomem();
        free(sql);
        if (rc == DLOCK_OK)
            rc = waits_load(&w, q);
        else if (q)
            mysql_free_result(q);
        q = NULL;
    }
    for (uint64_t i = 0; rc == DLOCK_OK && i < nrows; i++) {
        dlock_info info;
        int kinds = 0;

        mysql_data_seek(r, i);
        row = mysql_fetch_row(r);
        lens = mysql_fetch_lengths(r);
        const char *name = row[INFO_N];
        size_t len = lens[INFO_N];
        memset(&info, 0, sizeof(info));
        info.ttl_ms = -1;
        info.held_ms = -1;
        info_row(row, &info, &kinds);
        /* its waiters (the entries are in the names' order too) */
        rc = waits_fill(&w, name, len, kinds, &info);
        /* a name no lock can have (another program's row): skipped */
        if (rc || len == 0 || len > DLOCK_NAME_MAX ||
            memchr(name, 0, len) ||
            (!(flags & DLOCK_LIST_FREE) && !info.held && info.waiters <= 0)) {
            dlock_info_clear(&info);
            continue;
        }
        rc = dlock__list_add(out, name, len, &info);
    }
    if (rc == DLOCK_OK && nrows >= limit) {
        /* a full page: more may follow, after the last row read */
        mysql_data_seek(r, nrows - 1);
        row = mysql_fetch_row(r);
        lens = mysql_fetch_lengths(r);
        out->next = malloc(2 * lens[INFO_N] + 1);
        if (!out->next)
            rc = dlock__mysql_enomem();
        else
            dlock__hex(row[INFO_N], lens[INFO_N], out->next);
    }
out:
    if (r)
        mysql_free_result(r);
    waits_free(&w);
    free(first);
    free(last);
    free(hafter);
    free(hpre);
    free(hup);
    free(cols);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* dlock_break()                                                            */
/* ------------------------------------------------------------------------ */

/* The sessions that hold what the row's waiters sleep on, as a list of
 * ids (NULL: none): an exclusive hold's gate (its holder's session, or a
 * waiter's that holds the gate while the holder lost its session: it
 * sleeps to the lease end, and is better woken too); each live read
 * hold's or permit's hold lock. Not the gate of a row that readers or
 * permits hold: a waiting writer (or a semaphore's head) holds it. */
static char *kill_col(const my_store *ms, const char *hn)
{
    char *gate = dlock__mysql_gate_of(ms, hn);
    char *hold = dlock__mysql_hold_lock_of(ms, hn, "j.o");
    char *col = NULL;

    if (gate && hold && ms->rw)
        col = dlock__mysql_stmt(
            "IF(t.owner IS NULL OR t.lock_until <= " NOW ", NULL, IF("
            MY_SHARED_ANY("t.owner") ", (SELECT GROUP_CONCAT(IS_USED_LOCK(%s))"
            " FROM JSON_TABLE(" MY_HOLDS_OF("t.") ", " MY_HOLDERS_COLS ") j "
            "WHERE j.e > " NOW_US "), IS_USED_LOCK(%s)))",
            hold, gate);
    else if (gate && hold)
        col = dlock__mysql_stmt("IF(t.owner IS NULL OR t.lock_until <= " NOW
                                ", NULL, IS_USED_LOCK(%s))",
                                gate);
    free(gate);
    free(hold);
    return col;
}

int dlock__mysql_evict(void *st, const char *name, size_t len,
                       dlock_info *out, int64_t op_deadline)
{
    my_store *ms = st;
    char *hn = dlock__mysql_hexlit(name, len);
    char *cols = info_cols(ms), *kill = hn ? kill_col(ms, hn) : NULL;
    char *sql = NULL, *q = NULL;
    unsigned long long ids[KILLS_MAX];
    size_t nids = 0;
    MYSQL_RES *r = NULL;
    MYSQL_ROW row;
    my_conn *cn = NULL;
    int rc, kinds = 0;

    if (op_deadline > dlock__now_ms() + ms->timeout_ms)
        op_deadline = dlock__now_ms() + ms->timeout_ms;
    if (!hn || !cols || !kill) {
        rc = dlock__mysql_enomem();
        goto out;
    }
    rc = dlock__mysql_conn_get(ms, op_deadline, &cn);
    if (rc)
        goto out;
    /* the row locked, read, and who to wake: nothing changes it until
     * the COMMIT (a release, a renewal, a take wait for its lock) */
    sql = dlock__mysql_stmt("START TRANSACTION; SELECT %s, %s FROM %s t "
                            "WHERE t.name = %s FOR UPDATE",
                            cols, kill, ms->t, hn);
    rc = sql ? dlock__mysql_query(ms, cn, sql, op_deadline, &r, NULL, NULL,
                                  "breaking the lock")
             : dlock__mysql_enomem();
    free(sql);
    if (rc == DLOCK_OK && r && mysql_num_fields(r) > INFO_N &&
        (row = mysql_fetch_row(r)) != NULL) {
        info_row(row, out, &kinds);
        if (out->held)
            nids = kill_ids(row[INFO_N], ids, KILLS_MAX);
    }
    if (r)
        mysql_free_result(r);
    r = NULL;
    if (rc)
        goto out;
    /* cleared (a semaphore's N and the token kept) and committed; then
     * the queue as it is while its waiters still sleep */
    q = waits_sql(ms, hn, hn);
    sql = !q ? NULL
          : out->held
              ? dlock__mysql_stmt(
                    "UPDATE %s SET owner = NULL, holder = NULL, holds = 0, "
                    "lock_until = " NOW "%s WHERE name = %s; COMMIT; %s",
                    ms->t, ms->rw ? ", holders = NULL" : "", hn, q)
              : dlock__mysql_stmt("COMMIT; %s", q);
    rc = sql ? dlock__mysql_query(ms, cn, sql, op_deadline, &r, NULL, NULL,
                                  "breaking the lock")
             : dlock__mysql_enomem();
    free(sql);
    if (rc) {
        /* committed or not, the operator cannot tell: retry */
        goto out;
    }
    {
        my_waits w;
        if (waits_load(&w, r) == DLOCK_OK)
            (void)waits_fill(&w, name, len, kinds, out);
        waits_free(&w);
        r = NULL;
    }
    if (!out->held) {
        rc = DLOCK_ENOTHELD;
        goto out;
    }
    /* wake: each session that holds what a waiter sleeps on is killed;
     * the server lets go of its locks and grants them to the oldest
     * waiter. One already gone is no error; one we may not kill (another
     * user's, without CONNECTION ADMIN) leaves its waiters to the
     * evicted holder's renewal, which lets go when it finds the hold
     * gone (docs/design.md) */
    for (size_t i = 0; i < nids && !cn->broken; i++) {
        char k[48];
        snprintf(k, sizeof(k), "KILL CONNECTION %llu", ids[i]);
        (void)dlock__mysql_query(ms, cn, k, op_deadline, NULL, NULL, NULL,
                                 "waking the lock's waiters");
    }
    rc = DLOCK_OK;
out:
    if (cn) {
        /* a failed round trip may leave the transaction open: closing
         * the connection rolls it back */
        if (rc != DLOCK_OK && rc != DLOCK_ENOTHELD)
            cn->broken = 1;
        dlock__mysql_conn_put(ms, cn);
    }
    free(q);
    free(hn);
    free(cols);
    free(kill);
    return rc;
}
