/* SPDX-License-Identifier: MIT */
/*
 * mysql_sql.c -- the MySQL/MariaDB store's SQL (mysql_int.h): quoted
 * identifiers, hex literals of names and owners (nothing a caller passes
 * can change a statement), an owner's JSON path into a row's holders,
 * the statements' texts (the acquire's upserts, a name's gate, a queue
 * entry's lock, a hold's lock, a read hold's release) and the schema
 * created at open (or migrated from the previous version's).
 */
#include "mysql_int.h"

#include "buf.h"
#include "hex.h"

#include <mysqld_error.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The server's clock in µs at the statement's start. */
#define NOW_US MY_US(NOW)

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
/* A read hold's or permit's: free also when released (holds 0). A
 * statement that started before a release (and waited for the row's lock
 * behind it) reads a lease end, the release's now, after its own: a
 * writer's try then answers busy, and waits (as before read holds); a
 * reader's joins. */
#define FREE_WOKE "(holds = 0 OR lock_until <= VALUES(locked_at))"
/* A try's (it may not hold the gate): an ended row is ours when the try
 * holds the gate now, or its lease ran out (the row still names its
 * holder: holds > 0; a frozen or dead holder's), or it was released more
 * than the grace ago. A row released less than the grace ago whose gate
 * another session holds is being handed to the waiter the release woke,
 * whose statement takes it as it wakes (docs/design.md, "Waiting in the
 * server"). The try evaluates it once (dlock__mysql_upsert()). */
#define TAKE_TRY(gate)                                                      \
    "(lock_until <= " NOW " AND (holds > 0 OR lock_until <= " NOW            \
    " - INTERVAL " MY_GRACE_US " MICROSECOND OR IS_USED_LOCK(" gate          \
    ") <=> CONNECTION_ID()))"

/* The name of a user-level lock of ours (64 bytes at most, the server's
 * limit): `tag` and a hash of the database, the table (the first %s) and
 * `parts` (%s each, NUL-separated). */
#define USER_LOCK(tag, parts)                                               \
    "CONCAT('" tag "', SHA2(CONCAT(CAST(DATABASE() AS BINARY), X'00', %s, " \
    "X'00', " parts "), 224))"

/* The name's gate: a user-level lock named from the database, the table
 * and the lock name. */
char *dlock__mysql_gate_of(const my_store *ms, const char *name_lit)
{
    return dlock__mysql_stmt(USER_LOCK("dlock:", "%s"), ms->tl, name_lit);
}

/* A fair queue entry's own user lock: held by its waiter's connection,
 * so the entry dies with it. `seq` is an SQL expression. */
char *dlock__mysql_entry_lock_of(const my_store *ms, const char *seq)
{
    return dlock__mysql_stmt(USER_LOCK("dlock-q:", "%s"), ms->tl, seq);
}

/* A read hold's (permit's) own user lock: held by its connection for the
 * hold, so that a waiter for that hold sleeps on it. `owner` is an SQL
 * expression (a hex literal, or a JSON_TABLE column). */
char *dlock__mysql_hold_lock_of(const my_store *ms, const char *name_lit,
                                const char *owner)
{
    return dlock__mysql_stmt(USER_LOCK("dlock-h:", "%s, X'00', %s"), ms->tl,
                             name_lit, owner);
}

/* What a busy upsert tells its caller through LAST_INSERT_ID (the row's
 * columns before the statement; `now` the condition's time): who holds
 * the row (MY_CODE_*). The token column stays as it is. */
#define BUSY_CODE(now)                                                      \
    "token + 0 * LAST_INSERT_ID(IF(holds = 0 OR lock_until <= " now ", 0, " \
    "IF(" MY_SHARED_ANY("owner") ", IF(permits > 0, 3 + permits, 2), 1)))"

/* `rich`: a busy answer says who holds (BUSY_CODE); for the tries of a
 * wait only, so that the uncontended try stays the statement it was
 * before read holds (each function the server prepares costs every try:
 * tens of µs for this one). A writer leaves what readers or permits left
 * in the row (holders, permits) as it is: they are read only while
 * `owner` is '*', and the next read hold or permit on a free row writes
 * them anew. */
