/* SPDX-License-Identifier: MIT */
/*
 * forger.c -- the forged-grant scenario's attacker: a process of the
 * controller's (not a worker, no dlock client) that keeps forging
 * hand-overs to every waiter it can find while the workers fight.
 *
 * A round reads who waits, then sends each waiter three forged grants:
 * the waiter's number with a token no store issues (SF_FORGED_TOKEN,
 * which would poison a resource fencing on "the highest token seen"),
 * the same number with the lock's current token + 1 (a plausible grant,
 * the token the real next holder gets), and the waiter's next number
 * (guessed: waiter numbers are small counters) with the huge token.
 *   - Redis (one server, Sentinel's primary, rediss' plain port): as an
 *     ACL user that may only read and publish, GET the lock key (its
 *     queue lines name each waiter's client id and number) and PUBLISH
 *     "g SEQ TOKEN" on dlock:c:CLIENTID.
 *   - Redis Cluster: the same with SPUBLISH on the shard channel
 *     dlock:{NAME}c:CLIENTID, at the slot's primary.
 *   - PostgreSQL table mode: as a role with LOGIN only, NOTIFY
 *     dlock_CLIENTID, 'g WAITER TOKEN'. It may not read the waiters'
 *     table: it learns the channels and numbers through the controller's
 *     superuser connection, standing for an attacker who may read that
 *     table or guesses the numbers.
 *   - SQLite (local): as another local user, connect to every wake-up
 *     channel of the suite's database listed in /proc/net/unix and send
 *     a byte, and send a datagram to every doorbell. They are socket
 *     files in a 0700 directory, so the kernel refuses (counted); had it
 *     not, the bytes carry no token: they only wake.
 * The rate is bounded (at most f->rate messages a second, a round at
 * most every millisecond) and so is the time (until the controller says
 * stop, or f->until_ns). What it did goes to the shared mapping.
 *
 * docs/safety.md, "forged-grant"; docs/design.md, "A message is a
 * wake-up".
 */
#include "safety.h"

#include <errno.h>
#include <grp.h>
#include <hiredis.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#ifdef TH_PG
#include <libpq-fe.h>
#endif

#define FORGE_WAITERS_MAX 64 /* waiters a round looks at */

typedef struct waiter {
    char client[40]; /* 32 hex digits */
    unsigned long long seq;
} waiter;

