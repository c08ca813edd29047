/* SPDX-License-Identifier: MIT */
/*
 * uri.c -- the one store-URI parser (see uri.h).
 *
 * Error messages here never quote the URI: it may hold a password. They
 * name the part that is wrong instead.
 */
#include "uri.h"

#include "internal.h"
#include "hex.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
            int a = dlock__hexval((unsigned char)s[i + 1]);
            int b = dlock__hexval((unsigned char)s[i + 2]);
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

/* Query parameter names that name a secret (decoded, any case): a password
 * goes in the user information or in password_file=, never in the query,
 * and the redactor hides the value of any such parameter. password_file
 * names a file, not a secret. */
static int secret_key(const char *k, size_t n)
{
    static const char *const words[] = {"pass", "pwd", "secret", "token",
                                        "auth", "credential", NULL};
    char low[129];

    if (n >= sizeof(low))
        return 1; /* too long to tell: hide it */
    for (size_t i = 0; i < n; i++)
        low[i] = (char)tolower((unsigned char)k[i]);
    low[n] = '\0';
    if (strcmp(low, "password_file") == 0)
        return 0;
    for (int i = 0; words[i]; i++)
        if (strstr(low, words[i]))
            return 1;
    return 0;
}

/* The raw key s[0..n) decoded into buf (cap bytes); its decoded length, or
 * cap when it does not fit. A bad escape stays as it is. */
