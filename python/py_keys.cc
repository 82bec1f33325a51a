// flatkv.Namespace (the keys of token chains and of chunks),
// flatkv.chunk_session and flatkv.Rope.
#include <algorithm>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flatkv_py.h"

namespace flatkv::python {

Namespace::Namespace(const std::string& model_fingerprint, const std::string& adapter, const std::string& tenant,
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

py::array_t<uint64_t> Namespace::Keys(const py::object& tokens_obj, uint32_t block_tokens,
                                      const py::object& parent) const {
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

py::array_t<uint64_t> Namespace::ChunkKeys(const py::object& tokens_obj, uint32_t block_tokens) const {
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

py::array_t<uint64_t> Namespace::EngineKeys(const py::object& hashes) const {
  // A sequence of equal-length bytes objects (vLLM's BlockHash), or a 2-D uint8 array, one hash a row.
  std::vector<uint8_t> flat;
  uint64_t n = 0;
  size_t width = 0;
  if (py::isinstance<py::array>(hashes)) {
    auto a = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>::ensure(hashes);
    if (!a || a.ndim() != 2) throw py::value_error("engine hashes must be a 2-D uint8 array (one hash a row)");
    n = a.shape(0);
    width = a.shape(1);
    flat.assign(a.data(), a.data() + n * width);
  } else {
    for (const py::handle h : hashes) {
      if (!py::isinstance<py::bytes>(h))
        throw py::type_error("engine hash " + std::to_string(n) + " is " +
                             std::string(py::str(py::type::of(h).attr("__name__"))) + ", not bytes");
      const std::string b = py::reinterpret_borrow<py::bytes>(h);
      if (n == 0) width = b.size();
      if (b.size() != width || width == 0)
        throw py::value_error("engine hash " + std::to_string(n) + " has " + std::to_string(b.size()) +
                              " bytes, the first had " + std::to_string(width) + " (all must be equal and non-empty)");
      flat.insert(flat.end(), b.begin(), b.end());
      ++n;
    }
  }
  std::vector<flatkv_key> keys(n);
  if (n > 0) Check(flatkv_namespace_engine_keys(ns_, flat.data(), n, static_cast<uint32_t>(width), keys.data(), n));
  return FromKeys(keys);
}

void BindKeys(py::module_& m) {
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
           "trailing partial block included (docs/blend.md).")
      .def("engine_keys", &Namespace::EngineKeys, py::arg("hashes"),
           "Keys (shape (n, 2)) of a serving engine's own block hashes (vLLM's request.block_hashes: equal-length "
           "bytes, or a 2-D uint8 array), each already covering its whole prefix (docs/format_keys.md).");

  m.def("chunk_session", [](const py::object& key) {
        auto k = ToKeys(key);
        if (k.size() != 1) throw py::value_error("key must be one key, shape (1, 2) or (2,)");
        return flatkv_chunk_session(k[0]);
      }, py::arg("first_chunk_key"), "The session a chunk is stored under (drop_session frees it).");

  m.def("prune_view_keys", [](const py::object& last_key, uint32_t logical_blocks, const py::object& ranges_obj,
                              uint32_t block_tokens) {
        auto k = ToKeys(last_key);
        if (k.size() != 1) throw py::value_error("last_key must be one key, shape (1, 2) or (2,)");
        auto ranges = ToRanges(ranges_obj);
        std::vector<flatkv_key> out(std::max<uint32_t>(logical_blocks, 1));  // a view has at most as many blocks
        uint64_t n = 0;
        Check(flatkv_prune_view_keys(k[0], logical_blocks, ranges.data(), ranges.size(), block_tokens, out.data(),
                                     out.size(), &n));
        out.resize(n);
        return FromKeys(out);
      }, py::arg("last_key"), py::arg("logical_blocks"), py::arg("ranges"), py::arg("block_tokens"),
      "Keys of the pruned view of a chain of `logical_blocks` blocks ending in `last_key`, without the token "
      "ranges [(begin, end), ...] (Store.prune).");

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
}

}  // namespace flatkv::python
