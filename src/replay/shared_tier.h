// SharedTier: the remote tier of a multi-node replay (flatkv replay
// --nodes N), as the simulator sees flatkv's Redis Cluster medium
// (src/remote, docs/remote.md): which block keys are published, and which
// of them a lookup can see yet.
//
// It follows what RemoteMedium does, not an idealised pool:
//   - Match(blocks, from) is RemoteTier::Match: of the chain from `from`,
//     the longest run of consecutive blocks that are published and visible;
//   - Claim is the publisher's skip: a block that some node has published,
//     or is publishing, is not written again (the simulator first takes
//     the put's leading blocks that fit the node's publish buffer, as
//     RemoteMedium::Publish does, whether new or not); a claimed block becomes
//     visible only when its node's publish completes (Publish), so a
//     lookup never sees a block still on the wire;
//   - each node's own published blocks are capped (RemoteOptions::
//     capacity_bytes): past the cap the node deletes the blocks it published
//     first, which other nodes then miss.
// Block keys are the trace's chained block hashes, one model: the
// namespace digest is the same for every block.
//
// Thread-safety: none; driven by the simulator thread.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

namespace flatkv::replay {

class SharedTier {
 public:
  // `nodes` publishers, each capped at `capacity_blocks` visible blocks
  // (0: uncapped).
  SharedTier(uint32_t nodes, uint64_t capacity_blocks) : owned_(nodes), capacity_blocks_(capacity_blocks) {}

  // How many of blocks[from], blocks[from + 1], ... are visible, up to the
  // first that is not.
  uint32_t Match(std::span<const uint64_t> blocks, uint32_t from) const;
  // Of `keys`, those no node has published or is publishing: marked as
  // being published and returned, in order.
  std::vector<uint64_t> Claim(std::span<const uint64_t> keys);
  // How many of `keys` no node has published or is publishing.
  uint64_t CountNew(std::span<const uint64_t> keys) const;
  // `node`'s publish of `keys` (claimed by it) completed: they are visible
  // and its own. Returns how many of the node's oldest blocks were deleted
  // to stay within its cap.
  uint64_t Publish(uint32_t node, std::span<const uint64_t> keys);

  uint64_t visible_blocks() const { return visible_; }

 private:
  enum class State : uint8_t { kPublishing, kVisible };
  std::unordered_map<uint64_t, State> keys_;
  std::vector<std::deque<uint64_t>> owned_;  // per node, visible blocks in publish order
  uint64_t capacity_blocks_;
  uint64_t visible_ = 0;
};

}  // namespace flatkv::replay
