#include "service/options_json.h"

#include <utility>

#include <nlohmann/json.hpp>

#include "flatkv/codec.h"
#include "flatkv/placement.h"

namespace flatkv {
namespace {

// One row per enumerated value: dropping a value is dropping its row.
constexpr std::pair<SsdAdmission, std::string_view> kSsdAdmissions[] = {
    {SsdAdmission::kAll, "all"},
    {SsdAdmission::kOnReuse, "on-reuse"},
};
constexpr std::pair<IoEngineKind, std::string_view> kIoEngineKinds[] = {
    {IoEngineKind::kAuto, "auto"},
    {IoEngineKind::kUring, "uring"},
    {IoEngineKind::kThreadPool, "threadpool"},
};

template <typename E, size_t N>
std::string_view NameOf(const std::pair<E, std::string_view> (&table)[N], E value) {
  for (const auto& [v, name] : table)
    if (v == value) return name;
  return "unknown";
}

template <typename E, size_t N>
Result<E> Parse(const std::pair<E, std::string_view> (&table)[N], std::string_view name, const char* what) {
  std::string known;
  for (const auto& [v, n] : table) {
    if (n == name) return v;
    known += (known.empty() ? "" : ", ") + std::string(n);
  }
  return Status::InvalidArgument(std::string(what) + " '" + std::string(name) + "' is not one of " + known);
}

}  // namespace

std::string_view SsdAdmissionName(SsdAdmission a) { return NameOf(kSsdAdmissions, a); }
Result<SsdAdmission> ParseSsdAdmission(std::string_view name) { return Parse(kSsdAdmissions, name, "ssd_admission"); }
std::string_view IoEngineKindName(IoEngineKind k) { return NameOf(kIoEngineKinds, k); }
Result<IoEngineKind> ParseIoEngineKind(std::string_view name) { return Parse(kIoEngineKinds, name, "ssd_io"); }

std::string StoreOptionsToJson(const StoreOptions& o) {
  nlohmann::json j;
  j["shape"] = o.shape.ToString();
  j["block_tokens"] = o.block_tokens;
  j["dram_capacity_bytes"] = o.dram_capacity_bytes;
  j["ssd_dirs"] = o.ssd_dirs;
  j["ssd_capacity_bytes"] = o.ssd_capacity_bytes;
  j["segment_bytes"] = o.segment_bytes;
  j["dram_extent_layer_bytes"] = o.dram_extent_layer_bytes;
  j["ssd_extent_layer_bytes"] = o.ssd_extent_layer_bytes;
  j["sized_extents"] = o.sized_extents;
  j["session_dram_share_bytes"] = o.session_dram_share_bytes;
  j["dram_idle_after_ms"] = static_cast<int64_t>(o.dram_idle_after.count());
  j["ssd_admission"] = SsdAdmissionName(o.ssd_admission);
  j["readmit_on_restore"] = o.readmit_on_restore;
  j["ssd_write_buffer_bytes"] = o.ssd_write_buffer_bytes;
  j["manifest_checkpoint_bytes"] = o.manifest_checkpoint_bytes;
  j["window_layers"] = o.window_layers;
  j["window_bytes"] = o.window_bytes;
  j["ssd_layers_in_flight"] = o.ssd_layers_in_flight;
  j["max_request_bytes"] = o.max_request_bytes;
  j["ssd_io"] = IoEngineKindName(o.ssd_io);
  j["ssd_queue_depth"] = o.ssd_queue_depth;
  j["ssd_threads"] = o.ssd_threads;
  j["dram_threads"] = o.dram_threads;
  j["decode_threads"] = o.decode_threads;
  j["use_direct_io"] = o.use_direct_io;
  j["sync_writes"] = o.sync_writes;
  j["read_only"] = o.read_only;
  j["verify_dram_reads"] = o.verify_dram_reads;
  j["codec"] = o.codec ? nlohmann::json(std::string(o.codec->name())) : nlohmann::json(nullptr);
  j["placement"] = o.placement ? nlohmann::json(std::string(o.placement->name())) : nlohmann::json(nullptr);
  // The remote tier, without its password.
  const RemoteOptions& r = o.remote;
  j["remote"] = {{"seeds", r.seeds},
                 {"user", r.user},
                 {"password_set", !r.password.empty()},
                 {"tls", r.tls},
                 {"tls_ca_file", r.tls_ca_file},
                 {"tls_verify", r.tls_verify},
                 {"prefix", r.prefix},
                 {"object_bytes", r.object_bytes},
                 {"max_inflight", r.max_inflight},
                 {"ttl_seconds", r.ttl_seconds},
                 {"timeout_ms", static_cast<int64_t>(r.timeout.count())},
                 {"publish_buffer_bytes", r.publish_buffer_bytes},
                 {"capacity_bytes", r.capacity_bytes},
                 {"backoff_ms", static_cast<int64_t>(r.backoff.count())}};
  return j.dump();
}

}  // namespace flatkv
