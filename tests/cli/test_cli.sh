#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2016,SC2317
# (SC2016: single-quoted "$VAR"s are for the command's own shell; SC2317:
# cleanup runs from the EXIT trap.)
#
# test_cli.sh -- the dlock command-line tool, through its real binary.
#
#   bash test_cli.sh /path/to/dlock file|redis|rediss|redlock|zk|etcd|sqlite|pg|pg-advisory|mysql
#
# "redis" starts a private redis-server (from PATH) on a free loopback port
# in a temporary directory and stops it on exit; "rediss" the same with a
# TLS port too (certificates made by tests/servers/tlscerts.sh), dlock on
# the TLS port (rediss://localhost, the test CA) and redis-cli on the plain
# one, plus the TLS failures (exit 69); "redlock" three of them
# (redlock://, quorum 2; at the end it freezes one, then kills two); "zk"
# likewise a private standalone ZooKeeper server (java from PATH,
# /usr/share/java/zookeeper.jar: Debian's zookeeper package); "etcd" a
# private etcd member (Debian's etcd-server; etcdctl from etcd-client);
# "pg", "pg-advisory" and "mysql" a private PostgreSQL or MariaDB server
# (tests/servers/sqlserver.sh; psql and the mariadb client look behind
# dlock's back). Every wait is bounded; the whole script takes well under a
# minute. Each failed assertion prints a "FAIL:" line; the exit status is 1
# if any failed, 0 otherwise.

set -u

