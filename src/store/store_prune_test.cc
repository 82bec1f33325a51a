// Prefix-cache pruning (flatkv/prune.h): a pruned view holds exactly the
// kept tokens' rows, is found only by requests naming its prune set, outlives
// the unpruned blocks, and survives a restart and kill -9.
#include <gtest/gtest.h>

#include <cstring>

#include "flatkv/prune.h"
#include "flatkv/store.h"
#include "testing/test_util.h"

namespace flatkv {
namespace {

using namespace flatkv::testing;

// What view block b's slice of layer l must hold: the kept tokens' rows of
// the chain's payload (Put's block-major layout), in order, zero padded.
std::vector<std::byte> ExpectedView(const Store& store, const std::vector<std::byte>& chain_bytes, uint32_t blocks,
                                    const std::vector<TokenRange>& ranges) {
  const uint32_t bt = store.options().block_tokens, layers = store.options().shape.layers;
  const uint64_t slice = store.BlockLayerBytes();
  const bool mha = store.options().shape.kind == AttentionKind::kMha;
  const uint64_t row = mha ? slice / (2 * bt) : slice / bt;
  const auto kept = PruneKeptPositions(ranges, blocks * bt);
  const uint32_t view_blocks = static_cast<uint32_t>((kept.size() + bt - 1) / bt);
  std::vector<std::byte> out(uint64_t{view_blocks} * layers * slice);
  for (uint32_t l = 0; l < layers; ++l)
    for (size_t j = 0; j < kept.size(); ++j) {
      const std::byte* src = chain_bytes.data() + (uint64_t{kept[j] / bt} * layers + l) * slice;
      std::byte* dst = out.data() + ((j / bt) * layers + l) * slice;
      std::memcpy(dst + (j % bt) * row, src + (kept[j] % bt) * row, row);
      if (mha) std::memcpy(dst + (bt + j % bt) * row, src + (bt + kept[j] % bt) * row, row);
    }
  return out;
}

std::vector<BlockKey> ViewKeys(const Store& store, const std::vector<BlockKey>& chain, const std::vector<TokenRange>& r) {
  return PruneViewKeys(chain.back(), static_cast<uint32_t>(chain.size()), r, store.options().block_tokens);
}

TEST(StorePruneTest, AViewHoldsTheKeptRowsAndOnlyItsPruneSetFindsIt) {
  TempDir dir;
  OnBothTiers(dir, 32, 64, [](Store& store, bool) {
    const std::vector<BlockKey> chain = ChainKeys(1, 6);
    ASSERT_TRUE(PutChain(store, 1, 1, 6).ok());
    const std::vector<std::byte> original = Payload(store, 6, 1);
    // A tool output in blocks 1-3 and a stray range: 64 + 150 + 10 of 384 tokens go.
    const std::vector<TokenRange> ranges = {{10, 20}, {70, 220}, {300, 364}};
    auto r = store.Prune(chain, ranges);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->logical_blocks, 6u);
    EXPECT_EQ(r->kept_tokens, 384u - 10 - 150 - 64);
    EXPECT_EQ(r->view_blocks, 3u);
    EXPECT_EQ(r->stored_blocks, 3u);
    const auto keys = ViewKeys(store, chain, ranges);
    EXPECT_EQ(r->view_session, PruneViewSession(keys[0]));
    EXPECT_EQ(store.MatchPruned(chain, ranges), 3u);
    std::vector<std::byte> got;
    ASSERT_EQ(RestoreAll(store, keys, &got), 3u);
    EXPECT_TRUE(got == ExpectedView(store, original, 6, ranges));
    // A request naming no prune set hashes the logical chain: the unpruned bytes.
    ASSERT_EQ(RestoreAll(store, chain, &got), 6u);
    EXPECT_TRUE(got == original);
    // Another prune set, or another prefix length, finds nothing.
    EXPECT_EQ(store.MatchPruned(chain, std::vector<TokenRange>{{10, 20}, {70, 220}}), 0u);
    EXPECT_EQ(store.MatchPruned(std::vector<BlockKey>(chain.begin(), chain.begin() + 5), std::vector<TokenRange>{{10, 20}}), 0u);
    // Pruning again changes nothing.
    auto again = store.Prune(chain, ranges);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->stored_blocks, 0u);
    EXPECT_EQ(again->view_session, r->view_session);
  });
}

TEST(StorePruneTest, UnprunedBlocksAreFreedWithTheirSessionAndTheViewStays) {
  TempDir dir;
  OnBothTiers(dir, 32, 64, [](Store& store, bool) {
    const std::vector<BlockKey> chain = ChainKeys(2, 8);
    ASSERT_TRUE(PutChain(store, 2, 2, 8).ok());
    const std::vector<std::byte> original = Payload(store, 8, 2);
    const std::vector<TokenRange> ranges = {{64, 320}};  // half the history
    auto r = store.Prune(chain, ranges);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->view_blocks, 4u);
    const uint64_t before = store.Stats().dram.stored_bytes + store.Stats().ssd.stored_bytes;
    ASSERT_TRUE(store.DropSession(2).ok());
    EXPECT_EQ(store.Match(chain), 0u);
    EXPECT_LT(store.Stats().dram.stored_bytes + store.Stats().ssd.stored_bytes, before);
    // The view needs only the logical keys, which the request computes from its tokens.
    EXPECT_EQ(store.MatchPruned(chain, ranges), 4u);
    std::vector<std::byte> got;
    ASSERT_EQ(RestoreAll(store, ViewKeys(store, chain, ranges), &got), 4u);
    EXPECT_TRUE(got == ExpectedView(store, original, 8, ranges));
    // Pruning needs the whole chain stored.
    auto gone = store.Prune(chain, std::vector<TokenRange>{{0, 64}});
    ASSERT_FALSE(gone.ok());
    EXPECT_EQ(gone.status().code(), Code::kNotFound);
    EXPECT_NE(gone.status().message().find("0 of the chain's 8 blocks"), std::string::npos) << gone.status().ToString();
    ASSERT_TRUE(store.DropSession(r->view_session).ok());
    EXPECT_EQ(store.MatchPruned(chain, ranges), 0u);
  });
}

