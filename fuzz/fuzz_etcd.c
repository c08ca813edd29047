/* SPDX-License-Identifier: MIT */
/*
 * fuzz_etcd.c -- what the etcd store (src/stores/etcd/: etcd.c,
 * etcd_gateway.c, etcd_watch.c) does with URIs, lock names and the JSON
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
 */
#include "fuzz.h"

#include "../src/stores/etcd/etcd.c"
#include "../src/stores/etcd/etcd_gateway.c"
#include "../src/stores/etcd/etcd_lease.c"
#include "../src/stores/etcd/etcd_watch.c"
#include "../src/stores/etcd/etcd_operate.c"

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
    char *dec = malloc(jl + 1);
    (void)dlock__etcd_b64_decode(json, dec, jl + 1);
    free(dec);

    /* the watch stream: WebSocket frames carrying watch answers */
    size_t wl;
    const uint8_t *w = fz_rest(&f, &wl);
    buf in = {NULL, 0, 0}, msg = {NULL, 0, 0};
    if (dlock__etcd_buf_add(&in, (const char *)w, wl) == 0) {
        (void)ws_frames(&in, &msg, fuzz_msg, NULL, NULL);
        if (in.n > wl)
            fz_fail("frame parser grew its input");
    }
    free(in.p);
    free(msg.p);
    free(base);
    free_config(&es);
    free(uri);
    free(name);
    free(json);
    return 0;
}
