#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# shellcheck disable=SC2317
# (SC2317: stop_servers runs from ops_lib.sh's EXIT trap.)
#
# test_exporter_web.sh -- `dlock exporter` as Prometheus users run
# exporters: --web.config.file (TLS, basic auth, client certificates), one
# store listing however many scrapers ask, bounded connections, and
# labels without secrets.
#
#   bash test_exporter_web.sh /path/to/dlock redis|rediss
#
# The store is a private Redis with a password (rediss: over TLS with a
# client certificate, so that the URI carries key and certificate paths).
#   - --web.config.file errors: unknown keys named, unsupported ones
#     refused, a hash that is not bcrypt, a missing file;
#   - TLS + basic auth read by curl: the right password 200; none, a wrong
#     one, an unknown user 401; plain HTTP on the TLS port gets nothing;
#     the response headers of http_server_config;
#   - a real Prometheus scraping it over TLS with basic auth (up 1, the
#     locks' series), and with a wrong password and without TLS (up 0);
#   - 100 idle connections (half silent, half a partial TLS record), kept
#     open by reopening what the exporter closes: Prometheus' scrapes all
#     still succeed within their timeout, and curl gets an answer;
#   - no label of any series holds the password, a key or certificate
#     path, or a query parameter other than the ones that name the store;
#   - client_auth_type RequireAndVerifyClientCert: no certificate or one
#     from another CA 403, the right one 200;
#   - 20 scrapes at once with --cache-ttl 60s: one listing, counted by
#     dlock_exporter_listings_total and by Redis' own SCAN calls (the same
#     as one `dlock list`);
#   - --cache-ttl 1s and a store that starts refusing the exporter: up 0
#     within the ttl, and up 1 again once it answers.
# With DLOCK_TEST_PREFIX (valgrind) the exporters run under it and their
# exit status says whether they leaked. Every wait is bounded.
# Exit: 0 passed, 1 a failure, 77 skipped (tools missing).

set -u

# shellcheck source-path=SCRIPTDIR source=report_lib.sh
. "$(dirname "$0")/report_lib.sh"
store_args test_exporter_web.sh "redis|rediss" "$@"
for tool in curl prometheus python3 openssl redis-cli; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "SKIP: $tool is not in PATH (scripts/install-deps.sh test)"
        exit 77
    fi
done
# bcrypt hashes: Python's crypt module (libxcrypt underneath; deprecated
# since 3.11, gone in 3.13), else htpasswd (apache2-utils)
bcrypt() { # bcrypt PASSWORD: a cost-4 hash (fast, also under valgrind)
    python3 -W ignore -c 'import crypt, sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16)))' "$1" 2>/dev/null ||
        htpasswd -nbBC 4 "" "$1" 2>/dev/null | tr -d ':\n'
}
case $(bcrypt x) in
\$2[aby]\$*) ;;
*)
    echo "SKIP: no way to make a bcrypt hash (python3's crypt module, or htpasswd from apache2-utils)"
    exit 77
    ;;
esac

# shellcheck source-path=SCRIPTDIR source=ops_lib.sh
. "$(dirname "$0")/ops_lib.sh"
# shellcheck source-path=SCRIPTDIR source=exporter_lib.sh
. "$(dirname "$0")/exporter_lib.sh"

IDLE_PID=
stop_servers() {
    exporter_cleanup
    if [ -n "$IDLE_PID" ]; then
        kill -KILL "$IDLE_PID" 2>/dev/null
        wait "$IDLE_PID" 2>/dev/null
    fi
}
OPS_CLEANUP=stop_servers

dl exporter --help
if ! grep -q -- "--web.config.file" "$TMP/out"; then
    fail "dlock exporter has no --web.config.file"
    finish
fi
# a file that is not there: refused either way, saying why
dl exporter --listen 127.0.0.1:0 --web.config.file "$TMP/absent.yml"
if [ "$RC" = 64 ] && grep -q "built without libyaml" "$TMP/err"; then
    pass "a dlock built without libyaml refuses --web.config.file and names the packages"
    skip "this dlock has no --web.config.file: $(cat "$TMP/err")"
    finish
fi
if [ "$RC" = 69 ] && grep -q "libmicrohttpd" "$TMP/err"; then
    skip "this dlock was built without libmicrohttpd"
    finish
