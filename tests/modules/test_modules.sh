#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test_modules.sh BUILD -- the stores as modules (docs/development.md
# "Modules"): a program that uses one store maps that store's module and
# client library and no other; one that uses the file store maps none; a
# module missing, of another module ABI, breaking the ABI's rules or not a
# dlock module is refused with DLOCK_ENOTSUP and a message that says which
# and why (another release's module of this ABI loads); `dlock
# --version` says what is there. Starts a private redis-server.
set -u
build=$1
maps=$build/tests/test_maps
moddir=$build/dlock-$("$build/dlock" --version | sed -n 's/^dlock \([^ ]*\).*/\1/p')
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlock-modules-XXXXXX")
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
unset DLOCK_MODULE_DIR DLOCK_STORE

[ -f "$moddir/redis.so" ] || fail "no module directory $moddir with redis.so in it"

# the file store: no module, no store client library
out=$("$maps" "file://$tmp/locks") || fail "file store: $out"
echo "$out" | grep -q "/libdlock\.so" || fail "file store: libdlock.so is not mapped?"
bad=$(echo "$out" | grep -E "dlock-[0-9.]+/|libhiredis|libpq|libmariadb|libzookeeper|libcurl|libsqlite3|libcjson")
[ -z "$bad" ] || fail "a file-store program maps: $bad"
echo "ok   the file store maps no module and no client library"

# a private redis-server on a free loopback port (bounded: 20 ports, 10 s each)
command -v redis-server >/dev/null || fail "redis-server is not in PATH (apt-get install redis-server)"
port=
for _ in $(seq 20); do
    p=$((20000 + RANDOM % 30000))
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue # taken
    redis-server --save '' --appendonly no --bind 127.0.0.1 --port "$p" \
        --dir "$tmp" --daemonize no >"$tmp/redis.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do # until it answers, or exits (port taken)
        redis-cli -p "$p" ping 2>/dev/null | grep -q PONG && { port=$p; break; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$port" ] && break
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=
done
[ -n "$port" ] || { cat "$tmp/redis.log" >&2; fail "redis-server did not start"; }

# Redis: its module and hiredis, nothing else
out=$("$maps" "redis://127.0.0.1:$port") || fail "redis store: $out"
echo "$out" | grep -q "$moddir/redis\.so" || fail "redis.so is not mapped: $out"
echo "$out" | grep -q "libhiredis" || fail "libhiredis is not mapped: $out"
bad=$(echo "$out" | grep -E "libpq|libmariadb|libzookeeper|libcurl|libsqlite3|libcjson|/(zk|etcd|pg|mysql|sqlite)\.so")
[ -z "$bad" ] || fail "a Redis-only program maps: $bad"
echo "ok   a Redis-only program maps redis.so and libhiredis, no other store's library"

# what --version lists
v=$("$build/dlock" --version) || fail "dlock --version"
echo "$v" | grep -q "^stores built in: file mem$" || fail "--version: file and mem not built in: $v"
echo "$v" | grep -q "^stores as modules: .*redis.*redlock" || fail "--version: no modules: $v"
mkdir "$tmp/empty"
v=$(DLOCK_MODULE_DIR=$tmp/empty "$build/dlock" --version)
echo "$v" | grep -q "^stores missing: .*redis" || fail "--version with no module: $v"
echo "$v" | grep -q "as modules" && fail "--version lists modules that are not there: $v"
echo "ok   dlock --version lists the stores built in, as modules and missing"

# refused: not installed, another ABI, a capability without its slot,
# not a module
expect_refused() { # DIR WHAT PATTERN
    local out
    out=$(DLOCK_MODULE_DIR=$1 "$maps" "redis://127.0.0.1:$port")
    [ $? -eq 3 ] || fail "$2: not refused: $out"
    echo "$out" | grep -q "^ERR DLOCK_ENOTSUP: " || fail "$2: not DLOCK_ENOTSUP: $out"
    echo "$out" | grep -qE "$3" || fail "$2: the message does not say why: $out"
    echo "ok   $2 refused: ${out#ERR }"
}
expect_refused "$tmp/empty" "a module not installed" "not installed.*redis\.so.*libdlock0-redis.*libhiredis-dev"
for kind in release older newer caps noentry; do
    mkdir "$tmp/$kind"
    cp "$build/tests/fake_module_$kind.so" "$tmp/$kind/redis.so"
done
abi=$(sed -n 's/^#define DLOCK__STORE_ABI \([0-9]*\).*/\1/p' "$(dirname "$0")/../../src/core/store.h")
[ -n "$abi" ] || fail "no DLOCK__STORE_ABI in src/core/store.h"
expect_refused "$tmp/older" "a module of an older ABI" "module ABI $((abi - 1)) \(dlock 0\.0\.0-old\).*loads ABI $abi"
expect_refused "$tmp/newer" "a module of a newer ABI" "module ABI 999 .*loads ABI $abi"
expect_refused "$tmp/caps" "a module that claims a capability without its slot" "claims capability HANDOVER without an abandon slot"
expect_refused "$tmp/noentry" "a shared object that is not a module" "not a dlock store module"
# the module ABI decides, not the release: another release's module of
# this ABI loads (the fake one then answers every open itself)
out=$(DLOCK_MODULE_DIR=$tmp/release "$maps" "redis://127.0.0.1:$port")
echo "$out" | grep -q "^ERR DLOCK_ECONN: the fake store of dlock 0\.0\.0-other was loaded" ||
    fail "a module of this ABI from another release: $out"
echo "ok   another release's module of this ABI loads"
DLOCK_MODULE_DIR=$tmp/empty "$build/dlock" run --store "redis://127.0.0.1:$port" m -- true \
    2>"$tmp/err"
rc=$?
[ $rc -eq 69 ] || fail "dlock run with its module missing: exit $rc, not 69"
grep -q "not installed" "$tmp/err" || fail "dlock run: $(cat "$tmp/err")"
echo "ok   dlock run with its store's module missing: exit 69, says so"
