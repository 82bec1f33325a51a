// Injected I/O faults end in a clean miss or a clean error, never in
// wrong data, and lose nothing already stored.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "flatkv/store.h"
#include "io/fault_injection.h"
#include "testing/test_util.h"

namespace flatkv {
namespace {

using io::Fault;
using io::FaultRule;
using io::Op;
using namespace flatkv::testing;

class FaultTest : public ::testing::Test {
 protected:
  // The store's options and the chain's length (blocks) put at SetUp.
  virtual StoreOptions Options() { return SsdOnlyOptions(dir_.Sub("ssd"), 64); }
  virtual size_t Blocks() const { return 8; }

  void SetUp() override {
    StoreOptions o = Options();
    engine_ = InjectFaults(&o);
    auto s = Store::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
    keys_ = ChainKeys(1, Blocks());
    data_ = Payload(*store_, Blocks(), 1);
    ASSERT_TRUE(store_->Put(1, keys_, data_).ok());
  }

  // Restores keys_ and checks every returned byte is right; returns the hit count.
  uint32_t CheckedRestore() {
    std::vector<std::byte> got;
    uint32_t n = RestoreAll(*store_, keys_, &got);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), data_.begin())) << "wrong bytes returned";
    return n;
  }

  TempDir dir_;
  std::shared_ptr<io::FaultInjectionEngine> engine_;
  std::unique_ptr<Store> store_;
  std::vector<BlockKey> keys_;
  std::vector<std::byte> data_;
};

// A failed read is a clean miss, and the blocks it read leave the index
// (counted), so that later restores do not read them again.
TEST_F(FaultTest, ReadErrorIsACleanMissAndDropsTheBlocksItRead) {
  engine_->AddRule({Fault::kError, Op::kRead, -1, EIO, 0, 1});
  EXPECT_LT(CheckedRestore(), 8u);
  StoreStats st = store_->Stats();
  EXPECT_EQ(st.io_errors, 1u);
  EXPECT_GT(st.dropped_blocks, 0u);
  engine_->ClearRules();
  // The failed read was the first (of block 0's extent), so the chain now
  // stops at block 0; the blocks of other reads stay.
  const uint32_t left = store_->Match(keys_);
  EXPECT_EQ(left, 0u);
  EXPECT_LT(st.dropped_blocks, 8u);
  EXPECT_EQ(CheckedRestore(), left);
  EXPECT_EQ(store_->Stats().io_errors, 1u);  // nothing was read again
  // The dropped blocks can be put again.
  ASSERT_TRUE(store_->Put(1, keys_, data_).ok());
  EXPECT_EQ(CheckedRestore(), 8u);
}

TEST_F(FaultTest, ShortReadIsACleanMissAndDropsTheBlocksItRead) {
  engine_->AddRule({Fault::kShortRead, Op::kRead, -1, 0, 3, 1});
  EXPECT_LT(CheckedRestore(), 8u);
  engine_->ClearRules();
  EXPECT_GT(store_->Stats().dropped_blocks, 0u);
  EXPECT_EQ(CheckedRestore(), store_->Match(keys_));
}

TEST_F(FaultTest, CorruptedReadIsDetectedAndDropsTheBlock) {
  engine_->AddRule({Fault::kCorrupt, Op::kRead, -1, 0, 0, 1});
  EXPECT_LT(CheckedRestore(), 8u);
  EXPECT_EQ(store_->Stats().checksum_failures, 1u);
  EXPECT_EQ(store_->Stats().dropped_blocks, 1u);
  engine_->ClearRules();
  // The corrupt block left the index; its chain now stops before it.
  EXPECT_LT(store_->Match(keys_), 8u);
  EXPECT_EQ(CheckedRestore(), store_->Match(keys_));
}

