// The workloads of `flatkv bench sparse-prefill` (docs/attention.md, "Sparse
// prefill"; docs/benchmarks.md has figures):
//   real       --tokens (default: the model's context, SmolLM2 8,192) of
//              --text-file (Debian's pydoc_data/topics.py: Python's reference
//              prose), tokenized without BOS, prefilled in --chunk-token
//              chunks; every position's next-token NLL gives the perplexity.
//              Dense: the transformer's own attention. Then per --base-mass
//              and per mode (rbs; rescue off at the same base_mass; rescue
//              off at equal density) the same prefill through RbsPrefill,
//              which also runs dense attention on every chunk's rows with
//              the same kernel (timed apart, not used) for retention,
//              output error and the attention speedup.
//   synthetic  per --synthetic-tokens length, the long prompt of
//              attention/rbs_synthetic.h (4 heads, head_dim 64, RoPE base
//              1e6), --sample-blocks query blocks of 64 rows drawn at random
//              (seeded), each against dense attention for the same rows.
// Speedup: thread-seconds of dense attention over those of RBS's mask
// (centroids and radii included) plus its block-sparse kernel, same kernel
// code, same rows.
#include "bench/bench_sparse_prefill.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attention/rbs.h"
#include "attention/rbs_synthetic.h"
#include "bench/bench_engine_inputs.h"
#include "bench/bench_util.h"
#include "model/kv_cache.h"
#include "model/transformer.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

using attention::RbsMode;

int Fail(int code, const std::string& msg) {
  std::fprintf(stderr, "flatkv bench sparse-prefill: %s\n", msg.c_str());
  return code;
}

const char* ModeName(RbsMode m) {
  switch (m) {
    case RbsMode::kDense: return "dense";
    case RbsMode::kRbs: return "rbs";
    case RbsMode::kBaseOnly: return "base_only";
    case RbsMode::kBaseMatched: return "base_matched";
  }
  return "?";
}

struct PrefillRun {
  double ppl = 0;
  double seconds = 0;
};

// Prefills `tokens` in chunks, scoring every next token; `hook` may be empty.
PrefillRun Prefill(const model::Model& m, const std::vector<int>& tokens, uint32_t chunk, uint32_t block, int threads,
                   model::Transformer::AttentionHook hook) {
  const model::Config& c = m.config;
  model::Transformer t(m, model::TransformerOptions{threads, {}});
  if (hook) t.set_attention_hook(std::move(hook));
  model::KvCache cache(c, block, static_cast<uint32_t>(tokens.size()));
  std::vector<float> x(size_t(chunk) * c.dim), logits(size_t(chunk) * c.vocab_size);
  double nll = 0;
  uint64_t count = 0;
  const double start = NowSeconds();
  for (uint32_t pos = 0; pos < tokens.size(); pos += chunk) {
    const uint32_t n = std::min<uint32_t>(chunk, static_cast<uint32_t>(tokens.size()) - pos);
    t.Embed(std::span<const int>(tokens).subspan(pos, n), x.data());
    for (int l = 0; l < c.n_layers; ++l) t.Layer(l, pos, n, x.data(), cache);
    t.Logits(x.data(), logits.data(), static_cast<int>(n));
    for (uint32_t i = 0; i < n && pos + i + 1 < tokens.size(); ++i) {
      const float* row = logits.data() + size_t(i) * c.vocab_size;
      double mx = row[0];
      for (int v = 0; v < c.vocab_size; ++v) mx = std::max<double>(mx, row[v]);
      double sum = 0;
      for (int v = 0; v < c.vocab_size; ++v) sum += std::exp(double(row[v]) - mx);
      nll += -(double(row[tokens[pos + i + 1]]) - mx - std::log(sum));
      ++count;
    }
  }
  return {std::exp(nll / double(count)), NowSeconds() - start};
}

nlohmann::json StatsJson(const attention::RbsRunStats& s) {
  return {{"density", s.density()},
          {"retention", s.retention()},
          {"output_error", s.rel_error()},
          {"prefill_attention_speedup", s.speedup()},
          {"causal_blocks", s.mask.causal},
          {"selected_blocks", s.mask.selected},
          {"base_blocks", s.mask.base},
          {"rescued_blocks", s.mask.rescued},
          {"forced_blocks", s.mask.forced},
          {"mask_thread_s", s.mask_s},
          {"sparse_thread_s", s.sparse_s},
          {"dense_thread_s", s.dense_s}};
}

