// Fuzzes the llama2.c checkpoint and tokenizer parsers. Input layout:
// [u32 LE split][checkpoint: split bytes (clamped)][tokenizer: the rest].
// Parsing must return a Status or a model whose shapes match its config,
// never crash; a small parsed model then runs a few forward steps, a
// sampler, and its tokenizer, so that whatever the loader accepts is safe
// to use.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "model/kv_cache.h"
#include "model/model.h"
#include "model/transformer.h"

namespace {

using flatkv::model::Config;
using flatkv::model::Model;

bool ShapesMatch(const Model& m) {
  const Config& c = m.config;
  const size_t dim = c.dim, hidden = c.hidden_dim, kv = c.kv_dim(), vocab = c.vocab_size;
  const auto& w = m.weights;
  if (w.token_embedding.size() != vocab * dim || w.rms_final.size() != dim) return false;
  if (w.wcls.size() != (c.shared_classifier ? 0 : vocab * dim)) return false;
  if (w.layers.size() != static_cast<size_t>(c.n_layers)) return false;
  for (const auto& l : w.layers) {
    if (l.rms_att.size() != dim || l.rms_ffn.size() != dim || l.wq.size() != dim * dim || l.wo.size() != dim * dim ||
        l.wk.size() != kv * dim || l.wv.size() != kv * dim || l.w1.size() != hidden * dim ||
        l.w2.size() != dim * hidden || l.w3.size() != hidden * dim)
      return false;
  }
  return m.fingerprint.size() == 32;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const uint32_t split = data[0] | data[1] << 8 | data[2] << 16 | static_cast<uint32_t>(data[3]) << 24;
  const std::string_view rest(reinterpret_cast<const char*>(data + 4), size - 4);
  const size_t cut = split < rest.size() ? split : rest.size();
  auto parsed = flatkv::model::ParseLlama2c(rest.substr(0, cut), rest.substr(cut), "fuzz.bin");
  if (!parsed.ok()) return 0;
  const Model& m = parsed.value();
  const Config& c = m.config;
  if (!c.Validate().ok() || !ShapesMatch(m)) __builtin_trap();

  if (c.dim <= 256 && c.n_layers <= 8 && c.vocab_size <= 4096 && c.hidden_dim <= 1024) {
    flatkv::model::Transformer tr(m);
    flatkv::model::KvCache cache(c, 4, 8);
    std::vector<float> logits(c.vocab_size);
    const int prompt[2] = {0, c.vocab_size - 1};
    tr.Forward(prompt, 0, cache, logits.data());
    flatkv::model::Sampler sampler(c.vocab_size, 0.8f, 0.9f, split);
    int next = sampler.Sample(logits);
    if (next < 0 || next >= c.vocab_size) __builtin_trap();
    tr.Forward({&next, 1}, 2, cache, logits.data());
    next = flatkv::model::Sampler(c.vocab_size, 0.0f, 1.0f, 0).Sample(logits);
    if (next < 0 || next >= c.vocab_size) __builtin_trap();
  }

  if (m.tokenizer != nullptr) {
    const std::string_view texts[] = {"Once upon a time, h\xc3\xa9llo \xe6\x97\xa5\xff\x80", rest.substr(0, 64)};
    for (std::string_view text : texts) {
      auto ids = m.tokenizer->Encode(text, true);
      if (!ids.ok()) continue;
      int prev = -1;
      for (int id : ids.value()) {
        if (id < 0 || id >= m.tokenizer->vocab_size()) __builtin_trap();
        (void)m.tokenizer->Decode(prev, id);
        prev = id;
      }
    }
  }
  return 0;
}
