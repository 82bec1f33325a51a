// Tests for the llama2.c checkpoint loader, the model config checks, the
// fingerprint and the llama2.c tokenizer, on the stories260K model in
// data/models (bundled with the sources, data/models/README.md).
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "model/llama2c_tokenizer.h"
#include "model/model.h"
#include "testing/test_util.h"

namespace flatkv::model {
namespace {

using ::flatkv::testing::ReadFile;
using ::flatkv::testing::ModelDataDir;

std::string ModelPath(const std::string& name) { return ModelDataDir() + "/" + name; }

void PutI32(std::string& bytes, size_t offset, int32_t v) {
  for (int i = 0; i < 4; ++i) bytes[offset + i] = static_cast<char>(static_cast<uint32_t>(v) >> (8 * i));
}

bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// One tensor slice of stories260K.bin, as the README lays the file out.
struct Slice {
  std::string name;  // "wk (layer 3)" or "rms_final"
  uint64_t offset, bytes;
};

std::vector<Slice> Stories260KLayout() {
  const uint64_t dim = 64, hidden = 172, layers = 5, kv_dim = 32, vocab = 512, seq = 512, head = 8;
  struct T {
    const char* name;
    uint64_t layers, floats;
  };
  const T tensors[] = {{"token_embedding", 0, vocab * dim}, {"rms_att", layers, dim},
                       {"wq", layers, dim * dim},           {"wk", layers, kv_dim * dim},
                       {"wv", layers, kv_dim * dim},        {"wo", layers, dim * dim},
                       {"rms_ffn", layers, dim},            {"w1", layers, hidden * dim},
                       {"w2", layers, dim * hidden},        {"w3", layers, hidden * dim},
                       {"rms_final", 0, dim},               {"freq_cis_real", 0, seq * head / 2},
                       {"freq_cis_imag", 0, seq * head / 2}};
  std::vector<Slice> out;
  uint64_t off = 28;
  for (const T& t : tensors) {
    for (uint64_t l = 0; l < std::max<uint64_t>(t.layers, 1); ++l) {
      std::string name = t.name;
      if (t.layers > 0) name += " (layer " + std::to_string(l) + ")";
      out.push_back({name, off, t.floats * 4});
      off += t.floats * 4;
    }
  }
  return out;
}

class Llama2cTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!ReadFile(ModelPath("stories260K.bin"), &checkpoint_) || !ReadFile(ModelPath("tok512.bin"), &tokenizer_))
      FAIL() << "bundled stories260K.bin / tok512.bin not readable under " << ModelDataDir();
  }
  Result<Model> Parse(std::string_view checkpoint, std::string_view tokenizer = {}) {
    return ParseLlama2c(checkpoint, tokenizer, "stories260K.bin");
  }
  std::string checkpoint_, tokenizer_;
};

