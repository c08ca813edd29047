#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2016,SC2317
# (SC2016: single-quoted "$0" is for the command's own shell; SC2317:
# stop_servers runs from ops_lib.sh's EXIT trap.)
#
# test_secrets.sh -- store passwords stay secret (issue 34), through the
# real binary and a private redis-server whose password holds '/', '?',
# '@', '%' and ':'.
#
#   bash test_secrets.sh /path/to/dlock
#
#   - every URI kind, the password written unescaped (and the issue's
#     "postgres://127.0.0.1:1/S3cret@db/appdb" shape): refused, no piece
#     of the password in the output of status, list, run or exporter;
#   - the password escaped, on a Redis that wants it: status, list, the
#     exporter's /metrics (dlock_metrics_text) and a wrong password's error
#     show no piece of it;
#   - another user (nobody, by runuser) reads /proc/PID/cmdline of a
#     running `dlock run --store URI` and `--store=URI` and of `dlock
#     exporter --store URI`: no piece of the password;
#   - the command `dlock run` starts finds none in its environment
#     (DLOCK_STORE, DLOCK_PASSWORD, REDISCLI_AUTH: /proc/self/environ);
#   - DLOCK_PASSWORD, REDISCLI_AUTH and ?password_file= give the password
#     without argv; a password_file others may read is refused.
# Runs as root (runuser). Every wait is bounded. Exit: 0 passed, 1 a
# failure, 77 skipped.

set -u

if [ $# -ne 1 ]; then
    echo "usage: bash $0 /path/to/dlock" >&2
    exit 2
fi
DLOCK=$1
KIND=redis
if [ ! -x "$DLOCK" ]; then
    echo "FAIL: $DLOCK is not an executable file" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ] || ! command -v runuser >/dev/null 2>&1 ||
    ! id nobody >/dev/null 2>&1; then
    echo "SKIP: needs root, runuser and a 'nobody' user (reads /proc as" \
        "another user)"
    exit 77
fi

# shellcheck source-path=SCRIPTDIR source=ops_lib.sh
. "$(dirname "$0")/ops_lib.sh"

EXP_PID=
stop_servers() {
    if [ -n "$EXP_PID" ]; then
        kill -KILL "$EXP_PID" 2>/dev/null
        wait "$EXP_PID" 2>/dev/null
    fi
}
OPS_CLEANUP=stop_servers
chmod 755 "$TMP" # nobody reads nothing there, but may enter

# The password, and the pieces none of which may ever show (each is in the
# password only: any leak of it, whole, escaped or cut at a '/' or a '?',
# shows one).
PW='Zq7/S3cr?et@%:Wv9'
PWE='Zq7%2FS3cr%3Fet%40%25%3AWv9'
PIECES=(Zq7 S3cr Wv9)

# expect WHAT CMD...: passes when CMD succeeds
expect() {
    local what=$1
    shift
    if "$@"; then
        pass "$what"
    else
        fail "$what"
    fi
}

# expect_not WHAT CMD...: passes when CMD fails
expect_not() {
    local what=$1
    shift
    if "$@"; then
        fail "$what"
    else
        pass "$what"
    fi
}

# leaks WHAT FILE...: passes when no file holds a piece of the password
leaks() {
    local what=$1 p hit=
    shift
    for p in "${PIECES[@]}"; do
        if grep -a -q -F -- "$p" "$@" 2>/dev/null; then
            hit=$p
        fi
    done
    if [ -z "$hit" ]; then
        pass "$what: no piece of the password"
    else
        fail "$what shows '$hit', a piece of the password"
        show "$@"
    fi
}

# --------------------------------------------------------------------------
# Every URI kind, the password unescaped: refused, never printed
# --------------------------------------------------------------------------

