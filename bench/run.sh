#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# run.sh BUILD_DIR [--quick] -- runs the benchmarks and writes
# docs/benchmarks.md (--quick: BUILD_DIR/benchmarks-quick.md). Every
# server is started by the tests' launcher, th_serve (tests/harness/
# serve.c, built into BUILD_DIR/tests), as the tests start them: real
# servers on free loopback ports, in a temporary directory, with their
# stock settings but for persistence (none for Redis, no fsync for
# ZooKeeper and PostgreSQL, MariaDB's log flushed once a second): a
# redis-server, a Sentinel set (a primary, two replicas and three
# sentinels), a Redis Cluster (three primaries and a replica of each), a
# redis-server with a TLS port beside its plain one, five redis-servers
# for Redlock (beside node-redlock, which npm installs under BUILD_DIR/npm,
# never in the tree), a standalone ZooKeeper server, an etcd member, a
# PostgreSQL server and a MariaDB server; the file store and SQLite's
# database files live in a temporary directory.
set -euo pipefail
# the tree the build was made from: read now, not when the document is
# written (a commit made during a 14-minute run would be named instead)
rev=$(git -C "$(dirname "$0")/.." describe --always --dirty 2>/dev/null || echo '?')
build=${1:-build-bench}
quick=${2:-}
q=() # the bench programs' own --quick
[ -n "$quick" ] && q=(--quick)
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-XXXXXX")
bin=$build/bench
cbin=$bin/dlock_bench_contend

# --- The servers: `serve KIND` starts th_serve KIND and keeps its stdin
# (a pipe) open; th_serve prints the store's URI, then words (ports=,
# tls_port=, cacert=, dir=), and keeps the servers until its stdin closes
# (`unserve KIND`, or this script's end, however it ends)
declare -A serve_fd serve_pid serve_dir
unserve() {
    local fd=${serve_fd[$1]:-}
    [ -n "$fd" ] || return 0
    exec {fd}>&-
    wait "${serve_pid[$1]}" 2>/dev/null || true
    unset "serve_fd[$1]" "serve_pid[$1]"
}
cleanup() {
    local k
    for k in "${!serve_fd[@]}"; do unserve "$k"; done
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
# serve KIND: sets SERVE_URI, SERVE_PORTS (an array), SERVE_TLS_PORT and
# SERVE_CA; 1 (th_serve's complaint on stderr) when it did not start
serve() {
    local kind=$1 fifo=$tmp/serve-$1.out fd out words w k
    mkfifo "$fifo"
    # the child closes the other servers' pipes: each th_serve must see
    # only its own caller's end close
    exec {fd}> >(for k in "${serve_fd[@]}"; do exec {k}>&-; done
        exec "$build/tests/th_serve" "$kind" >"$fifo" 2>"$tmp/serve-$kind.err")
    serve_fd[$kind]=$fd
    serve_pid[$kind]=$!
    exec {out}<"$fifo"
    # a JVM or a database made from nothing: 5 minutes on a busy machine
    if ! read -r -t 300 SERVE_URI <&"$out" || ! read -r -t 10 words <&"$out"; then
        exec {out}<&-
        unserve "$kind"
        echo "bench: th_serve $kind did not start:" >&2
        tail -5 "$tmp/serve-$kind.err" >&2
        return 1
    fi
    exec {out}<&-
    for w in $words; do
        case $w in
        ports=*) IFS=, read -r -a SERVE_PORTS <<<"${w#ports=}" ;;
        tls_port=*) SERVE_TLS_PORT=${w#tls_port=} ;;
        cacert=*) SERVE_CA=${w#cacert=} ;;
        dir=*) serve_dir[$kind]=${w#dir=} ;;
        esac
    done
}
# logs KIND: the end of every log of KIND's servers, on stderr
logs() {
    local f
    echo "bench: the $1 servers' logs:" >&2
    while read -r f; do
        tail -n 15 "$f" >&2 || true
    done < <(find "${serve_dir[$1]:-/nonexistent}" -name '*.log' 2>/dev/null)
}
# measure KIND OUT PROGRAM ARGS...: PROGRAM's figures appended to OUT;
# when it fails, its servers' logs, and the bench stops
measure() {
    local kind=$1 out=$2 prog=$3
    shift 3
    if ! "$bin/$prog" "$@" >>"$out"; then
        echo "bench: $prog failed" >&2
        logs "$kind"
        exit 1
    fi
}
# measurable OUT TITLE PROGRAM DEV SERVER TEST...: 0 when PROGRAM was
# built and TEST (a command) finds the server installed; else OUT is the
# store's "not measured" section, and 1
measurable() {
    local out=$1 title=$2 prog=$3 dev=$4 srv=$5
    shift 5
    if [ ! -x "$bin/$prog" ]; then
        printf '## %s\n\nNot measured: %s was not built (%s missing).\n' "$title" "$prog" "$dev" >"$out"
    elif ! "$@"; then
        printf '## %s\n\nNot measured: no %s on this machine.\n' "$title" "$srv" >"$out"
    else
        return 0
    fi
    return 1
}
# splice FILE: FILE's lines at the end of $out's Redis section
splice() {
    awk -v f="$1" '
        function add(l) { while ((getline l < f) > 0) print l; print ""; done = 1 }
        /^## / && seen && !done { add() }
        /^## Redis/ { seen = 1 }
        { print }
        END { if (!done) { print ""; add() } }
    ' "$out" >"$out.new" && mv "$out.new" "$out"
}
# has_py MODULE: Debian's python3 has MODULE
has_py() { /usr/bin/python3 -c "import $1" 2>/dev/null; }
# "${peer[@]}" ARGS...: bench/peer_py.py (a peer's figures or its worker)
peer=(/usr/bin/python3 "$root/bench/peer_py.py")

