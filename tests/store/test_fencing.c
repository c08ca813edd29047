/* SPDX-License-Identifier: MIT */
/*
 * test_fencing.c -- fencing at the resource (docs/fencing.md): a holder
 * frozen past its lease, a new holder that writes, the old one thawed
 * and writing: its write is refused, for every helper.
 *
 *   test_fencing sqlite|pg|mysql [filter]
 *
 * The lock's store is the kind given (a lease that ends while its holder
 * is frozen); the resource is the same database, with the fence table
 * and trigger of examples/fencing/<database>.sql, and a file written
 * through `dlock fence` (TH_DLOCK_BIN).
 */
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef TH_SQLITE
#include <sqlite3.h>
#endif
#ifdef TH_PG
#include <libpq-fe.h>
#endif
#ifdef TH_MYSQL
#include <mysql.h>
#endif

static th_store S;

/* ------------------------------------------------------------------------ */
/* The database: one writer's transaction through the fence                 */
/* ------------------------------------------------------------------------ */

/* What a write through the fence did. */
enum { WROTE = 0, REFUSED = 1, FAILED = -1 };

#define RESOURCE "accounts:42"

/* A file's text (malloc'd), or fail. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    char *buf = NULL;
    size_t n = 0;

    if (!f)
        th_fail(__FILE__, __LINE__, "%s: %s", path, strerror(errno));
    buf = malloc(1 << 16);
    if (!buf)
        th_fail(__FILE__, __LINE__, "out of memory");
    n = fread(buf, 1, (1 << 16) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* The example's SQL for this database (examples/fencing/). */
static char *example(void)
{
    char path[1024];

    snprintf(path, sizeof(path), "%s/%s.sql", TH_FENCING_DIR,
             !strcmp(S.kind, "pg") ? "postgres" : S.kind);
    return slurp(path);
}

#ifdef TH_SQLITE
static const char *sqlite_path(void)
{
    return S.uri + strlen("sqlite://");
}

static int sqlite_run(const char *sql, char *msg, size_t cap)
{
    sqlite3 *db = NULL;
    char *err = NULL;
    int rc;

    if (sqlite3_open(sqlite_path(), &db) != SQLITE_OK)
        th_fail(__FILE__, __LINE__, "sqlite3_open: %s", sqlite3_errmsg(db));
    sqlite3_busy_timeout(db, 10000);
    rc = sqlite3_exec(db, sql, NULL, NULL, &err);
    if (rc != SQLITE_OK) {
        snprintf(msg, cap, "%s", err ? err : sqlite3_errstr(rc));
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
    }
    sqlite3_free(err);
    sqlite3_close(db);
    return rc == SQLITE_OK ? 0 : -1;
}
#endif

#ifdef TH_PG
static int pg_run(const char *sql, char *msg, size_t cap)
{
    char conninfo[900];

    snprintf(conninfo, sizeof(conninfo),
             "host=%s port=%d user=dlock dbname=postgres connect_timeout=10",
             S.ssrv.dir, S.ssrv.port);
    PGconn *pg = PQconnectdb(conninfo);
    if (PQstatus(pg) != CONNECTION_OK)
        th_fail(__FILE__, __LINE__, "postgres: %s", PQerrorMessage(pg));
    /* the statements of the string in one go: an error skips the rest,
     * COMMIT included, and the session's end rolls back */
    PGresult *r = PQexec(pg, sql);
    ExecStatusType st = PQresultStatus(r);
    int rc = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK ? 0 : -1;
    if (rc)
        snprintf(msg, cap, "%s", PQresultErrorMessage(r));
    PQclear(r);
    PQfinish(pg);
    return rc;
}
#endif

#ifdef TH_MYSQL
static MYSQL *my_open(void)
{
    char sock[700];
    unsigned timeout = 10;
    MYSQL *m = mysql_init(NULL);

    snprintf(sock, sizeof(sock), "%s/mysql.sock", S.ssrv.dir);
    mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
    if (!mysql_real_connect(m, "localhost", "root", NULL, "dlocktest", 0,
                            sock, 0))
        th_fail(__FILE__, __LINE__, "mysql: %s", mysql_error(m));
    return m;
}

