// Chat templates: the family a model's own template belongs to, and what each family
// makes of a conversation. Request parsing: the shapes of prompts and messages clients
// send, the sampling extensions, and the fields refused rather than ignored.
#include "actors/gateway/openai.hpp"

#include <algorithm>

#include <doctest/doctest.h>

#include "tests/support/test_support.hpp"

namespace troupe {

TEST_CASE("a model's Jinja chat template picks the family, and anything else is raw") {
  using openai::chat_template;
  CHECK(openai::template_for_model("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}") ==
        chat_template::chatml);
  CHECK(openai::template_for_model("{{ bos_token }}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]{% endif %}") ==
        chat_template::llama2);
  CHECK(openai::template_for_model("{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
                                   "{{ m.content }}<|eot_id|>{% endfor %}") == chat_template::llama3);
  CHECK(openai::template_for_model("") == chat_template::raw);
  CHECK(openai::template_for_model("{{ messages[0].content }}") == chat_template::raw);
  CHECK(std::string(openai::template_name(chat_template::chatml)) == "chatml");
  CHECK(openai::template_named("auto") == std::nullopt);  // resolved by the node, not a family
}

TEST_CASE("ChatML and Llama 2 render a system prompt, user and assistant turns, and the assistant's cue") {
  using openai::chat_template;
  const std::vector<std::pair<std::string, std::string>> msgs{{"system", "Be brief."}, {"user", "Hi"}};
  const std::string chatml = openai::apply_template(chat_template::chatml, msgs);
  CHECK(chatml == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  const std::string llama2 = openai::apply_template(chat_template::llama2, msgs);
  CHECK(llama2.find("[INST]") != std::string::npos);
  CHECK(llama2.find("<<SYS>>\nBe brief.\n<</SYS>>") != std::string::npos);
  CHECK(llama2.find("Hi [/INST]") != std::string::npos);
  // Turns after the first are closed with EOS and opened with BOS, as Llama 2 was trained.
  const std::vector<std::pair<std::string, std::string>> turns{
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
  CHECK(openai::apply_template(chat_template::llama2, turns) ==
        "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Bye [/INST]");
}

TEST_CASE("Llama 3 renders each turn under its header, ended by <|eot_id|>, and the assistant's header") {
  using openai::chat_template;
  const std::vector<std::pair<std::string, std::string>> msgs{{"system", "Be brief."}, {"user", "Hi"}};
  CHECK(openai::apply_template(chat_template::llama3, msgs) ==
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(openai::template_named("llama3") == chat_template::llama3);
  CHECK(std::string(openai::template_name(chat_template::llama3)) == "llama3");
}

TEST_CASE("a ChatML answer ends at <|im_end|> when the vocabulary has it and it is not EOS") {
  using openai::chat_template;
  vocabulary v;
  v.pieces = {"<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>", "a"};
  v.scores.assign(v.pieces.size(), 0.0f);
  v.kinds.assign(v.pieces.size(), token_kind::normal);
  v.kinds[1] = v.kinds[2] = v.kinds[3] = v.kinds[4] = token_kind::control;
  REQUIRE_FALSE(validate(v).has_value());
  const tokenizer chatml(v);
  CHECK(openai::turn_end_token(chat_template::chatml, chatml) == 4);
  CHECK_FALSE(openai::turn_end_token(chat_template::llama3, chatml).has_value());  // no <|eot_id|> there
  CHECK_FALSE(openai::turn_end_token(chat_template::llama2, chatml).has_value());
  v.eos_id = 4;  // a vocabulary whose EOS is the turn's end already
  CHECK_FALSE(openai::turn_end_token(chat_template::chatml, tokenizer(v)).has_value());
  CHECK_FALSE(openai::turn_end_token(chat_template::chatml, test::tok512()).has_value());
}

namespace {

std::variant<openai::api_request, openai::api_error> parse(const std::string& body, bool chat) {
  openai::api_limits lim;
  lim.context = 64;
  return openai::parse_request(body, chat, "m", openai::chat_template::chatml, lim);
}

}  // namespace

TEST_CASE("chat content as text parts is the joined string, developer is system, other parts are refused") {
  auto plain = parse(R"({"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi there"}]})", true);
  auto parts = parse(R"({"model":"m","messages":[{"role":"developer","content":[{"type":"text","text":"Be brief."}]},)"
                     R"({"role":"user","content":[{"type":"text","text":"Hi "},{"type":"text","text":"there"}]}]})",
                     true);
  REQUIRE(std::holds_alternative<openai::api_request>(plain));
  REQUIRE(std::holds_alternative<openai::api_request>(parts));
  REQUIRE(std::get<openai::api_request>(parts).prompts.size() == 1);
  CHECK(std::get<openai::api_request>(parts).prompts[0].text == std::get<openai::api_request>(plain).prompts.at(0).text);
  auto image = parse(R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]})", true);
  REQUIRE(std::holds_alternative<openai::api_error>(image));
  CHECK(std::get<openai::api_error>(image).message.find("text parts") != std::string::npos);
  CHECK(std::holds_alternative<openai::api_error>(parse(R"({"model":"m","messages":[{"role":"tool","content":"x"}]})", true)));
}

TEST_CASE("a completion's prompt as token ids is taken as given, in both shapes, and bad ids are refused") {
  for (const char* body : {R"({"model":"m","prompt":[1,7,9]})", R"({"model":"m","prompt":[[1,7,9]]})"}) {
    CAPTURE(body);
    auto r = parse(body, false);
    REQUIRE(std::holds_alternative<openai::api_request>(r));
    const auto& req = std::get<openai::api_request>(r);
    REQUIRE(req.prompts.size() == 1);
    CHECK(req.prompts[0].is_tokens);
    CHECK(req.prompts[0].tokens == std::vector<int32_t>{1, 7, 9});
  }
  auto text = parse(R"({"model":"m","prompt":"abc"})", false);
  REQUIRE(std::holds_alternative<openai::api_request>(text));
  REQUIRE(std::get<openai::api_request>(text).prompts.size() == 1);
  CHECK_FALSE(std::get<openai::api_request>(text).prompts[0].is_tokens);
  CHECK(std::get<openai::api_request>(text).prompts[0].text == "abc");
  for (const char* body : {R"({"model":"m","prompt":[]})", R"({"model":"m","prompt":[1,-2]})", R"({"model":"m","prompt":[1,2.5]})",
                           R"({"model":"m","prompt":[1,"a"]})", R"({"model":"m","prompt":[[1],[]]})",
                           R"({"model":"m","prompt":[[1],[2,-1]]})", R"({"model":"m","prompt":{"text":"a"}})"}) {
    CAPTURE(body);
    CHECK(std::holds_alternative<openai::api_error>(parse(body, false)));
  }
  std::string long_ids = R"({"model":"m","prompt":[)";
  for (int i = 0; i < 64; ++i) long_ids += (i ? ",1" : "1");
  auto too_long = parse(long_ids + "]}", false);
  REQUIRE(std::holds_alternative<openai::api_error>(too_long));
  CHECK(std::get<openai::api_error>(too_long).message.find("context is 64") != std::string::npos);
}

TEST_CASE("logit_bias maps token ids (as strings) to biases in [-100, 100], in chat and completions alike") {
  for (bool chat : {false, true}) {
    CAPTURE(chat);
    const std::string head = chat ? R"({"model":"m","messages":[{"role":"user","content":"x"}],)" : R"({"model":"m","prompt":"a",)";
    auto r = parse(head + R"("logit_bias":{"3":-100,"50256":2.5,"0":100}})", chat);
    REQUIRE(std::holds_alternative<openai::api_request>(r));
    auto got = std::get<openai::api_request>(r).params.sampling.logit_bias;
    std::sort(got.begin(), got.end(), [](auto& a, auto& b) { return a.token < b.token; });
    CHECK(got == std::vector<token_bias>{{0, 100.0f}, {3, -100.0f}, {50256, 2.5f}});
    for (const char* bad : {R"("logit_bias":{"x":1})", R"("logit_bias":{"-3":1})", R"("logit_bias":{"3.5":1})",
                            R"("logit_bias":{"99999999999":1})", R"("logit_bias":{"3":100.5})", R"("logit_bias":{"3":"1"})",
                            R"("logit_bias":[3,1])", R"("logit_bias":{"":1})"}) {
      CAPTURE(bad);
      auto e = parse(head + bad + "}", chat);
      REQUIRE(std::holds_alternative<openai::api_error>(e));
      CHECK(std::get<openai::api_error>(e).param == "logit_bias");
    }
  }
  std::string many = R"({"model":"m","prompt":"a","logit_bias":{)";
  for (size_t t = 0; t <= max_logit_bias; ++t) many += (t ? ",\"" : "\"") + std::to_string(t) + "\":1";
  auto e = parse(many + "}}", false);
  REQUIRE(std::holds_alternative<openai::api_error>(e));
  CHECK(std::get<openai::api_error>(e).message.find("entries; at most 1024") != std::string::npos);
}

TEST_CASE("tokenize takes a prompt or messages and add_special_tokens, detokenize token ids inside the vocabulary") {
  const openai::api_limits lim;
  auto tok = [&](const std::string& body) { return openai::parse_tokenize(body, "m", openai::chat_template::chatml, lim); };
  auto text = tok(R"({"prompt":"Once upon","add_special_tokens":false})");
  REQUIRE(std::holds_alternative<openai::tokenize_request>(text));
  CHECK(std::get<openai::tokenize_request>(text).text == "Once upon");
  CHECK_FALSE(std::get<openai::tokenize_request>(text).add_bos);
  auto chat = tok(R"({"model":"m","messages":[{"role":"user","content":"Hi"}]})");
  REQUIRE(std::holds_alternative<openai::tokenize_request>(chat));
  CHECK(std::get<openai::tokenize_request>(chat).text ==
        openai::apply_template(openai::chat_template::chatml, {{"user", "Hi"}}));
  CHECK(std::get<openai::tokenize_request>(chat).add_bos);
  for (const char* body : {R"({})", R"({"prompt":"a","messages":[{"role":"user","content":"x"}]})", R"({"prompt":5})",
                           R"({"prompt":"a","add_special_tokens":"no"})", R"([1])", R"({"prompt":"a","model":7})",
                           R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":false})"}) {
    CAPTURE(body);
    CHECK(std::holds_alternative<openai::api_error>(tok(body)));
  }
  auto other = tok(R"({"model":"other","prompt":"a"})");
  REQUIRE(std::holds_alternative<openai::api_error>(other));
  CHECK(std::get<openai::api_error>(other).status == 404);

  auto ids = openai::parse_detokenize(R"({"tokens":[1,5,511]})", "m", 512);
  REQUIRE(std::holds_alternative<std::vector<int32_t>>(ids));
  CHECK(std::get<std::vector<int32_t>>(ids) == std::vector<int32_t>{1, 5, 511});
  for (const char* body : {R"({"tokens":[512]})", R"({"tokens":[-1]})", R"({"tokens":"1 2"})", R"({})", R"({"tokens":[1.5]})"}) {
    CAPTURE(body);
    CHECK(std::holds_alternative<openai::api_error>(openai::parse_detokenize(body, "m", 512)));
  }
  CHECK(openai::tokenize_body({1, 5}, 64) == R"({"count":2,"max_model_len":64,"tokens":[1,5]})");
}

TEST_CASE("a completion takes several prompts, texts or token-id arrays, in order, but not mixed or too many") {
  auto texts = parse(R"({"model":"m","prompt":["one","two","three"],"n":2})", false);
  REQUIRE(std::holds_alternative<openai::api_request>(texts));
  const auto& t = std::get<openai::api_request>(texts);
  REQUIRE(t.prompts.size() == 3);
  CHECK(t.prompts[0].text == "one");
  CHECK(t.prompts[2].text == "three");
  CHECK_FALSE(t.prompts[1].is_tokens);
  CHECK(t.n == 2);

  auto ids = parse(R"({"model":"m","prompt":[[1,2],[3],[4,5,6]]})", false);
  REQUIRE(std::holds_alternative<openai::api_request>(ids));
  const auto& i = std::get<openai::api_request>(ids);
  REQUIRE(i.prompts.size() == 3);
  CHECK(i.prompts[1].is_tokens);
  CHECK(i.prompts[1].tokens == std::vector<int32_t>{3});
  CHECK(i.prompts[2].tokens == std::vector<int32_t>{4, 5, 6});

  auto message_of = [](const std::string& body) {
    auto r = parse(body, false);
    REQUIRE(std::holds_alternative<openai::api_error>(r));
    return std::get<openai::api_error>(r).message;
  };
  CHECK(message_of(R"({"model":"m","prompt":["a",[1]]})").find("must not mix") != std::string::npos);
  CHECK(message_of(R"({"model":"m","prompt":[[1],"a"]})").find("must not mix") != std::string::npos);
  CHECK(message_of(R"({"model":"m","prompt":["a",5]})").find("an array of strings") != std::string::npos);
  CHECK(message_of(R"({"model":"m","prompt":["a",null]})").find("an array of strings") != std::string::npos);
  // Which prompt is at fault is said.
  const std::string huge(openai::api_limits{}.max_prompt_bytes + 1, 'x');
  CHECK(message_of(R"({"model":"m","prompt":["a",")" + huge + "\"]}").find("prompt 1's text is 1048577 bytes, past this "
                                                                          "server's limit of 1048576") != std::string::npos);

  // At most max_choices completions in one request: prompts x n.
  std::string many = R"({"model":"m","prompt":[)";
  for (int k = 0; k < 65; ++k) many += (k ? ",\"p\"" : "\"p\"");
  CHECK(message_of(many + "]}").find("at most 64") != std::string::npos);
  std::string nine = R"({"model":"m","n":8,"prompt":[)";
  for (int k = 0; k < 9; ++k) nine += (k ? ",\"p\"" : "\"p\"");
  CHECK(message_of(nine + "]}").find("ask for 72 completions") != std::string::npos);
  CHECK(std::holds_alternative<openai::api_request>(parse(nine.substr(0, nine.size() - 4) + "]}", false)));  // 8 x 8
}

TEST_CASE("chat completions take add_generation_prompt true or absent, and refuse false as documented") {
  for (const char* extra : {"", R"(,"add_generation_prompt":true)", R"(,"add_generation_prompt":null)"}) {
    CAPTURE(extra);
    CHECK(std::holds_alternative<openai::api_request>(
        parse(std::string(R"({"model":"m","messages":[{"role":"user","content":"x"}])") + extra + "}", true)));
  }
  for (const char* extra : {R"(,"add_generation_prompt":false)", R"(,"add_generation_prompt":"yes")"}) {
    CAPTURE(extra);
    auto r = parse(std::string(R"({"model":"m","messages":[{"role":"user","content":"x"}])") + extra + "}", true);
    REQUIRE(std::holds_alternative<openai::api_error>(r));
    CHECK(std::get<openai::api_error>(r).status == 400);
    CHECK(std::get<openai::api_error>(r).param == "add_generation_prompt");
  }
}

TEST_CASE("a prompt past what the context holds is refused from its bytes, before tokenizing, on every route") {
  openai::api_limits lim;
  lim.context = 64;
  lim.context_prompt_bytes = 64 * 16;  // a vocabulary whose longest piece is 16 bytes
  auto error_of = [&](const std::string& body, bool chat) {
    auto r = openai::parse_request(body, chat, "m", openai::chat_template::raw, lim);
    REQUIRE(std::holds_alternative<openai::api_error>(r));
    return std::get<openai::api_error>(r);
  };
  const std::string fits(1024, 'x'), over(1025, 'x');
  CHECK(std::holds_alternative<openai::api_request>(
      openai::parse_request(R"({"model":"m","prompt":")" + fits + "\"}", false, "m", openai::chat_template::raw, lim)));
  const openai::api_error e = error_of(R"({"model":"m","prompt":")" + over + "\"}", false);
  CHECK(e.status == 400);
  CHECK(e.code == "context_length_exceeded");
  CHECK(e.param == "prompt");
  CHECK(e.message == "the prompt's text is 1025 bytes, more than the model's context of 64 tokens can hold (at most 1024 bytes)");
  const openai::api_error c = error_of(R"({"model":"m","messages":[{"role":"user","content":")" + over + "\"}]}", true);
  CHECK(c.code == "context_length_exceeded");
  CHECK(c.param == "messages");
  auto t = openai::parse_tokenize(R"({"prompt":")" + over + "\"}", "m", openai::chat_template::raw, lim);
  REQUIRE(std::holds_alternative<openai::api_error>(t));
  CHECK(std::get<openai::api_error>(t).code == "context_length_exceeded");
  // The server's own cap first, as a 413.
  lim.max_prompt_bytes = 1000;
  CHECK(error_of(R"({"model":"m","prompt":")" + fits + "\"}", false).status == 413);
}

