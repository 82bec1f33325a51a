// What every codec shares: the slice header (docs/format_codec.md), a base
// class that keeps parameters in a table, and the registry of codecs.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "flatkv/codec.h"

namespace flatkv::codec {

inline constexpr uint32_t kMagic = 0x43564B46;  // "FKVC" little-endian
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 32;

// The fixed header in front of every encoded slice, followed by the codec's
// parameters (params_bytes: one little-endian f64 per Params() entry, in
// order) and then the codec's body.
struct SliceHeader {
  uint8_t version = kVersion;
  uint8_t codec_id = 0;
  AttentionKind kind = AttentionKind::kMha;
  DType dtype = DType::kF32;
  uint32_t tokens = 0;
  uint32_t dim_a = 0;  // kv_heads (MHA) or latent_dim (MLA)
  uint32_t dim_b = 0;  // head_dim (MHA) or rope_dim (MLA)
  uint32_t first_position = SliceLayout::kUnknownPosition;
  uint32_t body_bytes = 0;  // bytes after the header: params + body
  uint16_t layer = 0;
  uint16_t params_bytes = 0;
};

// Fills the header for `layout` into out[0, kHeaderBytes) and the codec's
// parameters after it; returns the bytes written (header + params).
size_t WriteHeader(const Codec& codec, const SliceLayout& layout, std::span<std::byte> out);
// Sets body_bytes of a written header once the body's size is known.
void SetBodyBytes(std::span<std::byte> out, uint32_t body_bytes);
// Parses and bounds-checks a header against the bytes available.
Result<SliceHeader> ParseHeader(std::span<const std::byte> in);
// Bytes of the header plus `codec`'s parameters.
size_t HeaderAndParamsBytes(const Codec& codec);

// A codec whose parameters live in a table (names, bounds, values).
class CodecBase : public Codec {
 public:
  explicit CodecBase(std::vector<CodecParamInfo> params);
  std::vector<CodecParamInfo> Params() const override { return params_; }
  Status SetParam(std::string_view name, double value) override;
  Result<double> GetParam(std::string_view name) const override;

 protected:
  double param(size_t i) const { return values_[i]; }
  // Called after a parameter changed; a codec recomputes what depends on it.
  virtual void ParamsChanged() {}

 private:
  std::vector<CodecParamInfo> params_;
  std::vector<double> values_;
};

struct CodecFactory {
  uint8_t id;
  const char* name;
  std::unique_ptr<Codec> (*make)();
};
// Every codec, in id order. A codec file adds itself here (codec.cc).
const std::vector<CodecFactory>& Registry();

std::unique_ptr<Codec> MakeRawCodec();

}  // namespace flatkv::codec

namespace flatkv::codec {

// Checks Encode's arguments (Supports, input size, room for
// MaxEncodedSize) and writes the header and parameters; returns their size.
Result<size_t> BeginEncode(const Codec& codec, const SliceLayout& layout, std::span<const std::byte> in,
                           std::span<std::byte> out);

// A rectangular part of a slice, as the lossy codecs see it: `rows` tokens
// of `width` elements at element index base + row * row_stride + col.
// `head_dim` splits the width into heads; `key` marks keys (and MLA's RoPE
// key), which codecs may treat differently from values (and MLA's latent).
struct Section {
  uint64_t base = 0;
  uint32_t row_stride = 0;
  uint32_t rows = 0;
  uint32_t width = 0;
  uint32_t head_dim = 0;
  bool key = false;
  uint64_t At(uint32_t row, uint32_t c) const { return base + uint64_t(row) * row_stride + c; }
};
// MHA: {K, V}; MLA: {latent (value-like), rope (key-like)}. A part of
// width 0 (an MLA with rope_dim 0) is still listed.
struct Sections {
  Section part[2];
};
Sections SplitSlice(const SliceLayout& layout);

// Appends to a fixed output span; Put/Append report overflow by returning
// false (callers size the span with MaxEncodedSize, so that is a bug).
class ByteWriter {
 public:
  explicit ByteWriter(std::span<std::byte> out, size_t at = 0) : out_(out), at_(at) {}
  template <typename T>
  bool Put(T v) {
    return Append(&v, sizeof v);
  }
  bool Append(const void* p, size_t n) {
    if (n > out_.size() - at_) return false;
    if (n) std::memcpy(out_.data() + at_, p, n);
    at_ += n;
    return true;
  }
  // Reserves n bytes and returns them (null when there is no room).
  uint8_t* Reserve(size_t n) {
    if (n > out_.size() - at_) return nullptr;
    auto* p = reinterpret_cast<uint8_t*>(out_.data() + at_);
    at_ += n;
    return p;
  }
  size_t size() const { return at_; }
  size_t room() const { return out_.size() - at_; }

