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
 *    watches only the key created just before its own (no herd) for its
 *    deletion, then looks again. Fencing token: the holder key's create
 *    revision (every write to the cluster raises the revision).
 *  - One acquire is one round trip: the same transaction that puts the key
 *    reads the two newest keys of the range and their count, which tells
 *    whether we hold the lock, or whom to watch and whether that one holds
 *    it (second in line: its deletion makes us the holder, no second look).
 *  - Liveness is the lease: one lease per client and distinct TTL (ttl_ms
 *    rounded up to seconds; the server may raise it to its minimum), kept
 *    alive by the client's background thread every TTL/3. A lease the
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
 * idempotent, so a retry is safe. A waiting thread reads its own watch
 * stream: a release wakes it without passing through another thread.
 */
#include "../core/internal.h"

#include <cJSON.h>
#include <curl/curl.h>

#include <errno.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* A waiter's watch on the key before its own. The watch starts at the
 * member's current revision: etcd sends a watch that starts at an older
 * revision nothing until its catch-up loop runs (every 100 ms), and the
 * same happens to a new watch when a write lands while the member creates
 * it -- most often the very deletion we wait for. So once the watch is
 * created, a range on another connection looks at the key (`checked`):
 * gone, or created anew, is a deletion; still there, the watch (created
 * before that range) will see it go. */
typedef struct watch_state {
    const char *key_b64; /* the watched key, base64 as etcd sends it */
    size_t done;         /* bytes of the buffer already parsed */
    int created;
    int deleted;         /* the key's deletion arrived */
    int canceled;        /* the server ended the watch: look again */
    atomic_int *dead;    /* the waiter's lease died: abort */
    int64_t key_rev;     /* its create revision; 0: unknown */
    int owed;            /* the watch was created: a look is owed */
    int checked;         /* ... and was done */
    struct etcd_store *es; /* for that look; NULL: none (the fuzz target) */
} watch_state;

