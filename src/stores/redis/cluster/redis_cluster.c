/* SPDX-License-Identifier: MIT */
/*
 * redis_cluster.c -- the slot map of a Redis Cluster and the routing of
 * commands by it (see redis_cluster.h).
 *
 * Nodes are kept in the order they became known and never forgotten
 * while the store is open (an index stays valid): the seeds first, then
 * every address a map or a redirection named. Each has one pipelined
 * command connection, made at its first command. The map is the owner's
 * index per slot; a slot nobody was known to own is NONE until the
 * first map, and keeps its last owner when a map leaves it out (a
 * command there then meets MOVED or CLUSTERDOWN, which says more than a
 * hole would).
 */
#include "redis_cluster.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NONE 0xFFFFu
#define NODES_MAX 1024 /* addresses remembered at most */
#define CLUSTER_PORT 6379
#define TRYAGAIN_MS 10 /* the first pause after TRYAGAIN; doubles */

typedef struct rnode {
    char host[256];
    int port;
    char where[300]; /* "redis-cluster 127.0.0.1:7000" */
    dlock__rconn_target t;
    dlock__rconn *conn;
} rnode;

struct dlock__rcluster {
    pthread_mutex_t mu;
    const dlock__redis_config *cfg;
    const char *const *scripts;
    int nscripts;
    rnode **nodes;
    int nnodes, cap, nseeds;
    uint64_t gen;
    uint16_t owner[DLOCK__RCLUSTER_SLOTS];
    uint64_t sgen[DLOCK__RCLUSTER_SLOTS];
};

/* ------------------------------------------------------------------------ */
/* Slots                                                                    */
/* ------------------------------------------------------------------------ */

/* CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the hash of
 * the Redis Cluster specification, bit by bit. */
static uint16_t crc16(const unsigned char *p, size_t len)
{
    uint16_t crc = 0;

    for (size_t i = 0; i < len; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = crc & 0x8000 ? (uint16_t)((crc << 1) ^ 0x1021)
                               : (uint16_t)(crc << 1);
    }
    return crc;
}

unsigned dlock__rcluster_slot(const char *key, size_t len)
{
    const char *open = memchr(key, '{', len);

    if (open) {
        size_t from = (size_t)(open - key) + 1;
        const char *close = memchr(open + 1, '}', len - from);
        if (close && close > open + 1)
            return crc16((const unsigned char *)open + 1,
                         (size_t)(close - open - 1)) %
                   DLOCK__RCLUSTER_SLOTS;
    }
    return crc16((const unsigned char *)key, len) % DLOCK__RCLUSTER_SLOTS;
}

/* ------------------------------------------------------------------------ */
/* Nodes                                                                    */
/* ------------------------------------------------------------------------ */

/* The index of the node at host:port, added if new (mu held); -1 when
 * out of memory or too many. */
static int node_at(dlock__rcluster *cl, const char *host, size_t hlen,
                   int port)
{
    rnode *n;

    if (hlen == 0 || hlen >= sizeof(n->host) || port <= 0 || port > 65535)
        return -1;
    for (int i = 0; i < cl->nnodes; i++)
        if (cl->nodes[i]->port == port && strlen(cl->nodes[i]->host) == hlen &&
            !memcmp(cl->nodes[i]->host, host, hlen))
            return i;
    if (cl->nnodes == NODES_MAX)
        return -1;
    if (cl->nnodes == cl->cap) {
        int cap = cl->cap ? cl->cap * 2 : 8;
        rnode **grown = realloc(cl->nodes, (size_t)cap * sizeof(*grown));
        if (!grown)
            return -1;
        cl->nodes = grown;
        cl->cap = cap;
    }
    if (!(n = calloc(1, sizeof(*n))))
        return -1;
    memcpy(n->host, host, hlen);
    n->port = port;
    snprintf(n->where, sizeof(n->where),
             strchr(n->host, ':') ? "redis-cluster [%s]:%d"
                                  : "redis-cluster %s:%d",
             n->host, n->port);
    n->t.host = n->host;
    n->t.port = n->port;
    n->t.cfg = cl->cfg;
    n->t.where = n->where;
    n->t.scripts = cl->scripts;
    n->t.nscripts = cl->nscripts;
    if (dlock__rconn_new(&n->conn, &n->t) != DLOCK_OK) {
        free(n);
        return -1;
    }
    cl->nodes[cl->nnodes] = n;
    return cl->nnodes++;
}

