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
} registry[] = {
    {"file", &dlock__backend_file},
#ifdef DLOCK_HAVE_REDIS
    {"redis", &dlock__backend_redis},
    {"unix", &dlock__backend_redis},
    {"redlock", &dlock__backend_redlock},
#else
    {"redis", NULL},
    {"unix", NULL},
    {"redlock", NULL},
#endif
#ifdef DLOCK_HAVE_ZK
    {"zk", &dlock__backend_zk},
#else
    {"zk", NULL},
#endif
#ifdef DLOCK_HAVE_ETCD
    {"etcd", &dlock__backend_etcd},
    {"etcds", &dlock__backend_etcd},
#else
    {"etcd", NULL},
    {"etcds", NULL},
#endif
#ifdef DLOCK_HAVE_SQLITE
    {"sqlite", &dlock__backend_sqlite},
#else
    {"sqlite", NULL},
#endif
#ifdef DLOCK_HAVE_PG
    {"postgres", &dlock__backend_pg},
    {"postgresql", &dlock__backend_pg},
#else
    {"postgres", NULL},
    {"postgresql", NULL},
#endif
#ifdef DLOCK_HAVE_MYSQL
    {"mysql", &dlock__backend_mysql},
    {"mariadb", &dlock__backend_mysql},
#else
    {"mysql", NULL},
    {"mariadb", NULL},
#endif
};

const dlock__backend *dlock__backend_find(const char *scheme, int *built)
{
    for (size_t i = 0; i < sizeof(registry) / sizeof(registry[0]); i++) {
        if (strcmp(registry[i].scheme, scheme) == 0) {
            *built = registry[i].backend != NULL;
            return registry[i].backend;
        }
    }
    *built = 1;
    return NULL;
}
