#include "model/model.h"

#include <xxhash.h>

#include <bit>
#include <cctype>
#include <cmath>

namespace flatkv::model {
namespace {

// Largest value any size field may take. Far above every real model
// (Llama-3 405B: dim 16384, vocab 128256), low enough that products of two
// fields fit easily in uint64.
constexpr int kMaxSize = 1 << 20;

Status CheckSize(const char* field, int value) {
  if (value < 1 || value > kMaxSize)
    return Status::InvalidArgument(std::string(field) + "=" + std::to_string(value) + ": must be in [1, " +
                                   std::to_string(kMaxSize) + "]");
  return Status::Ok();
}

// Canonical little-endian encoding of the fingerprint input.
void HashU64(XXH3_state_t* state, uint64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  XXH3_128bits_update(state, b, sizeof(b));
}

void HashFloats(XXH3_state_t* state, const std::vector<float>& v) {
  HashU64(state, v.size());
  if constexpr (std::endian::native == std::endian::little) {
    XXH3_128bits_update(state, v.data(), v.size() * sizeof(float));
  } else {
    for (float f : v) {
      uint32_t bits = std::bit_cast<uint32_t>(f);
      unsigned char b[4];
      for (int i = 0; i < 4; ++i) b[i] = static_cast<unsigned char>(bits >> (8 * i));
      XXH3_128bits_update(state, b, sizeof(b));
    }
  }
}

}  // namespace

Status Config::Validate() const {
  FLATKV_RETURN_IF_ERROR(CheckSize("dim", dim));
  FLATKV_RETURN_IF_ERROR(CheckSize("hidden_dim", hidden_dim));
  FLATKV_RETURN_IF_ERROR(CheckSize("n_layers", n_layers));
  FLATKV_RETURN_IF_ERROR(CheckSize("n_heads", n_heads));
  FLATKV_RETURN_IF_ERROR(CheckSize("n_kv_heads", n_kv_heads));
  FLATKV_RETURN_IF_ERROR(CheckSize("vocab_size", vocab_size));
  FLATKV_RETURN_IF_ERROR(CheckSize("seq_len", seq_len));
  if (dim % n_heads != 0)
    return Status::InvalidArgument("dim=" + std::to_string(dim) + " is not a multiple of n_heads=" + std::to_string(n_heads));
  if (n_heads % n_kv_heads != 0)
    return Status::InvalidArgument("n_heads=" + std::to_string(n_heads) + " is not a multiple of n_kv_heads=" +
                                   std::to_string(n_kv_heads));
  if (head_size() % 2 != 0)
    return Status::InvalidArgument("head_size=" + std::to_string(head_size()) + " (dim=" + std::to_string(dim) +
                                   " / n_heads=" + std::to_string(n_heads) + ") is odd; RoPE rotates pairs");
  if (!std::isfinite(rope_theta) || rope_theta <= 0.0f)
    return Status::InvalidArgument("rope_theta=" + std::to_string(rope_theta) + ": must be finite and positive");
  if (!std::isfinite(norm_eps) || norm_eps <= 0.0f)
    return Status::InvalidArgument("norm_eps=" + std::to_string(norm_eps) + ": must be finite and positive");
  return Status::Ok();
}

std::string Fingerprint(const Config& config, const Weights& weights) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  static constexpr char kTag[] = "flatkv.model.v1";
  XXH3_128bits_update(state, kTag, sizeof(kTag) - 1);
  // Everything that changes the KV or the outputs, and nothing else:
  // seq_len (a training-time context length) is left out, so the same
  // weights loaded from llama2.c and from GGUF share their KV.
  for (int v : {config.dim, config.hidden_dim, config.n_layers, config.n_heads, config.n_kv_heads, config.vocab_size})
    HashU64(state, static_cast<uint32_t>(v));
  HashU64(state, std::bit_cast<uint32_t>(config.rope_theta));
  HashU64(state, std::bit_cast<uint32_t>(config.norm_eps));
  HashU64(state, config.shared_classifier ? 1 : 0);
  HashFloats(state, weights.token_embedding);
  HashU64(state, weights.layers.size());
  for (const LayerWeights& l : weights.layers) {
    for (const std::vector<float>* v : {&l.rms_att, &l.wq, &l.wk, &l.wv, &l.wo, &l.rms_ffn, &l.w1, &l.w2, &l.w3})
      HashFloats(state, *v);
  }
  HashFloats(state, weights.rms_final);
  HashFloats(state, weights.wcls);
  XXH128_hash_t hash = XXH3_128bits_digest(state);
  XXH3_freeState(state);

  XXH128_canonical_t canon;
  XXH128_canonicalFromHash(&canon, hash);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(32);
  for (unsigned char b : canon.digest) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

Result<Model> LoadModel(const std::string& path, const std::string& tokenizer_path) {
  // A GGUF file carries its own vocabulary, so tokenizer_path is not used for it.
  constexpr std::string_view kGguf = ".gguf";
  if (path.size() >= kGguf.size()) {
    std::string ext = path.substr(path.size() - kGguf.size());
    for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (ext == kGguf) return LoadGguf(path);
  }
  return LoadLlama2c(path, tokenizer_path);
}

}  // namespace flatkv::model
