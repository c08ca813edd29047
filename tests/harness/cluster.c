/* SPDX-License-Identifier: MIT */
/*
 * cluster.c -- Redis Cluster for the tests (test.h: th_cluster): three
 * primaries with one replica each, private redis-servers on loopback
 * ports whose cluster bus ports (port + 10000) are free too. The cluster
 * is joined by hand, the steps redis-cli --cluster create takes, so that
 * node[3+i] is always node[i]'s replica; slots move the way redis-cli
 * --cluster reshard moves them, one stage at a time.
 */
#include "test.h"

#include <arpa/inet.h>
#include <hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Node ports 20000..22767, bus ports 30000..32767: both below Linux's
 * ephemeral range (32768 up), where th_free_port()'s servers and every
 * client socket live, so nothing takes a node's port while the node is
 * down (th_redis_restart of a killed node). */
#define PORT_MIN 20000
#define PORT_SPAN 2768
#define BUS_OFFSET 10000

#define NODES 6

/* The slots of node[0], [1], [2], as redis-cli --cluster create splits
 * them. */
static const int first_slot[3] = {0, 5461, 10923};
static const int last_slot[3] = {5460, 10922, 16383};

/* One slot range of a node's CLUSTER SLOTS, by port. */
typedef struct range {
    int first, last;
    int primary;          /* its port */
    int nrep, rep[NODES]; /* its replicas' ports, ascending */
} range;

/* 1 if a TCP socket can bind 127.0.0.1:port now. */
static int bindable(int port)
{
    struct sockaddr_in a;
    int s = socket(AF_INET, SOCK_STREAM, 0), ok;

    if (s < 0)
        return 0;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons((uint16_t)port);
    ok = bind(s, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(s);
    return ok;
}

/* A random node port that is free, its bus port too. Random, not the
 * first free: several test binaries may start clusters at once. */
static int free_pair(void)
{
    static unsigned seed;

    if (!seed)
        seed = (unsigned)getpid() * 2654435761u ^ (unsigned)th_now_ms();
    for (int i = 0; i < 1000; i++) {
        int p = PORT_MIN + (int)(rand_r(&seed) % PORT_SPAN);
        if (bindable(p) && bindable(p + BUS_OFFSET))
            return p;
    }
    th_fail(__FILE__, __LINE__, "no free port pair (p, p+%d) in %d..%d",
            BUS_OFFSET, PORT_MIN, PORT_MIN + PORT_SPAN - 1);
}

/* Starts one node; another port pair if another process took this one
 * between the check and the server's bind. Over TLS (th_cluster_start_tls)
 * a TLS port beside, and the bus (TLS) on the plain port + 10000, as
 * without TLS (Redis would put it at the TLS port + 10000). */
static void start_node(th_redis *r, const char *extra, int tls)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        int p = free_pair();
        if (!tls) {
            if (th__redis_start_port(r, extra, p) == 0)
                return;
            continue;
        }
        /* the bus demands a client certificate whatever
         * tls-auth-clients says, and server-ip.crt is for servers only
         * (extendedKeyUsage serverAuth): a node would refuse its peers'
         * bus connections ("certificate verify failed"). Each node
         * connects with client.crt (clientAuth, the same CA) */
        const char *d = th_tls_certs();
        char conf[2048];
        if (snprintf(conf, sizeof(conf),
                     "%scluster-port %d\ntls-cluster yes\n"
                     "tls-replication yes\n"
                     "tls-client-cert-file \"%s/client.crt\"\n"
                     "tls-client-key-file \"%s/client.key\"\n",
                     extra, p + BUS_OFFSET, d, d) >= (int)sizeof(conf))
            th_fail(__FILE__, __LINE__, "cluster node config too long");
        if (th__redis_start_port_tls(r, conf, 0, p, "server-ip") == 0)
            return;
    }
    th_fail(__FILE__, __LINE__, "a cluster node did not start (see %s)",
            r->dir);
}

/* One command to a node on a connection of its own: the reply (free it),
 * or NULL when the node is down or does not answer within a second
 * (frozen). */
