/* SPDX-License-Identifier: MIT */
/*
 * pg_sql.c -- the PostgreSQL store's SQL (pg.c is the store, pg.h what
 * they share): quoted names, the texts of its statements in both modes,
 * and the table mode's schema, created at open when missing.
 */
#include "pg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Identifiers and literals                                                 */
/* ------------------------------------------------------------------------ */

/* "name" with embedded quotes doubled: any table name is one identifier. */
void dlock__pg_quote_ident(const char *in, const char *suffix, char *out,
                           size_t cap)
{
    size_t o = 0;
    char both[PG_TABLE_MAX + 16];

    snprintf(both, sizeof(both), "%s%s", in, suffix);
    out[o++] = '"';
    for (const char *p = both; *p && o + 3 < cap; p++) {
        if (*p == '"')
            out[o++] = '"';
        out[o++] = *p;
    }
    out[o++] = '"';
    out[o] = '\0';
}

/* 'text' with embedded single quotes doubled. */
void dlock__pg_quote_literal(const char *in, char *out, size_t cap)
{
    size_t o = 0;

    out[o++] = '\'';
    for (; *in && o + 3 < cap; in++) {
        if (*in == '\'')
            out[o++] = '\'';
        out[o++] = *in;
    }
    out[o++] = '\'';
    out[o] = '\0';
}

/* ------------------------------------------------------------------------ */
/* Statements and schema                                                    */
/* ------------------------------------------------------------------------ */

void dlock__pg_names_of(const char *table, pg_names *nm)
{
    dlock__pg_quote_ident(table, "", nm->t, sizeof(nm->t));
    dlock__pg_quote_ident(table, "_waiters", nm->w, sizeof(nm->w));
    dlock__pg_quote_ident(table, "_waiters_name", nm->wi, sizeof(nm->wi));
    dlock__pg_quote_ident(table, "_release", nm->rel, sizeof(nm->rel));
    dlock__pg_quote_ident(table, "_leave", nm->leave, sizeof(nm->leave));
    dlock__pg_quote_ident(table, "_unlock", nm->unlock, sizeof(nm->unlock));
    dlock__pg_quote_ident(table, "_ahead", nm->ahead, sizeof(nm->ahead));
    dlock__pg_quote_ident(table, "_abandon", nm->abandon,
                          sizeof(nm->abandon));
    dlock__pg_quote_ident(table, "_earliest", nm->earliest,
                          sizeof(nm->earliest));
    dlock__pg_quote_ident(table, "_break", nm->brk, sizeof(nm->brk));
}

/* fmt with %1$s the table, %2$s the waiters table, %3$s the sequence
 * literal, %4$s the release function of older clients, %5$s the leaving
 * function of older clients, %6$s the release function, %7$s the
 * queue's fresh look, %8$s the leaving function, %9$s the earliest live
 * entry's end, %10$s the break function. */
static char *sql_of(const char *fmt, const pg_names *nm, const char *s)
{
    size_t cap = strlen(fmt) + 8 * (strlen(nm->t) + strlen(nm->w) +
                                    strlen(s) + strlen(nm->rel) +
                                    strlen(nm->leave) +
                                    strlen(nm->unlock) +
                                    strlen(nm->ahead) +
                                    strlen(nm->abandon) +
                                    strlen(nm->earliest) +
                                    strlen(nm->brk)) + 64;
    char *out = malloc(cap);

    if (out)
        snprintf(out, cap, fmt, nm->t, nm->w, s, nm->rel, nm->leave,
                 nm->unlock, nm->ahead, nm->abandon, nm->earliest, nm->brk);
    return out;
}

static int set_sql(pg_store *ps, int which, int nparams, const char *fmt,
                   const pg_names *nm, const char *s)
{
    if (!(ps->sql[which] = sql_of(fmt, nm, s)))
        return dlock__pg_enomem();
    ps->nparams[which] = nparams;
    return DLOCK_OK;
}

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

