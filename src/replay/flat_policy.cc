#include "replay/flat_policy.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>
#include <unordered_map>
#include <vector>

#include "flatkv/placement.h"
#include "flatkv/store.h"

namespace flatkv::replay {
namespace {

using Clock = std::chrono::steady_clock;

// In kModel one store block is one 4 KiB layer slice: 1 layer, 1 KV head,
// head_dim 16, bf16 at 64 tokens (the head_dim is adjusted for other block
// sizes). 4 KiB is the smallest slice the SSD tier stores without padding,
// so read amplification is the real store's, not an artefact of the scale.
constexpr uint64_t kSliceBytes = 4096;
// Blocks per extent on both media: one session's run, restored as one
// request per layer.
constexpr uint64_t kExtentBlocks = 16;
// flat-hints: the gaps a conversation's retain ttl is predicted from, and
// the margin over their median; the share of DRAM that prefetched copies
// not yet restored may take.
constexpr size_t kGapHistory = 4;
constexpr double kGapMargin = 1.25;
constexpr uint64_t kPrefetchDramDivisor = 4;

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb3fe1a85ec53ull;
  return x ^ (x >> 33);
}

BlockKey KeyOf(uint64_t id) { return BlockKey{id, Mix(id) | 1}; }

// The store shape: `layers` layers of `slice` bytes per block at
// `block_tokens` tokens (Mha, 1 KV head, bf16: 4 bytes per token and
// head_dim unit).
KvShape ScaledShape(uint32_t layers, uint64_t slice, uint32_t block_tokens) {
  return KvShape::Mha(layers, 1, static_cast<uint32_t>(slice / (4ull * block_tokens)), DType::kBF16);
}

class FlatPolicy final : public CachePolicy {
 public:
  FlatPolicy(const PolicyConfig& c, FlatHints hints, FlatWindow window) : config_(c), hints_(hints), window_(window) {}
  ~FlatPolicy() override {
    if (store_) (void)store_->Close();
    store_.reset();
    std::error_code ec;
    if (!ssd_dir_.empty()) std::filesystem::remove_all(ssd_dir_, ec);
  }

  Status Open() {
    const PolicyConfig& c = config_;
    if (c.block_bytes == 0 || c.block_tokens == 0) return Status::InvalidArgument("flat: block_bytes and block_tokens are required");
    if (c.block_tokens < 16 || c.block_tokens > 512)
      return Status::InvalidArgument("flat: block_tokens=" + std::to_string(c.block_tokens) + " (the store takes 16..512)");
    if (c.dir.empty()) return Status::InvalidArgument("flat: a scratch directory (PolicyConfig::dir) is required");
    uint32_t layers = 1;
    uint64_t slice = kSliceBytes;
    if (c.io == IoMode::kReal) {
      if (!(c.scale >= 1.0)) return Status::InvalidArgument("flat: scale must be >= 1");
      const uint64_t target = static_cast<uint64_t>(double(c.block_bytes) / c.scale);
      // Layer slices of at least 64 KiB, so per-layer requests stay large
      // as in the unscaled store (Llama-3.1-70B: 256 KiB per layer slice).
      layers = static_cast<uint32_t>(std::clamp<uint64_t>(target / (64 << 10), 1, 128));
      slice = std::max<uint64_t>(kSliceBytes, target / layers / kSliceBytes * kSliceBytes);
    }
    store_block_bytes_ = uint64_t{layers} * slice;
    // Capacities keep their ratio to one block: the scaled store holds the
    // same number of blocks (and extents) as the real one would.
    const double factor = double(c.block_bytes) / double(store_block_bytes_);
    const uint64_t extent_bytes = kExtentBlocks * store_block_bytes_;
    const uint64_t dram = static_cast<uint64_t>(double(c.dram_bytes) / factor);
    const uint64_t ssd = static_cast<uint64_t>(double(c.ssd_bytes) / factor) / extent_bytes * extent_bytes;

    StoreOptions o;
    o.shape = ScaledShape(layers, slice, c.block_tokens);
    o.block_tokens = c.block_tokens;
    o.dram_capacity_bytes = dram;
    o.dram_extent_layer_bytes = kExtentBlocks * slice;
    o.ssd_extent_layer_bytes = kExtentBlocks * slice;
    // Placement, the session's DRAM share, readmission and SSD admission
    // are the store's defaults, as the daemon would run them.
    o.clock = [this] {
      return Clock::time_point{} + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(now_s_));
    };
    if (ssd >= extent_bytes) {
      ssd_dir_ = c.dir + "/flat-ssd";
      std::error_code ec;
      std::filesystem::remove_all(ssd_dir_, ec);
      std::filesystem::create_directories(ssd_dir_, ec);
      if (ec) return Status::IoError("flat: cannot create " + ssd_dir_ + ": " + ec.message());
      o.ssd_dirs = {ssd_dir_};
      o.ssd_capacity_bytes = ssd;
      const uint64_t per_segment = std::clamp<uint64_t>((256ull << 20) / extent_bytes, 1, ssd / extent_bytes);
      o.segment_bytes = per_segment * extent_bytes;
      // kModel reads 4 KiB slices many times over: let the page cache serve
      // them (times come from the IoModel, not from this disk).
      o.use_direct_io = c.io == IoMode::kReal;
    }
    if (dram == 0 && o.ssd_dirs.empty()) return Status::InvalidArgument("flat: both capacities are below one block");
    auto store = Store::Open(o);
    if (!store.ok()) return store.status().WithContext("flat: opening the replay store");
    store_ = std::move(store).value();
    store_dram_bytes_ = dram;
    return Status::Ok();
  }

