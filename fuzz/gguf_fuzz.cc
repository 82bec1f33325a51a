// Fuzzes the GGUF reader with arbitrary bytes: ParseGguf (container, llama
// config and weights), and the tokenizer loader with a few encodes and
// decodes. Everything must come back as a Status or a value, never crash;
// a loaded model must be self-consistent.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/gguf.h"
#include "model/gguf_tokenizer.h"
#include "model/model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto model = flatkv::model::ParseGguf(bytes, "fuzz");
  if (model.ok()) {
    const auto& c = model->config;
    const auto& w = model->weights;
    if (w.layers.size() != static_cast<size_t>(c.n_layers)) __builtin_trap();
    if (w.token_embedding.size() != static_cast<size_t>(c.vocab_size) * c.dim) __builtin_trap();
  }
  auto file = flatkv::model::GgufFile::Parse(bytes);
  if (!file.ok()) return 0;
  for (const auto& kv : file->metadata()) (void)flatkv::model::DecodeArray(kv.value);
  for (const auto& t : file->tensors()) {
    if (t.data.size() != t.n_bytes) __builtin_trap();
    (void)flatkv::model::DequantizeTensor(t);
  }
  auto tok = flatkv::model::LoadGgufTokenizer(*file);
  if (!tok.ok()) return 0;
  const auto& tk = **tok;
  // Some text from the input itself, plus fixed samples.
  std::string_view tail = bytes.substr(size > 64 ? size - 64 : 0);
  for (std::string_view text : {std::string_view("Hello world, it's 2024!  \n\t"), tail}) {
    auto ids = tk.Encode(text, true);
    if (!ids.ok()) continue;
    int prev = -1;
    for (int id : *ids) {
      if (id < 0 || id >= tk.vocab_size()) __builtin_trap();
      (void)tk.Decode(prev, id);
      prev = id;
    }
  }
  (void)tk.Decode(tk.bos_id(), -5);
  (void)tk.Decode(tk.bos_id(), tk.vocab_size());
  return 0;
}
