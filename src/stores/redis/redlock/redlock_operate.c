/* SPDX-License-Identifier: MIT */
/*
 * redlock_operate.c -- what Redlock's nodes say of a lock and of every
 * lock: dlock_inspect(), dlock_list(), and dlock_break(). redlock.c has
 * the protocol and the scripts; docs/monitoring.md, "redlock", what an
 * operator should know.
 *
 * Describing a lock. Each node has its own view (the lock key, its
 * counter, the subscribers of its release channel); a lock is held when
 * one owner's key is on a quorum of them, and then described by that
 * owner's keys (its token, as its acquire computed it: the highest counter
 * of those keys with the lowest node that has it; its lease: the quorum's
 * shortest). Otherwise: free, with the highest counter of the nodes as
 * the last token. Waiters: the most subscribers any node's channel has.
 * Inspect, list and break all describe a lock so (describe()), from one
 * round of requests to every node.
 *
 * Listing: the union of the nodes' listings. Every node is walked with
 * SCAN (its own cursor; the page's cursor is the N of them, "-" for a
 * node walked to its end, "x" for one left out after it failed), all
 * nodes in one round, with MATCH on PREFIX{P*} (held: the lock keys) or,
 * with DLOCK_LIST_FREE, PREFIX{P*}:f (every name with a counter, held or
 * not). The names found are then described in a second round (one script
 * and one PUBSUB NUMSUB per node for the whole page). A name is found on
 * several nodes; it is listed from the lowest node whose walk covers it:
 * a name found on node i is left out when a lower node that is being (or
 * was) walked has its key too, since that node's walk lists it. So a
 * name whose keys stay put is listed once; one that changes during the
 * walk may be listed twice or missed (as with one server's SCAN). A node
 * that fails is left out of the rest of the walk; a walk that has left
 * out more than N - Q nodes would miss locks held on a quorum of the
 * others, so it fails with DLOCK_ECONN instead (the caller may try the
 * page again). Each node's SCAN asks for about `limit` keys, at most
 * LIST_NAMES_MAX / N, so that a page describes at most about
 * LIST_NAMES_MAX names: a page of a large limit is then shorter than
 * asked. Two rounds per page, whatever N.
 *
 * Breaking: a script on every node (all of them, not a quorum) deletes
 * the lock key and publishes its release, as the holder's release would;
 * the counters stay, so the next hold's token is greater. Not one atomic
 * step: Redlock has no single place. The break succeeds when it deleted
 * keys on more than N - Q nodes (the holder's renewal then cannot find a
 * quorum of its keys: it learns it lost the lock); fewer than a quorum of
 * nodes answering is DLOCK_ECONN (the operator tries again). Racing the
 * holder's own release, the two split the nodes: with the key on every
 * node, exactly one of them reaches a quorum (release) or more than N - Q
 * (break).
 */
#include "redlock_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LIST_NAMES_MAX 1000 /* names one page describes at most (the
                             * nodes' SCAN COUNT: this / N at most) */

/* One node's answer about one name. */
typedef struct rl_view {
    int answered;
    long long now, pttl;
    const redisReply *v; /* the lock key's value (string; nil: none) */
    const redisReply *f; /* its counter (string; nil: none) */
    long long waiters;   /* subscribers of its channel; -1 unknown */
} rl_view;

/* What one node's lock key says. */
typedef struct seen {
    const char *owner; /* points into a reply */
    size_t owner_len;
    uint64_t counter;
    long long acquired, now, pttl;
    const char *desc;
    size_t desc_len;
} seen;

