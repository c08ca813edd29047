/* SPDX-License-Identifier: MIT */
/*
 * zk_queue.c -- the ZooKeeper store's queue (zk.c has the recipe, zk_int.h
 * what the files share): a lock's node path (escaped name under the
 * chroot) and its parents, the EPHEMERAL_SEQUENTIAL children in queue
 * order, one acquisition attempt (create our node, or find it by its
 * nonce after a lost answer; hold when first, else watch the immediate
 * predecessor), and orphans: nodes to delete once their session answers.
 */
#include "zk_int.h"

/* ------------------------------------------------------------------------ */
/* Paths                                                                    */
/* ------------------------------------------------------------------------ */

/* <chroot>/<escaped name>: bytes other than [A-Za-z0-9_-] become %XX, so
 * no name can be ".", "..", contain "/" or collide with another. */
void dlock__zk_lock_path(const zk_store *zs, const char *name, size_t len,
                         char *out)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = (size_t)snprintf(out, ZK_PARENT_MAX, "%s/",
                                strcmp(zs->chroot, "/") ? zs->chroot : "");

    /* at the root, "zookeeper" is the server's own node: escape its first
     * byte (no other name escapes to "%7A...", so names stay distinct) */
    int reserved = strcmp(zs->chroot, "/") == 0 && len == 9 &&
                   memcmp(name, "zookeeper", 9) == 0;

    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (reserved && i == 0) {
            out[o++] = '%';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        } else if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
            (ch >= '0' && ch <= '9') || ch == '_' || ch == '-') {
            out[o++] = (char)ch;
        } else {
            out[o++] = '%';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        }
    }
    out[o] = '\0';
}

/* The sequence number at the end of a child's name; -1 if not ours. */

/* The caller's wait is over: its deadline passed, or dlock_cancel() asked
 * (zk_cancel() wakes the sleepers on zs->cv to see it). */
static int wait_ended_now(const dlock__lease *l)
{
    return dlock__now_ms() >= l->deadline || dlock__lease_cancelled(l);
}