fi

# --------------------------------------------------------------------------
# The store: a private Redis with a password
# --------------------------------------------------------------------------

PW=S3cretPW
if [ "$KIND" = rediss ]; then
    start_redis tls
else
    start_redis
    CERTS=$TMP/tls
    if ! bash "$(dirname "$0")/../servers/tlscerts.sh" "$CERTS" >"$TMP/tlscerts.log" 2>&1; then
        fail "tests/servers/tlscerts.sh could not make the certificates"
        show "$TMP/tlscerts.log"
        finish
    fi
fi
redis-cli -p "$REDIS_PORT" CONFIG SET requirepass "$PW" >/dev/null
if [ "$KIND" = rediss ]; then
    STORE="rediss://:$PW@localhost:$REDIS_TLS_PORT/0?prefix=web:&cacert=$CERTS/ca.crt&cert=$CERTS/client.crt&key=$CERTS/client.key&timeout=2000"
    WANT_LABEL="rediss://localhost:$REDIS_TLS_PORT/0?prefix=web:"
else
    STORE="redis://:$PW@127.0.0.1:$REDIS_PORT/0?prefix=web:&timeout=2000"
    WANT_LABEL="redis://127.0.0.1:$REDIS_PORT/0?prefix=web:"
fi
export DLOCK_STORE=$STORE
rcli() {
    redis-cli -p "$REDIS_PORT" --no-auth-warning -a "$PW" "$@"
}

hold a web/alpha
hold b 'web/b"eta'
for n in web/alpha 'web/b"eta'; do
    if ! wait_holders "$n" 1; then
        fail "setup: '$n' was not held within 10 s"
        show "$TMP"/hold.*.err
        finish
    fi
done

# --------------------------------------------------------------------------
# --web.config.file: what it refuses
# --------------------------------------------------------------------------

HASH=$(bcrypt "pr0m-pw")
WEB=$TMP/web
mkdir -p "$WEB"
cp "$CERTS/server-ip.crt" "$CERTS/server-ip.key" "$CERTS/ca.crt" "$WEB/"
# relative paths: from the file's directory
cat >"$WEB/web.yml" <<EOF
tls_server_config:
  cert_file: server-ip.crt
  key_file: server-ip.key
  min_version: TLS12
basic_auth_users:
  prom: '$HASH'
http_server_config:
  http2: true
  headers:
    X-Content-Type-Options: nosniff
    X-Frame-Options: deny
EOF

bad_config() { # bad_config WHAT GREP YAML: refused, exit 64, message GREP
    local what=$1 re=$2
    printf '%s\n' "$3" >"$WEB/bad.yml"
    dl exporter --listen 127.0.0.1:0 --web.config.file "$WEB/bad.yml"
    if [ "$RC" = 64 ] && grep -q -- "$re" "$TMP/err"; then
        pass "web config: $what refused (exit 64, '$re')"
    else
        fail "web config: $what: exit $RC, expected 64 and '$re'"
        show "$TMP/err"
    fi
}
bad_config "an unknown key" "unknown key 'tls_config'" "tls_config:
  cert_file: server-ip.crt"
bad_config "an unknown key in tls_server_config" "unknown key 'certfile' in tls_server_config" "tls_server_config:
  certfile: server-ip.crt"
bad_config "cipher_suites (cannot be honoured)" "cipher_suites is not supported" "tls_server_config:
  cert_file: server-ip.crt
  key_file: server-ip.key
  cipher_suites: [TLS_AES_128_GCM_SHA256]"
bad_config "client_auth_type RequireAnyClientCert" "RequireAnyClientCert' is not supported" "tls_server_config:
  cert_file: server-ip.crt
  key_file: server-ip.key
  client_ca_file: ca.crt
  client_auth_type: RequireAnyClientCert"
bad_config "a key file that is not there" "nokey.pem: No such file" "tls_server_config:
  cert_file: server-ip.crt
  key_file: nokey.pem"
bad_config "a password that is not a bcrypt hash" "not a bcrypt hash" "basic_auth_users:
  prom: pr0m-pw"
bad_config "rate_limit" "rate_limit is not supported" "rate_limit:
  interval: 1s"
