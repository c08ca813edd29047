/* SPDX-License-Identifier: MIT */
/*
 * test_redis_tls.c -- the Redis store over TLS (rediss://, and redis://
 * with ?tls=1) against real redis-servers that have a plain and a TLS
 * port (th_redis_start_tls(); certificates from tests/servers/
 * tlscerts.sh): a lock is one lock whichever port its clients use, a
 * waiter over TLS is woken by its message (alone and in a burst whose
 * messages may come in one TLS read), a client over TLS comes back after
 * a restart, and every way TLS fails: DLOCK_ECONN at dlock_client_open()
 * within the connect timeout, the cause in OpenSSL's words, never a
 * password; bad URIs DLOCK_EINVAL.
 *
 * The generic suites run on TLS too (kind "rediss": store.rediss,
 * shared.rediss, ...); this file is what only TLS does.
 *
 * Timing: a failure the client finds itself (a certificate it does not
 * accept, a file it cannot read) takes milliseconds; the bound is the
 * connect timeout (the default 2 s, or the URI's) plus 3 s of slack for a
 * busy machine (stress-ng beside ctest -j). Under valgrind (make
 * valgrind sets DLOCK_UNDER_VALGRIND) OpenSSL's setup and handshake are
 * some 50 times slower: a refused open took 1.2 to 1.4 s there on an
 * idle machine, so the slack is 10 s. A wake-up is bounded well below the
 * 30 s leases and 60 s waits it must not wait out.
 */
#include "test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/socket.h>
#include <unistd.h>

/* the connect timeout when the URI sets none (dlock_client_options) */
#define DEFAULT_TIMEOUT 2000
/* slack on top of a timeout: see above */
static int64_t slack(void)
{
    return getenv("DLOCK_UNDER_VALGRIND") ? 10000 : 3000;
}

static th_redis srv;   /* server.crt (localhost only), no client certs */
static th_redis ipsrv; /* server-ip.crt (127.0.0.1 and localhost) */
static th_redis expsrv; /* expired.crt */
static th_redis mtls;  /* server.crt, tls-auth-clients yes */
static th_redis pwsrv; /* server.crt, requirepass */

#define PASSWORD "pw-SECRET7"

/* Started at first use: each test runs alone too (a filter). */
static th_redis *server(th_redis *r, const char *cert, int auth,
                        const char *extra)
{
    if (r->pid <= 0)
        th_redis_start_tls(r, cert, auth, extra);
    return r;
}

static th_redis *ip_server(void)
{
    return server(&ipsrv, "server-ip", 0, NULL);
}

static th_redis *expired_server(void)
{
    return server(&expsrv, "expired", 0, NULL);
}

static th_redis *mtls_server(void)
{
    return server(&mtls, "server", 1, NULL);
}

static th_redis *pw_server(void)
{
    return server(&pwsrv, "server", 0, "requirepass " PASSWORD "\n");
}

/* printf into one of a few rotating buffers (several in one call). */
static const char *strf(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static const char *strf(const char *fmt, ...)
{
    static char buf[8][4096];
    static int next;
    char *b = buf[next++ % 8];
    va_list ap;

    va_start(ap, fmt);
    if (vsnprintf(b, sizeof(buf[0]), fmt, ap) >= (int)sizeof(buf[0]))
        th_fail(__FILE__, __LINE__, "URI too long");
    va_end(ap);
    return b;
}

/* A file of the test certificates as a URI parameter value. */
static const char *cert(const char *file)
{
    static char buf[8][1024];
    static int next;

    return th_tls_param(buf[next++ % 8], sizeof(buf[0]), file);
}

static dlock *handle_flags(dlock_client *c, const char *name, int64_t ttl,
                          unsigned flags)
{
    return th_handle(c, name, ttl, flags, 0);
}

static dlock *handle(dlock_client *c, const char *name, int64_t ttl)
{
    return handle_flags(c, name, ttl, 0);
}

/* A client on uri takes and gives back a lock: the URI works. */
static void works(const char *uri)
{
    dlock_client *c = NULL;
    int rc = dlock_client_open(&c, uri, NULL);

    if (rc != DLOCK_OK)
        th_fail(__FILE__, __LINE__, "dlock_client_open(%s): %s: %s", uri,
                dlock_errname(rc), dlock_errmsg());
    dlock *l = handle(c, "tls-works", 0);
    CHECK_OK(dlock_acquire(l, 1000));
    CHECK_OP(dlock_token(l), >, 0);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    CHECK(strstr(dlock_client_store(c), "SECRET") == NULL);
    dlock_client_close(c);
}

/* 1 when msg contains one of the '|'-separated words, case ignored. */
static int says(const char *msg, const char *words)
{
    char w[256];

    for (const char *p = words; *p;) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        snprintf(w, sizeof(w), "%.*s", (int)n, p);
        if (n && strcasestr(msg, w))
            return 1;
        p += n + (bar != NULL);
    }
    return 0;
}