static dlock__rconn *conn_of(dlock__rcluster *cl, int id)
{
    dlock__rconn *c;

    pthread_mutex_lock(&cl->mu);
    c = cl->nodes[id]->conn;
    pthread_mutex_unlock(&cl->mu);
    return c;
}

/* "host:port" at the end of a redirection ("MOVED 3999 127.0.0.1:6381"):
 * the node's index (added if new), or -1. The slot into *slot. mu held. */
static int redirected_to(dlock__rcluster *cl, const char *err, int *slot)
{
    const char *sp = strchr(err, ' '), *addr, *colon;
    char *end;
    long s, port;

    if (!sp)
        return -1;
    s = strtol(sp + 1, &end, 10);
    if (end == sp + 1 || *end != ' ' || s < 0 || s >= DLOCK__RCLUSTER_SLOTS)
        return -1;
    addr = end + 1;
    colon = strrchr(addr, ':');
    if (!colon)
        return -1;
    port = strtol(colon + 1, &end, 10);
    if (end == colon + 1 || port <= 0 || port > 65535)
        return -1;
    *slot = (int)s;
    return node_at(cl, addr, (size_t)(colon - addr), (int)port);
}

/* ------------------------------------------------------------------------ */
/* The map                                                                  */
/* ------------------------------------------------------------------------ */

/* Takes a map: owner per slot (NONE: not in the map). A slot whose owner
 * changes from one node to another gets the next generation. mu held. */
static void apply(dlock__rcluster *cl, const uint16_t *fresh)
{
    int changed = 0;

    for (unsigned s = 0; s < DLOCK__RCLUSTER_SLOTS; s++) {
        if (fresh[s] == NONE || fresh[s] == cl->owner[s])
            continue;
        if (cl->owner[s] != NONE) {
            cl->sgen[s] = cl->gen + 1;
            changed = 1;
        }
        cl->owner[s] = fresh[s];
    }
    if (changed)
        cl->gen++;
}

/* Reads a CLUSTER SLOTS answer of node `from` into fresh[] (the nodes it
 * names added). DLOCK_OK or DLOCK_EPROTO. mu held. */
static int parse_slots(dlock__rcluster *cl, int from, const redisReply *r,
                       uint16_t *fresh)
{
    if (r->type != REDIS_REPLY_ARRAY || r->elements == 0)
        return dlock__err(DLOCK_EPROTO, "%s: no slot map in the answer to "
                                        "CLUSTER SLOTS",
                          cl->nodes[from]->where);
    for (size_t i = 0; i < r->elements; i++) {
        const redisReply *e = r->element[i], *m;
        if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
            e->element[0]->type != REDIS_REPLY_INTEGER ||
            e->element[1]->type != REDIS_REPLY_INTEGER ||
            (m = e->element[2])->type != REDIS_REPLY_ARRAY ||
            m->elements < 2 || m->element[0]->type != REDIS_REPLY_STRING ||
            m->element[1]->type != REDIS_REPLY_INTEGER)
            return dlock__err(DLOCK_EPROTO, "%s: unexpected answer to "
                                            "CLUSTER SLOTS",
                              cl->nodes[from]->where);
        long long lo = e->element[0]->integer, hi = e->element[1]->integer;
        const char *h = m->element[0]->str;
        size_t hl = m->element[0]->len;
        if (hl == 0 || !strcmp(h, "?")) { /* "the address you asked" */
            h = cl->nodes[from]->host;
            hl = strlen(h);
        }
        int id = node_at(cl, h, hl, (int)m->element[1]->integer);
        if (lo < 0 || hi >= DLOCK__RCLUSTER_SLOTS || lo > hi || id < 0)
            return dlock__err(DLOCK_EPROTO, "%s: unexpected answer to "
                                            "CLUSTER SLOTS",
                              cl->nodes[from]->where);
        for (long long s = lo; s <= hi; s++)
            fresh[s] = (uint16_t)id;
    }
    return DLOCK_OK;
}

