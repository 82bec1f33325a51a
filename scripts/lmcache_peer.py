"""LMCache's LocalCPUBackend and LocalDiskBackend as a peer of `flatkv bench restore`
(scripts/peer_bench.py loads this module; docs/baselines.md cites every setting).

Both backends run in this process with CPU tensors, built the way LMCache's own
benchmarks/storage_backend_io/storage_backend_io_benchmark.py builds them
(LMCacheEngineConfig.from_defaults, an LMCacheMetadata, an event loop thread for the
disk worker). The session's bytes become LMCache chunks of its default chunk_size,
256 tokens: chunk c holds tokens 256c.. of the session, i.e. the bytes of flatkv
blocks 256c/block_tokens.. back to back, in KV_2LTD memory objects (2, layers, tokens,
hidden). A restore gets every chunk and copies it into the destination, as LMCache's
retrieve copies each chunk into the engine's KV buffer.
"""

import asyncio
import os
import threading
import time

import torch

from lmcache.utils import CacheEngineKey
from lmcache.v1.config import LMCacheEngineConfig
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.metadata import LMCacheMetadata
from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

CHUNK_TOKENS = 256  # LMCacheEngineConfig's chunk_size default (docs: "256 Tokens per KV Chunk")
MODEL = "flatkv-bench"


def _evict(root):
    n = 0
    for d, _, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(d, name), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return n


class LMCachePeer:
    def __init__(self, args, shared):
        self.args = args
        self.shared = shared
        self.loop = None
        self.cpu = None
        self.disk = None
        self.disk_dir = os.path.join(args.dir, "lmcache-disk")
        self.info = {}

    def setup(self, req):
        import peer_bench
        s = peer_bench.Session(req, self.shared, self.args.dst_offset)
        self.s = s
        tokens = s.blocks * s.block_tokens
        bytes_per_token = s.block_bytes // s.block_tokens
        dtype = torch.bfloat16 if bytes_per_token % (2 * s.layers * 2) == 0 else torch.uint8
        hidden = bytes_per_token // (2 * s.layers * dtype.itemsize)
        if hidden * 2 * s.layers * dtype.itemsize != bytes_per_token:
            raise ValueError(f"{bytes_per_token} bytes per token do not split into 2 x {s.layers} layers")
        self.dtype = dtype
        self.chunks = []  # (key, first token, tokens)
        for c, t0 in enumerate(range(0, tokens, CHUNK_TOKENS)):
            n = min(CHUNK_TOKENS, tokens - t0)
            self.chunks.append((CacheEngineKey(MODEL, 1, 0, c, dtype), t0, n))
        self.bytes_per_token = bytes_per_token
        self.hidden = hidden
        gib = (s.bytes * 2 + (256 << 20)) / 2**30
        self.loop = asyncio.new_event_loop()
        self.loop_thread = threading.Thread(target=self.loop.run_forever, name="lmcache-loop", daemon=True)
        self.loop_thread.start()
        # Defaults everywhere but the sizes: chunk_size 256 (its default), the CPU pool and
        # the disk quota large enough for the session (max_local_cpu_size defaults to 5 GB,
        # max_local_disk_size to 0: disk off), use_odirect False and 4 disk I/O threads
        # (LocalDiskBackend's defaults).
        config = LMCacheEngineConfig.from_defaults(chunk_size=CHUNK_TOKENS, local_cpu=True, max_local_cpu_size=gib,
                                                   local_disk=self.disk_dir, max_local_disk_size=gib,
                                                   lmcache_instance_id="flatkv_bench_lmcache")
        metadata = LMCacheMetadata(model_name=MODEL, world_size=1, local_world_size=1, worker_id=0, local_worker_id=0,
                                   kv_dtype=dtype, kv_shape=(s.layers, 2, CHUNK_TOKENS, 1, hidden))
        self.cpu = LocalCPUBackend(config=config, metadata=metadata, dst_device="cpu")
        self.disk = LocalDiskBackend(config=config, loop=self.loop, local_cpu_backend=self.cpu, dst_device="cpu",
                                     metadata=metadata)
        t0 = time.time()
        done = threading.Semaphore(0)
        for key, first, n in self.chunks:
            obj = self._alloc(n)
            obj.tensor.view(torch.uint8).reshape(-1).copy_(self._session_view(first, n))
            self.cpu.submit_put_task(key, obj)
            self.disk.submit_put_task(key, obj, on_complete_callback=lambda _k: done.release())
            obj.ref_count_down()  # the backends hold their own references
        for _ in self.chunks:
            if not done.acquire(timeout=600):
                raise RuntimeError("LocalDiskBackend did not finish writing the session within 600 s")
        self.info = {"chunk_tokens": CHUNK_TOKENS, "chunks": len(self.chunks), "dtype": str(dtype),
                     "kv_format": "KV_2LTD", "disk_io_threads": self.disk._read_thread_pool._max_workers,
                     "use_odirect": self.disk.use_odirect, "put_seconds": time.time() - t0,
                     "allocator": type(self.cpu.memory_allocator).__name__}
        return {"info": self.info}

    def _alloc(self, tokens):
        shape = torch.Size([2, self.s.layers, tokens, self.hidden])
        obj = self.cpu.allocate(shape, self.dtype, MemoryFormat.KV_2LTD)
        if obj is None:
            raise RuntimeError(f"LocalCPUBackend.allocate({list(shape)}) returned None")
        return obj

    def _session_view(self, first_token, tokens):
        off = first_token * self.bytes_per_token
        return torch.frombuffer(self.shared, dtype=torch.uint8, count=tokens * self.bytes_per_token, offset=off)

    def _dst_view(self, first_token, tokens):
        off = self.s.dst_offset + first_token * self.bytes_per_token
        return torch.frombuffer(self.shared, dtype=torch.uint8, count=tokens * self.bytes_per_token, offset=off)

    def prepare(self, req):
        return {"evicted_files": _evict(self.disk_dir) if req.get("mode") == "disk" else 0}

    def _deliver(self, objs, chunks):
        for obj, (key, first, n) in zip(objs, chunks):
            if obj is None:
                raise RuntimeError(f"chunk {key.chunk_hash} missing")
            self._dst_view(first, n).copy_(obj.tensor.view(torch.uint8).reshape(-1))
            obj.ref_count_down()

    def run(self, req):
        mode = req["mode"]
        chunks = self.chunks
        keys = [k for k, _, _ in chunks]
        t0 = time.perf_counter()
        if mode == "cpu":
            first = [self.cpu.get_blocking(keys[0])]
            self._deliver(first, chunks[:1])
            t1 = time.perf_counter()
            self._deliver([self.cpu.get_blocking(k) for k in keys[1:]], chunks[1:])
        elif mode == "disk":
            first = [self.disk.get_blocking(keys[0])]
            self._deliver(first, chunks[:1])
            t1 = time.perf_counter()
            if len(keys) > 1:
                self._deliver(self.disk.batched_get_blocking(keys[1:]), chunks[1:])
        else:
            raise ValueError(f"mode {mode!r}: cpu or disk")
        t2 = time.perf_counter()
        return {"seconds": t2 - t0, "first_chunk_seconds": t1 - t0}

    def latency(self, req):
        raise RuntimeError("per-object latency is measured on Mooncake only")

    def close(self):
        try:
            if self.disk is not None:
                self.disk.close()
            if self.cpu is not None:
                self.cpu.close()
        finally:
            if self.loop is not None:
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.loop_thread.join(timeout=5)
