/* SPDX-License-Identifier: MIT */
/*
 * registry.c -- which store serves which URI scheme, and where it is.
 *
 * The file store is always in the library. Every other store is either
 * built in (the static library, or a shared library configured with
 * DLOCK_MODULES=OFF) or a module: <store>.so in the module directory,
 * loaded here when a client first opens a URI of its scheme
 * (docs/development.md "Modules"). A store that this build leaves out
 * stays listed, so that its URI fails with DLOCK_ENOTSUP naming what to
 * install rather than with "unknown store".
 *
 * No state of our own: a client keeps its module's handle; the dynamic
 * linker counts the handles, and RTLD_NODELETE keeps a module mapped after
 * its last client (a client library unmapped under its own thread-exit
 * handlers would crash the process).
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#ifdef DLOCK_MODULES
#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>
#endif

/* the backends this library holds itself (NULL: left out, or a module) */
#if defined(DLOCK_HAVE_REDIS) && !defined(DLOCK_MODULES)
#define IN_REDIS &dlock__backend_redis
#define IN_REDLOCK &dlock__backend_redlock
#else
#define IN_REDIS NULL
#define IN_REDLOCK NULL
#endif
#if defined(DLOCK_HAVE_ZK) && !defined(DLOCK_MODULES)
#define IN_ZK &dlock__backend_zk
#else
#define IN_ZK NULL
#endif
#if defined(DLOCK_HAVE_ETCD) && !defined(DLOCK_MODULES)
#define IN_ETCD &dlock__backend_etcd
#else
#define IN_ETCD NULL
#endif
#if defined(DLOCK_HAVE_SQLITE) && !defined(DLOCK_MODULES)
#define IN_SQLITE &dlock__backend_sqlite
#else
#define IN_SQLITE NULL
#endif
#if defined(DLOCK_HAVE_PG) && !defined(DLOCK_MODULES)
#define IN_PG &dlock__backend_pg
#else
#define IN_PG NULL
#endif
#if defined(DLOCK_HAVE_MYSQL) && !defined(DLOCK_MODULES)
#define IN_MYSQL &dlock__backend_mysql
#else
#define IN_MYSQL NULL
#endif

/* rediss:// is the Redis store's, when it was built with OpenSSL */
#ifdef DLOCK_HAVE_REDIS_TLS
#define IN_REDISS IN_REDIS
#define HAVE_REDISS HAVE_REDIS
#else
#define IN_REDISS NULL
#define HAVE_REDISS 0
#endif

/* the stores configured into this build (built in or as a module) */
#ifdef DLOCK_HAVE_REDIS
#define HAVE_REDIS 1
#else
#define HAVE_REDIS 0
#endif
#ifdef DLOCK_HAVE_ZK
#define HAVE_ZK 1
#else
#define HAVE_ZK 0
#endif
#ifdef DLOCK_HAVE_ETCD
#define HAVE_ETCD 1
#else
#define HAVE_ETCD 0
#endif
#ifdef DLOCK_HAVE_SQLITE
#define HAVE_SQLITE 1
#else
#define HAVE_SQLITE 0
#endif
#ifdef DLOCK_HAVE_PG
#define HAVE_PG 1
#else
#define HAVE_PG 0
#endif
#ifdef DLOCK_HAVE_MYSQL
#define HAVE_MYSQL 1
#else
#define HAVE_MYSQL 0
#endif

typedef struct {
    const char *scheme;
    const char *module;  /* its module: <module>.so; NULL for "file", "mem" */
    const char *backend; /* the backend's name in the module */
    const char *what;    /* for messages: "Redis" */
    const char *needs;   /* what it is built with (Debian packages) */
    const dlock__backend *in; /* built into this library */
    int configured;      /* in this build, built in or as a module */
} store;

