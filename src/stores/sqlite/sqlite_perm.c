/* SPDX-License-Identifier: MIT */
/*
 * sqlite_perm.c -- the SQLite store's files beside the database: the
 * sidecar and the channels' directory: creation, modes, ?group=, checks.
 *
 * What dlock makes (the database when missing, the sidecar `<db>-dlock`,
 * the channels' directory `<db>-dlock.d`) gives other users nothing, or
 * only the members of ?group='s group (docs/stores.md, the SQLite
 * store's "?group=NAME"); another user's sidecar or directory is used
 * only by a store of its group, and only when it is closed to others.
 * And the sidecar's spare descriptors, one open file description per
 * acquisition (sqlite.c says why).
 */
#include "sqlite_int.h"
#include "perm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

int dlock__sq_side_error(sq_store *ss, const char *what, int e)
{
    int code = e == EACCES || e == EPERM || e == EROFS ? DLOCK_EAUTH
               : e == ENOMEM                          ? DLOCK_ENOMEM
               : e == ELOOP || e == EINVAL            ? DLOCK_EPROTO
                                                      : DLOCK_ECONN;
    return dlock__err(code, "sqlite %s: %s the wake-up file %.300s: %s%s",
                      ss->redacted, what, ss->side, strerror(e),
                      e == ELOOP || e == EINVAL
                          ? " (a symbolic link or not a regular file)"
                          : "");
}

/* Another user's sidecar or channels' directory that we do not use
 * (dlock__sqw_open()'s EPERM): whose it is and why. */
static int side_refused(sq_store *ss, const char *path, const struct stat *st)
{
    return dlock__err(DLOCK_EAUTH,
                      "sqlite %s: %.300s belongs to uid %u (group %u, mode "
                      "%04o): %s; its owner should remove it (dlock makes it "
                      "again) or give the same ?group= to every client",
                      ss->redacted, path, (unsigned)st->st_uid,
                      (unsigned)st->st_gid, (unsigned)(st->st_mode & 07777),
                      ss->gid == (gid_t)-1
                          ? "another user's file can hold this store's "
                            "waiters up (a store shared between users needs "
                            "?group=)"
                      : st->st_mode & 0007
                          ? "it is open to every user, and any process that "
                            "can open it can hold waiters up"
                          : "it is not of the group this URI names, or not "
                            "sticky");
}

/* Makes the database file when missing, with the store's mode and group
 * (SQLite would make it 0644, and its -wal and -shm take its mode: a
 * reader of -shm can hold SQLite's locks). An existing one is left as it
 * is (docs/stores.md says what a shared one needs). */
int dlock__sq_db_make(sq_store *ss, const char *path)
{
    struct stat st;
    int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                  ss->mode);

    if (fd < 0)
        return DLOCK_OK; /* there (or not makeable: SQLite says why) */
    if (fstat(fd, &st) != 0 ||
        dlock__perm_adopt(fd, st.st_uid, st.st_gid, st.st_mode, 1, ss->gid,
                          ss->mode) != DLOCK__ADOPT_OK) {
        int e = errno;
        close(fd);
        unlink(path);
        return dlock__err(DLOCK_EAUTH, "sqlite %s: giving the new database "
                                       "its group and mode: %s",
                          ss->redacted, strerror(e));
    }
    close(fd);
    return DLOCK_OK;
}

int dlock__sqw_open(const char *path, mode_t mode, gid_t gid, dev_t *dev,
                    ino_t *ino, struct stat *st)
{
    int fd = -1, made = 0;

    /* made by us (O_EXCL: this call created it), or opened as it is;
     * never through a symbolic link */
    for (int i = 0; i < 4 && fd < 0; i++) {
        fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0 || errno != ENOENT)
            break;
        fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                  mode);
        made = fd >= 0;
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0)
        return -1;
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    /* ours: exactly the mode and group asked for (the umask may have
     * taken bits; an older dlock gave the database's, 0644); another
     * user's: only a ?group= store's, of that group and closed to others
     * (its owner, or anyone it lets in, could hold waiters up): else not
     * used (side_refused() says whose) */
    int a = dlock__perm_adopt(fd, st->st_uid, st->st_gid, st->st_mode, made,
                              gid, mode);
    if (a != DLOCK__ADOPT_OK) {
        int e = a == DLOCK__ADOPT_CHGRP || a == DLOCK__ADOPT_CHMOD ? errno
                                                                   : EPERM;
        close(fd);
        errno = e;
        return -1;
    }
    *dev = st->st_dev;
    *ino = st->st_ino;
    return fd;
}

