/* SPDX-License-Identifier: MIT */
/*
 * test_errors.c -- return codes and their words, the version, the
 * thread-local error message, and calls with NULL or bad arguments.
 *
 * Needs no server: the one client it opens is a file store in a temporary
 * directory.
 */
#include "test.h"

#include <limits.h>
#include <pthread.h>

static const struct {
    int code;
    const char *name;
} codes[] = {
    {DLOCK_OK, "DLOCK_OK"},
    {DLOCK_EBUSY, "DLOCK_EBUSY"},
    {DLOCK_ELOST, "DLOCK_ELOST"},
    {DLOCK_ENOTHELD, "DLOCK_ENOTHELD"},
    {DLOCK_EINVAL, "DLOCK_EINVAL"},
    {DLOCK_ECONN, "DLOCK_ECONN"},
    {DLOCK_EAUTH, "DLOCK_EAUTH"},
    {DLOCK_EPROTO, "DLOCK_EPROTO"},
    {DLOCK_ENOMEM, "DLOCK_ENOMEM"},
    {DLOCK_ENOTSUP, "DLOCK_ENOTSUP"},
    {DLOCK_EDEADLK, "DLOCK_EDEADLK"},
    {DLOCK_ECANCELED, "DLOCK_ECANCELED"},
};
#define NCODES (sizeof(codes) / sizeof(codes[0]))

/* A client on a file store of its own. */
static dlock_client *file_client(void)
{
    char uri[700];
    dlock_client *c = NULL;

    snprintf(uri, sizeof(uri), "file://%s/locks", th_tmpdir());
    CHECK_OK(dlock_client_open(&c, uri, NULL));
    CHECK(c != NULL);
    return c;
}

TEST(codes_fixed_numbers)
{
    /* codes are never renumbered */
    CHECK_EQ(DLOCK_OK, 0);
    CHECK_EQ(DLOCK_EBUSY, -1);
    CHECK_EQ(DLOCK_ELOST, -2);
    CHECK_EQ(DLOCK_ENOTHELD, -3);
    CHECK_EQ(DLOCK_EINVAL, -4);
    CHECK_EQ(DLOCK_ECONN, -5);
    CHECK_EQ(DLOCK_EAUTH, -6);
    CHECK_EQ(DLOCK_EPROTO, -7);
    CHECK_EQ(DLOCK_ENOMEM, -8);
    CHECK_EQ(DLOCK_ENOTSUP, -9);
    CHECK_EQ(DLOCK_EDEADLK, -10);
    CHECK_EQ(DLOCK_ECANCELED, -11);
    CHECK_EQ(NCODES, 12);
}

TEST(strerror_distinct)
{
    for (size_t i = 0; i < NCODES; i++) {
        const char *s = dlock_strerror(codes[i].code);
        CHECK(s != NULL);
        CHECK(s[0] != '\0');
        if (!strcmp(s, "unknown error code"))
            th_fail(__FILE__, __LINE__, "%s has no description",
                    codes[i].name);
        for (size_t k = 0; k < i; k++)
            if (!strcmp(s, dlock_strerror(codes[k].code)))
                th_fail(__FILE__, __LINE__,
                        "%s and %s share the description \"%s\"",
                        codes[i].name, codes[k].name, s);
    }
}

TEST(errname_matches)
{
    for (size_t i = 0; i < NCODES; i++) {
        const char *n = dlock_errname(codes[i].code);
        CHECK(n != NULL);
        CHECK_STR(n, codes[i].name);
        for (size_t k = 0; k < i; k++)
            CHECK(strcmp(n, dlock_errname(codes[k].code)) != 0);
    }
}

TEST(unknown_codes)
{
    static const int unknown[] = {1, 2, 42, -12, -13, -100, INT_MAX, INT_MIN};

    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        CHECK_STR(dlock_strerror(unknown[i]), "unknown error code");
        const char *n = dlock_errname(unknown[i]);
        CHECK(n != NULL);
        CHECK(n[0] != '\0');
        for (size_t k = 0; k < NCODES; k++)
            CHECK(strcmp(n, codes[k].name) != 0);
    }
}

TEST(version)
{
    CHECK(dlock_version() != NULL);
    CHECK_STR(dlock_version(), DLOCK_VERSION_STRING);
    char v[32];
    snprintf(v, sizeof(v), "%d.%d.%d", DLOCK_VERSION_MAJOR,
             DLOCK_VERSION_MINOR, DLOCK_VERSION_PATCH);
    CHECK_STR(v, DLOCK_VERSION_STRING);
}

/* ------------------------------------------------------------------------ */
/* The message is per thread                                                */
/* ------------------------------------------------------------------------ */

typedef struct thread_result {
    char before[512]; /* the thread's message before it failed anything */
    int rc;
    char after[512]; /* its message after the failure */
    int out_null;
} thread_result;

static void *failing_thread(void *arg)
{
    thread_result *r = arg;
    dlock_client *c = (dlock_client *)&r->rc; /* anything not NULL */

    snprintf(r->before, sizeof(r->before), "%s", dlock_errmsg());
    r->rc = dlock_client_open(&c, "nope", NULL);
    r->out_null = c == NULL;
    snprintf(r->after, sizeof(r->after), "%s", dlock_errmsg());
    return NULL;
}

