/* SPDX-License-Identifier: MIT */
/*
 * mysql_rw.c -- what read holds and permits add to the MySQL/MariaDB
 * store (mysql_int.h; the protocol and its failure cases are in
 * docs/design.md, "Shared holds and permits", the MySQL / MariaDB
 * paragraph):
 *
 *  - the holds live in the lock row: a sole holder in its own columns
 *    (`owner` '*' and its owner id, its token, end and start, its
 *    description in `holder`), several as entries (`owner` '*',
 *    `holders` a JSON object owner -> [owner, token, end µs, start µs,
 *    description], `lock_until` the latest end); `permits` a semaphore's
 *    N (0: readers). Every change is one statement on that row;
 *  - each hold keeps its hold lock (a user-level lock of its own) on its
 *    connection when it could take it, so that whoever waits for it
 *    sleeps in GET_LOCK on it (a hold lock only wakes: another session
 *    may hold it, and then the waiter sleeps to the hold's lease end);
 *  - their release and renewal (one UPDATE each, guarded by the hold's own
 *    token and live end, in either form; dlock_inspect()'s view of them
 *    is mysql_operate.c's);
 *  - what a waiter that holds the gate sees of the row (the state), a
 *    writer's drain of the readers, and a semaphore's head waiting on
 *    every holder's hold lock at once through pooled helper connections.
 *
 * The upserts that take them and the statement that releases them are in
 * mysql_sql.c, the acquire loop that uses all this in mysql_wait.c (its
 * tries' statements in mysql_try.c).
 */
#include "mysql_int.h"

#include <mysqld_error.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The server's clock in µs at the statement's start. */
#define NOW_US MY_US(NOW)

/* ------------------------------------------------------------------------ */
/* Release and renewal                                                      */
/* ------------------------------------------------------------------------ */

/* A hold's guarded statement's outcome: `rc` as it is, else DLOCK_OK when
 * it matched its row (`affected` 1), ENOTHELD when the hold was gone. */
static int matched(const my_store *ms, const dlock__lease *l, int rc,
                   uint64_t affected)
{
    if (rc)
        return rc;
    return affected == 1
               ? DLOCK_OK
               : dlock__err(DLOCK_ENOTHELD,
                            "mysql %s: this %s is no longer in the lock row "
                            "(its lease ended, or a writer took the row)",
                            ms->redacted,
                            l->kind == DLOCK__PERMIT ? "permit" : "read hold");
}

/* The hold's own guard: `form` SOLE, its sole hold ('*' and its owner id,
 * its token, a live lease); ANY, that or its entry (its token, its end
 * still ahead). */
enum { SOLE, ANY };

/* UPDATE `set` guarded by the hold's own hold in `form`, then `after` on
 * the hold's connection in the same round trip. A hold whose connection
 * died runs it on a pooled one; `repin` then also takes the hold lock
 * there and keeps that connection for the hold (a renewal). *id: the
 * statement's LAST_INSERT_ID (may be NULL). DLOCK_OK, ENOTHELD, or an
 * error. */
