/* SPDX-License-Identifier: MIT */
/*
 * redis_common.c -- helpers shared by the Redis stores (redis_common.h).
 */
#include "redis_common.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Copies a server message, control characters replaced and any
 * occurrence of the password masked. */
static void scrub(const char *password, const char *in, char *out,
                  size_t cap)
{
    size_t pl = password ? strlen(password) : 0;
    size_t o = 0;

    for (size_t i = 0; in[i] && o + 4 < cap;) {
        if (pl >= 3 && strncmp(in + i, password, pl) == 0) {
            memcpy(out + o, "***", 3);
            o += 3;
            i += pl;
        } else {
            unsigned char ch = (unsigned char)in[i++];
            out[o++] = ch < ' ' ? ' ' : (char)ch;
        }
    }
    out[o] = '\0';
}

int dlock__redis_server_error(const char *where, const char *password,
                              const char *msg, const char *lock)
{
    char m[200];

    scrub(password, msg, m, sizeof(m));
    if (!strncmp(m, "NOAUTH", 6) || !strncmp(m, "WRONGPASS", 9) ||
        !strncmp(m, "NOPERM", 6) || strstr(m, "AUTH"))
        return dlock__err(DLOCK_EAUTH, "%s: authentication refused: %s",
                          where, m);
    if (strstr(m, "WRONGTYPE") || !strncmp(m, "DLOCKFOREIGN", 12))
        return dlock__err(DLOCK_EPROTO,
                          "%s: a key of lock '%.100s' holds a value of "
                          "another type (not written by dlock): %s",
                          where, lock ? lock : "?", m);
    if (!strncmp(m, "DLOCKKIND ", 10)) /* a lock used as a semaphore, ... */
        return dlock__err(DLOCK_EINVAL, "lock '%.100s' %s", lock ? lock : "?",
                          m + 10);
    if (!strncmp(m, "DLOCKFENCE", 10))
        return dlock__err(DLOCK_EPROTO, "%s: lock '%.100s': %s", where,
                          lock ? lock : "?", m + 11);
    if (!strncmp(m, "LOADING", 7) || !strncmp(m, "BUSY", 4) ||
        !strncmp(m, "MASTERDOWN", 10) || !strncmp(m, "TRYAGAIN", 8) ||
        !strncmp(m, "CLUSTERDOWN", 11))
        return dlock__err(DLOCK_ECONN, "%s: server not ready: %s", where, m);
    return dlock__err(DLOCK_EPROTO, "%s: %s", where, m);
}

int dlock__redis_io_failure(const char *where, const redisContext *ctx,
                            int64_t io_ms)
{
    if (ctx->err == REDIS_ERR_IO &&
        (strstr(ctx->errstr, "temporarily unavailable") ||
         strstr(ctx->errstr, "timed out")))
        return dlock__err(DLOCK_ECONN, "%s: no answer within %lld ms", where,
                          (long long)io_ms);
    if (ctx->err == REDIS_ERR_EOF)
        return dlock__err(DLOCK_ECONN, "%s: the server closed the connection",
                          where);
    if (ctx->err == REDIS_ERR_OOM)
        return dlock__err(DLOCK_ENOMEM, "%s: out of memory", where);
    if (ctx->err == REDIS_ERR_PROTOCOL)
        return dlock__err(DLOCK_EPROTO, "%s: protocol error: %s", where,
                          ctx->errstr);
    return dlock__err(DLOCK_ECONN, "%s: %s", where, ctx->errstr);
}

int dlock__redis_reply_uint(const redisReply *r, uint64_t *out)
{
    if (r->type == REDIS_REPLY_INTEGER && r->integer >= 0) {
        *out = (uint64_t)r->integer;
        return 0;
    }
    if (r->type == REDIS_REPLY_STRING && r->len > 0 && r->len < 21) {
        char *end;
        errno = 0;
        *out = strtoull(r->str, &end, 10);
        return errno || *end ? -1 : 0;
    }
    return -1;
}

int dlock__redis_config_parse(dlock__redis_config *cfg, const dlock__uri *u,
                              const char *what, const char *db)
{
    const char *prefix = dlock__uri_param(u, "prefix");
    const char *timeout = dlock__uri_param(u, "timeout");
    long long v;

    if (db) {
        if (dlock__parse_int(db, 1000000, &v) != 0)
            return dlock__err(DLOCK_EINVAL,
                              "%s: database must be a number, not '%.40s'",
                              what, db);
        cfg->db = (long)v;
    }
    if (timeout) {
        if (dlock__parse_int(timeout, 3600000, &v) != 0 || v == 0)
            return dlock__err(DLOCK_EINVAL,
                              "%s: timeout must be milliseconds "
                              "(1..3600000), not '%.40s'",
                              what, timeout);
        cfg->timeout_ms = v;
    }
    if (!prefix)
        prefix = "dlock:";
    if (strlen(prefix) > DLOCK__REDIS_PREFIX_MAX || strpbrk(prefix, "{}"))
        return dlock__err(DLOCK_EINVAL,
                          "%s: prefix must be at most %d bytes without "
                          "'{' or '}'",
                          what, DLOCK__REDIS_PREFIX_MAX);
    cfg->prefix_len = strlen(prefix);
    memcpy(cfg->prefix, prefix, cfg->prefix_len + 1);
    if (!cfg->tls) {
        int rc = dlock__rtls_open(u, what, &cfg->tls);
        if (rc)
            return rc;
    }
    if (u->user && !u->password)
        return dlock__err(DLOCK_EINVAL,
                          "%s: a user name needs a password "
                          "(user:password@host)",
                          what);
    if (u->user && !(cfg->user = strdup(u->user)))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    if (u->password && !(cfg->password = strdup(u->password)))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    return DLOCK_OK;
}

