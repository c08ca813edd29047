/* SPDX-License-Identifier: MIT */
/*
 * pathwatch.h -- a watch of one file's writes, in the kernel (inotify;
 * pathwatch.c): for the stores that keep a lock in a file on this host
 * (the file store's lock files, SQLite's write-ahead log), whose
 * election observers wait on it (docs/design.md, "Leader election").
 * A file that does not exist yet is watched for through its directory.
 * Never polling: the waiter sleeps in poll() until the kernel wakes it.
 */
#ifndef DLOCK_COMMON_PATHWATCH_H
#define DLOCK_COMMON_PATHWATCH_H

#include <stdint.h>

typedef struct dlock__pathwatch dlock__pathwatch;

/* Watches `path` (a symbolic link is not followed) for writes to it and
 * for closes of it opened for writing (IN_MODIFY, IN_CLOSE_WRITE), or
 * while it is missing, its directory for its creation. DLOCK_OK with
 * *out; DLOCK_ECONN (the system's reason, naming `what`) or
 * DLOCK_ENOMEM. */
int dlock__pathwatch_open(const char *path, const char *what,
                          dlock__pathwatch **out);

/* Waits for such an event (or the file's creation) since the last call,
 * or for extra_fd (-1: none) to be readable: DLOCK_OK; DLOCK_EBUSY at
 * `deadline` (dlock__now_ms() time) or when cancel_fd (-1: none) is
 * readable; DLOCK_ECONN when the watch ended (the file deleted or moved,
 * the kernel's queue overflowed): the caller closes it and opens
 * another. */
int dlock__pathwatch_wait(dlock__pathwatch *w, int64_t deadline,
                          int cancel_fd, int extra_fd);

/* Frees the watch. NULL is fine. */
void dlock__pathwatch_close(dlock__pathwatch *w);

#endif
