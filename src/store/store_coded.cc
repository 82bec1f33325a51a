// StoreImpl::PutCoded: a Put with a codec. Blocks are encoded first,
// outside the lock (one CodecContext per thread); then room is reserved in
// the session's open coded extent: each block's encoded layer slices are
// packed into the extent's layer regions, a put's batch starting aligned
// (4 KiB on SSD, 64 bytes in DRAM), so on SSD a batch is one aligned write
// per layer, padded once at its end. Format: docs/format_segment.md.
#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "common/checksum.h"
#include "store/segment_writer.h"
#include "store/store_impl.h"

namespace flatkv {
namespace {

constexpr uint64_t kSsdAlign = 4096;
constexpr uint64_t kDramAlign = 64;

uint64_t BatchAlign(Medium m) { return m == Medium::kSsd ? kSsdAlign : kDramAlign; }

}  // namespace

Status StoreImpl::PutCoded(SessionId session, std::span<const BlockKey> keys, std::span<const std::byte> data,
                           const PutOptions& options, const std::shared_ptr<const Codec>& codec) {
  PutResult local;
  PutResult& res = options.result ? *options.result : local;
  const uint32_t layers = options_.shape.layers;
  const uint64_t block_bytes = BlockBytes();
  const std::string spec = codec->Spec();
  std::vector<size_t> todo;  // keys not stored yet
  std::vector<uint32_t> todo_position;  // their chain positions
  Unsettled unsettled;  // deduplicated against blocks whose SSD write is in flight
  {
    MutexLock lock(&mu_);
    if (closed_) return Status::FailedPrecondition("put: store is closed");
    if (options_.read_only) return Status::FailedPrecondition("put: store is opened read-only");
    // Touched before its deduplication makes it a holder of other
    // sessions' extents: a session is always in the LRU order.
    SetTenant(TouchSession(session), options.tenant);
    std::unordered_set<BlockKey, BlockKeyHash> seen;
    const bool named = options.first_block != PutOptions::kUnknownBlock;
    uint32_t position = named ? options.first_block : sessions_[session].next_position;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (named) position = options.first_block + static_cast<uint32_t>(i);
      if (Deduplicate(session, keys[i], &seen, &res, &position, &unsettled)) continue;
      todo.push_back(i);
      todo_position.push_back(position++);
    }
    sessions_[session].next_position = std::max(sessions_[session].next_position, position);
  }
  if (todo.empty()) {  // its references
    Status synced = options_.sync_writes ? SyncManifests() : Status::Ok();
    return synced.ok() ? AwaitDurable(unsettled) : synced;
  }

  // Encode, outside the lock, each slice into room for its bound.
  SliceLayout layout{options_.shape, options_.block_tokens, 0, SliceLayout::kUnknownPosition};
  if (Status s = codec->Supports(layout); !s.ok()) return s.WithContext("put: codec " + spec);
  std::vector<uint64_t> bound(layers), bound_at(layers + 1, 0);
  for (uint32_t l = 0; l < layers; ++l) {
    layout.layer = l;
    bound[l] = codec->MaxEncodedSize(layout);
    bound_at[l + 1] = bound_at[l] + bound[l];
  }
  const uint64_t per_block = bound_at[layers];
  std::unique_ptr<std::byte[]> enc(new std::byte[todo.size() * per_block]);
  std::vector<uint32_t> len(todo.size() * layers);
  std::vector<uint64_t> sums(todo.size() * layers);
  thread_local CodecContext ctx;
  for (size_t k = 0; k < todo.size(); ++k) {
    const uint64_t position = options.first_block == PutOptions::kUnknownBlock
                                  ? SliceLayout::kUnknownPosition
                                  : (uint64_t{options.first_block} + todo[k]) * options_.block_tokens;
    layout.first_position = position < SliceLayout::kUnknownPosition ? uint32_t(position) : SliceLayout::kUnknownPosition;
    for (uint32_t l = 0; l < layers; ++l) {
      layout.layer = l;
      std::byte* out = enc.get() + k * per_block + bound_at[l];
      auto n = codec->Encode(ctx, layout, data.subspan(todo[k] * block_bytes + l * block_layer_bytes_, block_layer_bytes_),
                             std::span(out, bound[l]));
      const std::string where = "put: block " + std::to_string(todo[k]) + " layer " + std::to_string(l) + ", codec " + spec;
      if (!n.ok()) return n.status().WithContext(where);
      if (*n == 0 || *n > bound[l])
        return Status::Aborted(where + ": encoded " + std::to_string(*n) + " bytes, outside (0, " +
                               std::to_string(bound[l]) + "] (a codec bug)");
      len[k * layers + l] = static_cast<uint32_t>(*n);
      sums[k * layers + l] = BlockChecksum(out, *n);
    }
  }