serve redis || exit 1
port=${SERVE_PORTS[0]}
mkdir -p "$tmp/locks"

out=$tmp/results.md
"$bin/dlock_bench" "redis://127.0.0.1:$port" "$tmp/locks" "${q[@]}" >"$out"
# --- Python peers (Debian packages, run by Debian's own python3; see
# bench/peer_py.py): one subsection each, appended to its store's section
# and beside dlock's figures of the same run
# table_fig FILE LABEL COLUMN: the first number of COLUMN in the first row
# of FILE's tables whose first cell starts with LABEL
table_fig() {
    awk -F'|' -v l="$2" -v c="$3" '
        index($2, l) == 2 { split($c, a, " "); print a[1]; exit }' "$1"
}
# py_peer KIND ADDRESS FILE PACKAGE: measures the peer beside the cycle
# and hand-off figures of FILE and prints its subsection (or why it was
# not measured)
py_peer() {
    local kind=$1 addr=$2 file=$3 pkg=$4 fig
    local cycle='uncontended acquire+release, p50' handoff='hand-off, release → waiter'
    fig=$(awk '/^## /{n++} n<=1' "$file") # the section's own tables only
    if ! has_py "$kind"; then
        printf '### Beside the %s peer\n\nNot measured: no %s on this machine.\n\n' "$kind" "$pkg"
        return 0
    fi
    "${peer[@]}" "$kind" "$addr" \
        "$(table_fig <(echo "$fig") "$cycle" 3)" \
        "$(table_fig <(echo "$fig") "$cycle" 4)" \
        "$(table_fig <(echo "$fig") "$handoff" 4)" "${q[@]}" ||
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
        if ! timeout 300 "$cbin" run "${args[@]}" -- "$@" \
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
# contend_dlock STORE LOAD URI [FLOOR [NAME]]: dlock's rows on URI, first
# come first served and fair (FLOOR: the contention floor's row, STORE if
# none; NAME: the rows' name, "dlock" if none)
contend_dlock() {
    local floor=${4:-$1} name=${5:-dlock}
    contend "$1|$name|$floor" "$2" "$cbin" worker "$3" contend-1
    contend "$1|$name, fair|$floor" "$2" "$cbin" worker "$3" contend-2 fair
}
# contend_py STORE LOAD URI MODULE NAME ADDRESS: dlock's row on URI, then
# the Python peer's (MODULE on ADDRESS, its row NAME)
contend_py() {
    contend "$1|dlock|$1" "$2" "$cbin" worker "$3" contend-1
    if has_py "$4"; then
        contend "$1|$5|$1" "$2" "${peer[@]}" contend "$4" "$6" contend-2
    fi
}
pyout=$tmp/results-redis-py.md
py_peer redis "$port" "$out" python3-redis >"$pyout"
# dlock's own Python package beside redis-py (python/, over this build)
pyenv=(env "PYTHONPATH=$root/python" "DLOCK_LIBRARY=$build/libdlock.so.0")
if has_py redis; then
    "${pyenv[@]}" "${peer[@]}" dlock-python \
        "redis://127.0.0.1:$port" "$port" "${q[@]}" >>"$pyout" ||
        printf '### dlock from Python, beside redis-py\n\nNot measured: its script failed (see the bench output).\n\n' >>"$pyout"
else
    printf '### dlock from Python, beside redis-py\n\nNot measured: no python3-redis on this machine.\n\n' >>"$pyout"
fi
splice "$pyout"

echo "bench: ${SECONDS}s: many locks" >&2
# --- Many locks on the same redis-server (100,000 names held at once;
# --quick: 10,000), after the peer: its subsection ends the Redis section
if [ -x "$bin/dlock_bench_many" ]; then
    : >"$tmp/results-many.md"
    measure redis "$tmp/results-many.md" dlock_bench_many "redis://127.0.0.1:$port" "${q[@]}"
    splice "$tmp/results-many.md"
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
    "$bin/dlock_bench_list" "redis://127.0.0.1:$port" "${q[@]}"
    echo
    echo "### The exporter (\`dlock exporter\`)"
    echo
    echo "Whole scrapes of \`GET /metrics\` (connect, request, the answer's last byte), as Prometheus makes them, with 10,000 locks held by another process; every scrape checked (HTTP 200, the store up, 10,000 locks). The target: 1 s."
    echo
    echo "| scrape | median | slowest | ÷ target |"
    echo "|---|---|---|---|"
    "$bin/dlock_bench_exporter" "$build/dlock" "redis://127.0.0.1:$port" 10000 "$scrapes" 2>/dev/null
    "$bin/dlock_bench_exporter" "$build/dlock" "file://$tmp/exporter-locks" 10000 "$scrapes" 2>/dev/null
} >"$opout"
splice "$opout"

