// The multiturn workload generator (workload_multiturn.h): option parsing,
// the send clock, and the prompts' block ids.
#include "replay/workload_multiturn.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "replay/trace_internal.h"

namespace flatkv::replay {
namespace {

constexpr std::string_view kKind = "multiturn";
constexpr uint64_t kMaxClients = uint64_t{1} << 20;
constexpr uint64_t kMaxRounds = uint64_t{1} << 16;
constexpr uint64_t kMaxBlockTokens = uint64_t{1} << 20;
constexpr uint64_t kMaxPromptTokens = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kMaxTotalBlockIds = uint64_t{1} << 28;  // 2 GiB of ids
constexpr uint64_t kMaxRequests = uint64_t{1} << 24;       // 16 Mi requests (~1 GiB of Request)
constexpr const char* kKnownKeys =
    "clients, rounds, turn_tokens, output_tokens, request_rate, distribution, barrier, seed, block_tokens";

Status Bad(std::string_view key, std::string_view text, const std::string& why) {
  return Status::InvalidArgument(std::string(kKind) + ": " + std::string(key) + ": '" + std::string(text) + "' " + why);
}

Status ParseUint(std::string_view key, std::string_view text, uint64_t lo, uint64_t hi, uint64_t* out) {
  uint64_t v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ptr != end || ec == std::errc::invalid_argument) {
    return Bad(key, text, "is not a non-negative integer");
  }
  if (ec == std::errc::result_out_of_range || v < lo || v > hi) {
    return Bad(key, text, "is out of range (" + std::to_string(lo) + " to " + std::to_string(hi) + ")");
  }
  *out = v;
  return Status::Ok();
}

Status ParseRate(std::string_view key, std::string_view text, double* out) {
  double v = 0;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ptr != end || ec == std::errc::invalid_argument) return Bad(key, text, "is not a number");
  if (ec == std::errc::result_out_of_range || !std::isfinite(v) || !(v > 0)) {
    return Bad(key, text, "must be a positive finite number of requests per second");
  }
  *out = v;
  return Status::Ok();
}

// splitmix64: a small, portable PRNG whose sequence is fixed by the seed.
struct Rng {
  uint64_t state;
  uint64_t Next() { return internal::Mix64(state += 0x9e3779b97f4a7c15ULL); }
  // Uniform in [0, 1) with 53 random bits.
  double Unit() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Uniform in [0, n), n >= 1 (multiply-shift; bias below 2^-40 for n < 2^24).
  uint64_t Below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(Next()) * n) >> 64); }
};

// Tokens of round r's prompt: round 0 is one turn; each later round adds the
// previous answer and a new turn.
uint64_t PromptTokens(const MultiturnOptions& o, uint64_t r) {
  return o.turn_tokens + r * (o.output_tokens + o.turn_tokens);
}

}  // namespace