int dlock__pg_build_statements(pg_store *ps, const pg_names *nm, const char *s)
{
    int rc = 0;

    /* $1 name, $2 owner, $3 ttl ms, $4 holder; a caller that will wait:
     * $5 its client id, $6 its waiter number, $7 and $8 its client's
     * listening session (pid, backend_start); else NULL.
     * A take-over (the lease ended) draws its token in the UPDATE, while
     * it holds the row: one drawn before (in VALUES) could be older than a
     * hold that came between, and tokens would go backwards. A row that is
     * already ours and live is adopted as it is (token kept, lease only
     * lengthened): an earlier try whose answer was lost took it, the lock
     * was handed to us, or this statement is that late try and the owner
     * holds the lock again. ON CONFLICT DO UPDATE locks the row even when
     * its WHERE is false, so the queue entry is committed before any
     * release can lock the row and look for waiters. A row held by
     * readers or permits (owner '*') is busy until its last entry's end
     * (lock_until); on a live semaphore the writer is refused (the last
     * column, read by snapshot) and not queued. The writer's timer is the
     * row's lease end, or when readers or permits hold the earliest live
     * entry's end (a dead one's: the last live reader's release, before
     * it, granted nothing), through T_earliest: a function called only
     * then, where an inline sub-select costs every uncontended take
     * (measured: 8% of the cycle). */
#define ENDED "t.lock_until <= " NOW
#define KEEP_OR(col, new_)                                                  \
    col " = CASE WHEN " ENDED " THEN " new_ " ELSE t." col " END"
#define UPSERT_SET(take)                                                    \
    " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, "            \
    KEEP_OR("holder", "excluded.holder") ", holds = 1, "                    \
    KEEP_OR("token", "nextval(%3$s)") ", "                                  \
    KEEP_OR("locked_at", "excluded.locked_at") ", lock_until = CASE WHEN "  \
    ENDED " THEN excluded.lock_until ELSE greatest(t.lock_until, "          \
    "excluded.lock_until) END WHERE (" take ") OR t.owner = "              \
    "excluded.owner"
/* the earliest live entry's end of a shared row, in ms from now */
#define EARLIEST(h, ms)                                                     \
    "((SELECT min((x.value ->> 'u')::bigint) FROM jsonb_each(" h ") x "     \
    "WHERE (x.value ->> 'u')::bigint > " ms ") - " ms ")"
#define SEMAPHORE_LIVE "owner = '*' AND permits > 0 AND lock_until > " NOW
    rc = rc ? rc
            : set_sql(ps, S_ACQUIRE, 8,
                      "WITH ins AS (INSERT INTO %1$s AS t (name, owner, "
                      "holder, holds, token, locked_at, lock_until) VALUES "
                      "($1, $2, $4, 1, nextval(%3$s), " NOW ", " NOW
                      " + $3 * interval '1 millisecond')" UPSERT_SET(ENDED)
                      " RETURNING token), "
                      "del AS (DELETE FROM %2$s WHERE name = $1 AND client "
                      "= $5 AND waiter = $6 AND EXISTS (SELECT 1 FROM ins)), "
                      "enq AS (INSERT INTO %2$s (name, client, waiter, "
                      "owner, holder, ttl_ms, pid, since) SELECT $1, $5, "
                      "$6, $2, $4, $3, $7, $8::timestamptz WHERE $5 IS NOT "
                      "NULL AND NOT EXISTS (SELECT 1 FROM ins) AND NOT "
                      "EXISTS (SELECT 1 FROM %2$s WHERE name = $1 AND "
                      "client = $5 AND waiter = $6 AND pid = $7) AND NOT "
                      "EXISTS (SELECT 1 FROM %1$s WHERE name = $1 AND "
                      SEMAPHORE_LIVE ") RETURNING seq) "
                      "SELECT (SELECT token FROM ins), r.l, (SELECT seq "
                      "FROM enq), r.n FROM (SELECT 1) o LEFT JOIN LATERAL "
                      "(SELECT CASE WHEN owner = '*' THEN %9$s(holders, "
                      NOW_MS ") - " NOW_MS " ELSE " MS_LEFT("lock_until")
                      " END AS l, CASE WHEN " SEMAPHORE_LIVE " THEN permits "
                      "END AS n FROM %1$s WHERE name = $1) r ON true",
                      nm, s);
    /* A read hold or a permit (docs/design.md, "Shared holds and
     * permits", PostgreSQL table mode): $1 to $8 as above, $9 the
     * semaphore's N (0: a read hold). The conflict rewrites the row
     * always (no WHERE), from one sub-select that reads its latest
     * version (the lock is held: READ COMMITTED re-reads it) and draws
     * at most one token (k), so RETURNING sees the row as it now is:
     * our token (held: taken, or adopted), the earliest live end (the
     * timer) and the row's kind (NULL free, -1 a lock held, 0 readers,
     * N a semaphore). Counts come from the row only; the queue (ahead:
     * a live entry of another owner before ours, any when we have none)
     * is read by snapshot. */
#define C_MS "(SELECT ms FROM c)"
#define LIVE_U(x) "(" x ".value ->> 'u')::bigint > c.ms"
#define ENTRY(tok)                                                          \
    "jsonb_build_object($2, jsonb_build_object('t', " tok ", 'u', c.ms + "  \
    "$3, 's', c.ms, 'd', $4))"
#define MISMATCH(kind)                                                      \
    "CASE WHEN $9 = 0 THEN coalesce(" kind ", 0) > 0 ELSE coalesce(" kind   \
    ", $9) <> $9 END"
    rc = rc ? rc
            : set_sql(
                  ps, S_TAKE, 9,
                  "WITH c AS (SELECT ts, floor(extract(epoch FROM ts) * "
                  "1000)::bigint AS ms FROM (SELECT " NOW " AS ts) x), "
                  "me AS (SELECT coalesce(min(seq), 9223372036854775807) AS s "
                  "FROM %2$s WHERE name = $1 AND client = $5 AND waiter = $6 "
                  "AND pid = $7), "
                  "ins AS (INSERT INTO %1$s AS t (name, owner, holds, token, "
                  "locked_at, lock_until, holders, permits) SELECT $1, '*', "
                  "1, k.v, c.ts, to_timestamp((c.ms + $3) / 1000.0), "
                  ENTRY("k.v") ", $9 FROM c, (SELECT nextval(%3$s) AS v) k "
                  "ON CONFLICT (name) DO UPDATE SET (owner, holder, holds, "
                  "token, locked_at, lock_until, holders, permits) = ("
                  "SELECT CASE WHEN d.take THEN '*' ELSE t.owner END, "
                  "CASE WHEN d.take THEN NULL ELSE t.holder END, "
                  "CASE WHEN d.take THEN d.n + 1 ELSE t.holds END, "
                  "coalesce(k.v, t.token), "
                  "CASE WHEN d.take AND d.free THEN c.ts ELSE t.locked_at "
                  "END, "
                  "CASE WHEN d.take THEN to_timestamp(greatest(d.mx, c.ms + "
                  "$3) / 1000.0) WHEN d.mine THEN greatest(t.lock_until, "
                  "to_timestamp((c.ms + $3) / 1000.0)) ELSE t.lock_until "
                  "END, "
                  "CASE WHEN d.take THEN d.kept || " ENTRY("k.v")
                  " WHEN d.mine THEN jsonb_set(t.holders, ARRAY[$2, 'u'], "
                  "to_jsonb(greatest((t.holders -> $2 ->> 'u')::bigint, "
                  "c.ms + $3))) ELSE t.holders END, "
                  "CASE WHEN d.take THEN $9 ELSE t.permits END "
                  "FROM c, LATERAL (SELECT e.n, e.mx, e.kept, f.free, "
                  "f.mine, NOT f.mine AND (f.free OR (f.room AND NOT (EXISTS "
                  "(SELECT 1 FROM %2$s w WHERE w.name = $1 AND w.owner <> $2 "
                  "AND w.seq < (SELECT s FROM me) AND "
                  ALIVE("w", "split_part($2, ':', 1)") ") AND %7$s($1, $2, "
                  "(SELECT s FROM me))))) AS take "
                  "FROM (SELECT count(*)::int AS n, coalesce(max((x.value "
                  "->> 'u')::bigint), 0) AS mx, coalesce(jsonb_object_agg("
                  "x.key, x.value), '{}') AS kept FROM jsonb_each(CASE WHEN "
                  "t.owner = '*' THEN t.holders END) x WHERE " LIVE_U("x")
                  ") e, LATERAL (SELECT t.owner IS NULL OR t.lock_until <= "
                  "c.ts AS free, t.owner = '*' AND t.permits = $9 AND "
                  "coalesce((t.holders -> $2 ->> 'u')::bigint > c.ms, false) "
                  "AS mine, t.owner = '*' AND t.lock_until > c.ts AND "
                  "t.permits = $9 AND ($9 = 0 OR e.n < $9) AS room) f) d, "
                  "LATERAL (SELECT CASE WHEN d.take THEN nextval(%3$s) END "
                  "AS v) k) "
                  "RETURNING CASE WHEN t.owner = '*' AND t.permits = $9 AND "
                  "(t.holders -> $2 ->> 'u')::bigint > " C_MS " THEN "
                  "(t.holders -> $2 ->> 't')::bigint END AS tok, "
                  "CASE WHEN t.owner = '*' THEN " EARLIEST("t.holders", C_MS)
                  " ELSE " MS_LEFT("t.lock_until") " END AS l, "
                  "CASE WHEN t.owner IS NULL OR t.lock_until <= (SELECT ts "
                  "FROM c) THEN NULL WHEN t.owner = '*' THEN t.permits ELSE "
                  "-1 END AS kind, t.holds AS n), "
                  "del AS (DELETE FROM %2$s WHERE name = $1 AND client = $5 "
                  "AND waiter = $6 AND EXISTS (SELECT 1 FROM ins WHERE tok "
                  "IS NOT NULL)), "
                  "enq AS (INSERT INTO %2$s (name, client, waiter, owner, "
                  "holder, ttl_ms, pid, since, kind, permits) SELECT $1, $5, "
                  "$6, $2, $4, $3, $7, $8::timestamptz, CASE WHEN $9 > 0 "
                  "THEN 2 ELSE 1 END, $9 FROM ins WHERE $5 IS NOT NULL AND "
                  "ins.tok IS NULL AND NOT " MISMATCH("ins.kind") " AND NOT "
                  "EXISTS (SELECT 1 FROM %2$s WHERE name = $1 AND client = "
                  "$5 AND waiter = $6 AND pid = $7) RETURNING seq) "
                  "SELECT tok, l, kind, (SELECT seq FROM enq), n FROM ins",
                  nm, s);
    /* The uncontended read hold or permit, in a statement as light as the
     * writer's: the row free (or its lease ended), or held by readers (a
     * semaphore of this N with room) with no queue entry for the name at
     * all and no entry of ours: take it (a new entry, a token drawn under
     * the row's lock). Anything else (the row busy, a queue, an entry of
     * ours to adopt, another kind) takes nothing and returns no row, and
     * the caller runs S_TAKE, which decides every case. A queue is seen
     * before the row is locked (the source row is not made at all): an
     * arrival behind a waiting writer then locks the row once, in S_TAKE,
     * not twice (with 8 readers and a writer, every lock of the one row
     * is a turn the releases wait for). Times are the
     * statement's arrival (statement_timestamp(): the lease starts no
     * earlier than the caller sent it; another's end is read as live a
     * moment longer), not the clock after waiting for the row. Same
     * parameters as S_TAKE ($5 to $8 unused). */
#define STMT_MS "floor(date_part('epoch', statement_timestamp()) * 1000)::bigint"
#define FAST_FREE "(t.owner IS NULL OR t.lock_until <= statement_timestamp())"
#define FAST_ENTRY                                                          \
    "jsonb_build_object($2, jsonb_build_object('t', k.v, 'u', " STMT_MS     \
    " + $3, 's', " STMT_MS ", 'd', $4))"
#define FAST_END "to_timestamp((" STMT_MS " + $3) / 1000.0)"
    rc = rc ? rc
            : set_sql(
                  ps, S_TAKE_FAST, 9,
                  "INSERT INTO %1$s AS t (name, owner, holds, token, "
                  "locked_at, lock_until, holders, permits) SELECT $1, '*', "
                  "1, k.v, statement_timestamp(), " FAST_END ", " FAST_ENTRY
                  ", $9 FROM (SELECT nextval(%3$s) AS v) k WHERE NOT EXISTS "
                  "(SELECT 1 FROM %2$s WHERE name = $1) "
                  "ON CONFLICT (name) DO UPDATE SET (owner, holder, holds, "
                  "token, locked_at, lock_until, holders, permits) = (SELECT "
                  "'*', NULL, CASE WHEN " FAST_FREE " THEN 1 ELSE t.holds + "
                  "1 END, k.v, CASE WHEN " FAST_FREE " THEN "
                  "statement_timestamp() ELSE t.locked_at END, CASE WHEN "
                  FAST_FREE " THEN " FAST_END " ELSE greatest(t.lock_until, "
                  FAST_END ") END, CASE WHEN " FAST_FREE " THEN " FAST_ENTRY
                  " ELSE t.holders || " FAST_ENTRY " END, $9 FROM (SELECT "
                  "nextval(%3$s) AS v) k) "
                  "WHERE (" FAST_FREE " OR (t.owner = '*' AND t.permits = $9 "
                  "AND NOT t.holders ? $2 AND ($9 = 0 OR jsonb_array_length("
                  "jsonb_path_query_array(t.holders, '$.* ? (@.u > $m)', "
                  "jsonb_build_object('m', " STMT_MS "))) < $9))) "
                  "RETURNING token, holds, $5::text IS NULL AND $6 > 0 AND "
                  "$7 IS NULL AND $8 IS NULL",
                  nm, s);
    /* $1 name, $2 owner, $3 token: ok, and the grants "CLIENT:WAITER:TOKEN
     * ..." (space-separated; '' none) */
    rc = rc ? rc
            : set_sql(ps, S_RELEASE, 3,
                      "SELECT ok, grants FROM %6$s($1, $2, $3)", nm, s);
    /* A read hold's release while another live read hold remains: no
     * waiter can proceed then (a writer waits for every reader, a reader
     * waits only behind a writer), so no grant step and no function: one
     * UPDATE, guarded by owner, token and a live end, checked on the
     * row's latest version. No row changed: the caller calls T_unlock.
     * $1 name, $2 owner, $3 token */
    rc = rc ? rc
            : set_sql(ps, S_RELEASE_READ, 3,
                      "UPDATE %1$s t SET holders = t.holders - $2, holds = "
                      "greatest(t.holds - 1, 1), lock_until = to_timestamp(("
                      "SELECT max((x.value ->> 'u')::bigint) FROM jsonb_each("
                      "t.holders - $2) x) / 1000.0) FROM (SELECT floor("
                      "date_part('epoch', " NOW ") * 1000)::bigint AS ms) c "
                      "WHERE t.name = $1 AND t.owner = '*' AND t.permits = 0 "
                      "AND (t.holders -> $2 ->> 't')::bigint = $3 AND "
                      "(t.holders -> $2 ->> 'u')::bigint > c.ms AND "
                      "jsonb_path_exists(t.holders - $2, '$.* ? (@.u > $m)', "
                      "jsonb_build_object('m', c.ms))",
                      nm, s);
    /* $1 name, $2 owner, $3 token, $4 ttl ms */
    rc = rc ? rc
            : set_sql(ps, S_EXTEND, 4,
                      "UPDATE %1$s SET lock_until = " NOW " + $4 * interval "
                      "'1 millisecond' WHERE name = $1 AND owner = $2 AND "
                      "token = $3 AND lock_until > " NOW,
                      nm, s);
    /* the same for a reader's or a permit's entry: only its own end
     * moves; lock_until follows the latest entry's end */
    rc = rc ? rc
            : set_sql(ps, S_EXTEND_SHARED, 4,
                      "UPDATE %1$s t SET holders = jsonb_set(t.holders, "
                      "ARRAY[$2, 'u'], to_jsonb(c.ms + $4)), lock_until = "
                      "to_timestamp(greatest(c.ms + $4, (SELECT max((x.value "
                      "->> 'u')::bigint) FROM jsonb_each(t.holders) x WHERE "
                      "x.key <> $2)) / 1000.0) FROM (SELECT floor(extract("
                      "epoch FROM " NOW ") * 1000)::bigint AS ms) c WHERE "
                      "t.name = $1 AND t.owner = '*' AND (t.holders -> $2 ->> "
                      "'t')::bigint = $3 AND (t.holders -> $2 ->> 'u')::bigint "
                      "> c.ms",
                      nm, s);
    /* What dlock_inspect() says of a row, in the columns i0..i8: held,
     * holder, token, ttl, held for, shared form, permits, live entries,
     * the earliest live entry's description. The same text in S_INSPECT,
     * S_LIST (each lock of a page) and T_break (the view just before), t
     * the row */
    rc = rc ? rc
            : set_sql(ps, S_INSPECT, 1,
                      "SELECT " PG_INSPECT_COLS("t") " FROM %1$s t WHERE "
                      "t.name = $1",
                      nm, s);
    /* the live queue: seq, the waiter's description, its kind */
    rc = rc ? rc
            : set_sql(ps, S_QUEUE, 2,
                      "SELECT w.seq, w.holder, w.kind FROM %2$s w WHERE "
                      "w.name = $1 AND " ALIVE("w", "$2") " ORDER BY w.seq",
                      nm, s);
    /* dlock_list(): $1 the last name of the previous page ('' none), $2
     * and $3 the prefix's range [lo, hi), $4 the most rows looked at, $5
     * the most locks listed, $6 free ones too, $7 our client id. One
     * statement, one snapshot: the rows after $1 in the range, at most
     * $4 of them by the index (c: the page's bounded work), of which at
     * most $5 held or waited for (p), each with its S_INSPECT columns and
     * its live queue (one row per waiter, in order). The first two
     * columns tell where the look stopped: how many rows it saw (e.k:
     * $4 when more may follow) and the last one's name */
    rc = rc ? rc
            : set_sql(ps, S_LIST, 7,
                      "WITH c AS (SELECT t.* FROM %1$s t WHERE t.name > $1 "
                      "AND t.name >= $2 AND t.name < $3 ORDER BY t.name "
                      "LIMIT $4), "
                      "e AS (SELECT count(*) AS k, (SELECT c2.name FROM c c2 "
                      "ORDER BY c2.name DESC LIMIT 1) AS m FROM c), "
                      "p AS (SELECT c.name, " PG_INSPECT_COLS("c") " FROM c "
                      "WHERE $6 OR (c.owner IS NOT NULL AND c.lock_until > "
                      NOW ") OR EXISTS (SELECT 1 FROM %2$s w WHERE w.name = "
                      "c.name AND " ALIVE("w", "$7") ") ORDER BY c.name "
                      "LIMIT $5) "
                      "SELECT e.k, encode(e.m, 'hex'), encode(p.name, "
                      "'hex'), p.i0, p.i1, p.i2, p.i3, p.i4, p.i5, p.i6, "
                      "p.i7, p.i8, q.seq, q.holder, q.kind FROM e LEFT JOIN "
                      "p ON true LEFT JOIN LATERAL (SELECT w.seq, w.holder, "
                      "w.kind FROM %2$s w WHERE w.name = p.name AND "
                      ALIVE("w", "$7") ") q ON true ORDER BY p.name, q.seq",
                      nm, s);
    /* dlock_break(): $1 name, $2 our client id. T_break's answer (the
     * row's S_INSPECT columns just before, then the grants), with the
     * live queue the statement's snapshot saw before it (a statement
     * does not see what the functions it calls change) */
    rc = rc ? rc
            : set_sql(ps, S_BREAK, 2,
                      "SELECT b.*, q.seq, q.holder, q.kind FROM %10$s($1, "
                      "$2) b LEFT JOIN LATERAL (SELECT w.seq, w.holder, "
                      "w.kind FROM %2$s w WHERE w.name = $1 AND "
                      ALIVE("w", "$2") ") q ON true ORDER BY q.seq",
                      nm, s);
    /* A woken waiter's look (docs/design.md, "PostgreSQL table mode:
     * hand-over", Confirmation), read only: no transaction id, no WAL.
     * $1 name, $2 owner, $3 client id, $4 waiter number, $5 the pid of
     * the client's listening session, $6 the kind (-1 write, 0 read, N a
     * permit of N). The token of a live hold of the owner's of that kind
     * (what the upsert would adopt) and its lease left (rounded down:
     * the local end it gives is never late); the lease left of
     * what holds the row (the try's timer); 1 when the waiter's entry of
     * that session is still queued. One row, even with no lock row */
    rc = rc ? rc
            : set_sql(ps, S_CONFIRM, 6,
                      "SELECT CASE WHEN $6 < 0 THEN CASE WHEN t.owner = $2 "
                      "AND t.lock_until > " NOW " THEN t.token END WHEN "
                      "t.owner = '*' AND t.permits = $6 AND (t.holders -> "
                      "$2 ->> 'u')::bigint > " NOW_MS " THEN (t.holders -> "
                      "$2 ->> 't')::bigint END, CASE WHEN $6 < 0 THEN "
                      "floor(extract(epoch FROM t.lock_until - " NOW ") * "
                      "1000)::bigint ELSE (t.holders -> $2 ->> 'u')::bigint "
                      "- ceil(extract(epoch FROM " NOW ") * 1000)::bigint "
                      "END, CASE WHEN t.owner = "
                      "'*' THEN %9$s(t.holders, " NOW_MS ") - " NOW_MS
                      " WHEN t.owner IS NOT NULL THEN " MS_LEFT("t.lock_until")
                      " END, EXISTS (SELECT 1 FROM %2$s w WHERE w.name = $1 "
                      "AND w.client = $3 AND w.waiter = $4 AND w.pid = $5)"
                      "::int FROM (SELECT 1) o LEFT JOIN %1$s t ON t.name = "
                      "$1",
                      nm, s);
    /* $1 name, $2 owner, $3 client id, $4 waiter number, $5 ttl ms, $6
     * the kind (-1 write, 0 read, N a permit of N) */
    rc = rc ? rc
            : set_sql(ps, S_LEAVE, 6,
                      "SELECT %8$s($1, $2, $3, $4, $5, $6)", nm, s);
    rc = rc ? rc
            : set_sql(ps, S_GC, 1,
                      "DELETE FROM %1$s WHERE lock_until <= " NOW " - $1 * "
                      "interval '1 millisecond'",
                      nm, s);
    rc = rc ? rc
            : set_sql(ps, S_GC_QUEUE, 1,
                      "DELETE FROM %2$s w WHERE NOT " ALIVE("w", "$1"), nm,
                      s);
    /* advisory: $1 name [, $2 holder]; exclusive and shared (read). A
     * name that a semaphore holds (its family key held) is not taken: the
     * third column is that semaphore's N (0: not known) */
/* the witness key first (pg.h, ADV_W: a break that looks at this moment
 * sees the name's key only with it), let go of when the try fails */
#define ADV_TRY(fn)                                                         \
    "WITH w AS (SELECT pg_try_advisory_lock(" ADV_W_OWN("$1") ") AS w), "   \
    "l AS (SELECT " fn "(" KEY("$1") ") AS ok, w FROM w), n AS (SELECT "    \
    "CASE WHEN ok THEN nextval(%3$s) END AS t, CASE WHEN w AND NOT ok THEN " \
    "pg_advisory_unlock(" ADV_W_OWN("$1") ") END AS u FROM l) SELECT t, "   \
    "CASE WHEN t IS NOT NULL THEN set_config('application_name', 'dlock ' " \
    "|| t || ' ' || $2, false) END FROM n"
/* a release takes the name's break key shared first (pg.h, ADV_B), lets
 * go of the name's key, then of the witness (pg.h, ADV_W; held unless an
 * intruder held it first, which the unlock then only warns about) */
#define ADV_UNLOCK(fn)                                                      \
    "SELECT u, c FROM (SELECT pg_advisory_xact_lock_shared(" ADV_B("$1")    \
    ") AS b, " fn "(" KEY("$1") ") AS u, pg_advisory_unlock("               \
    ADV_W_OWN("$1") ") AS w, set_config('application_name', 'dlock', "      \
    "false) AS c) x"
    rc = rc ? rc
            : set_sql(ps, S_ADV_TRY, 2, ADV_TRY("pg_try_advisory_lock"), nm,
                      s);
    rc = rc ? rc
            : set_sql(ps, S_ADV_TRY_SHARED, 2,
                      ADV_TRY("pg_try_advisory_lock_shared"), nm, s);
    rc = rc ? rc
            : set_sql(ps, S_ADV_UNLOCK, 1, ADV_UNLOCK("pg_advisory_unlock"),
                      nm, s);
    rc = rc ? rc
            : set_sql(ps, S_ADV_UNLOCK_SHARED, 1,
                      ADV_UNLOCK("pg_advisory_unlock_shared"), nm, s);
    rc = rc ? rc
            : set_sql(ps, S_ADV_CHECK, 1,
                      "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE "
                      "l.pid = pg_backend_pid() AND l.granted AND "
                      ADV_KEY_IS(KEY("$1")) ")",
                      nm, s);
    /* holders of the lock (k 0), of a semaphore's permits (k 1: its
     * family key) and its gate (k 2: the head granted, the others
     * waiting), each with its session's application_name */
    rc = rc ? rc
            : set_sql(ps, S_ADV_INSPECT, 1,
                      "SELECT l.granted, coalesce(a.application_name, ''), "
                      "floor(extract(epoch FROM " NOW " - a.state_change) * "
                      "1000)::bigint, l.pid, l.mode = 'ShareLock', w.k FROM "
                      "(VALUES (" KEY("$1") ", 0), (" ADV_F("$1") ", 1), ("
                      ADV_G("$1") ", 2)) w(key, k) JOIN pg_locks l ON "
                      ADV_KEY_IS("w.key") " LEFT JOIN pg_stat_activity a ON "
                      "a.pid = l.pid ORDER BY w.k, l.granted DESC, "
                      "a.query_start",
                      nm, s);
    /* A permit (docs/design.md, "PostgreSQL advisory mode semaphores"):
     * $1 name, $2 holder, $3 N, $4 the slot already won (NULL: take the
     * first free one), $5 let go of the gate when done. Under the check
     * key: a lock held (locked), a semaphore of another N (other: its N,
     * read from a holder's application_name: a holder of this N that is
     * dying may still hold the family key a moment after N's), else a
     * slot, the family keys shared, a token. Answers slot, token, locked,
     * other. N's own key is looked at first: a release lets go of the
     * family key before N's, so a semaphore of N whose N key is free has
     * let go of its family key too (no check key needed in the
     * release). */
    rc = rc ? rc
            : set_sql(
                  ps, S_ADV_SEM_TRY, 5,
                  "WITH c AS (SELECT 1 AS one FROM (SELECT "
                  "pg_advisory_xact_lock(" ADV_C("$1") ")) x), "
                  "d AS (SELECT CASE WHEN (SELECT one FROM c) = 1 THEN "
                  ADV_HELD(KEY("$1")) " END AS locked, "
                  ADV_HELD(ADV_FN("$1", "$3")) " AS same), "
                  "e AS (SELECT locked, CASE WHEN NOT same AND "
                  ADV_SHARED_HELD(ADV_F("$1")) " THEN " ADV_OTHER_N("$1", "$3")
                  " END AS other FROM d), "
                  "s AS (SELECT locked, other, CASE WHEN locked OR other IS "
                  "NOT NULL THEN NULL ELSE coalesce($4, "
                  "(SELECT i FROM generate_series(1, $3) i WHERE "
                  "pg_try_advisory_lock(" ADV_SLOT("$1", "$3", "i") ") LIMIT "
                  "1)) END AS slot FROM e), "
                  "t AS (SELECT s.*, CASE WHEN slot IS NOT NULL THEN (SELECT "
                  "nextval(%3$s) FROM (SELECT pg_try_advisory_lock("
                  ADV_W_OWN("$1") "), pg_advisory_lock_shared("
                  ADV_F("$1") "), pg_advisory_lock_shared(" ADV_FN("$1", "$3")
                  ")) y) END AS tok FROM s) "
                  "SELECT slot, tok, locked, other, CASE WHEN tok IS NOT NULL "
                  "THEN "
                  "set_config('application_name', left('dlock ' || tok || "
                  "' s' || $3 || ' ' || $2, 63), false) END, CASE WHEN $4 IS "
                  "NOT NULL AND tok IS NULL THEN pg_advisory_unlock("
                  ADV_SLOT("$1", "$3", "$4") ") END, CASE WHEN $5 AND (tok IS "
                  "NOT NULL OR locked OR other IS NOT NULL) THEN "
                  "pg_advisory_unlock("
                  ADV_G("$1") ") END FROM t",
                  nm, s);
    /* $1 name, $2 N, $3 slot: the family key, then N's, then the slot
     * (a holder takes them the other way round), then the witness: a session holds the
     * family key only while it holds a slot, and N's only while it holds
     * the family key. Answers whether the slot was held (first column) */
    rc = rc ? rc
            : set_sql(ps, S_ADV_SEM_UNLOCK, 3,
                      "SELECT u, c FROM (SELECT "
                      "pg_advisory_xact_lock_shared(" ADV_B("$1") ") AS b, "
                      "pg_advisory_unlock_shared("
                      ADV_F("$1") ") AS f, pg_advisory_unlock_shared("
                      ADV_FN("$1", "$2") ") AS n, pg_advisory_unlock("
                      ADV_SLOT("$1", "$2", "$3") ") AS u, "
                      "pg_advisory_unlock(" ADV_W_OWN("$1") ") AS w, "
                      "set_config('application_name', 'dlock', false) AS c) "
                      "x",
                      nm, s);
    rc = rc ? rc
            : set_sql(ps, S_ADV_SEM_CHECK, 3,
                      "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE "
                      "l.pid = pg_backend_pid() AND l.granted AND "
                      ADV_KEY_IS(ADV_SLOT("$1", "$2", "$3")) ")",
                      nm, s);
    return rc;
}

