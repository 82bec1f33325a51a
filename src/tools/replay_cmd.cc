#include "tools/replay_cmd.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "flatkv/options.h"
#include "replay/flat_policy.h"
#include "replay/hw_profile.h"
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
  const std::vector<uint64_t> root_of = RootConversations(t);
  std::unordered_set<uint64_t> kept;
  for (size_t i = 0; i < t.requests.size(); ++i) {
    const Request& r = t.requests[i];
    const uint64_t rt = root_of[i];
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

// Order `seed` of a trace: seed 0 is the trace as recorded; otherwise the
// root conversations (sub-agents with their parent) keep their own timing
// but trade start times, a permutation drawn from `seed`.
Trace PermuteConversations(const Trace& t, uint64_t seed) {
  if (seed == 0) return t;
  const std::vector<uint64_t> root_of = RootConversations(t);
  std::unordered_map<uint64_t, double> start;
  std::vector<uint64_t> roots;
  for (size_t i = 0; i < t.requests.size(); ++i)
    if (start.emplace(root_of[i], t.requests[i].arrival_s).second) roots.push_back(root_of[i]);
  std::vector<double> starts;
  for (uint64_t rt : roots) starts.push_back(start[rt]);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  for (size_t i = starts.size(); i > 1; --i) std::swap(starts[i - 1], starts[rng() % i]);
  std::unordered_map<uint64_t, double> shift;
  for (size_t k = 0; k < roots.size(); ++k) shift[roots[k]] = starts[k] - start[roots[k]];
  Trace out = t;
  for (size_t i = 0; i < out.requests.size(); ++i) out.requests[i].arrival_s += shift[root_of[i]];
  std::stable_sort(out.requests.begin(), out.requests.end(),
                   [](const Request& a, const Request& b) { return a.arrival_s < b.arrival_s; });
  const double first = out.requests.empty() ? 0.0 : out.requests.front().arrival_s;
  for (Request& r : out.requests) r.arrival_s -= first;
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
      "replay", "Replay real traces through every cache policy (flat, tiered, files, infinite, belady) on a serving node");
  auto* trace_opt =
      c->add_option("--trace", a.traces, "Trace files or directories (Claude Code, Mooncake or generic; format auto)")
          ->expected(1, -1);
  // --workload: a generated trace instead of --trace (replay/workload_multiturn.h).
  c->add_option("--workload", a.workload,
                "Synthetic trace instead of --trace: multiturn:clients=N,rounds=N,turn_tokens=N,output_tokens=N,"
                "request_rate=R,distribution=poisson|uniform,barrier=0|1,seed=N,block_tokens=N (docs/format_trace.md)")
      ->excludes(trace_opt);
  c->add_option("--policy", a.policies, "Policies, comma separated (default flat,tiered,files,infinite,belady; also flat-hints: flat with Retain and Prefetch as an agent-aware engine would call them)");
  c->add_option("--dram", a.dram, "Host DRAM for KV on the node, e.g. 64GiB (default 64GiB)");
  c->add_option("--ssd", a.ssd, "SSD capacity for KV on the node, e.g. 2TiB (default 2TiB)");
  c->add_option("--model", a.model, "Model preset: llama-3.1-8b, llama-3.1-70b, qwen3-32b, deepseek-v3, smollm2-135m (default llama-3.1-70b)");
  c->add_option("--hw", a.hw, "Node profile (data/hw/profiles.toml): h100-node, h200-node, vm, ... (default h100-node)");
  c->add_option("--hw-file", a.hw_file, "A profiles file of your own (TOML, every figure cited)")->check(CLI::ExistingFile);
  c->add_option("--tp", a.tp, "Tensor-parallel degree (default: the profile's for the model, or the smallest that fits)")
      ->check(CLI::Range(1u, 64u));
  c->add_option("--load", a.loads,
                "auto: find the capacity load and replay at 0.5x, 1x and 2x of it; or load factors, comma separated "
                "(arrivals sped up by each). Default auto");
  c->add_option("--orders", a.orders, "Conversation orders per point, for the spread (default 3)")->check(CLI::Range(1u, 64u));
  c->add_option("--capacity-orders", a.capacity_orders,
                "Conversation orders at 1x the capacity load (--load auto or --capacity-load; default --orders)")
      ->check(CLI::Range(1u, 64u));
  c->add_option("--capacity-load", a.capacity_load,
                "The capacity load, as found before: replay at 0.5x, 1x and 2x of it without the search")
      ->check(CLI::PositiveNumber);
  c->add_option("--jobs", a.jobs, "Replays run at once, one thread each (default 1)")->check(CLI::Range(1u, 64u));
  c->add_option("--json-out", a.json_out, "Also write the JSON to this file (the table still prints)");
  c->add_option("--capacity-only", a.capacity_only,
                "Policies (of --policy) replayed only at 1x the capacity load, comma separated");
  c->add_option("--copy-threads", a.copy_threads,
                "What if: flat's DRAM copy threads as charged (default the store's dram_threads, 2)")
      ->check(CLI::Range(1u, 256u));
  c->add_option("--io", a.io, "model: costs from the node's figures; real: every write and restore on real stores (default model)")
      ->check(CLI::IsMember({"model", "real"}));
  c->add_flag("--json", a.json, "Print JSON instead of the table (stdout is the JSON alone)");
  c->add_option("--plot", a.plot_dir, "Write hit_rate.svg and ttft_mean.svg into this directory");
  c->add_flag("--calibrate", a.calibrate, "Measure this machine's DRAM and SSD figures on a real store first (in --dir) and use them as the node's storage");
  c->add_flag("--calibrate-serving", a.calibrate_serving,
              "Recompute the published serving figure the model is calibrated against (docs/baselines.md) and exit");
  c->add_option("--scale", a.scale, "--io real: divide every byte size by this (default 64)")->check(CLI::Range(1.0, 1e9));
  c->add_option("--stagger", a.stagger_s, "Seconds between the starts of successive trace files (default 60)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--conversations", a.conversations, "Replay only the first N conversations (default all)");
  c->add_option("--max-requests", a.max_requests, "Replay only the first N requests (default all)");
  c->add_option("--dir", a.dir, "Existing directory for scratch stores (default /var/tmp)")->check(CLI::ExistingDirectory);
  c->add_option("--nodes", a.nodes,
                "Nodes of the profile, each with its own --dram and --ssd, sharing a remote tier over the profile's "
                "remote_gbps (default 1)")
      ->check(CLI::Range(1u, 1024u));
  c->add_option("--routing", a.routing, "Requests to instances: affinity (by conversation) or round-robin (default affinity)")
      ->check(CLI::IsMember({"affinity", "round-robin"}));
  c->add_option("--remote", a.remote,
                "Per node: its cap on the shared remote tier, e.g. 256GiB; 0 for none (default: --dram with --nodes > 1, "
                "none with one node)");
  c->add_option("--remote-buffer", a.remote_buffer,
                "Per node: the publish buffer for the remote tier; of a put that does not fit, the rest is not published "
                "(default: the store's, max(256MiB, --dram / 16))");
  return c;
}

