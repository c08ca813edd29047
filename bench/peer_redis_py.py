#!/usr/bin/python3
"""peer_redis_py.py PORT FLOOR_US DLOCK_US DLOCK_HANDOFF_US [--quick]

redis-py's lock (redis.lock.Lock, Debian's python3-redis) on the private
redis-server of the Redis section, measured the way bench.c measures dlock:

  - uncontended acquire + release (one try: blocking=False), p50/p99 and
    cycles per second;
  - hand-off between two processes: the time from the holder's release()
    call to the waiting process's acquire() returning, with redis-py's
    default sleep between tries (0.1 s) and with 1 ms.

FLOOR_US, DLOCK_US: the Redis cycle floor's and dlock's p50 from the same
run; DLOCK_HANDOFF_US: dlock's hand-off p50. Prints a markdown section.
Run with Debian's /usr/bin/python3 (the package's interpreter).
"""
import multiprocessing as mp
import sys
import time

import redis


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def cycle(port, n):
    r = redis.Redis(host="127.0.0.1", port=port)
    lock = r.lock("peer-py:cycle", timeout=30)
    for _ in range(200):  # warm-up
        lock.acquire(blocking=False)
        lock.release()
    lat = []
    t_all = time.monotonic_ns()
    for _ in range(n):
        t0 = time.monotonic_ns()
        if not lock.acquire(blocking=False):
            raise SystemExit("redis-py: uncontended acquire failed")
        lock.release()
        lat.append(time.monotonic_ns() - t0)
    per_s = n / ((time.monotonic_ns() - t_all) / 1e9)
    return pct(lat, 0.5) / 1e3, pct(lat, 0.99) / 1e3, per_s


def handoff_proc(me, port, n, sleep, st):
    r = redis.Redis(host="127.0.0.1", port=port)
    lock = r.lock("peer-py:handoff", timeout=30, sleep=sleep,
                  blocking_timeout=30)

    def await_value(v, want):
        until = time.monotonic() + 60
        while v.value != want:
            if time.monotonic() > until:
                raise SystemExit("redis-py hand-off: the other one stalled")
            time.sleep(0.00005)

    if me == 0:
        lock.acquire()
        st["ready"].value = 1
    else:
        await_value(st["ready"], 1)
    for i in range(n):
        if i % 2 == me:
            await_value(st["waiting"][1 - me], i + 1)
            time.sleep(0.002)  # let it reach its wait, as bench.c does
            st["released"].value = time.monotonic_ns()
            lock.release()
            await_value(st["done"], i + 1)  # no barging
        else:
            st["waiting"][me].value = i + 1
            if not lock.acquire():
                raise SystemExit("redis-py hand-off: acquire timed out")
            st["lat"][i] = time.monotonic_ns() - st["released"].value
            st["done"].value = i + 1
    if lock.owned():
        lock.release()


def handoff(port, n, sleep):
    ctx = mp.get_context("fork")
    st = {
        "ready": ctx.Value("i", 0, lock=False),
        "done": ctx.Value("i", 0, lock=False),
        "released": ctx.Value("q", 0, lock=False),
        "waiting": [ctx.Value("i", 0, lock=False) for _ in range(2)],
        "lat": ctx.Array("q", n, lock=False),
    }
    ps = [ctx.Process(target=handoff_proc, args=(i, port, n, sleep, st))
          for i in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
        if p.exitcode != 0:
            raise SystemExit("redis-py hand-off: a process failed")
    lat = list(st["lat"])
    return pct(lat, 0.5) / 1e3, pct(lat, 0.99) / 1e3


def main():
    if len(sys.argv) < 5:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    port = int(sys.argv[1])
    floor, dl, dl_hand = (float(a) for a in sys.argv[2:5])
    quick = "--quick" in sys.argv[5:]
    n = 2000 if quick else 20000
    p50, p99, per_s = cycle(port, n)
    print("### Beside redis-py's lock\n")
    print("redis-py %s (`redis.lock.Lock`, Debian's python3-redis; Python %s) "
          "on the same server: its acquire is a `SET NX PX` and its release "
          "a Lua compare-and-delete, the same two round trips as the floor, "
          "from Python. Uncontended: %d cycles, `acquire(blocking=False)` "
          "then `release()`. Hand-off: as for dlock above (two processes, "
          "2 ms after the other one began to wait), %d hand-offs each; "
          "redis-py's waiter sleeps between tries (`sleep`, 0.1 s by "
          "default) and learns of a release only at its next try.\n"
          % (redis.__version__, sys.version.split()[0], n,
             60 if quick else 300))
    print("| measure | floor | dlock | redis-py | redis-py ÷ floor | "
          "dlock ÷ redis-py |")
    print("|---|---|---|---|---|---|")
    print("| uncontended acquire+release, p50 | %.1f | %.1f | %.1f | %.2fx "
          "| **%.2fx** |" % (floor, dl, p50, p50 / floor, dl / p50))
    print("| the same, p99 | | | %.1f | | |" % p99)
    print("| cycles per second (one client) | | | %.0f | | |" % per_s)
    for sleep, name in ((0.1, "default sleep 0.1 s"), (0.001, "sleep 1 ms")):
        h50, h99 = handoff(port, 60 if quick else 300, sleep)
        print("| hand-off p50 (p99), redis-py %s | | %.1f | %.1f (%.1f) | "
              "| **%.3fx** |" % (name, dl_hand, h50, h99, dl_hand / h50))
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
