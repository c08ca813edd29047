/* SPDX-License-Identifier: MIT */
/*
 * uri.c -- the one store-URI parser (see uri.h).
 *
 * Error messages here never quote the URI: it may hold a password. They
 * name the part that is wrong instead.
 */
#include "uri.h"

#include "backend.h"
#include "internal.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static int hexval(int ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* Decodes s[0..len) with %XX escapes into a new string; NULL on error with
 * the error already set. `what` names the part for the message. */
static char *decode(const char *s, size_t len, const char *what, int *rc)
{
    char *out = malloc(len + 1);
    size_t o = 0;

    if (!out) {
        *rc = dlock__err(DLOCK_ENOMEM, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == '%') {
            if (i + 2 >= len) {
                dlock__wipe(out, len + 1);
                free(out);
                *rc = dlock__err(DLOCK_EINVAL,
                                 "store URI: truncated %%-escape in the %s",
                                 what);
                return NULL;
            }
            int a = hexval((unsigned char)s[i + 1]);
            int b = hexval((unsigned char)s[i + 2]);
            if (a < 0 || b < 0 || (a == 0 && b == 0)) {
                dlock__wipe(out, len + 1);
                free(out);
                *rc = dlock__err(DLOCK_EINVAL,
                                 "store URI: bad %%-escape in the %s", what);
                return NULL;
            }
            out[o++] = (char)(a * 16 + b);
            i += 2;
        } else {
            out[o++] = s[i];
        }
    }
    out[o] = '\0';
    return out;
}

int dlock__parse_int(const char *s, long long max, long long *out)
{
    long long v = 0;

    if (!s || !*s)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        int d = *s - '0';
        if (v > max / 10 || (v == max / 10 && d > max % 10))
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static int parse_hosts(const char *s, size_t len, dlock__uri *u)
{
    size_t count = 1;
    int rc = DLOCK_OK;

    if (len == 0)
        return DLOCK_OK;
    for (size_t i = 0; i < len; i++)
        if (s[i] == ',')
            count++;
    u->hosts = calloc(count, sizeof(*u->hosts));
    if (!u->hosts)
        return dlock__err(DLOCK_ENOMEM, "out of memory");

    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && s[i] != ',')
            continue;
        const char *h = s + start;
        size_t hl = i - start;
        const char *port = NULL;
        size_t pl = 0;
        dlock__host *dst = &u->hosts[u->nhosts];

        start = i + 1;
        if (hl == 0)
            return dlock__err(DLOCK_EINVAL,
                              "store URI: empty host in the host list");
        if (h[0] == '[') {
            const char *close = memchr(h, ']', hl);
            if (!close)
                return dlock__err(DLOCK_EINVAL,
                                  "store URI: '[' without ']' in a host");
            size_t after = (size_t)(close - h) + 1;
            if (after < hl) {
                if (h[after] != ':')
                    return dlock__err(DLOCK_EINVAL,
                                      "store URI: junk after ']' in a host");
                port = h + after + 1;
                pl = hl - after - 1;
            }
            h++;
            hl = (size_t)(close - h);
        } else {
            const char *colon = memchr(h, ':', hl);
            if (colon) {
                port = colon + 1;
                pl = hl - (size_t)(colon - h) - 1;
                hl = (size_t)(colon - h);
            }
        }
        if (hl == 0)
            return dlock__err(DLOCK_EINVAL, "store URI: empty host name");
        for (size_t k = 0; k < hl; k++) {
            unsigned char ch = (unsigned char)h[k];
            if (!(isalnum(ch) || ch == '.' || ch == '-' || ch == '_' ||
                  ch == ':' || ch == '%'))
                return dlock__err(DLOCK_EINVAL,
                                  "store URI: bad character in a host name");
        }
        dst->host = decode(h, hl, "host", &rc);
        if (!dst->host)
            return rc;
        u->nhosts++;
        if (port) {
            char buf[8];
            long long v;
            if (pl == 0 || pl >= sizeof(buf))
                return dlock__err(DLOCK_EINVAL,
                                  "store URI: bad port for host %s",
                                  dst->host);
            memcpy(buf, port, pl);
            buf[pl] = '\0';
            /* The port is not quoted: with an unescaped '/' in a password,
             * what we take for a port may be part of the password. */
            if (dlock__parse_int(buf, 65535, &v) != 0 || v == 0)
                return dlock__err(DLOCK_EINVAL,
                                  "store URI: bad port for host %s (1..65535; "
                                  "escape '/', '?' and '@' in passwords)",
                                  dst->host);
            dst->port = (int)v;
        }
    }
    return DLOCK_OK;
}

static int parse_query(const char *s, size_t len, dlock__uri *u)
{
    size_t count = 1;
    int rc = DLOCK_OK;

    if (len == 0)
        return DLOCK_OK;
    for (size_t i = 0; i < len; i++)
        if (s[i] == '&')
            count++;
    u->params = calloc(count, sizeof(*u->params));
    if (!u->params)
        return dlock__err(DLOCK_ENOMEM, "out of memory");

    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && s[i] != '&')
            continue;
        const char *kv = s + start;
        size_t kvl = i - start;
        start = i + 1;
        if (kvl == 0)
            continue; /* "a=1&&b=2" or a trailing '&' */
        const char *eq = memchr(kv, '=', kvl);
        size_t kl = eq ? (size_t)(eq - kv) : kvl;
        dlock__param *p = &u->params[u->nparams];
        if (kl == 0)
            return dlock__err(DLOCK_EINVAL,
                              "store URI: query parameter without a name");
        p->key = decode(kv, kl, "query", &rc);
        if (!p->key)
            return rc;
        p->value = eq ? decode(eq + 1, kvl - kl - 1, "query", &rc)
                      : decode("", 0, "query", &rc);
        if (!p->value) {
            free(p->key);
            p->key = NULL;
            return rc;
        }
        u->nparams++;
        for (size_t k = 0; k + 1 < u->nparams; k++)
            if (strcmp(u->params[k].key, p->key) == 0)
                return dlock__err(DLOCK_EINVAL,
                                  "store URI: query parameter '%s' given "
                                  "twice",
                                  p->key);
    }
    return DLOCK_OK;
}

