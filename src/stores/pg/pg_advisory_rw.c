/* SPDX-License-Identifier: MIT */
/*
 * pg_advisory_rw.c -- the PostgreSQL store's semaphores in advisory mode
 * (pg_advisory.c is the mode's backend; pg_int.h what the files share).
 *
 * A semaphore of N is N slot keys; a permit is one slot key held on the
 * hold's session, with the name's family keys held shared (they keep N
 * with the name). A try takes the first free slot in one statement
 * (S_ADV_SEM_TRY). A caller that waits queues at the name's gate key
 * (the server's own FIFO); the head, holding the gate, waits on every
 * slot at once, one session per slot, their sockets polled together: the
 * first slot granted is its permit, the other waits are cancelled (a slot
 * granted meanwhile is let go), and the gate goes to the next waiter. A
 * holder's release or death frees its slot in the server, which grants it
 * to the head's session waiting on it. docs/design.md, "PostgreSQL
 * advisory mode semaphores", has the keys and the failure cases.
 */
#include "pg_int.h"

#include "hex.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One S_ADV_SEM_TRY on cn: `slot` 0 takes the first free slot, else
 * finishes a win of that slot; `gate`: let go of the gate when done (it
 * holds it). DLOCK_OK (*slot, token taken), DLOCK_EBUSY (every slot
 * taken), DLOCK_EINVAL (the name is a lock, or a semaphore of another
 * N), or an error. */
static int sem_try(pg_store *ps, pg_conn *cn, dlock__lease *l, int *slot,
                   int gate, long long *token, int64_t deadline)
{
    char app[PG_APPNAME_MAX + 1], n[16], won[16];
    PGresult *r;
    int rc;

    dlock__pg_appname(l, app, sizeof(app));
    snprintf(n, sizeof(n), "%u", l->permits);
    snprintf(won, sizeof(won), "%d", *slot);
    const char *vals[5] = {l->name, app, n, *slot > 0 ? won : NULL,
                           gate ? "t" : "f"};
    int lens[5] = {(int)l->name_len, 0, 0, 0, 0};
    rc = dlock__pg_run(ps, cn, S_ADV_SEM_TRY, vals, lens, deadline, &r,
                       "taking a permit");
    if (rc)
        return rc;
    long long got = dlock__pg_col_ll(r, 0, 0, 0);
    long long tok = dlock__pg_col_ll(r, 0, 1, 0);
    int locked = PQntuples(r) == 1 && !strcmp(PQgetvalue(r, 0, 2), "t");
    long long other = dlock__pg_col_ll(r, 0, 3, -1);
    PQclear(r);
    if (got > 0 && tok > 0) {
        *slot = (int)got;
        *token = tok;
        return DLOCK_OK;
    }
    if (locked)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s' is a lock, not a semaphore (it has "
                          "holders)",
                          l->name);
    if (other >= 0)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s' is a semaphore of %lld permits",
                          l->name, other);
    return DLOCK_EBUSY;
}

/* The text of a wait on cn: `what` (a pg_advisory_lock(...) of the name,
 * "%1$s" being the name's hex) with lock_timeout = the caller's wait. */
static char *wait_sql(const dlock__lease *l, const char *pre,
                      const char *what, int a, int b)
{
    int64_t now = dlock__now_ms();
    long long wait = l->deadline == DLOCK__FOREVER ? 0 : l->deadline - now;
    char *hex = malloc(2 * l->name_len + 1), *body = NULL, *sql = NULL;

    if (wait <= 0 && l->deadline != DLOCK__FOREVER)
        wait = 1;
    if (hex) {
        dlock__hex(l->name, l->name_len, hex);
        size_t cap = strlen(what) + 8 * strlen(hex) + 64;
        body = malloc(cap);
        if (body)
            snprintf(body, cap, what, hex, a, b);
    }
    if (body) {
        size_t cap = strlen(body) + strlen(pre) + 64;
        sql = malloc(cap);
        if (sql)
            snprintf(sql, cap, "SET LOCAL lock_timeout = %lld; %s%s", wait,
                     pre, body);
    }
    free(body);
    free(hex);
    return sql;
}

#define HEXNAME "decode('%1$s', 'hex')"

