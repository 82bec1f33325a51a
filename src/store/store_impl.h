// StoreImpl: the flat store. Owns the media (DRAM arena, SSD directories),
// the in-memory index (key -> extent slot), sessions and their LRU order,
// the per-medium queues, and the counters. See docs/architecture.md.
//
// Invariants (under mu_):
//  - index_ maps a key to (extent handle, slot) exactly when that slot is
//    `present`; the slot's `keys` entry is the only copy of the key (the
//    index compares against it), and handles_[e->handle] == e and
//    key_base_[e->handle] == e->keys.data() while e lives;
//  - a key is in index_ only after its bytes were written to its DRAM copy
//    or DRAM home (in_copy) or to its SSD home and logged in the
//    directory's manifest (durable), and after its sums (per-layer
//    checksums, coded offsets and lengths) were written to its SSD home's
//    sums table or, sums_in_memory, to Extent::sums; a restore reads a block from the DRAM
//    copy when in_copy, else from SSD only when durable;
//  - a DRAM copy holding a block that is not durable is not dropped while
//    its extent is pinned (the put writing it pins it); with kAll every
//    indexed SSD-home block becomes durable before its put returns;
//  - an extent with pins > 0 is never freed (restores and puts pin what
//    they touch); a doomed extent is freed when its last pin goes;
//  - allocated DRAM/SSD extents never exceed the configured capacities.
// Thread-safety: public methods are thread-safe. mu_ is never held while
// waiting for data I/O (manifest appends for extent create/free and for
// shared extents' sessions are the only I/O under it; they are small
// buffered writes, fdatasync'ed with sync_writes, plus, once per directory,
// the in-place version upgrade before its first coded or shared extent).
// Coded puts (store_coded.cc) encode before taking it.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <functional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/aligned_buffer.h"
#include "common/histogram.h"
#include "common/mutex.h"
#include "flatkv/codec.h"
#include "flatkv/store.h"
#include "io/io_engine.h"
#include "media/dram_arena.h"
#include "media/ssd_dir.h"
#include "store/block_index.h"
#include "store/dram_queue.h"
#include "store/key_arena.h"
#include "store/local_sources.h"
#include "store/source.h"

