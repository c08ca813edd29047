/* SPDX-License-Identifier: MIT */
/*
 * bench_tls.c -- Redis over TLS (rediss://) beside the least a TLS client
 * does for the same work, on one redis-server with a TLS port and a plain
 * port, in one run. The target: "uncontended cycle over TLS <= 1.1x the
 * TLS floor: the same acquire and release commands sent over one TLS
 * connection by the bench itself, in the same run".
 *
 *   dlock_bench_tls TLS_PORT PLAIN_PORT CACERT DLOCK [--quick]
 *
 * bench/run.sh makes the certificates (a CA and a server certificate for
 * DNS:localhost, EC P-256, the openssl CLI) and starts the server
 * (--tls-port TLS_PORT beside --port PLAIN_PORT, --tls-auth-clients no).
 * Everything connects to 127.0.0.1 and checks the certificate for the
 * name `localhost` (sent as SNI too); DLOCK is the CLI's path.
 *
 * The floors are dlock's own commands, captured and replayed. Capture
 * (before any timing, once per dlock kind, on that kind's own client and
 * lock, after one warm-up cycle): a hiredis connection to the plain port
 * sends MONITOR, then one dlock_acquire + dlock_release runs, bracketed
 * by ECHO markers sent on another plain connection (the server runs
 * commands in order: what comes between the first two markers is the
 * acquire's, between the last two the release's). Each MONITOR line
 * (`TIME [DB ADDR] "ARG" ...`, C-style escapes inside the quotes) is split
 * by hiredis' sdssplitargs; kept are the EVALSHA calls that name the
 * lock's key (not the scripts' own calls, `[0 lua]`, nor anything else:
 * they are listed on stderr for the record). The MONITOR connection has
 * a read timeout and is closed before the timing; fewer than one command
 * on either side is fatal. The release script takes the key, the owner,
 * the channel and a time, no token: a replayed acquire + release is a
 * whole cycle on the same key, with the same owner, as dlock's (never at
 * the same time as dlock's: the kinds take turns, and each cycle ends
 * released). A replayed cycle checks its replies: the acquire's a token
 * (a string), the release's 1; anything else is fatal.
 *
 * Cycles: an uncontended acquire + release, five kinds alternating in
 * chunks (chunked_ops), each on one connection or client throughout:
 *   TLS floor     the bench's own TLS client: a TCP connection, OpenSSL's
 *                 SSL_connect with the CA and the host name checked, then
 *                 the commands captured from "dlock, TLS", each formatted
 *                 by hiredis' redisFormatCommandArgv, written with one
 *                 SSL_write and its reply parsed by hiredis' redisReader
 *                 from SSL_read: what hiredis does over a socket, over TLS
 *   dlock, TLS    dlock_acquire + dlock_release on rediss://
 *   plain floor   the commands captured from "dlock, plain", through
 *                 hiredis' redisCommandArgv on the plain port
 *   dlock, plain  the same on redis:// (the plain port)
 *   bench.c's floor over TLS   context only: bench.c's floor cycle (SET
 *                 NX PX, then EVALSHA of a compare-and-delete script) on
 *                 the TLS floor's connection
 * A chunk's figure is its p50; a ratio is the median of the chunks'
 * ratios, with their range.
 *
 * Commands: whole processes timed from posix_spawn() to waitpid() (as
 * bench_cli.c does): `dlock run` over rediss:// and redis:// beside
 * `redis-cli PING` over TLS and plain (each a new process: a connection
 * and a full handshake), and `true` alone, in turns within chunks.
 *
 * Prints Markdown: a subsection for the Redis section.
 */
#include <dlock.h>
#include <hiredis.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

const char bench_prog[] = "bench_tls";

extern char **environ;

#define CHUNKS 15
#define HOST "127.0.0.1"
#define NAME "localhost" /* the certificate's name, checked; the SNI */
#define OWNER "owner-0123456789abcdef"
#define SCRIPT                                                              \
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "                       \
    "return redis.call('DEL', KEYS[1]) end return 0"

/* ------------------------------------------------------------------------ */
/* The TLS floor: the bench's own minimal client                            */
/* ------------------------------------------------------------------------ */

typedef struct tls_floor {
    int fd;
    SSL_CTX *ctx;
    SSL *ssl;
    redisReader *rd;
    char sha[41];
} tls_floor;

static void ssl_die(const char *what)
{
    char buf[256];
    unsigned long e = ERR_get_error();

    if (e)
        ERR_error_string_n(e, buf, sizeof(buf));
    else
        snprintf(buf, sizeof(buf), "%s", errno ? strerror(errno) : "failed");
    die(what, buf);
}

