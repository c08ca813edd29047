/* SPDX-License-Identifier: MIT */
/*
 * etcd.c -- the etcd store, through etcd's v3 JSON gateway (libcurl, cJSON).
 *
 * The algorithm of etcd's own concurrency mutex, so that `etcdctl lock`
 * and dlock exclude each other:
 *  - Lock NAME with prefix P is the key range P/NAME/ ('/' and '%' in NAME
 *    escaped as %2F, %25). An acquisition puts P/NAME/<lease id in hex>,
 *    attached to the client's lease, in a transaction only if that key is
 *    absent; the value is "<owner>\n<description>".
 *  - The key with the lowest create revision holds the lock. A waiter
 *    waits for the keys ahead of its own to be deleted, told by the
 *    client's one watch stream (a WebSocket to /v3/watch with one watch
 *    on the whole prefix, deletions only; see "The watch stream").
 *    Fencing token: the holder key's create revision (every write to the
 *    cluster raises the revision).
 *  - One acquire is one round trip: the same transaction that puts the
 *    key reads the keys ahead of it (up to ETCD_AHEAD_MAX), which tells
 *    whether we hold the lock, or which deletions make us the holder (no
 *    second look after the last one goes).
 *  - Liveness is the lease: one lease per client and distinct TTL (ttl_ms
 *    rounded up to seconds; the server may raise it to its minimum), kept
 *    alive by the client's background thread every TTL/3; a
 *    DLOCK_NO_RENEW acquisition has a lease of its own, kept alive only
 *    while it waits (and once when acquired). A lease the
 *    server no longer knows, or one we could not keep alive for 2/3 of its
 *    TTL, makes every hold on it lost (callback, DLOCK_ELOST).
 *  - Two threads of one client are two owners but share the lease, so a
 *    second concurrent acquisition of one name by one client uses the key
 *    P/NAME/<lease hex>-<n>; the client reserves the keys it uses.
 *  - A key whose delete failed (its answer lost) stays reserved and is
 *    deleted by the background thread: no later acquisition of the same key
 *    can be deleted by mistake.
 *
 * The store's files (etcd_int.h is what they share): etcd.c, this one, the
 * lock protocol above (acquire, release, extend, open and close: the
 * backend's slots); etcd_conn.c, the HTTP/JSON client
 * of the v3 gateway (every request is an idempotent POST with a deadline,
 * retried on the next endpoint); etcd_wait.c, the watch stream, read by
 * the client thread, which wakes the waiters a deletion concerns (one
 * thread hop); etcd_lease.c, the leases and the background thread;
 * etcd_keys.c, a lock's keys, the client's reservations and its holds'
 * keys watched for their deletion; etcd_operate.c, inspect, list and
 * break.
 */
#include "etcd_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Keys                                                                     */
/* ------------------------------------------------------------------------ */

/* The caller's wait is over: its deadline passed, or dlock_cancel() asked
 * (etcd_cancel() wakes the waiters to see it). */
static int wait_over(const dlock__lease *l)
{
    return dlock__now_ms() >= l->deadline || dlock__lease_cancelled(l);
}

/* Picks and reserves this acquisition's key: base + lease hex, then
 * "-1", "-2"... when another owner of this client uses it. */
static int pick_key(etcd_store *es, const dlock__lease *l, etcd_hold *eh)
{
    size_t n = dlock__etcd_lock_base(es, l->name, l->name_len, eh->key);
    /* a reader's key: "r" + lease hex; a permit's "s<N>-" + lease hex; a
     * writer's the lease hex (etcdctl lock's form) */
    char kind[16] = "";
    if (l->kind == DLOCK__READ)
        snprintf(kind, sizeof(kind), "r");
    else if (l->kind == DLOCK__PERMIT)
        snprintf(kind, sizeof(kind), "s%u-", l->permits);
    size_t m = n + (size_t)sprintf(eh->key + n, "%s%" PRIx64, kind,
                                   (uint64_t)eh->lease->id);

    pthread_mutex_lock(&es->mu);
    for (unsigned i = 0;; i++) {
        size_t len = m;
        if (i > 0)
            len += (size_t)sprintf(eh->key + m, "-%u", i);
        int r = dlock__etcd_slot_take(es, eh->key, len);
        if (r == 0) {
            eh->key_len = len;
            break;
        }
        if (r < 0) {
            pthread_mutex_unlock(&es->mu);
            return enomem();
        }
    }
    pthread_mutex_unlock(&es->mu);
    return DLOCK_OK;
}

