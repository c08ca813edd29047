/* SPDX-License-Identifier: MIT */
/*
 * metrics.c -- a client's metrics: the table of per-name slots, the
 * histograms, dlock_stats_get() and the Prometheus text exposition
 * (docs/monitoring.md lists the families; docs/design.md, "Observing",
 * says how the table stays bounded).
 */
#include "internal.h"
#include "buf.h"
#include "hex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_NAMES 100
#define MAX_NAMES 100000

/* upper bounds in microseconds; the last bucket takes the rest */
static const int64_t bounds[DLOCK_HIST_BUCKETS - 1] = {
    100,      250,      500,      1000,     2500,      5000,     10000,
    25000,    50000,    100000,   250000,   500000,    1000000,  2500000,
    5000000,  10000000, 30000000, 60000000, 300000000};

int64_t dlock_hist_bound_us(size_t i)
{
    return i < DLOCK_HIST_BUCKETS - 1 ? bounds[i] : INT64_MAX;
}

int64_t dlock__now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void dlock__hist_observe(dlock__hist *h, int64_t us)
{
    size_t i = 0;

    if (us < 0)
        us = 0;
    while (i < DLOCK_HIST_BUCKETS - 1 && us > bounds[i])
        i++;
    /* two atomics: the count is the buckets' sum, made when read */
    __atomic_fetch_add(&h->b[i], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&h->sum_us, (uint64_t)us, __ATOMIC_RELAXED);
}

void dlock__m_store_op(dlock__metrics *m, int64_t us, int rc)
{
    dlock__hist_observe(&m->store_op, us);
    if (rc < 0 && rc != DLOCK_EBUSY && rc != DLOCK_ENOTHELD && rc > -16)
        __atomic_fetch_add(&m->errors[-rc], 1, __ATOMIC_RELAXED);
}

void dlock__metrics_init(dlock__metrics *m)
{
    memset(m, 0, sizeof(*m));
    m->on = 1;
    m->max_names = DEFAULT_NAMES;
}

void dlock__metrics_free(dlock__metrics *m)
{
    for (size_t i = 0; i < m->nslots; i++) {
        free(m->slots[i]->name);
        free(m->slots[i]);
    }
    free(m->slots);
    m->slots = NULL;
    m->nslots = 0;
}

