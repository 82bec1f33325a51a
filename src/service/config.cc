#include "service/config.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <variant>

#include <toml++/toml.h>

#include "common/thread_pool.h"
#include "net/transport.h"
#include "service/options_json.h"

namespace flatkv::service {
namespace {

std::string CacheDir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/flatkv";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/flatkv";
  return "/tmp/flatkv-" + std::to_string(::getuid());
}

// Reads `key` of `table` as bytes: an integer or a size string.
Status ReadBytes(const toml::table& t, std::string_view key, const std::string& where, std::optional<uint64_t>* out) {
  const toml::node* n = t.get(key);
  if (!n) return Status::Ok();
  if (auto v = n->value<int64_t>()) {
    if (*v < 0) return Status::InvalidArgument(where + "." + std::string(key) + ": negative size " + std::to_string(*v));
    *out = static_cast<uint64_t>(*v);
    return Status::Ok();
  }
  if (auto s = n->value<std::string>()) {
    auto b = ParseByteSize(*s);
    if (!b.ok()) return b.status().WithContext(where + "." + std::string(key));
    *out = *b;
    return Status::Ok();
  }
  return Status::InvalidArgument(where + "." + std::string(key) + ": expected a size (integer bytes or \"64MiB\")");
}

template <typename T>
Status Read(const toml::table& t, std::string_view key, const std::string& where, T* out) {
  const toml::node* n = t.get(key);
  if (!n) return Status::Ok();
  auto v = n->value<T>();
  if (!v) return Status::InvalidArgument(where + "." + std::string(key) + ": wrong type");
  *out = *v;
  return Status::Ok();
}

Status CheckKeys(const toml::table& t, const std::string& where, const std::set<std::string_view>& known) {
  for (const auto& [k, v] : t) {
    if (!known.count(k.str())) {
      std::string list;
      for (auto n : known) list += (list.empty() ? "" : ", ") + std::string(n);
      return Status::InvalidArgument(where + ": unknown key '" + std::string(k.str()) + "' (known: " + list + ")");
    }
  }
  return Status::Ok();
}

// The TOML text of a node, for error messages ("-3", "\"abc\"", "[1, 2]").
std::string Show(const toml::node& n) {
  std::ostringstream os;
  n.visit([&](const auto& v) { os << v; });
  return os.str();
}

// An enumerated StoreOptions field, set and shown by name.
struct EnumField {
  Status (*set)(StoreOptions* o, std::string_view name);
  std::string_view (*get)(const StoreOptions& o);
};
// Sizes (bytes), counts, switches, milliseconds, enums.
using Field = std::variant<uint64_t StoreOptions::*, uint32_t StoreOptions::*, bool StoreOptions::*,
                           std::chrono::milliseconds StoreOptions::*, EnumField>;

struct Knob {
  std::string_view key;
  Field field;
  std::string_view help;
};

// Every [store] key that is one StoreOptions field (its comment in
// include/flatkv/options.h has the trade-offs). One row per knob: the TOML
// key, the `flatkv serve` flag, --print-config and docs/service.md follow it.
const Knob kKnobs[] = {
    {"block_tokens", &StoreOptions::block_tokens, "tokens per block, 16..512"},
    {"segment_bytes", &StoreOptions::segment_bytes, "bytes of one preallocated segment file"},
    {"dram_extent_layer_bytes", &StoreOptions::dram_extent_layer_bytes, "target bytes of one layer's run in a DRAM extent"},
    {"ssd_extent_layer_bytes", &StoreOptions::ssd_extent_layer_bytes, "target bytes of one layer's run in an SSD extent"},
    {"sized_extents", &StoreOptions::sized_extents,
     "new extents sized to their session (false: every extent the largest, as before manifest version 5)"},
    {"session_dram_share_bytes", &StoreOptions::session_dram_share_bytes,
     "most DRAM copies one session may hold, bytes; 0 derives it from the capacities"},
    {"dram_idle_after_ms", &StoreOptions::dram_idle_after,
     "DRAM-only stores: a session untouched this long (ms) is reclaimed first"},
    {"ssd_admission",
     EnumField{[](StoreOptions* o, std::string_view v) -> Status {
                 FLATKV_ASSIGN_OR_RETURN(o->ssd_admission, ParseSsdAdmission(v));
                 return Status::Ok();
               },
               [](const StoreOptions& o) { return SsdAdmissionName(o.ssd_admission); }},
     "which blocks are written to SSD: all | on-reuse"},
    {"readmit_on_restore", &StoreOptions::readmit_on_restore, "a restore from SSD re-admits its blocks' DRAM copy"},
    {"ssd_write_buffer_bytes", &StoreOptions::ssd_write_buffer_bytes,
     "put bytes whose SSD write may be outstanding; 0 derives it from the capacities"},
    {"manifest_checkpoint_bytes", &StoreOptions::manifest_checkpoint_bytes,
     "manifest log size that starts an online checkpoint (at least 2x its last snapshot); 0: at close only"},
    {"window_layers", &StoreOptions::window_layers, "layers a restore's window holds at least"},
    {"window_bytes", &StoreOptions::window_bytes, "bytes a restore's window holds at least"},
    {"ssd_layers_in_flight", &StoreOptions::ssd_layers_in_flight, "layers a restore reads from SSD at once, at most"},
    {"max_request_bytes", &StoreOptions::max_request_bytes, "largest single SSD read, bytes"},
    {"io",
     EnumField{[](StoreOptions* o, std::string_view v) -> Status {
                 FLATKV_ASSIGN_OR_RETURN(o->ssd_io, ParseIoEngineKind(v));
                 return Status::Ok();
               },
               [](const StoreOptions& o) { return IoEngineKindName(o.ssd_io); }},
     "SSD I/O engine: auto | uring | threadpool"},
    {"ssd_queue_depth", &StoreOptions::ssd_queue_depth, "io_uring ring entries"},
    {"ssd_threads", &StoreOptions::ssd_threads, "thread-pool I/O engine workers"},
    {"dram_threads", &StoreOptions::dram_threads, "workers copying DRAM hits"},
    {"decode_threads", &StoreOptions::decode_threads, "workers decoding coded blocks on restore"},
    {"use_direct_io", &StoreOptions::use_direct_io, "O_DIRECT on segment files"},
    {"sync_writes", &StoreOptions::sync_writes, "fdatasync after every put (survives power loss)"},
    {"verify_dram_reads", &StoreOptions::verify_dram_reads, "verify checksums of DRAM hits too"},
};

template <class... F>
struct Overload : F... {
  using F::operator()...;
};
template <class... F>
Overload(F...) -> Overload<F...>;

// "--" and `key` with dashes for underscores: the knob's `flatkv serve` flag.
std::string FlagOf(std::string_view key) {
  std::string flag = "--" + std::string(key);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

const Knob* FindKnob(std::string_view key) {
  for (const Knob& k : kKnobs)
    if (k.key == key) return &k;
  return nullptr;
}

Status CheckCount(int64_t v, const std::string& where) {
  if (v < 0 || v > int64_t{UINT32_MAX})
    return Status::InvalidArgument(where + ": " + std::to_string(v) + " is outside 0..4294967295");
  return Status::Ok();
}

// Sets `k` from its TOML node; errors are "<where>.<key>: ...".
Status ApplyKnob(const Knob& k, const toml::node& n, const std::string& where, StoreOptions* o) {
  const std::string w = where + "." + std::string(k.key);
  return std::visit(
      Overload{
          [&](uint64_t StoreOptions::*f) -> Status {
            if (auto v = n.value<int64_t>(); v && n.is_integer()) {
              if (*v < 0) return Status::InvalidArgument(w + ": negative size " + std::to_string(*v));
              o->*f = static_cast<uint64_t>(*v);
              return Status::Ok();
            }
            if (auto s = n.value<std::string>()) {
              auto b = ParseByteSize(*s);
              if (!b.ok()) return b.status().WithContext(w);
              o->*f = *b;
              return Status::Ok();
            }
            return Status::InvalidArgument(w + ": expected a size (integer bytes or \"64MiB\"), got " + Show(n));
          },
          [&](uint32_t StoreOptions::*f) -> Status {
            if (!n.is_integer()) return Status::InvalidArgument(w + ": expected an integer, got " + Show(n));
            const int64_t v = *n.value<int64_t>();
            FLATKV_RETURN_IF_ERROR(CheckCount(v, w));
            o->*f = static_cast<uint32_t>(v);
            return Status::Ok();
          },
          [&](bool StoreOptions::*f) -> Status {
            if (!n.is_boolean()) return Status::InvalidArgument(w + ": expected true or false, got " + Show(n));
            o->*f = *n.value<bool>();
            return Status::Ok();
          },
          [&](std::chrono::milliseconds StoreOptions::*f) -> Status {
            if (!n.is_integer()) return Status::InvalidArgument(w + ": expected an integer of milliseconds, got " + Show(n));
            const int64_t v = *n.value<int64_t>();
            if (v < 0) return Status::InvalidArgument(w + ": negative duration " + std::to_string(v) + " ms");
            o->*f = std::chrono::milliseconds(v);
            return Status::Ok();
          },
          [&](EnumField f) -> Status {
            if (!n.is_string()) return Status::InvalidArgument(w + ": expected a name, got " + Show(n));
            return f.set(o, *n.value<std::string>()).WithContext(w);
          },
      },
      k.field);
}

// A whole decimal integer ("-3" too; no "+", no spaces), else nullopt.
std::optional<int64_t> ParseInt(std::string_view s) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

Status ApplyShape(const toml::node& n, const std::string& where, KvShape* shape) {
  if (auto s = n.value<std::string>()) {
    auto p = FindShapePreset(*s);
    if (!p.ok()) return p.status().WithContext(where);
    *shape = *p;
    return Status::Ok();
  }
  const toml::table* t = n.as_table();
  if (!t) return Status::InvalidArgument(where + ": expected a preset name or a table");
  FLATKV_RETURN_IF_ERROR(CheckKeys(*t, where, {"kind", "layers", "kv_heads", "head_dim", "latent_dim", "rope_dim", "dtype"}));
  std::string kind = "mha", dtype = "bf16";
  int64_t layers = 0, kv_heads = 0, head_dim = 0, latent = 0, rope = 0;
  FLATKV_RETURN_IF_ERROR(Read(*t, "kind", where, &kind));
  FLATKV_RETURN_IF_ERROR(Read(*t, "dtype", where, &dtype));
  FLATKV_RETURN_IF_ERROR(Read(*t, "layers", where, &layers));
  FLATKV_RETURN_IF_ERROR(Read(*t, "kv_heads", where, &kv_heads));
  FLATKV_RETURN_IF_ERROR(Read(*t, "head_dim", where, &head_dim));
  FLATKV_RETURN_IF_ERROR(Read(*t, "latent_dim", where, &latent));
  FLATKV_RETURN_IF_ERROR(Read(*t, "rope_dim", where, &rope));
  auto dt = ParseDType(dtype);
  if (!dt.ok()) return dt.status().WithContext(where + ".dtype");
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(std::clamp<int64_t>(v, 0, UINT32_MAX)); };
  if (kind == "mha") {
    *shape = KvShape::Mha(u32(layers), u32(kv_heads), u32(head_dim), *dt);
  } else if (kind == "mla") {
    *shape = KvShape::Mla(u32(layers), u32(latent), u32(rope), *dt);
  } else {
    return Status::InvalidArgument(where + ".kind: '" + kind + "' is neither mha nor mla");
  }
  return shape->Validate().WithContext(where);
}

// [remote]: StoreOptions::remote (docs/service.md, "The remote tier").
Status ApplyRemote(const toml::table& t, const std::string& w, RemoteOptions* r) {
  FLATKV_RETURN_IF_ERROR(CheckKeys(t, w, {"seeds", "user", "password", "password_file", "tls", "tls_ca_file",
                                          "tls_verify", "prefix", "object_bytes", "max_inflight", "ttl_seconds",
                                          "timeout_ms", "publish_buffer_bytes", "backoff_ms", "capacity_bytes"}));
  if (const toml::node* n = t.get("seeds")) {
    const toml::array* a = n->as_array();
    if (!a) return Status::InvalidArgument(w + ".seeds: expected an array of \"host:port\", got " + Show(*n));
    r->seeds.clear();
    for (const auto& e : *a) {
      auto v = e.value<std::string>();
      if (!v || v->rfind(':') == std::string::npos || v->rfind(':') == 0 || v->rfind(':') + 1 == v->size())
        return Status::InvalidArgument(w + ".seeds: expected \"host:port\" strings, got " + Show(e));
      r->seeds.push_back(*v);
    }
  }
  FLATKV_RETURN_IF_ERROR(Read(t, "user", w, &r->user));
  FLATKV_RETURN_IF_ERROR(Read(t, "password", w, &r->password));
  if (t.contains("password") && t.contains("password_file"))
    return Status::InvalidArgument(w + ": password and password_file both given; keep one");
  std::string file;
  FLATKV_RETURN_IF_ERROR(Read(t, "password_file", w, &file));
  if (!file.empty()) {
    std::ifstream in(file);
    if (!in) return Status::InvalidArgument(w + ".password_file: cannot read " + file);
    std::getline(in, r->password);  // its first line
    if (r->password.empty()) return Status::InvalidArgument(w + ".password_file: " + file + " is empty");
  }
  FLATKV_RETURN_IF_ERROR(Read(t, "tls", w, &r->tls));
  FLATKV_RETURN_IF_ERROR(Read(t, "tls_ca_file", w, &r->tls_ca_file));
  FLATKV_RETURN_IF_ERROR(Read(t, "tls_verify", w, &r->tls_verify));
  FLATKV_RETURN_IF_ERROR(Read(t, "prefix", w, &r->prefix));
  if (r->prefix.empty() || r->prefix.find_first_of("{}: ") != std::string::npos)
    return Status::InvalidArgument(w + ".prefix: '" + r->prefix +
                                   "' must be non-empty without '{', '}', ':' or spaces (no hash tags)");
  std::optional<uint64_t> bytes;
  FLATKV_RETURN_IF_ERROR(ReadBytes(t, "object_bytes", w, &bytes));
  if (bytes) {
    if (*bytes < 4096 || *bytes > (64ull << 20))
      return Status::InvalidArgument(w + ".object_bytes: " + std::to_string(*bytes) + " is outside 4KiB..64MiB");
    r->object_bytes = *bytes;
  }
  bytes.reset();
  FLATKV_RETURN_IF_ERROR(ReadBytes(t, "publish_buffer_bytes", w, &bytes));
  if (bytes) r->publish_buffer_bytes = *bytes;
  bytes.reset();
  FLATKV_RETURN_IF_ERROR(ReadBytes(t, "capacity_bytes", w, &bytes));
  if (bytes) r->capacity_bytes = *bytes;
  auto integer = [&](std::string_view key, int64_t least, int64_t most, int64_t* out) -> Status {
    const toml::node* n = t.get(key);
    if (!n) return Status::Ok();
    const std::string k = w + "." + std::string(key);
    if (!n->is_integer()) return Status::InvalidArgument(k + ": expected an integer, got " + Show(*n));
    const int64_t v = *n->value<int64_t>();
    if (v < least || v > most)
      return Status::InvalidArgument(k + ": " + std::to_string(v) + " is outside " + std::to_string(least) + ".." +
                                     std::to_string(most));
    *out = v;
    return Status::Ok();
  };
  int64_t v = r->max_inflight;
  FLATKV_RETURN_IF_ERROR(integer("max_inflight", 1, 1024, &v));
  r->max_inflight = static_cast<uint32_t>(v);
  v = r->ttl_seconds;
  FLATKV_RETURN_IF_ERROR(integer("ttl_seconds", 0, int64_t{1} << 31, &v));
  r->ttl_seconds = static_cast<uint32_t>(v);
  v = r->timeout.count();
  FLATKV_RETURN_IF_ERROR(integer("timeout_ms", 1, 600000, &v));
  r->timeout = std::chrono::milliseconds(v);
  v = r->backoff.count();
  FLATKV_RETURN_IF_ERROR(integer("backoff_ms", 0, 3600000, &v));
  r->backoff = std::chrono::milliseconds(v);
  return Status::Ok();
}

Status ApplyTable(const toml::table& root, const std::string& origin, ServerConfig* c) {
  FLATKV_RETURN_IF_ERROR(
      CheckKeys(root, origin, {"store", "remote", "server", "listen", "tls", "limits", "tenants", "metrics"}));
  if (const toml::table* t = root["remote"].as_table()) {
    RemoteOptions r = c->store.remote;  // set only when the whole table is right
    FLATKV_RETURN_IF_ERROR(ApplyRemote(*t, origin + ": remote", &r));
    c->store.remote = std::move(r);
  }
  if (const toml::table* s = root["store"].as_table()) {
    const std::string w = origin + ": store";
    std::set<std::string_view> known = {"shape", "dram_bytes", "dram_fraction", "ssd_dir", "ssd_dirs", "ssd_bytes"};
    for (const Knob& k : kKnobs) known.insert(k.key);
    FLATKV_RETURN_IF_ERROR(CheckKeys(*s, w, known));
    if (const toml::node* shape = s->get("shape")) FLATKV_RETURN_IF_ERROR(ApplyShape(*shape, w + ".shape", &c->store.shape));
    for (const Knob& k : kKnobs)
      if (const toml::node* n = s->get(k.key)) FLATKV_RETURN_IF_ERROR(ApplyKnob(k, *n, w, &c->store));
    FLATKV_RETURN_IF_ERROR(ReadBytes(*s, "dram_bytes", w, &c->dram_bytes));
    FLATKV_RETURN_IF_ERROR(Read(*s, "dram_fraction", w, &c->dram_fraction));
    FLATKV_RETURN_IF_ERROR(ReadBytes(*s, "ssd_bytes", w, &c->ssd_bytes));
    std::string dir;
    FLATKV_RETURN_IF_ERROR(Read(*s, "ssd_dir", w, &dir));
    if (s->contains("ssd_dir")) c->store.ssd_dirs = dir.empty() ? std::vector<std::string>{} : std::vector<std::string>{dir};
    if (const toml::node* dirs = s->get("ssd_dirs")) {
      const toml::array* a = dirs->as_array();
      if (!a) return Status::InvalidArgument(w + ".ssd_dirs: expected an array of paths, got " + Show(*dirs));
      c->store.ssd_dirs.clear();
      for (const auto& e : *a) {
        auto p = e.value<std::string>();
        if (!p) return Status::InvalidArgument(w + ".ssd_dirs: expected strings, got " + Show(e));
        c->store.ssd_dirs.push_back(*p);
      }
    }
  }
  if (const toml::table* t = root["server"].as_table()) {
    const std::string w = origin + ": server";
    FLATKV_RETURN_IF_ERROR(CheckKeys(*t, w, {"loop_threads", "workers"}));
    for (auto [key, out] : {std::pair{"loop_threads", &c->loop_threads}, std::pair{"workers", &c->workers}}) {
      const toml::node* n = t->get(key);
      if (!n) continue;
      const std::string k = w + "." + key;
      if (!n->is_integer()) return Status::InvalidArgument(k + ": expected an integer, got " + Show(*n));
      const int64_t v = *n->value<int64_t>();
      if (v < 1 || v > 256) return Status::InvalidArgument(k + ": " + std::to_string(v) + " is outside 1..256");
      *out = static_cast<uint32_t>(v);
    }
  }
  if (const toml::table* l = root["listen"].as_table()) {
    const std::string w = origin + ": listen";
    FLATKV_RETURN_IF_ERROR(CheckKeys(*l, w, {"unix", "tcp", "http", "allow_remote"}));
    FLATKV_RETURN_IF_ERROR(Read(*l, "unix", w, &c->unix_path));
    FLATKV_RETURN_IF_ERROR(Read(*l, "tcp", w, &c->tcp_address));
    FLATKV_RETURN_IF_ERROR(Read(*l, "http", w, &c->http_address));
    FLATKV_RETURN_IF_ERROR(Read(*l, "allow_remote", w, &c->allow_remote));
  }
  if (const toml::table* t = root["tls"].as_table()) {
    const std::string w = origin + ": tls";
    FLATKV_RETURN_IF_ERROR(CheckKeys(*t, w, {"cert", "key"}));
    FLATKV_RETURN_IF_ERROR(Read(*t, "cert", w, &c->tls_cert_file));
    FLATKV_RETURN_IF_ERROR(Read(*t, "key", w, &c->tls_key_file));
  }
  if (const toml::table* t = root["limits"].as_table()) {
    const std::string w = origin + ": limits";
    FLATKV_RETURN_IF_ERROR(CheckKeys(*t, w, {"max_frame_bytes", "deadline_ms", "max_deadline_ms", "io_timeout_ms",
                                             "login_timeout_ms", "max_connections", "max_unauthenticated_per_peer",
                                             "max_shm_windows", "max_shm_bytes", "max_shm_total_bytes", "max_restore_ms",
                                             "tenant_pinned_bytes", "max_retain_ms"}));
    auto bytes = [&](std::string_view key, uint64_t* out) -> Status {
      std::optional<uint64_t> v;
      FLATKV_RETURN_IF_ERROR(ReadBytes(*t, key, w, &v));
      if (v) *out = *v;
      return Status::Ok();
    };
    FLATKV_RETURN_IF_ERROR(bytes("max_frame_bytes", &c->max_frame_bytes));
    FLATKV_RETURN_IF_ERROR(bytes("max_shm_bytes", &c->max_shm_bytes));
    FLATKV_RETURN_IF_ERROR(bytes("max_shm_total_bytes", &c->max_shm_total_bytes));
    FLATKV_RETURN_IF_ERROR(bytes("tenant_pinned_bytes", &c->tenant_pinned_bytes));
    // Durations: positive milliseconds.
    auto ms = [&](std::string_view key, std::chrono::milliseconds* out) -> Status {
      const toml::node* n = t->get(key);
      if (!n) return Status::Ok();
      const std::string k = w + "." + std::string(key);
      if (!n->is_integer()) return Status::InvalidArgument(k + ": expected an integer of milliseconds, got " + Show(*n));
      const int64_t v = *n->value<int64_t>();
      if (v <= 0) return Status::InvalidArgument(k + ": " + std::to_string(v) + " ms is not positive");
      *out = std::chrono::milliseconds(v);
      return Status::Ok();
    };
    FLATKV_RETURN_IF_ERROR(ms("deadline_ms", &c->default_deadline));
    FLATKV_RETURN_IF_ERROR(ms("max_deadline_ms", &c->max_deadline));
    FLATKV_RETURN_IF_ERROR(ms("io_timeout_ms", &c->io_timeout));
    FLATKV_RETURN_IF_ERROR(ms("login_timeout_ms", &c->login_timeout));
    FLATKV_RETURN_IF_ERROR(ms("max_restore_ms", &c->max_restore_time));
    FLATKV_RETURN_IF_ERROR(ms("max_retain_ms", &c->max_retain));
    // Counts: max_connections and max_unauthenticated_per_peer at least 1.
    auto count = [&](std::string_view key, int64_t least, uint32_t* out) -> Status {
      const toml::node* n = t->get(key);
      if (!n) return Status::Ok();
      const std::string k = w + "." + std::string(key);
      if (!n->is_integer()) return Status::InvalidArgument(k + ": expected an integer, got " + Show(*n));
      const int64_t v = *n->value<int64_t>();
      if (v < least || v > (int64_t{1} << 20)) {
        return Status::InvalidArgument(k + ": " + std::to_string(v) + " is outside " + std::to_string(least) + "..1048576");
      }
      *out = static_cast<uint32_t>(v);
      return Status::Ok();
    };
    FLATKV_RETURN_IF_ERROR(count("max_connections", 1, &c->max_connections));
    FLATKV_RETURN_IF_ERROR(count("max_unauthenticated_per_peer", 1, &c->max_unauthenticated_per_peer));
    FLATKV_RETURN_IF_ERROR(count("max_shm_windows", 0, &c->max_shm_windows));
  }
  if (const toml::node* tn = root.get("tenants")) {
    const toml::array* a = tn->as_array();
    if (!a) return Status::InvalidArgument(origin + ": tenants: expected [[tenants]] tables");
    c->tenants.clear();
    for (size_t i = 0; i < a->size(); ++i) {
      const toml::table* t = (*a)[i].as_table();
      const std::string w = origin + ": tenants[" + std::to_string(i) + "]";
      if (!t) return Status::InvalidArgument(w + ": expected a table");
      FLATKV_RETURN_IF_ERROR(CheckKeys(*t, w, {"name", "token", "salt", "quota_bytes"}));
      TenantConfig tc;
      FLATKV_RETURN_IF_ERROR(Read(*t, "name", w, &tc.name));
      FLATKV_RETURN_IF_ERROR(Read(*t, "token", w, &tc.token));
      FLATKV_RETURN_IF_ERROR(Read(*t, "salt", w, &tc.salt));
      std::optional<uint64_t> quota;
      FLATKV_RETURN_IF_ERROR(ReadBytes(*t, "quota_bytes", w, &quota));
      tc.quota_bytes = quota.value_or(0);
      c->tenants.push_back(std::move(tc));
    }
  }
  if (const toml::table* m = root["metrics"].as_table()) {
    const std::string w = origin + ": metrics";
    FLATKV_RETURN_IF_ERROR(CheckKeys(*m, w, {"tenant_labels", "stats_token"}));
    FLATKV_RETURN_IF_ERROR(Read(*m, "tenant_labels", w, &c->metrics_tenant_labels));
    FLATKV_RETURN_IF_ERROR(Read(*m, "stats_token", w, &c->stats_token));
    if (!c->stats_token.empty() && c->stats_token.size() < 16) {
      return Status::InvalidArgument(w + ".stats_token: a token of " + std::to_string(c->stats_token.size()) +
                                     " characters is too short (at least 16)");
    }
  }
  return Status::Ok();
}

Status CheckLocal(const std::string& address, const std::string& what, bool allow_remote) {
  if (address.empty()) return Status::Ok();
  FLATKV_ASSIGN_OR_RETURN(net::Endpoint ep, net::ParseEndpoint("tcp:" + address));
  if (!allow_remote && !net::IsLoopbackHost(ep.host)) {
    return Status::InvalidArgument(what + " address '" + address +
                                   "' is not loopback; set listen.allow_remote = true (with tenants and TLS) to serve it");
  }
  return Status::Ok();
}

}  // namespace

