/* SPDX-License-Identifier: MIT */
/*
 * sqlite_rw.c -- the SQLite store's shared (read) holds and counting
 * semaphores (docs/design.md, "Shared holds and permits", its SQLite
 * paragraph): the lock row's columns for them and their statements.
 *
 * While readers or permits hold a name, its row's owner starts with '*'
 * (no owner string does). A sole holder keeps its hold in the lock's own
 * columns, as a writer does: owner '*' || its owner, its token, lease end
 * (lock_until), start (locked_at) and description (holder); so the
 * uncontended cycle is the exclusive one's two statements. Once another
 * holder comes, owner is '*' and `holders` a JSON object with one entry
 * per hold, keyed by its owner:
 *
 *     "OWNER": [TOKEN, UNTIL_MS, START_MS, "DESCRIPTION"]
 *
 * UNTIL is that hold's own lease end on SQLite's clock; `holds` counts the
 * entries (each live when written), `holder` says what holds (for an
 * older client's dlock status), `permits` is the semaphore's N (0:
 * readers), and lock_until is the latest end: kept so by every statement
 * here, so that a writer's take (lock_until <= now) sees the name held
 * exactly as long as a reader or a permit may still hold it. An entry
 * holds only while its end is ahead; the statements that rewrite the
 * entries drop the ended ones (a dead holder's). Each change is one
 * statement. Who tries when is sqlite.c's and sqlite_wait.c's part.
 */
#include "sqlite_int.h"

#include <stdio.h>
#include <string.h>

/* The JSON path of the caller's entry, then of its token and its end:
 * bound (?9, ?10, ?11), made once per hold by the client (sq_lease),
 * since SQLite computes every expression of parameters alone once at the
 * start of each statement, whichever branch needs it: concatenated in
 * SQL they cost the uncontended take 4 µs. */
#define MINE "?9"
#define MINE_AT(i) MINE_AT_##i
#define MINE_AT_0 "?10"
#define MINE_AT_1 "?11"

/* The row's two shared forms: a sole holder's ('*' || its owner, its
 * token, lease end, start and description in the lock's own columns:
 * the uncontended cycle costs the exclusive one's statements), or the
 * entries ('*', holders). SET expressions see the row as it was. */
#define SHARED "(owner >= '*' AND owner < '+')"
#define SHARED_LIVE "(" SHARED " AND lock_until > %2$s)"
#define SOLE_MINE "owner = ?8" /* ?8: '*' and our owner */
#define ENTRIES_FORM "owner = '*'"

/* An aggregate over the entries (the '*' form) other than the caller's
 * (?2) whose end is ahead. Each is a pass over the entries: only the
 * contended paths (other holders in the row) run them, inside CASE
 * branches that SQLite evaluates only when taken. (One UPDATE ... FROM
 * an aggregate computed once would read better, but SQLite materializes
 * that subquery into a temporary table: 90 µs a statement against 15 µs
 * here.) */
#define OTHERS(what)                                                        \
    "(SELECT " what " FROM json_each(holders) AS e WHERE "                 \
    "json_extract(e.value, '$[1]') > %2$s AND e.key <> ?2)"
#define OTHERS_H OTHERS("json_group_object(e.key, json(e.value))")
/* The same over the entries' ends, read in one walk of the object (each
 * entry's element 1, whose path is its entry's: ?9 quoted, as SQLite 3.40
 * writes it, ?12 not, in case another version does): no parse per
 * entry. */
#define OTHERS_END(what)                                                    \
    "(SELECT " what " FROM json_tree(holders) AS e WHERE e.key = 1 AND "   \
    "e.path NOT IN (?9, ?12) AND e.value > %2$s)"
#define OTHERS_N OTHERS_END("count(*)")
#define OTHERS_U OTHERS_END("max(e.value)")

/* The caller's entry is live in the '*' form, with its token (?3). */
#define ENTRY_MINE_LIVE                                                     \
    "json_extract(holders, " MINE_AT(1) ") > %2$s"
#define ENTRY_MINE_TOKEN "json_extract(holders, " MINE_AT(0) ")"

/* The token of the caller's own live hold (a hold whose answer was
 * lost: adopted), or NULL. */