static uint64_t load(const uint64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static void hist_add(dlock__hist *to, const dlock__hist *from)
{
    to->sum_us += load(&from->sum_us);
    for (size_t i = 0; i < DLOCK_HIST_BUCKETS; i++)
        to->b[i] += load(&from->b[i]);
}

/* s's counts into the aggregate (no writer can reach s: live is 0). */
static void fold(dlock__metrics *m, dlock__mslot *s)
{
    for (int i = 0; i < DLOCK__M_COUNT; i++)
        __atomic_fetch_add(&m->other.c[i], s->c[i], __ATOMIC_RELAXED);
    for (int i = 0; i < DLOCK__H_COUNT; i++) {
        dlock__hist *o = &m->other.h[i];
        __atomic_fetch_add(&o->sum_us, s->h[i].sum_us, __ATOMIC_RELAXED);
        for (size_t b = 0; b < DLOCK_HIST_BUCKETS; b++)
            __atomic_fetch_add(&o->b[b], s->h[i].b[b], __ATOMIC_RELAXED);
    }
}

static uint64_t activity(const dlock__mslot *s)
{
    return s->c[DLOCK__M_ACQUIRED] + s->c[DLOCK__M_BUSY] +
           s->c[DLOCK__M_REENTERED];
}

static int set_name(dlock__mslot *s, const dlock__entry *e)
{
    char *n = malloc(e->len + 1);

    if (!n)
        return -1;
    memcpy(n, e->name, e->len + 1);
    free(s->name);
    s->name = n;
    s->len = e->len;
    s->hash = e->hash;
    return 0;
}

void dlock__metrics_attach(dlock__metrics *m, dlock__entry *e)
{
    dlock__mslot *idle = NULL;

    e->ms = &m->other;
    for (size_t i = 0; i < m->nslots; i++) {
        dlock__mslot *s = m->slots[i];
        if (s->hash == e->hash && s->len == e->len &&
            memcmp(s->name, e->name, e->len) == 0) {
            s->live++;
            e->ms = s;
            return;
        }
        if (s->live == 0 && (!idle || activity(s) < activity(idle)))
            idle = s;
    }
    if (m->nslots < m->max_names) {
        dlock__mslot *s = calloc(1, sizeof(*s));
        dlock__mslot **ns = s ? realloc(m->slots, (m->nslots + 1) *
                                                      sizeof(*ns))
                              : NULL;
        if (!ns || set_name(s, e) != 0) {
            if (ns)
                m->slots = ns;
            free(s);
            return; /* out of memory: counted in the aggregate */
        }
        m->slots = ns;
        m->slots[m->nslots++] = s;
        s->live = 1;
        e->ms = s;
        return;
    }
    if (!idle)
        return; /* every slot has a live name: the aggregate */
    /* The least busy name without a handle gives its slot up. */
    char *keep = idle->name;
    idle->name = NULL;
    fold(m, idle);
    memset(idle, 0, sizeof(*idle));
    idle->name = keep;
    if (set_name(idle, e) != 0) {
        /* the name could not be copied: the slot stays with a name no
         * entry has, counting nothing */
        return;
    }
    idle->live = 1;
    e->ms = idle;
}

void dlock__metrics_detach(dlock__metrics *m, dlock__entry *e)
{
    if (e->ms && e->ms != &m->other && e->ms->live > 0)
        e->ms->live--;
    e->ms = NULL;
}

/* ------------------------------------------------------------------------ */
/* Reading                                                                  */
/* ------------------------------------------------------------------------ */

int dlock_metrics_config(dlock_client *c, int enabled, size_t max_names)
{
    int rc;

    if (!c)
        return dlock__err(DLOCK_EINVAL, "dlock_metrics_config: client is "
                                        "NULL");
    if (max_names > MAX_NAMES)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_metrics_config: max_names must be at most "
                          "%d, not %zu",
                          MAX_NAMES, max_names);
    pthread_mutex_lock(&c->mu);
    rc = dlock__usable(c);
    if (rc == DLOCK_OK) {
        __atomic_store_n(&c->m.on, enabled ? 1 : 0, __ATOMIC_RELAXED);
        c->m.max_names = max_names ? max_names : DEFAULT_NAMES;
    }
    pthread_mutex_unlock(&c->mu);
    return rc;
}

static void to_public(dlock_histogram *out, const dlock__hist *h)
{
    uint64_t acc = 0;

    out->sum_us = load(&h->sum_us);
    for (size_t i = 0; i < DLOCK_HIST_BUCKETS; i++) {
        acc += load(&h->b[i]);
        out->le[i] = acc;
    }
    out->count = acc;
}

/* The per-name part of a snapshot. */
typedef struct snap {
    char *name; /* NULL: the aggregate */
    size_t len;
    uint64_t c[DLOCK__M_COUNT];
    dlock__hist h[DLOCK__H_COUNT];
} snap;

static void snap_of(snap *s, const dlock__mslot *m)
{
    for (int i = 0; i < DLOCK__M_COUNT; i++)
        s->c[i] = load(&m->c[i]);
    memset(s->h, 0, sizeof(s->h));
    for (int i = 0; i < DLOCK__H_COUNT; i++)
        hist_add(&s->h[i], &m->h[i]);
}

static void fill_stats(dlock_stats *st, const snap *s)
{
    st->acquired = s->c[DLOCK__M_ACQUIRED];
    st->reentered = s->c[DLOCK__M_REENTERED];
    st->busy = s->c[DLOCK__M_BUSY];
    st->waited = s->c[DLOCK__M_WAITED];
    st->released = s->c[DLOCK__M_RELEASED];
    st->lost_expired = s->c[DLOCK__M_LOST_EXPIRED];
    st->lost_taken = s->c[DLOCK__M_LOST_TAKEN];
    st->lost_store = s->c[DLOCK__M_LOST_STORE];
    st->renewed = s->c[DLOCK__M_RENEWED];
    st->renew_failed = s->c[DLOCK__M_RENEW_FAILED];
    st->long_holds = s->c[DLOCK__M_LONG_HOLDS];
    to_public(&st->wait, &s->h[DLOCK__H_WAIT]);
    to_public(&st->hold, &s->h[DLOCK__H_HOLD]);
    to_public(&st->handoff, &s->h[DLOCK__H_HANDOFF]);
}

