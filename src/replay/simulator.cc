#include "replay/simulator.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <deque>
#include <numeric>
#include <queue>
#include <unordered_map>

namespace flatkv::replay {
namespace {

// Parameter counts and attention widths from the models' published configs.
// DeepSeek-V3: 37B parameters active per token, 671B read per decode step
// (FP8, 1 byte each, every expert touched by a large batch); attention width
// 128 heads x 160 (the mean of its 192-wide QK and 128-wide V heads).
struct ModelFigures {
  std::string_view name;
  double params, weight_bytes;
  double attn_dim;
};
constexpr ModelFigures kModels[] = {
    {"llama-3.1-8b", 8.03e9, 2 * 8.03e9, 32 * 128},
    {"llama-3.1-70b", 70.6e9, 2 * 70.6e9, 64 * 128},
    {"qwen3-32b", 32.8e9, 2 * 32.8e9, 64 * 128},
    {"deepseek-v3", 37e9, 671e9, 128 * 160},
};

uint64_t Mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x9E3779B97F4A7C15ull;
  return x ^ (x >> 29);
}

enum class Ev : uint8_t { kArrive, kPrefillDone, kDone };
struct Event {
  double t;
  uint64_t seq;
  Ev type;
  uint32_t instance;
  size_t req;
  uint32_t hit;
  bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
};

}  // namespace

std::vector<std::string> ServingModelNames() {
  std::vector<std::string> v;
  for (const auto& m : kModels) v.emplace_back(m.name);
  return v;
}

Result<ServingModel> FindServingModel(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& m : kModels) {
    if (m.name != lower) continue;
    auto shape = FindShapePreset(m.name);
    if (!shape.ok()) return shape.status();
    ServingModel s;
    s.name = std::string(m.name);
    s.shape = shape.value();
    s.params = m.params;
    s.weight_bytes = m.weight_bytes;
    s.layers = s.shape.layers;
    s.attn_dim = m.attn_dim;
    return s;
  }
  std::string known;
  for (const auto& n : ServingModelNames()) known += (known.empty() ? "" : ", ") + n;
  return Status::InvalidArgument("unknown model preset '" + std::string(name) + "' (known: " + known + ")");
}

double PrefillFlops(const ServingModel& m, uint64_t hit_tokens, uint64_t input_tokens) {
  if (input_tokens <= hit_tokens) return 0.0;
  const double h = double(hit_tokens), n = double(input_tokens);
  return 2.0 * m.params * (n - h) + 2.0 * double(m.layers) * m.attn_dim * (n * n - h * h);
}

double DecodeSecondsPerToken(const ServingModel& m, const SimOptions& o) {
  return m.weight_bytes / (o.hbm_tbps * 1e12) / std::max(1.0, o.decode_batch);
}

double SimResult::ttft_mean_ms() const {
  if (ttft_s.empty()) return 0.0;
  return std::accumulate(ttft_s.begin(), ttft_s.end(), 0.0) / double(ttft_s.size()) * 1e3;
}

double SimResult::ttft_percentile_ms(double p) const {
  if (ttft_s.empty()) return 0.0;
  std::vector<double> v = ttft_s;
  // Nearest rank: the smallest value with at least p% of values at or below it.
  const double rank = std::ceil(p / 100.0 * double(v.size())) - 1.0;
  const size_t k = static_cast<size_t>(std::clamp(rank, 0.0, double(v.size() - 1)));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), v.end());
  return v[k] * 1e3;
}

