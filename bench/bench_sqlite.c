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
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

const char bench_prog[] = "bench_sqlite";

#define CHUNKS 15
/* sqlite.c's clocks */
#define NOW_MS "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
#define NOW_US                                                              \
    "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)"
#define FLOOR_NAME "bench"

static double p50_us(int64_t *ns, int n)
{
    qsort(ns, (size_t)n, sizeof(*ns), cmp64);
    return (double)ns[n / 2] / 1000;
}

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
static void floor_cycle(floor_db *f)
{
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

static dlock *open_lock(dlock_client **c, const char *name)
{
    dlock *l;

    if (dlock_client_open(c, uri, NULL) != DLOCK_OK)
        die(uri, dlock_errmsg());
    if (dlock_open(&l, *c, name, NULL) != DLOCK_OK)
        die(name, dlock_errmsg());
    return l;
}

typedef struct pingpong {
    volatile int started, ready[2], acquired;
    volatile int64_t released_at;
    int n;
    int64_t samples[];
} pingpong;

static void spin_until(volatile int *v, int want)
{
    struct timespec ts = {0, 20000};

    while (__atomic_load_n(v, __ATOMIC_ACQUIRE) < want)
        nanosleep(&ts, NULL);
}

static void pingpong_proc(pingpong *s, int me)
{
    dlock_client *c;
    dlock *l = open_lock(&c, "bench-handoff");
    struct timespec two_ms = {0, 2000000};

    if (me == 0) {
        if (dlock_acquire(l, -1) != DLOCK_OK)
            die("handoff", dlock_errmsg());
        __atomic_store_n(&s->started, 1, __ATOMIC_RELEASE);
    } else {
        spin_until(&s->started, 1);
    }
    for (int i = 0; i < s->n; i++) {
        if (i % 2 == me) {
            spin_until(&s->ready[1 - me], i + 1);
            nanosleep(&two_ms, NULL);
            __atomic_store_n(&s->released_at, now_ns(), __ATOMIC_RELEASE);
            if (dlock_release(l) != DLOCK_OK)
                die("handoff release", dlock_errmsg());
        } else {
            spin_until(&s->acquired, i);
            __atomic_store_n(&s->ready[me], i + 1, __ATOMIC_RELEASE);
            if (dlock_acquire(l, -1) != DLOCK_OK)
                die("handoff acquire", dlock_errmsg());
            s->samples[i] = now_ns() - s->released_at;
            __atomic_store_n(&s->acquired, i + 1, __ATOMIC_RELEASE);
        }
    }
    if (dlock_held(l) > 0)
        dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
}

static double handoff_ms(int n)
{
    size_t size = sizeof(pingpong) + sizeof(int64_t) * (size_t)n;
    pingpong *s = mmap(NULL, size, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t pids[2];

    if (s == MAP_FAILED)
        die("mmap", strerror(errno));
    memset(s, 0, size);
    s->n = n;
    for (int me = 0; me < 2; me++) {
        fflush(stdout);
        pids[me] = fork();
        if (pids[me] == 0) {
            pingpong_proc(s, me);
            _exit(0);
        }
    }
    for (int me = 0; me < 2; me++) {
        int st;
        waitpid(pids[me], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            die("handoff", "a process failed");
    }
    double r = p50_us(s->samples + 2, n - 2) / 1000;
    munmap(s, size);
    return r;
}

int main(int argc, char **argv)
{
    char path[600], u[700];
    floor_db f;

    if (argc < 2) {
        fprintf(stderr, "usage: dlock_bench_sqlite DIR [--quick]\n");
        return 2;
    }
    int quick = argc > 2 && !strcmp(argv[2], "--quick");
    int n = quick ? 1500 : 15000, nh = quick ? 40 : 200;
    snprintf(path, sizeof(path), "%s/floor.db", argv[1]);
    snprintf(u, sizeof(u), "sqlite://%s/dlock.db", argv[1]);
    uri = u;
    floor_open(&f, path);

    dlock_client *c = NULL;
    int rc = dlock_client_open(&c, uri, NULL);
    printf("## SQLite (database files in a temporary directory)\n\n");
    if (rc == DLOCK_ENOTSUP) {
        printf("Not measured: %s.\n", dlock_errmsg());
        return 0;
    }
    if (rc != DLOCK_OK)
        die(uri, dlock_errmsg());
    dlock *l;
    if (dlock_open(&l, c, "bench", NULL) != DLOCK_OK)
        die("open", dlock_errmsg());
    for (int i = 0; i < 500; i++) {
        floor_cycle(&f);
        if (dlock_acquire(l, 0) || dlock_release(l))
            die("warm-up", dlock_errmsg());
    }
    int per = n / CHUNKS;
    int64_t *fns = malloc(sizeof(int64_t) * (size_t)per);
    int64_t *dns = malloc(sizeof(int64_t) * (size_t)per);
    double fv[CHUNKS], dv[CHUNKS], rv[CHUNKS];
    for (int k = 0; k < CHUNKS; k++) {
        for (int i = 0; i < per; i++) {
            int64_t t0 = now_ns();
            floor_cycle(&f);
            fns[i] = now_ns() - t0;
        }
        for (int i = 0; i < per; i++) {
            int64_t t0 = now_ns();
            if (dlock_acquire(l, 0) || dlock_release(l))
                die("cycle", dlock_errmsg());
            dns[i] = now_ns() - t0;
        }
        fv[k] = p50_us(fns, per);
        dv[k] = p50_us(dns, per);
        rv[k] = dv[k] / fv[k];
    }
    qsort(fv, CHUNKS, sizeof(double), cmpd);
    qsort(dv, CHUNKS, sizeof(double), cmpd);
    qsort(rv, CHUNKS, sizeof(double), cmpd);
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
           fv[CHUNKS / 2], dv[CHUNKS / 2], rv[CHUNKS / 2], rv[0],
           rv[CHUNKS - 1]);
    printf("| hand-off between processes, p50 (µs) | | %.1f | |\n",
           handoff_ms(nh + 2) * 1000);
    free(fns);
    free(dns);
    return 0;
}
