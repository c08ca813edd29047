/* SPDX-License-Identifier: MIT */
/*
 * pg_sql.c -- the PostgreSQL store's SQL (pg.c is the store, pg_int.h what
 * they share): quoted names and the texts of its statements in both
 * modes (the table mode's schema is in pg_schema.c).
 */
#include "pg_int.h"

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
/* Statements                                                               */
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
    const char *arg[] = {nm->t,     nm->w,     s,
                         nm->rel,   nm->leave, nm->unlock,
                         nm->ahead, nm->abandon, nm->earliest,
                         nm->brk};

    return dlock__pg_fill(fmt, arg, (int)(sizeof(arg) / sizeof(arg[0])));
}

/* dlock__pg_fill()'s one pass: the length of the result, written to out
 * unless out is NULL */
static size_t fill_pass(char *out, const char *fmt, const char *const *arg,
                        const size_t *len, int n)
{
    size_t o = 0;

    for (const char *p = fmt; *p; p++) {
        char *end;
        long k;
        if (p[0] == '%' && p[1] >= '1' && p[1] <= '9' &&
            (k = strtol(p + 1, &end, 10)) <= n && end[0] == '$' &&
            end[1] == 's') {
            if (out)
                memcpy(out + o, arg[k - 1], len[k - 1]);
            o += len[k - 1];
            p = end + 1;
        } else {
            if (out)
                out[o] = *p;
            o++;
            if (p[0] == '%' && p[1] == '%')
                p++;
        }
    }
    return o;
}

