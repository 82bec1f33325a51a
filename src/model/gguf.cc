#include "model/gguf.h"

#include <bit>
#include <cstring>
#include <limits>

namespace flatkv::model {
namespace {

static_assert(std::endian::native == std::endian::little, "GGUF reader assumes a little-endian host");

std::string Num(uint64_t v) { return std::to_string(v); }

// ggml's element types: name, elements per block, bytes per block. Removed
// or never-assigned numbers have block 0.
struct GgmlTypeTraits {
  const char* name;
  uint32_t block;
  uint32_t bytes;
};
constexpr GgmlTypeTraits kGgmlTypes[] = {
    // clang-format off
    {"f32", 1, 4},      {"f16", 1, 2},        {"q4_0", 32, 18},     {"q4_1", 32, 20},     {"q4_2", 0, 0},
    {"q4_3", 0, 0},     {"q5_0", 32, 22},     {"q5_1", 32, 24},     {"q8_0", 32, 34},     {"q8_1", 32, 36},
    {"q2_K", 256, 84},  {"q3_K", 256, 110},   {"q4_K", 256, 144},   {"q5_K", 256, 176},   {"q6_K", 256, 210},
    {"q8_K", 256, 292}, {"iq2_xxs", 256, 66}, {"iq2_xs", 256, 74},  {"iq3_xxs", 256, 98}, {"iq1_s", 256, 50},
    {"iq4_nl", 32, 18}, {"iq3_s", 256, 110},  {"iq2_s", 256, 82},   {"iq4_xs", 256, 136}, {"i8", 1, 1},
    {"i16", 1, 2},      {"i32", 1, 4},        {"i64", 1, 8},        {"f64", 1, 8},        {"iq1_m", 256, 56},
    {"bf16", 1, 2},     {"q4_0_4_4", 0, 0},   {"q4_0_4_8", 0, 0},   {"q4_0_8_8", 0, 0},   {"tq1_0", 256, 54},
    {"tq2_0", 256, 66}, {"iq4_nl_4_4", 0, 0}, {"iq4_nl_4_8", 0, 0}, {"iq4_nl_8_8", 0, 0}, {"mxfp4", 32, 17},
    // clang-format on
};
constexpr uint32_t kNumGgmlTypes = sizeof(kGgmlTypes) / sizeof(kGgmlTypes[0]);

// Bytes of one scalar value by type number; 0 for string (8) and array (9).
constexpr uint8_t kScalarSize[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

bool KnownType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kFloat64); }
uint64_t ScalarSize(GgufType t) { return kScalarSize[static_cast<uint32_t>(t)]; }

// Fewest bytes an element of type `t` takes: bounds array counts.
uint64_t MinSize(GgufType t) {
  if (t == GgufType::kString) return 8;  // the length
  if (t == GgufType::kArray) return 12;  // element type + count
  return ScalarSize(t);
}

bool IsSigned(GgufType t) {
  return t == GgufType::kInt8 || t == GgufType::kInt16 || t == GgufType::kInt32 || t == GgufType::kInt64;
}
bool IsInteger(GgufType t) {
  return IsSigned(t) || t == GgufType::kUint8 || t == GgufType::kUint16 || t == GgufType::kUint32 ||
         t == GgufType::kUint64;
}

template <typename T>
T Load(const char* p) {
  T x;
  std::memcpy(&x, p, sizeof(T));
  return x;
}

// Reads a scalar of type `t` from exactly ScalarSize(t) bytes at `p`.
void DecodeScalar(GgufType t, const char* p, GgufValue* v) {
  v->type = t;
  switch (t) {
    case GgufType::kUint8:
    case GgufType::kBool:
      v->u64 = Load<uint8_t>(p);
      break;
    case GgufType::kInt8:
      v->i64 = Load<int8_t>(p);
      break;
    case GgufType::kUint16:
      v->u64 = Load<uint16_t>(p);
      break;
    case GgufType::kInt16:
      v->i64 = Load<int16_t>(p);
      break;
    case GgufType::kUint32:
      v->u64 = Load<uint32_t>(p);
      break;
    case GgufType::kInt32:
      v->i64 = Load<int32_t>(p);
      break;
    case GgufType::kFloat32:
      v->f64 = Load<float>(p);
      break;
    case GgufType::kUint64:
      v->u64 = Load<uint64_t>(p);
      break;
    case GgufType::kInt64:
      v->i64 = Load<int64_t>(p);
      break;
    case GgufType::kFloat64:
      v->f64 = Load<double>(p);
      break;
    case GgufType::kString:
    case GgufType::kArray:
      break;
  }
}

// A bounds-checked cursor over the file. Read functions return false when
// fewer bytes remain than they need; the caller then reports Truncated().
class Reader {
 public:
  explicit Reader(std::string_view bytes) : b_(bytes) {}
  uint64_t pos() const { return pos_; }
  uint64_t size() const { return b_.size(); }
  uint64_t left() const { return b_.size() - pos_; }
  const char* here() const { return b_.data() + pos_; }