static redisReply *ask(th_redis *n, const char *fmt, ...)
{
    struct timeval tv = {1, 0};
    redisContext *c;
    redisReply *rep = NULL;
    va_list ap;

    if (n->pid <= 0)
        return NULL;
    c = redisConnectWithTimeout("127.0.0.1", n->port, tv);
    /* the timeout above is the connect's only: a frozen node accepts */
    if (c && !c->err && redisSetTimeout(c, tv) == REDIS_OK) {
        va_start(ap, fmt);
        rep = redisvCommand(c, fmt, ap);
        va_end(ap);
    }
    if (c)
        redisFree(c);
    return rep;
}

/* Fails the test unless rep is a status reply (OK); frees it. */
static void must_ok(redisReply *rep, th_redis *n, const char *what)
{
    if (!rep)
        th_fail(__FILE__, __LINE__, "%s on port %d: no answer", what,
                n->port);
    if (rep->type != REDIS_REPLY_STATUS)
        th_fail(__FILE__, __LINE__, "%s on port %d: %s", what, n->port,
                rep->type == REDIS_REPLY_ERROR ? rep->str
                                               : "not a status reply");
    freeReplyObject(rep);
}

/* 1 if rep is a text reply (INFO, CLUSTER INFO, CLUSTER NODES) containing
 * needle; frees it. */
static int has(redisReply *rep, const char *needle)
{
    int yes = rep && rep->type == REDIS_REPLY_STRING &&
              strstr(rep->str, needle) != NULL;

    if (rep)
        freeReplyObject(rep);
    return yes;
}

static int is_primary(th_redis *n)
{
    return has(ask(n, "INFO replication"), "role:master");
}

/* The index of the node on `port`, or -1. */
static int index_of(th_cluster *t, int port)
{
    for (int i = 0; i < NODES; i++)
        if (port > 0 && (t->node[i].port == port ||
                         (t->node[i].tls_port && t->node[i].tls_port == port)))
            return i;
    return -1;
}

/* A live node's cluster id (CLUSTER MYID), into id[41]. */
static void node_id(th_redis *n, char id[41])
{
    redisReply *rep = ask(n, "CLUSTER MYID");

    if (!rep || rep->type != REDIS_REPLY_STRING || rep->len != 40)
        th_fail(__FILE__, __LINE__, "CLUSTER MYID on port %d: %s", n->port,
                rep && rep->type == REDIS_REPLY_ERROR ? rep->str
                                                      : "no answer");
    memcpy(id, rep->str, 41);
    freeReplyObject(rep);
}

static int by_first(const void *a, const void *b)
{
    return ((const range *)a)->first - ((const range *)b)->first;
}

/* The port of a CLUSTER SLOTS node entry ([ip, port, id, ...]), or 0. */
static int entry_port(const redisReply *e)
{
    return e->type == REDIS_REPLY_ARRAY && e->elements >= 2 &&
                   e->element[1]->type == REDIS_REPLY_INTEGER
               ? (int)e->element[1]->integer
               : 0;
}

/* Node n's CLUSTER SLOTS, sorted by first slot (each node lists its ranges
 * in an order of its own), replicas by port: the number of ranges (*out
 * malloc'd: free it), or -1 when n does not answer. */
static int slot_map(th_redis *n, range **out)
{
    redisReply *rep = ask(n, "CLUSTER SLOTS");
    range *m;
    int nm = 0;

    *out = NULL;
    if (!rep || rep->type != REDIS_REPLY_ARRAY) {
        if (rep)
            freeReplyObject(rep);
        return -1;
    }
    m = calloc(rep->elements + 1, sizeof(*m));
    if (!m)
        th_fail(__FILE__, __LINE__, "out of memory");
    for (size_t k = 0; k < rep->elements; k++) {
        redisReply *e = rep->element[k];
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3)
            continue;
        range *r = &m[nm++];
        r->first = (int)e->element[0]->integer;
        r->last = (int)e->element[1]->integer;
        r->primary = entry_port(e->element[2]);
        for (size_t j = 3; j < e->elements && r->nrep < NODES; j++) {
            int p = entry_port(e->element[j]), at = r->nrep++;
            while (at > 0 && r->rep[at - 1] > p) { /* insertion sort */
                r->rep[at] = r->rep[at - 1];
                at--;
            }
            r->rep[at] = p;
        }
    }
    freeReplyObject(rep);
    qsort(m, (size_t)nm, sizeof(*m), by_first);
    *out = m;
    return nm;
}