typedef struct etcd_conn {
    CURL *h;
    buf resp;
    watch_state *ws;
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

    pthread_mutex_t mu; /* everything below */
    size_t cur;         /* the endpoint tried first */
    char *token;        /* auth token, NULL without auth */
    uint64_t token_gen;
    etcd_conn *pool;
    etcd_lease *leases;
    etcd_slot **slots;
    size_t nbuckets, nslots;
    etcd_orphan *orphans;
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

/* Parses the complete lines of a watch stream; returns 1 to stop. */
static int watch_scan(watch_state *ws, buf *b)
{
    for (;;) {
        char *start = b->p + ws->done;
        char *nl = memchr(start, '\n', b->n - ws->done);
        if (!nl)
            return 0;
        *nl = '\0';
        ws->done = (size_t)(nl - b->p) + 1;
        cJSON *j = cJSON_Parse(start);
        const cJSON *r = j ? jget(j, "result") : NULL;
        if (!r) {
            cJSON_Delete(j);
            ws->canceled = 1; /* an error in the stream: look again */
            return 1;
        }
        if (cJSON_IsTrue(jget(r, "created"))) {
            ws->created = 1;
            ws->owed = 1;
        }
        if (cJSON_IsTrue(jget(r, "canceled")))
            ws->canceled = 1;
        const cJSON *ev;
        cJSON_ArrayForEach(ev, jget(r, "events"))
        {
            const char *type = jstr(ev, "type");
            const char *key = jstr(jget(ev, "kv"), "key");
            if (type && !strcmp(type, "DELETE") && key &&
                !strcmp(key, ws->key_b64))
                ws->deleted = 1;
        }
        cJSON_Delete(j);
        if (ws->deleted || ws->canceled)
            return 1;
        /* keep the buffer small on a long watch */
        if (ws->done == b->n) {
            b->n = ws->done = 0;
            b->p[0] = '\0';
        }
    }
}

static void watch_check(watch_state *ws);

static size_t on_write(char *p, size_t size, size_t n, void *arg)
{
    etcd_conn *cn = arg;

    if (buf_add(&cn->resp, p, size * n) != 0)
        return 0;
    if (cn->ws && watch_scan(cn->ws, &cn->resp))
        return 0; /* the event we waited for: end the transfer */
    if (cn->ws && cn->ws->owed && !cn->ws->checked && cn->ws->es) {
        watch_check(cn->ws);
        if (cn->ws->deleted || cn->ws->canceled)
            return 0;
    }
    return size * n;
}

static int on_progress(void *arg, curl_off_t a, curl_off_t b, curl_off_t c,
                       curl_off_t d)
{
    etcd_conn *cn = arg;

    (void)a, (void)b, (void)c, (void)d;
    return cn->ws && cn->ws->dead && *cn->ws->dead;
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
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, cn);
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
    cn->ws = NULL;
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
    curl_easy_setopt(cn->h, CURLOPT_NOPROGRESS, cn->ws ? 0L : 1L);
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

/* Once a watch is created (see watch_state): is its key still the one we
 * saw? Asked on another connection, from inside the watch's transfer
 * (another easy handle: libcurl allows that in a callback). Absent or
 * created anew: deleted; no answer: look again. */
static void watch_check(watch_state *ws)
{
    char body[ETCD_B64_MAX + 64];
    cJSON *j = NULL;

    ws->checked = 1;
    snprintf(body, sizeof(body), "{\"key\":\"%s\",\"keys_only\":true}",
             ws->key_b64);
    if (request(ws->es, "/v3/kv/range", body,
                dlock__now_ms() + ws->es->timeout_ms, &j,
                "looking at the key before ours") != DLOCK_OK) {
        dlock__err_clear();
        ws->canceled = 1;
        return;
    }
    const cJSON *kv = kvs_at(j, 0);
    if (!kv || (ws->key_rev && jint(kv, "create_revision") != ws->key_rev))
        ws->deleted = 1;
    cJSON_Delete(j);
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

/* Where a waiter stands: pred_b64 empty = we hold it. */
typedef struct place {
    int64_t revision; /* the store revision the answer reflects */
    int64_t pred_rev; /* pred's create revision */
    int second;       /* pred is the holder */
    char pred_b64[ETCD_B64_MAX];
} place;

/* Looks at the queue below our key: returns DLOCK_OK with *p filled, 1
 * when our key is gone, or an error. */
static int look(etcd_store *es, etcd_hold *eh, const char *base,
                size_t base_len, place *p, int64_t deadline)
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
             "\"limit\":\"1\",\"max_create_revision\":\"%" PRId64 "\","
             "\"keys_only\":true}},"
             "{\"request_range\":{\"key\":\"%s\",\"range_end\":\"%s\","
             "\"sort_order\":\"ASCEND\",\"sort_target\":\"CREATE\","
             "\"limit\":\"1\",\"keys_only\":true}}]}",
             kb, bb, eb, eh->rev - 1, bb, eb);
    rc = request(es, "/v3/kv/txn", body, deadline, &j,
                 "looking at the lock queue");
    if (rc != DLOCK_OK)
        return rc == ETCD_NOLEASE ? DLOCK_EPROTO : rc;
    const cJSON *mine = kvs_at(txn_resp(j, 0, "response_range"), 0);
    const cJSON *pred = kvs_at(txn_resp(j, 1, "response_range"), 0);
    const cJSON *head = kvs_at(txn_resp(j, 2, "response_range"), 0);
    p->revision = jint(jget(j, "header"), "revision");
    if (!mine || jint(mine, "create_revision") != eh->rev) {
        cJSON_Delete(j);
        return 1;
    }
    p->pred_b64[0] = '\0';
    p->pred_rev = 0;
    p->second = 0;
    if (pred && jstr(pred, "key")) {
        snprintf(p->pred_b64, sizeof(p->pred_b64), "%s", jstr(pred, "key"));
        p->pred_rev = jint(pred, "create_revision");
        p->second = head && jstr(head, "key") &&
                    !strcmp(jstr(head, "key"), p->pred_b64);
    }
    cJSON_Delete(j);
    return DLOCK_OK;
}

/* Waits until the key pred_b64 is deleted after revision `rev`, the
 * deadline, or the lease's death. 0 deleted, 4 look again (the stream
 * broke or the server ended the watch: nothing is known), 2 deadline,
 * 3 lease died, or an error. */
