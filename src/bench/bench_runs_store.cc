// The flatkv runs of `flatkv bench restore`: a Store holding the session on
// one medium, restored layer by layer through the public API.
#include <algorithm>
#include <cstring>

#include "flatkv/codec.h"
#include "flatkv/options.h"
#include "flatkv/store.h"
#include "bench/bench_runs.h"

namespace flatkv::tools {
namespace {

constexpr SessionId kSession = 1;
constexpr uint32_t kPutChunkBlocks = 16;  // blocks per Put call (one serving request's worth)

uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

// Bytes of one extent whose per-layer run targets `layer_target` bytes.
uint64_t ExtentBytes(uint64_t layer_target, uint64_t block_layer_bytes, uint64_t block_bytes) {
  return std::max<uint64_t>(1, (layer_target + block_layer_bytes - 1) / block_layer_bytes) * block_bytes;
}

class StoreRun final : public RestoreRun {
 public:
  StoreRun(Medium medium, uint32_t window_layers, std::shared_ptr<const Codec> codec, uint32_t decode_threads,
           uint32_t dram_threads)
      : medium_(medium),
        window_layers_(window_layers),
        codec_(std::move(codec)),
        decode_threads_(decode_threads),
        dram_threads_(dram_threads) {}
  ~StoreRun() override { (void)Teardown(); }

  std::string_view name() const override {
    if (codec_) return medium_ == Medium::kDram ? "dram_codec_restore" : "ssd_codec_restore";
    return medium_ == Medium::kDram ? "dram_restore" : "ssd_restore";
  }
  std::span<const std::byte> Expected() const override { return expected_; }
  DestLayout layout() const override { return DestLayout::kLayerMajor; }

  Status Setup(const BenchSession& s) override {
    session_ = &s;
    restores_ = 0;
    phases_.clear();
    first_layer_s_.clear();  // this size's alone: a run's object serves every size
    StoreOptions o;
    o.shape = s.shape;
    o.block_tokens = s.block_tokens;
    o.placement = std::make_shared<FixedPlacement>(medium_);
    o.codec = codec_;
    if (decode_threads_ != 0) o.decode_threads = decode_threads_;
    decode_threads_used_ = o.decode_threads;
    if (dram_threads_ != 0) o.dram_threads = dram_threads_;
    dram_threads_used_ = o.dram_threads;
    if (window_layers_ != 0) o.window_layers = window_layers_;
    window_layers_used_ = o.window_layers;
    // Encoded blocks may exceed their raw size (headers, incompressible
    // data), up to the codec's bound.
    uint64_t total = s.bytes.size();
    if (codec_) {
      const SliceLayout layout{s.shape, s.block_tokens};
      total = std::max(total, uint64_t{s.blocks} * s.shape.layers * codec_->MaxEncodedSize(layout));
      FLATKV_RETURN_IF_ERROR(ExpectDecoded(s));
    }
    if (medium_ == Medium::kDram) {
      // Room for the session rounded up to whole extents, plus slack.
      const uint64_t extent = ExtentBytes(o.dram_extent_layer_bytes, s.block_layer_bytes, s.block_bytes);
      o.dram_capacity_bytes = RoundUp(total + 2 * extent, 2ull << 20);
      o.ssd_dirs.clear();
    } else {
      const uint64_t extent = ExtentBytes(o.ssd_extent_layer_bytes, s.block_layer_bytes, s.block_bytes);
      o.dram_capacity_bytes = 0;
      o.ssd_dirs = {s.dir + (codec_ ? "/flatkv-codec" : "/flatkv")};
      o.ssd_capacity_bytes =
          std::max(o.ssd_capacity_bytes, RoundUp(total + 2 * extent + o.segment_bytes, o.segment_bytes));
    }
    auto opened = Store::Open(o);
    if (!opened.ok()) return opened.status().WithContext(std::string(name()) + ": Store::Open");
    store_ = std::move(opened).value();
    if (store_->BlockBytes() != s.block_bytes || store_->BlockLayerBytes() != s.block_layer_bytes) {
      return Status::FailedPrecondition(std::string(name()) + ": store block size " + std::to_string(store_->BlockBytes()) +
                                        " / layer " + std::to_string(store_->BlockLayerBytes()) + ", expected " +
                                        std::to_string(s.block_bytes) + " / " + std::to_string(s.block_layer_bytes));
    }
    if (medium_ == Medium::kSsd) {
      const StoreStats st = store_->Stats();
      if (!st.ssd_direct_io) {
        return Status::FailedPrecondition(
            "ssd_restore: the store could not open its segment files with O_DIRECT in " + o.ssd_dirs[0] +
            " (stats.ssd_direct_io=false, as on tmpfs); a restore would be timed from the page cache, "
            "so the measurement is aborted. Use --dir on a disk-backed filesystem");
      }
    }
    for (uint32_t b = 0; b < s.blocks; b += kPutChunkBlocks) {
      const uint32_t n = std::min(kPutChunkBlocks, s.blocks - b);
      PutOptions po;
      po.first_block = b;
      Status st = store_->Put(kSession, std::span(s.keys).subspan(b, n), s.bytes.subspan(b * s.block_bytes, n * s.block_bytes), po);
      if (!st.ok()) return st.WithContext(std::string(name()) + ": Put of blocks " + std::to_string(b) + ".." + std::to_string(b + n));
    }
    const uint32_t matched = store_->Match(s.keys);
    if (matched != s.blocks) {
      return Status::FailedPrecondition(std::string(name()) + ": Match found " + std::to_string(matched) + " of " +
                                        std::to_string(s.blocks) + " blocks just put");
    }
    const StoreStats st = store_->Stats();
    const MediumStats& m = medium_ == Medium::kDram ? st.dram : st.ssd;
    if (m.blocks < s.blocks) {
      return Status::FailedPrecondition(std::string(name()) + ": only " + std::to_string(m.blocks) + " of " +
                                        std::to_string(s.blocks) + " blocks landed on " + std::string(MediumName(medium_)));
    }
    base_stats_ = st;
    return Status::Ok();
  }