/* The table mode's schema: the lock table, the waiters' queue and the
 * functions that release (handing the lock over) and leave the queue
 * (docs/design.md, "PostgreSQL table mode: hand-over" and "Shared holds
 * and permits"). Each statement of a function sees what committed before
 * it: once the row is locked, every queue entry appended under that
 * row's lock is visible. %1$s T, %2$s T_waiters, %3$s the sequence
 * literal, %4$s T_release, %5$s T_leave, %6$s the sequence, %7$s the
 * queue's index, %8$s T_unlock, %9$s T_ahead, %10$s the look at open
 * (true: nothing to do), %11$s T_abandon, %12$s T_earliest, %13$s
 * T_break. */
#define PG_SCHEMA_LOCK_MS "200"

/* The row's state in variables: own (NULL free, '*' readers or permits,
 * else the exclusive owner), h (live entries), cnt, mx (their latest
 * end), perm, tk (the last token), hol, lat, lu. Drops the entries whose
 * end has passed; none left: free. */
#define DROP_DEAD                                                           \
    " IF h <> '{}' THEN"                                                    \
    "  SELECT coalesce(jsonb_object_agg(x.key, x.value), '{}'), count(*), " \
    "coalesce(max((x.value ->> 'u')::bigint), 0) INTO h, cnt, mx FROM "     \
    "jsonb_each(h) x WHERE (x.value ->> 'u')::bigint > ms;"                 \
    " END IF;"                                                              \
    " IF cnt = 0 THEN own := NULL; h := NULL; END IF;"
