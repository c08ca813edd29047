/* SPDX-License-Identifier: MIT */
/*
 * test_at_risk.c -- the at-risk event (dlock_client_set_at_risk(),
 * DLOCK_EVENT_AT_RISK and DLOCK_EVENT_SAFE; docs/design.md, "Stopping the
 * work before the lease ends") on a real store whose server the test
 * freezes:
 *
 *   test_at_risk file|redis|redlock|zk|etcd|sqlite|pg|pg-advisory|mysql
 *                [filter]
 *
 * "Frozen": every server process SIGSTOPped (Redis, each Redlock node,
 * ZooKeeper, etcd, PostgreSQL's whole tree, MariaDB), so that the store
 * keeps its connections and answers nothing; SQLite has no server: another
 * process holds the database's write lock (BEGIN EXCLUSIVE), so that a
 * renewal waits for it. The clients' timeout is 10 s: a renewal the store
 * leaves unanswered would hold the background thread that long if it were
 * not cut at the hold's at-risk moment, and every bound below is far from
 * it.
 */
#include "test.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static th_store S;
static pid_t sqlite_locker = -1;
static int sqlite_locker_in = -1;

/* The store's own at-risk rule applies to its leases: the watchdog's
 * (every kind but these), a session's (zk), a lease's (etcd). */
static int no_lease(void)
{
    return !strcmp(S.kind, "file") || !strcmp(S.kind, "pg-advisory");
}

/* A test of the at-risk event passes with a note where no lease runs. */
#define NEED_LEASE()                                                        \
    do {                                                                    \
        if (no_lease()) {                                                   \
            printf("     (no lease on this store: no at-risk event)\n");    \
            return;                                                         \
        }                                                                   \
    } while (0)

/* A ttl for the freezing tests: long enough for a busy machine to renew
 * it many times over (ZooKeeper and etcd: 3 s, their sessions and leases
 * are coarser, and etcd's are whole seconds). */
static int64_t ttl_of(void)
{
    return !strcmp(S.kind, "zk") || !strcmp(S.kind, "etcd") ? 3000 : 1500;
}

static dlock_client *client(void)
{
    return th_client(S.uri, th_patient()); /* 10 s a store call (header) */
}

static void freeze(void)
{
    if (!strcmp(S.kind, "redis")) {
        th_redis_kill(&S.srv, SIGSTOP);
    } else if (!strcmp(S.kind, "redlock")) {
        for (int i = 0; i < 5; i++)
            th_redis_kill(&S.rl[i], SIGSTOP);
    } else if (!strcmp(S.kind, "zk")) {
        th_zk_kill(&S.zsrv, 0, SIGSTOP);
    } else if (!strcmp(S.kind, "etcd")) {
        th_etcd_kill(&S.esrv, 0, SIGSTOP);
    } else if (!strcmp(S.kind, "pg") || !strcmp(S.kind, "mysql")) {
        th_sql_kill(&S.ssrv, SIGSTOP);
    } else if (!strcmp(S.kind, "sqlite")) {
        /* another process takes the database's write lock and keeps it
         * until its stdin closes */
        int in[2], out[2];
        char line[64];
        CHECK_EQ(pipe(in), 0);
        CHECK_EQ(pipe(out), 0);
        sqlite_locker = fork();
        CHECK(sqlite_locker >= 0);
        if (sqlite_locker == 0) {
            dup2(in[0], 0);
            dup2(out[1], 1);
            close(in[1]);
            close(out[0]);
            execlp("python3", "python3", "-c",
                   "import sqlite3, sys\n"
                   "db = sqlite3.connect(sys.argv[1], timeout=10, "
                   "isolation_level=None)\n"
                   "db.execute('BEGIN EXCLUSIVE')\n"
                   "print('locked', flush=True)\n"
                   "sys.stdin.read()\n"
                   "db.execute('COMMIT')\n",
                   S.uri + strlen("sqlite://"), (char *)NULL);
            _exit(127);
        }
        close(in[0]);
        close(out[1]);
        sqlite_locker_in = in[1];
        /* python starts in well under 10 s on any machine */
        CHECK(th_read_line(out[0], line, sizeof(line), 10000) > 0);
        CHECK_CONTAINS(line, "locked");
        close(out[0]);
    } else {
        th_fail(__FILE__, __LINE__, "no freeze for %s", S.kind);
    }
}