char *dlock__mysql_upsert(const my_store *ms, const dlock__lease *l,
                          const char *name, const char *owner,
                          const char *holder, const char *where, int woke,
                          int rich, const char *gate)
{
    const char *now = woke ? WOKE : NOW;
    const char *e = woke ? ENDED_WOKE : ENDED;
    const char *busy = !rich    ? "token"
                       : ms->rw ? BUSY_CODE("VALUES(locked_at)")
                                : "token + 0 * LAST_INSERT_ID(1)";
    char *take, *out;

    if (!gate || woke)
        return dlock__mysql_stmt(
            "INSERT INTO %s (name, owner, holder, holds, token, "
            "locked_at, lock_until) SELECT %s, %s, %s, 1, "
            "LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', "
            "%s)), %s, %s + INTERVAL %lld MICROSECOND FROM DUAL%s "
            "ON DUPLICATE KEY UPDATE "
            "holder = IF(%s, VALUES(holder), holder), "
            "holds = IF(%s, 1, holds), "
            "token = IF(%s, LAST_INSERT_ID(GREATEST(token + 1, "
            "VALUES(token))), IF(" MINE ", LAST_INSERT_ID(token), %s)), "
            "locked_at = IF(%s, VALUES(locked_at), locked_at), "
            "owner = IF(%s, VALUES(owner), owner), "
            "lock_until = IF(%s, VALUES(lock_until), IF(" MINE
            ", GREATEST(lock_until, VALUES(lock_until)), lock_until))",
            ms->t, name, owner, holder, now, now, now,
            (long long)l->ttl_ms * 1000, where, e, e, e, busy, e, e, e);
    /* a try: its condition (TAKE_TRY) evaluated once, in the first
     * assignment, and carried in LAST_INSERT_ID() (1 taken, 0 not) by
     * the others; the token's comes last and sets the answer (measured:
     * the condition in each assignment cost the try 25 µs, once 5). A
     * busy answer that says who holds also says whether the try holds the
     * gate (MY_CODE_GATED) */
    take = dlock__mysql_stmt(TAKE_TRY("%s"), gate);
    char *gated = rich && ms->rw
                      ? dlock__mysql_stmt(
                            "token + 0 * LAST_INSERT_ID(IF(holds = 0 OR "
                            "lock_until <= " NOW ", 0, IF(" MY_SHARED_ANY(
                                "owner") ", IF(permits > 0, 3 + permits, 2), "
                            "1)) + IF(IS_USED_LOCK(%s) <=> CONNECTION_ID(), "
                            "%d, 0))",
                            gate, MY_CODE_GATED)
                      : NULL;
    if (gated)
        busy = gated;
    out = take ? dlock__mysql_stmt(
                     "INSERT INTO %s (name, owner, holder, holds, token, "
                     "locked_at, lock_until) SELECT %s, %s, %s, 1, "
                     "LAST_INSERT_ID(TIMESTAMPDIFF(MICROSECOND, "
                     "'1970-01-01', " NOW ")), " NOW ", " NOW " + INTERVAL "
                     "%lld MICROSECOND FROM DUAL%s ON DUPLICATE KEY UPDATE "
                     "holder = IF(LAST_INSERT_ID(%s), VALUES(holder), "
                     "holder), "
                     "holds = IF(LAST_INSERT_ID(), 1, holds), "
                     "locked_at = IF(LAST_INSERT_ID(), VALUES(locked_at), "
                     "locked_at), "
                     "owner = IF(LAST_INSERT_ID(), VALUES(owner), owner), "
                     "lock_until = IF(LAST_INSERT_ID(), VALUES(lock_until), "
                     "IF(" MINE ", GREATEST(lock_until, VALUES(lock_until)), "
                     "lock_until)), "
                     "token = IF(LAST_INSERT_ID(), LAST_INSERT_ID(GREATEST("
                     "token + 1, VALUES(token))), IF(" MINE
                     ", LAST_INSERT_ID(token), %s))",
                     ms->t, name, owner, holder, (long long)l->ttl_ms * 1000,
                     where, take, busy)
               : NULL;
    free(take);
    free(gated);
    return out;
}

char *dlock__mysql_counting(const my_store *ms, const char *name_lit,
                            int older)
{
    char *lock = dlock__mysql_entry_lock_of(ms, "q.seq");
    char *out = lock ? dlock__mysql_stmt(
                           "EXISTS (SELECT 1 FROM %s q WHERE q.name = %s AND "
                           "q.seq %s AND q.alive_until > " NOW " - INTERVAL "
                           MY_GRACE_US " MICROSECOND AND IS_USED_LOCK(%s) IS "
                           "NOT NULL)",
                           ms->q, name_lit, older ? "< @dlock_q" : "> 0", lock)
                     : NULL;

    free(lock);
    return out;
}

char *dlock__mysql_sole_owner(const char *owner)
{
    size_t n = strlen(owner);
    char *s = malloc(n + 2), *out;

    if (!s)
        return NULL;
    s[0] = '*';
    memcpy(s + 1, owner, n + 1);
    out = dlock__mysql_hexlit(s, n + 1);
    free(s);
    return out;
}

/*
 * A read hold's or permit's light take: the exclusive lock's first try
 * (dlock__mysql_upsert(), not rich) with the sole holder's values ('*'
 * and the owner id; `permits` N) and `where`, the reader's guard. A row
 * whose lease ended becomes the caller's as its sole holder; its own live
 * sole hold is adopted (token kept, end lengthened); anything else is
 * busy and says nothing (the caller runs the full take). No JSON: the
 * uncontended shared cycle costs the exclusive one's.
 */
