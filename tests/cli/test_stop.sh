#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2016,SC2317
# (SC2016: single-quoted "$VAR"s are for the command's own shell; SC2317:
# cleanup runs from the EXIT trap.)
#
# test_stop.sh -- `dlock run` stops its whole command before anyone else
# can hold the lock (docs/design.md, "Stopping the work before the lease
# ends"), through the real binary:
#
#   bash test_stop.sh DLOCK TH_SERVE TH_RELAYD KIND
#
# KIND: file, redis, redlock, zk, etcd, sqlite, pg, pg-advisory or mysql.
# th_serve starts the store's servers as the C suites do and prints the
# URI; th_relayd puts a relay process in front of every server of a URI,
# which this script freezes (SIGSTOP) to cut a holder off from its store.
#
# Every kind: every process of the command (children, grandchildren,
# setsid ones) is stopped when dlock is SIGKILLed, when the supervisor is,
# and when the command exits leaving some behind (before the release);
# the command gets no descriptor dlock did not inherit and no store
# password. Kinds with a lease: --kill-after must fit in --ttl; a holder
# cut off from its store, whose command ignores SIGTERM and has a child and
# a setsid child writing, has no process left when the next holder starts
# (one log file: no line of the old tree after the new holder's).
#
# Every wait is bounded; each failed assertion prints a "FAIL:" line; the
# exit status is 1 if any failed, 77 if the store is not there, else 0.

set -u

# shellcheck source-path=SCRIPTDIR source=report_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/report_lib.sh"
need_args 4 "DLOCK TH_SERVE TH_RELAYD KIND" "$@"
DLOCK=$1
TH_SERVE=$2
TH_RELAYD=$3
KIND=$4
case $KIND in
file | redis | redlock | zk | etcd | sqlite | pg | pg-advisory | mysql) ;;
*)
    echo "test_stop.sh: unknown store kind '$KIND'" >&2
    exit 2
    ;;
esac

FAILS=0
PASSES=0
BG_PIDS=()
KEEP_PIDS=() # hold th_serve's and th_relayd's stdin open
SERVE_PID=
RELAY_PID=
LOCKER_PID=
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dlock-stop-XXXXXX") || {
    echo "FAIL: mktemp -d failed" >&2
    exit 1
}

cleanup() {
    local p
    [ -n "$RELAY_PID" ] && kill -CONT "$RELAY_PID" 2>/dev/null
    for p in "${BG_PIDS[@]}" $LOCKER_PID; do
        kill -KILL "$p" 2>/dev/null
    done
    # their stdin closes: the servers and relays stop
    for p in "${KEEP_PIDS[@]}"; do
        kill "$p" 2>/dev/null
    done
    for p in $SERVE_PID $RELAY_PID; do
        wait "$p" 2>/dev/null
    done
    if [ -z "${DLOCK_TEST_KEEP:-}" ]; then
        rm -rf "$TMP"
    else
        echo "kept $TMP" >&2
    fi
}
trap cleanup EXIT

# alive PID...: prints the pids that still run (a zombie counts as gone).
alive() {
    local p s
    for p in "$@"; do
        s=$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null) || continue
        [ "$s" = Z ] || echo "$p"
    done
}

# gone_within SECONDS PID...: 0 once none of the pids runs (0.1 s steps).
gone_within() {
    local limit=$(($1 * 10)) i
    shift
    for ((i = 0; i < limit; i++)); do
        [ -z "$(alive "$@")" ] && return 0
        sleep 0.1
    done
    return 1
}

# fed NAME CMD...: runs CMD in the background, its stdin the fifo
# $TMP/NAME.in that a sleeper holds open (th_serve and th_relayd keep
# their servers until their stdin closes), its output in $TMP/NAME.out
# and .err; its pid in FED_PID.
fed() {
    local name=$1
    shift
    sleep 100000 >"$TMP/$name.in" &
    KEEP_PIDS+=($!)
    "$@" <"$TMP/$name.in" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    FED_PID=$!
}

# fed_up NAME TENTHS [PID]: 0 once $TMP/NAME.out has its first line (the
# URI), waiting TENTHS tenths of a second at most, and no longer than PID
# runs when given.
fed_up() {
    local i
    for ((i = 0; i < $2; i++)); do
        [ -s "$TMP/$1.out" ] && return 0
        [ -z "${3:-}" ] || kill -0 "$3" 2>/dev/null || break
        sleep 0.1
    done
    [ -s "$TMP/$1.out" ]
}

