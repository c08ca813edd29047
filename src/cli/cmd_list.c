/* SPDX-License-Identifier: MIT */
/*
 * cmd_list.c -- `dlock list [--store URI] [--prefix P] [--all] [--limit N]
 * [--json]`: every lock a store knows, one line each.
 *
 * The listing pages through dlock_list() and prints each page as it comes
 * (stdout flushed after each), so memory stays at one page however many
 * locks the store has, and a long listing shows its first lines at once.
 * A page is not a snapshot of the whole store (dlock.h): a lock that
 * changes while the listing runs may show twice or not at all, but each
 * line is the store's view of that lock at one moment.
 */
#include "cli.h"
#include "cmd.h"

#include <dlock.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char list_usage[] =
    "usage: dlock list [--store URI] [--prefix P] [--all] [--limit N] "
    "[--json]\n"
    "\n"
    "Lists the locks of the store that are held or waited for: one line\n"
    "each with its name, mode, holds, fencing token, hold age, lease left,\n"
    "waiters and holder. Odd bytes in names show as \\xNN (a backslash as\n"
    "\\\\).\n"
    "\n"
    "  --store URI  the store (default: $DLOCK_STORE, else the file store)\n"
    "  --prefix P   only names that start with the bytes P\n"
    "  --all        also free locks the store still keeps (lock tables'\n"
    "               rows, token counters)\n"
    "  --limit N    ask the store for at most N locks per round trip\n"
    "               (1..10000; default 100); the listing goes on to the end\n"
    "  --json       one JSON object per lock and line (JSON Lines), with\n"
    "               the fields of 'dlock status --json'\n"
    "\n"
    "Exit status: 0 (also when no lock is listed), 64 usage, 69 store error\n"
    "or a store that cannot list its locks (lines already printed stay).\n";

/* Longest name column; a longer name pushes its line's other columns. */
#define NAME_COL_MAX 40
/* Pages in one listing: a store's cursors end the walk long before (10,000
 * pages of even one lock is more than an operator's listing); a store that
 * never ends it is a bug, reported, not an endless loop. */
#define MAX_PAGES 1000000

typedef struct lister {
    dlock_client *c;
    int json;
    size_t name_w; /* the name column's width, from the first page */
    size_t count;  /* locks printed */
} lister;

static void print_header(lister *ls, const dlock_list_page *page)
{
    size_t w = 4;

    for (size_t i = 0; i < page->n; i++) {
        size_t nw = cli_human_width(page->locks[i].name);
        if (nw > w)
            w = nw;
    }
    ls->name_w = w > NAME_COL_MAX ? NAME_COL_MAX : w;
    printf("%-*s  %-9s %7s %20s %8s %8s %7s  %s\n", (int)ls->name_w,
           "NAME", "MODE", "HOLDS", "TOKEN", "HELD", "LEASE", "WAITERS",
           "HOLDER");
}

static void print_row(lister *ls, const dlock_listed *l)
{
    const dlock_info *in = &l->info;
    char holds[48], held[32], lease[32], waiters[32];
    size_t w = cli_human_width(l->name);

    cli_human_str(stdout, l->name);
    for (; w < ls->name_w; w++)
        fputc(' ', stdout);
    if (in->permits > 0)
        snprintf(holds, sizeof(holds), "%lld/%lld", (long long)in->holders,
                 (long long)in->permits);
    else
        snprintf(holds, sizeof(holds), "%lld", (long long)in->holders);
    if (in->held && in->held_ms >= 0)
        cli_format_duration(in->held_ms, held, sizeof(held));
    else
        snprintf(held, sizeof(held), "-");
    if (in->held && in->ttl_ms >= 0)
        cli_format_duration(in->ttl_ms, lease, sizeof(lease));
    else
        snprintf(lease, sizeof(lease), in->held ? "none" : "-");
    if (in->waiters >= 0)
        snprintf(waiters, sizeof(waiters), "%lld", (long long)in->waiters);
    else
        snprintf(waiters, sizeof(waiters), "?");
    printf("  %-9s %7s %20llu %8s %8s %7s  ", cli_mode_of(in), holds,
           (unsigned long long)in->token, held, lease, waiters);
    if (in->held && in->holder[0])
        cli_human_str(stdout, in->holder);
    else
        fputc('-', stdout);
    fputc('\n', stdout);
}