/* Asks node `id` for the map and takes it. */
static int refresh_from(dlock__rcluster *cl, int id, int64_t deadline)
{
    uint16_t *fresh = malloc(sizeof(cl->owner));
    redisReply *r;
    rcmd c;
    int rc;

    if (!fresh)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    rcmd_plain(&c);
    rcmd_str(&c, "CLUSTER");
    rcmd_str(&c, "SLOTS");
    rc = dlock__rconn_run(conn_of(cl, id), &c, 1, &r, deadline);
    if (rc == DLOCK_OK) {
        pthread_mutex_lock(&cl->mu);
        if (r->type == REDIS_REPLY_ERROR) {
            rc = !strncmp(r->str, "ERR This instance has cluster support "
                                  "disabled",
                          44)
                     ? dlock__err(DLOCK_EINVAL,
                                  "%s is not a cluster node (cluster-enabled "
                                  "no): use redis://",
                                  cl->nodes[id]->where)
                     : dlock__redis_server_error(cl->nodes[id]->where,
                                                 cl->cfg->password, r->str,
                                                 NULL);
        } else {
            for (unsigned s = 0; s < DLOCK__RCLUSTER_SLOTS; s++)
                fresh[s] = NONE;
            rc = parse_slots(cl, id, r, fresh);
            if (rc == DLOCK_OK)
                apply(cl, fresh);
        }
        pthread_mutex_unlock(&cl->mu);
        freeReplyObject(r);
    }
    free(fresh);
    return rc;
}

/* Asks for the map: node `first` (-1: none), then every primary of the
 * map, then the seeds, each once, leaving out node `skip` (-1: none)
 * unless nobody else answers. The first answer is taken. */
static int refresh(dlock__rcluster *cl, int first, int skip, int64_t deadline)
{
    int rc = DLOCK_ECONN, tried = 0;
    char *asked;
    int n;

    pthread_mutex_lock(&cl->mu);
    n = cl->nnodes;
    pthread_mutex_unlock(&cl->mu);
    if (!(asked = calloc((size_t)n + 1, 1)))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    for (int round = 0; round < 4 && rc != DLOCK_OK; round++) {
        for (int k = 0; k < n && rc != DLOCK_OK; k++) {
            int id = -1;
            if (round == 0 && k == 0)
                id = first;
            else if (round == 1) {
                pthread_mutex_lock(&cl->mu);
                for (unsigned s = 0; s < DLOCK__RCLUSTER_SLOTS; s++)
                    if (cl->owner[s] == (uint16_t)k) {
                        id = k;
                        break;
                    }
                pthread_mutex_unlock(&cl->mu);
            } else if (round == 2 && k < cl->nseeds) {
                id = k;
            } else if (round == 3 && tried == 0) {
                id = skip; /* nobody else: the one that failed */
            }
            if (id < 0 || id >= n || asked[id] || (id == skip && round < 3))
                continue;
            if (dlock__now_ms() >= deadline)
                break;
            asked[id] = 1;
            tried++;
            rc = refresh_from(cl, id, deadline);
            if (rc == DLOCK_EINVAL || rc == DLOCK_EAUTH)
                break; /* not a cluster, or refused: the same elsewhere */
        }
        if (rc == DLOCK_EINVAL || rc == DLOCK_EAUTH)
            break;
    }
    free(asked);
    if (tried == 0 && rc != DLOCK_OK)
        rc = dlock__err(DLOCK_ECONN, "redis-cluster: no node to ask for the "
                                     "slot map in time");
    return rc;
}

/* The node that owns `slot` in the map now, or NONE. */
static unsigned owner_of(dlock__rcluster *cl, unsigned slot)
{
    unsigned o;

    pthread_mutex_lock(&cl->mu);
    o = cl->owner[slot];
    pthread_mutex_unlock(&cl->mu);
    return o;
}

int dlock__rcluster_owner(dlock__rcluster *cl, unsigned slot, int *id,
                          const dlock__rconn_target **t, int64_t deadline)
{
    unsigned o = owner_of(cl, slot);

    if (o == NONE) {
        int rc = refresh(cl, -1, -1, deadline);
        if (rc)
            return rc;
        o = owner_of(cl, slot);
        if (o == NONE)
            return dlock__err(DLOCK_ECONN, "redis-cluster: no node serves "
                                           "slot %u",
                              slot);
    }
    *id = (int)o;
    if (t) {
        pthread_mutex_lock(&cl->mu);
        *t = &cl->nodes[o]->t;
        pthread_mutex_unlock(&cl->mu);
    }
    return DLOCK_OK;
}

int dlock__rcluster_owner_now(dlock__rcluster *cl, unsigned slot)
{
    unsigned o = owner_of(cl, slot);

    return o == NONE ? -1 : (int)o;
}

int dlock__rcluster_refresh(dlock__rcluster *cl, int64_t deadline)
{
    return refresh(cl, -1, -1, deadline);
}

