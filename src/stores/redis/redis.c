/* SPDX-License-Identifier: MIT */
/*
 * redis.c -- the Redis store (redis:// and unix://), over hiredis.
 *
 * One key per lock NAME with prefix P (default "dlock:"), P{NAME}: the
 * holder's record, then the wait queue, one line per waiter, in one
 * string whose PEXPIRE is the holder's lease:
 *     OWNER TOKEN ACQUIRED_MS DESCRIPTION
 *     CLIENTID:TID:SEQ TTL DESCRIPTION        (one per waiter, in order)
 * A release that frees the lock leaves a tombstone, "- TOKEN" ("- TOKEN
 * N" after a semaphore of N, for inspection only), expiring
 * an hour after the token's time on the server's clock (the last token,
 * for the next fresh hold's; see "Fencing tokens" in docs/design.md).
 * Channel Pc:CLIENTID, one per client: "g SEQ TOKEN", the lock handed to
 * waiter SEQ of that client.
 * A name may hold any bytes: keys are sent binary-safe, and the key has
 * the Redis Cluster hash tag {NAME}.
 *
 * Every state change is one Lua script, so it is atomic:
 *  - try: take a free lock (token: the server clock in µs, above the
 *    tombstone's), adopt one already ours (a reply we never saw), or,
 *    for a waiter, append its line once and answer the lease left;
 *  - queue: a waiter's first try when the client knows the lock is held:
 *    APPEND its line without reading (one command), and fall back to a
 *    fresh take if the key turns out free;
 *  - release: compare the owner; hand the lock to the first waiter whose
 *    client still listens (token + 1, its lease, one message to it),
 *    else leave the tombstone;
 *  - abandon: a wait that ends without the lock removes its line, or
 *    keeps the lock if it was handed over meanwhile;
 *  - extend / extend many: compare the owner, PEXPIRE.
 * The protocol and its failure cases: "Hand-over (Redis)" in
 * docs/design.md. Shared (read) holds and semaphores give the key other
 * forms ("S ...", "N ..."): redis_rw.c, whose scripts a writer's script
 * hands such a key to (it answers 2); redis_rw.c also reads every form
 * for dlock_inspect().
 *
 * Connections: the pipelined command connection (redis_conn.c) and, once
 * something waits, one subscriber connection per client, subscribed to
 * the client's channel only. It is read by a waiting thread (or the
 * client's background thread while nobody waits); the socket is
 * non-blocking so that either may read it.
 */
#include "redis_int.h"
#include "redis_scripts.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_PORT 6379
#define BATCH 256            /* leases per extend-many script */
/* A value this long before a waiter's blindly appended line is a
 * holder's record (its owner alone is 34 bytes); a tombstone is at most
 * 28 bytes ("- TOKEN", and a semaphore's " N") */
#define RECORD_MIN 29

/* ------------------------------------------------------------------------ */
/* State                                                                    */
/* ------------------------------------------------------------------------ */

static int try_acquire(redis_store *rs, dlock__lease *l, int64_t deadline,
                       int *waited);

/* ?min_replicas=N: WAIT until N replicas have the connection's writes
 * (the acquire's own among them). DLOCK_OK, or DLOCK_ECONN saying how many
 * acknowledged (replicas[0] = N of a pipeline's WAIT reply r). */
static int replicas_answer(const redis_store *rs, const redisReply *r)
{
    if (r->type == REDIS_REPLY_INTEGER && r->integer >= rs->min_replicas)
        return DLOCK_OK;
    if (r->type == REDIS_REPLY_ERROR)
        return server_error(rs, r->str, NULL);
    return dlock__err(DLOCK_ECONN,
                      "%s: only %lld of %ld replicas acknowledged within %lld "
                      "ms (min_replicas)",
                      rs->where,
                      r->type == REDIS_REPLY_INTEGER ? (long long)r->integer
                                                     : 0LL,
                      rs->min_replicas, (long long)rs->replica_timeout_ms);
}

static void wait_cmd(const redis_store *rs, rcmd *c, char *n, char *ms)
{
    snprintf(n, 24, "%ld", rs->min_replicas);
    snprintf(ms, 24, "%lld", (long long)rs->replica_timeout_ms);
    rcmd_plain(c);
    rcmd_str(c, "WAIT");
    rcmd_str(c, n);
    rcmd_str(c, ms);
}

