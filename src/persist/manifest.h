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
#include <string_view>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "flatkv/keys.h"
#include "flatkv/shape.h"
#include "flatkv/status.h"
#include "io/io_engine.h"
#include "io/posix_file.h"

namespace flatkv::persist {

// Version 1: raw extents only. Version 2 adds coded extents (records 4 and
// 5); version 3 adds shared extents (record 6: an extent's owner and the
// other sessions referencing it). A log is written at the lowest version
// its records need. Version 4 adds chain positions (record 7: where a run
// of an extent's block slots sits in its session's chain, for
// TruncateSession) and dropped blocks (record 8: blocks taken out of the
// index while their extent lives); a store writes them from its first put.
// Version 5 adds sized extents: the header's unit_blocks (formerly
// reserved) makes extent slots allocation units of that many block slots,
// and an extent is created (record 9) with its own block-slot count, a
// multiple of it; a new store is written at version 5 from its header on.
// Version 6 makes the segments' sums tables the truth for per-layer
// checksums (and coded offsets/lengths): a block record (type 10) carries
// its key, its stored size and a 32-bit tag of its sums-table entries
// instead of the entries, so recovery reads and parses no per-layer data,
// and a restore verifies the entries it reads against the tag; a new
// directory is written at version 6 from its header on. This build reads
// versions 1 to 6.
inline constexpr uint32_t kManifestVersion = 6;
inline constexpr uint32_t kManifestVersionTagged = 6;
inline constexpr uint32_t kManifestVersionSized = 5;
inline constexpr uint32_t kManifestVersionCoded = 2;
inline constexpr uint32_t kManifestVersionShared = 3;
inline constexpr uint32_t kManifestVersionPositions = 4;
// An extent records at most this many position runs (more: the extent is
// treated as holding positions beyond every truncation point).
inline constexpr uint32_t kMaxPositionRuns = 4096;
// An extent records at most this many referencing sessions.
inline constexpr uint32_t kMaxSharers = 4096;
// A coded extent holds at most this many blocks per block slot of a raw
// extent (encoded slices are packed; a block needs only its encoded size).
inline constexpr uint32_t kCodedBlocksPerSlot = 16;
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
  // Version 5: block slots per allocation unit (ExtentRef::slot counts
  // units; an extent holds a multiple of them, up to extent_blocks, laid out
  // with layer_stride = its block slots * slot_stride). 0: every extent has
  // the layout above and ExtentRef::slot counts extents.
  uint32_t unit_blocks = 0;

  bool sized() const { return unit_blocks != 0; }
  uint32_t UnitBlocks() const { return sized() ? unit_blocks : extent_blocks; }
  uint64_t UnitBytes() const { return sized() ? uint64_t{unit_blocks} * slot_stride * shape.layers : extent_bytes; }
  uint64_t UnitsPerSegment() const { return segment_bytes / UnitBytes(); }

  bool operator==(const ManifestHeader&) const = default;
  std::string ToString() const;
};

struct ExtentRef {
  uint32_t segment = 0;
  uint32_t slot = 0;  // the extent's first allocation unit within the segment (ManifestHeader::UnitBlocks)
  auto operator<=>(const ExtentRef&) const = default;
};

struct BlockRecord {
  uint32_t index = 0;  // block slot within the extent
  BlockKey key;
  // Versions 1 to 5: one per layer (coded: over the encoded bytes). Empty
  // in a version 6 record (tagged()), whose entries are in the sums table.
  std::vector<uint64_t> checksums;
  // Coded extents only (empty otherwise): per layer, where the encoded
  // slice starts within the extent's layer region, and its length.
  std::vector<uint32_t> offsets = {};
  std::vector<uint32_t> lengths = {};
  // Version 6 (record 10): SumsTag of the block's sums-table entries, and
  // its encoded bytes over all layers (coded extents; 0 in raw ones).
  uint32_t tag = 0;
  uint32_t stored = 0;
  bool tagged() const { return checksums.empty(); }
};

// The tag a version 6 record keeps of a block's `layers` sums-table entries
// (16 bytes each, format_segment.md): the low 32 bits of their XXH3-64.
uint32_t SumsTag(const void* entries, size_t bytes);

