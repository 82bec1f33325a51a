#include "replay/simulator.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <deque>
#include <limits>
#include <numeric>
#include <queue>
#include <unordered_map>

#include "replay/node_io.h"
#include "replay/shared_tier.h"

namespace flatkv::replay {
namespace {

// Parameter counts, attention widths and context lengths from the models'
// published configs (Hugging Face config.json: max_position_embeddings).
// Dense models at BF16 (2 bytes a weight). DeepSeek-V3: 37B parameters
// active per token, 671B in all at FP8 (1 byte each); its routed experts are
// 58 MoE layers x 256 experts x 3 x 7168 x 2048 weights (hidden 7168,
// moe_intermediate_size 2048), 8 routed per token; attention width 128
// heads x 160 (the mean of its 192-wide QK and 128-wide V heads).
struct ModelFigures {
  std::string_view name;
  double params, weight_bytes, expert_bytes;
  uint32_t experts, experts_per_token;
  double attn_dim;
  uint64_t max_context;
};
constexpr ModelFigures kModels[] = {
    {"llama-3.1-8b", 8.03e9, 2 * 8.03e9, 0, 0, 0, 32 * 128, 131072},
    {"llama-3.1-70b", 70.6e9, 2 * 70.6e9, 0, 0, 0, 64 * 128, 131072},
    {"qwen3-32b", 32.8e9, 2 * 32.8e9, 0, 0, 0, 64 * 128, 40960},
    {"deepseek-v3", 37e9, 671e9, 58.0 * 256 * 3 * 7168 * 2048, 256, 8, 128 * 160, 163840},
    // SmolLM2-135M (134.5M parameters, 9 query heads x 64, context 8192): the
    // engine's real model; its KV preset is the engine's fp32.
    {"smollm2-135m", 134.5e6, 2 * 134.5e6, 0, 0, 0, 9 * 64, 8192},
};

uint64_t Mix(uint64_t x) {
  x ^= x >> 31;
  x *= 0x9E3779B97F4A7C15ull;
  return x ^ (x >> 29);
}

constexpr double kNever = std::numeric_limits<double>::infinity();

// A request's state on its instance.
struct Seq {
  uint64_t prompt = 0;     // tokens to compute before its next token (input; + output so far after a preemption)
  uint64_t computed = 0;   // tokens whose KV is in HBM
  uint64_t reserved = 0;   // KV tokens of HBM it holds
  uint32_t generated = 0;  // output tokens produced
  uint32_t hit = 0;        // blocks the lookup found (local and remote)
  uint32_t local_hit = 0;  // of those, in the node's own store
  int64_t flow = -1;       // its load (layer-wise: the part that streams), while one runs
  int64_t stage = -1;      // a layer-wise load's whole SSD objects, read into host memory first
  int64_t flow2 = -1;      // then their layers across to the GPU
  int64_t prefetch = -1;   // its arrival's prefetch (CachePolicy::Arrive), while it runs
  bool after_prefetch = false;  // admitted during that prefetch: its load starts when it ends
  std::vector<std::pair<uint32_t, double>> load_demand;  // that load, and its latency
  std::vector<std::pair<uint32_t, double>> stage_demand, flow2_demand;
  bool has_load = false;   // load_demand is a flow to start (it may move nothing: a remote ask)
  double load_latency_s = 0, stage_latency_s = 0, admitted_s = 0;
  uint32_t waits = 0;      // gates left before it is ready: flow's first layer (or all), flow2's
  bool flow_gate = false, flow2_gate = false;
  bool ready = false;      // may be scheduled (load done, or its first layer arrived)
  bool resumed = false;    // preempted: recomputes, no second lookup
  bool first = false;      // first token produced
  double ready_s = 0;
};

struct Instance {
  std::deque<size_t> waiting;   // not admitted, arrival order (preempted ones in front)
  std::vector<size_t> running;  // admitted (loading or ready), admission order
  double free_kv = 0;           // KV tokens of HBM not reserved
  bool busy = false;
  double step_end = 0;
  std::vector<std::pair<size_t, uint64_t>> plan;  // the step in flight: request, tokens
  // The step's layer-wise loads still landing (flow ids on its node): it
  // ends no earlier than the last one's last layer plus a layer of the
  // step, re-planned whenever the shares change.
  std::vector<uint32_t> deps;
  double step_start = 0, step_compute = 0;
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
    s.expert_bytes = m.expert_bytes;
    s.experts = m.experts;
    s.experts_per_token = m.experts_per_token;
    s.layers = s.shape.layers;
    s.attn_dim = m.attn_dim;
    s.max_context_tokens = m.max_context;
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

double StepSeconds(const ServingModel& m, const HwProfile& hw, uint32_t tp, uint64_t tokens, double attn_ctx,
                   double kv_bytes) {
  if (tokens == 0) return 0.0;
  double weights = m.weight_bytes;
  if (m.experts > 0 && m.expert_bytes > 0) {
    const double miss = std::pow(1.0 - double(m.experts_per_token) / double(m.experts), double(tokens));
    weights = m.weight_bytes - m.expert_bytes * miss;  // experts no token of the step routes to stay unread
  }
  const double flops = 2.0 * m.params * double(tokens) + 4.0 * double(m.layers) * m.attn_dim * attn_ctx;
  const double compute = flops / (double(tp) * hw.tflops * 1e12 * hw.mfu);
  const double memory = (weights + kv_bytes) / (double(tp) * hw.hbm_tbps * 1e12 * hw.hbm_efficiency);
  return std::max(compute, memory) + hw.step_overhead_s;
}

IoModel NodeIoModel(const HwProfile& hw, uint32_t tp) {
  IoModel m;
  m.pcie_gbps = double(tp) * hw.pcie_gbps;
  m.dram_copy_gbps = hw.dram_gbps;
  m.ssd_read_gbps = double(hw.nvme_drives) * hw.nvme_read_gbps;
  m.ssd_request_us = hw.nvme_latency_us;
  m.ssd_parallel = double(hw.nvme_drives);
  m.gpu_destination = true;
  return m;
}

double KvHbmBytes(const ServingModel& m, const SimOptions& o, uint32_t tp) {
  return double(tp) * (o.hw.hbm_bytes * o.gpu_memory_utilization - o.activation_reserve_bytes) - m.weight_bytes;
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
  CachePolicy* const one[] = {&policy};
  return Simulate(trace, std::span<CachePolicy* const>(one), o);
}

Result<SimResult> Simulate(const Trace& trace, std::span<CachePolicy* const> policies, const SimOptions& o) {
  const uint32_t nodes = o.nodes;
  if (nodes == 0 || policies.size() != nodes)
    return Status::InvalidArgument("simulate: " + std::to_string(policies.size()) + " policies for " +
                                   std::to_string(nodes) + " nodes (one each)");
  for (CachePolicy* p : policies)
    if (p == nullptr) return Status::InvalidArgument("simulate: a node has no policy");
  CachePolicy& policy = *policies[0];  // the name, layerwise and serial reads: every node's the same
  const bool shared = o.remote_bytes > 0;
  if (trace.block_tokens == 0) return Status::InvalidArgument("simulate: trace '" + trace.name + "' has no block size");
  if (!(o.load > 0)) return Status::InvalidArgument("simulate: load must be > 0, got " + std::to_string(o.load));
  const HwProfile& hw = o.hw;
  if (hw.gpus == 0 || !(hw.tflops > 0) || !(hw.mfu > 0) || !(hw.hbm_tbps > 0) || !(hw.hbm_efficiency > 0) ||
      !(hw.pcie_gbps > 0) || !(hw.dram_gbps > 0) || hw.nvme_drives == 0 || !(hw.nvme_read_gbps > 0) ||
      !(hw.nvme_write_gbps > 0) || !(hw.nvme_read_iops > 0))
    return Status::InvalidArgument("simulate: hardware profile '" + hw.name + "' lacks GPU, PCIe, DRAM or NVMe figures");
  if (shared && o.io == IoMode::kReal)
    return Status::InvalidArgument("simulate: the shared tier is modelled; replay it with IoMode::kModel");
  if (shared && (!(hw.remote_gbps > 0) || !(hw.remote_rtt_us > 0)))
    return Status::InvalidArgument("simulate: hardware profile '" + hw.name +
                                   "' has no remote_gbps and remote_rtt_us for a shared tier");
  if (o.max_num_batched_tokens == 0 || o.max_num_seqs == 0)
    return Status::InvalidArgument("simulate: max_num_batched_tokens and max_num_seqs must be >= 1");
  uint32_t tp = o.tp;
  if (tp == 0) {
    auto t = TensorParallel(hw, o.model, o.gpu_memory_utilization, o.activation_reserve_bytes);
    if (!t.ok()) return t.status();
    tp = t.value();
  }
  if (tp > hw.gpus) return Status::InvalidArgument("simulate: tp " + std::to_string(tp) + " exceeds " + hw.name + "'s GPUs");
  const uint32_t per_node = hw.gpus / tp;
  const uint32_t instances = per_node * nodes;  // global instance g: node g % nodes, its instance g / nodes there
  auto node_of = [nodes](uint32_t g) { return g % nodes; };
  auto local_of = [nodes](uint32_t g) { return g / nodes; };
  const double kv_bytes = KvHbmBytes(o.model, o, tp);
  const double bpt = double(o.model.BytesPerToken());
  if (!(bpt > 0)) return Status::InvalidArgument("simulate: model '" + o.model.name + "' has no KV bytes per token");
  const double kv_tokens = std::floor(kv_bytes / bpt);
  if (kv_tokens < double(trace.block_tokens))
    return Status::InvalidArgument("simulate: " + o.model.name + " at tp " + std::to_string(tp) + " leaves no HBM for KV on " + hw.name);

  const size_t n = o.max_requests ? std::min<size_t>(o.max_requests, trace.requests.size()) : trace.requests.size();
  SimResult res;
  res.policy = std::string(policy.name());
  res.layerwise = policy.layerwise();
  res.dram_copy_threads = policy.dram_copy_threads();
  res.dram_copy_gbps = double(res.dram_copy_threads) * hw.memcpy_core_gbps;
  res.load = o.load;
  res.requests = n;
  res.ttft_s.assign(n, 0.0);
  res.instances = instances;
  res.nodes = nodes;
  res.routing = o.routing == SimOptions::Routing::kRoundRobin ? "round-robin" : "affinity";
  res.tp = tp;
  res.kv_hbm_bytes = kv_bytes;
  const uint64_t bb = uint64_t(bpt) * trace.block_tokens;
  const bool layerwise = policy.layerwise();
  const bool ssd_layerwise = layerwise && policy.ssd_layerwise();
  const bool serial = policy.serial_ssd_reads();
  const uint32_t copy_threads = policy.dram_copy_threads();
  const bool hidden_loads = layerwise && policy.hidden_loads();
  if (copy_threads > 0 && !(hw.memcpy_core_gbps > 0))
    return Status::InvalidArgument("simulate: policy " + std::string(policy.name()) + " copies DRAM hits with " +
                                   std::to_string(copy_threads) + " threads; profile '" + hw.name +
                                   "' has no memcpy_core_gbps");
  const double copy_bps = double(copy_threads) * hw.memcpy_core_gbps * 1e9;
  const double layer_sync_s = hw.layer_sync_us * 1e-6;
  const double layers = std::max<uint32_t>(1, o.model.layers);
  const double ssd_read_bps = double(hw.nvme_drives) * hw.nvme_read_gbps * 1e9;
  const double ssd_write_bps = double(hw.nvme_drives) * hw.nvme_write_gbps * 1e9;
  const double ssd_iops = double(hw.nvme_drives) * hw.nvme_read_iops;
  const double dram_bps = hw.dram_gbps * 1e9;
  const double link_bps = double(tp) * hw.pcie_gbps * 1e9;
  const double remote_bps = hw.remote_gbps * 1e9;
  const double remote_rtt_s = hw.remote_rtt_us * 1e-6;
  SharedTier tier(nodes, shared ? std::max<uint64_t>(1, o.remote_bytes / bb) : 0);
  const uint64_t buffer_blocks =
      o.remote_buffer_bytes ? std::max<uint64_t>(1, o.remote_buffer_bytes / bb) : std::numeric_limits<uint64_t>::max();
  std::vector<uint64_t> publishing(nodes, 0);  // blocks in a node's publish buffer

  // Arrival order (a trace of several files is sorted; keep it robust).
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return trace.requests[a].arrival_s < trace.requests[b].arrival_s; });
  // Instance of each request: its root conversation's, or the next in turn.
  const std::vector<uint64_t> roots = RootConversations(trace);
  std::vector<uint32_t> instance_of(n);
  for (size_t k = 0; k < n; ++k) {
    const size_t i = order[k];
    instance_of[i] = static_cast<uint32_t>(o.routing == SimOptions::Routing::kRoundRobin ? k % instances
                                                                                         : Mix(roots[i]) % instances);
  }
  auto arrival = [&](size_t i) { return trace.requests[i].arrival_s / o.load; };