/* The first error or remark, once. */
static void remark(sf_shared *s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void remark(sf_shared *s, const char *fmt, ...)
{
    va_list ap;
    size_t n = strlen(s->forge_note);

    if (n + 3 >= sizeof(s->forge_note))
        return;
    if (n)
        n += (size_t)snprintf(s->forge_note + n, sizeof(s->forge_note) - n,
                              "; ");
    va_start(ap, fmt);
    vsnprintf(s->forge_note + n, sizeof(s->forge_note) - n, fmt, ap);
    va_end(ap);
}

static int stopping(const sf_shared *s, const sf_forger *f)
{
    return __atomic_load_n(&s->forge_stop, __ATOMIC_SEQ_CST) ||
           sf_now_ns() >= f->until_ns;
}

/* Keeps the flood within its rate: sleeps until `sent` messages since
 * t0 are no more than f->rate a second, and at least 1 ms after the
 * round began. */
static void pace(const sf_forger *f, int64_t t0, int64_t round0,
                 int64_t sent)
{
    int64_t due = t0 + sent * (1000000000 / f->rate);
    int64_t next = round0 + 1000000;

    if (due > next)
        next = due;
    int64_t now = sf_now_ns();
    if (next > now)
        sf_sleep_us((next - now) / 1000);
}

/* The three forgeries of a waiter, as "g SEQ TOKEN" payloads. */
static int payloads(const waiter *w, unsigned long long cur, char out[3][64])
{
    snprintf(out[0], 64, "g %llu %llu", w->seq,
             (unsigned long long)SF_FORGED_TOKEN);
    snprintf(out[1], 64, "g %llu %llu", w->seq, cur + 1);
    snprintf(out[2], 64, "g %llu %llu", w->seq + 1,
             (unsigned long long)SF_FORGED_TOKEN);
    return 3;
}

/* ------------------------------------------------------------------------ */
/* Redis                                                                    */
/* ------------------------------------------------------------------------ */

/* The waiters in the lock key's value, and the last token it shows. The
 * value: a head line (a writer's record "OWNER TOKEN ACQUIRED DESC",
 * "S TOKEN" for readers, "N PERMITS TOKEN", or a tombstone "- TOKEN"),
 * then holder lines "+ OWNER TOKEN UNTIL DESC" and waiter lines
 * "CLIENTID:TID:SEQ [r|pN ]TTL DESC" (docs/design.md, "Hand-over
 * (Redis)", "Shared holds and permits"). */
static int parse_key(const char *v, waiter *w, int max,
                     unsigned long long *cur)
{
    unsigned long long t = 0, n = 0;
    const char *line = v;
    int k = 0;

    *cur = 0;
    if (sscanf(v, "S %llu", &t) == 1 || sscanf(v, "- %llu", &t) == 1 ||
        sscanf(v, "N %llu %llu", &n, &t) == 2 ||
        sscanf(v, "%*[0-9a-f]:%*u %llu ", &t) == 1)
        *cur = t;
    while ((line = strchr(line, '\n')) != NULL) {
        line++;
        if (line[0] == '+') {
            if (sscanf(line, "+ %*s %llu ", &t) == 1 && t > *cur)
                *cur = t;
        } else if (k < max && sscanf(line, "%39[0-9a-f]:%*u:%llu ",
                                     w[k].client, &w[k].seq) == 2) {
            k++;
        }
    }
    return k;
}

static int forge_redis(sf_shared *s, const sf_forger *f)
{
    struct timeval tv = {5, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", f->port, tv);
    redisReply *r;
    int64_t t0, sent = 0;
    const char *pub = f->kind == SF_FORGE_CLUSTER ? "SPUBLISH" : "PUBLISH";

    if (!c || c->err) {
        remark(s, "cannot connect to 127.0.0.1:%d: %s", f->port,
               c ? c->errstr : "no memory");
        redisFree(c);
        return 1;
    }
    r = redisCommand(c, "AUTH %s %s", f->user, f->password);
    if (!r || r->type != REDIS_REPLY_STATUS) {
        remark(s, "AUTH as %s refused: %s", f->user,
               r && r->type == REDIS_REPLY_ERROR ? r->str : "no answer");
        freeReplyObject(r);
        redisFree(c);
        return 1;
    }
    freeReplyObject(r);
    /* its rights: it may not write (a key of its own, so that a
     * mistaken ACL would harm nothing) */
    r = redisCommand(c, "DEL dlsafe-forger-probe");
    int denied = r && r->type == REDIS_REPLY_ERROR && strstr(r->str, "NOPERM");
    freeReplyObject(r);
    if (!denied) {
        remark(s, "NOT READ-ONLY: the ACL user %s could write", f->user);
        redisFree(c);
        return 2;
    }
    remark(s, "the ACL user %s may read and %s, not write (DEL: NOPERM)",
           f->user, f->kind == SF_FORGE_CLUSTER ? "spublish" : "publish");

    t0 = sf_now_ns();
    while (!stopping(s, f)) {
        int64_t round0 = sf_now_ns();
        waiter w[FORGE_WAITERS_MAX];
        unsigned long long cur = 0;
        int n = 0, queued = 0;

        r = redisCommand(c, "GET %s", f->key);
        if (!r || c->err) {
            remark(s, "GET: %s", c->errstr);
            freeReplyObject(r);
            s->forge_errors++;
            break;
        }
        if (r->type == REDIS_REPLY_STRING)
            n = parse_key(r->str, w, FORGE_WAITERS_MAX, &cur);
        freeReplyObject(r);
        s->forge_rounds++;
        s->forge_targets += n;
        for (int i = 0; i < n; i++) {
            char p[3][64], chan[256];
            snprintf(chan, sizeof(chan), "%.127s%.39s", f->chan_prefix,
                     w[i].client);
            for (int j = 0, k = payloads(&w[i], cur, p); j < k; j++) {
                redisAppendCommand(c, "%s %s %s", pub, chan, p[j]);
                queued++;
            }
        }
        for (int i = 0; i < queued; i++) {
            if (redisGetReply(c, (void **)&r) != REDIS_OK) {
                remark(s, "%s: %s", pub, c->errstr);
                s->forge_errors++;
                break;
            }
            sent++;
            if (r->type == REDIS_REPLY_INTEGER && r->integer > 0)
                s->forge_heard++;
            else if (r->type == REDIS_REPLY_ERROR) {
                if (!s->forge_errors)
                    remark(s, "%s: %s", pub, r->str);
                s->forge_errors++;
            }
            freeReplyObject(r);
        }
        s->forge_sent = sent;
        if (c->err)
            break;
        pace(f, t0, round0, sent);
    }
    redisFree(c);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* PostgreSQL                                                               */
/* ------------------------------------------------------------------------ */

#ifdef TH_PG
static int forge_pg(sf_shared *s, const sf_forger *f)
{
    PGconn *rd = PQconnectdb(f->reader), *fg = PQconnectdb(f->conninfo);
    PGresult *r;
    int64_t t0, sent = 0;
    static char batch[FORGE_WAITERS_MAX * 3 * 160 + 64];

    if (PQstatus(rd) != CONNECTION_OK || PQstatus(fg) != CONNECTION_OK) {
        remark(s, "cannot connect: %s",
               PQstatus(rd) != CONNECTION_OK ? PQerrorMessage(rd)
                                             : PQerrorMessage(fg));
        PQfinish(rd);
        PQfinish(fg);
        return 1;
    }
    /* its rights: LOGIN only, so no superuser, and it may not read the
     * waiters' table */
    r = PQexec(fg, "SELECT rolsuper FROM pg_roles WHERE rolname = "
                   "current_user");
    int super = PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1 ||
                strcmp(PQgetvalue(r, 0, 0), "f") != 0;
    PQclear(r);
    r = PQexec(fg, "SELECT 1 FROM dlock_locks_waiters LIMIT 1");
    int reads = PQresultStatus(r) == PGRES_TUPLES_OK;
    PQclear(r);
    if (super || reads) {
        remark(s, "NOT LOGIN-ONLY: the role %s%s%s", PQuser(fg),
               super ? " is a superuser" : "",
               reads ? " may read dlock_locks_waiters" : "");
        PQfinish(rd);
        PQfinish(fg);
        return 2;
    }
    remark(s, "the role %s: no superuser, may not read "
              "dlock_locks_waiters", PQuser(fg));

    t0 = sf_now_ns();
    while (!stopping(s, f)) {
        int64_t round0 = sf_now_ns();
        /* what the controller's superuser connection tells it */
        r = PQexec(rd, "SELECT w.client, w.waiter, coalesce((SELECT token "
                       "FROM dlock_locks l WHERE l.name = w.name), 0) FROM "
                       "dlock_locks_waiters w WHERE w.name = "
                       "convert_to('" SF_LOCK_NAME "', 'UTF8') ORDER BY "
                       "w.seq");
        if (PQresultStatus(r) != PGRES_TUPLES_OK) {
            remark(s, "reading the waiters: %s", PQresultErrorMessage(r));
            PQclear(r);
            s->forge_errors++;
            break;
        }
        int n = PQntuples(r), m = 0;
        size_t o = (size_t)snprintf(batch, sizeof(batch), "BEGIN;");
        if (n > FORGE_WAITERS_MAX)
            n = FORGE_WAITERS_MAX;
        for (int i = 0; i < n; i++) {
            waiter w;
            char p[3][64];
            unsigned long long cur = strtoull(PQgetvalue(r, i, 2), NULL, 10);
            snprintf(w.client, sizeof(w.client), "%s", PQgetvalue(r, i, 0));
            w.seq = strtoull(PQgetvalue(r, i, 1), NULL, 10);
            if (strspn(w.client, "0123456789abcdef") != strlen(w.client))
                continue; /* not a channel name dlock makes */
            for (int j = 0, k = payloads(&w, cur, p); j < k; j++, m++)
                o += (size_t)snprintf(batch + o, sizeof(batch) - o,
                                      " NOTIFY dlock_%s, '%s';", w.client,
                                      p[j]);
        }
        PQclear(r);
        s->forge_rounds++;
        s->forge_targets += n;
        if (m) {
            /* the notifications go out at the commit */
            snprintf(batch + o, sizeof(batch) - o, " COMMIT");
            r = PQexec(fg, batch);
            if (PQresultStatus(r) != PGRES_COMMAND_OK) {
                if (!s->forge_errors)
                    remark(s, "NOTIFY: %s", PQresultErrorMessage(r));
                s->forge_errors++;
            } else {
                sent += m;
            }
            PQclear(r);
        }
        s->forge_sent = sent;
        if (PQstatus(rd) != CONNECTION_OK || PQstatus(fg) != CONNECTION_OK)
            break;
        pace(f, t0, round0, sent);
    }
    PQfinish(rd);
    PQfinish(fg);
    return 0;
}
#endif

/* ------------------------------------------------------------------------ */
/* Local wake-up channels (SQLite)                                          */
/* ------------------------------------------------------------------------ */

/* Sends one byte to the Unix socket at `path`: a connection to a
 * listening stream, or a datagram. 1 if the byte went; -1 when the
 * kernel refused for permissions (EACCES, EPERM: the channels'
 * directory kept us out); 0 otherwise. Never blocks: a full backlog
 * refuses at once. */
static int poke(const char *path, int dgram)
{
    struct sockaddr_un sa;
    size_t n = strlen(path);
    int fd, ok = 0, err = 0;

    if (n + 1 > sizeof(sa.sun_path))
        return 0;
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, path, n);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + 1);
    fd = socket(AF_UNIX, (dgram ? SOCK_DGRAM : SOCK_STREAM) | SOCK_NONBLOCK |
                             SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    if (dgram) {
        ok = sendto(fd, "g", 1, MSG_NOSIGNAL, (struct sockaddr *)&sa, len) ==
             1;
    } else {
        ok = connect(fd, (struct sockaddr *)&sa, len) == 0;
        if (!ok)
            err = errno;
        ok = ok && send(fd, "g", 1, MSG_NOSIGNAL) == 1;
    }
    if (!ok && dgram)
        err = errno;
    close(fd);
    return ok ? 1 : (err == EACCES || err == EPERM) ? -1 : 0;
}

/* Another local user forging wake-ups to a SQLite store's waiters: the
 * channels are socket files "<ino>.<rowid>.<t>[.r]" in `<db>-dlock.d`
 * (0700), listed (by the path they were bound at) in /proc/net/unix,
 * which every user reads. The forger takes each listed name that starts
 * with the sidecar's inode and sends a byte to it in the channels'
 * directory: the directory's permissions refuse it (counted as refused),
 * and had they not, the byte only wakes (the acquire statement
 * decides). */
static int forge_local(sf_shared *s, const sf_forger *f)
{
    int64_t t0, sent = 0;
    char mine[40];

    if (getuid() == 0) {
        if (setgroups(0, NULL) != 0 || setgid(65534) != 0 ||
            setuid(65534) != 0) {
            remark(s, "cannot become nobody: %s", strerror(errno));
            return 1;
        }
        remark(s, "as uid 65534 (nobody), not the workers' uid 0");
    } else {
        remark(s, "as the workers' own uid %d (not root: no other user)",
               (int)getuid());
    }
    /* this database's channels only: other programs' (other tests on
     * the machine) are none of ours */
    snprintf(mine, sizeof(mine), "%llx.", (unsigned long long)f->ino);

    t0 = sf_now_ns();
    while (!stopping(s, f)) {
        int64_t round0 = sf_now_ns();
        FILE *u = fopen("/proc/net/unix", "r");
        char line[512];
        int n = 0;

        if (!u) {
            remark(s, "/proc/net/unix: %s", strerror(errno));
            s->forge_errors++;
            break;
        }
        /* "Num RefCount Protocol Flags Type St Inode Path": a listening
         * stream has Flags 00010000 (accepting) and Type 0001; a
         * doorbell is Type 0002 */
        while (fgets(line, sizeof(line), u) && n < FORGE_WAITERS_MAX * 2) {
            unsigned flags = 0, type = 0;
            char path[200], target[1000];
            if (sscanf(line, "%*s %*s %*s %x %x %*s %*s %199s", &flags, &type,
                       path) != 3)
                continue;
            const char *leaf = strrchr(path, '/');
            leaf = leaf ? leaf + 1 : path;
            if (strncmp(leaf, mine, strlen(mine)) != 0)
                continue;
            size_t ll = strlen(leaf);
            int is_bell = type == 2 && ll > 2 && !strcmp(leaf + ll - 2, ".r");
            int is_chan = type == 1 && (flags & 0x10000) && !is_bell;
            if (!is_chan && !is_bell)
                continue;
            if ((size_t)snprintf(target, sizeof(target), "%s/%s", f->chandir,
                                 leaf) >= sizeof(target))
                continue;
            n++;
            sent++;
            int r = poke(target, is_bell);
            if (r > 0)
                s->forge_heard++;
            else if (r < 0)
                s->forge_refused++;
        }
        fclose(u);
        s->forge_rounds++;
        s->forge_targets += n;
        s->forge_sent = sent;
        pace(f, t0, round0, sent);
    }
    return 0;
}

int sf_forger_main(sf_shared *s, const sf_forger *f)
{
    switch (f->kind) {
    case SF_FORGE_REDIS:
    case SF_FORGE_CLUSTER:
        return forge_redis(s, f);
    case SF_FORGE_PG:
#ifdef TH_PG
        return forge_pg(s, f);
#else
        remark(s, "this build has no libpq");
        return 1;
#endif
    case SF_FORGE_LOCAL:
        return forge_local(s, f);
    }
    return 1;
}
