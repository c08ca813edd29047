/* SPDX-License-Identifier: MIT */
/*
 * exporter_cache.c -- `dlock exporter`'s listing thread, the cached answer
 * and its reference count.
 *
 * One listing serves every scraper: the answer is kept --cache-ttl (5 s)
 * from the listing's start, and the scrapes that arrive while a listing
 * runs wait for that one (their connections suspended by exporter_http.c,
 * no thread held, woken through ex->answered) and get its answer. Listings run on a thread of their
 * own, so that no libmicrohttpd thread ever waits on a store; the answer
 * is one reference-counted buffer that every connection reads from.
 */
#include "cli.h"
#include "exporter.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

void exporter_body_unref(body *b)
{
    if (b && atomic_fetch_sub(&b->refs, 1) == 1) {
        free(b->p);
        free(b);
    }
}

/* The listing thread: one listing at a time, when a scrape finds no fresh
 * answer; then the answer replaces ex->cur and the waiters are woken. */
void *exporter_lister(void *arg)
{
    exporter *ex = arg;

    pthread_mutex_lock(&ex->mu);
    for (;;) {
        int64_t deadline, t0;
        char *text;
        size_t len;
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
        rc = exporter_scrape(ex, deadline, &text, &len, &cut);
        b = calloc(1, sizeof(*b));
        if (b) {
            atomic_init(&b->refs, 1);
            if (rc == 0) {
                b->p = text;
                b->len = len;
                text = NULL;
            }
        }
        free(text); /* the text when no body could hold it, else NULL */

        pthread_mutex_lock(&ex->mu);
        old = ex->cur;
        ex->cur = b; /* NULL (no memory): the waiters get a 500 */
        ex->gen++;
        /* a listing stopped by one scrape's deadline answers the scrapes
         * that waited for it, not later ones */
        ex->fresh_until = (b && b->p && !cut) ? t0 + ex->ttl_us : 0;
        ex->busy = 0;
        ex->answered(ex);
        exporter_body_unref(old);
    }
    /* they answer 503: the exporter is stopping */
    ex->answered(ex);
    pthread_mutex_unlock(&ex->mu);
    return NULL;
}
