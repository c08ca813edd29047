# SPDX-License-Identifier: MIT
"""The C library, loaded with cffi in ABI mode (no compiler at install time).

The library is found, in order: ``$DLOCK_LIBRARY`` (a path), the system's
linker cache (``ctypes.util.find_library("dlock")``), ``libdlock.so.0``.
Its store modules are found beside it, as for any C program
(docs/development.md "Modules").
"""
import ctypes.util
import os
from typing import Any

from cffi import FFI  # type: ignore[import]

ffi: Any = FFI()
ffi.cdef(
    """
typedef struct dlock_client dlock_client;
typedef struct dlock dlock;
typedef struct dlock_client_options { int64_t timeout_ms; } dlock_client_options;
typedef void (*dlock_lost_cb)(dlock *lock, uint64_t token, void *arg);
typedef struct dlock_options {
    int64_t ttl_ms;
    unsigned flags;
    dlock_lost_cb on_lost;
    void *on_lost_arg;
    unsigned permits;
    int64_t at_least_ms;
    int64_t at_most_ms;
} dlock_options;
typedef struct dlock_info {
    int held;
    char holder[256];
    uint64_t token;
    int64_t ttl_ms;
    int64_t held_ms;
    int64_t waiters;
    char **queue;
    size_t queue_len;
    int64_t holders;
    int shared;
    int64_t permits;
    char foreign[256];
} dlock_info;
typedef struct dlock_listed { char *name; dlock_info info; } dlock_listed;
typedef struct dlock_list_page {
    dlock_listed *locks;
    size_t n;
    char *next;
} dlock_list_page;

int dlock_client_open(dlock_client **out, const char *uri,
                      const dlock_client_options *opts);
void dlock_client_close(dlock_client *c);
const char *dlock_client_store(const dlock_client *c);
int dlock_open(dlock **out, dlock_client *c, const char *name,
               const dlock_options *opts);
int dlock_acquire(dlock *l, int64_t wait_ms);
int dlock_acquire_shared(dlock *l, int64_t wait_ms);
int dlock_release(dlock *l);
int dlock_acquire_all(dlock *const *ls, size_t n, int64_t wait_ms);
int dlock_release_all(dlock *const *ls, size_t n);
int dlock_cancel(dlock *l);
int dlock_shutdown(dlock *l);
int dlock_extend(dlock *l, int64_t ttl_ms);
uint64_t dlock_token(const dlock *l);
int dlock_held(const dlock *l);
const char *dlock_name(const dlock *l);
void dlock_close(dlock *l);
int dlock_inspect(dlock_client *c, const char *name, dlock_info *out);
void dlock_info_clear(dlock_info *info);
int dlock_list(dlock_client *c, const char *prefix, const char *cursor,
               size_t limit, unsigned flags, dlock_list_page *out);
void dlock_list_clear(dlock_list_page *page);
int dlock_break(dlock_client *c, const char *name, dlock_info *evicted);
typedef struct dlock_finding {
    char check[32];
    char what[512];
    char fix[512];
} dlock_finding;
typedef struct dlock_check {
    dlock_finding *findings;
    size_t n;
    int64_t round_trip_us;
    int64_t clock_offset_ms;
    char notes[1024];
} dlock_check;
int dlock_client_check(dlock_client *c, int64_t ttl_ms, dlock_check *out);
typedef struct dlock_leader {
    int present;
    uint64_t term;
    char value[256];
    int64_t ttl_ms;
    int error;
    char why[256];
} dlock_leader;
typedef struct dlock_observer dlock_observer;
int dlock_campaign(dlock *l, const char *value, int64_t wait_ms);
int dlock_proclaim(dlock *l, const char *value);
int dlock_resign(dlock *l);
int dlock_leader_get(dlock_client *c, const char *name, dlock_leader *out);
int dlock_observe(dlock_client *c, const char *name, void *cb, void *arg,
                  dlock_observer **out);
int dlock_observer_fd(const dlock_observer *o);
int dlock_observer_read(dlock_observer *o, dlock_leader *out);
void dlock_observer_close(dlock_observer *o);
void dlock_check_clear(dlock_check *check);
const char *dlock_strerror(int rc);
const char *dlock_errname(int rc);
const char *dlock_errmsg(void);
const char *dlock_version(void);
const char *dlock_store_scheme(size_t index, int *how);
"""
)


def _load() -> Any:
    path = os.environ.get("DLOCK_LIBRARY")
    if path:
        return ffi.dlopen(path)
    found = ctypes.util.find_library("dlock")
    try:
        return ffi.dlopen(found or "libdlock.so.0")
    except OSError as e:
        raise ImportError(
            "dlock: the C library libdlock.so.0 was not found (install "
            "dlock, or set DLOCK_LIBRARY to its path): %s" % e
        ) from None


lib: Any = _load()

# flags and codes (include/dlock.h; never renumbered)
NO_RENEW = 0x1
FAIR = 0x2
NOT_REENTRANT = 0x4
OWNER_HANDLE = 0x8
LIST_FREE = 0x1
EOK, EBUSY, ELOST, ENOTHELD, EINVAL, ECONN = 0, -1, -2, -3, -4, -5
EAUTH, EPROTO, ENOMEM, ENOTSUP, EDEADLK = -6, -7, -8, -9, -10
ECANCELED = -11
# the longest lease and wait, in ms: include/dlock.h's DLOCK_TTL_MAX and
# DLOCK_WAIT_MAX (365 days). cffi's ABI mode reads no header, so they are
# repeated here; tests/test_limits.py checks them against the header.
TTL_MAX_MS = 31536000000
WAIT_MAX_MS = 31536000000