#define MINE_TOKEN                                                          \
    "(CASE WHEN lock_until <= %2$s THEN NULL WHEN " SOLE_MINE " THEN "     \
    "token WHEN " ENTRIES_FORM " AND " ENTRY_MINE_LIVE " THEN "            \
    ENTRY_MINE_TOKEN " END)"

/* The caller's new entry (the '*' form): [token, end, start, desc]. */
#define ENTRY                                                               \
    "json_array(coalesce(" MINE_TOKEN ", max(token + 1, " SQ_NOW_US        \
    ")), %2$s + ?3, %2$s, ?4)"

/* The caller's own hold is live, with its token (?3), in either form. */
#define MINE_LIVE                                                           \
    "((" SOLE_MINE " AND token = ?3 AND lock_until > %2$s) OR ("           \
    ENTRIES_FORM " AND " ENTRY_MINE_TOKEN " = ?3 AND " ENTRY_MINE_LIVE     \
    "))"

/* Another holder than the caller holds (the row is shared and live). */
#define JOINING "(" SHARED_LIVE " AND NOT " SOLE_MINE ")"

/* Entries kept before a take drops the ended ones (a dead holder's): a
 * take or a release adds or removes its own entry without a pass over
 * the others, so ended entries stay until the row is free, or until a
 * take finds this many. */
#define ENTRIES_KEPT "16"
#define TIDY "holds >= " ENTRIES_KEPT

/* A reader's or a permit's take. ?1 name, ?2 owner, ?3 ttl, ?4 its
 * description, ?5 the rowid it queued under, ?6 N (0: a reader), ?7 it
 * may join a live shared row (the head of the queue, or nobody queued).
 * A free or ended row becomes the sole holder's (or a live one of ours
 * is adopted: its token kept); a live one of the same kind (readers;
 * permits of the same N with room) held by others gets our entry (the
 * sole holder's made an entry). `holds` counts the entries, ended ones
 * too: a permit's room is counted over the live ones only when the
 * entries look full. `holder` in the '*' form says what holds, for an
 * older client's dlock status. Returns our token. */
static const char take_sql[] =
    "UPDATE %1$s SET owner = CASE WHEN " JOINING " THEN '*' ELSE ?8 END, "
    "holders = CASE WHEN NOT " JOINING " THEN NULL WHEN " ENTRIES_FORM
    " THEN json_set(CASE WHEN " TIDY " THEN " OTHERS_H " ELSE holders END, "
    MINE ", " ENTRY ") ELSE json_object(substr(owner, 2), json_array(token, "
    "lock_until, locked_at, holder), ?2, " ENTRY ") END, holds = CASE WHEN "
    "NOT " JOINING " THEN 1 WHEN " ENTRIES_FORM " THEN (CASE WHEN " TIDY
    " THEN " OTHERS_N " ELSE holds - (json_type(holders, " MINE ") IS NOT "
    "NULL) END) + 1 ELSE 2 END, holder = CASE WHEN NOT " JOINING " THEN ?4 "
    "WHEN ?6 > 0 THEN 'permits' ELSE 'readers' END, token = CASE WHEN "
    MINE_TOKEN " IS NULL THEN max(token + 1, " SQ_NOW_US ") ELSE token END, "
    "locked_at = CASE WHEN lock_until > %2$s THEN locked_at ELSE %2$s END, "
    "lock_until = CASE WHEN NOT " JOINING " THEN %2$s + ?3 ELSE "
    "max(lock_until, %2$s + ?3) END, permits = ?6, ticket = 0 WHERE name = "
    "?1 AND rowid "
    "= ?5 AND (lock_until <= %2$s OR " SOLE_MINE " OR (?7 AND " SHARED " AND "
    "permits = ?6 AND (?6 = 0 OR " MINE_TOKEN " IS NOT NULL OR (CASE WHEN "
    "NOT " ENTRIES_FORM " THEN 1 WHEN holds < ?6 THEN holds ELSE " OTHERS_N
    " END) < ?6))) RETURNING CASE WHEN holders IS NULL THEN token ELSE "
    ENTRY_MINE_TOKEN " END";