/* The grant step: the queue in order while its head can proceed. Dead
 * entries and the caller's own (o: left by its earlier waits) are
 * deleted; an entry of the wrong kind for the row is left where it is.
 * Each grant: a token, its own lease, its entries deleted, one
 * notification, and "CLIENT:WAITER:TOKEN " appended to `grants`. An
 * entry whose owner holds this kind already (a try of its, or a grant to
 * an earlier entry of its, crossed this wait) is told of that hold: its
 * token, the end lengthened to the entry's ttl from now. */
#define GRANT_STEP                                                          \
    " IF own IS NULL OR own = '*' THEN"                                     \
    " FOR w IN SELECT * FROM %2$s WHERE name = n ORDER BY seq LOOP"         \
    "  IF w.owner = o OR NOT " ALIVE("w", "me") " THEN"                    \
    "   dels := dels || w.seq; CONTINUE;"                                   \
    "  END IF;"                                                             \
    "  IF own = '*' AND h ? w.owner AND w.kind <> 0 AND (w.kind = 2) = "    \
    "(perm > 0) AND (w.kind = 1 OR w.permits = perm) THEN"                  \
    "   v := (h -> w.owner ->> 't')::bigint;"                               \
    "   h := jsonb_set(h, ARRAY[w.owner, 'u'], to_jsonb(greatest((h -> "    \
    "w.owner ->> 'u')::bigint, ms + w.ttl_ms)));"                           \
    "   mx := greatest(mx, ms + w.ttl_ms);"                                 \
    "  ELSIF own = w.owner AND w.kind = 0 THEN"                             \
    "   v := tk; lu := greatest(lu, ts + w.ttl_ms * interval "              \
    "'1 millisecond');"                                                     \
    "  ELSE"                                                                \
    "  EXIT WHEN own IS NOT NULL AND own <> '*';"                           \
    "  IF w.kind = 0 THEN"                                                  \
    "   EXIT WHEN own = '*' AND perm = 0;"                                  \
    "   CONTINUE WHEN own = '*';"                                           \
    "   v := nextval(%3$s);"                                                \
    "   own := w.owner; hol := w.holder; lat := ts; lu := ts + w.ttl_ms * " \
    "interval '1 millisecond'; perm := 0; h := NULL; cnt := 1;"             \
    "  ELSE"                                                                \
    "   IF own = '*' THEN"                                                  \
    "    CONTINUE WHEN (w.kind = 2) <> (perm > 0) OR (w.kind = 2 AND "      \
    "w.permits <> perm) OR h ? w.owner;"                                    \
    "    EXIT WHEN w.kind = 2 AND cnt >= perm;"                             \
    "   ELSE"                                                               \
    "    own := '*'; perm := CASE WHEN w.kind = 2 THEN w.permits ELSE 0 "   \
    "END; h := '{}'; cnt := 0; mx := 0; lat := ts; hol := NULL;"            \
    "   END IF;"                                                            \
    "   v := nextval(%3$s);"                                                \
    "   h := h || jsonb_build_object(w.owner, jsonb_build_object('t', v, "  \
    "'u', ms + w.ttl_ms, 's', ms, 'd', w.holder));"                         \
    "   cnt := cnt + 1; mx := greatest(mx, ms + w.ttl_ms);"                 \
    "  END IF;"                                                             \
    "  tk := v;"                                                            \
    "  END IF;"                                                             \
    "  gone := gone || (w.client || ':' || w.waiter);"                      \
    "  PERFORM pg_notify('dlock_' || w.client, 'g ' || w.waiter || ' ' || " \
    "v);"                                                                   \
    "  grants := grants || w.client || ':' || w.waiter || ':' || v || ' ';" \
    " END LOOP;"                                                            \
    " END IF;"
