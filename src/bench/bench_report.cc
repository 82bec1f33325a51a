#include "bench/bench_report.h"

#include <algorithm>
#include <cstdio>

#include "bench/bench_util.h"

namespace flatkv::tools {
namespace {

// a / b, or a negative value when either is missing.
double Ratio(double a, double b) { return (a > 0 && b > 0) ? a / b : -1; }

nlohmann::json OrNull(double v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); }

std::string Cell(double v, const char* fmt) {
  if (v < 0) return "-";
  char buf[32];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

std::string SessionLabel(const SizeResult& s) {
  char buf[64];
  const double mib = double(s.session_bytes) / double(1 << 20);
  if (s.session_bytes == s.requested_mib << 20) {
    std::snprintf(buf, sizeof(buf), "%.0f MiB", mib);
  } else {
    std::snprintf(buf, sizeof(buf), "%.4g MiB (asked %llu)", mib, static_cast<unsigned long long>(s.requested_mib));
  }
  return buf;
}

struct Ratios {
  // ssd_over_rocksdb: against the faster of the two RocksDB configurations.
  double ssd_over_raw, dram_over_memcpy, ssd_over_files, ssd_over_rocksdb, ssd_over_rocksdb_blobdb;
};

Ratios RatiosOf(const SizeResult& s) {
  const double ssd = MedianGbps(s, "ssd_restore");
  const double best_rocksdb = std::max(MedianGbps(s, "rocksdb"), MedianGbps(s, "rocksdb_blobdb"));
  return {Ratio(ssd, MedianGbps(s, "raw_direct_read")), Ratio(MedianGbps(s, "dram_restore"), MedianGbps(s, "memcpy")),
          Ratio(ssd, MedianGbps(s, "files_per_block")), Ratio(ssd, best_rocksdb),
          Ratio(ssd, MedianGbps(s, "rocksdb_blobdb"))};
}

}  // namespace

double MedianGbps(const SizeResult& size, std::string_view run) {
  auto it = size.gbps.find(run);
  if (it == size.gbps.end() || it->second.empty()) return -1;
  return Summarize(it->second).median;
}

std::string FormatTable(const BenchReport& report) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof(line), "%-22s %-10s %8s %8s %8s %8s %8s %8s %8s | %7s %7s %7s %7s\n", "session", "blocks",
                "memcpy", "raw_dio", "dram", "ssd", "files", "rocksdb", "blobdb", "ssd/raw", "dram/mc", "ssd/fil",
                "ssd/rdb");
  out += line;
  out += std::string(std::string_view(line).size() - 1, '-') + "\n";
  for (const SizeResult& s : report.sizes) {
    const Ratios r = RatiosOf(s);
    const std::string blocks = std::to_string(s.blocks) + " x " + std::to_string(s.block_tokens) + "t";
    std::snprintf(line, sizeof(line), "%-22s %-10s %8s %8s %8s %8s %8s %8s %8s | %7s %7s %7s %7s\n", SessionLabel(s).c_str(),
                  blocks.c_str(), Cell(MedianGbps(s, "memcpy"), "%.2f").c_str(),
                  Cell(MedianGbps(s, "raw_direct_read"), "%.2f").c_str(), Cell(MedianGbps(s, "dram_restore"), "%.2f").c_str(),
                  Cell(MedianGbps(s, "ssd_restore"), "%.2f").c_str(), Cell(MedianGbps(s, "files_per_block"), "%.2f").c_str(),
                  Cell(MedianGbps(s, "rocksdb"), "%.2f").c_str(), Cell(MedianGbps(s, "rocksdb_blobdb"), "%.2f").c_str(),
                  Cell(r.ssd_over_raw, "%.2fx").c_str(),
                  Cell(r.dram_over_memcpy, "%.2fx").c_str(), Cell(r.ssd_over_files, "%.2fx").c_str(),
                  Cell(r.ssd_over_rocksdb, "%.2fx").c_str());
    out += line;
  }
  out +=
      "\nGB/s (1e9 B/s), median over reps. Columns: memcpy = memcpy from DRAM; raw_dio = raw_direct_read (O_DIRECT, "
      "io_uring);\ndram/ssd = flatkv dram_restore/ssd_restore; files = files_per_block (LMCache / HiCache file layout, 4 reader "
      "threads);\nrocksdb = RocksDB defaults, Get per block; blobdb = RocksDB BlobDB, direct reads, MultiGet; ssd/rdb = "
      "ssd over the faster RocksDB.\n";
  for (const SizeResult& s : report.sizes) {
    if (!s.note.empty()) out += "note: " + SessionLabel(s) + ": " + s.note + "\n";
  }
  bool codec = false;
  for (const SizeResult& s : report.sizes) codec = codec || MedianGbps(s, "ssd_codec_restore") > 0;
  if (!codec) return out;
  std::snprintf(line, sizeof(line), "\ncodec %s (payload: %s): the same session restored from SSD stored raw and encoded\n",
                report.config.value("codec", std::string("?")).c_str(), report.config.value("payload", std::string("?")).c_str());
  out += line;
  std::snprintf(line, sizeof(line), "%-22s %8s %8s %11s %14s %14s %8s\n", "session", "ssd", "codec", "time c/raw",
                "read raw MiB", "read codec MiB", "ratio");
  out += line;
  for (const SizeResult& s : report.sizes) {
    auto read = [&](const char* run) {
      if (!s.runs.contains(run)) return -1.0;
      return s.runs.at(run).value("bytes_read_per_restore", -1.0) / double(1 << 20);
    };
    const double ratio = s.runs.contains("ssd_codec_restore") ? s.runs.at("ssd_codec_restore").value("compression_ratio", -1.0) : -1;
    std::snprintf(line, sizeof(line), "%-22s %8s %8s %11s %14s %14s %8s\n", SessionLabel(s).c_str(),
                  Cell(MedianGbps(s, "ssd_restore"), "%.2f").c_str(), Cell(MedianGbps(s, "ssd_codec_restore"), "%.2f").c_str(),
                  Cell(Ratio(MedianGbps(s, "ssd_restore"), MedianGbps(s, "ssd_codec_restore")), "%.3f").c_str(),
                  Cell(read("ssd_restore"), "%.2f").c_str(), Cell(read("ssd_codec_restore"), "%.2f").c_str(),
                  Cell(ratio, "%.2fx").c_str());
    out += line;
  }
  out += "time c/raw = restore time stored with the codec / stored raw (below 1: the codec restores faster); read = "
         "bytes read from SSD per restore; ratio = logical / stored bytes.\n";
  return out;
}

