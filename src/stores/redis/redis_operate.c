/* SPDX-License-Identifier: MIT */
/*
 * redis_operate.c -- dlock_inspect(), dlock_list() and dlock_break() on
 * the Redis store (redis:// and unix://): an operator's view of a lock
 * and of every lock, and the way to free a stuck one. The protocol and
 * its failure cases: docs/design.md "Operating: listing and breaking
 * locks"; what an operator should know: docs/monitoring.md, "redis".
 *
 * Listing. A lock is one key, PREFIX{NAME} (redis.c), whatever its form
 * (exclusive, readers, a semaphore, a tombstone), so a name is listed
 * once: the page's keys come from SCAN with MATCH PREFIX{P*} (the glob
 * characters of the store's prefix and of the name prefix P escaped, so
 * that P is matched as bytes; a key with another suffix, such as
 * Redlock's counters PREFIX{NAME}:f, never ends in '}') and a COUNT of
 * about the page's limit; then one script per LIST_BATCH keys, all
 * pipelined, reads each key's value and PTTL at one moment, and each
 * entry is filled by the code that fills dlock_inspect()'s answer. A page
 * is two round trips when the first SCAN finds enough keys; with a
 * selective prefix, up to LIST_SCANS_MAX SCANs, each asking for as many
 * slots as the keys found so far say will fill the page. SCAN never blocks
 * the server (KEYS would), its cursor is the page's cursor (decimal, read
 * back strictly), and SCAN's promise is the listing's: a key present for
 * the whole walk is listed, one that comes or goes during it may be
 * listed or not, and may be listed twice (a page drops its own
 * duplicates). Keys that are not dlock's are left out.
 *
 * Breaking. One script (redis_rw_scripts.c, break) takes every hold away
 * and hands the lock on as a release does, in one atomic step: the
 * evicted holder's next renewal compares its owner, finds it gone and
 * answers DLOCK_ENOTHELD, which the core reports as the loss of the lock.
 */
#include "redis_int.h"

#include <stdlib.h>
#include <string.h>

#define LIST_BATCH 256     /* keys per list script */
#define LIST_SCANS_MAX 4   /* SCAN calls in one page at most */
#define LIST_COUNT_MIN 10  /* COUNT of a SCAN at least ... */
#define LIST_COUNT_MAX 10000 /* ... and at most (slots, not keys) */

/* ------------------------------------------------------------------------ */
/* List                                                                     */
/* ------------------------------------------------------------------------ */

/* The keys a page found: borrowed from the SCAN replies. */
typedef struct lkey {
    const char *key;
    size_t len;
    size_t pos; /* in the order found */
} lkey;

static int cmp_key(const void *a, const void *b)
{
    const lkey *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->key, y->key, n);

    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static int cmp_pos(const void *a, const void *b)
{
    const lkey *x = a, *y = b;

    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* Checks a SCAN reply: {cursor, {key, ...}} with a cursor we can give
 * back; copies the cursor to next. */
static int scan_reply(const redis_store *rs, const redisReply *r,
                      char next[21])
{
    if (r->type == REDIS_REPLY_ERROR)
        return server_error(rs, r->str, NULL);
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_ARRAY ||
        dlock__redis_scan_cursor(r->element[0]->str, r->element[0]->len,
                                 next) != 0)
        return dlock__err(DLOCK_EPROTO, "%s: unexpected answer to SCAN",
                          rs->where);
    for (size_t i = 0; i < r->element[1]->elements; i++)
        if (r->element[1]->element[i]->type != REDIS_REPLY_STRING)
            return dlock__err(DLOCK_EPROTO, "%s: unexpected answer to SCAN",
                              rs->where);
    return DLOCK_OK;
}

/* How many slots the next SCAN of a page asks for: as many as the
 * density of the keys found so far says will fill the page, but never
 * more than twice the last SCAN's (a density guessed from a few keys can
 * be far off, and a page must stay near its limit); twice as many when
 * nothing was found. */
static size_t next_count(size_t limit, size_t found, size_t visited,
                         size_t count)
{
    double want = (double)count * 2;

    if (found > 0 &&
        (double)(limit - found) * (double)visited / (double)found < want)
        want = (double)(limit - found) * (double)visited / (double)found;
    if (want < LIST_COUNT_MIN)
        return LIST_COUNT_MIN;
    return want > LIST_COUNT_MAX ? LIST_COUNT_MAX : (size_t)want;
}

