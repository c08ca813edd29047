#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""peer_py.py KIND ADDRESS FLOOR_US DLOCK_US DLOCK_HANDOFF_US [--quick]
   peer_py.py contend KIND ADDRESS NAME [SLEEP_S]
   peer_py.py dlock-python URI REDIS_PORT [--quick]
   peer_py.py redis-tls PORT,CAFILE DLOCK_TLS_US [--quick]

A Python lock library on the private server of one bench section, measured
the way bench.c measures dlock (see peer_common.py), printed as a markdown
subsection beside dlock's figures of the same run:

  redis  ADDRESS = port     redis-py's redis.lock.Lock (python3-redis), with
                            its default 0.1 s sleep between tries and 1 ms
  kazoo  ADDRESS = host:port  kazoo's Lock recipe (python3-kazoo)
  etcd3  ADDRESS = host:port  python-etcd3's Lock (python3-etcd3, gRPC)

  dlock  ADDRESS = URI      dlock's own Python package (python/), over the
                            libdlock of the build ($DLOCK_LIBRARY)
  redis-tls  ADDRESS = PORT,CAFILE  redis-py's Lock over TLS: `localhost`,
                            the server's TLS port, its certificate checked
                            against CAFILE (chain and name)

`dlock-python`: dlock's Python package beside redis-py on the same Redis
server, in one run (the targets of issue 22: its cycle at most 0.8x
redis-py's), printed as a subsection.
FLOOR_US, DLOCK_US: the section's cycle floor and dlock's cycle p50;
DLOCK_HANDOFF_US: dlock's hand-off p50. `redis-tls`: redis-py's cycle
over TLS beside dlock's over rediss:// (DLOCK_TLS_US, its p50 from
bench_tls.c in the same run), printed as a table for the end of the
"Redis over TLS" subsection. `contend`: one worker of
bench_contend.c on lock NAME (SLEEP_S: redis-py's sleep). Run with Debian's /usr/bin/python3,
the interpreter those packages are installed for.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peer_common import (contend_worker, cycle, cycles_paired,  # noqa: E402
                         handoff)


def redis_lock(port, name, sleep=0.1, ca=None):
    """redis-py's Lock; with ca, over TLS to `localhost` (the bench's
    certificate's name), the chain and the name checked, as dlock's
    rediss:// checks them."""
    import redis

    def new_lock():
        if ca:
            r = redis.Redis(host="localhost", port=int(port), ssl=True,
                            ssl_ca_certs=ca, ssl_check_hostname=True)
        else:
            r = redis.Redis(host="127.0.0.1", port=int(port))
        # connected before it counts as ready (bench_contend.c's protocol):
        # redis-py connects at its first command, and over TLS that costs
        # tens of ms in Python (the context, the CA file, the handshake)
        r.ping()
        lock = r.lock(name, timeout=30, sleep=sleep)
        return (lambda blocking, wait=30: lock.acquire(
            blocking=blocking, blocking_timeout=wait), lock.release)
    return new_lock


def kazoo_lock(hosts, name):
    from kazoo.client import KazooClient

    def new_lock():
        zk = KazooClient(hosts=hosts, timeout=10)
        zk.start(timeout=10)
        lock = zk.Lock("/peer-kazoo/" + name, "peer %d" % os.getpid())
        return (lambda blocking, wait=30: lock.acquire(
            blocking=blocking, timeout=wait if blocking else None),
            lock.release)
    return new_lock


def etcd3_lock(hostport, name):
    import etcd3
    host, port = hostport.rsplit(":", 1)

    def new_lock():
        client = etcd3.client(host=host, port=int(port), timeout=10)
        lock = client.lock("peer-etcd3-" + name, ttl=30)
        return (lambda blocking, wait=30: lock.acquire(
            timeout=wait if blocking else 0), lock.release)
    return new_lock


def dlock_lock(uri, name):
    import dlock

    def new_lock():
        client = dlock.Client(uri, timeout=10)
        lock = client.lock(name, ttl=30)
        lock._keep_client = client  # the client lives as long as the lock
        return (lambda blocking, wait=30: lock.acquire(
            wait if blocking else 0), lock.release)
    return new_lock


def dlock_python(uri, port, quick):
    """dlock-python beside redis-py, on one Redis server, in one run."""
    import redis
    import dlock
    n, hn = (2000, 60) if quick else (20000, 300)
    (d50, d99, dps), (r50, r99, rps), (ratio, q1, q3) = cycles_paired(
        dlock_lock(uri, "py-cycle"), redis_lock(port, "py-cycle-redispy"), n)
    print("### dlock from Python, beside redis-py\n")
    print("dlock's Python package (python/, ctypes over this build's libdlock) "
          "and redis-py %s's `Lock` (Debian's python3-redis), both from "
          "Debian's python3 %d.%d, on the same Redis server in the same "
          "run: %d uncontended cycles each (one try to acquire, then "
          "release), one of each in turn; the ratio is the median of the "
          "per-cycle ratios. Hand-off as for dlock: two processes, the release "
          "2 ms after the other one began to wait, %d hand-offs. Targets "
          "(issue 22): the cycle at most 0.8x redis-py's; contention "
          "below (the Redis rows)." % (redis.__version__,
                                       sys.version_info[0],
                                       sys.version_info[1], n, hn))
    print()
    print("| measure | dlock-python | redis-py | dlock-python ÷ redis-py "
          "| target |")
    print("|---|---|---|---|---|")
    print("| uncontended acquire+release, p50 (us) | %.1f | %.1f | **%.2fx** "
          "(per cycle: quartiles %.2f–%.2f) | ≤ 0.8x |"
          % (d50, r50, ratio, q1, q3))
    print("| the same, p99 (us) | %.1f | %.1f | %.2fx | |"
          % (d99, r99, d99 / r99))
    print("| cycles per second (one client) | %.0f | %.0f | %.2fx | |"
          % (dps, rps, dps / rps))
    h50, h99 = handoff(dlock_lock(uri, "py-handoff"), hn)
    for label, fac in (("default sleep 0.1 s", redis_lock(port, "py-h")),
                       ("sleep 1 ms", redis_lock(port, "py-h", 0.001))):
        p50, p99 = handoff(fac, hn)
        print("| hand-off p50 (p99), redis-py %s (us) | %.1f (%.1f) | "
              "%.1f (%.1f) | %.3fx | |" % (label, h50, h99, p50, p99,
                                          h50 / p50))
    print()
    return 0


def redis_tls(addr, dlock_us, quick):
    """redis-py's cycle over TLS beside dlock's (bench_tls.c's figure)."""
    import redis
    import ssl
    port, ca = addr.split(",", 1)
    n = 2000 if quick else 20000
    p50, p99, per_s = cycle(redis_lock(port, "tls-cycle", ca=ca), n)
    print("**Beside redis-py over TLS**: redis-py %s's `Lock` (Debian's "
          "python3-redis, Debian's python3 %d.%d, %s) with `ssl=True`, "
          "`ssl_ca_certs` the bench's CA and `ssl_check_hostname=True`, on "
          "`localhost` and the same TLS port, in the same run: %d "
          "uncontended cycles (one try to acquire, then release), its p50 "
          "beside dlock's over `rediss://` above. Contention over TLS: the "
          "Contention section's \"Redis over TLS\" rows.\n"
          % (redis.__version__, sys.version_info[0], sys.version_info[1],
             ssl.OPENSSL_VERSION, n))
    print("| uncontended acquire+release over TLS | dlock (`rediss://`, "
          "C) | redis-py (`ssl=True`) | dlock ÷ redis-py |")
    print("|---|---|---|---|")
    print("| p50 (µs) | %.1f | %.1f | **%.2fx** (target < 1x) |"
          % (dlock_us, p50, dlock_us / p50))
    print("| redis-py's p99 (µs), cycles per second | | %.1f, %.0f | |"
          % (p99, per_s))
    print()
    return 0


KINDS = {
    "redis": ("redis-py", "redis", "`redis.lock.Lock` (Debian's "
              "python3-redis): `SET NX PX` to acquire, a Lua "
              "compare-and-delete to release; a waiter sleeps between tries "
              "(`sleep`, 0.1 s by default) and learns of a release only at "
              "its next try"),
    "kazoo": ("kazoo", "kazoo", "its `Lock` recipe (Debian's python3-kazoo): "
              "an ephemeral sequential node, the children listed, a watch on "
              "the predecessor"),
    "etcd3": ("python-etcd3", "etcd3", "its `Lock` (Debian's python3-etcd3, "
              "gRPC): a lease, a transaction that creates the key if absent; "
              "a waiter watches the key"),
}


def main():
    if len(sys.argv) >= 4 and sys.argv[1] == "dlock-python":
        return dlock_python(sys.argv[2], sys.argv[3], "--quick" in sys.argv)
    if len(sys.argv) >= 4 and sys.argv[1] == "redis-tls":
        return redis_tls(sys.argv[2], float(sys.argv[3]),
                         "--quick" in sys.argv[4:])
    if len(sys.argv) >= 5 and sys.argv[1] == "contend":
        kind, addr, name = sys.argv[2:5]
        if kind == "dlock":
            return contend_worker(dlock_lock(addr, name))
        if kind in ("redis", "redis-tls"):
            sleep = float(sys.argv[5]) if len(sys.argv) > 5 else 0.1
            ca = None
            if kind == "redis-tls":
                addr, ca = addr.split(",", 1)
            return contend_worker(redis_lock(addr, name, sleep, ca))
        return contend_worker({"kazoo": kazoo_lock,
                               "etcd3": etcd3_lock}[kind](addr, name))
    if len(sys.argv) < 6 or sys.argv[1] not in KINDS:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    kind, addr = sys.argv[1], sys.argv[2]
    floor, dl, dl_hand = (float(a) for a in sys.argv[3:6])
    quick = "--quick" in sys.argv[6:]
    title, module, how = KINDS[kind]
    mod = __import__(module)
    version = getattr(mod, "__version__", "?")
    if kind == "kazoo":
        from kazoo import version as kv
        version = getattr(kv, "__version__", version)
    make = {"redis": redis_lock, "kazoo": kazoo_lock, "etcd3": etcd3_lock}
    n = {"redis": 20000, "kazoo": 3000, "etcd3": 1000}[kind]
    hn = {"redis": 300, "kazoo": 300, "etcd3": 200}[kind]
    if quick:
        n, hn = n // 10, 60

    p50, p99, per_s = cycle(make[kind](addr, "cycle"), n)
    print("### Beside %s\n" % title)
    print("%s %s on the same server, %s. Uncontended: %d cycles, one try to "
          "acquire then release. Hand-off: as for dlock (two processes, the "
          "release 2 ms after the other one began to wait), %d hand-offs."
          "\n" % (title, version, how, n, hn))
    print("| measure | floor | dlock | %s | %s ÷ floor | dlock ÷ %s |"
          % (title, title, title))
    print("|---|---|---|---|---|---|")
    print("| uncontended acquire+release, p50 | %.1f | %.1f | %.1f | %.2fx "
          "| **%.2fx** |" % (floor, dl, p50, p50 / floor, dl / p50))
    print("| the same, p99 | | | %.1f | | |" % p99)
    print("| cycles per second (one client) | | | %.0f | | |" % per_s)
    variants = [("", make[kind](addr, "handoff"))]
    if kind == "redis":
        variants = [(", default sleep 0.1 s", redis_lock(addr, "handoff")),
                    (", sleep 1 ms", redis_lock(addr, "handoff", 0.001))]
    for name, factory in variants:
        try:
            h50, h99 = handoff(factory, hn)
        except SystemExit as e:
            # python-etcd3 0.12's blocking acquire() fails with Debian 12's
            # tenacity (a TypeError in its retry wait): say so, go on
            print("| hand-off%s | | %.1f | not measured: %s (see the "
                  "bench's output) | | |" % (name, dl_hand, e))
            continue
        print("| hand-off p50 (p99)%s | | %.1f | %.1f (%.1f) | | **%.3fx** |"
              % (name, dl_hand, h50, h99, dl_hand / h50))
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
