#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# build-matrix.sh [DIR] -- the builds a user or a packager makes, each from
# scratch in DIR (default build-matrix/), and warnings as errors when
# WERROR=ON (as CI sets it):
#   Release (with _FORTIFY_SOURCE, and the PostgreSQL store's suites run
#   there), Debug and MinSizeRel with gcc; Release with clang; every
#   store built in (-DDLOCK_MODULES=OFF); two stores and the exporter left
#   out (-DDLOCK_WITH_PG=OFF -DDLOCK_WITH_MYSQL=OFF -DDLOCK_EXPORTER=OFF),
#   and Redis without TLS (-DDLOCK_WITH_REDIS_TLS=OFF, as without
#   libssl-dev), whose summary, URIs and command must name what to
#   install.
# The tests are built too in the two Release builds (gcc and clang: the
# optimiser's warnings, and the other compiler's); the others build the
# library, its modules and the CLI, which is what differs between them.
# RelWithDebInfo with gcc is not here: `make test` builds exactly that
# (with WERROR=ON in CI) before this runs.
# Each build's `dlock --version` must answer and list the stores as that
# build reaches them. Exits non-zero at the first build that fails.
set -u
cd "$(dirname "$0")/.."
top=${1:-build-matrix}
mkdir -p "$top"
werror=${WERROR:-OFF}
jobs=$(nproc 2>/dev/null || echo 2)
fail() { echo "build-matrix: FAIL: $*" >&2; exit 1; }

build() { # NAME CC CMAKE_ARGS...
    local name=$1 cc=$2
    shift 2
    local dir=$top/$name
    rm -rf "$dir"
    echo "build-matrix: $name ($cc $*)"
    CC=$cc cmake -S . -B "$dir" -DDLOCK_WERROR="$werror" -DDLOCK_BENCH=OFF "$@" \
        >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; fail "$name: configure"; }
    cmake --build "$dir" -j"$jobs" >"$dir.build.log" 2>&1 ||
        { grep -E "error|warning" "$dir.build.log" | head -40; fail "$name: build"; }
    "$dir/dlock" --version >"$dir.version" 2>&1 || { cat "$dir.version"; fail "$name: dlock --version"; }
}

for t in Release Debug MinSizeRel; do
    tests=OFF
    [ "$t" = Release ] && tests=ON
    # Release as Debian and Ubuntu build it: glibc's fortified functions
    # (their snprintf() aborts on a format that skips a positional
    # argument, which PostgreSQL's statements once did)
    fortify=
    [ "$t" = Release ] && fortify=-D_FORTIFY_SOURCE=2
    build "gcc-$t" gcc -DCMAKE_BUILD_TYPE=$t -DDLOCK_TESTS=$tests \
        ${fortify:+"-DCMAKE_C_FLAGS=$fortify"}
    grep -q "^stores as modules: .*redis" "$top/gcc-$t.version" ||
        fail "gcc-$t: --version lists no modules: $(cat "$top/gcc-$t.version")"
done
# the statements of every PostgreSQL mode, run once under fortify
(cd "$top/gcc-Release" && ctest -R '^store[.]pg(_advisory)?$' --output-on-failure \
    >../gcc-Release.pg.log 2>&1) ||
    { tail -40 "$top/gcc-Release.pg.log"; fail "gcc-Release: the PostgreSQL store under _FORTIFY_SOURCE"; }
build clang-Release clang -DCMAKE_BUILD_TYPE=Release -DDLOCK_TESTS=ON

build builtin gcc -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLOCK_MODULES=OFF -DDLOCK_TESTS=OFF
grep -q "^stores built in: file mem redis .*mysql" "$top/builtin.version" ||
    fail "builtin: not every store is built in: $(cat "$top/builtin.version")"
ls "$top"/builtin/dlock-*/*.so >/dev/null 2>&1 && fail "builtin: modules were built"

build left-out gcc -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLOCK_WITH_PG=OFF -DDLOCK_WITH_MYSQL=OFF \
    -DDLOCK_EXPORTER=OFF -DDLOCK_WITH_REDIS_TLS=OFF -DDLOCK_TESTS=OFF
grep -q "stores left out of this build: postgres (needs libpq-dev); mysql (needs libmariadb-dev); rediss (needs libssl-dev)" \
    "$top/left-out.configure.log" || fail "left-out: CMake's summary does not name the stores left out"
grep -q "^stores missing: rediss postgres postgresql mysql mariadb" "$top/left-out.version" ||
    fail "left-out: --version: $(cat "$top/left-out.version")"
# Redis without TLS: rediss:// is refused naming the package, redis://
# still there
out=$("$top/left-out/dlock" run --store rediss://127.0.0.1:1 x -- true 2>&1)
rc=$?
[ $rc -eq 69 ] || fail "left-out: rediss:// exit $rc, not 69: $out"
echo "$out" | grep -q "libssl-dev" ||
    fail "left-out: rediss:// does not name the package: $out"
out=$("$top/left-out/dlock" run --store "redis://127.0.0.1:1?tls=1" x -- true 2>&1)
rc=$?
[ $rc -eq 69 ] || fail "left-out: redis://?tls=1 exit $rc, not 69: $out"
echo "$out" | grep -q "libssl-dev" ||
    fail "left-out: redis://?tls=1 does not name the package: $out"
out=$("$top/left-out/dlock" run --store postgres://u@127.0.0.1/db x -- true 2>&1)
rc=$?
[ $rc -eq 69 ] || fail "left-out: postgres:// exit $rc, not 69: $out"
echo "$out" | grep -q "built without the postgres:// store.*libpq-dev" ||
    fail "left-out: the message does not name the package: $out"
# the exporter left out (as without libmicrohttpd-dev): a clear refusal
out=$("$top/left-out/dlock" exporter --listen 127.0.0.1:1 2>&1)
rc=$?
[ $rc -eq 69 ] || fail "left-out: dlock exporter exit $rc, not 69: $out"
echo "$out" | grep -q "libmicrohttpd-dev" ||
    fail "left-out: the exporter's refusal does not name the package: $out"
echo "build-matrix: every build built ($top/)"
