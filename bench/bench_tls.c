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
#include <sds.h> /* hiredis' sdssplitargs */

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
#include <strings.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

const char bench_prog[] = "bench_tls";

#define CHUNKS 15
#define HOST "127.0.0.1"
#define NAME "localhost" /* the certificate's name, checked; the SNI */
#define OWNER "owner-0123456789abcdef"
#define SCRIPT                                                              \
    "if redis.call('GET', KEYS[1]) == ARGV[1] then "                       \
    "return redis.call('DEL', KEYS[1]) end return 0"

/* ------------------------------------------------------------------------ */
/* dlock's commands, captured with MONITOR                                  */
/* ------------------------------------------------------------------------ */

#define CAP_MAX 8           /* commands kept on either side */
#define CAP_LINES 100000    /* MONITOR lines read at most */
#define CAP_TIMEOUT_S 2     /* the longest wait for one MONITOR line */

typedef struct rcmd_cap {
    int argc;
    sds *argv;    /* sdssplitargs' */
    size_t *lens; /* argv[i]'s lengths */
} rcmd_cap;

/* One cycle's commands: acq[0..nacq) then rel[0..nrel). */
typedef struct capture {
    const char *label;
    rcmd_cap acq[CAP_MAX], rel[CAP_MAX];
    int nacq, nrel;
} capture;

static void print_args(FILE *f, int argc, sds *argv, int max)
{
    for (int i = 0; i < argc && i < max; i++) {
        sds r = sdscatrepr(sdsempty(), argv[i], sdslen(argv[i]));
        fprintf(f, " %s", r ? r : "?");
        sdsfree(r);
    }
    if (argc > max)
        fprintf(f, " ...");
}

/* A lock's command: EVALSHA (or EVAL) with a key that holds `name`. */
static int lock_command(int argc, sds *argv, const char *name)
{
    if (argc < 3 || (strcasecmp(argv[0], "EVALSHA") &&
                     strcasecmp(argv[0], "EVAL")))
        return 0;
    long nk = strtol(argv[2], NULL, 10);
    for (long i = 3; i < 3 + nk && i < argc; i++)
        if (strstr(argv[i], name))
            return 1;
    return 0;
}

static void echo(redisContext *c, const char *mark)
{
    redisReply *r = redisCommand(c, "ECHO %s", mark);
    if (!r || r->type == REDIS_REPLY_ERROR)
        die("capture: ECHO", r ? r->str : c->errstr);
    freeReplyObject(r);
}

/*
 * dlock's commands for one uncontended cycle of lock l (named name),
 * seen by MONITOR on the plain port pport: the EVALSHA calls on its key
 * between ECHO markers sent on `mark` (a plain connection) before the
 * acquire, between it and the release, and after the release.
 */
