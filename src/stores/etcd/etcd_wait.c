/* SPDX-License-Identifier: MIT */
/*
 * etcd_wait.c -- the etcd store's watch stream (etcd.c is the lock
 * protocol, etcd_int.h what the files share): the client's one WebSocket to
 * the gateway's /v3/watch, its frames, the deletions it reports, and the
 * waiters they wake; a waiter's look at the keys ahead of its own.
 */
#include "etcd_int.h"

#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

/* ------------------------------------------------------------------------ */
/* The watch stream                                                         */
/* ------------------------------------------------------------------------ */

/*
 * One WebSocket per client to the gateway's /v3/watch (etcd's gateway
 * serves it since 3.3), with one watch on the whole prefix, deletions
 * only, from the member's current revision: made once, it stays "synced"
 * in etcd, so its events go out as each write is applied. A watch made
 * per wait could come out "unsynced" whenever a write landed while etcd
 * set it up, and wait for etcd's 100 ms catch-up loop. See docs/design.md
 * ("etcd: one watch stream per client") for the protocol and its failure
 * cases.
 *
 * libcurl connects (TLS included) with CURLOPT_CONNECT_ONLY; the
 * handshake and the frames (RFC 6455: client frames masked, server frames
 * not) are ours. The opener reads the stream until the watch is created;
 * then the client thread reads it (the socket is in its epoll set),
 * draining curl_easy_recv() until it would block (TLS may hold bytes the
 * socket no longer shows).
 */

#define WS_TEXT 0x1
#define WS_CLOSE 0x8
#define WS_PING 0x9
#define WS_PONG 0xA

/* Waits until the stream's socket is readable (or writable): 0 ready,
 * -1 the deadline passed. */
static int sock_wait(curl_socket_t fd, int out, int64_t deadline)
{
    struct pollfd p;
    int64_t left = deadline - dlock__now_ms();

    if (left < 0)
        return -1;
    p.fd = fd;
    p.events = out ? POLLOUT : POLLIN;
    p.revents = 0;
    return poll(&p, 1, left > 60000 ? 60000 : (int)left) > 0 ? 0 : -1;
}

/* Sends all of p[0..n) on the stream; es->sio held. 0 or -1. */
static int stream_write(etcd_store *es, const char *p, size_t n,
                        int64_t deadline)
{
    while (n > 0) {
        size_t sent = 0;
        CURLcode cc = curl_easy_send(es->sh, p, n, &sent);
        if (cc == CURLE_AGAIN) {
            if (sock_wait(es->sfd, 1, deadline) != 0)
                return -1;
            continue;
        }
        if (cc != CURLE_OK)
            return -1;
        p += sent;
        n -= sent;
    }
    return 0;
}

/* The largest message we send: the watch's create request (a pong's
 * payload is at most 125 bytes). */
#define WS_SEND_MAX (2 * ETCD_B64_MAX + 128)
_Static_assert(WS_SEND_MAX < 65536, "a 16-bit frame length");

/* One masked frame (a client's frames must be). es->sio held. The frame
 * is built on the stack: nothing on the heap lives across the write (a
 * fork() by another thread of the process while this one waits to write
 * would leave such a block to the child, owned by no one). */
static int ws_send(etcd_store *es, int op, const char *p, size_t n,
                   int64_t deadline)
{
    unsigned char mask[4];
    char f[4 + 4 + WS_SEND_MAX];
    size_t h = 0;

    if (n > WS_SEND_MAX)
        return -1;
    f[h++] = (char)(0x80 | op);
    if (n < 126) {
        f[h++] = (char)(0x80 | n);
    } else {
        f[h++] = (char)(0x80 | 126);
        f[h++] = (char)(n >> 8);
        f[h++] = (char)n;
    }
    if (dlock__random(mask, sizeof(mask)) != 0)
        memset(mask, 0x5a, sizeof(mask)); /* masking is not a secret */
    memcpy(f + h, mask, 4);
    h += 4;
    for (size_t i = 0; i < n; i++)
        f[h + i] = (char)(p[i] ^ mask[i & 3]);
    return stream_write(es, f, h + n, deadline);
}

/*
 * Takes the complete frames at the start of *in: a message's text goes
 * to *msg (a message may come in several frames) and, once whole, to
 * on_msg(arg, text, len), which returns -1 to stop. A ping is answered
 * through pong(arg, ...) when given. Returns 0 (more bytes needed), or -1:
 * a close frame, a protocol error, or on_msg said stop. No socket: the
 * fuzz target runs it on any bytes.
 */
