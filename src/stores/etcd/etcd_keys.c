/* SPDX-License-Identifier: MIT */
/*
 * etcd_keys.c -- the keys the etcd store's client uses (etcd.c is the lock
 * protocol, etcd_int.h what the files share): a lock's range of keys (its
 * escaped name), the client's reservations of the keys it holds, waits
 * on or must still delete, and our holds' keys watched for their
 * deletion on the client's stream. Below the lock protocol, the
 * operator's view, the background thread (etcd_lease.c, which runs the
 * checks of our keys) and the watch stream (etcd_wait.c, which reports
 * the deletions), which all use them.
 *
 * A held key deleted (by a break, etcd_operate.c, or by hand): the client
 * keeps one lease alive for all its holds (a keepalive knows nothing of
 * keys), so the key's deletion is learned from the client's watch stream
 * (its one watch on the prefix, deletions only): a DELETE of a held key,
 * at a revision above its creation, that our release did not cause is a
 * loss told to the core. A hold is linked before its key is put, so no
 * deletion after the put is missed; a hold's key is "covered" by a stream
 * generation that began before the key was put, or before a read that
 * found the key. While the client holds keys the stream stays up (the
 * background thread opens it again after a break, backing off while it
 * cannot); a hold it cannot say is covered (taken while the stream was
 * down, or the stream broke since) gets a read of its key once the stream
 * is up: gone is a loss. And dlock_extend() compares its key's create
 * revision (etcd.c): a hold whose key went is told there too.
 */
#include "etcd_int.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* A lock's keys, and the ones this client uses                             */
/* ------------------------------------------------------------------------ */

/* The range of lock `name`: prefix + escaped name + "/". */
size_t dlock__etcd_lock_base(const etcd_store *es, const char *name,
                             size_t len, char *out)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = es->prefix_len;

    memcpy(out, es->prefix, o);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (ch == '/' || ch == '%') {
            out[o++] = '%';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        } else {
            out[o++] = (char)ch;
        }
    }
    out[o++] = '/';
    out[o] = '\0';
    return o;
}

static int slots_grow(etcd_store *es)
{
    size_t n = es->nbuckets ? es->nbuckets * 2 : 64;
    etcd_slot **b = calloc(n, sizeof(*b));

    if (!b)
        return -1;
    for (size_t i = 0; i < es->nbuckets; i++) {
        etcd_slot *s = es->slots[i];
        while (s) {
            etcd_slot *next = s->next;
            s->next = b[s->hash & (n - 1)];
            b[s->hash & (n - 1)] = s;
            s = next;
        }
    }
    free(es->slots);
    es->slots = b;
    es->nbuckets = n;
    return 0;
}

/* Reserves `key`: 0 when it was free, 1 when in use, -1 out of memory.
 * es->mu held. */
int dlock__etcd_slot_take(etcd_store *es, const char *key, size_t len)
{
    uint64_t h = dlock__hash(key, len);
    etcd_slot *s;

    if (es->nslots >= es->nbuckets && slots_grow(es) != 0)
        return -1;
    for (s = es->slots[h & (es->nbuckets - 1)]; s; s = s->next)
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len))
            return 1;
    s = malloc(sizeof(*s) + len);
    if (!s)
        return -1;
    s->hash = h;
    s->len = len;
    memcpy(s->key, key, len);
    s->next = es->slots[h & (es->nbuckets - 1)];
    es->slots[h & (es->nbuckets - 1)] = s;
    es->nslots++;
    return 0;
}

