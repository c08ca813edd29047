#!/usr/bin/env bash
# run.sh BUILD_DIR [--quick] -- runs the benchmarks against a private
# redis-server (free loopback port, temporary directory, no persistence),
# a temporary file store and a private standalone ZooKeeper server (free
# loopback port, temporary directory, no fsync), and writes
# docs/benchmarks.md (--quick: BUILD_DIR/benchmarks-quick.md).
set -euo pipefail
build=${1:-build-bench}
quick=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-XXXXXX")
pid=
zkpid=
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null
    [ -n "$zkpid" ] && kill "$zkpid" 2>/dev/null
    wait 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

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
kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=

# --- ZooKeeper: started only now, so that its JVM does not run beside the
# Redis figures
zk_jar=/usr/share/java/zookeeper.jar
zk_classpath=/etc/zookeeper/conf_example:$zk_jar
zkport=
zk4() { # zk4 WORD: the server's answer to a four-letter word
    (exec 3<>"/dev/tcp/127.0.0.1/$zkport" && echo "$1" >&3 && cat <&3) 2>/dev/null
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
    kill "$zkpid" 2>/dev/null || true; wait "$zkpid" 2>/dev/null || true; zkpid=
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
    if [ -n "$zkver" ]; then
        echo "- zookeeper: server $zkver (standalone, forceSync=no, $(java -version 2>&1 | head -1 | tr -d '"'))," \
             "libzookeeper_mt $(dpkg-query -W -f='${Version}' libzookeeper-mt2 2>/dev/null | sed 's/-.*//')"
    fi
    echo "- dlock: $(git -C "$root" describe --always --dirty 2>/dev/null || echo '?')"
    echo "- command: \`make bench\`${quick:+ (quick mode)}"
    echo
    cat "$out"
    echo
    cat "$zkout"
} >"$doc"
cat "$out"
echo
cat "$zkout"
echo
echo "bench: wrote $doc"
