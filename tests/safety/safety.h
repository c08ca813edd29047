/* SPDX-License-Identifier: MIT */
/*
 * safety.h -- the safety suite: worker processes fighting for one lock and
 * doing a read-modify-write on a fenced resource, a shared history of
 * every hold, faults injected while a chosen holder (the victim) is in the
 * middle of its read-modify-write, and a checker that classifies the run.
 *
 * Everything the workers share lives in one file-backed mapping (struct
 * sf_shared): the workers are this binary exec'd again (`--worker FILE
 * ID`), so that a worker can run under libfaketime or inside a network
 * namespace.
 */
#ifndef DLOCK_SAFETY_H
#define DLOCK_SAFETY_H

#include <dlock.h>

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#define SF_MAX_WORKERS 16
#define SF_MAX_HOLDS 16384 /* forged-grant's 10 s flood takes ~7000 */
#define SF_URI_MAX 1200

/* The one lock every worker fights for, and its Redis key (the store's
 * default prefix "dlock:", the name as hash tag: on a cluster, the slot
 * that key hashes to holds the lock). */
#define SF_LOCK_NAME "safety"
#define SF_LOCK_KEY "dlock:{" SF_LOCK_NAME "}"

/* Outcomes, from best to worst. */
enum sf_outcome {
    SF_HELD = 0,     /* no overlap, no loss */
    SF_LOST = 1,     /* a hold was lost, and its holder was told */
    SF_FENCED = 2,   /* a stale holder touched the resource: refused */
    SF_VIOLATED = 3, /* a stale write accepted, a lost update, an overlap
                      * nobody was told of, or a token that went back */
    SF_SKIPPED = 4,  /* not run (no server, not applicable) */
    SF_INCONCLUSIVE = 5, /* the fault could not be injected: a failure */
};

const char *sf_outcome_name(int o);

/* Write results. */
#define SF_W_NONE 0
#define SF_W_ACCEPTED 1
#define SF_W_REJECTED 2      /* the write carried a stale token */
#define SF_W_READ_REJECTED 3 /* already the read carried a stale token */

/* One hold, as its worker saw it. Times: CLOCK_MONOTONIC, ns. */
typedef struct sf_hold {
    int worker;
    int victim;           /* the hold the fault was aimed at */
    int shared;           /* a read hold (--mixed): reads, never writes */
    int killed;           /* its process was SIGKILLed during the hold */
    volatile int done;    /* the record is complete */
    uint64_t acq_id;      /* worker << 32 | sequence number */
    uint64_t token;       /* dlock_token() right after the acquire */
    int64_t t_acq_call, t_acq_ret;
    int64_t t_rel_call, t_rel_ret;
    int64_t read_value;
    uint64_t read_seen;   /* the highest token the resource had seen */
    uint64_t read_op, write_op; /* the resource's operation numbers */
    int write_res;        /* SF_W_* */
    int rel_rc;           /* dlock_release()'s code */
    volatile int lost_cb; /* the lost-lock callback ran for this hold */
    int64_t t_lost;       /* when it ran */
    char lost_msg[160];   /* dlock_errmsg() inside it */
    /* a `dlock run` hold (cutoff-run, runner.c): its command's tree, the
     * command [0], its child [1] and its setsid grandchild [2]. The hold
     * lasts from the command's start (t_acq_ret) to the last read or
     * write of any of the three (t_proc[], taken inside the resource's
     * lock), whenever that came; rel_rc says what dlock run's exit status
     * says (76: DLOCK_ELOST), lost_cb that its stderr told of a risk or
     * a loss (lost_msg: that line) */
    int run;
    volatile int run_rc;         /* dlock run's exit status, -1 before */
    volatile int32_t proc_pid[3];
    volatile int32_t proc_ops[3];     /* its reads and writes */
    volatile int32_t proc_refused[3]; /* ... the resource refused */
    volatile int64_t t_proc[3];       /* its last one; 0: none */
} sf_hold;

/* The fenced resource: a storage service that remembers the highest
 * fencing token it was shown (on reads and writes) and refuses requests
 * with a lower one. Guarded by a process-shared robust mutex. */
typedef struct sf_resource {
    pthread_mutex_t mu;
    int64_t value;
    uint64_t max_token;
    uint64_t ops;           /* operation counter */
    uint64_t last_write_op; /* op number of the last accepted write */
    int64_t accepted, rejected, read_rejected;
    int64_t stale_accepted; /* accepted writes whose read was stale */
    uint64_t last_write_token; /* the token of the last accepted write */
} sf_resource;

/* Per-worker parameters and counters. */
typedef struct sf_worker {
    char uri[SF_URI_MAX];
    volatile pid_t pid;
    volatile int opened;     /* its client is open */
    volatile int exited;
    volatile int in_acquire; /* inside dlock_acquire() (waiting) */
    int64_t acquires, busy, errors, open_errors;
    char last_err[256];
    /* a runner (cutoff-run): the run it has started, for its command's
     * tree to record its hold with */
    int64_t run_t_call;      /* when it started dlock run */
    uint32_t run_seq;
    int run_shared;          /* dlock run --shared */
    volatile int run_hold;   /* the tree's hold, -1 until it records it */
} sf_worker;

