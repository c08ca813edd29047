/* SPDX-License-Identifier: MIT */
/*
 * etcd_int.h -- what the etcd store's six files share: etcd.c, the lock
 * protocol (acquire, release, extend, open and close: the backend's
 * slots); etcd_operate.c, an operator's view (inspect, list, break);
 * etcd_lease.c, the leases and the background thread that keeps them
 * alive, deletes left-over keys, revokes unused leases and checks our
 * holds' keys; etcd_wait.c, the client's watch stream and the waiters it
 * wakes; etcd_keys.c, the keys of a lock, the ones the client reserves,
 * and the holds' keys watched for their deletion by the stream; and
 * etcd_conn.c, the HTTP/JSON client of etcd's v3 gateway over libcurl
 * (requests with their retries across the endpoints, TLS, auth, base64,
 * the URI's options). Each calls only those after it. The limits, the
 * structs, the small readers of cJSON answers, and each file's functions
 * that the others call.
 */
#ifndef DLOCK_ETCD_INT_H
#define DLOCK_ETCD_INT_H

#include "buf.h"
#include "pool.h"
#include "store.h"

#include <cJSON.h>
#include <curl/curl.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define ETCD_DEFAULT_PREFIX "dlock"
#define ETCD_PREFIX_MAX 256
#define ETCD_KEY_MAX (ETCD_PREFIX_MAX + 3 * DLOCK_NAME_MAX + 48)
#define ETCD_B64_MAX (4 * ((ETCD_KEY_MAX + 2) / 3) + 4)
#define ETCD_RESP_MAX (64u << 20) /* larger answers are refused */
#define ETCD_IDLE_MS 60000        /* an unused lease is revoked after this */
#define ETCD_ORPHAN_RETRY_MS 1000
#define ETCD_TTL_MAX_S 9000000000LL /* etcd's own maximum lease TTL */
#define ETCD_AHEAD_MAX 64 /* keys ahead of its own a waiter reads at once */

/* private results of dlock__etcd_request() besides the DLOCK_E* codes */
#define ETCD_NOLEASE 1 /* the server does not know the lease */

/* Every buffer of the store (request bodies, answers, the watch stream)
 * holds at most ETCD_RESP_MAX bytes: an append past it fails. */
#define ETCD_BUF_INIT {.max = ETCD_RESP_MAX}

struct etcd_store;

/* A waiter of this client (see "The watch stream" in etcd_wait.c). */
typedef struct etcd_del {
    int64_t rev;
    char *key; /* base64 */
} etcd_del;

typedef struct etcd_waiter {
    struct etcd_waiter *next, *prev;
    pthread_cond_t cv;
    const char *mine; /* our key, base64 */
    uint64_t gen;     /* the stream generation it relies on */
    int pending;      /* its revision is not known yet: deletions logged */
    int64_t rev;      /* deletions above this revision count */
    char **ahead;     /* keys ahead of ours, base64 */
    size_t nahead;
    int partial;      /* more keys ahead than `ahead` holds */
    int mine_gone;    /* our own key was deleted */
    int broken;       /* the stream broke or the lease died: look again */
    int reader;       /* a shared hold's: only writers' keys are ahead */
    unsigned permits; /* a semaphore's permit: holds with fewer than this
                       * many keys ahead (0: a lock, none ahead) */
    long clash;       /* a key ahead of another kind (-1: a lock's, N: a
                       * semaphore of N), or 0 */
    etcd_del *log;
    size_t nlog, caplog;
} etcd_waiter;

/* stream states */
enum { ST_DOWN, ST_OPENING, ST_UP };

/* A handle's descriptors that libcurl makes without close-on-exec
 * (dlock__etcd_perform). */
typedef struct etcd_newfds {
    int fresh;          /* no request made on the handle yet */
    int noting;         /* its first request runs: note taken */
    dlock__fd_note note;
} etcd_newfds;

typedef struct etcd_conn {
    CURL *h;
    dlock__buf resp;
    struct curl_slist *hdrs;
    uint64_t hdr_gen; /* the auth token generation hdrs carry */
    char errbuf[CURL_ERROR_SIZE];
    etcd_newfds nf;
} etcd_conn;

