/* SPDX-License-Identifier: MIT */
/*
 * zk_operate.c -- the ZooKeeper store seen by an operator (zk.c has the
 * recipe, zk_int.h what the files share): inspect, list and break.
 *
 * Inspect: the lock node's children, then every child's data at once;
 * the first child still there holds (with the readers right after a
 * reader at the head, or a semaphore's first N), the rest wait.
 *
 * List: one getChildren of the chroot (every lock name; a container node
 * goes about a minute after its last child, so a free lock may still be
 * there), the names decoded, matched against the prefix as bytes, sorted
 * as bytes, and paged in the client from the cursor: the escaped node
 * name of the last lock listed ([A-Za-z0-9_%-] only). Each lock of a page
 * is inspected as above, the getChildren calls of the whole page sent at
 * once.
 *
 * Break: the holders' nodes (as inspect finds them) deleted in one multi,
 * which ZooKeeper applies all or none. A holder that released meanwhile
 * makes the multi fail (no node): then it looks again, so the break takes
 * whatever holds the lock at the moment it is applied, never a node it did
 * not see as a holder. Any session may delete another's ephemeral node
 * (the ACL of the lock's node permitting: with digest auth, the same
 * identity). Waiters watch their predecessors, so the deletes wake them as
 * a release would. Tokens are creation zxids: every node created after
 * the break, and every waiter's node (created after the holders', which
 * head the queue), has a greater one.
 *
 * The watch each of our lock nodes keeps on itself is in zk_mine.c.
 */
#include "zk_int.h"

#include "hex.h"

/* ------------------------------------------------------------------------ */
/* Names                                                                    */
/* ------------------------------------------------------------------------ */

long dlock__zk_unescape(const zk_store *zs, const char *comp, char *out)
{
    char again[ZK_PARENT_MAX];
    size_t n = 0, cl;

    for (size_t i = 0; comp[i]; i++) {
        unsigned char ch = (unsigned char)comp[i];
        if (n >= DLOCK_NAME_MAX)
            return -1;
        if (ch == '%') {
            int hi = dlock__hexval(comp[i + 1]);
            int lo = hi < 0 ? -1 : dlock__hexval(comp[i + 2]);
            if (lo < 0)
                return -1;
            out[n++] = (char)(hi * 16 + lo);
            i += 2;
        } else if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                   (ch >= '0' && ch <= '9') || ch == '_' || ch == '-') {
            out[n++] = (char)ch;
        } else {
            return -1;
        }
    }
    out[n] = '\0';
    if (n == 0 || memchr(out, '\0', n))
        return -1; /* no lock is called "" or holds a NUL */
    /* only the way dlock writes it: one node per name */
    dlock__zk_lock_path(zs, out, n, again);
    cl = strcmp(zs->chroot, "/") ? strlen(zs->chroot) : 0;
    if (strcmp(again + cl + 1, comp) != 0)
        return -1;
    return (long)n;
}

/* ------------------------------------------------------------------------ */
/* Inspect                                                                  */
/* ------------------------------------------------------------------------ */

zk_session *dlock__zk_any_session(zk_store *zs, int64_t deadline, int *rc)
{
    zk_session *s;

    pthread_mutex_lock(&zs->mu);
    dlock__zk_sessions_retire(zs);
    for (s = zs->sessions; s; s = s->next)
        if (s->state == S_CONNECTED)
            break;
    if (s)
        s->refs++;
    else
        s = dlock__zk_session_get(zs, 30000, deadline, rc);
    pthread_mutex_unlock(&zs->mu);
    return s;
}

/*
 * The queue `kids` (the children of `parent`, as listed) described into
 * *out: every child's data read at once, those deleted since skipped.
 * With `holders`, *holders gets the holders' child names (pointers into
 * kids, malloc'd array) and *nh their count.
 */