# --- Shared holds and semaphores (bench/bench_rw.c): one subsection at
# the end of the Redis section and one at the end of the file store's
"$bin/dlock_bench_rw" "redis://127.0.0.1:$port" "${q[@]}" >"$tmp/results-rw-redis.md"
splice "$tmp/results-rw-redis.md"
"$bin/dlock_bench_rw" "file://$tmp/locks" "${q[@]}" >>"$out"

# --- Sentinel (bench/bench_sentinel.c) and Cluster (bench/
# bench_cluster.c): each the store through its servers beside redis:// on
# the primary of the lock; one subsection each at the end of the Redis
# section. th_serve returns once every replica is in sync (and every
# sentinel knows the set, or the cluster's slot map agrees everywhere)
# redis_set KIND TITLE PROGRAM: the subsection on th_serve KIND's servers
redis_set() {
    local kind=$1 title=$2 prog=$3 res=$tmp/results-$1.md why=
    if [ ! -x "$bin/$prog" ]; then
        why="$prog was not built (libhiredis-dev missing)"
    elif ! serve "$kind"; then
        why="its servers did not start (see the bench output)"
    else
        "$bin/$prog" "$SERVE_URI" "redis://127.0.0.1:${SERVE_PORTS[0]}" "${q[@]}" >"$res" ||
            why="$prog failed (see the bench output)"
        unserve "$kind"
    fi
    [ -z "$why" ] || printf '### %s\n\nNot measured: %s.\n\n' "$title" "$why" >"$res"
    splice "$res"
}
redis_set redis-sentinel 'Redis Sentinel (redis-sentinel://)' dlock_bench_sentinel
redis_set redis-cluster 'Redis Cluster (redis-cluster://)' dlock_bench_cluster

