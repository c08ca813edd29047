/* SPDX-License-Identifier: MIT */
/*
 * test_sqlite_rw.c -- what only the SQLite store does with shared (read)
 * holds and semaphores, and how they fail (docs/design.md, "Shared holds
 * and permits", its SQLite paragraph): the last reader's release waking
 * the waiting writer at once, while a release that leaves a reader wakes
 * nobody (no statement in the sleeping writer); a writer's release
 * letting in the readers at the head of the queue as a chain, and no
 * further; a dead reader's or permit's entry ending at its lease, and
 * the waiter getting in then (not before: the table decides); a reader's
 * renewal moving its own entry only; a release whose entry is gone; a
 * semaphore keeping its N and letting in one waiter per permit freed;
 * kinds mixed on a live name refused; tries racing from several
 * processes; a database of the previous version migrated at open, alone
 * and by many processes at once. dlock_break() (docs/design.md,
 * "Breaking on SQLite"): the successor of a broken holder with a ticket
 * woken at once, a newcomer passing its ticket, a broken reader or
 * permit's waiters let in. The contract every store with shared holds
 * gives is tests/store/test_shared.c; every store's list and break,
 * tests/store/test_operate.c.
 *
 * Statements are counted per thread: this binary defines sqlite3_step()
 * (it is linked with its symbols exported, so the store's module calls
 * this one), counts the statements the threads that ask for it start
 * (a first step), and calls SQLite's own. The first test checks that the
 * counting works.
 */
#include "test.h"

#include <sqlite3.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <unistd.h>

static char db_path[600];
static char uri[700];

/* ------------------------------------------------------------------------ */
/* Counting statements                                                      */
/* ------------------------------------------------------------------------ */

static __thread long *steps_here; /* this thread's counter, or NULL */

int sqlite3_step(sqlite3_stmt *s);
int sqlite3_step(sqlite3_stmt *s)
{
    static int (*real)(sqlite3_stmt *);
    int (*f)(sqlite3_stmt *) = __atomic_load_n(&real, __ATOMIC_ACQUIRE);

    if (!f) {
        *(void **)(&f) = dlsym(RTLD_NEXT, "sqlite3_step");
        if (!f) {
            fprintf(stderr, "test_sqlite_rw: no sqlite3_step after ours\n");
            abort();
        }
        __atomic_store_n(&real, f, __ATOMIC_RELEASE);
    }
    /* a statement's first step (not its next rows, or its end) */
    if (steps_here && !sqlite3_stmt_busy(s))
        __atomic_add_fetch(steps_here, 1, __ATOMIC_SEQ_CST);
    return f(s);
}

static long steps_of(long *counter)
{
    return __atomic_load_n(counter, __ATOMIC_SEQ_CST);
}

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static dlock_client *client(void)
{
    return th_client(uri, NULL);
}

/* A query on the database through a connection of our own, its first
 * column as text into out ("" for NULL or no row); `name` bound as ?1
 * (a BLOB, as the store binds it). */
