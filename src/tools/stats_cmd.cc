#include "tools/stats_cmd.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <cstdlib>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "flatkv/options.h"
#include "flatkv/store.h"
#include "persist/manifest.h"
#include "service/client.h"
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

double Gib(const nlohmann::json& v) { return v.is_number() ? v.get<double>() / double(1ull << 30) : 0.0; }

// Asks a daemon for its /stats JSON and prints a summary.
int RunServer(const StatsArgs& args) {
  service::ClientOptions o;
  o.token = args.token;
  if (o.token.empty()) {
    if (const char* t = std::getenv("FLATKV_TOKEN")) o.token = t;
  }
  o.client_name = "flatkv-stats";
  auto client = service::Client::Connect(args.server, o);
  if (!client.ok()) {
    const Code c = client.status().code();
    return Report(c == Code::kInvalidArgument ? kExitUsage : kExitFailure, client.status().ToString());
  }
  auto text = (*client)->StatsJson();
  if (!text.ok()) return Report(kExitFailure, "asking " + args.server + " for stats: " + text.status().ToString());
  if (args.json) {
    std::printf("%s\n", text->c_str());
    return kExitOk;
  }
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.contains("store") || !j.contains("server")) {
    return Report(kExitFailure, args.server + " answered stats that are not the expected JSON");
  }
  const auto& st = j["store"];
  const auto& sv = j["server"];
  std::printf("server %s (tenant %s)\n", args.server.c_str(), (*client)->info().tenant.c_str());
  std::printf("  shape %s, %u tokens per block\n", (*client)->info().shape.ToString().c_str(), (*client)->info().block_tokens);
  std::printf("  connections %s open, %s total, %s requests in flight\n", sv.value("connections", nlohmann::json(0)).dump().c_str(),
              sv.value("connections_total", nlohmann::json(0)).dump().c_str(), sv.value("requests_in_flight", nlohmann::json(0)).dump().c_str());
  for (const char* m : {"dram", "ssd"}) {
    if (!st.contains(m)) continue;
    const auto& md = st[m];
    std::printf("  %-4s %.2f / %.2f GiB used, %s blocks, %s hit blocks\n", m, Gib(md.value("used_bytes", nlohmann::json(0))),
                Gib(md.value("capacity_bytes", nlohmann::json(0))), md.value("blocks", nlohmann::json(0)).dump().c_str(),
                md.value("hit_blocks", nlohmann::json(0)).dump().c_str());
  }
  std::printf("  %-10s %10s %10s %10s %10s %10s %12s %12s\n", "tenant", "lookups", "hit/asked", "restores", "hits dram",
              "hits ssd", "used GiB", "restore p99");
  for (const auto& t : j.value("tenants", nlohmann::json::array())) {
    const std::string ratio = t.value("lookup_hit_blocks", nlohmann::json(0)).dump() + "/" + t.value("lookup_keys", nlohmann::json(0)).dump();
    std::printf("  %-10s %10s %10s %10s %10s %10s %12.3f %10.0fus\n", t.value("name", std::string("?")).c_str(),
                t.value("lookups", nlohmann::json(0)).dump().c_str(), ratio.c_str(), t.value("restores", nlohmann::json(0)).dump().c_str(),
                t.value("restore_hit_dram", nlohmann::json(0)).dump().c_str(), t.value("restore_hit_ssd", nlohmann::json(0)).dump().c_str(),
                Gib(t.value("used_bytes", nlohmann::json(0))), t.value("restore_p99_us", 0.0));
  }
  return kExitOk;
}

int RunChecked(const StatsArgs& args) {
  if (!args.server.empty()) return RunServer(args);
  if (args.ssd_dirs.empty()) return Report(kExitUsage, "give --ssd-dir DIR (a store on disk) or --server ADDR (a daemon)");
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
  CLI::Option* dirs = cmd->add_option("--ssd-dir", a.ssd_dirs, "A store's SSD directory (repeat for a store with several)")
                          ->check(CLI::ExistingDirectory);
  CLI::Option* server = cmd->add_option("--server", a.server, "A running daemon's address (unix:PATH or tcp:HOST:PORT)");
  dirs->excludes(server);
  cmd->add_option("--token", a.token, "The daemon's tenant token (default: $FLATKV_TOKEN)");
  cmd->add_flag("--json", a.json, "Print one JSON object instead of text");
  return cmd;
}

int RunStats(const StatsArgs& args) { return RunCatching("stats", [&] { return RunChecked(args); }); }

}  // namespace flatkv::tools
