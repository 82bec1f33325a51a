// Synthetic workloads for `flatkv replay --workload`: a Trace generated from
// parameters instead of read from a file. One kind so far, `multiturn`,
// modelled on SGLang's multi-turn benchmark (sgl-project/sglang
// benchmark/hicache/bench_multiturn.py): `clients` conversations of `rounds`
// rounds each; round 0's prompt is `turn_tokens` new tokens, and every later
// round's prompt is the previous prompt + its `output_tokens` answer + a new
// turn of `turn_tokens`, so each round reuses the previous round's whole
// prompt as a prefix. Requests are sent on one global clock of
// `request_rate` sends per second (Poisson, or uniform in [0, 2/rate]), each
// send taking a uniformly random client that still has rounds left (with
// `barrier=1`, only clients still in the current round: round r+1 starts
// once every client has sent round r). Format and the differences from the
// closed-loop benchmark: docs/format_trace.md, "Synthetic workloads".
//
// Deterministic: the same options give the same Trace on every platform
// (own PRNG and sampling, no <random> distributions).
//
// Thread-safety: functions of their arguments.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "flatkv/status.h"
#include "replay/trace.h"

namespace flatkv::replay {

// Defaults are bench_multiturn's (--num-clients 256, --num-rounds 5,
// --request-length 512, --output-length 64, --request-rate 1, --seed 1,
// --distribution poisson); block_tokens 64 is the Claude Code traces' block.
struct MultiturnOptions {
  uint64_t clients = 256;       // conversations (bench_multiturn --num-clients), 1 to 2^20
  uint64_t rounds = 5;          // rounds per conversation (--num-rounds), 1 to 2^16
  uint64_t turn_tokens = 512;   // new tokens per round (--request-length), >= 1
  uint64_t output_tokens = 64;  // answer tokens per round (--output-length)
  double request_rate = 1.0;    // sends per second over all clients (--request-rate), > 0
  bool uniform = false;         // gaps uniform in [0, 2 / request_rate] instead of exponential
  bool barrier = false;         // --enable-round-barrier: all clients' round r before any round r+1
  uint64_t seed = 1;            // --seed
  uint64_t block_tokens = 64;   // tokens per block id, 1 to 2^20
};

// Parses "key=value,key=value" (the part after "multiturn:"). Keys:
// clients, rounds, turn_tokens, output_tokens, request_rate, distribution
// (poisson | uniform), barrier (0 | 1), seed, block_tokens; a key left out
// keeps its default. An unknown key, a repeated key, or a bad value gives
// InvalidArgument naming the key and the text.
Result<MultiturnOptions> ParseMultiturnOptions(std::string_view spec);

// The canonical spec of `o` ("clients=256,rounds=5,..."), all keys, in the
// order above; ParseMultiturnOptions of it gives `o` back.
std::string MultiturnSpec(const MultiturnOptions& o);

// Generates the trace: conversation c (1-based) is client c - 1, parent 0;
// requests sorted by arrival, the first at 0 s. Errors (InvalidArgument):
// an option out of range, a prompt longer than 2^32 - 1 tokens, more than
// 2^24 requests or more than 2^28 block ids in all (the limits keep a typo
// from eating the memory).
Result<Trace> GenerateMultiturn(const MultiturnOptions& o);

// "multiturn:key=value,..." (or just "multiturn") -> GenerateMultiturn of
// the parsed options. An unknown kind gives InvalidArgument listing the
// known ones.
Result<Trace> MakeWorkload(std::string_view spec);

}  // namespace flatkv::replay