static int64_t count_waiters(const dlock_client *c)
{
    int64_t n = 0;

    for (const dlock__waiter *w = c->waiters; w; w = w->next)
        n++;
    return n;
}

int dlock_stats_get(dlock_client *c, const char *name, dlock_stats *out,
                    size_t size)
{
    dlock_stats st;
    snap s;
    size_t len = 0;
    int rc;

    if (!c || !out)
        return dlock__err(DLOCK_EINVAL, "dlock_stats_get: client or out is "
                                        "NULL");
    if (size < offsetof(dlock_stats, errors))
        return dlock__err(DLOCK_EINVAL,
                          "dlock_stats_get: size %zu is smaller than any "
                          "dlock_stats",
                          size);
    if (name && *name) {
        rc = dlock__check_name(name, &len);
        if (rc)
            return rc;
    }
    memset(&st, 0, sizeof(st));
    memset(&s, 0, sizeof(s));
    pthread_mutex_lock(&c->mu);
    if (!name) {
        snap one;
        snap_of(&s, &c->m.other);
        for (size_t i = 0; i < c->m.nslots; i++) {
            snap_of(&one, c->m.slots[i]);
            for (int k = 0; k < DLOCK__M_COUNT; k++)
                s.c[k] += one.c[k];
            for (int k = 0; k < DLOCK__H_COUNT; k++)
                hist_add(&s.h[k], &one.h[k]);
        }
        for (int i = 0; i < 16; i++)
            st.errors[i] = load(&c->m.errors[i]);
        to_public(&st.store_op, &c->m.store_op);
        st.holds = (int64_t)c->nholds;
        st.waiters = count_waiters(c);
        st.tracked = 1;
    } else if (!*name) {
        snap_of(&s, &c->m.other);
        st.tracked = 1;
    } else {
        uint64_t hash = dlock__hash(name, len);
        for (size_t i = 0; i < c->m.nslots; i++) {
            dlock__mslot *m = c->m.slots[i];
            if (m->name && m->hash == hash && m->len == len &&
                memcmp(m->name, name, len) == 0) {
                snap_of(&s, m);
                st.tracked = 1;
                break;
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    fill_stats(&st, &s);
    memcpy(out, &st, size < sizeof(st) ? size : sizeof(st));
    return DLOCK_OK;
}

/* ------------------------------------------------------------------------ */
/* The Prometheus text exposition format                                    */
/* ------------------------------------------------------------------------ */

/* The length of the well-formed UTF-8 sequence at s[0..n) (1 to 4), or 0
 * when none starts there (Unicode 3.9, table 3-7: no overlong forms, no
 * surrogates, nothing past U+10FFFF). */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0], lo, hi;
    size_t k;

    if (c < 0x80)
        return 1;
    k = c >= 0xc2 && c <= 0xdf   ? 2
        : c >= 0xe0 && c <= 0xef ? 3
        : c >= 0xf0 && c <= 0xf4 ? 4
                                 : 0;
    if (k == 0 || k > n)
        return 0;
    lo = c == 0xe0 ? 0xa0 : c == 0xf0 ? 0x90 : 0x80;
    hi = c == 0xed ? 0x9f : c == 0xf4 ? 0x8f : 0xbf;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < k; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return k;
}

static int utf8_valid(const char *s, size_t n)
{
    for (size_t i = 0, k; i < n; i += k)
        if ((k = utf8_len((const unsigned char *)s + i, n - i)) == 0)
            return 0;
    return 1;
}

/* A label value, escaped as the format says: backslash, double quote and
 * line feed. Prometheus takes only UTF-8 label values (one other fails
 * the whole scrape), so a byte that is not part of well-formed UTF-8 is
 * written as the four characters \xNN (escaped: \\xNN), as `dlock list`
 * and the exporter write it; labels() then adds lock_hex, the name's
 * exact bytes. */
static void put_label(dlock__buf *b, const char *s, size_t n)
{
    size_t run = 0;

    for (size_t i = 0; i < n;) {
        size_t k = utf8_len((const unsigned char *)s + i, n - i);
        char esc[8];

        if (k > 1 || (k == 1 && s[i] != '\\' && s[i] != '"' && s[i] != '\n')) {
            i += k;
            continue;
        }
        dlock__buf_add(b, s + run, i - run);
        if (k == 0)
            snprintf(esc, sizeof(esc), "\\\\x%02x", (unsigned char)s[i]);
        else
            snprintf(esc, sizeof(esc), "\\%c", s[i] == '\n' ? 'n' : s[i]);
        dlock__buf_str(b, esc);
        run = ++i;
    }
    dlock__buf_add(b, s + run, n - run);
}

/* lock_hex="<the name's bytes in hex>", for a name that is not UTF-8. */
static void put_hex_label(dlock__buf *b, const char *s, size_t n)
{
    char hex[2 * 64 + 1];

    dlock__buf_str(b, ",lock_hex=\"");
    for (size_t i = 0, k; i < n; i += k) {
        k = n - i < 64 ? n - i : 64;
        dlock__hex(s + i, k, hex);
        dlock__buf_add(b, hex, 2 * k);
    }
    dlock__buf_str(b, "\"");
}

typedef struct csnap {
    const char *store;
    snap *names; /* the aggregate first */
    size_t n;
    uint64_t errors[16];
    dlock__hist store_op;
    int64_t holds, waiters;
} csnap;

static void labels(dlock__buf *b, const csnap *cs, const snap *s,
                   const char *extra)
{
    dlock__buf_str(b, "{store=\"");
    put_label(b, cs->store, strlen(cs->store));
    dlock__buf_str(b, "\"");
    if (s) {
        dlock__buf_str(b, ",lock=\"");
        if (s->name)
            put_label(b, s->name, s->len);
        dlock__buf_str(b, "\"");
        if (s->name && !utf8_valid(s->name, s->len))
            put_hex_label(b, s->name, s->len);
    }
    if (extra) {
        dlock__buf_str(b, ",");
        dlock__buf_add(b, extra, strlen(extra));
    }
}

static void put_hist(dlock__buf *b, const char *fam, const csnap *cs,
                     const snap *s, const dlock__hist *h)
{
    uint64_t acc = 0;

    for (size_t i = 0; i < DLOCK_HIST_BUCKETS; i++) {
        char le[64];
        acc += h->b[i];
        if (i < DLOCK_HIST_BUCKETS - 1)
            snprintf(le, sizeof(le), "le=\"%g\"", (double)bounds[i] / 1e6);
        else
            snprintf(le, sizeof(le), "le=\"+Inf\"");
        dlock__buf_printf(b, "%s_bucket", fam);
        labels(b, cs, s, le);
        dlock__buf_printf(b, "} %llu\n", (unsigned long long)acc);
    }
    dlock__buf_printf(b, "%s_sum", fam);
    labels(b, cs, s, NULL);
    dlock__buf_printf(b, "} %.6f\n", (double)h->sum_us / 1e6);
    dlock__buf_printf(b, "%s_count", fam);
    labels(b, cs, s, NULL);
    dlock__buf_printf(b, "} %llu\n", (unsigned long long)acc);
}

static const struct {
    const char *name, *help;
    int which;
} counters[] = {
    {"dlock_acquired_total", "Holds taken in the store (outermost).",
     DLOCK__M_ACQUIRED},
    {"dlock_reentered_total",
     "Acquires counted into a hold the thread already had.",
     DLOCK__M_REENTERED},
    {"dlock_busy_total", "Acquires that ended busy (not acquired).",
     DLOCK__M_BUSY},
    {"dlock_waited_total", "Acquires that found the lock held and waited.",
     DLOCK__M_WAITED},
    {"dlock_released_total", "Outermost releases.", DLOCK__M_RELEASED},
    {"dlock_renewed_total", "Lease renewals that succeeded.",
     DLOCK__M_RENEWED},
    {"dlock_renew_failed_total",
     "Lease renewals that failed with a store error.",
     DLOCK__M_RENEW_FAILED},
    {"dlock_long_holds_total",
     "Holds that passed the client's long-hold threshold.",
     DLOCK__M_LONG_HOLDS},
};

static const struct {
    const char *name, *help;
    int which;
} hists[] = {
    {"dlock_wait_seconds", "Time in acquires that waited.", DLOCK__H_WAIT},
    {"dlock_hold_seconds", "Time from acquire to release (outermost).",
     DLOCK__H_HOLD},
    {"dlock_handoff_seconds",
     "From a waiter's wake-up by the store to its acquire returning.",
     DLOCK__H_HANDOFF},
};

/* A gauge of the clients', one series per store: their holds, or
 * (waiters) their waiting threads. */
static void put_gauge(dlock__buf *b, const char *fam, const char *help,
                      const csnap *cs, size_t n, int waiters)
{
    dlock__buf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", fam, help, fam);
    for (size_t k = 0; k < n; k++) {
        dlock__buf_str(b, fam);
        labels(b, &cs[k], NULL, NULL);
        dlock__buf_printf(b, "} %lld\n",
                          (long long)(waiters ? cs[k].waiters : cs[k].holds));
    }
}

static void render(dlock__buf *b, const csnap *cs, size_t n)
{
    static const struct {
        const char *cause;
        int which;
    } causes[] = {{"expired", DLOCK__M_LOST_EXPIRED},
                  {"taken", DLOCK__M_LOST_TAKEN},
                  {"store", DLOCK__M_LOST_STORE}};

    for (size_t f = 0; f < sizeof(counters) / sizeof(counters[0]); f++) {
        dlock__buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n",
                          counters[f].name, counters[f].help,
                          counters[f].name);
        for (size_t k = 0; k < n; k++)
            for (size_t i = 0; i < cs[k].n; i++) {
                dlock__buf_str(b, counters[f].name);
                labels(b, &cs[k], &cs[k].names[i], NULL);
                dlock__buf_printf(b, "} %llu\n",
                                  (unsigned long long)cs[k]
                                      .names[i]
                                      .c[counters[f].which]);
            }
    }
    dlock__buf_str(b, "# HELP dlock_lost_total Holds found lost, by cause.\n"
                      "# TYPE dlock_lost_total counter\n");
    for (size_t k = 0; k < n; k++)
        for (size_t i = 0; i < cs[k].n; i++)
            for (size_t j = 0; j < 3; j++) {
                char extra[32];
                snprintf(extra, sizeof(extra), "cause=\"%s\"",
                         causes[j].cause);
                dlock__buf_str(b, "dlock_lost_total");
                labels(b, &cs[k], &cs[k].names[i], extra);
                dlock__buf_printf(
                    b, "} %llu\n",
                    (unsigned long long)cs[k].names[i].c[causes[j].which]);
            }
    for (size_t f = 0; f < sizeof(hists) / sizeof(hists[0]); f++) {
        dlock__buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n",
                          hists[f].name, hists[f].help, hists[f].name);
        for (size_t k = 0; k < n; k++)
            for (size_t i = 0; i < cs[k].n; i++)
                put_hist(b, hists[f].name, &cs[k], &cs[k].names[i],
                         &cs[k].names[i].h[hists[f].which]);
    }
    dlock__buf_str(b, "# HELP dlock_store_op_seconds One store operation's "
                      "time.\n"
                      "# TYPE dlock_store_op_seconds histogram\n");
    for (size_t k = 0; k < n; k++)
        put_hist(b, "dlock_store_op_seconds", &cs[k], NULL, &cs[k].store_op);
    dlock__buf_str(b, "# HELP dlock_store_errors_total Store errors, by "
                      "code.\n"
                      "# TYPE dlock_store_errors_total counter\n");
    for (size_t k = 0; k < n; k++)
        for (int code = 1; code < 16; code++) {
            /* the store failures always, others once they happened */
            int always = -code == DLOCK_ECONN || -code == DLOCK_EPROTO ||
                         -code == DLOCK_EAUTH;
            if (!always && cs[k].errors[code] == 0)
                continue;
            char extra[64];
            snprintf(extra, sizeof(extra), "code=\"%s\"",
                     dlock_errname(-code));
            dlock__buf_str(b, "dlock_store_errors_total");
            labels(b, &cs[k], NULL, extra);
            dlock__buf_printf(b, "} %llu\n",
                              (unsigned long long)cs[k].errors[code]);
        }
    put_gauge(b, "dlock_holds", "Holds the client has now.", cs, n, 0);
    put_gauge(b, "dlock_waiters", "Threads of the client waiting now.", cs,
              n, 1);
}

