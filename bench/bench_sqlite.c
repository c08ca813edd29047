/* SPDX-License-Identifier: MIT */
/*
 * bench_sqlite.c -- dlock's SQLite store beside the same two statements
 * run by a bare sqlite3 loop on the same kind of database file.
 *
 *   dlock_bench_sqlite DIR [--quick]
 *
 * Prints Markdown. Floor: one connection (WAL and synchronous=NORMAL, as
 * the store opens it), the store's own two statements as sqlite.c
 * prepares them, prepared once, on a table of the store's shape: the
 * acquire UPDATE of the name's row (made once, as the store makes it),
 * RETURNING the token, and the release UPDATE guarded by owner and token.
 * dlock's uncontended acquire takes no ticket: beyond these statements it
 * looks at the sidecar file twice (one system call each: for a queue
 * before the acquire, for a waiter to ring after the release). Cycles run
 * in chunks that alternate with the floor; the ratio is the median of the
 * chunks' ratios. Hand-off: two processes pass the lock back and forth;
 * the waiter sleeps in the kernel until the release wakes it, from the
 * release call to the acquire's return, in µs.
 */
#include <dlock.h>
#include <sqlite3.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

const char bench_prog[] = "bench_sqlite";

#define CHUNKS 15
/* sqlite.c's clocks */
#define NOW_MS "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
#define NOW_US                                                              \
    "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"
#define FLOOR_NAME "bench"

typedef struct floor_db {
    sqlite3 *db;
    sqlite3_stmt *acq, *rel;
    int64_t rowid; /* the name's row */
} floor_db;

