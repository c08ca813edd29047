# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# shellcheck disable=SC2317,SC2034
# (SC2317: cleanup runs from the EXIT trap; SC2034: WRC, RC and the like
# are read by the sourcing script.)
#
# ops_lib.sh -- what the operator-command tests share (test_list_break.sh,
# test_exporter.sh): pass/fail counting, a private store (file:// in a
# temporary directory, or a private redis-server on a free loopback port;
# rediss: the same with a TLS port too, dlock on it), holders started in
# the background with `dlock run`, bounded waits.
#
# Sourced after DLOCK and KIND are set. Every wait is bounded; each bound
# says what it covers.

FAILS=0
PASSES=0
SKIPS=0
BG_PIDS=()
REDIS_PID=
REDIS_PORT=
REDIS_TLS_PORT= # rediss
CERTS=          # rediss: tlscerts.sh's directory
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dlock-ops-XXXXXX") || {
    echo "FAIL: mktemp -d failed" >&2
    exit 1
}
# extra cleanup of the sourcing script (a function name), run first
OPS_CLEANUP=

ops_cleanup() {
    local p
    if [ -n "$OPS_CLEANUP" ]; then
        "$OPS_CLEANUP"
    fi
    for p in "${BG_PIDS[@]}"; do
        kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    if [ -n "$REDIS_PID" ]; then
        kill -KILL "$REDIS_PID" 2>/dev/null
        wait "$REDIS_PID" 2>/dev/null
    fi
    if [ -z "${DLOCK_TEST_KEEP:-}" ]; then
        rm -rf "$TMP"
    else
        echo "kept $TMP" >&2
    fi
}
trap ops_cleanup EXIT

# shellcheck source-path=SCRIPTDIR source=report_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/report_lib.sh"

# Every foreground dlock call is bounded, so a hang fails (exit 124)
# instead of stalling the suite: 20 s is ten times a store round trip's
# default timeout, for one command on a busy machine.
BOUND=(timeout -k 2 20)

# free_port: prints a loopback port nothing answers on (another process
# may still take it before we bind: callers retry).
free_port() {
    local i cand
    for ((i = 0; i < 100; i++)); do
        cand=$((20000 + (RANDOM * 32768 + RANDOM) % 40001))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$cand") 2>/dev/null; then
            echo "$cand"
            return 0
        fi
    done
    return 1
}

# start_redis [tls]: a private redis-server (no persistence) on a free
# loopback port in $TMP/redis; REDIS_PID and REDIS_PORT. With "tls" also a
# TLS port (REDIS_TLS_PORT, the port above; on 127.0.0.1 and ::1 where
# there is one: localhost may be either) serving $CERTS/server.crt (for
# localhost; certificates by tests/servers/tlscerts.sh), no client
# certificate asked. Exits if it will not start.
start_redis() {
    local attempt p i dir=$TMP/redis tls=(--bind 127.0.0.1)
    if ! command -v redis-server >/dev/null 2>&1 ||
        ! command -v redis-cli >/dev/null 2>&1; then
        echo "FAIL: redis-server or redis-cli is not in PATH: install" \
            "redis-server and redis-tools (scripts/install-deps.sh test)" >&2
        exit 1
    fi
    mkdir -p "$dir"
    if [ "${1:-}" = tls ]; then
        CERTS=$TMP/tls
        if ! bash "$(dirname "${BASH_SOURCE[0]}")/../servers/tlscerts.sh" \
            "$CERTS" >"$TMP/tlscerts.log" 2>&1; then
            echo "FAIL: tests/servers/tlscerts.sh could not make the certificates:" >&2
            show "$TMP/tlscerts.log"
            exit 1
        fi
    fi
    for ((attempt = 0; attempt < 5; attempt++)); do
        p=$(free_port) || continue
        if [ "${1:-}" = tls ]; then
            # p + 1 may be taken: redis-server exits, and we try again
            REDIS_TLS_PORT=$((p + 1))
            tls=(--bind 127.0.0.1 -::1 --tls-port "$REDIS_TLS_PORT"
                --tls-cert-file "$CERTS/server.crt"
                --tls-key-file "$CERTS/server.key"
                --tls-ca-cert-file "$CERTS/ca.crt" --tls-auth-clients no)
        fi
        redis-server --save '' --appendonly no "${tls[@]}" \
            --port "$p" --dir "$dir" --daemonize no \
            >"$dir/log" 2>&1 </dev/null &
        REDIS_PID=$!
        # a redis-server answers within milliseconds; 5 s on a busy machine
        for ((i = 0; i < 50; i++)); do
            if ! kill -0 "$REDIS_PID" 2>/dev/null; then
                break # exited: the port was taken after all?
            fi
            if [ "$(redis-cli -p "$p" ping 2>/dev/null)" = PONG ]; then
                REDIS_PORT=$p
                return 0
            fi
            sleep 0.1
        done
        kill -KILL "$REDIS_PID" 2>/dev/null
        wait "$REDIS_PID" 2>/dev/null
        REDIS_PID=
    done
    echo "FAIL: redis-server did not start; its log:" >&2
    show "$dir/log"
    exit 1
}

# use_store: sets DLOCK_STORE (exported) for KIND, starting the store.
use_store() {
    case $KIND in
    file)
        mkdir -p "$TMP/locks"
        export DLOCK_STORE="file://$TMP/locks"
        ;;
    redis)
        start_redis
        export DLOCK_STORE="redis://127.0.0.1:$REDIS_PORT/0?prefix=opstest:"
        ;;
    rediss)
        # the Redis checks over TLS (the plain port stays for redis-cli)
        start_redis tls
        export DLOCK_STORE="rediss://localhost:$REDIS_TLS_PORT/0?prefix=opstest:&cacert=$CERTS/ca.crt"
        KIND=redis
        ;;
    esac
}

# is_held NAME: the store says NAME is held.
is_held() {
    "${BOUND[@]}" "$DLOCK" status --json -- "$1" 2>/dev/null </dev/null |
        grep -q '"held":true'
}

# hold TAG NAME [RUN OPTIONS...]: starts `dlock run OPTIONS NAME -- sleep
# 120` in the background (output in $TMP/hold.TAG.*); its pid in HOLD_PID.
hold() {
    local tag=$1 name=$2
    shift 2
    "$DLOCK" run --quiet "$@" "$name" -- sleep 120 \
        >"$TMP/hold.$tag.out" 2>"$TMP/hold.$tag.err" </dev/null &
    HOLD_PID=$!
    BG_PIDS+=("$HOLD_PID")
}

# wait_holders NAME N: waits until the store reports N holds on NAME (10 s:
# a `dlock run` takes a free lock in well under a second, ten times that
# on a busy machine). Returns 0 when it does.
wait_holders() {
    local name=$1 want=$2 i
    for ((i = 0; i < 100; i++)); do
        if "${BOUND[@]}" "$DLOCK" status --json -- "$name" 2>/dev/null \
            </dev/null | grep -q "\"holders\":$want,"; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

# finish: the summary line and the exit status (77: everything skipped).
finish() {
    echo "$PASSES passed, $FAILS failed, $SKIPS skipped"
    if [ "$FAILS" -gt 0 ]; then
        exit 1
    fi
    if [ "$PASSES" -eq 0 ]; then
        exit 77
    fi
    exit 0
}
