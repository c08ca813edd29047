/* SPDX-License-Identifier: MIT */
/*
 * fuzz_redis.c -- what the Redis store (src/stores/redis/redis.c,
 * redis_rw.c and redis_common.c) does with URIs, lock names and the
 * server's replies.
 * RESP itself is parsed by hiredis: the fuzzer's bytes go through
 * hiredis' redisReader to make real redisReply trees, which are then
 * handed to our code.
 *
 * Input: field 1 a store URI (redis:// or unix://: parse_config, the
 * options prefix, db, timeout); field 2 a lock name; field 3 a password
 * and field 4 a server error message (scrub: the password never shows);
 * one byte of flags; the rest RESP bytes. The first reply is read as the
 * answer to inspect (the script's array: server time, the lock's value
 * in any form, exclusive, shared or a semaphore's, with its holder and
 * queue lines, PTTL); every reply goes to the subscriber
 * connection's handler (hand-over messages on the client's channel).
 * The same reply is read as the answer to the break script
 * (redis_operate.c: the value before, its PTTL, whether it broke, the
 * grants). Every reply also goes to a Sentinel topology's watch handler
 * (redis_sentinel.c: +switch-master and +promoted-slave messages of a
 * master named by field 2): a move it accepts names a port in 1..65535
 * and a host that fits, and the generation grows by at most one per
 * message. Every reply is also read as a Redis Cluster's CLUSTER SLOTS
 * answer (redis_cluster.c: a map names only nodes it added, in range)
 * and fed to the cluster subscribers' handler (redis_wait.c); field 4 as
 * a MOVED answer (a slot in range, a node added); the slot of a lock's
 * keys is its name's (one slot per lock). Field 4 is also read as a dlock_list() cursor (one server's
 * SCAN cursor, and Redlock's one field per node), and field 3 as a name
 * prefix for listing.
 * Checks: keys are PREFIX{NAME}SUFFIX and the name comes back from a key
 * by its last '}' (one key per name and suffix), and by
 * dlock__redis_key_name(); the SCAN pattern of a name prefix matches the
 * key of a name exactly when the name starts with it (a matcher of Redis'
 * glob for what the pattern holds: escaped bytes and one '*'); a cursor
 * is refused or read back to itself (written again, read again, the
 * same); a queue line holds the
 * owner, waiter number, ttl and description and its id is its prefix;
 * inspect answers give DLOCK_OK or DLOCK_EPROTO, a terminated holder,
 * waiters >= -1 and as many as the queue entries, held_ms >= -1, holders
 * and permits >= 0 (held exactly when holders > 0), no UB whatever the
 * numbers.
 */
#include "fuzz.h"

#include "../src/stores/redis/redis.c"
#include "../src/stores/redis/redis_rw.c"
#include "../src/stores/redis/redis_scripts.c"
#include "../src/stores/redis/redis_rw_scripts.c"
#include "../src/stores/redis/redis_conn.c"
#include "../src/stores/redis/redis_common.c"
#include "../src/stores/redis/redis_operate.c"
#include "../src/stores/redis/sentinel/redis_sentinel.c"
#include "../src/stores/redis/redis_wait.c"
#include "../src/stores/redis/cluster/redis_cluster.c"

#include "uri.h" /* the core's parser: the fuzz target parses URIs */

static dlock_client *client;

static void setup(void)
{
    static char dir[] = "/tmp/dlock-fuzz-redis-XXXXXX";
    char uri[64];

    if (client)
        return;
    /* a real client (file store) for the notify calls of sub_reply */
    if (!mkdtemp(dir))
        abort();
    snprintf(uri, sizeof(uri), "file://%s", dir);
    if (dlock_client_open(&client, uri, NULL) != DLOCK_OK)
        abort();
}

static void check_key(const redis_store *rs, const char *name, size_t len,
                      const char *sfx)
{
    char *k = malloc(DLOCK__REDIS_KEY_MAX);
    size_t kl = dlock__redis_key(&rs->cfg, name, len, sfx, k);
    size_t pl = rs->cfg.prefix_len, sl = strlen(sfx);

    if (kl > DLOCK__REDIS_KEY_MAX || kl != pl + len + 2 + sl ||
        memcmp(k, rs->cfg.prefix, pl) != 0 || k[pl] != '{')
        fz_fail("key layout");
    /* the name back: between the '{' after the prefix and the last '}' */
    const char *end = k + kl;
    while (end > k && *--end != '}')
        ;
    if ((size_t)(end - k) != pl + 1 + len ||
        memcmp(k + pl + 1, name, len) != 0 || memcmp(end + 1, sfx, sl) != 0)
        fz_fail("the name does not come back from its key");
    free(k);
}

/* Redis' glob for the patterns list makes: a backslash takes the next
 * byte literally, '*' any run of bytes (written for this check; the
 * patterns hold no '?' or '['). */
