/*
 * test_redis.c -- what only the Redis store does, and how it fails:
 * authentication, sockets, databases and prefixes, keys of the wrong type,
 * a server that is down, frozen, killed mid-wait or restarted empty, and
 * the claims about traffic (no commands while waiting, one subscriber
 * connection per client, fair hand-off wakes only the head).
 */
#include "test.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

static th_redis srv;  /* plain, shared by most tests */
static th_redis auth; /* with passwords */

static dlock_client *client_at(const char *uri)
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

static void cycle(dlock_client *c, const char *name)
{
    dlock *l = handle(c, name, 0, 0);

    CHECK_OK(dlock_acquire(l, 1000));
    CHECK_OP(dlock_token(l), >, 0);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
}

static void start_auth(void)
{
    if (auth.pid > 0)
        return;
    th_redis_start(&auth,
                   "user default on >topsecret ~* &* +@all\n"
                   "user alice on >s3cr3t-pw ~* &* +@all\n"
                   "user bob on >b0b-pw ~other:* &* +@all\n");
}

/* ------------------------------------------------------------------------ */

TEST(acl_user_and_password)
{
    char uri[256];
    dlock_client *c;

    start_auth();
    snprintf(uri, sizeof(uri), "redis://alice:s3cr3t-pw@127.0.0.1:%d",
             auth.port);
    c = client_at(uri);
    cycle(c, "auth");
    CHECK(strstr(dlock_client_store(c), "s3cr3t-pw") == NULL);
    CHECK_CONTAINS(dlock_client_store(c), "alice:***@");
    dlock_client_close(c);

    snprintf(uri, sizeof(uri), "redis://:topsecret@127.0.0.1:%d", auth.port);
    c = client_at(uri);
    cycle(c, "auth");
    dlock_client_close(c);

    /* a password with characters that need escaping */
    snprintf(uri, sizeof(uri), "redis://alice:s3cr3t%%2Dpw@127.0.0.1:%d",
             auth.port);
    c = client_at(uri);
    dlock_client_close(c);
}

TEST(refused_credentials_give_eauth_without_the_password)
{
    char uri[256];
    dlock_client *c = NULL;

    start_auth();
    snprintf(uri, sizeof(uri), "redis://alice:wrong-pw-123@127.0.0.1:%d",
             auth.port);
    CHECK_RC(dlock_client_open(&c, uri, NULL), DLOCK_EAUTH);
    CHECK(c == NULL);
    CHECK(strstr(dlock_errmsg(), "wrong-pw-123") == NULL);
    CHECK_CONTAINS(dlock_errmsg(), "auth");

    snprintf(uri, sizeof(uri), "redis://127.0.0.1:%d", auth.port);
    CHECK_RC(dlock_client_open(&c, uri, NULL), DLOCK_EAUTH);

    snprintf(uri, sizeof(uri), "redis://:nope-nope@127.0.0.1:%d", auth.port);
    CHECK_RC(dlock_client_open(&c, uri, NULL), DLOCK_EAUTH);
    CHECK(strstr(dlock_errmsg(), "nope-nope") == NULL);

    /* bob may not touch dlock:* keys: the first acquire is refused */
    snprintf(uri, sizeof(uri), "redis://bob:b0b-pw@127.0.0.1:%d", auth.port);
    c = client_at(uri);
    dlock *l = handle(c, "forbidden", 0, 0);
    CHECK_RC(dlock_acquire(l, 0), DLOCK_EAUTH);
    CHECK(strstr(dlock_errmsg(), "b0b-pw") == NULL);
    dlock_close(l);
    dlock_client_close(c);

    /* ... unless its prefix is one bob may use */
    snprintf(uri, sizeof(uri), "redis://bob:b0b-pw@127.0.0.1:%d?prefix=other:",
             auth.port);
    c = client_at(uri);
    cycle(c, "allowed");
    dlock_client_close(c);
}

TEST(password_never_in_messages)
{
    char uri[256];
    dlock_client *c = NULL;
    static const char *const bad[] = {
        "redis://u:pw-SECRET1@127.0.0.1:0",
        "redis://u:pw-SECRET1@127.0.0.1:99999",
        "redis://u:pw-SECRET1@[::1",
        "redis://u:pw-SECRET1@host?what=1",
        "redis://u:pw-SECRET1@host/notanumber",
        "redis://u:pw-SECRET1@a,b",
        "redis://u:pw-SECRET1@127.0.0.1?prefix={x}",
        "redis://u:pw-SECRET1%zz@host",
        NULL};

    for (int i = 0; bad[i]; i++) {
        CHECK_RC(dlock_client_open(&c, bad[i], NULL), DLOCK_EINVAL);
        CHECK(strstr(dlock_errmsg(), "SECRET1") == NULL);
    }
    /* refused connection */
    snprintf(uri, sizeof(uri), "redis://u:pw-SECRET1@127.0.0.1:%d",
             th_free_port());
    CHECK_RC(dlock_client_open(&c, uri, NULL), DLOCK_ECONN);
    CHECK(strstr(dlock_errmsg(), "SECRET1") == NULL);
}

