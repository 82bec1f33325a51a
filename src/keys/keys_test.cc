#include "flatkv/keys.h"

#include "flatkv/prune.h"

#include <gtest/gtest.h>

#include <numeric>
#include <unordered_set>

namespace flatkv {
namespace {

std::vector<uint32_t> Tokens(size_t n, uint32_t start = 0) {
  std::vector<uint32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

TEST(KeysTest, ChainIsPrefixStableAndIgnoresPartialBlock) {
  KeyHasher h;
  BlockKey ns = h.NamespaceDigest({"model", "", ""});
  auto a = h.ChainKeys(ns, Tokens(64 * 3 + 10), 64);
  auto b = h.ChainKeys(ns, Tokens(64 * 5), 64);
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 5u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a[i], b[i]);
  // key_i = H(key_{i-1}, tokens of block i)
  auto t = Tokens(128);
  EXPECT_EQ(b[1], h.Chain(b[0], std::span<const uint32_t>(t).subspan(64, 64)));
}

TEST(KeysTest, ADifferentEarlierTokenChangesEveryLaterKey) {
  KeyHasher h;
  BlockKey ns = h.NamespaceDigest({"model", "", ""});
  auto t = Tokens(64 * 4);
  auto a = h.ChainKeys(ns, t, 64);
  t[70] ^= 1;  // in block 1
  auto b = h.ChainKeys(ns, t, 64);
  EXPECT_EQ(a[0], b[0]);
  for (int i = 1; i < 4; ++i) EXPECT_NE(a[i], b[i]);
}

TEST(KeysTest, NamespacesSeparateModelsAdaptersAndTenants) {
  for (HashKind kind : {HashKind::kXxh3, HashKind::kSha256}) {
    KeyHasher h(kind);
    std::unordered_set<BlockKey> seen;
    for (Namespace ns : {Namespace{"m1", "", ""}, Namespace{"m2", "", ""}, Namespace{"m1", "lora", ""},
                         Namespace{"m1", "", "tenant-a"}, Namespace{"m1", "", "tenant-b"},
                         // Length-prefixing keeps field boundaries: these must differ too.
                         Namespace{"m1l", "ora", ""}, Namespace{"m1", "l", "ora"}})
      EXPECT_TRUE(seen.insert(h.ChainKeys(h.NamespaceDigest(ns), Tokens(64), 64)[0]).second);
  }
}

TEST(KeysTest, SeedAndKindChangeKeys) {
  auto t = Tokens(64);
  BlockKey a = KeyHasher(HashKind::kXxh3, 1).Chain({}, t);
  BlockKey b = KeyHasher(HashKind::kXxh3, 2).Chain({}, t);
  BlockKey c = KeyHasher(HashKind::kSha256, 1).Chain({}, t);
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
}

// Golden values: keys must never change across builds, processes or
// machines, or every stored SSD block would silently become a miss.
TEST(KeysTest, GoldenValuesAreStable) {
  auto t = Tokens(64);
  KeyHasher x;
  KeyHasher s(HashKind::kSha256);
  EXPECT_EQ(x.Chain({}, t).ToHex(), "1de7406d7b2a66f9aa5218cbdfa63326");
  EXPECT_EQ(s.Chain({}, t).ToHex(), "71c9fec39c50695849321e1497d66731");  // checked with Python hashlib
}

TEST(KeysTest, ChunkKeysArePositionIndependentAndKeepThePartialBlock) {
  KeyHasher h;
  const BlockKey ns = h.NamespaceDigest({"model", "", ""});
  const auto chunk = Tokens(64 * 2 + 10, 7);
  const auto keys = h.ChunkKeys(ns, chunk, 64);
  ASSERT_EQ(keys.size(), 3u);  // the 10-token tail gets its own key
  EXPECT_EQ(keys, h.ChunkKeys(ns, chunk, 64));
  // Only the chunk's own tokens matter: no parent, no position.
  std::vector<uint32_t> with_prefix = Tokens(64);
  with_prefix.insert(with_prefix.end(), chunk.begin(), chunk.end());
  EXPECT_EQ(keys, h.ChunkKeys(ns, std::span<const uint32_t>(with_prefix).subspan(64), 64));
  // A chunk that is a prefix of another shares no key (the length is hashed).
  const auto longer = h.ChunkKeys(ns, Tokens(64 * 2 + 11, 7), 64);
  for (int i = 0; i < 3; ++i) EXPECT_NE(keys[i], longer[i]);
  // Any token changes every key; another namespace gives unrelated keys.
  auto changed = chunk;
  changed.back() ^= 1;
  EXPECT_NE(keys[0], h.ChunkKeys(ns, changed, 64)[0]);
  EXPECT_NE(keys[0], h.ChunkKeys(h.NamespaceDigest({"model", "", "tenant"}), chunk, 64)[0]);
  // Never a chain key of the same tokens, nor of the chunk as a prompt.
  const auto chain = h.ChainKeys(ns, chunk, 64);
  std::unordered_set<BlockKey> seen(chain.begin(), chain.end());
  seen.insert(ns);
  for (const BlockKey& k : keys) EXPECT_TRUE(seen.insert(k).second);
  EXPECT_TRUE(h.ChunkKeys(ns, {}, 64).empty());
  EXPECT_TRUE(h.ChunkKeys(ns, chunk, 0).empty());
}

// Pinned with Python's hashlib (docs/format_keys.md, chunk keys).
TEST(KeysTest, ChunkKeyGoldenValues) {
  KeyHasher s(HashKind::kSha256);
  const auto keys = s.ChunkKeys({}, Tokens(20), 16);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0].ToHex(), "ddba26c26493974dcedf46bf595aef03");
  EXPECT_EQ(keys[1].ToHex(), "1950d4cff5b377891e4d55ba8732066c");
}

