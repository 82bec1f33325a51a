// The Mooncake trace reader (FAST'25 release): JSON lines of
// {timestamp (ms), input_length, output_length, hash_ids}, 512-token blocks,
// ids global within the file. Mooncake has no session field, so
// conversations are inferred from the prompts (see AssignConversations and
// docs/format_trace.md).
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>
#include <vector>

#include "replay/trace_internal.h"

namespace flatkv::replay::internal {
namespace {

constexpr uint32_t kMooncakeBlockTokens = 512;

// A request continues the conversation of the most recent earlier request
// whose whole prompt (its full blocks, i.e. all but a trailing partial one)
// its own blocks start with — the next turn of a chat resends the previous
// turn's prompt. Prompts no longer than the prefix every request in the file
// shares (the conversation trace's common system prompt, block 0) do not
// count: sharing only that says nothing about the conversation. Otherwise
// the request starts a new conversation. Ids are numbered 1, 2, ... in
// arrival order. Returns the number of conversations.
uint64_t AssignConversations(std::vector<Request>* requests) {
  if (requests->empty()) return 0;
  size_t common = (*requests)[0].blocks.size();
  for (const Request& r : *requests) {
    size_t k = 0;
    while (k < common && k < r.blocks.size() && r.blocks[k] == (*requests)[0].blocks[k]) ++k;
    common = k;
  }
  // Key: a 64-bit hash chained over a prefix of block ids; value: the
  // conversation of the latest request whose whole prompt is that prefix.
  std::unordered_map<uint64_t, uint64_t> prompt_owner;
  uint64_t conversations = 0;
  std::vector<uint64_t> prefix_hash;
  for (Request& r : *requests) {
    prefix_hash.resize(r.blocks.size() + 1);
    prefix_hash[0] = 0x243f6a8885a308d3ULL;
    uint64_t owner = 0;
    for (size_t j = 1; j <= r.blocks.size(); ++j) {
      prefix_hash[j] = Mix64(prefix_hash[j - 1] ^ Mix64(r.blocks[j - 1] + 0x9e3779b97f4a7c15ULL));
      if (j <= common) continue;
      auto it = prompt_owner.find(prefix_hash[j]);
      if (it != prompt_owner.end()) owner = it->second;  // longer matches win
    }
    r.conversation = owner != 0 ? owner : ++conversations;
    const size_t full = std::min<size_t>(r.input_tokens / kMooncakeBlockTokens, r.blocks.size());
    if (full > common) prompt_owner[prefix_hash[full]] = r.conversation;
  }
  return conversations;
}

}  // namespace

Result<Trace> ParseMooncake(std::string_view text, const std::string& name) {
  Trace trace;
  trace.name = name;
  trace.block_tokens = kMooncakeBlockTokens;
  nlohmann::json obj;
  Status s = ForEachLine(text, [&](uint64_t line, std::string_view body) -> Status {
    const std::string where = name + ":" + std::to_string(line);
    FLATKV_RETURN_IF_ERROR(ParseJsonObject(body, where, &obj));
    Request r;
    double ms = 0;
    uint64_t in = 0, out = 0;
    FLATKV_RETURN_IF_ERROR(GetTime(obj, "timestamp", where, &ms));
    FLATKV_RETURN_IF_ERROR(GetUint(obj, "input_length", std::numeric_limits<uint32_t>::max(), where, &in));
    FLATKV_RETURN_IF_ERROR(GetUint(obj, "output_length", std::numeric_limits<uint32_t>::max(), where, &out));
    FLATKV_RETURN_IF_ERROR(GetBlockIds(obj, "hash_ids", where, &r.blocks));
    if (!BlocksFit(r.blocks.size(), in, kMooncakeBlockTokens)) {
      return Status::InvalidArgument(where + ": hash_ids has " + std::to_string(r.blocks.size()) +
                                     " ids but input_length = " + std::to_string(in) + " allows at most " +
                                     std::to_string((in + kMooncakeBlockTokens - 1) / kMooncakeBlockTokens));
    }
    r.arrival_s = ms / 1000.0;
    r.input_tokens = static_cast<uint32_t>(in);
    r.output_tokens = static_cast<uint32_t>(out);
    trace.requests.push_back(std::move(r));
    return Status::Ok();
  });
  FLATKV_RETURN_IF_ERROR(s);
  SortByArrival(&trace.requests);
  trace.conversations = AssignConversations(&trace.requests);
  return trace;
}

}  // namespace flatkv::replay::internal