static long long child_seq(const char *name)
{
    size_t n = strlen(name);
    long long v = 0;

    if (n < ZK_SEQ_DIGITS + 3 ||
        (strncmp(name, "l-", 2) != 0 && strncmp(name, "r-", 2) != 0 &&
         dlock__zk_permits_of(name) <= 0))
        return -1;
    for (size_t i = n - ZK_SEQ_DIGITS; i < n; i++) {
        if (name[i] < '0' || name[i] > '9')
            return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

static int cmp_child(const void *a, const void *b)
{
    long long x = child_seq(*(char *const *)a);
    long long y = child_seq(*(char *const *)b);

    return x < y ? -1 : x > y;
}

int dlock__zk_is_reader(const char *child)
{
    return child[0] == 'r';
}

long dlock__zk_permits_of(const char *child)
{
    char *end = NULL;
    long n;

    if (child[0] != 's' || child[1] < '1' || child[1] > '9')
        return 0;
    n = strtol(child + 1, &end, 10);
    return end && *end == '-' && n > 0 && n <= DLOCK_PERMITS_MAX ? n : 0;
}

/* Is our node's kind at odds with the others' (a lock's name used as a
 * semaphore, or a semaphore of another N)? The refusal, or DLOCK_OK. */
static int kind_clash(const zk_store *zs, const dlock__lease *l,
                      const struct String_vector *v, int32_t n)
{
    for (int32_t i = 0; i < n; i++) {
        long p = dlock__zk_permits_of(v->data[i]);
        if (l->kind == DLOCK__PERMIT && p == 0)
            return dlock__err(DLOCK_EINVAL,
                              "zk %s: lock '%.200s' is held or awaited as a "
                              "lock, not as a semaphore",
                              zs->redacted, l->name);
        if (l->kind != DLOCK__PERMIT && p > 0)
            return dlock__err(DLOCK_EINVAL,
                              "zk %s: lock '%.200s' is a semaphore of %ld "
                              "permits, not a lock",
                              zs->redacted, l->name, p);
        if (l->kind == DLOCK__PERMIT && p != (long)l->permits)
            return dlock__err(DLOCK_EINVAL,
                              "zk %s: lock '%.200s' is a semaphore of %ld "
                              "permits, not %u (every handle of a name must "
                              "say the same)",
                              zs->redacted, l->name, p, l->permits);
    }
    return DLOCK_OK;
}

/* Sorts the lock children in queue order, dropping foreign names; returns
 * how many remain at the front. */
int32_t dlock__zk_sort_children(struct String_vector *v)
{
    int32_t n = 0;

    for (int32_t i = 0; i < v->count; i++) {
        if (child_seq(v->data[i]) >= 0) {
            char *t = v->data[n];
            v->data[n++] = v->data[i];
            v->data[i] = t;
        }
    }
    if (n > 1)
        qsort(v->data, (size_t)n, sizeof(char *), cmp_child);
    return n;
}

/* Creates the chroot's nodes (persistent) and the lock's parent
 * (container) when missing. */
static int make_parents(zk_store *zs, zk_session *s, const char *parent,
                        int64_t deadline)
{
    char buf[ZK_PATH_MAX];
    size_t plen = strlen(parent);

    memcpy(buf, parent, plen + 1);
    for (size_t i = 1; i <= plen; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char saved = buf[i];
        buf[i] = '\0';
        int zrc = dlock__zk_call(zs, s, C_CREATE, buf, NULL, -1,
                                 i == plen ? ZOO_CONTAINER : ZOO_PERSISTENT,
                                 deadline, NULL);
        buf[i] = saved;
        if (zrc != ZOK && zrc != ZNODEEXISTS)
            return dlock__zk_error(zs, "creating the lock's parent node", zrc);
    }
    return DLOCK_OK;
}

/* ------------------------------------------------------------------------ */
/* Orphans: nodes to delete once the session answers again                  */
/* ------------------------------------------------------------------------ */

void dlock__zk_orphan_add(zk_store *zs, uint64_t sid, const char *path,
                          int prefix)
{
    zk_orphan *o = calloc(1, sizeof(*o));

    if (!o)
        return; /* the node goes when the session ends */
    o->path = strdup(path);
    if (!o->path) {
        free(o);
        return;
    }
    o->sid = sid;
    o->prefix = prefix;
    pthread_mutex_lock(&zs->mu);
    o->next = zs->orphans;
    zs->orphans = o;
    pthread_mutex_unlock(&zs->mu);
    dlock__zk_arm_timer(zs, dlock__now_ms() + 200);
}

/* Deletes node `path`, or (prefix) the child of its parent whose name
 * starts with its last component. ZOK when gone. */
int dlock__zk_delete_node(zk_store *zs, zk_session *s, const char *path,
                          int prefix, int64_t deadline)
{
    char full[ZK_PATH_MAX];
    zk_op *op = NULL;
    int zrc;

    if (!prefix) {
        zrc = dlock__zk_call(zs, s, C_DELETE, path, NULL, 0, 0, deadline,
                             NULL);
        return zrc == ZNONODE ? ZOK : zrc;
    }
    const char *slash = strrchr(path, '/');
    size_t plen = (size_t)(slash - path);
    char parent[ZK_PARENT_MAX];
    if (plen >= sizeof(parent))
        return ZBADARGUMENTS;
    memcpy(parent, path, plen);
    parent[plen] = '\0';
    zrc = dlock__zk_call(zs, s, C_CHILDREN, parent, NULL, 0, 0, deadline, &op);
    if (zrc == ZNONODE)
        return ZOK;
    if (zrc != ZOK)
        return zrc;
    for (int32_t i = 0; i < op->kids.count; i++) {
        if (strncmp(op->kids.data[i], slash + 1, strlen(slash + 1)) == 0) {
            snprintf(full, sizeof(full), "%s/%.100s", parent,
                     op->kids.data[i]);
            zrc = dlock__zk_call(zs, s, C_DELETE, full, NULL, 0, 0,
                                 deadline, NULL);
            if (zrc == ZNONODE)
                zrc = ZOK;
            break;
        }
    }
    dlock__zk_op_put(op);
    return zrc;
}

/* Finds our node among `v` (sorted); index or -1. */
static int32_t find_mine(const struct String_vector *v, int32_t n,
                         const char *base)
{
    for (int32_t i = 0; i < n; i++)
        if (strcmp(v->data[i], base) == 0)
            return i;
    return -1;
}

/* Deletes our node after a failed or abandoned wait; an unanswered delete
 * leaves it to the background thread. */
static void give_up_node(zk_store *zs, zk_session *s, zk_lease *zl)
{
    int zrc = dlock__zk_delete_node(zs, s, zl->path, 0,
                                    dlock__now_ms() + zs->timeout_ms);

    if (zrc != ZOK && zrc != ZSESSIONEXPIRED && zrc != ZINVALIDSTATE)
        dlock__zk_orphan_add(zs, s->sid, zl->path, 0);
    zl->path[0] = '\0';
}

/* A wait that ended without the lock (outcome 1 the session expired:
 * start again; 2 the deadline; 3 an error, zrc): what the attempt
 * returns, our node given up. */
static int wait_ended(zk_store *zs, zk_session *s, zk_lease *zl,
                      dlock__lease *l, int outcome, const char *what,
                      int zrc)
{
    if (outcome == 1)
        return 1;
    give_up_node(zs, s, zl);
    if (outcome == 2) {
        l->retry_ms = -1;
        return DLOCK_EBUSY;
    }
    return dlock__zk_error(zs, what, zrc);
}

/* A permit taken after a wait: our node's data changes, which wakes the
 * waiter behind us (it watches our node): it is now the head of the
 * waiters, and watches the holders. Best effort: a successor that missed
 * it is woken by the next holder's going or its own deadline. */
static void permit_taken(zk_store *zs, zk_session *s, zk_lease *zl,
                         int64_t op_ms)
{
    (void)dlock__zk_call(zs, s, C_SET, zl->path, "held", 4, 0,
                         dlock__now_ms() + op_ms, NULL);
}

/* The head of a semaphore's waiters (position `me` == N): watches every
 * holder's node (the first N) and sleeps until one goes or changes, the
 * session ends or l->deadline. 0 look again, 1 expired, 2 deadline, 3
 * error. */
static int watch_holders(zk_store *zs, zk_session *s, const char *parent,
                         const struct String_vector *kids, int32_t me,
                         const dlock__lease *l, int64_t op_ms)
{
    zk_watch *ws = calloc((size_t)me, sizeof(*ws));
    char *paths = malloc((size_t)me * ZK_PATH_MAX);
    int outcome = 0, gone = 0;

    if (!ws || !paths) {
        free(ws);
        free(paths);
        return 3;
    }
    pthread_mutex_lock(&zs->mu);
    for (int32_t i = 0; i < me; i++) {
        snprintf(paths + (size_t)i * ZK_PATH_MAX, ZK_PATH_MAX, "%s/%.100s",
                 parent, kids->data[i]);
        ws[i].path = paths + (size_t)i * ZK_PATH_MAX;
        ws[i].sid = s->sid;
        ws[i].next = zs->watches;
        zs->watches = &ws[i];
    }
    pthread_mutex_unlock(&zs->mu);
    for (int32_t i = 0; i < me && !gone && outcome == 0; i++) {
        int zrc = dlock__zk_call(zs, s, C_WEXISTS, ws[i].path, NULL, 0, 0,
                                 dlock__now_ms() + op_ms, NULL);
        if (zrc == ZNONODE)
            gone = 1; /* a holder went already: look again */
        else if (zrc == ZSESSIONEXPIRED || zrc == ZINVALIDSTATE)
            outcome = 1;
        else if (zrc != ZOK)
            outcome = 3;
    }
    pthread_mutex_lock(&zs->mu);
    while (outcome == 0 && !gone) {
        for (int32_t i = 0; i < me; i++)
            gone |= ws[i].fired;
        if (gone)
            break;
        if (s->state == S_EXPIRED)
            outcome = 1;
        else if (s->state == S_CONNECTING && s->declared_lost)
            outcome = 3;
        else if (wait_ended_now(l))
            outcome = 2;
        else
            dlock__cond_wait_until(&zs->cv, &zs->mu, l->deadline);
    }
    for (int32_t i = 0; i < me; i++)
        for (zk_watch **pp = &zs->watches; *pp; pp = &(*pp)->next)
            if (*pp == &ws[i]) {
                *pp = ws[i].next;
                break;
            }
    pthread_mutex_unlock(&zs->mu);
    free(ws);
    free(paths);
    return outcome;
}

/* The attempt ends with the lock: DLOCK_OK, or 2 when our node was
 * deleted meanwhile (a break saw it holding before we knew). */
static int hold_it(zk_store *zs, zk_lease *zl)
{
    if (dlock__zk_mine_hold(zs, zl) == 0)
        return DLOCK_OK;
    zl->path[0] = '\0';
    return 2;
}

/* One acquisition attempt in session s; DLOCK_OK, DLOCK_EBUSY, an error,
 * 1 = the session expired underneath (start again), or 2 = our node was
 * deleted by someone else before we held it (start again). */
int dlock__zk_acquire_in(zk_store *zs, zk_session *s, dlock__lease *l,
                         int64_t op_ms)
{
    zk_lease *zl = l->priv;
    char parent[ZK_PARENT_MAX], prefix[ZK_PATH_MAX], data[256];
    unsigned char nonce[8];
    const char *base;
    zk_op *op = NULL;
    int zrc, dlen, waited = 0;
    uint64_t czxid;

    dlock__zk_lock_path(zs, l->name, l->name_len, parent);
    if (dlock__random(nonce, sizeof(nonce)) != 0)
        return dlock__err(DLOCK_EPROTO, "no random bytes for a node name");
    /* "l-" a writer (an exclusive hold), "r-" a reader (shared), "s<N>-"
     * a permit of a semaphore of N */
    char kind[16];
    if (l->kind == DLOCK__PERMIT)
        snprintf(kind, sizeof(kind), "s%u", l->permits);
    else
        snprintf(kind, sizeof(kind), "%c", l->kind == DLOCK__READ ? 'r' : 'l');
    snprintf(prefix, sizeof(prefix), "%s/%s-%02x%02x%02x%02x%02x%02x%02x%02x-",
             parent, kind, nonce[0], nonce[1], nonce[2], nonce[3], nonce[4],
             nonce[5], nonce[6], nonce[7]);
    dlen = snprintf(data, sizeof(data), "%s\n%s", l->owner, l->desc);
    if (dlen >= (int)sizeof(data))
        dlen = (int)sizeof(data) - 1;

    /* create our node (and the parents when missing) */
    for (int attempt = 0;; attempt++) {
        zrc = dlock__zk_call(zs, s, C_CREATE, prefix, data, dlen,
                             ZOO_EPHEMERAL_SEQUENTIAL,
                             dlock__now_ms() + op_ms, &op);
        if (zrc == ZNONODE && attempt < 4) {
            int rc = make_parents(zs, s, parent, dlock__now_ms() + op_ms);
            if (rc)
                return rc;
            continue;
        }
        break;
    }
    if (zrc == ZSESSIONEXPIRED || zrc == ZINVALIDSTATE)
        return 1;
    if (zrc != ZOK) {
        if (zrc == ZCONNECTIONLOSS || zrc == ZOPERATIONTIMEOUT)
            dlock__zk_orphan_add(zs, s->sid, prefix, 1); /* it may exist */
        return dlock__zk_error(zs, "creating the lock node", zrc);
    }
    snprintf(zl->path, sizeof(zl->path), "%s", op->str);
    zl->sid = s->sid;
    czxid = (uint64_t)op->stat.czxid;
    dlock__zk_op_put(op);
    op = NULL;
    base = strrchr(zl->path, '/') + 1;

    /* the watch on our own node (zk_operate.c): sent now, answered before
     * the listing below */
    zk_op *mop = dlock__zk_mine_start(zs, s, zl, &zrc);
    if (!mop) {
        pthread_mutex_lock(&zs->mu);
        zl->recheck = 1; /* set it once the session answers */
        pthread_mutex_unlock(&zs->mu);
        dlock__loop_wake(zs->client);
    }

    for (;;) {
        char pred[ZK_PATH_MAX];
        int32_t n, me;

        zrc = dlock__zk_call(zs, s, C_CHILDREN, parent, NULL, 0, 0,
                             dlock__now_ms() + op_ms, &op);
        if (mop) {
            int mrc = dlock__zk_op_wait(mop, dlock__now_ms() + op_ms);
            dlock__zk_op_put(mop);
            mop = NULL;
            pthread_mutex_lock(&zs->mu);
            if (mrc == ZNONODE)
                zl->gone = 1; /* deleted already */
            else if (mrc != ZOK)
                zl->recheck = 1; /* set it once the session answers */
            pthread_mutex_unlock(&zs->mu);
            if (mrc != ZOK && mrc != ZNONODE)
                dlock__loop_wake(zs->client);
        }
        if (zrc == ZSESSIONEXPIRED || zrc == ZINVALIDSTATE)
            return 1;
        if (zrc != ZOK) {
            give_up_node(zs, s, zl);
            return dlock__zk_error(zs, "listing the lock queue", zrc);
        }
        n = dlock__zk_sort_children(&op->kids);
        me = find_mine(&op->kids, n, base);
        if (me < 0) {
            dlock__zk_op_put(op);
            pthread_mutex_lock(&zs->mu);
            int expired = s->state == S_EXPIRED;
            pthread_mutex_unlock(&zs->mu);
            zl->path[0] = '\0';
            /* else deleted by someone else: a break that saw it holding
             * just as its predecessor went (start again) */
            return expired ? 1 : 2;
        }
        int rc = kind_clash(zs, l, &op->kids, n);
        if (rc) {
            dlock__zk_op_put(op);
            give_up_node(zs, s, zl);
            return rc;
        }
        /* a writer waits for every node before it, a reader for the
         * writers before it: it watches the nearest one (readers ahead
         * of it hold or wait with it); a permit holds among the first N */
        int32_t w_at = me - 1;
        if (l->kind == DLOCK__READ)
            while (w_at >= 0 && dlock__zk_is_reader(op->kids.data[w_at]))
                w_at--;
        if (l->kind == DLOCK__PERMIT && me < (int32_t)l->permits)
            w_at = -1;
        if (w_at < 0) {
            dlock__zk_op_put(op);
            l->token = czxid;
            if (l->kind == DLOCK__PERMIT && waited)
                permit_taken(zs, s, zl, op_ms);
            return hold_it(zs, zl);
        }
        if (l->kind == DLOCK__PERMIT && me == (int32_t)l->permits) {
            /* the head of the waiters: any holder's going lets it in */
            if (wait_ended_now(l)) {
                dlock__zk_op_put(op);
                give_up_node(zs, s, zl);
                l->retry_ms = -1;
                return DLOCK_EBUSY;
            }
            waited = 1;
            int outcome = watch_holders(zs, s, parent, &op->kids, me, l,
                                        op_ms);
            dlock__zk_op_put(op);
            op = NULL;
            if (outcome != 0)
                return wait_ended(zs, s, zl, l, outcome, "waiting for a permit",
                                  ZCONNECTIONLOSS);
            l->woken_us = dlock__now_us(); /* for the metrics */
            continue;
        }
        waited = 1;
        snprintf(pred, sizeof(pred), "%s/%.100s", parent,
                 op->kids.data[w_at]);
        dlock__zk_op_put(op);
        op = NULL;
        if (wait_ended_now(l)) {
            give_up_node(zs, s, zl);
            l->retry_ms = -1;
            return DLOCK_EBUSY;
        }

        /* watch the predecessor only */
        zk_watch w = {pred, s->sid, 0, 0, NULL, NULL};
        pthread_mutex_lock(&zs->mu);
        w.next = zs->watches;
        zs->watches = &w;
        int64_t session_ms = s->timeout > 0 ? s->timeout : l->ttl_ms;
        pthread_mutex_unlock(&zs->mu);
        int64_t t_watch = dlock__now_ms(); /* the server hears from us */
        zrc = dlock__zk_call(zs, s, C_WEXISTS, pred, NULL, 0, 0,
                             dlock__now_ms() + op_ms, NULL);
        int outcome = 0; /* 0 re-check, 1 expired, 2 deadline, 3 error */
        pthread_mutex_lock(&zs->mu);
        if (zrc == ZOK) {
            while (!w.fired && s->state != S_EXPIRED &&
                   !(s->state == S_CONNECTING && s->declared_lost) &&
                   !wait_ended_now(l))
                dlock__cond_wait_until(&zs->cv, &zs->mu, l->deadline);
            if (w.fired) {
                outcome = 0;
                l->woken_us = dlock__now_us(); /* for the metrics */
            } else if (s->state == S_EXPIRED)
                outcome = 1;
            else if (s->state == S_CONNECTING)
                outcome = 3;
            else
                outcome = 2;
        } else if (zrc == ZNONODE) {
            outcome = 0; /* gone already: look again */
        } else if (zrc == ZSESSIONEXPIRED || zrc == ZINVALIDSTATE) {
            outcome = 1;
        } else {
            outcome = 3;
        }
        for (zk_watch **pp = &zs->watches; *pp; pp = &(*pp)->next) {
            if (*pp == &w) {
                *pp = w.next;
                break;
            }
        }
        pthread_mutex_unlock(&zs->mu);
        /* The node we watched was the head and is gone: every node
         * before ours is gone or a reader (and we read), every node
         * created since has a higher sequence: ours, no need to list the
         * queue again. That saves a round trip per hand-off. */
        /* ... unless the wait lasted as long as our session may: a
         * process stopped past its session timeout wakes to the buffered
         * deletion of its predecessor before it learns that its session
         * (and our node with it) ended meanwhile, and the lock is someone
         * else's. Then the listing below settles it (it fails on an ended
         * session). Found by the safety suite's mixed waiter-stop. */
        if (outcome == 0 && w_at == 0 && l->kind != DLOCK__PERMIT &&
            (w.deleted || zrc == ZNONODE) &&
            dlock__now_ms() - t_watch <
                session_ms - dlock__lease_margin(session_ms)) {
            l->token = czxid;
            return hold_it(zs, zl);
        }
        if (outcome != 0)
            return wait_ended(zs, s, zl, l, outcome, "waiting for the lock",
                              zrc == ZOK ? ZCONNECTIONLOSS : zrc);
    }
}
