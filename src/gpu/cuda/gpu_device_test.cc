// Device tests (docs/gpu.md): run on a machine with a GPU by
// scripts/gpu-check.sh, not by ctest here (no device). Against the CUDA
// backend: bit-identical round trips into device memory from DRAM copies
// and from SSD homes through each SSD path (cuFile, "gds" or
// "cufile-compat" as the driver says, and the bounce buffer); a consumer kernel reading layer l after its event
// while layer l+1 still loads; a corrupted slice is a miss; the int8 and
// kivi decoders equal the CPU codec bit for bit on slices of awkward sizes; the
// checksum kernel gives BlockChecksum; the page scatter lands every page.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>

#include <fcntl.h>
#include <unistd.h>

#include "codec/dtype.h"
#include "common/checksum.h"
#include "flatkv/codec.h"
#include "gpu/copy_backend.h"
#include "gpu/device_ops.h"
#include "gpu/gpu_window.h"
#include "testing/test_util.h"

namespace flatkv::gpu {
namespace {

using namespace flatkv::testing;

std::unique_ptr<CopyBackend> Cuda() {
  auto b = MakeCudaCopyBackend(0);
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(b).value() : nullptr;
}

// The SSD path a window took, printed so the device log says it.
std::string SsdPath(const CopyBackend& backend, const GpuWindowStats& st) {
  if (st.file_reads == 0) return "bounce (" + (backend.file_read_path().empty() ? backend.no_file_reads_why()
                                                                                : std::string("files refused: ") +
                                                                                      std::to_string(st.files_refused)) + ")";
  return backend.file_read_path() + (st.bounce_bytes > 0 ? " + bounce" : "");
}

void RoundTrip(uint64_t dram_extents, bool file_reads = true) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), dram_extents, 16);
  o.window_layers = 2;
  auto store = OpenStore(o);
  const auto keys = ChainKeys(3, 8);
  const auto data = Payload(*store, keys.size(), 3);
  ASSERT_TRUE(store->Put(1, keys, data).ok());
  auto backend = Cuda();
  ASSERT_NE(backend, nullptr);
  const uint32_t layers = o.shape.layers;
  const uint64_t lb = store->BlockLayerBytes();
  auto w = GpuWindow::Start(backend.get(), *store, keys, 2, file_reads);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::vector<std::byte> host(keys.size() * lb);
  for (uint32_t l = 0; l < layers; ++l) {
    auto d = (*w)->WaitLayer(l);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    ASSERT_TRUE(backend->CopyToHost(host.data(), d->data, host.size()).ok());
    for (uint32_t b = 0; b < keys.size(); ++b)
      ASSERT_EQ(std::memcmp(host.data() + b * lb, data.data() + (uint64_t{b} * layers + l) * lb, lb), 0) << l << "/" << b;
    (*w)->ReleaseLayer(l);
  }
  EXPECT_EQ((*w)->Finish(), keys.size());
  const GpuWindowStats st = (*w)->Stats();
  if (dram_extents > 0) {
    EXPECT_EQ(st.pinned_bytes, 0u);  // DRAM hits: DMA from the arena, no host window
  } else {
    std::printf("[ ssd path ] %s\n", SsdPath(*backend, st).c_str());
    if (!file_reads) {
      EXPECT_EQ(st.file_reads, 0u);
    }
    // Where cuFile is there and took the segment file, every SSD byte came by its reads.
    if (file_reads && !backend->file_read_path().empty() && st.files_refused == 0) {
      EXPECT_EQ(st.file_read_bytes, uint64_t{layers} * keys.size() * lb);
      EXPECT_EQ(st.bounce_bytes, 0u);
      EXPECT_EQ(st.checksum_calls, st.file_reads);
    }
  }
  w->reset();
  GpuWindow::UnpinStore(backend.get(), *store);
}

