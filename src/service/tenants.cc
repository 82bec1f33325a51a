#include "service/tenants.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cstring>

namespace flatkv::service {
namespace {

std::array<uint8_t, 32> Sha256(std::string_view a) {
  std::array<uint8_t, 32> out{};
  unsigned int len = 0;
  EVP_Digest(a.data(), a.size(), out.data(), &len, EVP_sha256(), nullptr);
  return out;
}

bool ValidName(const std::string& n) {
  if (n.empty() || n.size() > 64) return false;
  return std::all_of(n.begin(), n.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.';
  });
}

}  // namespace

Result<std::unique_ptr<KeySalter>> KeySalter::Make(const Tenant& tenant) {
  std::unique_ptr<KeySalter> s(new KeySalter());
  s->ctx_ = EVP_CIPHER_CTX_new();
  if (!s->ctx_ || EVP_EncryptInit_ex(s->ctx_, EVP_aes_128_ecb(), nullptr, tenant.key.data(), nullptr) != 1) {
    return Status::NotSupported("tenant " + tenant.name + ": initializing AES-128 failed");
  }
  EVP_CIPHER_CTX_set_padding(s->ctx_, 0);
  return s;
}

KeySalter::~KeySalter() {
  if (ctx_) EVP_CIPHER_CTX_free(ctx_);
}

Status KeySalter::SaltKeys(std::span<const BlockKey> in, std::vector<BlockKey>* out) {
  static_assert(sizeof(BlockKey) == 16);
  out->resize(in.size());
  if (in.empty()) return Status::Ok();
  // ECB over independent 16-byte blocks: each key is encrypted on its own.
  int len = 0;
  if (EVP_EncryptUpdate(ctx_, reinterpret_cast<unsigned char*>(out->data()), &len,
                        reinterpret_cast<const unsigned char*>(in.data()), static_cast<int>(in.size() * 16)) != 1 ||
      static_cast<size_t>(len) != in.size() * 16) {
    return Status::NotSupported("salting " + std::to_string(in.size()) + " keys failed");
  }
  return Status::Ok();
}

Result<uint64_t> KeySalter::SaltSession(uint64_t session) {
  // A key-shaped block of its own domain, so no session id equals a salted key.
  BlockKey in{session, 0x53455353494F4E31ull /* "SESSION1" */}, out;
  std::vector<BlockKey> salted;
  FLATKV_RETURN_IF_ERROR(SaltKeys({&in, 1}, &salted));
  out = salted[0];
  return out.lo;
}

Result<std::unique_ptr<TenantRegistry>> TenantRegistry::Make(const std::vector<TenantConfig>& configs_in) {
  std::vector<TenantConfig> configs = configs_in;
  const bool implicit = configs.empty();
  if (implicit) configs.push_back({"default", "", "", 0});
  auto reg = std::unique_ptr<TenantRegistry>(new TenantRegistry());
  for (size_t i = 0; i < configs.size(); ++i) {
    const TenantConfig& c = configs[i];
    const std::string where = "tenant " + std::to_string(i) + " ('" + c.name + "')";
    if (!ValidName(c.name)) return Status::InvalidArgument(where + ": name must be 1..64 of [A-Za-z0-9_.-]");
    if (!implicit && c.token.size() < 16) {
      return Status::InvalidArgument(where + ": token of " + std::to_string(c.token.size()) +
                                     " characters is too short (at least 16)");
    }
    Tenant t;
    t.index = static_cast<uint32_t>(i);
    t.name = c.name;
    t.quota_bytes = c.quota_bytes;
    t.token_hash = Sha256(c.token);
    std::string material = "flatkv tenant salt v1";
    material.push_back('\0');
    material += c.name;
    material.push_back('\0');
    material += c.salt.empty() ? c.token : c.salt;
    const auto digest = Sha256(material);
    std::memcpy(t.key.data(), digest.data(), 16);
    for (const Tenant& other : reg->tenants_) {
      if (other.name == t.name) return Status::InvalidArgument(where + ": duplicate tenant name");
      if (other.token_hash == t.token_hash) return Status::InvalidArgument(where + ": token already used by tenant '" + other.name + "'");
    }
    reg->tenants_.push_back(std::move(t));
  }
  MutexLock lock(&reg->mu_);
  reg->usage_.resize(reg->tenants_.size());
  return reg;
}

Result<const Tenant*> TenantRegistry::Authenticate(const std::string& token) const {
  const auto h = Sha256(token);
  const Tenant* found = nullptr;
  for (const Tenant& t : tenants_) {  // no early exit: the time does not depend on which tenant matched
    if (CRYPTO_memcmp(h.data(), t.token_hash.data(), h.size()) == 0) found = &t;
  }
  if (!found) return Status::PermissionDenied("unknown tenant token");
  return found;
}

