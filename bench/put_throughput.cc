// Put throughput, measured side by side in one run: FixedPlacement(kSsd)
// (the previous default's raw SSD put), the default placement (an SSD home
// written through from a DRAM copy) and FixedPlacement(kDram) (DRAM only).
// Prints each one's median GB/s and put latency, and the ratio of
// write-through to the raw SSD put (issue 11's goal: >= 0.8).
// Usage: flatkv_bench_put [DIR=/var/tmp/putbench] [REPS=3] [BLOCKS=192]
#include <algorithm>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>
#include "flatkv/store.h"
using namespace flatkv;
int main(int argc, char** argv) {
  const std::string base = argc > 1 ? argv[1] : "/var/tmp/putbench";
  const int reps = argc > 2 ? std::atoi(argv[2]) : 3;
  const uint32_t blocks = argc > 3 ? std::atoi(argv[3]) : 192, per_put = 16;
  KvShape shape = KvShape::Mha(32, 8, 128, DType::kBF16);
  std::vector<std::string> names = {"raw_ssd_put", "write_through", "dram_only"};
  std::vector<std::vector<double>> gbps(3), p50(3);
  for (int rep = 0; rep < reps; ++rep)
    for (int c = 0; c < 3; ++c) {
      std::filesystem::remove_all(base);
      std::filesystem::create_directories(base);
      StoreOptions o;
      o.shape = shape;
      o.ssd_dirs = {base};
      o.ssd_capacity_bytes = 8ull << 30;
      o.dram_capacity_bytes = 4ull << 30;
      o.window_bytes = 0;
      if (c == 0) { o.placement = std::make_shared<FixedPlacement>(Medium::kSsd); o.dram_capacity_bytes = 0; }
      if (c == 2) { o.placement = std::make_shared<FixedPlacement>(Medium::kDram); o.ssd_dirs.clear(); }
      auto st = Store::Open(o);
      if (!st.ok()) { std::fprintf(stderr, "%s\n", st.status().ToString().c_str()); return 1; }
      auto& store = *st.value();
      std::vector<std::byte> data(uint64_t{per_put} * store.BlockBytes());
      std::mt19937_64 rng(rep * 3 + c);
      for (size_t i = 0; i < data.size(); i += 8) { uint64_t v = rng(); std::memcpy(&data[i], &v, 8); }
      std::vector<double> lat;
      const auto t0 = std::chrono::steady_clock::now();
      for (uint32_t b = 0; b < blocks; b += per_put) {
        std::vector<BlockKey> keys(per_put);
        for (uint32_t i = 0; i < per_put; ++i) keys[i] = BlockKey{uint64_t(rep) << 40 | (b + i + 1), 7};
        const auto a = std::chrono::steady_clock::now();
        Status s = store.Put(1 + b / 64, keys, data);
        lat.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
        if (!s.ok()) { std::fprintf(stderr, "%s\n", s.ToString().c_str()); return 1; }
      }
      const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::sort(lat.begin(), lat.end());
      gbps[c].push_back(double(blocks) * store.BlockBytes() / sec / 1e9);
      p50[c].push_back(lat[lat.size() / 2]);
      if (rep == 0) std::fprintf(stderr, "%s: %s direct=%d\n", names[c].c_str(), store.Stats().ssd_engine.c_str(), store.Stats().ssd_direct_io);
    }
  for (int c = 0; c < 3; ++c) {
    std::sort(gbps[c].begin(), gbps[c].end());
    std::sort(p50[c].begin(), p50[c].end());
    std::printf("%-14s put GB/s median %.2f (min %.2f max %.2f)  put p50 %.1f ms per %u x 8 MiB blocks\n", names[c].c_str(),
                gbps[c][gbps[c].size() / 2], gbps[c].front(), gbps[c].back(), p50[c][p50[c].size() / 2], per_put);
  }
  std::printf("write_through / raw_ssd_put: %.2f\n", gbps[1][gbps[1].size() / 2] / gbps[0][gbps[0].size() / 2]);
  std::filesystem::remove_all(base);
}
