#include "bench/bench_peer_eval.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "bench/bench_engine_inputs.h"

namespace flatkv::tools {

Result<nlohmann::json> RunPeerScript(const model::Model& m, const std::vector<eval::Prompt>& prompts,
                                     const PeerScript& s) {
  const std::string src = FLATKV_SOURCE_DIR;
  const std::string python = s.python.empty() ? src + "/build/pyenv/kvpeers/bin/python" : s.python;
  const std::string hf = s.hf_model_dir.empty() ? src + "/build/models/smollm2-135m-hf" : s.hf_model_dir;
  if (!std::filesystem::exists(python))
    return Status::NotFound(s.what + " peer: the Python interpreter " + python +
                            " is missing (scripts/install-deps.sh pyenv:kvpeers installs kvpress, transformers and "
                            "optimum-quanto; --peers none skips the peers)");
  if (!std::filesystem::exists(hf + "/config.json"))
    return Status::NotFound(s.what + " peer: " + hf +
                            " is missing (scripts/install-deps.sh pyenv:vllm converts the GGUF to it)");
  const std::string scratch =
      std::filesystem::temp_directory_path() / ("flatkv-" + s.what + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(scratch);
  const std::string wl = scratch + "/workload.json";
  {
    std::ofstream f(wl);
    f << eval::WorkloadJson(m, prompts).dump();
    if (!f) return Status::IoError(s.what + " peer: write " + wl);
  }
  const std::string args = " --model-dir " + ShellQuote(hf) + " --workload " + ShellQuote(wl) + s.args;
  auto j = RunPythonJson(python, src + "/bench/" + s.script, args, scratch, s.what);
  std::filesystem::remove_all(scratch);
  return j;
}

Result<eval::PromptResult> PeerPromptResult(const nlohmann::json& r, const eval::Prompt& p, const eval::PromptResult& ref,
                                            const std::string& what) {
  try {
    eval::PromptResult pr;
    pr.id = r.at("id").get<std::string>();
    if (pr.id != p.id) return Status::Corruption(what + " peer: prompt order differs at " + pr.id + " (expected " + p.id + ")");
    pr.kind = p.kind;
    pr.context_tokens = uint32_t(p.context.size());
    pr.scored = r.value("scored", 0u);
    pr.nll = r.value("nll", 0.0);
    pr.nll_full = r.value("nll_full", 0.0);
    pr.kl_sum = r.value("kl_sum", 0.0);
    pr.greedy_common = r.at("greedy_common").get<uint32_t>();
    pr.greedy_tokens = r.at("greedy_tokens").get<uint32_t>();
    pr.retrieval_correct = r.value("retrieval_correct", -1);
    pr.answer_text = r.value("answer_text", "");
    // The filter is the prompt's, from flatkv's exact-cache reference.
    pr.filter_nll_context = ref.filter_nll_context;
    pr.filter_nll_none = ref.filter_nll_none;
    pr.filter_scored = ref.filter_scored;
    return pr;
  } catch (const nlohmann::json::exception& ex) {
    return Status::Corruption(what + " peer: malformed result for " + p.id + ": " + ex.what());
  }
}

nlohmann::json JsonNum(double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr); }

nlohmann::json PerPromptJson(const std::vector<eval::PromptResult>& results) {
  nlohmann::json per = nlohmann::json::array();
  for (const auto& r : results) {
    nlohmann::json pj = {{"id", r.id}, {"greedy_agreement", JsonNum(r.greedy_agreement())}};
    if (r.scored) pj["ppl_delta"] = JsonNum(r.ppl_delta()), pj["kl"] = JsonNum(r.kl());
    if (r.retrieval_correct >= 0) pj["retrieval_correct"] = r.retrieval_correct == 1;
    per.push_back(pj);
  }
  return per;
}

}  // namespace flatkv::tools
