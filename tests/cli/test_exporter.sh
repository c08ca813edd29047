#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test_exporter.sh -- `dlock exporter` through the real binary, read by
# curl, promtool and a real Prometheus server.
#
#   bash test_exporter.sh /path/to/dlock file|redis|rediss
#
# Holds a few locks with `dlock run` (one name with a double quote, a
# backslash and a newline; one that is not UTF-8; a read-held one), starts
# the exporter on a free port, then:
#   - GET /metrics with curl: status, Content-Type, `promtool check
#     metrics`, every series and label value read back by a parser of the
#     text format (python3); /, a 404 and a 405; eight scrapes at once;
#   - a private Prometheus (Debian's prometheus package) scraping it every
#     second: the series of its HTTP API, labels byte-exact;
#   - a store that fails (Redis killed: the store under test, or on
#     file:// a second store beside it): dlock_exporter_up 0 for it alone,
#     its error counter, no partial listing, a line on stderr;
#   - SIGTERM: exit 0. With DLOCK_TEST_PREFIX (e.g. a valgrind command
#     line), the exporter runs under it, and its exit status says whether
#     it leaked.
# A dlock built without libmicrohttpd must refuse with exit 69 and name
# the package (the rest is then skipped). Every wait is bounded.
# Exit: 0 passed, 1 a failure, 77 skipped (tools missing).

set -u

# shellcheck source-path=SCRIPTDIR source=report_lib.sh
. "$(dirname "$0")/report_lib.sh"
store_args test_exporter.sh "file|redis|rediss" "$@"
for tool in curl promtool prometheus python3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "SKIP: $tool is not in PATH (scripts/install-deps.sh test: the" \
            "prometheus and curl packages)"
        exit 77
    fi
done

# shellcheck source-path=SCRIPTDIR source=ops_lib.sh
. "$(dirname "$0")/ops_lib.sh"
# shellcheck source-path=SCRIPTDIR source=exporter_lib.sh
. "$(dirname "$0")/exporter_lib.sh"

# lock_label(b), for the checks in python below (PYTHONPATH=$TMP): the
# label the exporter gives a name, UTF-8 as is, stray bytes as \xNN
cat >"$TMP/exporter_labels.py" <<'EOF'
def lock_label(b):
    out = ""
    while b:
        for n in (4, 3, 2, 1):
            try:
                out += b[:n].decode("utf-8"); b = b[n:]; break
            except UnicodeDecodeError:
                pass
        else:
            out += "\\x%02x" % b[0]; b = b[1:]
    return out
EOF

# --------------------------------------------------------------------------
# Usage errors
# --------------------------------------------------------------------------

expect_rc 0 "help exporter" -- help exporter
dl exporter
if [ "$RC" -eq 69 ] && grep -q "libmicrohttpd" "$TMP/err"; then
    pass "a dlock built without libmicrohttpd says so and names the package (exit 69)"
    skip "this dlock was built without libmicrohttpd: $(cat "$TMP/err")"
    finish
fi
expect_rc 64 "exporter without --listen" -- exporter
expect_rc 64 "exporter --listen without a port" -- exporter --listen 127.0.0.1
expect_rc 64 "exporter --listen with a bad port" -- exporter --listen 127.0.0.1:99999
expect_rc 64 "exporter --listen [v6 without its bracket" -- exporter --listen '[::1:80'
expect_rc 64 "exporter --timeout junk" -- exporter --listen 127.0.0.1:0 --timeout soon
expect_rc 64 "exporter with an unknown option" -- exporter --listen 127.0.0.1:0 --frob

# --------------------------------------------------------------------------
# The exporter program: `dlock exporter` runs it by exec, from where
# dlock's build or install put it, never from PATH (docs/cli.md, "The
# exporter program"); once, on the file store
# --------------------------------------------------------------------------

# fake_exporter PATH: a program at PATH that writes its arguments, one a
# line, to PATH.args and exits 7
fake_exporter() {
    mkdir -p "$(dirname "$1")"
    cat >"$1" <<'EOF'
#!/bin/sh
printf '%s\n' "$@" >"$0.args"
exit 7
EOF
    chmod 755 "$1"
}

