/* SPDX-License-Identifier: MIT */
/*
 * test_pg_rw.c -- what only the PostgreSQL store does with shared (read)
 * holds and semaphores, and how they fail (docs/design.md, "Shared holds
 * and permits", its PostgreSQL paragraphs). The contract every store with
 * shared holds gives is tests/store/test_shared.c.
 *
 * Table mode: a dead reader's entry ending at its lease (the waiting
 * writer gets in then, not at a live reader's end); the last reader's
 * release handing the lock to a waiting writer (a notification, not the
 * lease); a writer's release letting in the readers at the head and no
 * further; a writer that gives up letting in the readers behind it; a
 * reader's renewal moving only its own entry; a release whose entry is
 * gone (ELOST, nothing else touched); a dead waiter skipped by the grant
 * step; a semaphore keeping its N and granting one waiter per permit
 * freed; the uncontended shared cycle costing one statement each way
 * (counted in the server's log); a table of the previous version migrated
 * at open, its held rows working on.
 *
 * Advisory mode's semaphores: a permit holder's death waking the head of
 * the queue at once; a head that gives up leaving nothing; waiters served
 * in order, one per permit freed; tries racing never holding more than N;
 * the name's kind and N kept, and the mode's cap on N.
 */
#include "test.h"

#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

static th_sql srv;

static dlock_client *client(void)
{
    return th_client(srv.uri, NULL);
}

/* The lease end (server ms) of the entry with token `tok` in the row of
 * `name` of table T; -1 when there is none. */
static long long entry_end(const char *t, const char *name, uint64_t tok)
{
    return th_sql_query(&srv, NULL, 0,
                        "SELECT (x.value ->> 'u')::bigint FROM \"%s\" l, "
                        "jsonb_each(l.holders) x WHERE l.name = '%s'::bytea "
                        "AND (x.value ->> 't')::bigint = %llu",
                        t, name, (unsigned long long)tok);
}

/* Queue entries of `name` in table T's queue, dead or alive. */
static long long entries(const char *t, const char *name)
{
    return th_sql_query(&srv, NULL, 0,
                        "SELECT count(*) FROM \"%s_waiters\" WHERE name = "
                        "'%s'::bytea",
                        t, name);
}

/* ------------------------------------------------------------------------ */
/* Table mode                                                               */
/* ------------------------------------------------------------------------ */

/* A reader that dies holding (lease 2 s) and a live reader (lease
 * 30 s) hold; a writer waits. The live reader's release cannot let the
 * writer in (the dead reader's entry still holds), and the writer gets in
 * at the dead reader's lease end: its timer is the earliest live entry's
 * end, not the row's (the live reader's, 30 s). */
typedef struct dead {
    int64_t before; /* monotonic ms before the child's acquire */
    int rc;
} dead;

static int dead_reader_child(void *arg)
{
    dead *d = arg;
    dlock_client *c = NULL;
    dlock_options o;
    dlock *l = NULL;

    memset(&o, 0, sizeof(o));
    o.ttl_ms = 2000;
    if (dlock_client_open(&c, srv.uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "rw1", &o) != DLOCK_OK)
        return 1;
    d->before = th_now_ms();
    __atomic_store_n(&d->rc, dlock_acquire_shared(l, 0), __ATOMIC_SEQ_CST);
    for (;;)
        pause(); /* killed holding */
}

TEST(a_dead_readers_entry_ends_at_its_lease)
{
    dead *d = th_shared(sizeof(*d));
    dlock_client *a = client(), *c = client();
    dlock *live = th_handle(a, "rw1", 30000, 0, 0);
    th_waiter w = {.l = th_handle(c, "rw1", 30000, 0, 0), .wait_ms = 20000};
    pthread_t th;

    d->rc = -1000;
    pid_t child = th_fork(dead_reader_child, d);
    /* its acquire has returned (the row shows the hold a moment before) */
    for (int i = 0; i < 4000 && __atomic_load_n(&d->rc, __ATOMIC_SEQ_CST) ==
                                   -1000;
         i++)
        th_sleep_ms(5);
    th_wait_state(c, "rw1", 0, 1);
    kill(child, SIGKILL);
    th_wait(child);
    CHECK_OK(d->rc);
    CHECK_OK(dlock_acquire_shared(live, 0));
    th_waiter_start(&w, &th);
    th_wait_state(c, "rw1", 1, -1);
    CHECK_OK(dlock_release(live));
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    /* not before the dead reader's lease (2 s from before its acquire;
     * the server keeps ends to the ms: 5 ms for that) */
    CHECK_OP(w.done_at, >=, d->before + 2000 - 5);
    /* and at its end (the writer's timer, then one try), far below the
     * live reader's 30 s and the writer's own 20 s wait: 3 s of slack */
    CHECK_OP(w.done_at, <, d->before + 2000 + 3000);
    dlock_close(w.l);
    dlock_close(live);
    TH_CLIENT_CLOSE(a, c);
}

/* Readers share; a writer queues behind them, a reader that comes after
 * the writer does not pass it; the last reader's release hands the lock
 * to the writer (its notification), not the readers' 30 s lease. */
