/* SPDX-License-Identifier: MIT */
/*
 * exporter_http.c -- `dlock exporter`'s HTTP server: libmicrohttpd's
 * set-up and limits, TLS and basic auth, the answers, suspended scrapes.
 *
 * A few libmicrohttpd threads each poll their share of the connections
 * with epoll, so idle or slow connections cost a descriptor and a bounded
 * memory pool each, never a thread. Connections are bounded in number
 * (total and per client address), in memory, and in time (closed after
 * --http-timeout without progress, an answer cut after 60 s).
 * --web.config.file adds TLS, client certificates and basic auth
 * (web_config.c). A scrape that finds no fresh answer in the cache
 * (exporter_cache.c) is suspended until the listing thread resumes it.
 */
#include "cli.h"
#include "exporter.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#ifdef DLOCK_CLI_HAVE_WEBCFG
#include <gnutls/gnutls.h>
#endif

#if MHD_VERSION >= 0x00097002
typedef enum MHD_Result mhd_result;
#else
typedef int mhd_result;
#endif

/* Memory of one connection: request line and headers (Prometheus sends
 * under 1 kB), and the buffer the answer is copied through. */
#define HTTP_CONN_MEM (32 * 1024)
#define HTTP_BLOCK (16 * 1024)
/* An answer not sent within this long is cut (a reader that takes a byte
 * every few seconds would otherwise keep an old listing alive). */
#define HTTP_SEND_MAX_US (60 * 1000000LL)
/* A listing asked for without Prometheus' timeout header (curl) stops
 * after this long, as Prometheus' would at its timeout: waiters always
 * get an answer. */
#define LISTING_MAX_US (30 * 1000000LL)
/* Of Prometheus' scrape timeout, the share the exporter uses before it
 * gives up on a store: the rest is the answer's way back. */
#define SCRAPE_BUDGET 0.9

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* A request's state (MHD's req_cls), freed when the request ends. */
typedef struct req {
    struct req *next; /* in the waiters' list */
    struct MHD_Connection *conn;
    uint64_t gen;     /* the listing generation it waits to pass */
    int state;        /* R_NEW, R_CHECKED, R_WAITING */
} req;

enum { R_NEW, R_CHECKED, R_WAITING };

static const char index_page[] =
    "<!DOCTYPE html>\n<html><head><title>dlock exporter</title></head>\n"
    "<body><h1>dlock exporter</h1>\n"
    "<p>The locks of this exporter's stores, as Prometheus metrics: "
    "<a href=\"/metrics\">/metrics</a>.</p></body></html>\n";

/* libmicrohttpd's messages (a refused TLS handshake, a client gone
 * mid-request, ...), LOG_PER_MIN a minute at most: a client cannot flood
 * the log. */
#define LOG_PER_MIN 10

static void http_log(void *cls, const char *fmt, va_list ap)
{
    exporter *ex = cls;
    int64_t now = mono_us();
    unsigned n;

    pthread_mutex_lock(&ex->logmu);
    if (now - ex->log_window >= 60 * 1000000LL) {
        ex->log_window = now;
        ex->log_lines = 0;
    }
    n = ++ex->log_lines;
    pthread_mutex_unlock(&ex->logmu);
    if (n > LOG_PER_MIN + 1)
        return;
    if (n == LOG_PER_MIN + 1) {
        fputs("dlock exporter: http: more messages this minute left out\n",
              stderr);
        return;
    }
    {
        char line[512];
        size_t len;

        vsnprintf(line, sizeof(line), fmt, ap);
        len = strlen(line);
        while (len && (line[len - 1] == '\n' || line[len - 1] == ' '))
            line[--len] = '\0';
        /* libmicrohttpd's messages may quote what a client sent */
        fputs("dlock exporter: http: ", stderr);
        cli_term_str(stderr, line);
        fputc('\n', stderr);
    }
}

static void add_headers(const exporter *ex, struct MHD_Response *r,
                        const char *type)
{
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    for (size_t i = 0; i < ex->web.nheaders; i++)
        MHD_add_response_header(r, ex->web.header_name[i],
                                ex->web.header_value[i]);
}

/* A short, constant answer. */
static mhd_result reply(const exporter *ex, struct MHD_Connection *conn,
                        unsigned status, const char *type, const char *text)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        strlen(text), (void *)text, MHD_RESPMEM_PERSISTENT);
    mhd_result ok;

    if (!r)
        return MHD_NO; /* libmicrohttpd closes the connection */
    add_headers(ex, r, type);
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    if (status == MHD_HTTP_UNAUTHORIZED)
        ok = MHD_queue_basic_auth_fail_response(conn, "dlock exporter", r);
    else
        ok = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ok;
}

/* One connection's reading of an answer. */
typedef struct sending {
    body *b;
    int64_t deadline; /* mono us: the answer is cut then */
} sending;

static ssize_t send_body(void *cls, uint64_t pos, char *buf, size_t max)
{
    sending *s = cls;
    size_t n;

    if (pos >= s->b->len)
        return MHD_CONTENT_READER_END_OF_STREAM;
    if (mono_us() > s->deadline)
        return MHD_CONTENT_READER_END_WITH_ERROR; /* closes the connection */
    n = s->b->len - (size_t)pos;
    if (n > max)
        n = max;
    memcpy(buf, s->b->p + pos, n);
    return (ssize_t)n;
}

