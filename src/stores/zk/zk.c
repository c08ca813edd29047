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
 */
#include "internal.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <zookeeper/zookeeper.h>

#define ZK_DEFAULT_CHROOT "/dlock"
#define ZK_CHROOT_MAX 256
#define ZK_PARENT_MAX (ZK_CHROOT_MAX + 3 * DLOCK_NAME_MAX + 2)
#define ZK_PATH_MAX (ZK_PARENT_MAX + 128) /* parent + "/" + child */
#define ZK_SEQ_DIGITS 10

/* session states */
enum { S_CONNECTING, S_CONNECTED, S_EXPIRED, S_AUTHFAIL };

typedef struct zk_store zk_store;

typedef struct zk_session {
    zk_store *zs;
    zhandle_t *zh;
    uint64_t sid;        /* our number for it, never reused */
    int64_t ttl;         /* requested session timeout (the lookup key) */
    int64_t timeout;     /* negotiated, once connected */
    int state;
    int ever_connected;
    int64_t down_since;  /* when the connection dropped; 0 while up */
    int declared_lost;   /* holds were declared lost in this outage */
    uint64_t conn_gen;   /* bumped at every (re)connection */
    int refs;            /* calls using it now; freed only at 0 */
    struct zk_session *next;
} zk_session;

/* A waiter's watch on its predecessor. */
typedef struct zk_watch {
    const char *path;
    uint64_t sid;
    int fired;
    int deleted; /* the event was the node's deletion */
    struct zk_watch *next;
} zk_watch;

/* A node that must go but could not be deleted yet (its delete, or its
 * create, lost its answer). `prefix`: find it by name prefix first. */
typedef struct zk_orphan {
    uint64_t sid;
    int prefix;
    char *path;
    struct zk_orphan *next;
} zk_orphan;

struct zk_store {
    dlock_client *client;
    char *hosts;       /* "h:p,h:p" */
    char *redacted;    /* for messages */
    char chroot[ZK_CHROOT_MAX + 1];
    char *auth;        /* "user:password" or NULL */
    struct ACL_vector *acl;
    struct ACL acl_auth[2];
    struct ACL_vector acl_auth_vec;
    int64_t timeout_ms;

    pthread_mutex_t mu; /* everything below */
    pthread_cond_t cv;  /* any answer, watch or session event */
    zk_session *sessions;
    zk_session *dead;   /* expired; closed by the background thread */
    uint64_t next_sid;
    zk_watch *watches;
    zk_orphan *orphans;
    int timer_fd;
    int closing;
};

typedef struct zk_lease {
    uint64_t sid;
    char path[ZK_PATH_MAX]; /* our node while we wait or hold */
} zk_lease;

/* ------------------------------------------------------------------------ */
/* Asynchronous calls with a deadline                                       */
/* ------------------------------------------------------------------------ */

typedef struct zk_op {
    zk_store *zs;
    int refs; /* caller + completion */
    int done;
    int rc;
    struct Stat stat;
    char *str;              /* create: the created path */
    struct String_vector kids; /* get_children */
    char *data;             /* get */
    int datalen;
} zk_op;

static zk_op *op_new(zk_store *zs)
{
    zk_op *op = calloc(1, sizeof(*op));

    if (op) {
        op->zs = zs;
        op->refs = 2;
    }
    return op;
}

static void op_free(zk_op *op)
{
    free(op->str);
    free(op->data);
    if (op->kids.data)
        deallocate_String_vector(&op->kids);
    free(op);
}

/* Drops one reference; zs->mu held. */
static void op_unref_locked(zk_op *op)
{
    if (--op->refs == 0)
        op_free(op);
}

static void op_put(zk_op *op)
{
    zk_store *zs = op->zs;

    pthread_mutex_lock(&zs->mu);
    op_unref_locked(op);
    pthread_mutex_unlock(&zs->mu);
}

/* A submission failed: the completion will never run. */
static int op_submit_failed(zk_op *op, int zrc)
{
    op->done = 1;
    op->rc = zrc;
    op->refs--;
    return zrc;
}

static void op_finish(zk_op *op, int rc)
{
    zk_store *zs = op->zs;

    pthread_mutex_lock(&zs->mu);
    op->rc = rc;
    op->done = 1;
    pthread_cond_broadcast(&zs->cv);
    op_unref_locked(op);
    pthread_mutex_unlock(&zs->mu);
}

static void on_void(int rc, const void *data)
{
    op_finish((zk_op *)data, rc);
}

static void on_stat(int rc, const struct Stat *stat, const void *data)
{
    zk_op *op = (zk_op *)data;

    if (rc == ZOK && stat)
        op->stat = *stat;
    op_finish(op, rc);
}

