/* SPDX-License-Identifier: MIT */
/*
 * etcd_lease.c -- the etcd store's leases (etcd.c is the lock protocol,
 * etcd_int.h what the files share): one lease per client and distinct TTL
 * (a DLOCK_NO_RENEW acquisition's own), granted, kept alive, revoked; and
 * the client's background thread, which keeps them alive every TTL/3,
 * tells the core of a lease lost, deletes the keys whose delete failed
 * and revokes leases no longer used, and keeps our holds' keys checked
 * (the stream up while we hold keys, a read of each key it may have
 * missed, the core told of a deleted one: etcd_keys.c). The watch stream
 * it also reads is etcd_wait.c's.
 */
#include "etcd_int.h"

#include "kwait.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Leases                                                                   */
/* ------------------------------------------------------------------------ */

/* Until when the lease's holds are certainly alive: 2/3 of the TTL after
 * the last keepalive that worked was sent (the last third is margin, see
 * docs/stores.md); an own lease that is no longer kept alive, until just
 * before its end (the core's margin for leases, ttl/100 + 2 ms). es->mu
 * held. */
int64_t dlock__etcd_lease_limit(const etcd_lease *el)
{
    if (el->held && el->next_ka == INT64_MAX)
        return el->last_ok + el->ttl_ms - (el->ttl_ms / 100 + 2);
    return el->last_ok + el->ttl_ms * 2 / 3;
}

static int match_lease(const dlock__lease *l, void *arg)
{
    const etcd_hold *eh = l->priv;
    return eh->lease == arg;
}

/* Marks a lease lost and tells the core; any thread, es->mu not held. */
void dlock__etcd_lease_lost(etcd_store *es, etcd_lease *el, const char *why)
{
    pthread_mutex_lock(&es->mu);
    int was = el->dead;
    el->dead = 1;
    for (etcd_waiter *w = es->waiters; w; w = w->next)
        pthread_cond_signal(&w->cv); /* those on this lease start again */
    pthread_cond_broadcast(&es->acv); /* and those asleep in park() */
    pthread_mutex_unlock(&es->mu);
    if (!was)
        dlock__notify_lost(es->client, match_lease, el, why);
}

/* A live lease of `want_s` seconds with a reference, granting one when
 * there is none; `own`: always a new one, for one DLOCK_NO_RENEW
 * acquisition alone. */
etcd_lease *dlock__etcd_lease_get(etcd_store *es, int64_t want_s, int own,
                                  int64_t deadline, int *rc)
{
    etcd_lease *el;
    cJSON *j = NULL;
    char body[64];
    int64_t sent;

    pthread_mutex_lock(&es->mu);
    for (el = own ? NULL : es->leases; el; el = el->next) {
        if (!el->dead && !el->own && el->want_s == want_s &&
            dlock__now_ms() < dlock__etcd_lease_limit(el)) {
            el->refs++;
            pthread_mutex_unlock(&es->mu);
            return el;
        }
    }
    pthread_mutex_unlock(&es->mu);

    snprintf(body, sizeof(body), "{\"TTL\":\"%" PRId64 "\"}", want_s);
    sent = dlock__now_ms();
    *rc = dlock__etcd_request(es, "/v3/lease/grant", body, deadline, &j,
                              "granting a lease");
    if (*rc != DLOCK_OK) {
        if (*rc == ETCD_NOLEASE)
            *rc = dlock__err(DLOCK_EPROTO, "etcd %s: granting a lease "
                                           "failed", es->redacted);
        return NULL;
    }
    int64_t id = jint(j, "ID"), ttl = jint(j, "TTL");
    cJSON_Delete(j);
    if (id == 0 || ttl <= 0 || ttl > ETCD_TTL_MAX_S) {
        *rc = dlock__err(DLOCK_EPROTO, "etcd %s: the lease grant answer has "
                                       "no ID or no usable TTL", es->redacted);
        return NULL;
    }
    el = calloc(1, sizeof(*el));
    if (!el) {
        *rc = enomem();
        return NULL; /* the lease expires by itself */
    }
    el->id = id;
    el->want_s = want_s;
    el->own = own;
    el->ttl_ms = ttl * 1000;
    el->last_ok = sent;
    el->next_ka = sent + el->ttl_ms / 3;
    el->refs = 1;
    pthread_mutex_lock(&es->mu);
    el->next = es->leases;
    es->leases = el;
    dlock__etcd_arm_timer(es, el->next_ka);
    pthread_mutex_unlock(&es->mu);
    return el;
}

