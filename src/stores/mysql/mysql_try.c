/* SPDX-License-Identifier: MIT */
/*
 * mysql_try.c -- the statements of one try of the MySQL/MariaDB store's
 * acquire (mysql_try.h; the acquire and its waiting in the server are in
 * mysql_wait.c): the upsert guarded by the gate, the wait's SET before
 * it, the queue entry a listed waiter joins and keeps alive, the drain,
 * the settling of a readers' row, all in one round trip.
 */
#include "mysql_try.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLEAR_ID "LAST_INSERT_ID(0) = 0 AND "

/* A waiter's entry in T_queue for dlock_inspect(): alive while this
 * connection holds the entry's own lock (taken by alive_sql(), which
 * follows in the same round trip); its seq in @dlock_q. Its description
 * says its kind when readers or permits use the name. Two statements and
 * "; ". */
static char *join_sql(const my_acq *a)
{
    const dlock__lease *l = a->l;
    const char *kind = l->kind == DLOCK__READ     ? "read: "
                       : l->kind == DLOCK__PERMIT ? "permit: "
                       : a->kinds                 ? "write: "
                                                  : "";
    char desc[300];

    snprintf(desc, sizeof(desc), "%s%s", kind, l->desc);
    char *holder = dlock__mysql_hexlit(desc, strlen(desc));
    char *join = holder ? dlock__mysql_stmt("INSERT INTO %s (name, holder, "
                                            "alive_until) VALUES (%s, %s, "
                                            NOW "); SET @dlock_q = "
                                            "LAST_INSERT_ID(); ",
                                            a->ms->q, a->name, holder)
                        : NULL;
    free(holder);
    return join;
}

/* A listed waiter's entry counts while its session holds the entry's
 * lock and its last wait has not ended (+ the grace): each wait writes
 * its end into the entry (here an expression of seconds from now), in
 * the statement that takes the entry's lock when free (the first one
 * takes it: an entry whose end lies ahead holds it, or held it; gc reads
 * it so). A statement and "; ". */
static char *alive_sql(const my_acq *a, const char *secs)
{
    char *lock = dlock__mysql_entry_lock_of(a->ms, "@dlock_q");
    char *sql = lock ? dlock__mysql_stmt(
                           "UPDATE %s SET alive_until = " NOW " + INTERVAL "
                           "ROUND((%s) * 1000000) MICROSECOND WHERE seq = "
                           "@dlock_q AND GET_LOCK(%s, 0) IS NOT NULL; ",
                           a->ms->q, secs, lock)
                     : NULL;

    free(lock);
    return sql;
}

/* The same, in a round trip of its own, before a sleep in the client
 * (holding the gate) of `ms_left`. */
void dlock__mysql_alive_for(const my_acq *a, int64_t ms_left)
{
    char secs[48];
    char *sql;

    if (!a->sl->seq || !a->sl->cn)
        return;
    snprintf(secs, sizeof(secs), "%lld.%03lld", (long long)(ms_left / 1000),
             (long long)(ms_left % 1000));
    sql = alive_sql(a, secs);
    if (!sql || dlock__mysql_query(a->ms, a->sl->cn, sql,
                                   dlock__now_ms() + a->ms->timeout_ms, NULL,
                                   NULL, NULL, "waiting for the lock"))
        a->sl->cn->broken = !sql ? a->sl->cn->broken : 1;
    free(sql);
}

/* The try of kind `kind` (wait_ms: how long a waiting one may wait), and
 * in *at which of its statements is the upsert. */
