// Traces: the requests a replay drives, read from real agent and chat
// traces. Every reader produces the same Trace: requests sorted by arrival,
// each with the block ids of its prompt's full blocks, where equal ids mean
// an equal prefix. Ids are unique within a Trace (a Claude Code session
// file's ids are shared by its sub-agents, which really do reuse its system
// prompt); MergeTraces namespaces them per trace. Formats:
// docs/format_trace.md.
//
// Thread-safety: values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "flatkv/status.h"

namespace flatkv::replay {

struct Request {
  double arrival_s = 0;            // seconds from the start of the (merged) trace
  uint64_t conversation = 0;       // unique per conversation and per sub-agent: the store session
  uint64_t parent = 0;             // for a sub-agent, its parent's conversation; 0 otherwise
  uint32_t input_tokens = 0;
  uint32_t output_tokens = 0;
  std::vector<uint64_t> blocks;    // ids of the prompt's blocks, in order (full blocks; Mooncake also counts the last partial one)
};

struct Trace {
  std::string name;                // file name(s) it came from
  uint32_t block_tokens = 0;       // tokens per block id (64 for Claude Code, 512 for Mooncake)
  std::vector<Request> requests;   // sorted by arrival_s
  uint64_t conversations = 0;      // distinct conversation ids (a session counts even if only its sub-agents call)
};

enum class TraceFormat { kAuto, kClaudeCode, kMooncake, kGeneric };

// Reads one trace file. kAuto picks by content: a gzipped or plain JSON
// object with "requests" is Claude Code; JSONL lines with "timestamp" and
// "hash_ids" are Mooncake; lines with "arrival_s" are the generic form.
// Malformed input gives an error naming the file and line (or JSON path).
Result<Trace> ReadTrace(const std::string& path, TraceFormat format = TraceFormat::kAuto);

// The same from memory (for fuzzing); `name` is used in errors.
Result<Trace> ParseTrace(std::string_view bytes, const std::string& name, TraceFormat format = TraceFormat::kAuto);

// Merges traces into one (all must share block_tokens): conversations keep
// their ids' uniqueness, and trace i's arrivals are shifted by
// i * stagger_s, so separate conversations start staggered.
Result<Trace> MergeTraces(std::vector<Trace> traces, double stagger_s);

// Reads every path (a directory means each *.json.gz / *.json / *.jsonl file
// in it, sorted by name) and merges them with MergeTraces.
Result<Trace> ReadTraces(const std::vector<std::string>& paths, double stagger_s, TraceFormat format = TraceFormat::kAuto);

// The root conversation of each request of `t`, by index: its own
// conversation, or for a sub-agent its parent's root (a parent not seen
// before it is its own root). A root conversation and its sub-agents are
// one unit: they share a serving instance and move together when a replay
// reorders or cuts a trace.
std::vector<uint64_t> RootConversations(const Trace& t);

}  // namespace flatkv::replay
