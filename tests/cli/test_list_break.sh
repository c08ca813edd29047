#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2016
# (SC2016: single-quoted "$VAR"s are for the command's own shell.)
#
# test_list_break.sh -- `dlock list` and `dlock break` through the real
# binary, on a real store.
#
#   bash test_list_break.sh /path/to/dlock file|redis|rediss
#
# Holds a few locks with `dlock run` (odd names among them: a quote, a
# backslash, a newline and a tab; bytes that are not UTF-8; UTF-8), then
# checks the listing (table and JSON Lines, read back byte-exact with
# python3), paging (--limit 1), --prefix and usage errors; then breaks
# locks: the evicted `dlock run` must exit 76, a waiter must get the lock
# at once with a greater token, and a free lock must give exit 1.
# A part the store answers DLOCK_ENOTSUP to is skipped with its reason
# (file:// cannot break: its locks are the holders' kernel locks); that
# refusal itself is checked (exit 69 and the reason). Every wait is
# bounded. Exit: 0 passed, 1 a failure, 77 everything skipped.

set -u

# shellcheck source-path=SCRIPTDIR source=report_lib.sh
. "$(dirname "$0")/report_lib.sh"
store_args test_list_break.sh "file|redis|rediss" "$@"
if ! command -v python3 >/dev/null 2>&1; then
    echo "SKIP: python3 is not in PATH (it reads the JSON back)"
    exit 77
fi

# shellcheck source-path=SCRIPTDIR source=ops_lib.sh
. "$(dirname "$0")/ops_lib.sh"

use_store

# --------------------------------------------------------------------------
# Usage errors: 64, before any store is touched
# --------------------------------------------------------------------------

expect_rc 64 "list --limit 0" -- list --limit 0
expect_rc 64 "list --limit 10001" -- list --limit 10001
expect_rc 64 "list --limit junk" -- list --limit 12x
expect_rc 64 "list with a stray argument" -- list something
expect_rc 64 "list --prefix longer than a name" -- list --prefix "$(printf 'p%.0s' {1..513})"
expect_rc 64 "list --store without a value" -- list --store
expect_rc 64 "break without a name" -- break
expect_rc 64 "break with two names" -- break a b
expect_rc 64 "break --unknown" -- break --frobnicate a
expect_rc 0 "help list" -- help list
expect_rc 0 "help break" -- help break

# --------------------------------------------------------------------------
# Listing
# --------------------------------------------------------------------------

N_A=ops/alpha
N_B=ops/beta
N_W=$'we"ird\\na\nme\tx'    # quote, backslash, newline, tab
N_X=$'bin\xff\xfeary\xc0\xaf\xed\xa0\x80'  # not UTF-8: stray bytes, an overlong
                           # '/', a surrogate
N_U=$'ops/caf\xc3\xa9'     # UTF-8
N_S=ops/shared             # two read holds
N_P=ops/sem                # 2 of 3 permits

dl list
LIST_OK=1
if [ "$RC" -eq 69 ] && grep -q "cannot list its locks" "$TMP/err"; then
    skip "$KIND: list: the store answers DLOCK_ENOTSUP: $(head -c 300 "$TMP/err")"
    LIST_OK=0
elif [ "$RC" -eq 0 ] && grep -q "^no locks held or waited for" "$TMP/out"; then
    pass "list of an empty store: 'no locks held or waited for' (exit 0)"
else
    fail "list of an empty store: exit $RC"
    show "$TMP/out" "$TMP/err"
fi
if [ "$LIST_OK" = 1 ]; then
    expect_rc 0 "list --json of an empty store" -- list --json
    if [ -s "$TMP/out" ]; then
        fail "list --json of an empty store printed something"
        show "$TMP/out"
    fi
fi

hold a "$N_A"
hold b "$N_B"
hold w "$N_W"
hold x "$N_X"
hold u "$N_U"
hold s1 "$N_S" --shared
hold s2 "$N_S" --shared
hold p1 "$N_P" --permits 3
hold p2 "$N_P" --permits 3
for spec in "$N_A:1" "$N_B:1" "$N_W:1" "$N_X:1" "$N_U:1" "$N_S:2" "$N_P:2"; do
    if ! wait_holders "${spec%:*}" "${spec##*:}"; then
        fail "setup: '${spec%:*}' did not get ${spec##*:} holds within 10 s"
        show "$TMP"/hold.*.err
        finish
    fi
