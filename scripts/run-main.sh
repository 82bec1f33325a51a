#!/usr/bin/env bash
# Installs dependencies, builds flatkv (Release) and runs its main job: the
# trace replay of a bundled subset of real Claude Code sessions
# (data/traces/claude-code-subset/, 16 sessions) through flat, tiered, files
# and infinite on one h100-node (8x H100, Llama-3.1-70B at TP 4: 2
# continuous-batching instances; data/hw/profiles.toml), at --load auto: the
# capacity load found on `infinite` and 0.5x, 1x and 2x of it, each over 3
# conversation orders.
#
# Capacities: the subset's working set is ~3.7 TiB at 70B (20 MiB a 64-token
# block). DRAM 256 GiB (~7% of it) and SSD 1.5 TiB (~40%) hold neither all of
# it nor only a sliver, so where a block is placed and what is evicted decide
# the hit rate and the restore cost; an 8 TiB SSD would hold everything and
# hide eviction.
#
# Prints the comparison table and one line saying what it shows; extra
# arguments are passed on (e.g. --json: stdout is then the JSON alone, build
# output goes to stderr).
set -euo pipefail
cd "$(dirname "$0")/.."
json=0
for a in "$@"; do [ "$a" = "--json" ] && json=1; done
{
  scripts/install-deps.sh
  cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLATKV_BUILD_TESTS=OFF -DFLATKV_BUILD_BENCH=OFF >/dev/null
  cmake --build build/release --target flatkv
} 1>&2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
build/release/flatkv replay --trace data/traces/claude-code-subset --hw h100-node --model llama-3.1-70b \
  --policy flat,tiered,files,infinite --dram 256GiB --ssd 1536GiB --load auto --orders 3 "$@" > "$out"
if [ "$json" = 1 ]; then
  cat "$out"
  exit 0
fi
cat "$out"
python3 - "$out" <<'PY'
import re, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) > 12 and f[0] in ("flat", "tiered", "files", "infinite"):
        try:
            rows.setdefault(f[0], []).append((float(f[1]), float(f[2]), float(f[10].rstrip("ms"))))
        except ValueError:
            pass
if "flat" in rows and "tiered" in rows:
    hi = max(r[0] for r in rows["flat"])
    get = lambda p: next((r for r in rows.get(p, []) if r[0] == hi), None)
    fl, ti, fi, inf = get("flat"), get("tiered"), get("files"), get("infinite")
    parts = [f"at the highest load ({hi:g}): hit rate flat {fl[1]:.1f}%, tiered {ti[1]:.1f}%"]
    if fi: parts.append(f"files {fi[1]:.1f}%")
    if inf: parts.append(f"infinite {inf[1]:.1f}%")
    print("; ".join(parts) + f"; mean TTFT flat {fl[2]:.0f} ms vs tiered {ti[2]:.0f} ms"
          + (f" and files {fi[2]:.0f} ms" if fi else "") + f" (tiered/flat {ti[2] / max(fl[2], 1e-9):.2f}x).")
PY
