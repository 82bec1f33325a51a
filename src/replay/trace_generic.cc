// The generic JSONL trace reader (flatkv's own form, version 1): a header
// line {"flatkv_trace": 1, "block_tokens": N}, then one request per line.
// Format: docs/format_trace.md.
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <utility>

#include "replay/trace_internal.h"

namespace flatkv::replay::internal {
namespace {

constexpr uint64_t kGenericVersion = 1;
constexpr uint64_t kMaxBlockTokens = uint64_t{1} << 20;

}  // namespace

Result<Trace> ParseGeneric(std::string_view text, const std::string& name) {
  Trace trace;
  trace.name = name;
  bool have_header = false;
  nlohmann::json obj;
  struct Seen {
    uint64_t parent;
    uint64_t line;
  };
  std::unordered_map<uint64_t, Seen> conversations;
  constexpr uint64_t kU32 = std::numeric_limits<uint32_t>::max();
  Status s = ForEachLine(text, [&](uint64_t line, std::string_view body) -> Status {
    const std::string where = name + ":" + std::to_string(line);
    FLATKV_RETURN_IF_ERROR(ParseJsonObject(body, where, &obj));
    if (!have_header) {
      uint64_t version = 0, block_tokens = 0;
      bool present = false;
      FLATKV_RETURN_IF_ERROR(GetUint(obj, "flatkv_trace", kU32, where, &version, &present));
      if (!present) {
        return Status::InvalidArgument(where + ": missing header line {\"flatkv_trace\": 1, \"block_tokens\": N}");
      }
      if (version != kGenericVersion) {
        return Status::NotSupported(where + ": flatkv_trace version " + std::to_string(version) +
                                    " is not supported (this reader knows version " + std::to_string(kGenericVersion) +
                                    ")");
      }
      FLATKV_RETURN_IF_ERROR(GetUint(obj, "block_tokens", kMaxBlockTokens, where, &block_tokens));
      if (block_tokens == 0) return Status::InvalidArgument(where + ": field block_tokens is 0");
      trace.block_tokens = static_cast<uint32_t>(block_tokens);
      have_header = true;
      return Status::Ok();
    }
    if (obj.contains("flatkv_trace")) {
      return Status::InvalidArgument(where + ": a second header line (the header must come once, first)");
    }
    Request r;
    uint64_t in = 0, out = 0;
    bool has_parent = false;
    FLATKV_RETURN_IF_ERROR(GetTime(obj, "arrival_s", where, &r.arrival_s));
    FLATKV_RETURN_IF_ERROR(GetUint(obj, "conversation", std::numeric_limits<uint64_t>::max(), where, &r.conversation));
    if (r.conversation == 0) return Status::InvalidArgument(where + ": field conversation is 0 (ids start at 1)");
    FLATKV_RETURN_IF_ERROR(GetUint(obj, "parent", std::numeric_limits<uint64_t>::max(), where, &r.parent, &has_parent));
    if (r.parent == r.conversation) {
      return Status::InvalidArgument(where + ": conversation " + std::to_string(r.conversation) + " is its own parent");
    }
    FLATKV_RETURN_IF_ERROR(GetUint(obj, "input_tokens", kU32, where, &in));
    FLATKV_RETURN_IF_ERROR(GetUint(obj, "output_tokens", kU32, where, &out));
    FLATKV_RETURN_IF_ERROR(GetBlockIds(obj, "blocks", where, &r.blocks));
    if (!BlocksFit(r.blocks.size(), in, trace.block_tokens)) {
      return Status::InvalidArgument(where + ": blocks has " + std::to_string(r.blocks.size()) +
                                     " ids but input_tokens = " + std::to_string(in) + " allows at most " +
                                     std::to_string((in + trace.block_tokens - 1) / trace.block_tokens));
    }
    auto [it, inserted] = conversations.try_emplace(r.conversation, Seen{r.parent, line});
    if (!inserted && it->second.parent != r.parent) {
      return Status::InvalidArgument(where + ": conversation " + std::to_string(r.conversation) + " has parent " +
                                     std::to_string(r.parent) + " but had parent " + std::to_string(it->second.parent) +
                                     " on line " + std::to_string(it->second.line));
    }
    r.input_tokens = static_cast<uint32_t>(in);
    r.output_tokens = static_cast<uint32_t>(out);
    trace.requests.push_back(std::move(r));
    return Status::Ok();
  });
  FLATKV_RETURN_IF_ERROR(s);
  if (!have_header) return Status::InvalidArgument(name + ": empty trace (no header line)");
  trace.conversations = conversations.size();
  SortByArrival(&trace.requests);
  return trace;
}

}  // namespace flatkv::replay::internal
