/* SPDX-License-Identifier: MIT */
/*
 * redlock_conn.c -- Redlock's command connections and rounds (redlock.c
 * has the protocol, redlock_int.h what the files share). One non-blocking
 * connection per node, its login and script loads queued ahead of any
 * command; a round sends its commands to every node at once and polls
 * their sockets together until its outcome is decided, every node
 * answered or failed, or the node timeout passed. A connection remembers
 * the replies it owes to rounds that ended early and drops them when they
 * come; one still silent a node timeout later is replaced. All of it runs
 * under the store's mu.
 */
#include "redlock_int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

/* ------------------------------------------------------------------------ */
/* Sockets                                                                  */
/* ------------------------------------------------------------------------ */

redisContext *dlock__redlock_start_connect(const dlock__rtls *tls,
                                           const rnode *n, char *why,
                                           size_t cap)
{
    redisContext *ctx;
    char r[256];
    int rc = dlock__rio_connect_nb(tls, n->host, n->port, &ctx, r,
                                   sizeof(r));

    if (rc == DLOCK_ENOMEM)
        snprintf(why, cap, "%s: out of memory", n->where);
    else if (rc)
        snprintf(why, cap, "%s: cannot connect: %s", n->where, r);
    return rc ? NULL : ctx;
}

int dlock__redlock_connect_step(const rnode *n, redisContext *ctx,
                                char *why, size_t cap)
{
    char r[256];
    int st = dlock__rio_step(ctx, r, sizeof(r));

    if (st < 0)
        snprintf(why, cap, "%s: cannot connect: %s", n->where, r);
    return st;
}

short dlock__redlock_events(const redisContext *ctx, int connecting)
{
    if (connecting)
        return (short)(dlock__rio_wants(ctx) | POLLIN);
    return (short)(sdslen(ctx->obuf) > 0 ? POLLIN | POLLOUT : POLLIN);
}

/* ------------------------------------------------------------------------ */
/* Command connections and rounds (mu held)                                 */
/* ------------------------------------------------------------------------ */

void dlock__redlock_node_drop(rnode *n)
{
    if (n->ctx)
        dlock__rio_free(n->ctx);
    n->ctx = NULL;
    n->connecting = 0;
    n->owed_len = n->owed_head = 0;
    n->owed_since = 0;
    n->setup = 0;
}

/* This round failed on node n, for the reason in the calling thread's
 * message (or `why`); its connection is closed. */
static void node_fail(rnode *n, int rc, const char *why)
{
    snprintf(n->msg, sizeof(n->msg), "%s", why ? why : dlock_errmsg());
    n->rc = rc;
    dlock__redlock_node_drop(n);
}

static int owe(rnode *n, int kind)
{
    if (n->owed_len == OWED_MAX)
        return -1;
    n->owed[(n->owed_head + n->owed_len++) % OWED_MAX] = (unsigned char)kind;
    if (kind == K_AUTH || kind == K_SELECT || kind >= K_LOAD)
        n->setup++;
    return 0;
}

static void node_io(rl_store *rs, rnode *n, short revents);

/* Makes sure node n has a command connection: a new one is connecting,
 * with its login and script loads queued ahead of any command. */
void dlock__redlock_node_connect(rl_store *rs, rnode *n, int64_t now)
{
    if (n->ctx && n->owed_len > 0) {
        /* read what arrived since the last round (the replies of nodes
         * that answered after its quorum) */
        struct pollfd p = {n->ctx->fd, 0, 0};
        p.events = dlock__redlock_events(n->ctx, n->connecting);
        if (poll(&p, 1, 0) > 0)
            node_io(rs, n, p.revents);
        if (!n->ctx) { /* that failed: a new connection, this round */
            n->rc = 0;
            n->msg[0] = '\0';
        }
    }
    if (n->ctx && n->owed_since && now - n->owed_since > rs->node_timeout)
        dlock__redlock_node_drop(n); /* still silent: frozen, or gone */
    if (n->ctx && !n->connecting && n->owed_len == 0 &&
        dlock__rio_stale(n->ctx))
        /* closed by the server (a restart) since last used */
        dlock__redlock_node_drop(n);
    if (n->ctx)
        return;

    char why[512];
    n->ctx = dlock__redlock_start_connect(rs->cfg.tls, n, why,
                                          sizeof(why));
    if (!n->ctx) {
        node_fail(n, DLOCK_ECONN, why);
        return;
    }
    n->connecting = 1;
    int logins = dlock__redis_append_login(n->ctx, &rs->cfg);
    if (rs->cfg.password)
        owe(n, K_AUTH);
    if (logins > (rs->cfg.password ? 1 : 0))
        owe(n, K_SELECT);
    for (int s = 0; s < NSCRIPTS; s++) {
        redisAppendCommand(n->ctx, "SCRIPT LOAD %s",
                           dlock__redlock_script_text[s]);
        owe(n, K_LOAD + s);
    }
}

