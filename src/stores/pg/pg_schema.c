/* SPDX-License-Identifier: MIT */
/*
 * pg_schema.c -- the PostgreSQL store's schema (pg_int.h says what its files
 * share): the table mode's lock table, queue and functions, created or
 * upgraded at open when missing, the look at open that tells whether a
 * pooler sits in front, and T_break added to an earlier dlock's table.
 */
#include "pg_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* advisory mode's: the sequence alone (%6$s, as in schema_sql) */
static const char adv_schema_sql[] =
    "SELECT pg_advisory_xact_lock(" KEY("'dlock schema'::bytea") "); "
    "CREATE SEQUENCE IF NOT EXISTS %6$s";

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
    const char *arg[] = {nm->t,        nm->w,       ps->seq_lit,
                         nm->rel,      nm->leave,   ps->seq_ident,
                         nm->wi,       nm->unlock,  nm->ahead,
                         present_sql,  nm->abandon, nm->earliest,
                         nm->brk};
    char *sql = dlock__pg_fill(ps->advisory ? adv_schema_sql : schema_sql,
                               arg, (int)(sizeof(arg) / sizeof(arg[0])));
    if (!sql)
        return dlock__pg_enomem();
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
            const char *arg[] = {nm.t, nm.w, ps->seq_lit, nm.brk};
            char *sql = dlock__pg_fill(break_sql, arg, 4);
            if (!sql) {
                dlock__pg_conn_put(ps, cn);
                return dlock__pg_enomem();
            }
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