namespace {

struct Setup {
  Trace trace;
  ServingModel model;
  HwProfile hw;
  uint32_t tp = 0;
  IoModel io;
  IoMode mode = IoMode::kModel;
  uint64_t dram = 0, ssd = 0, block_bytes = 0;
  uint32_t nodes = 1;
  SimOptions::Routing routing = SimOptions::Routing::kAffinity;
  uint64_t remote = 0, remote_buffer = 0;
  std::string scratch;
  double scale = 64;
  uint32_t copy_threads = 0;
};

// One replay of `trace` (one order) through policy `name` at `load`; its
// scratch directory is named after the policy and `tag` (runs at once have
// their own).
Result<SimResult> RunOne(const Setup& st, const Trace& trace, const std::string& name, double load, bool quiet,
                         const std::string& tag = "") {
  PolicyConfig pc;
  pc.block_bytes = st.block_bytes;
  pc.block_tokens = trace.block_tokens;
  pc.dram_bytes = st.dram;
  pc.ssd_bytes = st.ssd;
  pc.trace = &trace;
  pc.io = st.mode;
  pc.dir = st.scratch + "/" + name + tag;
  pc.scale = st.scale;
  pc.instances = st.hw.gpus / st.tp;
  pc.io_model = &st.io;
  pc.layers = st.model.layers;
  pc.dram_copy_threads = st.copy_threads;
  std::error_code ec;
  std::vector<std::unique_ptr<CachePolicy>> nodes;  // one policy, with its own DRAM and SSD, a node
  std::vector<CachePolicy*> raw;
  const std::string dir = pc.dir;
  for (uint32_t k = 0; k < st.nodes; ++k) {
    if (st.nodes > 1) pc.dir = dir + "/node" + std::to_string(k);
    std::filesystem::create_directories(pc.dir, ec);
    auto policy = MakePolicy(name, pc);
    if (!policy.ok()) return policy.status().WithContext("--policy " + name);
    nodes.push_back(std::move(policy).value());
    raw.push_back(nodes.back().get());
  }
  SimOptions so;
  so.nodes = st.nodes;
  so.routing = st.routing;
  so.remote_bytes = st.remote;
  so.remote_buffer_bytes = st.remote_buffer;
  so.model = st.model;
  so.hw = st.hw;
  so.tp = st.tp;
  so.load = load;
  so.io = st.mode;
  so.real_time_scale = st.scale;  // a store 1/scale the size takes about 1/scale the time
  so.io_model = st.io;
  ProgressBar bar(name + " load " + std::to_string(load).substr(0, 5));
  if (!quiet) so.progress = [&bar](uint64_t done, uint64_t total) { bar.Update(done, total); };
  auto r = Simulate(trace, std::span<CachePolicy* const>(raw), so);
  bar.Finish();
  nodes.clear();
  std::filesystem::remove_all(dir, ec);
  return r;
}

// The capacity load: the highest at which infinite's p99 TTFT stays within
// 3x of its p99 at a tenth of that load. Doubling to bracket it, then
// bisection to 10%. `runs` keeps every replay of infinite it made (the
// trace as recorded, by load), so the replays at the loads it probed are
// not run again.
Result<double> CapacityLoad(const Setup& st, std::vector<std::string>* log, std::map<double, SimResult>* runs) {
  auto at = [&](double load) -> Result<double> {
    auto it = runs->find(load);
    if (it == runs->end()) {
      auto r = RunOne(st, st.trace, "infinite", load, true);
      if (!r.ok()) return r.status();
      it = runs->emplace(load, std::move(r).value()).first;
    }
    return it->second.ttft_percentile_ms(99);
  };
  auto ok = [&](double load) -> Result<bool> {
    auto hi = at(load);
    if (!hi.ok()) return hi.status();
    auto lo = at(load / 10);
    if (!lo.ok()) return lo.status();
    char line[160];
    std::snprintf(line, sizeof line, "load %.4g: infinite p99 TTFT %.0f ms (%.0f ms at %.4g)", load, hi.value(),
                  lo.value(), load / 10);
    log->push_back(line);
    return hi.value() <= 3 * lo.value();
  };
  double good = 0, bad = 0;
  auto first = ok(1.0);
  if (!first.ok()) return first.status();
  if (first.value()) {
    good = 1;
    for (bad = 2; bad < 1e6; bad *= 2) {
      auto v = ok(bad);
      if (!v.ok()) return v.status();
      if (!v.value()) break;
      good = bad;
    }
  } else {
    bad = 1;
    for (good = 0.5; good > 1e-6; good /= 2) {
      auto v = ok(good);
      if (!v.ok()) return v.status();
      if (v.value()) break;
      bad = good;
    }
  }
  while (bad / good > 1.1) {
    const double mid = std::sqrt(good * bad);
    auto v = ok(mid);
    if (!v.ok()) return v.status();
    (v.value() ? good : bad) = mid;
  }
  return good;
}

}  // namespace

