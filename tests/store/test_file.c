/*
 * test_file.c -- what only the file store does: the default location and
 * its safety checks, hostile files, replaced files, leases that do not
 * exist, and cancelled kernel waits that leave nothing behind.
 */
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[800];
static char uri[900];

static dlock_client *client(void)
{
    dlock_client *c = NULL;

    CHECK_OK(dlock_client_open(&c, uri, NULL));
    return c;
}

static dlock *handle(dlock_client *c, const char *name, int64_t ttl,
                     unsigned flags)
{
    dlock_options o;
    dlock *l = NULL;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = ttl;
    o.flags = flags;
    CHECK_OK(dlock_open(&l, c, name, &o));
    return l;
}

static void path_of(const char *file, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", dir, file);
}

/* ------------------------------------------------------------------------ */

TEST(default_store_is_a_private_directory)
{
    char xdg[900], expect[1000];
    struct stat st;
    dlock_client *c;

    snprintf(xdg, sizeof(xdg), "%s/xdg", th_tmpdir());
    mkdir(xdg, 0700);
    setenv("XDG_RUNTIME_DIR", xdg, 1);
    unsetenv("DLOCK_STORE");
    CHECK_OK(dlock_client_open(&c, NULL, NULL));
    snprintf(expect, sizeof(expect), "file://%s/dlock?private=1", xdg);
    CHECK_STR(dlock_client_store(c), expect);
    snprintf(expect, sizeof(expect), "%s/dlock", xdg);
    CHECK_EQ(stat(expect, &st), 0);
    CHECK(S_ISDIR(st.st_mode));
    CHECK_EQ(st.st_mode & 0777, 0700);
    dlock_client_close(c);

    /* DLOCK_STORE wins over the default */
    setenv("DLOCK_STORE", uri, 1);
    CHECK_OK(dlock_client_open(&c, "", NULL));
    CHECK_STR(dlock_client_store(c), uri);
    dlock_client_close(c);
    unsetenv("DLOCK_STORE");

    /* a private directory open to others is closed (it is ours) */
    chmod(expect, 0777);
    CHECK_OK(dlock_client_open(&c, NULL, NULL));
    CHECK_EQ(stat(expect, &st), 0);
    CHECK_EQ(st.st_mode & 0777, 0700);
    dlock_client_close(c);

    /* ... but one that is not ours, or a symlink, is refused */
    rmdir(expect);
    CHECK_EQ(symlink(dir, expect), 0);
    CHECK_RC(dlock_client_open(&c, NULL, NULL), DLOCK_EPROTO);
    CHECK_CONTAINS(dlock_errmsg(), "symbolic link");
    unlink(expect);
    if (geteuid() == 0) {
        mkdir(expect, 0700);
        CHECK_EQ(chown(expect, 12345, 12345), 0);
        CHECK_RC(dlock_client_open(&c, NULL, NULL), DLOCK_EAUTH);
        CHECK_CONTAINS(dlock_errmsg(), "uid 12345");
        rmdir(expect);
    }
    unsetenv("XDG_RUNTIME_DIR");
}

TEST(bad_file_uris)
{
    static const char *const bad[] = {
        "file://", "file:///", "file://host/dir", "file://a,b/dir",
        "file://u:pw@/dir", "file:///x?private=2", "file:///x?color=red",
        "file:relative", NULL};
    dlock_client *c = NULL;

    for (int i = 0; bad[i]; i++)
        CHECK_RC(dlock_client_open(&c, bad[i], NULL), DLOCK_EINVAL);
    /* a directory that cannot be created */
    CHECK_RC(dlock_client_open(&c, "file:///proc/dlock-cannot", NULL),
             DLOCK_ECONN);
    /* nested directories are created */
    char deep[1000];
    snprintf(deep, sizeof(deep), "file://%s/a/b/c", th_tmpdir());
    CHECK_OK(dlock_client_open(&c, deep, NULL));
    dlock_client_close(c);
}

