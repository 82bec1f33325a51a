// raw: the slice as it is, behind the header. The baseline every other
// codec is measured against, and what a store without a codec keeps.
#include <cstring>

#include "codec/codec_internal.h"

namespace flatkv::codec {
namespace {

class RawCodec final : public CodecBase {
 public:
  RawCodec() : CodecBase({}) {}
  std::string_view name() const override { return "raw"; }
  uint8_t id() const override { return 0; }
  Status Supports(const SliceLayout& layout) const override { return Status::Ok(); }
  uint64_t MaxEncodedSize(const SliceLayout& layout) const override {
    return HeaderAndParamsBytes(*this) + layout.Bytes();
  }
  bool FixedSize() const override { return true; }
  bool Lossless() const override { return true; }

  Result<size_t> Encode(CodecContext&, const SliceLayout& layout, std::span<const std::byte> in,
                        std::span<std::byte> out) const override {
    if (in.size() != layout.Bytes() || out.size() < MaxEncodedSize(layout))
      return Status::InvalidArgument("raw encode: input of " + std::to_string(in.size()) + " bytes for a " +
                                     std::to_string(layout.Bytes()) + "-byte slice, or output too small");
    const size_t h = WriteHeader(*this, layout, out);
    std::memcpy(out.data() + h, in.data(), in.size());
    SetBodyBytes(out, uint32_t(h - kHeaderBytes + in.size()));
    return h + in.size();
  }

  Status Decode(CodecContext&, const SliceLayout& layout, std::span<const std::byte> in,
                std::span<std::byte> out) const override {
    if (in.size() != layout.Bytes())
      return Status::Corruption("raw decode: body of " + std::to_string(in.size()) + " bytes, expected " +
                                std::to_string(layout.Bytes()));
    std::memcpy(out.data(), in.data(), in.size());
    return Status::Ok();
  }
};

}  // namespace

std::unique_ptr<Codec> MakeRawCodec() { return std::make_unique<RawCodec>(); }

}  // namespace flatkv::codec
