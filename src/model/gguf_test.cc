// GGUF container and llama loader: the real stories260K.gguf against the
// llama2.c checkpoint of the same model, truncations and corruptions of it,
// and small GGUF files built here (every metadata type, F16 and Q8_0).
#include "model/gguf.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/gguf_tokenizer.h"
#include "model/model.h"
#include "testing/test_util.h"

namespace flatkv::model {
namespace {

using ::flatkv::testing::ReadFile;
using ::flatkv::testing::SharedDataDir;

bool Contains(const Status& s, std::string_view what) { return s.message().find(what) != std::string::npos; }

// ---- A GGUF writer for tests ---------------------------------------------

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}
void PutStr(std::string* out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

class GgufBuilder {
 public:
  uint32_t version = 3;
  uint32_t alignment = 32;  // layout only; add general.alignment to change what readers use

  // A key with a raw type tag and already-encoded value.
  GgufBuilder& Raw(std::string_view key, uint32_t type, std::string value) {
    PutStr(&kvs_, key);
    Put(&kvs_, type);
    kvs_ += value;
    ++n_kv_;
    return *this;
  }
  template <typename T>
  GgufBuilder& Scalar(std::string_view key, GgufType type, T v) {
    std::string b;
    Put(&b, v);
    return Raw(key, static_cast<uint32_t>(type), b);
  }
  GgufBuilder& U32(std::string_view key, uint32_t v) { return Scalar(key, GgufType::kUint32, v); }
  GgufBuilder& F32(std::string_view key, float v) { return Scalar(key, GgufType::kFloat32, v); }
  GgufBuilder& Str(std::string_view key, std::string_view v) {
    std::string b;
    PutStr(&b, v);
    return Raw(key, static_cast<uint32_t>(GgufType::kString), b);
  }
  GgufBuilder& StrArray(std::string_view key, const std::vector<std::string>& v) {
    std::string b;
    Put(&b, static_cast<uint32_t>(GgufType::kString));
    Put<uint64_t>(&b, v.size());
    for (const auto& s : v) PutStr(&b, s);
    return Raw(key, static_cast<uint32_t>(GgufType::kArray), b);
  }
  // Tensor data is laid out in call order, each at the next aligned offset
  // unless `offset` is given.
  GgufBuilder& Tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, std::string data,
                      int64_t offset = -1) {
    tensors_.push_back({std::string(name), std::move(ne), type, std::move(data), offset});
    return *this;
  }
  GgufBuilder& F32Tensor(std::string_view name, std::vector<uint64_t> ne, const std::vector<float>& v) {
    return Tensor(name, std::move(ne), kGgmlF32, std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
  }

  std::string Build() const {
    std::string out = "GGUF";
    Put(&out, version);
    Put<uint64_t>(&out, tensors_.size());
    Put<uint64_t>(&out, n_kv_);
    out += kvs_;
    std::string data;
    for (const auto& t : tensors_) {
      while (data.size() % alignment != 0) data += '\0';
      uint64_t offset = t.offset >= 0 ? static_cast<uint64_t>(t.offset) : data.size();
      data += t.data;
      PutStr(&out, t.name);
      Put<uint32_t>(&out, static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) Put(&out, d);
      Put(&out, t.type);
      Put(&out, offset);
    }
    if (!tensors_.empty()) {
      while (out.size() % alignment != 0) out += '\0';
    }
    return out + data;
  }

 private:
  struct T {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::string data;
    int64_t offset;
  };
  std::string kvs_;
  uint64_t n_kv_ = 0;
  std::vector<T> tensors_;
};

// binary16 -> double by the textbook formula, independent of HalfToFloat's bit tricks.
double HalfRef(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  double v = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  if (exp == 31) v = mant == 0 ? INFINITY : NAN;
  return sign ? -v : v;
}

// fp16 bits of an exactly representable value in the normal range (or 0).
uint16_t ToHalf(float f) {
  if (f == 0) return std::signbit(f) ? 0x8000 : 0;
  int e;
  float m = std::frexp(std::fabs(f), &e);  // f = m * 2^e, m in [0.5, 1)
  uint16_t mant = static_cast<uint16_t>(std::lround((m * 2 - 1) * 1024));
  uint16_t h = static_cast<uint16_t>(((e - 1 + 15) << 10) | mant);
  return std::signbit(f) ? h | 0x8000 : h;
}

std::string F16Data(const std::vector<float>& v) {
  std::string out;
  for (float f : v) Put(&out, ToHalf(f));
  return out;
}

// Q8_0 blocks with scale d (exact in fp16) and the given quants.
std::string Q8Data(const std::vector<float>& scales, const std::vector<int8_t>& q) {
  std::string out;
  for (size_t b = 0; b < scales.size(); ++b) {
    Put(&out, ToHalf(scales[b]));
    out.append(reinterpret_cast<const char*>(q.data() + 32 * b), 32);
  }
  return out;
}

// ---- fp16 and Q8_0 ---------------------------------------------------------

TEST(Gguf, HalfToFloatIsExactForEveryInput) {
  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xC000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x3800), 0.5f);
  EXPECT_EQ(HalfToFloat(0x7BFF), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), 0x1p-24f);  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03FF), 1023 * 0x1p-24f);
  EXPECT_EQ(HalfToFloat(0x0400), 0x1p-14f);  // smallest normal
  EXPECT_EQ(HalfToFloat(0x7C00), INFINITY);
  EXPECT_EQ(HalfToFloat(0xFC00), -INFINITY);
  EXPECT_EQ(std::bit_cast<uint32_t>(HalfToFloat(0x8000)), 0x80000000u);
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7E00)));
  EXPECT_EQ(std::bit_cast<uint32_t>(HalfToFloat(0x7E01)), 0x7FC02000u);  // payload kept
  for (uint32_t h = 0; h < 65536; ++h) {
    double want = HalfRef(static_cast<uint16_t>(h));
    float got = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << h;
      EXPECT_EQ(std::signbit(got), std::signbit(want)) << h;
    }