static void *quiet_thread(void *arg)
{
    thread_result *r = arg;

    snprintf(r->before, sizeof(r->before), "%s", dlock_errmsg());
    return NULL;
}

TEST(errmsg_thread_local)
{
    thread_result r;
    pthread_t t;
    char mine[512];

    /* this thread's own failure */
    CHECK_RC(dlock_acquire(NULL, 0), DLOCK_EINVAL);
    snprintf(mine, sizeof(mine), "%s", dlock_errmsg());
    CHECK(mine[0] != '\0');

    /* another thread fails: its message is its own */
    memset(&r, 0, sizeof(r));
    CHECK_EQ(pthread_create(&t, NULL, failing_thread, &r), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
    CHECK_STR(r.before, ""); /* a new thread starts with no message */
    CHECK_EQ(r.rc, DLOCK_EINVAL);
    CHECK(r.out_null);
    CHECK(r.after[0] != '\0');
    CHECK(strcmp(r.after, mine) != 0);
    CHECK_STR(dlock_errmsg(), mine); /* ours is untouched */

    /* and ours does not show in a fresh thread either */
    memset(&r, 0, sizeof(r));
    CHECK_EQ(pthread_create(&t, NULL, quiet_thread, &r), 0);
    CHECK_EQ(pthread_join(t, NULL), 0);
    CHECK_STR(r.before, "");
    CHECK_STR(dlock_errmsg(), mine);
}

/* ------------------------------------------------------------------------ */
/* NULL and bad arguments                                                   */
/* ------------------------------------------------------------------------ */

TEST(null_arguments)
{
    dlock_client *c = file_client();
    dlock *l = (dlock *)&l; /* not NULL: calls must reset it */
    dlock_info info;

    /* dlock_client_open */
    CHECK_RC(dlock_client_open(NULL, "file:///tmp", NULL), DLOCK_EINVAL);
    CHECK(dlock_errmsg()[0] != '\0');

    /* dlock_open */
    CHECK_RC(dlock_open(NULL, c, "x", NULL), DLOCK_EINVAL);
    CHECK(dlock_errmsg()[0] != '\0');
    l = (dlock *)&l;
    CHECK_RC(dlock_open(&l, NULL, "x", NULL), DLOCK_EINVAL);
    CHECK(l == NULL);
    l = (dlock *)&l;
    CHECK_RC(dlock_open(&l, c, NULL, NULL), DLOCK_EINVAL);
    CHECK(l == NULL);
    CHECK(dlock_errmsg()[0] != '\0');

    /* lock calls on a NULL handle */
    CHECK_RC(dlock_acquire(NULL, 0), DLOCK_EINVAL);
    CHECK_RC(dlock_acquire(NULL, -1), DLOCK_EINVAL);
    CHECK_RC(dlock_acquire(NULL, 100), DLOCK_EINVAL);
    CHECK_RC(dlock_release(NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_extend(NULL, 1), DLOCK_EINVAL);
    CHECK_EQ(dlock_token(NULL), 0);
    CHECK_EQ(dlock_held(NULL), 0);
    CHECK(dlock_name(NULL) != NULL);
    CHECK(dlock_client_store(NULL) != NULL);
    dlock_close(NULL);
    dlock_client_close(NULL);

    /* dlock_inspect */
    memset(&info, 0x5a, sizeof(info));
    CHECK_RC(dlock_inspect(NULL, "x", &info), DLOCK_EINVAL);
    CHECK_EQ(info.held, 0);
    CHECK(info.queue == NULL);
    CHECK_EQ(info.queue_len, 0);
    memset(&info, 0x5a, sizeof(info));
    CHECK_RC(dlock_inspect(c, NULL, &info), DLOCK_EINVAL);
    CHECK(info.queue == NULL);
    CHECK_EQ(info.queue_len, 0);
    CHECK_RC(dlock_inspect(c, "x", NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_inspect(NULL, NULL, NULL), DLOCK_EINVAL);
    dlock_info_clear(NULL);

    /* the client still works after all that */
    CHECK_OK(dlock_inspect(c, "x", &info));
    CHECK_EQ(info.held, 0);
    dlock_info_clear(&info);
    dlock_client_close(c);
}

TEST(bad_arguments)
{
    dlock_client *c = file_client();
    dlock *l = NULL;
    dlock_options o;
    dlock_info info;
    char longname[DLOCK_NAME_MAX + 2];

    memset(longname, 'n', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';

    CHECK_RC(dlock_open(&l, c, "", NULL), DLOCK_EINVAL);
    CHECK(l == NULL);
    CHECK_RC(dlock_open(&l, c, longname, NULL), DLOCK_EINVAL);
    CHECK(l == NULL);
    CHECK_RC(dlock_inspect(c, "", &info), DLOCK_EINVAL);
    CHECK_RC(dlock_inspect(c, longname, &info), DLOCK_EINVAL);
    longname[DLOCK_NAME_MAX] = '\0'; /* exactly the longest */
    CHECK_OK(dlock_open(&l, c, longname, NULL));
    dlock_close(l);
    l = NULL;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = -1;
    CHECK_RC(dlock_open(&l, c, "x", &o), DLOCK_EINVAL);
    CHECK(l == NULL);
    memset(&o, 0, sizeof(o));
    o.flags = 0x100;
    CHECK_RC(dlock_open(&l, c, "x", &o), DLOCK_EINVAL);
    CHECK(l == NULL);

    dlock_client_options co;
    dlock_client *c2 = (dlock_client *)&c2;
    memset(&co, 0, sizeof(co));
    co.timeout_ms = -1;
    CHECK_RC(dlock_client_open(&c2, "file:///tmp", &co), DLOCK_EINVAL);
    CHECK(c2 == NULL);

    CHECK_OK(dlock_open(&l, c, "x", NULL));
    CHECK_STR(dlock_name(l), "x");
    CHECK_RC(dlock_acquire(l, -2), DLOCK_EINVAL);
    CHECK_RC(dlock_extend(l, 0), DLOCK_EINVAL);
    CHECK_RC(dlock_extend(l, -5), DLOCK_EINVAL);
    CHECK_RC(dlock_release(l), DLOCK_ENOTHELD);
    CHECK_EQ(dlock_held(l), 0);
    CHECK_EQ(dlock_token(l), 0);
    dlock_close(l);
    dlock_client_close(c);
}

TEST(store_unknown_scheme)
{
    dlock_client *c = (dlock_client *)&c;

    CHECK_RC(dlock_client_open(&c, "foo://x", NULL), DLOCK_EINVAL);
    CHECK(c == NULL);
    CHECK_CONTAINS(dlock_errmsg(), "foo");

    c = (dlock_client *)&c;
    CHECK_RC(dlock_client_open(&c, "FOO://x", NULL), DLOCK_EINVAL);
    CHECK(c == NULL);
    CHECK_CONTAINS(dlock_errmsg(), "foo");
}

TEST(store_not_built)
{
    dlock_client *c = (dlock_client *)&c;

    /* a build without hiredis has no redlock://; with it, the URI is
     * refused for its own fault, before any connection */
    int rc = dlock_client_open(&c, "redlock://u@h:1,h:2", NULL);
    CHECK(rc == DLOCK_ENOTSUP || rc == DLOCK_EINVAL);
    CHECK(c == NULL);
    CHECK_CONTAINS(dlock_errmsg(), "redlock");
    if (rc == DLOCK_EINVAL)
        CHECK_CONTAINS(dlock_errmsg(), "password");
}

TEST(store_bad_uri)
{
    dlock_client *c = (dlock_client *)&c;

    CHECK_RC(dlock_client_open(&c, "nope", NULL), DLOCK_EINVAL);
    CHECK(c == NULL);
    CHECK(dlock_errmsg()[0] != '\0');

    /* a password in a refused URI is not repeated */
    c = (dlock_client *)&c;
    CHECK_RC(dlock_client_open(&c, "redis://u:Pq8Zsecret@h:0", NULL),
             DLOCK_EINVAL);
    CHECK(c == NULL);
    CHECK(strstr(dlock_errmsg(), "Pq8Zsecret") == NULL);
    c = (dlock_client *)&c;
    CHECK_RC(dlock_client_open(&c, "foo://u:Pq8Zsecret@h", NULL),
             DLOCK_EINVAL);
    CHECK(strstr(dlock_errmsg(), "Pq8Zsecret") == NULL);
    /* file:// takes no credentials */
    c = (dlock_client *)&c;
    CHECK_RC(dlock_client_open(&c, "file://u:Pq8Zsecret@/tmp/x", NULL),
             DLOCK_EINVAL);
    CHECK(strstr(dlock_errmsg(), "Pq8Zsecret") == NULL);
}

/* Host lists longer than libpq's keyword buffers are refused in words, not
 * written past them (found by fuzz/fuzz_pg.c: the room left wrapped
 * around after the first host that did not fit). No server needed: the
 * URI is refused before any connection. */
TEST(store_pg_many_long_hosts)
{
    dlock_client *c = (dlock_client *)&c;
    char uri[2048];
    size_t o = (size_t)snprintf(uri, sizeof(uri), "postgres://");

    for (int i = 0; i < 5; i++) {
        if (i)
            uri[o++] = ',';
        memset(uri + o, 'h', 300);
        o += 300;
    }
    snprintf(uri + o, sizeof(uri) - o, "/db");
    int rc = dlock_client_open(&c, uri, NULL);
    CHECK(rc == DLOCK_EINVAL || rc == DLOCK_ENOTSUP);
    CHECK(c == NULL);
    CHECK_CONTAINS(dlock_errmsg(), "postgres");
}

static const th_test tests[] = {
    T(codes_fixed_numbers),
    T(strerror_distinct),
    T(errname_matches),
    T(unknown_codes),
    T(version),
    T(errmsg_thread_local),
    T(null_arguments),
    T(bad_arguments),
    T(store_unknown_scheme),
    T(store_not_built),
    T(store_bad_uri),
    T(store_pg_many_long_hosts),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    return th_main(argc, argv, tests);
}
