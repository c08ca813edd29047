/* SPDX-License-Identifier: MIT */
/*
 * fuzz_sqlite.c -- what the SQLite store's dlock_list()
 * (src/stores/sqlite/sqlite_operate.c, with src/common/cursor.c) does
 * with a cursor and a prefix.
 *
 * Input: field 1 a cursor (as a caller may pass any string back); field 2
 * a prefix; field 3 a lock name.
 * Checks: a cursor is either refused or decodes to bytes whose lowercase
 * hex is exactly the cursor (so every cursor the store makes, the hex of
 * a row's name, is accepted and means that name), and every string of
 * lowercase hex digits of even length within the bound is accepted; the
 * range [prefix, upper) the page's SELECT uses holds exactly the names
 * that start with the prefix, under SQLite's BLOB order (memcmp, then the
 * shorter first), whatever their bytes.
 */
#include "fuzz.h"

#include "../src/stores/sqlite/sqlite_operate.c"

/* SQLite's order of two BLOBs. */
static int blob_cmp(const unsigned char *a, size_t an, const unsigned char *b,
                    size_t bn)
{
    int c = memcmp(a, b, an < bn ? an : bn);

    if (c)
        return c;
    return an < bn ? -1 : an > bn;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = fz_init(data, size);
    size_t cl, pl, nl, n = 0;
    char *cur = fz_field(&f, &cl);
    char *prefix = fz_field(&f, &pl);
    char *name = fz_field(&f, &nl);
    unsigned char *out = malloc(CURSOR_MAX);
    unsigned char *up = malloc(pl ? pl : 1);

    if (!out || !up)
        abort();
    /* cursors */
    int is_hex = cl % 2 == 0 && cl / 2 <= CURSOR_MAX &&
                 strspn(cur, "0123456789abcdef") == cl;
    int rc = dlock__cursor_decode(cur, CURSOR_MAX, out, &n);
    if (is_hex && rc != 0)
        fz_fail("a cursor of hex digits refused: %s", cur);
    if (!is_hex && rc == 0)
        fz_fail("a cursor that is not hex digits accepted: %s", cur);
    if (rc == 0) {
        char *back = malloc(2 * n + 1);
        if (!back)
            abort();
        dlock__hex(out, n, back);
        if (n != cl / 2 || strcmp(back, cur) != 0)
            fz_fail("a cursor does not decode to its bytes: %s", cur);
        free(back);
    }
    /* the prefix's range */
    if (pl <= DLOCK_NAME_MAX) {
        size_t ul = dlock__prefix_upper(prefix, pl, up);
        const unsigned char *nm = (const unsigned char *)name;
        const unsigned char *pp = (const unsigned char *)prefix;
        int starts = nl >= pl && memcmp(name, prefix, pl) == 0;
        int in = blob_cmp(nm, nl, pp, pl) >= 0 &&
                 (ul == 0 || blob_cmp(nm, nl, up, ul) < 0);
        if (ul > pl)
            fz_fail("an upper bound longer than its prefix");
        if (starts != in)
            fz_fail("the range of prefix (%zu bytes) %s name (%zu bytes)",
                    pl, in ? "holds a non-matching" : "misses a matching",
                    nl);
    }
    free(out);
    free(up);
    free(cur);
    free(prefix);
    free(name);
    return 0;
}
