/* SPDX-License-Identifier: MIT */
/*
 * worker.c -- one worker process: acquire, read-modify-write the fenced
 * resource with the hold's token, release; every step in the history.
 * Uses the public API only.
 */
#include "safety.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef struct wstate {
    sf_shared *s;
    volatile int cur;                 /* the hold being made, or -1 */
    volatile uint64_t last_lost_token;
} wstate;

static void on_lost(dlock *l, uint64_t token, void *arg)
{
    wstate *w = arg;
    int cur = __atomic_load_n(&w->cur, __ATOMIC_SEQ_CST);

    (void)l;
    __atomic_store_n(&w->last_lost_token, token, __ATOMIC_SEQ_CST);
    if (cur >= 0 && w->s->holds[cur].token == token) {
        sf_hold *h = &w->s->holds[cur];
        h->t_lost = sf_now_ns();
        snprintf(h->lost_msg, sizeof(h->lost_msg), "%s", dlock_errmsg());
        __atomic_store_n(&h->lost_cb, 1, __ATOMIC_SEQ_CST);
    }
}

static int stopping(const sf_shared *s)
{
    return __atomic_load_n(&s->stop, __ATOMIC_SEQ_CST) ||
           sf_now_ns() >= s->deadline_ns;
}

int sf_claim_victim(sf_shared *s, int id)
{
    int want = __atomic_load_n(&s->victim_want, __ATOMIC_SEQ_CST);
    int none = -1;

    if (want == 0 || (want > 0 && want != id + 1))
        return 0;
    return __atomic_compare_exchange_n(&s->victim_worker, &none, id, 0,
                                       __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

/* The hold just made through l (and, for the sets scenario, the rest of
 * set[0..n), released with it: n 0 for a plain hold) */
static void one_hold(sf_shared *s, wstate *ws, dlock *l, dlock *const *set,
                     size_t n, int id, uint32_t seq, int64_t t_call,
                     int shared)
{
    sf_worker *me = &s->w[id];
    int64_t t_ret = sf_now_ns();
    uint32_t idx = __atomic_fetch_add(&s->nholds, 1, __ATOMIC_SEQ_CST);

    if (idx >= SF_MAX_HOLDS) { /* history full: stop cleanly */
        __atomic_store_n(&s->stop, 1, __ATOMIC_SEQ_CST);
        if (n)
            dlock_release_all(set, n);
        else
            dlock_release(l);
        return;
    }
    sf_hold *h = &s->holds[idx];
    h->worker = id;
    h->shared = shared;
    h->acq_id = ((uint64_t)id << 32) | seq;
    h->token = dlock_token(l);
    h->t_acq_call = t_call;
    h->t_acq_ret = t_ret;
    __atomic_store_n(&ws->cur, (int)idx, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&ws->last_lost_token, __ATOMIC_SEQ_CST) == h->token)
        h->lost_cb = 1;
    me->acquires++;

    int victim = sf_claim_victim(s, id);
    if (victim) {
        h->victim = 1;
        __atomic_store_n(&s->victim_hold, (int)idx, __ATOMIC_SEQ_CST);
    }
    int64_t v = 0;
    uint64_t seen = 0, rop = 0, wop = 0;
    int r = shared ? sf_resource_read_shared(&s->res, h->token, &v, &seen,
                                             &rop, NULL)
                   : sf_resource_read(&s->res, h->token, &v, &seen, &rop,
                                      NULL);
    h->read_value = v;
    h->read_seen = seen;
    h->read_op = rop;
    if (victim) {
        /* the controller injects its fault now; bounded wait for go */
        __atomic_store_n(&s->victim_in_window, 1, __ATOMIC_SEQ_CST);
        for (int i = 0; i < 120000 &&
                        !__atomic_load_n(&s->victim_go, __ATOMIC_SEQ_CST);
             i++)
            sf_sleep_us(1000);
    } else if (s->delay_us > 0) {
        sf_sleep_us(s->delay_us);
    }
    if (r == SF_W_NONE && !shared)
        r = sf_resource_write(&s->res, h->token, v + 1, rop, &wop, NULL);
    h->write_res = r;
    h->write_op = wop;
    h->t_rel_call = sf_now_ns();
    h->rel_rc = n         ? dlock_release_all(set, n)
                : s->elect ? dlock_resign(l)
                           : dlock_release(l);
    h->t_rel_ret = sf_now_ns();
    if (h->rel_rc != DLOCK_OK)
        snprintf(me->last_err, sizeof(me->last_err), "release: %s: %s",
                 dlock_errname(h->rel_rc), dlock_errmsg());
    if (__atomic_load_n(&ws->last_lost_token, __ATOMIC_SEQ_CST) == h->token)
        h->lost_cb = 1;
    __atomic_store_n(&ws->cur, -1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&h->done, 1, __ATOMIC_SEQ_CST);
    if (victim)
        __atomic_store_n(&s->victim_done, 1, __ATOMIC_SEQ_CST);
}

/* The cancels scenario: a thread of the worker that cancels the worker's
 * waits (its handle's) every 1..10 ms; a wait it ends returns
 * DLOCK_ECANCELED, having left the queue, or DLOCK_OK if the lock came
 * first. */
typedef struct canceller {
    sf_shared *s;
    dlock *l;
    int stop;
} canceller;

static void *cancel_thread(void *arg)
{
    canceller *cn = arg;
    unsigned seed = (unsigned)getpid();

    while (!__atomic_load_n(&cn->stop, __ATOMIC_SEQ_CST) &&
           !stopping(cn->s)) {
        sf_sleep_us(1000 + rand_r(&seed) % 9000);
        dlock_cancel(cn->l);
    }
    return NULL;
}

sf_shared *sf_attach(int fd, int id)
{
    sf_shared *s = mmap(NULL, sizeof(*s), PROT_READ | PROT_WRITE, MAP_SHARED,
                        fd, 0);

    close(fd);
    if (s == MAP_FAILED)
        return NULL;
    if (id < 0 || id >= s->nworkers) {
        munmap(s, sizeof(*s));
        return NULL;
    }
    return s;
}

int sf_worker_main(const char *path, int id)
{
    int fd = open(path, O_RDWR);
    sf_shared *s;
    dlock_client *c = NULL;
    dlock *l = NULL;
    dlock_options o;
    dlock_client_options co = {3000};
    wstate ws;

    if (fd < 0 || !(s = sf_attach(fd, id)))
        return 2;
    sf_worker *me = &s->w[id];
    me->pid = getpid();
    srand((unsigned)getpid());
    if (s->runner && id == 0) { /* cutoff-run: a runner of dlock run */
        int rc = sf_runner_main(s, path, id);
        __atomic_store_n(&me->exited, 1, __ATOMIC_SEQ_CST);
        munmap(s, sizeof(*s));
        return rc;
    }
    memset(&ws, 0, sizeof(ws));
    ws.s = s;
    ws.cur = -1;

    /* the store may be down (a restart in progress): try until stopped */
    for (int i = 0; i < 100000 && !stopping(s); i++) {
        if (dlock_client_open(&c, me->uri, &co) == DLOCK_OK)
            break;
        me->open_errors++;
        snprintf(me->last_err, sizeof(me->last_err), "open: %s",
                 dlock_errmsg());
        c = NULL;
        sf_sleep_us(100000);
    }
    if (!c) {
        me->exited = 1;
        return 0;
    }
    memset(&o, 0, sizeof(o));
    o.ttl_ms = s->ttl_ms;
    o.flags = s->flags | DLOCK_NOT_REENTRANT;
    o.on_lost = on_lost;
    o.on_lost_arg = &ws;
    if (dlock_open(&l, c, SF_LOCK_NAME, &o) != DLOCK_OK) {
        snprintf(me->last_err, sizeof(me->last_err), "dlock_open: %s",
                 dlock_errmsg());
        dlock_client_close(c);
        me->exited = 1;
        return 3;
    }
    /* the sets scenario's side names: without the lost-lock callback,
     * whose tokens (another name's counter) the hold's could equal */
    dlock *side[2] = {NULL, NULL};
    if (s->sets) {
        dlock_options so = o;
        so.on_lost = NULL;
        so.on_lost_arg = NULL;
        for (int i = 0; i < 2; i++) {
            char sn[64];
            snprintf(sn, sizeof(sn), "%s-side-%d", SF_LOCK_NAME, i);
            if (dlock_open(&side[i], c, sn, &so) != DLOCK_OK) {
                snprintf(me->last_err, sizeof(me->last_err),
                         "dlock_open: %s", dlock_errmsg());
                dlock_close(side[0]);
                dlock_close(l);
                dlock_client_close(c);
                me->exited = 1;
                return 3;
            }
        }
    }
    __atomic_store_n(&me->opened, 1, __ATOMIC_SEQ_CST);
    canceller cn = {s, l, 0};
    pthread_t cth;
    int cstarted = s->cancels &&
                   pthread_create(&cth, NULL, cancel_thread, &cn) == 0;

    for (uint32_t seq = 0;
         (int)seq < s->max_holds_per_worker && !stopping(s); seq++) {
        int64_t t_call = sf_now_ns();
        __atomic_store_n(&me->in_acquire, 1, __ATOMIC_SEQ_CST);
        int shared = !s->sets && !s->elect && s->mixed && rand() % 3 != 0;
        int64_t wait = s->short_waits ? 1 + rand() % 10 : s->wait_ms;
        /* sets: {lock, side 0}, {side 0, side 1} or {side 1, lock}, a
         * cycle, each named in a random order (the set's own order is
         * what keeps the cycle from deadlocking) */
        dlock *set[2] = {l, NULL};
        int k = s->sets ? rand() % 3 : 0, with_l = k != 1;
        if (s->sets) {
            set[0] = k == 0 ? l : side[0];
            set[1] = k == 0 ? side[0] : k == 1 ? side[1] : l;
            if (k == 2)
                set[0] = side[1];
            if (rand() % 2) {
                dlock *t = set[0];
                set[0] = set[1];
                set[1] = t;
            }
        }
        char value[32];
        snprintf(value, sizeof(value), "worker-%d", id);
        int rc = s->sets    ? dlock_acquire_all(set, 2, wait)
                 : s->elect ? dlock_campaign(l, value, wait)
                 : shared   ? dlock_acquire_shared(l, wait)
                            : dlock_acquire(l, wait);
        __atomic_store_n(&me->in_acquire, 0, __ATOMIC_SEQ_CST);
        if (rc == DLOCK_OK && s->sets && !with_l) {
            /* the side names alone: no hold of the lock to record */
            sf_sleep_us(s->delay_us);
            if (dlock_release_all(set, 2) != DLOCK_OK)
                snprintf(me->last_err, sizeof(me->last_err),
                         "release_all: %s", dlock_errmsg());
        } else if (rc == DLOCK_OK) {
            one_hold(s, &ws, l, s->sets ? set : NULL, s->sets ? 2 : 0, id,
                     seq, t_call, shared);
        } else if (rc == DLOCK_EBUSY || rc == DLOCK_ECANCELED) {
            me->busy++; /* gave up (the cancels scenario: made to) */
        } else {
            me->errors++;
            snprintf(me->last_err, sizeof(me->last_err), "acquire: %s: %s",
                     dlock_errname(rc), dlock_errmsg());
            /* ELOST cannot be from dlock_acquire(): every hold is
             * released; from a set, a lock lost while it waited (it
             * holds nothing then) */
            if (rc == DLOCK_ELOST && !s->sets)
                dlock_release(l);
            sf_sleep_us(20000); /* a store down: do not spin */
        }
        sf_sleep_us(rand() % 1000);
    }
    if (cstarted) {
        __atomic_store_n(&cn.stop, 1, __ATOMIC_SEQ_CST);
        pthread_join(cth, NULL);
    }
    dlock_close(side[0]);
    dlock_close(side[1]);
    dlock_close(l);
    dlock_client_close(c);
    __atomic_store_n(&me->exited, 1, __ATOMIC_SEQ_CST);
    munmap(s, sizeof(*s));
    return 0;
}
