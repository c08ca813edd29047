/* SPDX-License-Identifier: MIT */
/*
 * test_file.c -- what only the file store does: the default location and
 * its safety checks, hostile files, replaced files, leases that do not
 * exist, cancelled kernel waits that leave nothing behind, and the fair
 * queue's hand-over through wake-up channels (docs/design.md, "File store:
 * fair hand-over") with real processes: FIFO, killed holders and waiters,
 * deadlines that meet a hand-off, mixed modes, channels that are refused,
 * squatted or foreign, forks.
 *
 * Timing bounds: a hand-off that must come "at once" (a release, a death)
 * is allowed 2 s, against waits of 30 s that it would otherwise take:
 * loose for a busy 2-core machine, yet it tells a wake-up from a waiter
 * left to its deadline.
 *
 * Past 1,000 lines on purpose: a list of independent scenarios (one
 * function each, run by name through the harness, any one alone with a
 * filter); the tests are split by store, not by size.
 */
#include "test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <pthread.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <linux/fuse.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[800];
static char uri[900];

static dlock_client *client(void)
{
    return th_client(uri, NULL);
}

static void path_of(const char *file, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", dir, file);
}

/* The store `d`'s directory of wake-up channels (ours: not a group's),
 * which the store makes when a client opens it. */
static void wake_dir_of(const char *d, char *out, size_t cap)
{
    snprintf(out, cap, "%s/.dlock-wake-u%lu", d, (unsigned long)geteuid());
}

/* rmdir of store directory `d`, and of the wake-up channels' directory
 * that the store made in it */
static int rmdir_store(const char *d)
{
    char w[PATH_MAX + 8192];

    wake_dir_of(d, w, sizeof(w));
    rmdir(w);
    return rmdir(d);
}

/* ------------------------------------------------------------------------ */

/* --- the default store (docs/stores.md, "The default store") -----------
 *
 * It is HOME/.local/state/dlock, HOME from the passwd entry, and no
 * variable moves it (on purpose: that is what kept one user's sessions
 * apart). So each of these tests runs in a child process in a mount
 * namespace of its own, in which our home directory is a fresh empty
 * directory (and /tmp a fresh tmpfs, and /etc/passwd a copy with test
 * users of our own): the library takes the path it takes in production,
 * nothing outside the namespace sees a thing, and nothing is left to
 * undo if the test dies. They need root (a mount namespace); otherwise
 * they are skipped. */

typedef struct home_job {
    int (*fn)(const char *home);
    int fresh_tmp; /* a fresh tmpfs on /tmp too */
} home_job;

static int home_child(void *arg)
{
    const home_job *j = arg;
    struct passwd *pw = getpwuid(geteuid());
    char home[PATH_MAX], fresh[1000];

    if (!pw || !realpath(pw->pw_dir, home) || !strcmp(home, "/"))
        return 78;
    if (unshare(CLONE_NEWNS) != 0 ||
        mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) != 0)
        return 77;
    snprintf(fresh, sizeof(fresh), "%s/home-%ld", th_tmpdir(),
             (long)getpid());
    CHECK_EQ(mkdir(fresh, 0700), 0);
    CHECK_EQ(mount(fresh, home, "none", MS_BIND, NULL), 0);
    if (j->fresh_tmp)
        CHECK_EQ(mount("dlocktest", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
                       "mode=1777"),
                 0);
    unsetenv("DLOCK_STORE");
    return j->fn(home);
}

static void in_fresh_home(int (*fn)(const char *), int fresh_tmp)
{
    home_job j = {fn, fresh_tmp};
    int st = th_wait(th_fork(home_child, &j));

    if (st == 77) {
        printf("  (no mount namespace (not root): skipped)\n");
        return;
    }
    if (st == 78) {
        printf("  (our passwd entry has no home directory: skipped)\n");
        return;
    }
    CHECK_EQ(st, 0);
}

/* file://DIR/.local/state/dlock?private=1, DIR %-escaped as the library
 * escapes it */
static void default_uri_of(const char *home, char *out, size_t cap)
{
    size_t o = (size_t)snprintf(out, cap, "file://");

    for (const char *p = home; *p && o + 4 < cap; p++) {
        unsigned char ch = (unsigned char)*p;
        if (strchr("/._-", ch) || (ch >= 'a' && ch <= 'z') ||
            (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9'))
            out[o++] = (char)ch;
        else
            o += (size_t)snprintf(out + o, cap - o, "%%%02X", ch);
    }
    snprintf(out + o, cap - o, "/.local/state/dlock?private=1");
}

static mode_t mode_at(const char *path, uid_t *uid)
{
    struct stat st;

    CHECK_EQ(lstat(path, &st), 0);
    if (uid)
        *uid = st.st_uid;
    return st.st_mode & 07777;
}

/* Every environment finds the same directory: one with XDG_RUNTIME_DIR,
 * HOME and XDG_STATE_HOME pointing elsewhere (a login session, sudo),
 * one with no variable at all (cron, env -i). A lock held through the
 * first is busy through the second. */
static int same_store_whatever_the_environment(const char *home)
{
    char expect[PATH_MAX + 100], path[PATH_MAX + 100];
    dlock_client *a, *b, *c;
    dlock *la, *lb;
    uid_t owner;

    default_uri_of(home, expect, sizeof(expect));
    setenv("XDG_RUNTIME_DIR", th_tmpdir(), 1);
    setenv("XDG_STATE_HOME", th_tmpdir(), 1);
    setenv("HOME", "/", 1);
    CHECK_OK(dlock_client_open(&a, NULL, NULL));
    CHECK_STR(dlock_client_store(a), expect);
    /* every part made by us, 0700 */
    snprintf(path, sizeof(path), "%s/.local", home);
    CHECK_EQ(mode_at(path, &owner), 0700);
    CHECK_EQ(owner, geteuid());
    snprintf(path, sizeof(path), "%s/.local/state", home);
    CHECK_EQ(mode_at(path, &owner), 0700);
    snprintf(path, sizeof(path), "%s/.local/state/dlock", home);
    CHECK_EQ(mode_at(path, &owner), 0700);
    CHECK_EQ(owner, geteuid());
    la = th_handle(a, "nightly", 0, 0, 0);
    CHECK_OK(dlock_acquire(la, 0));

    clearenv(); /* a cron job, env -i */
    CHECK_OK(dlock_client_open(&b, "", NULL));
    CHECK_STR(dlock_client_store(b), expect);
    lb = th_handle(b, "nightly", 0, 0, 0);
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_release(la));
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OK(dlock_release(lb));

    /* DLOCK_STORE still wins over the default */
    setenv("DLOCK_STORE", uri, 1);
    CHECK_OK(dlock_client_open(&c, "", NULL));
    CHECK_STR(dlock_client_store(c), uri);
    dlock_client_close(c);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
    return 0;
}

TEST(default_store_is_in_the_home_of_the_passwd_entry)
{
    in_fresh_home(same_store_whatever_the_environment, 0);
}

/* The earlier default's places, made first by another user: the
 * $XDG_RUNTIME_DIR/dlock of a session and /tmp/dlock-$UID. They neither
 * block the default store (on main: DLOCK_EAUTH, exit 69 for every cron
 * job) nor split it. /tmp is the namespace's own here. */
static int old_locations_taken_first(const char *home)
{
    char old[64], expect[PATH_MAX + 100];
    dlock_client *a, *b;
    dlock *la, *lb;

    default_uri_of(home, expect, sizeof(expect));
    snprintf(old, sizeof(old), "/tmp/dlock-%lu", (unsigned long)getuid());
    CHECK_EQ(mkdir(old, 0700), 0);
    CHECK_EQ(chown(old, 12345, 12345), 0);
    CHECK_EQ(mkdir("/tmp/xdg", 0700), 0);
    CHECK_EQ(mkdir("/tmp/xdg/dlock", 0700), 0);
    CHECK_EQ(chown("/tmp/xdg/dlock", 12345, 12345), 0);

    setenv("XDG_RUNTIME_DIR", "/tmp/xdg", 1);
    CHECK_OK(dlock_client_open(&a, NULL, NULL));
    CHECK_STR(dlock_client_store(a), expect);
    la = th_handle(a, "nightly", 0, 0, 0);
    CHECK_OK(dlock_acquire(la, 0));
    unsetenv("XDG_RUNTIME_DIR");
    CHECK_OK(dlock_client_open(&b, NULL, NULL));
    CHECK_STR(dlock_client_store(b), expect);
    lb = th_handle(b, "nightly", 0, 0, 0);
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_release(la));
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
    return 0;
}

TEST(default_store_ignores_the_old_locations)
{
    in_fresh_home(old_locations_taken_first, 1);
}

/* Opening the default store fails with `code`, naming `path` (and `why`)
 * and the way out. */
static void default_refused(int code, const char *path, const char *why)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, NULL, NULL), code);
    CHECK(c == NULL);
    CHECK_CONTAINS(dlock_errmsg(), path);
    CHECK_CONTAINS(dlock_errmsg(), why);
    CHECK_CONTAINS(dlock_errmsg(), "--store file:///DIR");
}

static int refusals_in_the_home(const char *home)
{
    char local[PATH_MAX + 50], last[PATH_MAX + 50];
    dlock_client *c;
    uid_t me = geteuid();
    gid_t mygid = getegid();

    snprintf(local, sizeof(local), "%s/.local", home);
    snprintf(last, sizeof(last), "%s/.local/state/dlock", home);
    /* a home that group or others may write: they could swap .local */
    CHECK_EQ(chmod(home, 0777), 0);
    default_refused(DLOCK_EAUTH, home, "may be written by group or others");
    /* ... or a group may write, one that is not ours alone (no group
     * 12345 exists) */
    CHECK_EQ(chown(home, me, 12345), 0);
    CHECK_EQ(chmod(home, 0770), 0);
    default_refused(DLOCK_EAUTH, home, "(mode 0770)");
    CHECK_EQ(chown(home, me, mygid), 0);
    CHECK_EQ(access(local, F_OK), -1); /* nothing made in it */
    CHECK_EQ(chmod(home, 0700), 0);
    /* a home of another user's (neither ours nor root's) */
    CHECK_EQ(chown(home, 12345, 12345), 0);
    default_refused(DLOCK_EAUTH, home, "belongs to uid 12345");
    CHECK_EQ(chown(home, me, mygid), 0);

    /* a symbolic link planted where the library makes a directory: not
     * followed (the target stays empty) */
    char target[900];
    snprintf(target, sizeof(target), "%s/planted", th_tmpdir());
    CHECK_EQ(mkdir(target, 0700), 0);
    CHECK_EQ(symlink(target, local), 0);
    default_refused(DLOCK_EPROTO, local, "is a symbolic link");
    CHECK_EQ(unlink(local), 0);
    CHECK_OK(dlock_client_open(&c, NULL, NULL));
    dlock_client_close(c);
    CHECK_EQ(rmdir_store(last), 0);
    CHECK_EQ(symlink(target, last), 0);
    default_refused(DLOCK_EPROTO, last, "is a symbolic link");
    CHECK_EQ(unlink(last), 0);
    CHECK_EQ(rmdir(target), 0); /* still empty */

    /* the directory itself: closed if others may read it, refused if
     * they may write it or if it is not ours */
    CHECK_EQ(mkdir(last, 0700), 0);
    CHECK_EQ(chmod(last, 0777), 0);
    default_refused(DLOCK_EAUTH, last, "may be written by group or others");
    CHECK_EQ(mode_at(last, NULL), 0777);
    CHECK_EQ(chmod(last, 0755), 0);
    CHECK_OK(dlock_client_open(&c, NULL, NULL));
    dlock_client_close(c);
    CHECK_EQ(mode_at(last, NULL), 0700);
    CHECK_EQ(chown(last, 12345, 12345), 0);
    default_refused(DLOCK_EAUTH, last, "belongs to uid 12345");
    return 0;
}

TEST(default_store_refusals_in_the_home)
{
    in_fresh_home(refusals_in_the_home, 0);
}

/* --- as other users: test users of our own, in a copy of /etc/passwd
 * mounted over it in the namespace ------------------------------------ */

typedef struct user_job {
    uid_t uid;
    int (*fn)(const void *arg);
    const void *arg;
} user_job;

static int as_user_child(void *arg)
{
    const user_job *j = arg;

    if (setgroups(0, NULL) != 0 || setresgid(j->uid, j->uid, j->uid) != 0 ||
        setresuid(j->uid, j->uid, j->uid) != 0)
        return 2;
    return j->fn(j->arg);
}

/* Runs fn(arg) in a child as uid (its gid the same number); its status. */
static int as_user(uid_t uid, int (*fn)(const void *), const void *arg)
{
    user_job j = {uid, fn, arg};

    return th_wait(th_fork(as_user_child, &j));
}

/* as the user: the default store opens at `arg` (its directory), ours,
 * 0700, and a lock can be taken in it */
