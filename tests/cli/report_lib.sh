# SPDX-License-Identifier: MIT
# shellcheck shell=bash
# shellcheck disable=SC2034
# (SC2034: SKIPS is read by the sourcing script.)
#
# report_lib.sh -- the CLI tests' counting and diagnosis (test_cli.sh,
# test_stop.sh, ops_lib.sh): pass/fail/skip counted in PASSES, FAILS and
# SKIPS, show FILE... (a file's first lines, indented, after a failure;
# paths shown relative to $TMP), now_ms (the monotonic-enough wall clock
# in milliseconds, from bash's EPOCHREALTIME).

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
