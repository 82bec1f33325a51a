// StoreImpl's sessions and tenants, placement and reclaim, extents, the
// index, session drops, sums and the window pool (store/store_impl.h).
// Opening, recovery and closing are in store_open.cc; puts in store_put.cc
// and store_coded.cc; restores in restore.cc; Stats() in stats.cc.
#include "store/store_impl.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "common/checksum.h"
#include "common/log.h"
#include "store/segment_writer.h"

namespace flatkv {
Session& StoreImpl::TouchSession(SessionId id) {
  auto [it, inserted] = sessions_.try_emplace(id);
  Session& s = it->second;
  if (s.listed) lru_.erase(s.lru);
  lru_.push_front(id);
  s.lru = lru_.begin();
  s.listed = true;
  s.last_access = Now();
  s.touch = ++touch_;
  return s;
}

void StoreImpl::ChargeDram(Session& s, int64_t bytes) {
  s.dram_bytes += bytes;
  auto it = tenant_dram_.try_emplace(s.tenant, 0).first;
  it->second += bytes;
  if (it->second == 0) tenant_dram_.erase(it);
}

bool StoreImpl::OverShare(uint32_t tenant) const {
  auto it = tenant_dram_.find(tenant);
  return it != tenant_dram_.end() && it->second > dram_->capacity_bytes() / tenant_dram_.size();
}

void StoreImpl::SetTenant(Session& s, uint32_t tenant) {
  if (tenant == 0 || s.tenant == tenant) return;
  const int64_t held = int64_t(s.dram_bytes);
  ChargeDram(s, -held);
  s.tenant = tenant;
  ChargeDram(s, held);
}

uint64_t StoreImpl::SessionShare() const {
  if (options_.session_dram_share_bytes) return options_.session_dram_share_bytes;
  if (!dram_) return 0;
  return std::max(dram_->geometry().extent_bytes, dram_->capacity_bytes() / 2);
}

uint64_t StoreImpl::DramBytesOf(const Extent& e) const {
  const uint64_t units = e.medium == Medium::kDram ? e.units : e.has_copy ? e.copy_units : 0;
  return units * (dram_ ? dram_->unit_bytes() : 0);
}

uint32_t StoreImpl::DramUnitBlocks() const {
  const ExtentGeometry& g = dram_->geometry();
  const uint64_t per = g.BlockSlotBytes();
  if (dram_->unit_bytes() % per != 0 || dram_->unit_bytes() >= g.extent_bytes) return 0;
  return static_cast<uint32_t>(dram_->unit_bytes() / per);
}

uint64_t StoreImpl::HeldBlocks(const Session& s) const {
  uint64_t held = 0;
  for (uint64_t id : s.extents)
    if (auto it = extents_.find(id); it != extents_.end()) held += it->second->geom.extent_blocks;
  return held;
}

uint32_t StoreImpl::SizeFor(uint64_t held, uint64_t want, uint32_t unit, uint32_t largest) {
  if (unit >= largest) return largest;
  uint64_t b = std::max<uint64_t>({want, (held + kSizeGrowth - 1) / kSizeGrowth, 1});
  b = (b + unit - 1) / unit * unit;
  return static_cast<uint32_t>(std::min<uint64_t>(b, largest));
}

PlacementContext StoreImpl::MakeContext(SessionId session, PutHint hint) {
  PlacementContext c;
  c.session = session;
  c.hint = hint;
  c.session_dram_bytes = sessions_[session].dram_bytes;
  c.session_share_bytes = SessionShare();
  if (dram_) {
    c.dram_extent_bytes = dram_->geometry().extent_bytes;
    c.dram_capacity_bytes = dram_->capacity_bytes();
    c.dram_free_bytes = dram_->units().free() * dram_->unit_bytes();
  }
  for (const auto& d : ssd_) c.ssd_capacity_bytes += d->units().capacity() * d->unit_bytes();
  return c;
}

template <typename Pred>
Extent* StoreImpl::LruVictim(SessionId requester, bool copies_only, Pred ok) {
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    if (*it == requester) continue;
    const SessionId sid = *it;
    Session& s = sessions_[sid];
    // s must be the most recent holder of the extent: any other holder
    // (owner or sharer) more recent keeps it.
    auto less_recent = [&](SessionId h) FLATKV_REQUIRES(mu_) {
      if (h == sid) return true;
      if (h == requester) return false;
      auto hs = sessions_.find(h);
      return hs == sessions_.end() || hs->second.touch < s.touch;
    };
    auto consider = [&](uint64_t id) FLATKV_REQUIRES(mu_) -> Extent* {
      auto xe = extents_.find(id);
      if (xe == extents_.end()) return nullptr;
      Extent* x = xe->second.get();
      if (!ok(x, s) || !less_recent(x->session)) return nullptr;
      for (SessionId h : x->sharers)
        if (!less_recent(h)) return nullptr;
      return x;
    };
    if (!copies_only || s.dram_bytes > 0)
      for (auto e = s.extents.rbegin(); e != s.extents.rend(); ++e)  // newest first: keep the prefix usable
        if (Extent* x = consider(*e)) return x;
    for (uint64_t id : s.shared)
      if (Extent* x = consider(id)) return x;
  }
  return nullptr;
}

