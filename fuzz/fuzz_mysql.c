/* SPDX-License-Identifier: MIT */
/*
 * fuzz_mysql.c -- how the MySQL/MariaDB store (src/stores/mysql/mysql*.c)
 * writes table names and lock names into SQL.
 *
 * And what its dlock_list() and dlock_break() (mysql_operate.c, with
 * src/common/cursor.c) read: a cursor, a prefix's range, a kill list.
 *
 * Input: field 1 a table name (?table=, 1 to 48 bytes); field 2 a lock
 * name; field 3 a cursor; field 4 a prefix; field 5 a kill list (as
 * GROUP_CONCAT() of session ids would give it). Checks: the quoted
 * identifiers, in buffers of the sizes my_open uses, unquote to exactly
 * the table name and its suffix (backquotes doubled, never truncated); a
 * lock name becomes X'<hex>' of exactly its bytes (no quote of the name
 * ever reaches the SQL text); a cursor is refused, or decodes to bytes
 * whose lowercase hex it is (every string of lowercase hex digits of
 * even length within the name column's width is accepted); the range
 * [prefix, upper) holds exactly the names that start with the prefix in
 * the server's VARBINARY order; a kill list gives at most its bound of
 * distinct positive ids, each one written in the list.
 */
#include "fuzz.h"

#include "../src/stores/mysql/mysql.c"
#include "../src/stores/mysql/mysql_conn.c"
#include "../src/stores/mysql/mysql_sql.c"
#include "../src/stores/mysql/mysql_try.c"
#include "../src/stores/mysql/mysql_wait.c"
#include "../src/stores/mysql/mysql_operate.c"

/* The server's order of two VARBINARY values. */
static int bin_cmp(const unsigned char *a, size_t an, const unsigned char *b,
                   size_t bn)
{
    int c = memcmp(a, b, an < bn ? an : bn);

    if (c)
        return c;
    return an < bn ? -1 : an > bn;
}

static void check_operate(const char *name, size_t len, const char *cur,
                          size_t cl, const char *prefix, size_t pl,
                          const char *kills)
{
    unsigned char *out = malloc(DLOCK_NAME_MAX), *up = malloc(pl + 1);
    unsigned long long ids[8];
    size_t n = 0;

    if (!out || !up)
        abort();
    int is_hex = cl % 2 == 0 && cl / 2 <= DLOCK_NAME_MAX &&
                 strspn(cur, "0123456789abcdef") == cl;
    int rc = dlock__cursor_decode(cur, DLOCK_NAME_MAX, out, &n);
    if (is_hex != (rc == 0))
        fz_fail("cursor %s %s", cur, is_hex ? "refused" : "accepted");
    if (rc == 0) {
        char *back = malloc(2 * n + 1);
        if (!back)
            abort();
        dlock__hex(out, n, back);
        if (strcmp(back, cur) != 0)
            fz_fail("a cursor does not decode to its bytes: %s", cur);
        free(back);
    }
    if (pl <= DLOCK_NAME_MAX) {
        size_t ul = dlock__prefix_upper(prefix, pl, up);
        const unsigned char *nm = (const unsigned char *)name;
        int starts = len >= pl && memcmp(name, prefix, pl) == 0;
        int in = bin_cmp(nm, len, (const unsigned char *)prefix, pl) >= 0 &&
                 (ul == 0 || bin_cmp(nm, len, up, ul) < 0);
        if (starts != in)
            fz_fail("the range of a prefix (%zu bytes) %s a name (%zu "
                    "bytes)",
                    pl, in ? "holds a non-matching" : "misses a matching",
                    len);
    }
    size_t k = kill_ids(kills, ids, 8);
    if (k > 8)
        fz_fail("more kill ids than asked");
    for (size_t i = 0; i < k; i++) {
        char num[32];
        if (ids[i] == 0)
            fz_fail("a kill id 0");
        for (size_t j = 0; j < i; j++)
            if (ids[i] == ids[j])
                fz_fail("a kill id twice");
        snprintf(num, sizeof(num), "%llu", ids[i]);
        if (!strstr(kills, num))
            fz_fail("a kill id not in the list: %s", num);
    }
    free(out);
    free(up);
}

static void check_quoted(const char *q, const char *in, const char *sfx)
{
    size_t n = strlen(q), il = strlen(in), o = 0;
    char *want = malloc(il + strlen(sfx) + 1);

    memcpy(want, in, il);
    strcpy(want + il, sfx);
    if (n < 2 || q[0] != '`' || q[n - 1] != '`')
        fz_fail("not quoted: %s", q);
    for (size_t i = 1; i + 1 < n; i++) {
        if (q[i] == '`') {
            if (q[i + 1] != '`' || i + 2 >= n)
                fz_fail("a lone backquote inside: %s", q);
            i++;
        }
        if (want[o++] != q[i])
            fz_fail("quoted text differs: %s", q);
    }
    if (want[o] != '\0')
        fz_fail("quoted text truncated: %s", q);
    free(want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = fz_init(data, size);
    size_t tl, len;
    char *table = fz_field(&f, &tl);
    char *name = fz_field(&f, &len);

    if (tl >= 1 && tl <= MY_TABLE_MAX) {
        my_store *ms = calloc(1, sizeof(*ms));
        dlock__mysql_quote_ident(table, "", ms->t, sizeof(ms->t));
        dlock__mysql_quote_ident(table, "_queue", ms->q, sizeof(ms->q));
        check_quoted(ms->t, table, "");
        check_quoted(ms->q, table, "_queue");
        free(ms);
    }
    char *h = dlock__mysql_hexlit(name, len);
    if (!h || strlen(h) != 2 * len + 3 || strncmp(h, "X'", 2) != 0 ||
        h[2 * len + 2] != '\'' ||
        strspn(h + 2, "0123456789abcdef") != 2 * len)
        fz_fail("hex literal of a lock name");
    for (size_t i = 0; i < len; i++) {
        unsigned v;
        char two[3] = {h[2 + 2 * i], h[3 + 2 * i], 0};
        sscanf(two, "%x", &v);
        if (v != (unsigned char)name[i])
            fz_fail("hex literal does not decode to the name");
    }
    free(h);
    size_t cl, pl;
    char *cur = fz_field(&f, &cl);
    char *prefix = fz_field(&f, &pl);
    char *kills = fz_field(&f, NULL);
    check_operate(name, len, cur, cl, prefix, pl, kills);
    free(cur);
    free(prefix);
    free(kills);
    free(table);
    free(name);
    return 0;
}
