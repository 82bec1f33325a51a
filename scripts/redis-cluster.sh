#!/usr/bin/env bash
# A local Redis Cluster on loopback for flatkv's remote-tier tests and benchmarks.
#
#   scripts/redis-cluster.sh start DIR [MASTERS [REPLICAS_PER_MASTER]]   (default 3 1)
#       starts MASTERS * (1 + REPLICAS) redis-server nodes on free loopback ports, their files
#       under DIR/<port>/, joins them with `redis-cli --cluster create --cluster-yes`, waits
#       until every node reports cluster_state:ok and every replica's link is up, and prints
#       the seed list (host:port,host:port,...), also written to DIR/seeds
#   scripts/redis-cluster.sh restart DIR PORT
#       restarts a node that was killed (its nodes.conf makes it rejoin, as a replica
#       once its replica was promoted)
#   scripts/redis-cluster.sh stop DIR
#       stops every node started under DIR (SIGTERM, then SIGKILL) and removes DIR
#
# With REDIS_CLUSTER_TLS=1 at start, the nodes speak only TLS, to clients and on the cluster
# bus (port 0, tls-port, tls-cluster yes, tls-replication yes; clients need no certificate):
# a throwaway CA and a server certificate for 127.0.0.1 are made with openssl under DIR/tls/,
# and clients verify against DIR/tls/ca.crt. restart and stop find the mode in DIR.
#
# Settings: persistence off (a cache), cluster-node-timeout 1000 ms so failover takes
# seconds in tests (the default 15 s is for production; docs/service.md), everything else
# Redis's defaults (cluster-require-full-coverage yes, maxmemory unset).
set -euo pipefail

die() { echo "redis-cluster.sh: $*" >&2; exit 1; }
# redis-cli against one of DIR's nodes, over TLS when DIR's cluster uses it ($dir is set below).
cli() {
  if [ -f "$dir/tls/ca.crt" ]; then redis-cli --tls --cacert "$dir/tls/ca.crt" "$@"; else redis-cli "$@"; fi
}
make_tls() {  # make_tls DIR: a CA and a certificate for 127.0.0.1 signed by it
  command -v openssl >/dev/null || die "openssl is not installed (apt-get install openssl)"
  local t="$1/tls"
  mkdir -p "$t"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$t/ca.key" -out "$t/ca.crt" -days 7 \
    -subj "/CN=flatkv test CA" >/dev/null 2>&1 || die "openssl could not make the test CA"
  openssl req -newkey rsa:2048 -nodes -keyout "$t/server.key" -out "$t/server.csr" \
    -subj "/CN=127.0.0.1" >/dev/null 2>&1 || die "openssl could not make the server key"
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > "$t/ext.cnf"
  openssl x509 -req -in "$t/server.csr" -CA "$t/ca.crt" -CAkey "$t/ca.key" -CAcreateserial \
    -out "$t/server.crt" -days 7 -extfile "$t/ext.cnf" >/dev/null 2>&1 || die "openssl could not sign the server certificate"
}
need_redis() {
  command -v redis-server >/dev/null || die "redis-server is not installed (apt-get install redis-server redis-tools)"
  command -v redis-cli >/dev/null || die "redis-cli is not installed (apt-get install redis-tools)"
}

# N free loopback ports whose cluster-bus port (port + 10000) is free too, both below the
# kernel's ephemeral range (ip_local_port_range), so that no test's outgoing connection can
# take one between this check and redis-server's bind.
free_ports() {
  python3 - "$1" <<'EOF'
import random, socket, sys
n, found = int(sys.argv[1]), []
try:
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    low = 32768
hi = max(low - 10001, 10100)
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        s.close()
while len(found) < n:
    p = random.randint(10000, hi)
    if p not in found and free(p) and free(p + 10000):
        found.append(p)
print(" ".join(map(str, found)))
EOF
}

