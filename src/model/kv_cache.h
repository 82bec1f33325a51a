// KvCache: one sequence's keys and values, paged in blocks of block_tokens
// positions, the unit the store keeps.
//
// Pages are stored layer-major ([layer][block][page], 4 KiB aligned), so
// one layer's pages are one contiguous range: a restore reads an SSD run
// straight into them. Page (layer l, block b) is float[2 * block_tokens * kv_dim]:
//   K rows of positions b*bt .. b*bt+bt-1, each kv_dim floats (after RoPE),
//   then V rows of the same positions.
// so one page is exactly one block's layer slice in the store
// (BlockLayerBytes() == 2 * block_tokens * kv_dim * 4), and moving KV
// between the cache and the store is one memcpy per page.
//
// Thread-safety: none; one request owns a cache.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/aligned_buffer.h"
#include "model/model.h"

namespace flatkv::model {

class KvCache {
 public:
  // Room for `max_positions` (rounded up to whole blocks).
  KvCache(const Config& config, uint32_t block_tokens, uint32_t max_positions);

  uint32_t block_tokens() const { return block_tokens_; }
  uint32_t max_positions() const { return max_positions_; }
  int kv_dim() const { return kv_dim_; }
  int layers() const { return layers_; }

  float* k(int layer, uint32_t pos) { return Page(layer, pos / block_tokens_) + (pos % block_tokens_) * uint64_t(kv_dim_); }
  float* v(int layer, uint32_t pos) {
    return Page(layer, pos / block_tokens_) + (block_tokens_ + pos % block_tokens_) * uint64_t(kv_dim_);
  }
  const float* k(int layer, uint32_t pos) const { return const_cast<KvCache*>(this)->k(layer, pos); }
  const float* v(int layer, uint32_t pos) const { return const_cast<KvCache*>(this)->v(layer, pos); }

  // One block's slice of one layer, as bytes (what the store stores).
  uint64_t page_bytes() const { return page_floats_ * sizeof(float); }
  std::span<std::byte> PageBytes(int layer, uint32_t block) {
    return {reinterpret_cast<std::byte*>(Page(layer, block)), page_bytes()};
  }

 private:
  float* Page(int layer, uint32_t block) {
    return reinterpret_cast<float*>(data_.data()) + (uint64_t(layer) * blocks_ + block) * page_floats_;
  }

  int layers_;
  int kv_dim_;
  uint32_t block_tokens_;
  uint32_t max_positions_;
  uint64_t page_floats_;
  uint64_t blocks_ = 0;
  AlignedBuffer data_;  // [layer][block][page] floats, zeroed
};

}  // namespace flatkv::model