static int glob(const char *p, size_t pl, const char *s, size_t sl)
{
    while (pl) {
        if (*p == '*') {
            for (size_t k = 0; k <= sl; k++)
                if (glob(p + 1, pl - 1, s + k, sl - k))
                    return 1;
            return 0;
        }
        if (*p == '\\' && pl > 1) {
            p++;
            pl--;
        }
        if (!sl || *p != *s)
            return 0;
        p++;
        pl--;
        s++;
        sl--;
    }
    return sl == 0;
}

/* The name of a key, and the pattern of a name prefix. */
static void check_listing(const redis_store *rs, const char *name,
                          size_t len, const char *prefix, size_t plen)
{
    char *k = malloc(DLOCK__REDIS_KEY_MAX);
    char *pat = malloc(DLOCK__REDIS_PATTERN_MAX);
    const char *nm;
    size_t nl;

    if (plen > DLOCK_NAME_MAX)
        plen = DLOCK_NAME_MAX;
    size_t pn = dlock__redis_list_pattern(&rs->cfg, prefix, plen, "", pat);
    if (pn > DLOCK__REDIS_PATTERN_MAX)
        fz_fail("pattern past its buffer");
    if (len >= 1 && len <= DLOCK_NAME_MAX && !memchr(name, 0, len)) {
        size_t kl = dlock__redis_key(&rs->cfg, name, len, "", k);
        if (dlock__redis_key_name(&rs->cfg, k, kl, "", &nm, &nl) != 0 ||
            nl != len || memcmp(nm, name, len) != 0)
            fz_fail("the name does not come back from its key");
        if (dlock__redis_key_name(&rs->cfg, k, kl, ":f", &nm, &nl) == 0)
            fz_fail("a lock key read as a counter key");
        int starts = len >= plen && memcmp(name, prefix, plen) == 0;
        if (glob(pat, pn, k, kl) != starts)
            fz_fail("the pattern of a prefix %s the key of a name",
                    starts ? "misses" : "matches");
        kl = dlock__redis_key(&rs->cfg, name, len, ":f", k);
        if (glob(pat, pn, k, kl))
            fz_fail("a lock key pattern matches a counter key");
    }
    /* any key at all: a name within bounds, or refused */
    if (dlock__redis_key_name(&rs->cfg, name, len, "", &nm, &nl) == 0 &&
        (nl == 0 || nl > DLOCK_NAME_MAX || nm < name ||
         nm + nl > name + len))
        fz_fail("a name out of its key");
    free(k);
    free(pat);
}

/* A cursor is refused, or read back to itself. */
static void check_cursor(const char *s, unsigned n)
{
    char out[21], again[21];
    char(*cur)[21] = malloc(64 * sizeof(*cur));
    char(*cur2)[21] = malloc(64 * sizeof(*cur2));
    int walk[64], walk2[64];
    size_t len = strlen(s);

    if (dlock__redis_scan_cursor(s, len, out) == 0) {
        if (strlen(out) > 20 || strspn(out, "0123456789") != strlen(out) ||
            (out[0] == '0' && out[1]) ||
            dlock__redis_scan_cursor(out, strlen(out), again) != 0 ||
            strcmp(out, again) != 0)
            fz_fail("a SCAN cursor not read back to itself");
        if (strtoull(s, NULL, 10) != strtoull(out, NULL, 10))
            fz_fail("a SCAN cursor read as another number");
    }
    if (dlock__redis_walk_cursor(s, (int)n, cur, walk) == 0) {
        char *next = NULL;
        if (dlock__redis_walk_next((int)n, cur, walk, &next) != DLOCK_OK)
            fz_fail("walk_next failed");
        int more = 0;
        for (unsigned i = 0; i < n; i++)
            more |= walk[i] == DLOCK__WALKING;
        if (!next != !more)
            fz_fail("a walk's next cursor");
        if (next) {
            if (dlock__redis_walk_cursor(next, (int)n, cur2, walk2) != 0)
                fz_fail("a walk cursor we made is refused");
            for (unsigned i = 0; i < n; i++)
                if (walk[i] != walk2[i] ||
                    (walk[i] == DLOCK__WALKING && strcmp(cur[i], cur2[i])))
                    fz_fail("a walk cursor not read back to itself");
        }
        free(next);
    }
    free(cur);
    free(cur2);
}