TEST(the_last_readers_release_hands_over_to_the_writer)
{
    dlock_client *c[4];
    for (int i = 0; i < 4; i++)
        c[i] = client();
    dlock *r1 = th_handle(c[1], "rw2", 30000, 0, 0);
    dlock *r2 = th_handle(c[2], "rw2", 30000, 0, 0);
    dlock *r3 = th_handle(c[3], "rw2", 30000, 0, 0);
    th_waiter w = {.l = th_handle(c[0], "rw2", 30000, 0, 0), .wait_ms = 20000};
    pthread_t th;

    CHECK_OK(dlock_acquire_shared(r1, 0));
    CHECK_OK(dlock_acquire_shared(r2, 0));
    CHECK(dlock_token(r1) != dlock_token(r2));
    th_waiter_start(&w, &th);
    th_wait_state(c[3], "rw2", 1, 2);
    dlock_info i = th_info(c[3], "rw2");
    CHECK_EQ(i.shared, 1);
    CHECK_EQ(i.queue_len, 1);
    if (i.queue_len == 1)
        CHECK_CONTAINS(i.queue[0], "write: ");
    CHECK_STR(i.holder, "2 readers");
    dlock_info_clear(&i);
    CHECK_RC(dlock_acquire_shared(r3, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_release(r1));
    th_wait_state(c[3], "rw2", 1, 1); /* the writer still waits */
    int64_t rel = th_now_ms();
    CHECK_OK(dlock_release(r2));
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    /* one hand-off (the release's grant and its notification): loose for
     * a busy machine, far below the readers' 30 s lease */
    CHECK_OP(w.done_at - rel, <, 3000);
    CHECK_OP(w.token, >, dlock_token(r1) > dlock_token(r2) ? dlock_token(r1)
                                                           : dlock_token(r2));
    dlock_close(w.l);
    TH_CLOSE(r1, r2, r3);
    for (int k = 0; k < 4; k++)
        dlock_client_close(c[k]);
}

/* A writer's release with R R W R queued lets in the two readers at the
 * head and no further: the writer behind them and the reader behind it
 * keep waiting, in that order. Each holds until told (`go`): the checks
 * see them holding however slow the machine. */
TEST(a_writers_release_lets_in_the_readers_at_the_head_only)
{
    enum { N = 4 };
    dlock_client *h = client(), *c[N];
    dlock *lh = th_handle(h, "rw3", 30000, 0, 0);
    th_waiter w[N];
    pthread_t th[N];

    CHECK_OK(dlock_acquire(lh, 0));
    for (int i = 0; i < N; i++) {
        c[i] = client();
        memset(&w[i], 0, sizeof(w[i]));
        w[i].l = th_handle(c[i], "rw3", 30000, 0, 0);
        w[i].shared = i != 2; /* R R W R */
        w[i].wait_ms = 20000;
        w[i].wait_go = i < 3;
        th_waiter_start(&w[i], &th[i]);
        th_wait_state(h, "rw3", i + 1, 1); /* queued in this order */
    }
    dlock_info q = th_info(h, "rw3");
    CHECK_EQ(q.queue_len, 4);
    if (q.queue_len == 4) {
        CHECK_CONTAINS(q.queue[0], "read: ");
        CHECK_CONTAINS(q.queue[2], "write: ");
    }
    dlock_info_clear(&q);
    int64_t rel = th_now_ms();
    CHECK_OK(dlock_release(lh));
    th_wait_state(h, "rw3", 2, 2); /* two readers in, two still wait */
    dlock_info i = th_info(h, "rw3");
    CHECK_EQ(i.shared, 1);
    CHECK_EQ(i.queue_len, 2);
    if (i.queue_len == 2) {
        CHECK_CONTAINS(i.queue[0], "write: ");
        CHECK_CONTAINS(i.queue[1], "read: ");
    }
    dlock_info_clear(&i);
    CHECK(th_waiter_returned(&w[0], 10000));
    CHECK(th_waiter_returned(&w[1], 10000));
    int64_t t_r = th_now_ms();
    th_waiter_go(&w[0]);
    th_waiter_go(&w[1]);
    CHECK(th_waiter_returned(&w[2], 10000));
    CHECK_EQ(w[3].done_at, 0); /* the reader behind the writer still waits */
    int64_t t_w = th_now_ms();
    th_waiter_go(&w[2]);
    for (int k = 0; k < N; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < N; k++)
        CHECK_OK(w[k].rc);
    for (int k = 0; k < 2; k++) {
        CHECK_OP(w[k].done_at - rel, <, 3000); /* one hand-off, busy machine */
        CHECK_OP(w[2].token, >, w[k].token);
    }
    CHECK_OP(w[2].done_at, >=, t_r);
    CHECK_OP(w[3].done_at, >=, t_w);
    CHECK_OP(w[3].token, >, w[2].token);
    for (int k = 0; k < N; k++) {
        dlock_close(w[k].l);
        dlock_client_close(c[k]);
    }
    dlock_close(lh);
    dlock_client_close(h);
}

/* A writer that gives up waiting behind a reader leaves the queue with
 * T_leave, whose grant step lets in the reader queued behind it (held
 * back only by the writer): it shares with the reader holding. */
TEST(a_writer_giving_up_lets_the_readers_behind_it_in)
{
    dlock_client *a = client(), *b = client(), *c = client();
    dlock *r1 = th_handle(a, "rw4", 30000, 0, 0);
    th_waiter w = {.l = th_handle(b, "rw4", 30000, 0, 0), .wait_ms = 3000};
    th_waiter r2 = {
        .l = th_handle(c, "rw4", 30000, 0, 0), .shared = 1, .wait_ms = 20000};
    pthread_t tw, tr;

    CHECK_OK(dlock_acquire_shared(r1, 0));
    th_waiter_start(&w, &tw);
    th_wait_state(a, "rw4", 1, 1);
    th_waiter_start(&r2, &tr);
    th_wait_state(a, "rw4", 2, 1);
    pthread_join(tw, NULL);
    CHECK_RC(w.rc, DLOCK_EBUSY);
    pthread_join(tr, NULL);
    CHECK_OK(r2.rc);
    /* let in by the writer's leaving (its notification), not by r1's
     * release or lease (30 s): r1 still holds. 3 s: a busy machine */
    CHECK_OP(r2.done_at - w.done_at, <, 3000);
    CHECK_EQ(dlock_held(r1), 1);
    CHECK_EQ(entries("dlock_locks", "rw4"), 0);
    CHECK_OK(dlock_release(r1));
    dlock_close(r1);
    dlock_close(w.l);
    dlock_close(r2.l);
    TH_CLIENT_CLOSE(a, b, c);
}

/* A reader's renewal (the watchdog's, and dlock_extend()) moves its own
 * entry's end only: another reader's end stays what it was. */
TEST(a_readers_renewal_moves_only_its_own_entry)
{
    dlock_client *a = client(), *b = client();
    dlock *ra = th_handle(a, "rw5", 600, 0, 0); /* renewed every 200 ms */
    dlock *rb = th_handle(b, "rw5", 20000, DLOCK_NO_RENEW, 0);

    CHECK_OK(dlock_acquire_shared(ra, 0));
    CHECK_OK(dlock_acquire_shared(rb, 0));
    uint64_t ta = dlock_token(ra), tb = dlock_token(rb);
    long long ea0 = entry_end("dlock_locks", "rw5", ta);
    long long eb0 = entry_end("dlock_locks", "rw5", tb);
    CHECK_OP(ea0, >, 0);
    CHECK_OP(eb0, >, 0);
    /* the watchdog renews ra three times or more in a second */
    th_sleep_ms(1000);
    CHECK_OP(entry_end("dlock_locks", "rw5", ta), >, ea0);
    CHECK_EQ(entry_end("dlock_locks", "rw5", tb), eb0);
    CHECK_OK(dlock_extend(ra, 5000));
    CHECK_EQ(entry_end("dlock_locks", "rw5", tb), eb0);
    /* the row's lease is the latest entry's end (rb's, 20 s) */
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT (extract(epoch FROM lock_until) * 1000)::"
                          "bigint FROM dlock_locks WHERE name = 'rw5'::bytea"),
             eb0);
    CHECK_OK(dlock_release(ra));
    CHECK_OK(dlock_release(rb));
    TH_CLOSE(ra, rb);
    TH_CLIENT_CLOSE(a, b);
}

/* A release by a reader whose entry is gone (its lease ended and a
 * statement dropped it; here: removed by hand) is DLOCK_ELOST, and writes
 * nothing: the other reader's entry stays as it was. */