/* The port of the primary of `slot` in a map, or 0 (unassigned). */
static int owner_port(const range *m, int nm, int slot)
{
    for (int k = 0; k < nm; k++)
        if (m[k].first <= slot && slot <= m[k].last)
            return m[k].primary;
    return 0;
}

/* 1 if node[owner] answers and every live node that answers says each
 * slot of first..last has node[owner] as its primary. A node that does
 * not answer (killed, frozen) is left out: it is not live. */
static int map_says(th_cluster *t, int first, int last, int owner)
{
    int port = t->node[owner].port, heard_owner = 0;

    for (int i = 0; i < NODES; i++) {
        range *m;
        int nm = slot_map(&t->node[i], &m), ok = nm >= 0;
        for (int s = first; ok && s <= last; s++)
            ok = owner_port(m, nm, s) == port;
        free(m);
        if (nm < 0)
            continue;
        if (!ok)
            return 0;
        heard_owner |= i == owner;
    }
    return heard_owner;
}

/* The slot map as text, "first-last:PRIMARY/REPLICA;..." by port, for
 * comparing nodes' maps; -1 when n does not answer. */
static int map_text(th_redis *n, char *out, size_t cap)
{
    range *m;
    int nm = slot_map(n, &m);
    size_t o = 0;

    out[0] = '\0';
    for (int k = 0; k < nm && o < cap; k++) {
        o += (size_t)snprintf(out + o, cap - o, "%d-%d:%d", m[k].first,
                              m[k].last, m[k].primary);
        for (int j = 0; j < m[k].nrep && o < cap; j++)
            o += (size_t)snprintf(out + o, cap - o, "/%d", m[k].rep[j]);
        if (o < cap)
            o += (size_t)snprintf(out + o, cap - o, ";");
    }
    free(m);
    return nm < 0 ? -1 : 0;
}

/* Until `until` (th_now_ms()) for every node to know the six, each link
 * up (CLUSTER NODES: six "connected", none still in handshake). */
static void wait_met(th_cluster *t, int64_t until)
{
    for (int i = 0; i < NODES; i++) {
        for (;;) {
            redisReply *rep = ask(&t->node[i], "CLUSTER NODES");
            int links = 0;
            if (rep && rep->type == REDIS_REPLY_STRING &&
                !strstr(rep->str, "handshake") &&
                !strstr(rep->str, "noaddr"))
                for (const char *p = rep->str;
                     (p = strstr(p, " connected")); p++)
                    links++;
            if (rep)
                freeReplyObject(rep);
            if (links == NODES)
                break;
            if (th_now_ms() > until)
                th_fail(__FILE__, __LINE__, "cluster node on port %d knows "
                        "%d of the 6 nodes after 30 s", t->node[i].port,
                        links);
            th_sleep_ms(20);
        }
    }
}

/* Joins the six: distinct config epochs (redis-cli gives each node one, so
 * no collision is left for the cluster to resolve), node[i]'s slots,
 * CLUSTER MEET, then node[3+i] replicates node[i]. */
static void join(th_cluster *t, int64_t until)
{
    char id[41];

    for (int i = 0; i < NODES; i++)
        must_ok(ask(&t->node[i], "CLUSTER SET-CONFIG-EPOCH %d", i + 1),
                &t->node[i], "CLUSTER SET-CONFIG-EPOCH");
    for (int i = 0; i < 3; i++)
        must_ok(ask(&t->node[i], "CLUSTER ADDSLOTSRANGE %d %d",
                    first_slot[i], last_slot[i]),
                &t->node[i], "CLUSTER ADDSLOTSRANGE");
    for (int i = 1; i < NODES; i++)
        must_ok(t->tls ? ask(&t->node[0], "CLUSTER MEET 127.0.0.1 %d %d",
                             t->node[i].tls_port,
                             t->node[i].port + BUS_OFFSET)
                       : ask(&t->node[0], "CLUSTER MEET 127.0.0.1 %d",
                             t->node[i].port),
                &t->node[0], "CLUSTER MEET");
    /* a node replicates only a primary it knows */
    wait_met(t, until);
    for (int i = 0; i < 3; i++) {
        node_id(&t->node[i], id);
        must_ok(ask(&t->node[3 + i], "CLUSTER REPLICATE %s", id),
                &t->node[3 + i], "CLUSTER REPLICATE");
    }
}

