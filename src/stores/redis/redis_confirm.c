/* SPDX-License-Identifier: MIT */
/*
 * redis_confirm.c -- what a Redis waiter does once a message woke it: it
 * asks the store whether the lock is its own, with one read.
 *
 * A hand-over's message ("g SEQ TOKEN" on the client's channel) can be
 * sent by anyone allowed to PUBLISH there, and such a user may read the
 * key too, which names every waiter; so a message is only a wake-up
 * (redis_wait.c), and the waiter's next try looks at the key. While a read
 * can say everything, that look is GET and PTTL of the key (and TIME, for
 * a read hold or a permit, whose lines carry their own ends on the
 * server's clock), in one write: the lock is ours when the key names this
 * owner a live holder -- what the try's script would adopt, and what only
 * a writer of the key can make it say -- and someone else's while our
 * line still waits in it behind a holder. Anything else goes to the try's
 * script, in the same call.
 *
 * The lease of a hold confirmed so is what the key says is left, counted
 * from before the read was sent (the store's end is no earlier): the core
 * takes its start from l->started. A hold with less than two thirds of its
 * ttl left goes to the try instead, which restarts it. docs/design.md, "A
 * message is a wake-up".
 */
#include "redis_int.h"

#include <string.h>

/* May a read decide lease l's wake-up? A waiting lease whose line was
 * sent to the queue, without min_replicas (whose WAIT must follow a
 * write of the waiter's own: its try confirms). */
static int confirmable(const redis_store *rs, const dlock__lease *l)
{
    const redis_lease *rl = l->priv;

    return l->waiting && rl->queued && rs->min_replicas == 0;
}

/* The decimal number at *p (stopping at `end` or a non-digit), at most
 * 18 digits; *p moves past it. -1 when there is none. */
static long long number(const char **p, const char *end)
{
    long long v = 0;
    int n = 0;

    while (*p < end && **p >= '0' && **p <= '9' && n < 18) {
        v = v * 10 + (**p - '0');
        (*p)++;
        n++;
    }
    if (n == 0 || (*p < end && **p >= '0' && **p <= '9'))
        return -1;
    return v;
}

/* The token of a writer's record of ours at the head of v[0..len)
 * ("OWNER TOKEN ACQUIRED_MS ..."), or 0. */
static long long own_record(const dlock__lease *l, const char *v, size_t len)
{
    char owner[80];
    size_t ol = owner_sp(l, owner, sizeof(owner));
    const char *p = v + ol, *end = v + len;
    long long t;

    if (ol == 0 || len <= ol || memcmp(v, owner, ol) != 0)
        return 0;
    t = number(&p, end);
    return t > 0 && p < end && *p == ' ' ? t : 0;
}

/* The token of a holder line of ours in a key of the lease's form ("S
 * TOKEN" for a reader, "N PERMITS TOKEN" for a permit, then "\n+ OWNER
 * TOKEN UNTIL_MS DESC" per holder), or 0; *until its end on the server's
 * clock, or -2 for "?" (the key's own end). */
static long long own_line(const dlock__lease *l, const char *v, size_t len,
                          long long *until)
{
    char head[24], needle[96];
    int hl = l->kind == DLOCK__READ
                 ? snprintf(head, sizeof(head), "S ")
                 : snprintf(head, sizeof(head), "N %u ", l->permits);
    int nl = snprintf(needle, sizeof(needle), "\n+ %s ", l->owner);
    const char *end = v + len, *p;
    long long t;

    if (hl <= 0 || nl <= 0 || (size_t)nl >= sizeof(needle) ||
        len < (size_t)hl || memcmp(v, head, (size_t)hl) != 0)
        return 0;
    p = memmem(v, len, needle, (size_t)nl);
    if (!p)
        return 0;
    p += nl;
    t = number(&p, end);
    if (t <= 0 || p >= end || *p++ != ' ' || p >= end)
        return 0;
    if (*p == '?') {
        p++;
        *until = -2;
    } else if ((*until = number(&p, end)) < 0) {
        return 0;
    }
    return p < end && *p == ' ' ? t : 0;
}

/* The server's clock in ms from a TIME reply, rounded up (a lease left
 * counted from it is never long), or -1. */
