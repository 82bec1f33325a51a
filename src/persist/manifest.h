// Manifest: the durable index of one SSD directory, as an append-only log.
//
// The log starts with a header fixing the KV shape and extent layout, then
// holds records: an extent was created (for a session), a block was written
// into an extent slot (with its key and per-layer checksums), an extent was
// freed. Replaying the log rebuilds the directory's index. A torn or
// corrupt tail (a crash mid-append) is cut off at the last good record. On a
// clean close the log is rewritten as a compact snapshot (write a temporary
// file, fsync, rename, fsync the directory). Format: docs/format_manifest.md.
//
// Thread-safety: Append and Rewrite serialize on an internal mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "flatkv/keys.h"
#include "flatkv/shape.h"
#include "flatkv/status.h"
#include "io/io_engine.h"
#include "io/posix_file.h"

namespace flatkv::persist {

inline constexpr uint32_t kManifestVersion = 1;
inline constexpr char kManifestName[] = "MANIFEST";

// Fixed per directory; a reopen with a different layout is refused.
struct ManifestHeader {
  KvShape shape;
  uint32_t block_tokens = 0;
  uint64_t segment_bytes = 0;
  uint32_t extent_blocks = 0;   // blocks one extent holds
  uint64_t slot_stride = 0;     // bytes between consecutive blocks within a layer region
  uint64_t layer_stride = 0;    // bytes between consecutive layer regions of an extent
  uint64_t extent_bytes = 0;    // layers * layer_stride

  bool operator==(const ManifestHeader&) const = default;
  std::string ToString() const;
};

struct ExtentRef {
  uint32_t segment = 0;
  uint32_t slot = 0;  // extent index within the segment
  auto operator<=>(const ExtentRef&) const = default;
};

struct BlockRecord {
  uint32_t index = 0;  // block slot within the extent
  BlockKey key;
  std::vector<uint64_t> checksums;  // one per layer
};

struct ExtentRecord {
  uint64_t session = 0;
  uint64_t sequence = 0;  // position in the log of the extent's last record: LRU order
  std::vector<BlockRecord> blocks;
};

// The live state a log describes.
struct ManifestContents {
  ManifestHeader header;
  std::map<ExtentRef, ExtentRecord> extents;
  uint64_t good_bytes = 0;      // length of the valid prefix of the log
  bool torn_tail = false;       // bytes after good_bytes were dropped
  std::string tail_problem;     // why, when torn_tail
};

// Record encoders: append one record to `out`.
void EncodeExtentCreate(std::vector<uint8_t>& out, ExtentRef ref, uint64_t session);
void EncodeBlockPut(std::vector<uint8_t>& out, ExtentRef ref, const BlockRecord& block);
void EncodeExtentFree(std::vector<uint8_t>& out, ExtentRef ref);
void EncodeHeader(std::vector<uint8_t>& out, const ManifestHeader& header);

// Parses a whole log. A bad header is an error; a bad record ends the valid
// prefix (contents.torn_tail). Records that contradict the header or each
// other (a block in an unknown extent, a slot beyond extent_blocks) are
// Corruption errors. Never crashes on any input.
Result<ManifestContents> ParseManifest(std::span<const uint8_t> bytes);

class Manifest {
 public:
  // Opens `dir`/MANIFEST, replaying it into *contents (whose header is the
  // stored one; the caller checks it is compatible), or creates it with
  // `header` when missing. NotFound when missing and header.shape.layers == 0.
  // With `read_only`, a missing manifest is NotFound and nothing is written
  // (a torn tail is ignored, not cut off); Append and Rewrite then fail.
  static Result<std::unique_ptr<Manifest>> Open(const std::string& dir, const ManifestHeader& header,
                                                io::IoEngine* engine, ManifestContents* contents,
                                                bool read_only = false);

  // Appends encoded records; with `sync`, fdatasyncs before returning.
  Status Append(std::span<const uint8_t> records, bool sync);
  // Replaces the log with a snapshot holding `contents`' extents.
  Status Rewrite(const ManifestContents& contents);
  uint64_t bytes() const;

 private:
  Manifest(std::string dir, io::IoEngine* engine) : dir_(std::move(dir)), engine_(engine) {}
  Status WriteAll(const io::File& file, uint64_t offset, std::span<const uint8_t> bytes);

  std::string dir_;
  io::IoEngine* engine_;
  bool read_only_ = false;
  mutable Mutex mu_;
  io::File file_ FLATKV_GUARDED_BY(mu_);
  uint64_t tail_ FLATKV_GUARDED_BY(mu_) = 0;  // end of the valid log
};

}  // namespace flatkv::persist