static void check_scrub(const char *password, const char *msg)
{
    char out[64];

    scrub(password, msg, out, sizeof(out));
    if (strlen(out) >= sizeof(out))
        fz_fail("scrub past its capacity");
    for (const char *p = out; *p; p++)
        if ((unsigned char)*p < ' ')
            fz_fail("scrub left a control character");
    size_t pl = strlen(password);
    /* a password of '*', spaces or control characters could be made up by
     * the replacements themselves */
    if (pl >= 3 && !strpbrk(password, "* ") &&
        !memchr(password, 0x7f, pl)) {
        for (size_t i = 0; i < pl; i++)
            if ((unsigned char)password[i] < ' ')
                return;
        if (strstr(out, password))
            fz_fail("the password shows in a scrubbed message");
    }
    (void)dlock__redis_server_error("redis h:1", password, msg, "L");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = fz_init(data, size);
    size_t len, plen;
    char *uri = fz_field(&f, NULL);
    char *name = fz_field(&f, &len);
    char *password = fz_field(&f, &plen);
    char *msg = fz_field(&f, NULL);
    unsigned flags = fz_byte(&f);
    redis_store *rs = calloc(1, sizeof(*rs));
    dlock__uri u;

    setup();
    rs->client = client;
    if (dlock__uri_parse(uri, &u) == DLOCK_OK) {
        if (parse_config(rs, &u) != DLOCK_OK) {
            free(rs->host);
            free(rs->path);
            dlock__redis_config_free(&rs->cfg);
            memset(rs, 0, sizeof(*rs));
            rs->client = client;
        }
        dlock__uri_free(&u);
    }
    if (!rs->cfg.prefix_len) {
        memcpy(rs->cfg.prefix, "dlock:", 7);
        rs->cfg.prefix_len = 6;
    }
    snprintf(rs->where, sizeof(rs->where), "redis fuzz");

    if (len >= 1 && len <= DLOCK_NAME_MAX) {
        char *k = malloc(KEY_MAX);
        if (lock_key(rs, name, len, k) != rs->cfg.prefix_len + len + 2)
            fz_fail("lock key length");
        free(k);
        check_key(rs, name, len, "");
        check_key(rs, name, len, ":f");
    }
    check_scrub(password, msg);
    check_listing(rs, name, len, password, plen);
    check_cursor(msg, flags % 63 + 1);

    /* a queue line of a lease with this description (cut to fit) */
    {
        dlock__lease l;
        char line[LINE_MAX], desc[160];
        size_t id_len = 0;
        memset(&l, 0, sizeof(l));
        snprintf(desc, sizeof(desc), "%.*s", (int)(len < 150 ? len : 150),
                 name);
        l.owner = "0123456789abcdef0123456789abcdef:4242";
        l.desc = desc;
        l.waiter = flags;
        l.ttl_ms = 30000;
        size_t ll = queue_line(&l, line, sizeof(line), &id_len);
        if (ll && (id_len == 0 || id_len >= ll || line[0] != '\n' ||
                   line[id_len - 1] != ' ' ||
                   memcmp(line + 1, l.owner, strlen(l.owner)) != 0))
            fz_fail("queue line layout");
    }

    /* the subscriber side: the client's own channel */
    rs->chan_len = (size_t)snprintf(rs->chan, sizeof(rs->chan),
                                    "dlock:c:fuzz");
    rs->subscribed = flags & 1;

    size_t rl;
    const uint8_t *resp = fz_rest(&f, &rl);
    redisReader *rd = redisReaderCreate();
    /* hiredis 0.14 allocates whatever count an array header announces:
     * keep arrays small (4 digits at most after '*') */
    for (size_t i = 0, digits = 0; i < rl; i++) {
        digits = resp[i] >= '0' && resp[i] <= '9' && digits ? digits + 1
                 : resp[i] == '*'                             ? 1
                                                              : 0;
        if (digits > 5)
            rl = 0;
    }
    redisReply *got[8];
    int n = 0;
    if (rl > 0)
        redisReaderFeed(rd, (const char *)resp, rl);
    while (n < 8) {
        void *r = NULL;
        if (redisReaderGetReply(rd, &r) != REDIS_OK || !r)
            break;
        got[n++] = r;
    }
    redisReaderFree(rd);

    if (n >= 1) {
        dlock_info info;
        memset(&info, 0, sizeof(info));
        info.ttl_ms = info.held_ms = info.waiters = -1;
        int rc = dlock__redis_rw_inspect(rs, name, got[0], &info);
        /* DLOCK_EINVAL: an error reply "DLOCKKIND ..." (the shared
         * scripts' answer to a lock used as a semaphore) */
        if (rc != DLOCK_OK && rc != DLOCK_EPROTO && rc != DLOCK_EAUTH &&
            rc != DLOCK_ECONN && rc != DLOCK_ENOMEM && rc != DLOCK_EINVAL)
            fz_fail("dlock__redis_rw_inspect returned %d", rc);
        if (rc == DLOCK_OK &&
            (strnlen(info.holder, sizeof(info.holder)) >= sizeof(info.holder) ||
             info.waiters < -1 || info.held_ms < -1 || info.ttl_ms < -1 ||
             info.holders < 0 || info.permits < 0 ||
             info.held != (info.holders > 0) ||
             (info.waiters >= 0 && (size_t)info.waiters != info.queue_len)))
            fz_fail("inspect answer out of range");
        dlock_info_clear(&info);

        /* the same reply as the break script's answer */
        memset(&info, 0, sizeof(info));
        info.ttl_ms = info.held_ms = info.waiters = -1;
        rc = break_answer(rs, name, got[0], &info);
        if (rc != DLOCK_OK && rc != DLOCK_ENOTHELD && rc != DLOCK_EPROTO &&
            rc != DLOCK_EAUTH && rc != DLOCK_ECONN && rc != DLOCK_ENOMEM &&
            rc != DLOCK_EINVAL)
            fz_fail("break_answer returned %d", rc);
        if ((rc == DLOCK_OK || rc == DLOCK_ENOTHELD) &&
            (info.holders < 0 || info.held != (info.holders > 0) ||
             (info.waiters >= 0 && (size_t)info.waiters != info.queue_len)))
            fz_fail("break answer out of range");
        dlock_info_clear(&info);
    }
    dlock__rtopo topo;
    memset(&topo, 0, sizeof(topo));
    topo.client = client;
    topo.gen = 1;
    topo.epfd = -1;
    snprintf(topo.master, sizeof(topo.master), "%s", name);
    /* a cluster's map (redis_cluster.c), from no network: one node */
    dlock__rcluster *cl = calloc(1, sizeof(*cl));
    uint16_t *fresh = malloc(sizeof(cl->owner));
    pthread_mutex_init(&cl->mu, NULL);
    cl->cfg = &rs->cfg;
    cl->gen = 1;
    for (unsigned s = 0; s < DLOCK__RCLUSTER_SLOTS; s++)
        cl->owner[s] = NONE;
    if (node_at(cl, "127.0.0.1", 9, 7000) != 0)
        fz_fail("the first node");
    if (len >= 1 && len <= DLOCK_NAME_MAX) {
        /* every key of a lock in one slot: its name's, when the name
         * holds no '}' (the hash tag ends at the first) */
        char *k = malloc(KEY_MAX);
        size_t kl = lock_key(rs, name, len, k);
        unsigned sk = dlock__rcluster_slot(k, kl);
        if (sk >= DLOCK__RCLUSTER_SLOTS)
            fz_fail("a slot out of range");
        if (!memchr(name, '}', len) && !memchr(rs->cfg.prefix, '{',
                                               rs->cfg.prefix_len) &&
            sk != dlock__rcluster_slot(name, len))
            fz_fail("a lock key's slot is not its name's");
        kl = dlock__redis_key(&rs->cfg, name, len, ":f", k);
        if (!memchr(name, '}', len) && !memchr(rs->cfg.prefix, '{',
                                               rs->cfg.prefix_len) &&
            sk != dlock__rcluster_slot(k, kl))
            fz_fail("a lock's keys in two slots");
        free(k);
    }
    {
        int ms = dlock__rcluster_moved(cl, msg);
        if (ms >= DLOCK__RCLUSTER_SLOTS ||
            (ms >= 0 && cl->owner[ms] >= (unsigned)cl->nnodes))
            fz_fail("a MOVED answer read out of range");
    }
    rs->cluster = cl;
    for (int i = 0; i < n; i++) {
        uint64_t v, g0 = topo.gen;
        (void)dlock__redis_reply_uint(got[i], &v);
        for (unsigned s = 0; s < DLOCK__RCLUSTER_SLOTS; s++)
            fresh[s] = NONE;
        if (parse_slots(cl, 0, got[i], fresh) == DLOCK_OK) {
            for (unsigned s = 0; s < DLOCK__RCLUSTER_SLOTS; s++)
                if (fresh[s] != NONE && fresh[s] >= cl->nnodes)
                    fz_fail("a slot map names a node it did not add");
            apply(cl, fresh);
        }
        {
            cconn cc = {NULL, 0, NULL};
            csub_reply(rs, &cc, got[i]);
        }
        rs->cluster = NULL;
        sub_reply(rs, got[i]);
        rs->cluster = cl;
        watch_reply(&topo, got[i]);
        if (topo.gen > g0 + 1 ||
            (topo.known && (topo.pport < 1 || topo.pport > 65535 ||
                            strnlen(topo.phost, sizeof(topo.phost)) >=
                                sizeof(topo.phost))))
            fz_fail("a Sentinel move out of range");
        freeReplyObject(got[i]);
    }
    rs->cluster = NULL;
    dlock__rcluster_free(cl);
    free(fresh);

    free(rs->host);
    free(rs->path);
    dlock__redis_config_free(&rs->cfg);
    free(rs);
    free(uri);
    free(name);
    free(password);
    free(msg);
    return 0;
}
