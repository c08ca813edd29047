/* SPDX-License-Identifier: MIT */
/*
 * redlock_wait.c -- Redlock's release notifications (redlock.c has the
 * protocol, redlock_int.h what the files share): the release channels that
 * this client's waiters rely on, one subscriber connection per node read
 * by the client's background thread through an epoll fd (the loop_fd and
 * loop_run slots), and the arm and disarm slots: a waiter subscribes on
 * N - Q + 1 nodes, so that it shares one with any quorum a holder has.
 */
#include "redlock_int.h"

#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

/* ------------------------------------------------------------------------ */
/* Subscriber connections (sub_mu held)                                     */
/* ------------------------------------------------------------------------ */

static rchan *chan_get(rl_store *rs, const char *name, size_t len)
{
    for (rchan *ch = rs->chans; ch; ch = ch->next)
        if (ch->len == len && memcmp(ch->name, name, len) == 0)
            return ch;
    rchan *ch = calloc(1, sizeof(*ch));
    if (!ch)
        return NULL;
    ch->name = malloc(len + 1);
    ch->want = calloc((size_t)rs->n * 2, sizeof(int));
    if (!ch->name || !ch->want) {
        free(ch->name);
        free(ch->want);
        free(ch);
        return NULL;
    }
    ch->outstanding = ch->want + rs->n;
    memcpy(ch->name, name, len);
    ch->name[len] = '\0';
    ch->len = len;
    ch->next = rs->chans;
    rs->chans = ch;
    return ch;
}

static void chan_free_if_idle(rl_store *rs, rchan *ch)
{
    if (ch->refs > 0)
        return;
    for (int i = 0; i < rs->n; i++)
        if (ch->want[i] || ch->outstanding[i])
            return;
    for (rchan **pp = &rs->chans; *pp; pp = &(*pp)->next) {
        if (*pp == ch) {
            *pp = ch->next;
            break;
        }
    }
    free(ch->name);
    free(ch->want);
    free(ch);
}

static void sub_events(rl_store *rs, rnode *n)
{
    struct epoll_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN | (n->sub_wout ? EPOLLOUT : 0);
    if (n->sub_connecting) /* what the connect (TLS's handshake) waits for */
        ev.events = (dlock__rio_wants(n->sub) & POLLOUT ? EPOLLOUT : 0) |
                    EPOLLIN;
    ev.data.u32 = (uint32_t)n->idx;
    epoll_ctl(rs->epfd, EPOLL_CTL_MOD, n->sub->fd, &ev);
}

/* Closes node n's subscriber connection. Waiters that relied on it are
 * told to arm again when it had been serving them. */
static void sub_drop(rl_store *rs, rnode *n)
{
    int served = n->sub_up;

    if (!n->sub)
        return;
    epoll_ctl(rs->epfd, EPOLL_CTL_DEL, n->sub->fd, NULL);
    dlock__rio_free(n->sub);
    n->sub = NULL;
    n->sub_connecting = n->sub_up = n->sub_login = n->sub_wout = 0;
    n->sub_retry_at = dlock__now_ms() + SUB_RETRY_MS;
    for (rchan *ch = rs->chans, *next; ch; ch = next) {
        next = ch->next;
        served |= ch->want[n->idx] && !ch->outstanding[n->idx];
        ch->want[n->idx] = ch->outstanding[n->idx] = 0;
        chan_free_if_idle(rs, ch);
    }
    pthread_cond_broadcast(&rs->sub_cv);
    if (served)
        dlock__notify_error(rs->client);
}

static void sub_flush(rl_store *rs, rnode *n)
{
    if (n->sub_connecting)
        return;
    int r = dlock__redis_send(n->sub);
    if (r < 0) {
        sub_drop(rs, n);
        return;
    }
    if (n->sub_wout != (r == 0)) {
        n->sub_wout = r == 0;
        sub_events(rs, n);
    }
}