// A version 6 block record as replayed: 32 bytes, nothing allocated per
// record (a BlockRecord is 104 bytes with its three vectors; 10M of them
// were a gigabyte of recovery's memory).
struct TaggedBlock {
  uint32_t index = 0;
  uint32_t tag = 0;
  BlockKey key;
  uint32_t stored = 0;
  BlockRecord ToRecord() const { return BlockRecord{index, key, {}, {}, {}, tag, stored}; }
};

struct ExtentRecord {
  uint64_t session = 0;   // the owner
  std::string codec;      // codec spec of a coded extent; empty = raw slices at slot_stride
  uint64_t sequence = 0;  // position in the log of the extent's last record: LRU order
  std::vector<BlockRecord> blocks;  // versions 1 to 5 (records 2 and 5)
  // Other sessions holding references to its blocks (ExtentSessions record).
  std::vector<uint64_t> sharers = {};
  // Chain positions (BlockPositions records): run starts, as (block index,
  // the owner's chain position of that block); the blocks after a run's
  // start up to the next run's follow on one by one. Sorted by index.
  std::vector<std::pair<uint32_t, uint32_t>> positions = {};
  // Its block slots (sized extents, record 9); 0: the header's extent_blocks.
  uint32_t block_slots = 0;
  std::vector<TaggedBlock> tagged = {};  // version 6 (record 10), in log order
};

// The block slots of `e` (raw; a coded extent packs up to
// kCodedBlocksPerSlot times as many blocks into the same bytes).
inline uint32_t ExtentBlocks(const ManifestHeader& h, const ExtentRecord& e) { return e.block_slots ? e.block_slots : h.extent_blocks; }

// The live state a log describes.
struct ManifestContents {
  ManifestHeader header;
  uint32_t version = 1;         // the log's format version
  std::map<ExtentRef, ExtentRecord> extents;
  uint64_t good_bytes = 0;      // length of the valid prefix of the log
  bool torn_tail = false;       // bytes after good_bytes were dropped
  std::string tail_problem;     // why, when torn_tail
};

// Record encoders: append one record to `out`.
// A non-empty `codec` writes an ExtentCreateCoded record, a block with
// offsets a BlockPutCoded record (both need a version 2 log), a tagged()
// block a BlockPutTagged record (a version 6 log). `blocks` > 0
// writes an ExtentCreateSized record (a sized log, version 5) instead.
void EncodeExtentCreate(std::vector<uint8_t>& out, ExtentRef ref, uint64_t session, std::string_view codec = {},
                        uint32_t blocks = 0);
void EncodeBlockPut(std::vector<uint8_t>& out, ExtentRef ref, const BlockRecord& block);
void EncodeExtentFree(std::vector<uint8_t>& out, ExtentRef ref);
// The extent's owner and referencing sessions from now on (version 3 log).
void EncodeExtentSessions(std::vector<uint8_t>& out, ExtentRef ref, uint64_t owner, std::span<const uint64_t> sharers);
// Run starts of an extent's chain positions (version 4 log).
void EncodeBlockPositions(std::vector<uint8_t>& out, ExtentRef ref, std::span<const std::pair<uint32_t, uint32_t>> runs);
// Blocks of a live extent taken out of the index (version 4 log).
void EncodeBlocksDropped(std::vector<uint8_t>& out, ExtentRef ref, std::span<const uint32_t> indices);
void EncodeHeader(std::vector<uint8_t>& out, const ManifestHeader& header, uint32_t version = 1);

// Parses a whole log. A bad header is an error; a bad record ends the valid
// prefix (contents.torn_tail). Records that contradict the header or each
// other (a block in an unknown extent, a slot beyond extent_blocks) are
// Corruption errors. Never crashes on any input.
Result<ManifestContents> ParseManifest(std::span<const uint8_t> bytes);

class Manifest {
 public:
  ~Manifest();

