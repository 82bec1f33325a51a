#include "service/config.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "service/transport.h"

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

Status ApplyTable(const toml::table& root, const std::string& origin, ServerConfig* c) {
  FLATKV_RETURN_IF_ERROR(CheckKeys(root, origin, {"store", "listen", "tls", "limits", "tenants"}));
  if (const toml::table* s = root["store"].as_table()) {
    const std::string w = origin + ": store";
    FLATKV_RETURN_IF_ERROR(CheckKeys(*s, w, {"shape", "block_tokens", "dram_bytes", "dram_fraction", "ssd_dir", "ssd_dirs",
                                             "ssd_bytes", "segment_bytes", "sync_writes", "io"}));
    if (const toml::node* shape = s->get("shape")) FLATKV_RETURN_IF_ERROR(ApplyShape(*shape, w + ".shape", &c->store.shape));
    int64_t bt = c->store.block_tokens;
    FLATKV_RETURN_IF_ERROR(Read(*s, "block_tokens", w, &bt));
    c->store.block_tokens = static_cast<uint32_t>(std::clamp<int64_t>(bt, 0, UINT32_MAX));
    FLATKV_RETURN_IF_ERROR(ReadBytes(*s, "dram_bytes", w, &c->dram_bytes));
    FLATKV_RETURN_IF_ERROR(Read(*s, "dram_fraction", w, &c->dram_fraction));
    FLATKV_RETURN_IF_ERROR(ReadBytes(*s, "ssd_bytes", w, &c->ssd_bytes));
    std::optional<uint64_t> seg;
    FLATKV_RETURN_IF_ERROR(ReadBytes(*s, "segment_bytes", w, &seg));
    if (seg) c->store.segment_bytes = *seg;
    std::string dir;
    FLATKV_RETURN_IF_ERROR(Read(*s, "ssd_dir", w, &dir));
    if (s->contains("ssd_dir")) c->store.ssd_dirs = dir.empty() ? std::vector<std::string>{} : std::vector<std::string>{dir};
    if (const toml::node* dirs = s->get("ssd_dirs")) {
      const toml::array* a = dirs->as_array();
      if (!a) return Status::InvalidArgument(w + ".ssd_dirs: expected an array of paths");
      c->store.ssd_dirs.clear();
      for (const auto& e : *a) {
        auto p = e.value<std::string>();
        if (!p) return Status::InvalidArgument(w + ".ssd_dirs: expected strings");
        c->store.ssd_dirs.push_back(*p);
      }
    }
    FLATKV_RETURN_IF_ERROR(Read(*s, "sync_writes", w, &c->store.sync_writes));
    std::string io;
    FLATKV_RETURN_IF_ERROR(Read(*s, "io", w, &io));
    if (io == "auto") c->store.ssd_io = IoEngineKind::kAuto;
    else if (io == "uring") c->store.ssd_io = IoEngineKind::kUring;
    else if (io == "threadpool") c->store.ssd_io = IoEngineKind::kThreadPool;
    else if (!io.empty()) return Status::InvalidArgument(w + ".io: '" + io + "' is not auto, uring or threadpool");
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
    FLATKV_RETURN_IF_ERROR(CheckKeys(*t, w, {"max_frame_bytes", "deadline_ms", "io_timeout_ms", "max_connections",
                                             "max_shm_windows", "max_shm_bytes"}));
    std::optional<uint64_t> frame, shm;
    FLATKV_RETURN_IF_ERROR(ReadBytes(*t, "max_frame_bytes", w, &frame));
    if (frame) c->max_frame_bytes = *frame;
    FLATKV_RETURN_IF_ERROR(ReadBytes(*t, "max_shm_bytes", w, &shm));
    if (shm) c->max_shm_bytes = *shm;
    int64_t deadline = c->default_deadline.count(), io = c->io_timeout.count(), conns = c->max_connections,
            windows = c->max_shm_windows;
    FLATKV_RETURN_IF_ERROR(Read(*t, "deadline_ms", w, &deadline));
    FLATKV_RETURN_IF_ERROR(Read(*t, "io_timeout_ms", w, &io));
    FLATKV_RETURN_IF_ERROR(Read(*t, "max_connections", w, &conns));
    FLATKV_RETURN_IF_ERROR(Read(*t, "max_shm_windows", w, &windows));
    if (deadline <= 0 || io <= 0 || conns <= 0 || windows < 0) {
      return Status::InvalidArgument(w + ": deadline_ms, io_timeout_ms and max_connections must be positive");
    }
    c->default_deadline = std::chrono::milliseconds(deadline);
    c->io_timeout = std::chrono::milliseconds(io);
    c->max_connections = static_cast<uint32_t>(std::min<int64_t>(conns, 1 << 20));
    c->max_shm_windows = static_cast<uint32_t>(std::min<int64_t>(windows, 1 << 16));
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
  return Status::Ok();
}

Status CheckLocal(const std::string& address, const std::string& what, bool allow_remote) {
  if (address.empty()) return Status::Ok();
  FLATKV_ASSIGN_OR_RETURN(Endpoint ep, ParseEndpoint("tcp:" + address));
  if (!allow_remote && !IsLoopbackHost(ep.host)) {
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
  const char* run = std::getenv("XDG_RUNTIME_DIR");
  c.unix_path = (run && *run ? std::string(run) : cache) + "/flatkv.sock";
  return c;
}

Result<uint64_t> ParseByteSize(std::string_view text) {
  std::string s(text);
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || !(v >= 0) || !std::isfinite(v)) return Status::InvalidArgument("size '" + s + "': not a number");
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
  if (c->unix_path.empty() && c->tcp_address.empty()) {
    return Status::InvalidArgument("listen: neither a unix socket nor a tcp address is configured");
  }
  FLATKV_RETURN_IF_ERROR(CheckLocal(c->tcp_address, "listen.tcp", c->allow_remote));
  FLATKV_RETURN_IF_ERROR(CheckLocal(c->http_address, "listen.http", c->allow_remote));
  if (c->tls_cert_file.empty() != c->tls_key_file.empty()) {
    return Status::InvalidArgument("tls: cert and key must be given together");
  }
  if (c->max_frame_bytes < 4096 || c->max_frame_bytes > (1ull << 31)) {
    return Status::InvalidArgument("limits.max_frame_bytes " + std::to_string(c->max_frame_bytes) + " is outside [4096, 2 GiB]");
  }
  return Status::Ok();
}

}  // namespace flatkv::service