static int watch_pred(etcd_store *es, etcd_hold *eh, const place *p,
                      int64_t deadline)
{
    char body[ETCD_B64_MAX + 128];
    watch_state ws;
    etcd_conn *cn = conn_get(es);
    int rc = 0;

    if (!cn)
        return enomem();
    memset(&ws, 0, sizeof(ws));
    ws.key_b64 = p->pred_b64;
    ws.dead = &eh->lease->dead;
    ws.key_rev = p->pred_rev;
    ws.es = es;
    /* from the current revision: see watch_state */
    snprintf(body, sizeof(body), "{\"create_request\":{\"key\":\"%s\"}}",
             p->pred_b64);
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
        cn->ws = &ws;
        ws.done = 0;
        ws.created = ws.owed = ws.checked = 0;
        CURLcode cc = post_once(es, cn, ep, "/v3/watch", body, deadline,
                                &status);
        cn->ws = NULL;
        if (ws.deleted) {
            rc = 0;
            break;
        }
        if (ws.canceled) {
            rc = 4;
            break;
        }
        if (eh->lease->dead) {
            rc = 3;
            break;
        }
        if (dlock__now_ms() >= deadline && deadline != DLOCK__FOREVER) {
            rc = 2;
            break;
        }
        if (cc == CURLE_OK && status != 200) {
            /* e.g. an auth token that expired: a fresh look decides */
            rc = 4;
            break;
        }
        /* the stream broke (member down?): look again at once if the watch
         * had been running, else try the next endpoint first. Never take
         * a broken stream for the predecessor's deletion. */
        if (ws.created) {
            rc = 4;
            break;
        }
        if (tries >= 2 * es->nep) {
            rc = dlock__err(DLOCK_ECONN, "etcd %s: watching the lock: %s",
                            es->redacted,
                            cn->errbuf[0] ? cn->errbuf
                                          : curl_easy_strerror(cc));
            break;
        }
        pthread_mutex_lock(&es->mu);
        if (es->cur == ep)
            es->cur = (ep + 1) % es->nep;
        pthread_mutex_unlock(&es->mu);
    }
    conn_put(es, cn);
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
    size_t base_len = lock_base(es, l->name, l->name_len, base);
    place p;
    cJSON *j = NULL;
    int rc, vlen;

    vlen = snprintf(val, sizeof(val), "%s\n%s", l->owner, l->desc);
    if (vlen >= (int)sizeof(val))
        vlen = (int)sizeof(val) - 1;
    b64_encode(val, (size_t)vlen, vb);
    b64_encode(eh->key, eh->key_len, kb);
    b64_encode(base, base_len, bb);
    range_end_b64(base, base_len, eb);
    snprintf(body, sizeof(body),
             "{\"compare\":[{\"target\":\"CREATE\",\"key\":\"%s\","
             "\"create_revision\":\"0\"}],"
             "\"success\":["
             "{\"request_put\":{\"key\":\"%s\",\"value\":\"%s\","
             "\"lease\":\"%" PRId64 "\"}},"
             "{\"request_range\":{\"key\":\"%s\",\"range_end\":\"%s\","
             "\"sort_order\":\"DESCEND\",\"sort_target\":\"CREATE\","
             "\"limit\":\"2\",\"keys_only\":true}}],"
             "\"failure\":[{\"request_range\":{\"key\":\"%s\","
             "\"keys_only\":true}}]}",
             kb, kb, vb, eh->lease->id, bb, eb, kb);
    rc = request(es, "/v3/kv/txn", body, dlock__now_ms() + op_ms, &j,
                 "putting the lock key");
    if (rc == ETCD_NOLEASE) {
        lease_lost(es, eh->lease, "etcd: the server no longer knows the "
                                  "client's lease");
        give_up_key(es, eh);
        return 1;
    }
    if (rc != DLOCK_OK) {
        give_up_key(es, eh); /* the put may have happened */
        return rc;
    }
    if (cJSON_IsTrue(jget(j, "succeeded"))) {
        const cJSON *r = txn_resp(j, 1, "response_range");
        const cJSON *me = kvs_at(r, 0), *pred = kvs_at(r, 1);
        int64_t count = jint(r, "count");
        eh->rev = me ? jint(me, "create_revision") : 0;
        if (!me || !jstr(me, "key") || strcmp(jstr(me, "key"), kb) != 0 ||
            eh->rev <= 0) {
            cJSON_Delete(j);
            give_up_key(es, eh);
            return dlock__err(DLOCK_EPROTO, "etcd %s: the lock transaction's "
                                            "answer lacks our key",
                              es->redacted);
        }
        p.revision = jint(jget(j, "header"), "revision");
        p.pred_b64[0] = '\0';
        p.pred_rev = 0;
        p.second = count == 2;
        if (count > 1 && pred && jstr(pred, "key")) {
            snprintf(p.pred_b64, sizeof(p.pred_b64), "%s", jstr(pred, "key"));
            p.pred_rev = jint(pred, "create_revision");
        }
        cJSON_Delete(j);
    } else {
        /* our key is there already: an earlier try whose answer was lost */
        const cJSON *me = kvs_at(txn_resp(j, 0, "response_range"), 0);
        eh->rev = me ? jint(me, "create_revision") : 0;
        cJSON_Delete(j);
        if (eh->rev <= 0) {
            give_up_key(es, eh);
            return dlock__err(DLOCK_EPROTO, "etcd %s: the lock transaction "
                                            "failed but found no key",
                              es->redacted);
        }
        rc = look(es, eh, base, base_len, &p, dlock__now_ms() + op_ms);
        if (rc != DLOCK_OK) {
            give_up_key(es, eh);
            return rc == 1 ? dlock__err(DLOCK_EPROTO, "etcd %s: our lock key "
                                                      "vanished",
                                        es->redacted)
                           : rc;
        }
    }

    for (;;) {
        if (!p.pred_b64[0]) {
            l->token = (uint64_t)eh->rev;
            return DLOCK_OK;
        }
        if (l->deadline <= dlock__now_ms()) {
            give_up_key(es, eh);
            l->retry_ms = -1;
            return DLOCK_EBUSY;
        }
        eh->waited = 1;
        rc = watch_pred(es, eh, &p, l->deadline);
        if (rc == 0 && p.second && !eh->lease->dead) {
            /* the head's key was deleted (not merely a broken stream) */
            /* second in line and the head is gone: every key created
             * since is behind us */
            l->token = (uint64_t)eh->rev;
            return DLOCK_OK;
        }
        if (rc == 2) {
            give_up_key(es, eh);
            l->retry_ms = -1;
            return DLOCK_EBUSY;
        }
        if (rc == 3 || eh->lease->dead) {
            give_up_key(es, eh);
            return 1;
        }
        if (rc != 0 && rc != 4) {
            give_up_key(es, eh);
            return rc;
        }
        rc = look(es, eh, base, base_len, &p, dlock__now_ms() + op_ms);
        if (rc == 1) {
            int dead = eh->lease->dead;
            give_up_key(es, eh);
            if (dead)
                return 1;
            return dlock__err(DLOCK_EPROTO, "etcd %s: our lock key vanished "
                                            "while waiting (deleted by "
                                            "someone else?)",
                              es->redacted);
        }
        if (rc != DLOCK_OK) {
            give_up_key(es, eh);
            return rc;
        }
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
        const char *nl = strchr(val, '\n');
        snprintf(out, cap, "%s", nl ? nl + 1 : val);
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
    return ((etcd_store *)st)->timer_fd;
}

#define LOOP_BATCH 64

static void etcd_loop_run(void *st, int readable)
{
    etcd_store *es = st;
    uint64_t ticks;
    etcd_lease *due[LOOP_BATCH];
    int64_t now = dlock__now_ms(), next = now + 60000;
    size_t nd = 0;

    if (readable && read(es->timer_fd, &ticks, sizeof(ticks)) < 0)
        (void)errno;

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
    if (es->timer_fd >= 0)
        close(es->timer_fd);
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
    pthread_mutex_init(&es->mu, NULL);
    es->client = c;
    es->timeout_ms = timeout_ms;
    es->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    es->redacted = strdup(u->redacted);
    if (es->timer_fd < 0 || !es->redacted) {
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
