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

/* fmt with %1$s the table, %2$s the waiters table, %3$s the sequence
 * literal, %4$s the release function, %5$s the leaving function. */
static char *sql_of(const char *fmt, const pg_names *nm, const char *s)
{
    size_t cap = strlen(fmt) + 8 * (strlen(nm->t) + strlen(nm->w) +
                                    strlen(s) + strlen(nm->rel) +
                                    strlen(nm->leave)) + 64;
    char *out = malloc(cap);

    if (out)
        snprintf(out, cap, fmt, nm->t, nm->w, s, nm->rel, nm->leave);
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
     * release can lock the row and look for waiters. */
#define ENDED "t.lock_until <= " NOW
#define KEEP_OR(col, new_)                                                  \
    col " = CASE WHEN " ENDED " THEN " new_ " ELSE t." col " END"
#define UPSERT_SET(take)                                                    \
    " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, "            \
    KEEP_OR("holder", "excluded.holder") ", holds = 1, "                    \
    KEEP_OR("token", "nextval(%3$s)") ", "                                  \
    KEEP_OR("locked_at", "excluded.locked_at") ", lock_until = CASE WHEN "  \
    ENDED " THEN excluded.lock_until ELSE greatest(t.lock_until, "          \
    "excluded.lock_until) END WHERE (" take ") OR t.owner = excluded.owner"
#define LEFT_OF_ROW                                                         \
    "(SELECT " MS_LEFT("lock_until") " FROM %1$s WHERE name = $1)"
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
                      "client = $5 AND waiter = $6 AND pid = $7) RETURNING "
                      "seq) "
                      "SELECT (SELECT token FROM ins), " LEFT_OF_ROW
                      ", (SELECT seq FROM enq)",
                      nm, s);
    /* $1 name, $2 owner, $3 token: ok, handed to "client:waiter", token */
    rc = rc ? rc
            : set_sql(ps, S_RELEASE, 3, "SELECT * FROM %4$s($1, $2, $3)",
                      nm, s);
    /* $1 name, $2 owner, $3 token, $4 ttl ms */
    rc = rc ? rc
            : set_sql(ps, S_EXTEND, 4,
                      "UPDATE %1$s SET lock_until = " NOW " + $4 * interval "
                      "'1 millisecond' WHERE name = $1 AND owner = $2 AND "
                      "token = $3 AND lock_until > " NOW,
                      nm, s);
    rc = rc ? rc
            : set_sql(ps, S_INSPECT, 1,
                      "SELECT owner IS NOT NULL AND lock_until > " NOW
                      ", holder, token, " MS_LEFT("lock_until") ", floor("
                      "extract(epoch FROM " NOW " - locked_at) * 1000)::"
                      "bigint FROM %1$s WHERE name = $1",
                      nm, s);
    rc = rc ? rc
            : set_sql(ps, S_QUEUE, 2,
                      "SELECT w.holder FROM %2$s w WHERE w.name = $1 AND "
                      ALIVE("w", "$2") " ORDER BY w.seq",
                      nm, s);
    /* $1 name, $2 owner, $3 client id, $4 waiter number, $5 ttl ms */
    rc = rc ? rc
            : set_sql(ps, S_LEAVE, 5,
                      "SELECT %5$s($1, $2, $3, $4, $5)", nm, s);
    rc = rc ? rc
            : set_sql(ps, S_GC, 1,
                      "DELETE FROM %1$s WHERE lock_until <= " NOW " - $1 * "
                      "interval '1 millisecond'",
                      nm, s);
    rc = rc ? rc
            : set_sql(ps, S_GC_QUEUE, 1,
                      "DELETE FROM %2$s w WHERE NOT " ALIVE("w", "$1"), nm,
                      s);
    /* advisory: $1 name [, $2 holder]; exclusive and shared (read) */
#define ADV_TRY(fn)                                                         \
    "WITH l AS (SELECT " fn "(" KEY("$1") ") AS ok), n AS (SELECT CASE "    \
    "WHEN ok THEN nextval(%3$s) END AS t FROM l) SELECT t, CASE WHEN t IS " \
    "NOT NULL THEN set_config('application_name', 'dlock ' || t || ' ' || " \
    "$2, false) END FROM n"
