/* SPDX-License-Identifier: MIT */
/*
 * file_perm.c -- who may open a store's files: modes, ?group=, the
 * private path walk, the channels' directory.
 *
 * What dlock makes is its user's alone (lock files 0600, directories
 * 0700), or a group's with ?group=NAME (0660 and 02770, group NAME);
 * what it finds of its own is given that mode, and another user's is
 * used only in a group store, when it is of that group and closed to
 * others (docs/stores.md, "Who can open a lock file"). A private store
 * (?private=1, the default store) is reached through a path that nobody
 * else could have changed (docs/stores.md, "The default store"). The
 * SQLite store's files follow the same rules through the first section's
 * two functions (host functions: sqlite.so calls them).
 */
#include "file_int.h"

#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* The file store's files and directories                                   */
/* ------------------------------------------------------------------------ */

/* Below every other file of the store: each reports a failed system call
 * on one of its files with this. */
int dlock__file_io_error(const char *what, const char *fname, int err)
{
    if (err == EACCES || err == EPERM || err == EROFS)
        return dlock__err(DLOCK_EAUTH, "file store: %s %.200s: %s", what,
                          fname, strerror(err));
    if (err == ENOMEM)
        return dlock__err(DLOCK_ENOMEM, "file store: %s: out of memory",
                          what);
    if (err == ELOOP)
        return dlock__err(DLOCK_EPROTO,
                          "file store: %.200s is a symbolic link; refusing "
                          "to follow it",
                          fname);
    return dlock__err(DLOCK_ECONN, "file store: %s %.200s: %s", what, fname,
                      strerror(err));
}


/* A lock file an acquirer opened (fd; id: its statx; `created`: by this
 * call): who may open it. Ours: given the store's mode (and group) if it
 * has another, so that files made by an older dlock (0666 & ~umask) or
 * under a narrower umask are closed to others at their owner's next use.
 * Another user's: refused, unless the store is a group's and the file is
 * that group's and closed to others (docs/stores.md, "Who can open a
 * lock file"). */
int dlock__file_own(file_store *fs, int fd, const char *fname,
                    const file_id *id, int created)
{
    switch (dlock__perm_adopt(fd, id->uid, id->gid, id->mode, created,
                              fs->group ? fs->gid : (gid_t)-1, fs->fmode)) {
    case DLOCK__ADOPT_OK:
        return DLOCK_OK;
    case DLOCK__ADOPT_CHGRP:
        return dlock__file_io_error("chgrp", fname, errno);
    case DLOCK__ADOPT_CHMOD:
        return dlock__file_io_error("chmod", fname, errno);
    case DLOCK__ADOPT_UNSHARED:
        return dlock__err(DLOCK_EAUTH,
                          "file store: %.200s belongs to uid %lu, not to you "
                          "(uid %lu): its owner decides who may open it; a "
                          "store users share takes ?group=NAME",
                          fname, (unsigned long)id->uid,
                          (unsigned long)geteuid());
    case DLOCK__ADOPT_GROUP:
        return dlock__err(DLOCK_EAUTH,
                          "file store: %.200s belongs to group %lu, not to the "
                          "store's (%lu); its owner (uid %lu) can chgrp it",
                          fname, (unsigned long)id->gid,
                          (unsigned long)fs->gid, (unsigned long)id->uid);
    default: /* DLOCK__ADOPT_OTHERS (fmode has no sticky bit) */
        return dlock__err(DLOCK_EAUTH,
                          "file store: %.200s may be opened by others (mode "
                          "%04o), who could then keep it locked; its owner "
                          "(uid %lu) can chmod o-rwx it",
                          fname, (unsigned)(id->mode & 07777),
                          (unsigned long)id->uid);
    }
}

/* dlock__perm_adopt() of a directory (fd; st: its fstat; `shown` its
 * path) with the store's directory mode and group: its answer, and *rc
 * the error of a failed chgrp or chmod (else left alone). */
