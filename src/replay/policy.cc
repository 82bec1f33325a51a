// MakePolicy: the one place a policy name becomes a CachePolicy.
#include <string>

#include "replay/baselines.h"
#include "replay/flat_policy.h"
#include "replay/policy.h"

namespace flatkv::replay {

Result<std::unique_ptr<CachePolicy>> MakePolicy(std::string_view name, const PolicyConfig& config) {
  if (name == "flat") return MakeFlatPolicy(config);
  if (name == "tiered") return MakeTieredPolicy(config);
  if (name == "files") return MakeFilesPolicy(config);
  if (name == "infinite") return MakeInfinitePolicy(config);
  if (name == "belady") return MakeBeladyPolicy(config);
  return Status::InvalidArgument("unknown policy '" + std::string(name) +
                                 "'; known: flat, tiered, files, infinite, belady");
}

}  // namespace flatkv::replay
