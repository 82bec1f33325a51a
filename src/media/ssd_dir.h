// SsdDir: one SSD directory of the SSD medium. It holds preallocated
// segment files `seg-NNNNNN.dat` (created lazily, up to the directory's
// capacity) and its own manifest. Extent slot s lives in segment
// s / slots_per_segment at byte (s % slots_per_segment) * extent_bytes.
// Formats: docs/format_segment.md and docs/format_manifest.md.
//
// Thread-safety: Fd() may be called concurrently (it locks); the slot
// allocator is guarded by the store's lock.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "flatkv/status.h"
#include "io/io_engine.h"
#include "io/posix_file.h"
#include "media/geometry.h"
#include "media/slot_allocator.h"
#include "persist/manifest.h"

namespace flatkv {

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
  const ExtentGeometry& geometry() const { return geometry_; }
  const persist::ManifestHeader& header() const { return header_; }
  persist::Manifest& manifest() { return *manifest_; }
  SlotAllocator& slots() { return slots_; }
  const SlotAllocator& slots() const { return slots_; }
  uint64_t capacity_bytes() const { return options_.capacity_bytes; }

  uint64_t slots_per_segment() const { return header_.segment_bytes / header_.extent_bytes; }
  persist::ExtentRef RefOf(uint64_t slot) const {
    return {static_cast<uint32_t>(slot / slots_per_segment()), static_cast<uint32_t>(slot % slots_per_segment())};
  }
  uint64_t SlotOf(persist::ExtentRef ref) const { return uint64_t{ref.segment} * slots_per_segment() + ref.slot; }
  // Offset of an extent slot in this directory's address space
  // (segment * segment_bytes + offset in the segment).
  uint64_t SlotAddress(uint64_t slot) const {
    auto ref = RefOf(slot);
    return uint64_t{ref.segment} * header_.segment_bytes + uint64_t{ref.slot} * header_.extent_bytes;
  }
  // Splits an address offset into (fd, file offset), creating and
  // preallocating the segment file on first use when `create`.
  Result<std::pair<int, uint64_t>> Locate(uint64_t address_offset, bool create);
  // Whether an existing segment file holds `slot` in full (recovery).
  bool SegmentHolds(uint64_t slot);
  // True unless some segment file had to fall back to buffered I/O.
  bool all_direct() const;
  std::vector<int> OpenFds() const;

 private:
  SsdDir(const SsdDirOptions& o, const persist::ManifestHeader& h, const ExtentGeometry& g)
      : options_(o), header_(h), geometry_(g) {}
  Result<const io::File*> Segment(uint32_t segment, bool create);
  uint64_t SegmentFileBytes(uint32_t segment) const;

  SsdDirOptions options_;
  persist::ManifestHeader header_;
  ExtentGeometry geometry_;
  SlotAllocator slots_;
  std::unique_ptr<persist::Manifest> manifest_;
  mutable Mutex mu_;
  std::vector<std::unique_ptr<io::File>> segments_ FLATKV_GUARDED_BY(mu_);  // null = not opened yet
  bool fallback_warned_ FLATKV_GUARDED_BY(mu_) = false;
  bool all_direct_ FLATKV_GUARDED_BY(mu_) = true;
};

}  // namespace flatkv
