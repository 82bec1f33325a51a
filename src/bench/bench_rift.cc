// The workload of `flatkv bench rift` (docs/attention.md, "Self-speculative
// decoding"; figures in docs/benchmarks.md): per --text-files file, its first
// --prompt-tokens tokens (SmolLM2's tokenizer, no BOS) as a plain
// continuation prompt, --new-tokens greedy tokens (no stop at EOS). One
// prefill per prompt; then target-only greedy decoding (the reference, and
// the wall-time baseline), then speculative decoding per --modes with
// gamma --gamma and a drafter KV budget of --budget-fraction of the prompt
// per (layer, KV head), the --window newest positions included. Reported per
// prompt and mode: acceptance_length (tokens emitted per draft+verify step;
// gamma + 1 at most, what a full-cache drafter gets by construction), its
// value per quarter of the output (staleness shows as a fall), refreshes and
// the query.key products they computed, ms per emitted token against
// target-only, and outputs_identical.
#include "bench/bench_rift.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "bench/bench_engine_inputs.h"
#include "bench/bench_util.h"
#include "engine/speculative.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

int Fail(int code, const std::string& msg) {
  std::fprintf(stderr, "flatkv bench rift: %s\n", msg.c_str());
  return code;
}

// Acceptance length per quarter of the output (by the position of a step's first token).
nlohmann::json Quarters(const engine::SpeculativeResult& r, uint32_t n) {
  double emitted[4] = {0, 0, 0, 0}, steps[4] = {0, 0, 0, 0};
  uint64_t at = 1;  // the first token comes from the prompt
  for (uint8_t e : r.emitted_per_step) {
    const int qi = std::min<int>(3, static_cast<int>(4 * at / n));
    emitted[qi] += e;
    steps[qi] += 1;
    at += e;
  }
  nlohmann::json j = nlohmann::json::array();
  for (int i = 0; i < 4; ++i) j.push_back(steps[i] ? emitted[i] / steps[i] : 0.0);
  return j;
}

}  // namespace

CLI::App* AddBenchRiftCommand(CLI::App& bench, BenchRiftArgs& a) {
  CLI::App* c = bench.add_subcommand("rift", "self-speculative decoding with RIFT selection refresh (docs/attention.md)");
  c->add_option("--model", a.model, "model file or smollm2-135m (the default)");
  c->add_option("--text-files", a.text_files, "one prompt per file")->delimiter(',');
  c->add_option("--prompt-tokens", a.prompt_tokens, "prompt tokens")->check(CLI::Range(64u, 1u << 20));
  c->add_option("--new-tokens", a.new_tokens, "tokens generated")->check(CLI::Range(1u, 1u << 20));
  c->add_option("--gamma", a.gamma, "drafted tokens per step")->check(CLI::Range(1u, 32u));
  c->add_option("--budget-fraction", a.budget_fraction, "drafter KV budget, of the prompt")->check(CLI::Range(0.001, 1.0));
  c->add_option("--window", a.window, "recent positions in the drafter's budget")->check(CLI::Range(1u, 1u << 20));
  c->add_option("--refresh-every", a.refresh_every, "tokens between refreshes (mode every)")->check(CLI::Range(1u, 1u << 20));
  c->add_option("--modes", a.modes, "prefill, every, adaptive")->delimiter(',');
  c->add_option("--threads", a.threads, "transformer threads")->check(CLI::Range(1, 256));
  c->add_flag("--json", a.json, "print one JSON object");
  return c;
}

