#include "replay/hw_profile.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "replay/simulator.h"

namespace flatkv::replay {
namespace {

// The figures a profile must give, each with its `<key>_source`: the file's
// key and the report's (HwFigures), the field, the file's value times
// `unit` is the field's (hbm_gb: 1e9, to bytes), the field's times
// `report_scale` is the report's (step_overhead_ms: 1e3, back to ms), and
// the range the file's value must lie in. An optional figure may be left
// out (the field stays 0); given, it is checked and cited like the others.
struct Figure {
  std::string_view key, report_key;
  double HwProfile::*field;
  double unit, report_scale;
  double min, max;
  bool optional = false;
};
constexpr Figure kFigures[] = {
    {"hbm_gb", "hbm_bytes", &HwProfile::hbm_bytes, 1e9, 1, 1, 4096},
    {"hbm_tbps", "hbm_tbps", &HwProfile::hbm_tbps, 1, 1, 0.01, 100},
    {"hbm_efficiency", "hbm_efficiency", &HwProfile::hbm_efficiency, 1, 1, 0.05, 1},
    {"tflops_bf16", "tflops_bf16", &HwProfile::tflops, 1, 1, 1, 100000},
    {"prefill_mfu", "prefill_mfu", &HwProfile::mfu, 1, 1, 0.01, 1},
    {"step_overhead_ms", "step_overhead_ms", &HwProfile::step_overhead_s, 1e-3, 1e3, 0, 1000},
    {"pcie_gbps", "pcie_gbps", &HwProfile::pcie_gbps, 1, 1, 0.1, 1000},
    {"dram_gb", "dram_bytes", &HwProfile::dram_bytes, 1e9, 1, 1, 1 << 24},
    {"dram_gbps", "dram_gbps", &HwProfile::dram_gbps, 1, 1, 0.1, 100000},
    {"nvme_read_gbps", "nvme_read_gbps", &HwProfile::nvme_read_gbps, 1, 1, 0.01, 1000},
    {"nvme_write_gbps", "nvme_write_gbps", &HwProfile::nvme_write_gbps, 1, 1, 0.01, 1000},
    {"nvme_read_iops", "nvme_read_iops", &HwProfile::nvme_read_iops, 1, 1, 100, 1e9},
    {"nvme_latency_us", "nvme_latency_us", &HwProfile::nvme_latency_us, 1, 1, 0.1, 1e6},
    {"net_gbps", "net_gbps", &HwProfile::net_gbps, 1, 1, 0.01, 10000},
    {"net_rtt_us", "net_rtt_us", &HwProfile::net_rtt_us, 1, 1, 0.1, 1e7},
    {"remote_gbps", "remote_gbps", &HwProfile::remote_gbps, 1, 1, 0.01, 10000, true},
    {"remote_rtt_us", "remote_rtt_us", &HwProfile::remote_rtt_us, 1, 1, 0.1, 1e7, true},
    {"memcpy_core_gbps", "memcpy_core_gbps", &HwProfile::memcpy_core_gbps, 1, 1, 0.1, 10000, true},
    {"layer_sync_us", "layer_sync_us", &HwProfile::layer_sync_us, 1, 1, 0, 1e6, true},
};
constexpr std::string_view kCounts[] = {"gpus", "nvme_drives"};

Status Cited(const toml::table& t, const std::string& where, std::string_view key, HwProfile* p) {
  const std::string src = std::string(key) + "_source";
  auto s = t[src].value<std::string>();
  if (!s || s->empty())
    return Status::InvalidArgument(where + "." + std::string(key) + ": no citation (add " + src + " = \"...\")");
  p->sources[std::string(key)] = *s;
  return Status::Ok();
}

Result<HwProfile> ParseProfile(const std::string& name, const toml::table& t, const std::string& path) {
  const std::string where = path + ": [" + name + "]";
  HwProfile p;
  p.name = name;
  p.description = t["description"].value_or(std::string());
  p.measured_storage = t["measured_storage"].value_or(false);
  std::set<std::string> known = {"description", "measured_storage", "tp"};
  for (std::string_view k : kCounts) {
    known.insert(std::string(k));
    known.insert(std::string(k) + "_source");
    auto v = t[k].value<int64_t>();
    if (!v) return Status::InvalidArgument(where + "." + std::string(k) + ": missing or not an integer");
    if (*v < 1 || *v > 4096)
      return Status::InvalidArgument(where + "." + std::string(k) + ": " + std::to_string(*v) + " is out of range 1..4096");
    FLATKV_RETURN_IF_ERROR(Cited(t, where, k, &p));
    (k == "gpus" ? p.gpus : p.nvme_drives) = static_cast<uint32_t>(*v);
  }
  for (const Figure& f : kFigures) {
    known.insert(std::string(f.key));
    known.insert(std::string(f.key) + "_source");
    if (f.optional && !t.contains(f.key)) {
      if (t.contains(std::string(f.key) + "_source"))
        return Status::InvalidArgument(where + "." + std::string(f.key) + "_source: cites a figure that is not given");
      continue;
    }
    auto v = t[f.key].value<double>();
    if (!v) return Status::InvalidArgument(where + "." + std::string(f.key) + ": missing or not a number");
    if (!(*v >= f.min && *v <= f.max) || !std::isfinite(*v)) {
      std::ostringstream os;
      os << where << "." << f.key << ": " << *v << " is out of range " << f.min << ".." << f.max;
      return Status::InvalidArgument(os.str());
    }
    FLATKV_RETURN_IF_ERROR(Cited(t, where, f.key, &p));
    p.*f.field = *v * f.unit;
  }
  if (const toml::table* tp = t["tp"].as_table()) {
    for (const auto& [k, v] : *tp) {
      const std::string key(k.str());
      if (key.ends_with("_source")) continue;
      auto n = v.value<int64_t>();
      if (!n || *n < 1 || *n > int64_t{p.gpus} || p.gpus % *n != 0)
        return Status::InvalidArgument(where + ".tp." + key + ": must be an integer dividing gpus = " + std::to_string(p.gpus));
      auto s = (*tp)[key + "_source"].value<std::string>();
      if (!s || s->empty())
        return Status::InvalidArgument(where + ".tp." + key + ": no citation (add " + key + "_source = \"...\")");
      p.tp[key] = static_cast<uint32_t>(*n);
      p.sources["tp." + key] = *s;
    }
  }
  for (const auto& [k, v] : t) {
    if (!known.count(std::string(k.str())))
      return Status::InvalidArgument(where + ": unknown key '" + std::string(k.str()) + "'");
  }
  return p;
}

}  // namespace

Result<std::vector<HwProfile>> LoadHwProfiles(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::NotFound("hardware profiles: cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  toml::table root;
  try {
    root = toml::parse(ss.str(), path);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << path << ":" << e.source().begin.line << ": " << e.description();
    return Status::InvalidArgument(os.str());
  }
  std::vector<HwProfile> out;
  for (const auto& [k, v] : root) {
    const toml::table* t = v.as_table();
    if (!t) return Status::InvalidArgument(path + ": '" + std::string(k.str()) + "' is not a [profile] table");
    auto p = ParseProfile(std::string(k.str()), *t, path);
    if (!p.ok()) return p.status();
    out.push_back(std::move(p).value());
  }
  if (out.empty()) return Status::InvalidArgument(path + ": no profiles");
  return out;
}

Result<HwProfile> FindHwProfile(const std::string& path, std::string_view name) {
  auto all = LoadHwProfiles(path);
  if (!all.ok()) return all.status();
  std::string known;
  for (HwProfile& p : all.value()) {
    if (p.name == name) return std::move(p);
    known += (known.empty() ? "" : ", ") + p.name;
  }
  return Status::InvalidArgument("unknown hardware profile '" + std::string(name) + "' in " + path + " (known: " + known + ")");
}

std::vector<std::pair<std::string_view, double>> HwFigures(const HwProfile& p) {
  std::vector<std::pair<std::string_view, double>> out;
  for (const Figure& f : kFigures) out.emplace_back(f.report_key, p.*f.field * f.report_scale);
  return out;
}

Result<uint32_t> TensorParallel(const HwProfile& hw, const ServingModel& m, double util, double reserve) {
  if (auto it = hw.tp.find(m.name); it != hw.tp.end()) return it->second;
  const double kv_one_context = double(m.max_context_tokens) * double(m.BytesPerToken());
  for (uint32_t tp = 1; tp <= hw.gpus; tp *= 2) {
    if (hw.gpus % tp != 0) break;
    const double free = double(tp) * (hw.hbm_bytes * util - reserve) - m.weight_bytes;
    if (free >= kv_one_context) return tp;
  }
  return Status::InvalidArgument("model " + m.name + " does not fit on " + hw.name + "'s " + std::to_string(hw.gpus) +
                                 " GPUs with room for one " + std::to_string(m.max_context_tokens) + "-token context");
}

}  // namespace flatkv::replay