# --- Redis over TLS (bench/bench_tls.c): a redis-server with a TLS port
# beside its plain port, serving the tests' certificate for localhost
# (tests/servers/tlscerts.sh: a CA and a server certificate for
# DNS:localhost, EC P-256); the cycles and whole commands, then
# redis-py's cycle over TLS; its contention rows follow the Redis ones
# below, then a summary of them ends the subsection, which goes at the end
# of the Redis section, after the Cluster one
tlsout=$tmp/results-tls.md
tlsport=
# shellcheck disable=SC2016 # Markdown's backquotes, not a command
tls_head='### Redis over TLS (`rediss://`)'
if [ ! -x "$bin/dlock_bench_tls" ]; then
    printf '%s\n\nNot measured: dlock_bench_tls was not built (a build without TLS: libssl-dev missing).\n\n' "$tls_head" >"$tlsout"
elif ! command -v openssl >/dev/null 2>&1; then
    printf '%s\n\nNot measured: no openssl CLI (Debian package openssl) to make its certificates.\n\n' "$tls_head" >"$tlsout"
elif ! serve rediss; then
    printf '%s\n\nNot measured: its redis-server did not start with TLS (see the bench output).\n\n' "$tls_head" >"$tlsout"
else
    echo "bench: ${SECONDS}s: Redis over TLS" >&2
    tlsport=$SERVE_TLS_PORT
    tlsplain=${SERVE_PORTS[0]}
    tlsca=$SERVE_CA
    if ! "$bin/dlock_bench_tls" "$tlsport" "$tlsplain" "$tlsca" \
        "$(cd "$build" && pwd)/dlock" "${q[@]}" >"$tlsout"; then
        printf '%s\n\nNot measured: dlock_bench_tls failed (see the bench output).\n\n' "$tls_head" >"$tlsout"
    elif ! has_py redis; then
        printf '**Beside redis-py over TLS**: not measured: no python3-redis on this machine.\n\n' >>"$tlsout"
    else
        tls_dlock_us=$(table_fig "$tlsout" 'over TLS (' 4)
        "${peer[@]}" redis-tls "$tlsport,$tlsca" "$tls_dlock_us" "${q[@]}" >>"$tlsout" ||
            printf '**Beside redis-py over TLS**: not measured: its script failed (see the bench output).\n\n' >>"$tlsout"
    fi
fi

contend_dlock Redis "redis $port" "redis://127.0.0.1:$port"
if has_py redis; then
    contend "Redis|redis-py, sleep 0.1 s (its default)|Redis" "redis $port" \
        "${peer[@]}" contend redis "$port" contend-3
    contend "Redis|redis-py, sleep 1 ms|Redis" "redis $port" \
        "${peer[@]}" contend redis "$port" contend-4 0.001
fi
if true; then  # (dlock's package needs nothing but Python: ctypes)
    contend "Redis|dlock-python|Redis" "redis $port" "${pyenv[@]}" \
        "${peer[@]}" contend dlock \
        "redis://127.0.0.1:$port" contend-5
