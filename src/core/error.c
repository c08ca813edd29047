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

#define DLOCK_ERROR_MAP(X)                                                  \
    X(DLOCK_OK, "DLOCK_OK", "success")                                      \
    X(DLOCK_EBUSY, "DLOCK_EBUSY", "held by another owner for the whole wait") \
    X(DLOCK_ELOST, "DLOCK_ELOST", "the hold expired or was taken over")     \
    X(DLOCK_ENOTHELD, "DLOCK_ENOTHELD", "not held by this owner")           \
    X(DLOCK_EINVAL, "DLOCK_EINVAL", "invalid argument")                     \
    X(DLOCK_ECONN, "DLOCK_ECONN", "store unreachable or connection lost")   \
    X(DLOCK_EAUTH, "DLOCK_EAUTH", "the store refused the credentials")      \
    X(DLOCK_EPROTO, "DLOCK_EPROTO", "unexpected answer from the store")     \
    X(DLOCK_ENOMEM, "DLOCK_ENOMEM", "out of memory")                        \
    X(DLOCK_ENOTSUP, "DLOCK_ENOTSUP", "not supported by this store or build") \
    X(DLOCK_EDEADLK, "DLOCK_EDEADLK", "would wait for the caller's own hold") \
    X(DLOCK_ECANCELED, "DLOCK_ECANCELED", "the wait was cancelled")

const char *dlock_strerror(int rc)
{
    switch (rc) {
#define X(code, name, text)                                                 \
    case code:                                                              \
        return text;
        DLOCK_ERROR_MAP(X)
#undef X
    default:
        return "unknown error code";
    }
}

const char *dlock_errname(int rc)
{
    switch (rc) {
#define X(code, name, text)                                                 \
    case code:                                                              \
        return name;
        DLOCK_ERROR_MAP(X)
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
