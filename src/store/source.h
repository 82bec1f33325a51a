// Media under the store, as a restore and a put see them
// (docs/architecture.md, "Media and sources").
//
// A restore plans *runs* (consecutive blocks of its prefix that one medium
// reads) over *sources*. A Source says what it holds of a chain, how its
// reads land, and reads on its own queue; the restore (store/restore.cc)
// issues layers, counts each layer's pending units, verifies, settles and
// finishes without naming any medium.
//
// Two kinds of source:
//  - behind the store's index (DRAM copies and homes, SSD homes:
//    store/local_sources.h): Holds() says whether it can serve a slot of an
//    indexed extent; each layer of a run is one or more requests (pieces)
//    that Read() completes;
//  - past the index (the remote tier, and whatever comes next: another
//    remote engine, an object store): Find() says how far it holds the
//    chain beyond what came before, as a Fetch that streams every layer of
//    its run on the medium's own queue through a FetchSink, settling each
//    layer as it lands.
//
// A medium past the index is a StoreMedium: its restore source, what it does
// with a put, its stats, and its stop. Adding one is files in its own
// folder (its own component), its options in flatkv/options.h, a row in
// store/media_registry.cc's table of the media options can name, and its
// registration (RegisterMedium) where stores are composed.
//
// Landing places are host memory (a window slot or the caller's
// RestoreTarget destinations) or device memory (a RestoreTarget with a
// DeviceLanding: the GPU window). A source that can write device memory
// without a host copy (DRAM: DMA from its pinned arena) says so in CanLand
// and is handed the landing in its requests; so is a file-backed source
// (SSD: RunOrigin::fd) whose file the landing reads itself
// (DeviceLanding::ReadsFile, cuFile), for runs whose destinations are one
// aligned range, checked in device memory. For the others, the restore
// stages the layer in its host window and copies it over whole.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "flatkv/keys.h"
#include "flatkv/options.h"
#include "flatkv/placement.h"
#include "flatkv/stats.h"
#include "flatkv/status.h"

namespace flatkv {

class DeviceLanding;     // flatkv/store.h
struct Extent;           // store/store_impl.h
struct MediumCounters;   // store/store_impl.h

enum class LandingKind : uint8_t { kHost, kDevice };

// Where a run of a source starts: its device, file and the address of
// (layer 0, its first slot) on the medium.
struct RunOrigin {
  uint32_t device = 0;
  int fd = -1;
  uint64_t src = 0;
};

// One raw request of a layer: where.size() blocks of `block_bytes` at
// `stride` from `src`, landing block j at where[j] (a source that does not
// scatter reads them contiguously: where[j] == where[0] + j * stride).
struct ReadRequest {
  int fd = -1;
  uint64_t src = 0;
  uint64_t stride = 0;
  uint64_t block_bytes = 0;
  std::vector<const std::byte*> where;
  // Set when `where` is device memory: every byte goes through it (only to
  // a source that CanLand(LandingKind::kDevice), or a file-backed one whose
  // file it reads: the request is then one read of `fd` into where[0]).
  DeviceLanding* device = nullptr;
};
// Called once a request has completed, with its landing places.
using ReadDone = std::function<void(Status status, std::vector<const std::byte*> where)>;

// What a restore offers a streaming source (a Fetch) of one of its runs.
class FetchSink {
 public:
  virtual ~FetchSink() = default;
  // Where block `block` (its position in the restored prefix) of `layer`
  // lands, once the layer is issued; null if the restore ends first.
  virtual std::byte* AwaitLanding(uint32_t layer, uint32_t block) = 0;
  // Layers up to `layer` have landed, their blocks valid below `valid`;
  // false once the restore is abandoned (stop fetching).
  virtual bool SettleThrough(uint32_t layer, uint32_t valid) = 0;
  // The fetch is over; every layer not settled is valid below `end`.
  virtual void End(uint32_t end) = 0;
};

// A run a source past the index found: `blocks` blocks from `from`.
class Fetch {
 public:
  virtual ~Fetch() = default;
  virtual uint32_t from() const = 0;
  virtual uint32_t blocks() const = 0;  // the run ends at block `blocks` of the chain
  // Streams every layer on the medium's own queue, then calls sink.End;
  // false (the sink is not called) when the medium has stopped.
  virtual bool Start(FetchSink* sink) = 0;
};

class Source {
 public:
  virtual ~Source() = default;
  virtual Medium medium() const = 0;