TEST_F(Llama2cTest, LoadsStories260K) {
  auto m = LoadLlama2c(ModelPath("stories260K.bin"), ModelPath("tok512.bin"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const Config& c = m->config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_EQ(c.head_size(), 8);
  EXPECT_EQ(c.kv_dim(), 32);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.norm_eps, 1e-5f);
  EXPECT_TRUE(c.Validate().ok());

  const Weights& w = m->weights;
  EXPECT_EQ(w.token_embedding.size(), 512u * 64);
  ASSERT_EQ(w.layers.size(), 5u);
  EXPECT_EQ(w.layers[4].wk.size(), 32u * 64);
  EXPECT_EQ(w.layers[4].w2.size(), 64u * 172);
  EXPECT_EQ(w.rms_final.size(), 64u);
  EXPECT_TRUE(w.wcls.empty());
  EXPECT_EQ(w.classifier(), w.token_embedding.data());
  // The last weight of w3 (layer 4) sits just before rms_final in the file.
  const uint64_t rms_final_off = 28 + 4 * (512 * 64 + 5 * (64 + 4096 + 2048 + 2048 + 4096 + 64 + 3 * 172 * 64));
  float expect;
  std::memcpy(&expect, checkpoint_.data() + rms_final_off, 4);
  EXPECT_EQ(w.rms_final[0], expect);
  std::memcpy(&expect, checkpoint_.data() + rms_final_off - 4, 4);
  EXPECT_EQ(w.layers[4].w3.back(), expect);

  ASSERT_NE(m->tokenizer, nullptr);
  EXPECT_EQ(m->tokenizer->vocab_size(), 512);
  EXPECT_EQ(m->source, ModelPath("stories260K.bin"));
  EXPECT_EQ(m->fingerprint.size(), 32u);
  EXPECT_EQ(m->fingerprint.find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST_F(Llama2cTest, LoadModelPicksTheLoaderByExtension) {
  auto m = LoadModel(ModelPath("stories260K.bin"), ModelPath("tok512.bin"));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->config.dim, 64);
  // A .gguf path goes to the GGUF loader, which must fail cleanly here.
  EXPECT_FALSE(LoadModel(ModelDataDir() + "/no-such-model.GGUF", "").ok());
}

TEST_F(Llama2cTest, MissingFilesNameThePath) {
  auto m = LoadLlama2c("/nonexistent/stories.bin", "");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kNotFound);
  EXPECT_TRUE(Contains(m.status().message(), "/nonexistent/stories.bin")) << m.status().ToString();
  auto t = LoadLlama2c(ModelPath("stories260K.bin"), "/nonexistent/tok.bin");
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(Contains(t.status().message(), "/nonexistent/tok.bin")) << t.status().ToString();
}

TEST_F(Llama2cTest, ParsesWithoutTokenizer) {
  auto m = Parse(checkpoint_);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->tokenizer, nullptr);
  EXPECT_EQ(m->source, "stories260K.bin");
}

TEST_F(Llama2cTest, EveryTruncationNamesTheTensor) {
  const std::vector<Slice> layout = Stories260KLayout();
  ASSERT_EQ(layout.back().offset + layout.back().bytes, checkpoint_.size());
  std::set<uint64_t> sizes;
  for (uint64_t s = 0; s <= 40; ++s) sizes.insert(s);
  for (const Slice& sl : layout) {
    for (uint64_t s : {sl.offset - 1, sl.offset, sl.offset + 1, sl.offset + sl.bytes / 2}) sizes.insert(s);
  }
  for (uint64_t s = 41; s < checkpoint_.size(); s += checkpoint_.size() / 37) sizes.insert(s);
  sizes.insert(checkpoint_.size() - 1);
  EXPECT_GE(sizes.size(), 200u);
  for (uint64_t s : sizes) {
    if (s >= checkpoint_.size()) continue;
    auto m = Parse(std::string_view(checkpoint_).substr(0, s));
    ASSERT_FALSE(m.ok()) << "size " << s;
    const std::string msg = m.status().message();
    EXPECT_EQ(m.status().code(), Code::kCorruption) << msg;
    EXPECT_TRUE(Contains(msg, "stories260K.bin: ")) << msg;
    EXPECT_TRUE(Contains(msg, "file has " + std::to_string(s))) << msg;
    if (s < 28) {
      EXPECT_TRUE(Contains(msg, "truncated in header")) << msg;
      continue;
    }
    // The first slice that does not fit is the one named.
    const Slice* cut = nullptr;
    for (const Slice& sl : layout) {
      if (sl.offset + sl.bytes > s) {
        cut = &sl;
        break;
      }
    }
    ASSERT_NE(cut, nullptr);
    EXPECT_TRUE(Contains(msg, "truncated in tensor " + cut->name + ": need " + std::to_string(cut->bytes) +
                                  " bytes at offset " + std::to_string(cut->offset)))
        << "size " << s << ": " << msg;
  }
}

TEST_F(Llama2cTest, TrailingBytesAreRejected) {
  auto m = Parse(checkpoint_ + std::string(4, '\0'));
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(Contains(m.status().message(), "4 trailing bytes after tensor freq_cis_imag")) << m.status().ToString();
}

