// `flatkv bench codecs --model GGUF` (bench_codecs.h): every codec on a
// real model's KV over the real-text workload (eval/workload.h), judged by
// the end-to-end protocol (eval/protocol.h, docs/eval.md).
//
// Per prompt, the evaluator prefills the context once (its queries are
// recorded for the tensor-level figures). Each setting then replaces the
// context's KV and runs the protocol's passes:
//   path "dataset": the KV as the codecs see it in --dtype (bf16): every
//     64-token slice of every layer encoded and decoded (EvalCodec, the same
//     code as the synthetic rows), with the tensor-level errors beside;
//   path "store": the engine's own f32 pages put into a Store with the codec
//     (PutOptions::codec) under the engine's chain keys, then restored by an
//     Engine the way a warm request restores them, and the engine's cache
//     taken as the context's KV.
// Peers in the same run: transformers' QuantizedCache with the quanto
// backend (bench/quanto_peer.py in build/pyenv/kvpeers, on the same model
// as safetensors and the same token ids) and zstd -1 on the bf16 slices
// (lossless: its end-to-end figures are bf16's).
// Speeds: single-core decode and encode on the first prompt's bf16 slices.
#include <zstd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "bench/bench_codecs.h"
#include "bench/bench_codecs_data.h"
#include "bench/bench_engine_inputs.h"
#include "bench/bench_peer_eval.h"
#include "codec/dtype.h"
#include "engine/engine.h"
#include "eval/protocol.h"
#include "eval/workload.h"
#include "flatkv/placement.h"
#include "flatkv/store.h"
#include "tools/tool_common.h"