namespace flatkv {

class SegmentWriter;
using Clock = std::chrono::steady_clock;

struct Extent {
  uint64_t id = 0;
  uint32_t handle = 0;  // its index in StoreImpl::handles_ (what index_ refers to; reused once freed)
  Medium medium = Medium::kNone;
  uint32_t device = 0;  // SSD directory index; 0 for DRAM
  uint64_t slot = 0;    // its first allocation unit on its medium/device
  uint64_t units = 0;   // allocation units it takes there
  uint64_t base = 0;    // address offset of (layer 0, block slot 0)
  ExtentGeometry geom;  // its layout: its medium's, sized to its block slots (a DRAM copy has the same)
  SessionId session = 0;
  uint32_t reserved = 0;  // block slots handed out to puts
  uint32_t capacity = 0;  // block slots it may hold (raw: geom.extent_blocks)
  uint32_t pins = 0;
  uint32_t writers = 0;  // puts (or SSD admissions) writing into it now; no copy is added meanwhile
  bool doomed = false;
  Clock::time_point last_access;    // last put into it or restore from it
  // Per block slot; meaningful where present (index_ holds no key). In the
  // KeyArena's huge pages: a lookup's second load, with no TLB walk.
  std::vector<BlockKey, KeyArenaAllocator<BlockKey>> keys;
  // Per block slot, one byte: bit 0 present (indexed), bit 1 in_copy (its
  // DRAM copy holds it; SSD homes), bits 2-3 durable (SSD homes: kNotDurable,
  // kDurable or kWriting).
  std::vector<uint8_t> state;
  uint32_t slots() const { return static_cast<uint32_t>(state.size()); }
  bool present(uint32_t i) const { return state[i] & 1; }
  void set_present(uint32_t i, bool v) { state[i] = static_cast<uint8_t>((state[i] & ~1) | uint8_t{v}); }
  bool in_copy(uint32_t i) const { return state[i] & 2; }
  void set_in_copy(uint32_t i, bool v) { state[i] = static_cast<uint8_t>((state[i] & ~2) | uint8_t{v} << 1); }
  uint8_t durable(uint32_t i) const { return static_cast<uint8_t>(state[i] >> 2); }
  void set_durable(uint32_t i, uint8_t d) { state[i] = static_cast<uint8_t>((state[i] & 3) | d << 2); }
  // SSD-home extents: a DRAM copy (same layout as the home, at copy_base in
  // the arena); `state` says which slots it holds, and which slots' SSD
  // writes and BlockPut records completed.
  bool has_copy = false;
  uint64_t copy_slot = 0;   // its first DRAM unit
  uint64_t copy_units = 0;
  uint64_t copy_base = 0;
  // Other live sessions that reference its blocks (they put blocks it
  // already held); they keep it from being freed by its owner's drop.
  std::vector<SessionId> sharers;
  // Per block slot and layer, its checksum (and coded offset and length):
  // in the SSD home's sums table (SsdDir::WriteSums), so nothing here, or
  // where there is none (DRAM homes, read-only stores: sums_in_memory) in
  // `sums`, [slot * layers + layer]; a DRAM home's sums count as part of
  // the medium it fills, not as index.
  bool sums_in_memory = false;
  std::vector<SumEntry> sums;
  // An SSD home in a directory whose sums tables are the truth
  // (SsdDir::tagged_sums): per block slot, the tag of its sums-table
  // entries (persist::SumsTag), which its record carries and a restore
  // checks the entries it reads against.
  bool tagged = false;
  std::vector<uint32_t> tags;
  // A coded extent (codec != null) packs each block's encoded layer slices
  // into the layer regions (l * layer_stride ...), a put's batch starting
  // aligned; the per-slot vectors above grow as slots are reserved.
  std::shared_ptr<const Codec> codec;
  std::string codec_spec;
  bool full = false;                 // a block did not fit: takes no more
  std::vector<uint64_t> fill;        // per layer: bytes of the region handed out
  std::vector<uint32_t> stored;      // per slot: its encoded bytes over all layers (StoredBytes)
  bool coded() const { return codec != nullptr; }
  // Chain positions of its slots (TruncateSession): run starts as (slot,
  // the owner's chain position of that block), the slots after a start
  // following on one by one (persist::ExtentRecord::positions). Empty for
  // an extent recovered from a log older than version 4: position 0.
  std::vector<std::pair<uint32_t, uint32_t>> runs;
  uint32_t PositionOf(uint32_t slot) const {
    auto it = std::upper_bound(runs.begin(), runs.end(), std::make_pair(slot, UINT32_MAX));
    if (it == runs.begin()) return 0;
    --it;
    return it->second + (slot - it->first);
  }
  // Retain: eviction passes it (and its DRAM copy) by until then.
  Clock::time_point retained_until{};
  bool retained(Clock::time_point now) const { return retained_until > now; }
};

inline constexpr uint8_t kNotDurable = 0, kDurable = 1, kWriting = 2;

struct BlockRef {
  uint64_t extent = 0;
  uint32_t slot = 0;
};

struct Session {
  std::vector<uint64_t> extents;  // owned, creation order
  std::vector<uint64_t> shared;   // other sessions' extents it references
  uint64_t open_extent = 0;       // extent receiving new blocks; 0 = none
  uint64_t dram_bytes = 0;        // DRAM its extents hold (copies and DRAM homes)
  Clock::time_point last_access;
  uint64_t touch = 0;             // recency: higher = more recent (the store's touch counter)
  bool reused = false;            // a restore hit its blocks (ssd_admission = kOnReuse)
  std::list<SessionId>::iterator lru;  // position in lru_ (front = most recent), when listed
  bool listed = false;                 // in lru_: every session TouchSession made
  uint32_t tenant = 0;                 // PutOptions::tenant of its last put (0: none)
  // Chain position of the block after the last one it put (a put that
  // names no PutOptions::first_block goes on from here), and, per extent of
  // another session it references, the chain position of the first block
  // it referenced there (absent: 0, as after a restart).
  uint32_t next_position = 0;
  std::unordered_map<uint64_t, uint32_t> shared_from;
};

struct MediumCounters {
  std::atomic<uint64_t> allocated_bytes{0}, hit_blocks{0}, bytes_written{0}, bytes_read{0}, bytes_delivered{0}, read_requests{0},
      evicted_extents{0}, evicted_blocks{0}, max_queue_depth{0};
  void NoteDepth(uint64_t d) {
    uint64_t prev = max_queue_depth.load(std::memory_order_relaxed);
    while (d > prev && !max_queue_depth.compare_exchange_weak(prev, d, std::memory_order_relaxed)) {
    }
  }
};

struct Counters {
  MediumCounters dram, ssd;
  std::atomic<uint64_t> restores{0}, lookup_blocks{0}, miss_blocks{0}, put_blocks{0}, dedup_blocks{0},
      checksum_failures{0}, decode_failures{0}, io_errors{0}, dropped_blocks{0}, recovered_blocks{0}, lost_blocks{0},
      dram_only_lost_blocks{0}, readmitted_blocks{0}, ssd_write_waits{0}, prefetches{0}, prefetches_done{0}, prefetch_skipped{0},
      truncated_blocks{0}, retain_refused_blocks{0};
  LatencyHistogram restore_latency;
  MediumCounters& of(Medium m) { return m == Medium::kDram ? dram : ssd; }
};

class StoreImpl final : public Store {
 public:
  static Result<std::unique_ptr<Store>> Open(const StoreOptions& options);
  ~StoreImpl() override;