TEST_F(Llama2cTest, CorruptHeaderFieldsAreNamed) {
  struct Case {
    int field;  // index into the 7 header ints
    int32_t value;
    std::string expect;
  };
  const Case cases[] = {
      {0, 0, "header field dim=0"},
      {0, -64, "header field dim=-64"},
      {0, 1 << 21, "header field dim=2097152"},
      {0, 60, "header field dim=60 is not a multiple of n_heads=8"},
      {0, 72, "header field head_size=9"},
      {1, 0, "header field hidden_dim=0"},
      {1, INT_MAX, "header field hidden_dim=2147483647"},
      {2, 0, "header field n_layers=0"},
      {2, -1, "header field n_layers=-1"},
      {2, 6, "truncated in tensor "},
      {3, 0, "header field n_heads=0"},
      {3, 7, "header field dim=64 is not a multiple of n_heads=7"},
      {4, 0, "header field n_kv_heads=0"},
      {4, 3, "header field n_heads=8 is not a multiple of n_kv_heads=3"},
      {4, 16, "header field n_heads=8 is not a multiple of n_kv_heads=16"},
      {5, 0, "header field vocab_size=0"},
      {5, INT_MIN, "header field vocab_size=-2147483648"},
      {5, -512, "truncated in tensor wcls: need 131072 bytes at offset 1056540"},
      {5, 513, "truncated in tensor"},
      {6, 0, "header field seq_len=0"},
      {6, -5, "header field seq_len=-5"},
      {6, 1 << 20, "truncated in tensor freq_cis_real"},
      {2, 1 << 20, "truncated in tensor rms_att (layer 3615)"},
      {1, 1 << 20, "truncated in tensor w1 (layer 0)"},
      {4, 8, "truncated in tensor "},  // MHA: wk and wv grow, the file is too short
  };
  for (const Case& c : cases) {
    std::string bytes = checkpoint_;
    PutI32(bytes, 4 * c.field, c.value);
    auto m = Parse(bytes);
    ASSERT_FALSE(m.ok()) << "field " << c.field << " = " << c.value;
    EXPECT_EQ(m.status().code(), Code::kCorruption);
    EXPECT_TRUE(Contains(m.status().message(), c.expect))
        << "field " << c.field << " = " << c.value << ": " << m.status().ToString();
  }
}

TEST_F(Llama2cTest, SeparateClassifierIsLoaded) {
  // Negative vocab_size plus a wcls tensor: the classifier is not shared.
  std::string bytes = checkpoint_;
  PutI32(bytes, 20, -512);
  std::string wcls(512 * 64 * 4, '\0');
  for (size_t i = 0; i < wcls.size(); i += 4) PutI32(wcls, i, 0x3f800000);  // 1.0f
  auto m = Parse(bytes + wcls);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_FALSE(m->config.shared_classifier);
  EXPECT_EQ(m->config.vocab_size, 512);
  ASSERT_EQ(m->weights.wcls.size(), 512u * 64);
  EXPECT_EQ(m->weights.wcls[100], 1.0f);
  EXPECT_EQ(m->weights.classifier(), m->weights.wcls.data());
  auto shared = Parse(checkpoint_);
  ASSERT_TRUE(shared.ok());
  EXPECT_NE(m->fingerprint, shared->fingerprint);
}

TEST(ConfigTest, ValidateNamesTheField) {
  Config ok{64, 172, 5, 8, 4, 512, 512};
  EXPECT_TRUE(ok.Validate().ok());
  struct Case {
    Config c;
    std::string expect;
  };
  auto with = [&](auto change) {
    Config c = ok;
    change(c);
    return c;
  };
  const Case cases[] = {
      {with([](Config& c) { c.hidden_dim = -1; }), "hidden_dim=-1"},
      {with([](Config& c) { c.seq_len = (1 << 20) + 1; }), "seq_len=1048577"},
      {with([](Config& c) { c.n_kv_heads = 5; }), "n_kv_heads=5"},
      {with([](Config& c) { c.rope_theta = 0.0f; }), "rope_theta"},
      {with([](Config& c) { c.norm_eps = -1.0f; }), "norm_eps"},
      {with([](Config& c) { c.norm_eps = std::numeric_limits<float>::quiet_NaN(); }), "norm_eps"},
  };
  for (const Case& c : cases) {
    Status s = c.c.Validate();
    ASSERT_FALSE(s.ok()) << c.expect;
    EXPECT_EQ(s.code(), Code::kInvalidArgument);
    EXPECT_TRUE(Contains(s.message(), c.expect)) << s.ToString();
  }
}

