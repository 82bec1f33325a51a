#!/usr/bin/env bash
# End-to-end checks of the `flatkv` command, run by ctest:
#   cli_test.sh /path/to/flatkv
# The model is the bundled stories260K (data/models/README.md, or $FLATKV_MODEL_DATA), so this
# needs no ../shared data; a missing model file is a failure.
set -euo pipefail
FLATKV=$1
M=${FLATKV_MODEL_DATA:-$(cd "$(dirname "$0")/../.." && pwd)/data/models}
for f in stories260K.bin tok512.bin; do
  [ -f "$M/$f" ] || { echo "FAIL: bundled model file missing: $M/$f"; exit 1; }
done
WORK=$(mktemp -d /var/tmp/flatkv-cli-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

prompt="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball."
gen() { "$FLATKV" generate --model "$M/stories260K.bin" --tokenizer "$M/tok512.bin" --prompt "$prompt" \
          --store "$WORK/store" --block-tokens 16 --max-tokens 24 --json; }
first=$(gen)
second=$(gen)
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
[ "$(field "$first" restored_tokens_ssd)" = "0" ] || fail "first run restored tokens"
[ "$(field "$second" restored_tokens_ssd)" -gt 0 ] || fail "second run restored nothing: $second"
[ "$(field "$first" text)" = "$(field "$second" text)" ] || fail "warm text differs from cold"
[ "$(field "$first" tokens)" = "$(field "$second" tokens)" ] || fail "warm tokens differ from cold"

"$FLATKV" stats --ssd-dir "$WORK/store" --json > "$WORK/stats.json"
python3 -c "import json; s=json.load(open('$WORK/stats.json')); assert s['ssd']['blocks'] > 0, s" || fail "stats shows no blocks"

echo "$prompt" > "$WORK/text.txt"
ppl=$("$FLATKV" perplexity --model "$M/stories260K.bin" --tokenizer "$M/tok512.bin" --text "$WORK/text.txt" --json)
python3 -c "import json,sys; p=json.loads(sys.argv[1])['perplexity']; assert 1 < p < 20, p" "$ppl" || fail "perplexity $ppl"

"$FLATKV" dump-kv --model "$M/stories260K.bin" --tokenizer "$M/tok512.bin" --text "$WORK/text.txt" --out "$WORK/kv.bin" >/dev/null
n=$(python3 -c "import struct; h=open('$WORK/kv.bin','rb').read(40); print(struct.unpack('<8s8I',h)[6])")
size=$(stat -c %s "$WORK/kv.bin")
[ "$size" -eq $((40 + 4*n + 4*5*n*8*(8+2*4))) ] || fail "dump-kv size $size for $n tokens"

"$FLATKV" bench attention --quick --json > "$WORK/attention.json"
python3 -c "
import json; j = json.load(open('$WORK/attention.json')); names = {m['name'] for m in j['methods']}
assert {'snapkv+uniform', 'quest', 'certified_sampler', 'dense'} <= names, names
for m in j['methods']: assert m['attn_output_rel_err'] is None or m['attn_output_rel_err'] >= 0, m
" || fail "bench attention --quick --json"
"$FLATKV" bench sparse-prefill --skip-real --synthetic-tokens 4096 --sample-blocks 4 --synthetic-base-mass 0.7 --json > "$WORK/sparse.json"
python3 -c "
import json; j = json.load(open('$WORK/sparse.json')); runs = j['synthetic'][0]['runs']
modes = {r['mode']: r for r in runs}
assert {'dense', 'rbs', 'base_only', 'base_matched'} <= set(modes), modes
assert modes['dense']['density'] == 1 and modes['rbs']['rescue'] and not modes['base_matched']['rescue'], modes
for r in runs: assert 0 < r['density'] <= 1 and 0 < r['retention'] <= 1 + 1e-5 and r['prefill_attention_speedup'] > 0, r
" || fail "bench sparse-prefill --skip-real --json"
# The daemon: serve, ask it for stats, stop it with SIGTERM (a clean exit), restart warm.
# No tenants: only the Unix socket listens, in its own 0700 directory.
serve() { XDG_CACHE_HOME="$WORK/cache" XDG_RUNTIME_DIR="$WORK" "$FLATKV" serve --shape stories260K \
            --dram-bytes 16MiB --ssd-bytes 64MiB --http none 2>>"$WORK/serve.log" & }
for round in 1 2; do
  serve; pid=$!
  for _ in $(seq 50); do [ -S "$WORK/flatkv/flatkv.sock" ] && break; sleep 0.1; done
  [ "$(stat -c %a "$WORK/flatkv")" = 700 ] || fail "the socket directory is not 0700: $(stat -c %a "$WORK/flatkv")"
  [ "$(stat -c %a "$WORK/flatkv/flatkv.sock")" = 600 ] || fail "the socket is not 0600"
  "$FLATKV" stats --server "unix:$WORK/flatkv/flatkv.sock" --json > "$WORK/served.json" || fail "stats --server"
  python3 -c "import json; s=json.load(open('$WORK/served.json')); assert s['tenants'][0]['name'] == 'default', s" \
    || fail "stats --server JSON"
  kill -TERM $pid; wait $pid || fail "serve did not stop cleanly (round $round): $(cat "$WORK/serve.log")"
done
[ -f "$WORK/cache/flatkv/store/MANIFEST" ] || fail "serve left no store under the cache directory"
"$FLATKV" bench codecs --quick --json --kv "$WORK/kv.bin" > "$WORK/codecs.json"
python3 -c "
import json; j = json.load(open('$WORK/codecs.json'))
assert j['memcpy_gbps'] > 0 and j['zstd1_ratio'] > 1, j
for c in j['codecs']:
    assert c['bits_per_element'] > 0 and c['attn_output_rel_err'] >= 0, c
    assert c['recent_tokens'] or (c['decode_gbps'] > 0 and c['encode_gbps'] > 0), c
" || fail "bench codecs json"

# Every store knob has a flag, and --print-config shows what it set (0: derived by the store).
printed=$(XDG_CACHE_HOME="$WORK/cache" "$FLATKV" serve --session-dram-share-bytes 1GiB --dram-idle-after-ms 5000 \
            --ssd-admission on-reuse --readmit-on-restore false --window-layers 6 --print-config) \
  || fail "serve --print-config with knob flags"
for line in "session_dram_share_bytes = 1073741824" "dram_idle_after_ms = 5000" 'ssd_admission = "on-reuse"' \
            "readmit_on_restore = false" "window_layers = 6" "ssd_write_buffer_bytes = 0"; do
  grep -qF "$line" <<<"$printed" || fail "serve --print-config lacks '$line': $printed"
done

# bench serve: restores from DRAM copies through the daemon, and lookups (docs/service.md).
"$FLATKV" bench serve --quick --clients 4 --blocks 2 --reps 1 --lookup-seconds 0.2 --no-peers --dir "$WORK" --json \
  > "$WORK/serve.json" || fail "bench serve"
python3 -c "
import json; j = json.load(open('$WORK/serve.json'))
assert j['inproc_restore_gbps'] > 0 and j['shm_restore_gbps'] > 0 and j['lookup_p99_us'] > 0, j
assert j['chain_lookup_p99_us'] > 0, j
" || fail "bench serve json"
# bench engine on stories260K: the JSON contract of issue 31, llama.cpp's fields null (not a GGUF file).
"$FLATKV" bench engine --prompt-tokens 200 --block-tokens 16 --decode-tokens 4 --reps 1 --dir "$WORK" --json \
  > "$WORK/engine.json" 2>"$WORK/engine.err" || fail "bench engine: $(cat "$WORK/engine.err")"
python3 -c "
import json; j = json.load(open('$WORK/engine.json'))
assert len(j['model']['sha256']) == 64 and j['model']['file'].endswith('stories260K.bin'), j['model']
assert j['threads'] >= 1 and len(j['runs']) == 1, j
r = j['runs'][0]
assert r['prompt_tokens'] == 200 and r['restored_bytes'] == 192 * j['config']['kv_bytes_per_token'], r
for k in ('ttft_cold_ms', 'ttft_dram_ms', 'ttft_ssd_ms', 'raw_ssd_gbps', 'prefill_tok_s', 'decode_tok_s'):
    assert r[k] > 0, (k, r)
assert r['llamacpp_prefill_tok_s'] is None and r['llamacpp_decode_tok_s'] is None and r['prefill_vs_llamacpp'] is None, r
assert j['goals']['ssd_over_bound'] == r['ssd_over_bound'] and j['goals']['prefill_vs_llamacpp_met'] is None, j['goals']
" || fail "bench engine json"
grep -q "llama.cpp: not run" "$WORK/engine.err" || fail "bench engine did not say llama.cpp was not run: $(cat "$WORK/engine.err")"
# The Redis GET baseline runs whenever redis-server is installed (install-deps.sh installs it).
if command -v redis-server >/dev/null; then
  python3 -c "
import json; j = json.load(open('$WORK/serve.json'))
assert j['redis_get_p99_us'] > 0 and j['redis']['gets_per_second'] > 0, j['redis']
assert 'get_p99_us' in j['redis']['redis_benchmark'] or not '$(command -v redis-benchmark)', j['redis']
assert j['goals']['lookup_vs_redis_met'] in (True, False), j['goals']
" || fail "bench serve: the Redis baseline"
fi

# bench remote: its own local Redis Cluster (scripts/redis-cluster.sh), the three layouts, and a
# master killed during restores: no wrong block, and whole restores after the failover.
if command -v redis-server >/dev/null; then
  "$FLATKV" bench remote --quick --blocks 2 --reps 1 --dir "$WORK" --json > "$WORK/remote.json" || fail "bench remote"
  python3 -c "
import json; j = json.load(open('$WORK/remote.json'))
assert j['remote_restore_gbps'] > 0 and j['tier_restore_gbps'] > 0 and j['raw_get_gbps'] > 0 and j['per_chunk_layout_gbps'] > 0, j
assert j['remote_first_layer_ms'] > 0 and j['per_chunk_first_layer_ms'] > 0, j
assert j['failover_wrong_blocks'] == 0 and j['failover']['restores_ok_after_kill'] > 0, j['failover']
" || fail "bench remote json"
elif [ "${CI:-}" = true ]; then
  fail "redis-server is not installed (scripts/install-deps.sh installs it)"
fi

# bench restore: every run delivers the session and is verified (a failed verification exits 1).
"$FLATKV" bench restore --sizes-mib 1,4 --reps 1 --no-peers --dir "$WORK" --json > "$WORK/restore.json" || fail "bench restore"
python3 -c "
import json; j = json.load(open('$WORK/restore.json'))
for row in j['sizes']:  # each size's first-layer figure is its own restores' (not pooled with the sizes before)
    assert row['runs']['ssd_restore']['info']['first_layer_samples'] == row['reps'], row
runs = j['sizes'][1]['runs']
for r in ('memcpy', 'raw_direct_read', 'dram_restore', 'ssd_restore', 'files_per_block', 'rocksdb', 'rocksdb_blobdb'):
    assert runs[r]['median_gbps'] > 0, (r, runs.get(r))
assert runs['files_per_block']['info']['worker_threads'] == 4, runs['files_per_block']['info']
assert runs['rocksdb_blobdb']['info']['enable_blob_files'] and runs['rocksdb_blobdb']['info']['use_direct_reads']
row = j['sizes'][0]
assert row['ssd_over_rocksdb'] > 0 and row['ssd_over_rocksdb_blobdb'] > 0 and j['rocksdb_blobdb_gbps'] > 0, row
" || fail "bench restore json"

# bench gpu on the CPU copy backend (no GPU here): the GPU window's DRAM path (DMA from the arena)
# and both SSD paths (file reads straight into device memory, the CPU backend's pread standing
# for cuFile, and the pinned bounce window) deliver every block (bench gpu exits 1 when one is
# short), every byte of the first by file reads, and the SSD figures read the SSD (its store has
# no DRAM copies); a kivi-coded DRAM store restores both decoded on the device from its encoded
# slices (the CPU backend's decoder standing for the CUDA ones, under half the bytes carried) and
# decoded on the host.
"$FLATKV" bench gpu --backend cpu --blocks 8 --reps 1 --dir "$WORK" --json > "$WORK/gpu.json" || fail "bench gpu --backend cpu"
python3 -c "
import json; j = json.load(open('$WORK/gpu.json'))
assert j['dram_valid_blocks'] == 8 and j['ssd_valid_blocks'] == 8 and j['ssd_bounce_valid_blocks'] == 8, j
assert j['dram_path'] == 'dma-from-arena' and j['ssd_path'] == 'cpu-pread', j
assert j['ssd_file_read_bytes'] == j['restored_bytes'] and j['ssd_bounce_bytes'] == 0, j
assert j['dram_kivi_valid_blocks'] == 8 and j['dram_kivi_host_decode_valid_blocks'] == 8, j
assert j['dram_kivi_path'] == 'device-decode' and 0 < j['dram_kivi_carried_bytes'] < j['restored_bytes'] / 2, j
assert j['ssd_delivered_bytes'] >= 2 * j['restored_bytes'] and j['ssd_store_dram_delivered_bytes'] == 0, j
for k in ('h2d_pinned_gbps', 'dram_to_gpu_gbps', 'raw_ssd_read_gbps', 'ssd_to_gpu_gbps', 'ssd_bounce_to_gpu_gbps',
          'dram_kivi_to_gpu_gbps', 'dram_kivi_host_decode_to_gpu_gbps'):
    assert j[k] > 0, (k, j)
" || fail "bench gpu json"

# bench metadata: memory per block, lookups, recovery after kill -9, space efficiency (docs/benchmarks.md).
"$FLATKV" bench metadata --quick --blocks 5000 --layers-80-blocks 500 --lookups 2000 --dir "$WORK" --json \
  > "$WORK/metadata.json" || fail "bench metadata"
python3 -c "
import json; j = json.load(open('$WORK/metadata.json'))
assert [(r['layers'], r['blocks'], r['codec']) for r in j['runs']] == [(1, 5000, 'raw'), (80, 500, 'raw')], j['runs']
for r in j['runs']:
    assert 0 < r['index_bytes_per_block'] < 100000 and r['index_rss_bytes_per_block'] > 0, r
    assert r['put_ns_p50'] > 0 and 0 < r['lookup_ns_p50'] <= r['lookup_ns_p99'] <= r['lookup_ns_max'], r
    assert r['lookup_at_1pct']['misses'] == 0 and r['fill']['memory_full']['lookup']['misses'] == 0, r
    assert r['lookup_p99_growth'] > 0 and r['recovery_s'] > 0 and r['recovery_s_per_10m_blocks'] > 0, r
    assert r['recovery']['recovered_blocks'] == r['blocks'] and r['recovery']['page_cache'], r['recovery']
    assert 0 < r['space_efficiency'] <= 1, r['space']
    assert r['space']['extents_allocated_bytes'] >= 3 * r['space']['capacity_bytes'], r['space']
    assert r['projection_100m']['index_bytes'] == r['index_bytes_per_block'] * 1e8, r['projection_100m']
    assert set(r['goals']) >= {'index_met', 'projection_met', 'lookup_growth_met', 'space_met', 'recovery_met'}, r
assert j['goals']['largest_1_layer_blocks'] == 5000 and not j['goals']['blocks_met'], j['goals']
assert j['config']['session_sizes'], j['config']
" || fail "bench metadata json"

# A generated multi-turn workload replays like a trace (docs/format_trace.md).
out=$("$FLATKV" replay --workload multiturn:clients=3,rounds=3,turn_tokens=256,output_tokens=16,request_rate=2 \
  --policy infinite --load 1 --json) || fail "replay --workload"
grep -q '"trace_name": "multiturn:clients=3,rounds=3,' <<<"$out" || fail "replay --workload trace name"
grep -q '"requests": 9' <<<"$out" || fail "replay --workload request count"

# replay: a short replay on a node profile; with --json stdout is the JSON alone.
TR=$(cd "$(dirname "$0")/../.." && pwd)/data/traces/claude-code-subset
"$FLATKV" replay --trace "$TR" --hw h100-node --policy flat,tiered,files,infinite --max-requests 60 --load 1 \
  --orders 2 --dram 16GiB --ssd 256GiB --json > "$WORK/replay.json"
python3 -c "
import json; j = json.load(open('$WORK/replay.json'))
assert j['hw']['name'] == 'h100-node' and j['model']['name'] == 'llama-3.1-70b' and j['model']['tp'] == 4, j['hw']
assert 'nvme_read_gbps' in j['hw']['sources'], j['hw']
assert [r['policy'] for r in j['results']] == ['flat', 'tiered', 'files', 'infinite'], j['results']
for r in j['results']:
    for k in ('policy', 'load', 'hit_rate', 'ttft_mean_ms', 'ttft_p99_ms', 'ssd_read_amplification', 'total_tok_s',
              'ttft_mean_ms_min', 'ttft_mean_ms_max'):
        assert k in r, (k, r)
    assert r['orders'] == 2 and r['ttft_mean_ms_min'] <= r['ttft_mean_ms'] * 1.0001 <= r['ttft_mean_ms_max'] * 1.0002, r
    assert r['total_tok_s'] > 0 and 0 <= r['hit_rate'] <= 1, r
" || fail "replay json"
"$FLATKV" replay --trace "$TR" --policy infinite --max-requests 40 --orders 1 --json > "$WORK/auto.json"
python3 -c "
import json; j = json.load(open('$WORK/auto.json')); c = j['config']['capacity_load']
assert j['config']['load_auto'] and c > 0, j['config']
assert [round(r['load'] / c, 6) for r in j['results']] == [0.5, 1.0, 2.0], j['results']
" || fail "replay --load auto"
# --nodes: each node its own store, all sharing a remote tier; local hits beside global ones.
"$FLATKV" replay --trace "$TR" --hw h100-node --policy flat --max-requests 60 --load 1 --orders 1 --nodes 2 \
  --routing round-robin --dram 16GiB --ssd 256GiB --json > "$WORK/nodes.json" || fail "replay --nodes"
python3 -c "
import json; j = json.load(open('$WORK/nodes.json')); c = j['config']; r = j['results'][0]
assert c['nodes'] == 2 and c['routing'] == 'round-robin' and c['remote_bytes_per_node'] == 16 * 2**30, c
assert r['nodes'] == 2 and r['routing'] == 'round-robin' and r['instances'] == 4, r
assert r['remote_hit_blocks'] > 0 and r['remote_published_blocks'] > 0, r
assert r['hit_rate'] > r['local_hit_rate'] >= 0, r
" || fail "replay --nodes json"
"$FLATKV" replay --calibrate-serving --json > "$WORK/calibrate.json" || fail "replay --calibrate-serving"
python3 -c "
import json; j = json.load(open('$WORK/calibrate.json'))
assert {x['hw'] for x in j} == {'h100-node', 'h200-node'} and all(abs(x['error']) <= 0.25 for x in j), j
" || fail "calibrate-serving json"

# Bad arguments: a clear message and exit code 2, never a crash.
set +e
"$FLATKV" serve --ssd-admission sometimes --print-config >"$WORK/bad.txt" 2>&1; [ $? -eq 2 ] || fail "serve --ssd-admission sometimes"
grep -qF -- "--ssd-admission: ssd_admission 'sometimes' is not one of all, on-reuse" "$WORK/bad.txt" || fail "message: $(cat "$WORK/bad.txt")"
"$FLATKV" serve --window-layers=-2 --print-config >"$WORK/bad.txt" 2>&1; [ $? -eq 2 ] || fail "serve --window-layers=-2"
grep -qF -- "--window-layers: -2 is outside" "$WORK/bad.txt" || fail "message: $(cat "$WORK/bad.txt")"
err=$("$FLATKV" replay --workload multiturn:clients=3,rouns=2 2>&1 >/dev/null); rc=$?
[ $rc -eq 2 ] && grep -q "unknown key 'rouns'" <<<"$err" || fail "replay --workload with an unknown key: $rc $err"
"$FLATKV" replay >/dev/null 2>&1; [ $? -eq 2 ] || fail "replay with neither --trace nor --workload"
"$FLATKV" replay --trace "$WORK" --workload multiturn >/dev/null 2>&1; [ $? -eq 2 ] || fail "replay with both"
msg=$("$FLATKV" replay --trace "$TR" --hw tpu-pod 2>&1 >/dev/null); [ $? -eq 2 ] || fail "replay --hw unknown"
case "$msg" in *"known: h100-node, h200-node, vm"*) ;; *) fail "replay --hw unknown: $msg" ;; esac
sed 's/^hbm_tbps_source/hbm_tbps_note/' "$(dirname "$0")/../../data/hw/profiles.toml" > "$WORK/hw.toml"
msg=$("$FLATKV" replay --trace "$TR" --hw-file "$WORK/hw.toml" 2>&1 >/dev/null); [ $? -eq 2 ] || fail "replay uncited figure"
case "$msg" in *"hbm_tbps: no citation"*) ;; *) fail "replay uncited figure: $msg" ;; esac
"$FLATKV" replay --trace "$TR" --load fast >/dev/null 2>&1; [ $? -eq 2 ] || fail "replay --load fast"
msg=$("$FLATKV" replay --trace "$TR" --nodes 2 --io real 2>&1 >/dev/null); [ $? -eq 2 ] || fail "replay --nodes --io real"
case "$msg" in *"use it with --io model"*) ;; *) fail "replay --nodes --io real: $msg" ;; esac
"$FLATKV" replay --trace "$TR" --nodes 2 --routing random >/dev/null 2>&1; [ $? -eq 2 ] || fail "replay --routing random"
msg=$("$FLATKV" replay --trace "$TR" --nodes 2 --remote 1XB 2>&1 >/dev/null); [ $? -eq 2 ] || fail "replay --remote 1XB"
case "$msg" in *"--remote: '1XB': unknown unit"*) ;; *) fail "replay --remote 1XB: $msg" ;; esac
grep -v '^remote_' "$(dirname "$0")/../../data/hw/profiles.toml" > "$WORK/hw-local.toml"
msg=$("$FLATKV" replay --trace "$TR" --hw-file "$WORK/hw-local.toml" --nodes 2 2>&1 >/dev/null); [ $? -eq 2 ] || fail "replay --nodes, no remote figures"
case "$msg" in *"h100-node: the profile has no remote_gbps"*) ;; *) fail "replay --nodes, no remote figures: $msg" ;; esac
"$FLATKV" bench attention --threads 0 >/dev/null 2>&1; [ $? -eq 2 ] || fail "bench attention --threads 0"
msg=$("$FLATKV" bench sparse-prefill --chunk 100 2>&1 >/dev/null); [ $? -eq 2 ] || fail "bench sparse-prefill --chunk 100"
case "$msg" in *"--chunk 100 must be a multiple of --block 64"*) ;; *) fail "bench sparse-prefill --chunk 100: $msg" ;; esac
msg=$("$FLATKV" bench rift --modes sometimes 2>&1 >/dev/null); [ $? -eq 2 ] || fail "bench rift --modes sometimes"
case "$msg" in *"got 'sometimes'"*) ;; *) fail "bench rift --modes sometimes: $msg" ;; esac
"$FLATKV" generate --model "$WORK/missing.bin" --prompt x >/dev/null 2>&1; [ $? -eq 2 ] || fail "missing model"
"$FLATKV" stats --ssd-dir "$WORK/nothing" >/dev/null 2>&1; [ $? -eq 2 ] || fail "stats on an empty dir"
"$FLATKV" bench restore --sizes-mib 0 >/dev/null 2>&1; [ $? -eq 2 ] || fail "bench with size 0"
msg=$("$FLATKV" bench metadata --runs 1y100 2>&1 >/dev/null); [ $? -eq 2 ] || fail "bench metadata --runs 1y100"
case "$msg" in *"'1y100' is not LAYERSxBLOCKS[:CODEC]"*) ;; *) fail "bench metadata --runs 1y100: $msg" ;; esac
msg=$("$FLATKV" bench metadata --runs 1x1000:nosuch 2>&1 >/dev/null); [ $? -eq 2 ] || fail "bench metadata unknown codec"
case "$msg" in *"run 1x1000:nosuch"*) ;; *) fail "bench metadata unknown codec: $msg" ;; esac
"$FLATKV" bench metadata --put-blocks 0 >/dev/null 2>&1; [ $? -eq 2 ] || fail "bench metadata --put-blocks 0"
"$FLATKV" serve --tcp 0.0.0.0:7471 --print-config >/dev/null 2>&1; [ $? -eq 2 ] || fail "serve on a non-loopback address"
msg=$("$FLATKV" serve --tcp 127.0.0.1:7471 --print-config 2>&1); [ $? -eq 2 ] || fail "serve --tcp without tenants"
case "$msg" in *"needs at least one [[tenants]] entry"*) ;; *) fail "serve --tcp without tenants: $msg" ;; esac
"$FLATKV" stats --server bogus >/dev/null 2>&1; [ $? -eq 2 ] || fail "stats --server with a bad address"
head -c 1000 /dev/urandom > "$WORK/junk.bin"
"$FLATKV" bench codecs --quick --kv "$WORK/junk.bin" >/dev/null 2>&1; [ $? -eq 2 ] || fail "bench codecs on a junk dump"
"$FLATKV" generate --model "$WORK/junk.bin" --tokenizer "$M/tok512.bin" --prompt x >/dev/null 2>&1; [ $? -eq 2 ] || fail "junk model"
# `flatkv model`: tokenize, then greedy is what generate runs, and score's last row picks its first token.
MB=(--model "$M/stories260K.bin" --tokenizer "$M/tok512.bin")
"$FLATKV" model tokenize "${MB[@]}" --text "$prompt" > "$WORK/ids.json" || fail "model tokenize"
greedy=$("$FLATKV" model greedy "${MB[@]}" --tokens-file "$WORK/ids.json" --steps 24 --json) || fail "model greedy"
plain=$("$FLATKV" generate "${MB[@]}" --prompt "$prompt" --max-tokens 24 --json) || fail "generate"
[ "$(field "$greedy" tokens)" = "$(field "$plain" tokens)" ] || fail "model greedy differs from generate: $greedy"
"$FLATKV" model score "${MB[@]}" --tokens-file "$WORK/ids.json" --out "$WORK/logits.f32" --prefill-chunk 7 >/dev/null ||
  fail "model score"