fi
# over TLS, on the TLS server (its plain port counts the commands): at 8
# processes in --quick too (the target's figures), then a summary of those
# ends the TLS subsection, spliced at the end of the Redis section
if [ -n "$tlsport" ]; then
    tls_ns="2 8 64"
    [ -n "$quick" ] && tls_ns=8
    contend_ns=$tls_ns contend_dlock "Redis over TLS" "redis $tlsplain" \
        "rediss://127.0.0.1:$tlsport?cacert=$tlsca&sni=localhost"
    if has_py redis; then
        contend_ns=$tls_ns contend "Redis over TLS|redis-py, sleep 0.1 s (its default)|Redis over TLS" \
            "redis $tlsplain" "${peer[@]}" contend redis-tls "$tlsport,$tlsca" contend-3
        contend_ns=$tls_ns contend "Redis over TLS|redis-py, sleep 1 ms|Redis over TLS" \
            "redis $tlsplain" "${peer[@]}" contend redis-tls "$tlsport,$tlsca" contend-4 0.001
    fi
    python3 "$root/bench/contend.py" "$ctsv" --pick "Redis over TLS" 8 >>"$tlsout" ||
        printf '**Contention over TLS**: not summarised: bench/contend.py failed (see the bench output).\n\n' >>"$tlsout"
    unserve rediss
fi
splice "$tlsout"
# the file store, on the kernel's lock alone and through dlock
ofd="kernel OFD lock (floor: fcntl F_OFD_SETLKW)"
contend "File store|$ofd|" "" "$cbin" worker-ofd "$tmp/ofd-lock"
contend_dlock "File store" "" "file://$tmp/locks" "row:$ofd"

unserve redis

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
elif [ ! -x "$bin/dlock_bench_cli" ]; then
    printf '\n### The CLI: one whole command under a file lock\n\nNot measured: dlock_bench_cli was not built.\n' >>"$out"
else
    flockver=$("$flock_bin" --version 2>/dev/null | sed -n 's/^flock from //p')
    mkdir -p "$tmp/cli"
    "$bin/dlock_bench_cli" "$(cd "$build" && pwd)/dlock" "$flock_bin" \
        "$tmp/cli" "${q[@]}" >>"$out"
fi

echo "bench: ${SECONDS}s: Redlock" >&2
# --- Redlock: five redis-servers, dlock's redlock:// store beside a bare
# hiredis quorum floor and node-redlock (npm redlock 5 on ioredis)
rlout=$tmp/results-redlock.md
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
if measurable "$rlout" Redlock dlock_bench_redlock libhiredis-dev '' true; then
    serve redlock || exit 1
    rlports="${SERVE_PORTS[*]}"
    rlnodes=$(printf '127.0.0.1:%s,' "${SERVE_PORTS[@]}")
    rlnodes=${rlnodes%,}
    rlfirst=${rlnodes%%,*}
    if [ -n "$rl_peer_skip" ]; then
        rl_peer=(--no-peer "$rl_peer_skip")
    else
        rl_peer=(--peer "$root/bench/redlock_peer.js" "$npmdir/node_modules")
    fi
    : >"$rlout"
    measure redlock "$rlout" dlock_bench_redlock "$rlnodes" "${q[@]}" "${rl_peer[@]}"
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
    unserve redlock
fi

echo "bench: ${SECONDS}s: ZooKeeper" >&2
# --- ZooKeeper: started only now, so that its JVM does not run beside the
# Redis figures
zkout=$tmp/results-zk.md
zkver=
zk_installed() { command -v java >/dev/null 2>&1 && [ -r /usr/share/java/zookeeper.jar ]; }
if measurable "$zkout" ZooKeeper dlock_bench_zk libzookeeper-mt-dev \
    'ZooKeeper server (Debian package zookeeper)' zk_installed; then
    serve zk || exit 1
    zkport=${SERVE_PORTS[0]}
    zku="zk://127.0.0.1:$zkport/dlock-bench"
    # the version, from the four-letter word srvr
    zkver=$( (exec 3<>"/dev/tcp/127.0.0.1/$zkport" && echo srvr >&3 &&
        timeout 3 cat <&3) 2>/dev/null |
        sed -n 's/^Zookeeper version: \([^-,]*\).*/\1/p')
    measure zk "$zkout" dlock_bench_zk "$zku" "${q[@]}"
    { echo; py_peer kazoo "127.0.0.1:$zkport" "$zkout" python3-kazoo; } >"$zkout.peer"
    cat "$zkout.peer" >>"$zkout"
    "$bin/dlock_bench_rw" "$zku" "${q[@]}" >>"$zkout"
    contend_py ZooKeeper "zk $zkport" "$zku" kazoo kazoo "127.0.0.1:$zkport"
    unserve zk
