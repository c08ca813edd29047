/* SPDX-License-Identifier: MIT */
/*
 * fake_module.c -- store modules for test_modules.sh, installed as redis.so
 * in a module directory of their own, each built with:
 *  - FAKE_ABI and FAKE_VERSION: the module ABI and dlock release it says
 *    it was built for (libdlock loads ABI DLOCK__STORE_ABI_OLDEST to
 *    DLOCK__STORE_ABI, whatever the release);
 *  - FAKE_NO_ENTRY: no entry at all (not a module);
 *  - FAKE_NO_ABANDON: a table that claims HANDOVER without the abandon
 *    slot a hand-over needs (refused when loaded).
 * A module that loads answers every client open with DLOCK_ECONN and a
 * message saying which release's module answered: it proves the load,
 * and stores nothing.
 */
#include "store.h"

#ifdef FAKE_NO_ENTRY
DLOCK__HOST int fake_module_is_not_a_dlock_module(void);
int fake_module_is_not_a_dlock_module(void)
{
    return 1;
}
#else
static int fake_open(void **st, dlock_client *c, const dlock__uri *uri,
                     int64_t timeout_ms)
{
    (void)st, (void)c, (void)uri, (void)timeout_ms;
    return dlock__err(DLOCK_ECONN, "the fake store of dlock %s was loaded",
                      FAKE_VERSION);
}

static void fake_close(void *st)
{
    (void)st;
}

static int fake_lease(void *st, dlock__lease *l, int64_t op_deadline)
{
    (void)st, (void)l, (void)op_deadline;
    return DLOCK_ECONN;
}

static int fake_extend(void *st, dlock__lease *l, int64_t ttl_ms,
                       int64_t op_deadline)
{
    (void)st, (void)l, (void)ttl_ms, (void)op_deadline;
    return DLOCK_ECONN;
}

static int fake_inspect(void *st, const char *name, size_t len,
                        dlock_info *out, int64_t op_deadline)
{
    (void)st, (void)name, (void)len, (void)out, (void)op_deadline;
    return DLOCK_ECONN;
}

static int fake_loop_fd(void *st)
{
    (void)st;
    return -1;
}

static void fake_loop_run(void *st, int readable)
{
    (void)st, (void)readable;
}

static const dlock__backend fake_redis = {
    .abi = FAKE_ABI,
    .size = sizeof(dlock__backend),
    .name = "redis",
    .caps = DLOCK__CAP_LEASE | DLOCK__CAP_HANDOVER | DLOCK__CAP_WAITER_READS,
    .open = fake_open,
    .close = fake_close,
    .acquire = fake_lease,
    .release = fake_lease,
    .extend = fake_extend,
    .inspect = fake_inspect,
    .loop_fd = fake_loop_fd,
    .loop_run = fake_loop_run,
#ifndef FAKE_NO_ABANDON
    .abandon = fake_lease,
#endif
};

static const dlock__backend *const fake_backends[] = {&fake_redis, NULL};

DLOCK__HOST extern const dlock__module dlock__module_entry;
const dlock__module dlock__module_entry = {FAKE_ABI, FAKE_VERSION,
                                           fake_backends};
#endif
