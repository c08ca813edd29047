/* SPDX-License-Identifier: MIT */
/*
 * zk.c -- the ZooKeeper store.
 *
 * The seeds' recipe, with the corrections the mature clients (Curator)
 * learned:
 *  - Lock name N is the znode <chroot>/<escaped N>, a CONTAINER node (the
 *    server deletes it once it has no children, so millions of names leave
 *    nothing behind). Every acquisition creates an EPHEMERAL_SEQUENTIAL
 *    child "l-<nonce>-<seq>" whose data is "<owner>\n<description>".
 *  - The child with the lowest sequence holds the lock. Every other one
 *    watches only its immediate predecessor (an exists watch), so a release
 *    wakes exactly one waiter: FIFO, no herd. DLOCK_FAIR changes nothing.
 *  - The nonce in the node name makes a create whose answer was lost to a
 *    connection drop recoverable: the client finds its node by the nonce
 *    instead of leaving a phantom in the queue.
 *  - Fencing token: the holder node's creation zxid (czxid), which grows
 *    with every write to the ensemble.
 *  - Liveness is the session. A lock's ttl_ms is the timeout of the session
 *    it lives in: the store keeps one session per distinct ttl (the server
 *    clamps it to its [minSessionTimeout, maxSessionTimeout]). Nothing is
 *    renewed by dlock; the ZooKeeper client pings.
 *  - Session expiry -> every hold in it is lost (callback, DLOCK_ELOST). A
 *    connection that stays down for a third of the session timeout -> the
 *    holds are declared lost too: the client cannot tell whether the
 *    session still lives, and the server may expire it as early as one
 *    timeout after the client last heard from it, which can be 2/3 of a
 *    timeout before the client notices the connection is gone.
 *
 * Every ZooKeeper call is asynchronous with a deadline (the C client's
 * synchronous calls can block for a whole session timeout). An answer that
 * arrives after its caller gave up frees itself. Watch and session events
 * arrive on the C client's completion thread; they only mark state and
 * signal the store's condition variable.
 *
 *  - A holder has nothing to renew, so a node of ours deleted behind our
 *    back (dlock_break(), or by hand) is told by a watch the node keeps on
 *    itself from its creation: its deletion while held is a loss
 *    (zk_operate.c).
 *
 * Files: this one has the backend's slots, the background thread, open
 * and close; zk_conn.c the calls and sessions; zk_queue.c the lock
 * nodes, the queue and its watches, and the orphans; zk_operate.c
 * inspect, list, break and the watch on our own nodes; zk_int.h what they
 * share.
 */
#include "zk_int.h"

static int zk_acquire(void *st, dlock__lease *l, int64_t op_deadline)
{
    zk_store *zs = st;
    int64_t op_ms = op_deadline - dlock__now_ms();
    int rc = DLOCK_ECONN, taken = 0;

    if (op_ms < 1)
        op_ms = 1;
    for (int attempt = 0; attempt < 3; attempt++) {
        zk_session *s;

        pthread_mutex_lock(&zs->mu);
        dlock__zk_sessions_retire(zs);
        s = dlock__zk_session_get(zs, l->ttl_ms, dlock__now_ms() + op_ms, &rc);
        pthread_mutex_unlock(&zs->mu);
        if (!s)
            return rc;
        rc = dlock__zk_acquire_in(zs, s, l, op_ms);
        dlock__zk_session_put(zs, s);
        if (rc != DLOCK_OK)
            dlock__zk_mine_unlink(zs, l->priv);
        if (rc == 2 && taken < 8) {
            /* our node was deleted before we could hold it (a break that
             * saw it as the holder just as its predecessor went): in
             * the queue again, at its end, while the wait lasts */
            taken++;
            attempt--;
            if (dlock__now_ms() < l->deadline && !dlock__lease_cancelled(l))
                continue;
            l->retry_ms = -1;
            return dlock__err(DLOCK_EBUSY,
                              "zk %s: lock '%.200s': our node was deleted "
                              "(broken) as we were about to hold it",
                              zs->redacted, l->name);
        }
        if (rc == 2)
            return dlock__err(DLOCK_ECONN, "zk %s: lock '%.200s': our node "
                                           "was deleted every time",
                              zs->redacted, l->name);
        if (rc != 1)
            return rc;
        rc = dlock__err(DLOCK_ECONN, "zk %s: the session expired while "
                                     "waiting", zs->redacted);
        if ((dlock__now_ms() >= l->deadline && l->deadline != DLOCK__FOREVER) ||
            dlock__lease_cancelled(l))
            break;
    }
    return rc;
}