void dlock__redlock_round_begin(rl_store *rs)
{
    for (int i = 0; i < rs->n; i++) {
        rnode *n = &rs->nodes[i];
        n->ngot = n->want = n->rc = 0;
        n->msg[0] = '\0';
    }
}

/* Ends a round: frees its replies; the replies still owed to it are
 * thrown away when they arrive. */
void dlock__redlock_round_free(rl_store *rs)
{
    int64_t now = dlock__now_ms();

    for (int i = 0; i < rs->n; i++) {
        rnode *n = &rs->nodes[i];
        int late = 0;
        for (int k = 0; k < n->ngot; k++)
            freeReplyObject(n->got[k]);
        n->ngot = 0;
        for (int k = 0; k < n->owed_len; k++) {
            unsigned char *kind = &n->owed[(n->owed_head + k) % OWED_MAX];
            if (*kind == K_ROUND) {
                *kind = K_SKIP;
                late = 1;
            }
        }
        if (late && !n->owed_since)
            n->owed_since = now;
    }
}

/* Queues command c on node n (connecting first if needed); its reply is
 * this round's (kind K_ROUND) or thrown away (K_SKIP). */
void dlock__redlock_node_send(rl_store *rs, rnode *n, rcmd *c, int kind,
                              int64_t now)
{
    dlock__redlock_node_connect(rs, n, now);
    if (!n->ctx)
        return;
    const char **argv = c->ext_argv ? c->ext_argv : c->argv;
    size_t *lens = c->ext_lens ? c->ext_lens : c->lens;
    if (c->script >= 0) {
        argv[1] = rs->sha[c->script];
        lens[1] = 40;
    }
    if (redisAppendCommandArgv(n->ctx, c->argc, argv, lens) != REDIS_OK ||
        owe(n, kind) != 0) {
        node_fail(n, DLOCK_ECONN, NULL);
        snprintf(n->msg, sizeof(n->msg), "%s: too many replies owed",
                 n->where);
        return;
    }
    if (kind == K_ROUND)
        n->want++;
    else if (!n->owed_since)
        n->owed_since = now;
    n->used = now;
    if (!n->connecting && dlock__redis_send(n->ctx) < 0) {
        char why[512];
        snprintf(why, sizeof(why), "%s: %s", n->where, strerror(errno));
        node_fail(n, DLOCK_ECONN, why);
    }
}

/* One reply arrived on node n. */
static void node_reply(rl_store *rs, rnode *n, redisReply *r)
{
    if (n->owed_len == 0) {
        freeReplyObject(r);
        dlock__err(DLOCK_EPROTO, "%s: a reply nobody asked for", n->where);
        node_fail(n, DLOCK_EPROTO, NULL);
        return;
    }
    int kind = n->owed[n->owed_head];
    n->owed_head = (n->owed_head + 1) % OWED_MAX;
    if (--n->owed_len == 0)
        n->owed_since = 0;
    if (kind == K_AUTH || kind == K_SELECT || kind >= K_LOAD)
        n->setup--;

    if (kind == K_ROUND && n->ngot < 2) {
        if (r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "NOSCRIPT", 8)) {
            /* scripts flushed: a new connection loads them again */
            freeReplyObject(r);
            dlock__err(DLOCK_ECONN, "%s: the server forgot dlock's scripts",
                       n->where);
            node_fail(n, DLOCK_ECONN, NULL);
            return;
        }
        n->got[n->ngot++] = r;
        return;
    }
    if (r->type == REDIS_REPLY_ERROR && kind == K_AUTH) {
        dlock__err(DLOCK_EAUTH,
                   "%s: authentication refused (wrong user name or "
                   "password)",
                   n->where);
        node_fail(n, DLOCK_EAUTH, NULL);
    } else if (r->type == REDIS_REPLY_ERROR && kind == K_SELECT) {
        dlock__err(DLOCK_EINVAL, "%s: cannot select database %ld", n->where,
                   rs->cfg.db);
        node_fail(n, DLOCK_EINVAL, NULL);
    } else if (kind >= K_LOAD) {
        int s = kind - K_LOAD;
        if (r->type != REDIS_REPLY_STRING || r->len != 40) {
            int code = r->type == REDIS_REPLY_ERROR
                           ? dlock__redis_server_error(
                                 n->where, rs->cfg.password, r->str, NULL)
                           : dlock__err(DLOCK_EPROTO,
                                        "%s: unexpected answer to SCRIPT "
                                        "LOAD",
                                        n->where);
            node_fail(n, code, NULL);
        } else if (!(rs->sha_known & (1 << s))) {
            memcpy(rs->sha[s], r->str, 41);
            rs->sha_known |= 1 << s;
        }
    }
    freeReplyObject(r);
}