static void snap_add(snap *to, const snap *from)
{
    for (int i = 0; i < DLOCK__M_COUNT; i++)
        to->c[i] += from->c[i];
    for (int i = 0; i < DLOCK__H_COUNT; i++)
        hist_add(&to->h[i], &from->h[i]);
}

/* Adds client snapshot `from` into `to` (clients of one store are one
 * set of series: a name in both is summed). 0, or -1 out of memory. */
static int csnap_merge(csnap *to, csnap *from)
{
    snap *grown = realloc(to->names, (to->n + from->n) * sizeof(*grown));

    if (!grown)
        return -1;
    to->names = grown;
    for (size_t i = 0; i < from->n; i++) {
        snap *f = &from->names[i];
        size_t j = 0;
        for (; j < to->n; j++) {
            snap *t = &to->names[j];
            if ((!t->name && !f->name) ||
                (t->name && f->name && t->len == f->len &&
                 memcmp(t->name, f->name, f->len) == 0))
                break;
        }
        if (j < to->n) {
            snap_add(&to->names[j], f);
            free(f->name);
        } else {
            to->names[to->n++] = *f;
        }
        f->name = NULL;
    }
    from->n = 0;
    for (int i = 0; i < 16; i++)
        to->errors[i] += from->errors[i];
    hist_add(&to->store_op, &from->store_op);
    to->holds += from->holds;
    to->waiters += from->waiters;
    return 0;
}