/* es->mu held. */
void dlock__etcd_slot_drop(etcd_store *es, const char *key, size_t len)
{
    uint64_t h = dlock__hash(key, len);

    if (!es->nbuckets)
        return;
    for (etcd_slot **pp = &es->slots[h & (es->nbuckets - 1)]; *pp;
         pp = &(*pp)->next) {
        etcd_slot *s = *pp;
        if (s->hash == h && s->len == len && !memcmp(s->key, key, len)) {
            *pp = s->next;
            free(s);
            es->nslots--;
            return;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Our holds' keys, watched for their deletion                              */
/* ------------------------------------------------------------------------ */

void dlock__etcd_mine_link(etcd_store *es, etcd_hold *eh)
{
    pthread_mutex_lock(&es->mu);
    eh->mid = ++es->next_mid;
    eh->held = eh->releasing = eh->gone = eh->tell = 0;
    eh->mrev = eh->mdel = 0;
    /* a stream up now began before our key is put */
    eh->mgen = es->sstate == ST_UP ? es->sgen : 0;
    eh->mprev = NULL;
    eh->mnext = es->mine;
    if (es->mine)
        es->mine->mprev = eh;
    es->mine = eh;
    eh->linked = 1;
    pthread_mutex_unlock(&es->mu);
}

void dlock__etcd_mine_unlink(etcd_store *es, etcd_hold *eh)
{
    pthread_mutex_lock(&es->mu);
    if (eh->linked) {
        if (eh->mprev)
            eh->mprev->mnext = eh->mnext;
        else
            es->mine = eh->mnext;
        if (eh->mnext)
            eh->mnext->mprev = eh->mprev;
        eh->mnext = eh->mprev = NULL;
        eh->linked = 0;
        if (!es->mine && !es->waiters)
            es->s_idle = dlock__now_ms();
    }
    pthread_mutex_unlock(&es->mu);
}

void dlock__etcd_mine_rev(etcd_store *es, etcd_hold *eh, int64_t rev)
{
    pthread_mutex_lock(&es->mu);
    eh->mrev = rev;
    if (rev > 0 && eh->mdel > rev)
        eh->gone = 1; /* deleted after its put, before we knew its rev */
    pthread_mutex_unlock(&es->mu);
}

void dlock__etcd_mine_seen(etcd_store *es, etcd_hold *eh, uint64_t gen)
{
    pthread_mutex_lock(&es->mu);
    if (gen && !eh->gone)
        eh->mgen = gen;
    pthread_mutex_unlock(&es->mu);
}

/* Does the current stream report our key's deletion? es->mu held. */
int dlock__etcd_mine_covered(const etcd_store *es, const etcd_hold *eh)
{
    return eh->mgen && eh->mgen == es->sgen && es->sstate == ST_UP;
}

int dlock__etcd_mine_hold(etcd_store *es, etcd_hold *eh)
{
    int gone, cover;

    pthread_mutex_lock(&es->mu);
    gone = eh->gone;
    if (!gone)
        eh->held = 1;
    cover = !gone && !dlock__etcd_mine_covered(es, eh);
    pthread_mutex_unlock(&es->mu);
    if (cover)
        dlock__loop_wake(es->client); /* the stream up, our key checked */
    return gone ? -1 : 0;
}

void dlock__etcd_mine_releasing(etcd_store *es, etcd_hold *eh)
{
    pthread_mutex_lock(&es->mu);
    eh->releasing = 1;
    pthread_mutex_unlock(&es->mu);
}

/* Our key went (es->mu held): a loss to tell when held. */
int dlock__etcd_mine_gone(etcd_hold *eh)
{
    eh->gone = 1;
    if (!eh->held || eh->releasing || eh->tell)
        return 0;
    eh->tell = 1;
    eh->lease_checked = 0;
    eh->tell_at = dlock__now_ms();
    eh->tell_until = eh->tell_at + MINE_TELL_FOR_MS;
    return 1;
}

int dlock__etcd_mine_deleted(etcd_store *es, const char *key_b64,
                             int64_t rev)
{
    char key[ETCD_KEY_MAX + 2];
    long n;
    int tell = 0;

    if (!es->mine)
        return 0;
    n = dlock__etcd_b64_decode(key_b64, key, sizeof(key));
    if (n <= 0 || (size_t)n > ETCD_KEY_MAX)
        return 0;
    for (etcd_hold *eh = es->mine; eh; eh = eh->mnext) {
        if (eh->key_len != (size_t)n || memcmp(eh->key, key, (size_t)n))
            continue;
        if (eh->mrev <= 0) {
            /* our put's revision is not known yet: an older key of
             * the same name went before it, or ours after it */
            if (rev > eh->mdel)
                eh->mdel = rev;
        } else if (rev > eh->mrev) {
            tell |= dlock__etcd_mine_gone(eh);
        }
    }
    return tell;
}