// A piece larger than RestoreImpl::kVerifyJobBytes (512 KiB) is checksummed
// by several decode-queue jobs; a corrupt block in a later job's share cuts
// the chain there as it does on the completion thread.
TEST(FaultLargePieceTest, ACorruptBlockInALaterVerifyJobIsAMissFromThere) {
  TempDir dir;
  StoreOptions o = SsdOnlyOptions(dir.Sub("ssd"), 8);
  o.shape = KvShape::Mha(5, 4, 64, DType::kF32);  // 128 KiB per block and layer at 64 tokens
  o.ssd_extent_layer_bytes = 1 << 20;             // 8 blocks per extent: one 1 MiB read per layer, two jobs
  o.ssd_capacity_bytes = 8 * 8 * 5 * (128 << 10);
  o.segment_bytes = 4 * 8 * 5 * (128 << 10);
  auto engine = InjectFaults(&o);
  auto opened = Store::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Store& store = **opened;
  const std::vector<BlockKey> keys = ChainKeys(1, 8);
  const std::vector<std::byte> data = Payload(store, 8, 1);
  ASSERT_TRUE(store.Put(1, keys, data).ok());
  // The first read is layer 0's piece; its middle byte is block 4's first,
  // in the second job's share (blocks 4-7).
  engine->AddRule({Fault::kCorrupt, Op::kRead, -1, 0, 0, 1});
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(store, keys, &got), 4u);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin())) << "wrong bytes returned";
  EXPECT_EQ(store.Stats().checksum_failures, 1u);
  EXPECT_EQ(store.Stats().dropped_blocks, 1u);
  engine->ClearRules();
  EXPECT_EQ(store.Match(keys), 4u);
  EXPECT_EQ(RestoreAll(store, keys, &got), 4u);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin()));
}

// A session within one SSD extent restored straight into layer-major
// destinations reads layer 0 alone, then several layers per request
// (RestoreImpl::PlanSpan); a fault in such a request is a miss from the
// block it hits, as in a request of one layer.
class FaultSpanTest : public FaultTest {
 protected:
  StoreOptions Options() override {
    StoreOptions o = SsdOnlyOptions(dir_.Sub("ssd"), 16);
    o.shape = KvShape::Mha(6, 4, 8, DType::kF32);  // 16 KiB per block and layer; 4 blocks per extent
    const uint64_t extent = 4ull * 16384 * 6;
    o.ssd_capacity_bytes = 16 * extent;
    o.segment_bytes = 4 * extent;
    return o;
  }
  size_t Blocks() const override { return 4; }  // one extent
  uint64_t Requests() { return store_->Stats().ssd.read_requests; }
};

TEST_F(FaultSpanTest, LayersAreReadSeveralPerRequestIntoLayerMajorDestinations) {
  std::vector<std::byte> got;
  uint64_t before = Requests();
  ASSERT_EQ(RestoreInto(*store_, keys_, /*block_major=*/true, &got), 4u);  // through the window: a request per layer
  EXPECT_EQ(Requests() - before, 6u);
  EXPECT_TRUE(got == data_);
  before = Requests();
  ASSERT_EQ(RestoreInto(*store_, keys_, /*block_major=*/false, &got), 4u);
  // Six layers in flight, spans of three: layer 0, then layers 1-3 and 4-5.
  EXPECT_EQ(Requests() - before, 3u);
  EXPECT_TRUE(got == data_);
}

TEST_F(FaultSpanTest, ACorruptByteInASpanIsAMissFromItsBlock) {
  // The second request reads layers 1-3 (192 KiB); its middle byte is in
  // layer 2, block 2.
  engine_->AddRule({Fault::kCorrupt, Op::kRead, -1, 0, 1, 1});
  std::vector<std::byte> got;
  const uint64_t before = Requests();
  EXPECT_EQ(RestoreInto(*store_, keys_, /*block_major=*/false, &got), 2u);
  EXPECT_EQ(Requests() - before, 3u);  // read in spans
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data_.begin())) << "wrong bytes returned";
  EXPECT_EQ(store_->Stats().checksum_failures, 1u);
  EXPECT_EQ(store_->Stats().dropped_blocks, 1u);
  engine_->ClearRules();
  EXPECT_EQ(store_->Match(keys_), 2u);
  EXPECT_EQ(RestoreInto(*store_, keys_, /*block_major=*/false, &got), 2u);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data_.begin()));
}