#define WRITE_ROW                                                           \
    " UPDATE %1$s SET owner = own, holder = CASE WHEN own <> '*' THEN hol " \
    "END, holds = CASE WHEN own IS NULL THEN 0 WHEN own = '*' THEN cnt "    \
    "ELSE 1 END, token = tk, locked_at = lat, lock_until = CASE WHEN own = "\
    "'*' THEN to_timestamp(mx / 1000.0) ELSE lu END, holders = CASE WHEN "  \
    "own = '*' THEN h END, permits = perm WHERE name = n;"                  \
    " IF cardinality(dels) > 0 OR cardinality(gone) > 0 THEN"               \
    "  DELETE FROM %2$s WHERE name = n AND (seq = ANY (dels) OR client || " \
    "':' || waiter = ANY (gone));"                                          \
    " END IF;"
#define STATE_VARS                                                          \
    "r record; w record; ts timestamptz; ms bigint; own text; h jsonb; cnt " \
    "integer := 0; mx bigint := 0; perm integer; tk bigint; hol text; lat " \
    "timestamptz; lu timestamptz; dels bigint[] := '{}'; gone text[] := "   \
    "'{}'; v bigint; "
/* the row locked: the time, read after waiting for the lock (a lease
 * given from an earlier time would end before its holder's own reckoning
 * of it) */
