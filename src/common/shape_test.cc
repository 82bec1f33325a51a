#include "flatkv/shape.h"

#include <gtest/gtest.h>

namespace flatkv {
namespace {

TEST(ShapeTest, PresetsHaveTheirModelsBytesPerToken) {
  // Per token, all layers: Llama-3.1-8B 32 layers x 2 x 8 heads x 128 x 2 bytes = 128 KiB.
  EXPECT_EQ(FindShapePreset("llama-3.1-8b")->BytesPerToken(), 32ull * 2 * 8 * 128 * 2);
  EXPECT_EQ(FindShapePreset("Llama-3.1-70B")->BytesPerToken(), 80ull * 2 * 8 * 128 * 2);
  EXPECT_EQ(FindShapePreset("qwen3-32b")->BytesPerToken(), 64ull * 2 * 8 * 128 * 2);
  // MLA: one 512-wide latent plus a 64-wide RoPE key per token and layer.
  EXPECT_EQ(FindShapePreset("deepseek-v3")->BytesPerToken(), 61ull * (512 + 64) * 2);
  EXPECT_EQ(FindShapePreset("stories260k")->BytesPerTokenLayer(), 2ull * 4 * 8 * 4);
  // SmolLM2-135M in the engine's fp32: 30 layers x 2 x 3 heads x 64 x 4 bytes = 45 KiB.
  EXPECT_EQ(FindShapePreset("SmolLM2-135M")->BytesPerToken(), 30ull * 2 * 3 * 64 * 4);
  EXPECT_EQ(FindShapePreset("smollm2-135m")->dtype, DType::kF32);
  for (const auto& p : ShapePresets()) EXPECT_TRUE(p.shape.Validate().ok()) << p.name;
}

TEST(ShapeTest, UnknownPresetListsKnownNames) {
  auto r = FindShapePreset("gpt-17");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("llama-3.1-8b"), std::string::npos);
}

TEST(ShapeTest, ValidateNamesTheBadField) {
  auto s = KvShape::Mha(0, 8, 128, DType::kBF16).Validate();
  EXPECT_NE(s.message().find("layers=0"), std::string::npos) << s.ToString();
  s = KvShape::Mha(32, 0, 128, DType::kBF16).Validate();
  EXPECT_NE(s.message().find("kv_heads=0"), std::string::npos) << s.ToString();
  s = KvShape::Mla(61, 0, 64, DType::kBF16).Validate();
  EXPECT_NE(s.message().find("latent_dim=0"), std::string::npos) << s.ToString();
  KvShape bad = KvShape::Mha(2, 2, 2, DType::kF32);
  bad.dtype = static_cast<DType>(9);
  EXPECT_FALSE(bad.Validate().ok());
  EXPECT_FALSE(ParseDType("f8").ok());
  EXPECT_EQ(ParseDType("bf16").value(), DType::kBF16);
  // fp8 caches: one byte an element, named as vLLM's --kv-cache-dtype spells them.
  for (DType dt : {DType::kF8E4M3, DType::kF8E5M2}) {
    EXPECT_EQ(DTypeBytes(dt), 1u);
    EXPECT_EQ(ParseDType(DTypeName(dt)).value(), dt);
    EXPECT_FALSE(DTypeConvertsToFloat(dt));
    const KvShape fp8 = KvShape::Mha(30, 3, 64, dt);
    EXPECT_TRUE(fp8.Validate().ok());
    EXPECT_EQ(fp8.BytesPerTokenLayer(), 2u * 3 * 64);
  }
  EXPECT_EQ(DTypeName(DType::kF8E4M3), "fp8_e4m3");
  EXPECT_EQ(DTypeName(DType::kF8E5M2), "fp8_e5m2");
  EXPECT_TRUE(DTypeConvertsToFloat(DType::kBF16));
  EXPECT_NE(ParseDType("fp8").status().message().find("fp8_e4m3"), std::string::npos);
}

}  // namespace
}  // namespace flatkv