TEST(a_release_whose_entry_is_gone_is_lost)
{
    dlock_client *a = client(), *b = client();
    dlock *ra = th_handle(a, "rw6", 30000, DLOCK_NO_RENEW, 0);
    dlock *rb = th_handle(b, "rw6", 30000, DLOCK_NO_RENEW, 0);

    CHECK_OK(dlock_acquire_shared(ra, 0));
    CHECK_OK(dlock_acquire_shared(rb, 0));
    uint64_t ta = dlock_token(ra), tb = dlock_token(rb);
    long long eb = entry_end("dlock_locks", "rw6", tb);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "UPDATE dlock_locks SET holders = holders - (SELECT "
                          "x.key FROM jsonb_each(holders) x WHERE (x.value "
                          "->> 't')::bigint = %llu), holds = 1 WHERE name = "
                          "'rw6'::bytea",
                          (unsigned long long)ta),
             1);
    CHECK_RC(dlock_release(ra), DLOCK_ELOST);
    CHECK_EQ(entry_end("dlock_locks", "rw6", tb), eb);
    th_check_held(a, "rw6", -1, 1);
    CHECK_OK(dlock_release(rb));
    th_check_held(a, "rw6", 0, 0);
    TH_CLOSE(ra, rb);
    TH_CLIENT_CLOSE(a, b);
}

/* A waiter at the head of the queue dies (its process killed: its
 * session, and so its entry, is dead); the release deletes its entry and
 * hands the lock to the live waiter behind it, at once. */
static int queued_child(void *arg)
{
    int *ready = arg;
    dlock_client *c = NULL;
    dlock *l = NULL;

    if (dlock_client_open(&c, srv.uri, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "rw7", NULL) != DLOCK_OK)
        return 1;
    __atomic_store_n(ready, 1, __ATOMIC_SEQ_CST);
    dlock_acquire(l, 60000); /* killed while it waits */
    return 2;
}

TEST(a_dead_waiter_is_skipped_by_the_grant_step)
{
    int *ready = th_shared(sizeof(*ready));
    dlock_client *h = client(), *c = client();
    dlock *lh = th_handle(h, "rw7", 30000, 0, 0);
    th_waiter r = {
        .l = th_handle(c, "rw7", 30000, 0, 0), .shared = 1, .wait_ms = 20000};
    pthread_t th;

    CHECK_OK(dlock_acquire(lh, 0));
    pid_t child = th_fork(queued_child, ready);
    th_wait_state(h, "rw7", 1, 1);
    kill(child, SIGKILL);
    th_wait(child);
    /* its entry stays in the table, but is dead: not a waiter any more */
    th_wait_state(h, "rw7", 0, 1);
    CHECK_EQ(entries("dlock_locks", "rw7"), 1);
    th_waiter_start(&r, &th);
    th_wait_state(h, "rw7", 1, 1);
    CHECK_EQ(entries("dlock_locks", "rw7"), 2);
    int64_t rel = th_now_ms();
    CHECK_OK(dlock_release(lh));
    pthread_join(th, NULL);
    CHECK_OK(r.rc);
    /* one hand-off past the dead entry (busy machine), not a lease */
    CHECK_OP(r.done_at - rel, <, 3000);
    CHECK_EQ(entries("dlock_locks", "rw7"), 0);
    dlock_close(lh);
    dlock_close(r.l);
    TH_CLIENT_CLOSE(h, c);
}

/* A semaphore of 2: its N is kept (another N, a read or a write hold is
 * DLOCK_EINVAL, and queues nothing), and each release of a permit grants
 * one waiter, in order. */
TEST(a_semaphore_keeps_its_n_and_grants_one_per_permit)
{
    dlock_client *a = client(), *b = client(), *c = client(),
                 *d = client();
    dlock *pa = th_handle(a, "rw8", 30000, 0, 2);
    dlock *pb = th_handle(b, "rw8", 30000, 0, 2);
    dlock *p3 = th_handle(c, "rw8", 30000, 0, 3);
    dlock *lk = th_handle(c, "rw8", 30000, 0, 0);
    th_waiter w1 = {.l = th_handle(c, "rw8", 30000, 0, 2), .wait_ms = 20000};
    th_waiter w2 = {.l = th_handle(d, "rw8", 30000, 0, 2), .wait_ms = 20000};
    pthread_t t1, t2;

    w1.wait_go = 1;
    CHECK_OK(dlock_acquire(pa, 0));
    CHECK_OK(dlock_acquire(pb, 0));
    CHECK(dlock_token(pa) != dlock_token(pb));
    CHECK_RC(dlock_acquire(p3, 1000), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "is a semaphore of 2 permits");
    CHECK_RC(dlock_acquire(lk, 1000), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "is a semaphore of 2 permits");
    CHECK_RC(dlock_acquire_shared(lk, 1000), DLOCK_EINVAL);
    CHECK_EQ(entries("dlock_locks", "rw8"), 0);
    th_waiter_start(&w1, &t1);
    th_wait_state(a, "rw8", 1, 2);
    th_waiter_start(&w2, &t2);
    th_wait_state(a, "rw8", 2, 2);
    dlock_info i = th_info(a, "rw8");
    CHECK_EQ(i.permits, 2);
    if (i.queue_len == 2)
        CHECK_CONTAINS(i.queue[0], "permit: ");
    dlock_info_clear(&i);
    int64_t rel = th_now_ms();
    CHECK_OK(dlock_release(pa));
    /* one permit freed: the first waiter alone */
    th_wait_state(a, "rw8", 1, 2);
    CHECK(th_waiter_returned(&w1, 10000));
    CHECK_EQ(w2.done_at, 0);             /* one permit freed: one waiter in */
    CHECK_OP(w1.done_at - rel, <, 3000); /* a hand-off, busy machine */
    CHECK_OK(dlock_release(pb));
    th_waiter_go(&w1);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    CHECK_OK(w1.rc);
    CHECK_OK(w2.rc);
    CHECK_OP(w2.token, >, w1.token);
    CHECK_OP(w1.token, >, dlock_token(pb));
    /* free: the row keeps N for dlock status only; the name binds
     * nothing, so a lock may take it now */
    i = th_info(a, "rw8");
    CHECK_EQ(i.held, 0);
    CHECK_EQ(i.permits, 2);
    dlock_info_clear(&i);
    CHECK_OK(dlock_acquire(lk, 0));
    CHECK_RC(dlock_acquire(pa, 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "is a lock, not a semaphore");
    CHECK_OK(dlock_release(lk));
    TH_CLOSE(pa, pb, p3, lk);
    dlock_close(w1.l);
    dlock_close(w2.l);
    TH_CLIENT_CLOSE(a, b, c, d);
}

/* A wait that ends takes only a hold of its own kind: a read hold of the
 * same owner left in the store by an earlier wait (its answer lost: the
 * store granted it, the caller gave up) is not the write hold it waits
 * for (found by the safety suite's short waits: a writer's leaving
 * returned the owner's leftover read entry, and wrote beside a reader). */
TEST(a_wait_never_takes_the_owners_hold_of_another_kind)
{
    dlock_client *a = client(), *b = client();
    dlock *l = th_handle(a, "rw11", 30000, 0, 0);
    dlock *other = th_handle(b, "rw11", 30000, 0, 0);
    char owner[128];

    /* the owner string of this thread in client a, from its read hold */
    CHECK_OK(dlock_acquire_shared(l, 0));
    th_sql_query(&srv, owner, sizeof(owner),
                 "SELECT x.key FROM dlock_locks l, jsonb_each(l.holders) x "
                 "WHERE l.name = 'rw11'::bytea");
    CHECK_OK(dlock_release(l));
    /* another reader holds; the leftover read entry of this thread */
    CHECK_OK(dlock_acquire_shared(other, 0));
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "UPDATE dlock_locks SET holders = holders || "
                          "jsonb_build_object('%s', jsonb_build_object('t', "
                          "nextval('dlock_locks_tokens'), 'u', floor(extract("
                          "epoch FROM clock_timestamp()) * 1000)::bigint + "
                          "30000, 's', 0, 'd', 'left over')), holds = 2 "
                          "WHERE name = 'rw11'::bytea",
                          owner),
             1);
    int64_t t0 = th_now_ms();
    CHECK_RC(dlock_acquire(l, 300), DLOCK_EBUSY);
    CHECK_OP(th_now_ms() - t0, >=, 300);
    CHECK_EQ(dlock_held(l), 0);
    CHECK_OK(dlock_release(other));
    TH_CLOSE(l, other);
    TH_CLIENT_CLOSE(a, b);
}

