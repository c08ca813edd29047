/* SPDX-License-Identifier: MIT */
/*
 * test_redis_tls_topo.c -- the Redis store over TLS in its other forms,
 * every connection of the store TLS (docs/stores.md "rediss://"): redlock://
 * over three TLS nodes, redis-sentinel:// with sentinels and data nodes on
 * TLS (tls-replication yes everywhere: th_sentinels_start_tls()) and
 * redis-cluster:// with tls-cluster yes (th_cluster_start_tls()). Each
 * server serves server-ip.crt (IP:127.0.0.1 and DNS:localhost): the
 * addresses the sentinels and CLUSTER SLOTS name are 127.0.0.1, checked
 * against the certificate's IP SAN; one Redlock URI names localhost and
 * another gives sni=localhost, the other ways a name is checked.
 *
 *   test_redis_tls_topo [filter]
 *
 * The servers keep a plain port beside the TLS one, for the harness's own
 * looks (hiredis, plain); the library is only ever given or told TLS
 * ports (the sentinels and the cluster name TLS ports to TLS clients), and
 * a TLS client sent to a plain port fails its handshake, so a test that
 * passes went over TLS throughout.
 *
 * Per form: acquire and release, two clients exclude each other, tokens
 * grow, a waiter is woken by the release's message (over the TLS
 * subscriber connections: SUBSCRIBE on the Redlock nodes and the
 * primary, SSUBSCRIBE on the slot's primary of a cluster). Sentinel: after
 * SENTINEL FAILOVER (sent with redis-cli --tls), a client follows the
 * sentinels to the new primary over TLS.
 *
 * Timing: a wake-up by message is one round trip; it is bounded by 5 s of
 * slack for a busy machine (ctest -j, valgrind: a TLS handshake costs tens
 * of ms there), far below the 30 s leases and the 60 s waits it must not
 * wait out. A failover takes the sentinels' down-after (1 s) plus an
 * election: the harness waits for it up to 30 s; the client's acquire on
 * the new primary then is given 10 s (one round trip to the sentinels and
 * one to the primary, and a TLS handshake each, on a busy machine), below
 * the 30 s leases.
 */
#include "test.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MASTER "dlocktlsm"
/* a wake-up by message: see above */
#define WAKE_MS 5000

static dlock *handle(dlock_client *c, const char *name, int64_t ttl)
{
    return th_handle(c, name, ttl, 0, 0);
}