# shellcheck source-path=SCRIPTDIR source=report_lib.sh
. "$(dirname "$0")/report_lib.sh"
need_args 2 "/path/to/dlock file|redis|rediss|redis-sentinel|redis-cluster|redlock|zk|etcd|sqlite|pg|pg-advisory|mysql" "$@"
DLOCK=$1
KIND=$2
case $KIND in
file | redis | rediss | redis-sentinel | redis-cluster | redlock | zk | etcd | sqlite | pg | pg-advisory | mysql) ;;
file-home)
    # The default store's part of "file", which runs it so, as root, in a
    # mount namespace of its own (unshare -m): a fresh tmpfs on /tmp here,
    # and (home_tests) a fresh directory on the home directory and copies
    # of /etc/passwd and /etc/shadow. Never in the machine's namespace.
    if [ "$(readlink /proc/self/ns/mnt)" = "$(readlink /proc/$PPID/ns/mnt)" ]; then
        echo "test_cli.sh: file-home runs only from 'test_cli.sh DLOCK file'" >&2
        exit 2
    fi
    # a dlock built under /tmp (a checkout there) stays where it is: its
    # build directory is bound back into the fresh /tmp, same path
    keep=
    case $(readlink -f "$DLOCK") in
    /tmp/*) keep=$(dirname "$(readlink -f "$DLOCK")") ;;
    esac
    if [ -n "$keep" ]; then
        aside=$(mktemp -d /run/dlock-cli-keep.XXXXXX) &&
            mount --bind "$keep" "$aside" || {
            echo "FAIL: cannot keep $keep aside in the namespace" >&2
            exit 1
        }
    fi
    if ! mount -t tmpfs -o mode=1777,nosuid,nodev dlocktest /tmp; then
        echo "FAIL: cannot mount a tmpfs on /tmp in the namespace" >&2
        exit 1
    fi
    if [ -n "$keep" ]; then
        mkdir -p "$keep" && mount --bind "$aside" "$keep" || {
            echo "FAIL: cannot bind $keep back in the namespace" >&2
            exit 1
        }
        umount "$aside" && rmdir "$aside"
    fi
    ;;
*)
    echo "test_cli.sh: store kind must be 'file', 'redis', 'rediss', 'redis-sentinel', 'redis-cluster', 'redlock', 'zk', 'etcd', 'sqlite', 'pg', 'pg-advisory' or 'mysql', not '$KIND'" >&2
    exit 2
    ;;
esac
if [ ! -x "$DLOCK" ]; then
    echo "FAIL: $DLOCK is not an executable file" >&2
    exit 1
fi

FAILS=0
PASSES=0
SKIPS=0
BG_PIDS=()
REDIS_PIDS=()  # one redis-server per node (redis: 1, redlock: 3)
REDIS_PORTS=()
REDIS_PORT=    # the first node's port
REDIS_TLS=     # rediss: 1 (the node gets a TLS port too)
REDIS_TLS_PORT=
CERTS=         # rediss: tlscerts.sh's directory
TLS_STORE=     # rediss: the store URI over TLS
PW_STORE=      # redlock: DLOCK_STORE with user dlu and its password
ZK_PID=
ZK_PORT=
ETCD_PID=
ETCD_PORT=
SQL_PID=
SQL_PORT=
SQL_DIR=
SQLSERVER=$(cd "$(dirname "$0")/../servers" && pwd)/sqlserver.sh
TLSCERTS=$(cd "$(dirname "$0")/../servers" && pwd)/tlscerts.sh
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dlock-cli-XXXXXX") || {
    echo "FAIL: mktemp -d failed" >&2
    exit 1
}

cleanup() {
    local p
    for p in "${BG_PIDS[@]}"; do
        kill -KILL "$p" 2>/dev/null
    done
    for p in "${REDIS_PIDS[@]}"; do
        if [ -n "$p" ]; then
            kill -KILL "$p" 2>/dev/null
            wait "$p" 2>/dev/null
        fi
    done
    if [ -n "$ZK_PID" ]; then
        kill -KILL "$ZK_PID" 2>/dev/null # also when SIGSTOPped
        wait "$ZK_PID" 2>/dev/null
    fi
    if [ -n "$ETCD_PID" ]; then
        kill -KILL "$ETCD_PID" 2>/dev/null
        wait "$ETCD_PID" 2>/dev/null
    fi
    if [ -n "$SQL_PID" ]; then
        kill -INT "$SQL_PID" 2>/dev/null # PostgreSQL: a fast shutdown
        kill -TERM "$SQL_PID" 2>/dev/null
        wait "$SQL_PID" 2>/dev/null
    fi
    if [ -z "${DLOCK_TEST_KEEP:-}" ]; then
        rm -rf "$TMP"
    else
        echo "kept $TMP" >&2
    fi
}
trap cleanup EXIT


# Every foreground dlock call is bounded, so a hang fails instead of
# stalling the suite (exit 124 then).
if command -v timeout >/dev/null 2>&1; then
    BOUND=(timeout -k 2 20)
else
    BOUND=()
fi

# Starts dlock in the background (output in $TMP/bg.<tag>.out/.err); its pid
# in BG.
bg_dlock() {
    local tag=$1
    shift
    "$DLOCK" "$@" >"$TMP/bg.$tag.out" 2>"$TMP/bg.$tag.err" </dev/null &
    BG=$!
    BG_PIDS+=("$BG")
}

# is_held NAME: the store says NAME is held.
is_held() {
    "${BOUND[@]}" "$DLOCK" status --json "$1" 2>/dev/null </dev/null |
        grep -q '"held":true'
}

# wait_held NAME PID: waits (at most 10 s) until NAME is held; fails early
# if PID (the would-be holder) exits first. Returns 0 when held.
wait_held() {
    local name=$1 pid=$2 i
    for ((i = 0; i < 100; i++)); do
        if is_held "$name"; then
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            return 1
        fi
        sleep 0.1
    done
    return 1
}

# tok_close STATUS_TOKEN HOLDER_TOKEN: the token `dlock status` shows
# stands for the holder's. redlock: the status shows the highest fencing
# counter among the nodes (a node that answered after the quorum may be a
# little ahead; counters start from the nodes' clocks in microseconds), so
# its counter (token / 64) is at least the holder's and less than a second
# of microseconds above it, whatever the node index (token % 64)
# (docs/redlock.md, "Fencing tokens"). Other stores: the same number.
tok_close() {
    [[ $1 =~ ^[0-9]+$ && $2 =~ ^[0-9]+$ ]] || return 1
    if [ "$KIND" = redlock ]; then
        local d=$(((10#$1 >> 6) - (10#$2 >> 6)))
        ((d >= 0 && d < 1000000))
    else
        [ "$1" = "$2" ]
    fi
}

# --------------------------------------------------------------------------
# The default store: one directory per user, whatever the environment
# (docs/stores.md, "The default store"): HOME/.local/state/dlock, HOME
# from the passwd entry. No variable moves it, so this part runs in a
# mount namespace of its own (see file-home above) with a fresh directory
# on the home of our passwd entry and a test user (uid 4242) in copies of
# /etc/passwd and /etc/shadow: what the library does in production, and
# nothing outside the namespace sees it.
# --------------------------------------------------------------------------

# dl_env ENV-ARGS... -- ARGS...: dl, with `env ENV-ARGS...` in front
dl_env() {
    local e=()
    while [ "$1" != -- ]; do
        e+=("$1")
        shift
    done
    shift
    "${BOUND[@]}" env "${e[@]}" "$DLOCK" "$@" >"$TMP/out" 2>"$TMP/err" </dev/null
    RC=$?
}

# check_rc WANT DESCRIPTION: the last dl's (or dl_env's) status is WANT
check_rc() {
    if [ "$RC" -eq "$1" ]; then
        pass "$2 (exit $RC)"
    else
        fail "$2: exit $RC, expected $1"
        show "$TMP/out" "$TMP/err"
    fi
}

# held_by WHO NAME: NAME is held in WHO's default store (WHO: "" for us,
# else a user for runuser)
held_by() {
    local who=$1 name=$2
    if [ -n "$who" ]; then
        "${BOUND[@]}" runuser -u "$who" -- "$DLOCK" status --json "$name" </dev/null 2>/dev/null
    else
        "${BOUND[@]}" "$DLOCK" status --json "$name" </dev/null 2>/dev/null
    fi | grep -q '"held":true'
}

# wait_held_by WHO NAME PID: waits (10 s at most) until NAME is held in
# WHO's store; fails early if PID exits first
wait_held_by() {
    local i
    for ((i = 0; i < 100; i++)); do
        held_by "$1" "$2" && return 0
        kill -0 "$3" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# release_holder PID: the holder's command (reading the fifo $TMP/go)
# ends; the holder must exit 0 within 10 s
release_holder() {
    timeout 5 sh -c 'echo go > "$0"' "$TMP/go"
    if wait_exit "$1" 10 && [ "$WRC" = 0 ]; then
        return 0
    fi
    fail "the holder did not end cleanly: $WRC"
    return 1
}

home_tests() {
    local home store ustore uhome h w how
    DLOCK=$(realpath "$DLOCK") # for su - (another directory) and dlt
    home=$(realpath "$(getent passwd "$(id -u)" | cut -d: -f6)")
    if ! mkdir -m 700 "$TMP/home" || ! mount --bind "$TMP/home" "$home"; then
        fail "cannot mount a fresh directory on $home"
        return
    fi
    unset DLOCK_STORE XDG_RUNTIME_DIR XDG_STATE_HOME
    store="file://$home/.local/state/dlock?private=1"
    mkfifo -m 666 "$TMP/go"

    # dlock status says where it is
    dl status nightly
    if [ "$RC" -eq 0 ] && grep -qxF "store:    $store" "$TMP/out"; then
        pass "default store: status shows $store"
    else
        fail "default store: status: exit $RC, expected 'store:    $store'"
        show "$TMP/out" "$TMP/err"
    fi
    dl status --json nightly
    if [ "$RC" -eq 0 ] && grep -qF "\"store\":\"$store\"" "$TMP/out"; then
        pass "default store: status --json shows it"
    else
        fail "default store: status --json: exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi

    # A holder started from a login session (XDG_RUNTIME_DIR set, HOME
    # elsewhere); then a cron job's run (no XDG_RUNTIME_DIR), one under
    # env -i, one with other HOME and XDG_STATE_HOME (sudo's kind), and
    # su - root's: each finds the lock held (exit 75 with --wait 0).
    mkdir -m 700 "$TMP/xdg"
    env XDG_RUNTIME_DIR="$TMP/xdg" HOME=/ "$DLOCK" run nightly -- \
        sh -c 'read -r x < "$0"' "$TMP/go" >"$TMP/bg.hold.out" 2>"$TMP/bg.hold.err" </dev/null &
    h=$!
    BG_PIDS+=("$h")
    if wait_held_by "" nightly "$h"; then
        dl_env -u XDG_RUNTIME_DIR -- run --wait 0 nightly -- true
        check_rc 75 "default store: held from a session, busy for a cron-like run"
        dl_env -i -- run --wait 0 nightly -- true
        check_rc 75 "default store: busy under env -i"
        dl_env HOME=/tmp XDG_RUNTIME_DIR=/tmp XDG_STATE_HOME=/tmp -- run --wait 0 nightly -- true
        check_rc 75 "default store: busy with another HOME and XDG_STATE_HOME"
        "${BOUND[@]}" su - root -c "$(printf '%q' "$DLOCK") run --wait 0 nightly -- true" >"$TMP/out" 2>"$TMP/err" </dev/null
        RC=$?
        check_rc 75 "default store: busy through su - root"
        # a waiter with no XDG_RUNTIME_DIR waits for that holder, and
        # gets the lock when it ends
        env -u XDG_RUNTIME_DIR "$DLOCK" run --wait 20s nightly -- true \
            >"$TMP/bg.wait.out" 2>"$TMP/bg.wait.err" </dev/null &
        w=$!
        BG_PIDS+=("$w")
        # not a bound: a waiter that has not started yet also waits
        sleep 0.5
        if kill -0 "$w" 2>/dev/null && release_holder "$h" &&
            wait_exit "$w" 10 && [ "$WRC" = 0 ]; then
            pass "default store: a cron-like waiter waited for the session's holder"
        else
            fail "default store: the waiter: exit ${WRC:-none} (expected to wait, then 0)"
            show "$TMP/bg.wait.err"
        fi
    else
        fail "default store: the session's holder never held (in the store a run without XDG_RUNTIME_DIR sees)"
        show "$TMP/bg.hold.err"
    fi

    # the earlier default's places, made first by another user, neither
    # block nor split it (this /tmp is the namespace's own)
    mkdir -m 700 "/tmp/dlock-$(id -u)" "$TMP/xdg2" "$TMP/xdg2/dlock"
    chown 12345:12345 "/tmp/dlock-$(id -u)" "$TMP/xdg2/dlock"
    dl_env XDG_RUNTIME_DIR="$TMP/xdg2" -- run oldL -- true
    check_rc 0 "default store: another user's \$XDG_RUNTIME_DIR/dlock blocks nothing"
    dl run oldL -- true
    check_rc 0 "default store: another user's /tmp/dlock-\$UID blocks nothing"

    # a home others may write: refused, the message naming it and the
    # way out, the command not run
    chmod 777 "$home"
    rm -f "$TMP/ran"
    dl run refL -- sh -c ': > "$0"' "$TMP/ran"
    if [ "$RC" -eq 69 ] && [ ! -e "$TMP/ran" ] && grep -qF "$home" "$TMP/err" &&
        grep -qF -- "--store file:///DIR" "$TMP/err"; then
        pass "default store: a home others may write: exit 69, '$(head -c 100 "$TMP/err")...'"
    else
        fail "default store: a home others may write: exit $RC (expected 69, $home named): $(cat "$TMP/err")"
    fi
    dl status refL
    if [ "$RC" -eq 69 ] && grep -qF "$home" "$TMP/err"; then
        pass "default store: status names the refused directory (exit 69)"
    else
        fail "default store: status with a home others may write: exit $RC: $(cat "$TMP/err")"
    fi
    chmod 700 "$home"

    # Another user, 4242 (dlt): its own directory, the same for a
    # session's holder (setpriv with XDG_RUNTIME_DIR), su dlt (the
    # caller's environment), su - dlt (a login's), runuser -u dlt (as
    # sudo -u runs) and env -i (cron's).
    chmod 755 "$TMP"
    uhome=$TMP/u
    mkdir -m 755 "$uhome"
    chown 4242:4242 "$uhome"
    { grep -v '^[^:]*:[^:]*:424[2-8]:' /etc/passwd; echo "dlt:x:4242:4242::$uhome:/bin/sh"; } >"$TMP/passwd"
    { grep -v '^dlt:' /etc/shadow; echo 'dlt:*:19000:0:99999:7:::'; } >"$TMP/shadow"
    chmod 644 "$TMP/passwd"
    chmod 640 "$TMP/shadow"
    if ! mount --bind "$TMP/passwd" /etc/passwd || ! mount --bind "$TMP/shadow" /etc/shadow ||
        [ "$(getent passwd 4242 | cut -d: -f6)" != "$uhome" ]; then
        echo "skip default store of another user (a test user in /etc/passwd is not seen)"
        return
    fi
    if ! "${BOUND[@]}" runuser -u dlt -- "$DLOCK" --version >/dev/null 2>&1 </dev/null; then
        echo "skip default store of another user (it cannot run $DLOCK: a build in a private directory)"
        return
    fi
    ustore="file://$uhome/.local/state/dlock?private=1"
    setpriv --reuid=4242 --regid=4242 --clear-groups \
        env XDG_RUNTIME_DIR=/run/user/4242 "$DLOCK" run nightly -- \
        sh -c 'read -r x < "$0"' "$TMP/go" >"$TMP/bg.uhold.out" 2>"$TMP/bg.uhold.err" </dev/null &
    h=$!
    BG_PIDS+=("$h")
    if ! wait_held_by dlt nightly "$h"; then
        fail "default store: dlt's holder never held"
        show "$TMP/bg.uhold.err"
        return
    fi
    for how in "su dlt -c" "su - dlt -c" "runuser -u dlt -- sh -c" \
        "setpriv --reuid=4242 --regid=4242 --clear-groups env -i sh -c"; do
        # shellcheck disable=SC2086 # split on purpose
        "${BOUND[@]}" $how "$(printf '%q' "$DLOCK") run --wait 0 nightly -- true" \
            >"$TMP/out" 2>"$TMP/err" </dev/null
        RC=$?
        check_rc 75 "default store: dlt's lock busy through '$how'"
    done
    "${BOUND[@]}" runuser -u dlt -- "$DLOCK" status nightly >"$TMP/out" 2>"$TMP/err" </dev/null
    if grep -qxF "store:    $ustore" "$TMP/out" &&
        [ "$(stat -c '%u %a' "$uhome/.local/state/dlock")" = "4242 700" ]; then
        pass "default store: dlt's is $ustore, dlt's own, 0700"
    else
        fail "default store: dlt's status: $(cat "$TMP/out" "$TMP/err")"
    fi
    # each user has their own: root's nightly is free meanwhile
    dl run --wait 0 nightly -- true
    check_rc 0 "default store: root's lock of the same name is another one"
    release_holder "$h" && pass "default store: dlt's holder ended"
}

START_MS=$(now_ms)

if [ "$KIND" = file-home ]; then
    home_tests
    echo "# $KIND: $PASSES passed, $FAILS failed, $(($(now_ms) - START_MS)) ms"
    [ "$FAILS" -eq 0 ]
    exit
fi

# --------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------

# start_redis N: starts N private redis-servers (no persistence), each on
# its own free loopback port, in $TMP/redisI; their pids in REDIS_PIDS and
# ports in REDIS_PORTS (REDIS_PORT: the first's). Exits if one will not start.
start_redis() {
    local n=${1:-1} node
    if ! command -v redis-server >/dev/null 2>&1; then
        echo "FAIL: redis-server is not in PATH: install redis (e.g." \
            "apt-get install redis-server) to run the $KIND CLI tests" >&2
        exit 1
    fi
    if ! command -v redis-cli >/dev/null 2>&1; then
        echo "FAIL: redis-cli is not in PATH: install redis-tools" >&2
        exit 1
    fi
    for ((node = 0; node < n; node++)); do
        start_redis_node "$node"
    done
    REDIS_PORT=${REDIS_PORTS[0]}
}

# free_port: sets FREE_PORT to a loopback port nothing answers on (100
# tries), or to "" if it found none. Another test may still take it before
# the server binds it: every caller starts its server, checks that it
# answers, and picks again if it does not.
free_port() {
    local i cand
    FREE_PORT=
    for ((i = 0; i < 100; i++)); do
        cand=$((20000 + (RANDOM * 32768 + RANDOM) % 40001))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$cand") 2>/dev/null; then
            FREE_PORT=$cand
            return 0
        fi
    done
}

# redis_up PID PORT: waits (5 s at most: a redis-server answers within
# milliseconds) until the redis-server PID answers PING on PORT; returns
# 0 then. If it exits first (a port taken after free_port after all) or
# stays silent, kills and reaps it and returns 1: the caller picks
# another port.
redis_up() {
    local pid=$1 port=$2 i
    for ((i = 0; i < 50; i++)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            break
        fi
        if [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ]; then
            return 0
        fi
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return 1
}

# start_redis_node I: starts node I (REDIS_PIDS[I], REDIS_PORTS[I]). The
# nodes started before it listen already, so it never picks their ports.
# With REDIS_TLS=1 it also gets a TLS port (REDIS_TLS_PORT; on 127.0.0.1,
# and ::1 where there is one: localhost may be either) serving
# $CERTS/server.crt (for localhost), no client certificate asked.
start_redis_node() {
    local node=$1 attempt p i pid dir=$TMP/redis$1 tls=()
    mkdir -p "$dir"
    for ((attempt = 0; attempt < 5; attempt++)); do
        free_port
        p=$FREE_PORT
        if [ -z "$p" ]; then
            continue
        fi
        tls=(--bind 127.0.0.1)
        if [ -n "$REDIS_TLS" ]; then
            # the port above p (as free as p: retried like it if taken)
            REDIS_TLS_PORT=$((p + 1))
            tls=(--bind 127.0.0.1 -::1 --tls-port "$REDIS_TLS_PORT"
                --tls-cert-file "$CERTS/server.crt"
                --tls-key-file "$CERTS/server.key"
                --tls-ca-cert-file "$CERTS/ca.crt" --tls-auth-clients no)
        fi
        redis-server --save '' --appendonly no "${tls[@]}" \
            --port "$p" --dir "$dir" --daemonize no \
            >"$dir/log" 2>&1 </dev/null &
        pid=$!
        REDIS_PIDS[node]=$pid
        if redis_up "$pid" "$p"; then
            REDIS_PORTS[node]=$p
            return 0
        fi
        REDIS_PIDS[node]=
    done
    echo "FAIL: redis-server (node $node) did not start; its log:" >&2
    show "$dir/log"
    exit 1
}

# kill_redis_node I: SIGKILLs node I and reaps it.
kill_redis_node() {
    local pid=${REDIS_PIDS[$1]}
    if [ -n "$pid" ]; then
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        REDIS_PIDS[$1]=
    fi
}

# start_sentinel_set: a replica of the node started by start_redis and
# three sentinels watching it as master dlockcli (in BG_PIDS: the
# cleanup kills them), their ports in SENT_PORTS; returns once the
# sentinels name it and know the replica (30 s at most, else exits).
start_sentinel_set() {
    local i
    SENT_PORTS=()
    start_sentinel_member replica "$TMP/sentinel0"
    for ((i = 1; i < 4; i++)); do
        start_sentinel_member sentinel "$TMP/sentinel$i"
        SENT_PORTS+=("$MEMBER_PORT")
    done
    for ((i = 0; i < 300; i++)); do
        if redis-cli -p "${SENT_PORTS[0]}" SENTINEL get-master-addr-by-name dlockcli 2>/dev/null |
            grep -qx "$REDIS_PORT" &&
            [ "$(redis-cli -p "${SENT_PORTS[2]}" SENTINEL replicas dlockcli 2>/dev/null | grep -c '^ip$')" = 1 ]; then
            return 0
        fi
        sleep 0.1
    done
    echo "FAIL: the sentinels did not come up; their logs:" >&2
    show "$TMP/sentinel0/log" "$TMP/sentinel1/log" "$TMP/sentinel3/log"
    exit 1
}

# start_sentinel_member KIND DIR: starts the set's replica (KIND replica)
# or one sentinel (KIND sentinel) in DIR on a free port, and sets
# MEMBER_PORT once it answers PING. A port another test took between
# free_port and the bind makes the server exit: it is started again on
# another port (5 tries, 5 s each, else exits).
start_sentinel_member() {
    local kind=$1 dir=$2 attempt p pid
    mkdir -p "$dir"
    for ((attempt = 0; attempt < 5; attempt++)); do
        free_port
        p=$FREE_PORT
        if [ -z "$p" ]; then
            continue
        fi
        if [ "$kind" = replica ]; then
            redis-server --save '' --appendonly no --bind 127.0.0.1 \
                --port "$p" --dir "$dir" --replicaof 127.0.0.1 "$REDIS_PORT" \
                >"$dir/log" 2>&1 </dev/null &
        else
            printf 'port %s\nbind 127.0.0.1\ndir %s\nsentinel monitor dlockcli 127.0.0.1 %s 2\n' \
                "$p" "$dir" "$REDIS_PORT" >"$dir/sentinel.conf"
            redis-server "$dir/sentinel.conf" --sentinel >"$dir/log" 2>&1 </dev/null &
        fi
        pid=$!
        if redis_up "$pid" "$p"; then
            BG_PIDS+=("$pid")
            MEMBER_PORT=$p
            return 0
        fi
    done
    echo "FAIL: the sentinel set's $kind did not start; its log:" >&2
    show "$dir/log"
    exit 1
}

# start_cluster_set: six cluster nodes (three primaries with a replica
# each, joined by redis-cli --cluster create; in BG_PIDS: the cleanup
# kills them), on ports below 22768 whose bus ports (+10000) stay below
# the ephemeral range too; the primaries' ports in CL_PORTS; returns once
# the cluster is ok and every primary has its replica (30 s at most, else
# exits).
start_cluster_set() {
    local i p dir cand all=()
    CL_PORTS=()
    for ((i = 0; i < 6; i++)); do
        p=
        while [ -z "$p" ]; do
            cand=$((20000 + (RANDOM * 32768 + RANDOM) % 2768))
            (exec 3<>"/dev/tcp/127.0.0.1/$cand") 2>/dev/null ||
                (exec 3<>"/dev/tcp/127.0.0.1/$((cand + 10000))") 2>/dev/null ||
                p=$cand
            for x in "${all[@]}"; do [ "$x" = "$p" ] && p=; done
        done
        dir=$TMP/cluster$i
        mkdir -p "$dir"
        redis-server --save '' --appendonly no --bind 127.0.0.1 \
            --port "$p" --dir "$dir" --cluster-enabled yes \
            --cluster-config-file nodes.conf --cluster-node-timeout 5000 \
            --repl-diskless-sync-delay 0 >"$dir/log" 2>&1 </dev/null &
        BG_PIDS+=($!)
        all+=("$p")
    done
    for p in "${all[@]}"; do
        for ((i = 0; i < 50; i++)); do
            [ "$(redis-cli -p "$p" ping 2>/dev/null)" = PONG ] && break
            sleep 0.1
        done
    done
    if ! redis-cli --cluster create "${all[@]/#/127.0.0.1:}" \
        --cluster-replicas 1 --cluster-yes >"$TMP/cluster-create" 2>&1; then
        echo "FAIL: redis-cli --cluster create failed:" >&2
        show "$TMP/cluster-create"
        exit 1
    fi
    for ((i = 0; i < 300; i++)); do
        if redis-cli -p "${all[0]}" cluster info 2>/dev/null | grep -q 'cluster_state:ok' &&
            [ "$(redis-cli -p "${all[0]}" cluster nodes 2>/dev/null | grep -c ' slave ')" = 3 ]; then
            CL_PORTS=("${all[@]:0:3}")
            return 0
        fi
        sleep 0.1
    done
    echo "FAIL: the cluster did not come up; a node's log:" >&2
    show "$TMP/cluster0/log"
    exit 1
}

# redis_all CMD...: runs redis-cli CMD on every node; prints the answers,
# one a line, in node order (on a cluster: once, following redirections).
redis_all() {
    local p
    if [ -n "${CL_PORTS[*]:-}" ]; then
        redis-cli -c -p "${CL_PORTS[0]}" "$@" 2>&1
        return
    fi
    for p in "${REDIS_PORTS[@]}"; do
        redis-cli -p "$p" "$@" 2>&1
    done
}

ZK_JAR=/usr/share/java/zookeeper.jar
# log4j.properties with a CONSOLE appender (Debian's example config)
ZK_CONF_DIR=/etc/zookeeper/conf_example
# without these two the server logs nothing (slf4j falls back to NOP)
ZK_LOG_JARS=/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar

# zk_4lw PORT WORD: sends a ZooKeeper four-letter word, prints the answer
# (at most 5 s).
zk_4lw() {
    local b=()
    if command -v timeout >/dev/null 2>&1; then
        b=(timeout -k 1 5)
    fi
    "${b[@]}" bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && echo "$2" >&3 &&
        cat <&3' zk_4lw "$1" "$2" 2>/dev/null </dev/null
}

# zk_serving PORT: the server answers ruok and has a mode (it serves).
zk_serving() {
    [ "$(zk_4lw "$1" ruok)" = imok ] && [[ "$(zk_4lw "$1" srvr)" == *Mode:* ]]
}

start_zk() {
    local attempt p i cp dir=$TMP/zk deadline
    if ! command -v java >/dev/null 2>&1; then
        echo "FAIL: java is not in PATH: install ZooKeeper and a JRE (e.g." \
            "apt-get install zookeeper) to run the zk CLI tests" >&2
        exit 1
    fi
    if [ ! -r "$ZK_JAR" ]; then
        echo "FAIL: $ZK_JAR is missing: install ZooKeeper (e.g." \
            "apt-get install zookeeper) to run the zk CLI tests" >&2
        exit 1
    fi
    cp=$ZK_CONF_DIR:$ZK_JAR
    if [ -r "${ZK_LOG_JARS%%:*}" ] && [ -r "${ZK_LOG_JARS#*:}" ]; then
        cp=$cp:$ZK_LOG_JARS
    fi
    for ((attempt = 0; attempt < 3; attempt++)); do
        free_port
        p=$FREE_PORT
        if [ -z "$p" ]; then
            continue
        fi
        rm -rf "$dir"
        mkdir -p "$dir/data"
        # tickTime 200: sessions of 400 ms to 60 s, expiry checked every tick
        cat >"$dir/zoo.cfg" <<EOF
tickTime=200
dataDir=$dir/data
clientPort=$p
clientPortAddress=127.0.0.1
minSessionTimeout=400
maxSessionTimeout=60000
4lw.commands.whitelist=*
admin.enableServer=false
forceSync=no
EOF
        java -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
            -Djava.net.preferIPv4Stack=true -cp "$cp" \
            "-Dzookeeper.log.dir=$dir" -Dzookeeper.root.logger=INFO,CONSOLE \
            org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" \
            >"$dir/zk.log" 2>&1 </dev/null &
        ZK_PID=$!
        # a JVM takes seconds to start: up to 60 s
        deadline=$(($(now_ms) + 60000))
        for ((i = 0; i < 600 && $(now_ms) < deadline; i++)); do
            if ! kill -0 "$ZK_PID" 2>/dev/null; then
                break # exited: the port was taken after all?
            fi
            if zk_serving "$p"; then
                ZK_PORT=$p
                return 0
            fi
            sleep 0.1
        done
        kill -KILL "$ZK_PID" 2>/dev/null
        wait "$ZK_PID" 2>/dev/null
        ZK_PID=
    done
    echo "FAIL: the ZooKeeper server did not start; the end of its log:" >&2
    tail -n 30 "$dir/zk.log" 2>/dev/null | sed 's/^/  | /' >&2
    exit 1
}

# etcd_serving PORT: the member says it is healthy (at most 3 s).
etcd_serving() {
    local b=()
    if command -v timeout >/dev/null 2>&1; then
        b=(timeout -k 1 3)
    fi
    "${b[@]}" bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" &&
        printf "GET /health HTTP/1.0\r\n\r\n" >&3 && cat <&3' etcd_serving "$1" \
        2>/dev/null </dev/null | grep -q '"health":"true"'
}

start_etcd() {
    local attempt p q i dir=$TMP/etcd deadline
    if ! command -v etcd >/dev/null 2>&1 || ! command -v etcdctl >/dev/null 2>&1; then
        echo "FAIL: etcd/etcdctl are not in PATH (apt-get install" \
            "etcd-server etcd-client) to run the etcd CLI tests" >&2
        exit 1
    fi
    for ((attempt = 0; attempt < 3; attempt++)); do
        p=
        q=
        for ((i = 0; i < 200; i++)); do
            local cand=$((20000 + (RANDOM * 32768 + RANDOM) % 40001))
            if ! (exec 3<>"/dev/tcp/127.0.0.1/$cand") 2>/dev/null; then
                if [ -z "$p" ]; then
                    p=$cand
                elif [ "$cand" != "$p" ]; then
                    q=$cand
                    break
                fi
            fi
        done
        if [ -z "$q" ]; then
            continue
        fi
        rm -rf "$dir"
        mkdir -p "$dir"
        etcd --name cli --data-dir "$dir/data" \
            --listen-client-urls "http://127.0.0.1:$p" \
            --advertise-client-urls "http://127.0.0.1:$p" \
            --listen-peer-urls "http://127.0.0.1:$q" \
            --initial-advertise-peer-urls "http://127.0.0.1:$q" \
            --initial-cluster "cli=http://127.0.0.1:$q" \
            --heartbeat-interval=50 --election-timeout=500 --log-level=warn \
            >"$dir/etcd.log" 2>&1 </dev/null &
        ETCD_PID=$!
        deadline=$(($(now_ms) + 60000))
        for ((i = 0; i < 600 && $(now_ms) < deadline; i++)); do
            if ! kill -0 "$ETCD_PID" 2>/dev/null; then
                break
            fi
            if etcd_serving "$p"; then
                ETCD_PORT=$p
                return 0
            fi
            sleep 0.1
        done
        kill -KILL "$ETCD_PID" 2>/dev/null
        wait "$ETCD_PID" 2>/dev/null
        ETCD_PID=
    done
    echo "FAIL: etcd did not start; the end of its log:" >&2
    tail -n 30 "$dir/etcd.log" 2>/dev/null | sed 's/^/  | /' >&2
    exit 1
}

# A private PostgreSQL or MariaDB server (sqlserver.sh pg|mysql) on a free
# port; sql_q SQL runs a statement as its superuser over the Unix socket and
# prints the rows (one value per line).
SQL_KIND=pg
[ "$KIND" = mysql ] && SQL_KIND=mysql
sql_q() {
    if [ "$SQL_KIND" = pg ]; then
        psql -X -qAt -h "$SQL_DIR" -p "$SQL_PORT" -U dlock postgres -c "$1" 2>&1
    else
        mariadb --no-defaults -S "$SQL_DIR/mysql.sock" -uroot -N -B dlocktest -e "$1" 2>&1
    fi
}
start_sql() {
    local p deadline i
    chmod 711 "$TMP" # PostgreSQL runs as the user postgres when we are root
    for _ in 1 2 3 4 5; do
        p=$((20000 + RANDOM % 40000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue
        SQL_DIR=$TMP/sql$p
        mkdir -p "$SQL_DIR"
        chmod 755 "$SQL_DIR"
        bash "$SQLSERVER" "$SQL_KIND" "$SQL_DIR" "$p" </dev/null >"$SQL_DIR/start.log" 2>&1 &
        SQL_PID=$!
        SQL_PORT=$p
        deadline=$(($(now_ms) + 90000))
        for ((i = 0; i < 900 && $(now_ms) < deadline; i++)); do
            kill -0 "$SQL_PID" 2>/dev/null || break
            if [ "$(sql_q 'SELECT 1')" = 1 ]; then
                return 0
            fi
            sleep 0.1
        done
        kill -KILL "$SQL_PID" 2>/dev/null
        wait "$SQL_PID" 2>/dev/null
        SQL_PID=
    done
    echo "FAIL: the $SQL_KIND server did not start; its logs:" >&2
    tail -n 30 "$SQL_DIR/start.log" "$SQL_DIR/server.log" 2>/dev/null | sed 's/^/  | /' >&2
    exit 1
}

# The server of a consensus store (zk, etcd): its pid, and whether it serves.
store_pid() {
    if [ "$KIND" = zk ]; then echo "$ZK_PID"; else echo "$ETCD_PID"; fi
}
store_serving() {
    if [ "$KIND" = zk ]; then zk_serving "$ZK_PORT"; else etcd_serving "$ETCD_PORT"; fi
}

case $KIND in
redis)
    start_redis 1
    export DLOCK_STORE="redis://127.0.0.1:$REDIS_PORT"
    ;;
rediss)
    # the Redis checks below over TLS: dlock on the TLS port as localhost
    # (server.crt names localhost only), checked against the test CA;
    # redis-cli behind dlock's back on the plain port of the same server
    CERTS=$TMP/tls
    if ! bash "$TLSCERTS" "$CERTS" >"$TMP/tlscerts.log" 2>&1; then
        echo "FAIL: tests/servers/tlscerts.sh could not make the certificates:" >&2
        show "$TMP/tlscerts.log"
        exit 1
    fi
    REDIS_TLS=1
    start_redis 1
    TLS_STORE="rediss://localhost:$REDIS_TLS_PORT?cacert=$CERTS/ca.crt"
    export DLOCK_STORE=$TLS_STORE
    KIND=redis
    ;;
redis-sentinel)
    # the Redis checks below, through three sentinels (the primary is
    # REDIS_PORT, looked at behind dlock's back as on redis://)
    start_redis 1
    start_sentinel_set
    export DLOCK_STORE="redis-sentinel://127.0.0.1:${SENT_PORTS[0]},127.0.0.1:${SENT_PORTS[1]},127.0.0.1:${SENT_PORTS[2]}/dlockcli"
    KIND=redis
    ;;
redis-cluster)
    # the Redis checks below, on a cluster (keys looked at behind dlock's
    # back with redis-cli -c, which follows the slot's redirections)
    start_cluster_set
    export DLOCK_STORE="redis-cluster://127.0.0.1:${CL_PORTS[0]},127.0.0.1:${CL_PORTS[1]},127.0.0.1:${CL_PORTS[2]}"
    KIND=redis
    ;;
redlock)
    start_redis 3
    export DLOCK_STORE="redlock://127.0.0.1:${REDIS_PORTS[0]},127.0.0.1:${REDIS_PORTS[1]},127.0.0.1:${REDIS_PORTS[2]}"
    # a user with a password on every node, for the checks that a password
    # in the URI is never printed
    acl=$(redis_all ACL SETUSER dlu on '>Pw9Secret' '~*' '&*' +@all)
    if [ "$acl" != "$(printf 'OK\nOK\nOK')" ]; then
        echo "FAIL: ACL SETUSER on the redlock nodes answered: ${acl//$'\n'/ }" >&2
        exit 1
    fi
    PW_STORE="redlock://dlu:Pw9Secret@127.0.0.1:${REDIS_PORTS[0]},127.0.0.1:${REDIS_PORTS[1]},127.0.0.1:${REDIS_PORTS[2]}"
    dl status redlockProbeL
    if [ "$RC" -ne 0 ]; then
        echo "FAIL: dlock status on $DLOCK_STORE exited $RC (built without" \
            "libhiredis?):" "$(cat "$TMP/err")" >&2
        exit 1
    fi
    ;;
zk)
    start_zk
    export DLOCK_STORE="zk://127.0.0.1:$ZK_PORT/dlock-cli"
    # a binary built without the zk store would fail every check below
    dl status zkProbeL
    if [ "$RC" -ne 0 ]; then
        echo "FAIL: dlock status on $DLOCK_STORE exited $RC (built without" \
            "the zk store? see DLOCK_WITH_ZK):" "$(cat "$TMP/err")" >&2
        exit 1
    fi
    ;;
etcd)
    start_etcd
    export DLOCK_STORE="etcd://127.0.0.1:$ETCD_PORT?prefix=dlock-cli"
    dl status etcdProbeL
    if [ "$RC" -ne 0 ]; then
        echo "FAIL: dlock status on $DLOCK_STORE exited $RC (built without" \
            "the etcd store? see DLOCK_WITH_ETCD):" "$(cat "$TMP/err")" >&2
        exit 1
    fi
    ;;
sqlite)
    export DLOCK_STORE="sqlite://$TMP/locks.db"
    ;;
pg | pg-advisory | mysql)
    start_sql
    if [ "$KIND" = mysql ]; then
        export DLOCK_STORE="mysql://dlock:dlock-secret@127.0.0.1:$SQL_PORT/dlocktest"
    else
        export DLOCK_STORE="postgres://dlock:dlock-secret@127.0.0.1:$SQL_PORT/postgres"
    fi
    [ "$KIND" = pg-advisory ] && DLOCK_STORE="$DLOCK_STORE?mode=advisory"
    dl status sqlProbeL
    if [ "$RC" -ne 0 ]; then
        echo "FAIL: dlock status on $DLOCK_STORE exited $RC (built without" \
            "the store? see DLOCK_WITH_PG / DLOCK_WITH_MYSQL):" "$(cat "$TMP/err")" >&2
        exit 1
    fi
    ;;
*)
    export DLOCK_STORE="file://$TMP/locks"
    ;;
esac
echo "# store: $DLOCK_STORE"

# --------------------------------------------------------------------------
# Usage, help, version
# --------------------------------------------------------------------------

dl --version
if [ "$RC" -eq 0 ] && grep -q '^dlock ' "$TMP/out"; then
    pass "--version"
else
    fail "dlock --version: exit $RC, output: $(cat "$TMP/out")"
fi
dl version
if [ "$RC" -eq 0 ] && grep -q '^dlock ' "$TMP/out"; then
    pass "version"
else
    fail "dlock version: exit $RC"
fi

dl --help
if [ "$RC" -eq 0 ] && grep -q 'usage: dlock' "$TMP/out"; then
    pass "--help"
else
    fail "dlock --help: exit $RC, output: $(head -c 300 "$TMP/out")"
fi
for args in "help run" "run --help" "help status" "status --help" "help" \
    "-h" "run -h"; do
    # shellcheck disable=SC2086 # split on purpose
    dl $args
    if [ "$RC" -eq 0 ] && grep -q 'usage: dlock' "$TMP/out"; then
        pass "dlock $args"
    else
        fail "dlock $args: exit $RC (expected 0 and a usage on stdout)"
        show "$TMP/out" "$TMP/err"
    fi
done
dl help run
if grep -q -- '--wait' "$TMP/out" && grep -q -- '--ttl' "$TMP/out" &&
    grep -q -- '--fair' "$TMP/out"; then
    pass "run help lists its options"
else
    fail "dlock help run does not list --wait/--ttl/--fair"
fi

# --warn-after: one line on stderr once the hold is that old, the command
# unharmed. The command holds 1.5 s and the warning is due at 300 ms: the
# library's background thread has 1.2 s to say it, on a busy machine too
dl run --warn-after 300ms warnL -- sh -c 'sleep 1.5; echo done'
if [ "$RC" -eq 0 ] && grep -q '^done$' "$TMP/out" &&
    [ "$(grep -c "lock 'warnL' held for .* (--warn-after), token [0-9]" "$TMP/err")" = 1 ]; then
    pass "run --warn-after: warned once, the command ran to its end"
else
    fail "run --warn-after: exit $RC: $(cat "$TMP/out" "$TMP/err")"
fi
dl run --warn-after 10s warnL -- true
if [ "$RC" -eq 0 ] && ! grep -q "warn-after" "$TMP/err"; then
    pass "run --warn-after: no warning for a short hold"
else
    fail "run --warn-after 10s of a short hold: exit $RC: $(cat "$TMP/err")"
fi

expect_rc 64 "no command" --
expect_rc 64 "unknown command" -- frobnicate
expect_rc 64 "help of an unknown command" -- help frobnicate
expect_rc 64 "run without NAME" -- run
expect_rc 64 "run NAME without a command" -- run usageL
expect_rc 64 "run NAME -- without a command" -- run usageL --
expect_rc 64 "run with an unknown option" -- run --bogus usageL -- true
expect_rc 64 "--ttl 0" -- run --ttl 0 usageL -- true
expect_rc 64 "--ttl abc" -- run --ttl abc usageL -- true
expect_rc 64 "--ttl -1" -- run --ttl -1 usageL -- true
expect_rc 64 "--ttl forever" -- run --ttl forever usageL -- true
expect_rc 64 "--wait -5" -- run --wait -5 usageL -- true
expect_rc 64 "--wait 5x" -- run --wait 5x usageL -- true
expect_rc 64 "--wait without a value" -- run --wait
expect_rc 64 "--kill-after bad" -- run --kill-after zz usageL -- true
expect_rc 64 "--warn-after 0" -- run --warn-after 0 usageL -- true
expect_rc 64 "--warn-after bad" -- run --warn-after 1y usageL -- true
expect_rc 64 "status without NAME" -- status
expect_rc 64 "status with two names" -- status a b
expect_rc 64 "status with an unknown option" -- status --bogus a
dl run --ttl abc usageL -- true
if grep -q "abc" "$TMP/err"; then
    pass "bad --ttl names the value"
else
    fail "bad --ttl: message does not quote 'abc': $(cat "$TMP/err")"
fi

# --- limits: --ttl and --wait up to 365 days, the library's DLOCK_TTL_MAX
# and DLOCK_WAIT_MAX; beyond: usage (64), the limit named ---
expect_rc 64 "--ttl 366d" -- run --ttl 366d limitL -- true
if grep -q "at most 365d" "$TMP/err"; then
    pass "--ttl beyond 365d: the message names the limit"
else
    fail "--ttl 366d: no 'at most 365d' in: $(cat "$TMP/err")"
fi
expect_rc 64 "--wait 366d" -- run --wait 366d limitL -- true
if grep -q "at most 365d" "$TMP/err"; then
    pass "--wait beyond 365d: the message names the limit"
else
    fail "--wait 366d: no 'at most 365d' in: $(cat "$TMP/err")"
fi
# 31.7 years: taken (and handed to the library) before the limits
expect_rc 64 "--ttl 999999999999ms" -- run --ttl 999999999999ms limitL -- true
expect_rc 64 "--wait 31536000001ms" -- run --wait 31536000001ms limitL -- true
expect_rc 0 "--ttl 365d --wait 365d (the maxima)" -- run --ttl 365d --wait 365d limitL -- true
expect_rc 0 "--warn-after 365d (the maximum)" -- run --warn-after 365d limitL -- true
if [ "$KIND" = file ]; then
    # no lease, no at-risk event: any --kill-after up to 365d is taken
    expect_rc 0 "--kill-after 365d on the file store" -- run --kill-after 365d limitL -- true
fi
# a wait of 365 days on a held lock ends with the holder's release. The
# holder holds until told (not for a fixed second: under load, one
# `dlock status` of wait_held could take longer than the whole hold)
bg_dlock limh run --ttl 365d limitL -- sh -c 'i=0; while [ ! -e "$0" ] &&
    [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done' "$TMP/limh.go"
LIMH=$BG
if wait_held limitL "$LIMH"; then
    (sleep 1 && : >"$TMP/limh.go") &
    t0=$(now_ms)
    dl run --wait 365d --quiet limitL -- true
    took=$(($(now_ms) - t0))
    # the holder lets go about 1 s after the waiter starts; 15 s only
    # catches a wait that is not woken
    if [ "$RC" -eq 0 ] && [ "$took" -lt 15000 ]; then
        pass "--wait 365d on a held lock: acquired at the release ($took ms)"
    else
        fail "--wait 365d on a held lock: exit $RC after $took ms: $(cat "$TMP/err")"
    fi
else
    fail "--wait 365d: the holder never held limitL: $(cat "$TMP/bg.limh.err")"
fi
: >"$TMP/limh.go"
wait_exit "$LIMH" 10

# --- terminal output: whatever a store or a server says (a holder's
# description, its error text, a lock name) reaches the terminal escaped.
# The holder here runs in a UTS namespace whose host name carries escape
# sequences (a title change, a screen clear, a bell): its description
# "HOST pid N tid N" goes into the store as any writer of the store could
# put it there. The name has control bytes too. ---
ENAME=$'esc\033[2Jname\001'
# evil_raw FILE: FILE has a byte of the holder's or the name's sequences
evil_raw() {
    grep -qF -e $'\033]0;pwned' -e $'\033[2J' -e $'\007' -e $'\001' "$1"
}
if unshare -u true 2>/dev/null && command -v python3 >/dev/null 2>&1; then
    mkfifo "$TMP/escgo"
    unshare -u python3 -c 'import os, socket, sys
socket.sethostname(b"h\x1b]0;pwned\x07\x1b[2J")
os.execv(sys.argv[1], sys.argv[1:])' "$DLOCK" run --ttl 10s "$ENAME" -- \
        sh -c 'read x < "$0"' "$TMP/escgo" >"$TMP/bg.esc.out" 2>"$TMP/bg.esc.err" </dev/null &
    ESCH=$!
    BG_PIDS+=("$ESCH")
    if wait_held "$ENAME" "$ESCH"; then
        dl status "$ENAME"
        if [ "$RC" -eq 0 ] && grep -q "pwned" "$TMP/out" && ! evil_raw "$TMP/out"; then
            pass "status: the holder and the name are printed escaped"
        else
            fail "status of a holder with escape sequences: exit $RC: $(od -c "$TMP/out" | head -20)"
        fi
        dl list
        if [ "$RC" -eq 69 ] && grep -q "cannot list\|not supported\|ENOTSUP\|does not list" "$TMP/err"; then
            : # a store that cannot list its locks
        elif [ "$RC" -eq 0 ] && grep -q "pwned" "$TMP/out" && ! evil_raw "$TMP/out" && ! evil_raw "$TMP/err"; then
            pass "list: the holder and the name are printed escaped"
        else
            fail "list with a holder with escape sequences: exit $RC: $(od -c "$TMP/out" | head -20) $(cat "$TMP/err")"
        fi
        dl run --wait 0 "$ENAME" -- true
        if [ "$RC" -eq 75 ] && grep -qF 'esc\x1b[2Jname\x01' "$TMP/err" && ! evil_raw "$TMP/err"; then
            pass "errors: the lock name is printed escaped"
        else
            fail "run --wait 0 of a held name with control bytes: exit $RC: $(od -c "$TMP/err" | head -20)"
        fi
        # the progress line, on a terminal (script(1) gives dlock one)
        if command -v script >/dev/null 2>&1; then
            env D="$DLOCK" N="$ENAME" timeout -k 2 20 script -qec \
                '"$D" run --wait 2500ms "$N" -- true' /dev/null >"$TMP/pty" 2>&1 </dev/null
            if grep -q "held by" "$TMP/pty" && grep -q "pwned" "$TMP/pty" && ! evil_raw "$TMP/pty"; then
                pass "the progress line prints the holder and the name escaped"
            else
                fail "progress line with a holder with escape sequences: $(od -c "$TMP/pty" | head -30)"
            fi
        else
            skip "the progress line: no script(1)"
        fi
    else
        fail "the holder in a UTS namespace never held the lock: $(cat "$TMP/bg.esc.err")"
    fi
    timeout 5 sh -c 'echo go > "$0"' "$TMP/escgo"
    wait_exit "$ESCH" 10
else
    skip "escaped holders: no UTS namespace (unshare -u needs root) or no python3"
fi

# bad stores
expect_rc 64 "unknown store scheme" -- run --store foo://x usageL -- true
if grep -q "foo" "$TMP/err"; then
    pass "unknown store is named"
else
    fail "unknown store: message does not name foo: $(cat "$TMP/err")"
fi
expect_rc 64 "malformed store URI" -- status --store nope usageL
expect_rc 69 "no redlock node reachable" -- run --store redlock://127.0.0.1:1,127.0.0.1:2 usageL -- true
expect_rc 69 "unreachable redis" -- status --store redis://127.0.0.1:1 usageL
# a password in a bad URI is not printed
dl status --store 'redis://u:Pw9Secret@127.0.0.1:1' usageL
if [ "$RC" -ne 0 ] && ! grep -q Pw9Secret "$TMP/out" "$TMP/err"; then
    pass "store password not printed (exit $RC)"
else
    fail "store password: exit $RC or printed: $(cat "$TMP/out" "$TMP/err")"
fi
if [ "$KIND" = zk ]; then
    # nothing listens on port 1: a store error in bounded time, not a hang
    expect_rc 69 "unreachable zk" -- status --store zk://127.0.0.1:1/x usageL
    expect_rc 69 "run on unreachable zk" -- run --wait 1s --store zk://127.0.0.1:1/x usageL -- true
    dl status --store 'zk://u:Pw9Secret@127.0.0.1:1/x' usageL
    if [ "$RC" -ne 0 ] && ! grep -q Pw9Secret "$TMP/out" "$TMP/err"; then
        pass "zk password not printed (exit $RC)"
    else
        fail "zk password: exit $RC or printed: $(cat "$TMP/out" "$TMP/err")"
    fi
fi
if [ "$KIND" = etcd ]; then
    expect_rc 69 "unreachable etcd" -- status --store etcd://127.0.0.1:1 usageL
    expect_rc 69 "run on unreachable etcd" -- run --wait 1s --store etcd://127.0.0.1:1 usageL -- true
    dl status --store 'etcd://u:Pw9Secret@127.0.0.1:1' usageL
    if [ "$RC" -ne 0 ] && ! grep -q Pw9Secret "$TMP/out" "$TMP/err"; then
        pass "etcd password not printed (exit $RC)"
    else
        fail "etcd password: exit $RC or printed: $(cat "$TMP/out" "$TMP/err")"
    fi
    # a wrong password on a server with auth is refused in words, unprinted
    dl status --store "etcd://root:Pw9Secret@127.0.0.1:$ETCD_PORT" usageL
    if [ "$RC" -eq 69 ] && grep -q "authentication is not enabled" "$TMP/err" &&
        ! grep -q Pw9Secret "$TMP/err"; then
        pass "etcd: auth against a server without auth is explained"
    else
        fail "etcd auth without server auth: exit $RC: $(cat "$TMP/err")"
    fi
fi
if [ "$KIND" = redlock ]; then
    # a password in the URI (user dlu on every node) is shown as ***, and
    # is in no message, whether it is right, wrong or never sent
    dl status --store "$PW_STORE" pwL
    if [ "$RC" -eq 0 ] && grep -q '^store: *redlock://dlu:\*\*\*@127' "$TMP/out" &&
        ! grep -q Pw9Secret "$TMP/out" "$TMP/err"; then
        pass "redlock: status with a password shows it as ***"
    else
        fail "redlock: status with a password: exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi
    dl status --json --store "$PW_STORE" pwL
    if [ "$RC" -eq 0 ] && grep -q '"store":"redlock://dlu:\*\*\*@127' "$TMP/out" &&
        ! grep -q Pw9Secret "$TMP/out" "$TMP/err"; then
        pass "redlock: status --json with a password shows it as ***"
    else
        fail "redlock: status --json with a password: exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi
    dl run --store "$PW_STORE" pwL -- sh -c 'printf "%s" "$DLOCK_TOKEN"'
    if [ "$RC" -eq 0 ] && grep -q '^[1-9][0-9]*$' "$TMP/out" && [ ! -s "$TMP/err" ]; then
        pass "redlock: run with the right password"
    else
        fail "redlock: run with a password: exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi
    rm -f "$TMP/pw.ran"
    dl run --store "${PW_STORE/Pw9Secret/Wrong9Pass}" pwL -- sh -c ': > "$0"' "$TMP/pw.ran"
    if [ "$RC" -eq 69 ] && grep -qi 'auth' "$TMP/err" && [ ! -e "$TMP/pw.ran" ] &&
        ! grep -q -e Wrong9Pass -e Pw9Secret "$TMP/out" "$TMP/err"; then
        pass "redlock: a wrong password refused in words, unprinted (exit 69)"
    else
        fail "redlock: wrong password: exit $RC (expected 69, 'auth'," \
            "no password, command not run): $(cat "$TMP/out" "$TMP/err")"
    fi
    dl run --wait 1s --store 'redlock://dlu:Pw9Secret@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3' pwL -- true
    if [ "$RC" -eq 69 ] && grep -q '127.0.0.1:2' "$TMP/err" &&
        ! grep -q Pw9Secret "$TMP/out" "$TMP/err"; then
        pass "redlock: unreachable nodes listed, password not printed (exit 69)"
    else
        fail "redlock: unreachable nodes with a password: exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi
fi
if [ -n "$TLS_STORE" ]; then
    # Redis over TLS: a run through the TLS port, and each way it fails:
    # a store error (exit 69) within the 2 s connect timeout, the command
    # not run, the cause in words, no password. BOUND (20 s) is the limit.
    expect_rc 0 "run over TLS (rediss://, the test CA)" -- \
        run --store "$TLS_STORE" tlsL -- true
    dl run --store "redis://localhost:$REDIS_TLS_PORT?tls=1&cacert=$CERTS/ca.crt" \
        tlsL -- sh -c 'printf "%s" "$DLOCK_TOKEN"'
    if [ "$RC" -eq 0 ] && grep -q '^[1-9][0-9]*$' "$TMP/out"; then
        pass "run over TLS (redis://...?tls=1), token $(cat "$TMP/out")"
    else
        fail "run over redis://...?tls=1: exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi
    # tls_refused DESCRIPTION WORD URI: `dlock run` on URI exits 69
    # without running its command, the message saying WORD (a regular
    # expression, case ignored) and no password
    tls_refused() {
        local what=$1 word=$2 uri=$3
        rm -f "$TMP/tls.ran"
        dl run --store "$uri" tlsL -- sh -c ': > "$0"' "$TMP/tls.ran"
        if [ "$RC" -eq 69 ] && [ ! -e "$TMP/tls.ran" ] &&
            grep -qiE "$word" "$TMP/err" && ! grep -q Pw9Secret "$TMP/out" "$TMP/err"; then
            pass "rediss: $what: exit 69, '$(head -c 120 "$TMP/err")'"
        else
            fail "rediss: $what: exit $RC (expected 69, /$word/, command" \
                "not run, no password): $(cat "$TMP/out" "$TMP/err")"
        fi
    }
    tls_refused "a CA that did not sign the server's certificate" certificate \
        "rediss://localhost:$REDIS_TLS_PORT?cacert=$CERTS/other-ca.crt"
    tls_refused "a cacert file that does not exist" "no such file|nope\.crt" \
        "rediss://localhost:$REDIS_TLS_PORT?cacert=$CERTS/nope.crt"
    tls_refused "a certificate for localhost reached as 127.0.0.1" mismatch \
        "rediss://127.0.0.1:$REDIS_TLS_PORT?cacert=$CERTS/ca.crt"
    tls_refused "the password with a CA that did not sign" certificate \
        "rediss://u:Pw9Secret@localhost:$REDIS_TLS_PORT?cacert=$CERTS/other-ca.crt"
    expect_rc 69 "rediss:// on the plain port" -- \
        run --store "rediss://localhost:$REDIS_PORT?cacert=$CERTS/ca.crt&timeout=500" tlsL -- true
    expect_rc 69 "redis:// (no TLS) on the TLS port" -- \
        run --store "redis://127.0.0.1:$REDIS_TLS_PORT" tlsL -- true
    expect_rc 0 "run over TLS with insecure=1 and a CA that did not sign" -- \
        run --store "rediss://localhost:$REDIS_TLS_PORT?cacert=$CERTS/other-ca.crt&insecure=1" tlsL -- true
fi
# --store wins over DLOCK_STORE
dl status --store "file://$TMP/other" storeL
if [ "$RC" -eq 0 ] && grep -q "store: *file://$TMP/other" "$TMP/out"; then
    pass "--store overrides DLOCK_STORE"
else
    fail "--store file://$TMP/other: exit $RC, output: $(cat "$TMP/out")"
    show "$TMP/err"
fi

# the command's environment holds no store password: DLOCK_STORE without
# it, and neither DLOCK_PASSWORD nor the client library's variable (both
# set, the URI's password winning over them; docs/stores.md, "Passwords";
# tests/cli/test_secrets.sh does the same on Redis)
case $KIND in
pg | pg-advisory | mysql)
    libvar=PGPASSWORD
    [ "$KIND" = mysql ] && libvar=MYSQL_PWD
    rm -f "$TMP/child.env"
    env DLOCK_PASSWORD=Pw9EnvSecret "$libvar=Pw9LibSecret" "${BOUND[@]}" \
        "$DLOCK" run envL -- sh -c 'tr "\0" "\n" </proc/self/environ >"$0"' \
        "$TMP/child.env" >"$TMP/out" 2>"$TMP/err" </dev/null
    RC=$?
    if [ "$RC" -ne 0 ] || [ ! -s "$TMP/child.env" ]; then
        fail "run for the environment: exit $RC"
        show "$TMP/err"
    elif grep -q -e Pw9EnvSecret -e Pw9LibSecret -e dlock-secret \
        "$TMP/child.env"; then
        fail "the command's environment holds a store password:" \
            "$(grep -e DLOCK_ -e "$libvar" "$TMP/child.env")"
    else
        pass "the command gets no DLOCK_PASSWORD, $libvar or store password"
    fi
    ;;
esac

# a password with '/', '?', '@', '%' and ':' (escaped in the URI) on a
# real server: status, list and a wrong password's error show no piece of it
case $KIND in
pg | pg-advisory | mysql)
    secpw='Zq7/S3cr?et@%:Wv9'
    secesc='Zq7%2FS3cr%3Fet%40%25%3AWv9'
    if [ "$KIND" = mysql ]; then
        made=$(sql_q "CREATE USER IF NOT EXISTS 'dlsec'@'%' IDENTIFIED BY '$secpw'; GRANT ALL ON dlocktest.* TO 'dlsec'@'%'; SELECT 1")
    else
        made=$(sql_q "SET client_min_messages TO warning; DROP ROLE IF EXISTS dlsec; CREATE ROLE dlsec LOGIN SUPERUSER PASSWORD '$secpw'; SELECT 1")
    fi
    secstore=$(printf '%s' "$DLOCK_STORE" | sed "s|://dlock:dlock-secret@|://dlsec:$secesc@|")
    if [ "$made" != 1 ]; then
        fail "cannot make a user with a special password: $made"
    else
        for cmd in "status secL" "status --json secL" "list --all --json"; do
            read -r -a args <<<"$cmd"
            dl "${args[0]}" --store "$secstore" "${args[@]:1}"
            # advisory mode cannot list (exit 69, the URI in the message)
            if [ "$RC" -ne 0 ] && ! [ "$KIND$cmd$RC" = "pg-advisorylist --all --json69" ]; then
                fail "$cmd with a special password: exit $RC"
                show "$TMP/err"
            elif grep -q -e Zq7 -e S3cr -e Wv9 "$TMP/out" "$TMP/err"; then
                fail "$cmd shows a piece of the password: $(cat "$TMP/out" "$TMP/err")"
            else
                pass "$cmd with a special password: none of it shows"
            fi
        done
        dl status --store "${secstore/Wv9/Wv9WRONG}" secL
        if [ "$RC" -eq 69 ] && ! grep -q -e Zq7 -e S3cr -e Wv9 "$TMP/out" "$TMP/err"; then
            pass "a wrong special password: refused (69), none of it shows"
        else
            fail "a wrong special password: exit $RC: $(cat "$TMP/out" "$TMP/err")"
        fi
        # unescaped, the issue's shape: user:1/S3cret@ read as a host, a
        # port and a database by the old parser, which then printed it
        hostport=$(printf '%s' "$DLOCK_STORE" | sed -n 's|^[a-z]*://[^@]*@\([^/]*\)/.*|\1|p')
        dl status --store "${DLOCK_STORE%%://*}://$hostport/Zq7S3cret@$hostport/dlocktest" secL
        if [ "$RC" -ne 0 ] && ! grep -q -e Zq7 -e S3cr "$TMP/out" "$TMP/err"; then
            pass "an unescaped '/' in a password: refused ($RC), none of it shows"
        else
            fail "an unescaped '/' in a password: exit $RC: $(cat "$TMP/out" "$TMP/err")"
        fi
    fi
    ;;
esac

# the default store (as root, in a mount namespace of its own; see
# home_tests)
if [ "$KIND" = file ]; then
    if [ "$(id -u)" -ne 0 ] || ! command -v unshare >/dev/null 2>&1; then
        echo "skip the default store's directory (needs root: a mount namespace)"
    elif ! unshare -m --propagation private true 2>/dev/null; then
        # root without a mount namespace of its own: a chroot, a container
        # without CAP_SYS_ADMIN
        echo "skip the default store's directory (no mount namespace here: $(unshare -m --propagation private true 2>&1 | head -n 1))"
    else
        unshare -m --propagation private bash "$0" "$DLOCK" file-home >"$TMP/home.log" 2>&1
        rc=$?
        grep -v '^# ' "$TMP/home.log"
        PASSES=$((PASSES + $(grep -c '^ok ' "$TMP/home.log")))
        n=$(grep -c '^FAIL:' "$TMP/home.log")
        FAILS=$((FAILS + n))
        if [ "$rc" -ne 0 ] && [ "$n" -eq 0 ]; then
            fail "the default store's part exited $rc: $(tail -n 5 "$TMP/home.log")"
        fi
    fi
fi

# Read locks that no dlock holder took (issue 34): a process outside dlock
# holds OFD read locks on byte 0 and the META byte (1) of a lock's file and
# on the META byte of a semaphore's. Every wait still ends by its deadline,
# and status says who holds them. Bounds: --wait 0 in < 2 s (a try waits
# for META 20 ms at most; the rest is the process's start and exit, up to
# ~0.5 s measured under ASan on a loaded 2-core machine: 4 times that);
# --wait 500ms in [500, 3000) ms (the same slack); a wait that ignored its
# deadline runs into timeout's 10 s. test_file.c's
# foreign_read_locks_bound_every_wait times the calls themselves, closer.
if [ "$KIND" = file ]; then
    dl run jamL -- true
    dl run --permits 2 jamS -- true
    rm -f "$TMP/jam.ready"
    mkfifo "$TMP/jam.fifo"
    python3 -c 'import fcntl, os, struct, sys
F_OFD_SETLK = 37
def rdlock(path, byte):
    fd = os.open(path, os.O_RDONLY)
    fcntl.fcntl(fd, F_OFD_SETLK, struct.pack("hhqqi", fcntl.F_RDLCK, 0, byte, 1, 0))
    return fd
d = sys.argv[1]
fds = [rdlock(d + "/jamL.lock", 0), rdlock(d + "/jamL.lock", 1), rdlock(d + "/jamS.lock", 1)]
open(sys.argv[2], "w").close()
open(sys.argv[3]).read()' "$TMP/locks" "$TMP/jam.ready" "$TMP/jam.fifo" 2>"$TMP/jam.err" &
    jam=$!
    BG_PIDS+=("$jam")
    for ((i = 0; i < 200; i++)); do
        [ -e "$TMP/jam.ready" ] && break
        sleep 0.05
    done
    if [ ! -e "$TMP/jam.ready" ]; then
        fail "foreign read locks: the helper never held them: $(cat "$TMP/jam.err")"
    else
        for args in "jamL" "--fair jamL" "--permits 2 jamS" "--fair --permits 2 jamS"; do
            # shellcheck disable=SC2086 # split on purpose
            for w in 0 500ms; do
                t0=$(now_ms)
                timeout -k 2 10 "$DLOCK" run --wait $w $args -- true >"$TMP/out" 2>"$TMP/err" </dev/null
                RC=$?
                dt=$(($(now_ms) - t0))
                if [ "$w" = 0 ]; then lo=0 hi=2000; else lo=500 hi=3000; fi
                if [ "$RC" -eq 75 ] && ((dt >= lo && dt < hi)); then
                    pass "foreign read locks: run --wait $w $args: busy after $dt ms"
                else
                    fail "foreign read locks: run --wait $w $args: exit $RC after $dt ms (expected 75 in [$lo, $hi) ms)"
                    show "$TMP/err"
                fi
            done
        done
        for n in jamL jamS; do
            dl status "$n"
            if grep -qF "holder:   a process outside dlock holds a read lock on this file" "$TMP/out"; then
                pass "foreign read locks: status $n names them"
            else
                fail "foreign read locks: status $n: $(cat "$TMP/out" "$TMP/err")"
            fi
        done
    fi
    echo >"$TMP/jam.fifo"
    wait "$jam" 2>/dev/null
    rm -f "$TMP/jam.fifo"
    expect_rc 0 "foreign read locks gone: the semaphore is free" -- run --permits 2 --wait 0 jamS -- true
fi

# --------------------------------------------------------------------------
# The command's exit status
# --------------------------------------------------------------------------

expect_rc 0 "command exit 0" -- run exitL -- true
expect_rc 7 "command exit 7 passed through" -- run exitL -- sh -c 'exit 7'
expect_rc 1 "command exit 1 passed through" -- run exitL false
expect_rc 137 "command killed by SIGKILL" -- run exitL -- sh -c 'kill -9 $$'
expect_rc 143 "command killed by SIGTERM" -- run exitL -- sh -c 'kill -TERM $$'
expect_rc 127 "command not found" -- run exitL -- /nonexistent/dlock-no-such-cmd
expect_rc 127 "command not in PATH" -- run exitL -- dlock-no-such-cmd-xyz
printf 'not executable\n' >"$TMP/noexec.sh"
chmod 644 "$TMP/noexec.sh"
expect_rc 126 "command not executable" -- run exitL -- "$TMP/noexec.sh"
# the lock is free again after all of these
dl status --json exitL
if grep -q '"held":false' "$TMP/out"; then
    pass "lock free after failed commands"
else
    fail "exitL still held after the commands: $(cat "$TMP/out")"
fi

# --------------------------------------------------------------------------
# Environment: DLOCK_NAME, DLOCK_TOKEN
# --------------------------------------------------------------------------

print_env='printf "%s\n%s\n" "$DLOCK_NAME" "$DLOCK_TOKEN"'
dl run envL -- sh -c "$print_env"
name1=$(sed -n 1p "$TMP/out")
tok1=$(sed -n 2p "$TMP/out")
if [ "$RC" -eq 0 ] && [ "$name1" = envL ]; then
    pass "DLOCK_NAME"
else
    fail "DLOCK_NAME: exit $RC, got '$name1', expected 'envL'"
    show "$TMP/err"
fi
if [[ $tok1 =~ ^[0-9]+$ ]] && ((10#$tok1 > 0)); then
    pass "DLOCK_TOKEN is a positive number ($tok1)"
else
    fail "DLOCK_TOKEN is '$tok1', expected a number > 0"
    tok1=0
fi
dl run envL -- sh -c "$print_env"
tok2=$(sed -n 2p "$TMP/out")
if [[ $tok2 =~ ^[0-9]+$ ]] && ((10#$tok2 > 10#$tok1)); then
    pass "tokens increase ($tok1 < $tok2)"
else
    fail "second token '$tok2' is not greater than the first '$tok1'"
fi
dl run envL -- sh -c "$print_env"
tok3=$(sed -n 2p "$TMP/out")
if [[ $tok3 =~ ^[0-9]+$ ]] && ((10#$tok3 > 10#$tok2)); then
    pass "tokens increase again ($tok2 < $tok3)"
else
    fail "third token '$tok3' is not greater than the second '$tok2'"
fi
# the status shows the last token once free (zk, etcd and PostgreSQL
# advisory locks keep none: token 0)
dl status --json envL
if [ "$KIND" = zk ] || [ "$KIND" = etcd ] || [ "$KIND" = pg-advisory ]; then
    want_tok=0
else
    want_tok=$tok3
fi
stok=$(sed -n 's/.*"token":\([0-9]*\)[,}].*/\1/p' "$TMP/out")
if grep -q "\"held\":false" "$TMP/out" && tok_close "$stok" "$want_tok"; then
    pass "status shows the last token $want_tok (status: $stok)"
