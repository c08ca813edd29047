/* SPDX-License-Identifier: MIT */
/*
 * fuzz_etcd.c -- what the etcd store (src/stores/etcd/: etcd.c,
 * etcd_conn.c, etcd_wait.c) does with URIs, lock names and the JSON
 * gateway's answers (cJSON trees).
 *
 * Input: field 1 a store URI (etcd:// or etcds://: parse_config, options
 * prefix, timeout, cacert, cert, key); field 2 a lock name; field 3 a JSON
 * answer; the rest a watch stream (WebSocket frames of watch answers).
 * Checks: the lock's key range is PREFIX/ + the name with '/' and '%'
 * escaped + '/': no '/' inside the escaped name, and it unescapes to the
 * name (one range per name, no range inside another); base64 of the key
 * decodes back to it; the JSON answer read as inspect's range answer, as
 * the key descriptions and int64 fields, whatever its types and numbers
 * (no UB); the watch stream's frames parsed, never past its buffer.
 * dlock_list() and dlock_break() (etcd_operate.c): field 2 read as a
 * cursor too (accepted only as the base64 of an escaped name); each key
 * of the JSON answer read as a listed key (a lock's escaped name maps
 * back to exactly that key range); the answer applied as the check of
 * two held keys, and its watch events as deletions of them (a hold is
 * told lost only for a deletion of its own key after its creation:
 * etcd_keys.c).
 */
#include "fuzz.h"

#include "../src/stores/etcd/etcd.c"
#include "../src/stores/etcd/etcd_conn.c"
#include "../src/stores/etcd/etcd_lease.c"
#include "../src/stores/etcd/etcd_wait.c"
#include "../src/stores/etcd/etcd_operate.c"
#include "../src/stores/etcd/etcd_keys.c"

#include "uri.h" /* the core's parser: the fuzz target parses URIs */

static void free_config(etcd_store *es)
{
    for (size_t i = 0; i < es->nep; i++)
        free(es->ep[i]);
    free(es->ep);
    free(es->cacert);
    free(es->cert);
    free(es->key);
    free(es->user);
    free(es->password);
    memset(es, 0, sizeof(*es));
}

static int hexdig(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static void check_base(const etcd_store *es, const char *name, size_t len,
                       const char *base, size_t bl)
{
    size_t pl = es->prefix_len, o = 0;

    if (bl + 1 > ETCD_KEY_MAX || bl < pl + 1 ||
        memcmp(base, es->prefix, pl) != 0 || base[bl - 1] != '/')
        fz_fail("lock range layout");
    for (size_t i = pl; i < bl - 1; i++) {
        unsigned char ch = (unsigned char)base[i];
        if (ch == '/')
            fz_fail("'/' inside an escaped lock name");
        if (ch == '%') {
            if (i + 2 >= bl - 1 || hexdig(base[i + 1]) < 0 ||
                hexdig(base[i + 2]) < 0)
                fz_fail("bad escape");
            ch = (unsigned char)(hexdig(base[i + 1]) * 16 + hexdig(base[i + 2]));
            if (ch != '/' && ch != '%')
                fz_fail("escaped a byte that needs none");
            i += 2;
        }
        if (o >= len || (unsigned char)name[o] != ch)
            fz_fail("the range does not unescape to the name");
        o++;
    }
    if (o != len)
        fz_fail("the range unescapes to a shorter name");
}

static void check_b64(const char *s, size_t n)
{
    char *enc = malloc(4 * ((n + 2) / 3) + 1);
    char *dec = malloc(n + 1);
    size_t el = dlock__etcd_b64_encode(s, n, enc);
    if (el != 4 * ((n + 2) / 3))
        fz_fail("base64 length");
    long dl = dlock__etcd_b64_decode(enc, dec, n + 1);
    if (dl != (long)n || memcmp(dec, s, n) != 0)
        fz_fail("base64 does not decode back");
    free(enc);
    free(dec);
}

static void read_json(const char *text, size_t n)
{
    cJSON *j = cJSON_ParseWithLength(text, n);
    dlock_info info;
    int64_t lease;

    if (!j)
        return;
    memset(&info, 0, sizeof(info));
    int rc = inspect_answer(j, &info, &lease);
    if (rc != DLOCK_OK)
        fz_fail("inspect_answer returned %d", rc);
    if (strnlen(info.holder, sizeof(info.holder)) >= sizeof(info.holder) ||
        info.waiters < -1)
        fz_fail("inspect answer out of range");
    /* shared holds and semaphores: the holders are keys of the answer */
    int nk = cJSON_GetArraySize(jget(j, "kvs"));
    if (info.holders < 0 || info.holders > (nk > 0 ? nk : 0) ||
        (info.held && info.holders < 1) || (!info.held && info.holders) ||
        info.permits < 0 || (size_t)info.holders + info.queue_len >
                                (size_t)(nk > 0 ? nk : 0))
        fz_fail("inspect answer's holders out of range");
    dlock_info_clear(&info);
    /* the fields other answers read: any JSON type, any number */
    static const char *const names[] = {"count", "create_revision", "lease",
                                        "TTL", "ID", "revision", "code"};
    const cJSON *objs[] = {j, jget(j, "header"), jget(j, "result"),
                           kvs_at(j, 0), kvs_at(txn_resp(j, 1, "response_range"), 0)};
    for (size_t o = 0; o < sizeof(objs) / sizeof(objs[0]); o++)
        for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++)
            (void)jint(objs[o], names[k]);
    char d[256];
    describe(kvs_at(j, 0), d, sizeof(d));
    describe(j, d, 8);
    cJSON_Delete(j);
}