Result<nlohmann::json> RunReal(const BenchSparsePrefillArgs& a) {
  auto path = ResolveModelPath(a.model);
  if (!path.ok()) return path.status();
  auto loaded = model::LoadModel(*path, "");
  if (!loaded.ok()) return Status::InvalidArgument("--model " + *path + ": " + loaded.status().ToString());
  const model::Model& m = *loaded;
  if (!m.tokenizer) return Status::InvalidArgument("--model " + *path + " has no tokenizer");
  std::ifstream in(a.text_file, std::ios::binary);
  if (!in) return Status::NotFound("--text-file " + a.text_file + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  auto enc = m.tokenizer->Encode(ss.str(), false);
  if (!enc.ok()) return enc.status();
  const uint32_t n = a.tokens != 0 ? a.tokens : static_cast<uint32_t>(m.config.seq_len);
  if (enc->size() < n)
    return Status::InvalidArgument("--text-file " + a.text_file + " gives " + std::to_string(enc->size()) +
                                   " tokens, fewer than " + std::to_string(n));
  const std::vector<int> tokens(enc->begin(), enc->begin() + n);
  auto sha = FileSha256(a.text_file);
  std::fprintf(stderr, "real: %u tokens of %s; dense prefill...\n", n, a.text_file.c_str());
  const PrefillRun dense = Prefill(m, tokens, a.chunk, a.block, a.threads, {});
  std::fprintf(stderr, "  dense ppl %.4f in %.1f s\n", dense.ppl, dense.seconds);
  nlohmann::json runs = nlohmann::json::array();
  for (double bm : a.base_mass) {
    for (RbsMode mode : {RbsMode::kRbs, RbsMode::kBaseOnly, RbsMode::kBaseMatched}) {
      if (std::find(a.modes.begin(), a.modes.end(), ModeName(mode)) == a.modes.end()) continue;
      attention::RbsOptions o;
      o.block = a.block;
      o.base_mass = static_cast<float>(bm);
      o.rescue_share = static_cast<float>(a.rescue_share);
      o.local_blocks = a.local_blocks;
      o.mode = mode;
      auto rbs = attention::RbsPrefill::Create(m.config, o, a.block, a.threads, /*measure_dense=*/true);
      if (!rbs.ok()) return rbs.status();
      const PrefillRun r = Prefill(m, tokens, a.chunk, a.block, a.threads, (*rbs)->Hook());
      nlohmann::json j = StatsJson((*rbs)->stats());
      j["mode"] = ModeName(mode);
      j["rescue"] = mode == RbsMode::kRbs;
      j["base_mass"] = bm;
      j["rescue_share"] = a.rescue_share;
      j["local_blocks"] = a.local_blocks;
      j["ppl"] = r.ppl;
      j["ppl_delta"] = r.ppl / dense.ppl - 1.0;
      j["prefill_s_with_dense_reference"] = r.seconds;
      std::fprintf(stderr, "  %s base_mass %.3f: density %.3f retention %.4f err %.4f speedup %.2f ppl %.4f (%+.3f%%)\n",
                   ModeName(mode), bm, (*rbs)->stats().density(), (*rbs)->stats().retention(),
                   (*rbs)->stats().rel_error(), (*rbs)->stats().speedup(), r.ppl, 100 * (r.ppl / dense.ppl - 1));
      runs.push_back(std::move(j));
    }
  }
  return nlohmann::json{{"model", *path},
                         {"text", {{"path", a.text_file}, {"sha256", sha.ok() ? *sha : ""}, {"tokens", n}}},
                         {"chunk", a.chunk},
                         {"dense", {{"ppl", dense.ppl}, {"prefill_s", dense.seconds}}},
                         {"runs", runs}};
}

nlohmann::json RunSynthetic(const BenchSparsePrefillArgs& a, uint32_t length) {
  using Clock = std::chrono::steady_clock;
  const uint32_t B = a.block, blocks = length / B;
  std::mt19937_64 rng(length);
  std::vector<uint32_t> all(blocks - 1);
  std::iota(all.begin(), all.end(), 1u);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<uint32_t> qblocks(all.begin(), all.begin() + std::min<size_t>(a.sample_blocks, all.size()));
  std::sort(qblocks.begin(), qblocks.end());
  attention::PrefillSyntheticOptions so;
  so.heads = a.heads;
  so.n_tokens = length;
  so.block = B;
  std::fprintf(stderr, "synthetic %u tokens: generating...\n", length);
  const attention::PrefillSynthetic s = attention::MakePrefillSynthetic(so, qblocks);
  const int d = so.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const attention::RbsKernels& kern = attention::RbsKernelsFor(DetectedSimd());
  std::vector<attention::KeyBlockStats> stats(a.heads);
  const auto t0 = Clock::now();
  for (int h = 0; h < a.heads; ++h)
    attention::UpdateKeyBlockStats({s.head_k(h), uint64_t(B) * d, uint64_t(d)}, length, d, B, stats[h]);
  // A full prefill computes the stats once for all blocks; the sampled rows carry their share.
  const double stats_s = std::chrono::duration<double>(Clock::now() - t0).count() * double(qblocks.size()) / blocks;
  const uint64_t rows = uint64_t(qblocks.size()) * B;
  nlohmann::json runs = nlohmann::json::array();
  std::vector<uint32_t> pos(B), sel;
  attention::BlockAttendScratch scratch;
  attention::MaskScratch ms;
  std::vector<float> o(uint64_t(B) * d), lse(B);
  std::vector<std::pair<RbsMode, double>> configs{{RbsMode::kDense, 1.0}};
  for (double bm : a.synthetic_base_mass)
    for (RbsMode mode : {RbsMode::kRbs, RbsMode::kBaseOnly, RbsMode::kBaseMatched}) configs.push_back({mode, bm});
  // Interleaved: each (head, query block) runs dense then every config back to back, so
  // load changes on the shared machine hit all of them alike.
  std::vector<attention::RbsRunStats> st(configs.size());
  std::vector<attention::RbsOptions> opts(configs.size());
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    opts[ci].block = B;
    opts[ci].mode = configs[ci].first;
    opts[ci].base_mass = static_cast<float>(configs[ci].second);
    opts[ci].rescue_share = static_cast<float>(a.rescue_share);
    opts[ci].local_blocks = a.local_blocks;
    st[ci].mask_s = configs[ci].first == RbsMode::kDense ? 0 : stats_s;
  }
  double dense_s = 0;
  std::vector<float> ref(uint64_t(B) * d), ref_lse(B);
  for (int h = 0; h < a.heads; ++h) {
    const attention::BlockRows k{s.head_k(h), uint64_t(B) * d, uint64_t(d)}, v{s.head_v(h), uint64_t(B) * d, uint64_t(d)};
    for (size_t b = 0; b < qblocks.size(); ++b) {
      std::iota(pos.begin(), pos.end(), qblocks[b] * B);
      const float* q = s.q.data() + (uint64_t(h) * rows + b * B) * d;
      for (size_t ci = 0; ci < configs.size(); ++ci) {
        const auto t1 = Clock::now();
        attention::SelectBlocks(q, d, pos.data(), B, stats[h], opts[ci], scale, kern, ms, sel, st[ci].mask);
        const auto t2 = Clock::now();
        attention::BlockAttendArgs args{q, uint64_t(d), pos.data(), B, d, scale, k, v, B, sel.data(),
                                        uint32_t(sel.size()), o.data(), uint64_t(d), lse.data()};
        kern.attend(args, scratch);
        const auto t3 = Clock::now();
        st[ci].mask_s += std::chrono::duration<double>(t2 - t1).count();
        const double attend_s = std::chrono::duration<double>(t3 - t2).count();
        if (configs[ci].first == RbsMode::kDense) {  // configs[0]
          ref = o;
          ref_lse = lse;
          dense_s += attend_s;
        }
        st[ci].sparse_s += attend_s;
        for (uint32_t r = 0; r < B; ++r) {
          st[ci].retention_sum += std::exp(double(lse[r]) - ref_lse[r]);
          for (int x = 0; x < d; ++x) {
            const double e = double(o[uint64_t(r) * d + x]) - ref[uint64_t(r) * d + x];
            st[ci].err2 += e * e;
            st[ci].ref2 += double(ref[uint64_t(r) * d + x]) * ref[uint64_t(r) * d + x];
          }
        }
        st[ci].rows += B;
      }
    }
  }
  for (size_t ci = 0; ci < configs.size(); ++ci) {
    const auto [mode, bm] = configs[ci];
    st[ci].dense_s = dense_s;
    nlohmann::json j = StatsJson(st[ci]);
    j["mode"] = ModeName(mode);
    j["rescue"] = mode == RbsMode::kRbs;
    j["base_mass"] = bm;
    j["rescue_share"] = a.rescue_share;
    j["local_blocks"] = a.local_blocks;
    std::fprintf(stderr, "  %s base_mass %.3f: density %.4f retention %.4f err %.5f speedup %.2f\n", ModeName(mode), bm,
                 st[ci].density(), st[ci].retention(), st[ci].rel_error(), st[ci].speedup());
    runs.push_back(std::move(j));
  }
  return {{"tokens", length}, {"query_blocks", qblocks.size()}, {"heads", a.heads}, {"head_dim", d},
          {"needles", s.needles.size()}, {"runs", runs}};
}

}  // namespace

