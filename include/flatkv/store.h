// Store: host DRAM and NVMe SSD as peer media in one 64-bit address space.
//
// A block (block_tokens tokens of KV across all layers) is written once to
// its home and never migrated: with an SSD tier the home is on SSD and DRAM
// holds copies of recently used sessions' extents (dropping one loses
// nothing); without one, DRAM is the home. A session's blocks are laid out
// session-contiguous and layer-major inside extents, so restoring a prefix
// costs one read per layer per extent. See docs/architecture.md.
//
// Block payload layout (what Put takes and what a restore delivers): a
// block is `shape.layers` consecutive layer slices of BlockLayerBytes()
// each. Without a codec the bytes inside a layer slice are the caller's
// (the store never interprets them); with one, a slice is a SliceLayout
// tensor (flatkv/codec.h) that is stored encoded and restored decoded.
//
// Thread-safety: all methods are thread-safe. A Restore object is used by
// one consumer thread at a time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "flatkv/keys.h"
#include "flatkv/options.h"
#include "flatkv/placement.h"
#include "flatkv/prune.h"
#include "flatkv/stats.h"
#include "flatkv/status.h"

namespace flatkv {

using SessionId = uint64_t;

// A 64-bit address: medium in the top 4 bits, device in the next 12, byte
// offset in the low 48. Format in docs/format_address.md.
struct Address {
  static constexpr int kOffsetBits = 48;
  static constexpr uint64_t kOffsetMask = (uint64_t{1} << kOffsetBits) - 1;
  uint64_t raw = 0;

  static Address Make(Medium m, uint32_t device, uint64_t offset) {
    return Address{(uint64_t(m) << 60) | (uint64_t(device & 0xFFF) << kOffsetBits) | (offset & kOffsetMask)};
  }
  Medium medium() const { return static_cast<Medium>(raw >> 60); }
  uint32_t device() const { return static_cast<uint32_t>((raw >> kOffsetBits) & 0xFFF); }
  uint64_t offset() const { return raw & kOffsetMask; }
};

// Where one hit block lives: the address of its layer-0 slice, and the
// distance between its consecutive layer slices (for a coded block: the
// start of its encoded layer-0 slice; slice l is at most this far further).
struct BlockLocation {
  Address layer0;
  uint64_t layer_stride = 0;
};

// What one Put did, for callers that ask (PutOptions::result).
struct PutResult {
  uint32_t stored_blocks = 0;  // new blocks this call stored (durable or DRAM-only)
  uint32_t dedup_blocks = 0;   // blocks already stored (now also referenced by this session)
  // Of stored_blocks, those acknowledged as DRAM-only: no SSD home written
  // yet (ssd_admission = kOnReuse, or a store without an SSD tier). They
  // are lost when their DRAM is reclaimed or the process dies.
  uint32_t dram_only_blocks = 0;
};

struct PutOptions {
  PutHint hint = PutHint::kAuto;
  // The codec these blocks are stored with (a namespace's choice); null
  // means the store's (StoreOptions::codec). An extent holds blocks of one
  // codec: a session switching codec continues in a new extent.
  std::shared_ptr<const Codec> codec = nullptr;
  // Chain index of keys[0], so that codecs know each block's absolute token
  // position ((first_block + i) * block_tokens); kUnknownBlock when unknown.
  static constexpr uint32_t kUnknownBlock = 0xFFFFFFFFu;
  uint32_t first_block = kUnknownBlock;
  // If set, filled in when Put returns (also on error: what was stored).
  PutResult* result = nullptr;
  // The tenant the session belongs to (a daemon passes its tenant's index
  // + 1; 0: none, the session keeps what it had). When DRAM is short,
  // copies and DRAM homes are taken first from tenants holding more than
  // an equal share of DRAM among the tenants that hold any.
  uint32_t tenant = 0;
};

// Destinations in an accelerator's memory, which the host cannot write (the
// GPU window, docs/gpu.md): every byte reaches them through Copy, ReadFile
// or Decode. A source that can land there copies straight from the medium:
// DRAM by DMA from its arena; SSD homes by the landing's own file reads
// (cuFile) where it reads their file and a run's destinations are one
// 4 KiB-aligned range, checked in device memory (Checksums); coded extents
// whose codec it decodes (Decodes) by their checked encoded slices, decoded
// there. The others (media past the index, other coded extents, SSD where
// the landing does not read files) land, are checked and decoded in the
// restore's host window, which then copies each layer over once it is
// complete.
struct SliceLayout;  // flatkv/codec.h

class DeviceLanding {
 public:
  virtual ~DeviceLanding() = default;
  // Host memory the restore will copy from (its window), before any copy
  // from it: pinned, so that those copies are DMA.
  virtual void Pin(std::span<const std::byte> host) = 0;
  // Copies `bytes` from host `src` to device `dst` and returns once they
  // have landed, or why they did not (those blocks are then misses). Called
  // from several I/O threads at once.
  virtual Status Copy(std::byte* dst, const std::byte* src, uint64_t bytes) = 0;
  // Whether it reads file `fd` (an SSD segment, opened O_DIRECT) straight
  // into device memory; asked once per run, before any read.
  virtual bool ReadsFile(int fd) = 0;
  // Reads `bytes` at `offset` of `fd` into device `dst` (4 KiB aligned) on
  // the landing's own threads, then done(status) there. A failed read is a
  // miss that leaves the blocks stored, as a failed copy is.
  virtual void ReadFile(int fd, uint64_t offset, std::byte* dst, uint64_t bytes,
                        std::function<void(Status)> done) = 0;
  // The block checksums (BlockChecksum) of `n` adjacent slices of `bytes`
  // each at device `slices`, into host `out[0..n)`.
  virtual Status Checksums(const std::byte* slices, uint32_t n, uint64_t bytes, uint64_t* out) = 0;
  // Whether it decodes `codec`'s slices of `layout` in device memory (the
  // GPU decoders): a coded run then carries its encoded slices over,
  // checked on the host, and they are decoded into their destinations
  // there, instead of decoded on the host and carried over decoded.
  virtual bool Decodes(const Codec& codec, const SliceLayout& layout) = 0;
  // Decodes `slices` (host memory, each a whole encoded slice, header
  // included, checked; consecutive in one buffer) into device `dst[j]`
  // (layout.Bytes() each) and returns once they are decoded, or why not
  // (those blocks are then misses that stay stored).
  virtual Status Decode(const SliceLayout& layout, std::span<const std::span<const std::byte>> slices,
                        std::span<std::byte* const> dst) = 0;
};

// Where a restore delivers: by default into the store's bounded window
// (WaitLayer's view points there); with a destination, straight into the
// caller's own KV memory (a serving engine's paged cache), saving a copy.
struct RestoreTarget {
  // The address for `block`'s slice of `layer` (BlockLayerBytes() bytes,
  // valid for the whole restore). Called on the consumer's thread. SSD
  // blocks whose destinations are 4 KiB aligned and contiguous within a
  // layer are read there directly; others go through the window first.
  std::function<std::byte*(uint32_t layer, uint32_t block)> destination;
  // Set: the destinations are device memory (DeviceLanding, above).
  DeviceLanding* device = nullptr;
  // Destinations reused every `reuse_layers` layers (a bounded window of
  // that many layers): layer l loads only once the consumer has released
  // layer l - reuse_layers. 0: every layer's destinations are its own.
  uint32_t reuse_layers = 0;