#ifdef __FLT16_MAX__
    _Float16 x;
    uint16_t bits = static_cast<uint16_t>(h);
    std::memcpy(&x, &bits, 2);
    if (!std::isnan(want)) {
      EXPECT_EQ(got, static_cast<float>(x)) << h;
    }
#endif
  }
}

TEST(Gguf, DequantizesF16AndQ8_0) {
  std::vector<float> f16 = {0, 1, -2, 0.5f, 65504, -0.125f, 3.75f, 1024};
  std::vector<int8_t> q(64);
  for (int i = 0; i < 64; ++i) q[i] = static_cast<int8_t>(i * 37 % 256 - 128);  // includes -128
  q[5] = 127;
  std::vector<float> scales = {0.25f, -3.0f};
  std::string file =
      GgufBuilder().Tensor("h", {8}, kGgmlF16, F16Data(f16)).Tensor("q", {32, 2}, kGgmlQ8_0, Q8Data(scales, q)).Build();
  Result<GgufFile> f = GgufFile::Parse(file);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  Result<std::vector<float>> h = DequantizeTensor(*f->FindTensor("h"));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(*h, f16);
  const GgufTensorInfo* qt = f->FindTensor("q");
  EXPECT_EQ(qt->n_elements, 64u);
  EXPECT_EQ(qt->n_bytes, 68u);
  Result<std::vector<float>> v = DequantizeTensor(*qt);
  ASSERT_TRUE(v.ok());
  ASSERT_EQ(v->size(), 64u);
  for (int i = 0; i < 64; ++i) EXPECT_EQ((*v)[i], scales[i / 32] * q[i]) << i;
  EXPECT_EQ((*v)[0], 0.25f * -128);
  EXPECT_EQ((*v)[5], 0.25f * 127);
}

// Q4_1: per block an fp16 scale d and minimum m, then 16 bytes: element j (j < 16) in the low
// nibble of byte j, element j + 16 in its high nibble; value = d * q + m.
TEST(Gguf, DequantizesQ4_1) {
  const std::vector<float> d = {0.25f, -1.5f}, m = {-2.0f, 0.125f};
  std::vector<uint8_t> q(64);
  for (int i = 0; i < 64; ++i) q[i] = static_cast<uint8_t>(i * 7 % 16);
  q[3] = 15;
  q[40] = 0;
  std::string data;
  for (int b = 0; b < 2; ++b) {
    Put(&data, ToHalf(d[b]));
    Put(&data, ToHalf(m[b]));
    for (int j = 0; j < 16; ++j) data.push_back(static_cast<char>(q[32 * b + j] | (q[32 * b + j + 16] << 4)));
  }
  std::string file = GgufBuilder().Tensor("q", {32, 2}, kGgmlQ4_1, data).Build();
  Result<GgufFile> f = GgufFile::Parse(file);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  const GgufTensorInfo* t = f->FindTensor("q");
  EXPECT_EQ(t->n_bytes, 40u);
  Result<std::vector<float>> v = DequantizeTensor(*t);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_EQ(v->size(), 64u);
  for (int i = 0; i < 64; ++i) EXPECT_EQ((*v)[i], d[i / 32] * static_cast<float>(q[i]) + m[i / 32]) << i;
  EXPECT_EQ((*v)[3], 0.25f * 15 - 2.0f);
  EXPECT_EQ((*v)[40], 0.125f);
}

// ---- Metadata ----------------------------------------------------------------