namespace {

std::string DefaultHwFile() { return std::string(FLATKV_SOURCE_DIR) + "/data/hw/profiles.toml"; }

// vLLM CI's latency_llama70B_tp4 (docs/baselines.md): batch 8, 32 tokens in,
// 128 out, TP 4; published mean latencies per GPU type.
int CalibrateServing(const ReplayArgs& a) {
  const std::string file = a.hw_file.empty() ? DefaultHwFile() : a.hw_file;
  auto model = FindServingModel("llama-3.1-70b");
  if (!model.ok()) return Fail(kExitFailure, model.status().ToString());
  struct Published {
    const char* hw;
    double seconds;
    const char* source;
  };
  const Published figures[] = {
      {"h100-node", 2.44447, "vLLM CI latency_llama70B_tp4 8xH100, buildkite vllm/performance-benchmark build 9555 (fit: step_overhead_ms)"},
      {"h200-node", 2.07508, "vLLM CI latency_llama70B_tp4 H200, buildkite vllm/performance-benchmark build 9513 (check)"},
  };
  nlohmann::json out = nlohmann::json::array();
  bool all_ok = true;
  for (const Published& p : figures) {
    auto hw = FindHwProfile(file, p.hw);
    if (!hw.ok()) return Fail(kExitUsage, "--hw-file: " + hw.status().message());
    auto s = LatencyBenchmarkSeconds(model.value(), hw.value(), 4, 8, 32, 128);
    if (!s.ok()) return Fail(kExitFailure, s.status().ToString());
    const double err = s.value() / p.seconds - 1;
    all_ok = all_ok && std::abs(err) <= 0.25;
    out.push_back({{"hw", p.hw}, {"model", "llama-3.1-70b"}, {"tp", 4}, {"batch", 8}, {"input_tokens", 32},
                   {"output_tokens", 128}, {"published_s", p.seconds}, {"simulated_s", s.value()}, {"error", err},
                   {"source", p.source}});
    if (!a.json)
      std::printf("%-10s llama-3.1-70b TP4, batch 8, 32 in / 128 out: simulated %.3f s, published %.3f s (%+.1f%%)\n  %s\n",
                  p.hw, s.value(), p.seconds, 100 * err, p.source);
  }
  if (a.json) std::printf("%s\n", out.dump(2).c_str());
  return all_ok ? kExitOk : kExitFailure;
}

std::vector<double> ParseLoads(const std::string& text, std::string* err) {
  std::vector<double> loads;
  for (const std::string& s : SplitList(text)) {
    size_t pos = 0;
    double v = 0;
    try {
      v = std::stod(s, &pos);
    } catch (...) {
      pos = 0;
    }
    if (pos != s.size() || !(v > 0) || !std::isfinite(v)) {
      *err = "'" + s + "' is not a positive number (or use --load auto)";
      return {};
    }
    loads.push_back(v);
  }
  if (loads.empty()) *err = "no load factors given";
  return loads;
}

}  // namespace

