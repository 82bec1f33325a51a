// raw: the slice as it is, behind the header, optionally converted to
// another float type (dtype=1 f16, 2 bf16, 3 f32; 0 keeps the input's).
// The baseline every other codec is measured against, and what a store
// without a codec keeps. Body: the elements in the stored dtype.
#include <cstring>

#include "codec/codec_internal.h"
#include "codec/dtype.h"

namespace flatkv::codec {
namespace {

class RawCodec final : public CodecBase {
 public:
  RawCodec() : CodecBase({{"dtype", "stored element type: 0 as input, 1 f16, 2 bf16, 3 f32", 0, 3, 0, true}}) {}
  std::string_view name() const override { return "raw"; }
  uint8_t id() const override { return 0; }
  // fp8 is kept as its bytes: converting it (dtype=1..3) would need floats.
  Status Supports(const SliceLayout& layout) const override {
    if (param(0) != 0 && !DTypeConvertsToFloat(layout.shape.dtype))
      return Status::InvalidArgument("raw codec: dtype=" + std::to_string(int(param(0))) + " converts elements, but " +
                                     std::string(DTypeName(layout.shape.dtype)) +
                                     " is stored as its bytes (raw with dtype=0)");
    return Status::Ok();
  }
  uint64_t MaxEncodedSize(const SliceLayout& layout) const override {
    return HeaderAndParamsBytes(*this) + layout.Elements() * DTypeBytes(Stored(layout));
  }
  bool FixedSize() const override { return true; }
  // f32 holds every f16 and bf16 value exactly.
  bool Lossless() const override { return param(0) == 0 || param(0) == 3; }

  Result<size_t> Encode(CodecContext&, const SliceLayout& layout, std::span<const std::byte> in,
                        std::span<std::byte> out) const override {
    FLATKV_ASSIGN_OR_RETURN(const size_t h, BeginEncode(*this, layout, in, out));
    const size_t body = Convert(layout.shape.dtype, in.data(), Stored(layout), out.data() + h, layout.Elements());
    SetBodyBytes(out, uint32_t(h - kHeaderBytes + body));
    return h + body;
  }

  Status Decode(CodecContext&, const SliceLayout& layout, std::span<const std::byte> in,
                std::span<std::byte> out) const override {
    const DType stored = Stored(layout);
    if (in.size() != layout.Elements() * DTypeBytes(stored))
      return BodyCorrupt("raw", "body of " + std::to_string(in.size()) + " bytes, expected " +
                                    std::to_string(layout.Elements() * DTypeBytes(stored)));
    Convert(stored, in.data(), layout.shape.dtype, out.data(), layout.Elements());
    return Status::Ok();
  }

 private:
  DType Stored(const SliceLayout& layout) const { return param(0) == 0 ? layout.shape.dtype : DType(int(param(0))); }

  // Converts n elements; returns the bytes written.
  static size_t Convert(DType from, const std::byte* in, DType to, std::byte* out, uint64_t n) {
    if (n == 0) return 0;
    if (from == to) {
      std::memcpy(out, in, n * DTypeBytes(from));
      return n * DTypeBytes(from);
    }
    float buf[1024];
    for (uint64_t i = 0; i < n; i += 1024) {
      const size_t m = size_t(std::min<uint64_t>(1024, n - i));
      ToFloat(from, in + i * DTypeBytes(from), buf, m);
      FromFloat(to, buf, out + i * DTypeBytes(to), m);
    }
    return n * DTypeBytes(to);
  }
};

}  // namespace

std::unique_ptr<Codec> MakeRawCodec() { return std::make_unique<RawCodec>(); }

}  // namespace flatkv::codec