static void print_json(lister *ls, const dlock_listed *l)
{
    fputc('{', stdout);
    cli_json_name(stdout, "name", l->name);
    fputs(",\"store\":", stdout);
    cli_json_str(stdout, dlock_client_store(ls->c));
    fputc(',', stdout);
    cli_json_info(stdout, &l->info);
    fputs("}\n", stdout);
}

/* Walks every page; returns 0 or a CLI exit code after a message. */
static int walk(lister *ls, const char *prefix, size_t limit, unsigned flags)
{
    char *cursor = NULL;
    int rc, pages = 0;

    do {
        dlock_list_page page;

        rc = dlock_list(ls->c, prefix, cursor, limit, flags, &page);
        if (rc != DLOCK_OK) {
            cli_err("%s", dlock_errmsg());
            free(cursor);
            /* the arguments were checked: DLOCK_EINVAL here is a cursor
             * the store refused, the store's fault, not the user's */
            return cli_exit_for(rc == DLOCK_EINVAL ? DLOCK_EPROTO : rc);
        }
        if (!ls->json && ls->count == 0 && page.n > 0)
            print_header(ls, &page);
        for (size_t i = 0; i < page.n; i++) {
            if (ls->json)
                print_json(ls, &page.locks[i]);
            else
                print_row(ls, &page.locks[i]);
        }
        ls->count += page.n;
        fflush(stdout);
        if (page.next && cursor && !strcmp(page.next, cursor)) {
            cli_err("list: %s gave the same cursor twice; stopping",
                    dlock_client_store(ls->c));
            dlock_list_clear(&page);
            free(cursor);
            return CLI_EX_UNAVAILABLE;
        }
        free(cursor);
        cursor = NULL;
        if (page.next && !(cursor = strdup(page.next))) {
            dlock_list_clear(&page);
            cli_err("out of memory");
            return CLI_EX_SOFTWARE;
        }
        dlock_list_clear(&page);
    } while (cursor && ++pages < MAX_PAGES);
    if (cursor) {
        free(cursor);
        cli_err("list: %s did not end the listing after %d pages",
                dlock_client_store(ls->c), MAX_PAGES);
        return CLI_EX_UNAVAILABLE;
    }
    return 0;
}

int cmd_list(int argc, char **argv)
{
    const char *store = NULL, *prefix = NULL, *limit_s = NULL;
    unsigned flags = 0;
    size_t limit = 0;
    lister ls = {0};
    int rc, r;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(list_usage, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json")) {
            ls.json = 1;
            continue;
        }
        if (!strcmp(argv[i], "--all")) {
            flags |= DLOCK_LIST_FREE;
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--store", &store)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--prefix", &prefix)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--limit", &limit_s)) != 0) {
            if (r < 0)
                return CLI_EX_USAGE;
            continue;
        }
        cli_err("list: unknown argument '%s' (try dlock help list)",
                argv[i]);
        return CLI_EX_USAGE;
    }
    if (prefix && strlen(prefix) > DLOCK_NAME_MAX) {
        cli_err("list: the prefix is longer than a lock name may be (%d "
                "bytes)",
                DLOCK_NAME_MAX);
        return CLI_EX_USAGE;
    }
    if (limit_s) {
        char *end;
        unsigned long v;

        errno = 0;
        v = strtoul(limit_s, &end, 10);
        if (limit_s[0] < '0' || limit_s[0] > '9' || *end || errno ||
            v < 1 || v > 10000) {
            cli_err("list: --limit wants a number from 1 to 10000, not '%s'",
                    limit_s);
            return CLI_EX_USAGE;
        }
        limit = v;
    }

    rc = dlock_client_open(&ls.c, store, NULL);
    if (rc != DLOCK_OK) {
        cli_err("%s", dlock_errmsg());
        return cli_exit_for(rc);
    }
    r = walk(&ls, prefix, limit, flags);
    if (r == 0 && !ls.json && ls.count == 0)
        printf("no locks%s%s\n",
               flags & DLOCK_LIST_FREE ? "" : " held or waited for",
               prefix && *prefix ? " with that prefix" : "");
    dlock_client_close(ls.c);
    return r;
}
