#include "service/remote_store.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace flatkv::service {
namespace {

// A restore already complete: per layer, its valid count and (without a
// target, or with one delivered layer by layer: `deliver`) its bytes.
class DoneRestore final : public flatkv::Restore {
 public:
  DoneRestore(uint32_t hit, uint32_t valid, std::vector<uint32_t> layer_valid, std::vector<std::vector<std::byte>> layers,
              RestoreTarget deliver, uint64_t lb)
      : hit_(hit), valid_(valid), layer_valid_(std::move(layer_valid)), layers_(std::move(layers)), locations_(hit),
        deliver_(std::move(deliver)), lb_(lb) {}
  uint32_t hit_blocks() const override { return hit_; }
  std::span<const BlockLocation> locations() const override { return locations_; }
  Result<LayerView> WaitLayer(uint32_t layer) override {
    if (layer >= layer_valid_.size()) {
      return Status::InvalidArgument("restore: layer " + std::to_string(layer) + " of " + std::to_string(layer_valid_.size()));
    }
    LayerView v;
    v.layer = layer;
    v.blocks = layer_valid_[layer];
    if (deliver_.destination) {
      Deliver(layer);  // once; nothing after a release
      v.blocks = layer_valid_[layer];
    } else if (!layers_.empty()) {
      v.data = layers_[layer];
    }
    return v;
  }
  void ReleaseLayer(uint32_t layer) override {
    if (layer < layers_.size()) layers_[layer] = {};
  }
  uint32_t Finish() override {
    for (uint32_t l = 0; deliver_.destination && l < layers_.size(); ++l) Deliver(l);
    return valid_;
  }

 private:
  // Writes `layer`'s kept bytes to its destinations (once): into device
  // memory one copy per stretch of adjacent destinations; a failed copy cuts
  // the valid prefix there.
  void Deliver(uint32_t layer) {
    std::vector<std::byte>& data = layers_[layer];
    const uint32_t n = layer_valid_[layer];
    for (uint32_t b = 0; b < n && !data.empty();) {
      std::byte* to = deliver_.destination(layer, b);
      uint32_t e = b + 1;
      if (to == nullptr) {  // nowhere to land (the caller could not allocate it): a miss from here
        layer_valid_[layer] = b;
        valid_ = std::min(valid_, b);
        break;
      }
      if (deliver_.device) {
        while (e < n && deliver_.destination(layer, e) == to + uint64_t{e - b} * lb_) ++e;
        if (!deliver_.device->Copy(to, data.data() + uint64_t{b} * lb_, uint64_t{e - b} * lb_).ok()) {
          layer_valid_[layer] = b;
          valid_ = std::min(valid_, b);
          break;
        }
      } else {
        std::memcpy(to, data.data() + uint64_t{b} * lb_, lb_);
      }
      b = e;
    }
    data = {};
  }

  uint32_t hit_, valid_;
  std::vector<uint32_t> layer_valid_;
  std::vector<std::vector<std::byte>> layers_;
  std::vector<BlockLocation> locations_;
  RestoreTarget deliver_;
  uint64_t lb_;
};

}  // namespace

RemoteStore::RemoteStore(std::unique_ptr<Client> client) : client_(std::move(client)) {
  options_.shape = client_->info().shape;
  options_.block_tokens = client_->info().block_tokens;
  options_.dram_capacity_bytes = 0;
}

static_assert(Client::kNoPosition == PutOptions::kUnknownBlock);

Status RemoteStore::Put(SessionId session, std::span<const BlockKey> keys, std::span<const std::byte> data,
                        const PutOptions& options) {
  if (closed_) return Status::FailedPrecondition("remote store: closed");
  return client_->Put(session, keys, data, options.hint, options.first_block);
}

uint32_t RemoteStore::Match(std::span<const BlockKey> chain) const {
  if (closed_) return 0;
  auto hit = client_->Lookup(chain);
  return hit.ok() ? *hit : 0;  // an unreachable daemon is a miss
}

Result<std::unique_ptr<flatkv::Restore>> RemoteStore::StartRestore(std::span<const BlockKey> chain, const RestoreTarget& target) {
  if (closed_) return Status::FailedPrecondition("remote store: closed");
  const uint32_t layers = options_.shape.layers;
  const uint64_t lb = BlockLayerBytes();
  std::vector<uint32_t> layer_valid(layers, 0);
  FLATKV_RETURN_IF_ERROR(target.Check());
  // Into device memory, or destinations reused every few layers, a layer is
  // written when the consumer waits for it: the daemon sends every layer at once.
  const bool deferred = target.device || target.reuse_layers > 0;
  std::vector<std::vector<std::byte>> kept;
  if (!target.destination || deferred) kept.resize(layers);
  auto r = client_->RestoreLayers(chain, [&](uint32_t layer, uint32_t blocks, std::span<const std::byte> data) {
    layer_valid[layer] = blocks;
    if (target.destination && !deferred) {
      for (uint32_t b = 0; b < blocks; ++b) std::memcpy(target.destination(layer, b), data.data() + uint64_t{b} * lb, lb);
    } else {
      kept[layer].assign(data.begin(), data.end());
    }
    return Status::Ok();
  });
  if (!r.ok()) return r.status();
  return std::unique_ptr<flatkv::Restore>(new DoneRestore(r->hit_blocks, r->valid_blocks, std::move(layer_valid), std::move(kept),
                                                          deferred ? target : RestoreTarget{}, lb));
}

Status RemoteStore::DropSession(SessionId session) { return client_->DropSession(session); }

Result<uint32_t> RemoteStore::TruncateSession(SessionId session, uint32_t keep_blocks) {
  return client_->TruncateSession(session, keep_blocks);
}

Result<uint32_t> RemoteStore::Retain(std::span<const BlockKey> chain, std::chrono::milliseconds ttl) {
  return client_->Retain(chain, ttl);
}
Result<PruneResult> RemoteStore::Prune(std::span<const BlockKey> chain, std::span<const TokenRange> ranges,
                                       const PutOptions& options) {
  return client_->Prune(chain, ranges, options.hint);
}

Result<uint32_t> RemoteStore::Prefetch(std::span<const BlockKey> chain) { return client_->Prefetch(chain); }

Status RemoteStore::Close() {
  if (closed_) return Status::FailedPrecondition("remote store: already closed");
  closed_ = true;
  return Status::Ok();
}

StoreStats RemoteStore::Stats() const { return StoreStats{}; }

}  // namespace flatkv::service