typedef struct etcd_lease {
    int64_t id;
    int64_t want_s;     /* requested TTL (the lookup key) */
    int64_t ttl_ms;     /* granted TTL */
    int64_t last_ok;    /* when the last keepalive that worked was sent */
    int64_t next_ka;    /* when the next keepalive is due */
    int64_t idle_since; /* refs fell to 0 then */
    int refs;           /* holds and acquisitions using it */
    int own;            /* one DLOCK_NO_RENEW acquisition's own lease */
    int held;           /* own, and its lock acquired: no more keepalives
                         * once next_ka (INT64_MAX: done) has passed */
    atomic_int dead;    /* lost: no new users; revoked once unused */
    char err[200];      /* why the last keepalive failed; "" after one
                         * that worked (the at-risk event's why) */
    struct etcd_lease *next;
} etcd_lease;

/* A key this client uses (held, waited on, or waiting to be deleted). */
typedef struct etcd_slot {
    struct etcd_slot *next;
    uint64_t hash;
    size_t len;
    char key[];
} etcd_slot;

typedef struct etcd_orphan {
    int64_t next_try;
    size_t len;
    struct etcd_orphan *next;
    char key[];
} etcd_orphan;

typedef struct etcd_store {
    dlock_client *client;
    char **ep; /* "http://host:port" */
    size_t nep;
    char *redacted;
    char prefix[ETCD_PREFIX_MAX + 2]; /* "P/" or "" */
    size_t prefix_len;
    char *user, *password;
    char *cacert, *cert, *key;
    int64_t timeout_ms;
    int timer_fd;
    int offline; /* open failed: close talks to no server */
    int unreachable; /* the last request found no endpoint (es->mu) */
    int ep_fd;          /* epoll: timer_fd, and the stream when up */

    /* the watch stream: the handle and its buffers, one thread at a time
     * (the opener, then the client thread); lock order sio, then mu */
    pthread_mutex_t sio;
    CURL *sh;
    curl_socket_t sfd;
    dlock__buf sin;  /* bytes read, not parsed yet */
    dlock__buf smsg; /* the message being reassembled from its frames */

    pthread_mutex_t mu; /* everything below */
    size_t cur;         /* the endpoint tried first */
    char *token;        /* auth token, NULL without auth */
    uint64_t token_gen;
    dlock__pool pool; /* idle easy handles (each keeps its connections) */
    etcd_lease *leases;
    etcd_slot **slots;
    size_t nbuckets, nslots;
    etcd_orphan *orphans;
    int sstate;          /* ST_* */
    uint64_t sgen;       /* + 1 at each open: waiters of an older one
                          * look again */
    int64_t s_since;     /* the watch sends every deletion after this
                          * revision */
    int64_t s_idle;      /* no waiter since then */
    pthread_cond_t scv;  /* sstate changed */
    /* waiters whose re-arm found no answer sleep on acv until ka_gen
     * moves (a keepalive was answered), their lease dies, their wait
     * ends or a cancel (etcd.c, park) */
    pthread_cond_t acv;
    uint64_t ka_gen;
    etcd_waiter *waiters;
    struct etcd_hold *mine; /* our keys watched for their deletion */
    uint64_t next_mid;
    int64_t cover_at;    /* when the background thread tries again to
                          * cover our holds by the stream (0: at once) */
    int64_t cover_backoff;
} etcd_store;

/* The backend's part of one dlock__lease. */
typedef struct etcd_hold {
    etcd_lease *lease; /* a reference while the key exists */
    int64_t rev;       /* our key's create revision */
    int waited;        /* the acquisition waited in the queue */
    size_t key_len;
    char key[ETCD_KEY_MAX];
    /* our key watched for its deletion by the stream (etcd_keys.c),
     * all under es->mu */
    struct etcd_hold *mnext, *mprev; /* in es->mine while linked */
    uint64_t mid;       /* unique in the store: what notify_lost matches */
    int linked;
    int held;           /* acquire returned it: a deletion is a loss */
    int releasing;      /* our own delete is on its way */
    int gone;           /* our key's deletion was seen */
    int tell;           /* gone while held: the core must hear it */
    int lease_checked;  /* ... once we know whether its lease lives */
    int64_t mrev;       /* our key's create revision, once known */
    int64_t mdel;       /* the latest deletion of our key seen before */
    uint64_t mgen;      /* the stream generation known to report our key's
                         * deletion (0: none) */
    int64_t tell_at;    /* the next try at telling the core (it may not
                         * have registered the hold yet) ... */
    int64_t tell_until; /* ... until then */
} etcd_hold;

