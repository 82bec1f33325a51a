// The `flatkv` Python module: a thin pybind11 layer over the C API
// (include/flatkv/flatkv.h), never the C++ internals.
//
// Bytes move through the buffer protocol: put() reads any C-contiguous
// buffer (bytes, numpy arrays), restore() writes into a caller's writable
// C-contiguous buffer in place. Every call that may wait on I/O releases the
// GIL. C errors become flatkv.Error with the C status message and a `code`
// attribute ("InvalidArgument", "NotFound", ...).
#include <cmath>
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

// Enumerated keywords as strings, one row per C constant (the daemon's
// config file spells them the same way).
constexpr std::pair<const char*, int32_t> kSsdAdmissions[] = {
    {"all", FLATKV_SSD_ADMISSION_ALL},
    {"on-reuse", FLATKV_SSD_ADMISSION_ON_REUSE},
};
constexpr std::pair<const char*, int32_t> kIoEngines[] = {
    {"auto", FLATKV_IO_AUTO},
    {"uring", FLATKV_IO_URING},
    {"threadpool", FLATKV_IO_THREAD_POOL},
};
// Put hints, one row per flag (none: the store decides).
constexpr std::pair<const char*, int32_t> kPutHints[] = {
    {"auto", 0},
    {"one-shot", FLATKV_PUT_ONE_SHOT},
    {"hot", FLATKV_PUT_HOT},
};

// One row per keyword of flatkv.Store(...) that is one C setter; absent
// keywords keep the C API's (StoreOptions') defaults. The SSD directories
// (ssd_dir, ssd_dirs, ssd_bytes) are handled apart: one call per directory.
struct Keyword {
  const char* name;
  const char* help;
  flatkv_status* (*set)(flatkv_options*, const py::handle& value, const char* name);
};

// Keyword::set for a C setter of one uint64_t, uint32_t or int32_t switch.
template <flatkv_status* (*Set)(flatkv_options*, uint64_t)>
flatkv_status* U64(flatkv_options* o, const py::handle& v, const char* n) { return Set(o, ToU64(v, n)); }
template <flatkv_status* (*Set)(flatkv_options*, uint32_t)>
flatkv_status* U32(flatkv_options* o, const py::handle& v, const char* n) { return Set(o, ToU32(v, n)); }
template <flatkv_status* (*Set)(flatkv_options*, int32_t)>
flatkv_status* Flag(flatkv_options* o, const py::handle& v, const char* n) { return Set(o, ToFlag(v, n)); }