  // Opens `dir`/MANIFEST, replaying it into *contents (whose header is the
  // stored one; the caller checks it is compatible), or creates it with
  // `header` when missing. NotFound when missing and header.shape.layers == 0.
  // With `read_only`, a missing manifest is NotFound and nothing is written
  // (a torn tail is ignored, not cut off); Append and Rewrite then fail.
  static Result<std::unique_ptr<Manifest>> Open(const std::string& dir, const ManifestHeader& header,
                                                io::IoEngine* engine, ManifestContents* contents,
                                                bool read_only = false);

  // Appends encoded records; with `sync`, then Sync().
  Status Append(std::span<const uint8_t> records, bool sync);
  // Makes every record appended before the call durable (fdatasync). The
  // sync runs without the append lock, so appends go on meanwhile, and one
  // sync serves every caller whose records it covered (group commit).
  Status Sync();
  // Replaces the log with a snapshot holding `contents`' extents, as version
  // max(current, min_version, 2 if any extent is coded, 3 if any is shared).
  Status Rewrite(const ManifestContents& contents, uint32_t min_version = 1);
  uint64_t bytes() const;
  uint32_t version() const;
  // Raises the log's version in place (a 4-byte header write, synced), so
  // records of that version may follow. No-op when already there.
  Status Upgrade(uint32_t version);

  // Online checkpoint: rewrites the log as a snapshot of itself without the
  // caller's locks. The records up to the current tail are streamed twice
  // (8 MiB at a time): once to find freed extents, superseded sessions
  // records and dropped blocks, once to copy the rest, in log order, to
  // MANIFEST.tmp, which is synced; memory holds a few words per extent
  // created, not the log or its blocks. Appends go on meanwhile. Then, holding appends, the records appended since are copied
  // after the snapshot, synced, and MANIFEST.tmp is renamed over MANIFEST.
  // A crash at any point leaves either log whole.
  Status Checkpoint();
  // Starts a thread that checkpoints whenever the log has grown past
  // max(min_bytes, 2 x the size of its last snapshot): the log stays within
  // about twice its live size, and recovery replays no more than that.
  void StartCheckpoints(uint64_t min_bytes);
  uint64_t checkpoints() const;  // completed online checkpoints

 private:
  Manifest(std::string dir, io::IoEngine* engine) : dir_(std::move(dir)), engine_(engine) {}
  Status WriteAll(const io::File& file, uint64_t offset, std::span<const uint8_t> bytes);
  // Writes `bytes` to a fresh MANIFEST.tmp and syncs it.
  Result<io::File> WriteTemp(std::span<const uint8_t> bytes);
  // Renames MANIFEST.tmp (`f`, of `size` bytes, synced) over MANIFEST and
  // makes it the log.
  Status Replace(io::File f, uint64_t size, uint32_t version) FLATKV_REQUIRES(mu_);
  void CheckpointLoop();

  std::string dir_;
  io::IoEngine* engine_;
  bool read_only_ = false;
  // Lock order: checkpoint_mu_, sync_mu_, mu_. checkpoint_mu_ serialises
  // the two that replace the file (Checkpoint, Rewrite), so the file a
  // checkpoint reads stays open; sync_mu_ is held across an fdatasync (one
  // at a time) and by both, so the file a sync uses stays open too.
  Mutex checkpoint_mu_;
  Mutex sync_mu_;
  mutable Mutex mu_;
  io::File file_ FLATKV_GUARDED_BY(mu_);
  uint64_t tail_ FLATKV_GUARDED_BY(mu_) = 0;  // end of the valid log
  uint64_t synced_ FLATKV_GUARDED_BY(mu_) = 0;  // the log is durable up to here
  // Online checkpoints (StartCheckpoints).
  uint64_t checkpoint_min_ FLATKV_GUARDED_BY(mu_) = 0;   // 0: none
  uint64_t checkpoint_at_ FLATKV_GUARDED_BY(mu_) = 0;    // tail_ that triggers the next
  bool checkpoint_wanted_ FLATKV_GUARDED_BY(mu_) = false;
  bool stopping_ FLATKV_GUARDED_BY(mu_) = false;
  uint64_t checkpoints_ FLATKV_GUARDED_BY(mu_) = 0;
  CondVar checkpoint_cv_;
  std::thread checkpointer_;
  uint32_t version_ FLATKV_GUARDED_BY(mu_) = 1;
};

}  // namespace flatkv::persist