/* Readers of the gateway's answers (cJSON trees, fields of any type) and
 * the out-of-memory error: used by every file, small enough to inline. */

/* An int64 field that the gateway sends as a string (or a number); 0 when
 * absent, as proto3 JSON omits zero values. */
static inline int64_t jint(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);

    if (cJSON_IsString(v))
        return strtoll(v->valuestring, NULL, 10);
    if (cJSON_IsNumber(v)) {
        /* any JSON number: converting one outside int64 would be UB */
        double d = v->valuedouble;
        return d >= 9223372036854775807.0    ? INT64_MAX
               : d <= -9223372036854775808.0 ? INT64_MIN
               : d == d                      ? (int64_t)d
                                             : 0;
    }
    if (cJSON_IsTrue(v))
        return 1;
    return 0;
}

static inline const char *jstr(const cJSON *o, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static inline const cJSON *jget(const cJSON *o, const char *name)
{
    return cJSON_GetObjectItemCaseSensitive(o, name);
}

/* responses[i].<kind> of a txn answer, or NULL. */
static inline const cJSON *txn_resp(const cJSON *txn, int i, const char *kind)
{
    const cJSON *r = cJSON_GetArrayItem(jget(txn, "responses"), i);
    return r ? jget(r, kind) : NULL;
}

static inline const cJSON *kvs_at(const cJSON *range, int i)
{
    return range ? cJSON_GetArrayItem(jget(range, "kvs"), i) : NULL;
}

static inline int enomem(void)
{
    return dlock__err(DLOCK_ENOMEM, "out of memory");
}

/* etcd_keys.c: the keys this client uses */

/* The range of lock `name`: prefix + escaped name + "/" into out
 * (ETCD_KEY_MAX); its length. */
size_t dlock__etcd_lock_base(const etcd_store *es, const char *name,
                             size_t len, char *out);

/* Reserves `key`: 0 when it was free, 1 when in use, -1 out of memory.
 * es->mu held. */
int dlock__etcd_slot_take(etcd_store *es, const char *key, size_t len);

/* Drops the reservation of `key`; es->mu held. */
void dlock__etcd_slot_drop(etcd_store *es, const char *key, size_t len);

/* etcd_conn.c: base64 and buffers */

/* Base64 (with padding) of n bytes into out (cap >= 4*ceil(n/3)+1). */
size_t dlock__etcd_b64_encode(const char *in, size_t n, char *out);

/* Decodes base64 into out (at most cap-1 bytes, NUL-terminated); returns
 * the length, or -1 when the text is not base64. */
long dlock__etcd_b64_decode(const char *in, char *out, size_t cap);

/* The range end of a base that ends with '/': the same with '0'. */
void dlock__etcd_range_end_b64(const char *base, size_t len, char *out);

/* etcd_conn.c: requests */

/* An easy handle from the pool (a new one when it is empty), or NULL. */
etcd_conn *dlock__etcd_conn_get(etcd_store *es);

/* Sets cn's request headers (JSON, and the auth token when there is
 * one) in cn->hdrs: 0, or -1 out of memory. */
int dlock__etcd_conn_headers(etcd_store *es, etcd_conn *cn);

/* etcd_elect.c: leader election (backend slots), and the check. */
int dlock__etcd_check(void *st, int64_t ttl_ms, dlock_check *out,
                      int64_t op_deadline);
int dlock__etcd_proclaim(void *st, dlock__lease *l, const char *desc,
                         int64_t op_deadline);
int dlock__etcd_watch_open(void *st, const char *name, size_t len,
                           void **w, int64_t op_deadline);
int dlock__etcd_watch_wait(void *st, void *w, int64_t deadline,
                           int cancel_fd);
void dlock__etcd_watch_close(void *st, void *w);

/* Gives cn back to the pool (up to DLOCK__POOL_MAX kept), or frees it. */
void dlock__etcd_conn_put(etcd_store *es, etcd_conn *cn);

/* Makes libcurl create h's sockets close-on-exec, and readies nf (which
 * must live as long as h makes connections) for h's first request
 * (docs/design.md, "Descriptors"). */
void dlock__etcd_no_inherit(CURL *h, etcd_newfds *nf);

/* curl_easy_perform(h). The first on a handle also marks close-on-exec
 * the wake-up socket pair libcurl makes then. */
CURLcode dlock__etcd_perform(CURL *h, etcd_newfds *nf);

/* Frees cn and its handle. */
void dlock__etcd_conn_free(etcd_conn *cn);

/* POSTs `body` to `path` and parses the answer into *out (freed by the
 * caller with cJSON_Delete). Tries every endpoint while time is left.
 * Returns DLOCK_OK, ETCD_NOLEASE, or an error with a message about
 * `what`. */
int dlock__etcd_request(etcd_store *es, const char *path, const char *body,
                        int64_t deadline, cJSON **out, const char *what);

/* Gets a new auth token (the password is sent, never logged). */
int dlock__etcd_authenticate(etcd_store *es, etcd_conn *cn,
                             int64_t deadline);

/* The URI's endpoints, prefix, timeout, TLS files and user into es. */
int dlock__etcd_parse_config(etcd_store *es, const dlock__uri *u);

/* etcd_lease.c: leases */

/* Until when the lease's holds are certainly alive; es->mu held. */
int64_t dlock__etcd_lease_limit(const etcd_lease *el);

/* Marks a lease lost and tells the core; any thread, es->mu not held. */
void dlock__etcd_lease_lost(etcd_store *es, etcd_lease *el, const char *why);

/* A live lease of `want_s` seconds with a reference, granting one when
 * there is none; `own`: always a new one, for one DLOCK_NO_RENEW
 * acquisition alone. NULL with *rc set on failure. */
etcd_lease *dlock__etcd_lease_get(etcd_store *es, int64_t want_s, int own,
                                  int64_t deadline, int *rc);

/* Drops a reference to el. */
void dlock__etcd_lease_put(etcd_store *es, etcd_lease *el);

/* One keepalive: 0 alive, ETCD_NOLEASE gone, or an error. */
int dlock__etcd_keepalive(etcd_store *es, etcd_lease *el, int64_t deadline);

/* Revokes lease `id` (deleting every key on it). */
int dlock__etcd_lease_revoke(etcd_store *es, int64_t id, int64_t deadline);

/* etcd_lease.c: the background thread */

/* Makes the timer fire by `at` at the latest; es->mu held. */
void dlock__etcd_arm_timer(etcd_store *es, int64_t at);

/* The backend's loop_fd and loop_run slots. */
int dlock__etcd_loop_fd(void *st);
void dlock__etcd_loop_run(void *st, int readable);
/* Our holds' keys (etcd_keys.c), the background thread's part: keeps the
 * stream up while we hold keys, checks keys the stream may have missed,
 * tells the core of deleted holds. Returns when it wants to run again. */
int64_t dlock__etcd_mine_run(etcd_store *es);
/* dlock_client_at_risk_max(): a sixth of the lease the server grants for
 * ttl_ms (granted now if the client has none of that length). */
int dlock__etcd_at_risk_max(void *st, int64_t ttl_ms, int64_t *out,
                            int64_t op_deadline);

/* etcd_wait.c: the watch stream */

/* Makes sure the stream is up, opening it if need be (any endpoint, by
 * the deadline). DLOCK_OK with *gen its generation, or DLOCK_ECONN. */
int dlock__etcd_stream_up(etcd_store *es, int64_t deadline, uint64_t *gen);

/* Reads the stream on the client thread; closes it after ETCD_IDLE_MS
 * without waiters or holds. */
void dlock__etcd_stream_loop(etcd_store *es);

/* etcd_wait.c: waiters */

/* Registers w (pending: deletions are logged until
 * dlock__etcd_waiter_fill()); es->mu held. */
void dlock__etcd_waiter_add(etcd_store *es, etcd_waiter *w, uint64_t gen);

/* Unregisters w if registered; es->mu held. */
void dlock__etcd_waiter_del(etcd_store *es, etcd_waiter *w);

/* The waiter's transaction answered at revision `rev` with the keys ahead
 * (kvs[first..] of range `r`, more than those when `more`): the logged
 * deletions after `rev` apply. A reader keeps the writers' keys only.
 * es->mu held. 0, or -1 out of memory. */
int dlock__etcd_waiter_fill(etcd_waiter *w, const cJSON *r, int first,
                            int more, int64_t rev);

/* Is this key (base64) a reader's: its last component "r<lease hex>"
 * (a writer's is "<lease hex>", as etcdctl lock's)? */
int dlock__etcd_key_is_reader(const char *key_b64);
/* A semaphore's permit key's N ("s<N>-<lease hex>"), or 0. */
long dlock__etcd_key_permits(const char *key_b64);
/* Are few enough keys ahead of w's for it to hold (none; fewer than N for
 * a permit)? Not counting `partial`. */
int dlock__etcd_waiter_room(const etcd_waiter *w);

/* Reads the keys ahead of ours (a look) into waiter w, registered or
 * not: DLOCK_OK, 1 when our key is gone, or an error. A reader's look
 * reads on, page after page, until it finds a writer's key ahead or the
 * end of the queue. */
int dlock__etcd_look(etcd_store *es, etcd_hold *eh, etcd_waiter *w,
                     const char *base, size_t base_len, int64_t deadline);

/* Ends a wait: unregisters w and frees what it holds. */
void dlock__etcd_waiter_end(etcd_store *es, etcd_waiter *w);

/* etcd_keys.c: our keys watched for their deletion */

#define MINE_TELL_FOR_MS 10000 /* how long a loss is offered to the core */

/* Links eh (before its key is put): a deletion of its key from now on
 * is seen. */
void dlock__etcd_mine_link(etcd_store *es, etcd_hold *eh);
/* Our key's create revision is known: rev. */
void dlock__etcd_mine_rev(etcd_store *es, etcd_hold *eh, int64_t rev);
/* Our key was there at a revision after stream generation gen began: its
 * deletion is reported while gen lasts. */
void dlock__etcd_mine_seen(etcd_store *es, etcd_hold *eh, uint64_t gen);
/* The hold is ours now, unless our key went meanwhile: 0, or -1. */
int dlock__etcd_mine_hold(etcd_store *es, etcd_hold *eh);
/* Our own delete is on its way (release). */
void dlock__etcd_mine_releasing(etcd_store *es, etcd_hold *eh);
/* Unlinks eh (the hold ended, the acquisition failed). */
void dlock__etcd_mine_unlink(etcd_store *es, etcd_hold *eh);
/* Does the current stream report our key's deletion? es->mu held. */
int dlock__etcd_mine_covered(const etcd_store *es, const etcd_hold *eh);
/* Our key went (es->mu held): a loss to tell when held. Returns 1 when
 * the background thread must tell the core. */
int dlock__etcd_mine_gone(etcd_hold *eh);
/* A deletion on the stream (es->mu held): key (base64) at rev. Returns 1
 * when the background thread must tell the core. */
int dlock__etcd_mine_deleted(etcd_store *es, const char *key_b64,
                             int64_t rev);

/* etcd_operate.c: the inspect, list and evict slots */
dlock__inspect_slot dlock__etcd_inspect;
dlock__list_slot dlock__etcd_list;
dlock__evict_slot dlock__etcd_evict;


/* The store's table (store.h), named by module.c and, in a build with
 * the store built in, by the core's registry. */
extern const dlock__backend dlock__backend_etcd;

#endif /* DLOCK_ETCD_INT_H */
