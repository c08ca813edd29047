/* SPDX-License-Identifier: MIT */
/*
 * fscheck.h -- dlock doctor's look at the file system under a store that
 * keeps its locks in files on this host (the file store's directory,
 * SQLite's database; fscheck.c).
 */
#ifndef DLOCK_COMMON_FSCHECK_H
#define DLOCK_COMMON_FSCHECK_H

struct dlock_check;

/* Adds a finding when open file (or directory) `fd` is on NFS or on
 * overlayfs: `check` then "-on-nfs" or "-on-overlayfs" names it, `what`
 * says what is there ("the lock directory", "the database"), `nfs_why`
 * what breaks on NFS; a note when fstatfs() fails. DLOCK_OK or
 * DLOCK_ENOMEM. */
int dlock__fs_check(int fd, const char *check, const char *what,
                    const char *nfs_why, struct dlock_check *out);

#endif