dl exporter --listen 127.0.0.1:0 --web.config.file "$WEB/missing.yml"
if [ "$RC" = 64 ] && grep -q "missing.yml: No such file" "$TMP/err"; then
    pass "a missing --web.config.file: exit 64, named"
else
    fail "a missing --web.config.file: exit $RC"
    show "$TMP/err"
fi

# --------------------------------------------------------------------------
# The exporter over TLS with basic auth
# --------------------------------------------------------------------------

if ! start_exporter "$TMP/e1" --store "$STORE" --cache-ttl 0 \
    --web.config.file "$WEB/web.yml"; then
    fail "the TLS exporter did not start"
    show "$TMP/e1.out" "$TMP/e1.err"
    finish
fi
E1=$EXP_PORT
URL=https://127.0.0.1:$E1/metrics
CA=(--cacert "$CERTS/ca.crt")
if grep -q "^dlock exporter: listening on https://" "$TMP/e1.out"; then
    pass "the exporter listens on https://127.0.0.1:$E1"
else
    fail "the exporter does not say https"
fi

get "$TMP/ok" "$URL" "${CA[@]}" -u prom:pr0m-pw
if [ "$CODE" = 200 ] && grep -q '^dlock_lock_held{' "$TMP/ok"; then
    pass "TLS, right password: 200 and the locks' series"
else
    fail "TLS, right password: HTTP $CODE"
    show "$TMP/ok.err" "$TMP/ok" "$TMP/e1.err"
fi
if grep -qix 'x-content-type-options: nosniff'$'\r' "$TMP/ok.h" &&
    grep -qix 'x-frame-options: deny'$'\r' "$TMP/ok.h"; then
    pass "http_server_config.headers are sent"
else
    fail "the configured headers are missing"
    show "$TMP/ok.h"
fi
for spec in "none:" "wrong password:-u prom:pr0m-pW" "unknown user:-u root:pr0m-pw" \
    "empty password:-u prom:"; do
    what=${spec%%:*}
    read -r -a extra <<<"${spec#*:}"
    get "$TMP/no" "$URL" "${CA[@]}" "${extra[@]}"
    if [ "$CODE" = 401 ] && grep -qi '^www-authenticate: basic' "$TMP/no.h" &&
        ! grep -q 'dlock_' "$TMP/no"; then
        pass "basic auth, $what: 401 with WWW-Authenticate, no metrics"
    else
        fail "basic auth, $what: HTTP $CODE"
        show "$TMP/no.h" "$TMP/no"
    fi
done
get "$TMP/plain" "http://127.0.0.1:$E1/metrics" -u prom:pr0m-pw
if [ "$CODE" != 200 ] && ! grep -qs 'dlock_' "$TMP/plain"; then
    pass "plain HTTP on the TLS port: no answer (HTTP $CODE)"
else
    fail "plain HTTP on the TLS port answered $CODE"
fi
get "$TMP/tls11" "$URL" "${CA[@]}" -u prom:pr0m-pw --tls-max 1.1
if [ "$CODE" = 000 ]; then
    pass "min_version TLS12: a TLS 1.1 client is refused"
else
    fail "min_version TLS12: a TLS 1.1 client got HTTP $CODE"
fi

# --------------------------------------------------------------------------
# Labels: no password, no key or certificate path
# --------------------------------------------------------------------------

if python3 - "$TMP/ok" "$WANT_LABEL" "$PW" "$CERTS" 2>"$TMP/py.err" <<'EOF'; then
import re, sys
text = open(sys.argv[1]).read()
want, pw, certs = sys.argv[2:5]
stores = set(re.findall(r'store="((?:[^"\\]|\\.)*)"', text))
assert stores == {want}, (stores, want)
for bad in (pw, certs, "client.key", "client.crt", "ca.crt", "cacert",
            "timeout=", "***", "@"):
    assert bad not in text, ("found", bad)
EOF
    pass "labels: store=\"$WANT_LABEL\"; no password, key or certificate path, user or other query parameter anywhere in the answer"
else
    fail "labels: $(tail -n 1 "$TMP/py.err")"
    grep -o 'store="[^"]*"' "$TMP/ok" | sort -u >"$TMP/labels"
    show "$TMP/labels"
fi

