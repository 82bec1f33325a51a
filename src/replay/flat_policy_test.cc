#include "replay/flat_policy.h"

#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace flatkv::replay {
namespace {

Request Req(uint64_t conv, uint64_t first_id, uint32_t blocks, double t) {
  Request r;
  r.arrival_s = t;
  r.conversation = conv;
  r.input_tokens = blocks * 64 + 10;
  r.output_tokens = 5;
  for (uint32_t i = 0; i < blocks; ++i) r.blocks.push_back(first_id + i);
  return r;
}

// 1 MiB "true" blocks; DRAM holds 64 of them, SSD 1024.
PolicyConfig Config(const std::string& dir, IoMode io = IoMode::kModel) {
  PolicyConfig c;
  c.block_bytes = 1 << 20;
  c.block_tokens = 64;
  c.dram_bytes = 64ull << 20;
  c.ssd_bytes = 1024ull << 20;
  c.io = io;
  c.dir = dir;
  return c;
}

TEST(FlatPolicy, HitsTheStoredPrefix) {
  flatkv::testing::TempDir dir;
  auto p = MakeFlatPolicy(Config(dir.path()));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  CachePolicy& flat = *p.value();
  EXPECT_EQ(flat.name(), "flat");
  const Request a = Req(1, 100, 10, 0);
  LookupResult miss = flat.Lookup(a, 0, 0);
  EXPECT_EQ(miss.hit_blocks, 0u);
  InsertResult w = flat.Insert(a, 0, 0, 1);
  // Every block is written to its SSD home and, for the session being
  // written, to a DRAM copy.
  EXPECT_EQ(w.ssd_bytes_written, 10ull << 20);
  EXPECT_EQ(w.dram_bytes_written, 10ull << 20);
  // The next turn extends the prefix: the first 10 blocks hit, from DRAM.
  const Request b = Req(1, 100, 14, 2);
  LookupResult hit = flat.Lookup(b, 0, 2);
  EXPECT_EQ(hit.hit_blocks, 10u);
  EXPECT_EQ(hit.dram_blocks, 10u);
  EXPECT_EQ(hit.ssd_blocks, 0u);
  EXPECT_EQ(hit.dram_bytes_read, 10ull << 20);
  EXPECT_EQ(hit.real_restore_s, -1);
  // Another conversation with other ids misses.
  EXPECT_EQ(flat.Lookup(Req(2, 5000, 4, 3), 0, 3).hit_blocks, 0u);
}

TEST(FlatPolicy, SessionBeyondItsDramShareIsReadFromSsd) {
  flatkv::testing::TempDir dir;
  auto p = MakeFlatPolicy(Config(dir.path()));
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  CachePolicy& flat = *p.value();
  // Every block gets its SSD home; DRAM copies stop at the session's share,
  // the store's derived default of half of DRAM = 32 blocks = two extents.
  const Request a = Req(1, 1, 40, 0);
  (void)flat.Lookup(a, 0, 0);
  InsertResult w = flat.Insert(a, 0, 0, 1);
  EXPECT_EQ(w.ssd_bytes_written, 40ull << 20);
  EXPECT_EQ(w.dram_bytes_written, 32ull << 20);
  LookupResult hit = flat.Lookup(Req(1, 1, 41, 2), 0, 2);
  EXPECT_EQ(hit.hit_blocks, 40u);
  EXPECT_EQ(hit.dram_blocks, 32u);
  EXPECT_EQ(hit.ssd_blocks, 8u);
  EXPECT_EQ(hit.ssd_bytes_useful, 8ull << 20);
  ASSERT_GT(hit.ssd_bytes_read, 0u);
  const double amp = double(hit.ssd_bytes_read) / double(hit.ssd_bytes_useful);
  EXPECT_GE(amp, 1.0);
  EXPECT_LE(amp, 1.05);
  EXPECT_GE(hit.ssd_requests, 1u);
}

TEST(FlatPolicy, CapacitiesHold) {
  flatkv::testing::TempDir dir;
  PolicyConfig c = Config(dir.path());
  auto p = MakeFlatPolicy(c);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  CachePolicy& flat = *p.value();
  // 40 conversations of 48 blocks: 1920 blocks, far beyond DRAM + SSD.
  double t = 0;
  for (uint64_t conv = 1; conv <= 40; ++conv) {
    const Request r = Req(conv, conv * 1000, 48, t);
    const LookupResult l = flat.Lookup(r, 0, t);
    (void)flat.Insert(r, 0, l.hit_blocks, t + 0.5);
    t += 20;  // each conversation is idle by the time the next one starts
    const PolicyStats s = flat.Stats();
    EXPECT_LE(s.dram_used_bytes, c.dram_bytes);
    EXPECT_LE(s.ssd_used_bytes, c.ssd_bytes);
  }
  const PolicyStats s = flat.Stats();
  EXPECT_GT(s.evicted_blocks, 0u);
  EXPECT_EQ(s.migrated_blocks, 0u);
  // The newest conversation is still whole.
  EXPECT_EQ(flat.Lookup(Req(40, 40000, 48, t), 0, t).hit_blocks, 48u);
}

TEST(FlatPolicy, RealIoMeasuresRestores) {
  flatkv::testing::TempDir dir;
  PolicyConfig c = Config(dir.path(), IoMode::kReal);
  c.scale = 4;  // 256 KiB blocks on the real store
  auto p = MakeFlatPolicy(c);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  CachePolicy& flat = *p.value();
  const Request a = Req(1, 1, 30, 0);
  (void)flat.Lookup(a, 0, 0);
  InsertResult w = flat.Insert(a, 0, 0, 1);
  EXPECT_GE(w.real_write_s, 0);
  LookupResult hit = flat.Lookup(Req(1, 1, 31, 2), 0, 2);
  EXPECT_EQ(hit.hit_blocks, 30u);
  EXPECT_EQ(hit.dram_blocks + hit.ssd_blocks, 30u);
  EXPECT_GT(hit.real_restore_s, 0);
  // Bytes are reported unscaled.
  EXPECT_EQ(hit.dram_bytes_read + hit.ssd_bytes_useful, 30ull << 20);
}

// Conversations 2.. write 16 blocks each from t on, one a second: more than
// DRAM's 64 blocks, so older DRAM copies are reclaimed.
void Crowd(CachePolicy& p, double t, int conversations = 6) {
  for (int k = 0; k < conversations; ++k) {
    const Request r = Req(10 + k, 10'000 * (k + 1), 16, t + k);
    (void)p.Insert(r, 0, p.Lookup(r, 0, t + k).hit_blocks, t + k + 0.5);
  }
}

TEST(FlatHints, RetainsACopyForThePredictedGapAndNoLonger) {
  flatkv::testing::TempDir plain_dir, hints_dir;
  auto plain_or = MakeFlatPolicy(Config(plain_dir.path()), FlatHints::kNone);
  auto hints_or = MakeFlatPolicy(Config(hints_dir.path()), FlatHints::kAgent);
  ASSERT_TRUE(plain_or.ok() && hints_or.ok());
  CachePolicy& plain = *plain_or.value();
  CachePolicy& hints = *hints_or.value();
  EXPECT_EQ(hints.name(), "flat-hints");
  // Conversation 1: turn 1 put at t=1, turn 2 arrives at t=11 (a 10 s gap)
  // and is put at t=12, so it is retained for 12.5 s, to t=24.5.
  for (CachePolicy* p : {&plain, &hints}) {
    const Request t1 = Req(1, 1, 8, 0);
    (void)p->Arrive(t1, 0, 0, 0);
    (void)p->Insert(t1, 0, p->Lookup(t1, 0, 0).hit_blocks, 1);
    const Request t2 = Req(1, 1, 16, 11);
    (void)p->Arrive(t2, 0, 11, 0);
    (void)p->Insert(t2, 0, p->Lookup(t2, 0, 11).hit_blocks, 12);
    Crowd(*p, 13);
  }
  // At t=20 the retained copy is still in DRAM; without hints it went.
  const LookupResult a = plain.Lookup(Req(1, 1, 17, 20), 0, 20);
  const LookupResult b = hints.Lookup(Req(1, 1, 17, 20), 0, 20);
  EXPECT_EQ(a.hit_blocks, 16u);
  EXPECT_EQ(b.hit_blocks, 16u);
  EXPECT_GT(a.ssd_blocks, 0u) << "the crowd should have reclaimed conversation 1's copy";
  EXPECT_EQ(b.dram_blocks, 16u);
  // Past the ttl the copy is reclaimable like any other.
  Crowd(hints, 30);
  EXPECT_GT(hints.Lookup(Req(1, 1, 17, 40), 0, 40).ssd_blocks, 0u);
}

TEST(FlatHints, PrefetchOnArrivalBringsSsdBlocksIntoDramWithinABudgetAndSaysWhatItRead) {
  flatkv::testing::TempDir plain_dir, hints_dir;
  auto plain_or = MakeFlatPolicy(Config(plain_dir.path()), FlatHints::kNone);
  auto hints_or = MakeFlatPolicy(Config(hints_dir.path()), FlatHints::kAgent);
  ASSERT_TRUE(plain_or.ok() && hints_or.ok());
  for (CachePolicy* p : {plain_or.value().get(), hints_or.value().get()}) {
    const Request t1 = Req(1, 1, 16, 0);
    (void)p->Insert(t1, 0, p->Lookup(t1, 0, 0).hit_blocks, 1);  // no gap yet: not retained
    Crowd(*p, 2);
  }
  CachePolicy& plain = *plain_or.value();
  CachePolicy& hints = *hints_or.value();
  const Request t2 = Req(1, 1, 17, 20);
  const ArriveResult none = plain.Arrive(t2, 0, 20, 1);
  EXPECT_EQ(none.ssd_bytes_read, 0u);
  const LookupResult a = plain.Lookup(t2, 0, 20.5);
  ASSERT_GT(a.ssd_blocks, 0u) << "the crowd should have reclaimed conversation 1's copy";
  // Nothing queued ahead: admitted at once, it streams its restore itself.
  EXPECT_EQ(hints.Arrive(t2, 0, 20, 0).ssd_bytes_read, 0u);
  const ArriveResult pre = hints.Arrive(t2, 0, 20, 1);
  EXPECT_GE(pre.ssd_bytes_read, uint64_t{a.ssd_blocks} << 20);
  EXPECT_EQ(pre.dram_bytes_written, uint64_t{a.ssd_blocks} << 20);
  EXPECT_GE(pre.ssd_requests, 1u);
  // Those 16 copies are a quarter of DRAM: until t2 is restored, another
  // queued request's prefetch waits.
  ASSERT_EQ(pre.dram_bytes_written, 16ull << 20);
  const Request other = Req(10, 10'000, 17, 20);
  ASSERT_GT(plain.Lookup(other, 0, 20.5).ssd_blocks, 0u);
  EXPECT_EQ(hints.Arrive(other, 0, 20, 2).ssd_bytes_read, 0u);
  const LookupResult b = hints.Lookup(t2, 0, 20.5);
  EXPECT_EQ(b.hit_blocks, 16u);
  EXPECT_EQ(b.dram_blocks, 16u);
  EXPECT_EQ(b.ssd_bytes_read, 0u);
  EXPECT_GT(hints.Arrive(other, 0, 21, 1).ssd_bytes_read, 0u);
}

TEST(FlatPolicy, RejectsBadConfig) {
  PolicyConfig c;
  EXPECT_FALSE(MakeFlatPolicy(c).ok());
  flatkv::testing::TempDir dir;
  c = Config(dir.path());
  c.block_tokens = 8;
  EXPECT_FALSE(MakeFlatPolicy(c).ok());
}

}  // namespace
}  // namespace flatkv::replay
