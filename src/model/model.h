// The reference engine's model: a llama-family transformer in fp32.
//
// Model holds the architecture (Config), the weights as fp32 row-major
// [out][in] matrices (quantized GGUF tensors are dequantized at load), and
// the tokenizer. Loaders: LoadLlama2c (llama2.c checkpoints, legacy
// version 0) and LoadGguf (GGUF v2/v3, llama architecture, F32/F16/Q4_1/Q8_0).
// Every malformed or truncated file gives an error naming the field or
// tensor at fault; nothing crashes.
//
// Thread-safety: a loaded Model is immutable and may be shared.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "flatkv/status.h"

namespace flatkv::model {

struct Config {
  int dim = 0;          // residual stream width
  int hidden_dim = 0;   // SwiGLU FFN width
  int n_layers = 0;
  int n_heads = 0;      // query heads
  int n_kv_heads = 0;   // key/value heads (GQA when < n_heads)
  int vocab_size = 0;
  int seq_len = 0;      // context the checkpoint was trained for
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  bool shared_classifier = true;  // classifier tied to the token embedding

  int head_size() const { return dim / n_heads; }
  int kv_dim() const { return n_kv_heads * head_size(); }
  // Rejects zero, negative or inconsistent sizes, naming the field.
  Status Validate() const;
};

struct LayerWeights {
  std::vector<float> rms_att;  // (dim)
  std::vector<float> wq;       // (dim, dim)
  std::vector<float> wk;       // (kv_dim, dim)
  std::vector<float> wv;       // (kv_dim, dim)
  std::vector<float> wo;       // (dim, dim)
  std::vector<float> rms_ffn;  // (dim)
  std::vector<float> w1;       // (hidden_dim, dim)  gate
  std::vector<float> w2;       // (dim, hidden_dim)  down
  std::vector<float> w3;       // (hidden_dim, dim)  up
};

struct Weights {
  std::vector<float> token_embedding;  // (vocab_size, dim)
  std::vector<LayerWeights> layers;    // n_layers
  std::vector<float> rms_final;        // (dim)
  std::vector<float> wcls;             // (vocab_size, dim); empty when shared_classifier
  const float* classifier() const { return wcls.empty() ? token_embedding.data() : wcls.data(); }
};

// Text <-> token ids. Implementations: the llama2.c BPE tokenizer
// (tok512.bin, tokenizer.bin) and the GGUF vocabulary (SentencePiece-style
// "llama" and byte-level "gpt2" models).
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids for `text`, with BOS first when `bos`.
  virtual Result<std::vector<int>> Encode(std::string_view text, bool bos) const = 0;
  // The text of `token` following `prev` (a piece after BOS drops its
  // leading space; byte tokens decode to their byte).
  virtual std::string Decode(int prev, int token) const = 0;
  virtual int bos_id() const = 0;
  virtual int eos_id() const = 0;
  virtual int vocab_size() const = 0;
  // Whether a prompt gets BOS in front: llama2.c always (run.c does);
  // GGUF as tokenizer.ggml.add_bos_token says (SmolLM2: false).
  virtual bool add_bos() const = 0;
  // Whether sampling `token` ends generation: EOS; for llama2.c BOS too,
  // as run.c stops at BOS (it delimits sequences).
  virtual bool IsEndOfGeneration(int token) const = 0;
  // The id of the special (control or user-defined) token spelled exactly
  // `text` ("<|im_start|>"), or -1 when the vocabulary has no such token.
  virtual int SpecialTokenId(std::string_view text) const = 0;
  // Encode with special-token text in `text` mapped to those tokens
  // (llama.cpp's parse_special); Encode leaves control tokens' text as text.
  // NotSupported for a tokenizer without special tokens.
  virtual Result<std::vector<int>> EncodeSpecial(std::string_view text, bool bos) const = 0;
};

struct Model {
  Config config;
  Weights weights;
  std::shared_ptr<const Tokenizer> tokenizer;  // may be null when none was loaded
  std::string chat_template;  // GGUF tokenizer.chat_template (Jinja text); empty when absent
  // XXH3-128 over the config and every weight, as 32 hex digits: goes into
  // the store's namespace so different models or weights never share KV.
  std::string fingerprint;
  std::string source;  // path it was loaded from
};

// A llama2.c checkpoint plus its tokenizer file (tokenizer_path may be
// empty: no tokenizer).
Result<Model> LoadLlama2c(const std::string& checkpoint_path, const std::string& tokenizer_path);
// The same from memory (for fuzzing): `tokenizer` may be empty.
Result<Model> ParseLlama2c(std::string_view checkpoint, std::string_view tokenizer, std::string source);

// A GGUF file of llama architecture; the tokenizer comes from its metadata.
Result<Model> LoadGguf(const std::string& path);
Result<Model> ParseGguf(std::string_view bytes, std::string source);

// Loads by extension: ".gguf" -> LoadGguf, otherwise LoadLlama2c.
Result<Model> LoadModel(const std::string& path, const std::string& tokenizer_path);

// Computes Model::fingerprint from config and weights.
std::string Fingerprint(const Config& config, const Weights& weights);

}  // namespace flatkv::model
