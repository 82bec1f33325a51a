#include "crashtest/crashtest_target.h"

#include <cstring>

#include "service/client.h"
#include "crashtest/crashtest_state.h"

namespace flatkv::tools::crashtest {
namespace {

// Blocks looked up per verification restore: a miss ends a batch early and
// the next batch starts after the missing block.
constexpr size_t kVerifyBatch = 32;

class ClientTarget final : public Target {
 public:
  explicit ClientTarget(std::unique_ptr<service::Client> c) : client_(std::move(c)) {}
  Status Put(uint64_t session, std::span<const BlockKey> keys, std::span<const std::byte> data, uint32_t) override {
    return client_->Put(session, keys, data);
  }
  Result<uint32_t> Restore(std::span<const BlockKey> keys, std::vector<std::byte>* out) override {
    out->assign(keys.size() * BlockBytes(), std::byte{0});
    FLATKV_ASSIGN_OR_RETURN(auto r, client_->Restore(keys, *out));
    out->resize(uint64_t{r.valid_blocks} * BlockBytes());
    return r.valid_blocks;
  }
  Status Drop(uint64_t) override { return Status::NotSupported("the daemon's wire protocol has no DropSession"); }
  uint64_t BlockBytes() const override { return client_->info().block_bytes; }

 private:
  std::unique_ptr<service::Client> client_;
};

}  // namespace

StoreOptions MakeStoreOptions(const std::string& dir, uint64_t dram_bytes, uint64_t ssd_bytes, SsdAdmission admission) {
  StoreOptions o;
  o.shape = Shape();
  o.block_tokens = kBlockTokens;
  o.dram_capacity_bytes = dram_bytes;
  o.ssd_dirs = {dir + "/store"};
  o.ssd_capacity_bytes = ssd_bytes;
  o.segment_bytes = kSegmentBytes;
  o.window_bytes = 8ull << 20;
  o.ssd_admission = admission;
  return o;
}

Status StoreTarget::Put(uint64_t session, std::span<const BlockKey> keys, std::span<const std::byte> data,
                        uint32_t first_block) {
  PutOptions po;
  po.first_block = first_block;
  return store_->Put(session, keys, data, po);
}

Result<uint32_t> StoreTarget::Restore(std::span<const BlockKey> keys, std::vector<std::byte>* out) {
  FLATKV_ASSIGN_OR_RETURN(auto restore, store_->StartRestore(keys));
  const uint32_t layers = store_->options().shape.layers;
  const uint64_t lb = store_->BlockLayerBytes(), bb = store_->BlockBytes();
  out->assign(uint64_t{restore->hit_blocks()} * bb, std::byte{0});
  for (uint32_t l = 0; l < layers; ++l) {
    auto view = restore->WaitLayer(l);
    if (!view.ok()) {
      restore->Finish();
      return view.status().WithContext("restore: layer " + std::to_string(l));
    }
    for (uint32_t b = 0; b < view->blocks; ++b) std::memcpy(out->data() + b * bb + l * lb, view->data.data() + b * lb, lb);
    restore->ReleaseLayer(l);
  }
  const uint32_t valid = restore->Finish();
  out->resize(uint64_t{valid} * bb);
  return valid;
}

Result<std::unique_ptr<Target>> ConnectClientTarget(const std::string& address) {
  service::ClientOptions o;
  o.client_name = "flatkv-crashtest";
  o.deadline = std::chrono::milliseconds(20000);
  FLATKV_ASSIGN_OR_RETURN(auto c, service::Client::Connect(address, o));
  if (c->info().block_bytes != Shape().BytesPerTokenLayer() * kBlockTokens * Shape().layers) {
    return Status::InvalidArgument("daemon at " + address + " stores blocks of " + std::to_string(c->info().block_bytes) +
                                   " bytes, not the crashtest shape's");
  }
  return std::unique_ptr<Target>(new ClientTarget(std::move(c)));
}

VerifyCounts Verify(Target& target, const std::vector<BlockExpectation>& blocks) {
  VerifyCounts c;
  const uint64_t bb = target.BlockBytes();
  std::vector<BlockKey> keys;
  std::vector<std::byte> got;
  auto note = [&](const char* what, const BlockKey& k) {
    if (c.examples.size() < 8) c.examples.push_back(std::string(what) + " " + k.ToHex());
  };
  size_t i = 0;
  while (i < blocks.size()) {
    const size_t n = std::min(kVerifyBatch, blocks.size() - i);
    keys.clear();
    for (size_t j = 0; j < n; ++j) keys.push_back(blocks[i + j].key);
    auto r = target.Restore(keys, &got);
    uint32_t valid = 0;
    if (!r.ok()) {
      ++c.restore_errors;
      if (c.examples.size() < 8) c.examples.push_back("restore error: " + r.status().ToString());
    } else {
      valid = *r;
    }
    for (uint32_t j = 0; j < valid; ++j) {
      const BlockExpectation& e = blocks[i + j];
      ++c.checked;
      c.required += e.required;
      if (PayloadMatches(e.key, std::span(got.data() + j * bb, bb))) {
        ++c.served_ok;
      } else {
        ++c.wrong;
        note("wrong", e.key);
      }
    }
    if (valid < n) {  // blocks[i + valid] is a miss
      const BlockExpectation& e = blocks[i + valid];
      ++c.checked;
      c.required += e.required;
      if (e.required) {
        ++c.lost;
        c.lost_keys.push_back(e.key);
        note("lost", e.key);
      } else {
        ++c.allowed_misses;
        c.allowed_miss_keys.push_back(e.key);
      }
      i += valid + 1;
    } else {
      i += n;
    }
  }
  return c;
}

}  // namespace flatkv::tools::crashtest