/* Statements a role ran, counted in the server's log (log_statement =
 * 'all' for that role only): every "execute" of a prepared statement and
 * every simple query. */
static long long log_size(void)
{
    char path[600];
    struct stat st;

    snprintf(path, sizeof(path), "%s/server.log", srv.dir);
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static int statements_since(long long from, const char *role)
{
    char path[600], line[8192], tag[80];
    FILE *f;
    int n = 0;

    th_sleep_ms(200); /* the server writes its log as it runs them */
    snprintf(path, sizeof(path), "%s/server.log", srv.dir);
    snprintf(tag, sizeof(tag), "[%s] LOG:  ", role);
    f = fopen(path, "r");
    CHECK(f != NULL);
    if (!f)
        return -1;
    fseek(f, from, SEEK_SET);
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, tag);
        if (p && (!strncmp(p + strlen(tag), "execute ", 8) ||
                  !strncmp(p + strlen(tag), "statement: ", 11)))
            n++;
    }
    fclose(f);
    return n;
}

/* The uncontended shared cycle (acquire + release of a name free in the
 * store) is one statement each way, as the exclusive one: counted by the
 * server, for read holds and permits beside writes. */
TEST(the_uncontended_shared_cycle_is_one_statement_each_way)
{
    char uri[300];
    const int n = 20;

    th_sql_query(&srv, NULL, 0,
                 "DO $$ BEGIN CREATE ROLE counted LOGIN SUPERUSER PASSWORD "
                 "'counted-secret'; EXCEPTION WHEN duplicate_object THEN "
                 "NULL; END $$");
    th_sql_query(&srv, NULL, 0,
                 "ALTER ROLE counted SET log_statement = 'all'");
    th_sql_query(&srv, NULL, 0,
                 "ALTER SYSTEM SET log_line_prefix = '[%%u] '");
    th_sql_query(&srv, NULL, 0, "SELECT pg_reload_conf()");
    th_sleep_ms(300); /* the postmaster reads its configuration again */
    snprintf(uri, sizeof(uri),
             "postgres://counted:counted-secret@127.0.0.1:%d/postgres",
             srv.port);
    dlock_client *c = th_client(uri, NULL);
    dlock *lw = th_handle(c, "rw9w", 30000, 0, 0);
    dlock *lr = th_handle(c, "rw9r", 30000, 0, 0);
    dlock *lp = th_handle(c, "rw9p", 30000, 0, 3);

    /* the first cycle of each prepares its statements */
    CHECK_OK(dlock_acquire(lw, 0));
    CHECK_OK(dlock_release(lw));
    CHECK_OK(dlock_acquire_shared(lr, 0));
    CHECK_OK(dlock_release(lr));
    CHECK_OK(dlock_acquire(lp, 0));
    CHECK_OK(dlock_release(lp));
    long long b0 = log_size();
    for (int i = 0; i < n; i++) {
        CHECK_OK(dlock_acquire(lw, 0));
        CHECK_OK(dlock_release(lw));
    }
    int sw = statements_since(b0, "counted");
    long long b1 = log_size();
    for (int i = 0; i < n; i++) {
        CHECK_OK(dlock_acquire_shared(lr, 0));
        CHECK_OK(dlock_release(lr));
    }
    int sr = statements_since(b1, "counted");
    long long b2 = log_size();
    for (int i = 0; i < n; i++) {
        CHECK_OK(dlock_acquire(lp, 0));
        CHECK_OK(dlock_release(lp));
    }
    int sp = statements_since(b2, "counted");
    CHECK_EQ(sw, 2 * n);
    CHECK_EQ(sr, 2 * n);
    CHECK_EQ(sp, 2 * n);
    TH_CLOSE(lw, lr, lp);
    dlock_client_close(c);
    th_sql_query(&srv, NULL, 0, "ALTER SYSTEM RESET log_line_prefix");
    th_sql_query(&srv, NULL, 0, "SELECT pg_reload_conf()");
}

/* The schema of the previous version (its DDL as it was made, from git:
 * `git show <before issue 19>:src/stores/pg/pg_sql.c`, its schema_sql for
 * the table "old_locks"). */