/* The key must still be deleted: the background thread will. It stays
 * reserved until then. */
static void orphan_add(etcd_store *es, const char *key, size_t len)
{
    etcd_orphan *o = malloc(sizeof(*o) + len);

    pthread_mutex_lock(&es->mu);
    if (o) {
        o->len = len;
        memcpy(o->key, key, len);
        o->next_try = dlock__now_ms() + 100;
        o->next = es->orphans;
        es->orphans = o;
        dlock__etcd_arm_timer(es, o->next_try);
    } else {
        /* cannot remember it: the lease ends it */
        dlock__etcd_slot_drop(es, key, len);
    }
    pthread_mutex_unlock(&es->mu);
}

/* ------------------------------------------------------------------------ */
/* Acquire, release, extend                                                 */
/* ------------------------------------------------------------------------ */

/* Ends a hold's reservation and lease reference. */
static void hold_done(etcd_store *es, etcd_hold *eh, int deleted)
{
    if (deleted) {
        pthread_mutex_lock(&es->mu);
        dlock__etcd_slot_drop(es, eh->key, eh->key_len);
        pthread_mutex_unlock(&es->mu);
    } else {
        orphan_add(es, eh->key, eh->key_len);
    }
    dlock__etcd_lease_put(es, eh->lease);
    eh->lease = NULL;
}

/* Deletes our key (waiter giving up, or a failed acquisition); on failure
 * the background thread retries. Drops the reservation and the lease. */
static void give_up_key(etcd_store *es, etcd_hold *eh)
{
    char kb[ETCD_B64_MAX], body[ETCD_B64_MAX + 32];
    cJSON *j = NULL;
    int deleted;

    dlock__etcd_b64_encode(eh->key, eh->key_len, kb);
    snprintf(body, sizeof(body), "{\"key\":\"%s\"}", kb);
    deleted = dlock__etcd_request(es, "/v3/kv/deleterange", body,
                                  dlock__now_ms() + es->timeout_ms, &j,
                                  "deleting a waiter's key") == DLOCK_OK;
    if (deleted)
        cJSON_Delete(j);
    hold_done(es, eh, deleted);
}

/* Waiter w leaves: unregistered from the stream, its key given up. */
static void leave(etcd_store *es, etcd_hold *eh, etcd_waiter *w)
{
    dlock__etcd_waiter_end(es, w);
    give_up_key(es, eh);
}

/* A waiter that relied on the stream found no answer when it re-armed
 * (no member up, no leader yet): it keeps its key, hence its place, and
 * sleeps until a keepalive of the client is answered after `ka_seen`, its
 * lease dies, its wait ends or a cancel; then it re-arms. Unregistered
 * from the stream meanwhile. 1 when its lease died meanwhile (the wait
 * ended: it starts again on a new lease), else 0: re-arm. See
 * docs/design.md, "etcd: one watch stream per client". */
static int park(etcd_store *es, dlock__lease *l, etcd_hold *eh,
                etcd_waiter *w, uint64_t ka_seen)
{
    pthread_mutex_lock(&es->mu);
    dlock__etcd_waiter_del(es, w);
    while (es->ka_gen == ka_seen && !eh->lease->dead && !wait_over(l))
        dlock__cond_wait_until(&es->acv, &es->mu, l->deadline);
    pthread_mutex_unlock(&es->mu);
    if (!eh->lease->dead)
        return 0;
    leave(es, eh, w);
    return 1;
}

/* A call of waiter w's wait (a look, the stream's re-arm) failed with rc.
 * One that relied on the stream and may still wait parks (park()): 1
 * when its lease died meanwhile, else 0 (look again). Any other leaves:
 * DLOCK_EBUSY when its wait is over (it answered "held" before), else
 * rc. */
static int call_failed(etcd_store *es, dlock__lease *l, etcd_hold *eh,
                       etcd_waiter *w, uint64_t ka_seen, int relied,
                       int may_wait, int rc)
{
    if (rc == DLOCK_ECONN && relied && may_wait && !wait_over(l))
        return park(es, l, eh, w, ka_seen); /* keeps our place */
    leave(es, eh, w);
    if (may_wait && wait_over(l)) {
        l->retry_ms = -1;
        return DLOCK_EBUSY;
    }
    return rc;
}

