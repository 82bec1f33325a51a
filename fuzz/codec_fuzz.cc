// Fuzzes the codecs. The first byte picks a layout and a codec setting;
// the rest is fed (a) as an encoded slice to DecodeSlice, which must answer
// with a Status and never read or write out of bounds, and (b) as slice
// data to encode, which must round-trip: lossless settings bit for bit,
// pred within its eps, everything within MaxEncodedSize.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "codec/dtype.h"
#include "flatkv/codec.h"

namespace {

const char* const kSpecs[] = {"raw",          "raw:dtype=2",  "int8",
                              "kivi:bits=2",  "kivi:bits=4",  "hadamard-int4",
                              "turbo:bits=3", "pred",         "pred:eps=0.01,rope_theta=10000",
                              "pred:coder=1", "pred:coder=2", "mla"};
constexpr size_t kNumSpecs = sizeof(kSpecs) / sizeof(kSpecs[0]);

flatkv::SliceLayout Layout(uint8_t pick) {
  using flatkv::DType;
  const DType dt = pick % 3 == 0 ? DType::kF32 : pick % 3 == 1 ? DType::kF16 : DType::kBF16;
  flatkv::SliceLayout l;
  l.tokens = 1 + (pick / 3) % 9;
  l.shape = (pick / 27) % 2 ? flatkv::KvShape::Mla(1, 16, 8, dt) : flatkv::KvShape::Mha(1, 2, 8, dt);
  l.first_position = 3;
  return l;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const flatkv::SliceLayout layout = Layout(data[0]);
  auto codec = flatkv::MakeCodec(kSpecs[data[1] % kNumSpecs]);
  if (!codec.ok()) __builtin_trap();
  std::span<const std::byte> body(reinterpret_cast<const std::byte*>(data + 2), size - 2);
  flatkv::CodecContext ctx;
  std::vector<std::byte> out(layout.Bytes() + 1);
  (void)flatkv::DecodeSlice(ctx, layout, body, std::span(out).first(layout.Bytes()));

  if (!(*codec)->Supports(layout).ok()) return 0;
  std::vector<std::byte> in(layout.Bytes());
  for (size_t i = 0; i < in.size(); ++i) in[i] = body.empty() ? std::byte{0} : body[i % body.size()];
  std::vector<std::byte> enc((*codec)->MaxEncodedSize(layout));
  auto n = (*codec)->Encode(ctx, layout, in, enc);
  if (!n.ok() || *n > enc.size()) __builtin_trap();
  std::vector<std::byte> back(layout.Bytes());
  if (!flatkv::DecodeSlice(ctx, layout, std::span(enc).first(*n), back).ok()) __builtin_trap();
  if ((*codec)->Lossless() && back != in) __builtin_trap();
  auto eps = (*codec)->GetParam("eps");
  if (eps.ok()) {
    const flatkv::DType dt = layout.shape.dtype;
    for (uint64_t i = 0; i < layout.Elements(); ++i) {
      const float a = flatkv::codec::LoadElement(dt, in.data(), i), b = flatkv::codec::LoadElement(dt, back.data(), i);
      if (std::isnan(a) ? !std::isnan(b) : (a != b && std::fabs(double(a) - double(b)) > *eps)) __builtin_trap();
    }
  }
  return 0;
}
