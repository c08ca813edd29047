#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# demo.sh DLOCK -- the seeds' counter example, across processes.
#
# PROCS processes each add 1 to a number in a file ITER times, with a
# read-then-write that is not atomic. Without a lock, increments are lost;
# under `dlock run` (the default store: local lock files) none is.
set -u
DLOCK=${1:-build/dlock}
PROCS=${PROCS:-8}
ITER=${ITER:-100}
unset DLOCK_STORE # the default store

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlock-demo-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
counter=$tmp/counter
# the critical section: read the number, write it back plus one
bump='n=$(cat "$1"); echo $((n + 1)) > "$1"'

run() { # run WITH_LOCK: PROCS loops of ITER increments, in parallel
    echo 0 >"$counter"
    local pids=() i
    for ((i = 0; i < PROCS; i++)); do
        (
            for ((k = 0; k < ITER; k++)); do
                if [ "$1" = yes ]; then
                    "$DLOCK" run demo-counter -- sh -c "$bump" sh "$counter" || exit 1
                else
                    sh -c "$bump" sh "$counter"
                fi
            done
        ) &
        pids+=($!)
    done
    local rc=0
    for i in "${pids[@]}"; do wait "$i" || rc=1; done
    return $rc
}

want=$((PROCS * ITER))
echo "dlock demo: $PROCS processes each add 1 to a counter file $ITER times."
echo


run no
got=$(cat "$counter")

echo "without a lock:  counter = $got, expected $want: $((want - got)) updates lost"


if ! run yes; then
    echo "dlock run failed" >&2
    exit 1
fi
got=$(cat "$counter")

echo "with dlock run:  counter = $got, expected $want: $((want - got)) updates lost"
echo
echo "(store: $("$DLOCK" status demo-counter | sed -n 's/^store: *//p'))"
[ "$got" = "$want" ]
