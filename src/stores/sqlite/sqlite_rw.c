/* SPDX-License-Identifier: MIT */
/*
 * sqlite_rw.c -- the SQLite store's shared (read) holds and counting
 * semaphores (docs/design.md, "Shared holds and permits", its SQLite
 * paragraph): the lock row's columns for them and their statements.
 *
 * While readers or permits hold a name, its row has owner '*' (no owner
 * string can equal it), and `holders` is a JSON object with one entry per
 * hold, keyed by its owner:
 *
 *     "OWNER": [TOKEN, UNTIL_MS, START_MS, "DESCRIPTION"]
 *
 * UNTIL is that hold's own lease end on SQLite's clock; `holds` counts the
 * live entries, `holder` sums them up ("3 readers"), `permits` is the
 * semaphore's N (0: readers), and lock_until is the latest entry's end:
 * kept so by every statement here, so that a writer's take (lock_until
 * <= now) sees the name held exactly as long as a reader or a permit may
 * still hold it. An entry holds only while its end is ahead; the
 * statements that rewrite the entries drop the ended ones (a dead
 * holder's). Each change is one statement (UPDATE ... FROM the row's
 * live entries, aggregated once). Who tries when is sqlite.c's and
 * sqlite_wait.c's part.
 */
#include "sqlite.h"

#include <stdio.h>
#include <string.h>

/* The JSON path of the caller's entry (?2: its owner; owners are
 * "<client hex>:<thread>", so the quotes hold), then of its fields. */
#define MINE "'$.\"' || ?2 || '\"'"
#define MINE_AT(i) "'$.\"' || ?2 || '\"[" #i "]'"

/* The row's live entries other than the caller's (?2), aggregated once:
 * x.h their JSON object, x.n how many, x.u the latest end, x.d a
 * description (the holder's when x.n is 1), x.mine the token of the
 * caller's own live entry (NULL: none). Entries count only in a live
 * shared row. */
#define LIVE_OTHERS                                                         \
    "(SELECT json_group_object(e.key, json(e.value)) FILTER (WHERE e.key " \
    "<> ?2) AS h, count(*) FILTER (WHERE e.key <> ?2) AS n, "               \
    "max(json_extract(e.value, '$[1]')) FILTER (WHERE e.key <> ?2) AS u, "  \
    "max(json_extract(e.value, '$[3]')) FILTER (WHERE e.key <> ?2) AS d, "  \
    "max(json_extract(e.value, '$[0]')) FILTER (WHERE e.key = ?2) AS mine " \
    "FROM %1$s AS o, json_each(CASE WHEN o.owner = '*' AND o.lock_until > " \
    "%2$s THEN o.holders END) AS e WHERE o.name = ?1 AND "                  \
    "json_extract(e.value, '$[1]') > %2$s) AS x"

/* "N readers" or "N of M permits" (N > 1: one holder is its description) */
#define SUMMARY(n, permits)                                                 \
    n " || CASE WHEN " permits " > 0 THEN ' of ' || " permits               \
    " || ' permits' ELSE ' readers' END"

/* The caller's own entry is live, with its token (?3). */
#define MINE_LIVE                                                           \
    "owner = '*' AND json_extract(holders, " MINE_AT(0) ") = ?3 AND "      \
    "json_extract(holders, " MINE_AT(1) ") > %2$s"

/* A reader's or a permit's take. ?1 name, ?2 owner, ?3 ttl, ?4 its
 * description, ?5 the rowid it queued under, ?6 N (0: a reader), ?7 it
 * may join a live shared row (the head of the queue, or nobody queued).
 * A free or ended row becomes shared with our entry alone; a live one of
 * the same kind (readers; permits of the same N with room) gets our
 * entry; our own live entry is adopted (its token kept). Returns our
 * entry's token. */
static const char take_sql[] =
    "UPDATE %1$s SET owner = '*', holders = json_set(x.h, " MINE ", "
    "json_array(coalesce(x.mine, max(token + 1, " SQ_NOW_US ")), %2$s + ?3, "
    "%2$s, ?4)), holds = x.n + 1, holder = CASE WHEN x.n = 0 THEN ?4 ELSE "
    SUMMARY("(x.n + 1)", "?6") " END, token = CASE WHEN x.mine IS NULL THEN "
    "max(token + 1, " SQ_NOW_US ") ELSE token END, locked_at = CASE WHEN "
    "lock_until > %2$s THEN locked_at ELSE %2$s END, lock_until = "
    "max(coalesce(x.u, 0), %2$s + ?3), permits = ?6 FROM " LIVE_OTHERS
    " WHERE name = ?1 AND %1$s.rowid = ?5 AND (lock_until <= %2$s OR (?7 AND "
    "owner = '*' AND permits = ?6 AND (?6 = 0 OR x.n < ?6))) RETURNING "
    "json_extract(holders, " MINE_AT(0) ")";

