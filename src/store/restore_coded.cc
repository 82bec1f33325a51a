// RestoreImpl's coded runs: their pieces' byte ranges, reads into the
// window's staging area, and the decode jobs that verify each encoded slice
// and decode it into its block's place (store/restore.h), or, into device
// memory whose landing decodes the codec, check each slice and hand the
// checked ones to the landing to decode there.
#include <algorithm>
#include <cstring>

#include "codec/codec_internal.h"
#include "common/checksum.h"
#include "common/log.h"
#include "store/restore.h"

namespace flatkv {
namespace {

// Checks the header of a slice the store kept with `codec`: it must name
// this codec and describe `layout` (Corruption naming the field otherwise).
Result<codec::SliceHeader> CheckStored(const Codec& codec, uint32_t params_bytes, const SliceLayout& layout,
                                       std::span<const std::byte> in) {
  FLATKV_ASSIGN_OR_RETURN(codec::SliceHeader h, codec::ParseHeader(in));
  const bool mla = layout.shape.kind == AttentionKind::kMla;
  const uint32_t dim_a = mla ? layout.shape.latent_dim : layout.shape.kv_heads;
  const uint32_t dim_b = mla ? layout.shape.rope_dim : layout.shape.head_dim;
  auto mismatch = [](const char* field, uint64_t got, uint64_t want) {
    return Status::Corruption("encoded slice: " + std::string(field) + " " + std::to_string(got) + ", expected " +
                              std::to_string(want));
  };
  if (h.codec_id != codec.id()) return mismatch("codec id", h.codec_id, codec.id());
  if (h.kind != layout.shape.kind) return mismatch("attention kind", uint64_t(h.kind), uint64_t(layout.shape.kind));
  if (h.dtype != layout.shape.dtype) return mismatch("dtype", uint64_t(h.dtype), uint64_t(layout.shape.dtype));
  if (h.tokens != layout.tokens) return mismatch("tokens", h.tokens, layout.tokens);
  if (h.dim_a != dim_a || h.dim_b != dim_b) return mismatch("dimensions", uint64_t{h.dim_a} << 32 | h.dim_b, uint64_t{dim_a} << 32 | dim_b);
  if (h.layer != (layout.layer & 0xFFFF)) return mismatch("layer", h.layer, layout.layer);
  if (h.params_bytes != params_bytes) return mismatch("parameter bytes", h.params_bytes, params_bytes);
  return h;
}

// Decodes a slice the store kept with `codec` (CheckStored first).
Status DecodeStored(CodecContext& ctx, const Codec& codec, uint32_t params_bytes, const SliceLayout& layout,
                    std::span<const std::byte> in, std::span<std::byte> out) {
  FLATKV_ASSIGN_OR_RETURN(codec::SliceHeader h, CheckStored(codec, params_bytes, layout, in));
  SliceLayout l = layout;
  l.first_position = h.first_position;
  const size_t start = codec::kHeaderBytes + h.params_bytes;
  return codec.Decode(ctx, l, in.subspan(start, codec::kHeaderBytes + h.body_bytes - start), out.first(layout.Bytes()));
}

}  // namespace

void RestoreImpl::CodedSpan(const Run& r, uint32_t layer, uint32_t j0, uint32_t n, uint64_t align, uint64_t* begin,
                            uint64_t* end) const {
  const uint64_t a = uint64_t{r.first_block + j0} * layers_ + layer;
  const uint64_t z = uint64_t{r.first_block + j0 + n - 1} * layers_ + layer;
  *begin = enc_off_[a] / align * align;
  *end = RoundUp(uint64_t{enc_off_[z]} + enc_len_[z], align);
}

std::byte* RestoreImpl::Home(uint32_t layer, uint32_t block) {
  // Into device memory a coded block decoded on the host decodes in the
  // window first (FinalizeLayer copies it over).
  return target_.destination && !target_.device ? Dst(layer, block) : window_->slot(layer % slots_) + uint64_t{block} * lb_;
}

void RestoreImpl::CopyCoded(uint32_t layer, const Run& r, uint32_t j0, uint32_t n, const std::byte* bytes,
                            uint64_t region_begin) {
  std::byte* region = store_->dram()->At(r.copy_src + uint64_t{layer} * r.layer_stride);
  for (uint32_t j = j0; j < j0 + n; ++j) {
    const uint64_t at = uint64_t{r.first_block + j} * layers_ + layer;
    std::memcpy(region + enc_off_[at], bytes + (enc_off_[at] - region_begin), enc_len_[at]);
  }
}

void RestoreImpl::IssueCoded(uint32_t layer, const Piece& p, std::byte* slot) {
  const Run& r = runs_[p.run];
  MediumCounters& mc = *r.source->counters();
  uint64_t begin, end;
  CodedSpan(r, layer, p.j0, p.n, r.source->land_align(), &begin, &end);
  const uint64_t region = r.src + uint64_t{layer} * r.layer_stride;
  mc.read_requests++;
  mc.bytes_read += end - begin;
  if (r.source->mapped()) {  // decoded straight from the medium's memory
    const std::byte* from = r.source->Map(region + begin);
    const bool verify = r.source->verifies();
    store_->decode_queue()->Submit([this, layer, &r, p, from, begin, verify] { DecodeBlocks(layer, r, p.j0, p.n, from, begin, verify); });
    mc.NoteDepth(store_->decode_queue()->outstanding());
    return;
  }
  std::byte* into = slot + p.stage;
  r.source->ReadBytes(r.fd, region + begin, into, end - begin,
                            [this, layer, &r, p, into, begin, at = region + begin](Status s) {
                              if (s.ok()) {
                                if (r.readmit) CopyCoded(layer, r, p.j0, p.n, into, begin);
                                return SubmitDecodes(layer, r, p.j0, p.n, into, begin, true);
                              }
                              store_->counters().io_errors++;
                              LogWarning("restore: layer " + std::to_string(layer) + ": " +
                                         s.WithContext("read at offset " + std::to_string(at)).ToString() +
                                         "; blocks from " + std::to_string(r.first_block + p.j0) +
                                         " on are misses, and the blocks it read leave the index");
                              Settle(layer, r.first_block + p.j0, ReadBlocks(r, p.j0, p.n));
                            });
}

void RestoreImpl::SubmitDecodes(uint32_t layer, const Run& r, uint32_t j0, uint32_t n, const std::byte* bytes,
                                uint64_t region_begin, bool verify) {
  SubmitJobs(layer, n, kDecodeJobBytes, [this, layer, &r, j0, bytes, region_begin, verify](uint32_t j, uint32_t m) {
    DecodeBlocks(layer, r, j0 + j, m, bytes, region_begin, verify);
  });
}

void RestoreImpl::DecodeBlocks(uint32_t layer, const Run& r, uint32_t j0, uint32_t n, const std::byte* bytes,
                               uint64_t region_begin, bool verify) {
  thread_local CodecContext ctx;
  Counters& c = store_->counters();
  const SliceLayout layout{store_->options().shape, store_->options().block_tokens, layer, SliceLayout::kUnknownPosition};
  uint32_t bad = UINT32_MAX, decoded = 0;
  std::vector<BlockRef> corrupt;
  // Decoded on the device: the slices checked here, then decoded there at once.
  std::vector<std::span<const std::byte>> slices;
  std::vector<std::byte*> dst;
  for (uint32_t j = j0; j < j0 + n; ++j) {
    const uint32_t block = r.first_block + j;
    const uint64_t at = uint64_t{block} * layers_ + layer;
    const std::span<const std::byte> in(bytes + (enc_off_[at] - region_begin), enc_len_[at]);
    std::string problem;
    if (verify && BlockChecksum(in.data(), in.size()) != checksums_[at]) {
      c.checksum_failures++;
      problem = "checksum mismatch";
    } else if (r.device_decode) {
      if (Status s = CheckStored(*r.codec, r.params_bytes, layout, in).status(); !s.ok()) {
        c.decode_failures++;
        problem = "its " + std::string(r.codec->name()) + " slice: " + s.ToString();
      } else {
        slices.push_back(in);
        dst.push_back(Dst(layer, block));
      }
    } else if (Status s = DecodeStored(ctx, *r.codec, r.params_bytes, layout, in, std::span(Home(layer, block), lb_));
               !s.ok()) {
      c.decode_failures++;
      problem = "decoding with " + std::string(r.codec->name()) + " failed: " + s.ToString();
    }
    if (problem.empty()) {
      ++decoded;
      continue;
    }
    LogWarning("restore: block " + std::to_string(block) + " layer " + std::to_string(layer) + " (" +
               std::string(MediumName(r.source->medium())) + " extent " + std::to_string(r.extent) + " slot " +
               std::to_string(r.first_slot + j) + "): " + problem + "; it and every later block are misses");
    corrupt.push_back({r.extent, r.first_slot + j});
    bad = block;
    break;
  }
  if (!slices.empty()) {
    // The landing's failure, not the medium's: the blocks it was given stay
    // stored (a corrupt block found after them still leaves the index).
    if (Status s = target_.device->Decode(layout, slices, dst); !s.ok()) {
      LogWarning("restore: layer " + std::to_string(layer) + ": decoding in device memory: " + s.ToString() +
                 "; blocks from " + std::to_string(r.first_block + j0) + " on are misses");
      bad = r.first_block + j0;
      decoded = 0;
    }
  }
  r.source->counters()->bytes_delivered += uint64_t{decoded} * lb_;
  Settle(layer, bad, corrupt);
}

}  // namespace flatkv