  template <typename T>
  bool Read(T* out) {
    if (left() < sizeof(T)) return false;
    std::memcpy(out, here(), sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  void Skip(uint64_t n) { pos_ += n; }  // caller checked n <= left()
  void Seek(uint64_t pos) { pos_ = pos; }

  Status Truncated(const std::string& what, uint64_t need) const {
    return Status::Corruption(what + ": truncated: needs " + Num(need) + " bytes at offset " + Num(pos_) +
                              ", file is " + Num(b_.size()) + " bytes");
  }
  // A u64 length then that many bytes.
  Status ReadString(const std::string& what, std::string_view* out) {
    uint64_t len = 0;
    if (!Read(&len)) return Truncated(what + " length", 8);
    if (len > left()) {
      return Status::Corruption(what + ": string length " + Num(len) + " at offset " + Num(pos_ - 8) +
                                " runs past end of file (" + Num(b_.size()) + ")");
    }
    *out = std::string_view(here(), len);
    pos_ += len;
    return Status::Ok();
  }

 private:
  std::string_view b_;
  uint64_t pos_ = 0;
};

// A header count: at most `limit`, and `min_bytes` each must fit in what follows.
Status CheckCount(const char* what, uint64_t n, uint64_t limit, uint64_t min_bytes, const Reader& r) {
  if (n > limit) {
    return Status::Corruption(std::string("gguf header: ") + what + " " + Num(n) + " exceeds the limit " + Num(limit));
  }
  if (n > r.left() / min_bytes) {
    return Status::Corruption(std::string("gguf header: ") + what + " " + Num(n) + " needs at least " +
                              Num(n * min_bytes) + " bytes but " + Num(r.left()) +
                              " follow the header: runs past end of file (truncated?)");
  }
  return Status::Ok();
}

// Parses one value of type `type` at the reader; `what` names it for errors.
Status ParseValue(Reader& r, GgufType type, int depth, const std::string& what, GgufValue* v) {
  v->type = type;
  if (type == GgufType::kString) return r.ReadString(what, &v->str);
  if (type != GgufType::kArray) {
    uint64_t n = ScalarSize(type);
    if (r.left() < n) return r.Truncated(what + " (" + GgufTypeName(type) + ")", n);
    DecodeScalar(type, r.here(), v);
    r.Skip(n);
    return Status::Ok();
  }
  if (depth >= GgufFile::kMaxArrayDepth) {
    return Status::Corruption(what + ": arrays nested deeper than " + Num(GgufFile::kMaxArrayDepth));
  }
  uint32_t et = 0;
  if (!r.Read(&et)) return r.Truncated(what + " array element type", 4);
  if (!KnownType(et)) return Status::Corruption(what + ": unknown array element type " + Num(et));
  uint64_t count = 0;
  if (!r.Read(&count)) return r.Truncated(what + " array count", 8);
  v->elem_type = static_cast<GgufType>(et);
  v->count = count;
  uint64_t min = MinSize(v->elem_type);
  if (count > r.left() / min) {
    return Status::Corruption(what + ": array of " + Num(count) + " " + GgufTypeName(v->elem_type) +
                              " values at offset " + Num(r.pos()) + " needs at least " + Num(min) +
                              " bytes each: runs past end of file (" + Num(r.size()) + ")");
  }
  const char* start = r.here();
  uint64_t start_pos = r.pos();
  if (v->elem_type == GgufType::kString || v->elem_type == GgufType::kArray) {
    GgufValue elem;
    for (uint64_t i = 0; i < count; ++i) {
      uint64_t at = r.pos();
      if (!ParseValue(r, v->elem_type, depth + 1, what, &elem).ok()) {
        r.Seek(at);  // parse again, naming the element (kept off the success path)
        return ParseValue(r, v->elem_type, depth + 1, what + " element " + Num(i), &elem);
      }
    }
  } else {
    r.Skip(count * min);  // checked above: count * min <= left
  }
  v->elems = std::string_view(start, r.pos() - start_pos);
  return Status::Ok();
}

Status TypeError(const GgufKv& kv, std::string_view expected) {
  std::string got = GgufTypeName(kv.value.type);
  if (kv.value.type == GgufType::kArray) got += " of " + GgufTypeName(kv.value.elem_type);
  return Status::Corruption(GgufFile::KeyName(kv) + ": expected " + std::string(expected) + ", got " + got);
}

// An integer value in [lo, hi] as int64 (hi <= INT64_MAX) or uint64.
bool IntInRange(const GgufValue& v, int64_t lo, uint64_t hi, int64_t* out) {
  if (IsSigned(v.type)) {
    if (v.i64 < lo || (v.i64 >= 0 && static_cast<uint64_t>(v.i64) > hi)) return false;
    *out = v.i64;
    return true;
  }
  if (v.u64 > hi) return false;
  *out = static_cast<int64_t>(v.u64);
  return true;
}

std::string IntText(const GgufValue& v) { return IsSigned(v.type) ? std::to_string(v.i64) : std::to_string(v.u64); }

}  // namespace

std::string GgufTypeName(GgufType type) {
  switch (type) {
    case GgufType::kUint8:
      return "uint8";
    case GgufType::kInt8:
      return "int8";
    case GgufType::kUint16:
      return "uint16";
    case GgufType::kInt16:
      return "int16";
    case GgufType::kUint32:
      return "uint32";
    case GgufType::kInt32:
      return "int32";
    case GgufType::kFloat32:
      return "float32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kUint64:
      return "uint64";
    case GgufType::kInt64:
      return "int64";
    case GgufType::kFloat64:
      return "float64";
  }
  return "type " + Num(static_cast<uint32_t>(type));
}

std::string GgmlTypeName(uint32_t type) {
  if (type < kNumGgmlTypes) return kGgmlTypes[type].name;
  return "type " + Num(type);
}

std::string GgufTensorInfo::Shape() const {
  std::string s = "[";
  for (uint32_t i = 0; i < n_dims; ++i) s += (i ? ", " : "") + Num(ne[i]);
  return s + "]";
}

std::string GgufFile::KeyName(const GgufKv& kv) {
  return "metadata key " + Num(kv.index) + " '" + std::string(kv.key) + "'";
}

Result<GgufFile> GgufFile::Parse(std::string_view bytes) {
  GgufFile f;
  f.file_size_ = bytes.size();
  Reader r(bytes);
  char magic[4];
  if (!r.Read(&magic)) return r.Truncated("gguf header: magic", 4);
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    std::string shown;
    for (char c : magic) shown += (c >= 0x20 && c < 0x7f) ? c : '?';
    return Status::Corruption("gguf header: bad magic '" + shown + "' (expected 'GGUF')");
  }
  if (!r.Read(&f.version_)) return r.Truncated("gguf header: version", 4);
  if (f.version_ != 2 && f.version_ != 3) {
    std::string hint = f.version_ == 1              ? " (version 1 uses 32-bit counts; re-convert the file)"
                       : (f.version_ & 0xffff) == 0 ? " (a big-endian file?)"
                                                    : "";
    return Status::NotSupported("gguf header: version " + Num(f.version_) + " is not supported (only 2 and 3)" + hint);
  }
  uint64_t n_tensors = 0, n_kv = 0;
  if (!r.Read(&n_tensors)) return r.Truncated("gguf header: tensor count", 8);
  if (!r.Read(&n_kv)) return r.Truncated("gguf header: metadata key count", 8);
  // A tensor info takes at least 24 bytes (name length, n_dims, type, offset),
  // a key/value pair at least 13 (key length, type, one byte of value).
  FLATKV_RETURN_IF_ERROR(CheckCount("tensor count", n_tensors, kMaxTensors, 24, r));
  FLATKV_RETURN_IF_ERROR(CheckCount("metadata key count", n_kv, kMaxKeys, 13, r));