static int default_opens_at(const void *arg)
{
    char expect[1100];
    dlock_client *c;
    dlock *l;
    uid_t owner;

    snprintf(expect, sizeof(expect), "file://%s?private=1",
             (const char *)arg);
    CHECK_OK(dlock_client_open(&c, NULL, NULL));
    CHECK_STR(dlock_client_store(c), expect);
    CHECK_EQ(mode_at(arg, &owner), 0700);
    CHECK_EQ(owner, geteuid());
    l = th_handle(c, "nightly", 0, 0, 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

/* as another user: the directory `arg` can be neither listed nor used */
static int cannot_enter(const void *arg)
{
    char u[1100];
    dlock_client *c = NULL;

    CHECK(opendir(arg) == NULL && errno == EACCES);
    snprintf(u, sizeof(u), "file://%s", (const char *)arg);
    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_EAUTH);
    snprintf(u, sizeof(u), "file://%s?private=1", (const char *)arg);
    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_EAUTH);
    return 0;
}

typedef struct refusal {
    int code;
    const char *text, *text2;
} refusal;

/* as the user: the default store is refused with r->code, the message
 * saying r->text and r->text2 */
static int default_is_refused(const void *arg)
{
    const refusal *r = arg;

    default_refused(r->code, r->text, r->text2);
    return 0;
}

/* Copies a passwd or group file, but the entries of our test ids (4242 to
 * 4250, the third field): they are ours alone in the namespace. */
static void copy_but_ours(const char *from, const char *to)
{
    char line[4096];
    FILE *in = fopen(from, "r"), *out = fopen(to, "w");

    CHECK(in && out);
    while (fgets(line, sizeof(line), in)) {
        const char *f = strchr(line, ':');
        long id = f && (f = strchr(f + 1, ':')) ? atol(f + 1) : -1;
        if (id < 4242 || id > 4250)
            fputs(line, out);
    }
    fclose(in);
    CHECK_EQ(fclose(out), 0);
}

static int users_without_a_usable_home(const char *home)
{
    static const char *const dirs[][3] = {
        /* path, owner uid, mode: /tmp is the namespace's tmpfs */
        {"/tmp/dlt", "0", "755"},
        {"/tmp/dlt/a", "4242", "755"},
        {"/tmp/dlt/b", "4243", "755"},
        {"/tmp/dlt/www", "0", "755"},
        {"/tmp/dlt/prov", "0", "755"},
        {"/tmp/dlt/prov/.local", "0", "755"},
        {"/tmp/dlt/prov/.local/state", "0", "755"},
        {"/tmp/dlt/prov/.local/state/dlock", "4247", "700"},
        {"/tmp/dlt/c", "4249", "755"},
    };
    FILE *out;

    (void)home;
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
        uid_t u = (uid_t)atoi(dirs[i][1]);
        CHECK_EQ(mkdir(dirs[i][0], 0700), 0);
        CHECK_EQ(chown(dirs[i][0], u, u), 0);
        CHECK_EQ(chmod(dirs[i][0], (mode_t)strtol(dirs[i][2], NULL, 8)), 0);
    }
    copy_but_ours("/etc/passwd", "/tmp/dlt/passwd");
    copy_but_ours("/etc/group", "/tmp/dlt/group");
    out = fopen("/tmp/dlt/passwd", "a");
    CHECK(out != NULL);
    fputs("dlt-a:x:4242:4242::/tmp/dlt/a:/bin/sh\n"
          "dlt-b:x:4243:4243::/tmp/dlt/b:/bin/sh\n"
          "dlt-none:x:4244:4244::/nonexistent-dlock-test:/bin/sh\n"
          "dlt-www:x:4245:4245::/tmp/dlt/www:/bin/sh\n"
          "dlt-rel:x:4246:4246::relative/home:/bin/sh\n"
          "dlt-prov:x:4247:4247::/tmp/dlt/prov:/bin/sh\n"
          "dlt-c:x:4249:4249::/tmp/dlt/c:/bin/sh\n",
          out);
    CHECK_EQ(fclose(out), 0);
    /* private groups (named as their user, no other member), one that
     * is named as its user but has another member, and a shared one */
    out = fopen("/tmp/dlt/group", "a");
    CHECK(out != NULL);
    fputs("dlt-a:x:4242:\n"
          "dlt-b:x:4243:\n"
          "dlt-c:x:4249:dlt-b\n"
          "dlt-shared:x:4250:dlt-a,dlt-b\n",
          out);
    CHECK_EQ(fclose(out), 0);
    CHECK_EQ(mount("/tmp/dlt/passwd", "/etc/passwd", "none", MS_BIND, NULL),
             0);
    CHECK_EQ(mount("/tmp/dlt/group", "/etc/group", "none", MS_BIND, NULL),
             0);
    struct passwd *pw = getpwuid(4242);
    if (!pw || strcmp(pw->pw_dir, "/tmp/dlt/a") != 0) {
        /* passwd entries come from elsewhere (nscd, a directory) */
        printf("  (a test user in /etc/passwd is not seen: skipped)\n");
        return 0;
    }

    /* a user whose home works, and another one who cannot look in */
    CHECK_EQ(as_user(4242, default_opens_at, "/tmp/dlt/a/.local/state/dlock"),
             0);
    CHECK_EQ(as_user(4243, cannot_enter, "/tmp/dlt/a/.local/state/dlock"), 0);
    /* ~/.local made with umask 002 (Debian's and Ubuntu's pam_umask for
     * users with a private group): fine when the group is the user's
     * alone; refused for a shared group, or a private-looking one with
     * another member */
    CHECK_EQ(chmod("/tmp/dlt/a/.local", 0775), 0);
    CHECK_EQ(as_user(4242, default_opens_at, "/tmp/dlt/a/.local/state/dlock"),
             0);
    CHECK_EQ(chown("/tmp/dlt/a/.local", 4242, 4250), 0);
    refusal shared = {DLOCK_EAUTH, "/tmp/dlt/a/.local", "(mode 0775)"};
    CHECK_EQ(as_user(4242, default_is_refused, &shared), 0);
    CHECK_EQ(chown("/tmp/dlt/a/.local", 4242, 4242), 0);
    CHECK_EQ(as_user(4249, default_opens_at, "/tmp/dlt/c/.local/state/dlock"),
             0);
    CHECK_EQ(chmod("/tmp/dlt/c/.local", 0775), 0);
    refusal member = {DLOCK_EAUTH, "/tmp/dlt/c/.local", "(mode 0775)"};
    CHECK_EQ(as_user(4249, default_is_refused, &member), 0);
    /* nobody's /nonexistent */
    refusal none = {DLOCK_ENOTSUP, "/nonexistent-dlock-test",
                    "No such file or directory"};
    CHECK_EQ(as_user(4244, default_is_refused, &none), 0);
    /* www-data's home, root's: nothing can be made in it */
    refusal www = {DLOCK_EAUTH, "/tmp/dlt/www/.local", "cannot create"};
    CHECK_EQ(as_user(4245, default_is_refused, &www), 0);
    /* a home that is no absolute path */
    refusal rel = {DLOCK_ENOTSUP, "relative/home", "uid 4246"};
    CHECK_EQ(as_user(4246, default_is_refused, &rel), 0);
    /* ... the same kind of home, with the directory made by root for the
     * user: fine (root's parents are trusted) */
    CHECK_EQ(as_user(4247, default_opens_at,
                     "/tmp/dlt/prov/.local/state/dlock"),
             0);
    /* no passwd entry at all */
    refusal nouser = {DLOCK_ENOTSUP, "uid 4248", "no passwd entry"};
    CHECK_EQ(as_user(4248, default_is_refused, &nouser), 0);
    return 0;
}

TEST(default_store_of_other_users)
{
    in_fresh_home(users_without_a_usable_home, 1);
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

/* --- ?private=1: the walk from / (docs/stores.md, "The default store") */

/* file://base/rel?private=1 */
static void private_uri(char *out, size_t cap, const char *base,
                        const char *rel)
{
    snprintf(out, cap, "file://%s/%s?private=1", base, rel);
}

/* Opening `rel` under base privately fails with `code`, and the message
 * names the path, says `why` and the way out. */
static void private_refused(const char *base, const char *rel, int code,
                            const char *why)
{
    char u[1200], path[1100];
    dlock_client *c = NULL;

    private_uri(u, sizeof(u), base, rel);
    CHECK_RC(dlock_client_open(&c, u, NULL), code);
    CHECK(c == NULL);
    CHECK_CONTAINS(dlock_errmsg(), why);
    CHECK_CONTAINS(dlock_errmsg(), "--store file:///DIR");
    /* the first component that fails is named: some prefix of the path */
    snprintf(path, sizeof(path), "%s/", base);
    CHECK_CONTAINS(dlock_errmsg(), path);
}

static mode_t mode_of(const char *base, const char *rel)
{
    char path[1100];
    struct stat st;

    snprintf(path, sizeof(path), "%s/%s", base, rel);
    CHECK_EQ(lstat(path, &st), 0);
    return st.st_mode & 07777;
}

static void mkdir_mode(const char *base, const char *rel, mode_t mode)
{
    char path[1100];

    snprintf(path, sizeof(path), "%s/%s", base, rel);
    CHECK_EQ(mkdir(path, 0700), 0);
    CHECK_EQ(chmod(path, mode), 0);
}

TEST(private_directory_is_made_and_closed)
{
    char base[900], u[1200], lockf[1100];
    struct stat st;
    dlock_client *c;
    dlock *l;

    snprintf(base, sizeof(base), "%s/priv-made", th_tmpdir());
    CHECK_EQ(mkdir(base, 0755), 0);
    /* every missing component is made 0700 and ours, whatever the umask
     * lets mkdir(2) make (main made the parents 0777 & ~umask) */
    mode_t old = umask(0);
    private_uri(u, sizeof(u), base, "a/b/c");
    CHECK_OK(dlock_client_open(&c, u, NULL));
    umask(old);
    CHECK_STR(dlock_client_store(c), u);
    CHECK_EQ(mode_of(base, "a"), 0700);
    CHECK_EQ(mode_of(base, "a/b"), 0700);
    CHECK_EQ(mode_of(base, "a/b/c"), 0700);
    /* lock files in it: the caller's alone */
    l = th_handle(c, "privfile", 0, 0, 0);
    CHECK_OK(dlock_acquire(l, 0));
    snprintf(lockf, sizeof(lockf), "%s/a/b/c/privfile.lock", base);
    CHECK_EQ(stat(lockf, &st), 0);
    CHECK_EQ(st.st_mode & 0777, 0600);
    CHECK_EQ(st.st_uid, geteuid());
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);

    /* a last directory others may only read or enter is closed: only we
     * could have written it */
    CHECK_EQ(chmod(lockf, 0600), 0);
    snprintf(lockf, sizeof(lockf), "%s/a/b/c", base);
    CHECK_EQ(chmod(lockf, 0755), 0);
    CHECK_OK(dlock_client_open(&c, u, NULL));
    CHECK_EQ(mode_of(base, "a/b/c"), 0700);
    dlock_client_close(c);

    /* ... but one others may write is refused, and left as it is: files
     * of theirs may be in it */
    CHECK_EQ(chmod(lockf, 0777), 0);
    private_refused(base, "a/b/c", DLOCK_EAUTH,
                    "may be written by group or others");
    CHECK_CONTAINS(dlock_errmsg(), "a/b/c");
    CHECK_EQ(mode_of(base, "a/b/c"), 0777);
    if (geteuid() == 0) { /* a group not ours alone: none has gid 12345 */
        CHECK_EQ(chown(lockf, 0, 12345), 0);
        CHECK_EQ(chmod(lockf, 0770), 0);
        private_refused(base, "a/b/c", DLOCK_EAUTH, "(mode 0770)");
        CHECK_EQ(chown(lockf, 0, 0), 0);
    }
    CHECK_EQ(chmod(lockf, 0700), 0);

    /* parents of ours that others may read are fine (a home is 0755) */
    snprintf(lockf, sizeof(lockf), "%s/a", base);
    CHECK_EQ(chmod(lockf, 0755), 0);
    CHECK_OK(dlock_client_open(&c, u, NULL));
    dlock_client_close(c);
}

