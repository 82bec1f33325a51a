// RestoreImpl: one restore in flight. At start it pins the extents holding
// the hit prefix and plans, once, the coalesced runs (consecutive blocks of
// one extent) that every layer reads; per layer, each run is one request
// (split at max_request_bytes) to its source's own queue (Source::Read: for
// DRAM the DramQueue, for SSD the SSD IoEngine). Layers are issued in order
// into the window's slots, at most window_layers at a time: a slot frees when
// the consumer releases its layer or, for a restore into the caller's
// destinations, as soon as the layer has landed (the thread that lands it
// issues the next). Where the window binds and a device is read, layer 0 is
// issued alone and the rest once it has landed, so that the first layer
// does not share the device with a whole window of others. A small
// session within one SSD extent read straight into layer-major
// destinations reads its layers 1.. several per request (spans, PlanSpan).
//
// Reads land 4 KiB aligned; where a run's destination is not (an odd
// block size, or SSD slots padded to 4 KiB), the layer is compacted with
// memmove once all of it has landed. SSD blocks are checksummed on every
// read (DRAM too with verify_dram_reads): a small piece on the thread that
// completed it, a larger one by several decode-queue workers at once; a
// failed check or read makes that block and all later ones a miss.
//
// Runs of a coded extent read their packed encoded slices: an SSD piece is
// one aligned read per layer into the window slot's staging area (after the
// decoded layer), then decode jobs (about kDecodeJobBytes of output each)
// on the store's decode queue verify and decode each block straight into
// its place in the window slot or its RestoreTarget destination, while
// later layers' reads are in flight; DRAM coded pieces are decode jobs
// reading the arena. A decode failure counts like a checksum failure.
//
// Every run reads through its Source (store/source.h): the planner asks
// the media behind the index, fastest first, which holds each block, then
// the media past it (the remote tier) how far they hold the rest; this
// class names no medium. A run of a medium past the index is one Fetch that
// streams every layer on that medium's own queue through a FetchSink
// (Stream), landing each layer's blocks in its window slot (once issued)
// or the caller's destinations, as one more pending unit of the layer. It
// verifies what it streams: a missing or corrupt block cuts the valid
// prefix, never delivers wrong bytes.
//
// Thread-safety: the consumer calls one method at a time; completions run
// on I/O threads and synchronize with it through mu_.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "common/mutex.h"
#include "store/source.h"
#include "store/store_impl.h"
#include "store/window.h"

namespace flatkv {

class RestoreImpl final : public Restore {
 public:
  // Called with the store's lock held: looks up and pins the prefix.
  RestoreImpl(StoreImpl* store, std::span<const BlockKey> chain, const RestoreTarget& target,
              const std::function<Extent*(const BlockKey&, uint32_t*)>& find);
  ~RestoreImpl() override;

  // Resolves destinations, allocates the window if anything lands there,
  // and issues the first layers. Call without the store's lock.
  Status Begin();

  uint32_t hit_blocks() const override { return hit_; }
  std::span<const BlockLocation> locations() const override { return locations_; }
  Result<LayerView> WaitLayer(uint32_t layer) override;
  void ReleaseLayer(uint32_t layer) override;
  uint32_t Finish() override;
  const std::vector<uint64_t>& pinned() const { return pinned_; }
  // readmit_on_restore, called under the store's lock before Begin: the
  // extents of the SSD runs, and where run `r`'s extent's DRAM copy is (the
  // restore copies what it reads from SSD there).
  std::vector<uint64_t> SsdRunExtents() const;
  void SetReadmit(uint64_t extent, uint64_t copy_base);

 private:
  // Decoded bytes one decode job produces: small enough to spread a layer
  // over the decode workers, large enough to amortize the queueing.
  static constexpr uint64_t kDecodeJobBytes = 1ull << 20;
  // Bytes one checksum job of a raw SSD piece covers: pieces larger than
  // this are verified by several decode-queue workers at once.
  static constexpr uint64_t kVerifyJobBytes = 512ull << 10;
  // Layers whose run is smaller than this are read several per request
  // where they can be (PlanSpan): a 2 MiB session of llama-3.1-8b, 32
  // layers of 64 KiB, as 5 requests instead of 32 (SSD / raw O_DIRECT,
  // median of 7 runs, 0.66 -> 0.77). At 512 KiB layers it was slower
  // (0.98 -> 0.84).
  static constexpr uint64_t kSpanLayerBytes = 256ull << 10;

