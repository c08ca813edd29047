/* SPDX-License-Identifier: MIT */
/*
 * file_operate.c -- dlock_list() on the file store: the lock files of the
 * directory, in the order of their file names, a page at a time.
 *
 * A lock file's name is its lock name with every byte outside
 * [A-Za-z0-9_.-] written %XX (file.c); the name is read back from it. A
 * name too long for a file name was cut and given a hash ("~" and 16 hex
 * digits, '~' itself being always escaped): its full name is read from
 * the holder record inside the file, which every exclusive holder writes.
 * A file whose record names another name, or none (only ever read-held),
 * is listed under what its file name keeps: the cut name and "~HASH".
 *
 * A page scans the directory once and keeps the `limit` smallest file
 * names after the cursor (a heap: memory for one page), then describes
 * each as dlock_inspect() does. The cursor is the last file name looked
 * at. So a page costs one pass over the directory: a store of N locks is
 * walked in N / limit passes (docs/monitoring.md).
 */
#include "file_int.h"

#include "hex.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define SUFFIX ".lock"
#define SUFFIX_LEN 5

typedef struct cand {
    char fname[FNAME_MAX + 8];
    char name[DLOCK_NAME_MAX + 32];
    size_t len;
} cand;

/* A file name the store could have made (and so a valid cursor). */
static int is_lock_fname(const char *s, size_t n)
{
    if (n <= SUFFIX_LEN || n > FNAME_MAX + 6 ||
        memcmp(s + n - SUFFIX_LEN, SUFFIX, SUFFIX_LEN) != 0)
        return 0;
    for (size_t i = 0; i < n - SUFFIX_LEN; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
              (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' ||
              ch == '.' || ch == '%' || ch == '~'))
            return 0;
    }
    return 1;
}

/* The lock name of file `fname` into c->name; 0, or -1 for a file the
 * store did not make (skipped). */
static int name_of(file_store *fs, const char *fname, size_t n, cand *c)
{
    size_t o = 0, end = n - SUFFIX_LEN;
    int cut = 0;

    for (size_t i = 0; i < end; i++) {
        if (fname[i] == '~') {
            cut = 1;
            end = i;
            break;
        }
        if (fname[i] == '%') {
            int hi = i + 2 < end ? dlock__hexval(fname[i + 1]) : -1;
            int lo = i + 2 < end ? dlock__hexval(fname[i + 2]) : -1;
            if (hi < 0 || lo < 0)
                return -1;
            c->name[o++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            c->name[o++] = fname[i];
        }
        if (o > DLOCK_NAME_MAX)
            return -1;
    }
    c->len = o;
    if (cut) {
        char full[DLOCK_NAME_MAX + 1], check[FNAME_MAX + 8];
        size_t flen = 0;
        if (dlock__file_rec_name(fs, fname, full, &flen) == DLOCK_OK) {
            dlock__file_name(full, flen, check);
            if (!strcmp(check, fname)) {
                memcpy(c->name, full, flen);
                c->len = flen;
                return 0;
            }
        }
        /* the name is not known: the file name's rest stands for it */
        size_t rest = n - SUFFIX_LEN - end;
        if (o + rest > sizeof(c->name))
            return -1;
        memcpy(c->name + o, fname + end, rest);
        c->len = o + rest;
    }
    return 0;
}

/* The heap of the smallest file names: the largest on top. */
static void sift_down(cand **h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && strcmp(h[l]->fname, h[m]->fname) > 0)
            m = l;
        if (r < n && strcmp(h[r]->fname, h[m]->fname) > 0)
            m = r;
        if (m == i)
            return;
        cand *t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

static void sift_up(cand **h, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (strcmp(h[i]->fname, h[p]->fname) <= 0)
            return;
        cand *t = h[i];
        h[i] = h[p];
        h[p] = t;
        i = p;
    }
}

static int by_fname(const void *a, const void *b)
{
    return strcmp((*(cand *const *)a)->fname, (*(cand *const *)b)->fname);
}

/* Scans the directory: the `limit` smallest lock files after `cursor`
 * whose names start with the prefix, into h[0..*n) (sorted). */
static int scan(file_store *fs, const char *prefix, size_t plen,
                const char *cursor, size_t limit, cand **h, size_t *n,
                cand *spare)
{
    /* a description of its own: a dup() would share the directory's
     * offset with every other listing of this client, and two threads
     * listing at once would each skip what the other read */
    int fd = openat(fs->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d;
    struct dirent *de;

    *n = 0;
    if (fd < 0)
        return dlock__file_io_error("read", fs->dir, errno);
    d = fdopendir(fd);
    if (!d) {
        int err = errno;
        close(fd);
        return dlock__file_io_error("read", fs->dir, err);
    }
    errno = 0;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (!is_lock_fname(de->d_name, len) ||
            strcmp(de->d_name, cursor) <= 0)
            continue;
        if (*n == limit && strcmp(de->d_name, h[0]->fname) >= 0)
            continue; /* not among the smallest */
        memcpy(spare->fname, de->d_name, len + 1);
        if (name_of(fs, de->d_name, len, spare) != 0 ||
            spare->len < plen || memcmp(spare->name, prefix, plen) != 0)
            continue;
        if (*n < limit) {
            cand *t = h[*n];
            h[*n] = spare;
            sift_up(h, *n);
            (*n)++;
            spare = t;
        } else {
            cand *t = h[0];
            h[0] = spare;
            sift_down(h, limit, 0);
            spare = t;
        }
        errno = 0;
    }
    int err = errno;
    closedir(d);
    if (err)
        return dlock__file_io_error("read", fs->dir, err);
    qsort(h, *n, sizeof(*h), by_fname);
    return DLOCK_OK;
}

int dlock__file_list(void *st, const char *prefix, size_t plen,
                     const char *cursor, size_t limit, unsigned flags,
                     dlock_list_page *out, int64_t op_deadline)
{
    file_store *fs = st;
    cand *pool, **h;
    size_t n = 0;
    int rc;

    (void)op_deadline; /* local files: no round trip to bound */
    if (cursor[0] && !is_lock_fname(cursor, strlen(cursor)))
        return dlock__err(DLOCK_EINVAL,
                          "file store: not a cursor of this store's "
                          "listing");
    /* limit + 1 candidates: the heap's, and a spare to fill */
    pool = malloc((limit + 1) * sizeof(*pool));
    h = malloc((limit + 1) * sizeof(*h));
    if (!pool || !h) {
        free(pool);
        free(h);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i <= limit; i++)
        h[i] = &pool[i];
    rc = scan(fs, prefix, plen, cursor, limit, h, &n, h[limit]);
    for (size_t i = 0; rc == DLOCK_OK && i < n; i++) {
        dlock_info in;
        memset(&in, 0, sizeof(in));
        in.ttl_ms = in.held_ms = in.waiters = -1;
        rc = dlock__file_inspect_fname(fs, h[i]->fname, &in);
        if (rc == DLOCK_EPROTO) {
            /* not a lock file (a stray file, a foreign one): not listed;
             * dlock_inspect() of its name says what is wrong */
            dlock_info_clear(&in);
            rc = DLOCK_OK;
            continue;
        }
        if (rc)
            break;
        if (in.held || in.waiters > 0 || (flags & DLOCK_LIST_FREE))
            rc = dlock__list_add(out, h[i]->name, h[i]->len, &in);
        else
            dlock_info_clear(&in);
    }
    if (rc == DLOCK_OK && n == limit) {
        out->next = strdup(h[n - 1]->fname);
        if (!out->next)
            rc = dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    free(pool);
    free(h);
    return rc;
}
