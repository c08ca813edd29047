#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# sqlserver.sh pg|mysql DIR PORT [CERT KEY] -- a private PostgreSQL or
# MariaDB server for the tests and the benchmarks, never a system service.
#
# Creates the server's data in DIR on the first call (initdb /
# mariadb-install-db), then replaces itself (exec) with the server in the
# foreground, listening on 127.0.0.1:PORT and on a Unix socket in DIR, its
# log in DIR/server.log. The caller kills it when done. CERT and KEY (PEM
# files) turn TLS on.
#
#   pg:    superuser "dlock", password "dlock-secret" (scram-sha-256 over
#          TCP, trust over the socket DIR/.s.PGSQL.PORT); database
#          "postgres". fsync off unless DLOCK_SQL_DURABLE=1.
#          DLOCK_SQL_AUTH=password: the password in clear over TCP
#          instead (the valgrind build: libpq's SCRAM runs 4096 HMAC
#          rounds through OpenSSL, half a second per connection under
#          valgrind, past the tests' 2 s timeouts when a client opens
#          several at once; the server checks it against the same
#          SCRAM-stored password).
#   mysql: user 'dlock'@'%', password "dlock-secret", every privilege;
#          root without a password over the socket DIR/mysql.sock;
#          database "dlocktest". The log is flushed once a second
#          (innodb_flush_log_at_trx_commit=2) unless DLOCK_SQL_DURABLE=1.
#
# As root, PostgreSQL (which refuses root) runs as the user postgres (made
# by Debian's postgresql package), else nobody; DIR must then be reachable
# by that user. The server dies with its parent (--pdeathsig / prctl).
#
# DLOCK_TEST_CACHE=CACHE (set by CTest for every test of a build, and by
# `make safety`): the data directory initdb / mariadb-install-db made is
# kept in CACHE/sql-* the first time, before its server ever ran, and
# copied from there into DIR after that (cp -a: owner and modes kept):
# 0.2 s instead of 1.5 to 4 s, with the same files. One copy per kind,
# auth (DLOCK_SQL_AUTH), durability, server version and user: a copy
# made another way is never taken. Made in a directory of its own and
# renamed into place under a lock (flock CACHE/.sql.lock), so that a copy
# is whole or absent. Without it (or when copying fails) DIR is made as
# above.
set -eu

if [ $# -ne 3 ] && [ $# -ne 5 ]; then
    echo "usage: $0 pg|mysql DIR PORT [CERT KEY]" >&2
    exit 2
fi
kind=$1
dir=$2
port=$3
cert=${4:-}
key=${5:-}
password=dlock-secret
durable=${DLOCK_SQL_DURABLE:-0}
pgauth=${DLOCK_SQL_AUTH:-scram-sha-256}
case $pgauth in
scram-sha-256 | password) ;;
*)
    echo "sqlserver.sh: DLOCK_SQL_AUTH must be scram-sha-256 or password, not '$pgauth'" >&2
    exit 2
    ;;
esac
cache=${DLOCK_TEST_CACHE:-}

# from_cache NAME: DIR/data copied from CACHE/NAME; 1 when there is none
# (or the copy failed: DIR/data is then gone)
from_cache() {
    [ -n "$cache" ] && [ -d "$cache/$1" ] && [ ! -e "$dir/data" ] || return 1
    cp -a "$cache/$1" "$dir/data" 2>/dev/null && return 0
    rm -rf "$dir/data"
    return 1
}
# to_cache NAME: DIR/data, not yet used by a server, kept as CACHE/NAME
# (once: a copy already there stays; nothing fails if it cannot be kept)
to_cache() {
    [ -n "$cache" ] || return 0
    mkdir -p "$cache" 2>/dev/null || return 0
    (
        flock 9
        [ -d "$cache/$1" ] && exit 0
        rm -rf "$cache/$1.new"
        if cp -a "$dir/data" "$cache/$1.new"; then
            mv -T "$cache/$1.new" "$cache/$1"
        fi
        rm -rf "$cache/$1.new"
    ) 9>"$cache/.sql.lock" 2>/dev/null || true
}

