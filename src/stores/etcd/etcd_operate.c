/* SPDX-License-Identifier: MIT */
/*
 * etcd_operate.c -- the etcd store seen by an operator (etcd.c is the lock
 * protocol, etcd_int.h what the files share): inspect, list and break.
 *
 * Inspect: one range read of the lock's keys sorted by create revision
 * (the queue), and the holder's lease's time to live.
 *
 * List: range reads over the keys under the prefix (keys only, sorted by
 * key, with a limit), each lock's keys being the contiguous range
 * PREFIX/NAME/...; after a lock is seen the next read starts past its
 * keys (PREFIX/NAME0), so a page of `limit` locks is at most `limit` + 1
 * reads of at most `limit` + 1 keys, however long their queues. The
 * locks found are then described as inspect does, 32 ranges to a
 * transaction (one revision each), each distinct lease's time to live
 * read once. The cursor is the base64 of the last lock's escaped name:
 * the next page starts past its keys. A lock nobody holds or waits for
 * has no key: etcd keeps nothing of a free lock (DLOCK_LIST_FREE adds
 * nothing).
 *
 * Break: a transaction that compares every holder key's create revision
 * (as inspect found them) and deletes those keys, not the waiters'; if a
 * holder released meanwhile the compare fails and it looks again, so the
 * break takes whatever holds the lock when it is applied, never a key it
 * did not see as a holder's. Waiters watch the deletions of the keys
 * ahead of theirs on their streams: woken as by a release. Tokens are
 * create revisions: the waiters' keys were created after the holders'
 * (which head the queue by create revision), and every key put later has
 * a greater one, so the next hold's token is greater than the evicted.
 *
 * The evicted holder learns of it from its client's watch stream
 * (etcd_keys.c says how), or at its next dlock_extend() (etcd.c).
 */
#include "etcd_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Inspect                                                                  */
/* ------------------------------------------------------------------------ */

/* A key's description: the value's second line (dlock), or who else. */
static void describe(const cJSON *kv, char *out, size_t cap)
{
    const char *v = jstr(kv, "value");
    char val[1024];

    out[0] = '\0';
    if (v && dlock__etcd_b64_decode(v, val, sizeof(val)) > 0) {
        const char *nl = strchr(val, '\n'), *d = nl ? nl + 1 : val;
        size_t n = strnlen(d, cap - 1); /* cut to fit, on purpose */
        memcpy(out, d, n);
        out[n] = '\0';
    }
    if (!out[0])
        snprintf(out, cap, "etcd lease %" PRIx64 " (not dlock)",
                 (uint64_t)jint(kv, "lease"));
}

/* Reads the range answer of inspect (the lock's keys in queue order) into
 * *out; *lease is the holder key's lease (0: none). */
static int inspect_answer(const cJSON *j, dlock_info *out, int64_t *lease)
{
    const cJSON *kv = kvs_at(j, 0);
    size_t n = 0;

    out->ttl_ms = -1;
    out->held_ms = -1;
    out->waiters = 0;
    *lease = 0;
    if (!kv)
        return DLOCK_OK;
    out->held = 1;
    out->token = (uint64_t)jint(kv, "create_revision");
    describe(kv, out->holder, sizeof(out->holder));
    int nk = cJSON_GetArraySize(jget(j, "kvs"));
    int readers = 0, first = 1;
    for (int i = 0; i < nk; i++)
        readers |= dlock__etcd_key_is_reader(jstr(kvs_at(j, i), "key"));
    /* the holders: the first key, and the readers right after a reader,
     * or a semaphore's first N */
    out->shared = dlock__etcd_key_is_reader(jstr(kv, "key"));
    out->permits = dlock__etcd_key_permits(jstr(kv, "key"));
    out->holders = 1;
    while (out->permits && first < nk && first < out->permits) {
        int64_t t = jint(kvs_at(j, first), "create_revision");
        if ((uint64_t)t > out->token)
            out->token = (uint64_t)t;
        out->holders++;
        first++;
    }
    if (out->permits)
        snprintf(out->holder, sizeof(out->holder), "%lld of %lld permits",
                 (long long)out->holders, (long long)out->permits);
    while (out->shared && first < nk &&
           dlock__etcd_key_is_reader(jstr(kvs_at(j, first), "key"))) {
        int64_t t = jint(kvs_at(j, first), "create_revision");
        if ((uint64_t)t > out->token)
            out->token = (uint64_t)t;
        out->holders++;
        first++;
    }
    if (out->holders > 1)
        snprintf(out->holder, sizeof(out->holder), "%lld readers",
                 (long long)out->holders);
    int64_t count = jint(j, "count");
    out->waiters = count >= first ? count - first : -1; /* no count: cannot
                                                         * tell */
    if (nk > first) {
        out->queue = calloc((size_t)(nk - first), sizeof(char *));
        if (!out->queue)
            return enomem();
        for (int i = first; i < nk; i++) {
            char d[256], line[272];
            describe(kvs_at(j, i), d, sizeof(d));
            if (readers)
                snprintf(line, sizeof(line), "%s: %s",
                         dlock__etcd_key_is_reader(jstr(kvs_at(j, i), "key"))
                             ? "read"
                             : "write",
                         d);
            else
                snprintf(line, sizeof(line), "%s", d);
            if (!(out->queue[n] = strdup(line))) {
                out->queue_len = n;
                return enomem();
            }
            n++;
        }
        out->queue_len = n;
    }
    *lease = jint(kv, "lease");
    return DLOCK_OK;
}

