// The `flatkv` Python module: a thin pybind11 layer over the C API
// (include/flatkv/flatkv.h), never the C++ internals.
//
// Bytes move through the buffer protocol: put() reads any C-contiguous
// buffer (bytes, numpy arrays), restore() writes into a caller's writable
// C-contiguous buffer in place. Every call that may wait on I/O releases the
// GIL. C errors become flatkv.Error with the C status message and a `code`
// attribute ("InvalidArgument", "NotFound", ...).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flatkv/flatkv.h"

namespace py = pybind11;

namespace {

PyObject* error_type = nullptr;  // flatkv.Error

// Raises flatkv.Error for a non-NULL status (and frees it). Needs the GIL.
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

flatkv_layout ToLayout(const std::string& layout) {
  if (layout == "block") return FLATKV_LAYOUT_BLOCK_MAJOR;
  if (layout == "layer") return FLATKV_LAYOUT_LAYER_MAJOR;
  throw py::value_error("layout must be \"block\" or \"layer\", got \"" + layout + "\"");
}

flatkv_dtype ToDType(const std::string& dtype) {
  if (dtype == "f16" || dtype == "float16") return FLATKV_DTYPE_F16;
  if (dtype == "bf16" || dtype == "bfloat16") return FLATKV_DTYPE_BF16;
  if (dtype == "f32" || dtype == "float32") return FLATKV_DTYPE_F32;
  throw py::value_error("dtype must be \"f16\", \"bf16\" or \"f32\", got \"" + dtype + "\"");
}

struct OptionsDeleter {
  void operator()(flatkv_options* o) const { flatkv_options_destroy(o); }
};
using OptionsPtr = std::unique_ptr<flatkv_options, OptionsDeleter>;

OptionsPtr NewOptions() {
  OptionsPtr o(flatkv_options_create());
  if (!o) throw std::bad_alloc();
  return o;
}

class Namespace {
 public:
  Namespace(const std::string& model_fingerprint, const std::string& adapter, const std::string& tenant,
            const std::string& hash, uint64_t seed) {
    flatkv_hash_kind kind;
    if (hash == "xxh3")
      kind = FLATKV_HASH_XXH3;
    else if (hash == "sha256")
      kind = FLATKV_HASH_SHA256;
    else
      throw py::value_error("hash must be \"xxh3\" or \"sha256\", got \"" + hash + "\"");
    Check(flatkv_namespace_create(kind, seed, model_fingerprint.c_str(), adapter.c_str(), tenant.c_str(), &ns_));
  }
  ~Namespace() { flatkv_namespace_destroy(ns_); }
  Namespace(const Namespace&) = delete;
  Namespace& operator=(const Namespace&) = delete;

  py::array_t<uint64_t> Digest() const { return FromKeys({flatkv_namespace_digest(ns_)}); }

  py::array_t<uint64_t> Keys(const py::object& tokens_obj, uint32_t block_tokens, const py::object& parent) const {
    auto t = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(tokens_obj);
    if (!t || t.ndim() != 1) throw py::type_error("tokens must be a 1-D sequence of token ids");
    std::vector<uint32_t> tokens(static_cast<size_t>(t.size()));
    for (size_t i = 0; i < tokens.size(); ++i) {
      const int64_t v = t.data()[i];
      if (v < 0 || v > int64_t{UINT32_MAX})
        throw py::value_error("token " + std::to_string(i) + " is " + std::to_string(v) + ", outside 0..2^32-1");
      tokens[i] = static_cast<uint32_t>(v);
    }
    std::optional<flatkv_key> p;
    if (!parent.is_none()) {
      auto k = ToKeys(parent);
      if (k.size() != 1) throw py::value_error("parent must be one key, shape (1, 2) or (2,)");
      p = k[0];
    }
    std::vector<flatkv_key> keys(block_tokens ? tokens.size() / block_tokens : 0);
    uint64_t n = 0;
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_namespace_keys(ns_, p ? &*p : nullptr, tokens.data(), tokens.size(), block_tokens, keys.data(),
                                 keys.size(), &n);
    }
    Check(st);
    keys.resize(n);
    return FromKeys(keys);
  }

