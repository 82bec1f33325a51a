// A store that keeps encoded KV: round trips through a fixed-size codec
// (raw) and a variable-size one (a lossless zero-run code defined here) on
// both media, through the window and a RestoreTarget; restarts; mixed
// codecs; corrupt or undecodable bytes as clean misses; capacity.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "codec/codec_internal.h"
#include "flatkv/codec.h"
#include "flatkv/store.h"
#include "persist/manifest.h"
#include "io/fault_injection.h"
#include "testing/test_util.h"
#include "testing/zero_run_codec.h"

namespace flatkv {
namespace {

using namespace flatkv::testing;

// zrle that writes an undecodable token for one slice (layer 1 of the
// block at `bad_position`), as a codec bug or an unchecked corruption would.
class BrokenZeroRunCodec final : public ZeroRunCodec {
 public:
  explicit BrokenZeroRunCodec(uint32_t bad_position) : bad_position_(bad_position) {}
  Result<size_t> Encode(CodecContext& ctx, const SliceLayout& layout, std::span<const std::byte> in,
                        std::span<std::byte> out) const override {
    auto n = ZeroRunCodec::Encode(ctx, layout, in, out);
    if (n.ok() && layout.layer == 1 && layout.first_position == bad_position_) {
      const uint32_t huge = 0xFFFFFFF0u;
      std::memcpy(out.data() + codec::kHeaderBytes, &huge, 4);
    }
    return n;
  }

 private:
  uint32_t bad_position_;
};

// Payload() with a different share of each slice zeroed, so zrle gives
// each slice its own size (about 25%..85% zeros).
std::vector<std::byte> Sparse(const Store& store, size_t blocks, uint64_t seed) {
  auto data = Payload(store, blocks, seed);
  const uint64_t lb = store.BlockLayerBytes();
  for (uint64_t s = 0; s < data.size() / lb; ++s) {
    const uint64_t zeros = lb * (25 + (s * 37 + seed * 11) % 60) / 100;
    std::memset(data.data() + s * lb + (s % 2 ? 0 : lb - zeros), 0, zeros);
  }
  return data;
}

std::shared_ptr<const Codec> Raw() { return std::shared_ptr<const Codec>(MakeCodec("raw").value()); }

StoreOptions On(Medium m, const std::string& dir) {
  StoreOptions o = m == Medium::kDram ? SmallOptions("", 16, 0) : SmallOptions(dir, 0, 64);
  o.placement = std::make_shared<FixedPlacement>(m);
  return o;
}

Status PutWith(Store& s, SessionId session, const std::vector<BlockKey>& keys, size_t from, size_t n,
               const std::vector<std::byte>& data, std::shared_ptr<const Codec> codec = nullptr) {
  PutOptions po;
  po.codec = std::move(codec);
  po.first_block = static_cast<uint32_t>(from);
  const uint64_t bb = s.BlockBytes();
  return s.Put(session, std::span(keys).subspan(from, n), std::span(data).subspan(from * bb, n * bb), po);
}

// Restores `keys` three ways (window, caller's memory laid out per layer
// and per block) and checks each gives `want` blocks of `data`.
void ExpectRestores(Store& s, const std::vector<BlockKey>& keys, const std::vector<std::byte>& data, uint32_t want) {
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(s, keys, &got), want);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin())) << "window";
  for (bool block_major : {false, true}) {
    got.clear();
    EXPECT_EQ(RestoreInto(s, keys, block_major, &got), want) << block_major;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin())) << "target, block_major=" << block_major;
  }
}

class CodecRoundTripTest : public ::testing::TestWithParam<std::tuple<bool, Medium>> {};