/* The statements of sql one by one, as the mysql client reads a file:
 * ';' ends one, and a DELIMITER line sets another end. The first error
 * stops (and ROLLBACK ends the transaction, as a writer must). */
static int my_run(const char *sql, char *msg, size_t cap)
{
    MYSQL *m = my_open();
    char delim[8] = ";", *copy = strdup(sql), *p = copy, *stmt = copy;
    int rc = 0;

    if (!copy)
        th_fail(__FILE__, __LINE__, "out of memory");
    while (*p && !rc) {
        if ((p == copy || p[-1] == '\n') && !strncmp(p, "DELIMITER ", 10)) {
            char *e = strchr(p, '\n');
            size_t n = (e ? (size_t)(e - p) : strlen(p)) - 10;
            snprintf(delim, sizeof(delim), "%.*s", (int)n, p + 10);
            p = stmt = e ? e + 1 : p + strlen(p);
            continue;
        }
        if (!strncmp(p, "--", 2) && (p == copy || p[-1] == '\n')) {
            char *e = strchr(p, '\n');
            p = e ? e + 1 : p + strlen(p);
            if (stmt < p && strspn(stmt, " \n\t") >= (size_t)(p - stmt))
                stmt = p;
            continue;
        }
        size_t dl = strlen(delim);
        if (!strncmp(p, delim, dl)) {
            *p = '\0';
            if (strspn(stmt, " \n\t") < strlen(stmt) &&
                mysql_query(m, stmt) != 0) {
                snprintf(msg, cap, "%s", mysql_error(m));
                mysql_query(m, "ROLLBACK");
                rc = -1;
            }
            p += dl;
            stmt = p;
            continue;
        }
        p++;
    }
    free(copy);
    mysql_close(m);
    return rc;
}
#endif

/* Runs sql (several statements) on the resource's database: 0, or -1 with
 * the database's message in msg. */
static int run_sql(const char *sql, char *msg, size_t cap)
{
    msg[0] = '\0';
#ifdef TH_SQLITE
    if (!strcmp(S.kind, "sqlite"))
        return sqlite_run(sql, msg, cap);
#endif
#ifdef TH_PG
    if (!strcmp(S.kind, "pg"))
        return pg_run(sql, msg, cap);
#endif
#ifdef TH_MYSQL
    if (!strcmp(S.kind, "mysql"))
        return my_run(sql, msg, cap);
#endif
    th_fail(__FILE__, __LINE__, "no client for %s", S.kind);
    return -1;
}

/* The example's fence, and the table it protects. */
static void set_up_database(void)
{
    char *sql = example(), msg[600];

    if (run_sql(sql, msg, sizeof(msg)) != 0)
        th_fail(__FILE__, __LINE__, "the example's SQL: %s", msg);
    free(sql);
    if (run_sql("CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY "
                "KEY, note VARCHAR(64) NOT NULL);\n"
                "DELETE FROM accounts;\n"
                "INSERT INTO accounts (id, note) VALUES (42, 'nobody');\n",
                msg, sizeof(msg)) != 0)
        th_fail(__FILE__, __LINE__, "accounts: %s", msg);
}

/* One writer's transaction, as docs/fencing.md shows it: the fence's
 * upsert with `token`, then the write. WROTE, REFUSED (the trigger's
 * stale-token error) or FAILED (msg says why). */
static int fenced_write(uint64_t token, const char *who, char *msg,
                        size_t cap)
{
    char sql[1024];
    const char *begin = !strcmp(S.kind, "sqlite")  ? "BEGIN IMMEDIATE"
                        : !strcmp(S.kind, "mysql") ? "START TRANSACTION"
                                                   : "BEGIN";
    const char *upsert =
        !strcmp(S.kind, "mysql")
            ? "INSERT INTO dlock_fence (resource, token) VALUES ('%s', %llu) "
              "ON DUPLICATE KEY UPDATE token = VALUES(token)"
            : "INSERT INTO dlock_fence (resource, token) VALUES ('%s', %llu) "
              "ON CONFLICT (resource) DO UPDATE SET token = excluded.token";
    int n = snprintf(sql, sizeof(sql), "%s;\n", begin);
    n += snprintf(sql + n, sizeof(sql) - (size_t)n, upsert, RESOURCE,
                  (unsigned long long)token);
    snprintf(sql + n, sizeof(sql) - (size_t)n,
             ";\nUPDATE accounts SET note = '%s' WHERE id = 42;\nCOMMIT;\n",
             who);
    if (run_sql(sql, msg, cap) == 0)
        return WROTE;
    return strstr(msg, "stale fencing token") ? REFUSED : FAILED;
}

