/* SPDX-License-Identifier: MIT */
/*
 * cursor.c -- list cursors and prefix ranges over names as bytes
 * (cursor.h).
 */
#include "cursor.h"

#include "hex.h"

#include <string.h>

int dlock__cursor_decode(const char *cur, size_t max, void *out, size_t *n)
{
    size_t len = strlen(cur);

    *n = 0;
    if (len % 2 || len / 2 > max || dlock__unhex(cur, len / 2, out) != 0)
        return -1;
    *n = len / 2;
    return 0;
}

size_t dlock__prefix_upper(const char *prefix, size_t n, void *out)
{
    unsigned char *o = out;

    while (n > 0 && (unsigned char)prefix[n - 1] == 0xff)
        n--;
    if (n == 0)
        return 0;
    memcpy(o, prefix, n);
    o[n - 1]++;
    return n;
}
