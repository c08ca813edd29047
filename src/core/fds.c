/* SPDX-License-Identifier: MIT */
/*
 * fds.c -- close-on-exec for descriptors that a client library makes
 * without the flag (docs/design.md, "Descriptors").
 *
 * dlock makes its own descriptors close-on-exec when it creates them.
 * Some client libraries do not, and never tell us the numbers: libcurl
 * 7.88's wake-up socket pair of each handle, the ZooKeeper C client's
 * self-pipe and socket. For those, the store notes the descriptors that a
 * started program would inherit before the call that makes them and marks
 * the pipes and sockets that appeared during it (or, for a connection
 * made on the library's own thread, the sockets connected to the server
 * it names). The lists come from /proc/self/fd; without it nothing is
 * marked.
 */
#include "internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Calls fn(fd, st, arg) for each pipe and socket of the process that a
 * started program would inherit (no FD_CLOEXEC); -1 without
 * /proc/self/fd. No allocation (getdents64 into a buffer on the stack,
 * not opendir()): a child forked meanwhile by another thread must not
 * inherit a heap block this thread was using. */
static int each_inheritable(void (*fn)(int, const struct stat *, void *),
                            void *arg)
{
    int dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    /* aligned for the records getdents64 writes into it */
    union {
        struct dirent64 d;
        char b[4096];
    } buf;
    long got;

    if (dfd < 0)
        return -1;
    while ((got = syscall(SYS_getdents64, dfd, buf.b, sizeof(buf.b))) > 0) {
        for (long off = 0; off < got;) {
            const struct dirent64 *e = (const void *)(buf.b + off);
            struct stat st;
            char *end;
            long fd = strtol(e->d_name, &end, 10);
            int fl;
            off += e->d_reclen;
            if (e->d_name[0] < '0' || e->d_name[0] > '9' || *end ||
                fd == dfd)
                continue;
            fl = fcntl((int)fd, F_GETFD);
            if (fl < 0 || (fl & FD_CLOEXEC) || fstat((int)fd, &st) != 0 ||
                !(S_ISSOCK(st.st_mode) || S_ISFIFO(st.st_mode)))
                continue;
            fn((int)fd, &st, arg);
        }
    }
    close(dfd);
    return got < 0 ? -1 : 0;
}

void dlock__cloexec(int fd)
{
    int fl = fd >= 0 ? fcntl(fd, F_GETFD) : -1;

    if (fl >= 0 && !(fl & FD_CLOEXEC))
        (void)fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
}

static void note_one(int fd, const struct stat *st, void *arg)
{
    dlock__fd_note *n = arg;

    if (n->n == DLOCK__FD_NOTE_MAX) {
        n->ok = 0; /* an incomplete note would mark others' */
        return;
    }
    n->ids[n->n].fd = fd;
    n->ids[n->n].dev = st->st_dev;
    n->ids[n->n].ino = st->st_ino;
    n->n++;
}

void dlock__fds_note(dlock__fd_note *n)
{
    n->n = 0;
    n->ok = 1;
    if (each_inheritable(note_one, n) != 0)
        n->ok = 0;
}

static void mark_new(int fd, const struct stat *st, void *arg)
{
    const dlock__fd_note *n = arg;

    for (size_t i = 0; i < n->n; i++)
        if (n->ids[i].fd == fd && n->ids[i].dev == st->st_dev &&
            n->ids[i].ino == st->st_ino)
            return; /* there before the call: not the library's */
    dlock__cloexec(fd);
}

void dlock__fds_mark_new(dlock__fd_note *n)
{
    if (n->ok)
        (void)each_inheritable(mark_new, n);
    n->n = 0;
    n->ok = 0;
}

typedef struct peer_arg {
    const struct sockaddr *peer;
    socklen_t len;
} peer_arg;

static void mark_peer(int fd, const struct stat *st, void *arg)
{
    const peer_arg *p = arg;
    struct sockaddr_storage a;
    socklen_t len = sizeof(a);

    if (S_ISSOCK(st->st_mode) &&
        getpeername(fd, (struct sockaddr *)&a, &len) == 0 &&
        len == p->len && memcmp(&a, p->peer, len) == 0)
        dlock__cloexec(fd);
}

void dlock__fds_mark_peer(const struct sockaddr *peer, socklen_t len)
{
    peer_arg p = {peer, len};

    (void)each_inheritable(mark_peer, &p);
}