  struct Run {
    Source* source = nullptr;
    uint32_t device = 0;
    int fd = -1;               // a file-backed medium's
    uint64_t src = 0;          // the medium's address of (layer 0, first slot)
    uint64_t extent = 0;
    uint32_t first_slot = 0;   // slot of the first block within its extent
    uint32_t first_block = 0;  // position in the restored prefix
    uint32_t count = 0;
    uint64_t slot_stride = 0;
    uint64_t layer_stride = 0;
    uint64_t land = 0;         // where the run lands in a window slot
    bool fixup = false;        // landed bytes need moving into place
    std::shared_ptr<const Codec> codec;  // coded extent: src is its layer-0 region start
    uint32_t params_bytes = 0;     // coded: the codec's parameter bytes in each header
    bool readmit = false;          // copied into its extent's DRAM copy as it lands (a source that readmits)
    // Read straight into device memory by the DeviceLanding's file reads
    // (cuFile) in some layer: checked there (Checksums), never readmitted
    // (its bytes are not in host memory).
    bool device_reads = false;
    // Coded, its codec decoded by the DeviceLanding (Decodes): its checked
    // encoded slices are decoded straight into the device destinations.
    bool device_decode = false;
    uint64_t copy_src = 0;         // arena offset of (layer 0, first slot) (coded: region start) in that copy
    // Where its blocks' checksums (and coded offsets and lengths) are: its
    // SSD home's sums table (read in Begin, outside the store lock), else
    // copied from the extent's memory in the constructor.
    bool table = false;
    bool tagged = false;           // that table is the truth: its entries are checked against tags_
    uint32_t home_device = 0;
    uint64_t home_slot = 0;        // the SSD home's extent slot
    std::unique_ptr<Fetch> fetch;  // a run of a medium past the index: streamed, not pieced
  };
  struct Piece {  // one request of a layer: blocks j0..j0+n-1 of run `run`
    size_t run;
    uint32_t j0, n;
    uint64_t stage = 0;  // coded SSD: where its encoded bytes land in a window slot
  };
  struct LayerState {
    uint32_t pending = 0;
    uint32_t bad = UINT32_MAX;  // first failed block in this layer
    bool issued = false, ready = false, released = false;
  };