  // Why a store cannot restore into this target (a device landing or reused
  // destinations with no destination), or Ok.
  Status Check() const {
    if ((device || reuse_layers > 0) && !destination)
      return Status::InvalidArgument(std::string("restore: a target with ") +
                                     (device ? "a device landing" : "reuse_layers") + " but no destination");
    return Status::Ok();
  }
};

// One restored layer: `blocks` consecutive blocks' slices of this layer,
// block-major, BlockLayerBytes() each. Valid until ReleaseLayer(layer).
// With a RestoreTarget destination, `data` is empty: the slices are at
// their destinations.
struct LayerView {
  uint32_t layer = 0;
  uint32_t blocks = 0;
  std::span<const std::byte> data;
};

// A restore in flight: loads the hit prefix layer by layer, into a bounded
// window or the caller's memory (RestoreTarget), at most a window's worth of
// layers at a time. Consume layers in order: WaitLayer(l), use the view (or
// the destination), ReleaseLayer(l), which lets the next layer load (into
// the caller's memory the next layers load as earlier ones land, without it).
//
// If a block fails its checksum, its read or (when stored encoded) its
// decoding, that block and every later one become misses: later views carry fewer blocks, and Finish()
// returns the final count. Destroying a Restore waits for its I/O.
class Restore {
 public:
  virtual ~Restore() = default;
  // Leading blocks of the chain found in the index when the restore began.
  virtual uint32_t hit_blocks() const = 0;
  // Where each hit block lives.
  virtual std::span<const BlockLocation> locations() const = 0;
  // Blocks until `layer` is loaded. Layers must be waited for in order;
  // waiting for a layer beyond the window without releasing earlier ones is
  // a FailedPrecondition error rather than a deadlock (into the caller's
  // memory, a layer beyond the window is waited for: it will load).
  virtual Result<LayerView> WaitLayer(uint32_t layer) = 0;
  virtual void ReleaseLayer(uint32_t layer) = 0;
  // Waits for every layer still loading and returns the blocks valid in
  // every layer (<= hit_blocks()).
  virtual uint32_t Finish() = 0;
};

class Store {
 public:
  // Opens (creating or recovering) a store. Fails with InvalidArgument on a
  // bad shape or capacity, NotFound/PermissionDenied on an unusable
  // directory, Corruption on a manifest that belongs to another shape.
  static Result<std::unique_ptr<Store>> Open(const StoreOptions& options);
  virtual ~Store() = default;