static void thaw(void)
{
    if (!strcmp(S.kind, "redis")) {
        th_redis_kill(&S.srv, SIGCONT);
    } else if (!strcmp(S.kind, "redlock")) {
        for (int i = 0; i < 5; i++)
            th_redis_kill(&S.rl[i], SIGCONT);
    } else if (!strcmp(S.kind, "zk")) {
        th_zk_kill(&S.zsrv, 0, SIGCONT);
    } else if (!strcmp(S.kind, "etcd")) {
        th_etcd_kill(&S.esrv, 0, SIGCONT);
    } else if (!strcmp(S.kind, "pg") || !strcmp(S.kind, "mysql")) {
        th_sql_kill(&S.ssrv, SIGCONT);
    } else if (!strcmp(S.kind, "sqlite") && sqlite_locker > 0) {
        close(sqlite_locker_in);
        CHECK_EQ(th_wait(sqlite_locker), 0);
        sqlite_locker = -1;
    }
}

/* A client with events and the largest margin its store allows for ttl. */
static dlock_client *risk_client(th_events *s, int64_t ttl, int64_t *margin)
{
    dlock_client *c = client();

    th_events_init(s);
    CHECK_OK(dlock_client_set_events(c, th_events_cb, s, 0));
    CHECK_OK(dlock_client_at_risk_max(c, ttl, margin));
    CHECK_OP(*margin, >, 0);
    CHECK_OK(dlock_client_set_at_risk(c, *margin));
    return c;
}

TEST(bad_margins_and_what_fits)
{
    dlock_client *c = client();
    int64_t m = -1;

    CHECK_RC(dlock_client_set_at_risk(NULL, 100), DLOCK_EINVAL);
    CHECK_RC(dlock_client_set_at_risk(c, -1), DLOCK_EINVAL);
    CHECK_OK(dlock_client_set_at_risk(c, 0));
    CHECK_RC(dlock_client_at_risk_max(NULL, 1000, &m), DLOCK_EINVAL);
    CHECK_RC(dlock_client_at_risk_max(c, 1000, NULL), DLOCK_EINVAL);
    CHECK_RC(dlock_client_at_risk_max(c, DLOCK_TTL_MIN - 1, &m),
             DLOCK_EINVAL);
    CHECK_OK(dlock_client_at_risk_max(c, 3000, &m));
    if (no_lease()) {
        CHECK_EQ(m, INT64_MAX); /* no lease: nothing to be at risk */
    } else if (!strcmp(S.kind, "zk")) {
        /* a third of the granted session timeout (3 s: the private
         * server grants 400 ms to 60 s) less the drift margin */
        CHECK_EQ(m, 3000 / 3 - (3000 / 100 + 2));
    } else if (!strcmp(S.kind, "etcd")) {
        CHECK_EQ(m, 3000 / 6); /* a sixth of the granted 3 s lease */
    } else if (!strcmp(S.kind, "redlock")) {
        /* 2/3 of the ttl less Redlock's own drift margin (?drift_factor,
         * ?drift_ms): at most what the plain margin leaves */
        CHECK_OP(m, <=, 2000 - (3000 / 100 + 2));
        CHECK_OP(m, >, 0);
    } else {
        CHECK_EQ(m, 2000 - (3000 / 100 + 2)); /* 2/3 ttl - drift */
    }
    /* a very short ttl leaves little or nothing, never a negative */
    CHECK_OK(dlock_client_at_risk_max(c, DLOCK_TTL_MIN, &m));
    CHECK_OP(m, >=, 0);
    dlock_client_close(c);
}