static void query(const char *path, const char *sql, const char *name,
                  char *out, size_t cap)
{
    sqlite3 *db;
    sqlite3_stmt *st;

    out[0] = '\0';
    CHECK_EQ(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK)
        th_fail(__FILE__, __LINE__, "%s: %s", sql, sqlite3_errmsg(db));
    if (name)
        sqlite3_bind_blob(st, 1, name, (int)strlen(name), SQLITE_STATIC);
    if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
        snprintf(out, cap, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    sqlite3_close(db);
}

static long long query_ll(const char *sql, const char *name)
{
    char v[64];

    query(db_path, sql, name, v, sizeof(v));
    return v[0] ? atoll(v) : -1;
}

/* The lease end (ms, SQLite's clock) of `owner`'s entry in lock `name`'s
 * row, -1 when it has none. */
static long long entry_end(const char *name, const char *owner)
{
    char sql[300];

    snprintf(sql, sizeof(sql), "SELECT json_extract(holders, '$.\"%s\"[1]') "
                               "FROM dlock_locks WHERE name = ?1",
             owner);
    return query_ll(sql, name);
}

/* The owner string of the holds a thread makes: "<client id>:<tid>". A
 * test reads it from the row of a name held once, shared: a sole holder
 * is '*' and its owner in the owner column. */
static void only_owner(const char *name, char *owner, size_t cap)
{
    query(db_path, "SELECT substr(owner, 2) FROM dlock_locks WHERE name = ?1 "
                   "AND owner LIKE '*_%'",
          name, owner, cap);
    CHECK(owner[0] != '\0');
}

/* Is the region of lock `name` marked (the head of its queue asleep on
 * its doorbell, waiting for holders without a ticket)? The mark is the
 * region's last byte in the sidecar <db>-dlock (src/stores/sqlite). */
static int marked(const char *name)
{
    char side[700];
    struct flock fl;
    long long rowid = query_ll("SELECT rowid FROM dlock_locks WHERE name = ?1",
                               name);
    int fd, m;

    snprintf(side, sizeof(side), "%s-dlock", db_path);
    fd = open(side, O_RDWR | O_CLOEXEC);
    CHECK(fd >= 0);
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = ((off_t)rowid << 32) + (((off_t)1 << 32) - 1);
    fl.l_len = 1;
    CHECK_EQ(fcntl(fd, F_OFD_GETLK, &fl), 0);
    m = fl.l_type != F_UNLCK;
    close(fd);
    return m;
}

/* One waiting acquisition in a thread of its own, counting its thread's
 * statements. */
typedef struct waiter {
    dlock *l;
    int shared;
    int64_t wait;
    int64_t hold;     /* ms to hold before releasing (or until `go`) */
    volatile int go;  /* with hold < 0: release when set */
    int rc;
    int rel;          /* its release's code */
    int64_t got;      /* monotonic ms when acquired */
    uint64_t token;
    long steps;       /* statements this thread ran */
    long steps_at_got;
    volatile pid_t tid;
    char msg[512];
} waiter;

static void *wait_thread(void *arg)
{
    waiter *w = arg;
    int rc;

    __atomic_store_n(&w->tid, (pid_t)syscall(SYS_gettid), __ATOMIC_SEQ_CST);
    steps_here = &w->steps;
    rc = w->shared ? dlock_acquire_shared(w->l, w->wait)
                   : dlock_acquire(w->l, w->wait);
    w->steps_at_got = steps_of(&w->steps);
    snprintf(w->msg, sizeof(w->msg), "%s", dlock_errmsg());
    w->token = dlock_token(w->l);
    __atomic_store_n(&w->got, th_now_ms(), __ATOMIC_SEQ_CST);
    __atomic_store_n(&w->rc, rc, __ATOMIC_SEQ_CST);
    if (rc == DLOCK_OK) {
        if (w->hold >= 0) {
            th_sleep_ms(w->hold);
        } else {
            (void)th_wait_flag(&w->go, 20000);
        }
        w->rel = dlock_release(w->l);
    }
    steps_here = NULL;
    return NULL;
}

static void start(waiter *w, pthread_t *th, dlock *l, int shared,
                  int64_t hold)
{
    memset(w, 0, sizeof(*w));
    w->rc = -1;
    w->l = l;
    w->shared = shared;
    w->wait = 20000;
    w->hold = hold;
    pthread_create(th, NULL, wait_thread, w);
}

/* Waits (10 s at most) until w's acquire has returned; its code. */
static int until_got(waiter *w)
{
    int64_t until = th_now_ms() + 10000;

    while (__atomic_load_n(&w->rc, __ATOMIC_SEQ_CST) == -1 &&
           th_now_ms() < until)
        th_sleep_ms(2);
    return __atomic_load_n(&w->rc, __ATOMIC_SEQ_CST);
}

/* Is thread `tid` of this process blocked in poll() (a waiter asleep on
 * its predecessor's channel or on its doorbell)? */
static int in_poll(pid_t tid)
{
    char path[64], buf[64];
    long nr = -1;
    FILE *f;

    snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", (int)tid);
    f = fopen(path, "r");
    if (!f)
        return 0;
    if (fgets(buf, sizeof(buf), f))
        nr = strtol(buf, NULL, 10);
    fclose(f);
#ifdef SYS_poll
    if (nr == SYS_poll)
        return 1;
#endif
    return nr == SYS_ppoll;
}

/* Waits (10 s at most) until w's thread sleeps in poll() and has run no
 * statement for 50 ms: it is asleep, waiting to be woken. */
static void until_asleep(waiter *w)
{
    int64_t until = th_now_ms() + 10000;

    while (th_now_ms() < until) {
        pid_t tid = __atomic_load_n(&w->tid, __ATOMIC_SEQ_CST);
        long s0 = steps_of(&w->steps);
        if (tid > 0 && in_poll(tid)) {
            th_sleep_ms(50);
            if (in_poll(tid) && steps_of(&w->steps) == s0)
                return;
        }
        th_sleep_ms(5);
    }
    th_fail(__FILE__, __LINE__, "a waiter never went to sleep (10 s)");
}

/* ------------------------------------------------------------------------ */
/* Tests                                                                    */
/* ------------------------------------------------------------------------ */

/* The last reader's release wakes the writer waiting behind the readers
 * at once (its ring), not at the readers' lease end (30 s); a release
 * that leaves a reader wakes nobody: the writer, asleep on its doorbell,
 * runs no statement meanwhile. */
TEST(the_last_readers_release_wakes_the_writer_and_no_other_does)
{
    dlock_client *a = client(), *b = client(), *cw = client();
    dlock *ra = th_handle(a, "rw-last", 30000, 0, 0);
    dlock *rb = th_handle(b, "rw-last", 30000, 0, 0);
    waiter w;
    pthread_t th;
    long mine = 0;

    /* the counting works: our own acquire runs statements */
    steps_here = &mine;
    CHECK_OK(dlock_acquire_shared(ra, 0));
    steps_here = NULL;
    CHECK_OP(mine, >=, 1);
    CHECK_OK(dlock_acquire_shared(rb, 0));
    start(&w, &th, th_handle(cw, "rw-last", 30000, 0, 0), 0, 0);
    th_wait_state(a, "rw-last", 1, 2);
    until_asleep(&w);
    CHECK_EQ(marked("rw-last"), 1); /* the head, on its doorbell */
    long s0 = steps_of(&w.steps);
    CHECK_OK(dlock_release(ra));
    /* 300 ms: far more than a wake-up and a statement take */
    th_sleep_ms(300);
    CHECK_EQ(steps_of(&w.steps), s0);
    th_wait_state(a, "rw-last", 1, 1);
    int64_t rel = th_now_ms();
    CHECK_OK(dlock_release(rb));
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    /* rung: a wake-up and one statement; 2 s is a busy machine's
     * scheduling, far below the readers' 30 s lease */
    CHECK_OP(w.got - rel, <, 2000);
    CHECK_EQ(w.steps_at_got, s0 + 1);
    CHECK_OP(w.token, >, dlock_token(ra));
    CHECK_OP(w.token, >, dlock_token(rb));
    dlock_close(w.l);
    TH_CLOSE(ra, rb);
    TH_CLIENT_CLOSE(a, b, cw);
}

/* A writer's release lets in the readers at the head of the queue, one
 * after another (each dropping its ticket with the wake-up byte), and no
 * further: with R R W R queued, the first two get in; the writer, then
 * the last reader, wait their turn. */
TEST(a_writers_release_lets_in_the_readers_at_the_head_and_no_further)
{
    enum { NW = 4 };
    dlock_client *h = client(), *c[NW];
    dlock *lh = th_handle(h, "rw-head", 30000, 0, 0);
    waiter w[NW];
    pthread_t th[NW];
    static const int shared[NW] = {1, 1, 0, 1};

    CHECK_OK(dlock_acquire(lh, 0));
    for (int i = 0; i < NW; i++) {
        c[i] = client();
        start(&w[i], &th[i], th_handle(c[i], "rw-head", 30000, 0, 0), shared[i],
              400);
        th_wait_state(h, "rw-head", i + 1, 1); /* queued in this order */
    }
    int64_t rel = th_now_ms();
    CHECK_OK(dlock_release(lh));
    th_wait_state(h, "rw-head", 2, 2); /* two readers hold, two wait */
    dlock_info i = th_info(h, "rw-head");
    CHECK_EQ(i.shared, 1);
    CHECK_CONTAINS(i.holder, "2 readers");
    dlock_info_clear(&i);
    for (int k = 0; k < NW; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < NW; k++)
        CHECK_OK(w[k].rc);
    for (int k = 0; k < 2; k++) {
        /* a chain of two hops: 2 s is a busy machine's scheduling */
        CHECK_OP(w[k].got - rel, <, 2000);
        /* the writer came after both readers of the head let go */
        CHECK_OP(w[2].got, >=, w[k].got + w[k].hold);
        CHECK_OP(w[2].token, >, w[k].token);
    }
    CHECK_OP(w[3].got, >=, w[2].got + w[2].hold);
    CHECK_OP(w[3].token, >, w[2].token);
    for (int k = 0; k < NW; k++) {
        dlock_close(w[k].l);
        dlock_client_close(c[k]);
    }
    dlock_close(lh);
    dlock_client_close(h);
}

/* Readers queued behind a writer get in as a chain when it releases: one
 * statement and one wake-up per reader. The time from the release to the
 * last reader in is printed (design.md quotes it). */
TEST(readers_behind_a_writer_get_in_as_a_chain)
{
    enum { NR = 8 };
    dlock_client *h = client(), *c[NR];
    dlock *lh = th_handle(h, "rw-chain", 30000, 0, 0);
    waiter w[NR];
    pthread_t th[NR];

    CHECK_OK(dlock_acquire(lh, 0));
    for (int i = 0; i < NR; i++) {
        c[i] = client();
        start(&w[i], &th[i], th_handle(c[i], "rw-chain", 30000, 0, 0), 1, -1);
        th_wait_state(h, "rw-chain", i + 1, 1);
    }
    for (int i = 0; i < NR; i++)
        until_asleep(&w[i]);
    long s0[NR];
    for (int i = 0; i < NR; i++)
        s0[i] = steps_of(&w[i].steps);
    int64_t rel = th_now_ms();
    CHECK_OK(dlock_release(lh));
    th_wait_state(h, "rw-chain", 0, NR);
    int64_t last = 0;
    for (int i = 0; i < NR; i++) {
        CHECK_OK(until_got(&w[i]));
        /* each reader got in with one statement: its take */
        CHECK_EQ(w[i].steps_at_got, s0[i] + 1);
        if (w[i].got > last)
            last = w[i].got;
        __atomic_store_n(&w[i].go, 1, __ATOMIC_SEQ_CST);
    }
    printf("     (%d readers in %lld ms after the writer's release)\n", NR,
           (long long)(last - rel));
    /* eight hops of a statement and a wake-up each; 3 s for a busy
     * machine, a tenth of the lease */
    CHECK_OP(last - rel, <, 3000);
    for (int k = 0; k < NR; k++) {
        pthread_join(th[k], NULL);
        CHECK_OK(w[k].rc);
        dlock_close(w[k].l);
        dlock_client_close(c[k]);
    }
    dlock_close(lh);
    dlock_client_close(h);
}

/* A process that holds a read or permit and dies: its entry holds until
 * its lease ends (nobody is rung: a dead holder publishes nothing). */
typedef struct dead {
    int64_t before, after; /* monotonic ms around the child's acquire */
    volatile int ready;
    unsigned permits;
    char name[32];
} dead;

static int dead_child(void *arg)
{
    dead *d = arg;
    dlock_client *c = NULL;
    dlock_options o;
    dlock *l = NULL;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = 800;
    o.flags = DLOCK_NO_RENEW; /* its end is its take's + 800 ms */
    o.permits = d->permits;
    if (dlock_client_open(&c, uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, d->name, &o) != DLOCK_OK)
        return 2;
    d->before = th_now_ms();
    int rc = d->permits ? dlock_acquire(l, 5000) : dlock_acquire_shared(l, 5000);
    d->after = th_now_ms();
    if (rc != DLOCK_OK)
        return 3;
    __atomic_store_n(&d->ready, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < 6000; i++)
        th_sleep_ms(10); /* killed long before */
    return 4;
}

static pid_t dead_holder(dead *d, const char *name, unsigned permits)
{
    int64_t until = th_now_ms() + 10000;
    pid_t pid;

    snprintf(d->name, sizeof(d->name), "%s", name);
    d->permits = permits;
    pid = th_fork(dead_child, d);
    while (!__atomic_load_n(&d->ready, __ATOMIC_SEQ_CST) && th_now_ms() < until)
        th_sleep_ms(5);
    CHECK(d->ready);
    kill(pid, SIGKILL);
    CHECK_EQ(th_wait(pid), 128 + SIGKILL);
    return pid;
}

/* A dead reader's entry ends at its lease and the waiting writer gets in
 * then: not before (the table decides), and not at the live reader's
 * lease (30 s) although that one released first and rang nobody (a
 * reader was left): the writer's timer is the earliest live end. */
TEST(a_dead_readers_entry_ends_at_its_lease_and_the_writer_gets_in_then)
{
    dead *d = th_shared(sizeof(*d));
    dlock_client *a = client(), *cw = client();
    dlock *live = th_handle(a, "rw-dead", 30000, 0, 0);
    waiter w;
    pthread_t th;

    CHECK_OK(dlock_acquire_shared(live, 0));
    dead_holder(d, "rw-dead", 0);
    start(&w, &th, th_handle(cw, "rw-dead", 30000, 0, 0), 0, 0);
    th_wait_state(a, "rw-dead", 1, 2);
    CHECK_OK(dlock_release(live)); /* one entry left: the dead one's */
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    /* SQLite's clock and ours tick alike; 20 ms for rounding to ms */
    CHECK_OP(w.got, >=, d->before + 800 - 20);
    /* the timer fires at that end; 3 s of a busy machine's slack, far
     * below the live reader's 30 s lease and the wait's 20 s */
    CHECK_OP(w.got, <, d->after + 800 + 3000);
    dlock_close(w.l);
    dlock_close(live);
    TH_CLIENT_CLOSE(a, cw);
}

/* The same for a permit: its holder killed, the head of the waiters gets
 * the permit at the holder's lease end (its timer), not before. */
TEST(a_killed_permit_holder_wakes_the_head_by_its_lease_end)
{
    dead *d = th_shared(sizeof(*d));
    dlock_client *cw = client();
    waiter w;
    pthread_t th;

    dead_holder(d, "sem-dead", 1);
    start(&w, &th, th_handle(cw, "sem-dead", 30000, 0, 1), 0, 0);
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    CHECK_OP(w.got, >=, d->before + 800 - 20);
    CHECK_OP(w.got, <, d->after + 800 + 3000);
    dlock_close(w.l);
    dlock_client_close(cw);
}

/* A reader's renewal moves its own entry's end, and the row's lock_until
 * to the latest end: never another reader's (Redisson #2144). */
TEST(a_readers_renewal_moves_only_its_own_entry)
{
    dlock_client *a = client(), *b = client();
    dlock *ra = th_handle(a, "rw-renew", 5000, 0, 0);
    dlock *rb = th_handle(b, "rw-renew", 5000, 0, 0);
    char oa[128], ob[128], sql[300];

    CHECK_OK(dlock_acquire_shared(ra, 0));
    only_owner("rw-renew", oa, sizeof(oa));
    th_sleep_ms(20);
    CHECK_OK(dlock_acquire_shared(rb, 0));
    /* the other entry is b's (owners are hex digits and a colon) */
    snprintf(sql, sizeof(sql), "SELECT key FROM dlock_locks, "
                               "json_each(holders) WHERE name = ?1 AND key "
                               "<> '%s'",
             oa);
    query(db_path, sql, "rw-renew", ob, sizeof(ob));
    CHECK(ob[0] != '\0');
    long long ea = entry_end("rw-renew", oa), eb = entry_end("rw-renew", ob);
    CHECK_OP(ea, >, 0);
    CHECK_OP(eb, >=, ea);
    th_sleep_ms(50);
    CHECK_OK(dlock_extend(ra, 20000));
    long long ea2 = entry_end("rw-renew", oa);
    CHECK_OP(ea2, >=, ea + 15000 + 50);
    CHECK_EQ(entry_end("rw-renew", ob), eb);
    CHECK_EQ(query_ll("SELECT lock_until FROM dlock_locks WHERE name = ?1",
                      "rw-renew"),
             ea2);
    /* a's shorter renewal brings lock_until down to b's end */
    CHECK_OK(dlock_extend(ra, 100));
    CHECK_EQ(query_ll("SELECT lock_until FROM dlock_locks WHERE name = ?1",
                      "rw-renew"),
             eb);
    CHECK_EQ(entry_end("rw-renew", ob), eb);
    CHECK_OK(dlock_release(ra));
    CHECK_OK(dlock_release(rb));
    CHECK_EQ(query_ll("SELECT lock_until FROM dlock_locks WHERE name = ?1",
                      "rw-renew"),
             0);
    TH_CLOSE(ra, rb);
    TH_CLIENT_CLOSE(a, b);
}

/* A release whose entry is gone (its lease ended; then dropped by another
 * reader's take) is DLOCK_ELOST and writes nothing: the other readers'
 * entries, the row's end and its token stay as they were (Redisson
 * #891: a read unlock that deleted another's hold). */
TEST(a_release_whose_entry_is_gone_is_lost_and_touches_no_other)
{
    dlock_client *a = client(), *b = client(), *c = client();
    dlock *short1 = th_handle(a, "rw-gone", 100, DLOCK_NO_RENEW, 0);
    dlock *short2 = th_handle(c, "rw-gone", 100, DLOCK_NO_RENEW, 0);
    dlock *longr = th_handle(b, "rw-gone", 30000, 0, 0);
    static const char row_sql[] =
        "SELECT quote(owner) || '|' || quote(holders) || '|' || holds || '|' "
        "|| token || '|' || lock_until || '|' || quote(holder) FROM "
        "dlock_locks WHERE name = ?1";
    char before[2048], after[2048];

    CHECK_OK(dlock_acquire_shared(short1, 0));
    CHECK_OK(dlock_acquire_shared(longr, 0));
    th_sleep_ms(250); /* short1's 100 ms lease is over */
    query(db_path, row_sql, "rw-gone", before, sizeof(before));
    CHECK_RC(dlock_release(short1), DLOCK_ELOST);
    query(db_path, row_sql, "rw-gone", after, sizeof(after));
    CHECK_STR(after, before);
    /* a take drops the ended entry; a release of it then is lost too */
    CHECK_OK(dlock_acquire_shared(short1, 0));
    th_sleep_ms(250);
    CHECK_OK(dlock_acquire_shared(short2, 0)); /* drops short1's entry */
    th_check_held(b, "rw-gone", -1, 2);
    query(db_path, row_sql, "rw-gone", before, sizeof(before));
    CHECK_RC(dlock_release(short1), DLOCK_ELOST);
    query(db_path, row_sql, "rw-gone", after, sizeof(after));
    CHECK_STR(after, before);
    CHECK_EQ(dlock_held(longr), 1);
    CHECK_OK(dlock_extend(longr, 30000));
    CHECK_OK(dlock_release(longr));
    (void)dlock_release(short2);
    TH_CLOSE(short1, short2, longr);
    TH_CLIENT_CLOSE(a, b, c);
}

/* A semaphore of 2: three waiters queue; each release lets in exactly
 * one (the head of the queue), the others keep waiting; the waiter at
 * the back runs no statement while the ones ahead are served, and N is
 * kept (another N refused) while permits are held. */
TEST(a_semaphore_keeps_its_n_and_lets_in_one_waiter_per_permit_freed)
{
    enum { NW = 3 };
    dlock_client *a = client(), *b = client(), *c[NW];
    dlock *pa = th_handle(a, "sem-one", 30000, 0, 2), *pb = th_handle(b, "sem-one", 30000, 0, 2);
    waiter w[NW];
    pthread_t th[NW];

    CHECK_OK(dlock_acquire(pa, 0));
    CHECK_OK(dlock_acquire(pb, 0));
    for (int i = 0; i < NW; i++) {
        c[i] = client();
        start(&w[i], &th[i], th_handle(c[i], "sem-one", 30000, 0, 2), 0, -1);
        th_wait_state(a, "sem-one", i + 1, 2);
    }
    for (int i = 0; i < NW; i++)
        until_asleep(&w[i]);
    CHECK_EQ(marked("sem-one"), 1);
    long last0 = steps_of(&w[NW - 1].steps);
    dlock_info in = th_info(a, "sem-one");
    CHECK_EQ(in.permits, 2);
    CHECK_CONTAINS(in.holder, "2 of 2 permits");
    dlock_info_clear(&in);
    /* one permit freed: the head gets it, and nobody else */
    CHECK_OK(dlock_release(pa));
    th_wait_state(a, "sem-one", 2, 2);
    th_sleep_ms(300); /* nobody else gets in meanwhile */
    th_wait_state(a, "sem-one", 2, 2);
    CHECK_OK(until_got(&w[0]));
    CHECK_EQ(w[1].got, 0);
    CHECK_EQ(w[2].got, 0);
    /* the last waiter slept behind its predecessor meanwhile */
    CHECK_EQ(steps_of(&w[NW - 1].steps), last0);
    /* N is kept while held */
    dlock *other = th_handle(a, "sem-one", 30000, 0, 3);
    CHECK_RC(dlock_acquire(other, 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "2 permits");
    /* the next: freed by another holder */
    CHECK_OK(dlock_release(pb));
    th_wait_state(a, "sem-one", 1, 2);
    CHECK_OK(until_got(&w[1]));
    CHECK_EQ(w[2].got, 0);
    CHECK_OP(w[1].token, >, w[0].token);
    /* the last waiter, now the head, tried once (its take and its read
     * of the earliest end: the semaphore is full) and sleeps again */
    until_asleep(&w[NW - 1]);
    CHECK_EQ(steps_of(&w[NW - 1].steps), last0 + 2);
    CHECK_EQ(marked("sem-one"), 1);
    __atomic_store_n(&w[0].go, 1, __ATOMIC_SEQ_CST);
    pthread_join(th[0], NULL);
    __atomic_store_n(&w[2].go, 1, __ATOMIC_SEQ_CST);
    pthread_join(th[2], NULL);
    CHECK_OK(w[2].rc);
    CHECK_OP(w[2].token, >, w[1].token);
    __atomic_store_n(&w[1].go, 1, __ATOMIC_SEQ_CST);
    pthread_join(th[1], NULL);
    in = th_info(a, "sem-one");
    CHECK_EQ(in.held, 0);
    CHECK_EQ(in.permits, 2); /* kept for status once free */
    dlock_info_clear(&in);
    for (int k = 0; k < NW; k++) {
        dlock_close(w[k].l);
        dlock_client_close(c[k]);
    }
    TH_CLOSE(other, pa, pb);
    TH_CLIENT_CLOSE(a, b);
}

/* A live name binds its kind: a writer or a reader on a semaphore, a
 * permit on a lock held exclusively or shared, a permit of another N:
 * DLOCK_EINVAL at once, even for a caller that would wait, which leaves
 * no ticket behind. A free name binds nothing. */
TEST(kinds_mixed_on_a_live_name_are_refused)
{
    dlock_client *a = client(), *b = client();
    dlock *sem = th_handle(a, "mix", 30000, 0, 2);
    dlock *lk = th_handle(b, "mix", 30000, 0, 0);
    dlock *sem3 = th_handle(b, "mix", 30000, 0, 3);
    dlock *sem2 = th_handle(a, "mix", 30000, 0, 2);

    CHECK_OK(dlock_acquire(sem, 0));
    CHECK_RC(dlock_acquire(lk, 5000), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "semaphore of 2 permits");
    CHECK_RC(dlock_acquire_shared(lk, 5000), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "semaphore of 2 permits");
    CHECK_RC(dlock_acquire(sem3, 5000), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "not 3");
    dlock_info i = th_info(a, "mix");
    CHECK_EQ(i.waiters, 0);
    CHECK_EQ(i.holders, 1);
    CHECK_EQ(i.permits, 2);
    CHECK_CONTAINS(i.holder, " pid "); /* the one holder's description */
    dlock_info_clear(&i);
    CHECK_OK(dlock_release(sem));
    /* free: a lock now, exclusive, then shared */
    CHECK_OK(dlock_acquire(lk, 0));
    CHECK_RC(dlock_acquire(sem2, 5000), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "held as a lock");
    CHECK_OK(dlock_release(lk));
    CHECK_OK(dlock_acquire_shared(lk, 0));
    CHECK_RC(dlock_acquire(sem, 5000), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "held shared");
    i = th_info(a, "mix");
    CHECK_EQ(i.waiters, 0);
    CHECK_EQ(i.shared, 1);
    CHECK_EQ(i.permits, 0);
    dlock_info_clear(&i);
    CHECK_OK(dlock_release(lk));
    TH_CLOSE(sem, lk, sem3, sem2);
    TH_CLIENT_CLOSE(a, b);
}

/* Tries (wait 0) from several processes at once never hand out more
 * permits than there are (kazoo #213): the take is one statement. */
typedef struct racer_shared {
    volatile int go;
    int inside, most;
    int got; /* permits taken, by all */
} racer_shared;

static int racer(void *arg)
{
    racer_shared *r = arg;
    dlock_client *c = NULL;
    dlock_options o;
    dlock *l = NULL;
    int got = 0;

    memset(&o, 0, sizeof(o));
    o.permits = 2;
    if (dlock_client_open(&c, uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "sem-race", &o) != DLOCK_OK)
        return 2;
    while (!__atomic_load_n(&r->go, __ATOMIC_SEQ_CST))
        th_sleep_ms(1);
    /* tries only: bounded by count and time (a try may lose every race) */
    int64_t until = th_now_ms() + 3000;
    for (int i = 0; i < 4000 && got < 30 && th_now_ms() < until; i++) {
        int rc = dlock_acquire(l, 0);
        if (rc == DLOCK_EBUSY)
            continue;
        if (rc != DLOCK_OK)
            return 3;
        int n = __atomic_add_fetch(&r->inside, 1, __ATOMIC_SEQ_CST);
        int m = __atomic_load_n(&r->most, __ATOMIC_SEQ_CST);
        while (n > m && !__atomic_compare_exchange_n(&r->most, &m, n, 0,
                                                     __ATOMIC_SEQ_CST,
                                                     __ATOMIC_SEQ_CST)) {
        }
        usleep(200);
        __atomic_sub_fetch(&r->inside, 1, __ATOMIC_SEQ_CST);
        if (dlock_release(l) != DLOCK_OK)
            return 4;
        got++;
    }
    __atomic_add_fetch(&r->got, got, __ATOMIC_SEQ_CST);
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

TEST(tries_from_many_processes_never_take_more_than_n)
{
    enum { NP = 5 };
    racer_shared *r = th_shared(sizeof(*r));
    pid_t pid[NP];

    for (int i = 0; i < NP; i++)
        pid[i] = th_fork(racer, r);
    th_sleep_ms(50);
    __atomic_store_n(&r->go, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < NP; i++)
        CHECK_EQ(th_wait(pid[i]), 0);
    CHECK_OP(r->most, <=, 2);
    CHECK_OP(r->got, >=, 1);
}

/* ------------------------------------------------------------------------ */
/* dlock_break()                                                            */
/* ------------------------------------------------------------------------ */

/* The row's `ticket`: its exclusive holder's ticket number, 0 for none,
 * a break's mark when negative. */
static long long ticket_of(const char *name)
{
    return query_ll("SELECT ticket FROM dlock_locks WHERE name = ?1", name);
}

/* A holder that got the lock through the queue holds a ticket: its
 * release would hand the lock to its successor over its channel, which a
 * breaker cannot. The break rings the successor's doorbell instead, and
 * its mark in the row lets the successor pass the evicted ticket: the
 * successor gets the lock at once, not at the evicted lease's end (30 s),
 * with a greater token; the evicted holder's release is lost. */
TEST(a_break_of_a_holder_with_a_ticket_wakes_its_successor_at_once)
{
    dlock_client *a = client(), *b = client(), *c = client(), *op = client();
    dlock *la = th_handle(a, "bk-ticket", 30000, 0, 0);
    dlock *lb = th_handle(b, "bk-ticket", 30000, 0, 0);
    dlock *lc = th_handle(c, "bk-ticket", 30000, 0, 0);
    waiter wb, wc;
    pthread_t tb, tc;
    dlock_info ev;

    CHECK_OK(dlock_acquire(la, 0)); /* nobody queued: no ticket */
    CHECK_EQ(ticket_of("bk-ticket"), 0);
    start(&wb, &tb, lb, 0, -1);
    th_wait_state(op, "bk-ticket", 1, 1);
    CHECK_OK(dlock_release(la));
    CHECK_OK(until_got(&wb)); /* handed over: b holds with its ticket */
    long long t = ticket_of("bk-ticket");
    CHECK_OP(t, >, 0);
    start(&wc, &tc, lc, 0, 0);
    th_wait_state(op, "bk-ticket", 1, 1);
    until_asleep(&wc); /* on b's channel (and its own doorbell) */
    long before = steps_of(&wc.steps);

    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_break(op, "bk-ticket", &ev));
    CHECK_EQ(ev.held, 1);
    CHECK_EQ(ev.token, wb.token);
    CHECK_EQ(ev.waiters, 1);
    dlock_info_clear(&ev);
    CHECK_OK(until_got(&wc));
    /* woken by the break's ring: the evicted lease had 30 s to run; 5 s
     * is a wake-up on a busy machine */
    CHECK_OP(wc.got - t0, <, 5000);
    CHECK_OP(wc.token, >, wb.token);
    /* rung, it read the row once (the mark), then took the lock */
    CHECK_OP(wc.steps_at_got - before, <=, 3);
    pthread_join(tc, NULL);
    CHECK_OK(wc.rel);
    /* the evicted holder: lost, and its release says so */
    __atomic_store_n(&wb.go, 1, __ATOMIC_SEQ_CST);
    pthread_join(tb, NULL);
    CHECK_EQ(wb.rel, DLOCK_ELOST);
    CHECK_RC(dlock_break(op, "bk-ticket", NULL), DLOCK_ENOTHELD);
    TH_CLOSE(la, lb, lc);
    TH_CLIENT_CLOSE(a, b, c, op);
}

/* Nobody waits when a holder with a ticket is broken; its ticket stays
 * locked until it notices. A newcomer then queues behind that ticket,
 * and finds the row free with the break's mark: it takes the lock at
 * once, instead of waiting for the ticket's owner until its own timer (a
 * lease, 30 s). */
TEST(a_newcomer_passes_the_ticket_of_a_broken_holder)
{
    dlock_client *a = client(), *b = client(), *c = client(), *op = client();
    dlock *la = th_handle(a, "bk-new", 30000, 0, 0);
    dlock *lb = th_handle(b, "bk-new", 30000, 0, 0);
    dlock *lc = th_handle(c, "bk-new", 30000, 0, 0);
    waiter wb, wc;
    pthread_t tb, tc;

    CHECK_OK(dlock_acquire(la, 0));
    start(&wb, &tb, lb, 0, -1);
    th_wait_state(op, "bk-new", 1, 1);
    CHECK_OK(dlock_release(la));
    CHECK_OK(until_got(&wb));
    long long t = ticket_of("bk-new");
    CHECK_OP(t, >, 0);
    CHECK_OK(dlock_break(op, "bk-new", NULL));
    CHECK_EQ(ticket_of("bk-new"), -t); /* the mark */
    int64_t t0 = th_now_ms();
    start(&wc, &tc, lc, 0, 0);
    CHECK_OK(until_got(&wc));
    /* a lease (30 s) without the mark; 5 s: a busy machine */
    CHECK_OP(wc.got - t0, <, 5000);
    CHECK_OP(wc.token, >, wb.token);
    pthread_join(tc, NULL);
    CHECK_EQ(ticket_of("bk-new"), 0); /* released: no holder, no mark */
    __atomic_store_n(&wb.go, 1, __ATOMIC_SEQ_CST);
    pthread_join(tb, NULL);
    CHECK_EQ(wb.rel, DLOCK_ELOST);
    TH_CLOSE(la, lb, lc);
    TH_CLIENT_CLOSE(a, b, c, op);
}

/* The evicted holder's renewal finds its hold gone and drops its ticket
 * there and then: a holder hung in its critical section never releases,
 * and its ticket would hold up the queue. With a short lease (900 ms,
 * renewed every 300 ms) the ticket is gone within a renewal. */
TEST(an_evicted_holders_renewal_drops_its_ticket)
{
    dlock_client *a = client(), *b = client(), *op = client();
    dlock *la = th_handle(a, "bk-drop", 900, 0, 0);
    dlock *lb = th_handle(b, "bk-drop", 900, 0, 0);
    waiter wb;
    pthread_t tb;

    CHECK_OK(dlock_acquire(la, 0));
    start(&wb, &tb, lb, 0, -1);
    th_wait_state(op, "bk-drop", 1, 1);
    CHECK_OK(dlock_release(la));
    CHECK_OK(until_got(&wb));
    CHECK_OP(ticket_of("bk-drop"), >, 0);
    CHECK_OK(dlock_break(op, "bk-drop", NULL));
    /* b's thread does not release ("hung"): its watchdog notices. Its
     * ticket, counted as a waiter by dlock_inspect() while the row is
     * free, is gone once its renewal ran (300 ms; until_state's 10 s is
     * a busy machine's bound) */
    th_wait_state(op, "bk-drop", 0, 0);
    /* so an acquire finds nobody queued: no ticket, the plain take */
    CHECK_OK(dlock_acquire(la, 0));
    CHECK_EQ(ticket_of("bk-drop"), 0);
    CHECK_OK(dlock_release(la));
    __atomic_store_n(&wb.go, 1, __ATOMIC_SEQ_CST);
    pthread_join(tb, NULL);
    CHECK_EQ(wb.rel, DLOCK_ELOST);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b, op);
}

/* Readers and permits keep no ticket: a break of them rings the head of
 * the queue, as the last reader's release would. The writer asleep on
 * its doorbell gets the lock at once (not at the readers' lease end,
 * 30 s); the semaphore's waiters get the freed permits one after the
 * other (the head passes its role on), both of them at once. */
TEST(a_break_of_readers_or_permits_lets_the_waiters_in_at_once)
{
    dlock_client *a = client(), *b = client(), *c = client(), *d = client();
    dlock_client *op = client();
    dlock *ra = th_handle(a, "bk-rw", 30000, 0, 0);
    dlock *rb = th_handle(b, "bk-rw", 30000, 0, 0);
    dlock *lw = th_handle(c, "bk-rw", 30000, 0, 0);
    waiter w, p[2];
    pthread_t tw, tp[2];
    dlock_info ev;

    CHECK_OK(dlock_acquire_shared(ra, 0));
    CHECK_OK(dlock_acquire_shared(rb, 0));
    start(&w, &tw, lw, 0, 0);
    th_wait_state(op, "bk-rw", 1, 2);
    until_asleep(&w);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_break(op, "bk-rw", &ev));
    CHECK_EQ(ev.holders, 2);
    CHECK_EQ(ev.shared, 1);
    dlock_info_clear(&ev);
    CHECK_OK(until_got(&w));
    CHECK_OP(w.got - t0, <, 5000); /* 30 s without the ring */
    pthread_join(tw, NULL);
    CHECK_RC(dlock_release(ra), DLOCK_ELOST);
    CHECK_RC(dlock_release(rb), DLOCK_ELOST);

    dlock *pa = th_handle(a, "bk-sem", 30000, 0, 2);
    dlock *pb = th_handle(b, "bk-sem", 30000, 0, 2);
    CHECK_OK(dlock_acquire(pa, 0));
    CHECK_OK(dlock_acquire(pb, 0));
    start(&p[0], &tp[0], th_handle(c, "bk-sem", 30000, 0, 2), 0, -1);
    th_wait_state(op, "bk-sem", 1, 2);
    start(&p[1], &tp[1], th_handle(d, "bk-sem", 30000, 0, 2), 0, -1);
    th_wait_state(op, "bk-sem", 2, 2);
    until_asleep(&p[1]);
    t0 = th_now_ms();
    th_break_counts(op, "bk-sem", 2, 2, -1);
    CHECK_OK(until_got(&p[0]));
    CHECK_OK(until_got(&p[1]));
    CHECK_OP(p[1].got - t0, <, 5000);
    th_wait_state(op, "bk-sem", 0, 2);
    for (int i = 0; i < 2; i++) {
        __atomic_store_n(&p[i].go, 1, __ATOMIC_SEQ_CST);
        pthread_join(tp[i], NULL);
        CHECK_OK(p[i].rel);
        dlock_close(p[i].l);
    }
    CHECK_RC(dlock_release(pa), DLOCK_ELOST);
    CHECK_RC(dlock_release(pb), DLOCK_ELOST);
    TH_CLOSE(pa, pb, ra, rb, lw);
    TH_CLIENT_CLOSE(a, b, c, d, op);
}

