/* SPDX-License-Identifier: MIT */
/*
 * test_redlock.c -- what only the Redlock store (redlock://) does, and how
 * it fails: five private redis-servers (no persistence) of which some are
 * killed (SIGKILL), frozen (SIGSTOP) or restarted empty while locks are
 * taken, held, renewed, waited for and released.
 *
 *   - 2 of 5 down: every operation still works (a quorum is 3);
 *   - 3 of 5 down or frozen: DLOCK_ECONN that names the quorum, at once or
 *     within the node timeout, never a success; a hold made before is
 *     reported lost when its lease runs out;
 *   - a frozen node costs at most the node timeout, never the sum of them,
 *     round after round; its late replies do no harm;
 *   - release and extend count the keys still ours: a quorum, or the hold
 *     was lost;
 *   - a node restarted empty: the holder puts its key back; the worst case
 *     (a bare quorum, one of it restarted after the documented delay)
 *     keeps mutual exclusion;
 *   - fencing tokens grow across faults and across nodes whose counters
 *     differ; six processes fighting (split votes), also while nodes
 *     freeze and thaw, keep exclusion and all make progress;
 *   - bad URIs, passwords, DLOCK_FAIR, a ttl too short for the node
 *     timeout.
 *
 * The node timeout (?node_timeout=250 in the URI, not the default 50 ms)
 * is the longest a node's answer may take before its round counts it as
 * failed; too many failed nodes end the operation with DLOCK_ECONN, as
 * documented. On a busy 2-core machine (five redis-servers, the test's
 * processes, other tests or stress-ng) a node is now and then not
 * scheduled for more than 50 ms, sometimes several at once: with the
 * default, an operation then fails although every node is up (seen under
 * stress-ng --cpu 2: "cannot acquire: 1 of 5 nodes answered ... no answer
 * within 50 ms"). What these tests check is not how fast a loaded machine
 * schedules, so they allow 250 ms (`slack`, the file's allowance for a
 * few round trips on a loaded machine). That makes such failures rare,
 * not impossible (single nodes were seen silent for 250 ms); the 1,500
 * hand-offs, the most exposed, repeat an acquire that fails so, a few
 * times at most. The tests about the node timeout itself set their own
 * (1 s); the contract suite (test_contract.c) uses 250 ms too, the CLI's
 * test the default.
 *
 * Under valgrind (DLOCK_TEST_VALGRIND=1) nodes answer far slower: leases
 * and bounds are longer.
 *
 * Past 1,000 lines on purpose: a list of independent scenarios (one
 * function each, run by name through the harness, any one alone with a
 * filter); the tests are split by store, not by size.
 */
#include "test.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#define NN 5 /* nodes; quorum 3 */

static th_redis node[NN];
static int down[NN]; /* 0 up, 1 killed, 2 frozen */
static char hosts[512]; /* "127.0.0.1:P0,...,127.0.0.1:P4" */
static char uri[1024];
static int slow;         /* under valgrind */
static int64_t nt;       /* the node timeout in uri (see the top) */
static int64_t slack;    /* a few round trips on a loaded machine */
static int64_t short_ttl;

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static dlock_client *client(void)
{
    return th_client(uri, NULL);
}

static void kill_node(int i)
{
    th_redis_kill(&node[i], SIGKILL);
    down[i] = 1;
}

static void stop_node(int i)
{
    th_redis_kill(&node[i], SIGSTOP);
    down[i] = 2;
}

static void cont_node(int i)
{
    th_redis_kill(&node[i], SIGCONT);
    down[i] = 0;
}

/* Starts a killed node again on its port: empty (no persistence). */
static void restart_node(int i)
{
    th_redis_restart(&node[i]);
    down[i] = 0;
}

/* After nodes died or came back: lets the clients' connections to them
 * go idle long enough (the store looks for a connection the server closed
 * only when it has been idle for 200 ms; one used just before the node
 * died fails its next round, as on redis://, and three such nodes fail a
 * try with DLOCK_ECONN even though a reconnect would reach them). */
static void settle(void)
{
    th_sleep_ms(250);
}

/* Every node up and running again. */
static void heal(void)
{
    for (int i = 0; i < NN; i++) {
        if (down[i] == 2)
            cont_node(i);
        else if (down[i] == 1)
            restart_node(i);
    }
}

/* The URI of the five nodes with a query string (or none). */
static const char *uri_with(char *buf, size_t cap, const char *query)
{
    snprintf(buf, cap, "redlock://%s%s", hosts, query ? query : "");
    return buf;
}

/* The lock key of `name` on node i exists (1) or not (0). */
static int key_on(int i, const char *name)
{
    return (int)th_redis_cmd(&node[i], NULL, 0, "EXISTS dlock:{%s}", name);
}

/* Waits (at most `ms`) until the key of `name` exists on every node that
 * is up; fails the test if it does not. */
static void wait_keys_everywhere(const char *name, int64_t ms)
{
    int64_t until = th_now_ms() + ms;
    int all;

    do {
        all = 1;
        for (int i = 0; i < NN; i++)
            if (!down[i] && !key_on(i, name))
                all = 0;
        if (!all)
            th_sleep_ms(5);
    } while (!all && th_now_ms() < until);
    CHECK(all);
}

/* Waits (at most `ms`) until no node that is up has the key of `name`;
 * returns 1 when none has. */
static int wait_keys_gone(const char *name, int64_t ms)
{
    int64_t until = th_now_ms() + ms;
    int any;

    do {
        any = 0;
        for (int i = 0; i < NN; i++)
            if (!down[i] && key_on(i, name))
                any = 1;
        if (any)
            th_sleep_ms(10);
    } while (any && th_now_ms() < until);
    return !any;
}

/* The fencing counter of `name` on node i (0: none). */
static unsigned long long counter_on(int i, const char *name)
{
    char v[64];

    th_redis_cmd(&node[i], v, sizeof(v), "GET dlock:{%s}:f", name);
    return strtoull(v, NULL, 10);
}

static void set_counter(int i, const char *name, unsigned long long v)
{
    char num[32], out[64];

    snprintf(num, sizeof(num), "%llu", v);
    th_redis_cmd(&node[i], out, sizeof(out), "SET dlock:{%s}:f %s", name,
                 num);
    CHECK_STR(out, "OK");
}

/* Nodes that have a subscriber on the release channel of `name`. */
static int subscribed_nodes(const char *name)
{
    char ch[700];
    int n = 0;

    snprintf(ch, sizeof(ch), "dlock:{%s}:w:0", name);
    for (int i = 0; i < NN; i++) {
        if (down[i])
            continue;
        /* PUBSUB NUMSUB answers [channel, count]: read the count */
        long long k = th_redis_cmd(
            &node[i], NULL, 0, "EVAL %s 0 %s",
            "return redis.call('PUBSUB', 'NUMSUB', ARGV[1])[2]", ch);
        n += k > 0;
    }
    return n;
}

typedef struct lost_rec {
    volatile int seen;
    volatile int64_t at;
    volatile uint64_t token;
} lost_rec;

static void record_lost(dlock *l, uint64_t token, void *arg)
{
    lost_rec *r = arg;

    (void)l;
    r->at = th_now_ms();
    r->token = token;
    __atomic_store_n(&r->seen, 1, __ATOMIC_SEQ_CST);
}

/* The waiter's acquire returned `code` (its own message if not). */
#define CHECK_WAITER(w, code)                                               \
    do {                                                                    \
        if ((w).rc != (code))                                               \
            th_fail(__FILE__, __LINE__, "waiter: %s, expected %s: %s",  \
                    dlock_errname((w).rc), dlock_errname(code), (w).msg);   \
    } while (0)

/* A hold by the calling thread: acquired within `wait`, token above
 * `last`, released; returns the token. Failures name the caller's line. */
static uint64_t hold_once_at(int line, dlock *l, int64_t wait, uint64_t last)
{
    int rc = dlock_acquire(l, wait);

    if (rc != DLOCK_OK)
        th_fail(__FILE__, line, "acquire returned %s: %s", dlock_errname(rc),
                dlock_errmsg());
    uint64_t tok = dlock_token(l);
    if (tok <= last)
        th_fail(__FILE__, line, "token %llu after %llu",
                (unsigned long long)tok, (unsigned long long)last);
    rc = dlock_release(l);
    if (rc != DLOCK_OK)
        th_fail(__FILE__, line, "release returned %s: %s", dlock_errname(rc),
                dlock_errmsg());
    return tok;
}
#define hold_once(l, wait, last) hold_once_at(__LINE__, l, wait, last)