static int build_redacted(const char *s, const char *auth, const char *at,
                          dlock__uri *u)
{
    size_t n = strlen(s) + 8;
    char *r = malloc(n);

    if (!r)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    if (!at) {
        memcpy(r, s, strlen(s) + 1);
    } else {
        size_t pre = (size_t)(auth - s); /* "scheme://" */
        const char *colon = memchr(auth, ':', (size_t)(at - auth));
        size_t ul = colon ? (size_t)(colon - auth) : (size_t)(at - auth);
        size_t o;

        memcpy(r, s, pre);
        o = pre;
        memcpy(r + o, auth, ul);
        o += ul;
        if (colon) {
            memcpy(r + o, ":***", 4);
            o += 4;
        }
        size_t rest = strlen(at);
        memcpy(r + o, at, rest + 1);
    }
    u->redacted = r;
    return DLOCK_OK;
}

int dlock__uri_parse(const char *s, dlock__uri *out)
{
    dlock__uri u;
    int rc;

    memset(&u, 0, sizeof(u));
    memset(out, 0, sizeof(*out));
    if (!s || !*s)
        return dlock__err(DLOCK_EINVAL, "store URI is empty");

    /* scheme */
    size_t sl = 0;
    while (s[sl] && (isalnum((unsigned char)s[sl]) || s[sl] == '+' ||
                     s[sl] == '-' || s[sl] == '.'))
        sl++;
    if (sl == 0 || !isalpha((unsigned char)s[0]) ||
        strncmp(s + sl, "://", 3) != 0)
        return dlock__err(DLOCK_EINVAL,
                          "store URI must look like scheme://..., e.g. "
                          "redis://127.0.0.1:6379 or file:///var/lock/dlock");
    if (sl > 32)
        return dlock__err(DLOCK_EINVAL, "store URI: scheme too long");
    u.scheme = malloc(sl + 1);
    if (!u.scheme)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    for (size_t i = 0; i < sl; i++)
        u.scheme[i] = (char)tolower((unsigned char)s[i]);
    u.scheme[sl] = '\0';

    for (const char *p = s; *p; p++) {
        if ((unsigned char)*p <= ' ' || *p == 0x7f) {
            rc = dlock__err(DLOCK_EINVAL,
                            "store URI contains a space or control "
                            "character (escape it as %%XX)");
            goto fail;
        }
        if (*p == '#') {
            rc = dlock__err(DLOCK_EINVAL,
                            "store URI contains '#' (escape it as %%23)");
            goto fail;
        }
    }

    const char *auth = s + sl + 3;
    size_t al = strcspn(auth, "/?");
    const char *at = NULL;
    for (size_t i = 0; i < al; i++)
        if (auth[i] == '@')
            at = auth + i;

    rc = build_redacted(s, auth, at, &u);
    if (rc)
        goto fail;

    const char *hosts = auth;
    if (at) {
        const char *colon = memchr(auth, ':', (size_t)(at - auth));
        size_t ul = colon ? (size_t)(colon - auth) : (size_t)(at - auth);
        if (ul > 0) {
            u.user = decode(auth, ul, "user name", &rc);
            if (!u.user)
                goto fail;
        }
        if (colon) {
            u.password = decode(colon + 1, (size_t)(at - colon - 1),
                                "password", &rc);
            if (!u.password)
                goto fail;
        }
        hosts = at + 1;
    }
    rc = parse_hosts(hosts, al - (size_t)(hosts - auth), &u);
    if (rc)
        goto fail;

    const char *path = auth + al;
    size_t pl = strcspn(path, "?");
    u.path = decode(path, pl, "path", &rc);
    if (!u.path)
        goto fail;
    if (path[pl] == '?') {
        rc = parse_query(path + pl + 1, strlen(path + pl + 1), &u);
        if (rc)
            goto fail;
    }
    *out = u;
    return DLOCK_OK;

fail:
    dlock__uri_free(&u);
    return rc;
}

void dlock__uri_free(dlock__uri *u)
{
    if (!u)
        return;
    free(u->scheme);
    free(u->user);
    if (u->password) {
        dlock__wipe(u->password, strlen(u->password));
        free(u->password);
    }
    for (size_t i = 0; i < u->nhosts; i++)
        free(u->hosts[i].host);
    free(u->hosts);
    free(u->path);
    for (size_t i = 0; i < u->nparams; i++) {
        free(u->params[i].key);
        free(u->params[i].value);
    }
    free(u->params);
    free(u->redacted);
    memset(u, 0, sizeof(*u));
}

const char *dlock__uri_param(const dlock__uri *u, const char *key)
{
    for (size_t i = 0; i < u->nparams; i++)
        if (strcmp(u->params[i].key, key) == 0)
            return u->params[i].value;
    return NULL;
}

int dlock__uri_check_params(const dlock__uri *u, const char *const *allowed)
{
    for (size_t i = 0; i < u->nparams; i++) {
        int ok = 0;
        for (size_t k = 0; allowed && allowed[k]; k++)
            if (strcmp(u->params[i].key, allowed[k]) == 0)
                ok = 1;
        if (!ok)
            return dlock__err(DLOCK_EINVAL,
                              "store URI: unknown parameter '%s' for %s://",
                              u->params[i].key, u->scheme);
    }
    return DLOCK_OK;
}
