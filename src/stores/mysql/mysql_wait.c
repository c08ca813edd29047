/* SPDX-License-Identifier: MIT */
/*
 * mysql_wait.c -- the MySQL/MariaDB store's acquire (mysql_int.h; the
 * statements of one try are in mysql_try.c, what the two share in
 * mysql_try.h): the tries, and the waiting in the server: a waiter sleeps
 * in GET_LOCK on the name's gate inside its try, and the holder's release
 * wakes it (the protocol is in mysql.c's header comment; its failure
 * cases in docs/design.md, "Waiting in the server (MySQL)"). A try
 * decides by the row, never by a user-level lock it could not take (a
 * foreign session, a frozen holder may hold any of them); a wait ends
 * with a try. A waiter's queue entry, a session killed while it waits, a
 * holder that lost its gate, a frozen holder whose lease ends. Read holds
 * and permits take the same path with their own upsert (mysql_sql.c) and,
 * holding the gate, what mysql_rw.c adds: a writer drains the readers, a
 * semaphore's head waits on every holder (docs/design.md, "Shared holds
 * and permits").
 */
#include "mysql_try.h"

#include <mysqld_error.h>

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A wait's last slice at the gate ends this long before the caller's
 * deadline (a quarter of what is left, if less): its last try runs then,
 * and a busy one waits at the gate for the rest, so that a slow client
 * still makes it within the wait. Milliseconds. */
#define MY_LAST_MARGIN_MS 50

/* Tries in a row that hold the gate, find the row free and take nothing
 * (a read hold's own hold lock held by another session): then an error */
#define MY_HELD_TRIES 3

/* Drops what a lease without the lock keeps in the server (its gate, its
 * hold lock, its queue entry) and gives its connection back. */
static void let_go(my_store *ms, my_lease *sl)
{
    if (!sl->cn)
        return;
    if (sl->gated || sl->locks || sl->seq) {
        char *sql = sl->seq
                        ? dlock__mysql_stmt("DELETE FROM %s WHERE seq = "
                                            "@dlock_q; DO RELEASE_ALL_LOCKS()",
                                            ms->q)
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
    sl->gated = sl->locks = 0;
    sl->seq = 0;
}

/* Did the statement fail because the session went (killed, server
 * gone), rather than with an error of the statement itself? */
static int conn_lost(const my_conn *cn)
{
    unsigned e = dlock__mysql_errno(cn);

    return cn->broken || e == ER_CONNECTION_KILLED || e == ER_SERVER_SHUTDOWN;
}

/* The connection went: the server let go of its gate, locks and entry. */
static void drop_conn(my_store *ms, my_lease *sl)
{
    sl->cn->broken = 1;
    dlock__mysql_conn_put(ms, sl->cn);
    sl->cn = NULL;
    sl->gated = sl->locks = 0;
    sl->seq = 0;
}

/* The client's note, per name (the lease's hint[0]), that read holds or
 * permits use it: a writer's first try then asks who holds (a writer
 * that meets readers drains them at once) instead of being the exclusive
 * lock's cheaper statement. */
static int shared_seen(const dlock__lease *l)
{
    return l->hint && __atomic_load_n(&l->hint[0], __ATOMIC_RELAXED) != 0;
}

static void shared_note(dlock__lease *l)
{
    if (l->hint)
        __atomic_store_n(&l->hint[0], 1, __ATOMIC_RELAXED);
}

/* The client's note, per name (hint[1], written by a shared release and by
 * a busy light take), that others held beside its last shared hold there:
 * its first try is then the join (the light take would be busy). */
static int others_seen(const dlock__lease *l)
{
    return l->hint && __atomic_load_n(&l->hint[1], __ATOMIC_RELAXED) != 0;
}

static void others_busy(dlock__lease *l)
{
    if (l->hint)
        __atomic_store_n(&l->hint[1], 1, __ATOMIC_RELAXED);
}

/* A busy try's answer (`code`, MY_CODE_*) that no wait can change:
 * DLOCK_EINVAL for a hold of the wrong kind, else DLOCK_OK. */
static int wrong_kind(const my_acq *a, long long code)
{
    const dlock__lease *l = a->l;
    long long n = code - MY_CODE_SEM;

    if (l->kind != DLOCK__PERMIT && code >= MY_CODE_SEM)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s' is a semaphore of %lld permits: "
                          "take a permit with a handle opened with permits "
                          "= %lld",
                          l->name, n, n);
    if (l->kind == DLOCK__PERMIT &&
        (code == MY_CODE_WRITER || code == MY_CODE_READERS))
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s' is held as a lock (%s), not as a "
                          "semaphore of %u permits",
                          l->name,
                          code == MY_CODE_READERS ? "by readers"
                                                  : "exclusively",
                          l->permits);
    if (l->kind == DLOCK__PERMIT && code >= MY_CODE_SEM &&
        n != (long long)l->permits)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s' is a semaphore of %lld permits, not "
                          "%u (every handle of a semaphore must say the same "
                          "permits)",
                          l->name, n, l->permits);
    return DLOCK_OK;
}

