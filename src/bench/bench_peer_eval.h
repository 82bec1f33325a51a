// Peers of the `bench ... --model` runs (bench codecs: transformers' quantized cache; bench
// attention: kvpress) that run the end-to-end protocol (docs/eval.md) in Python on the same
// prompts: the workload is handed over as `flatkv workload` JSON and every prompt's result comes
// back in the protocol's fields, pooled here by the same code as flatkv's own rows.
// Thread-safety: plain functions.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "eval/protocol.h"
#include "eval/workload.h"
#include "flatkv/status.h"
#include "model/model.h"

namespace flatkv::tools {

struct PeerScript {
  std::string what;         // the peer's name in errors ("quanto", "kvpress")
  std::string script;       // under <source>/bench/
  std::string python;       // default: <source>/build/pyenv/kvpeers/bin/python
  std::string hf_model_dir; // default: <source>/build/models/smollm2-135m-hf
  std::string args;         // after --model-dir and --workload, already shell-quoted, starting with a space
};

// Writes the prompts to a scratch directory, runs `python script --model-dir D --workload F args`
// and returns the JSON it printed. A missing interpreter or converted model is NotFound naming the
// command that installs it.
Result<nlohmann::json> RunPeerScript(const model::Model& m, const std::vector<eval::Prompt>& prompts,
                                     const PeerScript& s);

// One prompt's result as a peer printed it (id, scored, nll, nll_full, kl_sum, greedy_common,
// greedy_tokens, retrieval_correct); the context-helps filter is the prompt's, from flatkv's
// exact-cache reference `ref`. Checks the id against `p`'s.
Result<eval::PromptResult> PeerPromptResult(const nlohmann::json& r, const eval::Prompt& p, const eval::PromptResult& ref,
                                            const std::string& what);

// A JSON number, or null where `x` is not finite (no prompt passed the filter, say).
nlohmann::json JsonNum(double x);

// The `per_prompt` array of a `--model` entry: id, greedy_agreement, and ppl_delta and kl where
// the prompt was scored, retrieval_correct where it has a key; flatkv's rows and the peers' alike.
nlohmann::json PerPromptJson(const std::vector<eval::PromptResult>& results);

}  // namespace flatkv::tools