TEST_F(Llama2cTest, FingerprintFollowsEveryWeight) {
  auto a = Parse(checkpoint_);
  auto b = Parse(checkpoint_, tokenizer_);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->fingerprint, b->fingerprint);  // the tokenizer is not part of it
  EXPECT_EQ(a->fingerprint, Fingerprint(a->config, a->weights));
  // Pinned: the fingerprint names stored KV, so its encoding must not drift.
  EXPECT_EQ(a->fingerprint, "eccb625da89a145ae2123d501f09cd7a");

  Weights w = a->weights;
  w.layers[3].w2[17] = std::nextafter(w.layers[3].w2[17], 1.0f);
  EXPECT_NE(Fingerprint(a->config, w), a->fingerprint);
  w = a->weights;
  w.rms_final[63] = -w.rms_final[63];
  EXPECT_NE(Fingerprint(a->config, w), a->fingerprint);
  // Moving a value between adjacent tensors changes it too (lengths are hashed).
  w = a->weights;
  w.layers[0].wv.push_back(w.layers[0].wo.front());
  w.layers[0].wo.erase(w.layers[0].wo.begin());
  EXPECT_NE(Fingerprint(a->config, w), a->fingerprint);
  Config c = a->config;
  c.norm_eps = 1e-6f;
  EXPECT_NE(Fingerprint(c, a->weights), a->fingerprint);
  c = a->config;
  c.rope_theta = 500000.0f;
  EXPECT_NE(Fingerprint(c, a->weights), a->fingerprint);
}

// --- tokenizer ---------------------------------------------------------

// Offsets of each token record (score, length, bytes) in tok512.bin.
std::vector<size_t> TokenOffsets(const std::string& tok) {
  std::vector<size_t> out;
  size_t off = 4;
  for (int i = 0; i < 512; ++i) {
    out.push_back(off);
    int32_t len;
    std::memcpy(&len, tok.data() + off + 4, 4);
    off += 8 + len;
  }
  return out;
}

TEST_F(Llama2cTest, TokenizerEncodesLikeRunC) {
  auto tok = Llama2cTokenizer::Parse(tokenizer_, 512);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const Llama2cTokenizer& t = **tok;
  EXPECT_EQ(t.max_token_length(), 7);
  EXPECT_EQ(t.piece(1), "\n<s>\n");  // as llama2.c exports it
  EXPECT_EQ(t.piece(3), "<0x00>");

  auto ids = t.Encode("Once upon a time", true);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids.value(), (std::vector<int>{1, 403, 407, 261, 378}));
  auto no_bos = t.Encode("Once upon a time", false);
  ASSERT_TRUE(no_bos.ok());
  EXPECT_EQ(no_bos.value(), (std::vector<int>{403, 407, 261, 378}));
  EXPECT_EQ(t.Encode("", true).value(), std::vector<int>{1});
  EXPECT_TRUE(t.Encode("", false).value().empty());
  // A newline has no piece of its own: it falls back to byte token 0x0A + 3.
  auto nl = t.Encode("\n", false);
  ASSERT_TRUE(nl.ok());
  EXPECT_EQ(nl.value().back(), 0x0A + 3);
}

TEST_F(Llama2cTest, TokenizerRoundTripsText) {
  auto tok = Llama2cTokenizer::Parse(tokenizer_, 512);
  ASSERT_TRUE(tok.ok());
  const std::string texts[] = {"Lily saw a big, red ball.", "h\xc3\xa9llo \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80!\n\tx",
                               std::string("a\0b", 3), std::string("\x80\x80\x80\x80\x80\xff", 6), "  two spaces"};
  for (const std::string& text : texts) {
    auto ids = (*tok)->Encode(text, true);
    ASSERT_TRUE(ids.ok());
    std::string back;
    for (size_t i = 1; i < ids->size(); ++i) back += (*tok)->Decode((*ids)[i - 1], (*ids)[i]);
    EXPECT_EQ(back, text);
  }
}

