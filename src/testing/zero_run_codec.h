// ZeroRunCodec: a real, lossless, variable-size codec for tests of the
// store's coded paths (what a store does with pred-like codecs) that needs
// no particular data: a run-length code of zero bytes.
// Thread-safety: a const instance is safe to use from many threads.
#pragma once

#include <cstring>
#include <string>

#include "codec/codec_internal.h"
#include "flatkv/codec.h"

namespace flatkv::testing {

// zrle: a lossless run-length code of zero bytes. The body is a sequence of
// tokens [u32 zeros][u32 literal bytes][literals]; a literal stretch ends
// at a run of 8 or more zeros. Variable size: at most 2 x the slice + 16.
class ZeroRunCodec : public codec::CodecBase {
 public:
  ZeroRunCodec() : CodecBase({}) {}
  std::string_view name() const override { return "zrle"; }
  uint8_t id() const override { return 200; }
  Status Supports(const SliceLayout&) const override { return Status::Ok(); }
  uint64_t MaxEncodedSize(const SliceLayout& layout) const override {
    return codec::HeaderAndParamsBytes(*this) + 2 * layout.Bytes() + 16;
  }
  bool FixedSize() const override { return false; }
  bool Lossless() const override { return true; }

  Result<size_t> Encode(CodecContext&, const SliceLayout& layout, std::span<const std::byte> in,
                        std::span<std::byte> out) const override {
    if (in.size() != layout.Bytes() || out.size() < MaxEncodedSize(layout))
      return Status::InvalidArgument("zrle encode: bad sizes");
    size_t pos = codec::WriteHeader(*this, layout, out);
    const size_t n = in.size();
    for (size_t i = 0; i < n;) {
      size_t z = i;
      while (z < n && in[z] == std::byte{0}) ++z;
      size_t k = z;
      while (k < n) {
        if (in[k] != std::byte{0}) {
          ++k;
          continue;
        }
        size_t r = k;
        while (r < n && in[r] == std::byte{0}) ++r;
        if (r - k >= 8 || r == n) break;
        k = r;
      }
      const uint32_t zeros = uint32_t(z - i), lit = uint32_t(k - z);
      std::memcpy(out.data() + pos, &zeros, 4);
      std::memcpy(out.data() + pos + 4, &lit, 4);
      std::memcpy(out.data() + pos + 8, in.data() + z, lit);
      pos += 8 + lit;
      i = k;
    }
    codec::SetBodyBytes(out, uint32_t(pos - codec::kHeaderBytes));
    return pos;
  }

  Status Decode(CodecContext&, const SliceLayout& layout, std::span<const std::byte> in,
                std::span<std::byte> out) const override {
    size_t pos = 0, o = 0;
    while (pos < in.size()) {
      if (in.size() - pos < 8) return Status::Corruption("zrle: truncated token at " + std::to_string(pos));
      uint32_t zeros, lit;
      std::memcpy(&zeros, in.data() + pos, 4);
      std::memcpy(&lit, in.data() + pos + 4, 4);
      pos += 8;
      if (zeros > out.size() - o || lit > out.size() - o - zeros || lit > in.size() - pos)
        return Status::Corruption("zrle: token overruns the slice at " + std::to_string(pos));
      std::memset(out.data() + o, 0, zeros);
      std::memcpy(out.data() + o + zeros, in.data() + pos, lit);
      o += zeros + lit;
      pos += lit;
    }
    if (o != layout.Bytes()) return Status::Corruption("zrle: decoded " + std::to_string(o) + " bytes");
    return Status::Ok();
  }
};

}  // namespace flatkv::testing
