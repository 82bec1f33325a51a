// The real SmolLM2-135M-Instruct GGUF file (Q4_1, issue 31): the whole file
// loads with the metadata it carries, its prompts get no BOS, its chat
// template renders with special token ids, and a chat reply stops at EOS.
// The reference comparisons (gguf, llama.cpp, transformers) are
// tests/refs/. Built into flatkv_smollm2_tests, in Release builds only
// (CMakeLists.txt): the sanitizer builds never load the 100 MB model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "engine/engine.h"
#include "flatkv/shape.h"
#include "model/chat.h"
#include "model/model.h"
#include "testing/smollm2_util.h"


namespace flatkv::model {
namespace {

class SmolLm2Test : public ::testing::Test {
 protected:
  void SetUp() override {
    FLATKV_REQUIRE_SMOLLM2(loaded);
    model_ = loaded;
  }
  const Model* model_ = nullptr;
};

TEST_F(SmolLm2Test, LoadsWholeFileWithItsMetadata) {
  const Config& c = model_->config;
  EXPECT_EQ(c.dim, 576);
  EXPECT_EQ(c.hidden_dim, 1536);
  EXPECT_EQ(c.n_layers, 30);
  EXPECT_EQ(c.n_heads, 9);
  EXPECT_EQ(c.n_kv_heads, 3);
  EXPECT_EQ(c.head_size(), 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_EQ(c.seq_len, 8192);
  EXPECT_EQ(c.rope_theta, 100000.0f);
  EXPECT_EQ(c.norm_eps, 1e-5f);
  // Tied: no output.weight, token_embd (Q8_0) is the classifier.
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_TRUE(model_->weights.wcls.empty());
  EXPECT_EQ(model_->weights.classifier(), model_->weights.token_embedding.data());
  EXPECT_EQ(model_->weights.token_embedding.size(), 49152u * 576);
  ASSERT_NE(model_->tokenizer, nullptr);
  const Tokenizer& tok = *model_->tokenizer;
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_FALSE(tok.add_bos());  // tokenizer.ggml.add_bos_token = false
  EXPECT_TRUE(tok.IsEndOfGeneration(2));
  EXPECT_FALSE(tok.IsEndOfGeneration(1));
  EXPECT_EQ(tok.SpecialTokenId("<|im_start|>"), 1);
  EXPECT_EQ(tok.SpecialTokenId("<|im_end|>"), 2);
  EXPECT_EQ(tok.SpecialTokenId("Hello"), -1);  // a normal token is not special
  // The store and daemon know its KV shape by name.
  EXPECT_TRUE(engine::Engine::ShapeFor(c) == FindShapePreset("smollm2-135m").value());
}

TEST_F(SmolLm2Test, PromptsGetNoBosAndSpecialTextStaysText) {
  const Tokenizer& tok = *model_->tokenizer;
  auto plain = tok.Encode("<|im_start|>user", tok.add_bos());
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(std::count(plain->begin(), plain->end(), 1), 0) << "no BOS, and <|im_start|> as text";
  auto special = tok.EncodeSpecial("<|im_start|>user", tok.add_bos());
  ASSERT_TRUE(special.ok());
  ASSERT_FALSE(special->empty());
  EXPECT_EQ(special->front(), 1);
  auto user = tok.Encode("user", false);
  ASSERT_TRUE(user.ok());
  EXPECT_EQ(std::vector<int>(special->begin() + 1, special->end()), user.value());
}

TEST_F(SmolLm2Test, ChatRendersTheFilesTemplateAndStopsAtEos) {
  auto chat = ParseChatMlTemplate(model_->chat_template);
  ASSERT_TRUE(chat.ok()) << chat.status().ToString();
  EXPECT_EQ(chat->system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
  auto prompt = RenderChat(*model_, "What is the capital of France?");
  ASSERT_TRUE(prompt.ok()) << prompt.status().ToString();
  // The rendered text's tokens with the special tokens parsed are the same.
  auto special = model_->tokenizer->EncodeSpecial(RenderChatText(*chat, "What is the capital of France?"), false);
  ASSERT_TRUE(special.ok());
  EXPECT_EQ(prompt.value(), special.value());
  EXPECT_EQ(std::count(prompt->begin(), prompt->end(), 1), 3);  // <|im_start|> x3
  EXPECT_EQ(std::count(prompt->begin(), prompt->end(), 2), 2);  // <|im_end|> x2

  auto e = engine::Engine::Create(*model_, nullptr, engine::EngineOptions{});
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  engine::GenerateOptions go;
  go.max_new_tokens = 48;
  auto r = e.value().Generate(1, prompt.value(), go);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_LT(r->tokens.size(), 48u) << "the reply did not end with <|im_end|>";
  EXPECT_EQ(r->tokens.back(), 2);
  std::string text;
  for (size_t i = 0; i + 1 < r->tokens.size(); ++i) text += model_->tokenizer->Decode(0, r->tokens[i]);
  EXPECT_NE(text.find("Paris"), std::string::npos) << text;

  // Another template shape is refused, naming the key.
  Model other;
  other.tokenizer = model_->tokenizer;
  other.chat_template = model_->chat_template + "{{ eos_token }}";
  auto bad = RenderChat(other, "hi");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("tokenizer.chat_template"), std::string::npos) << bad.status().ToString();
}

}  // namespace
}  // namespace flatkv::model

