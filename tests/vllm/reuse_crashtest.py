"""The reuse crash test: flatkv's vLLM connector under vLLM's own Scheduler, against a real
`flatkv serve`, for as long as asked, with the daemon killed, restarted, stopped and its SSD
corrupted between and during rounds (docs/vllm.md, "The reuse crash test").

Each round is a fresh engine (a fresh vLLM process: an empty prefix cache, new connectors; see
tests/vllm/sched_harness.py) given a random batch: prompts drawn from a few shared prefixes with
diverging tails, random `cache_salt`s and LoRA adapters (two names, one of them re-pointed at
other weights halfway through), random output lengths, and a KV space small enough that vLLM
preempts. Between rounds the daemon is killed (-9) and restarted, stopped for a moment
(SIGSTOP/SIGCONT) while requests arrive, or restarted over an SSD with a byte flipped in its
segments. The oracle, per request: every row it attended to was its own prefix's, every byte
restored into vLLM's blocks was the byte saved, and its output equals the same request's in an
engine without flatkv. A failure prints the round's seed.

    python tests/vllm/reuse_crashtest.py --seconds 60 [--seed N] [--tp 1]
(run by tests/vllm/run_vllm_tests.sh's environment: FLATKV_BINARY and FLATKV_VLLM_MODEL set).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))

import sched_harness as H  # noqa: E402

BT = 64


def _lora(tmp: pathlib.Path, name: str, version: int):
    import numpy as np
    from vllm.lora.request import LoRARequest
    d = tmp / f"lora-{name}-{version}"
    d.mkdir(exist_ok=True)
    (d / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}')
    (d / "adapter_model.safetensors").write_bytes(np.random.default_rng(version * 7 + len(name)).bytes(200_000))
    return LoRARequest(lora_name=name, lora_int_id=1 if name == "a" else 2, lora_path=str(d))


class _Daemon:
    def __init__(self, tmp: pathlib.Path, shape: dict):
        from daemon_util import Daemon, serve_binary
        self.d = Daemon(serve_binary(), tmp, shape=shape,
                        block_tokens=BT, dram_bytes="64MiB", ssd_bytes="512MiB", segment_bytes="32MiB")
        self.ssd = tmp / "ssd"

    def start(self):
        self.d.start().close()

    def kill(self):
        if self.d.proc is not None:
            self.d.proc.kill()
            self.d.proc.wait()
            self.d.proc = None

    def corrupt(self, rng: random.Random) -> int:
        """Flips one byte in each of a few 4 KiB pages of the SSD segments (the daemon is down)."""
        flipped = 0
        for seg in sorted(self.ssd.glob("**/seg-*.dat")):
            size = seg.stat().st_size
            if size < 8192:
                continue
            with open(seg, "r+b") as f:
                for _ in range(4):
                    at = rng.randrange(0, size)
                    f.seek(at)
                    b = f.read(1)
                    f.seek(at)
                    f.write(bytes([b[0] ^ 0x5A]))
                    flipped += 1
        return flipped


def run(seconds: float, seed: int, tp: int = 1, log=print) -> dict:
    rng = random.Random(seed)
    base = H.base_config()
    shape = dict(kind="mha", layers=30, kv_heads=3 // tp, head_dim=64, dtype="f32")
    totals = {"rounds": 0, "requests": 0, "mismatched_outputs": 0, "wrong_positions": 0,
              "wrong_loaded_bytes": 0, "hit_tokens": 0, "loaded_blocks": 0, "load_error_blocks": 0,
              "kills": 0, "stops": 0, "corruptions": 0, "seed": seed}
    with tempfile.TemporaryDirectory(prefix="flatkv-reuse-crash-") as tmpdir:
        tmp = pathlib.Path(tmpdir)
        daemon = _Daemon(tmp, shape)
        daemon.start()
        extra = {"flatkv.socket": "unix:" + daemon.d.socket, "flatkv.token": "python-tenant-a-token-0123",
                 "flatkv.lookup_wait_ms": 20, "flatkv.lookup_deadline_ms": 3000,
                 "flatkv.request_deadline_ms": 3000}
        loras = {"a": _lora(tmp, "a", 1), "b": _lora(tmp, "b", 1)}
        prefixes = [[rng.randrange(1, 40000) for _ in range(rng.choice([192, 320, 448]))] for _ in range(3)]
        t_end = time.monotonic() + seconds
        try:
            while time.monotonic() < t_end:
                rseed = rng.randrange(1 << 30)
                r = random.Random(rseed)
                if totals["rounds"] == 4:  # re-point adapter "a" at other weights under the same name
                    loras["a"] = _lora(tmp, "a", 2)
                jobs = []
                for _ in range(r.randint(2, 6)):
                    pre = r.choice(prefixes)
                    tail = [r.randrange(1, 40000) for _ in range(r.randint(1, 200))]
                    opts = {"max_tokens": r.randint(1, 24)}
                    salt = r.choice([None, None, "s1", "s2"])
                    if salt:
                        opts["salt"] = salt
                    lname = r.choice([None, None, "a", "b"])
                    if lname:
                        opts["lora"] = loras[lname]
                    jobs.append((pre[:r.randint(1, len(pre))] + tail, opts))
                num_blocks = r.choice([16, 24, 32, 64])  # small: vLLM preempts while requests grow
                event = r.choice(["none"] * 3 + ["kill", "stop", "corrupt"]) if totals["rounds"] else "none"
                if event == "kill":
                    daemon.kill()
                    daemon.start()
                    totals["kills"] += 1
                elif event == "corrupt":
                    daemon.kill()
                    daemon.corrupt(r)
                    daemon.start()
                    totals["corruptions"] += 1
                vc = H.with_settings(base, tp=tp, extra=extra)
                e = H.Engine(vc, num_blocks=num_blocks)
                ids = [e.add(p, **o) for p, o in jobs]
                stopped = False
                try:
                    if event == "stop":
                        os.kill(daemon.d.proc.pid, signal.SIGSTOP)
                        stopped = True
                        totals["stops"] += 1
                        t0 = time.monotonic()
                        while time.monotonic() - t0 < 0.5 and e.sched.has_requests():
                            e.step()
                        os.kill(daemon.d.proc.pid, signal.SIGCONT)
                        stopped = False
                    out = e.run()
                finally:
                    if stopped:
                        os.kill(daemon.d.proc.pid, signal.SIGCONT)
                    e.shutdown()
                ref = H.Engine(H.with_settings(base, tp=tp), num_blocks=num_blocks)
                ref_ids = [ref.add(p, **o) for p, o in jobs]
                ref_out = ref.run()
                mism = sum(out[a] != ref_out[b] for a, b in zip(ids, ref_ids))
                totals["rounds"] += 1
                totals["requests"] += len(jobs)
                totals["mismatched_outputs"] += mism
                totals["wrong_positions"] += e.wrong_positions
                totals["wrong_loaded_bytes"] += e.wrong_loaded_bytes
                totals["hit_tokens"] += e.stat("hit_tokens")
                totals["loaded_blocks"] += e.loaded_blocks
                totals["load_error_blocks"] += e.load_error_blocks
                if mism or e.wrong_positions or e.wrong_loaded_bytes:
                    log(f"reuse crashtest: round seed {rseed} ({event}) FAILED: {mism} outputs differ, "
                        f"{e.wrong_positions} wrong rows, {e.wrong_loaded_bytes} wrong restored bytes")
                    break
        finally:
            daemon.kill()
    return totals


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--tp", type=int, default=1)
    a = ap.parse_args()
    t = run(a.seconds, a.seed, a.tp)
    print(json.dumps(t))
    ok = not (t["mismatched_outputs"] or t["wrong_positions"] or t["wrong_loaded_bytes"])
    print(f"reuse crashtest: {t['requests']} requests in {t['rounds']} rounds, {t['hit_tokens']} tokens "
          f"restored, {t['kills']} kills, {t['stops']} stops, {t['corruptions']} corruptions: "
          f"{'0 wrong' if ok else 'FAILED'}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