/* A client of uri holds name: its record is on srv while it is held. */
static void held_on(const char *uri, const char *name, th_redis *srv)
{
    dlock_client *c = th_client(uri, th_patient());
    dlock *l = handle(c, name, 30000);
    char v[256];

    CHECK_OK(dlock_acquire(l, 0));
    th_redis_cmd(srv, v, sizeof(v), "GET dlock:{%s}", name);
    CHECK(strlen(v) > 0);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

/* What every form must do over TLS, on store URI u, with lock `name`:
 * acquire/release, two clients exclude each other, tokens grow, and a
 * waiter on a second client is woken by the release's message. */
static void basics(const char *u, const char *name)
{
    dlock_client *a = th_client(u, th_patient()),
                 *b = th_client(u, th_patient());
    dlock *la = handle(a, name, 30000), *lb = handle(b, name, 30000);
    th_waiter w;
    pthread_t th;

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t t1 = dlock_token(la);
    CHECK(t1 > 0);
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    CHECK_RC(dlock_acquire(lb, 200), DLOCK_EBUSY);
    CHECK_OK(dlock_release(la));

    CHECK_OK(dlock_acquire(lb, 0));
    uint64_t t2 = dlock_token(lb);
    CHECK_OP(t2, >, t1);
    CHECK_RC(dlock_acquire(la, 0), DLOCK_EBUSY);

    /* a waiter on a's connections, woken when b releases */
    memset(&w, 0, sizeof(w));
    w.l = la;
    th_waiter_start(&w, &th);
    /* 10 s at most: a waiter subscribes and queues in a round trip or
     * two, a busy machine may take far longer (Redlock: the most
     * subscribers any node reports) */
    CHECK(th_wait_queued(b, name, 1, 10000));
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(lb));
    pthread_join(th, NULL);
    CHECK_RC(w.rc, DLOCK_OK);
    CHECK_OP(w.token, >, t2);
    /* the message, not the 30 s lease nor the 60 s wait */
    CHECK_OP(w.done_at - t0, <, WAKE_MS);

    /* released by the waiter thread: free again */
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OP(dlock_token(lb), >, w.token);
    CHECK_OK(dlock_release(lb));

    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

/* ------------------------------------------------------------------------ */
/* redlock:// over three TLS nodes                                          */
/* ------------------------------------------------------------------------ */

static th_redis rl[3];

static void redlock_nodes(void)
{
    for (int i = 0; i < 3; i++)
        if (rl[i].pid <= 0)
            th_redis_start_tls(&rl[i], "server-ip", 0, NULL);
}

/* The node timeout is 250 ms, as the generic redlock suites give it (a
 * node of a busy machine may not be scheduled within the default 50 ms);
 * a TLS round trip adds well under a millisecond to it on loopback. */
static void redlock_uri(char *out, size_t cap, const char *host,
                        const char *more)
{
    char ca[900];
    size_t o = (size_t)snprintf(out, cap, "redlock://");

    for (int i = 0; i < 3; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s%s:%d", i ? "," : "",
                              host, rl[i].tls_port);
    if (snprintf(out + o, cap - o, "?tls=1&cacert=%s&node_timeout=250%s",
                 th_tls_param(ca, sizeof(ca), "ca.crt"), more) >=
        (int)(cap - o))
        th_fail(__FILE__, __LINE__, "URI too long");
}

TEST(redlock_over_tls_by_ip)
{
    char u[1400];

    redlock_nodes();
    redlock_uri(u, sizeof(u), "127.0.0.1", "");
    basics(u, "tls-rl/ip");
}

TEST(redlock_over_tls_by_name)
{
    char u[1400];

    redlock_nodes();
    redlock_uri(u, sizeof(u), "localhost", "");
    basics(u, "tls-rl/name");
}

/* sni=localhost: the name checked on every node, whatever host the URI
 * names */
TEST(redlock_over_tls_with_sni)
{
    char u[1400];

    redlock_nodes();
    redlock_uri(u, sizeof(u), "127.0.0.1", "&sni=localhost");
    basics(u, "tls-rl/sni");
}

/* The key is on every node, as the TLS client wrote it: looked at over the
 * plain ports, a quorum (here every node) has it while held. */
TEST(redlock_over_tls_writes_every_node)
{
    char u[1400], v[256];

    redlock_nodes();
    redlock_uri(u, sizeof(u), "127.0.0.1", "");
    dlock_client *c = th_client(u, th_patient());
    dlock *l = handle(c, "tls-rl/keys", 30000);
    CHECK_OK(dlock_acquire(l, 0));
    for (int i = 0; i < 3; i++) {
        th_redis_cmd(&rl[i], v, sizeof(v), "GET dlock:{tls-rl/keys}");
        CHECK(strlen(v) > 0);
    }
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

/* ------------------------------------------------------------------------ */
/* redis-sentinel:// with every node on TLS                                 */
/* ------------------------------------------------------------------------ */

static th_sentinels sen;

static th_sentinels *sentinels(void)
{
    if (!sen.uri[0])
        th_sentinels_start_tls(&sen, MASTER, 1000, 10000);
    return &sen;
}

/* The set speaks TLS by itself: redis-cli --tls at a sentinel's TLS port
 * gets the primary's TLS port, and the primary has both replicas (so the
 * replication is TLS: its port is the only one they were given). */
TEST(sentinel_set_speaks_tls)
{
    th_sentinels *t = sentinels();
    char out[1024], want[32];

    CHECK_EQ(th_redis_tls_cli(&t->sent[0], out, sizeof(out),
                              "SENTINEL get-master-addr-by-name %s", MASTER),
             0);
    snprintf(want, sizeof(want), "%d", t->data[0].tls_port);
    CHECK_CONTAINS(out, want);
    CHECK_EQ(th_redis_tls_cli(&t->data[0], out, sizeof(out),
                              "INFO replication"),
             0);
    CHECK_CONTAINS(out, "connected_slaves:2");
}

TEST(sentinel_over_tls)
{
    th_sentinels *t = sentinels();

    basics(t->uri, "tls-s/one");
    /* the primary (data[0], as no failover ran yet) got it */
    held_on(t->uri, "tls-s/where", &t->data[0]);
}

/* SENTINEL FAILOVER over redis-cli --tls; a client that was open before
 * follows the sentinels to the new primary, over TLS, and a new client
 * finds it too. */
TEST(sentinel_over_tls_follows_a_failover)
{
    th_sentinels *t = sentinels();
    dlock_client *c = th_client(t->uri, th_patient());
    dlock *l = handle(c, "tls-s/before", 30000);
    char out[256], v[256];

    CHECK_OK(dlock_acquire(l, 0));
    uint64_t before = dlock_token(l);
    CHECK_OK(dlock_release(l));
    dlock_close(l);

    int old = th_sentinels_primary(t);
    CHECK_EQ(old, t->data[0].tls_port);
    CHECK_EQ(th_redis_tls_cli(&t->sent[1], out, sizeof(out),
                              "SENTINEL FAILOVER %s", MASTER),
             0);
    CHECK_CONTAINS(out, "OK");
    int now = th_sentinels_failed_over(t, old, 30000);
    CHECK(now > 0);
    th_redis *np = th_sentinels_node(t, now);
    CHECK_EQ(np->tls_port, now);

    /* the old client, on a new name: bounded (see the header) */
    l = handle(c, "tls-s/after", 30000);
    int64_t t0 = th_now_ms(), until = t0 + 10000;
    int rc;
    do {
        rc = dlock_acquire(l, 1000);
    } while (rc != DLOCK_OK && th_now_ms() < until);
    CHECK_RC(rc, DLOCK_OK);
    th_redis_cmd(np, v, sizeof(v), "GET dlock:{tls-s/after}");
    CHECK(strlen(v) > 0);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    /* tokens carry on at the new primary (it had the old one's counter) */
    l = handle(c, "tls-s/before", 30000);
    CHECK_OK(dlock_acquire(l, 5000));
    CHECK_OP(dlock_token(l), >, before);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);

    /* a new client, and the waiter's wake-up, at the new primary */
    basics(t->uri, "tls-s/after-new");
}

/* ------------------------------------------------------------------------ */
/* redis-cluster:// with tls-cluster yes                                    */
/* ------------------------------------------------------------------------ */

static th_cluster cl;

static th_cluster *cluster(void)
{
    if (!cl.uri[0])
        th_cluster_start_tls(&cl, 15000);
    return &cl;
}

/* The cluster names TLS ports to a TLS client: redis-cli --tls asks
 * CLUSTER SLOTS at a TLS port and gets the nodes' TLS ports. */
TEST(cluster_names_tls_ports_to_tls_clients)
{
    th_cluster *t = cluster();
    char out[4096], want[32];

    CHECK_EQ(th_redis_tls_cli(&t->node[0], out, sizeof(out),
                              "CLUSTER SLOTS"),
             0);
    for (int i = 0; i < 3; i++) {
        snprintf(want, sizeof(want), "%d", t->node[i].tls_port);
        CHECK_CONTAINS(out, want);
    }
}

TEST(cluster_over_tls)
{
    th_cluster *t = cluster();
    /* names whose slots are on three different primaries */
    const char *names[3] = {NULL, NULL, NULL};
    static char buf[3][32];
    char key[64];
    int found = 0;

    for (int k = 0; k < 200 && found < 3; k++) {
        snprintf(key, sizeof(key), "dlock:{tls-c/%d}", k);
        int owner = th_cluster_owner(t, th_cluster_slot(t, key));
        CHECK(owner >= 0 && owner < 3);
        if (!names[owner]) {
            snprintf(buf[owner], sizeof(buf[owner]), "tls-c/%d", k);
            names[owner] = buf[owner];
            found++;
        }
    }
    CHECK_EQ(found, 3);
    for (int i = 0; i < 3; i++) {
        basics(t->uri, names[i]);
        /* held: on the slot's primary */
        held_on(t->uri, names[i], &t->node[i]);
    }
}

/* One client holding locks on the three primaries at once (a TLS
 * connection to each, opened as MOVED or the map sends it there). */
TEST(cluster_over_tls_one_client_three_shards)
{
    th_cluster *t = cluster();
    dlock_client *c = th_client(t->uri, th_patient());
    dlock *l[8];
    char name[32];

    for (int i = 0; i < 8; i++) {
        snprintf(name, sizeof(name), "tls-c/many-%d", i);
        l[i] = handle(c, name, 30000);
        CHECK_OK(dlock_acquire(l[i], 0));
    }
    th_release_close(l, 8);
    dlock_client_close(c);
}

static const th_test tests[] = {
    T(redlock_over_tls_by_ip),
    T(redlock_over_tls_by_name),
    T(redlock_over_tls_with_sni),
    T(redlock_over_tls_writes_every_node),
    T(sentinel_set_speaks_tls),
    T(sentinel_over_tls),
    T(sentinel_over_tls_follows_a_failover),
    T(cluster_names_tls_ports_to_tls_clients),
    T(cluster_over_tls),
    T(cluster_over_tls_one_client_three_shards),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    th_need_redis_tls();
    return th_main(argc, argv, tests);
}