TEST(Gguf, ReadsEveryMetadataTypeAndNestedArrays) {
  std::string nested;  // array of 2 arrays: [uint16 7, 8] and [string "x"]
  Put(&nested, static_cast<uint32_t>(GgufType::kArray));
  Put<uint64_t>(&nested, 2);
  Put(&nested, static_cast<uint32_t>(GgufType::kUint16));
  Put<uint64_t>(&nested, 2);
  Put<uint16_t>(&nested, 7);
  Put<uint16_t>(&nested, 8);
  Put(&nested, static_cast<uint32_t>(GgufType::kString));
  Put<uint64_t>(&nested, 1);
  PutStr(&nested, "x");
  GgufBuilder b;
  b.version = 2;
  b.Scalar("u8", GgufType::kUint8, uint8_t{200})
      .Scalar("i8", GgufType::kInt8, int8_t{-100})
      .Scalar("u16", GgufType::kUint16, uint16_t{60000})
      .Scalar("i16", GgufType::kInt16, int16_t{-30000})
      .U32("u32", 4000000000u)
      .Scalar("i32", GgufType::kInt32, int32_t{-2000000000})
      .F32("f32", 1.5f)
      .Scalar("bool", GgufType::kBool, uint8_t{1})
      .Str("str", "hello")
      .Scalar("u64", GgufType::kUint64, uint64_t{1} << 60)
      .Scalar("i64", GgufType::kInt64, int64_t{-1} << 60)
      .Scalar("f64", GgufType::kFloat64, 0.1)
      .StrArray("strs", {"a", "", "bc"})
      .Raw("nested", static_cast<uint32_t>(GgufType::kArray), nested);
  std::string file = b.Build();
  Result<GgufFile> f = GgufFile::Parse(file);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->metadata().size(), 14u);
  EXPECT_EQ(f->FindKey("u8")->value.u64, 200u);
  EXPECT_EQ(f->FindKey("i8")->value.i64, -100);
  EXPECT_EQ(f->FindKey("u16")->value.u64, 60000u);
  EXPECT_EQ(f->FindKey("i16")->value.i64, -30000);
  EXPECT_EQ(f->GetU32("u32").value(), 4000000000u);
  EXPECT_EQ(f->FindKey("i32")->value.i64, -2000000000);
  EXPECT_EQ(f->GetF32("f32", 0).value(), 1.5f);
  EXPECT_TRUE(f->GetBool("bool", false).value());
  EXPECT_EQ(f->GetString("str").value(), "hello");
  EXPECT_EQ(f->FindKey("u64")->value.u64, uint64_t{1} << 60);
  EXPECT_EQ(f->FindKey("i64")->value.i64, int64_t{-1} << 60);
  EXPECT_EQ(f->FindKey("f64")->value.f64, 0.1);
  EXPECT_EQ(f->GetU32("u8").value(), 200u);  // any integer type in range
  EXPECT_EQ(f->GetU32("absent", 7).value(), 7u);
  EXPECT_EQ(f->GetU32("absent").status().code(), Code::kNotFound);
  EXPECT_EQ(f->GetStringArray("strs").value(), (std::vector<std::string_view>{"a", "", "bc"}));

  Status st = f->GetU32("i8").status();
  EXPECT_EQ(st.message(), "metadata key 1 'i8': value -100 is out of range for uint32");
  st = f->GetU32("u64").status();
  EXPECT_TRUE(Contains(st, "out of range for uint32")) << st.ToString();
  st = f->GetU32("str").status();
  EXPECT_EQ(st.message(), "metadata key 8 'str': expected uint32, got string");
  st = f->GetF32Array("strs").status();
  EXPECT_EQ(st.message(), "metadata key 12 'strs': expected array of float32, got array of string");

  const GgufKv* kv = f->FindKey("nested");
  ASSERT_EQ(kv->value.elem_type, GgufType::kArray);
  std::vector<GgufValue> outer = DecodeArray(kv->value);
  ASSERT_EQ(outer.size(), 2u);
  std::vector<GgufValue> first = DecodeArray(outer[0]);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].u64, 7u);
  EXPECT_EQ(first[1].u64, 8u);
  std::vector<GgufValue> second = DecodeArray(outer[1]);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].str, "x");
}

// ---- A tiny llama built here --------------------------------------------------

// dim 32, hidden 64, 1 layer, 2 heads (head size 16), 1 KV head, vocab 4.
struct Tiny {
  GgufBuilder b;
  std::vector<float> embd, wq, wk, wo, w2, norm;
  std::vector<int8_t> wv_q, w1_q, w3_q;
};

std::vector<float> Ramp(size_t n, float scale, int mod) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>(static_cast<int>(i % mod) - mod / 2);
  return v;
}
std::vector<int8_t> Quants(size_t n, int seed) {
  std::vector<int8_t> q(n);
  for (size_t i = 0; i < n; ++i) q[i] = static_cast<int8_t>((i * 73 + seed) % 256 - 128);
  return q;
}

