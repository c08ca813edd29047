/* SPDX-License-Identifier: MIT */
/*
 * fuzz_zk.c -- what the ZooKeeper store (src/stores/zk/) does with
 * chroots, lock names and the children the server lists.
 *
 * Input: field 1 a chroot (check_chroot, as zk_open validates the URI's
 * path); field 2 a lock name; the remaining fields the names of the lock
 * node's children as the server could list them.
 * Checks: an accepted chroot is "" or an absolute path without "//", "."
 * or ".." components, a trailing '/', or /zookeeper; the lock's node is
 * CHROOT/ + one component of [A-Za-z0-9_%-] only that unescapes to the
 * name (one node per name, never "." or "..", never "zookeeper" at the
 * root), within its buffer (exact size); sort_children keeps exactly the
 * names with a sequence number, in increasing order. The children read
 * as the chroot's (dlock_list()'s lock names and cursors, zk_operate.c):
 * a name accepted unescapes to one lock name whose node is exactly that
 * child (one name per node, never the server's own "zookeeper").
 */
#include "fuzz.h"

#include "../src/stores/zk/zk.c"
#include "../src/stores/zk/zk_queue.c"
#include "../src/stores/zk/zk_conn.c"
#include "../src/stores/zk/zk_mine.c"
#include "../src/stores/zk/zk_operate.c"

static int hexdig(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static void check_path(const zk_store *zs, const char *name, size_t len,
                       const char *out)
{
    size_t cl = strcmp(zs->chroot, "/") ? strlen(zs->chroot) : 0;
    size_t n = strlen(out), o = 0;

    if (n + 1 > ZK_PARENT_MAX || memcmp(out, zs->chroot, cl) != 0 ||
        out[cl] != '/')
        fz_fail("lock node layout");
    const char *c = out + cl + 1;
    if (!strcmp(c, ".") || !strcmp(c, "..") || !*c)
        fz_fail("lock node is '.', '..' or empty");
    if (cl == 0 && !strcmp(c, "zookeeper"))
        fz_fail("lock node is /zookeeper");
    for (size_t i = 0; c[i]; i++) {
        unsigned char ch = (unsigned char)c[i];
        if (ch == '%') {
            if (hexdig(c[i + 1]) < 0 || hexdig(c[i + 2]) < 0)
                fz_fail("bad escape");
            ch = (unsigned char)(hexdig(c[i + 1]) * 16 + hexdig(c[i + 2]));
            i += 2;
        } else if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                     (ch >= '0' && ch <= '9') || ch == '_' || ch == '-')) {
            fz_fail("byte 0x%02x in a lock node", ch);
        }
        if (o >= len || (unsigned char)name[o] != ch)
            fz_fail("the node does not unescape to the name");
        o++;
    }
    if (o != len)
        fz_fail("the node unescapes to a shorter name");
}

static void check_chroot_ok(const char *p)
{
    size_t n = strlen(p);

    if (n == 0)
        return;
    if (p[0] != '/' || n > ZK_CHROOT_MAX || (n > 1 && p[n - 1] == '/') ||
        strstr(p, "//") || strstr(p, "/./") || strstr(p, "/../") ||
        (n >= 2 && !strcmp(p + n - 2, "/.")) ||
        (n >= 3 && !strcmp(p + n - 3, "/..")) ||
        !strcmp(p, "/zookeeper") || !strncmp(p, "/zookeeper/", 11))
        fz_fail("check_chroot accepted \"%s\"", p);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f)
            fz_fail("check_chroot accepted a control character");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = fz_init(data, size);
    size_t len;
    char *chroot = fz_field(&f, NULL);
    char *name = fz_field(&f, &len);
    zk_store *zs = calloc(1, sizeof(*zs));

    if (check_chroot(chroot) == 0) {
        check_chroot_ok(chroot);
        snprintf(zs->chroot, sizeof(zs->chroot), "%s",
                 chroot[0] ? chroot : "/");
    } else {
        snprintf(zs->chroot, sizeof(zs->chroot), "/");
    }
    if (len >= 1 && len <= DLOCK_NAME_MAX) {
        char *out = malloc(ZK_PARENT_MAX);
        dlock__zk_lock_path(zs, name, len, out);
        check_path(zs, name, len, out);
        free(out);
    }

    struct String_vector v = {0, NULL};
    v.data = calloc(64, sizeof(char *));
    while (f.p && v.count < 64)
        v.data[v.count++] = fz_field(&f, NULL);
    /* the same strings as the chroot's children, or as list cursors */
    char *lname = malloc(DLOCK_NAME_MAX + 1), *again = malloc(ZK_PARENT_MAX);
    for (int32_t i = 0; i < v.count; i++) {
        long n = strlen(v.data[i]) <= 3 * DLOCK_NAME_MAX
                     ? dlock__zk_unescape(zs, v.data[i], lname)
                     : -1;
        if (n < 0)
            continue;
        if (n == 0 || n > DLOCK_NAME_MAX || memchr(lname, '\0', (size_t)n))
            fz_fail("unescape gave a name no lock has");
        dlock__zk_lock_path(zs, lname, (size_t)n, again);
        check_path(zs, lname, (size_t)n, again);
        size_t cl = strcmp(zs->chroot, "/") ? strlen(zs->chroot) : 0;
        if (strcmp(again + cl + 1, v.data[i]) != 0)
            fz_fail("a listed name is not its node");
    }
    free(lname);
    free(again);
    int32_t kept = dlock__zk_sort_children(&v), ours = 0;
    for (int32_t i = 0; i < v.count; i++) {
        ours += child_seq(v.data[i]) >= 0;
        long p = dlock__zk_permits_of(v.data[i]);
        if (p < 0 || p > DLOCK_PERMITS_MAX)
            fz_fail("permits_of %ld", p);
    }
    if (kept != ours)
        fz_fail("sort_children kept %d of %d", kept, ours);
    for (int32_t i = 0; i < kept; i++) {
        if (child_seq(v.data[i]) < 0)
            fz_fail("a foreign name among the kept children");
        if (i && child_seq(v.data[i - 1]) > child_seq(v.data[i]))
            fz_fail("children out of order");
        if (find_mine(&v, kept, v.data[i]) > i)
            fz_fail("find_mine");
    }
    for (int32_t i = 0; i < v.count; i++)
        free(v.data[i]);
    free(v.data);
    free(zs);
    free(chroot);
    free(name);
    return 0;
}
