#include "flatkv/store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "common/aligned_buffer.h"
#include "io/fault_injection.h"
#include "testing/test_util.h"

namespace flatkv {
namespace {

using namespace flatkv::testing;

struct ShapeCase {
  const char* name;
  KvShape shape;
  uint32_t block_tokens;
};

class RoundTripTest : public ::testing::TestWithParam<std::tuple<ShapeCase, Medium>> {};

// Every shape, on each medium, restores exactly the bytes that were put.
TEST_P(RoundTripTest, RestoresWhatWasPut) {
  auto [sc, medium] = GetParam();
  TempDir dir;
  StoreOptions o;
  o.shape = sc.shape;
  o.block_tokens = sc.block_tokens;
  o.placement = std::make_shared<FixedPlacement>(medium);
  o.dram_capacity_bytes = medium == Medium::kDram ? 64ull << 20 : 0;
  if (medium == Medium::kSsd) {
    o.ssd_dirs = {dir.Sub("ssd")};
    o.ssd_capacity_bytes = 256ull << 20;
    o.segment_bytes = 64ull << 20;
  }
  o.window_layers = 3;
  auto store = OpenStore(o);
  ASSERT_TRUE(store);
  EXPECT_EQ(store->BlockLayerBytes(), sc.shape.BytesPerTokenLayer() * sc.block_tokens);
  const size_t blocks = std::max<uint64_t>(2, std::min<uint64_t>(6, (24ull << 20) / store->BlockBytes()));
  auto keys = ChainKeys(1, blocks, sc.block_tokens);
  auto data = Payload(*store, blocks, 1);
  ASSERT_TRUE(store->Put(1, keys, data).ok());
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(*store, keys, &got), blocks);
  EXPECT_TRUE(got == data);
  for (bool block_major : {false, true}) {
    got.clear();
    EXPECT_EQ(testing::RestoreInto(*store, keys, block_major, &got), blocks) << block_major;
    EXPECT_TRUE(got == data) << "into the caller's memory, block_major=" << block_major;
  }
  StoreStats st = store->Stats();
  const MediumStats& m = medium == Medium::kDram ? st.dram : st.ssd;
  EXPECT_EQ(m.blocks, blocks);
  EXPECT_EQ(m.hit_blocks, 3 * blocks);
  EXPECT_EQ(m.bytes_delivered, 3 * blocks * store->BlockBytes());
  if (medium == Medium::kSsd) {
    EXPECT_GE(st.ssd_read_amplification(), 1.0);
  }
}

const ShapeCase kShapes[] = {
    {"stories260k", KvShape::Mha(5, 4, 8, DType::kF32), 64},
    {"llama8b_16tok", KvShape::Mha(32, 8, 128, DType::kBF16), 16},
    {"deepseek_v3_mla", KvShape::Mla(61, 512, 64, DType::kBF16), 16},
    {"qwen3_32b", KvShape::Mha(64, 8, 128, DType::kBF16), 16},
    // 1.5 KiB per block and layer: not 4 KiB aligned, exercises SSD padding and compaction.
    {"odd_f16", KvShape::Mha(3, 3, 4, DType::kF16), 32},
    {"odd_mla_f32", KvShape::Mla(2, 7, 3, DType::kF32), 17},
};

INSTANTIATE_TEST_SUITE_P(Shapes, RoundTripTest,
                         ::testing::Combine(::testing::ValuesIn(kShapes), ::testing::Values(Medium::kDram, Medium::kSsd)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  std::string(MediumName(std::get<1>(info.param)));
                         });

TEST(StoreTest, PrefixHitsAcrossPartialChains) {
  TempDir dir;
  auto store = OpenStore(SmallOptions(dir.Sub("ssd"), 8, 64));
  auto keys = ChainKeys(5, 10);
  auto data = Payload(*store, 10, 5);
  // Store only the first 6 blocks.
  ASSERT_TRUE(store->Put(1, std::span(keys).first(6), std::span(data).first(6 * store->BlockBytes())).ok());
  EXPECT_EQ(store->Match(keys), 6u);
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(*store, keys, &got), 6u);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin()));
  // A chain that diverges after block 3 hits 3.
  auto other = ChainKeys(5, 3);
  auto diverged = ChainKeys(6, 4);
  other.insert(other.end(), diverged.begin(), diverged.end());
  EXPECT_EQ(store->Match(other), 3u);
  EXPECT_EQ(RestoreAll(*store, other, nullptr), 3u);
  // A chain missing its first block hits nothing, even if later keys exist.
  EXPECT_EQ(store->Match(std::span(keys).subspan(1)), 5u);  // keys 1..5 are stored, as a chain they are a prefix
  EXPECT_EQ(store->Match(ChainKeys(99, 4)), 0u);
  auto r = store->StartRestore(ChainKeys(99, 4));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value()->hit_blocks(), 0u);
  EXPECT_EQ(r.value()->WaitLayer(0)->blocks, 0u);
  EXPECT_EQ(r.value()->Finish(), 0u);
  // Extending the chain later (a second turn) continues the session.
  ASSERT_TRUE(store->Put(1, keys, data).ok());
  EXPECT_EQ(RestoreAll(*store, keys, &got), 10u);
  EXPECT_TRUE(got == data);
  EXPECT_EQ(store->Stats().dedup_blocks, 6u);
}