TEST(unix_socket)
{
    char uri[800];
    dlock_client *c;

    snprintf(uri, sizeof(uri), "unix://%s", srv.sock);
    c = client_at(uri);
    cycle(c, "unix");
    /* the same lock as over TCP */
    dlock *l = handle(c, "shared", 0, 0);
    dlock_client *t = client_at(srv.uri);
    dlock *lt = handle(t, "shared", 0, 0);
    CHECK_OK(dlock_acquire(l, 0));
    CHECK_RC(dlock_acquire(lt, 0), DLOCK_EBUSY);
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_close(lt);
    dlock_client_close(c);
    dlock_client_close(t);

    snprintf(uri, sizeof(uri), "unix://%s.missing", srv.sock);
    CHECK_RC(dlock_client_open(&c, uri, NULL), DLOCK_ECONN);
}

/* The hash tag of a key: between its first '{' and the next '}'. */
static void tag_of(const char *key, char *out, size_t cap)
{
    const char *o = strchr(key, '{');
    const char *e = o ? strchr(o + 1, '}') : NULL;

    snprintf(out, cap, "%.*s", o && e ? (int)(e - o - 1) : 0, o ? o + 1 : "");
}

TEST(database_prefix_and_hash_tags)
{
    char uri[256], keys[4096], tag0[600], tag[600];
    dlock_client *c, *d0;

    snprintf(uri, sizeof(uri), "%s/3?prefix=app:", srv.uri);
    c = client_at(uri);
    d0 = client_at(srv.uri);
    dlock *l = handle(c, "ab{c}d", 0, DLOCK_FAIR);
    dlock *o = handle(c, "ab{c}d", 0, DLOCK_FAIR);
    CHECK_OK(dlock_acquire(l, 0));
    dlock_info info;
    CHECK_OK(dlock_inspect(d0, "ab{c}d", &info)); /* db 0, other prefix */
    CHECK_EQ(info.held, 0);
    dlock_info_clear(&info);

    /* list the keys of db 3 (the queue keys exist while someone waits) */
    th_redis_cmd(&srv, NULL, 0, "ZADD app:{ab{c}d}:q 1 x");
    th_redis_cmd(&srv, NULL, 0, "SELECT 0");
    long long n = th_redis_cmd(
        &srv, keys, sizeof(keys),
        "EVAL %s 0",
        "redis.call('SELECT', 3) local k = redis.call('KEYS', '*') "
        "table.sort(k) return table.concat(k, '|')");
    CHECK_EQ(n, 0);
    CHECK_CONTAINS(keys, "app:{ab{c}d}");
    CHECK_CONTAINS(keys, "app:{ab{c}d}:f");
    /* every key of the lock has the same hash tag: one cluster slot */
    tag_of("app:{ab{c}d}", tag0, sizeof(tag0));
    for (char *k = strtok(keys, "|"); k; k = strtok(NULL, "|")) {
        CHECK(strncmp(k, "app:", 4) == 0);
        tag_of(k, tag, sizeof(tag));
        CHECK_STR(tag, tag0);
    }
    CHECK_RC(dlock_acquire(o, 0), DLOCK_OK); /* reentrant, same thread */
    CHECK_OK(dlock_release(o));
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_close(o);
    dlock_client_close(c);
    dlock_client_close(d0);

    dlock_client *bad = NULL;
    snprintf(uri, sizeof(uri), "%s/99999", srv.uri);
    CHECK_RC(dlock_client_open(&bad, uri, NULL), DLOCK_EINVAL);
    CHECK_CONTAINS(dlock_errmsg(), "database");
}

