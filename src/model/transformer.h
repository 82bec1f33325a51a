// Transformer: the forward pass, one plain function per layer kind, in
// fp32, written so that every output element is reduced in a fixed order
// that depends only on its own inputs. Results are therefore bit-identical
// however a prompt is split into prefill chunks, and whether a prefix's KV
// was computed here or restored from the store.
//
// The pass is layer-major so that an engine can interleave it with a
// layer-streamed restore: for a chunk of n new tokens at positions
// [pos0, pos0 + n):
//   Embed(tokens, x)                       x: (n, dim)
//   for l in layers: Layer(l, pos0, n, x, cache)   // needs cache layer l for positions < pos0
//   Logits(x + (n-1)*dim, logits)         logits: (vocab)
//
// Speed: matmuls and attention run the kernels of model/kernels.h (AVX2 /
// AVX-512 where the CPU has them, bit-identical to the scalar reference) on
// `threads` threads: a matmul's output rows and attention's (token, kv head)
// pairs are split across a small persistent pool (common/thread_pool.h).
// Every output element is still computed by one thread in the fixed order,
// so neither the kernel nor the thread count changes any result.
//
// Thread-safety: a Transformer holds scratch buffers and its pool; use one
// per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "common/cpu.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace flatkv {
class ThreadPool;
}

namespace flatkv::model {

struct Kernels;

struct TransformerOptions {
  // Threads for matmuls and attention, the caller's included: 1 = the
  // caller only; 0 = the machine's hardware threads. Results do not depend on it.
  int threads = 1;
  // Kernel level: unset = the CPU's best (common/cpu.h, capped by
  // FLATKV_SIMD); tests set it to compare paths. Results do not depend on it.
  std::optional<SimdLevel> simd;
};

class Transformer {
 public:
  explicit Transformer(const Model& model, const TransformerOptions& options = {});
  ~Transformer();
  Transformer(Transformer&&) noexcept;

  int threads() const;
  SimdLevel simd() const;

  const Config& config() const { return model_.config; }

  // in: n token ids; out: x (n, dim), their embeddings.
  void Embed(std::span<const int> tokens, float* x);
  // One transformer block for n tokens at positions pos0..pos0+n-1:
  // x (n, dim) -> x (n, dim). Writes K (after RoPE) and V of those positions
  // into `cache` at layer `layer`; attends over positions 0..pos0+i.
  void Layer(int layer, uint32_t pos0, uint32_t n, float* x, KvCache& cache);
  // The same block for tokens at arbitrary ascending `positions` (selective
  // recompute, engine/blend.cc): x (n, dim) -> x (n, dim); writes their K and
  // V; token t attends over cache positions 0..positions[t], whatever wrote
  // them. Bit-identical to Layer for contiguous positions. Not with an
  // attention hook.
  void LayerAt(int layer, std::span<const uint32_t> positions, float* x, KvCache& cache);
  // RoPE of n key rows k (n, kv_dim), given before RoPE, at `positions`:
  // the exact rotation Layer applies, so restoring pre-RoPE keys at new
  // positions gives the bytes a prefill would have written for them.
  void RotateKeys(float* k, std::span<const uint32_t> positions) const;
  // Only the K (after RoPE) and V a layer would write for tokens x (n, dim)
  // at `positions`, into `cache`: the bytes LayerAt writes, without the
  // attention and FFN (CacheBlend's check layer). x is unchanged.
  void KeysValuesAt(int layer, std::span<const uint32_t> positions, const float* x, KvCache& cache);
  // Final RMSNorm and classifier of n positions: x (n, dim) -> logits (n, vocab),
  // the classifier read once per token tile; each row's bits as for n = 1.
  void Logits(const float* x, float* logits, int n = 1);

  // Convenience: runs `tokens` at pos0.. through every layer; fills `logits`
  // (vocab) for the last token.
  void Forward(std::span<const int> tokens, uint32_t pos0, KvCache& cache, float* logits);

  // Optional observer of the queries: Layer calls it for every position
  // with that position's query vectors after RoPE (n_heads * head_size
  // floats, head-major). Used by `flatkv dump-kv`.
  using QuerySink = std::function<void(int layer, uint32_t pos, const float* q)>;
  void set_query_sink(QuerySink sink) { query_sink_ = std::move(sink); }
  // Optional observer of the keys before RoPE (kv_dim floats per position),
  // what a chunk keeps in the store (docs/blend.md).
  using KeySink = std::function<void(int layer, uint32_t pos, const float* k)>;
  void set_key_sink(KeySink sink) { key_sink_ = std::move(sink); }

  // Optional replacement of the attention step, for attention over a
  // compacted KV (attention/compact.h). Layer calls it after writing the new
  // tokens' K and V into `cache`, with q (n, dim) of positions pos0..pos0+n-1
  // after RoPE; it writes o (n, dim), the per-head attention outputs. Unset
  // (the default): dense attention over cache positions 0..p.
  using AttentionHook = std::function<void(int layer, uint32_t pos0, uint32_t n, const float* q,
                                           const KvCache& cache, float* o)>;
  void set_attention_hook(AttentionHook hook) { attention_hook_ = std::move(hook); }

 private:
  void LayerImpl(int layer, const uint32_t* pos, uint32_t n, float* x, KvCache& cache);
  // in: x (n, in), w (out, in); out: y (n, out), rows split across the pool.
  void MatMul(const float* x, const float* w, int n, int in, int out, float* y);
  // in: q (n, dim) of positions pos[0..n-1]; out: o (n, dim); (token, kv head) pairs split across the pool.
  void Attention(const float* q, const KvCache& cache, int layer, const uint32_t* pos, int n, float* o);
  QuerySink query_sink_;
  KeySink key_sink_;
  AttentionHook attention_hook_;
  const Model& model_;
  const Kernels* kernels_;
  std::unique_ptr<ThreadPool> pool_;                    // null when single-threaded
  std::vector<float> xb_, q_, k_, v_, hb_, hb2_, out_;  // scratch
  std::vector<std::vector<float>> att_;                 // attention scratch per thread
  std::vector<uint32_t> pos_;                                 // Layer's positions
};

// Sampling: greedy when temperature == 0, otherwise temperature then top-p
// (nucleus) with a seeded xorshift RNG, so a (seed, logits) pair always
// picks the same token.
class Sampler {
 public:
  Sampler(int vocab_size, float temperature, float top_p, uint64_t seed);
  int Sample(std::span<const float> logits);

 private:
  int vocab_size_;
  float temperature_, top_p_;
  uint64_t state_;
  std::vector<std::pair<float, int>> probs_;
};

}  // namespace flatkv::model