/* A lease's time to live in ms, or -1 (unknown, no answer). */
static int64_t lease_ttl(etcd_store *es, int64_t lease, int64_t op_deadline)
{
    char lb[64];
    cJSON *j = NULL;
    int64_t out = -1;

    snprintf(lb, sizeof(lb), "{\"ID\":\"%" PRId64 "\"}", lease);
    if (dlock__etcd_request(es, "/v3/lease/timetolive", lb, op_deadline, &j,
                            "reading the holder's lease") == DLOCK_OK) {
        int64_t ttl = jint(j, "TTL");
        out = ttl > 0 && ttl <= ETCD_TTL_MAX_S ? ttl * 1000 : -1;
    }
    cJSON_Delete(j);
    return out;
}

/* Reads the queue of lock `name` (its keys in creation order) into *j,
 * and describes the lock from it into *out (inspect_answer()).
 * DLOCK_OK, *j then to be freed; or an error (*j NULL). */
static int read_queue(etcd_store *es, const char *name, size_t len,
                      dlock_info *out, cJSON **j, int64_t *lease,
                      int64_t op_deadline)
{
    char base[ETCD_KEY_MAX], bb[ETCD_B64_MAX], eb[ETCD_B64_MAX];
    char body[2 * ETCD_B64_MAX + 256];
    size_t base_len = dlock__etcd_lock_base(es, name, len, base);
    int rc;

    dlock__etcd_b64_encode(base, base_len, bb);
    dlock__etcd_range_end_b64(base, base_len, eb);
    snprintf(body, sizeof(body),
             "{\"key\":\"%s\",\"range_end\":\"%s\",\"sort_order\":"
             "\"ASCEND\",\"sort_target\":\"CREATE\",\"limit\":\"10001\"}",
             bb, eb);
    *j = NULL;
    rc = dlock__etcd_request(es, "/v3/kv/range", body, op_deadline, j,
                             "reading the lock queue");
    if (rc != DLOCK_OK)
        return rc == ETCD_NOLEASE ? DLOCK_EPROTO : rc;
    rc = inspect_answer(*j, out, lease);
    if (rc != DLOCK_OK) {
        cJSON_Delete(*j);
        *j = NULL;
    }
    return rc;
}

int dlock__etcd_inspect(void *st, const char *name, size_t len,
                        dlock_info *out, int64_t op_deadline)
{
    etcd_store *es = st;
    cJSON *j;
    int64_t lease;
    int rc = read_queue(es, name, len, out, &j, &lease, op_deadline);

    if (rc != DLOCK_OK)
        return rc;
    cJSON_Delete(j);
    if (lease)
        out->ttl_ms = lease_ttl(es, lease, op_deadline);
    return DLOCK_OK;
}

/* ------------------------------------------------------------------------ */
/* List                                                                     */
/* ------------------------------------------------------------------------ */

