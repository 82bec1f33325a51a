#include "service/wire.h"

#include <cstdio>
#include <cstring>

#include "flatkv/placement.h"

namespace flatkv::service::wire {
namespace {

class Writer {
 public:
  explicit Writer(Type type, uint32_t id) : type_(type), id_(id) { buf_.resize(kHeaderBytes); }
  void U8(uint8_t v) { Raw(&v, 1); }
  void U16(uint16_t v) { Raw(&v, 2); }
  void U32(uint32_t v) { Raw(&v, 4); }
  void U64(uint64_t v) { Raw(&v, 8); }
  void Str(std::string_view s) {
    U16(static_cast<uint16_t>(s.size()));
    Raw(s.data(), s.size());
  }
  void Keys(const std::vector<BlockKey>& keys) {
    U32(static_cast<uint32_t>(keys.size()));
    for (const BlockKey& k : keys) {
      U64(k.lo);
      U64(k.hi);
    }
  }
  void Raw(const void* p, size_t n) {
    const size_t at = buf_.size();
    buf_.resize(at + n);
    if (n) std::memcpy(buf_.data() + at, p, n);
  }
  // `extra`: payload bytes the caller sends after this frame's bytes.
  std::vector<std::byte> Finish(uint64_t extra = 0) {
    EncodeHeader({type_, id_, static_cast<uint32_t>(buf_.size() - kHeaderBytes + extra)}, buf_.data());
    return std::move(buf_);
  }

 private:
  Type type_;
  uint32_t id_;
  std::vector<std::byte> buf_;
};

// Bounds-checked little-endian reader over one payload.
class Reader {
 public:
  Reader(std::span<const std::byte> p, std::string_view what) : p_(p), what_(what) {}
  bool U8(uint8_t* v) { return Raw(v, 1); }
  bool U16(uint16_t* v) { return Raw(v, 2); }
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool U64(uint64_t* v) { return Raw(v, 8); }
  bool Raw(void* out, size_t n) {
    if (p_.size() - at_ < n) return Fail("truncated at byte " + std::to_string(at_) + " (need " + std::to_string(n) + ")");
    std::memcpy(out, p_.data() + at_, n);
    at_ += n;
    return true;
  }
  bool Str(std::string* s) {
    uint16_t n = 0;
    if (!U16(&n)) return false;
    if (n > kMaxStringBytes) return Fail("string of " + std::to_string(n) + " bytes exceeds " + std::to_string(kMaxStringBytes));
    if (p_.size() - at_ < n) return Fail("string of " + std::to_string(n) + " bytes truncated at byte " + std::to_string(at_));
    s->assign(reinterpret_cast<const char*>(p_.data() + at_), n);
    at_ += n;
    return true;
  }
  bool Keys(std::vector<BlockKey>* keys) {
    uint32_t n = 0;
    if (!U32(&n)) return false;
    if (n > kMaxKeys) return Fail("key count " + std::to_string(n) + " exceeds " + std::to_string(kMaxKeys));
    if ((p_.size() - at_) / 16 < n) {
      return Fail("key count " + std::to_string(n) + " needs " + std::to_string(uint64_t{n} * 16) + " bytes, " +
                  std::to_string(p_.size() - at_) + " left");
    }
    keys->resize(n);
    for (auto& k : *keys) {
      (void)U64(&k.lo);
      (void)U64(&k.hi);
    }
    return true;
  }
  std::span<const std::byte> Rest() {
    auto r = p_.subspan(at_);
    at_ = p_.size();
    return r;
  }
  bool Fail(const std::string& m) {
    if (error_.empty()) error_ = std::string(what_) + ": " + m;
    return false;
  }
  // OK when everything read was present and nothing is left over.
  Status Done() const {
    if (!error_.empty()) return Status::InvalidArgument(error_);
    if (at_ != p_.size()) {
      return Status::InvalidArgument(std::string(what_) + ": " + std::to_string(p_.size() - at_) + " trailing bytes");
    }
    return Status::Ok();
  }

