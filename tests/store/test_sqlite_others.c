/* SPDX-License-Identifier: MIT */
/*
 * test_sqlite_others.c -- the SQLite store beside other users and other
 * processes, on real database files: what dlock makes gives another user
 * nothing (a database made in a 1777 directory under umask 022), a wider
 * sidecar of ours is tightened and another user's refused, ?group=
 * shares with a group's members only, wake-up names another user binds
 * do not slow a waiter, and locks that a process outside dlock holds on
 * the sidecar or the database keep no wait past its deadline, no try past
 * a moment, and no wait past dlock_cancel(). The other user is `nobody`
 * (a forked child that drops root's ids, as runuser does); those cases
 * are skipped when the test does not run as root.
 */
#include "test.h"

#include <sqlite3.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <ftw.h>
#include <grp.h>
#include <pthread.h>
#include <pwd.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static int slow(void)
{
    return getenv("DLOCK_UNDER_VALGRIND") != NULL;
}

/* A busy machine's scheduling (CI runs the suite under stress-ng on two
 * cores): what a deadline may be overrun by, at most (a helper thread
 * woken, joined, the caller's thread run again). */
static int64_t slack_ms(void)
{
    return slow() ? 4000 : 1000;
}

static int as_root(void)
{
    if (geteuid() == 0)
        return 1;
    fprintf(stderr, "  (skipped: another user's case needs root)\n");
    return 0;
}

/* The calling (forked) process becomes `nobody`: 0, or -1. */
static int become_nobody(void)
{
    struct passwd *pw = getpwnam("nobody");

    if (!pw || setgroups(0, NULL) != 0 || setgid(pw->pw_gid) != 0 ||
        setuid(pw->pw_uid) != 0)
        return -1;
    return 0;
}

static int rm_one(const char *p, const struct stat *st, int flag,
                  struct FTW *f)
{
    (void)st;
    (void)flag;
    (void)f;
    remove(p);
    return 0;
}

