/* SPDX-License-Identifier: MIT */
/*
 * sql.c -- private PostgreSQL and MariaDB servers for the tests (see
 * test.h), started through tests/servers/sqlserver.sh, and a superuser
 * connection to look behind the store's back.
 */
#include "test.h"

#ifdef TH_PG
#include <libpq-fe.h>
#endif
#ifdef TH_MYSQL
#include <mysql.h>
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef TH_SQLSERVER
#error "TH_SQLSERVER: the path of tests/servers/sqlserver.sh"
#endif
#ifndef TH_PGBOUNCER
#error "TH_PGBOUNCER: the path of tests/servers/pgbouncer.sh"
#endif

int th_sql_available(const char *kind)
{
    if (!strcmp(kind, "pg")) {
#ifndef TH_PG
        return 0;
#else
        char cmd[] = "ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1";
        return system(cmd) == 0;
#endif
    }
#ifndef TH_MYSQL
    return 0;
#else
    return access("/usr/sbin/mariadbd", X_OK) == 0;
#endif
}

/* Runs `bash ARGS...` (a NULL-terminated script and its arguments) as a
 * tracked child: its own process group (a server's processes are
 * signalled together: a frozen PostgreSQL is every backend frozen), dead
 * with the test binary, output in DIR/start.log. */
static pid_t spawn_bash(const char *dir, const char *const *args)
{
    char *argv[12], log[700];
    int n = 0;

    argv[n++] = (char *)"bash";
    while (*args && n < 11)
        argv[n++] = (char *)*args++;
    argv[n] = NULL;
    snprintf(log, sizeof(log), "%s/start.log", dir);
    return th__spawn("/bin/bash", argv, NULL, log, 0644);
}

static void spawn(th_sql *s)
{
    char port[16];
    const char *args[] = {TH_SQLSERVER, s->kind, s->dir, port,
                          s->cert[0] ? s->cert : NULL, s->key, NULL};

    snprintf(port, sizeof(port), "%d", s->port);
    s->pid = spawn_bash(s->dir, args);
}

static int exited(th_sql *s)
{
    return th__reaped(&s->pid, NULL);
}

/* 1 when the server answers a query as the superuser. */
static int answers(th_sql *s)
{
    char out[64];
    return th_sql_try(s, out, sizeof(out), "SELECT 1") == 1;
}

static int wait_up(th_sql *s, int64_t timeout_ms)
{
    int64_t until = th_now_ms() + timeout_ms;

    while (th_now_ms() < until) {
        if (exited(s))
            return -1;
        if (answers(s))
            return 0;
        th_sleep_ms(100);
    }
    return -1;
}

static void start(th_sql *s, const char *kind, const char *cert,
                  const char *key)
{
    static int seq;

    if (!th_sql_available(kind))
        th_fail(__FILE__, __LINE__, "no %s server or client library", kind);
    /* the server may run as another user (PostgreSQL refuses root): it
     * must be able to reach its directory */
    chmod(th_tmpdir(), 0711);
    for (int attempt = 0; attempt < 5; attempt++) {
        memset(s, 0, sizeof(*s));
        snprintf(s->kind, sizeof(s->kind), "%s", kind);
        s->port = th_free_port();
        snprintf(s->dir, sizeof(s->dir), "%s/%s%d", th_tmpdir(), kind,
                 seq++);
        mkdir(s->dir, 0755);
        if (cert) {
            snprintf(s->cert, sizeof(s->cert), "%s", cert);
            snprintf(s->key, sizeof(s->key), "%s", key);
        }
        if (!strcmp(kind, "pg"))
            snprintf(s->uri, sizeof(s->uri),
                     "postgres://dlock:dlock-secret@127.0.0.1:%d/postgres",
                     s->port);
        else
            snprintf(s->uri, sizeof(s->uri),
                     "mysql://dlock:dlock-secret@127.0.0.1:%d/dlocktest",
                     s->port);
        spawn(s);
        if (wait_up(s, 90000) == 0)
            return;
        th_sql_kill(s, SIGKILL);
    }
    th_fail(__FILE__, __LINE__, "the %s server did not start (see %s/"
            "start.log and server.log)", kind, s->dir);
}

