// StoreImpl::Put for raw blocks, and what raw and coded puts share: the
// commit of a put's blocks (DRAM first, SSD behind it), the SSD write
// buffer's back-pressure, and the SSD admission of reused sessions'
// DRAM-only blocks (ssd_admission = kOnReuse). docs/architecture.md, "Put"
// and "Durability".
#include <algorithm>
#include <cstring>
#include <tuple>
#include <unordered_set>

#include "common/checksum.h"
#include "common/log.h"
#include "store/segment_writer.h"
#include "store/store_impl.h"

namespace flatkv {

Status StoreImpl::Put(SessionId session, std::span<const BlockKey> keys, std::span<const std::byte> data,
                      const PutOptions& options) {
  PutResult local;
  PutResult& res = options.result ? *options.result : local;
  res = {};
  const uint64_t block_bytes = BlockBytes();
  if (data.size() != keys.size() * block_bytes)
    return Status::InvalidArgument("put: data is " + std::to_string(data.size()) + " bytes, expected " +
                                   std::to_string(keys.size()) + " blocks x " + std::to_string(block_bytes) + " bytes");
  if (const auto& codec = options.codec ? options.codec : options_.codec) {
    Status coded = PutCoded(session, keys, data, options, codec);
    if (coded.ok())
      for (auto& m : media_) m->OnPut(keys, data);  // in the background; raw, as restores deliver it
    return coded;
  }
  std::vector<size_t> inputs;                       // index into keys/data of each block to write
  std::vector<std::pair<Extent*, uint32_t>> slots;  // where each goes
  std::vector<Extent*> pinned;
  Status alloc_status;
  bool admit = true;
  Unsettled unsettled;  // deduplicated against blocks whose SSD write is in flight
  {
    MutexLock lock(&mu_);
    if (closed_) return Status::FailedPrecondition("put: store is closed");
    if (options_.read_only) return Status::FailedPrecondition("put: store is opened read-only");
    Session& touched = TouchSession(session);
    SetTenant(touched, options.tenant);
    const bool reused = touched.reused;
    admit = options_.ssd_admission == SsdAdmission::kAll || reused;
    std::unordered_set<BlockKey, BlockKeyHash> seen;
    const bool named = options.first_block != PutOptions::kUnknownBlock;
    uint32_t position = named ? options.first_block : sessions_[session].next_position;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (named) position = options.first_block + static_cast<uint32_t>(i);
      if (Deduplicate(session, keys[i], &seen, &res, &position, admit ? &unsettled : nullptr)) continue;
      Session& s = sessions_[session];
      Extent* e = s.open_extent ? extents_[s.open_extent].get() : nullptr;
      if (e == nullptr || e->doomed || e->coded() || e->reserved == e->capacity) {
        auto created = CreateExtent(session, options.hint, keys.size() - i);
        if (!created.ok()) {
          alloc_status = created.status().WithContext("put: block " + std::to_string(i));
          break;
        }
        e = created.value();
      }
      // kOnReuse: a block of a session not reused yet lives in DRAM only;
      // with no DRAM copy to hold it, the put writes its SSD home after all
      // (a block acknowledged is always stored somewhere).
      if (!admit && e->medium == Medium::kSsd && !e->has_copy) admit = true;
      if (std::find(pinned.begin(), pinned.end(), e) == pinned.end()) {
        e->pins++;
        e->writers++;
        pinned.push_back(e);
      }
      e->last_access = Now();
      inputs.push_back(i);
      slots.push_back({e, e->reserved++});
      NotePosition(e, slots.back().second, position++);
    }
    if (auto it = sessions_.find(session); it != sessions_.end())
      it->second.next_position = std::max(it->second.next_position, position);
  }
  const uint32_t layers = options_.shape.layers;
  std::vector<uint64_t> sums(inputs.size() * layers);
  for (size_t k = 0; k < inputs.size(); ++k)
    for (uint32_t l = 0; l < layers; ++l)
      sums[k * layers + l] = BlockChecksum(data.data() + inputs[k] * block_bytes + l * block_layer_bytes_, block_layer_bytes_);
  // With sync_writes, the records the allocation appended under mu_ (new
  // extents, frees of evicted ones, references) become durable here, outside
  // the lock, before any data reaches a reused slot.
  Status status = options_.sync_writes ? SyncManifests() : Status::Ok();
  if (status.ok() && !inputs.empty()) {
    std::vector<Pending> blocks(inputs.size());
    for (size_t k = 0; k < inputs.size(); ++k) blocks[k] = {slots[k].first, slots[k].second, keys[inputs[k]]};
    const uint64_t budget = admit ? SsdBlocks(blocks) * block_bytes : 0;
    AcquireWriteBudget(budget);
    SegmentWriter writer(*this);
    // The SSD homes' sums-table entries, before any block is indexed; then
    // DRAM homes and copies, a copy's SSD writes starting as each layer is copied.
    Status early = WriteSums(blocks, sums.data(), nullptr, nullptr);
    if (early.ok()) early = WriteBlocks(slots, inputs, data, /*dram=*/true, admit ? &writer : nullptr);
    // A failed DRAM phase (an SSD file that cannot be opened) indexes nothing.
    if (!early.ok()) (void)writer.Finish();
    if (!early.ok()) status = early;
    else status = Commit(
        session, blocks, sums.data(), nullptr, nullptr,
        [&] {
          Status s = WriteBlocks(slots, inputs, data, /*dram=*/false, &writer);
          Status finished = writer.Finish();
          return s.ok() ? finished : s;
        },
        [&](size_t k) {
          return persist::BlockRecord{slots[k].second, keys[inputs[k]],
                                      {sums.begin() + k * layers, sums.begin() + (k + 1) * layers}, {}, {}};
        },
        admit, &res, &unsettled);
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
  if (status.ok() && alloc_status.ok())
    for (auto& m : media_) m->OnPut(keys, data);  // in the background
  return status.ok() ? alloc_status : status;
}

bool StoreImpl::Deduplicate(SessionId session, const BlockKey& key, std::unordered_set<BlockKey, BlockKeyHash>* seen,
                            PutResult* res, uint32_t* position, Unsettled* unsettled) {
  uint32_t slot = 0;
  Extent* hit = FindBlock(key, &slot);
  if (hit == nullptr && seen->insert(key).second) return false;
  if (hit == nullptr) {  // a key repeated within the put
    counters_.dedup_blocks++;
    res->dedup_blocks++;
    ++*position;
    return true;
  }
  HoldBlock(hit, slot, session, *position, res, unsettled);
  if (hit->session == session && !hit->runs.empty()) {
    *position = hit->PositionOf(slot) + 1;  // its own block: the chain goes on after it
    return true;
  }
  ++*position;
  return true;
}

void StoreImpl::HoldBlock(Extent* hit, uint32_t slot, SessionId session, uint32_t position, PutResult* res,
                          Unsettled* unsettled) {
  counters_.dedup_blocks++;
  res->dedup_blocks++;
  AddSharer(hit, session, position);  // (nothing for the session's own extent)
  if (unsettled == nullptr || hit->durable(slot) != kWriting) return;
  if (unsettled->keys.empty()) unsettled->failures = failed_ssd_puts_;
  unsettled->keys.push_back(hit->keys[slot]);
}

Status StoreImpl::AwaitDurable(const Unsettled& u) {
  MutexLock lock(&mu_);
  for (const BlockKey& key : u.keys) {
    for (;;) {
      uint32_t slot = 0;
      const Extent* e = FindBlock(key, &slot);
      if (e == nullptr) {
        if (failed_ssd_puts_ == u.failures) break;  // stored, then dropped or evicted
        return Status::IoError("put: block " + key.ToHex() +
                               " was being stored by a concurrent put, and an SSD write of a put failed meanwhile; "
                               "it may not be stored");
      }
      if (e->durable(slot) != kWriting) break;
      settled_cv_.Wait(&mu_);
    }
  }
  return Status::Ok();
}

Status StoreImpl::WriteBlocks(const std::vector<std::pair<Extent*, uint32_t>>& slots, const std::vector<size_t>& inputs,
                              std::span<const std::byte> data, bool dram, SegmentWriter* writer) {
  const uint64_t block_bytes = BlockBytes();
  const uint32_t layers = options_.shape.layers;
  Status status;
  size_t k = 0;
  while (k < slots.size() && status.ok()) {
    // A run: consecutive slots of one extent.
    size_t n = 1;
    while (k + n < slots.size() && slots[k + n].first == slots[k].first && slots[k + n].second == slots[k].second + n) ++n;
    // e's medium, copy and base do not change while this put pins it as a writer.
    Extent* e = slots[k].first;
    const uint32_t first = slots[k].second;
    const ExtentGeometry& g = e->geom;
    const size_t at = k;
    k += n;
    auto src = [&](size_t j, uint32_t l) { return data.data() + inputs[at + j] * block_bytes + l * block_layer_bytes_; };
    const uint64_t run_bytes = n * g.slot_stride;
    if (dram) {  // DRAM homes and DRAM copies (zero-padded like the SSD home they mirror)
      if (e->medium != Medium::kDram && !e->has_copy) continue;
      auto target = DramTargetOf(*e, writer != nullptr);
      if (!target.ok()) return target.status();
      const auto [home, base, fd, file_base] = target.value();
      for (uint32_t l = 0; l < layers; ++l) {
        for (size_t j = 0; j < n; ++j) {
          std::byte* dst = dram_->At(base + g.Offset(l, first + j));
          std::memcpy(dst, src(j, l), block_layer_bytes_);
          if (!home) std::memset(dst + block_layer_bytes_, 0, g.slot_stride - block_layer_bytes_);
        }
        // The copy has the home's layout: its SSD write goes straight from it.
        if (!home && writer) writer->Submit(fd, file_base + g.Offset(l, first), dram_->At(base + g.Offset(l, first)), run_bytes);
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
      auto dst = writer->Stage(run_bytes, run_bytes * layers);
      if (!dst.ok()) {
        status = dst.status();
        break;
      }
      for (size_t j = 0; j < n; ++j) {
        std::memcpy(*dst + j * g.slot_stride, src(j, l), block_layer_bytes_);
        std::memset(*dst + j * g.slot_stride + block_layer_bytes_, 0, g.slot_stride - block_layer_bytes_);
      }
      writer->Submit(fd, file_base + g.Offset(l, first), *dst, run_bytes);
    }
  }
  return status;
}

Result<StoreImpl::DramTarget> StoreImpl::DramTargetOf(const Extent& e, bool through) {
  DramTarget t;
  t.home = e.medium == Medium::kDram;
  t.base = t.home ? e.base : e.copy_base;
  if (!t.home && through) {
    auto loc = ssd_[e.device]->Locate(e.base, true);
    if (!loc.ok()) return loc.status();
    std::tie(t.fd, t.file_base) = loc.value();
  }
  return t;
}

uint64_t StoreImpl::SsdBlocks(const std::vector<Pending>& blocks) {
  uint64_t n = 0;
  for (const Pending& p : blocks) n += p.e->medium == Medium::kSsd;
  return n;
}

Status StoreImpl::WriteSums(const std::vector<Pending>& blocks, const uint64_t* sums, const uint32_t* offs,
                            const uint32_t* lens) {
  const uint32_t layers = options_.shape.layers;
  std::vector<SumEntry> entries;
  for (size_t k = 0; k < blocks.size();) {
    const Extent* e = blocks[k].e;
    size_t n = 1;
    while (k + n < blocks.size() && blocks[k + n].e == e && blocks[k + n].slot == blocks[k].slot + n) ++n;
    if (!e->sums_in_memory) {
      entries.resize(n * layers);
      for (uint64_t i = 0; i < n * layers; ++i) {
        const uint64_t at = k * layers + i;
        entries[i] = {sums[at], offs ? offs[at] : 0, lens ? lens[at] : 0};
      }
      // Where the table is the truth, sync_writes makes it durable before the records.
      FLATKV_RETURN_IF_ERROR(ssd_[e->device]->WriteSums(e->slot, blocks[k].slot, entries,
                                                        options_.sync_writes && e->tagged));
    }
    k += n;
  }
  return Status::Ok();
}

Status StoreImpl::Commit(SessionId session, const std::vector<Pending>& blocks, const uint64_t* sums,
                         const uint32_t* offs, const uint32_t* lens, const std::function<Status()>& write_ssd,
                         const std::function<persist::BlockRecord(size_t)>& record, bool admit, PutResult* res,
                         Unsettled* unsettled) {
  const uint32_t layers = options_.shape.layers;
  const uint64_t block_bytes = BlockBytes();
  const uint64_t ssd_blocks = SsdBlocks(blocks);
  std::vector<uint8_t> indexed(blocks.size(), 0), taken(blocks.size(), 0);
  // Tagged SSD homes: each block's tag of its sums-table entries (as
  // WriteSums wrote them) and, coded, its encoded bytes, for its record
  // and for the restores that read the entries back.
  std::vector<uint32_t> tags(blocks.size(), 0), stored(blocks.size(), 0);
  {
    std::vector<SumEntry> entries(layers);
    for (size_t k = 0; k < blocks.size(); ++k) {
      if (!blocks[k].e->tagged) continue;
      for (uint32_t l = 0; l < layers; ++l) {
        const uint64_t at = k * layers + l;
        entries[l] = {sums[at], offs ? offs[at] : 0, lens ? lens[at] : 0};
        stored[k] += entries[l].length;
      }
      tags[k] = persist::SumsTag(entries.data(), entries.size() * sizeof(SumEntry));
    }
  }
  auto index = [&](size_t k) FLATKV_REQUIRES(mu_) {
    const Pending& p = blocks[k];
    if (taken[k]) return false;
    uint32_t won_at = 0;
    if (Extent* winner = FindBlock(p.key, &won_at)) {
      taken[k] = 1;  // a concurrent put of the same block won: the session holds that put's block
      HoldBlock(winner, won_at, session, p.e->PositionOf(p.slot), res, admit ? unsettled : nullptr);
      return false;
    }
    if (p.e->tagged) p.e->tags[p.slot] = tags[k];
    IndexBlock(p.e, p.slot, p.key);
    if (p.e->sums_in_memory)  // a DRAM home (SSD homes' entries are in their table already)
      for (uint32_t l = 0; l < layers; ++l) {
        const uint64_t at = k * layers + l;
        p.e->sums[uint64_t{p.slot} * layers + l] = {sums[at], offs ? offs[at] : 0, lens ? lens[at] : 0};
      }
    counters_.put_blocks++;
    res->stored_blocks++;
    indexed[k] = 1;
    return true;
  };
  // 1. Blocks in DRAM (homes and copies) are visible now, before any SSD write.
  {
    MutexLock lock(&mu_);
    for (size_t k = 0; k < blocks.size(); ++k) {
      Extent* e = blocks[k].e;
      const uint32_t slot = blocks[k].slot;
      if (e->medium == Medium::kDram) {
        if (!index(k)) continue;
        Count(Medium::kDram, *e, slot, +1);
        dram_home_blocks_++;
        res->dram_only_blocks++;
        counters_.dram.bytes_written += block_bytes;
      } else if (e->has_copy && index(k)) {
        e->set_in_copy(slot, true);
        e->set_durable(slot, admit ? kWriting : kNotDurable);
        Count(Medium::kDram, *e, slot, +1);
        dram_only_++;
        counters_.dram.bytes_written += block_bytes;
        if (!admit) res->dram_only_blocks++;
      }
    }
  }
  // 2. The SSD homes (a copy's writes may be in flight already), then their
  // manifest records: data before its record.
  Status status = write_ssd();
  if (ssd_blocks == 0 || !admit) return status;
  if (status.ok()) {
    std::vector<std::vector<uint8_t>> records(ssd_.size());
    for (size_t k = 0; k < blocks.size(); ++k) {
      const Extent* e = blocks[k].e;
      if (e->medium != Medium::kSsd) continue;
      persist::EncodeBlockPut(records[e->device], ssd_[e->device]->RefOf(e->slot),
                              e->tagged ? persist::BlockRecord{blocks[k].slot, blocks[k].key, {}, {}, {}, tags[k], stored[k]}
                                        : record(k));
    }
    for (uint32_t d = 0; d < ssd_.size() && status.ok(); ++d)
      if (!records[d].empty()) status = ssd_[d]->manifest().Append(records[d], options_.sync_writes);
  }
  // 3. Durable: restores may read the SSD homes; the put is acknowledged.
  {
    MutexLock lock(&mu_);
    for (size_t k = 0; k < blocks.size(); ++k) {
      Extent* e = blocks[k].e;
      const uint32_t slot = blocks[k].slot;
      if (e->medium != Medium::kSsd) continue;
      if (!status.ok()) {
        if (!indexed[k]) continue;
        e->set_durable(slot, kNotDurable);  // its DRAM copy alone would not survive: a miss, as the error says
        Unindex(e, slot);
        failed_ssd_puts_++;
        res->stored_blocks--;
        continue;
      }
      if (indexed[k]) {
        dram_only_--;
      } else if (!index(k)) {
        continue;
      }
      e->set_durable(slot, kDurable);
      Count(Medium::kSsd, *e, slot, +1);
      counters_.ssd.bytes_written += block_bytes;
    }
    settled_cv_.SignalAll();
  }
  return status;
}

void StoreImpl::AcquireWriteBudget(uint64_t bytes) {
  if (bytes == 0) return;
  MutexLock lock(&write_mu_);
  bool waited = false;
  // A put larger than the whole buffer goes alone rather than never.
  while (write_inflight_ > 0 && write_inflight_ + bytes > write_budget_) {
    if (!waited) counters_.ssd_write_waits++;
    waited = true;
    write_cv_.Wait(&write_mu_);
  }
  write_inflight_ += bytes;
}

void StoreImpl::ReleaseWriteBudget(uint64_t bytes) {
  if (bytes == 0) return;
  MutexLock lock(&write_mu_);
  write_inflight_ -= bytes;
  write_cv_.SignalAll();
}

void StoreImpl::AdmitToSsd(const std::vector<SessionId>& sessions) {
  struct Job {
    Extent* e;
    std::vector<uint32_t> slots;  // ascending
    std::vector<BlockKey> keys;
    std::vector<uint32_t> tags;  // tagged homes: their sums tags, taken under mu_
  };
  const uint32_t layers = options_.shape.layers;
  std::vector<Job> jobs;
  {
    MutexLock lock(&mu_);
    for (SessionId sid : sessions) {
      auto s = sessions_.find(sid);
      if (s == sessions_.end()) continue;
      for (uint64_t id : s->second.extents) {
        Extent* e = extents_.at(id).get();
        if (e->medium != Medium::kSsd || !e->has_copy || e->coded() || e->doomed) continue;
        Job job{e, {}, {}, {}};
        for (uint32_t i = 0; i < e->slots(); ++i) {
          if (!e->present(i) || !e->in_copy(i) || e->durable(i) != kNotDurable) continue;
          e->set_durable(i, kWriting);
          job.slots.push_back(i);
          job.keys.push_back(e->keys[i]);
          if (e->tagged) job.tags.push_back(e->tags[i]);
        }
        if (job.slots.empty()) continue;
        e->pins++;
        e->writers++;
        jobs.push_back(std::move(job));
      }
    }
  }
  if (jobs.empty()) return;
  Status status;
  {
    SegmentWriter writer(*this);
    for (const Job& job : jobs) {
      const Extent* e = job.e;
      const ExtentGeometry& g = e->geom;
      auto loc = ssd_[e->device]->Locate(e->base, true);
      if (!loc.ok()) {
        status = loc.status();
        break;
      }
      auto [fd, file_base] = loc.value();
      for (size_t k = 0; k < job.slots.size();) {
        size_t n = 1;
        while (k + n < job.slots.size() && job.slots[k + n] == job.slots[k] + n) ++n;
        for (uint32_t l = 0; l < layers; ++l)
          writer.Submit(fd, file_base + g.Offset(l, job.slots[k]), dram_->At(e->copy_base + g.Offset(l, job.slots[k])),
                        n * g.slot_stride);
        k += n;
      }
    }
    Status finished = writer.Finish();
    if (status.ok()) status = finished;
  }
  if (status.ok()) {
    // The checksums come from the homes' sums tables, written by the puts.
    std::vector<std::vector<uint8_t>> records(ssd_.size());
    std::vector<SumEntry> sums;
    for (const Job& job : jobs) {
      if (job.e->tagged) {  // the tags are the records' (the table is the truth)
        for (size_t j = 0; j < job.slots.size(); ++j)
          persist::EncodeBlockPut(records[job.e->device], ssd_[job.e->device]->RefOf(job.e->slot),
                                  persist::BlockRecord{job.slots[j], job.keys[j], {}, {}, {}, job.tags[j], 0});
        continue;
      }
      const uint32_t first = job.slots.front(), n = job.slots.back() - first + 1;
      sums.resize(uint64_t{n} * layers);
      status = ReadSums(*job.e, first, n, sums.data());
      if (!status.ok()) break;
      for (size_t j = 0; j < job.slots.size(); ++j) {
        persist::BlockRecord b{job.slots[j], job.keys[j], {}, {}, {}};
        for (uint32_t l = 0; l < layers; ++l) b.checksums.push_back(sums[uint64_t{job.slots[j] - first} * layers + l].checksum);
        persist::EncodeBlockPut(records[job.e->device], ssd_[job.e->device]->RefOf(job.e->slot), b);
      }
    }
    for (uint32_t d = 0; d < ssd_.size() && status.ok(); ++d)
      if (!records[d].empty()) status = ssd_[d]->manifest().Append(records[d], options_.sync_writes);
  }
  if (!status.ok()) LogWarning("admitting reused sessions' blocks to SSD: " + status.ToString() + " (they stay DRAM-only)");
  MutexLock lock(&mu_);
  for (const Job& job : jobs) {
    Extent* e = job.e;
    for (uint32_t slot : job.slots) {
      if (!status.ok()) {
        e->set_durable(slot, kNotDurable);
        continue;
      }
      e->set_durable(slot, kDurable);
      Count(Medium::kSsd, *e, slot, +1);
      dram_only_--;
      counters_.ssd.bytes_written += BlockBytes();
    }
    e->writers--;
    Unpin(e);
  }
  settled_cv_.SignalAll();
}

}  // namespace flatkv