TEST_P(CodecRoundTripTest, RestoresWhatWasPutInBatchesAndExtents) {
  auto [variable, medium] = GetParam();
  TempDir dir;
  StoreOptions o = On(medium, dir.Sub("ssd"));
  o.codec = variable ? std::make_shared<ZeroRunCodec>() : Raw();
  auto store = OpenStore(o);
  ASSERT_TRUE(store);
  const size_t n = 14;
  auto keys = ChainKeys(1, n);
  auto data = Sparse(*store, n, 1);
  // Batches of 5, 1 and 8 blocks: several batches per extent, several extents.
  ASSERT_TRUE(PutWith(*store, 1, keys, 0, 5, data).ok());
  ASSERT_TRUE(PutWith(*store, 1, keys, 5, 1, data).ok());
  ASSERT_TRUE(PutWith(*store, 1, keys, 6, 8, data).ok());
  ExpectRestores(*store, keys, data, n);
  ExpectRestores(*store, ChainKeys(1, 7), data, 7);
  StoreStats st = store->Stats();
  const MediumStats& m = medium == Medium::kDram ? st.dram : st.ssd;
  EXPECT_EQ(m.blocks, n);
  EXPECT_EQ(m.logical_bytes, n * store->BlockBytes());
  EXPECT_EQ(m.bytes_delivered, 9 * (n + 7) * store->BlockBytes() / 3);
  if (variable) {
    EXPECT_LT(m.stored_bytes, m.logical_bytes);
    EXPECT_GT(st.compression_ratio(), 1.5);
    if (medium == Medium::kSsd) {
      EXPECT_LT(m.bytes_read, m.bytes_delivered);  // the point: fewer bytes read
    }
  } else {
    const SliceLayout layout{o.shape, o.block_tokens};
    EXPECT_EQ(m.stored_bytes, n * o.shape.layers * o.codec->MaxEncodedSize(layout));  // fixed size
  }
  EXPECT_EQ(st.checksum_failures + st.decode_failures, 0u);
}

INSTANTIATE_TEST_SUITE_P(Codecs, CodecRoundTripTest,
                         ::testing::Combine(::testing::Bool(), ::testing::Values(Medium::kDram, Medium::kSsd)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) ? "zrle_" : "raw_") +
                                  (std::get<1>(info.param) == Medium::kDram ? "dram" : "ssd");
                         });

TEST(StoreCodecTest, CodedExtentsSurviveCleanAndUncleanRestarts) {
  TempDir dir;
  StoreOptions o = On(Medium::kSsd, dir.Sub("ssd"));
  o.codec = std::make_shared<ZeroRunCodec>();
  auto keys = ChainKeys(1, 10);
  std::vector<std::byte> data;
  {
    auto store = OpenStore(o);
    data = Sparse(*store, 10, 2);
    ASSERT_TRUE(PutWith(*store, 1, keys, 0, 6, data).ok());
    ASSERT_TRUE(store->Close().ok());
  }
  EXPECT_EQ(ManifestVersion(dir.Sub("ssd")), persist::kManifestVersionTagged);
  auto first = OpenStore(o);
  EXPECT_EQ(first->Stats().recovered_blocks, 6u);
  ExpectRestores(*first, keys, data, 6);
  const uint64_t stored = first->Stats().ssd.stored_bytes;
  EXPECT_LT(stored, 6 * first->BlockBytes());
  // Recovered extents take no new blocks; new ones go to a new extent.
  ASSERT_TRUE(PutWith(*first, 1, keys, 6, 4, data).ok());
  ExpectRestores(*first, keys, data, 10);
  // Like a kill -9: a second process replays the uncompacted log.
  auto second = OpenStore(o);
  EXPECT_EQ(second->Stats().recovered_blocks, 10u);
  EXPECT_EQ(second->Stats().ssd.stored_bytes, first->Stats().ssd.stored_bytes);
  ExpectRestores(*second, keys, data, 10);
  // Without the (unregistered) codec the store cannot be read; nothing is changed.
  second.reset();
  first.reset();
  StoreOptions without = o;
  without.codec = nullptr;
  auto refused = Store::Open(without);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("zrle"), std::string::npos) << refused.status().ToString();
  auto again = OpenStore(o);
  ExpectRestores(*again, keys, data, 10);
}