# --------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------

# th_serve KIND prints the URI on its first line and keeps the servers
# until its stdin closes
mkfifo "$TMP/serve.in" "$TMP/relay.in"
fed serve "$TH_SERVE" "$KIND"
SERVE_PID=$FED_PID
# a JVM or a database initialised from scratch: 120 s on a busy machine
if ! fed_up serve 1200 "$SERVE_PID"; then
    wait "$SERVE_PID"
    rc=$?
    if [ "$rc" = 77 ]; then
        echo "skip: $(cat "$TMP/serve.err")"
        exit 77
    fi
    echo "FAIL: th_serve $KIND did not start (exit $rc)" >&2
    show "$TMP/serve.err"
    exit 1
fi
URI=$(head -n 1 "$TMP/serve.out")
HAS_LEASE=1
case $KIND in
file | pg-advisory) HAS_LEASE= ;;
esac
export DLOCK_STORE=$URI
echo "# store $KIND: ${URI//:*@/:***@}"

START_MS=$(now_ms)

# old_tree LOG READY: the command of the old holder, as a script: it and a
# child and a setsid child, all ignoring SIGTERM, write "old <what> <pid>"
# lines to LOG every 50 ms; READY once all three run
cat >"$TMP/old.sh" <<'EOF'
trap '' TERM
sh -c 'trap "" TERM; echo "$$" >> "$2.pids"; while :; do echo "old child $$" >> "$1"; sleep 0.05; done' _ "$1" "$2" &
setsid sh -c 'trap "" TERM; echo "$$" >> "$2.pids"; while :; do echo "old setsid $$" >> "$1"; sleep 0.05; done' _ "$1" "$2" &
echo "$$" >> "$2.pids"
while [ "$(wc -l < "$2.pids")" -lt 3 ]; do sleep 0.01; done
: > "$2"
while :; do echo "old main $$" >> "$1"; sleep 0.05; done
EOF

# old_tree X OPTION... LOCK: dlock run OPTION... LOCK with the old
# holder's command (log $TMP/X.log, ready file $TMP/X.ready), in the
# background; its pid in TREE_PID.
old_tree() {
    local x=$1
    shift
    rm -f "$TMP/$x.log" "$TMP/$x.ready" "$TMP/$x.ready.pids"
    "$DLOCK" run --quiet "$@" -- sh "$TMP/old.sh" "$TMP/$x.log" "$TMP/$x.ready" \
        >"$TMP/$x.out" 2>"$TMP/$x.err" </dev/null &
    TREE_PID=$!
    BG_PIDS+=("$TREE_PID")
}

# tree_up X: 0 once the command of old_tree X (or a tree of the same
# files) runs, its pids in pids.
tree_up() {
    wait_file "$TMP/$1.ready" && mapfile -t pids <"$TMP/$1.ready.pids"
}

# --------------------------------------------------------------------------
# The whole tree, on every store
# --------------------------------------------------------------------------

# dlock SIGKILLed: its supervisor sees its control pipe end and SIGKILLs
# the tree (2 s: a pipe's end of file and a scan of /proc take
# milliseconds; the rest is a busy machine's scheduling)
old_tree k killedL
KPID=$TREE_PID
if tree_up k; then
    kill -KILL "$KPID"
    wait "$KPID" 2>/dev/null
    if gone_within 2 "${pids[@]}"; then
        pass "dlock SIGKILLed: its command, child and setsid child are gone"
    else
        fail "dlock SIGKILLed: still running: $(alive "${pids[@]}")"
        ps -o pid,ppid,stat,cmd -p "$(alive "${pids[@]}" | paste -sd,)" >&2
    fi
else
    fail "killedL: the command did not start"
    show "$TMP/k.err"
fi

