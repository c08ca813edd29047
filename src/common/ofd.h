/* SPDX-License-Identifier: MIT */
/*
 * ofd.h -- one open file description lock call (Linux OFD locks: owned by
 * the open file, not the process, so threads of one process conflict like
 * processes). Shared by the file and SQLite stores.
 */
#ifndef DLOCK_COMMON_OFD_H
#define DLOCK_COMMON_OFD_H

#include <fcntl.h>
#include <string.h>
#include <sys/types.h>

/* An F_OFD_SETLK(W) (or GETLK) of `type` on [start, start + len): fcntl()'s
 * answer (0, or -1 with errno). */
static inline int dlock__ofd_lk(int fd, int cmd, short type, off_t start,
                                off_t len)
{
    struct flock fl;

    memset(&fl, 0, sizeof(fl));
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = len;
    return fcntl(fd, cmd, &fl);
}

/* The first lock held by another open file in [start, end) that would
 * conflict with a lock of `type` (F_WRLCK: any lock; F_RDLCK: a write
 * lock), as F_OFD_GETLK reports it, into *fl: 0, or -1 when there is
 * none (or the call failed). */
static inline int dlock__ofd_getlk(int fd, short type, off_t start,
                                   off_t end, struct flock *fl)
{
    memset(fl, 0, sizeof(*fl));
    fl->l_type = type;
    fl->l_whence = SEEK_SET;
    fl->l_start = start;
    fl->l_len = end - start;
    if (end <= start || fcntl(fd, F_OFD_GETLK, fl) != 0 ||
        fl->l_type == F_UNLCK)
        return -1;
    return 0;
}

/* Start of a lock held by another open file in [start, end) that would
 * conflict with a lock of `type` (F_WRLCK: any lock; F_RDLCK: a write
 * lock), or -1; *held (may be NULL) gets its type. */
static inline off_t dlock__ofd_conflict(int fd, short type, off_t start,
                                        off_t end, short *held)
{
    struct flock fl;

    if (dlock__ofd_getlk(fd, type, start, end, &fl) != 0)
        return -1;
    if (held)
        *held = fl.l_type;
    return fl.l_start < start ? start : fl.l_start;
}

/* Start of a lock held by another open file in [start, end), or -1. */
static inline off_t dlock__ofd_first(int fd, off_t start, off_t end)
{
    return dlock__ofd_conflict(fd, F_WRLCK, start, end, NULL);
}

#endif /* DLOCK_COMMON_OFD_H */