done
pass "setup: 7 locks held (9 dlock run holders)"

# check_json FILE PREFIX: every line of FILE is a JSON object, and the
# names (name_hex when present: the exact bytes) are exactly the held
# names that start with PREFIX, each once, with the fields of status.
check_json() {
    python3 - "$1" "$2" "$N_A" "$N_B" "$N_W" "$N_X" "$N_U" "$N_S" "$N_P" \
        "$KIND" <<'EOF'
import codecs, json, os, sys
codecs.register_error("u00", lambda e: (
    "".join(chr(b) for b in e.object[e.start:e.end]), e.end))
path, prefix, names, kind = sys.argv[1], os.fsencode(sys.argv[2]), \
    sys.argv[3:10], sys.argv[10]
want = {os.fsencode(n) for n in names if os.fsencode(n).startswith(prefix)}
seen = []
for raw in open(path, "rb").read().splitlines():
    o = json.loads(raw.decode("utf-8"))   # valid UTF-8 and valid JSON
    name = bytes.fromhex(o["name_hex"]) if "name_hex" in o \
        else o["name"].encode("utf-8")
    if "name_hex" in o:
        # the readable name: the same bytes, each stray one as U+00XX
        assert o["name"] == name.decode("utf-8", "u00"), o
    else:
        assert o["name"] == name.decode("utf-8"), o
    seen.append(name)
    for k in ("store", "held", "holder", "mode", "holders", "permits",
              "token", "held_ms", "ttl_ms", "waiters", "queue"):
        assert k in o, (k, o)
    assert o["held"] is True, o
    assert o["token"] > 0 or o["mode"] == "shared", o
    if name == b"ops/shared":
        assert o["mode"] == "shared" and o["holders"] == 2, o
    elif name == b"ops/sem":
        assert o["mode"] == "semaphore" and o["holders"] == 2 \
            and o["permits"] == 3, o
    else:
        assert o["mode"] == "exclusive" and o["holders"] == 1, o
        assert o["holder"], o
    if kind == "redis":
        assert o["ttl_ms"] > 0, o
assert len(seen) == len(set(seen)), ("listed twice", seen)
assert set(seen) == want, ("want", sorted(want), "got", sorted(seen))
EOF
}

