/* SPDX-License-Identifier: MIT */
/*
 * redis_rw.c -- shared (read) holds and counting semaphores on the Redis
 * store (redis:// and unix://), and the reading of a lock key in any form
 * for dlock_inspect().
 *
 * The lock's one key keeps the exclusive form (redis.c) while only
 * writers use it; readers and permits give it these forms:
 *     S TOKEN                               (readers hold), or
 *     N PERMITS TOKEN                       (a semaphore of N permits)
 *     + OWNER TOKEN UNTIL_MS DESCRIPTION    (one line per holder)
 *     CLIENTID:TID:SEQ [KIND ]TTL DESCRIPTION   (waiters, in order)
 * KIND is "r" (a reader) or "pN" (a permit of N); a writer's line has
 * none, as in the exclusive form, whose queue readers may also join.
 * TOKEN in the first line is the last token given. Each holder line
 * carries its own lease end on the server's clock; the key's PEXPIRE is
 * the latest of them, and every script first drops the lines whose end
 * has passed, then grants the head of the queue what can now proceed.
 * The scripts are in redis_rw_scripts.c; the protocol and its failure
 * cases in docs/design.md, "Shared holds and permits".
 *
 * Here too is the leaving of a lock of either kind, below redis.c and
 * redis_confirm.c, which use it: the backend's release and abandon (the
 * exclusive scripts first, which answer 2 for a key in a shared form),
 * the undoing of a try whose answer was lost, and the reading of the
 * answers both kinds' scripts give.
 */
#include "redis_int.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define NO_TTL_RETRY_MS 1000 /* a held key without expiry: look again */

/* The lease's waiter line without its leading "\n", and its id
 * "CLIENT:TID:SEQ" (without the space), both in `line`. */
static int waiter_line(const dlock__lease *l, char *line, size_t cap,
                       size_t *len, size_t *id_len)
{
    size_t n = queue_line(l, line, cap, id_len);

    if (!n || *id_len < 2)
        return dlock__err(DLOCK_EINVAL, "lock '%.100s': description too "
                                        "long",
                          l->name);
    *len = n - 1;
    *id_len -= 2;
    return DLOCK_OK;
}

int dlock__redis_rw_acquire(redis_store *rs, dlock__lease *l, int queue,
                            int64_t deadline)
{
    redis_lease *rl = l->priv;
    char key[KEY_MAX], line[LINE_MAX], chan[KEY_MAX + 4];
    size_t kl = lock_key(rs, l->name, l->name_len, key), ll = 0, id_len = 0;
    int64_t now = dlock__now_ms();
    redisReply *r;
    rcmd c;
    int rc = waiter_line(l, line, sizeof(line), &ll, &id_len);

    if (rc)
        return rc;
    if (queue)
        rl->queued = 1;
    rcmd_evalsha(&c, S_RW_TRY, 1);
    rcmd_arg(&c, key, kl);
    rcmd_arg(&c, line + 1, ll);
    rcmd_str(&c, queue ? "1" : "0");
    rcmd_arg(&c, chan, chan_for(rs, key, kl, chan));
    rc = dlock__redis_run(rs, key, kl, &c, 1, &r, deadline);
    if (rc)
        return dlock__redis_undo_lost_try(rs, l, rc);
    if (r->type == REDIS_REPLY_ERROR)
        rc = server_error(rs, r->str, l->name);
    else
        rc = dlock__redis_try_answer(rs, l, r, now);
    freeReplyObject(r);
    return rc;
}

int dlock__redis_rw_release(redis_store *rs, dlock__lease *l,
                            int64_t deadline)
{
    char key[KEY_MAX], chan[KEY_MAX + 4];
    size_t kl = lock_key(rs, l->name, l->name_len, key);
    redisReply *r;
    rcmd c;
    int rc;

    rcmd_evalsha(&c, S_RW_RELEASE, 1);
    rcmd_arg(&c, key, kl);
    rcmd_str(&c, l->owner);
    rcmd_arg(&c, chan, chan_for(rs, key, kl, chan));
    rc = dlock__redis_ask(rs, key, kl, &c, l->name, &r, deadline);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_INTEGER && r->integer == 0) {
        rc = dlock__err(DLOCK_ENOTHELD,
                        "lock '%.100s' is not ours in the store (%s)",
                        l->name,
                        l->kind == DLOCK__WRITE ? "no record of ours"
                                                : "our holder line is gone");
    } else if (r->type == REDIS_REPLY_ARRAY && r->elements % 4 == 1) {
        /* {1, CLIENT, SEQ, TOKEN, TTL, ...}: the waiters it let in; a
         * waiter of this very client hears it at once */
        hint_set(l, 0);
        for (size_t i = 1; i + 3 < r->elements; i += 4)
            dlock__redis_own_grant(rs, r->element[i], r->element[i + 1],
                                   r->element[i + 2]);
    } else {
        rc = dlock__err(DLOCK_EPROTO, "%s: unexpected answer to release",
                        rs->where);
    }
    freeReplyObject(r);
    return rc;
}