ServerConfig DefaultServerConfig() {
  ServerConfig c;
  c.store.shape = FindShapePreset("Llama-3.1-8B").value();
  const std::string cache = CacheDir();
  c.store.ssd_dirs = {cache + "/store"};
  // The socket's own directory, which the daemon creates with mode 0700.
  const char* run = std::getenv("XDG_RUNTIME_DIR");
  c.unix_path = run && *run ? std::string(run) + "/flatkv/flatkv.sock" : cache + "/run/flatkv.sock";
  return c;
}

Result<uint64_t> ParseByteSize(std::string_view text) {
  std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !std::isfinite(v)) return Status::InvalidArgument("size '" + s + "': not a number");
  if (v < 0) return Status::InvalidArgument("size '" + s + "': negative");
  std::string unit(end);
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  double mul = 1;
  if (unit.empty() || unit == "B") mul = 1;
  else if (unit == "K" || unit == "KiB" || unit == "k") mul = 1024.0;
  else if (unit == "M" || unit == "MiB") mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB") mul = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TiB") mul = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB") mul = 1e3;
  else if (unit == "MB") mul = 1e6;
  else if (unit == "GB") mul = 1e9;
  else if (unit == "TB") mul = 1e12;
  else return Status::InvalidArgument("size '" + s + "': unknown unit '" + unit + "' (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  const double bytes = v * mul;
  if (bytes > 1.8e19) return Status::InvalidArgument("size '" + s + "': too large");
  return static_cast<uint64_t>(bytes);
}

