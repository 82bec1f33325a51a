#include "flatkv/keys.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace flatkv {
namespace {

void PutU64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void PutString(std::vector<uint8_t>& out, std::string_view s) {
  PutU64(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

uint64_t LoadU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string BlockKey::ToHex() const {
  static const char* kDigits = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[15 - i] = kDigits[(hi >> (4 * i)) & 0xF];
    s[31 - i] = kDigits[(lo >> (4 * i)) & 0xF];
  }
  return s;
}

Result<BlockKey> BlockKey::FromHex(std::string_view hex) {
  if (hex.size() != 32) return Status::InvalidArgument("block key '" + std::string(hex) + "': expected 32 hex digits");
  BlockKey k;
  for (size_t i = 0; i < 32; ++i) {
    int v = HexValue(hex[i]);
    if (v < 0) return Status::InvalidArgument("block key '" + std::string(hex) + "': bad hex digit at " + std::to_string(i));
    uint64_t& word = i < 16 ? k.hi : k.lo;
    word = (word << 4) | static_cast<uint64_t>(v);
  }
  return k;
}

std::string_view HashKindName(HashKind kind) {
  switch (kind) {
    case HashKind::kXxh3: return "xxh3";
    case HashKind::kSha256: return "sha256";
  }
  return "unknown";
}

Result<HashKind> ParseHashKind(std::string_view name) {
  if (name == "xxh3") return HashKind::kXxh3;
  if (name == "sha256") return HashKind::kSha256;
  return Status::InvalidArgument("unknown hash '" + std::string(name) + "' (expected xxh3 or sha256)");
}

BlockKey KeyHasher::Hash(std::span<const uint8_t> bytes) const {
  if (kind_ == HashKind::kXxh3) {
    XXH128_hash_t h = XXH3_128bits_withSeed(bytes.data(), bytes.size(), seed_);
    return BlockKey{h.low64, h.high64};
  }
  // SHA-256(seed_le64 || bytes), first 16 bytes as lo, hi (little-endian).
  uint8_t seed_bytes[8];
  for (int i = 0; i < 8; ++i) seed_bytes[i] = static_cast<uint8_t>(seed_ >> (8 * i));
  uint8_t digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  EVP_DigestUpdate(ctx, seed_bytes, sizeof(seed_bytes));
  EVP_DigestUpdate(ctx, bytes.data(), bytes.size());
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  return BlockKey{LoadU64(digest), LoadU64(digest + 8)};
}

BlockKey KeyHasher::NamespaceDigest(const Namespace& ns) const {
  std::vector<uint8_t> buf;
  const std::string_view tag = "flatkv-namespace-v1";
  buf.insert(buf.end(), tag.begin(), tag.end());
  PutString(buf, ns.model_fingerprint);
  PutString(buf, ns.adapter_id);
  PutString(buf, ns.tenant_salt);
  return Hash(buf);
}

BlockKey KeyHasher::Chain(const BlockKey& parent, std::span<const uint32_t> block_tokens) const {
  std::vector<uint8_t> buf;
  buf.reserve(16 + 4 * block_tokens.size());
  PutU64(buf, parent.lo);
  PutU64(buf, parent.hi);
  for (uint32_t t : block_tokens)
    for (int i = 0; i < 4; ++i) buf.push_back(static_cast<uint8_t>(t >> (8 * i)));
  return Hash(buf);
}

std::vector<BlockKey> KeyHasher::ChainKeys(const BlockKey& ns_digest, std::span<const uint32_t> tokens,
                                           uint32_t block_tokens) const {
  std::vector<BlockKey> keys;
  if (block_tokens == 0) return keys;
  BlockKey parent = ns_digest;
  for (size_t start = 0; start + block_tokens <= tokens.size(); start += block_tokens) {
    parent = Chain(parent, tokens.subspan(start, block_tokens));
    keys.push_back(parent);
  }
  return keys;
}

std::vector<BlockKey> KeyHasher::ChunkKeys(const BlockKey& ns_digest, std::span<const uint32_t> tokens,
                                           uint32_t block_tokens) const {
  std::vector<BlockKey> keys;
  if (block_tokens == 0 || tokens.empty()) return keys;
  // root = H("flatkv-chunkroot-v1" || ns || u64 n || tokens): 43 + 4n bytes.
  std::vector<uint8_t> buf;
  const std::string_view root_tag = "flatkv-chunkroot-v1";
  buf.insert(buf.end(), root_tag.begin(), root_tag.end());
  PutU64(buf, ns_digest.lo);
  PutU64(buf, ns_digest.hi);
  PutU64(buf, tokens.size());
  for (uint32_t t : tokens)
    for (int i = 0; i < 4; ++i) buf.push_back(static_cast<uint8_t>(t >> (8 * i)));
  const BlockKey root = Hash(buf);
  // key_i = H("flatkv-chunk-v1" || root || u32 i || u32 tokens in block i): 39 bytes.
  const std::string_view tag = "flatkv-chunk-v1";
  for (size_t start = 0, i = 0; start < tokens.size(); start += block_tokens, ++i) {
    const uint64_t len = std::min<uint64_t>(block_tokens, tokens.size() - start);
    buf.assign(tag.begin(), tag.end());
    PutU64(buf, root.lo);
    PutU64(buf, root.hi);
    PutU64(buf, (len << 32) | i);  // u32 i then u32 len, little-endian
    keys.push_back(Hash(buf));
  }
  return keys;
}

std::vector<BlockKey> KeyHasher::EngineKeys(const BlockKey& ns_digest, std::span<const uint8_t> hashes,
                                            size_t hash_bytes) const {
  std::vector<BlockKey> keys;
  if (hash_bytes == 0) return keys;
  keys.reserve(hashes.size() / hash_bytes);
  // key_i = H("flatkv-engine-v1" || ns || u64 len || hash_i): 40 + len bytes.
  const std::string_view tag = "flatkv-engine-v1";
  std::vector<uint8_t> buf;
  for (size_t at = 0; at + hash_bytes <= hashes.size(); at += hash_bytes) {
    buf.assign(tag.begin(), tag.end());
    PutU64(buf, ns_digest.lo);
    PutU64(buf, ns_digest.hi);
    PutU64(buf, hash_bytes);
    buf.insert(buf.end(), hashes.begin() + at, hashes.begin() + at + hash_bytes);
    keys.push_back(Hash(buf));
  }
  return keys;
}

}  // namespace flatkv
