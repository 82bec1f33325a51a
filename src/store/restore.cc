#include "store/restore.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "codec/codec_internal.h"
#include "common/checksum.h"
#include "common/log.h"

namespace flatkv {
namespace {

// Decoded bytes one decode job produces: small enough to spread a layer
// over the decode workers, large enough to amortize the queueing.
constexpr uint64_t kDecodeJobBytes = 1ull << 20;

// Decodes a slice the store kept with `codec`: the header must name this
// codec and describe `layout` (Corruption naming the field otherwise).
Status DecodeStored(CodecContext& ctx, const Codec& codec, uint32_t params_bytes, const SliceLayout& layout,
                    std::span<const std::byte> in, std::span<std::byte> out) {
  FLATKV_ASSIGN_OR_RETURN(codec::SliceHeader h, codec::ParseHeader(in));
  const bool mla = layout.shape.kind == AttentionKind::kMla;
  const uint32_t dim_a = mla ? layout.shape.latent_dim : layout.shape.kv_heads;
  const uint32_t dim_b = mla ? layout.shape.rope_dim : layout.shape.head_dim;
  auto mismatch = [](const char* field, uint64_t got, uint64_t want) {
    return Status::Corruption("encoded slice: " + std::string(field) + " " + std::to_string(got) + ", expected " +
                              std::to_string(want));
  };
  if (h.codec_id != codec.id()) return mismatch("codec id", h.codec_id, codec.id());
  if (h.kind != layout.shape.kind) return mismatch("attention kind", uint64_t(h.kind), uint64_t(layout.shape.kind));
  if (h.dtype != layout.shape.dtype) return mismatch("dtype", uint64_t(h.dtype), uint64_t(layout.shape.dtype));
  if (h.tokens != layout.tokens) return mismatch("tokens", h.tokens, layout.tokens);
  if (h.dim_a != dim_a || h.dim_b != dim_b) return mismatch("dimensions", uint64_t{h.dim_a} << 32 | h.dim_b, uint64_t{dim_a} << 32 | dim_b);
  if (h.layer != (layout.layer & 0xFFFF)) return mismatch("layer", h.layer, layout.layer);
  if (h.params_bytes != params_bytes) return mismatch("parameter bytes", h.params_bytes, params_bytes);
  SliceLayout l = layout;
  l.first_position = h.first_position;
  const size_t start = codec::kHeaderBytes + h.params_bytes;
  return codec.Decode(ctx, l, in.subspan(start, codec::kHeaderBytes + h.body_bytes - start), out.first(layout.Bytes()));
}

}  // namespace

HostWindow::HostWindow(StoreImpl* store, uint32_t slots, uint64_t slot_bytes)
    : store_(store), slots_(slots), slot_bytes_(slot_bytes), buffer_(store->AcquireWindow(uint64_t{slots} * slot_bytes)) {}

HostWindow::~HostWindow() { store_->ReleaseWindow(std::move(buffer_)); }

RestoreImpl::RestoreImpl(StoreImpl* store, std::span<const BlockKey> chain, const RestoreTarget& target,
                         const std::function<Extent*(const BlockKey&, uint32_t*)>& find)
    : store_(store),
      layers_(store->options().shape.layers),
      lb_(store->BlockLayerBytes()),
      verify_dram_(store->options().verify_dram_reads),
      max_request_(store->options().max_request_bytes),
      start_(Clock::now()),
      target_(target) {
  if (store->remote()) chain_.assign(chain.begin(), chain.end());
  for (const BlockKey& key : chain) {
    uint32_t slot = 0;
    Extent* e = find(key, &slot);
    if (e == nullptr) break;
    // The fastest medium that holds the block: its DRAM home or DRAM copy,
    // else its SSD home once that write has completed.
    Medium from = Medium::kSsd;
    uint64_t base = e->base;
    if (e->medium == Medium::kDram) {
      from = Medium::kDram;
    } else if (e->has_copy && e->in_copy(slot)) {
      from = Medium::kDram;
      base = e->copy_base;
    } else if (e->durable(slot) != kDurable) {
      break;  // not readable yet (cannot happen while a copy holds it; never read unwritten SSD bytes)
    }
    const ExtentGeometry& g = e->geom;  // a copy has its home's layout
    const uint32_t device = from == Medium::kDram ? 0 : e->device;
    Run* last = runs_.empty() ? nullptr : &runs_.back();
    if (last && last->extent == e->id && last->medium == from && last->first_slot + last->count == slot) {
      last->count++;
    } else {
      Run r;
      r.medium = from;
      r.device = device;
      r.extent = e->id;
      r.first_slot = slot;
      r.first_block = hit_;
      r.count = 1;
      r.slot_stride = g.slot_stride;
      r.layer_stride = g.layer_stride;
      r.codec = e->codec;
      if (r.codec) r.params_bytes = static_cast<uint32_t>(8 * r.codec->Params().size());
      const uint64_t first = r.codec ? 0 : g.Offset(0, slot);  // coded: the region start
      if (from == Medium::kSsd) {
        auto loc = store->ssd(e->device)->Locate(e->base, /*create=*/false);
        if (!loc.ok()) {
          LogWarning("restore: " + loc.status().ToString() + "; the chain misses from block " + std::to_string(hit_));
          break;
        }
        r.fd = loc.value().first;
        r.src = loc.value().second + first;
      } else {
        r.src = base + first;
      }
      any_coded_ = any_coded_ || r.codec != nullptr;
      runs_.push_back(r);
      if (std::find(pinned_.begin(), pinned_.end(), e->id) == pinned_.end()) {
        e->last_access = store->Now();
        e->pins++;
        pinned_.push_back(e->id);
      }
    }
    // Coded: the region start here; LoadSums adds the slice's offset.
    locations_.push_back({Address::Make(from, device, base + (e->coded() ? 0 : g.Offset(0, slot))), g.layer_stride});
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
      r.home_device = e->device;
      r.home_slot = e->slot;
      checksums_.insert(checksums_.end(), layers_, 0);
      enc_off_.insert(enc_off_.end(), layers_, 0);
      enc_len_.insert(enc_len_.end(), layers_, 0);
    }
    store->counters().of(from).hit_blocks++;
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
    while (!AllSettled() || remote_running_) cv_.Wait(&mu_);
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
    if (r.medium == Medium::kSsd && std::find(out.begin(), out.end(), r.extent) == out.end()) out.push_back(r.extent);
  return out;
}

void RestoreImpl::SetReadmit(uint64_t extent, uint64_t copy_base) {
  for (Run& r : runs_) {
    if (r.medium != Medium::kSsd || r.extent != extent) continue;
    r.readmit = true;
    r.copy_src = copy_base + (r.codec ? 0 : uint64_t{r.first_slot} * r.slot_stride);
  }
}

void RestoreImpl::CopyRaw(uint32_t layer, const Run& r, uint32_t j0, const std::vector<const std::byte*>& where,
                          uint32_t good) {
  for (uint32_t j = 0; j < good; ++j) {
    std::byte* dst = store_->dram()->At(r.copy_src + uint64_t{layer} * r.layer_stride + uint64_t{j0 + j} * r.slot_stride);
    std::memcpy(dst, where[j], lb_);
    std::memset(dst + lb_, 0, r.slot_stride - lb_);
  }
}

void RestoreImpl::CopyCoded(uint32_t layer, const Run& r, uint32_t j0, uint32_t n, const std::byte* bytes,
                            uint64_t region_begin) {
  std::byte* region = store_->dram()->At(r.copy_src + uint64_t{layer} * r.layer_stride);
  for (uint32_t j = j0; j < j0 + n; ++j) {
    const uint64_t at = uint64_t{r.first_block + j} * layers_ + layer;
    std::memcpy(region + enc_off_[at], bytes + (enc_off_[at] - region_begin), enc_len_[at]);
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
    if (r.medium == Medium::kSsd) land = RoundUp(land, 4096);  // O_DIRECT destination alignment
    r.land = land;
    r.fixup = land != dst || r.slot_stride != lb_;
    prev_end = land + uint64_t{r.count} * r.slot_stride;
    end = std::max(end, prev_end);
  }
  uint64_t stage = RoundUp(end, 4096);  // coded SSD pieces' encoded bytes, each its largest layer's span
  for (Piece& p : pieces_) {
    const Run& r = runs_[p.run];
    if (!r.codec || r.medium != Medium::kSsd) continue;
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

void RestoreImpl::CodedSpan(const Run& r, uint32_t layer, uint32_t j0, uint32_t n, uint64_t align, uint64_t* begin,
                            uint64_t* end) const {
  const uint64_t a = uint64_t{r.first_block + j0} * layers_ + layer;
  const uint64_t z = uint64_t{r.first_block + j0 + n - 1} * layers_ + layer;
  *begin = enc_off_[a] / align * align;
  *end = RoundUp(uint64_t{enc_off_[z]} + enc_len_[z], align);
}

std::byte* RestoreImpl::Home(uint32_t layer, uint32_t block) {
  return target_.destination ? Dst(layer, block) : window_->slot(layer % slots_) + uint64_t{block} * lb_;
}

void RestoreImpl::LoadSums() {
  std::vector<SumEntry> entries;
  for (size_t i = 0; i < runs_.size(); ++i) {
    const Run& r = runs_[i];
    const uint64_t at = uint64_t{r.first_block} * layers_;
    // A raw DRAM run reads its checksums only to verify.
    if (r.table && (r.codec || r.medium == Medium::kSsd || verify_dram_)) {
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
        LogWarning("restore: block " + std::to_string(r.first_block + j) + " of extent " + std::to_string(r.extent) +
                   ": its sums entry does not describe a slice of the layer region; the chain misses from there");
        {
          MutexLock lock(&mu_);
          corrupt_.push_back({r.extent, r.first_slot + j});
        }
        store_->counters().checksum_failures++;
        Truncate(r.first_block + j);
        return;
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
    c.of(r.medium).hit_blocks -= r.count - keep;
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

void RestoreImpl::AttachRemote(remote::RemoteMatch m) {
  const uint32_t n = m.blocks - hit_;
  Run r;
  r.medium = Medium::kRemote;
  r.first_block = hit_;
  r.count = n;
  r.slot_stride = lb_;
  remote_run_ = runs_.size();
  runs_.push_back(r);
  for (uint32_t j = 0; j < n; ++j) locations_.push_back({Address::Make(Medium::kRemote, 0, 0), 0});
  checksums_.resize(checksums_.size() + uint64_t{n} * layers_, 0);  // objects carry their own
  enc_off_.resize(checksums_.size(), 0);
  enc_len_.resize(checksums_.size(), 0);
  store_->counters().miss_blocks -= n;
  hit_ += n;
  remote_match_ = std::move(m);
  MutexLock lock(&mu_);
  valid_ = hit_;
}

void RestoreImpl::SettleRemote(uint32_t layer, uint32_t end) {
  LayerState& st = state_[layer];
  if (end < hit_) st.bad = std::min(st.bad, end);
  if (--st.pending == 0) FinalizeLayer(layer);
  cv_.SignalAll();
}

void RestoreImpl::EndRemote(uint32_t end) {
  for (; remote_next_ < layers_ && state_[remote_next_].issued; ++remote_next_) SettleRemote(remote_next_, end);
  remote_done_ = true;  // layers issued from now on count no remote unit
  remote_end_ = end;
  remote_running_ = false;
  cv_.SignalAll();
}

void RestoreImpl::RunRemote(remote::RemoteTier& tier, const BlockKey& ns) {
  const Run& run = runs_[remote_run_];
  // The layer's place once it is issued (null: abandoned first).
  auto destination = [&](uint32_t layer, uint32_t block) -> std::byte* {
    MutexLock lock(&mu_);
    while (!state_[layer].issued && !abandoned_) cv_.Wait(&mu_);
    if (!state_[layer].issued) return nullptr;
    if (target_.destination) return Dst(layer, block);
    return window_->slot(layer % slots_) + run.land + uint64_t{block - run.first_block} * lb_;
  };
  // Counted before the last layer settles, so a consumer that finished sees it.
  bool noted = false;
  auto note = [&](uint32_t end) {
    if (!noted)
      store_->remote()->NoteRestore(run.count, std::span<const BlockKey>(chain_).subspan(run.first_block, end - run.first_block),
                                    tier);
    noted = true;
  };
  auto layer_done = [&](uint32_t layer, uint32_t valid) {
    if (layer + 1 == layers_) note(valid);
    MutexLock lock(&mu_);
    for (; remote_next_ <= layer; ++remote_next_) {
      while (!state_[remote_next_].issued && !abandoned_) cv_.Wait(&mu_);
      if (!state_[remote_next_].issued) return false;
      SettleRemote(remote_next_, valid);
    }
    return !abandoned_;
  };
  auto got = tier.Restore(ns, chain_, remote_match_, destination, layer_done);
  if (!got.ok()) LogWarning("restore: remote tier: " + got.status().ToString() + "; its blocks are misses");
  const uint32_t end = got.ok() ? *got : run.first_block;
  note(end);
  MutexLock lock(&mu_);
  EndRemote(end);
}

Status RestoreImpl::Begin() {
  LoadSums();
  // The blocks after the local prefix that the remote tier holds.
  if (store_->remote() && hit_ < chain_.size())
    if (auto m = store_->remote()->Lookup(chain_, hit_)) AttachRemote(std::move(*m));
  if (hit_ == 0) return Status::Ok();
  // Every layer reads the same pieces: each run, split at max_request_bytes.
  for (size_t r = 0; r < runs_.size(); ++r) {
    const Run& run = runs_[r];
    if (run.medium == Medium::kRemote) continue;  // fetched by RunRemote
    if (!run.codec) {
      const uint32_t per = std::max<uint64_t>(1, max_request_ / run.slot_stride);
      for (uint32_t j = 0; j < run.count; j += per) pieces_.push_back({r, j, std::min(per, run.count - j)});
      continue;
    }
    // Coded: an SSD piece reads at most max_request_bytes in any layer; a
    // DRAM piece is one decode job.
    for (uint32_t j = 0, n; j < run.count; j += n) {
      for (n = 1; j + n < run.count; ++n) {
        if (run.medium == Medium::kDram) {
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
  const uint64_t layer_bytes = uint64_t{hit_} * lb_;
  slots_ = static_cast<uint32_t>(std::clamp<uint64_t>(std::max<uint64_t>(o.window_layers, o.window_bytes / layer_bytes), 1,
                                                      layers_));
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
    // DRAM runs are copied block by block to wherever they go; SSD runs are
    // read in place when their destinations form one aligned range.
    direct_.assign(uint64_t{layers_} * runs_.size(), 0);
    need_window = false;
    layer_area = false;
    for (uint32_t l = 0; l < layers_; ++l)
      for (size_t r = 0; r < runs_.size(); ++r) {
        const Run& run = runs_[r];
        // DRAM and remote runs are copied block by block; coded runs decode into place.
        bool direct = run.medium == Medium::kDram || run.medium == Medium::kRemote || run.codec;
        if (!direct) {
          std::byte* first = Dst(l, run.first_block);
          direct = run.slot_stride == lb_ && reinterpret_cast<uintptr_t>(first) % 4096 == 0;
          for (uint32_t j = 1; direct && j < run.count; ++j) direct = Dst(l, run.first_block + j) == first + j * lb_;
        }
        direct_[l * runs_.size() + r] = direct;
        need_window = need_window || !direct || (run.codec && run.medium == Medium::kSsd);  // staging
        layer_area = layer_area || !direct;
      }
  }
  if (need_window) {
    const uint64_t slot_bytes = PlanLanding(layer_area);
    window_ = std::make_unique<HostWindow>(store_, slots_, RoundUp(slot_bytes, 4096));
    if (!window_->ok())
      return Status::NoSpace("restore: cannot allocate a window of " + std::to_string(slots_) + " x " +
                             std::to_string(slot_bytes) + " bytes");
  }
  if (remote_run_ != SIZE_MAX) {
    {
      MutexLock lock(&mu_);
      remote_running_ = true;
    }
    const bool queued = store_->remote()->Submit([this](remote::RemoteTier& tier, const BlockKey& ns) { RunRemote(tier, ns); });
    if (!queued) {  // the tier stopped (the store is closing): its blocks are misses
      MutexLock lock(&mu_);
      EndRemote(runs_[remote_run_].first_block);
    }
  }
  for (uint32_t l = 0; l < slots_; ++l) Issue(l);
  return Status::Ok();
}

void RestoreImpl::Issue(uint32_t layer) {
  // Count every request first, so the layer cannot finalize early.
  {
    MutexLock lock(&mu_);
    LayerState& st = state_[layer];
    st.issued = true;
    st.pending = static_cast<uint32_t>(pieces_.size());
    if (remote_run_ != SIZE_MAX) {
      if (!remote_done_) {
        st.pending++;  // settled by RunRemote
      } else if (remote_end_ < hit_) {
        st.bad = std::min(st.bad, remote_end_);
      }
      if (st.pending == 0) FinalizeLayer(layer);
    }
    cv_.SignalAll();  // RunRemote may wait for this layer
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
    MediumCounters& mc = store_->counters().of(r.medium);
    mc.read_requests++;
    mc.bytes_read += len;
    if (r.medium == Medium::kDram) {
      const std::byte* from = store_->dram()->At(src);
      store_->dram_queue()->Submit([this, layer, &r, p, from, where = std::move(where)]() mutable {
        // Copy maximal contiguous stretches (one memcpy for the usual case;
        // block by block where slots are padded, as in a copy of an SSD extent).
        for (uint32_t j = 0; j < p.n;) {
          uint32_t k = j + 1;
          while (r.slot_stride == lb_ && k < p.n && where[k] == where[j] + uint64_t{k - j} * lb_) ++k;
          std::memcpy(const_cast<std::byte*>(where[j]), from + uint64_t{j} * r.slot_stride, uint64_t{k - j} * lb_);
          j = k;
        }
        Complete(layer, r, p.j0, std::move(where), Status::Ok());
      });
      mc.NoteDepth(store_->dram_queue()->outstanding());
    } else {
      void* into = const_cast<std::byte*>(where[0]);
      store_->engine()->Submit({io::Op::kRead, r.fd, src, into, len, [this, layer, &r, p, src, where = std::move(where)](Status s) mutable {
                                  Complete(layer, r, p.j0, std::move(where), s.WithContext("read at offset " + std::to_string(src)));
                                }});
      mc.NoteDepth(store_->engine()->outstanding());
    }
  }
}

void RestoreImpl::IssueCoded(uint32_t layer, const Piece& p, std::byte* slot) {
  const Run& r = runs_[p.run];
  MediumCounters& mc = store_->counters().of(r.medium);
  uint64_t begin, end;
  CodedSpan(r, layer, p.j0, p.n, r.medium == Medium::kSsd ? 4096 : 1, &begin, &end);
  const uint64_t region = r.src + uint64_t{layer} * r.layer_stride;
  mc.read_requests++;
  mc.bytes_read += end - begin;
  if (r.medium == Medium::kDram) {
    const std::byte* from = store_->dram()->At(region + begin);
    store_->decode_queue()->Submit([this, layer, &r, p, from, begin] { DecodeBlocks(layer, r, p.j0, p.n, from, begin, verify_dram_); });
    mc.NoteDepth(store_->decode_queue()->outstanding());
    return;
  }
  std::byte* into = slot + p.stage;
  store_->engine()->Submit({io::Op::kRead, r.fd, region + begin, into, end - begin,
                            [this, layer, &r, p, into, begin, at = region + begin](Status s) {
                              if (s.ok()) {
                                if (r.readmit) CopyCoded(layer, r, p.j0, p.n, into, begin);
                                return SubmitDecodes(layer, r, p.j0, p.n, into, begin, true);
                              }
                              store_->counters().io_errors++;
                              LogWarning("restore: layer " + std::to_string(layer) + ": " +
                                         s.WithContext("read at offset " + std::to_string(at)).ToString() +
                                         "; blocks from " + std::to_string(r.first_block + p.j0) +
                                         " on are misses, and the blocks it read leave the index");
                              Settle(layer, r.first_block + p.j0, ReadBlocks(r, p.j0, p.n));
                            }});
  mc.NoteDepth(store_->engine()->outstanding());
}

void RestoreImpl::SubmitDecodes(uint32_t layer, const Run& r, uint32_t j0, uint32_t n, const std::byte* bytes,
                                uint64_t region_begin, bool verify) {
  const uint32_t per = static_cast<uint32_t>(std::max<uint64_t>(1, kDecodeJobBytes / lb_));
  const uint32_t jobs = (n + per - 1) / per;
  {
    MutexLock lock(&mu_);
    state_[layer].pending += jobs - 1;  // this piece's one pending unit becomes `jobs`
  }
  for (uint32_t j = j0; j < j0 + n; j += per) {
    const uint32_t m = std::min(per, j0 + n - j);
    store_->decode_queue()->Submit([this, layer, &r, j, m, bytes, region_begin, verify] {
      DecodeBlocks(layer, r, j, m, bytes, region_begin, verify);
    });
  }
}

void RestoreImpl::DecodeBlocks(uint32_t layer, const Run& r, uint32_t j0, uint32_t n, const std::byte* bytes,
                               uint64_t region_begin, bool verify) {
  thread_local CodecContext ctx;
  Counters& c = store_->counters();
  const SliceLayout layout{store_->options().shape, store_->options().block_tokens, layer, SliceLayout::kUnknownPosition};
  uint32_t bad = UINT32_MAX, decoded = 0;
  std::vector<BlockRef> corrupt;
  for (uint32_t j = j0; j < j0 + n; ++j) {
    const uint32_t block = r.first_block + j;
    const uint64_t at = uint64_t{block} * layers_ + layer;
    const std::span<const std::byte> in(bytes + (enc_off_[at] - region_begin), enc_len_[at]);
    std::string problem;
    if (verify && BlockChecksum(in.data(), in.size()) != checksums_[at]) {
      c.checksum_failures++;
      problem = "checksum mismatch";
    } else if (Status s = DecodeStored(ctx, *r.codec, r.params_bytes, layout, in, std::span(Home(layer, block), lb_));
               !s.ok()) {
      c.decode_failures++;
      problem = "decoding with " + std::string(r.codec->name()) + " failed: " + s.ToString();
    }
    if (problem.empty()) {
      ++decoded;
      continue;
    }
    LogWarning("restore: block " + std::to_string(block) + " layer " + std::to_string(layer) + " (" +
               std::string(MediumName(r.medium)) + " extent " + std::to_string(r.extent) + " slot " +
               std::to_string(r.first_slot + j) + "): " + problem + "; it and every later block are misses");
    corrupt.push_back({r.extent, r.first_slot + j});
    bad = block;
    break;
  }
  c.of(r.medium).bytes_delivered += uint64_t{decoded} * lb_;
  Settle(layer, bad, corrupt);
}

std::vector<BlockRef> RestoreImpl::ReadBlocks(const Run& r, uint32_t j0, uint32_t n) {
  std::vector<BlockRef> refs;
  for (uint32_t j = j0; j < j0 + n; ++j) refs.push_back({r.extent, r.first_slot + j});
  return refs;
}

void RestoreImpl::Settle(uint32_t layer, uint32_t bad, const std::vector<BlockRef>& corrupt) {
  MutexLock lock(&mu_);
  LayerState& st = state_[layer];
  st.bad = std::min(st.bad, bad);
  corrupt_.insert(corrupt_.end(), corrupt.begin(), corrupt.end());
  if (--st.pending == 0) FinalizeLayer(layer);
  cv_.SignalAll();
}

void RestoreImpl::Complete(uint32_t layer, const Run& r, uint32_t j0, std::vector<const std::byte*> where, Status status) {
  uint32_t bad = UINT32_MAX;
  std::vector<BlockRef> corrupt;
  Counters& c = store_->counters();
  const uint32_t n = static_cast<uint32_t>(where.size());
  if (!status.ok()) {
    bad = r.first_block + j0;
    c.io_errors++;
    LogWarning("restore: layer " + std::to_string(layer) + ": " + status.ToString() + "; blocks from " +
               std::to_string(bad) + " on are misses, and the blocks it read leave the index");
    corrupt = ReadBlocks(r, j0, n);
  } else if (r.medium == Medium::kSsd || verify_dram_) {
    for (uint32_t j = 0; j < n; ++j) {
      const uint32_t block = r.first_block + j0 + j;
      if (BlockChecksum(where[j], lb_) == checksums_[uint64_t{block} * layers_ + layer]) continue;
      c.checksum_failures++;
      LogWarning("restore: block " + std::to_string(block) + " layer " + std::to_string(layer) + " (" +
                 std::string(MediumName(r.medium)) + " extent " + std::to_string(r.extent) + " slot " +
                 std::to_string(r.first_slot + j0 + j) + "): checksum mismatch; it and every later block are misses");
      corrupt.push_back({r.extent, r.first_slot + j0 + j});
      bad = std::min(bad, block);
      break;
    }
  }
  if (status.ok()) c.of(r.medium).bytes_delivered += uint64_t{n} * lb_;
  if (status.ok() && r.readmit) CopyRaw(layer, r, j0, where, bad == UINT32_MAX ? n : bad - (r.first_block + j0));
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
      if (target_.destination)
        for (uint32_t j = 0; j < r.count; ++j)
          std::memcpy(Dst(layer, r.first_block + j), slot + uint64_t{r.first_block + j} * lb_, lb_);
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
  if (!st.issued)
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
  const uint32_t next = layer + slots_;
  if (next < layers_) Issue(next);
}

uint32_t RestoreImpl::Finish() {
  if (hit_ == 0) return 0;
  for (uint32_t l = 0; l < layers_; ++l) {
    {
      MutexLock lock(&mu_);
      if (state_[l].released) continue;
      if (!state_[l].issued) continue;  // issued below when its slot frees
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

Result<uint32_t> StoreImpl::Prefetch(std::span<const BlockKey> chain) {
  uint32_t hit = 0;
  bool on_ssd_only = false;  // a hit block has no DRAM copy to serve it
  {
    MutexLock lock(&mu_);
    if (closed_) return Status::FailedPrecondition("prefetch: store is closed");
    uint32_t slot = 0;
    for (const BlockKey& key : chain) {
      const Extent* e = FindBlock(key, &slot);
      if (e == nullptr) break;
      ++hit;
      if (e->medium == Medium::kSsd && !(e->has_copy && e->in_copy(slot))) on_ssd_only = true;
    }
  }
  if (!on_ssd_only || options_.dram_capacity_bytes == 0) return hit;
  {
    MutexLock lock(&prefetch_mu_);
    if (prefetch_stop_) return hit;
    if (prefetch_running_ + prefetch_queue_.size() >= kMaxPrefetches) {
      counters_.prefetch_skipped++;
      return hit;
    }
    ++prefetch_running_;  // a place, held while the restore starts
  }
  auto started = StartRestoreImpl(chain.first(hit), {}, /*readmit=*/true);
  std::unique_ptr<Restore> unqueued;  // destroyed (waiting for its I/O) outside the lock
  {
    MutexLock lock(&prefetch_mu_);
    --prefetch_running_;
    if (!started.ok()) return started.status();
    if (prefetch_stop_) {
      unqueued = std::move(started).value();
    } else {
      counters_.prefetches++;
      prefetch_queue_.push_back(std::move(started).value());
      if (!prefetch_thread_.joinable()) prefetch_thread_ = std::thread([this] { RunPrefetches(); });
      prefetch_cv_.Signal();
    }
  }
  return hit;
}

void StoreImpl::RunPrefetches() {
  for (;;) {
    std::unique_ptr<Restore> r;
    {
      MutexLock lock(&prefetch_mu_);
      while (prefetch_queue_.empty() && !prefetch_stop_) prefetch_cv_.Wait(&prefetch_mu_);
      if (prefetch_queue_.empty()) return;  // stopped, and every queued one finished
      r = std::move(prefetch_queue_.front());
      prefetch_queue_.pop_front();
      ++prefetch_running_;
    }
    r->Finish();  // every layer read; the SSD blocks land in their DRAM copies
    r.reset();
    counters_.prefetches_done++;
    MutexLock lock(&prefetch_mu_);
    --prefetch_running_;
  }
}

void StoreImpl::StopPrefetches() {
  std::thread thread;
  {
    MutexLock lock(&prefetch_mu_);
    prefetch_stop_ = true;
    prefetch_cv_.SignalAll();
    thread = std::move(prefetch_thread_);
  }
  if (thread.joinable()) thread.join();
}

}  // namespace flatkv
