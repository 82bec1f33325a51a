#!/usr/bin/env bash
# Installs dependencies, then builds and runs every test:
#   1. the whole suite in Release (warnings are errors),
#   2. the whole suite under AddressSanitizer + UndefinedBehaviorSanitizer,
#   3. the concurrency tests under ThreadSanitizer (clang),
#   4. each libFuzzer target for FLATKV_FUZZ_SECONDS (default 30) seconds.
# Exits non-zero when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
JOBS=$(nproc)
FUZZ_SECONDS=${FLATKV_FUZZ_SECONDS:-30}

step() { echo; echo "=== $* ==="; }

step "Release build and tests"
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLATKV_WERROR=ON >/dev/null
cmake --build build/release -j "$JOBS"
ctest --test-dir build/release --output-on-failure  # serial: one test compares modelled and measured I/O times

step "AddressSanitizer + UndefinedBehaviorSanitizer build and tests"
cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLATKV_WERROR=ON \
  -DFLATKV_SANITIZE=address,undefined -DFLATKV_BUILD_BENCH=OFF -DFLATKV_BUILD_TOOLS=OFF >/dev/null
cmake --build build/asan -j "$JOBS" --target flatkv_tests flatkv_capi_test flatkv_example_connector
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build/asan --output-on-failure

step "ThreadSanitizer build and concurrency tests"
CC=clang CXX=clang++ cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLATKV_WERROR=ON \
  -DFLATKV_SANITIZE=thread -DFLATKV_BUILD_BENCH=OFF -DFLATKV_BUILD_TOOLS=OFF >/dev/null
cmake --build build/tsan -j "$JOBS" --target flatkv_concurrency_tests
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build/tsan/flatkv_concurrency_tests

step "libFuzzer targets, ${FUZZ_SECONDS}s each"
CC=clang CXX=clang++ cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLATKV_BUILD_FUZZ=ON \
  -DFLATKV_SANITIZE=address,undefined -DFLATKV_BUILD_TESTS=OFF -DFLATKV_BUILD_BENCH=OFF -DFLATKV_BUILD_TOOLS=OFF >/dev/null
cmake --build build/fuzz -j "$JOBS"
for target in build/fuzz/*_fuzz; do
  name=$(basename "$target")
  corpus=build/fuzz/corpus/$name
  mkdir -p "$corpus"
  seeds=fuzz/seeds/$name
  echo "--- $name"
  log=build/fuzz/$name.log
  if ! "$target" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -artifact_prefix="build/fuzz/$name-" \
      "$corpus" $( [ -d "$seeds" ] && echo "$seeds" ) > "$log" 2>&1; then
    grep -v '^#' "$log" | tail -40
    echo "$name FAILED (the input that failed is build/fuzz/$name-crash-* or similar)"
    exit 1
  fi
  tail -5 "$log"
done

step "all tests passed"