TEST(StoreTest, ForkSharesThePrefixBlocks) {
  TempDir dir;
  auto store = OpenStore(SmallOptions(dir.Sub("ssd"), 8, 64));
  auto prefix = ChainKeys(1, 4);
  auto a = prefix, b = prefix;
  auto ta = ChainKeys(2, 2), tb = ChainKeys(3, 2);
  a.insert(a.end(), ta.begin(), ta.end());
  b.insert(b.end(), tb.begin(), tb.end());
  auto da = Payload(*store, 6, 1);
  auto db = Payload(*store, 6, 1);  // same prefix bytes
  auto tail_b = Payload(*store, 2, 9);
  std::copy(tail_b.begin(), tail_b.end(), db.begin() + 4 * store->BlockBytes());
  ASSERT_TRUE(store->Put(1, a, da).ok());
  ASSERT_TRUE(store->Put(2, b, db).ok());
  EXPECT_EQ(store->Stats().put_blocks, 8u);  // the shared prefix is stored once
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(*store, a, &got), 6u);
  EXPECT_TRUE(got == da);
  EXPECT_EQ(RestoreAll(*store, b, &got), 6u);
  EXPECT_TRUE(got == db);
}

TEST(StoreTest, WindowBoundsLayersInFlight) {
  TempDir dir;
  auto o = SmallOptions(dir.Sub("ssd"), 8, 64);
  o.window_layers = 2;
  o.window_bytes = 0;  // the window is exactly 2 layers
  auto store = OpenStore(o);
  auto keys = ChainKeys(1, 3);
  ASSERT_TRUE(store->Put(1, keys, Payload(*store, 3, 1)).ok());
  auto r = store->StartRestore(keys);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(r.value()->WaitLayer(0).ok());
  ASSERT_TRUE(r.value()->WaitLayer(1).ok());
  auto beyond = r.value()->WaitLayer(2);  // not released anything yet: a clear error, not a deadlock
  EXPECT_EQ(beyond.status().code(), Code::kFailedPrecondition);
  r.value()->ReleaseLayer(0);
  EXPECT_TRUE(r.value()->WaitLayer(2).ok());
  EXPECT_EQ(r.value()->WaitLayer(7).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(r.value()->WaitLayer(0).status().code(), Code::kFailedPrecondition);
  EXPECT_EQ(r.value()->Finish(), 3u);
}

// Three blocks put for session 1, and destinations for them laid out
// block-major, as Payload lays the chain out.
struct ThreeBlocksToDestinations {
  ThreeBlocksToDestinations(Store& store, uint32_t layers)
      : keys(ChainKeys(1, 3)), data(Payload(store, 3, 1)), got(data.size()) {
    EXPECT_TRUE(store.Put(1, keys, data).ok());
    const uint64_t lb = store.BlockLayerBytes();
    target.destination = [this, lb, layers](uint32_t l, uint32_t b) { return got.data() + (uint64_t{b} * layers + l) * lb; };
  }
  ThreeBlocksToDestinations(const ThreeBlocksToDestinations&) = delete;  // target points into got
  ThreeBlocksToDestinations& operator=(const ThreeBlocksToDestinations&) = delete;

  std::vector<BlockKey> keys;
  std::vector<std::byte> data, got;
  RestoreTarget target;
};

// A restore into the caller's destinations frees a window slot as soon as
// its layer lands: later layers are issued without the consumer releasing.
TEST(StoreTest, ARestoreIntoDestinationsIssuesPastTheWindowWithoutReleases) {
  TempDir dir;
  auto o = SsdOnlyOptions(dir.Sub("ssd"), 64);
  o.window_layers = 2;
  o.window_bytes = 0;
  auto store = OpenStore(o);
  ThreeBlocksToDestinations t(*store, o.shape.layers);
  auto r = store->StartRestore(t.keys, t.target);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto last = r.value()->WaitLayer(o.shape.layers - 1);  // nothing released
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(last->blocks, 3u);
  EXPECT_EQ(r.value()->Finish(), 3u);
  EXPECT_TRUE(t.got == t.data);
}

// Where the window binds on the SSD, layer 0 is read alone (the device would
// share itself with the whole window), the rest once it has landed.
TEST(StoreTest, WhereTheWindowBindsLayerZeroIsReadAloneFirst) {
  TempDir dir;
  auto o = SsdOnlyOptions(dir.Sub("ssd"), 64);
  o.window_layers = 2;
  o.window_bytes = 0;
  auto engine = InjectFaults(&o);
  auto store = OpenStore(o);
  const auto keys = ChainKeys(1, 3);
  const auto data = Payload(*store, 3, 1);
  ASSERT_TRUE(store->Put(1, keys, data).ok());
  engine->CloseGate(io::Op::kRead);
  auto r = store->StartRestore(keys);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(engine->held(), 1u);  // layer 0's one read; layer 1 waits for it
  engine->OpenGate();
  std::vector<std::byte> got;
  for (uint32_t l = 0; l < o.shape.layers; ++l) {
    auto view = r.value()->WaitLayer(l);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    EXPECT_EQ(view->blocks, 3u);
    r.value()->ReleaseLayer(l);
  }
  EXPECT_EQ(r.value()->Finish(), 3u);
  EXPECT_EQ(RestoreAll(*store, keys, &got), 3u);
  EXPECT_TRUE(got == data);
}

// A window that holds every layer of a small session still reads at most
// ssd_layers_in_flight of them from SSD at once, layer 0 alone first; all
// at once, they would all land together, layer 0 with the last.
TEST(StoreTest, ASmallSessionFromSsdReadsLayerZeroAloneAndFewLayersAtOnce) {
  TempDir dir;
  auto o = SsdOnlyOptions(dir.Sub("ssd"), 64);
  o.ssd_layers_in_flight = 2;  // the window (32 MiB) holds every layer
  auto engine = InjectFaults(&o);
  auto store = OpenStore(o);
  ASSERT_GT(o.shape.layers, 2u);
  ThreeBlocksToDestinations t(*store, o.shape.layers);
  engine->CloseGate(io::Op::kRead);
  auto r = store->StartRestore(t.keys, t.target);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(engine->held(), 1u);  // layer 0's one read
  engine->OpenGate();
  EXPECT_EQ(r.value()->Finish(), 3u);
  EXPECT_TRUE(t.got == t.data);
}

// A restore whose SSD reads all land in the caller's destinations holds no
// window: ssd_layers_in_flight bounds its layers in flight, not the window's
// size. Through the window the same restore keeps to the window.
TEST(StoreTest, ARestoreWithNoWindowIsBoundByTheDeviceNotTheWindowSize) {
  TempDir dir;
  StoreOptions o = SsdOnlyOptions(dir.Sub("ssd"), 8);
  o.shape = KvShape::Mha(5, 4, 64, DType::kF32);  // 128 KiB per block and layer at 64 tokens
  o.ssd_extent_layer_bytes = 256 << 10;           // 2 blocks per extent: a 256 KiB request per layer
  o.ssd_capacity_bytes = 8 * 2 * 5 * (128 << 10);
  o.segment_bytes = 4 * 2 * 5 * (128 << 10);
  o.window_layers = 2;
  o.window_bytes = 0;
  auto engine = InjectFaults(&o);
  auto store = OpenStore(o);
  ASSERT_NE(store, nullptr);
  const auto keys = ChainKeys(1, 2);
  const auto data = Payload(*store, 2, 1);
  ASSERT_TRUE(store->Put(1, keys, data).ok());
  const uint32_t layers = o.shape.layers;
  const uint64_t lb = store->BlockLayerBytes();
  for (bool layer_major : {true, false}) {
    AlignedBuffer got(data.size(), 4096);
    RestoreTarget target;
    target.destination = [&](uint32_t l, uint32_t b) {
      return got.data() + (layer_major ? (uint64_t{l} * 2 + b) * lb : (uint64_t{b} * layers + l) * lb);
    };
    engine->CloseGate(io::Op::kRead);
    auto r = store->StartRestore(keys, target);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    // Straight into place: every layer (16 in flight allowed, so no layer 0
    // first either); through the window: layer 0 alone, then 2 at a time.
    EXPECT_EQ(engine->held(), layer_major ? layers : 1u) << layer_major;
    engine->OpenGate();
    EXPECT_EQ(r.value()->Finish(), 2u);
    for (uint32_t b = 0; b < 2; ++b)
      for (uint32_t l = 0; l < layers; ++l)
        EXPECT_EQ(std::memcmp(target.destination(l, b), data.data() + (uint64_t{b} * layers + l) * lb, lb), 0) << b << " " << l;
  }
}

// Destinations reused every two layers (a caller's bounded window): with
// the SSD queue open, only two layers are read until the consumer releases
// one; each layer lands whole in its reused place.
TEST(StoreTest, ARestoreIntoReusedDestinationsLoadsALayerOnlyOnceItsPlaceIsReleased) {
  TempDir dir;
  StoreOptions o = SsdOnlyOptions(dir.Sub("ssd"), 8);
  auto engine = InjectFaults(&o);
  auto store = OpenStore(o);
  ASSERT_NE(store, nullptr);
  const auto keys = ChainKeys(1, 4);
  const auto data = Payload(*store, 4, 1);
  ASSERT_TRUE(store->Put(1, keys, data).ok());
  const uint32_t layers = o.shape.layers;
  const uint64_t lb = store->BlockLayerBytes();
  AlignedBuffer places(2 * 4 * lb, 4096);
  RestoreTarget target;
  target.reuse_layers = 2;
  target.destination = [&](uint32_t l, uint32_t b) { return places.data() + (uint64_t{l % 2} * 4 + b) * lb; };
  engine->CloseGate(io::Op::kRead);
  auto r = store->StartRestore(keys, target);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(engine->held(), 1u);  // layer 0 alone first (a device is read)
  engine->OpenGate();
  for (uint32_t l = 0; l < layers; ++l) {
    auto v = (*r)->WaitLayer(l);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    ASSERT_EQ(v->blocks, 4u);
    if (l + 2 < layers) {
      auto beyond = (*r)->WaitLayer(l + 2);  // its place is layer l's
      ASSERT_FALSE(beyond.ok());
      EXPECT_NE(beyond.status().ToString().find("release layer " + std::to_string(l) + " first"), std::string::npos)
          << beyond.status().ToString();
    }
    for (uint32_t b = 0; b < 4; ++b)
      ASSERT_EQ(std::memcmp(target.destination(l, b), data.data() + (uint64_t{b} * layers + l) * lb, lb), 0) << l << " " << b;
    (*r)->ReleaseLayer(l);
  }
  EXPECT_EQ((*r)->Finish(), 4u);
}

TEST(StoreTest, WrongSizesAreRejectedAndLoseNothing) {
  TempDir dir;
  auto store = OpenStore(SmallOptions(dir.Sub("ssd"), 8, 64));
  auto keys = ChainKeys(1, 2);
  auto data = Payload(*store, 2, 1);
  ASSERT_TRUE(store->Put(1, keys, data).ok());
  auto more = ChainKeys(2, 3);
  Status s = store->Put(1, more, std::span(data).first(data.size() - 1));
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("expected 3 blocks"), std::string::npos) << s.ToString();
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(*store, keys, &got), 2u);
  EXPECT_TRUE(got == data);
  EXPECT_EQ(store->Match(more), 0u);
}