  std::vector<Seq> seqs(n);
  std::vector<Instance> inst(instances);
  for (Instance& in : inst) in.free_kv = kv_tokens;
  std::vector<NodeIo> ios(nodes, NodeIo(per_node));
  // Per node: flow id -> request whose load it is (-1: an offload or a
  // publish; -2 - i: request i's prefetch), and when it counts from; which
  // part of the load it is.
  std::vector<std::vector<int64_t>> flow_seq(nodes);
  std::vector<std::vector<double>> flow_start(nodes);
  enum Part : uint8_t { kMain, kStage, kSecond };
  std::vector<std::vector<uint8_t>> flow_part(nodes);
  struct Publishing {
    std::vector<uint64_t> keys;  // claimed: written, visible when it lands
    size_t queued = 0;           // blocks it holds of the publish buffer
  };
  std::vector<std::unordered_map<uint32_t, Publishing>> publishes(nodes);  // flow id -> its blocks
  auto track = [&](uint32_t node, uint32_t id, int64_t req, double t, Part part = kMain) {
    if (flow_seq[node].size() <= id) {
      flow_seq[node].resize(id + 1, -1);
      flow_start[node].resize(id + 1, 0);
      flow_part[node].resize(id + 1, kMain);
    }
    flow_seq[node][id] = req;
    flow_start[node][id] = t;
    flow_part[node][id] = part;
  };
  const double first = n ? arrival(order[0]) : 0.0;
  double last = first;
  uint64_t admitted = 0;

