/* SPDX-License-Identifier: MIT */
/*
 * pg_hold.c -- advisory mode's holds (pg_int.h): each hold keeps the
 * session that took the lock, watched by the client thread, which reports
 * the hold lost the moment that session ends; and the server-side wait
 * for an advisory lock that a deadline or dlock_cancel() ends. Below the
 * mode's lock (pg_advisory.c) and its semaphores (pg_advisory_rw.c), which
 * both use them, and the client thread's loop (pg.c).
 */
#include "pg_int.h"

#include <pthread.h>
#include <stdio.h>
#include <sys/epoll.h>

int dlock__pg_adv_wait(pg_store *ps, pg_conn *cn, const dlock__lease *l,
                       const char *sql, PGresult **r, const char *what)
{
    int64_t limit = l->deadline == DLOCK__FOREVER
                        ? DLOCK__FOREVER
                        : l->deadline + ps->timeout_ms;
    int rc;

    cn->cfd = l->cancel_fd; /* dlock_cancel() ends the wait */
    cn->cancel_sent = 0;
    rc = dlock__pg_run_text(ps, cn, sql, limit, r, what);
    cn->cfd = -1;
    if (rc != DLOCK_OK && cn->cancel_sent)
        /* the cancel may have ended the statement after its
         * pg_advisory_lock() took the lock (a session lock: no rollback
         * frees it): the session goes, and the lock with it */
        cn->broken = 1;
    if (rc != DLOCK_OK && dlock__lease_cancelled(l))
        rc = DLOCK_EBUSY; /* the core says DLOCK_ECANCELED */
    return rc;
}

void dlock__pg_appname(const dlock__lease *l, char *out, size_t cap)
{
    snprintf(out, cap < PG_APPNAME_MAX + 1 ? cap : PG_APPNAME_MAX + 1,
             "%s", l->desc);
}

/* Watches a hold's connection: its session ending is the lock's loss. */
static void hold_watch(pg_store *ps, pg_conn *cn)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP};

    ev.data.ptr = cn;
    pthread_mutex_lock(&ps->hmu);
    cn->next = ps->holds;
    cn->prev = NULL;
    if (ps->holds)
        ps->holds->prev = cn;
    ps->holds = cn;
    cn->watched = epoll_ctl(ps->epfd, EPOLL_CTL_ADD, PQsocket(cn->pg),
                            &ev) == 0;
    pthread_mutex_unlock(&ps->hmu);
}

void dlock__pg_hold_unwatch(pg_store *ps, pg_conn *cn)
{
    pthread_mutex_lock(&ps->hmu);
    if (cn->watched && PQsocket(cn->pg) >= 0)
        epoll_ctl(ps->epfd, EPOLL_CTL_DEL, PQsocket(cn->pg), NULL);
    cn->watched = 0;
    if (cn->prev)
        cn->prev->next = cn->next;
    else if (ps->holds == cn)
        ps->holds = cn->next;
    if (cn->next)
        cn->next->prev = cn->prev;
    cn->next = cn->prev = NULL;
    pthread_mutex_unlock(&ps->hmu);
}

static int match_conn(const dlock__lease *l, void *arg)
{
    const pg_lease *pl = l->priv;
    return pl && pl->hold == arg;
}

/* The client thread: a watched hold connection became readable. hmu
 * held. */
void dlock__pg_hold_check(pg_store *ps, pg_conn *cn)
{
    int found = 0;

    for (pg_conn *h = ps->holds; h; h = h->next)
        found |= h == cn;
    if (!found || pthread_mutex_trylock(&cn->mu) != 0)
        return; /* released, or its owner is using it right now */
    if (!PQconsumeInput(cn->pg) || PQstatus(cn->pg) != CONNECTION_OK) {
        cn->dead = 1;
        (void)PQisBusy(cn->pg); /* parses what came before the end: the
                                 * server's reason (noticed(), pg_conn.c) */
        if (cn->watched)
            epoll_ctl(ps->epfd, EPOLL_CTL_DEL, PQsocket(cn->pg), NULL);
        cn->watched = 0;
        dlock__notify_lost(ps->client, match_conn, cn,
                           cn->ended
                               ? "the server ended the session holding the "
                                 "advisory lock (pg_terminate_backend: "
                                 "dlock break or an administrator, or a "
                                 "shutdown): the server has released it"
                               : "the session holding the advisory lock "
                                 "ended (connection to the server lost): "
                                 "the server has released it");
    }
    while (!cn->dead) {
        /* anything the server sent unasked (a notice) */
        PGresult *r = PQisBusy(cn->pg) ? NULL : PQgetResult(cn->pg);
        if (!r)
            break;
        PQclear(r);
    }
    pthread_mutex_unlock(&cn->mu);
}

void dlock__pg_hold_keep(pg_store *ps, dlock__lease *l, pg_conn *cn,
                         long long token)
{
    pg_lease *pl = l->priv;

    l->token = (uint64_t)token;
    pl->hold = cn;
    hold_watch(ps, cn);
}
