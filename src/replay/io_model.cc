#include "replay/io_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "flatkv/placement.h"
#include "flatkv/store.h"

namespace flatkv::replay {
namespace {

double Seconds(double bytes, double gbps) { return gbps > 0 ? bytes / (gbps * 1e9) : 0.0; }

// Rounds of `parallel` requests each pays one latency.
double LatencySeconds(uint64_t requests, double request_us, double parallel) {
  if (requests == 0) return 0.0;
  const double rounds = std::ceil(double(requests) / std::max(1.0, parallel));
  return rounds * request_us * 1e-6;
}

using Clock = std::chrono::steady_clock;

// A store of `slice`-byte block-layer slices (Mha, 1 KV head, bf16, 64
// tokens) with `layers` layers, on one medium only; extents of 16 blocks,
// as the replay's flat store.
StoreOptions CalibrationOptions(const std::string& dir, uint32_t layers, uint64_t slice, Medium medium, uint64_t bytes) {
  StoreOptions o;
  o.shape = KvShape::Mha(layers, 1, static_cast<uint32_t>(slice / 256), DType::kBF16);
  o.dram_extent_layer_bytes = o.ssd_extent_layer_bytes = 16 * slice;
  o.block_tokens = 64;
  o.placement = std::make_shared<FixedPlacement>(medium);
  o.dram_capacity_bytes = medium == Medium::kDram ? bytes + (8ull << 20) : 0;
  if (medium == Medium::kSsd) {
    o.ssd_dirs = {dir};
    o.ssd_capacity_bytes = bytes + (64ull << 20);
    o.segment_bytes = 64ull << 20;
  }
  return o;
}

std::vector<BlockKey> Keys(uint64_t chain, size_t n) {
  std::vector<BlockKey> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = BlockKey{chain * 1000003 + i + 1, chain ^ 0x5bd1e995u};
  return keys;
}

// Median-of-reps seconds to restore `keys` fully; also returns requests issued.
Result<double> TimeRestore(Store& store, const std::vector<BlockKey>& keys, int reps, uint64_t* requests, Medium m) {
  std::vector<double> samples;
  for (int rep = 0; rep < reps; ++rep) {
    const StoreStats before = store.Stats();
    const auto t0 = Clock::now();
    auto r = store.StartRestore(keys);
    if (!r.ok()) return r.status();
    const uint32_t got = r.value()->Finish();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    r.value().reset();
    if (got != keys.size())
      return Status::Corruption("calibration: restored " + std::to_string(got) + " of " + std::to_string(keys.size()) +
                              " blocks");
    const StoreStats after = store.Stats();
    *requests = m == Medium::kSsd ? after.ssd.read_requests - before.ssd.read_requests
                                  : after.dram.read_requests - before.dram.read_requests;
    samples.push_back(s);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

Result<std::unique_ptr<Store>> OpenFilled(const StoreOptions& o, const std::vector<BlockKey>& keys) {
  auto store = Store::Open(o);
  if (!store.ok()) return store.status();
  std::vector<std::byte> data(keys.size() * store.value()->BlockBytes(), std::byte{0x5a});
  FLATKV_RETURN_IF_ERROR(store.value()->Put(1, keys, data));
  return store;
}

}  // namespace

double IoModel::RestoreSeconds(const LookupResult& r) const {
  const double t_ssd = Seconds(double(r.ssd_bytes_read), ssd_read_gbps) +
                       LatencySeconds(r.ssd_requests, ssd_request_us, ssd_parallel);
  const double t_dram = Seconds(double(r.dram_bytes_read), gpu_destination ? pcie_gbps : dram_copy_gbps);
  const double t_link = gpu_destination ? Seconds(double(r.dram_bytes_read + r.ssd_bytes_useful), pcie_gbps) : 0.0;
  return std::max({t_ssd, t_dram, t_link});
}

std::string IoModel::ToString() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "pcie=%.1f GB/s dram=%.1f GB/s ssd=%.2f GB/s read + %.0f us/request (x%.0f in flight), %s destination",
                pcie_gbps, dram_copy_gbps, ssd_read_gbps, ssd_request_us, ssd_parallel,
                gpu_destination ? "GPU" : "host");
  return buf;
}

Result<IoModel> CalibrateIoModel(const std::string& dir, const IoModel& base, uint64_t bytes, int reps) {
  IoModel m = base;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::IoError("calibrate: cannot create " + dir + ": " + ec.message());
  // 16 layers of 64 KiB slices: per-layer requests of about 1 MiB, as the
  // flat replay store issues in kReal.
  constexpr uint32_t kLayers = 16;
  constexpr uint64_t kSlice = 64 << 10;
  constexpr uint64_t kBlockBytes = kLayers * kSlice;
  const size_t blocks = std::max<uint64_t>(1, bytes / kBlockBytes);
  const auto keys = Keys(1, blocks);
  uint64_t requests = 0;
  {  // SSD: latency from single-block, single-layer restores, then bandwidth.
    const std::string lat_dir = dir + "/lat";
    std::filesystem::create_directories(lat_dir, ec);
    StoreOptions o = CalibrationOptions(lat_dir, 1, 4096, Medium::kSsd, 64ull << 20);
    auto store = OpenFilled(o, Keys(2, 256));
    if (!store.ok()) return store.status();
    std::vector<double> samples;
    for (int i = 0; i < 64; ++i) {
      const auto key = Keys(2, 256);
      std::vector<BlockKey> one = {key[(i * 37) % 256]};
      // A chain of one block whose key is not the chain's first still hits: keys are looked up as given.
      auto t = TimeRestore(*store.value(), one, 1, &requests, Medium::kSsd);
      if (!t.ok()) return t.status();
      samples.push_back(t.value());
    }
    std::sort(samples.begin(), samples.end());
    m.ssd_request_us = samples[samples.size() / 2] * 1e6;
    FLATKV_RETURN_IF_ERROR(store.value()->Close());
  }
  {
    const std::string bw_dir = dir + "/bw";
    std::filesystem::create_directories(bw_dir, ec);
    StoreOptions o = CalibrationOptions(bw_dir, kLayers, kSlice, Medium::kSsd, bytes);
    auto store = OpenFilled(o, keys);
    if (!store.ok()) return store.status();
    auto t = TimeRestore(*store.value(), keys, reps, &requests, Medium::kSsd);
    if (!t.ok()) return t.status();
    const double io_s = t.value() - LatencySeconds(requests, m.ssd_request_us, m.ssd_parallel);
    m.ssd_read_gbps = double(blocks * kBlockBytes) / std::max(io_s, t.value() * 0.5) / 1e9;
    FLATKV_RETURN_IF_ERROR(store.value()->Close());
  }
  {
    StoreOptions o = CalibrationOptions("", kLayers, kSlice, Medium::kDram, bytes);
    auto store = OpenFilled(o, keys);
    if (!store.ok()) return store.status();
    auto t = TimeRestore(*store.value(), keys, reps, &requests, Medium::kDram);
    if (!t.ok()) return t.status();
    m.dram_copy_gbps = double(blocks * kBlockBytes) / t.value() / 1e9;
    FLATKV_RETURN_IF_ERROR(store.value()->Close());
  }
  std::filesystem::remove_all(dir + "/lat", ec);
  std::filesystem::remove_all(dir + "/bw", ec);
  return m;
}

}  // namespace flatkv::replay