static void tls_connect(tls_floor *t, int port, const char *cacert)
{
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port)};
    int one = 1;

    memset(t, 0, sizeof(*t));
    inet_pton(AF_INET, HOST, &sa.sin_addr);
    t->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (t->fd < 0 || connect(t->fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
        die("TLS floor: connect", strerror(errno));
    setsockopt(t->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    t->ctx = SSL_CTX_new(TLS_client_method());
    if (!t->ctx)
        ssl_die("TLS floor: SSL_CTX_new");
    SSL_CTX_set_min_proto_version(t->ctx, TLS1_2_VERSION);
    if (SSL_CTX_load_verify_locations(t->ctx, cacert, NULL) != 1)
        ssl_die("TLS floor: cacert");
    SSL_CTX_set_verify(t->ctx, SSL_VERIFY_PEER, NULL);
    t->ssl = SSL_new(t->ctx);
    if (!t->ssl || SSL_set_fd(t->ssl, t->fd) != 1 ||
        SSL_set1_host(t->ssl, NAME) != 1 ||
        SSL_set_tlsext_host_name(t->ssl, NAME) != 1)
        ssl_die("TLS floor: SSL_new");
    if (SSL_connect(t->ssl) != 1) {
        long v = SSL_get_verify_result(t->ssl);
        if (v != X509_V_OK)
            die("TLS floor: handshake", X509_verify_cert_error_string(v));
        ssl_die("TLS floor: handshake");
    }
    t->rd = redisReaderCreate();
    if (!t->rd)
        die("TLS floor", "out of memory");
}

/* One command: formatted by hiredis, one SSL_write, its reply parsed by
 * hiredis' reader from SSL_read (dies on an error reply). */
static redisReply *tls_command(tls_floor *t, const char *what,
                               const char *fmt, ...)
{
    char *cmd;
    va_list ap;
    void *reply = NULL;

    va_start(ap, fmt);
    int len = redisvFormatCommand(&cmd, fmt, ap);
    va_end(ap);
    if (len < 0)
        die(what, "cannot format");
    for (int off = 0; off < len;) {
        int w = SSL_write(t->ssl, cmd + off, len - off);
        if (w <= 0)
            ssl_die(what);
        off += w;
    }
    redisFreeCommand(cmd);
    for (;;) {
        if (redisReaderGetReply(t->rd, &reply) != REDIS_OK)
            die(what, t->rd->errstr);
        if (reply)
            break;
        char buf[16 * 1024];
        int r = SSL_read(t->ssl, buf, sizeof(buf));
        if (r <= 0)
            ssl_die(what);
        redisReaderFeed(t->rd, buf, (size_t)r);
    }
    redisReply *rp = reply;
    if (rp->type == REDIS_REPLY_ERROR)
        die(what, rp->str);
    return rp;
}

static void tls_floor_once(void *arg)
{
    tls_floor *t = arg;

    freeReplyObject(tls_command(t, "TLS floor: SET",
                                "SET floor-tls:{k} " OWNER " NX PX 30000"));
    freeReplyObject(tls_command(t, "TLS floor: EVALSHA",
                                "EVALSHA %s 1 floor-tls:{k} " OWNER, t->sha));
}

static void tls_close(tls_floor *t)
{
    SSL_shutdown(t->ssl);
    SSL_free(t->ssl);
    SSL_CTX_free(t->ctx);
    close(t->fd);
    redisReaderFree(t->rd);
}

/* ------------------------------------------------------------------------ */
/* The plain floor: hiredis, as bench.c                                     */
/* ------------------------------------------------------------------------ */

typedef struct plain_floor {
    redisContext *c;
    char sha[41];
} plain_floor;

static void reply_ok(redisReply *r, const char *what)
{
    if (!r || r->type == REDIS_REPLY_ERROR)
        die(what, r ? r->str : "no reply");
    freeReplyObject(r);
}

static void plain_floor_once(void *arg)
{
    plain_floor *f = arg;

    reply_ok(redisCommand(f->c, "SET floor-plain:{k} " OWNER " NX PX 30000"),
             "plain floor: SET");
    reply_ok(redisCommand(f->c, "EVALSHA %s 1 floor-plain:{k} " OWNER,
                          f->sha),
             "plain floor: EVALSHA");
}

/* ------------------------------------------------------------------------ */
/* Whole commands                                                           */
/* ------------------------------------------------------------------------ */

typedef struct cmd_kind {
    const char *label; /* Markdown */
    char *argv[16];
    int pathsearch; /* posix_spawnp */
    int64_t *ns;
    int n;
    double chunk_p50[CHUNKS];
} cmd_kind;

static posix_spawn_file_actions_t to_null;
static char **env; /* environ without DLOCK_STORE */

static int64_t run_once(const cmd_kind *k)
{
    pid_t pid;
    int st, rc;
    int64_t t0 = now_ns();

    rc = k->pathsearch
             ? posix_spawnp(&pid, k->argv[0], &to_null, NULL, k->argv, env)
             : posix_spawn(&pid, k->argv[0], &to_null, NULL, k->argv, env);
    if (rc != 0)
        die(k->argv[0], strerror(rc));
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            die("waitpid", strerror(errno));
    int64_t t = now_ns() - t0;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        char msg[64];
        snprintf(msg, sizeof(msg), "failed (wait status %d)", st);
        die(k->label, msg);
    }
    return t;
}

static char **env_without_store(void)
{
    size_t n = 0, o = 0;

    while (environ[n])
        n++;
    char **e = calloc(n + 1, sizeof(*e));
    if (!e)
        die("env", "out of memory");
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "DLOCK_STORE=", 12))
            e[o++] = environ[i];
    e[o] = NULL;
    return e;
}

