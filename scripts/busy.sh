#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# busy.sh CMD [ARGS...] -- runs CMD while stress-ng keeps every core busy
# (one CPU worker per core, the default scheduling class of a user's other
# work), and returns CMD's exit code (stress-ng installed first if
# missing). `make test-busy` and CI run `make test` so:
# a timing bound that only holds on an idle machine fails there.
set -u
command -v stress-ng >/dev/null || "$(dirname "$0")/install-deps.sh" busy
command -v stress-ng >/dev/null || { echo "busy.sh: stress-ng is not installed" >&2; exit 1; }
# bounded: stress-ng stops by itself after 2 hours whatever happens here
stress-ng --cpu "$(nproc)" --timeout 7200 --quiet &
load=$!
trap 'kill "$load" 2>/dev/null; wait "$load" 2>/dev/null' EXIT
"$@"
