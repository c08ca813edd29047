/* SPDX-License-Identifier: MIT */
/*
 * opt.c -- store URI parameters that several stores read alike (opt.h).
 */
#include "opt.h"

#include <string.h>

int dlock__opt_table(const char *store, const dlock__uri *u, const char *def,
                     size_t max, const char **table)
{
    const char *t = dlock__uri_param(u, "table");

    if (!t)
        t = def;
    if (!t[0] || strlen(t) > max)
        return dlock__err(DLOCK_EINVAL, "%s URI %s: the table name must be "
                                        "1 to %zu bytes",
                          store, u->redacted, max);
    *table = t;
    return DLOCK_OK;
}

int dlock__opt_timeout(const char *store, const dlock__uri *u, int64_t *ms)
{
    const char *t = dlock__uri_param(u, "timeout");
    long long v;

    if (!t)
        return DLOCK_OK;
    if (dlock__parse_int(t, 3600000, &v) != 0 || v == 0)
        return dlock__err(DLOCK_EINVAL, "%s URI %s: timeout must be "
                                        "milliseconds (1..3600000), not '%s'",
                          store, u->redacted, t);
    *ms = v;
    return DLOCK_OK;
}
