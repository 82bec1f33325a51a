// Injected I/O faults end in a clean miss or a clean error, never in
// wrong data, and lose nothing already stored.
#include <gtest/gtest.h>

#include "flatkv/store.h"
#include "io/fault_injection.h"
#include "testing/test_util.h"

namespace flatkv {
namespace {

using io::Fault;
using io::FaultRule;
using io::Op;
using testing::ChainKeys;
using testing::Payload;
using testing::RestoreAll;
using testing::SmallOptions;
using testing::TempDir;

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = std::make_shared<io::FaultInjectionEngine>(std::shared_ptr<io::IoEngine>(io::MakeThreadPoolEngine(2)));
    StoreOptions o = SmallOptions(dir_.Sub("ssd"), 0, 64);
    o.dram_capacity_bytes = 0;
    o.ssd_engine = engine_;
    auto s = Store::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    store_ = std::move(s).value();
    keys_ = ChainKeys(1, 8);
    data_ = Payload(*store_, 8, 1);
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

TEST_F(FaultTest, NoSpaceOnWriteIsAnErrorAndLosesNothing) {
  engine_->AddRule({Fault::kError, Op::kWrite, -1, ENOSPC, 0, 1});
  Status s = store_->Put(2, ChainKeys(2, 4), Payload(*store_, 4, 2));
  EXPECT_EQ(s.code(), Code::kNoSpace) << s.ToString();
  engine_->ClearRules();
  EXPECT_EQ(store_->Match(ChainKeys(2, 4)), 0u);
  EXPECT_EQ(CheckedRestore(), 8u);
  // The store still takes writes afterwards.
  ASSERT_TRUE(store_->Put(2, ChainKeys(2, 4), Payload(*store_, 4, 2)).ok());
  EXPECT_EQ(store_->Match(ChainKeys(2, 4)), 4u);
}

TEST_F(FaultTest, WriteErrorIsAnIoError) {
  // The put's writes: its ExtentCreate and BlockPositions records, then data.
  engine_->AddRule({Fault::kError, Op::kWrite, -1, EIO, 2, 1});
  Status s = store_->Put(3, ChainKeys(3, 4), Payload(*store_, 4, 3));
  EXPECT_EQ(s.code(), Code::kIoError) << s.ToString();
  EXPECT_EQ(store_->Match(ChainKeys(3, 4)), 0u);
}

TEST_F(FaultTest, TornAndLostWritesNeverReturnWrongBytes) {
  for (Fault f : {Fault::kTornWrite, Fault::kDropWrite}) {
    const uint64_t chain = f == Fault::kTornWrite ? 4 : 5;
    engine_->AddRule({f, Op::kWrite, -1, 0, 2, 1});  // the third layer's write of the put
    ASSERT_TRUE(store_->Put(chain, ChainKeys(chain, 4), Payload(*store_, 4, chain)).ok());
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

}  // namespace
}  // namespace flatkv