// `skip` leaves one tensor out; `with_output` adds output.weight (distinct).
Tiny MakeTiny(std::string_view skip = "", bool with_output = false) {
  Tiny t;
  t.embd = Ramp(32 * 4, 0.5f, 13);
  t.wq = Ramp(32 * 32, 0.25f, 17);
  t.wk = Ramp(32 * 16, 0.125f, 11);
  t.wo = Ramp(32 * 32, 1.0f, 7);
  t.w2 = Ramp(64 * 32, 0.0625f, 19);
  t.norm = Ramp(32, 1.0f, 5);
  t.wv_q = Quants(32 * 16, 1);
  t.w1_q = Quants(64 * 32, 2);
  t.w3_q = Quants(64 * 32, 3);
  GgufBuilder& b = t.b;
  b.Str("general.architecture", "llama")
      .U32("llama.embedding_length", 32)
      .U32("llama.feed_forward_length", 64)
      .U32("llama.block_count", 1)
      .U32("llama.attention.head_count", 2)
      .U32("llama.attention.head_count_kv", 1)
      .U32("llama.context_length", 128)
      .F32("llama.attention.layer_norm_rms_epsilon", 1e-6f);
  auto add = [&](std::string_view name, auto&& fn) {
    if (name != skip) fn(name);
  };
  add("token_embd.weight", [&](auto n) { b.Tensor(n, {32, 4}, kGgmlF16, F16Data(t.embd)); });
  add("blk.0.attn_norm.weight", [&](auto n) { b.F32Tensor(n, {32}, t.norm); });
  add("blk.0.attn_q.weight", [&](auto n) { b.Tensor(n, {32, 32}, kGgmlF16, F16Data(t.wq)); });
  add("blk.0.attn_k.weight", [&](auto n) { b.F32Tensor(n, {32, 16}, t.wk); });
  add("blk.0.attn_v.weight", [&](auto n) {
    b.Tensor(n, {32, 16}, kGgmlQ8_0, Q8Data(std::vector<float>(16, 0.5f), t.wv_q));
  });
  add("blk.0.attn_output.weight", [&](auto n) { b.F32Tensor(n, {32, 32}, t.wo); });
  add("blk.0.ffn_norm.weight", [&](auto n) { b.F32Tensor(n, {32}, t.norm); });
  add("blk.0.ffn_gate.weight", [&](auto n) {
    b.Tensor(n, {32, 64}, kGgmlQ8_0, Q8Data(std::vector<float>(64, 2.0f), t.w1_q));
  });
  add("blk.0.ffn_down.weight", [&](auto n) { b.F32Tensor(n, {64, 32}, t.w2); });
  add("blk.0.ffn_up.weight", [&](auto n) {
    b.Tensor(n, {32, 64}, kGgmlQ8_0, Q8Data(std::vector<float>(64, -0.25f), t.w3_q));
  });
  add("output_norm.weight", [&](auto n) { b.F32Tensor(n, {32}, t.norm); });
  if (with_output) b.F32Tensor("output.weight", {32, 4}, Ramp(32 * 4, 2.0f, 3));
  return t;
}

std::vector<float> Scaled(const std::vector<int8_t>& q, float d) {
  std::vector<float> v(q.size());
  for (size_t i = 0; i < q.size(); ++i) v[i] = d * q[i];
  return v;
}

TEST(GgufModel, LoadsTinyF16Q8Model) {
  Tiny t = MakeTiny();
  std::string file = t.b.Build();
  Result<Model> m = ParseGguf(file, "tiny.gguf");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const Config& c = m->config;
  EXPECT_EQ(c.dim, 32);
  EXPECT_EQ(c.hidden_dim, 64);
  EXPECT_EQ(c.n_layers, 1);
  EXPECT_EQ(c.n_heads, 2);
  EXPECT_EQ(c.n_kv_heads, 1);
  EXPECT_EQ(c.vocab_size, 4);  // from token_embd: no tokenizer, no llama.vocab_size
  EXPECT_EQ(c.seq_len, 128);
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.norm_eps, 1e-6f);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(m->tokenizer, nullptr);
  EXPECT_EQ(m->source, "tiny.gguf");
  const Weights& w = m->weights;
  EXPECT_EQ(w.token_embedding, t.embd);
  ASSERT_EQ(w.layers.size(), 1u);
  EXPECT_EQ(w.layers[0].wq, t.wq);
  EXPECT_EQ(w.layers[0].wk, t.wk);
  EXPECT_EQ(w.layers[0].wv, Scaled(t.wv_q, 0.5f));
  EXPECT_EQ(w.layers[0].wo, t.wo);
  EXPECT_EQ(w.layers[0].w1, Scaled(t.w1_q, 2.0f));
  EXPECT_EQ(w.layers[0].w2, t.w2);
  EXPECT_EQ(w.layers[0].w3, Scaled(t.w3_q, -0.25f));
  EXPECT_EQ(w.layers[0].rms_att, t.norm);
  EXPECT_EQ(w.rms_final, t.norm);
  EXPECT_TRUE(w.wcls.empty());
  EXPECT_EQ(w.classifier(), w.token_embedding.data());
}

TEST(GgufModel, SeparateClassifierAndDefaults) {
  Tiny t = MakeTiny("", /*with_output=*/true);
  t.b.F32("llama.rope.freq_base", 500000.0f);
  std::string file = t.b.Build();
  Result<Model> m = ParseGguf(file, "");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_FALSE(m->config.shared_classifier);
  EXPECT_EQ(m->weights.wcls, Ramp(32 * 4, 2.0f, 3));
  EXPECT_EQ(m->config.rope_theta, 500000.0f);
}

// Loads `file` with ParseGguf and expects an error of `code` whose message contains `what`.
void ExpectError(const std::string& file, Code code, std::string_view what) {
  Result<Model> m = ParseGguf(file, "x");
  ASSERT_FALSE(m.ok()) << "expected an error containing: " << what;
  EXPECT_EQ(m.status().code(), code) << m.status().ToString();
  EXPECT_TRUE(Contains(m.status(), what)) << m.status().ToString() << "\n expected: " << what;
}

