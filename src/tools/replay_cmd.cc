#include "tools/replay_cmd.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "replay/flat_policy.h"
#include "replay/io_model.h"
#include "replay/policy.h"
#include "replay/report.h"
#include "replay/simulator.h"
#include "replay/trace.h"
#include "replay/workload_multiturn.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

using namespace flatkv::replay;

int Fail(int code, const std::string& msg) {
  std::fprintf(stderr, "flatkv replay: %s\n", msg.c_str());
  return code;
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// Keeps the requests of the first `n` root conversations (by first arrival),
// sub-agents included.
Trace FirstConversations(const Trace& t, uint64_t n) {
  Trace out;
  out.name = t.name;
  out.block_tokens = t.block_tokens;
  std::unordered_map<uint64_t, uint64_t> root;
  std::unordered_set<uint64_t> kept;
  for (const Request& r : t.requests) {
    uint64_t rt = r.conversation;
    if (r.parent) {
      auto it = root.find(r.parent);
      rt = it != root.end() ? it->second : r.parent;
    }
    root.emplace(r.conversation, rt);
    if (!kept.count(rt)) {
      if (kept.size() >= n) continue;
      kept.insert(rt);
    }
    out.requests.push_back(r);
  }
  std::unordered_set<uint64_t> convs;
  for (const Request& r : out.requests) convs.insert(r.conversation);
  out.conversations = convs.size();
  return out;
}

std::string Human(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f %s", bytes, units[u]);
  return buf;
}

}  // namespace

bool ParseSize(const std::string& text, uint64_t* bytes, std::string* error) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (...) {
    *error = "'" + text + "' is not a size (expected e.g. 64GiB, 512MiB, 2TB, 4096)";
    return false;
  }
  std::string unit = text.substr(pos);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},          {"b", 1},         {"k", 1024.0},    {"kib", 1024.0},          {"kb", 1e3},
      {"m", 1048576.0}, {"mib", 1048576.0}, {"mb", 1e6},    {"g", 1073741824.0},      {"gib", 1073741824.0},
      {"gb", 1e9},      {"t", 1099511627776.0}, {"tib", 1099511627776.0}, {"tb", 1e12}};
  for (const auto& [name, mult] : kUnits) {
    if (unit != name) continue;
    if (!(v >= 0) || !std::isfinite(v * mult) || v * mult > 1.8e19) {
      *error = "'" + text + "' is out of range";
      return false;
    }
    *bytes = static_cast<uint64_t>(v * mult);
    return true;
  }
  *error = "'" + text + "': unknown unit '" + unit + "' (expected B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)";
  return false;
}

CLI::App* AddReplayCommand(CLI::App& app, ReplayArgs& a) {
  CLI::App* c = app.add_subcommand(
      "replay", "Replay real traces through every cache policy (flat, tiered, files, infinite, belady) on a serving model");
  auto* trace_opt =
      c->add_option("--trace", a.traces, "Trace files or directories (Claude Code, Mooncake or generic; format auto)")
          ->expected(1, -1);
  // --workload: a generated trace instead of --trace (replay/workload_multiturn.h).
  c->add_option("--workload", a.workload,
                "Synthetic trace instead of --trace: multiturn:clients=N,rounds=N,turn_tokens=N,output_tokens=N,"
                "request_rate=R,seed=N (docs/format_trace.md)")
      ->excludes(trace_opt);
  c->add_option("--policy", a.policies, "Policies, comma separated (default flat,tiered,files,infinite,belady)");
  c->add_option("--dram", a.dram, "DRAM capacity for KV, e.g. 64GiB (default 64GiB)");
  c->add_option("--ssd", a.ssd, "SSD capacity, e.g. 2TiB (default 2TiB)");
  c->add_option("--model", a.model, "Model preset: llama-3.1-8b, llama-3.1-70b, qwen3-32b, deepseek-v3 (default llama-3.1-70b)");
  c->add_option("--load", a.loads, "Load factors, comma separated: arrivals are sped up by each (default 0.5,1,2,4)");
  c->add_option("--io", a.io, "model: costs from bandwidth/latency figures; real: every write and restore on real stores (default model)")
      ->check(CLI::IsMember({"model", "real"}));
  c->add_flag("--json", a.json, "Print JSON instead of the table");
  c->add_option("--plot", a.plot_dir, "Write hit_rate.svg and ttft_mean.svg into this directory");
  c->add_option("--instances", a.instances, "Serving instances (default 8)")->check(CLI::Range(1u, 1u << 16));
  c->add_option("--gpu-tflops", a.gpu_tflops, "Effective prefill rate per instance, TFLOP/s (default 400)")
      ->check(CLI::PositiveNumber);
  c->add_option("--hbm-tbps", a.hbm_tbps, "HBM bandwidth per instance, TB/s (default 3.35)")->check(CLI::PositiveNumber);
  c->add_option("--decode-batch", a.decode_batch, "Requests sharing a decode step (default 32)")->check(CLI::Range(1.0, 1e6));
  c->add_option("--pcie-gbps", a.pcie_gbps, "Host-to-GPU bandwidth, GB/s (default 25)")->check(CLI::PositiveNumber);
  c->add_option("--dram-gbps", a.dram_gbps, "Host memcpy bandwidth, GB/s (default 11)")->check(CLI::PositiveNumber);
  c->add_option("--ssd-gbps", a.ssd_gbps, "SSD read bandwidth, GB/s (default 2)")->check(CLI::PositiveNumber);
  c->add_option("--ssd-latency-us", a.ssd_latency_us, "SSD per-request latency, us (default 60)")->check(CLI::NonNegativeNumber);
  c->add_option("--ssd-parallel", a.ssd_parallel, "SSD requests in flight (default 4)")->check(CLI::Range(1.0, 4096.0));
  c->add_flag("--calibrate", a.calibrate, "Measure the DRAM and SSD figures on a real store first (in --dir)");
  c->add_option("--scale", a.scale, "--io real: divide every byte size by this (default 64)")->check(CLI::Range(1.0, 1e9));
  c->add_option("--stagger", a.stagger_s, "Seconds between the starts of successive trace files (default 60)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--conversations", a.conversations, "Replay only the first N conversations (default all)");
  c->add_option("--max-requests", a.max_requests, "Replay only the first N requests (default all)");
  c->add_option("--dir", a.dir, "Existing directory for scratch stores (default /var/tmp)")->check(CLI::ExistingDirectory);
  return c;
}

