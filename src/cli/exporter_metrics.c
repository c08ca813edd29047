/* SPDX-License-Identifier: MIT */
/*
 * exporter_metrics.c -- `dlock exporter`'s listing of its stores as the
 * Prometheus text format (0.0.4): the families, the label escaping, the
 * store label.
 *
 * For each store, in the order given, a listing walks dlock_list() page by
 * page on the client opened for that store at start (the library
 * reconnects it after an outage), and writes one series per lock and
 * family, then the exporter's own health per store. The listing thread
 * (exporter_cache.c) runs it; nothing here waits on anything but a store.
 */
#include "cli.h"
#include "exporter.h"

#include <dlock.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Pages per store and scrape: ends a walk over a store whose cursor never
 * ends (a bug), far past any real store (10,000,000 locks). */
#define MAX_PAGES 10000
/* scrape_store()'s rc when the deadline stopped it (not a DLOCK_E*) */
#define RC_DEADLINE 1

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
        fam[F_HELD].oom = 1; /* reported by exporter_scrape() */
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

/* The whole answer to GET /metrics (exporter.h). */
int exporter_scrape(exporter *ex, int64_t deadline_us, char **text,
                    size_t *len, int *cut)
{
    sbuf fam[F_COUNT], lab = {0}, out = {0};
    int rc = 0;

    memset(fam, 0, sizeof(fam));
    *text = NULL;
    *len = 0;
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
        sb_printf(&out, "# HELP %s ", families[f].name);
        sb_str(&out, families[f].help);
        sb_printf(&out, "\n# TYPE %s %s\n", families[f].name,
                  families[f].type);
        sb_add(&out, fam[f].p, fam[f].len);
    }
    for (int f = 0; f < F_COUNT; f++)
        free(fam[f].p);
    if (out.oom || rc) {
        free(out.p);
        return -1;
    }
    *text = out.p;
    *len = out.len;
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
 * exporter_store_label(): the label a store's series carry, its URI
 * (already without password) without the user name, and without the
 * query parameters that are not in label_params. Text before the last
 * '@' of a network store's path (a password that was not percent-escaped,
 * taken for a path) becomes "***" (not in file://, unix:// and sqlite://
 * paths, which are file names). NULL: out of memory.
 */
char *exporter_store_label(const char *uri)
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

