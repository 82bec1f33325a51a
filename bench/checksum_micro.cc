// Micro-benchmarks of the block checksum: XXH3 over one block-layer slice
// (256 KiB = Llama-3.1-8B, 64 tokens, one layer), plus neighbouring sizes.
// Throughput must stay well above the disk's 1-2.5 GB/s per core
// (shared/MACHINE.md, "What follows", point 4).
#include <benchmark/benchmark.h>
#include <xxhash.h>

#include <cstdint>
#include <vector>

#include "common/checksum.h"

namespace {

std::vector<uint8_t> RandomBytes(size_t n) {
  std::vector<uint8_t> v(n);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

void BM_Xxh3_64bits(benchmark::State& state) {
  const auto buf = RandomBytes(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    benchmark::DoNotOptimize(XXH3_64bits(buf.data(), buf.size()));
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0));
}
BENCHMARK(BM_Xxh3_64bits)->Arg(4 << 10)->Arg(64 << 10)->Arg(256 << 10)->Arg(2 << 20);

// The store's checksum (the AVX2 build of XXH3 where the CPU has it).
void BM_BlockChecksum(benchmark::State& state) {
  const auto buf = RandomBytes(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    benchmark::DoNotOptimize(flatkv::BlockChecksum(buf.data(), buf.size()));
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * state.range(0));
}
BENCHMARK(BM_BlockChecksum)->Arg(4 << 10)->Arg(64 << 10)->Arg(256 << 10)->Arg(2 << 20);

// Bytes not in the cache, as a restore checks what a device just wrote:
// 64 KiB slices walking 512 MiB, the library's XXH3 (0) against BlockChecksum (1).
void BM_ChecksumColdSlices(benchmark::State& state) {
  const auto buf = RandomBytes(512 << 20);
  constexpr size_t kSlice = 64 << 10;
  size_t at = 0;
  for (auto _ : state) {
    const uint8_t* p = buf.data() + at;
    benchmark::DoNotOptimize(state.range(0) ? flatkv::BlockChecksum(p, kSlice) : XXH3_64bits(p, kSlice));
    at = (at + kSlice) % buf.size();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kSlice));
}
BENCHMARK(BM_ChecksumColdSlices)->Arg(0)->Arg(1);

void BM_Xxh3_64bits_withSeed(benchmark::State& state) {
  const auto buf = RandomBytes(256 << 10);
  for (auto _ : state) {
    benchmark::DoNotOptimize(XXH3_64bits_withSeed(buf.data(), buf.size(), 0x666C61746B763031ull));
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(buf.size()));
}
BENCHMARK(BM_Xxh3_64bits_withSeed);

void BM_Xxh3_128bits(benchmark::State& state) {
  const auto buf = RandomBytes(256 << 10);
  for (auto _ : state) {
    benchmark::DoNotOptimize(XXH3_128bits(buf.data(), buf.size()));
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(buf.size()));
}
BENCHMARK(BM_Xxh3_128bits);

}  // namespace
