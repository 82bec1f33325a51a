#include "attention/sparse_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "attention/f16.h"

namespace flatkv::attention {

SparseAttention::SparseAttention(const model::Config& c, const SparseAttentionOptions& o)
    : c_(c), o_(o), layers_(c.n_layers) {}

Result<std::unique_ptr<SparseAttention>> SparseAttention::Create(const model::Config& c,
                                                                 const SparseAttentionOptions& o) {
  if (o.capacity == 0) return Status::InvalidArgument("sparse attention: capacity 0");
  if (o.page_tokens == 0 || o.token_budget == 0)
    return Status::InvalidArgument("sparse attention: page_tokens " + std::to_string(o.page_tokens) +
                                   ", token_budget " + std::to_string(o.token_budget) + " (both must be > 0)");
  if (c.n_heads <= 0 || c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0)
    return Status::InvalidArgument("sparse attention: " + std::to_string(c.n_heads) + " query heads over " +
                                   std::to_string(c.n_kv_heads) + " KV heads");
  std::unique_ptr<SparseAttention> s(new SparseAttention(c, o));
  const size_t d = c.head_size(), H = c.n_kv_heads;
  const size_t pages = (o.capacity + o.page_tokens - 1) / o.page_tokens;
  for (auto& m : s->layers_) {
    m.k.resize(H * o.capacity * d);
    m.v.resize(H * o.capacity * d);
    if (o.method == SparseMethod::kQuest) {
      m.kmin.assign(H * pages * d, FloatToHalf(INFINITY));
      m.kmax.assign(H * pages * d, FloatToHalf(-INFINITY));
    }
    if (o.method == SparseMethod::kSampler) m.vnorm.resize(H * o.capacity);
  }
  return s;
}

// Mirrors position p of `layer` (f16), with its page bounds and value norm.
void SparseAttention::Append(int layer, const model::KvCache& cache, uint32_t p) {
  LayerMirror& m = layers_[layer];
  const int d = c_.head_size();
  const size_t pages = (o_.capacity + o_.page_tokens - 1) / o_.page_tokens;
  for (int h = 0; h < c_.n_kv_heads; ++h) {
    const float* k = cache.k(layer, p) + h * d;
    const float* v = cache.v(layer, p) + h * d;
    uint16_t* kr = m.k.data() + (size_t(h) * o_.capacity + p) * d;
    uint16_t* vr = m.v.data() + (size_t(h) * o_.capacity + p) * d;
    double norm = 0;
    for (int j = 0; j < d; ++j) {
      kr[j] = FloatToHalf(k[j]);
      vr[j] = FloatToHalf(v[j]);
      const double x = HalfToFloat(vr[j]);
      norm += x * x;
    }
    if (!m.kmin.empty()) {
      const size_t base = (size_t(h) * pages + p / o_.page_tokens) * d;
      for (int j = 0; j < d; ++j) {  // min/max of f16 values are exact in f16
        const float x = HalfToFloat(kr[j]);
        if (x < HalfToFloat(m.kmin[base + j])) m.kmin[base + j] = kr[j];
        if (x > HalfToFloat(m.kmax[base + j])) m.kmax[base + j] = kr[j];
      }
    }
    if (!m.vnorm.empty()) m.vnorm[size_t(h) * o_.capacity + p] = static_cast<float>(std::sqrt(norm));
  }
  m.filled = p + 1;
}

// ||out - exact|| / ||exact|| of query head h.
double SparseAttention::RelErr(int h, int d) const {
  double num = 0, den = 0;
  for (int j = 0; j < d; ++j) {
    const double e = double(out_[size_t(h) * d + j]) - exact_[size_t(h) * d + j];
    num += e * e;
    den += double(exact_[size_t(h) * d + j]) * exact_[size_t(h) * d + j];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Forgets positions >= pos: page bounds from pos's page on are rebuilt from
// the rows before pos (min/max cannot be taken back).
void SparseAttention::Truncate(int layer, uint32_t pos) {
  LayerMirror& m = layers_[layer];
  m.filled = pos;
  if (m.kmin.empty()) return;
  const int d = c_.head_size();
  const size_t pages = (o_.capacity + o_.page_tokens - 1) / o_.page_tokens;
  const uint32_t first = pos / o_.page_tokens;
  for (int h = 0; h < c_.n_kv_heads; ++h) {
    std::fill(m.kmin.begin() + (size_t(h) * pages + first) * d, m.kmin.begin() + size_t(h + 1) * pages * d,
              FloatToHalf(INFINITY));
    std::fill(m.kmax.begin() + (size_t(h) * pages + first) * d, m.kmax.begin() + size_t(h + 1) * pages * d,
              FloatToHalf(-INFINITY));
    const size_t base = (size_t(h) * pages + first) * d;
    for (uint32_t p = first * o_.page_tokens; p < pos; ++p) {
      const uint16_t* kr = m.k.data() + (size_t(h) * o_.capacity + p) * d;
      for (int j = 0; j < d; ++j) {
        const float x = HalfToFloat(kr[j]);
        if (x < HalfToFloat(m.kmin[base + j])) m.kmin[base + j] = kr[j];
        if (x > HalfToFloat(m.kmax[base + j])) m.kmax[base + j] = kr[j];
      }
    }
  }
}

// One decode step of the token at position p over positions 0..p.
void SparseAttention::Step(int layer, uint32_t p, const float* q, float* o) {
  if (!status_.ok()) return;
  const LayerMirror& m = layers_[layer];
  const int d = c_.head_size(), H = c_.n_kv_heads, heads = c_.n_heads;
  const uint32_t n = p + 1;
  F16Cache view{H, d, n, o_.capacity, m.k.data(), m.v.data()};
  const std::span<const float> qs(q, size_t(heads) * d);
  out_.resize(size_t(heads) * d);
  DecodeOptions dec;
  dec.threads = o_.threads;
  Status st;
  if (layer < o_.dense_layers || o_.method == SparseMethod::kDense) {
    st = DenseDecode(view, heads, qs, out_, dec);
  } else if (o_.method == SparseMethod::kQuest) {
    const size_t cap_pages = (o_.capacity + o_.page_tokens - 1) / o_.page_tokens;
    qix_.page_tokens = o_.page_tokens;
    qix_.pages = (n + o_.page_tokens - 1) / o_.page_tokens;
    qix_.kmin.resize(size_t(H) * qix_.pages * d);
    qix_.kmax.resize(size_t(H) * qix_.pages * d);
    for (int h = 0; h < H; ++h) {
      std::copy_n(m.kmin.data() + size_t(h) * cap_pages * d, size_t(qix_.pages) * d,
                  qix_.kmin.data() + size_t(h) * qix_.pages * d);
      std::copy_n(m.kmax.data() + size_t(h) * cap_pages * d, size_t(qix_.pages) * d,
                  qix_.kmax.data() + size_t(h) * qix_.pages * d);
    }
    QuestOptions qo;
    qo.token_budget = o_.token_budget;
    qo.decode = dec;
    QuestStats qst;
    st = QuestDecode(view, qix_, heads, qs, out_, qo, &qst);
    ++stats_.steps;
    stats_.tokens_read += qst.tokens_read;
    stats_.tokens_total += uint64_t(n) * H;
    if (st.ok() && o_.check) {
      exact_.resize(out_.size());
      ExactDecode(view, heads, qs, exact_);
      for (int h = 0; h < heads; ++h) stats_.rel_err_sum += RelErr(h, d), ++stats_.rel_err_count;
    }
  } else {
    six_.vnorm.resize(size_t(H) * n);
    for (int h = 0; h < H; ++h)
      std::copy_n(m.vnorm.data() + size_t(h) * o_.capacity, n, six_.vnorm.data() + size_t(h) * n);
    SamplerOptions so = o_.sampler;
    so.decode = dec;
    so.seed = o_.sampler.seed + 1000003 * stats_.steps;  // fresh noise per step
    st = CertifiedDecode(view, six_, heads, qs, out_, so, &certs_);
    ++stats_.steps;
    if (st.ok()) {
      if (o_.check) {
        exact_.resize(out_.size());
        ExactDecode(view, heads, qs, exact_);
      }
      for (int h = 0; h < heads; ++h) {
        stats_.tokens_read += certs_[h].sampled;
        stats_.tokens_total += n;
        if (certs_[h].level < 0) ++stats_.exact_fallbacks;
        if (!o_.check) continue;
        const double err = RelErr(h, d);
        stats_.rel_err_sum += err;
        ++stats_.rel_err_count;
        if (certs_[h].certified) {
          ++stats_.certified;
          if (err > so.epsilon) ++stats_.violated;
        }
      }
    }
  }
  if (!st.ok()) {
    status_ = st;
    return;
  }
  std::copy(out_.begin(), out_.end(), o);
}

model::Transformer::AttentionHook SparseAttention::Hook() {
  return [this](int layer, uint32_t pos0, uint32_t n, const float* q, const model::KvCache& cache, float* o) {
    if (pos0 + n > o_.capacity) {
      if (status_.ok())
        status_ = Status::InvalidArgument("sparse attention: position " + std::to_string(pos0 + n - 1) +
                                          " past the mirror's capacity " + std::to_string(o_.capacity));
      std::fill(o, o + size_t(n) * c_.dim, 0.0f);
      return;
    }
    LayerMirror& m = layers_[layer];
    if (pos0 < m.filled) Truncate(layer, pos0);  // a new pass from an earlier position (new tokens there)
    // Positions before this call that the mirror lacks (the context) first.
    for (uint32_t p = m.filled; p < pos0; ++p) Append(layer, cache, p);
    for (uint32_t t = 0; t < n; ++t) {
      const uint32_t p = pos0 + t;
      Append(layer, cache, p);
      Step(layer, p, q + size_t(t) * c_.dim, o + size_t(t) * c_.dim);
    }
  };
}

}  // namespace flatkv::attention