TEST(StoreTest, BadOptionsGiveClearErrors) {
  TempDir dir;
  auto expect = [](StoreOptions o, Code code, const std::string& needle) {
    auto s = Store::Open(o);
    ASSERT_FALSE(s.ok()) << needle;
    EXPECT_EQ(s.status().code(), code) << s.status().ToString();
    EXPECT_NE(s.status().message().find(needle), std::string::npos) << s.status().ToString();
  };
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 8, 64);
  StoreOptions bad = o;
  bad.shape = KvShape{};
  bad.ssd_dirs.clear();
  expect(bad, Code::kInvalidArgument, "shape");
  bad = o;
  bad.shape.head_dim = 0;
  expect(bad, Code::kInvalidArgument, "head_dim=0");
  bad = o;
  bad.block_tokens = 8;
  expect(bad, Code::kInvalidArgument, "block_tokens=8");
  bad = o;
  bad.dram_capacity_bytes = 0;
  bad.ssd_dirs.clear();
  expect(bad, Code::kInvalidArgument, "no medium");
  bad = o;
  bad.ssd_capacity_bytes = 0;
  expect(bad, Code::kInvalidArgument, "ssd_capacity_bytes=0");
  bad = o;
  bad.ssd_layers_in_flight = 0;
  expect(bad, Code::kInvalidArgument, "ssd_layers_in_flight=0");
  bad = o;
  bad.ssd_capacity_bytes = 4096;  // smaller than one extent
  expect(bad, Code::kInvalidArgument, "cannot hold one block");
  bad = o;
  bad.dram_capacity_bytes = 1000;
  expect(bad, Code::kInvalidArgument, "dram_capacity_bytes");
  bad = o;
  bad.ssd_dirs = {"/proc/flatkv-cannot-exist"};
  auto s = Store::Open(bad);
  EXPECT_FALSE(s.ok());
  // A path that is a file, not a directory.
  bad = o;
  std::string file = dir.Sub("plainfile");
  FILE* f = std::fopen(file.c_str(), "w");
  std::fclose(f);
  bad.ssd_dirs = {file};
  EXPECT_FALSE(Store::Open(bad).ok());
  // Reopening with another shape is refused and keeps the data.
  o.placement = std::make_shared<FixedPlacement>(Medium::kSsd);
  {
    auto store = OpenStore(o);
    ASSERT_TRUE(PutChain(*store, 1, 1, 2).ok());
  }
  bad = o;
  bad.shape.kv_heads = 8;
  expect(bad, Code::kInvalidArgument, "store holds");
  auto store = OpenStore(o);
  EXPECT_EQ(store->Match(ChainKeys(1, 2)), 2u);
}