  // A lossy codec's restore delivers its decoded bytes: compute them, untimed.
  Status ExpectDecoded(const BenchSession& s) {
    expected_.clear();
    if (codec_->Lossless()) return Status::Ok();
    expected_.resize(s.bytes.size());
    SliceLayout layout{s.shape, s.block_tokens};
    CodecContext ctx;
    std::vector<std::byte> enc;
    for (uint32_t b = 0; b < s.blocks; ++b)
      for (uint32_t l = 0; l < s.shape.layers; ++l) {
        layout.layer = l;
        layout.first_position = b * s.block_tokens;  // as Setup's Puts give it (first_block)
        enc.resize(codec_->MaxEncodedSize(layout));
        const uint64_t at = uint64_t{b} * s.block_bytes + uint64_t{l} * s.block_layer_bytes;
        auto n = codec_->Encode(ctx, layout, s.bytes.subspan(at, s.block_layer_bytes), enc);
        if (!n.ok()) return n.status().WithContext(std::string(name()) + ": encode");
        FLATKV_RETURN_IF_ERROR(DecodeSlice(ctx, layout, std::span(enc).first(*n), std::span(expected_).subspan(at, s.block_layer_bytes))
                                   .WithContext(std::string(name()) + ": decode"));
      }
    return Status::Ok();
  }

  Result<double> Run(std::span<std::byte> dst) override {
    const BenchSession& s = *session_;
    const uint64_t layer_bytes = uint64_t{s.blocks} * s.block_layer_bytes;
    const double t0 = NowSeconds();
    // Restore straight into the destination, as an engine restores into its
    // own paged KV cache: layer l, block b lands at dst + l * layer_bytes + b * block_layer_bytes.
    RestoreTarget target;
    target.destination = [&](uint32_t l, uint32_t b) { return dst.data() + l * layer_bytes + uint64_t{b} * s.block_layer_bytes; };
    auto started = store_->StartRestore(s.keys, target);
    const double t_started = NowSeconds();
    if (!started.ok()) return started.status().WithContext(std::string(name()) + ": StartRestore");
    std::unique_ptr<Restore> restore = std::move(started).value();
    if (restore->hit_blocks() != s.blocks) {
      return Status::FailedPrecondition(std::string(name()) + ": restore hit " + std::to_string(restore->hit_blocks()) +
                                        " of " + std::to_string(s.blocks) + " blocks");
    }
    double wait = 0, copy = 0, release = 0;
    for (uint32_t l = 0; l < s.shape.layers; ++l) {
      const double w0 = NowSeconds();
      auto view = restore->WaitLayer(l);
      const double w1 = NowSeconds();
      wait += w1 - w0;
      if (l == 0) first_layer_s_.push_back(w1 - t0);
      if (!view.ok()) return view.status().WithContext(std::string(name()) + ": WaitLayer(" + std::to_string(l) + ")");
      if (view->blocks != s.blocks) {
        return Status::Corruption(std::string(name()) + ": layer " + std::to_string(l) + " view holds " +
                                  std::to_string(view->blocks) + " blocks, expected " + std::to_string(s.blocks));
      }
      const double c1 = NowSeconds();  // nothing to copy: the layer is already in dst
      copy += c1 - w1;
      restore->ReleaseLayer(l);
      release += NowSeconds() - c1;
    }
    const double f0 = NowSeconds();
    const uint32_t finished = restore->Finish();
    const double t1 = NowSeconds();
    const double seconds = t1 - t0;
    if (finished != s.blocks) {
      return Status::Corruption(std::string(name()) + ": Finish() returned " + std::to_string(finished) + " of " +
                                std::to_string(s.blocks) + " blocks");
    }
    ++restores_;
    phases_.push_back({t_started - t0, wait, copy, release, t1 - f0, seconds});
    return seconds;
  }

