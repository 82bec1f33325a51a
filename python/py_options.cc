// flatkv.Store()'s options: the keyword table (one C setter a keyword),
// the shape argument, the SSD directories, and the docstring made from the
// table; flatkv.Store.connect's daemon address.
#include <cstdint>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "flatkv_py.h"

namespace flatkv::python {
namespace {

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
    {"ssd_layers_in_flight", "layers a restore reads from SSD at once, at most",
     U32<flatkv_options_set_ssd_layers_in_flight>},
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

}  // namespace

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

OptionsPtr NewOptions() {
  OptionsPtr o(flatkv_options_create());
  if (!o) throw std::bad_alloc();
  return o;
}

OptionsPtr OpenOptions(const py::object& shape, const py::kwargs& options) {
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
  return o;
}

OptionsPtr ConnectOptions(const std::string& address, const std::string& token, uint64_t shm_bytes,
                          uint32_t deadline_ms, uint32_t connect_timeout_ms) {
  OptionsPtr o = NewOptions();
  Check(flatkv_options_set_server(o.get(), address.c_str(), token.c_str()));
  Check(flatkv_options_set_shm_window(o.get(), shm_bytes));
  Check(flatkv_options_set_server_timeouts(o.get(), deadline_ms, connect_timeout_ms));
  return o;
}

}  // namespace flatkv::python
