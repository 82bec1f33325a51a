// LatencyHistogram: log-bucketed latencies for percentile reporting.
// Buckets grow by 2^(1/8) (about 9% relative error) from 1 us to ~1 hour.
// Thread-safety: Record and Percentile are safe to call concurrently.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace flatkv {

class LatencyHistogram {
 public:
  void Record(double micros);
  // q in [0, 1]; 0 when empty.
  double Percentile(double q) const;
  double Max() const { return static_cast<double>(max_.load(std::memory_order_relaxed)); }
  uint64_t Count() const { return count_.load(std::memory_order_relaxed); }

 private:
  static constexpr int kBuckets = 8 * 32;
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> max_{0};
};

}  // namespace flatkv