static int guarded(my_store *ms, dlock__lease *l, const char *set, int form,
                   const char *after, int repin, int64_t op_deadline,
                   uint64_t *id, const char *what)
{
    my_lease *sl = l->priv;
    char pt[128], pe[128];
    char *name = dlock__mysql_hexlit(l->name, l->name_len);
    char *owner = dlock__mysql_hexlit(l->owner, strlen(l->owner));
    char *sole = dlock__mysql_sole_owner(l->owner);
    char *hold = name && owner ? dlock__mysql_hold_lock_of(ms, name, owner)
                               : NULL;
    int pinned = dlock__mysql_pinned_alive(sl);
    uint64_t affected = 0;
    MYSQL_RES *r = NULL;
    my_conn *cn = NULL;
    char *sql = NULL, *entry = NULL;
    int rc;

    rc = dlock__mysql_owner_path(l->owner, "[1]", pt, sizeof(pt));
    if (!rc)
        rc = dlock__mysql_owner_path(l->owner, "[2]", pe, sizeof(pe));
    if (!rc && form == ANY)
        entry = dlock__mysql_stmt(
            " OR owner <=> " MY_SHARED " AND CAST(JSON_EXTRACT(holders, "
            "'%s') AS UNSIGNED) = %llu AND CAST(JSON_EXTRACT(holders, '%s') "
            "AS SIGNED) > " NOW_US,
            pt, (unsigned long long)l->token, pe);
    else if (!rc)
        entry = dlock__mysql_stmt("%s", "");
    if (!rc && hold && sole && entry)
        sql = dlock__mysql_stmt(
            "UPDATE %s SET %s WHERE name = %s AND %sowner = %s AND token = "
            "%llu AND lock_until > " NOW "%s%s%s%s%s",
            ms->t, set, name, form == ANY ? "(" : "", sole,
            (unsigned long long)l->token, entry, form == ANY ? ")" : "",
            pinned && after ? "; " : "", pinned && after ? after : "",
            !pinned && repin ? "; SELECT IF(ROW_COUNT() > 0, GET_LOCK(" : "");
    if (sql && !pinned && repin) {
        char *more = dlock__mysql_stmt("%s%s, 0), NULL)", sql, hold);
        free(sql);
        sql = more;
    }
    if (!rc && !sql)
        rc = dlock__mysql_enomem();
    if (!rc && pinned) {
        rc = dlock__mysql_query(ms, sl->cn, sql, op_deadline, NULL, &affected,
                                id, what);
        if (rc && dlock__mysql_killed(sl->cn)) {
            /* the session went under the statement (a break kills the
             * sessions of the holds it takes): the UPDATE's answer
             * decides if it came, else it runs again on a pooled
             * connection (guarded: it matches only a hold still ours) */
            rc = sl->cn->answered
                     ? DLOCK_OK
                     : dlock__mysql_query_pooled(ms, sql, op_deadline, NULL,
                                                 &affected, id, what);
        }
    } else if (!rc && !repin) {
        rc = dlock__mysql_query_pooled(ms, sql, op_deadline, NULL, &affected,
                                       id, what);
    } else if (!rc) {
        /* a renewal without its connection: a new one, which takes the
         * hold lock again and stays the hold's */
        if (op_deadline > dlock__now_ms() + ms->timeout_ms)
            op_deadline = dlock__now_ms() + ms->timeout_ms;
        rc = dlock__mysql_conn_get(ms, op_deadline, &cn);
        if (!rc)
            rc = dlock__mysql_query(ms, cn, sql, op_deadline, &r, &affected,
                                    id, what);
        if (!rc && affected == 1 && dlock__mysql_col_ll(r, 0, 0) == 1) {
            dlock__mysql_conn_put(ms, sl->cn); /* the dead one: closed */
            sl->cn = cn;
            cn = NULL;
        } else if (cn && !rc) {
            (void)dlock__mysql_query(ms, cn, "DO RELEASE_ALL_LOCKS()",
                                     op_deadline, NULL, NULL, NULL, what);
        }
        if (r)
            mysql_free_result(r);
        dlock__mysql_conn_put(ms, cn);
    }
    free(sql);
    free(entry);
    free(hold);
    free(sole);
    free(name);
    free(owner);
    return matched(ms, l, rc, affected);
}

/* The latest live end of the holds in `holders`, as the lock's end. */
#define LATEST_END                                                          \
    "(SELECT '1970-01-01' + INTERVAL MAX(j.e) MICROSECOND FROM JSON_TABLE(" \
    "holders, " MY_HOLDERS_COLS ") j WHERE j.e > " NOW_US ")"

/* The client's note, per name (the lease's hint[1]), that others held
 * beside its last shared hold there: its next take is then the full one
 * at once (the light one would be busy). */
static void others_note(dlock__lease *l, int others)
{
    if (l->hint)
        __atomic_store_n(&l->hint[1], others, __ATOMIC_RELAXED);
}

/* The release for either form: on the hold's connection (prepared there,
 * or text if the server refused it), else on a pooled one. */
