// KvShape: what one token's KV looks like in one layer, and presets for
// common models.
//
// Two layouts exist. Multi-head / grouped-query attention stores a key and a
// value vector per KV head: 2 * kv_heads * head_dim elements per token and
// layer. Multi-head latent attention (MLA, DeepSeek-V2/V3) stores one
// compressed latent vector plus one decoupled RoPE key: latent_dim + rope_dim
// elements per token and layer. The store treats the bytes as opaque; the
// shape only fixes their size.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "flatkv/status.h"

namespace flatkv {

// The element types. f16, bf16 and f32 are what the codecs compute on. fp8_e4m3 and fp8_e5m2
// (an engine's 8-bit KV cache, vLLM's --kv-cache-dtype fp8) are stored as their bytes, with the
// raw codec: a codec that needs floats refuses them by name (Codec::Supports).
enum class DType : uint8_t { kF16 = 1, kBF16 = 2, kF32 = 3, kF8E4M3 = 4, kF8E5M2 = 5 };

uint32_t DTypeBytes(DType t);
std::string_view DTypeName(DType t);
// "f16" (or "fp16"), "bf16", "f32" (or "fp32"), "fp8_e4m3", "fp8_e5m2".
Result<DType> ParseDType(std::string_view name);
// Whether the codecs convert the type's elements to floats (f16, bf16, f32); fp8 is bytes to them.
bool DTypeConvertsToFloat(DType t);

enum class AttentionKind : uint8_t { kMha = 1, kMla = 2 };

struct KvShape {
  AttentionKind kind = AttentionKind::kMha;
  uint32_t layers = 0;
  // kMha: KV heads (== query heads for plain MHA, fewer for GQA) and head dim.
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  // kMla: latent vector width (kv_lora_rank) and the decoupled RoPE key width.
  uint32_t latent_dim = 0;
  uint32_t rope_dim = 0;
  DType dtype = DType::kBF16;

  static KvShape Mha(uint32_t layers, uint32_t kv_heads, uint32_t head_dim, DType dtype);
  static KvShape Mla(uint32_t layers, uint32_t latent_dim, uint32_t rope_dim, DType dtype);

  // Elements stored per token in one layer.
  uint64_t ElementsPerTokenLayer() const;
  // Bytes stored per token in one layer.
  uint64_t BytesPerTokenLayer() const { return ElementsPerTokenLayer() * DTypeBytes(dtype); }
  // Bytes per token across all layers.
  uint64_t BytesPerToken() const { return BytesPerTokenLayer() * layers; }

  // Rejects zero or absurd dimensions with a message naming the field.
  Status Validate() const;
  // "mha layers=32 kv_heads=8 head_dim=128 dtype=bf16"
  std::string ToString() const;

  bool operator==(const KvShape&) const = default;
};

struct ShapePreset {
  std::string_view name;
  KvShape shape;
};

// Llama-3.1-8B, Llama-3.1-70B, Qwen3-32B, DeepSeek-V3, stories260K.
const std::vector<ShapePreset>& ShapePresets();
// Looks a preset up by name, case-insensitively; the error lists the known names.
Result<KvShape> FindShapePreset(std::string_view name);

}  // namespace flatkv
