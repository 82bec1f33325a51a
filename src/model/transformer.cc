// The forward pass, llama2.c run.c semantics, one plain function per
// operation. Determinism rule: every output element is reduced in one fixed
// order that depends only on its own inputs (Dot and Sum of model/fp_math.h
// for every dot product and sum; attention for position p weights V over keys 0..p in
// order), never on n, pos0, the cache's paging or how the work is tiled. Hence chunked prefill, token-by-token
// decode and restored prefixes all give bit-identical logits and KV.
//
// Matrices are row-major [out][in]: y[i] = sum_j W[i * in + j] * x[j].
#include "model/transformer.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstring>

#include "common/thread_pool.h"
#include "model/fp_math.h"
#include "model/kernels.h"
#include "model/rope.h"

// Fused multiply-add rounds differently from a multiply then an add, and a
// compiler may fuse one copy of an expression (a vector loop body) but not
// another (its scalar epilogue). Keep every multiply and add rounded on its
// own, so results do not depend on the code path or on -march: GCC's C++
// default is -ffp-contract=fast, which fuses whenever FMA is enabled. The
// build passes -ffp-contract=off everywhere (CMakeLists.txt); clang also
// gets the pragma so this file stays right when compiled on its own.
#if defined(__clang__)
#pragma clang fp contract(off)
#endif

