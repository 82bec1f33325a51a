// Private helpers shared by the trace readers (trace*.cc): the per-format
// parsers, error wording, and the block-id mixer. Not part of trace.h.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "flatkv/status.h"
#include "replay/trace.h"

namespace flatkv::replay::internal {

// Largest decompressed trace accepted (a guard against gzip bombs).
inline constexpr uint64_t kMaxTraceBytes = uint64_t{1} << 30;  // 1 GiB

// Each parser reads one whole (already decompressed) file. `name` prefixes
// every error. The returned trace is sorted by arrival.
Result<Trace> ParseClaudeCode(std::string_view text, const std::string& name);
Result<Trace> ParseMooncake(std::string_view text, const std::string& name);
Result<Trace> ParseGeneric(std::string_view text, const std::string& name);

// Inflates a gzip stream (several members allowed, as gzip(1) writes them).
// Errors: truncated or corrupt data, trailing garbage, or more than `limit`
// bytes of output.
Result<std::string> Gunzip(std::string_view bytes, const std::string& name, uint64_t limit = kMaxTraceBytes);

// JSONL: calls `fn(line_number, line)` for each line that is not blank
// (1-based numbers; a trailing '\r' is dropped). Stops at the first error.
template <typename Fn>
Status ForEachLine(std::string_view text, Fn&& fn) {
  uint64_t number = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    Status s = fn(number, line);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

// One JSONL line parsed as a JSON object; `where` is "file:line".
Status ParseJsonObject(std::string_view line, const std::string& where, nlohmann::json* out);
// Field readers: "where: missing field key" when absent and required (then
// `*present` says whether it was there), "where: field key: ..." when the
// value has the wrong type, is negative, or is out of range.
Status GetUint(const nlohmann::json& obj, const char* key, uint64_t max, const std::string& where, uint64_t* out,
               bool* present = nullptr);
Status GetTime(const nlohmann::json& obj, const char* key, const std::string& where, double* out);
Status GetBlockIds(const nlohmann::json& obj, const char* key, const std::string& where, std::vector<uint64_t>* out);

// A bijection on 64-bit integers (the splitmix64 finaliser): distinct inputs
// give distinct outputs.
inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// A block id `id` from id space `space` made unique across spaces. Exactly
// injective while both are below 2^32 (then it is Mix64 of the pair); wider
// values fall back to a hash, where a collision has odds near 2^-64 per pair.
inline uint64_t NamespacedId(uint64_t space, uint64_t id) {
  if ((space >> 32) == 0 && (id >> 32) == 0) return Mix64((space << 32) | id);
  return Mix64(id ^ Mix64(space ^ 0x6a09e667f3bcc909ULL) ^ 0xffffffff00000000ULL);
}

// 1-based line and column of byte `offset` in `text`.
struct LineCol {
  uint64_t line = 1;
  uint64_t column = 1;
};
LineCol LocateOffset(std::string_view text, uint64_t offset);

// Strips nlohmann's "[json.exception.parse_error.101] parse error at line 1,
// column 2: " prefix, keeping the description.
std::string JsonErrorDescription(std::string_view what);

// Sorts by arrival, keeping the file order of equal arrivals.
void SortByArrival(std::vector<Request>* requests);

// Whether `blocks` block ids fit `input_tokens` (at most one id per started
// block of `block_tokens`).
inline bool BlocksFit(uint64_t blocks, uint64_t input_tokens, uint64_t block_tokens) {
  return blocks <= (input_tokens + block_tokens - 1) / block_tokens;
}

}  // namespace flatkv::replay::internal