/* ------------------------------------------------------------------------ */
/* Two of five down: a quorum is left                                       */
/* ------------------------------------------------------------------------ */

TEST(two_of_five_killed_still_serve)
{
    dlock_client *a = client(); /* opened with five up */
    kill_node(3);
    kill_node(4);
    dlock_client *b = client(); /* opened with two down */
    dlock *la = th_handle(a, "two-down", 60000, 0, 0);
    dlock *lb = th_handle(b, "two-down", 60000, 0, 0);
    dlock_info info;
    char pid[32];

    /* acquire, busy, a timed wait that waits */
    CHECK_OK(dlock_acquire(la, 0));
    uint64_t tok = dlock_token(la);
    CHECK_OP(tok, >, 0);
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    int64_t t0 = th_now_ms();
    CHECK_RC(dlock_acquire(lb, 300), DLOCK_EBUSY);
    /* a timed wait waits its whole time (less the clock's granularity)
     * and ends at its deadline: the 3 s allow its last try (at most a node
     * timeout) and the scheduling of a loaded machine */
    CHECK_OP(th_now_ms() - t0, >=, 290);
    CHECK_OP(th_now_ms() - t0, <, 300 + 3000);

    /* extend, seen by inspect from the other client */
    CHECK_OK(dlock_extend(la, 20000));
    CHECK_OK(dlock_inspect(b, "two-down", &info));
    CHECK_EQ(info.held, 1);
    snprintf(pid, sizeof(pid), "pid %d", (int)getpid());
    CHECK_CONTAINS(info.holder, pid);
    CHECK_OP(info.ttl_ms, >, 10000);
    CHECK_OP(info.ttl_ms, <=, 20000);
    CHECK_EQ(info.token >> 6, tok >> 6);
    dlock_info_clear(&info);

    /* hand-off a -> b: b waits, subscribed on all three live nodes (it
     * needs N - Q + 1 = 3 so that any quorum includes one of them) */
    th_waiter w = {.l = lb, .wait_ms = 10000, .hold_ms = 300};
    pthread_t th;
    th_waiter_start(&w, &th);
    /* subscribing takes a round trip per node: 5 s is only a bound on
     * the loop */
    int64_t until = th_now_ms() + 5000;
    while (subscribed_nodes("two-down") < 3 && th_now_ms() < until)
        th_sleep_ms(10);
    CHECK_EQ(subscribed_nodes("two-down"), 3);
    th_sleep_ms(100); /* let it reach its sleep (not asserted) */
    CHECK_OK(dlock_release(la));
    /* woken by the release: the lease is 60 s, so a missed wake-up would
     * wait far longer than these 5 s */
    CHECK(th_waiter_returned(&w, 5000) && w.rc == DLOCK_OK);
    /* ... and back b -> a: a waits while b holds for 300 ms */
    int64_t t1 = th_now_ms();
    CHECK_OK(dlock_acquire(la, 10000));
    int64_t back = th_now_ms() - t1;
    pthread_join(th, NULL);
    CHECK_WAITER(w, DLOCK_OK);
    CHECK_OP(w.token, >, tok);
    CHECK_OK(w.release_rc);
    CHECK_OP(dlock_token(la), >, w.token);
    /* a waited for b's 300 ms hold (150: the hold began before a's wait
     * did), and was woken by b's release, not b's 60 s lease */
    CHECK_OP(back, >=, 150);
    CHECK_OP(back, <, 300 + 5000);
    CHECK_OK(dlock_release(la));
    dlock_close(la);

    /* the watchdog keeps a short lease alive for many ttls */
    lost_rec lost = {0, 0, 0};
    la = th_handle_lost(a, "two-down-wd", short_ttl, 0, record_lost, &lost);
    dlock *lw = th_handle(b, "two-down-wd", 0, 0, 0);
    CHECK_OK(dlock_acquire(la, 0));
    tok = dlock_token(la);
    /* five ttls, so the hold lives on renewals alone */
    for (int i = 0; i < 5 * short_ttl / 200; i++) {
        th_sleep_ms(200);
        CHECK_RC(dlock_acquire(lw, 0), DLOCK_EBUSY);
    }
    CHECK_EQ(lost.seen, 0);
    CHECK_EQ(dlock_held(la), 1);
    CHECK_EQ(dlock_token(la), tok);
    CHECK_OK(dlock_release(la));
    CHECK_OK(dlock_acquire(lw, 0));
    CHECK_OK(dlock_release(lw));

    TH_CLOSE(la, lb, lw);
    TH_CLIENT_CLOSE(a, b);
    heal();
}

/* ------------------------------------------------------------------------ */
/* Three of five down: no quorum                                            */
/* ------------------------------------------------------------------------ */

static void check_names_quorum(const char *msg, int dead)
{
    char where[64];

    CHECK_CONTAINS(msg, "quorum 3");
    snprintf(where, sizeof(where), "127.0.0.1:%d", node[dead].port);
    CHECK_CONTAINS(msg, where);
}

TEST(three_of_five_killed_fail_and_the_hold_is_lost)
{
    int64_t ttl = slow ? 2500 : 1000;
    lost_rec lost = {0, 0, 0};
    dlock_client *a = client(), *b = client();
    dlock *la = th_handle_lost(a, "three-down", ttl, 0, record_lost, &lost);
    dlock *lb = th_handle(b, "three-down", 0, 0, 0);
    dlock *lo = th_handle(b, "three-down-other", 0, 0, 0);

    int64_t t_acq = th_now_ms();
    CHECK_OK(dlock_acquire(la, 0));
    uint64_t tok = dlock_token(la);
    kill_node(2);
    kill_node(3);
    kill_node(4);

    for (int i = 0; i < 3; i++) {
        /* killed nodes refuse connections: DLOCK_ECONN at once, within
         * one round (a node timeout) and a loaded machine's slack; a wait
         * ends with it at once or at its deadline, never later */
        int64_t t0 = th_now_ms();
        CHECK_RC(dlock_acquire(lo, 0), DLOCK_ECONN);
        check_names_quorum(dlock_errmsg(), 2 + i);
        CHECK_OP(th_now_ms() - t0, <, nt + slack);
        /* a wait retries until its deadline (docs/design.md, "Waiting
         * through failovers and restarts") and ends with the last
         * cause: a try's (the quorum) or an arm's (the nodes that
         * confirmed its notifications) */
        t0 = th_now_ms();
        CHECK_RC(dlock_acquire(lo, 500), DLOCK_ECONN);
        CHECK_CONTAINS(dlock_errmsg(), "until the wait's deadline");
        CHECK(strstr(dlock_errmsg(), "quorum 3") ||
              strstr(dlock_errmsg(), "3 needed"));
        CHECK_OP(th_now_ms() - t0, >=, 500);
        CHECK_OP(th_now_ms() - t0, <, 500 + nt + slack);
        /* the held lock too: a failure, never a success nor EBUSY */
        CHECK_RC(dlock_acquire(lb, 500), DLOCK_ECONN);
    }
    /* a new client cannot connect to a quorum */
    dlock_client *c = NULL;
    CHECK_RC(dlock_client_open(&c, uri, NULL), DLOCK_ECONN);
    CHECK_CONTAINS(dlock_errmsg(), "quorum 3");
    CHECK(c == NULL);
    /* the holder cannot extend */
    int rc = dlock_extend(la, ttl);
    CHECK(rc == DLOCK_ECONN || rc == DLOCK_ELOST);

    /* the hold is reported lost when its lease runs out on the local
     * clock (the watchdog's renewals find no quorum): not before half
     * the ttl (the lease ends at ttl less the drift allowance; a loose
     * bound that still tells it from a loss at the first failed renewal,
     * ttl/3), and within the ttl, the background thread's scheduling
     * (slack) and a renewal's round in flight at the lease end (1 s); the
     * loop's own bound is looser still */
    int64_t until = t_acq + 3 * ttl + 5000;
    while (!lost.seen && th_now_ms() < until)
        th_sleep_ms(10);
    CHECK_EQ(lost.seen, 1);
    CHECK_EQ(lost.token, tok);
    CHECK_OP(lost.at - t_acq, >=, ttl / 2);
    CHECK_OP(lost.at - t_acq, <, ttl + slack + 1000);
    CHECK_EQ(dlock_held(la), DLOCK_ELOST);
    CHECK_EQ(dlock_token(la), 0);
    CHECK_RC(dlock_release(la), DLOCK_ELOST);

    /* back: the three come back empty; their counters continue from the
     * clock, so tokens keep growing */
    heal();
    CHECK_OK(dlock_acquire(lb, 5000));
    CHECK_OP(dlock_token(lb), >, tok);
    CHECK_OK(dlock_release(lb));
    hold_once(lo, 0, 0);
    TH_CLOSE(la, lb, lo);
    TH_CLIENT_CLOSE(a, b);
}