static int describe_queue(zk_store *zs, zk_session *s, const char *parent,
                          zk_op *kids, dlock_info *out, int64_t op_deadline,
                          char ***holders, int *nh)
{
    char path[ZK_PATH_MAX];
    zk_op **ops = NULL;
    int32_t n;
    int rc = DLOCK_OK, zrc;

    n = dlock__zk_sort_children(&kids->kids);
    out->waiters = n > 0 ? n - 1 : 0;
    if (n == 0)
        return DLOCK_OK;
    /* fetch every node's data at once, then wait for all */
    ops = calloc((size_t)n, sizeof(*ops));
    if (holders && ops)
        *holders = calloc((size_t)n, sizeof(char *));
    if (!ops || (holders && !*holders)) {
        free(ops);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    int start_zrc = ZOK; /* the first read that could not be sent */
    for (int32_t i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "%s/%.100s", parent,
                 kids->kids.data[i]);
        ops[i] = dlock__zk_call_start(zs, s, C_GET, path, NULL, 0, 0, &zrc);
        if (!ops[i] && start_zrc == ZOK)
            start_zrc = zrc;
    }
    if (n > 1) {
        out->queue = calloc((size_t)n, sizeof(char *));
        if (!out->queue)
            rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    int readers = 0, queued = 0;
    for (int32_t i = 0; i < n; i++)
        readers |= dlock__zk_is_reader(kids->kids.data[i]);
    out->permits = dlock__zk_permits_of(kids->kids.data[0]);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t nowwall = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    for (int32_t i = 0; i < n; i++) {
        const char *desc = "?";
        if (!ops[i]) {
            /* not sent (the session between servers, say): an answer
             * without that node would be wrong, not merely old */
            if (rc == DLOCK_OK)
                rc = dlock__zk_error(zs, "reading a lock node", start_zrc);
            continue;
        }
        zrc = dlock__zk_op_wait(ops[i], op_deadline);
        if (zrc == ZOK) {
            const char *nl = strchr(ops[i]->data, '\n');
            desc = nl ? nl + 1 : ops[i]->data;
        } else if (zrc != ZNONODE && rc == DLOCK_OK) {
            rc = dlock__zk_error(zs, "reading a lock node", zrc);
        }
        /* Nodes deleted since the listing are skipped: the first one still
         * there holds the lock (every lower one is gone, every newer one
         * is higher), the rest wait. So held, holder, waiters and queue
         * always agree, even in the middle of a hand-off. */
        int reader = dlock__zk_is_reader(kids->kids.data[i]);
        if (zrc != ZOK) {
            /* gone, or unreadable: not part of the answer */
        } else if (!out->held || (out->shared && reader && !queued) ||
                   (out->permits > 0 && out->holders < out->permits &&
                    !queued)) {
            /* the holders: the first node, and the readers right
             * after a reader at the head */
            if (!out->held) {
                snprintf(out->holder, sizeof(out->holder), "%s", desc);
                out->held_ms = nowwall - ops[i]->stat.ctime;
                if (out->held_ms < 0)
                    out->held_ms = 0;
            }
            out->held = 1;
            out->shared = reader;
            out->holders++;
            if ((uint64_t)ops[i]->stat.czxid > out->token)
                out->token = (uint64_t)ops[i]->stat.czxid;
            if (holders)
                (*holders)[(*nh)++] = kids->kids.data[i];
        } else if (out->queue) {
            char line[320];
            queued = 1;
            if (readers)
                snprintf(line, sizeof(line), "%s: %s",
                         reader ? "read" : "write", desc);
            else
                snprintf(line, sizeof(line), "%s", desc);
            char *d = strdup(line);
            if (!d && rc == DLOCK_OK)
                rc = dlock__err(DLOCK_ENOMEM, "out of memory");
            if (d)
                out->queue[out->queue_len++] = d;
        } else {
            queued = 1;
        }
        dlock__zk_op_put(ops[i]);
    }
    out->waiters = (int64_t)out->queue_len;
    if (n > 1 && !out->queue)
        out->waiters = n - 1; /* out of memory: the count from the list */
    if (out->permits > 0 && out->held)
        snprintf(out->holder, sizeof(out->holder), "%lld of %lld permits",
                 (long long)out->holders, (long long)out->permits);
    free(ops);
    return rc;
}

/* inspect in session s: the queue listed, then described. */
static int inspect_in(zk_store *zs, zk_session *s, const char *name,
                      size_t len, dlock_info *out, int64_t op_deadline,
                      zk_op **kids_out, char ***holders, int *nh)
{
    char parent[ZK_PARENT_MAX];
    zk_op *kids = NULL;
    int rc, zrc;

    out->ttl_ms = -1;
    out->held_ms = -1;
    dlock__zk_lock_path(zs, name, len, parent);
    zrc = dlock__zk_call(zs, s, C_CHILDREN, parent, NULL, 0, 0, op_deadline,
                         &kids);
    if (zrc == ZNONODE) {
        out->waiters = 0;
        return DLOCK_OK;
    }
    if (zrc != ZOK)
        return dlock__zk_error(zs, "listing the lock queue", zrc);
    rc = describe_queue(zs, s, parent, kids, out, op_deadline, holders, nh);
    if (kids_out && rc == DLOCK_OK)
        *kids_out = kids;
    else
        dlock__zk_op_put(kids);
    return rc;
}

int dlock__zk_inspect(void *st, const char *name, size_t len,
                      dlock_info *out, int64_t op_deadline)
{
    zk_store *zs = st;
    zk_session *s;
    int rc = DLOCK_OK;

    s = dlock__zk_any_session(zs, op_deadline, &rc);
    if (!s)
        return rc;
    rc = inspect_in(zs, s, name, len, out, op_deadline, NULL, NULL, NULL);
    dlock__zk_session_put(zs, s);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* List                                                                     */
/* ------------------------------------------------------------------------ */

typedef struct cand {
    const char *comp; /* the child of the chroot (escaped name) */
    char *name;       /* the lock name */
    size_t len;
} cand;

static int cmp_name(const char *a, size_t al, const char *b, size_t bl)
{
    int c = memcmp(a, b, al < bl ? al : bl);
    return c ? c : (al > bl) - (al < bl);
}

static int cmp_cand(const void *x, const void *y)
{
    const cand *a = x, *b = y;
    return cmp_name(a->name, a->len, b->name, b->len);
}

int dlock__zk_list(void *st, const char *prefix, size_t plen,
                   const char *cursor, size_t limit, unsigned flags,
                   dlock_list_page *out, int64_t op_deadline)
{
    zk_store *zs = st;
    char after[DLOCK_NAME_MAX + 1], tmp[DLOCK_NAME_MAX + 1];
    long alen = -1;
    zk_session *s;
    zk_op *root = NULL, **kids = NULL;
    cand *cs = NULL;
    size_t nc = 0, take;
    int rc = DLOCK_OK, zrc;

    if (cursor[0]) {
        alen = strlen(cursor) <= 3 * DLOCK_NAME_MAX
                   ? dlock__zk_unescape(zs, cursor, after)
                   : -1;
        if (alen < 0)
            return dlock__err(DLOCK_EINVAL,
                              "zk %s: the cursor is not one this store made "
                              "(an escaped lock name)",
                              zs->redacted);
    }
    s = dlock__zk_any_session(zs, op_deadline, &rc);
    if (!s)
        return rc;
    zrc = dlock__zk_call(zs, s, C_CHILDREN, zs->chroot, NULL, 0, 0,
                         op_deadline, &root);
    if (zrc == ZNONODE) {
        dlock__zk_session_put(zs, s);
        return DLOCK_OK; /* no lock was ever taken under this chroot */
    }
    if (zrc != ZOK) {
        dlock__zk_session_put(zs, s);
        return dlock__zk_error(zs, "listing the locks", zrc);
    }
    /* the lock names after the cursor that start with the prefix */
    if (root->kids.count > 0 &&
        !(cs = calloc((size_t)root->kids.count, sizeof(*cs))))
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    for (int32_t i = 0; rc == DLOCK_OK && i < root->kids.count; i++) {
        long n = dlock__zk_unescape(zs, root->kids.data[i], tmp);
        if (n < 0 || (size_t)n < plen || memcmp(tmp, prefix, plen) != 0 ||
            (alen >= 0 && cmp_name(tmp, (size_t)n, after, (size_t)alen) <= 0))
            continue;
        cs[nc].comp = root->kids.data[i];
        cs[nc].len = (size_t)n;
        if (!(cs[nc].name = malloc((size_t)n + 1))) {
            rc = dlock__err(DLOCK_ENOMEM, "out of memory");
            break;
        }
        memcpy(cs[nc].name, tmp, (size_t)n + 1);
        nc++;
    }
    if (rc == DLOCK_OK && nc > 1)
        qsort(cs, nc, sizeof(*cs), cmp_cand);
    take = nc < limit ? nc : limit;
    /* the page's queues: every getChildren sent at once */
    if (rc == DLOCK_OK && take > 0 && !(kids = calloc(take, sizeof(*kids))))
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    for (size_t i = 0; rc == DLOCK_OK && i < take; i++) {
        char parent[ZK_PARENT_MAX];
        dlock__zk_lock_path(zs, cs[i].name, cs[i].len, parent);
        kids[i] = dlock__zk_call_start(zs, s, C_CHILDREN, parent, NULL, 0, 0,
                                       &zrc);
        if (!kids[i])
            rc = dlock__zk_error(zs, "listing a lock queue", zrc);
    }
    for (size_t i = 0; rc == DLOCK_OK && i < take; i++) {
        char parent[ZK_PARENT_MAX];
        dlock_info info;
        memset(&info, 0, sizeof(info));
        info.ttl_ms = -1;
        info.held_ms = -1;
        zrc = dlock__zk_op_wait(kids[i], op_deadline);
        if (zrc == ZNONODE)
            continue; /* the container went meanwhile: nothing left */
        if (zrc != ZOK) {
            rc = dlock__zk_error(zs, "listing a lock queue", zrc);
            break;
        }
        dlock__zk_lock_path(zs, cs[i].name, cs[i].len, parent);
        rc = describe_queue(zs, s, parent, kids[i], &info, op_deadline,
                            NULL, NULL);
        if (rc == DLOCK_OK && (info.held || info.waiters > 0 ||
                               (flags & DLOCK_LIST_FREE)))
            rc = dlock__list_add(out, cs[i].name, cs[i].len, &info);
        else
            dlock_info_clear(&info);
    }
    if (rc == DLOCK_OK && nc > take && !(out->next = strdup(cs[take - 1].comp)))
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    for (size_t i = 0; kids && i < take; i++)
        if (kids[i])
            dlock__zk_op_put(kids[i]);
    free(kids);
    for (size_t i = 0; i < nc; i++)
        free(cs[i].name);
    free(cs);
    dlock__zk_op_put(root);
    dlock__zk_session_put(zs, s);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Break                                                                    */
/* ------------------------------------------------------------------------ */

#define EVICT_TRIES 16 /* a holder that releases meanwhile: look again */

int dlock__zk_evict(void *st, const char *name, size_t len,
                    dlock_info *out, int64_t op_deadline)
{
    zk_store *zs = st;
    char parent[ZK_PARENT_MAX];
    zk_session *s;
    int rc = DLOCK_OK;

    s = dlock__zk_any_session(zs, op_deadline, &rc);
    if (!s)
        return rc;
    dlock__zk_lock_path(zs, name, len, parent);
    for (int attempt = 0;; attempt++) {
        zk_op *kids = NULL, *op = NULL;
        char **holders = NULL, **paths = NULL;
        int nh = 0, zrc = ZOK;

        dlock_info_clear(out);
        memset(out, 0, sizeof(*out));
        rc = inspect_in(zs, s, name, len, out, op_deadline, &kids, &holders,
                        &nh);
        if (rc == DLOCK_OK && !out->held)
            rc = DLOCK_ENOTHELD; /* nothing to do: the view is filled */
        if (rc == DLOCK_OK && !(paths = calloc((size_t)nh, sizeof(char *))))
            rc = dlock__err(DLOCK_ENOMEM, "out of memory");
        for (int i = 0; rc == DLOCK_OK && i < nh; i++) {
            if (!(paths[i] = malloc(ZK_PATH_MAX)))
                rc = dlock__err(DLOCK_ENOMEM, "out of memory");
            else
                snprintf(paths[i], ZK_PATH_MAX, "%s/%.100s", parent,
                         holders[i]);
        }
        if (rc == DLOCK_OK) {
            /* every holder's node, all or none */
            op = dlock__zk_multi_delete_start(zs, s, paths, nh, &zrc);
            if (op)
                zrc = dlock__zk_op_wait(op, op_deadline);
            if (op)
                dlock__zk_op_put(op);
            if (zrc == ZNONODE && attempt + 1 < EVICT_TRIES)
                rc = 1; /* one of them went meanwhile: look again */
            else if (zrc == ZNONODE)
                rc = dlock__err(DLOCK_ECONN,
                                "zk %s: lock '%.200s': its holders changed "
                                "during each of %d tries; try again",
                                zs->redacted, name, EVICT_TRIES);
            else if (zrc != ZOK)
                rc = dlock__zk_error(zs, "deleting the holders' nodes", zrc);
        }
        for (int i = 0; paths && i < nh; i++)
            free(paths[i]);
        free(paths);
        free(holders);
        if (kids)
            dlock__zk_op_put(kids);
        if (rc != 1)
            break;
    }
    dlock__zk_session_put(zs, s);
    return rc;
}
