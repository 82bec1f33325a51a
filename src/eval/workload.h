// The real-text workload set (docs/eval.md): prompts built from text no one
// here wrote and that every Debian 12 machine has, Python 3.11's standard
// library sources under /usr/lib/python3.11 (libpython3.11-minimal and
// -stdlib), tokenized by the model's own tokenizer.
//
// Two committed files define it (data/workload/):
//   realtext.sha256  the source files, sha256sum format, paths relative to the root;
//                    a file missing or with another SHA-256 is an error naming it;
//   realtext.tsv     one prompt per line: id, kind, context tokens, sources, options
//                    (tab-separated; '#' starts a comment line).
// Kinds:
//   long       one source read from `@offset` tokens: context = the next
//              `context` tokens, continuation = the `continuation` after them.
//              The source `pydoc_data/topics.py#text` is the text of that
//              file's string literals (the Python reference's prose).
//   multidoc   several sources in sequence, each preceded by a "# file: PATH"
//              line; all but the last whole, the last cut to fill `context`,
//              its next tokens the continuation. docs holds the pieces.
//   retrieval  a pass key (5 digits derived from the id) planted at
//              `depth=F` of a filler source, inside SmolLM2's ChatML user
//              turn; question = the end of the turn, the assistant's start
//              and "The pass key is"; answer = the digits.
// Building is deterministic: the same files and tokenizer give the same
// token ids (exported by `flatkv workload`, for peers that run elsewhere).
//
// Thread-safety: plain functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "flatkv/status.h"
#include "model/model.h"

namespace flatkv::eval {

enum class PromptKind : uint8_t { kLong, kMultiDoc, kRetrieval };
const char* PromptKindName(PromptKind kind);

struct Prompt {
  std::string id;
  PromptKind kind = PromptKind::kLong;
  std::string genre;                    // "code" or "prose"
  std::vector<int> context;             // the tokens whose KV a lossy path transforms
  std::vector<std::vector<int>> docs;   // context cut at document boundaries (multidoc; else one piece)
  std::vector<int> continuation;        // real text after the context (long, multidoc)
  std::vector<int> question;            // retrieval: fed after the context
  std::string answer;                   // retrieval: the pass key's digits
};

struct WorkloadOptions {
  std::string data_dir;                       // holds realtext.tsv and realtext.sha256 (<source>/data/workload)
  std::string list_path;                      // default: data_dir/realtext.tsv
  std::string sha256_path;                    // default: data_dir/realtext.sha256
  std::string root = "/usr/lib/python3.11";
  uint32_t continuation_tokens = 256;
  uint32_t max_context = 0;                   // > 0: only prompts with context <= this
  std::vector<std::string> kinds;             // empty: every kind; else "long", "multidoc", "retrieval"
  std::vector<std::string> ids;               // empty: every prompt; else exactly these ids
};

// One line of realtext.tsv.
struct PromptSpec {
  std::string id;
  PromptKind kind = PromptKind::kLong;
  uint32_t context = 0;
  std::vector<std::string> sources;  // "path" or "path@offset" (long)
  double depth = 0;                  // retrieval
};
// Parses the list; errors name the line and the field.
Result<std::vector<PromptSpec>> ParseWorkloadList(std::string_view text);

// Builds the prompts the options select, in list order. Fails naming the
// file that is missing or altered (and the Debian package it comes from),
// or the prompt whose source is too short for its context.
Result<std::vector<Prompt>> BuildWorkload(const model::Model& model, const WorkloadOptions& options);

// {"version": 1, "model", "prompts": [{id, kind, genre, context, docs, continuation, question, answer}]}:
// what `flatkv workload --out` writes (docs/eval.md).
nlohmann::json WorkloadJson(const model::Model& model, const std::vector<Prompt>& prompts);

// Lower-case hex SHA-256 of `bytes`.
std::string Sha256Hex(std::string_view bytes);

}  // namespace flatkv::eval
