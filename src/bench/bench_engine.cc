// Workloads of `flatkv bench engine`, all on one prompt of --prompt-tokens
// tokens (the context is raised above the checkpoint's seq_len as needed):
//   cold       no store: prefill the whole prompt, sample the first token
//   dram_warm  a store with a DRAM tier only, prompt stored by an earlier run
//   ssd_warm   a store with an SSD tier only (O_DIRECT), same
//   decode     --decode-tokens greedy steps after the prompt
// The three TTFT cases are interleaved within each repetition; medians are
// reported. Goal: ttft_ssd_ms <= 1.2 x ttft_dram_ms.
#include "bench/bench_engine.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "engine/engine.h"
#include "flatkv/store.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The bundled stories260K.bin and tok512.bin (data/models/README.md), or $FLATKV_MODEL_DATA.
std::string DefaultModelDir() {
  if (const char* env = std::getenv("FLATKV_MODEL_DATA"); env != nullptr && *env != '\0') return env;
  return std::string(FLATKV_SOURCE_DIR) + "/data/models";
}

int Fail(int code, const std::string& msg) {
  std::fprintf(stderr, "flatkv bench engine: %s\n", msg.c_str());
  return code;
}

}  // namespace

CLI::App* AddBenchEngineCommand(CLI::App& bench, BenchEngineArgs& a) {
  CLI::App* c = bench.add_subcommand("engine", "Reference engine: prefill/decode speed and TTFT cold, DRAM-warm, SSD-warm");
  c->add_option("--model", a.model, "model file (default: the bundled data/models/stories260K.bin)");
  c->add_option("--tokenizer", a.tokenizer, "llama2.c tokenizer file");
  c->add_option("--dir", a.dir, "directory for the SSD store (default: a fresh one under /var/tmp)");
  c->add_option("--prompt-tokens", a.prompt_tokens, "prompt length")->check(CLI::Range(2, 1 << 20));
  c->add_option("--block-tokens", a.block_tokens, "tokens per block")->check(CLI::Range(16, 512));
  c->add_option("--prefill-chunk", a.prefill_chunk, "prefill chunk")->check(CLI::Range(1, 1 << 20));
  c->add_option("--decode-tokens", a.decode_tokens, "decode steps measured")->check(CLI::Range(1, 1 << 16));
  c->add_option("--reps", a.reps, "repetitions (median reported)")->check(CLI::Range(1, 1000));
  c->add_flag("--json", a.json, "print one JSON object");
  return c;
}