/* Queues cn at the gate until the caller's deadline: DLOCK_OK (cn holds
 * the gate: the head), DLOCK_EBUSY (the deadline), or an error. */
static int gate_wait(pg_store *ps, pg_conn *cn, dlock__lease *l)
{
    char app[PG_APPNAME_MAX + 1], pre[PG_APPNAME_MAX * 2 + 128];
    PGresult *r;
    int rc;

    /* the session says who waits: "dlock 0 sN DESC" */
    dlock__pg_appname(l, app, sizeof(app));
    char *lit = PQescapeLiteral(cn->pg, app, strlen(app));
    if (!lit)
        return dlock__pg_enomem();
    snprintf(pre, sizeof(pre),
             "SELECT set_config('application_name', left('dlock 0 s%u ' || "
             "%s, 63), false); ",
             l->permits, lit);
    PQfreemem(lit);
    char *sql = wait_sql(l, pre, "SELECT pg_advisory_lock(" ADV_G(HEXNAME)
                                 ")", 0, 0);
    if (!sql)
        return dlock__pg_enomem();
    /* a cancel that ends it may leave it holding the gate: the session
     * goes */
    rc = dlock__pg_adv_wait(ps, cn, l, sql, &r, "waiting for a permit");
    free(sql);
    if (rc == DLOCK_OK)
        PQclear(r);
    return rc;
}

/* Lets go of the gate on cn (the head's session). */
static void gate_let_go(pg_store *ps, pg_conn *cn, const dlock__lease *l)
{
    char *hex = malloc(2 * l->name_len + 1);
    char sql[1024];
    PGresult *r;

    if (!hex) {
        cn->broken = 1; /* closing the session lets go of it */
        return;
    }
    dlock__hex(l->name, l->name_len, hex);
    if ((size_t)snprintf(sql, sizeof(sql),
                         "SELECT pg_advisory_unlock(" ADV_G(HEXNAME) "), "
                         "set_config('application_name', 'dlock', false)",
                         hex) >= sizeof(sql) ||
        dlock__pg_run_text(ps, cn, sql, dlock__now_ms() + ps->timeout_ms,
                           &r, "letting go of the permits' gate") != DLOCK_OK)
        cn->broken = 1;
    else
        PQclear(r);
    free(hex);
}

/* A wait on one slot, on its own session. */
typedef struct slot_wait {
    pg_conn *cn;
    int slot;
    int running; /* sent, its results not all read */
    int ok;      /* the slot was granted to this session */
    int failed;  /* an error result (cancelled, lock_timeout, ...) */
    int code;    /* the error's code */
} slot_wait;

/* Reads what has come on w's connection; its state follows. 0, or -1
 * when the connection broke. */
static int slot_read(pg_store *ps, slot_wait *w)
{
    if (!PQconsumeInput(w->cn->pg))
        return -1;
    while (w->running && !PQisBusy(w->cn->pg)) {
        PGresult *r = PQgetResult(w->cn->pg);
        if (!r) {
            w->running = 0;
            w->ok = !w->failed;
            break;
        }
        ExecStatusType st = PQresultStatus(r);
        if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK && !w->failed) {
            w->failed = 1;
            w->code = dlock__pg_result_error(ps, r, "waiting for a permit");
        }
        PQclear(r);
    }
    return 0;
}

/* Polls the running waits until one is granted, every one has ended, or
 * `until`. */