  // Plans where raw runs land and coded SSD pieces stage in a window slot;
  // returns the slot's bytes.
  uint64_t PlanLanding(bool layer_area);
  // Whether run `r` of `layer` goes straight to the caller's destinations.
  bool Direct(uint32_t layer, size_t r) const { return !direct_.empty() && direct_[layer * runs_.size() + r]; }
  std::byte* Dst(uint32_t layer, uint32_t block) const { return dst_[uint64_t{layer} * hit_ + block]; }
  // Whether `layer` may be issued now: its window slot is free and, with
  // ramp_, layer 0 has landed (or it is layer 0).
  bool Issuable(uint32_t layer) const FLATKV_REQUIRES(mu_);
  // Whether a layer not issued yet will be without the consumer releasing one.
  bool WillIssue(uint32_t layer) const FLATKV_REQUIRES(mu_);
  // With span_ > 1: layers 1.. are read span_ at a time, one request each
  // (layer 0 alone); the first and one-past-last layer of `layer`'s span.
  uint32_t SpanBegin(uint32_t layer) const { return layer == 0 ? 0 : 1 + (layer - 1) / span_ * span_; }
  uint32_t SpanEnd(uint32_t layer) const { return layer == 0 ? 1 : std::min(layers_, SpanBegin(layer) + span_); }
  // Picks span_ (Begin): more than 1 only where one request can read
  // several whole layers straight into place.
  uint32_t PlanSpan() const;
  // Marks every issuable layer issued and counts its units; returns them.
  // When it returns any, pumping_ counts this call until SubmitArmed.
  std::vector<uint32_t> ArmLocked() FLATKV_REQUIRES(mu_);
  // Issues the layers ArmLocked returned, then ends that call's pumping_.
  void SubmitArmed(const std::vector<uint32_t>& armed) FLATKV_EXCLUDES(mu_);
  void Pump() FLATKV_EXCLUDES(mu_);  // ArmLocked, then SubmitArmed
  void Issue(uint32_t layer);  // an armed layer's requests; without mu_ held
  void IssueSpan(uint32_t layer);  // span_ > 1: the request of the span `layer` begins
  // A span's request landed: checks and settles each of its layers.
  void CompleteSpan(uint32_t first, const Run& r, std::vector<const std::byte*> where, Status status);
  void IssueCoded(uint32_t layer, const Piece& p, std::byte* slot);
  // `where[j]` is where block j0 + j of the run now is.
  void Complete(uint32_t layer, const Run& run, uint32_t j0, std::vector<const std::byte*> where, Status status);
  // Checksums blocks j0.. of `r` that landed at `where` (with `verify`), copies the good ones into a readmitted run's DRAM copy,
  // and settles one pending unit of `layer`.
  // With `sums`, the blocks' checksums were computed where they landed (device memory).
  void VerifyBlocks(uint32_t layer, const Run& r, uint32_t j0, std::span<const std::byte* const> where, bool verify,
                    const uint64_t* sums = nullptr);
  void FinalizeLayer(uint32_t layer) FLATKV_REQUIRES(mu_);
  // Coded runs: the aligned byte range [*begin, *end) of the region of
  // `layer` holding blocks j0..j0+n-1 of `r`, relative to r.src + layer * layer_stride.
  void CodedSpan(const Run& r, uint32_t layer, uint32_t j0, uint32_t n, uint64_t align, uint64_t* begin,
                 uint64_t* end) const;
  // Splits n blocks, one pending unit of `layer`, into jobs of at most
  // `job_bytes` (a pending unit each) and runs job(first, count) for each on
  // the decode queue; `first` counts from 0.
  void SubmitJobs(uint32_t layer, uint32_t n, uint64_t job_bytes, const std::function<void(uint32_t, uint32_t)>& job);
  // Issues decode jobs for blocks j0..j0+n-1 of `r` whose encoded region
  // bytes from `region_begin` on are at `bytes`.
  void SubmitDecodes(uint32_t layer, const Run& r, uint32_t j0, uint32_t n, const std::byte* bytes, uint64_t region_begin,
                     bool verify);
  // Verifies and decodes, then settles one pending unit of `layer`.
  void DecodeBlocks(uint32_t layer, const Run& r, uint32_t j0, uint32_t n, const std::byte* bytes, uint64_t region_begin,
                    bool verify);
  // Marks `layer` bad from block `bad` on; `corrupt` leave the index at Finish.
  void Settle(uint32_t layer, uint32_t bad, const std::vector<BlockRef>& corrupt);
  // The blocks j0..j0+n-1 of `r`: what a failed read leaves unreadable.
  static std::vector<BlockRef> ReadBlocks(const Run& r, uint32_t j0, uint32_t n);
  // Copies blocks j0..j0+n-1 of readmitted run `r` of `layer` into the DRAM copy.
  void CopyRaw(uint32_t layer, const Run& r, uint32_t j0, std::span<const std::byte* const> where, uint32_t good);
  void CopyCoded(uint32_t layer, const Run& r, uint32_t j0, uint32_t n, const std::byte* bytes, uint64_t region_begin);
  std::byte* Home(uint32_t layer, uint32_t block);  // where a block decoded on the host goes
  bool AllSettled() FLATKV_REQUIRES(mu_);  // no request in flight
  // Streams (runs of media past the index). Each has a sink the fetch
  // calls from its medium's thread.
  class Stream;
  struct StreamState {
    size_t run = 0;
    bool running = false;  // its fetch may still touch this restore
    bool done = false;     // the fetch settled all it will
    uint32_t end = 0;      // with done: the end of its valid prefix
    uint32_t next = 0;     // the first layer whose unit of it is not settled
  };
  // Appends the run `fetch` found (Begin, before planning).
  void AttachStream(Source* source, std::unique_ptr<Fetch> fetch);
  std::byte* StreamLanding(size_t stream, uint32_t layer, uint32_t block) FLATKV_EXCLUDES(mu_);
  bool StreamSettleThrough(size_t stream, uint32_t layer, uint32_t valid) FLATKV_EXCLUDES(mu_);
  // Settles the stream's unit of the issued layers from its `next` on, bad
  // from `end` when short of hit_; marks it done.
  void EndStream(size_t stream, uint32_t end) FLATKV_REQUIRES(mu_);
  // Settles the stream's unit of `layer` (issued), bad from `end` if short.
  void SettleStream(uint32_t layer, uint32_t end) FLATKV_REQUIRES(mu_);
  bool AnyStreamRunning() const FLATKV_REQUIRES(mu_);

