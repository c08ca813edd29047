/* SPDX-License-Identifier: MIT */
/*
 * mysql_sql.c -- the MySQL/MariaDB store's SQL (mysql_int.h): quoted
 * identifiers, hex literals of names and owners (nothing a caller passes
 * can change a statement), the statements' texts (the acquire's upsert,
 * a name's gate, a queue entry's lock) and the schema created at open.
 */
#include "mysql_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Statements                                                               */
/* ------------------------------------------------------------------------ */

/* `name` with embedded backquotes doubled: one identifier. */
void dlock__mysql_quote_ident(const char *in, const char *suffix, char *out,
                              size_t cap)
{
    char both[MY_TABLE_MAX + 16];
    size_t o = 0;

    snprintf(both, sizeof(both), "%s%s", in, suffix);
    out[o++] = '`';
    for (const char *p = both; *p && o + 3 < cap; p++) {
        if (*p == '`')
            out[o++] = '`';
        out[o++] = *p;
    }
    out[o++] = '`';
    out[o] = '\0';
}

/* X'<hex>' of n bytes into a fresh buffer (NULL: out of memory). */
char *dlock__mysql_hexlit(const char *s, size_t n)
{
    char *out = malloc(2 * n + 4);

    if (!out)
        return NULL;
    out[0] = 'X';
    out[1] = '\'';
    dlock__hex(s, n, out + 2);
    out[2 * n + 2] = '\'';
    out[2 * n + 3] = '\0';
    return out;
}

/* A statement from fmt with %s replaced in order by the given strings
 * (numbers are formatted by the caller). Fresh buffer, or NULL. */
char *dlock__mysql_stmt(const char *fmt, ...)
{
    va_list ap;
    char *out;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !(out = malloc((size_t)n + 1)))
        return NULL;
    va_start(ap, fmt);
    vsnprintf(out, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return out;
}

/* The upsert takes the row over when its lease ended, with a new token. A
 * row that is already ours and live is adopted as it is (token kept,
 * lease only lengthened): an earlier try whose answer was lost took it,
 * or this statement is that late try and the owner holds the lock again.
 * `where` guards the whole statement (the gate, below). A waiter's upsert
 * sleeps in its `where` (GET_LOCK): its times are the wake's, SYSDATE(6)
 * (UTC: the session's time zone is set to it), and its condition reads
 * the one value the row would get, VALUES(locked_at). */
#define ENDED "lock_until <= " NOW
#define ENDED_WOKE "lock_until <= VALUES(locked_at)"
#define WOKE "SYSDATE(6)"
#define MINE "owner <=> VALUES(owner)"

/* The name's gate: a user-level lock named from the database, the table
 * and the lock name (64 bytes at most, the server's limit). */
char *dlock__mysql_gate_of(const my_store *ms, const char *name_lit)
{
    return dlock__mysql_stmt(
        "CONCAT('dlock:', SHA2(CONCAT(CAST(DATABASE() AS BINARY), "
        "X'00', %s, X'00', "
        "%s), 224))",
        ms->tl, name_lit);
}

/* A fair queue entry's own user lock: held by its waiter's connection,
 * so the entry dies with it. `seq` is an SQL expression. */
char *dlock__mysql_entry_lock_of(const my_store *ms, const char *seq)
{
    return dlock__mysql_stmt(
        "CONCAT('dlock-q:', SHA2(CONCAT(CAST(DATABASE() AS "
        "BINARY), X'00', %s, X'00', "
        "%s), 224))",
        ms->tl, seq);
}

char *dlock__mysql_upsert(const my_store *ms, const dlock__lease *l,
                          const char *name, const char *owner,
                          const char *holder, const char *where, int woke)
{
    const char *now = woke ? WOKE : NOW;
    const char *e = woke ? ENDED_WOKE : ENDED;

    return dlock__mysql_stmt(
        "INSERT INTO %s (name, owner, holder, holds, token, "
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
        "lock_until = IF(%s, VALUES(lock_until), IF(" MINE
        ", GREATEST(lock_until, VALUES(lock_until)), lock_until))",
        ms->t, name, owner, holder, now, now, now, (long long)l->ttl_ms * 1000,
        where, e, e, e, e, e, e);
}

/* Creates the tables when missing (existing ones need no CREATE right). */
int dlock__mysql_ensure_schema(my_store *ms, my_conn *cn, int64_t deadline)
{
    char qn[MY_TABLE_MAX + 8];
    MYSQL_RES *r = NULL;
    int rc;

    snprintf(qn, sizeof(qn), "%s_queue", ms->table);
    char *tl = dlock__mysql_hexlit(ms->table, strlen(ms->table));
    char *ql = dlock__mysql_hexlit(qn, strlen(qn));
    char *sql =
        tl && ql
            ? dlock__mysql_stmt("SELECT COUNT(*) FROM information_schema."
                                "tables WHERE table_schema = DATABASE() AND "
                                "table_name IN (CONVERT(%s USING utf8mb4), "
                                "CONVERT(%s USING utf8mb4))",
                                tl, ql)
            : NULL;
    free(tl);
    free(ql);
    rc = sql ? dlock__mysql_query(ms, cn, sql, deadline, &r, NULL, NULL,
                                  "looking for the lock table")
             : dlock__mysql_enomem();
    free(sql);
    long long present = rc == DLOCK_OK ? dlock__mysql_col_ll(r, 0, 0) : 0;
    if (r)
        mysql_free_result(r);
    if (rc || present == 2)
        return rc;
    sql = dlock__mysql_stmt(
        "CREATE TABLE IF NOT EXISTS %s ("
        " name VARBINARY(%d) NOT NULL PRIMARY KEY,"
        " owner VARBINARY(80) NULL,"
        " holder VARBINARY(255) NULL,"
        " holds INT NOT NULL DEFAULT 0,"
        " token BIGINT UNSIGNED NOT NULL DEFAULT 0,"
        " locked_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00',"
        " lock_until DATETIME(6) NOT NULL DEFAULT '1970-01-01 "
        "00:00:00') ENGINE=InnoDB",
        ms->t, DLOCK_NAME_MAX);
    rc = sql ? dlock__mysql_query(ms, cn, sql, deadline, NULL, NULL, NULL,
                                  "creating the lock table")
             : dlock__mysql_enomem();
    free(sql);
    if (rc == DLOCK_OK) {
        sql = dlock__mysql_stmt(
            "CREATE TABLE IF NOT EXISTS %s ("
            " seq BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,"
            " name VARBINARY(%d) NOT NULL,"
            " holder VARBINARY(255) NULL,"
            " alive_until DATETIME(6) NOT NULL,"
            " KEY name_seq (name, seq)) ENGINE=InnoDB",
            ms->q, DLOCK_NAME_MAX);
        rc = sql ? dlock__mysql_query(ms, cn, sql, deadline, NULL, NULL, NULL,
                                      "creating the queue table")
                 : dlock__mysql_enomem();
        free(sql);
    }
    if (rc == DLOCK_EAUTH)
        return dlock__err(DLOCK_EAUTH,
                          "mysql %s: cannot create the lock table %s (no "
                          "CREATE right): create it once with the DDL in "
                          "docs/stores.md, then grant SELECT, INSERT, "
                          "UPDATE, DELETE on it",
                          ms->redacted, ms->t);
    return rc;
}
