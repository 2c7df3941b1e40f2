// Chat templates: the family a model's own template belongs to, and what each family
// makes of a conversation.
#include "actors/gateway/openai.hpp"

#include <doctest/doctest.h>

namespace troupe {

TEST_CASE("a model's Jinja chat template picks the family, and anything else is raw") {
  using openai::chat_template;
  CHECK(openai::template_for_model("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}") ==
        chat_template::chatml);
  CHECK(openai::template_for_model("{{ bos_token }}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]{% endif %}") ==
        chat_template::llama2);
  CHECK(openai::template_for_model("") == chat_template::raw);
  CHECK(openai::template_for_model("{{ messages[0].content }}") == chat_template::raw);
  CHECK(std::string(openai::template_name(chat_template::chatml)) == "chatml");
  CHECK(openai::template_named("auto") == std::nullopt);  // resolved by the node, not a family
}

TEST_CASE("ChatML and Llama 2 render a system prompt, a user turn and the assistant's cue") {
  using openai::chat_template;
  const std::vector<std::pair<std::string, std::string>> msgs{{"system", "Be brief."}, {"user", "Hi"}};
  const std::string chatml = openai::apply_template(chat_template::chatml, msgs);
  CHECK(chatml == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const std::string llama2 = openai::apply_template(chat_template::llama2, msgs);
  CHECK(llama2.find("[INST]") != std::string::npos);
  CHECK(llama2.find("<<SYS>>\nBe brief.\n<</SYS>>") != std::string::npos);
  CHECK(llama2.find("Hi [/INST]") != std::string::npos);
}

}  // namespace troupe