static void on_string_stat(int rc, const char *s, const struct Stat *stat,
                           const void *data)
{
    zk_op *op = (zk_op *)data;

    if (rc == ZOK) {
        if (stat)
            op->stat = *stat;
        op->str = s ? strdup(s) : NULL;
        if (!op->str)
            rc = ZSYSTEMERROR;
    }
    op_finish(op, rc);
}

static void on_strings_stat(int rc, const struct String_vector *v,
                            const struct Stat *stat, const void *data)
{
    zk_op *op = (zk_op *)data;

    if (rc == ZOK && v) {
        if (stat)
            op->stat = *stat;
        if (allocate_String_vector(&op->kids, v->count) != 0 ||
            (v->count > 0 && !op->kids.data)) {
            rc = ZSYSTEMERROR;
        } else {
            for (int32_t i = 0; i < v->count; i++) {
                op->kids.data[i] = strdup(v->data[i]);
                if (!op->kids.data[i])
                    rc = ZSYSTEMERROR;
            }
        }
    }
    op_finish(op, rc);
}

static void on_data(int rc, const char *value, int len,
                    const struct Stat *stat, const void *data)
{
    zk_op *op = (zk_op *)data;

    if (rc == ZOK) {
        if (stat)
            op->stat = *stat;
        op->data = malloc(len > 0 ? (size_t)len + 1 : 1);
        if (!op->data) {
            rc = ZSYSTEMERROR;
        } else {
            if (len > 0)
                memcpy(op->data, value, (size_t)len);
            op->data[len > 0 ? len : 0] = '\0';
            op->datalen = len > 0 ? len : 0;
        }
    }
    op_finish(op, rc);
}

/* Waits for op until `deadline`; returns its ZooKeeper code, or
 * ZOPERATIONTIMEOUT when the deadline passed first. The caller still owns
 * its reference (op_put). */
