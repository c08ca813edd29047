/* SPDX-License-Identifier: MIT */
/*
 * opt.h -- store URI parameters that several stores read alike (opt.c):
 * ?table= (the SQL stores) and ?timeout=. A message names the store as
 * the store's own do ("mysql URI <the URI, redacted>: ...").
 */
#ifndef DLOCK_COMMON_OPT_H
#define DLOCK_COMMON_OPT_H

#include "store.h"

#include <stddef.h>
#include <stdint.h>

/* ?table=: the name of the store's table, 1 to max bytes, into *table
 * (`def` when the URI has none). DLOCK_OK, or DLOCK_EINVAL. */
int dlock__opt_table(const char *store, const dlock__uri *u, const char *def,
                     size_t max, const char **table);

/* ?timeout=: the store's bound on one operation, in milliseconds
 * (1..3600000), into *ms (left as it is when the URI has none).
 * DLOCK_OK, or DLOCK_EINVAL naming the value. */
int dlock__opt_timeout(const char *store, const dlock__uri *u, int64_t *ms);

#endif /* DLOCK_COMMON_OPT_H */