  auto output_of = [&](size_t i) { return std::max<uint32_t>(1, trace.requests[i].output_tokens); };

  // Preempts running[k] of `in` (recompute: its KV is freed, it re-queues
  // in front).
  auto preempt = [&](Instance& in, size_t k) {
    const size_t v = in.running[k];
    Seq& s = seqs[v];
    in.free_kv += double(s.reserved);
    s.reserved = 0;
    s.computed = 0;
    s.prompt = trace.requests[v].input_tokens + s.generated;
    s.ready = false;
    s.resumed = true;
    in.running.erase(in.running.begin() + static_cast<std::ptrdiff_t>(k));
    in.waiting.push_front(v);
    ++res.preemptions;
  };
  // Preempts the latest admitted ready request after running[after] (those
  // before it are already in the step); false when there is none (a load
  // in flight keeps its HBM).
  auto preempt_last = [&](Instance& in, size_t after) {
    for (size_t k = in.running.size(); k-- > after + 1;) {
      if (!seqs[in.running[k]].ready) continue;
      preempt(in, k);
      return true;
    }
    return false;
  };

  // Starts request i's load (Seq::load_demand, and a layer-wise load's
  // whole SSD objects, Seq::stage_demand) at `now`; restore_s counts from
  // its admission.
  auto start_load = [&](size_t i, double now) {
    Seq& s = seqs[i];
    const uint32_t node = node_of(instance_of[i]);
    if (s.has_load) {
      const uint32_t f = ios[node].Start(now, std::move(s.load_demand), s.load_latency_s);
      track(node, f, int64_t(i), s.admitted_s);
      s.flow = f;
    }
    s.load_demand.clear();
    if (!s.stage_demand.empty()) {
      const uint32_t f = ios[node].Start(now, std::move(s.stage_demand), s.stage_latency_s);
      track(node, f, int64_t(i), s.admitted_s, kStage);
      s.stage = f;
    }
    s.stage_demand.clear();
  };
  auto open_gate = [&](Seq& s, bool* gate, double now) {
    if (!*gate) return;
    *gate = false;
    if (--s.waits == 0 && !s.ready) {
      s.ready = true;
      s.ready_s = now;
    }
  };
  // After admission (or its prefetch's end): waits for the first layer, or
  // the whole load (and a layer-wise load's whole SSD objects, then their
  // first layer), or is ready now.
  auto settle = [&](size_t i, double now) {
    Seq& s = seqs[i];
    NodeIo& io = ios[node_of(instance_of[i])];
    s.waits = 0;
    if (s.flow >= 0 && !io.done(uint32_t(s.flow))) {
      if (layerwise) io.NotifyAt(uint32_t(s.flow), 1.0 / layers);
      s.flow_gate = true;
      ++s.waits;
    } else {
      s.flow = -1;  // nothing to load, or done at once
    }
    if (s.stage >= 0) {
      s.flow2_gate = true;
      ++s.waits;
    }
    if (s.waits == 0) {
      s.ready = true;
      s.ready_s = now;
    }
  };
  // True when none of request i's load flows is still running.
  auto load_done = [&](const Seq& s, const NodeIo& io) {
    for (int64_t f : {s.flow, s.stage, s.flow2})
      if (f >= 0 && !io.done(uint32_t(f))) return false;
    return s.stage < 0 || s.flow2 >= 0;  // a stage's layers have started across
  };

