#!/usr/bin/env bash
# Installs dependencies, builds flatkv (Release) and runs its main job: the
# trace replay of a bundled subset of real Claude Code sessions
# (data/traces/claude-code-subset/, 16 sessions) through every cache policy
# (flat, tiered, files, infinite, belady) at loads 0.5, 1, 2 and 4, with the
# Llama-3.1-70B preset. DRAM (256 GiB) holds about 7% of the subset's 3.7 TiB
# working set; the SSD (8 TiB) holds all of it. Prints the comparison table;
# extra arguments are passed on (e.g. --json, --plot DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLATKV_BUILD_TESTS=OFF -DFLATKV_BUILD_BENCH=OFF >/dev/null
cmake --build build/release --target flatkv
exec build/release/flatkv replay --trace data/traces/claude-code-subset \
  --policy flat,tiered,files,infinite,belady --model llama-3.1-70b \
  --dram 256GiB --ssd 8TiB --load 0.5,1,2,4 "$@"
