/* SPDX-License-Identifier: MIT */
/*
 * redis.c -- see redis.h.
 */
#include "redis.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

void r_address(const char *uri, char *host, size_t cap, int *port)
{
    const char *p = uri + 8, *colon;
    size_t hl;

    if (strncmp(uri, "redis://", 8) != 0)
        die("uri", "expected redis://host:port");
    hl = strcspn(p, ":/?");
    colon = p[hl] == ':' ? p + hl : NULL;
    snprintf(host, cap, "%.*s", (int)hl, p);
    *port = colon ? atoi(colon + 1) : 6379;
}

redisContext *r_connect(const char *host, int port, int connect_s,
                        int cmd_s)
{
    struct timeval tv = {connect_s, 0};
    redisContext *c = redisConnectWithTimeout(host, port, tv);

    if (!c || c->err)
        die("connect", c ? c->errstr : "out of memory");
    if (cmd_s) {
        tv.tv_sec = cmd_s;
        redisSetTimeout(c, tv);
    }
    return c;
}

void r_ok(redisReply *r, const char *what)
{
    if (!r || r->type == REDIS_REPLY_ERROR)
        die(what, r ? r->str : "no reply");
    freeReplyObject(r);
}

long long r_calls(const char *info, const char *const *names)
{
    long long sum = 0;

    for (const char *p = info; (p = strstr(p, "cmdstat_")); p++) {
        const char *calls = strstr(p, "calls=");
        int counted = !names && strncmp(p, "cmdstat_info:", 13) != 0;
        for (int i = 0; names && names[i] && !counted; i++) {
            size_t l = strlen(names[i]);
            counted = !strncmp(p + 8, names[i], l) && p[8 + l] == ':';
        }
        if (counted && calls)
            sum += atoll(calls + 6);
    }
    return sum;
}

redisReply *r_command(redisContext *c, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    if (!r || r->type == REDIS_REPLY_ERROR)
        die(fmt, r ? r->str : c->errstr);
    return r;
}