  auto admit = [&](uint32_t id, Instance& in, size_t i, double now) {
    const Request& r = trace.requests[i];
    Seq& s = seqs[i];
    in.running.push_back(i);
    if (s.resumed) {
      s.ready = true;
      s.ready_s = now;
      return;
    }
    res.queue_s += now - arrival(i);
    s.prompt = std::max<uint64_t>(1, r.input_tokens);
    const uint32_t node = node_of(id), local = local_of(id);
    NodeIo& io = ios[node];
    const LookupResult lk = policies[node]->Lookup(r, local, now);
    const uint32_t local_hit = std::min<uint32_t>(lk.hit_blocks, static_cast<uint32_t>(r.blocks.size()));
    // The shared tier: how far the chain goes on from the local hit.
    const bool ask = shared && local_hit < r.blocks.size();
    const uint32_t remote = ask ? tier.Match(r.blocks, local_hit) : 0;
    const uint32_t hit = local_hit + remote;
    s.hit = hit;
    s.local_hit = local_hit;
    const uint64_t hit_tokens = std::min<uint64_t>(uint64_t{hit} * trace.block_tokens, r.input_tokens);
    res.local_hit_tokens += std::min<uint64_t>(uint64_t{local_hit} * trace.block_tokens, r.input_tokens);
    const double remote_bytes = double(remote) * double(bb);
    res.remote_hit_blocks += remote;
    res.remote_bytes_read += uint64_t(remote) * bb;
    s.computed = std::min<uint64_t>(hit_tokens, s.prompt - 1);  // the last prompt token is always computed
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
    res.model_restore_s += o.io_model.RestoreSeconds(lk);
    if (remote > 0) res.model_restore_s += remote_bytes / remote_bps + 2 * remote_rtt_s;
    if (lk.real_restore_s >= 0) res.real_restore_s += lk.real_restore_s;
    const double moved = double(lk.dram_bytes_read + lk.ssd_bytes_useful) + remote_bytes;
    s.admitted_s = now;
    if (o.io == IoMode::kReal && lk.real_restore_s >= 0 && hit > 0) {
      const uint32_t f = io.StartFixed(now, lk.real_restore_s * o.real_time_scale);
      track(node, f, int64_t(i), now);
      s.flow = f;
    } else if (moved > 0 || lk.ssd_bytes_read > 0 || ask) {
      const double ssd_s = double(lk.ssd_bytes_read) / ssd_read_bps + double(lk.ssd_requests) / ssd_iops;
      // DRAM hits copied by the store's threads into a host window, then
      // across the link (copy_threads > 0), or DMA'd from pinned memory.
      const double copy_s = copy_bps > 0 ? double(lk.dram_bytes_read) / copy_bps : 0.0;
      // Queued reads pay one latency; serial ones (one at a time per TP worker) pay each.
      const double rounds = serial ? std::ceil(double(lk.ssd_requests) / double(tp)) : (lk.ssd_requests > 0 ? 1.0 : 0.0);
      const double ssd_latency_s = rounds * hw.nvme_latency_us * 1e-6;
      s.has_load = true;
      if (layerwise && !ssd_layerwise && lk.ssd_bytes_read > 0 && o.io != IoMode::kReal) {
        // SSD objects hold every layer: read whole into host memory first,
        // then their layers cross beside the DRAM part, which streams now.
        const double streamed = double(lk.dram_bytes_read) + remote_bytes;
        s.stage_demand = {{NodeIo::kSsd, ssd_s}, {NodeIo::kDram, double(lk.ssd_bytes_useful) / dram_bps}};
        s.stage_latency_s = ssd_latency_s;
        s.flow2_demand = {{NodeIo::H2d(local), double(lk.ssd_bytes_useful) / link_bps}};
        s.load_demand = {{NodeIo::kDram, streamed / dram_bps},
                         {NodeIo::H2d(local), streamed / link_bps},
                         {NodeIo::kCopy, copy_s},
                         {NodeIo::kRemoteIn, remote_bytes / std::max(remote_bps, 1.0)}};
        s.has_load = streamed > 0 || ask;
        s.load_latency_s = 0;
      } else {
        s.load_demand = {{NodeIo::kSsd, ssd_s},
                         {NodeIo::kDram, moved / dram_bps},
                         {NodeIo::H2d(local), moved / link_bps},
                         {NodeIo::kCopy, copy_s},
                         {NodeIo::kRemoteIn, remote_bytes / std::max(remote_bps, 1.0)}};
        s.load_latency_s = ssd_latency_s;
      }
      // The ask is a round trip before anything moves; the tier's first
      // bytes come one more after it, beside the local reads.
      if (remote > 0) s.load_latency_s = std::max(s.load_latency_s, remote_rtt_s);
      if (ask) s.load_latency_s += remote_rtt_s;
      // What it restores from DRAM may be what its prefetch is still bringing in.
      s.after_prefetch = s.prefetch >= 0 && !io.done(uint32_t(s.prefetch));
      if (!s.after_prefetch) start_load(i, now);
    }
    if (!s.after_prefetch) settle(i, now);
    if (o.progress && (++admitted % 64 == 0 || admitted == n)) o.progress(admitted, n);
  };

