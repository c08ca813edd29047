/* SPDX-License-Identifier: MIT */
/*
 * cmd_exporter.c -- `dlock exporter --listen ADDR:PORT [--store URI]...
 * [--prefix P] [--all] [--timeout DUR]`: the locks of one or more stores
 * as Prometheus metrics, over HTTP (GET /metrics).
 *
 * What a scrape does: for each store, in the order given, it walks
 * dlock_list() page by page on the client opened for that store at start
 * (the library reconnects it after an outage), and writes one series per
 * lock and family, then the exporter's own health per store. Nothing is
 * cached between scrapes: what Prometheus stores is what the stores said
 * during that scrape.
 *
 * HTTP is libmicrohttpd's: a pool of its threads waits on the listening
 * socket and the connections (epoll, poll or select, as it picks) and
 * calls on_request(); the exporter has no loop of its own. Several
 * Prometheus servers may scrape at once: each request builds its own
 * buffer, a dlock_client may be used from any thread, and the per-store
 * counters are atomics. The main thread only waits for SIGTERM or SIGINT
 * (sigwait), then stops the daemon, which lets running requests finish,
 * and closes the clients.
 *
 * Without libmicrohttpd at build time (DLOCK_CLI_HAVE_MHD undefined) the
 * command exists and says which package it needs.
 */
#include "cli.h"

#include <dlock.h>

#include <stdio.h>
#include <string.h>

static const char exporter_usage[] =
    "usage: dlock exporter --listen ADDR:PORT [--store URI]... [--prefix P]\n"
    "                      [--all] [--timeout DUR] [--page N]\n"
    "\n"
    "Serves the locks of the stores as Prometheus metrics on\n"
    "http://ADDR:PORT/metrics (text format 0.0.4). Each scrape lists every\n"
    "lock of every store (dlock list); per lock: dlock_lock_held,\n"
    "dlock_lock_lease_seconds, dlock_lock_hold_age_seconds,\n"
    "dlock_lock_waiters, dlock_lock_holders, dlock_lock_token (labels store,\n"
    "lock); per store: dlock_exporter_up, dlock_exporter_scrape_duration_\n"
    "seconds, dlock_exporter_locks, dlock_exporter_scrape_errors_total.\n"
    "\n"
    "  --listen ADDR:PORT  where to listen: 127.0.0.1:9464, [::1]:9464,\n"
    "                      :9464 (every address); port 0 picks a free one\n"
    "                      (printed at start)\n"
    "  --store URI         a store to list (repeat for several; default:\n"
    "                      $DLOCK_STORE, else the file store)\n"
    "  --prefix P          only lock names that start with the bytes P\n"
    "  --all               also free locks the store still keeps\n"
    "  --timeout DUR       longest store round trip (default 2s)\n"
    "  --page N            locks per store round trip (1..10000, default\n"
    "                      1000): larger walks big stores in fewer, longer\n"
    "                      store operations\n"
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

#if MHD_VERSION >= 0x00097002
typedef enum MHD_Result mhd_result;
#else
typedef int mhd_result;
#endif

/* libmicrohttpd threads serving requests: this many scrapes run at once
 * (more wait in the listening socket's backlog). Four is several
 * Prometheus servers (an HA pair, a test one) with room to spare; each
 * scrape mostly waits on its stores. */
#define HTTP_THREADS 4
/* Open connections at most, and how long an idle one stays open (s): above
 * Prometheus' usual scrape intervals (15 s to 1 min), so its keep-alive
 * connection is reused from one scrape to the next. */
#define HTTP_CONN_MAX 64
#define HTTP_IDLE_S 120
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

#define CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* One store the exporter lists. */
typedef struct xstore {
    dlock_client *c;
    const char *label;           /* dlock_client_store(c): no password */
    atomic_uint_fast64_t errors; /* failed scrapes of this store */
    atomic_int up;               /* the last scrape's outcome (-1: none) */
} xstore;

typedef struct exporter {
    xstore *stores;
    size_t n;
    const char *prefix;
    unsigned flags;
    size_t page; /* locks per dlock_list() call */
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
     "Scrapes that failed to list the store's locks, since the exporter "
     "started."},
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
 * partial listing) with the reason in why. */
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
    do {
        dlock_list_page page;

        if (deadline_us && mono_us() >= deadline_us) {
            snprintf(why, cap,
                     "%s: stopped listing: Prometheus' scrape timeout is "
                     "near (%lld locks listed so far)",
                     s->label, count);
            rc = DLOCK_ECONN;
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
                 s->label, MAX_PAGES);
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
        return -1;
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
        fprintf(stderr, "dlock exporter: %s: listing works%s\n", s->label,
                was == 0 ? " again" : "");
    else
        fprintf(stderr, "dlock exporter: %s: listing failed: %s\n",
                s->label, why);
}