// An fp8 KV cache (vLLM's --kv-cache-dtype fp8): a store shaped fp8_e4m3 keeps the bytes as they
// are, raw or without a codec, across a restart; a codec that computes on floats is refused at
// open and at put, by name, and the store keeps what it held.
TEST(StoreCodecTest, AnFp8StoreKeepsItsBytesAndRefusesFloatCodecsByName) {
  TempDir dir;
  StoreOptions o = On(Medium::kSsd, dir.Sub("ssd"));
  o.shape = KvShape::Mha(5, 4, 8, DType::kF8E4M3);
  auto keys = ChainKeys(1, 8);
  std::vector<std::byte> data;
  {
    auto store = OpenStore(o);
    ASSERT_TRUE(store);
    EXPECT_EQ(store->BlockLayerBytes(), 64u * 2 * 4 * 8);
    data = Payload(*store, 8, 3);
    ASSERT_TRUE(PutWith(*store, 1, keys, 0, 4, data).ok());
    ASSERT_TRUE(PutWith(*store, 1, keys, 4, 4, data, Raw()).ok());
    for (const char* spec : {"int8", "kivi", "pred", "raw:dtype=2"}) {
      const Status st = PutWith(*store, 2, ChainKeys(2, 8), 0, 1, data, MakeCodec(spec).value());
      EXPECT_FALSE(st.ok()) << spec;
      EXPECT_NE(st.message().find("fp8_e4m3"), std::string::npos) << st.ToString();
    }
    ExpectRestores(*store, keys, data, 8);
    ASSERT_TRUE(store->Close().ok());
  }
  StoreOptions kivi = o;
  kivi.codec = MakeCodec("kivi").value();
  auto refused = Store::Open(kivi);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("kivi"), std::string::npos) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("fp8_e4m3"), std::string::npos) << refused.status().ToString();
  auto again = OpenStore(o);
  EXPECT_EQ(again->Stats().recovered_blocks, 8u);
  ExpectRestores(*again, keys, data, 8);
}

// A process killed mid-put: every put that returned survives with its
// codec; the one in flight is partly there or not, never wrong.
TEST(StoreCodecTest, KillDashNineDuringCodedPutsLosesOnlyUnfinishedPuts) {
  TempDir dir;
  StoreOptions o = On(Medium::kSsd, dir.Sub("ssd"));
  o.ssd_capacity_bytes = 1024 * kSmallExtentBytes;
  o.codec = std::make_shared<ZeroRunCodec>();
  std::vector<uint64_t> done;
  ASSERT_NO_FATAL_FAILURE(PutUntilKilled(o, dir.Sub("progress"), 30, 15000, [](Store& store, uint64_t chain) {
    const size_t blocks = 1 + chain % 7;
    return PutWith(store, chain % 5, ChainKeys(chain, blocks), 0, blocks, Sparse(store, blocks, chain));
  }, &done));
  ASSERT_GT(done.size(), 3u);
  auto store = OpenStore(o);
  ASSERT_TRUE(store);
  for (uint64_t chain : done) {
    const size_t blocks = 1 + chain % 7;
    std::vector<std::byte> got;
    ASSERT_EQ(RestoreAll(*store, ChainKeys(chain, blocks), &got), blocks) << "chain " << chain;
    ASSERT_TRUE(got == Sparse(*store, blocks, chain)) << "chain " << chain;
  }
  const uint64_t next = done.back() + 1;
  std::vector<std::byte> got;
  const uint32_t hit = RestoreAll(*store, ChainKeys(next, 1 + next % 7), &got);
  auto want = Sparse(*store, 1 + next % 7, next);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin())) << hit;
  EXPECT_EQ(store->Stats().checksum_failures + store->Stats().decode_failures, 0u);
}

TEST(StoreCodecTest, RawAndCodedExtentsShareOneLog) {
  TempDir dir;
  StoreOptions o = On(Medium::kSsd, dir.Sub("ssd"));
  o.sized_extents = false;  // fixed extents: the log is only as new as its records need (sized: version 6 from the start)
  {
    auto store = OpenStore(o);
    ASSERT_TRUE(PutChain(*store, 1, 1, 4).ok());
    EXPECT_EQ(store->Stats().ssd.stored_bytes, 4 * store->BlockBytes());
    ASSERT_TRUE(store->Close().ok());
  }
  // The first put records chain positions (version 4).
  EXPECT_EQ(ManifestVersion(dir.Sub("ssd")), persist::kManifestVersionPositions);
  auto store = OpenStore(o);
  ASSERT_TRUE(store->Put(2, ChainKeys(2, 2), Payload(*store, 2, 2), {PutHint::kAuto, Raw()}).ok());
  EXPECT_EQ(ManifestVersion(dir.Sub("ssd")), persist::kManifestVersionPositions);
  auto second = OpenStore(o);
  EXPECT_EQ(second->Match(ChainKeys(1, 4)), 4u);
  EXPECT_EQ(second->Match(ChainKeys(2, 2)), 2u);
  const SliceLayout layout{o.shape, o.block_tokens};
  EXPECT_EQ(second->Stats().ssd.stored_bytes, 4 * second->BlockBytes() + 2 * o.shape.layers * Raw()->MaxEncodedSize(layout));
}

