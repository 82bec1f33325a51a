// Metrics of the daemon: per-tenant request counters and latency
// histograms, server-wide connection and queue gauges, and their rendering
// as Prometheus text (/metrics) and JSON (/stats) together with the store's
// own StoreStats.
//
// Thread-safety: every counter is an atomic; record from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "flatkv/options.h"
#include "flatkv/stats.h"

namespace flatkv::service {

// A Prometheus histogram of latencies in microseconds with fixed buckets.
class PromHistogram {
 public:
  static constexpr std::array<double, 16> kBoundsUs = {10,    25,    50,     100,    200,    500,    1000,   2500,
                                                       5000, 10000, 25000, 50000, 100000, 250000, 1000000, 5000000};
  void Record(double us);
  uint64_t Count() const { return count_.load(std::memory_order_relaxed); }
  // Appends `name_bucket{labels,le=...}` lines, `_sum` and `_count` (seconds).
  void Render(const std::string& name, const std::string& labels, std::string* out) const;
  // Percentile estimate from the buckets (upper bound of the bucket), us.
  double Percentile(double q) const;

 private:
  std::array<std::atomic<uint64_t>, kBoundsUs.size() + 1> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_ns_{0};
};

struct TenantMetrics {
  std::atomic<uint64_t> lookups{0}, lookup_keys{0}, lookup_hit_blocks{0};
  std::atomic<uint64_t> puts{0}, put_blocks{0}, put_bytes{0};
  std::atomic<uint64_t> restores{0}, restore_keys{0}, restore_miss_blocks{0};
  std::atomic<uint64_t> restore_hit_dram{0}, restore_hit_ssd{0}, restore_hit_remote{0};
  std::atomic<uint64_t> restore_bytes_stream{0}, restore_bytes_shm{0};
  std::atomic<uint64_t> errors{0};
  PromHistogram lookup_us, put_us, restore_us;
};

struct ServerMetrics {
  std::atomic<uint64_t> connections_total{0}, connections_active{0}, connections_refused{0};
  std::atomic<uint64_t> auth_failures{0}, frame_errors{0}, requests_in_flight{0}, deadline_exceeded{0};
  std::atomic<uint64_t> shm_windows{0}, shm_bytes{0};
};

struct TenantView {  // what rendering needs to know of a tenant
  std::string name;
  const TenantMetrics* metrics = nullptr;
  uint64_t quota_bytes = 0, used_bytes = 0, dropped_sessions = 0;
  uint64_t dram_bytes = 0;      // store DRAM its sessions hold (StoreStats::tenant_dram_bytes)
  uint64_t retained_bytes = 0;  // its unexpired retains
};

// `tenant_names`: label per-tenant series tenant="<name>" (escaped); false:
// tenant="<position in `tenants`>", which is the [[tenants]] order, so a
// scrape reveals no tenant names (config key metrics.tenant_labels).
std::string RenderPrometheus(const StoreStats& store, const ServerMetrics& server,
                             const std::vector<TenantView>& tenants, bool tenant_names);
// A Prometheus label value: backslash, double quote and newline escaped.
std::string PromLabelValue(std::string_view v);
// `options`: the store's, reported under "options" with ssd_dirs as their
// number, not their paths (a tenant has no business knowing the daemon's
// filesystem).
std::string RenderStatsJson(const StoreStats& store, const StoreOptions& options, const ServerMetrics& server,
                            const std::vector<TenantView>& tenants);

// Whether an HTTP request head (request line and headers) carries
// `Authorization: Bearer <token>` with exactly `token`, compared in constant
// time (as SHA-256 digests). Always false for an empty `token`.
bool HttpBearerMatches(std::string_view request_head, std::string_view token);

}  // namespace flatkv::service