static long long server_ms(const redisReply *r)
{
    const char *p, *end;
    long long s, us;

    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING ||
        r->element[1]->type != REDIS_REPLY_STRING)
        return -1;
    p = r->element[0]->str;
    end = p + r->element[0]->len;
    s = number(&p, end);
    p = r->element[1]->str;
    end = p + r->element[1]->len;
    us = number(&p, end);
    return s < 0 || us < 0 ? -1 : s * 1000 + (us + 999) / 1000;
}

/* The answer to GET, PTTL [, TIME] of lease l's key, read from before
 * `sent`: DLOCK_OK, DLOCK_EBUSY or DLOCK__REDIS_UNDECIDED. */
static int judge(dlock__lease *l, redisReply **r, int64_t sent,
                 const char *line, size_t id_len)
{
    const char *v;
    size_t len;
    long long pttl, left = -1, t;

    if (r[0]->type != REDIS_REPLY_STRING || r[1]->type != REDIS_REPLY_INTEGER)
        return DLOCK__REDIS_UNDECIDED; /* gone, or not dlock's: the try */
    v = r[0]->str;
    len = r[0]->len;
    pttl = r[1]->integer;
    if (len == 0 || pttl <= 0)
        return DLOCK__REDIS_UNDECIDED;
    int queued = memmem(v, len, line, id_len) != NULL;

    if (l->kind == DLOCK__WRITE) {
        t = own_record(l, v, len);
        left = pttl; /* a writer's lease is the key's */
    } else {
        long long until = -1, now = server_ms(r[2]);
        t = now < 0 ? 0 : own_line(l, v, len, &until);
        left = until == -2 ? pttl : until - now;
    }
    if (t > 0) {
        /* ours, live: a hand-over (or a hold of ours the try would
         * adopt). Its line still queued as well, or too little of its
         * lease left: the try, which drops the one, restarts the other */
        if (queued || left < l->ttl_ms - l->ttl_ms / 3)
            return DLOCK__REDIS_UNDECIDED;
        l->token = (uint64_t)t;
        l->started = sent + left - l->ttl_ms;
        return DLOCK_OK;
    }
    if (!queued || v[0] == '-' || v[0] == '\n')
        return DLOCK__REDIS_UNDECIDED; /* our line gone, or no holder */
    /* another's, our line still waiting: asleep again until the next
     * wake-up or the holder's lease end (a writer's: the key's; readers'
     * or permits': the earliest, as the last try said, if still ahead) */
    int64_t now = dlock__now_ms();
    if (v[0] != 'S' && v[0] != 'N') {
        l->retry_ms = pttl;
        hint_set(l, sent + pttl);
    } else if (hint_get(l) > now) {
        l->retry_ms = hint_get(l) - now;
    } else {
        return DLOCK__REDIS_UNDECIDED;
    }
    return DLOCK_EBUSY;
}

int dlock__redis_confirm(redis_store *rs, dlock__lease *l, int64_t deadline)
{
    char key[KEY_MAX], line[LINE_MAX];
    size_t kl, id_len = 0;
    int n = l->kind == DLOCK__WRITE ? 2 : 3, rc;
    redisReply *r[3];
    rcmd c[3];

    if (!confirmable(rs, l) || !queue_line(l, line, sizeof(line), &id_len))
        return DLOCK__REDIS_UNDECIDED;
    kl = lock_key(rs, l->name, l->name_len, key);
    rcmd_plain(&c[0]);
    rcmd_str(&c[0], "GET");
    rcmd_arg(&c[0], key, kl);
    rcmd_plain(&c[1]);
    rcmd_str(&c[1], "PTTL");
    rcmd_arg(&c[1], key, kl);
    if (n == 3) {
        rcmd_plain(&c[2]);
        rcmd_str(&c[2], "TIME");
    }
    int64_t sent = dlock__now_ms();
    rc = dlock__redis_run(rs, key, kl, c, n, r, deadline);
    if (rc) /* a hand-over that came meanwhile is let go, not kept */
        return dlock__redis_undo_lost_try(rs, l, rc);
    rc = judge(l, r, sent, line, id_len);
    for (int i = 0; i < n; i++)
        freeReplyObject(r[i]);
    return rc;
}