TEST(three_of_five_frozen_fail_within_the_node_timeout)
{
    char u[1100], q[64];
    /* a long node timeout: a sequential implementation would take three
     * of them */
    int64_t ntl = slow ? 2000 : 1000;
    snprintf(q, sizeof(q), "?node_timeout=%lld", (long long)ntl);
    dlock_client *c = th_client(uri_with(u, sizeof(u), q), NULL);
    dlock *l = th_handle(c, "three-frozen", 0, 0, 0);

    hold_once(l, 0, 0);
    stop_node(0);
    stop_node(2);
    stop_node(4);
    int64_t t0 = th_now_ms();
    CHECK_RC(dlock_acquire(l, 0), DLOCK_ECONN);
    int64_t took = th_now_ms() - t0;
    CHECK_CONTAINS(dlock_errmsg(), "quorum 3");
    CHECK_CONTAINS(dlock_errmsg(), "no answer within");
    /* the nodes are asked at once: one node timeout, and the quiet
     * release after it (slack each); asked one after another it would be
     * three node timeouts */
    CHECK_OP(took, <, ntl + 2 * slack);
    t0 = th_now_ms();
    CHECK_RC(dlock_acquire(l, 500), DLOCK_ECONN);
    /* a wait cuts the round short at its deadline */
    CHECK_OP(th_now_ms() - t0, <, 500 + 2 * slack);
    cont_node(0);
    cont_node(2);
    cont_node(4);
    /* connections still owing answers are replaced: the next try works */
    hold_once(l, 2000, 0);
    dlock_close(l);
    dlock_client_close(c);
}

/* ------------------------------------------------------------------------ */
/* A frozen node                                                            */
/* ------------------------------------------------------------------------ */

TEST(frozen_nodes_cost_at_most_a_node_timeout)
{
    char u[1100], q[64];
    int64_t ntl = slow ? 2000 : 1000;
    snprintf(q, sizeof(q), "?node_timeout=%lld", (long long)ntl);
    dlock_client *a = client(), *b = client();
    dlock_client *lc = th_client(uri_with(u, sizeof(u), q), NULL);
    dlock *la = th_handle(a, "frozen-node", 0, 0, 0);
    dlock *lb = th_handle(b, "frozen-node", 0, 0, 0);
    dlock *ll = th_handle(lc, "frozen-node", 0, 0, 0);
    /* pauses shorter and longer than the node timeout */
    const int64_t pause_ms[] = {0, 5, 25, 60, nt / 2, 0, 1, 80, 0, nt + 50};
    /* around the long node timeout (1 s, 2 s under valgrind) */
    const int64_t long_pause[] = {0, 50, ntl + 100, 0, 300, 0};
    uint64_t last = 0;
    int64_t worst = 0;

    stop_node(1);
    /* one after another, with pauses shorter and longer than the node
     * timeout: the frozen node still owes replies, or its connection is
     * replaced */
    for (int i = 0; i < 10; i++) {
        dlock *l = i % 2 ? la : lb;
        int64_t t0 = th_now_ms();
        last = hold_once(l, 0, last);
        int64_t took = th_now_ms() - t0;
        if (took > worst)
            worst = took;
        th_sleep_ms(pause_ms[i]);
    }
    /* the contract: a frozen node costs at most one node timeout per
     * operation (in fact nothing, the four others make the quorum), plus
     * a loaded machine's slack; never the node timeout again and again */
    CHECK_OP(worst, <, nt + slack);
    /* with a 1 s node timeout and two nodes frozen, a try still ends when
     * the three others have answered: not after the node timeout, nor
     * after the sum of two */
    stop_node(3);
    worst = 0;
    for (int i = 0; i < 6; i++) {
        int64_t t0 = th_now_ms();
        last = hold_once(ll, 0, last);
        int64_t took = th_now_ms() - t0;
        if (took > worst)
            worst = took;
        th_sleep_ms(long_pause[i]);
    }
    /* half the node timeout: far above three round trips on a loaded
     * machine, far below the node timeout a slower rule would cost */
    CHECK_OP(worst, <, ntl / 2);
    cont_node(3);

    /* waiting and hand-off with a node frozen */
    CHECK_OK(dlock_acquire(lb, 0));
    CHECK_OP(dlock_token(lb), >, last);
    last = dlock_token(lb);
    th_waiter w = {.l = la, .wait_ms = 10000};
    pthread_t th;
    th_waiter_start(&w, &th);
    th_sleep_ms(200);
    CHECK_OK(dlock_release(lb));
    pthread_join(th, NULL);
    CHECK_WAITER(w, DLOCK_OK);
    CHECK_OK(w.release_rc);
    CHECK_OP(w.token, >, last);
    /* woken by the release after 200 ms, not by the end of the default
     * 30 s lease; 3 s for a loaded machine */
    CHECK_OP(w.took, <, 200 + 3000);
    last = w.token;

    /* the watchdog keeps a short lease with a node frozen */
    lost_rec lost = {0, 0, 0};
    dlock *lw = th_handle_lost(a, "frozen-node-wd", short_ttl, 0, record_lost,
                          &lost);
    dlock *lx = th_handle(b, "frozen-node-wd", 0, 0, 0);
    CHECK_OK(dlock_acquire(lw, 0));
    for (int i = 0; i < 4 * short_ttl / 200; i++) { /* four ttls */
        th_sleep_ms(200);
        CHECK_RC(dlock_acquire(lx, 0), DLOCK_EBUSY);
    }
    CHECK_EQ(lost.seen, 0);
    dlock_info info;
    int64_t t0 = th_now_ms();
    /* 4 of 5 answer; inspect waits for all, so the frozen one costs
     * exactly one node timeout */
    CHECK_OK(dlock_inspect(b, "frozen-node-wd", &info));
    CHECK_OP(th_now_ms() - t0, <, nt + slack);
    CHECK_EQ(info.held, 1);
    dlock_info_clear(&info);
    CHECK_OK(dlock_release(lw));

    /* thawed: it answers everything it owed, late; nothing breaks (the
     * 50 ms let its late answers arrive, not asserted) */
    cont_node(1);
    th_sleep_ms(50);
    worst = 0;
    for (int i = 0; i < 6; i++) {
        dlock *l = i % 2 ? la : lb;
        int64_t t0b = th_now_ms();
        last = hold_once(l, 0, last);
        if (th_now_ms() - t0b > worst)
            worst = th_now_ms() - t0b;
        th_sleep_ms(pause_ms[i]);
    }
    CHECK_OP(worst, <, nt + slack); /* as above */
    hold_once(lx, 0, 0);
    hold_once(ll, 0, last);
    /* its late commands left no key behind on any node, and the lock is
     * free for everybody */
    CHECK(wait_keys_gone("frozen-node", 1000));
    CHECK(wait_keys_gone("frozen-node-wd", 1000));
    CHECK_OK(dlock_inspect(b, "frozen-node", &info));
    CHECK_EQ(info.held, 0);
    CHECK_OP(info.token >> 6, >=, last >> 6);
    dlock_info_clear(&info);

    TH_CLOSE(la, lb, ll, lw, lx);
    TH_CLIENT_CLOSE(a, b, lc);
}

