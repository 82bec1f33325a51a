#include "model/kv_cache.h"

#include <algorithm>
#include <cassert>
#include <cstdint>

namespace flatkv::model {

// block_tokens 0 is a caller bug (asserted); release builds treat it as 1 so
// that the index arithmetic never divides by zero. Pages start zeroed.
KvCache::KvCache(const Config& config, uint32_t block_tokens, uint32_t max_positions)
    : layers_(config.n_layers),
      kv_dim_(config.kv_dim()),
      block_tokens_(std::max<uint32_t>(block_tokens, 1)),
      page_floats_(2ull * block_tokens_ * static_cast<uint64_t>(std::max(kv_dim_, 0))) {
  assert(block_tokens > 0);
  const uint64_t blocks = (uint64_t{max_positions} + block_tokens_ - 1) / block_tokens_;
  // Rounded up to whole blocks, clamped to what uint32_t positions can name.
  max_positions_ = static_cast<uint32_t>(std::min<uint64_t>(blocks * block_tokens_, UINT32_MAX));
  blocks_ = blocks;
  data_ = AlignedBuffer(std::max<uint64_t>(1, blocks * static_cast<uint64_t>(std::max(layers_, 0)) * page_floats_ * sizeof(float)), 4096);
}

}  // namespace flatkv::model
