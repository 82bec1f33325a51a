#include "attention/quest.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "attention/f16.h"

namespace flatkv::attention {

Result<QuestIndex> BuildQuestIndex(const F16Cache& cache, uint32_t page_tokens) {
  if (page_tokens == 0 || cache.n_tokens == 0 || cache.head_dim <= 0 || cache.n_kv_heads <= 0)
    return Status::InvalidArgument("quest: page_tokens " + std::to_string(page_tokens) + " over " +
                                   std::to_string(cache.n_tokens) + " tokens");
  QuestIndex ix;
  ix.page_tokens = page_tokens;
  ix.pages = (cache.n_tokens + page_tokens - 1) / page_tokens;
  const int d = cache.head_dim;
  const size_t size = static_cast<size_t>(cache.n_kv_heads) * ix.pages * d;
  ix.kmin.resize(size);
  ix.kmax.resize(size);
  std::vector<float> lo(d), hi(d);
  for (int h = 0; h < cache.n_kv_heads; ++h)
    for (uint32_t p = 0; p < ix.pages; ++p) {
      std::fill(lo.begin(), lo.end(), INFINITY);
      std::fill(hi.begin(), hi.end(), -INFINITY);
      const uint32_t t1 = std::min(cache.n_tokens, (p + 1) * page_tokens);
      for (uint32_t t = p * page_tokens; t < t1; ++t)
        for (int j = 0; j < d; ++j) {
          const float x = HalfToFloat(cache.k_row(h, t)[j]);
          lo[j] = std::min(lo[j], x);
          hi[j] = std::max(hi[j], x);
        }
      const size_t base = (static_cast<size_t>(h) * ix.pages + p) * d;
      for (int j = 0; j < d; ++j) {  // f16 values: min and max are exact in f16
        ix.kmin[base + j] = FloatToHalf(lo[j]);
        ix.kmax[base + j] = FloatToHalf(hi[j]);
      }
    }
  return ix;
}

Status QuestDecode(const F16Cache& cache, const QuestIndex& index, int n_heads, std::span<const float> q,
                   std::span<float> out, const QuestOptions& o, QuestStats* stats) {
  FLATKV_RETURN_IF_ERROR(cache.Validate(n_heads, q.size(), out.size()));
  if (index.pages != (cache.n_tokens + index.page_tokens - 1) / index.page_tokens ||
      index.kmin.size() != static_cast<size_t>(cache.n_kv_heads) * index.pages * cache.head_dim)
    return Status::InvalidArgument("quest: the index covers " + std::to_string(index.pages) + " pages of " +
                                   std::to_string(index.page_tokens) + ", the cache has " +
                                   std::to_string(cache.n_tokens) + " tokens");
  if (o.dense) return DenseDecode(cache, n_heads, q, out, o.decode);
  const DecodeKernels& k = KernelsFor(std::min(o.decode.simd, DetectedSimd()));
  const int group = n_heads / cache.n_kv_heads, d = cache.head_dim;
  const uint32_t pt = index.page_tokens;
  const uint32_t want = std::min(index.pages, std::max<uint32_t>(1, (o.token_budget + pt - 1) / pt));
  std::vector<Partial> parts(static_cast<size_t>(n_heads));
  std::vector<uint64_t> pages_read(cache.n_kv_heads), tokens_read(cache.n_kv_heads);
  std::vector<std::vector<uint32_t>> pages(cache.n_kv_heads);
  ParallelFor(o.decode.threads, static_cast<size_t>(cache.n_kv_heads), [&](size_t item) {
    const int kvh = static_cast<int>(item);
    const float* qg = q.data() + static_cast<size_t>(kvh) * group * d;
    // Bounds: max over the group of sum_j max(q_j lo_j, q_j hi_j); one f16
    // min row and one max row per page, split by the sign of q_j.
    std::vector<float> bound(index.pages, -INFINITY);
    std::vector<float> qpos(static_cast<size_t>(group) * d), qneg(qpos.size());
    for (size_t i = 0; i < qpos.size(); ++i) {
      qpos[i] = std::max(qg[i], 0.0f);
      qneg[i] = std::min(qg[i], 0.0f);
    }
    const uint16_t* lo = index.kmin.data() + static_cast<size_t>(kvh) * index.pages * d;
    const uint16_t* hi = index.kmax.data() + static_cast<size_t>(kvh) * index.pages * d;
    for (uint32_t p = 0; p < index.pages; ++p)  // page-major: a page's rows stay in L1 for the group
      for (int h = 0; h < group; ++h) {
        const float b = k.dot_row(qpos.data() + h * d, hi + size_t{p} * d, d) +
                        k.dot_row(qneg.data() + h * d, lo + size_t{p} * d, d);
        bound[p] = std::max(bound[p], b);
      }
    std::vector<uint32_t> order(index.pages - 1);  // every page but the newest, which is always read
    std::iota(order.begin(), order.end(), 0u);
    const uint32_t pick = want - 1;
    if (pick < order.size())
      std::nth_element(order.begin(), order.begin() + pick, order.end(),
                       [&](uint32_t a, uint32_t b) { return bound[a] != bound[b] ? bound[a] > bound[b] : a > b; });
    order.resize(pick);
    order.push_back(index.pages - 1);
    std::sort(order.begin(), order.end());
    std::vector<float> scratch;
    std::vector<Partial> chunk(group);
    Partial* total = parts.data() + static_cast<size_t>(kvh) * group;
    uint64_t tokens = 0;
    for (size_t i = 0; i < order.size();) {  // runs of consecutive pages in one kernel call
      size_t j = i + 1;
      while (j < order.size() && order[j] == order[j - 1] + 1 && (j - i) * pt < 1024) ++j;
      const uint32_t t0 = order[i] * pt, t1 = std::min(cache.n_tokens, (order[j - 1] + 1) * pt);
      ChunkPartials(k, cache, kvh, group, qg, t0, t1, scratch, chunk.data());
      for (int h = 0; h < group; ++h) MergePartial(total[h], chunk[h]);
      tokens += t1 - t0;
      i = j;
    }
    pages_read[kvh] = order.size();
    if (stats) pages[kvh] = order;
    tokens_read[kvh] = tokens;
  });
  for (int h = 0; h < n_heads; ++h)
    for (int j = 0; j < d; ++j) out[static_cast<size_t>(h) * d + j] = static_cast<float>(parts[h].acc[j] / parts[h].l);
  if (stats) {
    stats->pages_read = std::accumulate(pages_read.begin(), pages_read.end(), uint64_t{0});
    stats->tokens_read = std::accumulate(tokens_read.begin(), tokens_read.end(), uint64_t{0});
    stats->pages = std::move(pages);
  }
  return Status::Ok();
}

}  // namespace flatkv::attention
