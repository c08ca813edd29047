/* SPDX-License-Identifier: MIT */
/*
 * mysql_wait.c -- the MySQL/MariaDB store's acquire (mysql_int.h): the
 * try, and the waiting in the server: a waiter sleeps in GET_LOCK on the
 * name's gate inside its try, and the holder's release wakes it (the
 * protocol is in mysql.c's header comment; its failure cases in
 * docs/design.md, "Waiting in the server (MySQL)"). A fair waiter's
 * queue entry, a session killed while it waits, a holder that lost its
 * gate, a frozen holder whose lease ends.
 */
#include "mysql_int.h"

#include <mysqld_error.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How a try treats the gate. */
enum { TRY_GATE, TRY_HELD, TRY_TAKEOVER, TRY_WAIT };

/* Drops what a lease without the lock keeps in the server (its gate, its
 * queue entry) and gives its connection back. */
static void let_go(my_store *ms, my_lease *sl)
{
    if (!sl->cn)
        return;
    if (sl->gated || sl->seq) {
        char *sql = sl->seq
                        ? dlock__mysql_stmt("DELETE FROM %s WHERE seq = %lld; "
                                            "DO RELEASE_ALL_LOCKS()",
                                            ms->q, (long long)sl->seq)
                        : dlock__mysql_stmt("DO RELEASE_ALL_LOCKS()");
        /* on failure the connection closes, and the server lets go */
        if (!sql ||
            dlock__mysql_query(ms, sl->cn, sql,
                               dlock__now_ms() + ms->timeout_ms, NULL, NULL,
                               NULL, "leaving the wait") != DLOCK_OK)
            sl->cn->broken = 1;
        free(sql);
    }
    dlock__mysql_conn_put(ms, sl->cn);
    sl->cn = NULL;
    sl->gated = 0;
    sl->seq = 0;
}

/* An idle pinned connection that the server closed (restart, KILL,
 * wait_timeout) has something to read: it is dead, and its gate gone. */
int dlock__mysql_pinned_alive(my_lease *sl)
{
    struct pollfd p;

    if (!sl->cn || sl->cn->broken)
        return 0;
    p.fd = mysql_get_socket(sl->cn->m);
    p.events = POLLIN;
    p.revents = 0;
    if (poll(&p, 1, 0) == 0)
        return 1;
    sl->cn->broken = 1;
    return 0;
}

/* Did the statement fail because the session went (killed, server
 * gone), rather than with an error of the statement itself? */
static int conn_lost(const my_conn *cn)
{
    unsigned e = mysql_errno(cn->m);

    return cn->broken || e == ER_CONNECTION_KILLED || e == ER_SERVER_SHUTDOWN;
}

/*
 * Acquire (CAP_NATIVE_WAIT): tries and, while l->deadline allows, waits
 * in the server. The first try is the upsert guarded by GET_LOCK(gate,
 * 0). After a busy try, every wait is one round trip in which the waiter
 * sleeps inside its try (TRY_WAIT): a SET of the wait's length (the
 * holder's lease left + 1 ms, or the caller's deadline if sooner; at most
 * MY_WAIT_SLICE_MS), then the upsert guarded by GET_LOCK(gate, that
 * length). The holder's release wakes it, and the same statement takes
 * the free row; only a wait that took nothing (or a long one) reads more
 * in a round trip of its own.
 */