TEST(private_directory_walk_refusals)
{
    char base[900], path[1100], target[1100];
    dlock_client *c;

    snprintf(base, sizeof(base), "%s/priv-walk", th_tmpdir());
    CHECK_EQ(mkdir(base, 0700), 0);
    mkdir_mode(base, "real", 0700);

    /* a symbolic link anywhere on the way is refused, never followed */
    snprintf(path, sizeof(path), "%s/link", base);
    snprintf(target, sizeof(target), "%s/real", base);
    CHECK_EQ(symlink(target, path), 0);
    private_refused(base, "link/x", DLOCK_EPROTO, "is a symbolic link");
    CHECK_CONTAINS(dlock_errmsg(), "/link");
    private_refused(base, "link", DLOCK_EPROTO, "is a symbolic link");
    CHECK_EQ(mode_of(base, "real") & 0777, 0700); /* untouched */
    snprintf(path, sizeof(path), "%s/real/x", base);
    CHECK_EQ(access(path, F_OK), -1);           /* nothing made there */

    /* a file where a directory belongs */
    snprintf(path, sizeof(path), "%s/plain", base);
    int fd = open(path, O_CREAT | O_WRONLY, 0600);
    CHECK(fd >= 0);
    close(fd);
    private_refused(base, "plain/x", DLOCK_EPROTO, "is not a directory");

    /* a parent that group or others may write: they could swap what is
     * in it (the earlier check looked at the last directory alone) */
    mkdir_mode(base, "open", 0777);
    private_refused(base, "open/x", DLOCK_EAUTH,
                    "may be written by group or others");
    CHECK_CONTAINS(dlock_errmsg(), "/open");
    if (geteuid() == 0) { /* a group not ours alone: none has gid 12345 */
        mkdir_mode(base, "group", 0770);
        snprintf(path, sizeof(path), "%s/group", base);
        CHECK_EQ(chown(path, 0, 12345), 0);
        private_refused(base, "group/x", DLOCK_EAUTH, "(mode 0770)");
    }

    /* ... unless it is sticky, like /tmp: others can neither rename nor
     * delete what is ours in it */
    mkdir_mode(base, "sticky", 01777);
    char u[1200];
    private_uri(u, sizeof(u), base, "sticky/x");
    CHECK_OK(dlock_client_open(&c, u, NULL));
    dlock_client_close(c);

    if (geteuid() != 0) {
        printf("  (not root: no other user's directories)\n");
        return;
    }
    /* a name in a sticky directory taken first by another user */
    mkdir_mode(base, "sticky/theirs", 0700);
    snprintf(path, sizeof(path), "%s/sticky/theirs", base);
    CHECK_EQ(chown(path, 12345, 12345), 0);
    private_refused(base, "sticky/theirs", DLOCK_EAUTH, "belongs to uid 12345");
    private_refused(base, "sticky/theirs/x", DLOCK_EAUTH,
                    "belongs to uid 12345");
    /* a parent that belongs to another user (not root): its owner could
     * replace what is in it */
    mkdir_mode(base, "other", 0755);
    snprintf(path, sizeof(path), "%s/other", base);
    CHECK_EQ(chown(path, 12345, 12345), 0);
    private_refused(base, "other/x", DLOCK_EAUTH, "neither you");
    snprintf(path, sizeof(path), "%s/other/x", base);
    CHECK_EQ(access(path, F_OK), -1);
}

/* A file system in user space that the test serves itself: enough of the
 * FUSE protocol (linux/fuse.h) for its root directory to be opened,
 * stat'ed (ours, 0700) and statfs'ed; anything else gets ENOSYS. Its
 * f_type is FUSE's, as sshfs's is: a network file system as the check
 * sees one, without a server. Runs until the file system goes away. */
static int fuse_serve(void *arg)
{
    static unsigned char buf[(1 << 17) + 4096]; /* FUSE_MIN_READ_BUFFER+ */
    int fd = *(int *)arg;

    for (;;) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < (ssize_t)sizeof(struct fuse_in_header))
            return 0; /* ENODEV: unmounted */
        const struct fuse_in_header *in = (const void *)buf;
        struct {
            struct fuse_out_header h;
            union {
                struct fuse_init_out init;
                struct fuse_attr_out attr;
                struct fuse_open_out open;
                struct fuse_statfs_out statfs;
            } u;
        } out;
        size_t len = 0;

        memset(&out, 0, sizeof(out));
        out.h.unique = in->unique;
        switch (in->opcode) {
        case FUSE_INIT:
            out.u.init.major = FUSE_KERNEL_VERSION;
            out.u.init.minor = FUSE_KERNEL_MINOR_VERSION;
            out.u.init.max_write = 4096;
            len = sizeof(out.u.init);
            break;
        case FUSE_GETATTR:
            out.u.attr.attr.ino = FUSE_ROOT_ID;
            out.u.attr.attr.mode = S_IFDIR | 0700;
            out.u.attr.attr.nlink = 2;
            out.u.attr.attr.uid = geteuid();
            out.u.attr.attr.gid = getegid();
            out.u.attr.attr.blksize = 4096;
            len = sizeof(out.u.attr);
            break;
        case FUSE_OPENDIR:
            len = sizeof(out.u.open);
            break;
        case FUSE_RELEASEDIR:
            break;
        case FUSE_STATFS:
            out.u.statfs.st.bsize = out.u.statfs.st.frsize = 4096;
            out.u.statfs.st.namelen = 255;
            len = sizeof(out.u.statfs);
            break;
        case FUSE_FORGET:
        case FUSE_BATCH_FORGET:
        case FUSE_INTERRUPT:
            continue; /* no answer */
        default:
            out.h.error = -ENOSYS;
            break;
        }
        out.h.len = (uint32_t)(sizeof(out.h) + len);
        if (write(fd, &out, out.h.len) < 0 && errno == ENODEV)
            return 0;
    }
}

/* In a mount namespace of its own (nothing seen outside, nothing to undo
 * if the test dies): a tmpfs, then a FUSE file system served by a child,
 * each at the place of a private directory. 77: no namespace (not
 * root); 78: no FUSE here. */
static int network_fs_child(void *arg)
{
    const char *base = arg;
    char mnt[1000], opts[200], u[1200];
    dlock_client *c = NULL;

    if (unshare(CLONE_NEWNS) != 0 ||
        mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) != 0)
        return 77;
    /* a local file system in memory: accepted */
    snprintf(mnt, sizeof(mnt), "%s/tmpfs", base);
    CHECK_EQ(mkdir(mnt, 0700), 0);
    CHECK_EQ(mount("dlocktest", mnt, "tmpfs", MS_NOSUID | MS_NODEV,
                   "mode=0700"),
             0);
    private_uri(u, sizeof(u), base, "tmpfs");
    CHECK_OK(dlock_client_open(&c, u, NULL));
    dlock_client_close(c);

    int fd = open("/dev/fuse", O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return 78;
    snprintf(mnt, sizeof(mnt), "%s/fuse", base);
    CHECK_EQ(mkdir(mnt, 0700), 0);
    snprintf(opts, sizeof(opts), "fd=%d,rootmode=40000,user_id=%u,group_id=%u",
             fd, (unsigned)geteuid(), (unsigned)getegid());
    if (mount("dlocktest", mnt, "fuse", MS_NOSUID | MS_NODEV, opts) != 0)
        return 78;
    /* the server dies with this process (th_fork), whatever happens */
    pid_t server = th_fork(fuse_serve, &fd);
    private_uri(u, sizeof(u), base, "fuse");
    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_ENOTSUP);
    CHECK_CONTAINS(dlock_errmsg(), "network file system (FUSE)");
    CHECK_CONTAINS(dlock_errmsg(), mnt);
    CHECK_CONTAINS(dlock_errmsg(), "--store file:///DIR");
    kill(server, SIGKILL);
    th_wait(server);
    return 0;
}

TEST(private_directory_on_a_network_file_system_is_refused)
{
    char base[900];

    snprintf(base, sizeof(base), "%s/priv-netfs", th_tmpdir());
    CHECK_EQ(mkdir(base, 0700), 0);
    int st = th_wait(th_fork(network_fs_child, base));
    if (st == 77) {
        printf("  (no mount namespace (not root): skipped)\n");
        return;
    }
    if (st == 78) {
        printf("  (no FUSE here: only a tmpfs tried, the network case "
               "untested)\n");
        return;
    }
    CHECK_EQ(st, 0);
}

TEST(symlinked_lock_file_is_refused)
{
    char target[1000], link[1000];
    dlock_client *c = client();
    dlock *l = th_handle(c, "linked", 0, 0, 0);
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
    dlock *l = th_handle(c, "foreign", 0, 0, 0);
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
    l = th_handle(c, "adir", 0, 0, 0);
    CHECK(dlock_acquire(l, 0) != DLOCK_OK);
    dlock_close(l);
    dlock_client_close(c);
}

TEST(ttl_has_no_effect_here)
{
    dlock_client *a = client(), *b = client();
    dlock *la = th_handle(a, "nolease", 50, DLOCK_NO_RENEW, 0);
    dlock *lb = th_handle(b, "nolease", 0, 0, 0);

    CHECK_OK(dlock_acquire(la, 0));
    th_sleep_ms(300); /* six "leases" */
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    CHECK_EQ(dlock_held(la), 1);
    CHECK_OK(dlock_extend(la, 100));
    CHECK_OK(dlock_release(la));
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
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
    dlock *la = th_handle(a, "replaced", 0, 0, 0);
    waiter w = {th_handle(b, "replaced", 0, 0, 0), 5000, -99};
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
    TH_CLIENT_CLOSE(a, b);
}

TEST(cancelled_waits_leave_nothing_behind)
{
    dlock_client *a = client(), *b = client(), *c = client();
    dlock *la = th_handle(a, "cancel", 0, DLOCK_FAIR, 0);
    dlock *lb = th_handle(b, "cancel", 0, DLOCK_FAIR, 0);
    waiter w = {th_handle(c, "cancel", 0, DLOCK_FAIR, 0), 10000, -99};
    dlock_info info;
    pthread_t th;

    CHECK_OK(dlock_acquire(la, 0));
    /* c queues first, b behind it and gives up; c must not wait for b's
     * ticket (queued, not slept for: a busy machine may start c late) */
    pthread_create(&th, NULL, wait_thread, &w);
    th_wait_waiters(a, "cancel", 1);
    int64_t t0 = th_now_ms();
    CHECK_RC(dlock_acquire(lb, 300), DLOCK_EBUSY);
    /* lower bound: a wait never ends before its deadline (10 ms for the
     * whole-ms rounding) */
    CHECK_OP(th_now_ms() - t0, >=, 290);
    CHECK_OK(dlock_inspect(a, "cancel", &info));
    CHECK_EQ(info.waiters, 1); /* only c is left in the queue */
    dlock_info_clear(&info);
    t0 = th_now_ms();
    CHECK_OK(dlock_release(la));
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    /* woken by the release (one hand-over), not at its 10 s deadline:
     * 2 s of scheduling slack */
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
    TH_CLOSE(la, lb);
    dlock_close(w.l);
    TH_CLIENT_CLOSE(a, b, c);
}