TEST(StoreTest, ReadOnlyDirectoryIsRefused) {
  TempDir dir;
  std::string ro = dir.Sub("ro");
  ASSERT_EQ(::mkdir(ro.c_str(), 0555), 0);
  // Root ignores permission bits; the immutable attribute stops it too (ext4).
  const bool immutable = ::geteuid() == 0 && std::system(("chattr +i " + ro + " 2>/dev/null").c_str()) == 0;
  if (::geteuid() == 0 && !immutable) GTEST_SKIP() << "running as root without chattr: cannot make a read-only directory";
  auto s = Store::Open(SmallOptions(ro, 8, 64));
  if (immutable) std::system(("chattr -i " + ro).c_str());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kPermissionDenied) << s.status().ToString();
  EXPECT_NE(s.status().message().find(ro), std::string::npos) << s.status().ToString();
}

TEST(StoreTest, OpenAdoptsTheStoredShape) {
  TempDir dir;
  auto o = SsdOnlyOptions(dir.Sub("ssd"), 64);
  {
    auto store = OpenStore(o);
    ASSERT_TRUE(PutChain(*store, 1, 1, 2).ok());
  }
  StoreOptions adopt;
  adopt.dram_capacity_bytes = 0;
  adopt.ssd_dirs = o.ssd_dirs;
  adopt.ssd_capacity_bytes = o.ssd_capacity_bytes;
  auto store = OpenStore(adopt);
  EXPECT_EQ(store->options().shape, o.shape);
  EXPECT_EQ(store->Match(ChainKeys(1, 2)), 2u);
  StoreOptions empty = adopt;
  empty.ssd_dirs = {dir.Sub("empty")};
  auto s = Store::Open(empty);
  EXPECT_EQ(s.status().code(), Code::kNotFound);
}