/* One acquisition on lease eh->lease. DLOCK_OK, DLOCK_EBUSY, an error,
 * or 1 = the lease died underneath (start again on a new one). On any
 * result but DLOCK_OK the key and the lease reference are given up. */
static int acquire_on(etcd_store *es, dlock__lease *l, etcd_hold *eh,
                      int64_t op_ms)
{
    char base[ETCD_KEY_MAX], kb[ETCD_B64_MAX], bb[ETCD_B64_MAX];
    char eb[ETCD_B64_MAX], vb[4 * 300 / 3 + 8], val[300];
    char body[6 * ETCD_B64_MAX + 1024];
    size_t base_len = dlock__etcd_lock_base(es, l->name, l->name_len, base);
    etcd_waiter w;
    cJSON *j = NULL;
    int rc, vlen, need_look = 0, relied = 0;
    int may_wait = l->deadline > dlock__now_ms();

    memset(&w, 0, sizeof(w));
    rc = dlock__cond_init(&w.cv);
    if (rc != DLOCK_OK) {
        give_up_key(es, eh);
        return rc;
    }
    vlen = snprintf(val, sizeof(val), "%s\n%s", l->owner, l->desc);
    if (vlen >= (int)sizeof(val))
        vlen = (int)sizeof(val) - 1;
    dlock__etcd_b64_encode(val, (size_t)vlen, vb);
    dlock__etcd_b64_encode(eh->key, eh->key_len, kb);
    dlock__etcd_b64_encode(base, base_len, bb);
    dlock__etcd_range_end_b64(base, base_len, eb);
    w.mine = kb;
    w.reader = l->kind == DLOCK__READ;
    w.permits = l->kind == DLOCK__PERMIT ? l->permits : 0;
    /* the stream is up: register first, so that no deletion after our
     * transaction can be missed (the waiter's keys ahead, and our own
     * key's: etcd_keys.c) */
    dlock__etcd_mine_link(es, eh);
    pthread_mutex_lock(&es->mu);
    if (may_wait && es->sstate == ST_UP)
        dlock__etcd_waiter_add(es, &w, es->sgen);
    pthread_mutex_unlock(&es->mu);
    snprintf(body, sizeof(body),
             "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\","
             "\"create_revision\":\"0\"}],"
             "\"success\":["
             "{\"request_put\":{\"key\":\"%s\",\"value\":\"%s\","
             "\"lease\":\"%" PRId64 "\"}},"
             "{\"request_range\":{\"key\":\"%s\",\"range_end\":\"%s\","
             "\"sort_order\":\"DESCEND\",\"sort_target\":\"CREATE\","
             "\"limit\":\"%d\",\"keys_only\":true}}],"
             "\"failure\":[{\"request_range\":{\"key\":\"%s\","
             "\"keys_only\":true}}]}",
             kb, kb, vb, eh->lease->id, bb, eb, ETCD_AHEAD_MAX + 1, kb);
    rc = dlock__etcd_request(es, "/v3/kv/txn", body,
                             dlock__now_ms() + op_ms, &j,
                             "putting the lock key");
    if (rc == ETCD_NOLEASE) {
        dlock__etcd_waiter_end(es, &w);
        dlock__etcd_lease_lost(es, eh->lease, "etcd: the server no longer "
                                              "knows the client's lease");
        give_up_key(es, eh);
        return 1;
    }
    if (rc != DLOCK_OK) {
        leave(es, eh, &w); /* the put may have happened */
        return rc;
    }
    if (cJSON_IsTrue(jget(j, "succeeded"))) {
        const cJSON *r = txn_resp(j, 1, "response_range");
        const cJSON *me = kvs_at(r, 0);
        eh->rev = me ? jint(me, "create_revision") : 0;
        dlock__etcd_mine_rev(es, eh, eh->rev);
        if (!me || !jstr(me, "key") || strcmp(jstr(me, "key"), kb) != 0 ||
            eh->rev <= 0) {
            cJSON_Delete(j);
            leave(es, eh, &w);
            return dlock__err(DLOCK_EPROTO, "etcd %s: the lock transaction's "
                                            "answer lacks our key",
                              es->redacted);
        }
        pthread_mutex_lock(&es->mu);
        rc = dlock__etcd_waiter_fill(&w, r, 1, (int)jint(r, "more"),
                                     jint(jget(j, "header"), "revision"));
        pthread_mutex_unlock(&es->mu);
        cJSON_Delete(j);
        if (rc != 0) {
            leave(es, eh, &w);
            return enomem();
        }
        /* no stream yet: what happened since our answer is unknown */
        need_look = may_wait && !w.gen &&
                    (!dlock__etcd_waiter_room(&w) || w.partial);
    } else {
        /* our key is there already: an earlier try whose answer was lost */
        const cJSON *me = kvs_at(txn_resp(j, 0, "response_range"), 0);
        eh->rev = me ? jint(me, "create_revision") : 0;
        dlock__etcd_mine_rev(es, eh, eh->rev);
        cJSON_Delete(j);
        if (eh->rev <= 0) {
            leave(es, eh, &w);
            return dlock__err(DLOCK_EPROTO, "etcd %s: the lock transaction "
                                            "failed but found no key",
                              es->redacted);
        }
        w.nahead = 0;
        w.partial = 1; /* unknown: look */
        need_look = 1;
    }

    for (;;) {
        int64_t now = dlock__now_ms();
        int64_t dl = now + op_ms;

        if (may_wait && dl > l->deadline)
            dl = l->deadline; /* no call of a wait runs past its end */
        pthread_mutex_lock(&es->mu);
        uint64_t ka_seen = es->ka_gen; /* before this turn's calls */
        pthread_mutex_unlock(&es->mu);
        if (w.gen)
            relied = 1;
        if (need_look && (w.gen || !may_wait || now >= l->deadline ||
                          dlock__lease_cancelled(l))) {
            rc = dlock__etcd_look(es, eh, &w, base, base_len,
                                  may_wait ? dl : now + op_ms);
            need_look = 0;
            if (rc == 1) {
                int dead = eh->lease->dead;
                leave(es, eh, &w);
                /* else deleted by someone else: a break that saw it
                 * holding just as the keys ahead went (start again) */
                return dead ? 1 : 2;
            }
            if (rc != DLOCK_OK) {
                rc = call_failed(es, l, eh, &w, ka_seen, relied, may_wait,
                                 rc);
                if (rc)
                    return rc;
                need_look = 1;
                continue;
            }
            dlock__etcd_mine_seen(es, eh, w.gen);
        }
        pthread_mutex_lock(&es->mu);
        long clash = w.clash;
        int holds = !w.pending && dlock__etcd_waiter_room(&w) && !w.partial;
        pthread_mutex_unlock(&es->mu);
        if (clash) {
            leave(es, eh, &w);
            if (clash < 0) /* a permit's waiter saw a lock's key */
                return dlock__err(DLOCK_EINVAL,
                                  "etcd %s: lock '%.200s' is held or "
                                  "awaited as a lock, not as a semaphore",
                                  es->redacted, l->name);
            return dlock__err(DLOCK_EINVAL,
                              "etcd %s: lock '%.200s' is a semaphore of %ld "
                              "permits%s",
                              es->redacted, l->name, clash,
                              w.permits ? " (every handle of a name must "
                                          "say the same)"
                                        : ", not a lock");
        }
        pthread_mutex_lock(&es->mu);
        /* the keys ahead went while this process could not keep the lease
         * alive (stopped, starved): the stream tells what happened up to a
         * revision, not that our key outlived it; past the lease's safe
         * life our key may be gone and the lock someone else's, so the
         * lease is lost, not the lock won (found by the safety suite's
         * waiter-stop: a waiter SIGSTOPped past its lease, woken by the
         * release that preceded its key's expiry) */
        int stale = holds && eh->waited && !eh->lease->dead &&
                    dlock__now_ms() >= dlock__etcd_lease_limit(eh->lease);
        pthread_mutex_unlock(&es->mu);
        if (stale) {
            dlock__etcd_lease_lost(es, eh->lease,
                                   "etcd: the client's lease could not be "
                                   "kept alive (the process did not run "
                                   "for its safe life)");
            leave(es, eh, &w);
            return 1;
        }
        if (holds && !need_look) {
            dlock__etcd_waiter_end(es, &w);
            if (dlock__etcd_mine_hold(es, eh) != 0) {
                give_up_key(es, eh); /* deleted already: start again */
                return 2;
            }
            l->token = (uint64_t)eh->rev;
            return DLOCK_OK;
        }
        if (!may_wait || wait_over(l)) {
            leave(es, eh, &w);
            l->retry_ms = -1;
            return DLOCK_EBUSY;
        }
        eh->waited = 1;
        if (!w.gen || need_look) {
            /* arm: the stream first, then look (no missed deletion) */
            uint64_t gen = 0;
            rc = dlock__etcd_stream_up(es, dl, &gen);
            if (rc == DLOCK_OK) {
                pthread_mutex_lock(&es->mu);
                dlock__etcd_waiter_del(es, &w);
                dlock__etcd_waiter_add(es, &w, gen);
                pthread_mutex_unlock(&es->mu);
            } else if ((rc = call_failed(es, l, eh, &w, ka_seen, relied,
                                         may_wait, rc)) != 0) {
                return rc;
            }
            need_look = 1;
            continue;
        }
        /* wait for the keys ahead to go */
        pthread_mutex_lock(&es->mu);
        while (!w.broken && !w.mine_gone && !eh->lease->dead &&
               !(dlock__etcd_waiter_room(&w) && !w.pending) &&
               !wait_over(l))
            dlock__cond_wait_until(&w.cv, &es->mu, l->deadline);
        int broken = w.broken, gone = w.mine_gone;
        int emptied = dlock__etcd_waiter_room(&w) && !w.pending;
        int partial = w.partial;
        pthread_mutex_unlock(&es->mu);
        if (eh->lease->dead) {
            leave(es, eh, &w);
            return 1;
        }
        if (gone) {
            need_look = 1; /* a look says for sure (and ends the wait) */
            continue;
        }
        if (emptied)
            l->woken_us = dlock__now_us(); /* for the metrics */
        if (emptied && !partial)
            continue; /* holds (checked above) */
        if (emptied || broken) {
            if (broken) {
                pthread_mutex_lock(&es->mu);
                dlock__etcd_waiter_del(es, &w); /* re-armed above */
                pthread_mutex_unlock(&es->mu);
            }
            need_look = 1;
            continue;
        }
        /* the deadline: checked above */
    }
}