CLI::App* AddBenchSparsePrefillCommand(CLI::App& bench, BenchSparsePrefillArgs& a) {
  CLI::App* c = bench.add_subcommand("sparse-prefill", "RBS-Attention block-sparse prefill against dense (docs/attention.md)");
  c->add_option("--model", a.model, "model file or smollm2-135m (the default)");
  c->add_option("--text-file", a.text_file, "real text for the real-model part");
  c->add_option("--tokens", a.tokens, "real-text prompt tokens (0 = the model's context)")->check(CLI::Range(0u, 1u << 20));
  c->add_option("--chunk", a.chunk, "prefill chunk tokens (a multiple of --block)")->check(CLI::Range(1u, 1u << 16));
  c->add_option("--block", a.block, "RBS block (query and key) tokens")->check(CLI::Range(8u, 1024u));
  c->add_option("--base-mass", a.base_mass, "base branch thresholds for the real part")->delimiter(',')->check(CLI::Range(0.01, 1.0));
  c->add_option("--synthetic-base-mass", a.synthetic_base_mass, "base branch thresholds for the synthetic part")
      ->delimiter(',')
      ->check(CLI::Range(0.01, 1.0));
  c->add_option("--modes", a.modes, "real part: rbs, base_only, base_matched")->delimiter(',');
  c->add_option("--rescue-share", a.rescue_share, "rescue branch threshold")->check(CLI::Range(1e-9, 1e9));
  c->add_option("--local-blocks", a.local_blocks, "key blocks up to the diagonal always computed")->check(CLI::Range(1u, 1u << 16));
  c->add_option("--synthetic-tokens", a.synthetic_tokens, "synthetic prompt lengths")->delimiter(',')->check(CLI::Range(1024u, 1u << 22));
  c->add_option("--sample-blocks", a.sample_blocks, "query blocks sampled per synthetic length")->check(CLI::Range(1u, 1u << 16));
  c->add_option("--heads", a.heads, "synthetic heads")->check(CLI::Range(1, 64));
  c->add_option("--threads", a.threads, "threads (the model's and RBS's)")->check(CLI::Range(1, 256));
  c->add_flag("--skip-real", a.skip_real, "only the synthetic part");
  c->add_flag("--skip-synthetic", a.skip_synthetic, "only the real-model part");
  c->add_flag("--json", a.json, "print one JSON object");
  return c;
}

