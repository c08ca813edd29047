/* SPDX-License-Identifier: MIT */
/*
 * zk_mine.c -- the ZooKeeper store's watch on our own lock nodes (zk.c has
 * the recipe, zk_int.h what the files share).
 *
 * The watch on our own node: a holder has no lease to renew on ZooKeeper,
 * so nothing would tell it that its node was deleted (by a break, or by
 * hand). Every node we create gets an exists watch at once (sent right
 * after the create, answered before the queue's listing: no extra round
 * trip). Its deletion while we hold it, unless by our own release, is a
 * loss the core hears of (dlock__notify_lost). The C client sets the
 * watches again when a session reconnects (and the server fires those
 * whose node went meanwhile); we also look at every node of a session
 * that reconnected, so a deletion while disconnected is never missed.
 *
 * Below the recipe (zk.c) and the queue (zk_queue.c), which link and
 * unlink our nodes; above the sessions (zk_conn.c), whose events reach
 * dlock__zk_mine_event() through zs->node_event.
 */
#include "zk_int.h"

#define MINE_TELL_FOR_MS 10000 /* how long a loss is offered to the core */
#define MINE_BATCH 64          /* nodes re-checked at once */

zk_op *dlock__zk_mine_start(zk_store *zs, zk_session *s, zk_lease *zl,
                            int *zrc)
{
    pthread_mutex_lock(&zs->mu);
    zl->mid = ++zs->next_mid;
    zl->held = zl->releasing = zl->gone = zl->recheck = zl->tell = 0;
    zl->mprev = NULL;
    zl->mnext = zs->mine;
    if (zs->mine)
        zs->mine->mprev = zl;
    zs->mine = zl;
    zl->linked = 1;
    pthread_mutex_unlock(&zs->mu);
    return dlock__zk_call_start(zs, s, C_WEXISTS, zl->path, NULL, 0, 0, zrc);
}

/* zs->mu held. */
static void mine_unlink_locked(zk_store *zs, zk_lease *zl)
{
    if (!zl->linked)
        return;
    if (zl->mprev)
        zl->mprev->mnext = zl->mnext;
    else
        zs->mine = zl->mnext;
    if (zl->mnext)
        zl->mnext->mprev = zl->mprev;
    zl->mnext = zl->mprev = NULL;
    zl->linked = 0;
}

void dlock__zk_mine_unlink(zk_store *zs, zk_lease *zl)
{
    pthread_mutex_lock(&zs->mu);
    mine_unlink_locked(zs, zl);
    pthread_mutex_unlock(&zs->mu);
}

int dlock__zk_mine_hold(zk_store *zs, zk_lease *zl)
{
    int gone;

    pthread_mutex_lock(&zs->mu);
    gone = zl->gone;
    if (gone)
        mine_unlink_locked(zs, zl);
    else
        zl->held = 1;
    pthread_mutex_unlock(&zs->mu);
    return gone ? -1 : 0;
}

void dlock__zk_mine_releasing(zk_store *zs, zk_lease *zl)
{
    pthread_mutex_lock(&zs->mu);
    zl->releasing = 1;
    pthread_mutex_unlock(&zs->mu);
}

/* Our node went (zs->mu held): a loss to tell when it was held. */
static int mine_gone(zk_lease *zl)
{
    zl->gone = 1;
    if (!zl->held || zl->releasing || zl->tell)
        return 0;
    zl->tell = 1;
    zl->tell_at = dlock__now_ms();
    zl->tell_until = zl->tell_at + MINE_TELL_FOR_MS;
    return 1;
}

int dlock__zk_mine_event(zk_store *zs, zk_session *s, int type,
                         const char *path)
{
    int work = 0;

    for (zk_lease *zl = zs->mine; zl; zl = zl->mnext) {
        if (zl->sid != s->sid)
            continue;
        if (type == ZOO_SESSION_EVENT) {
            /* connected again: a deletion while disconnected is told by
             * the server when the client sets its watches again; look
             * anyway */
            zl->recheck = 1;
            work = 1;
        } else if (path && strcmp(zl->path, path) == 0) {
            if (type == ZOO_DELETED_EVENT)
                work |= mine_gone(zl);
            else if (type == ZOO_CHANGED_EVENT) {
                zl->recheck = 1; /* the watch fired: set it again */
                work = 1;
            }
        }
    }
    return work;
}

typedef struct mine_match {
    uint64_t mid;
    int matched;
} mine_match;

static int match_mine(const dlock__lease *l, void *arg)
{
    const zk_lease *zl = l->priv;
    mine_match *m = arg;

    if (!zl || zl->mid != m->mid)
        return 0;
    m->matched = 1;
    return 1;
}

/* Looks at up to MINE_BATCH nodes marked for it (zs->mu not held):
 * exists with a watch, all sent at once. */