int RunBenchEngine(const BenchEngineArgs& a) {
  const std::string model_path = a.model.empty() ? DefaultModelDir() + "/stories260K.bin" : a.model;
  const std::string tok_path = a.tokenizer.empty() && a.model.empty() ? DefaultModelDir() + "/tok512.bin" : a.tokenizer;
  auto loaded = model::LoadModel(model_path, tok_path);
  if (!loaded.ok()) return Fail(kExitUsage, "--model " + model_path + ": " + loaded.status().ToString());
  const model::Model& m = loaded.value();
  const uint32_t n = a.prompt_tokens;
  std::vector<int> prompt(n);
  prompt[0] = m.tokenizer ? m.tokenizer->bos_id() : 1;
  for (uint32_t i = 1; i < n; ++i) prompt[i] = 3 + static_cast<int>((i * 2654435761u) % uint32_t(m.config.vocab_size - 3));

  const std::string dir = a.dir.empty() ? "/var/tmp/flatkv-bench-engine-" + std::to_string(::getpid()) : a.dir;
  std::filesystem::remove_all(dir);
  auto open_store = [&](Medium medium) -> Result<std::unique_ptr<Store>> {
    StoreOptions o;
    o.shape = engine::Engine::ShapeFor(m.config);
    o.block_tokens = a.block_tokens;
    o.placement = std::make_shared<FixedPlacement>(medium);
    const uint64_t need = uint64_t{n} * o.shape.BytesPerToken() * 2 + (64ull << 20);
    if (medium == Medium::kDram) {
      o.dram_capacity_bytes = need;
    } else {
      o.dram_capacity_bytes = 0;
      o.ssd_dirs = {dir};
      o.ssd_capacity_bytes = need + (256ull << 20);
    }
    return Store::Open(o);
  };
  auto dram = open_store(Medium::kDram);
  auto ssd = open_store(Medium::kSsd);
  if (!dram.ok() || !ssd.ok()) return Fail(kExitFailure, (dram.ok() ? ssd : dram).status().ToString());

  engine::EngineOptions eo;
  eo.block_tokens = a.block_tokens;
  eo.prefill_chunk = a.prefill_chunk;
  eo.max_context = std::max<uint32_t>(n + a.decode_tokens + 1, static_cast<uint32_t>(m.config.seq_len));
  auto cold_e = engine::Engine::Create(m, nullptr, eo);
  auto dram_e = engine::Engine::Create(m, dram.value().get(), eo);
  auto ssd_e = engine::Engine::Create(m, ssd.value().get(), eo);
  if (!cold_e.ok() || !dram_e.ok() || !ssd_e.ok()) return Fail(kExitUsage, "engine setup failed");
  engine::GenerateOptions first;
  first.max_new_tokens = 1;
  // Store the prompt once in each store.
  for (auto* e : {&dram_e.value(), &ssd_e.value()})
    if (auto r = e->Generate(1, prompt, first); !r.ok()) return Fail(kExitFailure, r.status().ToString());
  if (!ssd.value()->Stats().ssd_direct_io)
    std::fprintf(stderr, "flatkv bench engine: warning: the SSD store is not using O_DIRECT; SSD figures may come from the page cache\n");

  std::vector<double> cold, warm_dram, warm_ssd, restore_ssd, prefill_rate, decode_rate;
  uint32_t restored_dram = 0, restored_ssd = 0;
  for (uint32_t rep = 0; rep < a.reps; ++rep) {
    auto c = cold_e.value().Generate(1, prompt, first);
    auto d = dram_e.value().Generate(1, prompt, first);
    auto s = ssd_e.value().Generate(1, prompt, first);
    if (!c.ok() || !d.ok() || !s.ok()) return Fail(kExitFailure, "a run failed");
    if (c->tokens != d->tokens || c->tokens != s->tokens) return Fail(kExitFailure, "warm and cold runs disagree");
    cold.push_back(c->timing.ttft_ms);
    warm_dram.push_back(d->timing.ttft_ms);
    warm_ssd.push_back(s->timing.ttft_ms);
    restore_ssd.push_back(s->timing.restore_ms / s->timing.ttft_ms);
    prefill_rate.push_back(n / (c->timing.prefill_ms / 1e3));
    restored_dram = d->restored_tokens_dram;
    restored_ssd = s->restored_tokens_ssd;
  }
  engine::GenerateOptions dec;
  dec.max_new_tokens = a.decode_tokens;
  dec.stop_at_eos = false;
  for (uint32_t rep = 0; rep < std::min<uint32_t>(a.reps, 3); ++rep) {
    auto r = cold_e.value().Generate(1, std::span<const int>(prompt).first(std::min<size_t>(n, 64)), dec);
    if (!r.ok()) return Fail(kExitFailure, r.status().ToString());
    decode_rate.push_back((r->tokens.size() - 1) / (r->timing.decode_ms / 1e3));
  }
  const double c_ms = Median(cold), d_ms = Median(warm_dram), s_ms = Median(warm_ssd);
  nlohmann::json j = {{"ttft_cold_ms", c_ms},
                      {"ttft_dram_ms", d_ms},
                      {"ttft_ssd_ms", s_ms},
                      {"restore_share_of_ttft_ssd", Median(restore_ssd)},
                      {"prefill_tok_s", Median(prefill_rate)},
                      {"decode_tok_s", Median(decode_rate)},
                      {"ssd_over_dram", s_ms / d_ms},
                      {"cold_over_ssd", c_ms / s_ms},
                      {"config",
                       {{"model", model_path},
                        {"prompt_tokens", n},
                        {"block_tokens", a.block_tokens},
                        {"prefill_chunk", a.prefill_chunk},
                        {"restored_tokens_dram", restored_dram},
                        {"restored_tokens_ssd", restored_ssd},
                        {"kv_bytes_per_token", engine::Engine::ShapeFor(m.config).BytesPerToken()},
                        {"reps", a.reps}}}};
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("model %s, prompt %u tokens (%u restored), block %u, chunk %u, medians of %u\n", model_path.c_str(), n,
                restored_ssd, a.block_tokens, a.prefill_chunk, a.reps);
    std::printf("  prefill %.0f tok/s, decode %.0f tok/s\n", Median(prefill_rate), Median(decode_rate));
    std::printf("  TTFT cold %.2f ms | DRAM-warm %.2f ms | SSD-warm %.2f ms (restore %.0f%% of it)\n", c_ms, d_ms, s_ms,
                100 * Median(restore_ssd));
    std::printf("  SSD-warm / DRAM-warm = %.2f (goal <= 1.2); cold / SSD-warm = %.1fx\n", s_ms / d_ms, c_ms / s_ms);
  }
  dram.value().reset();
  ssd.value().reset();
  if (a.dir.empty()) std::filesystem::remove_all(dir);
  return kExitOk;
}

}  // namespace flatkv::tools