TEST(long_names_fit_a_file_name)
{
    char name[DLOCK_NAME_MAX + 1];
    dlock_client *c = client();

    memset(name, '%', DLOCK_NAME_MAX); /* worst case: 3 bytes each */
    name[DLOCK_NAME_MAX] = '\0';
    dlock *l = th_handle(c, name, 0, 0, 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

/* ------------------------------------------------------------------------ */
/* Fair hand-over across processes                                          */
/* ------------------------------------------------------------------------ */

/* Timing bounds below ("at once"): a successor whose predecessor
 * releases, gives up or dies is woken by that event (its channel closing
 * or a byte on it, or the kernel's lock), not by its 30 s deadline. The
 * contract is "one wake-up", a few ms; the bound is 2 s of scheduling
 * slack for a busy 2-core machine (processes forked and exiting around
 * it), far below the deadline that a missed wake-up would cost. */

#define NW 16

/* What the workers of one test share (th_shared). Times: th_now_ms(), the
 * monotonic clock, the same in every process. */
typedef struct fstate {
    volatile int order[NW]; /* workers by acquisition */
    volatile int pos;
    volatile int rc[NW];          /* dlock_acquire()'s answer; -99 before */
    volatile int held[NW];        /* 1 while holding */
    volatile int release[NW];     /* set: a worker holding until told */
    volatile int done[NW];
    volatile int64_t t_call[NW], t_acq[NW], t_rel[NW];
    volatile int inside, overlaps; /* holders at once */
    volatile int64_t release_at[NW]; /* > 0: release at this time */
    volatile int fork_ms[NW];      /* > 0: fork a child that lives this
                                    * long, once holding */
    volatile int64_t t_fork[NW];   /* th_now_ms() just before that fork */
    volatile int killed[NW];       /* will be killed holding: not counted
                                    * in `inside` */
    volatile int fork_waiting_ms[NW]; /* > 0: fork a child that lives 3 s,
                                       * this long after starting to wait */
    volatile int gated[NW]; /* set before the start: the worker opens its
                             * client, sets ready, and calls acquire only
                             * once the test clears gated (see gated_start) */
    volatile int ready[NW];
} fstate;

typedef struct fjob {
    fstate *s;
    int me;
    const char *name;
    unsigned flags;
    int64_t wait_ms;
    int64_t hold_ms; /* -1: until s->release[me] or s->release_at[me] */
} fjob;

static void *fork_later(void *arg)
{
    int ms = *(volatile int *)arg;

    th_sleep_ms(ms);
    if (fork() == 0) {
        th_sleep_ms(3000);
        _exit(0);
    }
    return NULL;
}

static int fworker(void *arg)
{
    fjob *j = arg;
    fstate *s = j->s;
    dlock_client *c;
    dlock_options o;
    dlock *l;
    int rc;

    memset(&o, 0, sizeof(o));
    o.flags = j->flags;
    if (dlock_client_open(&c, uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, j->name, &o) != DLOCK_OK)
        return 2;
    pthread_t forker;
    if (s->fork_waiting_ms[j->me] > 0)
        pthread_create(&forker, NULL, fork_later,
                       (void *)&s->fork_waiting_ms[j->me]);
    s->ready[j->me] = 1;
    for (int i = 0; s->gated[j->me] && i < 30000; i++)
        th_sleep_ms(1); /* the test's go (at most ~30 s) */
    s->t_call[j->me] = th_now_ms();
    rc = dlock_acquire(l, j->wait_ms);
    if (s->fork_waiting_ms[j->me] > 0)
        pthread_join(forker, NULL);
    if (rc == DLOCK_OK) {
        s->t_acq[j->me] = th_now_ms();
        if (!s->killed[j->me] &&
            __atomic_add_fetch(&s->inside, 1, __ATOMIC_SEQ_CST) != 1)
            __atomic_add_fetch(&s->overlaps, 1, __ATOMIC_SEQ_CST);
        s->order[__atomic_fetch_add(&s->pos, 1, __ATOMIC_SEQ_CST)] = j->me;
    }
    s->rc[j->me] = rc;
    if (rc == DLOCK_OK) {
        s->held[j->me] = 1;
        if (s->fork_ms[j->me] > 0) {
            /* a child that shares our open files and does nothing */
            s->t_fork[j->me] = th_now_ms();
            pid_t kid = fork();
            if (kid == 0) {
                th_sleep_ms(s->fork_ms[j->me]);
                _exit(0);
            }
        }
        if (j->hold_ms >= 0)
            th_sleep_ms(j->hold_ms);
        else
            for (;;) { /* sleeps, but spins the last 2 ms of release_at */
                int64_t at = s->release_at[j->me], now = th_now_ms();
                if (s->release[j->me] || (at > 0 && now >= at))
                    break;
                if (at <= 0 || at - now > 2)
                    th_sleep_ms(1);
            }
        __atomic_sub_fetch(&s->inside, 1, __ATOMIC_SEQ_CST);
        s->held[j->me] = 0;
        s->t_rel[j->me] = th_now_ms();
        if (dlock_release(l) != DLOCK_OK)
            return 4;
    }
    s->done[j->me] = 1;
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

static fstate *fstate_new(void)
{
    fstate *s = th_shared(sizeof(*s));

    for (int i = 0; i < NW; i++)
        s->rc[i] = -99;
    return s;
}

static pid_t fstart(fstate *s, int me, const char *name, unsigned flags,
                    int64_t wait_ms, int64_t hold_ms)
{
    fjob j = {s, me, name, flags, wait_ms, hold_ms};

    return th_fork(fworker, &j);
}

/* Waits (at most ms) until *flag == v. */
static int wait_for(volatile int *flag, int v, int64_t ms)
{
    int64_t until = th_now_ms() + ms;

    while (*flag != v && th_now_ms() < until)
        th_sleep_ms(1);
    return *flag == v;
}

/* Starts worker `me` forked and ready (client and handle open) but not yet
 * acquiring: the test lets it go with gated_go(). For a worker that must
 * queue behind one with a short deadline: forking and opening a client
 * can take longer than that deadline (under AddressSanitizer th_fork alone
 * waits 150 ms), calling acquire takes a moment. */
static pid_t gated_start(fstate *s, int me, const char *name, unsigned flags,
                         int64_t wait_ms, int64_t hold_ms)
{
    s->gated[me] = 1;
    pid_t pid = fstart(s, me, name, flags, wait_ms, hold_ms);
    CHECK(wait_for(&s->ready[me], 1, 10000));
    return pid;
}

static void gated_go(fstate *s, int me)
{
    s->gated[me] = 0;
}

/* Threads of process pid: a waiter that sleeps on a channel has two (its
 * own and its client's background thread), one that waits in the kernel
 * for a timed wait has a third, the helper. */
static int threads_of(pid_t pid)
{
    char path[64];
    struct dirent *e;
    DIR *d;
    int n = 0;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    d = opendir(path);
    if (!d)
        return -1;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Waits (at most 10 s) until process pid has n threads: a waiter that
 * queued starts its kernel-wait helper a moment later, a long moment on
 * a busy machine. Returns the count last seen. */
static int wait_threads(pid_t pid, int n)
{
    int64_t until = th_now_ms() + 10000;
    int k;

    while ((k = threads_of(pid)) != n && th_now_ms() < until)
        th_sleep_ms(2);
    return k;
}

/* A worker that holds `name` with a fair ticket (and so a channel): it
 * queues behind our own ticketless hold, then we let it through. It holds
 * until s->release[me]. */
static pid_t ticketed_holder(dlock_client *c, fstate *s, int me,
                             const char *name)
{
    dlock *l = th_handle(c, name, 0, DLOCK_FAIR, 0);
    pid_t pid;

    CHECK_OK(dlock_acquire(l, 0)); /* free, no queue: no ticket */
    pid = fstart(s, me, name, DLOCK_FAIR, 30000, -1);
    th_wait_waiters(c, name, 1);
    CHECK_OK(dlock_release(l));
    CHECK(wait_for(&s->held[me], 1, 10000));
    dlock_close(l);
    return pid;
}

TEST(fair_fifo_across_processes_with_deadlines)
{
    fstate *s = fstate_new();
    dlock_client *c = client();
    dlock *l = th_handle(c, "ffifo", 0, DLOCK_FAIR, 0);
    pid_t pids[8];
    const int n = 8;

    CHECK_OK(dlock_acquire(l, 0));
    for (int i = 0; i < n; i++) {
        pids[i] = fstart(s, i, "ffifo", DLOCK_FAIR, 30000, 3);
        th_wait_waiters(c, "ffifo", i + 1);
        /* all but the first wait on their predecessor's channel in their
         * own thread: no helper thread (the first waits for our ticketless
         * hold in the kernel) */
        if (i > 0)
            CHECK_EQ(threads_of(pids[i]), 2);
    }
    CHECK_OK(dlock_release(l));
    for (int i = 0; i < n; i++)
        CHECK_EQ(th_wait(pids[i]), 0);
    CHECK_EQ(s->pos, n);
    CHECK_EQ(s->overlaps, 0);
    for (int i = 0; i < n; i++) {
        CHECK_EQ(s->order[i], i);
        CHECK_OK(s->rc[i]);
    }
    CHECK_EQ(th_waiters(c, "ffifo"), 0);
    dlock_close(l);
    dlock_client_close(c);
}

TEST(killed_fair_holder_hands_over_at_once)
{
    fstate *s = fstate_new();
    dlock_client *c = client();
    s->killed[0] = 1;
    pid_t h = ticketed_holder(c, s, 0, "fkill");
    pid_t w1 = fstart(s, 1, "fkill", DLOCK_FAIR, 30000, 5);

    /* (inspect does not count the holder's own ticket) */
    th_wait_waiters(c, "fkill", 1);
    pid_t w2 = fstart(s, 2, "fkill", DLOCK_FAIR, 30000, 5);
    th_wait_waiters(c, "fkill", 2);
    CHECK_EQ(threads_of(w1), 2); /* on the holder's channel */
    int64_t t0 = th_now_ms();
    kill(h, SIGKILL);
    CHECK_EQ(th_wait(h), 128 + SIGKILL);
    CHECK_EQ(th_wait(w1), 0);
    CHECK_EQ(th_wait(w2), 0);
    CHECK_OK(s->rc[1]);
    CHECK_OK(s->rc[2]);
    CHECK_OP(s->t_acq[1] - t0, <, 2000); /* not its 30 s deadline */
    CHECK_EQ(s->order[1], 1);
    CHECK_EQ(s->order[2], 2);
    CHECK_EQ(s->overlaps, 0);
    CHECK_EQ(th_waiters(c, "fkill"), 0);
    dlock_client_close(c);
}

TEST(killed_fair_waiter_does_not_block_the_queue)
{
    fstate *s = fstate_new();
    dlock_client *c = client();
    pid_t h = ticketed_holder(c, s, 0, "fmid");
    pid_t w[4];

    for (int i = 1; i <= 3; i++) {
        w[i] = fstart(s, i, "fmid", DLOCK_FAIR, 30000, 5);
        th_wait_waiters(c, "fmid", i);
    }
    /* the middle one dies; the one behind it now waits for the first */
    kill(w[2], SIGKILL);
    CHECK_EQ(th_wait(w[2]), 128 + SIGKILL);
    th_wait_waiters(c, "fmid", 2);
    int64_t t0 = th_now_ms();
    s->release[0] = 1;
    CHECK_EQ(th_wait(h), 0);
    CHECK_EQ(th_wait(w[1]), 0);
    CHECK_EQ(th_wait(w[3]), 0);
    CHECK_EQ(s->pos, 3);
    CHECK_EQ(s->order[1], 1);
    CHECK_EQ(s->order[2], 3);
    CHECK_OP(s->t_acq[3] - t0, <, 2000); /* at once */
    CHECK_EQ(s->overlaps, 0);
    CHECK_EQ(th_waiters(c, "fmid"), 0);
    dlock_client_close(c);
}

/* A waiter whose deadline passes just as its predecessor releases: it
 * either takes the lock (late by a hair) or leaves the queue; either way
 * the one behind it is not held up and nothing stays queued. The release
 * is placed from 4 ms before to 4 ms after the deadline. */
TEST(deadline_meets_the_hand_over)
{
    dlock_client *c = client();

    for (int off = -4; off <= 4; off++) {
        fstate *s = fstate_new();
        pid_t h = ticketed_holder(c, s, 0, "fdead");
        const int64_t wait = 300;

        /* t queues behind w within w's short wait: ready before w starts */
        pid_t t = gated_start(s, 2, "fdead", DLOCK_FAIR, 30000, 2);
        pid_t w = fstart(s, 1, "fdead", DLOCK_FAIR, wait, 2);
        th_wait_waiters(c, "fdead", 1);
        gated_go(s, 2);
        th_wait_waiters(c, "fdead", 2);
        s->release_at[0] = s->t_call[1] + wait + off;
        CHECK_EQ(th_wait(h), 0);
        CHECK_EQ(th_wait(w), 0);
        CHECK_EQ(th_wait(t), 0);
        CHECK(s->rc[1] == DLOCK_OK || s->rc[1] == DLOCK_EBUSY);
        CHECK_OK(s->rc[2]);
        /* the last one got it promptly after the release (or after w's
         * short hold) */
        CHECK_OP(s->t_acq[2] - s->t_rel[0], <, 2000); /* at once */
        if (s->rc[1] == DLOCK_OK) {
            /* taken at (or a hair after) its deadline: the wait plus
             * 1 s of scheduling slack */
            CHECK_EQ(s->order[1], 1);
            CHECK_OP(s->t_acq[1] - s->t_call[1], <, wait + 1000);
        } else {
            /* a wait never ends before its deadline */
            CHECK_OP(s->t_call[1] + wait, <=, th_now_ms());
        }
        CHECK_EQ(s->overlaps, 0);
        CHECK_EQ(th_waiters(c, "fdead"), 0);
    }
    dlock_client_close(c);
}

static int count_fds(void)
{
    struct dirent *e;
    DIR *d = opendir("/proc/self/fd");
    int n = 0;

    if (!d)
        return -1;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own */
}

/* Sockets (listeners and their accepted connections) named after the
 * fair channels of `name`'s lock file, in the whole system (the salt and
 * inode in each name: file_wait.c's chan_base()). */
static int count_channels(const char *name)
{
    char line[512], prefix[128], path[1000], fname[64], hex[33];
    unsigned char salt[16];
    struct stat st;
    FILE *f;
    int n = 0, fd;

    snprintf(fname, sizeof(fname), "%.50s.lock", name);
    path_of(fname, path, sizeof(path));
    fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    CHECK_EQ(fstat(fd, &st), 0);
    CHECK_EQ(pread(fd, salt, 16, 16), 16);
    close(fd);
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", salt[i]);
    snprintf(prefix, sizeof(prefix), "/%s-%llx-f", hex,
             (unsigned long long)st.st_ino);
    f = fopen("/proc/net/unix", "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, prefix) != NULL;
    fclose(f);
    return n;
}

static int count_in(const char *d)
{
    struct dirent *e;
    DIR *dd = opendir(d);
    int n = 0;

    if (!dd)
        return -1;
    while ((e = readdir(dd)))
        n += e->d_name[0] != '.';
    closedir(dd);
    return n;
}

/* The store's files, and the channels' socket files */
static int count_files(void)
{
    char w[PATH_MAX + 8192];

    wake_dir_of(dir, w, sizeof(w));
    return count_in(dir) + count_in(w);
}

TEST(timed_waits_leave_nothing_behind)
{
    fstate *s = fstate_new();
    dlock_client *c = client(), *me = client();
    pid_t h = ticketed_holder(c, s, 0, "fnothing");
    dlock *fair = th_handle(me, "fnothing", 0, DLOCK_FAIR, 0);
    dlock *plain = th_handle(me, "fnothing", 0, 0, 0);
    /* one wait first: the client keeps its finished waits' cancel
     * eventfds for the next ones (dlock_cancel()); every later wait
     * reuses that one, so the count must not grow */
    CHECK_RC(dlock_acquire(plain, 20), DLOCK_EBUSY);
    int fds = count_fds(), threads = threads_of(getpid());
    int files = count_files();

    CHECK_EQ(count_channels("fnothing"), 1); /* the holder's listener */
    for (int i = 0; i < 10; i++) {
        int64_t t0 = th_now_ms();
        /* fair: on the holder's channel; plain: in the kernel */
        CHECK_RC(dlock_acquire(i % 2 ? plain : fair, 20 + i), DLOCK_EBUSY);
        /* lower bound: never before the deadline; upper bound: the wait,
         * leaving the queue (local: no store round trip) and 1 s of
         * scheduling slack */
        CHECK_OP(th_now_ms() - t0, >=, 20 + i);
        CHECK_OP(th_now_ms() - t0, <, 20 + i + 1000);
        CHECK_EQ(th_waiters(c, "fnothing"), 0); /* the holder's only */
        CHECK_EQ(count_fds(), fds);
        CHECK_EQ(threads_of(getpid()), threads);
        CHECK_EQ(count_files(), files);
    }
    /* the holder keeps what it accepted from the waiters that left (at
     * most a few) until it releases; then nothing is left anywhere */
    CHECK_OP(count_channels("fnothing"), <=, 1 + 4);
    s->release[0] = 1;
    CHECK_EQ(th_wait(h), 0);
    CHECK_OK(dlock_acquire(fair, 0));
    CHECK_OK(dlock_release(fair));
    CHECK_EQ(count_channels("fnothing"), 0);
    CHECK_EQ(th_waiters(c, "fnothing"), 0);
    TH_CLOSE(fair, plain);
    TH_CLIENT_CLOSE(me, c);
}

TEST(fair_and_default_acquirers_mixed)
{
    fstate *s = fstate_new();
    dlock_client *c = client();
    dlock *l = th_handle(c, "fmix", 0, DLOCK_FAIR, 0);
    pid_t pids[7];

    /* FIFO among the fair ones, whatever the default ones do */
    CHECK_OK(dlock_acquire(l, 0));
    for (int i = 0; i < 3; i++) {
        pids[i] = fstart(s, i, "fmix", DLOCK_FAIR, 30000, 3);
        th_wait_waiters(c, "fmix", i + 1);
        pids[3 + i] = fstart(s, 3 + i, "fmix", 0, 30000, 3);
    }
    th_sleep_ms(50); /* the default ones wait in the kernel */
    CHECK_OK(dlock_release(l));
    for (int i = 0; i < 6; i++)
        CHECK_EQ(th_wait(pids[i]), 0);
    CHECK_EQ(s->pos, 6);
    CHECK_EQ(s->overlaps, 0);
    int next = 0;
    for (int i = 0; i < 6; i++)
        if (s->order[i] < 3)
            CHECK_EQ(s->order[i], next++);
    CHECK_EQ(next, 3);
    dlock_close(l);
    dlock_client_close(c);
}

/* Processes looping over acquire (with a deadline), hold, release, fair
 * and default ones together: never two holders. */
typedef struct loopjob {
    fstate *s;
    unsigned flags;
} loopjob;

static int loop_worker(void *arg)
{
    loopjob *j = arg;
    dlock_client *c;
    dlock_options o;
    dlock *l;

    memset(&o, 0, sizeof(o));
    o.flags = j->flags;
    if (dlock_client_open(&c, uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "floop", &o) != DLOCK_OK)
        return 2;
    for (int i = 0; i < 30; i++) {
        int rc = dlock_acquire(l, 20000);
        if (rc != DLOCK_OK) {
            fprintf(stderr, "loop worker: %s\n", dlock_errmsg());
            return 3;
        }
        if (__atomic_add_fetch(&j->s->inside, 1, __ATOMIC_SEQ_CST) != 1)
            __atomic_add_fetch(&j->s->overlaps, 1, __ATOMIC_SEQ_CST);
        th_sleep_ms(1);
        __atomic_sub_fetch(&j->s->inside, 1, __ATOMIC_SEQ_CST);
        if (dlock_release(l) != DLOCK_OK)
            return 4;
    }
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

TEST(mixed_modes_never_overlap)
{
    fstate *s = fstate_new();
    pid_t pids[6];

    for (int i = 0; i < 6; i++) {
        loopjob j = {s, i < 4 ? DLOCK_FAIR : 0};
        pids[i] = th_fork(loop_worker, &j);
    }
    for (int i = 0; i < 6; i++)
        CHECK_EQ(th_wait(pids[i]), 0);
    CHECK_EQ(s->overlaps, 0);
}

/* --- channels that cannot be used: the kernel path ---------------------- */

/* The lock file's header: the next ticket and the channel salt. */
static void header_of(const char *name, uint64_t *next, unsigned char *salt,
                      struct stat *st)
{
    char path[1000], fname[64];
    int fd;

    snprintf(fname, sizeof(fname), "%.50s.lock", name);
    path_of(fname, path, sizeof(path));
    fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    CHECK_EQ(fstat(fd, st), 0);
    CHECK_EQ(pread(fd, next, 8, 8), 8);
    if (salt)
        CHECK_EQ(pread(fd, salt, 16, 16), 16);
    close(fd);
}

/* The address of a ticket's channel (file_wait.c's chan_base()): its
 * socket file in the store's wake-up directory (ours), by its path. */
static socklen_t chan_addr(struct sockaddr_un *sa, const struct stat *st,
                           const unsigned char *salt, uint64_t ticket)
{
    char hex[33], w[PATH_MAX + 8192];
    int n;

    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", salt[i]);
    wake_dir_of(dir, w, sizeof(w));
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    n = snprintf(sa->sun_path, sizeof(sa->sun_path), "%s/%s-%llx-f%llx", w,
                 hex, (unsigned long long)st->st_ino,
                 (unsigned long long)(ticket % 4096));
    CHECK_OP(n, <, (int)sizeof(sa->sun_path)); /* a short test directory */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + (size_t)n +
                       1);
}

/* Takes the next ticket and MAIN by hand, the way a dlock without
 * channels (an older version) does: no channel. Returns the open file. */
static int raw_ticket_holder(const char *name, uint64_t *ticket)
{
    char path[1000], fname[64];
    struct flock fl;
    uint64_t next = 0;
    int fd;

    snprintf(fname, sizeof(fname), "%.50s.lock", name);
    path_of(fname, path, sizeof(path));
    fd = open(path, O_RDWR | O_CREAT, 0644);
    CHECK(fd >= 0);
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = 1; /* META */
    fl.l_len = 1;
    CHECK_EQ(fcntl(fd, F_OFD_SETLKW, &fl), 0);
    if (pread(fd, &next, 8, 8) != 8)
        next = 0;
    *ticket = next++;
    CHECK_EQ(pwrite(fd, "DLOCKF1\n", 8, 0), 8);
    CHECK_EQ(pwrite(fd, &next, 8, 8), 8);
    fl.l_start = ((off_t)1 << 32) + (off_t)*ticket;
    CHECK_EQ(fcntl(fd, F_OFD_SETLK, &fl), 0);
    fl.l_start = 0; /* MAIN */
    CHECK_EQ(fcntl(fd, F_OFD_SETLK, &fl), 0);
    fl.l_type = F_UNLCK;
    fl.l_start = 1;
    CHECK_EQ(fcntl(fd, F_OFD_SETLK, &fl), 0);
    return fd;
}

/* Gives the file a channel salt: a fair waiter (a child: in this process
 * its kernel wait would stall valgrind) queues once behind our hold. */
static void salt_file(const char *name)
{
    fstate *s = fstate_new();
    dlock_client *c = client();
    dlock *a = th_handle(c, name, 0, DLOCK_FAIR, 0);
    unsigned char salt[16], zero[16] = {0};
    struct stat st;
    uint64_t next;

    CHECK_OK(dlock_acquire(a, 0));
    pid_t w = fstart(s, 0, name, DLOCK_FAIR, 30000, 0);
    th_wait_waiters(c, name, 1); /* its ticket, taken with the salt */
    header_of(name, &next, salt, &st);
    CHECK(memcmp(salt, zero, 16) != 0);
    CHECK_OK(dlock_release(a));
    CHECK_EQ(th_wait(w), 0);
    dlock_close(a);
    dlock_client_close(c);
}

/* After the holder `fd` (no usable channel) releases, the waiter w (which
 * waited in the kernel: a helper thread) takes the lock at once. The
 * hand-made ticket has no holder record: inspect counts it as queued. */
static void kernel_path_then_release(fstate *s, dlock_client *c,
                                     const char *name, int fd, pid_t w)
{
    th_wait_waiters(c, name, 2);
    CHECK_EQ(wait_threads(w, 3), 3); /* main, client, kernel-wait helper */
    int64_t t0 = th_now_ms();
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_UNLCK;
    fl.l_whence = SEEK_SET;
    CHECK_EQ(fcntl(fd, F_OFD_SETLK, &fl), 0);
    close(fd);
    CHECK_EQ(th_wait(w), 0);
    CHECK_OK(s->rc[1]);
    CHECK_OP(s->t_acq[1] - t0, <, 2000); /* at once */
    CHECK_EQ(th_waiters(c, name), 0);
}

TEST(refused_channel_ends_in_the_kernel)
{
    fstate *s = fstate_new();
    dlock_client *c = client();
    uint64_t t;

    salt_file("frefused");
    int fd = raw_ticket_holder("frefused", &t);
    pid_t w = fstart(s, 1, "frefused", DLOCK_FAIR, 30000, 1);
    kernel_path_then_release(s, c, "frefused", fd, w);
    dlock_client_close(c);
}

/* A process of another user tries to listen on the name of a ticket's
 * channel: the store's wake-up directory keeps it out (bind fails with
 * EACCES); the successor waits in the kernel as before. */
typedef struct squatter {
    struct sockaddr_un sa;
    socklen_t len;
    volatile int ready;
    volatile int err; /* bind's errno */
} squatter;

static int squat(void *arg)
{
    squatter *q = arg;
    int l;

    if (setgid(65534) != 0 || setuid(65534) != 0)
        return 2;
    /* a change of uid clears the parent-death signal: die with the test */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    l = socket(AF_UNIX, SOCK_STREAM, 0);
    if (l < 0)
        return 4;
    if (bind(l, (struct sockaddr *)&q->sa, q->len) != 0)
        q->err = errno;
    else if (listen(l, 16) != 0)
        return 4;
    q->ready = 1;
    pause(); /* until killed */
    return 0;
}

TEST(foreign_listener_on_a_channel_name)
{
    fstate *s = fstate_new();
    squatter *q = th_shared(sizeof(*q));
    dlock_client *c;
    unsigned char salt[16];
    struct stat st;
    uint64_t t, next;

    if (geteuid() != 0) {
        printf("  (not root: no other user to squat with)\n");
        return;
    }
    salt_file("fsquat");
    /* the test's directories open to nobody: only the store's wake-up
     * directory keeps it out */
    CHECK_EQ(chmod(th_tmpdir(), 0755), 0);
    CHECK_EQ(chmod(dir, 01777), 0);
    int fd = raw_ticket_holder("fsquat", &t);
    header_of("fsquat", &next, salt, &st);
    CHECK_EQ(next, t + 1);
    q->len = chan_addr(&q->sa, &st, salt, t);
    pid_t sq = th_fork(squat, q);
    th__track(sq, 1); /* killed at exit, even if the test fails */
    CHECK(wait_for(&q->ready, 1, 10000));
    CHECK_EQ(q->err, EACCES);
    kill(sq, SIGKILL);
    th_wait(sq);
    th__track(sq, 0);
    /* the successor finds no channel, and waits for the ticket's byte in
     * the kernel */
    pid_t w = fstart(s, 1, "fsquat", DLOCK_FAIR, 30000, 1);
    c = client(); /* after the forks: no child inherits it */
    kernel_path_then_release(s, c, "fsquat", fd, w);
    dlock_client_close(c);
}

/* Someone holds the name of the next ticket's channel before its owner
 * comes: the owner skips that ticket number, and still gets a channel. */
TEST(squatted_ticket_number_is_skipped)
{
    fstate *s = fstate_new();
    dlock_client *c = client();
    dlock *l = th_handle(c, "fskip", 0, DLOCK_FAIR, 0);
    struct sockaddr_un sa;
    unsigned char salt[16];
    struct stat st;
    uint64_t next, after;

    salt_file("fskip");
    header_of("fskip", &next, salt, &st);
    socklen_t len = chan_addr(&sa, &st, salt, next);
    int sq = socket(AF_UNIX, SOCK_STREAM, 0);
    CHECK_EQ(bind(sq, (struct sockaddr *)&sa, len), 0);
    CHECK_EQ(listen(sq, 4), 0);

    CHECK_OK(dlock_acquire(l, 0));
    pid_t w1 = fstart(s, 1, "fskip", DLOCK_FAIR, 30000, 3);
    th_wait_waiters(c, "fskip", 1);
    header_of("fskip", &after, NULL, &st);
    CHECK_EQ(after, next + 2); /* one number skipped */
    pid_t w2 = fstart(s, 2, "fskip", DLOCK_FAIR, 30000, 3);
    th_wait_waiters(c, "fskip", 2);
    CHECK_EQ(threads_of(w2), 2); /* on w1's (real) channel */
    CHECK_OK(dlock_release(l));
    CHECK_EQ(th_wait(w1), 0);
    CHECK_EQ(th_wait(w2), 0);
    CHECK_EQ(s->order[0], 1);
    CHECK_EQ(s->order[1], 2);
    CHECK_OP(s->t_acq[2] - s->t_rel[1], <, 2000); /* at once */
    close(sq);
    dlock_close(l);
    dlock_client_close(c);
}

/* A predecessor in another network namespace: its channel is a file, so
 * the namespace does not matter (the abstract names of old did). */
static int netns_worker(void *arg)
{
    if (unshare(CLONE_NEWNET) != 0)
        return 77;
    return fworker(arg);
}

TEST(predecessor_in_another_network_namespace)
{
    fstate *s = fstate_new();
    dlock_client *c = client();
    dlock *l = th_handle(c, "fnetns", 0, DLOCK_FAIR, 0);
    fjob j = {s, 0, "fnetns", DLOCK_FAIR, 30000, -1};

    CHECK_OK(dlock_acquire(l, 0));
    pid_t h = th_fork(netns_worker, &j);
    int64_t until = th_now_ms() + 10000;
    while (th_waiters(c, "fnetns") < 1 && th_now_ms() < until &&
           !s->done[0] && kill(h, 0) == 0 && s->rc[0] == -99) {
        int st;
        if (waitpid(h, &st, WNOHANG) == h) {
            /* could not make a namespace (not root): nothing to test */
            CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 77);
            printf("  (no network namespace: skipped)\n");
            CHECK_OK(dlock_release(l));
            dlock_close(l);
            dlock_client_close(c);
            return;
        }
        th_sleep_ms(2);
    }
    th_wait_waiters(c, "fnetns", 1);
    CHECK_OK(dlock_release(l));
    CHECK(wait_for(&s->held[0], 1, 10000));
    pid_t w = fstart(s, 1, "fnetns", DLOCK_FAIR, 30000, 1);
    th_wait_waiters(c, "fnetns", 1);
    th_sleep_ms(20);
    CHECK_EQ(threads_of(w), 2); /* on the predecessor's channel */
    int64_t t0 = th_now_ms();
    s->release[0] = 1;
    CHECK_EQ(th_wait(h), 0);
    CHECK_EQ(th_wait(w), 0);
    CHECK_OK(s->rc[1]);
    CHECK_OP(s->t_acq[1] - t0, <, 2000); /* at once */
    dlock_close(l);
    dlock_client_close(c);
}

/* Someone connects to the holder's channel and never reads: the release
 * still wakes the real successor. */
TEST(foreign_connection_to_a_channel)
{
    fstate *s = fstate_new();
    dlock_client *c = client();
    pid_t h = ticketed_holder(c, s, 0, "fconn");
    struct sockaddr_un sa;
    unsigned char salt[16];
    struct stat st;
    uint64_t next;
    int conns[8];

    header_of("fconn", &next, salt, &st);
    socklen_t len = chan_addr(&sa, &st, salt, next - 1); /* the holder's */
    for (int i = 0; i < 8; i++) {
        conns[i] = socket(AF_UNIX, SOCK_STREAM, 0);
        CHECK_EQ(connect(conns[i], (struct sockaddr *)&sa, len), 0);
    }
    pid_t w = fstart(s, 1, "fconn", DLOCK_FAIR, 30000, 1);
    th_wait_waiters(c, "fconn", 1);
    /* no kernel-wait helper: a helper started late (a busy machine) would
     * be missed here, so load can make this check weaker, never fail */
    th_sleep_ms(20);
    CHECK_EQ(threads_of(w), 2);
    int64_t t0 = th_now_ms();
    s->release[0] = 1;
    CHECK_EQ(th_wait(h), 0);
    CHECK_EQ(th_wait(w), 0);
    CHECK_OK(s->rc[1]);
    CHECK_OP(s->t_acq[1] - t0, <, 2000); /* at once */
    for (int i = 0; i < 8; i++)
        close(conns[i]);
    dlock_client_close(c);
}

/* --- other users and processes outside dlock (issue 34) ------------------ */

/* The store of these tests: a directory anyone may write (mode 1777, as
 * /tmp), reached through a path others may search. */
static void world_dir(char *out, size_t cap, const char *leaf)
{
    CHECK_EQ(chmod(th_tmpdir(), 0755), 0);
    snprintf(out, cap, "%s/%s", th_tmpdir(), leaf);
    CHECK_EQ(mkdir(out, 0700), 0);
    CHECK_EQ(chmod(out, 01777), 0);
}

/* What a child of another uid (and gid, and groups) does */
typedef struct as_other {
    uid_t uid;
    gid_t gid;
    gid_t group; /* a supplementary group, or 0: none */
    const char *path; /* a lock file to open */
    const char *uri;  /* a store to open, and acquire `name` in */
    const char *name;
    int open_err;  /* open(path, O_RDONLY)'s errno, 0: opened */
    int rc;        /* dlock_client_open(), then dlock_acquire(name, 0) */
    char msg[512]; /* dlock_errmsg() */
} as_other;

static int as_other_child(void *arg)
{
    as_other *a = arg;
    dlock_client *c = NULL;
    dlock *l = NULL;
    int fd;

    if ((a->group ? setgroups(1, &a->group) : setgroups(0, NULL)) != 0 ||
        setgid(a->gid) != 0 || setuid(a->uid) != 0)
        return 2;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (a->path) {
        fd = open(a->path, O_RDONLY);
        a->open_err = fd < 0 ? errno : 0;
        if (fd >= 0)
            close(fd);
    }
    if (a->uri) {
        a->rc = dlock_client_open(&c, a->uri, NULL);
        if (a->rc == DLOCK_OK && (a->rc = dlock_open(&l, c, a->name,
                                                     NULL)) == DLOCK_OK) {
            a->rc = dlock_acquire(l, 0);
            if (a->rc == DLOCK_OK)
                dlock_release(l);
            dlock_close(l);
        }
        snprintf(a->msg, sizeof(a->msg), "%s", dlock_errmsg());
        dlock_client_close(c);
    }
    return 0;
}

static as_other *as_other_run(uid_t uid, gid_t gid, gid_t group,
                              const char *path, const char *u,
                              const char *name)
{
    as_other *a = th_shared(sizeof(*a));

    a->uid = uid;
    a->gid = gid;
    a->group = group;
    a->path = path;
    a->uri = u;
    a->name = name;
    a->rc = -99;
    CHECK_EQ(th_wait(th_fork(as_other_child, a)), 0);
    return a;
}

TEST(lock_files_are_closed_to_other_users)
{
    char d[1000], u[1100], f[1100], w[1100];
    struct stat st;
    dlock_client *c;
    dlock *l;

    if (geteuid() != 0) {
        printf("  (not root: no other user)\n");
        return;
    }
    world_dir(d, sizeof(d), "world");
    snprintf(u, sizeof(u), "file://%s", d);
    mode_t old = umask(022);
    c = th_client(u, NULL);
    l = th_handle(c, "fopen", 0, 0, 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    umask(old);
    snprintf(f, sizeof(f), "%s/fopen.lock", d);
    CHECK_EQ(stat(f, &st), 0);
    CHECK_EQ(st.st_mode & 07777, 0600);
    snprintf(w, sizeof(w), "%s/.dlock-wake-u0", d);
    CHECK_EQ(stat(w, &st), 0);
    CHECK_EQ(st.st_mode & 07777, 0700);
    /* nobody cannot open it, not even to read (an OFD read lock would
     * jam it), nor take it through dlock; its own names work */
    as_other *a = as_other_run(65534, 65534, 0, f, u, "fopen");
    CHECK_EQ(a->open_err, EACCES);
    CHECK(a->rc != DLOCK_OK);
    a = as_other_run(65534, 65534, 0, NULL, u, "fnobody");
    CHECK_OK(a->rc);
    snprintf(f, sizeof(f), "%s/fnobody.lock", d);
    CHECK_EQ(stat(f, &st), 0);
    CHECK_EQ(st.st_uid, 65534);
    CHECK_EQ(st.st_mode & 07777, 0600);
    /* ours, made wider (by an older dlock): closed at the next use;
     * another user's: refused */
    snprintf(f, sizeof(f), "%s/fopen.lock", d);
    CHECK_EQ(chmod(f, 0644), 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    CHECK_EQ(stat(f, &st), 0);
    CHECK_EQ(st.st_mode & 07777, 0600);
    dlock_close(l);
    l = th_handle(c, "fnobody", 0, 0, 0);
    CHECK_RC(dlock_acquire(l, 0), DLOCK_EAUTH);
    CHECK(strstr(dlock_errmsg(), "belongs to uid 65534") != NULL);
    dlock_close(l);
    dlock_client_close(c);
}

TEST(group_store_is_shared_with_its_group_only)
{
    char d[1000], u[1100], f[1100], w[1100], bad[1200];
    struct stat st;
    dlock_client *c = NULL;
    dlock *l;

    if (geteuid() != 0) {
        printf("  (not root: no other user)\n");
        return;
    }
    CHECK_EQ(chmod(th_tmpdir(), 0755), 0);
    snprintf(d, sizeof(d), "%s/group/store", th_tmpdir());
    snprintf(u, sizeof(u), "file://%s?group=65534", d);
    mode_t old = umask(022);
    c = th_client(u, NULL);
    umask(old);
    /* the directories it made: the group's, setgid, closed to others */
    CHECK_EQ(stat(d, &st), 0);
    CHECK_EQ(st.st_mode & 07777, 02770);
    CHECK_EQ(st.st_gid, 65534);
    snprintf(w, sizeof(w), "%s/.dlock-wake-g65534", d);
    CHECK_EQ(stat(w, &st), 0);
    CHECK_EQ(st.st_mode & 07777, 02770);
    CHECK_EQ(st.st_gid, 65534);
    l = th_handle(c, "fgroup", 0, 0, 0);
    CHECK_OK(dlock_acquire(l, 0));
    snprintf(f, sizeof(f), "%s/fgroup.lock", d);
    CHECK_EQ(stat(f, &st), 0);
    CHECK_EQ(st.st_mode & 07777, 0660);
    CHECK_EQ(st.st_gid, 65534);
    /* a member (another uid) sees it busy, then takes it */
    as_other *a = as_other_run(12345, 12345, 65534, f, u, "fgroup");
    CHECK_EQ(a->open_err, 0);
    CHECK_RC(a->rc, DLOCK_EBUSY);
    CHECK_OK(dlock_release(l));
    a = as_other_run(12345, 12345, 65534, f, u, "fgroup");
    CHECK_OK(a->rc);
    /* someone outside the group cannot open it, nor name the group */
    a = as_other_run(12346, 12346, 0, f, NULL, NULL);
    CHECK_EQ(a->open_err, EACCES);
    a = as_other_run(12346, 12346, 0, NULL, u, "fgroup");
    CHECK_RC(a->rc, DLOCK_EINVAL);
    CHECK(strstr(a->msg, "not a member of group") != NULL);
    /* bad values */
    const char *bads[] = {"?group=", "?group=no-such-group-dlock",
                          "?group=65534&private=1"};
    for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
        dlock_client *b = NULL;
        snprintf(bad, sizeof(bad), "file://%s%s", d, bads[i]);
        CHECK_RC(dlock_client_open(&b, bad, NULL), DLOCK_EINVAL);
        CHECK(strstr(dlock_errmsg(), "group") != NULL);
    }
    dlock_close(l);
    dlock_client_close(c);
}

/* --- read locks that no dlock holder took ------------------------------ */

/* dlock_acquire() in a thread; the test waits for it at most 10 s, so
 * that a wait that never ends fails the test instead of hanging it */
typedef struct timed_acq {
    dlock *l;
    int64_t wait;
    volatile int rc;
    volatile int done;
    volatile int64_t took;
} timed_acq;

static void *timed_acq_thread(void *arg)
{
    timed_acq *t = arg;
    int64_t t0 = th_now_ms();
    int rc = dlock_acquire(t->l, t->wait);

    if (rc == DLOCK_OK)
        dlock_release(t->l);
    t->took = th_now_ms() - t0;
    t->rc = rc;
    __atomic_store_n(&t->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static pthread_t timed_start(timed_acq *t, dlock *l, int64_t wait)
{
    pthread_t th;

    t->l = l;
    t->wait = wait;
    t->done = 0;
    t->rc = -99;
    CHECK_EQ(pthread_create(&th, NULL, timed_acq_thread, t), 0);
    return th;
}

static int64_t timed_end(timed_acq *t, pthread_t th)
{
    for (int i = 0; i < 10000 && !__atomic_load_n(&t->done, __ATOMIC_ACQUIRE);
         i++)
        th_sleep_ms(1);
    CHECK(t->done); /* else it would never have ended */
    pthread_join(th, NULL);
    return t->took;
}

/* one acquire through l with `wait`: DLOCK_EBUSY, and how long it took */
static int64_t busy_for(dlock *l, int64_t wait)
{
    timed_acq t;
    pthread_t th = timed_start(&t, l, wait);
    int64_t took = timed_end(&t, th);

    CHECK_RC(t.rc, DLOCK_EBUSY);
    return took;
}

/* Opens `name`'s lock file the way any process could, and takes an OFD
 * read lock on `byte`. */
static int foreign_read_lock(const char *name, off_t byte)
{
    char path[1000], fname[64];
    struct flock fl;
    int fd;

    snprintf(fname, sizeof(fname), "%.50s.lock", name);
    path_of(fname, path, sizeof(path));
    fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_RDLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = byte;
    fl.l_len = 1;
    CHECK_EQ(fcntl(fd, F_OFD_SETLK, &fl), 0);
    return fd;
}

/*
 * Bounds: a try (wait 0) may wait for META (held for a few system calls by
 * dlock) META_GRACE_MS, 20 ms; 500 ms allows a busy 2-core machine to
 * schedule the thread, against a wait that never ended before (the 10 s
 * of timed_end()). A 500 ms wait never ends before its deadline (10 ms
 * for whole-ms rounding) and ends within 1 s of scheduling slack after.
 */
#define TRY_MS 500
#define SLACK_MS 1000

TEST(foreign_read_locks_bound_every_wait)
{
    dlock_client *c = client();
    dlock_options o;
    dlock *lk_plain = th_handle(c, "fjam", 0, 0, 0);
    dlock *lk_fair = th_handle(c, "fjam", 0, DLOCK_FAIR, 0);
    dlock *sem, *sem_fair;
    dlock_info info;
    int64_t took;

    memset(&o, 0, sizeof(o));
    o.permits = 2;
    CHECK_OK(dlock_open(&sem, c, "fjamsem", &o));
    o.flags = DLOCK_FAIR;
    CHECK_OK(dlock_open(&sem_fair, c, "fjamsem", &o));
    /* the files exist, salted, as dlock left them */
    CHECK_OK(dlock_acquire(lk_plain, 0));
    CHECK_OK(dlock_release(lk_plain));
    CHECK_OK(dlock_acquire(sem, 0));
    CHECK_OK(dlock_release(sem));

    /* read locks on MAIN and META of the lock, META of the semaphore */
    int f1 = foreign_read_lock("fjam", 0);
    int f2 = foreign_read_lock("fjam", 1);
    int f3 = foreign_read_lock("fjamsem", 1);

    dlock *all[] = {lk_plain, lk_fair, sem, sem_fair};
    for (int i = 0; i < 4; i++) {
        CHECK_OP(busy_for(all[i], 0), <, TRY_MS);
        took = busy_for(all[i], 500);
        CHECK_OP(took, >=, 490);
        CHECK_OP(took, <, 500 + SLACK_MS);
    }
    /* dlock_cancel() ends a wait for META (semaphore) at once */
    for (int i = 2; i < 4; i++) {
        timed_acq t;
        pthread_t th = timed_start(&t, all[i], 30000);
        th_sleep_ms(100);
        int64_t t0 = th_now_ms();
        CHECK_OK(dlock_cancel(all[i]));
        timed_end(&t, th);
        CHECK_RC(t.rc, DLOCK_ECANCELED);
        CHECK_OP(th_now_ms() - t0, <, SLACK_MS);
    }
    /* status tells them from dlock's holders */
    CHECK_OK(dlock_inspect(c, "fjam", &info));
    CHECK(info.held);
    CHECK_EQ(info.holders, 0);
    CHECK_STR(info.holder,
              "a process outside dlock holds a read lock on this file");
    dlock_info_clear(&info);
    CHECK_OK(dlock_inspect(c, "fjamsem", &info));
    CHECK(info.held);
    CHECK_EQ(info.holders, 0);
    CHECK_STR(info.holder,
              "a process outside dlock holds a read lock on this file");
    dlock_info_clear(&info);
    close(f1);
    close(f2);
    close(f3);
    /* once they let go, everything works */
    for (int i = 0; i < 4; i++) {
        CHECK_OK(dlock_acquire(all[i], 0));
        CHECK_OK(dlock_release(all[i]));
    }
    CHECK_OK(dlock_inspect(c, "fjamsem", &info));
    CHECK(!info.held);
    dlock_info_clear(&info);
    for (int i = 0; i < 4; i++)
        dlock_close(all[i]);
    dlock_client_close(c);
}

static int64_t cpu_ms(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (int64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000 +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000;
}

/* A read lock from outside dlock on a fair ticket's byte (a "waiter" that
 * has no channel): a fair waiter behind it waits for it in the kernel,
 * until its deadline, without spinning (a read lock of its own would
 * pass at once: the old code looped on it, ~480 ms of CPU a second on an
 * idle machine). Bound: a kernel wait costs a thread and a few system
 * calls, well under 10 ms; 100 ms leaves room for a sanitizer. */
TEST(foreign_read_lock_on_a_ticket_does_not_spin)
{
    dlock_client *c = client();
    dlock *l = th_handle(c, "fspin", 0, DLOCK_FAIR, 0);

    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    /* the lock on ticket 0, and the counter past it (as a waiter that
     * took it would leave it) */
    char path[1000];
    uint64_t next = 1;
    path_of("fspin.lock", path, sizeof(path));
    int wfd = open(path, O_RDWR);
    CHECK(wfd >= 0);
    CHECK_EQ(pwrite(wfd, &next, 8, 8), 8);
    close(wfd);
    int fd = foreign_read_lock("fspin", (off_t)1 << 32);
    int64_t cpu0 = cpu_ms(), t0 = th_now_ms();
    CHECK_RC(dlock_acquire(l, 1000), DLOCK_EBUSY);
    int64_t took = th_now_ms() - t0, cpu = cpu_ms() - cpu0;
    CHECK_OP(took, >=, 990);
    CHECK_OP(took, <, 1000 + SLACK_MS);
    CHECK_OP(cpu, <, 100);
    close(fd);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

/* --- squatters -------------------------------------------------------- */

typedef struct sem_squat {
    struct sockaddr_un sa[4]; /* names to take: old abstract, new paths */
    socklen_t len[4];
    int n;
    volatile int bound[4]; /* 1: bound; else -errno */
    volatile int ready;
} sem_squat;

static int sem_squat_child(void *arg)
{
    sem_squat *q = arg;

    if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0)
        return 2;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (int i = 0; i < q->n; i++) {
        int l = socket(AF_UNIX, SOCK_STREAM, 0);
        if (l >= 0 && bind(l, (struct sockaddr *)&q->sa[i], q->len[i]) == 0 &&
            listen(l, 16) == 0)
            q->bound[i] = 1;
        else
            q->bound[i] = -errno;
    }
    q->ready = 1;
    pause();
    return 0;
}

/* A semaphore's waiter in a child: acquires `name` (2 permits) with a
 * 30 s wait; s->t_acq[me] is when it got a permit. */
static int sem_waiter(void *arg)
{
    fjob *j = arg;
    dlock_client *c;
    dlock_options o;
    dlock *l;

    memset(&o, 0, sizeof(o));
    o.permits = 2;
    if (dlock_client_open(&c, uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, j->name, &o) != DLOCK_OK)
        return 2;
    j->s->rc[j->me] = dlock_acquire(l, j->wait_ms);
    j->s->t_acq[j->me] = th_now_ms();
    if (j->s->rc[j->me] == DLOCK_OK)
        dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

/* Which permit byte (its index) `fd`'s file has locked in [from, 2) */
static int permit_held(const char *name, int from)
{
    char path[1000], fname[64];
    struct flock fl;
    int fd, at = -1;

    snprintf(fname, sizeof(fname), "%.50s.lock", name);
    path_of(fname, path, sizeof(path));
    fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    for (int i = from; i < 2 && at < 0; i++) {
        memset(&fl, 0, sizeof(fl));
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        fl.l_start = ((off_t)1 << 16) + i;
        fl.l_len = 1;
        CHECK_EQ(fcntl(fd, F_OFD_GETLK, &fl), 0);
        if (fl.l_type != F_UNLCK)
            at = i;
    }
    close(fd);
    return at;
}

/* Another user takes the names of a semaphore's wake-up channels before
 * its holders come (the abstract names of old, from the salt that
 * /proc/net/unix showed; the socket files of now, in the store's
 * directory): a waiter still gets the permit when the first holder lets
 * go, not when the last does. */
TEST(squatters_cannot_slow_a_semaphore_wait)
{
    const char *name = "fsqsem";
    char hex[33], w[PATH_MAX + 8192];
    unsigned char salt[16];
    struct stat st;
    uint64_t next;
    dlock_client *c1, *c2;
    dlock_options o;
    dlock *h1, *h2;
    fstate *s = fstate_new();
    sem_squat *q = th_shared(sizeof(*q));

    if (geteuid() != 0) {
        printf("  (not root: no other user to squat with)\n");
        return;
    }
    c1 = client();
    c2 = client();
    /* the test's directories open to nobody (but the store's own
     * wake-up directory) */
    CHECK_EQ(chmod(th_tmpdir(), 0755), 0);
    CHECK_EQ(chmod(dir, 01777), 0);
    memset(&o, 0, sizeof(o));
    o.permits = 2;
    CHECK_OK(dlock_open(&h1, c1, name, &o));
    CHECK_OK(dlock_open(&h2, c2, name, &o));
    CHECK_OK(dlock_acquire(h1, 0)); /* salts the file */
    CHECK_OK(dlock_release(h1));
    header_of(name, &next, salt, &st);
    for (int i = 0; i < 16; i++)
        snprintf(hex + 2 * i, 3, "%02x", salt[i]);
    wake_dir_of(dir, w, sizeof(w));
    for (int i = 0; i < 2; i++) {
        struct sockaddr_un *sa = &q->sa[q->n];
        int n;
        memset(sa, 0, sizeof(*sa));
        sa->sun_family = AF_UNIX;
        n = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1,
                     "dlock-semh/%llx/%llx/%s/%x",
                     (unsigned long long)st.st_dev,
                     (unsigned long long)st.st_ino, hex, i);
        q->len[q->n++] = (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
                                     1 + (size_t)n);
        sa = &q->sa[q->n];
        memset(sa, 0, sizeof(*sa));
        sa->sun_family = AF_UNIX;
        n = snprintf(sa->sun_path, sizeof(sa->sun_path), "%s/%s-%llx-s%x", w,
                     hex, (unsigned long long)st.st_ino, i);
        CHECK_OP(n, <, (int)sizeof(sa->sun_path));
        q->len[q->n++] = (socklen_t)sizeof(*sa);
    }
    pid_t sq = th_fork(sem_squat_child, q);
    th__track(sq, 1);
    CHECK(wait_for(&q->ready, 1, 10000));
    /* the store's directory kept nobody out of the socket files */
    CHECK_EQ(q->bound[1], -EACCES);
    CHECK_EQ(q->bound[3], -EACCES);

    CHECK_OK(dlock_acquire(h1, 0));
    int b1 = permit_held(name, 0);
    CHECK_OK(dlock_acquire(h2, 0));
    int b2 = permit_held(name, b1 == 0 ? 1 : 0);
    CHECK(b1 >= 0 && b2 >= 0 && b1 != b2);
    fjob j = {s, 0, name, 0, 30000, -1};
    pid_t wt = th_fork(sem_waiter, &j);
    th_wait_waiters(c1, name, 1);
    th_sleep_ms(200); /* asleep on the holders (else it only wakes later) */
    /* the holder of the lower byte first: the old code slept on the
     * higher one's byte alone when neither had a channel */
    dlock *first = b1 < b2 ? h1 : h2, *last = b1 < b2 ? h2 : h1;
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(first));
    for (int i = 0; i < 5000 && s->rc[0] == -99; i++)
        th_sleep_ms(1);
    CHECK_OK(dlock_release(last));
    CHECK_EQ(th_wait(wt), 0);
    CHECK_OK(s->rc[0]);
    CHECK_OP(s->t_acq[0] - t0, <, 2000); /* at once, not 5 s later */
    kill(sq, SIGKILL);
    th_wait(sq);
    th__track(sq, 0);
    TH_CLOSE(h1, h2);
    TH_CLIENT_CLOSE(c1, c2);
}

/* Holders of a semaphore's permits without wake-up channels (an older
 * dlock, one out of descriptors, one without /proc): the head waits for
 * each of their bytes in the kernel, so the first to let go wakes it,
 * not only the one it happened to wait for (the old code waited for the
 * highest). */
static int raw_permit_holder(const char *name, int i)
{
    char path[1000], fname[64];
    struct flock fl;
    int fd;

    snprintf(fname, sizeof(fname), "%.50s.lock", name);
    path_of(fname, path, sizeof(path));
    fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = ((off_t)1 << 16) + i;
    fl.l_len = 1;
    CHECK_EQ(fcntl(fd, F_OFD_SETLK, &fl), 0);
    return fd;
}

static void raw_unlock(int fd)
{
    struct flock fl;

    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_UNLCK;
    fl.l_whence = SEEK_SET;
    CHECK_EQ(fcntl(fd, F_OFD_SETLK, &fl), 0);
    close(fd);
}

TEST(holders_without_channels_wake_the_head)
{
    const char *name = "fnochan";
    dlock_client *c = client();
    dlock_options o;
    dlock *l;
    fstate *s = fstate_new();

    memset(&o, 0, sizeof(o));
    o.permits = 2;
    CHECK_OK(dlock_open(&l, c, name, &o));
    CHECK_OK(dlock_acquire(l, 0)); /* N and the salt in the file */
    CHECK_OK(dlock_release(l));
    int h0 = raw_permit_holder(name, 0), h1 = raw_permit_holder(name, 1);
    fjob j = {s, 0, name, 0, 30000, -1};
    pid_t wt = th_fork(sem_waiter, &j);
    th_wait_waiters(c, name, 1);
    th_sleep_ms(200); /* asleep on the holders (else it only wakes later) */
    /* unlocked, not only closed: the waiter inherited the descriptors */
    int64_t t0 = th_now_ms();
    raw_unlock(h0);
    for (int i = 0; i < 5000 && s->rc[0] == -99; i++)
        th_sleep_ms(1);
    raw_unlock(h1);
    CHECK_EQ(th_wait(wt), 0);
    CHECK_OK(s->rc[0]);
    CHECK_OP(s->t_acq[0] - t0, <, 2000); /* at once, not 5 s later */
    dlock_close(l);
    dlock_client_close(c);
}

/* A permit holder killed while holding leaves its channel's socket file;
 * the next holder of that permit replaces it (nobody answers on it), the
 * head sleeps on the new channel, and once everything is released the
 * directory is empty again. */
static int stale_holder(void *arg)
{
    fstate *s = arg;
    dlock_client *c;
    dlock_options o;
    dlock *l;

    memset(&o, 0, sizeof(o));
    o.permits = 2;
    if (dlock_client_open(&c, uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "fstale", &o) != DLOCK_OK ||
        dlock_acquire(l, 0) != DLOCK_OK)
        return 2;
    s->held[0] = 1;
    pause(); /* until killed */
    return 0;
}

TEST(stale_channel_file_is_replaced)
{
    fstate *s = fstate_new();
    char w[PATH_MAX + 8192];
    dlock_client *c1 = client(), *c2 = client();
    dlock_options o;
    dlock *h1, *h2;

    wake_dir_of(dir, w, sizeof(w));
    int before = count_in(w);
    pid_t a = th_fork(stale_holder, s);
    CHECK(wait_for(&s->held[0], 1, 10000));
    CHECK_EQ(count_in(w), before + 1);
    kill(a, SIGKILL);
    th_wait(a);
    CHECK_EQ(count_in(w), before + 1); /* left behind */
    memset(&o, 0, sizeof(o));
    o.permits = 2;
    CHECK_OK(dlock_open(&h1, c1, "fstale", &o));
    CHECK_OK(dlock_open(&h2, c2, "fstale", &o));
    CHECK_OK(dlock_acquire(h1, 0));
    CHECK_OK(dlock_acquire(h2, 0));
    CHECK_EQ(count_in(w), before + 2); /* ours, one in the dead one's place */
    fjob j = {s, 1, "fstale", 0, 30000, -1};
    pid_t wt = th_fork(sem_waiter, &j);
    th_wait_waiters(c1, "fstale", 1);
    th_sleep_ms(100);
    CHECK_EQ(threads_of(wt), 2); /* on the holders' channels */
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(h1));
    CHECK_EQ(th_wait(wt), 0);
    CHECK_OK(s->rc[1]);
    CHECK_OP(s->t_acq[1] - t0, <, 2000); /* at once */
    CHECK_OK(dlock_release(h2));
    CHECK_EQ(count_in(w), before);
    TH_CLOSE(h1, h2);
    TH_CLIENT_CLOSE(c1, c2);
}

/* --- forks --------------------------------------------------------------- */

TEST(release_wakes_the_successor_despite_a_forked_child)
{
    fstate *s = fstate_new();
    dlock_client *c = client();
    dlock *l = th_handle(c, "ffork", 0, DLOCK_FAIR, 0);

    /* the holder forks a child that keeps its open file and channel for
     * 3 s; its release must not wait for that child */
    s->fork_ms[0] = 3000;
    CHECK_OK(dlock_acquire(l, 0));
    pid_t h = fstart(s, 0, "ffork", DLOCK_FAIR, 30000, -1);
    th_wait_waiters(c, "ffork", 1);
    CHECK_OK(dlock_release(l));
    CHECK(wait_for(&s->held[0], 1, 10000));
    pid_t w = fstart(s, 1, "ffork", DLOCK_FAIR, 30000, 1);
    th_wait_waiters(c, "ffork", 1);
    int64_t t0 = th_now_ms();
    s->release[0] = 1;
    CHECK_EQ(th_wait(h), 0);
    CHECK_EQ(th_wait(w), 0);
    CHECK_OK(s->rc[1]);
    CHECK_OP(s->t_acq[1] - t0, <, 2000); /* at once */
    dlock_close(l);
    dlock_client_close(c);
}

TEST(dead_holder_with_a_forked_child_keeps_the_lock)
{
    fstate *s = fstate_new();
    dlock_client *c = client();
    dlock *l = th_handle(c, "fforkdie", 0, DLOCK_FAIR, 0);

    /* as before the channels: the lock lives as long as a child forked
     * while it was held keeps the open file (file.c, "Forks") */
    s->fork_ms[0] = 1000;
    s->killed[0] = 1;
    CHECK_OK(dlock_acquire(l, 0));
    pid_t h = fstart(s, 0, "fforkdie", DLOCK_FAIR, 30000, -1);
    th_wait_waiters(c, "fforkdie", 1);
    CHECK_OK(dlock_release(l));
    CHECK(wait_for(&s->held[0], 1, 10000));
    pid_t w = fstart(s, 1, "fforkdie", DLOCK_FAIR, 30000, 1);
    th_wait_waiters(c, "fforkdie", 1);
    kill(h, SIGKILL);
    CHECK_EQ(th_wait(h), 128 + SIGKILL);
    CHECK_EQ(th_wait(w), 0);
    CHECK_OK(s->rc[1]);
    /* lower bound: the child lives 1 s from its fork, which came after
     * t_fork (read by the holder itself: this process's view of the fork
     * could be late on a busy machine; 10 ms for the whole-ms rounding);
     * upper bound: its exit frees the lock in the kernel and wakes the
     * successor at once, 2 s of scheduling slack */
    int64_t forked = s->t_fork[0];
    CHECK_OP(forked, >, 0);
    CHECK_OP(s->t_acq[1] - forked, >=, 990);  /* the child's life */
    CHECK_OP(s->t_acq[1] - forked, <, 1000 + 2000);
    dlock_close(l);
    dlock_client_close(c);
}

TEST(give_up_wakes_the_successor_despite_a_forked_child)
{
    fstate *s = fstate_new();
    dlock_client *c = client();
    dlock *l = th_handle(c, "fforkgive", 0, DLOCK_FAIR, 0);

    /* w queues behind h; h forks (its successor's connection, accepted
     * ahead, goes to the child too), then gives up: w must move on at
     * once, not when the child exits */
    s->fork_waiting_ms[0] = 150;
    CHECK_OK(dlock_acquire(l, 0));
    pid_t w = gated_start(s, 1, "fforkgive", DLOCK_FAIR, 30000, 1);
    pid_t h = fstart(s, 0, "fforkgive", DLOCK_FAIR, 400, 1);
    th_wait_waiters(c, "fforkgive", 1);
    gated_go(s, 1); /* queues well within h's 150 ms before its fork */
    th_wait_waiters(c, "fforkgive", 2);
    CHECK_EQ(th_wait(h), 0);
    CHECK_RC(s->rc[0], DLOCK_EBUSY);
    th_wait_waiters(c, "fforkgive", 1); /* w only */
    th_sleep_ms(50);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_release(l));
    CHECK_EQ(th_wait(w), 0);
    CHECK_OK(s->rc[1]);
    CHECK_OP(s->t_acq[1] - t0, <, 2000); /* at once */
    dlock_close(l);
    dlock_client_close(c);
}

/* --- many waiters: a release wakes one ---------------------------------- */

static long switches_of(pid_t pid)
{
    char path[64], line[256];
    long n = -1;
    FILE *f;

    /* the main thread only (its tid is the pid) */
    snprintf(path, sizeof(path), "/proc/%d/task/%d/status", (int)pid,
             (int)pid);
    f = fopen(path, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "voluntary_ctxt_switches: %ld", &n) == 1)
            break;
    fclose(f);
    return n;
}

TEST(a_release_wakes_only_the_next)
{
    fstate *s = fstate_new();
    dlock_client *c = client();
    dlock *l = th_handle(c, "fmany", 0, DLOCK_FAIR, 0);
    const int n = 10;
    pid_t pids[NW];

    CHECK_OK(dlock_acquire(l, 0));
    for (int i = 0; i < n; i++) {
        pids[i] = fstart(s, i, "fmany", DLOCK_FAIR, 30000, -1);
        th_wait_waiters(c, "fmany", i + 1);
    }
    /* the last waiter is asleep once its count stops moving (20 ms
     * sufficed on an idle machine; a busy one may still be running it
     * into its poll(), and those switches are not wake-ups) */
    long before = switches_of(pids[n - 1]);
    for (int k = 0; k < 100; k++) {
        th_sleep_ms(50);
        long now = switches_of(pids[n - 1]);
        if (now == before)
            break;
        before = now;
    }
    CHECK_OP(before, >=, 0);
    CHECK_OK(dlock_release(l));
    /* five hand-offs at the head of the queue */
    for (int i = 0; i < 5; i++) {
        CHECK(wait_for(&s->held[i], 1, 10000));
        s->release[i] = 1;
        CHECK_EQ(th_wait(pids[i]), 0);
    }
    /* the last waiter slept through them (its thread was never woken:
     * a few switches of slack for the machine's own noise) */
    CHECK_OP(switches_of(pids[n - 1]) - before, <=, 2);
    for (int i = 5; i < n; i++) {
        CHECK(wait_for(&s->held[i], 1, 10000));
        s->release[i] = 1;
        CHECK_EQ(th_wait(pids[i]), 0);
    }
    for (int i = 0; i < n; i++)
        CHECK_EQ(s->order[i], i);
    CHECK_EQ(s->overlaps, 0);
    dlock_close(l);
    dlock_client_close(c);
}

/* Tests in which only child processes wait (the test's own threads never
 * block in F_OFD_SETLKW) run under valgrind too: a child blocked there
 * stalls only itself. TK: the test process itself waits in the kernel with
 * a deadline (harness/test.h). */
static const th_test tests[] = {
    T(default_store_is_in_the_home_of_the_passwd_entry),
    T(default_store_ignores_the_old_locations),
    T(default_store_refusals_in_the_home),
    T(default_store_of_other_users),
    T(bad_file_uris),
    T(private_directory_is_made_and_closed),
    T(private_directory_walk_refusals),
    T(private_directory_on_a_network_file_system_is_refused),
    T(symlinked_lock_file_is_refused),
    T(foreign_file_is_refused),
    T(ttl_has_no_effect_here),
    TK(replaced_file_is_detected),
    TK(cancelled_waits_leave_nothing_behind),
    T(long_names_fit_a_file_name),
    T(fair_fifo_across_processes_with_deadlines),
    T(killed_fair_holder_hands_over_at_once),
    T(killed_fair_waiter_does_not_block_the_queue),
    T(deadline_meets_the_hand_over),
    TK(timed_waits_leave_nothing_behind),
    T(fair_and_default_acquirers_mixed),
    T(mixed_modes_never_overlap),
    T(refused_channel_ends_in_the_kernel),
    T(foreign_listener_on_a_channel_name),
    T(squatted_ticket_number_is_skipped),
    T(predecessor_in_another_network_namespace),
    T(foreign_connection_to_a_channel),
    T(lock_files_are_closed_to_other_users),
    T(group_store_is_shared_with_its_group_only),
    TK(foreign_read_locks_bound_every_wait),
    TK(foreign_read_lock_on_a_ticket_does_not_spin),
    T(squatters_cannot_slow_a_semaphore_wait),
    TK(holders_without_channels_wake_the_head),
    T(stale_channel_file_is_replaced),
    T(release_wakes_the_successor_despite_a_forked_child),
    T(dead_holder_with_a_forked_child_keeps_the_lock),
    TK(give_up_wakes_the_successor_despite_a_forked_child),
    T(a_release_wakes_only_the_next),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    snprintf(dir, sizeof(dir), "%s/locks", th_tmpdir());
    snprintf(uri, sizeof(uri), "file://%s", dir);
    return th_main(argc, argv, tests);
}