static void sub_start(rl_store *rs, rnode *n)
{
    char why[512];
    struct epoll_event ev;

    n->sub = dlock__redlock_start_connect(rs->cfg.tls, n, why,
                                          sizeof(why));
    if (!n->sub) {
        n->sub_retry_at = dlock__now_ms() + SUB_RETRY_MS;
        return;
    }
    n->sub_connecting = 1;
    n->sub_login = dlock__redis_append_login(n->sub, &rs->cfg);
    memset(&ev, 0, sizeof(ev));
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.u32 = (uint32_t)n->idx;
    if (epoll_ctl(rs->epfd, EPOLL_CTL_ADD, n->sub->fd, &ev) != 0) {
        dlock__rio_free(n->sub);
        n->sub = NULL;
        n->sub_connecting = 0;
        n->sub_retry_at = dlock__now_ms() + SUB_RETRY_MS;
    }
}

static void sub_send(rl_store *rs, rnode *n, rchan *ch, int subscribe)
{
    const char *argv[2] = {subscribe ? "SUBSCRIBE" : "UNSUBSCRIBE", ch->name};
    size_t lens[2] = {strlen(argv[0]), ch->len};

    if (redisAppendCommandArgv(n->sub, 2, argv, lens) != REDIS_OK) {
        sub_drop(rs, n);
        return;
    }
    ch->want[n->idx] = subscribe;
    ch->outstanding[n->idx]++;
    sub_flush(rs, n);
}

/* One reply on node n's subscriber connection. */
static void sub_reply(rl_store *rs, rnode *n, redisReply *r)
{
    if (n->sub_login > 0) {
        n->sub_login--;
        if (r->type == REDIS_REPLY_ERROR) {
            sub_drop(rs, n);
            return;
        }
        if (n->sub_login == 0) {
            n->sub_up = 1;
            pthread_cond_broadcast(&rs->sub_cv);
        }
        return;
    }
    const char *kind = rpush_kind(r);
    if (!kind)
        return;
    const char *name = r->element[1]->str;
    size_t len = r->element[1]->len;
    rchan *ch = NULL;

    for (rchan *c = rs->chans; c; c = c->next)
        if (c->len == len && !memcmp(c->name, name, len))
            ch = c;
    if (!ch)
        return;
    if (!strcmp(kind, "message") && r->element[2]->type == REDIS_REPLY_STRING) {
        const redisReply *m = r->element[2];
        /* one release arrives once per node it freed */
        if (m->len < sizeof(ch->last) && strlen(ch->last) == m->len &&
            !memcmp(ch->last, m->str, m->len))
            return;
        snprintf(ch->last, sizeof(ch->last), "%.*s", (int)m->len, m->str);
        ch->last_at = dlock__now_ms();
        /* P{NAME}:w:DB -> NAME */
        const char *end = name + len;
        while (end > name && *--end != '}')
            ;
        if (end > name + rs->cfg.prefix_len + 1)
            dlock__notify_name(rs->client, name + rs->cfg.prefix_len + 1,
                               (size_t)(end - name) - rs->cfg.prefix_len - 1);
    } else if (!strcmp(kind, "subscribe") || !strcmp(kind, "unsubscribe")) {
        if (ch->outstanding[n->idx] > 0)
            ch->outstanding[n->idx]--;
        chan_free_if_idle(rs, ch);
        pthread_cond_broadcast(&rs->sub_cv);
    }
}

