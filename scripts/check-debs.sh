#!/bin/sh
# SPDX-License-Identifier: MIT
# check-debs.sh [--remove] [DIR] -- installs the Debian packages `make deb` built
# (DIR, default dist/; the -dbgsym ones left out) with apt-get, as root or
# through sudo, then checks them as their users would, from a temporary
# directory and none of the tree's files:
#   split   libdlock0 depends on libc alone, and each store package on its
#           own client library and no other store's
#   cli     /usr/bin/dlock runs, lists every store module as found in its
#           installed place, runs a command under a lock on the default
#           file store and on an SQLite file, loads each other store's
#           module (a connection refused by the store, not a module
#           missing), and `dlock exporter` serves /metrics
#   c       a C program built against the installed library with
#           pkg-config, and with CMake (find_package(dlock), dlock::dlock
#           and dlock::dlock_static), takes and releases a lock on a file
#           store in a temporary directory
#   python  Debian's /usr/bin/python3 imports dlock from dist-packages,
#           loads the system's libdlock.so.0 and takes a lock
# It installs into this machine: CI runs it last (.ci/run), with
# --remove, which purges the packages again at the end (pass or fail; not
# what they pulled in), so that a later run of the suite on the machine
# finds no system libdlock. Every wait is bounded; any failed check fails
# the script, naming it.
set -eu
fail() { echo "check-debs: FAILED: $*" >&2; exit 1; }
remove=
if [ "${1:-}" = --remove ]; then
    remove=1
    shift
fi
dir=$(cd "${1:-$(dirname "$0")/../dist}" && pwd) || fail "no directory ${1:-dist/}"

ok() { echo "check-debs: ok: $*"; }

set --
for f in "$dir"/*.deb; do
    case $f in *-dbgsym_*) continue ;; esac
    [ -e "$f" ] && set -- "$@" "$f"
done
[ $# -gt 0 ] || fail "no .deb in $dir (make deb builds them)"

if [ "$(id -u)" = 0 ]; then
    SUDO=
elif command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
else
    fail "installing the packages needs root or sudo"
fi
export DEBIAN_FRONTEND=noninteractive
echo "check-debs: installing $(for f; do printf '%s ' "${f##*/}"; done)"
timeout 600 $SUDO apt-get update -qq || fail "apt-get update"
# what the C checks build with (a new machine of the project's kind has them)
timeout 900 $SUDO apt-get install -y -q --no-install-recommends \
    gcc libc6-dev cmake make >/dev/null || fail "apt-get install gcc cmake"
# --reinstall: packages of the same version built again replace the
# installed ones
timeout 900 $SUDO apt-get install -y -q --no-install-recommends --reinstall \
    "$@" >/dev/null || fail "apt-get install of the packages"
ok "installed: $(dpkg-query -W -f='${Package} ${Version}\n' 'libdlock*' dlock 'dlock-*' python3-dlock | tr '\n' ' ')"

# nothing from the caller's environment or the tree: the installed files
# alone, found the way a user's program finds them
unset DLOCK_STORE DLOCK_MODULE_DIR DLOCK_LIBRARY LD_LIBRARY_PATH PYTHONPATH \
    PKG_CONFIG_PATH CMAKE_PREFIX_PATH 2>/dev/null || true
tmp=$(mktemp -d)
exporter=
names=$(for f; do printf '%s ' "$(dpkg-deb -f "$f" Package)"; done)
cleanup() {
    [ -n "$exporter" ] && kill "$exporter" 2>/dev/null
    cd /
    rm -rf "$tmp"
    if [ -n "$remove" ]; then
        # shellcheck disable=SC2086 # one name a word
        if timeout 300 $SUDO apt-get purge -y -q $names >/dev/null; then
            echo "check-debs: removed $names"
        else
            echo "check-debs: could not remove $names" >&2
        fi
    fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM
cd "$tmp"

# --- split: the dependencies that make the packages worth splitting --------
deps() { dpkg-query -W -f='${Depends}' "$1"; }
d=$(deps libdlock0)
[ "$(echo "$d" | sed 's/ *([^)]*)//g')" = libc6 ] ||
    fail "libdlock0 depends on more than libc6: $d"
for pair in redis:libhiredis zookeeper:libzookeeper etcd:libcurl sqlite:libsqlite3 \
    postgresql:libpq mysql:libmariadb; do
    pkg=libdlock0-${pair%%:*}
    d=$(deps "$pkg")
    case $d in *"libdlock0 (= "*) ;; *) fail "$pkg does not depend on its libdlock0: $d" ;; esac
    case $d in *"${pair#*:}"*) ;; *) fail "$pkg does not depend on ${pair#*:}: $d" ;; esac
    for other in libhiredis libzookeeper libcurl libsqlite3 libpq libmariadb; do
        [ "$other" = "${pair#*:}" ] && continue
        case $d in *"$other"*) fail "$pkg depends on another store's $other: $d" ;; esac
    done