  // Reserve packed room: a block goes to the open extent when it is of this
  // codec and every layer slice fits, else to a new extent.
  std::vector<size_t> inputs;                       // index into todo of each block written
  std::vector<std::pair<Extent*, uint32_t>> slots;  // where each goes
  std::vector<uint32_t> offs;                       // [input * layers + layer]: offset in the layer region
  std::vector<Extent*> pinned;
  Status alloc_status;
  {
    MutexLock lock(&mu_);
    if (closed_) return Status::FailedPrecondition("put: store is closed");
    // A DropSession may have removed the session while the lock was down.
    SetTenant(TouchSession(session), options.tenant);
    Extent* batch = nullptr;  // the extent this put's batch started in (its fill is aligned)
    // A new extent is sized for the blocks from k on: their encoded bytes in
    // the fullest layer, in raw block slots of the SSD's stride, and their
    // count (a slot holds at most kCodedBlocksPerSlot blocks).
    auto want_from = [&](size_t k) {
      std::vector<uint64_t> left(layers, 0);
      for (size_t j = k; j < todo.size(); ++j)
        for (uint32_t l = 0; l < layers; ++l) left[l] += len[j * layers + l];
      const uint64_t slot_bytes = RoundUp(block_layer_bytes_, kSsdAlign);
      return std::max<uint64_t>((*std::max_element(left.begin(), left.end()) + slot_bytes - 1) / slot_bytes,
                                (todo.size() - k + persist::kCodedBlocksPerSlot - 1) / persist::kCodedBlocksPerSlot);
    };
    for (size_t k = 0; k < todo.size(); ++k) {
      uint32_t at = 0;
      if (Extent* hit = FindBlock(keys[todo[k]], &at)) {  // a concurrent put stored it meanwhile
        HoldBlock(hit, at, session, todo_position[k], &res, &unsettled);
        continue;
      }
      const uint32_t* lk = &len[k * layers];
      auto fits = [&](const Extent* x) FLATKV_REQUIRES(mu_) {
        if (x->doomed || x->full || x->codec_spec != spec || x->reserved >= x->capacity) return false;
        const uint64_t stride = x->geom.layer_stride;
        if (stride > UINT32_MAX) return false;
        for (uint32_t l = 0; l < layers; ++l) {
          const uint64_t start = x == batch ? x->fill[l] : RoundUp(x->fill[l], BatchAlign(x->medium));
          if (start + lk[l] > stride) return false;
        }
        return true;
      };
      Session& s = sessions_[session];
      Extent* e = s.open_extent ? extents_[s.open_extent].get() : nullptr;
      if (e == nullptr || !fits(e)) {
        if (e != nullptr) e->full = true;
        auto created = CreateExtent(session, options.hint, want_from(k), codec, spec);
        if (!created.ok()) {
          alloc_status = created.status().WithContext("put: block " + std::to_string(todo[k]));
          break;
        }
        e = created.value();
        if (!fits(e)) {
          e->full = true;
          alloc_status = Status::InvalidArgument(
              "put: block " + std::to_string(todo[k]) + ": its encoded layer slices (up to " +
              std::to_string(*std::max_element(lk, lk + layers)) + " bytes with codec " + spec +
              ") do not fit an empty extent's layer region of " +
              std::to_string(e->geom.layer_stride) + " bytes; raise the extent layer bytes");
          break;
        }
      }
      if (e != batch) {
        for (uint32_t l = 0; l < layers; ++l) e->fill[l] = RoundUp(e->fill[l], BatchAlign(e->medium));
        batch = e;
      }
      if (std::find(pinned.begin(), pinned.end(), e) == pinned.end()) {
        e->pins++;
        e->writers++;
        pinned.push_back(e);
      }
      e->last_access = Now();
      const uint32_t slot = e->reserved++;
      GrowSlots(e, slot + 1);
      for (uint32_t l = 0; l < layers; ++l) {
        e->stored[slot] += lk[l];
        offs.push_back(static_cast<uint32_t>(e->fill[l]));
        e->fill[l] += lk[l];
      }
      inputs.push_back(k);
      slots.push_back({e, slot});
      NotePosition(e, slot, todo_position[k]);
    }
  }