static int64_t ttl_seconds(int64_t ttl_ms)
{
    int64_t s = (ttl_ms + 999) / 1000;
    return s < 1 ? 1 : s;
}

static int etcd_acquire(void *st, dlock__lease *l, int64_t op_deadline)
{
    etcd_store *es = st;
    etcd_hold *eh = l->priv;
    int64_t op_ms = op_deadline - dlock__now_ms();
    int rc = DLOCK_ECONN, taken = 0;

    /* a waiter counts the keys ahead of its own, 64 at a time: a
     * semaphore of more permits could not tell 64 from more */
    if (l->kind == DLOCK__PERMIT && l->permits > ETCD_AHEAD_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "etcd %s: lock '%.200s': a semaphore on etcd has "
                          "at most %d permits, not %u",
                          es->redacted, l->name, ETCD_AHEAD_MAX, l->permits);
    if (op_ms < 1)
        op_ms = 1;
    for (int attempt = 0; attempt < 3; attempt++) {
        if (attempt > 0 && l->deadline != DLOCK__FOREVER) {
            /* again after the lease ended mid-wait: what is left of the
             * caller's wait bounds the new grant and put too */
            int64_t left = l->deadline - dlock__now_ms();
            if (left < op_ms)
                op_ms = left < 1 ? 1 : left;
        }
        eh->lease = dlock__etcd_lease_get(es, ttl_seconds(l->ttl_ms),
                                          (l->flags & DLOCK_NO_RENEW) != 0,
                                          dlock__now_ms() + op_ms, &rc);
        eh->waited = 0;
        if (!eh->lease)
            return rc;
        rc = pick_key(es, l, eh);
        if (rc != DLOCK_OK) {
            dlock__etcd_lease_put(es, eh->lease);
            eh->lease = NULL;
            return rc;
        }
        rc = acquire_on(es, l, eh, op_ms);
        if (rc != DLOCK_OK)
            dlock__etcd_mine_unlink(es, eh);
        if (rc == 2 && taken < 8) {
            /* our key was deleted before we could hold it (a break that
             * saw it as the holder just as the keys ahead went): in the
             * queue again, at its end, while the wait lasts */
            taken++;
            attempt--;
            if (!wait_over(l))
                continue;
            l->retry_ms = -1;
            return dlock__err(DLOCK_EBUSY,
                              "etcd %s: lock '%.200s': our key was deleted "
                              "(broken) as we were about to hold it",
                              es->redacted, l->name);
        }
        if (rc == 2)
            return dlock__err(DLOCK_ECONN, "etcd %s: lock '%.200s': our key "
                                           "was deleted every time",
                              es->redacted, l->name);
        if (rc == DLOCK_OK && eh->lease->own) {
            /* DLOCK_NO_RENEW: nobody keeps the lease alive from now on,
             * but once more at once when the wait took a while, so that
             * the hold lasts a whole ttl from its acquisition */
            etcd_lease *el = eh->lease;
            pthread_mutex_lock(&es->mu);
            el->held = 1;
            el->next_ka = eh->waited ? dlock__now_ms() : INT64_MAX;
            dlock__etcd_arm_timer(es, eh->waited
                                          ? el->next_ka
                                          : dlock__etcd_lease_limit(el));
            pthread_mutex_unlock(&es->mu);
            if (eh->waited)
                dlock__loop_wake(es->client);
        }
        if (rc != 1)
            return rc;
        rc = dlock__err(DLOCK_ECONN, "etcd %s: the lease ended while "
                                     "acquiring", es->redacted);
        if (wait_over(l) && l->deadline != DLOCK__FOREVER)
            break;
    }
    return rc;
}