static void check_operate(const etcd_store *conf, const char *cursor,
                          const cJSON *j)
{
    char *comp = malloc(ETCD_KEY_MAX + 8), *name = malloc(DLOCK_NAME_MAX + 1);
    char *key = malloc(ETCD_KEY_MAX + 8), *base = malloc(ETCD_KEY_MAX);

    /* a cursor: base64 of an escaped name ('/' and '%' only as escapes) */
    long n = cursor_comp(cursor, comp, ETCD_KEY_MAX + 8);
    if (n >= 0) {
        if (n == 0 || n > 3 * DLOCK_NAME_MAX || memchr(comp, '/', (size_t)n))
            fz_fail("cursor_comp accepted a bad name");
        for (long i = 0; i < n; i++)
            if (comp[i] == '%' &&
                (i + 2 >= n || comp[i + 1] != '2' ||
                 (comp[i + 2] != 'F' && comp[i + 2] != '5')))
                fz_fail("cursor_comp accepted a bad escape");
    }
    /* the keys of a listing: a lock's key maps back to its range */
    const cJSON *kv;
    cJSON_ArrayForEach(kv, jget(j, "kvs"))
    {
        const char *kb = jstr(kv, "key");
        long kl = kb ? dlock__etcd_b64_decode(kb, key, ETCD_KEY_MAX + 8) : -1;
        size_t cl = 0;
        if (kl <= 0 || (size_t)kl >= ETCD_KEY_MAX + 7)
            continue;
        const char *c = lock_of_key(conf, key, (size_t)kl, &cl, name);
        if (!c)
            continue;
        size_t nl = strlen(name);
        if (nl == 0 || nl > DLOCK_NAME_MAX || cl == 0 ||
            c != key + conf->prefix_len || c + cl >= key + kl ||
            c[cl] != '/')
            fz_fail("lock_of_key out of its key");
        size_t bl = dlock__etcd_lock_base(conf, name, nl, base);
        if (bl != conf->prefix_len + cl + 1 || memcmp(base, key, bl) != 0)
            fz_fail("a listed lock's name is not its key range");
    }
    /* two held keys: the answer as their check, its events as deletions */
    etcd_store es;
    etcd_hold *h = calloc(2, sizeof(*h));
    memset(&es, 0, sizeof(es));
    memcpy(es.prefix, conf->prefix, conf->prefix_len);
    es.prefix_len = conf->prefix_len;
    for (int i = 0; i < 2; i++) {
        h[i].key_len = (size_t)snprintf(h[i].key, sizeof(h[i].key),
                                        "%sx/%d", es.prefix, i);
        h[i].mid = (uint64_t)i + 1;
        h[i].linked = h[i].held = 1;
        h[i].mrev = i ? 0 : 5;
        h[i].mnext = i ? NULL : &h[1];
    }
    es.mine = &h[0];
    es.sgen = 3;
    uint64_t mids[2] = {1, 2};
    int64_t revs[2] = {5, 0};
    check_answer(&es, j, mids, revs, 2, 3);
    for (int i = 0; i < 2; i++)
        if (h[i].gone ? !h[i].tell : (h[i].tell || (h[i].mgen != 0 &&
                                                      h[i].mgen != 3)))
            fz_fail("check_answer left a hold half done");
    for (int i = 0; i < 2; i++)
        h[i].gone = h[i].tell = 0;
    const cJSON *ev;
    cJSON_ArrayForEach(ev, jget(jget(j, "result"), "events"))
    {
        const char *kb = jstr(jget(ev, "kv"), "key");
        int64_t rev = jint(jget(ev, "kv"), "mod_revision");
        int64_t del1 = h[1].mdel;
        if (!kb)
            continue;
        int gone0 = h[0].gone;
        int tell = dlock__etcd_mine_deleted(&es, kb, rev);
        long kl = dlock__etcd_b64_decode(kb, key, ETCD_KEY_MAX + 8);
        int is0 = kl == (long)h[0].key_len &&
                  !memcmp(key, h[0].key, h[0].key_len);
        int is1 = kl == (long)h[1].key_len &&
                  !memcmp(key, h[1].key, h[1].key_len);
        if (h[0].gone != gone0 && !(is0 && rev > h[0].mrev))
            fz_fail("a hold told lost for another key's deletion");
        if (tell && !(h[0].gone && h[0].tell))
            fz_fail("told without a hold gone");
        if (h[1].gone || (h[1].mdel != del1 && !(is1 && rev > del1)))
            fz_fail("a deletion before the put's revision was known");
    }
    free(h);
    free(comp);
    free(name);
    free(key);
    free(base);
}