Result<MultiturnOptions> ParseMultiturnOptions(std::string_view spec) {
  MultiturnOptions o;
  std::vector<std::string> seen;
  size_t pos = 0;
  while (pos <= spec.size() && !spec.empty()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string_view::npos) comma = spec.size();
    const std::string_view item = spec.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) {
      return Status::InvalidArgument(std::string(kKind) + ": empty item in '" + std::string(spec) +
                                     "' (expected key=value,key=value)");
    }
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) {
      return Status::InvalidArgument(std::string(kKind) + ": '" + std::string(item) + "' is not key=value");
    }
    const std::string_view key = item.substr(0, eq);
    const std::string_view value = item.substr(eq + 1);
    for (const std::string& k : seen) {
      if (k == key) return Status::InvalidArgument(std::string(kKind) + ": key " + k + " given twice");
    }
    seen.emplace_back(key);
    if (key == "clients") {
      FLATKV_RETURN_IF_ERROR(ParseUint(key, value, 1, kMaxClients, &o.clients));
    } else if (key == "rounds") {
      FLATKV_RETURN_IF_ERROR(ParseUint(key, value, 1, kMaxRounds, &o.rounds));
    } else if (key == "turn_tokens") {
      FLATKV_RETURN_IF_ERROR(ParseUint(key, value, 1, kMaxPromptTokens, &o.turn_tokens));
    } else if (key == "output_tokens") {
      FLATKV_RETURN_IF_ERROR(ParseUint(key, value, 0, kMaxPromptTokens, &o.output_tokens));
    } else if (key == "request_rate") {
      FLATKV_RETURN_IF_ERROR(ParseRate(key, value, &o.request_rate));
    } else if (key == "distribution") {
      if (value == "poisson") {
        o.uniform = false;
      } else if (value == "uniform") {
        o.uniform = true;
      } else {
        return Bad(key, value, "is not poisson or uniform");
      }
    } else if (key == "barrier") {
      if (value != "0" && value != "1") return Bad(key, value, "is not 0 or 1");
      o.barrier = value == "1";
    } else if (key == "seed") {
      FLATKV_RETURN_IF_ERROR(ParseUint(key, value, 0, std::numeric_limits<uint64_t>::max(), &o.seed));
    } else if (key == "block_tokens") {
      FLATKV_RETURN_IF_ERROR(ParseUint(key, value, 1, kMaxBlockTokens, &o.block_tokens));
    } else {
      return Status::InvalidArgument(std::string(kKind) + ": unknown key '" + std::string(key) +
                                     "' (known: " + kKnownKeys + ")");
    }
    if (comma == spec.size()) break;
  }
  return o;
}

std::string MultiturnSpec(const MultiturnOptions& o) {
  char rate[64];
  auto [end, ec] = std::to_chars(rate, rate + sizeof(rate), o.request_rate);  // shortest round-trip form
  const std::string rate_text = ec == std::errc() ? std::string(rate, end) : std::to_string(o.request_rate);
  return "clients=" + std::to_string(o.clients) + ",rounds=" + std::to_string(o.rounds) +
         ",turn_tokens=" + std::to_string(o.turn_tokens) + ",output_tokens=" + std::to_string(o.output_tokens) +
         ",request_rate=" + rate_text + ",distribution=" + (o.uniform ? "uniform" : "poisson") +
         ",barrier=" + (o.barrier ? "1" : "0") + ",seed=" + std::to_string(o.seed) +
         ",block_tokens=" + std::to_string(o.block_tokens);
}

