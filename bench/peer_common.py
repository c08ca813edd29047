# SPDX-License-Identifier: MIT
"""peer_common.py -- the measuring loops the Python peers share, the same
as bench.c's for dlock:

  cycles_paired(a, b, n) two locks' cycles in strict alternation, with the
                         median of the per-cycle ratios
  cycle(new_lock, n)     uncontended acquire (one try) + release, after a
                         warm-up; p50/p99 in us and cycles per second
  handoff(new_lock, n)   two processes pass one lock back and forth: the
                         time from the holder's release() call to the
                         waiting process's acquire() returning; the holder
                         releases 2 ms after the other one began to wait,
                         and the next round starts once the waiter has it
                         (no barging). p50/p99 in us.

new_lock() is called in each process and returns (acquire, release):
acquire(blocking, wait_s=30) -> bool, release() -> None.
"""
import multiprocessing as mp
import time


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


def cycle(new_lock, n, warmup=200):
    acquire, release = new_lock()
    for _ in range(warmup):
        if acquire(False):
            release()
    lat = []
    t_all = time.monotonic_ns()
    for _ in range(n):
        t0 = time.monotonic_ns()
        if not acquire(False):
            raise SystemExit("peer: an uncontended acquire failed")
        release()
        lat.append(time.monotonic_ns() - t0)
    per_s = n / ((time.monotonic_ns() - t_all) / 1e9)
    return pct(lat, 0.5) / 1e3, pct(lat, 0.99) / 1e3, per_s


def cycles_paired(new_a, new_b, n, warmup=200):
    """cycle() of two locks in strict alternation (one cycle of each, in
    turn), so that a load that comes and goes falls on both alike: each
    one's p50, p99 and cycles per second, and the median of the
    per-cycle ratios a / b with its quartiles."""
    a_acq, a_rel = new_a()
    b_acq, b_rel = new_b()
    for _ in range(warmup):
        if a_acq(False):
            a_rel()
        if b_acq(False):
            b_rel()
    la, lb = [], []
    for _ in range(n):
        for acq, rel, lat in ((a_acq, a_rel, la), (b_acq, b_rel, lb)):
            t0 = time.monotonic_ns()
            if not acq(False):
                raise SystemExit("peer: an uncontended acquire failed")
            rel()
            lat.append(time.monotonic_ns() - t0)
    ratios = [x / y for x, y in zip(la, lb)]
    return ((pct(la, 0.5) / 1e3, pct(la, 0.99) / 1e3, 1e9 / (sum(la) / n)),
            (pct(lb, 0.5) / 1e3, pct(lb, 0.99) / 1e3, 1e9 / (sum(lb) / n)),
            (pct(ratios, 0.5), pct(ratios, 0.25), pct(ratios, 0.75)))


def _await(v, want):
    until = time.monotonic() + 60
    while v.value != want:
        if time.monotonic() > until:
            raise SystemExit("peer hand-off: the other process stalled")
        time.sleep(0.00005)


def _handoff_proc(me, new_lock, n, st):
    acquire, release = new_lock()
    if me == 0:
        if not acquire(True):
            raise SystemExit("peer hand-off: first acquire failed")
        st["ready"].value = 1
    else:
        _await(st["ready"], 1)
    held = me == 0
    for i in range(n):
        if i % 2 == me:
            _await(st["waiting"][1 - me], i + 1)
            time.sleep(0.002)  # let it reach its wait
            st["released"].value = time.monotonic_ns()
            release()
            held = False
            _await(st["done"], i + 1)
        else:
            st["waiting"][me].value = i + 1
            if not acquire(True):
                raise SystemExit("peer hand-off: acquire timed out")
            held = True
            st["lat"][i] = time.monotonic_ns() - st["released"].value
            st["done"].value = i + 1
    if held:
        release()


def handoff(new_lock, n):
    ctx = mp.get_context("fork")
    st = {
        "ready": ctx.Value("i", 0, lock=False),
        "done": ctx.Value("i", 0, lock=False),
        "released": ctx.Value("q", 0, lock=False),
        "waiting": [ctx.Value("i", 0, lock=False) for _ in range(2)],
        "lat": ctx.Array("q", n, lock=False),
    }
    ps = [ctx.Process(target=_handoff_proc, args=(i, new_lock, n, st))
          for i in range(2)]
    for p in ps:
        p.start()
    while any(p.is_alive() for p in ps):
        if any(p.exitcode not in (None, 0) for p in ps):
            for p in ps:  # one failed: the other would wait for it
                p.terminate()
            break
        time.sleep(0.01)
    for p in ps:
        p.join()
    if any(p.exitcode != 0 for p in ps):
        raise SystemExit("peer hand-off: a process failed")
    lat = list(st["lat"])
    return pct(lat, 0.5) / 1e3, pct(lat, 0.99) / 1e3


def contend_worker(new_lock):
    """One worker of bench_contend.c (see its header for the protocol):
    "ready", then the start line, then holds of HOLD_US until STOP."""
    import sys
    acquire, release = new_lock()
    print("ready", flush=True)
    start, stop, hold_us = (int(w) for w in sys.stdin.readline().split())
    holds = []
    now = time.monotonic_ns
    if start > now():
        time.sleep((start - now()) / 1e9)
    while now() < stop:
        call = now()
        if not acquire(True, (stop - call) / 1e9 + 10):
            if now() >= stop:
                break  # gave up after the end: a quiet end
            print("error an acquire timed out", flush=True)
            return 1
        acq = now()
        if acq >= stop:
            release()
            holds.append("e %d %d" % (call, acq))
            break
        time.sleep(hold_us / 1e6)
        rel = now()
        release()
        holds.append("h %d %d %d" % (call, acq, rel))
    holds.append("end")
    print("\n".join(holds), flush=True)
    return 0