 private:
  flatkv_namespace* ns_ = nullptr;
};

class Restore {
 public:
  Restore(flatkv_restore* r, uint32_t layers, uint64_t layer_bytes, std::unique_ptr<Buffer> out)
      : r_(r), layers_(layers), layer_bytes_(layer_bytes), out_(std::move(out)) {}
  ~Restore() { Close(); }

  uint32_t hit_blocks() const {
    Live();
    py::gil_scoped_release release;  // a daemon restore waits for its first layer
    return flatkv_restore_hit_blocks(r_);
  }

  uint32_t WaitLayer(uint32_t layer) {
    Live();
    const void* data = nullptr;
    uint32_t blocks = 0;
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_restore_wait_layer(r_, layer, &data, &blocks);
    }
    Check(st);
    if (data != nullptr) views_[layer] = {static_cast<const char*>(data), blocks};
    return blocks;
  }

  py::bytes LayerData(uint32_t layer) {
    Live();
    if (out_) throw py::value_error("this restore writes into its `out` buffer; read the layer there");
    auto it = views_.find(layer);
    if (it == views_.end())
      throw py::value_error("layer " + std::to_string(layer) + " is not waited for, or already released");
    return py::bytes(it->second.first, it->second.second * layer_bytes_);
  }

  void ReleaseLayer(uint32_t layer) {
    Live();
    views_.erase(layer);
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_restore_release_layer(r_, layer);
    }
    Check(st);
  }

  uint32_t Finish() {
    Live();
    views_.clear();
    uint32_t n = 0;
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_restore_finish(r_, &n);
    }
    Check(st);
    return n;
  }

  void Close() {
    if (r_ == nullptr) return;
    views_.clear();
    {
      py::gil_scoped_release release;
      flatkv_restore_destroy(r_);
    }
    r_ = nullptr;
    out_.reset();
  }

 private:
  void Live() const {
    if (r_ == nullptr) throw py::value_error("restore is closed");
  }
  flatkv_restore* r_;
  uint32_t layers_;
  uint64_t layer_bytes_;
  std::unique_ptr<Buffer> out_;  // the caller's destination, exported until the restore ends
  std::map<uint32_t, std::pair<const char*, uint64_t>> views_;  // waited layers in the window
};

