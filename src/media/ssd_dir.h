// SsdDir: one SSD directory of the SSD medium. It holds preallocated
// segment files `seg-NNNNNN.dat` (created lazily, up to the directory's
// capacity) and its own manifest. Space is handed out in allocation units
// (ManifestHeader::UnitBytes: one block slot over all layers in a sized
// store, a whole extent in an older one); an extent is a run of units
// within one segment, and unit u lives in segment u / units_per_segment at
// byte (u % units_per_segment) * unit_bytes.
// Beside each segment, `sums-NNNNNN.dat` (buffered, sparse) holds every
// block's per-layer checksum and coded (offset, length): a cache of the
// manifest's BlockPut records, rebuilt from them on every open, so memory
// holds nothing per block and layer (WriteSums, ReadSums).
// Formats: docs/format_segment.md and docs/format_manifest.md.
//
// Thread-safety: Fd() may be called concurrently (it locks); the slot
// allocator is guarded by the store's lock.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "flatkv/status.h"
#include "io/io_engine.h"
#include "io/posix_file.h"
#include "media/geometry.h"
#include "media/range_allocator.h"
#include "persist/manifest.h"

namespace flatkv {

// One block-layer's entry in a sums table: the XXH3-64 checksum of its
// bytes (coded: of the encoded slice) and, in coded extents, where its
// encoded slice lies in the layer region (0, 0 in raw extents).
struct SumEntry {
  uint64_t checksum = 0;
  uint32_t offset = 0;
  uint32_t length = 0;
};
static_assert(sizeof(SumEntry) == 16);

struct SsdDirOptions {
  std::string path;
  uint64_t capacity_bytes = 0;
  uint64_t segment_bytes = 0;
  bool want_direct = true;
  bool read_only = false;  // inspect an existing directory; write nothing
};

class SsdDir {
 public:
  // Opens or creates the directory. `header` describes a new store; for an
  // existing one its shape and block size must match (or header.shape.layers
  // == 0 to adopt them) and its own segment and extent layout is kept.
  // `contents` receives the replayed manifest.
  static Result<std::unique_ptr<SsdDir>> Open(const SsdDirOptions& options, const persist::ManifestHeader& header,
                                              io::IoEngine* engine, persist::ManifestContents* contents);

  const std::string& path() const { return options_.path; }
  // The largest extent's layout (every extent's, when not sized).
  const ExtentGeometry& geometry() const { return geometry_; }
  // The layout of an extent of `blocks` block slots (0: the largest).
  ExtentGeometry GeometryFor(uint32_t blocks) const {
    return header_.sized() && blocks ? geometry_.Sized(blocks) : geometry_;
  }
  const persist::ManifestHeader& header() const { return header_; }
  persist::Manifest& manifest() { return *manifest_; }
  RangeAllocator& units() { return units_; }
  const RangeAllocator& units() const { return units_; }
  uint64_t capacity_bytes() const { return options_.capacity_bytes; }
  bool sized() const { return header_.sized(); }
  // Version 6 and up: the sums tables are the truth for per-layer sums
  // (records carry a tag of them, persist::BlockRecord::tag), so they are
  // written before their records (and synced first with `sync`), and never
  // rebuilt at open. Fixed at open: a log's version never reaches 6 later.
  bool tagged_sums() const { return tagged_sums_; }
  uint32_t unit_blocks() const { return header_.UnitBlocks(); }
  uint64_t unit_bytes() const { return header_.UnitBytes(); }
  // Units an extent of `blocks` block slots takes (not sized: 1).
  uint64_t UnitsFor(uint32_t blocks) const { return sized() ? (blocks + unit_blocks() - 1) / unit_blocks() : 1; }

  uint64_t units_per_segment() const { return header_.UnitsPerSegment(); }
  persist::ExtentRef RefOf(uint64_t unit) const {
    return {static_cast<uint32_t>(unit / units_per_segment()), static_cast<uint32_t>(unit % units_per_segment())};
  }
  uint64_t UnitOf(persist::ExtentRef ref) const { return uint64_t{ref.segment} * units_per_segment() + ref.slot; }
  // Offset of a unit in this directory's address space
  // (segment * segment_bytes + offset in the segment).
  uint64_t UnitAddress(uint64_t unit) const {
    auto ref = RefOf(unit);
    return uint64_t{ref.segment} * header_.segment_bytes + uint64_t{ref.slot} * unit_bytes();
  }
  // Splits an address offset into (fd, file offset), creating and
  // preallocating the segment file on first use when `create`.
  Result<std::pair<int, uint64_t>> Locate(uint64_t address_offset, bool create);
  // The sums table (docs/format_segment.md, "Sums tables"): the region of
  // an extent starting at unit u begins at (u % units_per_segment) *
  // SumsRegionBytes() in sums-(u / units_per_segment).dat (a region per
  // unit, so an extent of n units owns n of them); block slot i's layer l
  // at entry i * layers + l. Writes `entries` from block slot `first_block`
  // on (one pwrite; concurrent writers of one extent write disjoint
  // ranges). Both are thread-safe and never hold a lock across the I/O.
  uint64_t SumsRegionBytes() const {
    return uint64_t{persist::kCodedBlocksPerSlot} * unit_blocks() * geometry_.layers * sizeof(SumEntry);
  }
  // With `sync`, the file is fdatasync'ed before it returns.
  Status WriteSums(uint64_t unit, uint32_t first_block, std::span<const SumEntry> entries, bool sync = false);
  // Reads entries from block slot `first_block` on; bytes past the file's
  // end (never written) read as zero entries, which fail any checksum.
  Status ReadSums(uint64_t unit, uint32_t first_block, std::span<SumEntry> entries);
  // Whether an existing segment file holds units [unit, unit + n) in full (recovery).
  bool SegmentHolds(uint64_t unit, uint64_t n);
  // True unless some segment file had to fall back to buffered I/O.
  bool all_direct() const;
  std::vector<int> OpenFds() const;

 private:
  SsdDir(const SsdDirOptions& o, const persist::ManifestHeader& h, const ExtentGeometry& g)
      : options_(o), header_(h), geometry_(g) {}
  Result<const io::File*> Segment(uint32_t segment, bool create);
  // The sums file of `segment`, created on first use (read-only: opened
  // for reading if it exists).
  Result<int> SumsFd(uint32_t segment);
  uint64_t SegmentFileBytes(uint32_t segment) const;

  SsdDirOptions options_;
  persist::ManifestHeader header_;
  ExtentGeometry geometry_;
  RangeAllocator units_;
  std::unique_ptr<persist::Manifest> manifest_;
  bool tagged_sums_ = false;
  mutable Mutex mu_;
  std::vector<std::unique_ptr<io::File>> segments_ FLATKV_GUARDED_BY(mu_);  // null = not opened yet
  std::vector<std::unique_ptr<io::File>> sums_ FLATKV_GUARDED_BY(mu_);      // likewise, sums-NNNNNN.dat
  bool fallback_warned_ FLATKV_GUARDED_BY(mu_) = false;
  bool all_direct_ FLATKV_GUARDED_BY(mu_) = true;
};

}  // namespace flatkv
