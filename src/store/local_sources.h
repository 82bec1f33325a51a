// The store's own media as restore sources (store/source.h): DRAM (homes
// and copies, copied by the DramQueue's workers) and SSD homes (read by the
// SSD IoEngine, 4 KiB aligned, checksummed; into device memory, by the
// DeviceLanding's own file reads where it reads the file). Both are behind the store's
// index; a restore asks them in this order, the faster first.
// Thread-safety: Holds and Origin run under the store's lock; Read and
// ReadBytes may be called from any thread.
#pragma once

#include "store/source.h"

namespace flatkv {

class StoreImpl;

class DramSource final : public Source {
 public:
  explicit DramSource(StoreImpl* store) : store_(store) {}
  Medium medium() const override { return Medium::kDram; }
  bool Holds(const Extent& e, uint32_t slot, uint64_t* base) const override;
  Result<RunOrigin> Origin(const Extent& e, uint64_t base, uint64_t first) const override;
  bool verifies() const override;  // StoreOptions::verify_dram_reads
  bool mapped() const override { return true; }
  bool CanLand(LandingKind) const override { return true; }  // into device memory by DMA from the arena
  const std::byte* Map(uint64_t src) const override;
  MediumCounters* counters() const override;
  void Read(ReadRequest req, ReadDone done) override;

 private:
  StoreImpl* store_;
};

class SsdSource final : public Source {
 public:
  explicit SsdSource(StoreImpl* store) : store_(store) {}
  Medium medium() const override { return Medium::kSsd; }
  bool Holds(const Extent& e, uint32_t slot, uint64_t* base) const override;
  Result<RunOrigin> Origin(const Extent& e, uint64_t base, uint64_t first) const override;
  uint64_t land_align() const override { return 4096; }  // O_DIRECT destinations
  bool scatters() const override { return false; }
  bool verifies() const override { return true; }
  bool readmits() const override { return true; }
  MediumCounters* counters() const override;
  void Read(ReadRequest req, ReadDone done) override;
  void ReadBytes(int fd, uint64_t src, std::byte* into, uint64_t len, std::function<void(Status)> done) override;

 private:
  StoreImpl* store_;
};

}  // namespace flatkv