typedef struct sf_shared {
    sf_resource res;
    /* parameters */
    int nworkers;
    int64_t ttl_ms;
    unsigned flags;
    int64_t wait_ms;         /* acquire wait */
    int short_waits;         /* waits of 1..10 ms instead (they keep
                              * ending as the lock is handed over) */
    int cancels;             /* each worker's waits are dlock_cancel()ed
                              * every 1..10 ms by a thread of its own */
    int mixed;               /* two holds in three are read holds */
    int elect;               /* the elect scenario: every hold is a
                              * leader's term (dlock_campaign(), and
                              * dlock_resign() to end it) */
    int sets;                /* the sets scenario: every hold is a set of
                              * two (dlock_acquire_all()) of the lock and
                              * two side names, named in a cycle and in
                              * random order (worker.c) */
    int64_t delay_us;        /* between read and write */
    /* the cutoff-run scenario: worker 0 is a runner of `dlock run`
     * (runner.c), whose command is this binary (`--tree`), and every
     * overlap is a violation (the checker) */
    int runner;
    int no_overlap;
    int64_t run_ttl_ms;      /* dlock run --ttl */
    char dlock_bin[1024];    /* the dlock binary */
    char self_exe[1024];     /* this one */
    pthread_mutex_t tree_mu; /* a tree's processes take turns */
    volatile int64_t locker_at; /* SQLite: when the controller took the
                                 * database's write lock (0: not yet) */
    int max_holds_per_worker;
    int64_t deadline_ns;     /* workers stop at this monotonic time */
    volatile int stop;
    /* the victim protocol */
    volatile int victim_want;    /* 0 none, else 1 + worker id, or -1 any */
    volatile int victim_worker;  /* -1, or the worker that took the role */
    volatile int victim_hold;    /* its hold index */
    volatile int victim_in_window; /* it has read and waits for go */
    volatile int victim_go;
    volatile int victim_done;    /* it wrote and released */
    /* the forged-grant scenario (forger.c): tokens from forged_floor up
     * are sent by the forger and issued by no store (0: no forger in
     * this run); what the forger did, written by it, read once it
     * exited */
    uint64_t forged_floor;
    volatile int forge_stop;     /* the controller says stop */
    int64_t forge_rounds;        /* reads of the waiters (one per round) */
    int64_t forge_refused;       /* SQLite: pokes the channels' directory
                                  * refused (EACCES: its permissions) */
    int64_t forge_targets;       /* waiters found, summed over rounds */
    int64_t forge_sent;          /* forged messages sent */
    int64_t forge_heard;         /* ... that reached a waiter's client
                                  * (Redis: PUBLISH counted a subscriber;
                                  * SQLite: a connection or datagram
                                  * went through; PostgreSQL: unknown) */
    int64_t forge_errors;
    char forge_note[240];        /* its rights check, its first error */
    /* the history */
    volatile uint32_t nholds;
    sf_worker w[SF_MAX_WORKERS];
    sf_hold holds[SF_MAX_HOLDS];
} sf_shared;

/* Time. */
int64_t sf_now_ns(void);
void sf_sleep_us(int64_t us);

/* The resource (resource.c). */
void sf_resource_init(sf_resource *r);
/* Reads the value with `token`; returns SF_W_NONE when served, else
 * SF_W_READ_REJECTED. Each of these three sets *t (if not NULL) to the
 * time of the operation, taken inside the resource's lock. */
int sf_resource_read(sf_resource *r, uint64_t token, int64_t *value,
                     uint64_t *seen, uint64_t *op, int64_t *t);
/* A reader's read (a read hold's token): served when the token is above
 * the last accepted write's (else SF_W_READ_REJECTED: a stale reader);
 * raises the highest token seen, so that no earlier writer writes after
 * it. */
int sf_resource_read_shared(sf_resource *r, uint64_t token, int64_t *value,
                            uint64_t *seen, uint64_t *op, int64_t *t);
/* Writes `value` with `token` (the read was operation read_op); returns
 * SF_W_ACCEPTED or SF_W_REJECTED. */
int sf_resource_write(sf_resource *r, uint64_t token, int64_t value,
                      uint64_t read_op, uint64_t *op, int64_t *t);

/* The checker (checker.c). */
typedef struct sf_report {
    int outcome;
    int holds;            /* complete holds */
    int overlaps;         /* pairs of holds of different workers, one of
                           * them a write hold (readers may overlap) */
    int overlaps_reported;/* ... whose earlier holder was told (or killed) */
    int overlaps_silent;  /* ... whose earlier holder was not told */
    int stale_rejected;   /* resource requests refused */
    int stale_accepted;   /* writes accepted on a stale read */
    int lost_updates;     /* final value vs accepted writes */
    int lost_reported;    /* holds whose release said DLOCK_ELOST or got a
                           * lost-lock callback */
    int token_backwards;  /* tokens not above an earlier hold's */
    int forged_tokens;    /* holds whose token came from a forger (at or
                           * above sf_shared.forged_floor) */
    int overlaps_forbidden; /* overlaps where none may be (no_overlap) */
    int release_errors;   /* releases that failed otherwise (ECONN ...) */
    char detail[512];     /* the first problem, in words */
} sf_report;