void th_sql_start(th_sql *s, const char *kind)
{
    start(s, kind, NULL, NULL);
}

void th_sql_start_tls(th_sql *s, const char *kind, const char *cert,
                      const char *key)
{
    start(s, kind, cert, key);
}

/* pid and every process descended from it, into out (at most cap);
 * returns how many. PostgreSQL's backends each run setsid(): a process
 * group does not hold them. */
static int tree(pid_t pid, pid_t *out, int cap)
{
    int n = 0, have;
    DIR *d = opendir("/proc");
    struct dirent *e;

    if (cap < 1)
        return 0;
    out[n++] = pid;
    while (d && (e = readdir(d)) != NULL && n < cap) {
        char path[300], buf[512];
        pid_t p = (pid_t)atoi(e->d_name), ppid = 0;
        if (p <= 0)
            continue;
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)p);
        int fd = open(path, O_RDONLY);
        if (fd < 0)
            continue;
        ssize_t r = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (r <= 0)
            continue;
        buf[r] = '\0';
        const char *close_paren = strrchr(buf, ')');
        if (close_paren && sscanf(close_paren + 1, " %*c %d", &ppid) == 1 &&
            ppid == pid)
            out[n++] = p;
    }
    if (d)
        closedir(d);
    have = n;
    for (int i = 1; i < have && n < cap; i++)
        n += tree(out[i], out + n, cap - n) - 1; /* its own kids */
    return n;
}

static void signal_tree(pid_t pid, int sig)
{
    pid_t all[1024];
    int n = tree(pid, all, 1024);

    for (int i = 0; i < n; i++)
        kill(all[i], sig);
}

/* 1 when every thread of process pid is stopped (or it is gone). */
static int all_stopped(pid_t pid)
{
    char path[64], line[512];
    struct dirent *e;
    int stopped = 1;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return 1;
    while (stopped && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%.16s/stat", (int)pid,
                 e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue; /* a thread that just ended */
        char *state = fgets(line, sizeof(line), f) ? strrchr(line, ')')
                                                   : NULL;
        fclose(f);
        stopped = state && (state[2] == 'T' || state[2] == 't');
    }
    closedir(d);
    return stopped;
}

/* SIGSTOP returns before the server's threads have stopped, and a
 * statement sent at once could still be answered: waits (at most 5 s)
 * until every thread of every process is stopped. */
static void wait_stopped(pid_t pid)
{
    pid_t all[1024];

    for (int k = 0; k < 1000; k++) {
        int n = tree(pid, all, 1024), done = 1;
        for (int i = 0; i < n && done; i++)
            done = all_stopped(all[i]);
        if (done)
            return;
        th_sleep_ms(5);
    }
    th_fail(__FILE__, __LINE__, "the server did not stop within 5 s");
}

void th_sql_kill(th_sql *s, int sig)
{
    if (s->pid <= 0)
        return;
    /* every process of the server, not only the postmaster */
    if (sig == SIGSTOP || sig == SIGCONT || sig == SIGKILL)
        signal_tree(s->pid, sig);
    else
        kill(s->pid, sig);
    if (sig == SIGSTOP)
        wait_stopped(s->pid);
    if (sig == SIGSTOP || sig == SIGCONT)
        return;
    if (sig != SIGKILL) {
        signal_tree(s->pid, SIGCONT);
        for (int k = 0; k < 300 && !exited(s); k++)
            th_sleep_ms(50);
        if (s->pid <= 0)
            return;
        signal_tree(s->pid, SIGKILL);
    }
    waitpid(s->pid, NULL, 0);
    th__track(s->pid, 0);
    s->pid = 0;
}

void th_sql_restart(th_sql *s)
{
    if (s->pid > 0)
        th_fail(__FILE__, __LINE__, "the %s server is running", s->kind);
    /* after a SIGKILL, PostgreSQL backends may linger a moment (and keep
     * the shared memory): try again until the new server answers */
    for (int attempt = 0; attempt < 20; attempt++) {
        spawn(s);
        if (wait_up(s, 60000) == 0)
            return;
        th_sql_kill(s, SIGKILL);
        th_sleep_ms(250);
    }
    th_fail(__FILE__, __LINE__, "the %s server did not restart (see %s/"
            "server.log)", s->kind, s->dir);
}

