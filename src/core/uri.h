/* SPDX-License-Identifier: MIT */
/*
 * uri.h -- store URIs: scheme://[user[:password]@]hosts[/path][?k=v&...]
 * (the core's side: the parsed form and what stores may ask of it are in
 * store.h)
 *
 * One parser for every store, so that every store rejects the same mistakes
 * with the same words. Percent-escapes are decoded in user, password, path
 * and query values. The password is wiped from memory when freed, and never
 * appears in `redacted` or in an error message.
 */
#ifndef DLOCK_URI_H
#define DLOCK_URI_H

#include "store.h"

#include <stddef.h>

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

#endif /* DLOCK_URI_H */