/* The whole answer to GET /metrics, in *out (malloc'ed); 0, or -1 when
 * memory ran out. */
static int scrape(exporter *ex, int64_t deadline_us, sbuf *out)
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
/* HTTP                                                                     */
/* ------------------------------------------------------------------------ */

static const char index_page[] =
    "<!DOCTYPE html>\n<html><head><title>dlock exporter</title></head>\n"
    "<body><h1>dlock exporter</h1>\n"
    "<p>The locks of this exporter's stores, as Prometheus metrics: "
    "<a href=\"/metrics\">/metrics</a>.</p></body></html>\n";

static mhd_result reply(struct MHD_Connection *conn, unsigned status,
                        const char *type, char *body, size_t len,
                        enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(len, body, mode);
    mhd_result ok;

    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO; /* libmicrohttpd closes the connection */
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    ok = MHD_queue_response(conn, status, r);
    MHD_destroy_response(r);
    return ok;
}

/* The scrape's deadline from Prometheus' timeout header (0: none). */
static int64_t deadline_of(struct MHD_Connection *conn)
{
    const char *h = MHD_lookup_connection_value(
        conn, MHD_HEADER_KIND, "X-Prometheus-Scrape-Timeout-Seconds");
    char *end;
    double s;

    if (!h)
        return 0;
    errno = 0;
    s = strtod(h, &end);
    if (end == h || errno || !(s > 0) || s > 86400)
        return 0;
    return mono_us() + (int64_t)(s * SCRAPE_BUDGET * 1e6);
}

static mhd_result on_request(void *cls, struct MHD_Connection *conn,
                             const char *url, const char *method,
                             const char *version, const char *upload_data,
                             size_t *upload_data_size, void **req_cls)
{
    static int seen; /* a marker: its address tags a request's first call */
    exporter *ex = cls;
    static const char not_found[] = "not found: see /metrics\n";
    static const char bad_method[] = "only GET and HEAD\n";
    sbuf body;

    (void)version;
    (void)upload_data;
    if (*req_cls == NULL) { /* the headers are in: wait for the end */
        *req_cls = &seen;
        return MHD_YES;
    }
    if (*upload_data_size) { /* a body: read and dropped */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (strcmp(method, MHD_HTTP_METHOD_GET) &&
        strcmp(method, MHD_HTTP_METHOD_HEAD))
        return reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain",
                     (char *)bad_method, sizeof(bad_method) - 1,
                     MHD_RESPMEM_PERSISTENT);
    if (!strcmp(url, "/"))
        return reply(conn, MHD_HTTP_OK, "text/html; charset=utf-8",
                     (char *)index_page, sizeof(index_page) - 1,
                     MHD_RESPMEM_PERSISTENT);
    if (strcmp(url, "/metrics"))
        return reply(conn, MHD_HTTP_NOT_FOUND, "text/plain",
                     (char *)not_found, sizeof(not_found) - 1,
                     MHD_RESPMEM_PERSISTENT);
    if (scrape(ex, deadline_of(conn), &body) != 0) {
        static const char oom[] = "out of memory\n";
        return reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "text/plain",
                     (char *)oom, sizeof(oom) - 1, MHD_RESPMEM_PERSISTENT);
    }
    return reply(conn, MHD_HTTP_OK, CONTENT_TYPE, body.p, body.len,
                 MHD_RESPMEM_MUST_FREE);
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
    unsigned flags = MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ERROR_LOG;
    struct MHD_Daemon *d;
    struct addrinfo hints, *ai = NULL;
    uint16_t pnum = (uint16_t)strtoul(port, NULL, 10);
    int rc;

    if (!*host) { /* every address: IPv6 and IPv4 on one socket */
        d = MHD_start_daemon(flags | MHD_USE_DUAL_STACK, pnum, NULL, NULL,
                             on_request, ex, MHD_OPTION_THREAD_POOL_SIZE,
                             (unsigned)HTTP_THREADS,
                             MHD_OPTION_CONNECTION_LIMIT,
                             (unsigned)HTTP_CONN_MAX,
                             MHD_OPTION_CONNECTION_TIMEOUT,
                             (unsigned)HTTP_IDLE_S, MHD_OPTION_END);
        *dual = d != NULL;
        if (!d) /* a host without IPv6 */
            d = MHD_start_daemon(flags, pnum, NULL, NULL, on_request, ex,
                                 MHD_OPTION_THREAD_POOL_SIZE,
                                 (unsigned)HTTP_THREADS,
                                 MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned)HTTP_CONN_MAX,
                                 MHD_OPTION_CONNECTION_TIMEOUT,
                                 (unsigned)HTTP_IDLE_S, MHD_OPTION_END);
        if (!d)
            cli_err("exporter: cannot listen on port %s (in use?)", port);
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
                         MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                         MHD_OPTION_THREAD_POOL_SIZE, (unsigned)HTTP_THREADS,
                         MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_CONN_MAX,
                         MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_IDLE_S,
                         MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d)
        cli_err("exporter: cannot listen on %s:%s (in use, or not an "
                "address of this host?)",
                host, port);
    return d;
}