/* Removes the caller's hold (?3 its token), only while it is live; none
 * live left: the row is free (lock_until 0; permits and token stay). The
 * sole holder's release costs the exclusive one's statement (no RETURNING
 * either: it costs a temporary table, 4 µs a statement here); with
 * others, one pass over the entries for the latest live end. */
#define MORE "(" ENTRIES_FORM " AND holds > 1)"
static const char release_sql[] =
    "UPDATE %1$s SET owner = CASE WHEN " MORE " THEN owner END, holder = "
    "CASE WHEN " MORE " THEN holder END, holders = CASE WHEN " MORE " THEN "
    "json_remove(holders, " MINE ") END, lock_until = CASE WHEN " MORE
    " THEN coalesce(" OTHERS_U ", 0) ELSE 0 END, holds = CASE WHEN " MORE
    " THEN holds - 1 ELSE 0 END WHERE name = ?1 AND " MINE_LIVE;

/* Moves the caller's end (?4: ttl) and nothing else's; lock_until
 * becomes the latest live end. */
static const char extend_sql[] =
    "UPDATE %1$s SET holders = CASE WHEN " ENTRIES_FORM " THEN "
    "json_set(holders, " MINE_AT(1) ", %2$s + ?4) END, lock_until = CASE "
    "WHEN " MORE " THEN max(coalesce(" OTHERS_U ", 0), %2$s + ?4) ELSE %2$s "
    "+ ?4 END WHERE name = ?1 AND " MINE_LIVE;

/* The live entries' ends of a row in the '*' form, in a correlated
 * subquery (e.value: an end, e.path: its entry's path). */
#define ENTRIES                                                             \
    "json_tree(holders) AS e WHERE e.key = 1 AND e.value > %2$s"

/* After a take that got nothing: rowid, ms to the row's next end (in the
 * '*' form the earliest live entry's end: the waiter's timer), live,
 * shared, permits, ticket (a break's mark when negative). */
static const char lease_left_sql[] =
    "SELECT rowid, CASE WHEN " ENTRIES_FORM " AND lock_until > %2$s THEN "
    "coalesce((SELECT min(e.value) FROM " ENTRIES "), "
    "lock_until) ELSE lock_until END - %2$s, lock_until > %2$s, " SHARED ", "
    "permits, ticket FROM %1$s WHERE name = ?1";

/* dlock_inspect()'s columns (SQ_COL_*): held, holder, token, ttl, held
 * for, rowid, shared, permits, live holds, a live holder's description,
 * the holder's ticket (dlock_break()'s), the name (dlock_list()'s). */
#define INSPECT_COLS                                                        \
    "lock_until > %2$s, holder, token, lock_until - %2$s, %2$s - "         \
    "locked_at, rowid, " SHARED_LIVE ", permits, CASE WHEN NOT " SHARED_LIVE \
    " THEN 0 WHEN " ENTRIES_FORM " THEN (SELECT count(*) FROM " ENTRIES ") "\
    "ELSE 1 END, CASE WHEN NOT " SHARED_LIVE " THEN NULL WHEN " ENTRIES_FORM \
    " THEN (SELECT json_extract(holders, e.path || '[3]') FROM " ENTRIES     \
    " LIMIT 1) ELSE holder END, ticket, name"
static const char inspect_sql[] =
    "SELECT " INSPECT_COLS " FROM %1$s WHERE name = ?1";

/* dlock_list()'s page: the rows after ?1 from ?2 on (the prefix), in the
 * order of the primary key's index, at most ?3; `_UP`: below ?4 too (the
 * first name above the prefix's range). Names are BLOBs, compared as
 * bytes (memcmp): no collation, no LIKE. */
#define LIST_SQL                                                            \
    "SELECT " INSPECT_COLS " FROM %1$s WHERE name > ?1 AND name >= ?2"
static const char list_sql[] = LIST_SQL " ORDER BY name LIMIT ?3";
static const char list_up_sql[] =
    LIST_SQL " AND name < ?4 ORDER BY name LIMIT ?3";

/* dlock_break()'s clearing of every hold (sole, entries): the token and a
 * semaphore's N stay; an exclusive holder's ticket becomes the mark that
 * lets its successor pass it (its negative). */
