#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
#
# test_monitoring_docs.sh -- the monitoring files in docs/ are right:
#
#   bash test_monitoring_docs.sh /path/to/docs
#
#   - docs/alerts.yml passes `promtool check rules`, and
#     `promtool test rules docs/alerts_test.yml` (series fed to every
#     rule, each alert expected to fire, or not yet, at given times);
#     every alert of the file is expected to fire at least once there;
#   - docs/grafana-dlock.json is valid JSON with a Grafana dashboard's
#     shape (unique panel ids, a datasource and a query on every panel),
#     and every PromQL expression in it parses (promtool, as recording
#     rules, with Grafana's variables replaced);
#   - the alerts and the dashboard name only metric families that exist:
#     the exporter's (src/cli/exporter_metrics.c) and the library's
#     (dlock_metrics_text(), docs/monitoring.md).
# Exit: 0 passed, 1 a failure, 77 promtool or python3 missing.

set -u

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
    echo "usage: bash $0 /path/to/docs" >&2
    exit 2
fi
DOCS=$1
for tool in promtool python3; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "SKIP: $tool is not in PATH (scripts/install-deps.sh test:" \
            "the prometheus package ships promtool)"
        exit 77
    fi
done

FAILS=0
PASSES=0
TMP=$(mktemp -d "${TMPDIR:-/tmp}/dlock-mondocs-XXXXXX") || exit 1
trap 'rm -rf "$TMP"' EXIT

# shellcheck source-path=SCRIPTDIR source=report_lib.sh
. "$(dirname "$0")/report_lib.sh"

# promtool reads files relative to the rule test file: run from docs/
# (each promtool call is bounded: it evaluates a few hundred samples)
if (cd "$DOCS" && timeout 60 promtool check rules alerts.yml) >"$TMP/check.out" 2>&1; then
    pass "promtool check rules docs/alerts.yml: $(grep -o '[0-9]* rules found' "$TMP/check.out")"
else
    fail "promtool check rules docs/alerts.yml"
    sed 's/^/  | /' "$TMP/check.out" >&2
fi
if (cd "$DOCS" && timeout 60 promtool test rules alerts_test.yml) >"$TMP/test.out" 2>&1; then
    pass "promtool test rules docs/alerts_test.yml: every expected alert fires, and none early"
else
    fail "promtool test rules docs/alerts_test.yml"
    sed 's/^/  | /' "$TMP/test.out" | head -n 60 >&2
fi

# the metric families that exist
FAMILIES="dlock_lock_held dlock_lock_lease_seconds dlock_lock_hold_age_seconds
dlock_lock_waiters dlock_lock_holders dlock_lock_token dlock_exporter_up
dlock_exporter_scrape_duration_seconds dlock_exporter_locks
dlock_exporter_scrape_errors_total dlock_acquired_total dlock_busy_total
dlock_waited_total dlock_released_total dlock_lost_total dlock_renewed_total
dlock_renew_failed_total dlock_long_holds_total dlock_store_errors_total
dlock_wait_seconds dlock_hold_seconds dlock_handoff_seconds
dlock_store_op_seconds dlock_holds dlock_waiters"

if python3 - "$DOCS" "$TMP" "$FAMILIES" >"$TMP/py.out" 2>&1 <<'EOF'; then
import json, os, re, sys
docs, tmp, families = sys.argv[1], sys.argv[2], set(sys.argv[3].split())
hist = {f for f in families if f.endswith("_seconds") and not
        f.startswith(("dlock_lock_", "dlock_exporter_"))}

def names_in(expr):
    out = set()
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    for m in re.finditer(r"\bdlock_[a-z_]+", expr):
        n = m.group(0)
        for suf in ("_bucket", "_sum", "_count"):
            if n.endswith(suf) and n[: -len(suf)] in hist:
                n = n[: -len(suf)]
        out.add(n)
    return out

# the alerts: every family exists; every alert is expected somewhere
rules = re.sub(r"(?m)^\s*#.*$", "", open(os.path.join(docs, "alerts.yml")).read())
alerts = re.findall(r"^\s*- alert: (\w+)$", rules, re.M)
for n in names_in(rules):
    assert n in families, ("alerts.yml names an unknown family", n)
tests = open(os.path.join(docs, "alerts_test.yml")).read()
for a in alerts:
    blocks = re.findall(r"alertname: %s\n\s+exp_alerts:\n\s+- exp_labels" % a, tests)
    assert blocks, ("no test expects alert %s to fire" % a)
print("alerts.yml: %d alerts, each expected to fire in alerts_test.yml" % len(alerts))

# the dashboard
d = json.load(open(os.path.join(docs, "grafana-dlock.json")))
assert d["title"] and d["uid"] and isinstance(d["panels"], list)
ids = [p["id"] for p in d["panels"]]
assert len(ids) == len(set(ids)), ("panel ids repeat", ids)
exprs = []
for p in d["panels"]:
    g = p["gridPos"]
    assert 0 <= g["x"] and g["x"] + g["w"] <= 24, ("panel out of the grid", p["title"])
    if p["type"] == "row":
        continue
    assert p.get("datasource") and p.get("targets"), ("panel without query", p["title"])
    for t in p["targets"]:
        exprs.append((p["title"], t["expr"]))
for v in d["templating"]["list"]:
    if v["type"] == "query":
        exprs.append(("variable " + v["name"], v["definition"]))
for title, e in exprs:
    for n in names_in(e):
        assert n in families, ("dashboard panel %r names an unknown family" % title, n)
# every expression as a recording rule, Grafana's variables replaced
with open(os.path.join(tmp, "dash_rules.yml"), "w") as f:
    f.write("groups:\n  - name: dashboard\n    rules:\n")
    for i, (title, e) in enumerate(exprs):
        if e.startswith("label_values("):  # Grafana's own function
            m = re.fullmatch(r"label_values\((.*), *\w+\)", e)
            assert m, e
            e = m.group(1)
        e = e.replace("$__rate_interval", "5m").replace("$store", ".*") \
             .replace("$lock", ".*")
        f.write("      - record: dashboard:expr_%d\n        expr: %s\n"
                % (i, json.dumps(e)))
print("grafana-dlock.json: %d panels, %d queries" % (len(ids), len(exprs)))
EOF
    pass "$(paste -sd ';' "$TMP/py.out")"
else
    fail "the alert rules or the dashboard: $(tail -n 1 "$TMP/py.out")"
fi
if [ -s "$TMP/dash_rules.yml" ]; then
    if timeout 60 promtool check rules "$TMP/dash_rules.yml" >"$TMP/dash.out" 2>&1; then
        pass "every PromQL query of the dashboard parses (promtool)"
    else
        fail "a dashboard query does not parse"
        sed 's/^/  | /' "$TMP/dash.out" >&2
    fi
fi

echo "$PASSES passed, $FAILS failed"
[ "$FAILS" -eq 0 ]
