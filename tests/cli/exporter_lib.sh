# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# shellcheck disable=SC2317,SC2034
# (SC2317: exporter_cleanup runs from ops_lib.sh's EXIT trap; SC2034:
# SLOW, PROM_PORT and the like are read by the sourcing script.)
#
# exporter_lib.sh -- what the exporter tests share (test_exporter.sh,
# test_exporter_web.sh): `dlock exporter` started on a free port (under
# DLOCK_TEST_PREFIX, e.g. valgrind) and stopped by SIGTERM, GET with curl,
# a private Prometheus server and its query API.
#
# Sourced after ops_lib.sh (TMP, DLOCK, fail/show, free_port, wait_exit).
# Every wait is bounded; each bound says what it covers.

# DLOCK_TEST_PREFIX: a command line to run the exporters under (valgrind)
read -r -a PREFIX <<<"${DLOCK_TEST_PREFIX:-}"
# `dlock exporter` becomes the exporter program by exec: valgrind follows
# it there only when told to (else the exporter would run unchecked)
case ${PREFIX[0]:-} in
valgrind | */valgrind) PREFIX+=(--trace-children=yes) ;;
esac
# waits scale with it: valgrind runs the exporter 20-50 times slower
SLOW=1
if [ ${#PREFIX[@]} -gt 0 ]; then
    SLOW=6
fi
EXP_PIDS=() # the exporters started and not yet reaped
EXP_PID=    # the last one started, until it is reaped
EXP_PORT=   # the port the last one listens on
PROM_PID=
PROM_PORT=

# exporter_cleanup: kills the exporters and Prometheus still running
# (ops_lib.sh's EXIT trap runs it; a script with more to stop sets its
# own OPS_CLEANUP, which calls this one).
exporter_cleanup() {
    local p
    for p in "${EXP_PIDS[@]}" $PROM_PID; do
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
}
OPS_CLEANUP=exporter_cleanup

# exporter_reaped PID: PID was waited for: out of EXP_PIDS (and EXP_PID),
# so that the cleanup never signals a number the kernel may reuse.
exporter_reaped() {
    local p keep=()
    for p in "${EXP_PIDS[@]}"; do
        if [ "$p" != "$1" ]; then
            keep+=("$p")
        fi
    done
    EXP_PIDS=("${keep[@]}")
    if [ "$EXP_PID" = "$1" ]; then
        EXP_PID=
    fi
}

# start_exporter OUT ARGS...: `dlock exporter --listen 127.0.0.1:0 ARGS`
# (under PREFIX), stdout in OUT.out and stderr in OUT.err; its pid in
# EXP_PID (and EXP_PIDS), the port it printed in EXP_PORT. Returns 1 if it
# exited instead (status in WRC), or printed no port in time
# (WRC=timeout; the cleanup kills it).
start_exporter() {
    local i out=$1
    shift
    EXP_PORT=
    "${PREFIX[@]}" "$DLOCK" exporter --listen 127.0.0.1:0 "$@" \
        >"$out.out" 2>"$out.err" </dev/null &
    EXP_PID=$!
    EXP_PIDS+=("$EXP_PID")
    # the exporter opens its clients and listens in milliseconds; 10 s on
    # a busy machine (times SLOW under valgrind)
    for ((i = 0; i < 100 * SLOW; i++)); do
        EXP_PORT=$(sed -n 's|^dlock exporter: listening on https\{0,1\}://127.0.0.1:\([0-9]*\)/metrics$|\1|p' "$out.out" 2>/dev/null)
        if [ -n "$EXP_PORT" ]; then
            return 0
        fi
        if ! kill -0 "$EXP_PID" 2>/dev/null; then
            wait "$EXP_PID"
            WRC=$?
            exporter_reaped "$EXP_PID"
            return 1
        fi
        sleep 0.1
    done
    WRC=timeout
    return 1
}

# stop_exporter WHAT OUT: SIGTERM to the exporter EXP_PID (started with
# OUT). Returns 0 if it exits 0 (under valgrind: no leak, no error); else
# `fail "SIGTERM: WHAT exited WRC"`, OUT.err shown, and 1.
stop_exporter() {
    local pid=$EXP_PID
    kill -TERM "$pid"
    # it stops in milliseconds; 10 s (times SLOW) for a busy machine;
    # wait_exit reaps it, or kills it when it did not stop
    wait_exit "$pid" $((10 * SLOW))
    exporter_reaped "$pid"
    if [ "$WRC" != 0 ]; then
        fail "SIGTERM: $1 exited $WRC"
        show "$2.err"
        return 1
    fi
    return 0
}

# get FILE URL [CURL ARGS...]: GET URL into FILE (headers in FILE.h,
# curl's messages in FILE.err); CODE gets the HTTP status (000: no
# answer). An answer takes milliseconds: curl gives up after 10 s (times
# SLOW) on a busy machine, or after a --max-time in ARGS.
get() {
    local f=$1 url=$2
    shift 2
    CODE=$(curl -sS --max-time $((10 * SLOW)) -o "$f" -D "$f.h" \
        -w '%{http_code}' "$@" "$url" 2>"$f.err")
}

# scrape FILE [CURL ARGS...]: get FILE http://127.0.0.1:$EXP_PORT/metrics
scrape() {
    local f=$1
    shift
    get "$f" "http://127.0.0.1:$EXP_PORT/metrics" "$@"
}

# start_prometheus: a private Prometheus on a free loopback port, its
# configuration read from stdin into $TMP/prom/prometheus.yml, its data
# and log ($TMP/prom/log) there too; PROM_PID and PROM_PORT. Returns 1
# (after a fail) if none is ready.
start_prometheus() {
    local attempt i dir=$TMP/prom
    mkdir -p "$dir"
    cat >"$dir/prometheus.yml"
    for ((attempt = 0; attempt < 3; attempt++)); do
        PROM_PORT=$(free_port) || continue
        prometheus --config.file="$dir/prometheus.yml" \
            --storage.tsdb.path="$dir/data" \
            --web.listen-address="127.0.0.1:$PROM_PORT" \
            --log.level=warn >"$dir/log" 2>&1 </dev/null &
        PROM_PID=$!
        # Prometheus is ready in a second or two; 30 s on a busy machine
        for ((i = 0; i < 300; i++)); do
            if ! kill -0 "$PROM_PID" 2>/dev/null; then
                break # the port was taken after all?
            fi
            if curl -sf --max-time 2 "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null 2>&1; then
                return 0
            fi
            sleep 0.1
        done
        kill -KILL "$PROM_PID" 2>/dev/null
        wait "$PROM_PID" 2>/dev/null
        PROM_PID=
    done
    fail "prometheus did not start; its log:"
    show "$dir/log"
    return 1
}

# stop_prometheus: its data is not needed: killed (a clean stop is
# seconds of TSDB work)
stop_prometheus() {
    kill -KILL "$PROM_PID" 2>/dev/null
    wait "$PROM_PID" 2>/dev/null
    PROM_PID=
}

# prom QUERY: the API's answer to an instant query, on stdout
prom() {
    curl -sS --max-time 10 "http://127.0.0.1:$PROM_PORT/api/v1/query" \
        --data-urlencode "query=$1" 2>/dev/null
}

# prom_value QUERY: the first result's value ("" when none)
prom_value() {
    prom "$1" | python3 -c 'import json,sys
r = json.load(sys.stdin)["data"]["result"]
print(r[0]["value"][1] if r else "")' 2>/dev/null
}

# wait_prom QUERY VALUE: until QUERY's first value is VALUE; 1 if not
# within 30 s (times SLOW): a scrape comes every interval (seconds), and
# a query sees it at once
wait_prom() {
    local i
    for ((i = 0; i < 300 * SLOW; i++)); do
        if [ "$(prom_value "$1")" = "$2" ]; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}
