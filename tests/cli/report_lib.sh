# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# shellcheck disable=SC2034
# (SC2034: SKIPS is read by the sourcing script.)
#
# report_lib.sh -- the CLI tests' counting and diagnosis (test_cli.sh,
# test_stop.sh, ops_lib.sh): pass/fail/skip counted in PASSES, FAILS and
# SKIPS, judge (pass or fail by a check's exit status), show FILE... (a
# file's first lines, indented, after a failure; paths shown relative to
# $TMP), now_ms (the monotonic-enough wall clock in milliseconds, from
# bash's EPOCHREALTIME), wait_exit and wait_file (bounded waits), dl and
# expect_rc (a dlock run, bounded by the caller's BOUND), need_args and
# store_args (the tests' arguments).

fail() {
    echo "FAIL: $*" >&2
    FAILS=$((FAILS + 1))
}

pass() {
    echo "ok   $*"
    PASSES=$((PASSES + 1))
}

skip() {
    echo "SKIP: $*"
    SKIPS=$((SKIPS + 1))
}

# judge STATUS PASS-MESSAGE FAIL-MESSAGE: a check's verdict by its exit
# status (0 passes), showing $TMP/out after a failure.
judge() {
    if [ "$1" -eq 0 ]; then
        pass "$2"
    else
        fail "$3"
        show "$TMP/out"
    fi
}

show() {
    local f
    for f in "$@"; do
        if [ -s "$f" ]; then
            echo "  --- ${f#"$TMP"/}:" >&2
            sed 's/^/  | /' "$f" | head -n 30 >&2
        fi
    done
}

now_ms() {
    local t=${EPOCHREALTIME/[.,]/}
    echo $((10#$t / 1000))
}

# dl ARGS... : runs dlock ($DLOCK, under the caller's BOUND, a command
# prefix such as timeout) with stdout in $TMP/out and stderr in $TMP/err;
# its exit status in RC.
dl() {
    "${BOUND[@]}" "$DLOCK" "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
    RC=$?
}

# expect_rc WANT DESCRIPTION -- ARGS... : runs dlock ARGS, checks the status.
expect_rc() {
    local want=$1 what=$2
    shift 3
    dl "$@"
    if [ "$RC" -eq "$want" ]; then
        pass "$what (exit $RC)"
    else
        fail "$what: dlock $* exited $RC, expected $want"
        show "$TMP/out" "$TMP/err"
    fi
}

# wait_exit PID SECONDS: waits until PID exits (at most SECONDS), then sets
# WRC to its exit status; WRC=timeout (and PID is killed) if it did not.
# SECONDS is an upper bound: each use names what dlock needs (detection +
# --kill-after) and leaves slack for a busy machine; the loop counts 0.1 s
# sleeps, so under load it waits longer than SECONDS, never shorter.
wait_exit() {
    local pid=$1 limit=$(($2 * 10)) i
    for ((i = 0; i < limit; i++)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            break
        fi
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        WRC=timeout
        return 1
    fi
    wait "$pid"
    WRC=$?
    return 0
}

# wait_file FILE: waits (at most 10 s: a command starts in milliseconds)
# until FILE exists.
wait_file() {
    local i
    for ((i = 0; i < 100; i++)); do
        [ -e "$1" ] && return 0
        sleep 0.1
    done
    return 1
}

# need_args N USAGE ARGS...: exits 2, saying "usage: bash $0 USAGE",
# unless there are N ARGS.
need_args() {
    local n=$1 usage=$2
    shift 2
    if [ $# -ne "$n" ]; then
        echo "usage: bash $0 $usage" >&2
        exit 2
    fi
}

# store_args NAME KINDS ARGS...: the arguments of the operator tests
# (NAME), /path/to/dlock KIND, into DLOCK and KIND, KIND one of KINDS
# ("file|redis|rediss"); exits 2 on a usage error, 1 when dlock is not an
# executable file.
store_args() {
    local name=$1 kinds=$2
    shift 2
    need_args 2 "/path/to/dlock $kinds" "$@"
    DLOCK=$1
    KIND=$2
    case "|$kinds|" in
    *"|$KIND|"*) ;;
    *)
        echo "$name: store kind must be one of $kinds, not '$KIND'" >&2
        exit 2
        ;;
    esac
    if [ ! -x "$DLOCK" ]; then
        echo "FAIL: $DLOCK is not an executable file" >&2
        exit 1
    fi
}
