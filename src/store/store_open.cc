// StoreImpl's life: options checked, media and queues set up, the SSD
// directories recovered from their manifests, and the manifests rewritten
// at Close (docs/architecture.md, "Durability" and "Recovery").
#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "common/checksum.h"
#include "common/log.h"
#include "store/segment_writer.h"
#include "store/store_impl.h"

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
  if (o.ssd_layers_in_flight == 0) return Status::InvalidArgument("ssd_layers_in_flight=0 (expected >= 1)");
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
                  g.slot_stride, g.layer_stride, g.extent_bytes, options_.sized_extents ? 1u : 0u};
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
      if (!options_.read_only) ssd_.back()->manifest().StartCheckpoints(options_.manifest_checkpoint_bytes);
    }
  }
  block_layer_bytes_ = options_.shape.BytesPerTokenLayer() * options_.block_tokens;
  if (options_.codec)
    FLATKV_RETURN_IF_ERROR(options_.codec->Supports({options_.shape, options_.block_tokens})
                               .WithContext("codec " + options_.codec->Spec()));
  if (options_.dram_capacity_bytes > 0 && !ssd_.empty()) {
    // DRAM holds copies of SSD extents, laid out as their homes are (DRAM
    // homes use the largest SSD extent's layout, sized like it); its unit is
    // the smallest SSD unit, which every SSD extent's bytes are a multiple of.
    ExtentGeometry g = ssd_[0]->geometry();
    uint64_t unit = ssd_[0]->unit_bytes();
    for (const auto& d : ssd_) {
      if (d->geometry().extent_bytes > g.extent_bytes) g = d->geometry();
      unit = std::min(unit, d->unit_bytes());
    }
    if (options_.dram_capacity_bytes < g.extent_bytes)
      return Status::InvalidArgument("dram_capacity_bytes=" + std::to_string(options_.dram_capacity_bytes) +
                                     " is smaller than one SSD extent (" + std::to_string(g.extent_bytes) +
                                     " bytes), which a DRAM copy mirrors; raise it, or set it to 0 for no DRAM tier");
    FLATKV_ASSIGN_OR_RETURN(dram_, DramArena::Create(options_.dram_capacity_bytes, g, unit));
  } else if (options_.dram_capacity_bytes > 0) {
    FLATKV_ASSIGN_OR_RETURN(ExtentGeometry g, ExtentGeometry::Make(options_.shape, options_.block_tokens,
                                                                  options_.dram_extent_layer_bytes,
                                                                  options_.dram_capacity_bytes, 1, "dram_capacity_bytes"));
    FLATKV_ASSIGN_OR_RETURN(dram_, DramArena::Create(options_.dram_capacity_bytes, g,
                                                     options_.sized_extents ? g.BlockSlotBytes() : g.extent_bytes));
  }
  write_budget_ = options_.ssd_write_buffer_bytes
                      ? options_.ssd_write_buffer_bytes
                      : std::max<uint64_t>(SegmentWriter::kWaveBytes, (dram_ ? dram_->capacity_bytes() : 0) / 4);
  if (options_.window_bytes > 0) ReleaseWindow(AcquireWindow(options_.window_bytes));  // fault it in now
  // The media past the index that the options configure (the remote tier).
  FLATKV_ASSIGN_OR_RETURN(media_, OpenMedia(MediumContext{options_, block_layer_bytes_}));
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
  uint64_t blocks = 0;
  for (const auto& [ref, e] : contents.extents) blocks += e.blocks.size() + e.tagged.size();
  index_.Reserve(blocks);  // the first directory's: no growth while its blocks go in
  for (const auto& [seq, ref] : order) {
    const persist::ExtentRecord& rec = contents.extents.at(ref);
    const uint64_t slot = dir.UnitOf(ref);
    const uint32_t extent_blocks = persist::ExtentBlocks(dir.header(), rec);
    const uint64_t units = dir.UnitsFor(extent_blocks);
    if (slot + units > dir.units().capacity())
      return Status::InvalidArgument(dir.path() + ": ssd_capacity_bytes=" + std::to_string(dir.capacity_bytes()) +
                                     " is smaller than the data already stored (extent " + std::to_string(ref.segment) +
                                     "/" + std::to_string(ref.slot) + " ends at byte " +
                                     std::to_string((slot + units) * dir.unit_bytes()) +
                                     "); reopen with a larger capacity, nothing was changed");
    if (!dir.SegmentHolds(slot, units) || !dir.units().Claim(slot, units)) {
      LogWarning(dir.path() + ": extent " + std::to_string(ref.segment) + "/" + std::to_string(ref.slot) +
                 " has no segment file behind it, or overlaps another extent; its " +
                 std::to_string(rec.blocks.size() + rec.tagged.size()) + " blocks are lost");
      counters_.lost_blocks += rec.blocks.size() + rec.tagged.size();
      dropped = true;
      continue;
    }
    auto e = std::make_unique<Extent>();
    e->id = next_extent_id_++;
    e->medium = Medium::kSsd;
    e->device = device;
    e->slot = slot;
    e->units = units;
    e->base = dir.UnitAddress(slot);
    e->geom = dir.GeometryFor(extent_blocks);
    e->session = rec.session;
    e->last_access = Now();
    e->capacity = extent_blocks;
    // Tagged directories read their sums tables as they are (the truth);
    // older ones rebuild them from the records below, or keep them in
    // memory when read-only.
    e->tagged = dir.tagged_sums();
    e->sums_in_memory = options_.read_only && !e->tagged;
    if (!rec.codec.empty()) {
      auto codec = CodecForSpec(rec.codec);
      if (!codec.ok()) {
        dir.units().Release(slot, units);
        return codec.status().WithContext(dir.path() + ": extent " + std::to_string(ref.segment) + "/" +
                                          std::to_string(ref.slot) + " (nothing was changed)");
      }
      e->codec = codec.value();
      e->codec_spec = rec.codec;
      e->capacity = 0;
      for (const auto& b : rec.blocks) e->capacity = std::max(e->capacity, b.index + 1);
      for (const auto& b : rec.tagged) e->capacity = std::max(e->capacity, b.index + 1);
    }
    e->reserved = e->capacity;  // recovered extents take no new blocks
    e->full = true;
    e->runs = rec.positions;
    if (Status hs = AddHandle(e.get()); !hs.ok()) {
      dir.units().Release(slot, units);
      return hs.WithContext(dir.path() + " (nothing was changed)");
    }
    GrowSlots(e.get(), e->reserved);
    // The sums table is a cache of these records: rebuilt for the extent
    // in one write (or kept in memory when read-only), so a table a crash
    // tore, or one an older build left stale, is never read.
    std::vector<SumEntry> table(e->tagged ? 0 : uint64_t{e->reserved} * layers);
    // Each record's block enters the index unless its key already did (a
    // duplicate put: two puts of the block raced, each writing its own; the
    // first copy wins, and this extent's session holds it, as it did in the
    // store that wrote them, Commit). `fill` takes what the record says per
    // block: a version 6 record's tag (and coded size), else its per-layer
    // sums into the table.
    uint64_t recovered = 0;
    auto each = [&](const auto& blocks, const auto& fill) FLATKV_REQUIRES(mu_) {
      constexpr size_t kAhead = 8;  // index buckets loaded ahead: each is a cache miss at scale
      for (size_t k = 0; k < std::min(kAhead, blocks.size()); ++k) index_.Prefetch(blocks[k].key);
      for (size_t k = 0; k < blocks.size(); ++k) {
        const auto& b = blocks[k];
        if (k + kAhead < blocks.size()) index_.Prefetch(blocks[k + kAhead].key);
        if (e->present(b.index)) continue;
        uint32_t first_at = 0;
        if (Extent* first = FindBlock(b.key, &first_at)) {
          if (first != e.get() && first->session != rec.session &&
              std::find(first->sharers.begin(), first->sharers.end(), rec.session) == first->sharers.end()) {
            first->sharers.push_back(rec.session);
            TouchSession(rec.session).shared.push_back(first->id);
          }
          continue;
        }
        IndexBlock(e.get(), b.index, b.key);
        fill(b);
        e->set_durable(b.index, kDurable);
        Count(Medium::kSsd, *e, b.index, +1);
        ++recovered;
      }
    };
    each(rec.tagged, [&](const persist::TaggedBlock& b) {  // nothing per layer here
      e->tags[b.index] = b.tag;
      if (e->coded()) e->stored[b.index] = b.stored;
    });
    each(rec.blocks, [&](const persist::BlockRecord& b) {
      for (uint32_t l = 0; l < layers; ++l) {
        SumEntry& t = table[uint64_t{b.index} * layers + l];
        t.checksum = b.checksums[l];
        if (e->coded()) {
          t.offset = b.offsets[l];
          t.length = b.lengths[l];
          e->stored[b.index] += b.lengths[l];
        }
      }
    });
    counters_.recovered_blocks += recovered;
    if (e->tagged) {
    } else if (e->sums_in_memory) {
      e->sums = std::move(table);
    } else if (Status ws = dir.WriteSums(slot, 0, table); !ws.ok()) {
      return ws.WithContext("rebuilding the sums table");
    }
    Session& s = TouchSession(rec.session);
    s.extents.push_back(e->id);
    for (uint32_t i = e->reserved; i-- > 0 && !e->runs.empty();)
      if (e->present(i)) {
        s.next_position = std::max(s.next_position, e->PositionOf(i) + 1);
        break;
      }
    for (SessionId h : rec.sharers) {
      if (h == rec.session || std::find(e->sharers.begin(), e->sharers.end(), h) != e->sharers.end()) continue;
      e->sharers.push_back(h);
      TouchSession(h).shared.push_back(e->id);
    }
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
  StopPrefetches();  // their restores end before the store does
  std::vector<std::pair<uint32_t, persist::ManifestContents>> snapshots;
  {
    MutexLock lock(&mu_);
    if (closed_) return Status::Ok();
    closed_ = true;
  }
  for (auto& m : media_) m->Stop();  // what puts queued is published first (the remote tier: for a few seconds at most)
  {
    MutexLock lock(&mu_);
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
      persist::ExtentRecord rec{e.session, e.codec_spec, ++sequence, {}, e.sharers, e.runs,
                                dir.sized() ? e.geom.extent_blocks : 0};
      if (e.tagged) {  // the records carry the tags (the tables are the truth)
        for (uint32_t i = 0; i < e.reserved; ++i)
          if (e.present(i) && e.durable(i) == kDurable)
            rec.tagged.push_back({i, e.tags[i], e.keys[i], e.coded() ? e.stored[i] : 0});
        snapshot.extents[dir.RefOf(e.slot)] = std::move(rec);
        continue;
      }
      // The sums come from the table: one buffered read per extent, under
      // mu_ (only at Close and recovery, when no put runs).
      std::vector<SumEntry> sums(uint64_t{e.reserved} * layers);
      if (Status rs = ReadSums(e, 0, e.reserved, sums.data()); !rs.ok()) {
        LogWarning("snapshot: " + rs.ToString() + "; extent " + std::to_string(e.id) + "'s blocks are not recorded");
        continue;
      }
      for (uint32_t i = 0; i < e.reserved; ++i) {
        if (!e.present(i) || e.durable(i) != kDurable) continue;  // DRAM-only blocks do not survive a restart
        persist::BlockRecord b{i, e.keys[i], {}, {}, {}};
        for (uint32_t l = 0; l < layers; ++l) {
          const SumEntry& t = sums[uint64_t{i} * layers + l];
          b.checksums.push_back(t.checksum);
          if (e.coded()) {
            b.offsets.push_back(t.offset);
            b.lengths.push_back(t.length);
          }
        }
        rec.blocks.push_back(std::move(b));
      }
      snapshot.extents[dir.RefOf(e.slot)] = std::move(rec);
    }
  }
  return snapshot;
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

}  // namespace flatkv