else
    fail "status after release: expected held false and token $want_tok: $(cat "$TMP/out")"
fi

# inherited DLOCK_NAME / DLOCK_TOKEN are replaced, not duplicated
DLOCK_NAME=bogus DLOCK_TOKEN=0 "${BOUND[@]}" "$DLOCK" run envL2 -- \
    sh -c "$print_env; env | grep -c '^DLOCK_NAME='" >"$TMP/out" 2>"$TMP/err"
RC=$?
if [ "$RC" -eq 0 ] && [ "$(sed -n 1p "$TMP/out")" = envL2 ] &&
    [ "$(sed -n 2p "$TMP/out")" != 0 ] && [ "$(sed -n 3p "$TMP/out")" = 1 ]; then
    pass "inherited DLOCK_NAME/DLOCK_TOKEN replaced"
else
    fail "inherited DLOCK_NAME/DLOCK_TOKEN: exit $RC, output: $(cat "$TMP/out")"
fi

# names with spaces and quotes
for name in "a lock with spaces" "it's \"quoted\"" "semi;colon \$HOME *" \
    "slash/and\\back" "ünïcödé"; do
    dl run "$name" -- sh -c 'printf "%s" "$DLOCK_NAME"'
    if [ "$RC" -eq 0 ] && [ "$(cat "$TMP/out")" = "$name" ]; then
        pass "name [$name]"
    else
        fail "name [$name]: exit $RC, child saw [$(cat "$TMP/out")]"
        show "$TMP/err"
    fi
    dl status "$name"
    # status shows a backslash as \\ (unambiguous, as dlock list does)
    if [ "$RC" -eq 0 ] && grep -qF "lock:     ${name//\\/\\\\}" "$TMP/out" &&
        grep -q "state: *free" "$TMP/out"; then
        pass "status of [$name]"
    else
        fail "status [$name]: exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi
