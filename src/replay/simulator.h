// The serving model a replay runs a trace through, and its metrics.
//
// One node (replay/hw_profile.h) runs gpus / tp serving instances of the
// model, tp = its tensor-parallel degree. A request goes to its
// conversation's instance: sub-agents follow their parent (root
// conversation id, mixed, mod instances), so a conversation's KV is always
// consumed where it is produced. Request i arrives at arrival_s / load.
//
// Each instance is a continuous-batching engine after vLLM V1's scheduler
// (vllm/v1/core/sched/scheduler.py, v0.10): iterations ("steps") back to
// back while it has work. A step takes
//   - every running request: a decode request 1 token, a request still in
//     prefill a chunk of its remaining prompt, within a token budget of
//     max_num_batched_tokens per step (decode tokens count), in admission
//     order; then
//   - waiting requests in arrival order (FIFO, stopping at the first that
//     does not fit) while the budget lasts, at most max_num_seqs running.
//     Defaults: 8192 tokens and 1024 sequences, vLLM's defaults for the
//     OpenAI server on GPUs with >= 70 GiB (vllm/engine/arg_utils.py
//     EngineArgs.get_batch_defaults, v0.9-v0.10).
// Admitting a request reserves HBM for its whole prompt's KV and asks the
// policy (Lookup) for the cached prefix. If anything hit, its KV is loaded
// asynchronously: the request waits for its own load (holding its HBM, as
// vLLM's WAITING_FOR_REMOTE_KVS) while the instance serves the others. A
// policy that streams by layer (CachePolicy::layerwise: flat, the -lw
// baselines) starts its prefill once the first of L layers has arrived; a
// step that includes a request whose load is still running ends no earlier
// than that load's last layer lands plus one layer of the step (layer l's
// compute waits for layer l's KV), re-planned at the shares of every moment
// the shares change, and pays the profile's layer_sync_us for each of its L
// layers. Whole SSD objects of a layer-wise policy whose SSD part does not
// stream (CachePolicy::ssd_layerwise false: HiCache's pages) are read into
// host memory first, beside the DRAM part's stream; their layers then cross
// to the GPU, and the request is ready once both first layers are there.
// Others start prefill when the whole load is done. DRAM hits of a policy
// that copies them with threads (CachePolicy::dram_copy_threads: flat, as
// built) cross the node's copy threads (threads x memcpy_core_gbps, shared by
// every restore of the node) on their way to the link. The bound's steps
// (CachePolicy::hidden_loads, infinite-lw) never wait for its loads.
//
// Step time on an instance of tp GPUs, a roofline:
//   compute = (2 * params * tokens + attention FLOPs) / (tp * tflops * mfu)
//   memory  = (weight bytes read + KV bytes read) / (tp * hbm_tbps * hbm_efficiency)
//   step    = max(compute, memory) + step_overhead
// (step_overhead: the profile's fixed cost of an engine step: all-reduces,
// kernel launches, sampling; fit to vLLM's CI latency test, see
// docs/baselines.md "Serving model calibration")
// where attention FLOPs are 4 * layers * attn_dim * context per token, the
// KV read is each scheduled sequence's context x bytes per token, and the
// weights read are all dense weights plus, for a mixture of experts, the
// expected fraction of experts the step's tokens touch: 1 - (1 - k/E)^tokens.
// A request's TTFT ends with the step that computes its last prompt token;
// then Insert stores its blocks, and it decodes one token per step until
// output_tokens.
//
// HBM for KV per instance = tp * (hbm * gpu_memory_utilization -
// activation_reserve) - weight bytes. Decoding needs one more token of KV a
// step; when none is left the latest admitted request is preempted (its KV
// freed; it re-queues at the front and recomputes prompt + output so far,
// vLLM V1's recompute preemption; no second lookup).
//
// I/O goes through NodeIo (replay/node_io.h), shared by the node's
// instances: a restore crosses the SSD array (its bytes read at drives x
// nvme_read_gbps, its requests at drives x nvme_read_iops, after one
// nvme_latency_us, or one per read per TP worker for a policy whose reads
// are serial, CachePolicy::serial_ssd_reads), host memory (everything
// restored, SSD data bounced through it) and the instance's host-to-GPU
// PCIe (tp x pcie_gbps). An
// insert's offload runs in the background: the request's new blocks cross
// the instance's GPU-to-host PCIe and host memory, and what the policy
// wrote to SSD crosses the SSD array at drives x nvme_write_gbps. In kReal
// a restore lasts its measured time (x real_time_scale), with no sharing.
//
// Several nodes (SimOptions::nodes, flatkv replay --nodes N): each node is
// the profile's, with its own instances, its own NodeIo and its own policy
// (its DRAM and SSD). A request goes to an instance of any node: by its
// root conversation (kAffinity, as above, over all nodes' instances) or to
// the next instance in arrival order (kRoundRobin, a load balancer with no
// affinity; consecutive instances are on different nodes). With a shared
// tier (SimOptions::remote_bytes > 0; replay/shared_tier.h, after
// flatkv's Redis Cluster medium):
//   - a lookup asks the tier how far the chain goes on from the local hit
//     (one remote_rtt_us round before the restore starts, as the store's
//     Begin asks the cluster); what the tier holds is restored beside the
//     local part, over the node's link to the tier (kRemoteIn, remote_gbps;
//     its first bytes one more round trip after the ask) and host memory
//     to the GPU; a layer-wise policy streams it by layer like the rest;
//   - Insert stores the prompt from the local hit on: blocks restored from
//     the tier are written back into the node's own store (as the engine
//     puts what it did not restore locally), and cross the GPU-to-host link
//     again;
//   - of the put's blocks past those the tier supplied (RemoteMedium skips
//     keys a restore just found there), the leading ones that fit the
//     node's publish buffer (remote_buffer_bytes, counted in whole blocks,
//     new or not, as RemoteMedium::Publish queues them) are queued, the rest
//     not published;
//     of those, the ones no node has published or is publishing are written
//     in the background (kRemoteOut and host memory, after one round trip)
//     and are visible to lookups once that transfer ends; each node's
//     published blocks are capped at remote_bytes, the oldest deleted first.
// The result counts hits by where they came from: local_hit_tokens (the
// node's own DRAM and SSD) beside hit_tokens (local and remote together).
//
// Thread-safety: Simulate is a function of its arguments; the policies are
// driven on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flatkv/shape.h"
#include "flatkv/status.h"
#include "replay/hw_profile.h"
#include "replay/io_model.h"
#include "replay/policy.h"
#include "replay/trace.h"