static int ws_frames(dlock__buf *in, dlock__buf *msg,
                     int (*on_msg)(void *arg, const char *p, size_t n),
                     int (*pong)(void *arg, const char *p, size_t n),
                     void *arg)
{
    size_t off = 0;
    int rc = 0;

    for (;;) {
        const unsigned char *b = (const unsigned char *)in->p + off;
        size_t have = in->len - off, h = 2;
        uint64_t len;

        if (have < 2)
            break;
        len = b[1] & 0x7f;
        if (b[1] & 0x80) { /* a server never masks */
            rc = -1;
            break;
        }
        if (len == 126) {
            if (have < 4)
                break;
            len = (uint64_t)b[2] << 8 | b[3];
            h = 4;
        } else if (len == 127) {
            if (have < 10)
                break;
            len = 0;
            for (int i = 0; i < 8; i++)
                len = len << 8 | b[2 + i];
            h = 10;
        }
        if (len > ETCD_RESP_MAX) {
            rc = -1;
            break;
        }
        if (have - h < len)
            break;
        int op = b[0] & 0x0f, fin = (b[0] & 0x80) != 0;
        const char *p = (const char *)b + h;
        off += h + (size_t)len;
        if (op == WS_CLOSE) {
            rc = -1;
            break;
        }
        if (op == WS_PING) {
            if (pong && pong(arg, p, (size_t)len) != 0) {
                rc = -1;
                break;
            }
            continue;
        }
        if (op == WS_PONG)
            continue;
        if (op != WS_TEXT && op != 0x0 && op != 0x2) {
            rc = -1;
            break;
        }
        if (dlock__buf_add(msg, p, (size_t)len) != 0) {
            rc = -1;
            break;
        }
        if (!fin)
            continue;
        rc = on_msg(arg, msg->p, msg->len);
        dlock__buf_reset(msg);
        if (rc != 0)
            break;
    }
    /* keep what is left (an incomplete frame) at the start */
    dlock__buf_drop(in, off);
    return rc;
}

/* A waiter's key ahead went, or its own: es->mu held. */
static void waiter_deleted(etcd_waiter *w, const char *key, int64_t rev)
{
    if (w->pending) {
        if (w->nlog == w->caplog) {
            size_t nc = w->caplog ? w->caplog * 2 : 16;
            etcd_del *nl = nc <= 4096 ? realloc(w->log, nc * sizeof(*nl))
                                      : NULL;
            if (!nl) {
                w->broken = 1; /* cannot keep up: look again */
                return;
            }
            w->log = nl;
            w->caplog = nc;
        }
        if (!(w->log[w->nlog].key = strdup(key))) {
            w->broken = 1;
            return;
        }
        w->log[w->nlog++].rev = rev;
        return;
    }
    /* a deletion the waiter's own revision already shows (the stream
     * lags behind its transaction) says nothing about the keys it saw */
    if (rev <= w->rev)
        return;
    if (!strcmp(key, w->mine)) {
        w->mine_gone = 1;
        pthread_cond_signal(&w->cv);
        return;
    }
    for (size_t i = 0; i < w->nahead; i++) {
        if (!strcmp(w->ahead[i], key)) {
            free(w->ahead[i]);
            w->ahead[i] = w->ahead[--w->nahead];
            if (dlock__etcd_waiter_room(w))
                pthread_cond_signal(&w->cv);
            return;
        }
    }
}

/* One message of the stream. `created` (may be NULL): set to the
 * revision a new watch starts after. 0, or -1: the stream is of no more
 * use (an error, the watch canceled). es->mu not held. */