done

# arguments reach the command as they are
dl run argL -- sh -c 'printf "[%s]" "$@"' sh "a b" "" "c'd" '$x'
if [ "$RC" -eq 0 ] && [ "$(cat "$TMP/out")" = "[a b][][c'd][\$x]" ]; then
    pass "arguments passed verbatim"
else
    fail "arguments: exit $RC, got $(cat "$TMP/out")"
fi
# without "--" too
dl run argL printf '%s-%s' x y
if [ "$RC" -eq 0 ] && [ "$(cat "$TMP/out")" = "x-y" ]; then
    pass "command without --"
else
    fail "command without --: exit $RC, got $(cat "$TMP/out")"
fi

# --------------------------------------------------------------------------
# Several locks: --also (docs/cli.md; the set's order: docs/design.md)
# --------------------------------------------------------------------------

mkfifo "$TMP/alsogo"
# the holder of {alsoA, alsoB} writes its DLOCK_TOKENS, then waits for a
# line on the fifo (or a SIGTERM)
bg_dlock also run --kill-after 1s --also alsoB alsoA -- \
    sh -c 'printf "%s\n" "$DLOCK_TOKENS" >"$1"; read x <"$0"' \
    "$TMP/alsogo" "$TMP/also.tokens"
alsopid=$BG
if wait_held alsoA "$alsopid" && wait_held alsoB "$alsopid"; then
    pass "--also: both locks held"
    dl run --wait 0 alsoB -- true
    check_rc 75 "--also: the other lock is held for the command too"
    dl run --wait 0 --also alsoC alsoA -- true
    check_rc 75 "a set with a lock held elsewhere is not taken"
    if grep -q "alsoA" "$TMP/err" && grep -q "none of the set" "$TMP/err"; then
        pass "the refusal names the held lock and says nothing is held"
    else
        fail "the refusal of a set: $(cat "$TMP/err")"
    fi
    dl run --wait 0 alsoC -- true
    check_rc 0 "nothing of a refused set stays held"
    for ((i = 0; i < 50; i++)); do
        [ -s "$TMP/also.tokens" ] && break
        sleep 0.1
    done
    if [[ $(cat "$TMP/also.tokens") =~ ^[0-9]+\ [0-9]+$ ]]; then
        pass "DLOCK_TOKENS has a token per lock ($(cat "$TMP/also.tokens"))"
    else
        fail "DLOCK_TOKENS: '$(cat "$TMP/also.tokens")', expected two numbers"
    fi
    # losing one lock of the set stops the command: exit 76 (on the
    # stores whose holds can be broken from outside)
    dl break alsoB
    if [ "$RC" -eq 0 ]; then
        # the next renewal (every ttl/3 of the 10 s lease, at most) or
        # the store's own word (a watch, a session) finds alsoB gone:
        # SIGTERM, the command ends at once; 15 s with slack
        if wait_exit "$alsopid" 15 && [ "$WRC" = 76 ]; then
            pass "--also: losing one lock of the set stops the command, exit 76"
        else
            fail "--also: after alsoB was broken: exit $WRC, expected 76"
            show "$TMP/bg.also.err"
        fi
    else
        [ "$RC" -eq 69 ] && grep -q "cannot be broken" "$TMP/err" ||
            fail "break alsoB: exit $RC: $(cat "$TMP/err")"
        timeout 5 sh -c 'echo go > "$0"' "$TMP/alsogo"
        if wait_exit "$alsopid" 10 && [ "$WRC" = 0 ]; then
            pass "--also: the set released when the command ends"
        else
            fail "--also holder: exit $WRC, expected 0"
            show "$TMP/bg.also.err"
        fi
    fi
    dl run --wait 0 --also alsoB alsoA -- true
    check_rc 0 "--also: the set is free again"