size_t dlock__redis_key(const dlock__redis_config *cfg, const char *name,
                        size_t len, const char *suffix, char *out)
{
    size_t o = cfg->prefix_len, sl = strlen(suffix);

    memcpy(out, cfg->prefix, cfg->prefix_len);
    out[o++] = '{';
    memcpy(out + o, name, len);
    o += len;
    out[o++] = '}';
    memcpy(out + o, suffix, sl);
    return o + sl;
}

/* Copies s[0..n) to out with a backslash before each glob character. */
static size_t glob_escape(const char *s, size_t n, char *out)
{
    size_t o = 0;

    for (size_t i = 0; i < n; i++) {
        if (strchr("*?[]\\", s[i]) && s[i] != '\0')
            out[o++] = '\\';
        out[o++] = s[i];
    }
    return o;
}

size_t dlock__redis_list_pattern(const dlock__redis_config *cfg,
                                 const char *prefix, size_t plen,
                                 const char *suffix, char *out)
{
    size_t o = glob_escape(cfg->prefix, cfg->prefix_len, out);
    size_t sl = strlen(suffix);

    out[o++] = '{';
    o += glob_escape(prefix, plen, out + o);
    out[o++] = '*';
    out[o++] = '}';
    o += glob_escape(suffix, sl, out + o);
    return o;
}

int dlock__redis_key_name(const dlock__redis_config *cfg, const char *key,
                          size_t klen, const char *suffix, const char **name,
                          size_t *len)
{
    size_t pl = cfg->prefix_len, sl = strlen(suffix);

    if (klen < pl + 2 + sl || memcmp(key, cfg->prefix, pl) != 0 ||
        key[pl] != '{' || key[klen - sl - 1] != '}' ||
        memcmp(key + klen - sl, suffix, sl) != 0)
        return -1;
    *name = key + pl + 1;
    *len = klen - pl - 2 - sl;
    if (*len == 0 || *len > DLOCK_NAME_MAX || memchr(*name, '\0', *len))
        return -1;
    return 0;
}

int dlock__redis_scan_cursor(const char *s, size_t len, char out[21])
{
    unsigned long long v = 0;

    if (len > 20)
        return -1;
    for (size_t i = 0; i < len; i++) {
        unsigned d = (unsigned)(unsigned char)s[i] - '0';
        if (d > 9 || v > (ULLONG_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    snprintf(out, 21, "%llu", v);
    return 0;
}

int dlock__redis_walk_cursor(const char *s, int n, char (*cur)[21],
                             int *walk)
{
    int i = 0;

    if (!*s) {
        for (i = 0; i < n; i++) {
            strcpy(cur[i], "0");
            walk[i] = DLOCK__WALKING;
        }
        return 0;
    }
    for (const char *p = s;; i++) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (i >= n)
            return -1;
        walk[i] = DLOCK__WALKING;
        if (len == 1 && *p == '-')
            walk[i] = DLOCK__WALKED;
        else if (len == 1 && *p == 'x')
            walk[i] = DLOCK__LEFT_OUT;
        else if (len == 0 || dlock__redis_scan_cursor(p, len, cur[i]) != 0)
            return -1;
        if (!e)
            break;
        p = e + 1;
    }
    return i + 1 == n ? 0 : -1;
}

int dlock__redis_walk_next(int n, char (*cur)[21], const int *walk,
                           char **next)
{
    size_t cap = (size_t)n * 22 + 1, o = 0;
    int more = 0;

    *next = NULL;
    for (int i = 0; i < n; i++)
        more |= walk[i] == DLOCK__WALKING;
    if (!more)
        return DLOCK_OK;
    if (!(*next = malloc(cap)))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++)
        o += (size_t)snprintf(*next + o, cap - o, "%s%s", i ? "," : "",
                              walk[i] == DLOCK__WALKING  ? cur[i]
                              : walk[i] == DLOCK__WALKED ? "-"
                                                         : "x");
    return DLOCK_OK;
}

size_t dlock__redis_wake_key(const dlock__redis_config *cfg, const char *name,
                             size_t len, char *out)
{
    char sfx[32];

    snprintf(sfx, sizeof(sfx), ":w:%ld", cfg->db);
    return dlock__redis_key(cfg, name, len, sfx, out);
}

void dlock__redis_config_free(dlock__redis_config *cfg)
{
    free(cfg->user);
    if (cfg->password) {
        dlock__wipe(cfg->password, strlen(cfg->password));
        free(cfg->password);
    }
    cfg->user = cfg->password = NULL;
    dlock__rtls_free(cfg->tls);
    cfg->tls = NULL;
}

int dlock__redis_append_login(redisContext *ctx,
                              const dlock__redis_config *cfg)
{
    int n = 0;

    if (cfg->password) {
        const char *argv[3] = {"AUTH", cfg->user, cfg->password};
        size_t lens[3] = {4, cfg->user ? strlen(cfg->user) : 0,
                          strlen(cfg->password)};
        if (cfg->user) {
            redisAppendCommandArgv(ctx, 3, argv, lens);
        } else {
            argv[1] = cfg->password;
            lens[1] = lens[2];
            redisAppendCommandArgv(ctx, 2, argv, lens);
        }
        n++;
    }
    if (cfg->db != 0) {
        redisAppendCommand(ctx, "SELECT %ld", cfg->db);
        n++;
    }
    return n;
}

int dlock__redis_send(redisContext *ctx)
{
    return dlock__rio_send(ctx);
}
