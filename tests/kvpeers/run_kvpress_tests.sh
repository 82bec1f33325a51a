#!/usr/bin/env bash
# The kvpress peer of `flatkv bench attention --model` (label smollm2, issue 32):
#   1. bench/kvpress_peer.py builds, from one dense prefill, the cache kvpress's own context
#      manager leaves, press by press and at both budgets (tests/kvpeers/test_kvpress_peer.py);
#   2. `flatkv bench attention --model` on SmolLM2 over the short prompts of data/workload/ci.tsv,
#      with kvpress in the same run: every entry carries the protocol's fields, every paired press
#      is there, Quest and the certified sampler ran, violated certificates within delta.
# A missing model, environment or converted model skips (77) naming the install command; with
# CI=true it fails instead.
#   run_kvpress_tests.sh FLATKV_BINARY
set -u
FLATKV=${1:?usage: run_kvpress_tests.sh FLATKV_BINARY}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
missing() {
  if [ "${CI:-}" = "true" ]; then echo "FAIL (CI=true): $1" >&2; exit 1; fi
  echo "SKIPPED: $1" >&2
  exit 77
}
MODEL=${FLATKV_SMOLLM2:-$SRC/build/models/SmolLM2-135M-Instruct.Q4_1.gguf}
PY=$SRC/build/pyenv/kvpeers/bin/python
HF=${FLATKV_SMOLLM2_HF:-$SRC/build/models/smollm2-135m-hf}
[ -f "$MODEL" ] || missing "$MODEL is missing: install it with scripts/install-deps.sh models"
[ -x "$PY" ] || missing "build/pyenv/kvpeers is missing: scripts/install-deps.sh pyenv:kvpeers"
[ -f "$HF/config.json" ] || missing "$HF is missing: scripts/install-deps.sh pyenv:vllm converts it"
export OMP_WAIT_POLICY=PASSIVE HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
set -e
"$PY" "$SRC/tests/kvpeers/test_kvpress_peer.py" "$HF" 2>"$TMP/peer.err" || { tail -20 "$TMP/peer.err"; exit 1; }
"$FLATKV" bench attention --model "$MODEL" --workload-list "$SRC/data/workload/ci.tsv" --ids ci-code ci-passkey \
  --hf-model "$HF" --presses snapkv streaming_llm pyramidkv adakv_snapkv knorm --json \
  >"$TMP/attention.json" 2>"$TMP/attention.err" || { tail -20 "$TMP/attention.err"; exit 1; }
python3 - "$TMP/attention.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
fails = []
def check(cond, what):
    if not cond: fails.append(what)
names = {(e["name"], e["budget"]) for e in j["methods"]}
for e in j["methods"]:
    for k in ("model", "ppl_delta", "greedy_agreement", "retrieval_accuracy"):
        check(k in e, f"{e['name']}: no {k}")
    want = 1 if e["name"] in ("quest", "certified_sampler") else 2  # sparse decode: the longest prompt only
    check(e["prompts"] == want, f"{e['name']}: {e['prompts']} prompts")
    check(0 <= e["greedy_agreement"] <= 1, f"{e['name']}: greedy agreement {e['greedy_agreement']}")
for press in ("snapkv", "streaming_llm", "pyramidkv", "adakv_snapkv", "knorm"):
    for r in (0.5, 0.75):
        check(any(e.get("peer") == "kvpress:" + press and abs(e["budget"] - r) < 1e-9 for e in j["methods"]),
              f"kvpress:{press} at {r} missing")
for e in j["methods"]:
    if e.get("budget_kind") == "fraction_removed":
        check(abs(e["kept_fraction"] - (1 - e["budget"])) < 0.03, f"{e['name']}@{e['budget']}: kept {e['kept_fraction']}")
check(len(j["pairs"]) == 14, f"{len(j['pairs'])} flatkv/kvpress pairs, expected 14")
sparse = {e["name"]: e for e in j["methods"] if e["name"] in ("quest", "certified_sampler")}
check(set(sparse) == {"quest", "certified_sampler"}, "quest / certified_sampler missing")
if "certified_sampler" in sparse:
    s = sparse["certified_sampler"]
    # The guarantee: a certificate is false with probability <= delta (0.01) per head and step.
    check(s["certified_heads"] > 0 and s["violations"] <= 0.01 * s["certified_heads"],
          f"sampler: {s['violations']} of {s['certified_heads']} certificates violated")
    check(s["attn_output_rel_err"] < 0.05, f"sampler error {s['attn_output_rel_err']}")
if "quest" in sparse:
    check(0 < sparse["quest"]["read_fraction"] < 1, f"quest read fraction {sparse['quest']['read_fraction']}")
check(any(w["full_cache_answer_correct"] for w in j["workload"] if w["kind"] == "retrieval"),
      "the full cache does not find the pass key")
if fails:
    print("FAIL:\n  " + "\n  ".join(fails)); sys.exit(1)
print("ok: %d entries, %d pairs, %.0f s" % (len(j["methods"]), len(j["pairs"]), j["seconds"]["total"]))
PY
