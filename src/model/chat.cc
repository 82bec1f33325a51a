#include "model/chat.h"

namespace flatkv::model {
namespace {

constexpr std::string_view kChatMlHead =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n";
constexpr std::string_view kChatMlTail =
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}";
constexpr std::string_view kImStart = "<|im_start|>";
constexpr std::string_view kImEnd = "<|im_end|>";

}  // namespace

Result<ChatMl> ParseChatMlTemplate(std::string_view t) {
  // The exact shape, byte for byte, except the system message.
  if (t.empty()) return Status::NotSupported("tokenizer.chat_template is absent: the model has no chat template");
  if (!t.starts_with(kChatMlHead) || !t.ends_with(kChatMlTail) || t.size() < kChatMlHead.size() + kChatMlTail.size()) {
    return Status::NotSupported(
        "tokenizer.chat_template is not the ChatML template this renderer knows (system message, then "
        "<|im_start|>role\\ncontent<|im_end|>\\n per message, then <|im_start|>assistant\\n); it begins '" +
        std::string(t.substr(0, 80)) + "'");
  }
  ChatMl c;
  c.system = std::string(t.substr(kChatMlHead.size(), t.size() - kChatMlHead.size() - kChatMlTail.size()));
  // The system text is a Jinja string literal: a quote, a backslash or a tag
  // inside it would change its meaning.
  for (std::string_view bad : {"'", "\\", "{{", "{%", "<|"}) {
    if (c.system.find(bad) != std::string::npos) {
      return Status::NotSupported("tokenizer.chat_template: the system message holds '" + std::string(bad) +
                                  "', which this renderer does not interpret");
    }
  }
  return c;
}

std::string RenderChatText(const ChatMl& chat, std::string_view user) {
  std::string s;
  s.append(kImStart).append("system\n").append(chat.system).append(kImEnd).append("\n");
  s.append(kImStart).append("user\n").append(user).append(kImEnd).append("\n");
  s.append(kImStart).append("assistant\n");
  return s;
}

Result<std::vector<int>> RenderChat(const Model& model, std::string_view user) {
  if (!model.tokenizer) return Status::InvalidArgument("chat: the model has no tokenizer");
  FLATKV_ASSIGN_OR_RETURN(ChatMl chat, ParseChatMlTemplate(model.chat_template));
  const Tokenizer& tok = *model.tokenizer;
  const int start = tok.SpecialTokenId(kImStart), end = tok.SpecialTokenId(kImEnd);
  if (start < 0 || end < 0) {
    return Status::NotSupported("tokenizer.chat_template is ChatML but the vocabulary has no special token " +
                                std::string(start < 0 ? kImStart : kImEnd));
  }
  std::vector<int> out;
  if (tok.add_bos()) out.push_back(tok.bos_id());
  auto text = [&](std::string_view s) -> Status {
    FLATKV_ASSIGN_OR_RETURN(std::vector<int> ids, tok.Encode(s, /*bos=*/false));
    out.insert(out.end(), ids.begin(), ids.end());
    return Status::Ok();
  };
  const std::string system = "system\n" + chat.system, turn = "user\n" + std::string(user);
  for (std::string_view body : {std::string_view(system), std::string_view(turn)}) {
    out.push_back(start);
    FLATKV_RETURN_IF_ERROR(text(body));
    out.push_back(end);
    FLATKV_RETURN_IF_ERROR(text("\n"));
  }
  out.push_back(start);
  FLATKV_RETURN_IF_ERROR(text("assistant\n"));
  return out;
}

}  // namespace flatkv::model
