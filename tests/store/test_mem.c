/* SPDX-License-Identifier: MIT */
/*
 * test_mem.c -- what only the in-process store does (docs/design.md,
 * "The in-process store"): spaces, their life, a forked child, its URIs.
 * Its locks' contract is the generic suites' (their `mem` kind).
 */
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TEST(clients_of_one_space_share_its_locks_and_no_other)
{
    dlock_client *a = th_client("mem://space-a", NULL);
    dlock_client *b = th_client("mem://space-a", NULL);
    dlock_client *c = th_client("mem://space-b", NULL);
    dlock_client *d = th_client("mem://", NULL);
    dlock *la = th_handle(a, "n", 0, 0, 0), *lb = th_handle(b, "n", 0, 0, 0);
    dlock *lc = th_handle(c, "n", 0, 0, 0), *ld = th_handle(d, "n", 0, 0, 0);

    CHECK_OK(dlock_acquire(la, 0));
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY); /* the same space */
    CHECK_OK(dlock_acquire(lc, 0));              /* another one */
    CHECK_OK(dlock_acquire(ld, 0));              /* the default one */
    CHECK_STR(dlock_client_store(a), "mem://space-a");
    CHECK_OK(dlock_release(la));
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OP(dlock_token(lb), >, 0);
    CHECK_OK(dlock_release(lb));
    CHECK_OK(dlock_release(lc));
    CHECK_OK(dlock_release(ld));
    TH_CLOSE(la, lb, lc, ld);
    TH_CLIENT_CLOSE(a, b, c, d);
}

TEST(a_space_lives_while_a_client_of_it_is_open)
{
    dlock_client *a = th_client("mem://life", NULL);
    dlock *l = th_handle(a, "n", 0, 0, 0);
    dlock_info in;

    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    dlock_client *b = th_client("mem://life", NULL);
    dlock_close(l);
    dlock_client_close(a);
    /* b keeps it: the last token is still known */
    CHECK_OK(dlock_inspect(b, "n", &in));
    CHECK_OP(in.token, >, 0);
    dlock_info_clear(&in);
    dlock_client_close(b);
    /* with its last client gone, the space went: a new one is empty */
    dlock_client *c = th_client("mem://life", NULL);
    CHECK_OK(dlock_inspect(c, "n", &in));
    CHECK_EQ(in.token, 0);
    CHECK_EQ(in.held, 0);
    dlock_info_clear(&in);
    dlock_client_close(c);
}

/* A forked child: a space of its own, not its copy of the parent's. */
static int child_sees(void *arg)
{
    dlock_client *c = NULL;
    dlock *l = NULL;

    (void)arg;
    if (dlock_client_open(&c, "mem://forked", NULL) != DLOCK_OK ||
        dlock_open(&l, c, "n", NULL) != DLOCK_OK)
        return 2;
    int rc = dlock_acquire(l, 0); /* the parent holds it in its space */
    if (rc == DLOCK_OK)
        dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
    return rc == DLOCK_OK ? 0 : 1;
}

TEST(a_forked_child_has_spaces_of_its_own)
{
    dlock_client *a = th_client("mem://forked", NULL);
    dlock *l = th_handle(a, "n", 0, 0, 0);

    CHECK_OK(dlock_acquire(l, 0));
    pid_t pid = th_fork(child_sees, NULL);
    CHECK_EQ(th_wait(pid), 0);
    CHECK_EQ(dlock_held(l), 1); /* the child's space did not touch ours */
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(a);
}

TEST(bad_uris_are_refused)
{
    dlock_client *c = NULL;
    static const char *const bad[] = {"mem://u:secret@x", "mem://x:1",
                                      "mem://x/path", "mem://x?prefix=p",
                                      "mem://a,b"};
    char longname[300];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK_RC(dlock_client_open(&c, bad[i], NULL), DLOCK_EINVAL);
        CHECK(c == NULL);
        CHECK(strstr(dlock_errmsg(), "secret") == NULL);
    }
    memset(longname, 'a', sizeof(longname));
    memcpy(longname, "mem://", 6);
    longname[sizeof(longname) - 1] = '\0';
    CHECK_RC(dlock_client_open(&c, longname, NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "at most");
}

static const th_test tests[] = {
    T(clients_of_one_space_share_its_locks_and_no_other),
    T(a_space_lives_while_a_client_of_it_is_open),
    T(a_forked_child_has_spaces_of_its_own),
    T(bad_uris_are_refused),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    return th_main(argc, argv, tests);
}
