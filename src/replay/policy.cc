// MakePolicy: the one place a policy name becomes a CachePolicy.
#include <string>

#include "replay/baselines.h"
#include "replay/flat_policy.h"
#include "replay/policy.h"

namespace flatkv::replay {

const std::vector<std::string>& PolicyNames() {
  static const std::vector<std::string> names = {"flat", "flat-hints", "tiered", "files", "infinite", "belady"};
  return names;
}

std::string PolicyNameList() {
  std::string known;
  for (const std::string& n : PolicyNames()) known += (known.empty() ? "" : ", ") + n;
  return known;
}

Result<std::unique_ptr<CachePolicy>> MakePolicy(std::string_view name, const PolicyConfig& config) {
  if (name == "flat") return MakeFlatPolicy(config, FlatHints::kNone);
  if (name == "flat-hints") return MakeFlatPolicy(config, FlatHints::kAgent);
  if (name == "tiered") return MakeTieredPolicy(config);
  if (name == "files") return MakeFilesPolicy(config);
  if (name == "infinite") return MakeInfinitePolicy(config);
  if (name == "belady") return MakeBeladyPolicy(config);
  return Status::InvalidArgument("unknown policy '" + std::string(name) + "'; known: " + PolicyNameList());
}

}  // namespace flatkv::replay
