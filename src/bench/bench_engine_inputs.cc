#include "bench/bench_engine_inputs.h"

#include <openssl/evp.h>
#include <sys/wait.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

namespace flatkv::tools {
namespace {

std::string SourceDir() { return FLATKV_SOURCE_DIR; }

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

Result<std::string> ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::FromErrno(errno, "open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) return Status::IoError("read " + path);
  return s.str();
}

std::string Hex(const unsigned char* d, unsigned n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    out += digits[d[i] >> 4];
    out += digits[d[i] & 15];
  }
  return out;
}

std::string Sha256Hex(std::string_view bytes) {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_Digest(bytes.data(), bytes.size(), d, &n, EVP_sha256(), nullptr);
  return Hex(d, n);
}


double MedianOf(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

std::string SmolLm2Path() {
  return EnvOr("FLATKV_SMOLLM2", SourceDir() + "/build/models/SmolLM2-135M-Instruct.Q4_1.gguf");
}

Result<std::string> ResolveModelPath(const std::string& model) {
  if (model != "smollm2-135m") return model;
  const std::string path = SmolLm2Path();
  if (!std::filesystem::exists(path)) {
    return Status::NotFound("smollm2-135m: the model file " + path +
                            " is not installed (scripts/install-deps.sh models installs it; $FLATKV_SMOLLM2 overrides the path)");
  }
  return path;
}

Result<std::string> FileSha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::FromErrno(errno, "open " + path);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::vector<char> buf(4 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return Status::IoError("read " + path);
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_DigestFinal_ex(ctx.get(), d, &n);
  return Hex(d, n);
}

Result<PromptText> LoadPromptText(const model::Model& model, size_t min_tokens) {
  if (!model.tokenizer) return Status::InvalidArgument(model.source + ": the model has no tokenizer for the prompt text");
  PromptText out;
  out.files = nlohmann::json::array();
  std::string text;
  for (const char* name : kPromptTextFiles) {
    const std::string path = std::string(kPromptTextDir) + "/" + name;
    auto bytes = ReadWhole(path);
    if (!bytes.ok()) {
      return Status::NotFound("prompt text: " + bytes.status().ToString() +
                              " (Debian's libpython3.11-stdlib provides it)");
    }
    out.files.push_back({{"path", path}, {"bytes", bytes->size()}, {"sha256", Sha256Hex(*bytes)}});
    text += *bytes;
  }
  auto tokens = model.tokenizer->Encode(text, /*bos=*/false);
  if (!tokens.ok()) return Status::InvalidArgument("prompt text: tokenizing failed: " + tokens.status().ToString());
  if (tokens->size() < min_tokens) {
    return Status::InvalidArgument("prompt text: " + std::to_string(tokens->size()) + " tokens from " +
                                   std::to_string(text.size()) + " bytes, fewer than the " +
                                   std::to_string(min_tokens) + " asked for");
  }
  out.tokens = std::move(tokens).value();
  return out;
}

std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

Result<nlohmann::json> RunPythonJson(const std::string& python, const std::string& script, const std::string& args,
                                     const std::string& scratch_dir, const std::string& what) {
  const std::string err_path = scratch_dir + "/" + what + "_stderr.txt";
  const std::string cmd = ShellQuote(python) + " " + ShellQuote(script) + args + " 2>" + ShellQuote(err_path);
  std::fflush(nullptr);
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return Status::FromErrno(errno, what + ": popen " + python);
  std::string out;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  auto err = ReadWhole(err_path);
  const std::string err_text = err.ok() ? *err : "";
  std::filesystem::remove(err_path);
  if (rc != 0) {
    return Status::IoError(what + ": " + script + " failed (exit " + std::to_string(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1) +
                           "): " + err_text.substr(err_text.size() > 4000 ? err_text.size() - 4000 : 0));
  }
  nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::Corruption(what + ": " + script + " printed no JSON: " + out.substr(0, 500));
  return j;
}

Result<LlamaCppResult> RunLlamaCpp(const std::string& model_path, const std::vector<std::vector<int>>& prompts,
                                   const LlamaCppOptions& o) {
  const std::string python = o.python.empty() ? SourceDir() + "/build/pyenv/refs/bin/python" : o.python;
  const std::string script = o.script.empty() ? SourceDir() + "/bench/llamacpp_bench.py" : o.script;
  if (!std::filesystem::exists(python)) {
    return Status::NotFound("llama.cpp: the Python interpreter " + python +
                            " is missing (scripts/install-deps.sh pyenv:refs installs it with llama-cpp-python; "
                            "--no-llamacpp skips llama.cpp)");
  }
  if (!std::filesystem::exists(script)) return Status::NotFound("llama.cpp: the script " + script + " is missing");
  const std::string prompts_path = o.scratch_dir + "/llamacpp_prompts.json";
  {
    std::ofstream f(prompts_path);
    f << nlohmann::json({{"prompts", prompts}}).dump();
    if (!f) return Status::IoError("llama.cpp: write " + prompts_path);
  }
  const std::string args = " --model " + ShellQuote(model_path) + " --threads " + std::to_string(o.threads) +
                           " --decode-tokens " + std::to_string(o.decode_tokens) + " --reps " + std::to_string(o.reps) +
                           " --n-ctx " + std::to_string(o.n_ctx) + " --prompts " + ShellQuote(prompts_path);
  auto ran = RunPythonJson(python, script, args, o.scratch_dir, "llama.cpp");
  std::filesystem::remove(prompts_path);
  if (!ran.ok()) return ran.status();
  nlohmann::json j = std::move(ran).value();
  if (!j.contains("runs") || !j["runs"].is_array() || j["runs"].size() != prompts.size())
    return Status::Corruption("llama.cpp: " + script + " printed no JSON with one entry of \"runs\" per prompt");
  LlamaCppResult r;
  try {
    for (const auto& run : j["runs"]) {
      LlamaCppRun lr;
      lr.prompt_tokens = run.at("prompt_tokens").get<uint32_t>();
      lr.prefill_tok_s = MedianOf(run.at("prefill_tok_s").get<std::vector<double>>());
      lr.decode_tok_s = MedianOf(run.at("decode_tok_s").get<std::vector<double>>());
      lr.tokens = run.at("tokens").get<std::vector<int>>();
      r.runs.push_back(std::move(lr));
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption("llama.cpp: " + script + " printed a malformed run: " + e.what());
  }
  r.settings = j.value("settings", nlohmann::json::object());
  return r;
}

}  // namespace flatkv::tools
