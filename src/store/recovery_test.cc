// Durability: restart after a clean close and after kill -9 mid-write;
// damaged segments and manifests end in misses, never in wrong bytes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "flatkv/codec.h"
#include "flatkv/store.h"
#include "persist/manifest.h"
#include "testing/test_util.h"

namespace flatkv {
namespace {

using namespace flatkv::testing;


TEST(RecoveryTest, EveryBlockSurvivesACleanRestartAndDramCopiesDoNot) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 8, 64);
  o.session_dram_share_bytes = kSmallExtentBytes;  // a DRAM copy of one extent
  {
    auto store = OpenStore(o);
    ASSERT_TRUE(PutChain(*store, 1, 1, 12).ok());
    EXPECT_EQ(store->Stats().dram.blocks, 4u);
    EXPECT_EQ(store->Stats().ssd.blocks, 12u);
    ASSERT_TRUE(store->Close().ok());
  }
  auto store = OpenStore(o);
  EXPECT_EQ(store->Stats().recovered_blocks, 12u);
  EXPECT_EQ(store->Stats().dram.blocks, 0u);
  EXPECT_TRUE(RestoresChain(*store, 1, 12));
}

// FixedPlacement(kDram) blocks beside an SSD tier are DRAM-only: they do
// not survive a restart.
TEST(RecoveryTest, DramOnlyBlocksDoNotSurviveARestart) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 8, 64);
  o.placement = std::make_shared<FixedPlacement>(Medium::kDram);
  {
    auto store = OpenStore(o);
    ASSERT_TRUE(PutChain(*store, 1, 1, 4).ok());
    EXPECT_EQ(store->Stats().dram_only_blocks, 4u);
  }
  auto store = OpenStore(o);
  EXPECT_EQ(store->Match(ChainKeys(1, 4)), 0u);
}

TEST(RecoveryTest, ReopenWithoutCloseReplaysTheLog) {
  TempDir dir;
  auto o = SsdOnlyOptions(dir.Sub("ssd"), 64);
  auto first = OpenStore(o);
  ASSERT_TRUE(PutChain(*first, 1, 1, 10).ok());
  ASSERT_TRUE(PutChain(*first, 2, 2, 3).ok());
  // A second process would see the log as it is now, uncompacted.
  auto second = OpenStore(o);
  EXPECT_TRUE(RestoresChain(*second, 1, 10));
  EXPECT_EQ(second->Match(ChainKeys(2, 3)), 3u);
}

TEST(RecoveryTest, KillDashNineDuringWritesLosesOnlyUnfinishedPuts) {
  TempDir dir;
  auto o = SsdOnlyOptions(dir.Sub("ssd"), 64);
  o.ssd_capacity_bytes = 4096 * kSmallExtentBytes;
  o.segment_bytes = 16 * kSmallExtentBytes;
  std::vector<uint64_t> done;
  std::unique_ptr<Store> store;
  ASSERT_NO_FATAL_FAILURE(KillDuringPuts(o, dir.Sub("progress"), &done, &store));
  for (uint64_t chain : done) ASSERT_NO_FATAL_FAILURE(ExpectChain(*store, chain, KilledChainBlocks(chain)));
  // The put in flight at the kill may be partly there: whatever hits is right.
  const uint64_t next = done.back() + 1;
  const size_t blocks = KilledChainBlocks(next);
  std::vector<std::byte> got;
  uint32_t hit = RestoreAll(*store, ChainKeys(next, blocks), &got);
  auto want = Payload(*store, blocks, next);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << hit;
  EXPECT_EQ(store->Stats().checksum_failures, 0u);
}

// Puts `chain` in its own session, plus a scratch session it drops again:
// the log then holds more dead records (created, put, freed) than live ones.
Status PutWithGarbage(Store& store, uint64_t chain) {
  const size_t blocks = 1 + chain % 4;
  const uint64_t scratch = 1000000 + chain;
  FLATKV_RETURN_IF_ERROR(PutChain(store, scratch, scratch, 8));
  FLATKV_RETURN_IF_ERROR(store.DropSession(scratch));
  return PutChain(store, chain, chain, blocks);
}

