#!/usr/bin/env bash
# `flatkv bench codecs --model` and `flatkv bench blend --model` on SmolLM2 over the short
# prompts of data/workload/ci.tsv (label smollm2): every entry carries the protocol's fields,
# the peers (quanto:int4, quanto:int2 through build/pyenv/kvpeers, zstd-1:bf16) are there, and
# the exact paths are exact. A missing model, environment or converted model skips (77) naming
# the install command; with CI=true it fails instead.
#   bench_model_test.sh FLATKV_BINARY
set -u
FLATKV=${1:?usage: bench_model_test.sh FLATKV_BINARY}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
missing() {
  if [ "${CI:-}" = "true" ]; then echo "FAIL (CI=true): $1" >&2; exit 1; fi
  echo "SKIPPED: $1" >&2
  exit 77
}
MODEL=${FLATKV_SMOLLM2:-$SRC/build/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$MODEL" ] || missing "$MODEL is missing: install it with scripts/install-deps.sh models"
[ -x "$SRC/build/pyenv/kvpeers/bin/python" ] || missing "build/pyenv/kvpeers is missing: scripts/install-deps.sh pyenv:kvpeers"
[ -f "$SRC/build/models/smollm2-135m-hf/config.json" ] || missing "build/models/smollm2-135m-hf is missing: scripts/install-deps.sh pyenv:vllm converts it"
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
set -e
"$FLATKV" bench codecs --model "$MODEL" --workload-list "$SRC/data/workload/ci.tsv" --max-context 8192 --quick --json \
  >"$TMP/codecs.json" 2>"$TMP/codecs.err" || { tail -20 "$TMP/codecs.err"; exit 1; }
"$FLATKV" bench blend --model "$MODEL" --workload-list "$SRC/data/workload/ci.tsv" --json \
  >"$TMP/blend.json" 2>"$TMP/blend.err" || { tail -20 "$TMP/blend.err"; exit 1; }
python3 - "$TMP/codecs.json" "$TMP/blend.json" <<'PY'
import json, math, sys
c = json.load(open(sys.argv[1]))
b = json.load(open(sys.argv[2]))
fails = []
def check(cond, what):
    if not cond: fails.append(what)
names = {e["name"]: e for e in c["codecs"]}
for e in c["codecs"]:
    for k in ("model", "ppl_delta", "greedy_agreement", "retrieval_accuracy", "bits_per_element"):
        check(k in e, f"{e['name']}: no {k}")
    check(e["prompts"] == 3, f"{e['name']}: {e['prompts']} prompts")
for peer in ("quanto:int4", "quanto:int2", "zstd-1:bf16"):
    check(peer in names and names[peer].get("peer") == peer, f"peer {peer} missing")
check(c["full_cache"]["retrieval_accuracy"] == 1.0, "the full cache does not find the pass key")
i8 = names.get("int8")
check(i8 is not None and i8["path"] == "dataset" and 8.0 <= i8["bits_per_element"] < 8.6, "int8 row")
check(any(n.endswith("@store") for n in names), "no row through the store")
check(names["zstd-1:bf16"]["ppl_delta"] == names["raw"]["ppl_delta"], "zstd -1 is lossless on bf16: raw's figures")
q4 = names["quanto:int4"]
check(4.0 < q4["bits_per_element"] < 6.5, f"quanto int4 bits {q4['bits_per_element']}")
check(q4["greedy_agreement"] <= 1.0, "quanto int4 agreement")
modes = {m["mode"]: m for m in b["modes"]}
for m in ("full", "naive", "cacheblend-5%", "cacheblend-15%", "cacheblend-30%", "sink"):
    check(m in modes, f"blend mode {m} missing")
    check("ppl_delta" in modes.get(m, {}) and "greedy_agreement" in modes.get(m, {}), f"blend {m} fields")
check(modes["full"]["ppl_delta"] == 0.0 and modes["full"]["greedy_agreement"] == 1.0, "blend full is the reference")
if fails:
    print("FAIL:\n  " + "\n  ".join(fails)); sys.exit(1)
print("ok: %d codec entries, %d blend modes" % (len(c["codecs"]), len(b["modes"])))
PY