TEST(late_answers_do_no_harm)
{
    dlock_client *a = client(), *b = client(), *c = client();
    dlock *la = th_handle(a, "late", 10000, 0, 0),
          *lb = th_handle(b, "late", 10000, 0, 0);
    dlock_info info;

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t ta = dlock_token(la);
    wait_keys_everywhere("late", 2000);
    /* frozen during the hold: its answers to the extend, the release and
     * b's acquire come after the quorum decided each */
    stop_node(2);
    /* the pauses of a node timeout (+20 ms) make node 2's connection one
     * that owes answers for longer than the node timeout: replaced, not
     * waited for (a timing choice, not a bound) */
    CHECK_OK(dlock_extend(la, 10000));
    th_sleep_ms(nt + 20);
    CHECK_OK(dlock_extend(la, 10000));
    CHECK_OK(dlock_release(la));
    th_sleep_ms(nt + 20);
    CHECK_OK(dlock_acquire(lb, 0));
    uint64_t tb = dlock_token(lb);
    CHECK_OP(tb, >, ta);
    cont_node(2);
    th_sleep_ms(100); /* its late answers and commands arrive */
    CHECK_EQ(th_redis_cmd(&node[2], NULL, 0, "PING"), 0);

    /* b still holds it, on a quorum; inspect's token is the highest
     * counter among b's keys, where node 2's late one counts too (it may
     * be a little above b's own: docs/redlock.md) */
    CHECK_OK(dlock_inspect(c, "late", &info));
    CHECK_EQ(info.held, 1);
    CHECK_OP(info.token >> 6, >=, tb >> 6);
    CHECK_OP(info.token >> 6, <, (tb >> 6) + 1000000);
    dlock_info_clear(&info);
    CHECK_EQ(dlock_held(lb), 1);
    dlock *lc = th_handle(c, "late", 0, 0, 0);
    CHECK_RC(dlock_acquire(lc, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_extend(lb, 10000));
    CHECK_OK(dlock_release(lb));
    CHECK(wait_keys_gone("late", 1000));
    CHECK_OK(dlock_inspect(c, "late", &info));
    CHECK_EQ(info.held, 0);
    dlock_info_clear(&info);
    /* a's late release did not free another hold, and tokens go on */
    CHECK_OK(dlock_acquire(la, 0));
    CHECK_OP(dlock_token(la), >, tb);
    CHECK_RC(dlock_acquire(lc, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_release(la));
    hold_once(lc, 0, tb);
    TH_CLOSE(la, lb, lc);
    TH_CLIENT_CLOSE(a, b, c);
}

/* ------------------------------------------------------------------------ */
/* Keys lost on some nodes                                                  */
/* ------------------------------------------------------------------------ */

static void del_on(int i, const char *name)
{
    CHECK_EQ(th_redis_cmd(&node[i], NULL, 0, "DEL dlock:{%s}", name), 1);
}

TEST(release_and_extend_need_a_quorum_of_keys)
{
    dlock_client *a = client();
    /* no watchdog: nothing puts keys back behind the test's back */
    dlock *l = th_handle(a, "keys", 30000, DLOCK_NO_RENEW, 0);

    /* two keys gone: three are ours, the release is a success */
    CHECK_OK(dlock_acquire(l, 0));
    wait_keys_everywhere("keys", 2000);
    del_on(0, "keys");
    del_on(1, "keys");
    CHECK_OK(dlock_release(l));
    CHECK(wait_keys_gone("keys", 1000));

    /* three gone: not ours on a quorum, the hold was lost */
    CHECK_OK(dlock_acquire(l, 0));
    wait_keys_everywhere("keys", 2000);
    del_on(0, "keys");
    del_on(2, "keys");
    del_on(4, "keys");
    CHECK_RC(dlock_release(l), DLOCK_ELOST);

    /* extend with two gone: three are ours, a success */
    CHECK_OK(dlock_acquire(l, 0));
    wait_keys_everywhere("keys", 2000);
    del_on(1, "keys");
    del_on(3, "keys");
    CHECK_OK(dlock_extend(l, 30000));
    CHECK_EQ(dlock_held(l), 1);
    CHECK_OK(dlock_release(l));
    CHECK(wait_keys_gone("keys", 1000));

    /* ... with three gone: the hold is lost */
    CHECK_OK(dlock_acquire(l, 0));
    wait_keys_everywhere("keys", 2000);
    del_on(0, "keys");
    del_on(1, "keys");
    del_on(3, "keys");
    CHECK_RC(dlock_extend(l, 30000), DLOCK_ELOST);
    CHECK_EQ(dlock_held(l), DLOCK_ELOST);
    CHECK_RC(dlock_release(l), DLOCK_ELOST);
    hold_once(l, 0, 0);
    dlock_close(l);
    dlock_client_close(a);
}

/* ------------------------------------------------------------------------ */
/* Nodes restarted empty                                                    */
/* ------------------------------------------------------------------------ */

TEST(restarted_node_gets_the_key_back)
{
    int64_t ttl = slow ? 3000 : 900;
    dlock_client *a = client(), *b = client();
    dlock *la = th_handle(a, "restarted", ttl, 0, 0);
    dlock *lb = th_handle(b, "restarted", ttl, 0, 0);
    char v1[512], v0[512];

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t tok = dlock_token(la);
    wait_keys_everywhere("restarted", 2000);
    th_redis_cmd(&node[1], v1, sizeof(v1), "GET dlock:{restarted}");
    CHECK(strchr(v1, ' ') != NULL);
    *strchr(v1, ' ') = '\0'; /* the owner */

    /* a waiter in b, subscribed on the nodes; one of them restarts */
    th_waiter w = {.l = th_handle(b, "restarted", ttl, 0, 0),
                   .wait_ms = 20000};
    pthread_t th;
    th_waiter_start(&w, &th);
    th_sleep_ms(200); /* let it subscribe (not asserted) */
    kill_node(0);
    restart_node(0); /* at once, empty */

    /* the lock is free on one node only: nobody else gets a quorum (five
     * tries over half a ttl, across the holder's renewals) */
    for (int i = 0; i < 5; i++) {
        CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
        th_sleep_ms(ttl / 10);
    }
    /* the holder's renewals put its key back on the restarted node (a
     * renewal repairs the nodes that said "missing" before its quorum
     * was reached: not always the first one). The watchdog renews every
     * ttl/3: 4 ttls are a dozen renewals, and the key is back after the
     * first that hears node 0 say "missing" */
    int64_t until = th_now_ms() + 4 * ttl + slack;
    int back = 0;
    while (!back && th_now_ms() < until) {
        th_redis_cmd(&node[0], v0, sizeof(v0), "GET dlock:{restarted}");
        back = strncmp(v0, v1, strlen(v1)) == 0 && v0[strlen(v1)] == ' ';
        if (!back)
            th_sleep_ms(10);
    }
    CHECK(back);
    CHECK_OP(th_redis_cmd(&node[0], NULL, 0, "PTTL dlock:{restarted}"), >,
             0);
    CHECK_RC(dlock_acquire(lb, 0), DLOCK_EBUSY);
    CHECK_EQ(dlock_held(la), 1);

    /* the waiter re-subscribed after losing its subscriber connection to
     * the restarted node: the release still wakes it. (The bound only
     * says it got the lock soon: a missed wake-up would cost the rest of
     * the 900 ms lease, also under 3 s; hand_offs_never_wait_out_the_lease
     * is the test that tells the two apart.) */
    th_sleep_ms(100); /* its re-subscription (not asserted) */
    int64_t released = th_now_ms();
    CHECK_OK(dlock_release(la));
    pthread_join(th, NULL);
    CHECK_WAITER(w, DLOCK_OK);
    CHECK_OK(w.release_rc);
    CHECK_OP(w.token, >, tok);
    CHECK_OP(th_now_ms() - released, <, 3000);
    hold_once(lb, 0, w.token);
    dlock_close(w.l);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

/*
 * The worst case for a restart without persistence: the holder's key is
 * on exactly a bare quorum, nodes {0, 1, 2} (deleted by hand from 3 and 4,
 * as if they had missed the acquisition), and node 0 crashes. Node 0 comes
 * back only after the lease's ttl (antirez's delayed restart): by then the
 * holder's lease has run out on its local clock (its renewals find keys on
 * 1 and 2 only: no quorum), so it has been told it lost before anybody
 * else can win {0, 3, 4}. Both sides write down what they believed and
 * when; their beliefs must not overlap.
 *
 * Without the delay (node 0 restarted at once, empty), a contender wins
 * {0, 3, 4} at once while the holder still believes in its lease: its next
 * renewal (up to ttl/3 later) finds three keys that are not its own
 * (DLOCK_ENOTHELD, then the lost-lock callback), and until then two owners
 * both think they hold the lock. Redlock without persistence is only safe
 * with the delayed restart; fencing tokens still tell the two apart (the
 * contender's is larger). Not asserted here: it is the documented limit.
 */
typedef struct bare {
    volatile int holder_ready, contender_ready, go;
    volatile int64_t acquired_at; /* the holder's acquire returned */
    volatile int64_t last_held;   /* the holder last saw held() == 1 */
    volatile int64_t lost_at;     /* its lost-lock callback ran */
    volatile uint64_t token;
    volatile int release_rc;
    volatile int64_t ok_at; /* the contender's acquire returned DLOCK_OK */
    volatile uint64_t ctoken;
    volatile int crc, crelease_rc, tries, cdone;
    volatile int64_t restarted_at;
    int64_t ttl;
} bare;

static void bare_lost(dlock *l, uint64_t token, void *arg)
{
    bare *s = arg;

    (void)l;
    (void)token;
    if (!s->lost_at)
        s->lost_at = th_now_ms();
}

static int bare_holder(void *arg)
{
    bare *s = arg;
    dlock_client *c = th_client(uri, th_patient());
    dlock *l = th_handle_lost(c, "bare-quorum", s->ttl, 0, bare_lost, s);

    if (dlock_acquire(l, 5000) != DLOCK_OK) {
        fprintf(stderr, "holder: %s\n", dlock_errmsg());
        return 2;
    }
    s->acquired_at = th_now_ms();
    s->token = dlock_token(l);
    __atomic_store_n(&s->holder_ready, 1, __ATOMIC_SEQ_CST);
    /* believes it holds the lock as long as dlock_held() says 1 */
    int64_t until = th_now_ms() + 4 * s->ttl + 10000;
    while (th_now_ms() < until) {
        int64_t t = th_now_ms(); /* taken before the look: conservative */
        if (dlock_held(l) != 1)
            break;
        s->last_held = t;
        th_sleep_ms(1);
    }
    /* the release would free nodes 1 and 2: it waits until the contender
     * has won (with node 0 back) */
    until = th_now_ms() + 4 * s->ttl + 10000;
    while (!s->cdone && th_now_ms() < until)
        th_sleep_ms(1);
    s->release_rc = dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

static int bare_contender(void *arg)
{
    bare *s = arg;
    dlock_client *c;
    dlock *l;

    if (dlock_client_open(&c, uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "bare-quorum", NULL) != DLOCK_OK) {
        fprintf(stderr, "contender: %s\n", dlock_errmsg());
        return 2;
    }
    __atomic_store_n(&s->contender_ready, 1, __ATOMIC_SEQ_CST);
    (void)th_wait_flag(&s->go, 60000);
    int64_t until = th_now_ms() + 4 * s->ttl + 10000;
    int rc = DLOCK_EBUSY;
    while (th_now_ms() < until) {
        /* EBUSY while the holder's key is on 1 and 2 and node 0 is down */
        rc = dlock_acquire(l, 200);
        s->tries++;
        if (rc == DLOCK_OK) {
            s->ok_at = th_now_ms();
            s->ctoken = dlock_token(l);
            break;
        }
        if (rc != DLOCK_EBUSY && rc != DLOCK_ECONN)
            break;
    }
    s->crc = rc;
    __atomic_store_n(&s->cdone, 1, __ATOMIC_SEQ_CST);
    if (rc == DLOCK_OK)
        s->crelease_rc = dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

TEST(delayed_restart_keeps_a_bare_quorum_exclusive)
{
    bare *s = th_shared(sizeof(*s));

    s->ttl = slow ? 6000 : 3000;
    pid_t contender = th_fork(bare_contender, s);
    CHECK(th_wait_flag(&s->contender_ready, 30000));
    pid_t holder = th_fork(bare_holder, s);
    CHECK(th_wait_flag(&s->holder_ready, 30000));
    wait_keys_everywhere("bare-quorum", 2000);

    /* node 0 crashes; 3 and 4 lose the key: the holder's key is left on
     * 1 and 2, of the bare quorum {0, 1, 2}. (Node 0 first: a renewal
     * between the deletions would put the key back on 3 or 4.) The
     * holder's first renewal comes at ttl/3 - ttl/10: all this must
     * happen before it. */
    kill_node(0);
    del_on(3, "bare-quorum");
    del_on(4, "bare-quorum");
    int64_t faults_done = th_now_ms();
    CHECK_OP(faults_done - s->acquired_at, <, s->ttl / 5);
    __atomic_store_n(&s->go, 1, __ATOMIC_SEQ_CST);

    /* the delayed restart: a ttl after the key was lost (plus the test's
     * own scheduling slack), node 0 comes back empty */
    th_sleep_ms(s->ttl + (slow ? 300 : 100)); /* at least a ttl: safety */
    s->restarted_at = th_now_ms();
    restart_node(0);

    CHECK_EQ(th_wait(holder), 0);
    CHECK_EQ(th_wait(contender), 0);
    /* the contender won, with node 0 back (the holder's failing renewals
     * kept its key alive on 1 and 2 until its lease ran out), and a larger
     * token */
    CHECK_OK(s->crc);
    CHECK_OK(s->crelease_rc);
    CHECK_OP(s->ok_at, >, s->restarted_at);
    /* progress: the holder's key on 1 and 2 lives until its lease ends
     * (about a ttl after the faults), node 0 is back after a ttl: the
     * contender wins soon after; 3 ttls and 5 s are only a bound on a
     * loaded machine, exclusion is what is checked */
    CHECK_OP(s->ok_at - faults_done, <, 3 * s->ttl + 5000);
    CHECK_OP(s->ctoken, >, s->token);
    /* the holder was told, before the contender won: no overlap */
    CHECK_OP(s->lost_at, >, 0);
    CHECK_OP(s->lost_at, <=, s->ok_at);
    CHECK_OP(s->last_held, <, s->ok_at);
    CHECK_RC(s->release_rc, DLOCK_ELOST);
}

/* ------------------------------------------------------------------------ */
/* Fencing tokens                                                           */
/* ------------------------------------------------------------------------ */

#define TPROC 3
#define THOLDS 6

typedef struct tok_log {
    volatile int inside, overlaps, failures, n;
    uint64_t tok[TPROC * THOLDS];
} tok_log;

static int token_child(void *arg)
{
    tok_log *s = arg;
    dlock_client *c;
    dlock *l;

    if (dlock_client_open(&c, uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "tokens", NULL) != DLOCK_OK)
        return 2;
    for (int i = 0; i < THOLDS; i++) {
        if (dlock_acquire(l, 60000) != DLOCK_OK) {
            fprintf(stderr, "token child: %s\n", dlock_errmsg());
            __atomic_add_fetch(&s->failures, 1, __ATOMIC_SEQ_CST);
            continue;
        }
        if (__atomic_fetch_add(&s->inside, 1, __ATOMIC_SEQ_CST) != 0)
            __atomic_add_fetch(&s->overlaps, 1, __ATOMIC_SEQ_CST);
        s->tok[s->n] = dlock_token(l); /* in the order of the holds */
        s->n++;
        usleep(200);
        __atomic_sub_fetch(&s->inside, 1, __ATOMIC_SEQ_CST);
        if (dlock_release(l) != DLOCK_OK)
            __atomic_add_fetch(&s->failures, 1, __ATOMIC_SEQ_CST);
    }
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

/* TPROC processes take turns; returns the last token, checked above
 * `last` and strictly increasing in the order of the holds. */
static uint64_t token_round(uint64_t last)
{
    tok_log *s = th_shared(sizeof(*s));
    pid_t pids[TPROC];

    for (int i = 0; i < TPROC; i++)
        pids[i] = th_fork(token_child, s);
    for (int i = 0; i < TPROC; i++)
        CHECK_EQ(th_wait(pids[i]), 0);
    CHECK_EQ(s->failures, 0);
    CHECK_EQ(s->overlaps, 0);
    CHECK_EQ(s->n, TPROC * THOLDS);
    for (int i = 0; i < s->n; i++) {
        CHECK_OP(s->tok[i], >, last);
        last = s->tok[i];
    }
    return last;
}

TEST(fencing_tokens_grow_across_faults_and_split_counters)
{
    dlock_client *a = client(), *b = client();
    dlock *la = th_handle(a, "tokens", 0, 0, 0),
          *lb = th_handle(b, "tokens", 0, 0, 0);
    uint64_t last = token_round(0);

    /* two nodes killed */
    kill_node(0);
    kill_node(1);
    settle();
    for (int i = 0; i < 4; i++)
        last = hold_once(i % 2 ? la : lb, 5000, last);
    /* back, empty: their counters start again from their clocks */
    restart_node(0);
    restart_node(1);
    settle();
    last = token_round(last);
    CHECK_OP(counter_on(0, "tokens"), >, 0);

    /* a split: node 2's counter far above the others. With 3 and 4 down
     * the quorum must be {0, 1, 2}: the token comes from node 2, and the
     * counters of 0 and 1 are raised to it before the acquire returns */
    unsigned long long high = counter_on(2, "tokens") + 1000000000000ULL;
    set_counter(2, "tokens", high);
    kill_node(3);
    kill_node(4);
    settle();
    last = hold_once(la, 5000, last);
    CHECK_EQ(last >> 6, high + 1);
    CHECK_EQ(last & 63, 2);
    CHECK_OP(counter_on(0, "tokens"), >=, high + 1);
    CHECK_OP(counter_on(1, "tokens"), >=, high + 1);
    /* a later hold on another quorum, {0, 1, 3, 4} without node 2 (3 and
     * 4 back empty, their counters far below): larger still */
    restart_node(3);
    restart_node(4);
    kill_node(2);
    settle();
    last = hold_once(lb, 5000, last);
    CHECK_OP(last >> 6, >, high + 1);
    last = hold_once(la, 5000, last);

    /* node 3's counter far below the others: tokens still grow, also on
     * a quorum that must include it ({1, 3, 4}) */
    set_counter(3, "tokens", 7);
    last = hold_once(lb, 5000, last);
    set_counter(3, "tokens", 7);
    kill_node(0);
    settle();
    last = hold_once(la, 5000, last);
    last = hold_once(lb, 5000, last);
    heal();
    settle();
    last = token_round(last);
    dlock_info info;
    CHECK_OK(dlock_inspect(a, "tokens", &info));
    CHECK_EQ(info.held, 0);
    /* the highest counter there is: at least the last hold's (tries that
     * lost a split vote bumped counters too; the node index may differ:
     * docs/redlock.md) */
    CHECK_OP(info.token >> 6, >=, last >> 6);
    CHECK_OP(info.token >> 6, <, (last >> 6) + 1000);
    dlock_info_clear(&info);
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
}

/* ------------------------------------------------------------------------ */
/* Contention: split votes among six processes                             */
/* ------------------------------------------------------------------------ */

#define CPROC 6

typedef struct fight_state {
    volatile int ready, go;
    volatile int inside, overlaps, failures, regressions;
    volatile long counter;
    volatile uint64_t last_token;
    volatile int64_t first_at[CPROC];
    volatile int got[CPROC];
    volatile int finished[CPROC];
    volatile int unconfirmed;
    int cycles, freezing;
    volatile int index;
} fight_state;

static int fight_child(void *arg)
{
    fight_state *s = arg;
    int me = s->index;
    dlock_client *c;
    dlock *l;
    dlock_options o;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = 10000;
    if (dlock_client_open(&c, uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "fight", &o) != DLOCK_OK)
        return 2;
    __atomic_add_fetch(&s->ready, 1, __ATOMIC_SEQ_CST);
    (void)th_wait_flag(&s->go, 60000);
    for (int i = 0; i < s->cycles; i++) {
        int rc = dlock_acquire(l, slow ? 120000 : 60000);
        if (rc != DLOCK_OK) {
            fprintf(stderr, "fighter %d: %s: %s\n", me, dlock_errname(rc),
                    dlock_errmsg());
            __atomic_add_fetch(&s->failures, 1, __ATOMIC_SEQ_CST);
            continue;
        }
        if (__atomic_fetch_add(&s->inside, 1, __ATOMIC_SEQ_CST) != 0)
            __atomic_add_fetch(&s->overlaps, 1, __ATOMIC_SEQ_CST);
        if (!s->got[me])
            s->first_at[me] = th_now_ms();
        s->got[me]++;
        uint64_t tok = dlock_token(l);
        if (tok <= s->last_token)
            __atomic_add_fetch(&s->regressions, 1, __ATOMIC_SEQ_CST);
        s->last_token = tok;
        long v = s->counter; /* unprotected read-modify-write */
        usleep(300);
        s->counter = v + 1;
        __atomic_sub_fetch(&s->inside, 1, __ATOMIC_SEQ_CST);
        rc = dlock_release(l);
        if (rc == DLOCK_ECONN && s->freezing) {
            /* a bare quorum with one of its nodes frozen: the release
             * cannot tell whether a quorum of keys was still ours */
            __atomic_add_fetch(&s->unconfirmed, 1, __ATOMIC_SEQ_CST);
        } else if (rc != DLOCK_OK) {
            fprintf(stderr, "fighter %d: release: %s: %s\n", me,
                    dlock_errname(rc), dlock_errmsg());
            __atomic_add_fetch(&s->failures, 1, __ATOMIC_SEQ_CST);
        }
    }
    __atomic_store_n(&s->finished[me], 1, __ATOMIC_SEQ_CST);
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

/* CPROC processes, all let go at once, fight for one lock `cycles` times
 * each. With `freeze`, the parent meanwhile freezes one node after another
 * for a while (their late answers arrive while the fight goes on). */
static void fight(int cycles, int freeze)
{
    fight_state *s = th_shared(sizeof(*s));
    pid_t pids[CPROC];
    int done = 0, st[CPROC];

    s->cycles = cycles;
    s->freezing = freeze;
    for (int i = 0; i < CPROC; i++) {
        s->index = i;
        pids[i] = th_fork(fight_child, s);
        int64_t until = th_now_ms() + 30000;
        while (s->ready < i + 1 && th_now_ms() < until)
            th_sleep_ms(1);
        CHECK_EQ(s->ready, i + 1);
    }
    int64_t t0 = th_now_ms();
    __atomic_store_n(&s->go, 1, __ATOMIC_SEQ_CST); /* all at once */
    for (int k = 0; freeze && done < CPROC && th_now_ms() - t0 < 60000;
         k++) {
        stop_node(k % NN);
        th_sleep_ms(150);
        cont_node(k % NN);
        for (int w = 0; w < 10 && done < CPROC; w++) {
            th_sleep_ms(10);
            done = 0;
            for (int i = 0; i < CPROC; i++)
                done += __atomic_load_n(&s->finished[i], __ATOMIC_SEQ_CST);
        }
    }
    for (int i = 0; i < CPROC; i++)
        st[i] = th_wait(pids[i]);
    int64_t took = th_now_ms() - t0;
    for (int i = 0; i < CPROC; i++)
        CHECK_EQ(st[i], 0);
    CHECK_EQ(s->failures, 0);
    CHECK_EQ(s->overlaps, 0);
    CHECK_EQ(s->regressions, 0);
    CHECK_EQ(s->counter, CPROC * s->cycles);
    /* progress, not speed: everybody's first hold comes within 20 s (the
     * back-off of split votes is at most 1.6 s a try) and the whole fight
     * (15 or 40 holds each) within 40 s; a livelock of split votes would
     * miss them */
    for (int i = 0; i < CPROC; i++) {
        CHECK_EQ(s->got[i], s->cycles);
        CHECK_OP(s->first_at[i] - t0, <, slow ? 60000 : 20000);
    }
    CHECK_OP(took, <, slow ? 120000 : 40000);
}

TEST(six_processes_fighting_keep_exclusion_and_progress)
{
    fight(slow ? 4 : 15, 0);
}

TEST(six_processes_fighting_while_nodes_freeze_and_thaw)
{
    fight(slow ? 4 : 40, 1);
}

/* ------------------------------------------------------------------------ */
/* Bad input and credentials                                                */
/* ------------------------------------------------------------------------ */

static void check_einval(const char *u, const char *needle)
{
    dlock_client *c = NULL;

    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_EINVAL);
    CHECK(c == NULL);
    CHECK_CONTAINS(dlock_errmsg(), needle);
    CHECK(strstr(dlock_errmsg(), "SECRET") == NULL);
}

TEST(bad_uris_are_rejected)
{
    static char many[64 * 24 + 64];
    char u[1200];
    size_t o;

    check_einval("redlock://", "nodes");
    check_einval("redlock://u:pw-SECRET1@?node_timeout=50", "nodes");
    o = (size_t)snprintf(many, sizeof(many), "redlock://u:pw-SECRET2@");
    for (int i = 0; i < 64; i++)
        o += (size_t)snprintf(many + o, sizeof(many) - o, "%s127.0.0.1:%d",
                              i ? "," : "", 10000 + i);
    check_einval(many, "63");

    static const char *const bad_nt[] = {"0", "-5", "abc", "", "60001",
                                         "1.5", "99999999999999999999"};
    for (size_t i = 0; i < sizeof(bad_nt) / sizeof(bad_nt[0]); i++) {
        snprintf(u, sizeof(u), "redlock://u:pw-SECRET3@%s?node_timeout=%s",
                 hosts, bad_nt[i]);
        check_einval(u, "node_timeout");
    }
    static const char *const bad_df[] = {"-0.1", "0.6", "abc", "", "nan",
                                         "inf", "0.1x", "1"};
    for (size_t i = 0; i < sizeof(bad_df) / sizeof(bad_df[0]); i++) {
        snprintf(u, sizeof(u), "redlock://u:pw-SECRET4@%s?drift_factor=%s",
                 hosts, bad_df[i]);
        check_einval(u, "drift_factor");
    }
    snprintf(u, sizeof(u), "redlock://%s?drift_ms=-1", hosts);
    check_einval(u, "drift_ms");
    snprintf(u, sizeof(u), "redlock://u:pw-SECRET5@%s?color=red", hosts);
    check_einval(u, "unknown parameter 'color'");
    snprintf(u, sizeof(u), "redlock://%s?node_timeout=50&node_timeout=60",
             hosts);
    check_einval(u, "twice");
    snprintf(u, sizeof(u), "redlock://%s/2?db=3", hosts);
    check_einval(u, "not both");
    snprintf(u, sizeof(u), "redlock://%s?prefix={x}", hosts);
    check_einval(u, "prefix");
    snprintf(u, sizeof(u), "redlock://alice@%s", hosts);
    check_einval(u, "password");
    check_einval("redlock://u:pw-SECRET6@127.0.0.1:0,127.0.0.1:1", "port");

    /* good options are taken */
    dlock_client *c;
    snprintf(u, sizeof(u),
             "redlock://%s/2?node_timeout=%lld&drift_factor=0.02&drift_ms=5&"
             "prefix=app:&timeout=3000",
             hosts, (long long)nt);
    c = th_client(u, NULL);
    dlock *l = th_handle(c, "options", 0, 0, 0);
    hold_once(l, 0, 0);
    CHECK_OK(dlock_acquire(l, 0));
    /* in database 2, under the prefix app: */
    CHECK_EQ(th_redis_cmd(&node[0], NULL, 0, "EXISTS dlock:{options}"), 0);
    CHECK_EQ(th_redis_cmd(&node[0], NULL, 0, "EVAL %s 1 %s",
                          "redis.call('SELECT', 2) "
                          "return redis.call('EXISTS', KEYS[1])",
                          "app:{options}"),
             1);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

TEST(fair_mode_and_too_short_ttls_are_refused)
{
    char u[1100], q[64];
    dlock_client *c = client();
    dlock *l = th_handle(c, "fair", 0, DLOCK_FAIR, 0);

    CHECK_RC(dlock_acquire(l, 0), DLOCK_ENOTSUP);
    CHECK_CONTAINS(dlock_errmsg(), "DLOCK_FAIR");
    CHECK_RC(dlock_acquire(l, 200), DLOCK_ENOTSUP);
    CHECK_EQ(dlock_held(l), 0);
    dlock_close(l);
    dlock_client_close(c);

    /* a lease must outlast one node timeout plus the drift allowance:
     * with a 400 ms node timeout, 400 ms is too short, 500 is enough */
    snprintf(q, sizeof(q), "?node_timeout=400");
    c = th_client(uri_with(u, sizeof(u), q), NULL);
    l = th_handle(c, "short", 400, 0, 0);
    CHECK_RC(dlock_acquire(l, 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "too short");
    CHECK_CONTAINS(dlock_errmsg(), "400 ms");
    CHECK_RC(dlock_acquire(l, 300), DLOCK_EINVAL);
    CHECK_EQ(dlock_held(l), 0);
    dlock_close(l);
    l = th_handle(c, "short", 500, 0, 0);
    hold_once(l, 0, 0);
    dlock_close(l);
    dlock_client_close(c);
    /* the drift allowance counts: 20% of 500 ms + 2 ms + 400 ms > 500 */
    snprintf(q, sizeof(q), "?node_timeout=400&drift_factor=0.2");
    c = th_client(uri_with(u, sizeof(u), q), NULL);
    l = th_handle(c, "short", 500, 0, 0);
    CHECK_RC(dlock_acquire(l, 0), DLOCK_EINVAL);
    dlock_close(l);
    dlock_client_close(c);
}

TEST(passwords_never_in_messages_and_wrong_ones_give_eauth)
{
    th_redis au[3];
    char h[256], u[512];
    size_t o = 0;
    dlock_client *c = NULL;

    for (int i = 0; i < 3; i++) {
        th_redis_start(&au[i], "requirepass rl-SECRET-pw\n"
                               "user alice on >alice-SECRET-pw ~* &* +@all\n");
        o += (size_t)snprintf(h + o, sizeof(h) - o, "%s127.0.0.1:%d",
                              i ? "," : "", au[i].port);
    }
    /* right passwords */
    snprintf(u, sizeof(u), "redlock://:rl-SECRET-pw@%s", h);
    c = th_client(u, NULL);
    CHECK(strstr(dlock_client_store(c), "SECRET") == NULL);
    CHECK_CONTAINS(dlock_client_store(c), ":***@");
    dlock *l = th_handle(c, "auth", 0, 0, 0);
    hold_once(l, 0, 0);
    dlock_close(l);
    dlock_client_close(c);
    snprintf(u, sizeof(u), "redlock://alice:alice-SECRET-pw@%s", h);
    c = th_client(u, NULL);
    CHECK_CONTAINS(dlock_client_store(c), "alice:***@");
    l = th_handle(c, "auth", 0, 0, 0);
    hold_once(l, 0, 0);
    dlock_close(l);
    dlock_client_close(c);

    /* wrong ones, or none */
    snprintf(u, sizeof(u), "redlock://:wrong-SECRET-1@%s", h);
    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_EAUTH);
    CHECK(c == NULL);
    CHECK(strstr(dlock_errmsg(), "SECRET") == NULL);
    CHECK_CONTAINS(dlock_errmsg(), "auth");
    snprintf(u, sizeof(u), "redlock://alice:wrong-SECRET-2@%s", h);
    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_EAUTH);
    CHECK(strstr(dlock_errmsg(), "SECRET") == NULL);
    snprintf(u, sizeof(u), "redlock://%s", h);
    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_EAUTH);

    /* the password is not leaked by a node that is down either */
    th_redis_kill(&au[1], SIGKILL);
    th_redis_kill(&au[2], SIGKILL);
    snprintf(u, sizeof(u), "redlock://:rl-SECRET-pw@%s", h);
    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_ECONN);
    CHECK(strstr(dlock_errmsg(), "SECRET") == NULL);
    CHECK_CONTAINS(dlock_errmsg(), "quorum 2");
    th_redis_stop(&au[0]);
}

/* --- tests that fail against redlock.c at 268dac0 (see the report) ---
 * They use the helpers of tests/store/test_redlock.c; paste them before
 * its tests[] table and add the T() lines. */

/* EVALSHA calls on the nodes that are up. */
static long long evalsha_calls(void)
{
    long long n = 0;

    for (int i = 0; i < NN; i++)
        if (!down[i])
            n += th_redis_calls(&node[i], "evalsha");
    return n;
}

/* With a 60 s lease, a 1 s wait costs its first try, the try after
 * subscribing and one at the deadline (each: the acquire script and the
 * quiet release on the three live nodes), nothing in between: the waiter
 * sleeps until a release notification or the holder's lease. */
TEST(waiters_do_not_poll_with_two_nodes_down)
{
    dlock_client *a = client(), *b = client();
    dlock *la = th_handle(a, "no-poll", 60000, 0, 0);
    dlock *lb = th_handle(b, "no-poll", 60000, 0, 0);
    long long worst = 0;

    CHECK_OK(dlock_acquire(la, 0));
    kill_node(3);
    kill_node(4);
    settle();
    for (int i = 0; i < 5; i++) {
        long long before = evalsha_calls();
        CHECK_RC(dlock_acquire(lb, 1000), DLOCK_EBUSY);
        long long tries = (evalsha_calls() - before) / (2 * 3);
        if (tries > worst)
            worst = tries;
    }
    CHECK_OP(worst, <=, 6); /* polling every 1..50 ms: 20 to 40 */
    CHECK_OK(dlock_release(la));
    TH_CLOSE(la, lb);
    TH_CLIENT_CLOSE(a, b);
    heal();
}

/* A renewal that finds the holder's key missing on some nodes puts it
 * back there (docs/redlock.md: "Keys that a node lost ... are then put
 * back"), whichever nodes answered first. */
TEST(extend_puts_back_every_key_a_node_lost)
{
    dlock_client *a = client();
    dlock *l = th_handle(a, "put-back", 30000, DLOCK_NO_RENEW, 0);

    for (int k = 0; k < 20; k++) {
        CHECK_OK(dlock_acquire(l, 0));
        wait_keys_everywhere("put-back", 2000);
        del_on(k % NN, "put-back");
        del_on((k + 2) % NN, "put-back");
        CHECK_OK(dlock_extend(l, 30000));
        wait_keys_everywhere("put-back", 1000);
        CHECK_OK(dlock_release(l));
    }
    dlock_close(l);
    dlock_client_close(a);
}

/* The same node listed three times would make a quorum of 3 out of 5 on
 * its own. */
TEST(a_node_listed_twice_is_refused)
{
    char u[512];
    dlock_client *c = NULL;

    snprintf(u, sizeof(u),
             "redlock://127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d,127.0.0.1:%d,"
             "127.0.0.1:%d",
             node[0].port, node[0].port, node[0].port, node[1].port,
             node[2].port);
    CHECK_RC(dlock_client_open(&c, u, NULL), DLOCK_EINVAL);
    CHECK(c == NULL);
}

/* dlock_extend() to a lease the store would refuse at acquire time. */
TEST(extend_to_a_ttl_too_short_for_the_node_timeout_is_refused)
{
    char u[1100];
    dlock_client *c =
        th_client(uri_with(u, sizeof(u), "?node_timeout=400"), NULL);
    dlock *l = th_handle(c, "short-extend", 5000, 0, 0);

    CHECK_OK(dlock_acquire(l, 0));
    CHECK_RC(dlock_extend(l, 300), DLOCK_EINVAL);
    CHECK_EQ(dlock_held(l), 1);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
}

/* --- hand-offs never wait out the lease ---
 * A release reaches the nodes one by one; the waiter, woken by its first
 * node's notification, may try while the holder still has the others.
 * The copies from the other nodes wake nobody (one release wakes a waiter
 * once), so that try must be repeated soon, not after the holder's lease.
 * (Before that was so, about 1 hand-off in 1000 waited the whole lease.) */

#define HANDOFFS 1500
#define UNANSWERED_MAX 5

typedef struct pingpong {
    int ids;                 /* children started */
    volatile int ready;      /* process 0 holds the lock */
    volatile int waiting[2]; /* process i waits for hand-off number ... */
    volatile int done;       /* hand-offs completed */
    volatile int64_t released_at;
    volatile int64_t worst;
    volatile int failed;
    volatile int unanswered; /* acquires repeated after "no answer" */
} pingpong;

/* Spins (politely) until *v == want; 0 if that took over 10 s. */
static int await_value(volatile int *v, int want)
{
    int64_t until = th_now_ms() + 10000;

    while (__atomic_load_n(v, __ATOMIC_SEQ_CST) != want) {
        if (th_now_ms() > until)
            return 0;
        usleep(50);
    }
    return 1;
}

static int pingpong_child(void *arg)
{
    pingpong *s = arg;
    int me = __atomic_fetch_add(&s->ids, 1, __ATOMIC_SEQ_CST);
    int n = slow ? HANDOFFS / 10 : HANDOFFS;
    dlock_client *c;
    dlock *l;
    dlock_options o;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = 1000;
    if (dlock_client_open(&c, uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "ping-pong", &o) != DLOCK_OK)
        return 2;
    if (me == 0) {
        if (dlock_acquire(l, 5000) != DLOCK_OK)
            return 3;
        __atomic_store_n(&s->ready, 1, __ATOMIC_SEQ_CST);
    } else if (!await_value(&s->ready, 1)) {
        return 3;
    }
    for (int i = 0; i < n; i++) {
        if (i % 2 == me) {
            /* ours: hand it over once the other one waits */
            if (!await_value(&s->waiting[1 - me], i + 1)) {
                fprintf(stderr, "ping-pong %d: the other never waited for "
                                "hand-off %d\n", me, i + 1);
                return 4;
            }
            th_sleep_ms(2); /* let it reach its wait */
            s->released_at = th_now_ms();
            if (dlock_release(l) != DLOCK_OK) {
                fprintf(stderr, "ping-pong %d: release %d: %s\n", me, i,
                        dlock_errmsg());
                return 4;
            }
            /* no barging: the next round starts once the other has it */
            if (!await_value(&s->done, i + 1))
                return 4;
        } else {
            __atomic_store_n(&s->waiting[me], i + 1, __ATOMIC_SEQ_CST);
            /* A try in which too few nodes answered within the node
             * timeout ends the acquire with DLOCK_ECONN, as documented;
             * on an overloaded machine several nodes (processes) now and
             * then go unscheduled that long at once (seen under stress-ng
             * with 250 ms). That is not what this test checks, so such an
             * acquire is repeated, UNANSWERED_MAX times a run at most;
             * its time counts in the hand-off's. */
            int rc;
            while ((rc = dlock_acquire(l, 5000)) == DLOCK_ECONN &&
                   strstr(dlock_errmsg(), "no answer within") &&
                   __atomic_add_fetch(&s->unanswered, 1, __ATOMIC_SEQ_CST) <=
                       UNANSWERED_MAX)
                ;
            if (rc != DLOCK_OK) {
                fprintf(stderr, "ping-pong %d: %s\n", me, dlock_errmsg());
                s->failed = 1;
                return 5;
            }
            int64_t took = th_now_ms() - s->released_at;
            if (took > s->worst)
                s->worst = took;
            __atomic_store_n(&s->done, i + 1, __ATOMIC_SEQ_CST);
        }
    }
    if (dlock_held(l) == 1)
        dlock_release(l);
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

TEST(hand_offs_never_wait_out_the_lease)
{
    pingpong *s = th_shared(sizeof(*s));
    pid_t a = th_fork(pingpong_child, s);
    pid_t b = th_fork(pingpong_child, s);

    CHECK_EQ(th_wait(a), 0);
    CHECK_EQ(th_wait(b), 0);
    CHECK_EQ(s->failed, 0);
    if (s->unanswered > 0)
        printf("note: %d acquires repeated after \"no answer within\"\n",
               s->unanswered);
    /* a missed wake-up costs the 1000 ms lease */
    /* a hand-off is a release, a wake-up and a try or two: a few round
     * trips (slack on a loaded machine); a missed wake-up costs the
     * 1000 ms lease. 500 + slack sits between the two. */
    CHECK_OP(s->worst, <, 500 + slack);
}

static const th_test tests[] = {
    T(bad_uris_are_rejected),
    T(fair_mode_and_too_short_ttls_are_refused),
    T(passwords_never_in_messages_and_wrong_ones_give_eauth),
    T(two_of_five_killed_still_serve),
    T(three_of_five_killed_fail_and_the_hold_is_lost),
    T(three_of_five_frozen_fail_within_the_node_timeout),
    T(frozen_nodes_cost_at_most_a_node_timeout),
    T(late_answers_do_no_harm),
    T(release_and_extend_need_a_quorum_of_keys),
    T(restarted_node_gets_the_key_back),
    T(delayed_restart_keeps_a_bare_quorum_exclusive),
    T(fencing_tokens_grow_across_faults_and_split_counters),
    T(six_processes_fighting_keep_exclusion_and_progress),
    T(six_processes_fighting_while_nodes_freeze_and_thaw),
    T(waiters_do_not_poll_with_two_nodes_down),
    T(extend_puts_back_every_key_a_node_lost),
    T(a_node_listed_twice_is_refused),
    T(extend_to_a_ttl_too_short_for_the_node_timeout_is_refused),
    T(hand_offs_never_wait_out_the_lease),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    const char *vg = getenv("DLOCK_TEST_VALGRIND");
    size_t o = 0;

    slow = vg && *vg && strcmp(vg, "0") != 0;
    nt = 250;
    slack = slow ? 1500 : 250;
    /* the watchdog's tests: a lease of four node timeouts, so that a
     * renewal that takes one (a node silent on a loaded machine) leaves
     * room for the next */
    short_ttl = 1000;
    for (int i = 0; i < NN; i++) {
        th_redis_start(&node[i], NULL);
        o += (size_t)snprintf(hosts + o, sizeof(hosts) - o, "%s127.0.0.1:%d",
                              i ? "," : "", node[i].port);
    }
    /* a node timeout that holds on a busy machine (see the top) */
    snprintf(uri, sizeof(uri), "redlock://%s?node_timeout=%lld", hosts,
             (long long)nt);
    return th_main(argc, argv, tests);
}
