/* SPDX-License-Identifier: MIT */
/*
 * mysql_check.c -- dlock_client_check() on MySQL / MariaDB: a password
 * over a connection without TLS, and the server's clock.
 */
#include "mysql_int.h"

#include <stdio.h>
#include <string.h>

int dlock__mysql_check(void *st, int64_t ttl_ms, dlock_check *out,
                       int64_t deadline)
{
    my_store *ms = st;
    my_conn *cn = NULL;
    MYSQL_RES *res = NULL;
    int rc;

    (void)ttl_ms;
    rc = dlock__mysql_conn_get(ms, deadline, &cn);
    if (rc)
        return rc;
    if (ms->password && ms->password[0] && !mysql_get_ssl_cipher(cn->m) &&
        (rc = dlock__check_finding(
             out, "password-without-tls",
             "the store authenticates with a password over a connection "
             "without TLS: the password itself is not sent (dlock allows "
             "only challenge-response plugins there), but the session can "
             "be read and taken over on the network, and whoever holds it "
             "can take and break every lock",
             "connect with ?ssl_mode=verify_identity (and TLS on the "
             "server)")) != 0) {
        dlock__mysql_conn_put(ms, cn);
        return rc;
    }
    int64_t t0 = dlock__wall_ms();
    rc = dlock__mysql_query(ms, cn,
                            "SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS "
                            "SIGNED)",
                            deadline, &res, NULL, NULL,
                            "reading the server's clock");
    int64_t t1 = dlock__wall_ms();
    if (rc == DLOCK_OK) {
        long long v = dlock__mysql_col_ll(res, 0, -1);
        if (v > 0)
            dlock__check_clock(out, v, t0, t1);
    } else {
        dlock__check_note(out, "the server's clock: %s", dlock_errmsg());
    }
    if (res)
        mysql_free_result(res);
    dlock__mysql_conn_put(ms, cn);
    return DLOCK_OK;
}