#define LIBREDIS "libhiredis-dev"
#define LIBZK "libzookeeper-mt-dev"
#define LIBETCD "libcurl4-openssl-dev and libcjson-dev"
static const store stores[] = {
    {"file", NULL, "file", "file", "", &dlock__backend_file, 1},
    {"mem", NULL, "mem", "in-process", "", &dlock__backend_mem, 1},
    {"redis", "redis", "redis", "Redis", LIBREDIS, IN_REDIS, HAVE_REDIS},
    {"rediss", "redis", "redis", "Redis over TLS", LIBREDIS " and libssl-dev",
     IN_REDISS, HAVE_REDISS},
    {"unix", "redis", "redis", "Redis", LIBREDIS, IN_REDIS, HAVE_REDIS},
    {"redis-sentinel", "redis", "redis", "Redis", LIBREDIS, IN_REDIS,
     HAVE_REDIS},
    {"redis-cluster", "redis", "redis", "Redis", LIBREDIS, IN_REDIS,
     HAVE_REDIS},
    {"redlock", "redis", "redlock", "Redlock", LIBREDIS, IN_REDLOCK,
     HAVE_REDIS},
    {"zk", "zk", "zk", "ZooKeeper", LIBZK, IN_ZK, HAVE_ZK},
    {"etcd", "etcd", "etcd", "etcd", LIBETCD, IN_ETCD, HAVE_ETCD},
    {"etcds", "etcd", "etcd", "etcd", LIBETCD, IN_ETCD, HAVE_ETCD},
    {"sqlite", "sqlite", "sqlite", "SQLite", "libsqlite3-dev", IN_SQLITE,
     HAVE_SQLITE},
    {"postgres", "pg", "postgres", "PostgreSQL", "libpq-dev", IN_PG,
     HAVE_PG},
    {"postgresql", "pg", "postgres", "PostgreSQL", "libpq-dev", IN_PG,
     HAVE_PG},
    {"mysql", "mysql", "mysql", "MySQL/MariaDB", "libmariadb-dev", IN_MYSQL,
     HAVE_MYSQL},
    {"mariadb", "mysql", "mysql", "MySQL/MariaDB", "libmariadb-dev",
     IN_MYSQL, HAVE_MYSQL},
};
#define NSTORES (sizeof(stores) / sizeof(stores[0]))

static const store *find(const char *scheme)
{
    for (size_t i = 0; i < NSTORES; i++)
        if (strcmp(stores[i].scheme, scheme) == 0)
            return &stores[i];
    return NULL;
}

#ifdef DLOCK_MODULES
/*
 * The module directory: $DLOCK_MODULE_DIR (ignored in set-user-ID
 * programs), else dlock-<version>/ beside the libdlock.so that runs this
 * code (so that a tree installed under any prefix, or the build tree,
 * finds its own modules), else the directory it was installed to.
 */
static void module_dir(char *buf, size_t n)
{
    const char *env = secure_getenv("DLOCK_MODULE_DIR");
    if (env && *env) {
        snprintf(buf, n, "%s", env);
        return;
    }
    Dl_info di;
    const char *slash;
    if (dladdr((void *)dlock__store_open, &di) && di.dli_fname &&
        (slash = strrchr(di.dli_fname, '/')) != NULL) {
        snprintf(buf, n, "%.*s/%s", (int)(slash - di.dli_fname),
                 di.dli_fname, DLOCK_MODULE_SUBDIR);
        return;
    }
    snprintf(buf, n, "%s", DLOCK_MODULE_INSTALL_DIR);
}

/* the Debian package of a module (debian/control: libdlock0-<this>) */
static const char *deb_package(const char *module)
{
    if (strcmp(module, "zk") == 0)
        return "zookeeper";
    if (strcmp(module, "pg") == 0)
        return "postgresql";
    return module; /* redis, etcd, sqlite, mysql */
}

static void module_path(const store *s, char *buf, size_t n)
{
    char dir[PATH_MAX];
    module_dir(dir, sizeof(dir));
    if ((size_t)snprintf(buf, n, "%s/%s.so", dir, s->module) >= n)
        buf[0] = '\0'; /* no such file */
}

