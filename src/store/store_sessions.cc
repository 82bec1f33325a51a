// What a caller tells the store about its sessions besides puts: that an
// agent rewrote a session's history (TruncateSession), and that a chain will
// be wanted again soon (Retain). Chain positions, which truncation needs,
// are recorded here as puts reserve their slots. docs/architecture.md,
// "Session operations".
#include <algorithm>

#include "common/log.h"
#include "store/store_impl.h"

namespace flatkv {

void StoreImpl::NotePosition(Extent* e, uint32_t slot, uint32_t position) {
  if (!e->runs.empty() && e->PositionOf(slot) == position) return;  // follows on
  if (e->runs.size() >= persist::kMaxPositionRuns) return;           // see kMaxPositionRuns
  e->runs.push_back({slot, position});
  if (Status s = LogPositions(*e, e->runs.size() - 1); !s.ok())
    LogWarning("recording chain positions: " + s.ToString() + " (a restart counts them from 0)");
}

Status StoreImpl::LogPositions(const Extent& e, size_t from) {
  if (e.medium != Medium::kSsd || options_.read_only || from >= e.runs.size()) return Status::Ok();
  SsdDir& dir = *ssd_[e.device];
  std::vector<uint8_t> rec;
  persist::EncodeBlockPositions(rec, dir.RefOf(e.slot), std::span(e.runs).subspan(from));
  FLATKV_RETURN_IF_ERROR(dir.manifest().Upgrade(persist::kManifestVersionPositions));
  return dir.manifest().Append(rec, /*sync=*/false);  // under mu_: the caller syncs (SyncManifests)
}

Status StoreImpl::LogDropped(const Extent& e, std::span<const uint32_t> slots) {
  if (e.medium != Medium::kSsd || options_.read_only || slots.empty()) return Status::Ok();
  SsdDir& dir = *ssd_[e.device];
  std::vector<uint8_t> rec;
  persist::EncodeBlocksDropped(rec, dir.RefOf(e.slot), slots);
  FLATKV_RETURN_IF_ERROR(dir.manifest().Upgrade(persist::kManifestVersionPositions));
  return dir.manifest().Append(rec, /*sync=*/false);
}

Result<uint32_t> StoreImpl::TruncateSession(SessionId session, uint32_t keep_blocks) {
  uint32_t released = 0;
  Status first;
  {
    MutexLock lock(&mu_);
    if (closed_) return Status::FailedPrecondition("truncate session: store is closed");
    if (options_.read_only) return Status::FailedPrecondition("truncate session: store is opened read-only");
    auto it = sessions_.find(session);
    if (it == sessions_.end()) return Status::NotFound("session " + std::to_string(session) + " has no blocks");
    Session& s = it->second;
    // Its references at or past the cut go (the blocks stay with their holders).
    for (uint64_t id : std::vector<uint64_t>(s.shared)) {
      auto from = s.shared_from.find(id);
      if ((from == s.shared_from.end() ? 0 : from->second) < keep_blocks) continue;
      s.shared.erase(std::remove(s.shared.begin(), s.shared.end(), id), s.shared.end());
      s.shared_from.erase(id);
      auto xe = extents_.find(id);
      if (xe == extents_.end()) continue;
      Extent* x = xe->second.get();
      x->sharers.erase(std::remove(x->sharers.begin(), x->sharers.end(), session), x->sharers.end());
      if (Status ls = LogSessions(*x); !ls.ok() && first.ok()) first = ls;
    }
    for (uint64_t id : std::vector<uint64_t>(s.extents)) {
      Extent* e = extents_.at(id).get();
      if (!e->sharers.empty()) continue;  // other live sessions reference its blocks: they stay
      std::vector<uint32_t> cut;
      bool kept = false;
      for (uint32_t i = 0; i < e->reserved && i < e->slots(); ++i) {
        if (!e->present(i)) continue;
        if (e->PositionOf(i) >= keep_blocks) cut.push_back(i);
        else kept = true;
      }
      released += static_cast<uint32_t>(cut.size());
      if (!kept && e->writers == 0 && !e->doomed) {  // nothing of it stays (an earlier cut may have emptied it)
        if (e->pins > 0) {
          // A restore reads it now: out of the index at once, freed by the last Unpin.
          for (uint32_t i : cut) Unindex(e, i);
          e->doomed = true;
          if (Status ls = LogDropped(*e, cut); !ls.ok() && first.ok()) first = ls;
        } else if (Status fs = FreeExtent(e); !fs.ok() && first.ok()) {
          first = fs;
        }
        continue;
      }
      if (cut.empty()) continue;
      // Part of it stays (or a put writes into it): the cut blocks leave the
      // index; their slots are not reused (blocks are written once).
      for (uint32_t i : cut) Unindex(e, i);
      if (Status ls = LogDropped(*e, cut); !ls.ok() && first.ok()) first = ls;
    }
    s.next_position = std::min(s.next_position, keep_blocks);
    counters_.truncated_blocks += released;
    ForgetIfEmpty(session);
  }
  if (options_.sync_writes)
    if (Status synced = SyncManifests(); !synced.ok() && first.ok()) first = synced;
  if (!first.ok()) return first.WithContext("truncate session " + std::to_string(session));
  return released;
}

Result<uint32_t> StoreImpl::Retain(std::span<const BlockKey> chain, std::chrono::milliseconds ttl) {
  if (ttl.count() < 0) return Status::InvalidArgument("retain: ttl " + std::to_string(ttl.count()) + " ms is negative");
  MutexLock lock(&mu_);
  if (closed_) return Status::FailedPrecondition("retain: store is closed");
  const auto now = Now();
  const auto until = now + ttl;
  // Retained extents now, per medium (DRAM: homes and copies), pruning the
  // expired; each medium may be at most half retained (rounded up).
  uint64_t dram_held = 0, ssd_held = 0;
  for (auto it = retained_.begin(); it != retained_.end();) {
    auto xe = extents_.find(*it);
    if (xe == extents_.end() || !xe->second->retained(now)) {
      it = retained_.erase(it);
      continue;
    }
    const Extent& x = *xe->second;
    dram_held += DramBytesOf(x);
    ssd_held += x.medium == Medium::kSsd ? x.geom.extent_bytes : 0;
    ++it;
  }
  // Half of each medium's bytes, or one extent (a store of one extent can retain it).
  const uint64_t dram_cap = dram_ ? std::max(dram_->capacity_bytes() / 2, dram_->geometry().extent_bytes) : 0;
  uint64_t ssd_bytes = 0, ssd_extent = 0;
  for (const auto& d : ssd_) {
    ssd_bytes += d->units().capacity() * d->unit_bytes();
    ssd_extent = std::max(ssd_extent, d->geometry().extent_bytes);
  }
  const uint64_t ssd_cap = std::max(ssd_bytes / 2, ssd_extent);
  uint32_t n = 0;
  for (; n < chain.size(); ++n) {
    uint32_t slot = 0;
    Extent* e = FindBlock(chain[n], &slot);
    if (e == nullptr) break;
    if (ttl.count() == 0) {
      e->retained_until = {};
      continue;
    }
    if (!e->retained(now)) {
      const uint64_t dram = DramBytesOf(*e);
      const uint64_t ssd = e->medium == Medium::kSsd ? e->geom.extent_bytes : 0;
      if ((dram && dram_held + dram > dram_cap) || (ssd && ssd_held + ssd > ssd_cap)) {
        uint32_t stored = n;
        while (stored < chain.size() && Indexed(chain[stored])) ++stored;
        counters_.retain_refused_blocks += stored - n;
        break;
      }
      dram_held += dram;
      ssd_held += ssd;
      retained_.insert(e->id);
    }
    e->retained_until = std::max(e->retained_until, until);
  }
  return ttl.count() == 0 ? 0u : n;
}

}  // namespace flatkv
