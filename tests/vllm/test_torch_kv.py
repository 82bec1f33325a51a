"""flatkv's torch data path (python/flatkv/torch_kv.py) on vLLM 0.32's KV cache layouts.

The layouts come from tests/vllm/fixtures/vllm_kv_layouts.json (tests/vllm/make_layout_fixture.py,
vLLM's own allocation functions), so everything but test_fixture_matches_vllm runs without vLLM
(and without flatkv's compiled module: torch_kv is loaded from its file):

    pytest tests/vllm/test_torch_kv.py                 # CPU, and CUDA where there is a GPU
    python tests/vllm/test_torch_kv.py [--cuda]        # the same without pytest (scripts/gpu-check.sh)

Each cache is made as vLLM's runner makes it (one raw allocation, strided per layer), filled with
random bits, and checked against a scalar reference computed from the allocation's elements by
address arithmetic on the recorded strides, element by element.
"""

from __future__ import annotations

import importlib.util
import json
import mmap
import random
import sys
from pathlib import Path

import torch

try:
    import pytest
except ImportError:  # the GPU machine's torch has no pytest: see main()
    pytest = None

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "vllm_kv_layouts.json"


def _load_torch_kv():
    spec = importlib.util.spec_from_file_location("flatkv_torch_kv", ROOT / "python/flatkv/torch_kv.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


tk = _load_torch_kv()
FIX = json.loads(FIXTURE.read_text())
_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class Skipped(Exception):
    pass


def skip(msg):
    if pytest is not None:
        pytest.skip(msg)
    raise Skipped(msg)


def need_cuda():
    if not torch.cuda.is_available():
        skip("no CUDA device")


# ---- the fixture's caches and their reference ----

def combos(kinds=("mha", "mla")):
    """(backend name, backend entry, case name, case, layout name, geometry) for every backend
    of the fixture that imported, every layout it may get and every case of its kind."""
    for bname, b in sorted(FIX["backends"].items()):
        if "import_error" in b or b["kind"] not in kinds:
            continue
        for cname, case in sorted(FIX["cases"].items()):
            if case["kind"] != b["kind"]:
                continue
            for lname in b["layouts"]:
                geo = FIX["geometries"].get(f"{cname}/{lname}")
                assert geo is not None, f"fixture lacks {cname}/{lname}"
                yield bname, b, cname, case, lname, geo


class Cache:
    """One fixture geometry made as vLLM's runner makes it: per-layer strided views of one
    allocation (random bits), with a scalar reference of each layer's K, V or latent rows."""

    def __init__(self, backend, case, geo, device="cpu", fill=True, seed=0):
        self.backend, self.case, self.geo = backend, case, geo
        self.dtype = getattr(torch, case["dtype"])
        eb = torch.empty((), dtype=self.dtype).element_size()
        g = torch.Generator().manual_seed(seed)
        n = geo["allocation_bytes"]
        raw = (torch.randint(-128, 128, (n,), dtype=torch.int8, generator=g) if fill
               else torch.zeros(n, dtype=torch.int8))
        self.raw = raw.to(device)
        self.layers = [tk.strided_cache(l["shape"], l["stride"], l["offset"], self.dtype, self.raw)
                       for l in geo["layers"]]
        self.eb = eb

    def layout(self, layer=0):
        c = self.case
        return tk.PagedLayout.from_vllm(self.layers[layer], self.backend["name"],
                                        head_size=c["head_size"], num_kv_heads=c["num_kv_heads"],
                                        block_size=c["block_size"])

    def elements(self):
        """The allocation as a Python list of integers of the KV element width."""
        return self.raw.cpu().view(_INT[self.eb]).tolist()

    def addr(self, layer, b, h, t, c):
        l = self.geo["layers"][layer]
        s = l["stride"]
        return l["offset"] + b * s[0] + h * s[1] + t * s[2] + c * s[3]

    def ref_value(self, elems, layer, b, kv, t, h, d):
        """Element d of head h, token t of K (kv 0) or V (1), or of the latent row (kv None),
        of vLLM block b, as the backend's kernels read it."""
        D = self.case["head_size"]
        N = self.case["block_size"]
        content = self.backend["kv_content"]
        if content == "latent":
            return elems[self.addr(layer, b, 0, t, d)]
        if content == "kv_in_content":  # C = K then V per token and head
            return elems[self.addr(layer, b, h, t, kv * D + d)]
        assert content == "kv_blocks"  # per (block, head): K's (N, D) then V's (N, D)
        flat = kv * N * D + t * D + d
        return elems[self.addr(layer, b, h, flat // (2 * D), flat % (2 * D))]

    def ref_stored(self, elems, layer, block_ids):
        """flatkv's layout of these blocks, element by element: a list of integers."""
        c = self.case
        N, D, H = c["block_size"], c["head_size"], c["num_kv_heads"]
        out = []
        for b in block_ids:
            if c["kind"] == "mla":
                out += [self.ref_value(elems, layer, b, None, t, 0, d) for t in range(N) for d in range(D)]
            else:
                out += [self.ref_value(elems, layer, b, kv, t, h, d)
                        for kv in range(2) for t in range(N) for h in range(H) for d in range(D)]
        return out


def block_lists(num_blocks, rng):
    """Block id lists with runs and gaps, out of order, a single block, all blocks."""
    ids = list(range(num_blocks))
    a = [ids[-1]] + ids[:2] + ids[3:-1] if num_blocks > 4 else ids[::-1]
    b = [ids[1]]
    c = rng.sample(ids, k=max(1, num_blocks // 2))
    return [a, b, c, ids]


def as_ints(buf, eb):
    return buf.cpu().contiguous().view(-1).view(_INT[eb]).tolist()


# ---- tests ----

def test_fixture_matches_vllm():
    """The committed fixture is what the installed vLLM's own functions give now."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        skip("vLLM is not installed (the fixture is checked against it where it is)")
    sys.path.insert(0, str(Path(__file__).parent))
    import make_layout_fixture
    assert make_layout_fixture.build() == FIX, (
        "tests/vllm/fixtures/vllm_kv_layouts.json differs from the installed vLLM: regenerate it "
        "with tests/vllm/make_layout_fixture.py and review the change")
    # vllm_layouts on vLLM's own objects: its KVCacheConfig, specs, views and backend classes.
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.kv_cache_layout import KVCacheLayout
    for cname, bname in (("mha_bf16_1head", "TRITON_ATTN"), ("mla_fp8", "TRITON_MLA"), ("mha_f32", "CPU_ATTN")):
        case = next(c for c in make_layout_fixture.CASES if c[0] == cname)
        layout = KVCacheLayout.LBHNC if bname == "CPU_ATTN" else KVCacheLayout.BLNHC
        kv_cfg, caches = make_layout_fixture.allocate(case, layout)
        cls = AttentionBackendEnum[bname].get_class()
        lays = tk.vllm_layouts(caches, kv_cfg, {n: cls for n in caches})
        for n, lay in lays.items():
            assert lay.kind == FIX["backends"][bname]["kind"] and lay.source == f"vLLM {bname}", lay
            buf = torch.empty((1, lay.block_layer_bytes), dtype=torch.uint8)
            tk.gather(lay, caches[n], [1], buf)


def test_fixture_covers_the_backends():
    names = set(FIX["backends"])
    for want in ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "CPU_ATTN", "FLASHMLA", "TRITON_MLA"):
        assert want in names and "import_error" not in FIX["backends"][want], want
    assert FIX["backends"]["CPU_ATTN"]["layouts"] == ["LBHNC"]
    assert set(FIX["backends"]["FLASH_ATTN"]["layouts"]) == set(FIX["layouts"])


def _gather_matches_reference(device):
    rng = random.Random(1)
    count = 0
    for bname, b, cname, case, lname, geo in combos():
        cache = Cache(b, case, geo, device)
        elems = cache.elements()
        for layer in (count % 2,):  # layers alternate: offset 0 and the second layer's offset
            lay = cache.layout(layer)
            for ids in block_lists(case["num_blocks"], rng):
                dst = torch.empty((len(ids), lay.block_layer_bytes), dtype=torch.uint8, device=device)
                tk.gather(lay, cache.layers[layer], ids, dst)
                got = as_ints(dst, cache.eb)
                assert got == cache.ref_stored(elems, layer, ids), \
                    f"{bname} {cname} {lname} layer {layer} blocks {ids}: gather differs"
                count += 1
    assert count > 200


def test_gather_matches_reference_cpu():
    _gather_matches_reference("cpu")


def test_gather_matches_reference_cuda():
    need_cuda()
    _gather_matches_reference("cuda")


def _scatter_round_trip(device):
    rng = random.Random(2)
    for bname, b, cname, case, lname, geo in combos():
        src = Cache(b, case, geo, device)
        dst = Cache(b, case, geo, device, fill=False)
        elems = src.elements()
        ids = block_lists(case["num_blocks"], rng)[0]
        for layer in range(len(src.layers)):
            lay = src.layout(layer)
            buf = torch.empty((len(ids), lay.block_layer_bytes), dtype=torch.uint8, device=device)
            tk.gather(lay, src.layers[layer], ids, buf)
            tk.scatter(lay, buf, dst.layers[layer], ids)
        # Every element of the scattered blocks equals the source's, at vLLM's own addresses;
        # everything else is still zero.
        written = set()
        a, z = src.elements(), dst.elements()
        for layer in range(len(src.layers)):
            for blk in ids:
                for bb, h, t, c in _block_cells(case, blk):
                    i = src.addr(layer, bb, h, t, c)
                    written.add(i)
                    assert z[i] == a[i], f"{bname} {cname} {lname} layer {layer} block {blk}: scatter differs"
        assert all(z[i] == 0 for i in range(len(z)) if i not in written), \
            f"{bname} {cname} {lname}: scatter wrote outside its blocks"
        del elems


def _block_cells(case, blk):
    H = case["num_kv_heads"] if case["kind"] == "mha" else 1
    C = 2 * case["head_size"] if case["kind"] == "mha" else case["head_size"]
    for h in range(H):
        for t in range(case["block_size"]):
            for c in range(C):
                yield blk, h, t, c


def test_scatter_round_trip_cpu():
    _scatter_round_trip("cpu")


def test_scatter_round_trip_cuda():
    need_cuda()
    _scatter_round_trip("cuda")


def _cross_backend(device):
    """Blocks gathered from one backend's cache and scattered into another's (same model shape)
    read back, through each backend's own K/V rule, as the same K and V."""
    rng = random.Random(3)
    pairs = 0
    for kind in ("mha", "mla"):
        all_ = list(combos((kind,)))
        for bx, x, cname, case, lx, geo_x in all_:
            for by, y, cname_y, case_y, ly, geo_y in all_:
                if cname_y != cname or (bx, lx) == (by, ly) or rng.random() > 0.08:
                    continue
                src = Cache(x, case, geo_x, device, seed=4)
                dst = Cache(y, case, geo_y, device, fill=False)
                ids = rng.sample(range(case["num_blocks"]), k=3)
                to = rng.sample(range(case["num_blocks"]), k=3)
                lay_x, lay_y = src.layout(1), dst.layout(1)
                buf = torch.empty((3, lay_x.block_layer_bytes), dtype=torch.uint8, device=device)
                tk.gather(lay_x, src.layers[1], ids, buf)
                tk.scatter(lay_y, buf, dst.layers[1], to)
                assert src.ref_stored(src.elements(), 1, ids) == dst.ref_stored(dst.elements(), 1, to), \
                    f"{cname}: {bx} {lx} -> {by} {ly}: K/V differ"
                pairs += 1
    assert pairs >= 12, pairs


def test_cross_backend_exchange_cpu():
    _cross_backend("cpu")


def test_cross_backend_exchange_cuda():
    need_cuda()
    _cross_backend("cuda")


def test_fp8_is_bytes():
    """vLLM's fp8 cache (uint8) and a torch float8 cache move as bytes, NaN patterns included."""
    assert tk.is_raw_bytes(torch.uint8) and not tk.is_raw_bytes(torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    for dt in [d for d in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if d]:
        assert tk.is_raw_bytes(dt)
        raw = torch.randint(0, 256, (4 * 2 * 16 * 32,), dtype=torch.uint8, generator=g)
        cache = raw.view(dt).view(4, 2, 16, 32)  # [B, H, N, C], C = K|V of 16
        lay = tk.PagedLayout.from_vllm(cache, "FLASH_ATTN", head_size=16, num_kv_heads=2)
        assert lay.block_layer_bytes == 2 * 16 * 2 * 16
        buf = torch.empty((2, lay.block_layer_bytes), dtype=torch.uint8)
        tk.gather(lay, cache, [3, 1], buf)
        want = raw.view(4, 2, 16, 2, 16)[[3, 1]].permute(0, 3, 2, 1, 4).reshape(2, -1)
        assert torch.equal(buf, want)
        out = torch.zeros_like(raw).view(dt).view(4, 2, 16, 32)
        tk.scatter(lay, buf, out, [0, 2])
        assert torch.equal(out.view(torch.uint8)[[0, 2]], raw.view(4, 2, 16, 32)[[3, 1]])


def test_kernel_blocks():
    """vLLM's kernel block splitting: a 32-token block held as two 16-token kernel blocks."""
    case = FIX["cases"]["mha_f16"]
    geo = FIX["geometries"]["mha_f16/BLNHC"]
    b = FIX["backends"]["FLASH_ATTN"]
    cache = Cache(b, case, geo)
    t = cache.layers[0]  # 6 kernel blocks of 16 = 3 blocks of 32
    lay = tk.PagedLayout.from_vllm(t, "FLASH_ATTN", head_size=8, num_kv_heads=2, block_size=32)
    assert (lay.num_blocks, lay.block_tokens, lay.kernel_blocks) == (3, 32, 2)
    buf = torch.empty((2, lay.block_layer_bytes), dtype=torch.uint8)
    tk.gather(lay, t, [2, 0], buf)
    elems = cache.elements()
    want = []
    for blk in (2, 0):
        want += [cache.ref_value(elems, 0, 2 * blk + tok // 16, kv, tok % 16, h, d)
                 for kv in range(2) for tok in range(32) for h in range(2) for d in range(8)]
    assert as_ints(buf, 2) == want
    fresh = Cache(b, case, geo, fill=False)
    tk.scatter(lay, buf, fresh.layers[0], [2, 0])
    assert torch.equal(fresh.layers[0][[4, 5, 0, 1]].view(torch.int16), t[[4, 5, 0, 1]].view(torch.int16))


def test_vllm_layouts_from_kv_cache_config():
    """vllm_layouts: every registered layer's layout from the connector's kv_cache_config and
    each layer's backend (objects shaped like vLLM 0.32's, no vLLM needed)."""
    from types import SimpleNamespace as NS
    mha, mla = FIX["cases"]["mha_f16"], FIX["cases"]["mla_bf16"]
    c1 = Cache(FIX["backends"]["FLASH_ATTN"], mha, FIX["geometries"]["mha_f16/BLHNC"])
    c2 = Cache(FIX["backends"]["FLASHMLA"], mla, FIX["geometries"]["mla_bf16/LBNHC"])
    kv = {"l.0.attn": c1.layers[0], "l.1.attn": c1.layers[1], "m.0.attn": c2.layers[0]}
    spec1 = NS(block_size=16, num_kv_heads=2, head_size=8, head_size_v=8)
    spec2 = NS(block_size=16, num_kv_heads=1, head_size=40, head_size_v=0)
    cfg = NS(kv_cache_groups=[NS(layer_names=["l.0.attn", "l.1.attn"], kv_cache_spec=spec1),
                              NS(layer_names=["m.0.attn"], kv_cache_spec=NS(kv_cache_specs={"m.0.attn": spec2}))])
    backends = {"l.0.attn": "FLASH_ATTN", "l.1.attn": "FLASH_ATTN", "m.0.attn": "FLASHMLA"}
    lays = tk.vllm_layouts(kv, cfg, backends)
    assert lays["l.1.attn"].kind == "mha" and lays["m.0.attn"].kind == "mla"
    assert lays["m.0.attn"].block_layer_bytes == 16 * 40 * 2
    cfg.kv_cache_groups.append(NS(layer_names=["s.0.mamba"], kv_cache_spec=NS(block_size=16)))
    try:
        tk.vllm_layouts({**kv, "s.0.mamba": torch.zeros(1)}, cfg, backends)
    except tk.LayoutError as e:
        assert "'s.0.mamba': a SimpleNamespace, not attention" in str(e), e
    else:
        raise AssertionError("a non-attention layer was accepted")


def test_from_axes_any_engine():
    """Any strided cache whose axes are named: here (2, B, N, H, D) stored head-major, and MLA
    (B, N, L) with a gap between blocks."""
    g = torch.Generator().manual_seed(9)
    phys = torch.randn(2, 5, 3, 16, 8, generator=g)  # (kv, B, H, N, D) in memory
    t = phys.permute(0, 1, 3, 2, 4)  # logical (kv, B, N, H, D), non-contiguous
    lay = tk.PagedLayout.from_axes(t, ("kv", "block", "token", "head", "dim"))
    buf = torch.empty((2, lay.block_layer_bytes), dtype=torch.uint8)
    tk.gather(lay, t, [4, 2], buf)
    assert torch.equal(buf.view(torch.float32).view(2, 2, 16, 3, 8), t[:, [4, 2]].transpose(0, 1))
    big = torch.randn(5, 20, 12, generator=g)
    mla = big[:, 2:18, :]  # 16 tokens of 12, blocks 240 elements apart
    lay = tk.PagedLayout.from_axes(mla, ("block", "token", "dim"))
    buf = torch.empty((3, lay.block_layer_bytes), dtype=torch.uint8)
    tk.gather(lay, mla, [0, 1, 3], buf)
    assert torch.equal(buf.view(torch.float32).view(3, 16, 12), mla[[0, 1, 3]])


def test_errors_name_what_is_wrong():
    cache = torch.zeros(4, 2, 16, 32, dtype=torch.float16)
    lay = tk.PagedLayout.from_vllm(cache, "TRITON_ATTN", head_size=16, num_kv_heads=2)
    cases = [
        (lambda: tk.PagedLayout.from_vllm(cache, "FLASH_ATTN", head_size=8), "content of 32"),
        (lambda: tk.PagedLayout.from_vllm(cache, "FLASH_ATTN", head_size=16, num_kv_heads=4), "2 head slots"),
        (lambda: tk.PagedLayout.from_vllm(cache, "FLASH_ATTN", head_size=16, head_size_v=8), "V heads of 8"),
        (lambda: tk.PagedLayout.from_vllm(cache, "FLASHMLA", head_size=32), "MLA cache with 2 head slots"),
        (lambda: tk.PagedLayout.from_vllm(cache, "FLASH_ATTN", head_size=16, block_size=24), "do not divide"),
        (lambda: tk.gather(lay, cache.float(), [0], torch.empty(1, lay.block_layer_bytes, dtype=torch.uint8)),
         "dtype torch.float32"),
        (lambda: tk.gather(lay, cache, [4], torch.empty(1, lay.block_layer_bytes, dtype=torch.uint8)),
         "block id 4 is outside"),
        (lambda: tk.gather(lay, cache, [0, 1], torch.empty(1, lay.block_layer_bytes, dtype=torch.uint8)),
         "expected (2, 2048)"),
        (lambda: tk.scatter(lay, torch.empty(2, 2048, dtype=torch.float16), cache, [0]), "must be uint8"),
        (lambda: tk.gather(lay, cache[:3], [0], torch.empty(1, 2048, dtype=torch.uint8)), "shape (3, 2, 16, 32)"),
    ]
    for f, words in cases:
        try:
            f()
        except tk.LayoutError as e:
            assert words in str(e), f"{words!r} not in {e}"
        else:
            raise AssertionError(f"no error for {words!r}")
    # The CPU backend's K-block-then-V-block view needs (N, C) contiguous per head: LBNHC is refused.
    nhd = torch.zeros(4, 16, 2, 32, dtype=torch.float16).permute(0, 2, 1, 3)
    cpu = tk.PagedLayout.from_vllm(nhd, "CPU_ATTN", head_size=16, num_kv_heads=2)
    try:
        tk.gather(cpu, nhd, [0], torch.empty(1, 2048, dtype=torch.uint8))
    except tk.LayoutError as e:
        assert "cannot be viewed as (4, 2, 2, 16, 16)" in str(e)
    else:
        raise AssertionError("CPU_ATTN over LBNHC not refused")


# ---- the transfer engine ----

def _engine_round_trip(device, pin_window):
    rng = random.Random(6)
    done = 0
    for bname, b, cname, case, lname, geo in combos():
        if bname not in ("FLASH_ATTN", "CPU_ATTN", "FLASHMLA") or rng.random() > 0.5:
            continue
        src = Cache(b, case, geo, device, seed=7)
        dst = Cache(b, case, geo, device, fill=False)
        layouts = [src.layout(i) for i in range(len(src.layers))]
        lb = layouts[0].block_layer_bytes
        L = len(src.layers)
        ids = block_lists(case["num_blocks"], rng)[0]
        # Saves: each layer gathered after "its attention", handed back after the step.
        eng = tk.KVTransfer(layouts, src.layers)
        for layer in range(L):
            eng.save_layer(layer, "req", ids)
        saved = eng.finish_saves()["req"]
        assert saved.device.type == "cpu" and tuple(saved.shape) == (len(ids), L * lb)
        e = src.elements()
        for layer in range(L):
            assert as_ints(saved.view(len(ids), L, lb)[:, layer], src.eb) == src.ref_stored(e, layer, ids), \
                f"{bname} {cname} {lname}: saved layer {layer} differs"
        # Loads: from a host window (pinned once where asked) into other blocks, layer by layer.
        window = saved.view(len(ids), L, lb).permute(1, 0, 2).contiguous()  # layer-major, as the daemon
        if pin_window:  # page-aligned shared memory, as the daemon's window is
            mm = mmap.mmap(-1, window.numel())
            host = torch.frombuffer(mm, dtype=torch.uint8).view(window.shape)
            host.copy_(window)
            window = host
        to = list(reversed(range(case["num_blocks"])))[:len(ids)]
        loader = tk.KVTransfer(layouts, dst.layers)
        if pin_window:
            assert loader.register_window(window) == (device == "cuda")
        released = []
        for layer in range(L):
            loader.load_layer(layer, window[layer], to, on_done=lambda layer=layer: released.append(layer))
        for layer in range(L):
            loader.wait_layer_load(layer)
            # what the consumer's stream sees after the wait
            got = torch.empty((len(to), lb), dtype=torch.uint8, device=device)
            tk.gather(layouts[layer], dst.layers[layer], to, got)
            assert torch.equal(got.cpu(), window[layer]), f"{bname} {cname} {lname}: loaded layer {layer} differs"
        loader.finish_loads()
        assert sorted(released) == list(range(L))
        loader.close()
        eng.close()
        window = host = None  # before the mapping goes
        done += 1
    assert done >= 3


def test_transfer_engine_cpu():
    _engine_round_trip("cpu", pin_window=False)
    _engine_round_trip("cpu", pin_window=True)  # a shared-memory window: nothing to pin on CPU


def test_transfer_engine_cuda_pinned_window():
    need_cuda()
    _engine_round_trip("cuda", pin_window=True)


def test_transfer_engine_cuda_unpinned_source():
    need_cuda()
    _engine_round_trip("cuda", pin_window=False)


def test_transfer_engine_cuda_does_not_block_the_host():
    """A load of a big layer returns before its copy is done; the consumer's stream waits."""
    need_cuda()
    blocks, lb = 256, 2 * 64 * 8 * 128 * 2
    cache = torch.zeros(blocks, 8, 64, 256, dtype=torch.float16, device="cuda")
    lay = tk.PagedLayout.from_vllm(cache, "FLASH_ATTN", head_size=128, num_kv_heads=8)
    assert lay.block_layer_bytes == lb
    host = torch.randint(0, 256, (blocks * lb,), dtype=torch.uint8).pin_memory()
    eng = tk.KVTransfer([lay], [cache])
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # keep the device busy: the side stream waits for this
    eng.load_layer(0, host, list(range(blocks)))
    assert not eng._load_events[0].query(), "load_layer waited for its copy"
    eng.wait_layer_load(0)
    out = torch.empty((blocks, lb), dtype=torch.uint8, device="cuda")
    tk.gather(lay, cache, list(range(blocks)), out)
    assert torch.equal(out.cpu().view(-1), host)
    eng.close()


def test_transfer_engine_cuda_read_only_window():
    """A read-only window (a Restore's layer_view is one) is registered read-only, or not at all
    where the device cannot; either way the loads are right and no CUDA error is left behind."""
    need_cuda()
    case = FIX["cases"]["mha_f16"]
    geo = FIX["geometries"]["mha_f16/LBNHC"]
    cache = Cache(FIX["backends"]["FLASH_ATTN"], case, geo, "cuda", fill=False)
    lay = cache.layout(0)
    data = bytes(random.Random(8).randrange(256) for _ in range(3 * lay.block_layer_bytes))
    view = memoryview(data)
    eng = tk.KVTransfer([lay, cache.layout(1)], cache.layers)
    pinned = eng.register_window(view)
    print(f"read-only window pinned: {pinned}")
    eng.load_layer(0, view, [5, 0, 1])
    eng.wait_layer_load(0)
    torch.ones(4, device="cuda").sum().item()  # a kernel launch: no stale error from the register
    out = torch.empty((3, lay.block_layer_bytes), dtype=torch.uint8, device="cuda")
    tk.gather(lay, cache.layers[0], [5, 0, 1], out)
    assert bytes(out.cpu().view(-1).tolist()) == data
    eng.close()


def main():
    """Runs the tests without pytest: all of them, or with --cuda only the CUDA ones."""
    only_cuda = "--cuda" in sys.argv
    names = [n for n in sorted(globals()) if n.startswith("test_") and (not only_cuda or "cuda" in n)]
    failed = skipped = 0
    for n in names:
        try:
            globals()[n]()
            print(f"PASS {n}")
        except Skipped as e:
            skipped += 1
            print(f"SKIP {n}: {e}")
        except Exception as e:  # noqa: BLE001 - reported, counted
            failed += 1
            import traceback
            traceback.print_exc()
            print(f"FAIL {n}: {type(e).__name__}: {e}")
    print(f"{len(names) - failed - skipped} passed, {failed} failed, {skipped} skipped")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