/* Runs cmds on the one server, or on cluster node `node`. */
static int run_on(redis_store *rs, int node, rcmd *cmds, int n,
                  redisReply **rep, int64_t deadline)
{
    if (!rs->cluster)
        return dlock__rconn_run(rs->conn, cmds, n, rep, deadline);
    return dlock__rcluster_run_node(rs->cluster, node, cmds, n, rep,
                                    deadline);
}

/* Adds the keys[0..n) (found in this order, without duplicates) to the
 * page: one script per LIST_BATCH of them (on a cluster, per key: a
 * script's keys share a slot), pipelined. */
static int list_read(redis_store *rs, int node, const lkey *keys, size_t n,
                     const char *prefix, size_t plen, unsigned flags,
                     dlock_list_page *out, int64_t deadline)
{
    const size_t batch = rs->cluster ? 1 : LIST_BATCH;
    size_t nb = (n + batch - 1) / batch;
    rcmd *cmds = calloc(nb, sizeof(*cmds));
    redisReply **rep = calloc(nb, sizeof(*rep));
    const char **argv = malloc((n + 3 * nb) * sizeof(*argv));
    size_t *lens = malloc((n + 3 * nb) * sizeof(*lens));
    char(*nk)[8] = malloc(nb * sizeof(*nk));
    char name[DLOCK_NAME_MAX + 1];
    int rc = DLOCK_OK;

    if (!cmds || !rep || !argv || !lens || !nk) {
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
        goto out;
    }
    size_t a = 0;
    for (size_t b = 0; b < nb; b++) {
        size_t first = b * batch;
        size_t m = n - first < batch ? n - first : batch;
        rcmd *c = &cmds[b];
        a += rcmd_evalsha_ext(c, S_LIST, argv + a, lens + a, nk[b],
                              sizeof(nk[b]), m);
        c->argc = (int)(3 + m);
        for (size_t i = first; i < first + m; i++) {
            argv[a] = keys[i].key;
            lens[a++] = keys[i].len;
        }
    }
    rc = run_on(rs, node, cmds, (int)nb, rep, deadline);
    if (rc) {
        free(rep);
        rep = NULL;
        goto out;
    }
    for (size_t b = 0; b < nb && rc == DLOCK_OK; b++) {
        const redisReply *r = rep[b];
        size_t first = b * batch;
        size_t m = n - first < batch ? n - first : batch;
        if (r->type == REDIS_REPLY_ERROR && rs->cluster &&
            (!strncmp(r->str, "MOVED ", 6) || !strncmp(r->str, "ASK ", 4)))
            continue; /* its slot moved since the SCAN: listed there */
        if (r->type == REDIS_REPLY_ERROR) {
            rc = server_error(rs, r->str, NULL);
            break;
        }
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 1 + 2 * m ||
            r->element[0]->type != REDIS_REPLY_INTEGER) {
            rc = dlock__err(DLOCK_EPROTO, "%s: unexpected answer to list",
                            rs->where);
            break;
        }
        for (size_t i = 0; i < m; i++) {
            const redisReply *v = r->element[1 + 2 * i];
            const redisReply *p = r->element[2 + 2 * i];
            const char *nm;
            size_t len;
            dlock_info info;
            if (v->type != REDIS_REPLY_STRING ||
                dlock__redis_key_name(&rs->cfg, keys[first + i].key,
                                      keys[first + i].len, "", &nm,
                                      &len) != 0 ||
                len < plen || memcmp(nm, prefix, plen) != 0)
                continue; /* gone since the SCAN, or not a lock's key */
            memcpy(name, nm, len);
            name[len] = '\0';
            memset(&info, 0, sizeof(info));
            info.ttl_ms = info.held_ms = info.waiters = -1;
            int one = dlock__redis_inspect_value(
                rs, name, r->element[0]->integer, v,
                p->type == REDIS_REPLY_INTEGER ? p->integer : -1, &info);
            if (one == DLOCK_ENOMEM) {
                dlock_info_clear(&info);
                rc = one;
                break;
            }
            /* not dlock's (another program's key that looks like one),
             * or free and nobody waits (the default leaves those out) */
            if (one != DLOCK_OK ||
                (!(flags & DLOCK_LIST_FREE) && !info.held &&
                 info.waiters <= 0)) {
                dlock_info_clear(&info);
                continue;
            }
            rc = dlock__list_add(out, name, len, &info);
            if (rc)
                break;
        }
    }
out:
    if (rep)
        for (size_t b = 0; b < nb; b++)
            freeReplyObject(rep[b]);
    free(cmds);
    free(rep);
    free(argv);
    free(lens);
    free(nk);
    return rc;
}

