/* SPDX-License-Identifier: MIT */
/*
 * web_config.c -- the exporter's --web.config.file, in the format of the
 * Prometheus exporter-toolkit (docs/monitoring.md lists what is taken):
 *
 *   tls_server_config:   cert_file/cert, key_file/key, client_ca_file/
 *                        client_ca, client_auth_type (NoClientCert or
 *                        RequireAndVerifyClientCert), min_version,
 *                        max_version, prefer_server_cipher_suites
 *   http_server_config:  http2 (no effect: HTTP/1.1 only), headers
 *   basic_auth_users:    user: bcrypt hash
 *
 * A key the toolkit has and this exporter cannot honour (cipher_suites,
 * curve_preferences, client_allowed_sans, rate_limit, the other client
 * auth types) is refused rather than ignored: a file that asks for a
 * restriction gets it or the exporter does not start. Unknown keys are
 * refused with their name, as the toolkit does.
 */
#include "web_config.h"

#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#ifndef DLOCK_CLI_HAVE_WEBCFG

int web_config_load(const char *path, web_config *cfg)
{
    (void)path;
    memset(cfg, 0, sizeof(*cfg));
    cli_err("exporter: --web.config.file: this dlock was built without "
            "libyaml, libxcrypt or GnuTLS; install them (Debian: "
            "libyaml-dev libcrypt-dev libgnutls28-dev) and build dlock "
            "again");
    return -1;
}

void web_config_free(web_config *cfg)
{
    (void)cfg;
}

int web_config_check(const web_config *cfg, const char *user,
                     const char *password)
{
    (void)cfg;
    (void)user;
    (void)password;
    return 0;
}

#else /* DLOCK_CLI_HAVE_WEBCFG */

#include <crypt.h>
#include <errno.h>
#include <stdarg.h>
#include <yaml.h>

/* A PEM file or the config file itself: far above any real one. */
#define FILE_MAX (1024 * 1024)

typedef struct ctx {
    const char *path; /* the config file, for messages */
    yaml_document_t *doc;
} ctx;

