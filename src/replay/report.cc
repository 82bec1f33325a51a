#include "replay/report.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>

namespace flatkv::replay {
namespace {

std::string Fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string Gb(uint64_t bytes) { return Fmt("%.1f", double(bytes) / 1e9); }

std::string Escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') o += "&lt;";
    else if (c == '>') o += "&gt;";
    else if (c == '&') o += "&amp;";
    else o += c;
  }
  return o;
}

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"};

}  // namespace

namespace {

// Two-sided 95% quantile of Student's t with `df` degrees of freedom.
double T975(size_t df) {
  static constexpr double kT[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                  2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                  2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  if (df == 0) return std::numeric_limits<double>::quiet_NaN();
  return df <= std::size(kT) ? kT[df - 1] : 1.960;
}

std::string Ratio(const SimResult& r) {
  if (std::isnan(r.ratio_vs_flat_mean)) return "-";
  char buf[64];
  if (std::isnan(r.ratio_vs_flat_ci_low)) {
    std::snprintf(buf, sizeof buf, "%.3f", r.ratio_vs_flat_mean);
  } else {
    std::snprintf(buf, sizeof buf, "%.3f [%.3f..%.3f]", r.ratio_vs_flat_mean, r.ratio_vs_flat_ci_low,
                  r.ratio_vs_flat_ci_high);
  }
  return buf;
}

}  // namespace

void PairRatios(std::vector<SimResult>* results, std::string_view reference) {
  for (SimResult& r : *results) {
    if (r.policy == reference) continue;
    const SimResult* ref = nullptr;
    for (const SimResult& c : *results)
      if (c.policy == reference && c.load == r.load && c.order_ttft_mean_ms.size() == r.order_ttft_mean_ms.size())
        ref = &c;
    if (ref == nullptr || r.order_ttft_mean_ms.empty()) continue;
    std::vector<double> x;
    for (size_t k = 0; k < r.order_ttft_mean_ms.size(); ++k)
      if (ref->order_ttft_mean_ms[k] > 0) x.push_back(r.order_ttft_mean_ms[k] / ref->order_ttft_mean_ms[k]);
    if (x.empty()) continue;
    double mean = 0;
    for (double v : x) mean += v;
    mean /= double(x.size());
    r.ratio_vs_flat_mean = mean;
    if (x.size() < 2) continue;
    double ss = 0;
    for (double v : x) ss += (v - mean) * (v - mean);
    const double half = T975(x.size() - 1) * std::sqrt(ss / double(x.size() - 1) / double(x.size()));
    r.ratio_vs_flat_ci_low = mean - half;
    r.ratio_vs_flat_ci_high = mean + half;
  }
}

void AddTieredBest(std::vector<SimResult>* results) {
  static constexpr std::string_view kVariants[] = {"tiered", "tiered-lw", "tiered-nopromo", "tiered-lw-nopromo"};
  std::vector<double> loads;
  for (const SimResult& r : *results)
    if (std::find(loads.begin(), loads.end(), r.load) == loads.end()) loads.push_back(r.load);
  std::vector<SimResult> best;
  for (double load : loads) {
    const SimResult* pick = nullptr;
    int variants = 0;
    for (const SimResult& r : *results) {
      if (r.load != load || std::find(std::begin(kVariants), std::end(kVariants), r.policy) == std::end(kVariants))
        continue;
      ++variants;
      if (pick == nullptr || r.ttft_mean_ms() < pick->ttft_mean_ms()) pick = &r;
    }
    if (variants < 2) continue;
    SimResult b = *pick;
    b.best_of = b.policy;
    b.policy = "tiered-best";
    best.push_back(std::move(b));
  }
  for (SimResult& b : best) results->push_back(std::move(b));
}

std::string FormatTable(const std::vector<SimResult>& results) {
  std::string out;
  char line[640];
  std::snprintf(line, sizeof line, "%-17s %2s %7s %7s %6s %6s %8s %6s %9s %9s %9s %9s %10s %17s %10s %10s %10s %7s  %s\n",
                "policy", "lw", "load", "hit%", "dram%", "ssd%", "aborted", "ssd_ra", "dramR_GB", "ssdR_GB", "dramW_GB",
                "ssdW_GB", "ttft_mean", "(min..max)", "ttft_p50", "ttft_p99", "tok/s", "preempt", "x_flat [95% CI]");
  out += line;
  for (const SimResult& r : results) {
    const double hits = r.hit_blocks ? double(r.hit_blocks) : 1.0;
    std::snprintf(line, sizeof line,
                  "%-17s %2s %7.3g %7.2f %6.1f %6.1f %8llu %6.3f %9s %9s %9s %9s %8.0fms %7.0f..%-7.0f %8.0fms %8.0fms "
                  "%10.0f %7llu  %s%s\n",
                  r.policy.c_str(), r.layerwise ? "y" : "-", r.load, 100.0 * r.hit_rate(),
                  100.0 * double(r.dram_hit_blocks) / hits, 100.0 * double(r.ssd_hit_blocks) / hits,
                  static_cast<unsigned long long>(r.aborted_blocks), r.ssd_read_amplification(),
                  Gb(r.dram_bytes_read).c_str(), Gb(r.ssd_bytes_read).c_str(), Gb(r.dram_bytes_written).c_str(),
                  Gb(r.ssd_bytes_written).c_str(), r.ttft_mean_ms(), r.ttft_mean_ms_min, r.ttft_mean_ms_max,
                  r.ttft_percentile_ms(50), r.ttft_percentile_ms(99), r.total_tok_s(),
                  static_cast<unsigned long long>(r.preemptions), Ratio(r).c_str(),
                  r.best_of.empty() ? "" : ("  = " + r.best_of).c_str());
    out += line;
  }
  out += "lw: streams by layer; hit%: token-weighted hit rate; dram%/ssd%: of the hit blocks, those served from each\n"
         "medium; aborted: blocks found on SSD but not read (no staging), counted as misses; ssd_ra: SSD read\n"
         "amplification (bytes read / payload); R/W: bytes read and written per medium; ttft_mean over all orders,\n"
         "(min..max) the spread of the orders' means; tok/s: input + output tokens per second; preempt: recompute\n"
         "preemptions (HBM for KV ran out); x_flat: mean TTFT over flat's, paired by order, mean [95% CI].\n";
  std::vector<std::string> noted;  // one note per policy
  for (const SimResult& r : results) {
    if (std::find(noted.begin(), noted.end(), r.policy) != noted.end()) continue;
    noted.push_back(r.policy);
    if (r.dram_copy_threads > 0) {
      std::snprintf(line, sizeof line,
                    "%s: DRAM hits copied by its %u copy threads at %.1f GB/s together (threads x the profile's "
                    "memcpy_core_gbps) into a host window, then across the host-to-GPU link: the store as built.\n",
                    r.policy.c_str(), r.dram_copy_threads, r.dram_copy_gbps);
      out += line;
    }
    if (r.policy == "flat-gpu-window")
      out += "flat-gpu-window: the same store with a GPU window, its DRAM hits DMA'd from pinned host memory at the\n"
             "link's rate (src/gpu/: built, not yet measured on a GPU).\n";
    if (r.policy == "infinite-lw")
      out += "infinite-lw: the bound; every hit in DRAM, streamed by layer at the links, no step waiting for it.\n";
  }
  bool remote = false;
  for (const SimResult& r : results) remote = remote || r.nodes > 1 || r.remote_hit_blocks || r.remote_published_blocks;
  if (remote) {
    std::snprintf(line, sizeof line, "\n%-10s %7s %7s %7s %7s %9s %10s %9s %9s %9s  %s\n", "policy", "load", "hit%",
                  "local%", "remote%", "remR_GB", "published", "dropped", "deleted", "nodes", "routing");
    out += line;
    for (const SimResult& r : results) {
      const double hits = r.hit_blocks ? double(r.hit_blocks) : 1.0;
      std::snprintf(line, sizeof line, "%-10s %7.3g %7.2f %7.2f %7.1f %9s %10llu %9llu %9llu %9u  %s\n", r.policy.c_str(),
                    r.load, 100.0 * r.hit_rate(), 100.0 * r.local_hit_rate(), 100.0 * double(r.remote_hit_blocks) / hits,
                    Gb(r.remote_bytes_read).c_str(), static_cast<unsigned long long>(r.remote_published_blocks),
                    static_cast<unsigned long long>(r.remote_dropped_blocks),
                    static_cast<unsigned long long>(r.remote_deleted_blocks), r.nodes, r.routing.c_str());
      out += line;
    }
    out += "hit%: local and remote hits together (global); local%: the node's own DRAM and SSD alone; remote%: of the\n"
           "hit blocks, those restored from the shared tier; remR_GB: bytes restored from it; published, dropped\n"
           "(publish buffer full), deleted (a node's cap): blocks.\n";
  }
  for (const SimResult& r : results)
    if (r.prefetch_ssd_bytes > 0) {
      std::snprintf(line, sizeof line, "%s at load %.3g: %s GB more read from SSD by prefetches on arrival (not in ssdR_GB).\n",
                    r.policy.c_str(), r.load, Gb(r.prefetch_ssd_bytes).c_str());
      out += line;
    }
  return out;
}

nlohmann::json ToJson(const SimResult& r) {
  nlohmann::json j;
  j["policy"] = r.policy;
  j["load"] = r.load;
  j["requests"] = r.requests;
  j["hit_rate"] = r.hit_rate();
  j["ssd_read_amplification"] = r.ssd_read_amplification();
  j["ttft_mean_ms"] = r.ttft_mean_ms();
  j["ttft_p50_ms"] = r.ttft_percentile_ms(50);
  j["ttft_p99_ms"] = r.ttft_percentile_ms(99);
  j["throughput_tok_s"] = r.total_tok_s();
  j["total_tok_s"] = r.total_tok_s();
  j["ttft_mean_ms_min"] = r.ttft_mean_ms_min;
  j["ttft_mean_ms_max"] = r.ttft_mean_ms_max;
  j["orders"] = r.orders;
  j["instances"] = r.instances;
  j["tp"] = r.tp;
  j["kv_hbm_bytes"] = r.kv_hbm_bytes;
  j["steps"] = r.steps;
  j["preemptions"] = r.preemptions;
  j["busy_s"] = r.busy_s;
  j["tokens_per_step"] = r.tokens_per_step();
  j["input_tok_s"] = r.input_tok_s();
  j["output_tok_s"] = r.output_tok_s();
  j["input_tokens"] = r.input_tokens;
  j["hit_tokens"] = r.hit_tokens;
  j["output_tokens"] = r.output_tokens;
  j["lookup_blocks"] = r.lookup_blocks;
  j["hit_blocks"] = r.hit_blocks;
  j["dram_hit_blocks"] = r.dram_hit_blocks;
  j["ssd_hit_blocks"] = r.ssd_hit_blocks;
  j["aborted_blocks"] = r.aborted_blocks;
  j["layerwise"] = r.layerwise;
  j["dram_copy_threads"] = r.dram_copy_threads;
  j["dram_copy_gbps"] = r.dram_copy_gbps;
  j["order_ttft_mean_ms"] = r.order_ttft_mean_ms;
  auto num = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
  j["ratio_vs_flat_mean"] = num(r.ratio_vs_flat_mean);
  j["ratio_vs_flat_ci_low"] = num(r.ratio_vs_flat_ci_low);
  j["ratio_vs_flat_ci_high"] = num(r.ratio_vs_flat_ci_high);
  if (!r.best_of.empty()) j["best_of"] = r.best_of;
  j["dram_bytes_read"] = r.dram_bytes_read;
  j["ssd_bytes_read"] = r.ssd_bytes_read;
  j["ssd_bytes_useful"] = r.ssd_bytes_useful;
  j["dram_bytes_written"] = r.dram_bytes_written;
  j["ssd_bytes_written"] = r.ssd_bytes_written;
  j["evicted_blocks"] = r.evicted_blocks;
  j["migrated_blocks"] = r.migrated_blocks;
  j["prefetch_ssd_bytes"] = r.prefetch_ssd_bytes;
  j["nodes"] = r.nodes;
  j["routing"] = r.routing;
  j["local_hit_rate"] = r.local_hit_rate();
  j["local_hit_tokens"] = r.local_hit_tokens;
  j["remote_hit_blocks"] = r.remote_hit_blocks;
  j["remote_bytes_read"] = r.remote_bytes_read;
  j["remote_published_blocks"] = r.remote_published_blocks;
  j["remote_dropped_blocks"] = r.remote_dropped_blocks;
  j["remote_deleted_blocks"] = r.remote_deleted_blocks;
  j["restore_gbps"] = r.restore_gbps();
  j["restore_s"] = r.restore_s;
  j["model_restore_s"] = r.model_restore_s;
  j["real_restore_s"] = r.real_restore_s;
  j["prefill_s"] = r.prefill_s;
  j["queue_s"] = r.queue_s;
  j["makespan_s"] = r.makespan_s;
  return j;
}

nlohmann::json ToJson(const std::vector<SimResult>& results, const nlohmann::json& config) {
  nlohmann::json j;
  j["config"] = config;
  j["results"] = nlohmann::json::array();
  for (const SimResult& r : results) j["results"].push_back(ToJson(r));
  return j;
}

std::string SvgLineChart(const std::string& title, const std::string& x_label, const std::string& y_label,
                         const std::vector<Series>& series, bool log_x) {
  constexpr double W = 640, H = 420, L = 70, R = 150, T = 40, B = 55;
  double x0 = 1e300, x1 = -1e300, y0 = 0, y1 = -1e300;
  auto tx = [&](double x) { return log_x ? std::log2(x) : x; };
  for (const Series& s : series)
    for (size_t i = 0; i < s.x.size(); ++i) {
      x0 = std::min(x0, tx(s.x[i]));
      x1 = std::max(x1, tx(s.x[i]));
      y1 = std::max(y1, s.y[i]);
    }
  if (!(x1 > x0)) { x0 -= 1; x1 += 1; }
  if (!(y1 > y0)) y1 = y0 + 1;
  y1 *= 1.05;
  auto px = [&](double x) { return L + (tx(x) - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"640\" height=\"420\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + Fmt("%.0f", W / 2) + "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">" + Escape(title) + "</text>\n";
  // Axes.
  s += "<line x1=\"" + Fmt("%.1f", L) + "\" y1=\"" + Fmt("%.1f", H - B) + "\" x2=\"" + Fmt("%.1f", W - R) + "\" y2=\"" +
       Fmt("%.1f", H - B) + "\" stroke=\"black\"/>\n";
  s += "<line x1=\"" + Fmt("%.1f", L) + "\" y1=\"" + Fmt("%.1f", T) + "\" x2=\"" + Fmt("%.1f", L) + "\" y2=\"" +
       Fmt("%.1f", H - B) + "\" stroke=\"black\"/>\n";
  // X ticks at the data's x values.
  std::map<double, bool> xs;
  for (const Series& se : series)
    for (double x : se.x) xs[x] = true;
  for (const auto& [x, unused] : xs) {
    s += "<line x1=\"" + Fmt("%.1f", px(x)) + "\" y1=\"" + Fmt("%.1f", H - B) + "\" x2=\"" + Fmt("%.1f", px(x)) +
         "\" y2=\"" + Fmt("%.1f", H - B + 5) + "\" stroke=\"black\"/>\n";
    s += "<text x=\"" + Fmt("%.1f", px(x)) + "\" y=\"" + Fmt("%.1f", H - B + 18) + "\" text-anchor=\"middle\">" +
         Fmt("%g", x) + "</text>\n";
  }
  for (int i = 0; i <= 5; ++i) {
    const double y = y0 + (y1 - y0) * i / 5;
    s += "<line x1=\"" + Fmt("%.1f", L - 5) + "\" y1=\"" + Fmt("%.1f", py(y)) + "\" x2=\"" + Fmt("%.1f", W - R) +
         "\" y2=\"" + Fmt("%.1f", py(y)) + "\" stroke=\"#ddd\"/>\n";
    s += "<text x=\"" + Fmt("%.1f", L - 8) + "\" y=\"" + Fmt("%.1f", py(y) + 4) + "\" text-anchor=\"end\">" +
         Fmt("%.3g", y) + "</text>\n";
  }
  s += "<text x=\"" + Fmt("%.1f", (L + W - R) / 2) + "\" y=\"" + Fmt("%.1f", H - 12) + "\" text-anchor=\"middle\">" +
       Escape(x_label) + "</text>\n";
  s += "<text transform=\"translate(18," + Fmt("%.1f", (T + H - B) / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
       Escape(y_label) + "</text>\n";
  for (size_t k = 0; k < series.size(); ++k) {
    const Series& se = series[k];
    const char* color = kColors[k % std::size(kColors)];
    std::string pts;
    for (size_t i = 0; i < se.x.size(); ++i) pts += Fmt("%.1f", px(se.x[i])) + "," + Fmt("%.1f", py(se.y[i])) + " ";
    s += "<polyline fill=\"none\" stroke=\"" + std::string(color) + "\" stroke-width=\"2\" points=\"" + pts + "\"/>\n";
    for (size_t i = 0; i < se.x.size(); ++i)
      s += "<circle cx=\"" + Fmt("%.1f", px(se.x[i])) + "\" cy=\"" + Fmt("%.1f", py(se.y[i])) + "\" r=\"3\" fill=\"" +
           color + "\"/>\n";
    const double ly = T + 10 + 20.0 * double(k);
    s += "<line x1=\"" + Fmt("%.1f", W - R + 15) + "\" y1=\"" + Fmt("%.1f", ly) + "\" x2=\"" + Fmt("%.1f", W - R + 40) +
         "\" y2=\"" + Fmt("%.1f", ly) + "\" stroke=\"" + color + "\" stroke-width=\"2\"/>\n";
    s += "<text x=\"" + Fmt("%.1f", W - R + 46) + "\" y=\"" + Fmt("%.1f", ly + 4) + "\">" + Escape(se.name) + "</text>\n";
  }
  s += "</svg>\n";
  return s;
}

Status WritePlots(const std::vector<SimResult>& results, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("plot: cannot create " + dir + ": " + ec.message());
  std::vector<std::string> order;
  std::map<std::string, Series> hit, ttft;
  for (const SimResult& r : results) {
    if (!hit.count(r.policy)) order.push_back(r.policy);
    Series& h = hit[r.policy];
    Series& t = ttft[r.policy];
    h.name = t.name = r.policy;
    h.x.push_back(r.load);
    h.y.push_back(100.0 * r.hit_rate());
    t.x.push_back(r.load);
    t.y.push_back(r.ttft_mean_ms() / 1e3);
  }
  std::vector<Series> hs, ts;
  for (const auto& p : order) {
    hs.push_back(hit[p]);
    ts.push_back(ttft[p]);
  }
  const std::pair<std::string, std::string> files[] = {
      {dir + "/hit_rate.svg", SvgLineChart("Token-weighted hit rate vs load", "load factor", "hit rate (%)", hs, true)},
      {dir + "/ttft_mean.svg", SvgLineChart("Mean TTFT vs load", "load factor", "mean TTFT (s)", ts, true)}};
  for (const auto& [path, svg] : files) {
    std::ofstream f(path, std::ios::trunc);
    f << svg;
    if (!f) return Status::IoError("plot: cannot write " + path);
  }
  return Status::Ok();
}

ProgressBar::ProgressBar(std::string label) : label_(std::move(label)), tty_(isatty(2) != 0) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Update(uint64_t done, uint64_t total) {
  if (!tty_ || total == 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (done < total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(double(done) / double(total) * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r%-24s [%s] %3d%% (%llu/%llu)", label_.c_str(), bar.c_str(), int(100.0 * double(done) / double(total)),
               static_cast<unsigned long long>(done), static_cast<unsigned long long>(total));
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r%*s\r", 100, "");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace flatkv::replay
