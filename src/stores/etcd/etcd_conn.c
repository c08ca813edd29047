/* SPDX-License-Identifier: MIT */
/*
 * etcd_conn.c -- the etcd store's HTTP/JSON client of etcd's v3
 * gateway (etcd.c is the lock protocol, etcd_int.h what the files share):
 * base64 of keys and values, the pool of libcurl easy handles (each
 * with its answer's buffer), one POST with its deadline, a request that
 * goes round the endpoints (TLS failures, "unavailable", a new auth token
 * when the old one is refused), authentication, and the URI's options
 * (endpoints, prefix, timeout, TLS files, user).
 *
 * Every request is an HTTP/1.1 POST with a deadline, on an easy handle
 * from the store's pool (each keeps its connection alive). A request that
 * cannot reach an endpoint, or that the member answers "unavailable",
 * goes to the next endpoint while time is left; every request dlock sends
 * is idempotent, so a retry is safe.
 */
#include "etcd_int.h"

#include "opt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* gRPC codes in the gateway's error answers */
enum { G_INVALID = 3, G_NOTFOUND = 5, G_PERMISSION = 7,
       G_FAILED_PRECONDITION = 9, G_UNAVAILABLE = 14, G_UNAUTHENTICATED = 16 };

/* ------------------------------------------------------------------------ */
/* Base64                                                                   */
/* ------------------------------------------------------------------------ */

static const char b64_chars[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Base64 (with padding) of n bytes into out (cap >= 4*ceil(n/3)+1). */
size_t dlock__etcd_b64_encode(const char *in, size_t n, char *out)
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
long dlock__etcd_b64_decode(const char *in, char *out, size_t cap)
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

/* The range end of a base that ends with '/': the same with '0'. */
void dlock__etcd_range_end_b64(const char *base, size_t len, char *out)
{
    char end[ETCD_KEY_MAX];

    memcpy(end, base, len);
    end[len - 1] = '0';
    dlock__etcd_b64_encode(end, len, out);
}

/* ------------------------------------------------------------------------ */
/* HTTP                                                                     */
/* ------------------------------------------------------------------------ */

static size_t on_write(char *p, size_t size, size_t n, void *arg)
{
    etcd_conn *cn = arg;

    if (dlock__buf_add(&cn->resp, p, size * n) != 0)
        return 0;
    return size * n;
}

/* libcurl's CURLOPT_OPENSOCKETFUNCTION: its connections' sockets,
 * close-on-exec from their creation (libcurl 7.88 makes them without).
 * In a handle's first request it comes after libcurl made the handle's
 * wake-up socket pair: marked here, before the connect's wait. */
static curl_socket_t open_socket(void *arg, curlsocktype purpose,
                                 struct curl_sockaddr *a)
{
    etcd_newfds *nf = arg;

    (void)purpose;
    if (nf && nf->noting) {
        dlock__fds_mark_new(&nf->note);
        nf->noting = 0;
    }
    return socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
}

void dlock__etcd_no_inherit(CURL *h, etcd_newfds *nf)
{
    memset(nf, 0, sizeof(*nf));
    nf->fresh = 1;
    curl_easy_setopt(h, CURLOPT_OPENSOCKETFUNCTION, open_socket);
    curl_easy_setopt(h, CURLOPT_OPENSOCKETDATA, nf);
}

/* The first curl_easy_perform() on a handle makes the multi handle it
 * runs in, and libcurl 7.88's multi handle a wake-up socket pair
 * (socketpair() without close-on-exec, numbers kept inside): noted
 * before that call, marked when it opens its connection (open_socket) or
 * else after it (src/core/fds.c). */
CURLcode dlock__etcd_perform(CURL *h, etcd_newfds *nf)
{
    CURLcode cc;

    if (nf->fresh) {
        dlock__fds_note(&nf->note);
        nf->noting = 1;
        nf->fresh = 0;
    }
    cc = curl_easy_perform(h);
    if (nf->noting) {
        dlock__fds_mark_new(&nf->note);
        nf->noting = 0;
    }
    return cc;
}

etcd_conn *dlock__etcd_conn_get(etcd_store *es)
{
    etcd_conn *cn;

    pthread_mutex_lock(&es->mu);
    cn = dlock__pool_take(&es->pool);
    pthread_mutex_unlock(&es->mu);
    if (cn)
        return cn;
    cn = calloc(1, sizeof(*cn));
    if (!cn || !(cn->h = curl_easy_init())) {
        free(cn);
        return NULL;
    }
    cn->resp.max = ETCD_RESP_MAX;
    CURL *h = cn->h;
    dlock__etcd_no_inherit(h, &cn->nf);
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

void dlock__etcd_conn_free(etcd_conn *cn)
{
    curl_easy_cleanup(cn->h);
    curl_slist_free_all(cn->hdrs);
    dlock__buf_free(&cn->resp);
    free(cn);
}

void dlock__etcd_conn_put(etcd_store *es, etcd_conn *cn)
{
    if (cn->resp.cap > 65536) /* do not keep a huge answer's memory */
        dlock__buf_free(&cn->resp);
    pthread_mutex_lock(&es->mu);
    int kept = dlock__pool_keep(&es->pool, cn);
    pthread_mutex_unlock(&es->mu);
    if (!kept) /* more threads made requests at once than are kept */
        dlock__etcd_conn_free(cn);
}

/* (Re)builds the connection's headers when the auth token changed. */
static int conn_headers(etcd_store *es, etcd_conn *cn, int with_token);

int dlock__etcd_conn_headers(etcd_store *es, etcd_conn *cn)
{
    return conn_headers(es, cn, 1);
}

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
    dlock__buf_reset(&cn->resp);
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
    cc = dlock__etcd_perform(cn->h, &cn->nf);
    if (cc == CURLE_OK)
        curl_easy_getinfo(cn->h, CURLINFO_RESPONSE_CODE, status);
    return cc;
}

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
int dlock__etcd_request(etcd_store *es, const char *path, const char *body,
                        int64_t deadline, cJSON **out, const char *what)
{
    etcd_conn *cn = dlock__etcd_conn_get(es);
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
                                             cn->resp.len);
            if (status == 200 && j && !jget(j, "error")) {
                *out = j;
                rc = DLOCK_OK;
                break;
            }
            const char *msg = j ? jstr(j, "error") : NULL;
            int64_t code = j ? jint(j, "code") : 0;
            snprintf(why, sizeof(why), "%s",
                     msg ? msg : (cn->resp.len ? "an answer that is not JSON"
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
                rc = dlock__etcd_authenticate(es, cn, deadline);
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
    dlock__etcd_conn_put(es, cn);
    return rc;
}

/* Gets a new auth token (the password is sent, never logged). */
int dlock__etcd_authenticate(etcd_store *es, etcd_conn *cn, int64_t deadline)
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
                                             cn->resp.len);
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
/* URI options                                                              */
/* ------------------------------------------------------------------------ */

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

int dlock__etcd_parse_config(etcd_store *es, const dlock__uri *u)
{
    static const char *const plain[] = {"prefix", "timeout", NULL};
    static const char *const tls[] = {"prefix", "timeout", "cacert", "cert",
                                      "key", NULL};
    int is_tls = !strcmp(u->scheme, "etcds");
    const char *prefix = dlock__uri_param(u, "prefix");
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
    if ((rc = dlock__opt_timeout("etcd", u, &es->timeout_ms)) != DLOCK_OK)
        return rc;
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