#define ADV_UNLOCK(fn)                                                      \
    "SELECT " fn "(" KEY("$1") "), set_config('application_name', "         \
    "'dlock', false)"
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
#define ADV_KEY_OF_LOCK                                                     \
    "l.locktype = 'advisory' AND l.objsubid = 1 AND ((l.classid::bigint "   \
    "<< 32) | l.objid::bigint) = " KEY("$1")
    rc = rc ? rc
            : set_sql(ps, S_ADV_CHECK, 1,
                      "SELECT EXISTS (SELECT 1 FROM pg_locks l WHERE "
                      "l.pid = pg_backend_pid() AND l.granted AND "
                      ADV_KEY_OF_LOCK ")",
                      nm, s);
    rc = rc ? rc
            : set_sql(ps, S_ADV_INSPECT, 1,
                      "SELECT l.granted, coalesce(a.application_name, ''), "
                      "floor(extract(epoch FROM " NOW " - a.state_change) * "
                      "1000)::bigint, l.pid, l.mode = 'ShareLock' FROM "
                      "pg_locks l LEFT JOIN "
                      "pg_stat_activity a ON a.pid = l.pid WHERE "
                      ADV_KEY_OF_LOCK " ORDER BY l.granted DESC, "
                      "a.query_start",
                      nm, s);
    return rc;
}

/* The table mode's schema: the lock table, the waiters' queue and the two
 * functions that hand a lock over and leave the queue (docs/design.md,
 * "PostgreSQL table mode: hand-over"). Each statement of a function sees
 * what committed before it: once the row is locked, every queue entry
 * appended under that row's lock is visible. */
static const char schema_sql[] =
    "SELECT pg_advisory_xact_lock(" KEY("'dlock schema'::bytea") "); "
    "CREATE SEQUENCE IF NOT EXISTS %6$s; "
    "CREATE TABLE IF NOT EXISTS %1$s ("
    " name bytea PRIMARY KEY,"
    " owner text,"
    " holder text,"
    " holds integer NOT NULL DEFAULT 0,"
    " token bigint NOT NULL DEFAULT 0,"
    " locked_at timestamptz NOT NULL DEFAULT " NOW ","
    " lock_until timestamptz NOT NULL DEFAULT " NOW "); "
    "CREATE TABLE IF NOT EXISTS %2$s ("
    " seq bigserial PRIMARY KEY,"
    " name bytea NOT NULL,"
    " client text NOT NULL,"
    " waiter bigint NOT NULL,"
    " owner text NOT NULL,"
    " holder text,"
    " ttl_ms bigint NOT NULL,"
    " pid integer NOT NULL,"
    " since timestamptz); "
    "CREATE INDEX IF NOT EXISTS %7$s ON %2$s (name, seq); "
    "CREATE OR REPLACE FUNCTION %4$s(n bytea, o text, tok bigint, "
    "OUT ok boolean, OUT granted text, OUT gtoken bigint) LANGUAGE plpgsql "
    "AS $f$ DECLARE w record; BEGIN "
    " ok := false;"
    " PERFORM 1 FROM %1$s WHERE name = n AND owner = o AND token = tok AND "
    "lock_until > " NOW " FOR UPDATE;"
    " IF NOT FOUND THEN RETURN; END IF;"
    " ok := true;"
    " LOOP"
    "  SELECT * INTO w FROM %2$s WHERE name = n ORDER BY seq LIMIT 1;"
    "  EXIT WHEN NOT FOUND;"
    "  IF w.owner <> o AND " ALIVE("w", "split_part(o, ':', 1)") " THEN"
    "   gtoken := nextval(%3$s);"
    "   UPDATE %1$s SET owner = w.owner, holder = w.holder, holds = 1, "
    "token = gtoken, locked_at = " NOW ", lock_until = " NOW " + w.ttl_ms * "
    "interval '1 millisecond' WHERE name = n;"
    "   DELETE FROM %2$s WHERE name = n AND client = w.client AND waiter = "
    "w.waiter;"
    "   PERFORM pg_notify('dlock_' || w.client, 'g ' || w.waiter || ' ' || "
    "gtoken);"
    "   granted := w.client || ':' || w.waiter;"
    "   RETURN;"
    "  END IF;"
    "  DELETE FROM %2$s WHERE seq = w.seq;"
    " END LOOP;"
    " UPDATE %1$s SET owner = NULL, holder = NULL, holds = 0, lock_until = "
    NOW " WHERE name = n;"
    " END $f$; "
    "CREATE OR REPLACE FUNCTION %5$s(n bytea, o text, c text, wt bigint, "
    "ttl bigint) RETURNS bigint LANGUAGE plpgsql AS $f$ DECLARE t bigint; "
    "BEGIN"
    " PERFORM 1 FROM %1$s WHERE name = n FOR UPDATE;"
    " DELETE FROM %2$s WHERE name = n AND client = c AND waiter = wt;"
    " UPDATE %1$s SET lock_until = greatest(lock_until, " NOW " + ttl * "
    "interval '1 millisecond') WHERE name = n AND owner = o AND lock_until > "
    NOW " RETURNING token INTO t;"
    " RETURN t;"
    " END $f$";