/* The session a lease lives in, if it is still usable; zs->mu held. */
static zk_session *lease_session(zk_store *zs, const zk_lease *zl)
{
    zk_session *s = dlock__zk_session_by_sid(zs, zl->sid);

    if (!s || s->state == S_EXPIRED || s->state == S_AUTHFAIL)
        return NULL;
    s->refs++;
    return s;
}

/* Call `kind` (C_DELETE, C_EXISTS) on a hold's node until it is
 * answered: a lost connection may hide an expired session (a frozen
 * process learns it only now), so after one it waits for the session's
 * answer, then retries or reports the loss (ZSESSIONEXPIRED). Its
 * ZooKeeper code, and *op as dlock__zk_call() gives it. */
static int call_settled(zk_store *zs, zk_session *s, int kind,
                        const char *path, int64_t op_deadline, zk_op **op)
{
    for (;;) {
        uint64_t gen = dlock__zk_conn_gen(zs, s);
        int zrc = dlock__zk_call(zs, s, kind, path, NULL, 0, 0, op_deadline,
                                 op);
        if ((zrc != ZCONNECTIONLOSS && zrc != ZOPERATIONTIMEOUT) ||
            dlock__now_ms() >= op_deadline)
            return zrc;
        int how = dlock__zk_settle(zs, s, gen, op_deadline);
        if (how == 1)
            return ZSESSIONEXPIRED;
        if (how != 0)
            return zrc;
    }
}

/* The session of a hold, with a reference; NULL when it ended. */
static zk_session *hold_session(zk_store *zs, const zk_lease *zl)
{
    zk_session *s;

    pthread_mutex_lock(&zs->mu);
    s = zl->path[0] ? lease_session(zs, zl) : NULL;
    pthread_mutex_unlock(&zs->mu);
    return s;
}

static int release_in(zk_store *zs, zk_session *s, zk_lease *zl,
                      int64_t op_deadline)
{
    int zrc;

    dlock__zk_mine_releasing(zs, zl); /* our delete's event is ours */
    zrc = call_settled(zs, s, C_DELETE, zl->path, op_deadline, NULL);
    if (zrc == ZOK || zrc == ZNONODE || zrc == ZSESSIONEXPIRED ||
        zrc == ZINVALIDSTATE) {
        zl->path[0] = '\0';
        return zrc == ZOK ? DLOCK_OK
                          : dlock__err(DLOCK_ENOTHELD,
                                       "zk %s: the lock node was already "
                                       "gone",
                                       zs->redacted);
    }
    dlock__zk_orphan_add(zs, s->sid, zl->path, 0);
    zl->path[0] = '\0';
    return dlock__zk_error(zs, "deleting the lock node", zrc);
}

static int zk_release(void *st, dlock__lease *l, int64_t op_deadline)
{
    zk_store *zs = st;
    zk_lease *zl = l->priv;
    zk_session *s;
    int rc;

    s = hold_session(zs, zl);
    if (!s) {
        dlock__zk_mine_unlink(zs, zl);
        zl->path[0] = '\0';
        return dlock__err(DLOCK_ENOTHELD,
                          "zk %s: the session of this hold ended",
                          zs->redacted);
    }
    rc = release_in(zs, s, zl, op_deadline);
    dlock__zk_mine_unlink(zs, zl);
    dlock__zk_session_put(zs, s);
    return rc;
}

static int extend_in(zk_store *zs, zk_session *s, zk_lease *zl,
                     int64_t ttl_ms, int64_t op_deadline)
{
    zk_op *op = NULL;
    int zrc, ours;

    if (ttl_ms != s->ttl)
        return dlock__err(DLOCK_ENOTSUP,
                          "zk: a hold lives as long as its session (ttl "
                          "%lld ms); it cannot change to %lld ms",
                          (long long)s->ttl, (long long)ttl_ms);
    zrc = call_settled(zs, s, C_EXISTS, zl->path, op_deadline, &op);
    if (zrc == ZNONODE || zrc == ZSESSIONEXPIRED || zrc == ZINVALIDSTATE)
        return dlock__err(DLOCK_ENOTHELD, "zk %s: the lock node is gone",
                          zs->redacted);
    if (zrc != ZOK)
        return dlock__zk_error(zs, "checking the lock node", zrc);
    ours = op->stat.ephemeralOwner == zoo_client_id(s->zh)->client_id;
    dlock__zk_op_put(op);
    return ours ? DLOCK_OK
                : dlock__err(DLOCK_ENOTHELD,
                             "zk %s: the lock node belongs to another "
                             "session",
                             zs->redacted);
}