TEST_F(Llama2cTest, TokenizerDecodesLikeRunC) {
  auto tok = Llama2cTokenizer::Parse(tokenizer_, 512);
  ASSERT_TRUE(tok.ok());
  const Llama2cTokenizer& t = **tok;
  EXPECT_EQ(t.Decode(1, 403), "Once");  // leading space dropped after BOS
  EXPECT_EQ(t.Decode(403, 407), t.piece(407));
  EXPECT_EQ(t.piece(407)[0], ' ');
  EXPECT_EQ(t.Decode(5, 13), "\n");  // <0x0A>
  EXPECT_EQ(t.Decode(1, 3 + 0xE6), "\xe6");
  EXPECT_EQ(t.Decode(1, -1), "");
  EXPECT_EQ(t.Decode(1, 512), "");
}

TEST_F(Llama2cTest, MalformedTokenizerNamesTheToken) {
  const std::vector<size_t> offs = TokenOffsets(tokenizer_);
  // Every truncation fails, naming max_token_length or a token.
  for (size_t s = 0; s < tokenizer_.size(); s += (s < 64 ? 1 : 37)) {
    auto t = Llama2cTokenizer::Parse(std::string_view(tokenizer_).substr(0, s), 512);
    ASSERT_FALSE(t.ok()) << s;
    const std::string msg = t.status().message();
    if (s < 4) {
      EXPECT_TRUE(Contains(msg, "max_token_length")) << msg;
    } else {
      int index = 0;  // the first record that ends past the cut
      while ((index + 1 < 512 ? offs[index + 1] : tokenizer_.size()) <= s) ++index;
      EXPECT_TRUE(Contains(msg, "token " + std::to_string(index) + ": truncated")) << s << ": " << msg;
    }
  }
  std::string bad = tokenizer_;
  PutI32(bad, offs[5] + 4, 100);
  auto t = Llama2cTokenizer::Parse(bad, 512);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(Contains(t.status().message(), "token 5: length 100 not in [0, max_token_length=7]"))
      << t.status().ToString();
  bad = tokenizer_;
  PutI32(bad, offs[9] + 4, -1);
  t = Llama2cTokenizer::Parse(bad, 512);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(Contains(t.status().message(), "token 9: length -1")) << t.status().ToString();
  bad = tokenizer_;
  PutI32(bad, offs[300], 0x7fc00000);  // NaN score
  t = Llama2cTokenizer::Parse(bad, 512);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(Contains(t.status().message(), "token 300: score is NaN")) << t.status().ToString();
  bad = tokenizer_;
  PutI32(bad, 0, 0);
  t = Llama2cTokenizer::Parse(bad, 512);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(Contains(t.status().message(), "max_token_length=0")) << t.status().ToString();
  // The vocabulary size comes from the checkpoint; a mismatch is caught.
  t = Llama2cTokenizer::Parse(tokenizer_, 500);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(Contains(t.status().message(), "trailing bytes after token 499")) << t.status().ToString();
  t = Llama2cTokenizer::Parse(tokenizer_, 513);
  ASSERT_FALSE(t.ok());
  EXPECT_TRUE(Contains(t.status().message(), "token 512: truncated")) << t.status().ToString();
  // Through the model loader the error carries the tokenizer's name.
  auto m = ParseLlama2c(checkpoint_, std::string_view(tokenizer_).substr(0, 100), "stories260K.bin");
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(Contains(m.status().message(), "stories260K.bin tokenizer: token ")) << m.status().ToString();
}

TEST(Llama2cTokenizerTest, SmallVocabularyReportsMissingByteTokens) {
  // A 5-token vocabulary without byte tokens: "a", "b", "c", " ", "ab".
  std::string bytes(4, '\0');
  PutI32(bytes, 0, 2);
  for (const char* piece : {"a", "b", "c", " ", "ab"}) {
    std::string rec(8, '\0');
    PutI32(rec, 0, 0);
    PutI32(rec, 4, static_cast<int32_t>(std::strlen(piece)));
    bytes += rec + piece;
  }
  auto tok = Llama2cTokenizer::Parse(bytes, 5);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  auto ids = (*tok)->Encode("abc", false);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(ids.value(), (std::vector<int>{3, 4, 2}));  // " ", "ab", "c"
  auto bad = (*tok)->Encode("x", false);
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(bad.status().message(), "byte 0x78 has no token")) << bad.status().ToString();
}

}  // namespace
}  // namespace flatkv::model