class Store {
 public:
  explicit Store(flatkv_options* o) {
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_open(o, &s_);
    }
    Check(st);
  }
  ~Store() {
    py::gil_scoped_release release;
    flatkv_store_destroy(s_);
  }
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  static std::unique_ptr<Store> Open(const py::object& shape, uint32_t block_tokens, uint64_t dram_bytes,
                                     const std::optional<std::string>& ssd_dir, uint64_t ssd_bytes,
                                     std::optional<uint64_t> segment_bytes, std::optional<uint64_t> extent_layer_bytes,
                                     bool direct_io) {
    OptionsPtr o = NewOptions();
    if (py::isinstance<py::str>(shape)) {
      Check(flatkv_options_set_shape_preset(o.get(), shape.cast<std::string>().c_str()));
    } else if (py::isinstance<py::dict>(shape)) {
      auto d = shape.cast<py::dict>();
      auto get = [&](const char* k) -> uint32_t {
        if (!d.contains(k)) throw py::value_error(std::string("shape is missing \"") + k + "\"");
        return d[k].cast<uint32_t>();
      };
      const std::string kind = d.contains("kind") ? d["kind"].cast<std::string>() : "mha";
      const flatkv_dtype dtype = ToDType(d.contains("dtype") ? d["dtype"].cast<std::string>() : "bf16");
      if (kind == "mha")
        Check(flatkv_options_set_shape_mha(o.get(), get("layers"), get("kv_heads"), get("head_dim"), dtype));
      else if (kind == "mla")
        Check(flatkv_options_set_shape_mla(o.get(), get("layers"), get("latent_dim"), get("rope_dim"), dtype));
      else
        throw py::value_error("shape kind must be \"mha\" or \"mla\", got \"" + kind + "\"");
    } else {
      throw py::type_error("shape must be a preset name or a dict");
    }
    Check(flatkv_options_set_block_tokens(o.get(), block_tokens));
    Check(flatkv_options_set_dram_capacity(o.get(), dram_bytes));
    if (ssd_dir) Check(flatkv_options_add_ssd_dir(o.get(), ssd_dir->c_str(), ssd_bytes));
    if (segment_bytes) Check(flatkv_options_set_segment_bytes(o.get(), *segment_bytes));
    if (extent_layer_bytes)
      Check(flatkv_options_set_extent_layer_bytes(o.get(), *extent_layer_bytes, *extent_layer_bytes));
    Check(flatkv_options_set_direct_io(o.get(), direct_io ? 1 : 0));
    return std::make_unique<Store>(o.get());
  }

  static std::unique_ptr<Store> Connect(const std::string& address, const std::string& token, uint64_t shm_bytes) {
    OptionsPtr o = NewOptions();
    Check(flatkv_options_set_server(o.get(), address.c_str(), token.c_str()));
    Check(flatkv_options_set_shm_window(o.get(), shm_bytes));
    return std::make_unique<Store>(o.get());
  }

  uint32_t layers() const { return flatkv_store_layers(s_); }
  uint32_t block_tokens() const { return flatkv_store_block_tokens(s_); }
  uint64_t block_layer_bytes() const { return flatkv_store_block_layer_bytes(s_); }
  uint64_t block_bytes() const { return flatkv_store_block_bytes(s_); }

  uint32_t Match(const py::object& keys_obj) {
    auto keys = ToKeys(keys_obj);
    uint32_t hit = 0;
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_match(s_, keys.data(), keys.size(), &hit);
    }
    Check(st);
    return hit;
  }

  void Put(uint64_t session, const py::object& keys_obj, const py::object& data, bool one_shot) {
    auto keys = ToKeys(keys_obj);
    Buffer buf(data, false, "data");
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_put(s_, session, keys.data(), keys.size(), buf.data(), buf.bytes(),
                            one_shot ? FLATKV_PUT_ONE_SHOT : 0);
    }
    Check(st);
  }

  uint32_t RestoreInto(const py::object& keys_obj, const py::object& out, const std::string& layout) {
    auto keys = ToKeys(keys_obj);
    const flatkv_layout l = ToLayout(layout);
    Buffer buf(out, true, "out");
    uint32_t n = 0;
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_restore(s_, keys.data(), keys.size(), buf.data(), buf.bytes(), l, &n);
    }
    Check(st);
    return n;
  }

  std::unique_ptr<Restore> RestoreStart(const py::object& keys_obj, const py::object& out,
                                        const std::string& layout) {
    auto keys = ToKeys(keys_obj);
    const flatkv_layout l = ToLayout(layout);
    std::unique_ptr<Buffer> buf;
    if (!out.is_none()) buf = std::make_unique<Buffer>(out, true, "out");
    flatkv_restore* r = nullptr;
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_restore_start(s_, keys.data(), keys.size(), buf ? buf->data() : nullptr,
                                      buf ? buf->bytes() : 0, l, &r);
    }
    Check(st);
    return std::make_unique<Restore>(r, layers(), block_layer_bytes(), std::move(buf));
  }

  void DropSession(uint64_t session) {
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_drop_session(s_, session);
    }
    Check(st);
  }

  py::object Stats() {
    std::string json;
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      uint64_t needed = 0;
      st = flatkv_store_stats_json(s_, nullptr, 0, &needed);
      if (st == nullptr) {
        json.resize(needed);
        st = flatkv_store_stats_json(s_, json.data(), needed, &needed);
        json.resize(needed ? needed - 1 : 0);
      }
    }
    Check(st);
    return py::module_::import("json").attr("loads")(json);
  }

  void Close() {
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_close(s_);
    }
    Check(st);
  }

 private:
  flatkv_store* s_ = nullptr;
};

}  // namespace