// Engine keys (docs/format_keys.md): pinned with Python's hashlib.
TEST(KeysTest, EngineKeyGoldenValuesAndSeparation) {
  KeyHasher s(HashKind::kSha256);
  const BlockKey ns = s.NamespaceDigest({"model", "", ""});
  EXPECT_EQ(ns.ToHex(), "5561a3b16833a7541c673a84d7f864c1");
  std::vector<uint8_t> hashes(64);
  std::iota(hashes.begin(), hashes.begin() + 32, 0);
  std::iota(hashes.begin() + 32, hashes.end(), 0);
  hashes[63] ^= 1;
  const auto keys = s.EngineKeys(ns, hashes, 32);
  ASSERT_EQ(keys.size(), 2u);
  EXPECT_EQ(keys[0].ToHex(), "0f2d10614c89d894775ec367bb5fe56e");
  EXPECT_NE(keys[0], keys[1]);  // one byte of the engine's hash
  // Another namespace (a rank, a model's content) gives other keys for the same hashes.
  EXPECT_NE(s.EngineKeys(s.NamespaceDigest({"model", "", "rank1"}), hashes, 32)[0], keys[0]);
  // A trailing partial hash gets no key; a width of 0 none at all.
  EXPECT_EQ(s.EngineKeys(ns, std::span<const uint8_t>(hashes).first(40), 32).size(), 1u);
  EXPECT_TRUE(s.EngineKeys(ns, hashes, 0).empty());
}

TEST(KeysTest, HexRoundTripAndErrors) {
  BlockKey k{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(k.ToHex(), "fedcba98765432100123456789abcdef");
  EXPECT_EQ(BlockKey::FromHex(k.ToHex()).value(), k);
  EXPECT_FALSE(BlockKey::FromHex("abc").ok());
  EXPECT_FALSE(BlockKey::FromHex(std::string(31, '0') + "g").ok());
  EXPECT_FALSE(ParseHashKind("md5").ok());
}

// Golden values of the pruned-view keys (docs/format_keys.md, "Pruned
// views"), computed by an independent C program over libxxhash from the
// byte layout the document gives.
TEST(KeysTest, PrunedViewKeysAreGolden) {
  const std::vector<TokenRange> ranges = {{10, 20}, {70, 200}};
  const BlockKey digest = PruneSetDigest(ranges, 4);
  EXPECT_EQ(digest, (BlockKey{0xac27af797f6c7a79ull, 0xcf04ff42d16a9a93ull}));
  const auto keys = PruneViewKeys(BlockKey{0x0123456789abcdefull, 0xfedcba9876543210ull}, 4, ranges, 64);
  ASSERT_EQ(keys.size(), 2u);  // 116 of 256 tokens kept
  EXPECT_EQ(keys[0], (BlockKey{0x5e5c8247866ba347ull, 0x09025e644a063d16ull}));
  EXPECT_EQ(keys[1], (BlockKey{0xc2ab5a95d32733abull, 0x3162531219f2bf60ull}));
  EXPECT_EQ(PruneViewSession(keys[0]), keys[0].lo | (uint64_t{1} << 63));
  // Any change to the set or the prefix gives unrelated keys.
  EXPECT_NE(PruneSetDigest(ranges, 5), digest);
  EXPECT_NE(PruneSetDigest(std::vector<TokenRange>{{10, 20}, {70, 201}}, 4), digest);
  EXPECT_NE(PruneViewKeys(BlockKey{1, 2}, 4, ranges, 64)[0], keys[0]);
  EXPECT_EQ(PruneKeptTokens(ranges, 256), 116u);
  const auto kept = PruneKeptPositions(ranges, 256);
  ASSERT_EQ(kept.size(), 116u);
  EXPECT_EQ(kept[9], 9u);
  EXPECT_EQ(kept[10], 20u);
  EXPECT_EQ(kept[59], 69u);
  EXPECT_EQ(kept[60], 200u);
  EXPECT_EQ(kept.back(), 255u);
}

}  // namespace
}  // namespace flatkv