static int stream_msg(etcd_store *es, const char *text, size_t n,
                      int64_t *created)
{
    cJSON *j = cJSON_ParseWithLength(text, n);
    const cJSON *r = j ? jget(j, "result") : NULL, *ev;

    if (!r || cJSON_IsTrue(jget(r, "canceled"))) {
        cJSON_Delete(j);
        return -1;
    }
    if (cJSON_IsTrue(jget(r, "created")) && created) {
        *created = jint(jget(r, "header"), "revision");
        if (*created <= 0)
            *created = -1; /* no revision: of no use */
    }
    if (es) {
        int tell = 0;
        pthread_mutex_lock(&es->mu);
        cJSON_ArrayForEach(ev, jget(r, "events"))
        {
            const char *type = jstr(ev, "type");
            const char *key = jstr(jget(ev, "kv"), "key");
            int64_t rev = jint(jget(ev, "kv"), "mod_revision");
            if (!type || strcmp(type, "DELETE") != 0 || !key || rev <= 0)
                continue;
            for (etcd_waiter *w = es->waiters; w; w = w->next)
                waiter_deleted(w, key, rev);
            /* a key we hold (etcd_keys.c) */
            tell |= dlock__etcd_mine_deleted(es, key, rev);
        }
        pthread_mutex_unlock(&es->mu);
        if (tell)
            dlock__loop_wake(es->client); /* it tells the core */
    }
    cJSON_Delete(j);
    return 0;
}

typedef struct stream_ctx {
    etcd_store *es;
    int64_t created; /* 0 until the watch is created */
    int64_t deadline;
} stream_ctx;

static int stream_on_msg(void *arg, const char *p, size_t n)
{
    stream_ctx *sc = arg;
    return stream_msg(sc->es, p, n, &sc->created);
}

static int stream_pong(void *arg, const char *p, size_t n)
{
    stream_ctx *sc = arg;
    return ws_send(sc->es, WS_PONG, p, n, sc->deadline);
}

/* Reads what the socket has and handles it. 0, or -1: the stream
 * closed or failed. es->sio held. */
static int stream_read(etcd_store *es, stream_ctx *sc)
{
    char tmp[16384];

    for (;;) {
        size_t got = 0;
        CURLcode cc = curl_easy_recv(es->sh, tmp, sizeof(tmp), &got);
        if (cc == CURLE_AGAIN)
            return 0;
        if (cc != CURLE_OK || got == 0)
            return -1;
        if (dlock__buf_add(&es->sin, tmp, got) != 0)
            return -1;
        if (ws_frames(&es->sin, &es->smsg, stream_on_msg, stream_pong, sc) !=
            0)
            return -1;
    }
}

/* Closes the handle; es->sio held. */
static void stream_drop(etcd_store *es)
{
    if (es->sh)
        curl_easy_cleanup(es->sh);
    es->sh = NULL;
    es->sfd = CURL_SOCKET_BAD;
    dlock__buf_reset(&es->sin);
    dlock__buf_reset(&es->smsg);
}

/* The stream broke (or closes): every waiter that relies on it looks
 * again. es->sio held, es->mu not. */
static void stream_break(etcd_store *es)
{
    if (es->sfd != CURL_SOCKET_BAD)
        epoll_ctl(es->ep_fd, EPOLL_CTL_DEL, es->sfd, NULL);
    stream_drop(es);
    pthread_mutex_lock(&es->mu);
    es->sstate = ST_DOWN;
    for (etcd_waiter *w = es->waiters; w; w = w->next) {
        w->broken = 1;
        pthread_cond_signal(&w->cv);
    }
    pthread_cond_broadcast(&es->scv);
    pthread_mutex_unlock(&es->mu);
}

/* Connects to endpoint `ep`, upgrades to a WebSocket and creates the
 * watch; 0 with *since set, or -1 with `why` filled. es->sio held. */
