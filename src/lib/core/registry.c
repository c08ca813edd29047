/* SPDX-License-Identifier: MIT */
/*
 * registry.c -- which backend serves which URI scheme.
 *
 * A store that this build leaves out stays listed with a NULL backend, so
 * that its URI fails with DLOCK_ENOTSUP ("built without ...") rather than
 * "unknown store".
 */
#include "internal.h"

#include <string.h>

static const struct {
    const char *scheme;
    const dlock__backend *backend;
    const char *needs; /* what to install to build it in (Debian) */
} registry[] = {
    {"file", &dlock__backend_file, ""},
#ifdef DLOCK_HAVE_REDIS
    {"redis", &dlock__backend_redis, "libhiredis-dev"},
    {"unix", &dlock__backend_redis, "libhiredis-dev"},
    {"redlock", &dlock__backend_redlock, "libhiredis-dev"},
#else
    {"redis", NULL, "libhiredis-dev"},
    {"unix", NULL, "libhiredis-dev"},
    {"redlock", NULL, "libhiredis-dev"},
#endif
#ifdef DLOCK_HAVE_ZK
    {"zk", &dlock__backend_zk, "libzookeeper-mt-dev"},
#else
    {"zk", NULL, "libzookeeper-mt-dev"},
#endif
#ifdef DLOCK_HAVE_ETCD
    {"etcd", &dlock__backend_etcd, "libcurl4-openssl-dev and libcjson-dev"},
    {"etcds", &dlock__backend_etcd, "libcurl4-openssl-dev and libcjson-dev"},
#else
    {"etcd", NULL, "libcurl4-openssl-dev and libcjson-dev"},
    {"etcds", NULL, "libcurl4-openssl-dev and libcjson-dev"},
#endif
#ifdef DLOCK_HAVE_SQLITE
    {"sqlite", &dlock__backend_sqlite, "libsqlite3-dev"},
#else
    {"sqlite", NULL, "libsqlite3-dev"},
#endif
#ifdef DLOCK_HAVE_PG
    {"postgres", &dlock__backend_pg, "libpq-dev"},
    {"postgresql", &dlock__backend_pg, "libpq-dev"},
#else
    {"postgres", NULL, "libpq-dev"},
    {"postgresql", NULL, "libpq-dev"},
#endif
#ifdef DLOCK_HAVE_MYSQL
    {"mysql", &dlock__backend_mysql, "libmariadb-dev"},
    {"mariadb", &dlock__backend_mysql, "libmariadb-dev"},
#else
    {"mysql", NULL, "libmariadb-dev"},
    {"mariadb", NULL, "libmariadb-dev"},
#endif
};

const dlock__backend *dlock__backend_find(const char *scheme, int *built,
                                          const char **needs)
{
    for (size_t i = 0; i < sizeof(registry) / sizeof(registry[0]); i++) {
        if (strcmp(registry[i].scheme, scheme) == 0) {
            *built = registry[i].backend != NULL;
            *needs = registry[i].needs;
            return registry[i].backend;
        }
    }
    *built = 1;
    *needs = "";
    return NULL;
}