#define LOCK_ROW                                                            \
    " SELECT * INTO r FROM %1$s WHERE name = n FOR UPDATE;"                 \
    " ts := " NOW "; ms := floor(date_part('epoch', ts) * 1000)::bigint;"
/* dlock_break(): the function fn (T_break; %13$s in schema_sql). With
 * the row locked, the view just before (the S_INSPECT columns); then, if
 * it is held, every hold taken away at once: the exclusive owner, every
 * reader's or permit's entry (the row is free, a semaphore's N kept as a
 * release keeps it), the last token kept (tokens come from the sequence:
 * the next hold's is greater anyway); then the release's grant step, so
 * that the head of the queue gets the lock now, with one notification to
 * its client. `grants` as T_unlock's. c is the breaking client's id (its
 * own session's entries are alive if they are its own); no entry is its
 * owner's (o ''). */
#define BREAK_FN(fn)                                                        \
    "CREATE OR REPLACE FUNCTION " fn "(n bytea, c text, OUT i0 boolean, "    \
    "OUT i1 text, OUT i2 bigint, OUT i3 bigint, OUT i4 bigint, OUT i5 "     \
    "boolean, OUT i6 integer, OUT i7 bigint, OUT i8 text, OUT grants text) " \
    "LANGUAGE plpgsql AS $f$ DECLARE " STATE_VARS "me text := c; o text := " \
    "''; BEGIN"                                                             \
    " grants := '';"                                                        \
    LOCK_ROW                                                                \
    " IF r.name IS NULL THEN i0 := false; RETURN; END IF;"                  \
    " SELECT " PG_INSPECT_COLS("r") " INTO i0, i1, i2, i3, i4, i5, i6, i7, " \
    "i8;"                                                                   \
    " IF NOT i0 THEN RETURN; END IF;"                                       \
    " own := NULL; perm := CASE WHEN r.owner = '*' THEN r.permits ELSE 0 "  \
    "END; tk := r.token; lat := r.locked_at; lu := ts;"                     \
    GRANT_STEP                                                              \
    WRITE_ROW                                                               \
    " END $f$; "