void dlock__etcd_lease_put(etcd_store *es, etcd_lease *el)
{
    int wake;

    pthread_mutex_lock(&es->mu);
    if (--el->refs == 0)
        el->idle_since = dlock__now_ms();
    /* read under the mutex: once unused and dead, the client thread may
     * free it at any moment */
    wake = el->refs == 0 && (el->dead || el->own);
    pthread_mutex_unlock(&es->mu);
    if (wake)
        dlock__loop_wake(es->client); /* revoke it soon */
}

/* One keepalive: 0 alive, ETCD_NOLEASE gone, or an error. */
int dlock__etcd_keepalive(etcd_store *es, etcd_lease *el, int64_t deadline)
{
    char body[64];
    cJSON *j = NULL;
    int64_t sent = dlock__now_ms();
    int rc;

    snprintf(body, sizeof(body), "{\"ID\":\"%" PRId64 "\"}", el->id);
    rc = dlock__etcd_request(es, "/v3/lease/keepalive", body, deadline, &j,
                             "keeping the lease alive");
    if (rc != DLOCK_OK)
        return rc;
    int64_t ttl = jint(jget(j, "result"), "TTL");
    cJSON_Delete(j);
    if (ttl <= 0)
        return ETCD_NOLEASE;
    pthread_mutex_lock(&es->mu);
    el->err[0] = '\0';
    if (sent > el->last_ok)
        el->last_ok = sent;
    el->next_ka = el->held ? INT64_MAX : sent + el->ttl_ms / 3;
    pthread_mutex_unlock(&es->mu);
    return DLOCK_OK;
}