# the supervisor SIGKILLed: CMD dies (PR_SET_PDEATHSIG), dlock (a
# subreaper) gets the rest, SIGKILLs it, releases and exits 70
old_tree s supL
SPID=$TREE_PID
if tree_up s; then
    # dlock's one child
    sup=$(ps -o pid= --ppid "$SPID" | head -n 1 | tr -d ' ')
    kill -KILL "$sup"
    # dlock's own scan and kill, then its release: 5 s with slack
    wait_exit "$SPID" 5
    if [ "$WRC" = 70 ] && gone_within 1 "${pids[@]}" &&
        grep -q "supervisor of the command died" "$TMP/s.err"; then
        pass "supervisor SIGKILLed: every process gone, exit 70, said so"
    else
        fail "supervisor SIGKILLed: exit $WRC, still running: $(alive "${pids[@]}")"
        show "$TMP/s.err"
    fi
    if "$DLOCK" run --wait 5s supL -- true </dev/null 2>"$TMP/s2.err"; then
        pass "supervisor SIGKILLed: the lock was released"
    else
        fail "supervisor SIGKILLed: the lock is not free"
        show "$TMP/s2.err"
    fi
else
    fail "supL: the command did not start"
    show "$TMP/s.err"
fi

# the command exits and leaves a child (ignoring SIGTERM) and a setsid
# child behind: they get SIGTERM, SIGKILL after --kill-after (300 ms),
# and only then is the lock released: a waiter that takes it next writes
# after their last line; the exit status stays the command's own (5)
rm -f "$TMP/l.log" "$TMP/l.ready"
"$DLOCK" run --quiet --kill-after 300ms leftL -- sh -c '
    sh -c "trap \"\" TERM; echo \$\$ >> \"$1.pids\"; while :; do echo \"old child \$\$\" >> \"$0\"; sleep 0.05; done" "$0" "$1" &
    setsid sh -c "echo \$\$ >> \"$1.pids\"; while :; do echo \"old setsid \$\$\" >> \"$0\"; sleep 0.05; done" "$0" "$1" &
    while [ "$(wc -l < "$1.pids" 2>/dev/null || echo 0)" -lt 2 ]; do sleep 0.01; done
    : > "$1"; sleep 0.2; exit 5' "$TMP/l.log" "$TMP/l.ready" \
    >"$TMP/l.out" 2>"$TMP/l.err" </dev/null &
LPID=$!
BG_PIDS+=("$LPID")
if tree_up l; then
    "$DLOCK" run --quiet --wait 20s leftL -- sh -c 'echo "new $$" >> "$0"' \
        "$TMP/l.log" </dev/null 2>"$TMP/l2.err"
    nrc=$?
    # 300 ms after the command's exit, plus slack
    wait_exit "$LPID" 10
    late=$(awk '/^new/ {n = 1; next} n && /^old/' "$TMP/l.log" | head -n 3)
    if [ "$WRC" = 5 ] && [ "$nrc" = 0 ] && [ -z "$late" ] &&
        [ -z "$(alive "${pids[@]}")" ] && grep -q '^new' "$TMP/l.log"; then
        pass "leftover processes: stopped before the release, exit 5 kept"
    else
        fail "leftover processes: exit $WRC, waiter $nrc, late lines '$late', running: $(alive "${pids[@]}")"
        show "$TMP/l.err" "$TMP/l2.err"
    fi
    if grep -q "left processes running" "$TMP/l.err"; then
        pass "leftover processes: stderr says so"
    else
        fail "leftover processes: stderr does not say so"
        show "$TMP/l.err"
    fi
else
    fail "leftL: the command did not start"
    show "$TMP/l.err"
fi

# descriptors: the command has 0, 1, 2 and what the caller passed (3 here),
# as the same command run without dlock: none of dlock's
ls_fds='for f in /proc/self/fd/*; do n=${f##*/}; echo "$n"; done | sort -n | tr "\n" " "'
want=$(bash -c "exec 3>\"$TMP/fd3\"; exec bash -c '$ls_fds'" </dev/null)
got=$(bash -c "exec 3>\"$TMP/fd3\"; exec \"$DLOCK\" run --quiet fdL -- bash -c '$ls_fds'" </dev/null 2>"$TMP/fd.err")
if [ -n "$want" ] && [ "$got" = "$want" ]; then
    pass "descriptors: the command has only what it was given ($got)"
else
    fail "descriptors: the command has '$got', without dlock '$want'"
    show "$TMP/fd.err"
fi

