#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""plot.py BENCHMARKS_MD OUT_DIR -- draws the headline figures of a
benchmarks.md (as bench/run.sh writes it) as SVG charts with gnuplot:

  OUT_DIR/bench-cycle.svg    uncontended acquire+release p50 per store:
                             the floor, dlock and the peer where there is
                             one (log scale)
  OUT_DIR/bench-handoff.svg  hand-off p50 per store (log scale)

It reads the tables' cells by their row labels; a store whose row is
missing (a section skipped in that run) is left out with a note on stderr.
Needs gnuplot (Debian: gnuplot-nox). Exit 0 when both charts were drawn.
"""
import os
import re
import subprocess
import sys


def sections(text):
    """{title: [table rows as lists of cells]} for every '## ' section."""
    out, title = {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            title = line[3:].split(" (")[0].strip()
            out[title] = []
        elif title and line.startswith("|") and not line.startswith("|---"):
            out[title].append([c.strip() for c in line.strip("|").split("|")])
    return out


def num(cell):
    """The first number of a cell ('**1.19x** (..)' -> 1.19), or None."""
    m = re.search(r"[0-9]+(?:\.[0-9]+)?", cell.replace("**", ""))
    return float(m.group(0)) if m else None


def row(rows, start):
    for r in rows:
        if r and r[0].startswith(start):
            return r
    return None


def cycles(sec):
    """(label, floor, dlock, peer or None) in microseconds."""
    want = [
        ("Redis", "Redis", "uncontended acquire+release, p50", None),
        # bench_tls.c's row: the bench's own TLS client, dlock on rediss://
        ("Redis", "Redis over TLS", "over TLS (`rediss://`)", None),
        ("Redlock", "Redlock, 5 nodes", "5 servers (`redlock://`", 3),
        ("File store", "file", "uncontended acquire+release, p50", None),
        ("ZooKeeper", "ZooKeeper", "uncontended acquire+release, p50", None),
        ("etcd", "etcd", "uncontended acquire+release, p50", None),
        ("SQLite", "SQLite", "uncontended acquire+release, p50", None),
        ("PostgreSQL", "PostgreSQL", "table mode: uncontended", None),
        ("PostgreSQL", "PostgreSQL advisory", "advisory mode: uncontended",
         None),
        ("MySQL / MariaDB", "MariaDB", "uncontended acquire+release, p50",
         None),
    ]
    out = []
    for title, label, start, peer in want:
        r = row(sec.get(title, []), start)
        if not r or num(r[1]) is None or num(r[2]) is None:
            print("plot: no cycle figures for %s" % label, file=sys.stderr)
            continue
        p = num(r[peer]) if peer is not None and len(r) > peer else None
        out.append((label, num(r[1]), num(r[2]), p))
    return out


def handoffs(sec):
    """(label, dlock hand-off p50 in microseconds)."""
    want = [
        ("Redis", "Redis", "hand-off, release", 2, 1),
        ("Redlock", "Redlock, 5 nodes", "hand-off, `redlock://`", 1, 1),
        ("File store", "file", "hand-off, release", 2, 1),
        ("ZooKeeper", "ZooKeeper", "hand-off, release", 2, 1),
        ("etcd", "etcd", "hand-off, release", 2, 1),
        ("SQLite", "SQLite", "hand-off between processes", 2, 1),
        ("PostgreSQL", "PostgreSQL", "table (the release", 2, 1),
        ("PostgreSQL", "PostgreSQL advisory", "advisory (the server", 2, 1),
        ("MySQL / MariaDB", "MariaDB", "hand-off, release → the waiter", 2,
         1),
    ]
    out = []
    for title, label, start, col, scale in want:
        r = row(sec.get(title, []), start)
        if not r or len(r) <= col or num(r[col]) is None:
            print("plot: no hand-off figure for %s" % label, file=sys.stderr)
            continue
        out.append((label, num(r[col]) * scale))
    return out


def command_line(doc, option, nargs):
    """sys.argv's arguments but `option VALUE`, and VALUE (None without
    it), then the text of the document the first argument names; None,
    after doc's usage line on stderr, unless nargs arguments remain."""
    args = sys.argv[1:]
    value = None
    if option in args:
        i = args.index(option)
        value = args[i + 1]
        del args[i:i + 2]
    if len(args) != nargs:
        print(doc.strip().splitlines()[0], file=sys.stderr)
        return None
    with open(args[nargs - 1], encoding="utf-8") as f:
        return args, value, f.read()


def gnuplot(script):
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def main():
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        sec = sections(f.read())
    outdir = sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    cyc, hand = cycles(sec), handoffs(sec)
    if not cyc or not hand:
        print("plot: nothing to draw", file=sys.stderr)
        return 1

    data = os.path.join(outdir, "bench-cycle.dat")
    with open(data, "w", encoding="utf-8") as f:
        for label, floor, dl, peer in cyc:
            f.write('"%s" %g %g %s\n' % (label, floor, dl,
                                          "%g" % peer if peer else "NaN"))
    gnuplot("""
set terminal svg size 900,420 dynamic font 'sans,11' background '#ffffff'
set output '%s'
set title 'Uncontended acquire + release, p50 (µs, log scale)'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set logscale y
set yrange [1:*]
set grid ytics
set key top left
set xtics rotate by -25 scale 0
set datafile missing 'NaN'
plot '%s' using 2:xtic(1) title 'floor (bare client, same commands)' lc rgb '#9e9e9e', \\
     '' using 3 title 'dlock' lc rgb '#1565c0'%s
""" % (os.path.join(outdir, "bench-cycle.svg"), data,
       ", \\\n     '' using 4 title 'peer (node-redlock)' lc rgb '#ef6c00'"
       if any(c[3] for c in cyc) else ""))
    os.remove(data)

    data = os.path.join(outdir, "bench-handoff.dat")
    with open(data, "w", encoding="utf-8") as f:
        for label, us in hand:
            f.write('"%s" %g\n' % (label, us))
    gnuplot("""
set terminal svg size 900,420 dynamic font 'sans,11' background '#ffffff'
set output '%s'
set title 'Hand-off between two processes, p50 (µs, log scale): release -> the waiter holds it'
set style data histograms
set style fill solid 0.85 border -1
set logscale y
set yrange [10:*]
set grid ytics
set key off
set xtics rotate by -25 scale 0
plot '%s' using 2:xtic(1) lc rgb '#1565c0'
""" % (os.path.join(outdir, "bench-handoff.svg"), data))
    os.remove(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