/* One page of the walk of one server (node: the cluster's node, or -1),
 * from SCAN cursor cur; the next cursor of that walk into cur ("0": the
 * walk ended). */
static int list_node(redis_store *rs, int node, char cur[21],
                     const char *prefix, size_t plen, size_t limit,
                     unsigned flags, dlock_list_page *out, int64_t deadline)
{
    char count[24], pat[DLOCK__REDIS_PATTERN_MAX];
    redisReply *scans[LIST_SCANS_MAX];
    size_t nscans = 0, found = 0, visited = 0;
    size_t want = limit < LIST_COUNT_MIN ? LIST_COUNT_MIN : limit;
    size_t cnt = want > LIST_COUNT_MAX ? LIST_COUNT_MAX : want;
    size_t pl = dlock__redis_list_pattern(&rs->cfg, prefix, plen, "", pat);
    lkey *keys = NULL;
    int rc = DLOCK_OK;

    /* SCAN until the page has at least half its keys, the walk ends, or
     * LIST_SCANS_MAX calls */
    for (;;) {
        rcmd c;
        redisReply *r;
        rcmd_plain(&c);
        rcmd_str(&c, "SCAN");
        rcmd_str(&c, cur);
        rcmd_str(&c, "MATCH");
        rcmd_arg(&c, pat, pl);
        rcmd_str(&c, "COUNT");
        snprintf(count, sizeof(count), "%zu", cnt);
        rcmd_str(&c, count);
        rc = run_on(rs, node, &c, 1, &r, deadline);
        if (rc)
            goto out;
        scans[nscans++] = r;
        rc = scan_reply(rs, r, cur);
        if (rc)
            goto out;
        found += r->element[1]->elements;
        visited += cnt;
        if (!strcmp(cur, "0") || found * 2 >= limit ||
            nscans == LIST_SCANS_MAX)
            break;
        cnt = next_count(limit, found, visited, cnt);
    }

    /* the keys in the order found, each once (SCAN may give a key twice) */
    if (found) {
        size_t k = 0;
        keys = malloc(found * sizeof(*keys));
        if (!keys) {
            rc = dlock__err(DLOCK_ENOMEM, "out of memory");
            goto out;
        }
        for (size_t s = 0; s < nscans; s++)
            for (size_t i = 0; i < scans[s]->element[1]->elements; i++) {
                const redisReply *e = scans[s]->element[1]->element[i];
                keys[k].key = e->str;
                keys[k].len = e->len;
                keys[k].pos = k;
                k++;
            }
        qsort(keys, found, sizeof(*keys), cmp_key);
        size_t u = 0;
        for (size_t i = 0; i < found; i++)
            if (u == 0 || keys[u - 1].len != keys[i].len ||
                memcmp(keys[u - 1].key, keys[i].key, keys[i].len) != 0)
                keys[u++] = keys[i];
        qsort(keys, u, sizeof(*keys), cmp_pos);
        rc = list_read(rs, node, keys, u, prefix, plen, flags, out,
                       deadline);
        if (rc)
            goto out;
    }
out:
    for (size_t s = 0; s < nscans; s++)
        freeReplyObject(scans[s]);
    free(keys);
    return rc;
}

#define PRIMARIES_MAX 1024

/* A cluster's walk: its primaries in the order of their lowest slots, one
 * after the other; the cursor is "K:CURSOR", the K-th primary's SCAN
 * cursor ("" the start). A failover keeps the order (the replica takes
 * the same slots); a reshard moves keys under the walk, which SCAN's
 * promise does not cover: such a key may be listed twice or not at all. */