  std::string_view name() const override {
    if (hints_ == FlatHints::kAgent) return "flat-hints";
    return window_ == FlatWindow::kGpu ? "flat-gpu-window" : "flat";
  }
  bool layerwise() const override { return true; }      // Restore hands over layer by layer
  bool ssd_layerwise() const override { return true; }  // extents are layer-major: one read per layer
  uint32_t dram_copy_threads() const override {
    if (window_ == FlatWindow::kGpu) return 0;
    return config_.dram_copy_threads ? config_.dram_copy_threads : StoreOptions{}.dram_threads;  // the DramQueue's workers
  }

  LookupResult Lookup(const Request& req, uint32_t /*instance*/, double now_s) override {
    now_s_ = now_s;
    LookupResult out;
    if (auto it = prefetched_.find(&req); it != prefetched_.end()) {  // its prefetch is consumed now
      prefetched_bytes_ -= it->second;
      prefetched_.erase(it);
    }
    Keys(req);
    const StoreStats before = store_->Stats();
    const auto t0 = Clock::now();
    auto restore = store_->StartRestore(keys_);
    if (!restore.ok()) return out;  // an unusable restore is a miss
    Restore& r = *restore.value();
    const uint32_t found = r.hit_blocks();
    const uint32_t valid = r.Finish();
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const auto locations = r.locations();
    uint64_t prev_end = 0;
    Medium prev = Medium::kNone;
    for (uint32_t i = 0; i < valid; ++i) {
      const Address a = locations[i].layer0;
      const Medium m = a.medium();
      if (m == Medium::kDram) {
        out.dram_blocks++;
        // A run of consecutive slots is one transfer.
        if (prev != Medium::kDram || a.offset() != prev_end) out.dram_requests++;
        prev_end = a.offset() + store_->BlockLayerBytes();
      } else {
        out.ssd_blocks++;
      }
      prev = m;
    }
    restore.value().reset();  // `locations` points into it
    out.hit_blocks = valid;
    out.aborted_blocks = found - valid;
    const StoreStats after = store_->Stats();
    const uint64_t ssd_read = after.ssd.bytes_read - before.ssd.bytes_read;
    const uint64_t ssd_delivered = after.ssd.bytes_delivered - before.ssd.bytes_delivered;
    out.ssd_requests = static_cast<uint32_t>(after.ssd.read_requests - before.ssd.read_requests);
    // Bytes in true (unscaled) units: the store's blocks stand for
    // block_bytes each, and its amplification carries over.
    out.dram_bytes_read = uint64_t{out.dram_blocks} * config_.block_bytes;
    out.ssd_bytes_useful = uint64_t{out.ssd_blocks} * config_.block_bytes;
    const double amp = ssd_delivered ? double(ssd_read) / double(ssd_delivered) : 1.0;
    out.ssd_bytes_read = static_cast<uint64_t>(double(out.ssd_bytes_useful) * amp + 0.5);
    if (config_.io == IoMode::kReal) {
      out.dram_requests = static_cast<uint32_t>(after.dram.read_requests - before.dram.read_requests);
      out.real_restore_s = seconds;
    }
    return out;
  }

  InsertResult Insert(const Request& req, uint32_t /*instance*/, uint32_t hit_blocks, double now_s) override {
    now_s_ = now_s;
    InsertResult out;
    if (hit_blocks >= req.blocks.size()) return out;
    Keys(req);
    const std::span<const BlockKey> keys(keys_.data() + hit_blocks, keys_.size() - hit_blocks);
    const uint64_t need = keys.size() * store_->BlockBytes();
    if (payload_.size() < need) payload_.resize(need, std::byte{0x42});
    const StoreStats before = store_->Stats();
    const auto t0 = Clock::now();
    const Status s = store_->Put(req.conversation, keys, std::span<const std::byte>(payload_.data(), need));
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    (void)s;  // a failed put leaves its blocks misses, which the next lookup sees
    const StoreStats after = store_->Stats();
    const uint64_t dram_written = after.dram.bytes_written - before.dram.bytes_written;
    const uint64_t ssd_written = after.ssd.bytes_written - before.ssd.bytes_written;
    const double unscale = double(config_.block_bytes) / double(store_->BlockBytes());
    out.dram_bytes_written = static_cast<uint64_t>(double(dram_written) * unscale);
    out.ssd_bytes_written = static_cast<uint64_t>(double(ssd_written) * unscale);
    // About one write per run of new SSD blocks within an extent.
    const uint64_t ssd_blocks = ssd_written / store_->BlockBytes();
    out.ssd_requests = static_cast<uint32_t>((ssd_blocks + kExtentBlocks - 1) / kExtentBlocks);
    if (config_.io == IoMode::kReal) out.real_write_s = seconds;
    if (hints_ == FlatHints::kAgent) {
      Conversation& c = conversations_[req.conversation];
      c.last_put_s = now_s;
      if (!c.gaps.empty()) {
        std::vector<double> g = c.gaps;
        std::nth_element(g.begin(), g.begin() + static_cast<std::ptrdiff_t>(g.size() / 2), g.end());
        const double gap = g[g.size() / 2] * kGapMargin;  // the median (the upper one of an even count)
        (void)store_->Retain(keys_, std::chrono::milliseconds(static_cast<int64_t>(std::ceil(gap * 1e3))));
      }
    }
    return out;
  }

