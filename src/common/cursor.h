/* SPDX-License-Identifier: MIT */
/*
 * cursor.h -- list pages over names kept as bytes in a sorted index
 * (cursor.c): the SQL stores (MySQL/MariaDB, PostgreSQL, SQLite) read a
 * page as the rows after the cursor's name within the prefix's range of
 * names, and make the cursor of the next page the lowercase hex of the
 * last name read (dlock__hex(), hex.h).
 */
#ifndef DLOCK_COMMON_CURSOR_H
#define DLOCK_COMMON_CURSOR_H

#include <stddef.h>

/* A cursor as the name it stands for: "" is the start (*n 0); else the
 * 2n lowercase hex digits of n bytes (1..max), into out (max bytes). 0,
 * or -1: not such a cursor (*n 0). */
int dlock__cursor_decode(const char *cur, size_t max, void *out, size_t *n);

/* The least byte string above every name that starts with prefix[0..n)
 * (the prefix without its trailing 0xff bytes, its last byte plus one),
 * into out (n bytes): its length, or 0 when there is none (an empty
 * prefix, or one of 0xff bytes only: every name above it matches). */
size_t dlock__prefix_upper(const char *prefix, size_t n, void *out);

#endif /* DLOCK_COMMON_CURSOR_H */