char *dlock__mysql_upsert_light(const my_store *ms, const dlock__lease *l,
                                const char *name, const char *holder,
                                const char *where)
{
    char *owner = dlock__mysql_sole_owner(l->owner), *out;
    const unsigned p = l->kind == DLOCK__PERMIT ? l->permits : 0;

    if (!owner)
        return NULL;
    out = dlock__mysql_stmt(
        "INSERT INTO %s (name, owner, holder, holds, token, locked_at, "
        "lock_until, permits) SELECT %s, %s, %s, 1, LAST_INSERT_ID("
        MY_US(NOW) "), " NOW ", " NOW " + INTERVAL %lld MICROSECOND, %u "
        "FROM DUAL%s ON DUPLICATE KEY UPDATE "
        "holder = IF(" ENDED ", VALUES(holder), holder), "
        "holds = IF(" ENDED ", 1, holds), "
        "token = IF(" ENDED ", LAST_INSERT_ID(GREATEST(token + 1, "
        "VALUES(token))), IF(" MINE ", LAST_INSERT_ID(token), token)), "
        "locked_at = IF(" ENDED ", VALUES(locked_at), locked_at), "
        "permits = IF(" ENDED ", VALUES(permits), permits), "
        "owner = IF(" ENDED ", VALUES(owner), owner), "
        "lock_until = IF(" ENDED ", VALUES(lock_until), IF(" MINE
        ", GREATEST(lock_until, VALUES(lock_until)), lock_until))",
        ms->t, name, owner, holder, (long long)l->ttl_ms * 1000, p, where);
    free(owner);
    return out;
}

/*
 * A read hold's or permit's full take (mysql_rw.c's header says when it
 * runs). With the row as it was, its first assignment decides, and keeps
 * the outcome in LAST_INSERT_ID() for the others (which see the columns
 * assigned before them, not the row as it was):
 *
 *  - MY_TOOK_MINE: our own live sole hold of this kind (an earlier try
 *    whose answer was lost, or this statement is a late try of ours and
 *    the owner holds again): adopted as the exclusive lock adopts it, its
 *    token kept (the answer), its end only lengthened;
 *  - MY_TOOK_MINE_ENTRY: our own live entry of this kind: the same, in
 *    the entry. So a late try cannot end a newer hold of ours (the hold
 *    lock, a user-level lock any session may take, is no condition);
 *  - MY_TOOK_FREE: the row is free (released, or its lease ended; a try
 *    not holding the gate: not a row released less than the grace ago
 *    whose gate another session holds, a hand-over to the waiter it
 *    woke), or our own live sole hold of another kind (replaced): ours as
 *    its sole holder ('*' and our owner id, our values in the row's
 *    columns);
 *  - MY_TOOK_SOLE: `join` allows it and a live sole holder of the same
 *    kind holds it (a reader; a permit of the same N, N >= 2): its hold
 *    becomes an entry of `holders` (its token, end, start and
 *    description), ours another, `owner` '*';
 *  - MY_TOOK_ENTRIES: `join` allows it and the row's entries are of the
 *    same kind (readers; or permits of the same N with fewer than N other
 *    entries): our entry is added (an ended one of ours replaced);
 *  - else busy: a MY_CODE_* (who holds; MY_CODE_NONE for a free row that
 *    a try may not take: one being handed over).
 *
 * The token's assignment comes last and sets LAST_INSERT_ID() to the new
 * token (the client's answer; an adopted hold's own); the entries read
 * the old token (a sole holder's) and compute the new one. The times are
 * one, the SELECT part's (VALUES()): now in µs is VALUES(token), the
 * condition's now VALUES(locked_at).
 *
 * With `gate` (a waiter holding the name's gate), the take lets go of the
 * gate in the statement itself, once taken: the next waiter wakes while
 * this statement commits, and its own upsert waits for the row's lock
 * (a writer woken so then sees this hold and waits for it). `bare`: a
 * try that does not hold the gate (the hand-over window above).
 *
 * Without `prune` the statement has no subquery (each costs the server
 * tens of µs to prepare, evaluated or not): holds whose lease ended stay
 * in `holders`, and a permit counts them as taken (it may find a
 * semaphore full that is not: the waiter holding the gate then reads the
 * live ones and tries again with `prune`, which drops them and counts the
 * live ones only; a try prunes at once).
 */
