// What `flatkv bench engine` measures with, besides the engine: the model
// file (a path or the `smollm2-135m` preset), the prompt text (real source
// files, tokenized by the model's own tokenizer) and llama.cpp measured
// beside the engine on the same GGUF (bench/llamacpp_bench.py, run with the
// refs Python environment's llama_cpp).
//
// Thread-safety: plain functions; none shares state.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "flatkv/status.h"
#include "model/model.h"

namespace flatkv::tools {

// The file SmolLM2-135M-Instruct Q4_1 is installed as: $FLATKV_SMOLLM2 when
// set, else <source dir>/build/models/SmolLM2-135M-Instruct.Q4_1.gguf.
std::string SmolLm2Path();

// `--model` as given: "smollm2-135m" is SmolLm2Path(), which must exist (the
// error names the file and `scripts/install-deps.sh models`); anything else
// is a path, returned as is.
Result<std::string> ResolveModelPath(const std::string& model);

// Lower-case hex SHA-256 of a whole file.
Result<std::string> FileSha256(const std::string& path);

// The prompt text: kPromptTextFiles under kPromptTextDir, concatenated in
// that order, tokenized without BOS by the model's tokenizer.
inline constexpr const char* kPromptTextDir = "/usr/lib/python3.11";
inline constexpr const char* kPromptTextFiles[] = {"textwrap.py", "heapq.py", "queue.py", "shlex.py"};
struct PromptText {
  std::vector<int> tokens;
  nlohmann::json files;  // [{"path", "bytes", "sha256"}] in concatenation order
};
// Fails naming the file that cannot be read, or when the text gives fewer
// than `min_tokens` tokens.
Result<PromptText> LoadPromptText(const model::Model& model, size_t min_tokens);

// `s` in single quotes for /bin/sh.
std::string ShellQuote(const std::string& s);

// Runs `python script args` (args already shell-quoted, starting with a
// space), its stderr kept in scratch_dir; returns the JSON it printed on
// stdout. Errors name `what`, the script and its exit status and stderr.
Result<nlohmann::json> RunPythonJson(const std::string& python, const std::string& script, const std::string& args,
                                     const std::string& scratch_dir, const std::string& what);

// llama.cpp on one model and a set of prompts (token ids), measured by
// bench/llamacpp_bench.py in a child process.
struct LlamaCppOptions {
  std::string python;     // the interpreter with llama_cpp (default: <source dir>/build/pyenv/refs/bin/python)
  std::string script;     // default: <source dir>/bench/llamacpp_bench.py
  uint32_t threads = 2;   // n_threads and n_threads_batch
  uint32_t decode_tokens = 64;
  uint32_t reps = 3;
  uint32_t n_ctx = 8192;  // llama.cpp's context: at least the longest prompt plus decode_tokens
  std::string scratch_dir;  // where the prompts file is written
};
struct LlamaCppRun {
  uint32_t prompt_tokens = 0;
  double prefill_tok_s = 0;  // median over reps
  double decode_tok_s = 0;   // median over reps
  std::vector<int> tokens;   // greedy tokens of the first rep (the first from the prefill's logits)
};
struct LlamaCppResult {
  std::vector<LlamaCppRun> runs;  // one per prompt, in order
  nlohmann::json settings;        // what the script reports: version, n_ctx, n_batch, n_ubatch, threads, ...
};
// Fails naming the interpreter and `scripts/install-deps.sh pyenv:refs`
// when the interpreter is missing, and with the script's stderr when it fails.
Result<LlamaCppResult> RunLlamaCpp(const std::string& model_path, const std::vector<std::vector<int>>& prompts,
                                   const LlamaCppOptions& options);

}  // namespace flatkv::tools
