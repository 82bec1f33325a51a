// Device tests (docs/gpu.md): run on a machine with a GPU by
// scripts/gpu-check.sh. ctest runs them here too on the CPU backend
// (FLATKV_GPU_TEST_BACKEND=cpu: its file reads and decoders stand for
// cuFile's and the CUDA kernels), so their logic has run before the one
// device run; those that need DeviceOps (CUDA kernels) are skipped there.
// Against the CUDA backend: bit-identical round trips into device memory from DRAM copies
// and from SSD homes through each SSD path (cuFile, "gds" or
// "cufile-compat" as the driver says, and the bounce buffer); int8 and kivi
// stores decoded on the device as a host restore decodes them; a consumer kernel reading layer l after its event
// while layer l+1 still loads (its sums checked); a corrupted slice is a miss; the int8 and
// kivi decoders equal the CPU codec bit for bit on slices of awkward sizes; the
// checksum kernel gives BlockChecksum; device memory is 4 KiB-aligned; the
// page scatter lands every page.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
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

// The backend under test: "cuda" unless FLATKV_GPU_TEST_BACKEND names another.
std::string BackendName() {
  const char* name = std::getenv("FLATKV_GPU_TEST_BACKEND");
  return name && *name ? name : "cuda";
}
std::unique_ptr<CopyBackend> Cuda() {
  auto b = MakeCopyBackend(BackendName());
  EXPECT_TRUE(b.ok()) << b.status().ToString();
  return b.ok() ? std::move(b).value() : nullptr;
}
// The CUDA kernels, or a skip where the backend under test is not CUDA.
#define OPEN_DEVICE_OPS(ops)                                                        \
  if (BackendName() != "cuda")                                                      \
    GTEST_SKIP() << "DeviceOps are CUDA kernels: not on the " << BackendName() << " backend"; \
  auto ops = DeviceOps::Open(0);                                                    \
  ASSERT_TRUE(ops.ok()) << ops.status().ToString()