TEST(GpuDeviceTest, RoundTripFromDramCopiesIsBitIdentical) { RoundTrip(8); }
TEST(GpuDeviceTest, RoundTripFromSsdHomesIsBitIdentical) { RoundTrip(0); }  // by cuFile where it can
TEST(GpuDeviceTest, RoundTripFromSsdThroughTheBounceBufferIsBitIdentical) { RoundTrip(0, /*file_reads=*/false); }

TEST(GpuDeviceTest, ConsumerComputesOnLayerWhileTheNextLoads) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 0, 16);
  auto store = OpenStore(o);
  const auto keys = ChainKeys(4, 8);
  ASSERT_TRUE(store->Put(1, keys, Payload(*store, keys.size(), 4)).ok());
  auto backend = Cuda();
  ASSERT_NE(backend, nullptr);
  auto ops = DeviceOps::Open(0);
  ASSERT_TRUE(ops.ok()) << ops.status().ToString();
  auto w = GpuWindow::Start(backend.get(), *store, keys, 2);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->WaitLayer(0).ok());
  // Compute on layer 0 (a spin kernel on its own stream) while the pump
  // goes on with layer 1.
  ASSERT_TRUE((*ops)->Spin(2'000'000).ok());
  auto one = (*w)->WaitLayer(1);
  ASSERT_TRUE(one.ok());
  ASSERT_TRUE((*ops)->Sync().ok());
  for (uint32_t l = 0; l < o.shape.layers; ++l) {
    ASSERT_TRUE((*w)->WaitLayer(l).ok());
    (*w)->ReleaseLayer(l);
  }
  EXPECT_EQ((*w)->Finish(), keys.size());
}

class GpuCorruptTest : public ::testing::TestWithParam<bool> {};

// Through each SSD path: cuFile reads checked by the kernel, and the bounce buffer checked on the host.
TEST_P(GpuCorruptTest, ACorruptedSliceIsAMiss) {
  TempDir dir;
  StoreOptions o = SmallOptions(dir.Sub("ssd"), 0, 16);
  auto store = OpenStore(o);
  const auto keys = ChainKeys(5, 4);
  ASSERT_TRUE(store->Put(1, keys, Payload(*store, keys.size(), 5)).ok());
  store.reset();
  {  // a byte of block 0's layer 0 flipped on disk (the first extent starts the segment)
    int fd = ::open((dir.Sub("ssd") + "/seg-000000.dat").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char c;
    ASSERT_EQ(::pread(fd, &c, 1, 100), 1);
    c ^= 0x5a;
    ASSERT_EQ(::pwrite(fd, &c, 1, 100), 1);
    ::close(fd);
  }
  store = OpenStore(o);
  auto backend = Cuda();
  ASSERT_NE(backend, nullptr);
  auto w = GpuWindow::Start(backend.get(), *store, keys, 2, /*file_reads=*/GetParam());
  ASSERT_TRUE(w.ok());
  auto d = (*w)->WaitLayer(0);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->blocks, 0u);  // the checksum caught it: nothing of it is delivered as valid
  for (uint32_t l = 0; l < o.shape.layers; ++l) {
    if (l > 0) {
      ASSERT_TRUE((*w)->WaitLayer(l).ok());
    }
    (*w)->ReleaseLayer(l);
  }
  EXPECT_EQ((*w)->Finish(), 0u);
  std::printf("[ ssd path ] %s\n", SsdPath(*backend, (*w)->Stats()).c_str());
  w->reset();
  EXPECT_EQ(store->Stats().checksum_failures, 1u);
}
INSTANTIATE_TEST_SUITE_P(BothSsdPaths, GpuCorruptTest, ::testing::Bool());

