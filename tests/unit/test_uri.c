/* SPDX-License-Identifier: MIT */
/*
 * test_uri.c -- the store-URI parser (src/core/uri.c), on its own.
 *
 * Every parse of a URI that carries a password, good or bad, also checks
 * that the password (raw or decoded) shows up neither in dlock_errmsg() nor
 * in the redacted URI, and that the redacted URI says ":***@".
 */
#include "test.h"
#include "uri.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* The password must not leak: not in the thread's last error message, not
 * in u->redacted (when the parse succeeded). Each secret is checked both as
 * written in the URI and decoded. */
static void check_no_secret(const char *file, int line, const dlock__uri *u,
                            const char *const *secrets)
{
    for (size_t i = 0; secrets && secrets[i]; i++) {
        const char *m = dlock_errmsg();
        if (strstr(m, secrets[i]))
            th_fail(file, line,
                    "error message \"%s\" contains the password text \"%s\"",
                    m, secrets[i]);
        if (u && u->redacted && strstr(u->redacted, secrets[i]))
            th_fail(file, line,
                    "redacted URI \"%s\" contains the password text \"%s\"",
                    u->redacted, secrets[i]);
    }
    if (u && u->password && (!u->redacted || !strstr(u->redacted, ":***@")))
        th_fail(file, line, "redacted URI \"%s\" does not say \":***@\"",
                u->redacted ? u->redacted : "(null)");
}

