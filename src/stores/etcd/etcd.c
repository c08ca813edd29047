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
 * Every request is an HTTP/1.1 POST with a deadline, on an easy handle from
 * the store's pool (each keeps its connection alive). A request that cannot
 * reach an endpoint, or that the member answers "unavailable", goes to the
 * next endpoint while time is left; every request dlock sends is
 * idempotent, so a retry is safe. The client thread reads the watch
 * stream and wakes the waiters a deletion concerns (one thread hop).
 */
#include "internal.h"

#include <cJSON.h>
#include <curl/curl.h>

#include <errno.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define ETCD_DEFAULT_PREFIX "dlock"
#define ETCD_PREFIX_MAX 256
#define ETCD_KEY_MAX (ETCD_PREFIX_MAX + 3 * DLOCK_NAME_MAX + 48)
#define ETCD_B64_MAX (4 * ((ETCD_KEY_MAX + 2) / 3) + 4)
#define ETCD_RESP_MAX (64u << 20) /* larger answers are refused */
#define ETCD_IDLE_MS 60000        /* an unused lease is revoked after this */
#define ETCD_ORPHAN_RETRY_MS 1000
#define ETCD_TTL_MAX_S 9000000000LL /* etcd's own maximum lease TTL */
#define ETCD_AHEAD_MAX 64 /* keys ahead of its own a waiter reads at once */

/* private results of request() besides the DLOCK_E* codes */
#define ETCD_NOLEASE 1 /* the server does not know the lease */

/* gRPC codes in the gateway's error answers */
enum { G_INVALID = 3, G_NOTFOUND = 5, G_PERMISSION = 7,
       G_FAILED_PRECONDITION = 9, G_UNAVAILABLE = 14, G_UNAUTHENTICATED = 16 };

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

struct etcd_store;

/* A waiter of this client (see "The watch stream" below). */
typedef struct etcd_del {
    int64_t rev;
    char *key; /* base64 */
} etcd_del;

typedef struct etcd_waiter {
    struct etcd_waiter *next, *prev;
    pthread_cond_t cv;
    const char *mine; /* our key, base64 */
    uint64_t gen;     /* the stream generation it relies on */
    int pending;      /* its revision is not known yet: deletions logged */
    int64_t rev;      /* deletions above this revision count */
    char **ahead;     /* keys ahead of ours, base64 */
    size_t nahead;
    int partial;      /* more keys ahead than `ahead` holds */
    int mine_gone;    /* our own key was deleted */
    int broken;       /* the stream broke or the lease died: look again */
    etcd_del *log;
    size_t nlog, caplog;
} etcd_waiter;

/* stream states */
enum { ST_DOWN, ST_OPENING, ST_UP };

typedef struct etcd_conn {
    CURL *h;
    buf resp;
    struct curl_slist *hdrs;
    uint64_t hdr_gen; /* the auth token generation hdrs carry */
    char errbuf[CURL_ERROR_SIZE];
    struct etcd_conn *next;
} etcd_conn;

typedef struct etcd_lease {
    int64_t id;
    int64_t want_s;     /* requested TTL (the lookup key) */
    int64_t ttl_ms;     /* granted TTL */
    int64_t last_ok;    /* when the last keepalive that worked was sent */
    int64_t next_ka;    /* when the next keepalive is due */
    int64_t idle_since; /* refs fell to 0 then */
    int refs;           /* holds and acquisitions using it */
    int own;            /* one DLOCK_NO_RENEW acquisition's own lease */
    int held;           /* own, and its lock acquired: no more keepalives
                         * once next_ka (INT64_MAX: done) has passed */
    atomic_int dead;    /* lost: no new users; revoked once unused */
    struct etcd_lease *next;
} etcd_lease;

/* A key this client uses (held, waited on, or waiting to be deleted). */
typedef struct etcd_slot {
    struct etcd_slot *next;
    uint64_t hash;
    size_t len;
    char key[];
} etcd_slot;

typedef struct etcd_orphan {
    int64_t next_try;
    size_t len;
    struct etcd_orphan *next;
    char key[];
} etcd_orphan;

typedef struct etcd_store {
    dlock_client *client;
    char **ep; /* "http://host:port" */
    size_t nep;
    char *redacted;
    char prefix[ETCD_PREFIX_MAX + 2]; /* "P/" or "" */
    size_t prefix_len;
    char *user, *password;
    char *cacert, *cert, *key;
    int64_t timeout_ms;
    int timer_fd;
    int offline; /* open failed: close talks to no server */
    int unreachable; /* the last request found no endpoint (es->mu) */
    int ep_fd;          /* epoll: timer_fd, and the stream when up */

    /* the watch stream: the handle and its buffers, one thread at a time
     * (the opener, then the client thread); lock order sio, then mu */
    pthread_mutex_t sio;
    CURL *sh;
    curl_socket_t sfd;
    buf sin;  /* bytes read, not parsed yet */
    buf smsg; /* the message being reassembled from its frames */

    pthread_mutex_t mu; /* everything below */
    size_t cur;         /* the endpoint tried first */
    char *token;        /* auth token, NULL without auth */
    uint64_t token_gen;
    etcd_conn *pool;
    etcd_lease *leases;
    etcd_slot **slots;
    size_t nbuckets, nslots;
    etcd_orphan *orphans;
    int sstate;          /* ST_* */
    uint64_t sgen;       /* + 1 at each open: waiters of an older one
                          * look again */
    int64_t s_since;     /* the watch sends every deletion after this
                          * revision */
    int64_t s_idle;      /* no waiter since then */
    pthread_cond_t scv;  /* sstate changed */
    etcd_waiter *waiters;
} etcd_store;

/* The backend's part of one dlock__lease. */
typedef struct etcd_hold {
    etcd_lease *lease; /* a reference while the key exists */
    int64_t rev;       /* our key's create revision */
    int waited;        /* the acquisition waited in the queue */
    size_t key_len;
    char key[ETCD_KEY_MAX];
} etcd_hold;

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static const char b64_chars[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Base64 (with padding) of n bytes into out (cap >= 4*ceil(n/3)+1). */
static size_t b64_encode(const char *in, size_t n, char *out)
{
    const unsigned char *s = (const unsigned char *)in;
    size_t o = 0, i = 0;

    for (; i + 2 < n; i += 3) {
        unsigned v = (unsigned)s[i] << 16 | (unsigned)s[i + 1] << 8 | s[i + 2];
        out[o++] = b64_chars[v >> 18 & 63];
        out[o++] = b64_chars[v >> 12 & 63];
        out[o++] = b64_chars[v >> 6 & 63];
        out[o++] = b64_chars[v & 63];
    }
    if (i < n) {
        unsigned v = (unsigned)s[i] << 16;
        if (i + 1 < n)
            v |= (unsigned)s[i + 1] << 8;
        out[o++] = b64_chars[v >> 18 & 63];
        out[o++] = b64_chars[v >> 12 & 63];
        out[o++] = i + 1 < n ? b64_chars[v >> 6 & 63] : '=';
        out[o++] = '=';
    }
    out[o] = '\0';
    return o;
}

static int b64_value(int c)
{
    const char *p = c ? strchr(b64_chars, c) : NULL;
    return p ? (int)(p - b64_chars) : -1;
}

/* Decodes base64 into out (at most cap-1 bytes, NUL-terminated); returns
 * the length, or -1 when the text is not base64. */
static long b64_decode(const char *in, char *out, size_t cap)
{
    size_t o = 0;
    unsigned v = 0;
    int bits = 0;

    for (; *in && *in != '='; in++) {
        int d = b64_value((unsigned char)*in);
        if (d < 0)
            return -1;
        v = (v << 6 | (unsigned)d) & 0xffffff;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o + 1 < cap)
                out[o++] = (char)(v >> bits & 0xff);
        }
    }
    out[o] = '\0';
    return (long)o;
}

