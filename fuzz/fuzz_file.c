/* SPDX-License-Identifier: MIT */
/*
 * fuzz_file.c -- the file store (src/stores/file/file.c): lock names to
 * file names, and the lock file's content as dlock_inspect() reads it.
 *
 * Input: field 1 a lock name; then one byte of flags (bit 0: another open
 * file holds the lock byte; bit 1: another holds a fair-queue ticket;
 * bit 2: the file starts with the right magic); the rest is the lock
 * file's content (after the magic when bit 2 is set).
 * Checks on file_name(): the result fits its buffer (exact size), ends in
 * ".lock", holds only [A-Za-z0-9_.%~-], never starts with '.', has no '/';
 * unless cut and hashed ('~'), it decodes back to the name (one file per
 * name). Then file_inspect() reads whatever the file holds: no crash or UB,
 * "held" exactly when another open file holds the lock byte, a holder
 * description that is a terminated string. Then dlock__file_list() with
 * the name as prefix lists exactly that name once when inspect could read
 * the file, never when it is not a lock file (DLOCK_LIST_FREE), and with the name as a
 * cursor answers DLOCK_EINVAL or a page, never a crash.
 */
#include "fuzz.h"

#include "../src/stores/file/file.c"
#include "../src/stores/file/file_operate.c"

static file_store store = {.dir = NULL, .dirfd = -1, .epfd = -1};

static void setup(void)
{
    static char dir[] = "/tmp/dlock-fuzz-file-XXXXXX";

    if (store.dirfd >= 0)
        return;
    if (!mkdtemp(dir))
        abort();
    store.dir = dir;
    store.dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (store.dirfd < 0)
        abort();
}

static int hexdig(int c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static void check_file_name(const char *name, size_t len, const char *out)
{
    size_t n = strlen(out);

    if (n > FNAME_MAX || n < 6 || strcmp(out + n - 5, ".lock") != 0)
        fz_fail("file name of %zu bytes or without .lock", n);
    if (out[0] == '.')
        fz_fail("file name starts with '.'");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)out[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
              (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' ||
              ch == '.' || ch == '%' || ch == '~'))
            fz_fail("file name holds byte 0x%02x", ch);
    }
    if (strchr(out, '~'))
        return; /* cut, with the hash of the whole name */
    /* decode: the name itself */
    size_t o = 0;
    for (size_t i = 0; i + 5 < n; i++) {
        unsigned char ch = (unsigned char)out[i];
        if (ch == '%') {
            int a = hexdig(out[i + 1]), b = hexdig(out[i + 2]);
            if (a < 0 || b < 0)
                fz_fail("bad escape in file name");
            ch = (unsigned char)(a * 16 + b);
            i += 2;
        }
        if (o >= len || (unsigned char)name[o] != ch)
            fz_fail("file name does not decode to the lock name");
        o++;
    }
    if (o != len)
        fz_fail("file name decodes to a shorter name");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz f = fz_init(data, size);
    size_t len;
    char *name = fz_field(&f, &len);

    setup();
    if (len == 0 || len > DLOCK_NAME_MAX) {
        free(name);
        return 0;
    }
    char *fname = malloc(FNAME_MAX + 8);
    dlock__file_name(name, len, fname);
    check_file_name(name, len, fname);

    unsigned flags = fz_byte(&f);
    size_t clen;
    const uint8_t *content = fz_rest(&f, &clen);
    int fd = openat(store.dirfd, fname, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC,
                    0600);
    if (fd < 0)
        abort();
    if (flags & 4) {
        if (pwrite(fd, magic, sizeof(magic), 0) != (ssize_t)sizeof(magic))
            abort();
    }
    if (clen && pwrite(fd, content, clen, flags & 4 ? 8 : 0) != (ssize_t)clen)
        abort();
    if (flags & 1)
        dlock__ofd_lk(fd, F_OFD_SETLK, F_WRLCK, MAIN_BYTE, 1);
    if (flags & 2)
        dlock__ofd_lk(fd, F_OFD_SETLK, F_WRLCK,
                      QUEUE_BASE + (off_t)(flags >> 3), 1);

    dlock_info info;
    memset(&info, 0, sizeof(info));
    int rc = dlock__file_inspect(&store, name, len, &info, DLOCK__FOREVER);
    if (rc == DLOCK_OK) {
        if (strnlen(info.holder, sizeof(info.holder)) == sizeof(info.holder))
            fz_fail("holder not terminated");
        if (info.held != !!(flags & 1))
            fz_fail("held %d with the lock byte %s", info.held,
                    flags & 1 ? "taken" : "free");
        if (info.held_ms < 0 || info.waiters < 0)
            fz_fail("negative held_ms or waiters");
    } else if (rc != DLOCK_EPROTO) {
        fz_fail("inspect returned %d: %s", rc, dlock_errmsg());
    }
    dlock_info_clear(&info);
    int inspected = rc == DLOCK_OK;

    dlock_list_page page;
    memset(&page, 0, sizeof(page));
    rc = dlock__file_list(&store, name, len, "", 10, DLOCK_LIST_FREE, &page,
                          DLOCK__FOREVER);
    if (rc == DLOCK_OK) {
        size_t same = 0;
        for (size_t i = 0; i < page.n; i++)
            same += strlen(page.locks[i].name) == len &&
                    memcmp(page.locks[i].name, name, len) == 0;
        /* a name with a NUL byte cannot be a lock name: skip those */
        if (strlen(name) == len && same != (size_t)inspected &&
            !strchr(fname, '~'))
            fz_fail("the name is listed %zu times (inspect: %s)", same,
                    inspected ? "ok" : "not a lock file");
    } else {
        fz_fail("list returned %d: %s", rc, dlock_errmsg());
    }
    dlock_list_clear(&page);
    rc = dlock__file_list(&store, "", 0, name, 3, 0, &page, DLOCK__FOREVER);
    if (rc != DLOCK_OK && rc != DLOCK_EINVAL)
        fz_fail("list from a cursor returned %d: %s", rc, dlock_errmsg());
    dlock_list_clear(&page);
    close(fd);
    unlinkat(store.dirfd, fname, 0);
    free(fname);
    free(name);
    return 0;
}
