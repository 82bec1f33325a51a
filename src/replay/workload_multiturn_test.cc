// The multiturn workload generator: bench_multiturn's defaults, determinism
// per seed, real prefix reuse across rounds, the send clock's rate, the
// round barrier, and option errors that name the key and the value.
#include "replay/workload_multiturn.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace flatkv::replay {
namespace {

MultiturnOptions Opts(const std::string& spec) {
  auto o = ParseMultiturnOptions(spec);
  EXPECT_TRUE(o.ok()) << o.status().ToString();
  return o.ok() ? o.value() : MultiturnOptions{};
}

Trace Gen(const std::string& spec) {
  auto t = GenerateMultiturn(Opts(spec));
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : Trace{};
}

std::string ParseError(const std::string& spec) {
  auto o = ParseMultiturnOptions(spec);
  EXPECT_FALSE(o.ok()) << spec;
  return o.ok() ? "" : o.status().message();
}

TEST(WorkloadMultiturn, DefaultsAreBenchMultiturns) {
  const MultiturnOptions o = Opts("");
  EXPECT_EQ(o.clients, 256u);
  EXPECT_EQ(o.rounds, 5u);
  EXPECT_EQ(o.turn_tokens, 512u);
  EXPECT_EQ(o.output_tokens, 64u);
  EXPECT_EQ(o.request_rate, 1.0);
  EXPECT_FALSE(o.uniform);
  EXPECT_FALSE(o.barrier);
  EXPECT_EQ(o.seed, 1u);
  EXPECT_EQ(o.block_tokens, 64u);
}

TEST(WorkloadMultiturn, TheReplayExample) {
  auto t = MakeWorkload("multiturn:clients=20,rounds=10,turn_tokens=4096,output_tokens=256,request_rate=2,seed=1");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t.value().requests.size(), 200u);
  EXPECT_EQ(t.value().conversations, 20u);
  EXPECT_EQ(t.value().block_tokens, 64u);
  EXPECT_EQ(t.value().name,
            "multiturn:clients=20,rounds=10,turn_tokens=4096,output_tokens=256,request_rate=2,distribution=poisson,"
            "barrier=0,seed=1,block_tokens=64");
  uint32_t longest = 0;
  for (const Request& r : t.value().requests) {
    longest = std::max(longest, r.input_tokens);
    EXPECT_EQ(r.output_tokens, 256u);
    EXPECT_EQ(r.parent, 0u);
    EXPECT_GE(r.conversation, 1u);
    EXPECT_LE(r.conversation, 20u);
    EXPECT_EQ(r.blocks.size(), r.input_tokens / 64);
  }
  EXPECT_EQ(longest, 4096u + 9 * (256 + 4096));  // round 9: the first turn and nine answer + turn pairs
}

TEST(WorkloadMultiturn, DeterministicPerSeed) {
  const std::string spec = "clients=7,rounds=4,turn_tokens=100,output_tokens=30,request_rate=3,block_tokens=16";
  const Trace a = Gen(spec + ",seed=42");
  const Trace b = Gen(spec + ",seed=42");
  const Trace c = Gen(spec + ",seed=43");
  ASSERT_EQ(a.requests.size(), 28u);
  ASSERT_EQ(b.requests.size(), a.requests.size());
  bool differs = false;
  for (size_t i = 0; i < a.requests.size(); ++i) {
    EXPECT_EQ(a.requests[i].arrival_s, b.requests[i].arrival_s) << i;
    EXPECT_EQ(a.requests[i].conversation, b.requests[i].conversation) << i;
    EXPECT_EQ(a.requests[i].input_tokens, b.requests[i].input_tokens) << i;
    EXPECT_EQ(a.requests[i].blocks, b.requests[i].blocks) << i;
    differs |=
        a.requests[i].arrival_s != c.requests[i].arrival_s || a.requests[i].conversation != c.requests[i].conversation;
  }
  EXPECT_TRUE(differs) << "seed 43 gave the same sends as seed 42";
}