static double pct_ms(const int64_t *sorted, int n, double p)
{
    int i = (int)(n * p);
    return (double)sorted[i < n ? i : n - 1] / 1e6;
}

/* ------------------------------------------------------------------------ */

static void print_ratio(const double *num, const double *den, int bold,
                        const char *note)
{
    spread r = ratios(num, den, CHUNKS);

    printf("%s%.2fx%s (%.2f–%.2f%s%s)", bold ? "**" : "", r.med,
           bold ? "**" : "", r.min, r.max, note ? "; " : "", note ? note : "");
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: dlock_bench_tls TLS_PORT PLAIN_PORT CACERT "
                        "DLOCK [--quick]\n");
        return 2;
    }
    int tport = atoi(argv[1]), pport = atoi(argv[2]);
    const char *ca = argv[3];
    char *dlock_bin = argv[4];
    int quick = argc > 5 && !strcmp(argv[5], "--quick");
    int n = quick ? 2000 : 20000;
    int per_chunk = quick ? 2 : 10;
    char tls_uri[4200], plain_uri[256], tport_s[16], pport_s[16];

    signal(SIGPIPE, SIG_IGN);
    snprintf(tls_uri, sizeof(tls_uri), "rediss://" HOST ":%d?cacert=%s&sni=" NAME,
             tport, ca);
    snprintf(plain_uri, sizeof(plain_uri), "redis://" HOST ":%d", pport);
    snprintf(tport_s, sizeof(tport_s), "%d", tport);
    snprintf(pport_s, sizeof(pport_s), "%d", pport);

    /* --- cycles --- */
    tls_floor tf;
    tls_connect(&tf, tport, ca);
    redisReply *r = tls_command(&tf, "TLS floor: SCRIPT LOAD",
                                "SCRIPT LOAD %s", SCRIPT);
    if (r->type != REDIS_REPLY_STRING)
        die("TLS floor: SCRIPT LOAD", "not a string");
    snprintf(tf.sha, sizeof(tf.sha), "%s", r->str);
    freeReplyObject(r);
    char proto[64];
    snprintf(proto, sizeof(proto), "%s, %s", SSL_get_version(tf.ssl),
             SSL_get_cipher_name(tf.ssl));

    struct timeval tv = {2, 0};
    plain_floor pf = {redisConnectWithTimeout(HOST, pport, tv), ""};
    if (!pf.c || pf.c->err)
        die("plain floor: connect", pf.c ? pf.c->errstr : "out of memory");
    snprintf(pf.sha, sizeof(pf.sha), "%s", tf.sha); /* the server's cache */

    dlock_client *ct = h_open_client(tls_uri, NULL);
    dlock_client *cp = h_open_client(plain_uri, NULL);
    dlock *lt = h_open_lock(ct, "bench-tls-cycle", 0, 0);
    dlock *lp = h_open_lock(cp, "bench-tls-plain-cycle", 0, 0);

    enum { K_TFLOOR, K_TDLOCK, K_PFLOOR, K_PDLOCK, NK };
    kind_op kinds[NK] = {
        [K_TFLOOR] = {tls_floor_once, &tf},
        [K_TDLOCK] = {h_dlock_once, lt},
        [K_PFLOOR] = {plain_floor_once, &pf},
        [K_PDLOCK] = {h_dlock_once, lp},
    };
    for (int k = 0; k < NK; k++) /* warm-up: connections, scripts */
        time_ops(kinds[k].op, kinds[k].arg, NULL, n / 20, 0);
    double *p50 = calloc(NK * CHUNKS, sizeof(*p50));
    if (!p50)
        die("cycles", "out of memory");
    chunked_ops(kinds, NK, n, CHUNKS, p50, NULL);

    double *tfl = p50 + K_TFLOOR * CHUNKS, *tdl = p50 + K_TDLOCK * CHUNKS,
           *pfl = p50 + K_PFLOOR * CHUNKS, *pdl = p50 + K_PDLOCK * CHUNKS;
    double dt[CHUNKS], df[CHUNKS]; /* TLS - plain, per chunk */
    for (int c = 0; c < CHUNKS; c++) {
        dt[c] = tdl[c] - pdl[c];
        df[c] = tfl[c] - pfl[c];
    }

    printf("### Redis over TLS (`rediss://`)\n\n");
    printf("One redis-server with a TLS port beside its plain port "
           "(`--tls-port`, `--tls-auth-clients no`); a CA and a server "
           "certificate for `DNS:localhost` (EC P-256) made by the openssl "
           "CLI for the run; every client connects to " HOST " and checks "
           "the certificate's chain and the name `localhost` (sent as SNI: "
           "dlock's `?cacert=...&sni=localhost`). Negotiated: %s. "
           "**Cycles**: an uncontended acquire + release, %d of each kind "
           "in %d chunks in which the four kinds take turns, each on one "
           "connection or client throughout; a figure is the median of the "
           "chunks' p50s, a ratio the median of the chunks' ratios (their "
           "range in brackets). The TLS floor is the bench's own client: "
           "OpenSSL's `SSL_connect` over a TCP connection, then the Redis "
           "floor's commands (`SET NX PX`, then `EVALSHA` of the "
           "compare-and-delete script), each formatted by hiredis' "
           "`redisFormatCommand`, sent with one `SSL_write`, its reply "
           "parsed by hiredis' `redisReader` from `SSL_read`; the plain "
           "floor is the same commands through hiredis on the plain "
           "port.\n\n",
           proto, n, CHUNKS);
    printf("| uncontended acquire+release, p50 (µs) | floor (the same "
           "commands, bare client) | dlock | dlock ÷ floor |\n"
           "|---|---|---|---|\n");
    printf("| over TLS (`rediss://`) | %.1f | %.1f | ",
           medrange(tfl, CHUNKS).med, medrange(tdl, CHUNKS).med);
    print_ratio(tdl, tfl, 1, "target ≤ 1.1x");
    printf(" |\n| plain (`redis://`, the same server's plain port) | %.1f | "
           "%.1f | ",
           medrange(pfl, CHUNKS).med, medrange(pdl, CHUNKS).med);
    print_ratio(pdl, pfl, 0, NULL);
    printf(" |\n| TLS ÷ plain | ");
    print_ratio(tfl, pfl, 0, NULL);
    printf(" | ");
    print_ratio(tdl, pdl, 0, NULL);
    printf(" | |\n");
    spread sdf = medrange(df, CHUNKS), sdt = medrange(dt, CHUNKS);
    printf("| what TLS adds per cycle (TLS − plain, µs) | %.1f (%.1f–%.1f) "
           "| %.1f (%.1f–%.1f) | %.2fx |\n\n",
           sdf.med, sdf.min, sdf.max, sdt.med, sdt.min, sdt.max,
           sdf.med > 0 ? sdt.med / sdf.med : 0);
    free(p50);
    dlock_close(lt);
    dlock_close(lp);
    dlock_client_close(ct);
    dlock_client_close(cp);
    redisFree(pf.c);
    tls_close(&tf);

    /* --- whole commands --- */
    env = env_without_store();
    if (posix_spawn_file_actions_init(&to_null) != 0 ||
        posix_spawn_file_actions_addopen(&to_null, 1, "/dev/null", O_WRONLY,
                                         0) != 0 ||
        posix_spawn_file_actions_addopen(&to_null, 2, "/dev/null", O_WRONLY,
                                         0) != 0)
        die("posix_spawn_file_actions", "failed");
    char cafile[4200];
    snprintf(cafile, sizeof(cafile), "%s", ca);
    enum { C_CLI_TLS, C_DLOCK_TLS, C_CLI, C_DLOCK, C_TRUE, NC };
    cmd_kind ks[NC] = {
        [C_CLI_TLS] = {"`redis-cli --tls --cacert CA --sni localhost -p "
                       "TLS_PORT PING`",
                       {"redis-cli", "--tls", "--cacert", cafile, "--sni",
                        NAME, "-h", HOST, "-p", tport_s, "PING", NULL},
                       1, NULL, 0, {0}},
        [C_DLOCK_TLS] = {"`dlock run --store 'rediss://...?cacert=CA&"
                         "sni=localhost' NAME -- true`",
                         {dlock_bin, "run", "--store", tls_uri, "benchtls",
                          "--", "true", NULL},
                         0, NULL, 0, {0}},
        [C_CLI] = {"`redis-cli -p PORT PING` (plain)",
                   {"redis-cli", "-h", HOST, "-p", pport_s, "PING", NULL},
                   1, NULL, 0, {0}},
        [C_DLOCK] = {"`dlock run --store redis://... NAME -- true` (plain)",
                     {dlock_bin, "run", "--store", plain_uri, "benchtls",
                      "--", "true", NULL},
                     0, NULL, 0, {0}},
        [C_TRUE] = {"`true` alone (process start floor)",
                    {"true", NULL},
                    1, NULL, 0, {0}},
    };
    int total = CHUNKS * per_chunk;
    int64_t *tmp = malloc(sizeof(int64_t) * (size_t)per_chunk);
    if (!tmp)
        die("malloc", "out of memory");
    for (int i = 0; i < NC; i++) {
        ks[i].ns = malloc(sizeof(int64_t) * (size_t)total);
        if (!ks[i].ns)
            die("malloc", "out of memory");
        for (int w = 0; w < 3; w++) /* warm-up: page cache */
            run_once(&ks[i]);
    }
    for (int c = 0; c < CHUNKS; c++)
        for (int i = 0; i < NC; i++) {
            cmd_kind *k = &ks[(i + c) % NC]; /* a different first each time */
            int64_t *start = k->ns + k->n;
            for (int j = 0; j < per_chunk; j++)
                k->ns[k->n++] = run_once(k);
            memcpy(tmp, start, sizeof(int64_t) * (size_t)per_chunk);
            qsort(tmp, (size_t)per_chunk, sizeof(int64_t), cmp64);
            k->chunk_p50[c] = per_chunk % 2
                                  ? (double)tmp[per_chunk / 2]
                                  : (double)(tmp[per_chunk / 2 - 1] +
                                             tmp[per_chunk / 2]) / 2;
        }
    free(tmp);

    printf("**Commands**: whole processes, each a new connection and a "
           "full TLS handshake; wall time from `posix_spawn()` to "
           "`waitpid()` returning, timed by the bench (C, CLOCK_MONOTONIC), "
           "output to /dev/null. %d runs of each in %d chunks in which "
           "every command takes its turn; the ratio is the median of the "
           "chunks' ratios of their p50s (their range in brackets) to "
           "`redis-cli PING` over the same transport: connect, handshake, "
           "one round trip, exit.\n\n",
           total, CHUNKS);
    printf("| command | p50 (ms) | p90 (ms) | ÷ `redis-cli PING`, same "
           "transport |\n|---|---|---|---|\n");
    for (int i = 0; i < NC; i++) {
        cmd_kind *k = &ks[i];
        qsort(k->ns, (size_t)total, sizeof(int64_t), cmp64);
        printf("| %s | %.2f | %.2f | ", k->label, pct_ms(k->ns, total, 0.5),
               pct_ms(k->ns, total, 0.9));
        if (i == C_CLI_TLS || i == C_CLI)
            printf("1 |\n");
        else if (i == C_TRUE)
            printf(" |\n");
        else {
            print_ratio(k->chunk_p50,
                        ks[i == C_DLOCK_TLS ? C_CLI_TLS : C_CLI].chunk_p50,
                        i == C_DLOCK_TLS, NULL);
            printf(" |\n");
        }
    }
    double tls_cli[CHUNKS], tls_dl[CHUNKS];
    for (int c = 0; c < CHUNKS; c++) {
        tls_cli[c] = (ks[C_CLI_TLS].chunk_p50[c] - ks[C_CLI].chunk_p50[c]) / 1e6;
        tls_dl[c] = (ks[C_DLOCK_TLS].chunk_p50[c] - ks[C_DLOCK].chunk_p50[c]) / 1e6;
    }
    printf("\nWhat TLS adds to one whole command (TLS − plain, the median "
           "of the chunks' differences of p50s): %.2f ms to `redis-cli "
           "PING`, %.2f ms to `dlock run`.\n\n",
           medrange(tls_cli, CHUNKS).med, medrange(tls_dl, CHUNKS).med);
    for (int i = 0; i < NC; i++)
        free(ks[i].ns);
    return 0;
}
