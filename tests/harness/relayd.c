/* SPDX-License-Identifier: MIT */
/*
 * relayd.c -- th_relayd URI: a TCP relay (th_relay) in front of every
 * "127.0.0.1:PORT" of a store URI, in a process of its own; prints the URI
 * with those ports replaced by the relays', then relays until stdin
 * closes (or the process is killed).
 *
 * For the shell tests that cut a client off from its store: SIGSTOP this
 * process and every connection through it, open or new, stops moving (a
 * frozen proxy: the connections stay up, a new one is accepted by the
 * kernel, nothing answers); SIGCONT and they move again.
 */
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_RELAYS 8

int main(int argc, char **argv)
{
    static th_relay px[MAX_RELAYS];
    char out[2048], buf[256];
    const char *s, *key = "127.0.0.1:";
    size_t o = 0;
    int n = 0;

    if (argc != 2) {
        fprintf(stderr, "usage: %s URI\n", argv[0]);
        return 2;
    }
    for (s = argv[1]; *s && o + 16 < sizeof(out);) {
        if (strncmp(s, key, strlen(key)) == 0 && s[strlen(key)] >= '0' &&
            s[strlen(key)] <= '9') {
            char *end;
            long port = strtol(s + strlen(key), &end, 10);
            if (n == MAX_RELAYS || port <= 0 || port > 65535) {
                fprintf(stderr, "th_relayd: too many hosts, or a bad port\n");
                return 2;
            }
            th_relay_start(&px[n], (int)port);
            o += (size_t)snprintf(out + o, sizeof(out) - o, "%s%d", key,
                                  px[n].port);
            n++;
            s = end;
        } else {
            out[o++] = *s++;
        }
    }
    out[o] = '\0';
    printf("%s\n", out);
    fflush(stdout);
    while (read(0, buf, sizeof(buf)) > 0)
        ;
    for (int i = 0; i < n; i++)
        th_relay_stop(&px[i]);
    return 0;
}
