// Internals of the `flatkv` Python module (flatkv_module.cc), shared by its
// parts: argument conversion and errors (py_convert.cc), flatkv.Store()'s
// options (py_options.cc), key namespaces and RoPE (py_keys.cc), and the
// store and its restores (py_store.cc). Everything goes through the C API
// (include/flatkv/flatkv.h), never the C++ internals.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "flatkv/flatkv.h"

namespace flatkv::python {

namespace py = pybind11;

// Errors and arguments (py_convert.cc).

// Creates flatkv.Error and adds it to `m` as "Error"; before any Check.
void AddErrorType(py::module_& m);

// Raises flatkv.Error for a non-NULL status (and frees it). Needs the GIL.
void Check(flatkv_status* st);

// A buffer export held for as long as this object lives.
class Buffer {
 public:
  Buffer(const py::object& obj, bool writable, const char* what) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) {
      PyErr_Clear();
      throw py::type_error(std::string(what) + " must be a C-contiguous" + (writable ? " writable" : "") +
                           " buffer (bytes, bytearray, numpy array), got " +
                           std::string(py::str(py::type::of(obj).attr("__name__"))));
    }
  }
  ~Buffer() { PyBuffer_Release(&view_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return view_.buf; }
  uint64_t bytes() const { return static_cast<uint64_t>(view_.len); }

 private:
  Py_buffer view_{};
};

// Keys from a (n, 2) or (2n,) array of uint64 (lo, hi) pairs.
std::vector<flatkv_key> ToKeys(const py::object& obj);
py::array_t<uint64_t> FromKeys(const std::vector<flatkv_key>& keys);
// A sequence of (begin, end) pairs as token ranges (ValueError otherwise).
std::vector<flatkv_token_range> ToRanges(const py::object& obj);
// Token ids from a 1-D sequence or array, each checked to fit a uint32.
std::vector<uint32_t> ToTokens(const py::object& obj);

flatkv_layout ToLayout(const std::string& layout);
flatkv_dtype ToDType(const std::string& dtype);
// The name ToDType reads ("f16", "bf16", "f32", "fp8_e4m3", "fp8_e5m2"); "unknown" otherwise.
std::string DTypeName(flatkv_dtype dtype);

// Keyword values, checked with messages that name the keyword and the value.
std::string Repr(const py::handle& v);
std::string TypeName(const py::handle& v);
uint64_t ToUInt(const py::handle& v, const char* name, uint64_t max);
uint64_t ToU64(const py::handle& v, const char* name);
uint32_t ToU32(const py::handle& v, const char* name);
int32_t ToFlag(const py::handle& v, const char* name);

// A string naming one of `table`'s values.
template <size_t N>
int32_t ToEnum(const py::handle& v, const char* name, const std::pair<const char*, int32_t> (&table)[N]) {
  std::string known;
  for (const auto& [n, c] : table) known += (known.empty() ? "\"" : ", \"") + std::string(n) + "\"";
  if (!py::isinstance<py::str>(v))
    throw py::type_error(std::string(name) + " must be one of " + known + ", got " + TypeName(v) + " " + Repr(v));
  const std::string s = v.cast<std::string>();
  for (const auto& [n, c] : table)
    if (s == n) return c;
  throw py::value_error(std::string(name) + " must be one of " + known + ", got " + Repr(v));
}

// Put hints, one row per flag (none: the store decides).
inline constexpr std::pair<const char*, int32_t> kPutHints[] = {
    {"auto", 0},
    {"one-shot", FLATKV_PUT_ONE_SHOT},
    {"hot", FLATKV_PUT_HOT},
};

// flatkv.Store()'s options (py_options.cc).

struct OptionsDeleter {
  void operator()(flatkv_options* o) const { flatkv_options_destroy(o); }
};
using OptionsPtr = std::unique_ptr<flatkv_options, OptionsDeleter>;
OptionsPtr NewOptions();
// The options of flatkv.Store(shape, **options): `shape` a preset name or a
// dict, the keywords one C setter each (StoreDoc lists them).
OptionsPtr OpenOptions(const py::object& shape, const py::kwargs& options);
// The options of flatkv.Store.connect: a `flatkv serve` daemon's address.
OptionsPtr ConnectOptions(const std::string& address, const std::string& token, uint64_t shm_bytes,
                          uint32_t deadline_ms, uint32_t connect_timeout_ms);
// Store()'s docstring, from the keyword table.
std::string StoreDoc();

// Key namespaces, chunk keys and RoPE (py_keys.cc).

// RoPE styles by name, one row per C constant.
inline constexpr std::pair<const char*, int32_t> kRopeStyles[] = {
    {"interleaved", FLATKV_ROPE_INTERLEAVED},
    {"neox", FLATKV_ROPE_NEOX},
};

// flatkv.Rope: how the model rotates keys (flatkv_rope).
struct Rope {
  double theta = 10000.0;
  uint32_t rotary_dim = 0;
  std::string style = "interleaved";
};

// flatkv.Namespace: the keys of token chains (flatkv_namespace).
class Namespace {
 public:
  Namespace(const std::string& model_fingerprint, const std::string& adapter, const std::string& tenant,
            const std::string& hash, uint64_t seed);
  ~Namespace() { flatkv_namespace_destroy(ns_); }
  Namespace(const Namespace&) = delete;
  Namespace& operator=(const Namespace&) = delete;

  py::array_t<uint64_t> Digest() const { return FromKeys({flatkv_namespace_digest(ns_)}); }

  const flatkv_namespace* get() const { return ns_; }

  py::array_t<uint64_t> Keys(const py::object& tokens_obj, uint32_t block_tokens, const py::object& parent) const;
  py::array_t<uint64_t> ChunkKeys(const py::object& tokens_obj, uint32_t block_tokens) const;
  py::array_t<uint64_t> EngineKeys(const py::object& hashes) const;

 private:
  flatkv_namespace* ns_ = nullptr;
};

// Adds Namespace, chunk_session and Rope to `m`.
void BindKeys(py::module_& m);

// The store and its restores (py_store.cc).

// Adds Restore and Store to `m`; after BindKeys (Store's chunk calls take a Namespace and a Rope).
void BindStore(py::module_& m);

}  // namespace flatkv::python
