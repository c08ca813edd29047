/* SPDX-License-Identifier: MIT */
/*
 * zk_elect.c -- leader election's watch on ZooKeeper (docs/design.md,
 * "Leader election"; zk.c has the proclaim, a set of our node's data).
 *
 * An observer's watch is two ZooKeeper watches, set again after each
 * time they fire and before the observer reads: one on the lock node's
 * children (a candidate's node created, a leader's deleted: by its
 * release, a break, or its session's end) or, while the lock node does
 * not exist, on its creation; and one on the head child's data (a
 * proclaim). Both are ZooKeeper's own notifications on the session the
 * observer reads through, which the server sends for every change; they
 * ring the observer's eventfd (zk_conn.c's event handler, through the
 * zk_watch's bell), which its wait polls beside the observer's cancel
 * descriptor. A session that ends rings it too: the watches are gone
 * with it, so the wait says the watch broke and the observer opens
 * another.
 */
#include "zk_int.h"

#include <poll.h>
#include <sys/eventfd.h>

typedef struct zk_obs {
    zk_session *s; /* a reference */
    int efd;
    char parent[ZK_PARENT_MAX];
    char lead[ZK_PATH_MAX]; /* the head child watched ("" none) */
    zk_watch wp, wl;        /* on parent, on lead (in zs->watches) */
} zk_obs;

/* Sets both watches (again): the children of the lock node (or its
 * creation), then the data of its head child. DLOCK_OK or an error. */
static int arm(zk_store *zs, zk_obs *o, int64_t deadline)
{
    zk_op *kids = NULL, *op = NULL;
    char lead[ZK_PATH_MAX] = "";
    int zrc;

    pthread_mutex_lock(&zs->mu);
    o->wp.fired = o->wl.fired = 0;
    pthread_mutex_unlock(&zs->mu);
    zrc = dlock__zk_call(zs, o->s, C_WCHILDREN, o->parent, NULL, 0, 0,
                         deadline, &kids);
    if (zrc == ZNONODE) {
        /* no lock node yet: its creation fires the watch */
        zrc = dlock__zk_call(zs, o->s, C_WEXISTS, o->parent, NULL, 0, 0,
                             deadline, &op);
        if (op)
            dlock__zk_op_put(op);
        if (zrc == ZNONODE)
            zrc = ZOK;
    } else if (zrc == ZOK) {
        if (dlock__zk_sort_children(&kids->kids) > 0)
            snprintf(lead, sizeof(lead), "%s/%.100s", o->parent,
                     kids->kids.data[0]);
        dlock__zk_op_put(kids);
    }
    if (zrc != ZOK)
        return dlock__zk_error(zs, "watching the lock node", zrc);
    pthread_mutex_lock(&zs->mu);
    snprintf(o->lead, sizeof(o->lead), "%s", lead);
    pthread_mutex_unlock(&zs->mu);
    if (!lead[0])
        return DLOCK_OK;
    /* the head's data (a proclaim), or its deletion (the children watch
     * sees that too) */
    zrc = dlock__zk_call(zs, o->s, C_WEXISTS, lead, NULL, 0, 0, deadline,
                         &op);
    if (op)
        dlock__zk_op_put(op);
    return zrc == ZOK || zrc == ZNONODE
               ? DLOCK_OK
               : dlock__zk_error(zs, "watching the leader's node", zrc);
}

int dlock__zk_watch_open(void *st, const char *name, size_t len, void **out,
                         int64_t op_deadline)
{
    zk_store *zs = st;
    zk_obs *o;
    int rc = DLOCK_OK;

    *out = NULL;
    if (!(o = calloc(1, sizeof(*o))))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    o->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (o->efd < 0) {
        free(o);
        return dlock__err(DLOCK_ENOMEM, "eventfd: %s", strerror(errno));
    }
    o->s = dlock__zk_any_session(zs, op_deadline, &rc);
    if (!o->s) {
        close(o->efd);
        free(o);
        return rc ? rc : dlock__err(DLOCK_ECONN, "zk %s: no session",
                                    zs->redacted);
    }
    dlock__zk_lock_path(zs, name, len, o->parent);
    o->wp.path = o->parent;
    o->wl.path = o->lead;
    o->wp.sid = o->wl.sid = o->s->sid;
    o->wp.bell = o->wl.bell = &o->efd;
    pthread_mutex_lock(&zs->mu);
    o->wp.next = &o->wl;
    o->wl.next = zs->watches;
    zs->watches = &o->wp;
    pthread_mutex_unlock(&zs->mu);
    rc = arm(zs, o, op_deadline);
    if (rc) {
        dlock__zk_watch_close(zs, o);
        return rc;
    }
    *out = o;
    return DLOCK_OK;
}

int dlock__zk_watch_wait(void *st, void *wp, int64_t deadline, int cancel_fd)
{
    zk_store *zs = st;
    zk_obs *o = wp;

    for (;;) {
        int64_t left = deadline - dlock__now_ms();
        if (left <= 0)
            return DLOCK_EBUSY;
        struct pollfd p[2] = {{o->efd, POLLIN, 0}, {cancel_fd, POLLIN, 0}};
        int n = poll(p, cancel_fd >= 0 ? 2 : 1,
                     left > 60000 ? 60000 : (int)left);
        if (n < 0 && errno != EINTR)
            return dlock__err(DLOCK_ECONN, "poll: %s", strerror(errno));
        if (n > 0 && cancel_fd >= 0 && (p[1].revents & POLLIN))
            return DLOCK_EBUSY;
        if (n <= 0 || !(p[0].revents & POLLIN))
            continue;
        uint64_t v;
        (void)!read(o->efd, &v, sizeof(v));
        pthread_mutex_lock(&zs->mu);
        int ended = o->s->state == S_EXPIRED || o->s->state == S_AUTHFAIL;
        pthread_mutex_unlock(&zs->mu);
        if (ended)
            return dlock__err(DLOCK_ECONN,
                              "zk %s: the observer's session ended",
                              zs->redacted);
        /* set again before the caller reads: nothing written after the
         * read is missed */
        int rc = arm(zs, o, dlock__now_ms() + zs->timeout_ms);
        return rc ? rc : DLOCK_OK;
    }
}

void dlock__zk_watch_close(void *st, void *wp)
{
    zk_store *zs = st;
    zk_obs *o = wp;

    if (!o)
        return;
    pthread_mutex_lock(&zs->mu);
    for (zk_watch **pp = &zs->watches; *pp;) {
        if (*pp == &o->wp || *pp == &o->wl)
            *pp = (*pp)->next;
        else
            pp = &(*pp)->next;
    }
    pthread_mutex_unlock(&zs->mu);
    dlock__zk_session_put(zs, o->s);
    close(o->efd);
    free(o);
}
