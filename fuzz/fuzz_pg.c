/* SPDX-License-Identifier: MIT */
/*
 * fuzz_pg.c -- what the PostgreSQL store (src/stores/pg/pg*.c) does with
 * URIs, table names, lock names and NOTIFY payloads.
 *
 * Input: field 1 a store URI (postgres:// or postgresql://: libpq's
 * keywords built from hosts, ports, user, database and options); field 2
 * a table name (?table=); field 3 a lock name; the remaining fields NOTIFY
 * payloads as the client's listener receives them ("g WAITER TOKEN"),
 * each also read as a release's grants ("CLIENT:WAITER:TOKEN ...", from
 * T_unlock) and as an advisory session's application_name ("dlock TOKEN
 * [sN ]DESC", read by dlock_inspect()), and as a dlock_list() cursor
 * ("pg:HEX", table mode).
 * Checks: every quoted identifier and literal, in buffers of the sizes
 * dlock__pg_open uses, unquotes to exactly the table name and its suffix (no
 * truncation, one identifier whatever the quotes in the name); payloads
 * of any bytes are read without reading past them, handing locks only to
 * this test client's (absent) waiters; a grants list is read to its end
 * whatever its bytes; an application_name gives a description that fits
 * the holder field and a permit count within the mode's cap; a cursor is
 * read within its bounds and, when taken, stands for the name it was
 * made from (made again, it is the same text); the lock name (as a
 * listing's prefix) gives a range [prefix, end) holding exactly the names
 * that start with it, within its buffer.
 */
#include "fuzz.h"

#include "../src/stores/pg/pg.c"
#include "../src/stores/pg/pg_table.c"
#include "../src/stores/pg/pg_advisory.c"
#include "../src/stores/pg/pg_advisory_rw.c"
#include "../src/stores/pg/pg_hold.c"
#include "../src/stores/pg/pg_conn.c"
#include "../src/stores/pg/pg_sql.c"
#include "../src/stores/pg/pg_schema.c"

#include "uri.h" /* the core's parser: the fuzz target parses URIs */

static dlock_client *client;

static void setup(void)
{
    static char dir[] = "/tmp/dlock-fuzz-pg-XXXXXX";
    char uri[64];

    if (client)
        return;
    if (!mkdtemp(dir))
        abort();
    snprintf(uri, sizeof(uri), "file://%s", dir);
    if (dlock_client_open(&client, uri, NULL) != DLOCK_OK)
        abort();
}

