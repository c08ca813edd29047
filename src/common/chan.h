/* SPDX-License-Identifier: MIT */
/*
 * chan.h -- the end of a wake-up channel: a listening Unix socket (a
 * socket file in a directory only the store's user or group may write)
 * that a waiter's successor connects to and sleeps on. The file and SQLite
 * stores make and name their channels each their own way; waking the
 * successor and closing a channel are the same (chan.c).
 */
#ifndef DLOCK_COMMON_CHAN_H
#define DLOCK_COMMON_CHAN_H

/* Pending connections a release accepts and closes at most (only a
 * foreign process connects more than one or two). */
#define DLOCK__CHAN_ACCEPT_MAX 4096

/* Wakes the successor connected to listener lfd, if one is: accepts one
 * pending connection and sends it a byte (its poll() returns). Returns the
 * accepted descriptor, for dlock__chan_close() to close, or -1. Call it
 * after the waited-for lock is let go of. */
int dlock__chan_wake(int lfd);

/* Wakes every successor still connected to lfd and closes it (`woken`:
 * dlock__chan_wake()'s connection, or -1). dlock__chan_end() also removes
 * the listener's socket file from directory wdir first, unless
 * `unlinked` (dlock__chan_unlink() did). */
void dlock__chan_close(int lfd, int woken);
void dlock__chan_end(int wdir, int lfd, int woken, int unlinked);

/* Removes listener lfd's socket file (its name from getsockname()) from
 * directory wdir, so that no one connects any more; lfd stays open. */
void dlock__chan_unlink(int wdir, int lfd);

#endif /* DLOCK_COMMON_CHAN_H */