  Status Teardown() override {
    Status st;
    if (store_ != nullptr) {
      last_stats_ = store_->Stats();
      st = store_->Close();
      store_.reset();
    }
    return st;
  }

  nlohmann::json Describe() const override {
    const StoreStats st = store_ != nullptr ? store_->Stats() : last_stats_;
    const MediumStats& m = medium_ == Medium::kDram ? st.dram : st.ssd;
    const MediumStats& base = medium_ == Medium::kDram ? base_stats_.dram : base_stats_.ssd;
    nlohmann::json j = {{"medium", std::string(MediumName(medium_))},
                        {"restores", restores_},
                        {"window_layers", window_layers_used_},
                        {"dram_threads", dram_threads_used_},
                        {"capacity_bytes", m.capacity_bytes},
                        {"hit_blocks", m.hit_blocks - base.hit_blocks},
                        {"checksum_failures", st.checksum_failures},
                        {"io_errors", st.io_errors},
                        {"restore_p50_us", st.restore_p50_us},
                        {"time_share", PhaseShares()}};
    if (!first_layer_s_.empty()) j["first_layer_ms"] = Summarize(first_layer_s_).median * 1e3;  // StartRestore to WaitLayer(0)
    j["first_layer_samples"] = first_layer_s_.size();
    j["stored_bytes"] = m.stored_bytes;
    j["logical_bytes"] = m.logical_bytes;
    j["compression_ratio"] = m.stored_bytes ? double(m.logical_bytes) / double(m.stored_bytes) : 0.0;
    j["bytes_read_per_restore"] = restores_ ? double(m.bytes_read - base.bytes_read) / double(restores_) : 0.0;
    if (codec_) {
      j["codec"] = codec_->Spec();
      j["decode_threads"] = decode_threads_used_;
      j["decode_failures"] = st.decode_failures;
    }
    if (medium_ == Medium::kSsd) {
      j["ssd_direct_io"] = st.ssd_direct_io;
      j["ssd_engine"] = st.ssd_engine;
      j["read_amplification"] = st.ssd_read_amplification();
      j["read_requests_per_restore"] = restores_ ? double(m.read_requests - base.read_requests) / double(restores_) : 0.0;
      j["max_queue_depth"] = m.max_queue_depth;
    }
    return j;
  }

 private:
  const Medium medium_;
  const uint32_t window_layers_;  // 0: the StoreOptions default
  const std::shared_ptr<const Codec> codec_;  // null: raw
  std::vector<std::byte> expected_;           // a lossy codec's decoded session; empty otherwise
  const uint32_t decode_threads_;             // 0: the StoreOptions default
  const uint32_t dram_threads_;               // 0: the StoreOptions default
  uint32_t decode_threads_used_ = 0;
  uint32_t dram_threads_used_ = 0;
  uint32_t window_layers_used_ = 0;
  const BenchSession* session_ = nullptr;
  std::unique_ptr<Store> store_;
  StoreStats base_stats_;          // after Setup's Puts
  StoreStats last_stats_;          // taken at Teardown, for Describe after it
  uint64_t restores_ = 0;
  std::vector<double> first_layer_s_;  // per timed restore
  // Where the consumer's time went in one timed restore.
  struct Phases {
    double start, wait, copy, release, finish, total;
  };

  // The phases of the median restore (by total time), as shares of it: the
  // first restore of a size also allocates the store's window, so sums mislead.
  nlohmann::json PhaseShares() const {
    if (phases_.empty()) return nlohmann::json::object();
    std::vector<Phases> sorted = phases_;
    std::sort(sorted.begin(), sorted.end(), [](const Phases& a, const Phases& b) { return a.total < b.total; });
    const Phases& p = sorted[sorted.size() / 2];
    const double t = std::max(p.total, 1e-12);
    return {{"start_restore", p.start / t}, {"wait_layer", p.wait / t}, {"copy_view", p.copy / t},
            {"release_layer", p.release / t}, {"finish", p.finish / t}, {"of_seconds", p.total}};
  }

  std::vector<Phases> phases_;  // one per timed restore
};

}  // namespace

std::unique_ptr<RestoreRun> MakeStoreRun(Medium medium, uint32_t window_layers, std::shared_ptr<const Codec> codec,
                                         uint32_t decode_threads, uint32_t dram_threads) {
  return std::make_unique<StoreRun>(medium, window_layers, std::move(codec), decode_threads, dram_threads);
}

}  // namespace flatkv::tools
