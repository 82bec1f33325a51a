// The GGUF tokenizers against llama.cpp's tokenizer test vectors
// (shared/data/gguf/ggml-vocab-*.gguf with .inp/.out, as llama.cpp's
// test-tokenizer-0 reads them), plus decoding round trips.
#include "model/gguf_tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "testing/test_util.h"

namespace flatkv::model {
namespace {

using ::flatkv::testing::ReadFile;
using ::flatkv::testing::SharedDataDir;

struct Vectors {
  std::string gguf_bytes;  // GgufFile views into it
  std::vector<std::string> inputs;
  std::vector<std::vector<int>> expected;
};

// X.gguf.inp: each input followed by "\n__ggml_vocab_test__\n".
// X.gguf.out: one line per input, the expected ids separated by spaces.
bool LoadVectors(const std::string& name, Vectors* v) {
  std::string base = SharedDataDir() + "/gguf/" + name;
  std::string inp, out;
  if (!ReadFile(base, &v->gguf_bytes) || !ReadFile(base + ".inp", &inp) || !ReadFile(base + ".out", &out)) return false;
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (size_t pos = 0, at; (at = inp.find(sep, pos)) != std::string::npos; pos = at + sep.size()) {
    v->inputs.push_back(inp.substr(pos, at - pos));
  }
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream ids(line);
    std::vector<int> row;
    for (int id; ids >> id;) row.push_back(id);
    v->expected.push_back(row);
  }
  return true;
}

std::string Show(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) {
    s += ' ';
    s += std::to_string(id);
  }
  return s;
}

// Encodes every input; returns how many match their expected ids.
int RunVectors(const Tokenizer& tok, const Vectors& v) {
  int pass = 0;
  for (size_t i = 0; i < v.inputs.size(); ++i) {
    Result<std::vector<int>> ids = tok.Encode(v.inputs[i], /*bos=*/false);
    EXPECT_TRUE(ids.ok()) << "input " << i << ": " << ids.status().ToString();
    if (!ids.ok()) continue;
    EXPECT_EQ(*ids, v.expected[i]) << "input " << i << " '" << v.inputs[i] << "'\n got:     " << Show(*ids)
                                   << "\n expected:" << Show(v.expected[i]);
    pass += *ids == v.expected[i];
  }
  return pass;
}

// Decoding the expected ids (after BOS) gives the input back.
void CheckDecode(const Tokenizer& tok, const Vectors& v) {
  for (size_t i = 0; i < v.inputs.size(); ++i) {
    std::string text;
    int prev = tok.bos_id();
    for (int id : v.expected[i]) {
      text += tok.Decode(prev, id);
      prev = id;
    }
    EXPECT_EQ(text, v.inputs[i]) << "input " << i;
  }
}

TEST(GgufTokenizer, LlamaSpmVectors) {
  Vectors v;
  if (!LoadVectors("ggml-vocab-llama-spm.gguf", &v)) {
    GTEST_SKIP() << "shared data not found: " << SharedDataDir() << "/gguf/ggml-vocab-llama-spm.gguf (.inp, .out)";
  }
  ASSERT_EQ(v.inputs.size(), 46u);
  ASSERT_EQ(v.expected.size(), v.inputs.size());
  Result<GgufFile> f = GgufFile::Parse(v.gguf_bytes);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto tok = LoadGgufTokenizer(*f);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), 32000);
  EXPECT_EQ((*tok)->bos_id(), 1);
  EXPECT_EQ((*tok)->eos_id(), 2);
  int pass = RunVectors(**tok, v);
  std::cout << "llama-spm: " << pass << "/" << v.inputs.size() << " vectors pass\n";
  EXPECT_EQ(pass, static_cast<int>(v.inputs.size()));
  CheckDecode(**tok, v);
  Result<std::vector<int>> with_bos = (*tok)->Encode("Hello world", true);
  ASSERT_TRUE(with_bos.ok());
  EXPECT_EQ(*with_bos, (std::vector<int>{1, 15043, 3186}));
}

TEST(GgufTokenizer, Gpt2Vectors) {
  Vectors v;
  if (!LoadVectors("ggml-vocab-gpt-2.gguf", &v)) {
    GTEST_SKIP() << "shared data not found: " << SharedDataDir() << "/gguf/ggml-vocab-gpt-2.gguf (.inp, .out)";
  }
  ASSERT_EQ(v.inputs.size(), 46u);
  ASSERT_EQ(v.expected.size(), v.inputs.size());
  Result<GgufFile> f = GgufFile::Parse(v.gguf_bytes);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  auto tok = LoadGgufTokenizer(*f);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->vocab_size(), 50257);
  EXPECT_EQ((*tok)->bos_id(), 50256);
  EXPECT_EQ((*tok)->eos_id(), 50256);
  int pass = RunVectors(**tok, v);
  std::cout << "gpt-2: " << pass << "/" << v.inputs.size() << " vectors pass\n";
  EXPECT_EQ(pass, static_cast<int>(v.inputs.size()));
  CheckDecode(**tok, v);
  EXPECT_EQ((*tok)->Decode(0, 50256), "");  // control token
}

// Invalid UTF-8 still encodes (byte-level BPE keeps every byte) and decodes back.
TEST(GgufTokenizer, Gpt2InvalidUtf8RoundTrips) {
  Vectors v;
  if (!LoadVectors("ggml-vocab-gpt-2.gguf", &v)) {
    GTEST_SKIP() << "shared data not found: " << SharedDataDir() << "/gguf/ggml-vocab-gpt-2.gguf (.inp, .out)";
  }
  Result<GgufFile> f = GgufFile::Parse(v.gguf_bytes);
  ASSERT_TRUE(f.ok());
  auto tok = LoadGgufTokenizer(*f);
  ASSERT_TRUE(tok.ok());
  const std::string text = "a\xff\xfe b\xc3 \xe2\x82";
  Result<std::vector<int>> ids = (*tok)->Encode(text, false);
  ASSERT_TRUE(ids.ok());
  std::string back;
  for (int id : *ids) back += (*tok)->Decode(-1, id);
  EXPECT_EQ(back, text);
}

TEST(GgufTokenizer, RejectsAnUnknownModel) {
  Vectors v;
  if (!LoadVectors("ggml-vocab-llama-spm.gguf", &v)) {
    GTEST_SKIP() << "shared data not found: " << SharedDataDir() << "/gguf/ggml-vocab-llama-spm.gguf (.inp, .out)";
  }
  // Rename the value "llama" of tokenizer.ggml.model in place to "llamb".
  std::string bytes = v.gguf_bytes;
  const std::string key = "tokenizer.ggml.model";
  size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  size_t value = at + key.size() + 4 + 8;  // type, string length
  ASSERT_EQ(bytes.substr(value, 5), "llama");
  bytes[value + 4] = 'b';
  Result<GgufFile> f = GgufFile::Parse(bytes);
  ASSERT_TRUE(f.ok());
  auto tok = LoadGgufTokenizer(*f);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), Code::kNotSupported);
  EXPECT_NE(tok.status().message().find("'llamb'"), std::string::npos) << tok.status().ToString();
}

}  // namespace
}  // namespace flatkv::model
