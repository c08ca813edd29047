/* SPDX-License-Identifier: MIT */
/*
 * sqlite_elect.c -- leader election on SQLite (docs/design.md, "Leader
 * election"): the proclaim, and an observer's watch; and the store's
 * check (dlock doctor), a look at the file system under it.
 *
 * Proclaim: one UPDATE of the holder's row (S_PROCLAIM), guarded as a
 * renewal is (owner, token, lease not over). An observer's watch: inotify
 * on the sidecar (pathwatch.h), which holds no data: the ring (after a
 * campaign, a proclaim, a resign, once the write is committed) opens it
 * for writing and closes it. Not the write-ahead log: its first write
 * comes before the commit is visible (the log's index is in shared
 * memory, which no event reports), so an observer woken by it may read
 * the state before and miss the change. A leader that dies writes
 * nothing: its lease's end, which the observer reads, ends the observer's
 * wait (watch_sees_expiry is 0). Only whoever may open the sidecar for
 * writing (the store's user, or group) can wake an observer, and a
 * wake-up is a hint: the observer reads the row.
 */
#include "sqlite_int.h"
#include "fscheck.h"
#include "pathwatch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int dlock__sq_proclaim(void *st, dlock__lease *l, const char *desc,
                       int64_t op_deadline)
{
    return dlock__sq_guarded(st, S_PROCLAIM, l, 0, desc, op_deadline,
                             "writing the leader's value");
}

/* dlock_client_check() (here, beside the other files' slots of the
 * store's newer parts): the file system under the database. */
int dlock__sq_check(void *st, int64_t ttl_ms, dlock_check *out,
                    int64_t op_deadline)
{
    sq_store *ss = st;
    char what[300];

    (void)ttl_ms;
    (void)op_deadline;
    snprintf(what, sizeof(what), "the database's sidecar %.250s", ss->side);
    return dlock__fs_check(
        ss->sidefd, "sqlite", what,
        "SQLite's write-ahead log needs memory shared between the "
        "processes (DB-shm), which NFS does not give across hosts, and its "
        "locks there are not the kernel's own",
        out);
}

int dlock__sq_ring(void *st, const char *name, size_t len,
                   int64_t op_deadline)
{
    sq_store *ss = st;
    int fd;

    (void)name;
    (void)len;
    (void)op_deadline;
    fd = open(ss->side, O_WRONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return dlock__err(DLOCK_ECONN, "sqlite %s: opening %s: %s",
                          ss->redacted, ss->side, strerror(errno));
    close(fd); /* IN_CLOSE_WRITE: the observers' wake-up (OFD locks stay) */
    return DLOCK_OK;
}

int dlock__sq_watch_open(void *st, const char *name, size_t len, void **out,
                         int64_t op_deadline)
{
    sq_store *ss = st;
    dlock__pathwatch *w = NULL;

    (void)name;
    (void)len;
    (void)op_deadline;
    int rc = dlock__pathwatch_open(ss->side, "sqlite", &w);
    *out = w;
    return rc;
}

int dlock__sq_watch_wait(void *st, void *w, int64_t deadline, int cancel_fd)
{
    (void)st;
    return dlock__pathwatch_wait(w, deadline, cancel_fd, -1);
}

void dlock__sq_watch_close(void *st, void *w)
{
    (void)st;
    dlock__pathwatch_close(w);
}
