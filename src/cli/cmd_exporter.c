/* SPDX-License-Identifier: MIT */
/*
 * cmd_exporter.c -- `dlock exporter --listen ADDR:PORT [--store URI]...
 * [--prefix P] [--all] [--timeout DUR]`: the locks of one or more stores
 * as Prometheus metrics, over HTTP (GET /metrics).
 *
 * What a listing does: for each store, in the order given, it walks
 * dlock_list() page by page on the client opened for that store at start
 * (the library reconnects it after an outage), and writes one series per
 * lock and family, then the exporter's own health per store.
 *
 * One listing serves every scraper: the answer is kept --cache-ttl (5 s)
 * from the listing's start, and the scrapes that arrive while a listing
 * runs wait for that one (their connections suspended, no thread held)
 * and get its answer. Listings run on a thread of their own, so that no
 * libmicrohttpd thread ever waits on a store; the answer is one
 * reference-counted buffer that every connection reads from.
 *
 * HTTP is libmicrohttpd's: a few of its threads each poll their share of
 * the connections with epoll, so idle or slow connections cost a
 * descriptor and a bounded memory pool each, never a thread. Connections
 * are bounded in number (total and per client address), in memory, and
 * in time (closed after --http-timeout without progress, an answer cut
 * after 60 s). --web.config.file adds TLS, client certificates and basic
 * auth (web_config.c). The main thread only waits for SIGTERM or SIGINT
 * (sigwait), then stops the listing thread and the daemon, and closes the
 * clients.
 *
 * Without libmicrohttpd at build time (DLOCK_CLI_HAVE_MHD undefined) the
 * command exists and says which package it needs.
 */
#include "cli.h"

#include <dlock.h>

#include <stdio.h>
#include <string.h>
#include <strings.h>

static const char exporter_usage[] =
    "usage: dlock exporter --listen ADDR:PORT [--store URI]... [--prefix P]\n"
    "                      [--all] [--timeout DUR] [--page N]\n"
    "                      [--web.config.file FILE] [--cache-ttl DUR]\n"
    "                      [--http-timeout DUR] [--max-connections N]\n"
    "                      [--max-connections-per-ip N]\n"
    "\n"
    "Serves the locks of the stores as Prometheus metrics on\n"
    "http://ADDR:PORT/metrics (text format 0.0.4). A listing of every lock\n"
    "of every store (dlock list) answers every scrape for --cache-ttl;\n"
    "per lock: dlock_lock_held, dlock_lock_lease_seconds,\n"
    "dlock_lock_hold_age_seconds, dlock_lock_waiters, dlock_lock_holders,\n"
    "dlock_lock_token (labels store, lock); per store: dlock_exporter_up,\n"
    "dlock_exporter_scrape_duration_seconds, dlock_exporter_locks,\n"
    "dlock_exporter_scrape_errors_total, dlock_exporter_listings_total.\n"
    "The store label is the URI without user, password or query parameters\n"
    "other than prefix, table, db, mode, private and host.\n"
    "\n"
    "  --listen ADDR:PORT  where to listen: 127.0.0.1:9464, [::1]:9464,\n"
    "                      :9464 (every address); port 0 picks a free one\n"
    "                      (printed at start). Also --web.listen-address\n"
    "  --store URI         a store to list (repeat for several; default:\n"
    "                      $DLOCK_STORE, else the file store)\n"
    "  --prefix P          only lock names that start with the bytes P\n"
    "  --all               also free locks the store still keeps\n"
    "  --timeout DUR       longest store round trip (default 2s)\n"
    "  --page N            locks per store round trip (1..10000, default\n"
    "                      1000): larger walks big stores in fewer, longer\n"
    "                      store operations\n"
    "  --web.config.file FILE  TLS, client certificates and basic auth, in\n"
    "                      the Prometheus exporter-toolkit's format\n"
    "                      (tls_server_config, basic_auth_users,\n"
    "                      http_server_config.headers)\n"
    "  --cache-ttl DUR     how long one listing answers scrapes (default\n"
    "                      5s; 0: each scrape after a listing ended gets a\n"
    "                      new one, scrapes during a listing share it)\n"
    "  --http-timeout DUR  a connection without progress for this long is\n"
    "                      closed (default 10s)\n"
    "  --max-connections N  open connections at most (default 512), and\n"
    "  --max-connections-per-ip N  from one client address (default 128)\n"
    "\n"
    "A scrape stops listing a store when Prometheus' scrape timeout (its\n"
    "X-Prometheus-Scrape-Timeout-Seconds header) is near, and reports it\n"
    "down for that scrape. SIGTERM or SIGINT stops the exporter.\n"
    "\n"
    "Exit status: 0 stopped by a signal, 64 usage, 69 a store could not be\n"
    "opened at start, the address could not be bound, or this dlock was\n"
    "built without libmicrohttpd.\n";