TEST(WorkloadMultiturn, EachRoundReusesThePreviousPrompt) {
  const Trace t = Gen("clients=9,rounds=6,turn_tokens=300,output_tokens=50,block_tokens=32,seed=5");
  ASSERT_EQ(t.requests.size(), 54u);
  std::map<uint64_t, std::vector<const Request*>> by_conv;
  for (const Request& r : t.requests) by_conv[r.conversation].push_back(&r);
  ASSERT_EQ(by_conv.size(), 9u);
  std::unordered_map<uint64_t, uint64_t> owner;  // block id -> conversation
  for (const auto& [conv, reqs] : by_conv) {
    ASSERT_EQ(reqs.size(), 6u) << "conversation " << conv;
    for (size_t round = 0; round < reqs.size(); ++round) {
      const Request& r = *reqs[round];
      // Arrival order is round order, and the prompt grows by one answer and one turn.
      EXPECT_EQ(r.input_tokens, 300u + round * 350u) << "conversation " << conv << " round " << round;
      EXPECT_EQ(r.blocks.size(), r.input_tokens / 32u);
      if (round > 0) {
        const Request& prev = *reqs[round - 1];
        ASSERT_GT(r.blocks.size(), prev.blocks.size());
        for (size_t k = 0; k < prev.blocks.size(); ++k) {
          EXPECT_EQ(r.blocks[k], prev.blocks[k]) << "conversation " << conv << " round " << round << " block " << k;
        }
      }
      for (uint64_t id : r.blocks) {
        auto [it, inserted] = owner.emplace(id, conv);
        EXPECT_EQ(it->second, conv) << "block id " << id << " shared by two conversations";
      }
    }
    // Within one prompt every block is distinct.
    const Request& last = *reqs.back();
    EXPECT_EQ(std::unordered_set<uint64_t>(last.blocks.begin(), last.blocks.end()).size(), last.blocks.size());
  }
  // Every block of rounds 1..5 that round r-1 had is a reuse: the ideal hit rate is known in closed form.
  uint64_t accesses = 0, reused = 0;
  std::unordered_set<uint64_t> seen;
  for (const Request& r : t.requests) {
    for (uint64_t id : r.blocks) {
      ++accesses;
      reused += !seen.insert(id).second;
    }
  }
  uint64_t expect_reused = 0;
  for (uint64_t round = 1; round < 6; ++round) expect_reused += (300 + (round - 1) * 350) / 32;
  EXPECT_EQ(reused, 9 * expect_reused);
  EXPECT_EQ(accesses - reused, seen.size());
}

TEST(WorkloadMultiturn, SendRateMatchesRequestRate) {
  for (const char* dist : {"poisson", "uniform"}) {
    const Trace t =
        Gen(std::string("clients=400,rounds=10,turn_tokens=64,output_tokens=8,request_rate=5,distribution=") + dist);
    ASSERT_EQ(t.requests.size(), 4000u);
    EXPECT_EQ(t.requests.front().arrival_s, 0.0);
    double max_gap = 0;
    for (size_t i = 1; i < t.requests.size(); ++i) {
      const double gap = t.requests[i].arrival_s - t.requests[i - 1].arrival_s;
      ASSERT_GE(gap, 0) << dist << " request " << i;
      max_gap = std::max(max_gap, gap);
    }
    // 3999 gaps of mean 0.2 s: the mean's standard error is 0.2/sqrt(3999) (Poisson) or less (uniform).
    const double mean_gap = t.requests.back().arrival_s / 3999.0;
    EXPECT_NEAR(mean_gap, 0.2, 0.2 * 5 / std::sqrt(3999.0)) << dist;
    if (std::string(dist) == "uniform") {
      EXPECT_LE(max_gap, 0.4) << "uniform gaps lie in [0, 2 / rate]";
    } else {
      EXPECT_GT(max_gap, 0.4) << "exponential gaps have a tail beyond 2 / rate";
    }
  }
}

TEST(WorkloadMultiturn, BarrierFinishesEachRoundFirst) {
  const Trace t = Gen("clients=12,rounds=5,turn_tokens=40,output_tokens=10,barrier=1,block_tokens=8");
  ASSERT_EQ(t.requests.size(), 60u);
  for (size_t i = 0; i < t.requests.size(); ++i) {
    const uint64_t round = (t.requests[i].input_tokens - 40) / 50;
    EXPECT_EQ(round, i / 12) << "request " << i;
  }
  // Without the barrier, the same seed interleaves rounds.
  const Trace free = Gen("clients=12,rounds=5,turn_tokens=40,output_tokens=10,barrier=0,block_tokens=8");
  bool interleaved = false;
  for (size_t i = 0; i < free.requests.size(); ++i) interleaved |= (free.requests[i].input_tokens - 40) / 50 != i / 12;
  EXPECT_TRUE(interleaved);
}