char *dlock__mysql_upsert_shared(const my_store *ms, int permit,
                                 const char *where, int woke, int join,
                                 int prune, const char *gate, int bare)
{
    const char *now = woke ? WOKE : NOW;
    const char *b = "LAST_INSERT_ID()";
    /* our entry: the new token computed from the old one (the token
     * column is assigned last) */
    const char *entry =
        "JSON_ARRAY(" MY_V_OWNER ", GREATEST(token + 1, VALUES(token)), "
        "VALUES(token) + " MY_V_TTL ", VALUES(token), CONVERT(VALUES("
        "holder) USING utf8mb4))";
    /* the other entries: with `prune` the live ones (a subquery cannot
     * read VALUES(): the statement's start is its now, before a waiter's
     * wake: a hold that ended during the wait still counts, which only
     * refuses a permit the state read then finds); else every entry */
    const char *others =
        prune ? "(SELECT COUNT(*) FROM JSON_TABLE(holders, " MY_HOLDERS_COLS
                ") j WHERE j.e > " MY_US(NOW) " AND j.o <> " MY_V_OWNER ")"
              : "(IFNULL(JSON_LENGTH(holders), 0) - IFNULL("
                "JSON_CONTAINS_PATH(holders, 'one', " MY_V_PATH "), 0))";
    /* what our entry is set into */
    const char *base =
        prune ? "IFNULL((SELECT JSON_OBJECTAGG(j.o, JSON_ARRAY(j.o, j.t, "
                "j.e, j.s, j.d)) FROM JSON_TABLE(holders, " MY_HOLDERS_COLS
                ") j WHERE j.e > " MY_US(NOW) " AND j.o <> " MY_V_OWNER
                "), '{}')"
              : "IFNULL(holders, '{}')";
    /* our own live entry's end, µs (NULL: none) */
    const char *mine_end =
        "CAST(JSON_EXTRACT(holders, " MY_V_PATH_END ") AS SIGNED)";
    /* free for this statement (a try: not while being handed over) */
    const char *free_ =
        bare ? "(" FREE_WOKE " AND NOT (holds = 0 AND lock_until > VALUES("
               "locked_at) - INTERVAL " MY_GRACE_US " MICROSECOND AND "
               "IS_FREE_LOCK(" MY_V_GATE ") = 0))"
             : FREE_WOKE;
    const char *kind = permit ? "permits = " MY_V_PERMITS : "permits = 0";
    char s1[160], s2[400], sum[96], mine[200], mine_e[300];

    if (!join) {
        snprintf(s1, sizeof(s1), "0");
        snprintf(s2, sizeof(s2), "0");
    } else if (permit) {
        snprintf(s1, sizeof(s1),
                 MY_SOLE("owner") " AND permits = " MY_V_PERMITS " AND "
                 MY_V_PERMITS " > 1");
        snprintf(s2, sizeof(s2),
                 "owner <=> " MY_SHARED " AND permits = " MY_V_PERMITS
                 " AND %s < " MY_V_PERMITS, others);
    } else {
        snprintf(s1, sizeof(s1), MY_SOLE("owner") " AND permits = 0");
        snprintf(s2, sizeof(s2), "owner <=> " MY_SHARED " AND permits = 0");
    }
    snprintf(mine, sizeof(mine),
             "owner = VALUES(owner) AND %s AND lock_until > VALUES("
             "locked_at) AND holds > 0",
             kind);
    snprintf(mine_e, sizeof(mine_e),
             "owner <=> " MY_SHARED " AND %s AND IFNULL(%s > VALUES(token), "
             "0)",
             kind, mine_end);
    snprintf(sum, sizeof(sum), "%s",
             permit ? "CONCAT(holds, ' of ', " MY_V_PERMITS ", ' permits')"
                    : "CONCAT(holds, ' readers')");
    return dlock__mysql_stmt(
        "INSERT INTO %s (name, owner, holder, holds, token, locked_at, "
        "lock_until, permits) SELECT " MY_V_NAME ", " MY_V_SOLE ", "
        MY_V_DESC ", 1, LAST_INSERT_ID(" MY_US("%s") "), %s, %s + INTERVAL "
        MY_V_TTL " MICROSECOND, %s FROM DUAL%s ON DUPLICATE KEY UPDATE "
        /* the decision */
        "permits = IF(LAST_INSERT_ID(IF(%s, %d, IF(%s, %d, IF(%s OR owner = "
        "VALUES(owner), %d, IF(%s, %d, IF(%s, %d, IF(" FREE_WOKE ", 0, IF("
        MY_SHARED_ANY("owner") ", IF(permits > 0, 3 + permits, 2), 1)))))))) > "
        "1000, "
        "VALUES(permits), permits), "
        "holders = CASE %s WHEN %d THEN JSON_OBJECT(CONVERT(SUBSTR("
        "owner, 2) USING utf8mb4), JSON_ARRAY(CONVERT(SUBSTR(owner, 2) "
        "USING utf8mb4), token, " MY_US("lock_until") ", "
        MY_US("locked_at") ", CONVERT(holder USING utf8mb4)), " MY_V_OWNER
        ", %s) WHEN %d THEN JSON_SET(%s, " MY_V_PATH ", %s) WHEN %d THEN "
        "JSON_SET(holders, " MY_V_PATH_END ", GREATEST(%s, VALUES(token) + "
        MY_V_TTL ")) ELSE holders END, "
        "holds = IF(%s > 1000, CASE %s WHEN %d THEN 1 WHEN %d THEN 2 "
        "WHEN %d THEN JSON_LENGTH(holders) ELSE holds END%s%s%s, holds), "
        "holder = IF(%s = %d, VALUES(holder), IF(%s IN (%d, %d), %s, "
        "holder)), "
        "locked_at = IF(%s = %d, VALUES(locked_at), locked_at), "
        "lock_until = IF(%s = %d, VALUES(lock_until), IF(%s > 1000, "
        "GREATEST(lock_until, VALUES(lock_until)), lock_until)), "
        "owner = IF(%s = %d, VALUES(owner), IF(%s IN (%d, %d), " MY_SHARED
        ", owner)), "
        "token = CASE %s WHEN %d THEN LAST_INSERT_ID(token) WHEN %d THEN "
        "token + 0 * LAST_INSERT_ID(CAST(JSON_EXTRACT(holders, "
        MY_V_PATH_TOK ") AS UNSIGNED)) ELSE IF(%s > 1000, LAST_INSERT_ID("
        "GREATEST(token + 1, VALUES(token))), token) END",
        ms->t, now, now, now, permit ? MY_V_PERMITS : "0", where,
        /* permits: the decision */ mine, MY_TOOK_MINE, mine_e,
        MY_TOOK_MINE_ENTRY, free_, MY_TOOK_FREE, s1, MY_TOOK_SOLE, s2,
        MY_TOOK_ENTRIES,
        /* holders */ b, MY_TOOK_SOLE, entry, MY_TOOK_ENTRIES, base, entry,
        MY_TOOK_MINE_ENTRY, mine_end,
        /* holds */ b, b, MY_TOOK_FREE, MY_TOOK_SOLE, MY_TOOK_ENTRIES,
        gate ? " + 0 * IFNULL(RELEASE_LOCK(" : "", gate ? gate : "",
        gate ? "), 0)" : "",
        /* holder */ b, MY_TOOK_FREE, b, MY_TOOK_SOLE, MY_TOOK_ENTRIES, sum,
        /* locked_at */ b, MY_TOOK_FREE,
        /* lock_until */ b, MY_TOOK_FREE, b,
        /* owner */ b, MY_TOOK_FREE, b, MY_TOOK_SOLE, MY_TOOK_ENTRIES,
        /* token */ b, MY_TOOK_MINE, MY_TOOK_MINE_ENTRY, b);
}

