// The chat templates that turn a chat request's messages into one prompt (openai.hpp).
#include "actors/gateway/openai.hpp"

namespace troupe::openai {

std::optional<chat_template> template_named(const std::string& name) {
  if (name == "raw") return chat_template::raw;
  if (name == "llama2") return chat_template::llama2;
  if (name == "chatml") return chat_template::chatml;
  if (name == "llama3") return chat_template::llama3;
  return std::nullopt;
}

chat_template template_for_model(const std::string& jinja) {
  // The families' markers: ChatML's turn tokens, Llama 3's headers, Llama 2's instruction
  // brackets.
  if (jinja.find("<|im_start|>") != std::string::npos) return chat_template::chatml;
  if (jinja.find("<|start_header_id|>") != std::string::npos) return chat_template::llama3;
  if (jinja.find("[INST]") != std::string::npos) return chat_template::llama2;
  return chat_template::raw;
}

const char* template_name(chat_template t) {
  switch (t) {
    case chat_template::raw: return "raw";
    case chat_template::llama2: return "llama2";
    case chat_template::chatml: return "chatml";
    case chat_template::llama3: return "llama3";
  }
  return "raw";
}

std::string apply_template(chat_template t, const std::vector<std::pair<std::string, std::string>>& messages) {
  std::string out;
  switch (t) {
    case chat_template::raw:
      for (const auto& [role, content] : messages) out += content + "\n";
      return out;
    case chat_template::chatml:
      for (const auto& [role, content] : messages) out += "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
      return out + "<|im_start|>assistant\n";
    case chat_template::llama3:
      // (<|begin_of_text|> is the BOS the prompt gets.)
      for (const auto& [role, content] : messages)
        out += "<|start_header_id|>" + role + "<|end_header_id|>\n\n" + content + "<|eot_id|>";
      return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
    case chat_template::llama2: {
      // <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {answer} </s><s>[INST] ...
      // (the first <s> is the BOS every prompt gets; the tokenizer reads the others, and
      // </s>, as those tokens).
      std::string system;
      for (size_t i = 0; i < messages.size(); ++i) {
        const auto& [role, content] = messages[i];
        if (role == "system") {
          system = "<<SYS>>\n" + content + "\n<</SYS>>\n\n";
        } else if (role == "user") {
          out += "[INST] " + system + content + " [/INST]";
          system.clear();
        } else {
          out += " " + content + " ";
          if (i + 1 < messages.size()) out += "</s><s>";
        }
      }
      return out;
    }
  }
  return out;
}

std::optional<int32_t> turn_end_token(chat_template t, const tokenizer& tok) {
  if (t != chat_template::chatml && t != chat_template::llama3) return std::nullopt;
  const int32_t id = tok.find(t == chat_template::chatml ? "<|im_end|>" : "<|eot_id|>");
  if (id < 0 || id == tok.eos_id()) return std::nullopt;
  return id;
}

}  // namespace troupe::openai