#ifndef DLOCK_CLI_HAVE_MHD

int cmd_exporter(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(exporter_usage, stdout);
            return 0;
        }
    }
    cli_err("exporter: this dlock was built without libmicrohttpd; install "
            "it (Debian: libmicrohttpd-dev) and build dlock again");
    return CLI_EX_UNAVAILABLE;
}

#else /* DLOCK_CLI_HAVE_MHD */

#include "web_config.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#ifdef DLOCK_CLI_HAVE_WEBCFG
#include <gnutls/gnutls.h>
#endif

#if MHD_VERSION >= 0x00097002
typedef enum MHD_Result mhd_result;
#else
typedef int mhd_result;
#endif

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
/* Memory of one connection: request line and headers (Prometheus sends
 * under 1 kB), and the buffer the answer is copied through. */
#define HTTP_CONN_MEM (32 * 1024)
#define HTTP_BLOCK (16 * 1024)
/* An answer not sent within this long is cut (a reader that takes a byte
 * every few seconds would otherwise keep an old listing alive). */
#define HTTP_SEND_MAX_US (60 * 1000000LL)
/* Default of --cache-ttl, in ms: answers the Prometheus servers of a
 * scrape round (an HA pair scraping at once) from one listing, while a
 * scrape interval (15 s usually) still sees a new one. */
#define CACHE_TTL_MS 5000
/* A listing asked for without Prometheus' timeout header (curl) stops
 * after this long, as Prometheus' would at its timeout: waiters always
 * get an answer. */
#define LISTING_MAX_US (30 * 1000000LL)
/* Locks per dlock_list() page unless --page says otherwise: fewer round
 * trips than the library's default 100 on big stores, while one page stays
 * a short store operation (Redis runs one command at a time) and a few
 * hundred kB. */
#define PAGE_LIMIT 1000
/* Pages per store and scrape: ends a walk over a store whose cursor never
 * ends (a bug), far past any real store (10,000,000 locks). */
#define MAX_PAGES 10000
/* Of Prometheus' scrape timeout, the share the exporter uses before it
 * gives up on a store: the rest is the answer's way back. */
#define SCRAPE_BUDGET 0.9
/* scrape_store()'s rc when the deadline stopped it (not a DLOCK_E*) */
#define RC_DEADLINE 1

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* One store the exporter lists. */
typedef struct xstore {
    dlock_client *c;
    const char *uri;             /* dlock_client_store(c): for the log */
    char *label;                 /* store_label(uri): for the metrics */
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

/* A request's state (MHD's req_cls), freed when the request ends. */
typedef struct req {
    struct req *next; /* in the waiters' list */
    struct MHD_Connection *conn;
    uint64_t gen;     /* the listing generation it waits to pass */
    int state;        /* R_NEW, R_CHECKED, R_WAITING */
} req;

enum { R_NEW, R_CHECKED, R_WAITING };

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
    req *waiters;          /* suspended until the next answer */

    /* libmicrohttpd's messages: a few a minute (a client can make one a
     * connection) */
    pthread_mutex_t logmu;
    int64_t log_window;
    unsigned log_lines;
} exporter;

/* ------------------------------------------------------------------------ */
/* Text buffers                                                             */
/* ------------------------------------------------------------------------ */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom; /* an append failed: the buffer is incomplete */
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        char *p;
        while (cap < b->len + n + 1)
            cap *= 2;
        if (!(p = realloc(b->p, cap))) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void sb_str(sbuf *b, const char *s)
{
    sb_add(b, s, strlen(s));
}

static void sb_printf(sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void sb_printf(sbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(tmp)) {
        b->oom = 1; /* only numbers go through here: never that long */
        return;
    }
    sb_add(b, tmp, (size_t)n);
}

/*
 * A label value as the text format escapes it: backslash, double quote
 * and line feed; every other byte as it is. Prometheus takes only UTF-8
 * label values (one bad value fails the whole scrape: "invalid label
 * value"), so a byte that is not part of well-formed UTF-8 is written as
 * the four characters \xNN, as `dlock list` shows it; sb_labels() then
 * adds the label lock_hex with the name's exact bytes, so such a name
 * never collides with one that really has a backslash in it.
 */