static const char old_ddl[] =
    "SELECT pg_advisory_xact_lock(('x' || substr(md5('dlock "
    "schema'::bytea), 1, 16))::bit(64)::bigint); CREATE SEQUENCE IF NOT "
    "EXISTS \"old_locks_tokens\"; CREATE TABLE IF NOT EXISTS \"old_locks\" "
    "( name bytea PRIMARY KEY, owner text, holder text, holds integer "
    "NOT NULL DEFAULT 0, token bigint NOT NULL DEFAULT 0, locked_at "
    "timestamptz NOT NULL DEFAULT clock_timestamp(), lock_until "
    "timestamptz NOT NULL DEFAULT clock_timestamp()); CREATE TABLE IF "
    "NOT EXISTS \"old_locks_waiters\" ( seq bigserial PRIMARY KEY, name "
    "bytea NOT NULL, client text NOT NULL, waiter bigint NOT NULL, "
    "owner text NOT NULL, holder text, ttl_ms bigint NOT NULL, pid "
    "integer NOT NULL, since timestamptz); CREATE INDEX IF NOT EXISTS "
    "\"old_locks_waiters_name\" ON \"old_locks_waiters\" (name, seq); "
    "CREATE OR REPLACE FUNCTION \"old_locks_release\"(n bytea, o text, "
    "tok bigint, OUT ok boolean, OUT granted text, OUT gtoken bigint) "
    "LANGUAGE plpgsql AS $f$ DECLARE w record; BEGIN  ok := false; "
    "PERFORM 1 FROM \"old_locks\" WHERE name = n AND owner = o AND token "
    "= tok AND lock_until > clock_timestamp() FOR UPDATE; IF NOT FOUND "
    "THEN RETURN; END IF; ok := true; LOOP  SELECT * INTO w FROM "
    "\"old_locks_waiters\" WHERE name = n ORDER BY seq LIMIT 1;  EXIT "
    "WHEN NOT FOUND;  IF w.owner <> o AND (CASE WHEN w.pid = "
    "pg_backend_pid() THEN w.client = split_part(o, ':', 1) ELSE NOT "
    "pg_try_advisory_xact_lock_shared(('x' || substr(md5(w.client || "
    "':' || w.pid), 1, 8))::bit(32)::int, ('x' || substr(md5(w.client "
    "|| ':' || w.pid), 9, 8))::bit(32)::int) END) THEN   gtoken := "
    "nextval('\"old_locks_tokens\"');   UPDATE \"old_locks\" SET owner = "
    "w.owner, holder = w.holder, holds = 1, token = gtoken, locked_at = "
    "clock_timestamp(), lock_until = clock_timestamp() + w.ttl_ms * "
    "interval '1 millisecond' WHERE name = n;   DELETE FROM "
    "\"old_locks_waiters\" WHERE name = n AND client = w.client AND "
    "waiter = w.waiter;   PERFORM pg_notify('dlock_' || w.client, 'g ' "
    "|| w.waiter || ' ' || gtoken);   granted := w.client || ':' || "
    "w.waiter;   RETURN;  END IF;  DELETE FROM \"old_locks_waiters\" "
    "WHERE seq = w.seq; END LOOP; UPDATE \"old_locks\" SET owner = NULL, "
    "holder = NULL, holds = 0, lock_until = clock_timestamp() WHERE "
    "name = n; END $f$; CREATE OR REPLACE FUNCTION \"old_locks_leave\"(n "
    "bytea, o text, c text, wt bigint, ttl bigint) RETURNS bigint "
    "LANGUAGE plpgsql AS $f$ DECLARE t bigint; BEGIN PERFORM 1 FROM "
    "\"old_locks\" WHERE name = n FOR UPDATE; DELETE FROM "
    "\"old_locks_waiters\" WHERE name = n AND client = c AND waiter = wt; "
    "UPDATE \"old_locks\" SET lock_until = greatest(lock_until, "
    "clock_timestamp() + ttl * interval '1 millisecond') WHERE name = n "
    "AND owner = o AND lock_until > clock_timestamp() RETURNING token "
    "INTO t; RETURN t; END $f$";

/* A table made by the previous version, with a lock held in it by a
 * client of that version (its row written as its upsert writes it), is
 * migrated by the first client of this version that opens it: the
 * columns and functions are added, the held row stays held (a writer and
 * a reader are busy, and queue), and the old client's release (the old
 * T_release, now the new grant step's) hands it over to the readers
 * queued, who are told. */
TEST(a_table_of_the_previous_version_is_migrated)
{
    char uri[400];
    const char *old_owner = "0123456789abcdef0123456789abcdef:4242";

    th_sql_query(&srv, NULL, 0, "%s", old_ddl);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM pg_attribute WHERE attrelid "
                          "= 'old_locks'::regclass AND attname = 'holders'"),
             0);
    long long tok = th_sql_query(
        &srv, NULL, 0,
        "INSERT INTO old_locks (name, owner, holder, holds, token, "
        "locked_at, lock_until) VALUES ('rw10'::bytea, '%s', 'an older "
        "client', 1, nextval('old_locks_tokens'), clock_timestamp(), "
        "clock_timestamp() + interval '30 seconds') RETURNING token",
        old_owner);
    CHECK_OP(tok, >, 0);

    snprintf(uri, sizeof(uri), "%s?table=old_locks", srv.uri);
    dlock_client *a = th_client(uri, NULL), *b = th_client(uri, NULL);
    CHECK_EQ(th_sql_query(&srv, NULL, 0,
                          "SELECT count(*) FROM pg_attribute WHERE attrelid "
                          "IN ('old_locks'::regclass, "
                          "'old_locks_waiters'::regclass) AND attname IN "
                          "('holders', 'permits', 'kind')"),
             4);
    dlock *w = th_handle(a, "rw10", 30000, 0, 0);
    dlock *r = th_handle(a, "rw10", 30000, 0, 0);
    CHECK_RC(dlock_acquire(w, 0), DLOCK_EBUSY);
    CHECK_RC(dlock_acquire_shared(r, 0), DLOCK_EBUSY);
    dlock_info i = th_info(a, "rw10");
    CHECK_EQ(i.held, 1);
    CHECK_STR(i.holder, "an older client");
    CHECK_EQ(i.token, tok);
    dlock_info_clear(&i);
    th_waiter r1 = {
        .l = th_handle(a, "rw10", 30000, 0, 0), .shared = 1, .wait_ms = 20000};
    th_waiter r2 = {
        .l = th_handle(b, "rw10", 30000, 0, 0), .shared = 1, .wait_ms = 20000};
    pthread_t t1, t2;
    th_waiter_start(&r1, &t1);
    th_wait_state(b, "rw10", 1, 1);
    th_waiter_start(&r2, &t2);
    th_wait_state(b, "rw10", 2, 1);
    /* the older client releases as it always did */
    char granted[200];
    CHECK_EQ(th_sql_query(&srv, granted, sizeof(granted),
                          "SELECT ok FROM old_locks_release('rw10'::bytea, "
                          "'%s', %lld)",
                          old_owner, tok),
             1);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    CHECK_OK(r1.rc);
    CHECK_OK(r2.rc);
    CHECK_OP(r1.token, >, tok);
    CHECK_OP(r2.token, >, r1.token);
    CHECK_OK(dlock_acquire(w, 0));
    CHECK_OK(dlock_release(w));
    TH_CLOSE(w, r);
    dlock_close(r1.l);
    dlock_close(r2.l);
    TH_CLIENT_CLOSE(a, b);
}

/* dlock_break() of a name that readers hold, with a writer queued and a
 * reader behind it: every read hold goes at once; the grant step lets
 * the writer in (a notification: at once, not at a lease's end) and
 * the reader behind it keeps its place; the evicted readers' releases
 * are ELOST. dlock_list() describes the row as dlock_inspect() does. */
