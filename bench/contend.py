#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""contend.py TSV BENCHMARKS_MD [--plot OUT_DIR] -- the contention section
of benchmarks.md from the rows dlock_bench_contend printed (bench/run.sh
gathers them in TSV while each store's server runs), printed as markdown;
with --plot, OUT_DIR/bench-contend.svg (gnuplot) instead, drawn from the
contention tables of BENCHMARKS_MD (TSV is not read then): hand-off p50 by
the number of contenders, one line per implementation, log scales.

contend.py TSV --pick STORE N -- STORE's rows at N contenders, dlock's
beside the peers' (critical sections/s and the longest wait: dlock's
default mode against the best peer), as a paragraph and a table for that
store's own subsection (bench/run.sh: Redis over TLS, dlock beside
redis-py).

A row's label is "STORE|IMPLEMENTATION|FLOOR": FLOOR names the cycle floor
of BENCHMARKS_MD (bench/plot.py's labels: the bare client's uncontended
acquire + release on that store, measured earlier in the same run) that
the hand-off is compared with, or "row:IMPLEMENTATION" for another row of
the same store (the file store's kernel lock). Failed rows ("fail" lines)
say why they were not measured.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot  # noqa: E402

FIELDS = ["label", "n", "reps", "holds", "cs", "util", "p50", "p99",
          "other", "other_p50", "wait_p99", "wait_max", "overlaps", "load",
          "p50_min", "p50_max", "cs_min", "cs_max"]


INTRO = """## Contention: N processes, one lock, 1 ms holds

![Hand-off under contention by the number of contenders](bench-contend.svg)

`bench/bench_contend.c` starts N processes on one lock name, each with its
own client: dlock's workers use the public API; the peers' workers
(`bench/peer_py.py contend`, `bench/redlock_peer.js --contend`) run the
same loop with their library. For 1 s (`--quick`: 0.3 s) each process
loops: a blocking acquire, a 1 ms hold (a sleep), release, and at once the
next acquire, so the process that just released competes again; locks
that let it barge in show a small share of hand-offs "to another process"
and long waits. Every time is the monotonic clock, read by each process
and merged afterwards. At 8 contenders a figure is the median of three
runs (by hand-off p50) with the spread of the three; at 2 and 64, one run
(64 Python or node processes take seconds to start).

- **hand-off**: from a holder's release call to the next holder's acquire
  returning (the next holder may be the same process);
  **p50 ÷ floor**: the hand-off beside the store's cycle floor measured
  above (a bare client's uncontended acquire + release: the two requests
  a hand-off needs at least; for the file store, the kernel's own
  blocking lock under the same load);
- **to another process**: the share of hand-offs that went to another
  process, and their p50;
- **critical sections/s** and **utilisation**: the share of the run's
  time the lock was held (1.00 would be a lock that costs nothing; with
  1 ms holds a hand-off of 1 ms halves it);
- **wait**: acquire call to return, the p99 and the longest (a process
  that got nothing in the run waited from its call to its first hold
  after the end);
- **store requests per critical section**: what the server received
  during the run (`bench/load.sh`: Redis commands, the ones scripts ran
  included; ZooKeeper packets; etcd gRPC messages; PostgreSQL
  transactions; MariaDB statements) divided by the holds: what waiting
  costs the store, a peer's polling included; "—" for the file store and
  SQLite, which have no server to count: their waiters sleep in the
  kernel, and SQLite's statements run inside each process.

Reading them: a default (non-fair) mode that only wakes waiters lets the
process that just released take the lock again before a woken waiter can
(a small share "to another process", the longest waits near the run's
length), and on Redlock it wakes every waiter of a release, so the
requests per critical section grow with the contenders; the fair modes,
Redis in both modes (a release hands the lock to the oldest waiter),
ZooKeeper and etcd (always first come first served), and SQLite and
MariaDB in both modes (a release wakes the oldest waiter, queued in the
kernel or in the server's queue for the name's gate, and the releaser
cannot take the lock back past it) give the lock to the next in line at
a cost that stays flat. Pollers (redis-py, node-redlock) cost little per
critical section but leave waiters to their next try.
"""


def read_rows(path):
    rows, fails = [], []
    with open(path, encoding="utf-8") as f:
        for line in f:
            w = line.rstrip("\n").split("\t")
            if w[0] == "contend" and len(w) == len(FIELDS) + 1:
                r = dict(zip(FIELDS, w[1:]))
                for k in FIELDS[1:]:
                    r[k] = float(r[k])
                rows.append(r)
            elif w[0] == "fail" and len(w) >= 4:
                fails.append((w[1], int(w[2]), w[3]))
    return rows, fails


def split(label):
    store, impl, floor = (label.split("|") + ["", ""])[:3]
    return store, impl, floor


def spread(v, lo, hi, reps, fmt):
    s = fmt % v
    return s + (" (%s–%s)" % (fmt % lo, fmt % hi) if reps > 1 else "")


def table(rows, fails, floors):
    stores, by = [], {}
    for r in rows:
        store, impl, floor = split(r["label"])
        if store not in by:
            stores.append(store)
            by[store] = []
        by[store].append((impl, floor, r))
    for label, n, why in fails:
        store, impl, floor = split(label)
        if store not in by:
            stores.append(store)
            by[store] = []
        by[store].append((impl, floor, {"fail": why, "n": n}))
    out = []
    for store in stores:
        out.append("### %s\n" % store)
        out.append("| implementation | contenders | hand-off p50, µs "
                   "| hand-off p99, µs | p50 ÷ floor | to another process: "
                   "share, p50 µs | critical sections/s | utilisation "
                   "| wait p99 / longest, ms | store requests per critical "
                   "section |")
        out.append("|---|---|---|---|---|---|---|---|---|---|")
        for impl, floor, r in by[store]:
            if "fail" in r:
                out.append("| %s | %d | not measured: %s | | | | | | | |"
                           % (impl, r["n"], r["fail"]))
                continue
            if r["p50"] < 0:
                out.append("| %s | %d | none: %d holds in the whole run | "
                           "| | | %.1f | | | %s |" % (
                               impl, r["n"], r["holds"], r["cs"],
                               "%.1f" % r["load"] if r["load"] >= 0 else "—"))
                continue
            if floor.startswith("row:"):  # that row, as many contenders
                fl = next((r2["p50"] for i2, _, r2 in by[store]
                           if i2 == floor[4:] and "fail" not in r2
                           and r2["n"] == r["n"]), None)
            else:
                fl = floors.get(floor)
            ratio = "%.2fx" % (r["p50"] / fl) if fl else ""
            reps = int(r["reps"])
            other = ("%.0f%%, %.0f" % (100 * r["other"], r["other_p50"])
                     if r["other_p50"] >= 0 else "0%")
            load = "%.1f" % r["load"] if r["load"] >= 0 else "—"
            out.append("| %s | %d | %s | %.0f | %s | %s | %s | %.2f | "
                       "%.1f / %.1f | %s |" % (
                           impl, r["n"],
                           spread(r["p50"], r["p50_min"], r["p50_max"], reps,
                                  "%.0f"),
                           r["p99"], ratio, other,
                           spread(r["cs"], r["cs_min"], r["cs_max"], reps,
                                  "%.0f"),
                           r["util"], r["wait_p99"] / 1e3,
                           r["wait_max"] / 1e3, load))
        out.append("")
    return "\n".join(out)


def doc_rows(text):
    """The contention rows of a benchmarks.md: (store, implementation,
    contenders, hand-off p50 or None), so that the chart can be drawn
    again from the document alone."""
    out = []
    part = text.split("\n## Contention", 1)
    if len(part) < 2:
        return out
    for block in part[1].split("\n## ", 1)[0].split("\n### ")[1:]:
        store, _, rest = block.partition("\n")
        for line in rest.splitlines():
            if not line.startswith("|") or line.startswith("|---"):
                continue
            c = [x.strip() for x in line.strip().strip("|").split("|")]
            if len(c) < 3 or not c[1].isdigit():
                continue
            out.append((store.strip(), c[0], int(c[1]), plot.num(c[2])
                        if c[2][:1].isdigit() else None))
    return out


COLORS = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a",
          "#00838f", "#5d4037", "#ad1457", "#9e9d24", "#37474f"]