namespace flatkv::replay {

// A model preset: its KV shape (bytes per token) and what prefill and
// decode cost.
struct ServingModel {
  std::string name;
  KvShape shape;
  double params = 0;           // parameters active per token (prefill FLOPs: 2 x params per token)
  double weight_bytes = 0;     // bytes of all weights (HBM held; read by a step that touches every expert)
  double expert_bytes = 0;     // of those, routed experts' bytes (0: dense)
  uint32_t experts = 0;        // routed experts per MoE layer (0: dense)
  uint32_t experts_per_token = 0;
  uint32_t layers = 0;
  double attn_dim = 0;         // query heads x head dim (attention FLOPs)
  uint64_t max_context_tokens = 0;  // the model's context length (TensorParallel's room for KV)
  uint64_t BytesPerToken() const { return shape.BytesPerToken(); }
};

// llama-3.1-8b, llama-3.1-70b, qwen3-32b, deepseek-v3, smollm2-135m (the KvShape presets
// with parameter counts); the error lists the known names.
Result<ServingModel> FindServingModel(std::string_view name);
std::vector<std::string> ServingModelNames();

struct SimOptions {
  ServingModel model;
  HwProfile hw;                     // the node
  uint32_t tp = 0;                  // tensor-parallel degree (0: TensorParallel(hw, model))
  uint32_t max_num_batched_tokens = 8192;  // token budget per step (vLLM, >= 70 GiB GPUs, OpenAI server)
  uint32_t max_num_seqs = 1024;            // running sequences per instance (same source)
  double gpu_memory_utilization = 0.9;     // vLLM's default (vllm/config CacheConfig)
  double activation_reserve_bytes = 4.0 * (1ull << 30);  // per GPU: activations, CUDA graphs (an assumption)
  double load = 1.0;                // arrivals are trace arrival_s / load
  IoMode io = IoMode::kModel;       // kReal: restore times are the policy's measured ones
  double real_time_scale = 1.0;     // kReal: measured seconds are multiplied by this (the byte scale-down)
  IoModel io_model;                 // model_restore_s: each restore costed alone, as before
  uint32_t nodes = 1;               // nodes of `hw`, one policy each (Simulate's `policies`)
  enum class Routing { kAffinity, kRoundRobin };
  Routing routing = Routing::kAffinity;
  uint64_t remote_bytes = 0;        // per node: its cap on the shared tier (0: no shared tier)
  uint64_t remote_buffer_bytes = 0; // per node: publish buffer (0: unbounded)
  uint64_t max_requests = 0;        // 0: all
  std::function<void(uint64_t done, uint64_t total)> progress;  // called now and then
};

struct SimResult {
  std::string policy;
  double load = 0;
  uint64_t requests = 0;
  uint64_t input_tokens = 0, hit_tokens = 0, output_tokens = 0;
  uint64_t hit_blocks = 0, dram_hit_blocks = 0, ssd_hit_blocks = 0, aborted_blocks = 0, lookup_blocks = 0;
  uint64_t dram_bytes_read = 0, ssd_bytes_read = 0, ssd_bytes_useful = 0;
  uint64_t dram_bytes_written = 0, ssd_bytes_written = 0;
  uint64_t evicted_blocks = 0, migrated_blocks = 0;
  uint64_t prefetch_ssd_bytes = 0;  // read from SSD by prefetches on arrival (CachePolicy::Arrive)
  uint64_t local_hit_tokens = 0;    // of hit_tokens, restored from the node's own DRAM and SSD
  uint64_t remote_hit_blocks = 0, remote_bytes_read = 0;  // restored from the shared tier
  uint64_t remote_published_blocks = 0;  // published to it (visible to every node)
  uint64_t remote_dropped_blocks = 0;    // blocks nobody had published left out: the publish buffer was full
  uint64_t remote_deleted_blocks = 0;    // deleted by their node's cap
  uint32_t nodes = 1;
  std::string routing = "affinity";
  double restore_s = 0;             // total restore time used (measured in kReal)
  double model_restore_s = 0;       // total restore time the IoModel gives
  double real_restore_s = 0;        // total measured restore time (kReal, as measured, unscaled; 0 otherwise)
  double prefill_s = 0, queue_s = 0;  // totals: restore done (or admission) to first token; arrival to admission
  double makespan_s = 0;            // first arrival to last completion
  uint32_t instances = 0, tp = 0;   // what ran
  double kv_hbm_bytes = 0;          // HBM for KV per instance
  uint64_t steps = 0, preemptions = 0;
  double busy_s = 0;                // instance-seconds spent in steps
  uint64_t step_tokens = 0;         // tokens over all steps (tokens_per_step: their mean)
  uint32_t orders = 1;              // runs merged into this one (MergeRuns)
  double ttft_mean_ms_min = 0, ttft_mean_ms_max = 0;  // over those runs
  std::vector<double> order_ttft_mean_ms;  // each run's mean TTFT, in run (order) order
  bool layerwise = false;           // the policy streamed by layer (CachePolicy::layerwise)
  uint32_t dram_copy_threads = 0;   // the policy's DRAM copy threads (0: DMA)
  double dram_copy_gbps = 0;        // their rate together, GB/s (threads x the profile's memcpy_core_gbps)
  // Paired over the orders: this policy's mean TTFT over the reference's
  // (flat's) at the same load and order; their mean and 95% interval
  // (Student's t). NaN where there is no pairing (PairRatios).
  double ratio_vs_flat_mean = std::numeric_limits<double>::quiet_NaN();
  double ratio_vs_flat_ci_low = std::numeric_limits<double>::quiet_NaN();
  double ratio_vs_flat_ci_high = std::numeric_limits<double>::quiet_NaN();
  std::string best_of;              // a derived row (tiered-best): the result it is
  std::vector<double> ttft_s;       // per request, in arrival order