bool StoreImpl::ReclaimFrom(Medium m, SessionId requester, bool idle_only) {
  const auto now = Now();
  auto ok = [&](const Extent* x, const Session& holder) {
    if (idle_only && now - holder.last_access < options_.dram_idle_after) return false;
    return x->medium == m && x->pins == 0 && !x->doomed && !x->retained(now);
  };
  // DRAM homes: tenants over their share give them up first.
  Extent* victim = nullptr;
  if (m == Medium::kDram && tenant_dram_.size() > 1)
    victim = LruVictim(requester, false, [&](const Extent* x, const Session& holder) FLATKV_REQUIRES(mu_) {
      return OverShare(holder.tenant) && ok(x, holder);
    });
  if (victim == nullptr) victim = LruVictim(requester, false, ok);
  if (victim != nullptr) return Evict(victim, requester);
  if (idle_only) return false;
  auto self = sessions_.find(requester);
  if (self == sessions_.end()) return false;
  Extent* oldest = nullptr;
  for (uint64_t id : self->second.extents) {
    Extent* x = extents_[id].get();
    if (x->medium != m || x->pins > 0 || x->doomed || x->retained(now) || id == self->second.open_extent) continue;
    if (oldest == nullptr || x->last_access < oldest->last_access) oldest = x;
  }
  return oldest != nullptr && Evict(oldest, requester);
}

std::optional<uint64_t> StoreImpl::CopySlot(SessionId requester, uint64_t units) {
  if (!dram_) return std::nullopt;
  // Copies of other sizes may have to go before a run this long is free;
  // past kMaxDrops of them the extent goes without a copy this time.
  constexpr int kMaxDrops = 16;
  for (int drops = 0;; ++drops) {
    if (auto s = dram_->units().Allocate(units)) return s;
    if (drops == kMaxDrops || !DropCopyFor(requester)) return std::nullopt;
  }
}

bool StoreImpl::DropCopyFor(SessionId requester) {
  const auto now = Now();
  auto ok = [&](const Extent* x, const Session&) { return x->has_copy && x->pins == 0 && !x->retained(now); };
  // Tenants over their share of DRAM give up copies first.
  Extent* victim = nullptr;
  if (tenant_dram_.size() > 1)
    victim = LruVictim(requester, true, [&](const Extent* x, const Session& holder) FLATKV_REQUIRES(mu_) {
      return OverShare(holder.tenant) && ok(x, holder);
    });
  if (victim == nullptr) victim = LruVictim(requester, true, ok);
  if (victim == nullptr) {
    // No other session has a copy to give: the requester's own least
    // recently accessed one (history it no longer reads; never its open
    // extent or one in use).
    auto self = sessions_.find(requester);
    if (self == sessions_.end()) return false;
    for (uint64_t id : self->second.extents) {
      Extent* x = extents_.at(id).get();
      if (!x->has_copy || x->pins > 0 || x->retained(now) || id == self->second.open_extent) continue;
      if (victim == nullptr || x->last_access < victim->last_access) victim = x;
    }
    if (victim == nullptr) return false;
  }
  DropCopy(victim);
  return true;
}

