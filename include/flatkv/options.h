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

// Which blocks a store with an SSD tier writes to SSD.
enum class SsdAdmission : uint8_t {
  // Every block, when it is put: a put is acknowledged once its SSD write
  // has completed, and every acknowledged block survives kill -9 (with
  // sync_writes, power loss too). The default.
  kAll = 0,
  // A session's blocks reach SSD only once the session has been reused
  // (a restore hit its blocks), after Dynamo KVBM's presence filter and
  // LMCache's SSD gate: fewer SSD bytes written, for wear. Until then its
  // blocks are DRAM-only: acknowledged as DRAM-only
  // (PutResult::dram_only_blocks, StoreStats::dram_only_blocks), held only
  // in the session's DRAM copies (a put with a block no copy can take writes
  // its SSD homes after all),
  // and lost when their copy is reclaimed or the process dies. When a
  // restore that hit the session ends, its DRAM-only blocks are written to
  // their SSD homes, and its later puts write through. Raw blocks only:
  // coded puts always write through.
  kOnReuse = 1,
};

// The remote tier (docs/remote.md): a Redis Cluster that the nodes of a
// fleet share. With `seeds` set, every put's blocks are published there in
// the background, and a restore looks up what the local media miss and
// restores it from there, layer by layer, into the same window or target.
struct RemoteOptions {
  std::vector<std::string> seeds;  // "host:port" of cluster nodes (one must answer at Open); empty: no remote tier
  std::string user;                // ACL user (empty: `default`)
  std::string password;            // AUTH when non-empty
  bool tls = false;
  std::string tls_ca_file;         // empty: the system's CAs
  bool tls_verify = true;
  // Every name starts "<prefix>:" (an ACL key pattern "~<prefix>:*"); no
  // hash tags, so a prefix's objects spread over the shards. Nodes that
  // share blocks must share it.
  std::string prefix = "fkv";
  uint64_t object_bytes = 4ull << 20;  // payload bytes per object at most (1-4 MiB suits Redis)
  uint32_t max_inflight = 32;          // objects a restore requests at once
  uint32_t ttl_seconds = 0;            // objects and index entries expire (0: never; maxmemory evicts)
  std::chrono::milliseconds timeout{1000};  // one request; a lookup gives up after it
  // Put data copied and waiting to be published, at most: of a put that
  // does not fit, the leading blocks that do are published and the rest
  // are not (counted in RemoteStats::publish_dropped_blocks); a put never
  // waits for the cluster. 0 derives it: max(256 MiB, dram_capacity_bytes
  // / 16) (a 70B block of 64 tokens is 20 MiB; docs/service.md).
  uint64_t publish_buffer_bytes = 0;
  // The cluster bytes this store keeps, at most (0: no cap of its own): past
  // it, the objects and index entries it published first are deleted
  // (another node's entries that pointed at them then miss cleanly). It
  // counts what this process published; objects of an earlier run are
  // left to ttl_seconds or the shards' maxmemory.
  uint64_t capacity_bytes = 0;
  // After a lookup fails (a stalled or unreachable cluster), restores skip
  // the remote tier for this long, so they cost no more timeouts.
  std::chrono::milliseconds backoff{1000};
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
  // Extents sized to their session: the targets above are the largest
  // extent, and a new extent holds about the blocks its put still places,
  // and at least an eighth of what its session holds, so a short session
  // takes little more than its blocks and a long one few large extents
  // (docs/format_segment.md, "Sized extents"). Fixed with this false: every
  // extent is the largest (what stores before manifest version 5 hold; an
  // SSD directory keeps the choice it was created with).
  bool sized_extents = true;

  // Placement with an SSD tier (docs/architecture.md, "Placement and
  // reclaim"): every block gets its home on SSD, written once and never
  // moved; DRAM holds *copies* of the extents of recently used sessions.
  // Dropping a copy never loses data. Without an SSD tier DRAM is the only
  // home and reclaim deletes blocks.
  //
  // The most DRAM one session's copies (and DRAM homes) may hold before its
  // new extents get no copy (PutHint::kHot ignores it); 0 derives it:
  // max(one DRAM extent slot, dram_capacity_bytes / 2). A larger share lets
  // one long session keep more of its prefix in DRAM at the expense of the
  // others.
  uint64_t session_dram_share_bytes = 0;
  // DRAM-only stores: a session untouched for this long is idle, and its
  // extents are reclaimed before those of sessions in use. With an SSD
  // tier, DRAM copies are reclaimed least recently used session first
  // whatever their age, and this setting is not used.
  std::chrono::milliseconds dram_idle_after{600000};
  // Which blocks are written to their SSD home (docs/architecture.md,
  // "Durability").
  SsdAdmission ssd_admission = SsdAdmission::kAll;
  // A restore that read a session's blocks from SSD into host memory also
  // re-admits them as that session's DRAM copy (a copy, never a move), when
  // the placement policy would copy the extent and a DRAM slot can be had
  // without waiting. Costs one memcpy of the restored bytes; makes the
  // session's next restore a DRAM hit (figures in docs/benchmarks.md).
  bool readmit_on_restore = true;
  // Bytes of put data whose DRAM copy is visible but whose SSD write has
  // not completed yet; a put beyond it waits for earlier SSD writes
  // (back-pressure; a put alone may exceed it). 0 derives it:
  // max(64 MiB, dram_capacity_bytes / 4).
  uint64_t ssd_write_buffer_bytes = 0;

  // A restore's window holds max(window_layers, window_bytes / layer bytes)
  // layers (at most the model's; at most ssd_layers_in_flight where it reads
  // an SSD): the layers loading or held by the consumer at once. More layers
  // in flight keep the SSD busy for small layers; a larger window costs
  // memory. One window of window_bytes is pre-faulted
  // at Open. A restore from SSD whose reads all land in its RestoreTarget's
  // destinations holds no window: ssd_layers_in_flight alone bounds it.
  uint32_t window_layers = 4;
  uint64_t window_bytes = 32ull << 20;
  // A restore that reads an SSD keeps at most this many layers in flight,
  // however many its window holds, and reads layer 0 alone first when the
  // model has more: layers then land one after another, so each is checked
  // while later ones arrive and layer 0 is ready in a fraction of the
  // session's time (a 2 MiB session of llama-3.1-8b: first layer 0.79-0.97
  // -> 0.18-0.22 ms, the whole restore as fast; docs/benchmarks.md).
  uint32_t ssd_layers_in_flight = 16;
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
  // Online manifest checkpoints: when an SSD directory's manifest log has
  // grown past max(this, 2 x its last snapshot), a background thread
  // rewrites it as a snapshot of its live records (Manifest::Checkpoint),
  // so the log and the recovery that replays it stay bounded. 0: only at
  // Close (and after a recovery that dropped something).
  uint64_t manifest_checkpoint_bytes = 64ull << 20;
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
  // The remote tier; off unless remote.seeds is set.
  RemoteOptions remote;
  // I/O engine for the SSD tier; null means one made from ssd_io. Tests
  // inject a FaultInjectionEngine here.
  std::shared_ptr<io::IoEngine> ssd_engine;
  // The clock that session idleness (dram_idle_after) and LRU are judged
  // by; null means std::chrono::steady_clock::now. A trace replay passes
  // its simulated time.
  std::function<std::chrono::steady_clock::time_point()> clock;
};

}  // namespace flatkv