/* The lease of a hold taken by a waiting try began when the server woke
 * it, after the send: a short wait counts from the send (a lease at most
 * a third short: the renewal comes that much sooner); after a longer one
 * the server says how long it slept (from its SET, after the send, to the
 * hold's start), in a round trip of its own: nothing more on a short
 * hand-off's way. Our hold only: one taken over meanwhile (this process
 * stopped past the lease) has another holder's start, and the send is
 * the only start we know. */
static void lease_start(const my_acq *a, int waited, int64_t sent,
                        int64_t answered)
{
    my_store *ms = a->ms;
    dlock__lease *l = a->l;
    char pt[128], ps[128];
    MYSQL_RES *r = NULL;
    char *rd = NULL, *sole = NULL;

    l->started = sent;
    if (waited)
        l->woken_us = dlock__now_us(); /* the answer: for the metrics */
    if (!waited || answered - sent <= l->ttl_ms / 3)
        return;
    if (!a->shared)
        rd = dlock__mysql_stmt("SELECT TIMESTAMPDIFF(MICROSECOND, "
                               "@dlock_t0, locked_at) FROM %s WHERE name "
                               "= %s AND owner = %s AND token = %llu",
                               ms->t, a->name, a->owner,
                               (unsigned long long)l->token);
    else if (!dlock__mysql_owner_path(l->owner, "[1]", pt, sizeof(pt)) &&
             !dlock__mysql_owner_path(l->owner, "[3]", ps, sizeof(ps)) &&
             (sole = dlock__mysql_sole_owner(l->owner)) != NULL)
        rd = dlock__mysql_stmt(
            "SELECT IF(owner <=> " MY_SHARED ", CAST(JSON_EXTRACT(holders, "
            "'%s') AS SIGNED), " MY_US("locked_at") ") - " MY_US("@dlock_t0")
            " FROM %s WHERE name = %s AND (owner = %s AND token = %llu OR "
            "owner <=> " MY_SHARED " AND CAST(JSON_EXTRACT(holders, '%s') AS "
            "UNSIGNED) = %llu)",
            ps, ms->t, a->name, sole, (unsigned long long)l->token, pt,
            (unsigned long long)l->token);
    free(sole);
    /* the lock is ours already: this read gets the store's op timeout,
     * not what is left of the caller's wait (cut at the deadline, it
     * broke the gate's connection; the release then left the gate to the
     * server's close, and a try right after found a freed lock busy) */
    if (rd &&
        dlock__mysql_query(ms, a->sl->cn, rd,
                           dlock__now_ms() + ms->timeout_ms, &r, NULL, NULL,
                           "taking the lock") == DLOCK_OK &&
        dlock__mysql_col_ll(r, 0, 0) > 0)
        l->started = sent + dlock__mysql_col_ll(r, 0, 0) / 1000;
    if (r)
        mysql_free_result(r);
    free(rd);
}

/* We hold the gate, yet the row is held and nobody can wake us (its
 * holder lost its gate, or readers lost their hold locks, with their
 * sessions): sleep to that lease end (or our deadline), watching the
 * connection. The next try: holding the gate, or from the start if the
 * connection died. */