static int etcd_release(void *st, dlock__lease *l, int64_t op_deadline)
{
    etcd_store *es = st;
    etcd_hold *eh = l->priv;
    char kb[ETCD_B64_MAX], body[2 * ETCD_B64_MAX + 256];
    cJSON *j = NULL;
    int rc;

    if (!eh->lease) {
        dlock__etcd_mine_unlink(es, eh);
        return dlock__err(DLOCK_ENOTHELD, "etcd %s: not held", es->redacted);
    }
    dlock__etcd_b64_encode(eh->key, eh->key_len, kb);
    snprintf(body, sizeof(body),
             "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\","
             "\"create_revision\":\"%" PRId64 "\"}],"
             "\"success\":[{\"request_delete_range\":{\"key\":\"%s\"}}]}",
             kb, eh->rev, kb);
    dlock__etcd_mine_releasing(es, eh); /* our delete's event is ours */
    rc = dlock__etcd_request(es, "/v3/kv/txn", body, op_deadline, &j,
                             "deleting the lock key");
    dlock__etcd_mine_unlink(es, eh);
    if (rc != DLOCK_OK) {
        hold_done(es, eh, 0);
        return rc == ETCD_NOLEASE ? DLOCK_EPROTO : rc;
    }
    int ours = cJSON_IsTrue(jget(j, "succeeded"));
    cJSON_Delete(j);
    hold_done(es, eh, 1);
    return ours ? DLOCK_OK
                : dlock__err(DLOCK_ENOTHELD, "etcd %s: the lock key was "
                                             "already gone (lease expired or "
                                             "deleted)",
                             es->redacted);
}

