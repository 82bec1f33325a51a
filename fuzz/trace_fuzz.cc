// Fuzzes the trace readers: the first byte picks the format (auto, Claude
// Code, Mooncake, generic), the rest is the file (gzip included, which
// ParseTrace detects by its magic). Everything must come back as a Status or
// a well-formed Trace, never crash; a trace merged with itself must keep its
// requests and conversations.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "replay/trace.h"

namespace {

void Check(const flatkv::replay::Trace& t) {
  if (t.block_tokens == 0) __builtin_trap();
  for (size_t i = 0; i < t.requests.size(); ++i) {
    const auto& r = t.requests[i];
    if (!std::isfinite(r.arrival_s) || r.arrival_s < 0) __builtin_trap();
    if (i > 0 && t.requests[i - 1].arrival_s > r.arrival_s) __builtin_trap();
    if (r.conversation == 0 || r.parent == r.conversation) __builtin_trap();
    if (r.blocks.size() > (uint64_t{r.input_tokens} + t.block_tokens - 1) / t.block_tokens) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  using flatkv::replay::TraceFormat;
  const TraceFormat formats[] = {TraceFormat::kAuto, TraceFormat::kClaudeCode, TraceFormat::kMooncake,
                                 TraceFormat::kGeneric};
  const TraceFormat format = formats[data[0] % 4];
  std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  auto trace = flatkv::replay::ParseTrace(bytes, "fuzz", format);
  if (!trace.ok()) {
    if (trace.status().message().find("fuzz") == std::string::npos) __builtin_trap();  // errors name the input
    return 0;
  }
  Check(*trace);
  std::vector<flatkv::replay::Trace> two{*trace, *trace};
  auto merged = flatkv::replay::MergeTraces(std::move(two), 1.0);
  if (!merged.ok()) __builtin_trap();
  Check(*merged);
  if (merged->requests.size() != 2 * trace->requests.size()) __builtin_trap();
  if (merged->conversations != 2 * trace->conversations) __builtin_trap();
  return 0;
}