char *dlock__pg_fill(const char *fmt, const char *const *arg, int n)
{
    size_t len[16];

    if (n > 16)
        return NULL;
    for (int i = 0; i < n; i++)
        len[i] = strlen(arg[i]);
    size_t cap = fill_pass(NULL, fmt, arg, len, n) + 1;
    char *out = malloc(cap);
    if (out)
        out[fill_pass(out, fmt, arg, len, n)] = '\0';
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

int dlock__pg_build_statements(pg_store *ps, const pg_names *nm, const char *s)
{
    static const struct {
        int which, nparams;
        const char *fmt;
    } stmts[] = {
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
        {S_ACQUIRE, 8,
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
            "END AS n FROM %1$s WHERE name = $1) r ON true"},
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
        {S_TAKE, 9,
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
            "SELECT tok, l, kind, (SELECT seq FROM enq), n FROM ins"},
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
        {S_TAKE_FAST, 9,
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
            "$7 IS NULL AND $8 IS NULL"},
        /* $1 name, $2 owner, $3 token: ok, and the grants "CLIENT:WAITER:TOKEN
         * ..." (space-separated; '' none) */
        {S_RELEASE, 3,
            "SELECT ok, grants FROM %6$s($1, $2, $3)"},
        /* A read hold's release while another live read hold remains: no
         * waiter can proceed then (a writer waits for every reader, a reader
         * waits only behind a writer), so no grant step and no function: one
         * UPDATE, guarded by owner, token and a live end, checked on the
         * row's latest version. No row changed: the caller calls T_unlock.
         * $1 name, $2 owner, $3 token */
        {S_RELEASE_READ, 3,
            "UPDATE %1$s t SET holders = t.holders - $2, holds = "
            "greatest(t.holds - 1, 1), lock_until = to_timestamp(("
            "SELECT max((x.value ->> 'u')::bigint) FROM jsonb_each("
            "t.holders - $2) x) / 1000.0) FROM (SELECT floor("
            "date_part('epoch', " NOW ") * 1000)::bigint AS ms) c "
            "WHERE t.name = $1 AND t.owner = '*' AND t.permits = 0 "
            "AND (t.holders -> $2 ->> 't')::bigint = $3 AND "
            "(t.holders -> $2 ->> 'u')::bigint > c.ms AND "
            "jsonb_path_exists(t.holders - $2, '$.* ? (@.u > $m)', "
            "jsonb_build_object('m', c.ms))"},
        /* leader election: the holder's value; $1 name, $2 owner, $3
         * token, $4 the value (pg_elect.c) */
        {S_PROCLAIM, 4,
            "UPDATE %1$s SET holder = $4 WHERE name = $1 AND owner = $2 "
            "AND token = $3 AND lock_until > " NOW},
        /* $1 name, $2 owner, $3 token, $4 ttl ms */
        {S_EXTEND, 4,
            "UPDATE %1$s SET lock_until = " NOW " + $4 * interval "
            "'1 millisecond' WHERE name = $1 AND owner = $2 AND "
            "token = $3 AND lock_until > " NOW},
        /* the same for a reader's or a permit's entry: only its own end
         * moves; lock_until follows the latest entry's end */
        {S_EXTEND_SHARED, 4,
            "UPDATE %1$s t SET holders = jsonb_set(t.holders, "
            "ARRAY[$2, 'u'], to_jsonb(c.ms + $4)), lock_until = "
            "to_timestamp(greatest(c.ms + $4, (SELECT max((x.value "
            "->> 'u')::bigint) FROM jsonb_each(t.holders) x WHERE "
            "x.key <> $2)) / 1000.0) FROM (SELECT floor(extract("
            "epoch FROM " NOW ") * 1000)::bigint AS ms) c WHERE "
            "t.name = $1 AND t.owner = '*' AND (t.holders -> $2 ->> "
            "'t')::bigint = $3 AND (t.holders -> $2 ->> 'u')::bigint "
            "> c.ms"},
        /* What dlock_inspect() says of a row, in the columns i0..i8: held,
         * holder, token, ttl, held for, shared form, permits, live entries,
         * the earliest live entry's description. The same text in S_INSPECT,
         * S_LIST (each lock of a page) and T_break (the view just before), t
         * the row */
        {S_INSPECT, 1,
            "SELECT " PG_INSPECT_COLS("t") " FROM %1$s t WHERE "
            "t.name = $1"},
        /* the live queue: seq, the waiter's description, its kind */
        {S_QUEUE, 2,
            "SELECT w.seq, w.holder, w.kind FROM %2$s w WHERE "
            "w.name = $1 AND " ALIVE("w", "$2") " ORDER BY w.seq"},
        /* dlock_list(): $1 the last name of the previous page ('' none), $2
         * and $3 the prefix's range [lo, hi), $4 the most rows looked at, $5
         * the most locks listed, $6 free ones too, $7 our client id. One
         * statement, one snapshot: the rows after $1 in the range, at most
         * $4 of them by the index (c: the page's bounded work), of which at
         * most $5 held or waited for (p), each with its S_INSPECT columns and
         * its live queue (one row per waiter, in order). The first two
         * columns tell where the look stopped: how many rows it saw (e.k:
         * $4 when more may follow) and the last one's name */
        {S_LIST, 7,
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
            ALIVE("w", "$7") ") q ON true ORDER BY p.name, q.seq"},
        /* dlock_break(): $1 name, $2 our client id. T_break's answer (the
         * row's S_INSPECT columns just before, then the grants), with the
         * live queue the statement's snapshot saw before it (a statement
         * does not see what the functions it calls change) */
        {S_BREAK, 2,
            "SELECT b.*, q.seq, q.holder, q.kind FROM %10$s($1, "
            "$2) b LEFT JOIN LATERAL (SELECT w.seq, w.holder, "
            "w.kind FROM %2$s w WHERE w.name = $1 AND "
            ALIVE("w", "$2") ") q ON true ORDER BY q.seq"},
        /* A woken waiter's look (docs/design.md, "PostgreSQL table mode:
         * hand-over", Confirmation), read only: no transaction id, no WAL.
         * $1 name, $2 owner, $3 client id, $4 waiter number, $5 the pid of
         * the client's listening session, $6 the kind (-1 write, 0 read, N a
         * permit of N). The token of a live hold of the owner's of that kind
         * (what the upsert would adopt) and its lease left (rounded down:
         * the local end it gives is never late); the lease left of
         * what holds the row (the try's timer); 1 when the waiter's entry of
         * that session is still queued. One row, even with no lock row */
        {S_CONFIRM, 6,
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
            "$1"},
        /* $1 name, $2 owner, $3 client id, $4 waiter number, $5 ttl ms, $6
         * the kind (-1 write, 0 read, N a permit of N) */
        {S_LEAVE, 6,
            "SELECT %8$s($1, $2, $3, $4, $5, $6)"},
        {S_GC, 1,
            "DELETE FROM %1$s WHERE lock_until <= " NOW " - $1 * "
            "interval '1 millisecond'"},
        {S_GC_QUEUE, 1,
            "DELETE FROM %2$s w WHERE NOT " ALIVE("w", "$1")},
        /* advisory: $1 name [, $2 holder]; exclusive and shared (read). A
         * name that a semaphore holds (its family key held) is not taken: the
         * third column is that semaphore's N (0: not known) */
/* the witness key first (pg_int.h, ADV_W: a break that looks at this moment
 * sees the name's key only with it), let go of when the try fails */
#define ADV_TRY(fn)                                                         \
    "WITH w AS (SELECT pg_try_advisory_lock(" ADV_W_OWN("$1") ") AS w), "   \
    "l AS (SELECT " fn "(" KEY("$1") ") AS ok, w FROM w), n AS (SELECT "    \
    "CASE WHEN ok THEN nextval(%3$s) END AS t, CASE WHEN w AND NOT ok THEN " \
    "pg_advisory_unlock(" ADV_W_OWN("$1") ") END AS u FROM l) SELECT t, "   \
    "CASE WHEN t IS NOT NULL THEN set_config('application_name', 'dlock ' " \
    "|| t || ' ' || $2, false) END FROM n"
/* a release takes the name's break key shared first (pg_int.h, ADV_B), lets
 * go of the name's key, then of the witness (pg_int.h, ADV_W; held unless an
 * intruder held it first, which the unlock then only warns about) */
#define ADV_UNLOCK(fn)                                                      \
    "SELECT u, c FROM (SELECT pg_advisory_xact_lock_shared(" ADV_B("$1")    \
    ") AS b, " fn "(" KEY("$1") ") AS u, pg_advisory_unlock("               \
    ADV_W_OWN("$1") ") AS w, set_config('application_name', 'dlock', "      \
    "false) AS c) x"
        {S_ADV_TRY, 2,
            ADV_TRY("pg_try_advisory_lock")},
        {S_ADV_TRY_SHARED, 2,
            ADV_TRY("pg_try_advisory_lock_shared")},
        {S_ADV_UNLOCK, 1,
            ADV_UNLOCK("pg_advisory_unlock")},
        {S_ADV_UNLOCK_SHARED, 1,
            ADV_UNLOCK("pg_advisory_unlock_shared")},
        {S_ADV_CHECK, 1,
            "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE "
            "l.pid = pg_backend_pid() AND l.granted AND "
            ADV_KEY_IS(KEY("$1")) ")"},
        /* holders of the lock (k 0), of a semaphore's permits (k 1: its
         * family key) and its gate (k 2: the head granted, the others
         * waiting), each with its session's application_name */
        {S_ADV_INSPECT, 1,
            "SELECT l.granted, coalesce(a.application_name, ''), "
            "floor(extract(epoch FROM " NOW " - a.state_change) * "
            "1000)::bigint, l.pid, l.mode = 'ShareLock', w.k FROM "
            "(VALUES (" KEY("$1") ", 0), (" ADV_F("$1") ", 1), ("
            ADV_G("$1") ", 2)) w(key, k) JOIN pg_locks l ON "
            ADV_KEY_IS("w.key") " LEFT JOIN pg_stat_activity a ON "
            "a.pid = l.pid ORDER BY w.k, l.granted DESC, "
            "a.query_start"},
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
        {S_ADV_SEM_TRY, 5,
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
            ADV_G("$1") ") END FROM t"},
        /* $1 name, $2 N, $3 slot: the family key, then N's, then the slot (a
         * holder takes them the other way round), then the witness: a session
         * holds the family key only while it holds a slot, and N's only while
         * it holds the family key. Answers whether the slot was held (first
         * column) */
        {S_ADV_SEM_UNLOCK, 3,
            "SELECT u, c FROM (SELECT "
            "pg_advisory_xact_lock_shared(" ADV_B("$1") ") AS b, "
            "pg_advisory_unlock_shared("
            ADV_F("$1") ") AS f, pg_advisory_unlock_shared("
            ADV_FN("$1", "$2") ") AS n, pg_advisory_unlock("
            ADV_SLOT("$1", "$2", "$3") ") AS u, "
            "pg_advisory_unlock(" ADV_W_OWN("$1") ") AS w, "
            "set_config('application_name', 'dlock', false) AS c) "
            "x"},
        {S_ADV_SEM_CHECK, 3,
            "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE "
            "l.pid = pg_backend_pid() AND l.granted AND "
            ADV_KEY_IS(ADV_SLOT("$1", "$2", "$3")) ")"},
    };
    int rc = DLOCK_OK;

    for (size_t i = 0; i < sizeof(stmts) / sizeof(stmts[0]) && !rc; i++)
        rc = set_sql(ps, stmts[i].which, stmts[i].nparams, stmts[i].fmt, nm,
                     s);
    return rc;
}