// The SSD path a window took, printed so the device log says it.
std::string SsdPath(const CopyBackend& backend, const GpuWindowStats& st) {
  if (st.file_reads == 0) {
    if (backend.file_read_path().empty()) return "bounce (" + backend.no_file_reads_why() + ")";
    if (st.files_refused > 0) return "bounce (" + std::to_string(st.files_refused) + " files refused by " + backend.file_read_path() + ")";
    return "bounce (file reads off)";
  }
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

// int8- and kivi-coded stores (DRAM and SSD) restored into device memory,
// decoded there from their encoded slices: every layer equals what a
// restore into the host window delivers.
TEST(GpuDeviceTest, CodedRestoresDecodedOnTheDeviceEqualHostRestores) {
  for (const char* spec : {"int8", "kivi"})
    for (uint64_t dram : {8u, 0u}) {
      TempDir dir;
      StoreOptions o = SmallOptions(dir.Sub("ssd"), dram, 16);
      auto store = OpenStore(o);
      const auto keys = ChainKeys(6, 8);
      std::vector<float> f(keys.size() * o.shape.layers * store->BlockLayerBytes() / DTypeBytes(o.shape.dtype));
      std::mt19937 rng(6);
      std::normal_distribution<float> n(0, 1);
      for (float& x : f) x = n(rng);
      std::vector<std::byte> data(f.size() * DTypeBytes(o.shape.dtype));
      codec::FromFloat(o.shape.dtype, f.data(), data.data(), f.size());
      auto codec = MakeCodec(spec);
      ASSERT_TRUE(codec.ok());
      PutOptions po;
      po.codec = std::shared_ptr<const Codec>(std::move(codec).value());
      ASSERT_TRUE(store->Put(1, keys, data, po).ok());
      const uint32_t layers = o.shape.layers;
      const uint64_t lb = store->BlockLayerBytes();
      std::vector<std::vector<std::byte>> want;
      {
        auto r = store->StartRestore(keys);
        ASSERT_TRUE(r.ok());
        for (uint32_t l = 0; l < layers; ++l) {
          auto v = (*r)->WaitLayer(l);
          ASSERT_TRUE(v.ok() && v->blocks == keys.size());
          want.emplace_back(v->data.begin(), v->data.end());
          (*r)->ReleaseLayer(l);
        }
      }
      auto backend = Cuda();
      ASSERT_NE(backend, nullptr);
      auto w = GpuWindow::Start(backend.get(), *store, keys, 2);
      ASSERT_TRUE(w.ok()) << w.status().ToString();
      std::vector<std::byte> host(keys.size() * lb);
      for (uint32_t l = 0; l < layers; ++l) {
        auto d = (*w)->WaitLayer(l);
        ASSERT_TRUE(d.ok()) << d.status().ToString();
        ASSERT_EQ(d->blocks, keys.size()) << spec << " layer " << l;
        ASSERT_TRUE(backend->CopyToHost(host.data(), d->data, host.size()).ok());
        ASSERT_EQ(std::memcmp(host.data(), want[l].data(), host.size()), 0) << spec << " dram " << dram << " layer " << l;
        (*w)->ReleaseLayer(l);
      }
      EXPECT_EQ((*w)->Finish(), keys.size());
      EXPECT_EQ((*w)->Stats().decoded_slices, uint64_t{layers} * keys.size()) << spec;
      w->reset();
      GpuWindow::UnpinStore(backend.get(), *store);
    }
}

// A consumer kernel reads layer l as soon as WaitLayer(l) returns (the
// checksum kernel over the slot, on DeviceOps' own stream, then a spin
// standing for the layer's attention) while the window goes on loading
// layer l+1 into the other slot, from DRAM and from SSD: every layer's sums
// equal those of the blocks put, so what the consumer read was the layer.
TEST(GpuDeviceTest, ConsumerKernelReadsEachLayerWhileTheNextLoads) {
  auto backend = Cuda();
  ASSERT_NE(backend, nullptr);
  OPEN_DEVICE_OPS(ops);
  for (uint64_t dram : {8u, 0u}) {
    TempDir dir;
    StoreOptions o = SmallOptions(dir.Sub("ssd"), dram, 16);
    auto store = OpenStore(o);
    const auto keys = ChainKeys(4, 8);
    const auto data = Payload(*store, keys.size(), 4);
    ASSERT_TRUE(store->Put(1, keys, data).ok());
    const uint32_t layers = o.shape.layers, n = uint32_t(keys.size());
    const uint64_t lb = store->BlockLayerBytes();
    std::byte* sums = backend->AllocateDevice(n * sizeof(uint64_t));
    ASSERT_NE(sums, nullptr);
    auto w = GpuWindow::Start(backend.get(), *store, keys, 2);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    std::vector<uint64_t> got(n);
    for (uint32_t l = 0; l < layers; ++l) {
      auto d = (*w)->WaitLayer(l);
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      ASSERT_EQ(d->blocks, n) << "dram " << dram << " layer " << l;
      ASSERT_TRUE((*ops)->Checksums(d->data, n, lb, lb, reinterpret_cast<uint64_t*>(sums)).ok());
      ASSERT_TRUE((*ops)->Spin(200'000).ok());
      ASSERT_TRUE((*ops)->Sync().ok());
      ASSERT_TRUE(backend->CopyToHost(reinterpret_cast<std::byte*>(got.data()), sums, n * sizeof(uint64_t)).ok());
      for (uint32_t b = 0; b < n; ++b)
        ASSERT_EQ(got[b], BlockChecksum(data.data() + (uint64_t{b} * layers + l) * lb, lb))
            << "dram " << dram << " layer " << l << " block " << b;
      (*w)->ReleaseLayer(l);
    }
    EXPECT_EQ((*w)->Finish(), n);
    w->reset();
    GpuWindow::UnpinStore(backend.get(), *store);
    backend->FreeDevice(sums);
  }
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

// Every slice decodes on the device (DecodeInt8 or DecodeKivi) to the CPU
// codec's bytes, on slices of awkward sizes: 1 to 333 tokens, head dims 8
// to 128, MLA (with and without a RoPE key), f32, f16 and bf16, f16 and f32
// (wide) metadata: the shapes gpu/group_dequant_test.cc checks on the host.
void ExpectDeviceDecodesAsTheCpu(const std::vector<std::string>& specs, bool kivi) {
  auto backend = Cuda();
  ASSERT_NE(backend, nullptr);
  OPEN_DEVICE_OPS(ops);
  std::mt19937 rng(1);
  for (const std::string& spec : specs) {
    auto codec = MakeCodec(spec);
    ASSERT_TRUE(codec.ok()) << spec;
    for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
      for (uint32_t tokens : {1u, 17u, 64u, 333u})
        for (const KvShape& shape : {KvShape::Mha(2, 1, 8, dt), KvShape::Mha(2, 3, 64, dt), KvShape::Mha(2, 8, 128, dt),
                                     KvShape::Mha(2, 5, 72, dt), KvShape::Mla(2, 96, 16, dt), KvShape::Mla(2, 64, 0, dt)})
          for (float scale : {1.0f, 1e6f}) {
            const SliceLayout layout{shape, tokens, 1, 0};
            const CodedSlice slice = EncodeKvSlice(**codec, layout, rng, scale);
            ASSERT_FALSE(slice.decoded.empty());
            std::vector<std::byte> got(layout.Bytes());
            std::byte* din = backend->AllocateDevice(slice.encoded.size());
            std::byte* dout = backend->AllocateDevice(got.size());
            ASSERT_TRUE(din != nullptr && dout != nullptr);
            ASSERT_TRUE(backend->EnqueueCopy(din, slice.encoded.data(), slice.encoded.size()).ok());
            ASSERT_TRUE(backend->Wait(backend->Record()).ok());
            const Status s = kivi ? (*ops)->DecodeKivi(layout, slice.encoded, din, dout)
                                  : (*ops)->DecodeInt8(layout, slice.encoded, din, dout);
            ASSERT_TRUE(s.ok()) << s.ToString();
            ASSERT_TRUE((*ops)->Sync().ok());
            ASSERT_TRUE(backend->CopyToHost(got.data(), dout, got.size()).ok());
            EXPECT_EQ(std::memcmp(got.data(), slice.decoded.data(), got.size()), 0)
                << spec << " dtype " << int(dt) << " tokens " << tokens << " dims " << shape.kv_heads << "x"
                << shape.head_dim << " scale " << scale;
            backend->FreeDevice(din);
            backend->FreeDevice(dout);
          }
  }
}

TEST(GpuDeviceTest, Int8DecoderEqualsTheCpuCodecOnAwkwardSizes) { ExpectDeviceDecodesAsTheCpu({"int8"}, false); }
TEST(GpuDeviceTest, KiviDecoderEqualsTheCpuCodecOnAwkwardSizes) {
  ExpectDeviceDecodesAsTheCpu({"kivi:bits=2,group=32", "kivi:bits=4,group=7"}, true);
}

// The checksum kernel gives the store's BlockChecksum for slices of every
// length class (short, mid-size, whole and partial 1 KiB blocks, a block
// slice's 256 KiB), at odd strides (unaligned starts).
TEST(GpuDeviceTest, ChecksumKernelEqualsBlockChecksum) {
  auto backend = Cuda();
  ASSERT_NE(backend, nullptr);
  OPEN_DEVICE_OPS(ops);
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

// Device memory comes 4 KiB-aligned at every size (an SSD run is read into
// a slot in place only at an aligned destination), and frees cleanly.
TEST(GpuDeviceTest, AllocationsAreAlignedTo4KiB) {
  auto backend = Cuda();
  ASSERT_NE(backend, nullptr);
  std::vector<std::byte*> held;
  for (uint64_t bytes : {1ull, 100ull, 4095ull, 5000ull, 65536ull + 7, (1ull << 20) + 3, 3ull << 20}) {
    std::byte* p = backend->AllocateDevice(bytes);
    ASSERT_NE(p, nullptr) << bytes;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 4096, 0u) << bytes << " bytes at " << static_cast<void*>(p);
    held.push_back(p);
  }
  for (std::byte* p : held) backend->FreeDevice(p);
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
