/* SPDX-License-Identifier: MIT */
/*
 * exporter_main.c -- the exporter program, dlock-exporter: `dlock exporter
 * --listen ADDR:PORT [--store URI]... [--prefix P] [--all] [--timeout
 * DUR]` runs it (cmd_exporter.c, by exec: the same process, argv as
 * given). The locks of one or more stores as Prometheus metrics, over
 * HTTP (GET /metrics). The command: options, start, stop.
 *
 * A program of its own so that dlock's other commands map neither
 * libmicrohttpd nor libyaml, libcrypt and GnuTLS (docs/cli.md, "The
 * exporter program"). Built only with libmicrohttpd (DLOCK_CLI_HAVE_MHD);
 * without it, `dlock exporter` says which package it needs.
 *
 * What a listing does (exporter_metrics.c): for each store, in the order
 * given, it walks dlock_list() page by page on the client opened for that
 * store at start (the library reconnects it after an outage), and writes
 * one series per lock and family, then the exporter's own health per
 * store.
 *
 * One listing serves every scraper (exporter_cache.c): the answer is kept
 * --cache-ttl (5 s) from the listing's start, and the scrapes that arrive
 * while a listing runs wait for that one (their connections suspended, no
 * thread held) and get its answer. Listings run on a thread of their own,
 * so that no libmicrohttpd thread ever waits on a store; the answer is one
 * reference-counted buffer that every connection reads from.
 *
 * HTTP is libmicrohttpd's (exporter_http.c): a few of its threads each
 * poll their share of the connections with epoll, so idle or slow
 * connections cost a descriptor and a bounded memory pool each, never a
 * thread. Connections are bounded in number (total and per client
 * address), in memory, and in time (closed after --http-timeout without
 * progress, an answer cut after 60 s). --web.config.file adds TLS, client
 * certificates and basic auth (web_config.c). The main thread only waits
 * for SIGTERM or SIGINT (sigwait), then stops the listing thread and the
 * daemon, and closes the clients.
 */
#include "cli.h"
#include "exporter.h"

#include <dlock.h>

#include <errno.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Splits "host:port", "[v6]:port" or ":port" into host (may be "") and
 * port, in buf. Returns 0, or -1 after a message. */
static int split_listen(const char *s, char *buf, size_t cap,
                        const char **host, const char **port)
{
    char *colon, *end;
    unsigned long p;

    if (strlen(s) >= cap) {
        cli_err("exporter: --listen '%s' is too long", s);
        return -1;
    }
    strcpy(buf, s);
    if (buf[0] == '[') {
        char *close = strchr(buf, ']');
        if (!close || close[1] != ':') {
            cli_err("exporter: --listen wants [ADDRESS]:PORT for IPv6, "
                    "not '%s'",
                    s);
            return -1;
        }
        *close = '\0';
        *host = buf + 1;
        colon = close + 1;
    } else {
        colon = strrchr(buf, ':');
        if (!colon || strchr(buf, ':') != colon) {
            cli_err("exporter: --listen wants ADDRESS:PORT (e.g. "
                    "127.0.0.1:9464, [::1]:9464, :9464), not '%s'",
                    s);
            return -1;
        }
        *colon = '\0';
        *host = buf;
    }
    *port = colon + 1;
    errno = 0;
    p = strtoul(*port, &end, 10);
    if (**port < '0' || **port > '9' || *end || errno || p > 65535) {
        cli_err("exporter: --listen: the port must be a number from 0 to "
                "65535, not '%s'",
                *port);
        return -1;
    }
    return 0;
}

static void close_stores(exporter *ex)
{
    for (size_t i = 0; i < ex->n; i++) {
        dlock_client_close(ex->stores[i].c);
        free(ex->stores[i].label);
    }
    free(ex->stores);
}

/* A count option from lo to hi; 0, or -1 after a message. */
static int count_opt(const char *name, const char *v, unsigned long lo,
                     unsigned long hi, unsigned *out)
{
    char *end;
    unsigned long n;

    errno = 0;
    n = strtoul(v, &end, 10);
    if (v[0] < '0' || v[0] > '9' || *end || errno || n < lo || n > hi) {
        cli_err("exporter: %s wants a number from %lu to %lu, not '%s'",
                name, lo, hi, v);
        return -1;
    }
    *out = (unsigned)n;
    return 0;
}

