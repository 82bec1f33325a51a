#!/usr/bin/env bash
# Installs flatkv's build and test dependencies from Debian 12 packages.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3  # python3: the CLI end-to-end test
  clang lld libclang-rt-14-dev          # ThreadSanitizer and libFuzzer builds
  liburing-dev libzstd-dev libxxhash-dev libssl-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev
  librocksdb-dev                        # the RocksDB peer in `flatkv bench restore`
  libtomlplusplus-dev openssl           # `flatkv serve` config files; openssl makes the TLS test's certificate
  pybind11-dev python3-dev python3-numpy python3-pytest  # the Python module and its tests
  libhiredis-dev                        # the remote tier's RESP parser
  redis-server redis-tools              # the remote tier's local cluster; the Redis GET baseline of `flatkv bench serve` (redis-benchmark checks its harness)
  python3-setuptools python3-wheel python3-venv           # pip install ./python into a venv (test-all.sh)
  prometheus curl                       # promtool and a real Prometheus for the metrics tests
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Debian's prometheus and redis-server packages start their own services (:9090, :6379) when
  # installed; the tests only need their binaries (they run their own on free ports), so
  # services are not started during this install (policy-rc.d, removed afterwards).
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod 755 /usr/sbin/policy-rc.d
  fi
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