if [ "$KIND" = file ]; then
    fake_exporter "$TMP/path/dlock-exporter"
    PATH="$TMP/path:$PATH" "${BOUND[@]}" "$DLOCK" exporter --help \
        >"$TMP/out" 2>"$TMP/err" </dev/null
    RC=$?
    if [ "$RC" = 0 ] && [ ! -e "$TMP/path/dlock-exporter.args" ] &&
        grep -q -- "--listen ADDR:PORT" "$TMP/out"; then
        pass "a dlock-exporter first on PATH is not the one run"
    else
        fail "dlock exporter --help with a dlock-exporter on PATH: exit $RC"
        show "$TMP/out" "$TMP/err"
    fi

    # a copy of dlock outside its build tree looks where an install puts
    # the program (libexecdir/dlock from bindir), not beside itself
    mkdir -p "$TMP/inst/bin"
    cp "$DLOCK" "$TMP/inst/bin/dlock"
    fake_exporter "$TMP/inst/bin/dlock-exporter"
    "${BOUND[@]}" "$TMP/inst/bin/dlock" exporter --listen 127.0.0.1:0 \
        >"$TMP/out" 2>"$TMP/err" </dev/null
    RC=$?
    want=$(sed -n 's/^dlock: exporter: cannot run the exporter program \(.*\): No such file or directory .*/\1/p' "$TMP/err")
    if [ "$RC" = 69 ] && [ -n "$want" ] && [ ! -e "$TMP/inst/bin/dlock-exporter.args" ]; then
        pass "without its exporter program dlock says where it looked (exit 69)"
    else
        fail "a dlock without its exporter program: exit $RC"
        show "$TMP/out" "$TMP/err"
    fi
    "${BOUND[@]}" "$TMP/inst/bin/dlock" exporter --help >"$TMP/out" 2>"$TMP/err" </dev/null
    RC=$?
    if [ "$RC" = 0 ] && grep -q -- "--listen ADDR:PORT" "$TMP/out"; then
        pass "without its exporter program, exporter --help prints the usage"
    else
        fail "without its exporter program, exporter --help: exit $RC"
        show "$TMP/out" "$TMP/err"
    fi
    want=$(realpath -m "$want")
    case $want in
    "$TMP"/inst/*)
        # the program there gets the arguments as given: a password in
        # --store too, which it hides itself (cli_opt_value)
        fake_exporter "$want"
        uri='redis://u:Pw0rd@127.0.0.1:1/0'
        "${BOUND[@]}" "$TMP/inst/bin/dlock" exporter --listen 127.0.0.1:0 \
            --store "$uri" 'two words' >"$TMP/out" 2>"$TMP/err" </dev/null
        RC=$?
        printf '%s\n' --listen 127.0.0.1:0 --store "$uri" 'two words' >"$TMP/args.want"
        if [ "$RC" = 7 ] && cmp -s "$TMP/args.want" "$want.args"; then
            pass "dlock runs ${want#"$TMP"/inst/} with the arguments as given, its exit status passed on"
        else
            fail "the installed layout's exporter program: exit $RC"
            show "$TMP/out" "$TMP/err" "$want.args"
        fi
        ;;
    *)
        skip "the exporter program's installed path leaves the prefix: $want"
        ;;
    esac
fi

# --------------------------------------------------------------------------
# The store, the locks, the exporter
# --------------------------------------------------------------------------

use_store

N_A=exp/alpha
N_W=$'exp/we"ird\\na\nme'   # quote, backslash, newline
N_X=$'exp/bin\xff\xfe'      # not UTF-8
N_S=exp/shared              # two read holds

EXTRA=()
if [ "$KIND" = file ]; then
    # a second store, to fail while the exporter runs: a private Redis,
    # killed below
    start_redis
    EXTRA=(--store "redis://127.0.0.1:$REDIS_PORT/0?prefix=other:")
fi

# label_of URI: the store label the exporter gives URI: no user or
# password, and of the query only prefix, table, db, mode, private, host
label_of() {
    python3 -c '
import sys
u = sys.argv[1]
base, _, q = u.partition("?")
scheme, sep, rest = base.partition("://")
if sep:
    auth, slash, path = rest.partition("/")
    base = scheme + sep + auth.rpartition("@")[2] + slash + path
keep = [p for p in q.split("&") if p and p.split("=")[0] in
        ("prefix", "table", "db", "mode", "private", "host")]
print(base + ("?" + "&".join(keep) if keep else ""))' "$1"
}
DLOCK_LABEL=$(label_of "$DLOCK_STORE")

# --cache-ttl 0: every scrape after a listing ended gets a new one (the
# cases below change the store between scrapes)
if ! start_exporter "$TMP/exp" --store "$DLOCK_STORE" "${EXTRA[@]}" --cache-ttl 0; then
    fail "the exporter did not start (exit $WRC)"
    show "$TMP/exp.out" "$TMP/exp.err"
    finish
fi
pass "the exporter listens on 127.0.0.1:$EXP_PORT (port 0: a free one)"

# can this store list its locks? (Redis cannot before its list slot lands)
dl list
LIST_OK=1
if [ "$RC" -eq 69 ] && grep -q "cannot list its locks" "$TMP/err"; then
    LIST_OK=0
    scrape "$TMP/m0"
    if [ "$CODE" = 200 ] &&
        grep -qF "dlock_exporter_up{store=\"$DLOCK_LABEL\"} 0" "$TMP/m0" &&
        grep -qF "dlock_exporter_scrape_errors_total{store=\"$DLOCK_LABEL\"} 1" "$TMP/m0" &&
        promtool check metrics <"$TMP/m0" >/dev/null 2>&1; then
        pass "a store that cannot list: dlock_exporter_up 0, one error counted, still valid metrics"
    else
        fail "a store that cannot list: unexpected scrape (HTTP $CODE)"
        show "$TMP/m0"
    fi
    skip "$KIND: the store answers DLOCK_ENOTSUP to list: $(head -c 300 "$TMP/err")"
fi

if [ "$LIST_OK" = 1 ]; then
    hold a "$N_A"
    hold w "$N_W"
    hold x "$N_X"
    hold s1 "$N_S" --shared
    hold s2 "$N_S" --shared
    for spec in "$N_A:1" "$N_W:1" "$N_X:1" "$N_S:2"; do
        if ! wait_holders "${spec%:*}" "${spec##*:}"; then
            fail "setup: '${spec%:*}' did not get ${spec##*:} holds within 10 s"
            show "$TMP"/hold.*.err
            finish
        fi
    done
    TOKEN_A=$("$DLOCK" status --json "$N_A" | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
    STORE_LABEL=$(label_of "$("$DLOCK" list --json --prefix "$N_A" | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["store"])')")
fi

# --------------------------------------------------------------------------
# GET /metrics, read by promtool and by a parser of the text format
# --------------------------------------------------------------------------

# check_metrics FILE: the exposition in FILE, parsed line by line; every
# lock's series and labels as held (names byte-exact). Prints nothing when
# right, else why.
check_metrics() {
    PYTHONPATH=$TMP python3 - "$1" "$STORE_LABEL" "$TOKEN_A" "$KIND" "$N_A" \
        "$N_W" "$N_X" "$N_S" <<'EOF'
import os, re, sys
path, store, token_a, kind = sys.argv[1:5]
n_a, n_w, n_x, n_s = (os.fsencode(a) for a in sys.argv[5:9])
text = open(path, "rb").read().decode("utf-8")   # must be UTF-8
series, types = {}, {}
lab = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
for line in text.split("\n"):
    if not line:
        continue
    if line.startswith("# TYPE "):
        _, _, fam, typ = line.split(" ", 3)
        assert fam not in types, ("family twice", fam)
        types[fam] = typ
        continue
    if line.startswith("#"):
        continue
    m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+)', line)
    assert m, ("bad line", line)
    name, body, value = m.groups()
    labels, pos = {}, 0
    while pos < len(body):
        lm = lab.match(body, pos)
        assert lm, ("bad labels", body)
        v = re.sub(r'\\(.)', lambda e: {"n": "\n", "\\": "\\", '"': '"'}[e.group(1)], lm.group(2))
        labels[lm.group(1)] = v
        pos = lm.end() + (1 if body[lm.end():lm.end() + 1] == "," else 0)
    assert name in types, ("series before its TYPE", name)
    key = (name, labels.get("lock"), labels["store"])
    assert key not in series, ("series twice", key)
    series[key] = (labels, float(value))
# the store under test (another store may be listed beside it)
series = {k[:2]: v for k, v in series.items() if k[2] == store}
from exporter_labels import lock_label
want = {n_a: 1, n_w: 1, n_x: 1, n_s: 2}
for nb, holders in want.items():
    lk = lock_label(nb)
    for fam in ("dlock_lock_held", "dlock_lock_holders", "dlock_lock_token",
                "dlock_lock_waiters"):
        assert (fam, lk) in series, ("missing", fam, lk)
        labels, v = series[(fam, lk)]
        assert labels["store"] == store, (labels, store)
        if nb == n_x:
            assert labels.get("lock_hex") == nb.hex(), labels
        else:
            assert "lock_hex" not in labels, labels
    assert series[("dlock_lock_held", lk)][1] == 1, lk
    assert series[("dlock_lock_holders", lk)][1] == holders, lk
    if nb != n_s:
        assert ("dlock_lock_hold_age_seconds", lk) in series, lk
    if kind == "redis":
        assert series[("dlock_lock_lease_seconds", lk)][1] > 0, lk
assert series[("dlock_lock_token", lock_label(n_a))][1] == float(token_a)
locks = [k for k in series if k[0] == "dlock_lock_held"]
assert len(locks) == 4, locks
assert series[("dlock_exporter_up", None)][1] == 1
assert series[("dlock_exporter_locks", None)][1] == 4
assert ("dlock_exporter_scrape_duration_seconds", None) in series
assert types["dlock_exporter_scrape_errors_total"] == "counter"
assert types["dlock_lock_held"] == "gauge"
EOF
}

if [ "$LIST_OK" = 1 ]; then
    scrape "$TMP/m1"
    if [ "$CODE" = 200 ]; then
        pass "GET /metrics: 200"
    else
        fail "GET /metrics: HTTP $CODE"
        show "$TMP/m1.err" "$TMP/exp.err"
    fi
    if grep -qix 'content-type: text/plain; version=0.0.4; charset=utf-8'$'\r' "$TMP/m1.h"; then
        pass "Content-Type: text/plain; version=0.0.4; charset=utf-8"
    else
        fail "wrong Content-Type"
        show "$TMP/m1.h"
    fi
    if promtool check metrics <"$TMP/m1" >"$TMP/promtool.out" 2>&1; then
        pass "promtool check metrics accepts the exposition"
    else
        fail "promtool check metrics: $(cat "$TMP/promtool.out")"
        show "$TMP/m1"
    fi
    if check_metrics "$TMP/m1" 2>"$TMP/py.err"; then
        pass "every lock's series with byte-exact lock labels (quote, backslash, newline; \\xNN and lock_hex for bytes that are not UTF-8), holders, token, store label redacted"
    else
        fail "the exposition: $(tail -n 1 "$TMP/py.err")"
        show "$TMP/m1"
    fi

    # several scrapers at once (several Prometheus servers): each gets a
    # whole, valid answer
    par=()
    for i in 1 2 3 4 5 6 7 8; do
        (scrape "$TMP/par$i" && echo "$CODE" >"$TMP/par$i.code") &
        par+=($!)
    done
    wait_ok=1
    # each curl is bounded by --max-time: the jobs end
    for p in "${par[@]}"; do
        wait "$p"
    done
    for i in 1 2 3 4 5 6 7 8; do
        if [ "$(cat "$TMP/par$i.code" 2>/dev/null)" != 200 ] ||
            ! check_metrics "$TMP/par$i" 2>"$TMP/py.err"; then
            wait_ok=0
            fail "concurrent scrape $i: HTTP $(cat "$TMP/par$i.code" 2>/dev/null) $(tail -n 1 "$TMP/py.err")"
        fi
    done
    if [ "$wait_ok" = 1 ]; then
        pass "8 scrapes at once: each whole and valid"
    fi
fi

# Prometheus' scrape timeout: a scrape that cannot finish within it
# reports the store down rather than answering too late (a timeout of 1 us
# has passed before the first page)
if [ "$LIST_OK" = 1 ]; then
    scrape "$TMP/m_to" -H 'X-Prometheus-Scrape-Timeout-Seconds: 0.000001'
    if [ "$CODE" = 200 ] &&
        grep -qF "dlock_exporter_up{store=\"$STORE_LABEL\"} 0" "$TMP/m_to" &&
        ! grep -qF "dlock_lock_held{store=\"$STORE_LABEL\"" "$TMP/m_to" &&
        grep -q "scrape timeout is near" "$TMP/exp.err"; then
        pass "past Prometheus' scrape timeout: the store is reported down for that scrape, and logged"
    else
        fail "the scrape timeout header: HTTP $CODE"
        show "$TMP/m_to" "$TMP/exp.err"
    fi
    scrape "$TMP/m_after"
    if grep -qF "dlock_exporter_up{store=\"$STORE_LABEL\"} 1" "$TMP/m_after" &&
        grep -q "listing works again" "$TMP/exp.err"; then
        pass "the next scrape lists the store again (and says so once)"
    else
        fail "the scrape after the timed-out one"
        show "$TMP/m_after" "$TMP/exp.err"
    fi
fi

# the other paths
get "$TMP/index" "http://127.0.0.1:$EXP_PORT/"
if [ "$CODE" = 200 ] && grep -q 'href="/metrics"' "$TMP/index"; then
    pass "GET /: a page pointing at /metrics"
else
    fail "GET /: HTTP $CODE"
fi
get "$TMP/notfound" "http://127.0.0.1:$EXP_PORT/metricsx"
if [ "$CODE" = 404 ]; then
    pass "GET /metricsx: 404"
else
    fail "GET /metricsx: HTTP $CODE, expected 404"
fi
scrape "$TMP/post" -X POST -d x=1
if [ "$CODE" = 405 ]; then
    pass "POST /metrics: 405"
else
    fail "POST /metrics: HTTP $CODE, expected 405"
fi
scrape "$TMP/head" -I
if [ "$CODE" = 200 ]; then
    pass "HEAD /metrics: 200"
else
    fail "HEAD /metrics: HTTP $CODE"
fi

# --------------------------------------------------------------------------
# A real Prometheus
# --------------------------------------------------------------------------

# every second: the test waits for a few scrapes, not for minutes
if [ "$LIST_OK" = 1 ] && start_prometheus <<EOF; then
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: dlock
    static_configs:
      - targets: ['127.0.0.1:$EXP_PORT']
EOF
    pass "prometheus ready on 127.0.0.1:$PROM_PORT, scraping every second"
    # the first scrape comes within one interval of the start (1 s) and
    # the query sees it at once; 30 s (times SLOW) for a busy machine
    if wait_prom 'count(dlock_lock_held)' 4; then
        pass "prometheus has the 4 locks' dlock_lock_held series"
    else
        fail "prometheus did not get the 4 dlock_lock_held series within 30 s"
        prom 'dlock_lock_held' >"$TMP/prom.answer"
        show "$TMP/prom.answer" "$TMP/prom/log"
    fi
    prom 'dlock_lock_held' >"$TMP/prom.held"
    prom 'dlock_lock_holders' >"$TMP/prom.holders"
    prom 'dlock_exporter_up' >"$TMP/prom.up"
    if PYTHONPATH=$TMP python3 - "$TMP/prom.held" "$TMP/prom.holders" "$TMP/prom.up" \
        "$STORE_LABEL" "$N_A" "$N_W" "$N_X" "$N_S" 2>"$TMP/py.err" <<'EOF'; then
import json, os, sys
held, holders, up = (json.load(open(p))["data"]["result"] for p in sys.argv[1:4])
store = sys.argv[4]
names = [os.fsencode(a) for a in sys.argv[5:9]]
from exporter_labels import lock_label
got = {r["metric"]["lock"]: r for r in held}
assert sorted(got) == sorted(lock_label(n) for n in names), sorted(got)
assert got['exp/we"ird\\na\nme']["value"][1] == "1"     # intact
x = got[lock_label(names[2])]["metric"]
assert x["lock_hex"] == names[2].hex(), x
for r in held:
    assert r["metric"]["store"] == store and r["metric"]["job"] == "dlock", r
    assert r["value"][1] == "1", r
h = {r["metric"]["lock"]: r["value"][1] for r in holders}
assert h["exp/shared"] == "2" and h["exp/alpha"] == "1", h
assert [r["value"][1] for r in up if r["metric"]["store"] == store] == ["1"], up
EOF
        pass "prometheus' series: lock labels intact (quote, backslash, newline), lock_hex, store redacted, holders 2 for the read-held lock, dlock_exporter_up 1"
    else
        fail "prometheus' series: $(tail -n 1 "$TMP/py.err")"
        show "$TMP/prom.held" "$TMP/prom.up"
    fi
    # a lock released: its series leaves the exporter at the next scrape
    kill -TERM "${BG_PIDS[0]}" 2>/dev/null
    wait_exit "${BG_PIDS[0]}" 10
    if wait_prom 'count(dlock_lock_held)' 3; then
        pass "a released lock's series goes stale in prometheus"
    else
        fail "the released lock's series stayed within 30 s"
    fi
    stop_prometheus
fi

# --------------------------------------------------------------------------
# A store that fails: down for it alone, counted, logged
# --------------------------------------------------------------------------

# the Redis store (the one under test, or the second one beside file://)
{
    kill -KILL "$REDIS_PID"
    wait "$REDIS_PID"
} 2>/dev/null
REDIS_PID=
FAILED_RE='^dlock_exporter_up{store="rediss\{0,1\}://[^"]*"} 0$'
ERRS_RE='^dlock_exporter_scrape_errors_total{store="rediss\{0,1\}://[^"]*"} [1-9]'
# one scrape: a dead Redis refuses the connection at once; the library
# gives up after its store timeout (2 s) at worst
scrape "$TMP/m2"
if [ "$CODE" = 200 ] && grep -q "$FAILED_RE" "$TMP/m2" &&
    grep -q "$ERRS_RE" "$TMP/m2" &&
    ! grep -q '^dlock_lock_[a-z_]*{store="rediss\{0,1\}://' "$TMP/m2" &&
    promtool check metrics <"$TMP/m2" >/dev/null 2>&1; then
    pass "a failing store: dlock_exporter_up 0, its error counted, no partial listing, still valid metrics"
else
    fail "a failing store: HTTP $CODE, unexpected scrape"
    show "$TMP/m2"
fi
if [ "$KIND" = file ] && [ "$LIST_OK" = 1 ]; then
    if grep -qF "dlock_exporter_up{store=\"$DLOCK_LABEL\"} 1" "$TMP/m2" &&
        grep -qF "dlock_lock_held{store=\"$DLOCK_LABEL\"" "$TMP/m2"; then
        pass "the other store is still up and listed"
    else
        fail "the healthy store is not up beside the failed one"
        show "$TMP/m2"
    fi
fi
if grep -q "listing failed" "$TMP/exp.err"; then
    pass "the exporter logs the failure on stderr"
else
    fail "no 'listing failed' line on the exporter's stderr"
    show "$TMP/exp.err"
fi

# --------------------------------------------------------------------------
# SIGTERM: a clean stop (under valgrind: no leak, no error)
# --------------------------------------------------------------------------

if stop_exporter "the exporter" "$TMP/exp"; then
    pass "SIGTERM: the exporter exits 0${PREFIX:+ (under ${PREFIX[0]}: no leak, no error)}"
fi

finish