static void close_stores(exporter *ex)
{
    for (size_t i = 0; i < ex->n; i++)
        dlock_client_close(ex->stores[i].c);
    free(ex->stores);
}

int cmd_exporter(int argc, char **argv)
{
    const char *listen = NULL, *timeout = NULL, *page = NULL, *v, *host,
               *port;
    const char **uris;
    size_t nuris = 0;
    dlock_client_options copts = {0};
    exporter ex = {0};
    struct MHD_Daemon *d;
    const union MHD_DaemonInfo *info;
    char lbuf[300];
    sigset_t stop;
    int r, sig = 0, dual = 0;

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
            (r = cli_opt_value(argc, argv, &i, "--prefix", &ex.prefix)) !=
                0 ||
            (r = cli_opt_value(argc, argv, &i, "--timeout", &timeout)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--page", &page)) != 0) {
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
    ex.page = PAGE_LIMIT;
    if (page) {
        char *end;
        unsigned long pv;

        errno = 0;
        pv = strtoul(page, &end, 10);
        if (page[0] < '0' || page[0] > '9' || *end || errno || pv < 1 ||
            pv > 10000) {
            cli_err("exporter: --page wants a number from 1 to 10000, not "
                    "'%s'",
                    page);
            goto usage;
        }
        ex.page = pv;
    }
    if (ex.prefix && strlen(ex.prefix) > DLOCK_NAME_MAX) {
        cli_err("exporter: the prefix is longer than a lock name may be "
                "(%d bytes)",
                DLOCK_NAME_MAX);
        goto usage;
    }
    if (nuris == 0)
        uris[nuris++] = NULL; /* $DLOCK_STORE, else the file store */

    /* SIGTERM and SIGINT are blocked in every thread (the clients' and
     * libmicrohttpd's inherit the mask), so only sigwait() below takes
     * them; a write to a scraper that went away must not kill us */
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    ex.stores = calloc(nuris, sizeof(*ex.stores));
    if (!ex.stores) {
        cli_err("out of memory");
        free(uris);
        return CLI_EX_SOFTWARE;
    }
    for (size_t i = 0; i < nuris; i++) {
        xstore *s = &ex.stores[i];
        int rc = dlock_client_open(&s->c, uris[i], &copts);

        if (rc != DLOCK_OK) {
            cli_err("%s", dlock_errmsg());
            close_stores(&ex);
            free(uris);
            return cli_exit_for(rc) == CLI_EX_USAGE ? CLI_EX_USAGE
                                                    : CLI_EX_UNAVAILABLE;
        }
        ex.n = i + 1;
        s->label = dlock_client_store(s->c);
        atomic_init(&s->errors, 0);
        atomic_init(&s->up, -1);
        for (size_t j = 0; j < i; j++) {
            if (!strcmp(ex.stores[j].label, s->label)) {
                cli_err("exporter: store %s is given twice", s->label);
                close_stores(&ex);
                free(uris);
                return CLI_EX_USAGE;
            }
        }
    }
    free(uris);

    d = start_http(&ex, host, port, &dual);
    if (!d) {
        close_stores(&ex);
        return CLI_EX_UNAVAILABLE;
    }
    info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    if (!*host) /* every address: IPv6 and IPv4, or IPv4 alone */
        host = dual ? "::" : "0.0.0.0";
    printf("dlock exporter: listening on http://%s%s%s:%u/metrics\n",
           strchr(host, ':') ? "[" : "", host, strchr(host, ':') ? "]" : "",
           info ? (unsigned)info->port : 0u);
    for (size_t i = 0; i < ex.n; i++)
        printf("dlock exporter: store %s\n", ex.stores[i].label);
    fflush(stdout);

    if (sigwait(&stop, &sig) != 0) /* only EINVAL: a bad set, not here */
        cli_err("exporter: sigwait failed; stopping");
    fprintf(stderr, "dlock exporter: %s: stopping\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    MHD_stop_daemon(d); /* running requests finish first */
    close_stores(&ex);
    return 0;

usage:
    free(uris);
    return CLI_EX_USAGE;
}

#endif /* DLOCK_CLI_HAVE_MHD */