int RunReplay(const ReplayArgs& a) {
  uint64_t dram = 0, ssd = 0;
  std::string err;
  if (!ParseSize(a.dram, &dram, &err)) return Fail(kExitUsage, "--dram: " + err);
  if (!ParseSize(a.ssd, &ssd, &err)) return Fail(kExitUsage, "--ssd: " + err);
  if (dram == 0 && ssd == 0) return Fail(kExitUsage, "--dram and --ssd are both 0");
  auto model = FindServingModel(a.model);
  if (!model.ok()) return Fail(kExitUsage, "--model: " + model.status().message());
  std::vector<double> loads;
  for (const std::string& s : SplitList(a.loads)) {
    size_t pos = 0;
    double v = 0;
    try {
      v = std::stod(s, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos != s.size() || !(v > 0) || !std::isfinite(v)) return Fail(kExitUsage, "--load: '" + s + "' is not a positive number");
    loads.push_back(v);
  }
  if (loads.empty()) return Fail(kExitUsage, "--load: no load factors given");
  const std::vector<std::string> policies = SplitList(a.policies);
  if (policies.empty()) return Fail(kExitUsage, "--policy: no policies given");
  for (const std::string& p : policies)
    if (p != "flat" && p != "tiered" && p != "files" && p != "infinite" && p != "belady")
      return Fail(kExitUsage, "--policy: unknown policy '" + p + "' (known: flat, tiered, files, infinite, belady)");
  const std::string parent = a.dir.empty() ? "/var/tmp" : a.dir;

  // --workload stands in for --trace; exactly one of them is given.
  if (a.traces.empty() == a.workload.empty()) return Fail(kExitUsage, "give one of --trace and --workload");
  auto trace_or = a.workload.empty() ? ReadTraces(a.traces, a.stagger_s) : MakeWorkload(a.workload);
  if (!trace_or.ok()) {
    return Fail(kExitUsage, (a.workload.empty() ? "--trace: " : "--workload: ") + trace_or.status().ToString());
  }
  Trace trace = std::move(trace_or).value();
  if (a.conversations) trace = FirstConversations(trace, a.conversations);
  if (a.max_requests && trace.requests.size() > a.max_requests) trace.requests.resize(a.max_requests);
  if (trace.requests.empty()) return Fail(kExitUsage, "--trace: no requests to replay");

  const uint64_t block_bytes = model.value().BytesPerToken() * trace.block_tokens;
  std::unordered_set<uint64_t> unique;
  uint64_t accesses = 0;
  for (const Request& r : trace.requests) {
    accesses += r.blocks.size();
    unique.insert(r.blocks.begin(), r.blocks.end());
  }
  const double working_set = double(unique.size()) * double(block_bytes);

  std::error_code ec;
  const std::string scratch = parent + "/flatkv-replay-" + std::to_string(::getpid());
  std::filesystem::create_directories(scratch, ec);
  if (ec) return Fail(kExitFailure, "cannot create " + scratch + ": " + ec.message());
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code e;
      std::filesystem::remove_all(dir, e);
    }
  } cleanup{scratch};

  IoModel io;
  io.pcie_gbps = a.pcie_gbps;
  io.dram_copy_gbps = a.dram_gbps;
  io.ssd_read_gbps = a.ssd_gbps;
  io.ssd_write_gbps = a.ssd_gbps;
  io.ssd_request_us = a.ssd_latency_us;
  io.ssd_parallel = a.ssd_parallel;
  if (a.calibrate) {
    auto cal = CalibrateIoModel(scratch + "/calibrate", io);
    if (!cal.ok()) return Fail(kExitFailure, "--calibrate: " + cal.status().ToString());
    io = cal.value();
  }
  const IoMode mode = a.io == "real" ? IoMode::kReal : IoMode::kModel;
  if (mode == IoMode::kReal) io.gpu_destination = false;  // measured restores land in host memory

  nlohmann::json config = {
      {"traces", a.traces},          {"trace_name", trace.name},
      {"requests", trace.requests.size()},  {"conversations", trace.conversations},
      {"block_tokens", trace.block_tokens}, {"block_accesses", accesses},
      {"unique_blocks", unique.size()},     {"working_set_bytes", working_set},
      {"model", model.value().name},        {"bytes_per_token", model.value().BytesPerToken()},
      {"block_bytes", block_bytes},         {"dram_bytes", dram},
      {"ssd_bytes", ssd},                   {"instances", a.instances},
      {"gpu_tflops", a.gpu_tflops},         {"hbm_tbps", a.hbm_tbps},
      {"decode_batch", a.decode_batch},     {"io", a.io},
      {"scale", a.scale},                   {"stagger_s", a.stagger_s},
      {"io_model", {{"pcie_gbps", io.pcie_gbps}, {"dram_copy_gbps", io.dram_copy_gbps},
                    {"ssd_read_gbps", io.ssd_read_gbps}, {"ssd_request_us", io.ssd_request_us},
                    {"ssd_parallel", io.ssd_parallel}, {"gpu_destination", io.gpu_destination}}}};
  if (!a.json) {
    std::printf("replay: %s: %zu requests, %llu conversations, %llu block accesses, %zu unique blocks\n",
                trace.name.c_str(), trace.requests.size(), static_cast<unsigned long long>(trace.conversations),
                static_cast<unsigned long long>(accesses), unique.size());
    std::printf("model %s: %s per block of %u tokens; working set %s; DRAM %s (%.0f%% of it), SSD %s (%.0f%%)\n",
                model.value().name.c_str(), Human(double(block_bytes)).c_str(), trace.block_tokens,
                Human(working_set).c_str(), Human(double(dram)).c_str(), 100.0 * double(dram) / working_set,
                Human(double(ssd)).c_str(), 100.0 * double(ssd) / working_set);
    SimOptions so;
    so.hbm_tbps = a.hbm_tbps;
    so.decode_batch = a.decode_batch;
    std::printf("%u instances, %.0f TFLOP/s prefill, decode %.2f ms/token; io %s: %s\n\n", a.instances, a.gpu_tflops,
                1e3 * DecodeSecondsPerToken(model.value(), so), a.io.c_str(), io.ToString().c_str());
    std::fflush(stdout);
  }

  std::vector<SimResult> results;
  for (const std::string& name : policies) {
    for (double load : loads) {
      PolicyConfig pc;
      pc.block_bytes = block_bytes;
      pc.block_tokens = trace.block_tokens;
      pc.dram_bytes = dram;
      pc.ssd_bytes = ssd;
      pc.trace = &trace;
      pc.io = mode;
      pc.dir = scratch + "/" + name;
      pc.scale = a.scale;
      std::filesystem::create_directories(pc.dir, ec);
      auto policy = MakePolicy(name, pc);
      if (!policy.ok()) {
        const int code = policy.status().code() == Code::kInvalidArgument ? kExitUsage : kExitFailure;
        return Fail(code, "--policy " + name + ": " + policy.status().ToString());
      }
      SimOptions so;
      so.model = model.value();
      so.instances = a.instances;
      so.load = load;
      so.gpu_tflops = a.gpu_tflops;
      so.hbm_tbps = a.hbm_tbps;
      so.decode_batch = a.decode_batch;
      so.io = mode;
      so.real_time_scale = a.scale;  // a store 1/scale the size takes about 1/scale the time
      so.io_model = io;
      ProgressBar bar(name + " load " + std::to_string(load).substr(0, 4));
      so.progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
      auto r = Simulate(trace, *policy.value(), so);
      bar.Finish();
      policy.value().reset();
      std::filesystem::remove_all(pc.dir, ec);
      if (!r.ok()) return Fail(kExitFailure, name + " at load " + std::to_string(load) + ": " + r.status().ToString());
      results.push_back(std::move(r).value());
    }
  }
  if (a.json) {
    std::printf("%s\n", ToJson(results, config).dump(2).c_str());
  } else {
    std::printf("%s", FormatTable(results).c_str());
  }
  if (!a.plot_dir.empty()) {
    const Status s = WritePlots(results, a.plot_dir);
    if (!s.ok()) return Fail(kExitFailure, s.ToString());
    if (!a.json) std::printf("plots: %s/hit_rate.svg, %s/ttft_mean.svg\n", a.plot_dir.c_str(), a.plot_dir.c_str());
  }
  return kExitOk;
}

}  // namespace flatkv::tools