  Status Put(SessionId session, std::span<const BlockKey> keys, std::span<const std::byte> data,
             const PutOptions& options) override;
  uint32_t Match(std::span<const BlockKey> chain) const override;
  Result<std::unique_ptr<Restore>> StartRestore(std::span<const BlockKey> chain, const RestoreTarget& target) override;
  Result<uint32_t> Prefetch(std::span<const BlockKey> chain) override;
  Status DropSession(SessionId session) override;
  Result<uint32_t> TruncateSession(SessionId session, uint32_t keep_blocks) override;
  Result<uint32_t> Retain(std::span<const BlockKey> chain, std::chrono::milliseconds ttl) override;
  Status Close() override;
  StoreStats Stats() const override;
  const StoreOptions& options() const override { return options_; }
  uint64_t BlockLayerBytes() const override { return block_layer_bytes_; }
  uint64_t BlockBytes() const override { return block_layer_bytes_ * options_.shape.layers; }
  std::span<const std::byte> DramMemory() const override {
    return dram_ ? std::span<const std::byte>(dram_->At(0), dram_->capacity_bytes()) : std::span<const std::byte>();
  }

  Clock::time_point Now() const { return options_.clock ? options_.clock() : Clock::now(); }
  DramArena* dram() { return dram_.get(); }
  SsdDir* ssd(uint32_t device) { return ssd_[device].get(); }
  io::IoEngine* engine() { return engine_.get(); }
  DramQueue* dram_queue() { return dram_queue_.get(); }
  // The media behind the index, fastest first (a restore reads a block from
  // the first that holds it), and those past it (registered by their components: store/media_registry.cc).
  std::span<Source* const> local_sources() const { return local_sources_; }
  const std::vector<std::unique_ptr<StoreMedium>>& media() const { return media_; }
  DramQueue* decode_queue() { return decode_queue_.get(); }
  Counters& counters() { return counters_; }
  // Drops pins taken by StartRestore, removes blocks that failed their
  // read, checksum or decode (`corrupt`: extent id and slot) from the index
  // (counted in dropped_blocks), and marks the
  // re-admitted blocks (`readmitted`) as held by their extents' DRAM copies.
  void EndRestore(const std::vector<uint64_t>& pinned, const std::vector<BlockRef>& corrupt,
                  const std::vector<BlockRef>& readmitted = {});
  // Window buffers are pre-faulted once and recycled.
  AlignedBuffer AcquireWindow(uint64_t bytes);
  void ReleaseWindow(AlignedBuffer buffer);

