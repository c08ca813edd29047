#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# pgbouncer.sh DIR PORT PGPORT MODE -- a private PgBouncer for the tests,
# never a system service.
#
# Writes DIR/pgbouncer.ini and DIR/userlist.txt, then replaces itself
# (exec) with pgbouncer in the foreground, listening on 127.0.0.1:PORT (no
# Unix socket) in front of the private PostgreSQL that sqlserver.sh runs on
# 127.0.0.1:PGPORT, pool_mode MODE (session or transaction), its log in
# DIR/pgbouncer.log. Clients log in as the server's user dlock, password
# "dlock-secret", with SCRAM (the server's own auth): the auth file holds
# the password, so PgBouncer logs in to the server with it too. Every
# other setting is PgBouncer's default (pool sizes, timeouts,
# server_reset_query DISCARD ALL). DLOCK_SQL_AUTH=password: clients send
# the password in clear (auth_type plain), for the reason sqlserver.sh
# gives. The caller kills it when done.
#
# As root (PgBouncer refuses root) it runs as the user postgres, else
# nobody; DIR must then be reachable by that user. It dies with its
# parent (--pdeathsig).
set -eu

if [ $# -ne 4 ]; then
    echo "usage: $0 DIR PORT PGPORT session|transaction" >&2
    exit 2
fi
dir=$1
port=$2
pgport=$3
mode=$4
bin=/usr/sbin/pgbouncer
[ -x "$bin" ] || bin=$(command -v pgbouncer || true)
if [ -z "$bin" ]; then
    echo "pgbouncer.sh: no pgbouncer (apt-get install pgbouncer)" >&2
    exit 1
fi
case $mode in
session | transaction) ;;
*)
    echo "pgbouncer.sh: pool mode session or transaction, not '$mode'" >&2
    exit 2
    ;;
esac

auth=scram-sha-256
[ "${DLOCK_SQL_AUTH:-}" = password ] && auth=plain
mkdir -p "$dir"
printf '"dlock" "dlock-secret"\n' >"$dir/userlist.txt"
cat >"$dir/pgbouncer.ini" <<EOF
[databases]
postgres = host=127.0.0.1 port=$pgport dbname=postgres

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir =
auth_type = $auth
auth_file = $dir/userlist.txt
pool_mode = $mode
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
chmod 600 "$dir/userlist.txt"
run=(setpriv --pdeathsig SIGKILL --)
if [ "$(id -u)" = 0 ]; then
    user=postgres
    id "$user" >/dev/null 2>&1 || user=nobody
    chown -R "$user" "$dir"
    run=(setpriv "--reuid=$user" "--regid=$(id -g "$user")" --init-groups
        --pdeathsig SIGKILL --)
fi
rm -f "$dir/pgbouncer.pid"
exec "${run[@]}" "$bin" "$dir/pgbouncer.ini"