# environment: DLOCK_STORE reaches the command without its password, and
# --store values never do
case $KIND in
redis) PW_URI=${URI/redis:\/\//redis://default:s3cr3t-pw@} ;; # nopass user: any password
pg | pg-advisory | mysql) PW_URI=$URI ;;                    # dlock:dlock-secret@
*) PW_URI= ;;
esac
if [ -n "$PW_URI" ]; then
    pw=$(printf '%s' "$PW_URI" | sed -n 's|^[a-z]*://[^:/@]*:\([^@]*\)@.*|\1|p')
    DLOCK_STORE=$PW_URI "$DLOCK" run --quiet envL -- sh -c 'env; cat /proc/$$/environ | tr "\0" "\n"' \
        >"$TMP/env.out" 2>"$TMP/env.err" </dev/null
    erc=$?
    want_store=$(printf '%s' "$PW_URI" | sed "s|:$pw@|@|")
    if [ "$erc" = 0 ] && [ -n "$pw" ] && ! grep -qF -- "$pw" "$TMP/env.out" &&
        grep -qxF "DLOCK_STORE=$want_store" "$TMP/env.out"; then
        pass "environment: DLOCK_STORE without its password ($want_store)"
    else
        fail "environment: exit $erc, DLOCK_STORE is '$(grep '^DLOCK_STORE=' "$TMP/env.out" | head -n 1)', the password in it: $(grep -cF -- "$pw" "$TMP/env.out")"
        show "$TMP/env.err"
    fi
fi
env -u DLOCK_STORE "$DLOCK" run --quiet --store "$URI" envL -- env \
    >"$TMP/env2.out" 2>"$TMP/env2.err" </dev/null
if ! grep -q '^DLOCK_STORE=' "$TMP/env2.out" && grep -q '^DLOCK_NAME=envL$' "$TMP/env2.out"; then
    pass "environment: a --store value is not passed on"
else
    fail "environment: --store reached the command: $(grep '^DLOCK_STORE=' "$TMP/env2.out")"
    show "$TMP/env2.err"
fi

# --------------------------------------------------------------------------
# Stores with a lease
# --------------------------------------------------------------------------

if [ -z "$HAS_LEASE" ]; then
    # no lease, no limit: any --kill-after
    if "$DLOCK" run --quiet --ttl 1s --kill-after 1h limL -- true </dev/null 2>"$TMP/lim.err"; then
        pass "no lease: --kill-after 1h with --ttl 1s is accepted"
    else
        fail "no lease: --kill-after 1h with --ttl 1s refused"
        show "$TMP/lim.err"
    fi
else
    # --kill-after must fit: 5 s in a 3 s lease cannot
    "$DLOCK" run --quiet --ttl 3s --kill-after 5s limL -- true </dev/null \
        >"$TMP/lim.out" 2>"$TMP/lim.err"
    lrc=$?
    limit=$(grep -Eo 'at most [0-9]+ ms' "$TMP/lim.err" | grep -Eo '[0-9]+')
    if [ "$lrc" = 64 ] && grep -q "does not fit in --ttl 3000 ms" "$TMP/lim.err" &&
        [ -n "$limit" ]; then
        pass "--kill-after 5s --ttl 3s: exit 64, the limit named ($limit ms)"
    else
        fail "--kill-after 5s --ttl 3s: exit $lrc"
        show "$TMP/lim.err"
    fi
    # the limit itself is accepted, a millisecond more is not
    if [ -n "$limit" ] &&
        "$DLOCK" run --quiet --ttl 3s --kill-after "${limit}ms" limL -- true </dev/null 2>"$TMP/lim1.err" &&
        ! "$DLOCK" run --quiet --ttl 3s --kill-after "$((limit + 1))ms" limL -- true </dev/null 2>/dev/null; then
        pass "--kill-after ${limit}ms fits in --ttl 3s, $((limit + 1))ms does not"
    else
        fail "--kill-after at the limit ($limit ms): refused, or one more accepted"
        show "$TMP/lim1.err"
    fi
    # the default fits by itself
    if "$DLOCK" run --quiet --ttl 3s limL -- true </dev/null 2>"$TMP/lim2.err"; then
        pass "--ttl 3s alone works (the default --kill-after fits)"
    else
        fail "--ttl 3s alone fails"
        show "$TMP/lim2.err"
    fi
    # a lease too short to stop anything in (Redis and the lock tables:
    # 100 ms leaves 55 ms of warning; ZooKeeper and etcd raise it)
    case $KIND in
    zk | etcd) ;;
    *)
        "$DLOCK" run --quiet --ttl 100ms limL -- true </dev/null 2>"$TMP/lim3.err"
        lrc=$?
        if [ "$lrc" = 64 ] && grep -q "too short" "$TMP/lim3.err"; then
            pass "--ttl 100ms: exit 64, too short"
        else
            fail "--ttl 100ms: exit $lrc"
            show "$TMP/lim3.err"
        fi
        ;;
    esac

    # The holder cut off from its store. Its command ignores SIGTERM and
    # has a child and a setsid child; the next holder, on a direct
    # connection, starts when the store's lease ends. Not one line of the
    # old tree may follow the new holder's in the log. SQLite has no
    # network to cut: another process holds the database's write lock
    # (renewals wait for it) until the old lease is over, then lets go.
    TTL=3s
    OLDURI=$URI
    if [ "$KIND" != sqlite ]; then
        fed relay "$TH_RELAYD" "$URI"
        RELAY_PID=$FED_PID
        fed_up relay 100
        OLDURI=$(head -n 1 "$TMP/relay.out")
    fi
    old_tree c --store "$OLDURI" --ttl "$TTL" cutL
    CPID=$TREE_PID
    if [ -n "$OLDURI" ] && tree_up c; then
        sleep 1 # a renewal or two through the relay
        if [ "$KIND" = sqlite ]; then
            # the write lock for 4 s: past the 3 s lease
            python3 -c 'import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], timeout=10, isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(4)
