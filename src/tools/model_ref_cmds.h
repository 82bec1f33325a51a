// `flatkv model tensors|tokenize|score|greedy`: the model's parts one at a
// time, in forms an outside reference can compare bit for bit
// (tests/refs/, docs/models.md):
//   tensors   every GGUF tensor dequantized to raw fp32 files plus index.json;
//   tokenize  a text's token ids as JSON (BOS as the file's add_bos_token says);
//   score     teacher-forced fp32 logits of every position of a token list;
//   greedy    the engine's greedy continuation of a token list.
#pragma once

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

namespace flatkv::tools {

struct ModelRefArgs {
  std::string model;
  std::string tokenizer;    // llama2.c tokenizer file (tokenize of a .bin model)
  std::string out;          // tensors: a directory; score: a file
  std::string text;         // tokenize --text
  std::string text_file;    // tokenize --text-file
  bool special = false;     // tokenize: parse special-token text
  bool chat = false;        // tokenize: render the text as one user chat message
  std::string tokens_file;  // score, greedy: a JSON array of ids
  uint32_t prefill_chunk = 0;  // 0 = the whole prompt in one prefill
  uint32_t steps = 0;
  bool json = false;
  bool ignore_eos = false;  // greedy: run all steps past the end-of-generation token
};

// Adds `model` with its four subcommands; returns the parent.
CLI::App* AddModelRefCommands(CLI::App& app, ModelRefArgs& args);
// Runs whichever subcommand was parsed.
int RunModelRef(CLI::App& model_cmd, const ModelRefArgs& args);

}  // namespace flatkv::tools
