// Tenants: authentication, namespace salting and capacity quotas.
//
// Every key and session id a client sends is mapped into its tenant's own
// key space before the store sees it: salted = AES-128_K(key), with K a
// per-tenant 128-bit secret the daemon derives itself,
//   K = SHA-256("flatkv tenant salt v1" 0 name 0 secret)[0..16),
// where `secret` is the tenant's configured `salt` or, without one, its
// token. AES is a keyed pseudo-random permutation: without K no one can
// compute or invert a tenant's salted keys, so whatever hashes tenant B
// sends, they map to keys unrelated to A's (a collision is a 2^-128
// accident), and A's cached blocks are, for B, ordinary misses on the same
// code path as keys never stored. Rotating a token without a fixed `salt`
// makes that tenant's stored blocks unreachable (they age out).
//
// Quotas: a tenant's usage is the bytes its puts wrote (blocks not already
// present at the start of the put), per session. A put that would exceed
// the quota first drops the tenant's least recently used other sessions
// (Store::DropSession); if that cannot make room, it fails with NoSpace.
// Usage is an upper bound: blocks the store evicted on its own still count
// until their session is dropped.
//
// Thread-safety: TenantRegistry is thread-safe. A KeySalter is used by one
// thread (one per connection).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "flatkv/keys.h"
#include "flatkv/status.h"

typedef struct evp_cipher_ctx_st EVP_CIPHER_CTX;

namespace flatkv::service {

struct TenantConfig {
  std::string name;          // shown in metrics; [A-Za-z0-9_.-], 1..64 chars
  std::string token;         // what the client presents; at least 16 chars unless the tenant is the implicit default
  std::string salt;          // optional: the namespace secret (default: the token)
  uint64_t quota_bytes = 0;  // 0: no quota beyond the store's capacity
};

struct Tenant {
  uint32_t index = 0;
  std::string name;
  uint64_t quota_bytes = 0;
  std::array<uint8_t, 16> key{};        // the AES-128 namespace key
  std::array<uint8_t, 32> token_hash{}; // SHA-256 of the token
};

// Maps a tenant's keys and session ids into its namespace.
class KeySalter {
 public:
  static Result<std::unique_ptr<KeySalter>> Make(const Tenant& tenant);
  ~KeySalter();
  KeySalter(const KeySalter&) = delete;
  KeySalter& operator=(const KeySalter&) = delete;

  Status SaltKeys(std::span<const BlockKey> in, std::vector<BlockKey>* out);
  Result<uint64_t> SaltSession(uint64_t session);

 private:
  KeySalter() = default;
  EVP_CIPHER_CTX* ctx_ = nullptr;
};

class TenantRegistry {
 public:
  // Validates names, token lengths and uniqueness. With no tenants, one
  // "default" tenant accepts the empty token (fine behind loopback-only
  // addresses; configure tenants for anything else).
  static Result<std::unique_ptr<TenantRegistry>> Make(const std::vector<TenantConfig>& configs);

  // The tenant whose token this is (constant-time comparison), or
  // PermissionDenied.
  Result<const Tenant*> Authenticate(const std::string& token) const;
  const std::vector<Tenant>& tenants() const { return tenants_; }

  // Charges `bytes` to `session` of `tenant` before a put. `drop` drops a
  // (salted) session from the store; it is called without the registry's
  // lock. NoSpace when even dropping every other session leaves too little.
  Status Charge(const Tenant& tenant, uint64_t session, uint64_t bytes,
                const std::function<Status(uint64_t session)>& drop) FLATKV_EXCLUDES(mu_);
  // Gives back the part of a charge that a failed put did not store.
  void Refund(const Tenant& tenant, uint64_t session, uint64_t bytes) FLATKV_EXCLUDES(mu_);
  uint64_t UsedBytes(const Tenant& tenant) const FLATKV_EXCLUDES(mu_);
  // Forgets a (salted) session the tenant dropped: its charged bytes are
  // no longer used. Returns them (0 for a session it never charged).
  uint64_t Release(const Tenant& tenant, uint64_t session) FLATKV_EXCLUDES(mu_);

  // Bytes of blocks the tenant's restores in flight hold (pin) in the
  // store. Pin fails with NoSpace when `bytes` more would pass `limit`
  // (0: none); every successful Pin is paired with one Unpin.
  Status Pin(const Tenant& tenant, uint64_t bytes, uint64_t limit) FLATKV_EXCLUDES(mu_);
  void Unpin(const Tenant& tenant, uint64_t bytes) FLATKV_EXCLUDES(mu_);
  uint64_t PinnedBytes(const Tenant& tenant) const FLATKV_EXCLUDES(mu_);
  // Retains (Store::Retain) share that budget: a retain of the chain that
  // begins with `head` asks for `bytes` until `until`, replacing the
  // tenant's earlier retain of that chain. Returns the bytes granted: at
  // most what the limit leaves beside the restores in flight and the
  // tenant's other unexpired retains (0 releases the chain's). Expired
  // retains stop counting.
  uint64_t Retain(const Tenant& tenant, const BlockKey& head, uint64_t bytes, std::chrono::steady_clock::time_point until,
                  uint64_t limit) FLATKV_EXCLUDES(mu_);
  uint64_t RetainedBytes(const Tenant& tenant) const FLATKV_EXCLUDES(mu_);
  uint64_t DroppedSessions(const Tenant& tenant) const FLATKV_EXCLUDES(mu_);

 private:
  struct SessionUse {
    uint64_t bytes = 0;
    uint64_t last_use = 0;  // a logical clock
  };
  struct Retained {
    uint64_t bytes = 0;
    std::chrono::steady_clock::time_point until;
  };
  struct Usage {
    uint64_t used = 0;
    uint64_t pinned = 0;
    std::unordered_map<BlockKey, Retained, BlockKeyHash> retains;  // by the chain's first key
    uint64_t dropped_sessions = 0;
    std::unordered_map<uint64_t, SessionUse> sessions;
  };
  std::vector<Tenant> tenants_;
  // Bytes of `u`'s unexpired retains at `now`, dropping the expired.
  static uint64_t LiveRetained(Usage& u, std::chrono::steady_clock::time_point now);
  mutable Mutex mu_;
  std::vector<Usage> usage_ FLATKV_GUARDED_BY(mu_);
  uint64_t tick_ FLATKV_GUARDED_BY(mu_) = 0;
};

}  // namespace flatkv::service
