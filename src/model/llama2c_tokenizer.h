// The llama2.c BPE tokenizer (tok512.bin, tokenizer.bin).
//
// File format (little-endian): int32 max_token_length, then for each of
// vocab_size tokens: float32 merge score, int32 byte length, the raw bytes.
// Ids 0, 1, 2 are <unk>, <s> (BOS), </s> (EOS); byte tokens are spelled
// "<0xHH>" (ids 3..258 in Llama-2 vocabularies).
//
// Encode follows llama2.c run.c's encode(): a dummy-prefix space when the
// text is non-empty, one token per UTF-8 codepoint (or its bytes as byte
// tokens, id = byte + 3, when the codepoint is not in the vocabulary), then
// repeated merges of the adjacent pair whose merged piece has the best score
// (leftmost pair on ties). Decode follows run.c's decode().
//
// Thread-safety: immutable after construction; share freely.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/model.h"

namespace flatkv::model {

class Llama2cTokenizer final : public Tokenizer {
 public:
  // Parses a tokenizer file holding exactly `vocab_size` tokens. Errors name
  // the field or token index at fault.
  static Result<std::shared_ptr<const Llama2cTokenizer>> Parse(std::string_view bytes, int vocab_size);
  Llama2cTokenizer(const Llama2cTokenizer&) = delete;  // ids_ views into pieces_
  Llama2cTokenizer& operator=(const Llama2cTokenizer&) = delete;

  Result<std::vector<int>> Encode(std::string_view text, bool bos) const override;
  std::string Decode(int prev, int token) const override;
  int bos_id() const override { return 1; }
  int eos_id() const override { return 2; }
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  bool add_bos() const override { return true; }
  // run.c stops at BOS; EOS ends a sequence too.
  bool IsEndOfGeneration(int token) const override { return token == bos_id() || token == eos_id(); }
  // llama2.c vocabularies mark no token special: <s> and </s> are plain pieces.
  int SpecialTokenId(std::string_view) const override { return -1; }
  Result<std::vector<int>> EncodeSpecial(std::string_view, bool) const override {
    return Status::NotSupported("llama2.c tokenizer: it has no special tokens to parse");
  }

  const std::string& piece(int id) const { return pieces_[id]; }
  float score(int id) const { return scores_[id]; }
  int max_token_length() const { return max_token_length_; }

 private:
  Llama2cTokenizer() = default;
  // Id of `piece`, or -1; the lowest id when a piece occurs twice.
  int Lookup(std::string_view piece) const;

  int max_token_length_ = 0;
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string_view, int> ids_;  // views into pieces_
};

// The factory the loaders use.
Result<std::shared_ptr<const Tokenizer>> LoadLlama2cTokenizer(std::string_view bytes, int vocab_size);

}  // namespace flatkv::model