python3 - "$WORK/ids.json" "$WORK/logits.f32" "$greedy" <<'PY' || fail "model score"
import array, json, sys
ids = json.load(open(sys.argv[1]))
assert ids[0] == 1, "llama2.c prompts start with BOS"
logits = array.array("f", open(sys.argv[2], "rb").read())
assert len(logits) == len(ids) * 512, (len(logits), len(ids))
last = logits[-512:]
assert max(range(512), key=last.__getitem__) == json.loads(sys.argv[3])["tokens"][0]
PY
echo '[1, 600]' > "$WORK/bad_ids.json"
msg=$("$FLATKV" model score "${MB[@]}" --tokens-file "$WORK/bad_ids.json" --out "$WORK/x.f32" 2>&1); [ $? -eq 2 ] ||
  fail "model score with an id outside the vocabulary"
case "$msg" in *"token 1 is 600"*) ;; *) fail "model score with an id outside the vocabulary: $msg" ;; esac
"$FLATKV" model tensors "${MB[@]}" --out "$WORK/t" >/dev/null 2>&1; [ $? -eq 2 ] || fail "model tensors of a .bin"
msg=$(FLATKV_SMOLLM2="$WORK/missing.gguf" "$FLATKV" bench engine --model smollm2-135m 2>&1 >/dev/null); [ $? -eq 2 ] || fail "bench engine without the SmolLM2 file"
case "$msg" in *"$WORK/missing.gguf"*"scripts/install-deps.sh models"*) ;; *) fail "bench engine without the SmolLM2 file: $msg" ;; esac
set -e
echo "cli checks passed"