static void sub_io(rl_store *rs, rnode *n, uint32_t events)
{
    if (!n->sub)
        return;
    if (n->sub_connecting) {
        char why[512];
        if (!events)
            return;
        int st = dlock__redlock_connect_step(n, n->sub, why, sizeof(why));
        if (st < 0) {
            sub_drop(rs, n);
            return;
        }
        if (st == 0) { /* TLS's handshake goes on */
            sub_events(rs, n);
            return;
        }
        n->sub_connecting = 0;
        if (n->sub_login == 0) {
            n->sub_up = 1;
            pthread_cond_broadcast(&rs->sub_cv);
        }
        n->sub_wout = 1; /* so that sub_flush() updates the interest */
    }
    sub_flush(rs, n);
    if (!n->sub || !(events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
        return;
    if (dlock__rio_fill(n->sub) != REDIS_OK) {
        sub_drop(rs, n);
        return;
    }
    for (;;) {
        redisReply *r = NULL;
        if (redisGetReplyFromReader(n->sub, (void **)&r) != REDIS_OK) {
            sub_drop(rs, n);
            return;
        }
        if (!r)
            return;
        sub_reply(rs, n, r);
        freeReplyObject(r);
        if (!n->sub)
            return;
    }
}

int dlock__redlock_loop_fd(void *st)
{
    return ((rl_store *)st)->epfd;
}

void dlock__redlock_loop_run(void *st, int readable)
{
    rl_store *rs = st;
    struct epoll_event evs[MAX_NODES];

    if (!readable)
        return;
    pthread_mutex_lock(&rs->sub_mu);
    int k = epoll_wait(rs->epfd, evs, MAX_NODES, 0);
    for (int i = 0; i < k; i++)
        if (evs[i].data.u32 < (uint32_t)rs->n)
            sub_io(rs, &rs->nodes[evs[i].data.u32], evs[i].events);
    pthread_mutex_unlock(&rs->sub_mu);
}

/* Subscribes on enough nodes (N - Q + 1) that every quorum shares one of
 * them with us, and waits for their confirmations. */
int dlock__redlock_arm(void *st, dlock__lease *l, int64_t op_deadline)
{
    rl_store *rs = st;
    rl_lease *rl = l->priv;
    int need = rs->n - rs->quorum + 1;
    int rc = DLOCK_OK;

    pthread_mutex_lock(&rs->sub_mu);
    if (!rl->chan) {
        char wake[DLOCK__REDIS_KEY_MAX];
        size_t wl = dlock__redis_wake_key(&rs->cfg, l->name, l->name_len, wake);
        rl->chan = chan_get(rs, wake, wl);
        if (!rl->chan) {
            pthread_mutex_unlock(&rs->sub_mu);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
        rl->chan->refs++;
    }
    rchan *ch = rl->chan;
    for (;;) {
        int64_t now = dlock__now_ms();
        int confirmed = 0, possible = 0;
        for (int i = 0; i < rs->n; i++) {
            rnode *n = &rs->nodes[i];
            if (!n->sub && now >= n->sub_retry_at)
                sub_start(rs, n);
            if (n->sub && !ch->want[i])
                sub_send(rs, n, ch, 1);
            if (!n->sub)
                continue;
            possible++;
            confirmed += n->sub_up && ch->want[i] && !ch->outstanding[i];
        }
        if (confirmed >= need)
            break;
        if (possible < need || now >= op_deadline) {
            rc = dlock__err(DLOCK_ECONN,
                            "%s: lock '%.100s': release notifications "
                            "confirmed by %d of %d nodes (%d needed so that "
                            "every quorum includes one)",
                            rs->where, l->name, confirmed, rs->n, need);
            break;
        }
        dlock__cond_wait_until(&rs->sub_cv, &rs->sub_mu, op_deadline);
    }
    pthread_mutex_unlock(&rs->sub_mu);
    return rc;
}

void dlock__redlock_disarm(void *st, dlock__lease *l, int acquired)
{
    rl_store *rs = st;
    rl_lease *rl = l->priv;

    (void)acquired;
    pthread_mutex_lock(&rs->sub_mu);
    rchan *ch = rl->chan;
    rl->chan = NULL;
    if (ch && ch->refs == 1) {
        /* still referenced while UNSUBSCRIBE goes out, so that a
         * connection dropped meanwhile cannot free it */
        for (int i = 0; i < rs->n; i++) {
            rnode *n = &rs->nodes[i];
            if (n->sub && ch->want[i])
                sub_send(rs, n, ch, 0);
        }
    }
    if (ch && --ch->refs == 0)
        chan_free_if_idle(rs, ch);
    pthread_mutex_unlock(&rs->sub_mu);
}