static void rm_tree(const char *dir)
{
    nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* the directories made below, removed at exit too (a failed check exits
 * before its test's rm_tree()) */
static char made[8][64];
static int nmade;
static pid_t made_by;

static void rm_made(void)
{
    for (int i = 0; i < nmade && getpid() == made_by; i++)
        rm_tree(made[i]);
}

/* A fresh directory under /tmp, mode 1777 (as /tmp itself: another user
 * can reach it), for the other-user cases; removed by rm_tree(). */
static void sticky_dir(char *dir, size_t cap)
{
    snprintf(dir, cap, "/tmp/dlock-sq1777-XXXXXX");
    if (!mkdtemp(dir))
        th_fail(__FILE__, __LINE__, "mkdtemp: %s", strerror(errno));
    CHECK_EQ(chmod(dir, 01777), 0);
    if (nmade == 0) {
        made_by = getpid(); /* not a forked child's exit (a failed check) */
        atexit(rm_made);
    }
    if (nmade < 8)
        snprintf(made[nmade++], sizeof(made[0]), "%s", dir);
}

static unsigned mode_of(const char *path)
{
    struct stat st;

    if (lstat(path, &st) != 0)
        th_fail(__FILE__, __LINE__, "%s: %s", path, strerror(errno));
    return (unsigned)(st.st_mode & 07777);
}

static dlock *handle(dlock_client *c, const char *name, int64_t ttl)
{
    return th_handle(c, name, ttl, 0, 0);
}

/* --- what dlock makes ---------------------------------------------------- */

typedef struct nobody_try {
    char db[600], side[620], dir[620], uri[700];
    int refused; /* bit per file nobody could not open, 16: no client */
} nobody_try;

static int nobody_opens(void *arg)
{
    nobody_try *t = arg;
    dlock_client *c = NULL;

    if (become_nobody() != 0)
        return 3;
    if (open(t->side, O_RDONLY | O_CLOEXEC) < 0 && errno == EACCES)
        t->refused |= 1;
    if (open(t->db, O_RDONLY | O_CLOEXEC) < 0 && errno == EACCES)
        t->refused |= 2;
    if (open(t->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) < 0 &&
        errno == EACCES)
        t->refused |= 4;
    if (dlock_client_open(&c, t->uri, NULL) != DLOCK_OK)
        t->refused |= 16;
    else
        dlock_client_close(c);
    return 0;
}

/* A store made in a directory every user can write (1777, as /tmp),
 * under the usual umask 022: its database, the sidecar and the channels'
 * directory give another user nothing to open (a read-only open of the
 * sidecar was enough to jam every waiter: it used to be 0644). */
TEST(a_store_made_in_a_1777_directory_is_closed_to_other_users)
{
    if (!as_root())
        return;
    nobody_try *t = th_shared(sizeof(*t));
    char dir[64], path[700];
    mode_t old = umask(022);

    sticky_dir(dir, sizeof(dir));
    snprintf(t->db, sizeof(t->db), "%s/locks.db", dir);
    snprintf(t->side, sizeof(t->side), "%s-dlock", t->db);
    snprintf(t->dir, sizeof(t->dir), "%s-dlock.d", t->db);
    snprintf(t->uri, sizeof(t->uri), "sqlite://%s", t->db);
    dlock_client *c = NULL;
    CHECK_OK(dlock_client_open(&c, t->uri, NULL));
    dlock *l = handle(c, "closed", 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    CHECK_EQ(mode_of(t->db), 0600u);
    CHECK_EQ(mode_of(t->side), 0600u);
    CHECK_EQ(mode_of(t->dir), 0700u);
    snprintf(path, sizeof(path), "%s-wal", t->db);
    CHECK_EQ(mode_of(path), 0600u); /* SQLite gives them the database's */
    snprintf(path, sizeof(path), "%s-shm", t->db);
    CHECK_EQ(mode_of(path), 0600u);
    CHECK_EQ(th_wait(th_fork(nobody_opens, t)), 0);
    CHECK_EQ(t->refused, 1 | 2 | 4 | 16);
    dlock_close(l);
    dlock_client_close(c);
    umask(old);
    rm_tree(dir);
}

/* A sidecar an older dlock made with the database's mode (0644) is ours:
 * tightened to 0600 at the open. One that another user owns is refused
 * (its owner could hold this store's waiters up), naming its owner. */
TEST(a_wider_sidecar_is_tightened_and_another_users_refused)
{
    char dir[64], db[128], side[160], u[200];
    dlock_client *c = NULL;
    int fd;

    sticky_dir(dir, sizeof(dir));
    snprintf(db, sizeof(db), "%s/old.db", dir);
    snprintf(side, sizeof(side), "%s-dlock", db);
    snprintf(u, sizeof(u), "sqlite://%s", db);
    fd = open(side, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    CHECK(fd >= 0);
    CHECK_EQ(fchmod(fd, 0644), 0);
    close(fd);
    CHECK_OK(dlock_client_open(&c, u, NULL));
    CHECK_EQ(mode_of(side), 0600u);
    dlock_client_close(c);
    c = NULL;
    if (as_root()) {
        struct passwd *pw = getpwnam("nobody");
        CHECK(pw != NULL);
        CHECK_EQ(chown(side, pw->pw_uid, pw->pw_gid), 0);
        CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_EAUTH);
        CHECK(c == NULL);
        CHECK_CONTAINS(dlock_errmsg(), "belongs to uid");
        CHECK_CONTAINS(dlock_errmsg(), "?group=");
        CHECK_EQ(mode_of(side), 0600u); /* not ours: untouched */
    }
    rm_tree(dir);
}

/* A group none of our ids is in, or -1. */
static gid_t foreign_group(char *name, size_t cap)
{
    gid_t mine[256];
    int n = getgroups(256, mine);
    struct group *g;
    gid_t found = (gid_t)-1;

    setgrent();
    while (found == (gid_t)-1 && (g = getgrent()) != NULL) {
        int member = g->gr_gid == getegid() || g->gr_gid == getgid();
        for (int i = 0; i < n && !member; i++)
            member = mine[i] == g->gr_gid;
        if (!member) {
            snprintf(name, cap, "%s", g->gr_name);
            found = g->gr_gid;
        }
    }
    endgrent();
    return found;
}

/* ?group=NAME: the files are 0660 and the directory 03770, of that group;
 * a group that does not exist, or one the process is not a member of, is
 * DLOCK_EINVAL with a message. */
TEST(group_shares_with_members_of_the_group_only)
{
    char dir[64], db[128], path[200], u[300], other[128];
    struct group *g = getgrgid(getegid());
    dlock_client *c = NULL;
    struct stat st;

    CHECK(g != NULL);
    sticky_dir(dir, sizeof(dir));
    snprintf(db, sizeof(db), "%s/grp.db", dir);
    snprintf(u, sizeof(u), "sqlite://%s?group=%s", db, g->gr_name);
    CHECK_OK(dlock_client_open(&c, u, NULL));
    dlock *l = handle(c, "grp", 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
    CHECK_EQ(mode_of(db), 0660u);
    snprintf(path, sizeof(path), "%s-dlock", db);
    CHECK_EQ(mode_of(path), 0660u);
    CHECK_EQ(stat(path, &st), 0);
    CHECK_EQ(st.st_gid, getegid());
    snprintf(path, sizeof(path), "%s-dlock.d", db);
    CHECK_EQ(mode_of(path), 03770u);

    c = NULL;
    snprintf(u, sizeof(u), "sqlite://%s?group=no-such-group-dlock", db);
    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "no group");
    if (foreign_group(other, sizeof(other)) != (gid_t)-1) {
        snprintf(u, sizeof(u), "sqlite://%s?group=%s", db, other);
        CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_EINVAL);
        CHECK_CONTAINS(dlock_errmsg(), "not a member");
    }
    CHECK(c == NULL);
    rm_tree(dir);
}

typedef struct pair {
    char uri[700];
    gid_t gid;
    volatile int holding, release, queued_wait;
    int rc;
    int64_t released, ended;
    char msg[300];
} pair;

/* Loads the sqlite module here, as root: the users the tests fork may not
 * read the build tree (a checkout under /root, 0700), and a forked
 * child's dlopen() of a module already mapped (RTLD_NODELETE) finds it
 * without reading the file. */
static void load_the_module(void)
{
    char d[64], u[200];
    dlock_client *c = NULL;

    sticky_dir(d, sizeof(d));
    snprintf(u, sizeof(u), "sqlite://%s/preload.db", d);
    CHECK_OK(dlock_client_open(&c, u, NULL));
    dlock_client_close(c);
    rm_tree(d);
}

/* The calling (forked) process becomes user `name` with group gid as its
 * only supplementary group: 0, or -1. */
static int become(const char *name, gid_t gid)
{
    struct passwd *pw = getpwnam(name);

    if (!pw || setgroups(1, &gid) != 0 || setgid(pw->pw_gid) != 0 ||
        setuid(pw->pw_uid) != 0)
        return -1;
    return 0;
}

static int group_holder(void *arg)
{
    pair *p = arg;
    dlock_client *c = NULL;

    if (become("daemon", p->gid) != 0) {
        snprintf(p->msg, sizeof(p->msg), "cannot become daemon: %s",
                 strerror(errno));
        return 2;
    }
    if (dlock_client_open(&c, p->uri, NULL) != DLOCK_OK) {
        snprintf(p->msg, sizeof(p->msg), "daemon's open: %s",
                 dlock_errmsg());
        return 2;
    }
    dlock *l = handle(c, "g", 10000);
    if (dlock_acquire(l, 0) != DLOCK_OK) {
        snprintf(p->msg, sizeof(p->msg), "daemon's acquire: %s",
                 dlock_errmsg());
        return 3;
    }
    p->holding = 1;
    for (int i = 0; i < 4000 && !p->release; i++)
        th_sleep_ms(5);
    p->released = th_now_ms();
    int rc = dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
    return rc == DLOCK_OK ? 0 : 4;
}

static int group_waiter(void *arg)
{
    pair *p = arg;
    dlock_client *c = NULL;

    if (become("nobody", p->gid) != 0)
        return 2;
    p->rc = dlock_client_open(&c, p->uri, NULL);
    if (p->rc != DLOCK_OK) {
        snprintf(p->msg, sizeof(p->msg), "%s", dlock_errmsg());
        return 3;
    }
    dlock *l = handle(c, "g", 10000);
    p->queued_wait = 1;
    p->rc = dlock_acquire(l, 8000);
    p->ended = th_now_ms();
    snprintf(p->msg, sizeof(p->msg), "%s", dlock_errmsg());
    if (p->rc == DLOCK_OK)
        (void)dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

/* Two unprivileged users of one group (daemon and nobody, both given
 * nogroup) share a ?group= store in a setgid directory of that group, as
 * docs/stores.md says to set one up: the second opens what the first
 * made, and the first's release wakes the second at once (its doorbell
 * is a socket file of the group's), not at the lease end 10 s later. */
TEST(a_group_store_is_shared_by_two_users_of_the_group)
{
    if (!as_root())
        return;
    struct group *g = getgrnam("nogroup");
    if (!g || !getpwnam("daemon") || !getpwnam("nobody")) {
        fprintf(stderr, "  (skipped: no daemon, nobody or nogroup)\n");
        return;
    }
    pair *p = th_shared(sizeof(*p));
    char dir[64], path[200];
    struct stat st;

    load_the_module();
    sticky_dir(dir, sizeof(dir));
    CHECK_EQ(chown(dir, 0, g->gr_gid), 0);
    CHECK_EQ(chmod(dir, 02770), 0);
    p->gid = g->gr_gid;
    snprintf(p->uri, sizeof(p->uri), "sqlite://%s/shared.db?group=nogroup",
             dir);
    pid_t hp = th_fork(group_holder, p);
    if (!th_wait_flag(&p->holding, 10000))
        th_fail(__FILE__, __LINE__, "the group's first user never held: %s",
                p->msg[0] ? p->msg : "(no word from it)");
    pid_t wp = th_fork(group_waiter, p);
    CHECK(th_wait_flag(&p->queued_wait, 10000));
    th_sleep_ms(300); /* queued: it has no other way to be woken soon */
    p->release = 1;
    CHECK_EQ(th_wait(hp), 0);
    int ws = th_wait(wp);
    if (ws != 0 || p->rc != DLOCK_OK)
        th_fail(__FILE__, __LINE__, "the group's second user: exit %d, %s: "
                                    "%s",
                ws, dlock_errname(p->rc), p->msg);
    fprintf(stderr, "  woken %lld ms after the release\n",
            (long long)(p->ended - p->released));
    CHECK_OP(p->ended - p->released, <, slack_ms() + 1000);
    snprintf(path, sizeof(path), "%s/shared.db-dlock", dir);
    CHECK_EQ(stat(path, &st), 0);
    CHECK_EQ(st.st_gid, g->gr_gid);
    CHECK_EQ(mode_of(path), 0660u);
    snprintf(path, sizeof(path), "%s/shared.db-dlock.d", dir);
    CHECK_EQ(mode_of(path), 03770u);
    rm_tree(dir);
}

/* --- wake-up names ------------------------------------------------------- */

typedef struct squat {
    char chans[620];
    unsigned long long dev, ino, rowid;
    volatile int ready, done;
    int bound_paths; /* names bound in the channels' directory */
    int bound_abstract;
} squat;

static int squatter(void *arg)
{
    squat *s = arg;
    int fds[256], n = 0;

    if (become_nobody() != 0)
        return 3;
    for (int t = 1; t <= 32; t++) {
        for (int k = 0; k < 4; k++) {
            struct sockaddr_un sa;
            socklen_t len;
            int fd = socket(AF_UNIX, k & 1 ? SOCK_DGRAM : SOCK_STREAM, 0);
            memset(&sa, 0, sizeof(sa));
            sa.sun_family = AF_UNIX;
            if (k < 2) {
                /* the names an older dlock used (abstract: no
                 * permissions) */
                int m = snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1,
                                 "dlock-sq%s/%llx/%llx/%llx/%llx",
                                 k ? "b" : "", s->dev, s->ino, s->rowid,
                                 (unsigned long long)t);
                len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
                                  1 + (size_t)m);
            } else {
                /* the channels' directory's */
                int m = snprintf(sa.sun_path, sizeof(sa.sun_path),
                                 "%s/%llx.%llx.%x%s", s->chans, s->ino,
                                 s->rowid, t, k & 1 ? ".r" : "");
                len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) +
                                  (size_t)m + 1);
            }
            if (fd < 0 || n >= 256)
                continue;
            if (bind(fd, (struct sockaddr *)&sa, len) == 0 &&
                (k & 1 || listen(fd, 4) == 0)) {
                fds[n++] = fd;
                if (k < 2)
                    s->bound_abstract++;
                else
                    s->bound_paths++;
            } else {
                close(fd);
            }
        }
    }
    s->ready = 1;
    for (int i = 0; i < 6000 && !s->done; i++)
        th_sleep_ms(5);
    for (int i = 0; i < n; i++)
        close(fds[i]);
    return 0;
}