#define LIST_TXN 32 /* locks described by one transaction */

/* The end of the range of keys that start with key[0..n): the key with
 * its last byte below 0xff raised by one and what follows cut; n 0 (every
 * byte 0xff) when no key is above them all ("\0": to the end). */
static size_t prefix_end(const char *key, size_t n, char *out)
{
    memcpy(out, key, n);
    while (n > 0 && (unsigned char)out[n - 1] == 0xff)
        n--;
    if (n > 0)
        out[n - 1] = (char)((unsigned char)out[n - 1] + 1);
    return n;
}

/* A lock's escaped name comp[0..n) decoded into out (DLOCK_NAME_MAX + 1):
 * its length, or -1 when it is not how dlock escapes a name ('%' only in
 * %2F or %25). */
static long unescape(const char *comp, size_t n, char *out)
{
    size_t o = 0;

    for (size_t i = 0; i < n; i++) {
        char ch = comp[i];
        if (o >= DLOCK_NAME_MAX)
            return -1;
        if (ch == '%') {
            if (i + 2 >= n || comp[i + 1] != '2' ||
                (comp[i + 2] != 'F' && comp[i + 2] != '5'))
                return -1;
            out[o++] = comp[i + 2] == 'F' ? '/' : '%';
            i += 2;
            continue;
        }
        if (ch == '\0' || ch == '/')
            return -1;
        out[o++] = ch;
    }
    out[o] = '\0';
    return o ? (long)o : -1;
}

/* The escaped name of the lock whose key is key[0..n): a pointer into key
 * (*cl its length; its name decoded into name, DLOCK_NAME_MAX + 1), or
 * NULL when the key is no lock's of dlock's (outside the prefix, no '/'
 * after the name, an escape dlock does not write). */
static const char *lock_of_key(const etcd_store *es, const char *key,
                               size_t n, size_t *cl, char *name)
{
    if (n <= es->prefix_len || memcmp(key, es->prefix, es->prefix_len) != 0)
        return NULL;
    const char *c = key + es->prefix_len;
    const char *slash = memchr(c, '/', n - es->prefix_len);
    if (!slash || slash == c)
        return NULL;
    *cl = (size_t)(slash - c);
    return unescape(c, *cl, name) < 0 ? NULL : c;
}

/* The escaped lock name a cursor stands for (base64 of it) into comp
 * (cap bytes): its length, or -1 when no page of ours ends there. */
static long cursor_comp(const char *cursor, char *comp, size_t cap)
{
    char name[DLOCK_NAME_MAX + 1];
    long n = strlen(cursor) <= ETCD_B64_MAX
                 ? dlock__etcd_b64_decode(cursor, comp, cap)
                 : -1;

    if (n <= 0 || (size_t)n >= 3 * DLOCK_NAME_MAX + 1 ||
        (size_t)n + 1 >= cap || unescape(comp, (size_t)n, name) < 0)
        return -1;
    return n;
}

typedef struct lease_ttl_cache {
    int64_t id[LIST_TXN];
    int64_t ttl[LIST_TXN];
    int n;
} lease_ttl_cache;

