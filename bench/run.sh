#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run.sh BUILD_DIR [--quick] -- runs the benchmarks against a private
# redis-server (free loopback port, temporary directory, no persistence),
# a temporary file store, a Sentinel set (a primary, two replicas and three
# sentinels, private redis-servers), a Redis Cluster (three primaries and a
# replica of each, private redis-servers), a private redis-server with a TLS
# port beside its plain one (certificates made for the run by the openssl
# CLI), five private redis-servers for Redlock (beside
# node-redlock, which npm installs under BUILD_DIR/npm, never in the
# tree), a private standalone ZooKeeper server (free
# loopback port, temporary directory, no fsync) and a private etcd member
# (free loopback ports, temporary directory), then SQLite database files
# in the temporary directory, a private PostgreSQL server (free loopback
# port, temporary directory, fsync off) and a private MariaDB server (free
# loopback port, temporary directory, log flushed once a second), and writes
# docs/benchmarks.md (--quick: BUILD_DIR/benchmarks-quick.md).
set -euo pipefail
# the tree the build was made from: read now, not when the document is
# written (a commit made during a 14-minute run would be named instead)
rev=$(git -C "$(dirname "$0")/.." describe --always --dirty 2>/dev/null || echo '?')
build=${1:-build-bench}
quick=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-XXXXXX")
pid=
rlpids=
zkpid=
etcdpid=
pgpid=
mypid=
tlspid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
    [ -n "$tlspid" ] && kill "$tlspid" 2>/dev/null
    for p in $rlpids; do kill "$p" 2>/dev/null; done
    [ -n "$zkpid" ] && kill "$zkpid" 2>/dev/null
    [ -n "$etcdpid" ] && kill "$etcdpid" 2>/dev/null
    # SIGINT: PostgreSQL's fast shutdown (SIGTERM waits for its clients)
    [ -n "$pgpid" ] && kill -INT "$pgpid" 2>/dev/null
    [ -n "$mypid" ] && kill "$mypid" 2>/dev/null
    for p in $stpids; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
stpids=

