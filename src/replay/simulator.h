// The serving model a replay runs a trace through, and its metrics.
//
// N serving instances, each a FIFO queue that runs one request at a time.
// A request goes to its conversation's instance: sub-agents follow their
// parent (root conversation id, mixed, mod N), so a conversation's KV is
// always consumed where it is produced. Request i arrives at
// arrival_s / load. When its instance is free it starts:
//
//   lookup (policy)   -> restore time (IoModel, or measured in kReal)
//   prefill           -> FLOPs of the missed tokens / gpu rate
//   TTFT = start - arrival (queueing) + restore + prefill
//   insert (policy)   at the end of prefill: every block is computed
//   decode            occupies the instance output_tokens x decode time per token
//
// Prefill FLOPs of tokens [h, n) of a prompt: 2 * params * (n - h) for the
// weights plus 2 * layers * attn_dim * (n^2 - h^2) for attention to the
// prefix (4 * layers * attn_dim * p per token at position p). Decode time
// per token = weight bytes / HBM bandwidth / decode batch: a batched
// decode step's cost, shared by the batch.
//
// Thread-safety: Simulate is a function of its arguments; the policy is
// driven on the calling thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "flatkv/shape.h"
#include "flatkv/status.h"
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
  double weight_bytes = 0;     // bytes of weights read per decode step
  uint32_t layers = 0;
  double attn_dim = 0;         // query heads x head dim (attention FLOPs)
  uint64_t BytesPerToken() const { return shape.BytesPerToken(); }
};

// llama-3.1-8b, llama-3.1-70b, qwen3-32b, deepseek-v3 (the KvShape presets
// with parameter counts); the error lists the known names.
Result<ServingModel> FindServingModel(std::string_view name);
std::vector<std::string> ServingModelNames();

struct SimOptions {
  ServingModel model;
  uint32_t instances = 8;           // serving instances (one FIFO queue each)
  double load = 1.0;                // arrivals are trace arrival_s / load
  double gpu_tflops = 400;          // effective prefill rate per instance, TFLOP/s (H100-class, ~40% of dense BF16 peak)
  double hbm_tbps = 3.35;           // HBM bandwidth per instance, TB/s (H100 SXM)
  double decode_batch = 32;         // requests sharing one decode step
  IoMode io = IoMode::kModel;       // kReal: restore times are the policy's measured ones
  double real_time_scale = 1.0;     // kReal: measured seconds are multiplied by this (the byte scale-down)
  IoModel io_model;                 // always used for the modelled figures
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
  double restore_s = 0;             // total restore time used (measured in kReal)
  double model_restore_s = 0;       // total restore time the IoModel gives
  double real_restore_s = 0;        // total measured restore time (kReal, as measured, unscaled; 0 otherwise)
  double prefill_s = 0, queue_s = 0;
  double makespan_s = 0;            // first arrival to last completion
  std::vector<double> ttft_s;       // per request, in arrival order

  double hit_rate() const { return input_tokens ? double(hit_tokens) / double(input_tokens) : 0.0; }
  double ssd_read_amplification() const { return ssd_bytes_useful ? double(ssd_bytes_read) / double(ssd_bytes_useful) : 0.0; }
  // Restored bytes (DRAM + SSD payload) over total restore time, GB/s.
  double restore_gbps() const { return restore_s > 0 ? double(dram_bytes_read + ssd_bytes_useful) / restore_s / 1e9 : 0.0; }
  double ttft_mean_ms() const;
  double ttft_percentile_ms(double p) const;  // p in [0, 100]
  double input_tok_s() const { return makespan_s > 0 ? double(input_tokens) / makespan_s : 0.0; }
  double output_tok_s() const { return makespan_s > 0 ? double(output_tokens) / makespan_s : 0.0; }
};

// FLOPs to prefill tokens [hit_tokens, input_tokens) of a prompt.
double PrefillFlops(const ServingModel& m, uint64_t hit_tokens, uint64_t input_tokens);
// Seconds one output token occupies an instance.
double DecodeSecondsPerToken(const ServingModel& m, const SimOptions& o);

// Replays `trace` through `policy`. Fails on a trace with no block size or
// on bad options (instances or load not positive).
Result<SimResult> Simulate(const Trace& trace, CachePolicy& policy, const SimOptions& options);

}  // namespace flatkv::replay