/* The lock table as the previous dlock made it (its DDL, before the
 * columns of shared holds). */
static const char old_ddl[] =
    "PRAGMA journal_mode=WAL;"
    "CREATE TABLE IF NOT EXISTS dlock_locks ("
    " name BLOB PRIMARY KEY,"
    " owner TEXT,"
    " holder TEXT,"
    " holds INTEGER NOT NULL DEFAULT 0,"
    " token INTEGER NOT NULL DEFAULT 0,"
    " locked_at INTEGER NOT NULL DEFAULT 0,"
    " lock_until INTEGER NOT NULL DEFAULT 0);";

/* A lock held by a client of the previous version: its take's row. */
static const char old_hold[] =
    "INSERT INTO dlock_locks (name, owner, holder, holds, token, locked_at, "
    "lock_until) VALUES (CAST('old-held' AS BLOB), 'f00d:1', 'old host pid "
    "1 tid 1', 1, 1234567, CAST((julianday('now') - 2440587.5) * 86400000 "
    "AS INTEGER), CAST((julianday('now') - 2440587.5) * 86400000 AS "
    "INTEGER) + 60000)";

static int columns(const char *path)
{
    char v[32];

    query(path, "SELECT count(*) FROM pragma_table_info('dlock_locks') "
                "WHERE name IN ('holders', 'permits', 'ticket')",
          NULL, v, sizeof(v));
    return atoi(v);
}

