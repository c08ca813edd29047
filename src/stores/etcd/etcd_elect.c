/* SPDX-License-Identifier: MIT */
/*
 * etcd_elect.c -- leader election on etcd (docs/design.md, "Leader
 * election"): the proclaim, and an observer's watch; and the store's
 * check (dlock doctor), of what its URI says.
 *
 * Proclaim: one transaction, guarded by our key's create revision (as a
 * release is), puts the new value "<owner>\n<value>" with ignore_lease:
 * the key keeps its lease, its create revision (the term) and its place.
 *
 * An observer's watch is a watch of its own on the lock's key range
 * (every event: a key put, a value changed, a key deleted by a release,
 * a break or its lease's end), over a streaming POST to the gateway's
 * /v3/watch: the gateway answers with one JSON message per line, first
 * "created", then one per batch of events. It runs on a libcurl multi
 * handle of the watch's own, whose wait (curl_multi_poll) also watches
 * the observer's cancel descriptor: woken by etcd's events, never by a
 * timer of ours. The client's own stream (etcd_wait.c) watches deletions
 * only, for waiters; an observer needs the puts too.
 */
#include "etcd_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The longest line the watch keeps (an event batch of a lock's range). */
#define WATCH_LINE_MAX (1 << 20)

int dlock__etcd_proclaim(void *st, dlock__lease *l, const char *desc,
                         int64_t op_deadline)
{
    etcd_store *es = st;
    etcd_hold *eh = l->priv;
    char val[600], vb[820], kb[ETCD_B64_MAX], body[2 * ETCD_B64_MAX + 1200];
    cJSON *j = NULL;
    int rc, vlen;

    if (!eh->lease || eh->lease->dead)
        return dlock__err(DLOCK_ENOTHELD, "etcd %s: the lease of this hold "
                                          "ended", es->redacted);
    vlen = snprintf(val, sizeof(val), "%s\n%s", l->owner, desc);
    if (vlen >= (int)sizeof(val))
        vlen = (int)sizeof(val) - 1;
    dlock__etcd_b64_encode(val, (size_t)vlen, vb);
    dlock__etcd_b64_encode(eh->key, eh->key_len, kb);
    snprintf(body, sizeof(body),
             "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\","
             "\"create_revision\":\"%" PRId64 "\"}],"
             "\"success\":[{\"request_put\":{\"key\":\"%s\","
             "\"value\":\"%s\",\"ignore_lease\":true}}]}",
             kb, eh->rev, kb, vb);
    rc = dlock__etcd_request(es, "/v3/kv/txn", body, op_deadline, &j,
                             "writing the lock key");
    if (rc != DLOCK_OK)
        return rc == ETCD_NOLEASE ? DLOCK_ECONN : rc;
    int ours = cJSON_IsTrue(jget(j, "succeeded"));
    cJSON_Delete(j);
    return ours ? DLOCK_OK
                : dlock__err(DLOCK_ENOTHELD, "etcd %s: the lock key is gone",
                             es->redacted);
}

/* dlock_client_check(): what the store's URI says of its traffic, and
 * what could not be checked (in this file with the store's newer slots). */
int dlock__etcd_check(void *st, int64_t ttl_ms, dlock_check *out,
                      int64_t op_deadline)
{
    etcd_store *es = st;
    int plain = 0, rc;

    (void)ttl_ms;
    (void)op_deadline;
    for (size_t i = 0; i < es->nep; i++)
        plain |= strncmp(es->ep[i], "https://", 8) != 0;
    if (es->password && plain &&
        (rc = dlock__check_finding(
             out, "password-without-tls",
             "the user's password goes to an endpoint without TLS (etcd:// "
             "and not etcds://): whoever sees the traffic can log in as "
             "that user and write dlock's keys, breaking every lock",
             "use etcds:// (the gateway over TLS), or keep the traffic on a "
             "network only the clients reach")) != 0)
        return rc;
    /* leases are counted by the server (a lease's TTL, not a time of
     * day): no clock of its own to compare */
    dlock__check_note(out, "etcd's leases are counted by the server from "
                           "each keepalive: no clock offset to check");
    return DLOCK_OK;
}

