/* SPDX-License-Identifier: MIT */
/*
 * perm.c -- who may open the files a store makes (perm.h): ?group= and
 * the modes of files found. Shared by the file store (its lock files and
 * directories) and the SQLite store (database, sidecar, channels).
 */
#include "perm.h"

#include "store.h"

#include <errno.h>
#include <grp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

int dlock__perm_group(const char *what, const char *v, int root_any,
                      gid_t *gid)
{
    struct group gr, *grr = NULL;
    char buf[16384], *end;
    gid_t *groups;
    int n, r = 0, member = 0;

    if (!*v)
        return dlock__err(DLOCK_EINVAL, "%s needs a group name", what);
    errno = 0;
    unsigned long num = strtoul(v, &end, 10);
    if (*end == '\0' && errno == 0 && num < (unsigned long)(gid_t)-1) {
        *gid = (gid_t)num;
    } else if ((r = getgrnam_r(v, &gr, buf, sizeof(buf), &grr)) == 0 &&
               grr) {
        *gid = gr.gr_gid;
    } else {
        return dlock__err(DLOCK_EINVAL, "%s: no group '%.64s' on this host%s",
                          what, v,
                          r == ERANGE ? " (its entry is too long)" : "");
    }
    if ((root_any && geteuid() == 0) || getegid() == *gid)
        return DLOCK_OK;
    n = getgroups(0, NULL);
    groups = n > 0 ? calloc((size_t)n, sizeof(*groups)) : NULL;
    if (groups)
        n = getgroups(n, groups);
    for (int i = 0; groups && i < n; i++)
        member |= groups[i] == *gid;
    free(groups);
    if (member)
        return DLOCK_OK;
    return dlock__err(DLOCK_EINVAL,
                      "%s: you are not a member of group '%.64s' (gid %lu), "
                      "so you could not give it the store's files",
                      what, v, (unsigned long)*gid);
}

int dlock__perm_adopt(int fd, uid_t uid, gid_t fgid, mode_t fmode, int made,
                      gid_t gid, mode_t mode)
{
    if (made || uid == geteuid()) {
        if (gid != (gid_t)-1 && fgid != gid && fchown(fd, (uid_t)-1, gid) != 0)
            return DLOCK__ADOPT_CHGRP;
        if ((fmode & 07777) != mode && fchmod(fd, mode) != 0)
            return DLOCK__ADOPT_CHMOD;
        return DLOCK__ADOPT_OK;
    }
    if (gid == (gid_t)-1)
        return DLOCK__ADOPT_UNSHARED;
    if (fgid != gid)
        return DLOCK__ADOPT_GROUP;
    if (fmode & 007)
        return DLOCK__ADOPT_OTHERS;
    if ((mode & S_ISVTX) && !(fmode & S_ISVTX))
        return DLOCK__ADOPT_STICKY;
    return DLOCK__ADOPT_OK;
}
