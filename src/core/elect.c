/* SPDX-License-Identifier: MIT */
/*
 * elect.c -- leader election on the exclusive lock (docs/design.md,
 * "Leader election"): a campaign is an acquire whose hold's description
 * is the candidate's value, a resign a release; the leader is read with
 * an inspection; an observer is a thread of its own that waits on the
 * store's watch of the name (module slots watch_open/wait/close), reads
 * on every wake-up and reports what changed. Proclaim is in lock.c, with
 * the other writes of an own hold.
 */
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

/* A broken watch is opened again after this long, doubling up to the
 * most (ms). */
#define REOPEN_FIRST_MS 100
#define REOPEN_MOST_MS 5000

/* An observer's wait for a leader's lease end ends this long after the
 * end it read (ms): the store's expiry is due by then. */
#define LEASE_END_SLACK_MS 2

struct dlock_observer {
    dlock_client *c;
    char *name;
    size_t len;
    dlock_leader_cb cb;
    void *arg;
    void *w0; /* the watch dlock_observe() opened, for the thread */
    pthread_t thread;
    int started;
    int stop_fd;  /* eventfd: the observer's close (the watch's cancel) */
    int ready_fd; /* eventfd: readable while a state is unread */
    pthread_mutex_t mu;
    int stop;     /* (mu) the thread is to end */
    int stopped;  /* its thread was joined */
    dlock_leader state; /* (mu) the last state reported */
    int64_t read_at;    /* when state's leader was read (the thread's) */
    int unread;         /* (mu) state not read by dlock_observer_read() */
    int linked;         /* in c->observers (c->mu) */
    dlock_observer *prev, *next;
};

int dlock__check_value(const char *fn, const char *name, const char *value)
{
    size_t n = value ? strlen(value) : 0;

    if (n == 0 || n > DLOCK_VALUE_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "%s: election '%.200s': the value must be 1 to %d "
                          "bytes, not %zu",
                          fn, name, DLOCK_VALUE_MAX, n);
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)value[i];
        if (ch < 0x20 || ch == 0x7f)
            return dlock__err(DLOCK_EINVAL,
                              "%s: election '%.200s': the value has a "
                              "control character (byte %zu): it is shown "
                              "on one line",
                              fn, name, i);
    }
    return DLOCK_OK;
}

/* A name to ring, queued for the background thread. */
struct dlock__ring {
    struct dlock__ring *next;
    size_t len;
    char name[];
};