/* Creates what is missing (an existing schema needs no CREATE right), and
 * tells whether a pooler sits in front of the server: libpq was told a
 * backend pid that is not the server's (PgBouncer makes up its own). */
int dlock__pg_ensure_schema(pg_store *ps, pg_conn *cn, const pg_names *nm,
                            int64_t deadline)
{
    char sql[8192], lt[200], lw[200], lrel[200], lleave[200];
    PGresult *r;
    int rc;

    dlock__pg_quote_literal(nm->t, lt, sizeof(lt));
    dlock__pg_quote_literal(nm->w, lw, sizeof(lw));
    dlock__pg_quote_literal(nm->rel, lrel, sizeof(lrel));
    dlock__pg_quote_literal(nm->leave, lleave, sizeof(lleave));
    if (ps->advisory)
        snprintf(sql, sizeof(sql),
                 "SELECT to_regclass(%s) IS NOT NULL, pg_backend_pid()",
                 ps->seq_lit);
    else
        snprintf(sql, sizeof(sql),
                 "SELECT to_regclass(%s) IS NOT NULL AND to_regclass(%s) IS "
                 "NOT NULL AND to_regclass(%s) IS NOT NULL AND to_regproc(%s) "
                 "IS NOT NULL AND to_regproc(%s) IS NOT NULL, "
                 "pg_backend_pid()",
                 lt, lw, ps->seq_lit, lrel, lleave);
    rc = dlock__pg_run_text(ps, cn, sql, deadline, &r,
                            "looking for the lock table");
    if (rc)
        return rc;
    int present = PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 0), "t");
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
    if (ps->advisory) {
        snprintf(sql, sizeof(sql),
                 "SELECT pg_advisory_xact_lock(" KEY("'dlock schema'::bytea")
                 "); CREATE SEQUENCE IF NOT EXISTS %s",
                 ps->seq_ident);
    } else {
        snprintf(sql, sizeof(sql), schema_sql, nm->t, nm->w, ps->seq_lit,
                 nm->rel, nm->leave, ps->seq_ident, nm->wi);
    }
    rc = dlock__pg_run_text(ps, cn, sql, deadline, &r,
                            "creating the lock table");
    if (rc == DLOCK_EAUTH)
        return dlock__err(DLOCK_EAUTH,
                          "postgres %s: cannot create the lock table %s "
                          "(no CREATE right): create it once with the DDL "
                          "in docs/stores.md, then grant SELECT, INSERT, "
                          "UPDATE, DELETE on it and USAGE on its sequences",
                          ps->redacted, nm->t);
    if (rc == DLOCK_OK)
        PQclear(r);
    return rc;
}
