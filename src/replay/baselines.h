// The baselines and bounds a replay compares flat against. Each follows a
// documented design; docs/baselines.md ties every parameter to its source.
#pragma once

#include <memory>

#include "replay/policy.h"

namespace flatkv::replay {

struct TieredOptions {
  bool layerwise = false;  // tiered-lw: the DRAM part streams by layer (HiCache's host-to-GPU load); SSD objects whole first
  bool promote = true;     // promotion on hit (--promotion_on_hit; Mooncake's default is false)
};
// After Mooncake Store's SSD offload: DRAM first, demoted to SSD buckets on
// eviction, SSD hits read through DRAM staging and (with `promote`)
// promoted. Named tiered, tiered-lw, tiered-nopromo, tiered-lw-nopromo.
Result<std::unique_ptr<CachePolicy>> MakeTieredPolicy(const PolicyConfig& config, TieredOptions options = {});
// After LMCache's local-disk backend: a DRAM LRU hot cache in front of one
// file per chunk. `layerwise` (files-lw, LMCache's use_layerwise): a chunk
// is config.layers objects of one layer each, on both tiers, loaded layer
// by layer.
Result<std::unique_ptr<CachePolicy>> MakeFilesPolicy(const PolicyConfig& config, bool layerwise = false);
// Unbounded capacity: every block ever stored hits (from DRAM). With
// `layerwise` (infinite-lw) it streams by layer at the node's links: no
// policy's TTFT can beat it.
Result<std::unique_ptr<CachePolicy>> MakeInfinitePolicy(const PolicyConfig& config, bool layerwise = false);
// Offline optimal (Belady) eviction at the same total capacity.
Result<std::unique_ptr<CachePolicy>> MakeBeladyPolicy(const PolicyConfig& config);

}  // namespace flatkv::replay
