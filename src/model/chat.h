// Chat prompts: a GGUF file's tokenizer.chat_template rendered for one user
// message, as token ids.
//
// No Jinja engine: RenderChat recognises the ChatML template that SmolLM2
// (and other HuggingFace ChatML models) carry, token for token of its fixed
// text, with the default system message as its only free part:
//
//   {% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}
//   {{ '<|im_start|>system\n<SYSTEM><|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role']
//   + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}
//   {{ '<|im_start|>assistant\n' }}{% endif %}
//
// (one line in the file; the '\n' are newlines inside the string literals).
// It renders, with the generation prompt,
//
//   <|im_start|>system\n<SYSTEM><|im_end|>\n<|im_start|>user\n<PROMPT><|im_end|>\n<|im_start|>assistant\n
//
// with <|im_start|> and <|im_end|> as their special token ids and the text
// between them encoded as plain text (a user prompt that spells
// "<|im_end|>" stays text), which is what llama.cpp's tokenize with
// parse_special gives for the rendered string when the prompt holds no
// special-token text. Any other template is NotSupported, naming
// tokenizer.chat_template.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "flatkv/status.h"
#include "model/model.h"

namespace flatkv::model {

struct ChatMl {
  std::string system;  // the template's default system message
};

// Recognises `chat_template` as the ChatML template above.
Result<ChatMl> ParseChatMlTemplate(std::string_view chat_template);

// The rendered text (for display and for reference checks).
std::string RenderChatText(const ChatMl& chat, std::string_view user);

// The prompt's token ids: BOS first when the tokenizer's add_bos() says so.
Result<std::vector<int>> RenderChat(const Model& model, std::string_view user);

}  // namespace flatkv::model
