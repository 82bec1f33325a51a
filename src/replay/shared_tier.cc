#include "replay/shared_tier.h"

namespace flatkv::replay {

uint32_t SharedTier::Match(std::span<const uint64_t> blocks, uint32_t from) const {
  uint32_t n = 0;
  for (size_t i = from; i < blocks.size(); ++i, ++n) {
    auto it = keys_.find(blocks[i]);
    if (it == keys_.end() || it->second != State::kVisible) break;
  }
  return n;
}

std::vector<uint64_t> SharedTier::Claim(std::span<const uint64_t> keys) {
  std::vector<uint64_t> out;
  for (uint64_t k : keys)
    if (keys_.emplace(k, State::kPublishing).second) out.push_back(k);
  return out;
}

uint64_t SharedTier::CountNew(std::span<const uint64_t> keys) const {
  uint64_t n = 0;
  for (uint64_t k : keys) n += keys_.count(k) == 0 ? 1 : 0;
  return n;
}

uint64_t SharedTier::Publish(uint32_t node, std::span<const uint64_t> keys) {
  std::deque<uint64_t>& mine = owned_[node];
  for (uint64_t k : keys) {
    keys_[k] = State::kVisible;
    mine.push_back(k);
    ++visible_;
  }
  uint64_t deleted = 0;
  while (capacity_blocks_ > 0 && mine.size() > capacity_blocks_) {
    keys_.erase(mine.front());
    mine.pop_front();
    --visible_;
    ++deleted;
  }
  return deleted;
}

}  // namespace flatkv::replay