  // Plans and starts a step on an idle instance; leaves it idle when it has nothing to run.
  auto schedule = [&](uint32_t id, double now) {
    Instance& in = inst[id];
    NodeIo& io = ios[node_of(id)];
    in.plan.clear();
    uint64_t budget = o.max_num_batched_tokens, tokens = 0;
    double attn_ctx = 0, kv_read = 0, stall = 0;
    auto add = [&](size_t i, uint64_t chunk) {
      Seq& s = seqs[i];
      in.plan.emplace_back(i, chunk);
      budget -= chunk;
      tokens += chunk;
      const double c0 = double(s.computed);
      attn_ctx += double(chunk) * (c0 + (double(chunk) - 1) / 2);
      kv_read += c0 * bpt;
    };
    for (size_t k = 0; k < in.running.size() && budget > 0; ++k) {
      const size_t i = in.running[k];
      Seq& s = seqs[i];
      if (!s.ready) continue;
      if (s.computed < s.prompt) {
        add(i, std::min<uint64_t>(s.prompt - s.computed, budget));
        continue;
      }
      // Decode: one more token of KV.
      if (double(s.reserved) < double(s.computed + 1)) {
        while (in.free_kv < 1 && preempt_last(in, k)) {
        }
        if (in.free_kv >= 1) {
          in.free_kv -= 1;
          s.reserved += 1;
        } else if (in.running.size() > 1) {
          preempt(in, k);  // only loads are left to make room for: it steps aside
          break;
        }
        // else it runs alone beyond HBM (a context longer than HBM holds): over-committed
      }
      add(i, 1);
    }
    while (!in.waiting.empty() && budget > 0 && in.running.size() < o.max_num_seqs) {
      const size_t i = in.waiting.front();
      Seq& s = seqs[i];
      const uint64_t prompt = s.resumed ? s.prompt : std::max<uint64_t>(1, trace.requests[i].input_tokens);
      const double need = std::min(double(prompt), kv_tokens);  // a prompt beyond HBM runs alone
      if (in.free_kv < need) break;
      in.waiting.pop_front();
      in.free_kv -= need;
      s.reserved = uint64_t(need);
      admit(id, in, i, now);
      if (s.ready && s.computed < s.prompt) add(i, std::min<uint64_t>(s.prompt - s.computed, budget));
    }
    if (in.plan.empty()) {
      in.busy = false;
      return;
    }
    double t = StepSeconds(o.model, hw, tp, tokens, attn_ctx, kv_read);
    in.deps.clear();
    for (const auto& [i, chunk] : in.plan) {
      const Seq& s = seqs[i];
      for (int64_t f : {s.flow, s.flow2})
        if (f >= 0 && !io.done(uint32_t(f))) in.deps.push_back(uint32_t(f));
    }
    // Waiting on a layer-wise load costs every layer its synchronisation.
    if (!in.deps.empty() && layerwise) t += layers * layer_sync_s;
    // The bound's loads never hold a step: their bytes cross the links
    // (and slow whoever shares them), their time hides under the compute.
    if (hidden_loads) in.deps.clear();
    for (uint32_t f : in.deps) stall = std::max(stall, io.RemainingSeconds(f) + t / layers);
    in.step_start = now;
    in.step_compute = t;
    t = std::max(t, stall);
    in.busy = true;
    in.step_end = now + t;
    res.busy_s += t;
    ++res.steps;
    res.step_tokens += tokens;
  };