def chart(rows, outdir):
    impls = []
    for store, impl, _, p50 in rows:
        if p50 is not None and (store, impl) not in impls:
            impls.append((store, impl))
    data = os.path.join(outdir, "bench-contend.dat")
    with open(data, "w", encoding="utf-8") as f:
        for i, (store, impl) in enumerate(impls):
            if i:
                f.write("\n\n")
            for st, im, n, p50 in rows:
                if (st, im) == (store, impl) and p50 is not None:
                    f.write("%d %g\n" % (n, max(p50, 0.1)))
    # ten colours, then the same with dashes; a point type per line
    plots = ", \\\n     ".join(
        "'%s' index %d using 1:2 with linespoints lw 1.5 lc rgb '%s' dt %d "
        "pt %d ps 0.7 title '%s: %s'"
        % (data, i, COLORS[i % 10], 1 + i // 10, 1 + i % 13, store,
           impl.replace("'", "''")) for i, (store, impl) in enumerate(impls))
    plot.gnuplot("""
set terminal svg size 1100,640 dynamic noenhanced font 'sans,10' background '#ffffff'
set output '%s'
set title 'Hand-off under contention, p50 (µs, log scale): N processes, one lock, 1 ms holds'
set logscale xy
set xtics (2, 8, 64)
set xrange [1.6:80]
set xlabel 'contenders'
set grid
set key outside right top font 'sans,9' samplen 2
plot %s
""" % (os.path.join(outdir, "bench-contend.svg"), plots))
    os.remove(data)


