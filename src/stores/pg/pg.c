/* SPDX-License-Identifier: MIT */
/*
 * pg.c -- the PostgreSQL store (libpq), in two modes, each a backend of
 * its own: table mode (the default; pg_table.c), a lock table whose
 * releases hand the lock to the oldest live waiter over LISTEN/NOTIFY,
 * and advisory mode (?mode=advisory; pg_advisory.c), PostgreSQL's
 * session-level advisory locks.
 *
 * This file holds what both modes share: the URI's options and libpq's
 * keywords, open and close, the client thread's loop, and two helpers
 * of the modes' slots. The connections, their statements and the
 * notifications are in pg_conn.c, the SQL texts in pg_sql.c and the
 * schema in pg_schema.c (pg_int.h).
 */
#include "pg_int.h"

#include "opt.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

long long dlock__pg_col_ll(const PGresult *r, int row, int col,
                           long long dflt)
{
    if (PQntuples(r) <= row || PQnfields(r) <= col ||
        PQgetisnull(r, row, col))
        return dflt;
    return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

int dlock__pg_not_ours(pg_store *ps)
{
    return dlock__err(DLOCK_ENOTHELD,
                      "postgres %s: the lock row is no longer ours (expired "
                      "or taken over)",
                      ps->redacted);
}

/* ------------------------------------------------------------------------ */
/* The client thread                                                        */
/* ------------------------------------------------------------------------ */

int dlock__pg_loop_fd(void *st)
{
    return ((pg_store *)st)->epfd;
}

void dlock__pg_loop_run(void *st, int readable)
{
    pg_store *ps = st;
    struct epoll_event ev[16];
    int n;

    if (!readable)
        return;
    n = epoll_wait(ps->epfd, ev, 16, 0);
    for (int i = 0; i < n; i++) {
        if (ev[i].data.u64 == EV_IDLE) {
            uint64_t ticks;
            if (read(ps->idle_fd, &ticks, sizeof(ticks)) > 0)
                dlock__pg_idle_run(ps);
        } else if (ev[i].data.u64 == EV_MAIN) {
            dlock__pg_main_read(ps);
        } else {
            pthread_mutex_lock(&ps->hmu);
            dlock__pg_hold_check(ps, ev[i].data.ptr);
            pthread_mutex_unlock(&ps->hmu);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Open and close                                                           */
/* ------------------------------------------------------------------------ */

void dlock__pg_close(void *st)
{
    pg_store *ps = st;

    if (!ps)
        return;
    void *idle[DLOCK__POOL_MAX];
    for (unsigned i = dlock__pool_drain(&ps->idle, idle); i > 0; i--)
        dlock__pg_conn_free(idle[i - 1]);
    while (ps->holds) {
        pg_conn *cn = ps->holds;
        ps->holds = cn->next;
        if (cn != ps->main)
            dlock__pg_conn_free(cn);
    }
    dlock__pg_conn_free(ps->main);
    dlock__pg_conn_free(ps->half);
    if (ps->epfd >= 0)
        close(ps->epfd);
    if (ps->idle_fd >= 0)
        close(ps->idle_fd);
    for (int i = 0; i < S_COUNT; i++)
        free(ps->sql[i]);
    for (size_t i = 0; i < sizeof(ps->vals) / sizeof(ps->vals[0]); i++) {
        if (ps->vals[i]) {
            dlock__wipe(ps->vals[i], strlen(ps->vals[i]));
            free(ps->vals[i]);
        }
    }
    pthread_mutex_destroy(&ps->mu);
    pthread_cond_destroy(&ps->cv);
    pthread_mutex_destroy(&ps->hmu);
    free(ps->redacted);
    free(ps);
}

static int add_kw(pg_store *ps, size_t *k, const char *key, const char *val)
{
    if (!val)
        return DLOCK_OK;
    if (*k + 1 >= sizeof(ps->keys) / sizeof(ps->keys[0]))
        return dlock__err(DLOCK_EINVAL, "postgres %s: too many options",
                          ps->redacted);
    ps->keys[*k] = key;
    if (!(ps->vals[*k] = strdup(val)))
        return dlock__pg_enomem();
    (*k)++;
    ps->keys[*k] = NULL;
    return DLOCK_OK;
}

/* libpq's keywords from the URI: hosts and ports as comma lists (libpq
 * tries each; target_session_attrs=read-write finds the primary). */
static int build_keywords(pg_store *ps, const dlock__uri *u)
{
    static const char *const pass[] = {"sslmode", "sslrootcert", "sslcert",
                                       "sslkey", "sslcrl",
                                       "target_session_attrs", NULL};
    char hosts[1024] = "", ports[256] = "";
    size_t k = 0, ho = 0, po = 0;
    int rc = DLOCK_OK;

    /* stops at the first host that does not fit: past it, the room left
     * (sizeof - ho) would wrap around */
    for (size_t i = 0; i < u->nhosts && ho < sizeof(hosts) &&
                       po < sizeof(ports);
         i++) {
        ho += (size_t)snprintf(hosts + ho, sizeof(hosts) - ho, "%s%s",
                               i ? "," : "", u->hosts[i].host);
        po += (size_t)snprintf(ports + po, sizeof(ports) - po, "%s%d",
                               i ? "," : "",
                               u->hosts[i].port ? u->hosts[i].port : 5432);
    }
    if (ho >= sizeof(hosts) || po >= sizeof(ports))
        return dlock__err(DLOCK_EINVAL, "postgres %s: too many hosts",
                          ps->redacted);
    const char *host = dlock__uri_param(u, "host");
    if (host)
        rc = add_kw(ps, &k, "host", host);
    else if (u->nhosts)
        rc = add_kw(ps, &k, "host", hosts);
    if (!rc && u->nhosts)
        rc = add_kw(ps, &k, "port", ports);
    if (!rc && u->path[0] && u->path[1])
        rc = add_kw(ps, &k, "dbname", u->path + 1);
    if (!rc)
        rc = add_kw(ps, &k, "user", u->user);
    if (!rc)
        rc = add_kw(ps, &k, "password", u->password);
    for (int i = 0; pass[i] && !rc; i++)
        rc = add_kw(ps, &k, pass[i], dlock__uri_param(u, pass[i]));
    if (!rc)
        rc = add_kw(ps, &k, "application_name", "dlock");
    if (!rc)
        rc = add_kw(ps, &k, "client_encoding", "UTF8");
    /* a dead server or path is noticed in about 10 s even while idle */
    if (!rc)
        rc = add_kw(ps, &k, "keepalives", "1");
    if (!rc)
        rc = add_kw(ps, &k, "keepalives_idle", "5");
    if (!rc)
        rc = add_kw(ps, &k, "keepalives_interval", "2");
    if (!rc)
        rc = add_kw(ps, &k, "keepalives_count", "3");
    return rc;
}

int dlock__pg_open(void **out, dlock_client *c, const dlock__uri *u,
                  int64_t timeout_ms)
{
    static const char *const params[] = {
        "table", "mode",   "timeout", "pooler", "sslmode", "sslrootcert",
        "sslcert", "sslkey", "sslcrl", "target_session_attrs", "host", NULL};
    const char *table;
    const char *mode = dlock__uri_param(u, "mode");
    const char *pooler = dlock__uri_param(u, "pooler");
    pg_names nm;
    pg_store *ps;
    pg_conn *cn;
    int rc;

    rc = dlock__uri_check_params(u, params);
    if (rc)
        return rc;
    if (mode && strcmp(mode, "table") && strcmp(mode, "advisory"))
        return dlock__err(DLOCK_EINVAL, "postgres URI %s: mode must be "
                                        "'table' or 'advisory', not '%s'",
                          u->redacted, mode);
    if (pooler && strcmp(pooler, "session") &&
        strcmp(pooler, "transaction"))
        return dlock__err(DLOCK_EINVAL, "postgres URI %s: pooler must be "
                                        "'session' or 'transaction' (the "
                                        "pool mode of the PgBouncer in "
                                        "front), not '%s'",
                          u->redacted, pooler);
    if ((rc = dlock__opt_table("postgres", u, PG_DEFAULT_TABLE,
                               PG_TABLE_MAX, &table)) ||
        (rc = dlock__opt_timeout("postgres", u, &timeout_ms)))
        return rc;
    if (!u->nhosts && !dlock__uri_param(u, "host") && u->path[0] == '\0')
        return dlock__err(DLOCK_EINVAL, "postgres URI %s: expected "
                                        "postgres://[user:password@]host"
                                        "[:port][,host:port...]/database",
                          u->redacted);

    ps = calloc(1, sizeof(*ps));
    if (!ps || !(ps->redacted = strdup(u->redacted))) {
        free(ps);
        return dlock__pg_enomem();
    }
    ps->idle.max = PG_IDLE_MAX;
    ps->client = c;
    ps->epfd = ps->idle_fd = -1;
    ps->advisory = mode && !strcmp(mode, "advisory");
    ps->timeout_ms = timeout_ms;
    pthread_mutex_init(&ps->mu, NULL);
    dlock__cond_init(&ps->cv);
    pthread_mutex_init(&ps->hmu, NULL);
    snprintf(ps->table, sizeof(ps->table), "%s", table);
    ps->pooler = !pooler ? POOLER_NONE
                 : !strcmp(pooler, "session") ? POOLER_SESSION
                                              : POOLER_TRANSACTION;
    snprintf(ps->chan, sizeof(ps->chan), "dlock_%s", dlock__client_id(c));
    dlock__pg_names_of(table, &nm);
    dlock__pg_quote_ident(table, "_tokens", ps->seq_ident,
                          sizeof(ps->seq_ident));
    dlock__pg_quote_literal(ps->seq_ident, ps->seq_lit, sizeof(ps->seq_lit));
    ps->epfd = epoll_create1(EPOLL_CLOEXEC);
    ps->idle_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (ps->epfd < 0 || ps->idle_fd < 0) {
        rc = dlock__err(DLOCK_ENOMEM, "epoll/timerfd: %s", strerror(errno));
        dlock__pg_close(ps);
        return rc;
    }
    struct epoll_event ev = {.events = EPOLLIN};
    ev.data.u64 = EV_IDLE;
    epoll_ctl(ps->epfd, EPOLL_CTL_ADD, ps->idle_fd, &ev);

    rc = build_keywords(ps, u);
    if (!rc)
        rc = dlock__pg_build_statements(ps, &nm, ps->seq_lit);
    if (rc) {
        dlock__pg_close(ps);
        return rc;
    }
    /* reach the server now, so that a wrong address or password fails
     * here, and make the table if it is missing */
    int64_t deadline = dlock__now_ms() + timeout_ms;
    rc = dlock__pg_conn_get(ps, deadline, &cn);
    if (rc) {
        dlock__pg_close(ps);
        return rc;
    }
    rc = dlock__pg_ensure_schema(ps, cn, &nm, deadline);
    if (rc)
        cn->broken = 1;
    dlock__pg_conn_put(ps, cn);
    if (rc == DLOCK_OK && ps->advisory && !ps->sessions)
        rc = dlock__err(DLOCK_ENOTSUP,
                        "postgres %s: advisory mode holds each lock in a "
                        "session, which %s: use table mode, or connect to "
                        "the server or to a session-mode pool "
                        "(?pooler=session)",
                        ps->redacted,
                        ps->pooler == POOLER_TRANSACTION
                            ? "transaction pooling (?pooler=transaction) "
                              "does not keep"
                            : "a pooler in front of the server may not keep "
                              "(say ?pooler=session if it does)");
    if (rc) {
        dlock__pg_close(ps);
        return rc;
    }
    *out = ps;
    return DLOCK_OK;
}
