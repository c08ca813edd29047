/* SPDX-License-Identifier: MIT */
/*
 * sentinel.c -- Redis under Sentinel for the tests (test.h: th_sentinels):
 * a primary, two replicas and three sentinels, all private
 * redis-servers on free loopback ports.
 */
#include "test.h"

#include <hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* How many entries a sentinel's `SENTINEL what NAME` lists. */
static long long listed(th_redis *s, const char *what, const char *name)
{
    return th_redis_cmd(s, NULL, 0, "SENTINEL %s %s", what, name);
}

/* A data node or sentinel: over TLS (th_sentinels_start_tls) with a TLS
 * port beside its plain one, tls-replication yes. */
static void start_node(th_sentinels *t, th_redis *r, const char *extra,
                       int sentinel)
{
    char conf[1024];

    if (!t->tls) {
        th__redis_start(r, extra, sentinel);
        return;
    }
    snprintf(conf, sizeof(conf), "tls-replication yes\n%s",
             extra ? extra : "");
    for (int attempt = 0; attempt < 5; attempt++)
        if (th__redis_start_port_tls(r, conf, sentinel, 0, "server-ip") == 0)
            return;
    th_fail(__FILE__, __LINE__, "redis-server with a TLS port did not "
            "start (see %s)", r->dir);
}

static void start(th_sentinels *t, const char *name, int down_ms,
                  int failover_ms, int tls)
{
    char extra[512];
    int pport;

    memset(t, 0, sizeof(*t));
    t->tls = tls;
    snprintf(t->name, sizeof(t->name), "%s", name);
    start_node(t, &t->data[0], NULL, 0);
    /* over TLS, every address is a TLS port */
    pport = tls ? t->data[0].tls_port : t->data[0].port;
    snprintf(extra, sizeof(extra), "replicaof 127.0.0.1 %d", pport);
    start_node(t, &t->data[1], extra, 0);
    start_node(t, &t->data[2], extra, 0);
    snprintf(extra, sizeof(extra),
             "sentinel monitor %s 127.0.0.1 %d 2\n"
             "sentinel down-after-milliseconds %s %d\n"
             "sentinel failover-timeout %s %d\n"
             "sentinel parallel-syncs %s 1\n",
             name, pport, name, down_ms, name, failover_ms, name);
    for (int i = 0; i < 3; i++)
        start_node(t, &t->sent[i], extra, 1);
    if (tls) {
        char ca[900];
        if (snprintf(t->uri, sizeof(t->uri),
                 "redis-sentinel://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d/"
                 "%s?tls=1&cacert=%s",
                 t->sent[0].tls_port, t->sent[1].tls_port,
                 t->sent[2].tls_port, name,
                 th_tls_param(ca, sizeof(ca), "ca.crt")) >=
            (int)sizeof(t->uri))
            th_fail(__FILE__, __LINE__, "the URI is too long");
    } else {
        snprintf(t->uri, sizeof(t->uri),
                 "redis-sentinel://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d/%s",
                 t->sent[0].port, t->sent[1].port, t->sent[2].port, name);
    }
    int64_t until = th_now_ms() + 30000;
    for (;;) {
        int ready = th_redis_cmd(&t->data[0], NULL, 0, "WAIT 2 100") == 2;
        for (int i = 0; i < 3 && ready; i++)
            ready = listed(&t->sent[i], "replicas", name) == 2 &&
                    listed(&t->sent[i], "sentinels", name) == 2;
        if (ready)
            return;
        if (th_now_ms() > until)
            th_fail(__FILE__, __LINE__, "the sentinels did not see the "
                                        "replicas and each other in 30 s "
                                        "(see %s)", t->sent[0].dir);
        th_sleep_ms(100);
    }
}

void th_sentinels_start(th_sentinels *t, const char *name, int down_ms,
                        int failover_ms)
{
    start(t, name, down_ms, failover_ms, 0);
}

void th_sentinels_start_tls(th_sentinels *t, const char *name, int down_ms,
                            int failover_ms)
{
    start(t, name, down_ms, failover_ms, 1);
}

void th_sentinels_stop(th_sentinels *t)
{
    for (int i = 0; i < 3; i++)
        th_redis_kill(&t->sent[i], SIGKILL);
    for (int i = 0; i < 3; i++) {
        th_redis_kill(&t->data[i], SIGCONT);
        th_redis_kill(&t->data[i], SIGKILL);
    }
}

int th_sentinels_primary(th_sentinels *t)
{
    for (int i = 0; i < 3; i++) {
        if (t->sent[i].pid <= 0)
            continue;
        struct timeval tv = {2, 0};
        redisContext *c = redisConnectWithTimeout("127.0.0.1",
                                                  t->sent[i].port, tv);
        int port = 0;
        if (c && !c->err) {
            redisReply *r = redisCommand(c, "SENTINEL get-master-addr-by-"
                                            "name %s",
                                         t->name);
            if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                r->element[1]->type == REDIS_REPLY_STRING)
                port = atoi(r->element[1]->str);
            if (r)
                freeReplyObject(r);
        }
        if (c)
            redisFree(c);
        if (port)
            return port;
    }
    return 0;
}

th_redis *th_sentinels_node(th_sentinels *t, int port)
{
    for (int i = 0; i < 3; i++)
        if (t->data[i].port == port ||
            (t->data[i].tls_port && t->data[i].tls_port == port))
            return &t->data[i];
    th_fail(__FILE__, __LINE__, "no data node on port %d", port);
    return NULL;
}

int th_sentinels_failed_over(th_sentinels *t, int old, int64_t ms)
{
    int64_t until = th_now_ms() + ms;

    while (th_now_ms() < until) {
        int p = th_sentinels_primary(t);
        if (p && p != old) {
            char info[4096];
            th_redis *n = th_sentinels_node(t, p);
            if (n->pid > 0 &&
                th_redis_cmd(n, info, sizeof(info), "INFO replication") >=
                    0 &&
                strstr(info, "role:master"))
                return p;
        }
        th_sleep_ms(50);
    }
    return 0;
}