TEST(GgufModel, RejectsBadModelsNamingTheField) {
  ExpectError(MakeTiny("blk.0.attn_k.weight").b.Build(), Code::kCorruption, "tensor 'blk.0.attn_k.weight' is missing");
  {
    Tiny t = MakeTiny();
    t.b.F32Tensor("blk.0.attn_q.bias", {32}, t.norm);
    ExpectError(t.b.Build(), Code::kNotSupported, "tensor 'blk.0.attn_q.bias' is not part of the llama layout");
  }
  {
    Tiny t = MakeTiny();
    t.b.F32Tensor("blk.1.attn_q.weight", {32, 32}, t.wq);  // block 1 of a 1-block model
    ExpectError(t.b.Build(), Code::kNotSupported, "tensor 'blk.1.attn_q.weight'");
  }
  {
    Tiny t = MakeTiny("blk.0.attn_k.weight");
    t.b.F32Tensor("blk.0.attn_k.weight", {32, 32}, t.wq);
    ExpectError(t.b.Build(), Code::kCorruption, "tensor 'blk.0.attn_k.weight': shape [32, 32], expected [32, 16]");
  }
  {
    Tiny t = MakeTiny("blk.0.ffn_up.weight");
    t.b.Tensor("blk.0.ffn_up.weight", {32, 64}, 2 /* q4_0 */, std::string(64 * 18, '\0'));
    ExpectError(t.b.Build(), Code::kNotSupported, "tensor 'blk.0.ffn_up.weight': ggml type q4_0 is not supported");
  }
  {
    GgufBuilder b;
    b.Str("general.architecture", "llama").U32("llama.embedding_length", 32).U32("llama.feed_forward_length", 64);
    b.Str("llama.block_count", "5");
    ExpectError(b.Build(), Code::kCorruption, "metadata key 3 'llama.block_count': expected uint32, got string");
  }
  {
    Tiny t = MakeTiny();
    t.b.U32("llama.attention.head_count_kv", 3);  // duplicate key
    ExpectError(t.b.Build(), Code::kCorruption, "'llama.attention.head_count_kv': duplicate key");
  }
  {
    GgufBuilder b;
    b.Str("general.architecture", "gpt2");
    ExpectError(b.Build(), Code::kNotSupported, "general.architecture is 'gpt2'");
  }
  {
    GgufBuilder b;
    b.Str("general.architecture", "llama").U32("llama.embedding_length", 32).U32("llama.feed_forward_length", 64);
    ExpectError(b.Build(), Code::kNotFound, "'llama.block_count' is missing");
  }
  {
    GgufBuilder b;  // an absurd block count fails before anything is allocated for it
    b.Str("general.architecture", "llama").U32("llama.embedding_length", 32).U32("llama.feed_forward_length", 64);
    b.U32("llama.block_count", 1000000).U32("llama.attention.head_count", 2).U32("llama.context_length", 8);
    b.U32("llama.vocab_size", 4).F32Tensor("token_embd.weight", {32, 4}, std::vector<float>(128));
    b.F32Tensor("output_norm.weight", {32}, std::vector<float>(32));
    ExpectError(b.Build(), Code::kCorruption, "tensor 'blk.0.attn_norm.weight' is missing");
  }
  {
    Tiny t = MakeTiny();
    t.b.U32("llama.rope.dimension_count", 8);
    ExpectError(t.b.Build(), Code::kNotSupported, "llama.rope.dimension_count 8 differs from the head size 16");
  }
}

// ---- Container corruptions -----------------------------------------------------

void ExpectParseError(const std::string& file, std::string_view what) {
  Result<GgufFile> f = GgufFile::Parse(file);
  ASSERT_FALSE(f.ok()) << "expected an error containing: " << what;
  EXPECT_TRUE(Contains(f.status(), what)) << f.status().ToString() << "\n expected: " << what;
  Result<Model> m = ParseGguf(file, "x");  // the model loader reports the same
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), f.status().message());
}

