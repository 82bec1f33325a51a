#include "flatkv/shape.h"

#include <algorithm>
#include <cctype>

namespace flatkv {

uint32_t DTypeBytes(DType t) {
  switch (t) {
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF32: return 4;
    case DType::kF8E4M3: return 1;
    case DType::kF8E5M2: return 1;
  }
  return 0;
}

std::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kF32: return "f32";
    case DType::kF8E4M3: return "fp8_e4m3";
    case DType::kF8E5M2: return "fp8_e5m2";
  }
  return "unknown";
}

Result<DType> ParseDType(std::string_view name) {
  if (name == "f16" || name == "fp16") return DType::kF16;
  if (name == "bf16") return DType::kBF16;
  if (name == "f32" || name == "fp32") return DType::kF32;
  if (name == "fp8_e4m3") return DType::kF8E4M3;
  if (name == "fp8_e5m2") return DType::kF8E5M2;
  return Status::InvalidArgument("unknown dtype '" + std::string(name) +
                                 "' (expected f16, bf16, f32, fp8_e4m3 or fp8_e5m2)");
}

bool DTypeConvertsToFloat(DType t) { return t == DType::kF16 || t == DType::kBF16 || t == DType::kF32; }

KvShape KvShape::Mha(uint32_t layers, uint32_t kv_heads, uint32_t head_dim, DType dtype) {
  KvShape s;
  s.kind = AttentionKind::kMha;
  s.layers = layers;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.dtype = dtype;
  return s;
}

KvShape KvShape::Mla(uint32_t layers, uint32_t latent_dim, uint32_t rope_dim, DType dtype) {
  KvShape s;
  s.kind = AttentionKind::kMla;
  s.layers = layers;
  s.latent_dim = latent_dim;
  s.rope_dim = rope_dim;
  s.dtype = dtype;
  return s;
}

uint64_t KvShape::ElementsPerTokenLayer() const {
  if (kind == AttentionKind::kMla) return uint64_t{latent_dim} + rope_dim;
  return 2ull * kv_heads * head_dim;
}

Status KvShape::Validate() const {
  constexpr uint32_t kMaxLayers = 1024, kMaxHeads = 1024, kMaxDim = 65536;
  if (DTypeBytes(dtype) == 0) return Status::InvalidArgument("shape: unknown dtype " + std::to_string(int(dtype)));
  if (layers == 0 || layers > kMaxLayers)
    return Status::InvalidArgument("shape: layers=" + std::to_string(layers) + " (expected 1.." + std::to_string(kMaxLayers) + ")");
  if (kind == AttentionKind::kMha) {
    if (kv_heads == 0 || kv_heads > kMaxHeads)
      return Status::InvalidArgument("shape: kv_heads=" + std::to_string(kv_heads) + " (expected 1.." + std::to_string(kMaxHeads) + ")");
    if (head_dim == 0 || head_dim > kMaxDim)
      return Status::InvalidArgument("shape: head_dim=" + std::to_string(head_dim) + " (expected 1.." + std::to_string(kMaxDim) + ")");
  } else if (kind == AttentionKind::kMla) {
    if (latent_dim == 0 || latent_dim > kMaxDim)
      return Status::InvalidArgument("shape: latent_dim=" + std::to_string(latent_dim) + " (expected 1.." + std::to_string(kMaxDim) + ")");
    if (rope_dim > kMaxDim) return Status::InvalidArgument("shape: rope_dim=" + std::to_string(rope_dim) + " is too large");
  } else {
    return Status::InvalidArgument("shape: unknown attention kind " + std::to_string(int(kind)));
  }
  return Status::Ok();
}

std::string KvShape::ToString() const {
  std::string s;
  if (kind == AttentionKind::kMla) {
    s = "mla layers=" + std::to_string(layers) + " latent_dim=" + std::to_string(latent_dim) +
        " rope_dim=" + std::to_string(rope_dim);
  } else {
    s = "mha layers=" + std::to_string(layers) + " kv_heads=" + std::to_string(kv_heads) +
        " head_dim=" + std::to_string(head_dim);
  }
  return s + " dtype=" + std::string(DTypeName(dtype));
}

const std::vector<ShapePreset>& ShapePresets() {
  // Sources: each model's config.json (num_hidden_layers, num_key_value_heads,
  // head_dim; DeepSeek-V3: kv_lora_rank=512, qk_rope_head_dim=64).
  static const std::vector<ShapePreset> presets = {
      {"llama-3.1-8b", KvShape::Mha(32, 8, 128, DType::kBF16)},
      {"llama-3.1-70b", KvShape::Mha(80, 8, 128, DType::kBF16)},
      {"qwen3-32b", KvShape::Mha(64, 8, 128, DType::kBF16)},
      {"deepseek-v3", KvShape::Mla(61, 512, 64, DType::kBF16)},
      // The reference engine's models (src/model/): fp32 KV, as the engine
      // stores it (Engine::ShapeFor). SmolLM2-135M-Instruct: 30 layers, 3 KV
      // heads of 64 (its GGUF metadata, docs/models.md).
      {"stories260k", KvShape::Mha(5, 4, 8, DType::kF32)},
      {"smollm2-135m", KvShape::Mha(30, 3, 64, DType::kF32)},
  };
  return presets;
}

Result<KvShape> FindShapePreset(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  std::string known;
  for (const auto& p : ShapePresets()) {
    if (p.name == lower) return p.shape;
    known += (known.empty() ? "" : ", ") + std::string(p.name);
  }
  return Status::InvalidArgument("unknown shape preset '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace flatkv
