#include "attention/decode.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <thread>

#include "attention/f16.h"

namespace flatkv::attention {

Status F16Cache::Validate(int n_heads, size_t q_floats, size_t out_floats) const {
  if (n_kv_heads <= 0 || head_dim <= 0 || n_heads <= 0 || n_heads % n_kv_heads != 0 ||
      n_heads / n_kv_heads > kMaxGroup)
    return Status::InvalidArgument("decode: " + std::to_string(n_heads) + " query heads over " +
                                   std::to_string(n_kv_heads) + " KV heads of dim " + std::to_string(head_dim) +
                                   " (expected a group of 1.." + std::to_string(kMaxGroup) + ")");
  if (n_tokens == 0 || head_stride < n_tokens || k == nullptr || v == nullptr)
    return Status::InvalidArgument("decode: cache of " + std::to_string(n_tokens) + " tokens, head stride " +
                                   std::to_string(head_stride));
  const size_t want = static_cast<size_t>(n_heads) * head_dim;
  if (q_floats != want || out_floats != want)
    return Status::InvalidArgument("decode: q has " + std::to_string(q_floats) + " floats, out " +
                                   std::to_string(out_floats) + ", expected n_heads*head_dim = " + std::to_string(want));
  return Status::Ok();
}

void MergePartial(Partial& a, const Partial& b) {
  if (b.m == -INFINITY) return;
  if (a.m == -INFINITY) {
    a = b;
    return;
  }
  const float m = std::max(a.m, b.m);
  const float sa = std::exp(a.m - m), sb = std::exp(b.m - m);
  for (size_t j = 0; j < a.acc.size(); ++j) a.acc[j] = a.acc[j] * sa + b.acc[j] * sb;
  a.l = a.l * sa + b.l * sb;
  a.m = m;
}

void ParallelFor(int threads, size_t items, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i; (i = next.fetch_add(1)) < items;) fn(i);
  };
  const int extra = std::max(0, std::min<int>(threads, static_cast<int>(items)) - 1);
  std::vector<std::thread> pool;
  pool.reserve(extra);
  for (int i = 0; i < extra; ++i) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

void ChunkPartials(const DecodeKernels& k, const F16Cache& cache, int kvh, int group, const float* q_group,
                   uint32_t t0, uint32_t t1, std::vector<float>& scratch, Partial* out) {
  const uint32_t n = t1 - t0;
  const int d = cache.head_dim;
  scratch.resize(static_cast<size_t>(group) * n);
  k.scores(q_group, group, cache.k_row(kvh, t0), n, d, 1.0f / std::sqrt(static_cast<float>(d)), scratch.data());
  std::vector<float> acc(static_cast<size_t>(group) * d, 0.0f);
  for (int h = 0; h < group; ++h) {
    float* s = scratch.data() + static_cast<size_t>(h) * n;
    const float m = *std::max_element(s, s + n);
    k.exp_shift(s, n, m);
    double l = 0;
    for (uint32_t t = 0; t < n; ++t) l += s[t];
    out[h].m = m;
    out[h].l = l;
  }
  k.accumulate(scratch.data(), n, group, cache.v_row(kvh, t0), n, d, acc.data());
  for (int h = 0; h < group; ++h) out[h].acc.assign(acc.begin() + h * d, acc.begin() + (h + 1) * d);
}

Status DenseDecode(const F16Cache& cache, int n_heads, std::span<const float> q, std::span<float> out,
                   const DecodeOptions& o) {
  FLATKV_RETURN_IF_ERROR(cache.Validate(n_heads, q.size(), out.size()));
  if (o.threads < 1 || o.chunk_tokens == 0)
    return Status::InvalidArgument("decode: threads " + std::to_string(o.threads) + ", chunk " +
                                   std::to_string(o.chunk_tokens) + " (expected >= 1)");
  const DecodeKernels& k = KernelsFor(std::min(o.simd, DetectedSimd()));
  const int group = n_heads / cache.n_kv_heads, d = cache.head_dim;
  const uint32_t chunks = (cache.n_tokens + o.chunk_tokens - 1) / o.chunk_tokens;
  std::vector<Partial> parts(static_cast<size_t>(cache.n_kv_heads) * chunks * group);
  ParallelFor(o.threads, static_cast<size_t>(cache.n_kv_heads) * chunks, [&](size_t item) {
    thread_local std::vector<float> scratch;
    const int kvh = static_cast<int>(item / chunks);
    const uint32_t c = static_cast<uint32_t>(item % chunks);
    const uint32_t t0 = c * o.chunk_tokens, t1 = std::min(cache.n_tokens, t0 + o.chunk_tokens);
    ChunkPartials(k, cache, kvh, group, q.data() + static_cast<size_t>(kvh) * group * d, t0, t1, scratch,
                  parts.data() + item * group);
  });
  for (int h = 0; h < n_heads; ++h) {
    const int kvh = h / group, g = h % group;
    Partial total;
    for (uint32_t c = 0; c < chunks; ++c) MergePartial(total, parts[(static_cast<size_t>(kvh) * chunks + c) * group + g]);
    for (int j = 0; j < d; ++j) out[static_cast<size_t>(h) * d + j] = static_cast<float>(total.acc[j] / total.l);
  }
  return Status::Ok();
}

void ExactDecode(const F16Cache& cache, int n_heads, std::span<const float> q, std::span<float> out,
                 std::vector<std::vector<double>>* weights) {
  const int group = n_heads / cache.n_kv_heads, d = cache.head_dim;
  if (weights) weights->assign(n_heads, {});
  std::vector<double> s(cache.n_tokens), acc(d);
  for (int h = 0; h < n_heads; ++h) {
    const int kvh = h / group;
    const float* qh = q.data() + static_cast<size_t>(h) * d;
    double m = -INFINITY;
    for (uint32_t t = 0; t < cache.n_tokens; ++t) {
      const uint16_t* row = cache.k_row(kvh, t);
      double dot = 0;
      for (int j = 0; j < d; ++j) dot += double(qh[j]) * HalfToFloat(row[j]);
      s[t] = dot / std::sqrt(double(d));
      m = std::max(m, s[t]);
    }
    double l = 0;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (uint32_t t = 0; t < cache.n_tokens; ++t) {
      s[t] = std::exp(s[t] - m);
      l += s[t];
      const uint16_t* row = cache.v_row(kvh, t);
      for (int j = 0; j < d; ++j) acc[j] += s[t] * HalfToFloat(row[j]);
    }
    for (int j = 0; j < d; ++j) out[static_cast<size_t>(h) * d + j] = static_cast<float>(acc[j] / l);
    if (weights) {
      (*weights)[h].resize(cache.n_tokens);
      for (uint32_t t = 0; t < cache.n_tokens; ++t) (*weights)[h][t] = s[t] / l;
    }
  }
}

}  // namespace flatkv::attention