fi

echo "bench: ${SECONDS}s: etcd" >&2
# --- etcd: one member

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
etcd_installed() { command -v etcd >/dev/null 2>&1 && command -v etcdctl >/dev/null 2>&1; }
if measurable "$etcdout" etcd dlock_bench_etcd libcurl4-openssl-dev \
    'etcd (Debian packages etcd-server, etcd-client)' etcd_installed; then
    serve etcd || exit 1
    ep=127.0.0.1:${SERVE_PORTS[0]}
    eu="etcd://$ep?prefix=dlock-bench"
    etcdver=$(etcd --version | sed -n 's/^etcd Version: //p')
    measure etcd "$etcdout" dlock_bench_etcd "$eu" "${q[@]}"
    "$bin/dlock_bench_rw" "$eu" "${q[@]}" >"$etcdout.rw"
    # the CLI: a whole command under the lock, dlock beside etcdctl
    runs=20
    [ -n "$quick" ] && runs=5
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
    py_peer etcd3 "$ep" "$etcdout" python3-etcd3 >"$etcdout.peer"
    { echo; cat "$etcdout.peer"; cat "$etcdout.rw"; } >>"$etcdout"
    contend_py etcd "etcd ${SERVE_PORTS[0]}" "$eu" etcd3 python-etcd3 "$ep"
    unserve etcd
fi

echo "bench: ${SECONDS}s: SQLite" >&2
# --- SQLite: database files in the temporary directory
sqout=$tmp/results-sqlite.md
if measurable "$sqout" SQLite dlock_bench_sqlite libsqlite3-dev '' true; then
    mkdir -p "$tmp/sqlite"
    "$bin/dlock_bench_sqlite" "$tmp/sqlite" "${q[@]}" >"$sqout"
    # shared holds and semaphores (bench/bench_rw.c), ending the section
    "$bin/dlock_bench_rw" "sqlite://$tmp/sqlite/rw.db" "${q[@]}" >>"$sqout"
    contend "SQLite|dlock|SQLite" "" "$cbin" worker "sqlite://$tmp/sqlite/contend.db" contend-1
fi

# --- PostgreSQL and MariaDB: private servers (tests/servers/sqlserver.sh
# through th_serve: the user dlock with every privilege; PostgreSQL with
# fsync off, MariaDB's InnoDB log flushed once a second, unless
# DLOCK_SQL_DURABLE=1)
# rw_titled SUFFIX URI: bench_rw's subsections on URI, SUFFIX after the
# titles "Shared holds and semaphores" and "Leader election"
rw_titled() {
    "$bin/dlock_bench_rw" "$2" "${q[@]}" |
        sed -e "s/^### Shared holds and semaphores\$/### Shared holds and semaphores$1/" \
            -e "s/^### Leader election\$/### Leader election$1/"
}