static void csnap_free(csnap *cs, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        for (size_t i = 0; i < cs[k].n; i++)
            free(cs[k].names[i].name);
        free(cs[k].names);
    }
    free(cs);
}

/* Copies client c's metrics (the names with a slot, then the aggregate)
 * into *cs; c->mu held. */
static int take(dlock_client *c, csnap *cs)
{
    cs->store = c->store;
    cs->names = calloc(c->m.nslots + 1, sizeof(*cs->names));
    if (!cs->names)
        return -1;
    snap_of(&cs->names[cs->n++], &c->m.other);
    for (size_t i = 0; i < c->m.nslots; i++) {
        dlock__mslot *m = c->m.slots[i];
        snap *s = &cs->names[cs->n];
        if (!m->name)
            continue;
        s->name = malloc(m->len + 1);
        if (!s->name)
            return -1;
        memcpy(s->name, m->name, m->len + 1);
        s->len = m->len;
        snap_of(s, m);
        cs->n++;
    }
    for (int i = 0; i < 16; i++)
        cs->errors[i] = load(&c->m.errors[i]);
    memset(&cs->store_op, 0, sizeof(cs->store_op));
    hist_add(&cs->store_op, &c->m.store_op);
    cs->holds = (int64_t)c->nholds;
    cs->waiters = count_waiters(c);
    return 0;
}