static void slots_poll(pg_store *ps, slot_wait *w, int n, int64_t until,
                       int stop_at_win, int cfd)
{
    struct pollfd p[PG_ADV_PERMITS_MAX + 1]; /* the waits, and cfd */
    int idx[PG_ADV_PERMITS_MAX];

    for (int round = 0; round < 1000000; round++) {
        int k = 0, won = 0;
        for (int i = 0; i < n; i++) {
            won |= w[i].ok;
            if (!w[i].running)
                continue;
            int f = PQflush(w[i].cn->pg);
            if (f < 0) {
                w[i].running = 0;
                w[i].failed = 1;
                w[i].cn->broken = 1;
                w[i].code = DLOCK_ECONN;
                continue;
            }
            p[k].fd = PQsocket(w[i].cn->pg);
            p[k].events = f == 1 ? POLLIN | POLLOUT : POLLIN;
            p[k].revents = 0;
            idx[k++] = i;
        }
        if (k == 0 || (won && stop_at_win))
            return;
        int64_t left = until == DLOCK__FOREVER ? 60000
                                               : until - dlock__now_ms();
        if (left <= 0)
            return;
        p[k].fd = cfd; /* a dlock_cancel() ends it as the deadline */
        p[k].events = POLLIN;
        p[k].revents = 0;
        int rc = poll(p, (nfds_t)k + 1, left > 60000 ? 60000 : (int)left);
        if (rc < 0 && errno != EINTR)
            return;
        if (rc > 0 && p[k].revents)
            return;
        for (int j = 0; j < k && rc > 0; j++) {
            slot_wait *x = &w[idx[j]];
            if (p[j].revents && slot_read(ps, x) != 0) {
                x->running = 0;
                x->failed = 1;
                x->cn->broken = 1;
                x->code = DLOCK_ECONN;
            }
        }
    }
}

/* The head waits on every slot at once: cn (which holds the gate) on slot
 * 1, a session from the pool on each other. DLOCK_OK with *winner and
 * *slot (that session holds the slot, every other wait ended and its
 * sessions back in the pool); DLOCK_EBUSY at the deadline; or an error.
 * Nothing else is left held. */
static int slots_wait(pg_store *ps, pg_conn *cn, dlock__lease *l,
                      pg_conn **winner, int *slot)
{
    slot_wait w[PG_ADV_PERMITS_MAX];
    int n = (int)l->permits, rc = DLOCK_OK;
    int64_t limit = l->deadline == DLOCK__FOREVER
                        ? DLOCK__FOREVER
                        : l->deadline + ps->timeout_ms;

    memset(w, 0, sizeof(w));
    w[0].cn = cn;
    for (int i = 1; i < n && rc == DLOCK_OK; i++) {
        int64_t dl = dlock__now_ms() + ps->timeout_ms;
        if (l->deadline != DLOCK__FOREVER && l->deadline < dl)
            dl = l->deadline + 10;
        rc = dlock__pg_conn_get(ps, dl, &w[i].cn);
        if (rc == DLOCK_ECONN && l->deadline != DLOCK__FOREVER &&
            dlock__now_ms() >= l->deadline)
            /* the wait ran out while its sessions were being opened:
             * every permit was held for the whole of it */
            rc = dlock__err(DLOCK_EBUSY,
                            "lock '%.200s': every permit was held for the "
                            "whole wait (it ended while the sessions to "
                            "wait on them were opened)",
                            l->name);
    }
    for (int i = 0; i < n && rc == DLOCK_OK; i++) {
        char *sql = wait_sql(l, "",
                             "SELECT pg_advisory_lock("
                             ADV_SLOT(HEXNAME, "%2$d", "%3$d") ")",
                             n, i + 1);
        w[i].slot = i + 1;
        if (!sql) {
            rc = dlock__pg_enomem();
        } else if (!PQsendQuery(w[i].cn->pg, sql)) {
            w[i].cn->broken = 1;
            rc = dlock__err(DLOCK_ECONN, "postgres %s: waiting for a "
                                         "permit: %s",
                            ps->redacted, PQerrorMessage(w[i].cn->pg));
        } else {
            w[i].running = 1;
        }
        free(sql);
    }
    if (rc == DLOCK_OK)
        slots_poll(ps, w, n, limit, 1, l->cancel_fd);
    /* the first granted is the permit; the others are called off */
    int win = -1;
    for (int i = 0; i < n; i++)
        if (w[i].ok && win < 0)
            win = i;
    for (int i = 0; i < n; i++) {
        if (!w[i].running)
            continue;
        PGcancel *cc = PQgetCancel(w[i].cn->pg);
        char buf[256];
        if (!cc || !PQcancel(cc, buf, sizeof(buf)))
            w[i].cn->broken = 1; /* closing it ends its wait */
        if (cc)
            PQfreeCancel(cc);
    }
    slots_poll(ps, w, n, dlock__now_ms() + ps->timeout_ms, 0, -1);
    for (int i = 0; i < n; i++) {
        if (w[i].running) {
            w[i].cn->broken = 1; /* no answer: closing it ends its wait */
            w[i].running = 0;
        }
        if (i == win || !w[i].ok || w[i].cn->broken)
            continue;
        /* granted meanwhile: let go of it */
        char *sql = wait_sql(l, "",
                             "SELECT pg_advisory_unlock("
                             ADV_SLOT(HEXNAME, "%2$d", "%3$d") ")",
                             n, i + 1);
        PGresult *r;
        if (!sql || dlock__pg_run_text(ps, w[i].cn, sql,
                                       dlock__now_ms() + ps->timeout_ms, &r,
                                       "letting go of a slot") != DLOCK_OK)
            w[i].cn->broken = 1;
        else
            PQclear(r);
        free(sql);
    }
    for (int i = 1; i < n; i++)
        if (w[i].cn && i != win)
            dlock__pg_conn_put(ps, w[i].cn);
    if (rc)
        return rc;
    if (win >= 0) {
        *winner = w[win].cn;
        *slot = w[win].slot;
        return DLOCK_OK;
    }
    /* every wait ended without its slot: the deadline (lock_timeout) or
     * a dlock_cancel() (then the waits were cancelled: no error), or the
     * first other error */
    rc = DLOCK_EBUSY;
    for (int i = 0; i < n && !dlock__lease_cancelled(l); i++)
        if (w[i].failed && w[i].code != DLOCK_EBUSY) {
            rc = w[i].code ? w[i].code : DLOCK_ECONN;
            break;
        }
    return rc;
}

