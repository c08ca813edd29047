/* SPDX-License-Identifier: MIT */
/*
 * buf.h -- a growable buffer of bytes, kept NUL-terminated (buf.c): the
 * metrics' text (the core), the etcd store's HTTP bodies, answers and
 * WebSocket stream, the MySQL store's statements, and Redis pipelines.
 *
 * A zeroed dlock__buf (DLOCK__BUF_INIT) is empty, holds no memory and may
 * grow without bound; `max` bounds it. It grows from 4096 bytes, doubling.
 * An append that fails (no memory, or past `max`) leaves the bytes as they
 * were and marks the buffer failed: every later append then fails too,
 * so a writer may append a whole text and look once, at its end, whether
 * it is complete.
 */
#ifndef DLOCK_COMMON_BUF_H
#define DLOCK_COMMON_BUF_H

#include <stddef.h>

typedef struct dlock__buf {
    char *p;    /* the bytes and a NUL; NULL before the first append */
    size_t len; /* bytes in p, the NUL not counted */
    size_t cap; /* bytes allocated at p */
    size_t max; /* 0, or the most bytes p may take (the NUL counted) */
    int failed; /* an append failed: the buffer is incomplete */
} dlock__buf;

#define DLOCK__BUF_INIT {NULL, 0, 0, 0, 0}

/* Appends p[0..n): 0, or -1 (the buffer failed, now or before). */
int dlock__buf_add(dlock__buf *b, const void *p, size_t n);

/* Appends the string s: 0, or -1. */
int dlock__buf_str(dlock__buf *b, const char *s);

/* Appends what printf() would write: 0, or -1. */
int dlock__buf_printf(dlock__buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Takes the first n bytes (at most len) off the front. */
void dlock__buf_drop(dlock__buf *b, size_t n);

/* Empties the buffer, and clears its failure; its memory is kept. */
void dlock__buf_reset(dlock__buf *b);

/* Frees the buffer's memory: empty again, not failed (max kept). */
void dlock__buf_free(dlock__buf *b);

#endif /* DLOCK_COMMON_BUF_H */
