/* SPDX-License-Identifier: MIT */
/*
 * uri.h -- store URIs: scheme://[user[:password]@]hosts[/path][?k=v&...]
 *
 * One parser for every store, so that every store rejects the same mistakes
 * with the same words. Percent-escapes are decoded in user, password, path
 * and query values. The password is wiped from memory when freed, and never
 * appears in `redacted` or in an error message.
 */
#ifndef DLOCK_URI_H
#define DLOCK_URI_H

#include "host.h"

#include <stddef.h>

typedef struct dlock__host {
    char *host; /* name or address; IPv6 without brackets */
    int port;   /* 0 when absent */
} dlock__host;

typedef struct dlock__param {
    char *key;
    char *value;
} dlock__param;

typedef struct dlock__uri {
    char *scheme;     /* lowercase */
    char *user;       /* NULL when absent */
    char *password;   /* NULL when absent ("" when given empty) */
    dlock__host *hosts;
    size_t nhosts;    /* 0 for file:// and unix:// */
    char *path;       /* "" when absent; "/..." otherwise */
    dlock__param *params;
    size_t nparams;
    char *redacted;   /* the URI as given, password replaced by "***" */
} dlock__uri;

/* Parses `s`. DLOCK_OK, or DLOCK_EINVAL / DLOCK_ENOMEM with a message. On
 * failure *out is left empty (safe to free). */
int dlock__uri_parse(const char *s, dlock__uri *out);

/* Completes the password of a parsed URI (docs/stores.md, "Passwords"):
 * from the file named by ?password_file= (then removed from the
 * parameters; with a password in the URI too: DLOCK_EINVAL), else, when
 * the URI has none and its store takes one, from $DLOCK_PASSWORD, else
 * for the Redis schemes $REDISCLI_AUTH. DLOCK_OK, or an error with a
 * message that never holds the password. */
int dlock__uri_take_password(dlock__uri *u);

/* Frees everything in *u and wipes the password. */
void dlock__uri_free(dlock__uri *u);

/* The value of query parameter `key`, or NULL. */
DLOCK__HOST const char *dlock__uri_param(const dlock__uri *u, const char *key);

/* DLOCK_EINVAL naming the first parameter not in the NULL-terminated
 * `allowed` list. */
DLOCK__HOST int dlock__uri_check_params(const dlock__uri *u, const char *const *allowed);

/* Parses a non-negative decimal integer no larger than `max` into *out.
 * Returns 0 on success, -1 otherwise. */
DLOCK__HOST int dlock__parse_int(const char *s, long long max, long long *out);

#endif /* DLOCK_URI_H */
