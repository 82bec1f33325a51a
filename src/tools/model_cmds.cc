#include "tools/model_cmds.h"

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/engine.h"
#include "model/chat.h"
#include "model/model.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

int Fail(const char* cmd, int code, const std::string& msg) {
  std::fprintf(stderr, "flatkv %s: %s\n", cmd, msg.c_str());
  return code;
}

void AddModelOptions(CLI::App* c, ModelArgs& m) {
  c->add_option("--model", m.model, "model file: llama2.c checkpoint (.bin) or GGUF (.gguf)")->required();
  c->add_option("--tokenizer", m.tokenizer, "llama2.c tokenizer file (for .bin models)");
  c->add_option("--max-context", m.max_context, "positions per request (0 = the checkpoint's seq_len; may be larger)");
}

Result<model::Model> LoadForCli(const ModelArgs& m) {
  FLATKV_ASSIGN_OR_RETURN(model::Model model, model::LoadModel(m.model, m.tokenizer));
  if (!model.tokenizer) return Status::InvalidArgument("--model " + m.model + " has no tokenizer: pass --tokenizer");
  return model;
}

Result<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound("--text " + path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

CLI::App* AddGenerateCommand(CLI::App& app, GenerateArgs& a) {
  CLI::App* c = app.add_subcommand("generate", "Generate text with the reference engine, reusing KV through a store");
  AddModelOptions(c, a.m);
  c->add_option("--prompt", a.prompt, "prompt text")->required();
  c->add_flag("--chat", a.chat,
              "render the prompt as one user message of the model's chat template (GGUF tokenizer.chat_template, "
              "ChatML) and stop at its end-of-turn token");
  c->add_option("--store", a.store_dir, "SSD directory of a flatkv store to reuse KV through (default: no store)");
  c->add_option("--session", a.session, "session id for the store");
  c->add_flag("--json", a.json, "print one JSON object");
  c->add_option("--max-tokens", a.max_tokens, "tokens to generate");
  c->add_option("--temperature", a.temperature, "0 = greedy")->check(CLI::Range(0.0, 100.0));
  c->add_option("--top-p", a.top_p, "nucleus sampling threshold")->check(CLI::Range(0.0, 1.0));
  c->add_option("--seed", a.seed, "sampling seed");
  c->add_option("--block-tokens", a.block_tokens, "tokens per KV block")->check(CLI::Range(16, 512));
  c->add_option("--prefill-chunk", a.prefill_chunk, "tokens per prefill chunk")->check(CLI::Range(1, 1 << 20));
  c->add_option("--dram-mib", a.dram_mib, "the store's DRAM tier, MiB (default 0: it would not outlive this process)");
  c->add_option("--ssd-mib", a.ssd_mib, "the store's SSD capacity, MiB")->check(CLI::Range(1, 1 << 30));
  return c;
}

int RunGenerate(const GenerateArgs& a) {
  auto model = LoadForCli(a.m);
  if (!model.ok()) return Fail("generate", kExitUsage, model.status().ToString());
  const model::Model& m = model.value();
  std::unique_ptr<Store> store;
  if (!a.store_dir.empty()) {
    StoreOptions o;
    o.shape = engine::Engine::ShapeFor(m.config);
    o.block_tokens = a.block_tokens;
    o.dram_capacity_bytes = a.dram_mib << 20;
    o.ssd_dirs = {a.store_dir};
    o.ssd_capacity_bytes = a.ssd_mib << 20;
    o.segment_bytes = std::min<uint64_t>(o.segment_bytes, o.ssd_capacity_bytes / 4096 * 4096);
    auto s = Store::Open(o);
    if (!s.ok()) return Fail("generate", kExitFailure, "--store " + a.store_dir + ": " + s.status().ToString());
    store = std::move(s).value();
  }
  engine::EngineOptions eo;
  eo.block_tokens = a.block_tokens;
  eo.prefill_chunk = a.prefill_chunk;
  eo.max_context = a.m.max_context;
  auto e = engine::Engine::Create(m, store.get(), eo);
  if (!e.ok()) return Fail("generate", kExitUsage, e.status().ToString());
  auto prompt = a.chat ? model::RenderChat(m, a.prompt) : m.tokenizer->Encode(a.prompt, m.tokenizer->add_bos());
  if (!prompt.ok()) return Fail("generate", kExitUsage, (a.chat ? "--chat: " : "--prompt: ") + prompt.status().ToString());
  if (prompt->empty()) return Fail("generate", kExitUsage, "--prompt: the prompt encodes to no tokens");
  engine::GenerateOptions go;
  go.max_new_tokens = a.max_tokens;
  go.temperature = a.temperature;
  go.top_p = a.top_p;
  go.seed = a.seed;
  auto r = e.value().Generate(a.session, prompt.value(), go);
  if (!r.ok()) return Fail("generate", kExitUsage, r.status().ToString());
  const engine::GenerateResult& g = r.value();
  std::string text;
  int prev = prompt.value().back();
  for (int t : g.tokens) {
    if (m.tokenizer->IsEndOfGeneration(t)) break;
    text += m.tokenizer->Decode(prev, t);
    prev = t;
  }
  const engine::Timing& t = g.timing;
  const double decode_tok_s = g.tokens.size() > 1 && t.decode_ms > 0 ? (g.tokens.size() - 1) / (t.decode_ms / 1e3) : 0;
  if (a.json) {
    nlohmann::json j = {{"text", text},
                        {"tokens", g.tokens},
                        {"prompt_tokens", g.prompt_tokens},
                        {"ttft_ms", t.ttft_ms},
                        {"hash_lookup_ms", t.hash_lookup_ms},
                        {"restore_ms", t.restore_ms},
                        {"prefill_ms", t.prefill_ms},
                        {"first_decode_ms", t.first_decode_ms},
                        {"restored_tokens_dram", g.restored_tokens_dram},
                        {"restored_tokens_ssd", g.restored_tokens_ssd},
                        {"restored_tokens_remote", g.restored_tokens_remote},
                        {"computed_prompt_tokens", g.computed_prompt_tokens},
                        {"stored_blocks", g.stored_blocks},
                        {"decode_tok_s", decode_tok_s}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s\n", text.c_str());
    std::printf("--\nttft %.3f ms = hash+lookup %.3f + restore %.3f + prefill %.3f + first decode %.3f\n", t.ttft_ms,
                t.hash_lookup_ms, t.restore_ms, t.prefill_ms, t.first_decode_ms);
    std::printf("prompt %u tokens: restored %u from DRAM, %u from SSD, %u from the remote tier, computed %u; new blocks "
                "stored: %u; decode %.0f tok/s\n",
                g.prompt_tokens, g.restored_tokens_dram, g.restored_tokens_ssd, g.restored_tokens_remote,
                g.computed_prompt_tokens, g.stored_blocks, decode_tok_s);
  }
  if (store) {
    Status s = store->Close();
    if (!s.ok()) return Fail("generate", kExitFailure, "closing the store: " + s.ToString());
  }
  return kExitOk;
}

CLI::App* AddPerplexityCommand(CLI::App& app, PerplexityArgs& a) {
  CLI::App* c = app.add_subcommand("perplexity", "Perplexity of the model on a text file");
  AddModelOptions(c, a.m);
  c->add_option("--text", a.text_file, "text file")->required();
  c->add_flag("--json", a.json, "print one JSON object");
  return c;
}

int RunPerplexity(const PerplexityArgs& a) {
  auto model = LoadForCli(a.m);
  if (!model.ok()) return Fail("perplexity", kExitUsage, model.status().ToString());
  auto text = ReadText(a.text_file);
  if (!text.ok()) return Fail("perplexity", kExitUsage, text.status().ToString());
  auto tokens = model->tokenizer->Encode(text.value(), model->tokenizer->add_bos());
  if (!tokens.ok()) return Fail("perplexity", kExitUsage, "--text: " + tokens.status().ToString());
  engine::EngineOptions eo;
  eo.max_context = a.m.max_context;
  auto e = engine::Engine::Create(model.value(), nullptr, eo);
  if (!e.ok()) return Fail("perplexity", kExitUsage, e.status().ToString());
  auto ppl = e.value().Perplexity(tokens.value());
  if (!ppl.ok()) return Fail("perplexity", kExitUsage, ppl.status().ToString());
  if (a.json) {
    std::printf("%s\n", nlohmann::json{{"perplexity", ppl.value()}, {"tokens", tokens->size()}}.dump().c_str());
  } else {
    std::printf("perplexity %.4f over %zu tokens\n", ppl.value(), tokens->size());
  }
  return kExitOk;
}

CLI::App* AddDumpKvCommand(CLI::App& app, DumpKvArgs& a) {
  CLI::App* c = app.add_subcommand("dump-kv", "Write a text's real Q, K and V tensors (docs/format_kv_dump.md)");
  AddModelOptions(c, a.m);
  c->add_option("--text", a.text_file, "text file")->required();
  c->add_option("--out", a.out, "output file")->required();
  c->add_option("--max-tokens", a.max_tokens, "truncate the text to this many tokens (0 = max context)");
  return c;
}

int RunDumpKv(const DumpKvArgs& a) {
  auto model = LoadForCli(a.m);
  if (!model.ok()) return Fail("dump-kv", kExitUsage, model.status().ToString());
  const model::Config& c = model->config;
  auto text = ReadText(a.text_file);
  if (!text.ok()) return Fail("dump-kv", kExitUsage, text.status().ToString());
  auto tokens = model->tokenizer->Encode(text.value(), model->tokenizer->add_bos());
  if (!tokens.ok()) return Fail("dump-kv", kExitUsage, "--text: " + tokens.status().ToString());
  const uint32_t context = a.m.max_context ? a.m.max_context : static_cast<uint32_t>(c.seq_len);
  uint32_t n = std::min<uint32_t>(static_cast<uint32_t>(tokens->size()), a.max_tokens ? a.max_tokens : context);
  n = std::min(n, context);
  const uint64_t hs = static_cast<uint64_t>(c.head_size());
  const uint64_t heads = static_cast<uint64_t>(c.n_heads);
  std::vector<float> q(static_cast<uint64_t>(c.n_layers) * n * heads * hs);  // [layer][pos][head][d]
  model::Transformer tf(model.value());
  tf.set_query_sink([&](int layer, uint32_t pos, const float* qv) {
    if (pos < n) std::copy(qv, qv + heads * hs, q.begin() + (static_cast<uint64_t>(layer) * n + pos) * heads * hs);
  });
  model::KvCache cache(c, 64, n);
  std::vector<float> logits(c.vocab_size);
  tf.Forward(std::span<const int>(tokens->data(), n), 0, cache, logits.data());

  std::ofstream out(a.out, std::ios::binary | std::ios::trunc);
  if (!out) return Fail("dump-kv", kExitUsage, "--out " + a.out + ": cannot create");
  auto put_u32 = [&](uint32_t v) { out.write(reinterpret_cast<const char*>(&v), 4); };
  out.write("FKVDUMP1", 8);
  for (uint32_t v : {1u, uint32_t(c.n_layers), uint32_t(c.n_heads), uint32_t(c.n_kv_heads), uint32_t(hs), n, 1u, 0u})
    put_u32(v);
  for (uint32_t i = 0; i < n; ++i) put_u32(static_cast<uint32_t>((*tokens)[i]));
  std::vector<float> row(hs);
  for (int l = 0; l < c.n_layers; ++l) {
    for (int h = 0; h < c.n_heads; ++h)
      for (uint32_t p = 0; p < n; ++p)
        out.write(reinterpret_cast<const char*>(&q[((static_cast<uint64_t>(l) * n + p) * heads + h) * hs]), hs * 4);
    for (int which = 0; which < 2; ++which)
      for (int h = 0; h < c.n_kv_heads; ++h)
        for (uint32_t p = 0; p < n; ++p)
          out.write(reinterpret_cast<const char*>((which == 0 ? cache.k(l, p) : cache.v(l, p)) + static_cast<uint64_t>(h) * hs),
                    hs * 4);
  }
  out.close();
  if (!out) return Fail("dump-kv", kExitFailure, "--out " + a.out + ": write failed");
  std::printf("wrote %s: %d layers, %d query heads, %d kv heads, head size %llu, %u tokens\n", a.out.c_str(), c.n_layers,
              c.n_heads, c.n_kv_heads, static_cast<unsigned long long>(hs), n);
  return kExitOk;
}

}  // namespace flatkv::tools