  ArriveResult Arrive(const Request& req, uint32_t /*instance*/, double now_s, uint32_t waiting_ahead) override {
    ArriveResult out;
    if (hints_ != FlatHints::kAgent) return out;
    now_s_ = now_s;
    Conversation& c = conversations_[req.conversation];
    if (c.last_put_s >= 0) {
      if (c.gaps.size() == kGapHistory) c.gaps.erase(c.gaps.begin());
      c.gaps.push_back(std::max(0.0, now_s - c.last_put_s));
    }
    // Admitted at once, the request streams its restore by layer under its
    // own prefill; a prefetch would only put a whole read in front of it.
    // And copies prefetched for queued requests must not crowd each other
    // (or the sessions writing now) out of DRAM before they are restored.
    if (waiting_ahead == 0 || prefetched_bytes_ >= store_dram_bytes_ / kPrefetchDramDivisor) return out;
    Keys(req);
    const StoreStats before = store_->Stats();
    if (!store_->Prefetch(keys_).ok()) return out;
    // The prefetch reads on the store's thread; this replay charges its
    // bytes to the simulated SSD, so it waits for them (bounded: a stuck
    // read leaves the figures of what finished).
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    StoreStats after = store_->Stats();
    while (after.prefetches_done < after.prefetches && Clock::now() < deadline) {
      std::this_thread::yield();
      after = store_->Stats();
    }
    const double unscale = double(config_.block_bytes) / double(store_->BlockBytes());
    const uint64_t copied_blocks = after.readmitted_blocks - before.readmitted_blocks;
    out.ssd_bytes_read = static_cast<uint64_t>(double(after.ssd.bytes_read - before.ssd.bytes_read) * unscale);
    out.dram_bytes_written = copied_blocks * config_.block_bytes;
    out.ssd_requests = static_cast<uint32_t>(after.ssd.read_requests - before.ssd.read_requests);
    if (copied_blocks > 0) {
      prefetched_[&req] += copied_blocks * store_->BlockBytes();
      prefetched_bytes_ += copied_blocks * store_->BlockBytes();
    }
    return out;
  }

  PolicyStats Stats() const override {
    const StoreStats s = store_->Stats();
    const double unscale = double(config_.block_bytes) / double(store_->BlockBytes());
    PolicyStats p;
    p.dram_used_bytes = static_cast<uint64_t>(double(s.dram.used_bytes) * unscale);
    p.ssd_used_bytes = static_cast<uint64_t>(double(s.ssd.used_bytes) * unscale);
    p.evicted_blocks = s.dram.evicted_blocks + s.ssd.evicted_blocks;
    p.migrated_blocks = 0;  // flat never migrates
    return p;
  }

 private:
  void Keys(const Request& req) {
    keys_.resize(req.blocks.size());
    for (size_t i = 0; i < req.blocks.size(); ++i) keys_[i] = KeyOf(req.blocks[i]);
  }

  struct Conversation {
    double last_put_s = -1;    // its last turn's put (simulated)
    std::vector<double> gaps;  // its last kGapHistory gaps, put to next arrival
  };

  PolicyConfig config_;
  FlatHints hints_;
  FlatWindow window_;
  std::unordered_map<uint64_t, Conversation> conversations_;
  // Store bytes of DRAM copies prefetched for requests not yet looked up.
  std::unordered_map<const Request*, uint64_t> prefetched_;
  uint64_t prefetched_bytes_ = 0;
  uint64_t store_dram_bytes_ = 0;
  std::string ssd_dir_;
  std::unique_ptr<Store> store_;
  uint64_t store_block_bytes_ = 0;
  double now_s_ = 0;  // simulated time, read by the store's clock
  std::vector<BlockKey> keys_;
  std::vector<std::byte> payload_;
};

}  // namespace

Result<std::unique_ptr<CachePolicy>> MakeFlatPolicy(const PolicyConfig& config, FlatHints hints, FlatWindow window) {
  auto p = std::make_unique<FlatPolicy>(config, hints, window);
  FLATKV_RETURN_IF_ERROR(p->Open());
  return std::unique_ptr<CachePolicy>(std::move(p));
}

}  // namespace flatkv::replay