void StoreImpl::DropCopy(Extent* e) {
  if (!e->has_copy) return;
  uint64_t dropped = 0;
  for (uint32_t i = 0; i < e->slots(); ++i) {
    if (!e->in_copy(i)) continue;
    if (e->present(i)) {
      ++dropped;
      if (e->durable(i) == kDurable) {
        Count(Medium::kDram, *e, i, -1);
      } else {  // a DRAM-only block (kOnReuse): its only copy goes
        Unindex(e, i);
        counters_.dram_only_lost_blocks++;
      }
    }
    e->set_in_copy(i, false);
  }
  auto s = sessions_.find(e->session);
  if (s != sessions_.end()) ChargeDram(s->second, -int64_t(DramBytesOf(*e)));
  dram_->units().Release(e->copy_slot, e->copy_units);
  e->has_copy = false;
  counters_.dram.evicted_extents++;
  counters_.dram.evicted_blocks += dropped;
}

bool StoreImpl::GiveCopy(Extent* e) {
  if (!dram_ || e->medium != Medium::kSsd || e->has_copy || e->writers > 0 || e->doomed) return false;
  if (!placement_->Choose(MakeContext(e->session, PutHint::kAuto)).dram_copy) return false;
  if (!AttachCopy(e)) return false;
  for (uint32_t i = 0; i < e->slots(); ++i) e->set_in_copy(i, false);
  return true;
}

bool StoreImpl::AttachCopy(Extent* e) {
  if (e->geom.extent_bytes > dram_->geometry().extent_bytes) return false;
  const uint64_t units = dram_->UnitsFor(e->geom.extent_bytes);
  auto slot = CopySlot(e->session, units);
  if (!slot) return false;
  e->has_copy = true;
  e->copy_slot = *slot;
  e->copy_units = units;
  e->copy_base = dram_->UnitOffset(*slot);
  ChargeDram(sessions_[e->session], int64_t(DramBytesOf(*e)));
  counters_.dram.allocated_bytes += DramBytesOf(*e);
  return true;
}

void StoreImpl::AddSharer(Extent* e, SessionId session, uint32_t from) {
  if (e->session == session || std::find(e->sharers.begin(), e->sharers.end(), session) != e->sharers.end()) return;
  if (e->sharers.size() >= persist::kMaxSharers) return;  // enough holders keep it anyway
  e->sharers.push_back(session);
  Session& holder = sessions_[session];
  holder.shared.push_back(e->id);
  holder.shared_from[e->id] = from;
  Status s = LogSessions(*e);
  if (!s.ok()) LogWarning("recording a shared extent: " + s.ToString() + " (the reference holds until a restart)");
}

Status StoreImpl::LogSessions(const Extent& e) {
  if (e.medium != Medium::kSsd) return Status::Ok();
  SsdDir& dir = *ssd_[e.device];
  std::vector<uint8_t> rec;
  persist::EncodeExtentSessions(rec, dir.RefOf(e.slot), e.session, e.sharers);
  FLATKV_RETURN_IF_ERROR(dir.manifest().Upgrade(persist::kManifestVersionShared));
  return dir.manifest().Append(rec, /*sync=*/false);  // under mu_: the caller syncs (SyncManifests)
}