  // --- What it holds.
  // Behind the index: whether slot `slot` of extent `e` can be read here
  // now, and the extent's base address here (*base).
  virtual bool Holds(const Extent& e, uint32_t slot, uint64_t* base) const { return false; }
  // Behind the index: where a run starting at offset `first` of the
  // extent at `base` reads from.
  virtual Result<RunOrigin> Origin(const Extent& e, uint64_t base, uint64_t first) const {
    return Status::FailedPrecondition("restore: a read from a medium past the index");
  }
  // Past the index: what it holds of chain[from..]; null when nothing.
  virtual std::unique_ptr<Fetch> Find(std::span<const BlockKey> chain, uint32_t from) { return nullptr; }

  // --- How its reads land and are checked.
  virtual uint64_t land_align() const { return 1; }  // alignment of a landing address
  // Whether it copies each block wherever it goes (else a request reads
  // one contiguous range, and scattered destinations land in the window).
  virtual bool scatters() const { return true; }
  // Whether its raw reads are checked against the blocks' checksums (a
  // Fetch verifies what it streams itself).
  virtual bool verifies() const { return false; }
  // Whether what it reads may be copied into a DRAM copy (re-admission).
  virtual bool readmits() const { return false; }
  virtual bool CanLand(LandingKind kind) const { return kind == LandingKind::kHost; }
  // Whether its memory is addressable (DRAM): coded pieces decode from it
  // directly (Map) instead of being read into the window's staging first.
  virtual bool mapped() const { return false; }
  virtual const std::byte* Map(uint64_t src) const { return nullptr; }
  // Its per-medium counters (null: a medium past the index keeps its own).
  virtual MediumCounters* counters() const { return nullptr; }

  // --- Reading (behind the index).
  // Reads `req` on the medium's queue, then done(status) on its thread.
  virtual void Read(ReadRequest req, ReadDone done) {
    done(Status::FailedPrecondition("restore: a read from a medium past the index"), std::move(req.where));
  }
  // Reads `len` bytes from `src` into `into` (coded pieces' staging).
  virtual void ReadBytes(int fd, uint64_t src, std::byte* into, uint64_t len, std::function<void(Status)> done) {
    done(Status::FailedPrecondition("restore: a read from a medium past the index"));
  }
};

// What a medium past the index is to the store besides a restore source.
class StoreMedium {
 public:
  virtual ~StoreMedium() = default;
  virtual const char* name() const = 0;
  virtual Source* source() = 0;
  // After a put stored `keys` locally: its raw data, block-major (block b's
  // layers at b * layers * block layer bytes). Never blocks the put.
  virtual void OnPut(std::span<const BlockKey> keys, std::span<const std::byte> data) {}
  // Its part of the store's stats (and so of /metrics and the C API).
  virtual void AddStats(StoreStats* stats) const {}
  // Close: finishes or drops what it has queued; later calls do nothing.
  virtual void Stop() {}
};

// What a medium's factory is given at Open.
struct MediumContext {
  const StoreOptions& options;
  uint64_t block_layer_bytes;
};

// A registered medium: opens itself when its options ask for it (null:
// not configured).
using MediumFactory = Result<std::unique_ptr<StoreMedium>> (*)(const MediumContext& context);

// A medium past the index as its component registers it, where a store is
// composed (the daemon, the C API, the tool, a test; for the remote tier,
// flatkv::RegisterRemoteMedium() in flatkv/remote.h), so that src/store
// names no medium's folder.
struct MediumDescriptor {
  const char* name;  // as StoreStats and errors spell it: "remote"
  MediumFactory open;
};

// Registers `medium` for the stores opened after this call; a name already
// registered is left as it is. Thread-safe.
void RegisterMedium(const MediumDescriptor& medium);

// The media past the index that `context.options` configure, in
// registration order: the order restores ask them. Options that configure a
// medium no one registered in this program (StoreOptions::remote with seeds,
// and flatkv_remote not linked or its registration not called) fail with
// FailedPrecondition naming the medium and the component to link
// (store/media_registry.cc).
Result<std::vector<std::unique_ptr<StoreMedium>>> OpenMedia(const MediumContext& context);

// Tests: replaces the registered media with `media` and returns those it
// replaced (to put back).
std::vector<MediumDescriptor> ReplaceMediaForTest(std::vector<MediumDescriptor> media);

}  // namespace flatkv