void dlock__ring(dlock_client *c, const char *name, size_t len)
{
    struct dlock__ring *r;
    int queued = 0;

    if (!c->be->ring || !c->st)
        return;
    /* off the caller's path: a campaign returns as soon as it leads, and
     * its observers are told one store call later (a ring is a wake-up:
     * a late one costs them nothing but that) */
    r = malloc(sizeof(*r) + len + 1);
    pthread_mutex_lock(&c->mu);
    if (r && c->thread_running && !c->stopping) {
        for (struct dlock__ring *q = c->rings; q; q = q->next)
            if (q->len == len && !memcmp(q->name, name, len)) {
                queued = 2; /* one ring tells them of both */
                break;
            }
        if (!queued) {
            r->len = len;
            memcpy(r->name, name, len);
            r->name[len] = '\0';
            r->next = c->rings;
            c->rings = r;
            queued = 1;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (queued != 1)
        free(r);
    if (queued) {
        dlock__wake(c);
        return;
    }
    (void)c->be->ring(c->st, name, len, dlock__now_ms() + c->timeout_ms);
}

void dlock__rings_run(dlock_client *c)
{
    struct dlock__ring *r;

    pthread_mutex_lock(&c->mu);
    r = c->rings;
    c->rings = NULL;
    pthread_mutex_unlock(&c->mu);
    while (r) {
        struct dlock__ring *next = r->next;
        (void)c->be->ring(c->st, r->name, r->len,
                          dlock__now_ms() + c->timeout_ms);
        free(r);
        r = next;
    }
}

int dlock_campaign(dlock *l, const char *value, int64_t wait_ms)
{
    int rc;

    if (!l)
        return dlock__err(DLOCK_EINVAL, "dlock_campaign: lock is NULL");
    if (value && (rc = dlock__check_value("dlock_campaign", l->entry->name,
                                          value)) != DLOCK_OK)
        return rc;
    if (l->opts.permits)
        return dlock__err(DLOCK_EINVAL,
                          "election '%.200s': the handle is a semaphore's "
                          "(%u permits); an election has one leader",
                          l->entry->name, l->opts.permits);
    /* "": a campaign keeping the default description */
    rc = dlock__acquire(l, wait_ms, DLOCK__WRITE, NULL, value ? value : "");
    if (rc == DLOCK_OK)
        dlock__ring(l->client, l->entry->name, l->entry->len);
    return rc;
}

int dlock_resign(dlock *l)
{
    int rc;

    if (!l)
        return dlock__err(DLOCK_EINVAL, "dlock_resign: lock is NULL");
    rc = dlock_release(l);
    if (rc == DLOCK_OK || rc == DLOCK_ELOST) {
        char keep[512];
        snprintf(keep, sizeof(keep), "%s", dlock_errmsg());
        dlock__ring(l->client, l->entry->name, l->entry->len);
        if (rc != DLOCK_OK)
            dlock__err(rc, "%s", keep);
    }
    return rc;
}

int dlock_leader_get(dlock_client *c, const char *name, dlock_leader *out)
{
    dlock_info info;
    int rc;

    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_leader_get: out is NULL");
    memset(out, 0, sizeof(*out));
    out->ttl_ms = -1;
    rc = dlock_inspect(c, name, &info);
    if (rc)
        return rc;
    out->term = info.token;
    if (info.held && !info.shared && info.permits == 0) {
        out->present = 1;
        out->ttl_ms = info.ttl_ms;
        snprintf(out->value, sizeof(out->value), "%s", info.holder);
    } else if (info.held) {
        out->term = 0;
        snprintf(out->why, sizeof(out->why),
                 "'%.200s' is held %s, not by a leader", name,
                 info.shared ? "shared" : "as a semaphore");
    }
    dlock_info_clear(&info);
    return DLOCK_OK;
}

/* ------------------------------------------------------------------------ */
/* Observers                                                                */
/* ------------------------------------------------------------------------ */

static int same_leader(const dlock_leader *a, const dlock_leader *b)
{
    return a->present == b->present && a->term == b->term &&
           !strcmp(a->value, b->value) && !strcmp(a->why, b->why);
}

/* Makes `next` the observer's state if it differs (errors included) and
 * tells: the descriptor, then the callback (without o->mu). */
static void report(dlock_observer *o, const dlock_leader *next)
{
    dlock_leader copy;
    int changed;

    pthread_mutex_lock(&o->mu);
    changed = o->state.error != next->error ||
              strcmp(o->state.why, next->why) != 0 ||
              (!next->error && !same_leader(&o->state, next));
    if (changed) {
        o->state = *next;
        if (!o->unread) {
            uint64_t one = 1;
            o->unread = 1;
            (void)!write(o->ready_fd, &one, sizeof(one));
        }
        copy = *next;
    }
    pthread_mutex_unlock(&o->mu);
    if (changed && o->cb)
        o->cb(o->name, &copy, o->arg);
}

/* The error rc (its message) as the observer's state, the last leader
 * kept. */
static void report_error(dlock_observer *o, int rc)
{
    dlock_leader s;

    pthread_mutex_lock(&o->mu);
    s = o->state;
    pthread_mutex_unlock(&o->mu);
    s.error = rc;
    snprintf(s.why, sizeof(s.why), "%s", dlock_errmsg());
    report(o, &s);
}

/* Reads the leader into *out (read_at set); DLOCK_OK or the error. */
static int read_leader(dlock_observer *o, dlock_leader *out)
{
    o->read_at = dlock__now_ms();
    return dlock_leader_get(o->c, o->name, out);
}

/* Sleeps until `ms` from now or the observer's close; nonzero when
 * closed. The descriptor's readiness is the kernel's: no polling. */
static int pause_or_stop(dlock_observer *o, int64_t ms)
{
    struct pollfd p = {o->stop_fd, POLLIN, 0};
    int r;

    do
        r = poll(&p, 1, (int)ms);
    while (r < 0 && errno == EINTR);
    return r > 0;
}

static int stopping(dlock_observer *o)
{
    int s;

    pthread_mutex_lock(&o->mu);
    s = o->stop;
    pthread_mutex_unlock(&o->mu);
    return s;
}

static void *observer_main(void *arg)
{
    dlock_observer *o = arg;
    const dlock__backend *be = o->c->be;
    void *st = o->c->st;
    void *w = o->w0;
    int64_t backoff = REOPEN_FIRST_MS;
    int need_read = 0;
    dlock_leader cur;

    o->w0 = NULL;
    pthread_mutex_lock(&o->mu);
    cur = o->state; /* the first state, read by dlock_observe() */
    pthread_mutex_unlock(&o->mu);
    if (o->cb)
        o->cb(o->name, &cur, o->arg);
    while (!stopping(o)) {
        int rc;

        if (!w) {
            rc = be->watch_open(st, o->name, o->len, &w,
                                dlock__now_ms() + o->c->timeout_ms);
            if (rc) {
                w = NULL;
                report_error(o, rc);
                if (pause_or_stop(o, backoff))
                    break;
                backoff = backoff * 2 > REOPEN_MOST_MS ? REOPEN_MOST_MS
                                                       : backoff * 2;
                continue;
            }
            need_read = 1;
        }
        if (need_read) {
            rc = read_leader(o, &cur);
            if (rc) {
                report_error(o, rc);
                be->watch_close(st, w);
                w = NULL;
                if (pause_or_stop(o, backoff))
                    break;
                backoff = backoff * 2 > REOPEN_MOST_MS ? REOPEN_MOST_MS
                                                       : backoff * 2;
                continue;
            }
            backoff = REOPEN_FIRST_MS;
            need_read = 0;
            report(o, &cur);
        }
        /* a leader that dies is freed by its lease's end in the store: a
         * store whose watch does not tell of it is read again then */
        int64_t deadline = DLOCK__FOREVER;
        if (cur.present && cur.ttl_ms >= 0 && !be->watch_sees_expiry)
            deadline = o->read_at + cur.ttl_ms + LEASE_END_SLACK_MS;
        rc = be->watch_wait(st, w, deadline, o->stop_fd);
        if (rc == DLOCK_OK || rc == DLOCK_EBUSY) {
            need_read = 1;
        } else {
            /* broken: another watch, then a read (what came meanwhile) */
            be->watch_close(st, w);
            w = NULL;
        }
    }
    if (w)
        be->watch_close(st, w);
    return NULL;
}

int dlock_observe(dlock_client *c, const char *name, dlock_leader_cb cb,
                  void *arg, dlock_observer **out)
{
    dlock_observer *o;
    size_t len;
    int rc;

    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_observe: out is NULL");
    *out = NULL;
    if (!c)
        return dlock__err(DLOCK_EINVAL, "dlock_observe: client is NULL");
    rc = dlock__check_name(name, &len);
    if (rc)
        return rc;
    if (!c->be->watch_open)
        return dlock__err(DLOCK_ENOTSUP,
                          "election '%.200s': %s:// cannot be observed "
                          "yet%s%s (dlock_leader_get() reads the leader "
                          "once)",
                          name, c->be->name,
                          c->be->watch_unsupported ? ": " : "",
                          c->be->watch_unsupported ? c->be->watch_unsupported
                                                   : "");
    o = calloc(1, sizeof(*o));
    if (!o || !(o->name = malloc(len + 1))) {
        free(o);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    memcpy(o->name, name, len + 1);
    o->len = len;
    o->c = c;
    o->cb = cb;
    o->arg = arg;
    o->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    o->ready_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_mutex_init(&o->mu, NULL);
    if (o->stop_fd < 0 || o->ready_fd < 0) {
        rc = dlock__err(DLOCK_ENOMEM, "eventfd: %s", strerror(errno));
        goto fail;
    }
    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    if (!rc)
        c->refs++; /* the client's struct outlives the observer */
    pthread_mutex_unlock(&c->mu);
    if (rc)
        goto fail;

    /* the watch first, then the read: nothing written between the two is
     * missed (docs/design.md, "Leader election") */
    rc = c->be->watch_open(c->st, name, len, &o->w0,
                           dlock__now_ms() + c->timeout_ms);
    if (rc == DLOCK_OK) {
        rc = read_leader(o, &o->state);
        if (rc)
            c->be->watch_close(c->st, o->w0);
    }
    if (rc == DLOCK_OK) {
        uint64_t one = 1;
        o->unread = 1;
        (void)!write(o->ready_fd, &one, sizeof(one));
        sigset_t old;
        dlock__block_signals(&old);
        int e = pthread_create(&o->thread, NULL, observer_main, o);
        dlock__restore_signals(&old);
        if (e) {
            c->be->watch_close(c->st, o->w0);
            rc = dlock__err(DLOCK_ENOMEM, "cannot start the observer's "
                            "thread: %s", strerror(e));
        }
    }
    pthread_mutex_lock(&c->mu);
    if (rc == DLOCK_OK && c->closed) /* closed meanwhile: stop at once */
        o->stop = 1;
    if (rc == DLOCK_OK) {
        o->started = 1;
        o->linked = 1;
        o->next = c->observers;
        if (o->next)
            o->next->prev = o;
        c->observers = o;
        pthread_mutex_unlock(&c->mu);
        if (o->stop) {
            uint64_t one = 1;
            (void)!write(o->stop_fd, &one, sizeof(one));
        }
        *out = o;
        return DLOCK_OK;
    }
    dlock__client_unref(c); /* unlocks */
fail:
    if (o->stop_fd >= 0)
        close(o->stop_fd);
    if (o->ready_fd >= 0)
        close(o->ready_fd);
    pthread_mutex_destroy(&o->mu);
    free(o->name);
    free(o);
    return rc;
}

int dlock_observer_fd(const dlock_observer *o)
{
    return o ? o->ready_fd : -1;
}

int dlock_observer_read(dlock_observer *o, dlock_leader *out)
{
    int fresh;

    if (!o || !out)
        return dlock__err(DLOCK_EINVAL, "dlock_observer_read: %s is NULL",
                          o ? "out" : "observer");
    pthread_mutex_lock(&o->mu);
    *out = o->state;
    fresh = o->unread;
    if (fresh) {
        uint64_t n;
        o->unread = 0;
        (void)!read(o->ready_fd, &n, sizeof(n));
    }
    pthread_mutex_unlock(&o->mu);
    if (!fresh)
        return dlock__err(DLOCK_EBUSY,
                          "election '%.200s': no change since the last read",
                          o->name);
    return DLOCK_OK;
}

/* Ends o's thread and waits for it (once). */
static void observer_stop(dlock_observer *o)
{
    uint64_t one = 1;

    pthread_mutex_lock(&o->mu);
    if (o->stopped) {
        pthread_mutex_unlock(&o->mu);
        return;
    }
    o->stop = 1;
    o->stopped = 1;
    pthread_mutex_unlock(&o->mu);
    (void)!write(o->stop_fd, &one, sizeof(one));
    if (o->started)
        pthread_join(o->thread, NULL);
}

void dlock__observers_stop(dlock_client *c)
{
    for (;;) {
        pthread_mutex_lock(&c->mu);
        dlock_observer *o = c->observers;
        if (o) {
            c->observers = o->next;
            if (o->next)
                o->next->prev = NULL;
            o->linked = 0;
            o->prev = o->next = NULL;
        }
        pthread_mutex_unlock(&c->mu);
        if (!o)
            return;
        observer_stop(o);
    }
}

void dlock_observer_close(dlock_observer *o)
{
    dlock_client *c;

    if (!o)
        return;
    c = o->c;
    if (o->started && pthread_equal(pthread_self(), o->thread))
        return; /* from its own callback: documented as not allowed */
    pthread_mutex_lock(&c->mu);
    if (o->linked) {
        DLOCK__UNLINK(c->observers, o);
        o->linked = 0;
    }
    pthread_mutex_unlock(&c->mu);
    observer_stop(o);
    close(o->stop_fd);
    close(o->ready_fd);
    pthread_mutex_destroy(&o->mu);
    free(o->name);
    free(o);
    pthread_mutex_lock(&c->mu);
    dlock__client_unref(c); /* unlocks; frees a closed client */
}