int dlock__redis_rw_abandon(redis_store *rs, dlock__lease *l,
                            int64_t deadline)
{
    redis_lease *rl = l->priv;
    char key[KEY_MAX], line[LINE_MAX], ttl[24], chan[KEY_MAX + 4];
    size_t kl = lock_key(rs, l->name, l->name_len, key), ll = 0, id_len = 0;
    redisReply *r;
    rcmd c;
    int rc = waiter_line(l, line, sizeof(line), &ll, &id_len);

    rl->queued = 0;
    if (rc)
        return rc;
    snprintf(ttl, sizeof(ttl), "%lld", (long long)l->ttl_ms);
    rcmd_evalsha(&c, S_RW_ABANDON, 1);
    rcmd_arg(&c, key, kl);
    rcmd_str(&c, l->owner);
    rcmd_arg(&c, line + 1, id_len);
    rcmd_str(&c, ttl);
    rcmd_arg(&c, chan, chan_for(rs, key, kl, chan));
    rc = dlock__redis_ask(rs, key, kl, &c, l->name, &r, deadline);
    if (rc)
        return rc;
    rc = dlock__redis_abandon_answer(rs, r, l);
    freeReplyObject(r);
    return rc;
}

int dlock__redis_rw_extend(redis_store *rs, dlock__lease *l, int64_t ttl_ms,
                           int64_t deadline)
{
    char key[KEY_MAX], ttl[24], chan[KEY_MAX + 4];
    size_t kl = lock_key(rs, l->name, l->name_len, key);
    redisReply *r;
    rcmd c;
    int rc;

    snprintf(ttl, sizeof(ttl), "%lld", (long long)ttl_ms);
    rcmd_evalsha(&c, S_RW_EXTEND, 1);
    rcmd_arg(&c, key, kl);
    rcmd_str(&c, l->owner);
    rcmd_str(&c, ttl);
    rcmd_arg(&c, chan, chan_for(rs, key, kl, chan));
    rc = dlock__redis_ask(rs, key, kl, &c, l->name, &r, deadline);
    if (rc)
        return rc;
    if (r->type != REDIS_REPLY_INTEGER)
        rc = dlock__err(DLOCK_EPROTO, "%s: unexpected answer to extend",
                        rs->where);
    else if (r->integer != 1)
        rc = dlock__err(DLOCK_ENOTHELD,
                        "lock '%.100s' is not ours in the store (our "
                        "holder line is gone)",
                        l->name);
    freeReplyObject(r);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Leaving a lock of any kind, and the answers both kinds' scripts share    */
/* ------------------------------------------------------------------------ */

/* A try whose answer was lost (DLOCK_ECONN: no answer in time, or the
 * connection failed) may still run on the server, and take the lock or
 * queue our line there; nobody would know of that hold until its lease
 * ran out. So the leaving goes right behind it on the same connection,
 * without waiting for answers: abandon (our line out; a hold of ours
 * kept), then the guarded release (a hold of ours let go or handed over).
 * The server runs them in that order, after the try (a try on a new
 * connection after a broken one is not ordered with it: left to the
 * lease). Returns rc with its message kept. Shared tries too
 * (redis_rw.c): abandon and release go to the shared scripts. */
int dlock__redis_undo_lost_try(redis_store *rs, dlock__lease *l, int rc)
{
    char keep[512];

    if (rc != DLOCK_ECONN)
        return rc;
    snprintf(keep, sizeof(keep), "%s", dlock_errmsg());
    (void)dlock__redis_abandon(rs, l, dlock__now_ms());
    (void)dlock__redis_release(rs, l, dlock__now_ms());
    return dlock__err(rc, "%s", keep);
}

int dlock__redis_try_answer(const redis_store *rs, dlock__lease *l,
                            const redisReply *r, int64_t now)
{
    if (r->type == REDIS_REPLY_STRING) {
        if (dlock__redis_reply_uint(r, &l->token) != 0 || l->token == 0)
            return dlock__err(DLOCK_EPROTO,
                              "%s: lock '%.100s': bad fencing token in the "
                              "store",
                              rs->where, l->name);
        return DLOCK_OK;
    }
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[0]->type == REDIS_REPLY_INTEGER &&
        r->element[1]->type == REDIS_REPLY_INTEGER) {
        long long left = r->element[0]->integer;
        if (left >= 0)
            l->retry_ms = left;
        else /* a held key without expiry (not set by dlock) */
            l->retry_ms = NO_TTL_RETRY_MS;
        if (left >= 0)
            hint_set(l, now + left);
        l->armed = r->element[1]->integer == 1 && !l->waiting;
        return DLOCK_EBUSY;
    }
    return dlock__err(DLOCK_EPROTO, "%s: unexpected answer to acquire",
                      rs->where);
}