TEST(GpuDeviceTest, Int8DecoderEqualsTheCpuCodecOnAwkwardSizes) {
  auto codec = MakeCodec("int8");
  ASSERT_TRUE(codec.ok());
  auto backend = Cuda();
  ASSERT_NE(backend, nullptr);
  auto ops = DeviceOps::Open(0);
  ASSERT_TRUE(ops.ok());
  std::mt19937 rng(1);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
    for (uint32_t tokens : {1u, 17u, 64u, 333u})
      for (auto [heads, dim] : {std::pair{1u, 8u}, std::pair{3u, 64u}, std::pair{8u, 128u}, std::pair{5u, 72u}}) {
        KvShape shape = KvShape::Mha(2, heads, dim, dt);
        SliceLayout layout{shape, tokens, 1, 0};
        std::vector<float> f(layout.Elements());
        std::normal_distribution<float> n(0, 1);
        for (float& x : f) x = n(rng) * (rng() % 7 == 0 ? 300.f : 1.f);
        std::vector<std::byte> raw(layout.Bytes());
        codec::FromFloat(dt, f.data(), raw.data(), f.size());
        CodecContext ctx;
        std::vector<std::byte> enc((*codec)->MaxEncodedSize(layout));
        auto size = (*codec)->Encode(ctx, layout, raw, enc);
        ASSERT_TRUE(size.ok());
        enc.resize(*size);
        std::vector<std::byte> want(layout.Bytes()), got(layout.Bytes());
        ASSERT_TRUE(DecodeSlice(ctx, layout, enc, want).ok());
        std::byte* din = backend->AllocateDevice(enc.size());
        std::byte* dout = backend->AllocateDevice(want.size());
        ASSERT_TRUE(backend->EnqueueCopy(din, enc.data(), enc.size()).ok());
        ASSERT_TRUE(backend->Wait(backend->Record()).ok());
        ASSERT_TRUE((*ops)->DecodeInt8(layout, enc, din, dout).ok());
        ASSERT_TRUE((*ops)->Sync().ok());
        ASSERT_TRUE(backend->CopyToHost(got.data(), dout, got.size()).ok());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0)
            << "dtype " << int(dt) << " tokens " << tokens << " heads " << heads << " dim " << dim;
        backend->FreeDevice(din);
        backend->FreeDevice(dout);
      }
}

TEST(GpuDeviceTest, KiviDecoderEqualsTheCpuCodecOnAwkwardSizes) {
  auto backend = Cuda();
  ASSERT_NE(backend, nullptr);
  auto ops = DeviceOps::Open(0);
  ASSERT_TRUE(ops.ok());
  std::mt19937 rng(2);
  std::normal_distribution<float> n(0, 1);
  for (const char* spec : {"kivi:bits=2,group=32", "kivi:bits=4,group=7"}) {
    auto codec = MakeCodec(spec);
    ASSERT_TRUE(codec.ok());
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
      for (uint32_t tokens : {1u, 17u, 64u, 333u})
        for (int shape_i = 0; shape_i < 3; ++shape_i)
          for (float scale : {1.0f, 1e6f}) {  // 1e6: f32 (wide) group metadata
            const KvShape shape = shape_i == 0   ? KvShape::Mha(2, 3, 64, dt)
                                  : shape_i == 1 ? KvShape::Mha(2, 5, 72, dt)
                                                 : KvShape::Mla(2, 96, 16, dt);
            SliceLayout layout{shape, tokens, 1, 0};
            std::vector<float> f(layout.Elements());
            for (float& x : f) x = n(rng) * (rng() % 7 == 0 ? 30.f : 1.f) * scale;
            std::vector<std::byte> raw(layout.Bytes());
            codec::FromFloat(dt, f.data(), raw.data(), f.size());
            CodecContext ctx;
            std::vector<std::byte> enc((*codec)->MaxEncodedSize(layout));
            auto size = (*codec)->Encode(ctx, layout, raw, enc);
            ASSERT_TRUE(size.ok());
            enc.resize(*size);
            std::vector<std::byte> want(layout.Bytes()), got(layout.Bytes());
            ASSERT_TRUE(DecodeSlice(ctx, layout, enc, want).ok());
            std::byte* din = backend->AllocateDevice(enc.size());
            std::byte* dout = backend->AllocateDevice(want.size());
            ASSERT_TRUE(backend->EnqueueCopy(din, enc.data(), enc.size()).ok());
            ASSERT_TRUE(backend->Wait(backend->Record()).ok());
            ASSERT_TRUE((*ops)->DecodeKivi(layout, enc, din, dout).ok());
            ASSERT_TRUE((*ops)->Sync().ok());
            ASSERT_TRUE(backend->CopyToHost(got.data(), dout, got.size()).ok());
            EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0)
                << spec << " dtype " << int(dt) << " tokens " << tokens << " shape " << shape_i << " scale " << scale;
            backend->FreeDevice(din);
            backend->FreeDevice(dout);
          }
  }
}