static int adopt_dir(file_store *fs, int fd, const struct stat *st,
                     const char *shown, int *rc)
{
    int a = dlock__perm_adopt(fd, st->st_uid, st->st_gid, st->st_mode, 0,
                              fs->group ? fs->gid : (gid_t)-1, fs->dmode);

    if (a == DLOCK__ADOPT_CHGRP || a == DLOCK__ADOPT_CHMOD)
        *rc = dlock__file_io_error(a == DLOCK__ADOPT_CHGRP ? "chgrp"
                                                           : "chmod",
                                   shown, errno);
    return a;
}

/* A directory we just made (dirfd, name; `shown` its path): the store's
 * directory mode and group, which mkdir's umask may have narrowed and
 * which the setgid bit needs. Opened without following a link, and only
 * changed if it is ours. */
static int give_dir_mode(file_store *fs, int dirfd, const char *name,
                         const char *shown)
{
    struct stat st;
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
                                     O_CLOEXEC);
    int rc = DLOCK_OK;

    if (fd < 0)
        return dlock__file_io_error("open", shown, errno);
    /* another user's (made meanwhile) is left as it is */
    if (fstat(fd, &st) == 0)
        adopt_dir(fs, fd, &st, shown, &rc);
    close(fd);
    return rc;
}

/* mkdir -p: every directory made gets the store's directory mode (0700:
 * nobody else can enter; 02770 and the group in a group store). Those
 * that exist are left as they are. */
int dlock__file_make_dirs(file_store *fs, const char *path)
{
    char buf[PATH_MAX];
    size_t n = strlen(path);

    if (n >= sizeof(buf))
        return dlock__err(DLOCK_EINVAL, "file store: directory path too long");
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char keep = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0700) == 0) {
            int rc = give_dir_mode(fs, AT_FDCWD, buf, buf);
            if (rc)
                return rc;
        } else if (errno != EEXIST) {
            return dlock__file_io_error("mkdir", buf, errno);
        }
        buf[i] = keep;
    }
    return DLOCK_OK;
}

/* Opens (making it if missing) WAKE_DIR, where the wake-up channels'
 * sockets live: fs->wdir. Only the store's users may write it (a socket
 * in it is trusted as theirs): made with the directory mode, and if it
 * exists, ours (given that mode) or, in a group store, the group's and
 * closed to others; else refused. None can be made (a store we may only
 * read, say): fs->wdir is -1 and waits are the kernel's. */
int dlock__file_open_wake_dir(file_store *fs)
{
    char shown[PATH_MAX + 64], name[64];
    struct stat st;
    int fd;

    /* a user's own (the store's other users cannot open our files, and
     * could make a directory of this name first in a directory they may
     * write), or the group's */
    snprintf(name, sizeof(name), WAKE_DIR "%c%lu", fs->group ? 'g' : 'u',
             fs->group ? (unsigned long)fs->gid : (unsigned long)geteuid());
    snprintf(shown, sizeof(shown), "%s/%s", fs->dir, name);
    fs->wdir = -1;
    if (mkdirat(fs->dirfd, name, 0700) == 0) {
        int rc = give_dir_mode(fs, fs->dirfd, name, shown);
        if (rc)
            return rc;
    } else if (errno != EEXIST) {
        return DLOCK_OK; /* none: kernel waits */
    }
    fd = openat(fs->dirfd, name,
                O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && (errno == ENOTDIR || errno == ELOOP))
        return dlock__err(DLOCK_EAUTH,
                          "file store: %.200s is not a directory; remove it",
                          shown);
    if (fd < 0)
        return DLOCK_OK;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return DLOCK_OK;
    }
    int rc = DLOCK_OK, a = adopt_dir(fs, fd, &st, shown, &rc);
    if (rc) {
        close(fd);
        return rc;
    }
    if (a != DLOCK__ADOPT_OK) {
        close(fd);
        return dlock__err(DLOCK_EAUTH,
                          "file store: %.200s belongs to uid %lu, group %lu, "
                          "mode %04o: others could wake or delay our "
                          "waiters; remove it (dlock makes it again)%s",
                          shown, (unsigned long)st.st_uid,
                          (unsigned long)st.st_gid,
                          (unsigned)(st.st_mode & 07777),
                          fs->group ? "" : ", or share the store with "
                                           "?group=NAME");
    }
    fs->wdir = fd;
    return DLOCK_OK;
}

