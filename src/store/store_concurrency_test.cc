// Concurrency: puts and restores from many threads (run under
// ThreadSanitizer in CI), and DRAM hits that never wait behind SSD I/O.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "flatkv/codec.h"
#include "flatkv/store.h"
#include "io/fault_injection.h"
#include "testing/test_util.h"
#include "testing/zero_run_codec.h"

namespace flatkv {
namespace {

using testing::ChainKeys;
using testing::Payload;
using testing::RestoreAll;
using testing::SmallOptions;
using testing::TempDir;

TEST(StoreConcurrencyTest, ConcurrentPutsAndRestoresSeeOnlyCorrectBytes) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 12, 48);  // small enough that eviction runs too
  o.dram_idle_after = std::chrono::milliseconds(0);
  auto s = Store::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Store& store = *s.value();
  std::atomic<int> wrong{0}, hits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 30; ++i) {
        const uint64_t chain = (t * 7 + i) % 12;  // chains overlap across threads
        const size_t blocks = 1 + chain % 6;
        auto keys = ChainKeys(chain, blocks);
        auto data = Payload(store, blocks, chain);
        Status st = store.Put(chain % 5, keys, data);
        if (!st.ok() && st.code() != Code::kNoSpace) { wrong++; ADD_FAILURE() << st.ToString(); }
        std::vector<std::byte> got;
        uint32_t n = RestoreAll(store, keys, &got);
        hits += n;
        if (!std::equal(got.begin(), got.end(), data.begin())) wrong++;
        if (i % 10 == 9) (void)store.DropSession(chain % 5);
        (void)store.Stats();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(hits.load(), 0);
  StoreStats st = store.Stats();
  EXPECT_LE(st.dram.used_bytes, st.dram.capacity_bytes);
  EXPECT_LE(st.ssd.used_bytes, st.ssd.capacity_bytes);
}

// The same with coded blocks: each chain is put raw, with a fixed-size or
// with a variable-size codec, so sessions switch codecs, extents of
// several codecs share a store, and decode workers run under the restores.
TEST(StoreConcurrencyTest, ConcurrentCodedPutsAndRestoresSeeOnlyCorrectBytes) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 12, 48);
  o.dram_idle_after = std::chrono::milliseconds(0);
  o.decode_threads = 3;
  o.manifest_checkpoint_bytes = 4 << 10;  // online checkpoints run under the puts and drops too
  auto s = Store::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Store& store = *s.value();
  const std::shared_ptr<const Codec> codecs[] = {nullptr, std::shared_ptr<const Codec>(MakeCodec("raw").value()),
                                                 std::make_shared<testing::ZeroRunCodec>()};
  std::atomic<int> wrong{0}, hits{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 24; ++i) {
        const uint64_t chain = (t * 5 + i) % 10;
        const size_t blocks = 1 + chain % 6;
        auto keys = ChainKeys(chain, blocks);
        auto data = Payload(store, blocks, chain);
        for (size_t b = 0; b < data.size(); b += 3) data[b] = std::byte{0};  // something for zrle to remove
        PutOptions po;
        po.codec = codecs[(chain + i) % 3];
        po.first_block = 0;
        Status st = store.Put(chain % 4, keys, data, po);
        if (!st.ok() && st.code() != Code::kNoSpace) { wrong++; ADD_FAILURE() << st.ToString(); }
        std::vector<std::byte> got;
        hits += RestoreAll(store, keys, &got);
        if (!std::equal(got.begin(), got.end(), data.begin())) wrong++;
        got.clear();
        testing::RestoreInto(store, keys, i % 2 == 0, &got);
        if (!std::equal(got.begin(), got.end(), data.begin())) wrong++;
        if (i % 8 == 7) (void)store.DropSession(chain % 4);
        (void)store.Stats();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(hits.load(), 0);
  StoreStats st = store.Stats();
  EXPECT_EQ(st.checksum_failures + st.decode_failures, 0u);
  EXPECT_LE(st.dram.used_bytes, st.dram.capacity_bytes);
  EXPECT_LE(st.ssd.used_bytes, st.ssd.capacity_bytes);
}

// Concurrent coded puts into one session share its open extent: each
// writes its batch's sums-table entries (disjoint ranges of one region)
// before indexing, with and without DRAM copies; none sees another's.
TEST(StoreConcurrencyTest, ConcurrentCodedPutsIntoOneExtentKeepTheirSums) {
  for (uint64_t dram_extents : {0u, 12u}) {
    TempDir dir;
    StoreOptions o = SmallOptions(dir.Sub("ssd"), dram_extents, 48);
    o.codec = MakeCodec("raw").value();
    auto s = Store::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    Store& store = *s.value();
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (int i = 0; i < 12; ++i) {
          const uint64_t chain = 100 + t * 12 + i;
          if (!store.Put(1, ChainKeys(chain, 2), Payload(store, 2, chain)).ok()) wrong++;
          std::vector<std::byte> got;
          if (RestoreAll(store, ChainKeys(chain, 2), &got) != 2 || got != Payload(store, 2, chain)) wrong++;
        }
      });
    for (auto& th : threads) th.join();
    EXPECT_EQ(wrong.load(), 0);
    for (uint64_t chain = 100; chain < 148; ++chain) {
      std::vector<std::byte> got;
      EXPECT_EQ(RestoreAll(store, ChainKeys(chain, 2), &got), 2u) << chain;
      EXPECT_TRUE(got == Payload(store, 2, chain)) << chain;
    }
    EXPECT_EQ(store.Stats().checksum_failures + store.Stats().decode_failures, 0u);
  }
}