static void floor_open(floor_db *f, const char *path)
{
    sqlite3_stmt *s;

    if (sqlite3_open_v2(path, &f->db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                            SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_EXRESCODE,
                        NULL) != SQLITE_OK)
        die(path, sqlite3_errmsg(f->db));
    sqlite3_busy_timeout(f->db, 2000);
    if (sqlite3_exec(f->db,
                     "PRAGMA journal_mode=WAL;"
                     "PRAGMA synchronous=NORMAL;"
                     "CREATE TABLE IF NOT EXISTS t (name BLOB PRIMARY KEY, "
                     "owner TEXT, holder TEXT, holds INTEGER NOT NULL "
                     "DEFAULT 0, token INTEGER NOT NULL DEFAULT 0, locked_at "
                     "INTEGER NOT NULL DEFAULT 0, lock_until INTEGER NOT "
                     "NULL DEFAULT 0);",
                     NULL, NULL, NULL) != SQLITE_OK)
        die("floor schema", sqlite3_errmsg(f->db));
    /* the row, made once (the store: once per client and name) */
    if (sqlite3_exec(f->db,
                     "INSERT INTO t (name) VALUES (CAST('" FLOOR_NAME
                     "' AS BLOB)) ON CONFLICT (name) DO NOTHING",
                     NULL, NULL, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(f->db, "SELECT rowid FROM t WHERE name = ?1", -1,
                           &s, NULL) != SQLITE_OK)
        die("floor row", sqlite3_errmsg(f->db));
    sqlite3_bind_blob(s, 1, FLOOR_NAME, (int)strlen(FLOOR_NAME),
                      SQLITE_STATIC);
    if (sqlite3_step(s) != SQLITE_ROW)
        die("floor row", sqlite3_errmsg(f->db));
    f->rowid = sqlite3_column_int64(s, 0);
    sqlite3_finalize(s);
    if (sqlite3_prepare_v2(
            f->db,
            "UPDATE t SET owner = ?2, holder = ?4, holds = 1, token = "
            "max(token + 1, " NOW_US "), locked_at = " NOW_MS ", lock_until "
            "= " NOW_MS " + ?3 WHERE name = ?1 AND rowid = ?5 AND "
            "lock_until <= " NOW_MS " RETURNING token",
            -1, &f->acq, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(f->db,
                           "UPDATE t SET owner = NULL, holder = NULL, holds "
                           "= 0, lock_until = 0 WHERE name = ?1 AND owner = "
                           "?2 AND token = ?3 AND lock_until > " NOW_MS,
                           -1, &f->rel, NULL) != SQLITE_OK)
        die("floor prepare", sqlite3_errmsg(f->db));
}

/* One acquire and one release, bound, run, reset and cleared as the
 * store does. */
static void floor_cycle(void *arg)
{
    floor_db *f = arg;
    static const char owner[] = "0123456789abcdef0123456789abcdef:1";
    int n = (int)strlen(FLOOR_NAME);
    int64_t token;

    sqlite3_bind_blob(f->acq, 1, FLOOR_NAME, n, SQLITE_STATIC);
    sqlite3_bind_text(f->acq, 2, owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(f->acq, 3, 30000);
    sqlite3_bind_text(f->acq, 4, "host pid 1 tid 1", -1, SQLITE_STATIC);
    sqlite3_bind_int64(f->acq, 5, f->rowid);
    if (sqlite3_step(f->acq) != SQLITE_ROW)
        die("floor acquire", sqlite3_errmsg(f->db));
    token = sqlite3_column_int64(f->acq, 0);
    sqlite3_reset(f->acq);
    sqlite3_clear_bindings(f->acq);
    sqlite3_bind_blob(f->rel, 1, FLOOR_NAME, n, SQLITE_STATIC);
    sqlite3_bind_text(f->rel, 2, owner, -1, SQLITE_STATIC);
    sqlite3_bind_int64(f->rel, 3, token);
    if (sqlite3_step(f->rel) != SQLITE_DONE || sqlite3_changes(f->db) != 1)
        die("floor release", sqlite3_errmsg(f->db));
    sqlite3_reset(f->rel);
    sqlite3_clear_bindings(f->rel);
}

static const char *uri;

int main(int argc, char **argv)
{
    char path[600], u[700];
    floor_db f;
    int quick;
    const char *dir = h_args(argc, argv, "DIR", &quick);
    int n = quick ? 1500 : 15000, nh = quick ? 40 : 200;
    snprintf(path, sizeof(path), "%s/floor.db", dir);
    snprintf(u, sizeof(u), "sqlite://%s/dlock.db", dir);
    uri = u;
    floor_open(&f, path);

    printf("## SQLite (database files in a temporary directory)\n\n");
    dlock_client *c = h_section_client(uri, NULL);
    dlock *l = h_open_lock(c, "bench", 0, 0);
    for (int i = 0; i < 500; i++) {
        floor_cycle(&f);
        h_dlock_once(l);
    }
    int per = n / CHUNKS;
    kind_op kinds[2] = {{floor_cycle, &f}, {h_dlock_once, l}};
    double p50[2 * CHUNKS];
    chunked_ops(kinds, 2, n, CHUNKS, p50, NULL);
    spread fs = medrange(p50, CHUNKS), ds = medrange(p50 + CHUNKS, CHUNKS),
           rs = ratios(p50 + CHUNKS, p50, CHUNKS);
    dlock_close(l);
    dlock_client_close(c);
    printf("Latency in microseconds. Cycles: %d of each, in %d chunks "
           "alternating with the floor (the store's own two statements "
           "from a bare sqlite3 loop: the acquire `UPDATE` of the name's "
           "row `RETURNING` the token and the release `UPDATE` guarded by "
           "owner and token, prepared once; WAL); a figure is the median "
           "of the chunks' medians, the ratio the median of the chunks' "
           "ratios; both with synchronous=NORMAL, as the store. An "
           "uncontended acquire takes no ticket in the sidecar file: "
           "beyond the two statements dlock makes two system calls (a look "
           "for a queue before the acquire, one for a waiter to ring after "
           "the release). Hand-off: %d, between two processes; the waiter "
           "sends no statement while it waits: it sleeps in the kernel (on "
           "a socket of the sidecar's queue) until the release wakes it, "
           "then runs the acquire statement.\n\n",
           per * CHUNKS, CHUNKS, nh);
    printf("| measure | floor | dlock | ratio |\n|---|---|---|---|\n");
    printf("| uncontended acquire+release, p50 | %.1f | %.1f | **%.2fx** "
           "(chunks: %.2f–%.2f) |\n",
           fs.med, ds.med, rs.med, rs.min, rs.max);
    dlock_party p = {uri, NULL, 0, 0, -1};
    printf("| hand-off between processes, p50 (µs) | | %.1f | |\n",
           handoff_dlock(&p, nh, NULL).p50_us);
    return 0;
}