/* ------------------------------------------------------------------------ */
/* Private directories (?private=1: the default store)                      */
/* ------------------------------------------------------------------------ */

/* The way out that every refusal of a private directory names. */
#define PRIVATE_FIX \
    "; give dlock another directory with --store file:///DIR or DLOCK_STORE"

/* File systems whose locks are not this kernel's alone (statfs f_type):
 * network and cluster file systems, FUSE (sshfs, glusterfs, virtiofs...:
 * dlock cannot tell a local one from a remote one) and virtual machines'
 * shared folders. Their OFD locks are the file server's, or each host's
 * own when the file system does not forward them; a holder cut off from
 * the server may lose its lock to the server's lease while it runs; a
 * kernel wait polls the server; the fair queue's wake-up channels do not
 * cross hosts (docs/stores.md, "The default store"). */
static const struct {
    uint32_t magic;
    const char *name;
} remote_fs[] = {
    {0x6969, "NFS"},           {0x517B, "SMB"},
    {0xFF534D42, "CIFS"},      {0xFE534D42, "SMB2"},
    {0x564C, "NCP"},           {0x73757245, "Coda"},
    {0x5346414F, "AFS"},       {0x6B414653, "AFS"},
    {0x01021997, "9p"},        {0x00C36400, "Ceph"},
    {0x65735546, "FUSE"},      {0x0BD00BD0, "Lustre"},
    {0x01161970, "GFS2"},      {0x7461636F, "OCFS2"},
    {0x47504653, "GPFS"},      {0x19830326, "BeeGFS"},
    {0x20030528, "OrangeFS"},  {0xAAD7AAEA, "PanFS"},
    {0x786F4256, "VirtualBox shared folder"},
    {0xBACBACBC, "VMware shared folder"},
    {0x7C7C6673, "Parallels shared folder"},
};

/* The name of the network file system open directory `fd` is on, or
 * NULL (a local one, or statfs failed: then nothing can be told). */
static const char *remote_fs_of(int fd)
{
    struct statfs sf;

    if (fstatfs(fd, &sf) != 0)
        return NULL;
    for (size_t i = 0; i < sizeof(remote_fs) / sizeof(remote_fs[0]); i++)
        if ((uint32_t)sf.f_type == remote_fs[i].magic)
            return remote_fs[i].name;
    return NULL;
}

/* Why `name` (in dirfd; `shown` is its path) could not be opened as a
 * directory without following a link: errno `err`. */
static int private_open_error(int dirfd, const char *name, const char *shown,
                              int err)
{
    struct stat st;

    if ((err == ELOOP || err == ENOTDIR) &&
        fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
        if (S_ISLNK(st.st_mode))
            return dlock__err(DLOCK_EPROTO,
                              "file store: %.200s is a symbolic link; a "
                              "private directory is never reached through "
                              "one" PRIVATE_FIX,
                              shown);
        return dlock__err(DLOCK_EPROTO,
                          "file store: %.200s is not a directory" PRIVATE_FIX,
                          shown);
    }
    if (err == EACCES || err == EPERM)
        return dlock__err(DLOCK_EAUTH,
                          "file store: cannot enter %.200s: %s" PRIVATE_FIX,
                          shown, strerror(err));
    return dlock__file_io_error("open", shown, err);
}

