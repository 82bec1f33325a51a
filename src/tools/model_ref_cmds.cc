#include "tools/model_ref_cmds.h"

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "io/posix_file.h"
#include "model/chat.h"
#include "model/gguf.h"
#include "model/gguf_tokenizer.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/transformer.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

int Fail(const std::string& cmd, int code, const std::string& msg) {
  std::fprintf(stderr, "flatkv model %s: %s\n", cmd.c_str(), msg.c_str());
  return code;
}

bool IsGguf(const std::string& path) { return path.size() >= 5 && path.compare(path.size() - 5, 5, ".gguf") == 0; }

Status WriteFile(const std::string& path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::IoError(path + ": cannot create");
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  out.close();
  if (!out) return Status::IoError(path + ": write failed");
  return Status::Ok();
}

// The ids of a JSON array file, each checked against the vocabulary.
Result<std::vector<int>> ReadIds(const std::string& path, int vocab) {
  FLATKV_ASSIGN_OR_RETURN(std::string text, io::ReadWholeFile(path));
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array())
    return Status::InvalidArgument("--tokens-file " + path + ": not a JSON array of token ids");
  std::vector<int> ids;
  ids.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_integer())
      return Status::InvalidArgument("--tokens-file " + path + ": element " + std::to_string(i) + " is not an integer");
    const int64_t v = j[i].get<int64_t>();
    if (v < 0 || v >= vocab)
      return Status::InvalidArgument("--tokens-file " + path + ": token " + std::to_string(i) + " is " +
                                     std::to_string(v) + " (the vocabulary has ids 0.." + std::to_string(vocab - 1) +
                                     ")");
    ids.push_back(static_cast<int>(v));
  }
  if (ids.empty()) return Status::InvalidArgument("--tokens-file " + path + ": no tokens");
  return ids;
}

Result<model::Model> LoadWithTokenizer(const ModelRefArgs& a) {
  FLATKV_ASSIGN_OR_RETURN(model::Model m, model::LoadModel(a.model, a.tokenizer));
  if (!m.tokenizer) return Status::InvalidArgument("--model " + a.model + " has no tokenizer: pass --tokenizer");
  return m;
}

int RunTensors(const ModelRefArgs& a) {
  if (!IsGguf(a.model)) return Fail("tensors", kExitUsage, "--model " + a.model + ": not a .gguf file");
  auto bytes = io::ReadWholeFile(a.model);
  if (!bytes.ok()) return Fail("tensors", kExitUsage, "--model: " + bytes.status().ToString());
  auto file = model::GgufFile::Parse(bytes.value());
  if (!file.ok()) return Fail("tensors", kExitUsage, "--model " + a.model + ": " + file.status().ToString());
  if (::mkdir(a.out.c_str(), 0755) != 0 && errno != EEXIST)
    return Fail("tensors", kExitUsage, "--out " + a.out + ": cannot create the directory");
  nlohmann::json index = nlohmann::json::array();
  for (const model::GgufTensorInfo& t : file->tensors()) {
    auto values = model::DequantizeTensor(t);
    if (!values.ok()) return Fail("tensors", kExitFailure, values.status().ToString());
    const std::string name(t.name);
    if (name.find('/') != std::string::npos || name.starts_with("."))
      return Fail("tensors", kExitFailure, "tensor '" + name + "': its name is not a safe file name");
    Status s = WriteFile(a.out + "/" + name + ".f32", values->data(), values->size() * sizeof(float));
    if (!s.ok()) return Fail("tensors", kExitFailure, "--out: " + s.ToString());
    std::vector<uint64_t> shape(t.ne.begin(), t.ne.begin() + t.n_dims);
    index.push_back({{"name", name},
                     {"type", model::GgmlTypeName(t.type)},
                     {"type_id", t.type},
                     {"shape", shape},
                     {"elements", t.n_elements},
                     {"file", name + ".f32"}});
  }
  const std::string text = index.dump(1) + "\n";
  Status s = WriteFile(a.out + "/index.json", text.data(), text.size());
  if (!s.ok()) return Fail("tensors", kExitFailure, "--out: " + s.ToString());
  std::printf("wrote %zu tensors to %s\n", file->tensors().size(), a.out.c_str());
  return kExitOk;
}