# free_port [--bus]: a loopback port nothing listens on now (at random,
# 20000 to 32767: below the kernel's ephemeral range, where a client socket
# of the bench may hold a port nobody listens on); --bus: 20000 to 22767,
# with port + 10000 free too (a cluster node's bus port)
free_port() {
    local p span=12768 bus=${1:-}
    [ -n "$bus" ] && span=2768
    for _ in $(seq 100); do
        p=$((20000 + RANDOM % span))
        (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null && continue
        [ -n "$bus" ] && (exec 3<>/dev/tcp/127.0.0.1/$((p + 10000))) 2>/dev/null &&
            continue
        echo "$p"
        return 0
    done
    return 1
}

# spawn_redis NAME ARGS...: starts redis-server ARGS on a free port (its
# --port added; a sentinel's config file among ARGS gets `port` from it)
# and waits until it answers PING (2 s); another port if not, 10 tries.
# With spawn_bus set (a caller's local), the port's +10000 is free too (a
# cluster node's bus port). Sets SPAWN_PORT and SPAWN_PID; returns 1 if
# none started.
spawn_redis() {
    local name=$1 p pid
    shift
    for _ in $(seq 10); do
        p=$(free_port ${spawn_bus:+--bus}) || return 1
        redis-server "$@" --port "$p" --logfile "$tmp/$name-$p.log" &
        pid=$!
        for _ in $(seq 40); do
            if [ "$(redis-cli -p "$p" ping 2>/dev/null)" = PONG ]; then
                SPAWN_PORT=$p
                SPAWN_PID=$pid
                return 0
            fi
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    return 1
}

for _ in $(seq 50); do
    port=$((20000 + RANDOM % 40000))
    (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && continue
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --dir "$tmp" --logfile "$tmp/redis.log" &
    pid=$!
    for _ in $(seq 100); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && break
        sleep 0.05
    done
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    kill "$pid" 2>/dev/null || true
    pid=
done
[ -n "$pid" ] || { echo "bench: redis-server did not start" >&2; exit 1; }
mkdir -p "$tmp/locks"

out=$tmp/results.md
# shellcheck disable=SC2086 # $quick: nothing or --quick
"$build/bench/dlock_bench" "redis://127.0.0.1:$port" "$tmp/locks" $quick >"$out"
# --- Python peers (Debian packages, run by Debian's own python3; see
# bench/peer_py.py): one subsection each, appended to its store's section
# and beside dlock's figures of the same run
# table_fig FILE LABEL COLUMN: the first number of COLUMN in the first row
# of FILE's tables whose first cell starts with LABEL
table_fig() {
    awk -F'|' -v l="$2" -v c="$3" '
        index($2, l) == 2 { split($c, a, " "); print a[1]; exit }' "$1"
}
# py_peer KIND ADDRESS FILE PACKAGE CYCLE_LABEL HANDOFF_LABEL: measures
# the peer and prints its subsection (or why it was not measured)
py_peer() {
    local kind=$1 addr=$2 file=$3 pkg=$4 fig
    fig=$(awk '/^## /{n++} n<=1' "$file") # the section's own tables only
    if ! /usr/bin/python3 -c "import $kind" 2>/dev/null; then
        printf '### Beside the %s peer\n\nNot measured: no %s on this machine.\n\n' "$kind" "$pkg"
        return 0
    fi
    # shellcheck disable=SC2086 # $quick: nothing or --quick
    /usr/bin/python3 "$root/bench/peer_py.py" "$kind" "$addr" \
        "$(table_fig <(echo "$fig") "$5" 3)" \
        "$(table_fig <(echo "$fig") "$5" 4)" \
        "$(table_fig <(echo "$fig") "$6" 4)" $quick ||
        printf '### Beside the %s peer\n\nNot measured: its script failed (see the bench output).\n\n' "$kind"
}
# --- Contention (bench/bench_contend.c): N processes, one lock, each
# holding it 1 ms per turn, for dlock and the peers on each section's
# server while it runs; the rows gather in $ctsv, and bench/contend.py
# makes them the document's contention section and chart at the end
ctsv=$tmp/contend.tsv
: >"$ctsv"
contend_ns="2 8 64"
[ -n "$quick" ] && contend_ns=2
# contend LABEL LOAD WORKER...: LABEL is STORE|IMPLEMENTATION|FLOOR (see
# bench/contend.py); LOAD, the store's kind and ports for bench/load.sh
# (empty: no server to ask); a failure is a "not measured" row
contend() {
    local label=$1 load=$2 n reps secs=1 err
    shift 2
    [ -n "$quick" ] && secs=0.3
    for n in $contend_ns; do
        # three repetitions (median and spread) at 8 contenders, the
        # headline; one at 2, and at 64, where starting the peers' 64
        # interpreters alone takes seconds
        reps=1
        { [ "$n" = 8 ] && [ -z "$quick" ]; } && reps=3
        local args=(--label "$label" --n "$n" --seconds "$secs" --reps "$reps")
        [ -n "$load" ] && args+=(--load "bash $root/bench/load.sh $load")
        if ! timeout 300 "$build/bench/dlock_bench_contend" run "${args[@]}" -- "$@" \
            >>"$ctsv" 2>"$tmp/contend.err"; then
            # a worker's own exception first (Python's "...Error: why"),
            # else the driver's last word
            err=$(grep -m1 -E '^[A-Za-z.]*(Error|Exception): ' "$tmp/contend.err" ||
                grep -v '^Traceback\|^  ' "$tmp/contend.err" | tail -1)
            err=$(echo "$err" | cut -c1-200 | tr '|' '/')
            printf 'fail\t%s\t%s\t%s\n' "$label" "$n" "${err:-it failed}" >>"$ctsv"
            echo "bench: contention $label, $n contenders: ${err:-failed}" >&2
            return 0 # more contenders would fail the same way
        fi
    done
}
cbin=$build/bench/dlock_bench_contend
pyout=$tmp/results-redis-py.md
py_peer redis "$port" "$out" python3-redis 'uncontended acquire+release, p50' \
    'hand-off, release → waiter' >"$pyout"
# dlock's own Python package beside redis-py (python/, over this build)
pyenv=(env "PYTHONPATH=$root/python" "DLOCK_LIBRARY=$build/libdlock.so.0")
if /usr/bin/python3 -c "import redis, cffi" 2>/dev/null; then
    # shellcheck disable=SC2086 # $quick: nothing or --quick
    "${pyenv[@]}" /usr/bin/python3 "$root/bench/peer_py.py" dlock-python \
        "redis://127.0.0.1:$port" "$port" $quick >>"$pyout" ||
        printf '### dlock from Python, beside redis-py\n\nNot measured: its script failed (see the bench output).\n\n' >>"$pyout"
else
    printf '### dlock from Python, beside redis-py\n\nNot measured: no python3-redis or python3-cffi on this machine.\n\n' >>"$pyout"
fi
awk -v f="$pyout" '
    function py(l) { while ((getline l < f) > 0) print l; print ""; done = 1 }
    /^## / && seen && !done { py() }
    /^## Redis/ { seen = 1 }
    { print }
    END { if (!done) { print ""; py() } }
' "$out" >"$out.new" && mv "$out.new" "$out"

echo "bench: ${SECONDS}s: many locks" >&2
# --- Many locks on the same redis-server (100,000 names held at once;
# --quick: 10,000), after the peer: its subsection ends the Redis section
manyout=$tmp/results-many.md
if [ -x "$build/bench/dlock_bench_many" ]; then
    # shellcheck disable=SC2086 # $quick: nothing or --quick
    if ! "$build/bench/dlock_bench_many" "redis://127.0.0.1:$port" $quick >"$manyout"; then
        echo "bench: dlock_bench_many failed; the server's log:" >&2
        tail -5 "$tmp/redis.log" >&2 || true
        exit 1
    fi
    awk -v f="$manyout" '
        function many(l) { while ((getline l < f) > 0) print l; print ""; done = 1 }
        /^## / && seen && !done { many() }
        /^## Redis/ { seen = 1 }
        { print }
        END { if (!done) { print ""; many() } }
    ' "$out" >"$out.new" && mv "$out.new" "$out"
fi

echo "bench: ${SECONDS}s: operating (list, exporter)" >&2
# --- An operator's view of the same redis-server (issue 20's targets):
# dlock_list()'s first page among 100,000 locks (--quick: 10,000), and
# `dlock exporter` scrapes of 10,000 locks held on Redis and on the file
# store; one subsection at the end of the Redis section
opout=$tmp/results-operate.md
scrapes=20
[ -n "$quick" ] && scrapes=5
mkdir -p "$tmp/exporter-locks"
{
    # shellcheck disable=SC2086 # $quick: nothing or --quick
    "$build/bench/dlock_bench_list" "redis://127.0.0.1:$port" $quick
    echo
    echo "### The exporter (\`dlock exporter\`)"
    echo
    echo "Whole scrapes of \`GET /metrics\` (connect, request, the answer's last byte), as Prometheus makes them, with 10,000 locks held by another process; every scrape checked (HTTP 200, the store up, 10,000 locks). The target: 1 s."
    echo
    echo "| scrape | median | slowest | ÷ target |"
    echo "|---|---|---|---|"
    "$build/bench/dlock_bench_exporter" "$build/dlock" "redis://127.0.0.1:$port" 10000 "$scrapes" 2>/dev/null
    "$build/bench/dlock_bench_exporter" "$build/dlock" "file://$tmp/exporter-locks" 10000 "$scrapes" 2>/dev/null
} >"$opout"
awk -v f="$opout" '
    function op(l) { while ((getline l < f) > 0) print l; print ""; done = 1 }
    /^## / && seen && !done { op() }
    /^## Redis/ { seen = 1 }
    { print }
    END { if (!done) { print ""; op() } }
' "$out" >"$out.new" && mv "$out.new" "$out"

# --- Shared holds and semaphores (bench/bench_rw.c): one subsection at
# the end of the Redis section and one at the end of the file store's
rwout=$tmp/results-rw-redis.md
# shellcheck disable=SC2086 # $quick: nothing or --quick
"$build/bench/dlock_bench_rw" "redis://127.0.0.1:$port" $quick >"$rwout"
awk -v f="$rwout" '
    function rw(l) { while ((getline l < f) > 0) print l; print ""; done = 1 }
    /^## / && seen && !done { rw() }
    /^## Redis/ { seen = 1 }
    { print }
    END { if (!done) { print ""; rw() } }
' "$out" >"$out.new" && mv "$out.new" "$out"
# shellcheck disable=SC2086 # $quick: nothing or --quick
"$build/bench/dlock_bench_rw" "file://$tmp/locks" $quick >>"$out"

# --- Sentinel (bench/bench_sentinel.c): a primary, two replicas and three
# sentinels of our own; one subsection at the end of the Redis section
stout=$tmp/results-sentinel.md
sentinel_bench() {
    local p i sp=() spids=() uri
    spawn_redis sentinel-primary --bind 127.0.0.1 --save '' \
        --appendonly no --dir "$tmp" || return 1
    p=$SPAWN_PORT
    spids+=("$SPAWN_PID")
    stpids="${spids[*]}"
    for i in 1 2; do
        spawn_redis "sentinel-replica$i" --bind 127.0.0.1 --save '' \
            --appendonly no --dir "$tmp" --replicaof 127.0.0.1 "$p" || return 1
        spids+=("$SPAWN_PID")
        stpids="${spids[*]}"
    done
    for i in 1 2 3; do
        mkdir -p "$tmp/sentinel$i"
        printf 'bind 127.0.0.1\ndir %s\nsentinel monitor benchm 127.0.0.1 %s 2\n' \
            "$tmp/sentinel$i" "$p" >"$tmp/sentinel$i/sentinel.conf"
        spawn_redis "sentinel$i" "$tmp/sentinel$i/sentinel.conf" --sentinel ||
            return 1
        spids+=("$SPAWN_PID")
        stpids="${spids[*]}"
        sp+=("127.0.0.1:$SPAWN_PORT")
    done
    stpids="${spids[*]}"
    uri="redis-sentinel://$(IFS=,; echo "${sp[*]}")/benchm"
    # until both replicas are in sync and a sentinel names the primary
    for i in $(seq 1 300); do
        [ "$(redis-cli -p "$p" WAIT 2 100 2>/dev/null)" = 2 ] &&
            redis-cli -p "${sp[0]##*:}" SENTINEL get-master-addr-by-name benchm 2>/dev/null | grep -qx "$p" &&
            break
        sleep 0.1
    done
    # shellcheck disable=SC2086 # $quick: nothing or --quick
    "$build/bench/dlock_bench_sentinel" "$uri" "redis://127.0.0.1:$p" $quick ||
        printf '### Redis Sentinel (redis-sentinel://)\n\nNot measured: dlock_bench_sentinel failed (see the bench output).\n\n'
    kill "${spids[@]}" 2>/dev/null || true
    wait "${spids[@]}" 2>/dev/null || true
}
sentinel_bench >"$stout" ||
    printf '### Redis Sentinel (redis-sentinel://)\n\nNot measured: its servers did not start (see the bench output).\n\n' >"$stout"
awk -v f="$stout" '
    function st(l) { while ((getline l < f) > 0) print l; print ""; done = 1 }
    /^## / && seen && !done { st() }
    /^## Redis/ { seen = 1 }
    { print }
    END { if (!done) { print ""; st() } }
' "$out" >"$out.new" && mv "$out.new" "$out"

# --- Cluster (bench/bench_cluster.c): three primaries and a replica of
# each, ours; one subsection at the end of the Redis section, after the
# Sentinel one
clout=$tmp/results-cluster.md
cluster_bench() {
    local i p spawn_bus=1 ports=() cpids=() prim=() uri ok=
    for i in 1 2 3 4 5 6; do
        mkdir -p "$tmp/cluster$i"
        spawn_redis "cluster$i" --cluster-enabled yes \
            --cluster-config-file "$tmp/cluster$i/nodes.conf" \
            --cluster-node-timeout 5000 --save '' --appendonly no \
            --bind 127.0.0.1 --dir "$tmp/cluster$i" \
            --repl-diskless-sync-delay 0 --repl-ping-replica-period 1 || {
            kill "${cpids[@]}" 2>/dev/null || true
            wait "${cpids[@]}" 2>/dev/null || true
            stpids=
            return 1
        }
        cpids+=("$SPAWN_PID")
        stpids="${cpids[*]}"
        ports+=("$SPAWN_PORT")
    done
    # shellcheck disable=SC2046 # the six addresses, one word each
    redis-cli --cluster create $(printf '127.0.0.1:%s ' "${ports[@]}") \
        --cluster-replicas 1 --cluster-yes >"$tmp/cluster-create.log" 2>&1 || {
        echo "bench: redis-cli --cluster create failed:" >&2
        tail -5 "$tmp/cluster-create.log" >&2
        ok=no
    }
    # until the cluster is ok, with three primaries each acknowledged by its
    # replica (WAIT 1: the replica is in sync), 30 s at most
    for i in $(seq 1 300); do
        [ -n "$ok" ] && break
        if redis-cli -p "${ports[0]}" cluster info 2>/dev/null | tr -d '\r' |
            grep -qx cluster_state:ok; then
            mapfile -t prim < <(redis-cli -p "${ports[0]}" cluster nodes 2>/dev/null |
                awk '$3 ~ /master/ && $3 !~ /fail/ && $8 == "connected" {
                    sub(/@.*/, "", $2); print $2 }' | sort -t: -k2n)
            if [ "${#prim[@]}" = 3 ]; then
                ok=1
                for p in "${prim[@]}"; do
                    [ "$(redis-cli -p "${p##*:}" WAIT 1 100 2>/dev/null)" = 1 ] || ok=
                done
                [ -n "$ok" ] && break
            fi
        fi
        sleep 0.1
    done
    if [ "$ok" = no ]; then
        printf '### Redis Cluster (redis-cluster://)\n\nNot measured: redis-cli --cluster create failed (see the bench output).\n\n'
    elif [ -z "$ok" ]; then
        echo "bench: the cluster was not ok with its replicas in sync within 30 s" >&2
        printf '### Redis Cluster (redis-cluster://)\n\nNot measured: the cluster was not ready within 30 s (see the bench output).\n\n'
    else
        uri="redis-cluster://$(IFS=,; echo "${prim[*]}")"
        # shellcheck disable=SC2086 # $quick: nothing or --quick
        "$build/bench/dlock_bench_cluster" "$uri" "redis://${prim[0]}" $quick ||
            printf '### Redis Cluster (redis-cluster://)\n\nNot measured: dlock_bench_cluster failed (see the bench output).\n\n'
    fi
    kill "${cpids[@]}" 2>/dev/null || true
    wait "${cpids[@]}" 2>/dev/null || true
    stpids=
}
if [ -x "$build/bench/dlock_bench_cluster" ]; then
    cluster_bench >"$clout" ||
        printf '### Redis Cluster (redis-cluster://)\n\nNot measured: its servers did not start (see the bench output).\n\n' >"$clout"
else
    printf '### Redis Cluster (redis-cluster://)\n\nNot measured: dlock_bench_cluster was not built (libhiredis-dev missing).\n\n' >"$clout"
fi
awk -v f="$clout" '
    function cl(l) { while ((getline l < f) > 0) print l; print ""; done = 1 }
    /^## / && seen && !done { cl() }
    /^## Redis/ { seen = 1 }
    { print }
    END { if (!done) { print ""; cl() } }
' "$out" >"$out.new" && mv "$out.new" "$out"

# --- Redis over TLS (bench/bench_tls.c): a redis-server of our own with a
# TLS port beside its plain port, its certificates made here (a CA and a
# server certificate for DNS:localhost, EC P-256); the cycles and whole
# commands, then redis-py's cycle over TLS; its contention rows follow the
# Redis ones below, then a summary of them ends the subsection, which goes
# at the end of the Redis section, after the Cluster one
tlsout=$tmp/results-tls.md
tlsdir=$tmp/tls
tlsca=$tlsdir/ca.crt
tlsport=
tlsplain=
tls_certs() { # the CA and the server's certificate and key, in $tlsdir
    local ec=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
    mkdir -p "$tlsdir"
    openssl req -x509 -new "${ec[@]}" -keyout "$tlsdir/ca.key" -out "$tlsca" \
        -days 2 -subj "/CN=dlock bench CA" &&
        openssl req -new "${ec[@]}" -keyout "$tlsdir/server.key" \
            -out "$tlsdir/server.csr" -subj "/CN=localhost" &&
        printf '%s\n' subjectAltName=DNS:localhost basicConstraints=CA:FALSE \
            keyUsage=digitalSignature extendedKeyUsage=serverAuth >"$tlsdir/ext.cnf" &&
        openssl x509 -req -in "$tlsdir/server.csr" -CA "$tlsca" \
            -CAkey "$tlsdir/ca.key" -CAcreateserial -out "$tlsdir/server.crt" \
            -days 2 -extfile "$tlsdir/ext.cnf"
}
tls_start() { # the server: a free TLS port (another if it is taken)
    local tp
    for _ in $(seq 5); do
        tp=$(free_port) || return 1
        spawn_redis tls --bind 127.0.0.1 --save '' --appendonly no \
            --dir "$tlsdir" --tls-port "$tp" \
            --tls-cert-file "$tlsdir/server.crt" \
            --tls-key-file "$tlsdir/server.key" \
            --tls-ca-cert-file "$tlsca" --tls-auth-clients no || continue
        tlspid=$SPAWN_PID
        # its TLS port answers (not another process's)
        if [ "$(redis-cli --tls --cacert "$tlsca" --sni localhost -p "$tp" \
            ping 2>/dev/null)" = PONG ]; then
            tlsport=$tp
            tlsplain=$SPAWN_PORT
            return 0
        fi
        kill "$tlspid" 2>/dev/null || true; wait "$tlspid" 2>/dev/null || true; tlspid=
    done
    return 1
}
# shellcheck disable=SC2016 # Markdown's backquotes, not a command
tls_head='### Redis over TLS (`rediss://`)'
if [ ! -x "$build/bench/dlock_bench_tls" ]; then
    printf '%s\n\nNot measured: dlock_bench_tls was not built (a build without TLS: libssl-dev missing).\n\n' "$tls_head" >"$tlsout"
elif ! command -v openssl >/dev/null 2>&1; then
    printf '%s\n\nNot measured: no openssl CLI (Debian package openssl) to make its certificates.\n\n' "$tls_head" >"$tlsout"
elif ! tls_certs >"$tmp/tls-certs.log" 2>&1; then
    echo "bench: the TLS certificates were not made:" >&2
    tail -5 "$tmp/tls-certs.log" >&2
    printf '%s\n\nNot measured: the openssl CLI did not make its certificates (see the bench output).\n\n' "$tls_head" >"$tlsout"
elif ! tls_start; then
    echo "bench: the TLS redis-server did not start; its log:" >&2
    tail -5 "$tmp"/tls-*.log >&2 || true
    printf '%s\n\nNot measured: its redis-server did not start with TLS (see the bench output).\n\n' "$tls_head" >"$tlsout"
else
    echo "bench: ${SECONDS}s: Redis over TLS" >&2
    # shellcheck disable=SC2086 # $quick: nothing or --quick
    if ! "$build/bench/dlock_bench_tls" "$tlsport" "$tlsplain" "$tlsca" \
        "$(cd "$build" && pwd)/dlock" $quick >"$tlsout"; then
        printf '%s\n\nNot measured: dlock_bench_tls failed (see the bench output).\n\n' "$tls_head" >"$tlsout"
    elif ! /usr/bin/python3 -c "import redis" 2>/dev/null; then
        printf '**Beside redis-py over TLS**: not measured: no python3-redis on this machine.\n\n' >>"$tlsout"
    else
        tls_dlock_us=$(table_fig "$tlsout" 'over TLS (' 4)
        # shellcheck disable=SC2086 # $quick: nothing or --quick
        /usr/bin/python3 "$root/bench/peer_py.py" redis-tls "$tlsport,$tlsca" \
            "$tls_dlock_us" $quick >>"$tlsout" ||
            printf '**Beside redis-py over TLS**: not measured: its script failed (see the bench output).\n\n' >>"$tlsout"
    fi
fi

ru=redis://127.0.0.1:$port
contend "Redis|dlock|Redis" "redis $port" "$cbin" worker "$ru" contend-1
contend "Redis|dlock, fair|Redis" "redis $port" "$cbin" worker "$ru" contend-2 fair
if /usr/bin/python3 -c "import redis" 2>/dev/null; then
    contend "Redis|redis-py, sleep 0.1 s (its default)|Redis" "redis $port" \
        /usr/bin/python3 "$root/bench/peer_py.py" contend redis "$port" contend-3
    contend "Redis|redis-py, sleep 1 ms|Redis" "redis $port" \
        /usr/bin/python3 "$root/bench/peer_py.py" contend redis "$port" contend-4 0.001
fi
if /usr/bin/python3 -c "import cffi" 2>/dev/null; then
    contend "Redis|dlock-python|Redis" "redis $port" "${pyenv[@]}" \
        /usr/bin/python3 "$root/bench/peer_py.py" contend dlock "$ru" contend-5
fi
# over TLS, on the TLS server (its plain port counts the commands): at 8
# processes in --quick too (the target's figures), then a summary of those
# ends the TLS subsection, spliced at the end of the Redis section
if [ -n "$tlspid" ]; then
    tu="rediss://127.0.0.1:$tlsport?cacert=$tlsca&sni=localhost"
    tls_ns="2 8 64"
    [ -n "$quick" ] && tls_ns=8
    contend_ns=$tls_ns contend "Redis over TLS|dlock|Redis over TLS" \
        "redis $tlsplain" "$cbin" worker "$tu" contend-1
    contend_ns=$tls_ns contend "Redis over TLS|dlock, fair|Redis over TLS" \
        "redis $tlsplain" "$cbin" worker "$tu" contend-2 fair
    if /usr/bin/python3 -c "import redis" 2>/dev/null; then
        contend_ns=$tls_ns contend "Redis over TLS|redis-py, sleep 0.1 s (its default)|Redis over TLS" \
            "redis $tlsplain" /usr/bin/python3 "$root/bench/peer_py.py" \
            contend redis-tls "$tlsport,$tlsca" contend-3
        contend_ns=$tls_ns contend "Redis over TLS|redis-py, sleep 1 ms|Redis over TLS" \
            "redis $tlsplain" /usr/bin/python3 "$root/bench/peer_py.py" \
            contend redis-tls "$tlsport,$tlsca" contend-4 0.001
    fi
    python3 "$root/bench/contend.py" "$ctsv" --pick "Redis over TLS" 8 >>"$tlsout" ||
        printf '**Contention over TLS**: not summarised: bench/contend.py failed (see the bench output).\n\n' >>"$tlsout"
    kill "$tlspid" 2>/dev/null || true; wait "$tlspid" 2>/dev/null || true; tlspid=
fi
awk -v f="$tlsout" '
    function tl(l) { while ((getline l < f) > 0) print l; print ""; done = 1 }
    /^## / && seen && !done { tl() }
    /^## Redis/ { seen = 1 }
    { print }
    END { if (!done) { print ""; tl() } }
' "$out" >"$out.new" && mv "$out.new" "$out"
# the file store, on the kernel's lock alone and through dlock
contend "File store|kernel OFD lock (floor: fcntl F_OFD_SETLKW)|" "" "$cbin" worker-ofd "$tmp/ofd-lock"
contend "File store|dlock|row:kernel OFD lock (floor: fcntl F_OFD_SETLKW)" "" \
    "$cbin" worker "file://$tmp/locks" contend-1
contend "File store|dlock, fair|row:kernel OFD lock (floor: fcntl F_OFD_SETLKW)" "" \
    "$cbin" worker "file://$tmp/locks" contend-2 fair

kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=

echo "bench: ${SECONDS}s: the CLI" >&2
# --- File store: the CLI, whole `dlock run` commands beside util-linux
# flock(1) and `true` alone, timed by a C fork/exec/wait loop, their peak
# RSS, and the start-up and memory targets beside the figures; appended to
# the file store's section (the last of $out). Alone: build-bench/bench/
# dlock_bench_cli "$PWD/build-bench/dlock" "$(command -v flock)" EMPTY_DIR
# [--quick]
flock_bin=$(command -v flock 2>/dev/null || true)
flockver=
if [ -z "$flock_bin" ]; then
    printf '\n### The CLI: one whole command under a file lock\n\nNot measured: no flock(1) (Debian package util-linux) on this machine.\n' >>"$out"
elif [ ! -x "$build/bench/dlock_bench_cli" ]; then
    printf '\n### The CLI: one whole command under a file lock\n\nNot measured: dlock_bench_cli was not built.\n' >>"$out"
else
    flockver=$("$flock_bin" --version 2>/dev/null | sed -n 's/^flock from //p')
    mkdir -p "$tmp/cli"
    # shellcheck disable=SC2086 # $quick: nothing or --quick
    "$build/bench/dlock_bench_cli" "$(cd "$build" && pwd)/dlock" "$flock_bin" \
        "$tmp/cli" $quick >>"$out"
fi

echo "bench: ${SECONDS}s: Redlock" >&2
# --- Redlock: five private redis-servers, dlock's redlock:// store beside
# a bare hiredis quorum floor and node-redlock (npm redlock 5 on ioredis)
rlout=$tmp/results-redlock.md
rlnodes=
rl_redis() { # rl_redis DIR: one more server in DIR; its pid and address
    # are added to rlpids and rlnodes
    local d=$1 p rp
    mkdir -p "$d"
    for _ in $(seq 50); do
        p=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue
        redis-server --port "$p" --bind 127.0.0.1 --save '' --appendonly no \
            --dir "$d" --logfile "$d/redis.log" &
        rp=$!
        # the server that answers must be this one (another process may
        # have taken the port since it was found free)
        for _ in $(seq 100); do
            redis-cli -p "$p" info server 2>/dev/null | tr -d '\r' |
                grep -qx "process_id:$rp" && {
                rlpids="$rlpids $rp"
                rlnodes=$rlnodes${rlnodes:+,}127.0.0.1:$p
                return 0
            }
            kill -0 "$rp" 2>/dev/null || break
            sleep 0.05
        done
        kill "$rp" 2>/dev/null || true; wait "$rp" 2>/dev/null || true
    done
    return 1
}
# node-redlock: the 5.x line has only pre-releases (`redlock@5` resolves to
# none), so the newest is named; installed once into BUILD_DIR/npm
rl_spec="redlock@5.0.0-beta.2 ioredis@5"
npmdir=$(cd "$build" && pwd)/npm
rl_peer_skip=
rl_peer_ver=
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    rl_peer_skip="node or npm is missing (Debian packages nodejs and npm; scripts/install-deps.sh bench)"
elif [ "$(cat "$npmdir/.installed" 2>/dev/null)" != "$rl_spec" ] ||
    [ ! -d "$npmdir/node_modules/redlock" ] || [ ! -d "$npmdir/node_modules/ioredis" ]; then
    rm -rf "$npmdir"
    mkdir -p "$npmdir"
    echo "bench: npm install $rl_spec (into $npmdir)" >&2
    # shellcheck disable=SC2086 # $rl_spec: two package specs
    if timeout 240 npm install --prefix "$npmdir" --no-save --no-audit \
        --no-fund --no-update-notifier --loglevel=error --fetch-retries=1 \
        --fetch-retry-mintimeout=2000 --fetch-retry-maxtimeout=5000 \
        --fetch-timeout=60000 $rl_spec >"$tmp/npm.log" 2>&1; then
        echo "$rl_spec" >"$npmdir/.installed"
    else
        rl_err=$(grep -m1 -E '^npm (ERR!|error) ' "$tmp/npm.log" |
            sed -E 's/^npm (ERR!|error) //' | cut -c1-160)
        rl_peer_skip="\`npm install $rl_spec\` failed or timed out (is the npm registry reachable?)${rl_err:+: $rl_err}"
    fi
fi
if [ -z "$rl_peer_skip" ]; then
    # shellcheck disable=SC2016 # JavaScript, not shell
    rl_peer_ver=$(node -e '
        const fs = require("fs"), v = (m) => JSON.parse(fs.readFileSync(
            process.argv[1] + "/node_modules/" + m + "/package.json")).version;
        console.log(`redlock ${v("redlock").replace(/^v/, "")}, ioredis ${v("ioredis")}, node ${process.version}`);
    ' "$npmdir" 2>/dev/null) || rl_peer_ver=
fi
if [ ! -x "$build/bench/dlock_bench_redlock" ]; then
    printf '## Redlock\n\nNot measured: dlock_bench_redlock was not built (libhiredis-dev missing).\n' >"$rlout"
else
    for i in 1 2 3 4 5; do
        rl_redis "$tmp/redlock$i" || {
            echo "bench: redis-server for Redlock did not start" >&2
            exit 1
        }
    done
    if [ -n "$rl_peer_skip" ]; then
        rl_peer=(--no-peer "$rl_peer_skip")
    else
        rl_peer=(--peer "$root/bench/redlock_peer.js" "$npmdir/node_modules")
    fi
    # shellcheck disable=SC2086 # $quick: nothing or --quick
    if ! "$build/bench/dlock_bench_redlock" "$rlnodes" $quick "${rl_peer[@]}" >"$rlout"; then
        echo "bench: dlock_bench_redlock failed; the servers' logs:" >&2
        tail -5 "$tmp"/redlock*/redis.log >&2 || true
        exit 1
    fi
    rlports=$(echo "$rlnodes" | tr ',' '\n' | sed 's/.*://' | tr '\n' ' ')
    rlfirst=${rlnodes%%,*}
    contend "Redlock, 5 nodes|dlock|Redlock, 5 nodes" "redis $rlports" \
        "$cbin" worker "redlock://$rlnodes" contend-1
    contend "Redlock, 1 node|dlock (redis://)|Redis" "redis ${rlfirst##*:}" \
        "$cbin" worker "redis://$rlfirst" contend-3
    if [ -z "$rl_peer_skip" ]; then
        contend "Redlock, 5 nodes|node-redlock|Redlock, 5 nodes" "redis $rlports" \
            node "$root/bench/redlock_peer.js" --modules "$npmdir/node_modules" \
            --nodes "$rlnodes" --contend contend-2
        contend "Redlock, 1 node|node-redlock|Redis" "redis ${rlfirst##*:}" \
            node "$root/bench/redlock_peer.js" --modules "$npmdir/node_modules" \
            --nodes "$rlfirst" --contend contend-4
    fi
    for p in $rlpids; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rlpids=
fi

echo "bench: ${SECONDS}s: ZooKeeper" >&2
# --- ZooKeeper: started only now, so that its JVM does not run beside the
# Redis figures
zk_jar=/usr/share/java/zookeeper.jar
zk_classpath=/etc/zookeeper/conf_example:$zk_jar
zkport=
zk4() { # zk4 WORD: the server's answer to a four-letter word
    (exec 3<>"/dev/tcp/127.0.0.1/$zkport" && echo "$1" >&3 && timeout 3 cat <&3) 2>/dev/null
}
start_zk() {
    local d=$tmp/zk
    for _ in $(seq 20); do
        zkport=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$zkport") 2>/dev/null && continue
        rm -rf "$d"
        mkdir -p "$d/data"
        cat >"$d/zoo.cfg" <<EOF
tickTime=200
dataDir=$d/data
clientPort=$zkport
clientPortAddress=127.0.0.1
minSessionTimeout=400
maxSessionTimeout=60000
maxClientCnxns=0
4lw.commands.whitelist=*
admin.enableServer=false
forceSync=no
EOF
        java -Xmx256m -XX:+UseSerialGC -cp "$zk_classpath" \
            -Dzookeeper.log.dir="$d" -Dzookeeper.root.logger=INFO,CONSOLE \
            org.apache.zookeeper.server.quorum.QuorumPeerMain "$d/zoo.cfg" \
            >"$d/zk.log" 2>&1 &
        zkpid=$!
        # imok: the JVM runs; "Mode:" in srvr: it serves requests
        for _ in $(seq 300); do
            [ "$(zk4 ruok)" = imok ] && [[ "$(zk4 srvr)" == *"Mode: "* ]] &&
                return 0
            kill -0 "$zkpid" 2>/dev/null || break
            sleep 0.1
        done
        kill "$zkpid" 2>/dev/null || true; wait "$zkpid" 2>/dev/null || true; zkpid=
    done
    return 1
}

zkout=$tmp/results-zk.md
zkver=
if [ ! -x "$build/bench/dlock_bench_zk" ]; then
    printf '## ZooKeeper\n\nNot measured: dlock_bench_zk was not built (libzookeeper-mt-dev missing).\n' >"$zkout"
elif ! command -v java >/dev/null 2>&1 || [ ! -r "$zk_jar" ]; then
    printf '## ZooKeeper\n\nNot measured: no ZooKeeper server (Debian package zookeeper) on this machine.\n' >"$zkout"
elif ! start_zk; then
    echo "bench: the ZooKeeper server did not start; its log:" >&2
    tail -30 "$tmp/zk/zk.log" >&2 || true
    exit 1
else
    zkver=$(zk4 srvr | sed -n 's/^Zookeeper version: \([^-,]*\).*/\1/p')
    # shellcheck disable=SC2086
    if ! "$build/bench/dlock_bench_zk" "zk://127.0.0.1:$zkport/dlock-bench" $quick >"$zkout"; then
        echo "bench: dlock_bench_zk failed; the ZooKeeper server's log:" >&2
        tail -30 "$tmp/zk/zk.log" >&2 || true
        exit 1
    fi
    py_peer kazoo "127.0.0.1:$zkport" "$zkout" python3-kazoo \
        'uncontended acquire+release, p50' 'hand-off, release → waiter' >"$zkout.peer"
    { echo; cat "$zkout.peer"; } >>"$zkout"
    # shellcheck disable=SC2086 # $quick: nothing or --quick
    "$build/bench/dlock_bench_rw" "zk://127.0.0.1:$zkport/dlock-bench" $quick >>"$zkout"
    contend "ZooKeeper|dlock|ZooKeeper" "zk $zkport" "$cbin" worker \
        "zk://127.0.0.1:$zkport/dlock-bench" contend-1
    if /usr/bin/python3 -c "import kazoo" 2>/dev/null; then
        contend "ZooKeeper|kazoo|ZooKeeper" "zk $zkport" /usr/bin/python3 \
            "$root/bench/peer_py.py" contend kazoo "127.0.0.1:$zkport" contend-2
    fi
    kill "$zkpid" 2>/dev/null || true; wait "$zkpid" 2>/dev/null || true; zkpid=
fi

echo "bench: ${SECONDS}s: etcd" >&2
# --- etcd: one private member (free loopback ports, data in the temp dir)
etcdport=
etcd_health() {
    (exec 3<>"/dev/tcp/127.0.0.1/$etcdport" &&
        printf 'GET /health HTTP/1.0\r\n\r\n' >&3 && timeout 3 cat <&3) 2>/dev/null |
        grep -q '"health":"true"'
}
start_etcd() {
    local d=$tmp/etcd peer
    for _ in $(seq 20); do
        etcdport=$((20000 + RANDOM % 40000))
        peer=$((etcdport + 1))
        (exec 3<>"/dev/tcp/127.0.0.1/$etcdport") 2>/dev/null && continue
        (exec 3<>"/dev/tcp/127.0.0.1/$peer") 2>/dev/null && continue
        rm -rf "$d"
        mkdir -p "$d"
        etcd --name bench --data-dir "$d/data" \
            --listen-client-urls "http://127.0.0.1:$etcdport" \
            --advertise-client-urls "http://127.0.0.1:$etcdport" \
            --listen-peer-urls "http://127.0.0.1:$peer" \
            --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
            --initial-cluster "bench=http://127.0.0.1:$peer" \
            --heartbeat-interval=50 --election-timeout=500 --log-level=warn \
            >"$d/etcd.log" 2>&1 &
        etcdpid=$!
        for _ in $(seq 300); do
            etcd_health && return 0
            kill -0 "$etcdpid" 2>/dev/null || break
            sleep 0.1
        done
        kill "$etcdpid" 2>/dev/null || true; wait "$etcdpid" 2>/dev/null || true; etcdpid=
    done
    return 1
}

# us_per_run N CMD...: the mean wall time of one run of CMD, in µs
us_per_run() {
    local n=$1 t0 t1
    shift
    t0=$(date +%s%N)
    for _ in $(seq "$n"); do
        "$@" >/dev/null 2>&1 || { echo "bench: '$*' failed" >&2; return 1; }
    done
    t1=$(date +%s%N)
    echo $(((t1 - t0) / n / 1000))
}

etcdout=$tmp/results-etcd.md
etcdver=
if [ ! -x "$build/bench/dlock_bench_etcd" ]; then
    printf '## etcd\n\nNot measured: dlock_bench_etcd was not built (libcurl4-openssl-dev missing).\n' >"$etcdout"
elif ! command -v etcd >/dev/null 2>&1 || ! command -v etcdctl >/dev/null 2>&1; then
    printf '## etcd\n\nNot measured: no etcd (Debian packages etcd-server, etcd-client) on this machine.\n' >"$etcdout"
elif ! start_etcd; then
    echo "bench: etcd did not start; its log:" >&2
    tail -30 "$tmp/etcd/etcd.log" >&2 || true
    exit 1
else
    etcdver=$(etcd --version | sed -n 's/^etcd Version: //p')
    # shellcheck disable=SC2086
    if ! "$build/bench/dlock_bench_etcd" "etcd://127.0.0.1:$etcdport?prefix=dlock-bench" $quick >"$etcdout"; then
        echo "bench: dlock_bench_etcd failed; etcd's log:" >&2
        tail -30 "$tmp/etcd/etcd.log" >&2 || true
        exit 1
    fi
    # shellcheck disable=SC2086 # $quick: nothing or --quick
    "$build/bench/dlock_bench_rw" "etcd://127.0.0.1:$etcdport?prefix=dlock-bench" $quick >"$etcdout.rw"
    # the CLI: a whole command under the lock, dlock beside etcdctl
    runs=20
    [ -n "$quick" ] && runs=5
    ep=127.0.0.1:$etcdport
    us_per_run 2 "$build/dlock" run --store "etcd://$ep" benchcli true >/dev/null &&
        us_per_run 2 etcdctl --endpoints="$ep" lock dlock/benchcli true >/dev/null
    e_us=$(us_per_run "$runs" etcdctl --endpoints="$ep" lock dlock/benchcli true)
    d_us=$(us_per_run "$runs" "$build/dlock" run --store "etcd://$ep" benchcli true)
    f_us=$(us_per_run "$runs" true)
    {
        echo
        echo "### The CLI: one whole command under an etcd lock"
        echo
        echo "Mean wall time of one run ($runs runs each), in ms: process start,"
        echo "connect, lease grant, lock, run \`true\`, unlock, lease revoke, exit."
        echo
        echo "| command | ms per run | ratio to etcdctl |"
        echo "|---|---|---|"
        awk -v e="$e_us" -v d="$d_us" -v f="$f_us" 'BEGIN {
            printf "| `etcdctl lock dlock/NAME true` | %.1f | 1.00x |\n", e / 1000
            printf "| `dlock run --store etcd://... NAME true` | %.1f | **%.2fx** |\n", d / 1000, d / e
            printf "| `true` alone (process start floor) | %.1f | |\n", f / 1000
        }'
    } >>"$etcdout"
    py_peer etcd3 "$ep" "$etcdout" python3-etcd3 \
        'uncontended acquire+release, p50' 'hand-off, release → waiter' >"$etcdout.peer"
    { echo; cat "$etcdout.peer"; cat "$etcdout.rw"; } >>"$etcdout"
    contend "etcd|dlock|etcd" "etcd $etcdport" "$cbin" worker \
        "etcd://$ep?prefix=dlock-bench" contend-1
    if /usr/bin/python3 -c "import etcd3" 2>/dev/null; then
        contend "etcd|python-etcd3|etcd" "etcd $etcdport" /usr/bin/python3 \
            "$root/bench/peer_py.py" contend etcd3 "$ep" contend-2
    fi
    kill "$etcdpid" 2>/dev/null || true; wait "$etcdpid" 2>/dev/null || true; etcdpid=
fi

echo "bench: ${SECONDS}s: SQLite" >&2
# --- SQLite: database files in the temporary directory
sqout=$tmp/results-sqlite.md
if [ -x "$build/bench/dlock_bench_sqlite" ]; then
    mkdir -p "$tmp/sqlite"
    # shellcheck disable=SC2086
    "$build/bench/dlock_bench_sqlite" "$tmp/sqlite" $quick >"$sqout"
    # shared holds and semaphores (bench/bench_rw.c), ending the section
    # shellcheck disable=SC2086
    "$build/bench/dlock_bench_rw" "sqlite://$tmp/sqlite/rw.db" $quick >>"$sqout"
    contend "SQLite|dlock|SQLite" "" "$cbin" worker "sqlite://$tmp/sqlite/contend.db" contend-1
else
    printf '## SQLite\n\nNot measured: dlock_bench_sqlite was not built (libsqlite3-dev missing).\n' >"$sqout"
fi

echo "bench: ${SECONDS}s: PostgreSQL" >&2
# --- PostgreSQL: a private server (tests/servers/sqlserver.sh: superuser
# dlock, database postgres, fsync off unless DLOCK_SQL_DURABLE=1)
pgport=
pg_sql() { # pg_sql SQL: one value from the server
    PGPASSWORD=dlock-secret PGCONNECT_TIMEOUT=5 psql -X -q -At -h 127.0.0.1 \
        -p "$pgport" -U dlock \
        postgres -c "$1" 2>/dev/null
}
start_pg() {
    local d=$tmp/pg
    # as root the server runs as the user postgres, who must reach $d
    chmod 711 "$tmp"
    for _ in $(seq 10); do
        pgport=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$pgport") 2>/dev/null && continue
        rm -rf "$d"
        # the script execs the server: $! is the postmaster
        bash "$root/tests/servers/sqlserver.sh" pg "$d" "$pgport" &
        pgpid=$!
        for _ in $(seq 600); do # initdb, then startup: 60 s at most
            [ "$(pg_sql 'select 1')" = 1 ] && return 0
            kill -0 "$pgpid" 2>/dev/null || break
            sleep 0.1
        done
        kill -INT "$pgpid" 2>/dev/null || true; wait "$pgpid" 2>/dev/null || true; pgpid=
    done
    return 1
}

pgout=$tmp/results-pg.md
pgver=
if [ ! -x "$build/bench/dlock_bench_pg" ]; then
    printf '## PostgreSQL\n\nNot measured: dlock_bench_pg was not built (libpq-dev missing).\n' >"$pgout"
elif ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null ||
    ! command -v psql >/dev/null 2>&1; then
    printf '## PostgreSQL\n\nNot measured: no PostgreSQL server (Debian packages postgresql, postgresql-client) on this machine.\n' >"$pgout"
elif ! start_pg; then
    echo "bench: the PostgreSQL server did not start; its log:" >&2
    tail -30 "$tmp/pg/server.log" >&2 || true
    exit 1
else
    pgver=$(pg_sql 'show server_version')
    # shellcheck disable=SC2086
    if ! "$build/bench/dlock_bench_pg" \
        "postgres://dlock:dlock-secret@127.0.0.1:$pgport/postgres" $quick >"$pgout"; then
        echo "bench: dlock_bench_pg failed; the PostgreSQL server's log:" >&2
        tail -30 "$tmp/pg/server.log" >&2 || true
        exit 1
    fi
    pu="postgres://dlock:dlock-secret@127.0.0.1:$pgport/postgres"
    # shared holds and semaphores in table mode, then in advisory mode
    # (bench/bench_rw.c), ending the section
    # shellcheck disable=SC2086 # $quick: nothing or --quick
    "$build/bench/dlock_bench_rw" "$pu" $quick |
        sed 's/^### Shared holds and semaphores$/### Shared holds and semaphores (table mode)/' >>"$pgout"
    # shellcheck disable=SC2086 # $quick: nothing or --quick
    "$build/bench/dlock_bench_rw" "$pu?mode=advisory" $quick |
        sed 's/^### Shared holds and semaphores$/### Shared holds and semaphores (advisory mode)/' >>"$pgout"
    contend "PostgreSQL|dlock, table mode|PostgreSQL" "pg $pgport" "$cbin" worker "$pu" contend-1
    contend "PostgreSQL|dlock, table mode, fair|PostgreSQL" "pg $pgport" "$cbin" worker "$pu" contend-2 fair
    contend "PostgreSQL|dlock, advisory mode|PostgreSQL advisory" "pg $pgport" "$cbin" worker \
        "$pu?mode=advisory" contend-3
    kill -INT "$pgpid" 2>/dev/null || true; wait "$pgpid" 2>/dev/null || true; pgpid=
fi

echo "bench: ${SECONDS}s: MariaDB" >&2
# --- MySQL/MariaDB: a private server (tests/servers/sqlserver.sh: user
# dlock with every privilege, database dlocktest, the InnoDB log flushed
# once a second unless DLOCK_SQL_DURABLE=1)
myport=
my_sql() { # my_sql SQL: one value from the server
    mariadb --no-defaults --connect-timeout=5 -h127.0.0.1 -P"$myport" \
        -udlock -pdlock-secret dlocktest -N -e "$1" 2>/dev/null
}
start_mysql() {
    local d=$tmp/mysql end
    for _ in $(seq 5); do
        myport=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$myport") 2>/dev/null && continue
        rm -rf "$d"
        # the script execs the server: $! is mariadbd (whose warnings
        # before it opens its log would land amid the figures)
        bash "$root/tests/servers/sqlserver.sh" mysql "$d" "$myport" \
            2>>"$tmp/mysql-start.log" &
        mypid=$!
        end=$((SECONDS + 90)) # mariadb-install-db, then startup
        while [ "$SECONDS" -lt "$end" ]; do
            [ "$(my_sql 'select 1')" = 1 ] && return 0
            kill -0 "$mypid" 2>/dev/null || break
            sleep 0.1
        done
        # alive but silent for 90 s: another port would not help
        kill -0 "$mypid" 2>/dev/null && return 1
        wait "$mypid" 2>/dev/null || true; mypid=
    done
    return 1
}

myout=$tmp/results-mysql.md
myver=
if [ ! -x "$build/bench/dlock_bench_mysql" ]; then
    printf '## MySQL / MariaDB\n\nNot measured: dlock_bench_mysql was not built (libmariadb-dev missing).\n' >"$myout"
elif { ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; } ||
    ! command -v mariadb >/dev/null 2>&1; then
    printf '## MySQL / MariaDB\n\nNot measured: no MariaDB server (Debian package mariadb-server) on this machine.\n' >"$myout"
elif ! start_mysql; then
    echo "bench: the MariaDB server did not start; its log:" >&2
    tail -30 "$tmp/mysql-start.log" "$tmp/mysql/server.log" >&2 || true
    exit 1
else
    myver=$(my_sql 'SELECT VERSION()')
    # shellcheck disable=SC2086
    if ! "$build/bench/dlock_bench_mysql" \
        "mysql://dlock:dlock-secret@127.0.0.1:$myport/dlocktest" $quick >"$myout"; then
        echo "bench: dlock_bench_mysql failed; the MariaDB server's log:" >&2
        tail -30 "$tmp/mysql/server.log" >&2 || true
        exit 1
    fi
    mu="mysql://dlock:dlock-secret@127.0.0.1:$myport/dlocktest"
    # shared holds and semaphores (bench/bench_rw.c), ending the section
    # shellcheck disable=SC2086 # $quick: nothing or --quick
    "$build/bench/dlock_bench_rw" "$mu" $quick >>"$myout"
    contend "MySQL / MariaDB|dlock|MariaDB" "mysql $myport" "$cbin" worker "$mu" contend-1
    contend "MySQL / MariaDB|dlock, fair|MariaDB" "mysql $myport" "$cbin" worker "$mu" contend-2 fair
    kill "$mypid" 2>/dev/null || true; wait "$mypid" 2>/dev/null || true; mypid=
fi

cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)
doc=$root/docs/benchmarks.md
[ -n "$quick" ] && doc=$build/benchmarks-quick.md
{
    cat "$root/bench/header.md"
    echo
    echo "## This run"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- machine: $(nproc) cores, ${cpu:-unknown CPU}, $(uname -sr)"
    echo "- redis-server: $(redis-server --version | sed 's/Redis server //;s/ sha.*//')," \
         "hiredis $(pkg-config --modversion hiredis 2>/dev/null || echo '?')"
    echo "- file store CLI: flock(1) ${flockver:-not measured}"
    echo "- redlock: five more such redis-servers; node-redlock: ${rl_peer_ver:-not measured}"
    if [ -n "$zkver" ]; then
        echo "- zookeeper: server $zkver (standalone, forceSync=no, $(java -version 2>&1 | head -1 | tr -d '"'))," \
             "libzookeeper_mt $(dpkg-query -W -f='${Version}' libzookeeper-mt2 2>/dev/null | sed 's/-.*//')"
    fi
    if [ -n "$etcdver" ]; then
        echo "- etcd: $etcdver (one member, data on $(df -P "$tmp" | awk 'NR==2 {print $1}')), libcurl $(pkg-config --modversion libcurl 2>/dev/null || echo '?')," \
             "cJSON $(pkg-config --modversion libcjson 2>/dev/null || echo '?')"
    fi
    if [ -n "$pgver" ]; then
        pgsync="fsync off"
        [ "${DLOCK_SQL_DURABLE:-0}" = 1 ] && pgsync="fsync on"
        echo "- postgresql: $pgver; a private server ($pgsync, data on $(df -P "$tmp" | awk 'NR==2 {print $1}'))," \
             "libpq $(pkg-config --modversion libpq 2>/dev/null || echo '?')"
    fi
    if [ -n "$myver" ]; then
        mysync="InnoDB log flushed once a second"
        [ "${DLOCK_SQL_DURABLE:-0}" = 1 ] && mysync="InnoDB log flushed at every commit"
        echo "- mariadb: $myver; a private server ($mysync, data on $(df -P "$tmp" | awk 'NR==2 {print $1}'))," \
             "libmariadb $(pkg-config --modversion libmariadb 2>/dev/null || echo '?')"
    fi
    echo "- dlock: $rev"
    echo "- command: \`make bench\`${quick:+ (quick mode)}"
    echo
    cat "$out"
    echo
    cat "$rlout"
    echo
    cat "$zkout"
    echo
    cat "$etcdout"
    echo
    cat "$sqout"
    echo
    cat "$pgout"
    echo
    cat "$myout"
} >"$doc"
contout=$tmp/results-contend.md
if python3 "$root/bench/contend.py" "$ctsv" "$doc" >"$contout"; then
    { echo; cat "$contout"; } >>"$doc"
else
    printf '\n## Contention\n\nNot tabulated: bench/contend.py failed (see the output).\n' >>"$doc"
fi
cat "$out"
echo
cat "$rlout"
echo
cat "$zkout"
echo
cat "$etcdout"
echo
cat "$sqout"
echo
cat "$pgout"
echo
cat "$myout"
echo
cat "$contout"
echo
echo "bench: wrote $doc in ${SECONDS}s"

echo "bench: ${SECONDS}s: charts" >&2
# --- charts of the headline figures (gnuplot), beside the document
plotdir=$root/docs
[ -n "$quick" ] && plotdir=$build
if command -v gnuplot >/dev/null 2>&1 && python3 "$root/bench/plot.py" "$doc" "$plotdir"; then
    echo "bench: drew $plotdir/bench-cycle.svg and $plotdir/bench-handoff.svg"
else
    echo "bench: no charts (gnuplot missing, or a figure not found)" >&2
fi
if command -v gnuplot >/dev/null 2>&1 &&
    python3 "$root/bench/contend.py" "$ctsv" "$doc" --plot "$plotdir"; then
    echo "bench: drew $plotdir/bench-contend.svg"
else
    echo "bench: no contention chart (gnuplot missing, or no rows)" >&2
fi
