// Results of `flatkv bench restore` and their two renderings: a table for
// people and a JSON object for machines.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace flatkv::tools {

// The runs, in the order tables list them. ssd_codec_restore runs only
// with --codec (ssd_restore with the blocks stored encoded).
inline constexpr std::array<std::string_view, 8> kRunNames = {
    "memcpy",  "raw_direct_read", "dram_restore", "ssd_restore", "files_per_block",
    "rocksdb", "rocksdb_blobdb",  "ssd_codec_restore"};

// One session size's measurements.
struct SizeResult {
  uint64_t requested_mib = 0;
  uint64_t session_bytes = 0;  // what every run delivered: blocks * block_bytes
  uint32_t blocks = 0;
  uint32_t block_tokens = 0;
  uint64_t block_bytes = 0;
  uint32_t reps = 0;
  std::string note;  // why session_bytes differs from requested_mib, if it does
  std::map<std::string, std::vector<double>, std::less<>> gbps;  // run name -> one sample per rep
  nlohmann::json runs = nlohmann::json::object();                // run name -> Describe() and checks
};

struct BenchReport {
  nlohmann::json config = nlohmann::json::object();
  std::vector<SizeResult> sizes;
};

// Median GB/s of `run` at `size`, or a negative value when it was not measured.
double MedianGbps(const SizeResult& size, std::string_view run);

// The table for people (sizes down, runs across, then ratios).
std::string FormatTable(const BenchReport& report);

// {memcpy_gbps, raw_direct_read_gbps, dram_restore_gbps, ssd_restore_gbps,
//  files_per_block_gbps, rocksdb_gbps, ssd_codec_restore_gbps, ssd_over_raw,
//  dram_over_memcpy, codec_over_raw_restore_time} for
// the largest size measured (null where a run was not measured), plus
// `sizes` (one row per size) and `config`.
nlohmann::json ToJson(const BenchReport& report);

}  // namespace flatkv::tools