/* ------------------------------------------------------------------------ */
/* The superuser's connection                                               */
/* ------------------------------------------------------------------------ */

static long long query_v(th_sql *s, int must, char *out, size_t cap,
                         const char *fmt, va_list ap)
{
    char sql[8192];
    long long v = -1;

    (void)must; /* unused when neither SQL store is built */
    vsnprintf(sql, sizeof(sql), fmt, ap);
    if (out && cap)
        out[0] = '\0';
    if (!strcmp(s->kind, "pg")) {
#ifdef TH_PG
        char conninfo[900];
        snprintf(conninfo, sizeof(conninfo),
                 "host=%s port=%d user=dlock dbname=postgres "
                 /* the harness's own connection, checking nothing of
                  * the library: 10 s (3 s ran out under CI's stress-ng,
                  * beside the Python suites' servers) */
                 "connect_timeout=10",
                 s->dir, s->port);
        PGconn *pg = PQconnectdb(conninfo);
        if (PQstatus(pg) != CONNECTION_OK) {
            if (must)
                th_fail(__FILE__, __LINE__, "postgres: %s",
                        PQerrorMessage(pg));
            if (out && cap)
                snprintf(out, cap, "%s", PQerrorMessage(pg));
            PQfinish(pg);
            return -2;
        }
        PGresult *r = PQexec(pg, sql);
        ExecStatusType st = PQresultStatus(r);
        if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
            if (must)
                th_fail(__FILE__, __LINE__, "postgres: %s: %s", sql,
                        PQresultErrorMessage(r));
            if (out && cap)
                snprintf(out, cap, "%s", PQresultErrorMessage(r));
            v = -2;
        } else if (st == PGRES_TUPLES_OK && PQntuples(r) > 0 &&
                   !PQgetisnull(r, 0, 0)) {
            if (out && cap)
                snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
            v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
            if (!strcmp(PQgetvalue(r, 0, 0), "t"))
                v = 1;
        } else if (st == PGRES_COMMAND_OK) {
            v = strtoll(PQcmdTuples(r), NULL, 10);
        }
        PQclear(r);
        PQfinish(pg);
#endif
    } else {
#ifdef TH_MYSQL
        char sock[700];
        unsigned timeout = 3;
        MYSQL *m = mysql_init(NULL);
        snprintf(sock, sizeof(sock), "%s/mysql.sock", s->dir);
        mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
        if (!mysql_real_connect(m, "localhost", "root", NULL, "dlocktest", 0,
                                sock, 0)) {
            if (must)
                th_fail(__FILE__, __LINE__, "mysql: %s", mysql_error(m));
            if (out && cap)
                snprintf(out, cap, "%s", mysql_error(m));
            mysql_close(m);
            return -2;
        }
        if (mysql_query(m, sql) != 0) {
            if (must)
                th_fail(__FILE__, __LINE__, "mysql: %s: %s", sql,
                        mysql_error(m));
            if (out && cap)
                snprintf(out, cap, "%s", mysql_error(m));
            v = -2;
        } else {
            MYSQL_RES *res = mysql_store_result(m);
            if (res) {
                MYSQL_ROW row = mysql_fetch_row(res);
                if (row && row[0]) {
                    if (out && cap)
                        snprintf(out, cap, "%s", row[0]);
                    v = strtoll(row[0], NULL, 10);
                }
                mysql_free_result(res);
            } else {
                v = (long long)mysql_affected_rows(m);
            }
        }
        mysql_close(m);
#endif
    }
    return v;
}

long long th_sql_query(th_sql *s, char *out, size_t cap, const char *fmt,
                       ...)
{
    va_list ap;
    va_start(ap, fmt);
    long long v = query_v(s, 1, out, cap, fmt, ap);
    va_end(ap);
    return v;
}

long long th_sql_try(th_sql *s, char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    long long v = query_v(s, 0, out, cap, fmt, ap);
    va_end(ap);
    return v;
}