static const char evict_sql[] =
    "UPDATE %1$s SET owner = NULL, holder = NULL, holds = 0, lock_until = "
    "0, holders = NULL, ticket = CASE WHEN ticket > 0 THEN -ticket ELSE 0 "
    "END WHERE name = ?1";

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
        {"ticket", "INTEGER NOT NULL DEFAULT 0"},
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

int dlock__sq_prepare_operate(sq_store *ss, const char *t)
{
    int rc;

    if ((rc = dlock__sq_prepare(ss, S_LIST, list_sql, t)) ||
        (rc = dlock__sq_prepare(ss, S_LIST_UP, list_up_sql, t)) ||
        (rc = dlock__sq_prepare(ss, S_EVICT, evict_sql, t)))
        return rc;
    return DLOCK_OK;
}

/* Binds what the statements of l's hold compare: ?8 '*' and its owner
 * (a sole holder's owner column), ?9 ?10 ?11 the JSON paths of its entry,
 * its token and its end, ?12 its entry's path unquoted (owners are
 * "<client hex>:<thread>": the quotes hold). Made once per hold, kept in
 * the lease for SQLITE_STATIC. */
static void bind_owner(sqlite3_stmt *s, const dlock__lease *l)
{
    sq_lease *sl = l->priv;

    if (sl->star[0] != '*') {
        snprintf(sl->star, sizeof(sl->star), "*%s", l->owner);
        snprintf(sl->path, sizeof(sl->path), "$.\"%s\"", l->owner);
        snprintf(sl->path0, sizeof(sl->path0), "$.\"%s\"[0]", l->owner);
        snprintf(sl->path1, sizeof(sl->path1), "$.\"%s\"[1]", l->owner);
        snprintf(sl->bare, sizeof(sl->bare), "$.%s", l->owner);
    }
    sqlite3_bind_text(s, 8, sl->star, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 9, sl->path, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 10, sl->path0, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 11, sl->path1, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 12, sl->bare, -1, SQLITE_STATIC);
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
    bind_owner(s, l);
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
    bind_owner(s, l);
    return s;
}

static int gone(const sq_store *ss)
{
    return dlock__err(DLOCK_ENOTHELD, "sqlite %s: this hold's entry is no "
                                      "longer in the lock's row (its lease "
                                      "ended)",
                      ss->redacted);
}

int dlock__sq_release_entry(sq_store *ss, const dlock__lease *l)
{
    int rc, row = 0, changed;

    pthread_mutex_lock(&ss->mu);
    bind_mine(ss, S_SH_RELEASE, l);
    rc = dlock__sq_step(ss, S_SH_RELEASE, &row, "releasing the hold");
    changed = sqlite3_changes(ss->db);
    dlock__sq_done(ss, S_SH_RELEASE);
    pthread_mutex_unlock(&ss->mu);
    if (rc)
        return rc;
    return changed == 1 ? DLOCK_OK : gone(ss);
}

int dlock__sq_extend_entry(sq_store *ss, const dlock__lease *l,
                           int64_t ttl_ms, int64_t deadline)
{
    sqlite3_stmt *s;
    int rc, row = 0, changed;

    pthread_mutex_lock(&ss->mu);
    dlock__sq_bound(ss, deadline);
    s = bind_mine(ss, S_SH_EXTEND, l);
    sqlite3_bind_int64(s, 4, ttl_ms);
    rc = dlock__sq_step(ss, S_SH_EXTEND, &row, "extending the lease");
    changed = sqlite3_changes(ss->db);
    dlock__sq_done(ss, S_SH_EXTEND);
    dlock__sq_bound(ss, 0);
    pthread_mutex_unlock(&ss->mu);
    if (rc)
        return rc;
    return changed == 1 ? DLOCK_OK : gone(ss);
}

void dlock__sq_inspect_shared(sqlite3_stmt *s, dlock_info *out)
{
    const unsigned char *d = sqlite3_column_text(s, SQ_COL_DESC);

    out->permits = sqlite3_column_int64(s, SQ_COL_PERMITS);
    out->shared = out->permits == 0;
    out->holders = sqlite3_column_int64(s, SQ_COL_LIVE);
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