echo "bench: ${SECONDS}s: PostgreSQL" >&2
pgout=$tmp/results-pg.md
pgver=
pg_installed() { compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null && command -v psql >/dev/null 2>&1; }
if measurable "$pgout" PostgreSQL dlock_bench_pg libpq-dev \
    'PostgreSQL server (Debian packages postgresql, postgresql-client)' pg_installed; then
    serve pg || exit 1
    pu=$SERVE_URI
    pgver=$(PGPASSWORD=dlock-secret PGCONNECT_TIMEOUT=5 psql -X -q -At \
        -h 127.0.0.1 -p "${SERVE_PORTS[0]}" -U dlock postgres -c 'show server_version' 2>/dev/null)
    measure pg "$pgout" dlock_bench_pg "$pu" "${q[@]}"
    # in table mode, then in advisory mode, ending the section
    rw_titled ' (table mode)' "$pu" >>"$pgout"
    rw_titled ' (advisory mode)' "$pu?mode=advisory" >>"$pgout"
    contend_dlock PostgreSQL "pg ${SERVE_PORTS[0]}" "$pu" PostgreSQL 'dlock, table mode'
    contend "PostgreSQL|dlock, advisory mode|PostgreSQL advisory" "pg ${SERVE_PORTS[0]}" \
        "$cbin" worker "$pu?mode=advisory" contend-3
    unserve pg
fi

echo "bench: ${SECONDS}s: MariaDB" >&2
myout=$tmp/results-mysql.md
myver=
my_installed() {
    { command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ]; } &&
        command -v mariadb >/dev/null 2>&1
}
if measurable "$myout" 'MySQL / MariaDB' dlock_bench_mysql libmariadb-dev \
    'MariaDB server (Debian package mariadb-server)' my_installed; then
    serve mysql || exit 1
    mu=$SERVE_URI
    myver=$(mariadb --no-defaults --connect-timeout=5 -h127.0.0.1 -P"${SERVE_PORTS[0]}" \
        -udlock -pdlock-secret dlocktest -N -e 'SELECT VERSION()' 2>/dev/null)
    measure mysql "$myout" dlock_bench_mysql "$mu" "${q[@]}"
    rw_titled '' "$mu" >>"$myout"
    contend_dlock 'MySQL / MariaDB' "mysql ${SERVE_PORTS[0]}" "$mu" MariaDB
    unserve mysql
fi

cpu=$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1)
doc=$root/docs/benchmarks.md
[ -n "$quick" ] && doc=$build/benchmarks-quick.md
data_fs=$(df -P "$tmp" | awk 'NR==2 {print $1}')
sections() { # every store's section, in the document's order
    local f
    for f in "$out" "$rlout" "$zkout" "$etcdout" "$sqout" "$pgout" "$myout"; do
        [ "$f" = "$out" ] || echo
        cat "$f"
    done
}
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
        echo "- etcd: $etcdver (one member, data on $data_fs), libcurl $(pkg-config --modversion libcurl 2>/dev/null || echo '?')," \
             "cJSON $(pkg-config --modversion libcjson 2>/dev/null || echo '?')"
    fi
    if [ -n "$pgver" ]; then
        pgsync="fsync off"
        [ "${DLOCK_SQL_DURABLE:-0}" = 1 ] && pgsync="fsync on"
        echo "- postgresql: $pgver; a private server ($pgsync, data on $data_fs)," \
             "libpq $(pkg-config --modversion libpq 2>/dev/null || echo '?')"
    fi
    if [ -n "$myver" ]; then
        mysync="InnoDB log flushed once a second"
        [ "${DLOCK_SQL_DURABLE:-0}" = 1 ] && mysync="InnoDB log flushed at every commit"
        echo "- mariadb: $myver; a private server ($mysync, data on $data_fs)," \
             "libmariadb $(pkg-config --modversion libmariadb 2>/dev/null || echo '?')"
    fi
    echo "- dlock: $rev"
    echo "- command: \`make bench\`${quick:+ (quick mode)}"
    echo
    sections
} >"$doc"
contout=$tmp/results-contend.md
if python3 "$root/bench/contend.py" "$ctsv" "$doc" >"$contout"; then
    { echo; cat "$contout"; } >>"$doc"
else
    printf '\n## Contention\n\nNot tabulated: bench/contend.py failed (see the output).\n' >>"$doc"
fi
sections
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