db.execute("COMMIT")' "${URI#sqlite://}" >"$TMP/locker.out" 2>&1 &
            LOCKER_PID=$!
            for ((i = 0; i < 100; i++)); do
                grep -q locked "$TMP/locker.out" 2>/dev/null && break
                sleep 0.1
            done
        else
            kill -STOP "$RELAY_PID"
        fi
        t0=$(now_ms)
        if [ "$KIND" = sqlite ]; then
            # the next holder's statements would wait for the write lock
            # too, for one client timeout: it starts once the lock is let
            # go, 4 s from now
            wait "$LOCKER_PID"
            LOCKER_PID=
        fi
        # the next holder: as soon as the store lets it (one lease, 3 s,
        # after the last renewal; 30 s covers a slow store)
        "$DLOCK" run --quiet --store "$URI" --wait 30s cutL -- \
            sh -c 'echo "new $$" >> "$0"' "$TMP/c.log" </dev/null 2>"$TMP/c2.err"
        nrc=$?
        tnew=$(($(now_ms) - t0))
        # the old dlock: SIGKILL before its lease ends, then a release
        # through the frozen relay (a client timeout, 2 s): 15 s
        wait_exit "$CPID" 15
        orc=$WRC
        [ "$KIND" != sqlite ] && kill -CONT "$RELAY_PID"
        sleep 0.3 # any straggler would write by now (every 50 ms)
        late=$(awk '/^new/ {n = 1; next} n && /^old/' "$TMP/c.log" | head -n 3)
        if [ "$nrc" = 0 ] && grep -q '^new' "$TMP/c.log" && [ -z "$late" ] &&
            [ -z "$(alive "${pids[@]}")" ]; then
            pass "cut off: the next holder ($tnew ms after the cut) started after every old process was gone"
        else
            fail "cut off: next holder exit $nrc after $tnew ms, old lines after it: '$late', still running: $(alive "${pids[@]}")"
            show "$TMP/c.err" "$TMP/c2.err"
            tail -n 5 "$TMP/c.log" >&2
        fi
        if [ "$orc" = 76 ] && grep -q "lock at risk" "$TMP/c.err" &&
            grep -q "lease left" "$TMP/c.err"; then
            pass "cut off: exit 76, stderr says the lock was at risk and the lease left"
        else
            fail "cut off: the old holder exited $orc"
            show "$TMP/c.err"
        fi
    else
        fail "cutL: the command did not start (relay: '$OLDURI')"
        show "$TMP/c.err" "$TMP/relay.err"
    fi
fi

ELAPSED=$(($(now_ms) - START_MS))
echo "# $KIND: $PASSES passed, $FAILS failed, ${ELAPSED} ms"
if [ "$FAILS" -ne 0 ]; then
    exit 1
fi
exit 0
