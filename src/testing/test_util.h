// Helpers shared by the tests: temporary directories, payloads, and small
// store configurations.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "flatkv/codec.h"
#include "flatkv/keys.h"
#include "flatkv/options.h"
#include "flatkv/store.h"

namespace flatkv::io {
class FaultInjectionEngine;
}  // namespace flatkv::io

namespace flatkv::testing {

// The shared data directory: $FLATKV_SHARED_DATA, else <repo>/../shared/data.
// Tests that need it GTEST_SKIP when it is absent, naming the missing path.
std::string SharedDataDir();
// The bundled stories260K.bin and tok512.bin (data/models/README.md):
// $FLATKV_MODEL_DATA, else <repo>/data/models. Always present in a checkout.
std::string ModelDataDir();
// Reads a whole file; false when it cannot be opened.
bool ReadFile(const std::string& path, std::string* out);

// A fresh directory under /tmp (or $FLATKV_TEST_DIR), removed with its
// contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Deterministic pseudo-random payload for `blocks` blocks of `store`,
// distinct per (seed, block index).
std::vector<std::byte> Payload(const Store& store, size_t blocks, uint64_t seed);

// A slice of KV-like values for `layout` (normal, one in 7 scaled by 30,
// all by `scale`: 1e6 puts group metadata past f16's range), encoded with
// `codec`, and what the CPU codec decodes it to (DecodeSlice); failing the
// test (EXPECT) and empty when it cannot be.
struct CodedSlice {
  std::vector<std::byte> encoded, decoded;
};
CodedSlice EncodeKvSlice(const Codec& codec, const SliceLayout& layout, std::mt19937& rng, float scale = 1.0f);

// Keys for `blocks` blocks of a chain identified by `chain_id`; chains with
// the same id share their keys, and ChainKeys(id, n) is a prefix of
// ChainKeys(id, m) for n < m.
std::vector<BlockKey> ChainKeys(uint64_t chain_id, size_t blocks, uint32_t block_tokens = 64);

// Options for a small DRAM + SSD store of the stories260K shape (5 layers,
// 16 KiB per block-layer at 64 tokens), with capacities in extents.
StoreOptions SmallOptions(const std::string& ssd_dir, uint64_t dram_extents, uint64_t ssd_extents);
// The bytes of one extent of SmallOptions: 4 blocks x 5 layers x 16 KiB.
inline constexpr uint64_t kSmallExtentBytes = 4ull * 16384 * 5;
// SmallOptions without a DRAM tier: `ssd_extents` extents of SSD in `ssd_dir`.
StoreOptions SsdOnlyOptions(const std::string& ssd_dir, uint64_t ssd_extents);

// Sends `options`' SSD I/O through a fault-injecting engine over a pool of
// two threads (io/fault_injection.h), which it returns.
std::shared_ptr<io::FaultInjectionEngine> InjectFaults(StoreOptions* options);

// Runs `test(store, ssd)` on a fresh SmallOptions(dir.Sub("ssd"),
// dram_extents, ssd_extents) store (ssd true), then on the same without an
// SSD tier; each store is destroyed and the SSD directory removed after
// its run. A fatal failure in `test` ends that run only.
void OnBothTiers(const TempDir& dir, uint64_t dram_extents, uint64_t ssd_extents,
                 const std::function<void(Store& store, bool ssd)>& test);

// The extents `store` holds on DRAM and SSD together.
uint64_t HeldExtents(Store& store);

// Opens a store, failing the test (EXPECT) and returning null when it cannot.
std::unique_ptr<Store> OpenStore(const StoreOptions& options);

// The format version in the header of `dir`'s MANIFEST (docs/format_manifest.md).
uint32_t ManifestVersion(const std::string& dir);

// The kill -9 harness of the durability tests: forks a child that opens a
// store with `options` and calls `put(store, chain)` for chain = 1, 2, ...,
// appending each chain whose put returned Ok to the file `progress`; once
// `min_done` chains are recorded (or after about 2 s), waits `linger_us`,
// kills the child with SIGKILL, and reads the recorded chains into `done`.
// Fails the test (fatally) if the child cannot be forked, killed, or exited
// by itself (2: open failed, 3: a put failed, 4: progress write failed).
void PutUntilKilled(const StoreOptions& options, const std::string& progress, uint64_t min_done, uint32_t linger_us,
                    const std::function<Status(Store&, uint64_t chain)>& put, std::vector<uint64_t>* done);

// The puts of the kill -9 tests: chain c, of KilledChainBlocks(c) = 1 + c % 7
// blocks, by session c % 5.
size_t KilledChainBlocks(uint64_t chain);
Status PutKilledChain(Store& store, uint64_t chain);
// PutUntilKilled with PutKilledChain (at least 40 chains, then 20 ms more),
// more than 5 of them acknowledged, and the store reopened into `reopened`
// (fatal failures; wrap in ASSERT_NO_FATAL_FAILURE).
void KillDuringPuts(const StoreOptions& options, const std::string& progress, std::vector<uint64_t>* done,
                    std::unique_ptr<Store>* reopened);

// Puts chain `chain` (`blocks` blocks, ChainKeys/Payload) for `session`
// with `po`, reporting into `result` where one is given.
Status PutChain(Store& store, SessionId session, uint64_t chain, size_t blocks, PutResult* result = nullptr,
                PutOptions po = {});

// Restores `keys` fully, consuming every layer; returns the valid block
// count and, if `out` is given, the bytes in Put's block-major layout.
uint32_t RestoreAll(Store& store, const std::vector<BlockKey>& keys, std::vector<std::byte>* out);

// Restores chain `chain` (`blocks` blocks, ChainKeys/Payload) and expects
// all of it, byte for byte (fatal failures; wrap in ASSERT_NO_FATAL_FAILURE).
void ExpectChain(Store& store, uint64_t chain, size_t blocks);

// Whether chain `chain` (`blocks` blocks) restores whole, byte for byte:
// the non-fatal ExpectChain, for EXPECT_TRUE.
::testing::AssertionResult RestoresChain(Store& store, uint64_t chain, size_t blocks);

// The same through a RestoreTarget: straight into a 4 KiB-aligned buffer
// laid out layer-major (contiguous per layer, so SSD reads land in place)
// or, with `block_major`, in Put's layout (scattered per layer, so SSD
// reads go through the window). `out` gets Put's layout either way.
uint32_t RestoreInto(Store& store, const std::vector<BlockKey>& keys, bool block_major, std::vector<std::byte>* out);

// Polls `done` every 10 ms for up to 10 s; its last answer.
template <typename F>
bool Eventually(F done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

}  // namespace flatkv::testing