char *dlock__mysql_try_sql(const my_acq *a, int kind, int64_t wait_ms,
                           int *at)
{
    const my_store *ms = a->ms;
    const dlock__lease *l = a->l;
    int waits = kind == TRY_WAIT;
    /* a try that does not hold the gate: the row decides */
    int bare = kind == TRY_GATE || kind == TRY_TAKEOVER || kind == TRY_LAST;
    /* listed already (or in this round trip): only older entries count */
    int older = a->sl->seq != 0;
    /* a busy answer says who holds: a writer's, unless its try is the
     * exclusive lock's cheaper statement (mysql_sql.c) */
    int rich = a->rich || (kind != TRY_GATE && kind != TRY_TAKEOVER);
    char *where, *up, *del, *sql = NULL, *count = NULL;

    /* the queue entries that count keep an ordered try out (a fair
     * writer's; a reader's and a permit's: a writer waiting for the
     * readers, a semaphore's head) */
    if (bare && a->ordered &&
        !(a->shared && kind == TRY_GATE &&
          (a->first == FIRST_LIGHT || a->waits)) &&
        !(count = dlock__mysql_counting(ms, a->name, older)))
        return NULL;
    /* every guard first clears LAST_INSERT_ID: a guard that fails leaves
     * the statement's answer 0, not the session's last id (a queue
     * entry's), which a busy answer would read as who holds */
    if (!a->shared) {
        /* a writer's try takes the gate when it is free, and decides by
         * the row (dlock__mysql_upsert() with the gate); its try says who
         * holds only if this client saw readers or permits on the name;
         * a fair one takes nothing while an entry counts, unless it got
         * the gate (nobody is queued at it) */
        if (waits)
            where = dlock__mysql_stmt(" WHERE " CLEAR_ID
                                      "GET_LOCK(@dlock_g, @dlock_w) = 1");
        else if (kind == TRY_HELD || kind == TRY_DRAIN)
            where = dlock__mysql_stmt("%s", "");
        else if (count)
            where = dlock__mysql_stmt(" WHERE %s(GET_LOCK(%s, 0) = 1 OR NOT "
                                      "%s)",
                                      rich ? CLEAR_ID : "", a->gate, count);
        else
            where = dlock__mysql_stmt(" WHERE %sGET_LOCK(%s, 0) IS NOT NULL",
                                      rich ? CLEAR_ID : "", a->gate);
    } else if (kind == TRY_GATE && a->first == FIRST_LIGHT) {
        /* the light take: a free gate (nobody waits, nobody is being
         * woken) and its own hold lock; else the full take decides */
        where = dlock__mysql_stmt(" WHERE " CLEAR_ID "IS_FREE_LOCK(%s) = 1 "
                                  "AND GET_LOCK(%s, 0) = 1",
                                  a->gate, a->hold);
    } else if (bare) {
        /* the full take: busy while an entry counts (a free gate: nobody
         * is queued); the hold lock taken when free, a condition of
         * nothing (any session may hold it). The first try of a call that
         * will wait is busy whenever the gate is taken, as before: a
         * writer that took the gate lists itself in its next round trip,
         * and readers that came in meanwhile would hold up its drain
         * (measured: a writer under a flood of readers waited 1.5x as
         * long); it then waits at the gate, and its takeovers and last
         * try decide by the entries (a foreign session on the gate costs
         * it the lease end it read, never its deadline) */
        where = count ? dlock__mysql_stmt(" WHERE " CLEAR_ID "(IS_FREE_LOCK("
                                          "%s) = 1 OR NOT %s) AND GET_LOCK(%s, "
                                          "0) IS NOT NULL",
                                          a->gate, count, a->hold)
                      : dlock__mysql_stmt(" WHERE " CLEAR_ID "IS_FREE_LOCK(%s) "
                                          "= 1 AND GET_LOCK(%s, 0) IS NOT NULL",
                                          a->gate, a->hold);
    } else {
        where = dlock__mysql_stmt(
            " WHERE " CLEAR_ID "%sGET_LOCK(%s, 0) IS NOT NULL",
            waits ? "GET_LOCK(@dlock_g, @dlock_w) = 1 AND " : "", a->hold);
    }
    free(count);
    /* a read hold or permit taken holding the gate lets go of it in its
     * upsert: that wakes the next waiter */
    int lets_go = a->shared && (kind == TRY_WAIT || kind == TRY_HELD);
    char *tmpl = NULL;
    int light = kind == TRY_GATE && a->first == FIRST_LIGHT;
    /* a try (and a waiter holding the gate) drops ended holds and counts
     * the live ones: a permit whose holder's lease ran out is free */
    if (where && a->shared && !light)
        tmpl = dlock__mysql_upsert_shared(ms, l->kind == DLOCK__PERMIT, where,
                                          waits, 1, kind == TRY_HELD || bare,
                                          lets_go ? a->gate : NULL, bare);
    up = !where ? NULL
         : a->shared && light
             ? dlock__mysql_upsert_light(ms, l, a->name, a->holder, where)
         : a->shared ? (tmpl ? dlock__mysql_fill(tmpl, a->v) : NULL)
             : dlock__mysql_upsert(ms, l, a->name, a->owner, a->holder, where,
                                   waits, rich, bare ? a->gate : NULL);
    free(tmpl);
    /* a waiter listed for dlock_inspect() joins the queue in its first
     * wait's round trip (its entry's seq kept in @dlock_q), and the entry
     * goes with the win */
    int joins = a->listed && !a->sl->seq && (waits || kind == TRY_DRAIN);
    char *join = joins ? join_sql(a) : dlock__mysql_stmt("%s", "");
    del = a->sl->seq || joins
              ? dlock__mysql_stmt("; DELETE FROM %s WHERE seq = @dlock_q AND "
                                  "ROW_COUNT() > 0",
                                  ms->q)
              : kind == TRY_LAST
              /* a busy last try lets go of the gate it may have taken */
              ? dlock__mysql_stmt("; DO IF(ROW_COUNT() > 0, 0, "
                                  "RELEASE_ALL_LOCKS())")
              : dlock__mysql_stmt("%s", "");
    /* a writer holding the gate first settles a readers' row: its end
     * the latest live hold's (a release keeps an upper bound), free when
     * none is live; so does its last try */
    char *settle = !a->shared && ms->rw &&
                           (kind == TRY_HELD || kind == TRY_LAST)
                       ? dlock__mysql_settle(ms, a->name)
                       : dlock__mysql_stmt("%s", "");
    /* a listed waiter's entry: the end of the wait it starts */
    char *alive = a->listed && (waits || kind == TRY_DRAIN)
                      ? alive_sql(a, waits ? "@dlock_w"
                                           : "(@dlock_dl - " MY_US(NOW)
                                             ") / 1000000")
                      : dlock__mysql_stmt("%s", "");
    *at = joins ? 2 : 0;
    if (!up || !del || !settle || !join || !alive) {
        sql = NULL;
    } else if (kind == TRY_DRAIN) {
        char *d = dlock__mysql_drain(ms, a->name, wait_ms, alive, up);
        sql = d ? dlock__mysql_stmt("%s%s%s", join, d, del) : NULL;
        free(d);
        *at += 2 + (alive[0] != '\0');
    } else if (!waits) {
        sql = dlock__mysql_stmt("%s%s%s", settle, up, del);
        *at = settle[0] ? 1 : 0;
    } else {
        /* a waiting try first sets its gate and the wait's length (the
         * holder's lease left + 1 ms; a row that ended, whose gate
         * another session holds: the rest of the grace after its end, in
         * which the waiter the release woke takes it, and for a waiter
         * that keeps the queue's order, until the older entries that
         * count stop counting), and sleeps in the upsert's GET_LOCK */
        char *wait_older = NULL;
        if (a->ordered) {
            char *lock = dlock__mysql_entry_lock_of(ms, "q.seq");
            wait_older =
                lock ? dlock__mysql_stmt(
                           ", IFNULL((SELECT TIMESTAMPDIFF(MICROSECOND, " NOW
                           ", MAX(q.alive_until) + INTERVAL " MY_GRACE_US
                           " MICROSECOND) / 1000000 + 0.001 FROM %s q WHERE "
                           "q.name = %s AND q.seq < @dlock_q AND "
                           "q.alive_until > " NOW " - INTERVAL " MY_GRACE_US
                           " MICROSECOND AND IS_USED_LOCK(%s) IS NOT NULL), "
                           "0)",
                           ms->q, a->name, lock)
                     : NULL;
            free(lock);
        } else {
            wait_older = dlock__mysql_stmt("%s", "");
        }
        sql = !wait_older
                  ? NULL
                  : dlock__mysql_stmt(
                        "%sSET time_zone = '+00:00', @dlock_t0 = " NOW ", "
                        "@dlock_g = %s, @dlock_w = LEAST(%lld.%03lld, "
                        "IFNULL((SELECT IF(lock_until > " NOW ", %sGREATEST("
                        "0.001, TIMESTAMPDIFF(MICROSECOND, " NOW ", "
                        "lock_until) / 1000000 + 0.001)%s, GREATEST(0.001, "
                        "TIMESTAMPDIFF(MICROSECOND, " NOW ", lock_until + "
                        "INTERVAL " MY_GRACE_US " MICROSECOND) / 1000000 + "
                        "0.001%s)) FROM %s WHERE name = %s), %lld.%03lld)); "
                        "%s%s%s",
                        join, a->gate, (long long)(wait_ms / 1000),
                        (long long)(wait_ms % 1000),
                        /* a lock's waiter does not sleep behind a live
                         * semaphore (its answer, and the look after it,
                         * say so) */
                        ms->rw && l->kind != DLOCK__PERMIT
                            ? "IF(" MY_SHARED_ANY("owner") " AND permits > 0, "
                              "0, "
                            : "(",
                        ")", wait_older, ms->t, a->name,
                        (long long)(l->ttl_ms / 1000),
                        (long long)(l->ttl_ms % 1000), alive, up, del);
        free(wait_older);
        *at += 1 + (alive[0] != '\0');
    }
    free(where);
    free(up);
    free(del);
    free(settle);
    free(join);
    free(alive);
    return sql;
}
