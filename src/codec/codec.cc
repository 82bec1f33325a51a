#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <zstd.h>

#include "codec/codec_internal.h"

namespace flatkv {

struct CodecContext::Buffers {
  struct Slot {
    std::byte* data = nullptr;
    size_t bytes = 0;
  };
  Slot slots[8];
  ZSTD_CCtx* cctx = nullptr;
  ZSTD_DCtx* dctx = nullptr;
  // Decoders DecodeSlice made, by codec id and raw parameter bytes.
  struct Decoder {
    uint8_t id;
    std::vector<std::byte> params;
    std::unique_ptr<Codec> codec;
  };
  std::vector<Decoder> decoders;
  ~Buffers() {
    for (Slot& s : slots) std::free(s.data);
    ZSTD_freeCCtx(cctx);
    ZSTD_freeDCtx(dctx);
  }
};

CodecContext::CodecContext() : buffers_(std::make_unique<Buffers>()) {}
CodecContext::~CodecContext() = default;

std::byte* CodecContext::Scratch(int i, size_t bytes) {
  auto& s = buffers_->slots[i];
  if (s.bytes < bytes) {
    std::free(s.data);
    const size_t rounded = (bytes + 63) / 64 * 64;
    s.data = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
    s.bytes = s.data ? rounded : 0;
    if (!s.data) std::abort();
  }
  return s.data;
}

std::string Codec::Spec() const {
  std::string spec(name());
  const auto params = Params();
  for (size_t i = 0; i < params.size(); ++i) {
    auto v = GetParam(params[i].name);
    spec += (i == 0 ? ":" : ",") + params[i].name + "=";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v.ok() ? *v : 0.0);
    spec += buf;
  }
  return spec;
}

namespace codec {

void* ContextAccess::ZstdCCtx(CodecContext& ctx) {
  auto& b = *ctx.buffers_;
  if (!b.cctx) b.cctx = ZSTD_createCCtx();
  if (!b.cctx) std::abort();
  return b.cctx;
}

void* ContextAccess::ZstdDCtx(CodecContext& ctx) {
  auto& b = *ctx.buffers_;
  if (!b.dctx) b.dctx = ZSTD_createDCtx();
  if (!b.dctx) std::abort();
  return b.dctx;
}

const Codec* ContextAccess::CachedDecoder(CodecContext& ctx, uint8_t id, std::span<const std::byte> params) {
  for (const auto& d : ctx.buffers_->decoders)
    if (d.id == id && d.params.size() == params.size() &&
        (params.empty() || std::memcmp(d.params.data(), params.data(), params.size()) == 0))
      return d.codec.get();
  return nullptr;
}

const Codec* ContextAccess::AddDecoder(CodecContext& ctx, uint8_t id, std::span<const std::byte> params,
                                       std::unique_ptr<Codec> codec) {
  auto& list = ctx.buffers_->decoders;
  constexpr size_t kMaxCached = 16;  // a context sees few distinct settings
  if (list.size() >= kMaxCached) list.erase(list.begin());
  list.push_back({id, std::vector<std::byte>(params.begin(), params.end()), std::move(codec)});
  return list.back().codec.get();
}

namespace {

template <typename T>
void Put(std::span<std::byte> out, size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof v);
}
template <typename T>
T Get(std::span<const std::byte> in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof v);
  return v;
}

}  // namespace

size_t HeaderAndParamsBytes(const Codec& codec) { return kHeaderBytes + 8 * codec.Params().size(); }

size_t WriteHeader(const Codec& codec, const SliceLayout& layout, std::span<std::byte> out) {
  const auto params = codec.Params();
  const bool mla = layout.shape.kind == AttentionKind::kMla;
  Put<uint32_t>(out, 0, kMagic);
  Put<uint8_t>(out, 4, kVersion);
  Put<uint8_t>(out, 5, codec.id());
  Put<uint8_t>(out, 6, uint8_t(layout.shape.kind));
  Put<uint8_t>(out, 7, uint8_t(layout.shape.dtype));
  Put<uint32_t>(out, 8, layout.tokens);
  Put<uint32_t>(out, 12, mla ? layout.shape.latent_dim : layout.shape.kv_heads);
  Put<uint32_t>(out, 16, mla ? layout.shape.rope_dim : layout.shape.head_dim);
  Put<uint32_t>(out, 20, layout.first_position);
  Put<uint32_t>(out, 24, 0);
  Put<uint16_t>(out, 28, uint16_t(layout.layer));
  Put<uint16_t>(out, 30, uint16_t(8 * params.size()));
  for (size_t i = 0; i < params.size(); ++i) Put<double>(out, kHeaderBytes + 8 * i, *codec.GetParam(params[i].name));
  const size_t n = kHeaderBytes + 8 * params.size();
  SetBodyBytes(out, uint32_t(8 * params.size()));
  return n;
}