bool StoreImpl::Evict(Extent* x, SessionId requester) {
  const Medium m = x->medium;
  uint64_t blocks = 0;
  for (uint32_t i = 0; i < x->slots(); ++i) blocks += x->present(i);
  std::vector<SessionId> holders = x->sharers;
  holders.push_back(x->session);
  if (!FreeExtent(x).ok()) return false;
  counters_.of(m).evicted_extents++;
  counters_.of(m).evicted_blocks += blocks;
  for (SessionId h : holders)
    if (h != requester) ForgetIfEmpty(h);
  return true;
}

void StoreImpl::ForgetIfEmpty(SessionId id) {
  auto it = sessions_.find(id);
  if (it == sessions_.end() || !it->second.extents.empty() || !it->second.shared.empty()) return;
  if (it->second.listed) lru_.erase(it->second.lru);
  sessions_.erase(it);
}

Result<uint64_t> StoreImpl::AllocateSlot(Medium m, SessionId requester, uint64_t want, uint32_t* device,
                                          uint32_t* blocks, uint64_t* units) {
  const uint64_t held = HeldBlocks(sessions_[requester]);  // the session's block slots, for SizeFor
  if (m == Medium::kDram) {
    if (!dram_) return Status::NoSpace("no DRAM tier");
    const ExtentGeometry& g = dram_->geometry();
    const uint32_t unit = DramUnitBlocks();
    *blocks = unit ? SizeFor(held, want, unit, g.extent_blocks) : g.extent_blocks;
    *units = dram_->UnitsFor(g.Sized(*blocks).extent_bytes);
    *device = 0;
    // With an SSD to fall back on, a DRAM home takes copies' units, else
    // only idle sessions give up DRAM homes.
    const bool idle_only = !ssd_.empty();
    if (idle_only)
      if (auto got = CopySlot(requester, *units)) return *got;
    do {
      if (auto got = dram_->units().Allocate(*units)) return *got;
    } while (ReclaimFrom(m, requester, idle_only));
    return Status::NoSpace("dram: " + std::to_string(dram_->units().free() * dram_->unit_bytes()) + " of " +
                           std::to_string(dram_->capacity_bytes()) +
                           " bytes free, not enough in one run, and the rest is held by active sessions");
  }
  if (ssd_.empty()) return Status::NoSpace("no SSD tier");
  do {
    // The size wanted, in the first directory (round robin) with a run that long.
    for (uint32_t k = 0; k < ssd_.size(); ++k) {
      const uint32_t d = (next_device_ + k) % ssd_.size();
      SsdDir& dir = *ssd_[d];
      const uint32_t b = SizeFor(held, want, dir.unit_blocks(), dir.geometry().extent_blocks);
      if (auto got = dir.units().Allocate(dir.UnitsFor(b))) {
        next_device_ = d + 1;
        *device = d;
        *blocks = b;
        *units = dir.UnitsFor(b);
        return *got;
      }
    }
    // Else at least half of it from a directory's longest free run, before
    // evicting anything (the put goes on in another extent).
    for (uint32_t k = 0; k < ssd_.size(); ++k) {
      const uint32_t d = (next_device_ + k) % ssd_.size();
      SsdDir& dir = *ssd_[d];
      if (!dir.sized()) continue;
      const uint64_t need = dir.UnitsFor(SizeFor(held, want, dir.unit_blocks(), dir.geometry().extent_blocks));
      const uint64_t run = dir.units().largest_free();
      if (run == 0 || 2 * run < need) continue;
      if (auto got = dir.units().Allocate(run)) {
        next_device_ = d + 1;
        *device = d;
        *blocks = static_cast<uint32_t>(run * dir.unit_blocks());
        *units = run;
        return *got;
      }
    }
  } while (ReclaimFrom(m, requester, false));
  return Status::NoSpace("ssd: every extent is in use and none can be evicted");
}

