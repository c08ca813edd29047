/* SPDX-License-Identifier: MIT */
/*
 * kwait.h -- kernel waits with a deadline and a cancel (kwait.c): for an
 * OFD lock byte, or for any of several. Never polling: the caller sleeps
 * in poll() until the kernel wakes it. Deadlines are dlock__now_ms()
 * times (DLOCK__FOREVER: none); `cfd` is a dlock_cancel() eventfd (-1:
 * none), whose readability ends the wait as its deadline would.
 */
#ifndef DLOCK_COMMON_KWAIT_H
#define DLOCK_COMMON_KWAIT_H

#include "ofd.h"

#include <stdint.h>
#include <sys/types.h>

/* Sleeps in poll() until fd (and cfd, when >= 0) is readable, or the
 * deadline: 1 when fd is (its events in *revents, which may be NULL), 0 at
 * the deadline or when cfd is, or a negative errno. */
int dlock__poll_until(int fd, int cfd, int64_t deadline, short *revents);

/* Blocks until open file `fd` holds a lock of `type` on `byte`, or
 * `deadline` passes, or `cfd` is readable. 0: taken; ETIMEDOUT (deadline
 * or cancel); or an errno. Without a deadline or a cancel the calling
 * thread blocks itself; else a helper thread blocks, and is cancelled. */
int dlock__kwait(int fd, short type, off_t byte, int64_t deadline, int cfd);

/* Blocks until any byte of `bytes` (nb of them, none locked through fd)
 * is free of every lock (each waited for with a write lock in a helper
 * thread, then unlocked), or one of `fds` is readable, or the deadline,
 * or a cancel through cfd. 0: something happened (look again);
 * ETIMEDOUT (the deadline or the cancel); or an errno. */
int dlock__kwait_any(int fd, const off_t *bytes, int nb, const int *fds,
                     int nfds, int64_t deadline, int cfd);

/* Makes the one-shot timerfd `fd` (a store's background thread sleeps on
 * it) fire within `in_ms` milliseconds (at least 1): armed for then,
 * unless it is armed to fire sooner already (the thread arms it again for
 * what is due next when it runs). */
void dlock__timer_within(int fd, int64_t in_ms);

#endif /* DLOCK_COMMON_KWAIT_H */