 private:
  explicit StoreImpl(const StoreOptions& options) : options_(options) {}
  Status Init();
  Status Recover(uint32_t device, const persist::ManifestContents& contents);

  // StartRestore, re-admitting SSD blocks into DRAM copies when `readmit`.
  Result<std::unique_ptr<Restore>> StartRestoreImpl(std::span<const BlockKey> chain, const RestoreTarget& target,
                                                    bool readmit);
  // Waits for the prefetches in flight (Close).
  void StopPrefetches() FLATKV_EXCLUDES(prefetch_mu_);
  // The prefetch thread: finishes queued prefetch restores until stopped.
  void RunPrefetches() FLATKV_EXCLUDES(prefetch_mu_);

  // Blocks a put found another put still writing (AwaitDurable waits for
  // them), and failed_ssd_puts_ when the first was noted.
  struct Unsettled {
    std::vector<BlockKey> keys;
    uint64_t failures = 0;
  };

  Session& TouchSession(SessionId id) FLATKV_REQUIRES(mu_);
  // Gives SSD extent `e` (no copy yet) a DRAM copy to re-admit restored
  // blocks into, if the policy and a cheap slot allow.
  bool GiveCopy(Extent* e) FLATKV_REQUIRES(mu_);
  // Gives SSD extent `e` a DRAM copy of its layout when DRAM units can be
  // had without waiting (CopySlot), charging its session; its slots' in_copy
  // bits are the caller's.
  bool AttachCopy(Extent* e) FLATKV_REQUIRES(mu_);
  // `codec` null: a raw extent; else a coded one of spec `spec`. A sized
  // medium gives it about `want` block slots (the put's blocks still to
  // place, or for a coded put the raw slots its slices fill), and at least
  // 1/kSizeGrowth of what the session's extents hold, so a session's
  // extents grow geometrically: few of them for a long session, and little
  // unfilled space behind a short one (docs/format_segment.md, "Sized extents").
  Result<Extent*> CreateExtent(SessionId session, PutHint hint, uint64_t want,
                               const std::shared_ptr<const Codec>& codec = nullptr, const std::string& spec = {})
      FLATKV_REQUIRES(mu_);
  static constexpr uint64_t kSizeGrowth = 8;
  // Block slots for a new extent of a session whose extents hold `held`, on
  // a medium whose extents hold multiples of `unit` up to `largest` (unit ==
  // largest: fixed size).
  static uint32_t SizeFor(uint64_t held, uint64_t want, uint32_t unit, uint32_t largest);
  uint64_t HeldBlocks(const Session& s) const FLATKV_REQUIRES(mu_);
  // DRAM that e's DRAM home or DRAM copy takes (0 without either).
  uint64_t DramBytesOf(const Extent& e) const;
  // Block slots per DRAM unit of a DRAM home (0: DRAM homes are not sized).
  uint32_t DramUnitBlocks() const;
  // Put with a codec (store_coded.cc): encodes outside the lock, reserves
  // packed room, writes each extent's batch as one request per layer.
  Status PutCoded(SessionId session, std::span<const BlockKey> keys, std::span<const std::byte> data,
                  const PutOptions& options, const std::shared_ptr<const Codec>& codec);
  // Writes each batch of coded slices (slots[j]'s layer l: ptrs/offs/lens
  // [j * layers + l]): memcpy for DRAM, one aligned write per layer for SSD.
  // `dram` and `writer` as for WriteBlocks.
  Status WriteCoded(const std::vector<std::pair<Extent*, uint32_t>>& slots, const std::vector<uint32_t>& offs,
                    const std::vector<uint32_t>& lens, const std::vector<const std::byte*>& ptrs, bool dram,
                    SegmentWriter* writer);
  // The codec of a recovered extent of spec `spec`.
  Result<std::shared_ptr<const Codec>> CodecForSpec(const std::string& spec) FLATKV_REQUIRES(mu_);
  // Bytes block `slot` of `e` occupies on its medium (encoded bytes if coded).
  uint64_t StoredBytes(const Extent& e, uint32_t slot) const;
  // Adds (sign +1) or removes (-1) block `slot` of `e` in medium m's counts.
  void Count(Medium m, const Extent& e, uint32_t slot, int sign) FLATKV_REQUIRES(mu_);
  // Removes an indexed block of `e` from the index and every count.
  void Unindex(Extent* e, uint32_t slot) FLATKV_REQUIRES(mu_);
  // Sizes e's per-slot vectors for `slots` slots.
  void GrowSlots(Extent* e, uint32_t slots) FLATKV_REQUIRES(mu_);
  // The index's view of a ref: the key in its extent's slot, read through
  // key_base_ (one cache miss fewer than through the Extent).
  struct KeyOfRef {
    const std::vector<const BlockKey*>* bases;
    const BlockKey& operator()(BlockIndex::Ref r) const { return (*bases)[r.handle][r.slot]; }
  };
  KeyOfRef KeyOf() const FLATKV_REQUIRES(mu_) { return KeyOfRef{&key_base_}; }
  // The extent and slot holding `key`, or null.
  Extent* FindBlock(const BlockKey& key, uint32_t* slot) const FLATKV_REQUIRES(mu_);
  bool Indexed(const BlockKey& key) const FLATKV_REQUIRES(mu_) { return index_.Contains(key, KeyOf()); }
  // Makes slot `slot` of `e` hold `key`, present and indexed (key absent).
  void IndexBlock(Extent* e, uint32_t slot, const BlockKey& key) FLATKV_REQUIRES(mu_);
  // Gives a new extent its handle (fails past BlockIndex::kMaxHandles
  // extents or kMaxSlots slots); ReleaseHandle when it is freed.
  Status AddHandle(Extent* e) FLATKV_REQUIRES(mu_);
  void ReleaseHandle(Extent* e) FLATKV_REQUIRES(mu_);
  // Space for a new extent of medium `m` of about `want` block slots (see
  // CreateExtent): its first unit; *device, *blocks (its block slots) and
  // *units say where and how much. Past a free run of the size wanted it
  // takes a run of at least half of it, else reclaims.
  Result<uint64_t> AllocateSlot(Medium m, SessionId requester, uint64_t want, uint32_t* device, uint32_t* blocks,
                                uint64_t* units) FLATKV_REQUIRES(mu_);
  // `units` DRAM units for a copy: free ones, else those of the least
  // recently used other sessions' copies (never a DRAM home, never waiting).
  std::optional<uint64_t> CopySlot(SessionId requester, uint64_t units) FLATKV_REQUIRES(mu_);
  // Drops the DRAM copy CopySlot takes next (the least recently used other
  // session's, else the requester's own least recently accessed one that
  // is not in use); false when there is none.
  bool DropCopyFor(SessionId requester) FLATKV_REQUIRES(mu_);
  // Drops e's DRAM copy (its blocks stay on SSD; blocks that are not
  // durable, kOnReuse, are lost).
  void DropCopy(Extent* e) FLATKV_REQUIRES(mu_);
  // The least recently used eligible extent: walks sessions from least
  // recent, over their owned (newest first) and referenced extents, taking
  // the first `ok` extent whose other holders are all less recent.
  // `copies_only`: only extents with a DRAM copy qualify (skips sessions
  // holding no DRAM quickly).
  template <typename Pred>
  Extent* LruVictim(SessionId requester, bool copies_only, Pred ok) FLATKV_REQUIRES(mu_);
  uint64_t SessionShare() const;
  // Adds `bytes` (negative: removes) to s's DRAM and its tenant's.
  void ChargeDram(Session& s, int64_t bytes) FLATKV_REQUIRES(mu_);
  // Whether `tenant` holds more than an equal share of DRAM among the
  // tenants holding any (its copies and DRAM homes are reclaimed first).
  bool OverShare(uint32_t tenant) const FLATKV_REQUIRES(mu_);
  // Makes `tenant` (non-zero) the session's, moving its DRAM bytes over.
  void SetTenant(Session& s, uint32_t tenant) FLATKV_REQUIRES(mu_);
  // Adds `session` as a holder of another session's extent `e`, whose
  // first block it references at its chain position `from`.
  void AddSharer(Extent* e, SessionId session, uint32_t from = 0) FLATKV_REQUIRES(mu_);
  // A put's deduplication of `key`: true (counted in the store's and the
  // put's dedup_blocks) when the key is indexed already, `session` then
  // holding its extent, or repeats a key earlier in the put (`seen`).
  // *position: the key's chain position in `session` on entry; on return
  // the next key's (after a block of its own, the one after that block's
  // recorded position).
  // A hit whose SSD write another put still has in flight (kWriting) is
  // added to *unsettled (when given): this put is acknowledged only once
  // that write is durable (AwaitDurable).
  bool Deduplicate(SessionId session, const BlockKey& key, std::unordered_set<BlockKey, BlockKeyHash>* seen,
                   PutResult* res, uint32_t* position, Unsettled* unsettled) FLATKV_REQUIRES(mu_);
  // The put of `session` holds `hit`'s block at `slot` (chain position
  // `position` in the session) instead of storing its own: counted as a
  // dedup, `session` becomes a holder of `hit`, and the block goes to
  // *unsettled (when given) while its SSD write is in flight. Dedup, the
  // race to index a block two puts planned, and a coded put's placement
  // all come here.
  void HoldBlock(Extent* hit, uint32_t slot, SessionId session, uint32_t position, PutResult* res,
                 Unsettled* unsettled) FLATKV_REQUIRES(mu_);
  // Waits until no block of `u` is kWriting any more. An error when one
  // left the index after a put's SSD write failed since `u` was begun (the
  // put storing it may be that one): this put may not have stored it
  // either. A block dropped or evicted after its write is no error.
  Status AwaitDurable(const Unsettled& u) FLATKV_EXCLUDES(mu_);
  // Records that slot `slot` of `e` (just reserved) is at chain position
  // `position` of its owner: a new run when it does not follow on (logged
  // for SSD homes, version 4).
  void NotePosition(Extent* e, uint32_t slot, uint32_t position) FLATKV_REQUIRES(mu_);
  // Logs e's run starts from run `from` on (SSD homes).
  Status LogPositions(const Extent& e, size_t from) FLATKV_REQUIRES(mu_);
  // Logs that slots `slots` of SSD home `e` left the index (version 4), so
  // a restart does not bring them back.
  Status LogDropped(const Extent& e, std::span<const uint32_t> slots) FLATKV_REQUIRES(mu_);
  // Logs e's owner and sharers (SSD extents; upgrades the log to version 3).
  Status LogSessions(const Extent& e) FLATKV_REQUIRES(mu_);
  // Back-pressure: waits until `bytes` more fit the SSD write buffer.
  void AcquireWriteBudget(uint64_t bytes);
  void ReleaseWriteBudget(uint64_t bytes);
  // kOnReuse: writes the DRAM-only blocks of `sessions` to their SSD homes.
  void AdmitToSsd(const std::vector<SessionId>& sessions);
  // Frees one extent of medium `m`: the newest extent of the least recently
  // used other session (only idle ones with `idle_only`); failing that, and
  // not `idle_only`, the requester's own least recently accessed extent
  // (a long session's dead history, such as a compacted context).
  bool ReclaimFrom(Medium m, SessionId requester, bool idle_only) FLATKV_REQUIRES(mu_);
  // Frees victim `x` for `requester`; a holder of x left with no extents and
  // no references is forgotten (never the requester, whose put is running).
  bool Evict(Extent* x, SessionId requester) FLATKV_REQUIRES(mu_);
  // Removes session `id` from the session map and the LRU order when it
  // holds no extent and references none.
  // Syncs every SSD directory's manifest (Manifest::Sync); called without
  // mu_, so no fdatasync runs under the store lock.
  Status SyncManifests() FLATKV_EXCLUDES(mu_);
  Status DropSessionLocked(SessionId session) FLATKV_EXCLUDES(mu_);
  void ForgetIfEmpty(SessionId id) FLATKV_REQUIRES(mu_);
  Status FreeExtent(Extent* e) FLATKV_REQUIRES(mu_);
  PlacementContext MakeContext(SessionId session, PutHint hint) FLATKV_REQUIRES(mu_);
  void Unpin(Extent* e) FLATKV_REQUIRES(mu_);
  // A snapshot of directory `device`'s live extents, for a manifest rewrite.
  persist::ManifestContents Snapshot(uint32_t device) FLATKV_REQUIRES(mu_);

