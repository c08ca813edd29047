#!/usr/bin/env python3
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
]

for u in URIS:
    put("uri", u)

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
