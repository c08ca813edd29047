/* SPDX-License-Identifier: MIT */
/*
 * buf.c -- a growable buffer of bytes, kept NUL-terminated (buf.h).
 */
#include "buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first allocation's size: the buffers hold a text or a message. */
#define BUF_FIRST 4096

/* Room for `more` bytes and the NUL: 0, or -1 (b->failed set). */
static int room(dlock__buf *b, size_t more)
{
    size_t cap;
    char *p;

    if (b->failed)
        return -1;
    if (more > (size_t)-1 / 4 - b->len) {
        b->failed = 1;
        return -1;
    }
    if (b->len + more + 1 <= b->cap)
        return 0;
    cap = b->cap ? b->cap : BUF_FIRST;
    while (cap < b->len + more + 1)
        cap *= 2;
    if ((b->max && cap > b->max) || !(p = realloc(b->p, cap))) {
        b->failed = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

int dlock__buf_add(dlock__buf *b, const void *p, size_t n)
{
    if (room(b, n) != 0)
        return -1;
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

int dlock__buf_str(dlock__buf *b, const char *s)
{
    return dlock__buf_add(b, s, strlen(s));
}

int dlock__buf_printf(dlock__buf *b, const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        return -1;
    }
    if (room(b, (size_t)n) != 0)
        return -1;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return 0;
}

void dlock__buf_drop(dlock__buf *b, size_t n)
{
    if (n > b->len)
        n = b->len;
    if (n == 0)
        return;
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    b->p[b->len] = '\0';
}

void dlock__buf_reset(dlock__buf *b)
{
    b->len = 0;
    b->failed = 0;
    if (b->p)
        b->p[0] = '\0';
}

void dlock__buf_free(dlock__buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
}
