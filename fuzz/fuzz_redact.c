/* SPDX-License-Identifier: MIT */
/*
 * fuzz_redact.c -- passwords of any bytes never leave a store URI
 * (dlock_uri_redact() and the URI parser's `redacted` and messages).
 *
 * Input: a scheme (one byte: every store's, none, or a made-up one), a
 * layout byte, then NUL-separated fields: the password (any bytes but
 * NUL), a user, hosts, a path and a query (raw: they may hold ':', '@',
 * '?', '&' too). The URI is scheme://[user]:PASSWORD@hosts/path?query, or
 * the password goes in a query parameter named like a secret, or both.
 *
 * Oracle: the "skeleton" is the same URI with an empty password; a byte of
 * the password that is not in the skeleton (nor '*') is the password's
 * own, and must not appear in any redacted form (0, DLOCK_REDACT_STARS,
 * DLOCK_REDACT_DROP, truncated or not), nor in u.redacted when the parser
 * accepts the URI, nor -- for bytes >= 0x80, which no fixed message text
 * holds -- in the parser's error message when it refuses it. The STARS
 * form keeps the length and is the same in place; an accepted URI's
 * `redacted` is dlock_uri_redact(uri, 0) and the parser's password is
 * hidden whole.
 */
#include "fuzz.h"

#include "store.h"
#include "uri.h"

#include <dlock.h>

static const char *const schemes[] = {
    "redis",   "rediss",     "unix",  "redis-sentinel", "redis-cluster",
    "redlock", "zk",         "etcd",  "etcds",          "postgres",
    "postgresql", "mysql",   "mariadb", "sqlite",       "file",
    "",        "x+y.z-w",    "REDIS"};
#define NSCHEMES (sizeof(schemes) / sizeof(schemes[0]))

static const char *const keys[] = {"password", "sslpassword", "Pass%77ord",
                                   "token",    "auth",        "x_secret"};
#define NKEYS (sizeof(keys) / sizeof(keys[0]))


static void puts_(fz_buf *b, const char *s) { fz_put(b, s, strlen(s)); }

/* a user: no ':' or '@' of its own (escaped), so that the first ':'
 * after "://" is the password's */
static void put_user(fz_buf *b, const char *u)
{
    for (; *u; u++) {
        unsigned char ch = (unsigned char)*u;
        if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
            ch == '.' || ch == '-') {
            fz_put(b, u, 1);
        } else {
            char e[4];
            snprintf(e, sizeof(e), "%%%02X", ch);
            fz_put(b, e, 3);
        }
    }
}

static char *build(unsigned sch, unsigned lay, const char *pw,
                   const char *user, const char *hosts, const char *path,
                   const char *query)
{
    fz_buf b = {NULL, 0, 0};

    puts_(&b, schemes[sch]);
    if (schemes[sch][0] || (lay & 0x40))
        puts_(&b, "://");
    if (lay & 0x2) { /* the password in the user information */
        if (lay & 0x1)
            put_user(&b, user);
        puts_(&b, ":");
        puts_(&b, pw);
        puts_(&b, "@");
    }
    puts_(&b, hosts);
    if (lay & 0x8) {
        puts_(&b, "/");
        puts_(&b, path);
    }
    if (lay & 0x4) { /* the password in a query parameter */
        puts_(&b, "?");
        if (lay & 0x10) {
            puts_(&b, query);
            puts_(&b, "&");
        }
        puts_(&b, keys[(lay >> 5) % NKEYS]);
        puts_(&b, "=");
        puts_(&b, pw);
        if (lay & 0x80) {
            puts_(&b, "&");
            puts_(&b, query);
        }
    } else if (lay & 0x10) {
        puts_(&b, "?");
        puts_(&b, query);
    }
    if (!b.p)
        puts_(&b, "");
    return b.p;
}

/* the bytes of the password that the skeleton does not hold */
static void own_bytes(const char *pw, const char *skel, unsigned char own[256])
{
    memset(own, 0, 256);
    for (const unsigned char *p = (const unsigned char *)pw; *p; p++)
        if (*p != '*' && !strchr(skel, *p))
            own[*p] = 1;
}

static void check_clean(const char *what, const char *s,
                        const unsigned char own[256], int high_only)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (own[*p] && (!high_only || *p >= 0x80))
            fz_fail("%s shows byte 0x%02x of the password: %s", what, *p, s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = fz_init(data, size);
    unsigned sch = fz_byte(&f) % NSCHEMES;
    unsigned lay = fz_byte(&f);
    char *pw = fz_field(&f, NULL);
    char *user = fz_field(&f, NULL);
    char *hosts = fz_field(&f, NULL);
    char *path = fz_field(&f, NULL);
    char *query = fz_field(&f, NULL);
    unsigned cap_b = fz_byte(&f);
    unsigned char own[256];

    if (!(lay & 0x6))
        lay |= 0x2; /* a password somewhere */
    /* "user:" + "//..." would read "user://...": a scheme, and no
     * password at all (the parser's view too) */
    if (!schemes[sch][0] && !strncmp(pw, "//", 2))
        lay |= 0x40;
    char *uri = build(sch, lay, pw, user, hosts, path, query);
    char *skel = build(sch, lay, "", user, hosts, path, query);
    own_bytes(pw, skel, own);
    size_t n = strlen(uri);

    for (unsigned how = 0; how < 3; how++) {
        size_t need = dlock_uri_redact(uri, how, NULL, 0);
        char *r = malloc(need + 1);
        if (!r)
            abort();
        if (dlock_uri_redact(uri, how, r, need + 1) != need ||
            strlen(r) != need)
            fz_fail("redact(%u): length", how);
        check_clean("dlock_uri_redact", r, own, 0);
        if (how == DLOCK_REDACT_STARS) {
            if (need != n)
                fz_fail("STARS changed the length");
            char *in = fz_dup(uri, n);
            dlock_uri_redact(in, how, in, n + 1);
            if (strcmp(in, r) != 0)
                fz_fail("STARS in place differs: %s / %s", in, r);
            free(in);
        }
        /* truncated: never past cap, always terminated, a prefix */
        size_t cap = cap_b % (need + 2);
        char *t = malloc(cap ? cap : 1);
        if (!t)
            abort();
        if (dlock_uri_redact(uri, how, t, cap) != need)
            fz_fail("redact(%u) truncated: length", how);
        if (cap && (strlen(t) != (cap - 1 < need ? cap - 1 : need) ||
                    strncmp(t, r, strlen(t)) != 0))
            fz_fail("redact(%u) truncated: not a prefix", how);
        free(t);
        free(r);
    }

    dlock__uri u;
    if (dlock__uri_parse(uri, &u) == DLOCK_OK) {
        char *r = malloc(n + 8);
        if (!r)
            abort();
        dlock_uri_redact(uri, 0, r, n + 8);
        if (strcmp(r, u.redacted) != 0)
            fz_fail("redacted %s, dlock_uri_redact %s", u.redacted, r);
        check_clean("redacted", u.redacted, own, 0);
        /* whatever the parser took for a password is hidden whole */
        if (u.password && strlen(u.password) >= 4 &&
            !strchr(u.password, '*') && strstr(u.redacted, u.password) &&
            !strstr(skel, u.password))
            fz_fail("the parsed password shows in %s", u.redacted);
        free(r);
        dlock__uri_free(&u);
    } else {
        check_clean("the parser's message", dlock_errmsg(), own, 1);
    }

    free(uri);
    free(skel);
    free(pw);
    free(user);
    free(hosts);
    free(path);
    free(query);
    return 0;
}