/* An int64 field that the gateway sends as a string (or a number); 0 when
 * absent, as proto3 JSON omits zero values. */
static int64_t jint(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);

    if (cJSON_IsString(v))
        return strtoll(v->valuestring, NULL, 10);
    if (cJSON_IsNumber(v)) {
        /* any JSON number: converting one outside int64 would be UB */
        double d = v->valuedouble;
        return d >= 9223372036854775807.0    ? INT64_MAX
               : d <= -9223372036854775808.0 ? INT64_MIN
               : d == d                      ? (int64_t)d
                                             : 0;
    }
    if (cJSON_IsTrue(v))
        return 1;
    return 0;
}

static const char *jstr(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static const cJSON *jget(const cJSON *o, const char *name)
{
    return cJSON_GetObjectItemCaseSensitive(o, name);
}

/* responses[i].<kind> of a txn answer, or NULL. */
static const cJSON *txn_resp(const cJSON *txn, int i, const char *kind)
{
    const cJSON *r = cJSON_GetArrayItem(jget(txn, "responses"), i);
    return r ? jget(r, kind) : NULL;
}

static const cJSON *kvs_at(const cJSON *range, int i)
{
    return range ? cJSON_GetArrayItem(jget(range, "kvs"), i) : NULL;
}

static int buf_add(buf *b, const char *p, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1)
            cap *= 2;
        if (cap > ETCD_RESP_MAX)
            return -1;
        char *q = realloc(b->p, cap);
        if (!q)
            return -1;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

static int enomem(void)
{
    return dlock__err(DLOCK_ENOMEM, "out of memory");
}

/* ------------------------------------------------------------------------ */
/* Keys                                                                     */
/* ------------------------------------------------------------------------ */

/* The range of lock `name`: prefix + escaped name + "/". */
static size_t lock_base(const etcd_store *es, const char *name, size_t len,
                        char *out)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = es->prefix_len;

    memcpy(out, es->prefix, o);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (ch == '/' || ch == '%') {
            out[o++] = '%';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        } else {
            out[o++] = (char)ch;
        }
    }
    out[o++] = '/';
    out[o] = '\0';
    return o;
}

/* The range end of a base that ends with '/': the same with '0'. */
static void range_end_b64(const char *base, size_t len, char *out)
{
    char end[ETCD_KEY_MAX];

    memcpy(end, base, len);
    end[len - 1] = '0';
    b64_encode(end, len, out);
}

static int slots_grow(etcd_store *es)
{
    size_t n = es->nbuckets ? es->nbuckets * 2 : 64;
    etcd_slot **b = calloc(n, sizeof(*b));

    if (!b)
        return -1;
    for (size_t i = 0; i < es->nbuckets; i++) {
        etcd_slot *s = es->slots[i];
        while (s) {
            etcd_slot *next = s->next;
            s->next = b[s->hash & (n - 1)];
            b[s->hash & (n - 1)] = s;
            s = next;
        }
    }
    free(es->slots);
    es->slots = b;
    es->nbuckets = n;
    return 0;
}

/* Reserves `key`: 0 when it was free, 1 when in use, -1 out of memory.
 * es->mu held. */
static int slot_take(etcd_store *es, const char *key, size_t len)
{
    uint64_t h = dlock__hash(key, len);
    etcd_slot *s;

    if (es->nslots >= es->nbuckets && slots_grow(es) != 0)
        return -1;
    for (s = es->slots[h & (es->nbuckets - 1)]; s; s = s->next)
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len))
            return 1;
    s = malloc(sizeof(*s) + len);
    if (!s)
        return -1;
    s->hash = h;
    s->len = len;
    memcpy(s->key, key, len);
    s->next = es->slots[h & (es->nbuckets - 1)];
    es->slots[h & (es->nbuckets - 1)] = s;
    es->nslots++;
    return 0;
}

/* es->mu held. */
static void slot_drop(etcd_store *es, const char *key, size_t len)
{
    uint64_t h = dlock__hash(key, len);

    if (!es->nbuckets)
        return;
    for (etcd_slot **pp = &es->slots[h & (es->nbuckets - 1)]; *pp;
         pp = &(*pp)->next) {
        etcd_slot *s = *pp;
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len)) {
            *pp = s->next;
            free(s);
            es->nslots--;
            return;
        }
    }
}

/* Picks and reserves this acquisition's key: base + lease hex, then
 * "-1", "-2"... when another owner of this client uses it. */
static int pick_key(etcd_store *es, const dlock__lease *l, etcd_hold *eh)
{
    size_t n = lock_base(es, l->name, l->name_len, eh->key);
    size_t m = n + (size_t)sprintf(eh->key + n, "%" PRIx64,
                                   (uint64_t)eh->lease->id);

    pthread_mutex_lock(&es->mu);
    for (unsigned i = 0;; i++) {
        size_t len = m;
        if (i > 0)
            len += (size_t)sprintf(eh->key + m, "-%u", i);
        int r = slot_take(es, eh->key, len);
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

/* Makes the timer fire by `at` at the latest; es->mu held. */
static void arm_timer(etcd_store *es, int64_t at);

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
        arm_timer(es, o->next_try);
    } else {
        slot_drop(es, key, len); /* cannot remember it: the lease ends it */
    }
    pthread_mutex_unlock(&es->mu);
}

/* ------------------------------------------------------------------------ */
/* HTTP                                                                     */
/* ------------------------------------------------------------------------ */

static size_t on_write(char *p, size_t size, size_t n, void *arg)
{
    etcd_conn *cn = arg;

    if (buf_add(&cn->resp, p, size * n) != 0)
        return 0;
    return size * n;
}

static etcd_conn *conn_get(etcd_store *es)
{
    etcd_conn *cn;

    pthread_mutex_lock(&es->mu);
    cn = es->pool;
    if (cn)
        es->pool = cn->next;
    pthread_mutex_unlock(&es->mu);
    if (cn)
        return cn;
    cn = calloc(1, sizeof(*cn));
    if (!cn || !(cn->h = curl_easy_init())) {
        free(cn);
        return NULL;
    }
    CURL *h = cn->h;
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, cn);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cn->errbuf);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    if (es->cacert)
        curl_easy_setopt(h, CURLOPT_CAINFO, es->cacert);
    if (es->cert)
        curl_easy_setopt(h, CURLOPT_SSLCERT, es->cert);
    if (es->key)
        curl_easy_setopt(h, CURLOPT_SSLKEY, es->key);
    cn->hdr_gen = UINT64_MAX;
    return cn;
}

static void conn_free(etcd_conn *cn)
{
    curl_easy_cleanup(cn->h);
    curl_slist_free_all(cn->hdrs);
    free(cn->resp.p);
    free(cn);
}

static void conn_put(etcd_store *es, etcd_conn *cn)
{
    if (cn->resp.cap > 65536) { /* do not keep a huge answer's memory */
        free(cn->resp.p);
        memset(&cn->resp, 0, sizeof(cn->resp));
    }
    pthread_mutex_lock(&es->mu);
    cn->next = es->pool;
    es->pool = cn;
    pthread_mutex_unlock(&es->mu);
}

/* (Re)builds the connection's headers when the auth token changed. */
static int conn_headers(etcd_store *es, etcd_conn *cn, int with_token)
{
    uint64_t gen = with_token ? es->token_gen : 0;
    struct curl_slist *h = NULL, *t;

    if (cn->hdrs && cn->hdr_gen == gen)
        return 0;
    t = curl_slist_append(NULL, "Content-Type: application/json");
    if (t)
        h = t, t = curl_slist_append(h, "Expect:");
    pthread_mutex_lock(&es->mu);
    if (t && with_token && es->token) {
        size_t n = strlen(es->token) + 32;
        char *line = malloc(n);
        if (line) {
            snprintf(line, n, "Authorization: %s", es->token);
            t = curl_slist_append(h, line);
            dlock__wipe(line, n);
            free(line);
        } else {
            t = NULL;
        }
    }
    gen = with_token ? es->token_gen : 0;
    pthread_mutex_unlock(&es->mu);
    if (!t) {
        curl_slist_free_all(h);
        return -1;
    }
    curl_slist_free_all(cn->hdrs);
    cn->hdrs = h;
    cn->hdr_gen = gen;
    return 0;
}

