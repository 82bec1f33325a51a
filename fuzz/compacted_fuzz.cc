// Fuzzes the compacted-session reader (attention/compact.h) with arbitrary
// bytes laid out as store blocks of a small model shape: DecodeCompacted
// must return a Status or a well-formed CompactedKv, never crash, and a
// decoded KV must survive an encode/decode round trip unchanged.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attention/compact.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  flatkv::model::Config c;
  c.dim = 16;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.n_layers = 2;
  constexpr uint32_t kBt = 16;
  const size_t block = size_t{2} * kBt * c.kv_dim() * 4 * c.n_layers;  // 2 KiB
  const uint32_t blocks = static_cast<uint32_t>(size / block);
  if (blocks == 0 || blocks > 16) return 0;
  std::vector<std::byte> bytes(size_t{blocks} * block);
  std::memcpy(bytes.data(), data, bytes.size());
  auto kv = flatkv::attention::DecodeCompacted(bytes, blocks, c, kBt);
  if (!kv.ok()) return 0;
  for (const auto& h : kv->heads) {
    if (h.k.size() != h.pos.size() * 4 || h.v.size() != h.k.size()) __builtin_trap();
    for (size_t i = 0; i < h.pos.size(); ++i)
      if (h.pos[i] >= kv->prefix_len || (i > 0 && h.pos[i] <= h.pos[i - 1])) __builtin_trap();
  }
  const auto again = flatkv::attention::EncodeCompacted(*kv, kBt);
  auto back = flatkv::attention::DecodeCompacted(again, flatkv::attention::CompactedBlocks(*kv, kBt), c, kBt);
  if (!back.ok() || !(*back == *kv)) __builtin_trap();
  return 0;
}