static void capture_cycle(capture *cap, const char *label, int pport,
                          redisContext *mark, dlock *l, const char *name)
{
    struct timeval tv = {CAP_TIMEOUT_S, 0};
    char marks[3][64];
    redisContext *mon = redisConnectWithTimeout(HOST, pport, tv);
    redisReply *r;

    memset(cap, 0, sizeof(*cap));
    cap->label = label;
    h_dlock_once(l); /* warm: its connection opened, its scripts loaded */
    if (!mon || mon->err)
        die("capture: connect", mon ? mon->errstr : "out of memory");
    if (redisSetTimeout(mon, tv) != REDIS_OK)
        die("capture", "cannot set the MONITOR connection's read timeout");
    r = redisCommand(mon, "MONITOR");
    if (!r || r->type == REDIS_REPLY_ERROR)
        die("capture: MONITOR", r ? r->str : mon->errstr);
    freeReplyObject(r);
    for (int i = 0; i < 3; i++)
        snprintf(marks[i], sizeof(marks[i]), "dlock-bench-capture-%ld-%d",
                 (long)getpid(), i);

    echo(mark, marks[0]);
    if (dlock_acquire(l, 0) != DLOCK_OK)
        die("capture: acquire", dlock_errmsg());
    echo(mark, marks[1]);
    if (dlock_release(l) != DLOCK_OK)
        die("capture: release", dlock_errmsg());
    echo(mark, marks[2]);

    int side = -1; /* -1 before the first mark, 0 acquire, 1 release */
    fprintf(stderr, "bench_tls: %s: MONITOR saw:\n", label);
    for (int lines = 0; side < 2; lines++) {
        void *v = NULL;
        if (lines >= CAP_LINES)
            die("capture", "too many MONITOR lines before the last mark");
        if (redisGetReply(mon, &v) != REDIS_OK || !v) {
            char msg[300];
            snprintf(msg, sizeof(msg),
                     "MONITOR: no line within %d s (%d read; %s)",
                     CAP_TIMEOUT_S, lines, mon->errstr);
            die("capture", msg);
        }
        r = v;
        if (r->type != REDIS_REPLY_STATUS && r->type != REDIS_REPLY_STRING) {
            freeReplyObject(r);
            die("capture", "MONITOR: not a line of text");
        }
        /* "TIME [DB ADDR] ARGS": the arguments after "] " */
        const char *b = strchr(r->str, '[');
        const char *e = b ? strstr(b, "] ") : NULL;
        if (!e) {
            fprintf(stderr, "bench_tls: capture: not a MONITOR line: %s\n",
                    r->str);
            die("capture", "MONITOR: a line of an unknown format");
        }
        /* "[0 lua]": a call made by a script, not by a client */
        int lua = e - b >= 4 && !strncmp(e - 4, " lua", 4);
        int argc = 0;
        sds *argv = sdssplitargs(e + 2, &argc);
        if (!argv) {
            fprintf(stderr, "bench_tls: capture: unbalanced quotes: %s\n",
                    r->str);
            die("capture", "MONITOR: a line sdssplitargs cannot split");
        }
        freeReplyObject(r);
        if (argc == 2 && !strcasecmp(argv[0], "ECHO") &&
            !strcmp(argv[1], marks[side + 1])) {
            side++;
            sdsfreesplitres(argv, argc);
            continue;
        }
        if (side < 0 || lua) {
            sdsfreesplitres(argv, argc);
            continue;
        }
        int keep = lock_command(argc, argv, name);
        fprintf(stderr, "  %s, %s: %s, %d arguments:",
                keep ? "kept" : "ignored", side ? "release" : "acquire",
                argc ? argv[0] : "(none)", argc ? argc - 1 : 0);
        print_args(stderr, argc, argv, 12);
        fprintf(stderr, "\n");
        if (!keep) {
            sdsfreesplitres(argv, argc);
            continue;
        }
        int *n = side ? &cap->nrel : &cap->nacq;
        rcmd_cap *c = side ? &cap->rel[*n] : &cap->acq[*n];
        if (*n >= CAP_MAX)
            die("capture", "too many commands in one acquire or release");
        c->argc = argc;
        c->argv = argv;
        c->lens = malloc(sizeof(size_t) * (size_t)argc);
        if (!c->lens)
            die("capture", "out of memory");
        for (int i = 0; i < argc; i++)
            c->lens[i] = sdslen(argv[i]);
        (*n)++;
    }
    redisFree(mon); /* MONITOR would cost the server every command */
    if (cap->nacq < 1 || cap->nrel < 1) {
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "%s: %d acquire and %d release commands captured (at "
                 "least one of each needed)",
                 label, cap->nacq, cap->nrel);
        die("capture", msg);
    }
    fprintf(stderr, "bench_tls: %s: the floor replays %d acquire + %d "
                    "release command(s):",
            label, cap->nacq, cap->nrel);
    for (int i = 0; i < cap->nacq + cap->nrel; i++) {
        const rcmd_cap *c = i < cap->nacq ? &cap->acq[i]
                                          : &cap->rel[i - cap->nacq];
        fprintf(stderr, "%s %s (%d arguments)", i ? "," : "", c->argv[0],
                c->argc - 1);
    }
    fprintf(stderr, "\n");
}

