#!/usr/bin/env bash
# The core store links alone (docs/architecture.md, "Components"): flatkv_core_only, a program
# using only include/flatkv/store.h and linked against flatkv_core, must have a link line that
# names no other component and none of their dependencies (hiredis, libssl, toml++, ZeroMQ,
# msgpack, zlib, RocksDB, the CUDA runtime); then it runs (a put and a restore, and the remote
# tier's options refused because it is not linked).
# Usage: core_link_test.sh BUILD_DIR GENERATOR MAKE_PROGRAM PROGRAM
set -euo pipefail
build=$1 generator=$2 make_program=$3 program=$4

if [[ $generator == Ninja* ]]; then
  line=$("$make_program" -C "$build" -t commands flatkv_core_only | tail -1)
else
  line=$(cat "$build/CMakeFiles/flatkv_core_only.dir/link.txt")
fi
echo "link line: $line"
[[ $line == *flatkv_core* ]] || { echo "FAIL: the link line does not name flatkv_core (not the link step?)"; exit 1; }
forbidden='hiredis|libssl|-lssl\b|toml|zmq|msgpack|libz\.(so|a)|-lz\b|rocksdb|cudart|cufile|nlohmann|flatkv_(net|remote|service|capi|model|attention|engine|eval|replay|gpu|bench|crashtest)'
if found=$(grep -oE "$forbidden" <<<"$line" | sort -u | tr '\n' ' ') && [ -n "$found" ]; then
  echo "FAIL: the core's link line names another component or its dependency: $found"
  exit 1
fi

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$program" "$dir"
