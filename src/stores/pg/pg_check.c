/* SPDX-License-Identifier: MIT */
/*
 * pg_check.c -- dlock_client_check() on PostgreSQL (both modes): a
 * pooler in transaction mode, a password over a connection without TLS,
 * and the server's clock.
 */
#include "pg_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dlock__pg_check(void *st, int64_t ttl_ms, dlock_check *out,
                    int64_t deadline)
{
    pg_store *ps = st;
    pg_conn *cn = NULL;
    PGresult *r = NULL;
    int rc;

    (void)ttl_ms;
    if ((ps->pooler == POOLER_TRANSACTION || (ps->behind && !ps->sessions)) &&
        (rc = dlock__check_finding(
             out, "pg-transaction-pooling",
             ps->advisory
                 ? "a pooler in transaction mode sits in front of the "
                   "server: advisory locks live in sessions that the "
                   "pooler hands to other clients between transactions, "
                   "so a lock is not its holder's, and waits cannot be "
                   "woken (LISTEN)"
                 : "a pooler in transaction mode sits in front of the "
                   "server: waits cannot be woken (LISTEN needs a session "
                   "of its own), so a lock can only be tried, never "
                   "waited for",
             "connect dlock to the server itself, or to a pool in session "
             "mode (?pooler=session)")) != 0)
        return rc;
    rc = dlock__pg_conn_get(ps, deadline, &cn);
    if (rc)
        return rc;
    const char *host = PQhost(cn->pg);
    if (PQconnectionUsedPassword(cn->pg) && !PQsslInUse(cn->pg) &&
        !(host && host[0] == '/') &&
        (rc = dlock__check_finding(
             out, "password-without-tls",
             "the store authenticates with a password over a connection "
             "without TLS: depending on the server's method the password "
             "(method password) or the session (any method) can be read "
             "or taken over on the network, and whoever holds the "
             "session can take and break every lock",
             "connect with ?sslmode=verify-full (and TLS on the server), "
             "or over the server's unix socket on this host")) != 0) {
        dlock__pg_conn_put(ps, cn);
        return rc;
    }
    int64_t t0 = dlock__wall_ms();
    rc = dlock__pg_run_text(ps, cn,
                            "SELECT (extract(epoch FROM clock_timestamp()) "
                            "* 1000)::bigint",
                            deadline, &r, "reading the server's clock");
    int64_t t1 = dlock__wall_ms();
    if (rc == DLOCK_OK && PQntuples(r) == 1 && !PQgetisnull(r, 0, 0))
        dlock__check_clock(out, atoll(PQgetvalue(r, 0, 0)), t0, t1);
    else if (rc)
        dlock__check_note(out, "the server's clock: %s", dlock_errmsg());
    if (r)
        PQclear(r);
    dlock__pg_conn_put(ps, cn);
    return DLOCK_OK;
}