static void sb_label(sbuf *b, const char *s)
{
    const unsigned char *p = (const unsigned char *)s, *run = p;

    while (*p) {
        size_t n = cli_utf8_len(p);
        char esc[8];

        if (n > 1 || (n == 1 && *p != '\\' && *p != '"' && *p != '\n')) {
            p += n; /* part of the run copied as is */
            continue;
        }
        sb_add(b, (const char *)run, (size_t)(p - run));
        if (n == 0)
            snprintf(esc, sizeof(esc), "\\\\x%02x", *p);
        else
            snprintf(esc, sizeof(esc), "\\%c", *p == '\n' ? 'n' : *p);
        sb_str(b, esc);
        run = ++p;
    }
    sb_add(b, (const char *)run, (size_t)(p - run));
}

/* The labels of a store's series, `{store="..."} `, or of a lock's,
 * `{store="...",lock="..."} `; a lock name that is not UTF-8 also gets
 * lock_hex="<its bytes in hex>". Built once per lock, then copied after
 * each family's name. */
static void sb_labels(sbuf *b, const char *store, const char *lock)
{
    sb_str(b, "{store=\"");
    sb_label(b, store);
    if (lock) {
        sb_str(b, "\",lock=\"");
        sb_label(b, lock);
        if (!cli_utf8_valid(lock)) {
            static const char hex[] = "0123456789abcdef";
            sb_str(b, "\",lock_hex=\"");
            for (const unsigned char *p = (const unsigned char *)lock; *p;
                 p++) {
                char two[2] = {hex[*p >> 4], hex[*p & 15]};
                sb_add(b, two, 2);
            }
        }
    }
    sb_str(b, "\"} ");
}

/* ------------------------------------------------------------------------ */
/* A scrape                                                                 */
/* ------------------------------------------------------------------------ */

enum {
    F_HELD,
    F_LEASE,
    F_AGE,
    F_WAITERS,
    F_HOLDERS,
    F_TOKEN,
    F_UP,
    F_DURATION,
    F_LOCKS,
    F_ERRORS,
    F_LISTINGS,
    F_COUNT
};

static const struct {
    const char *name, *type, *help;
} families[F_COUNT] = {
    {"dlock_lock_held", "gauge",
     "1 if the lock is held, 0 if it is only waited for (or free, with "
     "--all)."},
    {"dlock_lock_lease_seconds", "gauge",
     "Lease left on the lock's current hold (absent: free, or a store "
     "without leases)."},
    {"dlock_lock_hold_age_seconds", "gauge",
     "How long the lock's current hold has lasted (absent: free, or the "
     "store cannot tell)."},
    {"dlock_lock_waiters", "gauge",
     "Waiters the store knows for the lock (absent: the store cannot "
     "tell)."},
    {"dlock_lock_holders", "gauge",
     "Holds on the lock now: 1 exclusive, or the read holds or permits "
     "taken."},
    {"dlock_lock_token", "gauge",
     "The holder's fencing token; when free, the last one issued."},
    {"dlock_exporter_up", "gauge",
     "1 if the last scrape listed every lock of the store, 0 if it "
     "failed."},
    {"dlock_exporter_scrape_duration_seconds", "gauge",
     "How long the last scrape took to list the store's locks."},
    {"dlock_exporter_locks", "gauge",
     "Locks the last scrape listed in the store (absent when it "
     "failed)."},
    {"dlock_exporter_scrape_errors_total", "counter",
     "Listings of the store that failed, since the exporter started."},
    {"dlock_exporter_listings_total", "counter",
     "Listings of the store's locks since the exporter started (one "
     "answers every scrape for --cache-ttl)."},
};

static int64_t mono_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* `family<labels>` (the value follows). */
static void sb_series(sbuf *b, int family, const sbuf *labels)
{
    sb_str(b, families[family].name);
    if (labels->p)
        sb_add(b, labels->p, labels->len);
}

/* One lock's series, into the per-family buffers; lab is scratch space
 * for its labels. */
