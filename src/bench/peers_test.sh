#!/usr/bin/env bash
# The real peers of `flatkv bench restore` and `flatkv bench serve` (ctest label peers,
# src/bench/bench_peers.h): a mooncake_master and a standalone mooncake_client started on
# loopback by the benchmark, the same 16 MiB session put and read back through each peer
# run (DRAM pool over shared memory and over TCP, SSD offload), LMCache's LocalCPUBackend
# and LocalDiskBackend, and flatkv through a `flatkv serve` child; the benchmark compares
# every run's delivered bytes with the session (a mismatch exits 1). Then bench serve's
# Mooncake gets. Every Mooncake process must be gone afterwards.
#
# Needs build/pyenv/peers (scripts/install-deps.sh pyenv:peers) and build/pyenv/vllm for
# LMCache (pyenv:vllm). Without them it skips (77); under CI=true it fails.
set -uo pipefail
FLATKV=${1:?usage: peers_test.sh FLATKV}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "peers_test: FAIL: $*" >&2; exit 1; }
missing() {
  if [ "${CI:-}" = "true" ]; then fail "$1 (CI=true: a missing peer fails)"; fi
  echo "peers_test: skipped: $1" >&2
  exit 77
}
PY=${FLATKV_PEERS_PYTHON:-$ROOT/build/pyenv/peers/bin/python}
[ -x "$PY" ] || missing "$PY not found: run scripts/install-deps.sh pyenv:peers"
"$PY" -c 'import mooncake.store' 2>/dev/null || missing "$PY cannot import mooncake.store: run scripts/install-deps.sh pyenv:peers"
RUNS=daemon_shm_restore,mooncake_dram,mooncake_dram_tcp,mooncake_ssd,ssd_restore
LMC=${FLATKV_LMCACHE_PYTHON:-$ROOT/build/pyenv/vllm/bin/python}
if [ -x "$LMC" ] && "$LMC" -c 'import lmcache' 2>/dev/null; then
  RUNS=$RUNS,lmcache_cpu,lmcache_disk
elif [ "${CI:-}" = "true" ]; then
  fail "$LMC cannot import lmcache: run scripts/install-deps.sh pyenv:vllm"
else
  echo "peers_test: LMCache runs left out: $LMC cannot import lmcache (scripts/install-deps.sh pyenv:vllm)" >&2
fi
mooncake_pids() { pgrep -f 'mooncake/mooncake_(master|client)' | sort || true; }
BEFORE=$(mooncake_pids)
WORK=$(mktemp -d /var/tmp/flatkv-peers-test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

"$FLATKV" bench restore --runs "$RUNS" --sizes-mib 16 --reps 1 --dir "$WORK" --json > "$WORK/restore.json" \
  || fail "bench restore --runs $RUNS (log above)"
python3 - "$WORK/restore.json" "$RUNS" <<'EOF' || fail "bench restore json"
import json, sys
j = json.load(open(sys.argv[1]))
runs = sys.argv[2].split(",")
assert j["peer_errors"] == {}, j["peer_errors"]
row = j["sizes"][0]["runs"]
for r in runs:
    assert r in row, f"{r} missing from the size's runs: {sorted(row)}"
    assert row[r]["info"]["verified_reps"] >= 1, r
    assert row[r]["median_gbps"] > 0, r
for k in ["mooncake_dram_gbps", "mooncake_dram_tcp_gbps", "mooncake_ssd_gbps", "daemon_shm_restore_gbps",
          "mooncake_first_chunk_ms", "ssd_first_layer_ms", "mooncake_get_p50_us", "mooncake_get_p99_us"]:
    assert isinstance(j[k], (int, float)) and j[k] > 0, (k, j[k])
if "lmcache_disk" in runs:
    for k in ["lmcache_cpu_gbps", "lmcache_disk_gbps", "lmcache_first_chunk_ms"]:
        assert isinstance(j[k], (int, float)) and j[k] > 0, (k, j[k])
assert j["tiered_model"]["ssd_gbps"] > 0
print("peers_test: restore:", {r: round(row[r]["median_gbps"], 2) for r in runs})
EOF

"$FLATKV" bench serve --quick --clients 2 --blocks 2 --reps 1 --lookup-seconds 0.2 --no-redis --dir "$WORK" --json \
  > "$WORK/serve.json" || fail "bench serve"
python3 - "$WORK/serve.json" <<'EOF' || fail "bench serve json"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["mooncake_get_p50_us"] and j["mooncake_get_p99_us"] >= j["mooncake_get_p50_us"] > 0, j["mooncake"]
print("peers_test: serve: mooncake get p50/p99 us:", j["mooncake_get_p50_us"], j["mooncake_get_p99_us"])
EOF

# The benchmark stops what it started: its drivers, their Mooncake processes, the daemon.
sleep 1
left=$( (pgrep -f "$WORK" || true; comm -13 <(echo "$BEFORE") <(mooncake_pids)) | grep -v '^$' || true)
[ -z "$left" ] || fail "processes left running: $(ps -o pid=,args= -p $(echo $left | tr ' ' ,) 2>/dev/null)"
echo "peers_test: ok"