Result<Extent*> StoreImpl::CreateExtent(SessionId session, PutHint hint, uint64_t want,
                                        const std::shared_ptr<const Codec>& codec, const std::string& spec) {
  const Placement p = placement_->Choose(MakeContext(session, hint));
  Medium m = p.home;
  if (m == Medium::kDram && !dram_) m = Medium::kSsd;
  if (m != Medium::kDram && ssd_.empty()) m = Medium::kDram;
  uint32_t device = 0, blocks = 0;
  uint64_t units = 0;
  auto slot = AllocateSlot(m, session, want, &device, &blocks, &units);
  if (!slot.ok() && m == Medium::kDram && !ssd_.empty()) {
    m = Medium::kSsd;
    slot = AllocateSlot(m, session, want, &device, &blocks, &units);
  }
  if (!slot.ok()) return slot.status();
  auto release = [&]() FLATKV_REQUIRES(mu_) {
    if (m == Medium::kDram) dram_->units().Release(*slot, units);
    else ssd_[device]->units().Release(*slot, units);
  };
  auto e = std::make_unique<Extent>();
  e->id = next_extent_id_++;
  e->medium = m;
  e->device = device;
  e->slot = slot.value();
  e->units = units;
  e->session = session;
  e->last_access = Now();
  e->sums_in_memory = m == Medium::kDram;
  e->tagged = m == Medium::kSsd && ssd_[device]->tagged_sums();
  e->geom = (m == Medium::kDram ? dram_->geometry() : ssd_[device]->geometry()).Sized(blocks);
  const ExtentGeometry& g = e->geom;
  if (codec) {  // per-slot vectors grow as slots are reserved
    e->codec = codec;
    e->codec_spec = spec;
    e->capacity = g.extent_blocks * persist::kCodedBlocksPerSlot;
    e->fill.assign(g.layers, 0);
  } else {
    e->capacity = g.extent_blocks;
    GrowSlots(e.get(), g.extent_blocks);
  }
  if (Status hs = AddHandle(e.get()); !hs.ok()) {
    release();
    return hs;
  }
  if (m == Medium::kDram) {
    e->base = dram_->UnitOffset(e->slot);
  } else {
    SsdDir& dir = *ssd_[device];
    e->base = dir.UnitAddress(e->slot);
    std::vector<uint8_t> rec;
    persist::EncodeExtentCreate(rec, dir.RefOf(e->slot), session, spec, dir.sized() ? blocks : 0);
    Status s = dir.Locate(e->base, /*create=*/true).status();
    if (s.ok() && codec) s = dir.manifest().Upgrade(persist::kManifestVersionCoded);
    if (s.ok()) s = dir.manifest().Append(rec, /*sync=*/false);  // under mu_: the put syncs (SyncManifests)
    if (!s.ok()) {
      release();
      ReleaseHandle(e.get());
      return s;
    }
  }
  counters_.of(m).allocated_bytes += units * (m == Medium::kDram ? dram_->unit_bytes() : ssd_[device]->unit_bytes());
  Session& sess = sessions_[session];
  sess.extents.push_back(e->id);
  sess.open_extent = e->id;
  if (m == Medium::kDram) ChargeDram(sess, int64_t(DramBytesOf(*e)));
  Extent* raw = e.get();
  extents_[e->id] = std::move(e);
  // The session being written gets a DRAM copy of its new extent when the
  // policy wants one and DRAM units can be had without waiting.
  if (m == Medium::kSsd && p.dram_copy && dram_) AttachCopy(raw);
  return raw;
}

void StoreImpl::GrowSlots(Extent* e, uint32_t slots) {
  const uint32_t layers = options_.shape.layers;
  e->keys.resize(slots);
  e->state.resize(slots, 0);  // absent, not in the copy, kNotDurable
  if (e->handle < handles_.size() && handles_[e->handle] == e) key_base_[e->handle] = e->keys.data();  // may have moved
  if (e->sums_in_memory) e->sums.resize(uint64_t{slots} * layers);
  if (e->tagged) e->tags.resize(slots, 0);
  if (e->coded()) e->stored.resize(slots, 0);
}