/*
 * A reader's or permit's join: the first try of a client whose note says
 * that others held the name (the contended path). One UPDATE, which joins
 * a live row of the same kind and nothing else: entries (ours added, or
 * replacing our own), or a sole holder other than us (turned to entries:
 * its hold an entry with its token, end, start and description, ours
 * another); for a permit, N the same and fewer than N other entries (N >=
 * 2 beside a sole holder). Its guard is the try's: a free gate, then our
 * hold lock. Nothing matched: the full take (a free row, another kind, a
 * busy answer's code). A plain UPDATE costs the server half of the full
 * take's INSERT ... SELECT ... ON DUPLICATE KEY UPDATE (measured: 62
 * against 98 µs prepared, 110 against 226 as text, with 7 other entries),
 * below the exclusive try's text. `holders` is assigned first (it reads
 * the old token: a sole holder's), the token last (LAST_INSERT_ID: ours).
 */
char *dlock__mysql_join(const my_store *ms, int permit)
{
    const char *entry =
        "JSON_ARRAY(" MY_V_OWNER ", GREATEST(token + 1, " MY_US(NOW) "), "
        MY_US(NOW) " + " MY_V_TTL ", " MY_US(NOW) ", CONVERT(" MY_V_DESC
        " USING utf8mb4))";

    return dlock__mysql_stmt(
        "UPDATE %s SET holders = IF(owner <=> " MY_SHARED ", JSON_SET("
        "holders, " MY_V_PATH ", %s), JSON_OBJECT(CONVERT(SUBSTR(owner, 2) "
        "USING utf8mb4), JSON_ARRAY(CONVERT(SUBSTR(owner, 2) USING "
        "utf8mb4), token, " MY_US("lock_until") ", " MY_US("locked_at")
        ", CONVERT(holder USING utf8mb4)), " MY_V_OWNER ", %s)), holds = "
        "JSON_LENGTH(holders), holder = %s, lock_until = GREATEST("
        "lock_until, " NOW " + INTERVAL " MY_V_TTL " MICROSECOND), owner = "
        MY_SHARED ", token = LAST_INSERT_ID(GREATEST(token + 1, "
        MY_US(NOW) ")) WHERE name = " MY_V_NAME " AND lock_until > " NOW
        " AND holds > 0 AND permits = %s AND (owner <=> " MY_SHARED "%s OR "
        MY_SOLE("owner") " AND owner <> " MY_V_SOLE "%s) AND IS_FREE_LOCK("
        MY_V_GATE ") = 1 AND GET_LOCK(" MY_V_HOLD ", 0) = 1",
        ms->t, entry, entry,
        permit ? "CONCAT(holds, ' of ', permits, ' permits')"
               : "CONCAT(holds, ' readers')",
        permit ? MY_V_PERMITS : "0",
        permit ? " AND JSON_LENGTH(holders) - JSON_CONTAINS_PATH(holders, "
                 "'one', " MY_V_PATH ") < " MY_V_PERMITS
               : "",
        permit ? " AND " MY_V_PERMITS " > 1" : "");
}