/* One POST to one endpoint. *status = HTTP status, 0 when no answer. */
static CURLcode post_once(etcd_store *es, etcd_conn *cn, size_t ep,
                          const char *path, const char *body,
                          int64_t deadline, long *status)
{
    char url[512];
    int64_t left = deadline - dlock__now_ms();
    CURLcode cc;

    snprintf(url, sizeof(url), "%s%s", es->ep[ep], path);
    cn->resp.n = 0;
    if (cn->resp.p)
        cn->resp.p[0] = '\0';
    cn->errbuf[0] = '\0';
    *status = 0;
    curl_easy_setopt(cn->h, CURLOPT_URL, url);
    curl_easy_setopt(cn->h, CURLOPT_HTTPHEADER, cn->hdrs);
    curl_easy_setopt(cn->h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(cn->h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    curl_easy_setopt(cn->h, CURLOPT_NOPROGRESS, 1L);
    if (deadline == DLOCK__FOREVER) {
        curl_easy_setopt(cn->h, CURLOPT_TIMEOUT_MS, 0L);
        curl_easy_setopt(cn->h, CURLOPT_CONNECTTIMEOUT_MS,
                         (long)es->timeout_ms);
    } else {
        if (left < 1)
            left = 1;
        curl_easy_setopt(cn->h, CURLOPT_TIMEOUT_MS, (long)left);
        curl_easy_setopt(cn->h, CURLOPT_CONNECTTIMEOUT_MS,
                         (long)(left < es->timeout_ms ? left
                                                      : es->timeout_ms));
    }
    cc = curl_easy_perform(cn->h);
    if (cc == CURLE_OK)
        curl_easy_getinfo(cn->h, CURLINFO_RESPONSE_CODE, status);
    return cc;
}

static int authenticate(etcd_store *es, etcd_conn *cn, int64_t deadline);

/* TLS failures that a retry cannot mend (certificates, protocol). */
static int tls_refused(CURLcode cc)
{
    return cc == CURLE_PEER_FAILED_VERIFICATION ||
           cc == CURLE_SSL_CACERT_BADFILE || cc == CURLE_SSL_CERTPROBLEM ||
           cc == CURLE_SSL_CONNECT_ERROR || cc == CURLE_SSL_CIPHER ||
           cc == CURLE_SSL_ISSUER_ERROR || cc == CURLE_SSL_CRL_BADFILE;
}

/*
 * POSTs `body` to `path` and parses the answer into *out (freed by the
 * caller with cJSON_Delete). Tries every endpoint while time is left.
 * Returns DLOCK_OK, ETCD_NOLEASE, or an error with a message about `what`.
 */
static int request(etcd_store *es, const char *path, const char *body,
                   int64_t deadline, cJSON **out, const char *what)
{
    etcd_conn *cn = conn_get(es);
    int rc = DLOCK_ECONN, reauthed = 0;
    char why[CURL_ERROR_SIZE + 64] = "no endpoint answered";

    *out = NULL;
    if (!cn)
        return enomem();
    for (unsigned tries = 0;; tries++) {
        size_t ep;
        long status;

        pthread_mutex_lock(&es->mu);
        ep = es->cur;
        pthread_mutex_unlock(&es->mu);
        if (conn_headers(es, cn, 1) != 0) {
            rc = enomem();
            break;
        }
        CURLcode cc = post_once(es, cn, ep, path, body, deadline, &status);
        int next = 0;
        if (cc != CURLE_OK) {
            snprintf(why, sizeof(why), "%s",
                     cn->errbuf[0] ? cn->errbuf : curl_easy_strerror(cc));
            next = 1;
            /* a certificate refused is not a member that is down: trying
             * again will not help; give every endpoint one chance */
            if (tls_refused(cc) && tries + 1 >= es->nep) {
                rc = dlock__err(DLOCK_ECONN, "etcd %s: %s: %s", es->redacted,
                                what, why);
                break;
            }
        } else {
            cJSON *j = cJSON_ParseWithLength(cn->resp.p ? cn->resp.p : "",
                                             cn->resp.n);
            if (status == 200 && j && !jget(j, "error")) {
                *out = j;
                rc = DLOCK_OK;
                break;
            }
            const char *msg = j ? jstr(j, "error") : NULL;
            int64_t code = j ? jint(j, "code") : 0;
            snprintf(why, sizeof(why), "%s",
                     msg ? msg : (cn->resp.n ? "an answer that is not JSON"
                                             : "an empty answer"));
            if (!j && status != 200)
                snprintf(why, sizeof(why), "HTTP status %ld", status);
            cJSON_Delete(j);
            msg = msg ? why : NULL; /* j is gone; why holds its copy */
            if (msg && strstr(msg, "lease not found")) {
                rc = ETCD_NOLEASE;
                break;
            }
            if (msg && strstr(msg, "invalid auth token") && es->user &&
                !reauthed) {
                reauthed = 1;
                rc = authenticate(es, cn, deadline);
                if (rc != DLOCK_OK)
                    break;
                tries--;
                continue;
            }
            if (code == G_UNAUTHENTICATED || code == G_PERMISSION ||
                (msg && (strstr(msg, "permission denied") ||
                         strstr(msg, "user name is empty") ||
                         strstr(msg, "authentication failed")))) {
                rc = dlock__err(DLOCK_EAUTH, "etcd %s: %s: %s", es->redacted,
                                what, why);
                break;
            }
            if (code == G_UNAVAILABLE || status >= 500 || !msg) {
                next = 1; /* no leader, timed out, ... */
            } else {
                rc = dlock__err(DLOCK_EPROTO, "etcd %s: %s: %s",
                                es->redacted, what, why);
                break;
            }
        }
        if (next) {
            int64_t now = dlock__now_ms();
            if (now >= deadline || tries >= 2 * es->nep + 8) {
                rc = dlock__err(DLOCK_ECONN, "etcd %s: %s: %s", es->redacted,
                                what, why);
                break;
            }
            pthread_mutex_lock(&es->mu);
            if (es->cur == ep)
                es->cur = (ep + 1) % es->nep;
            pthread_mutex_unlock(&es->mu);
            /* every endpoint failed once: pause before the next round */
            if ((tries + 1) % es->nep == 0) {
                int64_t pause = deadline - now < 50 ? deadline - now : 50;
                struct timespec ts = {0, (long)pause * 1000000L};
                nanosleep(&ts, NULL);
            }
        }
    }
    pthread_mutex_lock(&es->mu);
    es->unreachable = rc == DLOCK_ECONN;
    pthread_mutex_unlock(&es->mu);
    conn_put(es, cn);
    return rc;
}

/* Gets a new auth token (the password is sent, never logged). */
static int authenticate(etcd_store *es, etcd_conn *cn, int64_t deadline)
{
    cJSON *req = cJSON_CreateObject();
    char *body = NULL, why[CURL_ERROR_SIZE + 64] = "no endpoint answered";
    int rc = DLOCK_ECONN;

    if (!req || !cJSON_AddStringToObject(req, "name", es->user) ||
        !cJSON_AddStringToObject(req, "password", es->password) ||
        !(body = cJSON_PrintUnformatted(req))) {
        cJSON_Delete(req);
        return enomem();
    }
    cJSON_Delete(req);
    if (conn_headers(es, cn, 0) != 0) {
        dlock__wipe(body, strlen(body));
        free(body);
        return enomem();
    }
    for (size_t i = 0; i < 2 * es->nep && dlock__now_ms() < deadline; i++) {
        size_t ep;
        long status;
        pthread_mutex_lock(&es->mu);
        ep = es->cur;
        pthread_mutex_unlock(&es->mu);
        CURLcode cc = post_once(es, cn, ep, "/v3/auth/authenticate", body,
                                deadline, &status);
        if (cc == CURLE_OK) {
            cJSON *j = cJSON_ParseWithLength(cn->resp.p ? cn->resp.p : "",
                                             cn->resp.n);
            const char *tok = j ? jstr(j, "token") : NULL;
            const char *msg = j ? jstr(j, "error") : NULL;
            int64_t code = j ? jint(j, "code") : 0;
            if (status == 200 && tok) {
                char *t = strdup(tok);
                if (!t) {
                    rc = enomem();
                } else {
                    pthread_mutex_lock(&es->mu);
                    if (es->token) {
                        dlock__wipe(es->token, strlen(es->token));
                        free(es->token);
                    }
                    es->token = t;
                    es->token_gen++;
                    pthread_mutex_unlock(&es->mu);
                    rc = DLOCK_OK;
                }
                cJSON_Delete(j);
                break;
            }
            snprintf(why, sizeof(why), "%s",
                     msg ? msg : "an answer without a token");
            cJSON_Delete(j);
            if (code != G_UNAVAILABLE && status < 500) {
                rc = dlock__err(code == G_FAILED_PRECONDITION ? DLOCK_EPROTO
                                                              : DLOCK_EAUTH,
                                "etcd %s: authenticating as '%s': %s",
                                es->redacted, es->user, why);
                break;
            }
        } else {
            snprintf(why, sizeof(why), "%s",
                     cn->errbuf[0] ? cn->errbuf : curl_easy_strerror(cc));
            if (tls_refused(cc) && i + 1 >= es->nep)
                break;
        }
        pthread_mutex_lock(&es->mu);
        if (es->cur == ep)
            es->cur = (ep + 1) % es->nep;
        pthread_mutex_unlock(&es->mu);
    }
    dlock__wipe(body, strlen(body));
    free(body);
    if (rc == DLOCK_ECONN)
        rc = dlock__err(DLOCK_ECONN, "etcd %s: authenticating: %s",
                        es->redacted, why);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Leases                                                                   */
/* ------------------------------------------------------------------------ */

/* Until when the lease's holds are certainly alive: 2/3 of the TTL after
 * the last keepalive that worked was sent (the last third is margin, see
 * docs/stores.md); an own lease that is no longer kept alive, until just
 * before its end (the core's margin for leases, ttl/100 + 2 ms). es->mu
 * held. */
static int64_t lease_limit(const etcd_lease *el)
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
static void lease_lost(etcd_store *es, etcd_lease *el, const char *why)
{
    pthread_mutex_lock(&es->mu);
    int was = el->dead;
    el->dead = 1;
    for (etcd_waiter *w = es->waiters; w; w = w->next)
        pthread_cond_signal(&w->cv); /* those on this lease start again */
    pthread_mutex_unlock(&es->mu);
    if (!was)
        dlock__notify_lost(es->client, match_lease, el, why);
}

/* A live lease of `want_s` seconds with a reference, granting one when
 * there is none; `own`: always a new one, for one DLOCK_NO_RENEW
 * acquisition alone. */
static etcd_lease *lease_get(etcd_store *es, int64_t want_s, int own,
                             int64_t deadline, int *rc)
{
    etcd_lease *el;
    cJSON *j = NULL;
    char body[64];
    int64_t sent;

    pthread_mutex_lock(&es->mu);
    for (el = own ? NULL : es->leases; el; el = el->next) {
        if (!el->dead && !el->own && el->want_s == want_s &&
            dlock__now_ms() < lease_limit(el)) {
            el->refs++;
            pthread_mutex_unlock(&es->mu);
            return el;
        }
    }
    pthread_mutex_unlock(&es->mu);

    snprintf(body, sizeof(body), "{\"TTL\":\"%" PRId64 "\"}", want_s);
    sent = dlock__now_ms();
    *rc = request(es, "/v3/lease/grant", body, deadline, &j,
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
    arm_timer(es, el->next_ka);
    pthread_mutex_unlock(&es->mu);
    return el;
}

static void lease_put(etcd_store *es, etcd_lease *el)
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
static int keepalive(etcd_store *es, etcd_lease *el, int64_t deadline)
{
    char body[64];
    cJSON *j = NULL;
    int64_t sent = dlock__now_ms();
    int rc;

    snprintf(body, sizeof(body), "{\"ID\":\"%" PRId64 "\"}", el->id);
    rc = request(es, "/v3/lease/keepalive", body, deadline, &j,
                 "keeping the lease alive");
    if (rc != DLOCK_OK)
        return rc;
    int64_t ttl = jint(jget(j, "result"), "TTL");
    cJSON_Delete(j);
    if (ttl <= 0)
        return ETCD_NOLEASE;
    pthread_mutex_lock(&es->mu);
    if (sent > el->last_ok)
        el->last_ok = sent;
    el->next_ka = el->held ? INT64_MAX : sent + el->ttl_ms / 3;
    pthread_mutex_unlock(&es->mu);
    return DLOCK_OK;
}

static int lease_revoke(etcd_store *es, int64_t id, int64_t deadline)
{
    char body[64];
    cJSON *j = NULL;
    int rc;

    snprintf(body, sizeof(body), "{\"ID\":\"%" PRId64 "\"}", id);
    rc = request(es, "/v3/lease/revoke", body, deadline, &j,
                 "revoking a lease");
    cJSON_Delete(j);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Acquire, release, extend                                                 */
/* ------------------------------------------------------------------------ */

/* Deletes our key (waiter giving up, or a failed acquisition); on failure
 * the background thread retries. Drops the reservation and the lease. */
static void give_up_key(etcd_store *es, etcd_hold *eh)
{
    char kb[ETCD_B64_MAX], body[ETCD_B64_MAX + 32];
    cJSON *j = NULL;

    b64_encode(eh->key, eh->key_len, kb);
    snprintf(body, sizeof(body), "{\"key\":\"%s\"}", kb);
    if (request(es, "/v3/kv/deleterange", body,
                dlock__now_ms() + es->timeout_ms, &j,
                "deleting a waiter's key") == DLOCK_OK) {
        cJSON_Delete(j);
        pthread_mutex_lock(&es->mu);
        slot_drop(es, eh->key, eh->key_len);
        pthread_mutex_unlock(&es->mu);
    } else {
        orphan_add(es, eh->key, eh->key_len);
    }
    lease_put(es, eh->lease);
    eh->lease = NULL;
}

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

/* One masked frame (a client's frames must be). es->sio held. */
static int ws_send(etcd_store *es, int op, const char *p, size_t n,
                   int64_t deadline)
{
    unsigned char hdr[14], mask[4];
    size_t h = 0;
    char *f;
    int rc;

    hdr[h++] = (unsigned char)(0x80 | op);
    if (n < 126) {
        hdr[h++] = (unsigned char)(0x80 | n);
    } else if (n < 65536) {
        hdr[h++] = 0x80 | 126;
        hdr[h++] = (unsigned char)(n >> 8);
        hdr[h++] = (unsigned char)n;
    } else {
        hdr[h++] = 0x80 | 127;
        for (int i = 7; i >= 0; i--)
            hdr[h++] = (unsigned char)((uint64_t)n >> (8 * i));
    }
    if (dlock__random(mask, sizeof(mask)) != 0)
        memset(mask, 0x5a, sizeof(mask)); /* masking is not a secret */
    memcpy(hdr + h, mask, 4);
    h += 4;
    f = malloc(h + n);
    if (!f)
        return -1;
    memcpy(f, hdr, h);
    for (size_t i = 0; i < n; i++)
        f[h + i] = (char)(p[i] ^ mask[i & 3]);
    rc = stream_write(es, f, h + n, deadline);
    free(f);
    return rc;
}

/*
 * Takes the complete frames at the start of *in: a message's text goes
 * to *msg (a message may come in several frames) and, once whole, to
 * on_msg(arg, text, len), which returns -1 to stop. A ping is answered
 * through pong(arg, ...) when given. Returns 0 (more bytes needed), or -1:
 * a close frame, a protocol error, or on_msg said stop. No socket: the
 * fuzz target runs it on any bytes.
 */
static int ws_frames(buf *in, buf *msg,
                     int (*on_msg)(void *arg, const char *p, size_t n),
                     int (*pong)(void *arg, const char *p, size_t n),
                     void *arg)
{
    size_t off = 0;
    int rc = 0;

    for (;;) {
        const unsigned char *b = (const unsigned char *)in->p + off;
        size_t have = in->n - off, h = 2;
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
        if (buf_add(msg, p, (size_t)len) != 0) {
            rc = -1;
            break;
        }
        if (!fin)
            continue;
        rc = on_msg(arg, msg->p, msg->n);
        msg->n = 0;
        if (rc != 0)
            break;
    }
    /* keep what is left (an incomplete frame) at the start */
    if (off > 0) {
        memmove(in->p, in->p + off, in->n - off);
        in->n -= off;
        in->p[in->n] = '\0';
    }
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
            if (w->nahead == 0)
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
        }
        pthread_mutex_unlock(&es->mu);
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
        if (buf_add(&es->sin, tmp, got) != 0)
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
    es->sin.n = es->smsg.n = 0;
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
    char body[2 * ETCD_B64_MAX + 128], errbuf[CURL_ERROR_SIZE] = "";
    unsigned char nonce[16];
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
    curl_easy_setopt(es->sh, CURLOPT_CONNECT_ONLY, 1L);
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
    cc = curl_easy_perform(es->sh);
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
    b64_encode((const char *)nonce, sizeof(nonce), key);
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
    es->sin.n = es->smsg.n = 0;
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
                   buf_add(&es->sin, tmp, got) != 0 || es->sin.n > 65536) {
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
    memmove(es->sin.p, es->sin.p + head, es->sin.n - head);
    es->sin.n -= head;

    /* the watch: the whole prefix ("P/" up to "P0"; no prefix: every key
     * from "\0"), deletions only, from the current revision */
    if (es->prefix_len) {
        b64_encode(es->prefix, es->prefix_len, kb);
        range_end_b64(es->prefix, es->prefix_len, eb);
    } else {
        b64_encode("", 1, kb);
        b64_encode("", 1, eb);
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
        if (cc != CURLE_OK || got == 0 || buf_add(&es->sin, tmp, got) != 0) {
            snprintf(why, cap, "the watch stream closed");
            break;
        }
    }
    stream_drop(es);
    return -1;
}

/* Makes sure the stream is up, opening it if need be (any endpoint, by
 * the deadline). DLOCK_OK with *gen its generation, or DLOCK_ECONN. */
static int stream_up(etcd_store *es, int64_t deadline, uint64_t *gen)
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
 * without waiters. */
static void stream_loop(etcd_store *es)
{
    pthread_mutex_lock(&es->mu);
    int up = es->sstate == ST_UP;
    int idle = up && !es->waiters &&
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

/* Registers w (pending: deletions are logged until waiter_fill()); es->mu
 * held. */
static void waiter_add(etcd_store *es, etcd_waiter *w, uint64_t gen)
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
static void waiter_del(etcd_store *es, etcd_waiter *w)
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
static int waiter_fill(etcd_waiter *w, const cJSON *r, int first, int more,
                       int64_t rev)
{
    int n = cJSON_GetArraySize(jget(r, "kvs"));

    for (size_t i = 0; i < w->nahead; i++)
        free(w->ahead[i]);
    w->nahead = 0;
    if (!w->ahead && !(w->ahead = calloc(ETCD_AHEAD_MAX, sizeof(char *))))
        return -1;
    for (int i = first; i < n && w->nahead < ETCD_AHEAD_MAX; i++) {
        const char *k = jstr(kvs_at(r, i), "key");
        if (!k)
            continue;
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
static int look(etcd_store *es, etcd_hold *eh, etcd_waiter *w,
                const char *base, size_t base_len, int64_t deadline)
{
    char kb[ETCD_B64_MAX], bb[ETCD_B64_MAX], eb[ETCD_B64_MAX];
    char body[6 * ETCD_B64_MAX + 1024];
    cJSON *j = NULL;
    int rc;

    b64_encode(eh->key, eh->key_len, kb);
    b64_encode(base, base_len, bb);
    range_end_b64(base, base_len, eb);
    snprintf(body, sizeof(body),
             "{\"success\":["
             "{\"request_range\":{\"key\":\"%s\",\"keys_only\":true}},"
             "{\"request_range\":{\"key\":\"%s\",\"range_end\":\"%s\","
             "\"sort_order\":\"DESCEND\",\"sort_target\":\"CREATE\","
             "\"limit\":\"%d\",\"max_create_revision\":\"%" PRId64 "\","
             "\"keys_only\":true}}]}",
             kb, bb, eb, ETCD_AHEAD_MAX, eh->rev - 1);
    pthread_mutex_lock(&es->mu);
    waiter_relook(w);
    pthread_mutex_unlock(&es->mu);
    rc = request(es, "/v3/kv/txn", body, deadline, &j,
                 "looking at the lock queue");
    if (rc != DLOCK_OK)
        return rc == ETCD_NOLEASE ? DLOCK_EPROTO : rc;
    const cJSON *mine = kvs_at(txn_resp(j, 0, "response_range"), 0);
    const cJSON *r = txn_resp(j, 1, "response_range");
    if (!mine || jint(mine, "create_revision") != eh->rev) {
        cJSON_Delete(j);
        return 1;
    }
    pthread_mutex_lock(&es->mu);
    rc = waiter_fill(w, r, 0, (int)jint(r, "more"),
                     jint(jget(j, "header"), "revision"));
    pthread_mutex_unlock(&es->mu);
    cJSON_Delete(j);
    return rc == 0 ? DLOCK_OK : enomem();
}

/* Ends a wait: unregisters w and frees what it holds. */
static void waiter_end(etcd_store *es, etcd_waiter *w)
{
    pthread_mutex_lock(&es->mu);
    waiter_del(es, w);
    waiter_clear(w);
    pthread_mutex_unlock(&es->mu);
    free(w->ahead);
    free(w->log);
    pthread_cond_destroy(&w->cv);
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
    size_t base_len = lock_base(es, l->name, l->name_len, base);
    etcd_waiter w;
    cJSON *j = NULL;
    int rc, vlen, need_look = 0;
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
    b64_encode(val, (size_t)vlen, vb);
    b64_encode(eh->key, eh->key_len, kb);
    b64_encode(base, base_len, bb);
    range_end_b64(base, base_len, eb);
    w.mine = kb;
    /* the stream is up: register first, so that no deletion after our
     * transaction can be missed */
    pthread_mutex_lock(&es->mu);
    if (may_wait && es->sstate == ST_UP)
        waiter_add(es, &w, es->sgen);
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
    rc = request(es, "/v3/kv/txn", body, dlock__now_ms() + op_ms, &j,
                 "putting the lock key");
    if (rc == ETCD_NOLEASE) {
        waiter_end(es, &w);
        lease_lost(es, eh->lease, "etcd: the server no longer knows the "
                                  "client's lease");
        give_up_key(es, eh);
        return 1;
    }
    if (rc != DLOCK_OK) {
        waiter_end(es, &w);
        give_up_key(es, eh); /* the put may have happened */
        return rc;
    }
    if (cJSON_IsTrue(jget(j, "succeeded"))) {
        const cJSON *r = txn_resp(j, 1, "response_range");
        const cJSON *me = kvs_at(r, 0);
        eh->rev = me ? jint(me, "create_revision") : 0;
        if (!me || !jstr(me, "key") || strcmp(jstr(me, "key"), kb) != 0 ||
            eh->rev <= 0) {
            cJSON_Delete(j);
            waiter_end(es, &w);
            give_up_key(es, eh);
            return dlock__err(DLOCK_EPROTO, "etcd %s: the lock transaction's "
                                            "answer lacks our key",
                              es->redacted);
        }
        pthread_mutex_lock(&es->mu);
        rc = waiter_fill(&w, r, 1, (int)jint(r, "more"),
                         jint(jget(j, "header"), "revision"));
        pthread_mutex_unlock(&es->mu);
        cJSON_Delete(j);
        if (rc != 0) {
            waiter_end(es, &w);
            give_up_key(es, eh);
            return enomem();
        }
        /* no stream yet: what happened since our answer is unknown */
        need_look = may_wait && !w.gen && (w.nahead || w.partial);
    } else {
        /* our key is there already: an earlier try whose answer was lost */
        const cJSON *me = kvs_at(txn_resp(j, 0, "response_range"), 0);
        eh->rev = me ? jint(me, "create_revision") : 0;
        cJSON_Delete(j);
        if (eh->rev <= 0) {
            waiter_end(es, &w);
            give_up_key(es, eh);
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
        if (need_look && (w.gen || !may_wait || now >= l->deadline)) {
            rc = look(es, eh, &w, base, base_len,
                      may_wait ? dl : now + op_ms);
            need_look = 0;
            if (rc == 1) {
                int dead = eh->lease->dead;
                waiter_end(es, &w);
                give_up_key(es, eh);
                if (dead)
                    return 1;
                return dlock__err(DLOCK_EPROTO, "etcd %s: our lock key "
                                                "vanished (deleted by someone "
                                                "else?)",
                                  es->redacted);
            }
            if (rc != DLOCK_OK) {
                waiter_end(es, &w);
                give_up_key(es, eh);
                if (may_wait && dlock__now_ms() >= l->deadline) {
                    l->retry_ms = -1;
                    return DLOCK_EBUSY; /* it answered "held" before */
                }
                return rc;
            }
        }
        pthread_mutex_lock(&es->mu);
        int holds = !w.pending && w.nahead == 0 && !w.partial;
        /* the keys ahead went while this process could not keep the lease
         * alive (stopped, starved): the stream tells what happened up to a
         * revision, not that our key outlived it; past the lease's safe
         * life our key may be gone and the lock someone else's, so the
         * lease is lost, not the lock won (found by the safety suite's
         * waiter-stop: a waiter SIGSTOPped past its lease, woken by the
         * release that preceded its key's expiry) */
        int stale = holds && eh->waited && !eh->lease->dead &&
                    dlock__now_ms() >= lease_limit(eh->lease);
        pthread_mutex_unlock(&es->mu);
        if (stale) {
            lease_lost(es, eh->lease, "etcd: the client's lease could not "
                                      "be kept alive (the process did not "
                                      "run for its safe life)");
            waiter_end(es, &w);
            give_up_key(es, eh);
            return 1;
        }
        if (holds && !need_look) {
            waiter_end(es, &w);
            l->token = (uint64_t)eh->rev;
            return DLOCK_OK;
        }
        if (!may_wait || dlock__now_ms() >= l->deadline) {
            waiter_end(es, &w);
            give_up_key(es, eh);
            l->retry_ms = -1;
            return DLOCK_EBUSY;
        }
        eh->waited = 1;
        if (!w.gen || need_look) {
            /* arm: the stream first, then look (no missed deletion) */
            uint64_t gen = 0;
            rc = stream_up(es, dl, &gen);
            if (rc != DLOCK_OK) {
                waiter_end(es, &w);
                give_up_key(es, eh);
                if (dlock__now_ms() >= l->deadline) {
                    l->retry_ms = -1;
                    return DLOCK_EBUSY;
                }
                return rc;
            }
            pthread_mutex_lock(&es->mu);
            waiter_del(es, &w);
            waiter_add(es, &w, gen);
            pthread_mutex_unlock(&es->mu);
            need_look = 1;
            continue;
        }
        /* wait for the keys ahead to go */
        pthread_mutex_lock(&es->mu);
        while (!w.broken && !w.mine_gone && !eh->lease->dead &&
               !(w.nahead == 0 && !w.pending) &&
               dlock__now_ms() < l->deadline)
            dlock__cond_wait_until(&w.cv, &es->mu, l->deadline);
        int broken = w.broken, gone = w.mine_gone;
        int emptied = w.nahead == 0 && !w.pending;
        int partial = w.partial;
        pthread_mutex_unlock(&es->mu);
        if (eh->lease->dead) {
            waiter_end(es, &w);
            give_up_key(es, eh);
            return 1;
        }
        if (gone) {
            need_look = 1; /* a look says for sure (and ends the wait) */
            continue;
        }
        if (emptied && !partial)
            continue; /* holds (checked above) */
        if (emptied || broken) {
            if (broken) {
                pthread_mutex_lock(&es->mu);
                waiter_del(es, &w); /* re-armed above */
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
    int rc = DLOCK_ECONN;

    if (op_ms < 1)
        op_ms = 1;
    for (int attempt = 0; attempt < 3; attempt++) {
        eh->lease = lease_get(es, ttl_seconds(l->ttl_ms),
                              (l->flags & DLOCK_NO_RENEW) != 0,
                              dlock__now_ms() + op_ms, &rc);
        eh->waited = 0;
        if (!eh->lease)
            return rc;
        rc = pick_key(es, l, eh);
        if (rc != DLOCK_OK) {
            lease_put(es, eh->lease);
            eh->lease = NULL;
            return rc;
        }
        rc = acquire_on(es, l, eh, op_ms);
        if (rc == DLOCK_OK && eh->lease->own) {
            /* DLOCK_NO_RENEW: nobody keeps the lease alive from now on,
             * but once more at once when the wait took a while, so that
             * the hold lasts a whole ttl from its acquisition */
            etcd_lease *el = eh->lease;
            pthread_mutex_lock(&es->mu);
            el->held = 1;
            el->next_ka = eh->waited ? dlock__now_ms() : INT64_MAX;
            arm_timer(es, eh->waited ? el->next_ka : lease_limit(el));
            pthread_mutex_unlock(&es->mu);
            if (eh->waited)
                dlock__loop_wake(es->client);
        }
        if (rc != 1)
            return rc;
        rc = dlock__err(DLOCK_ECONN, "etcd %s: the lease ended while "
                                     "acquiring", es->redacted);
        if (dlock__now_ms() >= l->deadline && l->deadline != DLOCK__FOREVER)
            break;
    }
    return rc;
}

/* Ends a hold's reservation and lease reference. */
static void hold_done(etcd_store *es, etcd_hold *eh, int deleted)
{
    if (deleted) {
        pthread_mutex_lock(&es->mu);
        slot_drop(es, eh->key, eh->key_len);
        pthread_mutex_unlock(&es->mu);
    } else {
        orphan_add(es, eh->key, eh->key_len);
    }
    lease_put(es, eh->lease);
    eh->lease = NULL;
}

static int etcd_release(void *st, dlock__lease *l, int64_t op_deadline)
{
    etcd_store *es = st;
    etcd_hold *eh = l->priv;
    char kb[ETCD_B64_MAX], body[2 * ETCD_B64_MAX + 256];
    cJSON *j = NULL;
    int rc;

    if (!eh->lease)
        return dlock__err(DLOCK_ENOTHELD, "etcd %s: not held", es->redacted);
    b64_encode(eh->key, eh->key_len, kb);
    snprintf(body, sizeof(body),
             "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\","
             "\"create_revision\":\"%" PRId64 "\"}],"
             "\"success\":[{\"request_delete_range\":{\"key\":\"%s\"}}]}",
             kb, eh->rev, kb);
    rc = request(es, "/v3/kv/txn", body, op_deadline, &j,
                 "deleting the lock key");
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
    b64_encode(eh->key, eh->key_len, kb);
    if (ttl_seconds(ttl_ms) == el->want_s) {
        rc = keepalive(es, el, op_deadline);
        if (rc == ETCD_NOLEASE) {
            lease_lost(es, el, "etcd: the server no longer knows the "
                               "client's lease");
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
        to = lease_get(es, ttl_seconds(ttl_ms), el->own, op_deadline, &rc);
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
    rc = request(es, "/v3/kv/txn", body, op_deadline, &j,
                 "checking the lock key");
    if (rc != DLOCK_OK) {
        if (to)
            lease_put(es, to);
        return rc == ETCD_NOLEASE ? DLOCK_ECONN : rc;
    }
    int ours = cJSON_IsTrue(jget(j, "succeeded"));
    cJSON_Delete(j);
    if (!ours) {
        if (to)
            lease_put(es, to);
        return dlock__err(DLOCK_ENOTHELD, "etcd %s: the lock key is gone",
                          es->redacted);
    }
    if (to) {
        eh->lease = to;
        lease_put(es, el);
    }
    return DLOCK_OK;
}

/* ------------------------------------------------------------------------ */
/* Inspection                                                               */
/* ------------------------------------------------------------------------ */

/* A key's description: the value's second line (dlock), or who else. */
static void describe(const cJSON *kv, char *out, size_t cap)
{
    const char *v = jstr(kv, "value");
    char val[1024];

    out[0] = '\0';
    if (v && b64_decode(v, val, sizeof(val)) > 0) {
        const char *nl = strchr(val, '\n'), *d = nl ? nl + 1 : val;
        size_t n = strnlen(d, cap - 1); /* cut to fit, on purpose */
        memcpy(out, d, n);
        out[n] = '\0';
    }
    if (!out[0])
        snprintf(out, cap, "etcd lease %" PRIx64 " (not dlock)",
                 (uint64_t)jint(kv, "lease"));
}

/* Reads the range answer of inspect (the lock's keys in queue order) into
 * *out; *lease is the holder key's lease (0: none). */
static int inspect_answer(const cJSON *j, dlock_info *out, int64_t *lease)
{
    const cJSON *kv = kvs_at(j, 0);
    size_t n = 0;

    out->ttl_ms = -1;
    out->held_ms = -1;
    out->waiters = 0;
    *lease = 0;
    if (!kv)
        return DLOCK_OK;
    out->held = 1;
    out->token = (uint64_t)jint(kv, "create_revision");
    describe(kv, out->holder, sizeof(out->holder));
    int64_t count = jint(j, "count");
    out->waiters = count >= 1 ? count - 1 : -1; /* no count: cannot tell */
    int nk = cJSON_GetArraySize(jget(j, "kvs"));
    if (nk > 1) {
        out->queue = calloc((size_t)nk - 1, sizeof(char *));
        if (!out->queue)
            return enomem();
        for (int i = 1; i < nk; i++) {
            char d[256];
            describe(kvs_at(j, i), d, sizeof(d));
            if (!(out->queue[n] = strdup(d))) {
                out->queue_len = n;
                return enomem();
            }
            n++;
        }
        out->queue_len = n;
    }
    *lease = jint(kv, "lease");
    return DLOCK_OK;
}

static int etcd_inspect(void *st, const char *name, size_t len,
                        dlock_info *out, int64_t op_deadline)
{
    etcd_store *es = st;
    char base[ETCD_KEY_MAX], bb[ETCD_B64_MAX], eb[ETCD_B64_MAX];
    char body[2 * ETCD_B64_MAX + 256];
    size_t base_len = lock_base(es, name, len, base);
    cJSON *j = NULL;
    int64_t lease;
    int rc;

    b64_encode(base, base_len, bb);
    range_end_b64(base, base_len, eb);
    snprintf(body, sizeof(body),
             "{\"key\":\"%s\",\"range_end\":\"%s\",\"sort_order\":"
             "\"ASCEND\",\"sort_target\":\"CREATE\",\"limit\":\"10001\"}",
             bb, eb);
    rc = request(es, "/v3/kv/range", body, op_deadline, &j,
                 "reading the lock queue");
    if (rc != DLOCK_OK)
        return rc == ETCD_NOLEASE ? DLOCK_EPROTO : rc;
    rc = inspect_answer(j, out, &lease);
    cJSON_Delete(j);
    if (rc != DLOCK_OK)
        return rc;
    if (lease) {
        char lb[64];
        snprintf(lb, sizeof(lb), "{\"ID\":\"%" PRId64 "\"}", lease);
        if (request(es, "/v3/lease/timetolive", lb, op_deadline, &j,
                    "reading the holder's lease") == DLOCK_OK) {
            int64_t ttl = jint(j, "TTL");
            out->ttl_ms = ttl > 0 && ttl <= ETCD_TTL_MAX_S ? ttl * 1000 : -1;
            cJSON_Delete(j);
        }
    }
    return DLOCK_OK;
}

/* ------------------------------------------------------------------------ */
/* The background thread: keepalives, orphans, idle leases                  */
/* ------------------------------------------------------------------------ */

static void arm_timer(etcd_store *es, int64_t at)
{
    struct itimerspec its, cur;
    int64_t in = at - dlock__now_ms();

    if (in < 1)
        in = 1;
    if (timerfd_gettime(es->timer_fd, &cur) == 0 &&
        (cur.it_value.tv_sec || cur.it_value.tv_nsec) &&
        cur.it_value.tv_sec * 1000 + cur.it_value.tv_nsec / 1000000 <= in)
        return; /* it fires earlier anyway */
    memset(&its, 0, sizeof(its));
    its.it_value.tv_sec = in / 1000;
    its.it_value.tv_nsec = (in % 1000) * 1000000L;
    timerfd_settime(es->timer_fd, 0, &its, NULL);
}

static int etcd_loop_fd(void *st)
{
    return ((etcd_store *)st)->ep_fd;
}

#define LOOP_BATCH 64

static void etcd_loop_run(void *st, int readable)
{
    etcd_store *es = st;
    uint64_t ticks;
    etcd_lease *due[LOOP_BATCH];
    int64_t now = dlock__now_ms(), next = now + 60000;
    size_t nd = 0;

    (void)readable; /* both fds are non-blocking: look at each */
    if (read(es->timer_fd, &ticks, sizeof(ticks)) < 0)
        (void)errno;
    stream_loop(es);

    /* 1. leases past their safe life are lost; due ones get a keepalive */
    pthread_mutex_lock(&es->mu);
    for (etcd_lease *el = es->leases; el; el = el->next) {
        if (el->dead)
            continue;
        if (now >= lease_limit(el)) {
            int ran_out = el->held && el->next_ka == INT64_MAX;
            pthread_mutex_unlock(&es->mu);
            lease_lost(es, el, ran_out
                                   ? "etcd: the hold's own lease ran out "
                                     "(DLOCK_NO_RENEW)"
                                   : "etcd: the client's lease could not "
                                     "be kept alive (no endpoint answered "
                                     "in time)");
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
        int64_t limit = lease_limit(el);
        pthread_mutex_unlock(&es->mu);
        int64_t dl = dlock__now_ms() + es->timeout_ms;
        if (dl > limit)
            dl = limit;
        int rc = keepalive(es, el, dl);
        if (rc == ETCD_NOLEASE) {
            lease_lost(es, el, "etcd: the client's lease expired or was "
                               "revoked");
        } else if (rc != DLOCK_OK) {
            /* an own lease's one keepalive after its acquisition, too:
             * tried again until it works or the lease ends */
            pthread_mutex_lock(&es->mu);
            el->next_ka = dlock__now_ms() + el->ttl_ms / 12 + 10;
            pthread_mutex_unlock(&es->mu);
        }
    }

    /* 2. keys to delete */
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
        b64_encode(o->key, o->len, kb);
        snprintf(body, sizeof(body), "{\"key\":\"%s\"}", kb);
        int rc = request(es, "/v3/kv/deleterange", body,
                         dlock__now_ms() + es->timeout_ms, &j,
                         "deleting a left-over key");
        cJSON_Delete(j);
        pthread_mutex_lock(&es->mu);
        if (rc == DLOCK_OK || rc == DLOCK_EAUTH) {
            slot_drop(es, o->key, o->len);
            free(o);
        } else {
            o->next_try = dlock__now_ms() + ETCD_ORPHAN_RETRY_MS;
            o->next = es->orphans;
            es->orphans = o;
        }
        pthread_mutex_unlock(&es->mu);
    }

    /* 3. unused leases: dead ones and long idle ones are revoked */
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
            lease_revoke(es, gone->id, dlock__now_ms() + es->timeout_ms);
        free(gone);
    }

    /* 4. the next wake-up */
    pthread_mutex_lock(&es->mu);
    for (etcd_lease *el = es->leases; el; el = el->next) {
        if (el->refs == 0 && el->idle_since + ETCD_IDLE_MS < next)
            next = el->idle_since + ETCD_IDLE_MS;
        if (el->dead)
            continue;
        if (el->next_ka < next)
            next = el->next_ka;
        if (lease_limit(el) < next)
            next = lease_limit(el);
    }
    for (etcd_orphan *o = es->orphans; o; o = o->next)
        if (o->next_try < next)
            next = o->next_try;
    if (es->sstate == ST_UP && !es->waiters &&
        es->s_idle + ETCD_IDLE_MS < next)
        next = es->s_idle + ETCD_IDLE_MS;
    /* the timer may hold a later time than `next` from before: reset it.
     * Under es->mu, so that a lease added since is armed after this. */
    struct itimerspec off;
    memset(&off, 0, sizeof(off));
    timerfd_settime(es->timer_fd, 0, &off, NULL);
    arm_timer(es, next);
    pthread_mutex_unlock(&es->mu);
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
        if (lease_revoke(es, el->id, dlock__now_ms() + es->timeout_ms) ==
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
    while (es->pool) {
        etcd_conn *cn = es->pool;
        es->pool = cn->next;
        conn_free(cn);
    }
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
    free(es->sin.p);
    free(es->smsg.p);
    if (es->ep_fd >= 0)
        close(es->ep_fd);
    if (es->timer_fd >= 0)
        close(es->timer_fd);
    pthread_cond_destroy(&es->scv);
    pthread_mutex_destroy(&es->sio);
    pthread_mutex_destroy(&es->mu);
    free(es);
    curl_global_cleanup();
}

static int dup_param(const dlock__uri *u, const char *k, char **out)
{
    const char *v = dlock__uri_param(u, k);

    if (!v)
        return 0;
    if (!v[0])
        return dlock__err(DLOCK_EINVAL, "etcd URI %s: '%s' needs a file name",
                          u->redacted, k);
    *out = strdup(v);
    return *out ? 0 : enomem();
}

static int parse_config(etcd_store *es, const dlock__uri *u)
{
    static const char *const plain[] = {"prefix", "timeout", NULL};
    static const char *const tls[] = {"prefix", "timeout", "cacert", "cert",
                                      "key", NULL};
    int is_tls = !strcmp(u->scheme, "etcds");
    const char *prefix = dlock__uri_param(u, "prefix");
    const char *timeout = dlock__uri_param(u, "timeout");
    int rc;

    rc = dlock__uri_check_params(u, is_tls ? tls : plain);
    if (rc)
        return rc;
    if (u->nhosts == 0)
        return dlock__err(DLOCK_EINVAL, "etcd URI %s: no host (%s://host:port"
                                        "[,host:port...][?prefix=P])",
                          u->redacted, u->scheme);
    if (u->path[0] && strcmp(u->path, "/") != 0)
        return dlock__err(DLOCK_EINVAL, "etcd URI %s: no path expected (the "
                                        "key prefix is ?prefix=P)",
                          u->redacted);
    if (u->user && !u->password)
        return dlock__err(DLOCK_EINVAL, "etcd URI %s: auth needs "
                                        "user:password", u->redacted);
    if (u->user && !u->user[0])
        return dlock__err(DLOCK_EINVAL, "etcd URI %s: empty user name",
                          u->redacted);
    if (!prefix)
        prefix = ETCD_DEFAULT_PREFIX;
    if (strlen(prefix) > ETCD_PREFIX_MAX)
        return dlock__err(DLOCK_EINVAL, "etcd URI %s: the prefix is longer "
                                        "than %d bytes",
                          u->redacted, ETCD_PREFIX_MAX);
    es->prefix_len = (size_t)snprintf(es->prefix, sizeof(es->prefix), "%s%s",
                                      prefix, prefix[0] ? "/" : "");
    if (timeout) {
        long long v;
        if (dlock__parse_int(timeout, 3600000, &v) != 0 || v == 0)
            return dlock__err(DLOCK_EINVAL, "etcd URI %s: timeout must be "
                                            "milliseconds (1..3600000), not "
                                            "'%s'",
                              u->redacted, timeout);
        es->timeout_ms = v;
    }
    if (is_tls && ((rc = dup_param(u, "cacert", &es->cacert)) ||
                   (rc = dup_param(u, "cert", &es->cert)) ||
                   (rc = dup_param(u, "key", &es->key))))
        return rc;
    if (!!es->cert != !!es->key)
        return dlock__err(DLOCK_EINVAL, "etcd URI %s: cert and key go "
                                        "together", u->redacted);
    es->ep = calloc(u->nhosts, sizeof(char *));
    if (!es->ep)
        return enomem();
    for (size_t i = 0; i < u->nhosts; i++) {
        size_t n = strlen(u->hosts[i].host) + 32;
        int v6 = strchr(u->hosts[i].host, ':') != NULL;
        if (!(es->ep[i] = malloc(n)))
            return enomem();
        es->nep++;
        snprintf(es->ep[i], n, "%s://%s%s%s:%d", is_tls ? "https" : "http",
                 v6 ? "[" : "", u->hosts[i].host, v6 ? "]" : "",
                 u->hosts[i].port ? u->hosts[i].port : 2379);
    }
    if (u->user && (!(es->user = strdup(u->user)) ||
                    !(es->password = strdup(u->password))))
        return enomem();
    return DLOCK_OK;
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
    if (dlock__cond_init(&es->scv) != DLOCK_OK) {
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
    rc = parse_config(es, u);
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
        etcd_conn *cn = conn_get(es);
        rc = cn ? authenticate(es, cn, deadline) : enomem();
        if (cn)
            conn_put(es, cn);
    }
    if (rc == DLOCK_OK) {
        char pb[ETCD_B64_MAX], body[ETCD_B64_MAX + 64];
        cJSON *j = NULL;
        if (es->prefix_len)
            b64_encode(es->prefix, es->prefix_len, pb);
        else
            b64_encode("", 1, pb);
        snprintf(body, sizeof(body), "{\"key\":\"%s\",\"count_only\":true}",
                 pb);
        rc = request(es, "/v3/kv/range", body, deadline, &j,
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

const dlock__backend dlock__backend_etcd = {
    "etcd",                 /* name */
    DLOCK__CAP_NATIVE_WAIT, /* caps */
    sizeof(etcd_hold),      /* lease_size */
    etcd_open,              /* open */
    etcd_close,             /* close */
    etcd_acquire,           /* acquire */
    NULL,                   /* arm */
    NULL,                   /* disarm */
    etcd_release,           /* release */
    etcd_extend,            /* extend */
    etcd_inspect,           /* inspect */
    etcd_loop_fd,           /* loop_fd */
    etcd_loop_run,          /* loop_run */
    NULL,                   /* gc */
    NULL, /* select */
    NULL, /* margin */
    NULL, /* abandon */
    NULL, /* extend_many */
};