TEST(symlinked_lock_file_is_refused)
{
    char target[1000], link[1000];
    dlock_client *c = client();
    dlock *l = handle(c, "linked", 0, 0);
    struct stat st;

    snprintf(target, sizeof(target), "%s/precious", th_tmpdir());
    int fd = open(target, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(write(fd, "data", 4) == 4);
    close(fd);
    path_of("linked.lock", link, sizeof(link));
    CHECK_EQ(symlink(target, link), 0);
    CHECK_RC(dlock_acquire(l, 0), DLOCK_EPROTO);
    CHECK_CONTAINS(dlock_errmsg(), "symbolic link");
    CHECK_EQ(stat(target, &st), 0);
    CHECK_EQ(st.st_size, 4); /* untouched */
    dlock_close(l);
    dlock_client_close(c);
}

TEST(foreign_file_is_refused)
{
    char path[1000];
    dlock_client *c = client();
    dlock *l = handle(c, "foreign", 0, 0);
    dlock_info info;

    path_of("foreign.lock", path, sizeof(path));
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(write(fd, "not a lock file", 15) == 15);
    close(fd);
    CHECK_RC(dlock_acquire(l, 0), DLOCK_EPROTO);
    CHECK_CONTAINS(dlock_errmsg(), "not a dlock lock file");
    CHECK_RC(dlock_inspect(c, "foreign", &info), DLOCK_EPROTO);
    dlock_close(l);

    path_of("adir.lock", path, sizeof(path));
    mkdir(path, 0700);
    l = handle(c, "adir", 0, 0);
    CHECK(dlock_acquire(l, 0) != DLOCK_OK);
    dlock_close(l);
    dlock_client_close(c);
}

TEST(ttl_has_no_effect_here)
{
    dlock_client *a = client(), *b = client();
    dlock *la = handle(a, "nolease", 50, DLOCK_NO_RENEW);
    dlock *lb = handle(b, "nolease", 0, 0);

    CHECK_OK(dlock_acquire(la, 0));
    th_sleep_ms(300); /* six "leases" */
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    CHECK_EQ(dlock_held(la), 1);
    CHECK_OK(dlock_extend(la, 100));
    CHECK_OK(dlock_release(la));
    dlock_close(la);
    dlock_close(lb);
    dlock_client_close(a);
    dlock_client_close(b);
}

typedef struct waiter {
    dlock *l;
    int64_t wait;
    int rc;
} waiter;

static void *wait_thread(void *arg)
{
    waiter *w = arg;

    w->rc = dlock_acquire(w->l, w->wait);
    if (w->rc == DLOCK_OK)
        dlock_release(w->l);
    return NULL;
}

TEST(replaced_file_is_detected)
{
    char path[1000], tmp[1000];
    dlock_client *a = client(), *b = client();
    dlock *la = handle(a, "replaced", 0, 0);
    waiter w = {handle(b, "replaced", 0, 0), 5000, -99};
    pthread_t th;

    CHECK_OK(dlock_acquire(la, 0));
    pthread_create(&th, NULL, wait_thread, &w);
    th_sleep_ms(200);
    /* someone replaces the lock file while it is held and waited on */
    path_of("replaced.lock", path, sizeof(path));
    path_of("replaced.tmp", tmp, sizeof(tmp));
    int fd = open(tmp, O_WRONLY | O_CREAT, 0600);
    close(fd);
    CHECK_EQ(rename(tmp, path), 0);
    /* the holder learns its lock no longer protects anything */
    CHECK_RC(dlock_extend(la, 1000), DLOCK_ELOST);
    CHECK_RC(dlock_release(la), DLOCK_ELOST);
    /* the waiter, woken on the old file, moves to the new one */
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    dlock_close(la);
    dlock_close(w.l);
    dlock_client_close(a);
    dlock_client_close(b);
}

TEST(cancelled_waits_leave_nothing_behind)
{
    dlock_client *a = client(), *b = client(), *c = client();
    dlock *la = handle(a, "cancel", 0, DLOCK_FAIR);
    dlock *lb = handle(b, "cancel", 0, DLOCK_FAIR);
    waiter w = {handle(c, "cancel", 0, DLOCK_FAIR), 10000, -99};
    dlock_info info;
    pthread_t th;

    CHECK_OK(dlock_acquire(la, 0));
    /* b queues first and gives up; c queued behind it must not wait for
     * b's ticket */
    pthread_create(&th, NULL, wait_thread, &w);
    th_sleep_ms(100);
    int64_t t0 = th_now_ms();
    CHECK_RC(dlock_acquire(lb, 300), DLOCK_EBUSY);
    CHECK_OP(th_now_ms() - t0, >=, 290);
    CHECK_OK(dlock_inspect(a, "cancel", &info));
    CHECK_EQ(info.waiters, 1); /* only c is left in the queue */
    dlock_info_clear(&info);
    t0 = th_now_ms();
    CHECK_OK(dlock_release(la));
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    CHECK_OP(th_now_ms() - t0, <, 2000);
    /* and nothing holds it now */
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OK(dlock_release(lb));
    for (int i = 0; i < 5; i++) { /* many cancelled waits */
        CHECK_OK(dlock_acquire(la, 0));
        CHECK_RC(dlock_acquire(lb, 20), DLOCK_EBUSY);
        CHECK_OK(dlock_release(la));
    }
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OK(dlock_release(lb));
    dlock_close(la);
    dlock_close(lb);
    dlock_close(w.l);
    dlock_client_close(a);
    dlock_client_close(b);
    dlock_client_close(c);
}

TEST(long_names_fit_a_file_name)
{
    char name[DLOCK_NAME_MAX + 1];
    dlock_client *c = client();

    memset(name, '%', DLOCK_NAME_MAX); /* worst case: 3 bytes each */
    name[DLOCK_NAME_MAX] = '\0';
    dlock *l = handle(c, name, 0, 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

static const th_test tests[] = {
    T(default_store_is_a_private_directory),
    T(bad_file_uris),
    T(symlinked_lock_file_is_refused),
    T(foreign_file_is_refused),
    T(ttl_has_no_effect_here),
    TK(replaced_file_is_detected),
    TK(cancelled_waits_leave_nothing_behind),
    T(long_names_fit_a_file_name),
    {NULL, NULL, 0},
};

int main(int argc, char **argv)
{
    snprintf(dir, sizeof(dir), "%s/locks", th_tmpdir());
    snprintf(uri, sizeof(uri), "file://%s", dir);
    return th_main(argc, argv, tests);
}
