/* SPDX-License-Identifier: MIT */
/*
 * mysql_hash.c -- the user-level lock names of a read hold's or permit's
 * own statements, computed by the client (mysql_int.h): SHA-224 (FIPS
 * 180-4) of the database, table and lock name (and owner), as the
 * server's SHA2(..., 224) computes them in the SQL expressions of
 * mysql_sql.c (the gate, a hold's lock). The server's SHA2 of that
 * expression costs each statement about 10 µs per name, a tenth of an
 * uncontended try (docs/design.md, "Shared holds and permits", the MySQL
 * / MariaDB paragraph); the literals are the same names (a test compares
 * them with the server's).
 */
#include "mysql_int.h"

#include "hex.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct sha224 {
    uint32_t h[8];
    uint8_t buf[64];
    size_t used;  /* bytes in buf */
    uint64_t len; /* bytes hashed */
} sha224;

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t ror(uint32_t x, unsigned n)
{
    return (x >> n) | (x << (32 - n));
}

static void block(sha224 *s, const uint8_t *p)
{
    uint32_t w[64], a[8];

    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(a, s->h, sizeof(a));
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = a[7] + (ror(a[4], 6) ^ ror(a[4], 11) ^ ror(a[4], 25)) +
                      ((a[4] & a[5]) ^ (~a[4] & a[6])) + K[i] + w[i];
        uint32_t t2 = (ror(a[0], 2) ^ ror(a[0], 13) ^ ror(a[0], 22)) +
                      ((a[0] & a[1]) ^ (a[0] & a[2]) ^ (a[1] & a[2]));
        memmove(a + 1, a, 7 * sizeof(a[0]));
        a[4] += t1;
        a[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++)
        s->h[i] += a[i];
}

static void init(sha224 *s)
{
    static const uint32_t iv[8] = {0xc1059ed8, 0x367cd507, 0x3070dd17,
                                   0xf70e5939, 0xffc00b31, 0x68581511,
                                   0x64f98fa7, 0xbefa4fa4};

    memcpy(s->h, iv, sizeof(iv));
    s->used = 0;
    s->len = 0;
}

static void update(sha224 *s, const void *data, size_t n)
{
    const uint8_t *p = data;

    s->len += n;
    while (n > 0) {
        size_t take = 64 - s->used < n ? 64 - s->used : n;
        memcpy(s->buf + s->used, p, take);
        s->used += take;
        p += take;
        n -= take;
        if (s->used == 64) {
            block(s, s->buf);
            s->used = 0;
        }
    }
}

/* The digest as 56 lowercase hex digits (SHA2()'s answer) and a NUL. */
static void final_hex(sha224 *s, char out[57])
{
    uint64_t bits = s->len * 8;
    uint8_t pad = 0x80, zero = 0, len[8], digest[28];

    update(s, &pad, 1);
    while (s->used != 56)
        update(s, &zero, 1);
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)(bits >> (56 - 8 * i));
    update(s, len, 8);
    for (int i = 0; i < 28; i++)
        digest[i] = (uint8_t)(s->h[i / 4] >> (24 - 8 * (i % 4)));
    dlock__hex(digest, sizeof(digest), out);
}

/* 'PREFIX<hex>' of SHA-224(database 0 table 0 name [0 owner]), quoted. */
static char *lock_lit(const my_store *ms, const char *prefix, const char *name,
                      size_t len, const char *owner)
{
    static const uint8_t nul = 0;
    char hex[57];
    sha224 s;

    init(&s);
    update(&s, ms->dbname, strlen(ms->dbname));
    update(&s, &nul, 1);
    update(&s, ms->table, strlen(ms->table));
    update(&s, &nul, 1);
    update(&s, name, len);
    if (owner) {
        update(&s, &nul, 1);
        update(&s, owner, strlen(owner));
    }
    final_hex(&s, hex);
    return dlock__mysql_stmt("'%s%s'", prefix, hex);
}

char *dlock__mysql_gate_lit(const my_store *ms, const char *name, size_t len)
{
    return lock_lit(ms, "dlock:", name, len, NULL);
}

char *dlock__mysql_hold_lit(const my_store *ms, const char *name, size_t len,
                            const char *owner)
{
    return lock_lit(ms, "dlock-h:", name, len, owner);
}