KINDS=(
    "redis://u:%s@127.0.0.1:1/0"
    "rediss://u:%s@127.0.0.1:1"
    "unix://u:%s@/nonexistent/redis.sock"
    "redis-sentinel://u:%s@127.0.0.1:1,127.0.0.1:2/mymaster"
    "redis-cluster://u:%s@127.0.0.1:1,127.0.0.1:2"
    "redlock://u:%s@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3"
    "zk://u:%s@127.0.0.1:1/dlock"
    "etcd://u:%s@127.0.0.1:1"
    "etcds://u:%s@127.0.0.1:1"
    "postgres://u:%s@127.0.0.1:1/appdb"
    "postgresql://u:%s@127.0.0.1:1/appdb"
    "mysql://u:%s@127.0.0.1:1/appdb"
    "mariadb://u:%s@127.0.0.1:1/appdb"
    "sqlite://u:%s@/nonexistent/x.db"
    "file://u:%s@/nonexistent/locks"
)
for k in "${KINDS[@]}"; do
    # shellcheck disable=SC2059
    for uri in "$(printf "$k" "$PW")" \
        "$(printf "$k" "1/S3cret")" \
        "${k%%://*}://127.0.0.1:1/Zq7S3cret@127.0.0.1:1/appdb"; do
        for cmd in "status --store $uri n" "list --store=$uri" \
            "run --wait 0 --store $uri n -- true"; do
            read -r -a args <<<"$cmd"
            dl "${args[@]}"
            if [ "$RC" -ne 0 ]; then
                leaks "dlock ${cmd%% *} on ${k%%://*}:// (exit $RC)" \
                    "$TMP/out" "$TMP/err"
            else
                fail "dlock $cmd exited 0"
            fi
        done
    done
done
# the issue's own URI
dl status --store "postgres://127.0.0.1:1/S3cret@db/appdb" n
if [ "$RC" -eq 64 ] && ! grep -q S3cret "$TMP/out" "$TMP/err"; then
    pass "postgres://127.0.0.1:1/S3cret@db/appdb: refused (64), unprinted"
else
    fail "postgres://127.0.0.1:1/S3cret@db/appdb: exit $RC or printed"
    show "$TMP/out" "$TMP/err"
fi

# --------------------------------------------------------------------------
# A Redis that wants the password
# --------------------------------------------------------------------------

start_redis
if ! redis-cli -p "$REDIS_PORT" config set requirepass "$PW" >/dev/null; then
    fail "cannot give redis-server a password"
    finish
fi
URI="redis://:$PWE@127.0.0.1:$REDIS_PORT/0?prefix=sectest:"
PLAIN="redis://127.0.0.1:$REDIS_PORT/0?prefix=sectest:"
unset DLOCK_STORE DLOCK_PASSWORD REDISCLI_AUTH

expect_rc 0 "status with the escaped password" -- status --store "$URI" s1
leaks "status" "$TMP/out" "$TMP/err"
expect "status shows the password as ***" grep -q ':\*\*\*@' "$TMP/out"
expect_rc 0 "status --json with the escaped password" -- status --json --store "$URI" s1
leaks "status --json" "$TMP/out" "$TMP/err"
expect_rc 0 "list with the escaped password" -- list --all --json --store "$URI"
leaks "list --json" "$TMP/out" "$TMP/err"
dl status --store "redis://:Zq7%2FS3cr%3FWRONG%40%25%3AWv9@127.0.0.1:$REDIS_PORT/0" s1
if [ "$RC" -eq 69 ]; then
    leaks "a wrong password's error (exit 69)" "$TMP/out" "$TMP/err"
else
    fail "a wrong password: exit $RC, expected 69"
    show "$TMP/out" "$TMP/err"
fi

# cmdline_of WHAT PID: another user reads /proc/PID/cmdline
cmdline_of() {
    local what=$1 pid=$2
    if runuser -u nobody -- cat "/proc/$pid/cmdline" >"$TMP/cmdline" 2>"$TMP/cmdline.err" &&
        [ -s "$TMP/cmdline" ]; then
        leaks "$what: /proc/PID/cmdline as nobody" "$TMP/cmdline"
        if tr '\0' ' ' <"$TMP/cmdline" | grep -q "127.0.0.1:$REDIS_PORT"; then
            pass "$what: the rest of the URI still shows"
        else
            fail "$what: the URI is gone from argv: $(tr '\0' ' ' <"$TMP/cmdline")"
        fi
    else
        fail "$what: nobody cannot read /proc/$pid/cmdline"
        show "$TMP/cmdline.err"
    fi
}

# a long-lived dlock run, both option forms
hold sep s2 --store "$URI"
P1=$HOLD_PID
hold eq s3 "--store=$URI"
P2=$HOLD_PID
export DLOCK_STORE=$URI
if wait_holders s2 1 && wait_holders s3 1; then
    pass "dlock run holds with the escaped password"
    cmdline_of "dlock run --store URI" "$P1"
    cmdline_of "dlock run --store=URI" "$P2"
else
    fail "dlock run with the password did not take its locks"
    show "$TMP/hold.sep.err" "$TMP/hold.eq.err"
fi
unset DLOCK_STORE

# the exporter, with the password in its --store
"$DLOCK" exporter --listen 127.0.0.1:0 --store "$URI" \
    >"$TMP/exp.out" 2>"$TMP/exp.err" </dev/null &