  double hit_rate() const { return input_tokens ? double(hit_tokens) / double(input_tokens) : 0.0; }
  double local_hit_rate() const { return input_tokens ? double(local_hit_tokens) / double(input_tokens) : 0.0; }
  double ssd_read_amplification() const { return ssd_bytes_useful ? double(ssd_bytes_read) / double(ssd_bytes_useful) : 0.0; }
  // Restored bytes (DRAM + SSD payload + remote) over total restore time, GB/s.
  double restore_gbps() const {
    return restore_s > 0 ? double(dram_bytes_read + ssd_bytes_useful + remote_bytes_read) / restore_s / 1e9 : 0.0;
  }
  double tokens_per_step() const { return steps ? double(step_tokens) / double(steps) : 0.0; }
  double ttft_mean_ms() const;
  double ttft_percentile_ms(double p) const;  // p in [0, 100]
  double input_tok_s() const { return makespan_s > 0 ? double(input_tokens) / makespan_s : 0.0; }
  double output_tok_s() const { return makespan_s > 0 ? double(output_tokens) / makespan_s : 0.0; }
  double total_tok_s() const { return input_tok_s() + output_tok_s(); }
};

// FLOPs to prefill tokens [hit_tokens, input_tokens) of a prompt.
double PrefillFlops(const ServingModel& m, uint64_t hit_tokens, uint64_t input_tokens);
// One step's time on an instance of `tp` GPUs: `tokens` new tokens whose
// attention spans `attn_ctx` (sum over tokens of their context), reading
// `kv_bytes` of KV.
double StepSeconds(const ServingModel& m, const HwProfile& hw, uint32_t tp, uint64_t tokens, double attn_ctx,
                   double kv_bytes);
// The node's figures as an IoModel for one instance of `tp` GPUs (policies'
// own timings, e.g. tiered's staging holds, and model_restore_s): PCIe of
// its tp links, the node's DRAM bandwidth, the SSD array striped over its
// drives (drives requests in flight).
IoModel NodeIoModel(const HwProfile& hw, uint32_t tp);
// HBM left for KV per instance.
double KvHbmBytes(const ServingModel& m, const SimOptions& o, uint32_t tp);

// Sums the counters of runs of one (policy, load) over several orders,
// pools their TTFTs, and keeps the spread of their mean TTFTs.
SimResult MergeRuns(const std::vector<SimResult>& runs);

// vLLM's offline latency benchmark (benchmark_latency): `batch` prompts of
// `input` tokens start together and each generates `output` tokens; returns
// the seconds until all finish. docs/baselines.md compares it with vLLM's
// published CI figures.
Result<double> LatencyBenchmarkSeconds(const ServingModel& m, const HwProfile& hw, uint32_t tp, uint32_t batch,
                                       uint32_t input, uint32_t output);

// Replays `trace` through `policy`. Fails on a trace with no block size, on
// bad options (load not positive, a profile without GPUs) or a model that
// leaves no HBM for KV.
Result<SimResult> Simulate(const Trace& trace, CachePolicy& policy, const SimOptions& options);
// The same over options.nodes nodes, policies[k] node k's (one per node,
// each made for hw.gpus / tp instances). Also fails when the count differs
// from options.nodes, or a shared tier is asked for in kReal or on a
// profile without remote_gbps and remote_rtt_us.
Result<SimResult> Simulate(const Trace& trace, std::span<CachePolicy* const> policies, const SimOptions& options);

}  // namespace flatkv::replay
