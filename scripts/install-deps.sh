#!/bin/sh
# SPDX-License-Identifier: MIT
# install-deps.sh GROUP... -- installs the Debian packages dlock needs for
# the given groups, when they are missing (apt-get; as root, or with sudo).
#   build     compiler, cmake, pkg-config, hiredis, OpenSSL (Redis over
#             TLS), the ZooKeeper C client, libcurl and cJSON (etcd),
#             SQLite, libpq (PostgreSQL), MariaDB Connector/C,
#             libmicrohttpd (the `dlock exporter` command), libyaml,
#             libxcrypt and GnuTLS (its --web.config.file: TLS, basic auth)
#   test      redis-server, zookeeper, etcd, postgresql, pgbouncer and mariadb-server
#             (started by the tests themselves, never as system services),
#             their command-line clients, faketime (clock-skew tests),
#             prometheus and promtool (the exporter's and the alert rules'
#             tests), curl, openssl (the TLS tests' certificates),
#             apache2-utils (htpasswd: the exporter test's bcrypt hashes
#             once Python's crypt module is gone);
#             python3-pytest, pip, setuptools, wheel and mypy (the
#             Python package, python/, its tests and types), and what
#             `wheel` below installs (the tests build a wheel, make a
#             venv and install into it offline)
#   wheel     python3-venv, pip and Debian's wheels of pip, setuptools
#             and wheel (/usr/share/python-wheels: `make wheel` and
#             `pip install --no-index --find-links /usr/share/python-wheels
#             ./python` build offline from them)
#   deb       dpkg-dev, debhelper, dh-python and build-essential (make deb:
#             dpkg-buildpackage; no fakeroot, the build needs no root:
#             debian/control's Rules-Requires-Root) and lintian
#   asan      clang and its sanitizer runtime
#   valgrind  valgrind
#   busy      stress-ng (make test-busy: the suite on a busy machine)
#   bench     what the benchmarks compare against (the servers; Node.js and
#             npm for node-redlock, which the bench installs from npm;
#             python3-redis, python3-kazoo and python3-etcd3 for the Python
#             peers; gnuplot for the charts)
set -eu

pkgs=""
for group in "$@"; do
    case $group in
    build) pkgs="$pkgs cmake make gcc libc6-dev pkg-config libhiredis-dev libssl-dev libzookeeper-mt-dev libcurl4-openssl-dev libcjson-dev libsqlite3-dev libpq-dev libmariadb-dev libmicrohttpd-dev libyaml-dev libcrypt-dev libgnutls28-dev" ;;
    test) pkgs="$pkgs redis-server redis-tools zookeeper etcd-server etcd-client openssl python3 python3-pytest python3-pip python3-setuptools python3-wheel python3-mypy python3-venv python3-pip-whl python3-setuptools-whl python3-wheel-whl postgresql postgresql-client pgbouncer mariadb-server mariadb-client faketime iproute2 prometheus curl apache2-utils" ;;
    wheel) pkgs="$pkgs python3 python3-venv python3-pip python3-pip-whl python3-setuptools-whl python3-wheel-whl" ;;
    deb) pkgs="$pkgs build-essential dpkg-dev debhelper dh-python lintian" ;;
    asan) pkgs="$pkgs clang libclang-rt-14-dev" ;;
    valgrind) pkgs="$pkgs valgrind" ;;
    busy) pkgs="$pkgs stress-ng" ;;
    bench) pkgs="$pkgs curl redis-server redis-tools zookeeper etcd-server etcd-client postgresql postgresql-client mariadb-server mariadb-client nodejs npm gnuplot-nox python3-redis python3-kazoo python3-etcd3 openssl" ;;
    *) echo "install-deps: unknown group '$group'" >&2; exit 2 ;;
    esac
done

missing=""
for p in $pkgs; do
    case " $missing " in *" $p "*) continue ;; esac
    # a Node.js from elsewhere (NodeSource's nodejs package carries its own
    # npm and conflicts with Debian's): the commands are what counts
    case $p in
    nodejs) command -v node >/dev/null 2>&1 && continue ;;
    npm) command -v npm >/dev/null 2>&1 && continue ;;
    esac
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" = 0 ]; then
    SUDO=
elif command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
else
    echo "install-deps: these packages are missing and I am not root:$missing" >&2
    exit 1
fi
echo "install-deps: installing$missing"

# Packages like redis-server would start a system service on install; dlock
# never uses one. Forbid service starts for the duration (policy-rc.d), and
# disable the service afterwards on systemd machines.
policy=/usr/sbin/policy-rc.d
ours=
if [ ! -e $policy ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee $policy >/dev/null
    $SUDO chmod 755 $policy
    ours=1
fi
cleanup() { if [ -n "$ours" ]; then $SUDO rm -f $policy; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -q --no-install-recommends $missing >/dev/null
if [ -d /run/systemd/system ]; then
    for svc in redis-server zookeeper etcd postgresql pgbouncer mariadb prometheus; do
        case " $missing " in
        *" $svc "* | *" $svc-server "*) $SUDO systemctl disable --now $svc >/dev/null 2>&1 || true ;;
        esac
    done
fi
echo "install-deps: done"