static void capture_free(capture *cap)
{
    for (int i = 0; i < cap->nacq; i++) {
        sdsfreesplitres(cap->acq[i].argv, cap->acq[i].argc);
        free(cap->acq[i].lens);
    }
    for (int i = 0; i < cap->nrel; i++) {
        sdsfreesplitres(cap->rel[i].argv, cap->rel[i].argc);
        free(cap->rel[i].lens);
    }
}

static void describe_reply(char *buf, size_t cap, const redisReply *r)
{
    if (!r)
        snprintf(buf, cap, "no reply");
    else if (r->type == REDIS_REPLY_INTEGER)
        snprintf(buf, cap, "(integer) %lld", r->integer);
    else if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ||
             r->type == REDIS_REPLY_ERROR)
        snprintf(buf, cap, "(%s) %.200s",
                 r->type == REDIS_REPLY_STRING   ? "string"
                 : r->type == REDIS_REPLY_STATUS ? "status"
                                                 : "error",
                 r->str);
    else if (r->type == REDIS_REPLY_ARRAY)
        snprintf(buf, cap, "(array of %zu)", r->elements);
    else
        snprintf(buf, cap, "(nil)");
}

/* A replayed command's reply: any reply but an error; the acquire's last
 * a token (a string, or a status), the release's last the integer 1. Dies
 * otherwise, naming the reply. Frees it. */
static void replay_check(const capture *cap, redisReply *r, int release,
                         int last)
{
    int ok = r && r->type != REDIS_REPLY_ERROR;

    if (ok && last && !release)
        ok = r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS;
    if (ok && last && release)
        ok = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    if (!ok) {
        char d[300], msg[400];
        describe_reply(d, sizeof(d), r);
        snprintf(msg, sizeof(msg), "the replayed %s answered %s",
                 release ? "release" : "acquire", d);
        die(cap->label, msg);
    }
    freeReplyObject(r);
}

/* ------------------------------------------------------------------------ */
/* The TLS floor: the bench's own minimal client                            */
/* ------------------------------------------------------------------------ */

