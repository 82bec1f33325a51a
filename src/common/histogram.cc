#include "common/histogram.h"

#include <algorithm>
#include <cmath>

namespace flatkv {

void LatencyHistogram::Record(double micros) {
  double v = std::max(micros, 1.0);
  int b = std::clamp(static_cast<int>(std::log2(v) * 8.0), 0, kBuckets - 1);
  buckets_[b].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  uint64_t m = static_cast<uint64_t>(micros);
  uint64_t prev = max_.load(std::memory_order_relaxed);
  while (m > prev && !max_.compare_exchange_weak(prev, m, std::memory_order_relaxed)) {
  }
}

double LatencyHistogram::Percentile(double q) const {
  uint64_t total = Count();
  if (total == 0) return 0;
  uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total)));
  rank = std::max<uint64_t>(rank, 1);
  uint64_t seen = 0;
  for (int b = 0; b < kBuckets; ++b) {
    seen += buckets_[b].load(std::memory_order_relaxed);
    if (seen >= rank) return std::min(std::exp2((b + 0.5) / 8.0), Max());
  }
  return Max();
}

}  // namespace flatkv