/* Parses a good URI and checks the common invariants. */
static void parse_good_at(const char *file, int line, const char *s,
                          dlock__uri *u, const char *const *secrets)
{
    int rc = dlock__uri_parse(s, u);
    if (rc != DLOCK_OK)
        th_fail(file, line, "parsing \"%s\" returned %s: %s", s,
                dlock_errname(rc), dlock_errmsg());
    if (!u->scheme || !u->path || !u->redacted)
        th_fail(file, line, "parsing \"%s\" left scheme, path or redacted "
                "NULL", s);
    for (const char *p = u->scheme; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            th_fail(file, line, "scheme \"%s\" is not lowercase", u->scheme);
    if (!u->password && strcmp(u->redacted, s) != 0)
        th_fail(file, line, "redacted \"%s\" differs from \"%s\" without a "
                "password", u->redacted, s);
    check_no_secret(file, line, u, secrets);
}

#define parse_good(s, u, secrets) parse_good_at(__FILE__, __LINE__, s, u, secrets)

/* The URI must be refused with DLOCK_EINVAL, a message, and *out empty. */
static void parse_bad_at(const char *file, int line, const char *s,
                         const char *const *secrets, const char *msg_part)
{
    dlock__uri u;
    int rc;

    memset(&u, 0xa5, sizeof(u)); /* the parser must clear it */
    rc = dlock__uri_parse(s, &u);
    if (rc != DLOCK_EINVAL)
        th_fail(file, line, "parsing \"%s\" returned %s, expected "
                "DLOCK_EINVAL (%s)",
                s ? s : "(null)", dlock_errname(rc), dlock_errmsg());
    if (!dlock_errmsg()[0])
        th_fail(file, line, "parsing \"%s\" failed without a message",
                s ? s : "(null)");
    if (msg_part && !strstr(dlock_errmsg(), msg_part))
        th_fail(file, line, "parsing \"%s\": message \"%s\" lacks \"%s\"",
                s ? s : "(null)", dlock_errmsg(), msg_part);
    if (u.scheme || u.user || u.password || u.hosts || u.nhosts || u.path ||
        u.params || u.nparams || u.redacted)
        th_fail(file, line, "parsing \"%s\" failed but left *out non-empty",
                s ? s : "(null)");
    check_no_secret(file, line, &u, secrets);
    dlock__uri_free(&u); /* safe on an empty one */
}

#define parse_bad(s, secrets, msg) parse_bad_at(__FILE__, __LINE__, s, secrets, msg)

/* ------------------------------------------------------------------------ */
/* Good URIs                                                                */
/* ------------------------------------------------------------------------ */

TEST(uri_redis_host_only)
{
    dlock__uri u;

    parse_good("redis://host", &u, NULL);
    CHECK_STR(u.scheme, "redis");
    CHECK(u.user == NULL);
    CHECK(u.password == NULL);
    CHECK_EQ(u.nhosts, 1);
    CHECK_STR(u.hosts[0].host, "host");
    CHECK_EQ(u.hosts[0].port, 0);
    CHECK_STR(u.path, "");
    CHECK_EQ(u.nparams, 0);
    CHECK(dlock__uri_param(&u, "prefix") == NULL);
    CHECK_STR(u.redacted, "redis://host");
    dlock__uri_free(&u);
    CHECK(u.scheme == NULL && u.hosts == NULL && u.redacted == NULL);
    dlock__uri_free(&u); /* twice is fine: freeing clears it */
    dlock__uri_free(NULL);
}

TEST(uri_redis_port_db_query)
{
    dlock__uri u;

    parse_good("redis://host:6379/2?prefix=x", &u, NULL);
    CHECK_STR(u.scheme, "redis");
    CHECK_EQ(u.nhosts, 1);
    CHECK_STR(u.hosts[0].host, "host");
    CHECK_EQ(u.hosts[0].port, 6379);
    CHECK_STR(u.path, "/2");
    CHECK_EQ(u.nparams, 1);
    CHECK_STR(u.params[0].key, "prefix");
    CHECK_STR(u.params[0].value, "x");
    CHECK_STR(dlock__uri_param(&u, "prefix"), "x");
    CHECK(dlock__uri_param(&u, "timeout") == NULL);
    CHECK(dlock__uri_param(&u, "prefi") == NULL);
    CHECK_STR(u.redacted, "redis://host:6379/2?prefix=x");
    dlock__uri_free(&u);

    parse_good("redis://h/", &u, NULL);
    CHECK_STR(u.path, "/");
    dlock__uri_free(&u);

    parse_good("redis://127.0.0.1:1", &u, NULL);
    CHECK_STR(u.hosts[0].host, "127.0.0.1");
    CHECK_EQ(u.hosts[0].port, 1);
    dlock__uri_free(&u);

    parse_good("redis://my-host.example_1.com:65535", &u, NULL);
    CHECK_STR(u.hosts[0].host, "my-host.example_1.com");
    CHECK_EQ(u.hosts[0].port, 65535);
    dlock__uri_free(&u);
}

TEST(uri_scheme_lowercased)
{
    dlock__uri u;

    parse_good("REDIS://Host:7", &u, NULL);
    CHECK_STR(u.scheme, "redis");
    CHECK_STR(u.hosts[0].host, "Host"); /* only the scheme is folded */
    CHECK_EQ(u.hosts[0].port, 7);
    CHECK_STR(u.redacted, "REDIS://Host:7");
    dlock__uri_free(&u);

    parse_good("File:///X", &u, NULL);
    CHECK_STR(u.scheme, "file");
    CHECK_STR(u.path, "/X");
    dlock__uri_free(&u);

    parse_good("ReDiS+TLS.v-2://h", &u, NULL);
    CHECK_STR(u.scheme, "redis+tls.v-2");
    dlock__uri_free(&u);
}

TEST(uri_user_password_decoded)
{
    static const char *const secrets[] = {"Zq%40xK9", "Zq@xK9", NULL};
    dlock__uri u;

    parse_good("redis://user:Zq%40xK9@host:6380/1", &u, secrets);
    CHECK_STR(u.user, "user");
    CHECK_STR(u.password, "Zq@xK9");
    CHECK_EQ(u.nhosts, 1);
    CHECK_STR(u.hosts[0].host, "host");
    CHECK_EQ(u.hosts[0].port, 6380);
    CHECK_STR(u.path, "/1");
    CHECK_STR(u.redacted, "redis://user:***@host:6380/1");
    dlock__uri_free(&u);
    CHECK(u.password == NULL);

    /* the example of the brief: p%40ss -> p@ss */
    static const char *const s2[] = {"p%40ss", "p@ss", NULL};
    parse_good("redis://admin:p%40ss@h", &u, s2);
    CHECK_STR(u.user, "admin");
    CHECK_STR(u.password, "p@ss");
    CHECK_STR(u.redacted, "redis://admin:***@h");
    dlock__uri_free(&u);

    /* escapes decode in the user name too; lowercase hex works */
    static const char *const s3[] = {"W%2fx%3Ay", "W/x:y", NULL};
    parse_good("redis://us%65r%2Bx:W%2fx%3Ay@h", &u, s3);
    CHECK_STR(u.user, "user+x");
    CHECK_STR(u.password, "W/x:y");
    CHECK_STR(u.redacted, "redis://us%65r%2Bx:***@h");
    dlock__uri_free(&u);

    /* a user without a password: nothing to redact */
    parse_good("redis://alice@h:1", &u, NULL);
    CHECK_STR(u.user, "alice");
    CHECK(u.password == NULL);
    CHECK_STR(u.redacted, "redis://alice@h:1");
    dlock__uri_free(&u);

    /* a password without a user */
    static const char *const s4[] = {"Q7rTm2", NULL};
    parse_good("redis://:Q7rTm2@h", &u, s4);
    CHECK(u.user == NULL);
    CHECK_STR(u.password, "Q7rTm2");
    CHECK_STR(u.redacted, "redis://:***@h");
    dlock__uri_free(&u);

    /* a long password */
    static const char *const s5[] = {"VeryLongSecretPassword0123456789", NULL};
    parse_good("redis://u:VeryLongSecretPassword0123456789@h?prefix=p", &u,
               s5);
    CHECK_STR(u.password, "VeryLongSecretPassword0123456789");
    CHECK_STR(u.redacted, "redis://u:***@h?prefix=p");
    CHECK_STR(dlock__uri_param(&u, "prefix"), "p");
    dlock__uri_free(&u);
}

TEST(uri_password_empty)
{
    dlock__uri u;

    parse_good("redis://:@host", &u, NULL);
    CHECK(u.user == NULL);
    CHECK(u.password != NULL);
    CHECK_STR(u.password, "");
    CHECK_STR(u.redacted, "redis://:***@host");
    dlock__uri_free(&u);

    parse_good("redis://bob:@host", &u, NULL);
    CHECK_STR(u.user, "bob");
    CHECK_STR(u.password, "");
    CHECK_STR(u.redacted, "redis://bob:***@host");
    dlock__uri_free(&u);

    /* '@' alone: neither user nor password */
    parse_good("redis://@host", &u, NULL);
    CHECK(u.user == NULL);
    CHECK(u.password == NULL);
    CHECK_STR(u.hosts[0].host, "host");
    dlock__uri_free(&u);
}

TEST(uri_ipv6)
{
    dlock__uri u;

    parse_good("redis://[::1]:6379", &u, NULL);
    CHECK_EQ(u.nhosts, 1);
    CHECK_STR(u.hosts[0].host, "::1");
    CHECK_EQ(u.hosts[0].port, 6379);
    dlock__uri_free(&u);

    parse_good("redis://[::1]", &u, NULL);
    CHECK_STR(u.hosts[0].host, "::1");
    CHECK_EQ(u.hosts[0].port, 0);
    dlock__uri_free(&u);

    static const char *const s[] = {"B6pwX", NULL};
    parse_good("redis://u:B6pwX@[2001:db8::7]:7000/3", &u, s);
    CHECK_STR(u.hosts[0].host, "2001:db8::7");
    CHECK_EQ(u.hosts[0].port, 7000);
    CHECK_STR(u.path, "/3");
    CHECK_STR(u.redacted, "redis://u:***@[2001:db8::7]:7000/3");
    dlock__uri_free(&u);

    /* zone id, escaped */
    parse_good("redis://[fe80::1%25eth0]:1", &u, NULL);
    CHECK_STR(u.hosts[0].host, "fe80::1%eth0");
    CHECK_EQ(u.hosts[0].port, 1);
    dlock__uri_free(&u);
}

TEST(uri_host_list)
{
    dlock__uri u;

    parse_good("redis://a:1,b:2", &u, NULL);
    CHECK_EQ(u.nhosts, 2);
    CHECK_STR(u.hosts[0].host, "a");
    CHECK_EQ(u.hosts[0].port, 1);
    CHECK_STR(u.hosts[1].host, "b");
    CHECK_EQ(u.hosts[1].port, 2);
    dlock__uri_free(&u);

    static const char *const s[] = {"L1stPw", NULL};
    parse_good("redlock://x:L1stPw@a,b:2,[::1]:3/?prefix=q", &u, s);
    CHECK_STR(u.scheme, "redlock");
    CHECK_EQ(u.nhosts, 3);
    CHECK_STR(u.hosts[0].host, "a");
    CHECK_EQ(u.hosts[0].port, 0);
    CHECK_STR(u.hosts[1].host, "b");
    CHECK_EQ(u.hosts[1].port, 2);
    CHECK_STR(u.hosts[2].host, "::1");
    CHECK_EQ(u.hosts[2].port, 3);
    CHECK_STR(u.path, "/");
    CHECK_STR(dlock__uri_param(&u, "prefix"), "q");
    CHECK_STR(u.redacted, "redlock://x:***@a,b:2,[::1]:3/?prefix=q");
    dlock__uri_free(&u);
}

TEST(uri_file)
{
    dlock__uri u;

    parse_good("file:///dir", &u, NULL);
    CHECK_STR(u.scheme, "file");
    CHECK_EQ(u.nhosts, 0);
    CHECK(u.user == NULL && u.password == NULL);
    CHECK_STR(u.path, "/dir");
    CHECK_EQ(u.nparams, 0);
    CHECK_STR(u.redacted, "file:///dir");
    dlock__uri_free(&u);

    parse_good("file:///var/lock/d%20x/%C3%A9?private=1", &u, NULL);
    CHECK_EQ(u.nhosts, 0);
    CHECK_STR(u.path, "/var/lock/d x/\xc3\xa9");
    CHECK_STR(dlock__uri_param(&u, "private"), "1");
    dlock__uri_free(&u);

    parse_good("file://localhost/dir", &u, NULL);
    CHECK_EQ(u.nhosts, 1);
    CHECK_STR(u.hosts[0].host, "localhost");
    CHECK_STR(u.path, "/dir");
    dlock__uri_free(&u);

    /* the parser itself accepts an empty authority and path; the stores
     * decide whether that is enough */
    parse_good("file://", &u, NULL);
    CHECK_EQ(u.nhosts, 0);
    CHECK_STR(u.path, "");
    dlock__uri_free(&u);
}

TEST(uri_unix)
{
    dlock__uri u;

    parse_good("unix:///path/s.sock", &u, NULL);
    CHECK_STR(u.scheme, "unix");
    CHECK_EQ(u.nhosts, 0);
    CHECK(u.user == NULL && u.password == NULL);
    CHECK_STR(u.path, "/path/s.sock");
    dlock__uri_free(&u);

    static const char *const s[] = {"Un1xPw", NULL};
    parse_good("unix://:Un1xPw@/path/s.sock?db=3&prefix=p", &u, s);
    CHECK(u.user == NULL);
    CHECK_STR(u.password, "Un1xPw");
    CHECK_EQ(u.nhosts, 0);
    CHECK_STR(u.path, "/path/s.sock");
    CHECK_STR(dlock__uri_param(&u, "db"), "3");
    CHECK_STR(dlock__uri_param(&u, "prefix"), "p");
    CHECK_STR(u.redacted, "unix://:***@/path/s.sock?db=3&prefix=p");
    dlock__uri_free(&u);

    static const char *const s2[] = {"Pw%2F9", "Pw/9", NULL};
    parse_good("unix://me:Pw%2F9@/run/redis.sock", &u, s2);
    CHECK_STR(u.user, "me");
    CHECK_STR(u.password, "Pw/9");
    CHECK_STR(u.path, "/run/redis.sock");
    CHECK_STR(u.redacted, "unix://me:***@/run/redis.sock");
    dlock__uri_free(&u);
}

TEST(uri_query_params)
{
    dlock__uri u;

    parse_good("redis://h?prefix=a%2Fb&timeout=500&flag", &u, NULL);
    CHECK_EQ(u.nparams, 3);
    CHECK_STR(u.params[0].key, "prefix");
    CHECK_STR(dlock__uri_param(&u, "prefix"), "a/b");
    CHECK_STR(dlock__uri_param(&u, "timeout"), "500");
    CHECK(dlock__uri_param(&u, "flag") != NULL);
    CHECK_STR(dlock__uri_param(&u, "flag"), "");
    CHECK_STR(u.path, "");
    dlock__uri_free(&u);

    /* empty pieces are skipped */
    parse_good("redis://h/0?a=1&&b=2&", &u, NULL);
    CHECK_EQ(u.nparams, 2);
    CHECK_STR(dlock__uri_param(&u, "a"), "1");
    CHECK_STR(dlock__uri_param(&u, "b"), "2");
    CHECK_STR(u.path, "/0");
    dlock__uri_free(&u);

    /* keys decode too; '=' in a value is kept */
    parse_good("redis://h?k%3D=v%26w&x=b=c", &u, NULL);
    CHECK_STR(dlock__uri_param(&u, "k="), "v&w");
    CHECK_STR(dlock__uri_param(&u, "x"), "b=c");
    dlock__uri_free(&u);

    /* a lone '?' */
    parse_good("redis://h?", &u, NULL);
    CHECK_EQ(u.nparams, 0);
    dlock__uri_free(&u);

    /* a '?' right after the authority, and a '/' inside a value */
    parse_good("file:///d?private=0&x=/y", &u, NULL);
    CHECK_STR(u.path, "/d");
    CHECK_STR(dlock__uri_param(&u, "x"), "/y");
    dlock__uri_free(&u);
}

TEST(uri_check_params)
{
    static const char *const allowed[] = {"prefix", "timeout", NULL};
    dlock__uri u;

    parse_good("redis://h?prefix=x&timeout=1", &u, NULL);
    CHECK_OK(dlock__uri_check_params(&u, allowed));
    CHECK_RC(dlock__uri_check_params(&u, NULL), DLOCK_EINVAL);
    dlock__uri_free(&u);

    parse_good("Redis://h?prefix=x&bogus=1", &u, NULL);
    CHECK_RC(dlock__uri_check_params(&u, allowed), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "bogus");
    CHECK_CONTAINS(dlock_errmsg(), "redis://");
    dlock__uri_free(&u);

    parse_good("redis://h", &u, NULL);
    CHECK_OK(dlock__uri_check_params(&u, allowed));
    CHECK_OK(dlock__uri_check_params(&u, NULL));
    dlock__uri_free(&u);
}

/* ------------------------------------------------------------------------ */
/* Bad URIs                                                                 */
/* ------------------------------------------------------------------------ */

TEST(uri_bad_shape)
{
    char longscheme[64];

    parse_bad(NULL, NULL, NULL);
    parse_bad("", NULL, NULL);
    parse_bad("redis", NULL, "scheme://");
    parse_bad("127.0.0.1:6379", NULL, NULL);
    parse_bad("redis:/x", NULL, NULL);
    parse_bad("redis:x", NULL, NULL);
    parse_bad("redis//x", NULL, NULL);
    parse_bad("://host", NULL, NULL);
    parse_bad("1redis://host", NULL, NULL);
    parse_bad("re dis://host", NULL, NULL);
    parse_bad("/var/lock/dlock", NULL, NULL);
    memset(longscheme, 'a', 40);
    strcpy(longscheme + 40, "://h");
    parse_bad(longscheme, NULL, NULL);
}

TEST(uri_bad_port)
{
    parse_bad("redis://h:0", NULL, "port");
    parse_bad("redis://h:65536", NULL, "port");
    parse_bad("redis://h:99999", NULL, "port");
    parse_bad("redis://h:123456789", NULL, "port");
    parse_bad("redis://h:abc", NULL, "port");
    parse_bad("redis://h:", NULL, "port");
    parse_bad("redis://h:-1", NULL, "port");
    parse_bad("redis://h:+1", NULL, "port");
    parse_bad("redis://h:1:2", NULL, "port");
    parse_bad("redis://[::1]:0", NULL, "port");
    parse_bad("redis://[::1]:", NULL, "port");
    parse_bad("redis://a:1,b:0", NULL, "port");
}

TEST(uri_bad_hosts)
{
    parse_bad("redis://a:1,,b:2", NULL, "empty host");
    parse_bad("redis://a:1,", NULL, "empty host");
    parse_bad("redis://,a:1", NULL, "empty host");
    parse_bad("redis://:6379", NULL, "empty host");
    parse_bad("redis://[::1", NULL, "'['");
    parse_bad("redis://[::1/x", NULL, "'['");
    parse_bad("redis://[::1]x", NULL, NULL);
    parse_bad("redis://[]:1", NULL, NULL);
    parse_bad("redis://h!st", NULL, NULL);
    parse_bad("redis://h%zz", NULL, NULL);
    parse_bad("redis://h%00", NULL, NULL);
}

TEST(uri_bad_escapes)
{
    parse_bad("file:///d%zz", NULL, "escape");
    parse_bad("file:///d%4", NULL, "escape");
    parse_bad("file:///d%", NULL, "escape");
    parse_bad("file:///d%g0", NULL, "escape");
    parse_bad("file:///d%00x", NULL, "escape");
    parse_bad("redis://h?a=%zz", NULL, "escape");
    parse_bad("redis://h?a=%0", NULL, "escape");
    parse_bad("redis://h?%00=1", NULL, "escape");
    parse_bad("redis://u%zz@h", NULL, "escape");
}

TEST(uri_bad_characters)
{
    parse_bad("redis://h x", NULL, NULL);
    parse_bad("redis://h/a b", NULL, NULL);
    parse_bad("redis://h?a=b c", NULL, NULL);
    parse_bad("redis://h\t", NULL, NULL);
    parse_bad("redis://h\n", NULL, NULL);
    parse_bad("redis://h\x7f", NULL, NULL);
    parse_bad("redis://h\x01", NULL, NULL);
    parse_bad("redis://h#frag", NULL, "'#'");
    parse_bad("file:///d#x", NULL, "'#'");
    parse_bad(" redis://h", NULL, NULL);
}

TEST(uri_bad_query)
{
    parse_bad("redis://h?a=1&a=2", NULL, "twice");
    parse_bad("redis://h?prefix=x&timeout=1&prefix=y", NULL, "prefix");
    parse_bad("redis://h?a=1&%61=2", NULL, "twice"); /* same key decoded */
    parse_bad("redis://h?=1", NULL, NULL);
    parse_bad("redis://h?a=1&=2", NULL, NULL);
}

/* Bad URIs that carry a password: refused, without the password in the
 * message. */
TEST(uri_bad_with_password)
{
    static const char *const s[] = {"Hx7Secret", NULL};

    parse_bad("redis://u:Hx7Secret@h:0", s, "port");
    parse_bad("redis://u:Hx7Secret@h:65536", s, "port");
    parse_bad("redis://u:Hx7Secret@h:abc", s, "port");
    parse_bad("redis://u:Hx7Secret@a:1,,b:2", s, "empty host");
    parse_bad("redis://u:Hx7Secret@[::1", s, "'['");
    parse_bad("redis://u:Hx7Secret@h?a=1&a=2", s, "twice");
    parse_bad("redis://u:Hx7Secret@h?a=%zz", s, NULL);
    parse_bad("redis://u:Hx7Secret@h#x", s, "'#'");
    parse_bad("redis://u:Hx7Secret@h x", s, NULL);
    parse_bad("unix://:Hx7Secret@/p/s.sock?db=1&db=2", s, "twice");
    parse_bad("redis:/u:Hx7Secret@h", s, NULL);

    /* the bad part is the password itself */
    static const char *const s2[] = {"Hx7Secret", "Hx7Se", NULL};
    parse_bad("redis://u:Hx7Se%zzcret@h", s2, "password");
    parse_bad("redis://u:Hx7Se%00cret@h", s2, "password");
    parse_bad("redis://u:Hx7Secret%4@h", s2, "password");
    parse_bad("redis://u:Hx7Secret%@h", s2, "password");
    parse_bad("redis://u:Hx7 Secret@h", s2, NULL);
    parse_bad("redis://u:Hx7#Secret@h", s2, NULL);
    parse_bad("redis://u:Hx7Secret\x01@h", s2, NULL);

    static const char *const s3[] = {"Hx7Secret", "Hx7Secret%C", NULL};
    parse_bad("redis://u:Hx7Secret%C@h", s3, NULL);
}

/*
 * A password with an unescaped '/' or '?' (a common mistake) ends the
 * authority early: "redis://u:Ab1/x@h" parses "u:Ab1" as host "u" with port
 * "Ab1". The URI is refused, rightly, but the message must not quote the
 * "port" text, which is the start of the password.
 */
TEST(uri_password_unescaped_delimiter_not_in_error)
{
    static const char *const s[] = {"Ab1", NULL};

    parse_bad("redis://u:Ab1/x@h", s, NULL);
    parse_bad("redis://u:Ab1?x@h", s, NULL);
}

/* ------------------------------------------------------------------------ */
/* Redaction of any password byte (issue 34)                                */
/* ------------------------------------------------------------------------ */

/* Every URI kind, with a password holding '/', '?', '@', '%' and ':'
 * unescaped: the parser refuses it without a piece of the password in its
 * message, and dlock_uri_redact() hides all of it in every form. */
static const char *const every_kind[] = {
    "redis://u:%s@h:6379/0",
    "rediss://u:%s@h:6380?cacert=/c.pem",
    "unix://u:%s@/run/redis.sock?db=1",
    "redis-sentinel://u:%s@s1:26379,s2:26379/mymaster",
    "redis-cluster://u:%s@c1:7000,c2:7001",
    "redlock://u:%s@r1:6379,r2:6380,r3:6381/0?node_timeout=50",
    "zk://u:%s@z1:2181,z2:2181/dlock",
    "etcd://u:%s@e1:2379,e2:2379?prefix=p",
    "etcds://u:%s@e1:2379?cacert=/c.pem",
    "postgres://u:%s@db:5432/appdb?sslmode=require",
    "postgresql://u:%s@db1,db2:5433/appdb",
    "mysql://u:%s@db:3306/appdb",
    "mariadb://u:%s@db/appdb?table=t",
    "sqlite://u:%s@/var/lib/x.db",
    "file://u:%s@/var/lock/dlock",
    NULL};

static void check_hidden(const char *uri, const char *const *pieces)
{
    static const unsigned hows[] = {0, DLOCK_REDACT_STARS, DLOCK_REDACT_DROP};
    char buf[512];

    for (size_t h = 0; h < 3; h++) {
        size_t n = dlock_uri_redact(uri, hows[h], buf, sizeof(buf));
        CHECK(n < sizeof(buf));
        CHECK_EQ(strlen(buf), n);
        for (size_t i = 0; pieces[i]; i++)
            if (strstr(buf, pieces[i]))
                th_fail(__FILE__, __LINE__, "redact(%u) of %s: %s shows %s",
                        hows[h], uri, buf, pieces[i]);
        if (hows[h] == DLOCK_REDACT_STARS)
            CHECK_EQ(n, strlen(uri));
    }
}

TEST(uri_redact_every_kind_any_byte)
{
    static const char *const pws[] = {"S3cret/x?y@z%41:w", "ab/S3cret",
                                      "S3cret?q=1@x", "p@ss:S3cret/",
                                      "%zz:S3cret?password=1&x@", NULL};
    static const char *const pieces[] = {"S3cret", NULL};

    for (size_t k = 0; every_kind[k]; k++)
        for (size_t p = 0; pws[p]; p++) {
            char uri[256];
            snprintf(uri, sizeof(uri), every_kind[k], pws[p]);
            check_hidden(uri, pieces);
            parse_bad(uri, pieces, NULL);
        }
}

/* The issue's URI: a password with an unescaped '/' was printed in clear;
 * the user information is everything up to the last '@'. */
TEST(uri_redact_issue_example)
{
    static const char *const pieces[] = {"S3cret", NULL};
    char buf[128];

    parse_bad("postgres://127.0.0.1:1/S3cret@db/appdb", pieces,
              "escape '/', '?' and '@'");
    dlock_uri_redact("postgres://127.0.0.1:1/S3cret@db/appdb", 0, buf,
                     sizeof(buf));
    CHECK_STR(buf, "postgres://127.0.0.1:***@db/appdb");
    dlock_uri_redact("postgres://127.0.0.1:1/S3cret@db/appdb",
                     DLOCK_REDACT_STARS, buf, sizeof(buf));
    CHECK_STR(buf, "postgres://127.0.0.1:********@db/appdb");
    dlock_uri_redact("postgres://127.0.0.1:1/S3cret@db/appdb",
                     DLOCK_REDACT_DROP, buf, sizeof(buf));
    CHECK_STR(buf, "postgres://127.0.0.1@db/appdb");
    /* escaped, it parses, and redacted and dlock_uri_redact() agree */
    dlock__uri u;
    parse_good("postgres://u:1%2FS3cret%3F%40%25%3A@db/appdb", &u, pieces);
    CHECK_STR(u.password, "1/S3cret?@%:");
    CHECK_STR(u.redacted, "postgres://u:***@db/appdb");
    dlock_uri_redact("postgres://u:1%2FS3cret%3F%40%25%3A@db/appdb", 0, buf,
                     sizeof(buf));
    CHECK_STR(buf, u.redacted);
    dlock__uri_free(&u);
    /* an '@' in a path is fine without a ':' before it ... */
    parse_good("file:///tmp/a@b", &u, NULL);
    CHECK_STR(u.path, "/tmp/a@b");
    dlock__uri_free(&u);
    /* ... and refused with one: it could end a password */
    parse_bad("redis://h:6379/0?prefix=a@b", NULL, "%40");
}

/* A password as a query parameter is refused (before any message names a
 * parameter) and hidden up to the end of the URI. */
TEST(uri_redact_query_secrets)
{
    static const char *const pieces[] = {"S3cret", NULL};
    char buf[128];

    parse_bad("postgres://db/app?password=S3cret", pieces, "password_file");
    parse_bad("postgres://db/app?sslpassword=S3cret&S3cret=1&S3cret=2",
              pieces, "password_file");
    parse_bad("redis://h?x=1&Pass%77ord=S3cret", pieces, "password_file");
    parse_bad("etcd://h:2379?token=S3cret", pieces, NULL);
    check_hidden("postgres://db/app?password=S3cret&sslmode=require", pieces);
    check_hidden("postgres://db/app?sslmode=require&PASSWORD=a&S3cret",
                 pieces);
    check_hidden("redis://h?a:b&auth=x@S3cret", pieces);
    dlock_uri_redact("postgres://db/app?sslmode=require&password=S3cret", 0,
                     buf, sizeof(buf));
    CHECK_STR(buf, "postgres://db/app?sslmode=require&password=***");
    dlock_uri_redact("postgres://db/app?password=S3cret&sslmode=require",
                     DLOCK_REDACT_DROP, buf, sizeof(buf));
    CHECK_STR(buf, "postgres://db/app");
    /* password_file names a file: not a secret */
    dlock_uri_redact("redis://h?password_file=/run/pw", 0, buf, sizeof(buf));
    CHECK_STR(buf, "redis://h?password_file=/run/pw");
}

TEST(uri_redact_forms)
{
    char buf[64], small[8];

    dlock_uri_redact("redis://u:pw@h", DLOCK_REDACT_DROP, buf, sizeof(buf));
    CHECK_STR(buf, "redis://u@h");
    dlock_uri_redact("redis://:pw@h/1", DLOCK_REDACT_DROP, buf, sizeof(buf));
    CHECK_STR(buf, "redis://h/1");
    dlock_uri_redact("redis://u@h", 0, buf, sizeof(buf));
    CHECK_STR(buf, "redis://u@h");
    dlock_uri_redact("redis://:@h", 0, buf, sizeof(buf));
    CHECK_STR(buf, "redis://:***@h");
    /* no scheme: everything counts */
    dlock_uri_redact("u:S3cret@h", 0, buf, sizeof(buf));
    CHECK_STR(buf, "u:***@h");
    dlock_uri_redact(":S3cret@h/x://y", 0, buf, sizeof(buf));
    CHECK_STR(buf, ":***@h/x://y");
    dlock_uri_redact(NULL, 0, buf, sizeof(buf));
    CHECK_STR(buf, "");
    /* snprintf-like: the length needed, truncated output terminated */
    CHECK_EQ(dlock_uri_redact("redis://u:pw@host", 0, NULL, 0), 18);
    CHECK_EQ(dlock_uri_redact("redis://u:pw@host", 0, small, sizeof(small)),
             18);
    CHECK_STR(small, "redis:/");
    /* in place, same length */
    char arg[] = "redis://u:p/w?@h:1/0";
    CHECK_EQ(dlock_uri_redact(arg, DLOCK_REDACT_STARS, arg, sizeof(arg)),
             strlen(arg));
    CHECK_STR(arg, "redis://u:****@h:1/0");
}

/* password_file=: one line, from a file others cannot read */
TEST(uri_password_file)
{
    char path[512], uri[700];
    dlock__uri u;
    FILE *f;

    snprintf(path, sizeof(path), "%s/pw-%d", th_tmpdir(), (int)getpid());
    f = fopen(path, "w");
    CHECK(f != NULL);
    fputs("S3cret/x?y@z%:\n", f);
    fclose(f);
    CHECK_EQ(chmod(path, 0600), 0);
    snprintf(uri, sizeof(uri), "postgres://u@db/app?password_file=%s&"
                               "sslmode=require", path);
    parse_good(uri, &u, NULL);
    CHECK_EQ(dlock__uri_take_password(&u), DLOCK_OK);
    CHECK_STR(u.password, "S3cret/x?y@z%:");
    CHECK(dlock__uri_param(&u, "password_file") == NULL);
    CHECK_STR(dlock__uri_param(&u, "sslmode"), "require");
    CHECK(strstr(u.redacted, "S3cret") == NULL);
    dlock__uri_free(&u);

    /* 0640 is fine (a service's group), 0604, 0660 and 0644 are not */
    CHECK_EQ(chmod(path, 0640), 0);
    parse_good(uri, &u, NULL);
    CHECK_EQ(dlock__uri_take_password(&u), DLOCK_OK);
    dlock__uri_free(&u);
    static const mode_t bad[] = {0604, 0660, 0644};
    for (size_t i = 0; i < 3; i++) {
        CHECK_EQ(chmod(path, bad[i]), 0);
        parse_good(uri, &u, NULL);
        CHECK_EQ(dlock__uri_take_password(&u), DLOCK_EAUTH);
        CHECK(strstr(dlock_errmsg(), "other users") != NULL);
        CHECK(strstr(dlock_errmsg(), "S3cret") == NULL);
        dlock__uri_free(&u);
    }
    CHECK_EQ(chmod(path, 0600), 0);

    /* a password in the URI too; a store without passwords; no file */
    snprintf(uri, sizeof(uri), "redis://:x@h?password_file=%s", path);
    parse_good(uri, &u, NULL);
    CHECK_EQ(dlock__uri_take_password(&u), DLOCK_EINVAL);
    dlock__uri_free(&u);
    snprintf(uri, sizeof(uri), "file:///d?password_file=%s", path);
    parse_good(uri, &u, NULL);
    CHECK_EQ(dlock__uri_take_password(&u), DLOCK_EINVAL);
    dlock__uri_free(&u);
    parse_good("redis://h?password_file=/nonexistent/pw", &u, NULL);
    CHECK_EQ(dlock__uri_take_password(&u), DLOCK_EAUTH);
    dlock__uri_free(&u);

    /* two lines, or empty: refused without showing them */
    f = fopen(path, "w");
    fputs("S3cret\nmore\n", f);
    fclose(f);
    snprintf(uri, sizeof(uri), "redis://h?password_file=%s", path);
    parse_good(uri, &u, NULL);
    CHECK_EQ(dlock__uri_take_password(&u), DLOCK_EINVAL);
    CHECK(strstr(dlock_errmsg(), "S3cret") == NULL);
    dlock__uri_free(&u);
    f = fopen(path, "w");
    fclose(f);
    parse_good(uri, &u, NULL);
    CHECK_EQ(dlock__uri_take_password(&u), DLOCK_EINVAL);
    dlock__uri_free(&u);
    /* "\r\n" ends the line too */
    f = fopen(path, "w");
    fputs("S3cret\r\n", f);
    fclose(f);
    parse_good(uri, &u, NULL);
    CHECK_EQ(dlock__uri_take_password(&u), DLOCK_OK);
    CHECK_STR(u.password, "S3cret");
    dlock__uri_free(&u);
    unlink(path);
}

/* DLOCK_PASSWORD, then REDISCLI_AUTH for the Redis schemes, when the URI
 * gives none; never for file:// and sqlite:// */
TEST(uri_password_env)
{
    dlock__uri u;

    setenv("DLOCK_PASSWORD", "fromdlock", 1);
    setenv("REDISCLI_AUTH", "fromredis", 1);
    parse_good("redis://h", &u, NULL);
    CHECK_EQ(dlock__uri_take_password(&u), DLOCK_OK);
    CHECK_STR(u.password, "fromdlock");
    dlock__uri_free(&u);
    parse_good("redis://:inuri@h", &u, NULL);
    CHECK_EQ(dlock__uri_take_password(&u), DLOCK_OK);
    CHECK_STR(u.password, "inuri");
    dlock__uri_free(&u);
    unsetenv("DLOCK_PASSWORD");
    parse_good("redlock://a:1,b:2", &u, NULL);
    CHECK_EQ(dlock__uri_take_password(&u), DLOCK_OK);
    CHECK_STR(u.password, "fromredis");
    dlock__uri_free(&u);
    parse_good("postgres://u@db/app", &u, NULL);
    CHECK_EQ(dlock__uri_take_password(&u), DLOCK_OK);
    CHECK(u.password == NULL); /* libpq: PGPASSWORD, ~/.pgpass */
    dlock__uri_free(&u);
    setenv("DLOCK_PASSWORD", "fromdlock", 1);
    parse_good("file:///d", &u, NULL);
    CHECK_EQ(dlock__uri_take_password(&u), DLOCK_OK);
    CHECK(u.password == NULL);
    dlock__uri_free(&u);
    parse_good("sqlite:///d.db", &u, NULL);
    CHECK_EQ(dlock__uri_take_password(&u), DLOCK_OK);
    CHECK(u.password == NULL);
    dlock__uri_free(&u);
    unsetenv("DLOCK_PASSWORD");
    unsetenv("REDISCLI_AUTH");
}

/* ------------------------------------------------------------------------ */
/* dlock__parse_int                                                         */
/* ------------------------------------------------------------------------ */

TEST(parse_int_basic)
{
    long long v = -7;

    CHECK_EQ(dlock__parse_int("0", 10, &v), 0);
    CHECK_EQ(v, 0);
    CHECK_EQ(dlock__parse_int("65535", 65535, &v), 0);
    CHECK_EQ(v, 65535);
    CHECK_EQ(dlock__parse_int("00042", 65535, &v), 0);
    CHECK_EQ(v, 42);
    CHECK_EQ(dlock__parse_int("9223372036854775807", LLONG_MAX, &v), 0);
    CHECK(v == LLONG_MAX);

    v = -7;
    CHECK_EQ(dlock__parse_int("65536", 65535, &v), -1);
    CHECK_EQ(dlock__parse_int("65540", 65535, &v), -1);
    CHECK_EQ(dlock__parse_int("100000", 65535, &v), -1);
    CHECK_EQ(dlock__parse_int("9223372036854775808", LLONG_MAX, &v), -1);
    CHECK_EQ(dlock__parse_int("99999999999999999999999", LLONG_MAX, &v), -1);
    CHECK_EQ(dlock__parse_int("", 10, &v), -1);
    CHECK_EQ(dlock__parse_int(NULL, 10, &v), -1);
    CHECK_EQ(dlock__parse_int("-1", 10, &v), -1);
    CHECK_EQ(dlock__parse_int("+1", 10, &v), -1);
    CHECK_EQ(dlock__parse_int(" 1", 10, &v), -1);
    CHECK_EQ(dlock__parse_int("1 ", 10, &v), -1);
    CHECK_EQ(dlock__parse_int("1a", 10, &v), -1);
    CHECK_EQ(dlock__parse_int("0x10", 100, &v), -1);
    CHECK_EQ(dlock__parse_int("1.5", 10, &v), -1);
    CHECK_EQ(v, -7); /* untouched on failure */

    CHECK_EQ(dlock__parse_int("10", 10, &v), 0);
    CHECK_EQ(v, 10);
    CHECK_EQ(dlock__parse_int("11", 10, &v), -1);
    CHECK_EQ(dlock__parse_int("19", 15, &v), -1);
}

/* "no larger than max" must hold for a max below 9 too. */
TEST(parse_int_small_max)
{
    long long v = -7;

    CHECK_EQ(dlock__parse_int("0", 0, &v), 0);
    CHECK_EQ(v, 0);
    CHECK_EQ(dlock__parse_int("5", 5, &v), 0);
    CHECK_EQ(v, 5);
    CHECK_EQ(dlock__parse_int("1", 0, &v), -1);
    CHECK_EQ(dlock__parse_int("7", 5, &v), -1);
    CHECK_EQ(dlock__parse_int("9", 1, &v), -1);
}

static const th_test tests[] = {
    T(uri_redis_host_only),
    T(uri_redis_port_db_query),
    T(uri_scheme_lowercased),
    T(uri_user_password_decoded),
    T(uri_password_empty),
    T(uri_ipv6),
    T(uri_host_list),
    T(uri_file),
    T(uri_unix),
    T(uri_query_params),
    T(uri_check_params),
    T(uri_bad_shape),
    T(uri_bad_port),
    T(uri_bad_hosts),
    T(uri_bad_escapes),
    T(uri_bad_characters),
    T(uri_bad_query),
    T(uri_bad_with_password),
    T(parse_int_basic),
    /* these two fail on known parser bugs (see their comments) */
    T(parse_int_small_max),
    T(uri_password_unescaped_delimiter_not_in_error),
    T(uri_redact_every_kind_any_byte),
    T(uri_redact_issue_example),
    T(uri_redact_query_secrets),
    T(uri_redact_forms),
    T(uri_password_file),
    T(uri_password_env),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    return th_main(argc, argv, tests);
}