/* Socket events on node n's command connection. */
static void node_io(rl_store *rs, rnode *n, short revents)
{
    char why[512];

    if (n->connecting) {
        if (!revents)
            return;
        int st = dlock__redlock_connect_step(n, n->ctx, why, sizeof(why));
        if (st < 0) {
            node_fail(n, DLOCK_ECONN, why);
            return;
        }
        if (st == 0)
            return; /* TLS's handshake goes on */
        n->connecting = 0;
    }
    if (dlock__redis_send(n->ctx) < 0) {
        snprintf(why, sizeof(why), "%s: %s", n->where, strerror(errno));
        node_fail(n, DLOCK_ECONN, why);
        return;
    }
    if (!(revents & (POLLIN | POLLERR | POLLHUP)))
        return;
    if (dlock__rio_fill(n->ctx) != REDIS_OK) {
        node_fail(n, dlock__redis_io_failure(n->where, n->ctx,
                                             rs->node_timeout),
                  NULL);
        return;
    }
    for (;;) {
        redisReply *r = NULL;
        if (redisGetReplyFromReader(n->ctx, (void **)&r) != REDIS_OK) {
            node_fail(n, dlock__redis_io_failure(n->where, n->ctx,
                                                 rs->node_timeout),
                      NULL);
            return;
        }
        if (!r)
            return;
        node_reply(rs, n, r);
        if (!n->ctx)
            return;
    }
}

int dlock__redlock_node_busy(const rnode *n)
{
    return n->ctx && !n->rc && (n->ngot < n->want || n->setup > 0);
}

/* Runs the round until every node answered or failed, `decided` says the
 * outcome is known, or `deadline` passes (nodes still silent then fail).
 * The replies of nodes still owing when it ends early are dropped when
 * they arrive.
 *
 * Silent means that no reply had arrived at the deadline, not that this
 * thread had not read one: a thread that gets the CPU only after the
 * deadline (a busy machine) first reads what its sockets hold, without
 * waiting, and fails only the nodes that still owe. (It used to fail
 * them unread: a thread preempted past the deadline after its writes
 * could report "0 of 5 nodes answered" with every reply in its
 * sockets.) */
void dlock__redlock_round_run(rl_store *rs, int64_t deadline,
                              int (*decided)(const rl_store *, void *),
                              void *arg)
{
    struct pollfd pfd[MAX_NODES];
    int who[MAX_NODES];
    int last = 0; /* the deadline has passed: one look without waiting */
    /* for the message: the node timeout, or this round's longer wait (a
     * release, the open) */
    int64_t waited = deadline - dlock__now_ms();

    for (;;) {
        if (decided && decided(rs, arg))
            break;
        int np = 0;
        for (int i = 0; i < rs->n; i++) {
            rnode *n = &rs->nodes[i];
            if (!dlock__redlock_node_busy(n))
                continue;
            pfd[np].fd = n->ctx->fd;
            pfd[np].events = dlock__redlock_events(n->ctx, n->connecting);
            pfd[np].revents = 0;
            who[np++] = i;
        }
        if (np == 0)
            break;
        int64_t now = dlock__now_ms();
        if (last) {
            for (int k = 0; k < np; k++) {
                rnode *n = &rs->nodes[who[k]];
                char why[512];
                snprintf(why, sizeof(why), "%s: no answer within %lld ms",
                         n->where,
                         (long long)(waited > rs->node_timeout
                                         ? waited
                                         : rs->node_timeout));
                node_fail(n, DLOCK_ECONN, why);
            }
            break;
        }
        last = now >= deadline;
        int r = poll(pfd, (nfds_t)np, last ? 0 : (int)(deadline - now));
        if (r < 0 && errno != EINTR)
            break;
        for (int k = 0; k < np && r > 0; k++)
            if (pfd[k].revents)
                node_io(rs, &rs->nodes[who[k]], pfd[k].revents);
    }
}