  // Writes `keys.size()` blocks for `session`. `data` is the blocks'
  // payloads back to back (BlockBytes() each). Blocks already stored are
  // skipped, and `session` then holds a reference to them (DropSession of
  // their writer keeps them while it lives). With an SSD tier, Ok means
  // every new block's SSD write and manifest record completed (durability
  // in docs/architecture.md), unless PutResult::dram_only_blocks says
  // otherwise; a block's DRAM copy may serve restores before that. On error
  // nothing previously stored is lost, and blocks of this call that were
  // not written are misses.
  virtual Status Put(SessionId session, std::span<const BlockKey> keys, std::span<const std::byte> data,
                     const PutOptions& options = {}) = 0;

  // How many leading keys of `chain` are stored (no I/O).
  virtual uint32_t Match(std::span<const BlockKey> chain) const = 0;

  // Starts restoring the longest stored prefix of `chain` (possibly empty).
  // A Restore must be destroyed before its Store.
  virtual Result<std::unique_ptr<Restore>> StartRestore(std::span<const BlockKey> chain,
                                                        const RestoreTarget& target = {}) = 0;

  // Brings the DRAM copies of the stored prefix of `chain` in ahead of the
  // restore that will need it, without waiting for them. Returns the
  // leading blocks found. Those held on SSD alone are read by a background
  // restore and re-admitted as their session's DRAM copy (as a restore does
  // with readmit_on_restore, whatever that option says), where DRAM has
  // room; blocks already in DRAM cost nothing. At most a few prefetches run
  // at once: past them a prefetch only counts (StoreStats::prefetch_skipped).
  virtual Result<uint32_t> Prefetch(std::span<const BlockKey> chain) = 0;

  // Frees every extent of `session`, on both media, except those holding
  // blocks another live session references (they pass to that session),
  // and drops the session's own references.
  virtual Status DropSession(SessionId session) = 0;

  // Releases the blocks of `session` beyond the first `keep_blocks` of its
  // chain, for an agent that rewrote its history: its chain is its blocks in
  // the order its puts carried them (PutOptions::first_block where given,
  // else each put going on from the last), blocks it shares with other
  // sessions included. Blocks another live session references stay, and
  // the session's references to other sessions' blocks at those positions
  // go. Returns the blocks taken out of the index. Its next put without a
  // first_block goes on from `keep_blocks`. NotFound for an unknown session.
  virtual Result<uint32_t> TruncateSession(SessionId session, uint32_t keep_blocks) = 0;

  // Keeps the stored prefix of `chain` (its extents, and their DRAM copies)
  // from eviction for `ttl` from now (a later, longer retain extends it;
  // ttl 0 releases it). Returns the leading blocks now retained: fewer
  // than stored when retained extents would pass half of a medium
  // (rounded up)
  // (StoreStats::retain_refused_blocks counts the rest). Eviction that
  // finds only retained extents fails as it would with every extent in use.
  virtual Result<uint32_t> Retain(std::span<const BlockKey> chain, std::chrono::milliseconds ttl) = 0;

  // Prefix-cache pruning (flatkv/prune.h): stores a pruned view of the
  // blocks of `chain` (all of which must be stored: NotFound names how many
  // are) without the token positions in `ranges` (sorted, disjoint, within
  // chain.size() x block_tokens; ValidatePruneSet). The view is a session of
  // its own (PruneResult::view_session) under PruneViewKeys(chain.back(),
  // ...): its blocks hold the kept tokens' KV rows in order (the slice
  // layout of flatkv/codec.h), the last block zero-padded. The chain's own
  // blocks are untouched (DropSession of their session frees them). When
  // the view is wholly stored already nothing is read or written
  // (stored_blocks 0), even if the chain is gone. `options` as for a Put
  // (hint, codec, tenant). The base implementation restores the chain and
  // puts the view through this interface; a daemon's RemoteStore runs it in
  // the daemon.
  virtual Result<PruneResult> Prune(std::span<const BlockKey> chain, std::span<const TokenRange> ranges,
                                    const PutOptions& options = {});
  // The leading blocks of the view of (chain, ranges) stored (no I/O); the
  // view is whole when this is ceil(kept tokens / block_tokens). 0 for an
  // invalid prune set.
  uint32_t MatchPruned(std::span<const BlockKey> chain, std::span<const TokenRange> ranges) const;

  // Writes a compact manifest and closes files. Further calls fail.
  virtual Status Close() = 0;

  virtual StoreStats Stats() const = 0;
  virtual const StoreOptions& options() const = 0;
  // Bytes of one block's slice of one layer, and of one whole block.
  virtual uint64_t BlockLayerBytes() const = 0;
  virtual uint64_t BlockBytes() const = 0;
  // The host memory DRAM hits are copied from (the DRAM arena; empty when
  // there is none here): what an accelerator pins once (cudaHostRegister),
  // so that restores into a DeviceLanding copy DRAM hits by DMA. Valid
  // until the store is destroyed; unpin it before that.
  virtual std::span<const std::byte> DramMemory() const { return {}; }
};

}  // namespace flatkv