if [ "$LIST_OK" = 1 ]; then
    expect_rc 0 "list --json" -- list --json
    check_json "$TMP/out" "" 2>"$TMP/py.err"
    judge $? "list --json: valid JSON Lines, every name byte-exact (name_hex for the one that is not UTF-8), modes and holds right" \
        "list --json: $(tail -n 1 "$TMP/py.err")"
    expect_rc 0 "list --json --limit 1 (a page per lock)" -- list --json --limit 1
    check_json "$TMP/out" "" 2>"$TMP/py.err"
    judge $? "list --limit 1: the pages together list every lock once" \
        "list --limit 1: $(tail -n 1 "$TMP/py.err")"
    expect_rc 0 "list --json --prefix ops/" -- list --json --prefix ops/
    check_json "$TMP/out" "ops/" 2>"$TMP/py.err"
    judge $? "list --prefix ops/: exactly the names with that prefix" \
        "list --prefix: $(tail -n 1 "$TMP/py.err")"
    expect_rc 0 "list --prefix with no match" -- list --prefix nothing/
    grep -q "^no locks held or waited for with that prefix" "$TMP/out"
    judge $? "list --prefix with no match says so" \
        "list --prefix with no match printed something else"

    # the table: a header and one line per lock; odd bytes visible
    expect_rc 0 "list (table)" -- list
    [ "$(wc -l <"$TMP/out")" -eq 8 ] &&
        head -n 1 "$TMP/out" | grep -q "^NAME .*MODE .*HOLDS .*TOKEN .*HELD .*LEASE .*WAITERS .*HOLDER"
    judge $? "list: a header and 7 lines (a newline in a name does not split its line)" \
        "list: expected a header and 7 lines"
    grep -qF 'we"ird\\na\x0ame\x09x ' "$TMP/out" &&
        grep -qF 'bin\xff\xfeary\xc0\xaf\xed\xa0\x80 ' "$TMP/out" &&
        grep -qF "$N_U " "$TMP/out"
    judge $? "list: a backslash as \\\\, control bytes and bytes that are not UTF-8 as \\xNN, UTF-8 as is" \
        "list: odd names not shown as expected"
    grep -q "^ops/shared  *shared  *2 " "$TMP/out" &&
        grep -q "^ops/sem  *semaphore  *2/3 " "$TMP/out" &&
        grep -q "^ops/alpha  *exclusive  *1 " "$TMP/out"
    judge $? "list: modes and holds (exclusive 1, shared 2, semaphore 2/3)" \
        "list: the mode/holds columns are wrong"
    # the token listed is the holder's
    tok_status=$("$DLOCK" status --json "$N_A" | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
    grep -q "^ops/alpha .* $tok_status " "$TMP/out"
    judge $? "list: ops/alpha's token is the one status gives ($tok_status)" \
        "list: ops/alpha's token is not $tok_status"
    # piping into a reader that stops early: no hang (SIGPIPE ends it)
    if "${BOUND[@]}" "$DLOCK" list --limit 1 </dev/null | head -n 1 >/dev/null; then
        pass "list | head -n 1 ends"
    else
        fail "list | head -n 1 did not end"
    fi
fi

# --------------------------------------------------------------------------
# Breaking
# --------------------------------------------------------------------------

dl break "$N_A"
BREAK_OK=1
if [ "$RC" -eq 69 ] && grep -q "cannot be broken" "$TMP/err"; then
    if [ "$KIND" = file ]; then
        if grep -q "kernel locks" "$TMP/err" && is_held "$N_A"; then
            pass "break on file:// refused with 69 and the reason; the lock is still held"
        else
            fail "break on file://: no reason given, or the lock was freed"
            show "$TMP/err"
        fi
    fi
    skip "$KIND: break: the store answers DLOCK_ENOTSUP: $(head -c 300 "$TMP/err")"
    BREAK_OK=0
elif [ "$RC" -ne 0 ]; then
    fail "break $N_A: exit $RC"
    show "$TMP/out" "$TMP/err"
    BREAK_OK=0
fi

if [ "$BREAK_OK" = 1 ]; then
    pass "break $N_A (exit 0)"
    grep -q "^evicted:  the exclusive hold, token [1-9]" "$TMP/out" &&
        grep -q "^holder:   " "$TMP/out" &&
        grep -q "next holder's token will be greater than" "$TMP/out"
    judge $? "break: prints the evicted hold, its holder and token, and the fencing promise" \
        "break: output lacks the evicted hold"
    # the evicted `dlock run` learns it at its next renewal (ttl 10 s:
    # every 2.4 s with its at-risk margin of 5.1 s), then stops sleep and
    # exits 76 (kill-after 5 s, but sleep ends at SIGTERM): 20 s covers
    # both with room for a busy machine
    if wait_exit "${BG_PIDS[0]}" 20 && [ "$WRC" = 76 ]; then
        pass "the evicted dlock run exits 76 (lock lost)"
    else
        fail "the evicted dlock run: exit $WRC, expected 76"
        show "$TMP/hold.a.err"
    fi
    expect_rc 1 "break of a free lock: 1 (nothing done)" -- break "$N_A"
    if grep -q "not held" "$TMP/err"; then
        pass "break of a free lock says it was not held"
    else
        fail "break of a free lock: no 'not held' message"
        show "$TMP/err"
    fi
    expect_rc 1 "break --json of a free lock" -- break --json "$N_A"
    python3 -c 'import json,sys; o=json.load(open(sys.argv[1])); assert o["broken"] is False and o["before"]["held"] is False and o["name"]==sys.argv[2], o' \
        "$TMP/out" "$N_A" 2>"$TMP/py.err"
    judge $? "break --json of a free lock: broken false, before.held false" \
        "break --json of a free lock: $(tail -n 1 "$TMP/py.err")"

    # a waiter behind a holder with a long lease: the break wakes it at
    # once (5 s, against the 60 s the lease would have kept it waiting),
    # and its token is above the evicted one
    hold a2 "$N_B.long" --ttl 60s
    EVICTED_PID=$HOLD_PID
    if ! wait_holders "$N_B.long" 1; then
        fail "setup: $N_B.long not held within 10 s"
    fi
    "$DLOCK" run --quiet --wait 60s "$N_B.long" -- sh -c 'echo "$DLOCK_TOKEN" >"$0"' \
        "$TMP/waiter.token" >"$TMP/waiter.out" 2>"$TMP/waiter.err" </dev/null &
    WAITER=$!
    BG_PIDS+=("$WAITER")
    # the waiter queues within a second; 10 s on a busy machine
    for ((i = 0; i < 100; i++)); do
        "$DLOCK" status --json "$N_B.long" 2>/dev/null | grep -q '"waiters":[1-9]' && break
        sleep 0.1
    done
    dl break --json "$N_B.long"
    t0=$(now_ms)
    if [ "$RC" -eq 0 ] && python3 -c 'import json,sys; o=json.load(open(sys.argv[1])); assert o["broken"] is True and o["before"]["held"] and o["before"]["token"] > 0, o; print(o["before"]["token"])' \
        "$TMP/out" >"$TMP/evicted.token" 2>"$TMP/py.err"; then
        pass "break --json: broken true, the evicted token"
    else
        fail "break --json of a held lock: exit $RC $(tail -n 1 "$TMP/py.err")"
        show "$TMP/out" "$TMP/err"
    fi
    if wait_exit "$WAITER" 5 && [ "$WRC" = 0 ]; then
        pass "the waiter got the lock $(($(now_ms) - t0)) ms after the break (its lease had 60 s left)"
    else
        fail "the waiter did not get the lock within 5 s of the break (exit $WRC)"
        show "$TMP/waiter.err"
    fi
    if [ -s "$TMP/waiter.token" ] && [ -s "$TMP/evicted.token" ] &&
        [ "$(cat "$TMP/waiter.token")" -gt "$(cat "$TMP/evicted.token")" ]; then
        pass "the next holder's token $(cat "$TMP/waiter.token") > the evicted $(cat "$TMP/evicted.token")"
    else
        fail "tokens: next $(cat "$TMP/waiter.token" 2>/dev/null), evicted $(cat "$TMP/evicted.token" 2>/dev/null)"
    fi
    # the evicted holder renews every 20 s (ttl 60 s): 30 s covers its
    # renewal and its command's end
    if wait_exit "$EVICTED_PID" 30 && [ "$WRC" = 76 ]; then
        pass "the evicted holder with the long lease exits 76 at its renewal"
    else
        fail "the evicted holder with the long lease: exit $WRC, expected 76"
    fi

    # two readers: both evicted, both told
    expect_rc 0 "break of a read-held lock" -- break "$N_S"
    grep -q "^evicted:  2 read holds" "$TMP/out"
    judge $? "break of a read-held lock: 2 read holds evicted" \
        "break of a read-held lock: output"
    expect_rc 0 "break of a semaphore" -- break "$N_P"
    grep -q "^evicted:  2 of 3 permits" "$TMP/out"
    judge $? "break of a semaphore: 2 of 3 permits evicted" \
        "break of a semaphore: output"
    # readers and permit holders renew every 3.3 s (ttl 10 s): 20 s
    for idx in 5 6 7 8; do
        if wait_exit "${BG_PIDS[$idx]}" 20 && [ "$WRC" = 76 ]; then
            pass "evicted shared/permit holder $idx exits 76"
        else
            fail "evicted shared/permit holder $idx: exit $WRC, expected 76"
        fi
    done
    # the odd name breaks too (the name reaches the store intact)
    expect_rc 0 "break of the odd name" -- break "$N_W"
    if [ "$LIST_OK" = 1 ]; then
        dl list --json
        ! grep -q '"name":"we' "$TMP/out"
        judge $? "the odd name is gone from the listing" \
            "the odd name is still listed after its break"
    fi
fi

finish
