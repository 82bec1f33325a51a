#include "model/llama2c_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <queue>

namespace flatkv::model {
namespace {

constexpr int kMaxTokenLength = 1 << 16;
constexpr int kMaxVocab = 1 << 20;
// run.c starts its best-score search at -1e10: merges scoring at or below it never happen.
constexpr float kNoMergeScore = -1e10f;

uint32_t LoadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte a "<0xHH>" piece stands for, or -1.
int ByteToken(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int hi = HexDigit(piece[3]), lo = HexDigit(piece[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

Result<std::shared_ptr<const Llama2cTokenizer>> Llama2cTokenizer::Parse(std::string_view bytes, int vocab_size) {
  if (vocab_size < 1 || vocab_size > kMaxVocab)
    return Status::InvalidArgument("vocab_size=" + std::to_string(vocab_size) + ": must be in [1, " +
                                   std::to_string(kMaxVocab) + "]");
  const uint64_t size = bytes.size();
  if (size < 4)
    return Status::Corruption("truncated in field max_token_length: need 4 bytes at offset 0, file has " +
                              std::to_string(size));
  auto tok = std::shared_ptr<Llama2cTokenizer>(new Llama2cTokenizer());
  const int max_len = static_cast<int32_t>(LoadU32(bytes.data()));
  if (max_len < 1 || max_len > kMaxTokenLength)
    return Status::Corruption("field max_token_length=" + std::to_string(max_len) + ": must be in [1, " +
                              std::to_string(kMaxTokenLength) + "]");
  tok->max_token_length_ = max_len;
  tok->pieces_.reserve(std::min<uint64_t>(vocab_size, (size - 4) / 8));
  tok->scores_.reserve(tok->pieces_.capacity());

  uint64_t off = 4;
  for (int i = 0; i < vocab_size; ++i) {
    const std::string where = "token " + std::to_string(i);
    if (size - off < 8)
      return Status::Corruption(where + ": truncated: need 8 bytes (score, length) at offset " + std::to_string(off) +
                                ", file has " + std::to_string(size));
    float score;
    uint32_t score_bits = LoadU32(bytes.data() + off);
    std::memcpy(&score, &score_bits, sizeof(score));
    const int len = static_cast<int32_t>(LoadU32(bytes.data() + off + 4));
    off += 8;
    if (std::isnan(score)) return Status::Corruption(where + ": score is NaN");
    if (len < 0 || len > max_len)
      return Status::Corruption(where + ": length " + std::to_string(len) + " not in [0, max_token_length=" +
                                std::to_string(max_len) + "]");
    if (size - off < static_cast<uint64_t>(len))
      return Status::Corruption(where + ": truncated: need " + std::to_string(len) + " bytes at offset " +
                                std::to_string(off) + ", file has " + std::to_string(size));
    tok->pieces_.emplace_back(bytes.substr(off, len));
    tok->scores_.push_back(score);
    off += len;
  }
  if (off != size)
    return Status::Corruption(std::to_string(size - off) + " trailing bytes after token " +
                              std::to_string(vocab_size - 1) + " at offset " + std::to_string(off) +
                              " (does the tokenizer belong to a model with vocab_size " + std::to_string(vocab_size) +
                              "?)");
  // pieces_ is complete: the views below stay valid for the object's life.
  tok->ids_.reserve(tok->pieces_.size());
  for (int i = 0; i < vocab_size; ++i) tok->ids_.emplace(tok->pieces_[i], i);  // keeps the lowest id
  return std::shared_ptr<const Llama2cTokenizer>(std::move(tok));
}

int Llama2cTokenizer::Lookup(std::string_view piece) const {
  auto it = ids_.find(piece);
  return it == ids_.end() ? -1 : it->second;
}

Result<std::vector<int>> Llama2cTokenizer::Encode(std::string_view text, bool bos) const {
  const int vocab = vocab_size();
  std::vector<int> out;
  if (bos) {
    if (bos_id() >= vocab)
      return Status::InvalidArgument("BOS id " + std::to_string(bos_id()) + " is outside the vocabulary (vocab_size " +
                                     std::to_string(vocab) + ")");
    out.push_back(bos_id());
  }
  if (text.empty()) return out;

  // Pieces before merging: the dummy prefix, then each codepoint's token or its bytes' tokens.
  std::vector<int> toks;
  auto add_bytes = [&](std::string_view s) -> Status {
    for (unsigned char b : s) {
      int id = b + 3;
      if (id >= vocab)
        return Status::InvalidArgument("byte 0x" + std::string(1, "0123456789abcdef"[b >> 4]) +
                                       std::string(1, "0123456789abcdef"[b & 15]) + " has no token (fallback id " +
                                       std::to_string(id) + ", vocab_size " + std::to_string(vocab) + ")");
      toks.push_back(id);
    }
    return Status::Ok();
  };
  auto add_piece = [&](std::string_view s) -> Status {
    int id = Lookup(s);
    if (id >= 0) {
      toks.push_back(id);
      return Status::Ok();
    }
    return add_bytes(s);
  };
  FLATKV_RETURN_IF_ERROR(add_piece(" "));
  // As run.c: a codepoint is a lead byte plus up to 3 continuation bytes.
  size_t start = 0;
  for (size_t c = 0; c < text.size(); ++c) {
    if ((static_cast<unsigned char>(text[c]) & 0xC0) != 0x80) start = c;
    const size_t len = c + 1 - start;
    const bool next_continues = c + 1 < text.size() && (static_cast<unsigned char>(text[c + 1]) & 0xC0) == 0x80;
    if (next_continues && len < 4) continue;
    FLATKV_RETURN_IF_ERROR(add_piece(text.substr(start, len)));
    start = c + 1;
  }

  // Merges: always the best-scoring adjacent pair, the leftmost on ties.
  // A doubly linked list over `toks` plus a max-heap of candidate pairs;
  // entries whose nodes changed since they were pushed are skipped, so the
  // result equals run.c's repeated full scans.
  const int n = static_cast<int>(toks.size());
  std::vector<int> prev(n), next(n), version(n, 0);
  std::vector<bool> alive(n, true);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    float score;
    int left, right, left_version, right_version, id;
  };
  auto worse = [](const Candidate& a, const Candidate& b) {
    return a.score != b.score ? a.score < b.score : a.left > b.left;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(worse)> heap(worse);
  std::string merged;
  auto push = [&](int i) {
    if (i < 0 || next[i] < 0) return;
    const int j = next[i];
    merged.assign(pieces_[toks[i]]);
    merged.append(pieces_[toks[j]]);
    const int id = Lookup(merged);
    if (id >= 0 && scores_[id] > kNoMergeScore) heap.push({scores_[id], i, j, version[i], version[j], id});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    if (!alive[c.left] || !alive[c.right] || version[c.left] != c.left_version ||
        version[c.right] != c.right_version || next[c.left] != c.right)
      continue;
    toks[c.left] = c.id;
    ++version[c.left];
    alive[c.right] = false;
    next[c.left] = next[c.right];
    if (next[c.left] >= 0) prev[next[c.left]] = c.left;
    push(prev[c.left]);
    push(c.left);
  }
  for (int i = n > 0 ? 0 : -1; i >= 0; i = next[i]) out.push_back(toks[i]);
  return out;
}

std::string Llama2cTokenizer::Decode(int prev, int token) const {
  if (token < 0 || token >= vocab_size()) return {};
  std::string_view piece = pieces_[token];
  if (prev == bos_id() && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
  const int byte = ByteToken(piece);
  if (byte >= 0) return std::string(1, static_cast<char>(byte));
  return std::string(piece);
}

Result<std::shared_ptr<const Tokenizer>> LoadLlama2cTokenizer(std::string_view bytes, int vocab_size) {
  auto tok = Llama2cTokenizer::Parse(bytes, vocab_size);
  if (!tok.ok()) return tok.status();
  return std::shared_ptr<const Tokenizer>(std::move(tok).value());
}

}  // namespace flatkv::model
