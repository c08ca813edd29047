/* SPDX-License-Identifier: MIT */
/*
 * hex.c -- hex digits, both ways (hex.h).
 */
#include "hex.h"

static const char digits[] = "0123456789abcdef";

void dlock__hex(const void *in, size_t n, char *out)
{
    const unsigned char *b = in;

    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = '\0';
}

int dlock__hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* The value of lowercase hex digit c, or -1. */
static int lower_val(char c)
{
    return c >= 'A' && c <= 'F' ? -1 : dlock__hexval(c);
}

int dlock__unhex(const char *hex, size_t n, void *out)
{
    unsigned char *o = out;

    for (size_t i = 0; i < n; i++) {
        int hi = lower_val(hex[2 * i]), lo = lower_val(hex[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        o[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}