static int bad(const ctx *c, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int bad(const ctx *c, const yaml_node_t *n, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (n)
        cli_err("exporter: --web.config.file %s, line %lu: %s", c->path,
                (unsigned long)n->start_mark.line + 1, msg);
    else
        cli_err("exporter: --web.config.file %s: %s", c->path, msg);
    return -1;
}

/* Reads a whole file (at most FILE_MAX bytes) into a NUL-ended buffer. */
static char *slurp(const char *path, size_t *len, int *err)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t n = 0;

    *err = 0;
    if (!f) {
        *err = errno;
        return NULL;
    }
    buf = malloc(FILE_MAX + 1);
    if (!buf) {
        *err = ENOMEM;
        fclose(f);
        return NULL;
    }
    n = fread(buf, 1, FILE_MAX + 1, f);
    if (ferror(f))
        *err = errno ? errno : EIO;
    else if (n > FILE_MAX)
        *err = EFBIG;
    fclose(f);
    if (*err) {
        explicit_bzero(buf, n);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

static int is_null(const yaml_node_t *n)
{
    const char *v;

    if (n->type != YAML_SCALAR_NODE ||
        n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return 0;
    v = (const char *)n->data.scalar.value;
    return !*v || !strcmp(v, "~") || !strcmp(v, "null") ||
           !strcmp(v, "Null") || !strcmp(v, "NULL");
}

/* A scalar's text (borrowed), or NULL after a message. */
static const char *scalar(const ctx *c, const yaml_node_t *n,
                          const char *key)
{
    if (n->type != YAML_SCALAR_NODE) {
        bad(c, n, "%s wants a string", key);
        return NULL;
    }
    if (strlen((const char *)n->data.scalar.value) != n->data.scalar.length) {
        bad(c, n, "%s contains a NUL byte", key);
        return NULL;
    }
    return (const char *)n->data.scalar.value;
}

static int boolean(const ctx *c, const yaml_node_t *n, const char *key)
{
    const char *v = scalar(c, n, key);

    if (!v)
        return -1;
    if (!strcmp(v, "true") || !strcmp(v, "True") || !strcmp(v, "TRUE"))
        return 1;
    if (!strcmp(v, "false") || !strcmp(v, "False") || !strcmp(v, "FALSE"))
        return 0;
    return bad(c, n, "%s wants true or false, not '%s'", key, v);
}

/* Walks a mapping: calls fn for each pair, key checked to be a string and
 * not given twice. NULL mapping (`key:` with nothing) is empty. */
typedef int (*pair_fn)(const ctx *c, const char *key, yaml_node_t *v,
                       void *arg);

static int each_pair(const ctx *c, yaml_node_t *m, const char *where,
                     pair_fn fn, void *arg)
{
    if (is_null(m))
        return 0;
    if (m->type != YAML_MAPPING_NODE)
        return bad(c, m, "%s wants a mapping (key: value lines)", where);
    for (yaml_node_pair_t *p = m->data.mapping.pairs.start;
         p < m->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
        const char *ks;

        if (!k || !v)
            return bad(c, m, "%s: a broken pair", where);
        if (!(ks = scalar(c, k, "a key")))
            return -1;
        for (yaml_node_pair_t *q = m->data.mapping.pairs.start; q < p; q++) {
            yaml_node_t *k2 = yaml_document_get_node(c->doc, q->key);
            if (k2 && k2->type == YAML_SCALAR_NODE &&
                !strcmp((const char *)k2->data.scalar.value, ks))
                return bad(c, k, "%s: '%s' is given twice", where, ks);
        }
        if (fn(c, ks, v, arg) != 0)
            return -1;
    }
    return 0;
}

/* ---- tls_server_config ------------------------------------------------ */

typedef struct tls_in {
    const char *dir; /* the config file's directory, "" for the cwd */
    char *cert, *key, *ca;
    int cert_file, key_file, ca_file; /* given as a file */
    const char *auth_type;
    yaml_node_t *auth_node;
    int vmin, vmax; /* 0..3: TLS 1.0 .. 1.3 */
    int any;        /* a key was given */
} tls_in;

static int pem(const ctx *c, yaml_node_t *v, const char *key, int file,
               const char *dir, char **out, int *was_file)
{
    const char *s = scalar(c, v, key);
    char *path;
    int err;

    if (!s)
        return -1;
    if (*out)
        return bad(c, v,
                   "%s: give either the file or the inline PEM, not both",
                   key);
    if (!file) {
        if (!(*out = strdup(s)))
            return bad(c, v, "out of memory");
        return 0;
    }
    if (!*s)
        return bad(c, v, "%s is empty", key);
    if (s[0] == '/' || !*dir) {
        path = strdup(s);
    } else if ((path = malloc(strlen(dir) + strlen(s) + 2)) != NULL) {
        sprintf(path, "%s/%s", dir, s);
    }
    if (!path)
        return bad(c, v, "out of memory");
    *out = slurp(path, NULL, &err);
    if (!*out) {
        bad(c, v, "%s %s: %s", key, path,
            err == EFBIG ? "larger than 1 MiB" : strerror(err));
        free(path);
        return -1;
    }
    free(path);
    *was_file = 1;
    return 0;
}

static int tls_version(const ctx *c, yaml_node_t *v, const char *key)
{
    static const char *const names[] = {"TLS10", "TLS11", "TLS12", "TLS13"};
    const char *s = scalar(c, v, key);

    if (!s)
        return -1;
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, names[i]))
            return i;
    return bad(c, v, "%s wants TLS10, TLS11, TLS12 or TLS13, not '%s'", key,
               s);
}

static int tls_pair(const ctx *c, const char *k, yaml_node_t *v, void *arg)
{
    tls_in *t = arg;
    int r;

    t->any = 1;
    if (!strcmp(k, "cert") || !strcmp(k, "cert_file"))
        return pem(c, v, k, k[4] != '\0', t->dir, &t->cert, &t->cert_file);
    if (!strcmp(k, "key") || !strcmp(k, "key_file"))
        return pem(c, v, k, k[3] != '\0', t->dir, &t->key, &t->key_file);
    if (!strcmp(k, "client_ca") || !strcmp(k, "client_ca_file"))
        return pem(c, v, k, k[9] != '\0', t->dir, &t->ca, &t->ca_file);
    if (!strcmp(k, "client_auth_type")) {
        if (!(t->auth_type = scalar(c, v, k)))
            return -1;
        t->auth_node = v;
        return 0;
    }
    if (!strcmp(k, "min_version") || !strcmp(k, "max_version")) {
        if ((r = tls_version(c, v, k)) < 0)
            return -1;
        if (k[1] == 'i')
            t->vmin = r;
        else
            t->vmax = r;
        return 0;
    }
    if (!strcmp(k, "prefer_server_cipher_suites"))
        return boolean(c, v, k) < 0 ? -1 : 0; /* GnuTLS' order either way */
    if (!strcmp(k, "cipher_suites") || !strcmp(k, "curve_preferences") ||
        !strcmp(k, "client_allowed_sans")) {
        if (is_null(v) || (v->type == YAML_SEQUENCE_NODE &&
                           v->data.sequence.items.start ==
                               v->data.sequence.items.top))
            return 0;
        return bad(c, v,
                   "tls_server_config.%s is not supported by dlock's "
                   "exporter (remove it, or put a TLS proxy in front)",
                   k);
    }
    return bad(c, v, "unknown key '%s' in tls_server_config", k);
}

static int tls_load(const ctx *c, yaml_node_t *v, const char *dir,
                    web_config *cfg)
{
    tls_in t;
    int rc = -1;

    memset(&t, 0, sizeof(t));
    t.dir = dir;
    t.vmin = 2; /* TLS12, the toolkit's default */
    t.vmax = 3;
    if (each_pair(c, v, "tls_server_config", tls_pair, &t) != 0)
        goto out;
    if (!t.any) { /* empty: plain HTTP, as the toolkit does */
        rc = 0;
        goto out;
    }
    if (!t.cert || !t.key) {
        bad(c, v,
            "tls_server_config needs cert_file (or cert) and key_file "
            "(or key)");
        goto out;
    }
    if (t.vmin > t.vmax) {
        bad(c, v, "tls_server_config: min_version is above max_version");
        goto out;
    }
    if (!t.auth_type || !strcmp(t.auth_type, "NoClientCert")) {
        if (t.ca) {
            bad(c, v,
                "tls_server_config: client_ca_file without "
                "client_auth_type: RequireAndVerifyClientCert");
            goto out;
        }
    } else if (!strcmp(t.auth_type, "RequireAndVerifyClientCert")) {
        if (!t.ca) {
            bad(c, t.auth_node,
                "client_auth_type RequireAndVerifyClientCert needs "
                "client_ca_file (or client_ca)");
            goto out;
        }
        cfg->verify_client = 1;
    } else {
        bad(c, t.auth_node,
            "client_auth_type '%s' is not supported by dlock's exporter: "
            "NoClientCert or RequireAndVerifyClientCert (the others let "
            "a client in without a verified certificate)",
            t.auth_type);
        goto out;
    }
    strcpy(cfg->priorities, "NORMAL:-VERS-ALL");
    for (int i = t.vmin; i <= t.vmax; i++)
        sprintf(cfg->priorities + strlen(cfg->priorities), ":+VERS-TLS1.%d",
                i);
    cfg->cert_pem = t.cert;
    cfg->key_pem = t.key;
    cfg->ca_pem = t.ca;
    t.cert = t.key = t.ca = NULL;
    rc = 0;
out:
    free(t.cert);
    if (t.key) {
        explicit_bzero(t.key, strlen(t.key));
        free(t.key);
    }
    free(t.ca);
    return rc;
}

/* ---- http_server_config ------------------------------------------------ */

static const char *const header_names[WEB_HEADERS_MAX] = {
    "Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options",
    "X-XSS-Protection", "Strict-Transport-Security"};

static int header_pair(const ctx *c, const char *k, yaml_node_t *v,
                       void *arg)
{
    web_config *cfg = arg;
    const char *s;
    int which = -1;

    for (int i = 0; i < WEB_HEADERS_MAX; i++)
        if (!strcmp(k, header_names[i]))
            which = i;
    if (which < 0)
        return bad(c, v,
                   "unknown header '%s' in http_server_config.headers "
                   "(Content-Security-Policy, X-Frame-Options, "
                   "X-Content-Type-Options, X-XSS-Protection, "
                   "Strict-Transport-Security)",
                   k);
    if (!(s = scalar(c, v, k)))
        return -1;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < ' ' || *p == 0x7f)
            return bad(c, v, "header %s: a control character", k);
    if (which == 1 && *s && strcasecmp(s, "deny") &&
        strcasecmp(s, "sameorigin"))
        return bad(c, v, "X-Frame-Options wants deny or sameorigin");
    if (which == 2 && *s && strcasecmp(s, "nosniff"))
        return bad(c, v, "X-Content-Type-Options wants nosniff");
    if (!*s) /* blank: unset */
        return 0;
    cfg->header_name[cfg->nheaders] = header_names[which];
    if (!(cfg->header_value[cfg->nheaders] = strdup(s)))
        return bad(c, v, "out of memory");
    cfg->nheaders++;
    return 0;
}