TEST_CASE("the sampling and stopping extensions reach the request, and unsupported fields are refused unless neutral") {
  auto r = parse(R"({"model":"m","prompt":"a","top_k":5,"min_p":0.1,"repetition_penalty":1.2})", false);
  REQUIRE(std::holds_alternative<openai::api_request>(r));
  const auto& s = std::get<openai::api_request>(r).params.sampling;
  CHECK(s.top_k == 5);
  CHECK(s.min_p == doctest::Approx(0.1));
  CHECK(s.repetition_penalty == doctest::Approx(1.2));
  auto vllm = parse(R"({"model":"m","prompt":"a","ignore_eos":true,"stop_token_ids":[2,5]})", false);
  REQUIRE(std::holds_alternative<openai::api_request>(vllm));
  CHECK(std::get<openai::api_request>(vllm).params.ignore_eos);
  CHECK(std::get<openai::api_request>(vllm).params.stop_tokens == std::vector<int32_t>{2, 5});
  CHECK(std::holds_alternative<openai::api_error>(parse(R"({"model":"m","prompt":"a","stop_token_ids":[-1]})", false)));
  CHECK(std::holds_alternative<openai::api_error>(parse(R"({"model":"m","prompt":"a","ignore_eos":"yes"})", false)));
  // speculative: a draft cap, false for none, true or absent for the server's setting.
  for (const auto& [field, want] : std::vector<std::pair<std::string, int32_t>>{
           {"", -1}, {R"(,"speculative":3)", 3}, {R"(,"speculative":0)", 0}, {R"(,"speculative":false)", 0},
           {R"(,"speculative":true)", -1}, {R"(,"speculative":null)", -1}}) {
    const std::string& extra = field;  // (a variable: clang 14 captures no binding)
    CAPTURE(extra);
    auto got = parse(R"({"model":"m","prompt":"a")" + field + "}", false);
    REQUIRE(std::holds_alternative<openai::api_request>(got));
    CHECK(std::get<openai::api_request>(got).params.speculative == want);
  }
  for (const char* bad : {R"({"model":"m","prompt":"a","speculative":17})", R"({"model":"m","prompt":"a","speculative":-1})",
                          R"({"model":"m","prompt":"a","speculative":"3"})", R"({"model":"m","prompt":"a","speculative":1.5})"}) {
    CAPTURE(bad);
    auto e = parse(bad, false);
    REQUIRE(std::holds_alternative<openai::api_error>(e));
    CHECK(std::get<openai::api_error>(e).message.find("'speculative' must be a boolean or a draft cap in 0..16") !=
          std::string::npos);
  }
  auto off = parse(R"({"model":"m","prompt":"a","top_k":-1})", false);
  REQUIRE(std::holds_alternative<openai::api_request>(off));
  CHECK(std::get<openai::api_request>(off).params.sampling.top_k == 0);
  for (const char* body : {R"({"model":"m","prompt":"a","echo":true})", R"({"model":"m","prompt":"a","best_of":2})",
                           R"({"model":"m","prompt":"a","suffix":"end"})",
                           R"({"model":"m","prompt":"a","response_format":{"type":"json_object"}})"}) {
    CAPTURE(body);
    auto e = parse(body, false);
    REQUIRE(std::holds_alternative<openai::api_error>(e));
    CHECK(std::get<openai::api_error>(e).message.find("not supported") != std::string::npos);
  }
  CHECK(std::holds_alternative<openai::api_error>(
      parse(R"({"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})", true)));
  CHECK(std::holds_alternative<openai::api_request>(parse(
      R"({"model":"m","prompt":"a","echo":false,"best_of":1,"suffix":"","logit_bias":{},"tools":[],"response_format":{"type":"text"}})",
      false)));
}

TEST_CASE("kv_eviction: a request's own policy and budget, past the context with streaming, mistakes named") {
  auto r = parse(R"({"model":"m","prompt":"a","kv_eviction":{"policy":"h2o","budget":64,"window":16}})", false);
  REQUIRE(std::holds_alternative<openai::api_request>(r));
  const auto& e = std::get<openai::api_request>(r).params.eviction;
  REQUIRE(e.has_value());
  CHECK(e->policy == kv_policy::h2o);
  CHECK(e->budget == 64);
  CHECK(e->window == 16);
  CHECK(e->sinks == -1);
  auto none = parse(R"({"model":"m","prompt":"a","kv_eviction":{"policy":"none"}})", false);
  REQUIRE(std::holds_alternative<openai::api_request>(none));
  CHECK(std::get<openai::api_request>(none).params.eviction->policy == kv_policy::none);
  auto absent = parse(R"({"model":"m","prompt":"a","kv_eviction":null})", false);
  REQUIRE(std::holds_alternative<openai::api_request>(absent));
  CHECK_FALSE(std::get<openai::api_request>(absent).params.eviction.has_value());
  // Streaming lets max_tokens pass the context; without it, the context bounds it.
  auto past = parse(R"({"model":"m","prompt":"a","max_tokens":100000,"kv_eviction":{"policy":"streaming","budget":64,"sinks":4}})", false);
  REQUIRE(std::holds_alternative<openai::api_request>(past));
  CHECK(std::get<openai::api_request>(past).params.max_tokens == 100000);
  for (const auto& [body, said] : std::vector<std::pair<std::string, std::string>>{
           {R"("kv_eviction":{"policy":"lru","budget":64})", "'kv_eviction.policy' must be \"none\", \"streaming\", \"h2o\" or \"scissorhands\""},
           {R"("kv_eviction":{"budget":64})", "'kv_eviction' needs a 'policy'"},
           {R"("kv_eviction":"h2o")", "'kv_eviction' must be an object"},
           {R"("kv_eviction":{"policy":"h2o","budget":-4})", "'kv_eviction.budget' must be an integer of 0 or more"},
           {R"("kv_eviction":{"policy":"h2o","budget":64,"ratio":0.2})", "'kv_eviction' takes policy, budget, sinks, window and history; not 'ratio'"},
           {R"("kv_eviction":{"policy":"streaming","budget":8,"sinks":4,"window":8})", "budget must be at least sinks + window"},
           {R"("kv_eviction":{"policy":"h2o","budget":100000})", "is past the model's context"},
           {R"("max_tokens":100000,"kv_eviction":{"policy":"h2o","budget":64})", "'max_tokens' must be in 1.."}}) {
    const std::string& request = body;  // (a variable: clang 14 captures no binding)
    CAPTURE(request);
    auto got = parse(R"({"model":"m","prompt":"a",)" + body + "}", false);
    REQUIRE(std::holds_alternative<openai::api_error>(got));
    const auto& err = std::get<openai::api_error>(got);
    CHECK(err.message.find(said) != std::string::npos);
    CHECK(err.status == 400);
  }
}

TEST_CASE("a number no double holds is a 400 naming its field, not a server error") {
  for (const auto& [body, field] : std::vector<std::pair<std::string, std::string>>{
           {R"({"model":"m","prompt":"a","temperature":1e309})", "temperature"},
           {R"({"model":"m","prompt":1e999999})", "prompt"},
           {R"({"model":"m","prompt":"a","max_tokens":-1e999})", "max_tokens"},
           {R"({"model":"m","prompt":"a","logit_bias":{"5":1e400}})", "logit_bias"}}) {
    const std::string& request = body;  // (a variable: clang 14 captures no binding)
    CAPTURE(request);
    auto got = parse(body, false);
    REQUIRE(std::holds_alternative<openai::api_error>(got));
    const auto& e = std::get<openai::api_error>(got);
    CHECK(e.status == 400);
    CHECK(e.param == field);
    CHECK(e.message == "'" + field + "' holds a number out of range");
  }
  auto top = parse("[1e999]", false);
  REQUIRE(std::holds_alternative<openai::api_error>(top));
  CHECK(std::get<openai::api_error>(top).status == 400);
}

TEST_CASE("an integer field takes a whole number written as a float, and nothing else") {
  auto r = parse(R"({"model":"m","prompt":"a","max_tokens":5.0,"n":2.0})", false);
  REQUIRE(std::holds_alternative<openai::api_request>(r));
  CHECK(std::get<openai::api_request>(r).params.max_tokens == 5);
  for (const char* body : {R"({"model":"m","prompt":"a","max_tokens":5.5})", R"({"model":"m","prompt":"a","max_tokens":"5"})",
                           R"({"model":"m","prompt":"a","seed":1e30})"}) {
    CAPTURE(body);
    auto e = parse(body, false);
    REQUIRE(std::holds_alternative<openai::api_error>(e));
    CHECK(std::get<openai::api_error>(e).message.find("must be an integer") != std::string::npos);
  }
}

TEST_CASE("a number out of range is refused with its bounds as written") {
  for (const auto& [body, said] : std::vector<std::pair<const char*, const char*>>{
           {R"({"model":"m","prompt":"a","temperature":-1})", "'temperature' must be in [0, 2]"},
           {R"({"model":"m","prompt":"a","repetition_penalty":0})", "'repetition_penalty' must be in [0.01, 10]"},
           {R"({"model":"m","prompt":"a","presence_penalty":2.5})", "'presence_penalty' must be in [-2, 2]"}}) {
    auto e = parse(body, false);
    REQUIRE(std::holds_alternative<openai::api_error>(e));
    CHECK(std::get<openai::api_error>(e).message == said);
  }
}

}  // namespace troupe
