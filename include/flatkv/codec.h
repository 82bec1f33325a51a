// Codecs: turn one block's slice of one layer into fewer bytes, and back.
//
// The API follows zstd's: a Codec is configured once (parameters set by
// name, each with queryable bounds), then used from many threads, each with
// its own reusable CodecContext (scratch memory, never shared). Every
// encoded slice starts with a versioned, self-describing header
// (docs/format_codec.md), so DecodeSlice() needs nothing but the bytes and
// the layout the caller expects; it rejects garbage with a Corruption error
// rather than reading out of bounds.
//
// What a slice is (the layout the store's callers use, src/model/kv_cache.h):
//   kMha: K rows of `tokens` positions, each kv_heads * head_dim elements
//         ([token][head][dim]), then V rows of the same positions;
//   kMla: `tokens` rows of latent_dim + rope_dim elements ([latent | rope]).
// Elements are shape.dtype (f32, f16 or bf16).
//
// Thread-safety: a const Codec is safe to use from many threads at once; a
// CodecContext belongs to one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flatkv/shape.h"
#include "flatkv/status.h"

namespace flatkv {

// The tensor a codec sees: one layer of `tokens` consecutive positions.
struct SliceLayout {
  KvShape shape;                 // kind, heads/dims, dtype (layers is ignored)
  uint32_t tokens = 0;           // positions in the slice (the store's block_tokens)
  uint32_t layer = 0;            // which layer (codecs may treat layers differently)
  // Absolute position of the slice's first token, or kUnknownPosition. Codecs
  // that undo RoPE on keys use it; the header records it.
  uint32_t first_position = kUnknownPosition;
  static constexpr uint32_t kUnknownPosition = 0xFFFFFFFFu;

  uint64_t Elements() const { return shape.ElementsPerTokenLayer() * tokens; }
  uint64_t Bytes() const { return shape.BytesPerTokenLayer() * tokens; }
};

// One tunable: its name, what it means, and its bounds.
struct CodecParamInfo {
  std::string name;
  std::string help;
  double min = 0;
  double max = 0;
  double default_value = 0;
  bool integer = false;
};

namespace codec {
struct ContextAccess;
}

// Scratch memory for one thread's encodes and decodes (and the decoders
// DecodeSlice made for the (codec, parameters) pairs it has seen). Reusing one across
// calls avoids allocations on the hot path.
class CodecContext {
 public:
  CodecContext();
  ~CodecContext();
  CodecContext(const CodecContext&) = delete;
  CodecContext& operator=(const CodecContext&) = delete;
  // A scratch buffer of at least `bytes`, slot `i` (0..7), valid until the
  // next call with the same slot. 64-byte aligned.
  std::byte* Scratch(int i, size_t bytes);

 private:
  friend struct codec::ContextAccess;
  struct Buffers;
  std::unique_ptr<Buffers> buffers_;
};

class Codec {
 public:
  virtual ~Codec() = default;

  // The codec's registered name ("raw", "int8", "kivi", "pred", ...) and its
  // one-byte id in the header.
  virtual std::string_view name() const = 0;
  virtual uint8_t id() const = 0;

  // Parameters. SetParam fails with InvalidArgument naming the parameter
  // and its bounds when the name is unknown or the value out of range.
  virtual std::vector<CodecParamInfo> Params() const = 0;
  virtual Status SetParam(std::string_view name, double value) = 0;
  virtual Result<double> GetParam(std::string_view name) const = 0;
  // "pred:eps=0.01,entropy=1" (what MakeCodec parses back).
  std::string Spec() const;

  // Whether the codec can encode this layout (dtype, kind, sizes); the
  // error names what is unsupported.
  virtual Status Supports(const SliceLayout& layout) const = 0;
  // An upper bound on Encode's output for `layout`, header included.
  virtual uint64_t MaxEncodedSize(const SliceLayout& layout) const = 0;
  // True when every encoding of a layout is exactly MaxEncodedSize bytes.
  virtual bool FixedSize() const = 0;
  // True when Decode(Encode(x)) == x bit for bit (with these parameters).
  virtual bool Lossless() const = 0;

  // Encodes `in` (layout.Bytes() bytes) into `out` (>= MaxEncodedSize) and
  // returns the bytes written.
  virtual Result<size_t> Encode(CodecContext& ctx, const SliceLayout& layout, std::span<const std::byte> in,
                                std::span<std::byte> out) const = 0;
  // Decodes a slice this codec encoded (the header already parsed and
  // checked against `layout` by DecodeSlice) into `out` (layout.Bytes()).
  virtual Status Decode(CodecContext& ctx, const SliceLayout& layout, std::span<const std::byte> in,
                        std::span<std::byte> out) const = 0;
};

// Makes a codec from a spec: a name, optionally followed by ':' and
// comma-separated name=value parameters ("kivi:bits=2", "pred:eps=0.02").
// Errors name the unknown codec (listing the known ones) or parameter.
Result<std::unique_ptr<Codec>> MakeCodec(std::string_view spec);
// Registered codec names, in id order.
std::vector<std::string> CodecNames();

// Decodes any encoded slice: reads the header, checks it describes
// `expected` (Corruption naming the mismatching field otherwise), makes the
// codec it names with the parameters it records, and decodes into `out`
// (expected.Bytes() bytes). Never reads past `in` or writes past `out`.
Status DecodeSlice(CodecContext& ctx, const SliceLayout& expected, std::span<const std::byte> in,
                   std::span<std::byte> out);

}  // namespace flatkv
