"""flatkv's vLLM connector under vLLM's own Scheduler, with no model (tests/vllm/sched_harness.py).

Each test runs vLLM 0.32's `Scheduler` (or `AsyncScheduler`) with the connector it builds, and
one worker connector per parallel rank over fake paged caches, against a real `flatkv serve`.
A fresh `Engine` is a fresh vLLM process (an empty prefix cache, a new connector). The oracle:
every row a request attends to is the one its prefix computes (`wrong_positions`), every
restored byte is the saved one (`wrong_loaded_bytes`), and outputs equal an engine without the
connector. Covered: keys (salts, LoRA adapters by name and content, prompt embeds), tensor and
pipeline parallelism, preemption and resumption, chunked prefill of a restored request, several
loads and saves in a step, aborts, async scheduling, and a daemon absent, stopped or of the
wrong shape.
"""
import copy
import os
import signal
import sys
import time

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "python", "tests"))
from daemon_util import TOKEN_A, Daemon, serve_binary  # noqa: E402
import sched_harness as H  # noqa: E402

BT = 64
SMOL = dict(kind="mha", layers=30, kv_heads=3, head_dim=64, dtype="f32")


@pytest.fixture(scope="module")
def base():
    if not H.M:
        pytest.skip("FLATKV_VLLM_MODEL is not set (tests/vllm/run_vllm_tests.sh sets it)")
    return H.base_config()


def make_daemon(tmp_path, shape=None, name="d"):
    path = tmp_path / name
    path.mkdir(exist_ok=True)
    return Daemon(serve_binary(), path, shape=shape or SMOL, block_tokens=BT, dram_bytes="256MiB",
                  ssd_bytes="1GiB", segment_bytes="64MiB")


@pytest.fixture
def daemon(tmp_path):
    d = make_daemon(tmp_path)
    d.start().close()
    yield d
    d.stop()


def conn(d, **more):
    c = {"flatkv.socket": "unix:" + d.socket, "flatkv.token": TOKEN_A, "flatkv.lookup_wait_ms": 50}
    c.update(more)
    return c


def prompt(n, seed):
    return [int(t) for t in np.random.default_rng(seed).integers(1, 40000, n)]


def run(vc, jobs, num_blocks=64, **kw):
    """Runs requests [(prompt, options)] to completion in a fresh engine; returns it and outputs."""
    e = H.Engine(vc, num_blocks=num_blocks)
    ids = [e.add(p, **o) for p, o in jobs]
    try:
        out = e.run()
    finally:
        e.shutdown()
    return e, [out[i] for i in ids]


def hits(e):
    return e.stat("hit_tokens")


def assert_exact(e):
    assert e.wrong_positions == 0, f"{e.wrong_positions} attended rows were not their prefix's"
    assert e.wrong_loaded_bytes == 0, f"{e.wrong_loaded_bytes} restored bytes differ from the saved ones"


def lora(tmp_path, name, content):
    from vllm.lora.request import LoRARequest
    d = tmp_path / f"lora-{name}-{content}"
    d.mkdir(exist_ok=True)
    (d / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}')
    (d / "adapter_model.safetensors").write_bytes(np.random.default_rng(content).bytes(300_000))
    return LoRARequest(lora_name=name, lora_int_id=abs(hash(name)) % 1000 + 1, lora_path=str(d))


