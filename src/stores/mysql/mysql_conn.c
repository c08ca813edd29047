/* SPDX-License-Identifier: MIT */
/*
 * mysql_conn.c -- the MySQL/MariaDB store's connections (mysql.c is the
 * store, mysql_int.h what its files share): the pool (up to MY_IDLE_MAX
 * idle), the non-blocking API of Connector/C, so that every statement
 * keeps the caller's deadline, running one statement or several in a
 * round trip, and the error codes of server and client errors. A
 * connection that misses its deadline is closed. And what the files
 * above share about statements and a hold's own connection: a
 * statement's text made from a format; whether the connection a hold
 * keeps is alive, or was killed under a statement; letting it go when
 * the hold is lost.
 */
#include "mysql_int.h"

#include <errmsg.h>
#include <mysql/plugin_auth.h>
#include <mysqld_error.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

int dlock__mysql_enomem(void)
{
    return dlock__err(DLOCK_ENOMEM, "out of memory");
}

/* The code for a server or client error number. */
static int code_of(unsigned e)
{
    switch (e) {
    case ER_ACCESS_DENIED_ERROR:
    case ER_DBACCESS_DENIED_ERROR:
    case ER_TABLEACCESS_DENIED_ERROR:
    case ER_COLUMNACCESS_DENIED_ERROR:
    case ER_SPECIFIC_ACCESS_DENIED_ERROR:
    case ER_BAD_DB_ERROR:
    case CR_PLUGIN_NOT_ALLOWED: /* an auth plugin refused: see MY_PLAIN_AUTH */
        return DLOCK_EAUTH;
    case ER_LOCK_DEADLOCK:
    case ER_LOCK_WAIT_TIMEOUT:
    case ER_SERVER_SHUTDOWN:
    case ER_CON_COUNT_ERROR:
    case ER_TOO_MANY_USER_CONNECTIONS:
    case ER_OPTION_PREVENTS_STATEMENT: /* read_only: a replica */
        return DLOCK_ECONN;
    default:
        return e >= 2000 && e < 3000 ? DLOCK_ECONN : DLOCK_EPROTO;
    }
}

/* The connection's last error; a client-side error (CR_*) breaks it. */
static int my_error(my_store *ms, my_conn *cn, const char *what)
{
    unsigned e = mysql_errno(cn->m);

    cn->err = e;
    if (e >= 2000 && e < 3000)
        cn->broken = 1;
    return dlock__err(code_of(e), "mysql %s: %s: %s (error %u)",
                      ms->redacted, what,
                      e ? mysql_error(cn->m) : "connection lost", e);
}

/* A prepared statement's error, as my_error(). */
static int stmt_error(my_store *ms, my_conn *cn, MYSQL_STMT *st,
                      const char *what)
{
    unsigned e = mysql_stmt_errno(st);

    cn->err = e;
    if (e >= 2000 && e < 3000)
        cn->broken = 1;
    return dlock__err(code_of(e), "mysql %s: %s: %s (error %u)",
                      ms->redacted, what,
                      e ? mysql_stmt_error(st) : "connection lost", e);
}

unsigned dlock__mysql_errno(const my_conn *cn)
{
    return cn->err;
}

static int timeout_error(my_store *ms, my_conn *cn, const char *what)
{
    cn->broken = 1;
    cn->err = 0;
    return dlock__err(DLOCK_ECONN, "mysql %s: %s: no answer in time",
                      ms->redacted, what);
}

/* ------------------------------------------------------------------------ */
/* Non-blocking I/O                                                         */
/* ------------------------------------------------------------------------ */

/* The library's MYSQL_WAIT_* from poll()'s revents. */
static int ready_of(short revents)
{
    return (revents & (POLLIN | POLLHUP | POLLERR) ? MYSQL_WAIT_READ : 0) |
           (revents & POLLOUT ? MYSQL_WAIT_WRITE : 0) |
           (revents & POLLPRI ? MYSQL_WAIT_EXCEPT : 0);
}

/* Waits for what the library asked (status) until `deadline`; returns the
 * status to pass to the _cont call, or -1 when the deadline passed. */
