#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""check.py BENCHMARKS_MD -- CI's check of a bench run's document (`make
bench-quick` runs `bench/run.sh --quick`, then this): that it parses, not
how fast anything was. It fails (exit 1, one line per problem) when

  - a store section that should have been measured is missing or says
    "Not measured" (every store's server is installed by
    scripts/install-deps.sh bench, so a skip means something broke);
  - a store's headline figures (uncontended cycle: floor and dlock; the
    two-process hand-off) do not parse as positive numbers;
  - the contention section lacks a dlock row for a store, a dlock row has
    no hand-off figure, or any run saw overlapping holds;
  - a store with shared holds has no "Shared holds and semaphores"
    figures (its uncontended shared cycle's ratio), or no "Several locks
    at once" figures (dlock_acquire_all() over 2 and 8 names, each with
    its ratio to as many plain acquires);
  - the Redis section lacks the operator's figures: dlock_list()'s first
    page and the exporter's scrape, each with its ratio to its target
    (issue 20);
  - the Redis section lacks the Sentinel figures: the cycle through the
    sentinels beside the primary, and the cost of min_replicas' WAIT
    (issue 21);
  - the Redis section lacks the Cluster figures: the cycle through the
    cluster beside the primary that owns the lock's slot, and the cost of
    min_replicas' WAIT;
  - the Redis section lacks the TLS figures (unless this build has no
    TLS: dlock_bench_tls not built): the cycle over rediss:// beside the
    TLS floor (dlock's own commands, replayed by the bench over one TLS
    connection), `dlock run` beside `redis-cli --tls PING`,
    redis-py's cycle over TLS, and the contention rows over TLS (dlock's
    beside redis-py's, at 8 processes);
  - the file store's CLI section lacks its targets' figures beside
    flock(1): `dlock run`'s start-up, `dlock --version` and the peak RSS,
    each a ratio with its target (issue 35);
  - a store lacks its "Leader election" figures: the hand-over beside
    the plain lock's, and where the store has observers, how long after
    a campaign an observer is told (issue 36);
  - a chart named by the document was not drawn (with --charts DIR).
"""
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import plot  # noqa: E402

STORES = ["Redis", "File store", "Redlock", "ZooKeeper", "etcd", "SQLite",
          "PostgreSQL", "MySQL / MariaDB"]
# stores with shared holds (docs/locks.md): their bench_rw subsection
RW_STORES = ["Redis", "File store", "PostgreSQL", "ZooKeeper", "etcd",
             "SQLite", "MySQL / MariaDB"]
# the stores whose elections have observers (docs/locks.md)
OBSERVED = ["Redis", "File store", "PostgreSQL", "ZooKeeper", "etcd", "SQLite"]
CONTENTION = ["Redis", "File store", "Redlock, 5 nodes", "ZooKeeper",
              "etcd", "SQLite", "PostgreSQL", "MySQL / MariaDB"]


def subsection(text, title):
    """The body of the "### TITLE..." subsection of text ("" if none)."""
    body = text.split("\n### " + title, 1)
    return body[1].split("\n### ", 1)[0] if len(body) == 2 else ""


def main():
    line = plot.command_line(__doc__, "--charts", 1)
    if line is None:
        return 2
    args, charts, text = line
    bad = []
    sec = plot.sections(text)
    for s in STORES:
        body = text.split("\n## " + s, 1)
        if len(body) < 2:
            bad.append("no section for %s" % s)
        elif "Not measured" in body[1].split("\n## ", 1)[0].split("\n###")[0]:
            bad.append("%s was not measured" % s)
    for s in RW_STORES:
        body = text.split("\n## " + s, 1)
        own = body[1].split("\n## ", 1)[0] if len(body) == 2 else ""
        rw = own.split("\n### Shared holds and semaphores", 1)
        if len(rw) < 2 or not re.search(
                r"\| shared beside exclusive: uncontended[^\n]*\*\*[0-9.]+x\*\*",
                rw[1]):
            bad.append("no shared-hold figures for %s" % s)
        sets = own.split("\n### Several locks at once", 1)
        if len(sets) < 2 or len(re.findall(
                r"\n\| [28] \|[^\n]*\*\*[0-9.]+x\*\*", sets[1])) < 2:
            bad.append("no several-locks figures for %s" % s)
        el = own.split("\n### Leader election", 1)
        if len(el) < 2 or not re.search(
                r"\| hand-over between two processes[^\n]*\*\*[0-9.]+x\*\*",
                el[1]):
            bad.append("no leader-election figures for %s" % s)
        elif s in OBSERVED and not re.search(
                r"\| an observer told of the new leader[^\n]*\*\*[0-9.]+x"
                r"\*\*", el[1]):
            bad.append("no observer figure for %s" % s)
    redis = text.split("\n## Redis", 1)
    redis = redis[1].split("\n## ", 1)[0] if len(redis) == 2 else ""
    if not re.search(r"\n### Listing [0-9]+ locks[^\n]*\n(?:[^\n]*\n)*?\|"
                     r" [0-9]+ \| [0-9.]+ / [0-9.]+ ms \| \*\*[0-9.]+x\*\*",
                     redis):
        bad.append("no dlock_list() first-page figure in the Redis section")
    if len(re.findall(r"\| exporter scrape of [0-9]+ locks \([a-z]+,[^|]*\|"
                      r" median [0-9.]+ ms \| max [0-9.]+ ms \| [0-9.]+ of "
                      r"the 1 s target \|", redis)) < 2:
        bad.append("no exporter scrape figures (Redis and file) in the "
                   "Redis section")
    # each subsection's rows in its own text (both have a min_replicas row)
    sentinel = subsection(redis, "Redis Sentinel (")
    if not re.search(r"\| through the sentinels \| [0-9.]+ \| \*\*[0-9.]+x\*\*",
                     sentinel):
        bad.append("no Sentinel cycle figure in the Redis section")
    if len(re.findall(r"\| with `min_replicas=[12]` \(WAIT\) \| [0-9.]+ \| "
                      r"[0-9.]+x", sentinel)) < 2:
        bad.append("no min_replicas (WAIT) figures in the Redis section")
    cluster = subsection(redis, "Redis Cluster (")
    if not re.search(r"\| through the cluster \| [0-9.]+ \| \*\*[0-9.]+x\*\*",
                     cluster):
        bad.append("no Cluster cycle figure in the Redis section")
    if not re.search(r"\| with `min_replicas=1` \(WAIT\) \| [0-9.]+ \| "
                     r"[0-9.]+x", cluster):
        bad.append("no Cluster min_replicas (WAIT) figure in the Redis "
                   "section")
    tls = subsection(redis, "Redis over TLS (")
    contention = list(CONTENTION)
    if not tls:
        bad.append("no Redis over TLS subsection in the Redis section")
    elif "Not measured: dlock_bench_tls was not built" not in tls:
        for what, pat in [
                ("cycle over TLS", r"\| over TLS \(`rediss://`\) \| [0-9.]+ \| "
                 r"[0-9.]+ \| \*\*[0-9.]+x\*\*"),
                ("dlock run over TLS", r"\| `dlock run --store 'rediss://[^|]*"
                 r"\| [0-9.]+ \| [0-9.]+ \| \*\*[0-9.]+x\*\*"),
                ("redis-py cycle over TLS", r"\| p50 \(µs\) \| [0-9.]+ \| "
                 r"[0-9.]+ \| \*\*[0-9.]+x\*\*"),
                ("contention summary over TLS", r"\| \*\*dlock ÷ the best "
                 r"[^|]*\| \*\*[0-9.]+x\*\*[^|]*\| \*\*[0-9.]+x\*\*")]:
            if not re.search(pat, tls):
                bad.append("no %s figure in the Redis over TLS subsection"
                           % what)
        contention.insert(1, "Redis over TLS")
    cyc = {c[0]: c for c in plot.cycles(sec)}
    hand = dict(plot.handoffs(sec))
    for label in ["Redis", "Redlock, 5 nodes", "file", "ZooKeeper", "etcd",
                  "SQLite", "PostgreSQL", "PostgreSQL advisory", "MariaDB"]:
        c = cyc.get(label)
        if not c or not (c[1] > 0 and c[2] > 0):
            bad.append("no uncontended cycle figures for %s" % label)
    for label in ["Redis", "Redlock, 5 nodes", "file", "ZooKeeper", "etcd",
                  "SQLite", "PostgreSQL", "PostgreSQL advisory", "MariaDB"]:
        if not hand.get(label, 0) > 0:
            bad.append("no hand-off figure for %s" % label)

    clit = subsection(text, "The CLI's targets")
    for what, pat in [
            ("start-up", r"\| start-up: `dlock run [^|]*\| \*\*[0-9.]+x\*\* "
             r"\([0-9.]+–[0-9.]+\) \| ≤ [0-9.]+x \| (met|over) \|"),
            ("--version", r"\| `dlock --version` [^|]*\| \*\*[0-9.]+x\*\* "
             r"\([0-9.]+–[0-9.]+\) \| ≤ [0-9.]+x \| (met|over) \|"),
            ("peak RSS", r"\| peak RSS: [^|]*\| \*\*[0-9.]+x\*\* \([0-9]+ ÷ "
             r"[0-9]+ kB\) \| ≤ [0-9.]+x \| (met|over) \|")]:
        if not re.search(pat, clit):
            bad.append("no CLI %s figure beside its target (file store, "
                       "The CLI's targets)" % what)

    cont = text.split("\n## Contention", 1)
    if len(cont) < 2:
        bad.append("no contention section")
    else:
        csec = {}
        for block in cont[1].split("\n### ")[1:]:
            title, _, rest = block.partition("\n")
            csec[title.strip()] = [
                [c.strip() for c in line.strip().strip("|").split("|")]
                for line in rest.splitlines()
                if line.startswith("|") and not line.startswith("|---")][1:]
        for s in contention:
            rows = [r for r in csec.get(s, []) if r and (
                r[0] == "dlock" or r[0].startswith("dlock, table"))]
            if not rows:
                bad.append("no dlock contention row for %s" % s)
            for r in rows:
                if len(r) < 3 or plot.num(r[2]) is None:
                    bad.append("no contention hand-off for %s: %s"
                               % (s, " | ".join(r)[:120]))
        m = re.search(r"in all these runs: \*\*([0-9]+)\*\*", cont[1])
        if not m:
            bad.append("the contention section does not count overlaps")
        elif m.group(1) != "0":
            bad.append("overlapping holds under contention: %s" % m.group(1))
    if charts:
        for svg in ["bench-cycle.svg", "bench-handoff.svg",
                    "bench-contend.svg"]:
            p = os.path.join(charts, svg)
            if not os.path.exists(p) or os.path.getsize(p) < 1000:
                bad.append("chart %s was not drawn" % p)
    for b in bad:
        print("bench check: %s" % b)
    if not bad:
        print("bench check: %s parses: every store measured, %d contention "
              "subsections, no overlaps" % (args[0], len(contention)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
