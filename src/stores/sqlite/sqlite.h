/* SPDX-License-Identifier: MIT */
/*
 * sqlite.h -- what the SQLite store's two halves share: sqlite.c, the
 * store (the lock table, its statements, the backend's slots), and
 * sqlite_wait.c, its waits in the kernel through the sidecar file
 * `<db>-dlock` (docs/design.md, "SQLite: waking waiters").
 */
#ifndef DLOCK_SQLITE_H
#define DLOCK_SQLITE_H

#include "internal.h"

#include <stdint.h>
#include <sys/types.h>

/* A lock name's region of the sidecar: byte 0 guards ticket taking,
 * byte t (1 .. SQW_TICKETS - 1) is held by the owner of ticket t. */
#define SQW_REGION_SHIFT 32
#define SQW_TICKETS ((off_t)1 << SQW_REGION_SHIFT)
#define SQW_REGIONS ((int64_t)1 << 30) /* rowids above wrap around */
/* Region 0 is no lock's (rowids start at 1). Its byte 1 is the writers'
 * turn: every statement that writes takes it (a write lock, woken by the
 * kernel) before SQLite's own write lock, so that dlock's clients never
 * meet in SQLite's busy handler, which sleeps and retries. */
#define SQW_WRITER 1
/* The region's last byte is no ticket: a head that waits for a holder
 * without a ticket holds it shared ("the holder is not in the queue"). */
#define SQW_MARK (SQW_TICKETS - 1)

/* One acquisition's kernel side: its own open file description of the
 * sidecar (OFD locks belong to it), its ticket and wake-up channel. */
typedef struct sq_wait {
    int fd;         /* the sidecar, or -1 */
    int lfd;        /* the ticket's channel (listener), or -1 */
    int bfd;        /* the ticket's doorbell (datagrams), or -1 */
    dev_t dev;      /* the sidecar's identity, for channel names */
    ino_t ino;
    int64_t region; /* the name's rowid */
    off_t base;     /* region's first byte */
    off_t ticket;   /* ticket byte, or -1 */
} sq_wait;

/* What a wait on a predecessor ended with. */
enum { SQW_TIMEOUT, SQW_HANDED, SQW_LEFT };

/* Opens (creating it with `mode`) the sidecar at `path`: its descriptor,
 * or -1 with errno set. */
int dlock__sqw_open(const char *path, mode_t mode, dev_t *dev, ino_t *ino);

/* Takes a ticket in w->region on w->fd and locks its byte, making its
 * channel (for its successors) and doorbell (for a predecessor without a
 * channel to ring) first. 0 or an errno. Only acquisitions that find a
 * queue or the lock busy take one. */
int dlock__sqw_take(sq_wait *w);

/* Does anyone hold (or take) a ticket in the region of `rowid`, as seen
 * through fd (which holds none)? One system call: the uncontended
 * acquisition's only one before its statement. */
int dlock__sqw_queued(int fd, int64_t rowid);

/* Rings the doorbell of the lowest ticket in the region of `rowid` (the
 * release of a hold taken without a ticket), through fd (holding none),
 * the sidecar `dev`/`ino`. */
void dlock__sqw_ring_head(int fd, dev_t dev, ino_t ino, int64_t rowid);


/* The highest ticket below w's still held, or -1 (w is the head). */
off_t dlock__sqw_pred(const sq_wait *w);

/* Is ticket byte p held by another open file? */
int dlock__sqw_held(const sq_wait *w, off_t p);

/* Number of tickets held in the region of `rowid`, as seen through fd
 * (which holds none), at most `max`. */
int64_t dlock__sqw_count(int fd, int64_t rowid, int64_t max);

/* A trusted connection to the channel of ticket byte p (its listener has
 * our uid and p is still held after connecting), or -1. */
int dlock__sqw_connect(const sq_wait *w, off_t p);

/* Sleeps until the predecessor p (on connection c, or in the kernel on
 * p's byte when c < 0) hands over or leaves, or until `until`. SQW_* or
 * a negative errno. */
int dlock__sqw_wait(const sq_wait *w, int c, off_t p, int64_t until);

/* A head whose holder has no ticket it can see: sleeps on w's doorbell
 * (the holder's release rings it) until `until`. SQW_LEFT (rung: try
 * again), SQW_TIMEOUT, or a negative errno. */
int dlock__sqw_bell(const sq_wait *w, int64_t until);

/* Is the mark of the region of `rowid` held (a head waits for a holder
 * without a ticket), as seen through fd? */
int dlock__sqw_marked(int fd, int64_t rowid);

/* Sleeps until `until` (nothing to wait on). */
void dlock__sqw_sleep(int64_t until);

/* Drops w's ticket and channel and closes their descriptors; returns the
 * sidecar's, unlocked, for the caller to keep or close. `wake`: the
 * lock was held and is now free in the table: the successor connected to
 * the channel gets one byte and the CPU. Without one connected, the next
 * ticket's doorbell is rung (a give-up too: it looks again). */
int dlock__sqw_drop(sq_wait *w, int wake);

#endif /* DLOCK_SQLITE_H */
