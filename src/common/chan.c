/* SPDX-License-Identifier: MIT */
/*
 * chan.c -- ending a wake-up channel (chan.h): the listening Unix socket
 * a waiter's successor connects to. Shared by the file and SQLite stores,
 * which make and name their channels each their own way.
 */
#include "chan.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Removes a listener's socket file (its name from getsockname()), so that
 * no one connects any more; the listener itself stays open. */
void dlock__chan_unlink(int wdir, int lfd)
{
    struct sockaddr_un sa;
    socklen_t len = sizeof(sa);
    const char *base;

    memset(&sa, 0, sizeof(sa));
    if (wdir < 0 || getsockname(lfd, (struct sockaddr *)&sa, &len) != 0 ||
        len <= offsetof(struct sockaddr_un, sun_path) ||
        sa.sun_path[0] == '\0')
        return;
    sa.sun_path[sizeof(sa.sun_path) - 1] = '\0';
    base = strrchr(sa.sun_path, '/');
    if (base && base[1])
        unlinkat(wdir, base + 1, 0);
}

/* Wakes the successor connected to a channel, if one is: accepts one
 * pending connection and sends it a byte (its poll() returns). Returns the
 * accepted descriptor, for dlock__chan_close() to close, or -1. Call
 * it after the ticket byte is unlocked. */
int dlock__chan_wake(int lfd)
{
    for (;;) {
        int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c >= 0) {
            (void)send(c, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
            return c;
        }
        if (errno != EINTR && errno != ECONNABORTED)
            return -1;
    }
}

/* Wakes every successor still connected to a channel and closes it: each
 * pending connection is accepted and closed (its owner sees end of file),
 * which works even when a forked child keeps a copy of the listener; the
 * listener's close then resets any connection that came after the last
 * accept. `woken` is dlock__chan_wake()'s connection, or -1. Call it
 * after the ticket byte is unlocked. */
void dlock__chan_close(int lfd, int woken)
{
    dlock__chan_end(-1, lfd, woken, 1);
}

void dlock__chan_end(int wdir, int lfd, int woken, int unlinked)
{
    if (woken >= 0)
        close(woken);
    for (int i = 0; i < DLOCK__CHAN_ACCEPT_MAX; i++) {
        int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (c >= 0)
            close(c);
        else if (errno != EINTR && errno != ECONNABORTED)
            break;
    }
    /* the file before the listener: while the file is there, a waiter
     * whose ticket has our name modulo CHAN_TICKET_NAMES finds us alive
     * and does not take it (and we never remove its file) */
    if (!unlinked)
        dlock__chan_unlink(wdir, lfd);
    close(lfd);
}
