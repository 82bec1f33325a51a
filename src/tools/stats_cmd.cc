#include "tools/stats_cmd.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>

#include "flatkv/options.h"
#include "flatkv/store.h"
#include "persist/manifest.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

int Report(int code, const std::string& msg) {
  std::fprintf(stderr, "flatkv stats: %s\n", msg.c_str());
  return code;
}

// Bytes the segment files of `dir` cover: (highest segment number + 1) x
// the largest segment file. Store::Open refuses a capacity smaller than
// the extents already stored, so stats opens with at least this much. Segment files
// are named `seg-NNNNNN.dat` (src/media/ssd_dir.h).
uint64_t SegmentCoverage(const std::string& dir) {
  uint64_t max_index = 0, max_size = 0;
  bool any = false;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::end(it); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    unsigned index = 0;
    char tail = 0;
    if (std::sscanf(name.c_str(), "seg-%u.da%c", &index, &tail) != 2 || tail != 't') continue;
    std::error_code size_ec;
    const uint64_t size = it->file_size(size_ec);
    if (size_ec) continue;
    any = true;
    max_index = std::max<uint64_t>(max_index, index);
    max_size = std::max(max_size, size);
  }
  return any ? (max_index + 1) * max_size : 0;
}

int RunChecked(const StatsArgs& args) {
  for (const auto& dir : args.ssd_dirs) {
    // Store::Open creates a store where there is none; stats must not.
    const std::string manifest = dir + "/" + persist::kManifestName;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(manifest, ec)) {
      return Report(kExitUsage, "--ssd-dir " + dir + ": holds no flatkv store (no " + persist::kManifestName + " file)");
    }
  }
  StoreOptions o;  // shape left empty: Open adopts the shape and block size in the manifest
  o.dram_capacity_bytes = 0;
  o.read_only = true;
  o.ssd_dirs = args.ssd_dirs;
  for (const auto& dir : args.ssd_dirs) o.ssd_capacity_bytes = std::max(o.ssd_capacity_bytes, SegmentCoverage(dir));
  auto opened = Store::Open(o);
  if (!opened.ok()) {
    const Status& st = opened.status();
    std::string dirs;
    for (const auto& d : args.ssd_dirs) dirs += (dirs.empty() ? "" : ", ") + d;
    if (st.code() == Code::kNotFound || st.code() == Code::kInvalidArgument) {
      return Report(kExitUsage, "--ssd-dir " + dirs + ": holds no flatkv store this build can open (" + st.ToString() + ")");
    }
    return Report(kExitFailure, "opening " + dirs + ": " + st.ToString());
  }
  std::unique_ptr<Store> store = std::move(opened).value();
  const StoreStats stats = store->Stats();
  const std::string text = args.json ? stats.ToJson() : stats.ToString();
  std::fwrite(text.data(), 1, text.size(), stdout);
  if (text.empty() || text.back() != '\n') std::fputc('\n', stdout);
  if (Status st = store->Close(); !st.ok()) return Report(kExitFailure, "closing the store: " + st.ToString());
  return kExitOk;
}

}  // namespace

CLI::App* AddStatsCommand(CLI::App& app, StatsArgs& a) {
  CLI::App* cmd = app.add_subcommand("stats", "Open a store's SSD directories and print its statistics");
  cmd->add_option("--ssd-dir", a.ssd_dirs, "A store's SSD directory (repeat for a store with several)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_flag("--json", a.json, "Print one JSON object instead of text");
  return cmd;
}

int RunStats(const StatsArgs& args) {
  try {
    return RunChecked(args);
  } catch (const std::exception& e) {
    return Report(kExitFailure, std::string("unexpected error: ") + e.what());
  }
}

}  // namespace flatkv::tools
