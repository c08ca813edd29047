/* SPDX-License-Identifier: MIT */
/*
 * client.c -- clients: opening (the default store's URI, the backend) and
 * closing, the start of the background thread when first needed, their
 * settings, and the wake-ups that stores send to waiting threads
 * (dlock__notify_*). The background thread itself, with the watchdog, is
 * in watchdog.c.
 */
#include "internal.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define DEFAULT_TIMEOUT_MS 2000
/* the longest round trip a client may be given: as a URI's ?timeout= */
#define MAX_TIMEOUT_MS 3600000

/* ------------------------------------------------------------------------ */
/* Wake-ups (called by backends, any thread)                                */
/* ------------------------------------------------------------------------ */

void dlock__wake(dlock_client *c)
{
    uint64_t one = 1;
    ssize_t n;

    do
        n = write(c->wake_fd, &one, sizeof(one));
    while (n < 0 && errno == EINTR);
}

int dlock__thread_start(dlock_client *c)
{
    if (c->thread_running)
        return 0;
    if (!c->thread_started) {
        sigset_t old;
        int e;

        dlock__block_signals(&old);
        e = pthread_create(&c->thread, NULL, dlock__background, c);
        dlock__restore_signals(&old);
        if (e != 0)
            return e;
        __atomic_store_n(&c->thread_started, 1, __ATOMIC_RELEASE);
    }
    /* return only once the thread runs its loop: a thread still starting
     * (its runtime setting itself up, allocating) when the caller forks
     * leaves the child with locks no thread will release (seen with
     * AddressSanitizer's allocator). It needs c->mu first of all, which
     * this wait lets go of. */
    while (!c->thread_running)
        pthread_cond_wait(&c->cv, &c->mu);
    return 0;
}

/* A store asks for the background thread (store.h): started if it has
 * not been (best effort: a start that fails here is the next acquire's
 * to report), unless the client is still opening its store, closed, or
 * a forked child's copy. No message is set: the store may be about to
 * return one of its own. */
void dlock__loop_wake(dlock_client *c)
{
    if (!__atomic_load_n(&c->thread_running, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&c->mu);
        if (c->opened && !c->closed && c->pid == dlock__pid())
            (void)dlock__thread_start(c);
        pthread_mutex_unlock(&c->mu);
    }
    dlock__wake(c);
}

/* A new deadline for the background thread: woken only when it is
 * earlier than the one it sleeps towards (an acquire after the first
 * rarely pays for a context switch to tell it about a renewal 10 s away;
 * not a timerfd: libfaketime, which the clock-skew tests run holders
 * under, shifts absolute timerfd times). */
void dlock__schedule(dlock_client *c, int64_t when)
{
    if (when < c->next_wake) {
        c->next_wake = when;
        dlock__wake(c);
    }
}

/* Wakes waiter w (c->mu held): through its condition variable, or, if it
 * is the thread reading the backend's fd, through the reader's eventfd. */
void dlock__wake_waiter(dlock_client *c, dlock__waiter *w)
{
    /* the moment the store's word arrived, for dlock_handoff_seconds */
    if (!w->rearm && dlock__m_on(&c->m))
        w->woken_us = dlock__now_us();
    if (w == c->reader) {
        /* the reader itself, reading: it looks at its flags next */
        if (pthread_equal(pthread_self(), w->thread))
            return;
        uint64_t one = 1;
        ssize_t n;
        do
            n = write(c->reader_fd, &one, sizeof(one));
        while (n < 0 && errno == EINTR);
    } else {
        pthread_cond_signal(&w->cv);
    }
}

