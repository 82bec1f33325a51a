// Workloads of `flatkv bench engine`, per prompt length N (--prompt-tokens;
// for a GGUF model by default 1024, 2048, 4096 and 7936 tokens of one real
// text, bench_engine_inputs.h; for a llama2.c model 4096 pattern tokens):
//   cold       N prompt tokens with nothing cached: --cold-reps runs without
//              a store, and the first run on each of the two stores (a miss,
//              which stores the blocks), each decoding --decode-tokens greedy
//              tokens after the prompt
//   dram_warm  a DRAM-only store holding the prompt: every full block but the
//              one with the last prompt token is restored, the rest prefilled
//   ssd_warm   the same from an SSD-only store (O_DIRECT, so no page cache)
//   raw_read   an O_DIRECT read of restored_bytes from a file in the SSD
//              store's directory (io_uring, 4 MiB requests, 8 in flight)
//   llama.cpp  bench/llamacpp_bench.py on the same GGUF and prompt ids
// The warm runs and the raw read alternate --reps times; medians are
// reported. Every run must give the first cold run's tokens and bit-identical
// logits (checked). Goals (issue 31), at the longest prompt:
//   ssd_over_bound = ttft_ssd / max(ttft_dram, restored_bytes / raw rate) <= 1.2
//   ssd_over_cold  = ttft_ssd / min(ttft_cold, llama.cpp's prefill time) <= 0.05
// and at every length prefill_vs_llamacpp = prefill_tok_s / llama.cpp's >= 0.5.
#include "bench/bench_engine.h"

#include <algorithm>
#include <thread>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "bench/bench_engine_inputs.h"
#include "bench/bench_runs.h"
#include "bench/bench_util.h"
#include "engine/engine.h"
#include "flatkv/store.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

constexpr uint32_t kGgufPromptTokens[] = {1024, 2048, 4096, 7936};
constexpr uint64_t kRawRequestBytes = 4ull << 20;
constexpr uint32_t kRawQueueDepth = 8;

double Median(std::vector<double> v) { return Summarize(std::move(v)).median; }

// The bundled stories260K.bin and tok512.bin (data/models/README.md), or $FLATKV_MODEL_DATA.
std::string DefaultModelDir() {
  if (const char* env = std::getenv("FLATKV_MODEL_DATA"); env != nullptr && *env != '\0') return env;
  return std::string(FLATKV_SOURCE_DIR) + "/data/models";
}

int Fail(int code, const std::string& msg) {
  std::fprintf(stderr, "flatkv bench engine: %s\n", msg.c_str());
  return code;
}