static int sleep_gated(my_store *ms, dlock__lease *l, long long left)
{
    my_lease *sl = l->priv;
    int64_t until = dlock__now_ms() + (left > 0 ? left : 1);

    if (until > l->deadline)
        until = l->deadline;
    struct pollfd p[2] = {{mysql_get_socket(sl->cn->m), POLLIN, 0},
                          {l->cancel_fd, POLLIN, 0}};
    for (int64_t ms_left = until - dlock__now_ms(); ms_left > 0;
         ms_left = until - dlock__now_ms()) {
        if (poll(p, 2, ms_left > 60000 ? 60000 : (int)ms_left) <= 0)
            continue;
        if (p[0].revents) {
            drop_conn(ms, sl); /* the server closed it */
            return TRY_GATE;
        }
        break; /* cancelled: the caller sees it */
    }
    return TRY_HELD;
}

/* sleep_gated() for a waiter that may be listed: its entry counts while it
 * sleeps (its end written first). */
static int sleep_listed(my_acq *a, long long left)
{
    int64_t now = dlock__now_ms(), until = now + (left > 0 ? left : 1);

    /* a sleep to the deadline ends a little before it (as a wait's last
     * slice): the try that follows, holding the gate, is the last one */
    if (until >= a->l->deadline && !a->last &&
        a->l->deadline != DLOCK__FOREVER) {
        int64_t margin = (a->l->deadline - now) / 4;
        if (margin > MY_LAST_MARGIN_MS)
            margin = MY_LAST_MARGIN_MS;
        until = a->l->deadline - margin;
        left = until - now;
        a->last = margin > 0;
    }
    if (until > a->l->deadline)
        until = a->l->deadline;
    dlock__mysql_alive_for(a, until - dlock__now_ms() > 0
                                  ? until - dlock__now_ms()
                                  : 0);
    if (!a->sl->cn || a->sl->cn->broken) {
        if (a->sl->cn)
            drop_conn(a->ms, a->sl);
        return TRY_GATE;
    }
    return sleep_gated(a->ms, a->l, left);
}

/* A try that held the gate (or may have) took nothing: what the row says
 * decides the next step, in *kind (or an error). *recheck: live holds
 * without a session were seen once (a release in the moment between the
 * row's snapshot and the look at their hold locks looks the same: try
 * again before sleeping to their lease end). */