/* Is `gid` our own private group? Debian and Ubuntu give each user a
 * group of the same name (USERGROUPS_ENAB) and log users in with umask
 * 002 (pam_umask), so the directories users make (~/.local,
 * ~/.local/state) are often group-writable: harmless when the group is
 * the user's alone, the rule Debian's OpenSSH applies to a home. Ours
 * alone: our primary group, named as we are, with no other member
 * listed. An account whose primary group is another user's private group
 * would get in; no distribution makes one, and ruling it out would cost
 * every client a scan of the whole user database. */
static int own_private_group(gid_t gid)
{
    struct passwd pw, *pwr = NULL;
    struct group gr, *grr = NULL;
    size_t cap = 4096;
    char *buf = NULL;
    int ok = 0;

    for (;;) { /* buffers big enough for both entries (1 MiB at most) */
        char *nb = realloc(buf, 2 * cap);
        int e1, e2 = 0;
        if (!nb)
            break;
        buf = nb;
        e1 = getpwuid_r(geteuid(), &pw, buf, cap, &pwr);
        if (pwr)
            e2 = getgrgid_r(gid, &gr, buf + cap, cap, &grr);
        if ((e1 != ERANGE && e2 != ERANGE) || cap >= (size_t)1 << 20)
            break;
        cap *= 2;
    }
    if (pwr && grr && pw.pw_gid == gid && pw.pw_name && gr.gr_name &&
        strcmp(gr.gr_name, pw.pw_name) == 0) {
        ok = 1;
        for (char **m = gr.gr_mem; m && *m; m++)
            if (strcmp(*m, pw.pw_name) != 0)
                ok = 0;
    }
    free(buf);
    return ok;
}

/* Checks one directory of a private path, opened as fd (st: its fstat):
 * see dlock__file_open_private(). */
static int private_check(int fd, const struct stat *st, const char *shown,
                         int last)
{
    uid_t me = geteuid();
    const char *remote;
    /* writable by someone else: others, or a group that is not ours
     * alone */
    int others_write = (st->st_mode & 002) ||
                       ((st->st_mode & 020) && !own_private_group(st->st_gid));

    if (!S_ISDIR(st->st_mode))
        return dlock__err(DLOCK_EPROTO,
                          "file store: %.200s is not a directory" PRIVATE_FIX,
                          shown);
    if (last && st->st_uid != me)
        return dlock__err(DLOCK_EAUTH,
                          "file store: %.200s belongs to uid %lu, not to "
                          "you (uid %lu); refusing to use it" PRIVATE_FIX,
                          shown, (unsigned long)st->st_uid,
                          (unsigned long)me);
    if (!last && st->st_uid != me && st->st_uid != 0)
        return dlock__err(DLOCK_EAUTH,
                          "file store: %.200s belongs to uid %lu, neither "
                          "you (uid %lu) nor root: its owner could replace "
                          "what is in it" PRIVATE_FIX,
                          shown, (unsigned long)st->st_uid,
                          (unsigned long)me);
    if (last && others_write)
        return dlock__err(DLOCK_EAUTH,
                          "file store: %.200s may be written by group or "
                          "others (mode %04o): files of theirs may be in it; "
                          "if every file in it is yours, chmod 700 it"
                          PRIVATE_FIX,
                          shown, (unsigned)(st->st_mode & 07777));
    /* a sticky directory (/tmp): others cannot rename or delete what
     * belongs to root or to us, and the next component must */
    if (!last && others_write && !(st->st_mode & S_ISVTX))
        return dlock__err(DLOCK_EAUTH,
                          "file store: %.200s may be written by group or "
                          "others (mode %04o): they could replace what is "
                          "in it" PRIVATE_FIX,
                          shown, (unsigned)(st->st_mode & 07777));
    if (!last)
        return DLOCK_OK;
    /* Ours, and only we could write it: nothing in it can be someone
     * else's. Close it to their eyes. */
    if ((st->st_mode & 077) && fchmod(fd, 0700) != 0)
        return dlock__file_io_error("chmod", shown, errno);
    remote = remote_fs_of(fd);
    if (remote)
        return dlock__err(DLOCK_ENOTSUP,
                          "file store: %.200s is on a network file system "
                          "(%s): its locks would not be this host's alone, "
                          "and waiters would poll the server; pass a local "
                          "directory with --store file:///DIR or DLOCK_STORE",
                          shown, remote);
    return DLOCK_OK;
}