TEST(StorePruneTest, BadPruneSetsAreRefusedNamingTheRange) {
  TempDir dir;
  auto store = OpenStore(SmallOptions(dir.Sub("ssd"), 8, 16));
  const std::vector<BlockKey> chain = ChainKeys(3, 2);
  ASSERT_TRUE(PutChain(*store, 3, 3, 2).ok());
  const std::vector<std::pair<std::vector<TokenRange>, std::string>> bad = {
      {{}, "no token ranges"},
      {{{5, 5}}, "range 0 [5, 5) is empty"},
      {{{0, 129}}, "ends past the chain's 128 tokens"},
      {{{10, 20}, {15, 30}}, "range 1 [15, 30) overlaps"},
      {{{40, 50}, {10, 20}}, "range 1 [10, 20) overlaps or precedes"},
      {{{0, 64}, {64, 128}}, "remove all 128 tokens"},
  };
  for (const auto& [ranges, want] : bad) {
    auto r = store->Prune(chain, ranges);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().ToString();
    EXPECT_EQ(store->MatchPruned(chain, ranges), 0u);
  }
  EXPECT_FALSE(store->Prune({}, std::vector<TokenRange>{{0, 1}}).ok());
  EXPECT_TRUE(RestoresChain(*store, 3, 2));  // nothing stored was touched
}

TEST(StorePruneTest, MlaRowsArePrunedToo) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 8, 16);
  o.shape = KvShape::Mla(3, 24, 8, DType::kBF16);
  auto store = OpenStore(o);
  const std::vector<BlockKey> chain = ChainKeys(4, 3);
  ASSERT_TRUE(PutChain(*store, 4, 4, 3).ok());
  const std::vector<TokenRange> ranges = {{1, 2}, {100, 150}};
  ASSERT_TRUE(store->Prune(chain, ranges).ok());
  std::vector<std::byte> got;
  ASSERT_EQ(RestoreAll(*store, ViewKeys(*store, chain, ranges), &got), 3u);
  EXPECT_TRUE(got == ExpectedView(*store, Payload(*store, 3, 4), 3, ranges));
}

TEST(StorePruneTest, ViewsSurviveARestartAndKillDashNine) {
  TempDir dir;
  auto o = SsdOnlyOptions(dir.Sub("ssd"), 256);
  o.segment_bytes = 16 * kSmallExtentBytes;
  const std::vector<TokenRange> ranges = {{3, 70}};
  {
    auto store = OpenStore(o);
    ASSERT_TRUE(PutChain(*store, 9, 9, 4).ok());
    ASSERT_TRUE(store->Prune(ChainKeys(9, 4), ranges).ok());
    ASSERT_TRUE(store->DropSession(9).ok());
    ASSERT_TRUE(store->Close().ok());
  }
  {
    auto store = OpenStore(o);
    std::vector<std::byte> got;
    ASSERT_EQ(RestoreAll(*store, ViewKeys(*store, ChainKeys(9, 4), ranges), &got), 3u);
    EXPECT_TRUE(got == ExpectedView(*store, Payload(*store, 4, 9), 4, ranges));
    ASSERT_TRUE(store->DropSession(PruneViewSession(ViewKeys(*store, ChainKeys(9, 4), ranges)[0])).ok());
  }
  // kill -9 while chains are put and pruned: every acknowledged view is whole.
  std::vector<uint64_t> done;
  PutUntilKilled(o, dir.Sub("progress"), 20, 20000, [&](Store& store, uint64_t chain) -> Status {
    const size_t blocks = 2 + chain % 3;
    FLATKV_RETURN_IF_ERROR(PutChain(store, chain, chain + 100, blocks));
    return store.Prune(ChainKeys(chain + 100, blocks), ranges).status();
  }, &done);
  ASSERT_GT(done.size(), 3u);
  auto store = OpenStore(o);
  for (uint64_t chain : done) {
    const size_t blocks = 2 + chain % 3;
    const auto keys = ChainKeys(chain + 100, blocks);
    std::vector<std::byte> got;
    const uint32_t want = static_cast<uint32_t>((blocks * 64 - 67 + 63) / 64);
    ASSERT_EQ(RestoreAll(*store, ViewKeys(*store, keys, ranges), &got), want) << "chain " << chain;
    EXPECT_TRUE(got == ExpectedView(*store, Payload(*store, blocks, chain + 100), static_cast<uint32_t>(blocks), ranges))
        << "chain " << chain;
  }
}

}  // namespace
}  // namespace flatkv
