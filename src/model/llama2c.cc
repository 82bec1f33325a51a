// Loader for llama2.c legacy (version 0) checkpoints. The format is written
// down in shared/data/models/README.md:
//   int32 dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
//   (vocab_size < 0: a separate classifier follows), then float32 LE tensors
//   token_embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final,
//   freq_cis_real, freq_cis_imag [, wcls].
// The stored RoPE tables are skipped: the transformer computes RoPE from
// rope_theta = 10000, as llama2.c's run.c does.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>

#include "model/llama2c_tokenizer.h"
#include "model/model.h"
#include "io/posix_file.h"

namespace flatkv::model {
namespace {

constexpr uint64_t kHeaderBytes = 7 * 4;

// One tensor of the file: `layers` consecutive slices of `floats` floats.
// Exactly one destination is set, or none for skipped tensors.
struct TensorSpec {
  const char* name;
  uint64_t layers;
  uint64_t floats;
  std::vector<float> LayerWeights::*layer_member = nullptr;
  std::vector<float>* global = nullptr;
};

void CopyFloats(const char* src, uint64_t count, std::vector<float>& dst) {
  dst.resize(count);
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(dst.data(), src, count * sizeof(float));
  } else {
    for (uint64_t i = 0; i < count; ++i) {
      uint32_t v = 0;
      for (int b = 3; b >= 0; --b) v = (v << 8) | static_cast<unsigned char>(src[4 * i + b]);
      dst[i] = std::bit_cast<float>(v);
    }
  }
}

Result<Model> Parse(std::string_view file, std::optional<std::string_view> tokenizer,
                    const std::string& tokenizer_source, std::string source) {
  const uint64_t size = file.size();
  if (size < kHeaderBytes)
    return Status::Corruption(source + ": truncated in header: need " + std::to_string(kHeaderBytes) +
                              " bytes at offset 0, file has " + std::to_string(size));
  int32_t h[7];
  for (int i = 0; i < 7; ++i) {
    uint32_t v = 0;
    for (int b = 3; b >= 0; --b) v = (v << 8) | static_cast<unsigned char>(file[4 * i + b]);
    h[i] = static_cast<int32_t>(v);
  }
  Model m;
  Config& c = m.config;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.shared_classifier = h[5] > 0;
  if (h[5] == INT32_MIN)
    return Status::Corruption(source + ": header field vocab_size=" + std::to_string(h[5]) + ": out of range");
  c.vocab_size = h[5] < 0 ? -h[5] : h[5];
  c.seq_len = h[6];
  c.rope_theta = 10000.0f;
  c.norm_eps = 1e-5f;
  Status valid = c.Validate();
  if (!valid.ok()) return Status::Corruption(source + ": header field " + valid.message());

  const uint64_t dim = c.dim, hidden = c.hidden_dim, layers = c.n_layers, vocab = c.vocab_size;
  const uint64_t kv_dim = c.kv_dim(), half_head = c.head_size() / 2;
  Weights& w = m.weights;
  std::vector<TensorSpec> specs = {
      {"token_embedding", 1, vocab * dim, nullptr, &w.token_embedding},
      {"rms_att", layers, dim, &LayerWeights::rms_att},
      {"wq", layers, dim * dim, &LayerWeights::wq},
      {"wk", layers, kv_dim * dim, &LayerWeights::wk},
      {"wv", layers, kv_dim * dim, &LayerWeights::wv},
      {"wo", layers, dim * dim, &LayerWeights::wo},
      {"rms_ffn", layers, dim, &LayerWeights::rms_ffn},
      {"w1", layers, hidden * dim, &LayerWeights::w1},
      {"w2", layers, dim * hidden, &LayerWeights::w2},
      {"w3", layers, hidden * dim, &LayerWeights::w3},
      {"rms_final", 1, dim, nullptr, &w.rms_final},
      {"freq_cis_real", 1, c.seq_len * half_head},
      {"freq_cis_imag", 1, c.seq_len * half_head},
  };
  if (!c.shared_classifier) specs.push_back({"wcls", 1, vocab * dim, nullptr, &w.wcls});

  // Check every tensor against the file size before allocating anything.
  // No sum can overflow: each slice (< 2^43 bytes) is compared with what is
  // left of the file before it is added to `off`.
  uint64_t off = kHeaderBytes;
  for (const TensorSpec& t : specs) {
    const uint64_t slice = t.floats * sizeof(float);
    for (uint64_t l = 0; l < t.layers; ++l) {
      if (size - off < slice) {
        std::string name = t.name;
        if (t.layer_member != nullptr) name += " (layer " + std::to_string(l) + ")";
        return Status::Corruption(source + ": truncated in tensor " + name + ": need " + std::to_string(slice) +
                                  " bytes at offset " + std::to_string(off) + ", file has " + std::to_string(size));
      }
      off += slice;
    }
  }
  if (off != size)
    return Status::Corruption(source + ": " + std::to_string(size - off) + " trailing bytes after tensor " +
                              specs.back().name + " at offset " + std::to_string(off) + " (file has " +
                              std::to_string(size) + "; does the sign of vocab_size match the classifier?)");

  w.layers.resize(c.n_layers);
  off = kHeaderBytes;
  for (const TensorSpec& t : specs) {
    for (uint64_t l = 0; l < t.layers; ++l) {
      if (t.layer_member != nullptr) CopyFloats(file.data() + off, t.floats, w.layers[l].*t.layer_member);
      if (t.global != nullptr) CopyFloats(file.data() + off, t.floats, *t.global);
      off += t.floats * sizeof(float);
    }
  }

  if (tokenizer.has_value()) {
    auto tok = LoadLlama2cTokenizer(*tokenizer, c.vocab_size);
    if (!tok.ok()) return tok.status().WithContext(tokenizer_source);
    m.tokenizer = std::move(tok).value();
  }
  m.fingerprint = Fingerprint(m.config, m.weights);
  m.source = std::move(source);
  return m;
}

}  // namespace

Result<Model> ParseLlama2c(std::string_view checkpoint, std::string_view tokenizer, std::string source) {
  std::optional<std::string_view> tok;
  if (!tokenizer.empty()) tok = tokenizer;
  const std::string tokenizer_source = source + " tokenizer";
  return Parse(checkpoint, tok, tokenizer_source, std::move(source));
}

Result<Model> LoadLlama2c(const std::string& checkpoint_path, const std::string& tokenizer_path) {
  FLATKV_ASSIGN_OR_RETURN(std::string file, io::ReadWholeFile(checkpoint_path));
  std::string tok;
  if (!tokenizer_path.empty()) {
    FLATKV_ASSIGN_OR_RETURN(tok, io::ReadWholeFile(tokenizer_path));
  }
  std::optional<std::string_view> tok_view;
  if (!tokenizer_path.empty()) tok_view = tok;
  return Parse(file, tok_view, tokenizer_path, checkpoint_path);
}

}  // namespace flatkv::model
