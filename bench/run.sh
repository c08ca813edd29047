#!/usr/bin/env bash
# run.sh BUILD_DIR [--quick] -- runs the benchmark against a private
# redis-server (free loopback port, temporary directory, no persistence)
# and a temporary file store, and writes docs/benchmarks.md.
set -euo pipefail
build=${1:-build-bench}
quick=${2:-}
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlock-bench-XXXXXX")
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
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
"$build/bench/dlock_bench" "redis://127.0.0.1:$port" "$tmp/locks" $quick >"$out"

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
    echo "- dlock: $(git -C "$root" describe --always --dirty 2>/dev/null || echo '?')"
    echo "- command: \`make bench\`${quick:+ (quick mode)}"
    echo
    cat "$out"
} >"$doc"
cat "$out"
echo
echo "bench: wrote $doc"