static int after_gated_try(my_acq *a, int *kind, int *recheck)
{
    my_store *ms = a->ms;
    dlock__lease *l = a->l;
    my_lease *sl = a->sl;
    int64_t dl = dlock__now_ms() + ms->timeout_ms;
    my_state st;
    int rc;

    if (l->deadline != DLOCK__FOREVER && dl > l->deadline + 10)
        dl = l->deadline + 10;
    rc = dlock__mysql_state(ms, l, a->name, a->gate, dl, &st);
    if (rc)
        return rc;
    sl->gated = st.gated;
    l->retry_ms = st.left_ms > 0 ? st.left_ms : 1;
    if (st.code >= MY_CODE_READERS) { /* listed from the next wait on */
        a->listed = a->kinds = 1;
        shared_note(l);
    }
    if ((rc = wrong_kind(a, st.code)) != DLOCK_OK) {
        ;
    } else if (dlock__now_ms() >= l->deadline || dlock__lease_cancelled(l)) {
        rc = DLOCK_EBUSY;
    } else if (!st.gated) {
        /* woken by nothing: the wait ran to the holder's lease end (or
         * its slice, or GET_LOCK failed); a lease that ended is taken
         * without the gate if a frozen holder keeps it */
        *kind = TRY_TAKEOVER;
    } else if (st.code == MY_CODE_WRITER) {
        /* its holder lost its gate (its connection died) and keeps the
         * lease */
        *recheck = 0;
        *kind = sleep_listed(a, st.left_ms);
    } else if (st.code == MY_CODE_NONE ||
               (l->kind == DLOCK__READ && st.code == MY_CODE_READERS) ||
               (l->kind == DLOCK__PERMIT && st.live < (int)l->permits) ||
               (l->kind == DLOCK__WRITE && st.live == 0)) {
        /* room for us (a writer: no live reader, the row's end an upper
         * bound that its next try settles); a second time in a row that
         * took nothing, the lease end is the timer */
        *kind = (*recheck)++ < 2 ? TRY_HELD
                                 : sleep_listed(a, st.left_ms);
    } else if (st.live > st.locked && !*recheck) {
        *recheck = 1;
        *kind = TRY_HELD;
    } else if (l->kind == DLOCK__WRITE) {
        *recheck = 0;
        *kind = st.locked ? TRY_DRAIN
                          : sleep_listed(a, st.unlocked_last_ms);
    } else {
        /* a semaphore's head: woken by any holder's release, death or
         * lease end */
        *recheck = 0;
        int64_t head_ms = l->deadline - dlock__now_ms();
        if (head_ms > MY_WAIT_SLICE_MS)
            head_ms = MY_WAIT_SLICE_MS;
        if (st.unlocked_first_ms >= 0 && st.unlocked_first_ms < head_ms)
            head_ms = st.unlocked_first_ms;
        for (int i = 0; i < st.nlk; i++)
            if (st.lk_ms[i] < head_ms)
                head_ms = st.lk_ms[i];
        dlock__mysql_alive_for(a, head_ms > 0 ? head_ms : 0);
        if (sl->cn->broken) {
            drop_conn(ms, sl); /* the server let go of the gate: again */
            *kind = TRY_GATE;
        } else {
            rc = dlock__mysql_head_wait(ms, l, a->name, &st,
                                        st.unlocked_first_ms);
            *kind = TRY_HELD;
        }
    }
    dlock__mysql_state_free(&st);
    /* slept: no try past the caller's deadline (or its cancel) */
    if (rc == DLOCK_OK &&
        (dlock__now_ms() >= l->deadline || dlock__lease_cancelled(l)))
        rc = DLOCK_EBUSY;
    return rc;
}