int RunTokenize(const ModelRefArgs& a) {
  if (a.text.empty() == a.text_file.empty()) return Fail("tokenize", kExitUsage, "give one of --text and --text-file");
  std::string text = a.text;
  if (!a.text_file.empty()) {
    auto t = io::ReadWholeFile(a.text_file);
    if (!t.ok()) return Fail("tokenize", kExitUsage, "--text-file: " + t.status().ToString());
    text = std::move(t).value();
  }
  // A GGUF file's tokenizer and chat template come from its metadata alone:
  // no weights are dequantized.
  std::shared_ptr<const model::Tokenizer> tok;
  model::Model chat_model;
  if (IsGguf(a.model)) {
    auto bytes = io::ReadWholeFile(a.model);
    if (!bytes.ok()) return Fail("tokenize", kExitUsage, "--model: " + bytes.status().ToString());
    auto file = model::GgufFile::Parse(bytes.value());
    if (!file.ok()) return Fail("tokenize", kExitUsage, "--model " + a.model + ": " + file.status().ToString());
    auto t = model::LoadGgufTokenizer(file.value());
    if (!t.ok()) return Fail("tokenize", kExitUsage, "--model " + a.model + ": " + t.status().ToString());
    tok = t.value();
    if (file->FindKey("tokenizer.chat_template") != nullptr) {
      auto tmpl = file->GetString("tokenizer.chat_template");
      if (!tmpl.ok()) return Fail("tokenize", kExitUsage, "--model " + a.model + ": " + tmpl.status().ToString());
      chat_model.chat_template = std::string(tmpl.value());
    }
  } else {
    auto m = LoadWithTokenizer(a);
    if (!m.ok()) return Fail("tokenize", kExitUsage, m.status().ToString());
    tok = m->tokenizer;
  }
  Result<std::vector<int>> ids = std::vector<int>{};
  if (a.chat) {
    chat_model.tokenizer = tok;
    ids = model::RenderChat(chat_model, text);
  } else if (a.special) {
    ids = tok->EncodeSpecial(text, tok->add_bos());
  } else {
    ids = tok->Encode(text, tok->add_bos());
  }
  if (!ids.ok()) return Fail("tokenize", kExitUsage, ids.status().ToString());
  std::printf("%s\n", nlohmann::json(ids.value()).dump().c_str());
  return kExitOk;
}

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

int RunScore(const ModelRefArgs& a) {
  auto m = model::LoadModel(a.model, a.tokenizer);
  if (!m.ok()) return Fail("score", kExitUsage, m.status().ToString());
  const model::Config& c = m->config;
  auto ids = ReadIds(a.tokens_file, c.vocab_size);
  if (!ids.ok()) return Fail("score", kExitUsage, ids.status().ToString());
  const uint32_t n = static_cast<uint32_t>(ids->size());
  if (ids->size() > static_cast<size_t>(c.seq_len))
    return Fail("score", kExitUsage,
                "--tokens-file " + a.tokens_file + ": " + std::to_string(ids->size()) +
                    " tokens exceed the model's context of " + std::to_string(c.seq_len));
  const uint32_t chunk = a.prefill_chunk == 0 ? n : a.prefill_chunk;
  // The engine's prefill (Engine::PrefillChunk): embed a chunk, run it
  // through every layer, then the final norm and classifier of all its positions.
  // The machine's threads, as the engine's prefill uses (results do not depend on the count).
  model::TransformerOptions to;
  to.threads = 0;
  model::Transformer tf(m.value(), to);
  model::KvCache cache(c, 64, n);
  std::vector<float> x, logits(static_cast<size_t>(n) * c.vocab_size);
  const auto t0 = std::chrono::steady_clock::now();
  for (uint32_t pos = 0; pos < n; pos += chunk) {
    const uint32_t len = std::min(chunk, n - pos);
    x.resize(static_cast<size_t>(len) * c.dim);
    tf.Embed(std::span<const int>(ids->data() + pos, len), x.data());
    for (int l = 0; l < c.n_layers; ++l) tf.Layer(l, pos, len, x.data(), cache);
    tf.Logits(x.data(), logits.data() + static_cast<size_t>(pos) * c.vocab_size, static_cast<int>(len));
  }
  const double ms = MsSince(t0);
  Status s = WriteFile(a.out, logits.data(), logits.size() * sizeof(float));
  if (!s.ok()) return Fail("score", kExitFailure, "--out: " + s.ToString());
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"tokens", n}, {"vocab", c.vocab_size}, {"ms", ms}}.dump().c_str());
  } else {
    std::printf("scored %u tokens x %d logits in %.1f ms: %s\n", n, c.vocab_size, ms, a.out.c_str());
  }
  return kExitOk;
}

