// GpuWindow on the CPU copy backend (also run under ThreadSanitizer: the
// restore's I/O threads copying through the backend's queue against the
// consumer): the window's logic as it runs on a GPU (docs/gpu.md). The CPU
// backend's device memory is PROT_NONE outside its own operations, so a
// restore writing a device destination itself faults here. Every layer lands
// bit for bit from DRAM (copied straight from the arena, no host window),
// from SSD homes (through the pinned host window, or read straight into
// device memory and checked there by a backend that reads files) and from a
// coded store;
// slots recycle only as the consumer releases them; a layer beyond the window
// is refused by name; a failed copy or file read is a clean miss that leaves
// the store's blocks in place; a corrupt slice read into device memory is a
// miss that leaves the index; a cancelled window copies no more.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "flatkv/codec.h"
#include "gpu/copy_backend.h"
#include "gpu/gpu_window.h"
#include "testing/test_util.h"
#include "testing/zero_run_codec.h"

namespace flatkv::gpu {
namespace {

using namespace flatkv::testing;

struct Stored {
  TempDir dir;
  std::unique_ptr<Store> store;
  std::vector<BlockKey> keys;
  std::vector<std::byte> data;
  uint32_t layers = 0;
  uint64_t lb = 0;

  explicit Stored(uint64_t dram_extents, size_t blocks = 8, std::shared_ptr<const Codec> codec = nullptr,
                  bool verify_dram = false) {
    StoreOptions o = SmallOptions(dir.Sub("ssd"), dram_extents, 16);
    o.window_layers = 2;  // the restore's host window is smaller than the model
    o.verify_dram_reads = verify_dram;
    store = OpenStore(o);
    keys = ChainKeys(7, blocks);
    data = Payload(*store, blocks, 7);
    PutOptions po;
    po.codec = std::move(codec);
    EXPECT_TRUE(store->Put(1, keys, data, po).ok());
    layers = store->options().shape.layers;
    lb = store->BlockLayerBytes();
  }
  // Block b's layer l as put (block-major input).
  const std::byte* Expected(uint32_t b, uint32_t l) const { return data.data() + (uint64_t{b} * layers + l) * lb; }
  std::unique_ptr<GpuWindow> Window(CopyBackend* backend, uint32_t slots) {
    auto w = GpuWindow::Start(backend, *store, keys, slots);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return w.ok() ? std::move(w).value() : nullptr;
  }
  // Every layer of `w`, copied back to the host, equals what was put.
  void ExpectAllLayers(GpuWindow& w, CopyBackend& backend) {
    std::vector<std::byte> host(keys.size() * lb);
    for (uint32_t l = 0; l < layers; ++l) {
      auto d = w.WaitLayer(l);
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      ASSERT_EQ(d->blocks, keys.size());
      ASSERT_TRUE(backend.CopyToHost(host.data(), d->data, host.size()).ok());
      for (uint32_t b = 0; b < keys.size(); ++b)
        ASSERT_EQ(std::memcmp(host.data() + b * lb, Expected(b, l), lb), 0) << "layer " << l << " block " << b;
      w.ReleaseLayer(l);
    }
    EXPECT_EQ(w.Finish(), keys.size());
  }
};

// A backend that reads files (the CPU backend's pread, as cuFile does on a
// GPU): SSD hits are read straight into the device slots, checked there,
// with no host window at all.
std::unique_ptr<CopyBackend> FileReadingBackend(uint64_t fail_reads = 0) {
  return MakeCpuCopyBackend(CpuBackendOptions{0, /*file_reads=*/true, fail_reads});
}

TEST(GpuWindowTest, DramHitsAreCopiedStraightFromTheArena) {
  Stored s(/*dram_extents=*/8);
  auto backend = MakeCpuCopyBackend();
  auto w = s.Window(backend.get(), 2);
  ASSERT_NE(w, nullptr);
  s.ExpectAllLayers(*w, *backend);
  const GpuWindowStats st = w->Stats();
  // No host window: each layer is one copy per extent (two of 4 blocks) from the arena.
  EXPECT_EQ(st.pinned_bytes, 0u);
  EXPECT_EQ(st.copies, uint64_t{s.layers} * 2);
  EXPECT_EQ(st.copy_bytes, uint64_t{s.layers} * s.keys.size() * s.lb);
  EXPECT_EQ(backend->Stats().h2d_bytes, uint64_t{s.layers} * s.keys.size() * s.lb);
  EXPECT_GE(backend->Stats().registered_bytes, s.store->DramMemory().size());  // the arena, pinned
}

// verify_dram_reads: DRAM hits copied to the device are checked in the
// arena, where they were copied from (a wrong address would be a mismatch).
TEST(GpuWindowTest, CheckedDramHitsAreCheckedWhereTheyWereCopiedFrom) {
  Stored s(/*dram_extents=*/8, 8, nullptr, /*verify_dram=*/true);
  auto backend = MakeCpuCopyBackend();
  auto w = s.Window(backend.get(), 2);
  ASSERT_NE(w, nullptr);
  s.ExpectAllLayers(*w, *backend);
  EXPECT_EQ(w->Stats().pinned_bytes, 0u);
  EXPECT_EQ(s.store->Stats().checksum_failures, 0u);
}

TEST(GpuWindowTest, SsdHitsGoThroughThePinnedHostWindow) {
  Stored s(/*dram_extents=*/0);
  auto backend = MakeCpuCopyBackend();
  auto w = s.Window(backend.get(), 3);
  ASSERT_NE(w, nullptr);
  s.ExpectAllLayers(*w, *backend);
  EXPECT_GT(w->Stats().pinned_bytes, 0u);  // the bounce buffer
  EXPECT_EQ(w->Stats().bounce_bytes, uint64_t{s.layers} * s.keys.size() * s.lb);  // every byte copied from it
  EXPECT_EQ(w->Stats().copies, uint64_t{s.layers} * 2);  // a layer's run each, once checked
}


TEST(GpuWindowTest, SsdHitsAreReadStraightIntoDeviceMemoryAndCheckedThere) {
  Stored s(/*dram_extents=*/0);
  auto backend = FileReadingBackend();
  auto w = s.Window(backend.get(), 3);
  ASSERT_NE(w, nullptr);
  s.ExpectAllLayers(*w, *backend);
  const GpuWindowStats st = w->Stats();
  // Each layer: one read per extent's run (two of 4 blocks), each checked in device memory.
  EXPECT_EQ(st.file_reads, uint64_t{s.layers} * 2);
  EXPECT_EQ(st.file_read_bytes, uint64_t{s.layers} * s.keys.size() * s.lb);
  EXPECT_EQ(st.checksum_calls, st.file_reads);
  EXPECT_EQ(st.copies, 0u);        // nothing through a host copy
  EXPECT_EQ(st.pinned_bytes, 0u);  // no host window
  EXPECT_EQ(st.bounce_bytes, 0u);
  EXPECT_EQ(backend->Stats().registered_files, 1u);  // the one segment file
  EXPECT_EQ(s.store->Stats().ssd.bytes_delivered, uint64_t{s.layers} * s.keys.size() * s.lb);
  EXPECT_EQ(s.store->Stats().checksum_failures, 0u);
}

TEST(GpuWindowTest, WithoutFileReadsSsdHitsBounceThroughTheHostWindow) {
  Stored s(/*dram_extents=*/0);
  auto backend = FileReadingBackend();
  auto w = GpuWindow::Start(backend.get(), *s.store, s.keys, 3, /*file_reads=*/false);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  s.ExpectAllLayers(**w, *backend);
  EXPECT_EQ((*w)->Stats().file_reads, 0u);
  EXPECT_EQ((*w)->Stats().bounce_bytes, uint64_t{s.layers} * s.keys.size() * s.lb);
}

// Flips one byte of block `b`'s layer `l` where the SSD holds it (found by
// its bytes: the payload is random).
void CorruptOnSsd(const Stored& s, uint32_t b, uint32_t l) {
  const std::string want(reinterpret_cast<const char*>(s.Expected(b, l)), s.lb);
  for (const auto& f : std::filesystem::recursive_directory_iterator(s.dir.Sub("ssd"))) {
    if (!f.is_regular_file()) continue;
    std::ifstream in(f.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const size_t at = bytes.find(want);
    if (at == std::string::npos) continue;
    std::fstream io(f.path(), std::ios::binary | std::ios::in | std::ios::out);
    io.seekp(static_cast<std::streamoff>(at + 100));
    io.put(static_cast<char>(bytes[at + 100] ^ 0x5a));
    return;
  }
  ADD_FAILURE() << "block " << b << " layer " << l << " not found on the SSD";
}

TEST(GpuWindowTest, ACorruptSliceReadIntoDeviceMemoryIsAMissAndLeavesTheIndex) {
  Stored s(/*dram_extents=*/0);
  CorruptOnSsd(s, 5, 3);
  auto backend = FileReadingBackend();
  auto w = s.Window(backend.get(), 2);
  ASSERT_NE(w, nullptr);
  std::vector<std::byte> host(s.keys.size() * s.lb);
  for (uint32_t l = 0; l < s.layers; ++l) {
    auto d = w->WaitLayer(l);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    // A view carries the blocks valid in every layer landed so far: before
    // layer 3, all 8 or (layer 3 already checked) 5; from layer 3 on, 5.
    if (l < 3) {
      EXPECT_TRUE(d->blocks == s.keys.size() || d->blocks == 5u) << "layer " << l << ": " << d->blocks;
    } else {
      EXPECT_EQ(d->blocks, 5u) << "layer " << l;
    }
    ASSERT_TRUE(backend->CopyToHost(host.data(), d->data, d->blocks * s.lb).ok());
    for (uint32_t b = 0; b < d->blocks; ++b)
      ASSERT_EQ(std::memcmp(host.data() + b * s.lb, s.Expected(b, l), s.lb), 0) << "layer " << l << " block " << b;
    w->ReleaseLayer(l);
  }
  EXPECT_EQ(w->Finish(), 5u);
  EXPECT_GT(w->Stats().file_reads, 0u);
  w.reset();
  EXPECT_EQ(s.store->Stats().checksum_failures, 1u);
  EXPECT_EQ(s.store->Match(s.keys), 5u);  // the corrupt block left the index
}

// A backend that decodes int8 and kivi slices into its memory (the CPU
// codec standing for the CUDA decoders), and reads files.
std::unique_ptr<CopyBackend> DecodingBackend(uint64_t fail_decodes = 0) {
  return MakeCpuCopyBackend(CpuBackendOptions{0, /*file_reads=*/true, 0, /*decodes=*/true, fail_decodes});
}

// Every layer of `s`'s chain as a restore into the store's host window
// delivers it (a lossy codec's decoded bytes).
std::vector<std::vector<std::byte>> HostLayers(Stored& s) {
  std::vector<std::vector<std::byte>> layers;
  auto r = s.store->StartRestore(s.keys);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return layers;
  for (uint32_t l = 0; l < s.layers; ++l) {
    auto v = (*r)->WaitLayer(l);
    EXPECT_TRUE(v.ok() && v->blocks == s.keys.size());
    if (!v.ok()) return layers;
    layers.emplace_back(v->data.begin(), v->data.end());
    (*r)->ReleaseLayer(l);
  }
  (*r)->Finish();
  return layers;
}

TEST(GpuWindowTest, Int8AndKiviExtentsAreDecodedOnTheDeviceFromTheirEncodedSlices) {
  for (const char* spec : {"int8", "kivi:bits=2,group=32"})
    for (uint64_t dram : {8u, 0u}) {
      auto codec = MakeCodec(spec);
      ASSERT_TRUE(codec.ok());
      Stored s(dram, 8, std::shared_ptr<const Codec>(std::move(codec).value()));
      const auto want = HostLayers(s);
      ASSERT_EQ(want.size(), s.layers);
      auto backend = DecodingBackend();
      auto w = s.Window(backend.get(), 2);
      ASSERT_NE(w, nullptr);
      std::vector<std::byte> host(s.keys.size() * s.lb);
      for (uint32_t l = 0; l < s.layers; ++l) {
        auto d = w->WaitLayer(l);
        ASSERT_TRUE(d.ok()) << d.status().ToString();
        ASSERT_EQ(d->blocks, s.keys.size());
        ASSERT_TRUE(backend->CopyToHost(host.data(), d->data, host.size()).ok());
        ASSERT_EQ(std::memcmp(host.data(), want[l].data(), host.size()), 0) << spec << " dram " << dram << " layer " << l;
        w->ReleaseLayer(l);
      }
      EXPECT_EQ(w->Finish(), s.keys.size());
      const GpuWindowStats st = w->Stats();
      EXPECT_EQ(st.decoded_slices, uint64_t{s.layers} * s.keys.size()) << spec;
      EXPECT_LT(st.decode_in_bytes, uint64_t{s.layers} * s.keys.size() * s.lb) << spec;  // encoded, not decoded, bytes carried
      EXPECT_EQ(st.copies, 0u) << spec;  // nothing decoded on the host and copied over
      EXPECT_EQ(st.bounce_bytes, 0u) << spec;
    }
}

// The decoders carry a job's slices over in one copy: the window refuses,
// by name and before any decode, slices that do not follow one another in
// one buffer, and counts the refusal as a failed decode.
TEST(GpuWindowTest, DecodeRefusesSlicesNotInOneBuffer) {
  auto int8 = MakeCodec("int8");
  ASSERT_TRUE(int8.ok());
  Stored s(8, 2, std::shared_ptr<const Codec>(std::move(int8).value()));
  auto backend = DecodingBackend();
  auto w = s.Window(backend.get(), 2);
  ASSERT_NE(w, nullptr);
  const SliceLayout layout{KvShape::Mha(2, 2, 16, DType::kF16), 8, 0, 0};
  const std::vector<std::byte> raw(layout.Bytes(), std::byte{1});
  auto codec = MakeCodec("int8");
  ASSERT_TRUE(codec.ok());
  CodecContext ctx;
  std::vector<std::byte> one((*codec)->MaxEncodedSize(layout));
  auto size = (*codec)->Encode(ctx, layout, raw, one);
  ASSERT_TRUE(size.ok());
  std::vector<std::byte> buffer(3 * *size + 8192);
  std::memcpy(buffer.data(), one.data(), *size);
  std::memcpy(buffer.data() + *size, one.data(), *size);
  std::memcpy(buffer.data() + 2 * *size + 8000, one.data(), *size);
  std::byte* dev = backend->AllocateDevice(2 * layout.Bytes());
  ASSERT_NE(dev, nullptr);
  const std::span<const std::byte> a(buffer.data(), *size), b(buffer.data() + *size, *size),
      far(buffer.data() + 2 * *size + 8000, *size);
  std::byte* dst[2] = {dev, dev + layout.Bytes()};
  std::span<const std::byte> in_order[2] = {a, b}, reversed[2] = {b, a}, apart[2] = {b, far};
  const uint64_t failed_before = w->Stats().failed_decodes;
  EXPECT_TRUE(w->Decode(layout, in_order, dst).ok());
  const Status r = w->Decode(layout, reversed, dst);
  EXPECT_NE(r.ToString().find("starts before"), std::string::npos) << r.ToString();
  const Status g = w->Decode(layout, apart, dst);
  EXPECT_NE(g.ToString().find("8000 bytes after"), std::string::npos) << g.ToString();
  EXPECT_EQ(w->Stats().failed_decodes, failed_before + 2);
  w.reset();
  backend->FreeDevice(dev);
}

TEST(GpuWindowTest, AFailedDeviceDecodeIsACleanMissAndTheBlocksStayStored) {
  auto codec = MakeCodec("int8");
  ASSERT_TRUE(codec.ok());
  Stored s(8, 8, std::shared_ptr<const Codec>(std::move(codec).value()));
  auto backend = DecodingBackend(/*fail_decodes=*/1);
  auto w = s.Window(backend.get(), 2);
  ASSERT_NE(w, nullptr);
  auto d = w->WaitLayer(0);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->blocks, 0u);
  for (uint32_t l = 0; l < s.layers; ++l) {
    if (l > 0) {
      ASSERT_TRUE(w->WaitLayer(l).ok());
    }
    w->ReleaseLayer(l);
  }
  EXPECT_EQ(w->Finish(), 0u);
  EXPECT_GT(w->Stats().failed_decodes, 0u);
  w.reset();
  EXPECT_EQ(s.store->Match(s.keys), s.keys.size());
  EXPECT_EQ(s.store->Stats().checksum_failures + s.store->Stats().decode_failures, 0u);
  // Without the device's decoders (decodes=false) the same store restores, decoded on the host.
  auto again = DecodingBackend();
  auto w2 = GpuWindow::Start(again.get(), *s.store, s.keys, 2, true, /*decodes=*/false);
  ASSERT_TRUE(w2.ok());
  for (uint32_t l = 0; l < s.layers; ++l) {
    ASSERT_TRUE((*w2)->WaitLayer(l).ok());
    (*w2)->ReleaseLayer(l);
  }
  EXPECT_EQ((*w2)->Finish(), s.keys.size());
  EXPECT_EQ((*w2)->Stats().decoded_slices, 0u);
  EXPECT_GT((*w2)->Stats().copies, 0u);
}

TEST(GpuWindowTest, ACodedStoreDecodesOnTheHostAndLandsBitForBit) {
  for (bool file_reads : {false, true})
    for (uint64_t dram : {8u, 0u}) {
      Stored s(dram, 8, std::make_shared<ZeroRunCodec>());
      auto backend = file_reads ? FileReadingBackend() : MakeCpuCopyBackend();
      auto w = s.Window(backend.get(), 2);
      ASSERT_NE(w, nullptr);
      s.ExpectAllLayers(*w, *backend);
      EXPECT_EQ(w->Stats().file_reads, 0u);  // coded slices are decoded on the host
    }
}

TEST(GpuWindowTest, SlotsRecycleOnlyAsTheConsumerReleases) {
  for (uint64_t dram : {8u, 0u}) {
    Stored s(dram);
    auto backend = MakeCpuCopyBackend();
    auto w = s.Window(backend.get(), 2);
    ASSERT_NE(w, nullptr);
    auto zero = w->WaitLayer(0);
    ASSERT_TRUE(zero.ok());
    ASSERT_TRUE(w->WaitLayer(1).ok());
    // Layer 2 would take layer 0's slot: refused by name until 0 is released.
    auto beyond = w->WaitLayer(2);
    ASSERT_FALSE(beyond.ok());
    EXPECT_NE(beyond.status().ToString().find("release layer 0 first"), std::string::npos) << beyond.status().ToString();
    // Nothing of layer 2 is copied while both slots are held (given time to).
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(w->Stats().copy_bytes, 2 * s.keys.size() * s.lb);
    std::vector<std::byte> host(s.keys.size() * s.lb);
    ASSERT_TRUE(backend->CopyToHost(host.data(), zero->data, host.size()).ok());
    EXPECT_EQ(std::memcmp(host.data(), s.Expected(0, 0), s.lb), 0);
    w->ReleaseLayer(0);
    auto two = w->WaitLayer(2);
    ASSERT_TRUE(two.ok()) << two.status().ToString();
    EXPECT_EQ(two->data, zero->data);  // layer 0's slot, recycled
    ASSERT_TRUE(backend->CopyToHost(host.data(), two->data, host.size()).ok());
    EXPECT_EQ(std::memcmp(host.data() + 3 * s.lb, s.Expected(3, 2), s.lb), 0);
    w->ReleaseLayer(1);
    w->ReleaseLayer(2);
    for (uint32_t l = 3; l < s.layers; ++l) {
      ASSERT_TRUE(w->WaitLayer(l).ok());
      w->ReleaseLayer(l);
    }
    EXPECT_EQ(w->Finish(), s.keys.size());
  }
}

// A failed copy (from the arena, or from the host window) or file read
// (into device memory) is the landing's failure, not the medium's.
TEST(GpuWindowTest, AFailedCopyOrFileReadIsACleanMissAndTheBlocksStayStored) {
  struct Case {
    uint64_t dram;
    bool file_reads;
  };
  for (Case c : {Case{8, false}, Case{0, false}, Case{0, true}}) {
    Stored s(c.dram);
    // Layer 2's first run fails (2 copies, or reads, a layer).
    auto backend = c.file_reads ? FileReadingBackend(/*fail_reads=*/5) : MakeCpuCopyBackend(/*fail_after=*/5);
    auto w = s.Window(backend.get(), 2);
    ASSERT_NE(w, nullptr);
    // Both slots' layers before either is released: layer 2 (whose copies
    // fail) cannot load yet, and a view carries the blocks valid in every
    // layer landed so far.
    for (uint32_t l = 0; l < 2; ++l) {
      auto d = w->WaitLayer(l);
      ASSERT_TRUE(d.ok());
      EXPECT_EQ(d->blocks, s.keys.size());
    }
    w->ReleaseLayer(0);
    w->ReleaseLayer(1);
    auto two = w->WaitLayer(2);
    ASSERT_TRUE(two.ok()) << two.status().ToString();
    EXPECT_EQ(two->blocks, 0u);  // nothing wrong is delivered: the engine recomputes
    w->ReleaseLayer(2);
    EXPECT_EQ(w->Finish(), 0u);
    EXPECT_GT(c.file_reads ? w->Stats().failed_file_reads : w->Stats().failed_copies, 0u);
    w.reset();
    EXPECT_EQ(s.store->Match(s.keys), s.keys.size());  // the landing's failure is not the medium's
    EXPECT_EQ(s.store->Stats().checksum_failures, 0u);
    auto again = c.file_reads ? FileReadingBackend() : MakeCpuCopyBackend();
    auto w2 = s.Window(again.get(), 2);
    ASSERT_NE(w2, nullptr);
    s.ExpectAllLayers(*w2, *again);
  }
}

TEST(GpuWindowTest, CancelCopiesNoMoreAndLaterLayersFail) {
  Stored s(8);
  auto backend = MakeCpuCopyBackend();
  auto w = s.Window(backend.get(), 2);
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->WaitLayer(0).ok());
  w->Cancel();
  w->ReleaseLayer(0);
  auto later = w->WaitLayer(1);
  EXPECT_FALSE(later.ok());
  EXPECT_EQ(w->Finish(), 0u);
  // Layers 0 and 1 (two copies each) at most: layer 2 loads only after the
  // release that followed the cancel, and its copies are refused.
  EXPECT_LE(w->Stats().copies, 4u);
  EXPECT_GT(w->Stats().failed_copies, 0u);
}

TEST(GpuWindowTest, ScatterPutsSlotBytesIntoPagedCache) {
  Stored s(8, 4);
  auto backend = MakeCpuCopyBackend();
  auto w = s.Window(backend.get(), 2);
  ASSERT_NE(w, nullptr);
  // A paged cache of one page per block, in reverse order.
  std::byte* cache = backend->AllocateDevice(s.keys.size() * s.lb);
  ASSERT_NE(cache, nullptr);
  auto d = w->WaitLayer(0);
  ASSERT_TRUE(d.ok());
  std::vector<PageCopy> pages;
  for (uint32_t b = 0; b < s.keys.size(); ++b)
    pages.push_back({b * s.lb, cache + (s.keys.size() - 1 - b) * s.lb, s.lb});
  auto ev = w->ScatterLayer(0, pages);
  ASSERT_TRUE(ev.ok()) << ev.status().ToString();
  ASSERT_TRUE(backend->Wait(*ev).ok());
  std::vector<std::byte> host(s.keys.size() * s.lb);
  ASSERT_TRUE(backend->CopyToHost(host.data(), cache, host.size()).ok());
  for (uint32_t b = 0; b < s.keys.size(); ++b)
    EXPECT_EQ(std::memcmp(host.data() + (s.keys.size() - 1 - b) * s.lb, s.Expected(b, 0), s.lb), 0) << b;
  // A page outside the slot, or a scatter of a layer not waited for, is refused by name.
  PageCopy wild{uint64_t{1} << 40, cache, s.lb};
  EXPECT_FALSE(w->ScatterLayer(0, std::span(&wild, 1)).ok());
  auto early = w->ScatterLayer(1, pages);
  ASSERT_FALSE(early.ok());
  EXPECT_NE(early.status().ToString().find("before WaitLayer"), std::string::npos) << early.status().ToString();
  w->ReleaseLayer(0);
  backend->FreeDevice(cache);
  for (uint32_t l = 1; l < s.layers; ++l) {
    ASSERT_TRUE(w->WaitLayer(l).ok());
    w->ReleaseLayer(l);
  }
  EXPECT_EQ(w->Finish(), s.keys.size());
}

// A scatter still queued when its layer is released keeps the slot until
// it has run: the slot's next layer lands by a file read or a decode, which
// do not queue behind it (the CPU backend's queue is made slow here, as a
// busy stream is). Each layer is scattered into a paged cache of its own and
// released at once; every page then holds its own layer's bytes.
TEST(GpuWindowTest, AReleasedLayerKeepsItsSlotUntilItsScatterHasRun) {
  struct Case {
    const char* what;
    uint64_t dram;
    bool file_reads, decodes;
  };
  for (Case c : {Case{"dram copies", 8, false, false}, Case{"ssd file reads", 0, true, false},
                 Case{"int8 decodes", 8, false, true}}) {
    std::shared_ptr<const Codec> codec;
    if (c.decodes) {
      auto int8 = MakeCodec("int8");
      ASSERT_TRUE(int8.ok());
      codec = std::move(int8).value();
    }
    Stored s(c.dram, 8, codec);
    const auto want = HostLayers(s);
    ASSERT_EQ(want.size(), s.layers);
    auto backend = MakeCpuCopyBackend(CpuBackendOptions{0, c.file_reads, 0, c.decodes, 0, /*queue_delay_us=*/20'000});
    auto w = s.Window(backend.get(), 1);
    ASSERT_NE(w, nullptr);
    const uint64_t layer_bytes = s.keys.size() * s.lb;
    std::byte* cache = backend->AllocateDevice(s.layers * layer_bytes);
    ASSERT_NE(cache, nullptr);
    uint64_t last = 0;
    for (uint32_t l = 0; l < s.layers; ++l) {
      auto d = w->WaitLayer(l);
      ASSERT_TRUE(d.ok()) << d.status().ToString();
      ASSERT_EQ(d->blocks, s.keys.size()) << c.what << " layer " << l;
      std::vector<PageCopy> pages;
      for (uint32_t b = 0; b < s.keys.size(); ++b) pages.push_back({b * s.lb, cache + l * layer_bytes + b * s.lb, s.lb});
      auto ev = w->ScatterLayer(l, pages);
      ASSERT_TRUE(ev.ok()) << ev.status().ToString();
      last = *ev;
      w->ReleaseLayer(l);  // not waiting for the event: the window does
    }
    EXPECT_EQ(w->Finish(), s.keys.size());
    ASSERT_TRUE(backend->Wait(last).ok());
    std::vector<std::byte> host(s.layers * layer_bytes);
    ASSERT_TRUE(backend->CopyToHost(host.data(), cache, host.size()).ok());
    for (uint32_t l = 0; l < s.layers; ++l)
      ASSERT_EQ(std::memcmp(host.data() + l * layer_bytes, want[l].data(), layer_bytes), 0) << c.what << " layer " << l;
    const GpuWindowStats st = w->Stats();
    if (c.file_reads) {
      EXPECT_GT(st.file_reads, 0u);
    }
    if (c.decodes) {
      EXPECT_GT(st.decoded_slices, 0u);
    }
    w.reset();
    backend->FreeDevice(cache);
  }
}

TEST(GpuWindowTest, AMissIsAnEmptyWindow) {
  Stored s(8);
  auto backend = MakeCpuCopyBackend();
  const auto other = ChainKeys(99, 3);
  auto w = GpuWindow::Start(backend.get(), *s.store, other, 2);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)->hit_blocks(), 0u);
  auto d = (*w)->WaitLayer(0);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->blocks, 0u);
  EXPECT_EQ((*w)->Finish(), 0u);
}

TEST(GpuWindowTest, BadArgumentsAreRefusedByName) {
  EXPECT_FALSE(MakeCopyBackend("tpu").ok());
  auto backend = MakeCpuCopyBackend();
  Stored s(8, 2);
  EXPECT_FALSE(GpuWindow::Start(nullptr, *s.store, s.keys, 2).ok());
  auto w = GpuWindow::Start(backend.get(), *s.store, s.keys, 0);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().ToString().find("slots=0"), std::string::npos);
  EXPECT_FALSE(GpuWindow::Start(backend.get(), *s.store, {}, 2).ok());
  // The store refuses a device landing or reused destinations with nowhere to land.
  RestoreTarget t;
  t.reuse_layers = 2;
  auto r = s.store->StartRestore(s.keys, t);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("no destination"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace flatkv::gpu