else
    fail "--also: the set never held"
    show "$TMP/bg.also.err"
    kill -KILL "$alsopid" 2>/dev/null
fi
dl run --also alsoA alsoA -- true
check_rc 64 "--also: the same name twice is a usage error"
dl run --shared --also alsoB alsoA -- true
check_rc 64 "--also with --shared is a usage error"

# --------------------------------------------------------------------------
# dlock doctor (docs/locks.md, "Checking a deployment")

# doctor_on_overlay DIR URI-FORMAT CHECK WHAT: dlock doctor of a store
# URI-FORMAT (%s: the mount) on an overlayfs mounted in a mount
# namespace of the test's own, under $TMP/DIR: finds CHECK (exit 1)
doctor_on_overlay() {
    local d=$TMP/$1 uri
    mkdir -p "$d/l" "$d/u" "$d/w" "$d/m"
    if ! unshare -m sh -c 'mount -t overlay overlay -o "lowerdir=$0/l,upperdir=$0/u,workdir=$0/w" "$0/m"' "$d" 2>/dev/null; then
        skip "doctor on overlayfs: this machine cannot mount one (not root, or no overlay module)"
        return
    fi
    # shellcheck disable=SC2059 # the format is the caller's URI
    uri=$(printf "$2" "$d/m")
    "${BOUND[@]}" unshare -m sh -c 'mount -t overlay overlay -o "lowerdir=$0/l,upperdir=$0/u,workdir=$0/w" "$0/m" && exec "$1" doctor --store "$2"' \
        "$d" "$DLOCK" "$uri" >"$TMP/out" 2>"$TMP/err" </dev/null
    RC=$?
    if [ "$RC" = 1 ] && grep -q "$3" "$TMP/out"; then
        pass "doctor: $4 on overlayfs is found (exit 1)"
    else
        fail "doctor of $4 on overlayfs: exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi
}
# --------------------------------------------------------------------------

dl doctor --json
if { [ "$RC" = 0 ] || [ "$RC" = 1 ]; } &&
    grep -q '"round_trip_us":[0-9]' "$TMP/out" && grep -q '"findings":\[' "$TMP/out"; then
    pass "doctor: measured the store, exit $RC"
else
    fail "doctor: exit $RC: $(cat "$TMP/out" "$TMP/err")"
fi
case $KIND in
file)
    # a directory on the test's own file system: nothing to say
    dl doctor
    check_rc 0 "doctor: a local lock directory is fine"
    # the same store on overlayfs (a container's root), mounted in a
    # mount namespace of the test's own
    doctor_on_overlay ov "file://%s/locks" file-on-overlayfs "a lock directory"
    ;;
redis)
    case $DLOCK_STORE in
    redis-sentinel://*)
        # the test's URI has no ?min_replicas
        dl doctor
        if [ "$RC" = 1 ] && grep -q "sentinel-min-replicas" "$TMP/out"; then
            pass "doctor: Sentinel without min_replicas is found (exit 1)"
        else
            fail "doctor under Sentinel: exit $RC: $(cat "$TMP/out")"
        fi
        ;;
    redis://* | rediss://*)
    # the test's server keeps nothing (save "", appendonly no): found;
    # with appendonly on: not found; then as it was
    dl doctor
    if [ "$RC" = 1 ] && grep -q "redis-persistence" "$TMP/out"; then
        pass "doctor: a Redis without persistence is found (exit 1)"
    else
        fail "doctor on a Redis without persistence: exit $RC: $(cat "$TMP/out")"
    fi
    redis-cli -p "$REDIS_PORT" CONFIG SET appendonly yes >/dev/null
    dl doctor
    check_rc 0 "doctor: a Redis with appendonly yes is fine"
    redis-cli -p "$REDIS_PORT" CONFIG SET appendonly no >/dev/null
        ;;
    esac
    ;;
sqlite)
    # a database on the test's own file system: nothing to say; on
    # overlayfs (a container's root), in a mount namespace of the test's
    # own: found
    dl doctor
    check_rc 0 "doctor: a local database is fine"
    doctor_on_overlay sov "sqlite://%s/locks.db" sqlite-on-overlayfs "a database"
    ;;
etcd)
    # no password in the test's URI: nothing found, and the clock noted
    dl doctor
    if [ "$RC" = 0 ] && grep -q "no clock offset to check" "$TMP/out"; then
        pass "doctor: etcd without a password is fine, its clock noted"
    else
        fail "doctor on etcd: exit $RC: $(cat "$TMP/out")"
    fi
    ;;
zk)
    # the test's server grants sessions of 400 ms to 60 s: 10 s is
    # granted, 90 s is not
    dl doctor
    check_rc 0 "doctor: a session timeout the server grants is fine"
    dl doctor --ttl 90s
    if [ "$RC" = 1 ] && grep -q "zk-session-timeout" "$TMP/out" &&
        grep -q "60000 ms" "$TMP/out"; then
        pass "doctor: a session timeout the server will not grant is found (exit 1)"
    else
        fail "doctor on zk with --ttl 90s: exit $RC: $(cat "$TMP/out")"
    fi
    ;;
pg | pg-advisory | mysql)
    # the test's servers take the password over TCP without TLS
    dl doctor
    if [ "$RC" = 1 ] && grep -q "password-without-tls" "$TMP/out"; then
        pass "doctor: a password over a connection without TLS is found (exit 1)"
    else
        fail "doctor on $KIND: exit $RC: $(cat "$TMP/out")"
    fi
    ;;
esac
case $KIND in
redis | pg | pg-advisory | mysql)
    # the store's own clock, on this host: within a second of ours
    dl doctor --json
    off=$(sed -n 's/.*"clock_offset_ms":\(-\{0,1\}[0-9]*\),.*/\1/p' "$TMP/out")
    if [[ $off =~ ^-?[0-9]+$ ]] && ((${off#-} < 1000)); then
        pass "doctor: the store's clock read, offset ${off} ms"
    else
        fail "doctor: no clock offset from $KIND: $(cat "$TMP/out")"
    fi
    ;;
esac
dl doctor --ttl nonsense
check_rc 64 "doctor: a bad --ttl is a usage error"

# --------------------------------------------------------------------------
# Scheduled jobs: --at-least, --at-most (docs/locks.md)
# --------------------------------------------------------------------------

# --at-most: the command is stopped at its time, as for a lost lock (it
# ignores SIGTERM: SIGKILL --kill-after later), and dlock exits 124
t0=$(now_ms)
dl run --at-most 500ms --kill-after 300ms mostL -- sh -c 'trap "" TERM; sleep 20'
dt=$(($(now_ms) - t0))
# 0.8 s of stops; 15 s is far below the command's 20 s on a busy machine
if [ "$RC" = 124 ] && ((dt < 15000)) && grep -q "at-most" "$TMP/err"; then
    pass "--at-most: the command stopped at its time, exit 124 (${dt} ms)"
else
    fail "--at-most: exit $RC after ${dt} ms, expected 124 and a word on stderr"
    show "$TMP/err"
fi
dl run --wait 0 mostL -- true
check_rc 0 "--at-most: the lock released after the stop"
dl run --at-most 1s --at-least 2s mostL -- true
check_rc 64 "--at-most shorter than --at-least is a usage error"

# --at-least: five cron firings of one job within a second, each with
# --wait 0: the job runs once (the lock outlives the first run, which
# ends at once, for 8 s: the last firing's dlock has 7 s to start and
# try, a loaded machine's start-up many times over); on stores whose
# holds end with their holder (no lease of their own), refused with the
# reason
case $KIND in
file | zk | etcd | pg-advisory)
    dl run --wait 0 --at-least 8s cronL -- true
    if [ "$RC" = 69 ] && grep -q "needs a lease" "$TMP/err"; then
        pass "--at-least refused where holds end with their holder (69, the reason)"
    else
        fail "--at-least on $KIND: exit $RC: $(cat "$TMP/err")"
    fi
    ;;
*)
    : >"$TMP/cron.runs"
    cron_pids=()
    for i in 1 2 3 4 5; do
        "${BOUND[@]}" "$DLOCK" run --wait 0 --at-least 8s cronL -- \
            sh -c 'echo "$DLOCK_TOKEN" >>"$0"' "$TMP/cron.runs" \
            >"$TMP/cron.$i.out" 2>"$TMP/cron.$i.err" </dev/null &
        cron_pids+=($!)
        sleep 0.2
    done
    ran=0 busy=0
    for p in "${cron_pids[@]}"; do
        wait "$p"
        case $? in 0) ran=$((ran + 1)) ;; 75) busy=$((busy + 1)) ;; esac
    done
    if [ "$ran" = 1 ] && [ "$busy" = 4 ] && [ "$(wc -l <"$TMP/cron.runs")" = 1 ]; then
        pass "--at-least: five firings within a second, the job ran once"
    else
        fail "--at-least: $ran ran, $busy busy, runs: $(wc -l <"$TMP/cron.runs")"
        show "$TMP"/cron.*.err
    fi
    # free again once the at-least time is over (8 s from the first
    # acquire; 20 s with a busy machine's slack)
    for ((i = 0; i < 200; i++)); do
        dl run --wait 0 cronL -- true
        [ "$RC" = 0 ] && break
        sleep 0.1
    done
    check_rc 0 "--at-least: the lock is free after its time"
    ;;
esac

# --------------------------------------------------------------------------
# Elections: dlock elect, dlock leader (docs/locks.md, "Leader election")
# --------------------------------------------------------------------------