nlohmann::json ToJson(const BenchReport& report) {
  nlohmann::json j;
  const SizeResult* largest = nullptr;
  for (const SizeResult& s : report.sizes) {
    if (largest == nullptr || s.session_bytes > largest->session_bytes) largest = &s;
  }
  for (std::string_view run : kRunNames) {
    j[std::string(run) + "_gbps"] = largest ? OrNull(MedianGbps(*largest, run)) : nlohmann::json(nullptr);
  }
  const Ratios top = largest ? RatiosOf(*largest) : Ratios{-1, -1, -1, -1, -1};
  j["ssd_over_raw"] = OrNull(top.ssd_over_raw);
  j["dram_over_memcpy"] = OrNull(top.dram_over_memcpy);
  j["codec_over_raw_restore_time"] =
      largest ? OrNull(Ratio(MedianGbps(*largest, "ssd_restore"), MedianGbps(*largest, "ssd_codec_restore")))
              : nlohmann::json(nullptr);

  nlohmann::json rows = nlohmann::json::array();
  for (const SizeResult& s : report.sizes) {
    nlohmann::json row = {{"requested_mib", s.requested_mib}, {"session_bytes", s.session_bytes},
                          {"blocks", s.blocks},               {"block_tokens", s.block_tokens},
                          {"block_bytes", s.block_bytes},     {"reps", s.reps}};
    if (!s.note.empty()) row["note"] = s.note;
    nlohmann::json runs = nlohmann::json::object();
    for (std::string_view run : kRunNames) {
      auto it = s.gbps.find(run);
      if (it == s.gbps.end() || it->second.empty()) continue;
      const SampleSummary sum = Summarize(it->second);
      nlohmann::json r = {{"median_gbps", sum.median}, {"min_gbps", sum.min}, {"max_gbps", sum.max},
                          {"samples_gbps", it->second}};
      if (s.runs.contains(std::string(run))) r["info"] = s.runs.at(std::string(run));
      runs[std::string(run)] = r;
    }
    row["runs"] = runs;
    const Ratios r = RatiosOf(s);
    row["ssd_over_raw"] = OrNull(r.ssd_over_raw);
    row["dram_over_memcpy"] = OrNull(r.dram_over_memcpy);
    row["ssd_over_files_per_block"] = OrNull(r.ssd_over_files);
    row["ssd_over_rocksdb"] = OrNull(r.ssd_over_rocksdb);  // the faster RocksDB configuration
    row["ssd_over_rocksdb_blobdb"] = OrNull(r.ssd_over_rocksdb_blobdb);
    row["codec_over_raw_restore_time"] = OrNull(Ratio(MedianGbps(s, "ssd_restore"), MedianGbps(s, "ssd_codec_restore")));
    rows.push_back(row);
  }
  j["sizes"] = rows;
  j["config"] = report.config;
  if (largest != nullptr) j["config"]["summary_session_bytes"] = largest->session_bytes;
  return j;
}

}  // namespace flatkv::tools
