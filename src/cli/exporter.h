/* SPDX-License-Identifier: MIT */
/*
 * exporter.h -- the parts of `dlock exporter` (internal, libmicrohttpd
 * builds only: DLOCK_CLI_HAVE_MHD). The command (cmd_exporter.c) fills an
 * exporter and starts the listing thread (exporter_cache.c), which writes
 * the metrics text (exporter_metrics.c), and the HTTP server
 * (exporter_http.c), whose requests take the cached answer or wait for
 * the next one. Overview: cmd_exporter.c.
 */
#ifndef DLOCK_CLI_EXPORTER_H
#define DLOCK_CLI_EXPORTER_H

#include "web_config.h"

#include <dlock.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct MHD_Daemon;
struct req;

/* libmicrohttpd threads, each polling its share of the connections with
 * epoll: no handler waits on a store (listings have their own thread), so
 * they only parse requests, check passwords (bcrypt: a few ms each) and
 * copy the answer out. */
#define HTTP_THREADS 4
/* Defaults of --max-connections, --max-connections-per-ip and
 * --http-timeout: far above what Prometheus servers open (one keep-alive
 * connection each), so that idle or slow clients must come from several
 * addresses to fill the table, and each costs at most HTTP_CONN_MEM plus
 * a TLS session (about 20 kB). A connection without progress for the
 * timeout is closed: a client that sends nothing, half a header, or stops
 * reading. */
#define HTTP_CONN_MAX 512
#define HTTP_CONN_PER_IP 128
#define HTTP_IDLE_S 10
/* Default of --cache-ttl, in ms: answers the Prometheus servers of a
 * scrape round (an HA pair scraping at once) from one listing, while a
 * scrape interval (15 s usually) still sees a new one. */
#define CACHE_TTL_MS 5000
/* Locks per dlock_list() page unless --page says otherwise: fewer round
 * trips than the library's default 100 on big stores, while one page stays
 * a short store operation (Redis runs one command at a time) and a few
 * hundred kB. */
#define PAGE_LIMIT 1000

/* One store the exporter lists. */
typedef struct xstore {
    dlock_client *c;
    const char *uri;             /* dlock_client_store(c): for the log */
    char *label;                 /* exporter_store_label(uri): metrics */
    atomic_uint_fast64_t errors; /* failed listings of this store */
    atomic_uint_fast64_t listings; /* listings started */
    atomic_int up;               /* the last listing's outcome (-1: none) */
} xstore;

/* An answer: built once per listing, read by every connection it is sent
 * on; freed by the last reference. */
typedef struct body {
    atomic_int refs;
    size_t len;
    char *p; /* NULL: the listing ran out of memory (500) */
} body;

typedef struct exporter {
    xstore *stores;
    size_t n;
    const char *prefix;
    unsigned flags;
    size_t page; /* locks per dlock_list() call */
    web_config web;
    int64_t ttl_us;       /* --cache-ttl */
    unsigned conn_max, conn_per_ip, idle_s;

    /* the cache: mu guards every field below */
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* the listing thread: want or stopping */
    body *cur;            /* the last answer (NULL before the first) */
    uint64_t gen;         /* answers made so far */
    int64_t fresh_until;  /* cur answers new scrapes until then (mono us) */
    int want, busy, stopping;
    int64_t want_deadline; /* the asked listing's deadline (mono us) */
    struct req *waiters;   /* suspended until the next answer */
    /* a new answer (or stopping): wakes the waiters (the HTTP side's
     * exporter_resume_waiters(), set by exporter_main.c), with mu held */
    void (*answered)(struct exporter *ex);

    /* libmicrohttpd's messages: a few a minute (a client can make one a
     * connection) */
    pthread_mutex_t logmu;
    int64_t log_window;
    unsigned log_lines;
} exporter;

static inline int64_t mono_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* --- the metrics text (exporter_metrics.c) ------------------------------ */

/* Lists every store of ex into the whole answer to GET /metrics, in *text
 * (malloc'ed, *len bytes); 0, or -1 when memory ran out (*text NULL).
 * *cut is set when a store's listing stopped at deadline_us (mono us; 0:
 * none): the answer is then for the scrapes that asked, not kept. Logs a
 * store's change of state (works, fails). */
int exporter_scrape(exporter *ex, int64_t deadline_us, char **text,
                    size_t *len, int *cut);

/* The label a store's series carry: its URI (already without password)
 * without the user name, and without the query parameters other than
 * prefix, table, db, mode, private and host. NULL: out of memory. */
char *exporter_store_label(const char *uri);

/* --- the cache and the listing thread (exporter_cache.c) ---------------- */

/* Drops a reference to b (NULL: nothing); the last one frees it. */
void exporter_body_unref(body *b);

/* The listing thread (pthread_create's start routine, arg the exporter):
 * one listing at a time, when a scrape asks (ex->want); then the answer
 * replaces ex->cur and the waiters are resumed. Returns when ex->stopping
 * is set, after resuming every waiter. */
void *exporter_lister(void *arg);

/* --- HTTP (exporter_http.c) --------------------------------------------- */

/* Starts libmicrohttpd on host:port (host "": every address; *dual then
 * says whether IPv6 and IPv4 share the socket) with ex's limits, TLS and
 * users; NULL after a message. */
struct MHD_Daemon *exporter_http_start(exporter *ex, const char *host,
                                       const char *port, int *dual);

/* Resumes every suspended scrape: libmicrohttpd calls the request handler
 * again for each, which answers from ex->cur (or 503 when stopping). With
 * ex->mu held. */
void exporter_resume_waiters(exporter *ex);

#endif