// A roomy SSD-only store whose manifest is checkpointed past `checkpoint_bytes`.
StoreOptions Checkpointing(const std::string& dir, uint64_t checkpoint_bytes) {
  auto o = SsdOnlyOptions(dir, 64);
  o.ssd_capacity_bytes = 4096 * kSmallExtentBytes;
  o.segment_bytes = 16 * kSmallExtentBytes;
  o.manifest_checkpoint_bytes = checkpoint_bytes;
  return o;
}

// Online checkpoints keep the log within about twice its live size while
// the store runs; the store reopens to the same blocks.
TEST(RecoveryTest, OnlineCheckpointsKeepTheLogBounded) {
  TempDir dir;
  const StoreOptions o = Checkpointing(dir.Sub("ssd"), 8 << 10);
  auto store = OpenStore(o);
  for (uint64_t chain = 1; chain <= 300; ++chain) ASSERT_TRUE(PutWithGarbage(*store, chain).ok()) << chain;
  // Let a checkpoint that is due (or running) finish: wait until one has
  // run and the log size has held still for a few polls.
  StoreStats st = store->Stats();
  for (int i = 0, still = 0; i < 500 && (st.manifest_checkpoints == 0 || still < 5); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    const StoreStats now = store->Stats();
    still = now.manifest_bytes == st.manifest_bytes ? still + 1 : 0;
    st = now;
  }
  EXPECT_GT(st.manifest_checkpoints, 0u);
  const uint64_t running = st.manifest_bytes;
  ASSERT_TRUE(store->Close().ok());
  const uint64_t live = std::filesystem::file_size(dir.Sub("ssd") + "/MANIFEST");  // Close wrote a snapshot
  // At most twice the last snapshot (the log is checkpointed past that);
  // without checkpoints it would be about 4x live (8 dead blocks a chain).
  EXPECT_LE(running, 2 * live + (8 << 10)) << "live " << live;
  store = OpenStore(o);
  for (uint64_t chain = 1; chain <= 300; ++chain) {
    ASSERT_NO_FATAL_FAILURE(ExpectChain(*store, chain, 1 + chain % 4));
  }
  EXPECT_EQ(store->Match(ChainKeys(1000001, 8)), 0u);  // dropped stays dropped
}

// kill -9 while checkpoints run (one every few puts) loses no acknowledged block.
TEST(RecoveryTest, KillDashNineDuringOnlineCheckpointsLosesNothingAcknowledged) {
  TempDir dir;
  const StoreOptions o = Checkpointing(dir.Sub("ssd"), 4 << 10);
  std::vector<uint64_t> done;
  ASSERT_NO_FATAL_FAILURE(PutUntilKilled(o, dir.Sub("progress"), 60, 20000, PutWithGarbage, &done));
  ASSERT_GT(done.size(), 5u);
  auto store = OpenStore(o);
  ASSERT_TRUE(store);
  for (uint64_t chain : done) {
    ASSERT_NO_FATAL_FAILURE(ExpectChain(*store, chain, 1 + chain % 4));
    EXPECT_EQ(store->Match(ChainKeys(1000000 + chain, 8)), 0u) << "scratch of chain " << chain;
  }
  EXPECT_EQ(store->Stats().checksum_failures, 0u);
}