// A codec that drops the session being put while its put encodes, outside
// the store lock: the interleaving that a concurrent DropSession makes.
class DroppingCodec : public testing::ZeroRunCodec {
 public:
  DroppingCodec(Store* store, SessionId session) : store_(store), session_(session) {}
  Result<size_t> Encode(CodecContext& ctx, const SliceLayout& layout, std::span<const std::byte> in,
                        std::span<std::byte> out) const override {
    if (!dropped_.exchange(true)) dropped_status_ = store_->DropSession(session_);
    return ZeroRunCodec::Encode(ctx, layout, in, out);
  }
  Status dropped_status() const { return dropped_status_; }

 private:
  Store* store_;
  SessionId session_;
  mutable std::atomic<bool> dropped_{false};
  mutable Status dropped_status_;
};

// The session a coded put writes is dropped while the put encodes: the put
// stores its blocks in a session that is a whole one again (in the LRU
// order), so that the next put, restore and drop of it find it.
TEST(StoreConcurrencyTest, ASessionDroppedWhileItsCodedPutEncodesIsWholeAfterThePut) {
  TempDir dir;
  auto s = Store::Open(SmallOptions(dir.Sub("ssd"), 8, 64));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Store& store = *s.value();
  ASSERT_TRUE(store.Put(1, ChainKeys(1, 4), Payload(store, 4, 1)).ok());
  auto codec = std::make_shared<DroppingCodec>(&store, 1);
  PutOptions po;
  po.codec = codec;
  ASSERT_TRUE(store.Put(1, ChainKeys(2, 4), Payload(store, 4, 2), po).ok());
  ASSERT_TRUE(codec->dropped_status().ok()) << codec->dropped_status().ToString();
  EXPECT_EQ(store.Match(ChainKeys(1, 4)), 0u);  // dropped
  EXPECT_EQ(store.Match(ChainKeys(2, 4)), 4u);  // stored after the drop
  ASSERT_TRUE(store.Put(1, ChainKeys(3, 2), Payload(store, 2, 3)).ok());
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(store, ChainKeys(2, 4), &got), 4u);
  EXPECT_TRUE(got == Payload(store, 4, 2));
  EXPECT_EQ(store.Stats().sessions, 1u);
  ASSERT_TRUE(store.DropSession(1).ok());
  EXPECT_EQ(store.Stats().sessions, 0u);
  EXPECT_EQ(store.Match(ChainKeys(2, 4)), 0u);
}

// With every SSD request held behind a closed gate (a saturated SSD queue),
// a DRAM hit still restores completely: the media have separate queues.
TEST(StoreConcurrencyTest, DramHitsDoNotWaitBehindASaturatedSsdQueue) {
  TempDir dir;
  auto engine = std::make_shared<io::FaultInjectionEngine>(std::shared_ptr<io::IoEngine>(io::MakeThreadPoolEngine(2)));
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 8, 64);
  o.ssd_engine = engine;
  auto s = Store::Open(o);
  ASSERT_TRUE(s.ok());
  Store& store = *s.value();
  ASSERT_TRUE(store.Put(1, ChainKeys(1, 8), Payload(store, 8, 1), {PutHint::kHot}).ok());
  ASSERT_TRUE(store.Put(2, ChainKeys(2, 16), Payload(store, 16, 2), {PutHint::kOneShot}).ok());
  ASSERT_EQ(store.Stats().dram.blocks, 8u);

  engine->CloseGate();
  auto ssd_restore = store.StartRestore(ChainKeys(2, 16));
  ASSERT_TRUE(ssd_restore.ok());
  EXPECT_GT(engine->held(), 0u);
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(store, ChainKeys(1, 8), &got), 8u);  // would hang if DRAM shared the SSD queue
  EXPECT_TRUE(got == Payload(store, 8, 1));
  EXPECT_GT(engine->held(), 0u);  // the SSD restore is still stuck
  EXPECT_GE(store.Stats().ssd.queue_depth, 1u);
  engine->OpenGate();
  EXPECT_EQ(ssd_restore.value()->Finish(), 16u);
}

// With sync_writes, a put's fdatasyncs run outside the store lock: while
// one is held at the gate, other calls that take the lock go on.
TEST(StoreConcurrencyTest, WithSyncWritesNoFdatasyncRunsUnderTheStoreLock) {
  TempDir dir;
  auto engine = std::make_shared<io::FaultInjectionEngine>(std::shared_ptr<io::IoEngine>(io::MakeThreadPoolEngine(2)));
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 8, 64);
  o.sync_writes = true;
  o.ssd_engine = engine;
  auto s = Store::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Store& store = *s.value();
  ASSERT_TRUE(store.Put(1, ChainKeys(1, 8), Payload(store, 8, 1)).ok());

  engine->CloseGate(io::Op::kSync);
  Status put;
  std::thread writer([&] { put = store.Put(2, ChainKeys(2, 4), Payload(store, 4, 2)); });  // a new extent: its record is synced
  for (int i = 0; i < 500 && engine->held() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GT(engine->held(), 0u);
  auto match = std::async(std::launch::async, [&] { return store.Match(ChainKeys(1, 8)); });
  const bool went_on = match.wait_for(std::chrono::seconds(3)) == std::future_status::ready;
  EXPECT_TRUE(went_on) << "Match waited for the store lock while the put's fdatasync was held";
  engine->OpenGate();
  writer.join();
  EXPECT_TRUE(put.ok()) << put.ToString();
  EXPECT_EQ(match.get(), 8u);
  EXPECT_EQ(store.Match(ChainKeys(2, 4)), 4u);
}

}  // namespace
}  // namespace flatkv
