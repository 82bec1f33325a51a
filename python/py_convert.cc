// The `flatkv` module's errors and argument conversion (flatkv_py.h).
#include <cstdint>
#include <string>
#include <vector>

#include "flatkv_py.h"

namespace flatkv::python {
namespace {

PyObject* error_type = nullptr;  // flatkv.Error

}  // namespace

void AddErrorType(py::module_& m) {
  // flatkv.Error(message) with .code; a new reference kept for the life of
  // the process (the module is never unloaded).
  error_type = PyErr_NewExceptionWithDoc("flatkv.Error", "A flatkv C API error; .code names its status code.",
                                         PyExc_Exception, nullptr);
  if (error_type == nullptr) throw py::error_already_set();
  m.attr("Error") = py::reinterpret_borrow<py::object>(error_type);
}

void Check(flatkv_status* st) {
  if (st == nullptr) return;
  const std::string message = flatkv_status_message(st);
  const std::string code = flatkv_code_name(flatkv_status_code(st));
  flatkv_status_destroy(st);
  py::object type = py::reinterpret_borrow<py::object>(error_type);
  py::object error = type(message);
  error.attr("code") = code;
  PyErr_SetObject(error_type, error.ptr());
  throw py::error_already_set();
}

std::vector<flatkv_key> ToKeys(const py::object& obj) {
  auto a = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(obj);
  if (!a) throw py::type_error("keys must be an array of uint64 (lo, hi) pairs, shape (n, 2)");
  if (!((a.ndim() == 2 && a.shape(1) == 2) || (a.ndim() == 1 && a.size() % 2 == 0)))
    throw py::value_error("keys must have shape (n, 2), got " + std::string(py::str(py::object(a.attr("shape")))));
  std::vector<flatkv_key> keys(static_cast<size_t>(a.size() / 2));
  const uint64_t* p = a.data();
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = flatkv_key{p[2 * i], p[2 * i + 1]};
  return keys;
}

py::array_t<uint64_t> FromKeys(const std::vector<flatkv_key>& keys) {
  py::array_t<uint64_t> out({static_cast<py::ssize_t>(keys.size()), py::ssize_t{2}});
  uint64_t* p = out.mutable_data();
  for (size_t i = 0; i < keys.size(); ++i) p[2 * i] = keys[i].lo, p[2 * i + 1] = keys[i].hi;
  return out;
}

std::vector<flatkv_token_range> ToRanges(const py::object& obj) {
  auto a = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(obj);
  if (!a || (!(a.ndim() == 2 && a.shape(1) == 2) && !(a.ndim() == 1 && a.size() == 0)))
    throw py::value_error("ranges must be a sequence of (begin, end) token positions, shape (n, 2)");
  std::vector<flatkv_token_range> out(static_cast<size_t>(a.size() / 2));
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t b = a.data()[2 * i], e = a.data()[2 * i + 1];
    if (b < 0 || e < 0 || b > int64_t{UINT32_MAX} || e > int64_t{UINT32_MAX})
      throw py::value_error("range " + std::to_string(i) + " (" + std::to_string(b) + ", " + std::to_string(e) +
                            ") is outside 0..2^32-1");
    out[i] = flatkv_token_range{static_cast<uint32_t>(b), static_cast<uint32_t>(e)};
  }
  return out;
}

std::vector<uint32_t> ToTokens(const py::object& obj) {
  auto t = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(obj);
  if (!t || t.ndim() != 1) throw py::type_error("tokens must be a 1-D sequence of token ids");
  std::vector<uint32_t> tokens(static_cast<size_t>(t.size()));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t v = t.data()[i];
    if (v < 0 || v > int64_t{UINT32_MAX})
      throw py::value_error("token " + std::to_string(i) + " is " + std::to_string(v) + ", outside 0..2^32-1");
    tokens[i] = static_cast<uint32_t>(v);
  }
  return tokens;
}

flatkv_layout ToLayout(const std::string& layout) {
  if (layout == "block") return FLATKV_LAYOUT_BLOCK_MAJOR;
  if (layout == "layer") return FLATKV_LAYOUT_LAYER_MAJOR;
  throw py::value_error("layout must be \"block\" or \"layer\", got \"" + layout + "\"");
}

std::string DTypeName(flatkv_dtype dtype) {
  switch (dtype) {
    case FLATKV_DTYPE_F16: return "f16";
    case FLATKV_DTYPE_BF16: return "bf16";
    case FLATKV_DTYPE_F32: return "f32";
    case FLATKV_DTYPE_FP8_E4M3: return "fp8_e4m3";
    case FLATKV_DTYPE_FP8_E5M2: return "fp8_e5m2";
  }
  return "unknown";
}

flatkv_dtype ToDType(const std::string& dtype) {
  if (dtype == "f16" || dtype == "float16") return FLATKV_DTYPE_F16;
  if (dtype == "bf16" || dtype == "bfloat16") return FLATKV_DTYPE_BF16;
  if (dtype == "f32" || dtype == "float32") return FLATKV_DTYPE_F32;
  if (dtype == "fp8_e4m3") return FLATKV_DTYPE_FP8_E4M3;
  if (dtype == "fp8_e5m2") return FLATKV_DTYPE_FP8_E5M2;
  throw py::value_error("dtype must be \"f16\", \"bf16\", \"f32\", \"fp8_e4m3\" or \"fp8_e5m2\", got \"" + dtype +
                        "\"");
}

// Keyword values, checked with messages that name the keyword and the value.
std::string Repr(const py::handle& v) { return std::string(py::repr(v)); }
std::string TypeName(const py::handle& v) { return std::string(py::str(py::type::of(v).attr("__name__"))); }

uint64_t ToUInt(const py::handle& v, const char* name, uint64_t max) {
  if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v))
    throw py::type_error(std::string(name) + " must be an int, got " + TypeName(v) + " " + Repr(v));
  if (py::int_(0).attr("__gt__")(v).cast<bool>())
    throw py::value_error(std::string(name) + " must be >= 0, got " + Repr(v));
  if (py::int_(max).attr("__lt__")(v).cast<bool>())
    throw py::value_error(std::string(name) + " must be at most " + std::to_string(max) + ", got " + Repr(v));
  return v.cast<uint64_t>();
}
uint64_t ToU64(const py::handle& v, const char* name) { return ToUInt(v, name, UINT64_MAX); }
uint32_t ToU32(const py::handle& v, const char* name) { return static_cast<uint32_t>(ToUInt(v, name, UINT32_MAX)); }

int32_t ToFlag(const py::handle& v, const char* name) {
  if (!py::isinstance<py::bool_>(v))
    throw py::type_error(std::string(name) + " must be True or False, got " + TypeName(v) + " " + Repr(v));
  return v.cast<bool>() ? 1 : 0;
}

}  // namespace flatkv::python