/* A sole holder frees the row, as the exclusive release. An entry goes
 * (`holds` one less: every statement that writes the entries sets it to
 * their number, and this one matched ours);
 * the lock's end stays (the latest end of the holds since the last
 * renewal: an upper bound, made exact again by the next renewal; a
 * subquery to compute it would cost the release tens of µs) unless none
 * is left: then now, `holds` 0 and `owner` NULL. A semaphore keeps its N.
 * The hold lock goes in the statement (only when it matched: a hold found
 * in the other form keeps it until the statement that removes it):
 * whoever it wakes next runs an upsert, which waits for this statement's
 * commit. LAST_INSERT_ID: 2 when our hold was an entry, 1 when sole (the
 * note for the next take). */
char *dlock__mysql_release_any(const my_store *ms)
{
    return dlock__mysql_stmt(
        "UPDATE %s SET holders = IF(owner <=> " MY_SHARED ", JSON_REMOVE("
        "holders, " MY_V_PATH "), holders), holds = IF(owner <=> " MY_SHARED
        ", holds - 1, 0) + 0 * RELEASE_ALL_LOCKS() + 0 * "
        "LAST_INSERT_ID(IF(owner <=> " MY_SHARED ", 2, 1)), lock_until = "
        "IF(holds = 0, " NOW ", lock_until), " HOLDER_TEXT ", owner = IF("
        "holds = 0, NULL, owner) WHERE name = " MY_V_NAME " AND (owner = "
        MY_V_SOLE " AND token = " MY_V_TOKEN " AND lock_until > " NOW " OR "
        "owner <=> " MY_SHARED " AND CAST(JSON_EXTRACT(holders, "
        MY_V_PATH_TOK ") AS UNSIGNED) = " MY_V_TOKEN " AND CAST(JSON_EXTRACT("
        "holders, " MY_V_PATH_END ") AS SIGNED) > " NOW_US ")",
        ms->t);
}

int dlock__mysql_templates(my_store *ms)
{
    ms->tmpl[MY_PS_JOIN_READ] = dlock__mysql_join(ms, 0);
    ms->tmpl[MY_PS_JOIN_PERMIT] = dlock__mysql_join(ms, 1);
    ms->tmpl[MY_PS_RELEASE] = dlock__mysql_release_any(ms);
    for (int i = 0; i < MY_PS_N; i++)
        if (!ms->tmpl[i])
            return dlock__mysql_enomem();
    return DLOCK_OK;
}

/* ------------------------------------------------------------------------ */
/* Values as markers                                                        */
/* ------------------------------------------------------------------------ */

int dlock__mysql_owner_path(const char *owner, const char *tail, char *out,
                            size_t cap)
{
    for (const char *p = owner; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') ||
              (*p >= 'A' && *p <= 'Z') || *p == ':' || *p == '.' ||
              *p == '_' || *p == '-'))
            return dlock__err(DLOCK_EINVAL,
                              "mysql: an owner id with a byte other than "
                              "[0-9A-Za-z:._-]");
    if ((size_t)snprintf(out, cap, "$.\"%s\"%s", owner, tail) >= cap)
        return dlock__err(DLOCK_EINVAL, "mysql: the owner id is too long");
    return DLOCK_OK;
}