static int wait_replicas(redis_store *rs, const char *key, size_t kl)
{
    char n[24], ms[24];
    int64_t deadline = dlock__now_ms() + rs->replica_timeout_ms +
                       rs->cfg.timeout_ms;
    redisReply *r;
    rcmd c;
    int rc;

    wait_cmd(rs, &c, n, ms);
    rc = dlock__redis_run(rs, key, kl, &c, 1, &r, deadline);
    if (rc == DLOCK_OK) {
        rc = replicas_answer(rs, r);
        freeReplyObject(r);
    }
    return rc;
}

/* After an acquire: on enough replicas (rc, the answer of its WAIT), or
 * let go of it. */
static int replicated(redis_store *rs, dlock__lease *l, int rc)
{
    if (rc) {
        /* not on enough replicas: let go of it (the guarded release),
         * keeping the reason */
        char why[512];
        snprintf(why, sizeof(why), "%s", dlock_errmsg());
        (void)dlock__redis_release(rs, l,
                                   dlock__now_ms() + rs->cfg.timeout_ms);
        rc = dlock__err(rc, "lock '%.100s': %s", l->name, why);
    }
    return rc;
}

static int redis_acquire(void *st, dlock__lease *l, int64_t deadline)
{
    redis_store *rs = st;
    redis_lease *rl = l->priv;
    int rc;

    /* the answer of a WAIT pipelined with the try (codes are <= 0) */
    int waited = 1;

    char key[KEY_MAX];
    size_t kl = lock_key(rs, l->name, l->name_len, key);

    rl->gen = topo_gen(rs, key, kl);
    /* woken while it waits: a read may confirm a hand-over (a message
     * decides nothing, redis_confirm.c), else the try */
    rc = dlock__redis_confirm(rs, l, deadline);
    if (rc == DLOCK__REDIS_UNDECIDED)
        rc = try_acquire(rs, l, deadline, &waited);
    if (rs->cluster && rc != DLOCK_EBUSY && !l->waiting)
        dlock__redis_disarm(rs, l, rc == DLOCK_OK); /* no wait follows */
    if (rc == DLOCK_OK && rs->min_replicas > 0)
        rc = replicated(rs, l,
                        waited <= 0 ? waited : wait_replicas(rs, key, kl));
    return rc;
}

static int try_acquire(redis_store *rs, dlock__lease *l, int64_t deadline,
                       int *waited)
{
    redis_lease *rl = l->priv;
    char key[KEY_MAX], owner[80], ttl[24], line[LINE_MAX], rest[200];
    size_t kl = lock_key(rs, l->name, l->name_len, key);
    size_t ol = owner_sp(l, owner, sizeof(owner)), id_len = 0, ll = 0;
    int64_t now = dlock__now_ms(), hint = hint_get(l);
    /* the record after its token: this client's clock, description */
    int rl_len = snprintf(rest, sizeof(rest), " %lld %s",
                          (long long)wall_ms(), l->desc);
    int queue = l->waiting || (l->may_wait && dlock__redis_listening(rs, l));
    int blind = queue && !l->waiting && hint > now;
    redisReply *r, *wr[2];
    rcmd c, wc[2];
    char wn[24], wms[24];
    int rc;

    if (l->kind != DLOCK__WRITE)
        return dlock__redis_rw_acquire(rs, l, queue, deadline);
    snprintf(ttl, sizeof(ttl), "%lld", (long long)l->ttl_ms);
    if (queue) {
        ll = queue_line(l, line, sizeof(line), &id_len);
        if (!ll)
            return dlock__err(DLOCK_EINVAL, "lock '%.100s': description too "
                                            "long",
                              l->name);
    }
    if (queue)
        rl->queued = 1;
    if (blind) {
        /* APPEND alone (no script): behind the holder the client knows
         * of. A value shorter than a record before our line means the
         * lock was free after all (the append made the key, or met a
         * tombstone) or is not dlock's: the try below sorts that out. */
        rcmd_plain(&c);
        rcmd_str(&c, "APPEND");
        rcmd_arg(&c, key, kl);
        rcmd_arg(&c, line, ll);
        rc = dlock__redis_run(rs, key, kl, &c, 1, &r, deadline);
        if (rc)
            return dlock__redis_undo_lost_try(rs, l, rc);
        if (r->type == REDIS_REPLY_ERROR) {
            rc = server_error(rs, r->str, l->name);
            freeReplyObject(r);
            return rc;
        }
        long long before = r->type == REDIS_REPLY_INTEGER
                               ? r->integer - (long long)ll
                               : 0;
        freeReplyObject(r);
        if (before >= RECORD_MIN) {
            l->retry_ms = hint - now;
            l->armed = 1;
            return DLOCK_EBUSY;
        }
    }
    rcmd_evalsha(&c, S_TRY, 1);
    rcmd_arg(&c, key, kl);
    rcmd_arg(&c, owner, ol);
    rcmd_str(&c, ttl);
    rcmd_arg(&c, rest, rl_len > 0 && (size_t)rl_len < sizeof(rest)
                           ? (size_t)rl_len
                           : strlen(rest));
    rcmd_arg(&c, line, ll);
    rcmd_arg(&c, line, id_len);

    if (rs->min_replicas > 0) {
        /* min_replicas: the WAIT in the same round trip (a try that
         * does not take the lock ignores its answer) */
        wc[0] = c;
        wait_cmd(rs, &wc[1], wn, wms);
        rc = dlock__redis_run(rs, key, kl, wc, 2, wr,
                              deadline + rs->replica_timeout_ms);
        if (rc)
            return dlock__redis_undo_lost_try(rs, l, rc);
        r = wr[0];
        *waited = replicas_answer(rs, wr[1]);
        freeReplyObject(wr[1]);
    } else {
        rc = dlock__redis_run(rs, key, kl, &c, 1, &r, deadline);
        if (rc)
            return dlock__redis_undo_lost_try(rs, l, rc);
    }
    if (r->type == REDIS_REPLY_ERROR) {
        rc = server_error(rs, r->str, l->name);
    } else if (r->type == REDIS_REPLY_INTEGER && r->integer == 2) {
        /* the key holds readers or a semaphore: the shared scripts */
        freeReplyObject(r);
        *waited = 1; /* that WAIT came before the shared try's write */
        return dlock__redis_rw_acquire(rs, l, queue, deadline);
    } else {
        rc = dlock__redis_try_answer(rs, l, r, now);
    }
    freeReplyObject(r);
    return rc;
}