/* What node i still lacks for the cluster to be ready (NULL: nothing):
 * cluster_state:ok, the slot map `want`, a replica's link in sync. */
static const char *lacks(th_cluster *t, int i, const char *want)
{
    char map[1024];

    if (!has(ask(&t->node[i], "CLUSTER INFO"), "cluster_state:ok"))
        return "cluster_state:ok";
    if (map_text(&t->node[i], map, sizeof(map)) != 0 || strcmp(map, want))
        return "the slot map of the others";
    if (i >= 3 && !has(ask(&t->node[i], "INFO replication"),
                       "master_link_status:up"))
        return "master_link_status:up";
    return NULL;
}

static void start(th_cluster *t, int node_timeout_ms, int tls)
{
    int64_t until = th_now_ms() + 30000;
    char extra[512], want[256];
    const char *why;
    int i;

    memset(t, 0, sizeof(*t));
    t->tls = tls;
    snprintf(extra, sizeof(extra),
             "cluster-enabled yes\n"
             "cluster-config-file nodes.conf\n"
             "cluster-node-timeout %d\n"
             /* a replica takes over whenever its primary fails, however
              * long their link had been down (a test may freeze one) */
             "cluster-replica-validity-factor 0\n"
             /* node[3+i] stays node[i]'s: no replica moves over to a
              * primary left without one */
             "cluster-allow-replica-migration no\n"
             /* a replica's full sync at once (by default the primary
              * waits 5 s for more replicas to sync with them) */
             "repl-diskless-sync-delay 0\n"
             /* CLUSTER SLOTS lists a replica only once its replication
              * offset is past 0, which on an idle primary takes its first
              * PING to the replicas: every second, not every 10 */
             "repl-ping-replica-period 1\n",
             node_timeout_ms);
    for (int k = 0; k < NODES; k++)
        start_node(&t->node[k], extra, tls);
    join(t, until);
    if (tls) {
        char ca[900];
        if (snprintf(t->uri, sizeof(t->uri),
                 "redis-cluster://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d"
                 "?tls=1&cacert=%s",
                 t->node[0].tls_port, t->node[1].tls_port,
                 t->node[2].tls_port,
                 th_tls_param(ca, sizeof(ca), "ca.crt")) >=
            (int)sizeof(t->uri))
            th_fail(__FILE__, __LINE__, "the URI is too long");
    } else {
        snprintf(t->uri, sizeof(t->uri),
                 "redis-cluster://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d",
                 t->node[0].port, t->node[1].port, t->node[2].port);
    }
    snprintf(want, sizeof(want), "0-5460:%d/%d;5461-10922:%d/%d;"
             "10923-16383:%d/%d;", t->node[0].port, t->node[3].port,
             t->node[1].port, t->node[4].port, t->node[2].port,
             t->node[5].port);
    /* the six ready in one pass */
    for (;;) {
        for (i = 0; i < NODES && !(why = lacks(t, i, want)); i++)
            ;
        if (i == NODES)
            return;
        if (th_now_ms() > until)
            th_fail(__FILE__, __LINE__, "cluster node on port %d (node[%d]) "
                    "lacks %s after 30 s (see %s)", t->node[i].port, i, why,
                    t->node[i].dir);
        th_sleep_ms(50);
    }
}

void th_cluster_start(th_cluster *t, int node_timeout_ms)
{
    start(t, node_timeout_ms, 0);
}

void th_cluster_start_tls(th_cluster *t, int node_timeout_ms)
{
    start(t, node_timeout_ms, 1);
}

void th_cluster_stop(th_cluster *t)
{
    for (int i = 0; i < NODES; i++) {
        th_redis_kill(&t->node[i], SIGCONT);
        th_redis_kill(&t->node[i], SIGKILL);
    }
}