TEST(Gguf, RejectsCorruptContainersNamingTheField) {
  const std::string ok = MakeTiny().b.Build();
  ASSERT_TRUE(GgufFile::Parse(ok).ok());
  std::string bad = ok;
  bad[0] = 'X';
  ExpectParseError(bad, "gguf header: bad magic 'XGUF'");
  for (uint32_t v : {0u, 1u, 4u, 0x03000000u}) {
    bad = ok;
    std::memcpy(&bad[4], &v, 4);
    ExpectParseError(bad, "gguf header: version " + std::to_string(v) + " is not supported");
    EXPECT_EQ(GgufFile::Parse(bad).status().code(), Code::kNotSupported);
  }
  bad = ok;
  std::memset(&bad[8], 0xff, 8);
  ExpectParseError(bad, "gguf header: tensor count 18446744073709551615 exceeds the limit 1048576");
  bad = ok;
  uint64_t n = 1000000;
  std::memcpy(&bad[8], &n, 8);
  ExpectParseError(bad, "gguf header: tensor count 1000000 needs at least 24000000 bytes");
  bad = ok;
  std::memset(&bad[16], 0xff, 8);
  ExpectParseError(bad, "gguf header: metadata key count 18446744073709551615 exceeds the limit");
  bad = ok;
  std::memset(&bad[24], 0x7f, 8);  // first key's length
  ExpectParseError(bad, "metadata key 0 name: string length 9187201950435737471 at offset 24 runs past end of file");

  ExpectParseError(GgufBuilder().Raw("k", 13, "").Build(), "metadata key 0 'k': unknown value type 13");
  ExpectParseError(GgufBuilder().Raw("k", 9, std::string("\x0d\0\0\0", 4)).Build(),
                   "metadata key 0 'k': unknown array element type 13");
  {
    std::string v;
    Put(&v, static_cast<uint32_t>(GgufType::kUint32));
    Put<uint64_t>(&v, uint64_t{1} << 62);
    ExpectParseError(GgufBuilder().Raw("arr", 9, v).Build(),
                     "metadata key 0 'arr': array of 4611686018427387904 uint32");
  }
  {
    std::string v;
    Put(&v, static_cast<uint32_t>(GgufType::kString));
    Put<uint64_t>(&v, 2);
    PutStr(&v, "ok");
    Put<uint64_t>(&v, 1000);
    ExpectParseError(GgufBuilder().Raw("strs", 9, v).Build(),
                     "metadata key 0 'strs' element 1: string length 1000 at offset");
  }
  {
    std::string v;  // 9 levels of arrays
    for (int i = 0; i < 9; ++i) {
      Put(&v, static_cast<uint32_t>(GgufType::kArray));
      Put<uint64_t>(&v, 1);
    }
    ExpectParseError(GgufBuilder().Raw("deep", 9, v).Build(), "arrays nested deeper than 8");
  }
  ExpectParseError(GgufBuilder().U32("general.alignment", 48).Build(),
                   "metadata key 0 'general.alignment': alignment 48 is not a power of two");
  ExpectParseError(GgufBuilder().Str("general.alignment", "32").Build(),
                   "metadata key 0 'general.alignment': expected uint32, got string");
  ExpectParseError(GgufBuilder().Tensor("t", {1, 1, 1, 1, 1}, kGgmlF32, "xxxx").Build(),
                   "tensor 0 't': n_dims 5 exceeds 4");
  ExpectParseError(GgufBuilder().Tensor("t", {4}, 31, "xxxx").Build(), "tensor 0 't': unknown ggml type 31");
  ExpectParseError(GgufBuilder().Tensor("t", {33}, kGgmlQ8_0, "").Build(),
                   "tensor 0 't': row length 33 is not a multiple of the q8_0 block size 32");
  ExpectParseError(GgufBuilder().Tensor("t", {uint64_t{1} << 40, uint64_t{1} << 40}, kGgmlF32, "").Build(),
                   "tensor 0 't': shape [1099511627776, 1099511627776] overflows the element count");
  ExpectParseError(GgufBuilder().Tensor("t", {4}, kGgmlF32, std::string(16, 'x'), 16).Build(),
                   "tensor 0 't': data offset 16 is not a multiple of the alignment 32");
  ExpectParseError(GgufBuilder().Tensor("t", {4}, kGgmlF32, "xxxx").Tensor("t", {4}, kGgmlF32, "yyyy").Build(),
                   "tensor 1 't': duplicate tensor name");
  ExpectParseError(GgufBuilder().Tensor("blk.3.attn_k.weight", {4}, kGgmlF32, std::string(16, 'x'), 1 << 20).Build(),
                   "tensor 'blk.3.attn_k.weight': data at offset 96 + 1048576 + 16 bytes runs past end of file (112)");
}

// ---- The real stories260K.gguf -------------------------------------------------

struct Stories {
  std::string gguf, llama2c, ref_json;
};

bool LoadStories(Stories* s) {
  std::string d = SharedDataDir();
  return ReadFile(d + "/gguf/stories260K.gguf", &s->gguf) &&
         ReadFile(::flatkv::testing::ModelDataDir() + "/stories260K.bin", &s->llama2c) &&  // bundled
         ReadFile(d + "/models/stories260K_ref.json", &s->ref_json);
}

// The skip message when LoadStories fails: the shared files it needs.
std::string StoriesMissing() {
  return "shared data not found: " + SharedDataDir() + "/gguf/stories260K.gguf or " + SharedDataDir() +
         "/models/stories260K_ref.json";
}

// The int array `"key": [ ... ]` of a JSON text.
std::vector<int> JsonInts(const std::string& json, const std::string& key) {
  std::vector<int> out;
  size_t at = json.find("\"" + key + "\"");
  if (at == std::string::npos) return out;
  at = json.find('[', at);
  std::istringstream in(json.substr(at + 1, json.find(']', at) - at - 1));
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoi(item));
  return out;
}

// The string `"key": "..."` of a JSON text (escapes \n, \" and \\ only).
std::string JsonString(const std::string& json, const std::string& key) {
  size_t at = json.find("\"" + key + "\"");
  if (at == std::string::npos) return "";
  at = json.find('"', json.find(':', at)) + 1;
  std::string out;
  for (; at < json.size() && json[at] != '"'; ++at) {
    if (json[at] == '\\' && at + 1 < json.size()) {
      char e = json[++at];
      out += e == 'n' ? '\n' : e;
    } else {
      out += json[at];
    }
  }
  return out;
}

