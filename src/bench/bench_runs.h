// The runs of `flatkv bench restore`: each delivers one session's bytes
// into the same pre-faulted destination, from a different source. The list
// and what each one models is at the top of bench_restore.cc.
//
// Thread-safety: a run is driven by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "flatkv/codec.h"
#include "flatkv/keys.h"
#include "flatkv/placement.h"
#include "flatkv/shape.h"
#include "flatkv/status.h"
#include "bench/bench_util.h"

namespace flatkv::tools {

// One session as every run sees it: `blocks` blocks of `block_bytes` each,
// back to back in `bytes` (block-major, as Store::Put takes them: block b's
// layer l slice starts at b * block_bytes + l * block_layer_bytes).
struct BenchSession {
  KvShape shape;
  uint32_t block_tokens = 0;
  uint32_t blocks = 0;
  uint64_t block_bytes = 0;
  uint64_t block_layer_bytes = 0;
  std::span<const std::byte> bytes;  // blocks * block_bytes
  // `bytes` rounded up to 4 KiB; the source and destination buffers hold at
  // least this much, so O_DIRECT runs may transfer the padded length.
  uint64_t padded_bytes = 0;
  std::vector<BlockKey> keys;  // one per block, a chain
  std::string dir;             // an empty scratch directory for this session's files
};

// How a run lays the session out in the destination.
enum class DestLayout {
  kBlockMajor,  // identical to BenchSession::bytes
  kLayerMajor,  // layer l of block b at (l * blocks + b) * block_layer_bytes (what a restore's views give)
};

class RestoreRun {
 public:
  virtual ~RestoreRun() = default;
  virtual std::string_view name() const = 0;
  virtual DestLayout layout() const { return DestLayout::kBlockMajor; }
  // Untimed: stores the session wherever this run reads it from.
  virtual Status Setup(const BenchSession& session) = 0;
  // Untimed, before every timed Run (page-cache eviction, for example).
  virtual Status Prepare() { return Status::Ok(); }
  // Delivers the session into `dst` (at least padded_bytes long) and
  // returns the seconds its timed region took.
  virtual Result<double> Run(std::span<std::byte> dst) = 0;
  // Untimed: releases what Setup made (files, stores, handles).
  virtual Status Teardown() = 0;
  // Files read through the page cache, which Prepare evicts; empty for
  // runs that do not use the page cache.
  virtual std::vector<std::string> CachedFiles() const { return {}; }
  // Facts about this run for the report (engine, flags, counters).
  virtual nlohmann::json Describe() const { return nlohmann::json::object(); }
  // What the destination must hold when it is not the session's bytes (a
  // lossy codec's decoded session, block-major); empty: the session's bytes.
  virtual std::span<const std::byte> Expected() const { return {}; }
  // Non-empty after Setup when this run could not start (a peer that is not
  // installed, for example): why, with the steps tried. The benchmark leaves
  // the run out of this size and reports the error (bench_peers.h).
  virtual std::string Unavailable() const { return {}; }
};

// Checks `dst` holds the session in `layout`; names the first differing block and layer.
Status VerifyDestination(const BenchSession& session, DestLayout layout, std::span<const std::byte> dst);

// memcpy of the session from its pre-faulted source buffer by `threads`
// threads (kept ready between runs, as the store's copy workers are), each
// a contiguous share.
std::unique_ptr<RestoreRun> MakeMemcpyRun(uint32_t threads = 1);
// O_DIRECT sequential read of one file holding the session, `request_bytes`
// per request, `queue_depth` in flight through io_uring.
std::unique_ptr<RestoreRun> MakeRawDirectReadRun(uint64_t request_bytes, uint32_t queue_depth);
// A flatkv Store holding the session on one medium (kDram or kSsd).
// `window_layers` overrides StoreOptions::window_layers when nonzero. With
// a codec the run is ssd_codec_restore (SSD) and the blocks are stored encoded.
// `decode_threads` overrides StoreOptions::decode_threads when nonzero, and
// `dram_threads` StoreOptions::dram_threads.
std::unique_ptr<RestoreRun> MakeStoreRun(Medium medium, uint32_t window_layers = 0,
                                         std::shared_ptr<const Codec> codec = nullptr, uint32_t decode_threads = 0,
                                         uint32_t dram_threads = 0);
// One file per block, written with write()+fsync and read with buffered pread
// by LMCache's 4 disk worker threads.
std::unique_ptr<RestoreRun> MakeFilesPerBlockRun(const PageCacheEvictor* evictor);
// RocksDB, one value per block under its 16-byte key, block cache off.
enum class RocksDbConfig {
  kDefaults,  // run "rocksdb": default options, one Get per block
  kBlobDb,    // run "rocksdb_blobdb": integrated BlobDB, direct reads, one MultiGet
};
std::unique_ptr<RestoreRun> MakeRocksDbRun(const PageCacheEvictor* evictor, RocksDbConfig config);

}  // namespace flatkv::tools
