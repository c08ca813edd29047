/* SPDX-License-Identifier: MIT */
/*
 * check.c -- dlock_client_check(): what makes locks unsafe or slow on a
 * deployment (`dlock doctor`). The core measures what every store has (a
 * round trip, against the lease) and reads what the store's check slot
 * tells of itself (its settings, its clock).
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Round trips measured: the median of this many inspects. */
#define CHECK_TRIPS 5
/* A lease shorter than this many round trips leaves a renewal no room. */
#define LEASE_TRIPS 20
#define CHECK_DEFAULT_TTL_MS 10000

int dlock__check_finding(dlock_check *out, const char *check,
                         const char *what, const char *fix)
{
    dlock_finding *f = realloc(out->findings,
                               (out->n + 1) * sizeof(*out->findings));

    if (!f)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    out->findings = f;
    f += out->n++;
    memset(f, 0, sizeof(*f));
    snprintf(f->check, sizeof(f->check), "%s", check);
    snprintf(f->what, sizeof(f->what), "%s", what);
    snprintf(f->fix, sizeof(f->fix), "%s", fix);
    return DLOCK_OK;
}

int64_t dlock__wall_ms(void)
{
    struct timespec t;

    clock_gettime(CLOCK_REALTIME, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

void dlock__check_clock(dlock_check *out, int64_t store_ms, int64_t t0,
                        int64_t t1)
{
    out->clock_offset_ms = store_ms - (t0 + (t1 - t0) / 2);
}

void dlock__check_note(dlock_check *out, const char *fmt, ...)
{
    size_t n = strlen(out->notes);
    va_list ap;

    if (n > 0 && n + 2 < sizeof(out->notes)) {
        out->notes[n++] = ';';
        out->notes[n++] = ' ';
        out->notes[n] = '\0';
    }
    va_start(ap, fmt);
    vsnprintf(out->notes + n, sizeof(out->notes) - n, fmt, ap);
    va_end(ap);
}

void dlock_check_clear(dlock_check *check)
{
    if (!check)
        return;
    free(check->findings);
    memset(check, 0, sizeof(*check));
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int dlock_client_check(dlock_client *c, int64_t ttl_ms, dlock_check *out)
{
    int64_t trips[CHECK_TRIPS];
    char what[512], fix[512];
    int rc;

    if (!out)
        return dlock__err(DLOCK_EINVAL, "dlock_client_check: out is NULL");
    memset(out, 0, sizeof(*out));
    out->clock_offset_ms = INT64_MIN;
    if (!c)
        return dlock__err(DLOCK_EINVAL, "dlock_client_check: client is "
                                        "NULL");
    if (ttl_ms == 0)
        ttl_ms = CHECK_DEFAULT_TTL_MS;
    if (ttl_ms < DLOCK_TTL_MIN || ttl_ms > DLOCK_TTL_MAX)
        return dlock__err(DLOCK_EINVAL,
                          "dlock_client_check: ttl_ms must be from %d to "
                          "%lld, not %lld",
                          DLOCK_TTL_MIN, DLOCK_TTL_MAX, (long long)ttl_ms);

    /* the round trip: a few inspects of a name nobody uses */
    for (int i = 0; i < CHECK_TRIPS; i++) {
        dlock_info info;
        int64_t u0 = dlock__now_us();
        rc = dlock_inspect(c, "dlock-doctor-probe", &info);
        trips[i] = dlock__now_us() - u0;
        if (rc) {
            dlock_check_clear(out);
            out->clock_offset_ms = INT64_MIN;
            return rc;
        }
        dlock_info_clear(&info);
    }
    qsort(trips, CHECK_TRIPS, sizeof(trips[0]), cmp_i64);
    out->round_trip_us = trips[CHECK_TRIPS / 2];
    if ((c->be->caps & DLOCK__CAP_LEASE) &&
        ttl_ms * 1000 < LEASE_TRIPS * out->round_trip_us) {
        snprintf(what, sizeof(what),
                 "a lease of %lld ms is less than %d round trips to the "
                 "store (%lld us each): a renewal and its retry, every "
                 "ttl/3, may not get through before the lease ends",
                 (long long)ttl_ms, LEASE_TRIPS,
                 (long long)out->round_trip_us);
        snprintf(fix, sizeof(fix),
                 "use a lease of at least %lld ms (--ttl), or a store "
                 "closer to this host",
                 (long long)(LEASE_TRIPS * out->round_trip_us / 1000 + 1));
        if ((rc = dlock__check_finding(out, "lease-vs-round-trip", what,
                                       fix)) != DLOCK_OK)
            goto fail;
    }

    /* what the store tells of itself, its clock among it */
    if (c->be->check) {
        rc = c->be->check(c->st, ttl_ms, out,
                          dlock__now_ms() + c->timeout_ms);
        if (rc)
            goto fail;
    } else {
        dlock__check_note(out, "%s:// checks nothing of its own yet (its "
                               "settings, TLS, its clock): the round trip "
                               "and the lease only",
                          c->be->name);
    }
    if (out->clock_offset_ms != INT64_MIN) {
        int64_t off = out->clock_offset_ms < 0 ? -out->clock_offset_ms
                                               : out->clock_offset_ms;
        int64_t margin = dlock__client_margin(c, ttl_ms);
        /* leases run on one clock's rate, so an offset alone breaks no
         * lease; it breaks what compares wall clocks across hosts (cron
         * firings against --at-least, logs), and a large one says NTP is
         * not running */
        if (off > 1000 || off > margin * 10) {
            snprintf(what, sizeof(what),
                     "this host's clock is %lld ms %s the store's: NTP "
                     "is not keeping them together (jobs fired by cron "
                     "on hosts whose clocks differ by more than their "
                     "--at-least time run twice)",
                     (long long)off,
                     out->clock_offset_ms > 0 ? "behind" : "ahead of");
            snprintf(fix, sizeof(fix),
                     "run NTP (chrony, systemd-timesyncd) on this host and "
                     "on the store's");
            if ((rc = dlock__check_finding(out, "clock-offset", what,
                                           fix)) != DLOCK_OK)
                goto fail;
        }
    } else {
        dlock__check_note(out, "the clock offset: %s:// has no clock of "
                               "its own to compare (or it could not be "
                               "read)",
                          c->be->name);
    }
    return DLOCK_OK;

fail:
    {
        char keep[512];
        snprintf(keep, sizeof(keep), "%s", dlock_errmsg());
        dlock_check_clear(out);
        out->clock_offset_ms = INT64_MIN;
        return dlock__err(rc, "%s", keep);
    }
}
