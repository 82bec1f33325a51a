// Pruned views' prune sets and keys (include/flatkv/prune.h; the hashed
// bytes are in docs/format_keys.md, "Pruned views").
#include <xxhash.h>

#include <string>
#include <string_view>

#include "flatkv/prune.h"

namespace flatkv {
namespace {

void PutU32(std::vector<uint8_t>& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void PutU64(std::vector<uint8_t>& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
BlockKey Hash(const std::vector<uint8_t>& b) {
  const XXH128_hash_t h = XXH3_128bits_withSeed(b.data(), b.size(), KeyHasher::kDefaultSeed);
  return BlockKey{h.low64, h.high64};
}

}  // namespace

Status ValidatePruneSet(std::span<const TokenRange> ranges, uint32_t logical_tokens) {
  if (ranges.empty()) return Status::InvalidArgument("prune: no token ranges to remove");
  uint64_t removed = 0;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const TokenRange& r = ranges[i];
    const std::string what = "prune: range " + std::to_string(i) + " [" + std::to_string(r.begin) + ", " +
                             std::to_string(r.end) + ")";
    if (r.begin >= r.end) return Status::InvalidArgument(what + " is empty or reversed");
    if (r.end > logical_tokens)
      return Status::InvalidArgument(what + " ends past the chain's " + std::to_string(logical_tokens) + " tokens");
    if (i > 0 && r.begin < ranges[i - 1].end)
      return Status::InvalidArgument(what + " overlaps or precedes range " + std::to_string(i - 1) + " (ranges must be sorted)");
    removed += r.end - r.begin;
  }
  if (removed >= logical_tokens)
    return Status::InvalidArgument("prune: the ranges remove all " + std::to_string(logical_tokens) + " tokens");
  return Status::Ok();
}

uint32_t PruneKeptTokens(std::span<const TokenRange> ranges, uint32_t logical_tokens) {
  uint32_t removed = 0;
  for (const TokenRange& r : ranges) removed += r.end - r.begin;
  return logical_tokens - removed;
}

std::vector<uint32_t> PruneKeptPositions(std::span<const TokenRange> ranges, uint32_t logical_tokens) {
  std::vector<uint32_t> kept;
  kept.reserve(PruneKeptTokens(ranges, logical_tokens));
  uint32_t p = 0;
  for (const TokenRange& r : ranges) {
    for (; p < r.begin; ++p) kept.push_back(p);
    p = r.end;
  }
  for (; p < logical_tokens; ++p) kept.push_back(p);
  return kept;
}

BlockKey PruneSetDigest(std::span<const TokenRange> ranges, uint32_t logical_blocks) {
  // H("flatkv-pruneset-v1" || u32 logical_blocks || u32 n || n x (u32 begin, u32 end)): 26 + 8n bytes.
  std::vector<uint8_t> b;
  const std::string_view tag = "flatkv-pruneset-v1";
  b.insert(b.end(), tag.begin(), tag.end());
  PutU32(b, logical_blocks);
  PutU32(b, static_cast<uint32_t>(ranges.size()));
  for (const TokenRange& r : ranges) {
    PutU32(b, r.begin);
    PutU32(b, r.end);
  }
  return Hash(b);
}

std::vector<BlockKey> PruneViewKeys(const BlockKey& last_logical_key, uint32_t logical_blocks,
                                    std::span<const TokenRange> ranges, uint32_t block_tokens) {
  std::vector<BlockKey> keys;
  if (block_tokens == 0) return keys;
  const uint32_t kept = PruneKeptTokens(ranges, logical_blocks * block_tokens);
  const BlockKey digest = PruneSetDigest(ranges, logical_blocks);
  // view_i = H("flatkv-prunekey-v1" || last logical key || digest || u32 i): 54 bytes.
  const std::string_view tag = "flatkv-prunekey-v1";
  std::vector<uint8_t> b;
  for (uint32_t i = 0; i < (kept + block_tokens - 1) / block_tokens; ++i) {
    b.assign(tag.begin(), tag.end());
    PutU64(b, last_logical_key.lo);
    PutU64(b, last_logical_key.hi);
    PutU64(b, digest.lo);
    PutU64(b, digest.hi);
    PutU32(b, i);
    keys.push_back(Hash(b));
  }
  return keys;
}

}  // namespace flatkv