int dlock__mysql_acquire(void *st, dlock__lease *l, int64_t op_deadline)
{
    my_store *ms = st;
    my_lease *sl = l->priv;
    int fair = (l->flags & DLOCK_FAIR) != 0;
    char *name = dlock__mysql_hexlit(l->name, l->name_len);
    char *owner = dlock__mysql_hexlit(l->owner, strlen(l->owner));
    char *holder = dlock__mysql_hexlit(l->desc, strlen(l->desc));
    char *gate = name ? dlock__mysql_gate_of(ms, name) : NULL;
    int kind = TRY_GATE, seen_busy = 0, rc = DLOCK_OK, lost = 0;

    (void)op_deadline;
    if (!name || !owner || !holder || !gate) {
        rc = dlock__mysql_enomem();
        goto out;
    }
    for (int round = 0;; round++) {
        int64_t now = dlock__now_ms();
        int once = l->deadline <= now;
        int waits = kind == TRY_WAIT;
        int64_t wait_ms = once ? 0 : l->deadline - now;
        int64_t dl = now + ms->timeout_ms;
        char *sql, *where, *up, *del;
        uint64_t affected = 0, token = 0;
        MYSQL_RES *r = NULL;

        /* during a wait no statement runs past the caller's deadline */
        if (!once && l->deadline != DLOCK__FOREVER && dl > l->deadline + 10)
            dl = l->deadline + 10;
        if (wait_ms > MY_WAIT_SLICE_MS)
            wait_ms = MY_WAIT_SLICE_MS;
        if (!sl->cn) {
            rc = dlock__mysql_conn_get(ms, dl, &sl->cn);
            if (rc)
                break;
        }

        /* the try: one upsert; a fair waiter that wins also leaves its
         * queue entry, in the same round trip. A waiting try first sets
         * its gate and the wait's length (the holder's lease left + 1 ms;
         * a whole lease when the row is free but its gate taken: a woken
         * waiter is about to take it, and one that does not within a
         * lease, frozen in between, is passed by), and sleeps in the
         * upsert's GET_LOCK */
        if (waits)
            where =
                dlock__mysql_stmt(" WHERE GET_LOCK(@dlock_g, @dlock_w) = 1");
        else if (kind == TRY_HELD)
            where = dlock__mysql_stmt("%s", "");
        else
            where = dlock__mysql_stmt(" WHERE GET_LOCK(%s, 0) %s", gate,
                                      kind == TRY_GATE ? "= 1" : "IS NOT NULL");
        up = where
                 ? dlock__mysql_upsert(ms, l, name, owner, holder, where, waits)
                 : NULL;
        del = sl->seq
                  ? dlock__mysql_stmt("; DELETE FROM %s WHERE seq = %lld AND "
                                      "ROW_COUNT() > 0",
                                      ms->q, (long long)sl->seq)
                  : dlock__mysql_stmt("%s", "");
        if (!up || !del)
            sql = NULL;
        else if (!waits)
            sql = dlock__mysql_stmt("%s%s", up, del);
        else
            sql = dlock__mysql_stmt(
                "SET time_zone = '+00:00', @dlock_t0 = " NOW ", "
                "@dlock_g = %s, @dlock_w = LEAST(%lld.%03lld, "
                "IFNULL((SELECT IF(owner IS NOT NULL, GREATEST("
                "0.001, TIMESTAMPDIFF(MICROSECOND, " NOW ", "
                "lock_until) / 1000000 + 0.001), %lld.%03lld) FROM "
                "%s WHERE name = %s), %lld.%03lld)); %s%s",
                gate, (long long)(wait_ms / 1000), (long long)(wait_ms % 1000),
                (long long)(l->ttl_ms / 1000), (long long)(l->ttl_ms % 1000),
                ms->t, name, (long long)(l->ttl_ms / 1000),
                (long long)(l->ttl_ms % 1000), up, del);
        free(where);
        free(up);
        free(del);
        if (!sql) {
            rc = dlock__mysql_enomem();
            break;
        }
        int64_t sent = dlock__now_ms(), wdl = dl;
        if (waits) {
            /* the server answers by the wait's end; a frozen one is given
             * up at the caller's deadline */
            wdl = now + wait_ms + ms->timeout_ms;
            if (l->deadline != DLOCK__FOREVER && wdl > l->deadline + 10)
                wdl = l->deadline + 10;
        }
        rc = dlock__mysql_query_at(
            ms, sl->cn, sql, wdl, NULL, waits ? 1 : 0, &affected, &token,
            waits ? "waiting for the lock" : "taking the lock");
        int64_t answered = dlock__now_ms();
        free(sql);
        /* a try through GET_LOCK may hold the gate now (the row held by
         * one that lost its gate, or a deadlock after the wake): until
         * known, let_go() lets go of it */
        if (kind != TRY_HELD)
            sl->gated = 1;
        if (rc && mysql_errno(sl->cn->m) == ER_LOCK_DEADLOCK &&
            round < MY_DEADLOCK_RETRIES) {
            rc = DLOCK_OK; /* rolled back, nothing done: again */
            if (waits)
                kind = TRY_GATE; /* a held gate is only counted up */
            continue;
        }
        if (rc && waits && lost < MY_WAIT_RECONNECTS &&
            dlock__now_ms() < l->deadline && conn_lost(sl->cn)) {
            /* the sleeping session was killed (a DBA, a proxy, a server
             * restart): its gate place and queue entry went with it. Wait
             * on, on a new connection, behind those who waited meanwhile
             * (the upsert may have taken the row before the kill: the
             * next try adopts a row already ours) */
            lost++;
            sl->cn->broken = 1;
            dlock__mysql_conn_put(ms, sl->cn);
            sl->cn = NULL;
            sl->gated = 0;
            sl->seq = 0;
            rc = DLOCK_OK;
            kind = TRY_GATE;
            continue;
        }
        if (rc == DLOCK_OK && (affected == 1 || affected == 2)) {
            if (token == 0) {
                rc = dlock__err(DLOCK_EPROTO,
                                "mysql %s: the lock was taken but the "
                                "server sent no token (a trigger on %s?)",
                                ms->redacted, ms->t);
                break;
            }
            l->token = token;
            /* a waiting try's lease began when the server woke it, after
             * the send: a short wait counts from the send (a lease at
             * most a third short: the renewal comes that much sooner);
             * after a longer one the server says how long it slept (from
             * its SET, after the send, to the row's locked_at), in a
             * round trip of its own: nothing more on a short hand-off's
             * way */
            l->started = sent;
            if (waits && answered - sent > l->ttl_ms / 3) {
                /* our row only: taken over meanwhile (this process
                 * stopped past the lease), its locked_at is another
                 * holder's, and the send is the only start we know */
                char *rd = dlock__mysql_stmt(
                    "SELECT TIMESTAMPDIFF(MICROSECOND, "
                    "@dlock_t0, locked_at) FROM %s WHERE name "
                    "= %s AND owner = %s AND token = %llu",
                    ms->t, name, owner, (unsigned long long)token);
                r = NULL;
                /* the lock is ours already: this read gets the
                 * store's op timeout, not what is left of the caller's
                 * wait (cut at the deadline, it broke the gate's
                 * connection; the release then left the gate to the
                 * server's close, and a try right after found a freed
                 * lock busy) */
                if (rd &&
                    dlock__mysql_query(ms, sl->cn, rd,
                                       dlock__now_ms() + ms->timeout_ms, &r,
                                       NULL, NULL,
                                       "taking the lock") == DLOCK_OK &&
                    dlock__mysql_col_ll(r, 0, 0) > 0)
                    l->started = sent + dlock__mysql_col_ll(r, 0, 0) / 1000;
                if (r)
                    mysql_free_result(r);
                free(rd);
            }
            sl->seq = 0;
            /* the gate is ours unless a stale holder kept it (takeover) */
            sl->gated = kind != TRY_TAKEOVER;
            if (kind == TRY_TAKEOVER) {
                r = NULL;
                char *chk = dlock__mysql_stmt("SELECT IS_USED_LOCK(%s) <=> "
                                              "CONNECTION_ID()",
                                              gate);
                if (chk &&
                    dlock__mysql_query(ms, sl->cn, chk,
                                       dlock__now_ms() + ms->timeout_ms, &r,
                                       NULL, NULL,
                                       "taking the lock") == DLOCK_OK)
                    sl->gated = dlock__mysql_col_ll(r, 0, 0) == 1;
                if (r)
                    mysql_free_result(r);
                free(chk);
            }
            goto out; /* keeps sl->cn: the gate's connection */
        }
        if (rc)
            break;
        seen_busy = 1;

        if (!waits) {
            /* held: wait in the server. A fair waiter first joins the
             * queue inspect() lists: an entry alive while this
             * connection holds its own lock */
            if (once)
                break;
            if (fair && !sl->seq) {
                char *lock = dlock__mysql_entry_lock_of(ms, "LAST_INSERT_ID()");
                char *join =
                    lock ? dlock__mysql_stmt("INSERT INTO %s (name, holder, "
                                             "alive_until) VALUES (%s, %s, " NOW
                                             "); DO GET_LOCK(%s, 0)",
                                             ms->q, name, holder, lock)
                         : NULL;
                uint64_t id = 0;
                free(lock);
                rc = join ? dlock__mysql_query(ms, sl->cn, join, dl, NULL, NULL,
                                               &id, "joining the queue")
                          : dlock__mysql_enomem();
                free(join);
                if (rc)
                    break;
                sl->seq = (int64_t)id;
            }
            kind = TRY_WAIT;
            continue;
        }
        /* nothing taken: whether the wake gave us the gate, and the
         * lease left (unknown gate: let_go() lets go of it) */
        if (dlock__now_ms() >= l->deadline) {
            rc = DLOCK_EBUSY;
            break;
        }
        char *rd = dlock__mysql_stmt(
            "SELECT IS_USED_LOCK(@dlock_g) <=> CONNECTION_ID(), "
            "(SELECT TIMESTAMPDIFF(MICROSECOND, SYSDATE(6), "
            "lock_until) DIV 1000 + 1 FROM %s WHERE name = %s)",
            ms->t, name);
        rc = rd ? dlock__mysql_query(ms, sl->cn, rd, dl, &r, NULL, NULL,
                                     "waiting for the lock")
                : dlock__mysql_enomem();
        free(rd);
        if (rc) {
            if (r)
                mysql_free_result(r);
            break;
        }
        int gated = dlock__mysql_col_ll(r, 0, 0) == 1;
        long long left = dlock__mysql_col_ll(r, 1, -1);
        if (r)
            mysql_free_result(r);
        sl->gated = gated;
        l->retry_ms = left > 0 ? left : 1;
        if (dlock__now_ms() >= l->deadline) {
            rc = DLOCK_EBUSY;
            break;
        }
        if (gated) {
            /* we hold the gate, yet the row is held: its holder lost its
             * gate (its connection died) and keeps the lease. Nobody can
             * wake us: sleep to its lease end (or our deadline), watching
             * the connection */
            int64_t until = dlock__now_ms() + (left > 0 ? left : 1);
            if (until > l->deadline)
                until = l->deadline;
            struct pollfd p = {mysql_get_socket(sl->cn->m), POLLIN, 0};
            int64_t ms_left = until - dlock__now_ms();
            if (ms_left > 0 &&
                poll(&p, 1, ms_left > 60000 ? 60000 : (int)ms_left) > 0) {
                sl->cn->broken = 1; /* the server closed it */
                dlock__mysql_conn_put(ms, sl->cn);
                sl->cn = NULL;
                sl->gated = 0;
                sl->seq = 0;
            }
            kind = sl->cn ? TRY_HELD : TRY_GATE;
            continue;
        }
        /* woken by nothing: the wait ran to the holder's lease end (or
         * its slice, or GET_LOCK failed); a lease that ended is taken
         * without the gate if a frozen holder keeps it */
        kind = TRY_TAKEOVER;
    }
    if (rc && sl->cn && sl->cn->broken) {
        /* the server let go of our gate and entry with the connection */
        dlock__mysql_conn_put(ms, sl->cn);
        sl->cn = NULL;
        sl->gated = 0;
        sl->seq = 0;
    }
    if (rc && rc != DLOCK_EBUSY && seen_busy && l->deadline != DLOCK__FOREVER &&
        dlock__now_ms() >= l->deadline)
        rc = dlock__err(DLOCK_EBUSY,
                        "lock '%.200s' was held by another owner, and not "
                        "acquired within the wait (the last statement did "
                        "not finish before the deadline)",
                        l->name);
    if (rc == DLOCK_OK)
        rc = DLOCK_EBUSY;
    let_go(ms, sl);
out:
    free(gate);
    free(name);
    free(owner);
    free(holder);
    return rc;
}