int RunBenchSparsePrefill(const BenchSparsePrefillArgs& a) {
  return RunCatching("bench sparse-prefill", [&] {
    for (const std::string& m : a.modes)
      if (m != "rbs" && m != "base_only" && m != "base_matched")
        return Fail(kExitUsage, "--modes: '" + m + "' is not rbs, base_only or base_matched");
    if (a.chunk % a.block != 0)
      return Fail(kExitUsage, "--chunk " + std::to_string(a.chunk) + " must be a multiple of --block " + std::to_string(a.block));
    nlohmann::json out = {{"bench", "sparse-prefill"}, {"block", a.block}, {"threads", a.threads},
                          {"simd", std::string(SimdName(DetectedSimd()))}, {"load_average_start", LoadAverage()}};
    if (!a.skip_real) {
      auto real = RunReal(a);
      if (!real.ok()) return Fail(real.status().code() == Code::kInvalidArgument || real.status().code() == Code::kNotFound
                                      ? kExitUsage : kExitFailure, real.status().ToString());
      out["real"] = *real;
    }
    if (!a.skip_synthetic) {
      nlohmann::json syn = nlohmann::json::array();
      for (uint32_t len : a.synthetic_tokens) {
        if (len % a.block != 0 || len / a.block < 2)
          return Fail(kExitUsage, "--synthetic-tokens " + std::to_string(len) + " must be a multiple of --block, >= 2 blocks");
        syn.push_back(RunSynthetic(a, len));
      }
      out["synthetic"] = syn;
    }
    out["load_average_end"] = LoadAverage();
    if (a.json) {
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      std::printf("%s\n", out.dump(1).c_str());
    }
    return kExitOk;
  });
}

}  // namespace flatkv::tools