/* The owner a renewal compares: "OWNER " -- with a topology "OWNER
 * TOKEN ", so that after a failover a replicated record of an earlier hold
 * of the same thread does not pass for this one. */
static size_t extend_owner(const redis_store *rs, const dlock__lease *l,
                           char *out, size_t cap)
{
    int n;

    if (!rs->topo && !rs->cluster)
        return owner_sp(l, out, cap);
    n = snprintf(out, cap, "%s %" PRIu64 " ", l->owner, l->token);
    return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* A shared hold or permit taken before the primary moved: its holder line
 * is not checked on the new primary (design.md), it is lost. */
static int stale_shared(const redis_store *rs, const dlock__lease *l)
{
    const redis_lease *rl = l->priv;
    char key[KEY_MAX];

    if ((!rs->topo && !rs->cluster) || l->kind == DLOCK__WRITE)
        return 0;
    return rl->gen <
           topo_gen(rs, key, lock_key(rs, l->name, l->name_len, key));
}

static int redis_extend(void *st, dlock__lease *l, int64_t ttl_ms,
                        int64_t deadline)
{
    redis_store *rs = st;
    char key[KEY_MAX], ttl[24], owner[120], wn[24], wms[24];
    size_t kl = lock_key(rs, l->name, l->name_len, key);
    size_t ol = extend_owner(rs, l, owner, sizeof(owner));
    redisReply *r[2] = {NULL, NULL};
    rcmd c[2];
    int rc, n = rs->min_replicas > 0 ? 2 : 1;

    if (stale_shared(rs, l))
        return dlock__err(DLOCK_ENOTHELD, "lock '%.100s': a shared hold of "
                                          "the primary before a failover",
                          l->name);
    if (l->kind != DLOCK__WRITE) {
        rc = dlock__redis_rw_extend(rs, l, ttl_ms, deadline);
        if (rc == DLOCK_OK && n == 2)
            rc = wait_replicas(rs, key, kl);
        return rc;
    }
    snprintf(ttl, sizeof(ttl), "%lld", (long long)ttl_ms);
    rcmd_evalsha(&c[0], S_EXTEND, 1);
    rcmd_arg(&c[0], key, kl);
    rcmd_arg(&c[0], owner, ol);
    rcmd_str(&c[0], ttl);
    if (n == 2) {
        wait_cmd(rs, &c[1], wn, wms);
        deadline += rs->replica_timeout_ms;
    }
    rc = dlock__redis_run(rs, key, kl, c, n, r, deadline);
    if (rc)
        return rc;
    if (n == 2) {
        int w = r[0]->type == REDIS_REPLY_INTEGER && r[0]->integer == 1
                    ? replicas_answer(rs, r[1])
                    : DLOCK_OK;
        freeReplyObject(r[1]);
        if (w) {
            /* renewed on the primary only: a failure, retried until the
             * lease's end declares the hold lost */
            freeReplyObject(r[0]);
            return w;
        }
    }
    if (r[0]->type == REDIS_REPLY_ERROR)
        rc = server_error(rs, r[0]->str, l->name);
    else if (r[0]->type != REDIS_REPLY_INTEGER)
        rc = dlock__err(DLOCK_EPROTO, "%s: unexpected answer to extend",
                        rs->where);
    else if (r[0]->integer != 1)
        rc = dlock__err(DLOCK_ENOTHELD, "lock '%.100s' is not ours in the "
                                        "store",
                        l->name);
    freeReplyObject(r[0]);
    return rc;
}

/* Leader election: the description of our exclusive hold, compared as
 * extend compares it. */
static int redis_proclaim(void *st, dlock__lease *l, const char *desc,
                          int64_t deadline)
{
    redis_store *rs = st;
    char key[KEY_MAX], owner[120];
    size_t kl = lock_key(rs, l->name, l->name_len, key);
    size_t ol = extend_owner(rs, l, owner, sizeof(owner));
    redisReply *r = NULL;
    rcmd c;
    int rc;

    rcmd_evalsha(&c, S_PROCLAIM, 1);
    rcmd_arg(&c, key, kl);
    rcmd_arg(&c, owner, ol);
    rcmd_str(&c, desc);
    rc = dlock__redis_ask(rs, key, kl, &c, l->name, &r, deadline);
    if (rc)
        return rc;
    if (r->type != REDIS_REPLY_INTEGER)
        rc = dlock__err(DLOCK_EPROTO, "%s: unexpected answer to proclaim",
                        rs->where);
    else if (r->integer != 1)
        rc = dlock__err(DLOCK_ENOTHELD, "lock '%.100s' is not ours in the "
                                        "store",
                        l->name);
    freeReplyObject(r);
    return rc;
}

/* Renews n leases with one script per BATCH of them, every script of the
 * call pipelined: one round trip for tens of thousands of holds. */
static int redis_extend_many(void *st, dlock__lease *const *ls,
                             const int64_t *ttls, int *rcs, size_t n,
                             int64_t deadline)
{
    redis_store *rs = st;
    size_t nb = (n + BATCH - 1) / BATCH;
    int waits = rs->min_replicas > 0; /* WAIT after the scripts */
    rcmd *cmds = calloc(nb + 1, sizeof(*cmds));
    redisReply **replies = calloc(nb + 1, sizeof(*replies));
    char wn[24], wms[24];
    const char **argv = malloc((n * 3 + nb * 4) * sizeof(*argv));
    size_t *lens = malloc((n * 3 + nb * 4) * sizeof(*lens));
    char *text = malloc(n * (KEY_MAX + 80 + 24)); /* key, owner, ttl */
    char(*nk)[8] = malloc((nb ? nb : 1) * sizeof(*nk)); /* key counts */
    int rc = DLOCK_OK;

    if (rs->cluster) {
        /* a script's keys must share a slot, and each lock has its own
         * channel: one renewal per lease (redis_extend, routed) */
        for (size_t i = 0; i < n; i++)
            rcs[i] = redis_extend(st, ls[i], ttls[i], deadline);
        goto out;
    }

    if (!cmds || !replies || !argv || !lens || !text || !nk) {
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
        goto out;
    }
    size_t a = 0, t = 0;
    for (size_t b = 0; b < nb; b++) {
        size_t first = b * BATCH, m = n - first < BATCH ? n - first : BATCH;
        rcmd *c = &cmds[b];
        int shared = 0; /* holder lines to renew: the shared script */
        for (size_t i = first; i < first + m; i++)
            shared |= ls[i]->kind != DLOCK__WRITE;
        a += rcmd_evalsha_ext(c, shared ? S_RW_EXTEND_MANY : S_EXTEND_MANY,
                              argv + a, lens + a, nk[b], sizeof(nk[b]), m);
        for (size_t i = first; i < first + m; i++) {
            argv[a] = text + t;
            lens[a] = lock_key(rs, ls[i]->name, ls[i]->name_len, text + t);
            t += lens[a++];
        }
        for (size_t i = first; i < first + m; i++) {
            argv[a] = text + t;
            if (ls[i]->kind == DLOCK__WRITE)
                lens[a] = extend_owner(rs, ls[i], text + t, 80);
            else if (stale_shared(rs, ls[i])) /* no holder line is "!" */
                lens[a] = (size_t)snprintf(text + t, 80, "+!");
            else /* "+OWNER": a holder line's */
                lens[a] = (size_t)snprintf(text + t, 80, "+%s",
                                           ls[i]->owner);
            t += lens[a++];
            argv[a] = text + t;
            lens[a] = (size_t)sprintf(text + t, "%lld", (long long)ttls[i]);
            t += lens[a++];
        }
        c->argc = (int)(3 + 3 * m);
        if (shared) {
            argv[a] = rs->chan_prefix;
            lens[a++] = strlen(rs->chan_prefix);
            c->argc++;
        }
    }
    if (waits) {
        wait_cmd(rs, &cmds[nb], wn, wms);
        deadline += rs->replica_timeout_ms;
    }
    rc = dlock__redis_run(rs, NULL, 0, cmds, (int)nb + waits, replies,
                          deadline);
    if (rc)
        goto out;
    int wrc = DLOCK_OK;
    char wmsg[256] = "";
    if (waits) {
        /* a lease renewed on the primary only is a failure (retried
         * until its end declares the hold lost); one not ours stays
         * not ours */
        wrc = replicas_answer(rs, replies[nb]);
        if (wrc)
            snprintf(wmsg, sizeof(wmsg), "%s", dlock_errmsg());
        freeReplyObject(replies[nb]);
    }
    for (size_t b = 0; b < nb; b++) {
        const redisReply *r = replies[b];
        size_t first = b * BATCH, m = n - first < BATCH ? n - first : BATCH;
        for (size_t i = 0; i < m; i++) {
            if (r->type == REDIS_REPLY_ERROR)
                rcs[first + i] = server_error(rs, r->str, ls[first + i]->name);
            else if (r->type != REDIS_REPLY_ARRAY || r->elements != m ||
                     r->element[i]->type != REDIS_REPLY_INTEGER)
                rcs[first + i] = dlock__err(DLOCK_EPROTO,
                                            "%s: unexpected answer to extend",
                                            rs->where);
            else
                rcs[first + i] = r->element[i]->integer == 1 ? wrc
                                                             : DLOCK_ENOTHELD;
        }
        freeReplyObject(replies[b]);
    }
    if (wrc)
        dlock__err(wrc, "%s", wmsg);
out:
    free(cmds);
    free(replies);
    free(argv);
    free(lens);
    free(text);
    free(nk);
    return rc;
}


/* ------------------------------------------------------------------------ */
/* Open and close                                                           */
/* ------------------------------------------------------------------------ */

static void redis_close(void *st)
{
    redis_store *rs = st;

    if (!rs)
        return;
    dlock__rconn_free(rs->conn);
    dlock__redis_sub_close(rs);
    dlock__rcluster_free(rs->cluster);
    for (int i = 0; i < NSCRIPTS; i++)
        free(rs->cscripts[i]);
    dlock__rtopo_free(rs->topo);
    if (rs->epfd >= 0)
        close(rs->epfd);
    pthread_mutex_destroy(&rs->sub_mu);
    pthread_cond_destroy(&rs->sub_cv);
    free(rs->host);
    free(rs->path);
    dlock__redis_config_free(&rs->cfg);
    free(rs);
}

/* ?min_replicas=N&replica_timeout=MS (after the timeout is known). */
static int parse_replicas(redis_store *rs, const dlock__uri *u)
{
    const char *n = dlock__uri_param(u, "min_replicas");
    const char *ms = dlock__uri_param(u, "replica_timeout");
    long long v;

    if (n) {
        if (dlock__parse_int(n, 100, &v) != 0)
            return dlock__err(DLOCK_EINVAL, "min_replicas must be 0 to 100");
        rs->min_replicas = (long)v;
    }
    rs->replica_timeout_ms = rs->cfg.timeout_ms / 4;
    if (ms) {
        if (dlock__parse_int(ms, 3600000, &v) != 0 || v < 1)
            return dlock__err(DLOCK_EINVAL,
                              "replica_timeout must be 1 to 3600000 ms");
        rs->replica_timeout_ms = v;
    } else if (rs->replica_timeout_ms < 1) {
        rs->replica_timeout_ms = 1;
    }
    /* WAIT holds the shared connection: it must answer well within the
     * time after which an unanswered connection is given up */
    if (rs->replica_timeout_ms >= rs->cfg.timeout_ms)
        return dlock__err(DLOCK_EINVAL,
                          "replica_timeout (%lld ms) must be shorter than "
                          "timeout (%lld ms)",
                          (long long)rs->replica_timeout_ms,
                          (long long)rs->cfg.timeout_ms);
    if (ms && !n)
        return dlock__err(DLOCK_EINVAL,
                          "replica_timeout without min_replicas does nothing");
    return DLOCK_OK;
}

static int parse_config(redis_store *rs, const dlock__uri *u)
{
    static const char *const params[] = {
        "prefix", "timeout", "db", "min_replicas", "replica_timeout",
        /* TLS: dlock__rtls_params (redis_io.h) */
        "tls", "cacert", "cert", "key", "sni", "insecure", NULL};
    const char *db = dlock__uri_param(u, "db");
    int rc = dlock__uri_check_params(u, params);

    if (rc)
        return rc;
    if (strcmp(u->scheme, "redis-sentinel") == 0) {
        /* the sentinels and the master's name: redis_sentinel.c */
        snprintf(rs->where, sizeof(rs->where), "redis-sentinel %.200s",
                 u->path[0] ? u->path + 1 : "");
    } else if (strcmp(u->scheme, "redis-cluster") == 0) {
        /* the seeds: redis_cluster.c; a cluster has database 0 only */
        snprintf(rs->where, sizeof(rs->where), "redis-cluster");
        if ((u->path[0] && strcmp(u->path, "/") != 0) ||
            (db && strcmp(db, "0") != 0))
            return dlock__err(DLOCK_EINVAL,
                              "redis-cluster:// has no databases: a Redis "
                              "Cluster has database 0 only");
    } else if (strcmp(u->scheme, "unix") == 0) {
        if (u->nhosts != 0 || u->path[0] != '/' || u->path[1] == '\0')
            return dlock__err(DLOCK_EINVAL,
                              "unix:// needs the socket's absolute path: "
                              "unix:///path/to/redis.sock");
        if (!(rs->path = strdup(u->path)))
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        snprintf(rs->where, sizeof(rs->where), "redis unix:%.250s",
                 rs->path);
    } else {
        if (u->nhosts > 1)
            return dlock__err(DLOCK_EINVAL,
                              "%s:// takes one host (for several, use "
                              "redlock://)",
                              u->scheme);
        if (u->nhosts != 1)
            return dlock__err(DLOCK_EINVAL,
                              "%s:// needs a host: %s://host[:port]",
                              u->scheme, u->scheme);
        if (!(rs->host = strdup(u->hosts[0].host)))
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        rs->port = u->hosts[0].port ? u->hosts[0].port : DEFAULT_PORT;
        snprintf(rs->where, sizeof(rs->where),
                 strchr(rs->host, ':') ? "%s [%.200s]:%d" : "%s %.200s:%d",
                 u->scheme, rs->host, rs->port);
        if (u->path[0] && strcmp(u->path, "/") != 0) {
            if (db)
                return dlock__err(DLOCK_EINVAL,
                                  "redis://: give the database in the path "
                                  "or as ?db=, not both");
            db = u->path + 1;
        }
    }
    rc = dlock__redis_config_parse(&rs->cfg, u, "redis", db);
    return rc ? rc : parse_replicas(rs, u);
}

/* redis-cluster://: the scripts with SPUBLISH (a hand-over stays in its
 * slot's shard), the epoll set of the subscribers, and the slot map. */
static int cluster_open(redis_store *rs, const dlock__uri *u)
{
    for (int i = 0; i < NSCRIPTS; i++) {
        const char *t = dlock__redis_script_text[i];
        size_t n = strlen(t), k = 0;
        char *out = malloc(n * 2 + 1);
        if (!out)
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        for (size_t j = 0; j < n;) {
            if (!strncmp(t + j, "'PUBLISH'", 9))
                out[k++] = '\'', out[k++] = 'S', j++;
            else
                out[k++] = t[j++];
        }
        out[k] = '\0';
        rs->cscripts[i] = out;
    }
    rs->target.scripts = (const char *const *)rs->cscripts;
    rs->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (rs->epfd < 0)
        return dlock__err(DLOCK_ENOMEM, "epoll_create1: %s", strerror(errno));
    int rc = dlock__rcluster_open(&rs->cluster, u, &rs->cfg,
                                  rs->target.scripts, NSCRIPTS,
                                  dlock__now_ms() + rs->cfg.timeout_ms);
    if (rc == DLOCK_OK)
        rs->acted_gen = dlock__rcluster_gen(rs->cluster);
    return rc;
}

static int redis_open(void **out, dlock_client *c, const dlock__uri *u,
                      int64_t timeout_ms)
{
    redis_store *rs = calloc(1, sizeof(*rs));
    int rc;

    if (!rs)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    rs->client = c;
    rs->epfd = -1;
    pthread_mutex_init(&rs->sub_mu, NULL);
    rc = dlock__cond_init(&rs->sub_cv);
    if (rc) {
        pthread_mutex_destroy(&rs->sub_mu);
        free(rs);
        return rc;
    }
    rs->cfg.timeout_ms = timeout_ms;
    rc = parse_config(rs, u);
    if (rc == DLOCK_OK) {
        snprintf(rs->chan_prefix, sizeof(rs->chan_prefix), "%sc:",
                 rs->cfg.prefix);
        rs->chan_len = (size_t)snprintf(rs->chan, sizeof(rs->chan), "%s%s",
                                        rs->chan_prefix,
                                        dlock__client_id(c));
        rs->target.host = rs->host;
        rs->target.port = rs->port;
        rs->target.path = rs->path;
        rs->target.cfg = &rs->cfg;
        rs->target.where = rs->where;
        rs->target.scripts = dlock__redis_script_text;
        rs->target.nscripts = NSCRIPTS;
        if (strcmp(u->scheme, "redis-cluster") == 0) {
            rc = cluster_open(rs, u);
        } else if (strcmp(u->scheme, "redis-sentinel") == 0) {
            rs->epfd = epoll_create1(EPOLL_CLOEXEC);
            rc = rs->epfd < 0
                     ? dlock__err(DLOCK_ENOMEM, "epoll_create1: %s",
                                  strerror(errno))
                     : dlock__rtopo_open(&rs->topo, c, u, &rs->cfg, rs->epfd,
                                         dlock__now_ms() +
                                             rs->cfg.timeout_ms);
            rs->target.topo = rs->topo;
            if (rs->topo)
                rs->acted_gen = dlock__rtopo_gen(rs->topo);
        }
    }
    if (rc == DLOCK_OK && !rs->cluster) {
        rc = dlock__rconn_open(&rs->conn, &rs->target,
                               dlock__now_ms() + rs->cfg.timeout_ms);
        /* The sentinels answered and named a primary that does not (or
         * that says it is a replica): a failover in progress, not a
         * wrong address. Open on their word; the first call connects,
         * and a wait rides the failover out (docs/design.md, "Waiting
         * through failovers and restarts"). */
        if (rc == DLOCK_ECONN && rs->topo)
            rc = dlock__rconn_new(&rs->conn, &rs->target);
    }
    if (rc) {
        redis_close(rs);
        return rc;
    }
    *out = rs;
    return DLOCK_OK;
}

/* CONFIG GET's value (an array: name, value), or NULL. */
static const char *config_value(const redisReply *r)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
        r->element[1]->type != REDIS_REPLY_STRING)
        return NULL;
    return r->element[1]->str;
}

