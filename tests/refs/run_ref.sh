#!/usr/bin/env bash
# Runs one reference check of tests/refs/ (docs/models.md) with the pinned
# environment build/pyenv/refs against the flatkv binary under test:
#   run_ref.sh FLATKV_BINARY CHECK        CHECK: dequant | tokenize | forward
# A missing environment or model skips (exit 77) naming what is missing and
# the command that installs it; with CI=true it fails instead.
set -u
FLATKV=${1:?usage: run_ref.sh FLATKV_BINARY CHECK}
CHECK=${2:?usage: run_ref.sh FLATKV_BINARY CHECK}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
PY="$SRC/build/pyenv/refs/bin/python"
missing() {
  if [ "${CI:-}" = "true" ]; then
    echo "FAIL (CI=true): $1" >&2
    exit 1
  fi
  echo "SKIPPED: $1" >&2
  exit 77
}
[ -x "$PY" ] || missing "$PY is missing: install it with scripts/install-deps.sh pyenv:refs"
MODEL=${FLATKV_SMOLLM2:-$SRC/build/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$MODEL" ] || missing "$MODEL is missing: install it with scripts/install-deps.sh models"
# OpenMP threads that sleep rather than spin when they wait: torch's and
# llama.cpp's pools share two cores with flatkv and each other.
export OMP_WAIT_POLICY=PASSIVE
# Nothing is fetched at run time: transformers loads the local GGUF, never the Hugging Face hub.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "$PY" "$SRC/tests/refs/ref_$CHECK.py" --flatkv "$FLATKV" --model "$MODEL"