/* Removes the caller's entry (?3 its token), only while it is live;
 * none left: the row is free (permits and token stay). Returns the live
 * entries left. */
static const char release_sql[] =
    "UPDATE %1$s SET owner = CASE WHEN x.n > 0 THEN '*' END, holders = "
    "CASE WHEN x.n > 0 THEN x.h END, holds = x.n, holder = CASE WHEN x.n = 1 "
    "THEN x.d WHEN x.n > 1 THEN " SUMMARY("x.n", "permits") " END, "
    "lock_until = coalesce(x.u, 0) FROM " LIVE_OTHERS " WHERE name = ?1 AND "
    MINE_LIVE " RETURNING holds";

/* Moves the caller's entry's end (?4: ttl) and nothing else's. */
static const char extend_sql[] =
    "UPDATE %1$s SET holders = json_set(holders, " MINE_AT(1) ", %2$s + ?4), "
    "holds = x.n + 1, holder = CASE WHEN x.n = 0 THEN json_extract(holders, "
    MINE_AT(3) ") ELSE " SUMMARY("(x.n + 1)", "permits") " END, lock_until "
    "= max(coalesce(x.u, 0), %2$s + ?4) FROM " LIVE_OTHERS " WHERE name = ?1 "
    "AND " MINE_LIVE;

/* The live entries of a row in a correlated subquery: e, from `holders`. */
#define ENTRIES                                                             \
    "json_each(CASE WHEN owner = '*' AND lock_until > %2$s THEN holders "  \
    "END) AS e WHERE json_extract(e.value, '$[1]') > %2$s"

/* After a take that got nothing: rowid, ms to the row's next end (a
 * shared row's earliest live entry's end: the waiter's timer), live,
 * shared, permits. */
static const char lease_left_sql[] =
    "SELECT rowid, coalesce((SELECT min(json_extract(e.value, '$[1]')) FROM "
    ENTRIES "), lock_until) - %2$s, lock_until > %2$s, owner = '*', permits "
    "FROM %1$s WHERE name = ?1";

/* dlock_inspect(): held, holder, token, ttl, held for, rowid, shared,
 * permits, live entries, a live entry's description. */
static const char inspect_sql[] =
    "SELECT lock_until > %2$s, holder, token, lock_until - %2$s, %2$s - "
    "locked_at, rowid, owner = '*', permits, (SELECT count(*) FROM " ENTRIES
    "), (SELECT json_extract(e.value, '$[3]') FROM " ENTRIES " LIMIT 1) "
    "FROM %1$s WHERE name = ?1";

/* Does table `table` have column `col`? 1, 0, or -1 with *rc set. */
static int has_column(sqlite3 *db, const char *table, const char *col,
                      int *rc)
{
    sqlite3_stmt *st = NULL;
    int r;

    *rc = sqlite3_prepare_v2(db, "SELECT 1 FROM pragma_table_info(?1) "
                                 "WHERE name = ?2",
                             -1, &st, NULL);
    if (*rc != SQLITE_OK)
        return -1;
    sqlite3_bind_text(st, 1, table, -1, SQLITE_STATIC);
    sqlite3_bind_text(st, 2, col, -1, SQLITE_STATIC);
    r = sqlite3_step(st);
    sqlite3_finalize(st);
    if (r == SQLITE_ROW)
        return 1;
    if (r == SQLITE_DONE)
        return 0;
    *rc = r;
    return -1;
}

int dlock__sq_migrate(sqlite3 *db, const char *table, const char *t)
{
    static const char *const cols[][2] = {
        {"holders", "TEXT"},
        {"permits", "INTEGER NOT NULL DEFAULT 0"},
    };
    char sql[512];
    int rc = SQLITE_OK;

    for (size_t i = 0; i < sizeof(cols) / sizeof(cols[0]); i++) {
        int has = has_column(db, table, cols[i][0], &rc);
        if (has < 0)
            return rc;
        if (has)
            continue;
        snprintf(sql, sizeof(sql), "ALTER TABLE %s ADD COLUMN %s %s", t,
                 cols[i][0], cols[i][1]);
        rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
        if ((rc & 0xff) == SQLITE_BUSY)
            return rc; /* run again */
        if (rc == SQLITE_OK)
            continue;
        /* another client's ALTER came first ("duplicate column name") */
        int again;
        has = has_column(db, table, cols[i][0], &again);
        if (has != 1)
            return rc;
        rc = SQLITE_OK;
    }
    return rc;
}