  // Writes each block's layer slices to its reserved slot. `dram`: to its
  // DRAM home or DRAM copy (memcpy, a copy's padding zeroed), and with a
  // `writer` also submits a copy's SSD writes straight from the copy, layer
  // by layer as it is filled; else: the SSD homes without a copy, staged,
  // one aligned write per layer per run of consecutive slots. The caller
  // finishes the writer.
  Status WriteBlocks(const std::vector<std::pair<Extent*, uint32_t>>& slots, const std::vector<size_t>& inputs,
                     std::span<const std::byte> data, bool dram, SegmentWriter* writer);
  // Where the DRAM phase of a put writes e's blocks (raw or coded): its DRAM
  // home or its DRAM copy (`home`, at arena offset `base`); for a copy
  // written through (`through`), also its SSD home's file and the file
  // offset of the extent's base (fd -1 otherwise).
  struct DramTarget {
    bool home = false;
    uint64_t base = 0;
    int fd = -1;
    uint64_t file_base = 0;
  };
  Result<DramTarget> DramTargetOf(const Extent& e, bool through);
  // The common tail of raw and coded puts once the bytes are in their DRAM
  // places: indexes DRAM-held blocks, writes SSD homes (`write_ssd`),
  // logs them, marks them durable. `record(k)` is block k's manifest record.
  struct Pending {
    Extent* e;
    uint32_t slot;
    BlockKey key;
  };
  static uint64_t SsdBlocks(const std::vector<Pending>& blocks);
  // Writes the sums-table entries of `blocks` with SSD homes (checksums
  // sums[k * layers + l]; coded: offs/lens likewise, else null), one pwrite
  // per run of consecutive slots, before any of them is indexed. Without
  // the lock: a pinned extent's home does not change.
  Status WriteSums(const std::vector<Pending>& blocks, const uint64_t* sums, const uint32_t* offs,
                   const uint32_t* lens);
  // Block slots [first, first + n) of `e`'s sums (n * layers entries): from
  // memory when sums_in_memory (the caller holds mu_), else from its SSD
  // home's sums table (no lock needed; the caller pins e).
  Status ReadSums(const Extent& e, uint32_t first, uint32_t n, SumEntry* out);
  // A block a concurrent put indexed first (both planned it as new) is that
  // put's: `session` becomes a holder of its extent, as a deduplicated put
  // would, and its key goes to *unsettled while that put's SSD write is in
  // flight (AwaitDurable).
  Status Commit(SessionId session, const std::vector<Pending>& blocks, const uint64_t* sums, const uint32_t* offs,
                const uint32_t* lens, const std::function<Status()>& write_ssd,
                const std::function<persist::BlockRecord(size_t)>& record, bool admit, PutResult* result,
                Unsettled* unsettled);