static const char schema_sql[] =
    /* creators take turns; each looks again (%10$s: the look at open)
     * and changes nothing when another made it meanwhile. ALTER TABLE
     * waits for the statements running on the table, and those that
     * started before it may wait for it in turn (they lock the tables in
     * another order): it gives up first (lock_timeout, below the
     * server's deadlock_timeout of 1 s) and the opener tries again */
    "SELECT pg_advisory_xact_lock(" KEY("'dlock schema'::bytea") "); "
    "SET LOCAL lock_timeout = " PG_SCHEMA_LOCK_MS "; "
    "DO $do$ BEGIN IF %10$s THEN RETURN; END IF; "
    "CREATE SEQUENCE IF NOT EXISTS %6$s; "
    "CREATE TABLE IF NOT EXISTS %1$s ("
    " name bytea PRIMARY KEY,"
    " owner text,"
    " holder text,"
    " holds integer NOT NULL DEFAULT 0,"
    " token bigint NOT NULL DEFAULT 0,"
    " locked_at timestamptz NOT NULL DEFAULT " NOW ","
    " lock_until timestamptz NOT NULL DEFAULT " NOW ","
    " holders jsonb,"
    " permits integer NOT NULL DEFAULT 0); "
    /* a table of an earlier version */
    "ALTER TABLE %1$s ADD COLUMN IF NOT EXISTS holders jsonb, ADD COLUMN "
    "IF NOT EXISTS permits integer NOT NULL DEFAULT 0; "
    "CREATE TABLE IF NOT EXISTS %2$s ("
    " seq bigserial PRIMARY KEY,"
    " name bytea NOT NULL,"
    " client text NOT NULL,"
    " waiter bigint NOT NULL,"
    " owner text NOT NULL,"
    " holder text,"
    " ttl_ms bigint NOT NULL,"
    " pid integer NOT NULL,"
    " since timestamptz,"
    " kind smallint NOT NULL DEFAULT 0,"
    " permits integer NOT NULL DEFAULT 0); "
    "ALTER TABLE %2$s ADD COLUMN IF NOT EXISTS kind smallint NOT NULL "
    "DEFAULT 0, ADD COLUMN IF NOT EXISTS permits integer NOT NULL DEFAULT "
    "0; "
    "CREATE INDEX IF NOT EXISTS %7$s ON %2$s (name, seq); "
    /* release: the caller's own hold (the exclusive owner, or its own live
     * entry), then the grant step; ok false: not ours, nothing written */
    "CREATE OR REPLACE FUNCTION %8$s(n bytea, o text, tok bigint, "
    "OUT ok boolean, OUT grants text) LANGUAGE plpgsql AS $f$ DECLARE p "
    "integer; q record; g bigint; BEGIN"
    " ok := false; grants := '';"
    /* the exclusive holder (p -1), or a reader or permit holder alone in
     * the row (p its N; holds counts the entries, live or ended, under
     * owner '*': every statement that adds or removes one keeps it so),
     * with nobody queued (the uncontended cycle) or a live writer of
     * another owner at the head of the queue (the exclusive hand-off, or
     * the last reader's): the previous version's statements, before the
     * state's variables cost anything (as much again). A semaphore's free
     * row keeps its N */
    " SELECT CASE WHEN owner = o THEN -1 ELSE permits END INTO p FROM %1$s "
    "WHERE name = n AND ((owner = o AND token = tok AND lock_until > " NOW
    ") OR (owner = '*' AND holds = 1 AND (holders -> o ->> 't')::bigint = "
    "tok AND (holders -> o ->> 'u')::bigint > " NOW_MS ")) FOR UPDATE;"
    " IF FOUND THEN"
    "  SELECT * INTO q FROM %2$s WHERE name = n ORDER BY seq LIMIT 1;"
    "  IF NOT FOUND THEN"
    "   UPDATE %1$s SET owner = NULL, holder = NULL, holds = 0, lock_until = "
    NOW ", holders = NULL, permits = CASE WHEN owner = '*' THEN permits "
    "ELSE 0 END WHERE name = n;"
    "   ok := true; RETURN;"
    "  END IF;"
    "  IF p <= 0 AND q.kind = 0 AND q.owner <> o AND "
    ALIVE("q", "split_part(o, ':', 1)") " THEN"
    "   g := nextval(%3$s);"
    "   UPDATE %1$s SET owner = q.owner, holder = q.holder, holds = 1, "
    "token = g, locked_at = " NOW ", lock_until = " NOW " + q.ttl_ms * "
    "interval '1 millisecond', holders = NULL, permits = 0 WHERE name = n;"
    "   DELETE FROM %2$s WHERE name = n AND client = q.client AND waiter = "
    "q.waiter;"
    "   PERFORM pg_notify('dlock_' || q.client, 'g ' || q.waiter || ' ' || "
    "g);"
    "   grants := q.client || ':' || q.waiter || ':' || g || ' ';"
    "   ok := true; RETURN;"
    "  END IF;"
    " END IF;"
    " DECLARE " STATE_VARS "me text := split_part(o, ':', 1); BEGIN"
    LOCK_ROW
    " IF r.name IS NULL THEN RETURN; END IF;"
    " IF r.owner = o AND r.token = tok AND r.lock_until > ts THEN"
    "  own := NULL; perm := 0;"
    " ELSIF r.owner = '*' AND (r.holders -> o ->> 't')::bigint = tok AND "
    "(r.holders -> o ->> 'u')::bigint > ms THEN"
    "  own := '*'; perm := r.permits; h := r.holders - o;"
    DROP_DEAD
    " ELSE RETURN;"
    " END IF;"
    " ok := true; tk := r.token; lat := r.locked_at; lu := ts;"
    GRANT_STEP
    WRITE_ROW
    " END; END $f$; "
    /* a live entry of another owner ahead of seq s, read with a snapshot
     * of its own: a reader's or permit's take calls it (a volatile
     * function's statements see what committed before them) once the
     * statement's own snapshot saw one, to tell an entry still there from
     * one that a release granted (and deleted) while the take waited for
     * the row */
    "CREATE OR REPLACE FUNCTION %9$s(n bytea, o text, s bigint) RETURNS "
    "boolean LANGUAGE plpgsql VOLATILE AS $f$ DECLARE me text := "
    "split_part(o, ':', 1); BEGIN"
    " RETURN EXISTS (SELECT 1 FROM %2$s w WHERE w.name = n AND w.owner <> o "
    "AND w.seq < s AND " ALIVE("w", "me") ");"
    " END $f$; "
    /* an older client's release: the same, answering the first grant */
    "CREATE OR REPLACE FUNCTION %4$s(n bytea, o text, tok bigint, "
    "OUT ok boolean, OUT granted text, OUT gtoken bigint) LANGUAGE plpgsql "
    "AS $f$ DECLARE g text; BEGIN"
    " SELECT u.ok, split_part(u.grants, ' ', 1) INTO ok, g FROM %8$s(n, o, "
    "tok) u;"
    " IF g <> '' THEN"
    "  granted := split_part(g, ':', 1) || ':' || split_part(g, ':', 2);"
    "  gtoken := split_part(g, ':', 3)::bigint;"
    " END IF;"
    " END $f$; "
    /* leaving (k: -1 a write hold, 0 a read hold, N a permit of N):
     * keep a hold of that kind handed meanwhile, else grant what the
     * entry held up */
    "CREATE OR REPLACE FUNCTION %11$s(n bytea, o text, c text, wt bigint, "
    "ttl bigint, k integer) RETURNS bigint LANGUAGE plpgsql AS $f$ DECLARE "
    STATE_VARS "me text := c; grants text := ''; BEGIN"
    LOCK_ROW
    " DELETE FROM %2$s WHERE name = n AND client = c AND waiter = wt;"
    " IF r.name IS NULL THEN RETURN NULL; END IF;"
    " IF k < 0 AND r.owner = o AND r.lock_until > ts THEN"
    "  UPDATE %1$s SET lock_until = greatest(lock_until, ts + ttl * "
    "interval '1 millisecond') WHERE name = n;"
    "  RETURN r.token;"
    " END IF;"
    " IF k >= 0 AND r.owner = '*' AND r.permits = k AND (r.holders -> o ->> "
    "'u')::bigint > ms THEN"
    "  UPDATE %1$s SET holders = jsonb_set(holders, ARRAY[o, 'u'], "
    "to_jsonb(greatest((holders -> o ->> 'u')::bigint, ms + ttl))), "
    "lock_until = greatest(lock_until, to_timestamp((ms + ttl) / 1000.0)) "
    "WHERE name = n;"
    "  RETURN (r.holders -> o ->> 't')::bigint;"
    " END IF;"
    " own := r.owner; perm := r.permits; tk := r.token; hol := r.holder; "
    "lat := r.locked_at; lu := r.lock_until;"
    " IF own IS NOT NULL AND lu <= ts THEN own := NULL; END IF;"
    " IF own = '*' THEN h := r.holders;" DROP_DEAD " END IF;"
    GRANT_STEP
    " IF grants <> '' THEN" WRITE_ROW " END IF;"
    " RETURN NULL;"
    " END $f$; "
    /* the earliest end among a holders object's entries that end after
     * ms (NULL: none) */
    "CREATE OR REPLACE FUNCTION %12$s(h jsonb, ms bigint) RETURNS bigint "
    "LANGUAGE sql IMMUTABLE AS $f$ SELECT min((x.value ->> 'u')::bigint) "
    "FROM jsonb_each(h) x WHERE (x.value ->> 'u')::bigint > ms $f$; "
    /* an older client's leaving: a writer's */
    "CREATE OR REPLACE FUNCTION %5$s(n bytea, o text, c text, wt bigint, "
    "ttl bigint) RETURNS bigint LANGUAGE plpgsql AS $f$ BEGIN"
    " RETURN %11$s(n, o, c, wt, ttl, -1);"
    " END $f$; "
    BREAK_FN("%13$s")
    "END $do$";

/* Creates what is missing, or adds what an earlier version's schema lacks
 * (an existing, current schema needs no CREATE right), and tells whether
 * a pooler sits in front of the server: libpq was told a backend pid that
 * is not the server's (PgBouncer makes up its own). */