TEST(GgufStories, ConfigMatchesTheCheckpoint) {
  Stories s;
  if (!LoadStories(&s)) GTEST_SKIP() << StoriesMissing();
  Result<Model> m = ParseGguf(s.gguf, "stories260K.gguf");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const Config& c = m->config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  // llama.context_length: llama.cpp's converter wrote 2048 where the llama2.c
  // header says 512; the loader reports what the file says.
  EXPECT_EQ(c.seq_len, 2048);
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.norm_eps, 1e-5f);
  // output.weight is a bit-identical copy of token_embd.weight: tied again.
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_TRUE(m->weights.wcls.empty());
  EXPECT_EQ(m->source, "stories260K.gguf");
  EXPECT_EQ(m->fingerprint.size(), 32u);
  EXPECT_EQ(m->fingerprint.find_first_not_of("0123456789abcdef"), std::string::npos) << m->fingerprint;
  ASSERT_NE(m->tokenizer, nullptr);
  EXPECT_EQ(m->tokenizer->vocab_size(), 512);

  Result<GgufFile> f = GgufFile::Parse(s.gguf);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->tensors().size(), 48u);
  EXPECT_EQ(f->metadata().size(), 19u);
  EXPECT_EQ(f->data_offset(), 14176u);
}

// Every tensor equals the llama2.c checkpoint's array bit for bit, with
// wq and wk in the same row order: llama.cpp did not permute Q and K.
TEST(GgufStories, WeightsEqualTheLlama2cCheckpoint) {
  Stories s;
  if (!LoadStories(&s)) GTEST_SKIP() << StoriesMissing();
  Result<Model> m = ParseGguf(s.gguf, "");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  int32_t hdr[7];
  ASSERT_GE(s.llama2c.size(), sizeof(hdr));
  std::memcpy(hdr, s.llama2c.data(), sizeof(hdr));
  const size_t dim = hdr[0], hidden = hdr[1], L = hdr[2], heads = hdr[3], kv_heads = hdr[4], vocab = hdr[5];
  ASSERT_EQ(dim, 64u);
  ASSERT_EQ(vocab, 512u);  // positive: shared classifier
  const size_t kv_dim = dim / heads * kv_heads;
  size_t pos = sizeof(hdr);
  auto next = [&](size_t n) {
    std::vector<float> v(n);
    EXPECT_LE(pos + 4 * n, s.llama2c.size());
    std::memcpy(v.data(), s.llama2c.data() + pos, 4 * n);
    pos += 4 * n;
    return v;
  };
  auto layer_slice = [](const std::vector<float>& all, size_t l, size_t n) {
    return std::vector<float>(all.begin() + l * n, all.begin() + (l + 1) * n);
  };
  const Weights& w = m->weights;
  ASSERT_EQ(w.layers.size(), L);
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), 4 * a.size()) == 0;
  };
  std::vector<float> embd = next(vocab * dim);
  EXPECT_TRUE(same(w.token_embedding, embd));
  std::vector<float> rms_att = next(L * dim), wq = next(L * dim * dim), wk = next(L * kv_dim * dim),
                     wv = next(L * kv_dim * dim), wo = next(L * dim * dim), rms_ffn = next(L * dim),
                     w1 = next(L * hidden * dim), w2 = next(L * dim * hidden), w3 = next(L * hidden * dim);
  for (size_t l = 0; l < L; ++l) {
    const LayerWeights& lw = w.layers[l];
    EXPECT_TRUE(same(lw.rms_att, layer_slice(rms_att, l, dim))) << "layer " << l;
    EXPECT_TRUE(same(lw.wq, layer_slice(wq, l, dim * dim))) << "layer " << l << ": wq (Q rows permuted?)";
    EXPECT_TRUE(same(lw.wk, layer_slice(wk, l, kv_dim * dim))) << "layer " << l << ": wk (K rows permuted?)";
    EXPECT_TRUE(same(lw.wv, layer_slice(wv, l, kv_dim * dim))) << "layer " << l;
    EXPECT_TRUE(same(lw.wo, layer_slice(wo, l, dim * dim))) << "layer " << l;
    EXPECT_TRUE(same(lw.rms_ffn, layer_slice(rms_ffn, l, dim))) << "layer " << l;
    EXPECT_TRUE(same(lw.w1, layer_slice(w1, l, hidden * dim))) << "layer " << l;
    EXPECT_TRUE(same(lw.w2, layer_slice(w2, l, dim * hidden))) << "layer " << l;
    EXPECT_TRUE(same(lw.w3, layer_slice(w3, l, hidden * dim))) << "layer " << l;
  }
  EXPECT_TRUE(same(w.rms_final, next(dim)));
  // The file's own output.weight is the embedding again.
  Result<GgufFile> f = GgufFile::Parse(s.gguf);
  ASSERT_TRUE(f.ok());
  Result<std::vector<float>> out = DequantizeTensor(*f->FindTensor("output.weight"));
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(same(*out, embd));
}

