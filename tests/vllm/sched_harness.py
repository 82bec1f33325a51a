"""vLLM's own Scheduler driving flatkv's connector, with no model: the scheduler-level tests'
engine (tests/vllm/test_scheduler.py) and the reuse crash test's (tests/vllm/reuse_crashtest.py).

vLLM's `Scheduler` (or `AsyncScheduler`) runs unchanged, with the connector it builds itself
(role SCHEDULER). One FlatkvConnector per parallel rank (role WORKER) sits where vLLM's workers
would, over per-rank paged KV caches in vLLM's CPU layout. A stand-in for the model's forward
(`FakeModel`) plays the model runner's part in each step, in the order vLLM's runner calls the
connector (bind metadata, start_load_kv, per layer: wait_for_layer_load, the layer's KV written,
save_kv_layer; then wait_for_save, load errors and stats into the step's KVConnectorOutput):

- the KV it writes for a token is a function of the token's whole prefix (a chained digest over
  the salt, the adapter and every token), the layer and the rank, as real KV is: each row holds
  that digest (xored with the layer and rank) in its first two words, the rest pseudo-random
  words derived from it;
- before computing, it reads back every earlier position's row from the cache, at every layer
  of every rank, and checks the digests: a wrong row (restored from another prefix, another
  rank, a stale block) poisons the request, whose sampled tokens then differ from a run without
  flatkv, and is counted (`wrong_positions`);
- blocks loaded in a step are compared whole, every byte of every layer, with the rows the
  model would have written (`wrong_loaded_bytes`);
- the token it samples is a function of the last position's digest, so outputs equal a run
  without the connector exactly when every restored row was right.
"""
from __future__ import annotations

import copy
import hashlib
import itertools
import os
import struct
import time
from dataclasses import dataclass, field

import numpy as np
import torch

M = os.environ.get("FLATKV_VLLM_MODEL", "")
LAYER_NAME = "model.layers.{}.self_attn.attn"
VOCAB = 49152
_K1, _K2, _K3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _splitmix(x: np.ndarray) -> np.ndarray:
    x = x + _K1
    x = (x ^ (x >> np.uint64(30))) * _K2
    x = (x ^ (x >> np.uint64(27))) * _K3
    return x ^ (x >> np.uint64(31))


def _digest(prev: int, token: int) -> int:
    return int.from_bytes(hashlib.blake2b(struct.pack("<QQ", prev, token), digest_size=8).digest(), "little")


def _mix(layer: int, rank: int) -> int:
    return (layer * 0x100000001B3 + rank * 0xC2B2AE3D27D4EB4F + 1) & 0xFFFFFFFFFFFFFFFF


def base_config(model_dir=M, *, block_size=64, max_model_len=2048, max_num_seqs=8,
                max_num_batched_tokens=2048):
    """A VllmConfig of SmolLM2 (its config.json only: no weights are read) for the CPU platform."""
    from vllm.config import (CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, SchedulerConfig,
                             VllmConfig)
    mc = ModelConfig(model=model_dir, dtype="float32", seed=0, max_model_len=max_model_len, enforce_eager=True)
    return VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=True),
                      scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs,
                                                       max_num_batched_tokens=max_num_batched_tokens,
                                                       max_model_len=max_model_len, is_encoder_decoder=False),
                      parallel_config=ParallelConfig(), device_config=DeviceConfig("cpu"))


def with_settings(base, *, tp=1, pp=1, extra=None, prefix_caching=True, async_scheduling=False,
                  max_num_batched_tokens=None, chunked_prefill=True):
    """A copy of `base` with parallelism, a flatkv connector (extra config `extra`; None: none),
    vLLM's prefix cache and async scheduling set."""
    from vllm.config import KVTransferConfig
    vc = copy.copy(base)
    vc.parallel_config = copy.copy(base.parallel_config)
    vc.parallel_config.tensor_parallel_size = tp
    vc.parallel_config.pipeline_parallel_size = pp
    vc.parallel_config.world_size = tp * pp
    vc.parallel_config.rank = 0
    vc.cache_config = copy.copy(base.cache_config)
    vc.cache_config.enable_prefix_caching = prefix_caching
    vc.scheduler_config = copy.copy(base.scheduler_config)
    vc.scheduler_config.async_scheduling = async_scheduling
    vc.scheduler_config.enable_chunked_prefill = chunked_prefill
    if max_num_batched_tokens:
        vc.scheduler_config.max_num_batched_tokens = max_num_batched_tokens
    # VllmConfig turns the hybrid KV cache manager off for a connector without SupportsHMA.
    vc.scheduler_config.disable_hybrid_kv_cache_manager = extra is not None
    vc.kv_transfer_config = None if extra is None else KVTransferConfig(
        kv_connector="FlatkvConnector", kv_connector_module_path="flatkv.vllm", kv_role="kv_both",
        kv_load_failure_policy="recompute", kv_connector_extra_config=dict(extra))
    return vc