PYBIND11_MODULE(flatkv, m) {
  m.doc() = "flatkv: a KV-cache store for LLM serving (DRAM + SSD, embedded or a daemon client)";
  // flatkv.Error(message) with .code; a new reference kept for the life of
  // the process (the module is never unloaded).
  error_type = PyErr_NewExceptionWithDoc("flatkv.Error", "A flatkv C API error; .code names its status code.",
                                         PyExc_Exception, nullptr);
  if (error_type == nullptr) throw py::error_already_set();
  m.attr("Error") = py::reinterpret_borrow<py::object>(error_type);
  m.attr("DEFAULT_HASH_SEED") = py::int_(FLATKV_DEFAULT_HASH_SEED);

  py::class_<Namespace>(m, "Namespace", "Key namespace: hash kind, seed, model fingerprint, adapter, tenant.")
      .def(py::init<const std::string&, const std::string&, const std::string&, const std::string&, uint64_t>(),
           py::arg("model_fingerprint") = "", py::arg("adapter") = "", py::arg("tenant") = "",
           py::arg("hash") = "xxh3", py::arg("seed") = FLATKV_DEFAULT_HASH_SEED)
      .def_property_readonly("digest", &Namespace::Digest, "The parent key of every chain, shape (1, 2).")
      .def("keys", &Namespace::Keys, py::arg("tokens"), py::arg("block_tokens"), py::arg("parent") = py::none(),
           "Keys (uint64 array, shape (n, 2)) of the full blocks of `tokens`, chained from `parent` "
           "(default: the namespace digest).");

  py::class_<Restore>(m, "Restore", "A restore in flight, consumed layer by layer.")
      .def_property_readonly("hit_blocks", &Restore::hit_blocks)
      .def("wait_layer", &Restore::WaitLayer, py::arg("layer"), "Waits for a layer; returns its valid blocks.")
      .def("layer_data", &Restore::LayerData, py::arg("layer"),
           "A copy of a waited layer's slices (restores without `out` only).")
      .def("release_layer", &Restore::ReleaseLayer, py::arg("layer"))
      .def("finish", &Restore::Finish, "Waits for every layer; returns the blocks valid in all of them.")
      .def("close", &Restore::Close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Restore& r, py::args) { r.Close(); });

  py::class_<Store>(m, "Store", "An embedded store or a daemon client.")
      .def(py::init(&Store::Open), py::arg("shape"), py::arg("block_tokens") = 64,
           py::arg("dram_bytes") = uint64_t{256} << 20, py::arg("ssd_dir") = py::none(),
           py::arg("ssd_bytes") = uint64_t{4} << 30, py::arg("segment_bytes") = py::none(),
           py::arg("extent_layer_bytes") = py::none(), py::arg("direct_io") = true,
           "Opens an embedded store. `shape` is a preset name or a dict (kind, layers, kv_heads/head_dim or "
           "latent_dim/rope_dim, dtype).")
      .def_static("connect", &Store::Connect, py::arg("address"), py::arg("token") = "",
                  py::arg("shm_window_bytes") = 0, "Connects to a `flatkv serve` daemon (unix:/path, tcp:host:port).")
      .def_property_readonly("layers", &Store::layers)
      .def_property_readonly("block_tokens", &Store::block_tokens)
      .def_property_readonly("block_layer_bytes", &Store::block_layer_bytes)
      .def_property_readonly("block_bytes", &Store::block_bytes)
      .def("match", &Store::Match, py::arg("keys"))
      .def("put", &Store::Put, py::arg("session"), py::arg("keys"), py::arg("data"), py::arg("one_shot") = false)
      .def("restore", &Store::RestoreInto, py::arg("keys"), py::arg("out"), py::arg("layout") = "block",
           "Restores the stored prefix of `keys` into the writable buffer `out`; returns the blocks restored.")
      .def("restore_start", &Store::RestoreStart, py::arg("keys"), py::arg("out") = py::none(),
           py::arg("layout") = "block")
      .def("drop_session", &Store::DropSession, py::arg("session"))
      .def("stats", &Store::Stats)
      .def("close", &Store::Close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Store& s, py::args) { s.Close(); });
}