  StoreOptions options_;
  uint64_t block_layer_bytes_ = 0;
  std::shared_ptr<PlacementPolicy> placement_;
  std::shared_ptr<io::IoEngine> engine_;
  std::unique_ptr<DramQueue> dram_queue_;
  std::unique_ptr<DramQueue> decode_queue_;
  std::unique_ptr<DramArena> dram_;
  std::vector<std::unique_ptr<SsdDir>> ssd_;
  Counters counters_;

  DramSource dram_source_{this};
  SsdSource ssd_source_{this};
  std::vector<Source*> local_sources_{&dram_source_, &ssd_source_};
  // The media past the index (store/source.h): opened at Open, stopped at
  // Close, destroyed with the store.
  std::vector<std::unique_ptr<StoreMedium>> media_;
  mutable Mutex mu_;
  bool closed_ FLATKV_GUARDED_BY(mu_) = false;
  CondVar settled_cv_;  // on mu_: signalled when blocks leave kWriting
  uint64_t failed_ssd_puts_ FLATKV_GUARDED_BY(mu_) = 0;  // blocks unindexed because their put's SSD write failed
  // Prefetches (Prefetch): restores into the window that one thread
  // finishes in the background, so their blocks land in DRAM copies.
  static constexpr size_t kMaxPrefetches = 4;
  Mutex prefetch_mu_;
  CondVar prefetch_cv_;
  std::deque<std::unique_ptr<Restore>> prefetch_queue_ FLATKV_GUARDED_BY(prefetch_mu_);
  size_t prefetch_running_ FLATKV_GUARDED_BY(prefetch_mu_) = 0;
  bool prefetch_stop_ FLATKV_GUARDED_BY(prefetch_mu_) = false;
  std::thread prefetch_thread_ FLATKV_GUARDED_BY(prefetch_mu_);  // started by the first prefetch; joined by Close
  uint64_t next_extent_id_ FLATKV_GUARDED_BY(mu_) = 1;
  uint32_t next_device_ FLATKV_GUARDED_BY(mu_) = 0;  // SSD round robin
  BlockIndex index_ FLATKV_GUARDED_BY(mu_);
  std::vector<Extent*> handles_ FLATKV_GUARDED_BY(mu_);        // by Extent::handle; null where free
  std::vector<const BlockKey*> key_base_ FLATKV_GUARDED_BY(mu_);  // by handle: handles_[h]->keys.data()
  std::vector<uint32_t> free_handles_ FLATKV_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, std::unique_ptr<Extent>> extents_ FLATKV_GUARDED_BY(mu_);
  std::unordered_map<SessionId, Session> sessions_ FLATKV_GUARDED_BY(mu_);
  std::list<SessionId> lru_ FLATKV_GUARDED_BY(mu_);
  uint64_t touch_ FLATKV_GUARDED_BY(mu_) = 0;
  uint64_t dram_only_ FLATKV_GUARDED_BY(mu_) = 0;  // indexed SSD-home blocks whose SSD write is not complete
  uint64_t dram_home_blocks_ FLATKV_GUARDED_BY(mu_) = 0;  // indexed blocks whose home is DRAM
  uint64_t dram_blocks_ FLATKV_GUARDED_BY(mu_) = 0;
  uint64_t ssd_blocks_ FLATKV_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::shared_ptr<const Codec>> codecs_ FLATKV_GUARDED_BY(mu_);  // by spec, for recovery
  uint64_t dram_stored_ FLATKV_GUARDED_BY(mu_) = 0;  // StoredBytes of indexed DRAM blocks
  uint64_t ssd_stored_ FLATKV_GUARDED_BY(mu_) = 0;
  // DRAM (copies and DRAM homes) per tenant holding any (Session::tenant).
  std::unordered_map<uint32_t, uint64_t> tenant_dram_ FLATKV_GUARDED_BY(mu_);
  // Extents a Retain holds (some may have expired; pruned by Retain).
  std::unordered_set<uint64_t> retained_ FLATKV_GUARDED_BY(mu_);

  Mutex write_mu_;
  CondVar write_cv_;
  uint64_t write_inflight_ FLATKV_GUARDED_BY(write_mu_) = 0;
  uint64_t write_budget_ = 0;  // ssd_write_buffer_bytes, derived at Open

  Mutex window_mu_;
  std::vector<AlignedBuffer> window_pool_ FLATKV_GUARDED_BY(window_mu_);
};

}  // namespace flatkv