  f.kvs_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    GgufKv kv;
    kv.index = i;
    FLATKV_RETURN_IF_ERROR(r.ReadString("metadata key " + Num(i) + " name", &kv.key));
    std::string what = KeyName(kv);
    uint32_t type = 0;
    if (!r.Read(&type)) return r.Truncated(what + " value type", 4);
    if (!KnownType(type)) return Status::Corruption(what + ": unknown value type " + Num(type));
    FLATKV_RETURN_IF_ERROR(ParseValue(r, static_cast<GgufType>(type), 0, what, &kv.value));
    if (!f.key_index_.emplace(kv.key, f.kvs_.size()).second) {
      return Status::Corruption(what + ": duplicate key");
    }
    f.kvs_.push_back(kv);
  }

  if (const GgufKv* kv = f.FindKey("general.alignment")) {
    int64_t a = 0;
    if (!IsInteger(kv->value.type)) return TypeError(*kv, "uint32");
    if (!IntInRange(kv->value, 1, UINT32_MAX, &a) || !std::has_single_bit(static_cast<uint64_t>(a))) {
      return Status::Corruption(KeyName(*kv) + ": alignment " + IntText(kv->value) + " is not a power of two");
    }
    f.alignment_ = static_cast<uint64_t>(a);
  }

  f.tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.index = i;
    FLATKV_RETURN_IF_ERROR(r.ReadString("tensor " + Num(i) + " name", &t.name));
    std::string what = "tensor " + Num(i) + " '" + std::string(t.name) + "'";
    if (!r.Read(&t.n_dims)) return r.Truncated(what + " n_dims", 4);
    if (t.n_dims > 4) return Status::Corruption(what + ": n_dims " + Num(t.n_dims) + " exceeds 4");
    t.n_elements = 1;
    bool overflow = false;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      if (!r.Read(&t.ne[d])) return r.Truncated(what + " dimension " + Num(d), 8);
      overflow |=
          t.ne[d] > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(t.n_elements, t.ne[d], &t.n_elements);
    }
    if (!r.Read(&t.type)) return r.Truncated(what + " type", 4);
    if (!r.Read(&t.offset)) return r.Truncated(what + " offset", 8);
    if (overflow || t.n_elements > static_cast<uint64_t>(INT64_MAX)) {
      return Status::Corruption(what + ": shape " + t.Shape() + " overflows the element count");
    }
    if (t.type >= kNumGgmlTypes || kGgmlTypes[t.type].block == 0) {
      return Status::Corruption(what + ": unknown ggml type " + Num(t.type));
    }
    const GgmlTypeTraits& tt = kGgmlTypes[t.type];
    if (t.ne[0] % tt.block != 0) {
      return Status::Corruption(what + ": row length " + Num(t.ne[0]) + " is not a multiple of the " + tt.name +
                                " block size " + Num(tt.block));
    }
    // n_elements / block * bytes cannot overflow usefully: compared to the file size below.
    if (__builtin_mul_overflow(t.n_elements / tt.block, uint64_t{tt.bytes}, &t.n_bytes)) {
      return Status::Corruption(what + ": shape " + t.Shape() + " overflows the byte count");
    }
    if (t.offset % f.alignment_ != 0) {
      return Status::Corruption(what + ": data offset " + Num(t.offset) + " is not a multiple of the alignment " +
                                Num(f.alignment_));
    }
    if (!f.tensor_index_.emplace(t.name, f.tensors_.size()).second) {
      return Status::Corruption(what + ": duplicate tensor name");
    }
    f.tensors_.push_back(t);
  }

  uint64_t end = r.pos();
  f.data_offset_ = end + (f.alignment_ - end % f.alignment_) % f.alignment_;
  for (GgufTensorInfo& t : f.tensors_) {
    uint64_t room = f.data_offset_ <= bytes.size() ? bytes.size() - f.data_offset_ : 0;
    if (f.data_offset_ > bytes.size() || t.offset > room || t.n_bytes > room - t.offset) {
      return Status::Corruption("tensor '" + std::string(t.name) + "': data at offset " + Num(f.data_offset_) + " + " +
                                Num(t.offset) + " + " + Num(t.n_bytes) + " bytes runs past end of file (" +
                                Num(bytes.size()) + ")");
    }
    t.data = bytes.substr(f.data_offset_ + t.offset, t.n_bytes);
  }
  return f;
}