static int zk_extend(void *st, dlock__lease *l, int64_t ttl_ms,
                     int64_t op_deadline)
{
    zk_store *zs = st;
    zk_lease *zl = l->priv;
    zk_session *s;
    int rc;

    s = hold_session(zs, zl);
    if (!s)
        return dlock__err(DLOCK_ENOTHELD,
                          "zk %s: the session of this hold ended",
                          zs->redacted);
    rc = extend_in(zs, s, zl, ttl_ms, op_deadline);
    dlock__zk_session_put(zs, s);
    return rc;
}

/* Leader election: our node's data, "OWNER\nVALUE" (zk_queue.c writes it
 * so), set in place; the node is our session's, so no other owner's is
 * written. Its watchers (zk_elect.c) see the change. */
static int zk_proclaim(void *st, dlock__lease *l, const char *desc,
                       int64_t op_deadline)
{
    zk_store *zs = st;
    zk_lease *zl = l->priv;
    zk_session *s = hold_session(zs, zl);
    char data[512];
    int zrc, n;

    if (!s)
        return dlock__err(DLOCK_ENOTHELD,
                          "zk %s: the session of this hold ended",
                          zs->redacted);
    n = snprintf(data, sizeof(data), "%s\n%s", l->owner, desc);
    zrc = dlock__zk_call(zs, s, C_SET, zl->path, data,
                         n < (int)sizeof(data) ? n : (int)sizeof(data) - 1,
                         0, op_deadline, NULL);
    dlock__zk_session_put(zs, s);
    if (zrc == ZNONODE || zrc == ZSESSIONEXPIRED || zrc == ZINVALIDSTATE)
        return dlock__err(DLOCK_ENOTHELD, "zk %s: the lock node is gone",
                          zs->redacted);
    return zrc == ZOK ? DLOCK_OK
                      : dlock__zk_error(zs, "writing the lock node", zrc);
}

/* ------------------------------------------------------------------------ */
/* The background thread: declared losses, orphans, expired sessions        */
/* ------------------------------------------------------------------------ */

static int zk_loop_fd(void *st)
{
    return ((zk_store *)st)->timer_fd;
}

