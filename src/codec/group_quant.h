// Asymmetric min-max quantization of a Section in groups, shared by kivi
// and mla. Two groupings:
//   per token:   each row's width split into groups of `group` channels;
//   per channel: each channel's column split into groups of `group` rows.
// Every group stores lo (its minimum) and step ((max - lo) / (2^bits - 1))
// as metadata (f16, or f32 when `wide`), then the codes: each row's codes
// packed `bits` per code LSB-first, a row padded to a whole byte.
// Layout in the body: all lo/step pairs of the section (group order:
// row-major for per token; [row group][channel] for per channel), then
// the rows' codes.
#pragma once

#include "codec/codec_internal.h"
#include "codec/kernels.h"

namespace flatkv::codec {

enum class Grouping { kPerToken, kPerChannel };

uint64_t GroupQuantBound(const Section& s, Grouping g, int bits, uint32_t group);
bool EncodeGroupQuant(const Section& s, Grouping g, int bits, uint32_t group, bool wide, const float* x, ByteWriter& w,
                      uint8_t* codes_scratch);
// `meta_scratch` holds 2 * s.width floats.
Status DecodeGroupQuant(std::string_view codec, const Section& s, Grouping g, int bits, uint32_t group, bool wide,
                        ByteReader& r, float* y, float* meta_scratch, const Kernels& k);

}  // namespace flatkv::codec