# wait_line FILE PATTERN: FILE gets a line matching PATTERN (grep -E)
# within 15 s, a busy machine's slack for a change the store tells of at
# once
wait_line() {
    local i
    for ((i = 0; i < 150; i++)); do
        grep -qE "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

dl leader elL
check_rc 1 "leader: none leads yet"
REL=$TMP/release.el
rm -f "$REL" "$TMP/tok.el"
# the leader's command keeps leading until $REL appears (at most 10 s)
elect_cmd='printf "%s" "$DLOCK_TOKEN" > "$TOKFILE"; i=0
while [ ! -e "$REL" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done'
REL=$REL TOKFILE=$TMP/tok.el bg_dlock el elect --value "svc-a:8080" elL -- sh -c "$elect_cmd"
elector=$BG
if wait_held elL "$elector" && wait_file "$TMP/tok.el"; then
    etok=$(cat "$TMP/tok.el")
    # Redlock's nodes report the highest counter among the leader's keys
    # as its term, which may be above the leader's own token
    # (docs/redlock.md): any term there
    [ "$KIND" = redlock ] && etok='[0-9]*'
    dl leader --json elL
    if [ "$RC" = 0 ] && grep -q '"value":"svc-a:8080"' "$TMP/out" &&
        grep -q "\"term\":${etok}[,}]" "$TMP/out"; then
        pass "leader --json: the leader's value, its term = its DLOCK_TOKEN"
    else
        fail "leader --json while led (term '$etok'): exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi
    dl leader elL
    if [ "$RC" = 0 ] && grep -q "^leader term $etok: svc-a:8080" "$TMP/out"; then
        pass "leader: one line, term and value"
    else
        fail "leader while led: exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi
    dl elect --wait 0 elL -- true
    check_rc 75 "elect --wait 0 while another leads"
    : >"$REL"
    wait_exit "$elector" 10
    if [ "$WRC" = 0 ]; then
        pass "elect: exits with CMD's status when it ends"
    else
        fail "elect: exit $WRC: $(cat "$TMP/bg.el.err")"
    fi
    dl leader elL
    check_rc 1 "leader: none after the leader resigned"
else
    fail "elect: never led: $(cat "$TMP/bg.el.err")"
fi
dl elect --value "$(printf 'a\tb')" elL -- true
check_rc 64 "elect: a value with a control character is a usage error"
dl elect --also other elL -- true
check_rc 64 "elect: --also is not for an election"
dl elect elL -- sh -c 'exit 3'
check_rc 3 "elect: CMD's own status"

# --watch: a line now and one per change, from the store's word (the
# Redis stores); elsewhere refused with the reason (69)
case $KIND in
redis | rediss | redis-sentinel | redis-cluster | zk | etcd | pg | file | sqlite)
    bg_dlock watch leader --watch --json elW
    watcher=$BG
    if wait_line "$TMP/bg.watch.out" '"leader":false'; then
        # a leader that leads until told (a term too short for the
        # observer's read may be replaced by the next state: an observer
        # reports what it reads, the latest)
        rm -f "$TMP/w1.go"
        bg_dlock w1 elect --value w-1 elW -- sh -c 'i=0
while [ ! -e "$0" ] && [ $i -lt 150 ]; do sleep 0.1; i=$((i+1)); done' "$TMP/w1.go"
        w1=$BG
        wait_line "$TMP/bg.watch.out" '"value":"w-1"'
        : >"$TMP/w1.go"
        wait_exit "$w1" 15
        # a line for w-1, then one for no leader (15 s at most)
        for ((i = 0; i < 150; i++)); do
            awk '/"value":"w-1"/ { s = 1 } s && /"leader":false/ { f = 1 }
                END { exit !f }' "$TMP/bg.watch.out" && break
            sleep 0.1
        done
        if awk '/"value":"w-1"/ { s = 1 } s && /"leader":false/ { f = 1 }
                END { exit !f }' "$TMP/bg.watch.out"; then
            pass "leader --watch: none, the leader, none again"
        else
            fail "leader --watch: $(cat "$TMP/bg.watch.out" "$TMP/bg.watch.err")"
        fi
    else
        fail "leader --watch: no first line: $(cat "$TMP/bg.watch.err")"
    fi
    kill -TERM "$watcher"
    wait_exit "$watcher" 10
    if [ "$WRC" = 0 ]; then
        pass "leader --watch: ends at SIGTERM (exit 0)"
    else
        fail "leader --watch: exit $WRC at SIGTERM"
    fi
    ;;
*)
    dl leader --watch elW
    if [ "$RC" = 69 ] && grep -q "cannot be observed" "$TMP/err"; then
        pass "leader --watch refused where the store cannot be observed yet (69, the reason)"
    else
        fail "leader --watch on $KIND: exit $RC: $(cat "$TMP/err")"
    fi
    ;;
esac

# --again: a leader whose term an operator ends (dlock break) stops its
# command and campaigns again; the command runs again under a new term
if [ "$KIND" != file ]; then
    rm -f "$REL" "$TMP/again.runs"
    REL=$REL bg_dlock ag elect --again --ttl 3s elA -- \
        sh -c 'echo "$DLOCK_TOKEN" >>"$0"; i=0