int dlock__sq_prepare_rw(sq_store *ss, const char *t)
{
    int rc;

    if ((rc = dlock__sq_prepare(ss, S_SH_TAKE, take_sql, t)) ||
        (rc = dlock__sq_prepare(ss, S_SH_RELEASE, release_sql, t)) ||
        (rc = dlock__sq_prepare(ss, S_SH_EXTEND, extend_sql, t)) ||
        (rc = dlock__sq_prepare(ss, S_LEASE_LEFT, lease_left_sql, t)) ||
        (rc = dlock__sq_prepare(ss, S_INSPECT, inspect_sql, t)))
        return rc;
    return DLOCK_OK;
}

void dlock__sq_bind_take(sq_store *ss, const dlock__lease *l, int64_t rowid,
                         int join)
{
    sqlite3_stmt *s = ss->st[S_SH_TAKE];

    sqlite3_bind_blob(s, 1, l->name, (int)l->name_len, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, l->owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, l->ttl_ms);
    sqlite3_bind_text(s, 4, l->desc, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 5, rowid);
    sqlite3_bind_int64(s, 6, l->kind == DLOCK__PERMIT ? l->permits : 0);
    sqlite3_bind_int(s, 7, join);
}

int dlock__sq_kind_check(const sq_store *ss, const dlock__lease *l,
                         sqlite3_stmt *s)
{
    int live = sqlite3_column_int(s, 2), shared = sqlite3_column_int(s, 3);
    long long n = sqlite3_column_int64(s, 4);

    (void)ss;
    if (!live)
        return DLOCK_OK; /* a free name binds nothing */
    if (l->kind != DLOCK__PERMIT) {
        if (shared && n > 0)
            return dlock__err(DLOCK_EINVAL,
                              "lock '%.200s' is a semaphore of %lld permits: "
                              "take a permit (dlock_options.permits = %lld, "
                              "dlock_acquire())",
                              l->name, n, n);
        return DLOCK_OK;
    }
    if (!shared)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s' is held as a lock, not as a "
                          "semaphore",
                          l->name);
    if (n == 0)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s' is held shared as a lock (readers), "
                          "not as a semaphore",
                          l->name);
    if (n != (long long)l->permits)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s' is a semaphore of %lld permits, not "
                          "%u (every handle of a name must say the same)",
                          l->name, n, l->permits);
    return DLOCK_OK;
}

/* Binds ?1 name, ?2 owner, ?3 token of statement `which`. */
static sqlite3_stmt *bind_mine(sq_store *ss, int which,
                               const dlock__lease *l)
{
    sqlite3_stmt *s = ss->st[which];

    sqlite3_bind_blob(s, 1, l->name, (int)l->name_len, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, l->owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 3, (int64_t)l->token);
    return s;
}

static int gone(const sq_store *ss)
{
    return dlock__err(DLOCK_ENOTHELD, "sqlite %s: this hold's entry is no "
                                      "longer in the lock's row (its lease "
                                      "ended)",
                      ss->redacted);
}

int dlock__sq_release_entry(sq_store *ss, const dlock__lease *l,
                            int64_t *left)
{
    sqlite3_stmt *s;
    int rc, row = 0;

    pthread_mutex_lock(&ss->mu);
    s = bind_mine(ss, S_SH_RELEASE, l);
    rc = dlock__sq_step(ss, S_SH_RELEASE, &row, "releasing the hold");
    if (rc == DLOCK_OK && row)
        *left = sqlite3_column_int64(s, 0);
    dlock__sq_done(ss, S_SH_RELEASE);
    pthread_mutex_unlock(&ss->mu);
    if (rc)
        return rc;
    return row ? DLOCK_OK : gone(ss);
}

int dlock__sq_extend_entry(sq_store *ss, const dlock__lease *l,
                           int64_t ttl_ms)
{
    sqlite3_stmt *s;
    int rc, row = 0, changed;

    pthread_mutex_lock(&ss->mu);
    s = bind_mine(ss, S_SH_EXTEND, l);
    sqlite3_bind_int64(s, 4, ttl_ms);
    rc = dlock__sq_step(ss, S_SH_EXTEND, &row, "extending the lease");
    changed = sqlite3_changes(ss->db);
    dlock__sq_done(ss, S_SH_EXTEND);
    pthread_mutex_unlock(&ss->mu);
    if (rc)
        return rc;
    return changed == 1 ? DLOCK_OK : gone(ss);
}

void dlock__sq_inspect_shared(sqlite3_stmt *s, dlock_info *out)
{
    const unsigned char *d = sqlite3_column_text(s, 9);

    out->permits = sqlite3_column_int64(s, 7);
    out->shared = out->permits == 0;
    out->holders = sqlite3_column_int64(s, 8);
    if (out->holders == 1)
        snprintf(out->holder, sizeof(out->holder), "%s",
                 d ? (const char *)d : "");
    else if (out->permits > 0)
        snprintf(out->holder, sizeof(out->holder), "%lld of %lld permits",
                 (long long)out->holders, (long long)out->permits);
    else
        snprintf(out->holder, sizeof(out->holder), "%lld readers",
                 (long long)out->holders);
}