int RunGreedy(const ModelRefArgs& a) {
  auto m = model::LoadModel(a.model, a.tokenizer);
  if (!m.ok()) return Fail("greedy", kExitUsage, m.status().ToString());
  const model::Config& c = m->config;
  auto ids = ReadIds(a.tokens_file, c.vocab_size);
  if (!ids.ok()) return Fail("greedy", kExitUsage, ids.status().ToString());
  if (ids->size() + a.steps > static_cast<size_t>(c.seq_len))
    return Fail("greedy", kExitUsage,
                "--tokens-file " + a.tokens_file + ": " + std::to_string(ids->size()) + " tokens plus --steps " +
                    std::to_string(a.steps) + " exceed the model's context of " + std::to_string(c.seq_len));
  engine::EngineOptions eo;
  eo.prefill_chunk = a.prefill_chunk == 0 ? static_cast<uint32_t>(ids->size()) : a.prefill_chunk;
  auto e = engine::Engine::Create(m.value(), nullptr, eo);
  if (!e.ok()) return Fail("greedy", kExitUsage, e.status().ToString());
  engine::GenerateOptions go;
  go.max_new_tokens = a.steps;
  go.temperature = 0.0f;
  go.stop_at_eos = !a.ignore_eos;
  auto r = e->Generate(1, ids.value(), go);
  if (!r.ok()) return Fail("greedy", kExitUsage, r.status().ToString());
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"tokens", r->tokens},
                                       {"prompt_tokens", r->prompt_tokens},
                                       {"prefill_ms", r->timing.prefill_ms},
                                       {"decode_ms", r->timing.decode_ms}}
                            .dump()
                            .c_str());
  } else {
    for (size_t i = 0; i < r->tokens.size(); ++i) std::printf("%s%d", i ? " " : "", r->tokens[i]);
    std::printf("\n");
  }
  return kExitOk;
}

}  // namespace

CLI::App* AddModelRefCommands(CLI::App& app, ModelRefArgs& a) {
  CLI::App* model = app.add_subcommand("model", "A model's parts for reference checks (docs/models.md)");
  model->require_subcommand(1);
  auto add_model = [&](CLI::App* c) {
    c->add_option("--model", a.model, "model file: GGUF (.gguf) or llama2.c checkpoint (.bin)")->required();
    c->add_option("--tokenizer", a.tokenizer, "llama2.c tokenizer file (for .bin models)");
  };
  CLI::App* tensors = model->add_subcommand("tensors", "Every GGUF tensor dequantized: DIR/<name>.f32 (raw fp32, file "
                                                        "order) and DIR/index.json (name, ggml type, shape)");
  add_model(tensors);
  tensors->add_option("--out", a.out, "output directory")->required();
  CLI::App* tokenize = model->add_subcommand("tokenize", "A text's token ids as a JSON array (BOS only when the file's "
                                                          "tokenizer.ggml.add_bos_token says so)");
  add_model(tokenize);
  tokenize->add_option("--text", a.text, "the text");
  tokenize->add_option("--text-file", a.text_file, "a file holding the text (its bytes as they are)");
  tokenize->add_flag("--special", a.special, "parse special-token text (\"<|im_start|>\") as those tokens");
  tokenize->add_flag("--chat", a.chat, "the text as one user message of the model's chat template (as generate --chat)");
  CLI::App* score = model->add_subcommand("score", "Teacher-forced fp32 logits of every position (n x vocab floats)");
  add_model(score);
  score->add_option("--tokens-file", a.tokens_file, "JSON array of token ids")->required();
  score->add_option("--out", a.out, "output file of raw fp32 logits")->required();
  score->add_option("--prefill-chunk", a.prefill_chunk, "tokens per prefill chunk (0 = the whole list at once)");
  score->add_flag("--json", a.json, "print the summary as JSON");
  CLI::App* greedy = model->add_subcommand("greedy", "The engine's greedy continuation of a token list");
  add_model(greedy);
  greedy->add_option("--tokens-file", a.tokens_file, "JSON array of prompt token ids")->required();
  greedy->add_option("--steps", a.steps, "tokens to generate")->required()->check(CLI::Range(1, 1 << 20));
  greedy->add_option("--prefill-chunk", a.prefill_chunk, "tokens per prefill chunk (0 = the whole prompt at once)");
  greedy->add_flag("--ignore-eos", a.ignore_eos, "run every step, past the end-of-generation token");
  greedy->add_flag("--json", a.json, "print {\"tokens\": [...], ...}");
  return model;
}

int RunModelRef(CLI::App& model_cmd, const ModelRefArgs& a) {
  const auto sub = model_cmd.get_subcommands();
  if (sub.empty()) return kExitUsage;
  const std::string name = sub.front()->get_name();
  return RunCatching(("model " + name).c_str(), [&] {
    if (name == "tensors") return RunTensors(a);
    if (name == "tokenize") return RunTokenize(a);
    if (name == "score") return RunScore(a);
    if (name == "greedy") return RunGreedy(a);
    return kExitUsage;
  });
}

}  // namespace flatkv::tools