#ifdef TH_MYSQL
static MYSQL *kept_open(th_sql *s)
{
    char sock[700];
    unsigned timeout = 10;
    MYSQL *m = mysql_init(NULL);

    snprintf(sock, sizeof(sock), "%s/mysql.sock", s->dir);
    mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
    if (!mysql_real_connect(m, "localhost", "root", NULL, "dlocktest", 0,
                            sock, 0))
        th_fail(__FILE__, __LINE__, "mysql: %s", mysql_error(m));
    return m;
}
#endif

long long th_sql_read(th_sql *s, char *out, size_t cap, const char *fmt,
                      ...)
{
    long long v = -1;
    char sql[8192];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    if (strcmp(s->kind, "mysql") != 0)
        th_fail(__FILE__, __LINE__, "th_sql_read: MariaDB only");
#ifdef TH_MYSQL
    if (s->kept && s->kept_pid != getpid())
        s->kept = NULL; /* our parent's: left to it */
    /* twice at most: a session the server closed (a restart) is opened
     * again once */
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!s->kept) {
            s->kept = kept_open(s);
            s->kept_pid = getpid();
        }
        MYSQL *m = s->kept;
        if (mysql_query(m, sql) != 0) {
            unsigned e = mysql_errno(m);
            if (attempt == 0 && (e == 2006 || e == 2013)) {
                mysql_close(m);
                s->kept = NULL;
                continue;
            }
            th_fail(__FILE__, __LINE__, "mysql: %s: %s", sql, mysql_error(m));
        }
        MYSQL_RES *res = mysql_store_result(m);
        if (res) {
            MYSQL_ROW row = mysql_fetch_row(res);
            if (row && row[0]) {
                v = strtoll(row[0], NULL, 10);
                if (out && cap)
                    snprintf(out, cap, "%s", row[0]);
            }
            mysql_free_result(res);
        } else {
            v = (long long)mysql_affected_rows(m);
        }
        break;
    }
#endif
    return v;
}

/* ------------------------------------------------------------------------ */
/* PgBouncer                                                                */
/* ------------------------------------------------------------------------ */

int th_pgb_available(void)
{
    return th_sql_available("pg") &&
           access("/usr/sbin/pgbouncer", X_OK) == 0;
}

static void pgb_spawn(th_pgb *b)
{
    char port[16], pgport[16];
    const char *args[] = {TH_PGBOUNCER, b->dir, port, pgport, b->mode, NULL};

    snprintf(port, sizeof(port), "%d", b->port);
    snprintf(pgport, sizeof(pgport), "%d", b->srv->port);
    b->pid = spawn_bash(b->dir, args);
}

static int pgb_exited(th_pgb *b)
{
    return th__reaped(&b->pid, NULL);
}

long long th_pgb_try(th_pgb *b, char *out, size_t cap, const char *fmt, ...)
{
    long long v = -2;

    if (out && cap)
        out[0] = '\0';
#ifdef TH_PG
    char sql[4096], conninfo[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sql, sizeof(sql), fmt, ap);
    va_end(ap);
    snprintf(conninfo, sizeof(conninfo),
             "host=127.0.0.1 port=%d user=dlock password=dlock-secret "
             "dbname=postgres connect_timeout=10",
             b->port);
    PGconn *pg = PQconnectdb(conninfo);
    if (PQstatus(pg) != CONNECTION_OK) {
        if (out && cap)
            snprintf(out, cap, "%s", PQerrorMessage(pg));
        PQfinish(pg);
        return -2;
    }
    PGresult *r = PQexec(pg, sql);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
        if (out && cap)
            snprintf(out, cap, "%s", PQresultErrorMessage(r));
    } else if (st == PGRES_TUPLES_OK && PQntuples(r) > 0 &&
               !PQgetisnull(r, 0, 0)) {
        if (out && cap)
            snprintf(out, cap, "%s", PQgetvalue(r, 0, 0));
        v = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
        if (!strcmp(PQgetvalue(r, 0, 0), "t"))
            v = 1;
    } else {
        v = -1;
    }
    PQclear(r);
    PQfinish(pg);
#else
    (void)b;
    (void)fmt;
#endif
    return v;
}