namespace flatkv::model {
namespace {

using fp::Dot;
using fp::Exp;

// in: x (n, dim), weight (dim); out: o (n, dim) = weight * x / rms(x)
void RmsNorm(const float* x, const float* weight, int n, int dim, float eps, float* o) {
  for (int t = 0; t < n; ++t) {
    const float* xt = x + static_cast<size_t>(t) * dim;
    float* ot = o + static_cast<size_t>(t) * dim;
    const float ss = 1.0f / std::sqrt(Dot(xt, xt, dim) / static_cast<float>(dim) + eps);
    for (int j = 0; j < dim; ++j) ot[j] = weight[j] * (ss * xt[j]);
  }
}

// in/out: q (n, dim) (or null), k (n, kv_dim) of positions pos[0..n-1]:
// llama2.c's interleaved RoPE over whole heads (model/rope.h), with angles
// and their cos/sin in double, rounded once to float, so they stay accurate
// at large positions (run.c uses float angles).
void Rope(float* q, float* k, int n, int dim, int kv_dim, int head_size, const uint32_t* pos, float theta) {
  const RopeSpec spec{static_cast<double>(theta), 0, RopeStyle::kInterleaved};
  const auto hs = static_cast<uint32_t>(head_size);
  if (q != nullptr) ApplyRope(q, static_cast<uint32_t>(n), dim, 0, static_cast<uint32_t>(dim) / hs, hs, pos, spec);
  ApplyRope(k, static_cast<uint32_t>(n), kv_dim, 0, static_cast<uint32_t>(kv_dim) / hs, hs, pos, spec);
}

// in: hb (n, hidden) = w1 x, hb2 (n, hidden) = w3 x; out: hb = silu(hb) * hb2
void SwiGlu(float* hb, const float* hb2, int n, int hidden) {
  const size_t count = static_cast<size_t>(n) * hidden;
  for (size_t i = 0; i < count; ++i) {
    const float g = hb[i];
    hb[i] = g * (1.0f / (1.0f + Exp(-g))) * hb2[i];
  }
}

// in/out: x (count) += y (count)
void Add(float* x, const float* y, size_t count) {
  for (size_t i = 0; i < count; ++i) x[i] += y[i];
}

void Grow(std::vector<float>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

Transformer::Transformer(const Model& model, const TransformerOptions& options)
    : model_(model), kernels_(options.simd ? &KernelsFor(*options.simd) : &DefaultKernels()) {
  const int threads = options.threads == 0 ? ThreadPool::HardwareThreads() : std::max(1, options.threads);
  if (threads > 1) pool_ = std::make_unique<ThreadPool>(threads);
  att_.resize(threads);
}

Transformer::~Transformer() = default;
Transformer::Transformer(Transformer&&) noexcept = default;

int Transformer::threads() const { return pool_ ? pool_->threads() : 1; }
SimdLevel Transformer::simd() const { return kernels_->level; }

void Transformer::MatMul(const float* x, const float* w, int n, int in, int out, float* y) {
  if (!pool_ || out < 2) {
    kernels_->matmul_rows(x, w, n, in, out, 0, out, y);
    return;
  }
  // Two row ranges per thread (so a slow thread does not hold up the
  // rest for long), multiples of 24 rows (the kernels' row blocks are 3 and 6).
  const int tasks = 2 * pool_->threads();
  const int chunk = std::max(24, (out + tasks - 1) / tasks + 23) / 24 * 24;
  const int chunks = (out + chunk - 1) / chunk;
  pool_->ParallelFor(chunks, [&](int task, int) {
    const int r0 = task * chunk, r1 = std::min(out, r0 + chunk);
    kernels_->matmul_rows(x, w, n, in, out, r0, r1, y);
  });
}

void Transformer::Attention(const float* q, const KvCache& cache, int layer, const uint32_t* pos, int n, float* o) {
  const Config& c = model_.config;
  const int dim = c.dim, hs = c.head_size(), group = c.n_heads / c.n_kv_heads;
  const float sqrt_hs = std::sqrt(static_cast<float>(hs));
  // Tasks: blocks of kQueryTokens tokens x one kv head; a block's queries
  // share each K/V page's loads (kernels.h).
  constexpr int kQueryTokens = 8;
  const int blocks = (n + kQueryTokens - 1) / kQueryTokens;
  for (auto& a : att_) Grow(a, size_t{kQueryTokens} * group * (size_t{pos[n - 1]} + 1));
  const auto attend = [&](int task, int thread) {
    const int b = task / c.n_kv_heads, kvh = task % c.n_kv_heads;
    const int t0 = b * kQueryTokens, nt = std::min(kQueryTokens, n - t0);
    const size_t off = static_cast<size_t>(t0) * dim + static_cast<size_t>(kvh) * group * hs;
    kernels_->attend(q + off, dim, pos + t0, nt, group, hs, cache, layer, kvh * hs, sqrt_hs, att_[thread].data(),
                     o + off);
  };
  const int tasks = blocks * c.n_kv_heads;
  if (pool_) {
    pool_->ParallelFor(tasks, attend);
  } else {
    for (int task = 0; task < tasks; ++task) attend(task, 0);
  }
}

void Transformer::Embed(std::span<const int> tokens, float* x) {
  const int dim = model_.config.dim, vocab = model_.config.vocab_size;
  for (size_t t = 0; t < tokens.size(); ++t) {
    float* xt = x + t * dim;
    const int id = tokens[t];
    assert(id >= 0 && id < vocab);
    if (id < 0 || id >= vocab) {  // callers validate ids; never read out of bounds
      std::fill(xt, xt + dim, 0.0f);
      continue;
    }
    std::memcpy(xt, model_.weights.token_embedding.data() + static_cast<size_t>(id) * dim, dim * sizeof(float));
  }
}

void Transformer::Layer(int layer, uint32_t pos0, uint32_t n, float* x, KvCache& cache) {
  assert(uint64_t{pos0} + n <= cache.max_positions());
  pos_.resize(n);
  for (uint32_t t = 0; t < n; ++t) pos_[t] = pos0 + t;
  LayerImpl(layer, pos_.data(), n, x, cache);
}

void Transformer::LayerAt(int layer, std::span<const uint32_t> positions, float* x, KvCache& cache) {
  assert(!attention_hook_);
  assert(std::is_sorted(positions.begin(), positions.end()));
  assert(positions.empty() || positions.back() < cache.max_positions());
  LayerImpl(layer, positions.data(), static_cast<uint32_t>(positions.size()), x, cache);
}

void Transformer::RotateKeys(float* k, std::span<const uint32_t> positions) const {
  const Config& c = model_.config;
  Rope(nullptr, k, static_cast<int>(positions.size()), c.dim, c.kv_dim(), c.head_size(), positions.data(), c.rope_theta);
}

void Transformer::KeysValuesAt(int layer, std::span<const uint32_t> positions, const float* x, KvCache& cache) {
  const Config& c = model_.config;
  const LayerWeights& w = model_.weights.layers[layer];
  const int dim = c.dim, kv_dim = c.kv_dim(), nn = static_cast<int>(positions.size());
  if (nn == 0) return;
  Grow(xb_, positions.size() * dim);
  Grow(k_, positions.size() * kv_dim);
  Grow(v_, positions.size() * kv_dim);
  RmsNorm(x, w.rms_att.data(), nn, dim, c.norm_eps, xb_.data());
  MatMul(xb_.data(), w.wk.data(), nn, dim, kv_dim, k_.data());
  MatMul(xb_.data(), w.wv.data(), nn, dim, kv_dim, v_.data());
  Rope(nullptr, k_.data(), nn, dim, kv_dim, c.head_size(), positions.data(), c.rope_theta);
  for (int t = 0; t < nn; ++t) {
    std::memcpy(cache.k(layer, positions[t]), k_.data() + size_t(t) * kv_dim, kv_dim * sizeof(float));
    std::memcpy(cache.v(layer, positions[t]), v_.data() + size_t(t) * kv_dim, kv_dim * sizeof(float));
  }
}

void Transformer::LayerImpl(int layer, const uint32_t* pos, uint32_t n, float* x, KvCache& cache) {
  const Config& c = model_.config;
  assert(layer >= 0 && layer < c.n_layers);
  assert(cache.layers() == c.n_layers && cache.kv_dim() == c.kv_dim());
  if (n == 0) return;
  const uint32_t pos0 = pos[0];
  const LayerWeights& w = model_.weights.layers[layer];
  const int dim = c.dim, kv_dim = c.kv_dim(), hidden = c.hidden_dim, nn = static_cast<int>(n);
  Grow(xb_, size_t{n} * dim);
  Grow(q_, size_t{n} * dim);
  Grow(k_, size_t{n} * kv_dim);
  Grow(v_, size_t{n} * kv_dim);
  Grow(hb_, size_t{n} * hidden);
  Grow(hb2_, size_t{n} * hidden);

  // Attention block: x += wo * Attention(RoPE(wq xb), RoPE(wk xb), wv xb).
  RmsNorm(x, w.rms_att.data(), nn, dim, c.norm_eps, xb_.data());
  MatMul(xb_.data(), w.wq.data(), nn, dim, dim, q_.data());
  MatMul(xb_.data(), w.wk.data(), nn, dim, kv_dim, k_.data());
  MatMul(xb_.data(), w.wv.data(), nn, dim, kv_dim, v_.data());
  if (key_sink_)
    for (uint32_t t = 0; t < n; ++t) key_sink_(layer, pos[t], k_.data() + size_t{t} * kv_dim);
  Rope(q_.data(), k_.data(), nn, dim, kv_dim, c.head_size(), pos, c.rope_theta);
  if (query_sink_)
    for (uint32_t t = 0; t < n; ++t) query_sink_(layer, pos[t], q_.data() + size_t{t} * dim);
  for (uint32_t t = 0; t < n; ++t) {
    std::memcpy(cache.k(layer, pos[t]), k_.data() + size_t{t} * kv_dim, kv_dim * sizeof(float));
    std::memcpy(cache.v(layer, pos[t]), v_.data() + size_t{t} * kv_dim, kv_dim * sizeof(float));
  }
  if (attention_hook_) {
    attention_hook_(layer, pos0, n, q_.data(), cache, xb_.data());
  } else {
    Attention(q_.data(), cache, layer, pos, nn, xb_.data());  // xb_ is free again
  }
  MatMul(xb_.data(), w.wo.data(), nn, dim, dim, q_.data());                  // and now q_
  Add(x, q_.data(), size_t{n} * dim);

  // FFN block: x += w2 (silu(w1 xb) * w3 xb).
  RmsNorm(x, w.rms_ffn.data(), nn, dim, c.norm_eps, xb_.data());
  MatMul(xb_.data(), w.w1.data(), nn, dim, hidden, hb_.data());
  MatMul(xb_.data(), w.w3.data(), nn, dim, hidden, hb2_.data());
  SwiGlu(hb_.data(), hb2_.data(), nn, hidden);
  MatMul(hb_.data(), w.w2.data(), nn, hidden, dim, xb_.data());
  Add(x, xb_.data(), size_t{n} * dim);
}

void Transformer::Logits(const float* x, float* logits, int n) {
  const Config& c = model_.config;
  Grow(xb_, static_cast<size_t>(n) * c.dim);
  RmsNorm(x, model_.weights.rms_final.data(), n, c.dim, c.norm_eps, xb_.data());
  MatMul(xb_.data(), model_.weights.classifier(), n, c.dim, c.vocab_size, logits);
}

void Transformer::Forward(std::span<const int> tokens, uint32_t pos0, KvCache& cache, float* logits) {
  if (tokens.empty()) return;
  const size_t n = tokens.size();
  const int dim = model_.config.dim;
  // out_ holds the residual stream here; Layer and Logits never touch it.
  Grow(out_, n * dim);
  float* x = out_.data();
  Embed(tokens, x);
  for (int l = 0; l < model_.config.n_layers; ++l) Layer(l, pos0, static_cast<uint32_t>(n), x, cache);
  Logits(x + (n - 1) * dim, logits);
}

}  // namespace flatkv::model