static size_t decode_key(const char *s, size_t n, char *buf, size_t cap)
{
    size_t o = 0;

    for (size_t i = 0; i < n; i++) {
        if (o + 1 >= cap)
            return cap;
        int a = -1, b = -1;
        if (s[i] == '%' && i + 2 < n) {
            a = dlock__hexval((unsigned char)s[i + 1]);
            b = dlock__hexval((unsigned char)s[i + 2]);
        }
        if (a >= 0 && b >= 0 && (a || b)) {
            buf[o++] = (char)(a * 16 + b);
            i += 2;
        } else {
            buf[o++] = s[i];
        }
    }
    buf[o] = '\0';
    return o;
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

/* Where the secrets of s lie, by the parser's own rules taken
 * conservatively so that they hold for any string, well-formed or not:
 * - the password: after the first ':' that follows "scheme://" (or the
 *   start of s without one), up to the LAST '@' of s. The parser takes the user
 *   information up to the last '@' of the host part, and refuses a URI
 *   with an '@' past the host part and a ':' before it (a password with an
 *   unescaped '/' or '?'), so for every URI it accepts both agree; for
 *   anything else everything that may be a password is hidden.
 * - the value of a query parameter that names a secret (secret_key()),
 *   up to the end of s: an unescaped '&' in it ends nothing.
 * *pw_colon is the ':' (or -1), *pw_end the '@' (the password is
 * (pw_colon, pw_end)); *q_start the '?' or '&' before a secret query
 * parameter and *q_val the start of its value (or -1 both). *auth is
 * where the user information would start. */
typedef struct secrets {
    long auth, pw_colon, pw_end, q_start, q_val;
} secrets;

static void find_secrets(const char *s, secrets *f)
{
    const char *sep = strstr(s, "://");
    size_t a = 0;
    const char *at = NULL, *q;

    /* "scheme://" counts only when a scheme comes before it: then nothing
     * before it can be secret (it holds no ':'); else everything counts */
    if (sep && sep > s && isalpha((unsigned char)s[0])) {
        a = (size_t)(sep - s) + 3;
        for (const char *p = s; p < sep; p++)
            if (!isalnum((unsigned char)*p) && !strchr("+-.", *p))
                a = 0;
    }

    f->auth = (long)a;
    f->pw_colon = f->pw_end = f->q_start = f->q_val = -1;
    for (const char *p = s + a; *p; p++)
        if (*p == '@')
            at = p;
    if (at) {
        const char *colon = memchr(s + a, ':', (size_t)(at - (s + a)));
        if (colon) {
            f->pw_colon = (long)(colon - s);
            f->pw_end = (long)(at - s);
        }
    }
    /* a secret query parameter: any name that follows a '?' or an '&'
     * once a '?' came (inside a malformed password too) */
    q = strchr(s + a, '?');
    if (!q)
        return;
    for (const char *p = q + 1;; p++) {
        if (p[-1] == '?' || p[-1] == '&') {
            size_t kl = strcspn(p, "=&");
            char key[130];
            if (kl && secret_key(key, decode_key(p, kl, key, sizeof(key)))) {
                f->q_start = (long)(p - s) - 1;
                f->q_val = (long)(p - s + (long)kl) + (p[kl] == '=');
                return;
            }
        }
        if (!*p)
            return;
    }
}

size_t dlock_uri_redact(const char *uri, unsigned how, char *out, size_t cap)
{
    secrets f;
    size_t n, o = 0;

    if (!uri)
        uri = "";
    n = strlen(uri);
    find_secrets(uri, &f);
    /* [0, a1) r1 [b1, a2) r2: the password [a1, b1) and a secret query
     * value [a2, n), merged when they overlap (a malformed string) */
    int drop = (how & DLOCK_REDACT_DROP) != 0;
    size_t a1 = n, b1 = n, a2 = n;
    const char *r1 = NULL, *r2 = NULL;
    if (f.pw_colon >= 0) {
        a1 = (size_t)f.pw_colon + !drop;
        b1 = (size_t)f.pw_end;
        if (drop && (long)a1 == f.auth) /* no user: no user information */
            b1++;
        r1 = drop ? "" : "***";
    }
    if (f.q_val >= 0) {
        a2 = (size_t)(drop ? f.q_start : f.q_val);
        r2 = drop ? "" : "***";
    }
    if (r1 && r2 && a2 <= b1) {
        a1 = a2 < a1 ? a2 : a1;
        b1 = n;
        r2 = NULL;
    } else if (!r1 && r2) {
        a1 = a2;
        b1 = n;
        r1 = r2;
        r2 = NULL;
    }
    if (how & DLOCK_REDACT_STARS) { /* same length, in place allowed */
        if (cap == 0)
            return n;
        size_t m = n < cap - 1 ? n : cap - 1;
        if (out != uri)
            memmove(out, uri, m);
        for (size_t i = 0; i < m; i++)
            if ((f.pw_colon >= 0 && (long)i > f.pw_colon &&
                 (long)i < f.pw_end) ||
                (f.q_val >= 0 && (long)i >= f.q_val))
                out[i] = '*';
        out[m] = '\0';
        return n;
    }
#define EMIT(src, len)                                                        \
    do {                                                                      \
        size_t l_ = (len);                                                    \
        if (o < cap) {                                                        \
            size_t c_ = o + l_ < cap ? l_ : cap - 1 - o;                      \
            memcpy(out + o, (src), c_);                                       \
        }                                                                     \
        o += l_;                                                              \
    } while (0)
    EMIT(uri, a1);
    if (r1) {
        EMIT(r1, strlen(r1));
        EMIT(uri + b1, (r2 ? a2 : n) - b1);
        if (r2)
            EMIT(r2, strlen(r2));
    }
#undef EMIT
    if (cap)
        out[o < cap ? o : cap - 1] = '\0';
    return o;
}

static int build_redacted(const char *s, dlock__uri *u)
{
    size_t n = dlock_uri_redact(s, 0, NULL, 0);
    char *r = malloc(n + 1);

    if (!r)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    dlock_uri_redact(s, 0, r, n + 1);
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

    /* An '@' past the host part with a ':' before it may end a password
     * holding an unescaped '/' or '?': refused, so that what the redactor
     * hides (up to the last '@') is always the whole password. */
    const char *last_at = strrchr(auth, '@');
    if (last_at && last_at >= auth + al &&
        memchr(auth, ':', (size_t)(last_at - auth))) {
        rc = dlock__err(DLOCK_EINVAL,
                        "store URI has an '@' after the host part and a ':' "
                        "before it: escape '/', '?' and '@' in a password "
                        "(and '@' in a path or a query) as %%2F, %%3F and "
                        "%%40");
        goto fail;
    }

    /* before any message names a parameter: a parameter named like a
     * secret (found as the redactor finds it: its value, up to the end,
     * may hold an '&') */
    secrets f;
    find_secrets(s, &f);
    if (f.q_val >= 0) {
        rc = dlock__err(DLOCK_EINVAL,
                        "store URI: a password goes in the user information "
                        "(user:password@) or in a file named by "
                        "password_file=, never in a query parameter");
        goto fail;
    }

    rc = build_redacted(s, &u);
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

/* The longest password a password_file may hold. */
#define PASSWORD_FILE_MAX 4096

/* The password held by the file at `path`: its first line, which must be
 * the only one (a final "\n" or "\r\n" is not part of it). The file
 * must be a regular file that other users cannot read or write and its
 * group cannot write (like ~/.pgpass: 0600, 0400, or 0640/0440 for a
 * service's group). Malloc'd into *out. */
static int read_password_file(const char *path, char **out)
{
    char *buf = NULL;
    struct stat st;
    ssize_t got = 0;
    int fd, rc = DLOCK_OK;

    *out = NULL;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return dlock__err(DLOCK_EAUTH, "store URI: password_file %.200s: %s",
                          path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        rc = dlock__err(DLOCK_EAUTH, "store URI: password_file %.200s is "
                                     "not a regular file",
                        path);
        goto out;
    }
    if (st.st_mode & (S_IRWXO | S_IWGRP)) {
        rc = dlock__err(DLOCK_EAUTH,
                        "store URI: password_file %.200s may be read or "
                        "written by other users (mode %04o): chmod it "
                        "0600 (or 0640 for a group)",
                        path, (unsigned)(st.st_mode & 07777));
        goto out;
    }
    buf = malloc(PASSWORD_FILE_MAX + 2);
    if (!buf) {
        rc = dlock__err(DLOCK_ENOMEM, "out of memory");
        goto out;
    }
    for (;;) { /* to the end, or one byte past the limit */
        ssize_t r = read(fd, buf + got, (size_t)(PASSWORD_FILE_MAX + 2 - got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = dlock__err(DLOCK_EAUTH, "store URI: password_file %.200s: "
                                         "%s",
                            path, strerror(errno));
            goto out;
        }
        if (r == 0 || (got += r) >= PASSWORD_FILE_MAX + 2)
            break;
    }
    size_t n = (size_t)got;
    if (n && buf[n - 1] == '\n') {
        n--;
        if (n && buf[n - 1] == '\r')
            n--;
    }
    if (n > PASSWORD_FILE_MAX || memchr(buf, '\n', n) || memchr(buf, 0, n) ||
        n == 0) {
        rc = dlock__err(DLOCK_EINVAL,
                        "store URI: password_file %.200s must hold one line "
                        "of 1 to %d bytes (no NUL): the password",
                        path, PASSWORD_FILE_MAX);
        goto out;
    }
    buf[n] = '\0';
    *out = buf;
    buf = NULL;
out:
    if (buf) {
        dlock__wipe(buf, PASSWORD_FILE_MAX + 2);
        free(buf);
    }
    close(fd);
    return rc;
}

/* Stores whose URIs take no password. */
static int takes_password(const char *scheme)
{
    return strcmp(scheme, "file") != 0 && strcmp(scheme, "sqlite") != 0;
}

static int is_redis(const char *scheme)
{
    return !strcmp(scheme, "redis") || !strcmp(scheme, "rediss") ||
           !strcmp(scheme, "unix") || !strcmp(scheme, "redis-sentinel") ||
           !strcmp(scheme, "redis-cluster") || !strcmp(scheme, "redlock");
}

int dlock__uri_take_password(dlock__uri *u)
{
    const char *file = dlock__uri_param(u, "password_file");
    const char *env = NULL;

    if (file) {
        char *pw;
        int rc;
        if (u->password)
            return dlock__err(DLOCK_EINVAL,
                              "store URI: a password and a password_file: "
                              "give one of them");
        if (!takes_password(u->scheme))
            return dlock__err(DLOCK_EINVAL,
                              "store URI: %s:// takes no password_file",
                              u->scheme);
        if (!file[0])
            return dlock__err(DLOCK_EINVAL,
                              "store URI: password_file is empty");
        rc = read_password_file(file, &pw);
        if (rc)
            return rc;
        u->password = pw;
        /* the store sees the password, not the parameter */
        for (size_t i = 0; i < u->nparams; i++) {
            if (strcmp(u->params[i].key, "password_file") != 0)
                continue;
            free(u->params[i].key);
            free(u->params[i].value);
            memmove(&u->params[i], &u->params[i + 1],
                    (u->nparams - i - 1) * sizeof(u->params[0]));
            u->nparams--;
            break;
        }
        return DLOCK_OK;
    }
    if (u->password || !takes_password(u->scheme))
        return DLOCK_OK;
    env = getenv("DLOCK_PASSWORD");
    if ((!env || !*env) && is_redis(u->scheme))
        env = getenv("REDISCLI_AUTH");
    if (!env || !*env)
        return DLOCK_OK;
    if (!(u->password = strdup(env)))
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    return DLOCK_OK;
}