  auto finish_step = [&](uint32_t id, double now) {
    Instance& in = inst[id];
    in.busy = false;
    for (const auto& [i, chunk] : in.plan) {
      Seq& s = seqs[i];
      const Request& r = trace.requests[i];
      const bool prefill = s.computed < s.prompt;
      s.computed += chunk;
      if (prefill && s.computed < s.prompt) continue;
      if (prefill && !s.first) {
        s.first = true;
        res.ttft_s[i] = now - arrival(i);
        res.prefill_s += now - s.ready_s;
        const uint32_t node = node_of(id);
        NodeIo& io = ios[node];
        // From the local hit on: what the shared tier restored is written back.
        const InsertResult w = policies[node]->Insert(r, local_of(id), s.local_hit, now);
        res.dram_bytes_written += w.dram_bytes_written;
        res.ssd_bytes_written += w.ssd_bytes_written;
        // The offload: the blocks put leave the GPU; what went to SSD is written there.
        const double out = double(r.blocks.size() > s.local_hit ? r.blocks.size() - s.local_hit : 0) * double(bb);
        const double host = double(w.dram_bytes_written + w.ssd_bytes_written);
        if (out > 0 || host > 0) {
          std::vector<std::pair<uint32_t, double>> d = {
              {NodeIo::D2h(local_of(id)), out / link_bps},
              {NodeIo::kDram, std::max(out, host) / dram_bps},
              {NodeIo::kSsd, double(w.ssd_bytes_written) / ssd_write_bps + double(w.ssd_requests) / ssd_iops}};
          track(node, io.Start(now, std::move(d), 0.0), -1, now);
        }
        if (shared && s.hit < r.blocks.size()) {
          // The put's blocks past those the tier just supplied (the node
          // knows they are there); of them the leading ones that fit the
          // publish buffer are queued (new or not: the publisher's skip is a
          // round trip of its own), the rest not published. Of those queued,
          // the ones nobody has published are written.
          const std::span<const uint64_t> put(r.blocks.data() + s.hit, r.blocks.size() - s.hit);
          const uint64_t room = buffer_blocks - std::min(buffer_blocks, publishing[node]);
          const size_t queued = static_cast<size_t>(std::min<uint64_t>(put.size(), room));
          res.remote_dropped_blocks += tier.CountNew(put.subspan(queued));
          if (queued > 0) {
            std::vector<uint64_t> keys = tier.Claim(put.first(queued));
            const double bytes = double(keys.size()) * double(bb);
            publishing[node] += queued;
            const uint32_t f = io.Start(now, {{NodeIo::kRemoteOut, bytes / remote_bps}, {NodeIo::kDram, bytes / dram_bps}},
                                        remote_rtt_s);
            track(node, f, -1, now);
            publishes[node].emplace(f, Publishing{std::move(keys), queued});
          }
        }
      }
      s.generated += 1;  // the step's sampled token
      if (s.generated >= output_of(i)) {
        in.free_kv += double(s.reserved);
        s.reserved = 0;
        in.running.erase(std::find(in.running.begin(), in.running.end(), i));
        last = std::max(last, now);
      }
    }
    in.plan.clear();
  };

