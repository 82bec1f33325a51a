#!/usr/bin/env bash
# The GPU window's device check (docs/gpu.md), in two halves:
#
#   scripts/gpu-check.sh build
#       here (no GPU needed): builds flatkv with -DFLATKV_CUDA=ON in build/cuda and gathers
#       flatkv, flatkv_gpu_device_tests, the shared libraries they need beyond glibc and
#       libcufile.so.0 (cuFile, loaded at run time) into build/gpu-bundle (at most 64 MiB: the
#       device machine lacks flatkv's Debian -dev libraries and has no network).
#   scripts/gpu-check.sh device
#       on the device machine (1 H200, CUDA 13), with build/gpu-bundle carried there: runs the
#       device tests, the CUDA half of tests/vllm/test_torch_kv.py (the torch data path of the vLLM
#       connector on the vLLM layouts of tests/vllm/fixtures/vllm_kv_layouts.json: needs a Python
#       with torch and CUDA, not vLLM or pytest; at most 3 minutes), then `flatkv bench gpu
#       --json`, writing at most 6 files under $OUT (device_tests.log, torch_kv.log,
#       bench_gpu.json, bench_gpu.err, nvidia_smi.txt, machine.txt: the
#       kernel, memory, the scratch directory's filesystem and block devices, and whether the
#       nvidia-fs driver that GDS needs is loaded). The bench's SSD store goes to /tmp, or to
#       build/gpu-scratch beside the bundle where /tmp is a tmpfs (not an SSD), and so do the device
#       tests' stores (FLATKV_TEST_DIR).
#       Expected time there: about 2-3 minutes (tests under 1, torch_kv under 1, the bench 1-2
#       at 64 blocks).
#   scripts/gpu-check.sh torch-kv
#       only the torch_kv step (no bundle needed), its log under $OUT.
#
# With the device tool: `run` with carry ["build/gpu-bundle"] and the command
#   bash scripts/gpu-check.sh device
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
bundle=build/gpu-bundle
# tests/vllm/test_torch_kv.py's CUDA tests with the first Python that has torch with CUDA
# ($FLATKV_TORCH_PYTHON, build/pyenv/torch, python3); its log to $1. No such Python: says so, passes.
torch_kv_check() {
  local log=$1 py="" cand
  for cand in "${FLATKV_TORCH_PYTHON:-}" build/pyenv/torch/bin/python python3; do
    if [ -n "$cand" ] && command -v "$cand" >/dev/null 2>&1 &&
        "$cand" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
      py=$cand; break
    fi
  done
  if [ -z "$py" ]; then
    echo "torch_kv: no Python with torch and CUDA here (FLATKV_TORCH_PYTHON): its CUDA tests did not run" | tee "$log"
    return 0
  fi
  local trc=0
  timeout 180 "$py" tests/vllm/test_torch_kv.py --cuda > "$log" 2>&1 || trc=$?
  tail -3 "$log"
  return $trc
}
case "$mode" in
  build)
    scripts/install-deps.sh debian pyenv:torch  # pyenv:torch: cufile.h and libcufile.so.0 (nvidia-cufile)
    cmake -S . -B build/cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLATKV_WERROR=ON -DFLATKV_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DFLATKV_BUILD_PYTHON=OFF -DFLATKV_BUILD_BENCH=OFF >/dev/null
    cmake --build build/cuda --target flatkv flatkv_gpu_device_tests
    rm -rf "$bundle"
    mkdir -p "$bundle/lib"
    cp build/cuda/flatkv build/cuda/flatkv_gpu_device_tests "$bundle/"
    strip "$bundle/flatkv" "$bundle/flatkv_gpu_device_tests"
    # Every shared library beyond glibc's own (libc, libm, libpthread, libdl, librt, the loader).
    for bin in "$bundle/flatkv" "$bundle/flatkv_gpu_device_tests"; do
      ldd "$bin" | awk '/=> \// {print $3}' | grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' || true
    done | sort -u | while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
    # cuFile, loaded at run time (dlopen: ldd does not list it), from PyPI's nvidia-cufile.
    cufile=$(ls build/pyenv/torch/lib/python3*/site-packages/nvidia/cu13/lib/libcufile.so.0 2>/dev/null | head -1 || true)
    if [ -n "$cufile" ]; then cp -L "$cufile" "$bundle/lib/"
    else echo "no libcufile.so.0 (scripts/install-deps.sh pyenv:torch): SSD hits will bounce through host memory there" >&2; fi
    size=$(du -sm "$bundle" | cut -f1)
    echo "bundle: $bundle, ${size} MiB"
    if [ "$size" -gt 64 ]; then echo "FAIL: the bundle is over 64 MiB" >&2; exit 1; fi
    ;;
  device)
    [ -x "$bundle/flatkv" ] || { echo "no $bundle: run 'scripts/gpu-check.sh build' here first and carry it" >&2; exit 2; }
    out=${OUT:-/tmp/gpu-check}
    mkdir -p "$out"
    export LD_LIBRARY_PATH="$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    nvidia-smi > "$out/nvidia_smi.txt" 2>&1 || true
    scratch=/tmp
    if [ "$(stat -f -c %T /tmp 2>/dev/null)" = tmpfs ]; then scratch=$PWD/build/gpu-scratch; mkdir -p "$scratch"; fi
    {
      echo "scratch: $scratch"; uname -a; nproc; free -g
      df -hT "$scratch" "$PWD"; lsblk -o NAME,SIZE,ROTA,TYPE,MOUNTPOINT 2>&1 | head -20
      echo "nvidia modules:"; (lsmod 2>/dev/null | grep -i nvidia) || echo "(lsmod: none listed)"
      if [ -e /proc/driver/nvidia-fs/version ]; then echo "nvidia-fs:"; cat /proc/driver/nvidia-fs/version
      else echo "nvidia-fs: not loaded (cuFile can only run in compatibility mode)"; fi
    } > "$out/machine.txt" 2>&1 || true
    rc=0
    FLATKV_TEST_DIR=$scratch timeout 120 "$bundle/flatkv_gpu_device_tests" > "$out/device_tests.log" 2>&1 || rc=$?
    tail -5 "$out/device_tests.log"
    torch_kv_check "$out/torch_kv.log" || rc=$((rc ? rc : $?))
    timeout 170 "$bundle/flatkv" bench gpu --json --dir "$scratch" > "$out/bench_gpu.json" 2> "$out/bench_gpu.err" || rc=$((rc ? rc : $?))
    cat "$out/bench_gpu.json"
    exit $rc
    ;;
  torch-kv)
    out=${OUT:-/tmp/gpu-check}
    mkdir -p "$out"
    torch_kv_check "$out/torch_kv.log"
    ;;
  *)
    echo "usage: scripts/gpu-check.sh build|device|torch-kv" >&2
    exit 2
    ;;
esac
