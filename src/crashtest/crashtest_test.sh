#!/usr/bin/env bash
# Short crash-harness runs, run by ctest (docs/crashtest.md):
#   crashtest_test.sh /path/to/flatkv DRAM_BYTES
# kill -9 rounds against a store directory and against `flatkv serve`, then
# the fault-injection pass. Fails on any wrong block, any lost block, or a
# worker or daemon that misbehaved; prints their logs when it does.
set -euo pipefail
FLATKV=$1
DRAM=${2:-0}
WORK=$(mktemp -d /var/tmp/flatkv-crashtest-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
run() {
  local dir=$1; shift
  if ! "$FLATKV" crashtest --dir "$WORK/$dir" --dram "$DRAM" --ssd 256MiB --writers 4 --seed 7 "$@"; then
    for log in "$WORK/$dir"/worker.log "$WORK/$dir"/serve.log; do
      [ -f "$log" ] && { echo "--- last lines of $log"; tail -20 "$log"; }
    done
    echo "FAIL: flatkv crashtest $* (DRAM tier: $DRAM)"
    exit 1
  fi
}
# --shared-refcount: the store keeps a block while any live session references it.
run store --target store --kills 5 --min-ms 100 --max-ms 400 --shared-refcount
run serve --target serve --kills 3 --min-ms 100 --max-ms 400
"$FLATKV" crashtest --faults --dir "$WORK/faults" --seed 7 || { echo "FAIL: flatkv crashtest --faults"; exit 1; }
echo "crashtest: all short runs passed"
