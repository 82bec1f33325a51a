// flatkv.Store (an embedded store or a daemon client, the same C calls)
// and flatkv.Restore, a restore in flight consumed layer by layer.
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flatkv_py.h"

namespace flatkv::python {
namespace {

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
    const auto& [data, blocks] = Waited(layer);
    return py::bytes(data, blocks * layer_bytes_);
  }

  // No copy: a read-only view of the layer where the restore holds it (the daemon's shared-memory
  // window, or the client's buffer of a streamed restore). Valid until the layer is released or
  // the restore finishes or closes; read it, do not keep it.
  py::memoryview LayerView(uint32_t layer) {
    const auto& [data, blocks] = Waited(layer);
    // (pybind11 2.10's from_memory takes a non-const pointer; the view is read-only.)
    return py::memoryview::from_memory(const_cast<char*>(data), static_cast<py::ssize_t>(blocks * layer_bytes_),
                                       /*readonly=*/true);
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
  // A waited, unreleased layer of a restore without `out`: where its slices are, and how many.
  const std::pair<const char*, uint64_t>& Waited(uint32_t layer) {
    Live();
    if (out_) throw py::value_error("this restore writes into its `out` buffer; read the layer there");
    auto it = views_.find(layer);
    if (it == views_.end())
      throw py::value_error("layer " + std::to_string(layer) + " is not waited for, or already released");
    return it->second;
  }

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
    return std::make_unique<Store>(OpenOptions(shape, options).get());
  }

  static std::unique_ptr<Store> Connect(const std::string& address, const std::string& token, uint64_t shm_bytes,
                                        uint32_t deadline_ms, uint32_t connect_timeout_ms) {
    return std::make_unique<Store>(ConnectOptions(address, token, shm_bytes, deadline_ms, connect_timeout_ms).get());
  }

  uint32_t layers() const { return flatkv_store_layers(s_); }
  uint32_t block_tokens() const { return flatkv_store_block_tokens(s_); }
  uint64_t block_layer_bytes() const { return flatkv_store_block_layer_bytes(s_); }
  uint64_t block_bytes() const { return flatkv_store_block_bytes(s_); }
  std::string dtype() const { return DTypeName(flatkv_store_dtype(s_)); }

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

  // Store::Prune: `ranges` is a sequence of (begin, end) token positions.
  py::dict Prune(const py::object& keys_obj, const py::object& ranges_obj) {
    auto keys = ToKeys(keys_obj);
    auto ranges = ToRanges(ranges_obj);
    flatkv_prune_result r{};
    flatkv_status* st;
    {
      py::gil_scoped_release release;
      st = flatkv_store_prune(s_, keys.data(), keys.size(), ranges.data(), ranges.size(), &r);
    }
    Check(st);
    py::dict d;
    d["view_session"] = r.view_session;
    d["logical_blocks"] = r.logical_blocks;
    d["kept_tokens"] = r.kept_tokens;
    d["view_blocks"] = r.view_blocks;
    d["stored_blocks"] = r.stored_blocks;
    return d;
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

void BindStore(py::module_& m) {
  py::class_<Restore>(m, "Restore", "A restore in flight, consumed layer by layer.")
      .def_property_readonly("hit_blocks", &Restore::hit_blocks)
      .def("wait_layer", &Restore::WaitLayer, py::arg("layer"), "Waits for a layer; returns its valid blocks.")
      .def("layer_data", &Restore::LayerData, py::arg("layer"),
           "A copy of a waited layer's slices (restores without `out` only).")
      .def("layer_view", &Restore::LayerView, py::arg("layer"),
           "A read-only memoryview of a waited layer's slices, without a copy (restores without `out` only); "
           "valid until release_layer, finish or close.")
      .def("release_layer", &Restore::ReleaseLayer, py::arg("layer"))
      .def("finish", &Restore::Finish, "Waits for every layer; returns the blocks valid in all of them.")
      .def("close", &Restore::Close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Restore& r, py::args) { r.Close(); });

  static const std::string store_doc = StoreDoc();
  py::class_<Store>(m, "Store", "An embedded store or a daemon client.")
      .def(py::init(&Store::Open), py::arg("shape"), store_doc.c_str())
      .def_static("connect", &Store::Connect, py::arg("address"), py::arg("token") = "",
                  py::arg("shm_window_bytes") = 0, py::arg("deadline_ms") = 10000, py::arg("connect_timeout_ms") = 5000,
                  "Connects to a `flatkv serve` daemon (unix:/path, tcp:host:port). deadline_ms bounds each request "
                  "(past it the call raises and the daemon abandons it); connect_timeout_ms bounds connecting.")
      .def_property_readonly("layers", &Store::layers)
      .def_property_readonly("block_tokens", &Store::block_tokens)
      .def_property_readonly("block_layer_bytes", &Store::block_layer_bytes)
      .def_property_readonly("block_bytes", &Store::block_bytes)
      .def_property_readonly("dtype", &Store::dtype,
                             "the element type of the store's shape: \"f16\", \"bf16\", \"f32\", \"fp8_e4m3\" or \"fp8_e5m2\"")
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
      .def("prune", &Store::Prune, py::arg("keys"), py::arg("ranges"),
           "Stores a pruned view of the stored chain `keys` without the token ranges [(begin, end), ...]: a "
           "session of its own holding the kept tokens' KV rows in order, found by prune_view_keys(keys[-1], "
           "len(keys), ranges, block_tokens). Returns a dict: view_session, logical_blocks, kept_tokens, "
           "view_blocks, stored_blocks.")
      .def("stats", &Store::Stats)
      .def("options", &Store::Options,
           "The options the store runs with, a dict keyed by StoreOptions' field names (a daemon's: its store's, "
           "with ssd_dirs their number).")
      .def("close", &Store::Close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](Store& s, py::args) { s.Close(); });
}

}  // namespace flatkv::python