/* The store's message for a round in which too few nodes answered. */
int dlock__redlock_quorum_failure(const rl_store *rs, int answered,
                                  const char *what)
{
    char detail[600];
    size_t o = 0;
    int rc = DLOCK_ECONN;

    detail[0] = '\0';
    for (int i = 0; i < rs->n && o + 4 < sizeof(detail); i++) {
        const rnode *n = &rs->nodes[i];
        if (!n->rc)
            continue;
        /* a refusal says more than an absence */
        if (n->rc == DLOCK_EAUTH || (n->rc != DLOCK_ECONN && rc == DLOCK_ECONN))
            rc = n->rc;
        int w = snprintf(detail + o, sizeof(detail) - o, "%s%s",
                         o ? "; " : "", n->msg);
        if (w < 0)
            break;
        o += (size_t)w;
    }
    if (o >= sizeof(detail))
        o = sizeof(detail) - 1;
    return dlock__err(rc,
                      "%s: %s: %d of %d nodes answered, quorum %d%s%s",
                      rs->where, what, answered, rs->n, rs->quorum,
                      detail[0] ? ": " : "", detail);
}

/* Counts replies whose first element (or integer value) is 1 as yes. */
int dlock__redlock_reply_yes(const redisReply *r)
{
    if (r->type == REDIS_REPLY_INTEGER)
        return r->integer == 1;
    return r->type == REDIS_REPLY_ARRAY && r->elements >= 2 &&
           r->element[0]->type == REDIS_REPLY_INTEGER &&
           r->element[0]->integer == 1;
}

void dlock__redlock_count(const rl_store *rs, tally *t)
{
    t->yes = t->no = 0;
    for (int i = 0; i < rs->n; i++) {
        const rnode *n = &rs->nodes[i];
        if (n->rc || !n->ctx)
            t->no++;
        else if (n->ngot > 0 && n->ngot >= n->want)
            dlock__redlock_reply_yes(n->got[0]) ? t->yes++ : t->no++;
    }
}

/* Decided once a quorum said yes, or too many said no for one to. */
int dlock__redlock_quorum_decided(const rl_store *rs, void *arg)
{
    tally *t = arg;

    dlock__redlock_count(rs, t);
    return t->yes >= rs->quorum || t->no > rs->n - rs->quorum;
}

/* Sends the nc commands `c` to every node and runs the round, for at most
 * round_ms (and op_deadline), until `decided` (NULL: until every node
 * answered). mu held. Returns when the round started (the lease's
 * validity counts from there); round_ms counts from when the last request
 * was written, since a node cannot answer before it is asked (a thread
 * preempted among its writes would otherwise count that against the
 * nodes). */
int64_t dlock__redlock_ask_all(rl_store *rs, rcmd *c, int nc,
                               int64_t round_ms, int64_t op_deadline,
                               int (*decided)(const rl_store *, void *),
                               void *arg)
{
    int64_t start = dlock__now_ms();

    dlock__redlock_round_begin(rs);
    for (int i = 0; i < rs->n; i++)
        for (int k = 0; k < nc; k++)
            dlock__redlock_node_send(rs, &rs->nodes[i], &c[k], K_ROUND,
                                     start);
    int64_t deadline = dlock__now_ms() + round_ms;
    if (deadline > op_deadline)
        deadline = op_deadline;
    dlock__redlock_round_run(rs, deadline, decided, arg);
    return start;
}

/* Of the nodes that answered an integer: how many, and how many said
 * other than 1 (not ours); mine[i] (may be NULL): node i said 1. */
void dlock__redlock_count_ints(const rl_store *rs, int *answered,
                               int *notours, int *mine)
{
    *answered = *notours = 0;
    for (int i = 0; i < rs->n; i++) {
        const rnode *n = &rs->nodes[i];
        int ok = !n->rc && n->ngot > 0 &&
                 n->got[0]->type == REDIS_REPLY_INTEGER;
        if (mine)
            mine[i] = ok && n->got[0]->integer == 1;
        if (ok) {
            (*answered)++;
            *notours += n->got[0]->integer != 1;
        }
    }
}