TEST(WorkloadMultiturn, SpecRoundTrips) {
  const MultiturnOptions o = Opts(
      "clients=3,rounds=2,turn_tokens=10,output_tokens=0,request_rate=0.37,"
      "distribution=uniform,barrier=1,seed=18446744073709551615,block_tokens=1");
  const std::string spec = MultiturnSpec(o);
  const MultiturnOptions back = Opts(spec);
  EXPECT_EQ(MultiturnSpec(back), spec);
  EXPECT_EQ(back.request_rate, 0.37);
  EXPECT_EQ(back.seed, 18446744073709551615ULL);
  EXPECT_TRUE(back.uniform);
  EXPECT_TRUE(back.barrier);
  EXPECT_EQ(back.output_tokens, 0u);
}

TEST(WorkloadMultiturn, ErrorsNameTheKeyAndValue) {
  EXPECT_EQ(ParseError("clients=20,colour=red"),
            "multiturn: unknown key 'colour' (known: clients, rounds, turn_tokens, output_tokens, request_rate, "
            "distribution, barrier, seed, block_tokens)");
  EXPECT_EQ(ParseError("clients=abc"), "multiturn: clients: 'abc' is not a non-negative integer");
  EXPECT_EQ(ParseError("clients=-3"), "multiturn: clients: '-3' is not a non-negative integer");
  EXPECT_EQ(ParseError("rounds=0"), "multiturn: rounds: '0' is out of range (1 to 65536)");
  EXPECT_EQ(ParseError("turn_tokens=12x"), "multiturn: turn_tokens: '12x' is not a non-negative integer");
  EXPECT_EQ(ParseError("seed=99999999999999999999"),
            "multiturn: seed: '99999999999999999999' is out of range (0 to 18446744073709551615)");
  EXPECT_EQ(ParseError("request_rate=0"),
            "multiturn: request_rate: '0' must be a positive finite number of requests per second");
  EXPECT_EQ(ParseError("request_rate=inf"),
            "multiturn: request_rate: 'inf' must be a positive finite number of requests per second");
  EXPECT_EQ(ParseError("request_rate=fast"), "multiturn: request_rate: 'fast' is not a number");
  EXPECT_EQ(ParseError("distribution=gamma"), "multiturn: distribution: 'gamma' is not poisson or uniform");
  EXPECT_EQ(ParseError("barrier=yes"), "multiturn: barrier: 'yes' is not 0 or 1");
  EXPECT_EQ(ParseError("block_tokens=0"), "multiturn: block_tokens: '0' is out of range (1 to 1048576)");
  EXPECT_EQ(ParseError("clients=2,clients=3"), "multiturn: key clients given twice");
  EXPECT_EQ(ParseError("clients"), "multiturn: 'clients' is not key=value");
  EXPECT_EQ(ParseError("clients=2,"), "multiturn: empty item in 'clients=2,' (expected key=value,key=value)");
  EXPECT_EQ(ParseError("clients="), "multiturn: clients: '' is not a non-negative integer");

  auto kind = MakeWorkload("sharegpt:n=3");
  ASSERT_FALSE(kind.ok());
  EXPECT_EQ(kind.status().message(),
            "unknown workload 'sharegpt' (known: multiturn, as multiturn:clients=20,rounds=10,turn_tokens=4096,...)");
  auto bad_param = MakeWorkload("multiturn:clients=20,rouns=10");
  ASSERT_FALSE(bad_param.ok());
  EXPECT_NE(bad_param.status().message().find("unknown key 'rouns'"), std::string::npos);

  // Options valid one by one whose prompts outgrow a request.
  auto longest = GenerateMultiturn(Opts("rounds=65536,turn_tokens=100000,output_tokens=0,clients=1"));
  ASSERT_FALSE(longest.ok());
  EXPECT_NE(longest.status().message().find("the last round's prompt would have 6553600000 tokens"), std::string::npos)
      << longest.status().message();
  // And ones whose block ids would not fit the memory limit.
  auto huge = GenerateMultiturn(Opts("clients=100000,rounds=100,turn_tokens=4096,block_tokens=16"));
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("exceeds the limit of 268435456 ids"), std::string::npos)
      << huge.status().message();
  auto many =
      GenerateMultiturn(Opts("clients=1048576,rounds=65536,turn_tokens=1,output_tokens=0,block_tokens=1048576"));
  ASSERT_FALSE(many.ok());
  EXPECT_EQ(many.status().message(),
            "multiturn: 1048576 clients x 65536 rounds exceeds the limit of 16777216 requests");
  // Options built in code are checked too.
  MultiturnOptions o;
  o.request_rate = -1;
  auto neg = GenerateMultiturn(o);
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.status().message().find("request_rate"), std::string::npos);
  o = MultiturnOptions{};
  o.clients = 0;
  auto none = GenerateMultiturn(o);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().message(), "multiturn: clients = 0 is out of range (1 to 1048576)");
}

}  // namespace
}  // namespace flatkv::replay
