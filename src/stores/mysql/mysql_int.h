/* SPDX-License-Identifier: MIT */
/*
 * mysql_int.h -- what the MySQL/MariaDB store's files share: mysql.c,
 * the store (release, extend, inspect, gc, open and close, the backend
 * struct); mysql_wait.c, acquire and the waiting in the server (the
 * gate, the fair queue's entry); mysql_conn.c, its connections (the pool,
 * the non-blocking Connector/C I/O that keeps the caller's deadline,
 * running statements, error codes); and mysql_sql.c, its SQL (quoted
 * names, hex literals, the statements' texts, the schema).
 */
#ifndef DLOCK_MYSQL_INT_H
#define DLOCK_MYSQL_INT_H

#include "internal.h"

#include <mysql.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define MY_DEFAULT_TABLE "dlock_locks"
#define MY_TABLE_MAX 48  /* + "_queue": within MySQL's 64 */
#define MY_IDLE_MAX 8
#define MY_WAIT_SLICE_MS 60000 /* one GET_LOCK waits at most this long */
#define MY_DEADLOCK_RETRIES 5
#define MY_WAIT_RECONNECTS 3 /* a waiting session killed: wait on anew */
#define NOW "UTC_TIMESTAMP(6)"

typedef struct my_conn {
    MYSQL *m;
    int broken;
    int answered; /* the last query's first statement was answered */
    struct my_conn *next;
} my_conn;

typedef struct my_store {
    char *redacted;
    int64_t timeout_ms;
    char *host, *user, *password, *db;
    unsigned port;
    char *ssl_ca, *ssl_cert, *ssl_key;
    int ssl_enforce, ssl_verify;
    char t[2 * MY_TABLE_MAX + 8];  /* `T` */
    char q[2 * MY_TABLE_MAX + 16]; /* `T_queue` */
    char table[MY_TABLE_MAX + 1];
    char *tl; /* the table's name as a literal, for gate names */
    pthread_mutex_t mu;
    my_conn *idle;
    int nidle;
} my_store;

typedef struct my_lease {
    my_conn *cn; /* out of the pool while waiting or holding: the gate's */
    int gated;   /* cn holds the name's gate */
    int64_t seq; /* fair queue entry (inspect), 0 when none */
} my_lease;

/* mysql_conn.c: errors, connections and statements */

/* DLOCK_ENOMEM, "out of memory". */
int dlock__mysql_enomem(void);

/* Opens a connection within `deadline`. */
int dlock__mysql_conn_open(my_store *ms, int64_t deadline, my_conn **out);

/* Closes and frees a connection (NULL: nothing). */
void dlock__mysql_conn_free(my_conn *cn);

/* A connection from the pool (an idle one still open, or a new one). */
int dlock__mysql_conn_get(my_store *ms, int64_t deadline, my_conn **out);

/* Gives cn back to the pool, or closes it (broken, or the pool full). */
void dlock__mysql_conn_put(my_store *ms, my_conn *cn);

/* Runs sql (one statement or several) on cn within `deadline`: what
 * statement number `at` changed and the LAST_INSERT_ID it set, the rows
 * of the last statement that has rows (mysql_conn.c says more). */
int dlock__mysql_query_at(my_store *ms, my_conn *cn, const char *sql,
                          int64_t deadline, MYSQL_RES **res, int at,
                          uint64_t *affected, uint64_t *id,
                          const char *what);

/* dlock__mysql_query_at() for the first statement. */
int dlock__mysql_query(my_store *ms, my_conn *cn, const char *sql,
                       int64_t deadline, MYSQL_RES **res,
                       uint64_t *affected, uint64_t *id, const char *what);

/* One statement on a pooled connection (a deadlock victim runs again). */
int dlock__mysql_query_pooled(my_store *ms, const char *sql,
                              int64_t deadline, MYSQL_RES **res,
                              uint64_t *affected, uint64_t *id,
                              const char *what);

/* Column `col` of r's first row as a number (dflt: no such value). */
long long dlock__mysql_col_ll(MYSQL_RES *r, int col, long long dflt);

/* mysql_sql.c: names and statements */

/* in + suffix as one backquoted identifier (backquotes doubled). */
void dlock__mysql_quote_ident(const char *in, const char *suffix,
                              char *out, size_t cap);

/* X'<hex>' of n bytes into a fresh buffer (NULL: out of memory). */
char *dlock__mysql_hexlit(const char *s, size_t n);

/* A statement from fmt; fresh buffer, or NULL. */
char *dlock__mysql_stmt(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* The name's gate, an SQL expression (name_lit a hex literal). */
char *dlock__mysql_gate_of(const my_store *ms, const char *name_lit);

/* A fair queue entry's own user lock (`seq` an SQL expression). */
char *dlock__mysql_entry_lock_of(const my_store *ms, const char *seq);

/* The acquire's upsert, guarded by `where`; `woke`: a waiter's, whose
 * times are its wake's. */
char *dlock__mysql_upsert(const my_store *ms, const dlock__lease *l,
                          const char *name, const char *owner,
                          const char *holder, const char *where, int woke);

/* Creates the tables when missing. */
int dlock__mysql_ensure_schema(my_store *ms, my_conn *cn, int64_t deadline);

/* mysql_wait.c: acquire and waiting */

/* The backend's acquire slot: tries and, while l->deadline allows, waits
 * in the server. */
int dlock__mysql_acquire(void *st, dlock__lease *l, int64_t op_deadline);

/* Is the hold's own connection alive (and so its gate held)? */
int dlock__mysql_pinned_alive(my_lease *sl);

#endif /* DLOCK_MYSQL_INT_H */
