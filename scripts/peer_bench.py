#!/usr/bin/env python3
"""The storage peers of `flatkv bench restore` and `flatkv bench serve`, driven
through their own Python APIs (docs/baselines.md, "Mooncake Store" and "LMCache's
backends").

flatkv starts this driver as a child (src/bench/bench_peers.cc) and speaks one JSON
object per line on stdin/stdout; logs go to stderr. The session's bytes come in a
memfd the parent passes down (--memfd FD): the session at offset 0, and the parent
reads each run's delivered bytes back from offset --dst-offset, so the parent checks
them against its own copy of the session. Nothing is timed here that the parent
does not ask for.

  peer_bench.py mooncake --dir SCRATCH --memfd FD --memfd-bytes N
                         --dst-offset D --pool-bytes P [--ssd]
      starts mooncake_master and a standalone mooncake_client (the "real client"
      that owns the DRAM pool and, with --ssd, the SSD offload) on loopback; the
      driver itself contributes no segment: a DummyClient (setup_dummy, the
      standalone deployment's client) and an embedded client with
      global_segment_size 0 (setup, TCP transfer engine) read with batch_get_into.
  peer_bench.py lmcache --dir SCRATCH --memfd FD --memfd-bytes N --dst-offset D
      LMCache's LocalCPUBackend and LocalDiskBackend in this process, CPU tensors.

Requests: {"op": "setup", "blocks": N, "block_bytes": B, "block_tokens": T,
"layers": L, "keys": [hex, ...]}, {"op": "prepare", "mode": M}, {"op": "run",
"mode": M}, {"op": "latency", "count": C, "value_bytes": V}, {"op": "quit"}.
Replies: {"ok": true, ...} or {"ok": false, "error": "..."}.
"""

import argparse
import ctypes
import json
import mmap
import os
import signal
import socket
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1


def log(msg):
    print(f"peer_bench: {msg}", file=sys.stderr, flush=True)


def die_with_parent():
    # A Mooncake process must not outlive this driver (or flatkv): the kernel
    # sends SIGKILL when the driver dies, however it dies.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def addr_of(buf, offset=0):
    return ctypes.addressof(ctypes.c_char.from_buffer(buf, offset))


def percentile(samples, q):
    s = sorted(samples)
    if not s:
        return 0.0
    k = min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))
    return s[k]