TEST(keys_of_the_wrong_type)
{
    dlock_client *c = client_at(srv.uri);
    dlock *l;

    th_redis_cmd(&srv, NULL, 0, "SET dlock:{plain} hello");
    l = handle(c, "plain", 0, 0);
    CHECK_RC(dlock_acquire(l, 0), DLOCK_EPROTO);
    CHECK_CONTAINS(dlock_errmsg(), "another type");
    CHECK_RC(dlock_acquire(l, 500), DLOCK_EPROTO); /* at once, no hang */
    dlock_info info;
    CHECK_RC(dlock_inspect(c, "plain", &info), DLOCK_EPROTO);
    dlock_close(l);

    th_redis_cmd(&srv, NULL, 0, "HSET dlock:{fencehash}:f a b");
    l = handle(c, "fencehash", 0, 0);
    CHECK_RC(dlock_acquire(l, 0), DLOCK_EPROTO);
    dlock_close(l);

    th_redis_cmd(&srv, NULL, 0, "SET dlock:{fencetext}:f abc");
    l = handle(c, "fencetext", 0, 0);
    CHECK_RC(dlock_acquire(l, 0), DLOCK_EPROTO);
    CHECK_CONTAINS(dlock_errmsg(), "non-number");
    dlock_close(l);
    char val[64];
    /* the failed acquisition left no lock behind */
    CHECK_EQ(th_redis_cmd(&srv, val, sizeof(val), "EXISTS dlock:{fencetext}"),
             0);

    /* the client is still fine for other locks */
    cycle(c, "fine");
    dlock_client_close(c);
}

TEST(server_down_gives_econn)
{
    char uri[128];
    dlock_client *c = NULL;

    snprintf(uri, sizeof(uri), "redis://127.0.0.1:%d", th_free_port());
    int64_t t0 = th_now_ms();
    CHECK_RC(dlock_client_open(&c, uri, NULL), DLOCK_ECONN);
    CHECK_OP(th_now_ms() - t0, <, 3000);
    CHECK_CONTAINS(dlock_errmsg(), "connect");
    CHECK(c == NULL);
}

typedef struct waiter {
    dlock *l;
    int64_t wait;
    int rc;
    int64_t took;
    char msg[512];
} waiter;

static void *wait_thread(void *arg)
{
    waiter *w = arg;
    int64_t t0 = th_now_ms();

    w->rc = dlock_acquire(w->l, w->wait);
    w->took = th_now_ms() - t0;
    snprintf(w->msg, sizeof(w->msg), "%s", dlock_errmsg());
    if (w->rc == DLOCK_OK)
        dlock_release(w->l);
    return NULL;
}

TEST(killed_mid_wait_then_recovers)
{
    th_redis s;
    th_redis_start(&s, NULL);
    dlock_client *a = client_at(s.uri), *b = client_at(s.uri);
    dlock *la = handle(a, "midwait", 30000, 0);
    waiter w = {handle(b, "midwait", 0, 0), 10000, 0, 0, ""};
    pthread_t th;

    CHECK_OK(dlock_acquire(la, 0));
    uint64_t tok = dlock_token(la);
    pthread_create(&th, NULL, wait_thread, &w);
    th_sleep_ms(300);
    int64_t t0 = th_now_ms();
    th_redis_kill(&s, SIGKILL);
    pthread_join(th, NULL);
    CHECK_RC(w.rc, DLOCK_ECONN);
    CHECK_OP(th_now_ms() - t0, <, 3000); /* told at once, not at 10 s */

    CHECK_RC(dlock_acquire(w.l, 0), DLOCK_ECONN); /* still down */
    th_redis_restart(&s);                         /* empty: no persistence */
    CHECK_OK(dlock_acquire(w.l, 0));              /* the client reconnects */
    CHECK_OP(dlock_token(w.l), >, tok); /* time-based tokens keep growing */
    CHECK_OK(dlock_release(w.l));
    /* the restart lost a's lock; a's release says so */
    CHECK_RC(dlock_release(la), DLOCK_ELOST);
    dlock_close(la);
    dlock_close(w.l);
    dlock_client_close(a);
    dlock_client_close(b);
    th_redis_stop(&s);
}

TEST(frozen_server_never_hangs_past_the_wait)
{
    th_redis s;
    th_redis_start(&s, NULL);
    dlock_client *c = client_at(s.uri);
    dlock *l = handle(c, "frozen-server", 0, 0);

    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    th_redis_kill(&s, SIGSTOP);
    int64_t t0 = th_now_ms();
    CHECK_RC(dlock_acquire(l, 300), DLOCK_ECONN);
    int64_t took = th_now_ms() - t0;
    CHECK_OP(took, <, 1500);
    CHECK_CONTAINS(dlock_errmsg(), "no answer");
    th_redis_kill(&s, SIGCONT);
    CHECK_OK(dlock_acquire(l, 2000));
    CHECK_OK(dlock_release(l));
    dlock_close(l);
    dlock_client_close(c);
    th_redis_stop(&s);
}