static int http_pair(const ctx *c, const char *k, yaml_node_t *v, void *arg)
{
    if (!strcmp(k, "http2")) /* libmicrohttpd: HTTP/1.1 only */
        return boolean(c, v, k) < 0 ? -1 : 0;
    if (!strcmp(k, "headers"))
        return each_pair(c, v, "http_server_config.headers", header_pair,
                         arg);
    return bad(c, v, "unknown key '%s' in http_server_config", k);
}

/* ---- basic_auth_users -------------------------------------------------- */

static int is_bcrypt(const char *h)
{
    static const char b64[] =
        "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

    if (strlen(h) != 60 || h[0] != '$' || h[1] != '2' ||
        (h[2] != 'a' && h[2] != 'b' && h[2] != 'y') || h[3] != '$' ||
        h[4] < '0' || h[4] > '3' || h[5] < '0' || h[5] > '9' ||
        h[6] != '$')
        return 0;
    if ((h[4] - '0') * 10 + (h[5] - '0') < 4 ||
        (h[4] - '0') * 10 + (h[5] - '0') > 31)
        return 0;
    for (int i = 7; i < 60; i++)
        if (!strchr(b64, h[i]))
            return 0;
    return 1;
}

static int user_pair(const ctx *c, const char *k, yaml_node_t *v, void *arg)
{
    web_config *cfg = arg;
    const char *h = scalar(c, v, "a password hash");
    web_user *u;

    if (!h)
        return -1;
    if (strchr(k, ':'))
        return bad(c, v,
                   "basic_auth_users: user '%s' has a ':', which basic "
                   "auth cannot carry",
                   k);
    if (!is_bcrypt(h))
        return bad(c, v,
                   "basic_auth_users: the password of user '%s' is not a "
                   "bcrypt hash ($2y$10$ and 53 characters; make one with "
                   "htpasswd -nBC 10 \"\" | tr -d ':\\n')",
                   k);
    u = realloc(cfg->users, (cfg->nusers + 1) * sizeof(*u));
    if (!u)
        return bad(c, v, "out of memory");
    cfg->users = u;
    u += cfg->nusers;
    u->name = strdup(k);
    u->hash = strdup(h);
    if (!u->name || !u->hash) {
        free(u->name);
        free(u->hash);
        return bad(c, v, "out of memory");
    }
    cfg->nusers++;
    return 0;
}

