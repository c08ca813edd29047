/* SPDX-License-Identifier: MIT */
/*
 * fuzz.h -- what the libFuzzer targets in fuzz/ share.
 *
 * Reaching static functions: a target that fuzzes a backend's parsers
 * #includes that backend's .c file (nothing in src/ is made non-static for
 * the fuzzers). The library archive still holds its own copy of the
 * backend, but the linker never pulls that member in: every symbol it
 * defines is already defined by the target.
 *
 * Inputs: most targets read several fields from one input, separated by
 * NUL bytes (lock names, URIs and stored strings never contain NUL). Each
 * field is copied into a buffer of its exact size, so that AddressSanitizer
 * sees any read past its end.
 *
 * A failed invariant calls fz_fail(), which aborts: libFuzzer reports it as
 * a crash and saves the input.
 */
#ifndef DLOCK_FUZZ_H
#define DLOCK_FUZZ_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fz {
    const uint8_t *p;
    size_t n;
} fz;

/* A growing NUL-terminated buffer for the targets that build inputs
 * (fuzz_uri, fuzz_redact): fz_put() appends n bytes, aborting when memory
 * runs out (a fuzzer's finding, not a case to handle). */
typedef struct fz_buf {
    char *p;
    size_t n, cap;
} fz_buf;

static inline void fz_put(fz_buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        if (!b->p)
            abort();
    }
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static inline fz fz_init(const uint8_t *data, size_t size)
{
    fz f = {data, size};
    return f;
}

/* A copy of n bytes in a buffer of exactly n bytes (+1 for a NUL). */
static inline char *fz_dup(const void *p, size_t n)
{
    char *s = malloc(n + 1);
    if (!s)
        abort();
    if (n)
        memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

/* The next field (up to a NUL or the end of the input) as a fresh
 * NUL-terminated string of exactly its size; *len its length. NULL when
 * the input is used up, "". Free with free(). */
static inline char *fz_field(fz *f, size_t *len)
{
    if (f->p == NULL) {
        if (len)
            *len = 0;
        return fz_dup("", 0);
    }
    const uint8_t *z = memchr(f->p, 0, f->n);
    size_t l = z ? (size_t)(z - f->p) : f->n;
    char *s = malloc(l + 1);
    if (!s)
        abort();
    if (l)
        memcpy(s, f->p, l);
    s[l] = '\0';
    if (len)
        *len = l;
    if (z) {
        f->p = z + 1;
        f->n -= l + 1;
    } else {
        f->p = NULL; /* used up */
        f->n = 0;
    }
    return s;
}

/* One byte of the input (0 when it is used up). */
static inline unsigned fz_byte(fz *f)
{
    if (!f->p || f->n == 0)
        return 0;
    unsigned b = f->p[0];
    f->p++;
    f->n--;
    return b;
}

/* The rest of the input, raw. */
static inline const uint8_t *fz_rest(fz *f, size_t *len)
{
    *len = f->p ? f->n : 0;
    return f->p ? f->p : (const uint8_t *)"";
}

__attribute__((noreturn, format(printf, 1, 2))) static inline void
fz_fail(const char *fmt, ...)
{
    va_list ap;

    fputs("fuzz invariant failed: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

#endif