int dlock__pg_adv_sem_acquire(pg_store *ps, dlock__lease *l,
                              int64_t op_deadline)
{
    pg_lease *pl = l->priv;
    pg_conn *cn, *winner = NULL;
    long long token = 0;
    int slot = 0, rc;

    l->retry_ms = -1;
    if (l->permits > PG_ADV_PERMITS_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "lock '%.200s': a semaphore has at most %d permits "
                          "in PostgreSQL's advisory mode (the head of its "
                          "queue waits with one session per permit), not %u",
                          l->name, PG_ADV_PERMITS_MAX, l->permits);
    rc = dlock__pg_conn_get(ps, op_deadline, &cn);
    if (rc)
        return rc;
    rc = sem_try(ps, cn, l, &slot, 0, &token, op_deadline);
    if (rc == DLOCK_EBUSY && l->deadline > dlock__now_ms()) {
        /* wait: at the gate, then as the head on every slot */
        rc = gate_wait(ps, cn, l);
        if (rc == DLOCK_OK) {
            rc = sem_try(ps, cn, l, &slot, 1, &token,
                         dlock__now_ms() + ps->timeout_ms);
            if (rc == DLOCK_EBUSY) {
                rc = slots_wait(ps, cn, l, &winner, &slot);
                if (rc == DLOCK_OK) {
                    /* the winner takes its permit for good (the name's
                     * kind looked at again: it may have changed while we
                     * waited); the gate goes to the next waiter */
                    rc = sem_try(ps, winner, l, &slot, winner == cn, &token,
                                 dlock__now_ms() + ps->timeout_ms);
                    if (winner != cn && !cn->broken)
                        gate_let_go(ps, cn, l);
                    if (rc != DLOCK_OK && rc != DLOCK_EINVAL)
                        winner->broken = 1; /* it may hold its slot */
                    if (rc == DLOCK_OK) {
                        if (winner != cn)
                            dlock__pg_conn_put(ps, cn);
                        cn = winner;
                    } else if (winner != cn) {
                        dlock__pg_conn_put(ps, winner);
                    }
                } else if (!cn->broken) {
                    gate_let_go(ps, cn, l);
                }
            } else if (rc != DLOCK_OK && rc != DLOCK_EINVAL) {
                /* the statement that lets go of the gate failed: closing
                 * the session does */
                cn->broken = 1;
            }
        }
    }
    if (rc == DLOCK_OK) {
        pl->slot = slot;
        dlock__pg_hold_keep(ps, l, cn, token);
        return DLOCK_OK;
    }
    dlock__pg_conn_put(ps, cn);
    return rc;
}