bool SameRun(const engine::GenerateResult& a, const engine::GenerateResult& b, size_t steps) {
  if (a.tokens.size() < steps || b.tokens.size() < steps || a.logits.size() < steps || b.logits.size() < steps)
    return false;
  for (size_t i = 0; i < steps; ++i) {
    if (a.tokens[i] != b.tokens[i] || a.logits[i].size() != b.logits[i].size() ||
        std::memcmp(a.logits[i].data(), b.logits[i].data(), a.logits[i].size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

// One prompt length's figures.
struct Measured {
  uint32_t prompt_tokens = 0;
  double ttft_cold_ms = 0, ttft_dram_ms = 0, ttft_ssd_ms = 0;
  uint32_t restored_tokens = 0;
  uint64_t restored_bytes = 0;
  double raw_ssd_gbps = 0;  // 0 when nothing is restored
  double prefill_tok_s = 0, decode_tok_s = 0;
  double restore_share_ssd = 0;  // restore wait / TTFT of the SSD-warm runs
  uint32_t cold_samples = 0;
  bool direct_io = true;
  std::vector<int> tokens;  // the cold runs' greedy tokens
};

Result<std::unique_ptr<Store>> OpenStore(const model::Model& m, const BenchEngineArgs& a, Medium medium,
                                         uint32_t tokens, const std::string& ssd_dir) {
  StoreOptions o;
  o.shape = engine::Engine::ShapeFor(m.config);
  o.block_tokens = a.block_tokens;
  o.placement = std::make_shared<FixedPlacement>(medium);
  const uint64_t need = uint64_t{tokens} * o.shape.BytesPerToken() + (64ull << 20);
  if (medium == Medium::kDram) {
    o.dram_capacity_bytes = need;
  } else {
    o.dram_capacity_bytes = 0;
    o.ssd_dirs = {ssd_dir};
    o.ssd_capacity_bytes = (need + o.segment_bytes - 1) / o.segment_bytes * o.segment_bytes + o.segment_bytes;
  }
  return Store::Open(o);
}

Result<Measured> MeasureLength(const model::Model& m, const BenchEngineArgs& a, const std::string& dir,
                               std::span<const int> prompt) {
  Measured out;
  const uint32_t n = static_cast<uint32_t>(prompt.size());
  out.prompt_tokens = n;
  const KvShape shape = engine::Engine::ShapeFor(m.config);
  const std::string ssd_dir = dir + "/ssd";
  std::filesystem::create_directories(ssd_dir);
  FLATKV_ASSIGN_OR_RETURN(auto dram, OpenStore(m, a, Medium::kDram, n + a.decode_tokens, ""));
  FLATKV_ASSIGN_OR_RETURN(auto ssd, OpenStore(m, a, Medium::kSsd, n + a.decode_tokens, ssd_dir));
  out.direct_io = ssd->Stats().ssd_direct_io;

  engine::EngineOptions eo;
  eo.block_tokens = a.block_tokens;
  eo.prefill_chunk = a.prefill_chunk;
  eo.threads = static_cast<int>(a.threads);
  eo.max_context = std::max<uint32_t>(n + a.decode_tokens + 1, static_cast<uint32_t>(m.config.seq_len));
  FLATKV_ASSIGN_OR_RETURN(auto cold_e, engine::Engine::Create(m, nullptr, eo));
  FLATKV_ASSIGN_OR_RETURN(auto dram_e, engine::Engine::Create(m, dram.get(), eo));
  FLATKV_ASSIGN_OR_RETURN(auto ssd_e, engine::Engine::Create(m, ssd.get(), eo));

  engine::GenerateOptions full;
  full.max_new_tokens = a.decode_tokens;
  full.stop_at_eos = false;
  full.keep_logits = true;
  engine::GenerateOptions first = full;
  first.max_new_tokens = 1;

  // Cold: the two store-filling misses, then the runs without a store.
  std::vector<double> cold_ms, prefill_rate, decode_rate;
  engine::GenerateResult ref;
  auto cold_run = [&](engine::Engine& e, const std::string& what) -> Status {
    FLATKV_ASSIGN_OR_RETURN(auto r, e.Generate(1, prompt, full));
    if (r.restored_tokens_dram + r.restored_tokens_ssd != 0)
      return Status::FailedPrecondition(what + ": restored tokens on a run meant to be cold");
    if (cold_ms.empty()) {
      ref = r;
    } else if (!SameRun(r, ref, a.decode_tokens)) {
      return Status::Corruption(what + ": tokens or logits differ from the first cold run's");
    }
    cold_ms.push_back(r.timing.ttft_ms);
    prefill_rate.push_back(r.computed_prompt_tokens / (r.timing.prefill_ms / 1e3));
    if (r.tokens.size() > 1) decode_rate.push_back((r.tokens.size() - 1) / (r.timing.decode_ms / 1e3));
    return Status::Ok();
  };
  FLATKV_RETURN_IF_ERROR(cold_run(dram_e, "the DRAM store's first run"));
  FLATKV_RETURN_IF_ERROR(cold_run(ssd_e, "the SSD store's first run"));
  for (uint32_t r = 0; r < a.cold_reps; ++r) FLATKV_RETURN_IF_ERROR(cold_run(cold_e, "a run without a store"));
  out.tokens = ref.tokens;

  // Warm, alternating with the raw read of the bytes an SSD-warm run restores.
  const uint32_t expect_restored = (n - 1) / a.block_tokens * a.block_tokens;
  out.restored_tokens = expect_restored;
  out.restored_bytes = uint64_t{expect_restored} * shape.BytesPerToken();
  std::unique_ptr<RestoreRun> raw;
  PrefaultedBuffer raw_buf;
  BenchSession session;
  if (out.restored_bytes > 0) {
    session.padded_bytes = (out.restored_bytes + 4095) / 4096 * 4096;
    FLATKV_ASSIGN_OR_RETURN(raw_buf, PrefaultedBuffer::Allocate(session.padded_bytes));
    FillRandom(raw_buf.first(session.padded_bytes), n);
    session.bytes = raw_buf.first(out.restored_bytes);
    session.dir = ssd_dir;
    raw = MakeRawDirectReadRun(kRawRequestBytes, kRawQueueDepth);
    FLATKV_RETURN_IF_ERROR(raw->Setup(session));
  }
  std::vector<double> dram_ms, ssd_ms, restore_share, raw_gbps;
  auto warm_run = [&](engine::Engine& e, Medium medium) -> Status {
    const std::string what = std::string(MediumName(medium)) + "-warm run";
    FLATKV_ASSIGN_OR_RETURN(auto r, e.Generate(1, prompt, first));
    const uint32_t got = medium == Medium::kDram ? r.restored_tokens_dram : r.restored_tokens_ssd;
    if (got != expect_restored || r.restored_tokens_dram + r.restored_tokens_ssd != expect_restored) {
      return Status::FailedPrecondition(what + ": restored " + std::to_string(r.restored_tokens_dram) + " DRAM and " +
                                        std::to_string(r.restored_tokens_ssd) + " SSD tokens, expected " +
                                        std::to_string(expect_restored) + " from " + std::string(MediumName(medium)));
    }
    if (!SameRun(r, ref, 1)) return Status::Corruption(what + ": first token or logits differ from the cold run's");
    (medium == Medium::kDram ? dram_ms : ssd_ms).push_back(r.timing.ttft_ms);
    if (medium == Medium::kSsd) restore_share.push_back(r.timing.restore_ms / r.timing.ttft_ms);
    return Status::Ok();
  };
  for (uint32_t rep = 0; rep < a.reps; ++rep) {
    FLATKV_RETURN_IF_ERROR(warm_run(dram_e, Medium::kDram));
    FLATKV_RETURN_IF_ERROR(warm_run(ssd_e, Medium::kSsd));
    if (raw) {
      FLATKV_RETURN_IF_ERROR(raw->Prepare());
      FLATKV_ASSIGN_OR_RETURN(double sec, raw->Run(raw_buf.first(session.padded_bytes)));
      raw_gbps.push_back(out.restored_bytes / sec / 1e9);
    }
  }
  if (raw) FLATKV_RETURN_IF_ERROR(raw->Teardown());

  out.ttft_cold_ms = Median(cold_ms);
  out.ttft_dram_ms = Median(dram_ms);
  out.ttft_ssd_ms = Median(ssd_ms);
  out.raw_ssd_gbps = Median(raw_gbps);
  out.prefill_tok_s = Median(prefill_rate);
  out.decode_tok_s = Median(decode_rate);
  out.restore_share_ssd = Median(restore_share);
  out.cold_samples = static_cast<uint32_t>(cold_ms.size());
  return out;
}

// The leading tokens two greedy runs share.
size_t Agreement(const std::vector<int>& a, const std::vector<int>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

nlohmann::json OrNull(bool have, double v) { return have ? nlohmann::json(v) : nlohmann::json(nullptr); }

std::string Cell(bool have, double v, const char* fmt) {
  if (!have) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

}  // namespace

CLI::App* AddBenchEngineCommand(CLI::App& bench, BenchEngineArgs& a) {
  CLI::App* c = bench.add_subcommand(
      "engine", "Reference engine: prefill/decode speed and TTFT cold, DRAM-warm, SSD-warm, llama.cpp beside it");
  c->add_option("--model", a.model,
                "model file, or smollm2-135m (build/models/SmolLM2-135M-Instruct.Q4_1.gguf, or $FLATKV_SMOLLM2) "
                "(default: the bundled data/models/stories260K.bin)");
  c->add_option("--tokenizer", a.tokenizer, "llama2.c tokenizer file");
  AddScratchDirOption(*c, a.dir);
  c->add_option("--prompt-tokens", a.prompt_tokens,
                "one prompt length (default: 1024, 2048, 4096 and 7936 for a GGUF model, 4096 otherwise)")
      ->check(CLI::Range(2, 1 << 20));
  c->add_option("--block-tokens", a.block_tokens, "tokens per block")->check(CLI::Range(16, 512));
  c->add_option("--prefill-chunk", a.prefill_chunk, "prefill chunk")->check(CLI::Range(1, 1 << 20));
  c->add_option("--decode-tokens", a.decode_tokens, "greedy tokens generated after the prompt (the first from its logits)")
      ->check(CLI::Range(1, 1 << 16));
  c->add_option("--reps", a.reps, "warm runs and raw reads per length (median reported)")->check(CLI::Range(1, 1000));
  c->add_option("--cold-reps", a.cold_reps, "cold runs without a store per length, beside the two store-filling misses")
      ->check(CLI::Range(0, 1000));
  c->add_flag("--no-llamacpp", a.no_llamacpp, "do not run llama.cpp (its fields are null)");
  c->add_option("--python", a.python,
                "interpreter with llama_cpp for bench/llamacpp_bench.py (default: build/pyenv/refs/bin/python)");
  c->add_option("--threads", a.threads,
                "the engine's threads, and llama.cpp's n_threads and n_threads_batch (default: the machine's cores)")
      ->check(CLI::Range(1, 1024));
  c->add_option("--llamacpp-reps", a.llamacpp_reps, "llama.cpp runs per length (median reported)")
      ->check(CLI::Range(1, 1000));
  c->add_flag("--json", a.json, "print one JSON object");
  return c;
}

int RunBenchEngine(const BenchEngineArgs& args) {
  BenchEngineArgs a = args;
  if (a.threads == 0) a.threads = std::max(1u, std::thread::hardware_concurrency());
  auto resolved = ResolveModelPath(a.model.empty() ? DefaultModelDir() + "/stories260K.bin" : a.model);
  if (!resolved.ok()) return Fail(kExitUsage, resolved.status().message());
  const std::string model_path = *resolved;
  const std::string tok_path = a.tokenizer.empty() && a.model.empty() ? DefaultModelDir() + "/tok512.bin" : a.tokenizer;
  auto loaded = model::LoadModel(model_path, tok_path);
  if (!loaded.ok()) return Fail(kExitUsage, "--model " + model_path + ": " + loaded.status().ToString());
  const model::Model& m = loaded.value();
  const bool gguf = model_path.size() >= 5 && model_path.compare(model_path.size() - 5, 5, ".gguf") == 0;
  std::vector<uint32_t> lengths;
  if (a.prompt_tokens != 0) {
    lengths = {a.prompt_tokens};
  } else if (gguf) {
    lengths.assign(std::begin(kGgufPromptTokens), std::end(kGgufPromptTokens));
  } else {
    lengths = {4096};
  }
  const uint32_t longest = *std::max_element(lengths.begin(), lengths.end());
  auto sha = FileSha256(model_path);
  if (!sha.ok()) return Fail(kExitFailure, sha.status().ToString());

  // The prompt: real text for a GGUF model; llama2.c's stories260K keeps its pattern of token ids.
  std::vector<int> tokens;
  nlohmann::json prompt_info;
  if (gguf) {
    auto text = LoadPromptText(m, longest);
    if (!text.ok()) return Fail(kExitFailure, text.status().ToString());
    tokens = std::move(text->tokens);
    prompt_info = {{"source", "text"}, {"tokenizer", "the model's, no BOS"}, {"files", text->files}};
  } else {
    tokens.resize(longest);
    tokens[0] = m.tokenizer ? m.tokenizer->bos_id() : 1;
    for (uint32_t i = 1; i < longest; ++i)
      tokens[i] = 3 + static_cast<int>((i * 2654435761u) % uint32_t(m.config.vocab_size - 3));
    prompt_info = {{"source", "pattern"}, {"formula", "BOS, then 3 + (i * 2654435761) % (vocab - 3)"}};
  }

  auto scratch = ScratchDir::Create(a.dir.empty() ? "/var/tmp" : a.dir);
  if (!scratch.ok()) return Fail(kExitFailure, scratch.status().ToString());

  // llama.cpp first: a missing environment fails before the long engine runs.
  std::optional<LlamaCppResult> llama;
  std::string llama_note;
  if (!gguf) {
    llama_note = "llama.cpp: not run (" + model_path + " is not a GGUF file); its fields are null";
  } else if (a.no_llamacpp) {
    llama_note = "llama.cpp: skipped (--no-llamacpp); its fields are null";
  } else {
    std::vector<std::vector<int>> prompts;
    for (uint32_t n : lengths) prompts.emplace_back(tokens.begin(), tokens.begin() + n);
    LlamaCppOptions lo;
    lo.python = a.python;
    lo.threads = a.threads;
    lo.decode_tokens = a.decode_tokens;
    lo.reps = a.llamacpp_reps;
    lo.n_ctx = std::max<uint32_t>(static_cast<uint32_t>(m.config.seq_len), longest + a.decode_tokens);
    lo.scratch_dir = scratch->path();
    auto r = RunLlamaCpp(model_path, prompts, lo);
    if (!r.ok()) return Fail(kExitFailure, r.status().ToString());
    llama = std::move(r).value();
  }
  if (!llama_note.empty()) std::fprintf(stderr, "flatkv bench engine: %s\n", llama_note.c_str());

  std::vector<Measured> measured;
  for (uint32_t n : lengths) {
    const std::string dir = scratch->path() + "/prompt-" + std::to_string(n);
    auto r = MeasureLength(m, a, dir, std::span<const int>(tokens).first(n));
    if (!r.ok()) return Fail(kExitFailure, "prompt of " + std::to_string(n) + " tokens: " + r.status().ToString());
    if (!r->direct_io)
      std::fprintf(stderr, "flatkv bench engine: warning: the SSD store is not using O_DIRECT; SSD figures may come "
                           "from the page cache\n");
    std::filesystem::remove_all(dir);
    measured.push_back(std::move(r).value());
  }

  nlohmann::json runs = nlohmann::json::array();
  for (size_t i = 0; i < measured.size(); ++i) {
    const Measured& r = measured[i];
    const bool have_llama = llama.has_value();
    const double l_prefill = have_llama ? llama->runs[i].prefill_tok_s : 0;
    const double l_decode = have_llama ? llama->runs[i].decode_tok_s : 0;
    const double raw_ms = r.raw_ssd_gbps > 0 ? r.restored_bytes / (r.raw_ssd_gbps * 1e9) * 1e3 : 0;
    const double bound_ms = std::max(r.ttft_dram_ms, raw_ms);
    const double faster_cold_ms = have_llama ? std::min(r.ttft_cold_ms, r.prompt_tokens / l_prefill * 1e3) : r.ttft_cold_ms;
    runs.push_back({{"prompt_tokens", r.prompt_tokens},
                    {"ttft_cold_ms", r.ttft_cold_ms},
                    {"ttft_dram_ms", r.ttft_dram_ms},
                    {"ttft_ssd_ms", r.ttft_ssd_ms},
                    {"restored_bytes", r.restored_bytes},
                    {"raw_ssd_gbps", r.raw_ssd_gbps},
                    {"prefill_tok_s", r.prefill_tok_s},
                    {"decode_tok_s", r.decode_tok_s},
                    {"llamacpp_prefill_tok_s", OrNull(have_llama, l_prefill)},
                    {"llamacpp_decode_tok_s", OrNull(have_llama, l_decode)},
                    {"restored_tokens", r.restored_tokens},
                    {"cold_samples", r.cold_samples},
                    {"restore_share_of_ttft_ssd", r.restore_share_ssd},
                    {"ssd_over_dram", r.ttft_ssd_ms / r.ttft_dram_ms},
                    {"raw_read_ms", raw_ms},
                    {"ssd_over_bound", r.ttft_ssd_ms / bound_ms},
                    {"ssd_over_cold", r.ttft_ssd_ms / faster_cold_ms},
                    {"faster_cold", have_llama && r.prompt_tokens / l_prefill * 1e3 < r.ttft_cold_ms ? "llama.cpp" : "flatkv"},
                    {"prefill_vs_llamacpp", OrNull(have_llama, r.prefill_tok_s / l_prefill)},
                    {"llamacpp_greedy_agreement",
                     have_llama ? nlohmann::json(Agreement(r.tokens, llama->runs[i].tokens)) : nlohmann::json(nullptr)}});
  }
  const nlohmann::json& last = runs.back();
  double min_prefill_ratio = 0;
  bool have_prefill_ratio = llama.has_value();
  if (have_prefill_ratio) {
    min_prefill_ratio = last["prefill_vs_llamacpp"].get<double>();
    for (const auto& r : runs) min_prefill_ratio = std::min(min_prefill_ratio, r["prefill_vs_llamacpp"].get<double>());
  }
  nlohmann::json goals = {
      {"at_prompt_tokens", last["prompt_tokens"]},
      {"ssd_over_bound", last["ssd_over_bound"]},
      {"ssd_over_bound_goal", 1.2},
      {"ssd_over_bound_met", last["ssd_over_bound"].get<double>() <= 1.2},
      {"ssd_over_cold", last["ssd_over_cold"]},
      {"ssd_over_cold_goal", 0.05},
      {"ssd_over_cold_met", last["ssd_over_cold"].get<double>() <= 0.05},
      {"prefill_vs_llamacpp_min", OrNull(have_prefill_ratio, min_prefill_ratio)},
      {"prefill_vs_llamacpp_goal", 0.5},
      {"prefill_vs_llamacpp_met", have_prefill_ratio ? nlohmann::json(min_prefill_ratio >= 0.5) : nlohmann::json(nullptr)}};
  nlohmann::json j = {
      {"model", {{"file", model_path}, {"sha256", *sha}}},
      {"threads", a.threads},
      {"threads_note", "the engine and llama.cpp (n_threads, n_threads_batch) run on the same threads"},
      {"llamacpp", llama ? llama->settings : nlohmann::json(llama_note)},
      {"prompt", prompt_info},
      {"config",
       {{"block_tokens", a.block_tokens},
        {"prefill_chunk", a.prefill_chunk},
        {"decode_tokens", a.decode_tokens},
        {"reps", a.reps},
        {"cold_reps", a.cold_reps},
        {"kv_bytes_per_token", engine::Engine::ShapeFor(m.config).BytesPerToken()},
        {"raw_read", {{"request_bytes", kRawRequestBytes}, {"queue_depth", kRawQueueDepth}, {"o_direct", true}}},
        {"load_average", LoadAverage()}}},
      {"runs", runs},
      {"goals", goals}};
  if (a.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return kExitOk;
  }
  std::printf("model %s (sha256 %.16s...), block %u, chunk %u, %u decode tokens, warm medians of %u, %u thread%s",
              model_path.c_str(), sha->c_str(), a.block_tokens, a.prefill_chunk, a.decode_tokens, a.reps,
              a.threads, a.threads == 1 ? "" : "s");
  if (llama) {
    std::printf(" (the engine's and llama.cpp's)\n");
  } else {
    std::printf("\n%s\n", llama_note.c_str());
  }
  std::printf("%7s %10s %9s %9s %9s %8s %9s %8s %9s %8s %9s %8s %9s\n", "prompt", "cold ms", "DRAM ms", "SSD ms",
              "restored", "raw GB/s", "prefill", "decode", "lcpp pre", "lcpp dec", "SSD/bound", "SSD/cold",
              "pre/lcpp");
  for (const auto& r : runs) {
    const bool hl = !r["llamacpp_prefill_tok_s"].is_null();
    std::printf("%7u %10.1f %9.1f %9.1f %8.1fM %8.2f %9.1f %8.2f %9s %8s %9.2f %8.3f %9s\n",
                r["prompt_tokens"].get<uint32_t>(), r["ttft_cold_ms"].get<double>(), r["ttft_dram_ms"].get<double>(),
                r["ttft_ssd_ms"].get<double>(), r["restored_bytes"].get<uint64_t>() / 1e6, r["raw_ssd_gbps"].get<double>(),
                r["prefill_tok_s"].get<double>(), r["decode_tok_s"].get<double>(),
                Cell(hl, hl ? r["llamacpp_prefill_tok_s"].get<double>() : 0, "%.1f").c_str(),
                Cell(hl, hl ? r["llamacpp_decode_tok_s"].get<double>() : 0, "%.2f").c_str(),
                r["ssd_over_bound"].get<double>(), r["ssd_over_cold"].get<double>(),
                Cell(hl, hl ? r["prefill_vs_llamacpp"].get<double>() : 0, "%.3f").c_str());
  }
  std::printf("prefill and decode in tokens/s; SSD/bound = ttft_ssd / max(ttft_dram, restored / raw rate), goal <= 1.2;\n"
              "SSD/cold = ttft_ssd / min(ttft_cold, llama.cpp's prefill time), goal <= 0.05; pre/lcpp goal >= 0.5\n");
  std::printf("at %u tokens: SSD/bound %.2f (%s), SSD/cold %.3f (%s); prefill vs llama.cpp, lowest: %s\n",
              last["prompt_tokens"].get<uint32_t>(), last["ssd_over_bound"].get<double>(),
              goals["ssd_over_bound_met"].get<bool>() ? "met" : "missed", last["ssd_over_cold"].get<double>(),
              goals["ssd_over_cold_met"].get<bool>() ? "met" : "missed",
              have_prefill_ratio ? (Cell(true, min_prefill_ratio, "%.3f") + (min_prefill_ratio >= 0.5 ? " (met)" : " (missed)")).c_str()
                                 : "not measured");
  return kExitOk;
}

}  // namespace flatkv::tools
