// The wire protocol between `flatkv serve` and its clients, version 1
// (docs/format_wire.md): frames of a 16-byte header and a payload, all
// integers little-endian. This file only encodes and decodes; it does no
// I/O. Decoders check every length against the bytes present and the
// limits below, and reject what they do not understand with a Status naming
// the field and value.
//
// Thread-safety: free functions on values; no shared state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flatkv/keys.h"
#include "flatkv/prune.h"
#include "flatkv/shape.h"
#include "flatkv/status.h"

namespace flatkv::service::wire {

inline constexpr uint32_t kMagic = 0x31564B46;  // "FKV1" as little-endian bytes
inline constexpr uint8_t kVersion = 1;  // the frame format (every frame's header)
// Protocol versions, negotiated by hello: 1 the first set of requests; 2
// adds drop_session; 3 adds prefetch; 4 adds retain and truncate_session;
// 5 adds a put's first_block; 6 adds prune.
// A request newer than the connection's version is answered NotSupported
// naming the version it needs.
inline constexpr uint32_t kMinProtocol = 1, kMaxProtocol = 6;
// The most token ranges one prune may name.
inline constexpr uint32_t kMaxPruneRanges = 1u << 16;
inline constexpr size_t kHeaderBytes = 16;
// The most keys one request may carry, and the longest token or name.
inline constexpr uint32_t kMaxKeys = 1u << 20;
inline constexpr uint32_t kMaxStringBytes = 4096;
// Default frame payload limit (the daemon's limits.max_frame_bytes).
inline constexpr uint64_t kDefaultMaxFrameBytes = 64ull << 20;

enum class Type : uint8_t {
  // client -> server
  kHello = 1,
  kLookup = 2,
  kPut = 3,
  kRestore = 4,
  kRegisterShm = 5,  // carries a memfd as SCM_RIGHTS ancillary data
  kStats = 6,
  kPing = 7,
  kRetain = 8,           // protocol 4: u32 ttl_ms, then a Lookup's payload
  kTruncateSession = 9,  // protocol 4: u64 session, u32 keep_blocks
  // 10 is unassigned (an unknown type).
  kDropSession = 11,  // protocol 2
  kPrefetch = 12,     // protocol 3: a Lookup's payload
  kPrune = 13,        // protocol 6: u32 deadline_ms, u8 hint, u8 0, u16 0, u32 n, n x (u32 begin, u32 end), keys
  // server -> client
  kHelloOk = 64,
  kLookupOk = 65,
  kPutOk = 66,
  kRestoreBegin = 67,
  kRestoreLayer = 68,
  kRestoreEnd = 69,
  kShmOk = 70,
  kStatsOk = 71,
  kPong = 72,
  kDropSessionOk = 73,  // protocol 2
  kPrefetchOk = 74,     // protocol 3: u32, the leading blocks found
  kRetainOk = 75,       // protocol 4: u32, the leading blocks retained
  kTruncateSessionOk = 76,  // protocol 4: u32, the blocks released
  kPruneOk = 77,            // protocol 6: a PruneResult
  kError = 127,
};
std::string_view TypeName(Type t);
bool IsRequest(Type t);

struct Header {
  Type type = Type::kError;
  uint32_t request_id = 0;
  uint32_t payload_bytes = 0;
};

// Parses a header; `max_payload` is the receiver's frame limit.
Result<Header> ParseHeader(std::span<const std::byte> bytes, uint64_t max_payload);
void EncodeHeader(const Header& h, std::byte out[kHeaderBytes]);

// --- requests ---
struct Hello {
  uint32_t min_version = kMinProtocol, max_version = kMaxProtocol;
  std::string token;
  std::string client_name;
};
struct Lookup {
  uint32_t deadline_ms = 0;  // 0: the server's default
  std::vector<BlockKey> keys;
};
struct Put {
  uint32_t deadline_ms = 0;
  uint64_t session = 0;
  uint8_t hint = 0;  // PutHint
  // Protocol 5: the chain position of keys[0] (PutOptions::first_block),
  // sent only when known.
  bool has_first_block = false;
  uint32_t first_block = 0;
  std::vector<BlockKey> keys;
  std::span<const std::byte> data;  // points into the decoded payload
};
enum class RestoreMode : uint8_t { kStream = 0, kShm = 1 };
struct Restore {
  uint32_t deadline_ms = 0;
  RestoreMode mode = RestoreMode::kStream;
  uint64_t shm_id = 0;      // kShm only
  uint64_t shm_offset = 0;  // kShm only
  std::vector<BlockKey> keys;
};
struct RegisterShm {
  uint64_t bytes = 0;
};
struct Retain {
  uint32_t ttl_ms = 0;  // 0: release
  Lookup chain;
};
struct TruncateSession {
  uint64_t session = 0;
  uint32_t keep_blocks = 0;
};
struct Prune {  // Store::Prune
  uint32_t deadline_ms = 0;
  uint8_t hint = 0;  // PutHint of the view's blocks
  std::vector<TokenRange> ranges;
  std::vector<BlockKey> keys;  // the logical chain
};

// --- replies ---
struct HelloOk {
  uint32_t version = kMaxProtocol;  // the negotiated protocol version
  KvShape shape;
  uint32_t block_tokens = 0;
  uint64_t block_layer_bytes = 0;
  uint64_t max_frame_bytes = 0;
  std::string tenant;
};
struct RestoreLayer {  // followed, in stream mode, by blocks * block_layer_bytes bytes
  uint32_t layer = 0;
  uint32_t first_block = 0;
  uint32_t blocks = 0;  // slices in this frame (stream) or valid in the layer (shm)
  uint32_t valid = 0;   // blocks valid in this layer so far
  std::span<const std::byte> data;
};
struct Error {
  Code code = Code::kIoError;
  std::string message;
};

// Each Encode* returns a whole frame (header + payload). Put and
// RestoreLayer data are appended by the caller where it wants zero copies:
// EncodePutHead / EncodeRestoreLayerHead return the frame without the data,
// with payload_bytes already counting it.
std::vector<std::byte> EncodeHello(uint32_t id, const Hello& m);
std::vector<std::byte> EncodeLookup(uint32_t id, const Lookup& m);
std::vector<std::byte> EncodePrefetch(uint32_t id, const Lookup& m);  // a Lookup's payload
std::vector<std::byte> EncodePutHead(uint32_t id, const Put& m, uint64_t data_bytes);
std::vector<std::byte> EncodeRestore(uint32_t id, const Restore& m);
std::vector<std::byte> EncodeRegisterShm(uint32_t id, const RegisterShm& m);
std::vector<std::byte> EncodeRetain(uint32_t id, const Retain& m);
std::vector<std::byte> EncodeTruncateSession(uint32_t id, const TruncateSession& m);
std::vector<std::byte> EncodePrune(uint32_t id, const Prune& m);
std::vector<std::byte> EncodePruneOk(uint32_t id, const PruneResult& m);
std::vector<std::byte> EncodeEmpty(Type type, uint32_t id);  // Stats, Ping, Pong
std::vector<std::byte> EncodeHelloOk(uint32_t id, const HelloOk& m);
std::vector<std::byte> EncodeU32(Type type, uint32_t id, uint32_t v);  // LookupOk, PutOk, RestoreBegin, RestoreEnd
std::vector<std::byte> EncodeU64(Type type, uint32_t id, uint64_t v);  // ShmOk, DropSession
std::vector<std::byte> EncodeRestoreLayerHead(uint32_t id, const RestoreLayer& m, uint64_t data_bytes);
std::vector<std::byte> EncodeText(Type type, uint32_t id, std::string_view text);  // StatsOk
std::vector<std::byte> EncodeError(uint32_t id, const Status& status);

Result<Hello> DecodeHello(std::span<const std::byte> p);
Result<Lookup> DecodeLookup(std::span<const std::byte> p);
Result<Lookup> DecodePrefetch(std::span<const std::byte> p);
Result<Put> DecodePut(std::span<const std::byte> p);
Result<Restore> DecodeRestore(std::span<const std::byte> p);
Result<RegisterShm> DecodeRegisterShm(std::span<const std::byte> p);
Result<Retain> DecodeRetain(std::span<const std::byte> p);
Result<TruncateSession> DecodeTruncateSession(std::span<const std::byte> p);
Result<Prune> DecodePrune(std::span<const std::byte> p);
Result<PruneResult> DecodePruneOk(std::span<const std::byte> p);
Result<HelloOk> DecodeHelloOk(std::span<const std::byte> p);
Result<uint32_t> DecodeU32(std::span<const std::byte> p);
Result<uint64_t> DecodeU64(std::span<const std::byte> p);
Result<RestoreLayer> DecodeRestoreLayer(std::span<const std::byte> p);
Result<Error> DecodeError(std::span<const std::byte> p);
// An Error frame's payload as a Status (never OK).
Status ErrorStatus(std::span<const std::byte> p);
// Checks a request payload decodes as its type says (what the server does
// before dispatching); used by the fuzz target.
Status ValidateRequest(Type type, std::span<const std::byte> payload);

}  // namespace flatkv::service::wire