TEST(dropped_connection_reconnects)
{
    dlock_client *c = client_at(srv.uri);
    dlock *l = handle(c, "dropped", 0, 0);
    int failures = 0;

    CHECK_OK(dlock_acquire(l, 0));
    CHECK_OK(dlock_release(l));
    th_redis_cmd(&srv, NULL, 0, "CLIENT KILL TYPE normal SKIPME yes");
    for (int i = 0; i < 3; i++) {
        int rc = dlock_acquire(l, 0);
        if (rc == DLOCK_ECONN) {
            failures++;
            continue;
        }
        CHECK_OK(rc);
        CHECK_OK(dlock_release(l));
    }
    CHECK_OP(failures, <=, 1); /* at most the call that met the cut */
    dlock_close(l);
    dlock_client_close(c);
}

/* The server closed the command connection (CLIENT KILL; a restart does
 * the same) just before a release: the release goes to a new connection
 * and releases, instead of failing with DLOCK_ECONN on the dead one. */
TEST(release_after_the_server_closed_the_connection)
{
    dlock_client *c = client_at(srv.uri);
    dlock *l = handle(c, "closed-then-release", 0, 0);

    /* (a hold of 5 ms: the probe is skipped between commands sent within
     * 2 ms of each other, as in a tight loop) */
    for (int i = 0; i < 5; i++) {
        CHECK_OK(dlock_acquire(l, 0));
        th_redis_cmd(&srv, NULL, 0, "CLIENT KILL TYPE normal SKIPME yes");
        th_sleep_ms(5);
        CHECK_OK(dlock_release(l));
        CHECK_OK(dlock_acquire(l, 0));
        th_redis_cmd(&srv, NULL, 0, "CLIENT KILL TYPE normal SKIPME yes");
        th_sleep_ms(5);
        CHECK_OK(dlock_extend(l, 20000));
        CHECK_OK(dlock_release(l));
    }
    dlock_close(l);
    dlock_client_close(c);
}

TEST(scripts_flushed_are_reloaded)
{
    dlock_client *c = client_at(srv.uri);

    cycle(c, "flush");
    th_redis_cmd(&srv, NULL, 0, "SCRIPT FLUSH");
    cycle(c, "flush");
    dlock_client_close(c);
}

TEST(waiters_send_no_commands_between_notifications)
{
    dlock_client *a = client_at(srv.uri), *b = client_at(srv.uri);
    dlock *la = handle(a, "quiet", 60000, 0);
    waiter w = {handle(b, "quiet", 0, 0), 2500, 0, 0, ""};
    pthread_t th;

    CHECK_OK(dlock_acquire(la, 0));
    long long before = th_redis_calls(&srv, "evalsha");
    pthread_create(&th, NULL, wait_thread, &w);
    pthread_join(th, NULL);
    CHECK_RC(w.rc, DLOCK_EBUSY);
    long long used = th_redis_calls(&srv, "evalsha") - before;
    /* one try, one after subscribing, one at the deadline: nothing while
     * it slept for 2.5 s */
    CHECK_OP(used, <=, 3);
    dlock_close(w.l);

    w.l = handle(b, "quiet-fair", 0, DLOCK_FAIR);
    dlock *lf = handle(a, "quiet-fair", 60000, DLOCK_FAIR);
    CHECK_OK(dlock_acquire(lf, 0));
    before = th_redis_calls(&srv, "evalsha");
    pthread_create(&th, NULL, wait_thread, &w);
    pthread_join(th, NULL);
    CHECK_RC(w.rc, DLOCK_EBUSY);
    used = th_redis_calls(&srv, "evalsha") - before;
    CHECK_OP(used, <=, 4); /* the same, plus leaving the queue */
    CHECK_OK(dlock_release(lf));
    CHECK_OK(dlock_release(la));
    dlock_close(lf);
    dlock_close(la);
    dlock_close(w.l);
    dlock_client_close(a);
    dlock_client_close(b);
}

#define NWAIT 5

static int64_t waiters_of(dlock_client *c, const char *name)
{
    dlock_info info;
    int64_t n;

    CHECK_OK(dlock_inspect(c, name, &info));
    n = info.waiters;
    dlock_info_clear(&info);
    return n;
}

