#include "flatkv/stats.h"

#include <cstdio>
#include <utility>
#include <vector>

#include "store/store_impl.h"

namespace flatkv {
namespace {

void AppendMedium(std::string& out, const char* name, const MediumStats& m) {
  char buf[1024];
  std::snprintf(buf, sizeof(buf),
                "%s: capacity=%llu used=%llu extents=%llu allocated=%llu blocks=%llu hit_blocks=%llu written=%llu read=%llu "
                "delivered=%llu requests=%llu evicted_extents=%llu evicted_blocks=%llu queue_depth=%llu max_queue_depth=%llu stored=%llu logical=%llu\n",
                name, (unsigned long long)m.capacity_bytes, (unsigned long long)m.used_bytes,
                (unsigned long long)m.extents, (unsigned long long)m.allocated_bytes, (unsigned long long)m.blocks, (unsigned long long)m.hit_blocks,
                (unsigned long long)m.bytes_written, (unsigned long long)m.bytes_read,
                (unsigned long long)m.bytes_delivered, (unsigned long long)m.read_requests,
                (unsigned long long)m.evicted_extents, (unsigned long long)m.evicted_blocks,
                (unsigned long long)m.queue_depth, (unsigned long long)m.max_queue_depth,
                (unsigned long long)m.stored_bytes, (unsigned long long)m.logical_bytes);
  out += buf;
}

void AppendMediumJson(std::string& out, const char* name, const MediumStats& m) {
  char buf[1024];
  std::snprintf(buf, sizeof(buf),
                "\"%s\":{\"capacity_bytes\":%llu,\"used_bytes\":%llu,\"extents\":%llu,\"allocated_bytes\":%llu,\"blocks\":%llu,"
                "\"hit_blocks\":%llu,\"bytes_written\":%llu,\"bytes_read\":%llu,\"bytes_delivered\":%llu,"
                "\"read_requests\":%llu,\"evicted_extents\":%llu,\"evicted_blocks\":%llu,\"queue_depth\":%llu,"
                "\"max_queue_depth\":%llu,\"stored_bytes\":%llu,\"logical_bytes\":%llu}",
                name, (unsigned long long)m.capacity_bytes, (unsigned long long)m.used_bytes,
                (unsigned long long)m.extents, (unsigned long long)m.allocated_bytes, (unsigned long long)m.blocks, (unsigned long long)m.hit_blocks,
                (unsigned long long)m.bytes_written, (unsigned long long)m.bytes_read,
                (unsigned long long)m.bytes_delivered, (unsigned long long)m.read_requests,
                (unsigned long long)m.evicted_extents, (unsigned long long)m.evicted_blocks,
                (unsigned long long)m.queue_depth, (unsigned long long)m.max_queue_depth,
                (unsigned long long)m.stored_bytes, (unsigned long long)m.logical_bytes);
  out += buf;
}

// The remote tier's counters, as name=value pairs.
std::vector<std::pair<const char*, uint64_t>> RemoteFields(const RemoteStats& r) {
  return {{"hit_blocks", r.hit_blocks},
          {"restored_blocks", r.restored_blocks},
          {"bytes_read", r.bytes_read},
          {"lookups", r.lookups},
          {"lookup_errors", r.lookup_errors},
          {"lookups_skipped", r.lookups_skipped},
          {"stale_objects", r.stale_objects},
          {"missing_objects", r.missing_objects},
          {"published_blocks", r.published_blocks},
          {"already_published_blocks", r.already_published_blocks},
          {"published_bytes", r.published_bytes},
          {"publish_dropped_blocks", r.publish_dropped_blocks},
          {"publish_errors", r.publish_errors},
          {"publish_queued_blocks", r.publish_queued_blocks},
          {"publish_queued_bytes", r.publish_queued_bytes},
          {"capacity_bytes", r.capacity_bytes},
          {"held_bytes", r.held_bytes},
          {"capacity_deleted_blocks", r.capacity_deleted_blocks}};
}
std::string RemoteText(const RemoteStats& r) {
  std::string out;
  for (const auto& [k, v] : RemoteFields(r)) {
    if (!out.empty()) out += ' ';
    out += k;
    out += '=';
    out += std::to_string(v);
  }
  return out;
}
std::string RemoteJson(const RemoteStats& r) {
  std::string out;
  for (const auto& [k, v] : RemoteFields(r)) {
    if (!out.empty()) out += ',';
    out += '"';
    out += k;
    out += "\":";
    out += std::to_string(v);
  }
  return out;
}

}  // namespace

std::string StoreStats::ToString() const {
  std::string out;
  AppendMedium(out, "dram", dram);
  AppendMedium(out, "ssd", ssd);
  char buf[1024];
  std::snprintf(buf, sizeof(buf),
                "sessions=%llu restores=%llu lookup_blocks=%llu miss_blocks=%llu put_blocks=%llu dedup_blocks=%llu\n"
                "checksum_failures=%llu decode_failures=%llu io_errors=%llu dropped_blocks=%llu recovered_blocks=%llu lost_blocks=%llu manifest_bytes=%llu manifest_checkpoints=%llu\n"
                "ssd_read_amplification=%.3f compression_ratio=%.3f ssd_direct_io=%s ssd_engine=%s\n"
                "restore_latency_us p50=%.0f p90=%.0f p99=%.0f max=%.0f\n"
                "dram_only_blocks=%llu dram_only_lost_blocks=%llu readmitted_blocks=%llu ssd_write_waits=%llu shared_extents=%llu\n"
                "prefetches=%llu prefetches_done=%llu prefetch_skipped=%llu truncated_blocks=%llu retained_extents=%llu retain_refused_blocks=%llu\n",
                (unsigned long long)sessions, (unsigned long long)restores, (unsigned long long)lookup_blocks,
                (unsigned long long)miss_blocks, (unsigned long long)put_blocks, (unsigned long long)dedup_blocks,
                (unsigned long long)checksum_failures, (unsigned long long)decode_failures, (unsigned long long)io_errors,
                (unsigned long long)dropped_blocks, (unsigned long long)recovered_blocks, (unsigned long long)lost_blocks,
                (unsigned long long)manifest_bytes, (unsigned long long)manifest_checkpoints, ssd_read_amplification(), compression_ratio(), ssd_direct_io ? "yes" : "no",
                ssd_engine.c_str(), restore_p50_us, restore_p90_us, restore_p99_us, restore_max_us,
                (unsigned long long)dram_only_blocks, (unsigned long long)dram_only_lost_blocks,
                (unsigned long long)readmitted_blocks, (unsigned long long)ssd_write_waits,
                (unsigned long long)shared_extents, (unsigned long long)prefetches,
                (unsigned long long)prefetches_done, (unsigned long long)prefetch_skipped, (unsigned long long)truncated_blocks,
                (unsigned long long)retained_extents, (unsigned long long)retain_refused_blocks);
  out += buf;
  if (remote.enabled) out += "remote " + RemoteText(remote) + "\n";
  return out;
}

std::string StoreStats::ToJson() const {
  std::string out = "{";
  AppendMediumJson(out, "dram", dram);
  out += ",";
  AppendMediumJson(out, "ssd", ssd);
  char buf[1024];
  std::snprintf(buf, sizeof(buf),
                ",\"sessions\":%llu,\"restores\":%llu,\"lookup_blocks\":%llu,\"miss_blocks\":%llu,\"put_blocks\":%llu,"
                "\"dedup_blocks\":%llu,\"checksum_failures\":%llu,\"decode_failures\":%llu,\"io_errors\":%llu,\"dropped_blocks\":%llu,"
                "\"recovered_blocks\":%llu,"
                "\"lost_blocks\":%llu,\"manifest_bytes\":%llu,\"manifest_checkpoints\":%llu,\"ssd_read_amplification\":%.6f,\"compression_ratio\":%.6f,\"ssd_direct_io\":%s,"
                "\"ssd_engine\":\"%s\",\"restore_p50_us\":%.1f,\"restore_p90_us\":%.1f,\"restore_p99_us\":%.1f,"
                "\"restore_max_us\":%.1f,\"dram_only_blocks\":%llu,\"dram_only_lost_blocks\":%llu,"
                "\"readmitted_blocks\":%llu,\"ssd_write_waits\":%llu,\"shared_extents\":%llu,\"prefetches\":%llu,"
                "\"prefetches_done\":%llu,\"prefetch_skipped\":%llu,\"truncated_blocks\":%llu,\"retained_extents\":%llu,\"retain_refused_blocks\":%llu}",
                (unsigned long long)sessions, (unsigned long long)restores, (unsigned long long)lookup_blocks,
                (unsigned long long)miss_blocks, (unsigned long long)put_blocks, (unsigned long long)dedup_blocks,
                (unsigned long long)checksum_failures, (unsigned long long)decode_failures, (unsigned long long)io_errors,
                (unsigned long long)dropped_blocks, (unsigned long long)recovered_blocks, (unsigned long long)lost_blocks,
                (unsigned long long)manifest_bytes, (unsigned long long)manifest_checkpoints, ssd_read_amplification(), compression_ratio(), ssd_direct_io ? "true" : "false",
                ssd_engine.c_str(), restore_p50_us, restore_p90_us, restore_p99_us, restore_max_us,
                (unsigned long long)dram_only_blocks, (unsigned long long)dram_only_lost_blocks,
                (unsigned long long)readmitted_blocks, (unsigned long long)ssd_write_waits,
                (unsigned long long)shared_extents, (unsigned long long)prefetches,
                (unsigned long long)prefetches_done, (unsigned long long)prefetch_skipped, (unsigned long long)truncated_blocks,
                (unsigned long long)retained_extents, (unsigned long long)retain_refused_blocks);
  out += buf;
  out.pop_back();  // the closing brace: the per-tenant DRAM follows
  out += ",\"tenant_dram_bytes\":{";
  for (auto it = tenant_dram_bytes.begin(); it != tenant_dram_bytes.end(); ++it)
    out += (it == tenant_dram_bytes.begin() ? "\"" : ",\"") + std::to_string(it->first) + "\":" + std::to_string(it->second);
  out += "}";
  if (remote.enabled) out += ",\"remote\":{" + RemoteJson(remote) + "}";
  return out + "}";
}

StoreStats StoreImpl::Stats() const {
  StoreStats st;
  for (const auto& m : media_) m->AddStats(&st);
  auto fill = [](MediumStats& m, const MediumCounters& c) {
    m.allocated_bytes = c.allocated_bytes;
    m.hit_blocks = c.hit_blocks;
    m.bytes_written = c.bytes_written;
    m.bytes_read = c.bytes_read;
    m.bytes_delivered = c.bytes_delivered;
    m.read_requests = c.read_requests;
    m.evicted_extents = c.evicted_extents;
    m.evicted_blocks = c.evicted_blocks;
    m.max_queue_depth = c.max_queue_depth;
  };
  fill(st.dram, counters_.dram);
  fill(st.ssd, counters_.ssd);
  {
    MutexLock lock(&mu_);
    if (dram_) {
      st.dram.capacity_bytes = dram_->capacity_bytes();
      st.dram.extents = dram_->units().runs();
      st.dram.used_bytes = dram_->units().used() * dram_->unit_bytes();
    }
    st.ssd_direct_io = !ssd_.empty();
    for (const auto& d : ssd_) {
      st.ssd.capacity_bytes += d->capacity_bytes();
      st.ssd.extents += d->units().runs();
      st.ssd.used_bytes += d->units().used() * d->unit_bytes();
      st.ssd_direct_io = st.ssd_direct_io && d->all_direct();
      st.manifest_bytes += d->manifest().bytes();
      st.manifest_checkpoints += d->manifest().checkpoints();
    }
    st.dram_only_blocks = dram_only_ + dram_home_blocks_;
    for (const auto& [id, e] : extents_)
      if (!e->sharers.empty()) st.shared_extents++;
    st.dram.blocks = dram_blocks_;
    st.ssd.blocks = ssd_blocks_;
    st.dram.stored_bytes = dram_stored_;
    st.ssd.stored_bytes = ssd_stored_;
    st.dram.logical_bytes = dram_blocks_ * BlockBytes();
    st.ssd.logical_bytes = ssd_blocks_ * BlockBytes();
    st.sessions = sessions_.size();
    st.tenant_dram_bytes.insert(tenant_dram_.begin(), tenant_dram_.end());
    const auto now = Now();
    for (uint64_t id : retained_)
      if (auto it = extents_.find(id); it != extents_.end() && it->second->retained(now)) st.retained_extents++;
  }
  st.dram.queue_depth = dram_queue_->outstanding();
  if (engine_) {
    st.ssd.queue_depth = engine_->outstanding();
    st.ssd_engine = std::string(engine_->name());
  }
  st.restores = counters_.restores;
  st.lookup_blocks = counters_.lookup_blocks;
  st.miss_blocks = counters_.miss_blocks;
  st.put_blocks = counters_.put_blocks;
  st.dedup_blocks = counters_.dedup_blocks;
  st.checksum_failures = counters_.checksum_failures;
  st.decode_failures = counters_.decode_failures;
  st.io_errors = counters_.io_errors;
  st.dropped_blocks = counters_.dropped_blocks;
  st.recovered_blocks = counters_.recovered_blocks;
  st.lost_blocks = counters_.lost_blocks;
  st.dram_only_lost_blocks = counters_.dram_only_lost_blocks;
  st.readmitted_blocks = counters_.readmitted_blocks;
  st.prefetches = counters_.prefetches;
  st.prefetches_done = counters_.prefetches_done;
  st.prefetch_skipped = counters_.prefetch_skipped;
  st.truncated_blocks = counters_.truncated_blocks;
  st.retain_refused_blocks = counters_.retain_refused_blocks;
  st.ssd_write_waits = counters_.ssd_write_waits;
  st.restore_p50_us = counters_.restore_latency.Percentile(0.5);
  st.restore_p90_us = counters_.restore_latency.Percentile(0.9);
  st.restore_p99_us = counters_.restore_latency.Percentile(0.99);
  st.restore_max_us = counters_.restore_latency.Max();
  return st;
}

}  // namespace flatkv