static int stream_connect(etcd_store *es, size_t ep, int64_t deadline,
                          int64_t *since, char *why, size_t cap)
{
    char url[512], req[1024], key[32], kb[ETCD_B64_MAX], eb[ETCD_B64_MAX];
    char body[WS_SEND_MAX], errbuf[CURL_ERROR_SIZE] = "";
    unsigned char nonce[16];
    etcd_newfds nf;
    curl_socket_t sock = CURL_SOCKET_BAD;
    int64_t left = deadline - dlock__now_ms();
    CURLcode cc;

    if (left < 1)
        left = 1;
    if (!(es->sh = curl_easy_init())) {
        snprintf(why, cap, "out of memory");
        return -1;
    }
    snprintf(url, sizeof(url), "%s/v3/watch", es->ep[ep]);
    curl_easy_setopt(es->sh, CURLOPT_URL, url);
    dlock__etcd_no_inherit(es->sh, &nf);
    curl_easy_setopt(es->sh, CURLOPT_CONNECT_ONLY, 1L);
    /* HTTP/1.1 only, also in TLS's ALPN: the WebSocket upgrade below is
     * HTTP/1.1 written on the raw connection, and a connection libcurl
     * negotiated as HTTP/2 (etcds://: the gateway offers h2) hands
     * curl_easy_recv() to nghttp2, which crashed on what it read (found
     * by make test-busy: etcd.specific's TLS test, once its holder kept
     * a stream open) */
    curl_easy_setopt(es->sh, CURLOPT_HTTP_VERSION,
                     (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(es->sh, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(es->sh, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(es->sh, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(es->sh, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(es->sh, CURLOPT_CONNECTTIMEOUT_MS,
                     (long)(left < es->timeout_ms ? left : es->timeout_ms));
    if (es->cacert)
        curl_easy_setopt(es->sh, CURLOPT_CAINFO, es->cacert);
    if (es->cert)
        curl_easy_setopt(es->sh, CURLOPT_SSLCERT, es->cert);
    if (es->key)
        curl_easy_setopt(es->sh, CURLOPT_SSLKEY, es->key);
    cc = dlock__etcd_perform(es->sh, &nf);
    /* nf is this call's: the handle makes no connection after it */
    curl_easy_setopt(es->sh, CURLOPT_OPENSOCKETDATA, NULL);
    if (cc == CURLE_OK)
        cc = curl_easy_getinfo(es->sh, CURLINFO_ACTIVESOCKET, &sock);
    curl_easy_setopt(es->sh, CURLOPT_ERRORBUFFER, NULL);
    if (cc != CURLE_OK || sock == CURL_SOCKET_BAD) {
        snprintf(why, cap, "%s", errbuf[0] ? errbuf : curl_easy_strerror(cc));
        stream_drop(es);
        return -1;
    }
    es->sfd = sock;

    /* the upgrade; the token as for any request (the gateway reads the
     * Authorization header) */
    if (dlock__random(nonce, sizeof(nonce)) != 0)
        memset(nonce, 0x42, sizeof(nonce));
    dlock__etcd_b64_encode((const char *)nonce, sizeof(nonce), key);
    pthread_mutex_lock(&es->mu);
    int n = snprintf(req, sizeof(req),
                     "GET /v3/watch HTTP/1.1\r\nHost: %s\r\n"
                     "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n"
                     "%s%s%s\r\n",
                     strstr(es->ep[ep], "://") + 3, key,
                     es->token ? "Authorization: " : "",
                     es->token ? es->token : "", es->token ? "\r\n" : "");
    pthread_mutex_unlock(&es->mu);
    int bad = n < 0 || (size_t)n >= sizeof(req) ||
              stream_write(es, req, (size_t)n, deadline) != 0;
    dlock__wipe(req, sizeof(req));
    if (bad) {
        snprintf(why, cap, "sending the WebSocket upgrade failed");
        stream_drop(es);
        return -1;
    }
    /* the answer's head: "HTTP/1.1 101 ..." up to the blank line */
    dlock__buf_reset(&es->sin);
    dlock__buf_reset(&es->smsg);
    char *end = NULL;
    while (!end) {
        char tmp[4096];
        size_t got = 0;
        cc = curl_easy_recv(es->sh, tmp, sizeof(tmp), &got);
        if (cc == CURLE_AGAIN) {
            if (sock_wait(es->sfd, 0, deadline) == 0)
                continue;
            snprintf(why, cap, "no answer to the WebSocket upgrade");
        } else if (cc != CURLE_OK || got == 0 ||
                   dlock__buf_add(&es->sin, tmp, got) != 0 ||
                   es->sin.len > 65536) {
            snprintf(why, cap, "the WebSocket upgrade failed");
        } else {
            end = strstr(es->sin.p, "\r\n\r\n");
            continue;
        }
        stream_drop(es);
        return -1;
    }
    if (strncmp(es->sin.p, "HTTP/1.1 101", 12) != 0) {
        char *eol = strstr(es->sin.p, "\r\n");
        snprintf(why, cap, "the gateway refused a WebSocket on /v3/watch "
                           "(%.*s)",
                 (int)(eol ? eol - es->sin.p : 0), es->sin.p);
        stream_drop(es);
        return -1;
    }
    size_t head = (size_t)(end - es->sin.p) + 4;
    dlock__buf_drop(&es->sin, head);

    /* the watch: the whole prefix ("P/" up to "P0"; no prefix: every key
     * from "\0"), deletions only, from the current revision */
    if (es->prefix_len) {
        dlock__etcd_b64_encode(es->prefix, es->prefix_len, kb);
        dlock__etcd_range_end_b64(es->prefix, es->prefix_len, eb);
    } else {
        dlock__etcd_b64_encode("", 1, kb);
        dlock__etcd_b64_encode("", 1, eb);
    }
    n = snprintf(body, sizeof(body),
                 "{\"create_request\":{\"key\":\"%s\",\"range_end\":\"%s\","
                 "\"filters\":[\"NOPUT\"]}}",
                 kb, eb);
    if (ws_send(es, WS_TEXT, body, (size_t)n, deadline) != 0) {
        snprintf(why, cap, "sending the watch failed");
        stream_drop(es);
        return -1;
    }
    stream_ctx sc = {es, 0, deadline};
    for (;;) {
        if (ws_frames(&es->sin, &es->smsg, stream_on_msg, stream_pong,
                      &sc) != 0 ||
            sc.created < 0) {
            snprintf(why, cap, "the watch was refused");
            break;
        }
        if (sc.created > 0) {
            *since = sc.created;
            return 0;
        }
        if (sock_wait(es->sfd, 0, deadline) != 0) {
            snprintf(why, cap, "the watch was not created in time");
            break;
        }
        char tmp[4096];
        size_t got = 0;
        cc = curl_easy_recv(es->sh, tmp, sizeof(tmp), &got);
        if (cc == CURLE_AGAIN)
            continue;
        if (cc != CURLE_OK || got == 0 ||
            dlock__buf_add(&es->sin, tmp, got) != 0) {
            snprintf(why, cap, "the watch stream closed");
            break;
        }
    }
    stream_drop(es);
    return -1;
}

/* Makes sure the stream is up, opening it if need be (any endpoint, by
 * the deadline). DLOCK_OK with *gen its generation, or DLOCK_ECONN. */
int dlock__etcd_stream_up(etcd_store *es, int64_t deadline, uint64_t *gen)
{
    char why[CURL_ERROR_SIZE + 128] = "no endpoint answered";

    pthread_mutex_lock(&es->mu);
    for (;;) {
        if (es->sstate == ST_UP) {
            *gen = es->sgen;
            pthread_mutex_unlock(&es->mu);
            return DLOCK_OK;
        }
        if (es->sstate == ST_DOWN)
            break;
        /* another thread opens it: wait for its outcome */
        if (dlock__now_ms() >= deadline) {
            pthread_mutex_unlock(&es->mu);
            return dlock__err(DLOCK_ECONN, "etcd %s: opening the watch "
                                           "stream: no answer in time",
                              es->redacted);
        }
        dlock__cond_wait_until(&es->scv, &es->mu, deadline);
    }
    es->sstate = ST_OPENING;
    pthread_mutex_unlock(&es->mu);

    pthread_mutex_lock(&es->sio);
    int ok = -1;
    int64_t since = 0;
    for (size_t tries = 0; tries < 2 * es->nep; tries++) {
        pthread_mutex_lock(&es->mu);
        size_t ep = es->cur;
        pthread_mutex_unlock(&es->mu);
        ok = stream_connect(es, ep, deadline, &since, why, sizeof(why));
        if (ok == 0 || dlock__now_ms() >= deadline)
            break;
        pthread_mutex_lock(&es->mu);
        if (es->cur == ep)
            es->cur = (ep + 1) % es->nep;
        pthread_mutex_unlock(&es->mu);
    }
    if (ok == 0) {
        struct epoll_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.events = EPOLLIN;
        if (epoll_ctl(es->ep_fd, EPOLL_CTL_ADD, es->sfd, &ev) != 0) {
            snprintf(why, sizeof(why), "epoll: %s", strerror(errno));
            stream_drop(es);
            ok = -1;
        }
    }
    pthread_mutex_lock(&es->mu);
    if (ok == 0) {
        es->sstate = ST_UP;
        es->sgen++;
        es->s_since = since;
        es->s_idle = dlock__now_ms();
        *gen = es->sgen;
    } else {
        es->sstate = ST_DOWN;
    }
    pthread_cond_broadcast(&es->scv);
    pthread_mutex_unlock(&es->mu);
    pthread_mutex_unlock(&es->sio);
    if (ok != 0)
        return dlock__err(DLOCK_ECONN, "etcd %s: opening the watch stream: "
                                       "%s",
                          es->redacted, why);
    dlock__loop_wake(es->client); /* the client thread reads it now */
    return DLOCK_OK;
}

/* Reads the stream on the client thread; closes it after ETCD_IDLE_MS
 * without waiters or holds. */
void dlock__etcd_stream_loop(etcd_store *es)
{
    pthread_mutex_lock(&es->mu);
    int up = es->sstate == ST_UP;
    int idle = up && !es->waiters && !es->mine &&
               dlock__now_ms() - es->s_idle >= ETCD_IDLE_MS;
    pthread_mutex_unlock(&es->mu);
    if (!up)
        return;
    pthread_mutex_lock(&es->sio);
    stream_ctx sc = {es, 0, dlock__now_ms() + es->timeout_ms};
    if (es->sh && (idle || stream_read(es, &sc) != 0))
        stream_break(es);
    pthread_mutex_unlock(&es->sio);
}

/* Registers w (pending: deletions are logged until
 * dlock__etcd_waiter_fill()); es->mu held. */
void dlock__etcd_waiter_add(etcd_store *es, etcd_waiter *w, uint64_t gen)
{
    w->gen = gen;
    w->pending = 1;
    w->broken = w->mine_gone = 0;
    w->prev = NULL;
    w->next = es->waiters;
    if (es->waiters)
        es->waiters->prev = w;
    es->waiters = w;
}

static void waiter_clear(etcd_waiter *w)
{
    for (size_t i = 0; i < w->nahead; i++)
        free(w->ahead[i]);
    w->nahead = 0;
    for (size_t i = 0; i < w->nlog; i++)
        free(w->log[i].key);
    w->nlog = 0;
}

/* Unregisters w if registered; es->mu held. */
void dlock__etcd_waiter_del(etcd_store *es, etcd_waiter *w)
{
    if (!w->gen)
        return;
    if (w->prev)
        w->prev->next = w->next;
    else
        es->waiters = w->next;
    if (w->next)
        w->next->prev = w->prev;
    w->next = w->prev = NULL;
    w->gen = 0;
    waiter_clear(w);
    if (!es->waiters)
        es->s_idle = dlock__now_ms();
}

/* Starts a new look for a registered waiter: deletions are logged again.
 * es->mu held. */
static void waiter_relook(etcd_waiter *w)
{
    waiter_clear(w);
    w->pending = 1;
}

/* The waiter's transaction answered at revision `rev` with the keys ahead
 * (kvs[first..] of range `r`, more than those when `more`): the logged
 * deletions after `rev` apply. es->mu held. 0, or -1 out of memory. */
/* The last component of a key (base64) into out; its length or -1. */
static long last_part(const char *key_b64, char *out, size_t cap)
{
    char key[ETCD_KEY_MAX + 8];
    long n = key_b64 ? dlock__etcd_b64_decode(key_b64, key, sizeof(key) - 1)
                     : 0;

    if (n <= 0)
        return -1;
    key[n] = '\0';
    const char *last = strrchr(key, '/');
    last = last ? last + 1 : key;
    return (long)snprintf(out, cap, "%s", last);
}

long dlock__etcd_key_permits(const char *key_b64)
{
    char part[64], *end = NULL;

    if (last_part(key_b64, part, sizeof(part)) < 2 || part[0] != 's')
        return 0;
    long n = strtol(part + 1, &end, 10);
    return end && *end == '-' && n > 0 ? n : 0;
}

int dlock__etcd_waiter_room(const etcd_waiter *w)
{
    return w->permits ? w->nahead < w->permits : w->nahead == 0;
}

int dlock__etcd_key_is_reader(const char *key_b64)
{
    char key[ETCD_KEY_MAX + 8];
    long n = key_b64 ? dlock__etcd_b64_decode(key_b64, key, sizeof(key) - 1)
                     : 0;

    if (n <= 0)
        return 0;
    key[n] = '\0';
    const char *last = strrchr(key, '/');
    return last && last[1] == 'r';
}

int dlock__etcd_waiter_fill(etcd_waiter *w, const cJSON *r, int first,
                            int more, int64_t rev)
{
    int n = cJSON_GetArraySize(jget(r, "kvs"));

    for (size_t i = 0; i < w->nahead; i++)
        free(w->ahead[i]);
    w->nahead = 0;
    if (!w->ahead && !(w->ahead = calloc(ETCD_AHEAD_MAX, sizeof(char *))))
        return -1;
    for (int i = first; i < n && w->nahead < ETCD_AHEAD_MAX; i++) {
        const char *k = jstr(kvs_at(r, i), "key");
        if (!k || (w->reader && dlock__etcd_key_is_reader(k)))
            continue;
        long p = dlock__etcd_key_permits(k);
        if (p != (long)w->permits && !w->clash)
            w->clash = p ? p : -1;
        if (!(w->ahead[w->nahead] = strdup(k)))
            return -1;
        w->nahead++;
    }
    w->partial = more || n - first > ETCD_AHEAD_MAX;
    w->rev = rev;
    w->pending = 0;
    for (size_t i = 0; i < w->nlog; i++) {
        waiter_deleted(w, w->log[i].key, w->log[i].rev);
        free(w->log[i].key);
    }
    w->nlog = 0;
    return 0;
}

/* Reads the keys ahead of ours (a look) into waiter w, registered or
 * not: DLOCK_OK, 1 when our key is gone, or an error. */
int dlock__etcd_look(etcd_store *es, etcd_hold *eh, etcd_waiter *w,
                     const char *base, size_t base_len, int64_t deadline)
{
    char kb[ETCD_B64_MAX], bb[ETCD_B64_MAX], eb[ETCD_B64_MAX];
    char body[6 * ETCD_B64_MAX + 1024];
    cJSON *j = NULL;
    int rc;

    int64_t below = eh->rev - 1;

    dlock__etcd_b64_encode(eh->key, eh->key_len, kb);
    dlock__etcd_b64_encode(base, base_len, bb);
    dlock__etcd_range_end_b64(base, base_len, eb);
    /* a page of the keys just ahead of ours (nearest first); a reader
     * that found only readers there reads the page before it, and so on
     * (bounded: the queue is finite and each page goes further back).
     * Deletions are logged from before each page's request until its
     * answer is filled in, so none between the two is missed */
    for (int page = 0; page < 1000000; page++) {
        pthread_mutex_lock(&es->mu);
        waiter_relook(w);
        pthread_mutex_unlock(&es->mu);
        snprintf(body, sizeof(body),
                 "{\"success\":["
                 "{\"request_range\":{\"key\":\"%s\",\"keys_only\":true}},"
                 "{\"request_range\":{\"key\":\"%s\",\"range_end\":\"%s\","
                 "\"sort_order\":\"DESCEND\",\"sort_target\":\"CREATE\","
                 "\"limit\":\"%d\",\"max_create_revision\":\"%" PRId64 "\","
                 "\"keys_only\":true}}]}",
                 kb, bb, eb, ETCD_AHEAD_MAX, below);
        rc = dlock__etcd_request(es, "/v3/kv/txn", body, deadline, &j,
                                 "looking at the lock queue");
        if (rc != DLOCK_OK)
            return rc == ETCD_NOLEASE ? DLOCK_EPROTO : rc;
        const cJSON *mine = kvs_at(txn_resp(j, 0, "response_range"), 0);
        const cJSON *r = txn_resp(j, 1, "response_range");
        if (!mine || jint(mine, "create_revision") != eh->rev) {
            cJSON_Delete(j);
            return 1;
        }
        int n = cJSON_GetArraySize(jget(r, "kvs"));
        const cJSON *last = n > 0 ? kvs_at(r, n - 1) : NULL;
        pthread_mutex_lock(&es->mu);
        rc = dlock__etcd_waiter_fill(w, r, 0, (int)jint(r, "more"),
                                     jint(jget(j, "header"), "revision"));
        int further = rc == 0 && w->reader && w->nahead == 0 && w->partial &&
                      last && jint(last, "create_revision") > 1;
        pthread_mutex_unlock(&es->mu);
        if (further)
            below = jint(last, "create_revision") - 1;
        cJSON_Delete(j);
        if (rc != 0)
            return enomem();
        if (!further)
            break;
    }
    return DLOCK_OK;
}

/* Ends a wait: unregisters w and frees what it holds. */
void dlock__etcd_waiter_end(etcd_store *es, etcd_waiter *w)
{
    pthread_mutex_lock(&es->mu);
    dlock__etcd_waiter_del(es, w);
    waiter_clear(w);
    pthread_mutex_unlock(&es->mu);
    free(w->ahead);
    free(w->log);
    pthread_cond_destroy(&w->cv);
}