static int list_cluster(redis_store *rs, const char *cursor,
                        const char *prefix, size_t plen, size_t limit,
                        unsigned flags, dlock_list_page *out,
                        int64_t deadline)
{
    int *ids = malloc(PRIMARIES_MAX * sizeof(*ids)), n, k = 0, rc;
    const char *colon = strchr(cursor, ':');
    char cur[21] = "0", *end;

    if (!ids)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    if (cursor[0]) {
        long v = strtol(cursor, &end, 10);
        if (!colon || end != colon || v < 0 || v >= PRIMARIES_MAX ||
            dlock__redis_scan_cursor(colon + 1, strlen(colon + 1), cur) != 0) {
            free(ids);
            return dlock__err(DLOCK_EINVAL,
                              "%s: the cursor is not one this store made (a "
                              "cluster's is NODE:CURSOR)",
                              rs->where);
        }
        k = (int)v;
    }
    n = dlock__rcluster_primaries(rs->cluster, ids, PRIMARIES_MAX, deadline);
    if (k >= n) { /* the cluster shrank under the walk: it is over */
        free(ids);
        return DLOCK_OK;
    }
    rc = list_node(rs, ids[k], cur, prefix, plen, limit, flags, out,
                   deadline);
    if (rc == DLOCK_OK && (strcmp(cur, "0") != 0 || k + 1 < n)) {
        char next[48];
        snprintf(next, sizeof(next), "%d:%s", strcmp(cur, "0") ? k : k + 1,
                 cur);
        if (!(out->next = strdup(next)))
            rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    free(ids);
    return rc;
}

int dlock__redis_list(void *st, const char *prefix, size_t plen,
                      const char *cursor, size_t limit, unsigned flags,
                      dlock_list_page *out, int64_t deadline)
{
    redis_store *rs = st;
    char cur[21];
    int rc;

    if (rs->cluster)
        return list_cluster(rs, cursor, prefix, plen, limit, flags, out,
                            deadline);
    if (dlock__redis_scan_cursor(cursor, strlen(cursor), cur) != 0)
        return dlock__err(DLOCK_EINVAL,
                          "%s: the cursor is not one this store made (a "
                          "Redis cursor is a decimal number)",
                          rs->where);
    rc = list_node(rs, -1, cur, prefix, plen, limit, flags, out, deadline);
    if (rc == DLOCK_OK && strcmp(cur, "0") != 0 &&
        !(out->next = strdup(cur)))
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Inspect and break                                                        */
/* ------------------------------------------------------------------------ */

/* The answer of the break script: *out from the value before, and
 * DLOCK_OK (broken), DLOCK_ENOTHELD (nobody held it) or an error. */
static int break_answer(const redis_store *rs, const char *name,
                        const redisReply *r, dlock_info *out)
{
    int rc;

    if (r->type == REDIS_REPLY_ERROR)
        return server_error(rs, r->str, name);
    if (r->type != REDIS_REPLY_ARRAY || r->elements < 4 ||
        (r->elements - 4) % 4 != 0 ||
        r->element[0]->type != REDIS_REPLY_INTEGER ||
        r->element[3]->type != REDIS_REPLY_INTEGER)
        return dlock__err(DLOCK_EPROTO, "%s: unexpected answer to break",
                          rs->where);
    /* what the store held just before */
    rc = dlock__redis_inspect_value(
        rs, name, r->element[0]->integer, r->element[1],
        r->element[2]->type == REDIS_REPLY_INTEGER ? r->element[2]->integer
                                                   : -1,
        out);
    if (rc == DLOCK_OK && r->element[3]->integer != 1)
        rc = DLOCK_ENOTHELD; /* nobody held it: nothing done */
    /* a waiter of this very client that the break let in hears it at
     * once, as after a release */
    for (size_t i = 4; rc == DLOCK_OK && i + 3 < r->elements; i += 4)
        dlock__redis_own_grant(rs, r->element[i], r->element[i + 1],
                               r->element[i + 2]);
    return rc;
}

/* The inspect (S_INSPECT) or break script (S_BREAK: with the channel
 * prefix a release publishes on) on one lock, and its answer: *out. */
static int one_lock(redis_store *rs, int script, const char *name,
                    size_t len, dlock_info *out, int64_t deadline)
{
    char key[KEY_MAX], chan[KEY_MAX + 4];
    size_t kl = lock_key(rs, name, len, key);
    redisReply *r;
    rcmd c;
    int rc;

    rcmd_evalsha(&c, script, 1);
    rcmd_arg(&c, key, kl);
    if (script == S_BREAK)
        rcmd_arg(&c, chan, chan_for(rs, key, kl, chan));
    rc = dlock__redis_run(rs, key, kl, &c, 1, &r, deadline);
    if (rc)
        return rc;
    rc = script == S_BREAK ? break_answer(rs, name, r, out)
                           : dlock__redis_rw_inspect(rs, name, r, out);
    freeReplyObject(r);
    return rc;
}

int dlock__redis_inspect(void *st, const char *name, size_t len,
                         dlock_info *out, int64_t deadline)
{
    return one_lock(st, S_INSPECT, name, len, out, deadline);
}

int dlock__redis_evict(void *st, const char *name, size_t len,
                       dlock_info *out, int64_t deadline)
{
    return one_lock(st, S_BREAK, name, len, out, deadline);
}
