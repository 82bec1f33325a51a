// Micro-benchmarks of block-key chaining: KeyHasher::Chain over one 64-token
// block (xxh3 and sha256), and ChainKeys over a 128-block (8192-token) prompt.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "flatkv/keys.h"

namespace {

std::vector<uint32_t> Tokens(size_t n) {
  std::vector<uint32_t> t(n);
  uint32_t x = 12345;
  for (auto& v : t) {
    x = x * 1664525u + 1013904223u;
    v = x % 128256;  // a Llama-3 sized vocabulary
  }
  return t;
}

flatkv::HashKind Kind(const benchmark::State& state) {
  return state.range(0) == 0 ? flatkv::HashKind::kXxh3 : flatkv::HashKind::kSha256;
}

void BM_Chain64Tokens(benchmark::State& state) {
  const flatkv::KeyHasher hasher(Kind(state));
  const auto tokens = Tokens(64);
  flatkv::BlockKey parent = hasher.NamespaceDigest({"llama-3.1-8b", "", ""});
  for (auto _ : state) {
    parent = hasher.Chain(parent, tokens);
    benchmark::DoNotOptimize(parent);
  }
  state.SetItemsProcessed(state.iterations());  // blocks
  state.SetBytesProcessed(int64_t(state.iterations()) * 64 * 4);
  state.SetLabel(std::string(flatkv::HashKindName(hasher.kind())));
}
BENCHMARK(BM_Chain64Tokens)->Arg(0)->Arg(1);

void BM_ChainKeys128Blocks(benchmark::State& state) {
  const flatkv::KeyHasher hasher(Kind(state));
  const auto tokens = Tokens(128 * 64);
  const flatkv::BlockKey ns = hasher.NamespaceDigest({"llama-3.1-8b", "", ""});
  for (auto _ : state) {
    auto keys = hasher.ChainKeys(ns, tokens, 64);
    benchmark::DoNotOptimize(keys.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * 128);
  state.SetLabel(std::string(flatkv::HashKindName(hasher.kind())));
}
BENCHMARK(BM_ChainKeys128Blocks)->Arg(0)->Arg(1);

}  // namespace
