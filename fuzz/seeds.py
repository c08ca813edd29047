#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the hand-made seeds of every fuzz target into fuzz/corpus/<name>/.

The committed corpus is these seeds plus inputs found by fuzzing and kept
by `-merge=1` (see docs/development.md, "Fuzzing"). Fields of one input are
separated by NUL bytes (fuzz/fuzz.h). Run from anywhere; it only adds
files (named seed-*), never deletes.
"""
import hashlib
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, data):
    if isinstance(data, str):
        data = data.encode("latin-1")
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    name = "seed-" + hashlib.sha1(data).hexdigest()[:16]
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def fields(*parts):
    return b"\0".join(p.encode("latin-1") if isinstance(p, str) else p
                      for p in parts)


URIS = [
    "redis://127.0.0.1:6379",
    "redis://:s3cr%2Ft@localhost:6380/2?prefix=app:&timeout=500",
    "redis://user:pw@[::1]:6379/0?prefix=a%7Bb",
    "unix:///run/redis.sock?db=3&prefix=x",
    "rediss://host",
    "redlock://a:1,b:2,c:3?node_timeout=50&drift_factor=0.01&drift_ms=2",
    "redlock://:pw@h1,h2,h3,h4,h5/1?prefix=p&retry=3",
    "zk://127.0.0.1:2181,127.0.0.2:2181/app/locks",
    "zk://u:p@zk1/zookeeper",
    "zk://zk1/a/../b",
    "etcd://127.0.0.1:2379?prefix=dlock&timeout=1000",
    "etcds://u:p@[fe80::1%25eth0]:2379/?cacert=/ca.pem&cert=c&key=k",
    "postgres://u:p@db:5432/app?table=locks&mode=advisory&sslmode=verify-full",
    "postgresql:///app?host=/run/postgresql&table=a%22b",
    "mysql://u:p@127.0.0.1:3306/app?table=t&ssl_mode=verify_identity&timeout=5",
    "mariadb://root@localhost/db?ssl_ca=/x",
    "sqlite:///tmp/x.db?table=dlock",
    "file:///var/lock/dlock",
    "file://",
    "FILE:///x?a=1&&b&=c",
    "redis://h:0", "redis://h:65536", "redis://[::1", "redis://a,,b",
    "redis://h/%", "redis://h/%0", "redis://h/%00", "redis://h?a=1&a=2",
    "x://", "1a://b", "redis:/h", "redis://h#f", "redis://h p",
    "redis://u:p:q@h", "redis://@h", "redis://:@h", "redis://a@b@c/d?e@f",
    # Redis over TLS: rediss://, and redis:// with tls=1
    "rediss://localhost:6380?cacert=/etc/ssl/ca.crt",
    "rediss://u:p%40w@localhost:6380/2?cacert=/ca.pem&cert=/c.crt&key=/c.key"
    "&sni=redis.example&prefix=app:&timeout=500",
    "rediss://127.0.0.1:6380?cacert=%2Ftmp%2Fa%20b%2Fca.crt&sni=localhost",
    "rediss://[::1]:6380?insecure=1",
    "rediss://h?insecure=0&cacert=",
    "rediss://h?cert=/c.crt",
    "rediss://h?key=/c.key",
    "rediss://h?sni=",
    "rediss://h?tls=1&tls=0",
    "redis://localhost:6380?tls=1&cacert=/ca.pem",
    "redis://h?tls=0&cacert=/ca.pem",
    "redis://h?tls=yes&insecure=1",
    "unix:///run/redis.sock?tls=1&cacert=/ca.pem",
    "unix:///run/redis.sock?sni=h&insecure=1",
    "redis-sentinel://s1,s2/m?tls=1&cacert=/ca.pem&sni=redis.example",
    "redis-cluster://a:7000,b:7001?tls=1&cert=/c.crt&key=/c.key&insecure=1",
    "redlock://a:1,b:2,c:3?tls=1&cacert=/ca.pem&node_timeout=250",
]

for u in URIS:
    put("uri", u)
for u in ["postgres://127.0.0.1:1/S3cret@db/appdb", "redis://u:p%2Fw@h?password=x&y",
          "file:///tmp/a@b", "redis://h:6379/0?prefix=a@b", "redis://h?Pass%77ord=1"]:
    put("uri", u)

# fuzz_redact: scheme index, layout bits, then password, user, hosts, path,
# query (fuzz_redact.c)
for sch, lay, pw, user, hosts, path, query in [
    (9, 0x2F, "S3c/r?t@%:", "alice", "db:5432", "appdb", "sslmode=require"),
    (5, 0x6E, "p@ss&w=1", "u", "r1:1,r2:2", "", "node_timeout=5"),
    (2, 0x0A, "a/b?c", "", "", "run/redis.sock", ""),
    (15, 0x03, "//x@y", "w", "h", "", ""),
    (7, 0x96, "tok?en&x", "root", "e1:2379", "", "prefix=p@q:r"),
]:
    put("redact", bytes([sch, lay]) + fields(pw, user, hosts, path, query))

def i64(v):
    return (v & 0xffffffffffffffff).to_bytes(8, "big")

for d, ms, args in [
        ("500ms", 850, ["--store", "redis://h", "--wait=5s"]),
        ("1.5s", 12345, ["--wait"]),
        ("2m", 245000, ["-w", "10"]),
        ("1h", 7800000, []),
        ("forever", -1, ["--ttl=", "x"]),
        ("-1", 0, []), ("inf", 999, []), ("999999999999h", 1 << 62, []),
        ("0.0000000001ms", (1 << 63) - 1, []), (".5", -(1 << 63), []),
        ("12", 59999, []), ("1e3s", 3599999, []), ("", 600, [])]:
    put("cli_opt", fields(d, i64(ms) + bytes([31]) + b"--store",
                          *args) if args else
        fields(d) + b"\0" + i64(ms) + bytes([7]))

# --- file: NAME \0 FLAGS CONTENT (fuzz_file.c) ---
import struct

_rec = (struct.pack('<QQQqq', 1700000000000000, 1700000000000000, 0, 1234,
                    1235) + b'host pid 1234 tid 1235'.ljust(160, b'\0') +
        struct.pack('<I', 4) + b'name')
for name, flags, content in [
        ("a", 4, b'\0' * 56 + _rec), ("a", 5, b'\0' * 56 + _rec),
        ("x/y", 7 | (5 << 3), b'\0' * 56 + _rec),
        (".hidden", 0, b''), ("..", 1, b'DLOCKF1\n'), ("zookeeper", 4, b''),
        ("%41", 5, b'\0' * 56 + b'\xff' * 300),
        ("\xff" * 512, 5, b'\0' * 56 + struct.pack('<QQQ', 1 << 63, 1 << 63,
                                                   (1 << 64) - 1)),
        ("a" * 213 + "/", 4, b'junk'),
        ("A-b_c.d", 3, b'NOTMAGIC' + b'\0' * 300)]:
    put("file", fields(name) + b'\0' + bytes([flags]) + content)


# --- redis: URI \0 NAME \0 PASSWORD \0 ERRMSG \0 FLAGS RESP (fuzz_redis.c) ---
def bulk(s):
    if s is None:
        return b"$-1\r\n"
    s = s.encode("latin-1") if isinstance(s, str) else s
    return b"$%d\r\n%s\r\n" % (len(s), s)


def arr(*items):
    return b"*%d\r\n" % len(items) + b"".join(items)


def num(n):
    return b":%d\r\n" % n


OWNER = "0123456789abcdef0123456789abcdef:4242"
VAL = OWNER + " 1700000000000001 1700000000000 host pid 1 tid 2"
INSPECT = [
    arr(num(1700000001000), bulk(VAL), num(29000), bulk("1700000000000001"),
        num(0), arr()) + arr(bulk("dlock:{a}:w:0"), num(2)),
    arr(num(1700000001000), bulk(None), num(-2), bulk(None), num(0), arr()) +
    arr(bulk("dlock:{a}:w:0"), num(0)),
    arr(num(5), bulk(OWNER + " 18446744073709551615 18446744073709551615 d"),
        num(-1), bulk("99999999999999999999"), num(9223372036854775807),
        arr(bulk("1 host pid 3 tid 4"), bulk("x"), num(3))) +
    arr(bulk("k"), num(9223372036854775807)),
    arr(num(-9223372036854775808), bulk("junk"), num(1), num(-1), bulk("x"),
        arr()) + b"-ERR x\r\n",
    b"-NOAUTH Authentication required.\r\n",
    b"-WRONGTYPE Operation against a key\r\n",
    b"-DLOCKFENCE the fencing counter\r\n",
]
# the shared forms (redis_rw.c): readers, a semaphore, a sole holder's
# end "?", kinded waiter lines behind a writer
INSPECT += [
    arr(num(1700000001000), bulk("S 1700000000000003\n+ " + OWNER +
        " 1700000000000002 1700000009000 host pid 1 tid 2\n+ " + OWNER +
        "1 1700000000000003 1700000000500 gone\n" + OWNER +
        ":7 30000 w\n" + OWNER + ":8 r 30000 r"), num(8000)),
    arr(num(1700000001000), bulk("N 3 1700000000000009\n+ " + OWNER +
        " 1700000000000009 ? d\n" + OWNER + ":9 p3 100 p"), num(100)),
    arr(num(1), bulk(VAL + "\n" + OWNER + ":5 r 30000 x\n" + OWNER +
        ":6 p 1 y"), num(-1)),
    arr(num(1), bulk("N 0 1\n+ a b c d\n+ \n+"), num(1)),
    arr(num(1), bulk("S x\n+ o 1 99999999999999999999999 d"), num(1)),
    arr(num(1), bulk("- 1700000000000009 3"), num(100)),
    arr(num(1), bulk("- 1700000000000009 99999999999999999999"), num(100)),
]
SUB = [
    arr(bulk("message"), bulk("dlock:c:fuzz"), bulk("17")),
    arr(bulk("message"), bulk("dlock:{a}:w:0"), bulk("")),
    arr(bulk("message"), bulk("dlock:{a}}}:w:0"), bulk("")),
    arr(bulk("subscribe"), bulk("dlock:{a}:w:0"), num(1)),
    arr(bulk("unsubscribe"), bulk("dlock:c:fuzz"), num(0)),
    b"*3\r\n$7\r\nmessage\r\n$2\r\n{}\r\n:1\r\n",
]
for uri, name, resp in [
        ("redis://127.0.0.1:6379", "a", INSPECT[0] + SUB[0] + SUB[1]),
        ("redis://h/3?prefix=app:", "a", INSPECT[1] + SUB[3]),
        ("unix:///run/r.sock?db=2&timeout=100", "a}b{c", INSPECT[2]),
        ("redis://h?db=1000001", "\xff\x00", INSPECT[3]),
        ("redis://u:p@h", "x" * 512, INSPECT[4] + SUB[2] + SUB[4] + SUB[5]),
        ("redis://h,i", "n", INSPECT[5]), ("unix://h/x", "n", INSPECT[6]),
        ("redis://h/1?db=2", "n", SUB[0] + SUB[0]),
        ("redis://h?prefix=a{b", "n", b"*1\r\n*1\r\n*1\r\n"),
        ("redis://h", "n", b"+OK\r\n:12\r\n$3\r\n-12\r\n"),
        ("redis://h", "s", INSPECT[7]), ("redis://h", "p", INSPECT[8]),
        ("redis://h", "k", INSPECT[9]), ("redis://h", "z", INSPECT[10]),
        ("redis://h", "y", INSPECT[11]), ("redis://h", "t", INSPECT[12]),
        ("redis://h", "u", INSPECT[13]),
        ("rediss://localhost:6380/1?cacert=/ca.pem&sni=h&prefix=t:", "a",
         INSPECT[0] + SUB[0]),
        ("redis://h?tls=1&cacert=/ca.pem&cert=/c.crt&key=/c.key", "a",
         INSPECT[1] + SUB[1]),
        ("rediss://u:s3cret@h?insecure=1&timeout=100", "n", SUB[3] + SUB[4]),
        ("unix:///run/r.sock?tls=1", "n", INSPECT[2])]:
    put("redis", fields(uri, name, "s3cret", "WRONGPASS s3cret invalid") +
        b"\0" + bytes([1]) + resp)

# a Sentinel's watch (redis_sentinel.c): moves of the master named by
# field 2
MOVES = [
    arr(bulk("message"), bulk("+switch-master"),
        bulk("m 127.0.0.1 6379 127.0.0.1 6380")),
    arr(bulk("message"), bulk("+promoted-slave"),
        bulk("slave 127.0.0.1:6381 127.0.0.1 6381 @ m 127.0.0.1 6380")),
    arr(bulk("message"), bulk("+switch-master"), bulk("m a 1 b 70000")),
    arr(bulk("message"), bulk("+promoted-slave"),
        bulk("sentinel 1:2 1 2 @ m 1 2")),
    arr(bulk("message"), bulk("+switch-master"), bulk("m " + "h" * 300 +
        " 1 " + "h" * 300 + " 2")),
]
for name, resp in [("m", MOVES[0] + MOVES[1]), ("m", MOVES[2] + MOVES[3]),
                   ("m", MOVES[4]), ("other", MOVES[0])]:
    put("redis", fields("redis-sentinel://s:26379/m", name, "", "") + b"\0" +
        bytes([0]) + resp)

# a Redis Cluster (redis_cluster.c, redis_wait.c): CLUSTER SLOTS answers,
# a MOVED answer in field 4, the subscribers' sharded replies
SLOTS = [
    arr(arr(num(0), num(5460), arr(bulk("127.0.0.1"), num(7000),
                                   bulk("a" * 40)),
            arr(bulk("127.0.0.1"), num(7003), bulk("d" * 40))),
        arr(num(5461), num(16383), arr(bulk(""), num(7001), bulk("b" * 40)))),
    arr(arr(num(16000), num(17000), arr(bulk("h"), num(1)))),
    arr(arr(num(5), num(1), arr(bulk("h"), num(70000)))),
    arr(arr(num(0), num(16383), arr(bulk("?"), num(7002)))),
]
SHARD = [
    arr(bulk("ssubscribe"), bulk("dlock:{a}c:0123456789abcdef0123456789abcdef"),
        num(1)),
    arr(bulk("smessage"), bulk("dlock:{a}c:0123456789abcdef0123456789abcdef"),
        bulk("g 7 1700000000000002")),
    arr(bulk("sunsubscribe"), bulk("dlock:{a}c:x"), num(0)),
    b"-MOVED 3999 127.0.0.1:7002\r\n",
]
for name, moved, resp in [
        ("a", "MOVED 3999 127.0.0.1:7002", SLOTS[0] + SHARD[0] + SHARD[1]),
        ("a{b}c", "MOVED 16384 h:1", SLOTS[1] + SHARD[2] + SHARD[3]),
        ("}", "ASK 1 h:1", SLOTS[2] + SLOTS[3]),
        ("x", "MOVED 1 :7", SLOTS[3])]:
    put("redis", fields("redis-cluster://127.0.0.1:7000", name, "", moved) +
        b"\0" + bytes([0]) + resp)

# dlock_list() and dlock_break() (redis_operate.c): field 3 a name prefix,
# field 4 a cursor (one server's, and Redlock's per node), the reply the
# break script's answer: {server ms, value before, pttl, broke, grants}
BREAK = [
    arr(num(1700000001000), bulk(VAL + "\n" + OWNER + ":7 30000 w"),
        num(29000), num(1), bulk("0123456789abcdef0123456789abcdef"),
        bulk("7"), bulk("1700000000000002"), num(30000)),
    arr(num(1700000001000), bulk(None), num(-2), num(0)),
    arr(num(1), bulk("- 1700000000000009"), num(100), num(0)),
    arr(num(1), bulk("hello"), num(-1), num(0)),
    arr(num(1), bulk(VAL), num(1), num(1), bulk("x")),
]
for uri, name, prefix, cursor, flags, resp in [
        ("redis://h", "a*b", "a*", "0", 0, BREAK[0]),
        ("redis://h?prefix=p*[q]:", "op/odd/a[x]", "op/odd/a[", "123", 4,
         BREAK[1]),
        ("redis://h", "a\\b", "a\\", "18446744073709551615", 1, BREAK[2]),
        ("redis://h", "n", "", "18446744073709551616", 2, BREAK[3]),
        ("redis://h", "a{t}", "a{", "12,-,x,0,7", 4, BREAK[4]),
        ("redis://h", "n", "n", ",,", 1, BREAK[0]),
        ("redis://h", "n", "m", "-,-,-", 2, BREAK[1])]:
    put("redis", fields(uri, name, prefix, cursor) + b"\0" + bytes([flags]) +
        resp)


# --- etcd: URI \0 NAME \0 JSON \0 WATCH-STREAM (fuzz_etcd.c) ---
import base64
import json


def b64(s):
    return base64.b64encode(s.encode("latin-1")).decode()


_kv = {"key": b64("dlock/a/694d5a1b2c3d4e5f"), "create_revision": "42",
       "mod_revision": "42", "version": "1", "lease": "7587869876543210",
       "value": b64(OWNER + "\nhost pid 1 tid 2")}
_kv2 = dict(_kv, key=b64("dlock/a/694d5a1b2c3d4e60"), create_revision="43",
            value=b64("someone else"))
RANGE = [
    {"header": {"revision": "50"}, "kvs": [_kv, _kv2, dict(_kv2, value="")],
     "count": "3"},
    {"header": {"revision": "50"}},
    {"kvs": [dict(_kv, create_revision=1e300, lease=-1e300)],
     "count": -9223372036854775808},
    {"kvs": [dict(_kv, value="!!!notb64", lease=True)], "count": "x"},
    {"succeeded": True, "responses": [{}, {"response_range": {
        "kvs": [_kv, _kv2], "count": "2"}}], "header": {"revision": "9"}},
    {"result": {"TTL": "9223372036854775807"}, "ID": 1.5, "TTL": "-3"},
    {"error": "etcdserver: lease not found", "code": 5},
]
WATCH = [
    json.dumps({"result": {"created": True}}) + "\n" +
    json.dumps({"result": {"events": [{"type": "DELETE", "kv": {
        "key": b64("dlock/a/")}}]}}) + "\n",
    json.dumps({"result": {"canceled": True}}) + "\n",
    "{not json}\n",
    json.dumps({"result": {"events": [{"type": "PUT"}, 3, None]}}) + "\n" +
    "\n" + json.dumps({"result": {}}),
]
for i, (uri, name) in enumerate([
        ("etcd://127.0.0.1:2379", "a"),
        ("etcds://u:p@h1:1,[::1]:2/?prefix=app&cacert=/c&cert=c&key=k", "a/b%c"),
        ("etcd://h?prefix=&timeout=5", "%2F"),
        ("etcd://h/x", "\xff" * 512),
        ("etcd://h?prefix=" + "p" * 256, "/"),
        ("etcds://h?cert=c", "n"), ("etcd://u@h", "n")]):
    put("etcd", fields(uri, name, json.dumps(RANGE[i % len(RANGE)]),
                       WATCH[i % len(WATCH)]))


# --- zk: CHROOT \0 NAME \0 CHILD \0 CHILD ... (fuzz_zk.c) ---
for chroot, name, kids in [
        ("", "a", ["l-0000000002", "l-0000000001", "x", "l-abc0000000003"]),
        ("/app/locks", "a/b", ["l-c0ffee-0000000010", "l-0000000009"]),
        ("/", "zookeeper", []), ("", "..", ["l-", "l-000000000", "l-9999999999"]),
        ("/zookeeper/x", ".", []), ("/a//b", "%7A", []), ("/a/./b", "n", []),
        ("/a/..", "n", []), ("/a/", "n", []), ("/" + "x" * 256, "\xff" * 512, []),
        ("/a\x01", "n", ["l-0000000001"] * 3)]:
    put("zk", fields(chroot, name, *kids))


# --- pg: URI \0 TABLE \0 NAME \0 PAYLOAD ... (fuzz_pg.c) ---
_id = "0123456789abcdef0123456789abcdef"
for uri, table, name, payloads in [
        ("postgres://u:p@db:5432/app?table=locks&sslmode=require", "locks", "a",
         ["61", "61 " + _id + ":7", "61 ffff:1"]),
        ("postgresql:///app?host=/run/postgresql&mode=advisory", 'a"b', "a b",
         ["", "6", "zz", "6120", "61 "]),
        ("postgres://h1,h2:1,[::1]:2/db?target_session_attrs=read-write",
         '"' * 48, "\xff" * 512, ["ff" * 600]),
        ("postgres://" + ",".join(["h" * 300] * 4) + "/db", "'" * 48, "x", []),
        ("postgres://h/db?mode=x", "a'b\"c", "x", []),
        ("postgres:///", "", "", []),
        ("postgres://h/db?sslmode=a&sslrootcert=b&sslcert=c&sslkey=d&sslcrl=e",
         "t" * 49, "n", []),
        # grants from T_unlock, application_names of advisory sessions
        ("postgres://h/db", "t", "n",
         [_id + ":3:42 " + _id + ":4:43 ", "g 3 42", _id + ":x:1",
          _id + ":3:", ":" * 40 + " " * 3, _id + ":18446744073709551616:1"]),
        ("postgres://h/db?mode=advisory", "t", "n",
         ["dlock 42 s3 host pid 1 tid 2", "dlock 0 s33 x", "dlock 7 host",
          "dlock 9 s0 y", "dlock 1 s4294967297 z", "dlock ", "dlock 5 s",
          "dlock 5 s3", "x" * 300, "dlock 5 " + "d" * 400])]:
    put("pg", fields(uri, table, name, *payloads))


# --- mysql: TABLE \0 NAME (fuzz_mysql.c) ---
for table, name in [("dlock_locks", "a"), ("`" * 48, "\xff" * 512),
                    ("a`b", "x'y\\z"), ("t" * 49, ""), ("", "n")]:
    put("mysql", fields(table, name))

# --- mysql, list and break: TABLE \0 NAME \0 CURSOR \0 PREFIX \0 KILLS ---
for name, cursor, prefix, kills in [
        ("op/list/one", "6f702f6c697374", "op/list/", "12,13,12"),
        ("op/\xff", "", "op/\xff\xff", "7"),
        ("a", "6C", "", "18446744073709551615,18446744073709551616"),
        ("ab", "61", "a\xff", "1,,2"), ("", "6", "\xff", "x,3"),
        ("n" * 512, "ff" * 512, "n" * 512, "0,00,1"),
        ("x", "61" * 513, "xy", "")]:
    put("mysql", fields("dlock_locks", name, cursor, prefix, kills))

# --- sqlite: CURSOR \0 PREFIX \0 NAME (fuzz_sqlite.c) ---
for cursor, prefix, name in [
        ("", "op/", "op/list/one"), ("6f70", "op/\xff", "op/\xff\x01"),
        ("6F70", "\xff\xff", "\xff\xff\xff"), ("abc", "", "x"),
        ("00", "a\xff", "b"), ("ff" * 2048, "a", "a"),
        ("ff" * 2049, "\x01", "\x00"), ("g0", "zz", "z{")]:
    put("sqlite", fields(cursor, prefix, name))
