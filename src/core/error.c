/* SPDX-License-Identifier: MIT */
/*
 * error.c -- return codes, their words, and the per-thread last message.
 *
 * The message lives in thread-local storage with no heap, so that even an
 * out-of-memory failure can be described. Only the failing call writes it.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

#define ERRMSG_MAX 512

static _Thread_local char errmsg[ERRMSG_MAX];

/* Both made from the header's list, DLOCK_ERRNO_MAP: a code added there is
 * described here with nothing more to write. */
const char *dlock_strerror(int rc)
{
    switch (rc) {
#define X(name, value, text)                                                \
    case DLOCK_##name:                                                      \
        return text;
        DLOCK_ERRNO_MAP(X)
#undef X
    default:
        return "unknown error code";
    }
}

const char *dlock_errname(int rc)
{
    switch (rc) {
#define X(name, value, text)                                                \
    case DLOCK_##name:                                                      \
        return "DLOCK_" #name;
        DLOCK_ERRNO_MAP(X)
#undef X
    default:
        return "DLOCK_E?";
    }
}

const char *dlock_errmsg(void)
{
    return errmsg;
}

int dlock__err(int code, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(errmsg, sizeof(errmsg), fmt, ap);
    va_end(ap);
    return code;
}

void dlock__err_clear(void)
{
    errmsg[0] = '\0';
}

const char *dlock_version(void)
{
    return DLOCK_VERSION_STRING;
}
