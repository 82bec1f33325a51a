#!/usr/bin/env bash
# Installs dependencies, builds flatkv (Release) and runs its main job: the
# trace replay of a bundled subset of real Claude Code sessions
# (data/traces/claude-code-subset/, 16 sessions) on one h100-node (8x H100,
# Llama-3.1-70B at TP 4: 2 continuous-batching instances;
# data/hw/profiles.toml), every policy at 0.5x, 1x and 2x the capacity load
# found on `infinite` (--load auto): 8 conversation orders at 1x (the
# headline, with per-order paired ratios over flat and their 95% interval),
# 3 at 0.5x and 2x (2x is a stress test).
#
# Policies: flat (the store as built: DRAM hits through its 2 copy threads
# into a host window, then the link), flat-gpu-window (the GPU window:
# built in src/gpu/, not yet measured on a GPU; 1x only), the baselines at their defaults (tiered,
# files) and in their best configurations (tiered-lw, tiered-nopromo,
# tiered-lw-nopromo, files-lw; tiered-best is the lowest mean TTFT of the
# four tiered variants), and the bounds infinite and infinite-lw (the lower
# bound on TTFT). docs/baselines.md cites every mode.
#
# Two capacity settings, two tables:
#   - today's: DRAM 256 GiB (~7% of the 3.7 TiB working set), SSD 1.5 TiB
#     (~41%), where every policy stays within a point of infinite's hit rate;
#   - a binding one, chosen from the sweep this script prints first (one
#     order, 1x: DRAM 32, 64 and 128 GiB x SSD 25% and 50% of the working
#     set; the setting with the largest hit-rate gap between infinite and the
#     worst baseline). The choice is committed below (BINDING_DRAM,
#     BINDING_SSD); the script says so if its sweep picks another.
#
# `--json`: stdout is one JSON object, {"capacity_load", "sweep": [...],
# "settings": [{"name", "dram", "ssd", "results", ...}]}; build output and
# tables go to stderr. Other arguments are passed on to every replay.
set -euo pipefail
cd "$(dirname "$0")/.."
json=0
pass=()
for a in "$@"; do
  if [ "$a" = "--json" ]; then json=1; else pass+=("$a"); fi
done
# The committed binding setting (the sweep of 2026-12-03: docs/benchmarks.md).
BINDING_DRAM=32GiB
BINDING_SSD=944GiB
# 25% and 50% of the subset's working set: 193,385 blocks x 20 MiB = 3,688 GiB.
SWEEP_DRAM=(32GiB 64GiB 128GiB)
SWEEP_SSD=(944GiB 1888GiB)
POLICIES=flat,flat-gpu-window,tiered,tiered-lw,tiered-nopromo,tiered-lw-nopromo,files,files-lw,infinite,infinite-lw
JOBS=${FLATKV_JOBS:-2}
{
  scripts/install-deps.sh debian  # the replay needs no model or Python environment
  cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLATKV_BUILD_TESTS=OFF -DFLATKV_BUILD_BENCH=OFF >/dev/null
  cmake --build build/release --target flatkv
} 1>&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
replay() {
  build/release/flatkv replay --trace data/traces/claude-code-subset --hw h100-node --model llama-3.1-70b \
    --jobs "$JOBS" ${pass[@]+"${pass[@]}"} "$@"
}
out() { if [ "$json" = 1 ]; then cat 1>&2; else cat; fi; }

echo "== Today's configuration: DRAM 256 GiB, SSD 1.5 TiB ==" | out
replay --policy "$POLICIES" --capacity-only flat-gpu-window --dram 256GiB --ssd 1536GiB --load auto \
  --orders 3 --capacity-orders 8 --json-out "$tmp/today.json" | out
cap=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["capacity_load"])' "$tmp/today.json")

echo "== Sweep for the binding setting (1 order, load $cap = 1x) ==" | out
replay --policy infinite --dram 256GiB --ssd 1536GiB --load "$cap" --orders 1 --json-out "$tmp/sweep-inf.json" >/dev/null
for d in "${SWEEP_DRAM[@]}"; do
  for s in "${SWEEP_SSD[@]}"; do
    replay --policy tiered,tiered-nopromo,files --dram "$d" --ssd "$s" --load "$cap" --orders 1 \
      --json-out "$tmp/sweep-$d-$s.json" >/dev/null
  done