Status StoreImpl::FreeExtent(Extent* e) {
  if (e->medium == Medium::kSsd) {
    SsdDir& dir = *ssd_[e->device];
    std::vector<uint8_t> rec;
    persist::EncodeExtentFree(rec, dir.RefOf(e->slot));
    FLATKV_RETURN_IF_ERROR(dir.manifest().Append(rec, /*sync=*/false));  // under mu_: the caller syncs
    dir.units().Release(e->slot, e->units);
  } else {
    dram_->units().Release(e->slot, e->units);
  }
  for (uint32_t i = 0; i < e->slots(); ++i)
    if (e->present(i)) Unindex(e, i);
  auto sit = sessions_.find(e->session);
  if (sit != sessions_.end()) ChargeDram(sit->second, -int64_t(DramBytesOf(*e)));  // its DRAM home or copy
  if (e->has_copy) {
    dram_->units().Release(e->copy_slot, e->copy_units);
    e->has_copy = false;
  }
  if (sit != sessions_.end()) {
    Session& s = sit->second;
    s.extents.erase(std::remove(s.extents.begin(), s.extents.end(), e->id), s.extents.end());
    if (s.open_extent == e->id) s.open_extent = 0;
  }
  for (SessionId h : e->sharers) {
    auto hs = sessions_.find(h);
    if (hs == sessions_.end()) continue;
    auto& v = hs->second.shared;
    v.erase(std::remove(v.begin(), v.end(), e->id), v.end());
    hs->second.shared_from.erase(e->id);
  }
  retained_.erase(e->id);
  ReleaseHandle(e);
  extents_.erase(e->id);
  return Status::Ok();
}

Status StoreImpl::AddHandle(Extent* e) {
  if (e->capacity > BlockIndex::kMaxSlots)
    return Status::InvalidArgument("extent of " + std::to_string(e->capacity) + " block slots: the index holds at most " +
                                   std::to_string(BlockIndex::kMaxSlots) + " per extent");
  if (free_handles_.empty()) {
    if (handles_.size() >= BlockIndex::kMaxHandles)
      return Status::NoSpace("index: " + std::to_string(handles_.size()) + " extents, the most it can refer to");
    free_handles_.push_back(static_cast<uint32_t>(handles_.size()));
    handles_.push_back(nullptr);
    key_base_.push_back(nullptr);
  }
  e->handle = free_handles_.back();
  free_handles_.pop_back();
  handles_[e->handle] = e;
  key_base_[e->handle] = e->keys.data();
  return Status::Ok();
}

void StoreImpl::ReleaseHandle(Extent* e) {
  handles_[e->handle] = nullptr;
  key_base_[e->handle] = nullptr;
  free_handles_.push_back(e->handle);
}

Extent* StoreImpl::FindBlock(const BlockKey& key, uint32_t* slot) const {
  const auto ref = index_.Find(key, KeyOf());
  if (!ref) return nullptr;
  *slot = ref->slot;
  return handles_[ref->handle];
}

void StoreImpl::IndexBlock(Extent* e, uint32_t slot, const BlockKey& key) {
  e->keys[slot] = key;
  e->set_present(slot, true);
  index_.Insert(key, BlockIndex::Ref{e->handle, slot}, KeyOf());
}

void StoreImpl::Unindex(Extent* e, uint32_t slot) {
  index_.Erase(e->keys[slot], BlockIndex::Ref{e->handle, slot}, KeyOf());
  if (e->medium == Medium::kDram) {
    Count(Medium::kDram, *e, slot, -1);
    dram_home_blocks_--;
  } else {
    if (e->in_copy(slot)) Count(Medium::kDram, *e, slot, -1);
    if (e->durable(slot) == kDurable) Count(Medium::kSsd, *e, slot, -1);
    else dram_only_--;
  }
  e->set_present(slot, false);
}

void StoreImpl::Unpin(Extent* e) {
  if (--e->pins == 0 && e->doomed) {
    const SessionId owner = e->session;
    Status s = FreeExtent(e);
    if (!s.ok()) LogWarning("freeing a dropped extent: " + s.ToString());
    else ForgetIfEmpty(owner);  // the last of a dropped session's extents
  }
}