static void mine_recheck(zk_store *zs)
{
    uint64_t mids[MINE_BATCH];
    zk_session *ss[MINE_BATCH];
    zk_op *ops[MINE_BATCH];
    char *paths = NULL;
    int n = 0;

    pthread_mutex_lock(&zs->mu);
    for (zk_lease *zl = zs->mine; zl && n < MINE_BATCH; zl = zl->mnext) {
        if (!zl->recheck || zl->releasing || zl->gone)
            continue;
        zk_session *s = dlock__zk_session_by_sid(zs, zl->sid);
        if (!s || s->state != S_CONNECTED)
            continue; /* its next connection (or expiry) says */
        if (!paths && !(paths = malloc((size_t)MINE_BATCH * ZK_PATH_MAX)))
            break; /* tried again at the next wake-up */
        zl->recheck = 0;
        s->refs++;
        ss[n] = s;
        mids[n] = zl->mid;
        snprintf(paths + (size_t)n * ZK_PATH_MAX, ZK_PATH_MAX, "%s",
                 zl->path);
        n++;
    }
    pthread_mutex_unlock(&zs->mu);
    for (int i = 0; i < n; i++) {
        int zrc;
        ops[i] = dlock__zk_call_start(zs, ss[i], C_WEXISTS,
                                      paths + (size_t)i * ZK_PATH_MAX, NULL,
                                      0, 0, &zrc);
    }
    /* on the client's thread: by the moment a hold needs it */
    int64_t deadline =
        dlock__loop_deadline(zs->client, dlock__now_ms() + zs->timeout_ms);
    for (int i = 0; i < n; i++) {
        int zrc = ops[i] ? dlock__zk_op_wait(ops[i], deadline)
                         : ZCONNECTIONLOSS;
        if (ops[i])
            dlock__zk_op_put(ops[i]);
        pthread_mutex_lock(&zs->mu);
        for (zk_lease *zl = zs->mine; zl; zl = zl->mnext) {
            if (zl->mid != mids[i])
                continue;
            if (zrc == ZNONODE)
                (void)mine_gone(zl);
            else if (zrc != ZOK && zrc != ZSESSIONEXPIRED &&
                     zrc != ZINVALIDSTATE)
                zl->recheck = 1; /* no answer: once it reconnects */
            break;
        }
        pthread_mutex_unlock(&zs->mu);
        dlock__zk_session_put(zs, ss[i]);
    }
    free(paths);
}

int64_t dlock__zk_mine_run(zk_store *zs)
{
    int64_t next = DLOCK__FOREVER;
    int again = 1;

    for (int round = 0; round < 16 && again; round++) {
        mine_recheck(zs);
        pthread_mutex_lock(&zs->mu);
        again = 0;
        for (zk_lease *zl = zs->mine; zl; zl = zl->mnext) {
            zk_session *s = dlock__zk_session_by_sid(zs, zl->sid);
            if (zl->recheck && s && s->state == S_CONNECTED)
                again = 1;
        }
        pthread_mutex_unlock(&zs->mu);
    }

    /* tell the core, one hold at a time (notify_lost takes the client's
     * mutex: never with ours held) */
    for (int k = 0; k < 1024; k++) {
        mine_match m = {0, 0};
        int64_t now = dlock__now_ms();
        pthread_mutex_lock(&zs->mu);
        for (zk_lease *zl = zs->mine; zl; zl = zl->mnext) {
            if (zl->tell && !zl->releasing && zl->tell_at <= now) {
                m.mid = zl->mid;
                /* offered again soon if the core has not registered the
                 * hold yet (the acquire is returning it) */
                zl->tell_at = now + 10 + (now - zl->tell_until +
                                          MINE_TELL_FOR_MS) / 4;
                break;
            }
        }
        pthread_mutex_unlock(&zs->mu);
        if (!m.mid)
            break;
        dlock__notify_lost(zs->client, match_mine, &m,
                           "its ZooKeeper node was deleted (dlock break, or "
                           "by hand)");
        pthread_mutex_lock(&zs->mu);
        for (zk_lease *zl = zs->mine; zl; zl = zl->mnext)
            if (zl->mid == m.mid && (m.matched || now >= zl->tell_until))
                zl->tell = 0;
        pthread_mutex_unlock(&zs->mu);
    }
    pthread_mutex_lock(&zs->mu);
    for (zk_lease *zl = zs->mine; zl; zl = zl->mnext) {
        if (zl->tell && !zl->releasing && zl->tell_at < next)
            next = zl->tell_at;
        zk_session *s = dlock__zk_session_by_sid(zs, zl->sid);
        if (zl->recheck && s && s->state == S_CONNECTED &&
            dlock__now_ms() + 100 < next)
            next = dlock__now_ms() + 100;
    }
    pthread_mutex_unlock(&zs->mu);
    return next;
}