TEST_F(FaultSpanTest, AFailedSpanReadIsACleanMissAndDropsTheBlocksItRead) {
  engine_->AddRule({Fault::kError, Op::kRead, -1, EIO, 2, 1});  // layers 4-5
  std::vector<std::byte> got;
  const uint64_t before = Requests();
  EXPECT_EQ(RestoreInto(*store_, keys_, /*block_major=*/false, &got), 0u);
  EXPECT_EQ(Requests() - before, 3u);  // read in spans
  EXPECT_EQ(store_->Stats().io_errors, 1u);
  EXPECT_EQ(store_->Stats().dropped_blocks, 4u);
  engine_->ClearRules();
  EXPECT_EQ(store_->Match(keys_), 0u);
  ASSERT_TRUE(store_->Put(1, keys_, data_).ok());  // they can be put again
  EXPECT_EQ(RestoreInto(*store_, keys_, /*block_major=*/false, &got), 4u);
  EXPECT_TRUE(got == data_);
}

TEST_F(FaultTest, NoSpaceOnWriteIsAnErrorAndLosesNothing) {
  engine_->AddRule({Fault::kError, Op::kWrite, -1, ENOSPC, 0, 1});
  Status s = PutChain(*store_, 2, 2, 4);
  EXPECT_EQ(s.code(), Code::kNoSpace) << s.ToString();
  engine_->ClearRules();
  EXPECT_EQ(store_->Match(ChainKeys(2, 4)), 0u);
  EXPECT_EQ(CheckedRestore(), 8u);
  // The store still takes writes afterwards.
  ASSERT_TRUE(PutChain(*store_, 2, 2, 4).ok());
  EXPECT_EQ(store_->Match(ChainKeys(2, 4)), 4u);
}

TEST_F(FaultTest, WriteErrorIsAnIoError) {
  // The put's writes: its ExtentCreate and BlockPositions records, then data.
  engine_->AddRule({Fault::kError, Op::kWrite, -1, EIO, 2, 1});
  Status s = PutChain(*store_, 3, 3, 4);
  EXPECT_EQ(s.code(), Code::kIoError) << s.ToString();
  EXPECT_EQ(store_->Match(ChainKeys(3, 4)), 0u);
}

TEST_F(FaultTest, TornAndLostWritesNeverReturnWrongBytes) {
  for (Fault f : {Fault::kTornWrite, Fault::kDropWrite}) {
    const uint64_t chain = f == Fault::kTornWrite ? 4 : 5;
    engine_->AddRule({f, Op::kWrite, -1, 0, 2, 1});  // the third layer's write of the put
    ASSERT_TRUE(PutChain(*store_, chain, chain, 4).ok());
    engine_->ClearRules();
    std::vector<std::byte> got;
    uint32_t n = RestoreAll(*store_, ChainKeys(chain, 4), &got);
    // A torn write keeps its first half (blocks 0-1 of that layer); a lost one nothing.
    EXPECT_EQ(n, f == Fault::kTornWrite ? 2u : 0u);
    auto want = Payload(*store_, 4, chain);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin()));
  }
  EXPECT_EQ(store_->Stats().checksum_failures, 2u);
  EXPECT_EQ(CheckedRestore(), 8u);
}