Status TenantRegistry::Charge(const Tenant& tenant, uint64_t session, uint64_t bytes,
                              const std::function<Status(uint64_t session)>& drop) {
  if (tenant.quota_bytes != 0 && bytes > tenant.quota_bytes) {
    return Status::NoSpace("tenant " + tenant.name + ": a put of " + std::to_string(bytes) + " bytes exceeds its quota of " +
                           std::to_string(tenant.quota_bytes));
  }
  for (;;) {
    uint64_t victim = 0;
    {
      MutexLock lock(&mu_);
      Usage& u = usage_[tenant.index];
      if (tenant.quota_bytes == 0 || u.used + bytes <= tenant.quota_bytes) {
        SessionUse& s = u.sessions[session];
        s.bytes += bytes;
        s.last_use = ++tick_;
        u.used += bytes;
        return Status::Ok();
      }
      bool any = false;
      uint64_t oldest = UINT64_MAX;
      for (const auto& [id, s] : u.sessions) {
        if (id != session && s.last_use < oldest) {
          oldest = s.last_use;
          victim = id;
          any = true;
        }
      }
      if (!any) {
        return Status::NoSpace("tenant " + tenant.name + ": quota of " + std::to_string(tenant.quota_bytes) + " bytes holds " +
                               std::to_string(u.used) + " in this session; " + std::to_string(bytes) + " more do not fit");
      }
      u.used -= u.sessions[victim].bytes;
      u.sessions.erase(victim);
      ++u.dropped_sessions;
    }
    FLATKV_RETURN_IF_ERROR(drop(victim).WithContext("tenant " + tenant.name + ": dropping a session over quota"));
  }
}

void TenantRegistry::Refund(const Tenant& tenant, uint64_t session, uint64_t bytes) {
  MutexLock lock(&mu_);
  Usage& u = usage_[tenant.index];
  auto it = u.sessions.find(session);
  if (it == u.sessions.end()) return;
  const uint64_t back = std::min(bytes, it->second.bytes);
  it->second.bytes -= back;
  u.used -= back;
}

Status TenantRegistry::Pin(const Tenant& tenant, uint64_t bytes, uint64_t limit) {
  MutexLock lock(&mu_);
  Usage& u = usage_[tenant.index];
  if (limit != 0 && (bytes > limit || u.pinned > limit - bytes)) {
    return Status::NoSpace("tenant " + tenant.name + ": restores in flight hold " + std::to_string(u.pinned) + " bytes; " +
                           std::to_string(bytes) + " more exceed limits.tenant_pinned_bytes = " + std::to_string(limit));
  }
  u.pinned += bytes;
  return Status::Ok();
}

void TenantRegistry::Unpin(const Tenant& tenant, uint64_t bytes) {
  MutexLock lock(&mu_);
  Usage& u = usage_[tenant.index];
  u.pinned -= std::min(bytes, u.pinned);
}

uint64_t TenantRegistry::LiveRetained(Usage& u, std::chrono::steady_clock::time_point now) {
  uint64_t live = 0;
  for (auto it = u.retains.begin(); it != u.retains.end();) {
    if (it->second.until <= now) {
      it = u.retains.erase(it);
    } else {
      live += it->second.bytes;
      ++it;
    }
  }
  return live;
}

uint64_t TenantRegistry::Retain(const Tenant& tenant, const BlockKey& head, uint64_t bytes,
                                std::chrono::steady_clock::time_point until, uint64_t limit) {
  MutexLock lock(&mu_);
  Usage& u = usage_[tenant.index];
  u.retains.erase(head);
  if (bytes == 0) return 0;
  const uint64_t held = LiveRetained(u, std::chrono::steady_clock::now()) + u.pinned;
  const uint64_t granted = limit == 0 ? bytes : std::min(bytes, limit > held ? limit - held : 0);
  if (granted > 0) u.retains[head] = {granted, until};
  return granted;
}

uint64_t TenantRegistry::RetainedBytes(const Tenant& tenant) const {
  MutexLock lock(&mu_);
  uint64_t live = 0;
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [head, r] : usage_[tenant.index].retains)
    if (r.until > now) live += r.bytes;
  return live;
}

uint64_t TenantRegistry::PinnedBytes(const Tenant& tenant) const {
  MutexLock lock(&mu_);
  return usage_[tenant.index].pinned;
}

uint64_t TenantRegistry::UsedBytes(const Tenant& tenant) const {
  MutexLock lock(&mu_);
  return usage_[tenant.index].used;
}

uint64_t TenantRegistry::Release(const Tenant& tenant, uint64_t session) {
  MutexLock lock(&mu_);
  Usage& u = usage_[tenant.index];
  auto it = u.sessions.find(session);
  if (it == u.sessions.end()) return 0;
  const uint64_t bytes = it->second.bytes;
  u.used -= std::min(u.used, bytes);
  u.sessions.erase(it);
  return bytes;
}

uint64_t TenantRegistry::DroppedSessions(const Tenant& tenant) const {
  MutexLock lock(&mu_);
  return usage_[tenant.index].dropped_sessions;
}

}  // namespace flatkv::service
