#!/bin/sh
# SPDX-License-Identifier: MIT
# fuzz/run.sh BUILD_DIR SECONDS -- runs every fuzz target built in
# BUILD_DIR/fuzz for SECONDS each, one after the other (one core), on its
# committed corpus fuzz/corpus/<name>/ (read only: new inputs go to
# BUILD_DIR/fuzz-run/<name>/). Fails on the first crash, leak, UB or broken
# invariant; the input is saved as BUILD_DIR/fuzz-artifacts/<name>-crash-*.
set -eu
build=$1
secs=$2
here=$(cd "$(dirname "$0")" && pwd)
found=0
for src in "$here"/fuzz_*.c; do
    name=${src##*/fuzz_}
    name=${name%.c}
    bin=$build/fuzz/fuzz_$name
    [ -x "$bin" ] || continue # a store this build leaves out
    found=1
    mkdir -p "$here/corpus/$name"
    work=$build/fuzz-run/$name
    mkdir -p "$work" "$build/fuzz-artifacts"
    printf 'fuzz_%s: %ss ... ' "$name" "$secs"
    if "$bin" -max_total_time="$secs" -rss_limit_mb=1024 -timeout=10 \
        -artifact_prefix="$build/fuzz-artifacts/$name-" \
        "$work" "$here/corpus/$name" >"$build/fuzz-run/$name.log" 2>&1; then
        grep -o 'Done [0-9]* runs' "$build/fuzz-run/$name.log" | tail -n 1
    else
        echo FAILED
        tail -n 40 "$build/fuzz-run/$name.log"
        exit 1
    fi
done
[ "$found" = 1 ] || { echo "no fuzz targets in $build/fuzz" >&2; exit 1; }
