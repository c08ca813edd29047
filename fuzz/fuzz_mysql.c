/* SPDX-License-Identifier: MIT */
/*
 * fuzz_mysql.c -- how the MySQL/MariaDB store (src/stores/mysql/mysql*.c)
 * writes table names and lock names into SQL.
 *
 * Input: field 1 a table name (?table=, 1 to 48 bytes); field 2 a lock
 * name. Checks: the quoted identifiers, in buffers of the sizes my_open
 * uses, unquote to exactly the table name and its suffix (backquotes
 * doubled, never truncated); a lock name becomes X'<hex>' of exactly its
 * bytes (no quote of the name ever reaches the SQL text).
 */
#include "fuzz.h"

#include "../src/stores/mysql/mysql.c"
#include "../src/stores/mysql/mysql_conn.c"
#include "../src/stores/mysql/mysql_sql.c"
#include "../src/stores/mysql/mysql_wait.c"

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
    free(table);
    free(name);
    return 0;
}