int main(int argc, char **argv)
{
    const char *listen = NULL, *timeout = NULL, *page = NULL, *v, *host,
               *port, *webcfg = NULL, *ttl = NULL, *idle = NULL,
               *cmax = NULL, *cip = NULL;
    const char **uris;
    size_t nuris = 0;
    dlock_client_options copts = {0};
    exporter ex = {0};
    struct MHD_Daemon *d;
    const union MHD_DaemonInfo *info;
    char lbuf[300];
    sigset_t stop;
    pthread_t lister_tid;
    int64_t ms;
    int r, sig = 0, dual = 0, rc = CLI_EX_USAGE;

    /* every --store, in order (at most argc of them) */
    uris = calloc((size_t)argc, sizeof(*uris));
    if (!uris) {
        cli_err("out of memory");
        return CLI_EX_SOFTWARE;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(cli_exporter_usage, stdout);
            free(uris);
            return 0;
        }
        if (!strcmp(argv[i], "--all")) {
            ex.flags |= DLOCK_LIST_FREE;
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--store", &v)) != 0) {
            if (r < 0)
                goto usage;
            uris[nuris++] = v;
            continue;
        }
        if ((r = cli_opt_value(argc, argv, &i, "--listen", &listen)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--web.listen-address",
                               &listen)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--prefix", &ex.prefix)) !=
                0 ||
            (r = cli_opt_value(argc, argv, &i, "--timeout", &timeout)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--page", &page)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--web.config.file",
                               &webcfg)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--cache-ttl", &ttl)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--http-timeout", &idle)) !=
                0 ||
            (r = cli_opt_value(argc, argv, &i, "--max-connections-per-ip",
                               &cip)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--max-connections",
                               &cmax)) != 0) {
            if (r < 0)
                goto usage;
            continue;
        }
        cli_err("exporter: unknown argument '%s' (try dlock help exporter)",
                argv[i]);
        goto usage;
    }
    if (!listen) {
        cli_err("exporter: --listen ADDR:PORT is required (e.g. "
                "--listen 127.0.0.1:9464)");
        goto usage;
    }
    if (split_listen(listen, lbuf, sizeof(lbuf), &host, &port) != 0)
        goto usage;
    if (timeout && (cli_parse_duration(timeout, &copts.timeout_ms, 0) != 0 ||
                    copts.timeout_ms <= 0)) {
        cli_err("exporter: --timeout wants a duration such as 500ms or 2s, "
                "not '%s'",
                timeout);
        goto usage;
    }
    ex.ttl_us = (int64_t)CACHE_TTL_MS * 1000;
    if (ttl) {
        if (cli_parse_duration(ttl, &ms, 0) != 0 || ms < 0 ||
            ms > 86400000) {
            cli_err("exporter: --cache-ttl wants a duration from 0 to 24h "
                    "such as 5s, not '%s'",
                    ttl);
            goto usage;
        }
        ex.ttl_us = ms * 1000;
    }
    ex.idle_s = HTTP_IDLE_S;
    if (idle) {
        if (cli_parse_duration(idle, &ms, 0) != 0 || ms < 1000 ||
            ms > 3600000 || ms % 1000) {
            cli_err("exporter: --http-timeout wants whole seconds from 1s "
                    "to 1h, not '%s'",
                    idle);
            goto usage;
        }
        ex.idle_s = (unsigned)(ms / 1000);
    }
    ex.conn_max = HTTP_CONN_MAX;
    ex.conn_per_ip = HTTP_CONN_PER_IP;
    if ((cmax && count_opt("--max-connections", cmax, HTTP_THREADS, 65536,
                           &ex.conn_max) != 0) ||
        (cip && count_opt("--max-connections-per-ip", cip, 1, 65536,
                          &ex.conn_per_ip) != 0))
        goto usage;
    if (ex.conn_per_ip > ex.conn_max)
        ex.conn_per_ip = ex.conn_max;
    ex.page = PAGE_LIMIT;
    if (page) {
        unsigned pv;

        if (count_opt("--page", page, 1, 10000, &pv) != 0)
            goto usage;
        ex.page = pv;
    }
    if (ex.prefix && strlen(ex.prefix) > DLOCK_NAME_MAX) {
        cli_err("exporter: the prefix is longer than a lock name may be "
                "(%d bytes)",
                DLOCK_NAME_MAX);
        goto usage;
    }
    if (webcfg && web_config_load(webcfg, &ex.web) != 0)
        goto usage;
    if (nuris == 0)
        uris[nuris++] = NULL; /* $DLOCK_STORE, else the file store */

    /* SIGTERM and SIGINT are blocked in every thread (the clients', the
     * lister's and libmicrohttpd's inherit the mask), so only sigwait()
     * below takes them; a write to a scraper that went away must not kill
     * us */
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    ex.stores = calloc(nuris, sizeof(*ex.stores));
    if (!ex.stores) {
        cli_err("out of memory");
        rc = CLI_EX_SOFTWARE;
        goto usage;
    }
    for (size_t i = 0; i < nuris; i++) {
        xstore *s = &ex.stores[i];
        int orc = dlock_client_open(&s->c, uris[i], &copts);

        if (orc != DLOCK_OK) {
            cli_err("%s", dlock_errmsg());
            rc = cli_exit_for(orc) == CLI_EX_USAGE ? CLI_EX_USAGE
                                                   : CLI_EX_UNAVAILABLE;
            goto out_stores;
        }
        ex.n = i + 1;
        s->uri = dlock_client_store(s->c);
        if (!(s->label = exporter_store_label(s->uri))) {
            cli_err("out of memory");
            rc = CLI_EX_SOFTWARE;
            goto out_stores;
        }
        atomic_init(&s->errors, 0);
        atomic_init(&s->listings, 0);
        atomic_init(&s->up, -1);
        for (size_t j = 0; j < i; j++) {
            if (!strcmp(ex.stores[j].uri, s->uri)) {
                cli_err("exporter: store %s is given twice", s->uri);
                goto out_stores;
            }
            if (!strcmp(ex.stores[j].label, s->label)) {
                cli_err("exporter: stores %s and %s would share the label "
                        "store=\"%s\" (it keeps only the parameters "
                        "prefix, table, db, mode, private and host)",
                        ex.stores[j].uri, s->uri, s->label);
                goto out_stores;
            }
        }
    }
    free(uris);
    uris = NULL;

    pthread_mutex_init(&ex.mu, NULL);
    pthread_mutex_init(&ex.logmu, NULL);
    ex.answered = exporter_resume_waiters;
    pthread_cond_init(&ex.cv, NULL);
    if (pthread_create(&lister_tid, NULL, exporter_lister, &ex) != 0) {
        cli_err("exporter: cannot start a thread");
        rc = CLI_EX_SOFTWARE;
        goto out_sync;
    }
    d = exporter_http_start(&ex, host, port, &dual);
    if (!d) {
        rc = CLI_EX_UNAVAILABLE;
        goto out_lister;
    }
    info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    if (!*host) /* every address: IPv6 and IPv4, or IPv4 alone */
        host = dual ? "::" : "0.0.0.0";
    printf("dlock exporter: listening on %s://%s%s%s:%u/metrics\n",
           ex.web.cert_pem ? "https" : "http", strchr(host, ':') ? "[" : "",
           host, strchr(host, ':') ? "]" : "",
           info ? (unsigned)info->port : 0u);
    for (size_t i = 0; i < ex.n; i++)
        printf("dlock exporter: store %s\n", ex.stores[i].uri);
    fflush(stdout);

    if (sigwait(&stop, &sig) != 0) /* only EINVAL: a bad set, not here */
        cli_err("exporter: sigwait failed; stopping");
    fprintf(stderr, "dlock exporter: %s: stopping\n",
            sig == SIGINT ? "SIGINT" : "SIGTERM");
    rc = 0;
    /* the lister first: it ends its listing (bounded by its deadline) and
     * resumes every waiting scrape, so that none is left suspended when
     * libmicrohttpd stops (running requests finish first) */
out_lister:
    pthread_mutex_lock(&ex.mu);
    ex.stopping = 1;
    pthread_cond_signal(&ex.cv);
    pthread_mutex_unlock(&ex.mu);
    pthread_join(lister_tid, NULL);
    if (d)
        MHD_stop_daemon(d);
out_sync:
    exporter_body_unref(ex.cur);
    pthread_cond_destroy(&ex.cv);
    pthread_mutex_destroy(&ex.mu);
    pthread_mutex_destroy(&ex.logmu);
out_stores:
    close_stores(&ex);
usage:
    free(uris);
    web_config_free(&ex.web);
    return rc;
}