static void sent_body(void *cls)
{
    sending *s = cls;

    exporter_body_unref(s->b);
    free(s);
}

/* Queues answer b (a reference the call takes over). */
static mhd_result reply_body(const exporter *ex, struct MHD_Connection *conn,
                             body *b)
{
    struct MHD_Response *r;
    sending *s;
    mhd_result ok;

    if (!b || !b->p) {
        exporter_body_unref(b);
        return reply(ex, conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain",
                     "out of memory\n");
    }
    if (!(s = malloc(sizeof(*s)))) {
        exporter_body_unref(b);
        return MHD_NO;
    }
    s->b = b;
    s->deadline = mono_us() + HTTP_SEND_MAX_US;
    r = MHD_create_response_from_callback(b->len, HTTP_BLOCK, send_body, s,
                                          sent_body);
    if (!r) {
        sent_body(s);
        return MHD_NO;
    }
    add_headers(ex, r, CONTENT_TYPE);
    ok = MHD_queue_response(conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

/* The scrape's deadline from Prometheus' timeout header; without it,
 * LISTING_MAX_US from now. */
static int64_t deadline_of(struct MHD_Connection *conn)
{
    const char *h = MHD_lookup_connection_value(
        conn, MHD_HEADER_KIND, "X-Prometheus-Scrape-Timeout-Seconds");
    char *end;
    double s;

    if (h) {
        errno = 0;
        s = strtod(h, &end);
        if (end != h && !errno && s > 0 && s <= 86400)
            return mono_us() + (int64_t)(s * SCRAPE_BUDGET * 1e6);
    }
    return mono_us() + LISTING_MAX_US;
}

/* The client certificate and the password, as --web.config.file asks.
 * 1: let in; 0: refused (*status, *text: the answer). */
static int admitted(const exporter *ex, struct MHD_Connection *conn,
                    unsigned *status, const char **text)
{
#ifdef DLOCK_CLI_HAVE_WEBCFG
    if (ex->web.verify_client) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(
            conn, MHD_CONNECTION_INFO_GNUTLS_SESSION);
        unsigned vs = 1;

        if (!ci || !ci->tls_session ||
            gnutls_certificate_verify_peers2(
                (gnutls_session_t)ci->tls_session, &vs) != 0 ||
            vs != 0) {
            *status = MHD_HTTP_FORBIDDEN;
            *text = "a client certificate signed by the client CA is "
                    "required\n";
            return 0;
        }
    }
#endif
    if (ex->web.nusers) {
        char *pass = NULL;
        char *user = MHD_basic_auth_get_username_password(conn, &pass);
        int ok = user && pass && web_config_check(&ex->web, user, pass);

        if (pass) {
            explicit_bzero(pass, strlen(pass));
            MHD_free(pass);
        }
        if (user)
            MHD_free(user);
        if (!ok) {
            *status = MHD_HTTP_UNAUTHORIZED;
            *text = "unauthorized\n";
            return 0;
        }
    }
    return 1;
}

static mhd_result on_request(void *cls, struct MHD_Connection *conn,
                             const char *url, const char *method,
                             const char *version, const char *upload_data,
                             size_t *upload_data_size, void **req_cls)
{
    exporter *ex = cls;
    req *r = *req_cls;
    body *b = NULL;
    unsigned status;
    const char *text;

    (void)version;
    (void)upload_data;
    if (!r) { /* the headers are in: wait for the end */
        if (!(r = calloc(1, sizeof(*r))))
            return MHD_NO;
        r->conn = conn;
        *req_cls = r;
        return MHD_YES;
    }
    if (*upload_data_size) { /* a body: read and dropped */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (r->state == R_WAITING) { /* resumed: the listing it waited for */
        int done;

        pthread_mutex_lock(&ex->mu);
        done = ex->gen != r->gen; /* else: woken because we stop */
        if (done && (b = ex->cur) != NULL)
            atomic_fetch_add(&b->refs, 1);
        pthread_mutex_unlock(&ex->mu);
        if (!done)
            return reply(ex, conn, MHD_HTTP_SERVICE_UNAVAILABLE,
                         "text/plain", "the exporter is stopping\n");
        return reply_body(ex, conn, b); /* NULL: 500 */
    }
    if (!admitted(ex, conn, &status, &text))
        return reply(ex, conn, status, "text/plain", text);
    r->state = R_CHECKED;
    if (strcmp(method, MHD_HTTP_METHOD_GET) &&
        strcmp(method, MHD_HTTP_METHOD_HEAD))
        return reply(ex, conn, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain",
                     "only GET and HEAD\n");
    if (!strcmp(url, "/"))
        return reply(ex, conn, MHD_HTTP_OK, "text/html; charset=utf-8",
                     index_page);
    if (strcmp(url, "/metrics"))
        return reply(ex, conn, MHD_HTTP_NOT_FOUND, "text/plain",
                     "not found: see /metrics\n");

    pthread_mutex_lock(&ex->mu);
    if (ex->stopping) {
        pthread_mutex_unlock(&ex->mu);
        return reply(ex, conn, MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain",
                     "the exporter is stopping\n");
    }
    if (ex->cur && ex->cur->p && mono_us() < ex->fresh_until) {
        b = ex->cur;
        atomic_fetch_add(&b->refs, 1);
        pthread_mutex_unlock(&ex->mu);
        return reply_body(ex, conn, b);
    }
    /* no fresh answer: wait for the listing that runs, or ask for one */
    if (!ex->want && !ex->busy) {
        ex->want = 1;
        ex->want_deadline = deadline_of(conn);
        pthread_cond_signal(&ex->cv);
    }
    r->gen = ex->gen;
    r->state = R_WAITING;
    r->next = ex->waiters;
    ex->waiters = r;
    MHD_suspend_connection(conn);
    pthread_mutex_unlock(&ex->mu);
    return MHD_YES;
}

static void on_done(void *cls, struct MHD_Connection *conn, void **req_cls,
                    enum MHD_RequestTerminationCode why)
{
    (void)cls;
    (void)conn;
    (void)why;
    free(*req_cls); /* never in the waiters' list: resumed first */
    *req_cls = NULL;
}

/* Wakes every suspended scrape: libmicrohttpd calls on_request() again for
 * each, which answers from ex->cur. With ex->mu held. */
void exporter_resume_waiters(exporter *ex)
{
    req *r = ex->waiters;

    ex->waiters = NULL;
    while (r) {
        req *next = r->next;
        r->next = NULL;
        MHD_resume_connection(r->conn);
        r = next;
    }
}

/* Starts libmicrohttpd on host:port; NULL after a message. */
struct MHD_Daemon *exporter_http_start(exporter *ex, const char *host,
                                       const char *port, int *dual)
{
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
                     MHD_ALLOW_SUSPEND_RESUME;
    struct MHD_OptionItem ops[16];
    struct MHD_Daemon *d = NULL;
    struct addrinfo hints, *ai = NULL;
    uint16_t pnum = (uint16_t)strtoul(port, NULL, 10);
    int n = 0, rc;

    flags |= MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES
                 ? MHD_USE_EPOLL
                 : MHD_USE_AUTO;
    if (ex->web.cert_pem) {
        if (MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
            cli_err("exporter: this libmicrohttpd was built without TLS; "
                    "tls_server_config needs one with GnuTLS");
            return NULL;
        }
        flags |= MHD_USE_TLS;
        ops[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0,
                                           ex->web.cert_pem};
        ops[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0,
                                           ex->web.key_pem};
        ops[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_PRIORITIES, 0,
                                           ex->web.priorities};
        if (ex->web.ca_pem)
            ops[n++] = (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_TRUST, 0,
                                               ex->web.ca_pem};
    }
    ops[n++] = (struct MHD_OptionItem){MHD_OPTION_THREAD_POOL_SIZE,
                                       HTTP_THREADS, NULL};
    ops[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_LIMIT,
                                       (intptr_t)ex->conn_max, NULL};
    ops[n++] = (struct MHD_OptionItem){MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                                       (intptr_t)ex->conn_per_ip, NULL};
    ops[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_TIMEOUT,
                                       (intptr_t)ex->idle_s, NULL};
    ops[n++] = (struct MHD_OptionItem){MHD_OPTION_CONNECTION_MEMORY_LIMIT,
                                       HTTP_CONN_MEM, NULL};
    ops[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_COMPLETED,
                                       (intptr_t)on_done, NULL};
    ops[n] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};

    if (!*host) { /* every address: IPv6 and IPv4 on one socket */
        d = MHD_start_daemon(flags | MHD_USE_DUAL_STACK, pnum, NULL, NULL,
                             on_request, ex, MHD_OPTION_EXTERNAL_LOGGER,
                             http_log, ex, MHD_OPTION_ARRAY, ops,
                             MHD_OPTION_END);
        *dual = d != NULL;
        if (!d) /* a host without IPv6 */
            d = MHD_start_daemon(flags, pnum, NULL, NULL, on_request, ex,
                                 MHD_OPTION_EXTERNAL_LOGGER, http_log, ex,
                                 MHD_OPTION_ARRAY, ops, MHD_OPTION_END);
        if (!d)
            cli_err("exporter: cannot listen on port %s (in use? or the "
                    "TLS certificate and key: libmicrohttpd's message "
                    "above)",
                    port);
        return d;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    rc = getaddrinfo(host, port, &hints, &ai);
    if (rc != 0 || !ai) {
        cli_err("exporter: --listen: cannot resolve '%s': %s", host,
                gai_strerror(rc));
        return NULL;
    }
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    d = MHD_start_daemon(flags, pnum, NULL, NULL, on_request, ex,
                         MHD_OPTION_EXTERNAL_LOGGER, http_log, ex,
                         MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_ARRAY,
                         ops, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d)
        cli_err("exporter: cannot listen on %s:%s (in use, not an address "
                "of this host, or the TLS certificate and key: "
                "libmicrohttpd's message above)",
                host, port);
    return d;
}