int th_cluster_slot(th_cluster *t, const char *key)
{
    for (int i = 0; i < NODES; i++) {
        redisReply *rep = ask(&t->node[i], "CLUSTER KEYSLOT %s", key);
        long long slot = rep && rep->type == REDIS_REPLY_INTEGER
                             ? rep->integer
                             : -1;
        if (rep)
            freeReplyObject(rep);
        if (slot >= 0)
            return (int)slot;
    }
    th_fail(__FILE__, __LINE__, "no cluster node answers CLUSTER KEYSLOT");
}

int th_cluster_owner(th_cluster *t, int slot)
{
    for (int i = 0; i < NODES; i++) {
        range *m;
        int nm = slot_map(&t->node[i], &m);
        int port = owner_port(m, nm, slot);
        free(m);
        if (nm >= 0)
            return index_of(t, port);
    }
    return -1;
}

/* The index of the primary node[i] replicates, as it says itself; -1 if
 * it is none's replica (or does not answer). */
static int primary_of(th_cluster *t, int i)
{
    redisReply *rep = ask(&t->node[i], "INFO replication");
    const char *p = NULL;
    int port = 0;

    if (rep && rep->type == REDIS_REPLY_STRING &&
        strstr(rep->str, "role:slave"))
        p = strstr(rep->str, "master_port:");
    if (p)
        port = atoi(p + strlen("master_port:"));
    if (rep)
        freeReplyObject(rep);
    return index_of(t, port);
}

int th_cluster_failover(th_cluster *t, int replica, const char *how,
                        int64_t ms)
{
    th_redis *n = &t->node[replica];
    int64_t until = th_now_ms() + ms;
    int old = primary_of(t, replica), nm;
    range *m;

    if (old < 0)
        th_fail(__FILE__, __LINE__, "node[%d] (port %d) is not a replica of "
                "a node of the cluster", replica, n->port);
    /* the old primary's slots, as the replica knows them */
    nm = slot_map(n, &m);
    if (nm < 0)
        th_fail(__FILE__, __LINE__, "node[%d] (port %d) does not answer",
                replica, n->port);
    must_ok(how ? ask(n, "CLUSTER FAILOVER %s", how)
                : ask(n, "CLUSTER FAILOVER"),
            n, "CLUSTER FAILOVER");
    for (;;) {
        int done = is_primary(n);
        for (int k = 0; k < nm && done; k++)
            if (m[k].primary == t->node[old].port)
                done = map_says(t, m[k].first, m[k].last, replica);
        if (done || th_now_ms() > until) {
            free(m);
            return done;
        }
        th_sleep_ms(50);
    }
}

int th_cluster_owner_is(th_cluster *t, int slot, int i, int64_t ms)
{
    int64_t until = th_now_ms() + ms;

    for (;;) {
        if (is_primary(&t->node[i]) && map_says(t, slot, slot, i))
            return 1;
        if (th_now_ms() > until)
            return 0;
        th_sleep_ms(50);
    }
}

/* Moves every key of `slot` from src to dst, 100 at a time, as redis-cli
 * does: MIGRATE ... KEYS (DUMP/RESTORE: values and TTLs kept), REPLACE (a
 * key the test made on dst behind ASKING is overwritten). */