void dlock__notify_name(dlock_client *c, const char *name, size_t len)
{
    pthread_mutex_lock(&c->mu);
    dlock__entry *e = dlock__entry_find(c, name, len);
    if (e) {
        /* Wake the oldest waiter of this name that has not been woken yet:
         * only one can win, and a waiter that gives up passes its wake-up
         * on (see lock.c), so none is lost. */
        for (dlock__waiter *w = c->waiters; w; w = w->next) {
            if (w->entry == e && !w->fair && !w->notified) {
                w->notified = 1;
                dlock__wake_waiter(c, w);
                break;
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
}

void dlock__notify_fair(dlock_client *c, const char *name, size_t len)
{
    pthread_mutex_lock(&c->mu);
    dlock__entry *e = dlock__entry_find(c, name, len);
    for (dlock__waiter *w = c->waiters; e && w; w = w->next) {
        if (w->entry == e && w->fair) {
            w->notified = 1;
            dlock__wake_waiter(c, w);
        }
    }
    pthread_mutex_unlock(&c->mu);
}

void dlock__notify_waiter(dlock_client *c, uint64_t seq)
{
    pthread_mutex_lock(&c->mu);
    for (dlock__waiter *w = c->waiters; w; w = w->next) {
        if (w->seq == seq) {
            w->notified = 1;
            dlock__wake_waiter(c, w);
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

void dlock__notify_grant(dlock_client *c, uint64_t seq, uint64_t token)
{
    pthread_mutex_lock(&c->mu);
    for (dlock__waiter *w = c->waiters; w; w = w->next) {
        if (w->seq == seq) {
            if (!w->granted) {
                w->granted = 1;
                w->token = token;
                dlock__wake_waiter(c, w);
            }
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

void dlock__notify_error(dlock_client *c)
{
    pthread_mutex_lock(&c->mu);
    for (dlock__waiter *w = c->waiters; w; w = w->next) {
        w->rearm = 1;
        dlock__wake_waiter(c, w);
    }
    pthread_mutex_unlock(&c->mu);
}

const char *dlock__client_id(const dlock_client *c)
{
    return c->id;
}

/* ------------------------------------------------------------------------ */
/* Opening and closing                                                      */
/* ------------------------------------------------------------------------ */

/* Appends `s` to buf with every byte outside [A-Za-z0-9/._-] %-escaped. */
static void append_escaped(char *buf, size_t cap, const char *s)
{
    size_t o = strlen(buf);

    for (; *s && o + 4 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
            (ch >= '0' && ch <= '9') || ch == '/' || ch == '.' ||
            ch == '_' || ch == '-')
            buf[o++] = (char)ch;
        else
            o += (size_t)snprintf(buf + o, cap - o, "%%%02X", ch);
    }
    buf[o] = '\0';
}

/* The way out that every error about the default store names. */
#define DEFAULT_FIX \
    "; give dlock a directory with --store file:///DIR or DLOCK_STORE"

/* The directory of the default store, below the home directory. */
#define DEFAULT_SUBDIR "/.local/state/dlock"

/* The URI used when none is given: $DLOCK_STORE, else the private file
 * store HOME/.local/state/dlock, HOME being the home directory of the
 * effective uid's passwd entry, its symbolic links resolved. Never $HOME
 * or an $XDG_ variable: they differ between cron, sudo, services and
 * logins, and every session of a user must find one directory
 * (docs/stores.md, "The default store"). The file store's ?private=1
 * checks the directories; the symbolic links of the home's own path are
 * resolved here because they are the administrator's, like the passwd
 * entry itself. */
static int default_uri(char *buf, size_t cap)
{
    const char *env = getenv("DLOCK_STORE");
    uid_t uid = geteuid();
    struct passwd pw, *found = NULL;
    char *pwbuf = NULL, *home;
    size_t pwcap = 1024, need;
    int e;

    if (env && *env) {
        if (strlen(env) >= cap)
            return dlock__err(DLOCK_EINVAL, "DLOCK_STORE is too long");
        memcpy(buf, env, strlen(env) + 1);
        return DLOCK_OK;
    }
    for (;;) { /* a buffer big enough for the entry (1 MiB at most) */
        char *nb = realloc(pwbuf, pwcap);
        if (!nb) {
            free(pwbuf);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
        pwbuf = nb;
        e = getpwuid_r(uid, &pw, pwbuf, pwcap, &found);
        if (e != ERANGE || pwcap >= (size_t)1 << 20)
            break;
        pwcap *= 2;
    }
    if (!found) {
        free(pwbuf);
        if (e == 0 || e == ENOENT || e == ESRCH)
            return dlock__err(DLOCK_ENOTSUP,
                              "the default store lives in your home "
                              "directory, but uid %lu has no passwd "
                              "entry" DEFAULT_FIX,
                              (unsigned long)uid);
        return dlock__err(DLOCK_ENOTSUP,
                          "the default store lives in your home directory, "
                          "but the passwd entry of uid %lu cannot be read: "
                          "%s" DEFAULT_FIX,
                          (unsigned long)uid, strerror(e));
    }
    if (!pw.pw_dir || pw.pw_dir[0] != '/') {
        int rc = dlock__err(DLOCK_ENOTSUP,
                            "the default store lives in your home "
                            "directory, but the passwd entry of uid %lu "
                            "(%.64s) gives none (\"%.200s\")" DEFAULT_FIX,
                            (unsigned long)uid,
                            pw.pw_name ? pw.pw_name : "",
                            pw.pw_dir ? pw.pw_dir : "");
        free(pwbuf);
        return rc;
    }
    home = realpath(pw.pw_dir, NULL);
    if (!home) {
        e = errno;
        int rc = dlock__err(e == ENOMEM ? DLOCK_ENOMEM : DLOCK_ENOTSUP,
                            "the default store lives in your home "
                            "directory, %.200s (the passwd entry of uid %lu, "
                            "%.64s), which cannot be used: %s" DEFAULT_FIX,
                            pw.pw_dir, (unsigned long)uid,
                            pw.pw_name ? pw.pw_name : "", strerror(e));
        free(pwbuf);
        return rc;
    }
    free(pwbuf);
    /* "file://" + the escaped home ("/" adds nothing) + the rest */
    need = strlen("file://") + strlen(DEFAULT_SUBDIR "?private=1") + 1;
    for (const char *p = home; *p; p++)
        need += strchr("/._-", *p) || (*p >= 'a' && *p <= 'z') ||
                        (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')
                    ? 1
                    : 3;
    if (need > cap) {
        int rc = dlock__err(DLOCK_ENOTSUP,
                            "the default store lives in your home "
                            "directory, whose path is too long (%zu bytes "
                            "escaped)" DEFAULT_FIX,
                            need);
        free(home);
        return rc;
    }
    snprintf(buf, cap, "file://");
    if (strcmp(home, "/") != 0)
        append_escaped(buf, cap, home);
    strcat(buf, DEFAULT_SUBDIR "?private=1");
    free(home);
    return DLOCK_OK;
}

static void client_free(dlock_client *c)
{
    for (size_t i = 0; i < c->nbuckets; i++) {
        dlock__entry *e = c->buckets[i];
        while (e) {
            dlock__entry *next = e->chain;
            free(e->name);
            free(e);
            e = next;
        }
    }
    free(c->buckets);
    dlock__metrics_free(&c->m);
    if (c->wake_fd >= 0)
        close(c->wake_fd);
    if (c->reader_fd >= 0)
        close(c->reader_fd);
    for (int i = 0; i < c->n_cfd_free; i++)
        close(c->cfd_free[i]);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c->store);
    dlock__store_close(c->module);
    free(c);
}

int dlock_client_open(dlock_client **out, const char *uri,
                      const dlock_client_options *opts)
{
    char defuri[4200];
    dlock__uri u;
    const dlock__backend *be;
    dlock_client *c;
    unsigned char id[16];
    void *module = NULL;
    int rc;

    dlock__err_clear();
    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_client_open: out is NULL");
    *out = NULL;
    if (opts && opts->timeout_ms < 0)
        return dlock__err(DLOCK_EINVAL,
                          "client option timeout_ms must not be negative");
    if (opts && opts->timeout_ms > MAX_TIMEOUT_MS)
        return dlock__err(DLOCK_EINVAL,
                          "client option timeout_ms must be at most %d (one "
                          "hour), not %lld",
                          MAX_TIMEOUT_MS, (long long)opts->timeout_ms);
    if (!uri || !*uri) {
        rc = default_uri(defuri, sizeof(defuri));
        if (rc)
            return rc;
        uri = defuri;
    }
    rc = dlock__uri_parse(uri, &u);
    if (!rc && (rc = dlock__uri_take_password(&u)) != DLOCK_OK)
        dlock__uri_free(&u);
    if (rc)
        return rc;
    rc = dlock__store_open(u.scheme, &be, &module);
    if (rc) {
        dlock__uri_free(&u);
        return rc;
    }
    if (be->select) {
        /* a mode of the same store: its table is checked as the store's */
        const dlock__backend *mode = be->select(&u);
        if (mode && (rc = dlock__backend_check(mode, u.scheme)) != DLOCK_OK) {
            dlock__uri_free(&u);
            dlock__store_close(module);
            return rc;
        }
        if (mode)
            be = mode;
    }

    c = calloc(1, sizeof(*c));
    if (!c) {
        dlock__uri_free(&u);
        dlock__store_close(module);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    c->module = module;
    c->wake_fd = -1;
    c->reader_fd = -1;
    c->be = be;
    c->refs = 1;
    c->next_wake = DLOCK__FOREVER;
    dlock__metrics_init(&c->m);
    c->timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms
                                                  : DEFAULT_TIMEOUT_MS;
    c->pid = dlock__pid();
    if (gethostname(c->host, sizeof(c->host) - 1) != 0)
        strcpy(c->host, "unknown-host");
    pthread_mutex_init(&c->mu, NULL);
    rc = dlock__cond_init(&c->cv);
    if (rc) {
        pthread_mutex_destroy(&c->mu);
        free(c);
        dlock__uri_free(&u);
        dlock__store_close(module);
        return rc;
    }
    c->store = strdup(u.redacted);
    rc = dlock__random(id, sizeof(id));
    if (!c->store && !rc)
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    if (rc)
        goto fail;
    for (size_t i = 0; i < sizeof(id); i++)
        snprintf(c->id + 2 * i, 3, "%02x", id[i]);
    c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->wake_fd >= 0 && (be->caps & DLOCK__CAP_WAITER_READS))
        c->reader_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (c->wake_fd < 0 ||
        ((be->caps & DLOCK__CAP_WAITER_READS) && c->reader_fd < 0)) {
        rc = dlock__err(DLOCK_ENOMEM, "eventfd failed: %s", strerror(errno));
        goto fail;
    }

    rc = be->open(&c->st, c, &u, c->timeout_ms);
    if (rc)
        goto fail;

    /* No background thread yet: the first call that needs it starts it
     * (docs/design.md "Threads"), so that a client opened and left idle
     * adds no thread to the process (a fork then warns nobody). From
     * here on a store's dlock__loop_wake() may start it too (its own
     * threads see c->opened under the mutex). */
    pthread_mutex_lock(&c->mu);
    c->opened = 1;
    pthread_mutex_unlock(&c->mu);
    dlock__uri_free(&u);
    *out = c;
    return DLOCK_OK;

fail:
    dlock__uri_free(&u);
    client_free(c);
    return rc;
}

void dlock__client_unref(dlock_client *c)
{
    if (--c->refs > 0) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    pthread_mutex_unlock(&c->mu);
    client_free(c);
}

void dlock_client_close(dlock_client *c)
{
    if (!c)
        return;
    if (__atomic_load_n(&c->thread_started, __ATOMIC_ACQUIRE) &&
        pthread_equal(pthread_self(), c->thread))
        return; /* from a callback: documented as not allowed */
    if (c->pid != dlock__pid())
        return; /* a forked child: no thread to stop, and the holds and
                 * connections are the parent's (a release or a goodbye
                 * sent from here would end them under the parent) */

    /* observers first, while the client still answers their reads
     * (their threads use the store) */
    dlock__observers_stop(c);
    pthread_mutex_lock(&c->mu);
    if (c->closed) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    c->closed = 1;
    c->stopping = 1;
    /* started before this (the flag is set under this mutex), or never:
     * a closed client starts none */
    int started = c->thread_started;
    pthread_mutex_unlock(&c->mu);
    if (started) {
        dlock__wake(c);
        pthread_join(c->thread, NULL);
        __atomic_store_n(&c->thread_started, 0, __ATOMIC_RELEASE);
    }

    pthread_mutex_lock(&c->mu);
    while (c->holds) {
        dlock__hold *h = c->holds;
        dlock__hold_unlink(c, h);
        pthread_mutex_unlock(&c->mu);
        dlock__hold_drop(c, h);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);

    c->be->close(c->st);
    c->st = NULL;
    pthread_mutex_lock(&c->mu);
    dlock__client_unref(c);
}

const char *dlock_client_store(const dlock_client *c)
{
    return c ? c->store : "";
}

/* The checks of a client setting (function `fn`, argument `arg`): a
 * client, and 0 <= ms <= max (`max_name`: which bound). DLOCK_OK, or
 * DLOCK_EINVAL. */
static int check_setting(const dlock_client *c, const char *fn,
                         const char *arg, int64_t ms, int64_t max,
                         const char *max_name)
{
    if (!c)
        return dlock__err(DLOCK_EINVAL, "%s: client is NULL", fn);
    if (ms < 0)
        return dlock__err(DLOCK_EINVAL,
                          "%s: %s must not be negative, not %lld", fn, arg,
                          (long long)ms);
    if (ms > max)
        return dlock__err(DLOCK_EINVAL,
                          "%s: %s must be at most %lld (%s, 365 days), not "
                          "%lld",
                          fn, arg, (long long)max, max_name, (long long)ms);
    return DLOCK_OK;
}

int dlock_client_set_events(dlock_client *c, dlock_event_cb cb, void *arg,
                            int64_t long_hold_ms)
{
    int rc = check_setting(c, "dlock_client_set_events", "long_hold_ms",
                           long_hold_ms, DLOCK_WAIT_MAX, "DLOCK_WAIT_MAX");

    if (rc)
        return rc;
    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    if (rc == DLOCK_OK) {
        c->ev_cb = cb;
        c->ev_arg = arg;
        c->long_hold_ms = long_hold_ms;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int dlock_client_set_at_risk(dlock_client *c, int64_t margin_ms)
{
    int rc = check_setting(c, "dlock_client_set_at_risk", "margin_ms",
                           margin_ms, DLOCK_TTL_MAX, "DLOCK_TTL_MAX");

    if (rc)
        return rc;
    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    if (rc == DLOCK_OK)
        __atomic_store_n(&c->at_risk_ms, margin_ms, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&c->mu);
    if (rc == DLOCK_OK)
        dlock__wake(c); /* every hold's at-risk moment moved (a thread
                         * that has not started has no hold to look at) */
    return rc;
}

int dlock_client_at_risk_max(dlock_client *c, int64_t ttl_ms,
                             int64_t *max_ms)
{
    int rc;

    if (!c)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_client_at_risk_max: client is NULL");
    if (!max_ms)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_client_at_risk_max: max_ms is NULL");
    *max_ms = 0;
    if (ttl_ms < DLOCK_TTL_MIN)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_client_at_risk_max: ttl_ms must be at "
                          "least %d, not %lld",
                          DLOCK_TTL_MIN, (long long)ttl_ms);
    if (ttl_ms > DLOCK_TTL_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_client_at_risk_max: ttl_ms must be at most "
                          "%lld (DLOCK_TTL_MAX, 365 days), not %lld",
                          DLOCK_TTL_MAX, (long long)ttl_ms);
    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    pthread_mutex_unlock(&c->mu);
    if (rc)
        return rc;
    if (c->be->at_risk_max)
        return c->be->at_risk_max(c->st, ttl_ms, max_ms,
                                  dlock__now_ms() + c->timeout_ms);
    if (!(c->be->caps & DLOCK__CAP_LEASE)) {
        *max_ms = INT64_MAX; /* no lease: no at-risk event */
        return DLOCK_OK;
    }
    /* renewals every min(ttl/3, (ttl - drift - M)/2): at least ttl/6
     * while M <= 2/3 ttl - drift */
    int64_t m = ttl_ms * 2 / 3 - dlock__client_margin(c, ttl_ms);
    *max_ms = m > 0 ? m : 0;
    return DLOCK_OK;
}