/*
 * Acquire (CAP_NATIVE_WAIT): tries and, while l->deadline allows, waits
 * in the server. The first try is the upsert guarded by GET_LOCK(gate,
 * 0) (a read hold's or permit's: by a free gate and its own hold lock).
 * After a busy try, every wait is one round trip in which the waiter
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
    my_acq a = {.ms = ms, .l = l, .sl = sl, .shared = l->kind != DLOCK__WRITE,
             .rich = shared_seen(l),
             .ordered = fair || l->kind != DLOCK__WRITE,
             .waits = l->deadline > dlock__now_ms(),
             .first = others_seen(l) ? FIRST_JOIN : FIRST_LIGHT};
    int kind = TRY_GATE, seen_busy = 0, rc = DLOCK_OK, lost = 0;
    int recheck = 0, held_tries = 0, waited = 0;

    (void)op_deadline;
    if (a.shared && !ms->rw)
        return dlock__err(DLOCK_ENOTSUP,
                          "lock '%.200s': %s holds are not available on "
                          "this mysql:// table: %s (docs/stores.md has the "
                          "ALTER TABLE)",
                          l->name,
                          l->kind == DLOCK__READ ? "shared (read)"
                                                 : "semaphore",
                          ms->rw_why);
    if (l->kind == DLOCK__PERMIT && l->permits > MY_PERMITS_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s': a semaphore has at most %d permits "
                          "on mysql:// (a full one's head waits with one "
                          "connection per holder), not %u",
                          l->name, MY_PERMITS_MAX, l->permits);
    a.name = dlock__mysql_hexlit(l->name, l->name_len);
    a.owner = dlock__mysql_hexlit(l->owner, strlen(l->owner));
    a.holder = dlock__mysql_hexlit(l->desc, strlen(l->desc));
    /* the statements name the gate (and a reader's or permit's own hold
     * lock) as literals the client computes (a reader's or permit's once,
     * with its other values, kept with the lease): the server's SHA2
     * costs each statement ~10 µs a name, and a writer's try reads its
     * gate more than once */
    if (a.shared) {
        if (!sl->has_v) {
            if ((rc = dlock__mysql_vals(ms, l, &sl->v)) != DLOCK_OK)
                goto out;
            sl->has_v = 1;
        }
        a.v = &sl->v;
        a.gate = dlock__mysql_stmt("'%s'", sl->v.gate);
        a.hold = dlock__mysql_stmt("'%s'", sl->v.hold);
    } else {
        a.gate = dlock__mysql_gate_lit(ms, l->name, l->name_len);
        a.hold = a.name && a.owner
                     ? dlock__mysql_hold_lock_of(ms, a.name, a.owner)
                     : NULL;
    }
    if (!a.name || !a.owner || !a.holder || !a.gate || !a.hold) {
        rc = dlock__mysql_enomem();
        goto out;
    }
    for (int round = 0;; round++) {
        int64_t now = dlock__now_ms();
        /* cancelled: one last try, as at the deadline */
        int once = l->deadline <= now || dlock__lease_cancelled(l);
        int waits = kind == TRY_WAIT || kind == TRY_DRAIN;
        int64_t wait_ms = once ? 0 : l->deadline - now;
        int64_t dl = now + ms->timeout_ms;
        uint64_t affected = 0, token = 0;
        int at = 0;

        /* during a wait no statement runs past the caller's deadline (its
         * last try: 10 ms past it) */
        if ((!once || waited) && l->deadline != DLOCK__FOREVER &&
            dl > l->deadline + 10)
            dl = l->deadline + 10;
        int shortened = 0;
        if (wait_ms > MY_WAIT_SLICE_MS) {
            wait_ms = MY_WAIT_SLICE_MS;
        } else if (kind == TRY_WAIT && !a.last &&
                   l->deadline != DLOCK__FOREVER) {
            /* the slice that ends at the deadline ends a little before
             * it: the last try follows (below) */
            int64_t margin = wait_ms / 4 < MY_LAST_MARGIN_MS
                                 ? wait_ms / 4
                                 : MY_LAST_MARGIN_MS;
            wait_ms -= margin;
            shortened = margin > 0;
        }
        if (!sl->cn) {
            rc = dlock__mysql_conn_get(ms, dl, &sl->cn);
            if (rc)
                break;
        }

        /* the try: one upsert; a waiter that wins also leaves its queue
         * entry, in the same round trip. A read hold's or permit's join
         * (the contended path) is prepared on the connection (MY_PS_TEXT:
         * refused, the text instead) */
        int64_t sent = dlock__now_ms(), wdl = dl;
        waited |= waits;
        int join = a.shared && kind == TRY_GATE && a.first == FIRST_JOIN;
        rc = MY_PS_TEXT;
        if (join) {
            int which = l->kind == DLOCK__PERMIT ? MY_PS_JOIN_PERMIT
                                                 : MY_PS_JOIN_READ;
            rc = dlock__mysql_ps_run(ms, sl->cn, which, a.v, dl, &affected,
                                     &token, "taking the lock");
            if (rc == MY_PS_TEXT) {
                char *sql = dlock__mysql_fill(ms->tmpl[which], a.v);
                rc = sql ? dlock__mysql_query(ms, sl->cn, sql, dl, NULL,
                                              &affected, &token,
                                              "taking the lock")
                         : dlock__mysql_enomem();
                free(sql);
            }
        } else {
            char *sql = dlock__mysql_try_sql(&a, kind, wait_ms, &at);
            if (!sql) {
                rc = dlock__mysql_enomem();
                break;
            }
            if (waits) {
                /* the server answers by the wait's end; a frozen one is
                 * given up at the caller's deadline */
                wdl = now + wait_ms + ms->timeout_ms;
                if (l->deadline != DLOCK__FOREVER && wdl > l->deadline + 10)
                    wdl = l->deadline + 10;
            }
            sent = dlock__now_ms();
            /* a wait in GET_LOCK ends at a dlock_cancel() (KILL QUERY) */
            sl->cn->cfd = waits ? l->cancel_fd : -1;
            sl->cn->killed = 0;
            rc = dlock__mysql_query_at(
                ms, sl->cn, sql, wdl, NULL, at, &affected, &token,
                waits ? "waiting for the lock" : "taking the lock");
            if (sl->cn)
                sl->cn->cfd = -1;
            free(sql);
        }
        int64_t answered = dlock__now_ms();
        if (a.listed && !sl->seq && (waits || kind == TRY_DRAIN))
            sl->seq = -1; /* in @dlock_q (let_go deletes it) */
        /* a try through GET_LOCK may hold the gate now (the row held by
         * one that lost its gate, or a deadlock after the wake): until
         * known, let_go() lets go of it; a read hold's try may hold its
         * hold lock */
        if (a.shared ? kind == TRY_WAIT
                     : kind != TRY_HELD && kind != TRY_DRAIN)
            sl->gated = 1;
        /* a read hold's or permit's try may hold its hold lock now (taken
         * when free, whatever the answer) */
        if (a.shared)
            sl->locks = 1;
        if (rc && dlock__mysql_errno(sl->cn) == ER_LOCK_DEADLOCK &&
            round < MY_DEADLOCK_RETRIES) {
            rc = DLOCK_OK; /* rolled back, nothing done: again */
            if (waits && !a.shared)
                kind = TRY_GATE; /* a held gate is only counted up */
            else if (a.shared && kind != TRY_GATE && kind != TRY_TAKEOVER)
                rc = after_gated_try(&a, &kind, &recheck);
            if (rc)
                break;
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
            drop_conn(ms, sl);
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
            /* taken by the light take: sole (the release tries that form
             * first) */
            sl->sole = a.shared && kind == TRY_GATE && a.first == FIRST_LIGHT;
            if (a.shared)
                shared_note(l);
            lease_start(&a, waits, sent, answered);
            sl->seq = 0;
            sl->locks = 0;
            /* a writer's connection holds the gate unless another
             * session kept it (a try decides by the row: its release then
             * wakes nobody, and its renewals take the gate when free); a
             * read hold or permit let go of it in the same round trip */
            sl->gated = !a.shared;
            goto out; /* keeps sl->cn: the gate's (the hold lock's) */
        }
        if (rc)
            break;
        if (kind == TRY_LAST && !sl->seq)
            sl->gated = 0; /* its last statement let go of the gate */
        if (a.shared && kind == TRY_GATE && a.first != FIRST_FULL) {
            /* a light take or a join that took nothing says nothing (its
             * guard may have taken the hold lock): the full take at once.
             * A busy light take: others hold (the join first, next time) */
            sl->locks = 1;
            if (a.first == FIRST_LIGHT)
                others_busy(l);
            a.first = FIRST_FULL;
            continue;
        }
        /* busy: who holds (LAST_INSERT_ID of the busy branch; a writer's
         * try and take-over do not say: 0), and whether a writer's try
         * that says holds the gate */
        long long code = (long long)token;
        int gate_ours = 0;
        if (!a.shared && (kind == TRY_GATE || kind == TRY_TAKEOVER ||
                          kind == TRY_LAST) &&
            code >= MY_CODE_GATED && code < 2 * MY_CODE_GATED) {
            gate_ours = 1;
            code -= MY_CODE_GATED;
        }
        if ((!a.shared && !a.rich &&
             (kind == TRY_GATE || kind == TRY_TAKEOVER)) ||
            code > MY_CODE_SEM + MY_PERMITS_MAX)
            code = MY_CODE_NONE;
        if (code >= MY_CODE_READERS)
            shared_note(l);
        rc = wrong_kind(&a, code);
        if (rc)
            break;
        seen_busy = 1;

        if (!a.shared && code == MY_CODE_READERS &&
            (kind == TRY_WAIT || (gate_ours && kind != TRY_LAST))) {
            /* a writer granted the gate while readers hold (or whose try
             * took it) keeps it and drains them (listed, with its kind); a
             * try only answers */
            if (once)
                break;
            a.listed = a.kinds = 1;
            kind = TRY_DRAIN;
            continue;
        }
        if (kind == TRY_GATE || kind == TRY_TAKEOVER || kind == TRY_LAST) {
            /* held: wait in the server. Readers, permits, fair waiters
             * and writers that met readers or permits join the queue
             * inspect() lists (in their first wait's round trip): an
             * entry alive while this connection holds its own lock. A
             * writer that met readers waits at the gate too (granted at
             * once when its try took it), and drains them from there */
            if (once) {
                /* no wait left: a writer's busy try settles a readers'
                 * row and tries again, in the round trip that lets go of
                 * the gate */
                if (!a.shared && ms->rw && kind != TRY_LAST) {
                    kind = TRY_LAST;
                    a.last = 1;
                    continue;
                }
                break;
            }
            if (fair || a.shared || code >= MY_CODE_READERS) {
                a.listed = 1;
                a.kinds |= code >= MY_CODE_READERS;
            }
            kind = TRY_WAIT;
            continue;
        }
        /* nothing taken holding the gate (or maybe: a wait): the row
         * says what next. A wait's last slice that ended without the gate
         * (its GET_LOCK answered 0: a foreign session or a frozen holder
         * kept it, so a release woke nobody) makes one last try, as a try
         * would, taking a lock freed meanwhile; a busy one waits at the
         * gate for the rest of the wait */
        if (kind == TRY_WAIT && code == MY_CODE_NONE && shortened &&
            !a.last && !dlock__lease_cancelled(l)) {
            a.last = 1;
            kind = !a.shared && ms->rw ? TRY_LAST : TRY_TAKEOVER;
            continue;
        }
        if (dlock__now_ms() >= l->deadline || dlock__lease_cancelled(l)) {
            /* the same at the deadline (a slice too short to end before
             * it), within 10 ms of it */
            if (kind == TRY_WAIT && code == MY_CODE_NONE && !a.last &&
                !dlock__lease_cancelled(l) &&
                dlock__now_ms() < l->deadline + 10) {
                a.last = 1;
                kind = !a.shared && ms->rw ? TRY_LAST : TRY_TAKEOVER;
                continue;
            }
            rc = DLOCK_EBUSY;
            break;
        }
        if (kind == TRY_HELD && code == MY_CODE_NONE &&
            ++held_tries > MY_HELD_TRIES) {
            rc = dlock__err(DLOCK_EPROTO,
                            "mysql %s: lock '%.200s' is free, but this "
                            "hold's own lock is held by another session",
                            ms->redacted, l->name);
            break;
        }
        rc = after_gated_try(&a, &kind, &recheck);
        if (rc == DLOCK_ECONN && sl->cn && sl->cn->broken &&
            lost < MY_WAIT_RECONNECTS && dlock__now_ms() < l->deadline) {
            /* a semaphore head's gate connection closed: wait on */
            lost++;
            drop_conn(ms, sl);
            rc = DLOCK_OK;
            kind = TRY_GATE;
        }
        if (rc == DLOCK_EBUSY && !a.last && !dlock__lease_cancelled(l) &&
            l->deadline != DLOCK__FOREVER &&
            dlock__now_ms() < l->deadline + 10) {
            /* the deadline came while it slept or looked at the row (a
             * holder without the gate, whose release woke nobody): one
             * last try, holding the gate as it does, else as a try */
            a.last = 1;
            rc = DLOCK_OK;
            kind = sl->cn && sl->gated ? TRY_HELD
                   : !a.shared && ms->rw ? TRY_LAST
                                         : TRY_TAKEOVER;
        }
        if (rc)
            break;
    }
    if (rc && sl->cn && sl->cn->broken) {
        /* the server let go of our gate and entry with the connection */
        drop_conn(ms, sl);
    }
    if (rc && rc != DLOCK_EBUSY && seen_busy &&
        (dlock__lease_cancelled(l) ||
         (l->deadline != DLOCK__FOREVER && dlock__now_ms() >= l->deadline)))
        rc = dlock__err(DLOCK_EBUSY,
                        "lock '%.200s' was held by another owner, and not "
                        "acquired within the wait (the last statement did "
                        "not finish before the deadline)",
                        l->name);
    if (rc == DLOCK_OK)
        rc = DLOCK_EBUSY;
    let_go(ms, sl);
out:
    free(a.gate);
    free(a.hold);
    free(a.name);
    free(a.owner);
    free(a.holder);
    return rc;
}