TEST(a_database_of_the_previous_version_is_migrated_with_its_lock_kept)
{
    char path[700], u[760];
    dlock_client *c = NULL;
    dlock *held, *other;

    snprintf(path, sizeof(path), "%s/old.db", th_tmpdir());
    snprintf(u, sizeof(u), "sqlite://%s", path);
    th_sqlite_exec(path, old_ddl);
    th_sqlite_exec(path, old_hold);
    CHECK_EQ(columns(path), 0);
    CHECK_OK(dlock_client_open(&c, u, NULL));
    CHECK_EQ(columns(path), 3);
    /* the old hold is kept, and keeps its kind: exclusive */
    dlock_info i = th_info(c, "old-held");
    CHECK_EQ(i.held, 1);
    CHECK_EQ(i.shared, 0);
    CHECK_EQ(i.holders, 1);
    CHECK_STR(i.holder, "old host pid 1 tid 1");
    CHECK_EQ(i.token, 1234567);
    dlock_info_clear(&i);
    held = th_handle(c, "old-held", 30000, 0, 0);
    CHECK_RC(dlock_acquire(held, 0), DLOCK_EBUSY);
    CHECK_RC(dlock_acquire_shared(held, 0), DLOCK_EBUSY);
    other = th_handle(c, "new", 30000, 0, 0);
    CHECK_OK(dlock_acquire_shared(other, 0));
    CHECK_OK(dlock_release(other));
    /* the old client's release: the row is free, tokens go on */
    th_sqlite_exec(path, "UPDATE dlock_locks SET owner = NULL, holder = NULL, "
                         "holds = 0, lock_until = 0 WHERE name = "
                         "CAST('old-held' AS BLOB)");
    CHECK_OK(dlock_acquire_shared(held, 0));
    CHECK_OP(dlock_token(held), >, 1234567);
    CHECK_OK(dlock_release(held));
    /* an old client's hold (no ticket written) can be broken: the token
     * kept, the next above it */
    th_sqlite_exec(path,
                   "UPDATE dlock_locks SET owner = 'f00d:1', holder = 'old', "
                   "holds = 1, token = 2345678, lock_until = CAST(("
                   "julianday('now') - 2440587.5) * 86400000 AS INTEGER) + "
                   "60000 WHERE name = CAST('old-held' AS BLOB)");
    dlock_info ev;
    CHECK_OK(dlock_break(c, "old-held", &ev));
    CHECK_EQ(ev.token, 2345678);
    CHECK_STR(ev.holder, "old");
    dlock_info_clear(&ev);
    CHECK_OK(dlock_acquire(held, 0));
    CHECK_OP(dlock_token(held), >, 2345678);
    CHECK_OK(dlock_release(held));
    TH_CLOSE(held, other);
    dlock_client_close(c);
    /* opened again: nothing more to add */
    CHECK_OK(dlock_client_open(&c, u, NULL));
    CHECK_EQ(columns(path), 3);
    dlock_client_close(c);
}

