// What `flatkv replay` prints: a table for people, JSON for machines, SVG
// plots of hit rate and TTFT against load, and a progress bar.
//
// Thread-safety: functions of their arguments; a ProgressBar is used by one
// thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "flatkv/status.h"
#include "replay/simulator.h"

namespace flatkv::replay {

// One row per (policy, load), in run order.
std::string FormatTable(const std::vector<SimResult>& results);

// Fills ratio_vs_flat_* of every result other than `reference`'s that has a
// `reference` result at the same load over as many orders: per order its
// mean TTFT over the reference's (the same conversation order, so the pair
// shares its arrivals), then their mean and a 95% Student-t interval (n-1
// degrees of freedom; one order: the ratio, no interval).
void PairRatios(std::vector<SimResult>* results, std::string_view reference = "flat");

// Appends, for each load with at least two of the tiered variants (tiered,
// tiered-lw, tiered-nopromo, tiered-lw-nopromo), a "tiered-best" row: a copy
// of the variant with the lowest mean TTFT there, best_of naming it.
void AddTieredBest(std::vector<SimResult>* results);

// {"config": config, "results": [{policy, load, hit_rate,
// ssd_read_amplification, ttft_mean_ms, ttft_mean_ms_min, ttft_mean_ms_max
// (the spread of the orders' means), ttft_p50_ms, ttft_p99_ms, total_tok_s
// (= throughput_tok_s, input + output tokens/s), input_tok_s, output_tok_s,
// restore_gbps, bytes read and written per medium, preemptions, layerwise,
// aborted_blocks, ratio_vs_flat_mean / _ci_low / _ci_high (null where not
// paired), order_ttft_mean_ms, best_of, ...}]};
// `flatkv replay --json` adds top-level "hw" and "model".
nlohmann::json ToJson(const std::vector<SimResult>& results, const nlohmann::json& config);
nlohmann::json ToJson(const SimResult& r);

// A line chart: one polyline per series, axes with ticks, a legend.
struct Series {
  std::string name;
  std::vector<double> x, y;
};
std::string SvgLineChart(const std::string& title, const std::string& x_label, const std::string& y_label,
                         const std::vector<Series>& series, bool log_x);

// Writes hit_rate.svg and ttft_mean.svg (against load, one line per
// policy) into `dir`, creating it.
Status WritePlots(const std::vector<SimResult>& results, const std::string& dir);

// A one-line progress bar on stderr, drawn only when stderr is a terminal,
// at most ten times a second.
class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();
  void Update(uint64_t done, uint64_t total);
  void Finish();  // clears the line

 private:
  std::string label_;
  bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace flatkv::replay