while [ ! -e "$REL" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done' "$TMP/again.runs"
    again_pid=$BG
    if wait_line "$TMP/again.runs" '^[0-9]+$'; then
        dl break elA
        # the loss is seen within the 3 s lease, the command stopped
        # within --kill-after, the next term taken at once (20 s at most)
        for ((i = 0; i < 200; i++)); do
            [ "$(wc -l <"$TMP/again.runs")" -ge 2 ] && break
            sleep 0.1
        done
        if [ "$(wc -l <"$TMP/again.runs")" = 2 ] &&
            [ "$(sed -n 2p "$TMP/again.runs")" -gt "$(sed -n 1p "$TMP/again.runs")" ]; then
            pass "elect --again: the command ran again under a greater term"
        else
            fail "elect --again: runs $(tr '\n' ' ' <"$TMP/again.runs"): $(cat "$TMP/bg.ag.err")"
        fi
    else
        fail "elect --again: never ran: $(cat "$TMP/bg.ag.err")"
    fi
    : >"$REL"
    wait_exit "$again_pid" 15
    if [ "$WRC" = 0 ]; then
        pass "elect --again: exits with CMD's status when it ends by itself"
    else
        fail "elect --again: exit $WRC: $(cat "$TMP/bg.ag.err")"
    fi
fi

# --------------------------------------------------------------------------
# Mutual exclusion, --wait, status
# --------------------------------------------------------------------------

# status_of_holder PID LEASE-RE LEASE-WHAT TTL-RE TTL-WHAT: the status of
# mxL, held by PID, on a store whose token is the one the holder was
# given (zk, etcd): its holder line names PID and its lease line matches
# LEASE-RE; in --json, ttl_ms matches TTL-RE and the token is the
# holder's DLOCK_TOKEN ($TMP/tok.mx).
status_of_holder() {
    local pid=$1 lease=$2 lease_what=$3 ttl=$4 ttl_what=$5 htok
    dl status mxL
    if [ "$RC" -eq 0 ] && grep -q "$lease" "$TMP/out" &&
        grep -q "^holder:   .*pid ${pid}[^0-9]" "$TMP/out"; then
        pass "$KIND status: the holder, $lease_what"
    else
        fail "$KIND status while held: exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi
    wait_file "$TMP/tok.mx"
    htok=$(cat "$TMP/tok.mx" 2>/dev/null)
    dl status --json mxL
    if [ "$RC" -eq 0 ] && grep -q "$ttl" "$TMP/out" &&
        [[ $htok =~ ^[1-9][0-9]*$ ]] && grep -q "\"token\":${htok}[,}]" "$TMP/out"; then
        pass "$KIND status --json: $ttl_what, token = the holder's DLOCK_TOKEN $htok"
    else
        fail "$KIND status --json while held (holder's token '$htok'): exit $RC: $(cat "$TMP/out")"
    fi
}

REL=$TMP/release.mx
# the holder keeps the lock until $REL appears (at most 10 s)
holder_cmd='printf "%s" "$DLOCK_TOKEN" > "$TOKFILE"; i=0
while [ ! -e "$REL" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done'
REL=$REL TOKFILE=$TMP/tok.mx bg_dlock mx run mxL -- sh -c "$holder_cmd"
holder=$BG
if wait_held mxL "$holder"; then
    pass "holder holds mxL"

    dl status mxL
    if [ "$RC" -eq 0 ] && grep -q '^state:    held' "$TMP/out" &&
        grep -q '^holder:   .*pid' "$TMP/out"; then
        pass "status shows held and the holder"
    else
        fail "status while held: exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi
    dl status --json mxL
    if [ "$RC" -eq 0 ] && grep -q '"held":true' "$TMP/out" &&
        grep -q '"holder":"' "$TMP/out" && grep -q '"token":[1-9]' "$TMP/out"; then
        pass "status --json while held"
    else
        fail "status --json while held: exit $RC: $(cat "$TMP/out")"
    fi
    if [ "$KIND" = zk ]; then
        # no lease: the lock lives as long as the holder's session; the
        # token is the holder node's czxid, the one the holder was given
        status_of_holder "$holder" '^lease:    none' "no lease" \
            '"ttl_ms":-1[,}]' "ttl_ms -1"
    fi
    if [ "$KIND" = etcd ]; then
        # the holder's lease left, and its key's create revision as token
        status_of_holder "$holder" '^lease:    [0-9.]*s left' \
            "its lease left" '"ttl_ms":[1-9][0-9]*[,}]' "ttl_ms > 0"
    fi

    if [ "$KIND" = redis ] || [ "$KIND" = redlock ]; then
        # the holder, the lease left (of the default 10 s ttl) and the
        # holder's token (redlock: see tok_close)
        wait_file "$TMP/tok.mx"
        htok=$(cat "$TMP/tok.mx" 2>/dev/null)
        dl status mxL
        stok=$(sed -n 's/^token:    \([0-9]*\)$/\1/p' "$TMP/out")
        if [ "$RC" -eq 0 ] && grep -q '^lease:    [0-9.]*m\?s left' "$TMP/out" &&
            grep -q "^holder:   .*pid ${holder}[^0-9]" "$TMP/out" &&
            tok_close "$stok" "$htok"; then
            pass "$KIND status: the holder, the lease, token $stok for the holder's $htok"
        else
            fail "$KIND status while held (holder's token '$htok'): exit $RC: $(cat "$TMP/out" "$TMP/err")"
        fi
        dl status --json mxL
        stok=$(sed -n 's/.*"token":\([0-9]*\)[,}].*/\1/p' "$TMP/out")
        ttl=$(sed -n 's/.*"ttl_ms":\(-\{0,1\}[0-9]*\)[,}].*/\1/p' "$TMP/out")
        if [ "$RC" -eq 0 ] && [[ $ttl =~ ^[0-9]+$ ]] && ((ttl > 0 && ttl <= 10000)) &&
            grep -q "\"holder\":\"[^\"]*pid ${holder}[^0-9]" "$TMP/out" &&
            tok_close "$stok" "$htok"; then
            pass "$KIND status --json: the holder, ttl_ms $ttl, token $stok"
        else
            fail "$KIND status --json while held (holder's token '$htok'): exit $RC: $(cat "$TMP/out")"
        fi
    fi

    if [ "$KIND" = pg ] || [ "$KIND" = mysql ] || [ "$KIND" = pg-advisory ]; then
        # a lock table shows the lease left (the server's clock); an
        # advisory lock has none: it lives as long as the holder's session
        want_lease='^lease:    [0-9.]*s left'
        [ "$KIND" = pg-advisory ] && want_lease='^lease:    none'
        wait_file "$TMP/tok.mx"
        htok=$(cat "$TMP/tok.mx" 2>/dev/null)
        dl status mxL
        if [ "$RC" -eq 0 ] && grep -q "$want_lease" "$TMP/out" &&
            grep -q "^holder:   .*pid ${holder}[^0-9]" "$TMP/out" &&
            grep -q "^token:    ${htok}\$" "$TMP/out"; then
            pass "$KIND status: the holder, its token $htok, the lease"
        else
            fail "$KIND status while held (token '$htok'): exit $RC: $(cat "$TMP/out" "$TMP/err")"
        fi
    fi

    expect_rc 75 "--wait 0 while held" -- run --wait 0 mxL -- true
    if grep -q "held" "$TMP/err"; then
        pass "--wait 0 says why"
    else
        fail "--wait 0: no message on stderr"
    fi
    # lower bound: a wait never ends before its deadline; upper bound: the
    # wait, the process's start and exit, slack for a busy machine (it
    # shows the wait ends, not its speed)
    t0=$(now_ms)
    expect_rc 75 "--wait 300ms while held" -- run --wait 300ms mxL -- true
    dt=$(($(now_ms) - t0))
    if ((dt >= 300 && dt < 5000)); then
        pass "--wait 300ms gave up after ${dt} ms"
    else
        fail "--wait 300ms gave up after ${dt} ms (expected 300 ms to a few s)"
    fi
    expect_rc 75 "--wait 0.2 (seconds) while held" -- run --wait 0.2 mxL -- true

    # a waiter with a long --wait gets it once the holder is done
    bg_dlock waiter run --wait 10s mxL -- sh -c 'printf "%s" "$DLOCK_TOKEN"'
    waiter=$BG
    sleep 0.3
    if kill -0 "$waiter" 2>/dev/null; then
        pass "--wait 10s waits while held"
    else
        fail "--wait 10s did not wait (it exited while the lock was held)"
        show "$TMP/bg.waiter.err"
    fi
    t0=$(now_ms)
    touch "$REL"
    wait_exit "$waiter" 10
    dt=$(($(now_ms) - t0))
    if [ "$WRC" = 0 ]; then
        pass "--wait 10s acquired after the release (${dt} ms)"
    else
        fail "--wait 10s waiter: exit $WRC"
        show "$TMP/bg.waiter.err"
    fi
    wtok=$(cat "$TMP/bg.waiter.out")
    htok=$(cat "$TMP/tok.mx" 2>/dev/null)
    if [[ $wtok =~ ^[0-9]+$ && $htok =~ ^[0-9]+$ ]] && ((10#$wtok > 10#$htok)); then
        pass "waiter's token $wtok > holder's $htok"
    else
        fail "waiter's token '$wtok' not greater than holder's '$htok'"
    fi
else
    fail "mxL never showed as held"
    show "$TMP/bg.mx.err"
    touch "$REL"
fi
wait_exit "$holder" 10
if [ "$WRC" = 0 ]; then
    pass "holder exited 0"
else
    fail "holder: exit $WRC"
    show "$TMP/bg.mx.err"
fi

dl status mxL
if [ "$RC" -eq 0 ] && grep -q '^state:    free' "$TMP/out" &&
    ! grep -q '^holder:' "$TMP/out"; then
    pass "status shows free after release"
else
    fail "status after release: exit $RC: $(cat "$TMP/out")"
fi
dl status --json mxL
if [ "$RC" -eq 0 ] && grep -q '"held":false' "$TMP/out" &&
    grep -q '"token":[0-9]' "$TMP/out" && grep -q '"holder":null' "$TMP/out"; then
    pass "status --json after release"
else
    fail "status --json after release: exit $RC: $(cat "$TMP/out")"
fi
dl status --json never-used-lock
if [ "$RC" -eq 0 ] && grep -q '"held":false' "$TMP/out" &&
    grep -q '"token":0[,}]' "$TMP/out"; then
    pass "status of a never-held lock"
else
    fail "status of a never-held lock: exit $RC: $(cat "$TMP/out" "$TMP/err")"
fi

# --------------------------------------------------------------------------
# The queue in status (zk and etcd: always first come, first served, and
# the store lists the waiters)
# --------------------------------------------------------------------------

# queue_pids FILE: the pids in FILE's queue (status or status --json
# output), in the order shown, one per line.
queue_pids() {
    if grep -q '^{' "$1"; then
        sed -n 's/.*"queue":\[\(.*\)\]}$/\1/p' "$1"
    else
        grep '^  [0-9][0-9]*\. ' "$1"
    fi | grep -o ' pid [0-9][0-9]*' | sed 's/^ pid //'
}

# wait_queued NAME PID...: waits (at most 10 s) until `status --json NAME`
# shows exactly the PIDs as its waiters, in that order; fails early if the
# last PID exits. Returns 0 once it does.
wait_queued() {
    local name=$1 i want
    shift
    want=$(printf '%s\n' "$@")
    for ((i = 0; i < 100; i++)); do
        if "${BOUND[@]}" "$DLOCK" status --json "$name" >"$TMP/q.json" \
            2>/dev/null </dev/null &&
            [ "$(queue_pids "$TMP/q.json")" = "$want" ]; then
            return 0
        fi
        if ! kill -0 "${!#}" 2>/dev/null; then
            return 1
        fi
        sleep 0.1
    done
    return 1
}

if [ "$KIND" = zk ] || [ "$KIND" = etcd ]; then
    REL=$TMP/release.q
    # the holder keeps the lock until $REL appears (at most 30 s)
    hold_cmd='i=0
while [ ! -e "$REL" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done'
    REL=$REL bg_dlock qh run queueL -- sh -c "$hold_cmd"
    qholder=$BG
    qwaiters=()
    if wait_held queueL "$qholder"; then
        # each waiter starts only once the one before shows in the queue
        for n in 1 2 3; do
            bg_dlock "qw$n" run queueL -- true
            qwaiters+=("$BG")
            if ! wait_queued queueL "${qwaiters[@]}"; then
                fail "waiter $n (pid $BG) never showed in the queue after" \
                    "${qwaiters[*]:0:n-1}: $(cat "$TMP/q.json")"
                show "$TMP/bg.qw$n.err"
                break
            fi
        done
        if [ "${#qwaiters[@]}" -eq 3 ]; then
            want=$(printf '%s\n' "${qwaiters[@]}")
            dl status queueL
            if [ "$RC" -eq 0 ] && grep -q "^holder:   .*pid ${qholder}[^0-9]" "$TMP/out" &&
                grep -q '^waiters:  3$' "$TMP/out" &&
                [ "$(queue_pids "$TMP/out")" = "$want" ]; then
                pass "status: the holder and 3 waiters in arrival order"
            else
                fail "status: expected holder pid $qholder, waiters" \
                    "${qwaiters[*]} in that order: exit $RC: $(cat "$TMP/out" "$TMP/err")"
            fi
            dl status --json queueL
            if [ "$RC" -eq 0 ] && grep -q "\"holder\":\"[^\"]*pid ${qholder}[^0-9]" "$TMP/out" &&
                grep -q '"waiters":3,' "$TMP/out" &&
                [ "$(queue_pids "$TMP/out")" = "$want" ]; then
                pass "status --json: the holder and 3 waiters in arrival order"
            else
                fail "status --json: expected holder pid $qholder, waiters" \
                    "${qwaiters[*]} in that order: exit $RC: $(cat "$TMP/out")"
            fi
        fi
    else
        fail "queueL never showed as held"
        show "$TMP/bg.qh.err"
    fi
    # let them all finish
    touch "$REL"
    okq=0
    for n in "${!qwaiters[@]}"; do
        wait_exit "${qwaiters[n]}" 10
        if [ "$WRC" = 0 ]; then
            okq=$((okq + 1))
        else
            fail "queue waiter $((n + 1)): exit $WRC"
            show "$TMP/bg.qw$((n + 1)).err"
        fi
    done
    wait_exit "$qholder" 10
    if [ "$WRC" = 0 ] && [ "$okq" -eq 3 ]; then
        pass "the queue's holder and 3 waiters all ran and exited 0"
    elif [ "$WRC" != 0 ]; then
        fail "queue holder: exit $WRC"
        show "$TMP/bg.qh.err"
    fi
    dl status --json queueL
    if [ "$RC" -eq 0 ] && grep -q '"held":false' "$TMP/out" &&
        grep -q '"waiters":0,' "$TMP/out"; then
        pass "queueL free with no waiters afterwards"
    else
        fail "queueL afterwards: exit $RC: $(cat "$TMP/out")"
    fi
fi

# --------------------------------------------------------------------------
# Signals reach the command
# --------------------------------------------------------------------------

sig_cmd='trap "echo got > \"$MARKER\"; kill \$sp 2>/dev/null; exit 3" TERM
sleep 20 & sp=$!
: > "$READY"
wait'
MARKER=$TMP/marker READY=$TMP/ready bg_dlock sig run sigL -- bash -c "$sig_cmd"
sigpid=$BG
if wait_held sigL "$sigpid" && wait_file "$TMP/ready"; then
    kill -TERM "$sigpid"
    wait_exit "$sigpid" 10
    if [ "$WRC" = 3 ]; then
        pass "SIGTERM to dlock: the command's trap ran, exit 3"
    else
        fail "SIGTERM to dlock: exit $WRC, expected 3"
        show "$TMP/bg.sig.err"
    fi
    if grep -q got "$TMP/marker" 2>/dev/null; then
        pass "the command received SIGTERM"
    else
        fail "the command's TERM trap did not run (no marker)"
    fi
    dl status --json sigL
    if grep -q '"held":false' "$TMP/out"; then
        pass "sigL released after the signal"
    else
        fail "sigL still held after dlock exited: $(cat "$TMP/out")"
    fi
else
    fail "sigL never held, or the command never became ready"
    show "$TMP/bg.sig.err"
    kill -KILL "$sigpid" 2>/dev/null
fi

# SIGHUP sent by a process is forwarded too, and the command dies of it.
# (Not SIGINT: a non-interactive shell starts background jobs with SIGINT
# ignored, and an ignored signal is never forwarded.)
hup_cmd=': > "$READY"; exec sleep 20'
rm -f "$TMP/ready"
READY=$TMP/ready bg_dlock hup run hupL -- sh -c "$hup_cmd"
huppid=$BG
if wait_held hupL "$huppid" && wait_file "$TMP/ready"; then
    kill -HUP "$huppid"
    wait_exit "$huppid" 10
    if [ "$WRC" = 129 ]; then
        pass "SIGHUP forwarded: exit 129"
    else
        fail "SIGHUP to dlock: exit $WRC, expected 129"
        show "$TMP/bg.hup.err"
    fi
else
    fail "hupL never held"
    show "$TMP/bg.hup.err"
    kill -KILL "$huppid" 2>/dev/null
fi

# --------------------------------------------------------------------------
# A forged hand-over (redis, rediss, redis-sentinel: one server's channel;
# the cluster's shard channels are checked by redis.cluster): a user who
# may only read and PUBLISH reads the waiter's line from the key and sends
# "g SEQ TOKEN" on its client's channel; the waiting `dlock run` does not
# start its command on it, and once the holder ends it runs with the
# key's token
# --------------------------------------------------------------------------

if [ "$KIND" = redis ] && [ -z "${CL_PORTS[*]:-}" ]; then
    FORGED=9223372036854775000
    forger=(redis-cli --no-auth-warning --user forger --pass forger-pw -p "$REDIS_PORT")
    redis-cli -p "$REDIS_PORT" ACL SETUSER forger on '>forger-pw' '+@read' \
        '+publish' allchannels '~*' >/dev/null
    REL=$TMP/forged.rel
    # the holder keeps the lock until $REL appears (at most 30 s)
    hold_cmd='i=0
while [ ! -e "$REL" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done'
    REL=$REL bg_dlock fh run forgedL -- sh -c "$hold_cmd"
    fholder=$BG
    if wait_held forgedL "$fholder"; then
        rm -f "$TMP/forged.tok"
        TOKF=$TMP/forged.tok bg_dlock fw run --wait 20s forgedL -- \
            sh -c 'echo "$DLOCK_TOKEN" > "$TOKF"'
        fwaiter=$BG
        # the waiter's line in the key: CLIENTID:TID:SEQ TTL DESC (10 s)
        line=
        for ((i = 0; i < 100; i++)); do
            line=$("${forger[@]}" GET 'dlock:{forgedL}' 2>/dev/null | sed -n 2p)
            [ -n "$line" ] && break
            sleep 0.1
        done
        id=${line%% *}
        client=${id%%:*}
        seq=${id##*:}
        n=$("${forger[@]}" PUBLISH "dlock:c:$client" "g $seq $FORGED" 2>&1)
        # a waiter that took the message for its grant would start its
        # command within a few ms of reading it; 1 s is hundreds of those
        # on a busy machine (slower, a wrong dlock could pass, never fail
        # a right one)
        sleep 1
        if [ "$n" != 1 ]; then
            fail "forged hand-over: PUBLISH reached $n subscribers, expected 1 (line '$line')"
        elif [ -e "$TMP/forged.tok" ]; then
            fail "forged hand-over: the waiter ran its command beside the holder (DLOCK_TOKEN=$(cat "$TMP/forged.tok"))"
        elif ! kill -0 "$fwaiter" 2>/dev/null; then
            fail "forged hand-over: the waiter exited"
            show "$TMP/bg.fw.err"
        else
            pass "forged hand-over: the waiter keeps waiting"
        fi
        # the holder ends: the real hand-over (10 s with slack)
        : >"$REL"
        wait_exit "$fwaiter" 10
        tok=$(cat "$TMP/forged.tok" 2>/dev/null)
        if [ "$WRC" = 0 ] && [[ $tok =~ ^[0-9]{1,18}$ ]] && ((10#$tok < FORGED)); then
            pass "forged hand-over: the real one runs the command with the store's token ($tok)"
        else
            fail "forged hand-over: exit $WRC, DLOCK_TOKEN '$tok'"
            show "$TMP/bg.fw.err"
        fi
        wait_exit "$fholder" 10
    else
        fail "forgedL never held"
        show "$TMP/bg.fh.err"
        kill -KILL "$fholder" 2>/dev/null
    fi
fi

# --------------------------------------------------------------------------
# Lock loss (every store but the file store, which has no lease to lose)
# --------------------------------------------------------------------------

# wait_free NAME SECONDS: waits (at most SECONDS) until the store says NAME
# is free. Returns 0 when it is.
wait_free() {
    local i
    for ((i = 0; i < $2 * 10; i++)); do
        if "${BOUND[@]}" "$DLOCK" status --json "$1" 2>/dev/null </dev/null |
            grep -q '"held":false'; then
            return 0
        fi
        sleep 0.1
    done
    return 1
}

if [ "$KIND" = redis ] || [ "$KIND" = redlock ]; then
    # the key deleted behind dlock's back (redlock: on every node, with
    # dlock stopped meanwhile: a renewal that still finds a quorum puts
    # the keys a node lost back, so one between two DELs, every 167 ms,
    # would undo them on a busy machine; stopped longer than its lease,
    # dlock finds it run out instead, lost too)
    bg_dlock lost run --ttl 1s --kill-after 500ms lostL -- sleep 20
    lostpid=$BG
    if wait_held lostL "$lostpid"; then
        [ "$KIND" = redlock ] && kill -STOP "$lostpid"
        n=$(redis_all DEL 'dlock:{lostL}')
        [ "$KIND" = redlock ] && kill -CONT "$lostpid"
        ndel=0
        for x in $n; do
            [[ $x =~ ^[0-9]+$ ]] && ndel=$((ndel + x))
        done
        if [ "$KIND" = redis ] && [ "$n" = 1 ]; then
            pass "deleted the lock key behind dlock's back"
        elif [ "$KIND" = redlock ] && [[ ${n//$'\n'/} =~ ^[01]+$ ]] && ((ndel >= 2)); then
            pass "deleted the lock key on the nodes behind dlock's back (${n//$'\n'/ })"
        else
            fail "redis-cli DEL 'dlock:{lostL}' answered '${n//$'\n'/ }' (key layout?)"
        fi
        # the next renewal (ttl/6 = 167 ms with the at-risk margin of
        # the 500 ms --kill-after) finds the key gone; SIGTERM, and `sleep`
        # ends at once (500 ms --kill-after at most): 0.7 s, 6 s with slack
        t0=$(now_ms)
        wait_exit "$lostpid" 6
        dt=$(($(now_ms) - t0))
        if [ "$WRC" = 76 ]; then
            pass "lost lock: exit 76 after ${dt} ms"
        else
            fail "lost lock: exit $WRC (after ${dt} ms), expected 76"
        fi
        if grep -qi "lost" "$TMP/bg.lost.err"; then
            pass "lost lock: stderr says lost"
        else
            fail "lost lock: stderr does not mention 'lost'"
        fi
        if [ "$WRC" != 76 ] || ! grep -qi lost "$TMP/bg.lost.err"; then
            show "$TMP/bg.lost.err"
        fi
    else
        fail "lostL never held"
        show "$TMP/bg.lost.err"
        kill -KILL "$lostpid" 2>/dev/null
    fi

    # a command that ignores SIGTERM is killed after --kill-after
    stubborn='trap "" TERM; : > "$READY"; i=0
while [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done'
    rm -f "$TMP/ready"
    READY=$TMP/ready bg_dlock stub run --ttl 1s --kill-after 500ms stubL -- \
        sh -c "$stubborn"
    stubpid=$BG
    if wait_held stubL "$stubpid" && wait_file "$TMP/ready"; then
        # (redlock: dlock stopped meanwhile, as for lostL above)
        [ "$KIND" = redlock ] && kill -STOP "$stubpid"
        redis_all DEL 'dlock:{stubL}' >/dev/null
        [ "$KIND" = redlock ] && kill -CONT "$stubpid"
        # the next renewal (333 ms), then SIGKILL 500 ms after SIGTERM;
        # 8 s with slack
        wait_exit "$stubpid" 8
        if [ "$WRC" = 76 ]; then
            pass "lost lock, command ignoring SIGTERM: killed, exit 76"
        else
            fail "lost lock, command ignoring SIGTERM: exit $WRC, expected 76"
            show "$TMP/bg.stub.err"
        fi
    else
        fail "stubL never held"
        show "$TMP/bg.stub.err"
        kill -KILL "$stubpid" 2>/dev/null
    fi
elif [ "$KIND" = zk ] || [ "$KIND" = etcd ]; then
    # The server frozen: the holder's connection stays down, the hold is at
    # risk (zk: the connection seen down, 2/3 of the session timeout after
    # the last answer; etcd: no keepalive answered by a sixth of the lease
    # before its end), `sleep` stops at SIGTERM, and the release fails:
    # exit 76. The server stays frozen until dlock exits (at most 20 s).
    bg_dlock lost run --ttl 3s --kill-after 300ms lostL -- sleep 30
    lostpid=$BG
    if wait_held lostL "$lostpid"; then
        # at risk 2/3 of the 3 s session after the last answer (etcd:
        # half the lease, 1.5 s), SIGTERM, then a release that waits out
        # the client's 2 s timeout: under 5 s, 20 s with slack
        t0=$(now_ms)
        kill -STOP "$(store_pid)"
        wait_exit "$lostpid" 20
        dt=$(($(now_ms) - t0))
        kill -CONT "$(store_pid)"
        if [ "$WRC" = 76 ]; then
            pass "server frozen: lost lock, exit 76 after ${dt} ms"
        else
            fail "server frozen: exit $WRC (after ${dt} ms), expected 76"
        fi
        if grep -qi "lost" "$TMP/bg.lost.err"; then
            pass "server frozen: stderr says lost"
        else
            fail "server frozen: stderr does not mention 'lost'"
        fi
        if [ "$WRC" != 76 ] || ! grep -qi lost "$TMP/bg.lost.err"; then
            show "$TMP/bg.lost.err"
        fi
    else
        fail "lostL never held"
        show "$TMP/bg.lost.err"
        kill -KILL "$lostpid" 2>/dev/null
    fi
    for ((i = 0; i < 100; i++)); do
        store_serving && break
        sleep 0.1
    done
    if store_serving && wait_free lostL 10; then
        pass "server serves again after SIGCONT; lostL free"
    else
        fail "after SIGCONT: the server does not serve, or lostL is still held"
    fi

    # The holder frozen for longer than its ttl: the server expires its
    # session and frees the lock; another process takes it; the holder,
    # thawed, learns its session expired: exit 76.
    bg_dlock froze run --ttl 1s --kill-after 50ms frozeL -- sleep 30
    frozepid=$BG
    if wait_held frozeL "$frozepid"; then
        t0=$(now_ms)
        kill -STOP "$frozepid"
        if wait_free frozeL 15; then
            pass "holder frozen: the server freed the lock after $(($(now_ms) - t0)) ms"
        else
            fail "holder frozen: frozeL still held after 15 s (ttl 1s)"
        fi
        expect_rc 0 "another process takes the lock of the frozen holder" -- \
            run --wait 10s frozeL -- true
        kill -CONT "$frozepid"
        # thawed: at risk with no lease left (SIGTERM and SIGKILL at once),
        # its session's expiry learnt at the reconnect: 10 s with slack
        wait_exit "$frozepid" 10
        if [ "$WRC" = 76 ] && grep -qi lost "$TMP/bg.froze.err"; then
            pass "holder thawed: lost lock, exit 76"
        else
            fail "holder thawed: exit $WRC, expected 76 and 'lost' on stderr"
            show "$TMP/bg.froze.err"
        fi
    else
        fail "frozeL never held"
        show "$TMP/bg.froze.err"
    fi
    kill -CONT "$frozepid" 2>/dev/null

    # a command that ignores SIGTERM is killed after --kill-after
    stubborn='trap "" TERM; : > "$READY"; i=0
while [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done'
    rm -f "$TMP/ready"
    READY=$TMP/ready bg_dlock stub run --ttl 1s --kill-after 50ms stubL -- \
        sh -c "$stubborn"
    stubpid=$BG
    if wait_held stubL "$stubpid" && wait_file "$TMP/ready"; then
        kill -STOP "$stubpid"
        wait_free stubL 15 # the server expired its session
        kill -CONT "$stubpid"
        wait_exit "$stubpid" 8
        if [ "$WRC" = 76 ]; then
            pass "lost lock, command ignoring SIGTERM: killed, exit 76"
        else
            fail "lost lock, command ignoring SIGTERM: exit $WRC, expected 76"
            show "$TMP/bg.stub.err"
        fi
    else
        fail "stubL never held"
        show "$TMP/bg.stub.err"
    fi
    kill -CONT "$stubpid" 2>/dev/null
    kill -KILL "$stubpid" 2>/dev/null

    # no lease, but a SIGKILLed holder's session ends: the lock is free
    # again within its ttl (the session timeout)
    bg_dlock crash run --ttl 1s crashL -- sleep 30
    crashpid=$BG
    if wait_held crashL "$crashpid"; then
        kill -KILL "$crashpid"
        wait "$crashpid" 2>/dev/null
        t0=$(now_ms)
        dl run --wait 10s crashL -- true
        dt=$(($(now_ms) - t0))
        if [ "$RC" -eq 0 ]; then
            pass "a SIGKILLed holder's lock taken over after ${dt} ms (ttl 1s)"
        else
            fail "a SIGKILLed holder's lock: run --wait 10s exited $RC after ${dt} ms"
            show "$TMP/out" "$TMP/err"
        fi
    else
        fail "crashL never held"
        show "$TMP/bg.crash.err"
        kill -KILL "$crashpid" 2>/dev/null
    fi

    # a ttl below the server's minimum (zk: minSessionTimeout 400 ms; etcd:
    # whole seconds, at least 1 s here) is raised. (The command is short:
    # a 400 ms ZooKeeper session on a loaded machine, under ASan, can be
    # lost for real, and that is not what this checks.)
    expect_rc 0 "--ttl 100ms (raised by the server)" -- \
        run --ttl 100ms ttlL -- sleep 0.15
elif [ "$KIND" = sqlite ]; then
    # another owner takes the row over behind dlock's back: the watchdog's
    # next extend (every ttl/3) finds it, dlock stops the command: 76
    bg_dlock lost run --ttl 1s --kill-after 500ms lostL -- sleep 20
    lostpid=$BG
    if wait_held lostL "$lostpid"; then
        n=$(python3 -c 'import sqlite3, sys
db = sqlite3.connect(sys.argv[1], timeout=5)
n = db.execute("UPDATE dlock_locks SET owner = ?, lock_until = 0 WHERE name = CAST(? AS BLOB)", ("intruder", "lostL")).rowcount
db.commit()
print(n)' "$TMP/locks.db" 2>&1)
        if [ "$n" = 1 ]; then
            pass "took the lock row over behind dlock's back"
        else
            fail "UPDATE of the lostL row answered '$n'"
        fi
        # the next extend (ttl/6 = 167 ms with the at-risk margin of the
        # 500 ms --kill-after), SIGTERM (500 ms --kill-after at most):
        # 0.7 s, 6 s with slack
        t0=$(now_ms)
        wait_exit "$lostpid" 6
        dt=$(($(now_ms) - t0))
        if [ "$WRC" = 76 ] && grep -qi lost "$TMP/bg.lost.err"; then
            pass "sqlite: lost lock, exit 76 after ${dt} ms"
        else
            fail "sqlite: lost lock: exit $WRC (after ${dt} ms), expected 76 and 'lost'"
            show "$TMP/bg.lost.err"
        fi
    else
        fail "lostL never held"
        show "$TMP/bg.lost.err"
        kill -KILL "$lostpid" 2>/dev/null
    fi
elif [ "$KIND" = pg ] || [ "$KIND" = mysql ] || [ "$KIND" = pg-advisory ]; then
    # table mode: another owner takes the row over behind dlock's back and
    # the watchdog's next extend finds it; advisory mode: an administrator
    # ends the holder's session and the client thread sees it at once
    bg_dlock lost run --ttl 1s --kill-after 500ms lostL -- sleep 20
    lostpid=$BG
    if wait_held lostL "$lostpid"; then
        case $KIND in
        pg) n=$(sql_q "UPDATE dlock_locks SET owner = 'intruder', lock_until = clock_timestamp() WHERE name = 'lostL'::bytea RETURNING 1") ;;
        mysql) n=$(sql_q "UPDATE dlock_locks SET owner = 'intruder', lock_until = UTC_TIMESTAMP(6) WHERE name = 'lostL'; SELECT ROW_COUNT()") ;;
        *) n=$(sql_q "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' AND granted AND ((classid::bigint << 32) | objid::bigint) = ('x' || substr(md5('lostL'::bytea), 1, 16))::bit(64)::bigint") ;;
        esac
        if [ "$n" = 1 ]; then
            pass "$KIND: took the lock away behind dlock's back"
        else
            fail "$KIND: taking lostL away answered '$n'"
        fi
        # the next extend (167 ms) or the session's end (at once),
        # SIGTERM (500 ms --kill-after at most): 0.7 s, 6 s with slack
        t0=$(now_ms)
        wait_exit "$lostpid" 6
        dt=$(($(now_ms) - t0))
        if [ "$WRC" = 76 ] && grep -qi lost "$TMP/bg.lost.err"; then
            pass "$KIND: lost lock, exit 76 after ${dt} ms"
        else
            fail "$KIND: lost lock: exit $WRC (after ${dt} ms), expected 76 and 'lost'"
            show "$TMP/bg.lost.err"
        fi
    else
        fail "lostL never held"
        show "$TMP/bg.lost.err"
        kill -KILL "$lostpid" 2>/dev/null
    fi
else
    echo "skip lock loss (the file store has no lease)"
fi

# --------------------------------------------------------------------------
# gc: lock tables only
# --------------------------------------------------------------------------

expect_rc 64 "gc --idle abc" -- gc --idle abc
expect_rc 64 "gc with an extra argument" -- gc extra
dl help gc
if [ "$RC" -eq 0 ] && grep -q 'usage: dlock gc' "$TMP/out"; then
    pass "help gc"
else
    fail "dlock help gc: exit $RC"
fi
if [ "$KIND" = sqlite ] || [ "$KIND" = pg ] || [ "$KIND" = mysql ]; then
    dl run gcL -- true
    dl gc --idle 0
    if [ "$RC" -eq 0 ] && grep -q '^removed [1-9]' "$TMP/out"; then
        pass "gc --idle 0 removed the free locks: $(cat "$TMP/out")"
    else
        fail "gc --idle 0: exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi
    dl gc
    if [ "$RC" -eq 0 ] && grep -q '^removed 0$' "$TMP/out"; then
        pass "gc (24h) removed nothing"
    else
        fail "gc: exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi
else
    expect_rc 69 "gc on a store without a lock table" -- gc --idle 0
fi

# --------------------------------------------------------------------------
# Fairness flag
# --------------------------------------------------------------------------

if [ "$KIND" = redlock ]; then
    # no fair mode on N independent masters: DLOCK_ENOTSUP, which the CLI
    # reports as a store failure (69), in words, before running anything
    for args in "--fair" "--fair --wait 1s --ttl 2s" "--store=$PW_STORE --fair"; do
        rm -f "$TMP/fair.ran"
        # shellcheck disable=SC2086 # split on purpose
        dl run $args fairL -- sh -c ': > "$0"' "$TMP/fair.ran"
        if [ "$RC" -eq 69 ] && grep -qi 'fair' "$TMP/err" &&
            grep -qi 'not supported' "$TMP/err" && [ ! -e "$TMP/fair.ran" ] &&
            [ ! -s "$TMP/out" ] && ! grep -q Pw9Secret "$TMP/err"; then
            pass "redlock: run ${args/Pw9Secret/***} refused: exit 69, '$(head -c 80 "$TMP/err")...'"
        else
            fail "redlock: run ${args/Pw9Secret/***}: exit $RC (expected 69, 'fair ... not" \
                "supported' on stderr, the command not run): $(cat "$TMP/out" "$TMP/err")"
        fi
    done
    dl status --json fairL
    if [ "$RC" -eq 0 ] && grep -q '"held":false' "$TMP/out" && grep -q '"token":0[,}]' "$TMP/out"; then
        pass "redlock: fairL never taken by the refused --fair runs"
    else
        fail "redlock: fairL after the refused --fair runs: exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi
else
    expect_rc 0 "--fair" -- run --fair fairL -- true
    expect_rc 0 "--fair --wait 1s --ttl 2s" -- run --fair --wait 1s --ttl 2s fairL -- true
fi
expect_rc 0 "--quiet --store=URI form" -- run --quiet "--store=$DLOCK_STORE" fairL -- true

# --------------------------------------------------------------------------
# Shared holds and semaphores (docs/locks.md: which stores have them)
# --------------------------------------------------------------------------

expect_rc 64 "run --permits 0" -- run --permits 0 semL -- true
expect_rc 64 "run --permits x" -- run --permits x semL -- true
expect_rc 64 "run --shared --permits 2" -- run --shared --permits 2 semL -- true
case $KIND in
file | redis | zk | etcd | sqlite | mysql | pg | pg-advisory) HAS_SHARED=1 HAS_PERMITS=1 ;;
*) HAS_SHARED=0 HAS_PERMITS=0 ;;
esac
if [ "$HAS_SHARED" = 1 ]; then
    # a reader holds until told; a second reader runs beside it, a writer
    # cannot; status shows the shared hold
    rm -f "$TMP/rd.go"
    bg_dlock rd run --shared rwL -- sh -c 'i=0; while [ ! -e "$0" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done' "$TMP/rd.go"
    RD=$BG
    if wait_held rwL "$RD"; then
        expect_rc 0 "run --shared beside another reader" -- run --shared --wait 0 rwL -- true
        expect_rc 75 "a writer while a reader holds (--wait 0)" -- run --wait 0 rwL -- true
        dl status --json rwL
        if [ "$RC" -eq 0 ] && grep -q '"mode":"shared"' "$TMP/out" &&
            grep -q '"holders":1' "$TMP/out"; then
            pass "status --json: mode shared, 1 holder"
        else
            fail "status --json rwL: exit $RC: $(cat "$TMP/out" "$TMP/err")"
        fi
        dl status rwL
        if grep -q 'held shared by 1 reader' "$TMP/out"; then
            pass "status: held shared by 1 reader"
        else
            fail "status rwL: $(cat "$TMP/out" "$TMP/err")"
        fi
        # a writer waiting behind the reader runs once it is done
        bg_dlock wr run --wait 20s rwL -- sh -c 'echo "$DLOCK_TOKEN" > "$0"' "$TMP/wr.tok"
        WR=$BG
        sleep 0.2
        : >"$TMP/rd.go"
        wait_exit "$RD" 15
        RDRC=$WRC
        wait_exit "$WR" 15
        if [ "$RDRC" = 0 ] && [ "$WRC" = 0 ] && [ -s "$TMP/wr.tok" ]; then
            pass "the writer ran after the reader (token $(cat "$TMP/wr.tok"))"
        else
            fail "reader exit $RDRC, writer exit $WRC (expected 0, 0)"
            show "$TMP/bg.rd.err" "$TMP/bg.wr.err"
        fi
    else
        fail "the --shared run never held rwL"
        show "$TMP/bg.rd.err"
    fi
else
    rm -f "$TMP/sh.ran"
    dl run --shared rwL -- sh -c ': > "$0"' "$TMP/sh.ran"
    if [ "$RC" -eq 69 ] && grep -q 'not supported' "$TMP/err" && [ ! -e "$TMP/sh.ran" ]; then
        pass "run --shared on $KIND: exit 69, '$(head -c 80 "$TMP/err")...'"
    else
        fail "run --shared on $KIND: exit $RC (expected 69, 'not supported', not run): $(cat "$TMP/out" "$TMP/err")"
    fi
fi
if [ "$HAS_PERMITS" = 1 ]; then
    rm -f "$TMP/p1.go"
    bg_dlock p1 run --permits 2 semL -- sh -c 'i=0; while [ ! -e "$0" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done' "$TMP/p1.go"
    P1=$BG
    if wait_held semL "$P1"; then
        expect_rc 0 "run --permits 2: a second run beside the first" -- run --permits 2 --wait 0 semL -- true
        rm -f "$TMP/p2.go"
        bg_dlock p2 run --permits 2 semL -- sh -c 'i=0; while [ ! -e "$0" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done' "$TMP/p2.go"
        P2=$BG
        for ((i = 0; i < 100; i++)); do
            "${BOUND[@]}" "$DLOCK" status --json semL 2>/dev/null | grep -q '"holders":2' && break
            sleep 0.1
        done
        expect_rc 75 "run --permits 2: a third run (--wait 0)" -- run --permits 2 --wait 0 semL -- true
        expect_rc 64 "run --permits 3 on a semaphore of 2" -- run --permits 3 --wait 0 semL -- true
        : >"$TMP/p1.go"
        : >"$TMP/p2.go"
        wait_exit "$P1" 15
        wait_exit "$P2" 15
    else
        fail "the --permits 2 run never held semL"
        show "$TMP/bg.p1.err"
    fi
else
    dl run --permits 2 semL -- true
    if [ "$RC" -eq 69 ] && grep -q 'not supported' "$TMP/err"; then
        pass "run --permits on $KIND: exit 69, '$(head -c 80 "$TMP/err")...'"
    else
        fail "run --permits on $KIND: exit $RC (expected 69, 'not supported'): $(cat "$TMP/out" "$TMP/err")"
    fi
fi

# --------------------------------------------------------------------------
# redlock: nodes frozen and killed (last: the nodes do not come back)
# --------------------------------------------------------------------------

if [ "$KIND" = redlock ]; then
    # one node frozen: every operation ends once the other two answered,
    # within node_timeout (50 ms) of them
    kill -STOP "${REDIS_PIDS[0]}"
    t0=$(now_ms)
    dl run frozenNodeL -- sh -c 'printf "%s" "$DLOCK_TOKEN"'
    dt=$(($(now_ms) - t0))
    if [ "$RC" -eq 0 ] && grep -q '^[1-9][0-9]*$' "$TMP/out" && ((dt < 3000)); then
        pass "redlock: one of 3 nodes frozen: run exit 0 after ${dt} ms"
    else
        fail "redlock: one node frozen: run exit $RC after ${dt} ms: $(cat "$TMP/out" "$TMP/err")"
    fi
    dl status frozenNodeL
    if [ "$RC" -eq 0 ] && grep -q '^state:    free' "$TMP/out"; then
        pass "redlock: one of 3 nodes frozen: status"
    else
        fail "redlock: one node frozen: status exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi
    kill -CONT "${REDIS_PIDS[0]}"

    # a holder survives the death (SIGKILL) of one node: its renewals
    # (every ttl/3) keep a quorum of two
    TOKFILE=$TMP/tok.k1 bg_dlock k1 run --ttl 1s k1L -- \
        sh -c 'printf "%s" "$DLOCK_TOKEN" > "$TOKFILE"; sleep 2'
    k1pid=$BG
    if wait_held k1L "$k1pid"; then
        kill_redis_node 2
        wait_exit "$k1pid" 10
        if [ "$WRC" = 0 ] && ! grep -qi lost "$TMP/bg.k1.err"; then
            pass "redlock: a holder (ttl 1s, 2 s command) survives a node's SIGKILL"
        else
            fail "redlock: holder across a node's SIGKILL: exit $WRC, expected 0"
            show "$TMP/bg.k1.err"
        fi
    else
        fail "k1L never held"
        show "$TMP/bg.k1.err"
        kill_redis_node 2
    fi
    k1tok=$(cat "$TMP/tok.k1" 2>/dev/null)

    # one of three killed: run works, with a token above the last one
    t0=$(now_ms)
    dl run k1L -- sh -c "$print_env"
    dt=$(($(now_ms) - t0))
    ktok=$(sed -n 2p "$TMP/out")
    if [ "$RC" -eq 0 ] && [ "$(sed -n 1p "$TMP/out")" = k1L ] &&
        [[ $ktok =~ ^[1-9][0-9]*$ ]]; then
        pass "redlock: one of 3 nodes killed: run exit 0, DLOCK_TOKEN $ktok (${dt} ms)"
    else
        fail "redlock: one node killed: run exit $RC, output: $(cat "$TMP/out" "$TMP/err")"
    fi
    if [[ $ktok =~ ^[0-9]+$ && $k1tok =~ ^[0-9]+$ ]] && ((10#$ktok > 10#$k1tok)); then
        pass "redlock: one node killed: the token still grows ($k1tok < $ktok)"
    else
        fail "redlock: one node killed: token '$ktok' not above the previous '$k1tok'"
    fi
    dl status k1L
    if [ "$RC" -eq 0 ] && grep -q '^state:    free' "$TMP/out"; then
        pass "redlock: one of 3 nodes killed: status"
    else
        fail "redlock: one node killed: status exit $RC: $(cat "$TMP/out" "$TMP/err")"
    fi

    # a second node killed under a holder: below the quorum, its renewal
    # fails and the hold is lost at the end of its validity (ttl 1s): 76
    bg_dlock k2 run --ttl 1s --kill-after 500ms k2L -- sleep 20
    k2pid=$BG
    if wait_held k2L "$k2pid"; then
        kill_redis_node 1
        t0=$(now_ms)
        wait_exit "$k2pid" 8
        dt=$(($(now_ms) - t0))
        if [ "$WRC" = 76 ] && grep -qi lost "$TMP/bg.k2.err"; then
            pass "redlock: second node killed under a holder: lost, exit 76 after ${dt} ms"
        else
            fail "redlock: second node killed under a holder: exit $WRC after ${dt} ms," \
                "expected 76 and 'lost' on stderr"
            show "$TMP/bg.k2.err"
        fi
    else
        fail "k2L never held"
        show "$TMP/bg.k2.err"
        kill_redis_node 1
    fi

    # two of three killed: no quorum: 69 at once (not after --wait),
    # naming the nodes that failed, and the command never runs
    for store in "$DLOCK_STORE" "$PW_STORE"; do
        rm -f "$TMP/k2.ran"
        t0=$(now_ms)
        dl run --wait 1s --store "$store" k2L -- sh -c ': > "$0"' "$TMP/k2.ran"
        dt=$(($(now_ms) - t0))
        what="redlock: two of 3 nodes killed"
        [ "$store" = "$PW_STORE" ] && what="$what (a password in the URI)"
        if [ "$RC" -eq 69 ] && ((dt < 1000)) && [ ! -e "$TMP/k2.ran" ] &&
            grep -qF "127.0.0.1:${REDIS_PORTS[1]}" "$TMP/err" &&
            grep -qF "127.0.0.1:${REDIS_PORTS[2]}" "$TMP/err" &&
            ! grep -q Pw9Secret "$TMP/out" "$TMP/err"; then
            pass "$what: run --wait 1s: exit 69 after ${dt} ms, nodes named"
        else
            fail "$what: run --wait 1s: exit $RC after ${dt} ms (expected 69 within" \
                "1 s, both dead nodes named, no password, command not run" \
                "$([ -e "$TMP/k2.ran" ] && echo ': it RAN')): $(cat "$TMP/out" "$TMP/err")"
        fi
    done
    expect_rc 69 "redlock: two of 3 nodes killed: status" -- status k2L
fi

# --------------------------------------------------------------------------
# redis-sentinel: a run started as the primary dies rides out the failover
# within its --wait (last: the old primary does not come back)
# --------------------------------------------------------------------------

if [ -n "${SENT_PORTS[*]:-}" ]; then
    # the sentinels call a silent primary down after 1 s here (their
    # default, 30 s, would outlast the wait below); then a vote and a
    # promotion, a few seconds on a busy machine
    for p in "${SENT_PORTS[@]}"; do
        redis-cli -p "$p" SENTINEL SET dlockcli down-after-milliseconds 1000 >/dev/null
    done
    dl run failoverL -- sh -c 'printf "%s" "$DLOCK_TOKEN"'
    before=$(cat "$TMP/out")
    kill_redis_node 0
    rm -f "$TMP/fo.tok"
    t0=$(now_ms)
    # started at once: the sentinels still name the dead primary. Before
    # (issue 33), this exited 69 in a few ms, "cannot connect to the
    # primary"; it must wait for the new primary instead, within 20 s
    bg_dlock fo run --wait 20s failoverL -- sh -c 'printf "%s" "$DLOCK_TOKEN" > "$0"' "$TMP/fo.tok"
    # 20 s of --wait, plus slack for the process to end
    wait_exit "$BG" 30
    dt=$(($(now_ms) - t0))
    after=$(cat "$TMP/fo.tok" 2>/dev/null)
    if [ "$WRC" = 0 ] && [ -n "$before" ] && [ -n "$after" ] && ((after > before)); then
        pass "redis-sentinel: run --wait 20s started as the primary died: exit 0 after ${dt} ms, token $after > $before"
    else
        fail "redis-sentinel: run --wait 20s started as the primary died: exit $WRC after ${dt} ms," \
            "tokens '$before' then '$after' (expected 0 and a higher token)"
        show "$TMP/bg.fo.err"
    fi
fi

# --------------------------------------------------------------------------

ELAPSED=$(($(now_ms) - START_MS))
echo "# $KIND: $PASSES passed, $FAILS failed, ${ELAPSED} ms"
if [ "$FAILS" -ne 0 ]; then
    exit 1
fi
exit 0
