#include "tools/workload_cmd.h"

#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "bench/bench_engine_inputs.h"
#include "eval/protocol.h"
#include "eval/workload.h"
#include "tools/tool_common.h"

namespace flatkv::tools {

CLI::App* AddWorkloadCommand(CLI::App& app, WorkloadArgs& a) {
  CLI::App* c = app.add_subcommand("workload", "The real-text workload set: build, export as JSON, check (docs/eval.md)");
  c->add_option("--model", a.model, "GGUF model whose tokenizer builds it (smollm2-135m = build/models' SmolLM2)");
  c->add_option("--out", a.out, "write the prompts' token ids to this JSON file");
  c->add_option("--kinds", a.kinds, "only these kinds: long, multidoc, retrieval");
  c->add_option("--ids", a.ids, "only these prompt ids");
  c->add_option("--max-context", a.max_context, "only prompts whose context is at most this many tokens");
  c->add_flag("--eval", a.eval, "run each prompt's exact-cache reference: context-helps filter, retrieval answer");
  c->add_flag("--json", a.json, "print one JSON object");
  return c;
}

int RunWorkload(const WorkloadArgs& a) {
  return RunCatching("workload", [&]() -> int {
    auto path = ResolveModelPath(a.model);
    if (!path.ok()) return std::fprintf(stderr, "flatkv workload: --model: %s\n", path.status().ToString().c_str()), kExitUsage;
    auto m = model::LoadModel(*path, "");
    if (!m.ok()) return std::fprintf(stderr, "flatkv workload: --model %s: %s\n", path->c_str(), m.status().ToString().c_str()), kExitUsage;
    eval::WorkloadOptions wo;
  wo.data_dir = std::string(FLATKV_SOURCE_DIR) + "/data/workload";
    wo.kinds = a.kinds;
    wo.ids = a.ids;
    wo.max_context = a.max_context;
    auto prompts = eval::BuildWorkload(*m, wo);
    if (!prompts.ok()) return std::fprintf(stderr, "flatkv workload: %s\n", prompts.status().ToString().c_str()), kExitFailure;
    if (!a.out.empty()) {
      std::ofstream out(a.out);
      out << eval::WorkloadJson(*m, *prompts).dump() << "\n";
      if (!out) return std::fprintf(stderr, "flatkv workload: cannot write --out %s\n", a.out.c_str()), kExitFailure;
    }
    nlohmann::json rows = nlohmann::json::array();
    uint32_t retr = 0, correct = 0;
    for (const eval::Prompt& p : *prompts) {
      nlohmann::json r = {{"id", p.id}, {"kind", eval::PromptKindName(p.kind)}, {"genre", p.genre},
                          {"context_tokens", p.context.size()}, {"docs", p.docs.size()},
                          {"continuation_tokens", p.continuation.size()}};
      if (a.eval) {
        auto e = eval::PromptEvaluator::Create(*m, p, eval::ProtocolOptions{});
        if (!e.ok()) return std::fprintf(stderr, "flatkv workload: %s\n", e.status().ToString().c_str()), kExitFailure;
        const eval::PromptResult& ref = (*e)->reference();
        r["prefill_ms"] = (*e)->prefill_ms();
        if (ref.scored > 0) {
          r["ppl_full"] = ref.ppl_full();
          r["filter_ppl_context"] = std::exp(ref.filter_nll_context / ref.filter_scored);
          r["filter_ppl_none"] = std::exp(ref.filter_nll_none / ref.filter_scored);
          r["context_helps"] = ref.context_helps();
        }
        if (ref.retrieval_correct >= 0) {
          r["retrieval_correct"] = ref.retrieval_correct == 1;
          r["answer"] = p.answer;
          r["answer_text"] = ref.answer_text;
          ++retr, correct += ref.retrieval_correct;
        }
        if (!a.json) std::fprintf(stderr, "%s\n", r.dump().c_str());
      }
      rows.push_back(r);
    }
    nlohmann::json j = {{"model", *path}, {"prompts", rows}};
    if (a.eval && retr > 0) j["full_cache_retrieval_accuracy"] = double(correct) / retr;
    if (a.json) {
      std::printf("%s\n", j.dump(1).c_str());
    } else {
      for (const auto& r : rows)
        std::printf("%-22s %-9s %-5s context %5d  docs %d  continuation %d\n", r["id"].get<std::string>().c_str(),
                    r["kind"].get<std::string>().c_str(), r["genre"].get<std::string>().c_str(),
                    r["context_tokens"].get<int>(), r["docs"].get<int>(), r["continuation_tokens"].get<int>());
      if (j.contains("full_cache_retrieval_accuracy"))
        std::printf("full-cache retrieval accuracy: %u / %u\n", correct, retr);
    }
    return kExitOk;
  });
}

}  // namespace flatkv::tools