int dlock__mysql_vals(const my_store *ms, const dlock__lease *l, my_vals *v)
{
    char *gate, *hold;
    int rc;

    memset(v, 0, sizeof(*v));
    v->name = l->name;
    v->name_len = l->name_len;
    v->desc = l->desc;
    v->ttl_us = (long long)l->ttl_ms * 1000;
    v->permits = l->kind == DLOCK__PERMIT ? l->permits : 0;
    v->token = l->token;
    if ((rc = dlock__mysql_owner_path(l->owner, "", v->path,
                                      sizeof(v->path))) ||
        (rc = dlock__mysql_owner_path(l->owner, "[1]", v->path_tok,
                                      sizeof(v->path_tok))) ||
        (rc = dlock__mysql_owner_path(l->owner, "[2]", v->path_end,
                                      sizeof(v->path_end))))
        return rc;
    if ((size_t)snprintf(v->owner, sizeof(v->owner), "%s", l->owner) >=
            sizeof(v->owner) ||
        (size_t)snprintf(v->sole, sizeof(v->sole), "*%s", l->owner) >=
            sizeof(v->sole))
        return dlock__err(DLOCK_EINVAL, "mysql: the owner id is too long");
    gate = dlock__mysql_gate_lit(ms, l->name, l->name_len);
    hold = dlock__mysql_hold_lit(ms, l->name, l->name_len, l->owner);
    /* unquoted ('...' of 62 and 64 bytes) */
    if (gate && hold) {
        snprintf(v->gate, sizeof(v->gate), "%.*s", (int)strlen(gate) - 2,
                 gate + 1);
        snprintf(v->hold, sizeof(v->hold), "%.*s", (int)strlen(hold) - 2,
                 hold + 1);
    }
    free(gate);
    free(hold);
    return v->gate[0] && v->hold[0] ? DLOCK_OK : dlock__mysql_enomem();
}

char *dlock__mysql_fill(const char *tmpl, const my_vals *v)
{
    dlock__buf out = DLOCK__BUF_INIT;
    char num[32];
    int bad = dlock__buf_add(&out, "", 0) != 0;

    for (const char *p = tmpl; *p && !bad; p++) {
        const char *lit = NULL;
        char *hex = NULL;
        if (*p != '\001') {
            const char *q = strchr(p, '\001');
            size_t n = q ? (size_t)(q - p) : strlen(p);
            bad = dlock__buf_add(&out, p, n) != 0;
            p += n - 1;
            continue;
        }
        switch (*++p) {
        case 'N': lit = hex = dlock__mysql_hexlit(v->name, v->name_len); break;
        case 'S': lit = hex = dlock__mysql_hexlit(v->sole, strlen(v->sole)); break;
        case 'D': lit = hex = dlock__mysql_hexlit(v->desc, strlen(v->desc)); break;
        case 'T': snprintf(num, sizeof(num), "%lld", v->ttl_us); lit = num; break;
        case 'P': snprintf(num, sizeof(num), "%lld", v->permits); lit = num; break;
        case 'K': snprintf(num, sizeof(num), "%llu", v->token); lit = num; break;
        /* the names, the owner id and the paths have checked bytes only
         * ([0-9A-Za-z:._-], '$', '"', '[', ']'): quoted as they are */
        case 'G': lit = v->gate; break;
        case 'H': lit = v->hold; break;
        case 'O': lit = v->owner; break;
        case 'A': lit = v->path; break;
        case 'E': lit = v->path_tok; break;
        case 'F': lit = v->path_end; break;
        default: bad = 1; break;
        }
        if (!lit) {
            bad = 1;
        } else if (hex || (*p == 'T' || *p == 'P' || *p == 'K')) {
            bad = dlock__buf_str(&out, lit) != 0;
        } else {
            bad = dlock__buf_printf(&out, "'%s'", lit) != 0;
        }
        free(hex);
    }
    if (bad) {
        dlock__buf_free(&out);
        return NULL;
    }
    return out.p;
}

/* The read holds' and permits' columns (docs/stores.md shows the DDL). */
#define COL_PERMITS "permits INT NOT NULL DEFAULT 0"
#define COL_HOLDERS                                                         \
    "holders LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL"

/* How many of the tables and of the new columns exist: *tables (0..2),
 * *has_permits, *has_holders; and DATABASE() into ms->dbname (once). */
static int look(my_store *ms, my_conn *cn, int64_t deadline, long long *tables,
                long long *has_permits, long long *has_holders)
{
    char qn[MY_TABLE_MAX + 8];
    MYSQL_RES *r = NULL;
    MYSQL_ROW row;
    int rc;

    snprintf(qn, sizeof(qn), "%s_queue", ms->table);
    char *ql = dlock__mysql_hexlit(qn, strlen(qn));
    char *sql =
        ql ? dlock__mysql_stmt(
                 "SELECT (SELECT COUNT(*) FROM information_schema.tables "
                 "WHERE table_schema = DATABASE() AND table_name IN "
                 "(CONVERT(%s USING utf8mb4), CONVERT(%s USING utf8mb4))), "
                 "(SELECT COUNT(*) FROM information_schema.columns WHERE "
                 "table_schema = DATABASE() AND table_name = CONVERT(%s "
                 "USING utf8mb4) AND column_name = 'permits'), (SELECT "
                 "COUNT(*) FROM information_schema.columns WHERE "
                 "table_schema = DATABASE() AND table_name = CONVERT(%s "
                 "USING utf8mb4) AND column_name = 'holders'), DATABASE()",
                 ms->tl, ql, ms->tl, ms->tl)
           : NULL;
    free(ql);
    rc = sql ? dlock__mysql_query(ms, cn, sql, deadline, &r, NULL, NULL,
                                  "looking for the lock table")
             : dlock__mysql_enomem();
    free(sql);
    *tables = *has_permits = *has_holders = 0;
    if (rc == DLOCK_OK && r && (row = mysql_fetch_row(r)) != NULL) {
        *tables = row[0] ? atoll(row[0]) : 0;
        *has_permits = row[1] ? atoll(row[1]) : 0;
        *has_holders = row[2] ? atoll(row[2]) : 0;
        if (!ms->dbname && row[3] && !(ms->dbname = strdup(row[3])))
            rc = dlock__mysql_enomem();
    }
    if (rc == DLOCK_OK && !ms->dbname)
        rc = dlock__err(DLOCK_EPROTO, "mysql %s: the server named no "
                                      "database (DATABASE() is NULL)",
                        ms->redacted);
    if (r)
        mysql_free_result(r);
    return rc;
}

