// StoreStats and the store's options from JSON: what a daemon's /stats reply carries.
#include <nlohmann/json.hpp>

#include "capi/capi_internal.h"

namespace flatkv::capi {
namespace {

using Json = nlohmann::json;

uint64_t U64(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<uint64_t>() : 0;
}

double F64(const Json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : 0.0;
}

MediumStats Medium(const Json& j) {
  MediumStats m;
  if (!j.is_object()) return m;
  m.capacity_bytes = U64(j, "capacity_bytes");
  m.used_bytes = U64(j, "used_bytes");
  m.extents = U64(j, "extents");
  m.blocks = U64(j, "blocks");
  m.hit_blocks = U64(j, "hit_blocks");
  m.bytes_written = U64(j, "bytes_written");
  m.bytes_read = U64(j, "bytes_read");
  m.bytes_delivered = U64(j, "bytes_delivered");
  m.read_requests = U64(j, "read_requests");
  m.evicted_extents = U64(j, "evicted_extents");
  m.evicted_blocks = U64(j, "evicted_blocks");
  m.queue_depth = U64(j, "queue_depth");
  m.max_queue_depth = U64(j, "max_queue_depth");
  return m;
}

}  // namespace

Result<StoreStats> StatsFromJson(const std::string& text) {
  Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object())
    return Status::Corruption("stats reply is not a JSON object: \"" + text.substr(0, 80) + "\"");
  const Json& j = root.contains("store") && root["store"].is_object() ? root["store"] : root;
  StoreStats s;
  if (j.contains("dram")) s.dram = Medium(j["dram"]);
  if (j.contains("ssd")) s.ssd = Medium(j["ssd"]);
  s.sessions = U64(j, "sessions");
  s.restores = U64(j, "restores");
  s.lookup_blocks = U64(j, "lookup_blocks");
  s.miss_blocks = U64(j, "miss_blocks");
  s.put_blocks = U64(j, "put_blocks");
  s.dedup_blocks = U64(j, "dedup_blocks");
  s.checksum_failures = U64(j, "checksum_failures");
  s.io_errors = U64(j, "io_errors");
  s.dropped_blocks = U64(j, "dropped_blocks");
  s.recovered_blocks = U64(j, "recovered_blocks");
  s.lost_blocks = U64(j, "lost_blocks");
  s.manifest_bytes = U64(j, "manifest_bytes");
  s.manifest_checkpoints = U64(j, "manifest_checkpoints");
  s.restore_p50_us = F64(j, "restore_p50_us");
  s.restore_p90_us = F64(j, "restore_p90_us");
  s.restore_p99_us = F64(j, "restore_p99_us");
  s.restore_max_us = F64(j, "restore_max_us");
  return s;
}

Result<std::string> OptionsFromStatsJson(const std::string& text) {
  Json root = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded() || !root.is_object())
    return Status::Corruption("stats reply is not a JSON object: \"" + text.substr(0, 80) + "\"");
  auto it = root.find("options");
  if (it == root.end() || !it->is_object())
    return Status::FailedPrecondition("the daemon's stats carry no \"options\" object (a daemon older than this client)");
  return it->dump();
}

}  // namespace flatkv::capi
