#include "attention/compact.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "model/fp_math.h"

namespace flatkv::attention {
namespace {

constexpr char kMagic[8] = {'F', 'K', 'V', 'C', 'M', 'P', 'T', '1'};
constexpr uint32_t kVersion = 1;
constexpr uint32_t kHeaderBytes = 40;
constexpr uint32_t kNoPos = std::numeric_limits<uint32_t>::max();

uint64_t SliceBytes(const model::Config& c, uint32_t bt) { return uint64_t{2} * bt * c.kv_dim() * sizeof(float); }

uint64_t MetaBytes(int n_kv_heads, uint32_t slots) { return kHeaderBytes + 4ull * n_kv_heads * (1ull + slots); }

uint32_t MetaBlocks(const model::Config& c, uint32_t slots, uint32_t bt) {
  const uint64_t s = SliceBytes(c, bt);
  return static_cast<uint32_t>((MetaBytes(c.n_kv_heads, slots) + s - 1) / s);
}

void PutU32(std::byte* p, uint32_t v) { std::memcpy(p, &v, 4); }
uint32_t GetU32(const std::byte* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

}  // namespace

uint64_t CompactedKv::kept_entries() const {
  uint64_t n = 0;
  for (const Head& h : heads) n += h.pos.size();
  return n;
}

uint32_t CompactedKv::max_count() const {
  size_t m = 0;
  for (const Head& h : heads) m = std::max(m, h.pos.size());
  return static_cast<uint32_t>(m);
}

bool CompactedKv::operator==(const CompactedKv& o) const {
  if (n_layers != o.n_layers || n_kv_heads != o.n_kv_heads || head_dim != o.head_dim || prefix_len != o.prefix_len ||
      heads.size() != o.heads.size())
    return false;
  for (size_t i = 0; i < heads.size(); ++i) {
    const Head &a = heads[i], &b = o.heads[i];
    if (a.pos != b.pos || a.k.size() != b.k.size() || a.v.size() != b.v.size()) return false;
    // Bitwise (NaN payloads and -0 included); empty vectors may have null data.
    if (!a.k.empty() && std::memcmp(a.k.data(), b.k.data(), a.k.size() * 4) != 0) return false;
    if (!a.v.empty() && std::memcmp(a.v.data(), b.v.data(), a.v.size() * 4) != 0) return false;
  }
  return true;
}

void GatherLayer(const model::KvCache& cache, int layer, int n_kv_heads, int head_dim, uint32_t n,
                 std::vector<float>& k, std::vector<float>& v) {
  k.resize(static_cast<size_t>(n_kv_heads) * n * head_dim);
  v.resize(k.size());
  for (int h = 0; h < n_kv_heads; ++h)
    for (uint32_t t = 0; t < n; ++t) {
      const size_t dst = (static_cast<size_t>(h) * n + t) * head_dim;
      std::copy_n(cache.k(layer, t) + h * head_dim, head_dim, k.data() + dst);
      std::copy_n(cache.v(layer, t) + h * head_dim, head_dim, v.data() + dst);
    }
}

Result<CompactedKv> Compact(const model::KvCache& cache, const model::Config& c, uint32_t prefix_len,
                            const Selection& sel) {
  if (prefix_len > cache.max_positions())
    return Status::InvalidArgument("compact: prefix_len " + std::to_string(prefix_len) + " exceeds the cache's " +
                                   std::to_string(cache.max_positions()));
  if (sel.size() != static_cast<size_t>(c.n_layers))
    return Status::InvalidArgument("compact: selection has " + std::to_string(sel.size()) + " layers, model " +
                                   std::to_string(c.n_layers));
  CompactedKv out;
  out.n_layers = c.n_layers;
  out.n_kv_heads = c.n_kv_heads;
  out.head_dim = c.head_size();
  out.prefix_len = prefix_len;
  out.heads.resize(static_cast<size_t>(c.n_layers) * c.n_kv_heads);
  const int hs = c.head_size();
  for (int l = 0; l < c.n_layers; ++l) {
    if (sel[l].size() != static_cast<size_t>(c.n_kv_heads))
      return Status::InvalidArgument("compact: layer " + std::to_string(l) + " selects " + std::to_string(sel[l].size()) +
                                     " heads, model has " + std::to_string(c.n_kv_heads));
    for (int h = 0; h < c.n_kv_heads; ++h) {
      CompactedKv::Head& head = out.at(l, h);
      const std::vector<uint32_t>& idx = sel[l][h];
      for (size_t i = 0; i < idx.size(); ++i) {
        if (idx[i] >= prefix_len || (i > 0 && idx[i] <= idx[i - 1]))
          return Status::InvalidArgument("compact: layer " + std::to_string(l) + " head " + std::to_string(h) +
                                         " index " + std::to_string(idx[i]) + " out of order or >= prefix " +
                                         std::to_string(prefix_len));
        head.pos.push_back(idx[i]);
        head.k.insert(head.k.end(), cache.k(l, idx[i]) + h * hs, cache.k(l, idx[i]) + (h + 1) * hs);
        head.v.insert(head.v.end(), cache.v(l, idx[i]) + h * hs, cache.v(l, idx[i]) + (h + 1) * hs);
      }
    }
  }
  return out;
}

Result<CompactedKv> ScoreAndCompact(const model::KvCache& cache, const model::Config& c, uint32_t prefix_len,
                                    std::span<const float> queries, const CompactOptions& o) {
  if (o.scorer == nullptr) return Status::InvalidArgument("compact: no scorer");
  const int hs = c.head_size();
  const size_t per_layer = static_cast<size_t>(c.n_heads) * prefix_len * hs;
  if (queries.size() != per_layer * c.n_layers)
    return Status::InvalidArgument("compact: " + std::to_string(queries.size()) + " query floats, expected " +
                                   std::to_string(per_layer * c.n_layers));
  if (prefix_len == 0) return Status::InvalidArgument("compact: empty prefix");
  const bool all_queries = o.scorer->uses_all_queries();
  const uint32_t w = all_queries ? prefix_len : std::min(std::max(o.window, o.scorer->recent_queries()), prefix_len);
  std::vector<uint32_t> qpos(w);
  for (uint32_t j = 0; j < w; ++j) qpos[j] = prefix_len - w + j;
  std::vector<HeadScores> scores;
  std::vector<float> k, v, q(static_cast<size_t>(c.n_heads) * w * hs);
  for (int l = 0; l < c.n_layers; ++l) {
    GatherLayer(cache, l, c.n_kv_heads, hs, prefix_len, k, v);
    const float* ql = queries.data() + per_layer * l;  // [h][t][d]
    for (int h = 0; h < c.n_heads; ++h)
      std::copy_n(ql + (static_cast<size_t>(h) * prefix_len + (prefix_len - w)) * hs, size_t{w} * hs,
                  q.data() + static_cast<size_t>(h) * w * hs);
    LayerKv kv{c.n_heads, c.n_kv_heads, hs, prefix_len, k, v, {}, QueryBlock{q, qpos}};
    ScoreContext ctx;
    ctx.layer = l;
    ctx.n_layers = c.n_layers;
    if (static_cast<size_t>(l) < o.phases.size()) ctx.phases = o.phases[l];
    if (static_cast<size_t>(l) < o.probes.size()) ctx.probes = o.probes[l];
    FLATKV_ASSIGN_OR_RETURN(HeadScores s, o.scorer->Score(kv, ctx));
    scores.push_back(std::move(s));
  }
  FLATKV_ASSIGN_OR_RETURN(Selection sel, Allocate(o.allocator, scores, o.budget));
  return Compact(cache, c, prefix_len, sel);
}

model::Transformer::AttentionHook CompactedAttention(const CompactedKv& ckv, const model::Config& c) {
  return [&ckv, c, att = std::vector<float>()](int layer, uint32_t pos0, uint32_t n, const float* q,
                                               const model::KvCache& cache, float* o) mutable {
    using model::fp::kLanes;
    const int dim = c.dim, kv_dim = c.kv_dim(), hs = c.head_size(), group = c.n_heads / c.n_kv_heads;
    const uint32_t bt = cache.block_tokens(), base = ckv.prefix_len;
    const float sqrt_hs = std::sqrt(static_cast<float>(hs));
    for (uint32_t t = 0; t < n; ++t) {
      const uint32_t p = pos0 + t;  // >= base: new tokens only
      for (int h = 0; h < c.n_heads; ++h) {
        const CompactedKv::Head& kept = ckv.at(layer, h / group);
        const int kv_off = (h / group) * hs;
        const uint32_t nk = static_cast<uint32_t>(kept.pos.size()), len = nk + (p + 1 - base);
        if (att.size() < len) att.resize(len);
        const float* qh = q + static_cast<size_t>(t) * dim + h * hs;
        // Same reduction order as the dense Attention (transformer.cc):
        // scores in position order, Exp, Sum, divide, V rows in order.
        float max = -INFINITY;
        for (uint32_t s = 0; s < nk; ++s) {
          att[s] = model::fp::Dot(qh, kept.k.data() + static_cast<size_t>(s) * hs, hs) / sqrt_hs;
          max = std::max(max, att[s]);
        }
        for (uint32_t s = base; s <= p; ++s) {
          float& a = att[nk + (s - base)];
          a = model::fp::Dot(qh, cache.k(layer, s) + kv_off, hs) / sqrt_hs;
          max = std::max(max, a);
        }
        for (uint32_t s = 0; s < len; ++s) att[s] = model::fp::Exp(att[s] - max);
        const float sum = model::fp::Sum(att.data(), static_cast<int>(len));
        for (uint32_t s = 0; s < len; ++s) att[s] /= sum;
        float* oh = o + static_cast<size_t>(t) * dim + h * hs;
        for (int i0 = 0; i0 < hs; i0 += kLanes) {
          const int m = std::min(kLanes, hs - i0);
          float acc[kLanes] = {};
          model::fp::WeightedSum(att.data(), kept.v.data() + i0, hs, static_cast<int>(nk), m, acc);
          for (uint32_t s0 = base; s0 <= p;) {  // the dense cache, one block's contiguous rows at a time
            const uint32_t s1 = std::min(p + 1, (s0 / bt + 1) * bt);
            model::fp::WeightedSum(att.data() + nk + (s0 - base), cache.v(layer, s0) + kv_off + i0, kv_dim,
                                   static_cast<int>(s1 - s0), m, acc);
            s0 = s1;
          }
          std::copy(acc, acc + m, oh + i0);
        }
      }
    }
  };
}

uint32_t CompactedBlocks(const CompactedKv& ckv, uint32_t bt) {
  model::Config c;
  c.n_kv_heads = ckv.n_kv_heads;
  c.n_heads = ckv.n_kv_heads;
  c.dim = ckv.n_kv_heads * ckv.head_dim;
  const uint32_t slots = ckv.max_count();
  return MetaBlocks(c, slots, bt) + (slots + bt - 1) / bt;
}

uint32_t MaxCompactedBlocks(const model::Config& c, uint32_t prefix_len, uint32_t bt) {
  return MetaBlocks(c, prefix_len, bt) + (prefix_len + bt - 1) / bt;
}

std::vector<std::byte> EncodeCompacted(const CompactedKv& ckv, uint32_t bt) {
  const int H = ckv.n_kv_heads, hs = ckv.head_dim, kv_dim = H * hs, L = ckv.n_layers;
  const uint64_t slice = uint64_t{2} * bt * kv_dim * sizeof(float);
  const uint32_t slots = ckv.max_count(), blocks = CompactedBlocks(ckv, bt);
  const uint32_t data_blocks = (slots + bt - 1) / bt, meta_blocks = blocks - data_blocks;
  std::vector<std::byte> out(uint64_t{blocks} * L * slice);
  // Slice (block b, layer l) sits at (b * L + l) * slice. A layer's metadata
  // spans the slices of blocks 0..meta_blocks-1 in order.
  std::vector<std::byte> meta(uint64_t{meta_blocks} * slice);
  for (int l = 0; l < L; ++l) {
    std::fill(meta.begin(), meta.end(), std::byte{0});
    std::memcpy(meta.data(), kMagic, 8);
    const uint32_t fields[8] = {kVersion, ckv.prefix_len, slots, uint32_t(H), uint32_t(hs), meta_blocks, data_blocks, uint32_t(l)};
    for (int i = 0; i < 8; ++i) PutU32(meta.data() + 8 + 4 * i, fields[i]);
    std::byte* counts = meta.data() + kHeaderBytes;
    std::byte* pos = counts + 4ull * H;
    for (int h = 0; h < H; ++h) {
      const CompactedKv::Head& head = ckv.at(l, h);
      PutU32(counts + 4 * h, static_cast<uint32_t>(head.pos.size()));
      for (uint32_t s = 0; s < slots; ++s)
        PutU32(pos + 4 * (uint64_t(h) * slots + s), s < head.pos.size() ? head.pos[s] : kNoPos);
    }
    for (uint32_t b = 0; b < meta_blocks; ++b)
      std::memcpy(out.data() + (uint64_t{b} * L + l) * slice, meta.data() + uint64_t{b} * slice, slice);
    // Slot blocks: like a KvCache page, K rows then V rows, slot-major.
    for (uint32_t j = 0; j < data_blocks; ++j) {
      auto* page = reinterpret_cast<float*>(out.data() + (uint64_t{meta_blocks + j} * L + l) * slice);
      for (int h = 0; h < H; ++h) {
        const CompactedKv::Head& head = ckv.at(l, h);
        for (uint32_t r = 0; r < bt; ++r) {
          const uint64_t s = uint64_t{j} * bt + r;
          if (s >= head.pos.size()) break;
          std::memcpy(page + uint64_t{r} * kv_dim + h * hs, head.k.data() + s * hs, hs * sizeof(float));
          std::memcpy(page + (uint64_t{bt} + r) * kv_dim + h * hs, head.v.data() + s * hs, hs * sizeof(float));
        }
      }
    }
  }
  return out;
}

Result<CompactedKv> DecodeCompacted(std::span<const std::byte> data, uint32_t blocks, const model::Config& c,
                                    uint32_t bt) {
  const int H = c.n_kv_heads, hs = c.head_size(), kv_dim = c.kv_dim(), L = c.n_layers;
  const uint64_t slice = SliceBytes(c, bt);
  if (blocks == 0 || data.size() != uint64_t{blocks} * L * slice)
    return Status::InvalidArgument("compacted: " + std::to_string(data.size()) + " bytes for " + std::to_string(blocks) +
                                   " blocks of " + std::to_string(L * slice));
  CompactedKv out;
  out.n_layers = L;
  out.n_kv_heads = H;
  out.head_dim = hs;
  out.heads.resize(static_cast<size_t>(L) * H);
  std::vector<std::byte> meta;
  for (int l = 0; l < L; ++l) {
    const std::byte* first = data.data() + uint64_t(l) * slice;
    if (std::memcmp(first, kMagic, 8) != 0) return Status::Corruption("compacted: layer " + std::to_string(l) + ": bad magic");
    uint32_t f[8];
    for (int i = 0; i < 8; ++i) f[i] = GetU32(first + 8 + 4 * i);
    const uint32_t version = f[0], prefix = f[1], slots = f[2], meta_blocks = f[5], data_blocks = f[6];
    if (version != kVersion) return Status::Corruption("compacted: version " + std::to_string(version) + " (expected 1)");
    if (f[3] != uint32_t(H) || f[4] != uint32_t(hs) || f[7] != uint32_t(l))
      return Status::Corruption("compacted: layer " + std::to_string(l) + " header names " + std::to_string(f[3]) +
                                " heads of " + std::to_string(f[4]) + " for layer " + std::to_string(f[7]));
    if (slots > prefix || meta_blocks != MetaBlocks(c, slots, bt) || data_blocks != (slots + bt - 1) / bt ||
        meta_blocks + data_blocks != blocks)
      return Status::Corruption("compacted: layer " + std::to_string(l) + ": " + std::to_string(slots) + " slots in " +
                                std::to_string(meta_blocks) + "+" + std::to_string(data_blocks) + " blocks, have " +
                                std::to_string(blocks));
    if (l == 0) out.prefix_len = prefix;
    if (prefix != out.prefix_len) return Status::Corruption("compacted: layers disagree on prefix_len");
    meta.resize(uint64_t{meta_blocks} * slice);
    for (uint32_t b = 0; b < meta_blocks; ++b)
      std::memcpy(meta.data() + uint64_t{b} * slice, data.data() + (uint64_t{b} * L + l) * slice, slice);
    const std::byte* pos = meta.data() + kHeaderBytes + 4ull * H;
    for (int h = 0; h < H; ++h) {
      const uint32_t count = GetU32(meta.data() + kHeaderBytes + 4 * h);
      if (count > slots)
        return Status::Corruption("compacted: layer " + std::to_string(l) + " head " + std::to_string(h) + " count " +
                                  std::to_string(count) + " > slots " + std::to_string(slots));
      CompactedKv::Head& head = out.at(l, h);
      head.k.resize(uint64_t{count} * hs);
      head.v.resize(uint64_t{count} * hs);
      for (uint32_t s = 0; s < count; ++s) {
        const uint32_t p = GetU32(pos + 4 * (uint64_t(h) * slots + s));
        if (p >= prefix || (s > 0 && p <= head.pos.back()))
          return Status::Corruption("compacted: layer " + std::to_string(l) + " head " + std::to_string(h) +
                                    " position " + std::to_string(p) + " out of order or >= " + std::to_string(prefix));
        head.pos.push_back(p);
        const auto* page = reinterpret_cast<const float*>(data.data() + (uint64_t{meta_blocks + s / bt} * L + l) * slice);
        std::memcpy(head.k.data() + uint64_t{s} * hs, page + uint64_t{s % bt} * kv_dim + h * hs, hs * sizeof(float));
        std::memcpy(head.v.data() + uint64_t{s} * hs, page + (uint64_t{bt} + s % bt) * kv_dim + h * hs, hs * sizeof(float));
      }
    }
  }
  return out;
}

}  // namespace flatkv::attention