TEST(fair_handoff_wakes_only_the_head)
{
    dlock_client *h = client_at(srv.uri), *cl[NWAIT];
    dlock *lh = handle(h, "herd", 0, DLOCK_FAIR);
    waiter w[NWAIT];
    pthread_t th[NWAIT];

    CHECK_OK(dlock_acquire(lh, 0));
    for (int i = 0; i < NWAIT; i++) {
        cl[i] = client_at(srv.uri);
        w[i] = (waiter){handle(cl[i], "herd", 0, DLOCK_FAIR), 20000, 0, 0,
                        ""};
        pthread_create(&th[i], NULL, wait_thread, &w[i]);
        int64_t until = th_now_ms() + 5000;
        while (waiters_of(h, "herd") < i + 1 && th_now_ms() < until)
            th_sleep_ms(5);
    }
    CHECK_EQ(waiters_of(h, "herd"), NWAIT);
    dlock_info info;
    CHECK_OK(dlock_inspect(h, "herd", &info));
    CHECK_EQ(info.queue_len, NWAIT);
    CHECK_CONTAINS(info.queue[0], "pid ");
    dlock_info_clear(&info);

    long long before = th_redis_calls(&srv, "evalsha");
    CHECK_OK(dlock_release(lh));
    for (int i = 0; i < NWAIT; i++)
        pthread_join(th[i], NULL);
    long long used = th_redis_calls(&srv, "evalsha") - before;
    for (int i = 0; i < NWAIT; i++)
        CHECK_OK(w[i].rc);
    /* per hand-off: one release and the head's acquire. A herd would make
     * every waiter re-try on every release. */
    CHECK_OP(used, <=, 2 * NWAIT + 2);
    for (int i = 0; i < NWAIT; i++) {
        dlock_close(w[i].l);
        dlock_client_close(cl[i]);
    }
    dlock_close(lh);
    dlock_client_close(h);
}

static int count_lines_with(const char *text, const char *needle)
{
    int n = 0;

    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

TEST(one_subscriber_connection_per_client)
{
    static char list[65536];
    dlock_client *a = client_at(srv.uri), *b = client_at(srv.uri);
    dlock *held[4];
    waiter w[4];
    pthread_t th[4];
    char name[16];

    for (int i = 0; i < 4; i++) {
        snprintf(name, sizeof(name), "sub%d", i);
        held[i] = handle(a, name, 60000, 0);
        CHECK_OK(dlock_acquire(held[i], 0));
        w[i] = (waiter){handle(b, name, 0, 0), 1500, 0, 0, ""};
        pthread_create(&th[i], NULL, wait_thread, &w[i]);
    }
    th_sleep_ms(500);
    th_redis_cmd(&srv, list, sizeof(list), "CLIENT LIST TYPE pubsub");
    CHECK_EQ(count_lines_with(list, "sub=4"), 1); /* one conn, 4 channels */
    CHECK_EQ(count_lines_with(list, "id="), 1);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_RC(w[i].rc, DLOCK_EBUSY);
        dlock_close(w[i].l);
        CHECK_OK(dlock_release(held[i]));
        dlock_close(held[i]);
    }
    dlock_client_close(a);
    dlock_client_close(b);
}

TEST(client_timeout_option)
{
    dlock_client_options o = {100};
    char uri[256];
    dlock_client *c = NULL;

    o.timeout_ms = -1;
    CHECK_RC(dlock_client_open(&c, srv.uri, &o), DLOCK_EINVAL);
    snprintf(uri, sizeof(uri), "%s?timeout=0", srv.uri);
    CHECK_RC(dlock_client_open(&c, uri, NULL), DLOCK_EINVAL);
    snprintf(uri, sizeof(uri), "%s?timeout=250&prefix=t:", srv.uri);
    c = client_at(uri);
    cycle(c, "timeout");
    dlock_client_close(c);
}

static const th_test tests[] = {
    T(acl_user_and_password),
    T(refused_credentials_give_eauth_without_the_password),
    T(password_never_in_messages),
    T(unix_socket),
    T(database_prefix_and_hash_tags),
    T(keys_of_the_wrong_type),
    T(server_down_gives_econn),
    T(killed_mid_wait_then_recovers),
    T(frozen_server_never_hangs_past_the_wait),
    T(dropped_connection_reconnects),
    T(release_after_the_server_closed_the_connection),
    T(scripts_flushed_are_reloaded),
    T(waiters_send_no_commands_between_notifications),
    T(fair_handoff_wakes_only_the_head),
    T(one_subscriber_connection_per_client),
    T(client_timeout_option),
    {NULL, NULL, 0},
};

int main(int argc, char **argv)
{
    th_redis_start(&srv, NULL);
    return th_main(argc, argv, tests);
}
