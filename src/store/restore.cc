#include "store/restore.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "codec/codec_internal.h"
#include "common/checksum.h"
#include "common/log.h"

namespace flatkv {

HostWindow::HostWindow(StoreImpl* store, uint32_t slots, uint64_t slot_bytes)
    : store_(store), slots_(slots), slot_bytes_(slot_bytes), buffer_(store->AcquireWindow(uint64_t{slots} * slot_bytes)) {}

HostWindow::~HostWindow() { store_->ReleaseWindow(std::move(buffer_)); }

RestoreImpl::RestoreImpl(StoreImpl* store, std::span<const BlockKey> chain, const RestoreTarget& target,
                         const std::function<Extent*(const BlockKey&, uint32_t*)>& find)
    : store_(store),
      layers_(store->options().shape.layers),
      lb_(store->BlockLayerBytes()),
      max_request_(store->options().max_request_bytes),
      start_(Clock::now()),
      target_(target) {
  if (!store->media().empty()) chain_.assign(chain.begin(), chain.end());
  for (const BlockKey& key : chain) {
    uint32_t slot = 0;
    Extent* e = find(key, &slot);
    if (e == nullptr) break;
    // The fastest medium that holds the block (DRAM: its home or copy; SSD:
    // its home once that write has completed). None: not readable yet.
    Source* source = nullptr;
    uint64_t base = 0;
    for (Source* s : store->local_sources())
      if (s->Holds(*e, slot, &base)) {
        source = s;
        break;
      }
    if (source == nullptr) break;
    const Medium from = source->medium();
    const ExtentGeometry& g = e->geom;  // a copy has its home's layout
    Run* last = runs_.empty() ? nullptr : &runs_.back();
    if (last && last->extent == e->id && last->source == source && last->first_slot + last->count == slot) {
      last->count++;
    } else {
      Run r;
      r.source = source;
      r.extent = e->id;
      r.first_slot = slot;
      r.first_block = hit_;
      r.count = 1;
      r.slot_stride = g.slot_stride;
      r.layer_stride = g.layer_stride;
      r.codec = e->codec;
      if (r.codec) r.params_bytes = static_cast<uint32_t>(8 * r.codec->Params().size());
      const uint64_t first = r.codec ? 0 : g.Offset(0, slot);  // coded: the region start
      auto origin = source->Origin(*e, base, first);
      if (!origin.ok()) {
        LogWarning("restore: " + origin.status().ToString() + "; the chain misses from block " + std::to_string(hit_));
        break;
      }
      r.device = origin->device;
      r.fd = origin->fd;
      r.src = origin->src;
      any_coded_ = any_coded_ || r.codec != nullptr;
      runs_.push_back(std::move(r));
      if (std::find(pinned_.begin(), pinned_.end(), e->id) == pinned_.end()) {
        e->last_access = store->Now();
        e->pins++;
        pinned_.push_back(e->id);
      }
    }
    // Coded: the region start here; LoadSums adds the slice's offset.
    locations_.push_back({Address::Make(from, runs_.back().device, base + (e->coded() ? 0 : g.Offset(0, slot))), g.layer_stride});
    if (e->sums_in_memory) {
      const uint64_t at = uint64_t{slot} * layers_;
      for (uint32_t l = 0; l < layers_; ++l) {
        const SumEntry& s = e->sums[at + l];
        checksums_.push_back(s.checksum);
        enc_off_.push_back(s.offset);
        enc_len_.push_back(s.length);
      }
    } else {
      Run& r = runs_.back();
      r.table = true;
      r.tagged = e->tagged;
      r.home_device = e->device;
      r.home_slot = e->slot;
      if (e->tagged) {
        tags_.resize(hit_ + 1, 0);
        tags_[hit_] = e->tags[slot];
      }
      checksums_.insert(checksums_.end(), layers_, 0);
      enc_off_.insert(enc_off_.end(), layers_, 0);
      enc_len_.insert(enc_len_.end(), layers_, 0);
    }
    source->counters()->hit_blocks++;
    ++hit_;
  }
  Counters& c = store->counters();
  c.restores++;
  c.lookup_blocks += chain.size();
  c.miss_blocks += chain.size() - hit_;
  MutexLock lock(&mu_);
  valid_ = hit_;
  state_.resize(layers_);
}

bool RestoreImpl::AllSettled() {
  return std::all_of(state_.begin(), state_.end(), [](const LayerState& s) { return s.pending == 0; });
}

RestoreImpl::~RestoreImpl() {
  std::vector<BlockRef> corrupt, readmitted;
  {
    MutexLock lock(&mu_);
    abandoned_ = true;
    cv_.SignalAll();
    while (!AllSettled() || AnyStreamRunning() || pumping_ > 0) cv_.Wait(&mu_);
    corrupt.swap(corrupt_);
    // A block valid in every layer was copied in every layer.
    if (layers_ready_ == layers_)
      for (const Run& r : runs_)
        for (uint32_t j = 0; r.readmit && j < r.count && r.first_block + j < valid_; ++j)
          readmitted.push_back({r.extent, r.first_slot + j});
  }
  store_->EndRestore(pinned_, corrupt, readmitted);
}

std::vector<uint64_t> RestoreImpl::SsdRunExtents() const {
  std::vector<uint64_t> out;
  for (const Run& r : runs_)
    if (r.source->readmits() && std::find(out.begin(), out.end(), r.extent) == out.end()) out.push_back(r.extent);
  return out;
}

void RestoreImpl::SetReadmit(uint64_t extent, uint64_t copy_base) {
  for (Run& r : runs_) {
    if (!r.source->readmits() || r.extent != extent) continue;
    r.readmit = true;
    r.copy_src = copy_base + (r.codec ? 0 : uint64_t{r.first_slot} * r.slot_stride);
  }
}

void RestoreImpl::CopyRaw(uint32_t layer, const Run& r, uint32_t j0, std::span<const std::byte* const> where,
                          uint32_t good) {
  for (uint32_t j = 0; j < good; ++j) {
    std::byte* dst = store_->dram()->At(r.copy_src + uint64_t{layer} * r.layer_stride + uint64_t{j0 + j} * r.slot_stride);
    std::memcpy(dst, where[j], lb_);
    std::memset(dst + lb_, 0, r.slot_stride - lb_);
  }
}

uint64_t RestoreImpl::PlanLanding(bool layer_area) {
  const uint64_t layer_bytes = uint64_t{hit_} * lb_;
  uint64_t prev_end = 0, end = layer_area ? layer_bytes : 0;
  for (Run& r : runs_) {
    if (r.codec) continue;  // decoded in place
    const uint64_t dst = uint64_t{r.first_block} * lb_;
    uint64_t land = std::max(dst, prev_end);
    // Coded runs decode into their places while raw runs land: a raw run
    // that needs moving lands clear of the decoded layer.
    if (any_coded_ && (land != dst || r.slot_stride != lb_)) land = std::max(land, layer_bytes);
    land = RoundUp(land, r.source->land_align());  // O_DIRECT destinations are 4 KiB aligned
    r.land = land;
    r.fixup = land != dst || r.slot_stride != lb_;
    prev_end = land + uint64_t{r.count} * r.slot_stride;
    end = std::max(end, prev_end);
  }
  uint64_t stage = RoundUp(end, 4096);  // coded SSD pieces' encoded bytes, each its largest layer's span
  for (Piece& p : pieces_) {
    const Run& r = runs_[p.run];
    if (!r.codec || r.source->mapped()) continue;  // decoded where the medium holds it
    p.stage = stage;
    uint64_t most = 0;
    for (uint32_t l = 0; l < layers_; ++l) {
      uint64_t b, e;
      CodedSpan(r, l, p.j0, p.n, 4096, &b, &e);
      most = std::max(most, e - b);
    }
    stage += most;
  }
  return stage;
}

void RestoreImpl::BadSums(const Run& r, uint32_t j, const std::string& why) {
  LogWarning("restore: block " + std::to_string(r.first_block + j) + " of extent " + std::to_string(r.extent) + ": " +
             why + "; the chain misses from there");
  {
    MutexLock lock(&mu_);
    corrupt_.push_back({r.extent, r.first_slot + j});
  }
  store_->counters().checksum_failures++;
  Truncate(r.first_block + j);
}

void RestoreImpl::LoadSums() {
  std::vector<SumEntry> entries;
  for (size_t i = 0; i < runs_.size(); ++i) {
    const Run& r = runs_[i];
    const uint64_t at = uint64_t{r.first_block} * layers_;
    // A raw run of a source that does not verify reads no checksums.
    if (r.table && (r.codec || r.source->verifies())) {
      entries.assign(uint64_t{r.count} * layers_, SumEntry{});
      Status s = store_->ssd(r.home_device)->ReadSums(r.home_slot, r.first_slot, entries);
      if (!s.ok()) {
        LogWarning("restore: " + s.ToString() + "; the chain misses from block " + std::to_string(r.first_block));
        Truncate(r.first_block);
        return;
      }
      // Counted as SSD bytes read: the price of holding no sums in memory.
      store_->counters().ssd.bytes_read += entries.size() * sizeof(SumEntry);
      for (uint64_t k = 0; k < entries.size(); ++k) {
        checksums_[at + k] = entries[k].checksum;
        enc_off_[at + k] = entries[k].offset;
        enc_len_[at + k] = entries[k].length;
      }
      // Where the table is the truth, each block's entries must be the ones
      // its put wrote (a torn table, or a stale one under a reused slot,
      // would otherwise vouch for stale bytes): else it misses, as a
      // checksum mismatch does.
      for (uint32_t j = 0; r.tagged && j < r.count; ++j) {
        if (persist::SumsTag(&entries[uint64_t{j} * layers_], layers_ * sizeof(SumEntry)) == tags_[r.first_block + j]) continue;
        return BadSums(r, j, "its sums-table entries do not match its record's tag");
      }
    }
    if (!r.codec) continue;
    // Coded slices of consecutive slots follow each other in every layer
    // region; anything else is a damaged entry, never a read plan.
    for (uint32_t j = 0; j < r.count; ++j) {
      const uint64_t b = at + uint64_t{j} * layers_;
      bool ok = true;
      for (uint32_t l = 0; l < layers_ && ok; ++l) {
        const uint64_t end = uint64_t{enc_off_[b + l]} + enc_len_[b + l];
        ok = enc_len_[b + l] > 0 && end <= r.layer_stride &&
             (j == 0 || enc_off_[b + l] >= uint64_t{enc_off_[b - layers_ + l]} + enc_len_[b - layers_ + l]);
      }
      if (!ok) {
        return BadSums(r, j, "its sums entry does not describe a slice of the layer region");
      }
      BlockLocation& loc = locations_[r.first_block + j];
      loc.layer0 = Address::Make(loc.layer0.medium(), loc.layer0.device(), loc.layer0.offset() + enc_off_[b]);
    }
  }
}

void RestoreImpl::Truncate(uint32_t blocks) {
  if (blocks >= hit_) return;
  Counters& c = store_->counters();
  c.miss_blocks += hit_ - blocks;
  while (!runs_.empty() && runs_.back().first_block + runs_.back().count > blocks) {
    Run& r = runs_.back();
    const uint32_t keep = r.first_block >= blocks ? 0 : blocks - r.first_block;
    if (MediumCounters* mc = r.source->counters()) mc->hit_blocks -= r.count - keep;
    if (keep > 0) {
      r.count = keep;
      break;
    }
    runs_.pop_back();
  }
  hit_ = blocks;
  locations_.resize(blocks);
  checksums_.resize(uint64_t{blocks} * layers_);
  enc_off_.resize(uint64_t{blocks} * layers_);
  enc_len_.resize(uint64_t{blocks} * layers_);
  MutexLock lock(&mu_);
  valid_ = std::min(valid_, blocks);
}

// What a run of a medium past the index calls, from that medium's thread.
class RestoreImpl::Stream final : public FetchSink {
 public:
  Stream(RestoreImpl* restore, size_t index) : restore_(restore), index_(index) {}
  std::byte* AwaitLanding(uint32_t layer, uint32_t block) override { return restore_->StreamLanding(index_, layer, block); }
  bool SettleThrough(uint32_t layer, uint32_t valid) override { return restore_->StreamSettleThrough(index_, layer, valid); }
  void End(uint32_t end) override {
    MutexLock lock(&restore_->mu_);
    restore_->EndStream(index_, end);
  }

