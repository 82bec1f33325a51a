// MakePolicy: the one place a policy name becomes a CachePolicy.
#include <string>

#include "replay/baselines.h"
#include "replay/flat_policy.h"
#include "replay/policy.h"

namespace flatkv::replay {

const std::vector<std::string>& PolicyNames() {
  static const std::vector<std::string> names = {
      "flat",           "flat-gpu-window",   "flat-hints", "tiered",   "tiered-lw",   "tiered-nopromo",
      "tiered-lw-nopromo", "files",          "files-lw",   "infinite", "infinite-lw", "belady"};
  return names;
}

std::string PolicyNameList() {
  std::string known;
  for (const std::string& n : PolicyNames()) known += (known.empty() ? "" : ", ") + n;
  return known;
}

Result<std::unique_ptr<CachePolicy>> MakePolicy(std::string_view name, const PolicyConfig& config) {
  if (name == "flat") return MakeFlatPolicy(config, FlatHints::kNone);
  if (name == "flat-gpu-window") return MakeFlatPolicy(config, FlatHints::kNone, FlatWindow::kGpu);
  if (name == "flat-hints") return MakeFlatPolicy(config, FlatHints::kAgent);
  if (name == "tiered") return MakeTieredPolicy(config, {.layerwise = false, .promote = true});
  if (name == "tiered-lw") return MakeTieredPolicy(config, {.layerwise = true, .promote = true});
  if (name == "tiered-nopromo") return MakeTieredPolicy(config, {.layerwise = false, .promote = false});
  if (name == "tiered-lw-nopromo") return MakeTieredPolicy(config, {.layerwise = true, .promote = false});
  if (name == "files") return MakeFilesPolicy(config, /*layerwise=*/false);
  if (name == "files-lw") return MakeFilesPolicy(config, /*layerwise=*/true);
  if (name == "infinite") return MakeInfinitePolicy(config, /*layerwise=*/false);
  if (name == "infinite-lw") return MakeInfinitePolicy(config, /*layerwise=*/true);
  if (name == "belady") return MakeBeladyPolicy(config);
  return Status::InvalidArgument("unknown policy '" + std::string(name) + "'; known: " + PolicyNameList());
}

}  // namespace flatkv::replay