const Keyword kKeywords[] = {
    {"block_tokens", "tokens per block, 16..512 (default 64)", U32<flatkv_options_set_block_tokens>},
    {"dram_bytes", "DRAM tier capacity, bytes; 0 disables it (default 256 MiB)",
     U64<flatkv_options_set_dram_capacity>},
    {"segment_bytes", "bytes of one preallocated segment file", U64<flatkv_options_set_segment_bytes>},
    {"extent_layer_bytes", "target bytes of one layer's run in an extent, both media",
     [](flatkv_options* o, const py::handle& v, const char* n) {
       const uint64_t b = ToU64(v, n);
       return flatkv_options_set_extent_layer_bytes(o, b, b);
     }},
    {"dram_extent_layer_bytes", "the same, DRAM extents only",
     U64<flatkv_options_set_dram_extent_layer_bytes>},
    {"ssd_extent_layer_bytes", "the same, SSD extents only", U64<flatkv_options_set_ssd_extent_layer_bytes>},
    {"sized_extents", "new extents sized to their session (default True); False: every extent the largest",
     Flag<flatkv_options_set_sized_extents>},
    {"session_dram_share_bytes", "most DRAM copies one session holds, bytes; 0 derives it (default)",
     U64<flatkv_options_set_session_dram_share>},
    {"dram_idle_after_ms", "DRAM-only stores: a session idle this long (ms) is reclaimed first",
     U64<flatkv_options_set_dram_idle_after_ms>},
    {"ssd_admission", "which blocks are written to SSD: \"all\" (default) or \"on-reuse\"",
     [](flatkv_options* o, const py::handle& v, const char* n) {
       return flatkv_options_set_ssd_admission(o, ToEnum(v, n, kSsdAdmissions));
     }},
    {"readmit_on_restore", "an SSD restore re-admits the session's DRAM copy (default True)",
     Flag<flatkv_options_set_readmit_on_restore>},
    {"ssd_write_buffer_bytes", "put bytes whose SSD write may be outstanding; 0 derives it (default)",
     U64<flatkv_options_set_ssd_write_buffer>},
    {"manifest_checkpoint_bytes", "manifest log size that starts an online checkpoint; 0: at close only",
     U64<flatkv_options_set_manifest_checkpoint>},
    {"window_layers", "layers a restore's window holds at least", U32<flatkv_options_set_window_layers>},
    {"window_bytes", "bytes a restore's window holds at least", U64<flatkv_options_set_window_bytes>},
    {"max_request_bytes", "largest single SSD read, bytes", U64<flatkv_options_set_max_request_bytes>},
    {"ssd_io", "SSD I/O engine: \"auto\" (default), \"uring\" or \"threadpool\"",
     [](flatkv_options* o, const py::handle& v, const char* n) {
       return flatkv_options_set_ssd_io(o, ToEnum(v, n, kIoEngines));
     }},
    {"ssd_queue_depth", "io_uring ring entries", U32<flatkv_options_set_ssd_queue_depth>},
    {"ssd_threads", "thread-pool I/O engine workers", U32<flatkv_options_set_ssd_threads>},
    {"dram_threads", "workers copying DRAM hits", U32<flatkv_options_set_dram_threads>},
    {"decode_threads", "workers decoding coded blocks", U32<flatkv_options_set_decode_threads>},
    {"direct_io", "O_DIRECT on segment files (default True)", Flag<flatkv_options_set_direct_io>},
    {"sync_writes", "fdatasync after every put (default False)", Flag<flatkv_options_set_sync_writes>},
    {"verify_dram_reads", "verify checksums of DRAM hits too (default False)",
     Flag<flatkv_options_set_verify_dram_reads>},
    // The remote tier (docs/remote.md).
    {"remote_seeds", "Redis Cluster nodes, a list of \"host:port\": puts are published there, local misses restored "
                     "from there (default: no remote tier)",
     [](flatkv_options* o, const py::handle& v, const char* n) -> flatkv_status* {
       if (!py::isinstance<py::sequence>(v) || py::isinstance<py::str>(v))
         throw py::type_error(std::string(n) + " must be a list of \"host:port\", got " + TypeName(v) + " " + Repr(v));
       for (const auto& seed : v.cast<py::sequence>()) {
         if (!py::isinstance<py::str>(seed))
           throw py::type_error(std::string(n) + " must hold strings, got " + TypeName(seed) + " " + Repr(seed));
         if (flatkv_status* st = flatkv_options_add_remote_seed(o, seed.cast<std::string>().c_str())) return st;
       }
       return nullptr;
     }},
    {"remote_auth", "(user, password) for the cluster's AUTH (an ACL user per node)",
     [](flatkv_options* o, const py::handle& v, const char* n) -> flatkv_status* {
       if (!py::isinstance<py::tuple>(v) || py::len(v) != 2)
         throw py::type_error(std::string(n) + " must be a (user, password) tuple, got " + TypeName(v) + " " + Repr(v));
       auto t = v.cast<py::tuple>();
       return flatkv_options_set_remote_auth(o, py::str(t[0]).cast<std::string>().c_str(),
                                             py::str(t[1]).cast<std::string>().c_str());
     }},
    {"remote_tls_ca", "TLS to the cluster, verified against this CA file (\"\": the system's CAs)",
     [](flatkv_options* o, const py::handle& v, const char* n) -> flatkv_status* {
       if (!py::isinstance<py::str>(v)) throw py::type_error(std::string(n) + " must be a path, got " + TypeName(v) + " " + Repr(v));
       return flatkv_options_set_remote_tls(o, 1, v.cast<std::string>().c_str(), 1);
     }},
    {"remote_prefix", "names on the cluster start \"<prefix>:\" (default \"fkv\")",
     [](flatkv_options* o, const py::handle& v, const char* n) -> flatkv_status* {
       if (!py::isinstance<py::str>(v)) throw py::type_error(std::string(n) + " must be a string, got " + TypeName(v) + " " + Repr(v));
       return flatkv_options_set_remote_prefix(o, v.cast<std::string>().c_str());
     }},
    {"remote_timeout_ms", "one cluster request's timeout (default 1000)", U32<flatkv_options_set_remote_timeout_ms>},
    {"remote_capacity_bytes", "cluster bytes this store keeps, at most; the oldest it published go first (default 0: no cap)",
     U64<flatkv_options_set_remote_capacity>},
    {"remote_publish_buffer_bytes", "put data waiting to be published, at most (default 0: max(256 MiB, DRAM / 16))",
     U64<flatkv_options_set_remote_publish_buffer>},
};

