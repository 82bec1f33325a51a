#include "store/store_impl.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "common/checksum.h"
#include "common/log.h"
#include "store/segment_writer.h"

namespace flatkv {
namespace {


Status ValidateOptions(const StoreOptions& o) {
  if (o.block_tokens < 16 || o.block_tokens > 512)
    return Status::InvalidArgument("block_tokens=" + std::to_string(o.block_tokens) + " (expected 16..512)");
  if (o.shape.layers != 0) FLATKV_RETURN_IF_ERROR(o.shape.Validate());
  else if (o.ssd_dirs.empty())
    return Status::InvalidArgument("shape: required (it can only be left empty to adopt an existing SSD store's)");
  if (o.dram_capacity_bytes == 0 && o.ssd_dirs.empty())
    return Status::InvalidArgument("no medium: dram_capacity_bytes is 0 and ssd_dirs is empty");
  if (!o.ssd_dirs.empty() && o.ssd_capacity_bytes == 0)
    return Status::InvalidArgument("ssd_capacity_bytes=0 with " + std::to_string(o.ssd_dirs.size()) + " SSD directories");
  if (o.segment_bytes < 4096 || o.segment_bytes % 4096 != 0)
    return Status::InvalidArgument("segment_bytes=" + std::to_string(o.segment_bytes) + " (expected a multiple of 4096)");
  if (o.max_request_bytes < 4096 || o.max_request_bytes % 4096 != 0)
    return Status::InvalidArgument("max_request_bytes=" + std::to_string(o.max_request_bytes) + " (expected a multiple of 4096)");
  if (o.window_layers == 0) return Status::InvalidArgument("window_layers=0 (expected >= 1)");
  if (o.ssd_queue_depth == 0 || o.ssd_threads == 0 || o.dram_threads == 0 || o.decode_threads == 0)
    return Status::InvalidArgument("ssd_queue_depth, ssd_threads, dram_threads and decode_threads must be >= 1");
  if (o.ssd_dirs.size() > 4095) return Status::InvalidArgument("at most 4095 SSD directories");
  std::unordered_set<std::string> seen;
  for (const auto& d : o.ssd_dirs)
    if (!seen.insert(d).second) return Status::InvalidArgument("SSD directory " + d + " listed twice");
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Store>> Store::Open(const StoreOptions& options) { return StoreImpl::Open(options); }

Result<std::unique_ptr<Store>> StoreImpl::Open(const StoreOptions& options) {
  FLATKV_RETURN_IF_ERROR(ValidateOptions(options));
  std::unique_ptr<StoreImpl> store(new StoreImpl(options));
  if (Status s = store->Init(); !s.ok()) {
    MutexLock lock(&store->mu_);
    store->closed_ = true;  // a half-opened store writes nothing back (no manifest rewrite)
    return s;
  }
  return std::unique_ptr<Store>(std::move(store));
}

Status StoreImpl::Init() {
  placement_ = options_.placement ? options_.placement : std::make_shared<DefaultPlacement>();
  dram_queue_ = std::make_unique<DramQueue>(options_.dram_threads);
  decode_queue_ = std::make_unique<DramQueue>(options_.decode_threads);
  if (!options_.ssd_dirs.empty()) {
    engine_ = options_.ssd_engine;
    if (!engine_) {
      switch (options_.ssd_io) {
        case IoEngineKind::kAuto: engine_ = io::MakeDefaultEngine(options_.ssd_queue_depth, options_.ssd_threads); break;
        case IoEngineKind::kThreadPool: engine_ = io::MakeThreadPoolEngine(options_.ssd_threads); break;
        case IoEngineKind::kUring: {
          FLATKV_ASSIGN_OR_RETURN(engine_, io::MakeUringEngine({options_.ssd_queue_depth}));
          break;
        }
      }
    }
    for (uint32_t d = 0; d < options_.ssd_dirs.size(); ++d) {
      persist::ManifestHeader header;
      if (options_.shape.layers != 0) {
        const uint64_t max_extent = std::min(options_.segment_bytes, options_.ssd_capacity_bytes);
        FLATKV_ASSIGN_OR_RETURN(ExtentGeometry g, ExtentGeometry::Make(options_.shape, options_.block_tokens,
                                                                      options_.ssd_extent_layer_bytes, max_extent,
                                                                      4096, "ssd extent"));
        header = {options_.shape, options_.block_tokens, options_.segment_bytes, g.extent_blocks,
                  g.slot_stride, g.layer_stride, g.extent_bytes};
      }
      SsdDirOptions so{options_.ssd_dirs[d], options_.ssd_capacity_bytes, options_.segment_bytes,
                       options_.use_direct_io, options_.read_only};
      persist::ManifestContents contents;
      auto dir = SsdDir::Open(so, header, engine_.get(), &contents);
      if (!dir.ok()) return dir.status();
      if (options_.shape.layers == 0) {  // adopt the first directory's shape for the rest
        options_.shape = contents.header.shape;
        options_.block_tokens = contents.header.block_tokens;
      }
      ssd_.push_back(std::move(dir).value());
      block_layer_bytes_ = options_.shape.BytesPerTokenLayer() * options_.block_tokens;  // recovery counts bytes
      FLATKV_RETURN_IF_ERROR(Recover(d, contents));
    }
  }
  block_layer_bytes_ = options_.shape.BytesPerTokenLayer() * options_.block_tokens;
  if (options_.codec)
    FLATKV_RETURN_IF_ERROR(options_.codec->Supports({options_.shape, options_.block_tokens})
                               .WithContext("codec " + options_.codec->Spec()));
  if (options_.dram_capacity_bytes > 0) {
    FLATKV_ASSIGN_OR_RETURN(ExtentGeometry g, ExtentGeometry::Make(options_.shape, options_.block_tokens,
                                                                  options_.dram_extent_layer_bytes,
                                                                  options_.dram_capacity_bytes, 1, "dram_capacity_bytes"));
    FLATKV_ASSIGN_OR_RETURN(dram_, DramArena::Create(options_.dram_capacity_bytes, g));
  }
  if (options_.window_bytes > 0) ReleaseWindow(AcquireWindow(options_.window_bytes));  // fault it in now
  return Status::Ok();
}

Status StoreImpl::Recover(uint32_t device, const persist::ManifestContents& contents) {
  SsdDir& dir = *ssd_[device];
  const uint32_t layers = dir.geometry().layers;
  std::vector<std::pair<uint64_t, persist::ExtentRef>> order;
  for (const auto& [ref, e] : contents.extents) order.push_back({e.sequence, ref});
  std::sort(order.begin(), order.end());
  bool dropped = false;
  MutexLock lock(&mu_);
  for (const auto& [seq, ref] : order) {
    const persist::ExtentRecord& rec = contents.extents.at(ref);
    const uint64_t slot = dir.SlotOf(ref);
    if (slot >= dir.slots().capacity())
      return Status::InvalidArgument(dir.path() + ": ssd_capacity_bytes=" + std::to_string(dir.capacity_bytes()) +
                                     " is smaller than the data already stored (extent " + std::to_string(ref.segment) +
                                     "/" + std::to_string(ref.slot) + " ends at byte " +
                                     std::to_string((slot + 1) * dir.geometry().extent_bytes) +
                                     "); reopen with a larger capacity, nothing was changed");
    if (!dir.SegmentHolds(slot) || !dir.slots().Claim(slot)) {
      LogWarning(dir.path() + ": extent " + std::to_string(ref.segment) + "/" + std::to_string(ref.slot) +
                 " has no segment file behind it; its " + std::to_string(rec.blocks.size()) + " blocks are lost");
      counters_.lost_blocks += rec.blocks.size();
      dropped = true;
      continue;
    }
    auto e = std::make_unique<Extent>();
    e->id = next_extent_id_++;
    e->medium = Medium::kSsd;
    e->device = device;
    e->slot = slot;
    e->base = dir.SlotAddress(slot);
    e->session = rec.session;
    e->last_access = Now();
    e->capacity = dir.geometry().extent_blocks;
    if (!rec.codec.empty()) {
      auto codec = CodecForSpec(rec.codec);
      if (!codec.ok()) {
        dir.slots().Release(slot);
        return codec.status().WithContext(dir.path() + ": extent " + std::to_string(ref.segment) + "/" +
                                          std::to_string(ref.slot) + " (nothing was changed)");
      }
      e->codec = codec.value();
      e->codec_spec = rec.codec;
      e->capacity = 0;
      for (const auto& b : rec.blocks) e->capacity = std::max(e->capacity, b.index + 1);
      e->enc_offset.assign(uint64_t{e->capacity} * layers, 0);
      e->enc_length.assign(uint64_t{e->capacity} * layers, 0);
    }
    e->reserved = e->capacity;  // recovered extents take no new blocks
    e->full = true;
    e->keys.resize(e->reserved);
    e->present.assign(e->reserved, 0);
    e->checksums.assign(uint64_t{e->reserved} * layers, 0);
    for (const auto& b : rec.blocks) {
      if (e->present[b.index] || index_.count(b.key)) continue;  // a duplicate put; the first copy wins
      e->present[b.index] = 1;
      e->keys[b.index] = b.key;
      std::copy(b.checksums.begin(), b.checksums.end(), e->checksums.begin() + uint64_t{b.index} * layers);
      if (e->coded()) {
        std::copy(b.offsets.begin(), b.offsets.end(), e->enc_offset.begin() + uint64_t{b.index} * layers);
        std::copy(b.lengths.begin(), b.lengths.end(), e->enc_length.begin() + uint64_t{b.index} * layers);
      }
      index_[b.key] = {e->id, b.index};
      CountBlock(*e, b.index, +1);
      ++counters_.recovered_blocks;
    }
    Session& s = TouchSession(rec.session);
    s.extents.push_back(e->id);
    extents_[e->id] = std::move(e);
  }
  if ((dropped || contents.torn_tail) && !options_.read_only) {
    FLATKV_RETURN_IF_ERROR(dir.manifest().Rewrite(Snapshot(device)));
  }
  return Status::Ok();
}

StoreImpl::~StoreImpl() {
  Status s = Close();
  if (!s.ok()) LogWarning("close: " + s.ToString());
}

Status StoreImpl::Close() {
  std::vector<std::pair<uint32_t, persist::ManifestContents>> snapshots;
  {
    MutexLock lock(&mu_);
    if (closed_) return Status::Ok();
    closed_ = true;
    if (options_.read_only) return Status::Ok();
    for (uint32_t d = 0; d < ssd_.size(); ++d) snapshots.push_back({d, Snapshot(d)});
  }
  Status first;
  for (auto& [d, c] : snapshots) {
    Status s = ssd_[d]->manifest().Rewrite(c);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

persist::ManifestContents StoreImpl::Snapshot(uint32_t device) {
  SsdDir& dir = *ssd_[device];
  const uint32_t layers = dir.geometry().layers;
  persist::ManifestContents snapshot;
  snapshot.header = dir.header();
  // LRU order: a session's extents get the sequence of its place in lru_.
  uint64_t sequence = 0;
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    for (uint64_t id : sessions_[*it].extents) {
      const Extent& e = *extents_.at(id);
      if (e.medium != Medium::kSsd || e.device != device) continue;
      persist::ExtentRecord rec{e.session, e.codec_spec, ++sequence, {}};
      for (uint32_t i = 0; i < e.reserved; ++i) {
        if (!e.present[i]) continue;
        const uint64_t from = uint64_t{i} * layers, to = uint64_t{i + 1} * layers;
        persist::BlockRecord b{i, e.keys[i], {e.checksums.begin() + from, e.checksums.begin() + to}, {}, {}};
        if (e.coded()) {
          b.offsets.assign(e.enc_offset.begin() + from, e.enc_offset.begin() + to);
          b.lengths.assign(e.enc_length.begin() + from, e.enc_length.begin() + to);
        }
        rec.blocks.push_back(std::move(b));
      }
      snapshot.extents[dir.RefOf(e.slot)] = std::move(rec);
    }
  }
  return snapshot;
}

Session& StoreImpl::TouchSession(SessionId id) {
  auto [it, inserted] = sessions_.try_emplace(id);
  Session& s = it->second;
  if (!inserted) lru_.erase(s.lru);
  lru_.push_front(id);
  s.lru = lru_.begin();
  s.last_access = Now();
  return s;
}

const ExtentGeometry& StoreImpl::Geometry(Medium m, uint32_t device) const {
  return m == Medium::kDram ? dram_->geometry() : ssd_[device]->geometry();
}

PlacementContext StoreImpl::MakeContext(SessionId session, PutHint hint) {
  PlacementContext c;
  c.session = session;
  c.hint = hint;
  c.session_dram_bytes = sessions_[session].dram_bytes;
  // 0: until the SSD-home placement lands, the former default of 64 MiB.
  c.session_share_bytes = options_.session_dram_share_bytes ? options_.session_dram_share_bytes : (64ull << 20);
  if (dram_) {
    const uint64_t eb = dram_->geometry().extent_bytes;
    c.dram_extent_bytes = eb;
    c.dram_capacity_bytes = dram_->capacity_bytes();
    c.dram_free_bytes = dram_->slots().free() * eb;
    const auto now = Now();
    for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
      const Session& s = sessions_[*it];
      if (now - s.last_access < options_.dram_idle_after) break;
      if (*it != session) c.dram_reclaimable_bytes += s.dram_bytes;
    }
  }
  for (const auto& d : ssd_) c.ssd_capacity_bytes += d->slots().capacity() * d->geometry().extent_bytes;
  return c;
}

bool StoreImpl::ReclaimFrom(Medium m, SessionId requester, bool idle_only) {
  const auto now = Now();
  for (auto it = lru_.rbegin(); it != lru_.rend(); ++it) {
    if (*it == requester) continue;
    Session& s = sessions_[*it];
    if (idle_only && now - s.last_access < options_.dram_idle_after) return false;
    for (auto e = s.extents.rbegin(); e != s.extents.rend(); ++e) {  // newest first: keep the prefix usable
      Extent* x = extents_[*e].get();
      if (x->medium != m || x->pins > 0 || x->doomed) continue;
      return Evict(x);
    }
  }
  if (idle_only) return false;
  auto self = sessions_.find(requester);
  if (self == sessions_.end()) return false;
  Extent* oldest = nullptr;
  for (uint64_t id : self->second.extents) {
    Extent* x = extents_[id].get();
    if (x->medium != m || x->pins > 0 || x->doomed || id == self->second.open_extent) continue;
    if (oldest == nullptr || x->last_access < oldest->last_access) oldest = x;
  }
  return oldest != nullptr && Evict(oldest);
}

bool StoreImpl::Evict(Extent* x) {
  const Medium m = x->medium;
  const uint64_t blocks = std::count(x->present.begin(), x->present.end(), 1);
  if (!FreeExtent(x).ok()) return false;
  counters_.of(m).evicted_extents++;
  counters_.of(m).evicted_blocks += blocks;
  return true;
}

Result<uint64_t> StoreImpl::AllocateSlot(Medium m, SessionId requester, uint32_t* device) {
  if (m == Medium::kDram) {
    if (!dram_) return Status::NoSpace("no DRAM tier");
    const bool idle_only = !ssd_.empty();  // with an SSD to fall back on, only idle sessions give up DRAM
    do {
      if (auto s = dram_->slots().Allocate()) return *s;
    } while (ReclaimFrom(m, requester, idle_only));
    return Status::NoSpace("dram: all " + std::to_string(dram_->slots().capacity()) + " extents are held by active sessions");
  }
  if (ssd_.empty()) return Status::NoSpace("no SSD tier");
  do {
    for (uint32_t k = 0; k < ssd_.size(); ++k) {
      const uint32_t d = (next_device_ + k) % ssd_.size();
      if (auto s = ssd_[d]->slots().Allocate()) {
        next_device_ = d + 1;
        *device = d;
        return *s;
      }
    }
  } while (ReclaimFrom(m, requester, false));
  return Status::NoSpace("ssd: every extent is in use and none can be evicted");
}

Result<Extent*> StoreImpl::CreateExtent(SessionId session, PutHint hint, const std::shared_ptr<const Codec>& codec,
                                        const std::string& spec) {
  Medium m = placement_->Choose(MakeContext(session, hint));
  if (m == Medium::kDram && !dram_) m = Medium::kSsd;
  if (m != Medium::kDram && ssd_.empty()) m = Medium::kDram;
  uint32_t device = 0;
  auto slot = AllocateSlot(m, session, &device);
  if (!slot.ok() && m == Medium::kDram && !ssd_.empty()) {
    m = Medium::kSsd;
    slot = AllocateSlot(m, session, &device);
  }
  if (!slot.ok()) return slot.status();
  auto e = std::make_unique<Extent>();
  e->id = next_extent_id_++;
  e->medium = m;
  e->device = device;
  e->slot = slot.value();
  e->session = session;
  e->last_access = Now();
  const ExtentGeometry& g = Geometry(m, device);
  if (codec) {  // per-slot vectors grow as slots are reserved
    e->codec = codec;
    e->codec_spec = spec;
    e->capacity = g.extent_blocks * persist::kCodedBlocksPerSlot;
    e->fill.assign(g.layers, 0);
  } else {
    e->capacity = g.extent_blocks;
    e->keys.resize(g.extent_blocks);
    e->present.assign(g.extent_blocks, 0);
    e->checksums.assign(uint64_t{g.extent_blocks} * g.layers, 0);
  }
  if (m == Medium::kDram) {
    e->base = dram_->SlotOffset(e->slot);
  } else {
    SsdDir& dir = *ssd_[device];
    e->base = dir.SlotAddress(e->slot);
    std::vector<uint8_t> rec;
    persist::EncodeExtentCreate(rec, dir.RefOf(e->slot), session, spec);
    Status s = dir.Locate(e->base, /*create=*/true).status();
    if (s.ok() && codec) s = dir.manifest().Upgrade(persist::kManifestVersionCoded);
    if (s.ok()) s = dir.manifest().Append(rec, options_.sync_writes);
    if (!s.ok()) {
      dir.slots().Release(e->slot);
      return s;
    }
  }
  Session& sess = sessions_[session];
  sess.extents.push_back(e->id);
  sess.open_extent = e->id;
  if (m == Medium::kDram) sess.dram_bytes += g.extent_bytes;
  Extent* raw = e.get();
  extents_[e->id] = std::move(e);
  return raw;
}

Status StoreImpl::FreeExtent(Extent* e) {
  if (e->medium == Medium::kSsd) {
    SsdDir& dir = *ssd_[e->device];
    std::vector<uint8_t> rec;
    persist::EncodeExtentFree(rec, dir.RefOf(e->slot));
    FLATKV_RETURN_IF_ERROR(dir.manifest().Append(rec, options_.sync_writes));
    dir.slots().Release(e->slot);
  } else {
    dram_->slots().Release(e->slot);
  }
  for (uint32_t i = 0; i < e->present.size(); ++i) {
    if (!e->present[i]) continue;
    auto it = index_.find(e->keys[i]);
    if (it != index_.end() && it->second.extent == e->id) index_.erase(it);
    CountBlock(*e, i, -1);
  }
  auto sit = sessions_.find(e->session);
  if (sit != sessions_.end()) {
    Session& s = sit->second;
    s.extents.erase(std::remove(s.extents.begin(), s.extents.end(), e->id), s.extents.end());
    if (s.open_extent == e->id) s.open_extent = 0;
    if (e->medium == Medium::kDram) s.dram_bytes -= Geometry(e->medium, e->device).extent_bytes;
  }
  extents_.erase(e->id);
  return Status::Ok();
}

void StoreImpl::Unpin(Extent* e) {
  if (--e->pins == 0 && e->doomed) {
    Status s = FreeExtent(e);
    if (!s.ok()) LogWarning("freeing a dropped extent: " + s.ToString());
  }
}

Status StoreImpl::Put(SessionId session, std::span<const BlockKey> keys, std::span<const std::byte> data,
                      const PutOptions& options) {
  const uint64_t block_bytes = BlockBytes();
  if (data.size() != keys.size() * block_bytes)
    return Status::InvalidArgument("put: data is " + std::to_string(data.size()) + " bytes, expected " +
                                   std::to_string(keys.size()) + " blocks x " + std::to_string(block_bytes) + " bytes");
  if (const auto& codec = options.codec ? options.codec : options_.codec)
    return PutCoded(session, keys, data, options, codec);
  std::vector<size_t> inputs;                      // index into keys/data of each block to write
  std::vector<std::pair<Extent*, uint32_t>> slots;  // where each goes
  std::vector<Extent*> pinned;
  Status alloc_status;
  {
    MutexLock lock(&mu_);
    if (closed_) return Status::FailedPrecondition("put: store is closed");
    if (options_.read_only) return Status::FailedPrecondition("put: store is opened read-only");
    TouchSession(session);
    std::unordered_set<BlockKey, BlockKeyHash> seen;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (index_.count(keys[i]) || !seen.insert(keys[i]).second) {
        counters_.dedup_blocks++;
        continue;
      }
      Session& s = sessions_[session];
      Extent* e = s.open_extent ? extents_[s.open_extent].get() : nullptr;
      if (e == nullptr || e->doomed || e->coded() || e->reserved == e->capacity) {
        auto created = CreateExtent(session, options.hint);
        if (!created.ok()) {
          alloc_status = created.status().WithContext("put: block " + std::to_string(i));
          break;
        }
        e = created.value();
      }
      if (std::find(pinned.begin(), pinned.end(), e) == pinned.end()) {
        e->pins++;
        pinned.push_back(e);
      }
      e->last_access = Now();
      inputs.push_back(i);
      slots.push_back({e, e->reserved++});
    }
  }
  const uint32_t layers = options_.shape.layers;
  std::vector<uint64_t> sums(inputs.size() * layers);
  for (size_t k = 0; k < inputs.size(); ++k)
    for (uint32_t l = 0; l < layers; ++l)
      sums[k * layers + l] = BlockChecksum(data.data() + inputs[k] * block_bytes + l * block_layer_bytes_, block_layer_bytes_);
  Status status = inputs.empty() ? Status::Ok() : WriteBlocks(slots, inputs, data);
  // Log SSD blocks in their directories' manifests; only then are they visible.
  if (status.ok()) {
    std::vector<std::vector<uint8_t>> records(ssd_.size());
    for (size_t k = 0; k < inputs.size(); ++k) {
      auto [e, slot] = slots[k];
      if (e->medium != Medium::kSsd) continue;
      persist::BlockRecord b{slot, keys[inputs[k]], {sums.begin() + k * layers, sums.begin() + (k + 1) * layers}, {}, {}};
      persist::EncodeBlockPut(records[e->device], ssd_[e->device]->RefOf(e->slot), b);
    }
    for (uint32_t d = 0; d < ssd_.size() && status.ok(); ++d)
      if (!records[d].empty()) status = ssd_[d]->manifest().Append(records[d], options_.sync_writes);
  }
  MutexLock lock(&mu_);
  if (status.ok()) {
    for (size_t k = 0; k < inputs.size(); ++k) {
      auto [e, slot] = slots[k];
      const BlockKey& key = keys[inputs[k]];
      if (!index_.try_emplace(key, BlockRef{e->id, slot}).second) continue;  // a concurrent put won
      e->present[slot] = 1;
      e->keys[slot] = key;
      std::copy(sums.begin() + k * layers, sums.begin() + (k + 1) * layers, e->checksums.begin() + uint64_t{slot} * layers);
      CountBlock(*e, slot, +1);
      counters_.put_blocks++;
      counters_.of(e->medium).bytes_written += BlockBytes();
    }
  }
  for (Extent* e : pinned) Unpin(e);
  return status.ok() ? alloc_status : status;
}

Status StoreImpl::WriteBlocks(const std::vector<std::pair<Extent*, uint32_t>>& slots, const std::vector<size_t>& inputs,
                              std::span<const std::byte> data) {
  const uint64_t block_bytes = BlockBytes();
  const uint32_t layers = options_.shape.layers;
  SegmentWriter writer(*this);
  Status status;
  size_t k = 0;
  while (k < slots.size() && status.ok()) {
    // A run: consecutive slots of one extent.
    size_t n = 1;
    while (k + n < slots.size() && slots[k + n].first == slots[k].first && slots[k + n].second == slots[k].second + n) ++n;
    Extent* e = slots[k].first;
    const uint32_t first = slots[k].second;
    const ExtentGeometry& g = Geometry(e->medium, e->device);
    if (e->medium == Medium::kDram) {
      for (uint32_t l = 0; l < layers; ++l)
        for (size_t j = 0; j < n; ++j)
          std::memcpy(dram_->At(e->base + g.Offset(l, first + j)),
                      data.data() + inputs[k + j] * block_bytes + l * block_layer_bytes_, block_layer_bytes_);
      k += n;
      continue;
    }
    auto loc = ssd_[e->device]->Locate(e->base, true);
    if (!loc.ok()) {
      status = loc.status();
      break;
    }
    auto [fd, file_base] = loc.value();
    const uint64_t run_bytes = n * g.slot_stride;
    for (uint32_t l = 0; l < layers && status.ok(); ++l) {
      auto dst = writer.Stage(run_bytes, run_bytes * layers);
      if (!dst.ok()) {
        status = dst.status();
        break;
      }
      for (size_t j = 0; j < n; ++j) {
        std::memcpy(*dst + j * g.slot_stride, data.data() + inputs[k + j] * block_bytes + l * block_layer_bytes_,
                    block_layer_bytes_);
        std::memset(*dst + j * g.slot_stride + block_layer_bytes_, 0, g.slot_stride - block_layer_bytes_);
      }
      writer.Submit(fd, file_base + g.Offset(l, first), *dst, run_bytes);
    }
    k += n;
  }
  Status finished = writer.Finish();
  return status.ok() ? finished : status;
}

uint32_t StoreImpl::Match(std::span<const BlockKey> chain) const {
  MutexLock lock(&mu_);
  uint32_t n = 0;
  while (n < chain.size() && index_.count(chain[n])) ++n;
  return n;
}

Status StoreImpl::DropSession(SessionId session) {
  MutexLock lock(&mu_);
  if (options_.read_only) return Status::FailedPrecondition("drop session: store is opened read-only");
  auto it = sessions_.find(session);
  if (it == sessions_.end()) return Status::NotFound("session " + std::to_string(session) + " has no blocks");
  std::vector<uint64_t> ids = it->second.extents;
  Status first;
  for (uint64_t id : ids) {
    Extent* e = extents_[id].get();
    if (e->pins > 0) {
      e->doomed = true;  // freed by the last Unpin
      continue;
    }
    Status s = FreeExtent(e);
    if (!s.ok() && first.ok()) first = s;
  }
  if (first.ok() && it->second.extents.empty()) {
    lru_.erase(it->second.lru);
    sessions_.erase(it);
  }
  return first;
}

StoreStats StoreImpl::Stats() const {
  StoreStats st;
  auto fill = [](MediumStats& m, const MediumCounters& c) {
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
      st.dram.extents = dram_->slots().used();
      st.dram.used_bytes = st.dram.extents * dram_->geometry().extent_bytes;
    }
    st.ssd_direct_io = !ssd_.empty();
    for (const auto& d : ssd_) {
      st.ssd.capacity_bytes += d->capacity_bytes();
      st.ssd.extents += d->slots().used();
      st.ssd.used_bytes += d->slots().used() * d->geometry().extent_bytes;
      st.ssd_direct_io = st.ssd_direct_io && d->all_direct();
      st.manifest_bytes += d->manifest().bytes();
    }
    st.dram.blocks = dram_blocks_;
    st.ssd.blocks = ssd_blocks_;
    st.dram.stored_bytes = dram_stored_;
    st.ssd.stored_bytes = ssd_stored_;
    st.dram.logical_bytes = dram_blocks_ * BlockBytes();
    st.ssd.logical_bytes = ssd_blocks_ * BlockBytes();
    st.sessions = sessions_.size();
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
  st.recovered_blocks = counters_.recovered_blocks;
  st.lost_blocks = counters_.lost_blocks;
  st.restore_p50_us = counters_.restore_latency.Percentile(0.5);
  st.restore_p90_us = counters_.restore_latency.Percentile(0.9);
  st.restore_p99_us = counters_.restore_latency.Percentile(0.99);
  st.restore_max_us = counters_.restore_latency.Max();
  return st;
}

uint64_t StoreImpl::StoredBytes(const Extent& e, uint32_t slot) const {
  if (!e.coded()) return BlockBytes();
  const uint32_t layers = options_.shape.layers;
  uint64_t n = 0;
  for (uint32_t l = 0; l < layers; ++l) n += e.enc_length[uint64_t{slot} * layers + l];
  return n;
}

void StoreImpl::CountBlock(const Extent& e, uint32_t slot, int sign) {
  const uint64_t bytes = StoredBytes(e, slot);
  uint64_t& blocks = e.medium == Medium::kDram ? dram_blocks_ : ssd_blocks_;
  uint64_t& stored = e.medium == Medium::kDram ? dram_stored_ : ssd_stored_;
  if (sign > 0) {
    blocks++;
    stored += bytes;
  } else {
    blocks--;
    stored -= bytes;
  }
}

Result<std::shared_ptr<const Codec>> StoreImpl::CodecForSpec(const std::string& spec) {
  if (options_.codec && options_.codec->Spec() == spec) return options_.codec;
  auto it = codecs_.find(spec);
  if (it != codecs_.end()) return it->second;
  auto made = MakeCodec(spec);
  if (!made.ok())
    return Status::NotSupported("stored with codec '" + spec + "', which this build cannot make (" +
                                made.status().message() + "); pass it as StoreOptions::codec");
  std::shared_ptr<const Codec> codec = std::move(made).value();
  codecs_[spec] = codec;
  return codec;
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

void StoreImpl::EndRestore(const std::vector<uint64_t>& pinned, const std::vector<BlockRef>& corrupt) {
  MutexLock lock(&mu_);
  for (const BlockRef& ref : corrupt) {
    auto it = extents_.find(ref.extent);
    if (it == extents_.end() || !it->second->present[ref.slot]) continue;
    Extent* e = it->second.get();
    auto idx = index_.find(e->keys[ref.slot]);
    if (idx != index_.end() && idx->second.extent == e->id) index_.erase(idx);
    e->present[ref.slot] = 0;
    CountBlock(*e, ref.slot, -1);
  }
  for (uint64_t id : pinned) {
    auto it = extents_.find(id);
    if (it != extents_.end()) Unpin(it->second.get());
  }
}

}  // namespace flatkv