TEST(a_break_of_readers_lets_the_queued_writer_in)
{
    dlock_client *a = client(), *b = client(), *op = client(),
                 *c = client(), *d = client();
    dlock *ra = th_handle(a, "rwb", 30000, 0, 0);
    dlock *rb = th_handle(b, "rwb", 30000, 0, 0);
    th_waiter w[2];
    pthread_t th[2];
    dlock_info ev;

    CHECK_OK(dlock_acquire_shared(ra, 0));
    CHECK_OK(dlock_acquire_shared(rb, 0));
    for (int i = 0; i < 2; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].l = th_handle(i ? d : c, "rwb", 30000, 0, 0);
        w[i].shared = i == 1; /* a writer, then a reader */
        w[i].wait_ms = 20000;
        w[i].wait_go = i == 0;
        th_waiter_start(&w[i], &th[i]);
        th_wait_state(op, "rwb", i + 1, 2);
    }
    dlock_list_page p;
    dlock_info in = th_info(op, "rwb");
    CHECK_OK(dlock_list(op, "rwb", NULL, 10, 0, &p));
    CHECK_EQ(p.n, 1);
    if (p.n == 1) {
        dlock_info *l = &p.locks[0].info;
        CHECK_EQ(l->held, 1);
        CHECK_EQ(l->shared, 1);
        CHECK_EQ(l->holders, 2);
        CHECK_STR(l->holder, in.holder);
        CHECK_EQ(l->token, in.token);
        CHECK_EQ(l->waiters, 2);
        CHECK_EQ(l->queue_len, in.queue_len);
        for (size_t i = 0; i < l->queue_len && i < in.queue_len; i++)
            CHECK_STR(l->queue[i], in.queue[i]);
        if (l->queue_len == 2) {
            CHECK_CONTAINS(l->queue[0], "write: ");
            CHECK_CONTAINS(l->queue[1], "read: ");
        }
    }
    dlock_list_clear(&p);
    dlock_info_clear(&in);
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_break(op, "rwb", &ev));
    CHECK_EQ(ev.shared, 1);
    CHECK_EQ(ev.holders, 2);
    CHECK_EQ(ev.waiters, 2);
    uint64_t last = ev.token;
    dlock_info_clear(&ev);
    CHECK(th_waiter_returned(&w[0], 10000));
    CHECK_OK(w[0].rc);
    CHECK_OP(w[0].done_at - t0, <, 3000); /* one hand-off, busy machine */
    CHECK_OP(w[0].token, >, last);
    th_wait_state(op, "rwb", 1, 1); /* the reader still waits */
    CHECK_EQ(w[1].done_at, 0);
    CHECK_RC(dlock_release(ra), DLOCK_ELOST);
    CHECK_RC(dlock_release(rb), DLOCK_ELOST);
    th_waiter_go(&w[0]);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    CHECK_OK(w[1].rc);
    CHECK_OP(w[1].token, >, w[0].token);
    for (int i = 0; i < 2; i++)
        dlock_close(w[i].l);
    TH_CLOSE(ra, rb);
    TH_CLIENT_CLOSE(a, b, c, d, op);
}

/* dlock_break() of a semaphore: every permit goes; the grant step gives
 * one permit to each waiter it can (two here), at once; the row keeps N. */
TEST(a_break_of_a_semaphore_gives_the_permits_to_its_waiters)
{
    dlock_client *a = client(), *b = client(), *op = client(),
                 *c = client(), *d = client();
    dlock *pa = th_handle(a, "rwsb", 30000, 0, 2);
    dlock *pb = th_handle(b, "rwsb", 30000, 0, 2);
    th_waiter w[2];
    pthread_t th[2];

    CHECK_OK(dlock_acquire(pa, 0));
    CHECK_OK(dlock_acquire(pb, 0));
    uint64_t most = dlock_token(pb) > dlock_token(pa) ? dlock_token(pb)
                                                      : dlock_token(pa);
    for (int i = 0; i < 2; i++) {
        memset(&w[i], 0, sizeof(w[i]));
        w[i].l = th_handle(i ? d : c, "rwsb", 30000, 0, 2);
        w[i].wait_ms = 20000;
        w[i].wait_go = 1;
        th_waiter_start(&w[i], &th[i]);
        th_wait_state(op, "rwsb", i + 1, 2);
    }
    int64_t t0 = th_now_ms();
    th_break_counts(op, "rwsb", 2, 2, 2);
    for (int i = 0; i < 2; i++) {
        CHECK(th_waiter_returned(&w[i], 10000));
        CHECK_OK(w[i].rc);
        CHECK_OP(w[i].done_at - t0, <, 3000); /* a hand-off, busy machine */
        CHECK_OP(w[i].token, >, most);
    }
    dlock_info i = th_info(op, "rwsb");
    CHECK_EQ(i.held, 1);
    CHECK_EQ(i.holders, 2);
    CHECK_EQ(i.permits, 2);
    dlock_info_clear(&i);
    CHECK_RC(dlock_release(pa), DLOCK_ELOST);
    CHECK_RC(dlock_release(pb), DLOCK_ELOST);
    th_waiter_go(&w[0]);
    th_waiter_go(&w[1]);
    for (int k = 0; k < 2; k++) {
        pthread_join(th[k], NULL);
        dlock_close(w[k].l);
    }
    TH_CLOSE(pa, pb);
    TH_CLIENT_CLOSE(a, b, c, d, op);
}

/* ------------------------------------------------------------------------ */
/* Advisory mode: semaphores                                                */
/* ------------------------------------------------------------------------ */

static char adv[400]; /* srv.uri + ?mode=advisory */

/* Advisory locks of the server that are not granted (sessions waiting),
 * and those granted on the keys a semaphore of name uses beside its slots
 * (its gate: a head still holding it). */
static long long adv_waiting(void)
{
    return th_sql_query(&srv, NULL, 0,
                        "SELECT count(*) FROM pg_locks WHERE locktype = "
                        "'advisory' AND NOT granted");
}

/* Granted advisory locks of every session but ours. */
static long long adv_granted(void)
{
    return th_sql_query(&srv, NULL, 0,
                        "SELECT count(*) FROM pg_locks WHERE locktype = "
                        "'advisory' AND granted AND pid <> pg_backend_pid()");
}

static long long sessions(void)
{
    return th_sql_query(&srv, NULL, 0,
                        "SELECT count(*) FROM pg_stat_activity WHERE "
                        "backend_type = 'client backend' AND pid <> "
                        "pg_backend_pid()");
}

/* sessions(), once two looks 1.2 s apart (longer than a client's idle
 * close of its extra sessions, PG_IDLE_MS, 1 s) agree: at most ten looks
 * (a busy machine closes late; a count taken while one closes is off by
 * one) */
static long long settled_sessions(void)
{
    long long n = sessions(), m;

    for (int i = 0; i < 10; i++, n = m) {
        th_sleep_ms(1200);
        if ((m = sessions()) == n)
            break;
    }
    return n;
}

typedef struct sem_child_arg {
    int ready;
} sem_child_arg;

static int permit_child(void *arg)
{
    sem_child_arg *a = arg;
    dlock_client *c = NULL;
    dlock_options o;
    dlock *l = NULL;

    memset(&o, 0, sizeof(o));
    o.permits = 2;
    if (dlock_client_open(&c, adv, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "adv1", &o) != DLOCK_OK ||
        dlock_acquire(l, 10000) != DLOCK_OK)
        return 1;
    __atomic_store_n(&a->ready, 1, __ATOMIC_SEQ_CST);
    for (;;)
        pause(); /* killed holding */
}

/* A permit holder killed: its session ends and the server frees its slot,
 * which the head of the queue waits on: it gets the permit at once (no
 * lease in this mode), and dlock status showed it queued meanwhile. */
