/* SPDX-License-Identifier: MIT */
/*
 * redlock_open.c -- the Redlock store's URI options (nodes, node_timeout,
 * drift_factor, drift_ms and those of redis://), its open (every node
 * connected at once, logins and script loads pipelined; a quorum must
 * answer within the client's timeout) and its close.
 */
#include "redlock_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Open and close                                                           */
/* ------------------------------------------------------------------------ */

void dlock__redlock_close(void *st)
{
    rl_store *rs = st;

    if (!rs)
        return;
    for (int i = 0; i < rs->n; i++) {
        rnode *n = &rs->nodes[i];
        dlock__redlock_node_drop(n);
        if (n->sub)
            dlock__rio_free(n->sub);
        free(n->host);
    }
    while (rs->chans) {
        rchan *ch = rs->chans;
        rs->chans = ch->next;
        free(ch->name);
        free(ch->want);
        free(ch);
    }
    if (rs->epfd >= 0)
        close(rs->epfd);
    free(rs->nodes);
    pthread_mutex_destroy(&rs->mu);
    pthread_mutex_destroy(&rs->sub_mu);
    pthread_cond_destroy(&rs->sub_cv);
    dlock__redis_config_free(&rs->cfg);
    free(rs);
}

static int parse_config(rl_store *rs, const dlock__uri *u)
{
    static const char *const params[] = {"prefix",       "timeout",
                                         "db",           "node_timeout",
                                         "drift_factor", "drift_ms",
                                         "tls",          "cacert",
                                         "cert",         "key",
                                         "sni",          "insecure",
                                         NULL};
    const char *db = dlock__uri_param(u, "db");
    const char *nt = dlock__uri_param(u, "node_timeout");
    const char *df = dlock__uri_param(u, "drift_factor");
    const char *dm = dlock__uri_param(u, "drift_ms");
    long long v;
    int rc = dlock__uri_check_params(u, params);

    if (rc)
        return rc;
    if (u->nhosts < 1 || u->nhosts > MAX_NODES)
        return dlock__err(DLOCK_EINVAL,
                          "redlock:// needs 1 to %d nodes: "
                          "redlock://host:port,host:port,...",
                          MAX_NODES);
    if (u->path[0] && strcmp(u->path, "/") != 0) {
        if (db)
            return dlock__err(DLOCK_EINVAL,
                              "redlock://: give the database in the path "
                              "or as ?db=, not both");
        db = u->path + 1;
    }
    rc = dlock__redis_config_parse(&rs->cfg, u, "redlock", db);
    if (rc)
        return rc;
    if (nt) {
        if (dlock__parse_int(nt, 60000, &v) != 0 || v == 0)
            return dlock__err(DLOCK_EINVAL,
                              "redlock: node_timeout must be milliseconds "
                              "(1..60000), not '%.40s'",
                              nt);
        rs->node_timeout = v;
    }
    if (df) {
        char *end;
        errno = 0;
        double d = strtod(df, &end);
        if (errno || end == df || *end || !(d >= 0 && d <= 0.5))
            return dlock__err(DLOCK_EINVAL,
                              "redlock: drift_factor must be a fraction "
                              "between 0 and 0.5, not '%.40s'",
                              df);
        rs->drift_factor = d;
    }
    if (dm) {
        if (dlock__parse_int(dm, 60000, &v) != 0)
            return dlock__err(DLOCK_EINVAL,
                              "redlock: drift_ms must be milliseconds "
                              "(0..60000), not '%.40s'",
                              dm);
        rs->drift_ms = v;
    }
    rs->n = (int)u->nhosts;
    rs->quorum = rs->n / 2 + 1;
    rs->nodes = calloc((size_t)rs->n, sizeof(rnode));
    if (!rs->nodes)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    for (int i = 0; i < rs->n; i++) {
        rnode *n = &rs->nodes[i];
        n->idx = i;
        if (!(n->host = strdup(u->hosts[i].host)))
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        n->port = u->hosts[i].port ? u->hosts[i].port : DEFAULT_PORT;
        for (int k = 0; k < i; k++)
            if (rs->nodes[k].port == n->port &&
                strcasecmp(rs->nodes[k].host, n->host) == 0)
                return dlock__err(DLOCK_EINVAL,
                                  "redlock: node %.200s:%d is listed twice "
                                  "(each node must count once towards the "
                                  "quorum)",
                                  n->host, n->port);
        snprintf(n->where, sizeof(n->where),
                 strchr(n->host, ':') ? "redis [%.200s]:%d"
                                      : "redis %.200s:%d",
                 n->host, n->port);
    }
    snprintf(rs->where, sizeof(rs->where), "redlock (%d nodes)", rs->n);
    return DLOCK_OK;
}