// Store()'s docstring, from the table.
std::string StoreDoc() {
  std::string doc =
      "Store(shape, **options): opens an embedded store. `shape` is a preset name or a dict (kind, layers, "
      "kv_heads/head_dim or latent_dim/rope_dim, dtype).\n\nOptions (absent: the store's default):\n"
      "  ssd_dir / ssd_dirs: one SSD directory / a list of them (default: none)\n"
      "  ssd_bytes: SSD capacity per directory, bytes (default 4 GiB)\n";
  for (const Keyword& k : kKeywords) doc += "  " + std::string(k.name) + ": " + k.help + "\n";
  return doc;
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

// Token ids from a 1-D sequence or array, each checked to fit a uint32.
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

// RoPE styles by name, one row per C constant.
constexpr std::pair<const char*, int32_t> kRopeStyles[] = {
    {"interleaved", FLATKV_ROPE_INTERLEAVED},
    {"neox", FLATKV_ROPE_NEOX},
};

// flatkv.Rope: how the model rotates keys (flatkv_rope).
struct Rope {
  double theta = 10000.0;
  uint32_t rotary_dim = 0;
  std::string style = "interleaved";
};

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

  const flatkv_namespace* get() const { return ns_; }

  py::array_t<uint64_t> Keys(const py::object& tokens_obj, uint32_t block_tokens, const py::object& parent) const {
    const std::vector<uint32_t> tokens = ToTokens(tokens_obj);
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

  py::array_t<uint64_t> ChunkKeys(const py::object& tokens_obj, uint32_t block_tokens) const {
    const std::vector<uint32_t> tokens = ToTokens(tokens_obj);
    std::vector<flatkv_key> keys(block_tokens ? (tokens.size() + block_tokens - 1) / block_tokens : 0);
    uint64_t n = 0;
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_namespace_chunk_keys(ns_, tokens.data(), tokens.size(), block_tokens, keys.data(), keys.size(), &n);
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

  static std::unique_ptr<Store> Open(const py::object& shape, const py::kwargs& options) {
    OptionsPtr o = NewOptions();
    if (py::isinstance<py::str>(shape)) {
      Check(flatkv_options_set_shape_preset(o.get(), shape.cast<std::string>().c_str()));
    } else if (py::isinstance<py::dict>(shape)) {
      auto d = shape.cast<py::dict>();
      auto get = [&](const char* k) -> uint32_t {
        if (!d.contains(k)) throw py::value_error(std::string("shape is missing \"") + k + "\"");
        return ToU32(d[k], (std::string("shape[\"") + k + "\"]").c_str());
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
    std::vector<std::string> ssd_dirs;
    uint64_t ssd_bytes = uint64_t{4} << 30;
    for (const auto& [key_obj, value] : options) {
      const std::string key = py::str(key_obj);
      if (value.is_none()) continue;  // None: the default
      if (key == "ssd_dir") {
        ssd_dirs.push_back(py::str(value));
      } else if (key == "ssd_dirs") {
        if (py::isinstance<py::str>(value) || !py::isinstance<py::sequence>(value))
          throw py::type_error("ssd_dirs must be a list of paths, got " + TypeName(value) + " " + Repr(value));
        for (const auto& d : value.cast<py::sequence>()) ssd_dirs.push_back(py::str(d));
      } else if (key == "ssd_bytes") {
        ssd_bytes = ToU64(value, "ssd_bytes");
      } else {
        const Keyword* k = nullptr;
        for (const Keyword& row : kKeywords)
          if (key == row.name) k = &row;
        if (k == nullptr) {
          std::string known = "ssd_dir, ssd_dirs, ssd_bytes";
          for (const Keyword& row : kKeywords) known += std::string(", ") + row.name;
          throw py::type_error("Store() got an unknown option '" + key + "' (known: " + known + ")");
        }
        Check(k->set(o.get(), value, k->name));
      }
    }
    for (const auto& d : ssd_dirs) Check(flatkv_options_add_ssd_dir(o.get(), d.c_str(), ssd_bytes));
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

  uint32_t Match(const py::object& keys_obj) { return CountOf(flatkv_store_match, keys_obj); }
  uint32_t Prefetch(const py::object& keys_obj) { return CountOf(flatkv_store_prefetch, keys_obj); }

  // A call over keys that answers a block count (match, prefetch).
  uint32_t CountOf(flatkv_status* (*call)(flatkv_store*, const flatkv_key*, uint64_t, uint32_t*),
                   const py::object& keys_obj) {
    auto keys = ToKeys(keys_obj);
    uint32_t n = 0;
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = call(s_, keys.data(), keys.size(), &n);
    }
    Check(st);
    return n;
  }

  void Put(uint64_t session, const py::object& keys_obj, const py::object& data, bool one_shot,
           const py::object& hint) {
    uint32_t flags = one_shot ? FLATKV_PUT_ONE_SHOT : 0;
    if (!hint.is_none()) {
      const uint32_t h = static_cast<uint32_t>(ToEnum(hint, "hint", kPutHints));
      if (one_shot && h != FLATKV_PUT_ONE_SHOT)
        throw py::value_error("one_shot=True contradicts hint=" + Repr(hint));
      flags = h;
    }
    auto keys = ToKeys(keys_obj);
    Buffer buf(data, false, "data");
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_put(s_, session, keys.data(), keys.size(), buf.data(), buf.bytes(), flags);
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

  uint32_t TruncateSession(uint64_t session, uint32_t keep_blocks) {
    uint32_t released = 0;
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_truncate_session(s_, session, keep_blocks, &released);
    }
    Check(st);
    return released;
  }

  uint32_t Retain(const py::object& keys_obj, double ttl) {
    if (!(ttl >= 0) || ttl * 1000.0 > 4294967295.0)
      throw py::value_error("retain: ttl " + std::to_string(ttl) + " s is outside 0..4294967 seconds");
    auto keys = ToKeys(keys_obj);
    const uint32_t ttl_ms = static_cast<uint32_t>(std::llround(ttl * 1000.0));
    uint32_t n = 0;
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_retain(s_, keys.data(), keys.size(), ttl_ms, &n);
    }
    Check(st);
    return n;
  }

  void DropSession(uint64_t session) {
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_drop_session(s_, session);
    }
    Check(st);
  }

  py::object Stats() { return Json(flatkv_store_stats_json); }
  py::object Options() { return Json(flatkv_store_options_json); }

  void Close() {
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_close(s_);
    }
    Check(st);
  }

  uint64_t token_layer_bytes() const { return flatkv_store_token_layer_bytes(s_); }

  void PutChunk(const Namespace& ns, const py::object& tokens_obj, const py::object& data, const py::object& hint) {
    const uint32_t flags = hint.is_none() ? 0 : static_cast<uint32_t>(ToEnum(hint, "hint", kPutHints));
    const std::vector<uint32_t> tokens = ToTokens(tokens_obj);
    Buffer buf(data, false, "data");
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_put_chunk(s_, ns.get(), tokens.data(), tokens.size(), buf.data(), buf.bytes(), flags);
    }
    Check(st);
  }

  std::vector<uint64_t> LookupChunks(const Namespace& ns, const py::object& tokens_obj, const py::object& chunks_obj) {
    const std::vector<uint32_t> tokens = ToTokens(tokens_obj);
    if (py::isinstance<py::str>(chunks_obj) || !py::isinstance<py::sequence>(chunks_obj))
      throw py::type_error("chunks must be a list of (begin, length) pairs, got " + TypeName(chunks_obj));
    std::vector<flatkv_chunk> chunks;
    for (const auto& c : chunks_obj.cast<py::sequence>()) {
      if (!py::isinstance<py::sequence>(c) || py::len(c) != 2)
        throw py::type_error("chunks[" + std::to_string(chunks.size()) + "] must be a (begin, length) pair, got " +
                             Repr(c));
      auto pair = c.cast<py::sequence>();
      chunks.push_back({ToU64(pair[0], "chunk begin"), ToU64(pair[1], "chunk length")});
    }
    std::vector<uint64_t> cached(chunks.size());
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_lookup_chunks(s_, ns.get(), tokens.data(), tokens.size(), chunks.data(), chunks.size(),
                                      cached.data());
    }
    Check(st);
    return cached;
  }

  uint64_t RestoreChunk(const Namespace& ns, const py::object& tokens_obj, const py::object& out, uint64_t pos0,
                        const py::object& rope_obj) {
    const std::vector<uint32_t> tokens = ToTokens(tokens_obj);
    std::optional<flatkv_rope> rope;
    if (!rope_obj.is_none()) {
      if (!py::isinstance<Rope>(rope_obj))
        throw py::type_error("rope must be a flatkv.Rope or None, got " + TypeName(rope_obj));
      const Rope& r = rope_obj.cast<const Rope&>();
      rope = flatkv_rope{r.theta, r.rotary_dim, ToEnum(py::str(r.style), "rope.style", kRopeStyles)};
    }
    Buffer buf(out, true, "out");
    uint64_t n = 0;
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_restore_chunk(s_, ns.get(), tokens.data(), tokens.size(), rope ? &*rope : nullptr, pos0,
                                      buf.data(), buf.bytes(), &n);
    }
    Check(st);
    return n;
  }

 private:
  // One of the *_json calls, parsed.
  py::object Json(flatkv_status* (*call)(flatkv_store*, char*, uint64_t, uint64_t*)) {
    std::string json;
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      // The counters move between the two calls (a prefetch finishing, a
      // put elsewhere), so the text may grow: room to spare, and a retry
      // while it grew past that.
      uint64_t needed = 0;
      st = call(s_, nullptr, 0, &needed);
      for (int attempt = 0; st == nullptr && attempt < 8; ++attempt) {
        json.resize(needed + 256);
        st = call(s_, json.data(), json.size(), &needed);
        if (st == nullptr) {
          json.resize(needed ? needed - 1 : 0);
          break;
        }
        if (flatkv_status_code(st) != FLATKV_INVALID_ARGUMENT || needed <= json.size() || attempt == 7) break;
        flatkv_status_destroy(st);
        st = nullptr;
      }
    }
    Check(st);
    return py::module_::import("json").attr("loads")(json);
  }

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
           "(default: the namespace digest).")
      .def("chunk_keys", &Namespace::ChunkKeys, py::arg("tokens"), py::arg("block_tokens"),
           "Chunk keys (shape (ceil(n / block_tokens), 2)) of a chunk's tokens: position-independent, the "
           "trailing partial block included (docs/blend.md).");

  m.def("chunk_session", [](const py::object& key) {
        auto k = ToKeys(key);
        if (k.size() != 1) throw py::value_error("key must be one key, shape (1, 2) or (2,)");
        return flatkv_chunk_session(k[0]);
      }, py::arg("first_chunk_key"), "The session a chunk is stored under (drop_session frees it).");

  py::class_<Rope>(m, "Rope", "How a model applies RoPE to keys: theta, rotary_dim (0: the whole head), "
                              "style \"interleaved\" (llama2.c, Meta llama) or \"neox\" (Hugging Face / vLLM llama).")
      .def(py::init([](double theta, uint32_t rotary_dim, const std::string& style) {
             ToEnum(py::str(style), "style", kRopeStyles);
             return Rope{theta, rotary_dim, style};
           }),
           py::arg("theta") = 10000.0, py::arg("rotary_dim") = 0, py::arg("style") = "interleaved")
      .def_readonly("theta", &Rope::theta)
      .def_readonly("rotary_dim", &Rope::rotary_dim)
      .def_readonly("style", &Rope::style);

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

  static const std::string store_doc = StoreDoc();
  py::class_<Store>(m, "Store", "An embedded store or a daemon client.")
      .def(py::init(&Store::Open), py::arg("shape"), store_doc.c_str())
      .def_static("connect", &Store::Connect, py::arg("address"), py::arg("token") = "",
                  py::arg("shm_window_bytes") = 0, "Connects to a `flatkv serve` daemon (unix:/path, tcp:host:port).")
      .def_property_readonly("layers", &Store::layers)
      .def_property_readonly("block_tokens", &Store::block_tokens)
      .def_property_readonly("block_layer_bytes", &Store::block_layer_bytes)
      .def_property_readonly("block_bytes", &Store::block_bytes)
      .def_property_readonly("token_layer_bytes", &Store::token_layer_bytes,
                             "Bytes of one token's slice of one layer; a chunk of n tokens is layers x n x this.")
      .def("put_chunk", &Store::PutChunk, py::arg("ns"), py::arg("tokens"), py::arg("data"),
           py::arg("hint") = py::none(),
           "Stores a chunk's KV, computed on its own at positions 0.. with K before RoPE, in chunk rows: per layer "
           "n rows of K then n rows of V (docs/c_api.md).")
      .def("lookup_chunks", &Store::LookupChunks, py::arg("ns"), py::arg("tokens"), py::arg("chunks"),
           "For each (begin, length) chunk of the prompt `tokens`, how many of its leading tokens are stored.")
      .def("restore_chunk", &Store::RestoreChunk, py::arg("ns"), py::arg("tokens"), py::arg("out"),
           py::arg("pos0") = 0, py::arg("rope") = py::none(),
           "Restores a chunk into `out` (chunk rows) with K rotated to positions pos0.. by `rope` (None: K as "
           "stored, before RoPE); returns the leading tokens restored.")
      .def("match", &Store::Match, py::arg("keys"))
      .def("prefetch", &Store::Prefetch, py::arg("keys"),
           "Starts bringing the stored prefix's DRAM copies in (blocks on SSD alone are read in the background); "
           "returns the leading blocks found without waiting.")
      .def("put", &Store::Put, py::arg("session"), py::arg("keys"), py::arg("data"), py::arg("one_shot") = false,
           py::arg("hint") = py::none(),
           "Stores blocks for `session`. hint: \"auto\" (the store decides), \"one-shot\" (not reused soon) or "
           "\"hot\" (reused soon); one_shot=True is hint=\"one-shot\".")
      .def("restore", &Store::RestoreInto, py::arg("keys"), py::arg("out"), py::arg("layout") = "block",
           "Restores the stored prefix of `keys` into the writable buffer `out`; returns the blocks restored.")
      .def("restore_start", &Store::RestoreStart, py::arg("keys"), py::arg("out") = py::none(),
           py::arg("layout") = "block")
      .def("drop_session", &Store::DropSession, py::arg("session"))
      .def("truncate_session", &Store::TruncateSession, py::arg("session"), py::arg("keep_blocks"),
           "Releases the session's blocks beyond the first keep_blocks of its chain (shared blocks stay); "
           "returns the blocks released.")
      .def("retain", &Store::Retain, py::arg("keys"), py::arg("ttl"),
           "Keeps the stored prefix of `keys` and its DRAM copies from eviction for `ttl` seconds (0 releases); "
           "returns the leading blocks retained (fewer when the budget runs out).")
      .def("stats", &Store::Stats)
      .def("options", &Store::Options,
           "The options the store runs with, a dict keyed by StoreOptions' field names (a daemon's: its store's, "
           "with ssd_dirs their number).")
      .def("close", &Store::Close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Store& s, py::args) { s.Close(); });
}