TEST(RecoveryTest, MissingSegmentMakesItsBlocksMisses) {
  TempDir dir;
  auto o = SsdOnlyOptions(dir.Sub("ssd"), 64);
  o.segment_bytes = 2 * kSmallExtentBytes;  // two extents (8 blocks) per segment
  {
    auto store = OpenStore(o);
    ASSERT_TRUE(PutChain(*store, 1, 1, 16).ok());
  }
  ASSERT_TRUE(std::filesystem::remove(dir.Sub("ssd") + "/seg-000001.dat"));
  auto store = OpenStore(o);
  EXPECT_EQ(store->Stats().lost_blocks, 8u);
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(*store, ChainKeys(1, 16), &got), 8u);
  auto want = Payload(*store, 16, 1);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin()));
  // The store keeps working: the lost range can be written again.
  ASSERT_TRUE(store->Put(1, ChainKeys(1, 16), want).ok());
  EXPECT_EQ(RestoreAll(*store, ChainKeys(1, 16), &got), 16u);
  EXPECT_TRUE(got == want);
}

TEST(RecoveryTest, CorruptedBytesOnDiskAreDetectedAndBecomeMisses) {
  TempDir dir;
  auto o = SsdOnlyOptions(dir.Sub("ssd"), 64);
  {
    auto store = OpenStore(o);
    ASSERT_TRUE(PutChain(*store, 1, 1, 4).ok());
  }
  // Block 2, layer 3 of the first extent: offset 3 * layer_stride + 2 * slot_stride.
  const uint64_t off = 3ull * 4 * 16384 + 2ull * 16384 + 100;
  int fd = ::open((dir.Sub("ssd") + "/seg-000000.dat").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  char c;
  ASSERT_EQ(::pread(fd, &c, 1, off), 1);
  c ^= 0x5a;
  ASSERT_EQ(::pwrite(fd, &c, 1, off), 1);
  ::close(fd);
  auto store = OpenStore(o);
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(*store, ChainKeys(1, 4), &got), 2u);
  auto want = Payload(*store, 4, 1);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin()));
  EXPECT_EQ(store->Stats().checksum_failures, 1u);
  EXPECT_EQ(store->Match(ChainKeys(1, 4)), 2u);  // the bad block left the index
}

// The sums table (sums-NNNNNN.dat) holds each block's per-layer checksums
// and coded offsets and lengths instead of memory. Entry of block slot i,
// layer l of extent slot 0: (i * layers + l) * 16 bytes (checksum, offset,
// length).
void CorruptSumsEntry(const std::string& dir, uint64_t entry, uint64_t byte_in_entry) {
  int fd = ::open((dir + "/sums-000000.dat").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const uint64_t off = entry * 16 + byte_in_entry;
  unsigned char c = 0;
  ASSERT_EQ(::pread(fd, &c, 1, off), 1);
  c ^= 0xa5;
  ASSERT_EQ(::pwrite(fd, &c, 1, off), 1);
  ::close(fd);
}

// A damaged checksum in the table (the running store reads it through the
// page cache) is a mismatch: that block and later ones miss, never wrong
// bytes, and the block leaves the index.
TEST(RecoveryTest, CorruptSumsEntryBecomesAMiss) {
  TempDir dir;
  auto o = SsdOnlyOptions(dir.Sub("ssd"), 64);
  auto store = OpenStore(o);
  ASSERT_TRUE(PutChain(*store, 1, 1, 4).ok());
  ASSERT_NO_FATAL_FAILURE(CorruptSumsEntry(dir.Sub("ssd"), 2 * 5 + 3, 0));  // block 2, layer 3
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(*store, ChainKeys(1, 4), &got), 2u);
  auto want = Payload(*store, 4, 1);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin()));
  EXPECT_EQ(store->Stats().checksum_failures, 1u);
  EXPECT_EQ(store->Stats().dropped_blocks, 1u);
  EXPECT_EQ(store->Match(ChainKeys(1, 4)), 2u);
}