static int pgb_wait_up(th_pgb *b, int64_t timeout_ms)
{
    int64_t until = th_now_ms() + timeout_ms;
    char out[256];

    while (th_now_ms() < until) {
        if (pgb_exited(b))
            return -1;
        if (th_pgb_try(b, out, sizeof(out), "SELECT 1") == 1)
            return 0;
        th_sleep_ms(100);
    }
    return -1;
}

void th_pgb_start(th_pgb *b, th_sql *srv, const char *mode)
{
    static int seq;

    if (!th_pgb_available())
        th_fail(__FILE__, __LINE__, "no pgbouncer or PostgreSQL");
    chmod(th_tmpdir(), 0711); /* it may run as another user */
    for (int attempt = 0; attempt < 5; attempt++) {
        memset(b, 0, sizeof(*b));
        b->srv = srv;
        snprintf(b->mode, sizeof(b->mode), "%s", mode);
        b->port = th_free_port();
        snprintf(b->dir, sizeof(b->dir), "%s/pgbouncer%d", th_tmpdir(),
                 seq++);
        mkdir(b->dir, 0755);
        snprintf(b->uri, sizeof(b->uri),
                 "postgres://dlock:dlock-secret@127.0.0.1:%d/postgres",
                 b->port);
        pgb_spawn(b);
        if (pgb_wait_up(b, 30000) == 0)
            return;
        th_pgb_kill(b, SIGKILL);
    }
    th_fail(__FILE__, __LINE__, "pgbouncer did not start (see %s/start.log "
            "and pgbouncer.log)", b->dir);
}

void th_pgb_kill(th_pgb *b, int sig)
{
    if (b->pid <= 0)
        return;
    signal_tree(b->pid, sig); /* bash has exec'd: pgbouncer itself */
    if (sig == SIGSTOP || sig == SIGCONT)
        return;
    for (int k = 0; k < 200 && !pgb_exited(b); k++)
        th_sleep_ms(50);
    if (b->pid <= 0)
        return;
    signal_tree(b->pid, SIGKILL);
    waitpid(b->pid, NULL, 0);
    th__track(b->pid, 0);
    b->pid = 0;
}

void th_pgb_restart(th_pgb *b)
{
    if (b->pid > 0)
        th_fail(__FILE__, __LINE__, "pgbouncer is running");
    for (int attempt = 0; attempt < 20; attempt++) {
        pgb_spawn(b);
        if (pgb_wait_up(b, 30000) == 0)
            return;
        th_pgb_kill(b, SIGKILL);
        th_sleep_ms(250);
    }
    th_fail(__FILE__, __LINE__, "pgbouncer did not restart (see %s/"
            "pgbouncer.log)", b->dir);
}

#ifdef TH_MYSQL
void *th_sql_squatter(th_sql *s, const char *password)
{
    MYSQL *m = mysql_init(NULL);
    unsigned timeout = 10;

    if (!m)
        th_fail(__FILE__, __LINE__, "mysql_init failed");
    th_sql_query(s, NULL, 0,
                 "CREATE USER IF NOT EXISTS 'squatter'@'%%' IDENTIFIED BY "
                 "'%s'",
                 password);
    mysql_options(m, MYSQL_OPT_CONNECT_TIMEOUT, &timeout);
    if (!mysql_real_connect(m, "127.0.0.1", "squatter", password, NULL,
                            (unsigned)s->port, NULL, 0))
        th_fail(__FILE__, __LINE__, "squatter: %s", mysql_error(m));
    if (mysql_query(m, "SELECT COUNT(*) FROM dlocktest.dlock_locks") == 0)
        th_fail(__FILE__, __LINE__, "squatter may read dlock_locks");
    return m;
}

void th_sql_squatter_take(void *m, const char *lock)
{
    char sql[256];
    MYSQL_RES *r;
    MYSQL_ROW row;

    snprintf(sql, sizeof(sql), "SELECT GET_LOCK('%s', 0)", lock);
    if (mysql_query(m, sql) != 0)
        th_fail(__FILE__, __LINE__, "%s: %s", sql, mysql_error(m));
    r = mysql_store_result(m);
    row = r ? mysql_fetch_row(r) : NULL;
    if (!row || !row[0] || strcmp(row[0], "1") != 0)
        th_fail(__FILE__, __LINE__, "%s: not 1", sql);
    mysql_free_result(r);
}
#endif