/* A table of the previous version: adds the columns of read holds and
 * permits, waiting for the table's metadata lock (running statements
 * hold it: waiters asleep in their upsert) at most the store's timeout;
 * new statements on the table queue behind that wait. Not allowed, or
 * timed out: exclusive locks only (ms->rw 0, and why). */
static int migrate(my_store *ms, my_conn *cn, int64_t deadline,
                   long long has_permits, long long has_holders)
{
    long long secs = (ms->timeout_ms + 999) / 1000;
    char *sql = dlock__mysql_stmt(
        "SET SESSION lock_wait_timeout = %lld; ALTER TABLE %s %s%s%s%s; "
        "SET SESSION lock_wait_timeout = DEFAULT",
        secs, ms->t, has_permits ? "" : "ADD COLUMN " COL_PERMITS,
        !has_permits && !has_holders ? ", " : "",
        has_holders ? "" : "ADD COLUMN ", has_holders ? "" : COL_HOLDERS);
    int rc;

    if (!sql)
        return dlock__mysql_enomem();
    rc = dlock__mysql_query(ms, cn, sql, deadline, NULL, NULL, NULL,
                            "adding the columns of read holds and permits");
    free(sql);
    if (rc == DLOCK_OK) {
        ms->rw = 1;
        return DLOCK_OK;
    }
    unsigned e = mysql_errno(cn->m);
    cn->broken = 1; /* its lock_wait_timeout may be the short one */
    if (e == ER_DUP_FIELDNAME) {
        ms->rw = 1; /* another client added it meanwhile */
        return DLOCK_OK;
    }
    if (e != ER_LOCK_WAIT_TIMEOUT && rc != DLOCK_EAUTH && rc != DLOCK_EPROTO)
        return rc; /* the server: the open fails */
    snprintf(ms->rw_why, sizeof(ms->rw_why),
             "the lock table %.60s lacks the columns permits and holders, "
             "and adding them at open %s",
             ms->t,
             e == ER_LOCK_WAIT_TIMEOUT ? "timed out (the table was busy)"
                                       : "was refused (no ALTER right?)");
    return DLOCK_OK;
}

/* Creates the tables when missing (existing ones need no CREATE right),
 * and adds the columns a table of the previous version lacks. */
int dlock__mysql_ensure_schema(my_store *ms, my_conn *cn, int64_t deadline)
{
    long long tables, has_permits, has_holders;
    int rc = look(ms, cn, deadline, &tables, &has_permits, &has_holders);
    char *sql;

    if (rc)
        return rc;
    if (tables == 2 && has_permits && has_holders) {
        ms->rw = 1;
        return DLOCK_OK;
    }
    if (tables == 2) /* a table of the previous version */
        return migrate(ms, cn, deadline, has_permits, has_holders);
    sql = dlock__mysql_stmt(
        "CREATE TABLE IF NOT EXISTS %s ("
        " name VARBINARY(%d) NOT NULL PRIMARY KEY,"
        " owner VARBINARY(80) NULL,"
        " holder VARBINARY(255) NULL,"
        " holds INT NOT NULL DEFAULT 0,"
        " token BIGINT UNSIGNED NOT NULL DEFAULT 0,"
        " locked_at DATETIME(6) NOT NULL DEFAULT '1970-01-01 00:00:00',"
        " lock_until DATETIME(6) NOT NULL DEFAULT '1970-01-01 "
        "00:00:00',"
        " " COL_PERMITS ","
        " " COL_HOLDERS ") ENGINE=InnoDB",
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
    if (rc)
        return rc;
    /* the table existed (the previous version's?): its columns now */
    rc = look(ms, cn, deadline, &tables, &has_permits, &has_holders);
    if (rc)
        return rc;
    if (has_permits && has_holders) {
        ms->rw = 1;
        return DLOCK_OK;
    }
    return migrate(ms, cn, deadline, has_permits, has_holders);
}
