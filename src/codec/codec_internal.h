// What every codec shares: the slice header (docs/format_codec.md), a base
// class that keeps parameters in a table, and the registry of codecs.
#pragma once

#include <cstdint>
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
