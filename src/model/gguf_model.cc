// LoadGguf / ParseGguf: a GGUF file of llama architecture -> Model.
//
// Metadata maps to Config, tensors to Weights (dequantized to fp32). GGUF
// lists dims innermost first, so a matrix with ne = [in, out] is row-major
// [out][in], the Weights layout; no transposition. llama-architecture GGUF
// files keep Q and K rows in the interleaved RoPE order that llama2.c uses
// (llama.cpp's HF converter permutes them into that order), so they load
// as stored; docs/format_gguf.md has the details.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstring>

#include "model/gguf.h"
#include "model/gguf_tokenizer.h"
#include "model/model.h"
#include "io/posix_file.h"

namespace flatkv::model {
namespace {

std::string Num(uint64_t v) { return std::to_string(v); }

// A required or defaulted positive dimension that fits Config's int.
Status GetDim(const GgufFile& f, const std::string& key, int* out, const uint32_t* fallback = nullptr) {
  Result<uint32_t> v = fallback ? f.GetU32(key, *fallback) : f.GetU32(key);
  if (!v.ok()) return v.status();
  if (*v == 0 || *v > static_cast<uint32_t>(INT_MAX)) {
    return Status::Corruption("metadata key '" + key + "': value " + Num(*v) + " is out of range");
  }
  *out = static_cast<int>(*v);
  return Status::Ok();
}

// Dequantizes tensor `name`, which must have shape `ne` (innermost first).
Status LoadTensor(const GgufFile& f, const std::string& name, std::vector<uint64_t> ne, std::vector<float>* out) {
  const GgufTensorInfo* t = f.FindTensor(name);
  if (t == nullptr) return Status::Corruption("tensor '" + name + "' is missing");
  bool match = t->n_dims == ne.size();
  for (size_t i = 0; match && i < ne.size(); ++i) match = t->ne[i] == ne[i];
  if (!match) {
    std::string want = "[";
    for (size_t i = 0; i < ne.size(); ++i) want += (i ? ", " : "") + Num(ne[i]);
    return Status::Corruption("tensor '" + name + "': shape " + t->Shape() + ", expected " + want +
                              "] (ne, innermost first)");
  }
  FLATKV_ASSIGN_OR_RETURN(*out, DequantizeTensor(*t));
  return Status::Ok();
}

constexpr const char* kLayerTensors[] = {"attn_norm", "attn_q",   "attn_k",   "attn_v", "attn_output",
                                         "ffn_norm",  "ffn_gate", "ffn_down", "ffn_up"};

// Every tensor in the file must be one this loader reads: anything else
// (biases, MoE experts, rope_freqs) would change the model's meaning.
Status CheckTensorNames(const GgufFile& f, int n_layers) {
  for (const GgufTensorInfo& t : f.tensors()) {
    std::string_view n = t.name;
    bool known = n == "token_embd.weight" || n == "output_norm.weight" || n == "output.weight";
    if (!known && n.starts_with("blk.")) {
      std::string_view rest = n.substr(4);
      size_t dot = rest.find('.');
      std::string_view idx = rest.substr(0, dot);
      bool digits = !idx.empty() && idx.size() <= 9 && (idx.size() == 1 || idx[0] != '0');
      for (char c : idx) digits = digits && c >= '0' && c <= '9';
      if (digits && dot != std::string_view::npos && std::stoi(std::string(idx)) < n_layers) {
        std::string_view suffix = rest.substr(dot + 1);
        for (const char* k : kLayerTensors) known = known || suffix == std::string(k) + ".weight";
      }
    }
    if (!known) {
      return Status::NotSupported("tensor '" + std::string(n) +
                                  "' is not part of the llama layout this loader reads (" + Num(n_layers) +
                                  " blocks; no biases, experts or rope_freqs)");
    }
  }
  return Status::Ok();
}

// Every tensor the config calls for is present: checked before allocating
// per-layer storage, so an absurd block count fails at the first missing one.
Status CheckTensorsPresent(const GgufFile& f, int n_layers) {
  auto missing = [&](const std::string& name) {
    return Status::Corruption("tensor '" + name + "' is missing" +
                              (f.tensors().empty() ? " (the file has no tensors: a vocab-only file?)" : ""));
  };
  for (const char* name : {"token_embd.weight", "output_norm.weight"}) {
    if (f.FindTensor(name) == nullptr) return missing(name);
  }
  for (int l = 0; l < n_layers; ++l) {
    for (const char* k : kLayerTensors) {
      std::string name = "blk." + std::to_string(l) + "." + k + ".weight";
      if (f.FindTensor(name) == nullptr) return missing(name);
    }
  }
  return Status::Ok();
}

Result<Config> ReadConfig(const GgufFile& f) {
  Config c;
  FLATKV_RETURN_IF_ERROR(GetDim(f, "llama.embedding_length", &c.dim));
  FLATKV_RETURN_IF_ERROR(GetDim(f, "llama.feed_forward_length", &c.hidden_dim));
  FLATKV_RETURN_IF_ERROR(GetDim(f, "llama.block_count", &c.n_layers));
  FLATKV_RETURN_IF_ERROR(GetDim(f, "llama.attention.head_count", &c.n_heads));
  uint32_t heads = static_cast<uint32_t>(c.n_heads);
  FLATKV_RETURN_IF_ERROR(GetDim(f, "llama.attention.head_count_kv", &c.n_kv_heads, &heads));
  FLATKV_RETURN_IF_ERROR(GetDim(f, "llama.context_length", &c.seq_len));
  FLATKV_ASSIGN_OR_RETURN(c.rope_theta, f.GetF32("llama.rope.freq_base", 10000.0f));
  FLATKV_ASSIGN_OR_RETURN(c.norm_eps, f.GetF32("llama.attention.layer_norm_rms_epsilon", 1e-5f));
  if (!std::isfinite(c.rope_theta) || c.rope_theta <= 0) {
    return Status::Corruption("llama.rope.freq_base " + std::to_string(c.rope_theta) + " is not positive and finite");
  }
  if (!std::isfinite(c.norm_eps) || c.norm_eps <= 0) {
    return Status::Corruption("llama.attention.layer_norm_rms_epsilon " + std::to_string(c.norm_eps) +
                              " is not positive and finite");
  }
  // Vocabulary: the token list, else llama.vocab_size, else the embedding.
  if (const GgufKv* kv = f.FindKey("tokenizer.ggml.tokens"); kv && kv->value.type == GgufType::kArray) {
    if (kv->value.count == 0 || kv->value.count > static_cast<uint64_t>(INT_MAX)) {
      return Status::Corruption(GgufFile::KeyName(*kv) + ": " + Num(kv->value.count) + " tokens is out of range");
    }
    c.vocab_size = static_cast<int>(kv->value.count);
  } else if (f.FindKey("llama.vocab_size") != nullptr) {
    FLATKV_RETURN_IF_ERROR(GetDim(f, "llama.vocab_size", &c.vocab_size));
  } else if (const GgufTensorInfo* t = f.FindTensor("token_embd.weight"); t && t->n_dims == 2) {
    if (t->ne[1] == 0 || t->ne[1] > static_cast<uint64_t>(INT_MAX)) {
      return Status::Corruption("tensor 'token_embd.weight': vocabulary " + Num(t->ne[1]) + " is out of range");
    }
    c.vocab_size = static_cast<int>(t->ne[1]);
  } else {
    return Status::Corruption(
        "no vocabulary size: tokenizer.ggml.tokens, llama.vocab_size and token_embd.weight are absent");
  }
  // Shapes the forward pass relies on, checked here so that head_size() and
  // kv_dim() are meaningful below.
  if (c.dim % c.n_heads != 0 || (c.dim / c.n_heads) % 2 != 0) {
    return Status::Corruption("llama.embedding_length " + Num(c.dim) + " is not an even head size times " +
                              "llama.attention.head_count " + Num(c.n_heads));
  }
  if (c.n_kv_heads > c.n_heads || c.n_heads % c.n_kv_heads != 0) {
    return Status::Corruption("llama.attention.head_count " + Num(c.n_heads) +
                              " is not a multiple of llama.attention.head_count_kv " + Num(c.n_kv_heads));
  }
  uint32_t rot = 0;
  FLATKV_ASSIGN_OR_RETURN(rot, f.GetU32("llama.rope.dimension_count", static_cast<uint32_t>(c.head_size())));
  if (rot != static_cast<uint32_t>(c.head_size())) {
    return Status::NotSupported("llama.rope.dimension_count " + Num(rot) + " differs from the head size " +
                                Num(c.head_size()) + " (partial rotary embeddings are not supported)");
  }
  if (const GgufKv* kv = f.FindKey("llama.rope.scaling.type")) {
    if (kv->value.type != GgufType::kString || kv->value.str != "none") {
      return Status::NotSupported(GgufFile::KeyName(*kv) + ": RoPE scaling is not supported");
    }
  }
  uint32_t experts = 0;
  FLATKV_ASSIGN_OR_RETURN(experts, f.GetU32("llama.expert_count", 0));
  if (experts != 0) {
    return Status::NotSupported("llama.expert_count " + Num(experts) + ": mixture-of-experts models are not supported");
  }
  return c;
}

}  // namespace

Result<Model> ParseGguf(std::string_view bytes, std::string source) {
  FLATKV_ASSIGN_OR_RETURN(GgufFile f, GgufFile::Parse(bytes));
  FLATKV_ASSIGN_OR_RETURN(std::string_view arch, f.GetString("general.architecture"));
  if (arch != "llama") {
    return Status::NotSupported("general.architecture is '" + std::string(arch) + "' (only 'llama' is supported)");
  }
  Model m;
  FLATKV_ASSIGN_OR_RETURN(m.config, ReadConfig(f));
  Config& c = m.config;
  FLATKV_RETURN_IF_ERROR(c.Validate());
  FLATKV_RETURN_IF_ERROR(CheckTensorNames(f, c.n_layers));
  FLATKV_RETURN_IF_ERROR(CheckTensorsPresent(f, c.n_layers));

  const uint64_t dim = c.dim, hidden = c.hidden_dim, kv_dim = c.kv_dim(), vocab = c.vocab_size;
  Weights& w = m.weights;
  FLATKV_RETURN_IF_ERROR(LoadTensor(f, "token_embd.weight", {dim, vocab}, &w.token_embedding));
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& lw = w.layers[l];
    std::string p = "blk." + std::to_string(l) + ".";
    FLATKV_RETURN_IF_ERROR(LoadTensor(f, p + "attn_norm.weight", {dim}, &lw.rms_att));
    FLATKV_RETURN_IF_ERROR(LoadTensor(f, p + "attn_q.weight", {dim, dim}, &lw.wq));
    FLATKV_RETURN_IF_ERROR(LoadTensor(f, p + "attn_k.weight", {dim, kv_dim}, &lw.wk));
    FLATKV_RETURN_IF_ERROR(LoadTensor(f, p + "attn_v.weight", {dim, kv_dim}, &lw.wv));
    FLATKV_RETURN_IF_ERROR(LoadTensor(f, p + "attn_output.weight", {dim, dim}, &lw.wo));
    FLATKV_RETURN_IF_ERROR(LoadTensor(f, p + "ffn_norm.weight", {dim}, &lw.rms_ffn));
    FLATKV_RETURN_IF_ERROR(LoadTensor(f, p + "ffn_gate.weight", {dim, hidden}, &lw.w1));
    FLATKV_RETURN_IF_ERROR(LoadTensor(f, p + "ffn_down.weight", {hidden, dim}, &lw.w2));
    FLATKV_RETURN_IF_ERROR(LoadTensor(f, p + "ffn_up.weight", {dim, hidden}, &lw.w3));
  }
  FLATKV_RETURN_IF_ERROR(LoadTensor(f, "output_norm.weight", {dim}, &w.rms_final));
  c.shared_classifier = true;
  if (f.FindTensor("output.weight") != nullptr) {
    FLATKV_RETURN_IF_ERROR(LoadTensor(f, "output.weight", {dim, vocab}, &w.wcls));
    // A classifier stored as a bit-identical copy of the embedding (llama.cpp's
    // converters write one for tied checkpoints) is tied: one copy in memory,
    // and the same config as the checkpoint it came from.
    if (std::memcmp(w.wcls.data(), w.token_embedding.data(), w.wcls.size() * sizeof(float)) == 0) {
      w.wcls.clear();
      w.wcls.shrink_to_fit();
    } else {
      c.shared_classifier = false;
    }
  }

  if (f.FindKey("tokenizer.ggml.model") != nullptr) {
    FLATKV_ASSIGN_OR_RETURN(m.tokenizer, LoadGgufTokenizer(f));
    if (m.tokenizer->vocab_size() != c.vocab_size) {
      return Status::Corruption("tokenizer has " + Num(m.tokenizer->vocab_size()) +
                                " tokens but the model's vocabulary is " + Num(c.vocab_size));
    }
  }
  if (f.FindKey("tokenizer.chat_template") != nullptr) {
    FLATKV_ASSIGN_OR_RETURN(std::string_view tmpl, f.GetString("tokenizer.chat_template"));
    m.chat_template = std::string(tmpl);
  }
  m.fingerprint = Fingerprint(m.config, m.weights);
  m.source = std::move(source);
  return m;
}

Result<Model> LoadGguf(const std::string& path) {
  FLATKV_ASSIGN_OR_RETURN(std::string bytes, io::ReadWholeFile(path));
  Result<Model> m = ParseGguf(bytes, path);
  if (!m.ok()) return m.status().WithContext(path);
  return m;
}

}  // namespace flatkv::model