static void read_note(char *out, size_t cap)
{
    char msg[600];
    const char *sql = "SELECT note FROM accounts WHERE id = 42";

    out[0] = '\0';
#ifdef TH_SQLITE
    if (!strcmp(S.kind, "sqlite")) {
        sqlite3 *db = NULL;
        sqlite3_stmt *st = NULL;
        if (sqlite3_open(sqlite_path(), &db) == SQLITE_OK &&
            sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
            sqlite3_step(st) == SQLITE_ROW)
            snprintf(out, cap, "%s", sqlite3_column_text(st, 0));
        sqlite3_finalize(st);
        sqlite3_close(db);
        return;
    }
#endif
    if (th_sql_try(&S.ssrv, out, cap, "%s", sql) < -1) {
        snprintf(msg, sizeof(msg), "%s", out);
        th_fail(__FILE__, __LINE__, "reading the note: %s", msg);
    }
}

/* ------------------------------------------------------------------------ */
/* The file: dlock fence                                                    */
/* ------------------------------------------------------------------------ */

/* `dlock fence --token T path` with `text` on its standard input: its
 * exit status (WROTE: 0, REFUSED: 1, else FAILED). */
static int fence_file(const char *path, uint64_t token, const char *text)
{
    int in[2];
    char tok[32];
    pid_t pid;
    int st;

    snprintf(tok, sizeof(tok), "%llu", (unsigned long long)token);
    if (pipe(in) != 0)
        th_fail(__FILE__, __LINE__, "pipe: %s", strerror(errno));
    pid = fork();
    if (pid < 0)
        th_fail(__FILE__, __LINE__, "fork: %s", strerror(errno));
    if (pid == 0) {
        dup2(in[0], 0);
        close(in[0]);
        close(in[1]);
        execl(TH_DLOCK_BIN, "dlock", "fence", "--token", tok, path,
              (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    if (write(in[1], text, strlen(text)) < 0) {
        /* the child died early: its status says */
    }
    close(in[1]);
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
        return FAILED;
    return WEXITSTATUS(st) == 0   ? WROTE
           : WEXITSTATUS(st) == 1 ? REFUSED
                                  : FAILED;
}

static void file_text(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(out, 1, cap - 1, f) : 0;

    out[n] = '\0';
    if (f)
        fclose(f);
}

/* ------------------------------------------------------------------------ */
/* The frozen holder                                                        */
/* ------------------------------------------------------------------------ */

enum { VIA_SQL, VIA_FILE };

typedef struct frozen {
    int via;
    char name[64], path[512];
    uint64_t token;
    volatile int ready, go, done;
    int wrote, released;
    char msg[600];
} frozen;

static int write_as(int via, const char *path, uint64_t token,
                    const char *who, char *msg, size_t cap)
{
    if (via == VIA_FILE) {
        msg[0] = '\0';
        return fence_file(path, token, who);
    }
    return fenced_write(token, who, msg, cap);
}

/* The old holder (a child): takes the lock, says so, is frozen by the
 * test (SIGSTOP) past its lease, thawed, and writes with its token as if
 * nothing had happened. */
static int old_holder(void *arg)
{
    frozen *f = arg;
    dlock_client *c = NULL;
    dlock *l = NULL;

    if (dlock_client_open(&c, S.uri, th_patient()) != DLOCK_OK)
        _exit(2);
    l = th_handle(c, f->name, S.short_ttl, 0, 0);
    if (dlock_acquire(l, 10000) != DLOCK_OK)
        _exit(3);
    f->token = dlock_token(l);
    __atomic_store_n(&f->ready, 1, __ATOMIC_SEQ_CST);
    /* frozen here by the test; thawed, it goes on (60 s at most) */
    for (int i = 0; i < 12000 && !__atomic_load_n(&f->go, __ATOMIC_SEQ_CST);
         i++)
        th_sleep_ms(5);
    f->wrote = write_as(f->via, f->path, f->token, "A", f->msg,
                        sizeof(f->msg));
    f->released = dlock_release(l);
    __atomic_store_n(&f->done, 1, __ATOMIC_SEQ_CST);
    _exit(0);
}

/* The scenario through one helper: the old holder's write refused, the
 * new holder's kept. */
static void frozen_holder_is_refused(int via, const char *name,
                                     const char *path)
{
    frozen *f = th_shared(sizeof(*f));
    dlock_client *b = th_client(S.uri, th_patient());
    dlock *lb = th_handle(b, name, S.short_ttl, 0, 0);
    char msg[600];

    memset(f, 0, sizeof(*f));
    f->via = via;
    snprintf(f->name, sizeof(f->name), "%s", name);
    snprintf(f->path, sizeof(f->path), "%s", path);
    pid_t pid = th_fork(old_holder, f);
    CHECK(th_wait_flag(&f->ready, 30000));
    CHECK_EQ(kill(pid, SIGSTOP), 0);
    /* its lease runs out while it is frozen: the new holder gets in */
    CHECK_OK(dlock_acquire(lb, 3 * S.short_ttl + 10000));
    uint64_t tb = dlock_token(lb);
    CHECK_OP(tb, >, f->token);
    CHECK_EQ(write_as(via, path, tb, "B", msg, sizeof(msg)), WROTE);
    CHECK_OK(dlock_release(lb));
    /* the old holder thaws and writes with its old token: refused */
    CHECK_EQ(kill(pid, SIGCONT), 0);
    __atomic_store_n(&f->go, 1, __ATOMIC_SEQ_CST);
    CHECK_EQ(th_wait(pid), 0);
    CHECK(f->done);
    if (f->wrote != REFUSED)
        fprintf(stderr, "the old holder's write: %d (%s)\n", f->wrote,
                f->msg);
    CHECK_EQ(f->wrote, REFUSED);
    /* and it is told that its hold was lost */
    CHECK_RC(f->released, DLOCK_ELOST);
    char now[64];
    if (via == VIA_FILE)
        file_text(path, now, sizeof(now));
    else
        read_note(now, sizeof(now));
    CHECK_STR(now, "B");
    /* the same token may write again; a newer one too */
    CHECK_EQ(write_as(via, path, tb, "B", msg, sizeof(msg)), WROTE);
    dlock_close(lb);
    dlock_client_close(b);
}

TEST(a_frozen_holders_sql_write_is_refused)
{
    set_up_database();
    frozen_holder_is_refused(VIA_SQL, "fence-sql", "");
}

TEST(a_frozen_holders_file_write_is_refused)
{
    char path[600];

    snprintf(path, sizeof(path), "%s/report.csv", th_tmpdir());
    frozen_holder_is_refused(VIA_FILE, "fence-file", path);
}

TEST(dlock_fence_refuses_bad_input_and_keeps_the_file)
{
    char path[600], rec[620], now[64];

    snprintf(path, sizeof(path), "%s/kept.txt", th_tmpdir());
    snprintf(rec, sizeof(rec), "%s.fence", path);
    CHECK_EQ(fence_file(path, 7, "seven"), WROTE);
    CHECK_EQ(fence_file(path, 6, "six"), REFUSED);
    CHECK_EQ(fence_file(path, 8, "eight"), WROTE);
    file_text(path, now, sizeof(now));
    CHECK_STR(now, "eight");
    file_text(rec, now, sizeof(now));
    CHECK_STR(now, "8\n");
    /* a record that is not a token: not touched */
    FILE *f = fopen(rec, "w");
    CHECK(f != NULL);
    fputs("garbage", f);
    fclose(f);
    CHECK_EQ(fence_file(path, 9, "nine"), FAILED);
    file_text(path, now, sizeof(now));
    CHECK_STR(now, "eight");
}

static const th_test tests[] = {
    T(a_frozen_holders_sql_write_is_refused),
    T(a_frozen_holders_file_write_is_refused),
    T(dlock_fence_refuses_bad_input_and_keeps_the_file),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    return th_store_main(argc, argv, &S, tests, NULL);
}