static int wait_io(MYSQL *m, int status, int64_t deadline)
{
    struct pollfd p;
    int64_t left = deadline - dlock__now_ms();
    int lib = -1;

    p.fd = mysql_get_socket(m);
    p.events = (short)((status & MYSQL_WAIT_READ ? POLLIN : 0) |
                       (status & MYSQL_WAIT_WRITE ? POLLOUT : 0) |
                       (status & MYSQL_WAIT_EXCEPT ? POLLPRI : 0));
    p.revents = 0;
    if (status & MYSQL_WAIT_TIMEOUT)
        lib = (int)mysql_get_timeout_value_ms(m);
    for (;;) {
        left = deadline - dlock__now_ms();
        if (left <= 0)
            return -1;
        int ms = left > 60000 ? 60000 : (int)left;
        int own = lib < 0 || lib > ms; /* which timer ends the poll */
        if (!own)
            ms = lib;
        int r = poll(&p, 1, ms);
        if (r > 0)
            return ready_of(p.revents);
        if (r == 0 && !own)
            return MYSQL_WAIT_TIMEOUT;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

/* Ends the statement running on cn (a wait in GET_LOCK) from another
 * connection: KILL QUERY. 0, or -1 when it could not be sent. */
static int kill_query(my_store *ms, my_conn *cn)
{
    my_conn *k = NULL;
    char sql[64];
    int rc;

    if (dlock__mysql_conn_get(ms, dlock__now_ms() + ms->timeout_ms, &k) !=
        DLOCK_OK)
        return -1;
    snprintf(sql, sizeof(sql), "KILL QUERY %lu",
             (unsigned long)mysql_thread_id(cn->m));
    rc = dlock__mysql_query(ms, k, sql, dlock__now_ms() + ms->timeout_ms,
                            NULL, NULL, NULL, "cancelling a wait");
    dlock__mysql_conn_put(ms, k);
    return rc == DLOCK_OK ? 0 : -1;
}

/* wait_io() for a statement on cn, which a dlock_cancel() ends: when
 * cn->cfd becomes readable, KILL QUERY (once), and on to the answer (the
 * interrupted statement's error) for ?timeout= at most. -1 also when the kill could not be
 * sent: the connection is then given up, which ends the wait in the
 * server as well. */
static int wait_io_cn(my_store *ms, my_conn *cn, int status,
                      int64_t deadline)
{
    while (cn->cfd >= 0 && !cn->killed) {
        struct pollfd p[2];
        int64_t left = deadline - dlock__now_ms();
        if (left <= 0)
            return -1;
        p[0].fd = mysql_get_socket(cn->m);
        p[0].events = (short)((status & MYSQL_WAIT_READ ? POLLIN : 0) |
                              (status & MYSQL_WAIT_WRITE ? POLLOUT : 0) |
                              (status & MYSQL_WAIT_EXCEPT ? POLLPRI : 0));
        p[0].revents = 0;
        p[1].fd = cn->cfd;
        p[1].events = POLLIN;
        p[1].revents = 0;
        int ms_ = left > 60000 ? 60000 : (int)left;
        if (status & MYSQL_WAIT_TIMEOUT) {
            int lib = (int)mysql_get_timeout_value_ms(cn->m);
            if (lib < ms_)
                return wait_io(cn->m, status, deadline); /* a short one */
        }
        int r = poll(p, 2, ms_);
        if (r > 0 && p[0].revents)
            return ready_of(p[0].revents);
        if (r > 0 && p[1].revents) {
            cn->killed = 1;
            cn->kill_until = dlock__now_ms() + ms->timeout_ms;
            if (kill_query(ms, cn) != 0) {
                cn->broken = 1;
                return -1;
            }
        }
        if (r < 0 && errno != EINTR)
            return -1;
    }
    /* the server forgets a KILL QUERY that comes before it starts the
     * statement: after one, the answer is waited for ?timeout= more at
     * most, then the connection is given up (which ends the wait) */
    if (cn->killed && cn->kill_until < deadline)
        deadline = cn->kill_until;
    return wait_io(cn->m, status, deadline);
}

/* ------------------------------------------------------------------------ */
/* TLS before credentials                                                   */
/* ------------------------------------------------------------------------ */

/*
 * Connector/C 3.3 with MYSQL_OPT_SSL_ENFORCE but no certificate
 * verification goes on in plain text when the server's handshake has no
 * CLIENT_SSL, and sends the login (the user and the auth plugin's answer)
 * before anything can look at the session. Its one check that runs
 * before that packet needs MYSQL_OPT_SSL_VERIFY_SERVER_CERT, which
 * ssl_mode=required does not ask for. So with ssl_mode=required the first
 * authentication plugin is this one ("dlock_tls_gate", the only one
 * MARIADB_OPT_RESTRICTED_AUTH allows at first): it runs after the
 * server's handshake is read and before any byte is written. Without
 * CLIENT_SSL in the handshake it fails and nothing is sent. Otherwise
 * its first packet makes the library start TLS, then sends the user with
 * no auth data; once TLS is up it lifts the restriction, and the server
 * switches to the user's plugin (one more round trip per connection),
 * which now runs inside TLS. A server that does not know plugin
 * authentication (no CLIENT_PLUGIN_AUTH: nothing since MySQL 5.5) is
 * refused too: the library would use mysql_native_password directly,
 * which the restriction refuses before it writes.
 */
static int gate_auth(MYSQL_PLUGIN_VIO *vio, MYSQL *m)
{
    static const unsigned char none[1] = {0};

    if (!(m->server_capabilities & CLIENT_SSL)) {
        m->methods->set_error(m, CR_SSL_CONNECTION_ERROR, "HY000",
                              "TLS is required (ssl_mode) but the server "
                              "does not offer it: nothing was sent");
        return CR_ERROR;
    }
    if (vio->write_packet(vio, none, 0))
        return CR_ERROR; /* the library's error (TLS, connection) */
    if (!mysql_get_ssl_cipher(m)) {
        m->methods->set_error(m, CR_SSL_CONNECTION_ERROR, "HY000",
                              "TLS is required (ssl_mode) but the session "
                              "is not encrypted");
        return CR_ERROR;
    }
    /* inside TLS every plugin the library has may run */
    if (mysql_optionsv(m, MARIADB_OPT_RESTRICTED_AUTH, (char *)NULL))
        return CR_ERROR;
    return CR_OK;
}

/* An authentication plugin: <mysql/client_plugin.h>'s
 * st_mysql_client_plugin_AUTHENTICATION, which Debian's header cannot be
 * included for (it wants ma_compress.h, not installed); the layout is the
 * plugin ABI, MYSQL_CLIENT_AUTHENTICATION_PLUGIN_INTERFACE_VERSION 0x0100. */
struct gate_plugin_t {
    MYSQL_CLIENT_PLUGIN_HEADER
    int (*authenticate_user)(MYSQL_PLUGIN_VIO *vio, MYSQL *m);
};

static struct gate_plugin_t gate_plugin = {
    2,      /* MYSQL_CLIENT_AUTHENTICATION_PLUGIN */
    0x0100, /* its interface version */
    MY_GATE_AUTH,
    "dlock",
    "refuses a server without TLS before the login is sent",
    {1, 0, 0},
    "MIT",
    NULL,
    NULL,
    NULL,
    NULL,
    gate_auth,
};

void dlock__mysql_gate_register(void)
{
    MYSQL *m = mysql_init(NULL);

    /* the library's plugin list is per process; the plugin has no state.
     * When it cannot be registered, every ssl_mode=required connection
     * fails (the restriction names it), never one in plain text. */
    if (!m)
        return;
    mysql_client_register_plugin(m, (struct st_mysql_client_plugin *)&gate_plugin);
    mysql_close(m);
}

void dlock__mysql_conn_free(my_conn *cn)
{
    if (!cn)
        return;
    if (cn->m) {
        /* a shut socket makes the close's COM_QUIT fail at once instead of
         * blocking on a dead or frozen server */
        if (cn->broken && mysql_get_socket(cn->m) >= 0)
            shutdown(mysql_get_socket(cn->m), SHUT_RDWR);
        mysql_close(cn->m);
    }
    /* closed, the connection has let go of its prepared statements (the
     * server frees them with the session): only their memory is left,
     * freed without a round trip */
    for (int i = 0; i < MY_PS_N; i++)
        if (cn->ps[i])
            mysql_stmt_close(cn->ps[i]);
    free(cn);
}

int dlock__mysql_conn_open(my_store *ms, int64_t deadline, my_conn **out)
{
    my_conn *cn = calloc(1, sizeof(*cn));
    MYSQL *ret = NULL;
    unsigned secs;
    int status, rc;
    my_bool yes = 1;

    *out = NULL;
    if (!cn || !(cn->m = mysql_init(NULL))) {
        free(cn);
        return dlock__mysql_enomem();
    }
    cn->cfd = -1;
    /* the library's own timeouts only back ours up */
    secs = (unsigned)((ms->timeout_ms + 999) / 1000) + 1;
    mysql_options(cn->m, MYSQL_OPT_NONBLOCK, 0);
    mysql_options(cn->m, MYSQL_OPT_CONNECT_TIMEOUT, &secs);
    mysql_options(cn->m, MYSQL_SET_CHARSET_NAME, "utf8mb4");
    mysql_options(cn->m, MYSQL_INIT_COMMAND,
                  "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED");
    mysql_optionsv(cn->m, MYSQL_OPT_CONNECT_ATTR_ADD, "program_name",
                   "dlock");
    if (ms->ssl_ca)
        mysql_options(cn->m, MYSQL_OPT_SSL_CA, ms->ssl_ca);
    if (ms->ssl_cert)
        mysql_options(cn->m, MYSQL_OPT_SSL_CERT, ms->ssl_cert);
    if (ms->ssl_key)
        mysql_options(cn->m, MYSQL_OPT_SSL_KEY, ms->ssl_key);
    if (ms->ssl_enforce)
        mysql_options(cn->m, MYSQL_OPT_SSL_ENFORCE, &yes);
    if (ms->ssl_verify) {
        /* the library refuses a server without TLS before the login, and
         * verifies it before the login: any plugin may run */
        mysql_options(cn->m, MYSQL_OPT_SSL_VERIFY_SERVER_CERT, &yes);
    } else if (ms->ssl_enforce) {
        /* TLS without verification: the gate first (above), which must
         * be this process's (registered at the store's first open) */
        if (!mysql_client_find_plugin(cn->m, MY_GATE_AUTH, 2)) {
            dlock__mysql_conn_free(cn);
            return dlock__err(DLOCK_ECONN,
                              "mysql %s: connecting: TLS is required "
                              "(ssl_mode) but dlock's TLS gate could not "
                              "be installed in Connector/C: nothing was "
                              "sent",
                              ms->redacted);
        }
        mysql_optionsv(cn->m, MYSQL_DEFAULT_AUTH, MY_GATE_AUTH);
        mysql_optionsv(cn->m, MARIADB_OPT_RESTRICTED_AUTH, MY_GATE_AUTH);
    } else {
        /* no TLS asked: no plugin that shows the password to the network
         * (cleartext, PAM's dialog) or to a server key it sent itself
         * (sha256, caching_sha2's full exchange) */
        mysql_optionsv(cn->m, MARIADB_OPT_RESTRICTED_AUTH, MY_PLAIN_AUTH);
    }
    /* several statements in one round trip: a try and its wait, a
     * release and the gate's */
    status = mysql_real_connect_start(&ret, cn->m, ms->host, ms->user,
                                      ms->password, ms->db, ms->port, NULL,
                                      CLIENT_MULTI_STATEMENTS);
    /* Connector/C makes its socket without close-on-exec: set it at once,
     * after each step (its first: the connect under way, before any
     * byte; a next address of the host is a new socket) */
    dlock__cloexec(mysql_get_socket(cn->m));
    while (status) {
        int ready = wait_io(cn->m, status, deadline);
        if (ready < 0) {
            rc = timeout_error(ms, cn, "connecting");
            dlock__mysql_conn_free(cn);
            return rc;
        }
        status = mysql_real_connect_cont(&ret, cn->m, ready);
        dlock__cloexec(mysql_get_socket(cn->m));
    }
    if (!ret && mysql_errno(cn->m) == CR_PLUGIN_NOT_ALLOWED) {
        /* the library names the first plugin, not the one refused */
        cn->broken = 1;
        dlock__mysql_conn_free(cn);
        if (ms->ssl_enforce)
            return dlock__err(DLOCK_ECONN,
                              "mysql %s: connecting: TLS is required "
                              "(ssl_mode) but the server's handshake has "
                              "no plugin authentication: nothing was sent",
                              ms->redacted);
        return dlock__err(DLOCK_EAUTH,
                          "mysql %s: connecting: the server asks for an "
                          "authentication plugin that shows the password "
                          "to the network (mysql_clear_password, dialog, "
                          "sha256_password or caching_sha2_password), "
                          "refused without TLS: use ssl_mode=required or "
                          "verify_identity",
                          ms->redacted);
    }
    if (!ret) {
        rc = my_error(ms, cn, "connecting");
        cn->broken = 1;
        dlock__mysql_conn_free(cn);
        return rc;
    }
    if (ms->ssl_enforce && !mysql_get_ssl_cipher(cn->m)) {
        /* cannot happen (the gate, or the library's verification, fail
         * first): a last check */
        cn->broken = 1;
        dlock__mysql_conn_free(cn);
        return dlock__err(DLOCK_ECONN,
                          "mysql %s: connecting: TLS is required (ssl_mode) "
                          "but the server does not offer it",
                          ms->redacted);
    }
    *out = cn;
    return DLOCK_OK;
}

int dlock__mysql_conn_get(my_store *ms, int64_t deadline, my_conn **out)
{
    pthread_mutex_lock(&ms->mu);
    my_conn *cn = dlock__pool_take(&ms->idle);
    pthread_mutex_unlock(&ms->mu);
    if (cn) {
        /* an idle connection has nothing to read unless the server closed
         * it (a restart, wait_timeout): then a new one */
        if (!dlock__pool_stale(mysql_get_socket(cn->m))) {
            *out = cn;
            return DLOCK_OK;
        }
        cn->broken = 1;
        dlock__mysql_conn_free(cn);
    }
    return dlock__mysql_conn_open(ms, deadline, out);
}

void dlock__mysql_conn_put(my_store *ms, my_conn *cn)
{
    if (!cn)
        return;
    if (cn->broken) {
        dlock__mysql_conn_free(cn);
        return;
    }
    pthread_mutex_lock(&ms->mu);
    if (dlock__pool_keep(&ms->idle, cn))
        cn = NULL;
    pthread_mutex_unlock(&ms->mu);
    dlock__mysql_conn_free(cn);
}

/* Reads the result of the statement whose answer is pending on cn into
 * *res when it has rows (replacing an earlier one), else frees it. */
static int take_result(my_store *ms, my_conn *cn, int64_t deadline,
                       MYSQL_RES **res, const char *what)
{
    MYSQL_RES *r = NULL;
    int status, ready;

    if (mysql_field_count(cn->m) == 0)
        return DLOCK_OK;
    status = mysql_store_result_start(&r, cn->m);
    while (status) {
        if ((ready = wait_io(cn->m, status, deadline)) < 0)
            return timeout_error(ms, cn, what);
        status = mysql_store_result_cont(&r, cn->m, ready);
    }
    if (!r)
        return my_error(ms, cn, what);
    if (res) {
        if (*res)
            mysql_free_result(*res);
        *res = r;
    } else {
        mysql_free_result(r);
    }
    return DLOCK_OK;
}

/*
 * Runs sql (one statement, or several separated by ';') on cn within
 * `deadline`. *affected and *id get what statement number `at` (from 0)
 * changed and the LAST_INSERT_ID it set; *res the rows of the last
 * statement that has rows (NULL when none; the caller frees them). Any
 * may be NULL. The server stops at the first statement that fails.
 */
int dlock__mysql_query_at(my_store *ms, my_conn *cn, const char *sql,
                          int64_t deadline, MYSQL_RES **res, int at,
                          uint64_t *affected, uint64_t *id, const char *what)
{
    int err = 0, status, ready, rc, n = 0;

    if (res)
        *res = NULL;
    cn->answered = 0;
    cn->err = 0;
    status = mysql_real_query_start(&err, cn->m, sql, strlen(sql));
    while (status) {
        if ((ready = wait_io_cn(ms, cn, status, deadline)) < 0)
            return timeout_error(ms, cn, what);
        status = mysql_real_query_cont(&err, cn->m, ready);
    }
    if (err)
        return my_error(ms, cn, what);
    cn->answered = 1;
    for (;;) {
        if (n == at && affected)
            *affected = (uint64_t)mysql_affected_rows(cn->m);
        if (n == at && id)
            *id = (uint64_t)mysql_insert_id(cn->m);
        rc = take_result(ms, cn, deadline, res, what);
        if (rc != DLOCK_OK || !mysql_more_results(cn->m))
            break;
        n++;
        status = mysql_next_result_start(&err, cn->m);
        while (status) {
            if ((ready = wait_io_cn(ms, cn, status, deadline)) < 0) {
                rc = timeout_error(ms, cn, what);
                break;
            }
            status = mysql_next_result_cont(&err, cn->m, ready);
        }
        if (rc == DLOCK_OK && err)
            rc = my_error(ms, cn, what);
        if (rc)
            break;
    }
    if (rc && res && *res) {
        mysql_free_result(*res);
        *res = NULL;
    }
    return rc;
}

int dlock__mysql_query(my_store *ms, my_conn *cn, const char *sql,
                       int64_t deadline, MYSQL_RES **res, uint64_t *affected,
                       uint64_t *id, const char *what)
{
    return dlock__mysql_query_at(ms, cn, sql, deadline, res, 0, affected, id,
                                 what);
}

/* One statement on a pooled connection; a deadlock victim (rolled back,
 * nothing done) runs again. */
int dlock__mysql_query_pooled(my_store *ms, const char *sql, int64_t deadline,
                              MYSQL_RES **res, uint64_t *affected, uint64_t *id,
                              const char *what)
{
    my_conn *cn;
    int rc;

    if (deadline > dlock__now_ms() + ms->timeout_ms)
        deadline = dlock__now_ms() + ms->timeout_ms; /* ?timeout= */
    for (int attempt = 0;; attempt++) {
        rc = dlock__mysql_conn_get(ms, deadline, &cn);
        if (rc)
            return rc;
        rc = dlock__mysql_query(ms, cn, sql, deadline, res, affected, id, what);
        unsigned e = rc ? dlock__mysql_errno(cn) : 0;
        dlock__mysql_conn_put(ms, cn);
        if (!(rc && e == ER_LOCK_DEADLOCK && attempt < MY_DEADLOCK_RETRIES &&
              dlock__now_ms() < deadline))
            return rc;
    }
}

/* ------------------------------------------------------------------------ */
/* Prepared statements                                                      */
/* ------------------------------------------------------------------------ */

/* Prepares statement `which` on cn: its template with each marker as '?',
 * the markers' order kept. DLOCK_OK; MY_PS_TEXT when the server refused
 * it (cn runs text from now on); or an error (the connection's). */
static int ps_prepare(my_store *ms, my_conn *cn, int which, int64_t deadline,
                      const char *what)
{
    const char *t = ms->tmpl[which];
    char *sql = malloc(strlen(t) + 1), *o = sql;
    int n = 0, ret = 0, status, ready;
    MYSQL_STMT *st;

    if (!sql)
        return dlock__mysql_enomem();
    for (; *t; t++) {
        if (*t != '\001') {
            *o++ = *t;
            continue;
        }
        if (n == MY_PS_PARAMS || !t[1]) {
            free(sql);
            return dlock__err(DLOCK_EPROTO, "mysql: a statement with too "
                                            "many values");
        }
        cn->ps_order[which][n++] = *++t;
        *o++ = '?';
    }
    *o = '\0';
    cn->ps_order[which][n] = '\0';
    if (!(st = mysql_stmt_init(cn->m))) {
        free(sql);
        return dlock__mysql_enomem();
    }
    status = mysql_stmt_prepare_start(&ret, st, sql, strlen(sql));
    while (status) {
        if ((ready = wait_io(cn->m, status, deadline)) < 0) {
            free(sql);
            mysql_stmt_close(st); /* never prepared: no round trip */
            return timeout_error(ms, cn, what);
        }
        status = mysql_stmt_prepare_cont(&ret, st, ready);
    }
    free(sql);
    if (ret) {
        int rc = stmt_error(ms, cn, st, what);
        mysql_stmt_close(st);
        if (cn->broken)
            return rc;
        /* refused by the server (max_prepared_stmt_count, a server
         * without something the statement uses): text statements */
        cn->ps_off = 1;
        return MY_PS_TEXT;
    }
    cn->ps[which] = st;
    return DLOCK_OK;
}

int dlock__mysql_ps_run(my_store *ms, my_conn *cn, int which,
                        const my_vals *v, int64_t deadline,
                        uint64_t *affected, uint64_t *id, const char *what)
{
    MYSQL_BIND b[MY_PS_PARAMS];
    unsigned long lens[MY_PS_PARAMS];
    int ret = 0, status, ready, rc;
    MYSQL_STMT *st;

    if (cn->ps_off || !ms->tmpl[which])
        return MY_PS_TEXT;
    cn->err = 0;
    cn->answered = 0;
    if (!cn->ps[which] &&
        (rc = ps_prepare(ms, cn, which, deadline, what)) != DLOCK_OK)
        return rc;
    st = cn->ps[which];
    memset(b, 0, sizeof(b));
    for (int i = 0; cn->ps_order[which][i]; i++) {
        const void *buf = NULL;
        size_t len = 0;
        enum enum_field_types ty = MYSQL_TYPE_STRING;
        switch (cn->ps_order[which][i]) {
        case 'N': buf = v->name; len = v->name_len; ty = MYSQL_TYPE_BLOB; break;
        case 'S': buf = v->sole; ty = MYSQL_TYPE_BLOB; break;
        case 'D': buf = v->desc; ty = MYSQL_TYPE_BLOB; break;
        case 'T': buf = &v->ttl_us; ty = MYSQL_TYPE_LONGLONG; break;
        case 'P': buf = &v->permits; ty = MYSQL_TYPE_LONGLONG; break;
        case 'K': buf = &v->token; ty = MYSQL_TYPE_LONGLONG; break;
        case 'G': buf = v->gate; break;
        case 'H': buf = v->hold; break;
        case 'O': buf = v->owner; break;
        case 'A': buf = v->path; break;
        case 'E': buf = v->path_tok; break;
        case 'F': buf = v->path_end; break;
        default: return dlock__err(DLOCK_EPROTO, "mysql: a statement's "
                                                 "value unknown");
        }
        if (ty != MYSQL_TYPE_LONGLONG && !len)
            len = strlen(buf);
        lens[i] = (unsigned long)len;
        b[i].buffer_type = ty;
        b[i].buffer = (void *)buf;
        b[i].buffer_length = lens[i];
        b[i].length = ty == MYSQL_TYPE_LONGLONG ? NULL : &lens[i];
        b[i].is_unsigned = cn->ps_order[which][i] == 'K';
    }
    if (mysql_stmt_bind_param(st, b))
        return stmt_error(ms, cn, st, what);
    status = mysql_stmt_execute_start(&ret, st);
    while (status) {
        if ((ready = wait_io(cn->m, status, deadline)) < 0)
            return timeout_error(ms, cn, what);
        status = mysql_stmt_execute_cont(&ret, st, ready);
    }
    if (ret)
        return stmt_error(ms, cn, st, what);
    cn->answered = 1;
    if (affected)
        *affected = (uint64_t)mysql_stmt_affected_rows(st);
    if (id)
        *id = (uint64_t)mysql_stmt_insert_id(st);
    return DLOCK_OK;
}

long long dlock__mysql_col_ll(MYSQL_RES *r, int col, long long dflt)
{
    MYSQL_ROW row;

    if (!r || (int)mysql_num_fields(r) <= col)
        return dflt;
    mysql_data_seek(r, 0);
    row = mysql_fetch_row(r);
    if (!row || !row[col])
        return dflt;
    return strtoll(row[col], NULL, 10);
}

/* ------------------------------------------------------------------------ */
/* A statement sent without waiting (a semaphore head's helpers)            */
/* ------------------------------------------------------------------------ */

/* After the query: its result (one statement, rows or none). */
static void async_result(my_async *a, int ready)
{
    MYSQL_RES *r = NULL;

    if (a->phase == 0) {
        if (mysql_field_count(a->cn->m) == 0) {
            a->phase = 2;
            a->status = 0;
            return;
        }
        a->phase = 1;
        a->status = mysql_store_result_start(&r, a->cn->m);
    } else {
        a->status = mysql_store_result_cont(&r, a->cn->m, ready);
    }
    if (a->status)
        return;
    a->phase = 2;
    if (!r)
        a->failed = 1;
    a->res = r;
}

/* The query's own call answered (status, err): on to its result. */
static void async_queried(my_async *a, int err)
{
    if (a->status)
        return;
    if (err) {
        a->failed = 1;
        a->phase = 2;
        return;
    }
    async_result(a, 0);
}

void dlock__mysql_async_start(my_async *a, const char *sql)
{
    int err = 0;

    a->phase = 0;
    a->failed = 0;
    a->res = NULL;
    a->status = mysql_real_query_start(&err, a->cn->m, sql, strlen(sql));
    async_queried(a, err);
}

void dlock__mysql_async_step(my_async *a, short revents)
{
    int err = 0, ready = ready_of(revents);

    if (a->phase == 2 || a->status == 0)
        return;
    if ((a->status & MYSQL_WAIT_TIMEOUT) && !ready)
        ready = MYSQL_WAIT_TIMEOUT;
    if (!ready)
        return;
    if (a->phase == 0) {
        a->status = mysql_real_query_cont(&err, a->cn->m, ready);
        async_queried(a, err);
        return;
    }
    async_result(a, ready);
}

short dlock__mysql_async_events(const my_async *a)
{
    if (a->phase == 2 || a->status == 0)
        return -1;
    return (short)((a->status & MYSQL_WAIT_READ ? POLLIN : 0) |
                   (a->status & MYSQL_WAIT_WRITE ? POLLOUT : 0) |
                   (a->status & MYSQL_WAIT_EXCEPT ? POLLPRI : 0));
}

/* ------------------------------------------------------------------------ */
/* Statements' texts, and a hold's own connection                           */
/* ------------------------------------------------------------------------ */

/* A statement from fmt with %s replaced in order by the given strings
 * (numbers are formatted by the caller). Fresh buffer, or NULL. */
char *dlock__mysql_stmt(const char *fmt, ...)
{
    va_list ap;
    char *out;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !(out = malloc((size_t)n + 1)))
        return NULL;
    va_start(ap, fmt);
    vsnprintf(out, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return out;
}

/* An idle pinned connection that the server closed (restart, KILL,
 * wait_timeout) has something to read: it is dead, and its gate gone. */
int dlock__mysql_pinned_alive(my_lease *sl)
{
    struct pollfd p;

    if (!sl->cn || sl->cn->broken)
        return 0;
    p.fd = mysql_get_socket(sl->cn->m);
    p.events = POLLIN;
    p.revents = 0;
    if (poll(&p, 1, 0) == 0)
        return 1;
    sl->cn->broken = 1;
    return 0;
}

int dlock__mysql_killed(my_conn *cn)
{
    unsigned e = dlock__mysql_errno(cn);

    if (e != ER_CONNECTION_KILLED && e != CR_SERVER_LOST &&
        e != CR_SERVER_GONE_ERROR)
        return 0; /* not our own deadline: that one stays an error */
    cn->broken = 1;
    return 1;
}

/* A hold found gone by its renewal (broken, or taken over after its
 * lease) lets go of its connection's user-level locks at once (its gate,
 * or its hold lock), so that its waiters wake now, not at a release that
 * a hung owner may never make; the connection goes back to the pool. */
void dlock__mysql_let_go_lost(my_store *ms, my_lease *sl, int64_t deadline)
{
    if (!sl->cn)
        return;
    if (!dlock__mysql_pinned_alive(sl) ||
        dlock__mysql_query(ms, sl->cn, "DO RELEASE_ALL_LOCKS()", deadline,
                           NULL, NULL, NULL, "letting go of a lost lock") !=
            DLOCK_OK)
        sl->cn->broken = 1; /* closed: the server lets go */
    dlock__mysql_conn_put(ms, sl->cn);
    sl->cn = NULL;
    sl->gated = sl->locks = 0;
}
