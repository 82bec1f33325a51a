// `flatkv bench chain-cache` (bench_chain.h). The workload (fixed by the
// arguments): an agent reads `turns` Python files of --sources, one per turn
// (the sorted *.py files of at least 4 KiB, evenly strided), each turn
//   <|im_start|>user\nRead NAME and tell me what it does.<|im_end|>\n
//   <|im_start|>assistant\n[Before that: PREV begins with\n<the first
//   quote_tokens tokens of the previous tool output>\n]read_file("NAME")
//   <|im_end|>\n<|im_start|>tool\n<the first tool_tokens tokens of the file>
//   <|im_end|>\n
// after a system prompt. Request t's prompt is turns 0..t (one token is
// sampled). Arms, each an Engine of its own over one store:
//   full       every request restores the stored dense prefix and prefills
//              the rest (Engine::Generate);
//   chain      Chain Cache: request t restores request t-1's compacted
//              session, prefills turn t against it, extends the compaction
//              incrementally over kept entries + turn t (ExtendCompacted)
//              and stores the result as a session of its own;
//   recompress the same eviction method over the whole history every turn
//              (CompactKeeping; the dense KV of earlier turns is kept in
//              the engine, as a full-reuse restore would give it);
//   pruned     the stored history without its stale tool outputs (those
//              before the last turn, oldest first, until prune_target of
//              the history's tokens go): Store::Prune, then RestorePruned.
// Quality: the next turn's perplexity (turn t's tokens given the history
// turns 0..t-1), each arm against full, pooled over turns 1.. (pruned: over
// the turns whose prune set reached the target).
#include "bench/bench_chain.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <unistd.h>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "attention/scoring.h"
#include "bench/bench_util.h"
#include "engine/engine.h"
#include "flatkv/placement.h"
#include "flatkv/store.h"
#include "model/model.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

int Fail(int code, const std::string& msg) {
  std::fprintf(stderr, "flatkv bench chain-cache: %s\n", msg.c_str());
  return code;
}

double MsSince(double t0) { return (NowSeconds() - t0) * 1e3; }

struct Turn {
  std::vector<int> tokens;
  uint32_t tool_begin = 0, tool_end = 0;  // the tool output within tokens
};

struct Workload {
  std::vector<Turn> turns;
  std::vector<std::string> files;
};

Result<std::vector<int>> Special(const model::Model& m, const std::string& text) { return m.tokenizer->EncodeSpecial(text, false); }

Result<Workload> MakeWorkload(const model::Model& m, const BenchChainArgs& a) {
  namespace fs = std::filesystem;
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(a.sources, ec))
    if (e.is_regular_file() && e.path().extension() == ".py" && e.file_size() >= 4096) files.push_back(e.path());
  if (ec) return Status::NotFound("--sources " + a.sources + ": " + ec.message());
  std::sort(files.begin(), files.end());
  if (files.size() < a.turns)
    return Status::NotFound("--sources " + a.sources + ": " + std::to_string(files.size()) + " Python files of >= 4 KiB, " +
                            std::to_string(a.turns) + " turns need as many (Debian: apt-get install libpython3.11-stdlib)");
  Workload w;
  std::vector<std::vector<int>> outputs;
  const size_t stride = files.size() / a.turns;
  for (uint32_t k = 0; k < a.turns; ++k) {
    const fs::path& p = files[k * stride];
    std::ifstream in(p, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    text.resize(std::min<size_t>(text.size(), 16 * a.tool_tokens));
    FLATKV_ASSIGN_OR_RETURN(std::vector<int> t, m.tokenizer->Encode(text, false));
    if (t.size() < a.tool_tokens)
      return Status::InvalidArgument(p.string() + ": " + std::to_string(t.size()) + " tokens, --tool-tokens " +
                                     std::to_string(a.tool_tokens));
    t.resize(a.tool_tokens);
    outputs.push_back(std::move(t));
    w.files.push_back(p.filename().string());
  }
  for (uint32_t k = 0; k < a.turns; ++k) {
    Turn turn;
    auto add = [&](const std::string& s) -> Status {
      FLATKV_ASSIGN_OR_RETURN(std::vector<int> t, Special(m, s));
      turn.tokens.insert(turn.tokens.end(), t.begin(), t.end());
      return Status::Ok();
    };
    if (k == 0)
      FLATKV_RETURN_IF_ERROR(add("<|im_start|>system\nYou are a coding agent. You read files with the read_file tool, "
                                 "quote them and explain what they do.<|im_end|>\n"));
    FLATKV_RETURN_IF_ERROR(add("<|im_start|>user\nRead " + w.files[k] + " and tell me what it does.<|im_end|>\n"
                               "<|im_start|>assistant\n"));
    if (k > 0) {
      FLATKV_RETURN_IF_ERROR(add("Before that: " + w.files[k - 1] + " begins with\n"));
      const auto& prev = outputs[k - 1];
      turn.tokens.insert(turn.tokens.end(), prev.begin(), prev.begin() + std::min<size_t>(a.quote_tokens, prev.size()));
      FLATKV_RETURN_IF_ERROR(add("\n"));
    }
    FLATKV_RETURN_IF_ERROR(add("read_file(\"" + w.files[k] + "\")<|im_end|>\n<|im_start|>tool\n"));
    turn.tool_begin = static_cast<uint32_t>(turn.tokens.size());
    turn.tokens.insert(turn.tokens.end(), outputs[k].begin(), outputs[k].end());
    turn.tool_end = static_cast<uint32_t>(turn.tokens.size());
    FLATKV_RETURN_IF_ERROR(add("<|im_end|>\n"));
    w.turns.push_back(std::move(turn));
  }
  return w;
}