@dataclass
class Req:
    """What the harness tracks of a request, as vLLM's model runner would."""
    req_id: str
    tokens: list[int]  # prompt, then every token sampled
    prompt_len: int
    salt: str | None
    lora: object | None
    max_tokens: int
    block_ids: list[int] = field(default_factory=list)
    digests: list[int] = field(default_factory=list)  # truth: digest after each position
    poisoned: bool = False
    output: list[int] = field(default_factory=list)

    def digest_at(self, p: int) -> int:
        if not self.digests:
            seed = hashlib.blake2b(f"{self.salt}|{getattr(self.lora, 'lora_name', '')}".encode(),
                                   digest_size=8).digest()
            self.digests.append(_digest(int.from_bytes(seed, "little"), self.tokens[0]))
        while len(self.digests) <= p:
            self.digests.append(_digest(self.digests[-1], self.tokens[len(self.digests)]))
        return self.digests[p]


class Engine:
    """vLLM's scheduler and flatkv's worker connectors over fake paged caches (see the module doc)."""

    def __init__(self, vc, *, num_blocks=64, kv_cache_config=None):
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        from vllm.v1.structured_output import StructuredOutputManager
        mc, pc = vc.model_config, vc.parallel_config
        self.vc = vc
        self.bt = vc.cache_config.block_size
        self.tp, self.pp = pc.tensor_parallel_size, pc.pipeline_parallel_size
        self.total_layers = mc.get_total_num_hidden_layers()
        self.heads = mc.get_num_kv_heads(pc)
        self.hd = mc.get_head_size()
        # An fp8 KV cache (cache_dtype fp8*) is one byte an element, allocated as uint8 as vLLM does.
        self.fp8 = (vc.cache_config.cache_dtype or "auto").startswith("fp8")
        self.cache_dtype = torch.uint8 if self.fp8 else torch.float32
        names = [LAYER_NAME.format(i) for i in range(self.total_layers)]
        spec = FullAttentionSpec(block_size=self.bt, num_kv_heads=self.heads, head_size=self.hd,
                                 dtype=self.cache_dtype)
        self.kv_cache_config = kv_cache_config or KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(names, spec)])
        vc.cache_config.num_gpu_blocks = self.kv_cache_config.num_blocks  # as the engine core sets it
        cls = AsyncScheduler if vc.scheduler_config.async_scheduling else Scheduler
        self.sched = cls(vllm_config=vc, kv_cache_config=self.kv_cache_config,
                         structured_output_manager=StructuredOutputManager(vc), block_size=self.bt,
                         log_stats=True)
        self.connector = self.sched.connector
        # One worker connector and cache per rank, each over its pipeline stage's layers.
        self.workers = []
        per_stage = self.total_layers // self.pp
        for rank in range(self.tp * self.pp):
            wc = copy.copy(vc)
            wc.parallel_config = copy.copy(vc.parallel_config)
            wc.parallel_config.rank = rank
            stage = rank // self.tp
            layers = list(range(stage * per_stage, (stage + 1) * per_stage))
            caches = {LAYER_NAME.format(l): torch.zeros(num_blocks, self.heads, self.bt, 2 * self.hd,
                                                        dtype=self.cache_dtype)
                      for l in layers}
            conn = None
            if vc.kv_transfer_config is not None:
                from flatkv.vllm import FlatkvConnector
                conn = FlatkvConnector(wc, KVConnectorRole.WORKER, self.kv_cache_config)
                conn.register_kv_caches(caches)
            self.workers.append((rank, layers, caches, conn))
        self.reqs: dict[str, Req] = {}
        self.finished: dict[str, Req] = {}
        self.wrong_positions = 0
        self.wrong_loaded_bytes = 0
        self.loaded_blocks = 0
        self.saved_blocks = 0
        self.load_error_blocks = 0
        self.stats = []  # the KVConnectorStats each step handed vLLM
        self.steps = 0
        self.preemptions = 0
        self.max_loads_in_a_step = 0
        self.schedule_s = []  # each step's Scheduler.schedule() time
        self._ids = itertools.count()
        self._hasher = None

    # ---- requests ----

    def add(self, prompt: list[int] | None, *, max_tokens=8, salt=None, lora=None, embeds=None,
            req_id=None) -> str:
        """Adds a request of token ids, or of prompt embeds (`embeds`, a (n, hidden) tensor; its
        positions' identities in the fake model are the rows' hashes)."""
        from vllm import SamplingParams
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.request import Request
        from vllm.utils.hashing import get_hash_fn_by_name
        if self._hasher is None:
            fn = get_hash_fn_by_name(self.vc.cache_config.prefix_caching_hash_algo)
            init_none_hash(fn)
            self._hasher = get_request_block_hasher(self.bt, fn)
        req_id = req_id or f"r{next(self._ids)}"
        sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        if embeds is not None:
            idents = [int.from_bytes(hashlib.blake2b(row.numpy().tobytes(), digest_size=4).digest(), "little")
                      for row in embeds]
            r = Request(request_id=req_id, prompt_token_ids=None, prompt_embeds=embeds, sampling_params=sp,
                        pooling_params=None, lora_request=lora, cache_salt=salt, block_hasher=self._hasher)
        else:
            idents = list(prompt)
            r = Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=sp, pooling_params=None,
                        lora_request=lora, cache_salt=salt, block_hasher=self._hasher)
        self.sched.add_request(r)
        self.reqs[req_id] = Req(req_id, idents, len(idents), salt, lora, max_tokens)
        return req_id

    def abort(self, req_id: str):
        from vllm.v1.request import RequestStatus
        self.sched.finish_requests([req_id], RequestStatus.FINISHED_ABORTED)
        self.finished[req_id] = self.reqs.pop(req_id)

    # ---- the model runner's part ----

    def _scheduled(self, out):
        """(Req, num_computed, num_scheduled) per scheduled request, block ids updated."""
        rows = []
        for new in out.scheduled_new_reqs:
            r = self.reqs[new.req_id]
            r.block_ids = list(new.block_ids[0])
            rows.append((r, new.num_computed_tokens, out.num_scheduled_tokens[new.req_id]))
        cached = out.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            r = self.reqs[req_id]
            ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                r.block_ids = list(ids[0]) if ids is not None else []
            elif ids is not None:
                r.block_ids.extend(ids[0])
            rows.append((r, cached.num_computed_tokens[i], out.num_scheduled_tokens[req_id]))
        return rows

    def _rows(self, digests: np.ndarray, layer: int, rank: int) -> torch.Tensor:
        """The KV rows (n, heads, 2, head_dim) the model writes for positions of these digests."""
        w = 2 * self.heads * self.hd
        mixed = digests.astype(np.uint64) ^ np.uint64(_mix(layer, rank))
        x = _splitmix(mixed[:, None] + np.arange(w, dtype=np.uint64)[None, :] * _K3)
        if self.fp8:  # bytes (any fp8 bit pattern), the digest in the first eight
            vals = (x >> np.uint64(56)).astype(np.uint8).reshape(-1, 2, self.heads, self.hd)
        else:
            vals = ((x >> np.uint64(40)).astype(np.float32) / np.float32(1 << 24)).reshape(-1, 2, self.heads, self.hd)
        vals.reshape(len(mixed), -1).view(np.uint8)[:, :8] = mixed[:, None].view(np.uint8)
        return torch.from_numpy(np.ascontiguousarray(vals.transpose(0, 2, 1, 3)))

    def _slots(self, r: Req, lo: int, hi: int):
        pos = np.arange(lo, hi)
        blk = torch.as_tensor(np.asarray(r.block_ids, np.int64)[pos // self.bt])
        off = torch.as_tensor(pos % self.bt)
        return blk, off

    def _check_prefix(self, r: Req, computed: int, rank: int, layers, caches):
        """Counts the positions < computed whose stored digest is not the prefix's (any layer)."""
        if computed == 0:
            return 0
        blk, off = self._slots(r, 0, computed)
        truth = np.array([r.digest_at(p) for p in range(computed)], np.uint64)
        wrong = np.zeros(computed, bool)
        for l in layers:
            c = caches[LAYER_NAME.format(l)]
            first8 = 8 // c.element_size()  # the elements holding a row's digest
            rows = c.view(c.shape[0], self.heads, 2, self.bt, self.hd)[blk, 0, 0, off, :first8].contiguous()
            got = rows.numpy().view(np.uint64).reshape(-1)
            wrong |= got != (truth ^ np.uint64(_mix(l, rank)))
        return int(wrong.sum())

    def _write(self, r: Req, lo: int, hi: int, layer: int, rank: int, cache):
        blk, off = self._slots(r, lo, hi)
        digests = np.array([r.digest_at(p) for p in range(lo, hi)], np.uint64)
        v = cache.view(cache.shape[0], self.heads, 2, self.bt, self.hd)
        v[blk, :, :, off, :] = self._rows(digests, layer, rank)

    def _check_loaded(self, meta, rank, layers, caches):
        """Every byte of the blocks loaded this step against the rows the model would write."""
        for load in meta.loads:
            r = self.reqs[load.req_id]
            first = r.block_ids.index(load.block_ids[0])
            for i, b in enumerate(load.block_ids):
                lo = (first + i) * self.bt
                digests = np.array([r.digest_at(p) for p in range(lo, lo + self.bt)], np.uint64)
                for l in layers:
                    c = caches[LAYER_NAME.format(l)]
                    got = c.view(c.shape[0], self.heads, 2, self.bt, self.hd)[b].permute(2, 0, 1, 3).contiguous()
                    want = self._rows(digests, l, rank)
                    self.wrong_loaded_bytes += int((got.numpy().view(np.uint8) != want.numpy().view(np.uint8)).sum())
                self.loaded_blocks += 1

    def _forward(self, out):
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        rows = self._scheduled(out)
        meta = out.kv_connector_metadata
        errors, stats = set(), None
        for rank, layers, caches, conn in self.workers:
            if conn is not None:
                conn.bind_connector_metadata(meta)
                conn.start_load_kv(None)
            for l in layers:
                name = LAYER_NAME.format(l)
                if conn is not None:
                    conn.wait_for_layer_load(name)
                for r, computed, n in rows:
                    self._write(r, computed, computed + n, l, rank, caches[name])
                if conn is not None:
                    conn.save_kv_layer(name, caches[name], None)
            if conn is not None:
                conn.wait_for_save()
                e = conn.get_block_ids_with_load_errors()
                errors |= e
                s = conn.get_kv_connector_stats()
                if s is not None:
                    stats = s if stats is None else stats.aggregate(s)
                if meta is not None and meta.loads:
                    loaded = copy.copy(meta)
                    loaded.loads = [ld for ld in meta.loads if not errors.intersection(ld.block_ids)]
                    self._check_loaded(loaded, rank, layers, caches)
                conn.clear_connector_metadata()
        self.load_error_blocks += len(errors)
        # The prefix each request attended to, checked after the step's loads (what attention read).
        sampled = []
        for r, computed, n in rows:
            bad = 0
            if not errors.intersection(r.block_ids):
                for rank, layers, caches, conn in self.workers:
                    bad += self._check_prefix(r, computed, rank, layers, caches)
            if bad:
                self.wrong_positions += bad
                r.poisoned = True
            if computed + n >= len(r.tokens) and not errors.intersection(r.block_ids):
                d = r.digest_at(computed + n - 1)
                tok = (d if not r.poisoned else _digest(d, 0xBAD)) % VOCAB
                sampled.append([int(tok)])
            else:
                sampled.append([])
        ids = [r.req_id for r, _, _ in rows]
        kvo = KVConnectorOutput(invalid_block_ids=errors, kv_connector_stats=stats)
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={i: k for k, i in enumerate(ids)},
                                 sampled_token_ids=sampled, kv_connector_output=kvo), rows

    def _apply(self, mro, rows):
        for (r, computed, n), toks in zip(rows, mro.sampled_token_ids):
            if toks and r.req_id in self.reqs and len(r.output) < r.max_tokens:
                r.tokens.extend(toks)
                r.output.extend(toks)

    def step(self):
        t = time.monotonic()
        out = self.sched.schedule()  # where the connector's lookups run
        self.schedule_s.append(time.monotonic() - t)
        self.preemptions += len(out.preempted_req_ids or ())
        if out.kv_connector_metadata is not None:
            self.max_loads_in_a_step = max(self.max_loads_in_a_step, len(out.kv_connector_metadata.loads))
        mro, rows = self._forward(out)
        self._apply(mro, rows)
        eco = self.sched.update_from_output(out, mro)
        # The connector's stats as vLLM hands them to its loggers: the workers' (from the step's
        # KVConnectorOutput) aggregated with the scheduler's, in SchedulerStats.
        for outputs in eco.values():
            st = outputs.scheduler_stats
            if st is not None and st.kv_connector_stats:
                from flatkv.vllm import FlatkvConnector
                self.stats.append(FlatkvConnector.build_kv_connector_stats(st.kv_connector_stats))
        self.steps += 1
        for outputs in eco.values():
            for o in outputs.outputs:
                if o.finish_reason is not None and o.request_id in self.reqs:
                    self.finished[o.request_id] = self.reqs.pop(o.request_id)
        return out

    def run(self, max_steps=2000):
        while self.sched.has_requests():
            self.step()
            if self.steps > max_steps:
                raise RuntimeError(f"the engine did not finish within {max_steps} steps")
        return {k: v.output for k, v in self.finished.items()}

    def stat(self, key: str) -> int:
        return sum(s.data.get(key, 0) for s in self.stats)

    def shutdown(self):
        for _, _, _, conn in self.workers:
            if conn is not None:
                conn.shutdown()
        if self.connector is not None:
            self.connector.shutdown()
