// The tokenizer stored in a GGUF file's metadata, as llama.cpp runs it.
//
// tokenizer.ggml.model selects the algorithm:
//   "llama": SentencePiece-style BPE (llama.cpp's llm_tokenizer_spm). A "▁"
//            prefix is added (unless tokenizer.ggml.add_space_prefix is
//            false), spaces become "▁", the best-scoring adjacent pair of
//            pieces is merged until none is in the vocabulary, and pieces
//            left unknown fall back to <0xHH> byte tokens.
//   "gpt2":  byte-level BPE with tokenizer.ggml.merges (rank = position):
//            the GPT-2 pre-tokenizer splits the text, each piece's bytes
//            are mapped through GPT-2's bytes-to-unicode table, and the
//            lowest-ranked adjacent pair is merged until none remains.
//            tokenizer.ggml.pre "gpt-2" (or absent) and "smollm" (every digit a
//            word of its own first, then the GPT-2 split) are supported.
// Special tokens follow llama.cpp's tokenize: the text is first split at
// every occurrence of a special token's text (longest first); user-defined
// tokens always match, control tokens ("<s>", "<|im_start|>") only through
// EncodeSpecial (parse_special), so Encode keeps their text as plain text.
// Each raw fragment is then encoded on its own. BOS goes in front only when
// the caller asks; callers follow add_bos() (tokenizer.ggml.add_bos_token,
// by default true for "llama" and false for "gpt2", as llama.cpp). Decode maps byte tokens to their
// byte, "▁" to a space (llama) or the GPT-2 byte alphabet back to bytes
// (gpt2); control tokens decode to "", and a piece after BOS drops its
// leading space (llama).
//
// Thread-safety: immutable after loading; Encode and Decode may run
// concurrently.
#pragma once

#include <memory>

#include "model/gguf.h"
#include "model/model.h"

namespace flatkv::model {

// The tokenizer of a parsed GGUF file (a model, or a vocab-only file with no
// tensors). Errors name the metadata key at fault; NotSupported for an
// unknown tokenizer.ggml.model or pre-tokenizer.
Result<std::shared_ptr<const Tokenizer>> LoadGgufTokenizer(const GgufFile& file);

}  // namespace flatkv::model
