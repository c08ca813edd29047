/* SPDX-License-Identifier: MIT */
/*
 * zk_conn.c -- the ZooKeeper store's calls and sessions (zk.c has the
 * recipe, zk_int.h what the files share). Every call is asynchronous and
 * waited for with a deadline; an answer that comes after its caller gave
 * up frees itself. Sessions: one per distinct ttl (its timeout), their
 * events (connected, disconnected, expired, auth failed) marked on the C
 * client's completion thread; a connection down for a third of the
 * session timeout declares the session's holds lost.
 */
#include "zk_int.h"

#include "kwait.h"

/* ------------------------------------------------------------------------ */
/* Asynchronous calls with a deadline                                       */
/* ------------------------------------------------------------------------ */

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
    free(op->results);
    free(op);
}

/* Drops one reference; zs->mu held. */
static void op_unref_locked(zk_op *op)
{
    if (--op->refs == 0)
        op_free(op);
}

void dlock__zk_op_put(zk_op *op)
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
 * its reference (dlock__zk_op_put). */
int dlock__zk_op_wait(zk_op *op, int64_t deadline)
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

int dlock__zk_match_session(const dlock__lease *l, void *arg)
{
    const zk_lease *zl = l->priv;

    return zl && zl->sid == *(const uint64_t *)arg;
}

/* The C client makes its socket without close-on-exec (unless built with
 * SOCK_CLOEXEC_ENABLED, which Debian's 3.8 is not), on its I/O thread, at
 * every connect, and never says which it is: at each connected event, the
 * sockets connected to the server the session is connected to get the
 * flag (docs/design.md, "Descriptors"). */
static void mark_socket(zhandle_t *zh)
{
    struct sockaddr_storage a;
    socklen_t len = sizeof(a);

    if (zookeeper_get_connected_host(zh, (struct sockaddr *)&a, &len))
        dlock__fds_mark_peer((struct sockaddr *)&a, len);
}

/* The background thread's timer: armed here by the sessions' events and
 * by the queue, run by zk.c's loop. */
void dlock__zk_arm_timer(zk_store *zs, int64_t at)
{
    dlock__timer_within(zs->timer_fd, at - dlock__now_ms());
}

/* An observer's watch fired: its eventfd (zk_elect.c). zs->mu held. */
static void ring_bell(const zk_watch *w)
{
    uint64_t one = 1;

    if (w->bell)
        (void)!write(*w->bell, &one, sizeof(one));
}

