#include "codec/synthetic_kv.h"

#include <cmath>
#include <vector>

#include "codec/dtype.h"
#include "common/random.h"

namespace flatkv::codec {
namespace {

// A deterministic standard normal for (seed, a, b, c).
float Gauss(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  const uint64_t h1 = SplitMix64(seed ^ SplitMix64(a ^ SplitMix64(b ^ SplitMix64(c))));
  const uint64_t h2 = SplitMix64(h1);
  const double u1 = (double(h1 >> 11) + 0.5) / 9007199254740992.0;
  const double u2 = double(h2 >> 11) / 9007199254740992.0;
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}
float Uniform(uint64_t seed, uint64_t a, uint64_t b) {
  return float(double(SplitMix64(seed ^ SplitMix64(a ^ SplitMix64(b + 77))) >> 11) / 9007199254740992.0);
}

uint32_t Position(const SliceLayout& l, uint32_t t) {
  return (l.first_position == SliceLayout::kUnknownPosition ? 0 : l.first_position) + t;
}

// The drifting per-token component: an AR(1) over absolute positions,
// computed from a short window so a slice needs no earlier slices.
float Drift(uint64_t seed, uint64_t stream, uint32_t pos, uint32_t ch, float rho) {
  constexpr int kWindow = 12;
  float acc = 0, w = 1;
  for (int j = 0; j < kWindow && uint32_t(j) <= pos; ++j, w *= rho) acc += w * Gauss(seed, stream, pos - j, ch);
  return acc * std::sqrt(1 - rho * rho);
}

// One key vector (dim floats, dim even) of `head` at `pos`, after RoPE.
void KeyVector(uint64_t seed, uint32_t layer, uint32_t head, uint32_t pos, uint32_t dim, float* out) {
  const uint64_t hs = (uint64_t(layer) << 32) | head;
  for (uint32_t c = 0; c < dim; ++c) {
    // Channel scale: mostly ~1, a few outliers (fixed per layer/head).
    float scale = 0.6f + 0.8f * Uniform(seed, hs, c);
    const bool outlier = Uniform(seed ^ 0x0071u, hs, c) < 4.0f / 128.0f;
    if (outlier) scale *= 8.0f + 7.0f * Uniform(seed ^ 0x0072u, hs, c);
    const float mean = Gauss(seed ^ 0x00A1u, hs, c, 0) * (outlier ? 1.0f : 0.5f);
    out[c] = scale * (mean + 0.35f * Drift(seed ^ 0x00B2u, hs, pos, c, 0.9f));
  }
  for (uint32_t f = 0; f < dim / 2; ++f) {
    const double freq = std::pow(kSyntheticRopeTheta, -2.0 * f / dim);
    const float cr = float(std::cos(pos * freq)), ci = float(std::sin(pos * freq));
    const float a = out[2 * f], b = out[2 * f + 1];
    out[2 * f] = a * cr - b * ci;
    out[2 * f + 1] = a * ci + b * cr;
  }
}

// One value vector (dim floats) of `head` at `pos`: smooth, per-token scale.
void ValueVector(uint64_t seed, uint32_t layer, uint32_t head, uint32_t pos, uint32_t dim, float* out) {
  const uint64_t hs = (uint64_t(layer) << 32) | (head + 0x10000u);
  const float token_scale = 0.5f + Uniform(seed ^ 0x00C3u, hs, pos);
  for (uint32_t c = 0; c < dim; ++c) {
    const float mean = 0.3f * Gauss(seed ^ 0x00D4u, hs, c, 0);
    out[c] = token_scale * (mean + 0.6f * Drift(seed ^ 0x00E5u, hs, pos, c, 0.8f));
  }
}

}  // namespace

void FillSyntheticKv(const SliceLayout& layout, uint64_t seed, std::span<std::byte> out) {
  const KvShape& s = layout.shape;
  const DType dt = s.dtype;
  const size_t esz = DTypeBytes(dt);
  std::vector<float> row;
  if (s.kind == AttentionKind::kMla) {
    const uint32_t w = s.latent_dim + s.rope_dim;
    row.resize(w + 1);
    for (uint32_t t = 0; t < layout.tokens; ++t) {
      const uint32_t pos = Position(layout, t);
      ValueVector(seed, layout.layer, 0, pos, s.latent_dim, row.data());
      KeyVector(seed, layout.layer, 0, pos, s.rope_dim & ~1u, row.data() + s.latent_dim);
      if (s.rope_dim & 1) row[w - 1] = Gauss(seed, layout.layer, pos, 99);
      FromFloat(dt, row.data(), out.data() + size_t(t) * w * esz, w);
    }
    return;
  }
  const uint32_t heads = s.kv_heads, dim = s.head_dim, kv_dim = heads * dim;
  row.resize(dim + 1);
  for (int part = 0; part < 2; ++part)
    for (uint32_t t = 0; t < layout.tokens; ++t)
      for (uint32_t h = 0; h < heads; ++h) {
        const uint32_t pos = Position(layout, t);
        if (part == 0) {
          KeyVector(seed, layout.layer, h, pos, dim & ~1u, row.data());
          if (dim & 1) row[dim - 1] = Gauss(seed, layout.layer, pos, 98);
        } else {
          ValueVector(seed, layout.layer, h, pos, dim, row.data());
        }
        const size_t at = (size_t(part) * layout.tokens + t) * kv_dim + size_t(h) * dim;
        FromFloat(dt, row.data(), out.data() + at * esz, dim);
      }
}

void FillSyntheticQueries(const SliceLayout& layout, uint32_t query_heads, uint64_t seed, std::span<float> out) {
  const KvShape& s = layout.shape;
  const bool mla = s.kind == AttentionKind::kMla;
  const uint32_t dim = mla ? s.latent_dim + s.rope_dim : s.head_dim;
  const uint32_t group = mla ? query_heads : std::max(1u, query_heads / std::max(1u, s.kv_heads));
  std::vector<float> key(dim + 1);
  for (uint32_t t = 0; t < layout.tokens; ++t) {
    const uint32_t pos = Position(layout, t);
    for (uint32_t q = 0; q < query_heads; ++q) {
      float* o = out.data() + (size_t(t) * query_heads + q) * dim;
      const uint32_t kv_head = mla ? 0 : q / group;
      // Lean towards the key "mean direction" at this position: a key
      // vector of the same head with its own drift, plus isotropic noise.
      if (mla) {
        ValueVector(seed ^ 0x5151u, layout.layer, 0, pos, s.latent_dim, o);
        KeyVector(seed, layout.layer, 0, pos, s.rope_dim & ~1u, key.data());
        for (uint32_t c = 0; c < s.rope_dim; ++c) o[s.latent_dim + c] = c < (s.rope_dim & ~1u) ? key[c] : 0.0f;
      } else {
        KeyVector(seed, layout.layer, kv_head, pos, dim & ~1u, key.data());
        for (uint32_t c = 0; c < dim; ++c) o[c] = (c < (dim & ~1u) ? key[c] : 0.0f);
      }
      const float inv = 1.0f / std::sqrt(float(dim));
      for (uint32_t c = 0; c < dim; ++c) o[c] = o[c] * 0.15f + inv * 2.0f * Gauss(seed ^ 0x7777u, pos, q, c);
    }
  }
}

}  // namespace flatkv::codec
