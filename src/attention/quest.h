// Quest (Tang et al., ICML 2024): query-aware page selection at decode time.
// Keys are grouped in pages of page_tokens (16) tokens; each page keeps the
// per-channel min and max of its keys (f16, like the cache). For a query q a
// page's score upper bound is sum_j max(q_j min_j, q_j max_j) >= q . k for
// every key k in the page; the pages with the highest bounds, up to a token
// budget, are read exactly (online softmax over them, as DenseDecode), the
// rest are skipped. With GQA, a page's bound is the max over the group's
// query heads, so each KV head reads one page set. The newest page is
// always read. Layers 0-1 stay dense in a model (Quest's recipe): that is
// the caller's choice per layer (QuestOptions::dense).
//
// Thread-safety: a QuestIndex is read-only after Build; decoding is reentrant.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "attention/decode.h"

namespace flatkv::attention {

struct QuestIndex {
  uint32_t page_tokens = 16;
  uint32_t pages = 0;           // per KV head: ceil(n_tokens / page_tokens)
  std::vector<uint16_t> kmin;   // [kvh][page][d], f16
  std::vector<uint16_t> kmax;
};

// Builds the bounds of every page of `cache` (an engine updates the last
// page as tokens arrive; here it is built once).
[[nodiscard]] Result<QuestIndex> BuildQuestIndex(const F16Cache& cache, uint32_t page_tokens = 16);

struct QuestOptions {
  uint32_t token_budget = 4096;  // tokens read per KV head (rounded up to whole pages)
  bool dense = false;            // read everything (layers 0-1)
  DecodeOptions decode;
};

struct QuestStats {
  uint64_t pages_read = 0;       // over KV heads
  uint64_t tokens_read = 0;
  std::vector<std::vector<uint32_t>> pages;  // per KV head: the pages read, ascending
};

[[nodiscard]] Status QuestDecode(const F16Cache& cache, const QuestIndex& index, int n_heads, std::span<const float> q,
                                 std::span<float> out, const QuestOptions& o, QuestStats* stats = nullptr);

}  // namespace flatkv::attention