// The checksum kernel gives the store's BlockChecksum for slices of every
// length class (short, mid-size, whole and partial 1 KiB blocks, a block
// slice's 256 KiB), at odd strides (unaligned starts).
TEST(GpuDeviceTest, ChecksumKernelEqualsBlockChecksum) {
  auto backend = Cuda();
  ASSERT_NE(backend, nullptr);
  auto ops = DeviceOps::Open(0);
  ASSERT_TRUE(ops.ok()) << ops.status().ToString();
  std::mt19937_64 rng(9);
  for (uint64_t bytes : {0ull, 3ull, 8ull, 16ull, 17ull, 128ull, 129ull, 240ull, 241ull, 1024ull, 1025ull, 4099ull,
                         16384ull, 262144ull}) {
    for (uint64_t pad : {0ull, 5ull}) {
      const uint32_t n = 37;
      const uint64_t stride = bytes + pad;
      std::vector<std::byte> host(n * stride + 1);
      for (std::byte& b : host) b = std::byte(rng());
      std::byte* dev = backend->AllocateDevice(host.size());
      std::byte* sums = backend->AllocateDevice(n * sizeof(uint64_t));
      ASSERT_TRUE(dev != nullptr && sums != nullptr);
      ASSERT_TRUE(backend->EnqueueCopy(dev, host.data(), host.size()).ok());
      ASSERT_TRUE(backend->Wait(backend->Record()).ok());
      ASSERT_TRUE((*ops)->Checksums(dev, n, bytes, stride, reinterpret_cast<uint64_t*>(sums)).ok());
      ASSERT_TRUE((*ops)->Sync().ok());
      std::vector<uint64_t> got(n);
      ASSERT_TRUE(backend->CopyToHost(reinterpret_cast<std::byte*>(got.data()), sums, n * sizeof(uint64_t)).ok());
      for (uint32_t j = 0; j < n; ++j)
        ASSERT_EQ(got[j], BlockChecksum(host.data() + j * stride, bytes)) << "bytes " << bytes << " stride " << stride << " slice " << j;
      backend->FreeDevice(dev);
      backend->FreeDevice(sums);
    }
  }
}

TEST(GpuDeviceTest, ScatterLandsEveryPage) {
  auto backend = Cuda();
  ASSERT_NE(backend, nullptr);
  const uint64_t page = 4096 + 48, pages = 3000;  // more pages than one launch takes, odd sizes
  std::vector<std::byte> host(page * pages);
  for (size_t i = 0; i < host.size(); ++i) host[i] = std::byte(i * 131 + 7);
  std::byte* slot = backend->AllocateDevice(host.size());
  std::byte* cache = backend->AllocateDevice(host.size());
  ASSERT_TRUE(backend->EnqueueCopy(slot, host.data(), host.size()).ok());
  std::vector<PageCopy> table;
  for (uint64_t p = 0; p < pages; ++p) table.push_back({p * page, cache + (pages - 1 - p) * page, page});
  ASSERT_TRUE(backend->EnqueueScatter(slot, table).ok());
  std::vector<std::byte> back(host.size());
  ASSERT_TRUE(backend->CopyToHost(back.data(), cache, back.size()).ok());
  for (uint64_t p = 0; p < pages; ++p)
    ASSERT_EQ(std::memcmp(back.data() + (pages - 1 - p) * page, host.data() + p * page, page), 0) << p;
  backend->FreeDevice(slot);
  backend->FreeDevice(cache);
}

}  // namespace
}  // namespace flatkv::gpu