TEST(StoreCodecTest, ASessionSwitchingCodecsRestoresAcrossThem) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 16, 64);
  o.session_dram_share_bytes = kSmallExtentBytes;  // one DRAM extent, then SSD
  auto zrle = std::make_shared<ZeroRunCodec>();
  auto store = OpenStore(o);
  const size_t n = 20;
  auto keys = ChainKeys(1, n);
  auto data = Sparse(*store, n, 3);
  ASSERT_TRUE(PutWith(*store, 1, keys, 0, 3, data).ok());           // raw, unframed
  ASSERT_TRUE(PutWith(*store, 1, keys, 3, 5, data, zrle).ok());     // variable size
  ASSERT_TRUE(PutWith(*store, 1, keys, 8, 4, data, Raw()).ok());    // fixed size
  ASSERT_TRUE(PutWith(*store, 1, keys, 12, 3, data).ok());          // raw again
  ASSERT_TRUE(PutWith(*store, 1, keys, 15, 5, data, zrle).ok());
  StoreStats st = store->Stats();
  EXPECT_EQ(st.ssd.blocks, n);  // every block's home
  EXPECT_GT(st.dram.blocks, 0u);  // the first extent's copy
  EXPECT_LT(st.dram.blocks, n);
  ExpectRestores(*store, keys, data, n);
  // Restores starting inside each stretch.
  for (size_t from : {2, 4, 9, 13, 16}) {
    std::vector<BlockKey> tail(keys.begin() + from, keys.end());
    std::vector<std::byte> rest(data.begin() + from * store->BlockBytes(), data.end());
    ExpectRestores(*store, tail, rest, uint32_t(n - from));
  }
  // SSD blocks survive a restart whatever their codec (the unregistered one
  // given again; raw is made from its recorded spec).
  const uint64_t ssd_blocks = st.ssd.blocks;
  store.reset();
  o.codec = zrle;
  auto again = OpenStore(o);
  EXPECT_EQ(again->Stats().recovered_blocks, ssd_blocks);
}

TEST(StoreCodecTest, CorruptEncodedBytesOnSsdAreACleanMiss) {
  TempDir dir;
  StoreOptions o = On(Medium::kSsd, dir.Sub("ssd"));
  o.codec = std::make_shared<ZeroRunCodec>();
  auto store = OpenStore(o);
  auto keys = ChainKeys(1, 6);
  auto data = Sparse(*store, 6, 4);
  ASSERT_TRUE(PutWith(*store, 1, keys, 0, 6, data).ok());
  uint64_t at;
  {
    auto r = store->StartRestore(keys);
    ASSERT_TRUE(r.ok());
    at = r.value()->locations()[2].layer0.offset() + codec::kHeaderBytes + 3;
  }
  const uint64_t seg = at / o.segment_bytes;
  char name[32];
  std::snprintf(name, sizeof name, "/seg-%06llu.dat", (unsigned long long)seg);
  {
    std::fstream f(dir.Sub("ssd") + name, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(at % o.segment_bytes);
    char c;
    f.read(&c, 1);
    c ^= 0x5a;
    f.seekp(at % o.segment_bytes);
    f.write(&c, 1);
  }
  std::vector<std::byte> got;
  EXPECT_EQ(RestoreAll(*store, keys, &got), 2u);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin()));
  EXPECT_EQ(store->Stats().checksum_failures, 1u);
  EXPECT_EQ(store->Match(keys), 2u);  // the bad block left the index
  ExpectRestores(*store, keys, data, 2);
}

TEST(StoreCodecTest, ASliceThatDoesNotDecodeIsACleanMiss) {
  for (Medium m : {Medium::kDram, Medium::kSsd}) {
    TempDir dir;
    StoreOptions o = On(m, dir.Sub("ssd"));
    o.codec = std::make_shared<BrokenZeroRunCodec>(3 * o.block_tokens);  // block 3, layer 1
    auto store = OpenStore(o);
    auto keys = ChainKeys(1, 6);
    auto data = Sparse(*store, 6, 5);
    ASSERT_TRUE(PutWith(*store, 1, keys, 0, 6, data).ok());
    std::vector<std::byte> got;
    EXPECT_EQ(RestoreAll(*store, keys, &got), 3u) << MediumName(m);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin()));
    EXPECT_EQ(store->Stats().decode_failures, 1u);
    EXPECT_EQ(store->Match(keys), 3u);
  }
}