uint32_t StoreImpl::Match(std::span<const BlockKey> chain) const {
  MutexLock lock(&mu_);
  uint32_t n = 0;
  while (n < chain.size() && Indexed(chain[n])) ++n;
  return n;
}

Status StoreImpl::SyncManifests() {
  Status first;
  for (auto& d : ssd_)
    if (Status s = d->manifest().Sync(); !s.ok() && first.ok()) first = s;
  return first;
}

Status StoreImpl::DropSession(SessionId session) {
  Status dropped = DropSessionLocked(session);
  if (!options_.sync_writes) return dropped;
  Status synced = SyncManifests();  // its free and reference records, outside mu_
  return dropped.ok() ? synced : dropped;
}

Status StoreImpl::DropSessionLocked(SessionId session) {
  MutexLock lock(&mu_);
  if (options_.read_only) return Status::FailedPrecondition("drop session: store is opened read-only");
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return Status::NotFound("session " + std::to_string(session) + " has no blocks");
  Status first;
  // Its references go first: the extents stay with their holders.
  for (uint64_t id : std::vector<uint64_t>(it->second.shared)) {
    auto xe = extents_.find(id);
    if (xe == extents_.end()) continue;
    Extent* x = xe->second.get();
    x->sharers.erase(std::remove(x->sharers.begin(), x->sharers.end(), session), x->sharers.end());
    if (Status s = LogSessions(*x); !s.ok() && first.ok()) first = s;
  }
  it->second.shared.clear();
  it->second.shared_from.clear();
  std::vector<uint64_t> ids = it->second.extents;
  for (uint64_t id : ids) {
    Extent* e = extents_[id].get();
    if (!e->sharers.empty()) {
      // Other live sessions reference its blocks: it passes to the most
      // recent of them, with its DRAM copy.
      SessionId heir = e->sharers.front();
      auto touch_of = [&](SessionId h) FLATKV_REQUIRES(mu_) {
        auto hs = sessions_.find(h);
        return hs == sessions_.end() ? uint64_t{0} : hs->second.touch;
      };
      for (SessionId h : e->sharers)
        if (touch_of(h) > touch_of(heir)) heir = h;
      e->sharers.erase(std::remove(e->sharers.begin(), e->sharers.end(), heir), e->sharers.end());
      Session& hs = sessions_[heir];
      hs.shared.erase(std::remove(hs.shared.begin(), hs.shared.end(), id), hs.shared.end());
      hs.extents.push_back(id);
      // Its positions become the heir's: from where the heir's chain met it.
      auto from = hs.shared_from.find(id);
      e->runs = {{0, from == hs.shared_from.end() ? 0 : from->second}};
      if (from != hs.shared_from.end()) hs.shared_from.erase(from);
      if (Status s = LogPositions(*e, 0); !s.ok() && first.ok()) first = s;
      const uint64_t held = DramBytesOf(*e);
      ChargeDram(hs, int64_t(held));
      ChargeDram(it->second, -int64_t(held));
      auto& own = it->second.extents;
      own.erase(std::remove(own.begin(), own.end(), id), own.end());
      if (it->second.open_extent == id) it->second.open_extent = 0;
      e->session = heir;
      if (Status s = LogSessions(*e); !s.ok() && first.ok()) first = s;
      continue;
    }
    if (e->pins > 0) {
      e->doomed = true;  // freed by the last Unpin
      continue;
    }
    Status s = FreeExtent(e);
    if (!s.ok() && first.ok()) first = s;
  }
  if (first.ok() && it->second.extents.empty()) {
    if (it->second.listed) lru_.erase(it->second.lru);
    sessions_.erase(it);
  }
  return first;
}