/* Opens the private directory `path` (absolute): *out gets a descriptor
 * of it. The path is walked from / one component at a time, each opened
 * with O_NOFOLLOW | O_DIRECTORY (a symbolic link is refused, never
 * followed) and checked through fstat() of what was opened, so no check
 * is about a different file than the one used: every directory on the
 * way must belong to root or to us and may be written by no one else
 * unless it is sticky; a missing one is created, mode 0700 (mkdirat: the
 * umask can only narrow it); the last must be ours, written by no one
 * else, on a local file system, and is closed to others
 * (docs/stores.md, "The default store"). */
int dlock__file_open_private(const char *path, int *out)
{
    char shown[PATH_MAX], name[NAME_MAX + 1];
    const char *p = path;
    struct stat st;
    size_t used = 0;
    int dirfd, rc;

    if (strlen(path) >= sizeof(shown))
        return dlock__err(DLOCK_EINVAL,
                          "file store: directory path too long");
    dirfd = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0)
        return dlock__file_io_error("open", "/", errno);
    if (fstat(dirfd, &st) != 0) {
        rc = dlock__file_io_error("stat", "/", errno);
        close(dirfd);
        return rc;
    }
    rc = private_check(dirfd, &st, "/", 0);
    while (rc == DLOCK_OK) {
        size_t len;
        int fd, last;

        while (*p == '/')
            p++;
        len = strcspn(p, "/");
        if (len == 0) {
            rc = dlock__err(DLOCK_EINVAL,
                            "file store: a private directory cannot be /");
            break;
        }
        if (len > NAME_MAX) {
            rc = dlock__err(DLOCK_EINVAL,
                            "file store: a name in %.200s is too long", path);
            break;
        }
        memcpy(name, p, len);
        name[len] = '\0';
        p += len;
        while (*p == '/')
            p++;
        last = *p == '\0';
        shown[used++] = '/';
        memcpy(shown + used, name, len + 1);
        used += len;

        /* the last one is opened to be read (the store's directory);
         * the others only to walk through (search permission is all
         * they need) */
        int flags = (last ? O_RDONLY : O_PATH) | O_DIRECTORY | O_NOFOLLOW |
                    O_CLOEXEC;
        fd = openat(dirfd, name, flags);
        if (fd < 0 && errno == ENOENT) {
            if (mkdirat(dirfd, name, 0700) != 0 && errno != EEXIST) {
                int e = errno;
                if (e == EACCES || e == EPERM || e == EROFS)
                    rc = dlock__err(DLOCK_EAUTH,
                                    "file store: cannot create %.200s: %s "
                                    "(or have it made for you: yours, "
                                    "mode 0700)" PRIVATE_FIX,
                                    shown, strerror(e));
                else
                    rc = dlock__file_io_error("mkdir", shown, e);
                break;
            }
            fd = openat(dirfd, name, flags);
        }
        if (fd < 0) {
            rc = private_open_error(dirfd, name, shown, errno);
            break;
        }
        close(dirfd);
        dirfd = fd;
        if (fstat(fd, &st) != 0) {
            rc = dlock__file_io_error("stat", shown, errno);
            break;
        }
        rc = private_check(fd, &st, shown, last);
        if (rc == DLOCK_OK && last) {
            *out = fd;
            return DLOCK_OK;
        }
    }
    close(dirfd);
    return rc;
}