static void add_lock(sbuf *fam, sbuf *lab, const char *store,
                     const dlock_listed *l)
{
    const dlock_info *in = &l->info;

    lab->len = 0;
    sb_labels(lab, store, l->name);
    sb_series(&fam[F_HELD], F_HELD, lab);
    sb_str(&fam[F_HELD], in->held ? "1\n" : "0\n");
    if (in->held && in->ttl_ms >= 0) {
        sb_series(&fam[F_LEASE], F_LEASE, lab);
        sb_printf(&fam[F_LEASE], "%.3f\n", (double)in->ttl_ms / 1000);
    }
    if (in->held && in->held_ms >= 0) {
        sb_series(&fam[F_AGE], F_AGE, lab);
        sb_printf(&fam[F_AGE], "%.3f\n", (double)in->held_ms / 1000);
    }
    if (in->waiters >= 0) {
        sb_series(&fam[F_WAITERS], F_WAITERS, lab);
        sb_printf(&fam[F_WAITERS], "%lld\n", (long long)in->waiters);
    }
    sb_series(&fam[F_HOLDERS], F_HOLDERS, lab);
    sb_printf(&fam[F_HOLDERS], "%lld\n", (long long)in->holders);
    sb_series(&fam[F_TOKEN], F_TOKEN, lab);
    sb_printf(&fam[F_TOKEN], "%llu\n", (unsigned long long)in->token);
    if (lab->oom)
        fam[F_HELD].oom = 1; /* reported by scrape() */
}

/* Lists store s into the lock families. Returns the number of locks, or
 * -1 (and the lines it wrote are taken back: a failed store shows no
 * partial listing; -2 when the deadline stopped it) with the reason in why. */
static long long scrape_store(const exporter *ex, xstore *s, sbuf *fam,
                              sbuf *lab, int64_t deadline_us, char *why,
                              size_t cap)
{
    size_t mark[F_TOKEN + 1];
    char *cursor = NULL;
    long long count = 0;
    int pages = 0, rc = DLOCK_OK;

    for (int f = 0; f <= F_TOKEN; f++)
        mark[f] = fam[f].len;
    atomic_fetch_add(&s->listings, 1);
    do {
        dlock_list_page page;

        if (deadline_us && mono_us() >= deadline_us) {
            snprintf(why, cap,
                     "%s: stopped listing: Prometheus' scrape timeout is "
                     "near (%lld locks listed so far)",
                     s->uri, count);
            rc = RC_DEADLINE;
            break;
        }
        rc = dlock_list(s->c, ex->prefix, cursor, ex->page, ex->flags, &page);
        free(cursor);
        cursor = NULL;
        if (rc != DLOCK_OK) {
            snprintf(why, cap, "%s", dlock_errmsg());
            break;
        }
        for (size_t i = 0; i < page.n; i++)
            add_lock(fam, lab, s->label, &page.locks[i]);
        count += (long long)page.n;
        if (page.next && !(cursor = strdup(page.next))) {
            snprintf(why, cap, "out of memory");
            rc = DLOCK_ENOMEM;
        }
        dlock_list_clear(&page);
    } while (rc == DLOCK_OK && cursor && ++pages < MAX_PAGES);
    if (rc == DLOCK_OK && cursor) {
        snprintf(why, cap, "%s: the listing did not end after %d pages",
                 s->uri, MAX_PAGES);
        rc = DLOCK_EPROTO;
    }
    free(cursor);
    if (rc != DLOCK_OK) {
        for (int f = 0; f <= F_TOKEN; f++)
            if (!fam[f].oom) {
                fam[f].len = mark[f];
                if (fam[f].p)
                    fam[f].p[mark[f]] = '\0';
            }
        return rc == RC_DEADLINE ? -2 : -1;
    }
    return count;
}

/* Logs a store's change of state (up to down, down to up) once, however
 * many scrapes run at once. */
static void note_state(xstore *s, int up, const char *why)
{
    int was = atomic_exchange(&s->up, up);

    if (was == up)
        return;
    if (up)
        fprintf(stderr, "dlock exporter: %s: listing works%s\n", s->uri,
                was == 0 ? " again" : "");
    else {
        /* why quotes the store's or a server's words: escaped */
        fprintf(stderr, "dlock exporter: %s: listing failed: ", s->uri);
        cli_term_str(stderr, why);
        fputc('\n', stderr);
    }
}

/* The whole answer to GET /metrics, in *out (malloc'ed); 0, or -1 when
 * memory ran out. *cut is set when a store's listing stopped at the
 * deadline (the answer is then for the scrapes that asked, not kept). */