typedef struct tls_floor {
    int fd;
    SSL_CTX *ctx;
    SSL *ssl;
    redisReader *rd;
    const capture *cap; /* what the floor cycle replays */
    char sha[41];       /* bench.c's compare-and-delete script */
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

/* One formatted command: one SSL_write, its reply parsed by hiredis'
 * reader from SSL_read (an error reply returned as any other). */
static redisReply *tls_roundtrip(tls_floor *t, const char *what,
                                 const char *cmd, int len)
{
    void *reply = NULL;

    for (int off = 0; off < len;) {
        int w = SSL_write(t->ssl, cmd + off, len - off);
        if (w <= 0)
            ssl_die(what);
        off += w;
    }
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
    return reply;
}

/* One command formatted by hiredis' redisvFormatCommand (dies on an
 * error reply). */
static redisReply *tls_command(tls_floor *t, const char *what,
                               const char *fmt, ...)
{
    char *cmd;
    va_list ap;

    va_start(ap, fmt);
    int len = redisvFormatCommand(&cmd, fmt, ap);
    va_end(ap);
    if (len < 0)
        die(what, "cannot format");
    redisReply *rp = tls_roundtrip(t, what, cmd, len);
    redisFreeCommand(cmd);
    if (rp->type == REDIS_REPLY_ERROR)
        die(what, rp->str);
    return rp;
}

/* A captured command, formatted by redisFormatCommandArgv (as hiredis'
 * redisCommandArgv does), then sent and its reply checked. */
static void tls_replay(tls_floor *t, const rcmd_cap *c, int release,
                       int last)
{
    char *cmd;
    int len = redisFormatCommandArgv(&cmd, c->argc, (const char **)c->argv,
                                     c->lens);

    if (len < 0)
        die("TLS floor", "cannot format");
    redisReply *r = tls_roundtrip(t, "TLS floor", cmd, len);
    redisFreeCommand(cmd);
    replay_check(t->cap, r, release, last);
}

/* The floor: dlock's acquire and release, replayed. */
static void tls_floor_once(void *arg)
{
    tls_floor *t = arg;
    const capture *cap = t->cap;

    for (int i = 0; i < cap->nacq; i++)
        tls_replay(t, &cap->acq[i], 0, i == cap->nacq - 1);
    for (int i = 0; i < cap->nrel; i++)
        tls_replay(t, &cap->rel[i], 1, i == cap->nrel - 1);
}

/* Context: bench.c's floor cycle, on the same connection. */
static void tls_benchc_once(void *arg)
{
    tls_floor *t = arg;

    freeReplyObject(tls_command(t, "TLS bench.c floor: SET",
                                "SET floor-tls:{k} " OWNER " NX PX 30000"));
    freeReplyObject(tls_command(t, "TLS bench.c floor: EVALSHA",
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
/* The plain floor: hiredis                                                 */
/* ------------------------------------------------------------------------ */

typedef struct plain_floor {
    redisContext *c;
    const capture *cap;
} plain_floor;

static void plain_replay(plain_floor *f, const rcmd_cap *c, int release,
                         int last)
{
    redisReply *r = redisCommandArgv(f->c, c->argc, (const char **)c->argv,
                                     c->lens);
    if (!r)
        die("plain floor", f->c->errstr);
    replay_check(f->cap, r, release, last);
}

static void plain_floor_once(void *arg)
{
    plain_floor *f = arg;
    const capture *cap = f->cap;

    for (int i = 0; i < cap->nacq; i++)
        plain_replay(f, &cap->acq[i], 0, i == cap->nacq - 1);
    for (int i = 0; i < cap->nrel; i++)
        plain_replay(f, &cap->rel[i], 1, i == cap->nrel - 1);
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

static char **env; /* environ without DLOCK_STORE */

static int64_t run_once(const cmd_kind *k)
{
    return run_command(k->label, k->argv, env, k->pathsearch);
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
    plain_floor pf = {redisConnectWithTimeout(HOST, pport, tv), NULL};
    if (!pf.c || pf.c->err)
        die("plain floor: connect", pf.c ? pf.c->errstr : "out of memory");

    dlock_client *ct = h_open_client(tls_uri, NULL);
    dlock_client *cp = h_open_client(plain_uri, NULL);
    dlock *lt = h_open_lock(ct, "bench-tls-cycle", 0, 0);
    dlock *lp = h_open_lock(cp, "bench-tls-plain-cycle", 0, 0);

    /* each floor replays the commands of the dlock kind it is compared
     * with: its client's owner, its lock's key */
    capture cap_t, cap_p;
    capture_cycle(&cap_t, "dlock, TLS", pport, pf.c, lt, "bench-tls-cycle");
    capture_cycle(&cap_p, "dlock, plain", pport, pf.c, lp,
                  "bench-tls-plain-cycle");
    tf.cap = &cap_t;
    pf.cap = &cap_p;

    enum { K_TFLOOR, K_TDLOCK, K_PFLOOR, K_PDLOCK, K_TBENCHC, NK };
    kind_op kinds[NK] = {
        [K_TFLOOR] = {tls_floor_once, &tf},
        [K_TDLOCK] = {h_dlock_once, lt},
        [K_PFLOOR] = {plain_floor_once, &pf},
        [K_PDLOCK] = {h_dlock_once, lp},
        [K_TBENCHC] = {tls_benchc_once, &tf},
    };
    for (int k = 0; k < NK; k++) /* warm-up: connections, scripts */
        time_ops(kinds[k].op, kinds[k].arg, NULL, n / 20, 0);
    double *p50 = calloc(NK * CHUNKS, sizeof(*p50));
    if (!p50)
        die("cycles", "out of memory");
    chunked_ops(kinds, NK, n, CHUNKS, p50, NULL);

    double *tfl = p50 + K_TFLOOR * CHUNKS, *tdl = p50 + K_TDLOCK * CHUNKS,
           *pfl = p50 + K_PFLOOR * CHUNKS, *pdl = p50 + K_PDLOCK * CHUNKS,
           *tbc = p50 + K_TBENCHC * CHUNKS;
    double dt[CHUNKS], df[CHUNKS]; /* TLS - plain, per chunk */
    for (int c = 0; c < CHUNKS; c++) {
        dt[c] = tdl[c] - pdl[c];
        df[c] = tfl[c] - pfl[c];
    }

    /* what was replayed, for the text: "`EVALSHA` (9 arguments)" each */
    char replayed[2][256];
    for (int s = 0; s < 2; s++) {
        const rcmd_cap *cs = s ? cap_t.rel : cap_t.acq;
        int nc = s ? cap_t.nrel : cap_t.nacq;
        size_t o = 0;
        replayed[s][0] = '\0';
        for (int i = 0; i < nc && o < sizeof(replayed[s]); i++)
            o += (size_t)snprintf(replayed[s] + o, sizeof(replayed[s]) - o,
                                  "%s`%s` (%d arguments)", i ? ", " : "",
                                  cs[i].argv[0], cs[i].argc - 1);
    }

    printf("### Redis over TLS (`rediss://`)\n\n");
    printf("One redis-server with a TLS port beside its plain port "
           "(`--tls-port`, `--tls-auth-clients no`); a CA and a server "
           "certificate for `DNS:localhost` (EC P-256) made by the openssl "
           "CLI for the run; every client connects to " HOST " and checks "
           "the certificate's chain and the name `localhost` (sent as SNI: "
           "dlock's `?cacert=...&sni=localhost`). Negotiated: %s. "
           "**Cycles**: an uncontended acquire + release, %d of each kind "
           "in %d chunks in which the five kinds take turns, each on one "
           "connection or client throughout; a figure is the median of the "
           "chunks' p50s, a ratio the median of the chunks' ratios (their "
           "range in brackets). The floor: dlock's own acquire and release "
           "commands, captured with `MONITOR` (one cycle of the dlock "
           "client it is compared with, before the timing: its owner, its "
           "lock's key; acquire: %s; release: %s) and replayed by the "
           "bench over one TLS connection: OpenSSL's `SSL_connect` over a "
           "TCP connection (the chain and the name checked), each command "
           "formatted by hiredis' `redisFormatCommandArgv`, sent with one "
           "`SSL_write`, its reply parsed by hiredis' `redisReader` from "
           "`SSL_read` and checked (the acquire's a token, the release's "
           "1: a whole cycle, the release script needs no token). The "
           "plain floor replays the plain dlock client's commands through "
           "hiredis' `redisCommandArgv` on the plain port. The last row, "
           "for context: bench.c's floor cycle (`SET NX PX`, then "
           "`EVALSHA` of a compare-and-delete script) sent the same way "
           "on the TLS floor's connection.\n\n",
           proto, n, CHUNKS, replayed[0], replayed[1]);
    printf("| uncontended acquire+release, p50 (µs) | floor (dlock's "
           "commands, replayed by the bench) | dlock | dlock ÷ floor |\n"
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
           "| %.1f (%.1f–%.1f) | %.2fx |\n",
           sdf.med, sdf.min, sdf.max, sdt.med, sdt.min, sdt.max,
           sdf.med > 0 ? sdt.med / sdf.med : 0);
    printf("| context: bench.c's floor cycle over TLS (`SET NX PX` + "
           "`EVALSHA` compare-and-delete, the same client) | %.1f | %.1f | ",
           medrange(tbc, CHUNKS).med, medrange(tdl, CHUNKS).med);
    print_ratio(tdl, tbc, 0, NULL);
    printf(" |\n\n");
    free(p50);
    dlock_close(lt);
    dlock_close(lp);
    dlock_client_close(ct);
    dlock_client_close(cp);
    redisFree(pf.c);
    tls_close(&tf);
    capture_free(&cap_t);
    capture_free(&cap_p);

    /* --- whole commands --- */
    env = env_without_store();
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