typedef struct ewatch {
    etcd_conn *cn; /* a handle of the pool's, the watch's until its end */
    CURLM *m;
    char *body;
    dlock__buf in; /* bytes not yet split into lines */
    int created;   /* the gateway said the watch exists */
    int events;    /* events came since the last wait returned */
    int broken;    /* the watch ended (canceled, an error, the stream) */
    char why[CURL_ERROR_SIZE + 64];
} ewatch;

/* One line of the stream: {"result": {...}} or {"error": {...}}. */
static void on_line(ewatch *w, const char *p, size_t n)
{
    cJSON *j = cJSON_ParseWithLength(p, n);
    const cJSON *r = j ? jget(j, "result") : NULL;

    if (!r) {
        w->broken = 1;
        snprintf(w->why, sizeof(w->why), "%s",
                 j && jget(j, "error") ? "the gateway ended the watch"
                                       : "an answer that is not JSON");
    } else {
        if (cJSON_IsTrue(jget(r, "created")))
            w->created = 1;
        if (cJSON_IsTrue(jget(r, "canceled"))) {
            w->broken = 1;
            snprintf(w->why, sizeof(w->why), "etcd canceled the watch");
        }
        const cJSON *ev = jget(r, "events");
        if (cJSON_IsArray(ev) && cJSON_GetArraySize(ev) > 0)
            w->events = 1;
    }
    cJSON_Delete(j);
}

static size_t on_stream(char *p, size_t size, size_t nmemb, void *arg)
{
    ewatch *w = arg;
    size_t n = size * nmemb;

    if (dlock__buf_add(&w->in, p, n) != 0)
        return 0; /* past WATCH_LINE_MAX: the transfer fails */
    for (;;) {
        char *nl = w->in.p ? memchr(w->in.p, '\n', w->in.len) : NULL;
        if (!nl)
            break;
        size_t len = (size_t)(nl - w->in.p);
        if (len > 0)
            on_line(w, w->in.p, len);
        dlock__buf_drop(&w->in, len + 1);
    }
    return n;
}

/* Runs the transfer until events came (or, with opening, the watch's
 * creation), `deadline`, or cancel_fd is readable. 1: they came (or the
 * watch broke: w->broken), 0: the deadline or the cancel. */
static int pump(ewatch *w, int opening, int64_t deadline, int cancel_fd)
{
    for (;;) {
        int running = 0, numfds = 0;
        CURLMcode mc = curl_multi_perform(w->m, &running);
        CURLMsg *msg;
        int left;

        while ((msg = curl_multi_info_read(w->m, &left)))
            if (msg->msg == CURLMSG_DONE) {
                w->broken = 1;
                snprintf(w->why, sizeof(w->why), "the watch stream ended: %s",
                         w->cn->errbuf[0] ? w->cn->errbuf
                                          : curl_easy_strerror(
                                                msg->data.result));
            }
        if (mc != CURLM_OK && !w->broken) {
            w->broken = 1;
            snprintf(w->why, sizeof(w->why), "%s", curl_multi_strerror(mc));
        }
        if (w->broken || w->events || (opening && w->created))
            return 1;
        if (!running) {
            w->broken = 1;
            snprintf(w->why, sizeof(w->why), "the watch stream ended");
            return 1;
        }
        int64_t now = dlock__now_ms();
        if (now >= deadline)
            return 0;
        int64_t ms = deadline - now;
        struct curl_waitfd extra = {cancel_fd, CURL_WAIT_POLLIN, 0};
        mc = curl_multi_poll(w->m, cancel_fd >= 0 ? &extra : NULL,
                             cancel_fd >= 0 ? 1 : 0,
                             ms > 60000 ? 60000 : (int)ms, &numfds);
        if (mc != CURLM_OK) {
            w->broken = 1;
            snprintf(w->why, sizeof(w->why), "%s", curl_multi_strerror(mc));
            return 1;
        }
        if (cancel_fd >= 0 && (extra.revents & CURL_WAIT_POLLIN))
            return 0;
    }
}

