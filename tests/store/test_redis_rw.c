/* SPDX-License-Identifier: MIT */
/*
 * test_redis_rw.c -- what only the Redis store does with shared (read)
 * holds and semaphores, and how they fail (docs/design.md, "Shared holds
 * and permits", its Redis paragraph): a dead reader dropped at its lease
 * end and the waiting writer woken then; a reader's renewal that moves
 * only its own line; a release whose line is gone; a writer behind
 * readers let in by the last reader's release (one hand-off); one
 * release letting in every reader at the head; the uncontended shared
 * cycle costing the exclusive one's commands. The contract every store
 * with shared holds gives is tests/store/test_shared.c.
 */
#include "test.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <unistd.h>

static th_redis srv;

/* The n-th holder line (from 1) of lock `name`, "+ OWNER TOKEN END
 * DESC": its owner and its lease end on the server's clock ("?" for a
 * sole holder's). Holder lines keep the order of their grants. */
static void holder_line(const char *name, int n, char *owner, char *end)
{
    char val[4096];
    const char *p = val;

    th_redis_cmd(&srv, val, sizeof(val), "GET dlock:{%s}", name);
    owner[0] = end[0] = '\0';
    for (int i = 0; i < n && p; i++) {
        p = strstr(p, "\n+ ");
        if (p && i < n - 1)
            p++;
    }
    CHECK(p != NULL);
    if (p)
        CHECK_EQ(sscanf(p, "\n+ %79s %*u %31s", owner, end), 2);
}

/* Readers share; a writer queues behind them, and a reader that comes
 * after the writer queues behind it (no writer starvation); the last
 * reader's release hands the lock to the writer at once (its message),
 * not at the readers' lease end (30 s). Tokens: readers above the last
 * write, the writer above every reader. */