// Coded blocks plan their reads from the table: an offset or length that
// does not describe a slice in order within the layer region is never
// read; the block misses and leaves the index.
TEST(RecoveryTest, CorruptCodedSumsEntryBecomesAMiss) {
  for (uint64_t byte : {8u, 12u, 15u}) {  // offset, length low byte, length high byte
    TempDir dir;
    auto o = SsdOnlyOptions(dir.Sub("ssd"), 64);
    o.codec = MakeCodec("raw").value();
    auto store = OpenStore(o);
    ASSERT_TRUE(PutChain(*store, 1, 1, 4).ok());
    ASSERT_NO_FATAL_FAILURE(CorruptSumsEntry(dir.Sub("ssd"), 1 * 5 + 2, byte));  // block 1, layer 2
    std::vector<std::byte> got;
    const uint32_t hit = RestoreAll(*store, ChainKeys(1, 4), &got);
    EXPECT_EQ(hit, 1u) << byte;
    auto want = Payload(*store, 4, 1);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << byte;
    EXPECT_EQ(store->Match(ChainKeys(1, 4)), 1u) << byte;
  }
}

// Overwrites the sums table of segment 0 with junk, or removes it.
void DamageSumsTable(const std::string& dir, bool remove) {
  const std::string sums = dir + "/sums-000000.dat";
  ASSERT_TRUE(std::filesystem::exists(sums));
  if (remove) {
    ASSERT_TRUE(std::filesystem::remove(sums));
    return;
  }
  std::vector<char> junk(std::filesystem::file_size(sums), 'x');
  FILE* f = std::fopen(sums.c_str(), "wb");
  ASSERT_EQ(std::fwrite(junk.data(), 1, junk.size(), f), junk.size());
  std::fclose(f);
}

// Up to manifest version 5 (here: fixed extents, which this build still
// writes at the lowest version their records need) the table is a cache of
// the manifest's records, rebuilt on every open: a table torn by a crash
// (an entry written, its BlockPut record not), stale from an older build,
// or gone, costs nothing after a restart.
TEST(RecoveryTest, SumsTableIsRebuiltFromTheManifestOnOpenBeforeVersion6) {
  for (bool coded : {false, true}) {
    TempDir dir;
    auto o = SsdOnlyOptions(dir.Sub("ssd"), 64);
    o.sized_extents = false;
    if (coded) o.codec = MakeCodec("raw").value();
    {
      auto store = OpenStore(o);
      ASSERT_TRUE(PutChain(*store, 1, 1, 8).ok());
    }
    ASSERT_LT(testing::ManifestVersion(dir.Sub("ssd")), persist::kManifestVersionTagged);
    ASSERT_NO_FATAL_FAILURE(DamageSumsTable(dir.Sub("ssd"), false));
    {
      auto store = OpenStore(o);
      ASSERT_NO_FATAL_FAILURE(ExpectChain(*store, 1, 8));
      EXPECT_EQ(store->Stats().checksum_failures, 0u) << coded;
    }
    ASSERT_NO_FATAL_FAILURE(DamageSumsTable(dir.Sub("ssd"), true));
    auto store = OpenStore(o);
    ASSERT_NO_FATAL_FAILURE(ExpectChain(*store, 1, 8));
    EXPECT_EQ(store->Stats().checksum_failures, 0u) << coded;
  }
}

// From version 6 (a new directory of sized extents) the table is the
// truth, and recovery reads none of it: a damaged or missing table makes
// its blocks miss when a restore reads it (the records' tags catch it),
// never wrong bytes, and those blocks leave the index; the others stay.
TEST(RecoveryTest, Version6DamagedSumsTableMakesItsBlocksMissNeverWrongBytes) {
  for (bool coded : {false, true})
    for (bool remove : {false, true}) {
      TempDir dir;
      auto o = SsdOnlyOptions(dir.Sub("ssd"), 64);
      if (coded) o.codec = MakeCodec("raw").value();
      {
        auto store = OpenStore(o);
        ASSERT_TRUE(PutChain(*store, 1, 1, 8).ok());
      }
      ASSERT_EQ(testing::ManifestVersion(dir.Sub("ssd")), persist::kManifestVersionTagged);
      {
        auto store = OpenStore(o);  // intact: served as written
        ASSERT_NO_FATAL_FAILURE(ExpectChain(*store, 1, 8));
      }
      ASSERT_NO_FATAL_FAILURE(DamageSumsTable(dir.Sub("ssd"), remove));
      auto store = OpenStore(o);
      EXPECT_EQ(store->Stats().recovered_blocks, 8u);
      std::vector<std::byte> got;
      EXPECT_EQ(RestoreAll(*store, ChainKeys(1, 8), &got), 0u) << coded << remove;
      EXPECT_EQ(store->Stats().checksum_failures, 1u) << coded << remove;
      EXPECT_EQ(store->Match(ChainKeys(1, 8)), 0u);
    }
}