static int etcd_extend(void *st, dlock__lease *l, int64_t ttl_ms,
                       int64_t op_deadline)
{
    etcd_store *es = st;
    etcd_hold *eh = l->priv;
    etcd_lease *el = eh->lease, *to = NULL;
    char kb[ETCD_B64_MAX], body[2 * ETCD_B64_MAX + 256];
    cJSON *j = NULL;
    int rc;

    if (!el || el->dead)
        return dlock__err(DLOCK_ENOTHELD, "etcd %s: the lease of this hold "
                                          "ended", es->redacted);
    dlock__etcd_b64_encode(eh->key, eh->key_len, kb);
    if (ttl_seconds(ttl_ms) == el->want_s) {
        rc = dlock__etcd_keepalive(es, el, op_deadline);
        if (rc == ETCD_NOLEASE) {
            dlock__etcd_lease_lost(es, el, "etcd: the server no longer "
                                           "knows the client's lease");
            return dlock__err(DLOCK_ENOTHELD, "etcd %s: the lease of this "
                                              "hold ended", es->redacted);
        }
        if (rc != DLOCK_OK)
            return rc;
        snprintf(body, sizeof(body),
                 "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\","
                 "\"create_revision\":\"%" PRId64 "\"}]}",
                 kb, eh->rev);
    } else {
        /* move the key to a lease of the new length (its create revision,
         * hence the token and its place in the queue, stay) */
        to = dlock__etcd_lease_get(es, ttl_seconds(ttl_ms), el->own,
                                   op_deadline, &rc);
        if (!to)
            return rc;
        if (to->own) {
            pthread_mutex_lock(&es->mu);
            to->held = 1;
            to->next_ka = INT64_MAX;
            pthread_mutex_unlock(&es->mu);
        }
        snprintf(body, sizeof(body),
                 "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\","
                 "\"create_revision\":\"%" PRId64 "\"}],"
                 "\"success\":[{\"request_put\":{\"key\":\"%s\","
                 "\"ignore_value\":true,\"lease\":\"%" PRId64 "\"}}]}",
                 kb, eh->rev, kb, to->id);
    }
    rc = dlock__etcd_request(es, "/v3/kv/txn", body, op_deadline, &j,
                             "checking the lock key");
    if (rc != DLOCK_OK) {
        if (to)
            dlock__etcd_lease_put(es, to);
        return rc == ETCD_NOLEASE ? DLOCK_ECONN : rc;
    }
    int ours = cJSON_IsTrue(jget(j, "succeeded"));
    cJSON_Delete(j);
    if (!ours) {
        if (to)
            dlock__etcd_lease_put(es, to);
        return dlock__err(DLOCK_ENOTHELD, "etcd %s: the lock key is gone",
                          es->redacted);
    }
    if (to) {
        eh->lease = to;
        dlock__etcd_lease_put(es, el);
    }
    return DLOCK_OK;
}