static void migrate_keys(th_redis *src, th_redis *dst, int slot)
{
    struct timeval tv = {10, 0}; /* longer than MIGRATE's own 5 s */
    redisContext *c = redisConnectWithTimeout("127.0.0.1", src->port, tv);
    int64_t until = th_now_ms() + 30000;
    char port[16];

    if (!c || c->err || redisSetTimeout(c, tv) != REDIS_OK)
        th_fail(__FILE__, __LINE__, "cannot reach the source, port %d",
                src->port);
    snprintf(port, sizeof(port), "%d", dst->port);
    for (;;) {
        redisReply *keys = redisCommand(c, "CLUSTER GETKEYSINSLOT %d 100",
                                        slot);
        if (!keys || keys->type != REDIS_REPLY_ARRAY)
            th_fail(__FILE__, __LINE__, "CLUSTER GETKEYSINSLOT on port %d: "
                    "%s", src->port,
                    keys && keys->type == REDIS_REPLY_ERROR ? keys->str
                                                            : "no answer");
        if (keys->elements == 0) {
            freeReplyObject(keys);
            break;
        }
        size_t argc = 8 + keys->elements;
        const char **argv = calloc(argc, sizeof(*argv));
        size_t *len = calloc(argc, sizeof(*len));
        const char *head[8] = {"MIGRATE", "127.0.0.1", port, "", "0",
                               "5000", "REPLACE", "KEYS"};
        if (!argv || !len)
            th_fail(__FILE__, __LINE__, "out of memory");
        for (size_t k = 0; k < argc; k++) {
            const redisReply *key = k >= 8 ? keys->element[k - 8] : NULL;
            argv[k] = key ? key->str : head[k];
            len[k] = key ? key->len : strlen(head[k]);
        }
        redisReply *rep = redisCommandArgv(c, (int)argc, argv, len);
        if (!rep || rep->type == REDIS_REPLY_ERROR)
            th_fail(__FILE__, __LINE__, "MIGRATE from port %d to %d: %s",
                    src->port, dst->port, rep ? rep->str : "no answer");
        freeReplyObject(rep);
        freeReplyObject(keys);
        free(argv);
        free(len);
        if (th_now_ms() > until)
            th_fail(__FILE__, __LINE__, "slot %d still has keys on port %d "
                    "after 30 s of MIGRATE", slot, src->port);
    }
    redisFree(c);
}

/* Ends a slot's move: CLUSTER SETSLOT slot NODE on the target first (it
 * bumps its config epoch: the new owner wins everywhere), then the
 * source, then every other live primary, as redis-cli does. */
static void end_move(th_cluster *t, int slot, int from, int to)
{
    char id[41];

    node_id(&t->node[to], id);
    must_ok(ask(&t->node[to], "CLUSTER SETSLOT %d NODE %s", slot, id),
            &t->node[to], "CLUSTER SETSLOT NODE (target)");
    must_ok(ask(&t->node[from], "CLUSTER SETSLOT %d NODE %s", slot, id),
            &t->node[from], "CLUSTER SETSLOT NODE (source)");
    for (int i = 0; i < NODES; i++)
        if (i != from && i != to && is_primary(&t->node[i]))
            must_ok(ask(&t->node[i], "CLUSTER SETSLOT %d NODE %s", slot, id),
                    &t->node[i], "CLUSTER SETSLOT NODE");
}

int th_cluster_move_slot(th_cluster *t, int slot, int to, int stage)
{
    int64_t until;
    char src_id[41], dst_id[41];
    /* until stage 3 the source is still the owner in every map: a call
     * that continues an earlier one finds it the same way */
    int from = th_cluster_owner(t, slot);
    th_redis *src, *dst = &t->node[to];

    if (from < 0)
        th_fail(__FILE__, __LINE__, "slot %d has no owner", slot);
    if (from == to)
        th_fail(__FILE__, __LINE__, "node[%d] already owns slot %d", to,
                slot);
    if (!is_primary(dst))
        th_fail(__FILE__, __LINE__, "node[%d] (port %d) is not a primary",
                to, dst->port);
    src = &t->node[from];
    node_id(src, src_id);
    node_id(dst, dst_id);
    /* stage 1, which may run again: the target importing first, so that
     * a key the source sends on with ASK is taken there */
    must_ok(ask(dst, "CLUSTER SETSLOT %d IMPORTING %s", slot, src_id), dst,
            "CLUSTER SETSLOT IMPORTING");
    must_ok(ask(src, "CLUSTER SETSLOT %d MIGRATING %s", slot, dst_id), src,
            "CLUSTER SETSLOT MIGRATING");
    if (stage >= 2)
        migrate_keys(src, dst, slot);
    if (stage < 3)
        return from;
    end_move(t, slot, from, to);
    until = th_now_ms() + 30000;
    while (!map_says(t, slot, slot, to)) {
        if (th_now_ms() > until)
            th_fail(__FILE__, __LINE__, "the nodes do not agree that "
                    "node[%d] owns slot %d after 30 s", to, slot);
        th_sleep_ms(50);
    }
    return from;
}
