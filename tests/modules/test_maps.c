/* SPDX-License-Identifier: MIT */
/*
 * test_maps.c URI -- takes and releases one lock on URI, then prints every
 * shared object this process has mapped (one path a line), or "ERR
 * <code>: <message>" and exits 3 when the store refuses. Linked with
 * libdlock.so alone, so that test_modules.sh can check which client
 * libraries a program that uses one store pays for.
 */
#include <dlock.h>

#include <stdio.h>
#include <string.h>

static int fail(int rc)
{
    printf("ERR %s: %s\n", dlock_errname(rc), dlock_errmsg());
    return 3;
}

int main(int argc, char **argv)
{
    dlock_client *c = NULL;
    dlock *l = NULL;
    int rc;

    if (argc != 2) {
        fprintf(stderr, "usage: test_maps URI\n");
        return 2;
    }
    rc = dlock_client_open(&c, argv[1], NULL);
    if (rc)
        return fail(rc);
    rc = dlock_open(&l, c, "test-maps", NULL);
    if (!rc)
        rc = dlock_acquire(l, 5000);
    if (!rc)
        rc = dlock_release(l);
    if (rc) {
        int r = fail(rc);
        dlock_close(l);
        dlock_client_close(c);
        return r;
    }

    /* each object once: the lines of /proc/self/maps that name a file */
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096], last[4096] = "";
    while (f && fgets(line, sizeof(line), f)) {
        char *path = strchr(line, '/');
        if (!path || !strstr(path, ".so"))
            continue;
        path[strcspn(path, "\n")] = '\0';
        if (strcmp(path, last) != 0)
            puts(path);
        snprintf(last, sizeof(last), "%s", path);
    }
    if (f)
        fclose(f);
    dlock_close(l);
    dlock_client_close(c);
    return f ? 0 : 4;
}