/* ---- the file ------------------------------------------------------------ */

typedef struct top_in {
    web_config *cfg;
    const char *dir;
} top_in;

static int top_pair(const ctx *c, const char *k, yaml_node_t *v, void *arg)
{
    top_in *t = arg;

    if (!strcmp(k, "tls_server_config"))
        return tls_load(c, v, t->dir, t->cfg);
    if (!strcmp(k, "http_server_config"))
        return each_pair(c, v, "http_server_config", http_pair, t->cfg);
    if (!strcmp(k, "basic_auth_users"))
        return each_pair(c, v, "basic_auth_users", user_pair, t->cfg);
    if (!strcmp(k, "rate_limit"))
        return bad(c, v,
                   "rate_limit is not supported by dlock's exporter (its "
                   "answers come from a cache: see --cache-ttl)");
    return bad(c, v, "unknown key '%s'", k);
}

int web_config_load(const char *path, web_config *cfg)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    yaml_node_t *root;
    ctx c = {path, &doc};
    top_in t = {cfg, ""};
    char *text, *dir = NULL, *slash;
    size_t len;
    int err, rc = -1;

    memset(cfg, 0, sizeof(*cfg));
    if (!(text = slurp(path, &len, &err))) {
        cli_err("exporter: --web.config.file %s: %s", path,
                err == EFBIG ? "larger than 1 MiB" : strerror(err));
        return -1;
    }
    if ((slash = strrchr(path, '/')) != NULL) {
        if (!(dir = strndup(path, (size_t)(slash - path) + (slash == path)))) {
            free(text);
            cli_err("out of memory");
            return -1;
        }
        t.dir = dir;
    }
    if (!yaml_parser_initialize(&parser)) {
        cli_err("out of memory");
        goto out_text;
    }
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    if (!yaml_parser_load(&parser, &doc)) {
        cli_err("exporter: --web.config.file %s, line %lu: %s", path,
                (unsigned long)parser.problem_mark.line + 1,
                parser.problem ? parser.problem : "not YAML");
        yaml_parser_delete(&parser);
        goto out_text;
    }
    root = yaml_document_get_root_node(&doc);
    if (root) /* an empty file: plain HTTP, no auth */
        rc = each_pair(&c, root, "the file", top_pair, &t);
    else
        rc = 0;
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
out_text:
    explicit_bzero(text, len); /* an inline key */
    free(text);
    free(dir);
    if (rc != 0)
        web_config_free(cfg);
    return rc;
}

