#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# tlscerts.sh DIR -- the certificates of the TLS tests (Redis over TLS),
# made with the openssl command (EC P-256 keys: fast, even under valgrind).
#
# In DIR (made if missing):
#   ca.crt, ca.key          a test CA
#   server.crt, server.key  for "localhost": SAN DNS:localhost only (not
#                           127.0.0.1: reached as 127.0.0.1 it is a name
#                           mismatch)
#   server-ip.crt, .key     SAN IP:127.0.0.1 and DNS:localhost
#   expired.crt, .key       SAN DNS:localhost, valid from 2020-01-01 to
#                           2021-01-01 only (openssl ca -startdate/-enddate:
#                           OpenSSL 3.0's x509 command cannot date a
#                           certificate in the past)
#   client.crt, client.key  a client certificate (CN dlock-test-client,
#                           extendedKeyUsage clientAuth)
#   other-ca.crt, .key      a second CA that signed nothing used here
#   mismatch.key            a key that is not client.crt's (nor any
#                           certificate's)
# every certificate but expired.crt signed by ca.crt; all of them valid
# for 10 years from now.
#
# Idempotent: a DIR that already holds a complete set (DIR/.complete)
# whose CA and server certificate are valid for at least another day is
# left alone (a few milliseconds); otherwise the whole set is made again
# (well under 2 s), in a directory of its own and moved in file by file
# under a lock (flock DIR/.lock), so that concurrent calls on one DIR
# never mix two sets. Exit 0, or 1 with openssl's complaint on stderr.
#
# DLOCK_TEST_CACHE=CACHE (set by CTest for every test of a build): the set
# is made once, in CACHE/tls (by this script), and copied into DIR from
# there: a few milliseconds instead of a second or more of openssl.
set -eu

if [ $# -ne 1 ]; then
    echo "usage: $0 DIR" >&2
    exit 2
fi
if ! command -v openssl >/dev/null 2>&1; then
    echo "tlscerts.sh: no openssl command (apt-get install openssl)" >&2
    exit 1
fi
mkdir -p "$1"
dir=$(cd "$1" && pwd)
cd "$dir"
exec 9>.lock
flock 9

FILES="ca.crt ca.key server.crt server.key server-ip.crt server-ip.key
expired.crt expired.key client.crt client.key other-ca.crt other-ca.key
mismatch.key"

complete() {
    local f
    [ -e .complete ] || return 1
    for f in $FILES; do
        [ -s "$f" ] || return 1
    done
    openssl x509 -noout -checkend 86400 -in ca.crt >/dev/null 2>&1 &&
        openssl x509 -noout -checkend 86400 -in server.crt >/dev/null 2>&1
}
if complete; then
    exit 0
fi
rm -f .complete

cache=${DLOCK_TEST_CACHE:+$DLOCK_TEST_CACHE/tls}
if [ -n "$cache" ] && [ "$cache" != "$dir" ]; then
    # the cached set, made (or checked) once a day at most: its
    # certificates are valid for ten years
    if [ -z "$(find "$cache/.complete" -mmin -1440 2>/dev/null)" ]; then
        if DLOCK_TEST_CACHE='' bash "$0" "$cache" >/dev/null 2>&1; then
            touch "$cache/.complete"
        else
            cache=
        fi
    fi
    # shellcheck disable=SC2086 # FILES: a list of words
    if [ -n "$cache" ] && (cd "$cache" && cp -p $FILES "$dir/"); then
        : >.complete
        exit 0
    fi
fi

work=$(mktemp -d "$PWD/.make.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"

key() {
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 \
        -out "$1" 2>/dev/null
}

# a CA: self-signed, basicConstraints CA:TRUE (OpenSSL refuses an issuer
# without it), its own config (the system's openssl.cnf is not ours)
ca() {
    cat >"$1.cnf" <<EOF
[req]
distinguished_name = dn
x509_extensions = v3_ca
prompt = no
[dn]
CN = $2
[v3_ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EOF
    key "$1.key"
    openssl req -x509 -new -key "$1.key" -out "$1.crt" -days 3650 \
        -sha256 -config "$1.cnf" 2>/dev/null
}

# a leaf signed by ca.crt: leaf NAME CN SAN EKU [STARTDATE ENDDATE]
leaf() {
    local name=$1 cn=$2 san=$3 eku=$4 start=${5:-} end=${6:-}
    cat >"$name.ext" <<EOF
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = $eku
subjectAltName = $san
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF
    key "$name.key"
    openssl req -new -key "$name.key" -out "$name.csr" -subj "/CN=$cn" \
        -config ca.cnf 2>/dev/null
    if [ -z "$start" ]; then
        openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key \
            -CAcreateserial -out "$name.crt" -days 3650 -sha256 \
            -extfile "$name.ext" 2>/dev/null
        return
    fi
    # dates in the past: openssl ca with a minimal database of its own
    mkdir -p db
    : >db/index.txt
    [ -e db/serial ] || echo 1000 >db/serial
    cat >"$name.ca.cnf" <<EOF
[ca]
default_ca = test_ca
[test_ca]
database = db/index.txt
serial = db/serial
new_certs_dir = db
certificate = ca.crt
private_key = ca.key
default_md = sha256
policy = anything
unique_subject = no
copy_extensions = none
[anything]
commonName = supplied
EOF
    openssl ca -batch -notext -config "$name.ca.cnf" -in "$name.csr" \
        -out "$name.crt" -startdate "$start" -enddate "$end" \
        -extfile "$name.ext" >/dev/null 2>&1
}

fail() {
    echo "tlscerts.sh: openssl could not make $1 in $dir" >&2
    exit 1
}

ca ca dlock-test-ca || fail "the test CA"
ca other-ca dlock-test-other-ca || fail "the other CA"
leaf server localhost "DNS:localhost" serverAuth || fail server.crt
leaf server-ip 127.0.0.1 "IP:127.0.0.1, DNS:localhost" serverAuth ||
    fail server-ip.crt
leaf expired localhost "DNS:localhost" serverAuth 20200101000000Z \
    20210101000000Z || fail expired.crt
leaf client dlock-test-client "DNS:dlock-test-client" clientAuth ||
    fail client.crt
key mismatch.key || fail mismatch.key

# the expired one really is, the others really are not
if openssl x509 -noout -checkend 0 -in expired.crt >/dev/null 2>&1; then
    fail "an expired expired.crt"
fi
for f in server server-ip client; do
    openssl verify -CAfile ca.crt "$f.crt" >/dev/null 2>&1 ||
        fail "a $f.crt that ca.crt verifies"
done

chmod 600 ./*.key
for f in $FILES; do
    mv -f "$f" "$dir/$f"
done
cd "$dir"
: >.complete
