// GpuWindow on the CPU copy backend (also run under ThreadSanitizer: the pump
// thread and the backend's queue against the consumer): the window's logic as it runs on a
// GPU (docs/gpu.md): every layer lands bit for bit, from DRAM copies and
// from SSD homes; slots are recycled only as the consumer releases them;
// a layer beyond the window is refused by name; a failed copy fails its
// layer and the restore's result; a cancelled window copies no more.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "gpu/copy_backend.h"
#include "gpu/gpu_window.h"
#include "testing/test_util.h"

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

  explicit Stored(uint64_t dram_extents, size_t blocks = 8) {
    StoreOptions o = SmallOptions(dir.Sub("ssd"), dram_extents, 16);
    o.window_layers = 2;  // the restore's host window is smaller than the model
    store = OpenStore(o);
    keys = ChainKeys(7, blocks);
    data = Payload(*store, blocks, 7);
    EXPECT_TRUE(store->Put(1, keys, data).ok());
    layers = store->options().shape.layers;
    lb = store->BlockLayerBytes();
  }
  // Block b's layer l as put (block-major input).
  const std::byte* Expected(uint32_t b, uint32_t l) const { return data.data() + (uint64_t{b} * layers + l) * lb; }
  std::unique_ptr<GpuWindow> Window(CopyBackend* backend, uint32_t slots) {
    auto r = store->StartRestore(keys);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    auto w = GpuWindow::Start(backend, std::move(r).value(), layers, lb, slots);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return std::move(w).value();
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

TEST(GpuWindowTest, EveryLayerLandsBitForBitFromDramCopies) {
  Stored s(/*dram_extents=*/8);
  auto backend = MakeCpuCopyBackend();
  auto w = s.Window(backend.get(), 2);
  s.ExpectAllLayers(*w, *backend);
  EXPECT_EQ(w->Stats().layers_copied, s.layers);
  EXPECT_EQ(backend->Stats().h2d_bytes, uint64_t{s.layers} * s.keys.size() * s.lb);
}

TEST(GpuWindowTest, EveryLayerLandsBitForBitFromSsdHomes) {
  Stored s(/*dram_extents=*/0);
  auto backend = MakeCpuCopyBackend();
  auto w = s.Window(backend.get(), 3);
  s.ExpectAllLayers(*w, *backend);
}

TEST(GpuWindowTest, SlotsRecycleOnlyAsTheConsumerReleases) {
  Stored s(8);
  auto backend = MakeCpuCopyBackend();
  auto w = s.Window(backend.get(), 2);
  auto zero = w->WaitLayer(0);
  ASSERT_TRUE(zero.ok());
  ASSERT_TRUE(w->WaitLayer(1).ok());
  // Layer 2 would take layer 0's slot: refused by name until 0 is released.
  auto beyond = w->WaitLayer(2);
  ASSERT_FALSE(beyond.ok());
  EXPECT_NE(beyond.status().ToString().find("release layer 0 first"), std::string::npos) << beyond.status().ToString();
  // Layer 1's bytes stay put while the pump waits for a free slot.
  std::vector<std::byte> host(s.keys.size() * s.lb);
  ASSERT_TRUE(backend->CopyToHost(host.data(), w->WaitLayer(1)->data, host.size()).ok());
  EXPECT_EQ(std::memcmp(host.data(), s.Expected(0, 1), s.lb), 0);
  // The pump reaches layer 2 and waits for a slot: seen before releasing
  // one (on a loaded machine it may not have got there yet).
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (w->Stats().slot_waits == 0 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(w->Stats().slot_waits, 1u);
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
  EXPECT_GE(w->Stats().slot_waits, 1u);
}

TEST(GpuWindowTest, AFailedCopyFailsItsLayerAndTheResult) {
  Stored s(8);
  auto backend = MakeCpuCopyBackend(/*fail_after=*/3);  // the third layer's copy fails
  auto w = s.Window(backend.get(), 2);
  ASSERT_TRUE(w->WaitLayer(0).ok());
  w->ReleaseLayer(0);
  ASSERT_TRUE(w->WaitLayer(1).ok());
  w->ReleaseLayer(1);
  auto bad = w->WaitLayer(2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("injected"), std::string::npos) << bad.status().ToString();
  w->ReleaseLayer(2);
  EXPECT_EQ(w->Finish(), 0u);  // the engine recomputes; nothing wrong is delivered
  EXPECT_GT(backend->Stats().failed_ops, 0u);
}

TEST(GpuWindowTest, CancelCopiesNoMoreAndLaterLayersFail) {
  Stored s(8);
  auto backend = MakeCpuCopyBackend();
  auto w = s.Window(backend.get(), 2);
  ASSERT_TRUE(w->WaitLayer(0).ok());
  w->Cancel();
  w->ReleaseLayer(0);
  auto later = w->WaitLayer(s.layers - 1);
  EXPECT_FALSE(later.ok());
  EXPECT_EQ(w->Finish(), 0u);
  EXPECT_LE(w->Stats().layers_copied, 3u);  // at most the two slots and the one being queued
}

TEST(GpuWindowTest, ScatterPutsSlotBytesIntoPagedCache) {
  Stored s(8, 4);
  auto backend = MakeCpuCopyBackend();
  auto w = s.Window(backend.get(), 2);
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
  // A page outside the slot is refused by name.
  PageCopy wild{uint64_t{1} << 40, cache, s.lb};
  EXPECT_FALSE(w->ScatterLayer(0, std::span(&wild, 1)).ok());
  w->ReleaseLayer(0);
  backend->FreeDevice(cache);
  for (uint32_t l = 1; l < s.layers; ++l) {
    ASSERT_TRUE(w->WaitLayer(l).ok());
    w->ReleaseLayer(l);
  }
  EXPECT_EQ(w->Finish(), s.keys.size());
}

TEST(GpuWindowTest, BadArgumentsAreRefusedByName) {
  EXPECT_FALSE(MakeCopyBackend("tpu").ok());
  auto backend = MakeCpuCopyBackend();
  EXPECT_FALSE(GpuWindow::Start(backend.get(), nullptr, 5, 16384, 2).ok());
  Stored s(8, 2);
  auto r = s.store->StartRestore(s.keys);
  ASSERT_TRUE(r.ok());
  auto w = GpuWindow::Start(backend.get(), std::move(r).value(), s.layers, s.lb, 0);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().ToString().find("slots=0"), std::string::npos);
}

}  // namespace
}  // namespace flatkv::gpu