/* dlock_client_check(): persistence, Sentinel's min_replicas, a password
 * without TLS, and the server's clock (on a cluster, of the primary a
 * probe key hashes to). */
static int redis_check(void *st, int64_t ttl_ms, dlock_check *out,
                       int64_t deadline)
{
    redis_store *rs = st;
    static const char key[] = "dlock-doctor";
    rcmd cmds[3] = {{.script = -1, .argc = 3,
                     .argv = {"CONFIG", "GET", "appendonly"},
                     .lens = {6, 3, 10}},
                    {.script = -1, .argc = 3,
                     .argv = {"CONFIG", "GET", "save"},
                     .lens = {6, 3, 4}},
                    {.script = -1, .argc = 1, .argv = {"TIME"},
                     .lens = {4}}};
    redisReply *r[3] = {NULL, NULL, NULL};
    int rc;

    (void)ttl_ms;
    if (rs->cfg.password && !rs->cfg.tls && rs->host &&
        (rc = dlock__check_finding(
             out, "password-without-tls",
             "the store's password goes over the network in clear text "
             "(AUTH without TLS): whoever sees the traffic can take and "
             "break every lock",
             "use rediss:// (or ?tls=1 on the Sentinel, Cluster and "
             "Redlock forms), or a unix:// socket on this host")) != 0)
        return rc;
    if (rs->topo && rs->min_replicas == 0 &&
        (rc = dlock__check_finding(
             out, "sentinel-min-replicas",
             "under Sentinel a lock taken on the primary and not yet "
             "replicated is lost by a failover, and another client takes "
             "it on the new primary while the first still holds",
             "add ?min_replicas=N (a replica must have the lock before "
             "the acquire returns) and set min-replicas-to-write on the "
             "servers")) != 0)
        return rc;
    int64_t t0 = wall_ms();
    rc = dlock__redis_run(rs, key, sizeof(key) - 1, cmds, 3, r, deadline);
    int64_t t1 = wall_ms();
    if (rc)
        return rc;
    const char *aof = config_value(r[0]), *save = config_value(r[1]);
    if (!aof || !save) {
        dlock__check_note(out, "persistence: CONFIG GET was refused (%s)",
                          r[0] && r[0]->type == REDIS_REPLY_ERROR
                              ? r[0]->str
                              : "no answer");
    } else if (strcmp(aof, "yes") != 0 && save[0] == '\0') {
        rc = dlock__check_finding(
            out, "redis-persistence",
            "the server keeps its keys in memory only (appendonly no, "
            "save \"\"): a restart forgets every lock, and another "
            "client takes a lock its holder still believes it has",
            "set appendonly yes (with appendfsync everysec or always), or "
            "use a store that keeps its state (redis-sentinel:// with "
            "min_replicas, postgres://, etcd://, zk://)");
    } else if (strcmp(aof, "yes") != 0) {
        rc = dlock__check_finding(
            out, "redis-persistence",
            "the server keeps its keys by snapshots only (save, "
            "appendonly no): a restart brings back an older state, "
            "without the locks taken since the last snapshot",
            "set appendonly yes (appendfsync everysec or always)");
    }
    if (!rc && r[2] && r[2]->type == REDIS_REPLY_ARRAY &&
        r[2]->elements == 2 && r[2]->element[0]->type == REDIS_REPLY_STRING)
        dlock__check_clock(out,
                           atoll(r[2]->element[0]->str) * 1000 +
                               atoll(r[2]->element[1]->str) / 1000,
                           t0, t1);
    if (rs->cluster)
        dlock__check_note(out, "a cluster: the settings of the primary "
                               "that holds the key 'dlock-doctor' only");
    for (int i = 0; i < 3; i++)
        if (r[i])
            freeReplyObject(r[i]);
    return rc;
}