TEST(StoreCodecTest, PackedBlocksTakeLessCapacity) {
  // 4 DRAM extents of 4 raw blocks each.
  auto fill = [](std::shared_ptr<const Codec> codec, uint64_t* stored) {
    StoreOptions o = SmallOptions("", 4, 0);
    o.codec = std::move(codec);
    auto store = OpenStore(o);
    auto keys = ChainKeys(1, 24);
    auto data = Sparse(*store, 24, 6);
    Status s = PutWith(*store, 1, keys, 0, 24, data);
    EXPECT_FALSE(s.ok() && !o.codec) << "24 raw blocks cannot fit 16 slots";
    const uint32_t held = store->Match(keys);
    ExpectRestores(*store, keys, data, held);
    *stored = store->Stats().dram.stored_bytes;
    EXPECT_EQ(store->Stats().dram.logical_bytes, held * store->BlockBytes());
    EXPECT_TRUE(store->DropSession(1).ok());
    EXPECT_EQ(store->Stats().dram.stored_bytes, 0u);
    EXPECT_EQ(store->Stats().dram.blocks, 0u);
    return held;
  };
  uint64_t raw_stored = 0, zrle_stored = 0;
  EXPECT_EQ(fill(nullptr, &raw_stored), 16u);
  EXPECT_EQ(fill(std::make_shared<ZeroRunCodec>(), &zrle_stored), 24u);  // ~45% zeros: 24 blocks fit 16 slots
  EXPECT_EQ(raw_stored, 16u * 5 * 16384);
  EXPECT_LT(zrle_stored, raw_stored);
}

TEST(StoreCodecTest, ABlockTooLargeForAnExtentIsAClearError) {
  StoreOptions o = SmallOptions("", 16, 0);
  o.dram_extent_layer_bytes = 16384;  // one raw block per extent: an incompressible zrle slice is larger
  o.codec = std::make_shared<ZeroRunCodec>();
  auto store = OpenStore(o);
  Status s = PutChain(*store, 1, 1, 1);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_NE(s.message().find("layer region"), std::string::npos) << s.ToString();
  EXPECT_EQ(store->Match(ChainKeys(1, 1)), 0u);
}

TEST(StoreCodecTest, InjectedReadFaultsAreCleanMissesAndDropTheBlocksRead) {
  TempDir dir;
  StoreOptions o = On(Medium::kSsd, dir.Sub("ssd"));
  auto engine = InjectFaults(&o);
  o.codec = std::make_shared<ZeroRunCodec>();
  auto store = OpenStore(o);
  auto keys = ChainKeys(1, 8);
  auto data = Sparse(*store, 8, 7);
  ASSERT_TRUE(PutWith(*store, 1, keys, 0, 8, data).ok());
  for (io::Fault f : {io::Fault::kError, io::Fault::kShortRead}) {
    engine->AddRule({f, io::Op::kRead, -1, EIO, 2, 1});
    std::vector<std::byte> got;
    EXPECT_LT(RestoreAll(*store, keys, &got), 8u);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin()));
    engine->ClearRules();
  }
  // The failed reads dropped the blocks they read; put again, they restore.
  EXPECT_GT(store->Stats().dropped_blocks, 0u);
  EXPECT_LT(store->Match(keys), 8u);
  ASSERT_TRUE(PutWith(*store, 1, keys, 0, 8, data).ok());
  ExpectRestores(*store, keys, data, 8);
  // A failed write loses only that put's blocks.
  engine->AddRule({io::Fault::kError, io::Op::kWrite, -1, EIO, 0, 1});
  auto more = ChainKeys(2, 4);
  EXPECT_FALSE(store->Put(2, more, Sparse(*store, 4, 8), {PutHint::kAuto, nullptr, 0}).ok());
  engine->ClearRules();
  EXPECT_EQ(store->Match(more), 0u);
  ExpectRestores(*store, keys, data, 8);
}

}  // namespace
}  // namespace flatkv