  std::vector<const std::byte*> ptrs(inputs.size() * layers);
  std::vector<uint32_t> lens(inputs.size() * layers);
  for (size_t j = 0; j < inputs.size(); ++j)
    for (uint32_t l = 0; l < layers; ++l) {
      ptrs[j * layers + l] = enc.get() + inputs[j] * per_block + bound_at[l];
      lens[j * layers + l] = len[inputs[j] * layers + l];
    }
  // With sync_writes, what the allocation appended under mu_ becomes durable
  // here, outside the lock, before data reaches a reused slot (as in Put).
  Status status = options_.sync_writes ? SyncManifests() : Status::Ok();
  if (status.ok() && !inputs.empty()) {
    std::vector<Pending> blocks(inputs.size());
    std::vector<uint64_t> bsums(inputs.size() * layers);
    for (size_t j = 0; j < inputs.size(); ++j) {
      const size_t k = inputs[j];
      blocks[j] = {slots[j].first, slots[j].second, keys[todo[k]]};
      std::copy(sums.begin() + k * layers, sums.begin() + (k + 1) * layers, bsums.begin() + j * layers);
    }
    // Coded puts always write through (ssd_admission applies to raw blocks).
    const uint64_t budget = SsdBlocks(blocks) * block_bytes;
    AcquireWriteBudget(budget);
    SegmentWriter writer(*this);
    // The SSD homes' sums-table entries first: a block is indexed (and its
    // DRAM copy readable) only after them.
    Status early = WriteSums(blocks, bsums.data(), offs.data(), lens.data());
    if (early.ok()) early = WriteCoded(slots, offs, lens, ptrs, /*dram=*/true, &writer);
    // A failed DRAM phase (an SSD file that cannot be opened) indexes nothing.
    if (!early.ok()) (void)writer.Finish();
    if (!early.ok()) status = early;
    else status = Commit(
        session, blocks, bsums.data(), offs.data(), lens.data(),
        [&] {
          Status s = WriteCoded(slots, offs, lens, ptrs, /*dram=*/false, &writer);
          Status finished = writer.Finish();
          return s.ok() ? finished : s;
        },
        [&](size_t j) {
          return persist::BlockRecord{slots[j].second, blocks[j].key,
                                      {bsums.begin() + j * layers, bsums.begin() + (j + 1) * layers},
                                      {offs.begin() + j * layers, offs.begin() + (j + 1) * layers},
                                      {lens.begin() + j * layers, lens.begin() + (j + 1) * layers}};
        },
        /*admit=*/true, &res, &unsettled);
    ReleaseWriteBudget(budget);
  }
  {
    MutexLock lock(&mu_);
    for (Extent* e : pinned) {
      e->writers--;
      Unpin(e);
    }
  }
  if (status.ok()) status = AwaitDurable(unsettled);
  return status.ok() ? alloc_status : status;
}

Status StoreImpl::WriteCoded(const std::vector<std::pair<Extent*, uint32_t>>& slots, const std::vector<uint32_t>& offs,
                             const std::vector<uint32_t>& lens, const std::vector<const std::byte*>& ptrs, bool dram,
                             SegmentWriter* writer) {
  const uint32_t layers = options_.shape.layers;
  uint64_t total = 0;
  for (uint32_t n : lens) total += n;
  const uint64_t want = total + slots.size() * kSsdAlign;  // one wave holds the whole put if it can
  Status status;
  size_t j = 0;
  while (j < slots.size() && status.ok()) {
    // A batch: this put's blocks in one extent, packed back to back per layer.
    size_t n = 1;
    while (j + n < slots.size() && slots[j + n].first == slots[j].first) ++n;
    Extent* e = slots[j].first;  // medium, copy and base fixed while this put writes into it
    const ExtentGeometry& g = e->geom;
    const size_t at = j;
    j += n;
    auto span_of = [&](uint32_t l, uint64_t* start, uint64_t* end) {
      const uint64_t last = (at + n - 1) * layers + l;
      *start = offs[at * layers + l];
      *end = uint64_t{offs[last]} + lens[last];
    };
    if (dram) {  // DRAM homes and DRAM copies; a copy's batch is zero-padded as on SSD
      if (e->medium != Medium::kDram && !e->has_copy) continue;
      auto target = DramTargetOf(*e, writer != nullptr);
      if (!target.ok()) return target.status();
      const auto [home, base, fd, file_base] = target.value();
      for (uint32_t l = 0; l < layers; ++l) {
        for (size_t m = at; m < at + n; ++m)
          std::memcpy(dram_->At(base + l * g.layer_stride + offs[m * layers + l]), ptrs[m * layers + l], lens[m * layers + l]);
        if (home) continue;
        uint64_t start, end;
        span_of(l, &start, &end);
        std::memset(dram_->At(base + l * g.layer_stride + end), 0, RoundUp(end, kSsdAlign) - end);
        // Same layout as the home: the SSD write goes straight from the copy.
        if (writer)
          writer->Submit(fd, file_base + l * g.layer_stride + start, dram_->At(base + l * g.layer_stride + start),
                         RoundUp(end - start, kSsdAlign));
      }
      continue;
    }
    if (e->medium != Medium::kSsd || e->has_copy) continue;  // copies were written above
    auto loc = ssd_[e->device]->Locate(e->base, true);
    if (!loc.ok()) {
      status = loc.status();
      break;
    }
    auto [fd, file_base] = loc.value();
    for (uint32_t l = 0; l < layers && status.ok(); ++l) {
      uint64_t start, end;
      span_of(l, &start, &end);
      const uint64_t bytes = RoundUp(end - start, kSsdAlign);
      auto dst = writer->Stage(bytes, want);
      if (!dst.ok()) {
        status = dst.status();
        break;
      }
      for (size_t m = at; m < at + n; ++m)
        std::memcpy(*dst + (offs[m * layers + l] - start), ptrs[m * layers + l], lens[m * layers + l]);
      std::memset(*dst + (end - start), 0, bytes - (end - start));
      writer->Submit(fd, file_base + l * g.layer_stride + start, *dst, bytes);
    }
  }
  return status;
}

}  // namespace flatkv