const dlock__backend dlock__backend_redis = {
    DLOCK__STORE_HEAD,
    .name = "redis",
    .caps = DLOCK__CAP_LEASE | DLOCK__CAP_HANDOVER | DLOCK__CAP_WAITER_READS |
            DLOCK__CAP_SHARED | DLOCK__CAP_PERMITS,
    .lease_size = sizeof(redis_lease),
    .open = redis_open,
    .close = redis_close,
    .acquire = redis_acquire,
    .arm = dlock__redis_arm, /* redis_wait.c */
    .disarm = dlock__redis_disarm,
    .release = dlock__redis_release, /* redis_rw.c */
    .extend = redis_extend,
    .inspect = dlock__redis_inspect, /* redis_operate.c */
    .loop_fd = dlock__redis_loop_fd,
    .loop_run = dlock__redis_loop_run,
    .gc = NULL, /* nothing outlives its hour */
    .abandon = dlock__redis_abandon,
    .extend_many = redis_extend_many,
    .list = dlock__redis_list,
    .evict = dlock__redis_evict,
    .check = redis_check,
    .proclaim = redis_proclaim,
    .ring = dlock__redis_ring, /* redis_elect.c */
    .watch_open = dlock__redis_watch_open,
    .watch_wait = dlock__redis_watch_wait,
    .watch_close = dlock__redis_watch_close,
};