static int release_any(my_store *ms, dlock__lease *l, const my_vals *v,
                       int64_t op_deadline, uint64_t *id)
{
    my_lease *sl = l->priv;
    int pinned = dlock__mysql_pinned_alive(sl);
    uint64_t affected = 0;
    int rc = MY_PS_TEXT;

    if (pinned)
        rc = dlock__mysql_ps_run(ms, sl->cn, MY_PS_RELEASE, v, op_deadline,
                                 &affected, id, "releasing the lock");
    if (rc && rc != MY_PS_TEXT && pinned && dlock__mysql_killed(sl->cn)) {
        pinned = 0; /* killed under it: again, on a pooled one */
        rc = MY_PS_TEXT;
    }
    if (rc == MY_PS_TEXT) {
        char *sql = dlock__mysql_fill(ms->tmpl[MY_PS_RELEASE], v);
        if (!sql)
            rc = dlock__mysql_enomem();
        else if (pinned)
            rc = dlock__mysql_query(ms, sl->cn, sql, op_deadline, NULL,
                                    &affected, id, "releasing the lock");
        else
            rc = dlock__mysql_query_pooled(ms, sql, op_deadline, NULL,
                                           &affected, id,
                                           "releasing the lock");
        if (rc && pinned && dlock__mysql_killed(sl->cn))
            rc = dlock__mysql_query_pooled(ms, sql, op_deadline, NULL,
                                           &affected, id,
                                           "releasing the lock");
        free(sql);
    }
    return matched(ms, l, rc, affected);
}

int dlock__mysql_release_shared(my_store *ms, dlock__lease *l,
                                int64_t op_deadline)
{
    my_lease *sl = l->priv;
    uint64_t id = 0;
    int rc = DLOCK_OK;

    if (!sl->has_v && (rc = dlock__mysql_vals(ms, l, &sl->v)) == DLOCK_OK)
        sl->has_v = 1;
    sl->v.token = l->token;
    if (!rc && sl->sole) {
        /* taken sole: the exclusive release's shape first */
        rc = guarded(ms, l,
                     "owner = NULL, holder = NULL, holds = 0 * "
                     "RELEASE_ALL_LOCKS(), lock_until = " NOW,
                     SOLE, NULL, 0, op_deadline, NULL, "releasing the lock");
        if (rc == DLOCK_ENOTHELD)
            rc = release_any(ms, l, &sl->v, op_deadline, &id);
    } else if (!rc) {
        rc = release_any(ms, l, &sl->v, op_deadline, &id);
    }
    if (rc == DLOCK_OK)
        others_note(l, id == 2);
    if (sl->cn) {
        /* a release that matched nothing kept the hold lock: let go */
        if (rc == DLOCK_ENOTHELD &&
            dlock__mysql_query(ms, sl->cn, "DO RELEASE_ALL_LOCKS()",
                               op_deadline, NULL, NULL, NULL,
                               "releasing the lock") != DLOCK_OK)
            sl->cn->broken = 1;
        if (rc != DLOCK_OK && rc != DLOCK_ENOTHELD)
            sl->cn->broken = 1; /* closing it lets go of the hold lock */
        dlock__mysql_conn_put(ms, sl->cn);
        sl->cn = NULL;
        sl->gated = sl->locks = 0;
    }
    return rc;
}