void dlock__redis_own_grant(const redis_store *rs, const redisReply *c,
                            const redisReply *seq, const redisReply *token)
{
    uint64_t t = 0;

    if (c->type == REDIS_REPLY_STRING && c->len == 32 &&
        !memcmp(c->str, dlock__client_id(rs->client), 32) &&
        seq->type == REDIS_REPLY_STRING &&
        dlock__redis_reply_uint(token, &t) == 0 && t) {
        if (rs->min_replicas > 0) /* its own try confirms it (WAIT) */
            dlock__notify_waiter(rs->client, strtoull(seq->str, NULL, 10));
        else
            dlock__notify_grant(rs->client, strtoull(seq->str, NULL, 10), t);
    }
}

int dlock__redis_release(void *st, dlock__lease *l, int64_t deadline)
{
    redis_store *rs = st;
    char key[KEY_MAX], owner[80], now_ms[24], chan[KEY_MAX + 4];
    size_t kl = lock_key(rs, l->name, l->name_len, key);
    size_t ol = owner_sp(l, owner, sizeof(owner));
    redisReply *r;
    rcmd c;
    int rc;

    if (l->kind != DLOCK__WRITE)
        return dlock__redis_rw_release(rs, l, deadline);
    snprintf(now_ms, sizeof(now_ms), " %lld ", (long long)wall_ms());
    rcmd_evalsha(&c, S_RELEASE, 1);
    rcmd_arg(&c, key, kl);
    rcmd_arg(&c, owner, ol);
    rcmd_arg(&c, chan, chan_for(rs, key, kl, chan));
    rcmd_str(&c, now_ms);
    rc = dlock__redis_ask(rs, key, kl, &c, l->name, &r, deadline);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_INTEGER && r->integer == 2) {
        /* readers or permits wait: the shared script releases */
        freeReplyObject(r);
        return dlock__redis_rw_release(rs, l, deadline);
    } else if (r->type == REDIS_REPLY_INTEGER) {
        if (r->integer == 0)
            rc = dlock__err(DLOCK_ENOTHELD,
                            "lock '%.100s' is not ours in the store",
                            l->name);
        else
            hint_set(l, 0); /* free now */
    } else if (r->type == REDIS_REPLY_ARRAY && r->elements == 4 &&
               r->element[0]->type == REDIS_REPLY_STRING &&
               r->element[1]->type == REDIS_REPLY_STRING &&
               r->element[2]->type == REDIS_REPLY_STRING &&
               r->element[3]->type == REDIS_REPLY_INTEGER) {
        /* handed over: held by the waiter for its lease at most, unless
         * renewed; a waiter of this very client hears it at once */
        hint_set(l, dlock__now_ms() + r->element[3]->integer);
        dlock__redis_own_grant(rs, r->element[0], r->element[1],
                               r->element[2]);
    } else {
        rc = dlock__err(DLOCK_EPROTO, "%s: unexpected answer to release",
                        rs->where);
    }
    freeReplyObject(r);
    return rc;
}

int dlock__redis_abandon(void *st, dlock__lease *l, int64_t deadline)
{
    redis_store *rs = st;
    redis_lease *rl = l->priv;
    char key[KEY_MAX], owner[80], ttl[24], line[LINE_MAX];
    size_t kl = lock_key(rs, l->name, l->name_len, key), id_len = 0;
    size_t ol = owner_sp(l, owner, sizeof(owner));
    redisReply *r;
    rcmd c;
    int rc;

    if (!rl->queued)
        return DLOCK_EBUSY;
    if (l->kind != DLOCK__WRITE)
        return dlock__redis_rw_abandon(rs, l, deadline);
    rl->queued = 0;
    (void)queue_line(l, line, sizeof(line), &id_len);
    snprintf(ttl, sizeof(ttl), "%lld", (long long)l->ttl_ms);
    rcmd_evalsha(&c, S_ABANDON, 1);
    rcmd_arg(&c, key, kl);
    rcmd_arg(&c, owner, ol);
    rcmd_arg(&c, line, id_len);
    rcmd_str(&c, ttl);
    rc = dlock__redis_ask(rs, key, kl, &c, l->name, &r, deadline);
    if (rc)
        return rc;
    if (r->type == REDIS_REPLY_INTEGER && r->integer == 2) {
        /* readers or permits hold: leaving may let them in */
        rl->queued = 1;
        freeReplyObject(r);
        return dlock__redis_rw_abandon(rs, l, deadline);
    } else {
        rc = dlock__redis_abandon_answer(rs, r, l);
    }
    freeReplyObject(r);
    return rc;
}