int dlock__rcluster_moved(dlock__rcluster *cl, const char *err)
{
    int slot = -1, id;

    if (strncmp(err, "MOVED ", 6) != 0)
        return -1;
    pthread_mutex_lock(&cl->mu);
    id = redirected_to(cl, err, &slot);
    if (id >= 0 && cl->owner[slot] != (uint16_t)id) {
        if (cl->owner[slot] != NONE) {
            cl->sgen[slot] = ++cl->gen;
        }
        cl->owner[slot] = (uint16_t)id;
    }
    pthread_mutex_unlock(&cl->mu);
    return id >= 0 ? slot : -1;
}

uint64_t dlock__rcluster_gen(dlock__rcluster *cl)
{
    uint64_t g;

    pthread_mutex_lock(&cl->mu);
    g = cl->gen;
    pthread_mutex_unlock(&cl->mu);
    return g;
}

uint64_t dlock__rcluster_slot_gen(dlock__rcluster *cl, unsigned slot)
{
    uint64_t g;

    pthread_mutex_lock(&cl->mu);
    g = cl->sgen[slot];
    pthread_mutex_unlock(&cl->mu);
    return g;
}

/* ------------------------------------------------------------------------ */
/* Commands                                                                 */
/* ------------------------------------------------------------------------ */

/* cmds behind ASKING, in one write (nothing of another caller can come
 * between them on the pipelined connection). */