static int cmp_ll_desc(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Fills *out from the views of the nodes (vw[i] for node i) of lock
 * `name`: DLOCK_OK, or DLOCK_EPROTO when a node's key is not dlock's. */
static int describe(const rl_store *rs, const char *name, const rl_view *vw,
                    dlock_info *out)
{
    seen sn[MAX_NODES];
    int has[MAX_NODES];
    uint64_t last = 0;

    out->waiters = 0;
    for (int i = 0; i < rs->n; i++) {
        const rl_view *w = &vw[i];
        uint64_t f;
        has[i] = 0;
        if (!w->answered)
            continue;
        /* the highest counter, from the lowest node that has it: the
         * token rule of the acquire */
        if (w->f && dlock__redis_reply_uint(w->f, &f) == 0 &&
            f < (UINT64_MAX >> NODE_BITS) &&
            (f << NODE_BITS) > (last & ~(uint64_t)((1 << NODE_BITS) - 1)))
            last = f << NODE_BITS | (uint64_t)i;
        if (w->waiters > out->waiters)
            out->waiters = w->waiters;
        const redisReply *v = w->v;
        if (!v || v->type == REDIS_REPLY_NIL)
            continue;
        /* "OWNER COUNTER ACQUIRED_MS DESCRIPTION" */
        unsigned long long cnt = 0, at = 0;
        int o_end = 0, d = 0;
        if (v->type != REDIS_REPLY_STRING ||
            sscanf(v->str, "%*s%n %llu %llu %n", &o_end, &cnt, &at, &d) < 2 ||
            d <= 0 || (size_t)d > v->len || cnt >= (UINT64_MAX >> NODE_BITS))
            return dlock__err(DLOCK_EPROTO,
                              "%s: a key of lock '%.100s' holds a value of "
                              "another type (not written by dlock)",
                              rs->nodes[i].where, name);
        has[i] = 1;
        sn[i].owner = v->str;
        sn[i].owner_len = (size_t)o_end;
        sn[i].counter = cnt;
        sn[i].acquired = (long long)at;
        sn[i].now = w->now;
        sn[i].pttl = w->pttl;
        sn[i].desc = v->str + d;
        sn[i].desc_len = v->len - (size_t)d;
    }
    out->token = last;
    /* held when one owner's key is on a quorum */
    for (int i = 0; i < rs->n && !out->held; i++) {
        if (!has[i])
            continue;
        long long pttls[MAX_NODES];
        int same = 0, top_idx = 0;
        uint64_t top = 0;
        for (int k = 0; k < rs->n; k++) {
            if (!has[k] || sn[k].owner_len != sn[i].owner_len ||
                memcmp(sn[k].owner, sn[i].owner, sn[i].owner_len) != 0)
                continue;
            pttls[same++] = sn[k].pttl;
            if (sn[k].counter > top) { /* the lowest node with the most */
                top = sn[k].counter;
                top_idx = k;
            }
        }
        if (same < rs->quorum)
            continue;
        qsort(pttls, (size_t)same, sizeof(pttls[0]), cmp_ll_desc);
        out->held = 1;
        out->holders = 1;
        out->token = top << NODE_BITS | (uint64_t)top_idx;
        out->ttl_ms = pttls[rs->quorum - 1];
        if (sn[i].now >= sn[i].acquired)
            out->held_ms = sn[i].now - sn[i].acquired;
        snprintf(out->holder, sizeof(out->holder), "%.*s",
                 (int)sn[i].desc_len, sn[i].desc);
    }
    return DLOCK_OK;
}

/* The subscribers of the k-th channel in a PUBSUB NUMSUB reply, or -1. */
static long long numsub(const redisReply *ns, size_t k)
{
    if (!ns || ns->type != REDIS_REPLY_ARRAY || ns->elements <= 2 * k + 1 ||
        ns->element[2 * k + 1]->type != REDIS_REPLY_INTEGER)
        return -1;
    return ns->element[2 * k + 1]->integer;
}

/* ------------------------------------------------------------------------ */
/* Inspect                                                                  */
/* ------------------------------------------------------------------------ */

/* One round for inspect (`deleted` NULL: S_INSPECT) or break (S_BREAK,
 * whose script also takes the wake channel and publishes on it): the script on the lock's keys and PUBSUB NUMSUB on its channel,
 * on every node (all of them, not a quorum: for a break, each one that
 * keeps the holder's key could lend it a quorum again), each node's view
 * into vw (MAX_NODES). A script answers now, the key, its PTTL, the
 * counter and, for a break, whether the node deleted the key (counted in
 * *deleted).
 * Call with rs->mu held; dlock__redlock_round_free() after. DLOCK_OK with
 * *answered set, or an error. */
static int ask_views(rl_store *rs, const char *name, size_t len,
                     rl_view *vw, int *answered, int *deleted,
                     int64_t op_deadline)
{
    const char *what = deleted ? "break" : "inspect";
    size_t elems = deleted ? 5 : 4;
    char lock[DLOCK__REDIS_KEY_MAX], fence[DLOCK__REDIS_KEY_MAX];
    char wake[DLOCK__REDIS_KEY_MAX];
    size_t ll = dlock__redis_key(&rs->cfg, name, len, "", lock);
    size_t fl = dlock__redis_key(&rs->cfg, name, len, ":f", fence);
    size_t wl = dlock__redis_wake_key(&rs->cfg, name, len, wake);

    rcmd c[2];
    rcmd_evalsha(&c[0], deleted ? S_BREAK : S_INSPECT, 2);
    rcmd_arg(&c[0], lock, ll);
    rcmd_arg(&c[0], fence, fl);
    if (deleted)
        rcmd_arg(&c[0], wake, wl);
    rcmd_plain(&c[1]);
    rcmd_str(&c[1], "PUBSUB");
    rcmd_str(&c[1], "NUMSUB");
    rcmd_arg(&c[1], wake, wl);
    dlock__redlock_ask_all(rs, c, 2, rs->node_timeout, op_deadline, NULL,
                           NULL);
    memset(vw, 0, MAX_NODES * sizeof(*vw));
    *answered = 0;
    for (int i = 0; i < rs->n; i++) {
        rnode *n = &rs->nodes[i];
        if (n->rc || n->ngot < 2)
            continue;
        const redisReply *s = n->got[0];
        if (s->type == REDIS_REPLY_ERROR)
            return dlock__redis_server_error(n->where, rs->cfg.password,
                                             s->str, name);
        if (s->type != REDIS_REPLY_ARRAY || s->elements != elems ||
            s->element[0]->type != REDIS_REPLY_INTEGER ||
            (deleted && s->element[4]->type != REDIS_REPLY_INTEGER))
            return dlock__err(DLOCK_EPROTO, "%s: unexpected answer to %s",
                              n->where, what);
        ++*answered;
        if (deleted)
            *deleted += s->element[4]->integer == 1;
        vw[i].answered = 1;
        vw[i].now = s->element[0]->integer;
        vw[i].v = s->element[1];
        vw[i].pttl = s->element[2]->type == REDIS_REPLY_INTEGER
                         ? s->element[2]->integer
                         : -1;
        vw[i].f = s->element[3];
        vw[i].waiters = numsub(n->got[1], 0);
    }
    return DLOCK_OK;
}

int dlock__redlock_inspect(void *st, const char *name, size_t len,
                           dlock_info *out, int64_t op_deadline)
{
    rl_store *rs = st;
    rl_view vw[MAX_NODES];
    int rc, answered;

    pthread_mutex_lock(&rs->mu);
    rc = ask_views(rs, name, len, vw, &answered, NULL, op_deadline);
    if (rc == DLOCK_OK && answered < rs->quorum)
        rc = dlock__redlock_quorum_failure(rs, answered, "inspect");
    else if (rc == DLOCK_OK)
        rc = describe(rs, name, vw, out);
    dlock__redlock_round_free(rs);
    pthread_mutex_unlock(&rs->mu);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* List                                                                     */
/* ------------------------------------------------------------------------ */

/* A name found by a node's SCAN: points into that node's reply. */
typedef struct fname {
    const char *name;
    size_t len;
    int from; /* the lowest node whose SCAN found it */
} fname;

static int cmp_fname(const void *a, const void *b)
{
    const fname *x = a, *y = b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->name, y->name, n);

    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->from - y->from;
}

/* The SCAN round: every node still walking, at once. Sets each node's
 * next cursor and walk, and takes its reply into scans[i]. */
static void scan_round(rl_store *rs, const char *pat, size_t pl,
                       size_t count, char (*cur)[21], int *walk,
                       redisReply **scans, int64_t op_deadline)
{
    char cnt[24];
    int64_t now = dlock__now_ms();

    snprintf(cnt, sizeof(cnt), "%zu", count);
    dlock__redlock_round_begin(rs);
    for (int i = 0; i < rs->n; i++) {
        if (walk[i] != DLOCK__WALKING)
            continue;
        rcmd c;
        rcmd_plain(&c);
        rcmd_str(&c, "SCAN");
        rcmd_str(&c, cur[i]);
        rcmd_str(&c, "MATCH");
        rcmd_arg(&c, pat, pl);
        rcmd_str(&c, "COUNT");
        rcmd_str(&c, cnt);
        dlock__redlock_node_send(rs, &rs->nodes[i], &c, K_ROUND, now);
    }
    int64_t deadline = dlock__now_ms() + rs->node_timeout;
    dlock__redlock_round_run(rs, deadline < op_deadline ? deadline
                                                        : op_deadline,
                             NULL, NULL);
    for (int i = 0; i < rs->n; i++) {
        rnode *n = &rs->nodes[i];
        if (walk[i] != DLOCK__WALKING)
            continue;
        const redisReply *r = n->rc || n->ngot < 1 ? NULL : n->got[0];
        int ok = r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
                 r->element[0]->type == REDIS_REPLY_STRING &&
                 r->element[1]->type == REDIS_REPLY_ARRAY &&
                 dlock__redis_scan_cursor(r->element[0]->str,
                                          r->element[0]->len, cur[i]) == 0;
        for (size_t k = 0; ok && k < r->element[1]->elements; k++)
            ok = r->element[1]->element[k]->type == REDIS_REPLY_STRING;
        if (!ok) {
            walk[i] = DLOCK__LEFT_OUT;
            continue;
        }
        scans[i] = n->got[0]; /* ours now: the round frees the rest */
        n->got[0] = NULL;
        n->ngot = 0;
        if (!strcmp(cur[i], "0"))
            walk[i] = DLOCK__WALKED;
    }
    dlock__redlock_round_free(rs);
}

/* Describes the names[0..m) (sorted, each once) on every node in one
 * round, and adds to the page those that node `from`'s walk lists. */
static int describe_round(rl_store *rs, const fname *names, size_t m,
                          const int *walk, unsigned flags,
                          dlock_list_page *out, int64_t op_deadline)
{
    const char **argv = malloc((3 * m + 6) * sizeof(*argv));
    size_t *lens = malloc((3 * m + 6) * sizeof(*lens));
    size_t per = rs->cfg.prefix_len + 32, text_len = 0;
    char *text, nk[24], name[DLOCK_NAME_MAX + 1];
    int rc = DLOCK_OK, answered = 0;
    rl_view vw[MAX_NODES];

    for (size_t j = 0; j < m; j++)
        text_len += 3 * (per + names[j].len);
    text = malloc(text_len ? text_len : 1);
    if (!argv || !lens || !text) {
        free(argv);
        free(lens);
        free(text);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    /* {EVALSHA sha 2m lock fence ...} and {PUBSUB NUMSUB wake ...} */
    rcmd c[2];
    size_t a = 0, t = 0;
    memset(c, 0, sizeof(c));
    a += rcmd_evalsha_ext(&c[0], S_LIST, argv, lens, nk, sizeof(nk), 2 * m);
    for (size_t j = 0; j < m; j++) {
        argv[a] = text + t;
        t += lens[a++] = dlock__redis_key(&rs->cfg, names[j].name,
                                          names[j].len, "", text + t);
        argv[a] = text + t;
        t += lens[a++] = dlock__redis_key(&rs->cfg, names[j].name,
                                          names[j].len, ":f", text + t);
    }
    c[0].argc = (int)a;
    c[1].script = -1;
    c[1].ext_argv = argv + a;
    c[1].ext_lens = lens + a;
    argv[a] = "PUBSUB";
    lens[a++] = 6;
    argv[a] = "NUMSUB";
    lens[a++] = 6;
    for (size_t j = 0; j < m; j++) {
        argv[a] = text + t;
        t += lens[a++] = dlock__redis_wake_key(&rs->cfg, names[j].name,
                                               names[j].len, text + t);
    }
    c[1].argc = (int)(a - (size_t)c[0].argc);

    dlock__redlock_ask_all(rs, c, 2, rs->node_timeout, op_deadline, NULL,
                           NULL);
    for (int i = 0; i < rs->n; i++) {
        const rnode *n = &rs->nodes[i];
        const redisReply *s = n->rc || n->ngot < 2 ? NULL : n->got[0];
        if (s && s->type == REDIS_REPLY_ERROR) {
            rc = dlock__redis_server_error(n->where, rs->cfg.password, s->str,
                                           NULL);
            goto done;
        }
        if (s && s->type == REDIS_REPLY_ARRAY && s->elements == 1 + 3 * m &&
            s->element[0]->type == REDIS_REPLY_INTEGER)
            answered++;
    }
    if (answered < rs->quorum) {
        rc = dlock__redlock_quorum_failure(rs, answered, "list");
        goto done;
    }
    for (size_t j = 0; j < m && rc == DLOCK_OK; j++) {
        int skip = 0;
        for (int i = 0; i < rs->n; i++) {
            const rnode *n = &rs->nodes[i];
            const redisReply *s = n->rc || n->ngot < 2 ? NULL : n->got[0];
            rl_view *w = &vw[i];
            memset(w, 0, sizeof(*w));
            if (!s || s->type != REDIS_REPLY_ARRAY ||
                s->elements != 1 + 3 * m ||
                s->element[0]->type != REDIS_REPLY_INTEGER)
                continue;
            w->answered = 1;
            w->now = s->element[0]->integer;
            w->v = s->element[1 + 3 * j];
            w->pttl = s->element[2 + 3 * j]->type == REDIS_REPLY_INTEGER
                          ? s->element[2 + 3 * j]->integer
                          : -1;
            w->f = s->element[3 + 3 * j];
            w->waiters = numsub(n->got[1], j);
            /* a lower node whose walk covers the name lists it */
            const redisReply *key = flags & DLOCK_LIST_FREE ? w->f : w->v;
            if (i < names[j].from && walk[i] != DLOCK__LEFT_OUT &&
                key->type != REDIS_REPLY_NIL)
                skip = 1;
        }
        if (skip)
            continue;
        dlock_info info;
        memset(&info, 0, sizeof(info));
        info.ttl_ms = info.held_ms = info.waiters = -1;
        memcpy(name, names[j].name, names[j].len);
        name[names[j].len] = '\0';
        /* a key that is not dlock's is left out; so are locks that are
         * free and waited for by nobody, unless asked for */
        if (describe(rs, name, vw, &info) != DLOCK_OK ||
            (!(flags & DLOCK_LIST_FREE) && !info.held && info.waiters <= 0))
            continue;
        rc = dlock__list_add(out, name, names[j].len, &info);
    }
done:
    dlock__redlock_round_free(rs);
    free(argv);
    free(lens);
    free(text);
    return rc;
}

int dlock__redlock_list(void *st, const char *prefix, size_t plen,
                        const char *cursor, size_t limit, unsigned flags,
                        dlock_list_page *out, int64_t op_deadline)
{
    rl_store *rs = st;
    const char *sfx = flags & DLOCK_LIST_FREE ? ":f" : "";
    char cur[MAX_NODES][21], pat[DLOCK__REDIS_PATTERN_MAX];
    int walk[MAX_NODES], left = 0;
    redisReply *scans[MAX_NODES];
    size_t pl = dlock__redis_list_pattern(&rs->cfg, prefix, plen, sfx, pat);
    size_t count = limit, cap = LIST_NAMES_MAX / (size_t)rs->n;
    size_t nf = 0, m = 0;
    fname *names = NULL;
    int rc = DLOCK_OK;

    if (dlock__redis_walk_cursor(cursor, rs->n, cur, walk) != 0)
        return dlock__err(DLOCK_EINVAL,
                          "%s: the cursor is not one this store made (one "
                          "field per node)",
                          rs->where);
    if (count > cap)
        count = cap;
    memset(scans, 0, sizeof(scans));
    pthread_mutex_lock(&rs->mu);
    scan_round(rs, pat, pl, count, cur, walk, scans, op_deadline);
    for (int i = 0; i < rs->n; i++)
        left += walk[i] == DLOCK__LEFT_OUT;
    if (left > rs->n - rs->quorum) {
        /* a quorum's walk can no longer be complete */
        int answered = 0;
        for (int i = 0; i < rs->n; i++)
            answered += scans[i] != NULL;
        rc = dlock__err(DLOCK_ECONN,
                        "%s: list: %d of %d nodes left out of the walk "
                        "(failed), more than %d: a lock held on a quorum "
                        "could be missed (this page: %d answered)",
                        rs->where, left, rs->n, rs->n - rs->quorum,
                        answered);
        goto done;
    }
    for (int i = 0; i < rs->n; i++)
        nf += scans[i] ? scans[i]->element[1]->elements : 0;
    if (nf && !(names = malloc(nf * sizeof(*names)))) {
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < rs->n; i++) {
        for (size_t k = 0; scans[i] && k < scans[i]->element[1]->elements;
             k++) {
            const redisReply *e = scans[i]->element[1]->element[k];
            const char *nm;
            size_t len;
            if (dlock__redis_key_name(&rs->cfg, e->str, e->len, sfx, &nm,
                                      &len) != 0 ||
                len < plen || memcmp(nm, prefix, plen) != 0)
                continue;
            names[m].name = nm;
            names[m].len = len;
            names[m].from = i;
            m++;
        }
    }
    /* each name once, with the lowest node that found it */
    if (m) {
        qsort(names, m, sizeof(*names), cmp_fname);
        size_t u = 0;
        for (size_t j = 0; j < m; j++)
            if (u == 0 || names[u - 1].len != names[j].len ||
                memcmp(names[u - 1].name, names[j].name, names[j].len) != 0)
                names[u++] = names[j];
        m = u;
        rc = describe_round(rs, names, m, walk, flags, out, op_deadline);
        if (rc)
            goto done;
    }
    rc = dlock__redis_walk_next(rs->n, cur, walk, &out->next);
done:
    pthread_mutex_unlock(&rs->mu);
    for (int i = 0; i < rs->n; i++)
        if (scans[i])
            freeReplyObject(scans[i]);
    free(names);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Break                                                                    */
/* ------------------------------------------------------------------------ */

int dlock__redlock_evict(void *st, const char *name, size_t len,
                         dlock_info *out, int64_t op_deadline)
{
    rl_store *rs = st;
    rl_view vw[MAX_NODES];
    int rc, answered, deleted = 0;

    pthread_mutex_lock(&rs->mu);
    rc = ask_views(rs, name, len, vw, &answered, &deleted, op_deadline);
    if (rc == DLOCK_OK && answered < rs->quorum)
        rc = dlock__redlock_quorum_failure(rs, answered, "break");
    else if (rc == DLOCK_OK) {
        /* what the nodes held just before */
        rc = describe(rs, name, vw, out);
        /* more than N - Q keys gone: no quorum of them is left to anybody */
        if (rc == DLOCK_OK && deleted <= rs->n - rs->quorum)
            rc = DLOCK_ENOTHELD;
    }
    dlock__redlock_round_free(rs);
    pthread_mutex_unlock(&rs->mu);
    return rc;
}