static void zk_loop_run(void *st, int readable)
{
    zk_store *zs = st;
    uint64_t lost[16];
    size_t nlost = 0;
    int64_t now = dlock__now_ms(), next = DLOCK__FOREVER;
    zk_session *dead;
    zk_orphan *todo;

    if (readable) {
        uint64_t v;
        if (read(zs->timer_fd, &v, sizeof(v)) < 0) {
            /* not expired yet */
        }
    }
    /* each session's word on its holds' lease end, for their at-risk
     * events (design.md, "Stopping the work before the lease ends"): the
     * moment they are declared lost below while its connection is down,
     * no end while it is up */
    uint64_t ends_sid[16];
    int64_t ends[16];
    size_t nends = 0;

    pthread_mutex_lock(&zs->mu);
    for (zk_session *s = zs->sessions; s && nends < 16; s = s->next) {
        if (s->state != S_CONNECTED && s->state != S_CONNECTING)
            continue;
        ends_sid[nends] = s->sid;
        ends[nends++] = s->state == S_CONNECTING && s->down_since
                            ? s->down_since + s->timeout / 3 -
                                  dlock__lease_margin(s->timeout)
                            : DLOCK__FOREVER;
    }
    for (zk_session *s = zs->sessions; s; s = s->next) {
        if (s->state != S_CONNECTING || !s->down_since || s->declared_lost)
            continue;
        int64_t at = s->down_since + s->timeout / 3 -
                     dlock__lease_margin(s->timeout);
        if (now >= at) {
            s->declared_lost = 1;
            if (nlost < sizeof(lost) / sizeof(lost[0]))
                lost[nlost++] = s->sid;
            pthread_cond_broadcast(&zs->cv);
        } else if (at < next) {
            next = at;
        }
    }
    dlock__zk_sessions_retire(zs);
    /* take the retired sessions nobody uses any more */
    dead = NULL;
    for (zk_session **pp = &zs->dead; *pp;) {
        zk_session *d = *pp;
        if (d->refs == 0) {
            *pp = d->next;
            d->next = dead;
            dead = d;
        } else {
            pp = &d->next;
        }
    }
    todo = zs->orphans;
    zs->orphans = NULL;
    pthread_mutex_unlock(&zs->mu);

    for (size_t i = 0; i < nends; i++)
        dlock__notify_lease_end(zs->client, dlock__zk_match_session,
                                &ends_sid[i], ends[i],
                                ends[i] == DLOCK__FOREVER
                                    ? ""
                                    : "the connection to ZooKeeper is down; "
                                      "the session may expire");
    for (size_t i = 0; i < nlost; i++)
        dlock__notify_lost(zs->client, dlock__zk_match_session, &lost[i],
                           "the connection to ZooKeeper stayed down for a "
                           "third of the session timeout; the session may "
                           "have expired");

    /* orphans: delete where the session answers; drop where it ended */
    while (todo) {
        zk_orphan *o = todo;
        zk_session *s;
        int keep = 0;

        todo = o->next;
        pthread_mutex_lock(&zs->mu);
        s = dlock__zk_session_by_sid(zs, o->sid);
        int up = s && s->state == S_CONNECTED;
        if (s && s->state == S_CONNECTING)
            keep = 1;
        if (up)
            s->refs++;
        pthread_mutex_unlock(&zs->mu);
        if (up) {
            /* on the client's thread: by the moment a hold needs it */
            int zrc = dlock__zk_delete_node(
                zs, s, o->path, o->prefix,
                dlock__loop_deadline(zs->client,
                                     dlock__now_ms() + zs->timeout_ms));
            keep = zrc != ZOK && zrc != ZSESSIONEXPIRED &&
                   zrc != ZINVALIDSTATE && zrc != ZNOAUTH;
            dlock__zk_session_put(zs, s);
        }
        if (keep) {
            pthread_mutex_lock(&zs->mu);
            o->next = zs->orphans;
            zs->orphans = o;
            pthread_mutex_unlock(&zs->mu);
            if (dlock__now_ms() + 500 < next)
                next = dlock__now_ms() + 500;
        } else {
            free(o->path);
            free(o);
        }
    }

    /* our nodes: looked at again after a reconnection; deleted holds
     * told to the core */
    int64_t mine_next = dlock__zk_mine_run(zs);
    if (mine_next < next)
        next = mine_next;

    /* expired sessions: close their handles here, never on the client's
     * completion thread */
    while (dead) {
        zk_session *s = dead;
        dead = s->next;
        zookeeper_close(s->zh);
        free(s);
    }
    if (next != DLOCK__FOREVER)
        dlock__zk_arm_timer(zs, next);
}

/* ------------------------------------------------------------------------ */
/* Open and close                                                           */
/* ------------------------------------------------------------------------ */

static void zk_close(void *st)
{
    zk_store *zs = st;

    if (!zs)
        return;
    /* closing a session ends it: the server deletes its nodes at once */
    for (int pass = 0; pass < 2; pass++) {
        zk_session *s = pass ? zs->dead : zs->sessions;
        while (s) {
            zk_session *next = s->next;
            zookeeper_close(s->zh);
            free(s);
            s = next;
        }
    }
    while (zs->orphans) {
        zk_orphan *o = zs->orphans;
        zs->orphans = o->next;
        free(o->path);
        free(o);
    }
    if (zs->timer_fd >= 0)
        close(zs->timer_fd);
    if (zs->auth) {
        dlock__wipe(zs->auth, strlen(zs->auth));
        free(zs->auth);
    }
    free(zs->acl_auth[0].id.id);
    free(zs->hosts);
    free(zs->redacted);
    pthread_cond_destroy(&zs->cv);
    pthread_mutex_destroy(&zs->mu);
    free(zs);
}

static int check_chroot(const char *p)
{
    size_t n = strlen(p);

    if (n == 0)
        return 0;
    if (p[0] != '/' || n > ZK_CHROOT_MAX || (n > 1 && p[n - 1] == '/'))
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)p[i];
        if (ch < 0x20 || ch == 0x7f)
            return -1;
        if (ch == '/' && i + 1 < n && p[i + 1] == '/')
            return -1;
        if (ch == '/') {
            const char *c = p + i + 1;
            size_t cl = strcspn(c, "/");
            if ((cl == 1 && c[0] == '.') ||
                (cl == 2 && c[0] == '.' && c[1] == '.'))
                return -1;
        }
    }
    if (strcmp(p, "/zookeeper") == 0 || strncmp(p, "/zookeeper/", 11) == 0)
        return -1;
    return 0;
}