struct Pool {  // NLL pooled over turns
  double nll = 0;
  uint64_t count = 0;
  void Add(const engine::ContinuationNll& n) { nll += n.nll_sum, count += n.count; }
  double Ppl() const { return count ? std::exp(nll / count) : 0.0; }
};

}  // namespace

CLI::App* AddBenchChainCommand(CLI::App& bench, BenchChainArgs& a) {
  CLI::App* c = bench.add_subcommand("chain-cache", "Chain Cache and prefix-cache pruning on a multi-turn agent workload (real text)");
  c->add_option("--model", a.model, "GGUF or llama2.c model (default: SmolLM2-135M-Instruct, scripts/install-deps.sh models)");
  c->add_option("--sources", a.sources, "directory of Python files used as tool outputs");
  c->add_option("--dir", a.dir, "the store's SSD directory (default: a fresh one under /tmp, removed after)");
  c->add_option("--turns", a.turns, "agent turns")->check(CLI::Range(3, 64));
  c->add_option("--tool-tokens", a.tool_tokens, "tokens per tool output")->check(CLI::Range(32, 4096));
  c->add_option("--quote-tokens", a.quote_tokens, "tokens of the previous tool output quoted each turn")->check(CLI::Range(0, 1024));
  c->add_option("--keep", a.keep, "entries each KV head keeps after compaction")->check(CLI::Range(16, 1 << 20));
  c->add_option("--window", a.window, "the scorer's observation window")->check(CLI::Range(1, 1024));
  c->add_option("--scorer", a.scorer, "eviction method")->check(CLI::IsMember({"snapkv", "streaming"}));
  c->add_option("--prune-target", a.prune_target, "fraction of the history's tokens the prune set removes")->check(CLI::Range(0.05, 0.95));
  c->add_option("--block-tokens", a.block_tokens, "tokens per block")->check(CLI::Range(16, 512));
  c->add_option("--threads", a.threads, "transformer threads (0: the machine's)")->check(CLI::Range(0, 256));
  c->add_flag("--json", a.json, "print one JSON object");
  return c;
}

