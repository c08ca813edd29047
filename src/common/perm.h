/* SPDX-License-Identifier: MIT */
/*
 * perm.h -- who may open what a store makes on the local file system
 * (perm.c; docs/stores.md, "Who can open a lock file"): the ?group=
 * parameter and the adoption of a file or directory found.
 */
#ifndef DLOCK_COMMON_PERM_H
#define DLOCK_COMMON_PERM_H

#include <sys/types.h>

/* ?group=NAME (a name or a number): *gid, when the calling process is a
 * member (its effective or a supplementary group), or root and
 * `root_any` (the file store's rule; the SQLite store asks root to be a
 * member too); else DLOCK_EINVAL, the message starting with `what` (the
 * store's words for the parameter). */
int dlock__perm_group(const char *what, const char *v, int root_any,
                      gid_t *gid);

/* What dlock__perm_adopt() found. */
enum {
    DLOCK__ADOPT_OK,       /* ours, given the mode; or another's we may use */
    DLOCK__ADOPT_CHGRP,    /* ours: fchown() failed (errno) */
    DLOCK__ADOPT_CHMOD,    /* ours: fchmod() failed (errno) */
    DLOCK__ADOPT_UNSHARED, /* another user's, and the store is no group's */
    DLOCK__ADOPT_GROUP,    /* another user's, of another group */
    DLOCK__ADOPT_OTHERS,   /* another user's, open to others */
    DLOCK__ADOPT_STICKY    /* another user's, not sticky (`mode` is) */
};

/* Who may open a file or directory that a store opened as fd (uid, fgid,
 * fmode: its owner, group and mode; `made`: this process created it), in
 * a store whose files get `mode` and group `gid` ((gid_t)-1: none, its
 * user's alone). Ours is given exactly that mode and group (the umask, an
 * older dlock or another ?group= may have left others); another user's
 * is used as it is only in a group store, when it has that group, gives
 * others nothing and, when `mode` is sticky, is sticky too (its owner
 * could otherwise let others in). Sets no message. */
int dlock__perm_adopt(int fd, uid_t uid, gid_t fgid, mode_t fmode, int made,
                      gid_t gid, mode_t mode);

#endif /* DLOCK_COMMON_PERM_H */