int dlock__redis_abandon_answer(const redis_store *rs, const redisReply *r,
                                dlock__lease *l)
{
    if (r->type == REDIS_REPLY_INTEGER)
        return DLOCK_EBUSY; /* left (or never queued) */
    if (r->type == REDIS_REPLY_ARRAY && r->elements == 1 &&
        dlock__redis_reply_uint(r->element[0], &l->token) == 0 &&
        l->token > 0)
        return DLOCK_OK; /* handed to us as we left: ours */
    return dlock__err(DLOCK_EPROTO, "%s: unexpected answer to abandon",
                      rs->where);
}

/* ------------------------------------------------------------------------ */
/* Inspection                                                               */
/* ------------------------------------------------------------------------ */

static int not_dlock(const redis_store *rs, const char *name)
{
    return dlock__err(DLOCK_EPROTO,
                      "%s: a key of lock '%.100s' holds a value of another "
                      "type (not written by dlock)",
                      rs->where, name);
}

/* A decimal number filling [p, end) exactly. */
static int number(const char *p, const char *end, unsigned long long *out)
{
    char buf[24], *e = NULL;
    size_t n = (size_t)(end - p);

    if (n == 0 || n >= sizeof(buf) || !isdigit((unsigned char)p[0]))
        return -1;
    memcpy(buf, p, n);
    buf[n] = '\0';
    errno = 0;
    *out = strtoull(buf, &e, 10);
    return errno || *e ? -1 : 0;
}

/* Reads the first line of a shared form, "S TOKEN" or "N PERMITS
 * TOKEN", and its holder lines "+ OWNER TOKEN UNTIL_MS DESC" (only those
 * whose end is still ahead of the server clock `now` count). Returns the
 * end of the holder lines, or NULL if the value is not dlock's. */
static const char *shared_holders(const char *v, const char *end,
                                  long long now, dlock_info *out)
{
    const char *nl = memchr(v, '\n', (size_t)(end - v));
    const char *rec = nl ? nl : end, *sp;
    unsigned long long n = 0, t = 0;

    if (v[0] == 'N') {
        sp = memchr(v + 2, ' ', (size_t)(rec - v - 2));
        if (!sp || number(v + 2, sp, &n) || number(sp + 1, rec, &t) || !n ||
            n > DLOCK_PERMITS_MAX)
            return NULL;
        out->permits = (int64_t)n;
    } else {
        if (number(v + 2, rec, &t))
            return NULL;
        out->shared = 1;
    }
    out->token = t;
    while (nl && nl + 2 < end && nl[1] == '+' && nl[2] == ' ') {
        const char *b = nl + 3, *e = memchr(b, '\n', (size_t)(end - b));
        const char *lim = e ? e : end;
        unsigned long long until = 0;
        int u = 0, desc = 0;

        /* the end "?": a sole holder's, the key's own expiry */
        if (sscanf(b, "%*s %*u %n", &u) < 0 || u <= 0 || b + u >= lim)
            return NULL;
        if (b[u] == '?')
            desc = u + 2;
        else if (sscanf(b + u, "%llu %n", &until, &desc) < 1 || desc <= 0)
            return NULL;
        else
            desc += u;
        if (b + desc > lim)
            return NULL;
        if (b[u] == '?' || now < 0 || until > (unsigned long long)now) {
            if (!out->holders)
                snprintf(out->holder, sizeof(out->holder), "%.*s",
                         (int)(lim - b - desc), b + desc);
            out->holders++;
        }
        nl = e;
    }
    out->held = out->holders > 0;
    if (!out->held)
        out->shared = 0;
    return nl ? nl : end;
}

int dlock__redis_rw_inspect(const redis_store *rs, const char *name,
                            const redisReply *s, dlock_info *out)
{
    if (s->type == REDIS_REPLY_ERROR)
        return server_error(rs, s->str, name);
    if (s->type != REDIS_REPLY_ARRAY || s->elements != 3 ||
        s->element[0]->type != REDIS_REPLY_INTEGER)
        return dlock__err(DLOCK_EPROTO, "%s: unexpected answer to inspect",
                          rs->where);
    return dlock__redis_inspect_value(
        rs, name, s->element[0]->integer, s->element[1],
        s->element[2]->type == REDIS_REPLY_INTEGER ? s->element[2]->integer
                                                   : -1,
        out);
}