int dlock__etcd_lease_revoke(etcd_store *es, int64_t id, int64_t deadline)
{
    char body[64];
    cJSON *j = NULL;
    int rc;

    snprintf(body, sizeof(body), "{\"ID\":\"%" PRId64 "\"}", id);
    rc = dlock__etcd_request(es, "/v3/lease/revoke", body, deadline, &j,
                             "revoking a lease");
    cJSON_Delete(j);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Our held keys: the background thread's checks (etcd_keys.c)              */
/* ------------------------------------------------------------------------ */

#define MINE_BATCH 64          /* keys checked in one transaction */
#define COVER_BACKOFF_MIN 100  /* ms between tries at opening the stream */
#define COVER_BACKOFF_MAX 2000

typedef struct mine_match {
    uint64_t mid;
    int matched;
} mine_match;

static int match_mine(const dlock__lease *l, void *arg)
{
    const etcd_hold *eh = l->priv;
    mine_match *m = arg;

    if (!eh || eh->mid != m->mid)
        return 0;
    m->matched = 1;
    return 1;
}

/* The answer j of mine_check's transaction (one range of each key
 * mids[i], which had create revision revs[i]) applied (es->mu held): a key
 * not there (or not with that revision) is gone; one there is covered by
 * stream generation gen. */
static void check_answer(etcd_store *es, const cJSON *j,
                         const uint64_t *mids, const int64_t *revs, int n,
                         uint64_t gen)
{
    for (int i = 0; i < n; i++) {
        const cJSON *kv = kvs_at(txn_resp(j, i, "response_range"), 0);
        int there = kv && jint(kv, "create_revision") == revs[i];
        for (etcd_hold *eh = es->mine; eh; eh = eh->mnext) {
            if (eh->mid != mids[i])
                continue;
            if (!there)
                (void)dlock__etcd_mine_gone(eh);
            else if (!eh->gone)
                eh->mgen = gen; /* there after gen began: covered */
            break;
        }
    }
}

/* The held keys the stream may have missed, checked by one read each
 * (MINE_BATCH to a transaction) at a revision after the stream of
 * generation `gen` began. 0, or -1: no answer (try again later). */
static int mine_check(etcd_store *es, uint64_t gen, int64_t deadline)
{
    uint64_t mids[MINE_BATCH];
    int64_t revs[MINE_BATCH];
    dlock__buf body = ETCD_BUF_INIT;
    int n = 0, rc = 0;

    pthread_mutex_lock(&es->mu);
    for (etcd_hold *eh = es->mine; eh; eh = eh->mnext) {
        if (!eh->held || eh->releasing || eh->gone ||
            dlock__etcd_mine_covered(es, eh))
            continue;
        char kb[ETCD_B64_MAX], item[ETCD_B64_MAX + 96];
        dlock__etcd_b64_encode(eh->key, eh->key_len, kb);
        int len = snprintf(item, sizeof(item),
                           "%s{\"request_range\":{\"key\":\"%s\","
                           "\"keys_only\":true}}",
                           n ? "," : "{\"success\":[", kb);
        if (dlock__buf_add(&body, item, (size_t)len) != 0) {
            rc = -1;
            break;
        }
        mids[n] = eh->mid;
        revs[n] = eh->mrev;
        if (++n == MINE_BATCH)
            break;
    }
    pthread_mutex_unlock(&es->mu);
    if (rc == 0 && n > 0 && dlock__buf_add(&body, "]}", 2) != 0)
        rc = -1;
    if (rc != 0 || n == 0) {
        dlock__buf_free(&body);
        return rc;
    }
    cJSON *j = NULL;
    int r = dlock__etcd_request(es, "/v3/kv/txn", body.p, deadline, &j,
                                "checking the held keys");
    dlock__buf_free(&body);
    if (r != DLOCK_OK)
        return -1;
    pthread_mutex_lock(&es->mu);
    check_answer(es, j, mids, revs, n, gen);
    pthread_mutex_unlock(&es->mu);
    cJSON_Delete(j);
    return 0;
}

/* Is the lease gone from the cluster (its time to live asked)? A lease
 * that did not answer is not taken for gone. */
static int lease_gone(etcd_store *es, etcd_lease *el)
{
    char lb[64];
    cJSON *j = NULL;

    snprintf(lb, sizeof(lb), "{\"ID\":\"%" PRId64 "\"}", el->id);
    int rc = dlock__etcd_request(
        es, "/v3/lease/timetolive", lb,
        dlock__loop_deadline(es->client, dlock__now_ms() + es->timeout_ms),
        &j, "reading a lease");
    int gone = rc == ETCD_NOLEASE || (rc == DLOCK_OK && jint(j, "TTL") <= 0);
    cJSON_Delete(j);
    return gone;
}

int64_t dlock__etcd_mine_run(etcd_store *es)
{
    int64_t next = INT64_MAX, now = dlock__now_ms();
    int need = 0;

    /* 1. the stream up while we hold keys, and every held key covered */
    pthread_mutex_lock(&es->mu);
    for (etcd_hold *eh = es->mine; eh; eh = eh->mnext)
        if (eh->held && !eh->releasing && !eh->gone &&
            !dlock__etcd_mine_covered(es, eh))
            need = 1;
    /* this thread keeps the leases alive and declares them lost: a
     * stream that does not open, a read that does not answer (no quorum)
     * never hold up a keepalive or a lease's end */
    int64_t limit = now + es->timeout_ms;
    for (etcd_lease *el = es->leases; el; el = el->next) {
        if (el->dead)
            continue;
        if (el->next_ka < limit)
            limit = el->next_ka;
        if (dlock__etcd_lease_limit(el) < limit)
            limit = dlock__etcd_lease_limit(el);
    }
    int due = need && now >= es->cover_at;
    pthread_mutex_unlock(&es->mu);
    /* and by the moment a hold of the client needs this thread */
    limit = dlock__loop_deadline(es->client, limit);
    int64_t dl = limit > now + 200 ? limit : now + 200;
    for (int round = 0; due && round < 16 && dlock__now_ms() < dl; round++) {
        uint64_t gen = 0;
        int ok = dlock__etcd_stream_up(es, dl, &gen) == DLOCK_OK &&
                 mine_check(es, gen, dl) == 0;
        pthread_mutex_lock(&es->mu);
        if (ok) {
            es->cover_backoff = 0;
            es->cover_at = 0;
        } else {
            es->cover_backoff = es->cover_backoff
                                    ? es->cover_backoff * 2
                                    : COVER_BACKOFF_MIN;
            if (es->cover_backoff > COVER_BACKOFF_MAX)
                es->cover_backoff = COVER_BACKOFF_MAX;
            es->cover_at = dlock__now_ms() + es->cover_backoff;
        }
        need = 0;
        for (etcd_hold *eh = es->mine; eh; eh = eh->mnext)
            if (eh->held && !eh->releasing && !eh->gone &&
                !dlock__etcd_mine_covered(es, eh))
                need = 1;
        due = ok && need; /* more than a batch, or the stream broke */
        pthread_mutex_unlock(&es->mu);
    }

    /* 2. tell the core, one hold at a time (notify_lost takes the
     * client's mutex: never with ours held) */
    for (int k = 0; k < 1024; k++) {
        mine_match m = {0, 0};
        etcd_lease *check = NULL;
        now = dlock__now_ms();
        pthread_mutex_lock(&es->mu);
        for (etcd_hold *eh = es->mine; eh; eh = eh->mnext) {
            if (!eh->tell || eh->releasing || eh->tell_at > now)
                continue;
            if (eh->lease && eh->lease->dead) {
                eh->tell = 0; /* the lease's loss told it already */
                continue;
            }
            if (!eh->lease_checked && eh->lease) {
                /* a revoked or expired lease deletes its keys too: find
                 * out first, so that its next use is not the one that
                 * learns it (then the lease's loss is told) */
                eh->lease_checked = 1;
                check = eh->lease;
                break;
            }
            m.mid = eh->mid;
            /* offered again soon if the core has not registered the hold
             * yet (its acquire is returning it) */
            eh->tell_at = now + 10 + (now - eh->tell_until +
                                      MINE_TELL_FOR_MS) / 4;
            break;
        }
        pthread_mutex_unlock(&es->mu);
        if (check) {
            /* (a lease this thread alone frees: valid until it returns) */
            if (lease_gone(es, check))
                dlock__etcd_lease_lost(es, check,
                                       "etcd: the client's lease expired or "
                                       "was revoked");
            continue;
        }
        if (!m.mid)
            break;
        dlock__notify_lost(es->client, match_mine, &m,
                           "its etcd key was deleted (dlock break, or by "
                           "hand)");
        pthread_mutex_lock(&es->mu);
        for (etcd_hold *eh = es->mine; eh; eh = eh->mnext)
            if (eh->mid == m.mid && (m.matched || now >= eh->tell_until))
                eh->tell = 0;
        pthread_mutex_unlock(&es->mu);
    }

    /* 3. when to run again */
    pthread_mutex_lock(&es->mu);
    need = 0;
    for (etcd_hold *eh = es->mine; eh; eh = eh->mnext) {
        if (eh->tell && !eh->releasing && eh->tell_at < next)
            next = eh->tell_at;
        if (eh->held && !eh->releasing && !eh->gone &&
            !dlock__etcd_mine_covered(es, eh))
            need = 1;
    }
    if (need) {
        int64_t at = es->cover_at ? es->cover_at
                                  : dlock__now_ms() + COVER_BACKOFF_MIN;
        if (at < next)
            next = at;
    }
    pthread_mutex_unlock(&es->mu);
    return next;
}

/* ------------------------------------------------------------------------ */
/* The background thread: keepalives, orphans, idle leases                  */
/* ------------------------------------------------------------------------ */

/* Makes the timer fire by `at` at the latest; es->mu held. */
void dlock__etcd_arm_timer(etcd_store *es, int64_t at)
{
    dlock__timer_within(es->timer_fd, at - dlock__now_ms());
}

int dlock__etcd_loop_fd(void *st)
{
    return ((etcd_store *)st)->ep_fd;
}

#define LOOP_BATCH 64

/* Tells the core each live lease's limit, its holds' local lease end, for
 * their at-risk events (design.md, "Stopping the work before the lease
 * ends"); a no-op while nobody listens. es->mu not held (the core's
 * mutex is taken). */
static void push_ends(etcd_store *es)
{
    etcd_lease *ls[LOOP_BATCH];
    int64_t ends[LOOP_BATCH];
    char whys[LOOP_BATCH][sizeof(((etcd_lease *)0)->err) + 40];
    size_t n = 0;

    pthread_mutex_lock(&es->mu);
    for (etcd_lease *el = es->leases; el && n < LOOP_BATCH; el = el->next) {
        if (el->dead || el->refs == 0)
            continue;
        ls[n] = el;
        ends[n] = dlock__etcd_lease_limit(el);
        if (el->held && el->next_ka == INT64_MAX)
            snprintf(whys[n], sizeof(whys[n]),
                     "etcd: its own lease is not renewed (DLOCK_NO_RENEW)");
        else if (el->err[0])
            snprintf(whys[n], sizeof(whys[n]), "keepalive failed: %s",
                     el->err);
        else
            snprintf(whys[n], sizeof(whys[n]),
                     "etcd: no keepalive answered in time");
        n++;
    }
    pthread_mutex_unlock(&es->mu);
    /* (a lease with holds is freed only by this thread) */
    for (size_t i = 0; i < n; i++)
        dlock__notify_lease_end(es->client, match_lease, ls[i], ends[i],
                                whys[i]);
}

int dlock__etcd_at_risk_max(void *st, int64_t ttl_ms, int64_t *out,
                            int64_t op_deadline)
{
    etcd_store *es = st;
    int64_t want_s = (ttl_ms + 999) / 1000; /* as an acquire asks */
    int rc = DLOCK_OK;
    etcd_lease *el = dlock__etcd_lease_get(es, want_s < 1 ? 1 : want_s, 0,
                                           op_deadline, &rc);

    if (!el)
        return rc;
    pthread_mutex_lock(&es->mu);
    int64_t ttl = el->ttl_ms;
    pthread_mutex_unlock(&es->mu);
    dlock__etcd_lease_put(es, el);
    /* holds are certain until 2/3 of the lease after a keepalive, and
     * keepalives go every third: a sixth is left for one and its
     * retries (every twelfth) before the at-risk moment */
    *out = ttl / 6;
    return DLOCK_OK;
}

void dlock__etcd_loop_run(void *st, int readable)
{
    etcd_store *es = st;
    uint64_t ticks;
    etcd_lease *due[LOOP_BATCH];
    int64_t now = dlock__now_ms(), next = now + 60000;
    size_t nd = 0;

    (void)readable; /* both fds are non-blocking: look at each */
    if (read(es->timer_fd, &ticks, sizeof(ticks)) < 0)
        (void)errno;
    /* the holds' lease ends first: every store call below ends by the
     * next at-risk moment (dlock__loop_deadline) */
    push_ends(es);
    dlock__etcd_stream_loop(es);

    /* 1. leases past their safe life are lost; due ones get a keepalive */
    pthread_mutex_lock(&es->mu);
    for (etcd_lease *el = es->leases; el; el = el->next) {
        if (el->dead)
            continue;
        if (now >= dlock__etcd_lease_limit(el)) {
            int ran_out = el->held && el->next_ka == INT64_MAX;
            pthread_mutex_unlock(&es->mu);
            const char *why = ran_out
                                  ? "etcd: the hold's own lease ran out "
                                    "(DLOCK_NO_RENEW)"
                                  : "etcd: the client's lease could not "
                                    "be kept alive (no endpoint answered "
                                    "in time)";
            dlock__etcd_lease_lost(es, el, why);
            pthread_mutex_lock(&es->mu);
            continue;
        }
        if (el->next_ka <= now && nd < LOOP_BATCH)
            due[nd++] = el;
    }
    pthread_mutex_unlock(&es->mu);
    for (size_t i = 0; i < nd; i++) {
        etcd_lease *el = due[i];
        pthread_mutex_lock(&es->mu);
        int64_t limit = dlock__etcd_lease_limit(el);
        pthread_mutex_unlock(&es->mu);
        int64_t dl = dlock__loop_deadline(es->client,
                                          dlock__now_ms() + es->timeout_ms);
        if (dl > limit)
            dl = limit;
        int rc = dlock__etcd_keepalive(es, el, dl);
        if (rc == DLOCK_OK) {
            /* the store answers: waiters asleep in park() re-arm */
            pthread_mutex_lock(&es->mu);
            es->ka_gen++;
            pthread_cond_broadcast(&es->acv);
            pthread_mutex_unlock(&es->mu);
        } else if (rc == ETCD_NOLEASE) {
            dlock__etcd_lease_lost(es, el, "etcd: the client's lease "
                                           "expired or was revoked");
        } else {
            /* an own lease's one keepalive after its acquisition, too:
             * tried again until it works or the lease ends */
            pthread_mutex_lock(&es->mu);
            el->next_ka = dlock__now_ms() + el->ttl_ms / 12 + 10;
            snprintf(el->err, sizeof(el->err), "%s", dlock_errmsg());
            pthread_mutex_unlock(&es->mu);
        }
    }

    if (nd > 0)
        push_ends(es); /* a keepalive moved a limit, or failed */

    /* 2. our held keys: the stream up, every key covered, deleted holds
     * told to the core (above) */
    int64_t mine_next = dlock__etcd_mine_run(es);
    if (mine_next < next)
        next = mine_next;

    /* 3. keys to delete */
    now = dlock__now_ms();
    for (int k = 0; k < LOOP_BATCH; k++) {
        etcd_orphan *o = NULL;
        pthread_mutex_lock(&es->mu);
        for (etcd_orphan **pp = &es->orphans; *pp; pp = &(*pp)->next) {
            if ((*pp)->next_try <= now) {
                o = *pp;
                *pp = o->next;
                break;
            }
        }
        pthread_mutex_unlock(&es->mu);
        if (!o)
            break;
        char kb[ETCD_B64_MAX], body[ETCD_B64_MAX + 32];
        cJSON *j = NULL;
        dlock__etcd_b64_encode(o->key, o->len, kb);
        snprintf(body, sizeof(body), "{\"key\":\"%s\"}", kb);
        int rc = dlock__etcd_request(
            es, "/v3/kv/deleterange", body,
            dlock__loop_deadline(es->client,
                                 dlock__now_ms() + es->timeout_ms),
            &j, "deleting a left-over key");
        cJSON_Delete(j);
        pthread_mutex_lock(&es->mu);
        if (rc == DLOCK_OK || rc == DLOCK_EAUTH) {
            dlock__etcd_slot_drop(es, o->key, o->len);
            free(o);
        } else {
            o->next_try = dlock__now_ms() + ETCD_ORPHAN_RETRY_MS;
            o->next = es->orphans;
            es->orphans = o;
        }
        pthread_mutex_unlock(&es->mu);
    }

    /* 4. unused leases: dead ones and long idle ones are revoked */
    for (;;) {
        etcd_lease *gone = NULL;
        now = dlock__now_ms();
        pthread_mutex_lock(&es->mu);
        for (etcd_lease **pp = &es->leases; *pp; pp = &(*pp)->next) {
            etcd_lease *el = *pp;
            if (el->refs == 0 && (el->dead || el->own ||
                                  now - el->idle_since >= ETCD_IDLE_MS)) {
                *pp = el->next;
                gone = el;
                break;
            }
        }
        int down = es->unreachable;
        pthread_mutex_unlock(&es->mu);
        if (!gone)
            break;
        /* unreachable: it expires by itself; do not hold up the client
         * thread (and a closing client) for a timeout */
        if (!down)
            dlock__etcd_lease_revoke(
                es, gone->id,
                dlock__loop_deadline(es->client,
                                     dlock__now_ms() + es->timeout_ms));
        free(gone);
    }

    /* 5. the next wake-up */
    pthread_mutex_lock(&es->mu);
    for (etcd_lease *el = es->leases; el; el = el->next) {
        if (el->refs == 0 && el->idle_since + ETCD_IDLE_MS < next)
            next = el->idle_since + ETCD_IDLE_MS;
        if (el->dead)
            continue;
        if (el->next_ka < next)
            next = el->next_ka;
        if (dlock__etcd_lease_limit(el) < next)
            next = dlock__etcd_lease_limit(el);
    }
    for (etcd_orphan *o = es->orphans; o; o = o->next)
        if (o->next_try < next)
            next = o->next_try;
    if (es->sstate == ST_UP && !es->waiters && !es->mine &&
        es->s_idle + ETCD_IDLE_MS < next)
        next = es->s_idle + ETCD_IDLE_MS;
    /* the timer may hold a later time than `next` from before: reset it.
     * Under es->mu, so that a lease added since is armed after this. */
    struct itimerspec off;
    memset(&off, 0, sizeof(off));
    timerfd_settime(es->timer_fd, 0, &off, NULL);
    dlock__etcd_arm_timer(es, next);
    pthread_mutex_unlock(&es->mu);
}
