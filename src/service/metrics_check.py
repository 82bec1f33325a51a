#!/usr/bin/env python3
"""Asks a Prometheus that scrapes one `flatkv serve` (job "flatkv") for every series that
docs/service.md's metric table names, through Prometheus's HTTP API (/api/v1/query), and checks
that each is present with the documented labels and a sane value; that every flatkv_* series the
daemon exports is documented; and that the example alerting rules loaded and evaluate.
Run by src/service/metrics_test.sh prometheus:
  metrics_check.py http://127.0.0.1:PORT docs/service.md docs/examples/flatkv-alerts.yml"""
import json
import math
import re
import sys
import time
import urllib.parse
import urllib.request

base, doc, rules_file = sys.argv[1:4]


def get(path, **params):
    url = base + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]


def query(q):
    return get("/api/v1/query", query=q)["result"]


def wait_for(what, fn, seconds=60):
    deadline = time.time() + seconds
    last = None
    while time.time() < deadline:
        try:
            last = fn()
            if last:
                return last
        except (OSError, AssertionError, KeyError, ValueError) as e:
            last = e
        time.sleep(0.25)
    sys.exit(f"FAIL: {what} after {seconds}s (last: {last})")


# Prometheus is up and has scraped the daemon twice (so rate() has two points).
wait_for("Prometheus ready", lambda: urllib.request.urlopen(base + "/-/ready", timeout=2).status == 200)
wait_for("a scrape of the daemon", lambda: [r for r in query('up{job="flatkv"}') if r["value"][1] == "1"])
wait_for("two scrapes", lambda: query('count_over_time(up{job="flatkv"}[1m]) >= 2'))

# The documented series: the first column's `names` ({a,b} expanded), the second its labels.
documented = {}
for line in open(doc, encoding="utf-8"):
    cells = [c.strip() for c in line.split("|")]
    if len(cells) < 4 or not cells[1].startswith("`flatkv_"):
        continue
    labels = {l.strip() for l in cells[2].split(",") if l.strip()}
    for name in re.findall(r"`(flatkv_[^`]+)`", cells[1]):
        m = re.match(r"(.*)\{([^}]*)\}(.*)", name)
        for n in ([m.group(1) + x + m.group(3) for x in m.group(2).split(",")] if m else [name]):
            documented[n] = labels
assert len(documented) >= 20, f"parsed only {sorted(documented)} from {doc}"

problems = []
for name, labels in sorted(documented.items()):
    histogram = name.endswith("_seconds")
    series = query(f'{name}_count{{job="flatkv"}}' if histogram else f'{name}{{job="flatkv"}}')
    if not series:
        problems.append(f"{name}: no series in Prometheus")
        continue
    for s in series:
        v = float(s["value"][1])
        if not math.isfinite(v) or v < 0:
            problems.append(f"{name}{s['metric']}: value {v}")
        missing = labels - set(s["metric"])
        if missing:
            problems.append(f"{name}{s['metric']}: lacks documented labels {sorted(missing)}")
        if "tenant" in s["metric"] and s["metric"]["tenant"] not in ("0", "1"):
            problems.append(f"{name}: tenant label {s['metric']['tenant']!r} is not an index (tenant_labels is off)")
    if histogram and not query(f'{name}_bucket{{job="flatkv",le="+Inf"}}'):
        problems.append(f"{name}: no _bucket series")

exported = {r["metric"]["__name__"] for r in query('group by (__name__) ({job="flatkv",__name__=~"flatkv_.*"})')}
exported = {re.sub(r"_(bucket|sum|count)$", "", n) if n.endswith(("_bucket", "_sum", "_count")) else n for n in exported}
for n in sorted(exported - set(documented)):
    problems.append(f"{n}: exported but not in {doc}'s metric table")


def one(q):
    r = query(q)
    return float(r[0]["value"][1]) if r else None


# Values the test's daemon must show (metrics_test.sh: 16 MiB DRAM, tenant 1's quota 1 GiB,
# one connection made by `flatkv stats`).
expect = {
    'flatkv_capacity_bytes{medium="dram"}': lambda v: v == 16 << 20,
    'flatkv_capacity_bytes{medium="ssd"}': lambda v: v >= 64 << 20,
    'flatkv_tenant_quota_bytes{tenant="1"}': lambda v: v == 1 << 30,
    'flatkv_tenant_quota_bytes{tenant="0"}': lambda v: v == 0,
    'flatkv_server_events_total{event="connection"}': lambda v: v >= 1,
    'flatkv_server_events_total{event="auth_failure"}': lambda v: v == 0,
    'flatkv_connections': lambda v: 0 <= v <= 1,
    'sum(flatkv_used_bytes) <= sum(flatkv_capacity_bytes)': lambda v: v is not None,
}
for q, ok in expect.items():
    v = one(q)
    if v is None or not ok(v):
        problems.append(f"{q} = {v}")

# The example rules: loaded from the file, every one evaluated without error, none firing.
def rules_evaluated():
    groups = get("/api/v1/rules")["groups"]
    rs = [r for g in groups for r in g["rules"]]
    return rs if rs and all(r["health"] == "ok" for r in rs) else None


rules = wait_for("the example rules to evaluate", rules_evaluated, 30)
want = len(re.findall(r"^\s*- alert:", open(rules_file, encoding="utf-8").read(), re.M))
if len(rules) != want:
    problems.append(f"{len(rules)} rules loaded, {rules_file} has {want}")
for r in rules:
    if r.get("state") == "firing":
        problems.append(f"alert {r['name']} fires on an idle, healthy daemon")

if problems:
    sys.exit("FAIL:\n  " + "\n  ".join(problems))
print(f"prometheus: {len(documented)} documented series present and sane, {len(rules)} rules evaluate")