TEST(an_advisory_permit_holders_death_wakes_the_head_at_once)
{
    sem_child_arg *a = th_shared(sizeof(*a));
    dlock_client *c = th_client(adv, NULL), *d = th_client(adv, NULL);
    dlock *p = th_handle(c, "adv1", 0, 0, 2);
    th_waiter w = {.l = th_handle(d, "adv1", 0, 0, 2), .wait_ms = 20000};
    pthread_t th;

    pid_t child = th_fork(permit_child, a);
    (void)th_wait_flag(&a->ready, 10000);
    CHECK(a->ready);
    CHECK_OK(dlock_acquire(p, 0));
    th_waiter_start(&w, &th);
    th_wait_state(c, "adv1", 1, 2);
    dlock_info i = th_info(c, "adv1");
    CHECK_EQ(i.permits, 2);
    CHECK_EQ(i.held, 1);
    if (i.queue_len == 1)
        CHECK_CONTAINS(i.queue[0], "permit: ");
    dlock_info_clear(&i);
    th_sleep_ms(300); /* the head asleep on both slots, most likely */
    int64_t t0 = th_now_ms();
    kill(child, SIGKILL);
    th_wait(child);
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    /* woken by the server when the session ended: no lease, no timer;
     * 1 s for a busy machine */
    CHECK_OP(w.done_at - t0, <, 1000);
    CHECK_OK(dlock_release(p));
    dlock_close(p);
    dlock_close(w.l);
    TH_CLIENT_CLOSE(c, d);
}

/* The head of the queue gives up at its deadline: every wait of it (the
 * gate's, and one per slot) ends, and nothing of it is left: no session
 * waits, no key beyond the holders' is held, and its extra sessions are
 * gone a moment later (the pool closes them after a second). */
TEST(an_advisory_head_that_gives_up_leaves_nothing)
{
    dlock_client *a = th_client(adv, NULL), *b = th_client(adv, NULL),
                 *c = th_client(adv, NULL);
    dlock *pa = th_handle(a, "adv2", 0, 0, 3), *pb = th_handle(b, "adv2", 0, 0, 3),
          *pc = th_handle(c, "adv2", 0, 0, 3);
    dlock_client *h = th_client(adv, NULL);
    dlock *ph = th_handle(h, "adv2", 0, 0, 3);

    CHECK_OK(dlock_acquire(pa, 0));
    CHECK_OK(dlock_acquire(pb, 0));
    CHECK_OK(dlock_acquire(pc, 0));
    /* the clients' idle extra sessions closed */
    long long n0 = settled_sessions(), held = adv_granted();
    CHECK_EQ(held, 12); /* three holders: a slot, two family keys and the
                          * witness (pg_int.h, ADV_W) each */
    int64_t t0 = th_now_ms();
    CHECK_RC(dlock_acquire(ph, 600), DLOCK_EBUSY);
    /* at its deadline (the server's lock_timeout), not later: 1 s of
     * slack for a busy machine */
    CHECK_OP(th_now_ms() - t0, >=, 600);
    CHECK_OP(th_now_ms() - t0, <, 600 + 1000);
    CHECK_EQ(adv_waiting(), 0);
    CHECK_EQ(adv_granted(), held);
    CHECK_EQ(settled_sessions(), n0);
    /* and the semaphore works on: a permit freed goes to the next */
    CHECK_OK(dlock_release(pa));
    CHECK_OK(dlock_acquire(ph, 0));
    CHECK_OK(dlock_release(ph));
    CHECK_OK(dlock_release(pb));
    CHECK_OK(dlock_release(pc));
    TH_CLOSE(pa, pb, pc, ph);
    TH_CLIENT_CLOSE(a, b, c, h);
}

/* Waiters of a semaphore are served in arrival order, one per permit
 * freed: a release lets in the first only. */
TEST(advisory_permit_waiters_are_served_in_order)
{
    dlock_client *h = th_client(adv, NULL), *c1 = th_client(adv, NULL),
                 *c2 = th_client(adv, NULL);
    dlock *ph = th_handle(h, "adv3", 0, 0, 1);
    th_waiter w1 = {.l = th_handle(c1, "adv3", 0, 0, 1), .wait_ms = 20000};
    th_waiter w2 = {.l = th_handle(c2, "adv3", 0, 0, 1), .wait_ms = 20000};
    pthread_t t1, t2;

    w1.wait_go = 1;
    CHECK_OK(dlock_acquire(ph, 0));
    th_waiter_start(&w1, &t1);
    th_wait_state(h, "adv3", 1, 1);
    th_waiter_start(&w2, &t2);
    th_wait_state(h, "adv3", 2, 1);
    CHECK_OK(dlock_release(ph));
    CHECK(th_waiter_returned(&w1, 10000));
    CHECK_OK(w1.rc);
    th_sleep_ms(200); /* w2 would have been let in by now */
    CHECK_EQ(w2.done_at, 0); /* w1 holds until told */
    int64_t t_go = th_now_ms();
    th_waiter_go(&w1);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    CHECK_OK(w2.rc);
    CHECK_OP(w2.done_at, >=, t_go);
    CHECK_OP(w2.token, >, w1.token);
    dlock_close(ph);
    dlock_close(w1.l);
    dlock_close(w2.l);
    TH_CLIENT_CLOSE(h, c1, c2);
}

/* Tries racing from several processes (kazoo #213): never more than N
 * hold, counted by the holders themselves and by the server's slots. */
typedef struct race_sem {
    int inside, most, done, bad;
    volatile int stop;
} race_sem;

static int try_child(void *arg)
{
    race_sem *r = arg;
    dlock_client *c = NULL;
    dlock_options o;
    dlock *l = NULL;

    memset(&o, 0, sizeof(o));
    o.permits = 2;
    if (dlock_client_open(&c, adv, th_patient()) != DLOCK_OK ||
        dlock_open(&l, c, "adv4", &o) != DLOCK_OK)
        return 1;
    for (int i = 0; i < 100000 && !__atomic_load_n(&r->stop, __ATOMIC_SEQ_CST);
         i++) {
        int rc = dlock_acquire(l, 0);
        if (rc == DLOCK_EBUSY)
            continue;
        if (rc != DLOCK_OK) {
            __atomic_add_fetch(&r->bad, 1, __ATOMIC_SEQ_CST);
            continue;
        }
        int n = __atomic_add_fetch(&r->inside, 1, __ATOMIC_SEQ_CST);
        int m = __atomic_load_n(&r->most, __ATOMIC_SEQ_CST);
        while (n > m && !__atomic_compare_exchange_n(&r->most, &m, n, 0,
                                                     __ATOMIC_SEQ_CST,
                                                     __ATOMIC_SEQ_CST)) {
        }
        usleep(500);
        __atomic_sub_fetch(&r->inside, 1, __ATOMIC_SEQ_CST);
        if (dlock_release(l) != DLOCK_OK)
            __atomic_add_fetch(&r->bad, 1, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&r->done, 1, __ATOMIC_SEQ_CST);
    }
    dlock_close(l);
    dlock_client_close(c);
    return 0;
}