int dlock__mysql_extend_shared(my_store *ms, dlock__lease *l, int64_t ttl_ms,
                               int64_t op_deadline)
{
    char path[128], pe[128];
    char *oj = dlock__mysql_hexlit(l->owner, strlen(l->owner));
    int rc = dlock__mysql_owner_path(l->owner, "", path, sizeof(path));
    char *set = NULL;

    if (!rc)
        rc = dlock__mysql_owner_path(l->owner, "[2]", pe, sizeof(pe));
    /* a sole holder: its end. Entries: our end only (the other holds as
     * they are, the ended ones dropped); the lock's end the latest live
     * one (a shorter ttl may lower it) */
    if (!rc && oj)
        set = dlock__mysql_stmt(
            "holders = IF(owner <=> " MY_SHARED ", JSON_SET(JSON_SET(IFNULL(("
            "SELECT JSON_OBJECTAGG(j.o, JSON_ARRAY(j.o, j.t, j.e, j.s, j.d)) "
            "FROM JSON_TABLE(holders, " MY_HOLDERS_COLS ") j WHERE j.e > "
            NOW_US " AND j.o <> %s), '{}'), '%s', JSON_EXTRACT(holders, "
            "'%s')), '%s', " NOW_US " + %lld), holders), lock_until = IF("
            "owner <=> " MY_SHARED ", " LATEST_END ", " NOW " + INTERVAL %lld "
            "MICROSECOND), holds = IF(owner <=> " MY_SHARED ", JSON_LENGTH("
            "holders), 1), " HOLDER_TEXT,
            oj, path, path, pe, (long long)ttl_ms * 1000,
            (long long)ttl_ms * 1000);
    if (!rc)
        rc = set ? guarded(ms, l, set, ANY, NULL, 1, op_deadline, NULL,
                           "extending the lease")
                 : dlock__mysql_enomem();
    if (rc == DLOCK_ENOTHELD) /* its hold lock: a waiter may sleep on it */
        dlock__mysql_let_go_lost(ms, l->priv, op_deadline);
    free(set);
    free(oj);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* The state a waiter holding the gate sees, and a writer's drain           */
/* ------------------------------------------------------------------------ */

void dlock__mysql_state_free(my_state *st)
{
    free(st->lk_owner);
    free(st->lk_ms);
    st->lk_owner = NULL;
    st->lk_ms = NULL;
    st->nlk = 0;
}

/* One row per live hold (at least one row): whether we hold the gate,
 * the row's lease left and who holds it, the hold's owner, its lease left
 * and whether its hold lock is held (its session alive). */
int dlock__mysql_state(my_store *ms, dlock__lease *l, const char *name,
                       const char *gate, int64_t deadline, my_state *st)
{
    my_lease *sl = l->priv;
    char *hold = dlock__mysql_hold_lock_of(ms, name, "j.o");
    char *ow = dlock__mysql_hexlit(l->owner, strlen(l->owner));
    /* our own entry, if any (a try whose answer was lost), does not
     * count: our next try adopts it */
    char *sql =
        hold && ow ? dlock__mysql_stmt(
                   "SELECT IS_USED_LOCK(%s) <=> CONNECTION_ID(), "
                   "TIMESTAMPDIFF(MICROSECOND, " NOW ", t.lock_until) DIV "
                   "1000 + 1, IF(t.name IS NULL OR t.holds = 0 OR "
                   "t.lock_until <= " NOW ", 0, IF(" MY_SHARED_ANY("t.owner")
                   ", IF(t.permits > 0, 3 + t.permits, 2), 1)), j.o, (j.e - "
                   NOW_US ") DIV 1000 + 1, IS_USED_LOCK(%s) IS NOT NULL FROM "
                   "(SELECT 1) d LEFT JOIN %s t ON t.name = %s LEFT JOIN "
                   "JSON_TABLE(" MY_HOLDS_OF("t.") ", " MY_HOLDERS_COLS ") j "
                   "ON j.e > " NOW_US " AND j.o <> %s",
                   gate, hold, ms->t, name, ow)
             : NULL;
    MYSQL_RES *r = NULL;
    MYSQL_ROW row;
    int rc;

    memset(st, 0, sizeof(*st));
    st->left_ms = st->unlocked_first_ms = st->unlocked_last_ms = -1;
    rc = sql ? dlock__mysql_query(ms, sl->cn, sql, deadline, &r, NULL, NULL,
                                  "waiting for the lock")
             : dlock__mysql_enomem();
    free(sql);
    free(hold);
    free(ow);
    if (rc == DLOCK_OK && r) {
        size_t n = (size_t)mysql_num_rows(r);
        st->lk_owner = calloc(n ? n : 1, sizeof(*st->lk_owner));
        st->lk_ms = calloc(n ? n : 1, sizeof(*st->lk_ms));
        if (!st->lk_owner || !st->lk_ms)
            rc = dlock__mysql_enomem();
    }
    while (rc == DLOCK_OK && r && (row = mysql_fetch_row(r)) != NULL) {
        st->gated = row[0] && !strcmp(row[0], "1");
        st->left_ms = row[1] ? atoll(row[1]) : -1;
        st->code = row[2] ? atoll(row[2]) : 0;
        if (!row[3])
            continue; /* no live hold */
        long long left = row[4] ? atoll(row[4]) : 1;
        st->live++;
        if (row[5] && !strcmp(row[5], "1")) {
            snprintf(st->lk_owner[st->nlk], sizeof(st->lk_owner[0]), "%s",
                     row[3]);
            st->lk_ms[st->nlk++] = left;
            st->locked++;
        } else {
            if (st->unlocked_first_ms < 0 || left < st->unlocked_first_ms)
                st->unlocked_first_ms = left;
            if (left > st->unlocked_last_ms)
                st->unlocked_last_ms = left;
        }
    }
    if (r)
        mysql_free_result(r);
    if (rc)
        dlock__mysql_state_free(st);
    return rc;
}

char *dlock__mysql_settle(const my_store *ms, const char *name)
{
    /* the latest live end (now when none: the row is free) */
    return dlock__mysql_stmt(
        "UPDATE %s SET lock_until = IFNULL(" LATEST_END ", " NOW "), "
        "holds = IF(lock_until > " NOW ", holds, 0), owner = IF(holds = 0, "
        "NULL, owner) WHERE name = %s AND owner <=> " MY_SHARED " AND "
        "permits = 0 AND lock_until > " NOW "; ",
        ms->t, name);
}

char *dlock__mysql_drain(const my_store *ms, const char *name,
                         int64_t wait_ms, const char *mid,
                         const char *upsert)
{
    char *hold = dlock__mysql_hold_lock_of(ms, name, "j.o");
    /* each wait's length from the server's clock when it starts: the
     * reader's lease left + 1 ms, cut at the wait's end (@dlock_dl) */
    char *sql =
        hold ? dlock__mysql_stmt(
                   "SET time_zone = '+00:00', @dlock_t0 = " NOW ", @dlock_dl "
                   "= " NOW_US " + %lld; %sSELECT COUNT(IF(GET_LOCK(%s, "
                   "GREATEST(0, LEAST(j.e, @dlock_dl) - " MY_US("SYSDATE(6)")
                   ") / 1000000 + 0.001) = 1, RELEASE_LOCK(%s), NULL)) FROM "
                   "%s t, JSON_TABLE(" MY_HOLDS_OF("t.") ", " MY_HOLDERS_COLS
                   ") j WHERE t.name = %s AND j.e > " NOW_US "; %s",
                   (long long)wait_ms * 1000, mid, hold, hold, ms->t, name,
                   upsert)
             : NULL;

    free(hold);
    return sql;
}

/* ------------------------------------------------------------------------ */
/* A semaphore's head                                                       */
/* ------------------------------------------------------------------------ */

/* A helper's answer: was it let go cleanly (GET_LOCK not granted, or
 * granted and released by the same statement)? */
static int helper_clean(const my_async *a)
{
    MYSQL_ROW row;

    if (a->failed || !a->res)
        return 0;
    mysql_data_seek(a->res, 0);
    row = mysql_fetch_row(a->res);
    if (!row)
        return 0;
    if (!row[0] || !strcmp(row[0], "0"))
        return 1;
    return !strcmp(row[0], "1") && row[1] && !strcmp(row[1], "1");
}

int dlock__mysql_head_wait(my_store *ms, dlock__lease *l, const char *name,
                           const my_state *st, int64_t timer_ms)
{
    my_lease *sl = l->priv;
    my_async a[MY_PERMITS_MAX];
    struct pollfd p[MY_PERMITS_MAX + 2]; /* the gate's, helpers', the cancel */
    int n = st->nlk < MY_PERMITS_MAX ? st->nlk : MY_PERMITS_MAX;
    int64_t start = dlock__now_ms(), until = l->deadline;
    int rc = DLOCK_OK, main_dead = 0, started = 0;

    if (timer_ms >= 0 && start + timer_ms < until)
        until = start + timer_ms;
    if (until > start + MY_WAIT_SLICE_MS)
        until = start + MY_WAIT_SLICE_MS;
    memset(a, 0, sizeof(a));
    /* one helper per holder whose session holds its hold lock */
    for (int i = 0; i < n && rc == DLOCK_OK; i++) {
        int64_t w = st->lk_ms[i] - (dlock__now_ms() - start);
        if (w > until - dlock__now_ms())
            w = until - dlock__now_ms();
        if (w < 0)
            w = 0;
        char *ow = dlock__mysql_hexlit(st->lk_owner[i],
                                       strlen(st->lk_owner[i]));
        char *hold = ow ? dlock__mysql_hold_lock_of(ms, name, ow) : NULL;
        char *sql = hold ? dlock__mysql_stmt(
                               "SELECT GET_LOCK(%s, %lld.%03lld), "
                               "RELEASE_LOCK(%s)",
                               hold, (long long)(w / 1000),
                               (long long)(w % 1000), hold)
                         : NULL;
        free(ow);
        free(hold);
        if (!sql)
            rc = dlock__mysql_enomem();
        else
            rc = dlock__mysql_conn_get(ms, dlock__now_ms() + ms->timeout_ms,
                                       &a[i].cn);
        if (rc == DLOCK_OK) {
            dlock__mysql_async_start(&a[i], sql);
            started++;
        }
        free(sql);
    }
    /* asleep: poll them and the gate's connection (its socket readable:
     * the server closed it, and the gate went with it) */
    int woken = rc != DLOCK_OK;
    while (!woken) {
        int64_t left = until - dlock__now_ms();
        if (left <= 0)
            break;
        p[0].fd = mysql_get_socket(sl->cn->m);
        p[0].events = POLLIN;
        p[0].revents = 0;
        for (int i = 0; i < started; i++) {
            short ev = dlock__mysql_async_events(&a[i]);
            p[i + 1].fd = ev < 0 ? -1 : mysql_get_socket(a[i].cn->m);
            p[i + 1].events = ev < 0 ? 0 : ev;
            p[i + 1].revents = 0;
            if (ev < 0)
                woken = 1; /* answered already */
        }
        if (woken)
            break;
        /* a dlock_cancel() ends the sleep as a wake-up would */
        p[started + 1].fd = l->cancel_fd;
        p[started + 1].events = POLLIN;
        p[started + 1].revents = 0;
        int pr = poll(p, (nfds_t)started + 2, left > 1000 ? 1000 : (int)left);
        if (pr < 0)
            continue; /* EINTR: the deadline bounds the loop */
        if (p[started + 1].revents) {
            woken = 1;
            break;
        }
        if (p[0].revents) {
            main_dead = woken = 1;
            break;
        }
        for (int i = 0; i < started; i++)
            if (p[i + 1].revents) {
                dlock__mysql_async_step(&a[i], p[i + 1].revents);
                if (dlock__mysql_async_events(&a[i]) < 0)
                    woken = 1;
            }
    }
    /* wake the others: KILL QUERY from the gate's connection (our own
     * sessions); an interrupted GET_LOCK answers NULL */
    for (int i = 0; i < started && !main_dead; i++) {
        char kill[64];
        if (dlock__mysql_async_events(&a[i]) < 0)
            continue;
        snprintf(kill, sizeof(kill), "KILL QUERY %lu",
                 (unsigned long)mysql_thread_id(a[i].cn->m));
        if (dlock__mysql_query(ms, sl->cn, kill,
                               dlock__now_ms() + ms->timeout_ms, NULL, NULL,
                               NULL, "waking the helpers") != DLOCK_OK &&
            sl->cn->broken)
            main_dead = 1;
    }
    /* read every answer (the store's timeout at most); a helper that may
     * keep a hold lock, or did not answer, is closed, not pooled */
    int64_t stop = dlock__now_ms() + ms->timeout_ms;
    for (;;) {
        int pending = 0;
        for (int i = 0; i < started; i++) {
            short ev = dlock__mysql_async_events(&a[i]);
            p[i].fd = ev < 0 ? -1 : mysql_get_socket(a[i].cn->m);
            p[i].events = ev < 0 ? 0 : ev;
            p[i].revents = 0;
            pending += ev >= 0;
        }
        int64_t left = stop - dlock__now_ms();
        if (!pending || left <= 0 || main_dead)
            break;
        if (poll(p, (nfds_t)started, left > 1000 ? 1000 : (int)left) > 0)
            for (int i = 0; i < started; i++)
                if (p[i].revents)
                    dlock__mysql_async_step(&a[i], p[i].revents);
    }
    for (int i = 0; i < n; i++) {
        if (!a[i].cn)
            continue;
        if (dlock__mysql_async_events(&a[i]) >= 0 || !helper_clean(&a[i]))
            a[i].cn->broken = 1;
        if (a[i].res)
            mysql_free_result(a[i].res);
        dlock__mysql_conn_put(ms, a[i].cn);
    }
    if (main_dead) {
        sl->cn->broken = 1;
        return dlock__err(DLOCK_ECONN,
                          "mysql %s: the connection that held the gate was "
                          "closed while waiting for a permit",
                          ms->redacted);
    }
    return rc;
}