# --------------------------------------------------------------------------
# A real Prometheus over TLS with basic auth
# --------------------------------------------------------------------------

# every 2 s (5 under valgrind), each scrape's timeout the same: a TLS
# handshake, a bcrypt of cost 4 and one listing of two locks take tens of
# ms, and 2 s leaves room for a busy machine (CI runs under stress-ng);
# the test waits for a few scrapes, not for minutes
IV=$((SLOW == 1 ? 2 : 5))
printf '%s' "pr0m-pw" >"$TMP/prom.pw"
printf '%s' "wrong" >"$TMP/prom.badpw"
# https_job NAME PASSWORD_FILE: a scrape job of the TLS exporter
https_job() {
    cat <<EOF
  - job_name: $1
    scheme: https
    tls_config:
      ca_file: $CERTS/ca.crt
    basic_auth:
      username: prom
      password_file: $2
    static_configs:
      - targets: ['127.0.0.1:$E1']
EOF
}
if start_prometheus <<EOF; then
global:
  scrape_interval: ${IV}s
  scrape_timeout: ${IV}s
scrape_configs:
$(https_job dlock_tls "$TMP/prom.pw")
$(https_job dlock_badpw "$TMP/prom.badpw")
  - job_name: dlock_plain
    basic_auth:
      username: prom
      password_file: $TMP/prom.pw
    static_configs:
      - targets: ['127.0.0.1:$E1']