 private:
  std::span<const std::byte> p_;
  std::string_view what_;
  size_t at_ = 0;
  std::string error_;
};

}  // namespace

std::string_view TypeName(Type t) {
  switch (t) {
    case Type::kHello: return "hello";
    case Type::kLookup: return "lookup";
    case Type::kPut: return "put";
    case Type::kRestore: return "restore";
    case Type::kRegisterShm: return "register_shm";
    case Type::kStats: return "stats";
    case Type::kPing: return "ping";
    case Type::kRetain: return "retain";
    case Type::kTruncateSession: return "truncate_session";
    case Type::kDropSession: return "drop_session";
    case Type::kPrefetch: return "prefetch";
    case Type::kPrune: return "prune";
    case Type::kHelloOk: return "hello_ok";
    case Type::kLookupOk: return "lookup_ok";
    case Type::kPutOk: return "put_ok";
    case Type::kRestoreBegin: return "restore_begin";
    case Type::kRestoreLayer: return "restore_layer";
    case Type::kRestoreEnd: return "restore_end";
    case Type::kShmOk: return "shm_ok";
    case Type::kStatsOk: return "stats_ok";
    case Type::kPong: return "pong";
    case Type::kDropSessionOk: return "drop_session_ok";
    case Type::kPrefetchOk: return "prefetch_ok";
    case Type::kRetainOk: return "retain_ok";
    case Type::kTruncateSessionOk: return "truncate_session_ok";
    case Type::kPruneOk: return "prune_ok";
    case Type::kError: return "error";
  }
  return "unknown";
}

static bool KnownType(uint8_t t) { return (t >= 1 && t <= 13 && t != 10) || (t >= 64 && t <= 77) || t == 127; }

bool IsRequest(Type t) { return static_cast<uint8_t>(t) >= 1 && static_cast<uint8_t>(t) <= 13 && KnownType(static_cast<uint8_t>(t)); }

Result<Header> ParseHeader(std::span<const std::byte> b, uint64_t max_payload) {
  if (b.size() < kHeaderBytes) {
    return Status::InvalidArgument("frame header: " + std::to_string(b.size()) + " bytes, need " + std::to_string(kHeaderBytes));
  }
  uint32_t magic, id, len;
  uint8_t version, type;
  uint16_t flags;
  std::memcpy(&magic, b.data(), 4);
  std::memcpy(&version, b.data() + 4, 1);
  std::memcpy(&type, b.data() + 5, 1);
  std::memcpy(&flags, b.data() + 6, 2);
  std::memcpy(&id, b.data() + 8, 4);
  std::memcpy(&len, b.data() + 12, 4);
  char hex[16];
  if (magic != kMagic) {
    std::snprintf(hex, sizeof hex, "0x%08x", magic);
    return Status::InvalidArgument(std::string("frame header: bad magic ") + hex + " (not a flatkv peer)");
  }
  if (version != kVersion) {
    return Status::NotSupported("frame header: protocol version " + std::to_string(version) + ", this build speaks " +
                                std::to_string(kVersion));
  }
  if (!KnownType(type)) return Status::InvalidArgument("frame header: unknown frame type " + std::to_string(type));
  if (flags != 0) return Status::InvalidArgument("frame header: reserved flags 0x" + std::to_string(flags) + " set");
  if (len > max_payload) {
    return Status::InvalidArgument("frame header: " + std::string(TypeName(static_cast<Type>(type))) + " payload of " +
                                   std::to_string(len) + " bytes exceeds the limit of " + std::to_string(max_payload));
  }
  return Header{static_cast<Type>(type), id, len};
}

void EncodeHeader(const Header& h, std::byte out[kHeaderBytes]) {
  const uint32_t magic = kMagic;
  const uint8_t version = kVersion, type = static_cast<uint8_t>(h.type);
  const uint16_t flags = 0;
  std::memcpy(out, &magic, 4);
  std::memcpy(out + 4, &version, 1);
  std::memcpy(out + 5, &type, 1);
  std::memcpy(out + 6, &flags, 2);
  std::memcpy(out + 8, &h.request_id, 4);
  std::memcpy(out + 12, &h.payload_bytes, 4);
}

std::vector<std::byte> EncodeHello(uint32_t id, const Hello& m) {
  Writer w(Type::kHello, id);
  w.U32(m.min_version);
  w.U32(m.max_version);
  w.Str(m.token);
  w.Str(m.client_name);
  return w.Finish();
}

namespace {
std::vector<std::byte> EncodeKeys(Type type, uint32_t id, const Lookup& m) {
  Writer w(type, id);
  w.U32(m.deadline_ms);
  w.Keys(m.keys);
  return w.Finish();
}
Result<Lookup> DecodeKeys(std::span<const std::byte> p, const char* what) {
  Reader r(p, what);
  Lookup m;
  (void)(r.U32(&m.deadline_ms) && r.Keys(&m.keys));
  FLATKV_RETURN_IF_ERROR(r.Done());
  return m;
}
}  // namespace

std::vector<std::byte> EncodeLookup(uint32_t id, const Lookup& m) { return EncodeKeys(Type::kLookup, id, m); }
std::vector<std::byte> EncodePrefetch(uint32_t id, const Lookup& m) { return EncodeKeys(Type::kPrefetch, id, m); }

// A put's flags byte: bit 0, a u32 first_block follows (protocol 5).
constexpr uint8_t kPutHasFirstBlock = 1;

std::vector<std::byte> EncodePutHead(uint32_t id, const Put& m, uint64_t data_bytes) {
  Writer w(Type::kPut, id);
  w.U32(m.deadline_ms);
  w.U64(m.session);
  w.U8(m.hint);
  w.U8(m.has_first_block ? kPutHasFirstBlock : 0);
  w.U16(0);
  if (m.has_first_block) w.U32(m.first_block);
  w.Keys(m.keys);
  return w.Finish(data_bytes);
}

std::vector<std::byte> EncodeRestore(uint32_t id, const Restore& m) {
  Writer w(Type::kRestore, id);
  w.U32(m.deadline_ms);
  w.U8(static_cast<uint8_t>(m.mode));
  w.U8(0);
  w.U16(0);
  w.U64(m.shm_id);
  w.U64(m.shm_offset);
  w.Keys(m.keys);
  return w.Finish();
}

std::vector<std::byte> EncodeRegisterShm(uint32_t id, const RegisterShm& m) { return EncodeU64(Type::kRegisterShm, id, m.bytes); }

std::vector<std::byte> EncodeRetain(uint32_t id, const Retain& m) {
  Writer w(Type::kRetain, id);
  w.U32(m.ttl_ms);
  w.U32(m.chain.deadline_ms);
  w.Keys(m.chain.keys);
  return w.Finish();
}

std::vector<std::byte> EncodePrune(uint32_t id, const Prune& m) {
  Writer w(Type::kPrune, id);
  w.U32(m.deadline_ms);
  w.U8(m.hint);
  w.U8(0);
  w.U16(0);
  w.U32(static_cast<uint32_t>(m.ranges.size()));
  for (const TokenRange& r : m.ranges) {
    w.U32(r.begin);
    w.U32(r.end);
  }
  w.Keys(m.keys);
  return w.Finish();
}

std::vector<std::byte> EncodePruneOk(uint32_t id, const PruneResult& m) {
  Writer w(Type::kPruneOk, id);
  w.U64(m.view_session);
  w.U32(m.logical_blocks);
  w.U32(m.kept_tokens);
  w.U32(m.view_blocks);
  w.U32(m.stored_blocks);
  return w.Finish();
}

std::vector<std::byte> EncodeTruncateSession(uint32_t id, const TruncateSession& m) {
  Writer w(Type::kTruncateSession, id);
  w.U64(m.session);
  w.U32(m.keep_blocks);
  return w.Finish();
}

std::vector<std::byte> EncodeEmpty(Type type, uint32_t id) { return Writer(type, id).Finish(); }

std::vector<std::byte> EncodeHelloOk(uint32_t id, const HelloOk& m) {
  Writer w(Type::kHelloOk, id);
  w.U32(m.version);
  w.U8(static_cast<uint8_t>(m.shape.kind));
  w.U8(static_cast<uint8_t>(m.shape.dtype));
  w.U16(0);
  w.U32(m.shape.layers);
  w.U32(m.shape.kv_heads);
  w.U32(m.shape.head_dim);
  w.U32(m.shape.latent_dim);
  w.U32(m.shape.rope_dim);
  w.U32(m.block_tokens);
  w.U64(m.block_layer_bytes);
  w.U64(m.max_frame_bytes);
  w.Str(m.tenant);
  return w.Finish();
}

std::vector<std::byte> EncodeU32(Type type, uint32_t id, uint32_t v) {
  Writer w(type, id);
  w.U32(v);
  return w.Finish();
}

std::vector<std::byte> EncodeU64(Type type, uint32_t id, uint64_t v) {
  Writer w(type, id);
  w.U64(v);
  return w.Finish();
}

std::vector<std::byte> EncodeRestoreLayerHead(uint32_t id, const RestoreLayer& m, uint64_t data_bytes) {
  Writer w(Type::kRestoreLayer, id);
  w.U32(m.layer);
  w.U32(m.first_block);
  w.U32(m.blocks);
  w.U32(m.valid);
  return w.Finish(data_bytes);
}

std::vector<std::byte> EncodeText(Type type, uint32_t id, std::string_view text) {
  Writer w(type, id);
  w.Raw(text.data(), text.size());
  return w.Finish();
}

std::vector<std::byte> EncodeError(uint32_t id, const Status& status) {
  Writer w(Type::kError, id);
  w.U32(static_cast<uint32_t>(status.code()));
  std::string_view msg = status.message();
  if (msg.size() > kMaxStringBytes) msg = msg.substr(0, kMaxStringBytes);
  w.Str(msg);
  return w.Finish();
}

Result<Hello> DecodeHello(std::span<const std::byte> p) {
  Reader r(p, "hello");
  Hello m;
  (void)(r.U32(&m.min_version) && r.U32(&m.max_version) && r.Str(&m.token) && r.Str(&m.client_name));
  FLATKV_RETURN_IF_ERROR(r.Done());
  if (m.min_version > m.max_version) {
    return Status::InvalidArgument("hello: min_version " + std::to_string(m.min_version) + " > max_version " +
                                   std::to_string(m.max_version));
  }
  return m;
}

Result<Lookup> DecodeLookup(std::span<const std::byte> p) { return DecodeKeys(p, "lookup"); }
Result<Lookup> DecodePrefetch(std::span<const std::byte> p) { return DecodeKeys(p, "prefetch"); }

Result<Retain> DecodeRetain(std::span<const std::byte> p) {
  Reader r(p, "retain");
  Retain m;
  (void)(r.U32(&m.ttl_ms) && r.U32(&m.chain.deadline_ms) && r.Keys(&m.chain.keys));
  FLATKV_RETURN_IF_ERROR(r.Done());
  return m;
}

Result<TruncateSession> DecodeTruncateSession(std::span<const std::byte> p) {
  Reader r(p, "truncate_session");
  TruncateSession m;
  (void)(r.U64(&m.session) && r.U32(&m.keep_blocks));
  FLATKV_RETURN_IF_ERROR(r.Done());
  return m;
}

namespace {
// The PutHint values the wire carries (docs/format_wire.md), one row each.
bool KnownPutHint(uint8_t hint) {
  constexpr PutHint kHints[] = {PutHint::kAuto, PutHint::kOneShot, PutHint::kHot};
  for (PutHint h : kHints)
    if (hint == static_cast<uint8_t>(h)) return true;
  return false;
}
}  // namespace

Result<Prune> DecodePrune(std::span<const std::byte> p) {
  Reader r(p, "prune");
  Prune m;
  uint8_t pad8 = 0;
  uint16_t pad16 = 0;
  uint32_t n = 0;
  if (r.U32(&m.deadline_ms) && r.U8(&m.hint) && r.U8(&pad8) && r.U16(&pad16) && r.U32(&n)) {
    if (!KnownPutHint(m.hint)) return Status::InvalidArgument("prune: unknown placement hint " + std::to_string(m.hint));
    if (pad8 != 0 || pad16 != 0) return Status::InvalidArgument("prune: reserved bytes are not 0");
    if (n > kMaxPruneRanges)
      return Status::InvalidArgument("prune: " + std::to_string(n) + " ranges exceed the limit of " + std::to_string(kMaxPruneRanges));
    m.ranges.resize(n);
    for (uint32_t i = 0; i < n && r.U32(&m.ranges[i].begin) && r.U32(&m.ranges[i].end); ++i) {
    }
    (void)r.Keys(&m.keys);
  }
  FLATKV_RETURN_IF_ERROR(r.Done());
  return m;
}

Result<PruneResult> DecodePruneOk(std::span<const std::byte> p) {
  Reader r(p, "prune_ok");
  PruneResult m;
  (void)(r.U64(&m.view_session) && r.U32(&m.logical_blocks) && r.U32(&m.kept_tokens) && r.U32(&m.view_blocks) &&
         r.U32(&m.stored_blocks));
  FLATKV_RETURN_IF_ERROR(r.Done());
  return m;
}

Result<Put> DecodePut(std::span<const std::byte> p) {
  Reader r(p, "put");
  Put m;
  uint8_t flags = 0;
  uint16_t pad16 = 0;
  if (r.U32(&m.deadline_ms) && r.U64(&m.session) && r.U8(&m.hint) && r.U8(&flags) && r.U16(&pad16)) {
    m.has_first_block = (flags & kPutHasFirstBlock) != 0;
    if ((!m.has_first_block || r.U32(&m.first_block)) && r.Keys(&m.keys)) m.data = r.Rest();
  }
  FLATKV_RETURN_IF_ERROR(r.Done());
  if (!KnownPutHint(m.hint)) return Status::InvalidArgument("put: unknown placement hint " + std::to_string(m.hint));
  if ((flags & ~kPutHasFirstBlock) != 0 || pad16 != 0) return Status::InvalidArgument("put: reserved bytes are not zero");
  return m;
}

Result<Restore> DecodeRestore(std::span<const std::byte> p) {
  Reader r(p, "restore");
  Restore m;
  uint8_t mode = 0, pad8 = 0;
  uint16_t pad16 = 0;
  (void)(r.U32(&m.deadline_ms) && r.U8(&mode) && r.U8(&pad8) && r.U16(&pad16) && r.U64(&m.shm_id) &&
         r.U64(&m.shm_offset) && r.Keys(&m.keys));
  FLATKV_RETURN_IF_ERROR(r.Done());
  if (mode > 1) return Status::InvalidArgument("restore: unknown mode " + std::to_string(mode));
  if (pad8 != 0 || pad16 != 0) return Status::InvalidArgument("restore: reserved bytes are not zero");
  m.mode = static_cast<RestoreMode>(mode);
  return m;
}

Result<RegisterShm> DecodeRegisterShm(std::span<const std::byte> p) {
  Reader r(p, "register_shm");
  RegisterShm m;
  (void)r.U64(&m.bytes);
  FLATKV_RETURN_IF_ERROR(r.Done());
  if (m.bytes == 0) return Status::InvalidArgument("register_shm: window of 0 bytes");
  return m;
}

Result<HelloOk> DecodeHelloOk(std::span<const std::byte> p) {
  Reader r(p, "hello_ok");
  HelloOk m;
  uint8_t kind = 0, dtype = 0;
  uint16_t pad = 0;
  (void)(r.U32(&m.version) && r.U8(&kind) && r.U8(&dtype) && r.U16(&pad) && r.U32(&m.shape.layers) &&
         r.U32(&m.shape.kv_heads) && r.U32(&m.shape.head_dim) && r.U32(&m.shape.latent_dim) &&
         r.U32(&m.shape.rope_dim) && r.U32(&m.block_tokens) && r.U64(&m.block_layer_bytes) &&
         r.U64(&m.max_frame_bytes) && r.Str(&m.tenant));
  FLATKV_RETURN_IF_ERROR(r.Done());
  m.shape.kind = static_cast<AttentionKind>(kind);
  m.shape.dtype = static_cast<DType>(dtype);
  FLATKV_RETURN_IF_ERROR(m.shape.Validate().WithContext("hello_ok: shape"));
  if (m.block_layer_bytes == 0) return Status::InvalidArgument("hello_ok: block_layer_bytes is 0");
  return m;
}

Result<uint32_t> DecodeU32(std::span<const std::byte> p) {
  Reader r(p, "u32 reply");
  uint32_t v = 0;
  (void)r.U32(&v);
  FLATKV_RETURN_IF_ERROR(r.Done());
  return v;
}

Result<uint64_t> DecodeU64(std::span<const std::byte> p) {
  Reader r(p, "u64 reply");
  uint64_t v = 0;
  (void)r.U64(&v);
  FLATKV_RETURN_IF_ERROR(r.Done());
  return v;
}

Result<RestoreLayer> DecodeRestoreLayer(std::span<const std::byte> p) {
  Reader r(p, "restore_layer");
  RestoreLayer m;
  if (r.U32(&m.layer) && r.U32(&m.first_block) && r.U32(&m.blocks) && r.U32(&m.valid)) m.data = r.Rest();
  FLATKV_RETURN_IF_ERROR(r.Done());
  return m;
}

Result<Error> DecodeError(std::span<const std::byte> p) {
  Reader r(p, "error");
  uint32_t code = 0;
  Error m;
  (void)(r.U32(&code) && r.Str(&m.message));
  FLATKV_RETURN_IF_ERROR(r.Done());
  if (code == 0 || code > static_cast<uint32_t>(Code::kAborted)) {
    return Status::InvalidArgument("error: unknown status code " + std::to_string(code));
  }
  m.code = static_cast<Code>(code);
  return m;
}

Status ErrorStatus(std::span<const std::byte> p) {
  auto e = DecodeError(p);
  if (!e.ok()) return Status::IoError("malformed error frame from the server: " + e.status().message());
  return Status(e->code, e->message);
}

Status ValidateRequest(Type type, std::span<const std::byte> p) {
  switch (type) {
    case Type::kHello: return DecodeHello(p).status();
    case Type::kLookup: return DecodeLookup(p).status();
    case Type::kPut: return DecodePut(p).status();
    case Type::kRestore: return DecodeRestore(p).status();
    case Type::kRegisterShm: return DecodeRegisterShm(p).status();
    case Type::kStats:
    case Type::kPing:
      return p.empty() ? Status::Ok() : Status::InvalidArgument(std::string(TypeName(type)) + ": payload must be empty");
    case Type::kDropSession: return DecodeU64(p).status();
    case Type::kPrefetch: return DecodePrefetch(p).status();
    case Type::kRetain: return DecodeRetain(p).status();
    case Type::kTruncateSession: return DecodeTruncateSession(p).status();
    case Type::kPrune: return DecodePrune(p).status();
    default:
      return Status::InvalidArgument("frame type " + std::string(TypeName(type)) + " is not a request");
  }
}

}  // namespace flatkv::service::wire