TEST(GgufStories, TokenizerMatchesLlama2c) {
  Stories s;
  if (!LoadStories(&s)) GTEST_SKIP() << StoriesMissing();
  Result<Model> m = ParseGguf(s.gguf, "");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const Tokenizer& tok = *m->tokenizer;
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  Result<std::vector<int>> ids = tok.Encode("Once upon a time", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int>{1, 403, 407, 261, 378}));
  // The reference greedy run: its text decodes from, and encodes to, its tokens.
  std::vector<int> fed = JsonInts(s.ref_json, "tokens_fed");
  std::vector<int> next = JsonInts(s.ref_json, "greedy_next_tokens");
  std::string text = JsonString(s.ref_json, "greedy_text");
  ASSERT_EQ(fed.size(), 64u);
  ASSERT_EQ(next.size(), 64u);
  ASSERT_TRUE(text.starts_with("Once upon a time, there was a little girl named Lily."));
  std::vector<int> all = fed;
  all.push_back(next.back());
  std::string decoded;
  for (size_t i = 1; i < all.size(); ++i) decoded += tok.Decode(all[i - 1], all[i]);
  EXPECT_EQ(decoded, text);
  ids = tok.Encode(text, true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, all);
}

// Every cut inside the header, metadata and tensor infos, and a sample of
// cuts in the data, gives a clean Corruption naming what ran out.
TEST(GgufStories, EveryTruncationFailsCleanly) {
  Stories s;
  if (!LoadStories(&s)) GTEST_SKIP() << StoriesMissing();
  Result<GgufFile> full = GgufFile::Parse(s.gguf);
  ASSERT_TRUE(full.ok());
  std::vector<size_t> cuts;
  for (size_t n = 0; n <= full->data_offset(); ++n) cuts.push_back(n);
  for (size_t n = full->data_offset() + 1; n < s.gguf.size(); n += (s.gguf.size() - full->data_offset()) / 300) {
    cuts.push_back(n);
  }
  cuts.push_back(s.gguf.size() - 1);
  for (size_t n : cuts) {
    Result<Model> m = ParseGguf(std::string_view(s.gguf).substr(0, n), "");
    ASSERT_FALSE(m.ok()) << "cut at " << n;
    EXPECT_EQ(m.status().code(), Code::kCorruption) << n << ": " << m.status().ToString();
    EXPECT_TRUE(Contains(m.status(), "truncated") || Contains(m.status(), "past end of file"))
        << n << ": " << m.status().ToString();
  }
}

TEST(GgufStories, CorruptionsFailCleanly) {
  Stories s;
  if (!LoadStories(&s)) GTEST_SKIP() << StoriesMissing();
  auto patch = [&](size_t at, const void* v, size_t n) {
    std::string b = s.gguf;
    std::memcpy(&b[at], v, n);
    return b;
  };
  uint32_t u32 = 13;
  // The first key is tokenizer.ggml.tokens (21 bytes) at offset 24; its type tag follows.
  ASSERT_EQ(s.gguf.substr(32, 21), "tokenizer.ggml.tokens");
  ExpectError(patch(53, &u32, 4), Code::kCorruption, "metadata key 0 'tokenizer.ggml.tokens': unknown value type 13");
  u32 = static_cast<uint32_t>(GgufType::kFloat32);  // the array's element type: strings read as floats
  Result<Model> m = ParseGguf(patch(57, &u32, 4), "");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kCorruption) << m.status().ToString();
  // token_embd.weight's tensor info: type and offset.
  size_t info = s.gguf.find("token_embd.weight");
  ASSERT_NE(info, std::string::npos);
  size_t type_at = info + 17 + 4 + 16, offset_at = type_at + 4;
  u32 = 2;  // q4_0: fits in the data, but cannot be dequantized
  ExpectError(patch(type_at, &u32, 4), Code::kNotSupported, "tensor 'token_embd.weight': ggml type q4_0");
  uint64_t off = uint64_t{1} << 40;
  ExpectError(patch(offset_at, &off, 8), Code::kCorruption,
              "tensor 'token_embd.weight': data at offset 14176 + 1099511627776 + 131072 bytes runs past end of file");
  u32 = 5;
  ExpectError(patch(info + 17, &u32, 4), Code::kCorruption, "tensor 0 'token_embd.weight': n_dims 5 exceeds 4");
}

TEST(GgufStories, VocabOnlyFileHasNoModel) {
  std::string bytes;
  const std::string spm = SharedDataDir() + "/gguf/ggml-vocab-llama-spm.gguf";
  if (!ReadFile(spm, &bytes)) GTEST_SKIP() << "shared data not found: " << spm;
  ExpectError(bytes, Code::kCorruption, "tensor 'token_embd.weight' is missing (the file has no tensors");
  std::string gpt2;
  ASSERT_TRUE(ReadFile(SharedDataDir() + "/gguf/ggml-vocab-gpt-2.gguf", &gpt2));
  ExpectError(gpt2, Code::kNotSupported, "general.architecture is 'gpt2'");
}

TEST(GgufStories, LoadGgufReadsTheFile) {
  std::string path = SharedDataDir() + "/gguf/stories260K.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "shared data not found: " << path;
  Result<Model> m = LoadGguf(path);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->source, path);
  Result<Model> missing = LoadGguf(path + ".absent");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace flatkv::model