int dlock__redis_inspect_value(const redis_store *rs, const char *name,
                               long long now, const redisReply *v,
                               long long pttl, dlock_info *out)
{
    unsigned long long t = 0, at = 0;
    int desc = 0, kinds = 0;

    out->waiters = 0;
    if (v->type != REDIS_REPLY_STRING)
        return DLOCK_OK; /* free, nothing kept */
    const char *end = v->str + v->len;
    /* the first line: a writer's record "OWNER TOKEN ACQUIRED_MS
     * DESCRIPTION", a tombstone "- TOKEN", a shared form's first line
     * and its holders, or nothing (only queue lines: free); then "\n" +
     * queue lines */
    const char *nl = memchr(v->str, '\n', v->len);
    size_t rec = nl ? (size_t)(nl - v->str) : v->len;
    if (rec > 2 && v->str[0] == '-' && v->str[1] == ' ') {
        /* "- TOKEN", or "- TOKEN N" after a semaphore of N */
        const char *sp = memchr(v->str + 2, ' ', rec - 2);
        unsigned long long n = 0;
        if (number(v->str + 2, sp ? sp : v->str + rec, &t) ||
            (sp && (number(sp + 1, v->str + rec, &n) || !n ||
                    n > DLOCK_PERMITS_MAX)))
            return not_dlock(rs, name);
        out->token = t;
        out->permits = (int64_t)n;
    } else if (rec > 2 && (v->str[0] == 'S' || v->str[0] == 'N') &&
               v->str[1] == ' ') {
        nl = shared_holders(v->str, end, now, out);
        if (!nl)
            return not_dlock(rs, name);
        if (nl == end)
            nl = NULL;
        if (out->held && pttl >= 0)
            out->ttl_ms = pttl;
        kinds = 1;
    } else if (rec > 0) {
        if (sscanf(v->str, "%*s %llu %llu %n", &t, &at, &desc) < 2 ||
            desc <= 0 || (size_t)desc > rec)
            return not_dlock(rs, name);
        out->held = 1;
        out->holders = 1;
        out->token = t;
        snprintf(out->holder, sizeof(out->holder), "%.*s",
                 (int)(rec - (size_t)desc), v->str + desc);
        if (now >= 0 && (unsigned long long)now >= at)
            out->held_ms = (int64_t)((unsigned long long)now - at);
        if (pttl >= 0)
            out->ttl_ms = pttl;
    }

    /* each line "CLIENT:TID:SEQ [KIND ]TTL DESCRIPTION": its kind in
     * front of the description when readers or permits use the name */
    for (const char *p = nl; p && !kinds && p + 1 < end;) {
        const char *sp = memchr(p + 1, ' ', (size_t)(end - p - 1));
        if (sp && sp + 1 < end && (sp[1] == 'r' || sp[1] == 'p'))
            kinds = 1;
        p = memchr(p + 1, '\n', (size_t)(end - p - 1));
    }
    for (const char *p = nl; p && p < end;) {
        const char *b = p + 1, *e = memchr(b, '\n', (size_t)(end - b));
        const char *lim = e ? e : end;
        const char *sp = memchr(b, ' ', (size_t)(lim - b));
        const char *k = sp && sp + 1 < lim ? sp + 1 : lim;
        int kinded = k < lim && (*k == 'r' || *k == 'p');
        const char *sp2 = memchr(k, ' ', (size_t)(lim - k));
        if (kinded && sp2)
            sp2 = memchr(sp2 + 1, ' ', (size_t)(lim - sp2 - 1));
        const char *d = sp2 ? sp2 + 1 : lim;
        const char *kind = !kinds     ? ""
                           : !kinded  ? "write: "
                           : *k == 'r' ? "read: "
                                       : "permit: ";
        size_t kl = strlen(kind), dl = (size_t)(lim - d);
        char *item = malloc(kl + dl + 1);
        if (!item)
            return dlock__err(DLOCK_ENOMEM, "out of memory");
        memcpy(item, kind, kl);
        memcpy(item + kl, d, dl);
        item[kl + dl] = '\0';
        int rc = dlock__info_add_waiter(out, item);
        free(item);
        if (rc)
            return rc;
        out->waiters++;
        p = e;
    }
    return DLOCK_OK;
}