start_node() {  # start_node DIR PORT: 0 once the node answers PING, 1 if it exited or stayed silent
  local d="$1/$2" i
  mkdir -p "$d"
  local listen="port $2"
  if [ -f "$1/tls/ca.crt" ]; then
    listen="port 0
tls-port $2
tls-cert-file $1/tls/server.crt
tls-key-file $1/tls/server.key
tls-ca-cert-file $1/tls/ca.crt
tls-auth-clients no
tls-cluster yes
tls-replication yes"
  fi
  [ -f "$d/redis.conf" ] || cat > "$d/redis.conf" <<EOF
$listen
bind 127.0.0.1
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout 1000
appendonly no
save ""
dir $d
daemonize yes
pidfile $d/redis.pid
logfile $d/redis.log
EOF
  redis-server "$d/redis.conf" || return 1
  # A loaded 2-core CI machine can take seconds to start a node: wait up to 20 s, and stop
  # waiting as soon as the node is gone (a port taken since free_ports checked it).
  for i in $(seq 1 400); do
    cli -p "$2" ping 2>/dev/null | grep -q PONG && return 0
    if [ "$i" -gt 20 ] && { [ ! -f "$d/redis.pid" ] || ! kill -0 "$(cat "$d/redis.pid")" 2>/dev/null; }; then
      return 1
    fi
    sleep 0.05
  done
  return 1
}

# wait_ok DIR: every node in state ok, every replica linked, and every node naming the same
# masters with slots (a restarted old master may come up believing its nodes.conf, state ok,
# before gossip tells it a replica took its slots).
wait_ok() {
  local port deadline=$((SECONDS + 30)) ok view first
  while [ $SECONDS -lt $deadline ]; do
    ok=1
    first=
    for port in $(cat "$1/ports"); do
      [ -f "$1/$port/redis.pid" ] && kill -0 "$(cat "$1/$port/redis.pid")" 2>/dev/null || continue
      cli -p "$port" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || ok=0
      if cli -p "$port" info replication 2>/dev/null | grep -q 'role:slave'; then
        cli -p "$port" info replication | grep -q 'master_link_status:up' || ok=0
      fi
      view=$(cli -p "$port" cluster nodes 2>/dev/null | awk '$3 ~ /master/ && $3 !~ /fail/ && NF >= 9 {print $2}' | sort | tr '\n' ' ')
      if [ -z "$first" ]; then first=$view; elif [ "$view" != "$first" ]; then ok=0; fi
    done
    [ $ok = 1 ] && return 0
    sleep 0.1
  done
  die "the cluster under $1 did not reach cluster_state:ok in 30 s"
}

cmd=${1:-}
dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || die "usage: $0 start DIR [MASTERS [REPLICAS]] | restart DIR PORT | stop DIR"
case "$cmd" in
  start)
    need_redis
    masters=${3:-3}
    replicas=${4:-1}
    [ "$masters" -ge 3 ] || die "Redis Cluster needs at least 3 masters (got $masters)"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [ ! -f "$dir/ports" ] || die "$dir already holds a cluster; stop it first"
    if [ "${REDIS_CLUSTER_TLS:-0}" = 1 ]; then make_tls "$dir"; fi
    nodes=()
    ports=()
    for _ in $(seq 1 $((masters * (1 + replicas)))); do
      started=0
      for attempt in 1 2 3 4 5; do
        port=$(free_ports 1)
        if start_node "$dir" "$port"; then started=1; break; fi
        echo "redis-cluster.sh: node $port did not start (attempt $attempt): $(tail -n 2 "$dir/$port/redis.log" 2>/dev/null | tr '\n' ' ')" >&2
        if [ -f "$dir/$port/redis.pid" ]; then kill -9 "$(cat "$dir/$port/redis.pid")" 2>/dev/null || true; fi
        rm -rf "${dir:?}/$port"
      done
      [ $started = 1 ] || die "could not start a redis-server node in 5 attempts; see the lines above"
      ports+=("$port")
      nodes+=("127.0.0.1:$port")
      echo "${ports[*]}" > "$dir/ports"
    done
    cli --cluster create "${nodes[@]}" --cluster-replicas "$replicas" --cluster-yes > "$dir/create.log" 2>&1 \
      || die "redis-cli --cluster create failed; see $dir/create.log"
    wait_ok "$dir"
    (IFS=,; echo "${nodes[*]}") | tee "$dir/seeds"
    ;;
  restart)
    need_redis
    port=${3:?port}
    [ -f "$dir/$port/redis.conf" ] || die "no node $port under $dir"
    start_node "$dir" "$port" || die "node $port did not answer PING; see $dir/$port/redis.log"
    wait_ok "$dir"
    ;;
  stop)
    [ -d "$dir" ] || exit 0
    # The pids are read once: a node that exits removes its pid file.
    pids=()
    for pidfile in "$dir"/*/redis.pid; do
      pid=$(cat "$pidfile" 2>/dev/null) || continue
      pids+=("$pid")
      kill "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -9 "$pid" 2>/dev/null || true
    done
    rm -rf "$dir"
    ;;
  *) die "unknown command '$cmd'" ;;
esac