Status StoreImpl::ReadSums(const Extent& e, uint32_t first, uint32_t n, SumEntry* out) {
  const uint64_t layers = options_.shape.layers;
  if (e.sums_in_memory) {
    std::copy(e.sums.begin() + first * layers, e.sums.begin() + (uint64_t{first} + n) * layers, out);
    return Status::Ok();
  }
  return ssd_[e.device]->ReadSums(e.slot, first, std::span(out, n * layers));
}

uint64_t StoreImpl::StoredBytes(const Extent& e, uint32_t slot) const {
  return e.coded() ? e.stored[slot] : BlockBytes();
}

void StoreImpl::Count(Medium m, const Extent& e, uint32_t slot, int sign) {
  if (sign == 0) return;
  const uint64_t bytes = StoredBytes(e, slot);
  uint64_t& blocks = m == Medium::kDram ? dram_blocks_ : ssd_blocks_;
  uint64_t& stored = m == Medium::kDram ? dram_stored_ : ssd_stored_;
  if (sign > 0) {
    blocks++;
    stored += bytes;
  } else {
    blocks--;
    stored -= bytes;
  }
}

AlignedBuffer StoreImpl::AcquireWindow(uint64_t bytes) {
  {
    MutexLock lock(&window_mu_);
    // Smallest pooled buffer that fits.
    auto best = window_pool_.end();
    for (auto it = window_pool_.begin(); it != window_pool_.end(); ++it)
      if (it->size() >= bytes && (best == window_pool_.end() || it->size() < best->size())) best = it;
    if (best != window_pool_.end()) {
      AlignedBuffer b = std::move(*best);
      window_pool_.erase(best);
      return b;
    }
  }
  return AlignedBuffer(RoundUp(bytes, 4096), 4096);
}

void StoreImpl::ReleaseWindow(AlignedBuffer buffer) {
  if (buffer.size() == 0) return;
  MutexLock lock(&window_mu_);
  window_pool_.push_back(std::move(buffer));
  constexpr size_t kMaxPooled = 8;
  if (window_pool_.size() > kMaxPooled) {  // drop the smallest
    auto smallest = std::min_element(window_pool_.begin(), window_pool_.end(),
                                     [](const AlignedBuffer& a, const AlignedBuffer& b) { return a.size() < b.size(); });
    window_pool_.erase(smallest);
  }
}

void StoreImpl::EndRestore(const std::vector<uint64_t>& pinned, const std::vector<BlockRef>& corrupt,
                           const std::vector<BlockRef>& readmitted) {
  std::vector<SessionId> admit;
  {
    MutexLock lock(&mu_);
    for (const BlockRef& ref : readmitted) {
      auto it = extents_.find(ref.extent);
      if (it == extents_.end()) continue;
      Extent* e = it->second.get();
      if (!e->has_copy || !e->present(ref.slot) || e->in_copy(ref.slot)) continue;
      e->set_in_copy(ref.slot, true);
      Count(Medium::kDram, *e, ref.slot, +1);
      counters_.readmitted_blocks++;
      counters_.dram.bytes_written += BlockBytes();
    }
    for (const BlockRef& ref : corrupt) {
      auto it = extents_.find(ref.extent);
      if (it == extents_.end() || !it->second->present(ref.slot)) continue;
      Unindex(it->second.get(), ref.slot);
      counters_.dropped_blocks++;
      // Durably: a restart does not index it again.
      if (Status s = LogDropped(*it->second, std::span(&ref.slot, 1)); !s.ok())
        LogWarning("recording a dropped block: " + s.ToString() + " (a restart indexes it again)");
    }
    for (uint64_t id : pinned) {
      auto it = extents_.find(id);
      if (it == extents_.end()) continue;
      Extent* e = it->second.get();
      if (options_.ssd_admission == SsdAdmission::kOnReuse) {
        Session& s = sessions_[e->session];
        if (!s.reused) {
          s.reused = true;
          admit.push_back(e->session);
        }
      }
      Unpin(e);
    }
  }
  if (!admit.empty()) AdmitToSsd(admit);
}

}  // namespace flatkv