/* The store stops answering: AT_RISK comes at the hold's at-risk moment
 * and LOST at its local lease end, although the renewal in progress was
 * given 10 s. */
TEST(at_risk_then_lost_on_time_while_the_store_is_frozen)
{
    NEED_LEASE();
    th_events s;
    int64_t ttl = ttl_of(), margin = 0;
    dlock_client *c = risk_client(&s, ttl, &margin);
    dlock *l = th_handle(c, "risk/frozen", ttl, 0, 0);

    CHECK_OK(dlock_acquire(l, 0));
    /* a renewal or two first: the lease is the watchdog's from here */
    th_sleep_ms(ttl / 2);
    CHECK_EQ(th_events_count(&s, DLOCK_EVENT_AT_RISK), 0);
    freeze();
    /* (SQLite: once another process holds the write lock; no renewal
     * gets through after this) */
    int64_t frozen_at = th_now_ms();
    int risk = th_events_wait(&s, DLOCK_EVENT_AT_RISK, ttl + 10000);
    int lost = th_events_wait(&s, DLOCK_EVENT_LOST, ttl + 10000);
    thaw();
    CHECK_OP(risk, >=, 0);
    CHECK_OP(lost, >, risk);
    pthread_mutex_lock(&s.mu);
    /* on time: the lease the event reports is at most the margin
     * (it comes at the at-risk moment, not before), and it came within a
     * second of that moment (the background thread's scheduling on a
     * busy machine, valgrind included; a renewal left to its 10 s would
     * be far later) */
    CHECK_OP(s.left[risk], <=, margin);
    CHECK_OP(s.left[risk], >=, margin - 1000);
    /* the loss at the end of the lease the event announced, within the
     * same second */
    CHECK_OP(s.at[lost], <=, s.at[risk] + s.left[risk] + 1000);
    /* and that end is at most one ttl after the freeze (the last
     * renewal came before it; ZooKeeper: the client notices a silent
     * server after 2/3 of the session, then loses its holds a third
     * later; etcd: 2/3 of the lease after its last keepalive) */
    CHECK_OP(s.at[lost], <=, frozen_at + ttl + 1000);
    printf("     (margin %lld ms: at risk %lld ms after the freeze with "
           "%lld ms left, lost %lld ms after it)\n",
           (long long)margin, (long long)(s.at[risk] - frozen_at),
           (long long)s.left[risk], (long long)(s.at[lost] - frozen_at));
    if (!strcmp(S.kind, "zk"))
        CHECK_CONTAINS(s.why[risk], "connection to ZooKeeper is down");
    else if (!strcmp(S.kind, "etcd"))
        CHECK_CONTAINS(s.why[risk], "keepalive");
    else
        CHECK_CONTAINS(s.why[risk], "renewal failed");
    CHECK_CONTAINS(s.why[risk], "risk/frozen");
    pthread_mutex_unlock(&s.mu);
    CHECK_EQ(th_events_count(&s, DLOCK_EVENT_SAFE), 0);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    dlock_close(l);
    dlock_client_close(c);
}

/* The store answers again before the lease ends: SAFE, and the hold is
 * still ours. */