done
python3 - "$tmp" "$BINDING_DRAM" "$BINDING_SSD" "${SWEEP_DRAM[*]}" "${SWEEP_SSD[*]}" > "$tmp/sweep.txt" <<'PY'
import json, sys
tmp, bd, bs, drams, ssds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(), sys.argv[5].split()
inf = json.load(open(f"{tmp}/sweep-inf.json"))["results"][0]["hit_rate"]
rows, best = [], None
for d in drams:
    for s in ssds:
        res = json.load(open(f"{tmp}/sweep-{d}-{s}.json"))["results"]
        hits = {r["policy"]: r["hit_rate"] for r in res}
        worst = min(hits, key=hits.get)
        gap = inf - hits[worst]
        rows.append({"dram": d, "ssd": s, "hit_rate": hits, "worst": worst, "gap": gap, "infinite": inf})
        if best is None or gap > best["gap"]:
            best = rows[-1]
print(f"{'dram':>7} {'ssd':>8} {'tiered%':>8} {'nopromo%':>9} {'files%':>7} {'infinite%':>10} {'gap':>6}  worst")
for r in rows:
    h = r["hit_rate"]
    print(f"{r['dram']:>7} {r['ssd']:>8} {100*h['tiered']:8.2f} {100*h['tiered-nopromo']:9.2f} {100*h['files']:7.2f} "
          f"{100*inf:10.2f} {100*r['gap']:6.2f}  {r['worst']}")
print(f"largest gap: DRAM {best['dram']}, SSD {best['ssd']} ({100*best['gap']:.2f} points, {best['worst']});"
      f" committed: DRAM {bd}, SSD {bs}"
      + ("" if (best["dram"], best["ssd"]) == (bd, bs) else "  ** the sweep picks another setting than the committed one **"))
json.dump(rows, open(f"{tmp}/sweep-rows.json", "w"))
PY
out < "$tmp/sweep.txt"

echo "== Binding configuration: DRAM $BINDING_DRAM, SSD $BINDING_SSD ==" | out
replay --policy "$POLICIES" --capacity-only flat-gpu-window --dram "$BINDING_DRAM" --ssd "$BINDING_SSD" \
  --capacity-load "$cap" --orders 3 --capacity-orders 8 --json-out "$tmp/binding.json" | out

python3 - "$tmp" "$BINDING_DRAM" "$BINDING_SSD" "$json" <<'PY'
import json, sys
tmp, bd, bs, as_json = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
today, binding = json.load(open(f"{tmp}/today.json")), json.load(open(f"{tmp}/binding.json"))
cap = today["capacity_load"]
if as_json:
    settings = []
    for name, d, s, j in (("today", "256GiB", "1536GiB", today), ("binding", bd, bs, binding)):
        settings.append({"name": name, "dram": d, "ssd": s, "dram_bytes": j["config"]["dram_bytes"],
                         "ssd_bytes": j["config"]["ssd_bytes"], "config": j["config"], "results": j["results"]})
    print(json.dumps({"capacity_load": cap, "hw": today["hw"], "model": today["model"],
                      "sweep": json.load(open(f"{tmp}/sweep-rows.json")), "settings": settings}, indent=2))
    sys.exit(0)
def line(j, label, load, tag):
    rs = {r["policy"]: r for r in j["results"] if abs(r["load"] - load) < 1e-12}
    fl, tb, lb = rs.get("flat"), rs.get("tiered-best"), rs.get("infinite-lw")
    if not fl or not tb:
        return
    def ci(r):
        if r.get("ratio_vs_flat_ci_low") is None:
            return f"{r['ratio_vs_flat_mean']:.3f}x"
        return f"{r['ratio_vs_flat_mean']:.3f}x [95% CI {r['ratio_vs_flat_ci_low']:.3f}..{r['ratio_vs_flat_ci_high']:.3f}]"
    parts = [f"{label}, {tag} (load {load:.3g}, {fl['orders']} orders): mean TTFT flat {fl['ttft_mean_ms']:.0f} ms",
             f"tiered-best ({tb['best_of']}) {tb['ttft_mean_ms']:.0f} ms, tiered-best/flat {ci(tb)}"]
    for p in ("files-lw", "flat-gpu-window"):
        if p in rs:
            parts.append(f"{p} {rs[p]['ttft_mean_ms']:.0f} ms ({ci(rs[p])} of flat)")
    if lb:
        parts.append(f"bound infinite-lw {lb['ttft_mean_ms']:.0f} ms")
    parts.append(f"hit rate flat {100*fl['hit_rate']:.1f}%, {tb['best_of']} {100*tb['hit_rate']:.1f}%")
    print("; ".join(parts) + ".")
for j, label in ((today, "today's setting"), (binding, f"binding setting (DRAM {bd}, SSD {bs})")):
    line(j, label, cap, "headline at 1x")
    line(j, label, 2 * cap, "stress test at 2x")
PY