 private:
  RestoreImpl* restore_;
  size_t index_;
};

void RestoreImpl::AttachStream(Source* source, std::unique_ptr<Fetch> fetch) {
  const uint32_t n = fetch->blocks() - hit_;
  Run r;
  r.source = source;
  r.first_block = hit_;
  r.count = n;
  r.slot_stride = lb_;
  r.fetch = std::move(fetch);
  for (uint32_t j = 0; j < n; ++j) locations_.push_back({Address::Make(source->medium(), 0, 0), 0});
  checksums_.resize(checksums_.size() + uint64_t{n} * layers_, 0);  // a fetch verifies what it streams
  enc_off_.resize(checksums_.size(), 0);
  enc_len_.resize(checksums_.size(), 0);
  store_->counters().miss_blocks -= n;
  hit_ += n;
  const size_t stream = sinks_.size();
  sinks_.push_back(std::make_unique<Stream>(this, stream));
  MutexLock lock(&mu_);
  streams_.push_back({runs_.size()});
  runs_.push_back(std::move(r));
  valid_ = hit_;
}

bool RestoreImpl::AnyStreamRunning() const {
  return std::any_of(streams_.begin(), streams_.end(), [](const StreamState& s) { return s.running; });
}

std::byte* RestoreImpl::StreamLanding(size_t stream, uint32_t layer, uint32_t block) {
  MutexLock lock(&mu_);
  const Run& run = runs_[streams_[stream].run];
  while (!state_[layer].issued && !abandoned_) cv_.Wait(&mu_);
  if (!state_[layer].issued) return nullptr;
  if (Direct(layer, streams_[stream].run)) return Dst(layer, block);
  return window_->slot(layer % slots_) + run.land + uint64_t{block - run.first_block} * lb_;
}

bool RestoreImpl::StreamSettleThrough(size_t stream, uint32_t layer, uint32_t valid) {
  MutexLock lock(&mu_);
  StreamState& st = streams_[stream];
  for (; st.next <= layer; ++st.next) {
    while (!state_[st.next].issued && !abandoned_) cv_.Wait(&mu_);
    if (!state_[st.next].issued) return false;
    SettleStream(st.next, valid);
  }
  return !abandoned_;
}

void RestoreImpl::SettleStream(uint32_t layer, uint32_t end) {
  LayerState& st = state_[layer];
  if (end < hit_) st.bad = std::min(st.bad, end);
  if (--st.pending == 0) {
    FinalizeLayer(layer);
    cv_.SignalAll();
  }
}

void RestoreImpl::EndStream(size_t stream, uint32_t end) {
  StreamState& s = streams_[stream];
  for (; s.next < layers_ && state_[s.next].issued; ++s.next) SettleStream(s.next, end);
  s.done = true;  // layers issued from now on count no unit of it
  s.end = end;
  s.running = false;
  cv_.SignalAll();
}

Status RestoreImpl::Begin() {
  LoadSums();
  // The blocks after the local prefix that the media past the index hold,
  // each asked for what the ones before it did not supply.
  for (const auto& m : store_->media())
    if (hit_ < chain_.size())
      if (auto fetch = m->source()->Find(chain_, hit_)) AttachStream(m->source(), std::move(fetch));
  if (hit_ == 0) return Status::Ok();
  // Every layer reads the same pieces: each run, split at max_request_bytes.
  for (size_t r = 0; r < runs_.size(); ++r) {
    const Run& run = runs_[r];
    if (run.fetch) continue;  // streamed by its fetch
    if (!run.codec) {
      const uint32_t per = std::max<uint64_t>(1, max_request_ / run.slot_stride);
      for (uint32_t j = 0; j < run.count; j += per) pieces_.push_back({r, j, std::min(per, run.count - j)});
      continue;
    }
    // Coded: a piece read into staging (SSD) reads at most max_request_bytes
    // in any layer; a piece of mapped memory (DRAM) is one decode job.
    for (uint32_t j = 0, n; j < run.count; j += n) {
      for (n = 1; j + n < run.count; ++n) {
        if (run.source->mapped()) {
          if (uint64_t{n + 1} * lb_ > kDecodeJobBytes) break;
          continue;
        }
        bool over = false;
        for (uint32_t l = 0; l < layers_ && !over; ++l) {
          uint64_t b, e;
          CodedSpan(run, l, j, n + 1, 4096, &b, &e);
          over = e - b > max_request_;
        }
        if (over) break;
      }
      pieces_.push_back({r, j, n});
    }
  }
  const StoreOptions& o = store_->options();
  const bool reads_device = std::any_of(runs_.begin(), runs_.end(), [](const Run& r) { return !r.source->mapped(); });
  bool need_window = true;
  bool layer_area = true;  // a slot holds the layer itself (else only coded SSD pieces' staging)
  if (target_.destination) {
    dst_.resize(uint64_t{layers_} * hit_);
    for (uint32_t l = 0; l < layers_; ++l)
      for (uint32_t b = 0; b < hit_; ++b) {
        std::byte* d = target_.destination(l, b);
        if (d == nullptr) return Status::InvalidArgument("restore: no destination for layer " + std::to_string(l) +
                                                         " block " + std::to_string(b));
        dst_[uint64_t{l} * hit_ + b] = d;
      }
    // Runs of a source that scatters (DRAM, streams) are copied block by
    // block to wherever they go; the others (SSD) are read in place when
    // their destinations form one aligned range. Into device memory, only
    // a source that can land there is: the rest land, are checked and
    // decoded in the window, which copies each layer over (FinalizeLayer).
    direct_.assign(uint64_t{layers_} * runs_.size(), 0);
    need_window = false;
    layer_area = false;
    // Into device memory, a file-backed run (SSD) is read in place too where
    // the landing reads its file (cuFile), asked once per file.
    std::vector<uint8_t> reads_file(runs_.size(), 0);
    if (target_.device) {
      // Coded runs whose codec the landing decodes carry encoded slices there.
      const SliceLayout layout{o.shape, o.block_tokens, 0, SliceLayout::kUnknownPosition};
      for (Run& run : runs_) run.device_decode = run.codec && target_.device->Decodes(*run.codec, layout);
      std::vector<std::pair<int, bool>> asked;
      for (size_t r = 0; r < runs_.size(); ++r) {
        const Run& run = runs_[r];
        if (run.fd < 0 || run.fetch || run.codec || run.source->CanLand(LandingKind::kDevice)) continue;
        auto it = std::find_if(asked.begin(), asked.end(), [&](const auto& a) { return a.first == run.fd; });
        if (it == asked.end()) it = asked.insert(asked.end(), {run.fd, target_.device->ReadsFile(run.fd)});
        reads_file[r] = it->second;
      }
    }
    for (uint32_t l = 0; l < layers_; ++l)
      for (size_t r = 0; r < runs_.size(); ++r) {
        Run& run = runs_[r];
        // Sources that scatter copy block by block; coded runs decode into place.
        bool direct = run.source->scatters() || run.codec;
        if (target_.device) direct = (run.source->CanLand(LandingKind::kDevice) && !run.codec) || run.device_decode;
        if (!direct && (!target_.device || reads_file[r])) {
          std::byte* first = Dst(l, run.first_block);
          direct = run.slot_stride == lb_ && reinterpret_cast<uintptr_t>(first) % 4096 == 0;
          for (uint32_t j = 1; direct && j < run.count; ++j) direct = Dst(l, run.first_block + j) == first + j * lb_;
          if (direct && target_.device) {
            run.device_reads = true;
            run.readmit = false;
          }
        }
        direct_[l * runs_.size() + r] = direct;
        need_window = need_window || !direct || (run.codec && !run.source->mapped());  // staging
        layer_area = layer_area || !direct;
      }
  }
  // The layers in flight. The window's size bounds its memory; a restore
  // reading a device with no window (every read lands in the caller's
  // destinations) holds none, so only the device's bound applies to it.
  // Reading a device, fewer layers in flight land one after another: each is
  // checked while later ones arrive, and layer 0 (read alone first, ramp_)
  // is ready early. All of a small session's layers at once land together.
  const uint64_t layer_bytes = uint64_t{hit_} * lb_;
  slots_ = static_cast<uint32_t>(std::clamp<uint64_t>(std::max<uint64_t>(o.window_layers, o.window_bytes / layer_bytes), 1,
                                                      layers_));
  if (reads_device) slots_ = std::min(need_window ? slots_ : layers_, o.ssd_layers_in_flight);
  // Destinations reused every reuse_layers layers (the caller's window):
  // that many in flight, and a layer's place frees only when the consumer
  // releases the one before it there.
  if (target_.reuse_layers > 0) slots_ = std::min(target_.reuse_layers, layers_);
  span_ = PlanSpan();
  if (need_window) {
    const uint64_t slot_bytes = PlanLanding(layer_area);
    window_ = std::make_unique<HostWindow>(store_, slots_, RoundUp(slot_bytes, 4096));
    if (!window_->ok())
      return Status::NoSpace("restore: cannot allocate a window of " + std::to_string(slots_) + " x " +
                             std::to_string(slot_bytes) + " bytes");
    if (target_.device) target_.device->Pin({window_->slot(0), uint64_t{slots_} * window_->slot_bytes()});
  }
  for (size_t i = 0; i < sinks_.size(); ++i) {
    size_t run;
    {
      MutexLock lock(&mu_);
      streams_[i].running = true;
      run = streams_[i].run;
    }
    if (!runs_[run].fetch->Start(sinks_[i].get())) {  // the medium stopped (the store is closing): its blocks are misses
      MutexLock lock(&mu_);
      EndStream(i, runs_[run].first_block);
    }
  }
  {
    MutexLock lock(&mu_);
    // Without streams every layer settles through Settle, which can issue
    // the layers it frees a slot for; a stream's layers wait for the consumer.
    eager_ = streams_.empty();
    reach_ = slots_;
    ramp_ = eager_ && slots_ < layers_ && reads_device;
  }
  Pump();
  return Status::Ok();
}

uint32_t RestoreImpl::PlanSpan() const {
  // One run of a device read whole in every layer (a session within one
  // extent), its layers adjacent on the medium and in the destinations
  // (layer-major): layers 1.. then read several per request, as a raw read
  // of the same bytes would, instead of one request (a device notify, a
  // completion, a hand-off) per layer. Two spans fit in the layers in flight
  // so one is checked while the next arrives. Only for small layers: from
  // kSpanLayerBytes on a request per layer costs little, and a span lands
  // (and frees its layers' places) only whole.
  if (!target_.destination || target_.reuse_layers > 0 || !sinks_.empty() || runs_.size() != 1 || pieces_.size() != 1 ||
      layers_ < 3)
    return 1;
  const Run& r = runs_[0];
  if (r.codec || r.source->scatters()) return 1;
  const uint64_t layer_run = uint64_t{r.count} * lb_;
  if (layer_run >= kSpanLayerBytes || r.slot_stride != lb_ || r.layer_stride != layer_run) return 1;
  for (uint32_t l = 0; l < layers_; ++l)
    if (!Direct(l, 0) || Dst(l, r.first_block) != Dst(0, r.first_block) + l * layer_run) return 1;
  const uint64_t span = std::min<uint64_t>(max_request_ / layer_run, std::max(slots_ / 2, 1u));
  return span > 1 ? static_cast<uint32_t>(span) : 1;
}

bool RestoreImpl::Issuable(uint32_t layer) const {
  const LayerState& st = state_[layer];
  if (st.issued || abandoned_) return false;
  // A device shares itself among the requests in flight: layer 0 goes alone,
  // or a full window of layers would all land together, late.
  if (ramp_ && layer > 0 && layers_ready_ == 0) return false;
  if (layer < slots_) return true;
  // Its slot frees when the layer before it in the slot is released, or, for
  // a restore into the caller's destinations, once that layer has left it.
  const LayerState& prev = state_[layer - slots_];
  return prev.released || (eager_ && target_.destination && target_.reuse_layers == 0 && prev.ready);
}

std::vector<uint32_t> RestoreImpl::ArmLocked() {
  std::vector<uint32_t> armed;
  // Only layers from the first unissued one up to a window's length past the
  // last issued one can be issuable: a layer's slot frees with a layer issued
  // before it (Issuable), so a landing looks at a window's layers, not all.
  while (unissued_ < layers_ && state_[unissued_].issued) ++unissued_;
  uint32_t through = 0;  // a span is armed whole: its layers up to here
  for (uint32_t l = unissued_; l < layers_ && (l < reach_ || l < through); ++l) {
    if (l >= through) {
      if (!Issuable(l)) continue;
      if (span_ > 1) {
        const uint32_t end = SpanEnd(l);
        bool whole = l == SpanBegin(l);
        for (uint32_t k = l + 1; whole && k < end; ++k) whole = Issuable(k);
        if (!whole) continue;
        through = end;
      }
    }
    reach_ = std::max(reach_, l + slots_ + 1);
    // Count every request first, so the layer cannot finalize early.
    LayerState& st = state_[l];
    st.issued = true;
    st.pending = static_cast<uint32_t>(pieces_.size());
    for (const StreamState& s : streams_) {
      if (!s.done) {
        st.pending++;  // settled by its fetch
      } else if (s.end < hit_) {
        st.bad = std::min(st.bad, s.end);
      }
    }
    if (!streams_.empty() && st.pending == 0) FinalizeLayer(l);
    armed.push_back(l);
  }
  if (!armed.empty()) {
    ++pumping_;
    cv_.SignalAll();  // a fetch or the consumer may wait for these layers
  }
  return armed;
}

void RestoreImpl::Pump() {
  std::vector<uint32_t> armed;
  {
    MutexLock lock(&mu_);
    armed = ArmLocked();
  }
  if (!armed.empty()) SubmitArmed(armed);
}

void RestoreImpl::SubmitArmed(const std::vector<uint32_t>& armed) {
  for (uint32_t l : armed) Issue(l);
  MutexLock lock(&mu_);
  --pumping_;  // the destructor may go on once every armed layer has been issued
  cv_.SignalAll();
}

void RestoreImpl::Issue(uint32_t layer) {
  if (span_ > 1) {
    if (layer == SpanBegin(layer)) IssueSpan(layer);
    return;
  }
  std::byte* slot = window_ ? window_->slot(layer % slots_) : nullptr;
  for (const Piece& p : pieces_) {
    const Run& r = runs_[p.run];
    if (r.codec) {
      IssueCoded(layer, p, slot);
      continue;
    }
    const bool direct = Direct(layer, p.run);
    const uint64_t src = r.src + uint64_t{layer} * r.layer_stride + uint64_t{p.j0} * r.slot_stride;
    const uint64_t len = uint64_t{p.n} * r.slot_stride;
    // Where each block of the piece will be once it has arrived.
    std::vector<const std::byte*> where(p.n);
    for (uint32_t j = 0; j < p.n; ++j)
      where[j] = direct ? Dst(layer, r.first_block + p.j0 + j) : slot + r.land + uint64_t{p.j0 + j} * r.slot_stride;
    MediumCounters& mc = *r.source->counters();
    mc.read_requests++;
    mc.bytes_read += len;
    r.source->Read({r.fd, src, r.slot_stride, lb_, std::move(where), direct ? target_.device : nullptr},
                   [this, layer, &r, p](Status s, std::vector<const std::byte*> where) {
                     Complete(layer, r, p.j0, std::move(where), std::move(s));
                   });
  }
}

void RestoreImpl::IssueSpan(uint32_t first) {
  const Run& r = runs_[0];
  const uint32_t end = SpanEnd(first);
  std::vector<const std::byte*> where;
  where.reserve(uint64_t{end - first} * r.count);
  for (uint32_t l = first; l < end; ++l)
    for (uint32_t j = 0; j < r.count; ++j) where.push_back(Dst(l, r.first_block + j));
  MediumCounters& mc = *r.source->counters();
  mc.read_requests++;
  mc.bytes_read += where.size() * r.slot_stride;
  r.source->Read({r.fd, r.src + uint64_t{first} * r.layer_stride, r.slot_stride, lb_, std::move(where)},
                 [this, first, &r](Status s, std::vector<const std::byte*> where) {
                   CompleteSpan(first, r, std::move(where), std::move(s));
                 });
}

void RestoreImpl::CompleteSpan(uint32_t first, const Run& r, std::vector<const std::byte*> where, Status status) {
  const uint32_t end = SpanEnd(first), n = r.count;
  if (!status.ok()) {
    store_->counters().io_errors++;
    LogWarning("restore: layers " + std::to_string(first) + "-" + std::to_string(end - 1) + ": " + status.ToString() +
               "; blocks from " + std::to_string(r.first_block) + " on are misses, and the blocks it read leave the index");
    const uint32_t bad = r.first_block;
    std::vector<BlockRef> read = ReadBlocks(r, 0, n);
    // The last Settle may let the restore go: nothing of it after that.
    for (uint32_t l = first; l < end; ++l) Settle(l, bad, l == first ? read : std::vector<BlockRef>{});
    return;
  }
  const bool verify = r.source->verifies();
  const uint64_t layer_bytes = uint64_t{n} * lb_;
  if (!verify || uint64_t{end - first} * layer_bytes <= kVerifyJobBytes) {
    for (uint32_t l = first; l < end; ++l)
      VerifyBlocks(l, r, 0, std::span(where).subspan(uint64_t{l - first} * n, n), verify);
    return;
  }
  // Checked by several decode-queue workers, whole layers each (Complete).
  auto landed = std::make_shared<const std::vector<const std::byte*>>(std::move(where));
  const uint32_t per = static_cast<uint32_t>(std::max<uint64_t>(1, kVerifyJobBytes / layer_bytes));
  for (uint32_t a = first; a < end; a += per) {
    const uint32_t b = std::min(end, a + per);
    store_->decode_queue()->Submit([this, &r, first, a, b, n, landed] {
      for (uint32_t l = a; l < b; ++l) VerifyBlocks(l, r, 0, std::span(*landed).subspan(uint64_t{l - first} * n, n), true);
    });
  }
}

std::vector<BlockRef> RestoreImpl::ReadBlocks(const Run& r, uint32_t j0, uint32_t n) {
  std::vector<BlockRef> refs;
  for (uint32_t j = j0; j < j0 + n; ++j) refs.push_back({r.extent, r.first_slot + j});
  return refs;
}

void RestoreImpl::Settle(uint32_t layer, uint32_t bad, const std::vector<BlockRef>& corrupt) {
  std::vector<uint32_t> armed;
  {
    MutexLock lock(&mu_);
    LayerState& st = state_[layer];
    st.bad = std::min(st.bad, bad);
    corrupt_.insert(corrupt_.end(), corrupt.begin(), corrupt.end());
    // Waiters wait for a layer to be ready or for every layer to settle: wake
    // them when this layer's last unit lands, not at every piece (a wake per
    // 256 KiB copy cost the DRAM path half its speed in context switches).
    if (--st.pending == 0) {
      FinalizeLayer(layer);
      if (eager_) armed = ArmLocked();  // what this layer's landing lets go
      cv_.SignalAll();
    }
  }
  // With nothing armed the restore may be gone by now (its destructor waits
  // for the last unit to settle): call nothing of it.
  if (!armed.empty()) SubmitArmed(armed);
}

void RestoreImpl::Complete(uint32_t layer, const Run& r, uint32_t j0, std::vector<const std::byte*> where, Status status) {
  const uint32_t n = static_cast<uint32_t>(where.size());
  const bool on_device = target_.device && Direct(layer, static_cast<size_t>(&r - runs_.data()));
  // A copy or file read into device memory failed: the landing's failure
  // (the DMA, the driver), not the medium's: the blocks stay.
  if (!status.ok() && on_device) {
    LogWarning("restore: layer " + std::to_string(layer) + ": landing in device memory: " + status.ToString() +
               "; blocks from " + std::to_string(r.first_block + j0) + " on are misses");
    return Settle(layer, r.first_block + j0, {});
  }
  if (!status.ok()) {
    const uint32_t bad = r.first_block + j0;
    store_->counters().io_errors++;
    LogWarning("restore: layer " + std::to_string(layer) + ": " + status.ToString() + "; blocks from " +
               std::to_string(bad) + " on are misses, and the blocks it read leave the index");
    return Settle(layer, bad, ReadBlocks(r, j0, n));
  }
  if (on_device && r.device_reads) {
    // Read into device memory (the landing's file reads): checked there, the
    // blocks adjacent (Begin reads a run in place only then).
    std::vector<uint64_t> sums(n);
    if (Status s = target_.device->Checksums(where[0], n, lb_, sums.data()); !s.ok()) {
      LogWarning("restore: layer " + std::to_string(layer) + ": checksums in device memory: " + s.ToString() +
                 "; blocks from " + std::to_string(r.first_block + j0) + " on are misses");
      return Settle(layer, r.first_block + j0, {});
    }
    return VerifyBlocks(layer, r, j0, where, true, sums.data());
  }
  if (on_device && r.source->verifies()) {
    // Landed in device memory: check the bytes it was copied from.
    for (uint32_t j = 0; j < n; ++j)
      where[j] = r.source->Map(r.src + uint64_t{layer} * r.layer_stride + uint64_t{j0 + j} * r.slot_stride);
  }
  if (!r.source->verifies() || uint64_t{n} * lb_ <= kVerifyJobBytes)
    return VerifyBlocks(layer, r, j0, where, r.source->verifies());
  // A large piece is checksummed by several workers of the decode queue, not
  // by the one I/O completion thread: that thread would otherwise check
  // every SSD byte alone, and the layers that land together at the end of a
  // restore would wait for it one after another.
  auto landed = std::make_shared<const std::vector<const std::byte*>>(std::move(where));
  SubmitJobs(layer, n, kVerifyJobBytes, [this, layer, &r, j0, landed](uint32_t j, uint32_t m) {
    VerifyBlocks(layer, r, j0 + j, std::span(*landed).subspan(j, m), true);
  });
}

void RestoreImpl::SubmitJobs(uint32_t layer, uint32_t n, uint64_t job_bytes,
                             const std::function<void(uint32_t, uint32_t)>& job) {
  const uint32_t per = static_cast<uint32_t>(std::max<uint64_t>(1, job_bytes / lb_));
  const uint32_t jobs = (n + per - 1) / per;
  {
    MutexLock lock(&mu_);
    state_[layer].pending += jobs - 1;  // the blocks' one pending unit becomes `jobs`
  }
  for (uint32_t j = 0; j < n; j += per) {
    const uint32_t m = std::min(per, n - j);
    store_->decode_queue()->Submit([job, j, m] { job(j, m); });
  }
}

void RestoreImpl::VerifyBlocks(uint32_t layer, const Run& r, uint32_t j0, std::span<const std::byte* const> where,
                               bool verify, const uint64_t* sums) {
  uint32_t bad = UINT32_MAX;
  std::vector<BlockRef> corrupt;
  Counters& c = store_->counters();
  const uint32_t n = static_cast<uint32_t>(where.size());
  for (uint32_t j = 0; verify && j < n; ++j) {
    const uint32_t block = r.first_block + j0 + j;
    if ((sums ? sums[j] : BlockChecksum(where[j], lb_)) == checksums_[uint64_t{block} * layers_ + layer]) continue;
    c.checksum_failures++;
    LogWarning("restore: block " + std::to_string(block) + " layer " + std::to_string(layer) + " (" +
               std::string(MediumName(r.source->medium())) + " extent " + std::to_string(r.extent) + " slot " +
               std::to_string(r.first_slot + j0 + j) + "): checksum mismatch; it and every later block are misses");
    corrupt.push_back({r.extent, r.first_slot + j0 + j});
    bad = block;
    break;
  }
  r.source->counters()->bytes_delivered += uint64_t{n} * lb_;
  if (r.readmit) CopyRaw(layer, r, j0, where, bad == UINT32_MAX ? n : bad - (r.first_block + j0));
  Settle(layer, bad, corrupt);
}

void RestoreImpl::FinalizeLayer(uint32_t layer) {
  if (window_) {
    std::byte* slot = window_->slot(layer % slots_);
    for (size_t i = 0; i < runs_.size(); ++i) {
      const Run& r = runs_[i];
      if (Direct(layer, i)) continue;
      if (r.fixup)
        for (uint32_t j = 0; j < r.count; ++j)
          std::memmove(slot + uint64_t{r.first_block + j} * lb_, slot + r.land + uint64_t{j} * r.slot_stride, lb_);
      if (target_.device) {
        // One copy per stretch of adjacent destinations (the whole run, into
        // a GPU window's slot). Under mu_: the copy is short next to the
        // reads that land in a window slot, and the slot is free after it.
        for (uint32_t j = 0; j < r.count;) {
          uint32_t k = j + 1;
          while (k < r.count && Dst(layer, r.first_block + k) == Dst(layer, r.first_block + j) + uint64_t{k - j} * lb_) ++k;
          Status s = target_.device->Copy(Dst(layer, r.first_block + j), slot + uint64_t{r.first_block + j} * lb_,
                                          uint64_t{k - j} * lb_);
          if (!s.ok()) {
            LogWarning("restore: layer " + std::to_string(layer) + ": copy to the device: " + s.ToString() +
                       "; blocks from " + std::to_string(r.first_block + j) + " on are misses");
            state_[layer].bad = std::min(state_[layer].bad, r.first_block + j);
            break;
          }
          j = k;
        }
      } else if (target_.destination) {
        for (uint32_t j = 0; j < r.count; ++j)
          std::memcpy(Dst(layer, r.first_block + j), slot + uint64_t{r.first_block + j} * lb_, lb_);
      }
    }
  }
  LayerState& st = state_[layer];
  valid_ = std::min(valid_, st.bad);
  st.ready = true;
  if (++layers_ready_ == layers_)
    store_->counters().restore_latency.Record(std::chrono::duration<double, std::micro>(Clock::now() - start_).count());
}

Result<LayerView> RestoreImpl::WaitLayer(uint32_t layer) {
  if (layer >= layers_)
    return Status::InvalidArgument("restore: layer " + std::to_string(layer) + " of a " + std::to_string(layers_) + "-layer model");
  if (hit_ == 0) return LayerView{layer, 0, {}};
  MutexLock lock(&mu_);
  LayerState& st = state_[layer];
  if (st.released) return Status::FailedPrecondition("restore: layer " + std::to_string(layer) + " was already released");
  if (!st.issued && !WillIssue(layer))
    return Status::FailedPrecondition("restore: layer " + std::to_string(layer) + " is beyond the window of " +
                                      std::to_string(slots_) + " layers; release layer " +
                                      std::to_string(layer - slots_) + " first");
  while (!st.ready) cv_.Wait(&mu_);
  if (target_.destination) return LayerView{layer, valid_, {}};
  return LayerView{layer, valid_, std::span<const std::byte>(window_->slot(layer % slots_), uint64_t{valid_} * lb_)};
}

void RestoreImpl::ReleaseLayer(uint32_t layer) {
  if (layer >= layers_ || hit_ == 0) return;
  {
    MutexLock lock(&mu_);
    LayerState& st = state_[layer];
    if (!st.ready || st.released) return;
    st.released = true;
  }
  Pump();
}

bool RestoreImpl::WillIssue(uint32_t layer) const {
  return eager_ && (layer < slots_ || (target_.destination && target_.reuse_layers == 0) || state_[layer - slots_].released);
}

uint32_t RestoreImpl::Finish() {
  if (hit_ == 0) return 0;
  for (uint32_t l = 0; l < layers_; ++l) {
    {
      MutexLock lock(&mu_);
      if (state_[l].released) continue;
      // Not issued and not to be without a release: issued below when its slot frees.
      if (!state_[l].issued && !WillIssue(l)) continue;
      while (!state_[l].ready) cv_.Wait(&mu_);
    }
    ReleaseLayer(l);
  }
  MutexLock lock(&mu_);
  return valid_;
}

Result<std::unique_ptr<Restore>> StoreImpl::StartRestore(std::span<const BlockKey> chain, const RestoreTarget& target) {
  return StartRestoreImpl(chain, target, options_.readmit_on_restore);
}

Result<std::unique_ptr<Restore>> StoreImpl::StartRestoreImpl(std::span<const BlockKey> chain,
                                                             const RestoreTarget& target, bool readmit) {
  FLATKV_RETURN_IF_ERROR(target.Check());
  std::unique_ptr<RestoreImpl> r;
  {
    MutexLock lock(&mu_);
    if (closed_) return Status::FailedPrecondition("restore: store is closed");
    r = std::make_unique<RestoreImpl>(
        this, chain, target, [this](const BlockKey& k, uint32_t* slot) FLATKV_REQUIRES(mu_) { return FindBlock(k, slot); });
    if (readmit)
      for (uint64_t id : r->SsdRunExtents()) {
        Extent* e = extents_.at(id).get();
        if (e->has_copy || GiveCopy(e)) r->SetReadmit(id, e->copy_base);
      }
    for (uint64_t id : std::set<uint64_t>(r->pinned().begin(), r->pinned().end()))
      if (auto it = extents_.find(id); it != extents_.end()) {
        auto s = sessions_.find(it->second->session);
        if (s != sessions_.end()) TouchSession(s->first);
      }
  }
  FLATKV_RETURN_IF_ERROR(r->Begin());
  return std::unique_ptr<Restore>(std::move(r));
}

}  // namespace flatkv
