/* SPDX-License-Identifier: MIT */
/*
 * tls.c -- the test certificates (tests/servers/tlscerts.sh) and a look
 * at a Redis server's TLS port with redis-cli --tls, which needs nothing
 * of the library's (see test.h). The server itself is started by
 * th_redis_start_tls() (harness.c), with every other Redis server.
 */
#include "test.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

#ifndef TH_TLSCERTS
#error "TH_TLSCERTS (the path of tests/servers/tlscerts.sh) is not defined"
#endif

const char *th_tls_certs(void)
{
    static char dir[600];
    char cmd[1400];

    if (dir[0])
        return dir;
    if (snprintf(dir, sizeof(dir), "%s/tls", th_tmpdir()) >=
        (int)sizeof(dir))
        th_fail(__FILE__, __LINE__, "temporary directory name too long");
    /* the script is quick (< 1 s) and never waits for anything */
    snprintf(cmd, sizeof(cmd), "bash '%s' '%s' >'%s.log' 2>&1 </dev/null",
             TH_TLSCERTS, dir, dir);
    if (system(cmd) != 0) {
        char log[700];
        snprintf(log, sizeof(log), "%s.log", dir);
        dir[0] = '\0';
        th_fail(__FILE__, __LINE__,
                "tests/servers/tlscerts.sh could not make the test "
                "certificates (apt-get install openssl; see %s)",
                log);
    }
    return dir;
}

char *th_tls_param(char *out, size_t cap, const char *file)
{
    const char *d = th_tls_certs();
    size_t o = 0;

    for (int part = 0; part < 3; part++) {
        const char *s = part == 0 ? d : part == 1 ? "/" : file;
        for (; *s; s++) {
            unsigned char ch = (unsigned char)*s;
            int plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                        (ch >= '0' && ch <= '9') || strchr("._~/-", ch);
            if (o + 4 > cap)
                th_fail(__FILE__, __LINE__, "TLS file path too long");
            if (plain)
                out[o++] = (char)ch;
            else
                o += (size_t)snprintf(out + o, cap - o, "%%%02X", ch);
        }
    }
    out[o] = '\0';
    return out;
}

int th_redis_tls_cli(th_redis *r, char *out, size_t cap, const char *fmt,
                     ...)
{
    const char *d = th_tls_certs();
    char args[1024], cmd[4096];
    size_t n = 0;
    va_list ap;
    FILE *p;
    int st;

    if (!r->tls_port)
        th_fail(__FILE__, __LINE__, "th_redis_tls_cli: no TLS port");
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    if (r->tls_auth_clients)
        snprintf(cmd, sizeof(cmd),
                 "timeout -k 2 10 redis-cli --tls --cacert '%s/ca.crt' "
                 "--cert '%s/client.crt' --key '%s/client.key' -h localhost "
                 "-p %d %s 2>&1 </dev/null",
                 d, d, d, r->tls_port, args);
    else
        snprintf(cmd, sizeof(cmd),
                 "timeout -k 2 10 redis-cli --tls --cacert '%s/ca.crt' -h "
                 "localhost -p %d %s 2>&1 </dev/null",
                 d, r->tls_port, args);
    if (out && cap)
        out[0] = '\0';
    p = popen(cmd, "r");
    if (!p)
        th_fail(__FILE__, __LINE__, "popen: cannot run redis-cli");
    for (;;) {
        char buf[512];
        size_t got = fread(buf, 1, sizeof(buf), p);
        if (got == 0)
            break;
        for (size_t i = 0; i < got && out && n + 1 < cap; i++)
            out[n++] = buf[i];
    }
    if (out && cap) {
        out[n] = '\0';
        if (n > 0 && out[n - 1] == '\n')
            out[n - 1] = '\0';
    }
    st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
