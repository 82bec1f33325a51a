// What the crash harness drives: a Store opened in this process on a
// directory, or a `flatkv serve` daemon reached through a Client. Both take
// puts and restores of the same blocks; only the store drops sessions and
// closes cleanly from inside the worker.
//
// Thread-safety: StoreTarget is thread-safe (the Store is); a ClientTarget
// is used by one thread (one Client per thread).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "flatkv/keys.h"
#include "flatkv/options.h"
#include "flatkv/status.h"
#include "flatkv/store.h"
#include "crashtest/crashtest_state.h"

namespace flatkv::tools::crashtest {

// The store options of a crashtest store in `dir` (its SSD directory is dir/store).
StoreOptions MakeStoreOptions(const std::string& dir, uint64_t dram_bytes, uint64_t ssd_bytes, SsdAdmission admission);
inline constexpr uint64_t kSegmentBytes = 32ull << 20;

class Target {
 public:
  virtual ~Target() = default;
  virtual Status Put(uint64_t session, std::span<const BlockKey> keys, std::span<const std::byte> data,
                     uint32_t first_block) = 0;
  // Restores the longest stored prefix of `keys`; `out` gets the valid
  // blocks in Put's layout (block-major). Returns the valid block count.
  virtual Result<uint32_t> Restore(std::span<const BlockKey> keys, std::vector<std::byte>* out) = 0;
  // NotSupported where the target has no such operation (the daemon's wire
  // protocol has no drop).
  virtual Status Drop(uint64_t session) = 0;
  virtual uint64_t BlockBytes() const = 0;
};

// A Target over a Store owned elsewhere.
class StoreTarget final : public Target {
 public:
  explicit StoreTarget(Store* store) : store_(store) {}
  void Reset(Store* store) { store_ = store; }
  Status Put(uint64_t session, std::span<const BlockKey> keys, std::span<const std::byte> data,
             uint32_t first_block) override;
  Result<uint32_t> Restore(std::span<const BlockKey> keys, std::vector<std::byte>* out) override;
  Status Drop(uint64_t session) override { return store_->DropSession(session); }
  uint64_t BlockBytes() const override { return store_->BlockBytes(); }

 private:
  Store* store_;
};

// A Target over one connection to a daemon at `address` ("unix:/path").
Result<std::unique_ptr<Target>> ConnectClientTarget(const std::string& address);

// Figures of one verification pass (docs/crashtest.md).
struct VerifyCounts {
  uint64_t checked = 0;          // distinct logged blocks looked up
  uint64_t required = 0;         // of them, blocks the contract requires
  uint64_t served_ok = 0;        // served with the right bytes
  uint64_t wrong = 0;            // served with different bytes: always a failure
  uint64_t lost = 0;             // required but a miss
  uint64_t allowed_misses = 0;   // not required (dropped, or DRAM-only under on-reuse) and a miss
  uint64_t restore_errors = 0;   // restores that failed outright (counted per batch)
  std::vector<std::string> examples;  // the first few wrong or lost blocks, for the report
  std::vector<BlockKey> lost_keys;
  std::vector<BlockKey> allowed_miss_keys;
};

// Looks every expectation up through `target`, in batches, and compares
// every served byte with the block's payload.
VerifyCounts Verify(Target& target, const std::vector<BlockExpectation>& blocks);

}  // namespace flatkv::tools::crashtest
