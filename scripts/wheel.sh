#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# wheel.sh [-b BUILD] [-o DIR] -- the Python package as a wheel that
# carries libdlock and its store modules (`make wheel`; docs/python.md,
# "Installing"): DIR/libdlock-<version>-py3-none-<platform>.whl, DIR
# dist/ at the top of the source tree by default.
#   without -b: configures and builds build-wheel/ (Release, no tests, no
#               benchmarks, the stores as modules)
#   -b BUILD:   takes the library and modules of that build tree as they
#               are (the tests: tests/python/wheel_venv.sh)
# The build is installed into a staging prefix (cmake --install: no
# build-tree RUNPATH, stripped); a staged copy of python/ gets
# dlock/_lib/libdlock.so.0 (a file, not a link) and
# dlock/_lib/dlock-<version>/*.so, which python/setup.py sees and tags
# the wheel py3-none-<platform>; pip builds it offline from Debian's
# wheels of setuptools and wheel (python3-setuptools-whl,
# python3-wheel-whl) when they are there, else from the index.
# $PYTHON: the interpreter whose pip builds (default /usr/bin/python3:
# Debian's setuptools wheel works with Debian's Python only).
set -eu

src=$(cd "$(dirname "$0")/.." && pwd)
build=
out=$src/dist
while getopts b:o: opt; do
    case $opt in
    b) build=$(cd "$OPTARG" && pwd) ;;
    o) mkdir -p "$OPTARG" && out=$(cd "$OPTARG" && pwd) ;;
    *) echo "usage: $0 [-b BUILD] [-o DIR]" >&2; exit 2 ;;
    esac
done
PYTHON=${PYTHON:-/usr/bin/python3}
[ -x "$PYTHON" ] || PYTHON=python3
WHEELS=${WHEELS:-/usr/share/python-wheels}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}

if [ -z "$build" ]; then
    build=$src/build-wheel
    cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDLOCK_TESTS=OFF \
        -DDLOCK_BENCH=OFF -DDLOCK_MODULES=ON >/dev/null
    cmake --build "$build" -j"$JOBS"
fi

stage=$(mktemp -d "${TMPDIR:-/tmp}/dlock-wheel-XXXXXX")
trap 'rm -rf "$stage"' EXIT
cmake --install "$build" --prefix "$stage/prefix" --strip >"$stage/install.log" 2>&1 ||
    { cat "$stage/install.log" >&2; echo "wheel: cmake --install $build failed" >&2; exit 1; }
lib=$(find "$stage/prefix" -name libdlock.so.0 | head -n1)
[ -n "$lib" ] || { echo "wheel: no libdlock.so.0 installed from $build" >&2; exit 1; }
libdir=$(dirname "$lib")

# the package: python/ with its links followed (dlock/python.md is
# docs/python.md), without build leftovers and tests
mkdir "$stage/python"
(cd "$src/python" && tar -ch --exclude=./build --exclude='./*.egg-info' \
    --exclude=__pycache__ --exclude=./tests --exclude=./dlock/_lib .) |
    (cd "$stage/python" && tar -x)
[ -f "$stage/python/dlock/python.md" ] || { echo "wheel: dlock/python.md is missing" >&2; exit 1; }
mkdir "$stage/python/dlock/_lib"
cp -L "$lib" "$stage/python/dlock/_lib/libdlock.so.0"
for d in "$libdir"/dlock-*/; do
    [ -d "$d" ] || continue
    mkdir "$stage/python/dlock/_lib/$(basename "$d")"
    cp -L "$d"*.so "$stage/python/dlock/_lib/$(basename "$d")/"
done

# the staged package loads its own library (the version check included)
env -u DLOCK_LIBRARY PYTHONPATH="$stage/python" "$PYTHON" -c '
import sys, dlock
assert dlock._native.PATH == sys.argv[1], dlock._native.PATH
' "$stage/python/dlock/_lib/libdlock.so.0" ||
    { echo "wheel: the staged package does not load its library" >&2; exit 1; }

if ls "$WHEELS"/setuptools-*.whl >/dev/null 2>&1; then
    offline="--no-index --find-links $WHEELS"
else
    offline=
fi
mkdir -p "$out"
# shellcheck disable=SC2086
"$PYTHON" -m pip wheel --quiet --no-deps $offline -w "$stage/dist" "$stage/python" \
    >"$stage/pip.log" 2>&1 ||
    { cat "$stage/pip.log" >&2; echo "wheel: pip wheel failed" >&2; exit 1; }
for w in "$stage/dist"/*.whl; do
    case $w in
    *-py3-none-any.whl) echo "wheel: $w is a pure wheel: setup.py did not see dlock/_lib" >&2; exit 1 ;;
    esac
    cp "$w" "$out/"
    echo "$out/$(basename "$w")"
done
