/* SPDX-License-Identifier: MIT */
/*
 * file_elect.c -- leader election on the file store (docs/design.md,
 * "Leader election"; file.c has the proclaim, a write of the holder
 * record's description under the lock).
 *
 * An observer's watch is inotify on the name's lock file (pathwatch.h):
 * a write to it (a holder's record, a proclaim) and every close of it
 * opened for writing. The kernel closes a holder's descriptors when it
 * dies, which is also when it drops the holder's lock, so a leader's
 * death is an event too; a release only unlocks, so the ring (after a
 * campaign, a proclaim, a resign) opens the file for writing and closes
 * it. Whoever may open the file for writing (the store's user, or group)
 * can ring it, and every event is only a wake-up: the observer reads the
 * file. Reads (the observers' own, inspection) open it read-only, which
 * is not watched.
 *
 * A close is reported before the kernel drops the file's locks (the
 * notification comes first in the descriptor's last close), so an
 * observer woken by a dying holder's close may read the lock still held.
 * So the wait also watches the holder's process itself: a pidfd of the
 * pid in the holder record, readable once the process has exited, its
 * descriptors (and locks) gone. (A holder in another pid namespace, or a
 * child that inherited the holder's open file, is seen by the close
 * events only.)
 */
#include "file_int.h"
#include "pathwatch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef struct file_obs {
    dlock__pathwatch *pw;
    char fname[FNAME_MAX + 8];
} file_obs;

int dlock__file_ring(void *st, const char *name, size_t len,
                     int64_t op_deadline)
{
    file_store *fs = st;
    char fname[FNAME_MAX + 8];
    int fd;

    (void)op_deadline;
    dlock__file_name(name, len, fname);
    fd = openat(fs->dirfd, fname,
                O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT ? DLOCK_OK
                               : dlock__file_io_error("open", fname, errno);
    close(fd); /* IN_CLOSE_WRITE: the observers' wake-up */
    return DLOCK_OK;
}

int dlock__file_obs_open(void *st, const char *name, size_t len, void **out,
                         int64_t op_deadline)
{
    file_store *fs = st;
    file_obs *o = calloc(1, sizeof(*o));

    (void)op_deadline;
    *out = NULL;
    if (!o)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    dlock__file_name(name, len, o->fname);
    size_t n = strlen(fs->dir) + strlen(o->fname) + 2;
    char *path = malloc(n);
    if (!path) {
        free(o);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    snprintf(path, n, "%s/%s", fs->dir, o->fname);
    int rc = dlock__pathwatch_open(path, "file store", &o->pw);
    free(path);
    if (rc) {
        free(o);
        return rc;
    }
    *out = o;
    return DLOCK_OK;
}

int dlock__file_obs_wait(void *st, void *wp, int64_t deadline, int cancel_fd)
{
    file_obs *o = wp;
    int64_t pid = dlock__file_holder_pid(st, o->fname);
    int pfd = -1;

    if (pid > 0) {
        pfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
        if (pfd < 0 && errno == ESRCH)
            return DLOCK_OK; /* the holder is gone: read again */
    }
    int rc = dlock__pathwatch_wait(o->pw, deadline, cancel_fd, pfd);
    if (pfd >= 0)
        close(pfd);
    return rc;
}

void dlock__file_obs_close(void *st, void *wp)
{
    file_obs *o = wp;

    (void)st;
    if (!o)
        return;
    dlock__pathwatch_close(o->pw);
    free(o);
}
