// The embedded backend: a flatkv::Store in this process.
#include <memory>

#include "capi/capi_internal.h"
#include "flatkv/remote.h"
#include "service/options_json.h"

namespace flatkv::capi {
namespace {

class EmbeddedRestore : public BackendRestore {
 public:
  explicit EmbeddedRestore(std::unique_ptr<Restore> r) : r_(std::move(r)) {}
  uint32_t hit_blocks() override { return r_->hit_blocks(); }
  Result<LayerView> WaitLayer(uint32_t layer) override { return r_->WaitLayer(layer); }
  void ReleaseLayer(uint32_t layer) override { r_->ReleaseLayer(layer); }
  Result<uint32_t> Finish() override { return r_->Finish(); }

 private:
  std::unique_ptr<Restore> r_;
};

class EmbeddedBackend : public Backend {
 public:
  explicit EmbeddedBackend(std::unique_ptr<Store> store) : store_(std::move(store)) {
    geometry_.layers = store_->options().shape.layers;
    geometry_.shape = store_->options().shape;
    geometry_.block_tokens = store_->options().block_tokens;
    geometry_.block_layer_bytes = store_->BlockLayerBytes();
    geometry_.block_bytes = store_->BlockBytes();
  }

  const Geometry& geometry() const override { return geometry_; }

  Result<uint32_t> Match(std::span<const BlockKey> keys) override { return store_->Match(keys); }

  Status Put(uint64_t session, std::span<const BlockKey> keys, std::span<const std::byte> data,
             PutHint hint) override {
    return store_->Put(session, keys, data, PutOptions{hint});
  }

  Result<std::unique_ptr<BackendRestore>> StartRestore(std::span<const BlockKey> keys, std::byte* dst,
                                                       flatkv_layout layout) override {
    RestoreTarget target;
    if (dst != nullptr) {
      const uint64_t n = keys.size();
      const Geometry g = geometry_;
      target.destination = [dst, layout, g, n](uint32_t layer, uint32_t block) {
        return Destination(dst, layout, g, n, layer, block);
      };
    }
    FLATKV_ASSIGN_OR_RETURN(auto r, store_->StartRestore(keys, target));
    return std::unique_ptr<BackendRestore>(std::make_unique<EmbeddedRestore>(std::move(r)));
  }

  Result<uint32_t> Restore(std::span<const BlockKey> keys, std::byte* dst, flatkv_layout layout) override {
    FLATKV_ASSIGN_OR_RETURN(auto r, StartRestore(keys, dst, layout));
    for (uint32_t l = 0; l < geometry_.layers && r->hit_blocks() > 0; ++l) {
      FLATKV_ASSIGN_OR_RETURN(auto view, r->WaitLayer(l));
      (void)view;
      r->ReleaseLayer(l);
    }
    return r->Finish();
  }

  Result<uint32_t> Prefetch(std::span<const BlockKey> keys) override { return store_->Prefetch(keys); }
  Status DropSession(uint64_t session) override { return store_->DropSession(session); }
  Result<uint32_t> TruncateSession(uint64_t session, uint32_t keep_blocks) override {
    return store_->TruncateSession(session, keep_blocks);
  }
  Result<uint32_t> Retain(std::span<const BlockKey> keys, std::chrono::milliseconds ttl) override {
    return store_->Retain(keys, ttl);
  }
  Result<PruneResult> Prune(std::span<const BlockKey> keys, std::span<const TokenRange> ranges, PutHint hint) override {
    PutOptions po;
    po.hint = hint;
    return store_->Prune(keys, ranges, po);
  }
  Result<StoreStats> Stats() override { return store_->Stats(); }
  Result<std::string> StatsJson() override { return store_->Stats().ToJson(); }
  Result<std::string> OptionsJson() override { return StoreOptionsToJson(store_->options()); }
  Status Close() override { return store_->Close(); }

 private:
  std::unique_ptr<Store> store_;
  Geometry geometry_;
};

}  // namespace

Result<std::unique_ptr<Backend>> OpenEmbedded(const flatkv_options& options) {
  RegisterRemoteMedium();  // the C API composes the store with every medium it links
  FLATKV_ASSIGN_OR_RETURN(auto store, Store::Open(options.store));
  return std::unique_ptr<Backend>(std::make_unique<EmbeddedBackend>(std::move(store)));
}

}  // namespace flatkv::capi
