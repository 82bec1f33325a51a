#include "service/metrics.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "service/options_json.h"

namespace flatkv::service {
namespace {

// A sample value: the shortest text that reads back as exactly `v`, so byte
// counters past 1e9 stay exact; NaN and infinities as Prometheus spells them.
std::string Num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

// A histogram bound for its `le` label ("1e-05", "0.0001", "2.5"): a fixed
// spelling, since queries match the label's text.
std::string Le(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

uint64_t Get(const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); }

void Help(std::string* out, const std::string& name, const char* type, const char* help) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}
void Line(std::string* out, const std::string& name, const std::string& labels, double v) {
  *out += name + (labels.empty() ? "" : "{" + labels + "}") + " " + Num(v) + "\n";
}

std::array<unsigned char, 32> Digest(std::string_view v) {
  std::array<unsigned char, 32> d{};
  unsigned int n = 0;
  EVP_Digest(v.data(), v.size(), d.data(), &n, EVP_sha256(), nullptr);
  return d;
}

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

}  // namespace

std::string PromLabelValue(std::string_view v) {
  std::string out;
  for (char c : v) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

bool HttpBearerMatches(std::string_view head, std::string_view token) {
  if (token.empty()) return false;
  size_t pos = head.find('\n');  // skip the request line
  while (pos != std::string_view::npos && pos + 1 < head.size()) {
    const size_t start = pos + 1;
    size_t end = head.find('\n', start);
    std::string_view line = head.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    pos = end;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) break;  // end of the headers
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !IEquals(line.substr(0, colon), "authorization")) continue;
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    if (value.size() < 7 || !IEquals(value.substr(0, 7), "bearer ")) return false;
    value.remove_prefix(7);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    const auto got = Digest(value), want = Digest(token);
    return CRYPTO_memcmp(got.data(), want.data(), got.size()) == 0;
  }
  return false;
}