void SetBodyBytes(std::span<std::byte> out, uint32_t body_bytes) { Put<uint32_t>(out, 24, body_bytes); }

Result<SliceHeader> ParseHeader(std::span<const std::byte> in) {
  if (in.size() < kHeaderBytes)
    return Status::Corruption("encoded slice: " + std::to_string(in.size()) + " bytes, shorter than the " +
                              std::to_string(kHeaderBytes) + "-byte header");
  if (Get<uint32_t>(in, 0) != kMagic) return Status::Corruption("encoded slice: bad magic (not a flatkv codec block)");
  SliceHeader h;
  h.version = Get<uint8_t>(in, 4);
  if (h.version != kVersion)
    return Status::Corruption("encoded slice: unsupported format version " + std::to_string(h.version));
  h.codec_id = Get<uint8_t>(in, 5);
  const uint8_t kind = Get<uint8_t>(in, 6), dtype = Get<uint8_t>(in, 7);
  if (kind != uint8_t(AttentionKind::kMha) && kind != uint8_t(AttentionKind::kMla))
    return Status::Corruption("encoded slice: bad attention kind " + std::to_string(kind));
  if (DTypeBytes(DType(dtype)) == 0)
    return Status::Corruption("encoded slice: bad dtype " + std::to_string(dtype));
  h.kind = AttentionKind(kind);
  h.dtype = DType(dtype);
  h.tokens = Get<uint32_t>(in, 8);
  h.dim_a = Get<uint32_t>(in, 12);
  h.dim_b = Get<uint32_t>(in, 16);
  h.first_position = Get<uint32_t>(in, 20);
  h.body_bytes = Get<uint32_t>(in, 24);
  h.layer = Get<uint16_t>(in, 28);
  h.params_bytes = Get<uint16_t>(in, 30);
  if (h.body_bytes > in.size() - kHeaderBytes)
    return Status::Corruption("encoded slice: header says " + std::to_string(h.body_bytes) + " body bytes, only " +
                              std::to_string(in.size() - kHeaderBytes) + " present");
  if (h.params_bytes > h.body_bytes || h.params_bytes % 8 != 0)
    return Status::Corruption("encoded slice: bad parameter block of " + std::to_string(h.params_bytes) + " bytes");
  return h;
}

CodecBase::CodecBase(std::vector<CodecParamInfo> params) : params_(std::move(params)) {
  for (const auto& p : params_) values_.push_back(p.default_value);
}

Status CodecBase::SetParam(std::string_view name, double value) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    if (p.name != name) continue;
    if (!(value >= p.min && value <= p.max) || (p.integer && value != double(int64_t(value)))) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "codec %s: parameter %s=%g out of range [%g, %g]%s", std::string(this->name()).c_str(),
                    p.name.c_str(), value, p.min, p.max, p.integer ? " (an integer)" : "");
      return Status::InvalidArgument(buf);
    }
    values_[i] = value;
    ParamsChanged();
    return Status::Ok();
  }
  std::string known;
  for (const auto& p : params_) known += (known.empty() ? "" : ", ") + p.name;
  return Status::InvalidArgument("codec " + std::string(this->name()) + ": unknown parameter '" + std::string(name) +
                                 "' (known: " + (known.empty() ? "none" : known) + ")");
}

Result<double> CodecBase::GetParam(std::string_view name) const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].name == name) return values_[i];
  return Status::InvalidArgument("codec " + std::string(this->name()) + ": unknown parameter '" + std::string(name) + "'");
}

const std::vector<CodecFactory>& Registry() {
  static const std::vector<CodecFactory> registry = {
      {0, "raw", &MakeRawCodec},           {1, "int8", &MakeInt8Codec},   {2, "kivi", &MakeKiviCodec},
      {3, "hadamard-int4", &MakeHadamardCodec}, {4, "turbo", &MakeTurboCodec}, {5, "pred", &MakePredCodec},
      {6, "mla", &MakeMlaCodec},
  };
  return registry;
}

}  // namespace codec

