/* SPDX-License-Identifier: MIT */
/*
 * fuzz_uri.c -- the store-URI parser (src/core/uri.c), every scheme.
 *
 * Input: a URI (the whole input; inputs with a NUL byte are skipped).
 * Checks: a failure leaves *out empty with a message; a success gives a
 * lowercase scheme, a path that is "" or starts with '/', hosts that are
 * non-empty with ports 1..65535 (0: none), unique non-empty parameter
 * names that dlock__uri_param() finds, and a redacted URI that is the
 * input itself without a password and shows ":***@" with one. Then the
 * parse is written back as a URI with every byte escaped that could be
 * (percent-encoding everything but unreserved characters): parsing that
 * must give the same parts (escaping is lossless).
 */
#include "fuzz.h"

#include "internal.h"
#include "store.h"
#include "uri.h"

#include <ctype.h>


/* s, percent-encoded except [A-Za-z0-9._-] and the bytes in `keep`. */
static void put_esc(fz_buf *b, const char *s, const char *keep)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (isalnum(ch) || ch == '.' || ch == '_' || ch == '-' ||
            (keep && strchr(keep, ch))) {
            fz_put(b, s, 1);
        } else {
            char e[4];
            snprintf(e, sizeof(e), "%%%02X", ch);
            fz_put(b, e, 3);
        }
    }
}

static int same_str(const char *a, const char *b)
{
    if (!a || !b)
        return a == b;
    return strcmp(a, b) == 0;
}

static void check_same(const dlock__uri *a, const dlock__uri *b)
{
    if (!same_str(a->scheme, b->scheme) || !same_str(a->user, b->user) ||
        !same_str(a->password, b->password) || !same_str(a->path, b->path) ||
        a->nhosts != b->nhosts || a->nparams != b->nparams)
        fz_fail("re-encoded URI parses differently (%s vs %s)", a->redacted,
                b->redacted);
    for (size_t i = 0; i < a->nhosts; i++)
        if (strcmp(a->hosts[i].host, b->hosts[i].host) != 0 ||
            a->hosts[i].port != b->hosts[i].port)
            fz_fail("re-encoded URI: host %zu differs", i);
    for (size_t i = 0; i < a->nparams; i++)
        if (strcmp(a->params[i].key, b->params[i].key) != 0 ||
            strcmp(a->params[i].value, b->params[i].value) != 0)
            fz_fail("re-encoded URI: parameter %zu differs", i);
}

static void check_parsed(const char *s, const dlock__uri *u)
{
    if (!u->scheme || !u->path || !u->redacted)
        fz_fail("scheme, path or redacted NULL");
    for (const char *p = u->scheme; *p; p++)
        if (isupper((unsigned char)*p))
            fz_fail("scheme not lowercase");
    if (u->path[0] && u->path[0] != '/')
        fz_fail("path does not start with '/'");
    if ((u->nhosts == 0) != (u->hosts == NULL) && u->nhosts != 0)
        fz_fail("nhosts without hosts");
    for (size_t i = 0; i < u->nhosts; i++) {
        if (!u->hosts[i].host || !u->hosts[i].host[0])
            fz_fail("empty host");
        if (u->hosts[i].port < 0 || u->hosts[i].port > 65535)
            fz_fail("port out of range");
    }
    for (size_t i = 0; i < u->nparams; i++) {
        if (!u->params[i].key[0] || !u->params[i].value)
            fz_fail("parameter without a name or value");
        if (dlock__uri_param(u, u->params[i].key) != u->params[i].value)
            fz_fail("parameter '%s' not found or given twice",
                    u->params[i].key);
    }
    if (!u->password && strcmp(u->redacted, s) != 0)
        fz_fail("redacted differs from the URI without a password");
    if (u->password && !strstr(u->redacted, ":***@"))
        fz_fail("redacted URI does not say :***@");
    if (strlen(u->redacted) > strlen(s) + 4)
        fz_fail("redacted URI longer than expected");
}

static void reencode(const dlock__uri *u, fz_buf *b)
{
    fz_put(b, u->scheme, strlen(u->scheme));
    fz_put(b, "://", 3);
    if (u->user || u->password) {
        if (u->user)
            put_esc(b, u->user, NULL);
        if (u->password) {
            fz_put(b, ":", 1);
            put_esc(b, u->password, NULL);
        }
        fz_put(b, "@", 1);
    }
    for (size_t i = 0; i < u->nhosts; i++) {
        if (i)
            fz_put(b, ",", 1);
        put_esc(b, u->hosts[i].host, NULL);
        if (u->hosts[i].port) {
            char pb[16];
            int n = snprintf(pb, sizeof(pb), ":%d", u->hosts[i].port);
            fz_put(b, pb, (size_t)n);
        }
    }
    put_esc(b, u->path, "/");
    for (size_t i = 0; i < u->nparams; i++) {
        fz_put(b, i ? "&" : "?", 1);
        put_esc(b, u->params[i].key, NULL);
        fz_put(b, "=", 1);
        put_esc(b, u->params[i].value, NULL);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    dlock__uri u, v;
    int rc;

    if (memchr(data, 0, size))
        return 0;
    char *s = fz_dup(data, size);
    memset(&u, 0x5a, sizeof(u)); /* the parser must clear it */
    rc = dlock__uri_parse(s, &u);
    if (rc != DLOCK_OK) {
        if (rc != DLOCK_EINVAL && rc != DLOCK_ENOMEM)
            fz_fail("parse returned %d", rc);
        if (!dlock_errmsg()[0])
            fz_fail("failure without a message");
        if (u.scheme || u.user || u.password || u.hosts || u.nhosts ||
            u.path || u.params || u.nparams || u.redacted)
            fz_fail("failure left *out non-empty");
        dlock__uri_free(&u);
        free(s);
        return 0;
    }
    check_parsed(s, &u);

    const dlock__backend *be = NULL;
    void *module = NULL;
    if (dlock__store_open(u.scheme, &be, &module) == 0 &&
        (!be || !be->open || !be->close || !be->acquire || !be->release ||
         !be->extend || !be->inspect))
        fz_fail("backend of %s lacks a required slot", u.scheme);
    if (be && be->select) {
        const dlock__backend *other = be->select(&u);
        if (other && !other->open)
            fz_fail("selected backend without open");
    }
    dlock__store_close(module);

    /* write it back, escaped, and parse again: the same parts */
    fz_buf b = {0};
    reencode(&u, &b);
    rc = dlock__uri_parse(b.p, &v);
    if (rc != DLOCK_OK)
        fz_fail("re-encoded URI refused: %s", dlock_errmsg());
    check_parsed(b.p, &v);
    check_same(&u, &v);
    dlock__uri_free(&v);
    free(b.p);

    dlock__uri_free(&u);
    if (u.scheme || u.redacted)
        fz_fail("free did not clear");
    free(s);
    return 0;
}
