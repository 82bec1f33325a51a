// StoreOptions: everything a Store is opened with, with documented defaults.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flatkv/shape.h"

namespace flatkv {

namespace io {
class IoEngine;
}
class PlacementPolicy;
class Codec;

enum class IoEngineKind : uint8_t {
  kAuto = 0,        // io_uring when the kernel allows it, else the thread pool
  kUring = 1,       // io_uring only; Open fails where it is refused
  kThreadPool = 2,  // blocking pread/pwrite on worker threads
};

struct StoreOptions {
  // The KV shape of every block. Required. Reopening an SSD directory with a
  // different shape or block size is refused.
  KvShape shape;
  // Tokens per block, 16..512. Larger blocks mean fewer, larger I/Os but
  // coarser reuse (a partial block is never stored).
  uint32_t block_tokens = 64;

  // DRAM tier capacity in bytes; 0 disables the tier. The arena is reserved
  // and pre-faulted at Open, rounded up to 2 MiB. Capacity holds exactly:
  // allocated extents never exceed it.
  uint64_t dram_capacity_bytes = 256ull << 20;
  // SSD directories; empty disables the tier. Each holds its own segment
  // files and manifest.
  std::vector<std::string> ssd_dirs;
  // SSD capacity per directory in bytes (segment files are created lazily up
  // to it and never exceed it).
  uint64_t ssd_capacity_bytes = 4ull << 30;
  // Size of one preallocated segment file. Extents are carved from segments.
  uint64_t segment_bytes = 256ull << 20;

  // Target size of one layer's run inside an extent, per medium. An extent
  // holds ceil(target / block_layer_bytes) blocks, so restoring one extent's
  // worth of a layer is one request of about this size. Larger SSD runs mean
  // fewer, larger reads (>= 1 MiB is where the disk reaches full bandwidth)
  // at the cost of more space held by a session's last, partly filled extent.
  uint64_t dram_extent_layer_bytes = 256ull << 10;
  uint64_t ssd_extent_layer_bytes = 2ull << 20;

  // The most DRAM one session may hold before the default placement sends
  // its new extents to SSD.
  uint64_t session_dram_share_bytes = 64ull << 20;
  // A session untouched for this long is idle: its DRAM extents may be
  // reclaimed to make room for another session's new extents. Reclaimed
  // blocks are gone (blocks never migrate), so this trades DRAM hits for
  // new sessions against misses for sessions that come back: agent sessions
  // pause for minutes between calls. In the Claude Code replay
  // (docs/benchmarks.md) 10 s lost 2.4-3.6 points of hit rate against an
  // infinite cache, 600 s lost 0.1-0.3.
  std::chrono::milliseconds dram_idle_after{600000};

  // A restore's window holds max(window_layers, window_bytes / layer bytes)
  // layers (at most the model's): the layers loading or held by the consumer
  // at once. More layers in flight keep the SSD busy for small layers; a
  // larger window costs memory. One window of window_bytes is pre-faulted
  // at Open.
  uint32_t window_layers = 4;
  uint64_t window_bytes = 32ull << 20;
  // Coalesced reads are split into requests of at most this many bytes.
  uint64_t max_request_bytes = 4ull << 20;

  IoEngineKind ssd_io = IoEngineKind::kAuto;
  uint32_t ssd_queue_depth = 32;  // io_uring ring entries
  uint32_t ssd_threads = 4;       // thread-pool engine workers
  uint32_t dram_threads = 2;      // workers copying DRAM hits into windows or caller memory
  // Ask for O_DIRECT on segment files (falls back to buffered, with a warning
  // and a stat, where the filesystem refuses it).
  bool use_direct_io = true;
  // fdatasync segment data and the manifest after every Put. Off: a Put
  // survives a process crash (kill -9) but not a power loss; torn data is
  // still never returned, because every block is checksummed.
  bool sync_writes = false;
  // Open existing SSD directories for inspection only: nothing is written
  // (no recovery rewrite, no compaction on Close), and Put and DropSession
  // fail with FailedPrecondition. `flatkv stats` opens stores this way.
  bool read_only = false;
  // Verify checksums of DRAM hits too (SSD hits are always verified).
  bool verify_dram_reads = false;

  // The codec new blocks are stored with, unless a Put names its own
  // (PutOptions::codec); null (the default) stores raw slices, unframed, at
  // a fixed stride: the original format. With a codec, each layer slice is
  // kept encoded (packed, variable size) on both media, checksummed as
  // encoded, and decoded into the destination during a restore. Smaller
  // stored bytes mean shorter SSD reads and more blocks per extent, at the
  // cost of encode time on Put and decode time (on decode_threads) on restore.
  // A store reopened with a custom (unregistered) codec must be given it
  // here again to read the extents written with it.
  std::shared_ptr<const Codec> codec;
  // Workers decoding restored coded slices, in parallel across blocks, while
  // later layers load.
  uint32_t decode_threads = 4;

  // Medium placement; null means DefaultPlacement.
  std::shared_ptr<PlacementPolicy> placement;
  // I/O engine for the SSD tier; null means one made from ssd_io. Tests
  // inject a FaultInjectionEngine here.
  std::shared_ptr<io::IoEngine> ssd_engine;
  // The clock that session idleness (dram_idle_after) and LRU are judged
  // by; null means std::chrono::steady_clock::now. A trace replay passes
  // its simulated time.
  std::function<std::chrono::steady_clock::time_point()> clock;
};

}  // namespace flatkv
