#!/usr/bin/env bash
# The daemon's /metrics against Prometheus's own tools, run by ctest:
#   metrics_test.sh promtool   /path/to/flatkv   # promtool check metrics, check/test rules; /stats wants its token
#   metrics_test.sh prometheus /path/to/flatkv   # a real Prometheus scrapes the daemon; its HTTP API answers
# Both start `flatkv serve` on loopback (ephemeral ports, a temp dir) with two tenants and
# metrics.stats_token. Without promtool / prometheus (Debian's `prometheus` package) a test
# skips (exit 77), except under CI=true, where it fails: CI installs them (scripts/install-deps.sh).
set -euo pipefail
MODE=$1
FLATKV=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RULES=$ROOT/docs/examples/flatkv-alerts.yml
fail() { echo "FAIL: $*"; exit 1; }
need() {
  command -v "$1" >/dev/null && return 0
  [ "${CI:-}" = "true" ] && fail "$1 is not installed (scripts/install-deps.sh installs Debian's prometheus)"
  echo "SKIP: $1 is not installed (apt-get install prometheus)"; exit 77
}
need promtool
[ "$MODE" = promtool ] || need prometheus

WORK=$(mktemp -d /var/tmp/flatkv-metrics-XXXXXX)
SERVE_PID="" PROM_PID=""
cleanup() {
  local rc=$?
  set +e
  # Stop both on every exit, failure included; show their logs when failing.
  [ -z "$PROM_PID" ] || { kill -TERM "$PROM_PID" 2>/dev/null; wait "$PROM_PID" 2>/dev/null; }
  [ -z "$SERVE_PID" ] || { kill -TERM "$SERVE_PID" 2>/dev/null; wait "$SERVE_PID" 2>/dev/null; }
  if [ $rc -ne 0 ]; then
    for f in serve.log prometheus.log; do [ -f "$WORK/$f" ] && { echo "--- $f"; tail -30 "$WORK/$f"; }; done
  fi
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT

TOKEN_A=tenant-alpha-token-0123456789
STATS_TOKEN=stats-token-0123456789abcdef
cat > "$WORK/flatkv.toml" <<TOML
[metrics]
stats_token = "$STATS_TOKEN"
[[tenants]]
name = "secret-alpha"
token = "$TOKEN_A"
[[tenants]]
name = "secret-beta"
token = "tenant-beta-token-0123456789"
quota_bytes = "1GiB"
TOML
XDG_CACHE_HOME="$WORK/cache" XDG_RUNTIME_DIR="$WORK" "$FLATKV" serve --config "$WORK/flatkv.toml" \
  --shape stories260K --dram-bytes 16MiB --ssd-bytes 64MiB --tcp 127.0.0.1:0 --http 127.0.0.1:0 \
  2>"$WORK/serve.log" &
SERVE_PID=$!
HTTP=""
for _ in $(seq 100); do
  HTTP=$(sed -n 's/.*metrics on http:\/\/\([0-9.]*:[0-9]*\).*/\1/p' "$WORK/serve.log")
  [ -n "$HTTP" ] && break
  kill -0 "$SERVE_PID" 2>/dev/null || fail "flatkv serve exited"
  sleep 0.1
done
[ -n "$HTTP" ] || fail "flatkv serve did not report its HTTP address"
# One authenticated connection and a stats request, so the server counters move.
"$FLATKV" stats --server "unix:$WORK/flatkv/flatkv.sock" --token "$TOKEN_A" --json >/dev/null || fail "stats --server"

if [ "$MODE" = promtool ]; then
  curl -sf "http://$HTTP/metrics" > "$WORK/metrics.txt" || fail "GET /metrics"
  promtool check metrics < "$WORK/metrics.txt" || fail "promtool check metrics (output above)"
  grep -q 'flatkv_tenant_quota_bytes{tenant="1"} 1073741824' "$WORK/metrics.txt" || fail "no per-tenant series by index"
  ! grep -q secret "$WORK/metrics.txt" || fail "/metrics names a tenant: $(grep secret "$WORK/metrics.txt" | head -3)"
  promtool check rules "$RULES" || fail "promtool check rules $RULES"
  promtool test rules "${RULES%.yml}_test.yml" || fail "promtool test rules ${RULES%.yml}_test.yml"
  code=$(curl -s -o "$WORK/401.txt" -w '%{http_code}' "http://$HTTP/stats")
  [ "$code" = 401 ] || fail "/stats without a token answered $code"
  grep -q "metrics.stats_token" "$WORK/401.txt" || fail "/stats 401 without its message: $(cat "$WORK/401.txt")"
  curl -sf -H "Authorization: Bearer $STATS_TOKEN" "http://$HTTP/stats" | python3 -c \
    "import json,sys; s=json.load(sys.stdin); assert [t['name'] for t in s['tenants']] == ['secret-alpha', 'secret-beta'], s" \
    || fail "/stats with the token"
  echo "promtool: /metrics and $(basename "$RULES") pass"
  exit 0
fi

# A real Prometheus on a free loopback port, scraping the daemon every second with the example rules.
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat > "$WORK/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: ["$RULES"]
scrape_configs:
  - job_name: flatkv
    static_configs:
      - targets: ["$HTTP"]
YML
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$PORT" > "$WORK/prometheus.log" 2>&1 &
PROM_PID=$!
python3 "$ROOT/src/service/metrics_check.py" "http://127.0.0.1:$PORT" "$ROOT/docs/service.md" "$RULES" \
  || fail "Prometheus's view of the daemon (above)"