/* `q` must be open + (in with every `open` doubled) + close. */
static void check_quoted(const char *q, char quote, const char *in,
                         const char *sfx)
{
    size_t n = strlen(q), il = strlen(in), o = 0;
    char *want = malloc(il + strlen(sfx) + 1);

    memcpy(want, in, il);
    strcpy(want + il, sfx);
    if (n < 2 || q[0] != quote || q[n - 1] != quote)
        fz_fail("not quoted: %s", q);
    for (size_t i = 1; i + 1 < n; i++) {
        if (q[i] == quote) {
            if (q[i + 1] != quote || i + 2 >= n)
                fz_fail("a lone quote inside: %s", q);
            i++;
        }
        if (want[o] != q[i])
            fz_fail("quoted text differs (truncated?): %s", q);
        o++;
    }
    if (want[o] != '\0')
        fz_fail("quoted text truncated: %s", q);
    free(want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = fz_init(data, size);
    size_t tl, len;
    char *uri = fz_field(&f, NULL);
    char *table = fz_field(&f, &tl);
    char *name = fz_field(&f, &len);
    pg_store *ps = calloc(1, sizeof(*ps));
    dlock__uri u;

    setup();
    ps->client = client;
    if (dlock__uri_parse(uri, &u) == DLOCK_OK) {
        ps->redacted = u.redacted;
        (void)dlock__pg_select(&u);
        (void)build_keywords(ps, &u);
        for (size_t i = 0; ps->vals[i]; i++)
            free(ps->vals[i]);
        memset(ps->vals, 0, sizeof(ps->vals));
        ps->redacted = NULL;
        dlock__uri_free(&u);
    }

    if (tl == 0 || tl > PG_TABLE_MAX) {
        free(table);
        table = fz_dup(PG_DEFAULT_TABLE, strlen(PG_DEFAULT_TABLE));
    }
    snprintf(ps->table, sizeof(ps->table), "%s", table);
    {
        /* the buffers of dlock__pg_open and ensure_schema, at their sizes */
        char *t = malloc(2 * PG_TABLE_MAX + 16);
        char *q = malloc(2 * PG_TABLE_MAX + 24);
        char *qi = malloc(2 * PG_TABLE_MAX + 32);
        char *lt = malloc(200), *lq = malloc(200);
        dlock__pg_quote_ident(table, "", t, 2 * PG_TABLE_MAX + 16);
        dlock__pg_quote_ident(table, "_waiters", q, 2 * PG_TABLE_MAX + 24);
        dlock__pg_quote_ident(table, "_waiters_name", qi, 2 * PG_TABLE_MAX + 32);
        dlock__pg_quote_ident(table, "_tokens", ps->seq_ident,
                              sizeof(ps->seq_ident));
        dlock__pg_quote_literal(ps->seq_ident, ps->seq_lit,
                                sizeof(ps->seq_lit));
        dlock__pg_quote_literal(t, lt, 200);
        dlock__pg_quote_literal(q, lq, 200);
        check_quoted(t, '"', table, "");
        check_quoted(q, '"', table, "_waiters");
        check_quoted(qi, '"', table, "_waiters_name");
        check_quoted(ps->seq_ident, '"', table, "_tokens");
        check_quoted(ps->seq_lit, '\'', ps->seq_ident, "");
        check_quoted(lt, '\'', t, "");
        check_quoted(lq, '\'', q, "");
        free(t);
        free(q);
        free(qi);
        free(lt);
        free(lq);
    }

    /* the lock name as dlock_list()'s prefix: [name, end) */
    if (len <= DLOCK_NAME_MAX) {
        char *hi = malloc(DLOCK_NAME_MAX + 1);
        size_t n = prefix_end(name, len, hi, DLOCK_NAME_MAX + 1);
        if (n == DLOCK_NAME_MAX + 1) {
            for (size_t i = 0; i < n; i++)
                if ((unsigned char)hi[i] != 0xff)
                    fz_fail("the open end is not all 0xff");
            for (size_t i = 0; i < len; i++)
                if ((unsigned char)name[i] != 0xff)
                    fz_fail("an open end for a prefix that has one");
        } else {
            if (n == 0 || n > len || memcmp(hi, name, n - 1) != 0 ||
                (unsigned char)hi[n - 1] !=
                    (unsigned char)name[n - 1] + 1)
                fz_fail("the end is not the prefix raised by one");
            for (size_t i = n; i < len; i++)
                if ((unsigned char)name[i] != 0xff)
                    fz_fail("the end drops a byte below 0xff");
        }
        free(hi);
        /* the cursor of a listed name stands for that name */
        if (len > 0) {
            char *hex = malloc(2 * len + 1), *got = malloc(CURSOR_MAX);
            size_t glen = 0;
            dlock__hex(name, len, hex);
            char *cur = cursor_make(hex);
            if (!cur || cursor_read(cur, got, &glen) != 0 || glen != len ||
                memcmp(got, name, len) != 0)
                fz_fail("a name's cursor does not stand for it");
            free(cur);
            free(hex);
            free(got);
        }
    }

    /* notifications on the client's channel: "g WAITER TOKEN" */
    snprintf(ps->chan, sizeof(ps->chan), "dlock_%s",
             dlock__client_id(client));
    while (f.p) {
        char *payload = fz_field(&f, NULL);
        PGnotify nt;
        memset(&nt, 0, sizeof(nt));
        nt.relname = ps->chan;
        nt.extra = payload;
        dispatch(ps, &nt);
        own_grants(ps, payload);
        {
            char who[256];
            unsigned long long token;
            unsigned n;
            who_of(payload, "42", &token, &n, who, sizeof(who));
            if (strlen(who) >= sizeof(who) || n > PG_ADV_PERMITS_MAX)
                fz_fail("application_name read past its bounds: %s",
                        payload);
        }
        {
            /* a cursor: taken, it is made again from its name's hex */
            char *got = malloc(CURSOR_MAX), *hex = malloc(2 * CURSOR_MAX + 1);
            size_t glen = 0;
            if (cursor_read(payload, got, &glen) == 0) {
                if (glen == 0 || glen > CURSOR_MAX)
                    fz_fail("a cursor of %zu bytes", glen);
                dlock__hex(got, glen, hex);
                char *again = cursor_make(hex);
                if (!again || strcmp(again, payload) != 0)
                    fz_fail("a cursor not made again: %s", payload);
                free(again);
            }
            free(got);
            free(hex);
        }
        free(payload);
    }
    free(ps);
    free(uri);
    free(table);
    free(name);
    return 0;
}
