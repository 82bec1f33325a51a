#!/usr/bin/env bash
# Installs dependencies, builds flatkv (Release) and runs its main job on
# built-in defaults: the restore benchmark, quick version.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLATKV_BUILD_TESTS=OFF -DFLATKV_BUILD_BENCH=OFF >/dev/null
cmake --build build/release --target flatkv
exec build/release/flatkv bench restore --quick "$@"
