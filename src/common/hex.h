/* SPDX-License-Identifier: MIT */
/*
 * hex.h -- hex digits, both ways (hex.c): the stores write names and
 * cursors as lowercase hex, and read back their %XX escapes and their
 * cursors; the core reads the %XX escapes of a store URI.
 */
#ifndef DLOCK_COMMON_HEX_H
#define DLOCK_COMMON_HEX_H

#include <stddef.h>

/* Writes the 2n lowercase hex digits of in[0..n) and a NUL to out
 * (2n + 1 bytes). */
void dlock__hex(const void *in, size_t n, char *out);

/* The value of hex digit c (0-9, a-f or A-F), or -1. */
int dlock__hexval(int c);

/* The n bytes whose lowercase hex digits (as dlock__hex() writes them)
 * are hex[0..2n), into out (n bytes): 0, or -1 at a character that is
 * not one (out then holds what came before it). */
int dlock__unhex(const char *hex, size_t n, void *out);

#endif /* DLOCK_COMMON_HEX_H */
