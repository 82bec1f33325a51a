#include "flatkv/keys.h"

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

TEST(KeysTest, HexRoundTripAndErrors) {
  BlockKey k{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(k.ToHex(), "fedcba98765432100123456789abcdef");
  EXPECT_EQ(BlockKey::FromHex(k.ToHex()).value(), k);
  EXPECT_FALSE(BlockKey::FromHex("abc").ok());
  EXPECT_FALSE(BlockKey::FromHex(std::string(31, '0') + "g").ok());
  EXPECT_FALSE(ParseHashKind("md5").ok());
}

}  // namespace
}  // namespace flatkv