Result<SimResult> Simulate(const Trace& trace, CachePolicy& policy, const SimOptions& o) {
  if (trace.block_tokens == 0) return Status::InvalidArgument("simulate: trace '" + trace.name + "' has no block size");
  if (o.instances == 0) return Status::InvalidArgument("simulate: instances must be >= 1");
  if (!(o.load > 0)) return Status::InvalidArgument("simulate: load must be > 0, got " + std::to_string(o.load));
  if (!(o.gpu_tflops > 0) || !(o.hbm_tbps > 0))
    return Status::InvalidArgument("simulate: gpu_tflops and hbm_tbps must be > 0");
  const size_t n = o.max_requests ? std::min<size_t>(o.max_requests, trace.requests.size()) : trace.requests.size();
  SimResult res;
  res.policy = std::string(policy.name());
  res.load = o.load;
  res.requests = n;
  res.ttft_s.assign(n, 0.0);
  const double decode_s = DecodeSecondsPerToken(o.model, o);
  const double flops_per_s = o.gpu_tflops * 1e12;

  // Instance of each request: its root conversation's.
  std::unordered_map<uint64_t, uint64_t> root;
  std::vector<uint32_t> instance_of(n);
  for (size_t i = 0; i < n; ++i) {
    const Request& r = trace.requests[i];
    uint64_t rt = r.conversation;
    if (r.parent != 0) {
      auto it = root.find(r.parent);
      rt = it != root.end() ? it->second : r.parent;
    }
    root.emplace(r.conversation, rt);
    instance_of[i] = static_cast<uint32_t>(Mix(rt) % o.instances);
  }

  std::priority_queue<Event, std::vector<Event>, std::greater<>> events;
  uint64_t seq = 0;
  for (size_t i = 0; i < n; ++i)
    events.push({trace.requests[i].arrival_s / o.load, seq++, Ev::kArrive, instance_of[i], i, 0});
  std::vector<std::deque<size_t>> queues(o.instances);
  std::vector<bool> busy(o.instances, false);
  const double first = n ? trace.requests[0].arrival_s / o.load : 0.0;
  double last = first;
  uint64_t started = 0;

  auto try_start = [&](uint32_t inst, double t) {
    if (busy[inst] || queues[inst].empty()) return;
    const size_t i = queues[inst].front();
    queues[inst].pop_front();
    busy[inst] = true;
    const Request& r = trace.requests[i];
    const LookupResult lk = policy.Lookup(r, t);
    const uint32_t hit = std::min<uint32_t>(lk.hit_blocks, static_cast<uint32_t>(r.blocks.size()));
    const double modelled = o.io_model.RestoreSeconds(lk);
    const double restore =
        o.io == IoMode::kReal && lk.real_restore_s >= 0 ? lk.real_restore_s * o.real_time_scale : modelled;
    const uint64_t hit_tokens = std::min<uint64_t>(uint64_t{hit} * trace.block_tokens, r.input_tokens);
    const double prefill = PrefillFlops(o.model, hit_tokens, r.input_tokens) / flops_per_s;
    const double arrival = r.arrival_s / o.load;
    res.ttft_s[i] = (t - arrival) + restore + prefill;
    res.queue_s += t - arrival;
    res.restore_s += restore;
    res.model_restore_s += modelled;
    if (lk.real_restore_s >= 0) res.real_restore_s += lk.real_restore_s;
    res.prefill_s += prefill;
    res.input_tokens += r.input_tokens;
    res.hit_tokens += hit_tokens;
    res.output_tokens += r.output_tokens;
    res.lookup_blocks += r.blocks.size();
    res.hit_blocks += hit;
    res.dram_hit_blocks += lk.dram_blocks;
    res.ssd_hit_blocks += lk.ssd_blocks;
    res.aborted_blocks += lk.aborted_blocks;
    res.dram_bytes_read += lk.dram_bytes_read;
    res.ssd_bytes_read += lk.ssd_bytes_read;
    res.ssd_bytes_useful += lk.ssd_bytes_useful;
    events.push({t + restore + prefill, seq++, Ev::kPrefillDone, inst, i, hit});
    if (o.progress && (++started % 64 == 0 || started == n)) o.progress(started, n);
  };

  while (!events.empty()) {
    const Event e = events.top();
    events.pop();
    switch (e.type) {
      case Ev::kArrive:
        queues[e.instance].push_back(e.req);
        try_start(e.instance, e.t);
        break;
      case Ev::kPrefillDone: {
        const Request& r = trace.requests[e.req];
        const InsertResult w = policy.Insert(r, e.hit, e.t);
        res.dram_bytes_written += w.dram_bytes_written;
        res.ssd_bytes_written += w.ssd_bytes_written;
        events.push({e.t + double(r.output_tokens) * decode_s, seq++, Ev::kDone, e.instance, e.req, 0});
        break;
      }
      case Ev::kDone:
        last = std::max(last, e.t);
        busy[e.instance] = false;
        try_start(e.instance, e.t);
        break;
    }
  }
  res.makespan_s = last - first;
  const PolicyStats ps = policy.Stats();
  res.evicted_blocks = ps.evicted_blocks;
  res.migrated_blocks = ps.migrated_blocks;
  return res;
}

}  // namespace flatkv::replay
