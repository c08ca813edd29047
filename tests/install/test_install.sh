#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# test_install.sh SRC BUILD -- `cmake --install` into a temporary prefix,
# then build the README's example against it with pkg-config and with the
# CMake package (find_package(dlock CONFIG)), both with the shared and the
# static library, and run them on a temporary file store.
set -u
src=$1
build=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlock-install-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log"; fail "cmake --install failed"; }
p=$tmp/prefix
for f in include/dlock.h lib/libdlock.so lib/libdlock.a lib/pkgconfig/dlock.pc \
         bin/dlock share/man/man1/dlock.1; do
    [ -e "$p/$f" ] || fail "$f is not installed"
done
echo "ok   installed files"

export PKG_CONFIG_PATH=$p/lib/pkgconfig
cflags=$(pkg-config --cflags dlock) || fail "pkg-config --cflags dlock"
libs=$(pkg-config --libs dlock) || fail "pkg-config --libs dlock"
cc -std=c11 -Wall -Wextra -Werror $cflags "$src/examples/hello.c" -o "$tmp/hello" $libs ||
    fail "building the example with pkg-config"
out=$(LD_LIBRARY_PATH=$p/lib "$tmp/hello" "file://$tmp/locks") || fail "the example failed"
case $out in "held, fencing token "[1-9]*) ;; *) fail "unexpected output: $out" ;; esac
echo "ok   example against the shared library: $out"

slibs=$(pkg-config --static --libs dlock) || fail "pkg-config --static --libs dlock"
cc -std=c11 $cflags "$src/examples/hello.c" -o "$tmp/hello-static" \
    -Wl,-Bstatic -ldlock -Wl,-Bdynamic $(echo "$slibs" | sed 's/-ldlock//') ||
    fail "building the example against libdlock.a"
ldd "$tmp/hello-static" | grep -q libdlock && fail "the static build still needs libdlock.so"
out=$("$tmp/hello-static" "file://$tmp/locks") || fail "the static example failed"
echo "ok   example against the static library: $out"

# the CMake package: find_package(dlock CONFIG), dlock::dlock and
# dlock::dlock_static, from a project of its own
[ -f "$p/lib/cmake/dlock/dlockConfig.cmake" ] || fail "dlockConfig.cmake is not installed"
cmake -S "$src/tests/install/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$p" \
    -DEXAMPLE="$src/examples/hello.c" >"$tmp/consumer.log" 2>&1 ||
    { cat "$tmp/consumer.log"; fail "configuring a project with find_package(dlock CONFIG)"; }
cmake --build "$tmp/consumer" >>"$tmp/consumer.log" 2>&1 ||
    { cat "$tmp/consumer.log"; fail "building against dlock::dlock and dlock::dlock_static"; }
out=$(LD_LIBRARY_PATH=$p/lib "$tmp/consumer/hello" "file://$tmp/locks") ||
    fail "the example built with dlock::dlock failed"
case $out in "held, fencing token "[1-9]*) ;; *) fail "unexpected output: $out" ;; esac
ldd "$tmp/consumer/hello_static" | grep -q libdlock &&
    fail "the dlock::dlock_static build still needs libdlock.so"
out=$("$tmp/consumer/hello_static" "file://$tmp/locks") ||
    fail "the example built with dlock::dlock_static failed"
echo "ok   find_package(dlock CONFIG): dlock::dlock and dlock::dlock_static"

v=$("$p/bin/dlock" --version) || fail "installed dlock --version"
echo "$v" | grep -q "^dlock " || fail "installed dlock --version: $v"
# the modules installed beside the library, found there from any prefix
mods=$(cd "$p/lib" && ls dlock-*/*.so 2>/dev/null)
if [ -n "$mods" ]; then
    echo "$v" | grep -q "^stores as modules: .*redis" ||
        fail "the installed dlock does not find its modules ($mods): $v"
    # a store whose module loads tries to connect (nothing listens there)
    "$p/bin/dlock" run --store redis://127.0.0.1:1 m -- true 2>"$tmp/err"
    grep -q "not installed\|cannot be loaded" "$tmp/err" &&
        fail "the installed redis module does not load: $(cat "$tmp/err")"
    echo "ok   installed modules: $(echo $mods)"
fi
MANPATH=$p/share/man man -w dlock >/dev/null 2>&1 || [ -s "$p/share/man/man1/dlock.1" ] ||
    fail "man page"
echo "ok   installed dlock runs"

# the Python package, installed with pip from the source tree (a copy, its
# links followed: pip writes its build files beside the sources, and
# dlock/python.md links to ../../docs/python.md), with the system's
# setuptools and wheel (no build isolation), over the installed library:
# loaded by name, as on a user's machine (here LD_LIBRARY_PATH stands for
# the linker cache of a system-wide install), with its modules beside it
if /usr/bin/python3 -m pip --version >/dev/null 2>&1; then
    cp -rL "$src/python" "$tmp/pysrc"
    rm -rf "$tmp/pysrc/build" "$tmp/pysrc/"*.egg-info "$tmp/pysrc/dlock/_lib"
    env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null /usr/bin/python3 -m pip install \
        --quiet --no-build-isolation --no-deps --no-index \
        --target "$tmp/site" "$tmp/pysrc" >"$tmp/pip.log" 2>&1 ||
        { cat "$tmp/pip.log"; fail "pip install ./python"; }
    [ -f "$tmp/site/dlock/py.typed" ] || fail "the Python package lacks py.typed"
    [ -f "$tmp/site/dlock/python.md" ] || fail "the Python package lacks python.md"
    [ -e "$tmp/site/dlock/_lib" ] && fail "the Python package from the source carries a library"
    out=$(cd "$tmp" && env -u DLOCK_LIBRARY LD_LIBRARY_PATH="$p/lib" PYTHONPATH="$tmp/site" \
        /usr/bin/python3 -c '
import sys, dlock
assert dlock.__file__.startswith(sys.argv[1]), dlock.__file__
with dlock.Client("file://" + sys.argv[2]) as c, c.lock("py-installed") as l:
    print("held, fencing token", l.token, "; stores:", " ".join(sorted(dlock.stores())))
' "$tmp/site" "$tmp/locks") || fail "the pip-installed package failed: $out"
    case $out in "held, fencing token "[1-9]*redis*) ;; *) fail "unexpected output: $out" ;; esac
    echo "ok   pip install ./python: $out"
else
    echo "FAIL: pip missing (scripts/install-deps.sh test installs it)" >&2
    exit 1
fi