done
ok "split: libdlock0 needs libc6 alone; each store package its own client library"

# --- cli --------------------------------------------------------------------
[ "$(command -v dlock)" = /usr/bin/dlock ] || fail "dlock is $(command -v dlock), not /usr/bin/dlock"
v=$(timeout 10 dlock --version) || fail "dlock --version"
echo "$v" | sed 's/^/    /'
mods=$(echo "$v" | sed -n 's/^stores as modules: //p')
for m in redis zk etcd sqlite postgres mysql; do
    case " $mods " in *" $m "*) ;; *) fail "dlock --version does not find the $m module" ;; esac
done
case $v in *missing*) fail "dlock --version says a store is missing" ;; esac
ok "dlock --version: every store module found"

# a command under a lock on the default store (~/.local/state/dlock)
name=check-debs-$$
# shellcheck disable=SC2016 # the command's own variable
timeout 60 dlock run --wait 10s "$name" -- sh -c 'echo "$DLOCK_TOKEN" >ran' ||
    fail "dlock run on the default file store"
[ -s ran ] || fail "dlock run did not run the command"
store=$(timeout 10 dlock status "$name" | sed -n 's/^store: *//p')
case $store in file://*) ;; *) fail "the default store is '$store', not a file store" ;; esac
ok "dlock run on the default store ($store): token $(cat ran)"

timeout 60 dlock run --store "sqlite://$tmp/locks.db" --wait 10s "$name" -- true ||
    fail "dlock run on an SQLite store (libdlock0-sqlite)"
ok "dlock run on sqlite://$tmp/locks.db"

# every other store's module loads (with its client library) from its
# installed place: no server listens on port 1, so the store's own
# client says so; a module that cannot be found or loaded says "module"
for uri in redis://127.0.0.1:1 zk://127.0.0.1:1 etcd://127.0.0.1:1 \
    postgres://127.0.0.1:1/x "postgres://127.0.0.1:1/x?mode=advisory" \
    mysql://127.0.0.1:1/x; do
    rc=0
    timeout 30 dlock status --store "$uri" x >/dev/null 2>err || rc=$?
    [ "$rc" != 0 ] || fail "dlock status --store $uri succeeded with no server"
    [ "$rc" != 124 ] || fail "dlock status --store $uri took over 30 s"
    if grep -q -i -e module -e '\.so' err; then
        fail "${uri%%:*}'s module did not load: $(cat err)"
    fi
    grep -q -i -e connect -e answered err || fail "dlock status --store $uri: $(cat err)"
    echo "    $(cat err)"
done
ok "the redis, zk, etcd, postgres (table and advisory) and mysql modules load"

timeout 30 dlock exporter --listen 127.0.0.1:0 --store "file://$tmp/exp" >exp.out 2>&1 &
exporter=$!
url=
for _ in $(seq 100); do
    url=$(sed -n 's/.*listening on \(http:[^ ]*\).*/\1/p' exp.out)
    [ -n "$url" ] && break
    kill -0 "$exporter" 2>/dev/null || break
    sleep 0.1
done
[ -n "$url" ] || fail "dlock exporter did not start: $(cat exp.out)"
/usr/bin/python3 -c '
import sys, urllib.request
body = urllib.request.urlopen(sys.argv[1], timeout=10).read().decode()
sys.exit(0 if "dlock_exporter_up" in body else "no dlock_exporter_up in /metrics")
' "$url" || fail "dlock exporter's $url"
kill "$exporter"
wait "$exporter" 2>/dev/null || true
exporter=
ok "dlock exporter (dlock-exporter) served $url"