/* Processes opening one database of the previous version at the same
 * moment all succeed: the ones whose ALTER loses find the column there. */
TEST(many_processes_opening_one_old_database_at_once)
{
    char path[700], u[760];

    for (int round = 0; round < 10; round++) {
        snprintf(path, sizeof(path), "%s/old-together-%d.db", th_tmpdir(),
                 round);
        snprintf(u, sizeof(u), "sqlite://%s", path);
        th_sqlite_exec(path, old_ddl);
        th_sqlite_exec(path, old_hold);
        th_open_together(u, 8);
        CHECK_EQ(columns(path), 3);
        char held[32]; /* the old client's hold is still there */
        query(path, "SELECT lock_until > 0 AND token = 1234567 FROM "
                    "dlock_locks WHERE name = CAST('old-held' AS BLOB)",
              NULL, held, sizeof(held));
        CHECK_STR(held, "1");
    }
}

static const th_test tests[] = {
    TK(the_last_readers_release_wakes_the_writer_and_no_other_does),
    TK(a_writers_release_lets_in_the_readers_at_the_head_and_no_further),
    TK(readers_behind_a_writer_get_in_as_a_chain),
    TK(a_dead_readers_entry_ends_at_its_lease_and_the_writer_gets_in_then),
    TK(a_killed_permit_holder_wakes_the_head_by_its_lease_end),
    T(a_readers_renewal_moves_only_its_own_entry),
    T(a_release_whose_entry_is_gone_is_lost_and_touches_no_other),
    TK(a_semaphore_keeps_its_n_and_lets_in_one_waiter_per_permit_freed),
    T(kinds_mixed_on_a_live_name_are_refused),
    T(tries_from_many_processes_never_take_more_than_n),
    T(a_database_of_the_previous_version_is_migrated_with_its_lock_kept),
    T(many_processes_opening_one_old_database_at_once),
    TK(a_break_of_a_holder_with_a_ticket_wakes_its_successor_at_once),
    TK(a_newcomer_passes_the_ticket_of_a_broken_holder),
    TK(an_evicted_holders_renewal_drops_its_ticket),
    TK(a_break_of_readers_or_permits_lets_the_waiters_in_at_once),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    th_sqlite_db(db_path, sizeof(db_path), uri, sizeof(uri));
    return th_main(argc, argv, tests);
}