void PromHistogram::Record(double us) {
  size_t i = 0;
  while (i < kBoundsUs.size() && us > kBoundsUs[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(us * 1000.0), std::memory_order_relaxed);
}

void PromHistogram::Render(const std::string& name, const std::string& labels, std::string* out) const {
  uint64_t cum = 0;
  const std::string sep = labels.empty() ? "" : ",";
  for (size_t i = 0; i < kBoundsUs.size(); ++i) {
    cum += Get(buckets_[i]);
    Line(out, name + "_bucket", labels + sep + "le=\"" + Le(kBoundsUs[i] / 1e6) + "\"", double(cum));
  }
  cum += Get(buckets_[kBoundsUs.size()]);
  Line(out, name + "_bucket", labels + sep + "le=\"+Inf\"", double(cum));
  Line(out, name + "_sum", labels, double(Get(sum_ns_)) / 1e9);
  Line(out, name + "_count", labels, double(cum));
}

double PromHistogram::Percentile(double q) const {
  const uint64_t n = Count();
  if (n == 0) return 0;
  const double want = q * double(n);
  uint64_t cum = 0;
  for (size_t i = 0; i < kBoundsUs.size(); ++i) {
    cum += Get(buckets_[i]);
    if (double(cum) >= want) return kBoundsUs[i];
  }
  return kBoundsUs.back();
}

std::string RenderPrometheus(const StoreStats& s, const ServerMetrics& m, const std::vector<TenantView>& tenants,
                             bool tenant_names) {
  // One label per tenant: its name when the operator opted in, else its position.
  std::vector<std::string> label(tenants.size());
  for (size_t i = 0; i < tenants.size(); ++i)
    label[i] = "tenant=\"" + (tenant_names ? PromLabelValue(tenants[i].name) : std::to_string(i)) + "\"";
  auto L = [&](const TenantView& t) -> const std::string& { return label[size_t(&t - tenants.data())]; };
  std::string out;
  out.reserve(16 << 10);
  struct Med {
    const char* name;
    const MediumStats* st;
  } media[] = {{"dram", &s.dram}, {"ssd", &s.ssd}};
  Help(&out, "flatkv_capacity_bytes", "gauge", "Capacity of each medium.");
  for (auto& md : media) Line(&out, "flatkv_capacity_bytes", std::string("medium=\"") + md.name + "\"", double(md.st->capacity_bytes));
  Help(&out, "flatkv_used_bytes", "gauge", "Bytes of allocated extents per medium.");
  for (auto& md : media) Line(&out, "flatkv_used_bytes", std::string("medium=\"") + md.name + "\"", double(md.st->used_bytes));
  Help(&out, "flatkv_blocks", "gauge", "Blocks indexed per medium.");
  for (auto& md : media) Line(&out, "flatkv_blocks", std::string("medium=\"") + md.name + "\"", double(md.st->blocks));
  Help(&out, "flatkv_hit_blocks_total", "counter", "Blocks restored from each medium (all tenants).");
  for (auto& md : media) Line(&out, "flatkv_hit_blocks_total", std::string("medium=\"") + md.name + "\"", double(md.st->hit_blocks));
  Help(&out, "flatkv_bytes_written_total", "counter", "Payload bytes put per medium.");
  for (auto& md : media) Line(&out, "flatkv_bytes_written_total", std::string("medium=\"") + md.name + "\"", double(md.st->bytes_written));
  Help(&out, "flatkv_bytes_read_total", "counter", "Bytes read from each medium (SSD: including alignment padding).");
  for (auto& md : media) Line(&out, "flatkv_bytes_read_total", std::string("medium=\"") + md.name + "\"", double(md.st->bytes_read));
  Help(&out, "flatkv_bytes_delivered_total", "counter", "Payload bytes delivered by restores per medium.");
  for (auto& md : media) Line(&out, "flatkv_bytes_delivered_total", std::string("medium=\"") + md.name + "\"", double(md.st->bytes_delivered));
  Help(&out, "flatkv_evicted_blocks_total", "counter", "Blocks evicted per medium.");
  for (auto& md : media) Line(&out, "flatkv_evicted_blocks_total", std::string("medium=\"") + md.name + "\"", double(md.st->evicted_blocks));
  Help(&out, "flatkv_queue_depth", "gauge", "I/O requests outstanding per medium.");
  for (auto& md : media) Line(&out, "flatkv_queue_depth", std::string("medium=\"") + md.name + "\"", double(md.st->queue_depth));
  Help(&out, "flatkv_max_queue_depth", "gauge", "The most I/O requests ever outstanding per medium.");
  for (auto& md : media) Line(&out, "flatkv_max_queue_depth", std::string("medium=\"") + md.name + "\"", double(md.st->max_queue_depth));
  Help(&out, "flatkv_ssd_read_amplification", "gauge", "Bytes read from SSD / bytes delivered from SSD.");
  Line(&out, "flatkv_ssd_read_amplification", "", s.ssd_read_amplification());
  Help(&out, "flatkv_store_events_total", "counter", "Store-wide events.");
  Line(&out, "flatkv_store_events_total", "event=\"restore\"", double(s.restores));
  Line(&out, "flatkv_store_events_total", "event=\"lookup_block\"", double(s.lookup_blocks));
  Line(&out, "flatkv_store_events_total", "event=\"miss_block\"", double(s.miss_blocks));
  Line(&out, "flatkv_store_events_total", "event=\"put_block\"", double(s.put_blocks));
  Line(&out, "flatkv_store_events_total", "event=\"dedup_block\"", double(s.dedup_blocks));
  Line(&out, "flatkv_store_events_total", "event=\"checksum_failure\"", double(s.checksum_failures));
  Line(&out, "flatkv_store_events_total", "event=\"io_error\"", double(s.io_errors));
  Line(&out, "flatkv_store_events_total", "event=\"dropped_block\"", double(s.dropped_blocks));
  // The remote tier (StoreOptions::remote), when there is one.
  if (s.remote.enabled) {
    const RemoteStats& r = s.remote;
    Help(&out, "flatkv_remote_events_total", "counter", "Remote-tier events (blocks unless named otherwise).");
    for (auto [event, v] : {std::pair{"hit_block", r.hit_blocks}, {"restored_block", r.restored_blocks},
                            {"lookup", r.lookups}, {"lookup_error", r.lookup_errors}, {"lookup_skipped", r.lookups_skipped},
                            {"stale_object", r.stale_objects}, {"missing_object", r.missing_objects},
                            {"published_block", r.published_blocks}, {"already_published_block", r.already_published_blocks},
                            {"publish_dropped_block", r.publish_dropped_blocks}, {"publish_error", r.publish_errors},
                            {"capacity_deleted_block", r.capacity_deleted_blocks}})
      Line(&out, "flatkv_remote_events_total", std::string("event=\"") + event + "\"", double(v));
    Help(&out, "flatkv_remote_bytes_total", "counter", "Object bytes read from and written to the remote tier.");
    Line(&out, "flatkv_remote_bytes_total", "direction=\"read\"", double(r.bytes_read));
    Line(&out, "flatkv_remote_bytes_total", "direction=\"written\"", double(r.published_bytes));
    Help(&out, "flatkv_remote_held_bytes", "gauge", "Cluster bytes this daemon published and keeps.");
    Line(&out, "flatkv_remote_held_bytes", "", double(r.held_bytes));
    Help(&out, "flatkv_remote_capacity_bytes", "gauge", "The daemon's cap on its cluster bytes (0: none).");
    Line(&out, "flatkv_remote_capacity_bytes", "", double(r.capacity_bytes));
    Help(&out, "flatkv_remote_publish_queue_bytes", "gauge", "Put data waiting to be published (at most the publish buffer).");
    Line(&out, "flatkv_remote_publish_queue_bytes", "", double(r.publish_queued_bytes));
  }
  Help(&out, "flatkv_sessions", "gauge", "Sessions holding extents.");
  Line(&out, "flatkv_sessions", "", double(s.sessions));

  Help(&out, "flatkv_connections", "gauge", "Open client connections.");
  Line(&out, "flatkv_connections", "", double(Get(m.connections_active)));
  Help(&out, "flatkv_server_events_total", "counter", "Server-wide events.");
  Line(&out, "flatkv_server_events_total", "event=\"connection\"", double(Get(m.connections_total)));
  Line(&out, "flatkv_server_events_total", "event=\"connection_refused\"", double(Get(m.connections_refused)));
  Line(&out, "flatkv_server_events_total", "event=\"auth_failure\"", double(Get(m.auth_failures)));
  Line(&out, "flatkv_server_events_total", "event=\"frame_error\"", double(Get(m.frame_errors)));
  Line(&out, "flatkv_server_events_total", "event=\"deadline_exceeded\"", double(Get(m.deadline_exceeded)));
  Help(&out, "flatkv_requests_in_flight", "gauge", "Requests being served now (the daemon's queue depth).");
  Line(&out, "flatkv_requests_in_flight", "", double(Get(m.requests_in_flight)));
  Help(&out, "flatkv_shm_window_bytes", "gauge", "Bytes of registered shared-memory windows.");
  Line(&out, "flatkv_shm_window_bytes", "", double(Get(m.shm_bytes)));

  Help(&out, "flatkv_tenant_requests_total", "counter", "Requests per tenant and kind.");
  for (const auto& t : tenants) {
    const std::string& l = L(t);
    Line(&out, "flatkv_tenant_requests_total", l + ",kind=\"lookup\"", double(Get(t.metrics->lookups)));
    Line(&out, "flatkv_tenant_requests_total", l + ",kind=\"put\"", double(Get(t.metrics->puts)));
    Line(&out, "flatkv_tenant_requests_total", l + ",kind=\"restore\"", double(Get(t.metrics->restores)));
    Line(&out, "flatkv_tenant_requests_total", l + ",kind=\"error\"", double(Get(t.metrics->errors)));
  }
  Help(&out, "flatkv_tenant_hit_blocks_total", "counter", "Restored blocks per tenant and medium.");
  for (const auto& t : tenants) {
    const std::string& l = L(t);
    Line(&out, "flatkv_tenant_hit_blocks_total", l + ",medium=\"dram\"", double(Get(t.metrics->restore_hit_dram)));
    Line(&out, "flatkv_tenant_hit_blocks_total", l + ",medium=\"ssd\"", double(Get(t.metrics->restore_hit_ssd)));
    Line(&out, "flatkv_tenant_hit_blocks_total", l + ",medium=\"remote\"", double(Get(t.metrics->restore_hit_remote)));
  }
  Help(&out, "flatkv_tenant_miss_blocks_total", "counter", "Keys asked for by restores that did not hit, per tenant.");
  for (const auto& t : tenants)
    Line(&out, "flatkv_tenant_miss_blocks_total", L(t), double(Get(t.metrics->restore_miss_blocks)));
  Help(&out, "flatkv_tenant_lookup_blocks_total", "counter", "Keys looked up and keys found, per tenant.");
  for (const auto& t : tenants) {
    const std::string& l = L(t);
    Line(&out, "flatkv_tenant_lookup_blocks_total", l + ",result=\"asked\"", double(Get(t.metrics->lookup_keys)));
    Line(&out, "flatkv_tenant_lookup_blocks_total", l + ",result=\"hit\"", double(Get(t.metrics->lookup_hit_blocks)));
  }
  Help(&out, "flatkv_tenant_bytes_total", "counter", "Payload bytes per tenant and direction.");
  for (const auto& t : tenants) {
    const std::string& l = L(t);
    Line(&out, "flatkv_tenant_bytes_total", l + ",direction=\"put\"", double(Get(t.metrics->put_bytes)));
    Line(&out, "flatkv_tenant_bytes_total", l + ",direction=\"restore_stream\"", double(Get(t.metrics->restore_bytes_stream)));
    Line(&out, "flatkv_tenant_bytes_total", l + ",direction=\"restore_shm\"", double(Get(t.metrics->restore_bytes_shm)));
  }
  Help(&out, "flatkv_tenant_quota_bytes", "gauge", "Quota per tenant (0: none).");
  for (const auto& t : tenants) Line(&out, "flatkv_tenant_quota_bytes", L(t), double(t.quota_bytes));
  Help(&out, "flatkv_tenant_used_bytes", "gauge", "Bytes charged to each tenant's quota.");
  for (const auto& t : tenants) Line(&out, "flatkv_tenant_used_bytes", L(t), double(t.used_bytes));
  Help(&out, "flatkv_tenant_dram_bytes", "gauge", "Store DRAM (copies and DRAM homes) each tenant's sessions hold.");
  for (const auto& t : tenants) Line(&out, "flatkv_tenant_dram_bytes", L(t), double(t.dram_bytes));
  Help(&out, "flatkv_tenant_retained_bytes", "gauge", "Bytes each tenant's unexpired retains hold.");
  for (const auto& t : tenants) Line(&out, "flatkv_tenant_retained_bytes", L(t), double(t.retained_bytes));
  const char* hists[] = {"lookup", "put", "restore"};
  for (const char* h : hists) {
    const std::string name = std::string("flatkv_") + h + "_latency_seconds";
    Help(&out, name, "histogram", "Request latency from its frame's arrival to its last reply byte.");
    for (const auto& t : tenants) {
      const PromHistogram& ph = h[0] == 'l' ? t.metrics->lookup_us : h[0] == 'p' ? t.metrics->put_us : t.metrics->restore_us;
      ph.Render(name, L(t), &out);
    }
  }
  return out;
}

std::string RenderStatsJson(const StoreStats& s, const StoreOptions& options, const ServerMetrics& m,
                            const std::vector<TenantView>& tenants) {
  nlohmann::json j;
  j["store"] = nlohmann::json::parse(s.ToJson(), nullptr, false);
  j["options"] = nlohmann::json::parse(StoreOptionsToJson(options), nullptr, false);
  j["options"]["ssd_dirs"] = options.ssd_dirs.size();
  j["server"] = {{"connections", Get(m.connections_active)},        {"connections_total", Get(m.connections_total)},
                 {"connections_refused", Get(m.connections_refused)}, {"auth_failures", Get(m.auth_failures)},
                 {"frame_errors", Get(m.frame_errors)},              {"deadline_exceeded", Get(m.deadline_exceeded)},
                 {"requests_in_flight", Get(m.requests_in_flight)},  {"shm_windows", Get(m.shm_windows)},
                 {"shm_bytes", Get(m.shm_bytes)}};
  nlohmann::json ts = nlohmann::json::array();
  for (const auto& t : tenants) {
    const TenantMetrics& x = *t.metrics;
    ts.push_back({{"name", t.name},
                  {"quota_bytes", t.quota_bytes},
                  {"used_bytes", t.used_bytes},
                  {"dropped_sessions", t.dropped_sessions},
                  {"dram_bytes", t.dram_bytes},
                  {"retained_bytes", t.retained_bytes},
                  {"lookups", Get(x.lookups)},
                  {"lookup_keys", Get(x.lookup_keys)},
                  {"lookup_hit_blocks", Get(x.lookup_hit_blocks)},
                  {"puts", Get(x.puts)},
                  {"put_blocks", Get(x.put_blocks)},
                  {"put_bytes", Get(x.put_bytes)},
                  {"restores", Get(x.restores)},
                  {"restore_keys", Get(x.restore_keys)},
                  {"restore_hit_dram", Get(x.restore_hit_dram)},
                  {"restore_hit_ssd", Get(x.restore_hit_ssd)},
                  {"restore_hit_remote", Get(x.restore_hit_remote)},
                  {"restore_miss_blocks", Get(x.restore_miss_blocks)},
                  {"restore_bytes_stream", Get(x.restore_bytes_stream)},
                  {"restore_bytes_shm", Get(x.restore_bytes_shm)},
                  {"errors", Get(x.errors)},
                  {"lookup_p50_us", x.lookup_us.Percentile(0.5)},
                  {"lookup_p99_us", x.lookup_us.Percentile(0.99)},
                  {"restore_p50_us", x.restore_us.Percentile(0.5)},
                  {"restore_p99_us", x.restore_us.Percentile(0.99)}});
  }
  j["tenants"] = ts;
  return j.dump(2);
}

}  // namespace flatkv::service