TEST(a_writer_behind_readers_gets_it_at_the_last_release)
{
    dlock_client *c[4];
    for (int i = 0; i < 4; i++)
        c[i] = th_client(srv.uri, NULL);
    dlock *w0 = th_handle(c[0], "rw1", 30000, 0, 0);
    dlock *r1 = th_handle(c[1], "rw1", 30000, 0, 0);
    dlock *r2 = th_handle(c[2], "rw1", 30000, 0, 0);
    dlock *r3 = th_handle(c[3], "rw1", 30000, 0, 0);
    th_waiter w = {.l = th_handle(c[0], "rw1", 30000, 0, 0), .wait_ms = 20000};
    pthread_t th;

    CHECK_OK(dlock_acquire(w0, 0));
    uint64_t t0 = dlock_token(w0);
    CHECK_OK(dlock_release(w0));
    CHECK_OK(dlock_acquire_shared(r1, 0));
    CHECK_OK(dlock_acquire_shared(r2, 0));
    CHECK_OP(dlock_token(r1), >, t0);
    CHECK_OP(dlock_token(r2), >, t0);
    dlock_info i = th_info(c[3], "rw1");
    CHECK_EQ(i.holders, 2);
    CHECK_EQ(i.shared, 1);
    CHECK_EQ(i.held, 1);
    dlock_info_clear(&i);

    th_waiter_start(&w, &th);
    th_wait_state(c[3], "rw1", 1, 2);
    i = th_info(c[3], "rw1");
    CHECK_EQ(i.queue_len, 1);
    if (i.queue_len == 1)
        CHECK_CONTAINS(i.queue[0], "write: ");
    dlock_info_clear(&i);
    /* a new reader does not pass the waiting writer */
    CHECK_RC(dlock_acquire_shared(r3, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_release(r1));
    th_wait_state(c[3], "rw1", 1, 1); /* the writer still waits */
    int64_t rel = th_now_ms();
    CHECK_OK(dlock_release(r2));
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    /* one hand-off: the message, not the readers' 30 s lease; the bound
     * is loose for a busy machine and far below the fallback timer */
    CHECK_OP(w.done_at - rel, <, 3000);
    CHECK_OP(w.token, >, dlock_token(r1) > dlock_token(r2)
                             ? dlock_token(r1)
                             : dlock_token(r2));
    dlock_close(w.l);
    TH_CLOSE(w0, r1, r2, r3);
    for (int i2 = 0; i2 < 4; i2++)
        dlock_client_close(c[i2]);
}

/* A writer's release lets in every reader at the head of the queue at
 * once (one script, one message each), and no further: the writer
 * queued behind them, and the reader behind that writer, keep waiting. */
TEST(one_release_lets_in_every_reader_at_the_head)
{
    enum { NR = 3 };
    dlock_client *h = th_client(srv.uri, NULL), *c[NR + 2];
    dlock *lh = th_handle(h, "rw2", 30000, 0, 0);
    th_waiter w[NR + 2];
    pthread_t th[NR + 2];

    CHECK_OK(dlock_acquire(lh, 0));
    for (int i = 0; i < NR + 2; i++) {
        c[i] = th_client(srv.uri, NULL);
        memset(&w[i], 0, sizeof(w[i]));
        w[i].l = th_handle(c[i], "rw2", 30000, 0, 0);
        w[i].shared = i != NR; /* readers, a writer, a reader */
        w[i].wait_ms = 20000;
        w[i].hold_ms = 400;
        th_waiter_start(&w[i], &th[i]);
        th_wait_state(h, "rw2", i + 1, 1); /* queued in this order */
    }
    int64_t rel = th_now_ms();
    CHECK_OK(dlock_release(lh));
    th_wait_state(h, "rw2", 2, NR); /* the readers hold, two still wait */
    dlock_info i = th_info(h, "rw2");
    CHECK_EQ(i.shared, 1);
    CHECK_EQ(i.queue_len, 2);
    if (i.queue_len == 2) {
        CHECK_CONTAINS(i.queue[0], "write: ");
        CHECK_CONTAINS(i.queue[1], "read: ");
    }
    dlock_info_clear(&i);
    for (int k = 0; k < NR + 2; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < NR + 2; k++)
        CHECK_OK(w[k].rc);
    for (int k = 0; k < NR; k++) {
        CHECK_OP(w[k].done_at - rel, <, 3000);
        /* the writer came after every reader of the head had let go */
        CHECK_OP(w[NR].done_at, >=, w[k].done_at + w[k].hold_ms);
        CHECK_OP(w[NR].token, >, w[k].token);
    }
    CHECK_OP(w[NR + 1].done_at, >=, w[NR].done_at + w[NR].hold_ms);
    CHECK_OP(w[NR + 1].token, >, w[NR].token);
    for (int k = 0; k < NR + 2; k++) {
        dlock_close(w[k].l);
        dlock_client_close(c[k]);
    }
    dlock_close(lh);
    dlock_client_close(h);
}

/* A reader that dies holding is dropped at its lease end (no release,
 * no session to end): the writer waiting behind it is woken then by its
 * own fallback timer (the lease left, from its try) and its try drops
 * the dead line and takes the lock. */
typedef struct dead {
    int64_t before; /* monotonic ms before the child's acquire */
    int rc;
    volatile int ready; /* rc is set: the child's acquire has returned */
} dead;

static int dead_reader_child(void *arg)
{
    dead *d = arg;
    dlock_client *c = NULL;
    dlock_options o;
    dlock *l = NULL;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = 800;
    if (dlock_client_open(&c, srv.uri, NULL) != DLOCK_OK ||
        dlock_open(&l, c, "rw3", &o) != DLOCK_OK)
        return 1;
    d->before = th_now_ms();
    d->rc = dlock_acquire_shared(l, 0);
    __atomic_store_n(&d->ready, 1, __ATOMIC_SEQ_CST);
    for (;;)
        pause(); /* killed holding */
}

TEST(a_dead_reader_is_dropped_at_its_lease_end)
{
    dead *d = th_shared(sizeof(*d));
    dlock_client *c = th_client(srv.uri, NULL);
    th_waiter w = {.l = th_handle(c, "rw3", 30000, 0, 0), .wait_ms = 20000};
    pthread_t th;

    pid_t child = th_fork(dead_reader_child, d);
    /* its acquire has returned (the key shows the hold a moment before) */
    CHECK(th_wait_flag(&d->ready, 10000));
    th_wait_state(c, "rw3", 0, 1);
    kill(child, SIGKILL);
    th_wait(child);
    CHECK_OK(d->rc);
    th_waiter_start(&w, &th);
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    /* not before the dead reader's lease (800 ms from its acquire; the
     * server reads its lease end to the ms: 5 ms for that rounding) */
    CHECK_OP(w.done_at, >=, d->before + 800 - 5);
    /* and woken at its end: the writer's timer (one try after it), far
     * below the writer's own wait */
    CHECK_OP(w.done_at, <, d->before + 800 + 3000);
    dlock_close(w.l);
    dlock_client_close(c);
}

/* A reader's renewal (the watchdog's, and dlock_extend()) moves its own
 * line's end only: another reader's end stays what it was. */
TEST(a_readers_renewal_moves_only_its_own_line)
{
    dlock_client *a = th_client(srv.uri, NULL), *b = th_client(srv.uri, NULL);
    dlock *ra = th_handle(a, "rw4", 600, 0, 0); /* renewed every 200 ms */
    dlock *rb = th_handle(b, "rw4", 20000, DLOCK_NO_RENEW, 0);
    char oa[80], ob[80], o[80], ea0[32], ea1[32], eb0[32], eb1[32];

    CHECK_OK(dlock_acquire_shared(ra, 0));
    CHECK_OK(dlock_acquire_shared(rb, 0));
    holder_line("rw4", 1, oa, ea0);
    holder_line("rw4", 2, ob, eb0);
    CHECK(strcmp(oa, ob) != 0);
    CHECK(strcmp(ea0, "?") != 0); /* two holders: both ends written */
    /* the watchdog renews ra three times or more in a second */
    th_sleep_ms(1000);
    holder_line("rw4", 1, o, ea1);
    CHECK_STR(o, oa);
    holder_line("rw4", 2, o, eb1);
    CHECK_STR(o, ob);
    CHECK_OP(strtoull(ea1, NULL, 10), >, strtoull(ea0, NULL, 10));
    CHECK_STR(eb1, eb0);
    CHECK_OK(dlock_extend(ra, 5000));
    holder_line("rw4", 2, o, eb1);
    CHECK_STR(eb1, eb0);
    CHECK_OK(dlock_release(ra));
    CHECK_OK(dlock_release(rb));
    TH_CLOSE(ra, rb);
    TH_CLIENT_CLOSE(a, b);
}

/* A release by a reader whose line is gone (its lease ended and a script
 * dropped it; here: removed by hand) is DLOCK_ELOST, and it touches no
 * other reader's hold. */
TEST(a_release_whose_line_is_gone_is_lost)
{
    dlock_client *a = th_client(srv.uri, NULL), *b = th_client(srv.uri, NULL);
    dlock *ra = th_handle(a, "rw5", 30000, 0, 0);
    dlock *rb = th_handle(b, "rw5", 30000, 0, 0);
    char val[4096], keep[4096];

    CHECK_OK(dlock_acquire_shared(ra, 0));
    CHECK_OK(dlock_acquire_shared(rb, 0));
    th_redis_cmd(&srv, val, sizeof(val), "GET dlock:{rw5}");
    /* keep the first line and b's holder line (the second) */
    char *nl = strchr(val, '\n');
    char *lb = nl ? strstr(nl + 1, "\n+ ") : NULL;
    CHECK(lb != NULL);
    if (!lb)
        return;
    snprintf(keep, sizeof(keep), "%.*s%s", (int)(nl - val), val, lb);
    th_redis_cmd(&srv, NULL, 0, "SET dlock:{rw5} %s PX 30000", keep);
    CHECK_RC(dlock_release(ra), DLOCK_ELOST);
    th_check_held(a, "rw5", -1, 1);
    CHECK_OK(dlock_release(rb));
    th_check_held(a, "rw5", -1, 0);
    TH_CLOSE(ra, rb);
    TH_CLIENT_CLOSE(a, b);
}

/* The uncontended shared cycle (acquire + release of a name free in the
 * store) costs the commands of the exclusive one, every command the
 * server runs counted: the try reads the key and writes the hold (its
 * lease end is the key's expiry: no clock read), the release reads it
 * and leaves the tombstone. */
TEST(the_shared_cycle_costs_the_exclusive_ones_commands)
{
    dlock_client *c = th_client(srv.uri, NULL);
    dlock *lw = th_handle(c, "rw6w", 30000, 0, 0);
    dlock *lr = th_handle(c, "rw6r", 30000, 0, 0);
    dlock *lp = th_handle(c, "rw6p", 30000, 0, 3);
    const int n = 50;

    /* the first cycle of each name reads the clock for its token */
    CHECK_OK(dlock_acquire(lw, 0));
    CHECK_OK(dlock_release(lw));
    CHECK_OK(dlock_acquire_shared(lr, 0));
    CHECK_OK(dlock_release(lr));
    CHECK_OK(dlock_acquire(lp, 0));
    CHECK_OK(dlock_release(lp));
    long long b0 = th_redis_calls(&srv, NULL);
    for (int i = 0; i < n; i++) {
        CHECK_OK(dlock_acquire(lw, 0));
        CHECK_OK(dlock_release(lw));
    }
    long long b1 = th_redis_calls(&srv, NULL);
    for (int i = 0; i < n; i++) {
        CHECK_OK(dlock_acquire_shared(lr, 0));
        CHECK_OK(dlock_release(lr));
    }
    long long b2 = th_redis_calls(&srv, NULL);
    for (int i = 0; i < n; i++) {
        CHECK_OK(dlock_acquire(lp, 0));
        CHECK_OK(dlock_release(lp));
    }
    long long b3 = th_redis_calls(&srv, NULL);
    CHECK_EQ(b2 - b1, b1 - b0);
    CHECK_EQ(b3 - b2, b1 - b0);
    TH_CLOSE(lw, lr, lp);
    dlock_client_close(c);
}

/* A name is a lock or a semaphore of one N while anyone holds or waits:
 * another N, or the other kind, is DLOCK_EINVAL naming what it is. */
TEST(a_semaphore_keeps_its_permits)
{
    dlock_client *c = th_client(srv.uri, NULL), *d = th_client(srv.uri, NULL);
    dlock *p3 = th_handle(c, "rw7", 30000, 0, 3);
    dlock *p2 = th_handle(d, "rw7", 30000, 0, 2);
    dlock *lk = th_handle(d, "rw7", 30000, 0, 0);

    CHECK_OK(dlock_acquire(p3, 0));
    CHECK_RC(dlock_acquire(p2, 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "is a semaphore of 3 permits");
    CHECK_RC(dlock_acquire(lk, 0), DLOCK_EINVAL);
    CHECK_RC(dlock_acquire_shared(lk, 0), DLOCK_EINVAL);
    dlock_info i = th_info(c, "rw7");
    CHECK_EQ(i.permits, 3);
    CHECK_EQ(i.holders, 1);
    CHECK_EQ(i.waiters, 0);
    dlock_info_clear(&i);
    CHECK_OK(dlock_release(p3));
    /* free: its tombstone still says 3 permits, for dlock status... */
    i = th_info(c, "rw7");
    CHECK_EQ(i.held, 0);
    CHECK_EQ(i.permits, 3);
    CHECK_OP(i.token, >, 0);
    dlock_info_clear(&i);
    /* ...but binds nothing: the name may now be anything */
    CHECK_OK(dlock_acquire(lk, 0));
    CHECK_RC(dlock_acquire(p3, 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "not a semaphore");
    CHECK_OK(dlock_release(lk));
    TH_CLOSE(p3, p2, lk);
    TH_CLIENT_CLOSE(c, d);
}

/* A writer that gives up waiting behind readers leaves the queue in one
 * script, which lets in the readers that queued behind it (they were
 * held back only by the writer): they share with the readers holding. */
TEST(a_writer_giving_up_lets_the_readers_behind_it_in)
{
    dlock_client *a = th_client(srv.uri, NULL), *b = th_client(srv.uri, NULL);
    dlock_client *c = th_client(srv.uri, NULL);
    dlock *r1 = th_handle(a, "rw8", 30000, 0, 0);
    th_waiter w = {.l = th_handle(b, "rw8", 30000, 0, 0), .wait_ms = 600};
    th_waiter r2 = {
        .l = th_handle(c, "rw8", 30000, 0, 0), .shared = 1, .wait_ms = 20000};
    pthread_t tw, tr;

    CHECK_OK(dlock_acquire_shared(r1, 0));
    th_waiter_start(&w, &tw);
    th_wait_state(a, "rw8", 1, 1);
    th_waiter_start(&r2, &tr);
    th_wait_state(a, "rw8", 2, 1);
    pthread_join(tw, NULL);
    CHECK_RC(w.rc, DLOCK_EBUSY);
    pthread_join(tr, NULL);
    CHECK_OK(r2.rc);
    /* let in by the writer's leaving (its message), not by r1's release
     * or lease (30 s): r1 still holds */
    CHECK_OP(r2.done_at - w.done_at, <, 3000);
    CHECK_EQ(dlock_held(r1), 1);
    CHECK_OK(dlock_release(r1));
    dlock_close(r1);
    dlock_close(w.l);
    dlock_close(r2.l);
    TH_CLIENT_CLOSE(a, b, c);
}

/* unix:// is the same store: its readers and permits share the key with
 * those over TCP, and a hand-over crosses between them. */
TEST(shared_holds_over_a_unix_socket)
{
    char uri[800];

    snprintf(uri, sizeof(uri), "unix://%s", srv.sock);
    dlock_client *u = th_client(uri, NULL), *t = th_client(srv.uri, NULL);
    dlock *ru = th_handle(u, "rw9", 30000, 0, 0);
    dlock *rt = th_handle(t, "rw9", 30000, 0, 0);
    th_waiter w = {.l = th_handle(u, "rw9", 30000, 0, 0), .wait_ms = 20000};
    dlock *pu = th_handle(u, "rw9p", 30000, 0, 2);
    dlock *pt = th_handle(t, "rw9p", 30000, 0, 2);
    pthread_t th;

    CHECK_OK(dlock_acquire_shared(ru, 0));
    CHECK_OK(dlock_acquire_shared(rt, 0));
    CHECK_OK(dlock_release(ru));
    th_waiter_start(&w, &th);
    th_wait_state(t, "rw9", 1, 1);
    CHECK_OK(dlock_release(rt));
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    CHECK_OK(dlock_acquire(pu, 0));
    CHECK_OK(dlock_acquire(pt, 0));
    dlock_info i = th_info(u, "rw9p");
    CHECK_EQ(i.holders, 2);
    CHECK_EQ(i.permits, 2);
    dlock_info_clear(&i);
    CHECK_OK(dlock_release(pt));
    CHECK_OK(dlock_release(pu));
    TH_CLOSE(ru, rt);
    dlock_close(w.l);
    TH_CLOSE(pu, pt);
    TH_CLIENT_CLOSE(u, t);
}

/* A permit holder killed holding: its line stays in the key until a
 * script has to decide (with nobody waiting, nothing is held up by it);
 * the next try after its lease end drops it and takes the permit it
 * left. dlock_inspect() counts only the live lines meanwhile. */
static int dead_permit_child(void *arg)
{
    dead *d = arg;
    dlock_client *c = NULL;
    dlock_options o;
    dlock *l = NULL;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = 500;
    o.permits = 2;
    if (dlock_client_open(&c, srv.uri, NULL) != DLOCK_OK ||
        dlock_open(&l, c, "rw10", &o) != DLOCK_OK)
        return 1;
    d->before = th_now_ms();
    d->rc = dlock_acquire(l, 0);
    __atomic_store_n(&d->ready, 1, __ATOMIC_SEQ_CST);
    for (;;)
        pause(); /* killed holding */
}

static int holder_lines(const char *name)
{
    char val[4096];
    int n = 0;

    th_redis_cmd(&srv, val, sizeof(val), "GET dlock:{%s}", name);
    for (const char *p = val; (p = strstr(p, "\n+ ")) != NULL; p++)
        n++;
    return n;
}

TEST(an_expired_holder_line_is_dropped_by_the_next_try)
{
    dead *d = th_shared(sizeof(*d));
    dlock_client *a = th_client(srv.uri, NULL), *b = th_client(srv.uri, NULL);
    dlock *pa = th_handle(a, "rw10", 30000, 0, 2);
    dlock *pb = th_handle(b, "rw10", 30000, 0, 2);

    pid_t child = th_fork(dead_permit_child, d);
    /* its acquire has returned (the key shows the hold a moment before) */
    CHECK(th_wait_flag(&d->ready, 10000));
    th_wait_state(a, "rw10", 0, 1);
    kill(child, SIGKILL);
    th_wait(child);
    CHECK_OK(d->rc);
    CHECK_OK(dlock_acquire(pa, 0));
    CHECK_RC(dlock_acquire(pb, 0), DLOCK_EBUSY); /* 2 of 2 taken */
    /* past the dead holder's lease (500 ms from before its acquire) */
    int64_t left = d->before + 500 + 50 - th_now_ms();
    if (left > 0)
        th_sleep_ms(left);
    CHECK_EQ(holder_lines("rw10"), 2); /* still there: nobody decided */
    dlock_info i = th_info(a, "rw10");
    CHECK_EQ(i.holders, 1); /* but not counted */
    dlock_info_clear(&i);
    CHECK_OK(dlock_acquire(pb, 0));
    CHECK_EQ(holder_lines("rw10"), 2); /* pa's and pb's */
    CHECK_OK(dlock_release(pa));
    CHECK_OK(dlock_release(pb));
    TH_CLOSE(pa, pb);
    TH_CLIENT_CLOSE(a, b);
}

static const th_test tests[] = {
    T(a_writer_behind_readers_gets_it_at_the_last_release),
    T(one_release_lets_in_every_reader_at_the_head),
    T(a_dead_reader_is_dropped_at_its_lease_end),
    T(a_readers_renewal_moves_only_its_own_line),
    T(a_release_whose_line_is_gone_is_lost),
    T(the_shared_cycle_costs_the_exclusive_ones_commands),
    T(a_semaphore_keeps_its_permits),
    T(a_writer_giving_up_lets_the_readers_behind_it_in),
    T(shared_holds_over_a_unix_socket),
    T(an_expired_holder_line_is_dropped_by_the_next_try),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    th_redis_start(&srv, NULL);
    return th_main(argc, argv, tests);
}