static int scrape(exporter *ex, int64_t deadline_us, sbuf *out, int *cut)
{
    sbuf fam[F_COUNT], lab = {0};
    int rc = 0;

    memset(fam, 0, sizeof(fam));
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < ex->n; i++) {
        xstore *s = &ex->stores[i];
        char why[512] = "";
        int64_t t0 = mono_us();
        long long n =
            scrape_store(ex, s, fam, &lab, deadline_us, why, sizeof(why));
        double took = (double)(mono_us() - t0) / 1e6;

        if (n == -2)
            *cut = 1;
        if (n < 0)
            atomic_fetch_add(&s->errors, 1);
        note_state(s, n >= 0, why);
        lab.len = 0;
        sb_labels(&lab, s->label, NULL);
        if (lab.oom)
            rc = -1;
        sb_series(&fam[F_UP], F_UP, &lab);
        sb_str(&fam[F_UP], n >= 0 ? "1\n" : "0\n");
        sb_series(&fam[F_DURATION], F_DURATION, &lab);
        sb_printf(&fam[F_DURATION], "%.6f\n", took);
        if (n >= 0) {
            sb_series(&fam[F_LOCKS], F_LOCKS, &lab);
            sb_printf(&fam[F_LOCKS], "%lld\n", n);
        }
        sb_series(&fam[F_ERRORS], F_ERRORS, &lab);
        sb_printf(&fam[F_ERRORS], "%llu\n",
                  (unsigned long long)atomic_load(&s->errors));
        sb_series(&fam[F_LISTINGS], F_LISTINGS, &lab);
        sb_printf(&fam[F_LISTINGS], "%llu\n",
                  (unsigned long long)atomic_load(&s->listings));
    }
    free(lab.p);
    /* each family's lines together, after its HELP and TYPE; a family
     * without a series (no lock has a lease) is left out whole */
    for (int f = 0; f < F_COUNT; f++) {
        if (fam[f].oom)
            rc = -1;
        if (fam[f].len == 0)
            continue;
        sb_printf(out, "# HELP %s ", families[f].name);
        sb_str(out, families[f].help);
        sb_printf(out, "\n# TYPE %s %s\n", families[f].name,
                  families[f].type);
        sb_add(out, fam[f].p, fam[f].len);
    }
    for (int f = 0; f < F_COUNT; f++)
        free(fam[f].p);
    if (out->oom || rc) {
        free(out->p);
        memset(out, 0, sizeof(*out));
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The store label                                                          */
/* ------------------------------------------------------------------------ */

/* Query parameters that say which locks of a server a store is (and hold
 * nothing secret): the rest (TLS files, timeouts, ...) stays out of the
 * label. */
static const char *const label_params[] = {"prefix", "table", "db",
                                           "mode",   "private", "host"};

/*
 * The label a store's series carry: its URI (already without password)
 * without the user name, and without the query parameters that are not
 * in label_params. Text before the last '@' of a network store's path (a
 * password that was not percent-escaped, taken for a path) becomes "***"
 * (not in file://, unix:// and sqlite:// paths, which are file names).
 * NULL: out of memory.
 */
static char *store_label(const char *uri)
{
    size_t n = strlen(uri);
    const char *q = strchr(uri, '?'), *end = q ? q : uri + n;
    const char *sep = strstr(uri, "://");
    char *out = malloc(n + 8), *o = out;

    if (!out)
        return NULL;
    if (sep && sep < end) {
        const char *auth = sep + 3, *at = NULL, *path, *pat = NULL;
        size_t al = strcspn(auth, "/?");
        size_t sl = (size_t)(sep - uri);
        /* stores whose path is a file's: no password can hide there */
        int file = (sl == 4 && (!strncasecmp(uri, "file", 4) ||
                                !strncasecmp(uri, "unix", 4))) ||
                   (sl == 6 && !strncasecmp(uri, "sqlite", 6));

        for (size_t i = 0; i < al; i++)
            if (auth[i] == '@')
                at = auth + i;
        memcpy(o, uri, (size_t)(auth - uri));
        o += auth - uri;
        if (at) {
            memcpy(o, at + 1, (size_t)(auth + al - at - 1));
            o += auth + al - at - 1;
        } else {
            memcpy(o, auth, al);
            o += al;
        }
        path = auth + al;
        for (const char *p = path; !file && p < end; p++)
            if (*p == '@')
                pat = p;
        if (pat) {
            memcpy(o, "/***", 4);
            o += 4;
            path = pat;
        }
        memcpy(o, path, (size_t)(end - path));
        o += end - path;
    } else {
        memcpy(o, uri, (size_t)(end - uri));
        o += end - uri;
    }
    if (q) {
        char lead = '?';
        for (const char *p = q + 1; *p;) {
            size_t pl = strcspn(p, "&"), kl = strcspn(p, "=&");
            for (size_t i = 0; i < sizeof(label_params) / sizeof(*label_params);
                 i++) {
                if (strlen(label_params[i]) == kl &&
                    !strncmp(p, label_params[i], kl)) {
                    *o++ = lead;
                    memcpy(o, p, pl);
                    o += pl;
                    lead = '&';
                }
            }
            p += pl;
            if (*p == '&')
                p++;
        }
    }
    *o = '\0';
    return out;
}

/* ------------------------------------------------------------------------ */
/* The cache and the listing thread                                         */
/* ------------------------------------------------------------------------ */

static void body_unref(body *b)
{
    if (b && atomic_fetch_sub(&b->refs, 1) == 1) {
        free(b->p);
        free(b);
    }
}

/* Wakes every suspended scrape: libmicrohttpd calls on_request() again for
 * each, which answers from ex->cur. With ex->mu held. */
static void resume_waiters(exporter *ex)
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

/* The listing thread: one listing at a time, when a scrape finds no fresh
 * answer; then the answer replaces ex->cur and the waiters are woken. */
static void *lister(void *arg)
{
    exporter *ex = arg;

    pthread_mutex_lock(&ex->mu);
    for (;;) {
        int64_t deadline, t0;
        sbuf out;
        body *b, *old;
        int cut = 0, rc;

        while (!ex->want && !ex->stopping)
            pthread_cond_wait(&ex->cv, &ex->mu);
        if (ex->stopping)
            break;
        ex->want = 0;
        ex->busy = 1;
        deadline = ex->want_deadline;
        pthread_mutex_unlock(&ex->mu);

        t0 = mono_us();
        rc = scrape(ex, deadline, &out, &cut);
        b = calloc(1, sizeof(*b));
        if (b) {
            atomic_init(&b->refs, 1);
            if (rc == 0) {
                b->p = out.p;
                b->len = out.len;
                out.p = NULL;
            }
        }
        if (rc == 0)
            free(out.p);

        pthread_mutex_lock(&ex->mu);
        old = ex->cur;
        ex->cur = b; /* NULL (no memory): the waiters get a 500 */
        ex->gen++;
        /* a listing stopped by one scrape's deadline answers the scrapes
         * that waited for it, not later ones */
        ex->fresh_until = (b && b->p && !cut) ? t0 + ex->ttl_us : 0;
        ex->busy = 0;
        resume_waiters(ex);
        body_unref(old);
    }
    resume_waiters(ex); /* they answer 503: the exporter is stopping */
    pthread_mutex_unlock(&ex->mu);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* HTTP                                                                     */
/* ------------------------------------------------------------------------ */

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

    body_unref(s->b);
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
        body_unref(b);
        return reply(ex, conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain",
                     "out of memory\n");
    }
    if (!(s = malloc(sizeof(*s)))) {
        body_unref(b);
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

/* ------------------------------------------------------------------------ */
/* Start and stop                                                           */
/* ------------------------------------------------------------------------ */

/* Splits "host:port", "[v6]:port" or ":port" into host (may be "") and
 * port, in buf. Returns 0, or -1 after a message. */
static int split_listen(const char *s, char *buf, size_t cap,
                        const char **host, const char **port)
{
    char *colon, *end;
    unsigned long p;

    if (strlen(s) >= cap) {
        cli_err("exporter: --listen '%s' is too long", s);
        return -1;
    }
    strcpy(buf, s);
    if (buf[0] == '[') {
        char *close = strchr(buf, ']');
        if (!close || close[1] != ':') {
            cli_err("exporter: --listen wants [ADDRESS]:PORT for IPv6, "
                    "not '%s'",
                    s);
            return -1;
        }
        *close = '\0';
        *host = buf + 1;
        colon = close + 1;
    } else {
        colon = strrchr(buf, ':');
        if (!colon || strchr(buf, ':') != colon) {
            cli_err("exporter: --listen wants ADDRESS:PORT (e.g. "
                    "127.0.0.1:9464, [::1]:9464, :9464), not '%s'",
                    s);
            return -1;
        }
        *colon = '\0';
        *host = buf;
    }
    *port = colon + 1;
    errno = 0;
    p = strtoul(*port, &end, 10);
    if (**port < '0' || **port > '9' || *end || errno || p > 65535) {
        cli_err("exporter: --listen: the port must be a number from 0 to "
                "65535, not '%s'",
                *port);
        return -1;
    }
    return 0;
}

/* Starts libmicrohttpd on host:port; NULL after a message. */
static struct MHD_Daemon *start_http(exporter *ex, const char *host,
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

static void close_stores(exporter *ex)
{
    for (size_t i = 0; i < ex->n; i++) {
        dlock_client_close(ex->stores[i].c);
        free(ex->stores[i].label);
    }
    free(ex->stores);
}

/* A count option from lo to hi; 0, or -1 after a message. */
static int count_opt(const char *name, const char *v, unsigned long lo,
                     unsigned long hi, unsigned *out)
{
    char *end;
    unsigned long n;

    errno = 0;
    n = strtoul(v, &end, 10);
    if (v[0] < '0' || v[0] > '9' || *end || errno || n < lo || n > hi) {
        cli_err("exporter: %s wants a number from %lu to %lu, not '%s'",
                name, lo, hi, v);
        return -1;
    }
    *out = (unsigned)n;
    return 0;
}

int cmd_exporter(int argc, char **argv)
{
    const char *listen = NULL, *timeout = NULL, *page = NULL, *v, *host,
               *port, *webcfg = NULL, *ttl = NULL, *idle = NULL,
               *cmax = NULL, *cip = NULL;
    const char **uris;
    size_t nuris = 0;
    dlock_client_options copts = {0};
    exporter ex = {0};
    struct MHD_Daemon *d;
    const union MHD_DaemonInfo *info;
    char lbuf[300];
    sigset_t stop;
    pthread_t lister_tid;
    int64_t ms;
    int r, sig = 0, dual = 0, rc = CLI_EX_USAGE;

    /* every --store, in order (at most argc of them) */
    uris = calloc((size_t)argc, sizeof(*uris));
    if (!uris) {
        cli_err("out of memory");
        return CLI_EX_SOFTWARE;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(exporter_usage, stdout);
            free(uris);
            return 0;
        }
        if (!strcmp(argv[i], "--all")) {
            ex.flags |= DLOCK_LIST_FREE;
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--store", &v)) != 0) {
            if (r < 0)
                goto usage;
            uris[nuris++] = v;
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--listen", &listen)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--web.listen-address",
                               &listen)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--prefix", &ex.prefix)) !=
                0 ||
            (r = cli_opt_value(argc, argv, &i, "--timeout", &timeout)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--page", &page)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--web.config.file",
                               &webcfg)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--cache-ttl", &ttl)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--http-timeout", &idle)) !=
                0 ||
            (r = cli_opt_value(argc, argv, &i, "--max-connections-per-ip",
                               &cip)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--max-connections",
                               &cmax)) != 0) {
            if (r < 0)
                goto usage;
            continue;
        }
        cli_err("exporter: unknown argument '%s' (try dlock help exporter)",
                argv[i]);
        goto usage;
    }
    if (!listen) {
        cli_err("exporter: --listen ADDR:PORT is required (e.g. "
                "--listen 127.0.0.1:9464)");
        goto usage;
    }
    if (split_listen(listen, lbuf, sizeof(lbuf), &host, &port) != 0)
        goto usage;
    if (timeout && (cli_parse_duration(timeout, &copts.timeout_ms, 0) != 0 ||
                    copts.timeout_ms <= 0)) {
        cli_err("exporter: --timeout wants a duration such as 500ms or 2s, "
                "not '%s'",
                timeout);
        goto usage;
    }
    ex.ttl_us = (int64_t)CACHE_TTL_MS * 1000;
    if (ttl) {
        if (cli_parse_duration(ttl, &ms, 0) != 0 || ms < 0 ||
            ms > 86400000) {
            cli_err("exporter: --cache-ttl wants a duration from 0 to 24h "
                    "such as 5s, not '%s'",
                    ttl);
            goto usage;
        }
        ex.ttl_us = ms * 1000;
    }
    ex.idle_s = HTTP_IDLE_S;
    if (idle) {
        if (cli_parse_duration(idle, &ms, 0) != 0 || ms < 1000 ||
            ms > 3600000 || ms % 1000) {
            cli_err("exporter: --http-timeout wants whole seconds from 1s "
                    "to 1h, not '%s'",
                    idle);
            goto usage;
        }
        ex.idle_s = (unsigned)(ms / 1000);
    }
    ex.conn_max = HTTP_CONN_MAX;
    ex.conn_per_ip = HTTP_CONN_PER_IP;
    if ((cmax && count_opt("--max-connections", cmax, HTTP_THREADS, 65536,
                           &ex.conn_max) != 0) ||
        (cip && count_opt("--max-connections-per-ip", cip, 1, 65536,
                          &ex.conn_per_ip) != 0))
        goto usage;
    if (ex.conn_per_ip > ex.conn_max)
        ex.conn_per_ip = ex.conn_max;
    ex.page = PAGE_LIMIT;
    if (page) {
        unsigned pv;

        if (count_opt("--page", page, 1, 10000, &pv) != 0)
            goto usage;
        ex.page = pv;
    }
    if (ex.prefix && strlen(ex.prefix) > DLOCK_NAME_MAX) {
        cli_err("exporter: the prefix is longer than a lock name may be "
                "(%d bytes)",
                DLOCK_NAME_MAX);
        goto usage;
    }
    if (webcfg && web_config_load(webcfg, &ex.web) != 0)
        goto usage;
    if (nuris == 0)
        uris[nuris++] = NULL; /* $DLOCK_STORE, else the file store */

    /* SIGTERM and SIGINT are blocked in every thread (the clients', the
     * lister's and libmicrohttpd's inherit the mask), so only sigwait()
     * below takes them; a write to a scraper that went away must not kill
     * us */
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    ex.stores = calloc(nuris, sizeof(*ex.stores));
    if (!ex.stores) {
        cli_err("out of memory");
        rc = CLI_EX_SOFTWARE;
        goto usage;
    }
    for (size_t i = 0; i < nuris; i++) {
        xstore *s = &ex.stores[i];
        int orc = dlock_client_open(&s->c, uris[i], &copts);

        if (orc != DLOCK_OK) {
            cli_err("%s", dlock_errmsg());
            rc = cli_exit_for(orc) == CLI_EX_USAGE ? CLI_EX_USAGE
                                                   : CLI_EX_UNAVAILABLE;
            goto out_stores;
        }
        ex.n = i + 1;
        s->uri = dlock_client_store(s->c);
        if (!(s->label = store_label(s->uri))) {
            cli_err("out of memory");
            rc = CLI_EX_SOFTWARE;
            goto out_stores;
        }
        atomic_init(&s->errors, 0);
        atomic_init(&s->listings, 0);
        atomic_init(&s->up, -1);
        for (size_t j = 0; j < i; j++) {
            if (!strcmp(ex.stores[j].uri, s->uri)) {
                cli_err("exporter: store %s is given twice", s->uri);
                goto out_stores;
            }
            if (!strcmp(ex.stores[j].label, s->label)) {
                cli_err("exporter: stores %s and %s would share the label "
                        "store=\"%s\" (it keeps only the parameters "
                        "prefix, table, db, mode, private and host)",
                        ex.stores[j].uri, s->uri, s->label);
                goto out_stores;
            }
        }
    }
    free(uris);
    uris = NULL;

    pthread_mutex_init(&ex.mu, NULL);
    pthread_mutex_init(&ex.logmu, NULL);
    pthread_cond_init(&ex.cv, NULL);
    if (pthread_create(&lister_tid, NULL, lister, &ex) != 0) {
        cli_err("exporter: cannot start a thread");
        rc = CLI_EX_SOFTWARE;
        goto out_sync;
    }
    d = start_http(&ex, host, port, &dual);
    if (!d) {
        rc = CLI_EX_UNAVAILABLE;
        goto out_lister;
    }
    info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    if (!*host) /* every address: IPv6 and IPv4, or IPv4 alone */
        host = dual ? "::" : "0.0.0.0";
    printf("dlock exporter: listening on %s://%s%s%s:%u/metrics\n",
           ex.web.cert_pem ? "https" : "http", strchr(host, ':') ? "[" : "",
           host, strchr(host, ':') ? "]" : "",
           info ? (unsigned)info->port : 0u);
    for (size_t i = 0; i < ex.n; i++)
        printf("dlock exporter: store %s\n", ex.stores[i].uri);
    fflush(stdout);

    if (sigwait(&stop, &sig) != 0) /* only EINVAL: a bad set, not here */
        cli_err("exporter: sigwait failed; stopping");
    fprintf(stderr, "dlock exporter: %s: stopping\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
    /* the lister first: it ends its listing (bounded by its deadline) and
     * resumes every waiting scrape, so that none is left suspended when
     * libmicrohttpd stops (running requests finish first) */
out_lister:
    pthread_mutex_lock(&ex.mu);
    ex.stopping = 1;
    pthread_cond_signal(&ex.cv);
    pthread_mutex_unlock(&ex.mu);
    pthread_join(lister_tid, NULL);
    if (d)
        MHD_stop_daemon(d);
out_sync:
    body_unref(ex.cur);
    pthread_cond_destroy(&ex.cv);
    pthread_mutex_destroy(&ex.mu);
    pthread_mutex_destroy(&ex.logmu);
out_stores:
    close_stores(&ex);
usage:
    free(uris);
    web_config_free(&ex.web);
    return rc;
}

#endif /* DLOCK_CLI_HAVE_MHD */