TEST(advisory_permit_tries_never_hold_more_than_n)
{
    enum { P = 5 };
    race_sem *r = th_shared(sizeof(*r));
    pid_t pid[P];
    long long most_slots = 0;

    for (int i = 0; i < P; i++)
        pid[i] = th_fork(try_child, r);
    /* the server's view while they race: shared holders of the name's
     * family key (each permit holder's session holds it shared; a look
     * holds it exclusively for an instant) */
    for (int i = 0; i < 100; i++) {
        long long n = th_sql_query(
            &srv, NULL, 0,
            "SELECT count(*) FROM pg_locks l WHERE l.locktype = 'advisory' "
            "AND l.objsubid = 1 AND l.granted AND l.mode = 'ShareLock' AND "
            "((l.classid::bigint << 32) | l.objid::bigint) = ('x' || "
            "substr(md5('adv4'::bytea || '\\x00'::bytea || 'f'::bytea), 1, "
            "16))::bit(64)::bigint");
        if (n > most_slots)
            most_slots = n;
        th_sleep_ms(20);
    }
    __atomic_store_n(&r->stop, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < P; i++)
        CHECK_EQ(th_wait(pid[i]), 0);
    CHECK_EQ(r->bad, 0);
    CHECK_OP(r->done, >, 10);
    CHECK_OP(r->most, <=, 2);
    CHECK_OP(most_slots, <=, 2);
    CHECK_OP(most_slots, >=, 1); /* the look found the key: not vacuous */
}

/* A semaphore of one N while held: another N, or a permit on a name held
 * as a lock, is DLOCK_EINVAL naming what it is; N above this mode's cap is
 * refused with the cap. (A lock's take does not look for a semaphore:
 * design.md, "PostgreSQL advisory mode semaphores".) */
TEST(advisory_semaphore_kinds_and_cap)
{
    dlock_client *c = th_client(adv, NULL), *d = th_client(adv, NULL);
    dlock *p2 = th_handle(c, "adv5", 0, 0, 2), *p3 = th_handle(d, "adv5", 0, 0, 3);
    dlock *lk = th_handle(d, "adv5", 0, 0, 0);
    dlock *big = th_handle(d, "adv5-big", 0, 0, 33);

    CHECK_OK(dlock_acquire(p2, 0));
    CHECK_RC(dlock_acquire(p3, 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "is a semaphore of 2 permits");
    CHECK_RC(dlock_acquire(p3, 500), DLOCK_EINVAL);
    CHECK_EQ(adv_waiting(), 0);
    dlock_info i = th_info(c, "adv5");
    CHECK_EQ(i.permits, 2);
    CHECK_EQ(i.holders, 1);
    dlock_info_clear(&i);
    CHECK_OK(dlock_release(p2));
    /* free: the name binds nothing; a lock now, and a permit is refused */
    CHECK_OK(dlock_acquire_shared(lk, 0));
    CHECK_RC(dlock_acquire(p2, 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "is a lock, not a semaphore");
    CHECK_OK(dlock_release(lk));
    CHECK_RC(dlock_acquire(big, 0), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "at most 32 permits");
    TH_CLOSE(p2, p3, lk, big);
    TH_CLIENT_CLOSE(c, d);
}

/* dlock_break() of an advisory semaphore: the permit holders' sessions
 * end (their family key is held shared by each), the head of the queue,
 * waiting on every slot, is not one of them and gets a permit at once;
 * the holders' releases are ELOST. */
TEST(an_advisory_break_of_a_semaphore_wakes_the_head)
{
    dlock_client *c = th_client(adv, NULL), *d = th_client(adv, NULL),
                 *e = th_client(adv, NULL), *op = th_client(adv, NULL);
    dlock *pa = th_handle(c, "adv6", 0, 0, 2), *pb = th_handle(d, "adv6", 0, 0, 2);
    th_waiter w = {.l = th_handle(e, "adv6", 0, 0, 2), .wait_ms = 20000};
    pthread_t th;
    dlock_info ev;

    CHECK_OK(dlock_acquire(pa, 0));
    CHECK_OK(dlock_acquire(pb, 0));
    uint64_t most = dlock_token(pb) > dlock_token(pa) ? dlock_token(pb)
                                                      : dlock_token(pa);
    th_waiter_start(&w, &th);
    th_wait_state(op, "adv6", 1, 2);
    th_sleep_ms(300); /* the head asleep on both slots, most likely */
    int64_t t0 = th_now_ms();
    CHECK_OK(dlock_break(op, "adv6", &ev));
    CHECK_EQ(ev.permits, 2);
    CHECK_EQ(ev.holders, 2);
    CHECK_EQ(ev.waiters, 1);
    if (ev.queue_len == 1)
        CHECK_CONTAINS(ev.queue[0], "permit: ");
    dlock_info_clear(&ev);
    pthread_join(th, NULL);
    CHECK_OK(w.rc);
    /* woken by the server as the sessions ended: 3 s for a busy machine */
    CHECK_OP(w.done_at - t0, <, 3000);
    CHECK_OP(w.token, >, most);
    CHECK_RC(dlock_release(pa), DLOCK_ELOST);
    CHECK_RC(dlock_release(pb), DLOCK_ELOST);
    CHECK_RC(dlock_break(op, "adv6", NULL), DLOCK_ENOTHELD);
    TH_CLOSE(pa, pb);
    dlock_close(w.l);
    TH_CLIENT_CLOSE(c, d, e, op);
}

static const th_test tests[] = {
    T(a_dead_readers_entry_ends_at_its_lease),
    T(the_last_readers_release_hands_over_to_the_writer),
    T(a_writers_release_lets_in_the_readers_at_the_head_only),
    T(a_writer_giving_up_lets_the_readers_behind_it_in),
    T(a_readers_renewal_moves_only_its_own_entry),
    T(a_release_whose_entry_is_gone_is_lost),
    T(a_dead_waiter_is_skipped_by_the_grant_step),
    T(a_semaphore_keeps_its_n_and_grants_one_per_permit),
    T(a_wait_never_takes_the_owners_hold_of_another_kind),
    T(the_uncontended_shared_cycle_is_one_statement_each_way),
    T(a_table_of_the_previous_version_is_migrated),
    T(an_advisory_permit_holders_death_wakes_the_head_at_once),
    T(an_advisory_head_that_gives_up_leaves_nothing),
    T(advisory_permit_waiters_are_served_in_order),
    T(advisory_permit_tries_never_hold_more_than_n),
    T(advisory_semaphore_kinds_and_cap),
    T(a_break_of_readers_lets_the_queued_writer_in),
    T(a_break_of_a_semaphore_gives_the_permits_to_its_waiters),
    T(an_advisory_break_of_a_semaphore_wakes_the_head),
    {NULL, NULL, 0, 0},
};

int main(int argc, char **argv)
{
    if (!th_sql_available("pg"))
        th_skip("no PostgreSQL server or libpq in this build");
    th_sql_start(&srv, "pg");
    snprintf(adv, sizeof(adv), "%s?mode=advisory", srv.uri);
    return th_main(argc, argv, tests);
}
