#include "codec/group_quant.h"

#include <algorithm>
#include <cmath>

namespace flatkv::codec {
namespace {

uint64_t RowBytes(const Section& s, int bits) { return (uint64_t(s.width) * bits + 7) / 8; }
uint64_t Groups(const Section& s, Grouping g, uint32_t group) {
  return g == Grouping::kPerToken ? uint64_t(s.rows) * ((s.width + group - 1) / group)
                                  : uint64_t((s.rows + group - 1) / group) * s.width;
}

// lo and step of values v[0], v[stride], ... (n of them), as stored.
void MinStep(const float* v, size_t n, size_t stride, int bits, bool wide, float& lo, float& step) {
  float mn = v[0], mx = v[0];
  for (size_t i = 1; i < n; ++i) {
    mn = std::min(mn, v[i * stride]);
    mx = std::max(mx, v[i * stride]);
  }
  lo = RoundMeta(mn, wide);
  step = RoundMeta((mx - lo) / float((1 << bits) - 1), wide);
  if (!std::isfinite(lo)) lo = 0;
  if (!std::isfinite(step) || step < 0) step = 0;
}

}  // namespace

uint64_t GroupQuantBound(const Section& s, Grouping g, int bits, uint32_t group) {
  return Groups(s, g, group) * 2 * sizeof(float) + uint64_t(s.rows) * RowBytes(s, bits);
}

bool EncodeGroupQuant(const Section& s, Grouping g, int bits, uint32_t group, bool wide, const float* x, ByteWriter& w,
                      uint8_t* codes) {
  if (s.rows == 0 || s.width == 0) return true;
  const uint32_t max_code = (1u << bits) - 1;
  // codes: rows * width bytes, one per code, packed at the end.
  if (g == Grouping::kPerToken) {
    for (uint32_t r = 0; r < s.rows; ++r)
      for (uint32_t c0 = 0; c0 < s.width; c0 += group) {
        const uint32_t n = std::min(group, s.width - c0);
        const float* v = x + s.At(r, c0);
        float lo, step;
        MinStep(v, n, 1, bits, wide, lo, step);
        if (!PutMeta(w, lo, wide) || !PutMeta(w, step, wide)) return false;
        const float inv = step > 0 ? 1.0f / step : 0.0f;
        for (uint32_t i = 0; i < n; ++i)
          codes[uint64_t(r) * s.width + c0 + i] = uint8_t(QuantCode(v[i], lo, inv, max_code));
      }
  } else {
    for (uint32_t r0 = 0; r0 < s.rows; r0 += group) {
      const uint32_t n = std::min(group, s.rows - r0);
      for (uint32_t c = 0; c < s.width; ++c) {
        const float* v = x + s.At(r0, c);
        float lo, step;
        MinStep(v, n, s.row_stride, bits, wide, lo, step);
        if (!PutMeta(w, lo, wide) || !PutMeta(w, step, wide)) return false;
        const float inv = step > 0 ? 1.0f / step : 0.0f;
        for (uint32_t i = 0; i < n; ++i)
          codes[uint64_t(r0 + i) * s.width + c] = uint8_t(QuantCode(v[uint64_t(i) * s.row_stride], lo, inv, max_code));
      }
    }
  }
  const uint64_t rb = RowBytes(s, bits);
  for (uint32_t r = 0; r < s.rows; ++r) {
    uint8_t* p = w.Reserve(rb);
    if (!p) return false;
    PackCodes(codes + uint64_t(r) * s.width, s.width, bits, p);
  }
  return true;
}

Status DecodeGroupQuant(std::string_view codec, const Section& s, Grouping g, int bits, uint32_t group, bool wide,
                        ByteReader& r, float* y, float* meta, const Kernels& k) {
  if (s.rows == 0 || s.width == 0) return Status::Ok();
  const uint64_t meta_bytes = Groups(s, g, group) * 2 * (wide ? 4 : 2);
  const uint8_t* m = r.Take(meta_bytes);
  const uint64_t rb = RowBytes(s, bits);
  const uint8_t* codes = m ? r.Take(rb * s.rows) : nullptr;
  if (!codes) return BodyCorrupt(codec, "truncated group data");
  ByteReader mr({reinterpret_cast<const std::byte*>(m), meta_bytes});
  if (g == Grouping::kPerToken) {
    for (uint32_t row = 0; row < s.rows; ++row)
      for (uint32_t c0 = 0; c0 < s.width; c0 += group) {
        float lo = 0, step = 0;
        GetMeta(mr, wide, lo);
        GetMeta(mr, wide, step);
        k.dequant_scalar(codes + rb * row, bits, c0, std::min(group, s.width - c0), lo, step, y + s.At(row, c0));
      }
  } else {
    float* lo = meta;
    float* step = meta + s.width;
    for (uint32_t r0 = 0; r0 < s.rows; r0 += group) {
      for (uint32_t c = 0; c < s.width; ++c) {
        GetMeta(mr, wide, lo[c]);
        GetMeta(mr, wide, step[c]);
      }
      for (uint32_t row = r0; row < std::min(s.rows, r0 + group); ++row)
        k.dequant_vec(codes + rb * row, bits, 0, s.width, lo, step, y + s.At(row, 0));
    }
  }
  return Status::Ok();
}

}  // namespace flatkv::codec