def pick(rows, fails, store, n):
    """STORE's rows at n contenders: dlock's beside the peers'."""
    mine = [(split(r["label"])[1], r) for r in rows
            if split(r["label"])[0] == store and int(r["n"]) == n]
    failed = [(split(label)[1], why) for label, k, why in fails
              if split(label)[0] == store and k == n]
    names = sorted({impl.split(",")[0] for impl, _ in mine + failed
                    if not impl.startswith("dlock")})
    peer = " / ".join(names) or "peer"
    out = ["**Contention, %d processes** (the Contention section's \"%s\" "
           "rows: one lock, 1 ms holds%s): dlock's default mode beside the "
           "best %s figure of its variants; the target: dlock ahead in "
           "critical sections per second and in the longest wait.\n" % (
               n, store, "; the median of three runs" if any(
                   r["reps"] > 1 for _, r in mine) else "", peer)]
    out.append("| implementation | critical sections/s | longest wait, ms "
               "| hand-off p50, µs |")
    out.append("|---|---|---|---|")
    for impl, r in mine:
        out.append("| %s | %s | %.1f | %s |" % (
            impl, spread(r["cs"], r["cs_min"], r["cs_max"], int(r["reps"]),
                         "%.0f"),
            r["wait_max"] / 1e3, "%.0f" % r["p50"] if r["p50"] >= 0
            else "none"))
    for impl, why in failed:
        out.append("| %s | not measured: %s | | |" % (impl, why))
    dl = next((r for impl, r in mine if impl == "dlock"), None)
    peers = [r for impl, r in mine if not impl.startswith("dlock")]
    if dl and peers:
        cs = max(r["cs"] for r in peers)
        wait = min(r["wait_max"] for r in peers)
        out.append("| **dlock ÷ the best %s** | **%.2fx** (target > "
                   "1x) | **%.2fx** (target < 1x) | |" % (peer,
                       dl["cs"] / cs if cs > 0 else 0,
                       dl["wait_max"] / wait if wait > 0 else 0))
    out.append("")
    return "\n".join(out)


def main():
    args = sys.argv[1:]
    if len(args) == 4 and args[1] == "--pick":
        rows, fails = read_rows(args[0])
        print(pick(rows, fails, args[2], int(args[3])))
        return 0
    line = plot.command_line(__doc__, "--plot", 2)
    if line is None:
        return 2
    args, outdir, text = line
    if outdir:  # from the document's own tables
        rows = doc_rows(text)
        if not any(r[3] is not None for r in rows):
            print("contend: nothing to draw", file=sys.stderr)
            return 1
        chart(rows, outdir)
        return 0
    rows, fails = read_rows(args[0])
    sec = plot.sections(text)
    floors = {label: floor for label, floor, _, _ in plot.cycles(sec)}
    overlaps = sum(r["overlaps"] for r in rows)
    print(INTRO)
    print(table(rows, fails, floors))
    print("Overlapping holds (a hold that began before the previous one's "
          "release call) in all these runs: **%d**.\n" % overlaps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