Status ApplyConfigToml(std::string_view text, const std::string& origin, ServerConfig* config) {
  try {
    toml::table root = toml::parse(text, origin);
    return ApplyTable(root, origin, config);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << origin << ":" << e.source().begin.line << ":" << e.source().begin.column << ": " << e.description();
    return Status::InvalidArgument(os.str());
  } catch (const std::exception& e) {
    return Status::InvalidArgument(origin + ": " + e.what());
  }
}

Status LoadConfigFile(const std::string& path, ServerConfig* config) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("config file " + path + ": cannot be opened");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ApplyConfigToml(ss.str(), path, config);
}

std::vector<StoreKnobInfo> StoreKnobs() {
  std::vector<StoreKnobInfo> out;
  for (const Knob& k : kKnobs) out.push_back({k.key, k.help, FlagOf(k.key)});
  return out;
}

Status ApplyStoreKnobFlag(std::string_view key, std::string_view value, ServerConfig* c) {
  const Knob* k = FindKnob(key);
  const std::string flag = FlagOf(key);
  if (k == nullptr) return Status::InvalidArgument(flag + ": no such store setting");
  const std::string v(value);
  StoreOptions* o = &c->store;
  return std::visit(
      Overload{
          [&](uint64_t StoreOptions::*f) -> Status {
            auto b = ParseByteSize(v);
            if (!b.ok()) return b.status().WithContext(flag);
            o->*f = *b;
            return Status::Ok();
          },
          [&](uint32_t StoreOptions::*f) -> Status {
            auto n = ParseInt(v);
            if (!n) return Status::InvalidArgument(flag + ": '" + v + "' is not an integer");
            FLATKV_RETURN_IF_ERROR(CheckCount(*n, flag));
            o->*f = static_cast<uint32_t>(*n);
            return Status::Ok();
          },
          [&](bool StoreOptions::*f) -> Status {
            if (v == "true" || v == "1") o->*f = true;
            else if (v == "false" || v == "0") o->*f = false;
            else return Status::InvalidArgument(flag + ": '" + v + "' is neither true nor false");
            return Status::Ok();
          },
          [&](std::chrono::milliseconds StoreOptions::*f) -> Status {
            auto n = ParseInt(v);
            if (!n) return Status::InvalidArgument(flag + ": '" + v + "' is not an integer of milliseconds");
            if (*n < 0) return Status::InvalidArgument(flag + ": negative duration " + v + " ms");
            o->*f = std::chrono::milliseconds(*n);
            return Status::Ok();
          },
          [&](EnumField f) -> Status { return f.set(o, v).WithContext(flag); },
      },
      k->field);
}