void sf_check(const sf_shared *s, sf_report *rep);

/* The worker (worker.c): runs worker `id` of the mapping in `path`. */
int sf_worker_main(const char *path, int id);
/* Maps the shared state of the file open as fd (and closes fd) for worker
 * id: NULL when it cannot, or when id is not a worker's. */
sf_shared *sf_attach(int fd, int id);
/* The cutoff-run scenario (runner.c): worker `id` as a runner of `dlock
 * run` (sf_worker_main() calls it), and the command it runs, a tree of
 * three processes that ignore SIGTERM (`--tree FILE ID`). */
int sf_runner_main(sf_shared *s, const char *path, int id);
int sf_tree_main(const char *path, int id);
/* Takes the victim's role if the controller asks for one and worker `id`
 * fits (worker.c); 1 if it did. */
int sf_claim_victim(sf_shared *s, int id);
/* A process-shared robust mutex (history.c). */
void sf_mutex_init(pthread_mutex_t *mu);
void sf_mutex_lock(pthread_mutex_t *mu);

/* The forged-grant scenario's forger (forger.c): a process of the
 * controller's that forges hand-overs to the waiters it finds, bounded in
 * rate and time; what it did goes to s->forge_*. */
#define SF_FORGED_TOKEN 9223372036854775000ULL /* no store issues it */
#define SF_FORGE_RATE 5000 /* forged messages a second, at most */
enum { SF_FORGE_REDIS,   /* PUBLISH on dlock:c:CLIENTID */
       SF_FORGE_CLUSTER, /* SPUBLISH on dlock:{NAME}c:CLIENTID */
       SF_FORGE_PG,      /* NOTIFY dlock_CLIENTID (table mode) */
       SF_FORGE_LOCAL }; /* bytes to SQLite's wake-up channels */
typedef struct sf_forger {
    int kind;
    int rate;                 /* messages a second, at most */
    int64_t until_ns;         /* it stops by then (CLOCK_MONOTONIC) */
    /* Redis: the node that has the lock's key (127.0.0.1), the ACL user
     * it logs in as, the key, the channel's prefix (the client id
     * follows) */
    int port;
    char user[32], password[32];
    char key[128], chan_prefix[128];
    /* PostgreSQL: the controller's superuser connection (reads the
     * waiters' table) and the forger role's */
    char reader[700], conninfo[300];
    /* SQLite: the sidecar's device and inode (its inode starts its
     * channels' names) and the channels' directory `<db>-dlock.d` */
    unsigned long long dev, ino;
    char chandir[700];
} sf_forger;
/* Runs the forger (in a child of the controller) until s->forge_stop or
 * f->until_ns; 0, 1 when it could not start, 2 when it has more rights
 * than it should (it then forges nothing); why in s->forge_note. */
int sf_forger_main(sf_shared *s, const sf_forger *f);

/* Network faults (netfault.c). */
typedef struct sf_netns {
    char name[64];     /* the namespace */
    char host_if[16];  /* the veth end in our namespace */
    char ns_if[16];    /* the end inside */
    char host_ip[32];  /* the address servers bind to */
    char ns_ip[32];
    int up;
} sf_netns;

/* Creates a namespace and a veth pair with a /30 of their own; 0 or -1
 * (why in `why`). Registered for removal at exit and on SIGINT/SIGTERM. */
int sf_netns_create(sf_netns *n, char *why, size_t cap);
void sf_netns_destroy(sf_netns *n);
/* Removes namespaces left by dead runs of this program. */
void sf_netns_reap_stale(void);
/* The link's state: "up", "down" (a full partition), "slow" (a slow,
 * lossy link: tbf, or netem where the kernel has it), "clear". */
int sf_netns_link(sf_netns *n, const char *how);
/* Enters the namespace (in a child, before exec). */
int sf_netns_enter(const sf_netns *n);

/* A TCP relay that can cut every connection, new ones too (a partition
 * for the stores the namespace does not reach). */
typedef struct sf_relay sf_relay;
sf_relay *sf_relay_start(int target_port);
/* The same, listening inside namespace n on 127.0.0.1:port, the very
 * address a server here listens on (and announces: a Redis Cluster's
 * CLUSTER SLOTS, Sentinel's primary), and relaying to it: a client in n
 * reaches that server, and every server it learns of, only through such
 * relays. NULL on failure (errno). */
sf_relay *sf_relay_start_in(const sf_netns *n, int port);
int sf_relay_port(const sf_relay *r);
void sf_relay_cut(sf_relay *r, int cut);
void sf_relay_stop(sf_relay *r);

#endif