/* Session events (and, at expiry, every watch's copy of it). */
static void on_event(zhandle_t *zh, int type, int state, const char *path,
                     void *ctx)
{
    zk_session *s = ctx;
    zk_store *zs = s->zs;
    uint64_t lost_sid = 0;
    int wake_loop = 0;

    if (type == ZOO_SESSION_EVENT && state == ZOO_CONNECTED_STATE)
        mark_socket(zh);
    pthread_mutex_lock(&zs->mu);
    if (type == ZOO_SESSION_EVENT) {
        if (state == ZOO_CONNECTED_STATE) {
            s->state = S_CONNECTED;
            s->conn_gen++;
            s->timeout = zoo_recv_timeout(zh);
            s->ever_connected = 1;
            s->down_since = 0;
            s->declared_lost = 0;
            /* the loop tells the core its holds are safe again */
            wake_loop = 1;
            /* connected again (not the first time): our nodes are
             * looked at once more */
            if (s->conn_gen > 1 &&
                zs->node_event(zs, s, ZOO_SESSION_EVENT, NULL))
                wake_loop = 1;
        } else if (state == ZOO_EXPIRED_SESSION_STATE) {
            if (s->state != S_EXPIRED)
                lost_sid = s->sid;
            s->state = S_EXPIRED;
            /* an observer's watches end with the session: it opens
             * others */
            for (zk_watch *w = zs->watches; w; w = w->next)
                if (w->sid == s->sid)
                    ring_bell(w);
            wake_loop = 1;
        } else if (state == ZOO_AUTH_FAILED_STATE) {
            s->state = S_AUTHFAIL;
        } else if (s->state == S_CONNECTED) {
            s->state = S_CONNECTING;
            s->down_since = dlock__now_ms();
            dlock__zk_arm_timer(zs, s->down_since + s->timeout / 3 -
                              dlock__lease_margin(s->timeout));
            /* the loop tells the core when its holds are lost now */
            wake_loop = 1;
        }
    } else if (path) {
        for (zk_watch *w = zs->watches; w; w = w->next)
            if (w->sid == s->sid && strcmp(w->path, path) == 0) {
                w->fired = 1;
                w->deleted = type == ZOO_DELETED_EVENT;
                ring_bell(w);
            }
        /* one of our own nodes (zk_mine.c) */
        if (zs->node_event(zs, s, type, path))
            wake_loop = 1;
    }
    pthread_cond_broadcast(&zs->cv);
    pthread_mutex_unlock(&zs->mu);
    if (lost_sid)
        dlock__notify_lost(zs->client, dlock__zk_match_session, &lost_sid,
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
int dlock__zk_error(zk_store *zs, const char *what, int zrc)
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

/* The longest session timeout asked for (ms): a day. */
#define ZK_TIMEOUT_MAX 86400000

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
            dlock__fd_note note;
            /* its self-pipe (pipe(), without close-on-exec) and perhaps
             * its first socket are made in this call: marked after it */
            dlock__fds_note(&note);
            dlock__block_signals(&old); /* the client's threads inherit it */
            /* at most a day: the C client computes with 2/3 of the
             * timeout in an int (INT32_MAX there never connected), and
             * the server grants at most its maxSessionTimeout anyway */
            s->zh = zookeeper_init2(zs->hosts, on_event,
                                    ttl > ZK_TIMEOUT_MAX ? ZK_TIMEOUT_MAX
                                                         : (int)ttl,
                                    NULL, s, 0, zk_log_sink);
            int init_errno = errno;
            dlock__restore_signals(&old);
            dlock__fds_mark_new(&note);
            errno = init_errno; /* why zookeeper_init2 failed, below */
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
                *rc = dlock__zk_error(zs, "authentication", zrc);
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

/* session_get_once(), again with a fresh session when the one found
 * turns out to have expired (a frozen server or process). */
zk_session *dlock__zk_session_get(zk_store *zs, int64_t ttl,
                                  int64_t deadline, int *rc)
{
    zk_session *s = NULL;

    for (int attempt = 0; attempt < 3 && !s; attempt++) {
        dlock__zk_sessions_retire(zs);
        s = session_get_once(zs, ttl, deadline, rc);
        if (s || dlock__now_ms() >= deadline)
            break;
    }
    return s;
}

/* Moves expired sessions out of the lookup list (zs->mu held), so the
 * next lookup opens a new one. */
void dlock__zk_sessions_retire(zk_store *zs)
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

zk_session *dlock__zk_session_by_sid(zk_store *zs, uint64_t sid)
{
    for (zk_session *s = zs->sessions; s; s = s->next)
        if (s->sid == sid)
            return s;
    return NULL;
}

/* Drops a reference taken by dlock__zk_session_get() or lease_session(). */
void dlock__zk_session_put(zk_store *zs, zk_session *s)
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
zk_op *dlock__zk_call_start(zk_store *zs, zk_session *s, int kind,
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
    case C_WCHILDREN:
        rc = zoo_awget_children2(s->zh, path, on_event, s, on_strings_stat,
                                 op);
        break;
    case C_SET:
        rc = zoo_aset(s->zh, path, value, vlen, -1, on_stat, op);
        break;
    default:
        rc = zoo_aget(s->zh, path, 0, on_data, op);
        break;
    }
    if (rc != ZOK) {
        op_submit_failed(op, rc);
        dlock__zk_op_put(op);
        *zrc = rc;
        return NULL;
    }
    return op;
}

/* Starts one multi of n deletes (all or none), or NULL with *zrc set.
 * The op's results say which delete failed. */
zk_op *dlock__zk_multi_delete_start(zk_store *zs, zk_session *s,
                                    char *const *paths, int n, int *zrc)
{
    zoo_op_t *ops = calloc((size_t)n, sizeof(*ops));
    zk_op *op = op_new(zs);
    int rc;

    if (op)
        op->results = calloc((size_t)n, sizeof(*op->results));
    if (!ops || !op || !op->results) {
        free(ops);
        if (op) {
            op_submit_failed(op, ZSYSTEMERROR);
            dlock__zk_op_put(op);
        }
        *zrc = ZSYSTEMERROR;
        return NULL;
    }
    op->nresults = n;
    for (int i = 0; i < n; i++)
        zoo_delete_op_init(&ops[i], paths[i], -1);
    /* the request is written out here; only the results are filled in
     * later, by the completion (they belong to the op) */
    rc = zoo_amulti(s->zh, n, ops, op->results, on_void, op);
    free(ops);
    if (rc != ZOK) {
        op_submit_failed(op, rc);
        dlock__zk_op_put(op);
        *zrc = rc;
        return NULL;
    }
    return op;
}

/* One call, waited for. *out receives the op on ZOK (caller puts it). */
int dlock__zk_call(zk_store *zs, zk_session *s, int kind,
                   const char *path, const char *value, int vlen, int mode,
                   int64_t deadline, zk_op **out)
{
    int zrc = ZOK;
    zk_op *op = dlock__zk_call_start(zs, s, kind, path, value, vlen, mode,
                                     &zrc);

    if (!op)
        return zrc;
    zrc = dlock__zk_op_wait(op, deadline);
    if (zrc == ZOK && out)
        *out = op;
    else
        dlock__zk_op_put(op);
    return zrc;
}

/* ------------------------------------------------------------------------ */
/* After a lost connection                                                  */
/* ------------------------------------------------------------------------ */

/* After a call failed with a lost connection: waits until the session
 * has connected again (since generation `gen`) or is known to have
 * expired. 0: connected again, retry; 1: expired; -1: neither before
 * `deadline`. */
int dlock__zk_settle(zk_store *zs, zk_session *s, uint64_t gen,
                     int64_t deadline)
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

uint64_t dlock__zk_conn_gen(zk_store *zs, zk_session *s)
{
    uint64_t g;

    pthread_mutex_lock(&zs->mu);
    g = s->conn_gen;
    pthread_mutex_unlock(&zs->mu);
    return g;
}
