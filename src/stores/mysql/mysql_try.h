/* SPDX-License-Identifier: MIT */
/*
 * mysql_try.h -- what the two files of the MySQL/MariaDB store's acquire
 * share: mysql_wait.c, the acquire and its waiting in the server, and
 * mysql_try.c, the statements of one try. The rest of the store sees
 * only dlock__mysql_acquire() (mysql_int.h).
 */
#ifndef DLOCK_MYSQL_TRY_H
#define DLOCK_MYSQL_TRY_H

#include "mysql_int.h"

/* How a try treats the gate. TRY_GATE and TRY_TAKEOVER (after a wait
 * that ended without the gate) do not hold it: the row decides (they take
 * the gate when it is free); TRY_HELD holds it; TRY_WAIT sleeps for it;
 * TRY_DRAIN: a writer holding the gate while readers hold waits for each
 * of them, then tries; TRY_LAST: a writer's try with no wait left after a
 * busy one: settles a readers' row, tries again and lets go of the gate
 * if it took nothing (docs/design.md: "A writer's try on a readers'
 * row"). */
enum { TRY_GATE, TRY_HELD, TRY_TAKEOVER, TRY_WAIT, TRY_DRAIN, TRY_LAST };

/* A read hold's or permit's try of kind TRY_GATE: the light take (the
 * client last held the name alone), the join (others held), or the full
 * take (after either found nothing to take: it takes a free row, or
 * answers who holds). */
enum { FIRST_FULL, FIRST_LIGHT, FIRST_JOIN };

/* What one acquire keeps between its round trips: the lease, and its
 * values as SQL (hex literals; the gate and the hold lock expressions). */
typedef struct my_acq {
    my_store *ms;
    dlock__lease *l;
    my_lease *sl;
    int shared; /* a read hold or a permit */
    int listed; /* it waits listed in the queue table */
    int kinds;  /* with its kind (readers or permits use the name) */
    int rich;   /* a writer whose every try says who holds */
    int ordered; /* its tries respect the queue entries that count (fair
                  * writers, readers, permits) */
    int waits;   /* the call may wait (its deadline was ahead) */
    int last;    /* its last try is made (or coming: no more of them) */
    int first;  /* a read hold's or permit's next try of kind TRY_GATE */
    char *name, *owner, *holder, *gate, *hold; /* a read hold's or permit's
                                                * gate and hold: literals */
    const my_vals *v; /* a read hold's or permit's values (its lease's) */
} my_acq;

/* The try of kind `kind` (wait_ms: how long a waiting one may wait), and
 * in *at which of its statements is the upsert; malloc'd, NULL when out
 * of memory. */
char *dlock__mysql_try_sql(const my_acq *a, int kind, int64_t wait_ms,
                           int *at);

/* A listed waiter's entry: its end written `ms_left` from now, in a round
 * trip of its own, before a sleep in the client holding the gate. */
void dlock__mysql_alive_for(const my_acq *a, int64_t ms_left);

#endif
