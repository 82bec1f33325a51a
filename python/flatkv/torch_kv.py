"""flatkv's KV data path for torch paged caches: layouts, gather/scatter, the transfer engine.

Needs torch only: not vLLM, and not flatkv's compiled module (the connector hands it buffers,
the daemon's shared-memory window among them), so it runs wherever torch does, CPU or CUDA.

flatkv stores ONE layout, whatever engine or attention backend produced the blocks (docs/vllm.md,
"GPU layouts"):
- MHA/GQA: a block layer is (2, block_tokens, kv_heads, head_dim) in the KV dtype: K then V,
  token-major, the heads of a token side by side;
- MLA: a block layer is (block_tokens, latent_dim), one latent row (kv_lora_rank +
  qk_rope_head_dim) per token.
A 1-byte KV dtype (vLLM's fp8 cache, which it allocates as uint8) is stored as its bytes.

An engine's paged cache layer is any strided tensor with a block axis; `PagedLayout` names its
axes (`PagedLayout.from_axes`, or `PagedLayout.from_vllm` for the [B, H, N, C] views vLLM 0.32
hands `register_kv_caches`, in any of its KVCacheLayouts). `gather` copies blocks of it into
flatkv's layout, `scatter` back: one strided torch copy per run of consecutive block ids, in the
cache's own element width (bits, no float conversion). `KVTransfer` moves whole layers between
host buffers and the cache: synchronously for CPU caches; for CUDA caches on a side stream with
one CUDA event per layer, from pinned host memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

MHA_AXES = ("block", "kv", "token", "head", "dim")  # the order of flatkv's MHA block layer
MLA_AXES = ("block", "token", "dim")  # the order of flatkv's MLA block layer

# Integer types of each element width: copies move bits, never convert floats.
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                           "float8_e5m2fnuz") if hasattr(torch, n))

# How vLLM 0.32's backends hold K and V in the content axis C of a [B, H, N, C] layer view
# (docs/vllm.md, "GPU layouts"). Not listed: "kv_in_content" (C = K then V per token and head).
VLLM_KV_CONTENT = {"CPU_ATTN": "kv_blocks"}


class LayoutError(ValueError):
    """A tensor, block list or buffer that does not match a layout; the message says what."""


def runs(block_ids: Sequence[int]):
    """(index in block_ids, first block, length) of each run of consecutive block ids."""
    i, n = 0, len(block_ids)
    while i < n:
        j = i + 1
        while j < n and block_ids[j] == block_ids[j - 1] + 1:
            j += 1
        yield i, int(block_ids[i]), j - i
        i = j


def is_raw_bytes(dtype: torch.dtype) -> bool:
    """Whether flatkv stores this KV dtype as plain bytes (fp8, and vLLM's uint8 fp8 caches): a
    codec that needs floats must refuse it."""
    return dtype in _FP8 or dtype in (torch.uint8, torch.int8)


@dataclass(frozen=True)
class PagedLayout:
    """One engine layer's paged KV cache, as a view of a strided tensor.

    kind: "mha" (K and V per head) or "mla" (one latent row per token).
    shape: the engine tensor's shape; view: the shape it is viewed as first (None: as it is);
        axes: the role of each axis of that view, a permutation of MHA_AXES or MLA_AXES.
    kernel_blocks: engine blocks per flatkv block (vLLM's kernel block splitting: the block
        axis counts kernel blocks of block_tokens / kernel_blocks tokens; 1: none).
    num_blocks (flatkv blocks), block_tokens, kv_heads (1 for MLA), head_dim (MLA: the latent
    width), dtype; source names what it was made from, for messages.
    """

    kind: str
    shape: tuple[int, ...]
    axes: tuple[str, ...]
    num_blocks: int
    block_tokens: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    view: tuple[int, ...] | None = None
    kernel_blocks: int = 1
    source: str = ""

    # ---- construction ----

    @staticmethod
    def from_axes(tensor_or_shape, axes: Sequence[str], dtype: torch.dtype | None = None, *,
                  view: Sequence[int] | None = None, kernel_blocks: int = 1,
                  source: str = "") -> "PagedLayout":
        """The layout of a tensor (or a shape and dtype) whose axes (after `view`, if given) have
        these roles: MHA ("block", "kv", "token", "head", "dim" in any order) or MLA ("block",
        "token", "dim")."""
        shape, dtype = _shape_dtype(tensor_or_shape, dtype)
        what = source or "KV cache"
        axes = tuple(axes)
        logical = tuple(int(v) for v in view) if view is not None else shape
        if view is not None and _numel(logical) != _numel(shape):
            raise LayoutError(f"{what}: shape {shape} cannot be viewed as {logical}")
        if sorted(axes) == sorted(MHA_AXES):
            kind = "mha"
        elif sorted(axes) == sorted(MLA_AXES):
            kind = "mla"
        else:
            raise LayoutError(f"{what}: axes {axes} are neither MHA's {MHA_AXES} nor MLA's "
                              f"{MLA_AXES} in some order")
        if len(logical) != len(axes):
            raise LayoutError(f"{what}: shape {logical} has {len(logical)} axes, the layout "
                              f"{axes} {len(axes)}")
        size = dict(zip(axes, logical))
        if kind == "mha" and size["kv"] != 2:
            raise LayoutError(f"{what}: the K/V axis (axis {axes.index('kv')} of {logical}) has "
                              f"{size['kv']} entries, not 2")
        if kernel_blocks < 1 or size["block"] % kernel_blocks:
            raise LayoutError(f"{what}: {size['block']} blocks do not group into flatkv blocks of "
                              f"{kernel_blocks} kernel blocks")
        return PagedLayout(kind, shape, axes, size["block"] // kernel_blocks,
                           size["token"] * kernel_blocks, size.get("head", 1), size["dim"], dtype,
                           logical if view is not None else None, kernel_blocks, source)

    @staticmethod
    def from_vllm(cache, backend: Any, *, head_size: int, num_kv_heads: int | None = None,
                  head_size_v: int | None = None, block_size: int | None = None,
                  dtype: torch.dtype | None = None) -> "PagedLayout":
        """The layout of a vLLM 0.32 KV cache layer: what `register_kv_caches` receives, a
        [B, H, N, C] view (blocks, head slots, tokens, content) in any KVCacheLayout
        (vllm/v1/kv_cache_interface.py, create_kv_cache_views), or its shape with `dtype`.

        backend: the layer's attention backend class (`layer.get_attn_backend()`) or its name
            (`get_name()`, e.g. "FLASH_ATTN"); it says how C holds K and V: K then V per token
            and head (FlashAttention, FlashInfer, Triton), K's block then V's per head (CPU_ATTN),
            or one latent row (MLA backends).
        head_size, num_kv_heads, head_size_v: the layer's AttentionSpec (MLA: head_size is the
            latent width; heads are 1). block_size: the scheduler's block size, where vLLM split
            it into smaller kernel blocks (N < block_size); None: N.
        Refuses by name what flatkv's layout cannot hold: K and V of different widths, packed or
        quantized content with scales (C not 2 * head_size), NVFP4."""
        name, mla = _backend_info(backend)
        shape, dtype = _shape_dtype(cache, dtype)
        src = f"vLLM {name}"
        if len(shape) != 4:
            raise LayoutError(f"{src}: KV cache of shape {shape}; vLLM 0.32's layer views are "
                              "[num_blocks, heads, block_size, content], 4 axes")
        b, h, n, c = shape
        ratio = 1
        if block_size is not None and block_size != n:
            if block_size % n:
                raise LayoutError(f"{src}: KV cache blocks of {n} tokens do not divide the block "
                                  f"size {block_size}")
            ratio = block_size // n
        if mla:
            if h != 1:
                raise LayoutError(f"{src}: an MLA cache with {h} head slots (shape {shape}); MLA "
                                  "has one latent row per token")
            if c != head_size:
                raise LayoutError(f"{src}: MLA content of {c} elements, the spec's head_size is "
                                  f"{head_size} (packed MLA formats are not supported)")
            return PagedLayout.from_axes(shape, ("block", "token", "dim"), dtype, view=(b, n, c),
                                         kernel_blocks=ratio, source=src)
        if head_size_v is not None and head_size_v != head_size:
            raise LayoutError(f"{src}: K heads of {head_size} and V heads of {head_size_v}; "
                              "flatkv's layout holds K and V of one width")
        if num_kv_heads is not None and h != num_kv_heads:
            raise LayoutError(f"{src}: {h} head slots in the KV cache (shape {shape}), the model "
                              f"has {num_kv_heads} KV heads (packed or NVFP4 caches are not "
                              "supported)")
        if c != 2 * head_size:
            raise LayoutError(f"{src}: content of {c} elements per token and head; K and V of "
                              f"head_size {head_size} are {2 * head_size} (a KV cache quantized "
                              "per token and head, with scales, is not supported)")
        if VLLM_KV_CONTENT.get(name, "kv_in_content") == "kv_blocks":
            return PagedLayout.from_axes(shape, ("block", "head", "kv", "token", "dim"), dtype,
                                         view=(b, h, 2, n, head_size), kernel_blocks=ratio,
                                         source=src)
        return PagedLayout.from_axes(shape, ("block", "head", "token", "kv", "dim"), dtype,
                                     view=(b, h, n, 2, head_size), kernel_blocks=ratio, source=src)

    # ---- sizes ----

    @property
    def element_bytes(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def block_layer_bytes(self) -> int:
        """Bytes of one block of this layer in flatkv's layout."""
        per_token = (2 * self.kv_heads if self.kind == "mha" else 1) * self.head_dim
        return self.block_tokens * per_token * self.element_bytes

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """One block layer in flatkv's layout, in elements of `dtype`."""
        if self.kind == "mha":
            return (2, self.block_tokens, self.kv_heads, self.head_dim)
        return (self.block_tokens, self.head_dim)

    def describe(self) -> str:
        return (f"{self.source + ': ' if self.source else ''}{self.kind.upper()} {self.shape}"
                f"{' viewed as ' + str(self.view) if self.view else ''} with axes {self.axes}"
                f"{f', {self.kernel_blocks} kernel blocks a block' if self.kernel_blocks > 1 else ''}"
                f", {self.num_blocks} blocks of {self.block_tokens} tokens, {self.kv_heads} KV "
                f"heads x {self.head_dim}, {self.dtype}")

    # ---- views ----

    def check(self, cache: torch.Tensor, what: str = "KV cache") -> None:
        """Raises LayoutError naming what differs between `cache` and this layout."""
        if not isinstance(cache, torch.Tensor):
            raise LayoutError(f"{what}: a {type(cache).__name__}, not a torch tensor")
        if cache.dtype != self.dtype:
            raise LayoutError(f"{what}: dtype {cache.dtype}, the layout's is {self.dtype} "
                              f"({self.describe()})")
        if tuple(cache.shape) != self.shape:
            raise LayoutError(f"{what}: shape {tuple(cache.shape)}, the layout's is {self.shape} "
                              f"({self.describe()})")

    def canonical(self, cache: torch.Tensor) -> torch.Tensor:
        """`cache` as a strided view in flatkv's axis order, (num_blocks, *stored_shape), or with
        kernel blocks (num_blocks, 2, kernel_blocks, tokens, H, D) / (num_blocks, kernel_blocks,
        tokens, L); its elements reinterpreted as integers of the same width. No copy."""
        self.check(cache)
        t = cache
        if self.view is not None:
            try:
                t = t.view(self.view)
            except RuntimeError as e:
                raise LayoutError(f"KV cache of shape {tuple(cache.shape)} and strides "
                                  f"{tuple(cache.stride())} cannot be viewed as {self.view} "
                                  f"({self.describe()}): {e}") from None
        order = MHA_AXES if self.kind == "mha" else MLA_AXES
        t = t.permute(*(self.axes.index(a) for a in order))
        if self.kernel_blocks > 1:
            t = t.unflatten(0, (self.num_blocks, self.kernel_blocks))
            tok = order.index("token") + 1  # the kernel-block axis goes before the tokens
            perm = [0] + list(range(2, tok)) + [1] + list(range(tok, t.dim()))
            t = t.permute(*perm)
        return t.view(_BITS[t.element_size()])

    def stored(self, buf, n: int, what: str = "buffer") -> torch.Tensor:
        """A (n, block_layer_bytes) uint8 tensor (rows may be strided, the bytes of a row
        contiguous), or a flat one of at least n blocks, viewed like `canonical`'s blocks."""
        lb = self.block_layer_bytes
        if not isinstance(buf, torch.Tensor):
            buf = as_uint8(buf)
        if buf.dtype != torch.uint8:
            raise LayoutError(f"{what}: dtype {buf.dtype}; it must be uint8 bytes")
        if buf.dim() == 1:
            if buf.numel() < n * lb:
                raise LayoutError(f"{what}: {buf.numel()} bytes; {n} blocks of {lb} bytes need "
                                  f"{n * lb}")
            buf = buf[:n * lb].view(n, lb)
        if buf.dim() != 2 or buf.shape[0] != n or buf.shape[1] != lb:
            raise LayoutError(f"{what}: shape {tuple(buf.shape)}, expected ({n}, {lb}): {n} "
                              f"blocks of {lb} bytes ({self.describe()})")
        if buf.stride(1) != 1:
            raise LayoutError(f"{what}: the bytes of a block are not contiguous (strides "
                              f"{tuple(buf.stride())})")
        eb = self.element_bytes
        if buf.stride(0) % eb or buf.storage_offset() % eb:
            raise LayoutError(f"{what}: rows not aligned to the {eb}-byte KV element")
        t = buf.view(_BITS[eb]).view(n, *self.stored_shape)
        if self.kernel_blocks > 1:
            tok = 2 if self.kind == "mha" else 1
            t = t.unflatten(tok, (self.kernel_blocks, self.block_tokens // self.kernel_blocks))
        return t

    def check_blocks(self, block_ids: Sequence[int]) -> None:
        for b in block_ids:
            if not 0 <= b < self.num_blocks:
                raise LayoutError(f"block id {b} is outside the KV cache's {self.num_blocks} blocks")


def gather(layout: PagedLayout, cache: torch.Tensor, block_ids: Sequence[int], dst) -> None:
    """Copies blocks `block_ids` of `cache` into `dst`, (len(block_ids), block_layer_bytes) uint8
    in flatkv's layout (host memory for a CPU cache, device memory for a CUDA cache): one copy
    per run of consecutive block ids. CUDA copies are queued on the current stream."""
    block_ids = list(block_ids)
    layout.check_blocks(block_ids)
    src = layout.canonical(cache)
    d = layout.stored(dst, len(block_ids), "gather destination")
    for i, first, n in runs(block_ids):
        d[i:i + n].copy_(src[first:first + n], non_blocking=True)


def scatter(layout: PagedLayout, src, cache: torch.Tensor, block_ids: Sequence[int]) -> None:
    """Copies (len(block_ids), block_layer_bytes) uint8 in flatkv's layout into blocks `block_ids`
    of `cache`: one copy per run of consecutive block ids."""
    block_ids = list(block_ids)
    layout.check_blocks(block_ids)
    dst = layout.canonical(cache)
    s = layout.stored(src, len(block_ids), "scatter source")
    for i, first, n in runs(block_ids):
        dst[first:first + n].copy_(s[i:i + n], non_blocking=True)


def as_uint8(buf) -> torch.Tensor:
    """A torch uint8 view (no copy) of a tensor, a numpy array or a buffer (memoryview, a
    Restore's layer_view); read-only buffers are viewed too (the caller only reads them)."""
    if isinstance(buf, torch.Tensor):
        t = buf
    elif hasattr(buf, "__array_interface__"):
        t = torch.from_numpy(buf)
    else:
        import warnings
        mv = memoryview(buf)
        if mv.nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        with warnings.catch_warnings():  # a read-only buffer: torch warns that it may be written
            warnings.simplefilter("ignore", UserWarning)
            t = torch.frombuffer(mv.cast("B"), dtype=torch.uint8)
    if t.dtype != torch.uint8:
        t = t.view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)
    return t


def vllm_layouts(kv_caches: dict, kv_cache_config: Any, backends: dict) -> dict[str, PagedLayout]:
    """The layout of every layer vLLM 0.32 registered, for the connector's register_kv_caches.

    kv_caches: register_kv_caches' argument; kv_cache_config: the connector's constructor
    argument (its kv_cache_groups give each layer's spec: block_size, num_kv_heads, head_size,
    head_size_v); backends: layer name -> the layer's attention backend class or name, e.g.
    `{n: l.get_attn_backend() for n, l in get_layers_from_vllm_config(vllm_config,
    AttentionLayerBase).items()}`. Duck-typed: needs no vLLM import. A layer that is not
    attention (Mamba state, an indexer) or has no backend is refused by name."""
    out = {}
    for group in kv_cache_config.kv_cache_groups:
        for name in group.layer_names:
            if name not in kv_caches:
                continue
            spec = group.kv_cache_spec
            per_layer = getattr(spec, "kv_cache_specs", None)
            if isinstance(per_layer, dict):
                spec = per_layer[name]
            if not hasattr(spec, "head_size"):
                raise LayoutError(f"vLLM layer '{name}': a {type(spec).__name__}, not attention; "
                                  "flatkv stores attention KV only")
            if name not in backends:
                raise LayoutError(f"vLLM layer '{name}': no attention backend given")
            out[name] = PagedLayout.from_vllm(
                kv_caches[name], backends[name], head_size=spec.head_size,
                num_kv_heads=spec.num_kv_heads, head_size_v=getattr(spec, "head_size_v", None),
                block_size=spec.block_size)
    missing = sorted(set(kv_caches) - set(out))
    if missing:
        raise LayoutError(f"vLLM layers {missing} are in no KV cache group of kv_cache_config")
    return out


def strided_cache(shape: Sequence[int], stride: Sequence[int], offset: int, dtype: torch.dtype,
                  allocation: torch.Tensor) -> torch.Tensor:
    """A cache layer as vLLM's runner views it: `allocation` (its raw int8 buffer) viewed as
    `dtype` and strided (shape, element strides, element offset), as recorded in
    tests/vllm/fixtures/vllm_kv_layouts.json."""
    return torch.as_strided(allocation.view(dtype), tuple(shape), tuple(stride), int(offset))


def _backend_info(backend) -> tuple[str, bool]:
    if isinstance(backend, str):
        return backend, "MLA" in backend.upper()
    name = backend.get_name() if hasattr(backend, "get_name") else getattr(backend, "__name__", "?")
    is_mla = getattr(backend, "is_mla", None)
    return str(name), bool(is_mla()) if callable(is_mla) else "MLA" in str(name).upper()


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _shape_dtype(tensor_or_shape, dtype):
    if isinstance(tensor_or_shape, torch.Tensor):
        if dtype is not None and dtype != tensor_or_shape.dtype:
            raise LayoutError(f"KV cache: dtype {tensor_or_shape.dtype}, expected {dtype}")
        return tuple(tensor_or_shape.shape), tensor_or_shape.dtype
    if dtype is None:
        raise LayoutError("a shape needs its dtype")
    return tuple(int(s) for s in tensor_or_shape), dtype


# ---- the transfer engine ----

@dataclass
class _Pending:
    event: Any  # torch.cuda.Event, or None for a CPU copy
    keep: list  # tensors the queued copies read or write: alive until the event
    on_done: Callable[[], None] | None = None


class KVTransfer:
    """One worker's transfers between host memory (flatkv's layout) and its paged KV caches, layer
    by layer. The same calls for CPU and CUDA caches:

    - loads: `load_layer(layer, src, block_ids)` scatters host bytes into the cache; the
      consumer calls `wait_layer_load(layer)` before the layer's attention. A CPU cache is written
      at once. A CUDA cache: the bytes go host to device on a side stream (straight from `src`
      where it is pinned, a window registered with `register_window`; else through a pinned
      staging copy), are scattered there, and one CUDA event per layer is recorded, which
      `wait_layer_load` makes the current stream wait for: the host never waits.
    - saves: `save_layer(layer, tag, block_ids)` gathers the blocks of a layer (after the work
      queued so far on the current stream, i.e. the layer's attention) into a host buffer per tag,
      (blocks, layers, block_layer_bytes); a CUDA cache gathers on the side stream into a pinned
      buffer, device to host, without waiting. `finish_saves()`, after the step, waits for those
      copies and hands the buffers back, (blocks, layers * block_layer_bytes) each, for a put.
    """

    def __init__(self, layouts: Sequence[PagedLayout] | PagedLayout, caches: Sequence[torch.Tensor]):
        caches = list(caches)
        if isinstance(layouts, PagedLayout):
            layouts = [layouts] * len(caches)
        layouts = list(layouts)
        if len(layouts) != len(caches) or not caches:
            raise LayoutError(f"KVTransfer: {len(layouts)} layouts for {len(caches)} cache layers")
        for i, (lay, c) in enumerate(zip(layouts, caches)):
            lay.check(c, f"KV cache layer {i}")
        devices = {c.device for c in caches}
        if len(devices) != 1:
            raise LayoutError(f"KVTransfer: cache layers on several devices {sorted(map(str, devices))}")
        lbs = {lay.block_layer_bytes for lay in layouts}
        if len(lbs) != 1:
            raise LayoutError(f"KVTransfer: layers of different block sizes {sorted(lbs)} bytes")
        self.layouts, self.caches = layouts, caches
        self.device = caches[0].device
        self.block_layer_bytes = lbs.pop()
        self.cuda = self.device.type == "cuda"
        self._stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._load_events: dict[int, Any] = {}
        self._loads: list[_Pending] = []
        self._loads_started = False
        self._saves: dict[Any, torch.Tensor] = {}
        self._save_pending: list[_Pending] = []
        self._windows: list[tuple[int, int, Any]] = []  # (address, bytes, the buffer kept alive)

    @property
    def layers(self) -> int:
        return len(self.caches)

    # ---- pinned windows ----

    def register_window(self, buf) -> bool:
        """Pins host memory for direct transfers (CUDA: cudaHostRegister, e.g. of the daemon's
        shared-memory window, once). Returns whether it is pinned; a CPU engine pins nothing."""
        if not self.cuda:
            return False
        t = as_uint8(buf)
        if t.numel() == 0:
            return False
        ptr, size = t.data_ptr(), t.numel()
        for p, n, _ in self._windows:
            if p <= ptr and ptr + size <= p + n:
                return True
        if isinstance(buf, torch.Tensor):
            read_only = False
        elif hasattr(buf, "__array_interface__"):
            read_only = not buf.flags.writeable
        else:
            read_only = memoryview(buf).readonly
        # cudaHostRegisterReadOnly (8) for a read-only mapping (a Restore's layer_view), else 0.
        with torch.cuda.device(self.device):
            err = torch.cuda.cudart().cudaHostRegister(ptr, size, 8 if read_only else 0)
        if _cuda_code(err) != 0:
            _clear_cuda_error()  # else torch's next kernel launch check reports it
            return False
        self._windows.append((ptr, size, buf))
        return True

    def close(self) -> None:
        """Waits for every queued copy and unpins the registered windows."""
        self.finish_loads()
        self.finish_saves()
        if self._windows:
            cudart = torch.cuda.cudart()
            for ptr, _, _ in self._windows:
                cudart.cudaHostUnregister(ptr)
            self._windows = []

    def _pinned(self, t: torch.Tensor) -> bool:
        ptr, size = t.data_ptr(), t.numel() * t.element_size()
        if any(p <= ptr and ptr + size <= p + n for p, n, _ in self._windows):
            return True
        try:
            return t.is_pinned()
        except RuntimeError:
            return False

    # ---- loads ----

    def load_layer(self, layer: int, src, block_ids: Sequence[int],
                   on_done: Callable[[], None] | None = None) -> None:
        """Scatters `src` ((len(block_ids), block_layer_bytes) bytes in flatkv's layout: a
        tensor, array or buffer such as a Restore's layer_view) into blocks `block_ids` of layer
        `layer`. on_done() runs once `src` is no longer read (at once for a CPU cache; for a CUDA
        cache from `poll`, `wait_layer_load`'s next calls or `finish_loads`): release the source
        there."""
        block_ids = list(block_ids)
        layout, cache = self.layouts[layer], self.caches[layer]
        n, lb = len(block_ids), self.block_layer_bytes
        s = as_uint8(src)
        if s.dim() != 1:
            s = s.reshape(-1) if s.is_contiguous() else s.contiguous().reshape(-1)
        if s.numel() < n * lb:
            raise LayoutError(f"load of layer {layer}: {s.numel()} bytes for {n} blocks of {lb}")
        s = s[:n * lb]
        if not self.cuda:
            scatter(layout, s, cache, block_ids)
            if on_done:
                on_done()
            return
        layout.check_blocks(block_ids)
        if not self._pinned(s):
            staged = torch.empty(n * lb, dtype=torch.uint8, pin_memory=True)
            staged.copy_(s)
            if on_done:  # the source was copied: it may go now
                on_done()
                on_done = None
            s = staged
        if not self._loads_started:
            # Blocks the previous step's kernels may still read are written after them.
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
            self._loads_started = True
        with torch.cuda.stream(self._stream):
            dev = torch.empty(n * lb, dtype=torch.uint8, device=self.device)
            dev.copy_(s, non_blocking=True)
            scatter(layout, dev, cache, block_ids)
            ev = torch.cuda.Event()
            ev.record(self._stream)
        self._load_events[layer] = ev  # later copies of the stream include earlier ones
        self._loads.append(_Pending(ev, [s, dev], on_done))

    def wait_layer_load(self, layer: int) -> None:
        """Makes the consumer wait for layer's loads: CUDA, the current stream waits for the
        layer's event (the host does not); CPU, nothing to wait for."""
        ev = self._load_events.pop(layer, None)
        if ev is not None:
            torch.cuda.current_stream(self.device).wait_event(ev)
        if not self._load_events:
            self._loads_started = False  # the next load follows the consumer's work again
        self.poll()

    def poll(self) -> None:
        """Runs on_done of the loads whose copies have completed."""
        keep = []
        for p in self._loads:
            if p.event is None or p.event.query():
                if p.on_done:
                    p.on_done()
            else:
                keep.append(p)
        self._loads = keep

    def finish_loads(self) -> None:
        """Waits (host) for every queued load and runs their on_done."""
        for p in self._loads:
            if p.event is not None:
                p.event.synchronize()
            if p.on_done:
                p.on_done()
        self._loads = []
        self._load_events.clear()
        self._loads_started = False

    # ---- saves ----

    def save_layer(self, layer: int, tag, block_ids: Sequence[int]) -> None:
        """Gathers blocks `block_ids` of layer `layer` into the host buffer of `tag` (one per
        request: the same block ids for each of its layers), after the work queued so far."""
        block_ids = list(block_ids)
        layout, cache = self.layouts[layer], self.caches[layer]
        n, lb = len(block_ids), self.block_layer_bytes
        buf = self._saves.get(tag)
        if not self.cuda:
            if buf is None:
                buf = self._saves[tag] = torch.empty((n, self.layers, lb), dtype=torch.uint8)
            elif buf.shape[0] != n:
                raise LayoutError(f"save {tag!r}: {n} blocks at layer {layer}, {buf.shape[0]} before")
            gather(layout, cache, block_ids, buf[:, layer, :])
            return
        layout.check_blocks(block_ids)
        if buf is None:  # layer-major: each layer's device-to-host copy is one contiguous range
            buf = self._saves[tag] = torch.empty((self.layers, n, lb), dtype=torch.uint8, pin_memory=True)
        elif buf.shape[1] != n:
            raise LayoutError(f"save {tag!r}: {n} blocks at layer {layer}, {buf.shape[1]} before")
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            dev = torch.empty((n, lb), dtype=torch.uint8, device=self.device)
            gather(layout, cache, block_ids, dev)
            buf[layer].copy_(dev, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(self._stream)
        self._save_pending.append(_Pending(ev, [dev]))

    def saves_ready(self) -> bool:
        """Whether finish_saves() would not wait."""
        return all(p.event is None or p.event.query() for p in self._save_pending)

    def finish_saves(self) -> dict[Any, torch.Tensor]:
        """Waits for the queued saves and hands back {tag: (blocks, layers * block_layer_bytes)
        uint8 host tensor in flatkv's block layout}; forgets them."""
        for p in self._save_pending:
            p.event.synchronize()
        self._save_pending = []
        saves, self._saves = self._saves, {}
        out = {}
        for tag, buf in saves.items():
            if self.cuda:
                buf = buf.permute(1, 0, 2).contiguous()
            out[tag] = buf.view(buf.shape[0], -1)
        return out


def _cuda_code(err) -> int:
    return int(getattr(err, "value", err))


def _clear_cuda_error() -> None:
    """Resets the CUDA runtime's last error after a failed call (torch's cudart module has no
    cudaGetLastError: the runtime torch loaded is called through ctypes)."""
    f = getattr(torch.cuda.cudart(), "cudaGetLastError", None)
    if f is not None:
        f()
        return
    import ctypes
    try:
        with open("/proc/self/maps") as maps:
            libs = {line.split()[-1] for line in maps if "libcudart" in line}
        for lib in libs:
            ctypes.CDLL(lib).cudaGetLastError()
    except OSError:
        pass
