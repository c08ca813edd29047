#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# load.sh KIND ARGS... -- prints how many requests a private bench server
# has received so far, for dlock_bench_contend --load (the difference
# over a run, per critical section, is the store load of a hand-off):
#   redis PORT...   commands the servers ran (INFO commandstats, the
#                   commands run inside scripts included)
#   zk PORT         packets the server received (mntr zk_packets_received)
#   etcd PORT       gRPC messages the member received (its /metrics:
#                   grpc_server_msg_received_total; the JSON gateway's
#                   requests reach it as gRPC too)
#   pg PORT         transactions (pg_stat_database xact_commit + rollback)
#   mysql PORT      statements (SHOW GLOBAL STATUS Questions)
# (passwords: the bench servers' fixed test ones, never a real secret)
set -euo pipefail
kind=$1
shift
case $kind in
redis)
    for p in "$@"; do redis-cli -p "$p" info commandstats; done |
        awk -F'[=,]' '/^cmdstat_/ { s += $2 } END { print s + 0 }' ;;
zk)
    exec 3<>"/dev/tcp/127.0.0.1/$1"
    echo mntr >&3
    timeout 3 cat <&3 | awk '$1 == "zk_packets_received" { print $2 }' ;;
etcd)
    curl -sf "http://127.0.0.1:$1/metrics" |
        awk '/^grpc_server_msg_received_total/ { s += $NF } END { printf "%.0f\n", s }' ;;
pg)
    PGPASSWORD=dlock-secret psql -X -q -At -h 127.0.0.1 -p "$1" -U dlock postgres \
        -c 'SELECT sum(xact_commit + xact_rollback) FROM pg_stat_database' ;;
mysql)
    mariadb --no-defaults -h127.0.0.1 -P"$1" -udlock -pdlock-secret -N \
        -e "SHOW GLOBAL STATUS LIKE 'Questions'" | awk '{ print $2 }' ;;
*)
    echo "load.sh: unknown kind $kind" >&2
    exit 2 ;;
esac
