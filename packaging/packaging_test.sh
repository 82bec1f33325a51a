#!/usr/bin/env bash
# The shipped service files, run by ctest:  packaging_test.sh /path/to/flatkv
#   - packaging/flatkv.toml (the unit's example config) loads: `flatkv serve --print-config`;
#   - packaging/flatkv.service.in, with ExecStart pointing at this build's binary, passes
#     `systemd-analyze verify` with nothing to say (it only warns about unknown or bad
#     settings, so any output is a failure). Without systemd-analyze that part is skipped.
set -euo pipefail
FLATKV=$(realpath "$1")  # ExecStart= wants an absolute path
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /var/tmp/flatkv-packaging-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

XDG_CACHE_HOME="$WORK/cache" "$FLATKV" serve --config "$ROOT/packaging/flatkv.toml" --print-config > "$WORK/config.txt" 2>&1 \
  || fail "packaging/flatkv.toml does not load: $(cat "$WORK/config.txt")"
grep -q "/stats with metrics.stats_token" "$WORK/config.txt" || fail "example config: $(cat "$WORK/config.txt")"

if ! command -v systemd-analyze >/dev/null; then
  echo "systemd-analyze not installed: the unit file is not verified"
  exit 0
fi
sed "s|@FLATKV_INSTALL_BINDIR@/flatkv|$FLATKV|" "$ROOT/packaging/flatkv.service.in" > "$WORK/flatkv.service"
out=$(cd "$WORK" && systemd-analyze verify ./flatkv.service 2>&1) || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify has remarks: $out"
echo "packaging: example config loads; flatkv.service verifies"