std::string StoreKnobValue(std::string_view key, const ServerConfig& c) {
  const Knob* k = FindKnob(key);
  if (k == nullptr) return "";
  const StoreOptions& o = c.store;
  return std::visit(Overload{
                        [&](uint64_t StoreOptions::*f) { return std::to_string(o.*f); },
                        [&](uint32_t StoreOptions::*f) { return std::to_string(o.*f); },
                        [&](bool StoreOptions::*f) { return std::string(o.*f ? "true" : "false"); },
                        [&](std::chrono::milliseconds StoreOptions::*f) { return std::to_string((o.*f).count()); },
                        [&](EnumField f) {
                          std::string quoted(1, '"');  // appended, not concatenated: GCC 12's -Wrestrict misfires
                          quoted.append(f.get(o)).push_back('"');
                          return quoted;
                        },
                    },
                    k->field);
}

uint32_t DefaultLoopThreads() { return ThreadPool::HardwareThreads() < 4 ? 1 : 2; }

Status FinalizeConfig(ServerConfig* c) {
  if (!(c->dram_fraction >= 0 && c->dram_fraction <= 0.9)) {
    return Status::InvalidArgument("store.dram_fraction " + std::to_string(c->dram_fraction) + " is outside [0, 0.9]");
  }
  if (c->dram_bytes) {
    c->store.dram_capacity_bytes = *c->dram_bytes;
  } else {
    const double phys = double(::sysconf(_SC_PHYS_PAGES)) * double(::sysconf(_SC_PAGESIZE));
    const uint64_t bytes = static_cast<uint64_t>(phys * c->dram_fraction);
    c->store.dram_capacity_bytes = bytes / (2ull << 20) * (2ull << 20);
  }
  if (c->ssd_bytes) {
    c->store.ssd_capacity_bytes = *c->ssd_bytes;
  } else if (!c->store.ssd_dirs.empty()) {
    uint64_t cap = 16ull << 30;
    struct statvfs fs {};
    std::string probe = c->store.ssd_dirs[0];
    while (!probe.empty() && ::statvfs(probe.c_str(), &fs) != 0) {
      const size_t slash = probe.find_last_of('/');
      probe = slash == std::string::npos || slash == 0 ? (slash == 0 ? "/" : "") : probe.substr(0, slash);
      if (probe == "/") {
        ::statvfs("/", &fs);
        break;
      }
    }
    const uint64_t free_bytes = uint64_t(fs.f_bavail) * fs.f_frsize;
    if (free_bytes) cap = std::min(cap, free_bytes / 2);
    cap = std::max(cap, c->store.segment_bytes);
    c->store.ssd_capacity_bytes = cap / c->store.segment_bytes * c->store.segment_bytes;
  }
  if (c->tcp_address == kTcpAuto) c->tcp_address = c->tenants.empty() ? "" : std::string(kDefaultTcpAddress);
  if (c->unix_path.empty() && c->tcp_address.empty()) {
    return Status::InvalidArgument(c->tenants.empty()
                                       ? "listen: no unix socket, and TCP needs tenants; set listen.unix to a socket path"
                                       : "listen: neither a unix socket nor a tcp address is configured; set listen.unix or listen.tcp");
  }
  if (c->allow_remote && (c->tls_cert_file.empty() || c->tenants.empty())) {
    return Status::InvalidArgument(std::string("listen.allow_remote = true needs ") +
                                   (c->tls_cert_file.empty() ? "[tls] cert and key" : "") +
                                   (c->tls_cert_file.empty() && c->tenants.empty() ? " and " : "") +
                                   (c->tenants.empty() ? "at least one [[tenants]] entry with a token" : "") +
                                   ": a daemon reachable from the network must encrypt and authenticate");
  }
  if (!c->tcp_address.empty() && c->tenants.empty()) {
    return Status::InvalidArgument("listen.tcp '" + c->tcp_address +
                                   "' needs at least one [[tenants]] entry with a token (any local user can reach a TCP "
                                   "port); add [[tenants]] or set listen.tcp = \"\" (--tcp none)");
  }
  FLATKV_RETURN_IF_ERROR(CheckLocal(c->tcp_address, "listen.tcp", c->allow_remote));
  FLATKV_RETURN_IF_ERROR(CheckLocal(c->http_address, "listen.http", c->allow_remote));
  if (c->tls_cert_file.empty() != c->tls_key_file.empty()) {
    return Status::InvalidArgument("tls: cert and key must be given together; set both tls.cert and tls.key");
  }
  if (c->max_frame_bytes < 4096 || c->max_frame_bytes > (1ull << 31)) {
    return Status::InvalidArgument("limits.max_frame_bytes " + std::to_string(c->max_frame_bytes) + " is outside [4096, 2 GiB]");
  }
  if (c->default_deadline > c->max_deadline) {
    return Status::InvalidArgument("limits.deadline_ms " + std::to_string(c->default_deadline.count()) +
                                   " exceeds limits.max_deadline_ms " + std::to_string(c->max_deadline.count()) +
                                   "; raise max_deadline_ms or lower deadline_ms");
  }
  if (c->max_shm_bytes > c->max_shm_total_bytes) {
    return Status::InvalidArgument("limits.max_shm_bytes " + std::to_string(c->max_shm_bytes) +
                                   " (per connection) exceeds limits.max_shm_total_bytes " +
                                   std::to_string(c->max_shm_total_bytes) + "; raise max_shm_total_bytes or lower max_shm_bytes");
  }
  return Status::Ok();
}

}  // namespace flatkv::service