TEST(RecoveryTest, TornManifestTailIsCutOff) {
  TempDir dir;
  auto o = SsdOnlyOptions(dir.Sub("ssd"), 64);
  {
    auto store = OpenStore(o);
    ASSERT_TRUE(PutChain(*store, 1, 1, 6).ok());
  }
  {
    FILE* f = std::fopen((dir.Sub("ssd") + "/MANIFEST").c_str(), "ab");
    const char junk[] = "\x30\x00\x00\x00garbage-from-a-torn-append";
    std::fwrite(junk, 1, sizeof(junk), f);
    std::fclose(f);
  }
  auto store = OpenStore(o);
  EXPECT_TRUE(RestoresChain(*store, 1, 6));
  ASSERT_TRUE(PutChain(*store, 2, 2, 2).ok());
  store.reset();
  store = OpenStore(o);
  EXPECT_EQ(store->Match(ChainKeys(2, 2)), 2u);
}

TEST(RecoveryTest, GarbageManifestIsAnErrorNotACrash) {
  TempDir dir;
  std::filesystem::create_directories(dir.Sub("ssd"));
  FILE* f = std::fopen((dir.Sub("ssd") + "/MANIFEST").c_str(), "wb");
  std::fputs("this is not a manifest", f);
  std::fclose(f);
  auto s = Store::Open(SsdOnlyOptions(dir.Sub("ssd"), 64));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kCorruption);
  EXPECT_NE(s.status().message().find("MANIFEST"), std::string::npos) << s.status().ToString();
}

}  // namespace
}  // namespace flatkv

namespace flatkv {
namespace {

TEST(RecoveryTest, ReadOnlyOpenWritesNothing) {
  TempDir dir;
  auto o = SsdOnlyOptions(dir.Sub("ssd"), 64);
  {
    auto store = OpenStore(o);
    ASSERT_TRUE(PutChain(*store, 1, 1, 8).ok());
  }
  const std::string manifest = dir.Sub("ssd") + "/MANIFEST";
  {
    FILE* f = std::fopen(manifest.c_str(), "ab");
    std::fputs("torn", f);
    std::fclose(f);
  }
  const auto size = std::filesystem::file_size(manifest);
  auto ro = o;
  ro.read_only = true;
  ro.ssd_capacity_bytes = 4096;  // too small for one extent
  EXPECT_FALSE(Store::Open(ro).ok());
  ro.ssd_capacity_bytes = o.ssd_capacity_bytes;
  {
    auto store = OpenStore(ro);
    EXPECT_TRUE(RestoresChain(*store, 1, 8));
    EXPECT_EQ(PutChain(*store, 2, 2, 1).code(), Code::kFailedPrecondition);
    EXPECT_EQ(store->DropSession(1).code(), Code::kFailedPrecondition);
    EXPECT_TRUE(store->Close().ok());
  }
  EXPECT_EQ(std::filesystem::file_size(manifest), size);  // not truncated, not compacted
  ro.ssd_dirs = {dir.Sub("nothing-here")};
  EXPECT_EQ(Store::Open(ro).status().code(), Code::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(dir.Sub("nothing-here") + "/MANIFEST"));
}

}  // namespace
}  // namespace flatkv