TEST(StoreTest, DropSessionFreesItsExtents) {
  TempDir dir;
  auto store = OpenStore(SmallOptions(dir.Sub("ssd"), 8, 64));
  auto keys = ChainKeys(1, 9);
  ASSERT_TRUE(store->Put(1, keys, Payload(*store, 9, 1)).ok());
  EXPECT_GT(store->Stats().dram.extents + store->Stats().ssd.extents, 0u);
  ASSERT_TRUE(store->DropSession(1).ok());
  EXPECT_EQ(store->Stats().dram.extents + store->Stats().ssd.extents, 0u);
  EXPECT_EQ(store->Match(keys), 0u);
  EXPECT_EQ(store->DropSession(1).code(), Code::kNotFound);
}

}  // namespace
}  // namespace flatkv

namespace flatkv {
namespace {

// Where the filesystem refuses O_DIRECT (tmpfs before Linux 6.6), the store
// falls back to buffered I/O, warns, and says so in its stats; with
// use_direct_io=false it never asks. Either way the bytes are right.
TEST(StoreTest, BufferedIoFallbackIsReportedInStats) {
  const std::string base = std::filesystem::exists("/dev/shm") ? "/dev/shm" : "/tmp";
  for (bool want_direct : {true, false}) {
    std::string dir = base + "/flatkv-test-" + std::to_string(::getpid()) + (want_direct ? "-d" : "-b");
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    // What the filesystem itself says about O_DIRECT.
    const std::string probe_path = dir + "/probe";
    const int probe = ::open(probe_path.c_str(), O_CREAT | O_RDWR | O_DIRECT, 0644);
    const bool fs_direct = probe >= 0;
    if (probe >= 0) ::close(probe);
    ::unlink(probe_path.c_str());
    {
      StoreOptions o = SsdOnlyOptions(dir, 16);
      o.use_direct_io = want_direct;
      auto store = Store::Open(o);
      ASSERT_TRUE(store.ok()) << store.status().ToString();
      auto keys = testing::ChainKeys(1, 5);
      auto data = testing::Payload(*store.value(), 5, 1);
      ASSERT_TRUE(store.value()->Put(1, keys, data).ok());
      std::vector<std::byte> got;
      EXPECT_EQ(testing::RestoreAll(*store.value(), keys, &got), 5u);
      EXPECT_TRUE(got == data);
      EXPECT_EQ(store.value()->Stats().ssd_direct_io, want_direct && fs_direct) << dir;
    }
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace flatkv