int dlock_metrics_text(dlock_client *const *clients, size_t n, char **out,
                       size_t *len)
{
    csnap *cs;
    dlock__buf b = DLOCK__BUF_INIT;

    if (out)
        *out = NULL;
    if (len)
        *len = 0;
    if (!out || (n > 0 && !clients))
        return dlock__err(DLOCK_EINVAL, "dlock_metrics_text: out or clients "
                                        "is NULL");
    for (size_t k = 0; k < n; k++)
        if (!clients[k])
            return dlock__err(DLOCK_EINVAL,
                              "dlock_metrics_text: clients[%zu] is NULL", k);
    cs = calloc(n ? n : 1, sizeof(*cs));
    if (!cs)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    for (size_t k = 0; k < n; k++) {
        pthread_mutex_lock(&clients[k]->mu);
        int r = take(clients[k], &cs[k]);
        pthread_mutex_unlock(&clients[k]->mu);
        if (r != 0) {
            csnap_free(cs, n);
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        }
    }
    /* clients of the same store: one set of series */
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        size_t j = 0;
        while (j < m && strcmp(cs[j].store, cs[k].store) != 0)
            j++;
        if (j < m) {
            if (csnap_merge(&cs[j], &cs[k]) != 0) {
                csnap_free(cs, n);
                return dlock__err(DLOCK_ENOMEM, "out of memory");
            }
            continue;
        }
        if (j != k) {
            csnap t = cs[m];
            cs[m] = cs[k];
            cs[k] = t;
        }
        m++;
    }
    dlock__buf_add(&b, "", 0);
    render(&b, cs, m);
    csnap_free(cs, n);
    if (b.failed) {
        dlock__buf_free(&b);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    *out = b.p;
    if (len)
        *len = b.len;
    return DLOCK_OK;
}

void dlock_free(void *p)
{
    free(p);
}
