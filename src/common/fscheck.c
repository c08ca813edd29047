/* SPDX-License-Identifier: MIT */
/*
 * fscheck.c -- the file system under a store's files (fscheck.h).
 */
#include "fscheck.h"

#include "store.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/vfs.h>

#define NFS_SUPER_MAGIC 0x6969
#define OVERLAYFS_SUPER_MAGIC 0x794c7630UL

int dlock__fs_check(int fd, const char *check, const char *what,
                    const char *nfs_why, struct dlock_check *out)
{
    struct statfs sf;
    char code[64], text[512];

    if (fstatfs(fd, &sf) != 0) {
        dlock__check_note(out, "the file system of %s: %s", what,
                          strerror(errno));
        return DLOCK_OK;
    }
    if (sf.f_type == NFS_SUPER_MAGIC) {
        snprintf(code, sizeof(code), "%s-on-nfs", check);
        snprintf(text, sizeof(text), "%s is on NFS: %s", what, nfs_why);
        return dlock__check_finding(
            out, code, text,
            "use a local directory for locks of one host, or a network "
            "store (redis://, postgres://, ...) for locks across hosts");
    }
    if ((unsigned long)sf.f_type == OVERLAYFS_SUPER_MAGIC) {
        snprintf(code, sizeof(code), "%s-on-overlayfs", check);
        snprintf(text, sizeof(text),
                 "%s is on overlayfs (a container's root): each container "
                 "sees files of its own, so processes in two containers do "
                 "not exclude each other",
                 what);
        return dlock__check_finding(
            out, code, text,
            "put it on a volume that every locking process mounts (a bind "
            "mount), or use a network store");
    }
    return DLOCK_OK;
}