/* ------------------------------------------------------------------------ */
/* Open and close                                                           */
/* ------------------------------------------------------------------------ */

static void etcd_close(void *st)
{
    etcd_store *es = st;

    if (!es)
        return;
    /* revoking a lease deletes every key still on it; when the cluster
     * did not answer the last request, or stops answering now, the leases
     * are left to expire (not one more timeout per lease) */
    if (es->unreachable)
        es->offline = 1;
    while (es->leases && !es->offline) {
        etcd_lease *el = es->leases;
        es->leases = el->next;
        if (dlock__etcd_lease_revoke(es, el->id,
                                     dlock__now_ms() + es->timeout_ms) ==
            DLOCK_ECONN)
            es->offline = 1;
        free(el);
    }
    while (es->leases) {
        etcd_lease *el = es->leases;
        es->leases = el->next;
        free(el);
    }
    while (es->orphans) {
        etcd_orphan *o = es->orphans;
        es->orphans = o->next;
        free(o);
    }
    for (size_t i = 0; i < es->nbuckets; i++) {
        while (es->slots[i]) {
            etcd_slot *s = es->slots[i];
            es->slots[i] = s->next;
            free(s);
        }
    }
    free(es->slots);
    void *idle[DLOCK__POOL_MAX];
    for (unsigned i = dlock__pool_drain(&es->pool, idle); i > 0; i--)
        dlock__etcd_conn_free(idle[i - 1]);
    for (size_t i = 0; i < es->nep; i++)
        free(es->ep[i]);
    free(es->ep);
    if (es->password) {
        dlock__wipe(es->password, strlen(es->password));
        free(es->password);
    }
    if (es->token) {
        dlock__wipe(es->token, strlen(es->token));
        free(es->token);
    }
    free(es->user);
    free(es->cacert);
    free(es->cert);
    free(es->key);
    free(es->redacted);
    if (es->sh)
        curl_easy_cleanup(es->sh);
    dlock__buf_free(&es->sin);
    dlock__buf_free(&es->smsg);
    if (es->ep_fd >= 0)
        close(es->ep_fd);
    if (es->timer_fd >= 0)
        close(es->timer_fd);
    pthread_cond_destroy(&es->scv);
    pthread_cond_destroy(&es->acv);
    pthread_mutex_destroy(&es->sio);
    pthread_mutex_destroy(&es->mu);
    free(es);
    curl_global_cleanup();
}

