// The crash harness's expected state (docs/crashtest.md): the workload's
// deterministic keys and payloads, the append-only log a worker writes as
// puts are acknowledged, and the rules that decide which logged blocks a
// restarted store must still serve.
//
// Payloads are a function of the key alone, so any block can be checked
// byte for byte without remembering its data. The log is written with one
// O_APPEND write() per operation, after the store acknowledged it (puts,
// reuses) or before it is issued (drops), so that it survives kill -9: a
// logged put was acknowledged; an acknowledged put that was not yet logged
// when the process died is simply not checked.
//
// Thread-safety: ExpectedLog::Append may be called from many threads; the
// free functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "flatkv/keys.h"
#include "flatkv/options.h"
#include "flatkv/shape.h"
#include "flatkv/status.h"

namespace flatkv::tools::crashtest {

// The KV geometry every crashtest store uses: 2 layers of 128 KiB slices
// (64 tokens of 4 f16 KV heads of 128), so an SSD extent (2 MiB run per
// layer) holds 16 blocks and a DRAM extent (256 KiB) 2.
KvShape Shape();
inline constexpr uint32_t kBlockTokens = 64;
// A session never grows beyond this many blocks (one SSD extent).
inline constexpr uint32_t kMaxSessionBlocks = 16;
// Shared "system prompt" chains sessions start from.
inline constexpr uint32_t kSystemPrompts = 4;

// Keys of `own_blocks` blocks continuing `prefix` for chain `chain_id`
// (a session id, or kSystemPromptChain + r for system prompt r).
inline constexpr uint64_t kSystemPromptChain = 1ull << 62;
std::vector<BlockKey> ContinueChain(std::span<const BlockKey> prefix, uint64_t chain_id, uint32_t first_index,
                                    uint32_t own_blocks);
// The payload of the block with `key`: `bytes` deterministic bytes.
void FillPayload(const BlockKey& key, std::span<std::byte> out);
// Whether `got` is the payload of `key`.
bool PayloadMatches(const BlockKey& key, std::span<const std::byte> got);
// The payloads of `keys`, `block_bytes` each, back to back (a put's data).
std::vector<std::byte> Payloads(std::span<const BlockKey> keys, uint64_t block_bytes);

enum class RecordType : uint8_t {
  kPut = 1,    // a block of `session` was acknowledged (aux: chain index | kOwnBit)
  kDrop = 2,   // DropSession(session) is about to be issued
  kReuse = 3,  // a restore of `session`'s chain hit blocks the session itself put
  kWrong = 4,  // a worker's restore served wrong bytes for `key`
};
inline constexpr uint64_t kOwnBit = 1ull << 63;  // the block was first put by this session (not a shared prefix)

struct Record {
  RecordType type = RecordType::kPut;
  uint64_t session = 0;
  BlockKey key;
  uint64_t aux = 0;
};

// The log file. Records are 40 bytes, each with its own checksum; reading
// stops at the first record that is short or fails its checksum (a write
// cut by the kill), which only means fewer blocks are checked.
class ExpectedLog {
 public:
  static Result<ExpectedLog> Open(const std::string& path);
  ExpectedLog(ExpectedLog&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  ExpectedLog& operator=(ExpectedLog&&) = delete;
  ~ExpectedLog();
  // One write() for all of `records`.
  Status Append(std::span<const Record> records);

  // Every valid record of `path` in file order; `*ignored_bytes` gets the
  // bytes after the last valid record.
  static Result<std::vector<Record>> ReadAll(const std::string& path, uint64_t* ignored_bytes);

 private:
  explicit ExpectedLog(int fd) : fd_(fd) {}
  int fd_ = -1;
};

// Which logged blocks a restarted store must serve (docs/crashtest.md).
struct Contract {
  // SsdAdmission::kAll: every acknowledged block. kOnReuse: only blocks a
  // session put itself after a restore had reused that session.
  SsdAdmission admission = SsdAdmission::kAll;
  // Off (the weaker rule, for a store whose DropSession frees the extents
  // that hold a block even when a live session shares it): a block is
  // required only while no session that put it was dropped. On (today's
  // store, which references shared blocks): a block is required while any
  // session that put it is live.
  bool shared_refcount = false;
};

struct BlockExpectation {
  BlockKey key;
  bool required = false;  // must be served; otherwise, if served, it must still be right
};

// The blocks to check, each once, in log order.
std::vector<BlockExpectation> Expectations(const std::vector<Record>& log, const Contract& contract);

// Record counts of `log`, and the sessions that put blocks and were never dropped (in log order).
struct LogSummary {
  uint64_t puts = 0, drops = 0, reuses = 0, wrong_in_worker = 0;
  std::vector<uint64_t> live_sessions;  // put, never dropped
};
LogSummary Summarize(const std::vector<Record>& log);

// Session ids: incarnation (the kill round a worker runs in) in the high
// 32 bits, then thread, then a counter.
inline uint64_t MakeSession(uint32_t incarnation, uint32_t thread, uint32_t n) {
  return (uint64_t{incarnation} << 32) | (uint64_t{thread & 0xFF} << 24) | (n & 0xFFFFFF);
}
inline uint32_t SessionIncarnation(uint64_t session) { return static_cast<uint32_t>(session >> 32); }

}  // namespace flatkv::tools::crashtest