int dlock__etcd_list(void *st, const char *prefix, size_t plen,
                     const char *cursor, size_t limit, unsigned flags,
                     dlock_list_page *out, int64_t op_deadline)
{
    etcd_store *es = st;
    char from[ETCD_KEY_MAX + 8], end[ETCD_KEY_MAX + 8];
    char fb[ETCD_B64_MAX + 16], ebb[ETCD_B64_MAX + 16];
    char comp[ETCD_KEY_MAX + 8], name[DLOCK_NAME_MAX + 1];
    char last[ETCD_KEY_MAX + 8]; /* the last key read */
    size_t from_len, end_len, last_len = 0;
    char **names = NULL; /* the escaped names of the page */
    size_t *lens = NULL, nn = 0;
    int more = 0, rc = DLOCK_OK;

    (void)flags; /* etcd keeps nothing of a free lock */
    /* the range of the prefix: PREFIX/ + escaped prefix ... */
    from_len = es->prefix_len;
    memcpy(from, es->prefix, from_len);
    for (size_t i = 0; i < plen; i++) {
        unsigned char ch = (unsigned char)prefix[i];
        if (ch == '/' || ch == '%') {
            from[from_len++] = '%';
            from[from_len++] = '2';
            from[from_len++] = ch == '/' ? 'F' : '5';
        } else {
            from[from_len++] = (char)ch;
        }
    }
    end_len = prefix_end(from, from_len, end);
    if (from_len == 0) { /* no prefix at all: every key */
        from[0] = '\0';
        from_len = 1;
    }
    /* ... from past the cursor's lock */
    if (cursor[0]) {
        long n = cursor_comp(cursor, comp, sizeof(comp));
        if (n < 0)
            return dlock__err(DLOCK_EINVAL,
                              "etcd %s: the cursor is not one this store "
                              "made (base64 of an escaped lock name)",
                              es->redacted);
        char after[ETCD_KEY_MAX + 8];
        size_t al = es->prefix_len;
        memcpy(after, es->prefix, al);
        memcpy(after + al, comp, (size_t)n);
        al += (size_t)n;
        after[al++] = '0'; /* past PREFIX/NAME/... */
        size_t m = al < from_len ? al : from_len;
        int c = memcmp(after, from, m);
        if (c > 0 || (c == 0 && al > from_len)) {
            memcpy(from, after, al);
            from_len = al;
        }
        if (end_len > 0) {
            m = from_len < end_len ? from_len : end_len;
            c = memcmp(from, end, m);
            if (c > 0 || (c == 0 && from_len >= end_len))
                return DLOCK_OK; /* past the prefix: the end */
        }
    }
    if (!(names = calloc(limit, sizeof(char *))) ||
        !(lens = calloc(limit, sizeof(size_t)))) {
        free(names);
        return enomem();
    }

    /* 1. the page's locks: keys only, each lock's keys skipped at once */
    for (size_t round = 0; rc == DLOCK_OK && nn < limit && round <= limit;
         round++) {
        char body[2 * ETCD_B64_MAX + 256];
        cJSON *j = NULL;
        dlock__etcd_b64_encode(from, from_len, fb);
        if (end_len)
            dlock__etcd_b64_encode(end, end_len, ebb);
        else
            dlock__etcd_b64_encode("", 1, ebb);
        snprintf(body, sizeof(body),
                 "{\"key\":\"%s\",\"range_end\":\"%s\",\"limit\":\"%zu\","
                 "\"keys_only\":true}",
                 fb, ebb, limit - nn + 1);
        rc = dlock__etcd_request(es, "/v3/kv/range", body, op_deadline, &j,
                                 "listing the locks");
        if (rc != DLOCK_OK) {
            rc = rc == ETCD_NOLEASE ? DLOCK_EPROTO : rc;
            break;
        }
        int nk = cJSON_GetArraySize(jget(j, "kvs")), skipped = 0;
        more = cJSON_IsTrue(jget(j, "more"));
        last_len = 0;
        for (int i = 0; i < nk && rc == DLOCK_OK; i++) {
            const char *kb = jstr(kvs_at(j, i), "key");
            long n = kb ? dlock__etcd_b64_decode(kb, comp, sizeof(comp)) : -1;
            if (n <= 0 || (size_t)n >= sizeof(comp) - 1)
                continue; /* longer than any key of ours */
            memcpy(last, comp, (size_t)n);
            last_len = (size_t)n;
            size_t cl = 0;
            const char *c = lock_of_key(es, comp, (size_t)n, &cl, name);
            if (!c)
                continue; /* a key dlock never writes */
            if (nn > 0 && lens[nn - 1] == cl && !memcmp(names[nn - 1], c, cl))
                continue; /* the same lock's next key */
            if (nn == limit) {
                skipped = 1; /* another lock follows the page */
                break;
            }
            if (!(names[nn] = malloc(cl + 1))) {
                rc = enomem();
                break;
            }
            memcpy(names[nn], c, cl);
            names[nn][cl] = '\0';
            lens[nn++] = cl;
        }
        cJSON_Delete(j);
        if (rc != DLOCK_OK)
            break;
        if (skipped)
            more = 1;
        if (!more || (last_len == 0 && nn == 0))
            break;
        /* on past the last lock's keys (PREFIX/NAME0), or past the last
         * key read when that is further (keys that are no lock's) */
        if (nn > 0) {
            from_len = es->prefix_len;
            memcpy(from, es->prefix, from_len);
            memcpy(from + from_len, names[nn - 1], lens[nn - 1]);
            from_len += lens[nn - 1];
            from[from_len++] = '0';
        }
        last[last_len++] = '\0'; /* the key right after the last one */
        size_t m = last_len < from_len ? last_len : from_len;
        int c = memcmp(last, from, m);
        if (nn == 0 || c > 0 || (c == 0 && last_len > from_len)) {
            memcpy(from, last, last_len);
            from_len = last_len;
        }
    }

    /* 2. each lock described as inspect does, LIST_TXN to a transaction */
    lease_ttl_cache cache;
    cache.n = 0;
    for (size_t b0 = 0; rc == DLOCK_OK && b0 < nn; b0 += LIST_TXN) {
        size_t bn = nn - b0 < LIST_TXN ? nn - b0 : LIST_TXN;
        dlock__buf body = ETCD_BUF_INIT;
        for (size_t i = 0; i < bn && rc == DLOCK_OK; i++) {
            char base[ETCD_KEY_MAX + 8], bb[ETCD_B64_MAX + 16];
            char eb[ETCD_B64_MAX + 16], item[2 * ETCD_B64_MAX + 256];
            size_t bl = es->prefix_len;
            memcpy(base, es->prefix, bl);
            memcpy(base + bl, names[b0 + i], lens[b0 + i]);
            bl += lens[b0 + i];
            base[bl++] = '/';
            dlock__etcd_b64_encode(base, bl, bb);
            dlock__etcd_range_end_b64(base, bl, eb);
            int len = snprintf(item, sizeof(item),
                               "%s{\"request_range\":{\"key\":\"%s\","
                               "\"range_end\":\"%s\",\"sort_order\":"
                               "\"ASCEND\",\"sort_target\":\"CREATE\","
                               "\"limit\":\"10001\"}}",
                               i ? "," : "{\"success\":[", bb, eb);
            if (dlock__buf_add(&body, item, (size_t)len) != 0)
                rc = enomem();
        }
        if (rc == DLOCK_OK && dlock__buf_add(&body, "]}", 2) != 0)
            rc = enomem();
        cJSON *j = NULL;
        if (rc == DLOCK_OK)
            rc = dlock__etcd_request(es, "/v3/kv/txn", body.p, op_deadline,
                                     &j, "reading the locks' queues");
        dlock__buf_free(&body);
        if (rc != DLOCK_OK) {
            rc = rc == ETCD_NOLEASE ? DLOCK_EPROTO : rc;
            break;
        }
        for (size_t i = 0; i < bn && rc == DLOCK_OK; i++) {
            dlock_info info;
            int64_t lease = 0;
            memset(&info, 0, sizeof(info));
            rc = inspect_answer(txn_resp(j, (int)i, "response_range"), &info,
                                &lease);
            if (rc == DLOCK_OK && lease) {
                int k = 0;
                while (k < cache.n && cache.id[k] != lease)
                    k++;
                if (k == cache.n && cache.n < LIST_TXN) {
                    cache.id[k] = lease;
                    cache.ttl[k] = lease_ttl(es, lease, op_deadline);
                    cache.n++;
                }
                info.ttl_ms = k < cache.n ? cache.ttl[k]
                                          : lease_ttl(es, lease, op_deadline);
            }
            long nl = unescape(names[b0 + i], lens[b0 + i], name);
            if (rc == DLOCK_OK && nl > 0 && (info.held || info.waiters > 0))
                rc = dlock__list_add(out, name, (size_t)nl, &info);
            else
                dlock_info_clear(&info);
        }
        cJSON_Delete(j);
    }
    /* 3. the cursor: past the page's last lock */
    if (rc == DLOCK_OK && more && nn > 0) {
        char *nx = malloc(4 * ((lens[nn - 1] + 2) / 3) + 1);
        if (!nx)
            rc = enomem();
        else {
            dlock__etcd_b64_encode(names[nn - 1], lens[nn - 1], nx);
            out->next = nx;
        }
    }
    for (size_t i = 0; i < nn; i++)
        free(names[i]);
    free(names);
    free(lens);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Break                                                                    */
/* ------------------------------------------------------------------------ */

#define EVICT_TRIES 16 /* a holder that releases meanwhile: look again */
#define EVICT_BATCH 64 /* keys compared and deleted by one transaction (etcd
                        * allows 128 operations a list by default) */