static int etcd_open(void **out, dlock_client *c, const dlock__uri *u,
                     int64_t timeout_ms)
{
    etcd_store *es;
    int rc;

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return dlock__err(DLOCK_ENOMEM, "etcd: libcurl failed to start");
    es = calloc(1, sizeof(*es));
    if (!es) {
        curl_global_cleanup();
        return enomem();
    }
    es->sin.max = es->smsg.max = ETCD_RESP_MAX;
    if (dlock__cond_init(&es->scv) != DLOCK_OK) {
        free(es);
        curl_global_cleanup();
        return enomem();
    }
    if (dlock__cond_init(&es->acv) != DLOCK_OK) {
        pthread_cond_destroy(&es->scv);
        free(es);
        curl_global_cleanup();
        return enomem();
    }
    pthread_mutex_init(&es->mu, NULL);
    pthread_mutex_init(&es->sio, NULL);
    es->sfd = CURL_SOCKET_BAD;
    es->client = c;
    es->timeout_ms = timeout_ms;
    es->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    es->ep_fd = epoll_create1(EPOLL_CLOEXEC);
    es->redacted = strdup(u->redacted);
    struct epoll_event tev;
    memset(&tev, 0, sizeof(tev));
    tev.events = EPOLLIN;
    if (es->timer_fd < 0 || es->ep_fd < 0 || !es->redacted ||
        epoll_ctl(es->ep_fd, EPOLL_CTL_ADD, es->timer_fd, &tev) != 0) {
        es->offline = 1;
        etcd_close(es);
        return enomem();
    }
    rc = dlock__etcd_parse_config(es, u);
    if (rc) {
        es->offline = 1;
        etcd_close(es);
        return rc;
    }

    /* reach the cluster now, so that a wrong address or password fails
     * here: authenticate, then read the (empty) prefix; with no prefix,
     * the key "\0" (etcd refuses an empty key) */
    int64_t deadline = dlock__now_ms() + es->timeout_ms;
    if (es->user) {
        etcd_conn *cn = dlock__etcd_conn_get(es);
        rc = cn ? dlock__etcd_authenticate(es, cn, deadline) : enomem();
        if (cn)
            dlock__etcd_conn_put(es, cn);
    }
    if (rc == DLOCK_OK) {
        char pb[ETCD_B64_MAX], body[ETCD_B64_MAX + 64];
        cJSON *j = NULL;
        if (es->prefix_len)
            dlock__etcd_b64_encode(es->prefix, es->prefix_len, pb);
        else
            dlock__etcd_b64_encode("", 1, pb);
        snprintf(body, sizeof(body), "{\"key\":\"%s\",\"count_only\":true}",
                 pb);
        rc = dlock__etcd_request(es, "/v3/kv/range", body, deadline, &j,
                                 "connecting");
        cJSON_Delete(j);
    }
    if (rc != DLOCK_OK) {
        es->offline = 1;
        etcd_close(es);
        return rc == ETCD_NOLEASE ? DLOCK_EPROTO : rc;
    }
    *out = es;
    return DLOCK_OK;
}

/* dlock_cancel(): every waiter sleeps on its own condition variable; each
 * looks at its lease. */
static void etcd_cancel(void *st)
{
    etcd_store *es = st;

    pthread_mutex_lock(&es->mu);
    for (etcd_waiter *w = es->waiters; w; w = w->next)
        pthread_cond_signal(&w->cv);
    pthread_cond_broadcast(&es->acv); /* and those asleep in park() */
    pthread_mutex_unlock(&es->mu);
}

const dlock__backend dlock__backend_etcd = {
    DLOCK__STORE_HEAD,
    .name = "etcd",
    .caps = DLOCK__CAP_NATIVE_WAIT | DLOCK__CAP_SHARED | DLOCK__CAP_PERMITS,
    .lease_size = sizeof(etcd_hold),
    .open = etcd_open,
    .close = etcd_close,
    .acquire = etcd_acquire,
    .release = etcd_release,
    .extend = etcd_extend,
    .inspect = dlock__etcd_inspect,
    .loop_fd = dlock__etcd_loop_fd,
    .loop_run = dlock__etcd_loop_run,
    .list = dlock__etcd_list,
    .evict = dlock__etcd_evict,
    .cancel = etcd_cancel,
    .at_risk_max = dlock__etcd_at_risk_max,
    .check = dlock__etcd_check,       /* etcd_elect.c */
    .proclaim = dlock__etcd_proclaim, /* etcd_elect.c */
    .watch_open = dlock__etcd_watch_open,
    .watch_wait = dlock__etcd_watch_wait,
    .watch_close = dlock__etcd_watch_close,
    .watch_sees_expiry = 1, /* a lease's end deletes its keys: an event */
};
