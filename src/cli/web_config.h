/* SPDX-License-Identifier: MIT */
/*
 * web_config.h -- `dlock exporter --web.config.file FILE`: the Prometheus
 * exporter-toolkit's web configuration (TLS, basic auth, response
 * headers), read with libyaml; bcrypt hashes checked with libxcrypt's
 * crypt_rn(). Built when DLOCK_CLI_HAVE_WEBCFG is defined; otherwise
 * web_config_load() refuses, naming the packages.
 */
#ifndef DLOCK_CLI_WEB_CONFIG_H
#define DLOCK_CLI_WEB_CONFIG_H

#include <stddef.h>

#define WEB_HEADERS_MAX 5

typedef struct web_user {
    char *name;
    char *hash; /* bcrypt: $2a$, $2b$ or $2y$ */
} web_user;

typedef struct web_config {
    /* TLS: all NULL without tls_server_config (plain HTTP) */
    char *cert_pem, *key_pem; /* the server's certificate chain and key */
    char *ca_pem;             /* client CAs (client_auth_type needs it) */
    int verify_client;        /* RequireAndVerifyClientCert */
    char priorities[96];      /* GnuTLS priority string: the versions */
    /* basic auth: none when nusers is 0 */
    web_user *users;
    size_t nusers;
    /* http_server_config.headers, added to every answer */
    const char *header_name[WEB_HEADERS_MAX];
    char *header_value[WEB_HEADERS_MAX];
    size_t nheaders;
} web_config;

/* Reads and checks FILE into *cfg (zeroed first). 0, or -1 after a message
 * naming the file and the key at fault (cli_err); *cfg is then empty.
 * Relative paths in FILE are taken from FILE's directory. */
int web_config_load(const char *path, web_config *cfg);

/* Frees *cfg, the key's bytes overwritten first. */
void web_config_free(web_config *cfg);

/* 1 if user and password match one of cfg's users, else 0 (also when
 * memory runs out). An unknown user costs one bcrypt like a wrong
 * password; the hashes are compared in constant time. Thread-safe. */
int web_config_check(const web_config *cfg, const char *user,
                     const char *password);

#endif
