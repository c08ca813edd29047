/* SPDX-License-Identifier: MIT */
/*
 * pathwatch.c -- a file's writes watched with inotify (pathwatch.h).
 */
#include "pathwatch.h"

#include "store.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#define FILE_EVENTS (IN_MODIFY | IN_CLOSE_WRITE | IN_DELETE_SELF | \
                     IN_MOVE_SELF | IN_DONT_FOLLOW)
#define DIR_EVENTS (IN_CREATE | IN_MOVED_TO | IN_ONLYDIR)

struct dlock__pathwatch {
    int ifd;
    int wd;        /* the file's watch, -1 while it does not exist */
    int dwd;       /* the directory's, while it does not */
    char *path;    /* dir/base */
    const char *base;
    char what[200];
};

static int failed(const dlock__pathwatch *w, const char *op, int err)
{
    return dlock__err(DLOCK_ECONN, "%s: %s %.200s: %s", w->what, op, w->path,
                      strerror(err));
}

/* The file's watch, or the directory's while the file is missing. */
static int add_watches(dlock__pathwatch *w)
{
    w->wd = inotify_add_watch(w->ifd, w->path, FILE_EVENTS);
    if (w->wd >= 0)
        return DLOCK_OK;
    if (errno != ENOENT)
        return failed(w, "watching", errno);
    /* the directory first, then the file again: one made meanwhile */
    char *slash = strrchr(w->path, '/');
    if (slash)
        *slash = '\0';
    w->dwd = inotify_add_watch(w->ifd, slash ? (w->path[0] ? w->path : "/")
                                             : ".",
                               DIR_EVENTS);
    if (slash)
        *slash = '/';
    if (w->dwd < 0)
        return failed(w, "watching the directory of", errno);
    w->wd = inotify_add_watch(w->ifd, w->path, FILE_EVENTS);
    if (w->wd < 0 && errno != ENOENT)
        return failed(w, "watching", errno);
    return DLOCK_OK;
}

int dlock__pathwatch_open(const char *path, const char *what,
                          dlock__pathwatch **out)
{
    dlock__pathwatch *w = calloc(1, sizeof(*w));
    int rc;

    *out = NULL;
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return dlock__err(DLOCK_ENOMEM, "out of memory");
    }
    w->wd = w->dwd = -1;
    snprintf(w->what, sizeof(w->what), "%s", what);
    const char *slash = strrchr(w->path, '/');
    w->base = slash ? slash + 1 : w->path;
    w->ifd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (w->ifd < 0) {
        rc = failed(w, "inotify for", errno);
        dlock__pathwatch_close(w);
        return rc;
    }
    rc = add_watches(w);
    if (rc) {
        dlock__pathwatch_close(w);
        return rc;
    }
    *out = w;
    return DLOCK_OK;
}

int dlock__pathwatch_wait(dlock__pathwatch *w, int64_t deadline,
                          int cancel_fd, int extra_fd)
{
    /* events are whole in one read; room for a few with a name each */
    char buf[16 * (sizeof(struct inotify_event) + NAME_MAX + 1)]
        __attribute__((aligned(__alignof__(struct inotify_event))));

    for (;;) {
        ssize_t got = read(w->ifd, buf, sizeof(buf));
        int woke = 0;
        for (ssize_t at = 0; got > 0 && at < got;) {
            const struct inotify_event *e =
                (const struct inotify_event *)(buf + at);
            at += (ssize_t)(sizeof(*e) + e->len);
            if ((e->mask & IN_Q_OVERFLOW) ||
                (e->wd == w->wd &&
                 (e->mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF))))
                return dlock__err(DLOCK_ECONN, "%s: the watch of %.200s "
                                               "ended",
                                  w->what, w->path);
            if (e->wd == w->dwd && w->wd < 0) {
                if (e->len && !strcmp(e->name, w->base)) {
                    w->wd = inotify_add_watch(w->ifd, w->path, FILE_EVENTS);
                    woke = 1;
                }
            } else if (e->wd == w->wd) {
                woke = 1;
            }
        }
        if (woke)
            return DLOCK_OK;
        int64_t left = deadline - dlock__now_ms();
        if (left <= 0)
            return DLOCK_EBUSY;
        struct pollfd p[3] = {{w->ifd, POLLIN, 0},
                              {cancel_fd, POLLIN, 0},
                              {extra_fd, POLLIN, 0}};
        int n = poll(p, 3, left > INT_MAX ? INT_MAX : (int)left);
        if (n < 0 && errno != EINTR)
            return failed(w, "waiting on", errno);
        if (n > 0 && cancel_fd >= 0 && (p[1].revents & POLLIN))
            return DLOCK_EBUSY;
        if (n > 0 && extra_fd >= 0 && p[2].revents)
            return DLOCK_OK;
    }
}

void dlock__pathwatch_close(dlock__pathwatch *w)
{
    if (!w)
        return;
    if (w->ifd >= 0)
        close(w->ifd);
    free(w->path);
    free(w);
}