const GgufKv* GgufFile::FindKey(std::string_view key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &kvs_[it->second];
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Result<uint32_t> GgufFile::GetU32(std::string_view key) const {
  const GgufKv* kv = FindKey(key);
  if (kv == nullptr) return Status::NotFound("metadata key '" + std::string(key) + "' is missing");
  if (!IsInteger(kv->value.type)) return TypeError(*kv, "uint32");
  int64_t v = 0;
  if (!IntInRange(kv->value, 0, UINT32_MAX, &v)) {
    return Status::Corruption(KeyName(*kv) + ": value " + IntText(kv->value) + " is out of range for uint32");
  }
  return static_cast<uint32_t>(v);
}

Result<uint32_t> GgufFile::GetU32(std::string_view key, uint32_t fallback) const {
  if (FindKey(key) == nullptr) return fallback;
  return GetU32(key);
}

Result<float> GgufFile::GetF32(std::string_view key, float fallback) const {
  const GgufKv* kv = FindKey(key);
  if (kv == nullptr) return fallback;
  if (kv->value.type != GgufType::kFloat32 && kv->value.type != GgufType::kFloat64) return TypeError(*kv, "float32");
  return static_cast<float>(kv->value.f64);
}

Result<bool> GgufFile::GetBool(std::string_view key, bool fallback) const {
  const GgufKv* kv = FindKey(key);
  if (kv == nullptr) return fallback;
  if (kv->value.type != GgufType::kBool) return TypeError(*kv, "bool");
  return kv->value.u64 != 0;
}

Result<std::string_view> GgufFile::GetString(std::string_view key) const {
  const GgufKv* kv = FindKey(key);
  if (kv == nullptr) return Status::NotFound("metadata key '" + std::string(key) + "' is missing");
  if (kv->value.type != GgufType::kString) return TypeError(*kv, "string");
  return kv->value.str;
}

Result<std::vector<std::string_view>> GgufFile::GetStringArray(std::string_view key) const {
  const GgufKv* kv = FindKey(key);
  if (kv == nullptr) return Status::NotFound("metadata key '" + std::string(key) + "' is missing");
  if (kv->value.type != GgufType::kArray || kv->value.elem_type != GgufType::kString) {
    return TypeError(*kv, "array of string");
  }
  std::vector<std::string_view> out;
  out.reserve(kv->value.count);
  const char* p = kv->value.elems.data();
  for (uint64_t i = 0; i < kv->value.count; ++i) {  // validated by Parse
    uint64_t len;
    std::memcpy(&len, p, 8);
    out.emplace_back(p + 8, len);
    p += 8 + len;
  }
  return out;
}

Result<std::vector<float>> GgufFile::GetF32Array(std::string_view key) const {
  const GgufKv* kv = FindKey(key);
  if (kv == nullptr) return Status::NotFound("metadata key '" + std::string(key) + "' is missing");
  const GgufValue& v = kv->value;
  if (v.type != GgufType::kArray || (v.elem_type != GgufType::kFloat32 && v.elem_type != GgufType::kFloat64)) {
    return TypeError(*kv, "array of float32");
  }
  std::vector<float> out(v.count);
  GgufValue e;
  uint64_t n = ScalarSize(v.elem_type);
  for (uint64_t i = 0; i < v.count; ++i) {
    DecodeScalar(v.elem_type, v.elems.data() + i * n, &e);
    out[i] = static_cast<float>(e.f64);
  }
  return out;
}

Result<std::vector<int32_t>> GgufFile::GetI32Array(std::string_view key) const {
  const GgufKv* kv = FindKey(key);
  if (kv == nullptr) return Status::NotFound("metadata key '" + std::string(key) + "' is missing");
  const GgufValue& v = kv->value;
  if (v.type != GgufType::kArray || !IsInteger(v.elem_type)) return TypeError(*kv, "array of int32");
  std::vector<int32_t> out(v.count);
  GgufValue e;
  uint64_t n = ScalarSize(v.elem_type);
  for (uint64_t i = 0; i < v.count; ++i) {
    DecodeScalar(v.elem_type, v.elems.data() + i * n, &e);
    int64_t x = 0;
    if (!IntInRange(e, INT32_MIN, INT32_MAX, &x)) {
      return Status::Corruption(KeyName(*kv) + ": element " + Num(i) + " value " + IntText(e) +
                                " is out of range for int32");
    }
    out[i] = static_cast<int32_t>(x);
  }
  return out;
}

std::vector<GgufValue> DecodeArray(const GgufValue& array) {
  std::vector<GgufValue> out;
  if (array.type != GgufType::kArray) return out;
  out.reserve(array.count);
  Reader r(array.elems);  // validated by Parse: cannot fail
  for (uint64_t i = 0; i < array.count; ++i) {
    GgufValue v;
    if (!ParseValue(r, array.elem_type, 0, "element", &v).ok()) break;
    out.push_back(v);
  }
  return out;
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in binary32.
    bits = sign | std::bit_cast<uint32_t>(static_cast<float>(mant) * 0x1p-24f);
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);  // infinity or NaN (payload kept)
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  }
  return std::bit_cast<float>(bits);
}