static int op_wait(zk_op *op, int64_t deadline)
{
    zk_store *zs = op->zs;
    int rc;

    pthread_mutex_lock(&zs->mu);
    while (!op->done && dlock__now_ms() < deadline)
        dlock__cond_wait_until(&zs->cv, &zs->mu, deadline);
    rc = op->done ? op->rc : ZOPERATIONTIMEOUT;
    pthread_mutex_unlock(&zs->mu);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Sessions                                                                 */
/* ------------------------------------------------------------------------ */

static void zk_log_sink(const char *msg)
{
    (void)msg; /* the C client's chatter is not ours to print */
}

static int match_session(const dlock__lease *l, void *arg)
{
    const zk_lease *zl = l->priv;

    return zl && zl->sid == *(const uint64_t *)arg;
}

static void arm_timer(zk_store *zs, int64_t at);

/* Session events (and, at expiry, every watch's copy of it). */
static void on_event(zhandle_t *zh, int type, int state, const char *path,
                     void *ctx)
{
    zk_session *s = ctx;
    zk_store *zs = s->zs;
    uint64_t lost_sid = 0;
    int wake_loop = 0;

    pthread_mutex_lock(&zs->mu);
    if (type == ZOO_SESSION_EVENT) {
        if (state == ZOO_CONNECTED_STATE) {
            s->state = S_CONNECTED;
            s->conn_gen++;
            s->timeout = zoo_recv_timeout(zh);
            s->ever_connected = 1;
            s->down_since = 0;
            s->declared_lost = 0;
            wake_loop = zs->orphans != NULL;
        } else if (state == ZOO_EXPIRED_SESSION_STATE) {
            if (s->state != S_EXPIRED)
                lost_sid = s->sid;
            s->state = S_EXPIRED;
            wake_loop = 1;
        } else if (state == ZOO_AUTH_FAILED_STATE) {
            s->state = S_AUTHFAIL;
        } else if (s->state == S_CONNECTED) {
            s->state = S_CONNECTING;
            s->down_since = dlock__now_ms();
            arm_timer(zs, s->down_since + s->timeout / 3 -
                              dlock__lease_margin(s->timeout));
        }
    } else if (path) {
        for (zk_watch *w = zs->watches; w; w = w->next)
            if (w->sid == s->sid && strcmp(w->path, path) == 0) {
                w->fired = 1;
                w->deleted = type == ZOO_DELETED_EVENT;
            }
    }
    pthread_cond_broadcast(&zs->cv);
    pthread_mutex_unlock(&zs->mu);
    if (lost_sid)
        dlock__notify_lost(zs->client, match_session, &lost_sid,
                           "its ZooKeeper session expired");
    if (wake_loop)
        dlock__loop_wake(zs->client);
}

static int econn(zk_store *zs, const char *what, int zrc)
{
    return dlock__err(DLOCK_ECONN, "zk %s: %s: %s", zs->redacted, what,
                      zrc == ZOPERATIONTIMEOUT
                          ? "no answer in time (no server reachable?)"
                          : zerror(zrc));
}

/* Maps a ZooKeeper code to ours, with a message. */
static int zk_error(zk_store *zs, const char *what, int zrc)
{
    switch (zrc) {
    case ZNOAUTH:
    case ZAUTHFAILED:
        return dlock__err(DLOCK_EAUTH,
                          "zk %s: %s: not allowed (the lock nodes belong to "
                          "another identity; check user:password)",
                          zs->redacted, what);
    case ZCONNECTIONLOSS:
    case ZOPERATIONTIMEOUT:
    case ZSESSIONEXPIRED:
    case ZINVALIDSTATE:
    case ZCLOSING:
    case ZSESSIONMOVED:
        return econn(zs, what, zrc);
    case ZSYSTEMERROR:
        return dlock__err(DLOCK_ENOMEM, "zk %s: %s: out of memory",
                          zs->redacted, what);
    default:
        return dlock__err(DLOCK_EPROTO, "zk %s: %s: %s", zs->redacted, what,
                          zerror(zrc));
    }
}

/* Returns a connected session for `ttl` (zs->mu held; may drop it while
 * waiting), or NULL with an error code in *rc. */
static zk_session *session_get_once(zk_store *zs, int64_t ttl,
                                    int64_t deadline, int *rc)
{
    zk_session *s;

    for (s = zs->sessions; s; s = s->next)
        if (s->ttl == ttl)
            break;
    if (!s) {
        s = calloc(1, sizeof(*s));
        if (!s) {
            *rc = dlock__err(DLOCK_ENOMEM, "out of memory");
            return NULL;
        }
        s->zs = zs;
        s->ttl = ttl;
        s->timeout = ttl;
        s->sid = ++zs->next_sid;
        s->state = S_CONNECTING;
        {
            sigset_t old;
            dlock__block_signals(&old); /* the client's threads inherit it */
            s->zh = zookeeper_init2(zs->hosts, on_event,
                                    ttl > INT32_MAX ? INT32_MAX : (int)ttl,
                                    NULL, s, 0, zk_log_sink);
            dlock__restore_signals(&old);
        }
        if (!s->zh) {
            int e = errno;
            free(s);
            *rc = dlock__err(e == ENOMEM ? DLOCK_ENOMEM : DLOCK_ECONN,
                             "zk %s: cannot start a session (is every host "
                             "name resolvable?): %s",
                             zs->redacted, strerror(e));
            return NULL;
        }
        /* The C client re-resolves the host names every time it polls
         * its socket: DNS traffic, and a thread that is inside
         * getaddrinfo() at the moment the application forks leaves a libc
         * lock held in the child. Once a minute is plenty (a lost
         * connection still re-resolves at once). */
        zoo_set_servers_resolution_delay(s->zh, 60000);
        if (zs->auth) {
            int zrc = zoo_add_auth(s->zh, "digest", zs->auth,
                                   (int)strlen(zs->auth), NULL, NULL);
            if (zrc != ZOK) {
                zookeeper_close(s->zh);
                free(s);
                *rc = zk_error(zs, "authentication", zrc);
                return NULL;
            }
        }
        s->next = zs->sessions;
        zs->sessions = s;
    }
    s->refs++; /* the background thread frees no session in use */
    while (s->state == S_CONNECTING && dlock__now_ms() < deadline)
        dlock__cond_wait_until(&zs->cv, &zs->mu, deadline);
    if (s->state == S_CONNECTED)
        return s;
    s->refs--;
    switch (s->state) {
    case S_AUTHFAIL:
        *rc = dlock__err(DLOCK_EAUTH, "zk %s: authentication failed",
                         zs->redacted);
        return NULL;
    case S_EXPIRED:
        /* the caller retries: the next lookup opens a fresh session */
        *rc = dlock__err(DLOCK_ECONN, "zk %s: the session expired",
                         zs->redacted);
        return NULL;
    default:
        *rc = dlock__err(DLOCK_ECONN,
                         "zk %s: no ZooKeeper server answered in time",
                         zs->redacted);
        return NULL;
    }
}

static void sessions_retire(zk_store *zs);

/* session_get_once(), again with a fresh session when the one found
 * turns out to have expired (a frozen server or process). */
static zk_session *session_get(zk_store *zs, int64_t ttl, int64_t deadline,
                               int *rc)
{
    zk_session *s = NULL;

    for (int attempt = 0; attempt < 3 && !s; attempt++) {
        sessions_retire(zs);
        s = session_get_once(zs, ttl, deadline, rc);
        if (s || dlock__now_ms() >= deadline)
            break;
    }
    return s;
}

/* Moves expired sessions out of the lookup list (zs->mu held), so the
 * next lookup opens a new one. */
static void sessions_retire(zk_store *zs)
{
    zk_session **pp = &zs->sessions;

    while (*pp) {
        zk_session *s = *pp;
        if (s->state == S_EXPIRED || s->state == S_AUTHFAIL) {
            *pp = s->next;
            s->next = zs->dead;
            zs->dead = s;
        } else {
            pp = &s->next;
        }
    }
}

static zk_session *session_by_sid(zk_store *zs, uint64_t sid)
{
    for (zk_session *s = zs->sessions; s; s = s->next)
        if (s->sid == sid)
            return s;
    return NULL;
}

/* Drops a reference taken by session_get() or lease_session(). */
static void session_put(zk_store *zs, zk_session *s)
{
    int wake;

    pthread_mutex_lock(&zs->mu);
    wake = --s->refs == 0 &&
           (s->state == S_EXPIRED || s->state == S_AUTHFAIL);
    pthread_mutex_unlock(&zs->mu);
    if (wake)
        dlock__loop_wake(zs->client); /* it can be closed now */
}

/* ------------------------------------------------------------------------ */
/* Calls                                                                    */
/* ------------------------------------------------------------------------ */

/* Starts one call on session s; returns the op (caller waits and puts it)
 * or NULL with *zrc set. */
enum { C_CREATE, C_CHILDREN, C_DELETE, C_EXISTS, C_WEXISTS, C_GET };

static zk_op *call_start(zk_store *zs, zk_session *s, int kind,
                         const char *path, const char *value, int vlen,
                         int mode, int *zrc)
{
    zk_op *op = op_new(zs);
    int rc;

    if (!op) {
        *zrc = ZSYSTEMERROR;
        return NULL;
    }
    switch (kind) {
    case C_CREATE:
        rc = zoo_acreate2(s->zh, path, value, vlen, zs->acl, mode,
                          on_string_stat, op);
        break;
    case C_CHILDREN:
        rc = zoo_aget_children2(s->zh, path, 0, on_strings_stat, op);
        break;
    case C_DELETE:
        rc = zoo_adelete(s->zh, path, -1, on_void, op);
        break;
    case C_EXISTS:
        rc = zoo_aexists(s->zh, path, 0, on_stat, op);
        break;
    case C_WEXISTS:
        rc = zoo_awexists(s->zh, path, on_event, s, on_stat, op);
        break;
    default:
        rc = zoo_aget(s->zh, path, 0, on_data, op);
        break;
    }
    if (rc != ZOK) {
        op_submit_failed(op, rc);
        op_put(op);
        *zrc = rc;
        return NULL;
    }
    return op;
}

/* One call, waited for. *out receives the op on ZOK (caller puts it). */
static int call(zk_store *zs, zk_session *s, int kind, const char *path,
                const char *value, int vlen, int mode, int64_t deadline,
                zk_op **out)
{
    int zrc = ZOK;
    zk_op *op = call_start(zs, s, kind, path, value, vlen, mode, &zrc);

    if (!op)
        return zrc;
    zrc = op_wait(op, deadline);
    if (zrc == ZOK && out)
        *out = op;
    else
        op_put(op);
    return zrc;
}

/* ------------------------------------------------------------------------ */
/* Paths                                                                    */
/* ------------------------------------------------------------------------ */

/* <chroot>/<escaped name>: bytes other than [A-Za-z0-9_-] become %XX, so
 * no name can be ".", "..", contain "/" or collide with another. */
static void lock_path(const zk_store *zs, const char *name, size_t len,
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
static long long child_seq(const char *name)
{
    size_t n = strlen(name);
    long long v = 0;

    if (n < ZK_SEQ_DIGITS + 3 || strncmp(name, "l-", 2) != 0)
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

/* Sorts the lock children in queue order, dropping foreign names; returns
 * how many remain at the front. */
static int32_t sort_children(struct String_vector *v)
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
        int zrc = call(zs, s, C_CREATE, buf, NULL, -1,
                       i == plen ? ZOO_CONTAINER : ZOO_PERSISTENT, deadline,
                       NULL);
        buf[i] = saved;
        if (zrc != ZOK && zrc != ZNODEEXISTS)
            return zk_error(zs, "creating the lock's parent node", zrc);
    }
    return DLOCK_OK;
}

/* ------------------------------------------------------------------------ */
/* Orphans: nodes to delete once the session answers again                  */
/* ------------------------------------------------------------------------ */

static void orphan_add(zk_store *zs, uint64_t sid, const char *path,
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
    arm_timer(zs, dlock__now_ms() + 200);
}

/* Deletes node `path`, or (prefix) the child of its parent whose name
 * starts with its last component. ZOK when gone. */
static int delete_node(zk_store *zs, zk_session *s, const char *path,
                       int prefix, int64_t deadline)
{
    char full[ZK_PATH_MAX];
    zk_op *op = NULL;
    int zrc;

    if (!prefix) {
        zrc = call(zs, s, C_DELETE, path, NULL, 0, 0, deadline, NULL);
        return zrc == ZNONODE ? ZOK : zrc;
    }
    const char *slash = strrchr(path, '/');
    size_t plen = (size_t)(slash - path);
    char parent[ZK_PARENT_MAX];
    if (plen >= sizeof(parent))
        return ZBADARGUMENTS;
    memcpy(parent, path, plen);
    parent[plen] = '\0';
    zrc = call(zs, s, C_CHILDREN, parent, NULL, 0, 0, deadline, &op);
    if (zrc == ZNONODE)
        return ZOK;
    if (zrc != ZOK)
        return zrc;
    for (int32_t i = 0; i < op->kids.count; i++) {
        if (strncmp(op->kids.data[i], slash + 1, strlen(slash + 1)) == 0) {
            snprintf(full, sizeof(full), "%s/%.100s", parent,
                     op->kids.data[i]);
            zrc = call(zs, s, C_DELETE, full, NULL, 0, 0, deadline, NULL);
            if (zrc == ZNONODE)
                zrc = ZOK;
            break;
        }
    }
    op_put(op);
    return zrc;
}

/* ------------------------------------------------------------------------ */
/* Backend slots                                                            */
/* ------------------------------------------------------------------------ */

/* After a call failed with a lost connection: waits until the session
 * has connected again (since generation `gen`) or is known to have
 * expired. 0: connected again, retry; 1: expired; -1: neither before
 * `deadline`. */
static int settle(zk_store *zs, zk_session *s, uint64_t gen, int64_t deadline)
{
    int r;

    pthread_mutex_lock(&zs->mu);
    while (!(s->state == S_CONNECTED && s->conn_gen != gen) &&
           s->state != S_EXPIRED && s->state != S_AUTHFAIL &&
           dlock__now_ms() < deadline)
        dlock__cond_wait_until(&zs->cv, &zs->mu, deadline);
    r = s->state == S_EXPIRED || s->state == S_AUTHFAIL ? 1
        : s->state == S_CONNECTED && s->conn_gen != gen ? 0
                                                        : -1;
    pthread_mutex_unlock(&zs->mu);
    return r;
}

static uint64_t conn_gen(zk_store *zs, zk_session *s)
{
    uint64_t g;

    pthread_mutex_lock(&zs->mu);
    g = s->conn_gen;
    pthread_mutex_unlock(&zs->mu);
    return g;
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
    int zrc = delete_node(zs, s, zl->path, 0,
                          dlock__now_ms() + zs->timeout_ms);

    if (zrc != ZOK && zrc != ZSESSIONEXPIRED && zrc != ZINVALIDSTATE)
        orphan_add(zs, s->sid, zl->path, 0);
    zl->path[0] = '\0';
}

/* One acquisition attempt in session s; DLOCK_OK, DLOCK_EBUSY, an error,
 * or 1 = the session expired underneath (start again). */
static int acquire_in(zk_store *zs, zk_session *s, dlock__lease *l,
                      int64_t op_ms)
{
    zk_lease *zl = l->priv;
    char parent[ZK_PARENT_MAX], prefix[ZK_PATH_MAX], data[256];
    unsigned char nonce[8];
    const char *base;
    zk_op *op = NULL;
    int zrc, dlen;
    uint64_t czxid;

    lock_path(zs, l->name, l->name_len, parent);
    if (dlock__random(nonce, sizeof(nonce)) != 0)
        return dlock__err(DLOCK_EPROTO, "no random bytes for a node name");
    snprintf(prefix, sizeof(prefix), "%s/l-%02x%02x%02x%02x%02x%02x%02x%02x-",
             parent, nonce[0], nonce[1], nonce[2], nonce[3], nonce[4],
             nonce[5], nonce[6], nonce[7]);
    dlen = snprintf(data, sizeof(data), "%s\n%s", l->owner, l->desc);
    if (dlen >= (int)sizeof(data))
        dlen = (int)sizeof(data) - 1;

    /* create our node (and the parents when missing) */
    for (int attempt = 0;; attempt++) {
        zrc = call(zs, s, C_CREATE, prefix, data, dlen,
                   ZOO_EPHEMERAL_SEQUENTIAL, dlock__now_ms() + op_ms, &op);
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
            orphan_add(zs, s->sid, prefix, 1); /* it may exist */
        return zk_error(zs, "creating the lock node", zrc);
    }
    snprintf(zl->path, sizeof(zl->path), "%s", op->str);
    zl->sid = s->sid;
    czxid = (uint64_t)op->stat.czxid;
    op_put(op);
    op = NULL;
    base = strrchr(zl->path, '/') + 1;

    for (;;) {
        char pred[ZK_PATH_MAX];
        int32_t n, me;

        zrc = call(zs, s, C_CHILDREN, parent, NULL, 0, 0,
                   dlock__now_ms() + op_ms, &op);
        if (zrc == ZSESSIONEXPIRED || zrc == ZINVALIDSTATE)
            return 1;
        if (zrc != ZOK) {
            give_up_node(zs, s, zl);
            return zk_error(zs, "listing the lock queue", zrc);
        }
        n = sort_children(&op->kids);
        me = find_mine(&op->kids, n, base);
        if (me < 0) {
            op_put(op);
            pthread_mutex_lock(&zs->mu);
            int expired = s->state == S_EXPIRED;
            pthread_mutex_unlock(&zs->mu);
            zl->path[0] = '\0';
            if (expired)
                return 1;
            return dlock__err(DLOCK_EPROTO,
                              "zk %s: our lock node vanished while waiting "
                              "(deleted by someone else?)",
                              zs->redacted);
        }
        if (me == 0) {
            op_put(op);
            l->token = czxid;
            return DLOCK_OK;
        }
        snprintf(pred, sizeof(pred), "%s/%.100s", parent,
                 op->kids.data[me - 1]);
        op_put(op);
        op = NULL;
        if (l->deadline <= dlock__now_ms()) {
            give_up_node(zs, s, zl);
            l->retry_ms = -1;
            return DLOCK_EBUSY;
        }

        /* watch the predecessor only */
        zk_watch w = {pred, s->sid, 0, 0, NULL};
        pthread_mutex_lock(&zs->mu);
        w.next = zs->watches;
        zs->watches = &w;
        pthread_mutex_unlock(&zs->mu);
        zrc = call(zs, s, C_WEXISTS, pred, NULL, 0, 0,
                   dlock__now_ms() + op_ms, NULL);
        int outcome = 0; /* 0 re-check, 1 expired, 2 deadline, 3 error */
        pthread_mutex_lock(&zs->mu);
        if (zrc == ZOK) {
            while (!w.fired && s->state != S_EXPIRED &&
                   !(s->state == S_CONNECTING && s->declared_lost) &&
                   dlock__now_ms() < l->deadline)
                dlock__cond_wait_until(&zs->cv, &zs->mu, l->deadline);
            if (w.fired)
                outcome = 0;
            else if (s->state == S_EXPIRED)
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
        /* Second in line and the head's node is gone: we are the head
         * (every node created since has a higher sequence), no need to
         * list the queue again. That saves a round trip per hand-off. */
        if (outcome == 0 && me == 1 && (w.deleted || zrc == ZNONODE)) {
            l->token = czxid;
            return DLOCK_OK;
        }
        if (outcome == 1)
            return 1;
        if (outcome == 2) {
            give_up_node(zs, s, zl);
            l->retry_ms = -1;
            return DLOCK_EBUSY;
        }
        if (outcome == 3) {
            give_up_node(zs, s, zl);
            return zk_error(zs, "waiting for the lock",
                            zrc == ZOK ? ZCONNECTIONLOSS : zrc);
        }
    }
}

static int zk_acquire(void *st, dlock__lease *l, int64_t op_deadline)
{
    zk_store *zs = st;
    int64_t op_ms = op_deadline - dlock__now_ms();
    int rc = DLOCK_ECONN;

    if (op_ms < 1)
        op_ms = 1;
    for (int attempt = 0; attempt < 3; attempt++) {
        zk_session *s;

        pthread_mutex_lock(&zs->mu);
        sessions_retire(zs);
        s = session_get(zs, l->ttl_ms, dlock__now_ms() + op_ms, &rc);
        pthread_mutex_unlock(&zs->mu);
        if (!s)
            return rc;
        rc = acquire_in(zs, s, l, op_ms);
        session_put(zs, s);
        if (rc != 1)
            return rc;
        rc = dlock__err(DLOCK_ECONN, "zk %s: the session expired while "
                                     "waiting", zs->redacted);
        if (dlock__now_ms() >= l->deadline && l->deadline != DLOCK__FOREVER)
            break;
    }
    return rc;
}

/* The session a lease lives in, if it is still usable; zs->mu held. */
static zk_session *lease_session(zk_store *zs, const zk_lease *zl)
{
    zk_session *s = session_by_sid(zs, zl->sid);

    if (!s || s->state == S_EXPIRED || s->state == S_AUTHFAIL)
        return NULL;
    s->refs++;
    return s;
}

static int release_in(zk_store *zs, zk_session *s, zk_lease *zl,
                      int64_t op_deadline)
{
    int zrc;

    for (;;) {
        /* a lost connection may hide an expired session (a frozen
         * process learns it only now): wait for the answer, then retry
         * or report the loss */
        uint64_t gen = conn_gen(zs, s);
        zrc = call(zs, s, C_DELETE, zl->path, NULL, 0, 0, op_deadline, NULL);
        if ((zrc != ZCONNECTIONLOSS && zrc != ZOPERATIONTIMEOUT) ||
            dlock__now_ms() >= op_deadline)
            break;
        int how = settle(zs, s, gen, op_deadline);
        if (how == 1)
            zrc = ZSESSIONEXPIRED;
        if (how != 0)
            break;
    }
    if (zrc == ZOK || zrc == ZNONODE || zrc == ZSESSIONEXPIRED ||
        zrc == ZINVALIDSTATE) {
        zl->path[0] = '\0';
        return zrc == ZOK ? DLOCK_OK
                          : dlock__err(DLOCK_ENOTHELD,
                                       "zk %s: the lock node was already "
                                       "gone",
                                       zs->redacted);
    }
    orphan_add(zs, s->sid, zl->path, 0);
    zl->path[0] = '\0';
    return zk_error(zs, "deleting the lock node", zrc);
}

static int zk_release(void *st, dlock__lease *l, int64_t op_deadline)
{
    zk_store *zs = st;
    zk_lease *zl = l->priv;
    zk_session *s;
    int rc;

    pthread_mutex_lock(&zs->mu);
    s = zl->path[0] ? lease_session(zs, zl) : NULL;
    pthread_mutex_unlock(&zs->mu);
    if (!s) {
        zl->path[0] = '\0';
        return dlock__err(DLOCK_ENOTHELD,
                          "zk %s: the session of this hold ended",
                          zs->redacted);
    }
    rc = release_in(zs, s, zl, op_deadline);
    session_put(zs, s);
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
    for (;;) {
        uint64_t gen = conn_gen(zs, s);
        zrc = call(zs, s, C_EXISTS, zl->path, NULL, 0, 0, op_deadline, &op);
        if ((zrc != ZCONNECTIONLOSS && zrc != ZOPERATIONTIMEOUT) ||
            dlock__now_ms() >= op_deadline)
            break;
        int how = settle(zs, s, gen, op_deadline);
        if (how == 1)
            zrc = ZSESSIONEXPIRED;
        if (how != 0)
            break;
    }
    if (zrc == ZNONODE || zrc == ZSESSIONEXPIRED || zrc == ZINVALIDSTATE)
        return dlock__err(DLOCK_ENOTHELD, "zk %s: the lock node is gone",
                          zs->redacted);
    if (zrc != ZOK)
        return zk_error(zs, "checking the lock node", zrc);
    ours = op->stat.ephemeralOwner == zoo_client_id(s->zh)->client_id;
    op_put(op);
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

    pthread_mutex_lock(&zs->mu);
    s = zl->path[0] ? lease_session(zs, zl) : NULL;
    pthread_mutex_unlock(&zs->mu);
    if (!s)
        return dlock__err(DLOCK_ENOTHELD,
                          "zk %s: the session of this hold ended",
                          zs->redacted);
    rc = extend_in(zs, s, zl, ttl_ms, op_deadline);
    session_put(zs, s);
    return rc;
}

static int inspect_in(zk_store *zs, zk_session *s, const char *name,
                      size_t len, dlock_info *out, int64_t op_deadline)
{
    char parent[ZK_PARENT_MAX], path[ZK_PATH_MAX];
    zk_op *kids = NULL;
    zk_op **ops = NULL;
    int32_t n;
    int rc = DLOCK_OK, zrc;

    out->ttl_ms = -1;
    out->held_ms = -1;
    lock_path(zs, name, len, parent);
    zrc = call(zs, s, C_CHILDREN, parent, NULL, 0, 0, op_deadline, &kids);
    if (zrc == ZNONODE) {
        out->waiters = 0;
        return DLOCK_OK;
    }
    if (zrc != ZOK)
        return zk_error(zs, "listing the lock queue", zrc);
    n = sort_children(&kids->kids);
    out->waiters = n > 0 ? n - 1 : 0;
    if (n == 0) {
        op_put(kids);
        return DLOCK_OK;
    }
    /* fetch every node's data at once, then wait for all */
    ops = calloc((size_t)n, sizeof(*ops));
    if (!ops) {
        op_put(kids);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    int start_zrc = ZOK; /* the first read that could not be sent */
    for (int32_t i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "%s/%.100s", parent,
                 kids->kids.data[i]);
        ops[i] = call_start(zs, s, C_GET, path, NULL, 0, 0, &zrc);
        if (!ops[i] && start_zrc == ZOK)
            start_zrc = zrc;
    }
    if (n > 1) {
        out->queue = calloc((size_t)n, sizeof(char *));
        if (!out->queue)
            rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int64_t nowwall = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    for (int32_t i = 0; i < n; i++) {
        const char *desc = "?";
        if (!ops[i]) {
            /* not sent (the session between servers, say): an answer
             * without that node would be wrong, not merely old */
            if (rc == DLOCK_OK)
                rc = zk_error(zs, "reading a lock node", start_zrc);
            continue;
        }
        zrc = op_wait(ops[i], op_deadline);
        if (zrc == ZOK) {
            const char *nl = strchr(ops[i]->data, '\n');
            desc = nl ? nl + 1 : ops[i]->data;
        } else if (zrc != ZNONODE && rc == DLOCK_OK) {
            rc = zk_error(zs, "reading a lock node", zrc);
        }
        /* Nodes deleted since the listing are skipped: the first one still
         * there holds the lock (every lower one is gone, every newer one
         * is higher), the rest wait. So held, holder, waiters and queue
         * always agree, even in the middle of a hand-off. */
        if (zrc != ZOK) {
            /* gone, or unreadable: not part of the answer */
        } else if (!out->held) {
            out->held = 1;
            snprintf(out->holder, sizeof(out->holder), "%s", desc);
            out->token = (uint64_t)ops[i]->stat.czxid;
            out->held_ms = nowwall - ops[i]->stat.ctime;
            if (out->held_ms < 0)
                out->held_ms = 0;
        } else if (out->queue) {
            char *d = strdup(desc);
            if (!d && rc == DLOCK_OK)
                rc = dlock__err(DLOCK_ENOMEM, "out of memory");
            if (d)
                out->queue[out->queue_len++] = d;
        }
        op_put(ops[i]);
    }
    out->waiters = (int64_t)out->queue_len;
    if (n > 1 && !out->queue)
        out->waiters = n - 1; /* out of memory: the count from the list */
    free(ops);
    op_put(kids);
    return rc;
}

static int zk_inspect(void *st, const char *name, size_t len,
                      dlock_info *out, int64_t op_deadline)
{
    zk_store *zs = st;
    zk_session *s;
    int rc = DLOCK_OK;

    pthread_mutex_lock(&zs->mu);
    sessions_retire(zs);
    for (s = zs->sessions; s; s = s->next)
        if (s->state == S_CONNECTED)
            break;
    if (s)
        s->refs++;
    else
        s = session_get(zs, 30000, op_deadline, &rc);
    pthread_mutex_unlock(&zs->mu);
    if (!s)
        return rc;
    rc = inspect_in(zs, s, name, len, out, op_deadline);
    session_put(zs, s);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* The background thread: declared losses, orphans, expired sessions        */
/* ------------------------------------------------------------------------ */

static void arm_timer(zk_store *zs, int64_t at)
{
    struct itimerspec its;
    int64_t in = at - dlock__now_ms();

    memset(&its, 0, sizeof(its));
    if (in < 1)
        in = 1;
    its.it_value.tv_sec = in / 1000;
    its.it_value.tv_nsec = (in % 1000) * 1000000;
    /* an earlier pending expiry is kept: loop_run re-arms for the next */
    struct itimerspec cur;
    if (timerfd_gettime(zs->timer_fd, &cur) == 0 &&
        (cur.it_value.tv_sec || cur.it_value.tv_nsec) &&
        (cur.it_value.tv_sec < its.it_value.tv_sec ||
         (cur.it_value.tv_sec == its.it_value.tv_sec &&
          cur.it_value.tv_nsec <= its.it_value.tv_nsec)))
        return;
    timerfd_settime(zs->timer_fd, 0, &its, NULL);
}

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
    pthread_mutex_lock(&zs->mu);
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
    sessions_retire(zs);
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

    for (size_t i = 0; i < nlost; i++)
        dlock__notify_lost(zs->client, match_session, &lost[i],
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
        s = session_by_sid(zs, o->sid);
        int up = s && s->state == S_CONNECTED;
        if (s && s->state == S_CONNECTING)
            keep = 1;
        if (up)
            s->refs++;
        pthread_mutex_unlock(&zs->mu);
        if (up) {
            int zrc = delete_node(zs, s, o->path, o->prefix,
                                  dlock__now_ms() + zs->timeout_ms);
            keep = zrc != ZOK && zrc != ZSESSIONEXPIRED &&
                   zrc != ZINVALIDSTATE && zrc != ZNOAUTH;
            session_put(zs, s);
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

    /* expired sessions: close their handles here, never on the client's
     * completion thread */
    while (dead) {
        zk_session *s = dead;
        dead = s->next;
        zookeeper_close(s->zh);
        free(s);
    }
    if (next != DLOCK__FOREVER)
        arm_timer(zs, next);
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
    zk_session *s = session_get(zs, 30000, dlock__now_ms() + timeout_ms, &rc);
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

const dlock__backend dlock__backend_zk = {
    "zk",                   /* name */
    DLOCK__CAP_NATIVE_WAIT, /* caps */
    sizeof(zk_lease),       /* lease_size */
    zk_open,                /* open */
    zk_close,               /* close */
    zk_acquire,             /* acquire */
    NULL,                   /* arm */
    NULL,                   /* disarm */
    zk_release,             /* release */
    zk_extend,              /* extend */
    zk_inspect,             /* inspect */
    zk_loop_fd,             /* loop_fd */
    zk_loop_run,            /* loop_run */
    NULL,                   /* gc */
    NULL, /* select */
    NULL, /* margin */
    NULL, /* abandon */
    NULL, /* extend_many */
};