void web_config_free(web_config *cfg)
{
    free(cfg->cert_pem);
    if (cfg->key_pem) {
        explicit_bzero(cfg->key_pem, strlen(cfg->key_pem));
        free(cfg->key_pem);
    }
    free(cfg->ca_pem);
    for (size_t i = 0; i < cfg->nusers; i++) {
        free(cfg->users[i].name);
        free(cfg->users[i].hash);
    }
    free(cfg->users);
    for (size_t i = 0; i < cfg->nheaders; i++)
        free(cfg->header_value[i]);
    memset(cfg, 0, sizeof(*cfg));
}

/* 1 if a and b are equal; the time depends on b's length only. */
static int same(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    unsigned diff = la != lb;

    for (size_t i = 0; i < lb; i++)
        diff |= (unsigned char)b[i] ^ (unsigned char)(i < la ? a[i] : 0);
    return diff == 0;
}

int web_config_check(const web_config *cfg, const char *user,
                     const char *password)
{
    /* an unknown user is checked against the first user's hash, then
     * refused: one bcrypt either way, with the same cost */
    const char *hash;
    struct crypt_data *cd;
    const char *out;
    int found = 0, ok;

    if (!cfg->nusers)
        return 0;
    hash = cfg->users[0].hash;
    for (size_t i = 0; i < cfg->nusers; i++) {
        int eq = same(user, cfg->users[i].name);
        if (eq && !found)
            hash = cfg->users[i].hash;
        found |= eq;
    }
    if (!(cd = calloc(1, sizeof(*cd))))
        return 0;
    out = crypt_rn(password, hash, cd, (int)sizeof(*cd));
    ok = out != NULL && same(out, hash) && found;
    explicit_bzero(cd, sizeof(*cd));
    free(cd);
    return ok;
}

#endif /* DLOCK_CLI_HAVE_WEBCFG */