namespace flatkv::tools {
namespace {

constexpr uint32_t kBlock = 64;
constexpr uint32_t kQueryPositions = 32;

int Fail(int code, const std::string& msg) {
  std::fprintf(stderr, "flatkv bench codecs: %s\n", msg.c_str());
  return code;
}

struct ModelSetting {
  std::string spec;
  uint32_t recent = 0;
  bool store = false;  // through the store, f32 pages
};

struct Entry {
  ModelSetting s;
  std::string name, peer;
  std::vector<eval::PromptResult> results;
  double attn_err_sum = 0, score_rel_sum = 0, rel_mse_sum = 0;  // means over prompts (dataset path)
  uint32_t tensor_n = 0;
  uint64_t elements = 0, bytes = 0;
  bool has_speed = false;
  Speed speed;
  nlohmann::json extra = nlohmann::json::object();
};

// The dataset of one prompt's context in `dtype`: queries filled by the
// evaluator's query sink (only query_positions are read), K and V by FillKv.
Dataset MakeDataset(const model::Model& m, uint32_t tokens, DType dtype) {
  const model::Config& c = m.config;
  Dataset d;
  d.name = "smollm2";
  d.shape = KvShape::Mha(c.n_layers, c.n_kv_heads, c.head_size(), dtype);
  d.layers = c.n_layers;
  d.tokens = tokens;
  d.block_tokens = kBlock;
  d.q_heads = c.n_heads;
  d.rope_theta = c.rope_theta;
  for (int l = 0; l < c.n_layers; ++l) d.q.emplace_back(uint64_t(tokens) * c.dim);
  for (uint32_t i = 0; i < kQueryPositions; ++i)
    d.query_positions.push_back(tokens - 1 - i * (tokens / 2 / kQueryPositions));
  return d;
}

void FillKv(const model::KvCache& cache, Dataset& d) {
  const int kv = cache.kv_dim();
  d.k.assign(d.layers, std::vector<float>(uint64_t(d.tokens) * kv));
  d.v.assign(d.layers, std::vector<float>(uint64_t(d.tokens) * kv));
  for (uint32_t l = 0; l < d.layers; ++l)
    for (uint32_t p = 0; p < d.tokens; ++p)
      for (int i = 0; i < kv; ++i) {
        d.k[l][uint64_t(p) * kv + i] = codec::RoundToDType(d.shape.dtype, cache.k(int(l), p)[i]);
        d.v[l][uint64_t(p) * kv + i] = codec::RoundToDType(d.shape.dtype, cache.v(int(l), p)[i]);
      }
}

// The dataset path: decoded K and V into the cache.
eval::KvTransform DecodedInto(const std::vector<std::vector<float>>& dk, const std::vector<std::vector<float>>& dv) {
  return [&dk, &dv](model::KvCache& cache, uint32_t n) {
    const int kv = cache.kv_dim();
    for (int l = 0; l < cache.layers(); ++l)
      for (uint32_t p = 0; p < n; ++p) {
        std::memcpy(cache.k(l, p), dk[l].data() + uint64_t(p) * kv, sizeof(float) * kv);
        std::memcpy(cache.v(l, p), dv[l].data() + uint64_t(p) * kv, sizeof(float) * kv);
      }
    return Status::Ok();
  };
}

// The store path: the exact f32 pages put with `codec` under the engine's
// chain keys, restored by an engine serving context + one token.
Status ThroughStore(const model::Model& m, const eval::Prompt& p, const model::KvCache& exact,
                    std::shared_ptr<const Codec> codec, model::KvCache& out, uint64_t* stored_bytes) {
  const uint32_t C = uint32_t(p.context.size()), blocks = C / kBlock;
  StoreOptions so;
  so.shape = engine::Engine::ShapeFor(m.config);
  so.block_tokens = kBlock;
  so.placement = std::make_shared<FixedPlacement>(Medium::kDram);
  const uint64_t page = exact.page_bytes();
  so.dram_capacity_bytes = ((uint64_t(blocks) * m.config.n_layers * page * 5 / 4) | ((64ull << 20) - 1)) + 1;
  FLATKV_ASSIGN_OR_RETURN(auto store, Store::Open(so));
  engine::EngineOptions eo;
  eo.block_tokens = kBlock;
  eo.max_context = C + kBlock;
  eo.codec = codec->Spec();
  FLATKV_ASSIGN_OR_RETURN(engine::Engine e, engine::Engine::Create(m, store.get(), eo));
  KeyHasher hasher(eo.hash);
  const std::vector<uint32_t> toks(p.context.begin(), p.context.begin() + uint64_t(blocks) * kBlock);
  const auto keys = hasher.ChainKeys(e.namespace_digest(), toks, kBlock);
  std::vector<std::byte> data(uint64_t(blocks) * m.config.n_layers * page);
  model::KvCache& src = const_cast<model::KvCache&>(exact);  // PageBytes is non-const; nothing is written
  for (uint32_t b = 0; b < blocks; ++b)
    for (int l = 0; l < m.config.n_layers; ++l)
      std::memcpy(data.data() + (uint64_t(b) * m.config.n_layers + l) * page, src.PageBytes(l, b).data(), page);
  PutResult put_result;
  FLATKV_RETURN_IF_ERROR(store->Put(2, keys, data, {PutHint::kAuto, codec, 0, &put_result}));
  // What the codec stores (headers included), measured as the store encodes.
  CodecContext ctx;
  *stored_bytes = 0;
  for (uint32_t b = 0; b < blocks; ++b)
    for (int l = 0; l < m.config.n_layers; ++l) {
      SliceLayout sl{so.shape, kBlock, uint32_t(l), b * kBlock};
      std::vector<std::byte> enc(codec->MaxEncodedSize(sl));
      FLATKV_ASSIGN_OR_RETURN(const size_t n, codec->Encode(ctx, sl, src.PageBytes(l, b), enc));
      *stored_bytes += n;
    }
  std::vector<int> prompt = p.context;
  prompt.push_back(p.continuation.empty() ? p.question.front() : p.continuation.front());
  engine::GenerateOptions go;
  go.max_new_tokens = 1;
  go.stop_at_eos = false;
  FLATKV_ASSIGN_OR_RETURN(auto r, e.Generate(3, prompt, go));
  if (r.restored_tokens_dram != blocks * kBlock)
    return Status::Corruption("store path: the engine restored " + std::to_string(r.restored_tokens_dram) + " of " +
                            std::to_string(blocks * kBlock) + " context tokens");
  eval::CopyPositions(e.kv_cache(), out, blocks * kBlock);
  return Status::Ok();
}


nlohmann::json EntryJson(const Entry& e, const std::string& model_path, DType dtype) {
  const eval::Summary s = eval::Summarize(e.results);
  nlohmann::json j = {{"model", model_path},
                      {"name", e.name},
                      {"prompts", s.prompts},
                      {"ppl_prompts", s.ppl_prompts},
                      {"ppl_delta", JsonNum(s.ppl_delta)},
                      {"ppl_delta_ci95", {JsonNum(s.ppl_delta_lo), JsonNum(s.ppl_delta_hi)}},
                      {"next_token_kl", JsonNum(s.kl)},
                      {"greedy_agreement", JsonNum(s.greedy_agreement)},
                      {"greedy_agreement_ci95", {JsonNum(s.greedy_lo), JsonNum(s.greedy_hi)}},
                      {"retrieval_accuracy", JsonNum(s.retrieval_accuracy)},
                      {"retrieval_accuracy_ci95", {JsonNum(s.retrieval_lo), JsonNum(s.retrieval_hi)}},
                      {"bits_per_element", e.elements ? JsonNum(8.0 * double(e.bytes) / double(e.elements)) : nullptr}};
  if (!e.peer.empty()) {
    j["peer"] = e.peer;
  } else {
    j["spec"] = e.s.spec;
    j["path"] = e.s.store ? "store" : "dataset";
    j["dtype"] = e.s.store ? "f32" : std::string(DTypeName(dtype));
    j["recent_tokens"] = e.s.recent;
  }
  if (e.tensor_n > 0) {
    j["attn_output_rel_err"] = e.attn_err_sum / e.tensor_n;
    j["attn_score_rel_err"] = e.score_rel_sum / e.tensor_n;
    j["rel_mse"] = e.rel_mse_sum / e.tensor_n;
  }
  if (e.has_speed) j["decode_gbps"] = e.speed.decode_gbps, j["encode_gbps"] = e.speed.encode_gbps;
  for (auto it = e.extra.begin(); it != e.extra.end(); ++it) j[it.key()] = it.value();
  j["per_prompt"] = PerPromptJson(e.results);
  return j;
}

// The quanto peer: bench/quanto_peer.py over the same prompts.
Status RunQuanto(const BenchCodecsArgs& a, const model::Model& m, const std::vector<eval::Prompt>& prompts,
                 const std::vector<int>& nbits, nlohmann::json& result) {
  PeerScript ps{"quanto", "quanto_peer.py", a.peer_python, a.hf_model_dir, " --nbits"};
  for (int b : nbits) ps.args += " " + std::to_string(b);
  auto j = RunPeerScript(m, prompts, ps);
  if (!j.ok()) return j.status();
  result = std::move(j).value();
  return Status::Ok();
}

// The quanto peer's runs as entries, pooled with flatkv's context-helps filter.
Status ParseQuanto(const nlohmann::json& jr, const model::Model& m, const std::vector<eval::Prompt>& prompts,
                   const std::vector<eval::PromptResult>& refs, const std::vector<int>& nbits,
                   std::map<int, Entry>& out) {
  const nlohmann::json* j = &jr;
  const nlohmann::json settings = j->value("peer_settings", nlohmann::json::object());
  try {
    for (int b : nbits) {
      Entry e;
      e.peer = e.name = "quanto:int" + std::to_string(b);
      const auto& runs = j->at("runs").at(std::to_string(b));
      if (runs.size() != prompts.size()) return Status::Corruption("quanto peer: a run per prompt expected");
      double dec = 0;
      for (size_t i = 0; i < runs.size(); ++i) {
        const auto& r = runs[i];
        FLATKV_ASSIGN_OR_RETURN(eval::PromptResult pr, PeerPromptResult(r, prompts[i], refs[i], "quanto"));
        const double bits = r.at("bits_per_element").get<double>();
        const uint64_t elements = uint64_t(prompts[i].context.size() - 1) * m.config.kv_dim() * 2 * m.config.n_layers;
        e.elements += elements;
        e.bytes += uint64_t(bits * double(elements) / 8.0);
        dec += r.at("decode_gbps").get<double>();
        if (r.contains("reference_correct")) e.extra["full_cache_retrieval"].push_back(r["reference_correct"]);
        e.results.push_back(pr);
      }
      e.has_speed = true;
      e.speed.decode_gbps = dec / double(runs.size());
      e.speed.encode_gbps = std::nan("");
      e.extra["settings"] = settings;
      e.extra["decode_gbps_note"] = "QBitsTensor.dequantize() of layer 0's keys and values, 1 torch thread, per bf16-equivalent output byte";
      out[b] = std::move(e);
    }
  } catch (const nlohmann::json::exception& ex) {
    return Status::Corruption(std::string("quanto peer: malformed output: ") + ex.what());
  }
  return Status::Ok();
}

}  // namespace

int RunBenchCodecsModel(const BenchCodecsArgs& a, const std::string& model_path) {
  auto dtype_r = ParseDType(a.dtype);
  if (!dtype_r.ok()) return Fail(kExitUsage, "--dtype: " + dtype_r.status().ToString());
  const DType dtype = *dtype_r;
  const double min_seconds = a.quick ? 0.03 : 0.3;
  auto loaded = model::LoadModel(model_path, "");
  if (!loaded.ok()) return Fail(kExitUsage, "--model " + model_path + ": " + loaded.status().ToString());
  const model::Model& m = *loaded;
  eval::WorkloadOptions wo;
  wo.data_dir = std::string(FLATKV_SOURCE_DIR) + "/data/workload";
  wo.kinds = a.kinds;
  wo.ids = a.ids;
  wo.max_context = a.max_context;
  if (!a.workload_list.empty()) wo.list_path = a.workload_list;
  auto prompts = eval::BuildWorkload(m, wo);
  if (!prompts.ok()) return Fail(kExitFailure, "workload: " + prompts.status().ToString());
  if (prompts->empty()) return Fail(kExitUsage, "no workload prompt matches --kinds/--ids/--max-context");
  bool quanto4 = false, quanto2 = false, zstd_peer = false;
  for (const std::string& p : a.peers) {
    if (p == "quanto:int4") quanto4 = true;
    else if (p == "quanto:int2") quanto2 = true;
    else if (p == "zstd-1:bf16") zstd_peer = true;
    else if (p != "none") return Fail(kExitUsage, "--peers: unknown peer '" + p + "' (quanto:int4, quanto:int2, zstd-1:bf16, none)");
  }

  // --quick (tests): fewer settings, the same code paths.
  // The quanto peer runs in its own process beside flatkv's loop (its own threads), read at the end.
  std::vector<int> nbits;
  if (quanto4) nbits.push_back(4);
  if (quanto2) nbits.push_back(2);
  nlohmann::json quanto_json;
  std::future<Status> quanto_run;
  if (!nbits.empty()) {
    std::fprintf(stderr, "bench codecs: the quanto peer (transformers' QuantizedCache) on %zu prompts, in the background\n",
                 prompts->size());
    quanto_run = std::async(std::launch::async, [&] { return RunQuanto(a, m, *prompts, nbits, quanto_json); });
  }
  std::vector<ModelSetting> settings =
      a.quick ? std::vector<ModelSetting>{{"raw"}, {"int8"}, {"kivi:bits=4"}, {"kivi:bits=2"}, {"hadamard-int4"}}
              : std::vector<ModelSetting>{{"raw"},         {"int8"},        {"kivi:bits=4"},  {"kivi:bits=4", 128},
                                          {"kivi:bits=2"}, {"kivi:bits=2", 128}, {"hadamard-int4"}, {"turbo:bits=4"},
                                          {"turbo:bits=3"}, {"turbo:bits=2"}};
  std::vector<Entry> entries;
  Entry zstd;
  zstd.peer = zstd.name = "zstd-1:bf16";
  std::vector<eval::PromptResult> refs;
  nlohmann::json prompt_rows = nlohmann::json::array();
  Baselines base;
  double pred_eps = 0;
  eval::ProtocolOptions po;
  po.block_tokens = kBlock;
  for (size_t pi = 0; pi < prompts->size(); ++pi) {
    const eval::Prompt& p = (*prompts)[pi];
    const uint32_t C = uint32_t(p.context.size());
    Dataset d = MakeDataset(m, C, dtype);
    d.name = "smollm2:" + p.id;
    const int dim = m.config.dim;
    po.query_sink = [&d, dim, C](int layer, uint32_t pos, const float* q) {
      if (pos < C) std::memcpy(d.q[layer].data() + uint64_t(pos) * dim, q, sizeof(float) * dim);
    };
    auto ev = eval::PromptEvaluator::Create(m, p, po);
    if (!ev.ok()) return Fail(kExitFailure, ev.status().ToString());
    eval::PromptEvaluator& e = **ev;
    FillKv(e.exact(), d);
    refs.push_back(e.reference());
    const eval::PromptResult& ref = e.reference();
    nlohmann::json row = {{"id", p.id}, {"kind", eval::PromptKindName(p.kind)}, {"genre", p.genre},
                          {"context_tokens", C}, {"prefill_ms", e.prefill_ms()}};
    if (ref.scored) {
      row["ppl_full"] = ref.ppl_full();
      row["filter_ppl_context"] = std::exp(ref.filter_nll_context / ref.filter_scored);
      row["filter_ppl_none"] = std::exp(ref.filter_nll_none / ref.filter_scored);
      row["context_helps"] = ref.context_helps();
    }
    if (ref.retrieval_correct >= 0) row["full_cache_correct"] = ref.retrieval_correct == 1, row["answer_text"] = ref.answer_text;
    prompt_rows.push_back(row);
    std::fprintf(stderr, "bench codecs: %s (%u tokens) prefilled in %.0f ms\n", p.id.c_str(), C, e.prefill_ms());
    if (pi == 0) {
      // pred: the largest eps with attention-output error < 1% on this prompt.
      auto eps = SearchEps(d, 0.01, a.quick, "");
      if (!eps.ok()) return Fail(kExitFailure, "pred eps search: " + eps.status().ToString());
      pred_eps = *eps;
      char buf[96];
      for (double f : a.quick ? std::vector<double>{1.0} : std::vector<double>{1.0, 0.5, 0.25}) {
        std::snprintf(buf, sizeof buf, "pred:eps=%.6g", pred_eps * f);
        settings.push_back({WithTheta(buf, d.rope_theta)});
      }
      std::snprintf(buf, sizeof buf, "pred:eps=%.6g", pred_eps);
      if (!a.quick) settings.push_back({buf});
      if (!a.no_store) {
        for (const char* s : {"int8", "kivi:bits=4", "hadamard-int4", "turbo:bits=4"})
          if (!a.quick || std::string(s) != "turbo:bits=4") settings.push_back({s, 0, true});
        if (!a.quick) settings.push_back({WithTheta(buf, d.rope_theta), 0, true});
      }
      for (const ModelSetting& s : settings) {
        Entry en;
        en.s = s;
        entries.push_back(en);
      }
      base = MeasureBaselines(Slices(d), min_seconds);
    }
    const SliceSet slices = pi == 0 ? Slices(d) : SliceSet{};
    for (Entry& en : entries) {
      auto codec = MakeCodec(en.s.spec);
      if (!codec.ok()) return Fail(kExitFailure, en.s.spec + ": " + codec.status().ToString());
      en.name = (*codec)->Spec() + (en.s.recent ? "+recent" : "") + (en.s.store ? "@store" : "");
      Result<eval::PromptResult> r = Status::Ok();
      if (!en.s.store) {
        std::vector<std::vector<float>> dk, dv;
        auto q = EvalCodec(d, **codec, en.s.recent, &dk, &dv);
        if (!q.ok()) return Fail(kExitFailure, en.name + ": " + q.status().ToString());
        en.attn_err_sum += q->attn_output_rel_err, en.score_rel_sum += q->attn_score_rel, en.rel_mse_sum += q->rel_mse;
        ++en.tensor_n;
        en.elements += q->elements, en.bytes += q->encoded_bytes;
        r = e.Evaluate(DecodedInto(dk, dv));
        if (pi == 0 && en.s.recent == 0) {
          auto sp = MeasureSpeed(slices, **codec, min_seconds);
          if (!sp.ok()) return Fail(kExitFailure, en.name + ": " + sp.status().ToString());
          en.has_speed = true, en.speed = *sp;
        }
        if (en.s.spec == "raw" && zstd_peer) {  // zstd -1 is lossless on the same bf16 slices
          zstd.results.push_back(r.ok() ? *r : eval::PromptResult{});
          for (uint32_t l = 0; l < d.layers; ++l)
            for (uint32_t b = 0; b < Blocks(d); ++b) {
              const auto in = SliceBytes(d, l, b);
              std::vector<char> z(ZSTD_compressBound(in.size()));
              zstd.bytes += ZSTD_compress(z.data(), z.size(), in.data(), in.size(), 1);
              zstd.elements += in.size() / DTypeBytes(dtype);
            }
        }
      } else {
        std::shared_ptr<const Codec> shared = std::move(codec).value();
        uint64_t stored = 0;
        std::shared_ptr<const Codec> c2 = shared;
        r = e.Evaluate([&](model::KvCache& cache, uint32_t) { return ThroughStore(m, p, e.exact(), c2, cache, &stored); });
        en.elements += uint64_t(C / kBlock) * kBlock * m.config.kv_dim() * 2 * m.config.n_layers;
        en.bytes += stored;
      }
      if (!r.ok()) return Fail(kExitFailure, p.id + ", " + en.name + ": " + r.status().ToString());
      en.results.push_back(*r);
      std::fprintf(stderr, "  %-40s ppl_delta %+.4f%% agreement %.3f%s\n", en.name.c_str(), 100 * r->ppl_delta(),
                   r->greedy_agreement(),
                   r->retrieval_correct >= 0 ? (r->retrieval_correct ? " correct" : " wrong") : "");
    }
  }
  zstd.has_speed = true;
  zstd.speed.decode_gbps = base.zstd1_decompress_gbps;
  zstd.speed.encode_gbps = base.zstd1_compress_gbps;

  std::map<int, Entry> quanto;
  if (!nbits.empty()) {
    std::fprintf(stderr, "bench codecs: waiting for the quanto peer (transformers' QuantizedCache)\n");
    Status st = quanto_run.get();
    if (st.ok()) st = ParseQuanto(quanto_json, m, *prompts, refs, nbits, quanto);
    if (!st.ok()) return Fail(kExitFailure, st.ToString());
  }

  nlohmann::json codecs = nlohmann::json::array();
  for (const Entry& en : entries) codecs.push_back(EntryJson(en, model_path, dtype));
  if (zstd_peer) codecs.push_back(EntryJson(zstd, model_path, dtype));
  for (const auto& [b, en] : quanto) codecs.push_back(EntryJson(en, model_path, dtype));

  // The goals (issue 32), judged on the dataset path's rows.
  auto find = [&](const std::string& spec) -> const nlohmann::json* {  // a dataset row by spec, or a peer
    for (const auto& c : codecs)
      if ((c.value("spec", "") == spec && c["path"] == "dataset" && c["recent_tokens"] == 0) || c.value("peer", "") == spec)
        return &c;
    return nullptr;
  };
  nlohmann::json goals = nlohmann::json::object();
  auto val = [](const nlohmann::json* c, const char* k) {
    return c && !(*c)[k].is_null() ? (*c)[k].get<double>() : std::nan("");
  };
  if (const auto* c = find("int8")) goals["int8_ppl_delta"] = (*c)["ppl_delta"], goals["int8_met"] = val(c, "ppl_delta") <= 0.001;
  const auto* q4 = find("quanto:int4");
  nlohmann::json four = nlohmann::json::array();
  bool any_beats = false;
  for (const char* n : {"kivi:bits=4", "hadamard-int4", "turbo:bits=4"}) {
    const auto* c = find(n);
    if (!c) continue;
    const bool le1 = std::fabs(val(c, "ppl_delta")) <= 0.01;
    const bool beats = q4 && val(c, "ppl_delta") <= val(q4, "ppl_delta") && val(c, "bits_per_element") <= val(q4, "bits_per_element");
    any_beats = any_beats || beats;
    four.push_back({{"name", (*c)["name"]}, {"ppl_delta", (*c)["ppl_delta"]}, {"bits_per_element", (*c)["bits_per_element"]},
                    {"within_1pct", le1}, {"at_or_below_quanto_int4", beats}});
  }
  goals["four_bit"] = four;
  if (q4) goals["one_four_bit_at_or_below_quanto_int4"] = any_beats;
  nlohmann::json pred_rows = nlohmann::json::array();
  bool pred_met = false;
  for (const auto& c : codecs)
    if (c["name"].get<std::string>().starts_with("pred") && c.value("path", "") == "dataset") {
      const bool met = val(&c, "bits_per_element") <= 5.33 && std::fabs(val(&c, "ppl_delta")) <= 0.005;
      pred_met = pred_met || met;
      pred_rows.push_back({{"name", c["name"]}, {"bits_per_element", c["bits_per_element"]}, {"ppl_delta", c["ppl_delta"]}, {"met", met}});
    }
  goals["pred"] = pred_rows;
  goals["pred_met"] = pred_met;

  nlohmann::json out = {{"model", model_path},
                        {"dtype", DTypeName(dtype)},
                        {"workload", prompt_rows},
                        {"pred_eps_at_1pct_attention_error", pred_eps},
                        {"memcpy_gbps", base.memcpy_gbps},
                        {"zstd1_ratio", base.zstd1_ratio},
                        {"zstd1_compress_gbps", base.zstd1_compress_gbps},
                        {"zstd1_decompress_gbps", base.zstd1_decompress_gbps},
                        {"codecs", codecs},
                        {"goals", goals}};
  const eval::Summary rs = eval::Summarize(refs);
  out["full_cache"] = {{"retrieval_accuracy", JsonNum(rs.retrieval_accuracy)},
                       {"retrieval_prompts", rs.retrieval_prompts},
                       {"ppl_prompts", rs.ppl_prompts},
                       {"ppl_filtered_out", rs.ppl_filtered_out}};
  if (a.json) {
    std::printf("%s\n", out.dump(1).c_str());
    return kExitOk;
  }
  std::printf("bench codecs on %s, %zu prompts (%u pass the context-helps filter), codecs see %s\n", model_path.c_str(),
              prompts->size(), rs.ppl_prompts, std::string(DTypeName(dtype)).c_str());
  std::printf("  %-44s %6s %10s %20s %8s %8s %8s %7s\n", "codec / peer", "bits", "ppl_delta", "ci95", "greedy", "retr",
              "attn_err", "dec");
  for (const auto& c : codecs) {
    auto f = [&](const char* k, double scale) { return c[k].is_null() ? std::nan("") : scale * c[k].get<double>(); };
    std::printf("  %-44s %6.3f %+9.4f%% [%+7.3f%%,%+7.3f%%] %8.3f %8.3f %7.3f%% %7.2f\n", c["name"].get<std::string>().c_str(),
                f("bits_per_element", 1), f("ppl_delta", 100), c["ppl_delta_ci95"][0].is_null() ? NAN : 100 * c["ppl_delta_ci95"][0].get<double>(),
                c["ppl_delta_ci95"][1].is_null() ? NAN : 100 * c["ppl_delta_ci95"][1].get<double>(), f("greedy_agreement", 1),
                f("retrieval_accuracy", 1), c.contains("attn_output_rel_err") ? 100 * c["attn_output_rel_err"].get<double>() : NAN,
                c.contains("decode_gbps") ? c["decode_gbps"].get<double>() : NAN);
  }
  std::printf("goals: %s\n", goals.dump().c_str());
  return kExitOk;
}

}  // namespace flatkv::tools