int dlock__etcd_evict(void *st, const char *name, size_t len,
                      dlock_info *out, int64_t op_deadline)
{
    etcd_store *es = st;
    int rc = DLOCK_OK;

    for (int attempt = 0;; attempt++) {
        cJSON *j = NULL, *t = NULL;
        int64_t lease = 0;
        int again = 0;

        dlock_info_clear(out);
        memset(out, 0, sizeof(*out));
        rc = read_queue(es, name, len, out, &j, &lease, op_deadline);
        if (rc != DLOCK_OK)
            return rc;
        if (!out->held)
            rc = DLOCK_ENOTHELD;
        if (rc == DLOCK_OK && lease)
            out->ttl_ms = lease_ttl(es, lease, op_deadline);
        /* the holders' keys, compared and deleted: all or none (in
         * batches past EVICT_BATCH readers; each batch all or none) */
        for (int64_t b0 = 0; rc == DLOCK_OK && b0 < out->holders;
             b0 += EVICT_BATCH) {
            int64_t bn = out->holders - b0 < EVICT_BATCH ? out->holders - b0
                                                         : EVICT_BATCH;
            dlock__buf cmp = ETCD_BUF_INIT, del = ETCD_BUF_INIT;
            for (int64_t i = 0; i < bn && rc == DLOCK_OK; i++) {
                const cJSON *kv = kvs_at(j, (int)(b0 + i));
                const char *kb = jstr(kv, "key");
                char item[ETCD_B64_MAX + 128];
                int n;
                if (!kb || strlen(kb) >= ETCD_B64_MAX) {
                    rc = dlock__err(DLOCK_EPROTO, "etcd %s: a holder key "
                                                  "without a usable name",
                                    es->redacted);
                    break;
                }
                n = snprintf(item, sizeof(item),
                             "%s{\"target\":\"CREATE\",\"key\":\"%s\","
                             "\"create_revision\":\"%" PRId64 "\"}",
                             i ? "," : "{\"compare\":[", kb,
                             jint(kv, "create_revision"));
                if (dlock__buf_add(&cmp, item, (size_t)n) != 0)
                    rc = enomem();
                n = snprintf(item, sizeof(item),
                             "%s{\"request_delete_range\":{\"key\":\"%s\"}}",
                             i ? "," : "\"success\":[", kb);
                if (rc == DLOCK_OK &&
                    dlock__buf_add(&del, item, (size_t)n) != 0)
                    rc = enomem();
            }
            if (rc == DLOCK_OK &&
                (dlock__buf_add(&cmp, "],", 2) != 0 ||
                 dlock__buf_add(&del, "]}", 2) != 0 ||
                 dlock__buf_add(&cmp, del.p, del.len) != 0))
                rc = enomem();
            if (rc == DLOCK_OK) {
                rc = dlock__etcd_request(es, "/v3/kv/txn", cmp.p, op_deadline,
                                         &t, "deleting the holders' keys");
                if (rc == ETCD_NOLEASE)
                    rc = DLOCK_EPROTO;
                if (rc == DLOCK_OK && !cJSON_IsTrue(jget(t, "succeeded")))
                    again = 1; /* one of them went meanwhile */
                cJSON_Delete(t);
                t = NULL;
            }
            dlock__buf_free(&cmp);
            dlock__buf_free(&del);
            if (again)
                break;
        }
        cJSON_Delete(j);
        if (!again)
            break;
        if (attempt + 1 >= EVICT_TRIES) {
            rc = dlock__err(DLOCK_ECONN,
                            "etcd %s: lock '%.200s': its holders changed "
                            "during each of %d tries; try again",
                            es->redacted, name, EVICT_TRIES);
            break;
        }
    }
    return rc;
}