# --- c ----------------------------------------------------------------------
mkdir app
cat >app/hello.c <<'EOF'
#include <dlock.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    dlock_client *c;
    dlock *l;
    int rc;

    if (argc != 2)
        return 2;
    if (dlock_client_open(&c, argv[1], NULL) != DLOCK_OK) {
        fprintf(stderr, "open %s: %s\n", argv[1], dlock_errmsg());
        return 1;
    }
    if (dlock_open(&l, c, "check-debs", NULL) != DLOCK_OK) {
        fprintf(stderr, "dlock_open: %s\n", dlock_errmsg());
        return 1;
    }
    if ((rc = dlock_acquire(l, 5000)) != DLOCK_OK) {
        fprintf(stderr, "dlock_acquire: %s\n", dlock_strerror(rc));
        return 1;
    }
    unsigned long long token = (unsigned long long)dlock_token(l);
    if ((rc = dlock_release(l)) != DLOCK_OK) {
        fprintf(stderr, "dlock_release: %s\n", dlock_strerror(rc));
        return 1;
    }
    dlock_close(l);
    dlock_client_close(c);
    printf("held and released, token %llu, libdlock %s\n", token, dlock_version());
    return 0;
}
EOF
# shellcheck disable=SC2046
timeout 120 cc -Wall -o hello-pc app/hello.c $(pkg-config --cflags --libs dlock) ||
    fail "building with pkg-config (pkg-config --cflags --libs dlock)"
lib=$(ldd ./hello-pc | sed -n 's/.*libdlock\.so\.0 => \([^ ]*\).*/\1/p')
case $lib in /usr/lib/*|/lib/*) ;; *) fail "hello-pc finds libdlock.so.0 at '$lib'" ;; esac
out=$(timeout 30 ./hello-pc "file://$tmp/c-store") || fail "the pkg-config build's run"
ok "pkg-config build ($lib): $out"

cat >app/CMakeLists.txt <<'EOF'
cmake_minimum_required(VERSION 3.16)
project(check_debs LANGUAGES C)
find_package(dlock 0.1 CONFIG REQUIRED)
add_executable(hello-cmake hello.c)
target_link_libraries(hello-cmake PRIVATE dlock::dlock)
add_executable(hello-static hello.c)
target_link_libraries(hello-static PRIVATE dlock::dlock_static)
EOF
if ! timeout 300 cmake -S app -B app-build >cmake.log 2>&1 ||
    ! timeout 300 cmake --build app-build >>cmake.log 2>&1; then
    cat cmake.log
    fail "building with CMake (find_package(dlock))"
fi
out=$(timeout 30 app-build/hello-cmake "file://$tmp/c-store") || fail "the CMake build's run"
ok "CMake build, dlock::dlock: $out"
if ldd app-build/hello-static | grep -q libdlock; then
    fail "hello-static links libdlock.so"
fi
out=$(timeout 30 app-build/hello-static "file://$tmp/c-store") || fail "the static build's run"
ok "CMake build, dlock::dlock_static (libdlock.a): $out"

# --- python -----------------------------------------------------------------
out=$(timeout 60 /usr/bin/python3 -I -c '
import sys
import dlock
assert dlock.__file__.startswith("/usr/lib/python3/dist-packages/dlock/"), dlock.__file__
with dlock.Client("file://" + sys.argv[1]) as client:
    with client.lock("check-debs", ttl=30) as lock:
        token = lock.token
maps = [l.split()[-1] for l in open("/proc/self/maps") if "libdlock.so" in l]
print("dlock", dlock.__version__, "from", dlock.__file__, "with", maps[0],
      "took token", token)
' "$tmp/py-store") || fail "python3: import dlock and take a lock"
case $out in *" with /usr/lib/"*|*" with /lib/"*) ;; *) fail "python3 loaded another libdlock: $out" ;; esac
# the guide the docstrings point to, beside the modules
grep -q "^# dlock for Python" /usr/lib/python3/dist-packages/dlock/python.md ||
    fail "python3-dlock lacks dlock/python.md"
ok "python3: $out"

echo "check-debs: every check passed"
