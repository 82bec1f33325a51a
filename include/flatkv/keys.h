// Block keys: 128-bit chained hashes of token blocks in a namespace.
//
//   key_0 = H(namespace_digest, tokens of block 0)
//   key_i = H(key_{i-1},        tokens of block i)
//
// Equal keys mean an equal token prefix in the same namespace. The namespace
// digest binds the model fingerprint, the adapter and the tenant salt, so a
// block is only reused by the model, adapter and tenant that made it. Hashes
// are seeded and stable across processes, restarts and machines (tokens are
// hashed as little-endian uint32). The exact byte layout hashed is in
// docs/format_keys.md.
//
// Thread-safety: KeyHasher is immutable after construction; share it freely.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flatkv/status.h"

namespace flatkv {

struct BlockKey {
  uint64_t lo = 0;
  uint64_t hi = 0;

  bool operator==(const BlockKey&) const = default;
  // 32 lowercase hex digits, hi first.
  std::string ToHex() const;
  static Result<BlockKey> FromHex(std::string_view hex);
};

struct BlockKeyHash {
  size_t operator()(const BlockKey& k) const noexcept { return static_cast<size_t>(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull)); }
};

enum class HashKind : uint8_t {
  kXxh3 = 1,    // XXH3-128 with a 64-bit seed: fast (tens of GB/s), not collision resistant against an adversary
  kSha256 = 2,  // SHA-256 truncated to 128 bits: for multi-tenant deployments where tenants may craft collisions
};

std::string_view HashKindName(HashKind kind);
Result<HashKind> ParseHashKind(std::string_view name);

// What a namespace binds. Any difference gives unrelated keys.
struct Namespace {
  std::string model_fingerprint;  // e.g. a hash of architecture and weights
  std::string adapter_id;         // LoRA or other adapter; empty for the base model
  std::string tenant_salt;        // per-tenant secret or id; empty when not multi-tenant
};

class KeyHasher {
 public:
  static constexpr uint64_t kDefaultSeed = 0x666C61746B763031ull;  // "flatkv01"

  explicit KeyHasher(HashKind kind = HashKind::kXxh3, uint64_t seed = kDefaultSeed) : kind_(kind), seed_(seed) {}

  HashKind kind() const { return kind_; }
  uint64_t seed() const { return seed_; }

  // The parent of a chain's first block.
  BlockKey NamespaceDigest(const Namespace& ns) const;
  // One link of the chain.
  BlockKey Chain(const BlockKey& parent, std::span<const uint32_t> block_tokens) const;
  // Keys of every full block of `tokens`; a trailing partial block gets no key.
  std::vector<BlockKey> ChainKeys(const BlockKey& ns_digest, std::span<const uint32_t> tokens,
                                  uint32_t block_tokens) const;

  // Chunk keys (docs/format_keys.md): a caller-delimited chunk (a retrieved
  // document, say) reused at any position. The keys depend on the namespace
  // and the chunk's tokens only, never on what precedes the chunk, and the
  // chunk's trailing partial block gets a key too (its length is hashed), so
  // ceil(n / block_tokens) keys. Hashed inputs carry a domain tag and have
  // odd lengths, while chain links hash 16 + 4 x block_tokens bytes and
  // namespace digests another tag: a chunk key equals a chain or namespace
  // key only by a hash collision.
  std::vector<BlockKey> ChunkKeys(const BlockKey& ns_digest, std::span<const uint32_t> tokens,
                                  uint32_t block_tokens) const;
  // Engine keys (docs/format_keys.md): a serving engine's own block hashes
  // (vLLM's `request.block_hashes`, SGLang's page hashes), each of which
  // already covers the whole prefix and whatever the engine separates
  // (LoRA, images, prompt embeds, salt), mapped into the namespace:
  // key_i = H("flatkv-engine-v1" || ns || u64 len || hash_i). `hashes` holds
  // n hashes of `hash_bytes` bytes each, back to back. Equal engine hashes in
  // one namespace give equal keys; the domain tag keeps them apart from chain
  // links and chunk keys (equal only by a hash collision).
  std::vector<BlockKey> EngineKeys(const BlockKey& ns_digest, std::span<const uint8_t> hashes,
                                   size_t hash_bytes) const;

 private:
  BlockKey Hash(std::span<const uint8_t> bytes) const;
  HashKind kind_;
  uint64_t seed_;
};

// The session a chunk's blocks are stored under (contiguous, layer-major, as
// every session): its first chunk key's low word with the top bit set.
inline uint64_t ChunkSession(const BlockKey& first_chunk_key) { return first_chunk_key.lo | (uint64_t{1} << 63); }

}  // namespace flatkv

template <>
struct std::hash<flatkv::BlockKey> : flatkv::BlockKeyHash {};