int dlock__pg_ensure_schema(pg_store *ps, pg_conn *cn, const pg_names *nm,
                            int64_t deadline)
{
    char present_sql[3072], look[4096], lt[200], lw[200], lrel[200],
        lleave[200], lunlock[200], lahead[200], labandon[200],
        learliest[200];
    PGresult *r;
    int rc;

    dlock__pg_quote_literal(nm->t, lt, sizeof(lt));
    dlock__pg_quote_literal(nm->w, lw, sizeof(lw));
    dlock__pg_quote_literal(nm->rel, lrel, sizeof(lrel));
    dlock__pg_quote_literal(nm->leave, lleave, sizeof(lleave));
    dlock__pg_quote_literal(nm->unlock, lunlock, sizeof(lunlock));
    dlock__pg_quote_literal(nm->ahead, lahead, sizeof(lahead));
    dlock__pg_quote_literal(nm->abandon, labandon, sizeof(labandon));
    dlock__pg_quote_literal(nm->earliest, learliest, sizeof(learliest));
    if (ps->advisory)
        snprintf(present_sql, sizeof(present_sql),
                 "to_regclass(%s) IS NOT NULL", ps->seq_lit);
    else
        /* the tables, the sequence, the functions, and the columns of
         * shared holds (T.holders, T.permits, T_waiters.kind and
         * .permits) */
        snprintf(present_sql, sizeof(present_sql),
                 "to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS NOT "
                 "NULL AND to_regclass(%s) IS NOT NULL AND to_regproc(%s) IS "
                 "NOT NULL AND to_regproc(%s) IS NOT NULL AND to_regproc(%s) "
                 "IS NOT NULL AND to_regproc(%s) IS NOT NULL AND "
                 "to_regproc(%s) IS NOT NULL AND to_regproc(%s) IS NOT NULL "
                 "AND (SELECT "
                 "count(*) FROM pg_attribute WHERE attrelid IN ("
                 "to_regclass(%s), to_regclass(%s)) AND attname IN "
                 "('holders', 'permits', 'kind') AND attnum > 0 AND NOT "
                 "attisdropped) = 4",
                 lt, lw, ps->seq_lit, lrel, lleave, lunlock, lahead, labandon,
                 learliest, lt, lw);
    snprintf(look, sizeof(look),
             "SELECT %s, pg_backend_pid(), to_regclass(%s) IS NOT NULL",
             present_sql, ps->advisory ? ps->seq_lit : lt);
    rc = dlock__pg_run_text(ps, cn, look, deadline, &r,
                            "looking for the lock table");
    if (rc)
        return rc;
    int present = PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "t");
    int older = !present && !ps->advisory && PQntuples(r) == 1 &&
                !strcmp(PQgetvalue(r, 0, 2), "t");
    ps->behind = PQntuples(r) == 1 &&
                 atoi(PQgetvalue(r, 0, 1)) != PQbackendPID(cn->pg);
    PQclear(r);
    ps->sessions = !ps->behind ? ps->pooler != POOLER_TRANSACTION
                               : ps->pooler == POOLER_SESSION;
    ps->unnamed = (ps->behind && ps->pooler != POOLER_SESSION) ||
                  ps->pooler == POOLER_TRANSACTION;
    if (present)
        return DLOCK_OK;
    /* one implicit transaction; concurrent creators take turns */
    size_t cap = 1024;
    if (!ps->advisory)
        cap = (size_t)snprintf(NULL, 0, schema_sql, nm->t, nm->w,
                               ps->seq_lit, nm->rel, nm->leave,
                               ps->seq_ident, nm->wi, nm->unlock,
                               nm->ahead, present_sql, nm->abandon,
                               nm->earliest, nm->brk) + 1;
    char *sql = malloc(cap);
    if (!sql)
        return dlock__pg_enomem();
    if (ps->advisory) {
        snprintf(sql, cap,
                 "SELECT pg_advisory_xact_lock(" KEY("'dlock schema'::bytea")
                 "); CREATE SEQUENCE IF NOT EXISTS %s",
                 ps->seq_ident);
    } else {
        snprintf(sql, cap, schema_sql, nm->t, nm->w, ps->seq_lit, nm->rel,
                 nm->leave, ps->seq_ident, nm->wi, nm->unlock, nm->ahead,
                 present_sql, nm->abandon, nm->earliest, nm->brk);
    }
    /* an upgrade that met running statements (lock_timeout: SQLSTATE
     * 55P03, DLOCK_EBUSY) tries again, within the open's deadline */
    for (int i = 0;; i++) {
        rc = dlock__pg_run_text(ps, cn, sql, deadline, &r,
                                older ? "upgrading the lock table"
                                      : "creating the lock table");
        if (rc != DLOCK_EBUSY || i >= 50 || dlock__now_ms() + 100 > deadline)
            break;
    }
    free(sql);
    if (rc == DLOCK_EAUTH && older)
        return dlock__err(DLOCK_EAUTH,
                          "postgres %s: the lock table %s was made by an "
                          "earlier dlock and lacks what shared holds need, "
                          "and this user may not change it: run the "
                          "ALTER TABLE and CREATE FUNCTION statements of "
                          "docs/stores.md once as its owner",
                          ps->redacted, nm->t);
    if (rc == DLOCK_EAUTH)
        return dlock__err(DLOCK_EAUTH,
                          "postgres %s: cannot create the lock table %s "
                          "(no CREATE right): create it once with the DDL "
                          "in docs/stores.md, then grant SELECT, INSERT, "
                          "UPDATE, DELETE on it and USAGE on its sequences",
                          ps->redacted, nm->t);
    if (rc == DLOCK_EBUSY)
        return dlock__err(DLOCK_ECONN,
                          "postgres %s: upgrading the lock table %s: the "
                          "statements running on it kept it busy until the "
                          "deadline: open again",
                          ps->redacted, nm->t);
    if (rc == DLOCK_OK)
        PQclear(r);
    return rc;
}

/* T_break alone, for a table of an earlier dlock: %1$s T, %2$s T_waiters,
 * %3$s the sequence literal, %4$s T_break */
static const char break_sql[] =
    "SELECT pg_advisory_xact_lock(" KEY("'dlock schema'::bytea") "); "
    BREAK_FN("%4$s");

int dlock__pg_ensure_break(pg_store *ps, int64_t deadline)
{
    char look[256], lit[200];
    pg_names nm;
    pg_conn *cn;
    PGresult *r;
    int rc;

    if (__atomic_load_n(&ps->has_break, __ATOMIC_ACQUIRE))
        return DLOCK_OK;
    dlock__pg_names_of(ps->table, &nm);
    dlock__pg_quote_literal(nm.brk, lit, sizeof(lit));
    snprintf(look, sizeof(look), "SELECT to_regproc(%s) IS NOT NULL", lit);
    rc = dlock__pg_conn_get(ps, deadline, &cn);
    if (rc)
        return rc;
    rc = dlock__pg_run_text(ps, cn, look, deadline, &r,
                            "looking for the break function");
    if (rc == DLOCK_OK) {
        int there = PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "t");
        PQclear(r);
        if (!there) {
            /* a table made by an earlier dlock: add the function (CREATE
             * OR REPLACE: a creator racing us makes the same one) */
            size_t cap = (size_t)snprintf(NULL, 0, break_sql, nm.t, nm.w,
                                          ps->seq_lit, nm.brk) + 1;
            char *sql = malloc(cap);
            if (!sql) {
                dlock__pg_conn_put(ps, cn);
                return dlock__pg_enomem();
            }
            snprintf(sql, cap, break_sql, nm.t, nm.w, ps->seq_lit, nm.brk);
            rc = dlock__pg_run_text(ps, cn, sql, deadline, &r,
                                    "adding the break function");
            free(sql);
            if (rc == DLOCK_OK)
                PQclear(r);
            else if (rc == DLOCK_EAUTH)
                rc = dlock__err(DLOCK_EAUTH,
                                "postgres %s: the lock table %s was made by "
                                "an earlier dlock and lacks the function %s "
                                "that dlock_break() needs, and this user may "
                                "not create it: break any lock once as the "
                                "table's owner (that adds it), or see "
                                "docs/monitoring.md (postgres)",
                                ps->redacted, nm.t, nm.brk);
        }
    }
    dlock__pg_conn_put(ps, cn);
    if (rc == DLOCK_OK)
        __atomic_store_n(&ps->has_break, 1, __ATOMIC_RELEASE);
    return rc;
}
