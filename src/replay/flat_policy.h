// The "flat" policy: flatkv's own Store (src/store), replayed. Each trace
// block is one store block; each conversation is a store session; the
// store's clock is the simulated time. In kModel the store runs on a
// down-scaled shape so the whole replay fits in memory and disk while
// placement, eviction and read amplification are the real store's.
#pragma once

#include <memory>

#include "replay/policy.h"

namespace flatkv::replay {

Result<std::unique_ptr<CachePolicy>> MakeFlatPolicy(const PolicyConfig& config);

}  // namespace flatkv::replay
