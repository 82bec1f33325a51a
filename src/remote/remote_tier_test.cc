// The remote tier's objects and index against the live local cluster
// (ctest's RedisCluster fixture): round trips, shared prefixes published
// once, evicted, corrupted and stale objects as misses, never wrong bytes.
#include "remote/remote_tier.h"
#include "remote/cluster_test_util.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

namespace flatkv::remote {
namespace {

constexpr uint32_t kLayers = 4;
constexpr uint64_t kSlice = 64 << 10;  // bytes per block per layer

std::vector<std::string> Seeds() { return cluster_testing::LocalClusterSeeds(); }

// A chain of `blocks` keys whose first `shared` equal `base`'s (chained
// hashing: same tokens, same keys).
std::vector<BlockKey> Chain(uint32_t blocks, uint64_t seed, const std::vector<uint32_t>& base_tokens = {},
                            std::vector<uint32_t>* tokens_out = nullptr) {
  KeyHasher h;
  std::mt19937 rng{static_cast<uint32_t>(seed)};
  std::vector<uint32_t> tokens = base_tokens;
  tokens.resize(size_t{blocks} * 64);
  for (size_t i = base_tokens.size(); i < tokens.size(); ++i) tokens[i] = rng() % 32000;
  if (tokens_out) *tokens_out = tokens;
  return h.ChainKeys(h.NamespaceDigest({"remote-test", "", ""}), tokens, 64);
}

BlockKey Ns() {
  KeyHasher h;
  return h.NamespaceDigest({"remote-test", "", ""});
}

// The bytes of (layer, block) of the chain whose first key is `k`: a pattern
// from the block's own key, so equal keys give equal bytes.
std::vector<std::byte> Slice(const BlockKey& key, uint32_t layer) {
  std::vector<std::byte> out(kSlice);
  std::mt19937_64 rng(key.lo ^ (key.hi * 31) ^ layer);
  for (size_t i = 0; i < out.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  return out;
}

class RemoteTierTest : public ::testing::Test {
 protected:
  // RemoteTierTlsTest: the same tier on the TLS-only cluster.
  virtual bool Tls() const { return false; }
  void SetUp() override {
    RemoteTierOptions o;
    if (Tls()) {
      o.cluster.seeds = cluster_testing::LocalClusterSeeds(cluster_testing::TlsClusterDir());
      o.cluster.tls = true;
      o.cluster.tls_ca_file = cluster_testing::TlsClusterCa();
    } else {
      o.cluster.seeds = Seeds();
    }
    ASSERT_FALSE(o.cluster.seeds.empty()) << "no cluster at " << (Tls() ? cluster_testing::TlsClusterDir()
                                                                        : cluster_testing::ClusterDir());
    // Unique per run: the cluster outlives a test process.
    o.prefix = "fkvtest-" + std::to_string(::getpid()) + "-" +
               std::to_string(std::chrono::steady_clock::now().time_since_epoch().count());
    o.object_bytes = 4 * kSlice;  // 4 blocks an object
    o.max_inflight = 5;           // windows that split layers
    auto t = RemoteTier::Open(o, kLayers, kSlice);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tier_ = std::move(t).value();
  }

  Status Publish(const std::vector<BlockKey>& chain) {
    std::vector<std::vector<std::byte>> data(chain.size() * kLayers);
    for (uint32_t b = 0; b < chain.size(); ++b)
      for (uint32_t l = 0; l < kLayers; ++l) data[b * kLayers + l] = Slice(chain[b], l);
    return tier_->Publish(Ns(), chain, [&](uint32_t l, uint32_t b) { return data[b * kLayers + l].data(); });
  }

  // Restores `chain`; checks every valid block's bytes; returns the valid count.
  uint32_t RestoreAndCheck(const std::vector<BlockKey>& chain, std::vector<uint32_t>* layers_done = nullptr) {
    auto m = tier_->Match(chain);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    if (!m.ok()) return 0;
    std::vector<std::byte> out(chain.size() * kLayers * kSlice, std::byte{0xEE});
    auto valid = tier_->Restore(
        Ns(), chain, *m, [&](uint32_t l, uint32_t b) { return out.data() + (uint64_t{l} * chain.size() + b) * kSlice; },
        [&](uint32_t l, uint32_t) {
          if (layers_done) layers_done->push_back(l);
          return true;
        });
    EXPECT_TRUE(valid.ok()) << valid.status().ToString();
    if (!valid.ok()) return 0;
    for (uint32_t l = 0; l < kLayers; ++l)
      for (uint32_t b = 0; b < *valid; ++b) {
        const auto want = Slice(chain[b], l);
        EXPECT_EQ(std::memcmp(out.data() + (uint64_t{l} * chain.size() + b) * kSlice, want.data(), kSlice), 0)
            << "layer " << l << " block " << b;
      }
    return *valid;
  }

  std::unique_ptr<RemoteTier> tier_;
};

TEST_F(RemoteTierTest, PublishedChainRestoresLayerByLayer) {
  const auto chain = Chain(10, 1);
  ASSERT_TRUE(Publish(chain).ok());
  EXPECT_EQ(tier_->stats().objects_written, 3u * kLayers);  // pieces of 4, 4, 2 blocks
  EXPECT_EQ(tier_->stats().blocks_published, 10u);
  std::vector<uint32_t> done;
  EXPECT_EQ(RestoreAndCheck(chain, &done), 10u);
  EXPECT_EQ(done, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(tier_->stats().objects_read, 3u * kLayers);
  // No hash tags: the objects spread over the shards.
  std::set<std::string> nodes;
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t first : {0u, 4u, 8u})
      nodes.insert(tier_->cluster().NodeForSlot(KeySlot(tier_->ObjectName(chain[first], first == 8 ? 2 : 4, l))));
  EXPECT_GE(nodes.size(), 2u);
  // A longer chain matches only its published prefix.
  std::vector<uint32_t> tokens;
  const auto first = Chain(10, 1, {}, &tokens);
  const auto longer = Chain(14, 2, tokens);
  EXPECT_EQ(tier_->Match(longer)->blocks, 10u);
}

class RemoteTierTlsTest : public RemoteTierTest {
 protected:
  bool Tls() const override { return true; }
};

TEST_F(RemoteTierTlsTest, APublishedChainRestoresLayerByLayerOverTls) {
  const auto chain = Chain(10, 1);
  ASSERT_TRUE(Publish(chain).ok());
  EXPECT_EQ(tier_->stats().objects_written, 3u * kLayers);
  std::vector<uint32_t> done;
  EXPECT_EQ(RestoreAndCheck(chain, &done), 10u);
  EXPECT_EQ(done, (std::vector<uint32_t>{0, 1, 2, 3}));
}

TEST_F(RemoteTierTest, ASharedPrefixIsPublishedOnceAndRestoresFromTheFirstChainsObjects) {
  std::vector<uint32_t> tokens;
  const auto a = Chain(6, 3, {}, &tokens);
  ASSERT_TRUE(Publish(a).ok());
  const auto b = Chain(10, 4, tokens);  // a's 6 blocks, then 4 of its own
  ASSERT_TRUE(Publish(b).ok());
  EXPECT_EQ(tier_->stats().blocks_already_published, 6u);
  EXPECT_EQ(tier_->stats().blocks_published, 10u);
  EXPECT_EQ(RestoreAndCheck(b), 10u);  // blocks 4..5 come from positions 0..1 of a's second object
}

TEST_F(RemoteTierTest, AnEvictedObjectIsAMissFromItsFirstBlockAndItsIndexEntriesGo) {
  const auto chain = Chain(10, 5);
  ASSERT_TRUE(Publish(chain).ok());
  ASSERT_TRUE(tier_->cluster().Command({"DEL", tier_->ObjectName(chain[4], 4, 2)}).ok());  // as maxmemory would
  EXPECT_EQ(RestoreAndCheck(chain), 4u);
  EXPECT_EQ(tier_->stats().missing_objects, 1u);
  EXPECT_EQ(tier_->stats().index_entries_cleaned, 6u);
  EXPECT_EQ(tier_->Match(chain)->blocks, 4u);
}

TEST_F(RemoteTierTest, CorruptedOrForeignObjectsAreMissesNeverWrongBytes) {
  const auto chain = Chain(12, 6);
  ASSERT_TRUE(Publish(chain).ok());
  // A flipped payload byte behind flatkv's back.
  const std::string name = tier_->ObjectName(chain[8], 4, 1);
  auto v = tier_->cluster().Command({"GET", name});
  ASSERT_TRUE(v.ok() && v->type == RespValue::kString);
  std::string bad = v->str;
  bad[kObjectHeaderBytes + 100] ^= 1;
  ASSERT_TRUE(tier_->cluster().Command({"SET", name, bad}).ok());
  EXPECT_EQ(RestoreAndCheck(chain), 8u);
  EXPECT_EQ(tier_->stats().stale_objects, 1u);
  // A well-formed object of the right name but another layer's header (a stale writer).
  const std::string other = tier_->ObjectName(chain[4], 4, 3);
  auto v2 = tier_->cluster().Command({"GET", tier_->ObjectName(chain[4], 4, 2)});
  ASSERT_TRUE(v2.ok());
  ASSERT_TRUE(tier_->cluster().Command({"SET", other, v2->str}).ok());
  EXPECT_EQ(RestoreAndCheck(chain), 4u);
  EXPECT_EQ(tier_->stats().stale_objects, 2u);
}

TEST(RemoteObjectHeaderTest, RefusesWhatItDoesNotUnderstand) {
  ObjectHeader h;
  h.layer = 3;
  h.blocks = 1;
  h.block_layer_bytes = 4;
  h.payload_checksum = 0;
  std::string v = EncodeObjectHeader(h) + "abcd";
  EXPECT_EQ(DecodeObjectHeader(v).status().code(), Code::kCorruption);  // payload checksum 0 is wrong
  std::string future = v;
  future[4] = 2;  // version 2
  EXPECT_EQ(DecodeObjectHeader(future).status().code(), Code::kNotSupported);
  std::string magic = v;
  magic[0] = 'X';
  EXPECT_EQ(DecodeObjectHeader(magic).status().code(), Code::kCorruption);
  EXPECT_EQ(DecodeObjectHeader(v.substr(0, 50)).status().code(), Code::kCorruption);
}

TEST(RemoteTierOpenTest, RefusesHashTagPrefixes) {
  RemoteTierOptions o;
  o.cluster.seeds = {"127.0.0.1:1"};
  o.prefix = "{fkv}";
  auto t = RemoteTier::Open(o, 4, 1024);
  EXPECT_EQ(t.status().code(), Code::kInvalidArgument);
  EXPECT_NE(t.status().message().find("hash tag"), std::string::npos) << t.status().ToString();
}

}  // namespace
}  // namespace flatkv::remote