Result<Trace> GenerateMultiturn(const MultiturnOptions& o) {
  // The same ranges as the parser, for options built in code.
  auto range = [](const char* key, uint64_t v, uint64_t lo, uint64_t hi) -> Status {
    if (v >= lo && v <= hi) return Status::Ok();
    return Status::InvalidArgument(std::string(kKind) + ": " + key + " = " + std::to_string(v) + " is out of range (" +
                                   std::to_string(lo) + " to " + std::to_string(hi) + ")");
  };
  FLATKV_RETURN_IF_ERROR(range("clients", o.clients, 1, kMaxClients));
  FLATKV_RETURN_IF_ERROR(range("rounds", o.rounds, 1, kMaxRounds));
  FLATKV_RETURN_IF_ERROR(range("turn_tokens", o.turn_tokens, 1, kMaxPromptTokens));
  FLATKV_RETURN_IF_ERROR(range("output_tokens", o.output_tokens, 0, kMaxPromptTokens));
  FLATKV_RETURN_IF_ERROR(range("block_tokens", o.block_tokens, 1, kMaxBlockTokens));
  if (!std::isfinite(o.request_rate) || !(o.request_rate > 0)) {
    return Status::InvalidArgument(std::string(kKind) + ": request_rate = " + std::to_string(o.request_rate) +
                                   " must be a positive finite number of requests per second");
  }
  // The last round's prompt is the longest; the per-round growth is below
  // 2^33 and rounds below 2^17, so this product cannot overflow 64 bits.
  const uint64_t longest = PromptTokens(o, o.rounds - 1);
  if (longest > kMaxPromptTokens) {
    return Status::InvalidArgument(std::string(kKind) + ": the last round's prompt would have " +
                                   std::to_string(longest) +
                                   " tokens (turn_tokens + (rounds - 1) x (output_tokens + "
                                   "turn_tokens)), more than a request holds (" +
                                   std::to_string(kMaxPromptTokens) + ")");
  }
  if (o.clients * o.rounds > kMaxRequests) {  // at most 2^36: no overflow
    return Status::InvalidArgument(std::string(kKind) + ": " + std::to_string(o.clients) + " clients x " +
                                   std::to_string(o.rounds) + " rounds exceeds the limit of " +
                                   std::to_string(kMaxRequests) + " requests");
  }
  uint64_t ids_per_client = 0;
  for (uint64_t r = 0; r < o.rounds; ++r) ids_per_client += PromptTokens(o, r) / o.block_tokens;
  if (ids_per_client > kMaxTotalBlockIds / o.clients) {
    return Status::InvalidArgument(std::string(kKind) + ": " + std::to_string(o.clients) + " clients x " +
                                   std::to_string(ids_per_client) + " block ids each exceeds the limit of " +
                                   std::to_string(kMaxTotalBlockIds) +
                                   " ids in all (fewer clients or rounds, or larger block_tokens)");
  }

  Trace trace;
  trace.name = std::string(kKind) + ":" + MultiturnSpec(o);
  trace.block_tokens = static_cast<uint32_t>(o.block_tokens);
  trace.conversations = o.clients;
  trace.requests.reserve(o.clients * o.rounds);

  // Block k of conversation c holds tokens [k B, (k+1) B) of the
  // conversation's stream (turn 0, answer 0, turn 1, answer 1, ...), which is
  // append-only: once a block is full it is the same in every later prompt.
  // Its id is therefore a function of (c, k), the same as a hash chained over
  // the prefix would give; NamespacedId makes it exactly unique.
  Rng rng{o.seed};
  std::vector<uint64_t> next_round(o.clients, 0);
  std::vector<uint64_t> ready(o.clients);  // clients that may send now
  for (uint64_t c = 0; c < o.clients; ++c) ready[c] = c;
  std::vector<uint64_t> waiting;  // barrier: clients done with the current round
  double t = 0;
  const uint64_t total = o.clients * o.rounds;
  for (uint64_t sent = 0; sent < total; ++sent) {
    if (ready.empty()) {  // barrier: every client has sent this round
      ready.swap(waiting);
    }
    const uint64_t pick = rng.Below(ready.size());
    const uint64_t client = ready[pick];
    const uint64_t round = next_round[client]++;
    if (next_round[client] == o.rounds || o.barrier) {
      if (o.barrier && next_round[client] < o.rounds) waiting.push_back(client);
      ready[pick] = ready.back();
      ready.pop_back();
    }

    Request r;
    r.arrival_s = t;
    r.conversation = client + 1;
    r.parent = 0;
    const uint64_t tokens = PromptTokens(o, round);
    r.input_tokens = static_cast<uint32_t>(tokens);
    r.output_tokens = static_cast<uint32_t>(o.output_tokens);
    const uint64_t full = tokens / o.block_tokens;  // full blocks only, as the Claude Code traces
    r.blocks.resize(full);
    for (uint64_t k = 0; k < full; ++k) r.blocks[k] = internal::NamespacedId(client + 1, k);
    trace.requests.push_back(std::move(r));

    // The next send: bench_multiturn sleeps expovariate(rate) (or
    // uniform(0, 2 / rate)) after every send.
    const double gap = o.uniform ? rng.Unit() * 2.0 / o.request_rate : -std::log1p(-rng.Unit()) / o.request_rate;
    t += gap;
  }
  return trace;
}

Result<Trace> MakeWorkload(std::string_view spec) {
  const size_t colon = spec.find(':');
  const std::string_view kind = spec.substr(0, colon);
  if (kind != kKind) {
    return Status::InvalidArgument("unknown workload '" + std::string(kind) + "' (known: multiturn, as " +
                                   "multiturn:clients=20,rounds=10,turn_tokens=4096,...)");
  }
  const std::string_view params = colon == std::string_view::npos ? std::string_view() : spec.substr(colon + 1);
  FLATKV_ASSIGN_OR_RETURN(MultiturnOptions o, ParseMultiturnOptions(params));
  return GenerateMultiturn(o);
}

}  // namespace flatkv::replay