static int module_open(const store *s, const dlock__backend **be,
                       void **handle)
{
    char path[PATH_MAX + 16];
    module_path(s, path, sizeof(path));
    /* not there: "not installed"; any other reason (a directory this
     * user may not search) is dlopen()'s to tell, and a module this
     * process has mapped already is found without reading the file */
    if (!path[0] || (access(path, F_OK) != 0 && errno == ENOENT))
        return dlock__err(DLOCK_ENOTSUP,
                          "the %s:// store is a module of dlock that is not "
                          "installed: %s.so not found in the module directory "
                          "(%s; install dlock's %s module: Debian package "
                          "libdlock0-%s, or a build with %s)",
                          s->scheme, s->module,
                          path[0] ? path : "path too long", s->what,
                          deb_package(s->module), s->needs);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        const char *why = dlerror();
        return dlock__err(DLOCK_ENOTSUP,
                          "the %s:// store's module %s cannot be loaded: %s",
                          s->scheme, path, why ? why : "unknown reason");
    }
    const dlock__module *m = (const dlock__module *)dlsym(h, "dlock__module_entry");
    int rc = 0;
    if (!m) {
        rc = dlock__err(DLOCK_ENOTSUP, "%s is not a dlock store module (it "
                        "has no dlock__module_entry)", path);
    } else if (m->abi < DLOCK__STORE_ABI_OLDEST || m->abi > DLOCK__STORE_ABI) {
        char abis[32];
        if (DLOCK__STORE_ABI_OLDEST < DLOCK__STORE_ABI)
            snprintf(abis, sizeof(abis), "%u to %u", DLOCK__STORE_ABI_OLDEST,
                     DLOCK__STORE_ABI);
        else
            snprintf(abis, sizeof(abis), "%u only", DLOCK__STORE_ABI);
        rc = dlock__err(DLOCK_ENOTSUP, "%s is built for store module ABI %u "
                        "(dlock %.32s); this libdlock %s loads ABI %s: "
                        "install the %s module of this dlock", path, m->abi,
                        m->version ? m->version : "(unknown)",
                        DLOCK_VERSION_STRING, abis, s->what);
    } else {
        *be = NULL;
        for (size_t i = 0; m->backends && m->backends[i]; i++)
            if (m->backends[i]->name &&
                strcmp(m->backends[i]->name, s->backend) == 0)
                *be = m->backends[i];
        if (!*be)
            rc = dlock__err(DLOCK_ENOTSUP, "%s has no %s store", path,
                            s->backend);
        else
            rc = dlock__backend_check(*be, path);
    }
    if (rc) {
        dlclose(h);
        return rc;
    }
    *handle = h;
    return 0;
}
#endif

/* The capabilities store.h knows, by name for messages. */
typedef struct cap_name {
    unsigned cap;
    const char *name; /* for messages: the flag without DLOCK__CAP_ */
} cap_name;

static const cap_name cap_names[] = {
    {DLOCK__CAP_LEASE, "LEASE"},
    {DLOCK__CAP_NATIVE_WAIT, "NATIVE_WAIT"},
    {DLOCK__CAP_HANDOVER, "HANDOVER"},
    {DLOCK__CAP_WAITER_READS, "WAITER_READS"},
    {DLOCK__CAP_SHARED, "SHARED"},
    {DLOCK__CAP_PERMITS, "PERMITS"},
};

static int refuse(const dlock__backend *be, const char *where,
                  const char *what)
{
    return dlock__err(DLOCK_ENOTSUP, "%s: the %s store's table %s: refused "
                      "(a store module of dlock that does not keep the "
                      "module ABI's rules; docs/design.md, \"The house\")",
                      where, be->name ? be->name : "(unnamed)", what);
}