static void read_operate(const etcd_store *conf, const char *cursor,
                         const char *text, size_t n)
{
    cJSON *j = cJSON_ParseWithLength(text, n);

    if (j)
        check_operate(conf, cursor, j);
    cJSON_Delete(j);
}

static int fuzz_msg(void *arg, const char *p, size_t n)
{
    int64_t created = 0;
    (void)arg;
    return stream_msg(NULL, p, n, &created);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = fz_init(data, size);
    size_t len, jl;
    char *uri = fz_field(&f, NULL);
    char *name = fz_field(&f, &len);
    char *json = fz_field(&f, &jl);
    etcd_store es;
    dlock__uri u;

    memset(&es, 0, sizeof(es));
    if (dlock__uri_parse(uri, &u) == DLOCK_OK) {
        es.redacted = u.redacted;
        if (dlock__etcd_parse_config(&es, &u) != DLOCK_OK)
            free_config(&es);
        else if (es.prefix_len > ETCD_PREFIX_MAX + 1)
            fz_fail("prefix longer than its maximum");
        dlock__uri_free(&u);
        es.redacted = NULL;
    }
    if (!es.nep) {
        memcpy(es.prefix, "dlock/", 7);
        es.prefix_len = 6;
    }

    char *base = malloc(ETCD_KEY_MAX);
    size_t bl = 0;
    if (len >= 1 && len <= DLOCK_NAME_MAX) {
        bl = dlock__etcd_lock_base(&es, name, len, base);
        check_base(&es, name, len, base, bl);
        check_b64(base, bl);
        char *eb = malloc(ETCD_B64_MAX);
        dlock__etcd_range_end_b64(base, bl, eb);
        free(eb);
    } else {
        bl = (size_t)snprintf(base, ETCD_KEY_MAX, "%sx/", es.prefix);
    }
    check_b64(name, len);
    read_json(json, jl);
    read_operate(&es, name, json, jl);
    char *dec = malloc(jl + 1);
    (void)dlock__etcd_b64_decode(json, dec, jl + 1);
    free(dec);

    /* the watch stream: WebSocket frames carrying watch answers */
    size_t wl;
    const uint8_t *w = fz_rest(&f, &wl);
    dlock__buf in = ETCD_BUF_INIT, msg = ETCD_BUF_INIT;
    if (dlock__buf_add(&in, w, wl) == 0) {
        (void)ws_frames(&in, &msg, fuzz_msg, NULL, NULL);
        if (in.len > wl)
            fz_fail("frame parser grew its input");
    }
    dlock__buf_free(&in);
    dlock__buf_free(&msg);
    free(base);
    free_config(&es);
    free(uri);
    free(name);
    free(json);
    return 0;
}