int RunBenchChain(const BenchChainArgs& a) {
  return RunCatching("bench chain-cache", [&]() -> int {
    if (!std::filesystem::exists(a.model))
      return Fail(kExitUsage, "--model " + a.model + " not found (scripts/install-deps.sh models installs SmolLM2-135M-Instruct)");
    auto loaded = model::LoadModel(a.model, "");
    if (!loaded.ok()) return Fail(kExitUsage, "--model " + a.model + ": " + loaded.status().ToString());
    const model::Model& m = loaded.value();
    if (!m.tokenizer) return Fail(kExitUsage, "--model " + a.model + " has no tokenizer");
    auto wl = MakeWorkload(m, a);
    if (!wl.ok()) return Fail(kExitUsage, wl.status().ToString());
    const std::vector<Turn>& turns = wl->turns;
    std::vector<std::vector<int>> prompts;  // request t: turns 0..t
    for (const Turn& t : turns) {
      prompts.push_back(prompts.empty() ? std::vector<int>{} : prompts.back());
      prompts.back().insert(prompts.back().end(), t.tokens.begin(), t.tokens.end());
    }
    const uint32_t total = static_cast<uint32_t>(prompts.back().size()), bt = a.block_tokens;

    const bool own_dir = a.dir.empty();
    const std::string dir = own_dir ? (std::filesystem::temp_directory_path() / ("flatkv-chain-" + std::to_string(::getpid()))).string() : a.dir;
    std::filesystem::create_directories(dir);
    struct Cleanup {
      std::string d;
      bool on;
      ~Cleanup() {
        std::error_code ec;
        if (on) std::filesystem::remove_all(d, ec);
      }
    } cleanup{dir, own_dir};
    StoreOptions so;
    so.shape = engine::Engine::ShapeFor(m.config);
    so.block_tokens = bt;
    so.dram_capacity_bytes = 256ull << 20;  // copies of the recent sessions; the homes are on SSD
    so.ssd_dirs = {dir};
    so.ssd_capacity_bytes = 16ull << 30;
    auto store = Store::Open(so);
    if (!store.ok()) return Fail(kExitFailure, "store: " + store.status().ToString());
    engine::EngineOptions eo;
    eo.block_tokens = bt;
    eo.max_context = total + 64;
    eo.threads = a.threads;
    auto make = [&](bool with_store) { return engine::Engine::Create(m, with_store ? store->get() : nullptr, eo); };
    auto full = make(true), chain = make(true), re = make(false), pruned = make(true);
    if (!full.ok() || !chain.ok() || !re.ok() || !pruned.ok()) return Fail(kExitFailure, "engine: " + full.status().ToString());

    std::unique_ptr<attention::Scorer> scorer =
        a.scorer == "streaming" ? attention::MakeStreamingScorer() : attention::MakeSnapKvScorer(a.window);
    attention::CompactOptions co;
    co.scorer = scorer.get();
    co.window = a.window;
    const std::string tag = a.scorer + "-chain-" + std::to_string(a.keep);
    const uint64_t bb = (*store)->BlockBytes();
    engine::GenerateOptions go;
    go.max_new_tokens = 1;

    nlohmann::json per_turn = nlohmann::json::array();
    Pool p_full, p_chain, p_re, p_full_pruned, p_pruned;
    uint64_t evals_chain = 0, evals_re = 0, attn_chain = 0, attn_re = 0, last_chain = 0, last_re = 0;
    uint32_t lookups = 0, hits = 0, pruned_turns = 0;
    double pruned_bytes_sum = 0, logical_bytes_sum = 0;
    attention::CompactedKv chain_state, re_state;
    const double started = NowSeconds();
    for (size_t t = 0; t < turns.size(); ++t) {
      nlohmann::json j = {{"turn", t}, {"file", wl->files[t]}, {"turn_tokens", turns[t].tokens.size()},
                          {"prompt_tokens", prompts[t].size()}};
      const std::vector<int>& turn = turns[t].tokens;
      if (t >= 1) {  // quality of the next turn given history = prompts[t-1]
        const std::vector<int>& h = prompts[t - 1];
        auto snap = full->CachedAsCompacted(static_cast<uint32_t>(h.size()));
        if (!snap.ok()) return Fail(kExitFailure, snap.status().ToString());
        auto nf = full->ScoreCompacted(*snap, turn);
        auto nc = chain->ScoreCompacted(chain_state, turn);
        auto nr = re->ScoreCompacted(re_state, turn);
        if (!nf.ok() || !nc.ok() || !nr.ok()) return Fail(kExitFailure, "scoring: " + nf.status().ToString() + nc.status().ToString());
        p_full.Add(*nf), p_chain.Add(*nc), p_re.Add(*nr);
        j["ppl_full"] = nf->Perplexity(), j["ppl_chain"] = nc->Perplexity(), j["ppl_recompress"] = nr->Perplexity();
        // The stale tool outputs: those before the last turn, oldest first.
        engine::PruneSpec spec;
        spec.logical_blocks = static_cast<uint32_t>(h.size() / bt);
        const uint32_t logical = spec.logical_blocks * bt;
        uint32_t removed = 0, at = 0;
        for (size_t k = 0; k + 1 < t && removed < a.prune_target * logical + bt; ++k) {  // + a block: bytes go by whole blocks
          const uint32_t b = at + turns[k].tool_begin, e = std::min(at + turns[k].tool_end, logical);
          if (b < e) spec.ranges.push_back({b, e}), removed += e - b;
          at += static_cast<uint32_t>(turns[k].tokens.size());
        }
        if (!spec.ranges.empty()) {
          auto pr = pruned->PruneHistory(h, spec);
          if (!pr.ok()) return Fail(kExitFailure, "prune: " + pr.status().ToString());
          const double fraction = 1.0 - static_cast<double>(pr->view_blocks) / spec.logical_blocks;
          ++lookups;
          auto ckv = pruned->RestorePruned(h, spec);
          if (ckv.ok()) ++hits;
          std::vector<int> next(h.begin() + logical, h.end());
          const auto from = static_cast<uint32_t>(next.size() + 1);
          next.insert(next.end(), turn.begin(), turn.end());
          if (ckv.ok()) {
            auto np = pruned->ScoreCompacted(*ckv, next, from);
            if (!np.ok()) return Fail(kExitFailure, "scoring pruned: " + np.status().ToString());
            j["ppl_pruned"] = np->Perplexity();
            if (fraction >= a.prune_target - 1e-9) {
              p_pruned.Add(*np), p_full_pruned.Add(*nf), ++pruned_turns;
              pruned_bytes_sum += static_cast<double>(spec.logical_blocks - pr->view_blocks) * bb;
              logical_bytes_sum += static_cast<double>(spec.logical_blocks) * bb;
            }
          }
          j["pruned_fraction"] = fraction, j["view_blocks"] = pr->view_blocks, j["logical_blocks"] = spec.logical_blocks;
          j["view_hit"] = ckv.ok();
          // The view is a session of its own: drop it, the history's blocks stay for the other arms.
          (void)(*store)->DropSession(pr->view_session);
        }
      }
      // full reuse
      auto rf = full->Generate(1, prompts[t], go);
      if (!rf.ok()) return Fail(kExitFailure, "full: " + rf.status().ToString());
      j["ttft_full_ms"] = rf->timing.ttft_ms;
      j["bytes_full"] = uint64_t{prompts[t].size() / bt} * bb;
      // chain cache
      engine::CompactionWork wc, wr;
      if (t == 0) {
        auto s = chain->CompactKeeping(turn, co, a.keep, &wc);
        if (!s.ok()) return Fail(kExitFailure, "chain: " + s.status().ToString());
        chain_state = std::move(*s);
      } else {
        const double t0 = NowSeconds();
        auto prev = chain->RestoreCompacted(prompts[t - 1], tag);
        if (!prev.ok()) return Fail(kExitFailure, "chain restore: " + prev.status().ToString());
        const double restore_ms = MsSince(t0);
        auto g = chain->GenerateCompacted(*prev, turn, go);
        if (!g.ok()) return Fail(kExitFailure, "chain generate: " + g.status().ToString());
        j["ttft_chain_ms"] = MsSince(t0), j["chain_restore_ms"] = restore_ms;
        auto s = chain->ExtendCompacted(*prev, turn, co, a.keep, &wc);
        if (!s.ok()) return Fail(kExitFailure, "chain extend: " + s.status().ToString());
        chain_state = std::move(*s);
        j["chain_compact_ms"] = wc.prefill_ms + wc.score_ms;
      }
      if (Status st = chain->PutCompacted(2, prompts[t], chain_state, tag); !st.ok())
        return Fail(kExitFailure, "chain put: " + st.ToString());
      j["bytes_chain"] = uint64_t{attention::CompactedBlocks(chain_state, bt)} * bb;
      // recompress every turn
      auto s = re->CompactKeeping(prompts[t], co, a.keep, &wr, t == 0 ? 0 : static_cast<uint32_t>(prompts[t - 1].size()));
      if (!s.ok()) return Fail(kExitFailure, "recompress: " + s.status().ToString());
      re_state = std::move(*s);
      j["ttft_recompress_ms"] = rf->timing.ttft_ms + wr.score_ms;
      j["recompress_score_ms"] = wr.score_ms;
      j["score_evals_chain"] = wc.score_evals, j["score_evals_recompress"] = wr.score_evals;
      j["candidates_chain"] = wc.candidates, j["candidates_recompress"] = wr.candidates;
      if (t >= 1) {
        evals_chain += wc.score_evals, evals_re += wr.score_evals;
        attn_chain += wc.score_evals + wc.prefill_evals, attn_re += wr.score_evals + wr.prefill_evals;
        last_chain = wc.score_evals, last_re = wr.score_evals;
      }
      if (a.json)  // progress on stderr; stdout holds only the JSON
        std::fprintf(stderr, "turn %zu of %zu: %zu tokens, %.0f s\n", t + 1, turns.size(), prompts[t].size(),
                     NowSeconds() - started);
      else
        std::printf("turn %2zu  %5zu tokens  ttft full %7.1f chain %7.1f recompress %7.1f ms  evals chain %10llu recompress %10llu%s\n",
                    t, prompts[t].size(), rf->timing.ttft_ms, j.value("ttft_chain_ms", 0.0), rf->timing.ttft_ms + wr.score_ms,
                    static_cast<unsigned long long>(wc.score_evals), static_cast<unsigned long long>(wr.score_evals),
                    j.contains("ppl_full") ? (" ppl full " + std::to_string(j["ppl_full"].get<double>()) + " chain " +
                                              std::to_string(j["ppl_chain"].get<double>()) + " recompress " +
                                              std::to_string(j["ppl_recompress"].get<double>()) +
                                              (j.contains("ppl_pruned") ? " pruned " + std::to_string(j["ppl_pruned"].get<double>()) : ""))
                                                 .c_str()
                                           : "");
      per_turn.push_back(std::move(j));
    }
    const double ratio = evals_chain ? static_cast<double>(evals_re) / evals_chain : 0.0;
    const double chain_delta = p_full.Ppl() > 0 ? p_chain.Ppl() / p_full.Ppl() - 1 : 0;
    const double re_delta = p_full.Ppl() > 0 ? p_re.Ppl() / p_full.Ppl() - 1 : 0;
    const double ppl_delta = p_full_pruned.Ppl() > 0 ? p_pruned.Ppl() / p_full_pruned.Ppl() - 1 : 0;
    const double pruned_fraction = logical_bytes_sum > 0 ? pruned_bytes_sum / logical_bytes_sum : 0;
    nlohmann::json out = {
        {"bench", "chain-cache"},
        {"model", a.model},
        {"sources", a.sources},
        {"turns", a.turns},
        {"tool_tokens", a.tool_tokens},
        {"quote_tokens", a.quote_tokens},
        {"history_tokens", total},
        {"scorer", a.scorer},
        {"window", a.window},
        {"keep_per_head", a.keep},
        {"block_tokens", bt},
        {"compression_work_ratio", ratio},
        {"compression_work_ratio_last_turn", last_chain ? static_cast<double>(last_re) / last_chain : 0.0},
        {"attention_work_ratio", attn_chain ? static_cast<double>(attn_re) / attn_chain : 0.0},
        {"ppl_full", p_full.Ppl()},
        {"ppl_chain", p_chain.Ppl()},
        {"ppl_recompress", p_re.Ppl()},
        {"chain_ppl_delta", chain_delta},
        {"recompress_ppl_delta", re_delta},
        {"prune_target", a.prune_target},
        {"pruned_fraction", pruned_fraction},
        {"pruned_turns", pruned_turns},
        {"ppl_delta", ppl_delta},
        {"lookup_hits", hits},
        {"lookup_requests", lookups},
        {"goals",
         {{"chain_work_ratio_ge_5", ratio >= 5.0},
          {"chain_ppl_at_most_1pct_above_recompress", p_chain.Ppl() <= 1.01 * p_re.Ppl()},
          {"pruned_half_ppl_delta_le_2pct", pruned_fraction >= 0.5 && ppl_delta <= 0.02},
          {"lookups_hit", lookups > 0 && hits == lookups}}},
        {"wall_s", NowSeconds() - started},
        {"load_average", LoadAverage()},
        {"per_turn", per_turn},
    };
    if (a.json) {
      std::printf("%s\n", out.dump(2).c_str());
    } else {
      std::printf("compression work ratio %.2f (last turn %.2f), attention work ratio %.2f\n", ratio,
                  out["compression_work_ratio_last_turn"].get<double>(), out["attention_work_ratio"].get<double>());
      std::printf("next-turn ppl: full %.4f  chain %.4f (%+.2f%%)  recompress %.4f (%+.2f%%)\n", p_full.Ppl(), p_chain.Ppl(),
                  100 * chain_delta, p_re.Ppl(), 100 * re_delta);
      std::printf("pruned %.1f%% of the history's bytes over %u turns: ppl %+.2f%%, lookups %u/%u hit\n", 100 * pruned_fraction,
                  pruned_turns, 100 * ppl_delta, hits, lookups);
    }
    return kExitOk;
  });
}

}  // namespace flatkv::tools