Result<std::vector<float>> DequantizeTensor(const GgufTensorInfo& t) {
  std::vector<float> out;
  const char* p = t.data.data();
  switch (t.type) {
    case kGgmlF32:
      out.resize(t.n_elements);
      if (t.n_elements != 0) std::memcpy(out.data(), p, t.n_elements * 4);
      return out;
    case kGgmlF16:
      out.resize(t.n_elements);
      for (uint64_t i = 0; i < t.n_elements; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = HalfToFloat(h);
      }
      return out;
    case kGgmlQ8_0:
      out.resize(t.n_elements);
      for (uint64_t b = 0; b < t.n_elements / 32; ++b) {
        const char* blk = p + 34 * b;
        uint16_t h;
        std::memcpy(&h, blk, 2);
        float d = HalfToFloat(h);
        for (int j = 0; j < 32; ++j) out[32 * b + j] = d * static_cast<float>(static_cast<int8_t>(blk[2 + j]));
      }
      return out;
    case kGgmlQ4_1:
      // Blocks of 32: fp16 scale d, fp16 minimum m, then 16 bytes whose low nibbles are elements
      // 0..15 and high nibbles 16..31; value = d * q + m, each operation rounded (ggml's
      // dequantize_row_q4_1; the gguf package's numpy dequantize gives the same bits).
      out.resize(t.n_elements);
      for (uint64_t b = 0; b < t.n_elements / 32; ++b) {
        const char* blk = p + 20 * b;
        uint16_t hd, hm;
        std::memcpy(&hd, blk, 2);
        std::memcpy(&hm, blk + 2, 2);
        const float d = HalfToFloat(hd), m = HalfToFloat(hm);
        for (int j = 0; j < 16; ++j) {
          const auto q = static_cast<uint8_t>(blk[4 + j]);
          out[32 * b + j] = d * static_cast<float>(q & 0x0f) + m;
          out[32 * b + j + 16] = d * static_cast<float>(q >> 4) + m;
        }
      }
      return out;
    default:
      return Status::NotSupported("tensor '" + std::string(t.name) + "': ggml type " + GgmlTypeName(t.type) +
                                  " is not supported (only f32, f16, q4_1 and q8_0)");
  }
}

}  // namespace flatkv::model