static int zk_open(void **out, dlock_client *c, const dlock__uri *u,
                   int64_t timeout_ms)
{
    zk_store *zs;
    size_t cap = 1;
    int rc;

    if (u->nhosts == 0)
        return dlock__err(DLOCK_EINVAL, "zk URI %s: no host (zk://host:port"
                                        "[,host:port...][/chroot])",
                          u->redacted);
    if (u->nparams > 0)
        return dlock__err(DLOCK_EINVAL, "zk URI %s: unknown parameter '%s'",
                          u->redacted, u->params[0].key);
    if (check_chroot(u->path) != 0)
        return dlock__err(DLOCK_EINVAL,
                          "zk URI %s: the chroot must be an absolute znode "
                          "path (no '//', '.', '..' or trailing '/', at most "
                          "%d bytes, not under /zookeeper)",
                          u->redacted, ZK_CHROOT_MAX);
    if (u->user && !u->password)
        return dlock__err(DLOCK_EINVAL, "zk URI %s: digest auth needs "
                                        "user:password",
                          u->redacted);
    for (size_t i = 0; i < u->nhosts; i++)
        cap += strlen(u->hosts[i].host) + 16;

    zs = calloc(1, sizeof(*zs));
    if (!zs)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    zs->timer_fd = -1;
    pthread_mutex_init(&zs->mu, NULL);
    rc = dlock__cond_init(&zs->cv);
    if (rc) {
        pthread_mutex_destroy(&zs->mu);
        free(zs);
        return rc;
    }
    zs->client = c;
    zs->timeout_ms = timeout_ms;
    zs->node_event = dlock__zk_mine_event;
    zs->hosts = calloc(1, cap);
    zs->redacted = strdup(u->redacted);
    zs->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (!zs->hosts || !zs->redacted || zs->timer_fd < 0) {
        zk_close(zs);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < u->nhosts; i++) {
        size_t o = strlen(zs->hosts);
        int v6 = strchr(u->hosts[i].host, ':') != NULL;
        snprintf(zs->hosts + o, cap - o, "%s%s%s%s:%d", i ? "," : "",
                 v6 ? "[" : "", u->hosts[i].host, v6 ? "]" : "",
                 u->hosts[i].port ? u->hosts[i].port : 2181);
    }
    snprintf(zs->chroot, sizeof(zs->chroot), "%s",
             u->path[0] ? u->path : ZK_DEFAULT_CHROOT);
    zs->acl = &ZOO_OPEN_ACL_UNSAFE;
    if (u->user) {
        size_t n = strlen(u->user) + strlen(u->password) + 2;
        zs->auth = malloc(n);
        zs->acl_auth[0].id.id = strdup("");
        if (!zs->auth || !zs->acl_auth[0].id.id) {
            zk_close(zs);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
        snprintf(zs->auth, n, "%s:%s", u->user, u->password);
        /* only the creating identity may change the nodes; anyone may read
         * them (dlock status) */
        zs->acl_auth[0].perms = ZOO_PERM_ALL;
        zs->acl_auth[0].id.scheme = (char *)"auth";
        zs->acl_auth[1].perms = ZOO_PERM_READ;
        zs->acl_auth[1].id.scheme = (char *)"world";
        zs->acl_auth[1].id.id = (char *)"anyone";
        zs->acl_auth_vec.count = 2;
        zs->acl_auth_vec.data = zs->acl_auth;
        zs->acl = &zs->acl_auth_vec;
    }

    /* connect now, so that a wrong address fails here */
    pthread_mutex_lock(&zs->mu);
    zk_session *s = dlock__zk_session_get(zs, 30000,
                                          dlock__now_ms() + timeout_ms, &rc);
    if (s)
        s->refs--;
    pthread_mutex_unlock(&zs->mu);
    if (!s) {
        zk_close(zs);
        return rc;
    }
    *out = zs;
    return DLOCK_OK;
}

/* dlock_client_at_risk_max(): the holds of a session are certain until a
 * third of its timeout after its connection is seen down (less the
 * drift margin), and nothing tells before that: the session of that ttl
 * is opened (as its first acquire would) to learn the timeout the server
 * granted. */
/* The session timeout the server grants for holds of ttl_ms, into *t: a
 * session opened (or found) as the next acquire of that ttl would. */
static int granted_timeout(zk_store *zs, int64_t ttl_ms, int64_t op_deadline,
                           int64_t *t)
{
    int rc = DLOCK_OK;

    pthread_mutex_lock(&zs->mu);
    dlock__zk_sessions_retire(zs);
    zk_session *s = dlock__zk_session_get(zs, ttl_ms, op_deadline, &rc);
    *t = s ? s->timeout : 0;
    if (s)
        s->refs--;
    pthread_mutex_unlock(&zs->mu);
    return s ? DLOCK_OK : rc;
}

static int zk_at_risk_max(void *st, int64_t ttl_ms, int64_t *out,
                          int64_t op_deadline)
{
    int64_t t;
    int rc = granted_timeout(st, ttl_ms, op_deadline, &t);

    if (rc)
        return rc;
    int64_t m = t / 3 - dlock__lease_margin(t);
    *out = m > 0 ? m : 0;
    return DLOCK_OK;
}

/* dlock_client_check(): the session timeout the server grants for holds
 * of ttl_ms (a session is opened as the next acquire would), and digest
 * credentials, which ZooKeeper sends as they are (this store has no TLS). */
static int zk_check(void *st, int64_t ttl_ms, dlock_check *out,
                    int64_t op_deadline)
{
    zk_store *zs = st;
    char what[512], fix[512];
    int rc = DLOCK_OK;

    if (zs->auth &&
        (rc = dlock__check_finding(
             out, "password-without-tls",
             "the digest credentials (zk://user:password@) go to the "
             "server as they are, without TLS: whoever sees the traffic "
             "can write dlock's nodes and break every lock",
             "keep the ensemble's traffic on a network only its clients "
             "reach (this store has no TLS yet)")) != 0)
        return rc;
    int64_t t;
    if ((rc = granted_timeout(zs, ttl_ms, op_deadline, &t)) != DLOCK_OK)
        return rc;
    if (t * 10 < ttl_ms * 9 || t * 10 > ttl_ms * 11) {
        snprintf(what, sizeof(what),
                 "the server grants sessions of %lld ms, not the %lld ms "
                 "asked (its minSessionTimeout and maxSessionTimeout): a "
                 "hold lives as long as its session, so %s",
                 (long long)t, (long long)ttl_ms,
                 t > ttl_ms ? "a dead holder's lock stays that much longer"
                            : "a pause shorter than the lease asked loses "
                              "the lock");
        snprintf(fix, sizeof(fix),
                 "use a --ttl within the server's bounds, or set "
                 "minSessionTimeout/maxSessionTimeout (by default 2 and 20 "
                 "ticks) in zoo.cfg to admit it");
        rc = dlock__check_finding(out, "zk-session-timeout", what, fix);
    }
    return rc;
}

/* dlock_cancel(): the waits sleep on zs->cv; each looks at its lease. */
static void zk_cancel(void *st)
{
    zk_store *zs = st;

    pthread_mutex_lock(&zs->mu);
    pthread_cond_broadcast(&zs->cv);
    pthread_mutex_unlock(&zs->mu);
}

const dlock__backend dlock__backend_zk = {
    DLOCK__STORE_HEAD,
    .name = "zk",
    .caps = DLOCK__CAP_NATIVE_WAIT | DLOCK__CAP_SHARED | DLOCK__CAP_PERMITS,
    .lease_size = sizeof(zk_lease),
    .open = zk_open,
    .close = zk_close,
    .acquire = zk_acquire,
    .release = zk_release,
    .extend = zk_extend,
    .inspect = dlock__zk_inspect,
    .loop_fd = zk_loop_fd,
    .loop_run = zk_loop_run,
    .list = dlock__zk_list,
    .evict = dlock__zk_evict,
    .cancel = zk_cancel,
    .at_risk_max = zk_at_risk_max,
    .check = zk_check,
    .proclaim = zk_proclaim,
    .watch_open = dlock__zk_watch_open, /* zk_elect.c */
    .watch_wait = dlock__zk_watch_wait,
    .watch_close = dlock__zk_watch_close,
    .watch_sees_expiry = 1, /* a session's end deletes its nodes */
};