int RunReplay(const ReplayArgs& a) {
  if (a.calibrate_serving) return CalibrateServing(a);
  uint64_t dram = 0, ssd = 0;
  std::string err;
  if (!ParseSize(a.dram, &dram, &err)) return Fail(kExitUsage, "--dram: " + err);
  if (!ParseSize(a.ssd, &ssd, &err)) return Fail(kExitUsage, "--ssd: " + err);
  if (dram == 0 && ssd == 0) return Fail(kExitUsage, "--dram and --ssd are both 0");
  auto model = FindServingModel(a.model);
  if (!model.ok()) return Fail(kExitUsage, "--model: " + model.status().message());
  const bool auto_load = a.loads == "auto";
  std::vector<double> loads;
  if (!auto_load) {
    loads = ParseLoads(a.loads, &err);
    if (loads.empty()) return Fail(kExitUsage, "--load: " + err);
  }
  const std::vector<std::string> policies = SplitList(a.policies);
  if (policies.empty()) return Fail(kExitUsage, "--policy: no policies given");
  for (const std::string& p : policies)
    if (std::find(PolicyNames().begin(), PolicyNames().end(), p) == PolicyNames().end())
      return Fail(kExitUsage, "--policy: unknown policy '" + p + "' (known: " + PolicyNameList() + ")");
  const std::string hw_file = a.hw_file.empty() ? DefaultHwFile() : a.hw_file;
  auto hw = FindHwProfile(hw_file, a.hw);
  if (!hw.ok()) return Fail(kExitUsage, "--hw: " + hw.status().message());
  const std::string parent = a.dir.empty() ? "/var/tmp" : a.dir;

  // --workload stands in for --trace; exactly one of them is given.
  if (a.traces.empty() == a.workload.empty()) return Fail(kExitUsage, "give one of --trace and --workload");
  auto trace_or = a.workload.empty() ? ReadTraces(a.traces, a.stagger_s) : MakeWorkload(a.workload);
  if (!trace_or.ok()) {
    return Fail(kExitUsage, (a.workload.empty() ? "--trace: " : "--workload: ") + trace_or.status().ToString());
  }
  Setup st;
  st.trace = std::move(trace_or).value();
  Trace& trace = st.trace;
  if (a.conversations) trace = FirstConversations(trace, a.conversations);
  if (a.max_requests && trace.requests.size() > a.max_requests) trace.requests.resize(a.max_requests);
  if (trace.requests.empty()) return Fail(kExitUsage, "--trace: no requests to replay");
  st.model = model.value();
  st.hw = hw.value();
  st.dram = dram;
  st.ssd = ssd;
  st.scale = a.scale;
  st.copy_threads = a.copy_threads;
  st.mode = a.io == "real" ? IoMode::kReal : IoMode::kModel;
  st.nodes = a.nodes;
  st.routing = a.routing == "round-robin" ? SimOptions::Routing::kRoundRobin : SimOptions::Routing::kAffinity;
  if (!a.remote.empty()) {
    if (!ParseSize(a.remote, &st.remote, &err)) return Fail(kExitUsage, "--remote: " + err);
  } else if (a.nodes > 1) {
    st.remote = dram;
  }
  if (a.remote_buffer.empty()) {
    st.remote_buffer = std::max<uint64_t>(256ull << 20, dram / 16);  // RemoteOptions::publish_buffer_bytes's rule
  } else if (!ParseSize(a.remote_buffer, &st.remote_buffer, &err)) {
    return Fail(kExitUsage, "--remote-buffer: " + err);
  }
  if (st.remote > 0 && st.mode == IoMode::kReal)
    return Fail(kExitUsage, "--remote (a shared tier, the default with --nodes > 1) is modelled: use it with --io model");
  if (st.remote > 0 && (!(st.hw.remote_gbps > 0) || !(st.hw.remote_rtt_us > 0)))
    return Fail(kExitUsage, "--hw " + st.hw.name + ": the profile has no remote_gbps and remote_rtt_us for the shared tier");
  SimOptions defaults;
  if (a.tp) {
    if (st.hw.gpus % a.tp != 0)
      return Fail(kExitUsage, "--tp " + std::to_string(a.tp) + " does not divide " + st.hw.name + "'s " +
                                  std::to_string(st.hw.gpus) + " GPUs");
    st.tp = a.tp;
  } else {
    auto tp = TensorParallel(st.hw, st.model, defaults.gpu_memory_utilization, defaults.activation_reserve_bytes);
    if (!tp.ok()) return Fail(kExitUsage, "--hw " + st.hw.name + ": " + tp.status().message());
    st.tp = tp.value();
  }
  st.block_bytes = st.model.BytesPerToken() * trace.block_tokens;
  std::unordered_set<uint64_t> unique;
  uint64_t accesses = 0;
  for (const Request& r : trace.requests) {
    accesses += r.blocks.size();
    unique.insert(r.blocks.begin(), r.blocks.end());
  }
  const double working_set = double(unique.size()) * double(st.block_bytes);

  std::error_code ec;
  st.scratch = parent + "/flatkv-replay-" + std::to_string(::getpid());
  std::filesystem::create_directories(st.scratch, ec);
  if (ec) return Fail(kExitFailure, "cannot create " + st.scratch + ": " + ec.message());
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code e;
      std::filesystem::remove_all(dir, e);
    }
  } cleanup{st.scratch};

  if (a.calibrate) {
    IoModel base;
    base.gpu_destination = false;
    auto cal = CalibrateIoModel(st.scratch + "/calibrate", base);
    if (!cal.ok()) return Fail(kExitFailure, "--calibrate: " + cal.status().ToString());
    const IoModel& c = cal.value();
    const std::string src = "measured by flatkv replay --calibrate on this machine";
    // The store's DRAM restores ran on its copy threads: one core's share.
    st.hw.memcpy_core_gbps = c.dram_copy_gbps / double(std::max<uint32_t>(1, StoreOptions{}.dram_threads));
    st.hw.sources["memcpy_core_gbps"] = src + " (the store's DRAM restore rate / its dram_threads)";
    st.hw.nvme_drives = 1;
    st.hw.nvme_read_gbps = st.hw.nvme_write_gbps = c.ssd_read_gbps;
    st.hw.nvme_latency_us = c.ssd_request_us;
    st.hw.nvme_read_iops = c.ssd_parallel / (c.ssd_request_us * 1e-6);
    st.hw.dram_gbps = c.dram_copy_gbps;
    for (const char* k : {"nvme_drives", "nvme_read_gbps", "nvme_write_gbps", "nvme_latency_us", "nvme_read_iops", "dram_gbps"})
      st.hw.sources[k] = src;
  } else if (st.hw.measured_storage && !a.json) {
    std::fprintf(stderr, "flatkv replay: profile %s: storage figures as recorded; --calibrate measures them anew\n",
                 st.hw.name.c_str());
  }
  st.io = NodeIoModel(st.hw, st.tp);
  if (st.mode == IoMode::kReal) st.io.gpu_destination = false;  // measured restores land in host memory
  const uint32_t instances = st.hw.gpus / st.tp;
  SimOptions probe;
  probe.hw = st.hw;
  const double kv_per_instance = KvHbmBytes(st.model, probe, st.tp);

  std::vector<std::string> search_log;
  std::map<double, SimResult> searched;  // infinite on order 0, by load: the search's replays
  double capacity = 0;
  if (a.capacity_load > 0) {
    if (!auto_load) return Fail(kExitUsage, "--capacity-load replaces the search of --load auto; give no --load");
    capacity = a.capacity_load;
    search_log.push_back("given: --capacity-load " + std::to_string(capacity));
    loads = {0.5 * capacity, capacity, 2 * capacity};
  } else if (auto_load) {
    auto c = CapacityLoad(st, &search_log, &searched);
    if (!c.ok()) return Fail(kExitFailure, "--load auto: " + c.status().ToString());
    capacity = c.value();
    loads = {0.5 * capacity, capacity, 2 * capacity};
  }
  const uint32_t capacity_orders = a.capacity_orders ? a.capacity_orders : a.orders;

  nlohmann::json sources = nlohmann::json::object();
  for (const auto& [k, v] : st.hw.sources) sources[k] = v;
  nlohmann::json hwj = {{"name", st.hw.name}, {"description", st.hw.description}, {"file", hw_file},
                        {"gpus", st.hw.gpus},     {"nvme_drives", st.hw.nvme_drives},   {"sources", sources}};
  for (const auto& [key, value] : HwFigures(st.hw)) hwj[std::string(key)] = value;
  nlohmann::json modelj = {{"name", st.model.name},
                           {"bytes_per_token", st.model.BytesPerToken()},
                           {"params_active", st.model.params},
                           {"weight_bytes", st.model.weight_bytes},
                           {"tp", st.tp},
                           {"instances", instances},
                           {"kv_hbm_bytes_per_instance", kv_per_instance}};
  nlohmann::json config = {
      {"traces", a.traces},          {"trace_name", trace.name},
      {"requests", trace.requests.size()},  {"conversations", trace.conversations},
      {"block_tokens", trace.block_tokens}, {"block_accesses", accesses},
      {"unique_blocks", unique.size()},     {"working_set_bytes", working_set},
      {"model", st.model.name},             {"bytes_per_token", st.model.BytesPerToken()},
      {"block_bytes", st.block_bytes},      {"dram_bytes", dram},
      {"ssd_bytes", ssd},                   {"instances", instances},
      {"tp", st.tp},                        {"io", a.io},
      {"scale", a.scale},                   {"stagger_s", a.stagger_s},
      {"orders", a.orders},                 {"load_auto", auto_load},
      {"capacity_orders", capacity_orders},
      {"copy_threads", a.copy_threads},
      {"nodes", st.nodes},                  {"routing", a.routing},
      {"remote_bytes_per_node", st.remote}, {"remote_buffer_bytes_per_node", st.remote_buffer},
      {"capacity_load", capacity},          {"capacity_search", search_log},
      {"max_num_batched_tokens", defaults.max_num_batched_tokens},
      {"max_num_seqs", defaults.max_num_seqs},
      {"gpu_memory_utilization", defaults.gpu_memory_utilization},
      {"io_model", {{"pcie_gbps", st.io.pcie_gbps}, {"dram_copy_gbps", st.io.dram_copy_gbps},
                    {"ssd_read_gbps", st.io.ssd_read_gbps}, {"ssd_request_us", st.io.ssd_request_us},
                    {"ssd_parallel", st.io.ssd_parallel}, {"gpu_destination", st.io.gpu_destination}}}};
  if (!a.json) {
    std::printf("replay: %s: %zu requests, %llu conversations, %llu block accesses, %zu unique blocks\n",
                trace.name.c_str(), trace.requests.size(), static_cast<unsigned long long>(trace.conversations),
                static_cast<unsigned long long>(accesses), unique.size());
    std::printf("model %s: %s per block of %u tokens; working set %s; DRAM %s (%.0f%% of it), SSD %s (%.0f%%)\n",
                st.model.name.c_str(), Human(double(st.block_bytes)).c_str(), trace.block_tokens,
                Human(working_set).c_str(), Human(double(dram)).c_str(), 100.0 * double(dram) / working_set,
                Human(double(ssd)).c_str(), 100.0 * double(ssd) / working_set);
    std::printf("hw %s: %u instances of TP %u, %s of HBM for KV each; %u NVMe x %.1f GB/s; io %s: %s\n",
                st.hw.name.c_str(), instances, st.tp, Human(kv_per_instance).c_str(), st.hw.nvme_drives,
                st.hw.nvme_read_gbps, a.io.c_str(), st.io.ToString().c_str());
    for (const std::string& l : search_log) std::printf("  capacity search: %s\n", l.c_str());
    if (auto_load) std::printf("capacity load %.4g: replaying at 0.5x, 1x and 2x of it\n", capacity);
    if (st.nodes > 1 || st.remote > 0)
      std::printf("%u nodes, routing %s; shared tier: %s per node (publish buffer %s), %.1f GB/s and %.0f us a round trip "
                  "per node\n",
                  st.nodes, a.routing.c_str(), st.remote ? Human(double(st.remote)).c_str() : "none",
                  Human(double(st.remote_buffer)).c_str(), st.hw.remote_gbps, st.hw.remote_rtt_us);
    if (capacity > 0 && capacity_orders != a.orders)
      std::printf("%u conversation orders at 1x, %u at the other loads\n\n", capacity_orders, a.orders);
    else
      std::printf("%u conversation orders per point\n\n", a.orders);
    std::fflush(stdout);
  }

  std::vector<Trace> orders;
  const uint32_t max_orders = std::max(a.orders, capacity_orders);
  for (uint32_t k = 0; k < max_orders; ++k) orders.push_back(PermuteConversations(trace, k));
  // Every (policy, load, order) replay, run a.jobs at a time; merged per
  // (policy, load) in order.
  struct Task {
    size_t point;  // (policy, load) index
    uint32_t order;
  };
  std::vector<Task> tasks;
  std::vector<std::pair<std::string, double>> points;
  const std::vector<std::string> only_at_capacity = SplitList(a.capacity_only);
  for (const std::string& name : policies)
    for (double load : loads) {
      const bool only = std::find(only_at_capacity.begin(), only_at_capacity.end(), name) != only_at_capacity.end();
      if (only && capacity > 0 && load != capacity) continue;
      points.emplace_back(name, load);
      const uint32_t n = capacity > 0 && load == capacity ? capacity_orders : a.orders;
      for (uint32_t k = 0; k < n; ++k) tasks.push_back({points.size() - 1, k});
    }
  std::vector<std::vector<Result<SimResult>>> runs(points.size());
  for (const Task& t : tasks) runs[t.point].emplace_back(Status::Aborted("not run"));
  std::vector<size_t> slot(tasks.size());
  {
    std::vector<uint32_t> filled(points.size(), 0);
    for (size_t k = 0; k < tasks.size(); ++k) slot[k] = filled[tasks[k].point]++;
  }
  std::mutex mu;
  size_t next_task = 0;
  const bool quiet = a.json || a.jobs > 1;
  auto worker = [&] {
    while (true) {
      size_t k;
      {
        std::lock_guard<std::mutex> l(mu);
        if (next_task == tasks.size()) return;
        k = next_task++;
      }
      const auto& [name, load] = points[tasks[k].point];
      const Trace& t = orders[tasks[k].order];
      Result<SimResult> r = Status::Aborted("not run");
      // Order 0 is st.trace itself: the search already replayed infinite on it at the loads it probed.
      if (auto it = searched.find(load); name == "infinite" && tasks[k].order == 0 && it != searched.end()) {
        r = it->second;
      } else {
        r = RunOne(st, t, name, load, quiet, "-" + std::to_string(k));
      }
      std::lock_guard<std::mutex> l(mu);
      runs[tasks[k].point][slot[k]] = std::move(r);
    }
  };
  std::vector<std::thread> pool;
  for (uint32_t j = 1; j < std::min<uint32_t>(a.jobs, uint32_t(tasks.size())); ++j) pool.emplace_back(worker);
  worker();
  for (std::thread& th : pool) th.join();
  std::vector<SimResult> results;
  for (size_t p = 0; p < points.size(); ++p) {
    std::vector<SimResult> merged;
    for (Result<SimResult>& r : runs[p]) {
      if (!r.ok()) {
        const int code = r.status().code() == Code::kInvalidArgument ? kExitUsage : kExitFailure;
        return Fail(code, points[p].first + " at load " + std::to_string(points[p].second) + ": " + r.status().ToString());
      }
      merged.push_back(std::move(r).value());
    }
    results.push_back(MergeRuns(merged));
  }
  PairRatios(&results);
  AddTieredBest(&results);
  if (!a.json_out.empty()) {
    nlohmann::json j = ToJson(results, config);
    j["hw"] = hwj;
    j["model"] = modelj;
    j["capacity_load"] = capacity;
    std::ofstream f(a.json_out, std::ios::trunc);
    f << j.dump(2) << "\n";
    if (!f) return Fail(kExitFailure, "--json-out: cannot write " + a.json_out);
  }
  if (a.json) {
    nlohmann::json j = ToJson(results, config);
    j["hw"] = hwj;
    j["model"] = modelj;
    j["capacity_load"] = capacity;
    std::printf("%s\n", j.dump(2).c_str());
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