int dlock__backend_check(const dlock__backend *be, const char *where)
{
    unsigned known = 0, caps = be->caps;
    char what[160];

    for (size_t i = 0; i < sizeof(cap_names) / sizeof(cap_names[0]); i++)
        known |= cap_names[i].cap;
    if (be->abi != DLOCK__STORE_ABI || be->size != sizeof(*be)) {
        snprintf(what, sizeof(what), "is of module ABI %u (%zu bytes), not "
                 "ABI %u (%zu bytes) as its module says", be->abi, be->size,
                 DLOCK__STORE_ABI, sizeof(*be));
        return refuse(be, where, what);
    }
    if (!be->name || !*be->name)
        return refuse(be, where, "has no name");
    if (caps & ~known) {
        snprintf(what, sizeof(what), "claims unknown capabilities 0x%x",
                 caps & ~known);
        return refuse(be, where, what);
    }
    /* the slots every store fills */
    const struct {
        int has;
        const char *slot;
    } required[] = {
        {be->open != NULL, "open"},       {be->close != NULL, "close"},
        {be->acquire != NULL, "acquire"}, {be->release != NULL, "release"},
        {be->extend != NULL, "extend"},   {be->inspect != NULL, "inspect"},
    };
    for (size_t i = 0; i < sizeof(required) / sizeof(required[0]); i++)
        if (!required[i].has) {
            snprintf(what, sizeof(what), "has no %s slot", required[i].slot);
            return refuse(be, where, what);
        }
    /* a capability and the slot it needs, or the one it excludes */
    const struct {
        int bad;
        const char *what;
    } ties[] = {
        {(caps & DLOCK__CAP_HANDOVER) && !be->abandon,
         "claims capability HANDOVER without an abandon slot"},
        {(caps & DLOCK__CAP_WAITER_READS) && (!be->loop_fd || !be->loop_run),
         "claims capability WAITER_READS without loop_fd and loop_run slots"},
        {(caps & DLOCK__CAP_NATIVE_WAIT) &&
             (caps & (DLOCK__CAP_HANDOVER | DLOCK__CAP_WAITER_READS)),
         "claims capability NATIVE_WAIT with HANDOVER or WAITER_READS (the "
         "core's wait loop's, which a store that waits itself does not "
         "use)"},
        {!(caps & DLOCK__CAP_NATIVE_WAIT) && be->cancel,
         "has a cancel slot without capability NATIVE_WAIT (the core's own "
         "wait ends at a cancel)"},
        {(caps & DLOCK__CAP_LEASE) && be->at_risk_max,
         "has an at_risk_max slot with capability LEASE (the core computes "
         "a leased store's ends itself)"},
        {!be->loop_fd != !be->loop_run,
         "has only one of the loop_fd and loop_run slots"},
        {be->arm && !be->disarm, "has an arm slot without a disarm slot"},
        {be->evict && be->evict_unsupported,
         "has both an evict slot and evict_unsupported"},
        {!be->watch_open != !be->watch_wait ||
             !be->watch_open != !be->watch_close,
         "has some of the watch_open, watch_wait and watch_close slots, "
         "not all three"},
        {be->ring && !be->watch_open, "has a ring slot without a watch"},
    };
    for (size_t i = 0; i < sizeof(ties) / sizeof(ties[0]); i++)
        if (ties[i].bad)
            return refuse(be, where, ties[i].what);
    return DLOCK_OK;
}

int dlock__store_open(const char *scheme, const dlock__backend **be,
                      void **handle)
{
    *be = NULL;
    *handle = NULL;
    const store *s = find(scheme);
    if (!s) {
        char known[256] = "";
        size_t off = 0;
        for (size_t i = 0; i < NSTORES && off < sizeof(known); i++)
            off += (size_t)snprintf(known + off, sizeof(known) - off, "%s%s",
                                    i ? ", " : "", stores[i].scheme);
        return dlock__err(DLOCK_EINVAL, "unknown store '%s://' (known: %s)",
                          scheme, known);
    }
    if (s->in) {
        *be = s->in;
        return dlock__backend_check(*be, "built in");
    }
    if (!s->configured)
        return dlock__err(DLOCK_ENOTSUP,
                          "this dlock was built without the %s:// store "
                          "(left out when it was configured: its client "
                          "library was missing or it was turned off; Debian: "
                          "install %s and build dlock again)",
                          scheme, s->needs);
#ifdef DLOCK_MODULES
    return module_open(s, be, handle);
#else
    return dlock__err(DLOCK_ENOTSUP, "the %s:// store is not in this build",
                      scheme);
#endif
}

void dlock__store_close(void *handle)
{
#ifdef DLOCK_MODULES
    if (handle)
        dlclose(handle);
#else
    (void)handle;
#endif
}

const char *dlock_store_scheme(size_t index, int *how)
{
    if (index >= NSTORES)
        return NULL;
    const store *s = &stores[index];
    if (how) {
        *how = s->in ? DLOCK_STORE_BUILTIN : DLOCK_STORE_MISSING;
#ifdef DLOCK_MODULES
        if (!s->in && s->configured) {
            char path[PATH_MAX + 16];
            module_path(s, path, sizeof(path));
            if (path[0] && access(path, R_OK) == 0)
                *how = DLOCK_STORE_MODULE;
        }
#endif
    }
    return s->scheme;
}