EXP_PID=$!
EXP_PORT=
# it opens its client and listens in milliseconds; 10 s on a busy machine
for ((i = 0; i < 100; i++)); do
    EXP_PORT=$(sed -n 's|^dlock exporter: listening on http://127.0.0.1:\([0-9]*\)/.*$|\1|p' "$TMP/exp.out" 2>/dev/null)
    if [ -n "$EXP_PORT" ] || ! kill -0 "$EXP_PID" 2>/dev/null; then
        break
    fi
    sleep 0.1
done
if [ -n "$EXP_PORT" ]; then
    cmdline_of "dlock exporter --store URI" "$EXP_PID"
    if curl -sS --max-time 10 -o "$TMP/metrics" \
        "http://127.0.0.1:$EXP_PORT/metrics" 2>"$TMP/curl.err" &&
        grep -q '^dlock_' "$TMP/metrics"; then
        leaks "the exporter's /metrics" "$TMP/metrics"
    else
        fail "no metrics from the exporter"
        show "$TMP/curl.err" "$TMP/exp.err"
    fi
    leaks "the exporter's output" "$TMP/exp.out" "$TMP/exp.err"
elif grep -q libmicrohttpd "$TMP/exp.err"; then
    skip "this dlock was built without libmicrohttpd: no exporter"
else
    fail "the exporter did not start"
    show "$TMP/exp.out" "$TMP/exp.err"
fi
stop_servers
EXP_PID=

# --------------------------------------------------------------------------
# The command's environment
# --------------------------------------------------------------------------

# env_of WHAT: runs a command under dlock run that copies its own
# /proc/self/environ; no piece of the password in it
env_of() {
    local what=$1
    shift
    rm -f "$TMP/child.env"
    "${BOUND[@]}" "$DLOCK" run "$@" envlock -- \
        sh -c 'tr "\0" "\n" </proc/self/environ >"$0"' "$TMP/child.env" \
        >"$TMP/out" 2>"$TMP/err" </dev/null
    RC=$?
    if [ "$RC" -eq 0 ] && [ -s "$TMP/child.env" ]; then
        leaks "$what: the command's environment" "$TMP/child.env"
    else
        fail "$what: dlock run exited $RC"
        show "$TMP/out" "$TMP/err"
    fi
}

DLOCK_STORE=$URI env_of "DLOCK_STORE with the password"
if grep -q "^DLOCK_STORE=redis://127.0.0.1:$REDIS_PORT/0?prefix=sectest:\$" "$TMP/child.env"; then
    pass "the command gets DLOCK_STORE without the password"
else
    fail "the command's DLOCK_STORE: $(grep DLOCK_STORE "$TMP/child.env")"
fi
DLOCK_PASSWORD=$PW env_of "DLOCK_PASSWORD" --store "$PLAIN"
expect_not "DLOCK_PASSWORD gives the password, and the command lacks it" \
    grep -q '^DLOCK_PASSWORD=' "$TMP/child.env"
REDISCLI_AUTH=$PW DLOCK_STORE=$PLAIN env_of "REDISCLI_AUTH"
expect_not "REDISCLI_AUTH gives the password, and the command lacks it" \
    grep -q '^REDISCLI_AUTH=' "$TMP/child.env"
# a variable dlock does not take its password from reaches the command
PGPASSWORD=kept env_of "PGPASSWORD on a Redis store" --store "$URI"
expect "PGPASSWORD, not the store's, still reaches the command" \
    grep -q '^PGPASSWORD=kept$' "$TMP/child.env"

# --------------------------------------------------------------------------
# password_file
# --------------------------------------------------------------------------

printf '%s\n' "$PW" >"$TMP/pw"
chmod 600 "$TMP/pw"
expect_rc 0 "password_file (0600)" -- status --store "$PLAIN&password_file=$TMP/pw" s1
leaks "status with a password_file" "$TMP/out" "$TMP/err"
chmod 644 "$TMP/pw"
dl status --store "$PLAIN&password_file=$TMP/pw" s1
if [ "$RC" -eq 69 ] && grep -q "other users" "$TMP/err"; then
    pass "a password_file others may read is refused (exit 69)"
else
    fail "password_file 0644: exit $RC, expected 69 and 'other users'"
    show "$TMP/out" "$TMP/err"
fi
leaks "the refused password_file's error" "$TMP/out" "$TMP/err"
chmod 600 "$TMP/pw"
dl status --store "redis://:x@127.0.0.1:$REDIS_PORT/0?password_file=$TMP/pw" s1
expect "a password and a password_file: refused (exit $RC, want 64)" \
    [ "$RC" -eq 64 ]

finish