Result<std::unique_ptr<Codec>> MakeCodec(std::string_view spec) {
  const size_t colon = spec.find(':');
  const std::string_view name = spec.substr(0, colon);
  std::unique_ptr<Codec> codec;
  for (const auto& f : codec::Registry())
    if (name == f.name) codec = f.make();
  if (!codec) {
    std::string known;
    for (const auto& n : CodecNames()) known += (known.empty() ? "" : ", ") + n;
    return Status::InvalidArgument("unknown codec '" + std::string(name) + "' (known: " + known + ")");
  }
  if (colon == std::string_view::npos) return codec;
  std::string_view rest = spec.substr(colon + 1);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      return Status::InvalidArgument("codec spec '" + std::string(spec) + "': expected name=value, got '" +
                                     std::string(item) + "'");
    const std::string value(item.substr(eq + 1));
    char* end = nullptr;
    const double v = std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0')
      return Status::InvalidArgument("codec spec '" + std::string(spec) + "': '" + value + "' is not a number");
    FLATKV_RETURN_IF_ERROR(codec->SetParam(item.substr(0, eq), v));
  }
  return codec;
}

std::vector<std::string> CodecNames() {
  std::vector<std::string> names;
  for (const auto& f : codec::Registry()) names.push_back(f.name);
  return names;
}

Status DecodeSlice(CodecContext& ctx, const SliceLayout& expected, std::span<const std::byte> in,
                   std::span<std::byte> out) {
  FLATKV_ASSIGN_OR_RETURN(codec::SliceHeader h, codec::ParseHeader(in));
  const bool mla = expected.shape.kind == AttentionKind::kMla;
  auto mismatch = [](const char* field, uint64_t got, uint64_t want) {
    return Status::Corruption("encoded slice: " + std::string(field) + " " + std::to_string(got) + ", expected " +
                              std::to_string(want));
  };
  if (h.kind != expected.shape.kind) return mismatch("attention kind", uint64_t(h.kind), uint64_t(expected.shape.kind));
  if (h.dtype != expected.shape.dtype) return mismatch("dtype", uint64_t(h.dtype), uint64_t(expected.shape.dtype));
  if (h.tokens != expected.tokens) return mismatch("tokens", h.tokens, expected.tokens);
  if (h.dim_a != (mla ? expected.shape.latent_dim : expected.shape.kv_heads))
    return mismatch(mla ? "latent_dim" : "kv_heads", h.dim_a, mla ? expected.shape.latent_dim : expected.shape.kv_heads);
  if (h.dim_b != (mla ? expected.shape.rope_dim : expected.shape.head_dim))
    return mismatch(mla ? "rope_dim" : "head_dim", h.dim_b, mla ? expected.shape.rope_dim : expected.shape.head_dim);
  if (out.size() < expected.Bytes()) return Status::InvalidArgument("DecodeSlice: output smaller than the slice");
  const std::span<const std::byte> param_bytes = in.subspan(codec::kHeaderBytes, h.params_bytes);
  const Codec* codec = codec::ContextAccess::CachedDecoder(ctx, h.codec_id, param_bytes);
  if (!codec) {
    const codec::CodecFactory* factory = nullptr;
    for (const auto& f : codec::Registry())
      if (f.id == h.codec_id) factory = &f;
    if (!factory) return Status::Corruption("encoded slice: unknown codec id " + std::to_string(h.codec_id));
    std::unique_ptr<Codec> made = factory->make();
    const auto params = made->Params();
    if (h.params_bytes != 8 * params.size())
      return Status::Corruption("encoded slice: " + std::string(factory->name) + " expects " +
                                std::to_string(8 * params.size()) + " parameter bytes, header has " +
                                std::to_string(h.params_bytes));
    for (size_t i = 0; i < params.size(); ++i) {
      double v;
      std::memcpy(&v, in.data() + codec::kHeaderBytes + 8 * i, 8);
      Status st = made->SetParam(params[i].name, v);
      if (!st.ok()) return Status::Corruption("encoded slice: " + st.message());
    }
    codec = codec::ContextAccess::AddDecoder(ctx, h.codec_id, param_bytes, std::move(made));
  }
  SliceLayout layout = expected;
  layout.first_position = h.first_position;
  layout.layer = h.layer;
  const size_t start = codec::kHeaderBytes + h.params_bytes;
  return codec->Decode(ctx, layout, in.subspan(start, codec::kHeaderBytes + h.body_bytes - start),
                       out.first(expected.Bytes()));
}

}  // namespace flatkv