TEST(safe_when_a_renewal_gets_through_in_time)
{
    NEED_LEASE();
    th_events s;
    int64_t ttl = ttl_of(), margin = 0;
    dlock_client *c = risk_client(&s, ttl, &margin);
    dlock *l = th_handle(c, "risk/safe", ttl, 0, 0);

    CHECK_OK(dlock_acquire(l, 0));
    th_sleep_ms(ttl / 2);
    freeze();
    int risk = th_events_wait(&s, DLOCK_EVENT_AT_RISK, ttl + 10000);
    thaw(); /* at once: the margin is the time a renewal still has */
    CHECK_OP(risk, >=, 0);
    /* the renewal's next try (a tenth of the ttl later; etcd: a
     * twelfth; ZooKeeper: the reconnection) gets through before the
     * lease ends, a margin (hundreds of ms) after the event; 10 s covers
     * a busy machine, and then LOST would have come first */
    int safe = th_events_wait(&s, DLOCK_EVENT_SAFE, 10000);
    CHECK_OP(safe, >, risk);
    CHECK_EQ(th_events_count(&s, DLOCK_EVENT_LOST), 0);
    pthread_mutex_lock(&s.mu);
    CHECK_OP(s.left[safe], >, margin); /* past the margin again */
    pthread_mutex_unlock(&s.mu);
    CHECK_OP(dlock_token(l), >, 0);
    CHECK_OK(dlock_release(l));
    CHECK_EQ(th_events_count(&s, DLOCK_EVENT_AT_RISK), 1);
    dlock_close(l);
    dlock_client_close(c);
}

/* A hold nobody renews is at risk before its natural end, and says why. */
TEST(a_hold_not_renewed_is_at_risk_before_its_end)
{
    if (!S.lease_runs_out && strcmp(S.kind, "etcd") != 0) {
        printf("     (no lease runs out on this store)\n");
        return;
    }
    th_events s;
    int64_t ttl = ttl_of(), margin = 0;
    dlock_client *c = risk_client(&s, ttl, &margin);
    dlock *l = th_handle(c, "risk/norenew", ttl, DLOCK_NO_RENEW, 0);

    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_acquire(l, 0));
    int risk = th_events_wait(&s, DLOCK_EVENT_AT_RISK, ttl + 10000);
    int lost = th_events_wait(&s, DLOCK_EVENT_LOST, ttl + 10000);
    CHECK_OP(risk, >=, 0);
    CHECK_OP(lost, >, risk);
    pthread_mutex_lock(&s.mu);
    CHECK_CONTAINS(s.why[risk], "DLOCK_NO_RENEW");
    /* at its moment (within a second, as above), not before */
    CHECK_OP(s.left[risk], <=, margin);
    CHECK_OP(s.left[risk], >=, margin - 1000);
    /* the lease ends one ttl after the acquisition at most */
    CHECK_OP(s.at[risk] + s.left[risk], <=, t0 + ttl + 1000);
    pthread_mutex_unlock(&s.mu);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    dlock_close(l);
    dlock_client_close(c);
}

/* With a margin, the watchdog renews often enough that a renewal and a
 * retry fit before the at-risk moment: at 2/3 of the ttl less the drift,
 * every sixth of the ttl instead of every third. */
TEST(a_margin_makes_renewals_more_frequent)
{
    if (!S.lease_runs_out) {
        printf("     (the watchdog renews no lease on this store)\n");
        return;
    }
    dlock_client *c = client();
    int64_t ttl = 600, margin = 0;
    CHECK_OK(dlock_client_at_risk_max(c, ttl, &margin));
    CHECK_OK(dlock_client_set_at_risk(c, margin));
    dlock *l = th_handle(c, "risk/cadence", ttl, 0, 0);
    dlock_stats st;

    CHECK_OK(dlock_acquire(l, 0));
    th_sleep_ms(4000);
    CHECK_OK(dlock_stats_get(c, "risk/cadence", &st, sizeof(st)));
    CHECK_OK(dlock_release(l));
    /* every 100 ms: 40 renewals in 4 s; at ttl/3 (200 ms) at most 21.
     * A busy machine delays renewals (fewer, never more): 28 leaves it
     * 30% */
    CHECK_OP(st.renewed, >=, 28);
    dlock_close(l);
    dlock_client_close(c);
}

static const th_test tests[] = {
    T(bad_margins_and_what_fits),
    TP(at_risk_then_lost_on_time_while_the_store_is_frozen),
    TP(safe_when_a_renewal_gets_through_in_time),
    T(a_hold_not_renewed_is_at_risk_before_its_end),
    T(a_margin_makes_renewals_more_frequent),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    return th_store_main(argc, argv, &S, tests, NULL);
}