/* dlock_client_open(uri) fails with `code` (within timeout_ms +
 * slack()), no client, a message that says one of `causes`
 * and no password. Returns the time it took. */
static int64_t refused_as(int line, const char *uri, int code,
                          const char *causes, int64_t timeout_ms)
{
    dlock_client *c = NULL;
    int64_t t0 = th_now_ms();
    int rc = dlock_client_open(&c, uri, NULL);
    int64_t took = th_now_ms() - t0;
    const char *msg = dlock_errmsg();

    if (rc != code)
        th_fail(__FILE__, line, "dlock_client_open(%s) returned %s, expected "
                "%s: %s", uri, dlock_errname(rc), dlock_errname(code), msg);
    if (c != NULL)
        th_fail(__FILE__, line, "a failed open left a client");
    if (!says(msg, causes))
        th_fail(__FILE__, line, "the message of %s does not say '%s': \"%s\"",
                uri, causes, msg);
    if (strstr(msg, "SECRET"))
        th_fail(__FILE__, line, "a password in the message: \"%s\"", msg);
    if (took >= timeout_ms + slack())
        th_fail(__FILE__, line, "%s took %lld ms (timeout %lld ms)", uri,
                (long long)took, (long long)timeout_ms);
    return took;
}

#define REFUSED(uri, causes) \
    refused_as(__LINE__, (uri), DLOCK_ECONN, (causes), DEFAULT_TIMEOUT)
#define REFUSED_T(uri, causes, timeout) \
    refused_as(__LINE__, (uri), DLOCK_ECONN, (causes), (timeout))
/* URI errors: refused before any connection (the bound is the same) */
#define INVALID(uri, causes) \
    refused_as(__LINE__, (uri), DLOCK_EINVAL, (causes), DEFAULT_TIMEOUT)

/* ------------------------------------------------------------------------ */
/* A server that is no TLS server: answers anything with a Redis error    */
/* ------------------------------------------------------------------------ */

/* Listens on a free loopback port; every connection gets "-ERR ..." at
 * once (what a plain Redis port says to bytes it cannot parse), then is
 * read until the client closes it (2 s at most). One connection at a
 * time; the thread ends at `stop` or after 60 s. */
typedef struct plain_talker {
    int lfd, port, stop;
    pthread_t th;
} plain_talker;

