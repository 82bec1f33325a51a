// The peers' part of `flatkv bench restore`'s report (bench_peers.h): JSON
// fields, the table, the replay's `tiered` model for the same operations, and
// `flatkv bench serve`'s Mooncake gets.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "bench/bench_peers.h"
#include "replay/io_model.h"
#include "replay/policy.h"

namespace flatkv::tools {
namespace {

double Ratio(double a, double b) { return (a > 0 && b > 0) ? a / b : -1; }
nlohmann::json OrNull(double v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); }

double InfoMs(const SizeResult& s, const char* run, const char* key) {
  if (!s.runs.contains(run)) return -1;
  const auto& r = s.runs.at(run);
  return r.contains(key) && r.at(key).is_number() ? r.at(key).get<double>() : -1;
}

std::string Cell(double v, const char* fmt) {
  if (v < 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

const SizeResult* Largest(const BenchReport& report) {
  const SizeResult* largest = nullptr;
  for (const SizeResult& s : report.sizes)
    if (largest == nullptr || s.session_bytes > largest->session_bytes) largest = &s;
  return largest;
}

// What src/replay/tiered_policy.cc assumes for the session, with the replay's
// default IoModel (this machine's figures, host destination): a DRAM-pool hit
// is a copy at dram_copy_gbps; an SSD hit is one read per object of the 4 KiB
// span around the value plus ssd_request_us, serial per key (its staging
// holds); the first usable object is the first such read.
nlohmann::json TieredModel(const SizeResult& s) {
  replay::IoModel io;
  io.gpu_destination = false;
  replay::LookupResult dram;
  dram.hit_blocks = dram.dram_blocks = s.blocks;
  dram.dram_bytes_read = s.session_bytes;
  dram.dram_requests = s.blocks;
  const double dram_s = io.RestoreSeconds(dram);
  const uint64_t span = (s.block_bytes + 4095) / 4096 * 4096 + 4096;  // value at an arbitrary offset in its bucket
  const double per_obj = double(span) / (io.ssd_read_gbps * 1e9) + io.ssd_request_us * 1e-6;
  const double ssd_s = per_obj * s.blocks;
  return {{"io_model", io.ToString()},
          {"dram_gbps", double(s.session_bytes) / dram_s / 1e9},
          {"ssd_gbps", double(s.session_bytes) / ssd_s / 1e9},
          {"ssd_first_object_ms", per_obj * 1e3},
          {"dram_first_object_ms", double(s.block_bytes) / (io.dram_copy_gbps * 1e9) * 1e3},
          {"source", "src/replay/tiered_policy.cc (reads serial per key) with replay::IoModel's defaults"}};
}

struct Goals {
  double ssd_over_best_peer, first_layer_over_peer_chunk, daemon_shm_over_mooncake_dram;
};

Goals GoalsOf(const SizeResult& s) {
  const double best_peer_ssd = std::max(MedianGbps(s, "mooncake_ssd"), MedianGbps(s, "lmcache_disk"));
  double peer_chunk = -1;
  for (const char* run : {"mooncake_ssd", "lmcache_disk"}) {
    const double ms = InfoMs(s, run, "first_chunk_ms");
    if (ms > 0) peer_chunk = peer_chunk < 0 ? ms : std::min(peer_chunk, ms);
  }
  return {Ratio(MedianGbps(s, "ssd_restore"), best_peer_ssd), Ratio(InfoMs(s, "ssd_restore", "first_layer_ms"), peer_chunk),
          Ratio(MedianGbps(s, "daemon_shm_restore"), MedianGbps(s, "mooncake_dram"))};
}

}  // namespace

void AddPeerJson(const BenchReport& report, nlohmann::json& j) {
  const SizeResult* top = Largest(report);
  for (std::string_view run : kPeerRunNames)
    j[std::string(run) + "_gbps"] = top ? OrNull(MedianGbps(*top, run)) : nlohmann::json(nullptr);
  j["mooncake_first_chunk_ms"] = top ? OrNull(InfoMs(*top, "mooncake_ssd", "first_chunk_ms")) : nlohmann::json(nullptr);
  j["mooncake_dram_first_chunk_ms"] = top ? OrNull(InfoMs(*top, "mooncake_dram", "first_chunk_ms")) : nlohmann::json(nullptr);
  j["lmcache_first_chunk_ms"] = top ? OrNull(InfoMs(*top, "lmcache_disk", "first_chunk_ms")) : nlohmann::json(nullptr);
  j["ssd_first_layer_ms"] = top ? OrNull(InfoMs(*top, "ssd_restore", "first_layer_ms")) : nlohmann::json(nullptr);
  j["mooncake_get_p50_us"] = top ? OrNull(InfoMs(*top, "mooncake_dram", "get_p50_us")) : nlohmann::json(nullptr);
  j["mooncake_get_p99_us"] = top ? OrNull(InfoMs(*top, "mooncake_dram", "get_p99_us")) : nlohmann::json(nullptr);
  const Goals g = top ? GoalsOf(*top) : Goals{-1, -1, -1};
  j["ssd_over_best_peer_ssd"] = OrNull(g.ssd_over_best_peer);
  j["first_layer_over_peer_first_chunk"] = OrNull(g.first_layer_over_peer_chunk);
  j["daemon_shm_over_mooncake_dram"] = OrNull(g.daemon_shm_over_mooncake_dram);
  j["tiered_model"] = top ? TieredModel(*top) : nlohmann::json(nullptr);
  // peer_errors: run -> the first error, with its size; a peer that ran everywhere is absent.
  nlohmann::json errors = nlohmann::json::object();
  for (size_t i = 0; i < report.sizes.size(); ++i) {
    const SizeResult& s = report.sizes[i];
    nlohmann::json& row = j["sizes"][i]["runs"];
    for (std::string_view run : kPeerRunNames) {
      const std::string name(run);
      if (!s.runs.contains(name)) continue;
      const auto& info = s.runs.at(name);
      if (info.contains("error") && !errors.contains(name))
        errors[name] = std::to_string(s.requested_mib) + " MiB session: " + info.at("error").get<std::string>();
      auto it = s.gbps.find(run);
      if (it == s.gbps.end() || it->second.empty()) continue;
      const SampleSummary sum = Summarize(it->second);
      row[name] = {{"median_gbps", sum.median}, {"min_gbps", sum.min}, {"max_gbps", sum.max},
                   {"samples_gbps", it->second}, {"info", info}};
    }
    const Goals gs = GoalsOf(s);
    j["sizes"][i]["ssd_over_best_peer_ssd"] = OrNull(gs.ssd_over_best_peer);
    j["sizes"][i]["first_layer_over_peer_first_chunk"] = OrNull(gs.first_layer_over_peer_chunk);
    j["sizes"][i]["daemon_shm_over_mooncake_dram"] = OrNull(gs.daemon_shm_over_mooncake_dram);
  }
  j["peer_errors"] = errors;
}

std::string FormatPeerTable(const BenchReport& report) {
  bool any = false;
  for (const SizeResult& s : report.sizes)
    for (std::string_view run : kPeerRunNames) any = any || s.runs.contains(std::string(run));
  if (!any) return "";
  std::string out = "\nthe real peers on the same bytes (GB/s; first = ms to the first usable layer or chunk, SSD runs)\n";
  char line[512];
  std::snprintf(line, sizeof(line), "%-10s %8s %8s %8s %8s %8s %8s %8s | %7s %7s %7s %7s | %8s %8s\n", "session", "ssd",
                "d-shm", "mc-dram", "mc-tcp", "mc-ssd", "lmc-cpu", "lmc-dsk", "fkv 1st", "mc 1st", "lmc 1st", "ssd/pr",
                "shm/mcd", "1st/pr");
  out += line;
  out += std::string(std::string_view(line).size() - 1, '-') + "\n";
  for (const SizeResult& s : report.sizes) {
    const Goals g = GoalsOf(s);
    std::snprintf(line, sizeof(line), "%-10s %8s %8s %8s %8s %8s %8s %8s | %7s %7s %7s %7s | %8s %8s\n",
                  (std::to_string(s.requested_mib) + " MiB").c_str(), Cell(MedianGbps(s, "ssd_restore"), "%.2f").c_str(),
                  Cell(MedianGbps(s, "daemon_shm_restore"), "%.2f").c_str(), Cell(MedianGbps(s, "mooncake_dram"), "%.2f").c_str(),
                  Cell(MedianGbps(s, "mooncake_dram_tcp"), "%.2f").c_str(), Cell(MedianGbps(s, "mooncake_ssd"), "%.2f").c_str(),
                  Cell(MedianGbps(s, "lmcache_cpu"), "%.2f").c_str(), Cell(MedianGbps(s, "lmcache_disk"), "%.2f").c_str(),
                  Cell(InfoMs(s, "ssd_restore", "first_layer_ms"), "%.1f").c_str(),
                  Cell(InfoMs(s, "mooncake_ssd", "first_chunk_ms"), "%.1f").c_str(),
                  Cell(InfoMs(s, "lmcache_disk", "first_chunk_ms"), "%.1f").c_str(), Cell(g.ssd_over_best_peer, "%.2fx").c_str(),
                  Cell(g.daemon_shm_over_mooncake_dram, "%.2fx").c_str(), Cell(g.first_layer_over_peer_chunk, "%.2fx").c_str());
    out += line;
  }
  out += "d-shm = flatkv through a `flatkv serve` child, shared-memory window; mc = Mooncake Store standalone (mooncake_client "
         "owns the pool; dram: DummyClient, shared memory; tcp: embedded client, no segment, TCP; ssd: pool overfilled, "
         "bucket offload); lmc = LMCache LocalCPUBackend / LocalDiskBackend in-process. ssd/pr = flatkv ssd over the faster "
         "of mc-ssd and lmc-dsk (goal >= 1.5x); shm/mcd = d-shm over mc-dram (goal >= 1x); 1st/pr = flatkv's first layer over "
         "the faster peer's first chunk (goal <= 0.5x).\n";
  if (const SizeResult* top = Largest(report)) {
    const nlohmann::json m = TieredModel(*top);
    std::snprintf(line, sizeof(line),
                  "replay's tiered model for the largest session (%s): DRAM pool %.2f GB/s, SSD offload %.2f GB/s, first "
                  "SSD object %.2f ms; Mooncake get per object here: p50 %s us, p99 %s us\n",
                  m.value("io_model", std::string()).c_str(), m.value("dram_gbps", 0.0), m.value("ssd_gbps", 0.0),
                  m.value("ssd_first_object_ms", 0.0), Cell(InfoMs(*top, "mooncake_dram", "get_p50_us"), "%.0f").c_str(),
                  Cell(InfoMs(*top, "mooncake_dram", "get_p99_us"), "%.0f").c_str());
    out += line;
  }
  for (const SizeResult& s : report.sizes)
    for (std::string_view run : kPeerRunNames) {
      const std::string name(run);
      if (s.runs.contains(name) && s.runs.at(name).contains("error"))
        out += "peer error: " + name + " (" + std::to_string(s.requested_mib) + " MiB): " +
               s.runs.at(name).at("error").get<std::string>() + "\n";
    }
  return out;
}

nlohmann::json MeasureMooncakeGets(const std::string& dir, uint32_t value_bytes, uint32_t count) {
  // A one-block session starts the DRAM store; the gets are of one value of value_bytes.
  std::vector<std::byte> bytes(4096);
  BenchSession s;
  s.shape = KvShape{};
  s.block_tokens = 16;
  s.blocks = 1;
  s.block_bytes = bytes.size();
  s.block_layer_bytes = bytes.size();
  s.bytes = bytes;
  s.padded_bytes = bytes.size();
  s.keys = {BlockKey{}};
  s.dir = dir;
  auto ctx = MakePeerContext();
  auto run = MakePeerRun("mooncake_dram", ctx);
  if (Status st = run->Setup(s); !st.ok()) return {{"error", st.ToString()}};
  nlohmann::json out;
  if (!run->Unavailable().empty()) {
    out = {{"error", run->Unavailable()}};
  } else {
    out = PeerLatency(*run, value_bytes, count);
  }
  (void)run->Teardown();
  return out;
}

}  // namespace flatkv::tools