  size_t next = 0;
  while (true) {
    double t = next < n ? arrival(order[next]) : kNever;
    for (const Instance& in : inst)
      if (in.busy) t = std::min(t, in.step_end);
    for (const NodeIo& io : ios) t = std::min(t, io.NextEvent());
    if (t == kNever) break;
    for (uint32_t node = 0; node < nodes; ++node) {
      NodeIo& io = ios[node];
      const std::vector<int64_t>& seq_of = flow_seq[node];
      io.Advance(t);
      for (uint32_t f : io.TakeNotified()) {
        if (f >= seq_of.size() || seq_of[f] < 0) continue;
        Seq& s = seqs[size_t(seq_of[f])];
        if (flow_part[node][f] == kMain) open_gate(s, &s.flow_gate, t);
        if (flow_part[node][f] == kSecond) open_gate(s, &s.flow2_gate, t);
      }
      for (uint32_t f : io.TakeCompleted()) {
        if (auto p = publishes[node].find(f); p != publishes[node].end()) {  // a publish landed
          res.remote_published_blocks += p->second.keys.size();
          res.remote_deleted_blocks += tier.Publish(node, p->second.keys);
          publishing[node] -= p->second.queued;
          publishes[node].erase(p);
          continue;
        }
        if (f < seq_of.size() && seq_of[f] <= -2) {  // a prefetch ended
          const size_t v = size_t(-2 - seq_of[f]);
          Seq& s = seqs[v];
          s.prefetch = -1;
          if (s.after_prefetch) {
            s.after_prefetch = false;
            start_load(v, t);
            settle(v, t);
          }
          continue;
        }
        if (f >= seq_of.size() || seq_of[f] < 0) continue;
        const size_t v = size_t(seq_of[f]);
        Seq& s = seqs[v];
        if (flow_part[node][f] == kStage) {  // its SSD objects are in host memory: their layers cross
          const uint32_t f2 = io.Start(t, std::move(s.flow2_demand), 0.0);
          s.flow2_demand.clear();
          track(node, f2, int64_t(v), flow_start[node][f], kSecond);
          s.flow2 = f2;
          io.NotifyAt(f2, 1.0 / layers);
          continue;
        }
        open_gate(s, flow_part[node][f] == kMain ? &s.flow_gate : &s.flow2_gate, t);
        if (load_done(s, io)) res.restore_s += t - flow_start[node][f];
      }
    }
    // Steps that wait on a layer-wise load: at the shares of now, they end
    // no earlier than its last layer lands plus a layer of the step.
    for (uint32_t id = 0; id < instances; ++id) {
      Instance& in = inst[id];
      if (!in.busy || in.deps.empty()) continue;
      const NodeIo& io = ios[node_of(id)];
      double rem = 0;
      for (uint32_t f : in.deps) rem = std::max(rem, io.RemainingSeconds(f));
      const double end = std::max(in.step_start + in.step_compute, t + rem + in.step_compute / layers);
      res.busy_s += end - in.step_end;
      in.step_end = end;
      std::erase_if(in.deps, [&](uint32_t f) { return io.done(f); });
    }
    while (next < n && arrival(order[next]) <= t) {
      const size_t i = order[next++];
      seqs[i].prompt = std::max<uint64_t>(1, trace.requests[i].input_tokens);
      Instance& in = inst[instance_of[i]];
      const uint32_t node = node_of(instance_of[i]);
      const uint32_t ahead = static_cast<uint32_t>(in.waiting.size());
      in.waiting.push_back(i);
      const ArriveResult ar = policies[node]->Arrive(trace.requests[i], local_of(instance_of[i]), t, ahead);
      res.prefetch_ssd_bytes += ar.ssd_bytes_read;
      if (ar.ssd_bytes_read > 0 || ar.dram_bytes_written > 0) {
        // In the background: the SSD array and host memory, not the GPU link.
        std::vector<std::pair<uint32_t, double>> d = {
            {NodeIo::kSsd, double(ar.ssd_bytes_read) / ssd_read_bps + double(ar.ssd_requests) / ssd_iops},
            {NodeIo::kDram, double(std::max(ar.ssd_bytes_read, ar.dram_bytes_written)) / dram_bps}};
        const uint32_t f = ios[node].Start(t, std::move(d), ar.ssd_requests > 0 ? hw.nvme_latency_us * 1e-6 : 0.0);
        track(node, f, -2 - int64_t(i), t);
        seqs[i].prefetch = f;
      }
    }
    for (uint32_t id = 0; id < instances; ++id)
      if (inst[id].busy && inst[id].step_end <= t) finish_step(id, t);
    for (uint32_t id = 0; id < instances; ++id)
      if (!inst[id].busy) schedule(id, t);
  }
  for (size_t i = 0; i < n; ++i)
    if (!seqs[i].first)
      return Status::Aborted("simulate: request " + std::to_string(i) + " never finished its prefill (prompt of " +
                              std::to_string(trace.requests[i].input_tokens) + " tokens)");
  res.makespan_s = last - first;
  for (CachePolicy* p : policies) {
    const PolicyStats ps = p->Stats();
    res.evicted_blocks += ps.evicted_blocks;
    res.migrated_blocks += ps.migrated_blocks;
  }
  return res;
}

SimResult MergeRuns(const std::vector<SimResult>& runs) {
  if (runs.empty()) return {};
  SimResult m = runs[0];
  m.orders = static_cast<uint32_t>(runs.size());
  m.ttft_mean_ms_min = m.ttft_mean_ms_max = runs[0].ttft_mean_ms();
  m.order_ttft_mean_ms = {runs[0].ttft_mean_ms()};
  for (size_t k = 1; k < runs.size(); ++k) {
    const SimResult& r = runs[k];
    m.requests += r.requests;
    m.input_tokens += r.input_tokens;
    m.hit_tokens += r.hit_tokens;
    m.output_tokens += r.output_tokens;
    m.hit_blocks += r.hit_blocks;
    m.dram_hit_blocks += r.dram_hit_blocks;
    m.ssd_hit_blocks += r.ssd_hit_blocks;
    m.aborted_blocks += r.aborted_blocks;
    m.lookup_blocks += r.lookup_blocks;
    m.dram_bytes_read += r.dram_bytes_read;
    m.ssd_bytes_read += r.ssd_bytes_read;
    m.ssd_bytes_useful += r.ssd_bytes_useful;
    m.dram_bytes_written += r.dram_bytes_written;
    m.ssd_bytes_written += r.ssd_bytes_written;
    m.evicted_blocks += r.evicted_blocks;
    m.migrated_blocks += r.migrated_blocks;
    m.prefetch_ssd_bytes += r.prefetch_ssd_bytes;
    m.local_hit_tokens += r.local_hit_tokens;
    m.remote_hit_blocks += r.remote_hit_blocks;
    m.remote_bytes_read += r.remote_bytes_read;
    m.remote_published_blocks += r.remote_published_blocks;
    m.remote_dropped_blocks += r.remote_dropped_blocks;
    m.remote_deleted_blocks += r.remote_deleted_blocks;
    m.restore_s += r.restore_s;
    m.model_restore_s += r.model_restore_s;
    m.real_restore_s += r.real_restore_s;
    m.prefill_s += r.prefill_s;
    m.queue_s += r.queue_s;
    m.makespan_s += r.makespan_s;  // tokens / summed makespans: the runs' pooled rate
    m.steps += r.steps;
    m.step_tokens += r.step_tokens;
    m.preemptions += r.preemptions;
    m.busy_s += r.busy_s;
    m.ttft_s.insert(m.ttft_s.end(), r.ttft_s.begin(), r.ttft_s.end());
    m.ttft_mean_ms_min = std::min(m.ttft_mean_ms_min, r.ttft_mean_ms());
    m.ttft_mean_ms_max = std::max(m.ttft_mean_ms_max, r.ttft_mean_ms());
    m.order_ttft_mean_ms.push_back(r.ttft_mean_ms());
  }
  return m;
}

Result<double> LatencyBenchmarkSeconds(const ServingModel& m, const HwProfile& hw, uint32_t tp, uint32_t batch,
                                       uint32_t input, uint32_t output) {
  Trace t;
  t.name = "latency-benchmark";
  t.block_tokens = 16;
  for (uint32_t b = 0; b < batch; ++b) {
    Request r;
    r.conversation = b + 1;
    r.input_tokens = input;
    r.output_tokens = output;
    for (uint32_t k = 0; k < input / t.block_tokens; ++k) r.blocks.push_back(uint64_t{b + 1} << 32 | k);
    t.requests.push_back(r);
  }
  t.conversations = batch;
  // No cache: every prompt is computed (the benchmark's prompts are random).
  class NoCache final : public CachePolicy {
   public:
    std::string_view name() const override { return "none"; }
    LookupResult Lookup(const Request&, uint32_t, double) override { return {}; }
    InsertResult Insert(const Request&, uint32_t, uint32_t, double) override { return {}; }
    PolicyStats Stats() const override { return {}; }
  } none;
  SimOptions o;
  o.model = m;
  HwProfile one = hw;
  one.gpus = tp;  // one instance: every request on it
  o.hw = one;
  o.tp = tp;
  auto r = Simulate(t, none, o);
  if (!r.ok()) return r.status();
  return r.value().makespan_s;
}

}  // namespace flatkv::replay