static void *talker_thread(void *arg)
{
    plain_talker *t = arg;
    int64_t until = th_now_ms() + 60000;

    while (!__atomic_load_n(&t->stop, __ATOMIC_SEQ_CST) &&
           th_now_ms() < until) {
        struct pollfd p = {t->lfd, POLLIN, 0};
        if (poll(&p, 1, 100) != 1)
            continue;
        int fd = accept(t->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        static const char err[] = "-ERR this port does not speak TLS\r\n";
        ssize_t w = send(fd, err, sizeof(err) - 1, MSG_NOSIGNAL);
        (void)w;
        int64_t end = th_now_ms() + 2000;
        for (;;) {
            char buf[512];
            struct pollfd q = {fd, POLLIN, 0};
            int64_t left = end - th_now_ms();
            if (left <= 0 || poll(&q, 1, (int)left) != 1)
                break;
            if (recv(fd, buf, sizeof(buf), 0) <= 0)
                break;
        }
        close(fd);
    }
    return NULL;
}

static void talker_start(plain_talker *t)
{
    struct sockaddr_in a;
    socklen_t len = sizeof(a);
    int one = 1;

    memset(t, 0, sizeof(*t));
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    t->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(t->lfd >= 0);
    setsockopt(t->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    CHECK_EQ(bind(t->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    CHECK_EQ(listen(t->lfd, 8), 0);
    CHECK_EQ(getsockname(t->lfd, (struct sockaddr *)&a, &len), 0);
    t->port = ntohs(a.sin_port);
    CHECK_EQ(pthread_create(&t->th, NULL, talker_thread, t), 0);
}

static void talker_stop(plain_talker *t)
{
    __atomic_store_n(&t->stop, 1, __ATOMIC_SEQ_CST);
    pthread_join(t->th, NULL);
    close(t->lfd);
}

/* ------------------------------------------------------------------------ */

/* The harness's servers speak TLS with the test certificates, checked with
 * redis-cli alone: when a test below fails, the library is to blame, not
 * the setup. */
TEST(the_servers_speak_tls_to_redis_cli)
{
    char out[256];

    CHECK_EQ(th_redis_tls_cli(&srv, out, sizeof(out), "PING"), 0);
    CHECK_STR(out, "PONG");
    CHECK_EQ(th_redis_tls_cli(ip_server(), out, sizeof(out), "PING"), 0);
    CHECK_STR(out, "PONG");
    /* tls-auth-clients yes: with the client certificate it answers */
    CHECK_EQ(th_redis_tls_cli(mtls_server(), out, sizeof(out), "PING"), 0);
    CHECK_STR(out, "PONG");
    /* the plain port is the same server */
    CHECK_EQ(th_redis_cmd(&srv, NULL, 0, "SET tls:probe %s", "same"), 0);
    CHECK_EQ(th_redis_tls_cli(&srv, out, sizeof(out), "GET tls:probe"), 0);
    CHECK_STR(out, "same");
    CHECK_EQ(th_redis_cmd(&srv, NULL, 0, "DEL tls:probe"), 1);
}

/* One lock whatever the port: a hold over TLS keeps out a client on the
 * plain port of the same server, and the reverse. */
TEST(tls_and_plain_clients_exclude_each_other)
{
    dlock_client *t = th_client(srv.tls_uri, NULL),
                 *p = th_client(srv.uri, NULL);
    dlock *lt = handle(t, "tls-both", 0), *lp = handle(p, "tls-both", 0);

    CHECK_OK(dlock_acquire(lt, 0));
    uint64_t tok = dlock_token(lt);
    CHECK_RC(dlock_acquire(lp, 0), DLOCK_EBUSY);
    CHECK_RC(dlock_acquire(lp, 100), DLOCK_EBUSY);
    CHECK_OK(dlock_release(lt));

    CHECK_OK(dlock_acquire(lp, 0));
    CHECK_OP(dlock_token(lp), >, tok);
    CHECK_RC(dlock_acquire(lt, 0), DLOCK_EBUSY);
    CHECK_RC(dlock_acquire(lt, 100), DLOCK_EBUSY);
    CHECK_OK(dlock_release(lp));
    CHECK_OK(dlock_acquire(lt, 0));
    CHECK_OK(dlock_release(lt));

    TH_CLOSE(lt, lp);
    TH_CLIENT_CLOSE(t, p);
}

/* A waiter is woken by the release's message, whichever ports the waiter
 * and the releaser use. */
static void woken_across(dlock_client *holder_c, dlock_client *waiter_c,
                         const char *name)
{
    dlock *h = handle(holder_c, name, 30000);
    th_waiter w;
    pthread_t th;

    memset(&w, 0, sizeof(w));
    w.l = handle(waiter_c, name, 0);
    CHECK_OK(dlock_acquire(h, 0));
    uint64_t tok = dlock_token(h);
    th_waiter_start(&w, &th);
    th_wait_waiters(holder_c, name, 1);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(h));
    pthread_join(th, NULL);
    CHECK_RC(w.rc, DLOCK_OK);
    CHECK_OP(w.token, >, tok);
    /* the message, not the 30 s lease nor the 60 s wait: 5 s is slack
     * for a busy machine */
    CHECK_OP(w.done_at - t0, <, 5000);
    dlock_close(h);
    dlock_close(w.l);
}

TEST(a_tls_waiter_is_woken_by_a_plain_release)
{
    dlock_client *t = th_client(srv.tls_uri, NULL),
                 *p = th_client(srv.uri, NULL);

    woken_across(p, t, "tls-wake-1");
    /* and the other way round */
    woken_across(t, p, "tls-wake-2");
    /* both over TLS */
    dlock_client *t2 = th_client(srv.tls_uri, NULL);
    woken_across(t2, t, "tls-wake-3");
    TH_CLIENT_CLOSE(t2, t, p);
}

/* redis://...?tls=1 is rediss://: the same lock as the plain port's. */
TEST(tls_parameter_on_redis_scheme)
{
    const char *uri =
        strf("redis://localhost:%d?tls=1&cacert=%s", srv.tls_port,
             cert("ca.crt"));
    dlock_client *t = th_client(uri, NULL), *p = th_client(srv.uri, NULL);
    dlock *lt = handle(t, "tls-param", 0), *lp = handle(p, "tls-param", 0);

    CHECK_OK(dlock_acquire(lt, 0));
    CHECK_RC(dlock_acquire(lp, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_release(lt));
    TH_CLOSE(lt, lp);
    TH_CLIENT_CLOSE(t, p);
    /* and its failures are the same as rediss:// */
    REFUSED(strf("redis://localhost:%d?tls=1&cacert=%s", srv.tls_port,
                 cert("other-ca.crt")),
            "certificate");
}

/* ------------------------------------------------------------------------ */
/* What TLS refuses: DLOCK_ECONN at open, the cause named                  */
/* ------------------------------------------------------------------------ */

TEST(an_unknown_ca_is_refused)
{
    /* the server's certificate was not signed by the CA given */
    REFUSED(strf("rediss://localhost:%d?cacert=%s", srv.tls_port,
                 cert("other-ca.crt")),
            "certificate");
    /* no cacert: the system's trust store, which has no test CA */
    REFUSED(strf("rediss://localhost:%d", srv.tls_port), "certificate");
    REFUSED(strf("redis://localhost:%d?tls=1", srv.tls_port), "certificate");
}

TEST(a_name_mismatch_is_refused)
{
    /* server.crt names localhost only (DNS), not the address 127.0.0.1 */
    REFUSED(strf("rediss://127.0.0.1:%d?cacert=%s", srv.tls_port,
                 cert("ca.crt")),
            "mismatch");
    /* sni= is the name checked: another name than the certificate's */
    REFUSED(strf("rediss://localhost:%d?cacert=%s&sni=other.example",
                 srv.tls_port, cert("ca.crt")),
            "mismatch");
}

TEST(an_ip_san_and_sni_are_accepted)
{
    /* server-ip.crt has IP:127.0.0.1: reached by that address */
    works(strf("rediss://127.0.0.1:%d?cacert=%s", ip_server()->tls_port,
               cert("ca.crt")));
    /* and DNS:localhost */
    works(strf("rediss://localhost:%d?cacert=%s", ip_server()->tls_port,
               cert("ca.crt")));
    /* server.crt (localhost only) by address, with sni=localhost: the
     * name sent and checked is localhost */
    works(strf("rediss://127.0.0.1:%d?cacert=%s&sni=localhost",
               srv.tls_port, cert("ca.crt")));
}

TEST(an_expired_certificate_is_refused)
{
    REFUSED(strf("rediss://localhost:%d?cacert=%s",
                 expired_server()->tls_port, cert("ca.crt")),
            "expired");
}

TEST(insecure_turns_verification_off)
{
    /* a CA that did not sign it, no CA at all, a wrong name, an expired
     * certificate: insecure=1 connects all the same (it says so) */
    works(strf("rediss://localhost:%d?cacert=%s&insecure=1", srv.tls_port,
               cert("other-ca.crt")));
    works(strf("rediss://localhost:%d?insecure=1", srv.tls_port));
    works(strf("rediss://127.0.0.1:%d?insecure=1", srv.tls_port));
    works(strf("rediss://localhost:%d?insecure=1",
               expired_server()->tls_port));
}

TEST(unreadable_files_are_refused)
{
    const char *d = th_tls_certs();
    char garbage[700];
    FILE *f;

    snprintf(garbage, sizeof(garbage), "%s/garbage.pem", d);
    f = fopen(garbage, "w");
    CHECK(f != NULL);
    fputs("-----BEGIN CERTIFICATE-----\nnot base64 at all\n"
          "-----END CERTIFICATE-----\n",
          f);
    fclose(f);
    /* OpenSSL says what is wrong with a file; the message names the
     * file or says it in OpenSSL's words */
    static const char *const missing = "nope.pem|no such file";
    static const char *const bad =
        "garbage.pem|pem|no start line|no certificate|decod|unsupported|"
        "bad base64|asn1";
    REFUSED(strf("rediss://localhost:%d?cacert=%s", srv.tls_port,
                 cert("nope.pem")),
            missing);
    REFUSED(strf("rediss://localhost:%d?cacert=%s", srv.tls_port,
                 cert("garbage.pem")),
            bad);
    REFUSED(strf("rediss://localhost:%d?cacert=%s&cert=%s&key=%s",
                 mtls_server()->tls_port, cert("ca.crt"), cert("nope.pem"),
                 cert("client.key")),
            missing);
    REFUSED(strf("rediss://localhost:%d?cacert=%s&cert=%s&key=%s",
                 mtls.tls_port, cert("ca.crt"), cert("client.crt"),
                 cert("nope.pem")),
            missing);
    REFUSED(strf("rediss://localhost:%d?cacert=%s&cert=%s&key=%s",
                 mtls.tls_port, cert("ca.crt"), cert("garbage.pem"),
                 cert("client.key")),
            bad);
    REFUSED(strf("rediss://localhost:%d?cacert=%s&cert=%s&key=%s",
                 mtls.tls_port, cert("ca.crt"), cert("client.crt"),
                 cert("garbage.pem")),
            bad);
    /* a directory is no file either */
    REFUSED(strf("rediss://localhost:%d?cacert=%s", srv.tls_port,
                 cert("")),
            "directory|is a dir|read|no certificate|pem|no such file|"
            "certificate");
    remove(garbage);
}

TEST(a_key_not_matching_its_certificate_is_refused)
{
    /* mismatch.key is not client.crt's key */
    REFUSED(strf("rediss://localhost:%d?cacert=%s&cert=%s&key=%s",
                 mtls_server()->tls_port, cert("ca.crt"),
                 cert("client.crt"), cert("mismatch.key")),
            "mismatch|does not match|key values");
}

/* A plain port spoken to as TLS: the TLS client reads a Redis error
 * where a ServerHello belongs ("wrong version number", OpenSSL 3.0), or,
 * from a real Redis port, nothing at all: Redis waits for the end of an
 * inline command that a ClientHello seldom ends, so the handshake runs
 * out of time, within the URI's timeout. */
TEST(a_plain_port_spoken_to_as_tls_is_refused)
{
    plain_talker pt;

    talker_start(&pt);
    REFUSED(strf("rediss://127.0.0.1:%d?cacert=%s&sni=localhost", pt.port,
                 cert("ca.crt")),
            "wrong version number");
    talker_stop(&pt);
    /* the real plain port of the server; 500 ms: the wait is the point */
    REFUSED_T(strf("rediss://127.0.0.1:%d?cacert=%s&sni=localhost&"
                   "timeout=500",
                   srv.port, cert("ca.crt")),
              "wrong version number|no answer|time", 500);
}

/* A TLS port spoken to as plain: the server finds no TLS record and
 * closes the connection. */
TEST(a_tls_port_spoken_to_as_plain_is_refused)
{
    REFUSED(strf("redis://127.0.0.1:%d", srv.tls_port),
            "closed|reset|eof|connection");
    REFUSED(strf("redis://localhost:%d?prefix=x:", srv.tls_port),
            "closed|reset|eof|connection");
}

/* tls-auth-clients yes: a client without a certificate is refused (in
 * TLS 1.3 the server's alert comes after the client's side of the
 * handshake, at the first read: still at open); with one signed by the
 * CA the server trusts, it works. */
TEST(client_certificates)
{
    th_redis *m = mtls_server();

    REFUSED(strf("rediss://localhost:%d?cacert=%s", m->tls_port,
                 cert("ca.crt")),
            "certificate|required|handshake");
    works(m->tls_uri);
    works(strf("rediss://localhost:%d?cacert=%s&cert=%s&key=%s",
               m->tls_port, cert("ca.crt"), cert("client.crt"),
               cert("client.key")));
    /* the plain port asks for nothing */
    works(m->uri);
}

/* A password never shows in a message, whatever fails. */
TEST(a_password_never_appears_in_messages)
{
    th_redis *s = pw_server();
    const char *ca = cert("ca.crt");
    int port = s->tls_port;

    /* the right one works over TLS, and is not shown */
    works(strf("rediss://:%s@localhost:%d?cacert=%s", PASSWORD, port, ca));
    works(strf("rediss://default:%s@localhost:%d?cacert=%s", PASSWORD, port,
               ca));
    /* a wrong one: refused by the server, over TLS */
    refused_as(__LINE__,
               strf("rediss://:%s-wrong@localhost:%d?cacert=%s", PASSWORD, port,
                    ca),
               DLOCK_EAUTH, "auth", DEFAULT_TIMEOUT);
    /* every TLS failure, with a password in the URI */
    REFUSED(strf("rediss://u:%s@localhost:%d?cacert=%s", PASSWORD, port,
                 cert("other-ca.crt")),
            "certificate");
    REFUSED(strf("rediss://u:%s@127.0.0.1:%d?cacert=%s", PASSWORD, port, ca),
            "mismatch");
    REFUSED(strf("rediss://u:%s@localhost:%d?cacert=%s", PASSWORD,
                 expired_server()->tls_port, ca),
            "expired");
    REFUSED(strf("rediss://u:%s@localhost:%d?cacert=%s", PASSWORD, port,
                 cert("nope.pem")),
            "nope.pem|no such file");
    REFUSED(strf("rediss://u:%s@localhost:%d?cacert=%s&cert=%s&key=%s",
                 PASSWORD, mtls_server()->tls_port, ca, cert("client.crt"),
                 cert("mismatch.key")),
            "mismatch|does not match|key values");
    REFUSED(strf("rediss://u:%s@localhost:%d?cacert=%s", PASSWORD,
                 mtls.tls_port, ca),
            "certificate|required|handshake");
    REFUSED_T(strf("rediss://u:%s@127.0.0.1:%d?cacert=%s&sni=localhost&"
                   "timeout=500",
                   PASSWORD, s->port, ca),
              "wrong version number|no answer|time", 500);
    REFUSED(strf("redis://u:%s@127.0.0.1:%d", PASSWORD, port),
            "closed|reset|eof|connection");
    /* and URI errors */
    INVALID(strf("rediss://u:%s@localhost:%d?cacert=%s&bogus=1", PASSWORD,
                 port, ca),
            "bogus");
    INVALID(strf("rediss://u:%s@localhost:%d?cacert=%s&cert=%s", PASSWORD,
                 port, ca, cert("client.crt")),
            "key");
}

/* Several waiters of one client over TLS (one subscriber connection), on
 * several locks released at once, all woken by their messages. The
 * releases are held back by the server (CLIENT PAUSE) and then run in one
 * go, so their messages leave in one write, likely one TLS record: the
 * client must read every message of a record it decrypted (OpenSSL keeps
 * what it read ahead, out of poll()'s sight). */
#define BURST 8
/* rounds, on the same two clients: a client that waited before must
 * still get every wake-up (a lost one showed as a waiter returning 10 s
 * late, in the second round or later, over plain TCP too) */
#define BURST_ROUNDS 4

typedef struct releaser {
    dlock *l;
    int *go;
    int rc;
} releaser;

static void *release_thread(void *arg)
{
    releaser *r = arg;
    int64_t until = th_now_ms() + 30000;

    while (!__atomic_load_n(r->go, __ATOMIC_SEQ_CST) && th_now_ms() < until)
        th_sleep_ms(1);
    r->rc = dlock_release(r->l);
    return NULL;
}

/* The burst, the waiters' client on `uri`. */
static void burst(const char *uri)
{
    dlock_client *t = th_client(uri, NULL), *p = NULL;
    char name[64], ok[64];

    /* the holders' client waits out the pause: 10 s round trips */
    CHECK_OK(dlock_client_open(&p, srv.uri, th_patient()));
    for (int round = 0; round < BURST_ROUNDS; round++) {
        dlock *h[BURST];
        th_waiter w[BURST];
        releaser r[BURST];
        pthread_t wt[BURST], rt[BURST];
        uint64_t tok[BURST];
        int go = 0;

        memset(w, 0, sizeof(w));
        for (int i = 0; i < BURST; i++) {
            snprintf(name, sizeof(name), "tls-burst-%d-%d", round, i);
            /* released by a thread of its own: the handle's hold */
            h[i] = handle_flags(p, name, 30000, DLOCK_OWNER_HANDLE);
            CHECK_OK(dlock_acquire(h[i], 0));
            tok[i] = dlock_token(h[i]);
            w[i].l = handle(t, name, 0);
            th_waiter_start(&w[i], &wt[i]);
        }
        for (int i = 0; i < BURST; i++) {
            snprintf(name, sizeof(name), "tls-burst-%d-%d", round, i);
            th_wait_waiters(p, name, 1);
        }
        for (int i = 0; i < BURST; i++) {
            r[i].l = h[i];
            r[i].go = &go;
            r[i].rc = -100;
            CHECK_EQ(pthread_create(&rt[i], NULL, release_thread, &r[i]), 0);
        }
        /* even rounds: the server holds every command for 1 s (the
         * releases queue up and run together); odd rounds: as they come
         * (pipelined on the holders' one connection, often run in one go
         * all the same) */
        if (round % 2 == 0) {
            CHECK_EQ(th_redis_cmd(&srv, ok, sizeof(ok),
                                  "CLIENT PAUSE 1000 ALL"),
                     0);
            CHECK_STR(ok, "OK");
        }
        int64_t t0 = th_now_ms();
        __atomic_store_n(&go, 1, __ATOMIC_SEQ_CST);
        for (int i = 0; i < BURST; i++) {
            pthread_join(rt[i], NULL);
            CHECK_RC(r[i].rc, DLOCK_OK);
        }
        for (int i = 0; i < BURST; i++) {
            pthread_join(wt[i], NULL);
            CHECK_RC(w[i].rc, DLOCK_OK);
            CHECK_OP(w[i].token, >, tok[i]);
            /* woken by its message: the 1 s pause, then 5 s of slack for a
             * busy machine; far from the 30 s leases and 60 s waits */
            CHECK_OP(w[i].done_at - t0, <, 1000 + 5000);
            dlock_close(w[i].l);
            dlock_close(h[i]);
        }
    }
    TH_CLIENT_CLOSE(t, p);
}

TEST(a_burst_of_wakeups_over_tls)
{
    burst(srv.tls_uri);
}

/* The same over plain TCP: a waiter that read the subscriber connection
 * for its client and was granted passed the reading to a sleeping waiter
 * granted in the same read, which left without reading: the others slept
 * until the background thread's next wake-up, 10 s (src/core/lock.c,
 * sleep_until(); found by this test, 4 runs in 10) */
TEST(a_burst_of_wakeups_over_plain_tcp)
{
    burst(srv.uri);
}

/* The server restarted (empty): a client over TLS connects again (a new
 * handshake) and its waits are woken again (its subscriber connection too
 * is a new TLS one). A wait in progress rides the restart out (docs/
 * design.md, "Waiting through failovers and restarts"): it used to end
 * DLOCK_ECONN when the connection broke. */
TEST(a_tls_client_comes_back_after_a_restart)
{
    th_redis s;
    th_waiter w;
    pthread_t th;

    th_redis_start_tls(&s, "server", 0, NULL);
    dlock_client *a = th_client(s.tls_uri, NULL),
                 *b = th_client(s.tls_uri, NULL);
    dlock *la = handle(a, "tls-restart", 30000);

    memset(&w, 0, sizeof(w));
    w.l = handle(b, "tls-restart", 0);
    CHECK_OK(dlock_acquire(la, 0));
    uint64_t tok = dlock_token(la);
    th_waiter_start(&w, &th);
    th_wait_waiters(a, "tls-restart", 1);
    th_redis_kill(&s, SIGKILL);
    /* a try while it is down fails at once (another thread's handle) */
    dlock *lt = handle(b, "tls-restart-try", 0);
    CHECK_RC(dlock_acquire(lt, 0), DLOCK_ECONN);
    dlock_close(lt);
    th_sleep_ms(300);
    CHECK_EQ(__atomic_load_n(&w.done, __ATOMIC_SEQ_CST), 0); /* waits on */

    th_redis_restart(&s); /* the same ports and certificate, no data */
    pthread_join(th, NULL);
    CHECK_RC(w.rc, DLOCK_OK); /* connected again, over TLS, in its wait */
    CHECK_OP(w.token, >, tok); /* time-based tokens keep growing */
    /* (the waiter released it) */
    /* the restart lost a's hold; a's release says so */
    CHECK_RC(dlock_release(la), DLOCK_ELOST);

    /* b's waits are woken again, by a release on the plain port */
    dlock_client *p = th_client(s.uri, NULL);
    woken_across(p, b, "tls-restart-2");
    woken_across(a, b, "tls-restart-3");
    dlock_client_close(p);
    dlock_close(la);
    dlock_close(w.l);
    TH_CLIENT_CLOSE(a, b);
    th_redis_kill(&s, SIGKILL);
}

/* URI errors: DLOCK_EINVAL, before anything is connected. */
TEST(uri_errors)
{
    const char *ca = cert("ca.crt");

    /* a Unix socket has no TLS */
    INVALID(strf("unix://%s?tls=1", srv.sock), "tls");
    INVALID(strf("unix://%s?cacert=%s", srv.sock, ca), "cacert|tls");
    INVALID(strf("unix://%s?cert=%s&key=%s", srv.sock, cert("client.crt"),
                 cert("client.key")),
            "cert|key|tls");
    INVALID(strf("unix://%s?sni=localhost", srv.sock), "sni|tls");
    INVALID(strf("unix://%s?insecure=1", srv.sock), "insecure|tls");
    /* the same socket without them works */
    works(strf("unix://%s", srv.sock));
    /* a parameter nobody knows */
    INVALID(strf("rediss://localhost:%d?cacert=%s&bogus=1", srv.tls_port,
                 ca),
            "bogus");
    INVALID(strf("rediss://localhost:%d?bogus=1", srv.tls_port), "bogus");
    INVALID(strf("redis://localhost:%d?tls=1&cacert=%s&bogus=1",
                 srv.tls_port, ca),
            "bogus");
    /* a client certificate without its key */
    INVALID(strf("rediss://localhost:%d?cacert=%s&cert=%s",
                 mtls_server()->tls_port, ca, cert("client.crt")),
            "key");
}

static const th_test tests[] = {
    T(the_servers_speak_tls_to_redis_cli),
    T(tls_and_plain_clients_exclude_each_other),
    T(a_tls_waiter_is_woken_by_a_plain_release),
    T(tls_parameter_on_redis_scheme),
    T(an_unknown_ca_is_refused),
    T(a_name_mismatch_is_refused),
    T(an_ip_san_and_sni_are_accepted),
    T(an_expired_certificate_is_refused),
    T(insecure_turns_verification_off),
    T(unreadable_files_are_refused),
    T(a_key_not_matching_its_certificate_is_refused),
    T(a_plain_port_spoken_to_as_tls_is_refused),
    T(a_tls_port_spoken_to_as_plain_is_refused),
    T(client_certificates),
    T(a_password_never_appears_in_messages),
    T(a_burst_of_wakeups_over_tls),
    T(a_burst_of_wakeups_over_plain_tcp),
    T(a_tls_client_comes_back_after_a_restart),
    T(uri_errors),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    th_need_redis_tls();
    th_redis_start_tls(&srv, "server", 0, NULL);
    return th_main(argc, argv, tests);
}
