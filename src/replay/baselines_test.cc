// Tests for the baselines and bounds (tiered, files, infinite, belady) on
// small hand-built traces. MakePolicy("flat") is not exercised here.
#include "replay/baselines.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <list>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "replay/io_model.h"
#include "replay/policy.h"

namespace flatkv::replay {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

Request Req(uint64_t conv, double arrival, std::vector<uint64_t> blocks) {
  Request r;
  r.arrival_s = arrival;
  r.conversation = conv;
  r.blocks = std::move(blocks);
  r.input_tokens = static_cast<uint32_t>(r.blocks.size() * 64);
  return r;
}

std::vector<uint64_t> Range(uint64_t first, uint64_t n) {
  std::vector<uint64_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

PolicyConfig Config(uint64_t block_bytes, uint64_t dram, uint64_t ssd, uint32_t block_tokens = 64) {
  PolicyConfig c;
  c.block_bytes = block_bytes;
  c.block_tokens = block_tokens;
  c.dram_bytes = dram;
  c.ssd_bytes = ssd;
  return c;
}

std::unique_ptr<CachePolicy> Make(Result<std::unique_ptr<CachePolicy>> r) {
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

// Inserts one single-block request per block, `gap` seconds apart (so no
// lease protects an older block), returning the summed InsertResults.
InsertResult InsertSpaced(CachePolicy& p, uint64_t first, uint64_t n, double t0, double gap) {
  InsertResult sum;
  for (uint64_t i = 0; i < n; ++i) {
    const Request r = Req(first + i, t0 + gap * double(i), {first + i});
    const InsertResult w = p.Insert(r, 0, 0, r.arrival_s);
    sum.dram_bytes_written += w.dram_bytes_written;
    sum.ssd_bytes_written += w.ssd_bytes_written;
    sum.ssd_requests += w.ssd_requests;
  }
  return sum;
}

void ExpectWithin(const CachePolicy& p, const PolicyConfig& c) {
  const PolicyStats s = p.Stats();
  EXPECT_LE(s.dram_used_bytes, c.dram_bytes) << p.name();
  EXPECT_LE(s.ssd_used_bytes, c.ssd_bytes) << p.name();
}

// ---- tiered -----------------------------------------------------------------

// 40 MiB of DRAM: 10 MiB staging (a quarter, below Mooncake's 1.25 GiB) and
// a 30-block pool whose 90% watermark is 27 blocks.
TEST(TieredPolicy, HighWatermarkEvictsFivePercentOfObjects) {
  const PolicyConfig c = Config(kMiB, 40 * kMiB, 1024 * kMiB);
  auto p = Make(MakeTieredPolicy(c));
  InsertSpaced(*p, 1, 26, 0, 100);
  EXPECT_EQ(p->Stats().dram_used_bytes, 26 * kMiB);
  EXPECT_EQ(p->Stats().migrated_blocks, 0u);
  InsertSpaced(*p, 27, 1, 2600, 100);  // 27 >= 0.9 * 30: evict ceil(27 * 5%) = 2
  EXPECT_EQ(p->Stats().dram_used_bytes, 25 * kMiB);
  EXPECT_EQ(p->Stats().migrated_blocks, 2u);
  EXPECT_GT(p->Stats().ssd_used_bytes, 2 * kMiB);
  InsertSpaced(*p, 28, 1, 2700, 100);  // 26: below the watermark
  EXPECT_EQ(p->Stats().dram_used_bytes, 26 * kMiB);
  InsertSpaced(*p, 29, 1, 2800, 100);  // 27 again: 2 more
  EXPECT_EQ(p->Stats().dram_used_bytes, 25 * kMiB);
  EXPECT_EQ(p->Stats().migrated_blocks, 4u);
  // The two least recently used (blocks 1 and 2) were demoted; block 5 was not.
  LookupResult r = p->Lookup(Req(1, 3000, {1}), 0, 3000);
  EXPECT_EQ(r.ssd_blocks, 1u);
  r = p->Lookup(Req(5, 3001, {5}), 0, 3001);
  EXPECT_EQ(r.dram_blocks, 1u);
  ExpectWithin(*p, c);
}

TEST(TieredPolicy, LeasedObjectsAreNotEvicted) {
  // Blocks 1..20 are read at t=100 (a lease until 105). A put of 40 more at
  // t=101 evicts the new, unleased objects around them; at t=200 the lease
  // has expired and the same put evicts blocks 1..20 first.
  for (const double put_at : {101.0, 200.0}) {
    const PolicyConfig c = Config(kMiB, 40 * kMiB, 1024 * kMiB);
    auto p = Make(MakeTieredPolicy(c));
    p->Insert(Req(1, 0, Range(1, 20)), 0, 0, 0);
    EXPECT_EQ(p->Lookup(Req(1, 100, Range(1, 20)), 0, 100).dram_blocks, 20u);
    const InsertResult w = p->Insert(Req(2, put_at, Range(101, 40)), 0, 0, put_at);
    EXPECT_EQ(w.dram_bytes_written, 40 * kMiB);  // every put found room
    const LookupResult r = p->Lookup(Req(1, put_at + 1, Range(1, 20)), 0, put_at + 1);
    EXPECT_EQ(r.hit_blocks, 20u);
    if (put_at < 105) {
      EXPECT_EQ(r.dram_blocks, 20u);
    } else {
      EXPECT_GT(r.ssd_blocks, 0u);
    }
    ExpectWithin(*p, c);
  }
}

TEST(TieredPolicy, UnleasedPutsMakeRoomWhenTheRestIsLeased) {
  const PolicyConfig c = Config(kMiB, 40 * kMiB, 1024 * kMiB);  // pool of 30 objects
  auto p = Make(MakeTieredPolicy(c));
  p->Insert(Req(1, 0, Range(1, 26)), 0, 0, 0);
  EXPECT_EQ(p->Lookup(Req(1, 100, Range(1, 26)), 0, 100).dram_blocks, 26u);  // all leased until 105
  // Unleased puts are evicted (demoted) to make room for later ones; none is lost.
  const InsertResult w = p->Insert(Req(2, 101, Range(101, 10)), 0, 0, 101);
  EXPECT_EQ(w.dram_bytes_written, 10 * kMiB);
  EXPECT_GT(p->Stats().migrated_blocks, 0u);
  EXPECT_EQ(p->Lookup(Req(2, 102, Range(101, 10)), 0, 102).hit_blocks, 10u);
  ExpectWithin(*p, c);
}

TEST(TieredPolicy, BucketsCloseAtFiveHundredKeys) {
  // 4 KiB objects: the key limit binds long before 256 MB.
  const PolicyConfig c = Config(4096, 400 * 4096, 1024 * kMiB);  // pool 300, watermark 270
  auto p = Make(MakeTieredPolicy(c));
  const InsertResult w = InsertSpaced(*p, 1, 2000, 0, 10);
  const uint64_t demoted = p->Stats().migrated_blocks;
  ASSERT_GT(demoted, 1500u);
  EXPECT_EQ(w.ssd_requests, (demoted - 1) / 500);  // one WriteBucket per closed bucket; the last is open
  EXPECT_EQ(w.ssd_bytes_written, demoted * (96 + 4096));
  ExpectWithin(*p, c);
}

TEST(TieredPolicy, BucketsCloseAt256MB) {
  // 64 MiB objects: four fill a bucket, the fifth opens the next.
  const PolicyConfig c = Config(64 * kMiB, 1024 * kMiB, 100ull * 1024 * kMiB);  // pool 12, watermark 10.8
  auto p = Make(MakeTieredPolicy(c));
  const InsertResult w = InsertSpaced(*p, 1, 30, 0, 100);
  EXPECT_EQ(p->Stats().migrated_blocks, 20u);  // DRAM settles at 10 objects
  EXPECT_EQ(w.ssd_requests, 4u);               // buckets of 4; the fifth is still open
  ExpectWithin(*p, c);
}

TEST(TieredPolicy, DemotesInEvictionOrderAtUnalignedOffsets) {
  // Records are [96-byte key | 4096-byte value] back to back, so value i of a
  // bucket starts at i * 4192 + 96: 4 KiB aligned only for i = 127, whose
  // read is one page; every other object's read spans two pages.
  const PolicyConfig c = Config(4096, 400 * 4096, 1024 * kMiB);
  auto p = Make(MakeTieredPolicy(c));
  InsertSpaced(*p, 1, 600, 0, 10);  // blocks 1.. are demoted first, in order
  LookupResult r = p->Lookup(Req(128, 7000, {128}), 0, 7000);
  ASSERT_EQ(r.ssd_blocks, 1u);
  EXPECT_EQ(r.ssd_bytes_read, 4096u);
  EXPECT_EQ(r.ssd_bytes_useful, 4096u);
  r = p->Lookup(Req(127, 7001, {127}), 0, 7001);
  ASSERT_EQ(r.ssd_blocks, 1u);
  EXPECT_EQ(r.ssd_bytes_read, 8192u);
  EXPECT_EQ(r.ssd_requests, 1u);
}

TEST(TieredPolicy, SsdHitIsOneReadPerObjectAndIsPromoted) {
  const PolicyConfig c = Config(kMiB, 40 * kMiB, 1024 * kMiB);
  auto p = Make(MakeTieredPolicy(c));
  p->Insert(Req(1, 0, Range(1, 8)), 0, 0, 0);
  InsertSpaced(*p, 100, 40, 100, 100);  // pushes blocks 1..8 to SSD
  const uint64_t migrated = p->Stats().migrated_blocks;
  LookupResult r = p->Lookup(Req(1, 5000, Range(1, 10)), 0, 5000);
  EXPECT_EQ(r.hit_blocks, 8u);
  EXPECT_EQ(r.ssd_blocks, 8u);
  EXPECT_EQ(r.ssd_requests, 8u);  // one per object, not one per bucket
  EXPECT_EQ(r.ssd_bytes_useful, 8 * kMiB);
  EXPECT_GE(r.ssd_bytes_read, r.ssd_bytes_useful);
  EXPECT_LE(r.ssd_bytes_read, r.ssd_bytes_useful + 8 * 8192);
  EXPECT_GE(p->Stats().migrated_blocks, migrated + 8);  // promotions
  r = p->Lookup(Req(1, 5100, Range(1, 10)), 0, 5100);
  EXPECT_EQ(r.dram_blocks, 8u);
  EXPECT_EQ(r.ssd_blocks, 0u);
  ExpectWithin(*p, c);
}

TEST(TieredPolicy, WithoutPromotionAnSsdHitStaysOnSsd) {
  // Mooncake's default (--promotion_on_hit false): the hit is served from
  // staging and the next lookup reads SSD again.
  const PolicyConfig c = Config(kMiB, 40 * kMiB, 1024 * kMiB);
  auto p = Make(MakePolicy("tiered-nopromo", c));
  EXPECT_EQ(p->name(), "tiered-nopromo");
  EXPECT_FALSE(p->layerwise());
  p->Insert(Req(1, 0, Range(1, 8)), 0, 0, 0);
  InsertSpaced(*p, 100, 40, 100, 100);  // pushes blocks 1..8 to SSD
  const uint64_t migrated = p->Stats().migrated_blocks;
  LookupResult r = p->Lookup(Req(1, 5000, Range(1, 10)), 0, 5000);
  EXPECT_EQ(r.ssd_blocks, 8u);
  EXPECT_EQ(p->Stats().migrated_blocks, migrated) << "no promotions";
  r = p->Lookup(Req(1, 5100, Range(1, 10)), 0, 5100);
  EXPECT_EQ(r.ssd_blocks, 8u);
  EXPECT_EQ(r.dram_blocks, 0u);
  auto lw = Make(MakePolicy("tiered-lw-nopromo", c));
  EXPECT_EQ(lw->name(), "tiered-lw-nopromo");
  EXPECT_TRUE(lw->layerwise());
  EXPECT_FALSE(lw->ssd_layerwise()) << "Mooncake objects hold every layer: read whole";
  EXPECT_EQ(lw->dram_copy_threads(), 0u) << "DMA from registered host memory";
}

TEST(TieredPolicy, AbortsWhenStagingIsTaken) {
  // Staging is 10 MiB: restoring A's ten 1 MiB objects takes all of it
  // until A's reads finish, so B's SSD objects are aborted meanwhile.
  const PolicyConfig c = Config(kMiB, 40 * kMiB, 1024 * kMiB);
  auto p = Make(MakeTieredPolicy(c));
  p->Insert(Req(1, 0, Range(1, 10)), 0, 0, 0);
  p->Insert(Req(2, 100, Range(101, 5)), 0, 0, 100);
  InsertSpaced(*p, 1000, 40, 200, 100);
  const LookupResult a = p->Lookup(Req(1, 5000, Range(1, 10)), 0, 5000);
  EXPECT_EQ(a.ssd_blocks, 10u);
  EXPECT_EQ(a.aborted_blocks, 0u);
  EXPECT_EQ(p->Stats().dram_used_bytes % kMiB, 0u);
  ExpectWithin(*p, c);
  const LookupResult b = p->Lookup(Req(2, 5000.001, Range(101, 5)), 0, 5000.001);
  EXPECT_EQ(b.hit_blocks, 0u);
  EXPECT_EQ(b.aborted_blocks, 5u);
  // Once A's reads are done the staging is free again.
  const LookupResult b2 = p->Lookup(Req(2, 5010, Range(101, 5)), 0, 5010);
  EXPECT_EQ(b2.hit_blocks, 5u);
  EXPECT_EQ(b2.ssd_blocks, 5u);
  EXPECT_EQ(b2.aborted_blocks, 0u);
}

TEST(TieredPolicy, EachInstanceHasItsOwnStaging) {
  // Two instances, each client with 10 MiB of staging (80 MiB / 4 / 2): A's
  // restore on instance 0 takes all of its client's, not instance 1's.
  PolicyConfig c = Config(kMiB, 80 * kMiB, 1024 * kMiB);
  c.instances = 2;
  auto p = Make(MakeTieredPolicy(c));
  p->Insert(Req(1, 0, Range(1, 10)), 0, 0, 0);
  p->Insert(Req(2, 100, Range(101, 5)), 1, 0, 100);
  InsertSpaced(*p, 1000, 80, 200, 50);
  const LookupResult a = p->Lookup(Req(1, 5000, Range(1, 10)), 0, 5000);
  ASSERT_EQ(a.ssd_blocks, 10u);
  const LookupResult b = p->Lookup(Req(2, 5000.001, Range(101, 5)), 1, 5000.001);
  EXPECT_EQ(b.aborted_blocks, 0u);
  EXPECT_EQ(b.ssd_blocks, 5u);
  ExpectWithin(*p, c);
}

TEST(TieredPolicy, StagingHoldsFollowTheRunsIoModel) {
  // The same contention as AbortsWhenStagingIsTaken, on a disk 1000x
  // faster: A's reads are over before B looks, so B is not aborted.
  PolicyConfig c = Config(kMiB, 40 * kMiB, 1024 * kMiB);
  IoModel fast;
  fast.ssd_read_gbps = 2000;
  fast.ssd_request_us = 0.06;
  c.io_model = &fast;
  auto p = Make(MakeTieredPolicy(c));
  p->Insert(Req(1, 0, Range(1, 10)), 0, 0, 0);
  p->Insert(Req(2, 100, Range(101, 5)), 0, 0, 100);
  InsertSpaced(*p, 1000, 40, 200, 100);
  ASSERT_EQ(p->Lookup(Req(1, 5000, Range(1, 10)), 0, 5000).ssd_blocks, 10u);
  const LookupResult b = p->Lookup(Req(2, 5000.001, Range(101, 5)), 0, 5000.001);
  EXPECT_EQ(b.aborted_blocks, 0u);
  EXPECT_EQ(b.hit_blocks, 5u);
}

TEST(TieredPolicy, SsdFullEvictsOldestBucketWhole) {
  // SSD holds two 4-object buckets of 64 MiB objects (plus metadata).
  const PolicyConfig c = Config(64 * kMiB, 1024 * kMiB, 2 * 256 * kMiB + 4096);
  auto p = Make(MakeTieredPolicy(c));
  InsertSpaced(*p, 1, 30, 0, 100);
  ExpectWithin(*p, c);
  EXPECT_GT(p->Stats().evicted_blocks, 0u);
  // Block 1 was demoted first; its bucket was reclaimed, so it is gone.
  EXPECT_EQ(p->Lookup(Req(1, 9000, {1}), 0, 9000).hit_blocks, 0u);
}

// kReal helpers: a fresh scratch directory, and the .bucket files in it.
std::string TempDir(const char* prefix) {
  std::string tmpl = std::string("/tmp/") + prefix + "_XXXXXX";
  EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

std::vector<std::string> BucketFiles(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& f : std::filesystem::directory_iterator(dir))
    if (f.path().extension() == ".bucket") out.push_back(f.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

bool Has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(TieredPolicy, RealIoMatchesTheModel) {
  // 64 MiB objects (4 per bucket), an SSD of two buckets: demotions, SSD
  // hits, promotions and FIFO bucket reclaim all happen; scale 256 makes the
  // real values 256 KiB.
  const PolicyConfig cm = Config(64 * kMiB, 1024 * kMiB, 2 * 256 * kMiB + 4096);
  PolicyConfig cr = cm;
  cr.io = IoMode::kReal;
  cr.dir = TempDir("flatkv_tiered");
  cr.scale = 256;
  auto model = Make(MakeTieredPolicy(cm));
  auto real = Make(MakeTieredPolicy(cr));
  ASSERT_NE(model, nullptr);
  ASSERT_NE(real, nullptr);
  uint32_t ssd_hits = 0, misses = 0;
  bool saw_first_bucket = false;
  for (uint64_t i = 1; i <= 40; ++i) {
    const double t = 100.0 * double(i);
    const Request ins = Req(i, t, {i});
    const InsertResult wm = model->Insert(ins, 0, 0, t);
    const InsertResult wr = real->Insert(ins, 0, 0, t);
    EXPECT_EQ(wm.real_write_s, -1.0);
    EXPECT_GE(wr.real_write_s, 0.0);
    EXPECT_EQ(wr.ssd_bytes_written, wm.ssd_bytes_written) << i;
    EXPECT_EQ(wr.dram_bytes_written, wm.dram_bytes_written) << i;
    if (Has(BucketFiles(cr.dir), "0.bucket")) saw_first_bucket = true;
    const uint64_t first = i >= 13 ? i - 12 - i % 7 : 1;  // some in DRAM, some on SSD, some gone
    const Request lk = Req(100 + i, t + 50, Range(first, 3));
    const LookupResult rm = model->Lookup(lk, 0, t + 50);
    const LookupResult rr = real->Lookup(lk, 0, t + 50);
    EXPECT_EQ(rm.real_restore_s, -1.0);
    EXPECT_EQ(rr.hit_blocks, rm.hit_blocks) << i;
    EXPECT_EQ(rr.dram_blocks, rm.dram_blocks) << i;
    EXPECT_EQ(rr.ssd_blocks, rm.ssd_blocks) << i;
    EXPECT_EQ(rr.aborted_blocks, rm.aborted_blocks) << i;
    EXPECT_EQ(rr.ssd_bytes_read, rm.ssd_bytes_read) << i;
    if (rr.ssd_blocks > 0) {
      EXPECT_GT(rr.real_restore_s, 0.0) << i;
    } else {
      EXPECT_GE(rr.real_restore_s, 0.0) << i;
    }
    ssd_hits += rm.ssd_blocks;
    misses += lk.blocks.size() > rm.hit_blocks ? 1 : 0;
    const PolicyStats sm = model->Stats(), sr = real->Stats();
    EXPECT_EQ(sr.dram_used_bytes, sm.dram_used_bytes) << i;
    EXPECT_EQ(sr.ssd_used_bytes, sm.ssd_used_bytes) << i;
    EXPECT_EQ(sr.evicted_blocks, sm.evicted_blocks) << i;
    EXPECT_EQ(sr.migrated_blocks, sm.migrated_blocks) << i;
  }
  EXPECT_GT(ssd_hits, 0u);
  EXPECT_GT(misses, 0u);
  EXPECT_GT(model->Stats().evicted_blocks, 0u);  // buckets were reclaimed
  // The first bucket file appeared, and was deleted with its bucket; at most
  // the two buckets the SSD holds (plus an open one being formed) remain.
  EXPECT_TRUE(saw_first_bucket);
  const std::vector<std::string> left = BucketFiles(cr.dir);
  EXPECT_FALSE(Has(left, "0.bucket"));
  EXPECT_FALSE(left.empty());
  EXPECT_LE(left.size(), 3u);
  std::filesystem::remove_all(cr.dir);
}

TEST(TieredPolicy, RealIoDeletedBucketIsAMiss) {
  PolicyConfig c = Config(kMiB, 40 * kMiB, 1024 * kMiB);
  c.io = IoMode::kReal;
  c.dir = TempDir("flatkv_tiered");
  c.scale = 16;  // 64 KiB values
  auto p = Make(MakeTieredPolicy(c));
  ASSERT_NE(p, nullptr);
  p->Insert(Req(1, 0, Range(1, 8)), 0, 0, 0);
  InsertSpaced(*p, 100, 40, 100, 100);  // pushes blocks 1..8 to SSD, in bucket 0
  ASSERT_TRUE(Has(BucketFiles(c.dir), "0.bucket"));
  // Block 9 has never been stored: the read path works before the deletion.
  LookupResult r = p->Lookup(Req(1, 5000, Range(1, 1)), 0, 5000);
  EXPECT_EQ(r.ssd_blocks, 1u);
  EXPECT_GT(r.real_restore_s, 0.0);
  ASSERT_EQ(::unlink((c.dir + "/0.bucket").c_str()), 0);
  r = p->Lookup(Req(1, 5001, Range(2, 7)), 0, 5001);
  EXPECT_EQ(r.hit_blocks, 0u);
  EXPECT_EQ(r.ssd_blocks, 0u);
  EXPECT_GE(r.real_restore_s, 0.0);
  EXPECT_EQ(p->Lookup(Req(1, 5002, Range(2, 7)), 0, 5002).hit_blocks, 0u);  // block 2 was dropped
  r = p->Lookup(Req(1, 5003, Range(3, 6)), 0, 5003);                         // block 3's read fails too
  EXPECT_EQ(r.hit_blocks, 0u);
  // Block 1 was promoted before the deletion and still hits from DRAM.
  r = p->Lookup(Req(1, 5004, Range(1, 1)), 0, 5004);
  EXPECT_EQ(r.dram_blocks, 1u);
  ExpectWithin(*p, c);
  // Blocks 2 and 3 (dropped) are stored again; 4..8 still point into the
  // deleted bucket (a put of an existing key is rejected), so the prefix ends
  // at block 4, whose failed read drops it.
  p->Insert(Req(2, 5005, Range(2, 7)), 0, 0, 5005);
  r = p->Lookup(Req(2, 5006, Range(2, 7)), 0, 5006);
  EXPECT_EQ(r.hit_blocks, 2u);
  EXPECT_EQ(r.dram_blocks, 2u);
  EXPECT_EQ(r.ssd_blocks, 0u);
  std::filesystem::remove_all(c.dir);
}

TEST(TieredPolicy, RealIoNeedsADirectory) {
  PolicyConfig c = Config(kMiB, 40 * kMiB, 40 * kMiB);
  c.io = IoMode::kReal;
  auto r = MakeTieredPolicy(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
}

// ---- files ------------------------------------------------------------------

TEST(FilesPolicy, EachInstanceHasItsOwnCaches) {
  // One LMCache engine per instance, each with half the node's capacities.
  PolicyConfig c = Config(kMiB, 16 * kMiB, 32 * kMiB);
  c.instances = 2;
  auto p = Make(MakeFilesPolicy(c));
  p->Insert(Req(1, 0, Range(1, 8)), 0, 0, 0);
  EXPECT_EQ(p->Lookup(Req(1, 1, Range(1, 8)), 1, 1).hit_blocks, 0u);  // not in instance 1's caches
  EXPECT_EQ(p->Lookup(Req(1, 2, Range(1, 8)), 0, 2).dram_blocks, 8u);
  p->Insert(Req(2, 3, Range(101, 8)), 0, 0, 3);  // instance 0's 8 MiB hot cache: request 1 goes to disk
  EXPECT_EQ(p->Lookup(Req(1, 4, Range(1, 8)), 0, 4).ssd_blocks, 8u);
  ExpectWithin(*p, c);
}

// 64-token blocks: a 256-token chunk is 4 blocks (4 MiB); 2 chunks of DRAM, 4 of disk.
TEST(FilesPolicy, HotCacheInFrontOfOneFilePerChunk) {
  const PolicyConfig c = Config(kMiB, 8 * kMiB, 16 * kMiB);
  auto p = Make(MakeFilesPolicy(c));
  InsertResult w = p->Insert(Req(1, 0, Range(1, 10)), 0, 0, 0);  // 2 full chunks + 2 blocks not stored
  EXPECT_EQ(w.dram_bytes_written, 8 * kMiB);
  EXPECT_EQ(w.ssd_bytes_written, 8 * kMiB);
  EXPECT_EQ(w.ssd_requests, 2u);
  LookupResult r = p->Lookup(Req(1, 1, Range(1, 10)), 0, 1);
  EXPECT_EQ(r.hit_blocks, 8u);
  EXPECT_EQ(r.dram_blocks, 8u);
  EXPECT_EQ(r.dram_requests, 2u);
  p->Insert(Req(2, 2, Range(101, 8)), 0, 0, 2);  // pushes request 1's chunks out of DRAM
  r = p->Lookup(Req(1, 3, Range(1, 10)), 0, 3);
  EXPECT_EQ(r.hit_blocks, 8u);
  EXPECT_EQ(r.ssd_blocks, 8u);
  EXPECT_EQ(r.ssd_requests, 2u);
  EXPECT_EQ(r.ssd_bytes_read, 8 * kMiB);  // whole files, all of them used
  EXPECT_EQ(r.ssd_bytes_useful, 8 * kMiB);
  r = p->Lookup(Req(1, 4, Range(1, 10)), 0, 4);  // written back to the hot cache
  EXPECT_EQ(r.dram_blocks, 8u);
  ExpectWithin(*p, c);
}

TEST(FilesPolicy, DiskIsLruAndCapacityBound) {
  const PolicyConfig c = Config(kMiB, 8 * kMiB, 16 * kMiB);
  auto p = Make(MakeFilesPolicy(c));
  p->Insert(Req(1, 0, Range(1, 8)), 0, 0, 0);
  p->Insert(Req(2, 1, Range(101, 8)), 0, 0, 1);
  p->Lookup(Req(1, 2, Range(1, 8)), 0, 2);       // request 1's files are now the most recent
  p->Insert(Req(3, 3, Range(201, 8)), 0, 0, 3);  // disk full: evicts request 2's files
  ExpectWithin(*p, c);
  EXPECT_EQ(p->Lookup(Req(2, 4, Range(101, 8)), 0, 4).hit_blocks, 0u);
  EXPECT_EQ(p->Lookup(Req(1, 5, Range(1, 8)), 0, 5).hit_blocks, 8u);
  EXPECT_EQ(p->Stats().ssd_used_bytes, 16 * kMiB);
  EXPECT_EQ(p->Stats().dram_used_bytes, 8 * kMiB);
}

TEST(FilesPolicy, LargeBlocksAreSeveralChunkFiles) {
  const PolicyConfig c = Config(2 * kMiB, 8 * kMiB, 64 * kMiB, 512);  // 512-token blocks: 2 files each
  auto p = Make(MakeFilesPolicy(c));
  const InsertResult w = p->Insert(Req(1, 0, Range(1, 3)), 0, 0, 0);
  EXPECT_EQ(w.ssd_requests, 6u);
  p->Insert(Req(2, 1, Range(101, 4)), 0, 0, 1);
  const LookupResult r = p->Lookup(Req(1, 2, Range(1, 3)), 0, 2);
  EXPECT_EQ(r.hit_blocks, 3u);
  EXPECT_EQ(r.ssd_requests, 6u);
}

TEST(FilesPolicy, RealIoWritesAndReadsChunkFiles) {
  char tmpl[] = "/tmp/flatkv_files_XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  PolicyConfig c = Config(kMiB, 8 * kMiB, 16 * kMiB);
  c.io = IoMode::kReal;
  c.dir = tmpl;
  c.scale = 16;  // 256 KiB files
  auto p = Make(MakeFilesPolicy(c));
  const InsertResult w = p->Insert(Req(1, 0, Range(1, 8)), 0, 0, 0);
  EXPECT_GE(w.real_write_s, 0.0);
  p->Insert(Req(2, 1, Range(101, 8)), 0, 0, 1);
  const LookupResult r = p->Lookup(Req(1, 2, Range(1, 8)), 0, 2);
  EXPECT_EQ(r.ssd_blocks, 8u);
  EXPECT_GT(r.real_restore_s, 0.0);
  std::string cmd = std::string("rm -rf ") + tmpl;
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

// ---- bounds -----------------------------------------------------------------

TEST(FilesPolicy, LayerwiseChunksArePerLayerObjectsReadInWholePages) {
  // files-lw (LMCache use_layerwise): a 4-block chunk of 1 MiB blocks is, at
  // 10 layers, 10 objects of 419,430 B (103 pages when read) and, at 3
  // layers, 3 of 1,398,101 B (342 pages).
  for (uint32_t layers : {10u, 3u}) {
    PolicyConfig c = Config(kMiB, 0, 64 * kMiB);
    c.layers = layers;
    auto p = Make(MakePolicy("files-lw", c));
    EXPECT_EQ(p->name(), "files-lw");
    EXPECT_TRUE(p->layerwise());
    EXPECT_TRUE(p->ssd_layerwise());
    EXPECT_FALSE(p->serial_ssd_reads());
    const InsertResult w = p->Insert(Req(1, 0, Range(1, 8)), 0, 0, 0);
    EXPECT_EQ(w.ssd_requests, 2 * layers);
    const LookupResult r = p->Lookup(Req(1, 1, Range(1, 8)), 0, 1);
    EXPECT_EQ(r.ssd_blocks, 8u);
    EXPECT_EQ(r.ssd_requests, 2 * layers) << "one request per chunk per layer";
    const uint64_t span = (4 * kMiB / layers + 4095) / 4096 * 4096;
    EXPECT_EQ(r.ssd_bytes_read, 2 * layers * span);
    EXPECT_EQ(r.ssd_bytes_useful, 8 * kMiB);
  }
  PolicyConfig c = Config(kMiB, 0, 64 * kMiB);  // no layers: cannot split
  EXPECT_FALSE(MakePolicy("files-lw", c).ok());
}

TEST(InfinitePolicy, EverythingEverStoredHits) {
  auto p = Make(MakeInfinitePolicy(Config(kMiB, 0, 0)));
  EXPECT_EQ(p->Lookup(Req(1, 0, Range(1, 5)), 0, 0).hit_blocks, 0u);
  p->Insert(Req(1, 0, Range(1, 5)), 0, 0, 0);
  const LookupResult r = p->Lookup(Req(1, 1, Range(1, 9)), 0, 1);
  EXPECT_EQ(r.hit_blocks, 5u);
  EXPECT_EQ(r.dram_blocks, 5u);
  p->Insert(Req(1, 1, Range(1, 9)), 0, 5, 1);
  EXPECT_EQ(p->Lookup(Req(1, 2, Range(1, 9)), 0, 2).hit_blocks, 9u);
}

// Replays single-block requests through `p`; returns the hits.
uint64_t Replay(CachePolicy& p, const Trace& t) {
  uint64_t hits = 0;
  for (const Request& r : t.requests) {
    const uint32_t h = p.Lookup(r, 0, r.arrival_s).hit_blocks;
    hits += h;
    p.Insert(r, 0, h, r.arrival_s);
  }
  return hits;
}

uint64_t LruHits(const std::vector<uint64_t>& seq, size_t cap) {
  std::list<uint64_t> l;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> m;
  uint64_t hits = 0;
  for (uint64_t b : seq) {
    auto it = m.find(b);
    if (it != m.end()) {
      ++hits;
      l.splice(l.end(), l, it->second);
      continue;
    }
    if (m.size() == cap) {
      m.erase(l.front());
      l.pop_front();
    }
    m[b] = l.insert(l.end(), b);
  }
  return hits;
}

Trace SingleBlockTrace(const std::vector<uint64_t>& seq) {
  Trace t;
  t.block_tokens = 64;
  for (size_t i = 0; i < seq.size(); ++i) t.requests.push_back(Req(i + 1, double(i), {seq[i]}));
  t.conversations = seq.size();
  return t;
}

TEST(BeladyPolicy, MatchesTheHandComputedOptimum) {
  // Capacity 2 blocks. OPT (with bypass) keeps {1, 2} throughout: hits at
  // positions 3, 4, 6, 7. LRU hits nothing.
  const std::vector<uint64_t> seq = {1, 2, 3, 1, 2, 4, 1, 2, 3, 4};
  const Trace t = SingleBlockTrace(seq);
  PolicyConfig c = Config(kMiB, kMiB, kMiB);
  c.trace = &t;
  auto p = Make(MakeBeladyPolicy(c));
  EXPECT_EQ(Replay(*p, t), 4u);
  EXPECT_EQ(LruHits(seq, 2), 0u);
  ExpectWithin(*p, c);
}

TEST(BeladyPolicy, NeverWorseThanLru) {
  std::mt19937_64 rng(7);
  for (int round = 0; round < 5; ++round) {
    std::vector<uint64_t> seq(2000);
    for (auto& b : seq) b = 1 + (rng() % 64) * (rng() % 3 == 0 ? 1 : 0) + rng() % 40;
    const Trace t = SingleBlockTrace(seq);
    PolicyConfig c = Config(kMiB, 10 * kMiB, 6 * kMiB);
    c.trace = &t;
    auto p = Make(MakeBeladyPolicy(c));
    const uint64_t opt = Replay(*p, t);
    EXPECT_GE(opt, LruHits(seq, 16));
    ExpectWithin(*p, c);
  }
}

TEST(BeladyPolicy, FindsCopiedRequestsByConversationAndArrival) {
  const std::vector<uint64_t> seq = {1, 2, 3, 1, 2, 4, 1, 2, 3, 4};
  const Trace t = SingleBlockTrace(seq);
  PolicyConfig c = Config(kMiB, kMiB, kMiB);
  c.trace = &t;
  auto p = Make(MakeBeladyPolicy(c));
  uint64_t hits = 0;
  for (const Request& orig : t.requests) {
    const Request r = orig;  // a copy, not the trace's own object
    const uint32_t h = p->Lookup(r, 0, r.arrival_s).hit_blocks;
    hits += h;
    p->Insert(r, 0, h, r.arrival_s);
  }
  EXPECT_EQ(hits, 4u);
}

TEST(BeladyPolicy, NeedsTheTrace) {
  auto r = MakeBeladyPolicy(Config(kMiB, kMiB, kMiB));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
}

// ---- all policies -----------------------------------------------------------

TEST(Baselines, CapacitiesAreNeverExceeded) {
  std::mt19937_64 rng(11);
  Trace t;
  t.block_tokens = 64;
  for (int i = 0; i < 600; ++i) {
    const uint64_t conv = rng() % 12;
    const uint64_t len = 1 + rng() % 40;
    std::vector<uint64_t> blocks(len);
    for (uint64_t j = 0; j < len; ++j) blocks[j] = conv * 1000 + j + (rng() % 8 == 0 ? 500 : 0);
    t.requests.push_back(Req(conv, 0.5 * i, blocks));
  }
  for (const char* name : {"tiered", "tiered-lw", "tiered-nopromo", "tiered-lw-nopromo", "files", "files-lw", "belady"}) {
    PolicyConfig c = Config(kMiB, 48 * kMiB, 96 * kMiB);
    c.trace = &t;
    c.layers = 8;
    auto p = Make(MakePolicy(name, c));
    ASSERT_NE(p, nullptr);
    for (const Request& r : t.requests) {
      const LookupResult lk = p->Lookup(r, 0, r.arrival_s);
      EXPECT_EQ(lk.hit_blocks, lk.dram_blocks + lk.ssd_blocks) << name;
      EXPECT_LE(lk.hit_blocks, r.blocks.size()) << name;
      ExpectWithin(*p, c);
      p->Insert(r, 0, lk.hit_blocks, r.arrival_s + 0.2);
      ExpectWithin(*p, c);
    }
  }
}

TEST(Baselines, MakePolicyRejectsUnknownNames) {
  auto r = MakePolicy("lru", Config(kMiB, kMiB, kMiB));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("tiered"), std::string::npos);
  EXPECT_NE(r.status().message().find("lru"), std::string::npos);
}

}  // namespace
}  // namespace flatkv::replay