/* The wake-up channels' directory `<db>-dlock.d`: made 0700 (or 03770
 * and the group: sticky, so that no member can swap another's socket),
 * opened without following a symbolic link, and reached through
 * /proc/self/fd (the 108-byte limit of a socket's path then never
 * bites). Ours is given that mode; another user's is used only by a
 * ?group= store, when it is of that group, sticky and closed to other
 * users (its owner could bind any name there). No usable path (no /proc, a long path): no
 * channels, waits go to the kernel's byte locks and lease ends. */
static int chans_open(sq_store *ss, const char *db)
{
    mode_t want = ss->gid != (gid_t)-1 ? 03770 : 0700;
    size_t dl = strlen(db) + 16;
    char *dir = malloc(dl);
    struct stat st;
    int fd, a, rc = DLOCK_OK;

    ss->ch.dirfd = -1;
    ss->ch.group = ss->gid != (gid_t)-1;
    ss->ch.prefix[0] = '\0';
    if (!dir)
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    snprintf(dir, dl, "%s-dlock.d", db);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        rc = dlock__sq_side_error(ss, "making the channels' directory of",
                                  errno);
        goto out;
    }
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0) {
        rc = dlock__sq_side_error(ss, "opening the channels' directory of",
                                  errno == ENOTDIR ? ELOOP : errno);
        if (fd >= 0)
            close(fd);
        goto out;
    }
    /* another user's: only a ?group= store's, of that group, sticky and
     * closed to others (its owner could bind any name there) */
    a = dlock__perm_adopt(fd, st.st_uid, st.st_gid, st.st_mode, 0, ss->gid,
                          want);
    if (a == DLOCK__ADOPT_CHGRP || a == DLOCK__ADOPT_CHMOD) {
        rc = dlock__sq_side_error(ss, "giving its mode to the channels' "
                                      "directory of",
                                  errno);
        close(fd);
        goto out;
    }
    if (a != DLOCK__ADOPT_OK) {
        rc = side_refused(ss, dir, &st);
        close(fd);
        goto out;
    }
    ss->ch.dirfd = fd;
    /* "<prefix>/<ino>.<rowid>.<t>.r": 16 + 8 + 8 + 5 bytes after it */
    snprintf(ss->ch.prefix, sizeof(ss->ch.prefix), "/proc/self/fd/%d", fd);
    if (access(ss->ch.prefix, X_OK) != 0) {
        if (strlen(dir) < sizeof(ss->ch.prefix) &&
            strlen(dir) + 40 < sizeof(((struct sockaddr_un *)0)->sun_path))
            snprintf(ss->ch.prefix, sizeof(ss->ch.prefix), "%s", dir);
        else
            ss->ch.prefix[0] = '\0';
    }
out:
    free(dir);
    return rc;
}

/* Opens the sidecar `<db>-dlock` (ss->side) into ss->sidefd: 0600, or
 * 0660 and the group (an older dlock gave it the database's mode: ours is
 * tightened); then the channels' directory. */
int dlock__sq_side_open(sq_store *ss, const char *db)
{
    struct stat sst;

    ss->sidefd = dlock__sqw_open(ss->side, ss->mode, ss->gid, &ss->side_dev,
                                 &ss->side_ino, &sst);
    if (ss->sidefd < 0)
        return errno == EPERM ? side_refused(ss, ss->side, &sst)
                              : dlock__sq_side_error(ss, "opening", errno);
    return chans_open(ss, db);
}

/* A sidecar descriptor for one acquisition: a spare one, unless its file
 * was removed or replaced since (no more links: open the path again, so
 * that we queue where newcomers do), else a new one. -1 with errno. */
int dlock__sq_side_get(sq_store *ss, dev_t *dev, ino_t *ino)
{
    struct stat st;
    int fd = -1;

    pthread_mutex_lock(&ss->spare_mu);
    if (ss->nspare > 0)
        fd = ss->spare[--ss->nspare];
    pthread_mutex_unlock(&ss->spare_mu);
    if (fd >= 0) {
        if (fstat(fd, &st) == 0 && st.st_nlink > 0) {
            *dev = st.st_dev;
            *ino = st.st_ino;
            return fd;
        }
        close(fd);
    }
    fd = dlock__sqw_open(ss->side, ss->mode, ss->gid, dev, ino, &st);
    if (fd < 0 && errno == EPERM)
        errno = EACCES; /* replaced by another user's since the open */
    return fd;
}

/* Back to the spares (it holds no lock any more), or closed. */
void dlock__sq_side_put(sq_store *ss, int fd)
{
    if (fd < 0)
        return;
    pthread_mutex_lock(&ss->spare_mu);
    if (ss->nspare < SQ_SPARE_MAX) {
        ss->spare[ss->nspare++] = fd;
        fd = -1;
    }
    pthread_mutex_unlock(&ss->spare_mu);
    if (fd >= 0)
        close(fd);
}