def test_keys_share_exactly_what_vllms_prefix_cache_shares(base, daemon, tmp_path):
    import torch
    vc = H.with_settings(base, extra=conn(daemon))
    p = prompt(700, 1)
    la, la2, lb = lora(tmp_path, "a", 1), lora(tmp_path, "a", 2), lora(tmp_path, "b", 1)
    emb1 = torch.from_numpy(np.random.default_rng(5).random((300, 576), np.float32))
    emb2 = torch.from_numpy(np.random.default_rng(6).random((300, 576), np.float32))
    stored, out1 = run(vc, [(p, {}), (p, {"salt": "s1"}), (p, {"lora": la}), (None, {"embeds": emb1})])
    assert_exact(stored)
    assert hits(stored) == 0 and stored.stat("save_blocks") > 0
    full = (700 - 1) // BT * BT
    cases = [  # (prompt, options, expected hit tokens in a fresh process)
        (p, {}, full),  # the same prompt: every full block but the last token's
        (p, {"salt": "s1"}, full),  # the same salt
        (p, {"salt": "s2"}, 0),  # another salt: vLLM's hash differs
        (p, {"lora": la}, full),  # the same adapter, name and content
        (p, {"lora": la2}, 0),  # the same name re-pointed at other weights: never the old KV
        (p, {"lora": lb}, 0),  # another adapter
        (None, {"embeds": emb1}, (300 - 1) // BT * BT),  # the same prompt embeds
        (None, {"embeds": emb2}, 0),  # other embeds of the same length (token ids all 0)
    ]
    for prompt_ids, opts, want in cases:
        e, out = run(vc, [(prompt_ids, opts)])
        assert_exact(e)
        assert hits(e) == want, (opts, hits(e), want)
        alone, ref = run(H.with_settings(base), [(prompt_ids, opts)])
        assert out == ref, opts
    assert out1[0] == run(H.with_settings(base), [(p, {})])[1][0]


@pytest.mark.parametrize("tp,pp", [(3, 1), (1, 2)])
def test_parallel_ranks_restore_their_own_heads_and_layers(base, tmp_path, tp, pp):
    shape = dict(SMOL, kv_heads=3 // tp, layers=30 // pp)
    d = make_daemon(tmp_path, shape)
    d.start().close()
    try:
        vc = H.with_settings(base, tp=tp, pp=pp, extra=conn(d))
        ps = [prompt(640, 10 + i) for i in range(3)]
        stored, out1 = run(vc, [(p, {}) for p in ps])
        assert_exact(stored)
        # Every rank saved its own blocks: the daemon holds a distinct block per rank.
        import flatkv
        s = flatkv.Store.connect("unix:" + d.socket, token=TOKEN_A)
        blocks = s.stats()["store"]["ssd"]["blocks"]
        s.close()
        e, out2 = run(vc, [(p, {}) for p in ps])
        assert_exact(e)
        assert hits(e) == 3 * ((640 - 1) // BT) * BT
        assert e.stat("load_blocks") == tp * pp * 3 * ((640 - 1) // BT)
        assert out2 == out1 == run(H.with_settings(base, tp=tp, pp=pp), [(p, {}) for p in ps])[1]
        assert blocks >= tp * pp * 3 * ((640 - 1) // BT)
        # A store shaped for another split of the model is refused at start, by name.
        with pytest.raises(ValueError, match="KV heads per rank" if tp > 1 else "layers"):
            H.Engine(H.with_settings(base, extra=conn(d)))
    finally:
        d.stop()


def test_an_fp8_kv_cache_is_stored_as_its_bytes_under_a_namespace_naming_its_format(base, tmp_path):
    """vLLM's --kv-cache-dtype fp8 (e4m3; vLLM allocates it as uint8): the daemon's store is shaped
    fp8_e4m3 and keeps the bytes as they are. Restored bytes equal the saved ones and outputs equal
    vLLM alone's; an fp8_e5m2 cache, or a store shaped for floats, never meets them."""
    def fp8(vc, cache_dtype="fp8"):
        vc.cache_config = copy.copy(vc.cache_config)
        vc.cache_config.cache_dtype = cache_dtype
        return vc

    d = make_daemon(tmp_path, dict(SMOL, dtype="fp8_e4m3"))
    d.start().close()
    try:
        vc = fp8(H.with_settings(base, extra=conn(d)))
        ps = [prompt(640, 40 + i) for i in range(2)]
        stored, out1 = run(vc, [(p, {}) for p in ps])
        assert_exact(stored)
        assert stored.stat("save_blocks") >= 2 * ((640 - 1) // BT)
        e, out2 = run(vc, [(p, {}) for p in ps])
        assert_exact(e)
        assert hits(e) == 2 * ((640 - 1) // BT) * BT
        assert out2 == out1 == run(fp8(H.with_settings(base)), [(p, {}) for p in ps])[1]
        # The same bytes read as e5m2 are other values: a store shaped fp8_e4m3 is refused for it,
        # naming both formats, and so is an fp8 cache against a float store (below).
        with pytest.raises(ValueError, match="fp8_e5m2 elements but the flatkv store's shape has dtype fp8_e4m3"):
            H.Engine(fp8(H.with_settings(base, extra=conn(d)), "fp8_e5m2"))
    finally:
        d.stop()
    f = make_daemon(tmp_path, SMOL, name="f32")
    f.start().close()
    try:
        with pytest.raises(ValueError, match="fp8_e4m3 elements but the flatkv store's shape has dtype f32"):
            H.Engine(fp8(H.with_settings(base, extra=conn(f))))
        with pytest.raises(ValueError, match="kv_cache_dtype 'fp8_per_token_head' is not one flatkv stores"):
            H.Engine(fp8(H.with_settings(base, extra=conn(f)), "fp8_per_token_head"))
    finally:
        f.stop()


def test_preemption_resumes_with_its_restore_and_outputs_equal_vllm_alone(base, daemon):
    vc = H.with_settings(base, extra=conn(daemon))
    ps = [prompt(600, 20 + i) for i in range(8)]
    jobs = [(p, {"max_tokens": 96}) for p in ps]
    # 32 blocks of 64 tokens: vLLM admits three requests of 10 blocks, each grows to 11 while it
    # decodes, and vLLM must preempt one.
    ref_e, ref = run(H.with_settings(base), jobs, num_blocks=32)
    stored, out1 = run(vc, jobs, num_blocks=32)
    assert ref_e.preemptions > 0 and stored.preemptions > 0, "vLLM preempted nothing: the test tests nothing"
    assert_exact(stored)
    assert out1 == ref
    e, out2 = run(vc, jobs, num_blocks=32)
    assert_exact(e)
    assert out2 == ref
    assert hits(e) > 0 and e.stat("load_blocks") > 0


def test_chunked_prefill_of_a_restored_request(base, daemon):
    vc = H.with_settings(base, extra=conn(daemon), max_num_batched_tokens=128)
    p = prompt(1000, 30)
    stored, _ = run(vc, [(p[:640], {})])
    assert_exact(stored)
    e, out = run(vc, [(p, {})])
    assert_exact(e)
    assert hits(e) == 640 - BT or hits(e) == 640  # blocks of the stored prefix
    assert out == run(H.with_settings(base, max_num_batched_tokens=128), [(p, {})])[1]


def test_several_loads_and_saves_in_one_step_and_an_abort(base, daemon):
    vc = H.with_settings(base, extra=conn(daemon))
    a, b, c, d = (prompt(500, 40 + i) for i in range(4))
    run(vc, [(a, {}), (b, {})])
    e = H.Engine(vc, num_blocks=64)
    ids = [e.add(x) for x in (a, b, c, d)]
    out = e.step()
    meta = out.kv_connector_metadata
    assert len(meta.loads) == 2 and len(meta.saves) >= 2, (meta.loads, meta.saves)
    e.abort(ids[3])
    e.run()
    e.shutdown()
    assert_exact(e)
    assert not e.connector._reqs, "the connector kept state of finished or aborted requests"


def test_async_scheduling(base, daemon):
    vc = H.with_settings(base, extra=conn(daemon), async_scheduling=True)
    ps = [prompt(400, 50 + i) for i in range(3)]
    stored, out1 = run(vc, [(p, {}) for p in ps])
    e, out2 = run(vc, [(p, {}) for p in ps])
    assert_exact(stored)
    assert_exact(e)
    assert hits(e) > 0 and out1 == out2


def test_a_stopped_daemon_blocks_no_step_and_answers_inside_the_deadline(base, daemon):
    vc = H.with_settings(base, extra=conn(daemon, **{"flatkv.lookup_wait_ms": 1,
                                                     "flatkv.lookup_deadline_ms": 5000}))
    ps = [prompt(400, 60 + i) for i in range(3)]
    run(vc, [(p, {}) for p in ps])

    def steps_of(stop: bool):
        """Runs the three prompts in a fresh engine, the daemon stopped for the first second if
        `stop`; returns the engine, the scheduler steps in that second and the slowest
        Scheduler.schedule() of the run (s: where the connector's lookups run)."""
        e = H.Engine(vc, num_blocks=64)
        if stop:
            os.kill(daemon.proc.pid, signal.SIGSTOP)
        steps = 0
        try:
            for p in ps:
                e.add(p)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 1.0 and e.sched.has_requests():
                e.step()
                steps += 1
        finally:
            if stop:
                os.kill(daemon.proc.pid, signal.SIGCONT)
        e.run()
        e.shutdown()
        return e, steps, max(e.schedule_s)

    e, steps, slowest = steps_of(stop=True)
    assert steps > 10, f"only {steps} scheduler steps in 1 s with the daemon stopped"
    assert e.stat("lookup_retries") > 0
    assert_exact(e)
    assert hits(e) == 3 * ((400 - 1) // BT) * BT, "the requests that waited did not get their hits"
    e2, steps2, slowest2 = steps_of(stop=False)
    print(f"daemon stopped for 1 s: {steps} scheduler steps in that second, the slowest schedule() "
          f"{slowest * 1e3:.1f} ms, {hits(e) // BT} blocks hit; not stopped: the slowest schedule() "
          f"{slowest2 * 1e3:.1f} ms, {hits(e2) // BT} blocks hit")


def test_an_absent_daemon_at_start_is_a_miss_then_a_hit(base, tmp_path):
    d = make_daemon(tmp_path)
    vc = H.with_settings(base, extra=conn(d))
    p = prompt(400, 70)
    e, out = run(vc, [(p, {})])  # no daemon: vLLM runs, without reuse
    assert_exact(e)
    assert hits(e) == 0 and e.stat("miss_unreachable") >= 1
    d.start().close()
    try:
        run(vc, [(p, {})])
        e2, out2 = run(vc, [(p, {})])
        assert hits(e2) > 0 and out2 == out
    finally:
        d.stop()


def test_refused_at_start_by_name(base, tmp_path, monkeypatch):
    d = make_daemon(tmp_path, dict(SMOL, kv_heads=1))
    d.start().close()
    try:
        with pytest.raises(ValueError, match="KV heads per rank"):
            H.Engine(H.with_settings(base, extra=conn(d)))
        # A vLLM block size other than the store's: the same check vLLM's workers make at start
        # (register_kv_caches), here in the scheduler's connector, which vLLM builds first.
        with pytest.raises(ValueError, match="vLLM's block_size is 32 but the flatkv store's block_tokens is 64"):
            H.Engine(H.with_settings(H.base_config(block_size=32), extra=conn(d)))
        vc = H.with_settings(base, extra=conn(d))
        vc.cache_config.prefix_caching_hash_algo = "xxhash"
        monkeypatch.delenv("PYTHONHASHSEED", raising=False)
        with pytest.raises(ValueError, match="PYTHONHASHSEED"):
            H.Engine(vc)
    finally:
        d.stop()
    # A daemon that must be there (flatkv.require_daemon) and is not: an error naming its socket.
    with pytest.raises(RuntimeError, match="cannot reach the flatkv daemon at unix:" + d.socket):
        H.Engine(H.with_settings(base, extra=conn(d, **{"flatkv.require_daemon": True})))


def test_metrics_reach_vllms_stats_and_prometheus(base, daemon):
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
    from flatkv.vllm import FlatkvConnector
    vc = H.with_settings(base, extra=conn(daemon))
    p = prompt(500, 80)
    run(vc, [(p, {})])
    e, _ = run(vc, [(p, {})])
    agg = e.stats[0]
    for s in e.stats[1:]:
        agg = agg.aggregate(s)
    red = agg.reduce()
    assert red["hit_blocks"] == (500 - 1) // BT and red["load_blocks"] == (500 - 1) // BT
    assert "lookup_p99_ms" in red
    reg = CollectorRegistry()

    def bind(cls):
        return lambda *a, **k: cls(*a, registry=reg, **k)
    prom = FlatkvConnector.build_prom_metrics(vc, {Gauge: bind(Gauge), Counter: bind(Counter),
                                                   Histogram: bind(Histogram)},
                                              ["engine"], {0: ["0"]})
    prom.observe(agg.data, 0)
    text = generate_latest(reg).decode()
    assert 'vllm:flatkv_hit_blocks_total{engine="0"} 7.0' in text, text
    assert "vllm:flatkv_lookup_latency_seconds_count" in text


def test_reuse_crashtest_short(base):
    """The reuse crash test (tests/vllm/reuse_crashtest.py) for a bounded time: kills, stops, SSD
    corruption, salts, adapters, preemption pressure; 0 wrong rows, bytes or outputs."""
    import reuse_crashtest
    seconds = float(os.environ.get("FLATKV_REUSE_CRASH_SECONDS", "60"))
    t = reuse_crashtest.run(seconds, seed=int(os.environ.get("FLATKV_REUSE_CRASH_SEED", "7")))
    print("reuse crashtest:", t)
    assert t["rounds"] >= 3, t
    assert t["mismatched_outputs"] == 0 and t["wrong_positions"] == 0 and t["wrong_loaded_bytes"] == 0, t
    assert t["hit_tokens"] > 0, t