/* Every node answered its login and script loads, or failed. */
static int all_set_up(const rl_store *rs, void *arg)
{
    (void)arg;
    for (int i = 0; i < rs->n; i++)
        if (dlock__redlock_node_busy(&rs->nodes[i]))
            return 0;
    return 1;
}

static int quorum_set_up(const rl_store *rs, void *arg)
{
    int ready = 0;

    (void)arg;
    for (int i = 0; i < rs->n; i++) {
        const rnode *n = &rs->nodes[i];
        ready += n->ctx && !n->rc && !n->connecting && n->setup == 0;
    }
    return ready >= rs->quorum || all_set_up(rs, NULL);
}

int dlock__redlock_open(void **out, dlock_client *c, const dlock__uri *u,
                        int64_t timeout_ms)
{
    rl_store *rs = calloc(1, sizeof(*rs));
    int rc;

    if (!rs)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    rs->client = c;
    rs->epfd = -1;
    rs->node_timeout = DEFAULT_NODE_TIMEOUT_MS;
    rs->drift_factor = DEFAULT_DRIFT_FACTOR;
    rs->drift_ms = DEFAULT_DRIFT_MS;
    rs->cfg.timeout_ms = timeout_ms;
    pthread_mutex_init(&rs->mu, NULL);
    pthread_mutex_init(&rs->sub_mu, NULL);
    rc = dlock__cond_init(&rs->sub_cv);
    if (rc) {
        pthread_mutex_destroy(&rs->mu);
        pthread_mutex_destroy(&rs->sub_mu);
        free(rs);
        return rc;
    }
    rc = parse_config(rs, u);
    if (rc == DLOCK_OK) {
        rs->epfd = epoll_create1(EPOLL_CLOEXEC);
        if (rs->epfd < 0)
            rc = dlock__err(DLOCK_ENOMEM, "epoll_create1: %s",
                            strerror(errno));
    }
    if (rc == DLOCK_OK) {
        /* connect to every node at once; a quorum must answer */
        pthread_mutex_lock(&rs->mu);
        int64_t now = dlock__now_ms();
        dlock__redlock_round_begin(rs);
        for (int i = 0; i < rs->n; i++)
            dlock__redlock_node_connect(rs, &rs->nodes[i], now);
        dlock__redlock_round_run(rs, now + rs->cfg.timeout_ms, quorum_set_up,
                                 NULL);
        dlock__redlock_round_run(rs, dlock__now_ms() + rs->node_timeout,
                                 all_set_up, NULL);
        int ready = 0;
        for (int i = 0; i < rs->n; i++) {
            rnode *n = &rs->nodes[i];
            ready += n->ctx && !n->rc && !n->connecting && n->setup == 0;
        }
        if (ready < rs->quorum || rs->sha_known != (1 << NSCRIPTS) - 1)
            rc = dlock__redlock_quorum_failure(rs, ready, "cannot connect");
        pthread_mutex_unlock(&rs->mu);
    }
    if (rc) {
        dlock__redlock_close(rs);
        return rc;
    }
    *out = rs;
    return DLOCK_OK;
}