def evict_page_cache(root):
    """fdatasync + POSIX_FADV_DONTNEED on every file under root; returns the files."""
    files = []
    for d, _, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            try:
                fd = os.open(p, os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                files.append(p)
            finally:
                os.close(fd)
    return files


class Session:
    def __init__(self, req, shared, dst_offset):
        self.blocks = int(req["blocks"])
        self.block_bytes = int(req["block_bytes"])
        self.block_tokens = int(req["block_tokens"])
        self.layers = int(req["layers"])
        self.keys = list(req["keys"])
        if len(self.keys) != self.blocks:
            raise ValueError(f"setup: {len(self.keys)} keys for {self.blocks} blocks")
        self.bytes = self.blocks * self.block_bytes
        if dst_offset < self.bytes or dst_offset + self.bytes > len(shared):
            raise ValueError(f"setup: a {self.bytes}-byte session does not fit the {len(shared)}-byte memfd "
                             f"with its destination at {dst_offset}")
        self.shared = shared
        self.dst_offset = dst_offset


class Mooncake:
    """Mooncake Store deployed standalone (docs/baselines.md cites every setting)."""

    def __init__(self, args, shared):
        from mooncake.store import MooncakeDistributedStore  # noqa: F401 (fails early when missing)
        self.args = args
        self.shared = shared
        self.procs = []
        self.dummy = None
        self.tcp = None
        self.session = None
        self.ssd = args.ssd
        self.offload_dir = os.path.join(args.dir, "mooncake-offload")
        self.pool_bytes = args.pool_bytes
        self.info = {}

    def spawn(self, name, argv, env=None):
        logf = open(os.path.join(self.args.dir, name + ".log"), "ab")
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env,
                             preexec_fn=die_with_parent)
        self.procs.append((name, p))
        return p

    def start(self, dummy_pool_bytes):
        from mooncake.store import MooncakeDistributedStore
        # The wheel's binaries, run directly (its console scripts only exec them).
        import mooncake
        bin_dir = os.path.dirname(mooncake.__file__)
        master_port, client_port, metrics_port = free_port(), free_port(), free_port()
        os.makedirs(self.offload_dir, exist_ok=True)
        # The master as the deployment guide's quick start runs it, on loopback; with
        # --ssd as docs/source/deployment/ssd/ssd-offload.md's example: offload on, at
        # eviction time. promotion_on_hit stays at its default (false): promotion would
        # turn later SSD reads into the DRAM reads measured separately.
        margv = [os.path.join(bin_dir, "mooncake_master"), f"--rpc_port={master_port}", "--rpc_address=127.0.0.1",
                 f"--metrics_port={metrics_port}", "--logtostderr"]
        if self.ssd:
            margv += ["--enable_offload=true", "--offload_on_evict=true"]
        master = self.spawn("mooncake_master", margv)
        self.wait_port(master, "mooncake_master", master_port)
        env = dict(os.environ)
        cargv = [os.path.join(bin_dir, "mooncake_client"), f"--master_server_address=127.0.0.1:{master_port}",
                 "--host=127.0.0.1", f"--port={client_port}", "--protocol=tcp", "--metadata_server=P2PHANDSHAKE",
                 f"--global_segment_size={self.pool_bytes}", "--logtostderr"]
        if self.ssd:
            cargv += ["--enable_offload=true"]
            env["MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"] = self.offload_dir
            env["MOONCAKE_OFFLOAD_STORAGE_BACKEND_DESCRIPTOR"] = "bucket_storage_backend"
            # The offload heartbeat (default 10 s) only paces how fast evicted objects
            # reach the SSD during setup; reads do not wait on it.
            env["MOONCAKE_OFFLOAD_HEARTBEAT_INTERVAL_SECONDS"] = "1"
        client = self.spawn("mooncake_client", cargv, env)
        self.wait_port(client, "mooncake_client", client_port)
        self.dummy = MooncakeDistributedStore()
        rc = -1
        deadline = time.time() + 20
        while time.time() < deadline:
            rc = self.dummy.setup_dummy(dummy_pool_bytes, 512 << 20, f"127.0.0.1:{client_port}")
            if rc == 0:
                break
            time.sleep(0.2)
        if rc != 0:
            raise RuntimeError(f"setup_dummy to mooncake_client at 127.0.0.1:{client_port} returned {rc}")
        self.tcp = MooncakeDistributedStore()
        rc = self.tcp.setup("127.0.0.1", "P2PHANDSHAKE", 0, 512 << 20, "tcp", "", f"127.0.0.1:{master_port}")
        if rc != 0:
            raise RuntimeError(f"setup (embedded client, no segment, tcp) returned {rc}")
        self.info.update({"master_port": master_port, "client_port": client_port, "pool_bytes": self.pool_bytes,
                          "protocol": "tcp (no RDMA on this machine)", "metadata_server": "P2PHANDSHAKE",
                          "offload_backend": "bucket_storage_backend" if self.ssd else None})

    def wait_port(self, proc, name, port):
        deadline = time.time() + 30
        while time.time() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} (log: {self.args.dir}/{name}.log)")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{name} did not listen on 127.0.0.1:{port} within 30 s")

    def put_all(self, keys, offsets, nbytes, staging, staging_bytes):
        """batch_put_from through the dummy's shared pool, staging_bytes at a time, retrying
        the keys that failed while the pool is full (the master evicts; with --ssd it
        offloads first)."""
        per = max(1, staging_bytes // nbytes)
        for i in range(0, len(keys), per):
            pending = list(range(i, min(i + per, len(keys))))
            deadline = time.time() + 300
            while pending:
                for slot, j in enumerate(pending):
                    ctypes.memmove(staging + slot * nbytes, addr_of(self.shared, offsets[j]), nbytes)
                rc = self.dummy.batch_put_from([keys[j] for j in pending],
                                               [staging + slot * nbytes for slot in range(len(pending))],
                                               [nbytes] * len(pending))
                failed = [(j, r) for j, r in zip(pending, rc) if r != 0]
                if failed and time.time() > deadline:
                    raise RuntimeError(f"batch_put_from kept failing for 300 s (code {failed[0][1]})")
                pending = [j for j, _ in failed]
                if pending:
                    time.sleep(0.05)

    def setup(self, req):
        s = Session(req, self.shared, self.args.dst_offset)
        self.session = s
        staging_bytes = max(s.block_bytes, min(64 << 20, s.bytes))
        self.start(dummy_pool_bytes=s.bytes + staging_bytes + (64 << 20))
        d = self.dummy
        self.dst = d.alloc_from_mem_pool(s.bytes)
        staging = d.alloc_from_mem_pool(staging_bytes)
        if not self.dst or not staging:
            raise RuntimeError("alloc_from_mem_pool failed")
        for ptr, n in ((self.dst, s.bytes), (staging, staging_bytes)):
            if d.register_buffer(ptr, n) != 0:
                raise RuntimeError("register_buffer on the dummy's pool failed")
        # The embedded TCP client reads straight into the parent's destination region.
        self.tcp_dst = addr_of(self.shared, s.dst_offset)
        if self.tcp.register_buffer(self.tcp_dst, s.bytes) != 0:
            raise RuntimeError("register_buffer (embedded client) failed")
        t0 = time.time()
        self.put_all(s.keys, [b * s.block_bytes for b in range(s.blocks)], s.block_bytes, staging, staging_bytes)
        filler = 0
        if self.ssd:
            # Push the session out of the pool: other sessions' blocks, the pool's size
            # plus two 256 MiB buckets, so the master evicts (and offloads) every block of
            # this one and the bucket backend closes the buckets holding them.
            filler = (self.pool_bytes + (512 << 20)) // s.block_bytes + 1
            fkeys = [f"filler-{s.keys[0]}-{i}" for i in range(filler)]
            self.put_all(fkeys, [(i % s.blocks) * s.block_bytes for i in range(filler)], s.block_bytes, staging,
                         staging_bytes)
            self.wait_offloaded(s)
        self.info.update({"put_seconds": time.time() - t0, "objects": s.blocks, "object_bytes": s.block_bytes,
                          "filler_objects": filler})
        return {"info": self.info}

    def wait_offloaded(self, s):
        """Every session block must be off the pool and on SSD before a read is timed: waits
        until the master lists each one with a local-disk replica and no memory replica."""
        deadline = time.time() + 180
        while True:
            desc = self.tcp.batch_get_replica_desc(s.keys)
            in_memory = sum(1 for k in s.keys if any(r.is_memory_replica() for r in desc.get(k, [])))
            on_disk = sum(1 for k in s.keys if any(r.is_local_disk_replica() for r in desc.get(k, [])))
            if in_memory == 0 and on_disk == s.blocks:
                return
            if time.time() > deadline:
                raise RuntimeError(f"180 s after overfilling the {self.pool_bytes}-byte pool, {in_memory} of "
                                   f"{s.blocks} blocks still have a memory replica and {on_disk} a local-disk one")
            time.sleep(0.5)

    def prepare(self, req):
        files = evict_page_cache(self.offload_dir) if self.ssd else []
        return {"evicted_files": len(files)}

    def run(self, req):
        s = self.session
        mode = req["mode"]
        keys = s.keys
        if mode == "tcp":
            client, base = self.tcp, self.tcp_dst
        else:
            client, base = self.dummy, self.dst
        ptrs = [base + b * s.block_bytes for b in range(s.blocks)]
        sizes = [s.block_bytes] * s.blocks
        t0 = time.perf_counter()
        retried = self.get_all(client, keys[:1], ptrs[:1], sizes[:1], mode)
        t1 = time.perf_counter()
        if s.blocks > 1:
            retried += self.get_all(client, keys[1:], ptrs[1:], sizes[1:], mode)
        t2 = time.perf_counter()
        if mode != "tcp":  # hand the bytes to the parent (untimed)
            ctypes.memmove(addr_of(self.shared, s.dst_offset), self.dst, s.bytes)
        return {"seconds": t2 - t0, "first_chunk_seconds": t1 - t0, "retried_gets": retried}

    # Codes a caller retries: the object's offload buffer lease ran out before the read
    # finished (OBJECT_HAS_LEASE, when an SSD read takes longer than
    # MOONCAKE_OFFLOAD_CLIENT_BUFFER_GC_TTL_MS, 5 s: real_client.cpp), LEASE_EXPIRED.
    RETRYABLE = (-706, -707)

    def get_all(self, client, keys, ptrs, sizes, mode):
        """batch_get_into, retrying the keys that failed with a retryable code (at most 3
        more times, inside the timed region: a caller waits for them too)."""
        retried = 0
        pending = list(range(len(keys)))
        for attempt in range(4):
            got = client.batch_get_into([keys[i] for i in pending], [ptrs[i] for i in pending],
                                        [sizes[i] for i in pending])
            failed = [(i, r) for i, r in zip(pending, got) if r != sizes[i]]
            if not failed:
                return retried
            if attempt == 3 or any(r not in self.RETRYABLE for _, r in failed):
                i, r = failed[0]
                raise RuntimeError(f"batch_get_into ({mode}): block {keys[i]} returned {r}, {len(failed)} of "
                                   f"{len(pending)} blocks failed (after {attempt} retries)")
            retried += len(failed)
            pending = [i for i, _ in failed]
        return retried

    def latency(self, req):
        """Per-object get_into latency, one client, closed loop: of the session's blocks
        (value_bytes 0) or of one small value (value_bytes > 0, put first)."""
        count = int(req.get("count", 1000))
        vb = int(req.get("value_bytes", 0))
        d = self.dummy
        if vb > 0:
            key, size, ptr = f"small-{vb}", vb, self.dst
            ctypes.memmove(ptr, b"x" * vb, vb)
            rc = d.batch_put_from([key], [ptr], [vb])
            if rc[0] != 0:
                raise RuntimeError(f"batch_put_from of a {vb}-byte value returned {rc[0]}")
            keys = [key]
        else:
            s = self.session
            size, keys = s.block_bytes, s.keys
        samples = []
        for i in range(count):
            k = keys[i % len(keys)]
            t0 = time.perf_counter_ns()
            r = d.get_into(k, self.dst, size)
            t1 = time.perf_counter_ns()
            if r != size:
                raise RuntimeError(f"get_into({k}) returned {r}")
            samples.append((t1 - t0) / 1e3)
        return {"p50_us": percentile(samples, 0.5), "p99_us": percentile(samples, 0.99), "count": count,
                "value_bytes": size, "clients": 1}

    def close(self):
        for c in (self.tcp, self.dummy):
            try:
                if c is not None:
                    c.close()
            except Exception as e:  # noqa: BLE001 (closing; the processes go next anyway)
                log(f"close: {e}")
        for name, p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("peer", choices=["mooncake", "lmcache"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--memfd", type=int, required=True)
    ap.add_argument("--memfd-bytes", type=int, required=True)
    ap.add_argument("--dst-offset", type=int, required=True)
    ap.add_argument("--pool-bytes", type=int, default=0)
    ap.add_argument("--ssd", action="store_true")
    args = ap.parse_args()
    die_with_parent()
    shared = mmap.mmap(args.memfd, args.memfd_bytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    out = sys.stdout
    try:
        if args.peer == "mooncake":
            peer = Mooncake(args, shared)
        else:
            import lmcache_peer  # scripts/lmcache_peer.py, beside this file
            peer = lmcache_peer.LMCachePeer(args, shared)
    except Exception as e:  # noqa: BLE001 (reported to the parent, which records it)
        out.write(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}) + "\n")
        out.flush()
        return 1
    out.write(json.dumps({"ok": True, "ready": args.peer}) + "\n")
    out.flush()
    rc = 0
    try:
        for line in sys.stdin:
            req = json.loads(line)
            op = req.get("op")
            if op == "quit":
                out.write(json.dumps({"ok": True}) + "\n")
                out.flush()
                break
            try:
                fn = {"setup": peer.setup, "prepare": peer.prepare, "run": peer.run, "latency": peer.latency}[op]
                rep = fn(req)
                rep["ok"] = True
            except Exception as e:  # noqa: BLE001 (reported, with its type)
                rep = {"ok": False, "error": f"{op}: {type(e).__name__}: {e}"}
            out.write(json.dumps(rep) + "\n")
            out.flush()
    finally:
        peer.close()
    return rc


if __name__ == "__main__":
    sys.exit(main())