typedef struct timed {
    dlock *l;
    int64_t wait;
    int rc;
    int64_t start, ended;
    volatile int done;
} timed;

static void *timed_acquire(void *arg)
{
    timed *t = arg;

    t->start = th_now_ms();
    t->rc = dlock_acquire(t->l, t->wait);
    t->ended = th_now_ms();
    if (t->rc == DLOCK_OK)
        (void)dlock_release(t->l);
    __atomic_store_n(&t->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

/* Another user binds every wake-up name it can for the next 32 tickets
 * of a lock (the abstract names an older dlock used, which anyone could
 * read in /proc/net/unix, and the channels' directory's): the waiter is
 * still woken by the release, not by the holder's lease end 10 s later
 * (before, a waiter without a doorbell slept to it). */
TEST(squatting_wake_up_names_as_another_user_does_not_slow_a_waiter)
{
    if (!as_root())
        return;
    squat *s = th_shared(sizeof(*s));
    char dir[64], db[128], u[200], side[160];
    dlock_client *c = NULL, *w = NULL;
    struct stat st;
    timed t;
    pthread_t th;

    sticky_dir(dir, sizeof(dir));
    snprintf(db, sizeof(db), "%s/sq.db", dir);
    snprintf(side, sizeof(side), "%s-dlock", db);
    snprintf(s->chans, sizeof(s->chans), "%s-dlock.d", db);
    snprintf(u, sizeof(u), "sqlite://%s", db);
    CHECK_OK(dlock_client_open(&c, u, NULL));
    CHECK_OK(dlock_client_open(&w, u, NULL));
    dlock *lh = handle(c, "squat", 10000), *lw = handle(w, "squat", 10000);
    CHECK_OK(dlock_acquire(lh, 0)); /* nobody queued: no ticket */
    CHECK_EQ(stat(side, &st), 0);
    s->dev = (unsigned long long)st.st_dev;
    s->ino = (unsigned long long)st.st_ino;
    s->rowid = 1; /* the database's first row */
    pid_t pid = th_fork(squatter, s);
    CHECK(th_wait_flag(&s->ready, 10000));
    CHECK_EQ(s->bound_paths, 0);
    CHECK_OP(s->bound_abstract, >, 0); /* the squat was real */

    memset(&t, 0, sizeof(t));
    t.l = lw;
    t.wait = 8000;
    CHECK_EQ(pthread_create(&th, NULL, timed_acquire, &t), 0);
    /* queued (bounded), then the release */
    for (int i = 0; i < 2000; i++) {
        dlock_info in;
        memset(&in, 0, sizeof(in));
        CHECK_OK(dlock_inspect(c, "squat", &in));
        int64_t n = in.waiters;
        dlock_info_clear(&in);
        if (n >= 1)
            break;
        th_sleep_ms(5);
    }
    th_sleep_ms(100); /* at its doorbell */
    int64_t released = th_now_ms();
    CHECK_OK(dlock_release(lh));
    pthread_join(th, NULL);
    CHECK_OK(t.rc);
    /* woken by the release: the lease end is 9.9 s away */
    fprintf(stderr, "  woken %lld ms after the release\n",
            (long long)(t.ended - released));
    CHECK_OP(t.ended - released, <, slack_ms() + 1000);
    s->done = 1;
    CHECK_EQ(th_wait(pid), 0);
    TH_CLOSE(lh, lw);
    TH_CLIENT_CLOSE(c, w);
    rm_tree(dir);
}

typedef struct crashing {
    char uri[700];
} crashing;

static int crashing_waiter(void *arg)
{
    crashing *cr = arg;
    dlock_client *c = NULL;
    dlock *l;

    if (dlock_client_open(&c, cr->uri, NULL) != DLOCK_OK)
        return 2;
    l = handle(c, "stale", 10000);
    (void)dlock_acquire(l, 30000); /* killed in the queue */
    return 3;
}

static int entries_of(const char *dir)
{
    int n = 0;
    struct dirent *e;
    DIR *d = opendir(dir);

    if (!d)
        th_fail(__FILE__, __LINE__, "%s: %s", dir, strerror(errno));
    while ((e = readdir(d)) != NULL)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* A waiter killed in the queue leaves its socket files behind (the kernel
 * only drops its ticket); the next owner of its ticket number removes
 * them and makes its own, which wake it at the release (not 10 s later,
 * at the lease end), and nothing is left once every waiter is gone. */
TEST(a_crashed_waiters_socket_files_are_replaced)
{
    crashing *cr = th_shared(sizeof(*cr));
    char db[600], chans[620];
    dlock_client *h = NULL, *w = NULL;
    timed t;
    pthread_t th;

    snprintf(db, sizeof(db), "%s/stale.db", th_tmpdir());
    snprintf(chans, sizeof(chans), "%s-dlock.d", db);
    snprintf(cr->uri, sizeof(cr->uri), "sqlite://%s", db);
    CHECK_OK(dlock_client_open(&h, cr->uri, NULL));
    CHECK_OK(dlock_client_open(&w, cr->uri, NULL));
    dlock *lh = handle(h, "stale", 10000), *lw = handle(w, "stale", 10000);
    CHECK_OK(dlock_acquire(lh, 0));
    pid_t pid = th_fork(crashing_waiter, cr);
    for (int i = 0; i < 4000 && entries_of(chans) < 2; i++)
        th_sleep_ms(5);
    CHECK_EQ(entries_of(chans), 2); /* its channel and doorbell */
    th_sleep_ms(50);
    kill(pid, SIGKILL);
    CHECK_EQ(th_wait(pid), 128 + SIGKILL);
    CHECK_EQ(entries_of(chans), 2); /* left behind */

    memset(&t, 0, sizeof(t));
    t.l = lw;
    t.wait = 8000;
    CHECK_EQ(pthread_create(&th, NULL, timed_acquire, &t), 0);
    for (int i = 0; i < 4000; i++) {
        dlock_info in;
        memset(&in, 0, sizeof(in));
        CHECK_OK(dlock_inspect(h, "stale", &in));
        int64_t n = in.waiters;
        dlock_info_clear(&in);
        if (n >= 1)
            break;
        th_sleep_ms(5);
    }
    th_sleep_ms(100);
    CHECK_EQ(entries_of(chans), 2); /* the same number's: replaced */
    int64_t released = th_now_ms();
    CHECK_OK(dlock_release(lh));
    pthread_join(th, NULL);
    CHECK_OK(t.rc);
    CHECK_OP(t.ended - released, <, slack_ms() + 1000);
    CHECK_EQ(entries_of(chans), 0);
    TH_CLOSE(lh, lw);
    TH_CLIENT_CLOSE(h, w);
}

/* --- locks a process outside dlock holds ----------------------------------- */

enum { JAM_FILE, JAM_DB };

typedef struct jam {
    char path[700];
    int how;
    long long start, len; /* JAM_FILE: the read lock's bytes (len 0: to the
                           * end of every offset) */
    volatile int ready, done;
} jam;

/* A process of ours, outside dlock: read locks on the sidecar's bytes
 * (an open for reading is enough), or SQLite's write lock on the
 * database (BEGIN EXCLUSIVE), until told to stop. */
static int jammer(void *arg)
{
    jam *j = arg;
    sqlite3 *db = NULL;
    int fd = -1;

    if (j->how == JAM_FILE) {
        struct flock fl;
        fd = open(j->path, O_RDONLY | O_CLOEXEC);
        memset(&fl, 0, sizeof(fl));
        fl.l_type = F_RDLCK;
        fl.l_whence = SEEK_SET;
        fl.l_start = (off_t)j->start;
        fl.l_len = (off_t)j->len;
        if (fd < 0 || fcntl(fd, F_OFD_SETLK, &fl) != 0)
            return 2;
    } else {
        if (sqlite3_open(j->path, &db) != SQLITE_OK ||
            sqlite3_exec(db, "BEGIN EXCLUSIVE", NULL, NULL, NULL) !=
                SQLITE_OK)
            return 2;
    }
    j->ready = 1;
    for (int i = 0; i < 12000 && !j->done; i++)
        th_sleep_ms(5);
    if (db) {
        sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
        sqlite3_close(db);
    }
    if (fd >= 0)
        close(fd);
    return 0;
}

/* Runs dlock_acquire(l, wait) on a thread, and fails unless it returns
 * within `limit` ms (before, some never did: F_OFD_SETLKW without a
 * deadline). */
static void run_timed(timed *t, dlock *l, int64_t wait, int64_t limit)
{
    pthread_t th;

    memset(t, 0, sizeof(*t));
    t->l = l;
    t->wait = wait;
    CHECK_EQ(pthread_create(&th, NULL, timed_acquire, t), 0);
    if (!th_wait_flag(&t->done, limit))
        th_fail(__FILE__, __LINE__, "dlock_acquire(%lld ms) still waits "
                                    "after %lld ms",
                (long long)wait, (long long)limit);
    pthread_join(th, NULL);
}

/* With each of these held by a process of ours outside dlock, while a
 * holder keeps the lock (so that a waiter must wait): a wait of 500 ms
 * returns DLOCK_EBUSY at its deadline, a try within its moment, and a
 * wait forever when cancelled. The cases: a read lock over every byte of
 * the sidecar; over the writers' turn (byte 1); over the lock's region
 * (its byte 0, where tickets are taken); SQLite's write lock on the
 * database. dlock_inspect() (dlock status) names the sidecar's as held
 * outside dlock, and counts none of them as waiters. Before, the first three blocked in F_OFD_SETLKW with no
 * deadline or cancel (the try and the waits never returned), the turn
 * and the database held them to the client's timeout (2 s). */
TEST(locks_held_outside_dlock_keep_no_wait_past_its_deadline)
{
    static const struct {
        const char *what;
        int how;
        long long start, len;
    } cases[] = {
        {"every byte of the sidecar", JAM_FILE, 0, 0},
        {"the writers' turn", JAM_FILE, 1, 1},
        {"the lock's region", JAM_FILE, 1LL << 32, 1LL << 32},
        {"the database", JAM_DB, 0, 0},
    };
    jam *j = th_shared(sizeof(*j));

    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        char db[600], u[700];
        dlock_client *h = NULL, *w = NULL;
        timed t;

        fprintf(stderr, "  %s\n", cases[k].what);
        snprintf(db, sizeof(db), "%s/jam%zu.db", th_tmpdir(), k);
        snprintf(u, sizeof(u), "sqlite://%s", db);
        CHECK_OK(dlock_client_open(&h, u, NULL));
        CHECK_OK(dlock_client_open(&w, u, NULL));
        dlock *lh = handle(h, "jam", 30000), *lw = handle(w, "jam", 30000);
        CHECK_OK(dlock_acquire(lh, 0)); /* the row's rowid is 1 */
        memset(j, 0, sizeof(*j));
        snprintf(j->path, sizeof(j->path), "%s%s", db,
                 cases[k].how == JAM_FILE ? "-dlock" : "");
        j->how = cases[k].how;
        j->start = cases[k].start;
        j->len = cases[k].len;
        dlock_info in;
        memset(&in, 0, sizeof(in));
        CHECK_OK(dlock_inspect(h, "jam", &in));
        CHECK_STR(in.foreign, "");
        dlock_info_clear(&in);
        pid_t pid = th_fork(jammer, j);
        CHECK(th_wait_flag(&j->ready, 10000));
        /* dlock status tells it from dlock's holders and waiters */
        CHECK_OK(dlock_inspect(h, "jam", &in));
        if (cases[k].how == JAM_FILE) {
            CHECK_CONTAINS(in.foreign, "a process outside dlock holds a "
                                       "read lock on");
            CHECK_CONTAINS(in.foreign, "-dlock");
        }
        CHECK_EQ(in.waiters, 0); /* not counted as waiters */
        CHECK_EQ(in.held, 1);
        dlock_info_clear(&in);

        /* the wait: EBUSY at its deadline (not before: the holder may
         * still release), and not past it by more than a busy machine's
         * scheduling */
        run_timed(&t, lw, 500, 500 + slack_ms() + 5000);
        int64_t waited = t.ended - t.start;
        CHECK_RC(t.rc, DLOCK_EBUSY);
        CHECK_OP(t.ended - t.start, >=, 490);
        CHECK_OP(t.ended - t.start, <, 500 + slack_ms());

        /* the try: at most SQ_TRY_MS (100 ms) for another client's
         * statement, then busy */
        run_timed(&t, lw, 0, slack_ms() + 5000);
        CHECK_RC(t.rc, DLOCK_EBUSY);
        CHECK_OP(t.ended - t.start, <, 100 + slack_ms() / 2);
        int64_t tried = t.ended - t.start;

        /* a wait forever, ended by dlock_cancel() (not by a timeout: the
         * client's is 2 s) */
        pthread_t th;
        memset(&t, 0, sizeof(t));
        t.l = lw;
        t.wait = -1;
        CHECK_EQ(pthread_create(&th, NULL, timed_acquire, &t), 0);
        th_sleep_ms(300);
        CHECK(!t.done);
        int64_t cancelled = th_now_ms();
        CHECK_OK(dlock_cancel(lw));
        if (!th_wait_flag(&t.done, slack_ms() + 5000))
            th_fail(__FILE__, __LINE__, "%s: the cancelled wait goes on",
                    cases[k].what);
        pthread_join(th, NULL);
        CHECK_RC(t.rc, DLOCK_ECANCELED);
        CHECK_OP(t.ended - cancelled, <, slack_ms());
        fprintf(stderr, "    wait 500 ms: %lld ms; try: %lld ms; cancel: "
                        "%lld ms\n",
                (long long)waited, (long long)tried,
                (long long)(t.ended - cancelled));

        j->done = 1;
        CHECK_EQ(th_wait(pid), 0);
        CHECK_OK(dlock_inspect(h, "jam", &in));
        CHECK_STR(in.foreign, "");
        dlock_info_clear(&in);
        /* and nothing is left stuck: the queue works again */
        CHECK_OK(dlock_release(lh));
        CHECK_OK(dlock_acquire(lw, 5000));
        CHECK_OK(dlock_release(lw));
        TH_CLOSE(lh, lw);
        TH_CLIENT_CLOSE(h, w);
    }
}

static const th_test tests[] = {
    T(a_store_made_in_a_1777_directory_is_closed_to_other_users),
    T(a_wider_sidecar_is_tightened_and_another_users_refused),
    T(group_shares_with_members_of_the_group_only),
    T(a_group_store_is_shared_by_two_users_of_the_group),
    T(squatting_wake_up_names_as_another_user_does_not_slow_a_waiter),
    T(a_crashed_waiters_socket_files_are_replaced),
    TK(locks_held_outside_dlock_keep_no_wait_past_its_deadline),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    return th_main(argc, argv, tests);
}