static int run_asking(dlock__rconn *conn, rcmd *cmds, int n,
                      redisReply **replies, int64_t deadline)
{
    rcmd *all = malloc(((size_t)n + 1) * sizeof(*all));
    redisReply **rep = malloc(((size_t)n + 1) * sizeof(*rep));
    int rc;

    if (!all || !rep) {
        free(all);
        free(rep);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    rcmd_plain(&all[0]);
    rcmd_str(&all[0], "ASKING");
    memcpy(all + 1, cmds, (size_t)n * sizeof(*cmds));
    rc = dlock__rconn_run(conn, all, n + 1, rep, deadline);
    if (rc == DLOCK_OK) {
        freeReplyObject(rep[0]);
        memcpy(replies, rep + 1, (size_t)n * sizeof(*rep));
    }
    free(all);
    free(rep);
    return rc;
}

static void pause_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};

    while (ms > 0 && nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

int dlock__rcluster_run(dlock__rcluster *cl, unsigned slot, rcmd *cmds,
                        int n, redisReply **replies, int64_t deadline)
{
    int ask = -1, looked = 0;
    char last[160] = "";

    for (int hops = 0;; hops++) {
        int id = 0, rc, kind = 0, at = -1;

        if (hops > DLOCK__RCLUSTER_REDIRECTS)
            return dlock__err(DLOCK_ECONN, "redis-cluster: slot %u: "
                                           "redirected %d times (last: "
                                           "%.100s)",
                              slot, DLOCK__RCLUSTER_REDIRECTS, last);
        if (ask >= 0) {
            id = ask;
            rc = run_asking(conn_of(cl, id), cmds, n, replies, deadline);
        } else {
            rc = dlock__rcluster_owner(cl, slot, &id, NULL, deadline);
            if (rc)
                return rc;
            rc = dlock__rconn_run(conn_of(cl, id), cmds, n, replies,
                                  deadline);
        }
        ask = -1;
        if (rc == DLOCK_ECONN && !looked && dlock__now_ms() < deadline) {
            /* the node may be gone for good (its replica took over):
             * one look at the map, asked of the others */
            char why[512];
            int o = -1;
            snprintf(why, sizeof(why), "%s", dlock_errmsg());
            looked = 1;
            if (refresh(cl, -1, id, deadline) == DLOCK_OK &&
                dlock__rcluster_owner(cl, slot, &o, NULL, deadline) ==
                    DLOCK_OK &&
                o != id)
                continue;
            return dlock__err(DLOCK_ECONN, "%s", why);
        }
        if (rc)
            return rc;
        for (int i = 0; i < n && !kind; i++) {
            const redisReply *r = replies[i];
            if (r->type != REDIS_REPLY_ERROR)
                continue;
            if (!strncmp(r->str, "MOVED ", 6))
                kind = 1;
            else if (!strncmp(r->str, "ASK ", 4))
                kind = 2;
            else if (!strncmp(r->str, "TRYAGAIN", 8))
                kind = 3;
            if (kind)
                snprintf(last, sizeof(last), "%s", r->str);
        }
        if (!kind)
            return DLOCK_OK;
        /* nothing ran where the key is not: send it all again */
        for (int i = 0; i < n; i++)
            freeReplyObject(replies[i]);
        if (kind == 1) {
            int s = dlock__rcluster_moved(cl, last);
            pthread_mutex_lock(&cl->mu);
            at = s >= 0 ? (int)cl->owner[s] : -1;
            pthread_mutex_unlock(&cl->mu);
            /* the rest of the map has likely moved too (a failover, a
             * reshard): ask the node it names */
            (void)refresh(cl, at, -1, deadline);
        } else if (kind == 2) {
            int s;
            pthread_mutex_lock(&cl->mu);
            ask = redirected_to(cl, last, &s);
            pthread_mutex_unlock(&cl->mu);
            if (ask < 0)
                return dlock__err(DLOCK_EPROTO, "redis-cluster: a redirection "
                                                "to nowhere: %.100s",
                                  last);
        } else {
            /* a slot's keys half migrated: they will be on one side soon */
            int64_t ms = (int64_t)TRYAGAIN_MS << hops;
            if (ms > deadline - dlock__now_ms())
                ms = deadline - dlock__now_ms();
            pause_ms(ms);
        }
    }
}

int dlock__rcluster_run_node(dlock__rcluster *cl, int id, rcmd *cmds, int n,
                             redisReply **replies, int64_t deadline)
{
    return dlock__rconn_run(conn_of(cl, id), cmds, n, replies, deadline);
}

int dlock__rcluster_primaries(dlock__rcluster *cl, int *ids, int cap,
                              int64_t deadline)
{
    int n = 0, holes = 0;

    pthread_mutex_lock(&cl->mu);
    for (unsigned s = 0; s < DLOCK__RCLUSTER_SLOTS; s++)
        holes |= cl->owner[s] == NONE;
    pthread_mutex_unlock(&cl->mu);
    if (holes)
        (void)refresh(cl, -1, -1, deadline);
    pthread_mutex_lock(&cl->mu);
    for (unsigned s = 0; s < DLOCK__RCLUSTER_SLOTS; s++) {
        int o = cl->owner[s], seen = 0;
        if (o == (int)NONE)
            continue;
        for (int i = 0; i < n && !seen; i++)
            seen = ids[i] == o;
        if (!seen && n < cap)
            ids[n++] = o; /* in the order of the lowest slot each owns */
    }
    pthread_mutex_unlock(&cl->mu);
    return n;
}

/* ------------------------------------------------------------------------ */
/* Open and free                                                            */
/* ------------------------------------------------------------------------ */

int dlock__rcluster_open(dlock__rcluster **out, const dlock__uri *u,
                         const dlock__redis_config *cfg,
                         const char *const *scripts, int nscripts,
                         int64_t deadline)
{
    dlock__rcluster *cl;
    int rc = DLOCK_OK;

    *out = NULL;
    if (u->nhosts < 1)
        return dlock__err(DLOCK_EINVAL, "redis-cluster:// needs at least one "
                                        "node: redis-cluster://host:port[,"
                                        "host:port...]");
    if (!(cl = calloc(1, sizeof(*cl))))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    pthread_mutex_init(&cl->mu, NULL);
    cl->cfg = cfg;
    cl->scripts = scripts;
    cl->nscripts = nscripts;
    cl->gen = 1;
    for (unsigned s = 0; s < DLOCK__RCLUSTER_SLOTS; s++) {
        cl->owner[s] = NONE;
        cl->sgen[s] = 1;
    }
    for (size_t i = 0; i < u->nhosts && rc == DLOCK_OK; i++) {
        const char *h = u->hosts[i].host;
        if (node_at(cl, h, strlen(h),
                    u->hosts[i].port ? u->hosts[i].port : CLUSTER_PORT) < 0)
            rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    cl->nseeds = cl->nnodes;
    if (rc == DLOCK_OK)
        rc = refresh(cl, -1, -1, deadline);
    if (rc) {
        dlock__rcluster_free(cl);
        return rc;
    }
    *out = cl;
    return DLOCK_OK;
}

void dlock__rcluster_free(dlock__rcluster *cl)
{
    if (!cl)
        return;
    for (int i = 0; i < cl->nnodes; i++) {
        dlock__rconn_free(cl->nodes[i]->conn);
        free(cl->nodes[i]);
    }
    free(cl->nodes);
    pthread_mutex_destroy(&cl->mu);
    free(cl);
}
