// Concurrency: puts and restores from many threads (run under
// ThreadSanitizer in CI), and DRAM hits that never wait behind SSD I/O.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <thread>

#include "flatkv/codec.h"
#include "flatkv/store.h"
#include "io/fault_injection.h"
#include "testing/test_util.h"
#include "testing/zero_run_codec.h"

namespace flatkv {
namespace {

using namespace flatkv::testing;

// What the threads of a concurrency test count: wrong answers and hit blocks.
struct Tally {
  std::atomic<int> wrong{0}, hits{0};
  // A put under contention may find no space; any other error is wrong.
  void Put(const Status& st) {
    if (!st.ok() && st.code() != Code::kNoSpace) { wrong++; ADD_FAILURE() << st.ToString(); }
  }
  // The restored blocks count as hits and must be a prefix of `data`.
  void Restored(uint32_t blocks, const std::vector<std::byte>& got, const std::vector<std::byte>& data) {
    hits += blocks;
    if (!std::equal(got.begin(), got.end(), data.begin())) wrong++;
  }
};

// Runs `body(t)` for t = 0..3 on threads of their own and waits for them.
void OnFourThreads(const std::function<void(int t)>& body) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(body, t);
  for (auto& th : threads) th.join();
}

// After the threads: nothing wrong, something hit, and both media within
// their capacity.
void ExpectRightWithinCapacity(Store& store, const Tally& tally) {
  EXPECT_EQ(tally.wrong.load(), 0);
  EXPECT_GT(tally.hits.load(), 0);
  StoreStats st = store.Stats();
  EXPECT_LE(st.dram.used_bytes, st.dram.capacity_bytes);
  EXPECT_LE(st.ssd.used_bytes, st.ssd.capacity_bytes);
}

TEST(StoreConcurrencyTest, ConcurrentPutsAndRestoresSeeOnlyCorrectBytes) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 12, 48);  // small enough that eviction runs too
  o.dram_idle_after = std::chrono::milliseconds(0);
  auto s = Store::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Store& store = *s.value();
  Tally tally;
  OnFourThreads([&](int t) {
    for (int i = 0; i < 30; ++i) {
      const uint64_t chain = (t * 7 + i) % 12;  // chains overlap across threads
      const size_t blocks = 1 + chain % 6;
      auto keys = ChainKeys(chain, blocks);
      auto data = Payload(store, blocks, chain);
      tally.Put(store.Put(chain % 5, keys, data));
      std::vector<std::byte> got;
      const uint32_t n = RestoreAll(store, keys, &got);
      tally.Restored(n, got, data);
      if (i % 10 == 9) (void)store.DropSession(chain % 5);
      (void)store.Stats();
    }
  });
  ExpectRightWithinCapacity(store, tally);
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
  Tally tally;
  OnFourThreads([&](int t) {
    for (int i = 0; i < 24; ++i) {
      const uint64_t chain = (t * 5 + i) % 10;
      const size_t blocks = 1 + chain % 6;
      auto keys = ChainKeys(chain, blocks);
      auto data = Payload(store, blocks, chain);
      for (size_t b = 0; b < data.size(); b += 3) data[b] = std::byte{0};  // something for zrle to remove
      PutOptions po;
      po.codec = codecs[(chain + i) % 3];
      po.first_block = 0;
      tally.Put(store.Put(chain % 4, keys, data, po));
      std::vector<std::byte> got;
      const uint32_t n = RestoreAll(store, keys, &got);
      tally.Restored(n, got, data);
      got.clear();
      RestoreInto(store, keys, i % 2 == 0, &got);
      tally.Restored(0, got, data);  // the bytes only: hits are RestoreAll's
      if (i % 8 == 7) (void)store.DropSession(chain % 4);
      (void)store.Stats();
    }
  });
  const StoreStats st = store.Stats();
  EXPECT_EQ(st.checksum_failures + st.decode_failures, 0u);
  ExpectRightWithinCapacity(store, tally);
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
          if (!PutChain(store, 1, chain, 2).ok()) wrong++;
          std::vector<std::byte> got;
          if (RestoreAll(store, ChainKeys(chain, 2), &got) != 2 || got != Payload(store, 2, chain)) wrong++;
        }
      });
    for (auto& th : threads) th.join();
    EXPECT_EQ(wrong.load(), 0);
    for (uint64_t chain = 100; chain < 148; ++chain) {
      EXPECT_TRUE(RestoresChain(store, chain, 2)) << chain;
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
  ASSERT_TRUE(PutChain(store, 1, 1, 4).ok());
  auto codec = std::make_shared<DroppingCodec>(&store, 1);
  PutOptions po;
  po.codec = codec;
  ASSERT_TRUE(store.Put(1, ChainKeys(2, 4), Payload(store, 4, 2), po).ok());
  ASSERT_TRUE(codec->dropped_status().ok()) << codec->dropped_status().ToString();
  EXPECT_EQ(store.Match(ChainKeys(1, 4)), 0u);  // dropped
  EXPECT_EQ(store.Match(ChainKeys(2, 4)), 4u);  // stored after the drop
  ASSERT_TRUE(PutChain(store, 1, 3, 2).ok());
  EXPECT_TRUE(RestoresChain(store, 2, 4));
  EXPECT_EQ(store.Stats().sessions, 1u);
  ASSERT_TRUE(store.DropSession(1).ok());
  EXPECT_EQ(store.Stats().sessions, 0u);
  EXPECT_EQ(store.Match(ChainKeys(2, 4)), 0u);
}

// With every SSD request held behind a closed gate (a saturated SSD queue),
// a DRAM hit still restores completely: the media have separate queues.
TEST(StoreConcurrencyTest, DramHitsDoNotWaitBehindASaturatedSsdQueue) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 8, 64);
  auto engine = InjectFaults(&o);
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
  EXPECT_TRUE(RestoresChain(store, 1, 8));  // would hang if DRAM shared the SSD queue
  EXPECT_GT(engine->held(), 0u);  // the SSD restore is still stuck
  EXPECT_GE(store.Stats().ssd.queue_depth, 1u);
  engine->OpenGate();
  EXPECT_EQ(ssd_restore.value()->Finish(), 16u);
}

// With sync_writes, a put's fdatasyncs run outside the store lock: while
// one is held at the gate, other calls that take the lock go on.
TEST(StoreConcurrencyTest, WithSyncWritesNoFdatasyncRunsUnderTheStoreLock) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 8, 64);
  auto engine = InjectFaults(&o);
  o.sync_writes = true;
  auto s = Store::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  Store& store = *s.value();
  ASSERT_TRUE(PutChain(store, 1, 1, 8).ok());

  engine->CloseGate(io::Op::kSync);
  Status put;
  std::thread writer([&] { put = PutChain(store, 2, 2, 4); });  // a new extent: its record is synced
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