case $kind in
pg)
    bin=
    for d in /usr/lib/postgresql/*/bin; do
        [ -x "$d/postgres" ] && bin=$d
    done
    if [ -z "$bin" ]; then
        echo "sqlserver.sh: no PostgreSQL server (apt-get install postgresql)" >&2
        exit 1
    fi
    run=()
    if [ "$(id -u)" = 0 ]; then
        user=postgres
        id "$user" >/dev/null 2>&1 || user=nobody
        run=(setpriv "--reuid=$user" "--regid=$(id -g "$user")" --init-groups --pdeathsig SIGKILL --)
    fi
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        # what the copy depends on: pg_hba.conf's auth, postgresql.conf's
        # fsync, initdb's version, the files' owner
        name=sql-pg${bin//[^0-9]/}-$pgauth-durable$durable-uid$(id -u)
        if from_cache "$name"; then
            if [ "$(id -u)" = 0 ]; then
                chown -R "$user" "$dir"
            fi
        else
            mkdir -p "$dir/data"
            printf '%s\n' "$password" >"$dir/pwfile"
            if [ "$(id -u)" = 0 ]; then
                chown -R "$user" "$dir"
            fi
            chmod 700 "$dir/data"
            "${run[@]}" "$bin/initdb" -D "$dir/data" -U dlock --pwfile="$dir/pwfile" \
                --auth-local=trust --auth-host="$pgauth" -E UTF8 --locale=C \
                --no-sync --no-instructions >"$dir/initdb.log" 2>&1 || {
                cat "$dir/initdb.log" >&2
                exit 1
            }
            rm -f "$dir/pwfile"
            {
                echo "listen_addresses = '127.0.0.1'"
                echo "shared_buffers = 32MB"
                echo "log_min_messages = warning"
                echo "log_connections = off"
                # fsync off: a killed server loses nothing (the WAL is in
                # the OS's cache), only a machine crash would; commits
                # stay synchronous, or a kill would lose the last ones
                if [ "$durable" != 1 ]; then
                    echo "fsync = off"
                    echo "full_page_writes = off"
                fi
            } >>"$dir/data/postgresql.conf"
            to_cache "$name"
        fi
        # this server's own: not in the copy
        echo "unix_socket_directories = '$dir'" >>"$dir/data/postgresql.conf"
    fi
    if [ -n "$cert" ]; then
        cp "$cert" "$dir/data/server.crt"
        cp "$key" "$dir/data/server.key"
        [ "$(id -u)" = 0 ] && chown "$user" "$dir/data/server.crt" "$dir/data/server.key"
        chmod 600 "$dir/data/server.key"
        ssl=(-c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key)
    else
        ssl=()
    fi
    exec "${run[@]}" "$bin/postgres" -D "$dir/data" -p "$port" "${ssl[@]}" \
        >>"$dir/server.log" 2>&1
    ;;
mysql)
    if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
        echo "sqlserver.sh: no MariaDB server (apt-get install mariadb-server)" >&2
        exit 1
    fi
    export PATH=$PATH:/usr/sbin
    asroot=()
    [ "$(id -u)" = 0 ] && asroot=(--user=root)
    # a temporary directory of its own: a MariaDB server deletes every
    # "#sql*" file in its tmpdir when it starts, so servers sharing /tmp
    # delete each other's on-disk temporary tables (a running query then
    # fails: "Error on delete of '/tmp/#sql-temptable-...'")
    mkdir -p "$dir/tmp"
    if [ ! -d "$dir/data/mysql" ]; then
        # what the copy depends on: the server's version, the files' owner
        name=sql-mysql$(mariadbd --version 2>/dev/null | awk '{print $3}' | cut -d- -f1)-uid$(id -u)
        if ! from_cache "$name"; then
            mkdir -p "$dir/data"
            mariadb-install-db --no-defaults --datadir="$dir/data" \
                --tmpdir="$dir/tmp" \
                --auth-root-authentication-method=normal --skip-test-db \
                "${asroot[@]}" >"$dir/install.log" 2>&1 || {
                cat "$dir/install.log" >&2
                exit 1
            }
            to_cache "$name"
        fi
        cat >"$dir/init.sql" <<EOF
CREATE USER IF NOT EXISTS 'dlock'@'%' IDENTIFIED BY '$password';
GRANT ALL ON *.* TO 'dlock'@'%' WITH GRANT OPTION;
CREATE DATABASE IF NOT EXISTS dlocktest;
EOF
    fi
    flush=2
    [ "$durable" = 1 ] && flush=1
    tls=()
    if [ -n "$cert" ]; then
        tls=("--ssl-cert=$cert" "--ssl-key=$key")
    fi
    exec setpriv --pdeathsig SIGKILL -- mariadbd --no-defaults "${asroot[@]}" \
        --datadir="$dir/data" --tmpdir="$dir/tmp" --port="$port" \
        --bind-address=127.0.0.1 --socket="$dir/mysql.sock" --pid-file="$dir/mysql.pid" \
        --init-file="$dir/init.sql" --skip-log-bin --skip-name-resolve \
        --innodb-buffer-pool-size=32M --innodb-log-file-size=32M \
        --innodb-flush-log-at-trx-commit=$flush \
        --log-error="$dir/server.log" "${tls[@]}"
    ;;
*)
    echo "sqlserver.sh: pg or mysql, not '$kind'" >&2
    exit 2
    ;;
esac