static void watch_free(ewatch *w)
{
    if (w->m) {
        if (w->cn)
            curl_multi_remove_handle(w->m, w->cn->h);
        curl_multi_cleanup(w->m);
    }
    if (w->cn)
        dlock__etcd_conn_free(w->cn); /* its options are the stream's */
    dlock__buf_free(&w->in);
    free(w->body);
    free(w);
}

int dlock__etcd_watch_open(void *st, const char *name, size_t len, void **out,
                           int64_t op_deadline)
{
    etcd_store *es = st;
    char base[ETCD_KEY_MAX], bb[ETCD_B64_MAX], eb[ETCD_B64_MAX], url[512];
    size_t base_len = dlock__etcd_lock_base(es, name, len, base);
    ewatch *w = calloc(1, sizeof(*w));
    dlock__fd_note *note = NULL;
    int rc = DLOCK_OK;

    *out = NULL;
    if (!w)
        return enomem();
    w->in.max = WATCH_LINE_MAX;
    dlock__etcd_b64_encode(base, base_len, bb);
    dlock__etcd_range_end_b64(base, base_len, eb);
    size_t blen = strlen(bb) + strlen(eb) + 96;
    w->cn = dlock__etcd_conn_get(es);
    w->body = malloc(blen);
    note = malloc(sizeof(*note));
    if (!w->cn || !w->body || !note ||
        dlock__etcd_conn_headers(es, w->cn) != 0) {
        free(note);
        watch_free(w);
        return enomem();
    }
    snprintf(w->body, blen,
             "{\"create_request\":{\"key\":\"%s\",\"range_end\":\"%s\"}}", bb,
             eb);
    pthread_mutex_lock(&es->mu);
    snprintf(url, sizeof(url), "%s/v3/watch", es->ep[es->cur]);
    pthread_mutex_unlock(&es->mu);
    CURL *h = w->cn->h;
    w->cn->errbuf[0] = '\0';
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, w->cn->hdrs);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, w->body);
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(w->body));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_stream);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, w);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 0L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)es->timeout_ms);
    /* the multi handle's own wake-up pair and the stream's socket,
     * close-on-exec (docs/design.md, "Descriptors") */
    dlock__fds_note(note);
    w->m = curl_multi_init();
    if (!w->m || curl_multi_add_handle(w->m, h) != CURLM_OK) {
        dlock__fds_mark_new(note);
        free(note);
        watch_free(w);
        return enomem();
    }
    /* until etcd says the watch exists: from then on, every write of the
     * range is an event of ours */
    (void)pump(w, 1, op_deadline, -1);
    dlock__fds_mark_new(note);
    free(note);
    if (!w->created)
        rc = dlock__err(DLOCK_ECONN, "etcd %s: watching lock '%.100s': %s",
                        es->redacted, name,
                        w->broken ? w->why : "no answer in time");
    if (rc) {
        watch_free(w);
        return rc;
    }
    w->events = 0;
    *out = w;
    return DLOCK_OK;
}

int dlock__etcd_watch_wait(void *st, void *wp, int64_t deadline,
                           int cancel_fd)
{
    etcd_store *es = st;
    ewatch *w = wp;

    if (!pump(w, 0, deadline, cancel_fd))
        return DLOCK_EBUSY;
    if (w->events) {
        w->events = 0;
        return DLOCK_OK;
    }
    return dlock__err(DLOCK_ECONN, "etcd %s: %s", es->redacted, w->why);
}

void dlock__etcd_watch_close(void *st, void *wp)
{
    (void)st;
    if (wp)
        watch_free(wp);
}