// A put that finds its blocks indexed by a concurrent put whose SSD write is
// still in flight (the DRAM copy serves them meanwhile) is acknowledged only
// once that write is durable: an acknowledged block survives kill -9. The
// crash harness lost three shared-prefix blocks this way.
TEST(FaultDedupTest, APutDeduplicatedAgainstAnInFlightWriteIsAcknowledgedOnceThatWriteIsDurable) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 16, 64);
  auto engine = InjectFaults(&o);
  o.sized_extents = false;  // the first put's extent has room for the rest
  const std::vector<BlockKey> chain = ChainKeys(1, 4);  // one SSD extent (SmallOptions)
  std::vector<std::byte> data;
  {
    auto opened = Store::Open(o);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    Store& store = **opened;
    data = Payload(store, 4, 1);
    const uint64_t bb = store.BlockBytes();
    // The first block creates the extent, so that the rest need no manifest
    // record before their data (records go through the gated engine too).
    ASSERT_TRUE(store.Put(1, std::span(chain).first(1), std::span(data).first(bb)).ok());
    const auto rest = std::span(chain).subspan(1);
    const auto rest_data = std::span(data).subspan(bb);
    engine->CloseGate(io::Op::kWrite);
    std::thread a([&] { EXPECT_TRUE(store.Put(1, rest, rest_data).ok()); });
    while (store.Match(chain) < chain.size()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_GT(engine->held(), 0u) << "the first put's SSD writes should be held behind the gate";
    std::atomic<uint64_t> held_at_return{~uint64_t{0}};
    PutOptions again;
    again.first_block = 1;
    std::thread b([&] {
      Status st = store.Put(1, rest, rest_data, again);
      EXPECT_TRUE(st.ok()) << st.ToString();
      held_at_return = engine->held();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    engine->OpenGate();
    a.join();
    b.join();
    EXPECT_EQ(held_at_return.load(), 0u) << "the second put was acknowledged while the blocks' SSD writes were held";
    ASSERT_TRUE(store.Close().ok());
  }
  auto reopened = Store::Open(o);
  ASSERT_TRUE(reopened.ok()) << reopened.status().ToString();
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(**reopened, chain, &got), 4u);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin()));
}

// Two puts that both plan the same new block (neither sees the other's
// yet): the one indexed second holds the first one's block, as a
// deduplicated put would. Dropping the session whose block won must not
// lose it for the other, before or after a kill -9 (the crash harness lost a
// shared system-prompt block this way).
TEST(FaultDedupTest, TwoPutsRacingOnOneNewBlockBothKeepIt) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 16, 64);
  auto engine = InjectFaults(&o);
  o.sized_extents = false;  // every session's first put opens an extent with room for the rest
  // A put larger than the SSD write buffer goes alone: the one in flight
  // below makes the two racing puts wait after planning, before either
  // indexes its block.
  o.ssd_write_buffer_bytes = 1;
  const std::vector<BlockKey> one = ChainKeys(100, 1);
  const BlockKey& shared = one[0];
  const std::vector<BlockKey> third = ChainKeys(3, 2);
  auto opened = Store::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Store& store = **opened;
  const std::vector<std::byte> block = Payload(store, 1, 100);
  for (SessionId s : {1, 2, 3}) ASSERT_TRUE(PutChain(store, s, s, 1).ok());  // their extents
  engine->CloseGate(io::Op::kWrite);
  std::thread x([&] { EXPECT_TRUE(store.Put(3, std::span(&third[1], 1), Payload(store, 1, 33)).ok()); });
  while (engine->held() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  PutResult got[2];
  std::thread puts[2];
  for (int i = 0; i < 2; ++i)
    puts[i] = std::thread([&, i] {
      PutOptions po;
      po.result = &got[i];
      EXPECT_TRUE(store.Put(SessionId(i + 1), std::span(&shared, 1), block, po).ok());
    });
  while (store.Stats().ssd_write_waits < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine->OpenGate();
  x.join();
  for (auto& t : puts) t.join();
  ASSERT_EQ(got[0].stored_blocks + got[1].stored_blocks, 1u) << "one put stores the block";
  ASSERT_EQ(got[0].dedup_blocks + got[1].dedup_blocks, 1u) << "the other holds it";
  const SessionId winner = got[0].stored_blocks == 1 ? 1 : 2;
  ASSERT_TRUE(store.DropSession(winner).ok());
  EXPECT_EQ(store.Match(std::span(&shared, 1)), 1u) << "the other session still holds the block";
  auto after_kill = Store::Open(o);  // a second opener sees the log as a kill -9 leaves it
  ASSERT_TRUE(after_kill.ok()) << after_kill.status().ToString();
  std::vector<std::byte> restored;
  EXPECT_EQ(RestoreAll(**after_kill, one, &restored), 1u);
  EXPECT_TRUE(restored == block);
  ASSERT_TRUE((*after_kill)->DropSession(winner == 1 ? 2 : 1).ok());
  EXPECT_EQ((*after_kill)->Match(std::span(&shared, 1)), 0u) << "its last holder dropped it";
}

}  // namespace
}  // namespace flatkv
