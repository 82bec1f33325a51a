// The baselines and bounds a replay compares flat against. Each follows a
// documented design; docs/baselines.md ties every parameter to its source.
#pragma once

#include <memory>

#include "replay/policy.h"

namespace flatkv::replay {

// After Mooncake Store's SSD offload: DRAM first, demoted to SSD buckets on
// eviction, SSD hits read through DRAM staging and promoted.
Result<std::unique_ptr<CachePolicy>> MakeTieredPolicy(const PolicyConfig& config);
// After LMCache's local-disk backend: a DRAM LRU hot cache in front of one
// file per chunk.
Result<std::unique_ptr<CachePolicy>> MakeFilesPolicy(const PolicyConfig& config);
// Unbounded capacity: every block ever stored hits (from DRAM).
Result<std::unique_ptr<CachePolicy>> MakeInfinitePolicy(const PolicyConfig& config);
// Offline optimal (Belady) eviction at the same total capacity.
Result<std::unique_ptr<CachePolicy>> MakeBeladyPolicy(const PolicyConfig& config);

}  // namespace flatkv::replay