  StoreImpl* store_;
  uint32_t layers_;
  uint64_t lb_;  // block_layer_bytes
  uint32_t hit_ = 0;
  std::vector<BlockLocation> locations_;
  std::vector<Run> runs_;
  std::vector<Piece> pieces_;        // the requests every layer makes
  // Reads the runs' sums tables into checksums_/enc_off_/enc_len_ and
  // checks coded slices lie in order within their layer region; the first
  // block failing that (a torn or corrupt table) and all later ones miss.
  void LoadSums();
  // Cuts the restored prefix to its first `blocks` blocks.
  void Truncate(uint32_t blocks);
  // Block j of run r has a damaged sums entry (`why`): it leaves the index
  // (as a checksum mismatch), and it and the rest of the chain miss.
  void BadSums(const Run& r, uint32_t j, const std::string& why);
  std::vector<uint64_t> checksums_;  // [block * layers + layer]
  std::vector<uint32_t> enc_off_, enc_len_;  // coded blocks: [block * layers + layer]
  std::vector<uint32_t> tags_;       // [block]: tagged runs' sums tags (Extent::tags), taken under the store lock
  bool any_coded_ = false;
  std::vector<uint64_t> pinned_;
  uint64_t max_request_;
  Clock::time_point start_;
  RestoreTarget target_;
  std::vector<std::byte*> dst_;    // [layer * hit + block]: the caller's destinations (target mode)
  std::vector<uint8_t> direct_;    // [layer * runs + run]: delivered without the window
  uint32_t slots_ = 1;             // window slots: layers issued and not yet released (or landed), at most
  uint32_t span_ = 1;              // layers per request (PlanSpan)
  std::unique_ptr<HostWindow> window_;  // null when nothing lands in it

  Mutex mu_;
  CondVar cv_;
  std::vector<LayerState> state_ FLATKV_GUARDED_BY(mu_);
  uint32_t valid_ FLATKV_GUARDED_BY(mu_) = 0;  // blocks valid in every finalized layer
  uint32_t layers_ready_ FLATKV_GUARDED_BY(mu_) = 0;
  std::vector<BlockRef> corrupt_ FLATKV_GUARDED_BY(mu_);

  // The streamed runs (media past the index).
  std::vector<BlockKey> chain_;  // the chain, kept when the store has media past the index
  std::vector<std::unique_ptr<Stream>> sinks_;
  std::vector<StreamState> streams_ FLATKV_GUARDED_BY(mu_);
  bool abandoned_ FLATKV_GUARDED_BY(mu_) = false;       // the destructor runs: layers not issued never will be
  // Set in Begin. eager_: no streams, so a layer's landing (Settle) issues
  // what it frees: for a restore into destinations its own slot, at once.
  // ramp_: eager, the window binds and a device is read: layer 0 goes alone.
  bool eager_ FLATKV_GUARDED_BY(mu_) = false;
  bool ramp_ FLATKV_GUARDED_BY(mu_) = false;
  uint32_t pumping_ FLATKV_GUARDED_BY(mu_) = 0;  // armed layers still being issued by some thread
  // ArmLocked's bounds: every layer before unissued_ is issued; none from
  // reach_ on can be issuable yet (a window's length past the last issued
  // layer; Begin starts it at slots_).
  uint32_t unissued_ FLATKV_GUARDED_BY(mu_) = 0;
  uint32_t reach_ FLATKV_GUARDED_BY(mu_) = 0;
};

}  // namespace flatkv
