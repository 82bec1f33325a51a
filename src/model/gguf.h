// GGUF container reader (llama.cpp's model format, versions 2 and 3).
//
// GgufFile::Parse validates a whole file held in memory: the header, every
// metadata value (all scalar types, strings, arrays including nested ones),
// every tensor info, general.alignment and that each tensor's data lies
// inside the file. Every length and count is checked against the bytes left
// before anything is allocated, with overflow-safe arithmetic; every error
// names the field, key index, key or tensor at fault and the offending value.
// The format is described in docs/format_gguf.md.
//
// Invariants of a parsed GgufFile: keys and tensor names are unique; each
// tensor has n_dims <= 4, a known ggml type, ne[0] a multiple of the type's
// block size, an aligned offset, and `data` of exactly n_bytes inside the
// file.
//
// Lifetime: a GgufFile holds views (std::string_view) into the bytes given to
// Parse; those bytes must outlive it.
// Thread-safety: immutable after Parse; may be shared.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "flatkv/status.h"

namespace flatkv::model {

// Metadata value types, numbered as in the file.
enum class GgufType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
// "uint32", "string", ...; "type 13" for a number outside the enum.
std::string GgufTypeName(GgufType type);

// The ggml tensor element types this loader dequantizes.
inline constexpr uint32_t kGgmlF32 = 0;
inline constexpr uint32_t kGgmlF16 = 1;
inline constexpr uint32_t kGgmlQ4_1 = 3;
inline constexpr uint32_t kGgmlQ8_0 = 8;
// "f32", "q4_K", ...; "type 31" for a number ggml does not define.
std::string GgmlTypeName(uint32_t type);

// One metadata value. Scalars are widened into u64 (unsigned integers and
// bool), i64 (signed integers) or f64 (floats); strings and array elements
// are views into the file.
struct GgufValue {
  GgufType type = GgufType::kUint8;
  uint64_t u64 = 0;
  int64_t i64 = 0;
  double f64 = 0;
  std::string_view str;  // kString
  // kArray: element type, element count and the encoded elements.
  GgufType elem_type = GgufType::kUint8;
  uint64_t count = 0;
  std::string_view elems;
};

struct GgufKv {
  uint64_t index = 0;  // position among the file's metadata keys
  std::string_view key;
  GgufValue value;
};

struct GgufTensorInfo {
  uint64_t index = 0;  // position among the file's tensor infos
  std::string_view name;
  uint32_t n_dims = 0;
  std::array<uint64_t, 4> ne = {1, 1, 1, 1};  // innermost (fastest) first
  uint32_t type = 0;                          // ggml type
  uint64_t offset = 0;                        // from the start of the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  std::string_view data;  // n_bytes, inside the file
  // "[64, 512]": ne in file order, n_dims entries.
  std::string Shape() const;
};

class GgufFile {
 public:
  // Limits checked before allocating (the bytes left bound them further).
  static constexpr uint64_t kMaxTensors = uint64_t{1} << 20;
  static constexpr uint64_t kMaxKeys = uint64_t{1} << 20;
  static constexpr int kMaxArrayDepth = 8;  // nesting of arrays of arrays
  static constexpr uint32_t kDefaultAlignment = 32;

  static Result<GgufFile> Parse(std::string_view bytes);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // Start of the data section: the end of the tensor infos rounded up to
  // the alignment (may lie past the end of a file without tensors).
  uint64_t data_offset() const { return data_offset_; }
  uint64_t file_size() const { return file_size_; }
  const std::vector<GgufKv>& metadata() const { return kvs_; }
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }

  // nullptr when absent.
  const GgufKv* FindKey(std::string_view key) const;
  const GgufTensorInfo* FindTensor(std::string_view name) const;

  // Typed getters. Without a fallback an absent key is NotFound; a value of
  // the wrong type is Corruption naming the key ("metadata key 12
  // 'llama.block_count': expected uint32, got string"). Integer getters
  // accept any integer type whose value is in range; GetF32 accepts float32
  // and float64.
  Result<uint32_t> GetU32(std::string_view key) const;
  Result<uint32_t> GetU32(std::string_view key, uint32_t fallback) const;
  Result<float> GetF32(std::string_view key, float fallback) const;
  Result<bool> GetBool(std::string_view key, bool fallback) const;
  Result<std::string_view> GetString(std::string_view key) const;
  // Arrays: string elements are views into the file.
  Result<std::vector<std::string_view>> GetStringArray(std::string_view key) const;
  Result<std::vector<float>> GetF32Array(std::string_view key) const;
  Result<std::vector<int32_t>> GetI32Array(std::string_view key) const;

  // "metadata key 12 'llama.block_count'": how errors name a key.
  static std::string KeyName(const GgufKv& kv);

 private:
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  uint64_t file_size_ = 0;
  std::vector<GgufKv> kvs_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string_view, size_t> key_index_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

// Decodes the elements of an array value (nested arrays come back as kArray
// values). The value must come from a parsed GgufFile.
std::vector<GgufValue> DecodeArray(const GgufValue& array);

// IEEE 754 binary16 -> binary32, exact for every input (subnormals, infinities
// and NaN payloads included).
float HalfToFloat(uint16_t h);

// The tensor's elements as fp32, in file order: F32, F16, Q4_1 (blocks of 32:
// fp16 scale d and minimum m, then 32 4-bit q; value = d * q + m) and Q8_0
// (blocks of 32: an fp16 scale d, then 32 int8 q; value = d * q). Other types
// are NotSupported naming the tensor and its type.
Result<std::vector<float>> DequantizeTensor(const GgufTensorInfo& tensor);

}  // namespace flatkv::model