EOF
    pass "prometheus ready, scraping over TLS every ${IV}s"
    if wait_prom 'up{job="dlock_tls"}' 1; then
        pass "prometheus over TLS with basic auth: up 1"
    else
        fail "prometheus over TLS with basic auth: up is '$(prom_value 'up{job="dlock_tls"}')'"
        show "$TMP/prom/log"
        prom 'up' >"$TMP/prom.up"
        show "$TMP/prom.up"
    fi
    if wait_prom 'count(dlock_lock_held{job="dlock_tls"})' 2 &&
        [ "$(prom_value "dlock_lock_held{job=\"dlock_tls\",lock=\"web/b\\\"eta\",store=\"$WANT_LABEL\"}")" = 1 ]; then
        pass "prometheus has both locks' series, store label without secrets"
    else
        fail "prometheus lacks the locks' series"
        prom 'dlock_lock_held' >"$TMP/prom.held"
        show "$TMP/prom.held"
    fi
    if wait_prom 'up{job="dlock_badpw"}' 0 && wait_prom 'up{job="dlock_plain"}' 0 &&
        [ -z "$(prom_value 'dlock_lock_held{job="dlock_badpw"}')" ] &&
        [ -z "$(prom_value 'dlock_lock_held{job="dlock_plain"}')" ]; then
        pass "prometheus with a wrong password, or without TLS: up 0, no series"
    else
        fail "a wrong password or plain HTTP was let in"
        prom 'up' >"$TMP/prom.up"
        show "$TMP/prom.up"
    fi

    # ------------------------------------------------------------------
    # 100 idle connections, kept open (reopened as the exporter closes
    # them): every Prometheus scrape still succeeds within its timeout
    # ------------------------------------------------------------------
    python3 - "$E1" "$TMP/idle.ready" "$TMP/idle.stop" >"$TMP/idle.log" 2>&1 <<'EOF' &
import os, select, socket, sys, time
port, ready, stop = int(sys.argv[1]), sys.argv[2], sys.argv[3]
def conn(i):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    if i % 2:                    # the start of a TLS record, never ended
        s.sendall(b"\x16\x03\x01\x02\x00\x01")
    return s
socks = [conn(i) for i in range(100)]
open(ready, "w").close()
reopened = 0
end = time.monotonic() + 300    # bounded: the test stops us much sooner
while time.monotonic() < end and not os.path.exists(stop):
    r, _, _ = select.select(socks, [], [], 0.5)
    for s in r:                  # closed by the exporter: open it again
        i = socks.index(s)
        s.close()
        socks[i] = conn(i)
        reopened += 1
print("reopened", reopened)
EOF
    IDLE_PID=$!
    # 100 connects to a local port: milliseconds; 10 s on a busy machine
    for ((i = 0; i < 100; i++)); do
        if [ -e "$TMP/idle.ready" ]; then
            break
        fi
        sleep 0.1
    done
    if [ -e "$TMP/idle.ready" ]; then
        T0=$(date +%s)
        # a curl scrape answers within Prometheus' timeout (IV s)
        t=$(now_ms)
        get "$TMP/busy" "$URL" "${CA[@]}" -u prom:pr0m-pw --max-time "$IV"
        t=$(($(now_ms) - t))
        if [ "$CODE" = 200 ]; then
            pass "100 idle connections open: a scrape answers in $t ms (timeout ${IV} s)"
        else
            fail "100 idle connections open: the scrape got HTTP $CODE within ${IV} s"
            show "$TMP/busy.err" "$TMP/e1.err"
        fi
        # then Prometheus' own scrapes: wait for 3 after T0, all up
        got=
        for ((i = 0; i < 300 * SLOW; i++)); do
            ts=$(prom_value 'timestamp(up{job="dlock_tls"})')
            if [ -n "$ts" ] && [ "${ts%.*}" -ge $((T0 + 3 * IV)) ]; then
                got=1
                break
            fi
            sleep 0.1
        done
        W=$(($(date +%s) - T0))
        minup=$(prom_value "min_over_time(up{job=\"dlock_tls\"}[${W}s])")
        n=$(prom_value "count_over_time(up{job=\"dlock_tls\"}[${W}s])")
        if [ -n "$got" ] && [ "$minup" = 1 ] && kill -0 "$IDLE_PID" 2>/dev/null; then
            pass "100 idle connections open: prometheus' $n scrapes over ${W}s all up"
        else
            fail "100 idle connections open: prometheus' scrapes min up '$minup' over ${W}s ($n scrapes)"
            show "$TMP/idle.log" "$TMP/e1.err" "$TMP/prom/log"
        fi
    else
        fail "the idle connections could not be opened"
        show "$TMP/idle.log"
    fi
    touch "$TMP/idle.stop"
    wait_exit "$IDLE_PID" 10
    IDLE_PID=
    stop_prometheus
fi

if stop_exporter "the TLS exporter" "$TMP/e1"; then
    pass "SIGTERM: the TLS exporter exits 0${PREFIX:+ (under ${PREFIX[0]}: no leak, no error)}"
fi

# --------------------------------------------------------------------------
# Client certificates
# --------------------------------------------------------------------------

cat >"$WEB/mtls.yml" <<EOF
tls_server_config:
  cert_file: server-ip.crt
  key_file: server-ip.key
  client_ca_file: ca.crt
  client_auth_type: RequireAndVerifyClientCert
EOF
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$TMP/self.key" -out "$TMP/self.crt" -subj /CN=stranger \
    -days 2 >/dev/null 2>&1
if start_exporter "$TMP/e2" --store "$STORE" --web.config.file "$WEB/mtls.yml"; then
    URL2=https://127.0.0.1:$EXP_PORT/metrics
    get "$TMP/m0" "$URL2" "${CA[@]}"
    c0=$CODE
    get "$TMP/m1" "$URL2" "${CA[@]}" --cert "$TMP/self.crt" --key "$TMP/self.key"
    c1=$CODE
    get "$TMP/m2" "$URL2" "${CA[@]}" --cert "$CERTS/client.crt" --key "$CERTS/client.key"
    c2=$CODE
    if [ "$c0" != 200 ] && [ "$c1" != 200 ] && [ "$c2" = 200 ] &&
        ! grep -qs dlock_ "$TMP/m0" "$TMP/m1" &&
        grep -q '^dlock_exporter_up{store="[^"]*"} 1$' "$TMP/m2"; then
        pass "RequireAndVerifyClientCert: no certificate $c0, another CA's $c1, the client CA's 200"
    else
        fail "RequireAndVerifyClientCert: no certificate $c0, another CA's $c1, the client CA's $c2"
        show "$TMP/e2.err"
    fi
    stop_exporter "the client-certificate exporter" "$TMP/e2"
else
    fail "the client-certificate exporter did not start"
    show "$TMP/e2.out" "$TMP/e2.err"
fi

# --------------------------------------------------------------------------
# 20 scrapes at once: one listing
# --------------------------------------------------------------------------

# what one listing costs Redis: SCAN calls of one `dlock list`
scans() {
    rcli INFO commandstats | sed -n 's/^cmdstat_scan:calls=\([0-9]*\),.*/\1/p'
}
rcli CONFIG RESETSTAT >/dev/null
dl list
ONE=$(scans)
if [ "$RC" != 0 ] || [ -z "$ONE" ] || [ "$ONE" -lt 1 ]; then
    fail "setup: dlock list made no SCAN (exit $RC, '$ONE')"
    show "$TMP/err"
elif start_exporter "$TMP/e3" --store "$STORE" --cache-ttl 60s; then
    rcli CONFIG RESETSTAT >/dev/null
    pids=()
    for i in $(seq 20); do
        scrape "$TMP/p$i" &
        pids+=($!)
    done
    # each curl is bounded by --max-time
    for p in "${pids[@]}"; do
        wait "$p"
    done
    ok=1
    for i in $(seq 20); do
        # (the holders' `sleep 120` may be over under valgrind: the
        # store's health line, not the locks)
        if ! grep -q '^dlock_exporter_up{store="[^"]*"} 1$' "$TMP/p$i"; then
            ok=0
        fi
    done
    scrape "$TMP/p21"
    listed=$(sed -n 's/^dlock_exporter_listings_total{store="[^"]*"} //p' "$TMP/p21")
    got=$(scans)
    if [ "$ok" = 1 ] && [ "$listed" = 1 ] && [ "$got" = "$ONE" ]; then
        pass "21 scrapes (20 at once) within --cache-ttl: every one answered, one listing (dlock_exporter_listings_total 1; Redis saw $got SCAN, as for one dlock list)"
    else
        fail "21 scrapes: all answered $ok, dlock_exporter_listings_total '$listed', Redis SCAN calls $got (one listing: $ONE)"
        show "$TMP/e3.err"
    fi
    stop_exporter "the caching exporter" "$TMP/e3"
else
    fail "the caching exporter did not start"
    show "$TMP/e3.out" "$TMP/e3.err"
fi

# --------------------------------------------------------------------------
# A failed listing: served as dlock_exporter_up 0, not cached for long
# --------------------------------------------------------------------------

# up_is PORT VALUE: scrapes until dlock_exporter_up is VALUE (10 s times
# SLOW: the cache's 1 s, then one listing, which fails at once on a
# refused password or lists two locks)
up_is() {
    local i
    for ((i = 0; i < 50 * SLOW; i++)); do
        get "$TMP/u" "http://127.0.0.1:$1/metrics"
        if grep -q "^dlock_exporter_up{store=\"[^\"]*\"} $2\$" "$TMP/u"; then
            return 0
        fi
        sleep 0.2
    done
    return 1
}
if start_exporter "$TMP/e4" --store "$STORE" --cache-ttl 1s; then
    E4=$EXP_PORT
    if up_is "$E4" 1; then
        # the store refuses the exporter: a new password, its connections
        # cut (the library reconnects, and is refused)
        rcli CONFIG SET requirepass other-pw >/dev/null
        redis-cli -p "$REDIS_PORT" --no-auth-warning -a other-pw CLIENT KILL TYPE normal >/dev/null
        if up_is "$E4" 0; then
            pass "--cache-ttl 1s: a store that starts failing is served as dlock_exporter_up 0 within the ttl"
        else
            fail "--cache-ttl 1s: the failing store is still up after 10 s"
            show "$TMP/u" "$TMP/e4.err"
        fi
        redis-cli -p "$REDIS_PORT" --no-auth-warning -a other-pw CONFIG SET requirepass "$PW" >/dev/null
        if up_is "$E4" 1; then
            pass "--cache-ttl 1s: the failure is not kept: up 1 again once the store answers"
        else
            fail "--cache-ttl 1s: still down 10 s after the store came back"
            show "$TMP/u" "$TMP/e4.err"
        fi
    else
        fail "the exporter with --cache-ttl 1s never showed the store up"
        show "$TMP/u" "$TMP/e4.err"
    fi
    stop_exporter "the exporter with --cache-ttl 1s" "$TMP/e4"
else
    fail "the exporter with --cache-ttl 1s did not start"
    show "$TMP/e4.out" "$TMP/e4.err"
fi

finish