 private:
  std::span<std::byte> out_;
  size_t at_;
};

// Reads a codec body; every read is bounds-checked.
class ByteReader {
 public:
  explicit ByteReader(std::span<const std::byte> in) : in_(in) {}
  template <typename T>
  bool Get(T& v) {
    if (sizeof v > in_.size() - at_) return false;
    std::memcpy(&v, in_.data() + at_, sizeof v);
    at_ += sizeof v;
    return true;
  }
  // n bytes, or null when fewer remain.
  const uint8_t* Take(size_t n) {
    if (n > in_.size() - at_) return nullptr;
    const auto* p = reinterpret_cast<const uint8_t*>(in_.data() + at_);
    at_ += n;
    return p;
  }
  size_t remaining() const { return in_.size() - at_; }

 private:
  std::span<const std::byte> in_;
  size_t at_ = 0;
};

// A Corruption error "<codec> decode: <what>".
Status BodyCorrupt(std::string_view codec, std::string_view what);

// Per-group scales and offsets are stored as f16 unless some input value is
// outside f16's comfortable range (or not finite): then the slice stores
// them as f32 (a flag in the body says which).
bool NeedsWideMeta(const float* x, size_t n);
// Rounds `v` to what the metadata stores (f16 or f32).
float RoundMeta(float v, bool wide);
bool PutMeta(ByteWriter& w, float v, bool wide);
bool GetMeta(ByteReader& r, bool wide, float& v);

}  // namespace flatkv::codec

namespace flatkv::codec {

// A codec that works on f32: Encode converts the slice to floats (scratch
// slot 0) and calls EncodeFloats; Decode calls DecodeFloats into floats
// and converts them to the slice's dtype. Slots 1..7 are the codec's.
class LossyCodec : public CodecBase {
 public:
  using CodecBase::CodecBase;
  // A lossy codec computes on floats: f16, bf16 or f32 elements. fp8 (stored as its bytes) is
  // refused here, naming the codec and the dtype, before the codec's own rules (SupportsFloats).
  Status Supports(const SliceLayout& layout) const final;
  uint64_t MaxEncodedSize(const SliceLayout& layout) const override {
    return HeaderAndParamsBytes(*this) + BodyBound(layout);
  }
  Result<size_t> Encode(CodecContext& ctx, const SliceLayout& layout, std::span<const std::byte> in,
                        std::span<std::byte> out) const override;
  Status Decode(CodecContext& ctx, const SliceLayout& layout, std::span<const std::byte> in,
                std::span<std::byte> out) const override;

 protected:
  // The codec's own rules for a float slice; none by default.
  virtual Status SupportsFloats(const SliceLayout& layout) const { return Status::Ok(); }
  virtual uint64_t BodyBound(const SliceLayout& layout) const = 0;
  // Writes the body for the slice's floats `x` (layout.Elements()); false
  // when the writer ran out of room (a BodyBound bug).
  virtual bool EncodeFloats(CodecContext& ctx, const SliceLayout& layout, const float* x, ByteWriter& w) const = 0;
  // Reads the body into `y` (layout.Elements() floats); must consume it all.
  virtual Status DecodeFloats(CodecContext& ctx, const SliceLayout& layout, ByteReader& r, float* y) const = 0;
};

// Per-context zstd state, made on first use and kept (codec.cc).
struct ContextAccess {
  static void* ZstdCCtx(CodecContext& ctx);  // ZSTD_CCtx*
  static void* ZstdDCtx(CodecContext& ctx);  // ZSTD_DCtx*
  static const Codec* CachedDecoder(CodecContext& ctx, uint8_t id, std::span<const std::byte> params);
  static const Codec* AddDecoder(CodecContext& ctx, uint8_t id, std::span<const std::byte> params,
                                 std::unique_ptr<Codec> codec);
};

std::unique_ptr<Codec> MakeInt8Codec();
std::unique_ptr<Codec> MakeKiviCodec();
std::unique_ptr<Codec> MakeHadamardCodec();
std::unique_ptr<Codec> MakeTurboCodec();
std::unique_ptr<Codec> MakePredCodec();
std::unique_ptr<Codec> MakeMlaCodec();

}  // namespace flatkv::codec