int RunBenchRift(const BenchRiftArgs& a) {
  return RunCatching("bench rift", [&] {
    std::vector<engine::RefreshMode> modes;
    for (const std::string& s : a.modes) {
      auto m = engine::ParseRefreshMode(s);
      if (!m.ok()) return Fail(kExitUsage, "--modes: " + m.status().ToString());
      modes.push_back(*m);
    }
    auto path = ResolveModelPath(a.model);
    if (!path.ok()) return Fail(kExitUsage, path.status().ToString());
    auto loaded = model::LoadModel(*path, "");
    if (!loaded.ok()) return Fail(kExitUsage, "--model " + *path + ": " + loaded.status().ToString());
    const model::Model& m = *loaded;
    if (!m.tokenizer) return Fail(kExitUsage, "--model " + *path + " has no tokenizer");
    const uint32_t budget = static_cast<uint32_t>(a.budget_fraction * a.prompt_tokens);
    if (budget <= a.window)
      return Fail(kExitUsage, "--window " + std::to_string(a.window) + " must be below the budget " + std::to_string(budget));
    nlohmann::json prompts = nlohmann::json::array();
    std::vector<double> acc_sum(modes.size(), 0.0);
    bool all_identical = true;
    engine::SelfSpeculativeDecoder dec(m, a.prompt_tokens + a.new_tokens + a.gamma + 2, a.threads);
    for (const std::string& file : a.text_files) {
      std::ifstream in(file, std::ios::binary);
      if (!in) return Fail(kExitUsage, "--text-files: cannot open " + file);
      std::stringstream ss;
      ss << in.rdbuf();
      auto enc = m.tokenizer->Encode(ss.str(), false);
      if (!enc.ok()) return Fail(kExitFailure, file + ": " + enc.status().ToString());
      if (enc->size() < a.prompt_tokens)
        return Fail(kExitUsage, file + " gives " + std::to_string(enc->size()) + " tokens, fewer than --prompt-tokens " +
                                    std::to_string(a.prompt_tokens));
      const std::vector<int> prompt(enc->begin(), enc->begin() + a.prompt_tokens);
      if (Status s = dec.Prefill(prompt); !s.ok()) return Fail(kExitFailure, s.ToString());
      std::fprintf(stderr, "%s: prefill %.1f s\n", file.c_str(), dec.prefill_ms() / 1000);
      auto target = dec.Target(a.new_tokens, false);
      if (!target.ok()) return Fail(kExitFailure, target.status().ToString());
      const double target_ms_tok = target->decode_ms / double(target->tokens.size());
      std::fprintf(stderr, "  target-only: %.1f ms/token\n", target_ms_tok);
      auto sha = FileSha256(file);
      nlohmann::json runs = nlohmann::json::array();
      for (size_t mi = 0; mi < modes.size(); ++mi) {
        engine::SpeculativeOptions o;
        o.gamma = a.gamma;
        o.max_new_tokens = a.new_tokens;
        o.kv_budget = budget;
        o.window = a.window;
        o.refresh = modes[mi];
        o.refresh_every = a.refresh_every;
        auto r = dec.Speculative(o);
        if (!r.ok()) return Fail(kExitFailure, r.status().ToString());
        const bool identical = r->tokens == target->tokens;
        all_identical = all_identical && identical;
        const double ms_tok = r->decode_ms / double(r->tokens.size());
        acc_sum[mi] += r->acceptance_length();
        std::fprintf(stderr, "  %s: acceptance %.3f (of %u), refreshes %u (%.3g q.k), %.1f ms/token, identical %d\n",
                     engine::RefreshModeName(modes[mi]).c_str(), r->acceptance_length(), a.gamma + 1, r->refreshes,
                     double(r->refresh_score_evals), ms_tok, identical);
        runs.push_back({{"refresh_mode", engine::RefreshModeName(modes[mi])},
                        {"refresh_every", modes[mi] == engine::RefreshMode::kEveryN ? nlohmann::json(a.refresh_every) : nlohmann::json(nullptr)},
                        {"acceptance_length", r->acceptance_length()},
                        {"acceptance_fraction", r->acceptance_length() / (a.gamma + 1)},
                        {"acceptance_by_quarter", Quarters(*r, a.new_tokens)},
                        {"steps", r->steps},
                        {"refreshes", r->refreshes},
                        {"refresh_score_evals", r->refresh_score_evals},
                        {"prefill_selection_score_evals", r->prefill_score_evals},
                        {"outputs_identical", identical},
                        {"ms_per_token", ms_tok},
                        {"ms_per_token_vs_target", ms_tok / target_ms_tok},
                        {"draft_ms", r->draft_ms},
                        {"verify_ms", r->verify_ms},
                        {"refresh_ms", r->refresh_ms}});
      }
      prompts.push_back({{"file", file},
                         {"sha256", sha.ok() ? *sha : ""},
                         {"prompt_tokens", a.prompt_tokens},
                         {"prefill_ms", dec.prefill_ms()},
                         {"target_ms_per_token", target_ms_tok},
                         {"runs", runs}});
    }
    nlohmann::json summary = nlohmann::json::array();
    for (size_t mi = 0; mi < modes.size(); ++mi) {
      const double acc = acc_sum[mi] / double(a.text_files.size());
      summary.push_back({{"refresh_mode", engine::RefreshModeName(modes[mi])},
                         {"acceptance_length", acc},
                         {"acceptance_fraction", acc / (a.gamma + 1)}});
    }
    const nlohmann::json out = {{"bench", "rift"},
                                {"model", *path},
                                {"gamma", a.gamma},
                                {"kv_budget", budget},
                                {"kv_budget_fraction", a.budget_fraction},
                                {"window", a.window},
                                {"new_tokens", a.new_tokens},
                                {"threads", a.threads},
                                {"full_cache_acceptance_length", a.gamma + 1},
                                {"outputs_identical", all_identical},
                                {"summary", summary},
                                {"prompts", prompts},
                                {"load_average_end", LoadAverage()}};
    std::printf("%s\n", out.dump(a.json ? 2 : 1).c_str());
    return all_identical ? kExitOk : Fail(kExitFailure, "speculative output differs from target-only greedy decoding");
  });
}

}  // namespace flatkv::tools
